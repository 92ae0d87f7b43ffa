/* greeting: the proxy's own side of the connection handshake, for when the
 * broker is chosen by vhost (a vhost's rules name brokers of their own):
 * connection.start and tune go to the client from the proxy, and the
 * client's start-ok, its tuning and its open are replayed to the broker
 * chosen once connection.open has named the vhost. No sockets here. */
#ifndef ACEMQ_GREETING_H
#define ACEMQ_GREETING_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct worker;

/* What the proxy offers the client: RabbitMQ's defaults. */
#define GREETING_FRAME_MAX   131072
#define GREETING_HEARTBEAT_S 60
#define GREETING_CHANNEL_MAX 2047

enum greeting_phase {
	GREETING_WAITING,  /* the brokers' properties are being asked for */
	GREETING_STARTED,  /* connection.start sent to the client */
	GREETING_TUNED,    /* its start-ok kept; connection.tune sent */
	GREETING_OPENING,  /* its tune-ok taken, waiting for its open */
	GREETING_CHOSEN,   /* its open kept: the broker is being reached */
	GREETING_REPLAYED, /* the broker's start answered with the start-ok */
	GREETING_OPENED,   /* the broker's tune answered with tune-ok and open */
};

struct greeting_waiter;

struct greeting {
	enum greeting_phase phase;
	struct greeting_waiter *waiter; /* WAITING: its place among the waiting */
	struct evbuffer *kept;          /* the client's start-ok, then its open, as sent */
	size_t start_ok_len;
	uint16_t channel_max; /* the client's tune-ok, bounded by the offer */
	uint32_t frame_max;
	uint16_t heartbeat;
};

struct greeting *greeting_new(void);
void greeting_free(struct greeting *g);

/* What each broker address (an index of the upstream table) announced in
 * its connection.start, so a greeted client sees the product, version,
 * cluster name and capabilities it would see without the proxy. The vhost
 * is named only after connection.start, so a client is shown the global
 * list's broker: the first address, in the order clients are sent to
 * them, whose properties are known; when none of the global list is known,
 * the first known address of a vhost's list in force; when none is: the
 * proxy's own (product acemq-proxy). The properties come from the probe
 * (src/probe.c) and from every broker connection a session makes while
 * clients are greeted. */

/* Node i's connection.start passed (any session, any worker, the probe). */
void greeting_learn(int node, const amqp_table_t *server_properties);
/* The probe: the addresses of the lists in force (a bit per node; only
 * these stand in for the global list), and node i asked for the first time
 * (clients wait for its answer) or not answering (clients no longer wait;
 * it is asked again in the background). */
void greeting_use_nodes(unsigned nodes);
void greeting_asking(int node);
void greeting_unanswered(int node);
int greeting_known(int node);

/* A new client, before its connection.start: 0 when the properties to
 * show are still being asked for the first time; resume(owner) then runs
 * on w's loop once they are known or the probe gave up (within its
 * timeout, connect_timeout_ms), unless g is freed first. -1: greet at
 * once. */
int greeting_await(struct greeting *g, struct worker *w, void (*resume)(void *owner),
		   void *owner);
/* Forget clients still waiting (at exit, once the workers are gone). */
void greeting_forget_waiting(void);

/* To the client: connection.start (the properties above, and the
 * mechanisms PLAIN and AMQPLAIN); 0 or -1. */
int greeting_start(struct greeting *g, struct evbuffer *to_client);
/* The client's start-ok (len bytes at the front of in, drained): kept,
 * and connection.tune offered. 0, or -1 when it came out of order or
 * names a mechanism not offered. */
int greeting_start_ok(struct greeting *g, const amqp_connection_start_ok_t *m,
		      struct evbuffer *in, size_t len, struct evbuffer *to_client);
/* The client's tune-ok, bounded by what was offered (drained from in). */
int greeting_tune_ok(struct greeting *g, const amqp_connection_tune_ok_t *t,
		     struct evbuffer *in, size_t len);
/* The client's open (drained from in and kept). */
int greeting_open(struct greeting *g, struct evbuffer *in, size_t len);

/* The broker's connection.start: the start-ok goes to out. */
int greeting_broker_start(struct greeting *g, struct evbuffer *out);
/* The broker's connection.tune: tune-ok with the client's values, then its
 * open, go to out: 0. Else the reply code for the client (530 when the
 * client's tuning does not fit the broker's) with the reason in why. */
int greeting_broker_tune(struct greeting *g, const amqp_connection_tune_t *t,
			 struct evbuffer *out, char *why, size_t whylen);

/* The user and password of a start-ok (PLAIN or AMQPLAIN), NUL-ended;
 * 0, or -1 when they do not parse or do not fit. */
int greeting_credentials(const amqp_connection_start_ok_t *m, char *user, size_t ulen,
			 char *pass, size_t plen);
/* Whether client properties announce capability name as true. */
int greeting_capability(const amqp_table_t *props, const char *name);
#endif
