/* engine: the proxy's own broker connections, one per vhost that needs one,
 * each on a thread of its own with rabbitmq-c. Workers hand it requests
 * (publishes, declarations) and get completions posted back to their
 * loops. One client, registered at start, may consume a queue on it and
 * declare what it needs once connected; the engine runs the client's
 * callbacks on its thread and knows nothing of what the client does. */
#ifndef ACEMQ_ENGINE_H
#define ACEMQ_ENGINE_H

#include "worker.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <stdint.h>

struct config;
struct evbuffer;
struct rules;
struct rules_vhost;
struct engine;

/* Per-vhost counters: X(field, Prometheus metric, labels, help). */
#define ENGINE_COUNTERS(X)                                                                \
	X(put_back, "acemq_proxy_engine_publishes_total", "purpose=\"put_back\"",         \
	  "publishes of the proxy's own, by purpose")                                     \
	X(put_back_failed, "acemq_proxy_engine_publishes_failed_total",                   \
	  "purpose=\"put_back\"", "publishes of the proxy's own that failed, by purpose") \
	X(connects, "acemq_proxy_engine_connects_total", "",                              \
	  "connections of the proxy's own opened")                                        \
	X(failures, "acemq_proxy_engine_failures_total", "",                              \
	  "connections of the proxy's own that failed or were lost")

struct engine_stats {
#define ENGINE_FIELD(name, metric, labels, help) uint64_t name;
	ENGINE_COUNTERS(ENGINE_FIELD)
#undef ENGINE_FIELD
};

enum engine_stat {
#define ENGINE_ENUM(name, metric, labels, help) ENGINE_STAT_##name,
	ENGINE_COUNTERS(ENGINE_ENUM)
#undef ENGINE_ENUM
};

enum engine_op {
	ENGINE_DECLARE, /* make sure the client's declarations are made */
	ENGINE_PUBLISH, /* publish (mandatory, confirmed) */
};

enum engine_rc {
	ENGINE_OK,
	ENGINE_RETURNED,    /* unroutable (basic.return) */
	ENGINE_NACKED,      /* the broker refused it */
	ENGINE_FAILED,      /* the connection or channel failed with it out */
	ENGINE_UNAVAILABLE, /* no connection of the proxy's own for this vhost */
};

/* A request from a worker. Its completion (call.fn) runs on w's loop; the
 * requester may have gone by then: it keeps its own way of knowing (owner
 * is for it, the engine never reads it). */
struct engine_req {
	struct worker_call call; /* first */
	struct worker *w;
	enum engine_op op;
	enum engine_rc rc;
	void *owner;
	/* ENGINE_PUBLISH, owned by the request: */
	amqp_pool_t pool;
	amqp_bytes_t exchange, routing_key, body;
	amqp_basic_properties_t props;
	struct engine_req *next;
};

/* Settings: credentials, broker addresses, timeouts. 0 or -1. */
int engine_configure(const struct config *cfg);
/* Whether the proxy has credentials of its own (engine_user set). */
int engine_enabled(void);
/* Apply a rules set: start connections for vhosts whose rules the client
 * needs one for, and let every connection learn what the rules now want
 * of it (its vhost's brokers, what the client wants done). */
void engine_sync(struct rules *r);
/* Stop every connection (at shutdown). */
void engine_stop(void);

/* The vhost's engine (created on first use; lives until engine_stop). */
struct engine *engine_get(const char *vhost);
/* Hand a request over; its completion always comes, posted to r->w. */
void engine_submit(struct engine *e, struct engine_req *r);

/* Requests: new (zeroed, with a pool) and freed with what they own. */
struct engine_req *engine_req_new(struct worker *w, enum engine_op op,
				  void (*done)(struct worker_call *c));
/* Copy a publish into the request (exchange, routing key, properties and
 * body, which the request takes). 0 or -1. */
int engine_req_publish(struct engine_req *r, const char *exchange, const char *routing_key,
		       const amqp_basic_properties_t *props, amqp_bytes_t body);
void engine_req_free(struct engine_req *r);

/* Admin views: a JSON object member "engines": {...} and Prometheus lines;
 * each includes what the client adds. */
void engine_stats_json(struct evbuffer *out);
void engine_metrics(struct evbuffer *out);

/* ---- the client -------------------------------------------------------------- */

