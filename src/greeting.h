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

/* What the proxy offers the client: RabbitMQ's defaults. */
#define GREETING_FRAME_MAX   131072
#define GREETING_HEARTBEAT_S 60
#define GREETING_CHANNEL_MAX 2047

enum greeting_phase {
	GREETING_STARTED,  /* connection.start sent to the client */
	GREETING_TUNED,    /* its start-ok kept; connection.tune sent */
	GREETING_OPENING,  /* its tune-ok taken, waiting for its open */
	GREETING_CHOSEN,   /* its open kept: the broker is being reached */
	GREETING_REPLAYED, /* the broker's start answered with the start-ok */
	GREETING_OPENED,   /* the broker's tune answered with tune-ok and open */
};

struct greeting {
	enum greeting_phase phase;
	struct evbuffer *kept; /* the client's start-ok, then its open, as sent */
	size_t start_ok_len;
	uint16_t channel_max; /* the client's tune-ok, bounded by the offer */
	uint32_t frame_max;
	uint16_t heartbeat;
};

struct greeting *greeting_new(void);
void greeting_free(struct greeting *g);

/* A broker's connection.start passed (any session, any worker): its server
 * properties are what greeted clients are shown from then on, so a client
 * sees the product, version and capabilities it would see without the
 * proxy (before any broker has spoken: the proxy's own). */
void greeting_learn(const amqp_table_t *server_properties);

/* To the client: connection.start (the broker's properties as last
 * learned, and the mechanisms PLAIN and AMQPLAIN); 0 or -1. */
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

#endif
