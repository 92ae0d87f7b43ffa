/* scheduler: the schedule pattern's side on the proxy's own broker
 * connection (the engine's client): the ladder's declarations, the
 * control queue's consumer with its hops and deliveries, the pattern's
 * counters and lateness. */
#ifndef ACEMQ_SCHEDULER_H
#define ACEMQ_SCHEDULER_H

#include "../engine.h"

#include <stdint.h>

/* Per-vhost counters: X(field, Prometheus metric, labels, help). */
#define SCHEDULER_COUNTERS(X)                                                                  \
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
	X(cancelled, "acemq_proxy_schedule_total", "event=\"cancelled\"",                      \
	  "scheduled messages, by event")

enum scheduler_stat {
#define SCHEDULER_ENUM(name, metric, labels, help) SCHEDULER_STAT_##name,
	SCHEDULER_COUNTERS(SCHEDULER_ENUM)
#undef SCHEDULER_ENUM
	    SCHEDULER_NSTATS
};

/* Lateness of scheduled deliveries: bucket bounds in milliseconds. */
#define SCHEDULER_LATE_BUCKETS 9
extern const int64_t scheduler_late_bounds[SCHEDULER_LATE_BUCKETS];

/* The scheduler as the engine's client (tests drive it through a link of
 * their own). */
extern const struct engine_client scheduler_client;

/* Make the scheduler the engine's client (at start, before any engine). */
void scheduler_register(void);
/* Count an event of the publish side in e's vhost (e may be NULL). */
void scheduler_count(struct engine *e, enum scheduler_stat what);
/* Whether the ladder is known declared in e's vhost. */
int scheduler_ladder_ready(struct engine *e);

#endif