/* A publish of the client's own: mandatory, on the confirm channel. */
struct engine_publish {
	amqp_bytes_t exchange, routing_key;
	const amqp_basic_properties_t *props;
	amqp_bytes_t body;
	uint64_t input; /* the consumed message it settles, or 0 */
	int kind;       /* the client's own, kept with it */
	int64_t data;   /* likewise */
	uint64_t data2; /* likewise */
};

/* Such a publish while it is out, until its confirm. */
struct engine_sent {
	int kind;
	int64_t data;
	uint64_t data2;
	uint64_t input; /* a returned callback that hands the input on to a
			 * publish of its own sets this 0 */
	amqp_bytes_t exchange, routing_key;
	int returned; /* the broker returned it (basic.return) */
};

/* The engine's connection as its client sees it: called on the engine's
 * thread, from the client's callbacks. Each returns 0, or -1 when the
 * connection failed (the callback then returns -1: the engine starts
 * over, and the broker delivers unacknowledged inputs again). */
struct engine_link {
	const char *vhost;
	void *ctx; /* the engine's */
	/* Acknowledge a consumed message now. */
	int (*ack)(const struct engine_link *l, uint64_t tag);
	/* Publish. When its confirm comes, p->input is acknowledged if the
	 * publish was confirmed and not returned, rejected with requeue
	 * otherwise; then the client's settled callback runs. */
	int (*publish)(const struct engine_link *l, const struct engine_publish *p);
	/* A passive declaration: 1 the exchange exists, 0 it does not (or
	 * may not be looked at), -1. */
	int (*exchange_exists)(const struct engine_link *l, amqp_bytes_t name);
	/* Durable declarations; what names the step in a log line. */
	int (*declare_exchange)(const struct engine_link *l, const char *name, const char *type,
				const char *what);
	int (*declare_queue)(const struct engine_link *l, const char *name, amqp_table_t args,
			     const char *what);
	int (*bind_queue)(const struct engine_link *l, const char *queue, const char *exchange,
			  const char *routing_key, const char *what);
	/* The declarations are gone: the engine runs the client's declare
	 * again before it goes on. */
	void (*redeclare)(const struct engine_link *l);
};

#define ENGINE_WANT_DECLARE 1 /* connect, and keep the client's declarations made */
#define ENGINE_WANT_CONSUME 2 /* consume the client's queue as well */

struct engine_client {
	const char *name;  /* in log lines ("the scheduler") */
	const char *queue; /* the queue it consumes */
	uint16_t prefetch;
	/* An engine was made for l->vhost: the client's state for it, or
	 * NULL (out of memory: no engine). l lives as long as the state. */
	void *(*attach)(const struct engine_link *l);
	void (*detach)(void *state);
	/* Whether a vhost's rules need an engine (one is started for it). */
	int (*needs)(const struct rules_vhost *v);
	/* A rules set applies (r may be NULL): the ENGINE_WANT_ flags for
	 * the state's vhost. On the thread that applies rules. */
	unsigned (*sync)(void *state, struct rules *r);
	/* Connected, or asked by an ENGINE_DECLARE request: declare what it
	 * needs. 0 or -1. */
	int (*declare)(void *state);
	/* A message taken from its queue; msg may be edited (its pool). */
	int (*message)(void *state, uint64_t tag, amqp_message_t *msg);
	/* A publish of its own came back (a basic.return, which comes
	 * before the confirm): msg is what the broker returned. */
	int (*returned)(void *state, struct engine_sent *s, amqp_message_t *msg);
	/* A publish of its own is settled (after its input was): ENGINE_OK,
	 * ENGINE_RETURNED (confirmed after a return) or ENGINE_NACKED. */
	int (*settled)(void *state, const struct engine_sent *s, enum engine_rc rc);
	/* The broker closed the publish channel while s was out (one of
	 * them may be what it refused). */
	void (*publish_closed)(void *state, const struct engine_sent *s);
	/* Admin views, with the engines locked: members added to the vhost's
	 * object under "engines", and metric families (walk the engines from
	 * list with engine_next). */
	void (*stats_json)(void *state, struct evbuffer *out);
	void (*metrics)(struct evbuffer *out, struct engine *list);
};

/* Register the client, before the first engine is made. */
void engine_register(const struct engine_client *c);
/* The client's state for e (NULL for NULL). */
void *engine_state(struct engine *e);
/* Walking the engines in a client's metrics callback. */
struct engine *engine_next(struct engine *e);
const char *engine_vhost(const struct engine *e);

/* Copy src into dst, allocated from pool (a message being built). 0 or -1. */
int engine_bytes_copy(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_bytes_t src);

#endif
