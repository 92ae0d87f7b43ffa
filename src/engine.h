/* engine: the proxy's own broker connections, one per vhost that needs one,
 * each on a thread of its own with rabbitmq-c: the schedule ladder's
 * declarations, the scheduler, and put-backs of in-progress deliveries. */
#ifndef ACEMQ_ENGINE_H
#define ACEMQ_ENGINE_H

#include "worker.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <stdint.h>

struct config;
struct evbuffer;
struct rules;
struct engine;

/* Per-vhost counters: X(field, Prometheus metric, labels, help). */
#define ENGINE_COUNTERS(X)                                                                     \
	X(scheduled, "acemq_proxy_schedule_total", "event=\"scheduled\"",                      \
	  "scheduled messages, by event")                                                      \
	X(sched_now, "acemq_proxy_schedule_total", "event=\"immediate\"",                      \
	  "scheduled messages, by event")                                                      \
	X(sched_bad, "acemq_proxy_schedule_total", "event=\"bad_delay\"",                      \
	  "scheduled messages, by event")                                                      \
	X(delivered, "acemq_proxy_schedule_total", "event=\"delivered\"",                      \
	  "scheduled messages, by event")                                                      \
	X(hops, "acemq_proxy_schedule_total", "event=\"hop\"", "scheduled messages, by event") \
	X(malformed, "acemq_proxy_schedule_total", "event=\"malformed\"",                      \
	  "scheduled messages, by event")                                                      \
	X(forbidden, "acemq_proxy_schedule_total", "event=\"forbidden\"",                      \
	  "scheduled messages, by event")                                                      \
	X(unroutable, "acemq_proxy_schedule_total", "event=\"unroutable\"",                    \
	  "scheduled messages, by event")                                                      \
	X(put_back, "acemq_proxy_engine_publishes_total", "purpose=\"put_back\"",              \
	  "publishes of the proxy's own, by purpose")                                          \
	X(put_back_failed, "acemq_proxy_engine_publishes_failed_total",                        \
	  "purpose=\"put_back\"", "publishes of the proxy's own that failed, by purpose")      \
	X(connects, "acemq_proxy_engine_connects_total", "",                                   \
	  "connections of the proxy's own opened")                                             \
	X(failures, "acemq_proxy_engine_failures_total", "",                                   \
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

/* Lateness of scheduled deliveries: bucket bounds in milliseconds. */
#define ENGINE_LATE_BUCKETS 9
extern const int64_t engine_late_bounds[ENGINE_LATE_BUCKETS];

enum engine_op {
	ENGINE_LADDER,  /* make sure the ladder is declared in the vhost */
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
/* Apply a rules set: start connections for vhosts whose schedule rule runs
 * the engine, and let running ones learn what the rules now allow. */
void engine_sync(struct rules *r);
/* Stop every connection (at shutdown). */
void engine_stop(void);

/* The vhost's engine (created on first use; lives until engine_stop). */
struct engine *engine_get(const char *vhost);
/* Whether the ladder is known declared in the engine's vhost. */
int engine_ladder_ready(struct engine *e);
/* Hand a request over; its completion always comes, posted to r->w. */
void engine_submit(struct engine *e, struct engine_req *r);
void engine_count(struct engine *e, enum engine_stat what);

/* Requests: new (zeroed, with a pool) and freed with what they own. */
struct engine_req *engine_req_new(struct worker *w, enum engine_op op,
				  void (*done)(struct worker_call *c));
/* Copy a publish into the request (exchange, routing key, properties and
 * body, which the request takes). 0 or -1. */
int engine_req_publish(struct engine_req *r, const char *exchange, const char *routing_key,
		       const amqp_basic_properties_t *props, amqp_bytes_t body);
void engine_req_free(struct engine_req *r);

/* Admin views: a JSON object member "engines": {...} and Prometheus lines. */
void engine_stats_json(struct evbuffer *out);
void engine_metrics(struct evbuffer *out);

#endif
