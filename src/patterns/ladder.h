/* ladder: the schedule ladder's contract (names, arguments, headers), the
 * choice of rung, the delay header and the scheduler's decision for a
 * message taken from the control queue. No sockets, no threads. */
#ifndef ACEMQ_LADDER_H
#define ACEMQ_LADDER_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stdint.h>

#define LADDER_EXCHANGE   "acemq.schedule"
#define LADDER_DUE        "acemq.schedule.due"
#define LADDER_H_EXCHANGE "x-schedule-exchange"
#define LADDER_H_ROUTING  "x-schedule-routing-key"
#define LADDER_H_DUE_AT   "x-schedule-due-at"
#define LADDER_H_CONTENT  "x-schedule-content-type"
/* The proxy's own: the key of the message's record (store/delayed.h), by
 * which it is listed and cancelled. Optional; removed on delivery. */
#define LADDER_H_ID  "x-schedule-id"
#define LADDER_RUNGS 5

struct ladder_rung {
	const char *queue;
	int64_t ttl_ms;
};

/* Largest first: 1h, 10m, 1m, 10s, 1s. */
extern const struct ladder_rung ladder_rungs[LADDER_RUNGS];

/* The rung a message with remaining_ms to wait goes into: the largest that
 * does not overshoot, the smallest for anything under it. */
const struct ladder_rung *ladder_rung_for(int64_t remaining_ms);
const struct ladder_rung *ladder_smallest(void);

enum ladder_delay {
	LADDER_DELAY_NONE, /* no such header */
	LADDER_DELAY_OK,   /* a positive delay in *ms */
	LADDER_DELAY_NOW,  /* zero or negative: deliver at once */
	LADDER_DELAY_BAD,  /* a value that is not a number of milliseconds */
};

/* Read the delay header name of t: any integer kind, a decimal string, or
 * a float (rounded up, never early). */
enum ladder_delay ladder_delay(const amqp_table_t *t, const char *name, int64_t *ms);

/* Rewrite a publish's properties for the ladder: the delay header removed,
 * the four scheduling headers added (target exchange and routing key,
 * due_at, the content type). Storage from pool. 0 or -1. */
int ladder_rewrite(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t exchange,
		   amqp_bytes_t routing_key, const char *delay_header, int64_t due_at);

enum ladder_action {
	LADDER_DELIVER,   /* due: publish to target with final properties */
	LADDER_HOP,       /* not yet: publish to LADDER_EXCHANGE, rung's name */
	LADDER_MALFORMED, /* lacks the scheduling headers: drop */
};

struct ladder_plan {
	enum ladder_action action;
	amqp_bytes_t exchange, routing_key; /* DELIVER: the target (into p's storage) */
	int64_t due_at;
	const struct ladder_rung *rung; /* HOP */
	amqp_bytes_t id;                /* LADDER_H_ID (len 0: none), into p's storage */
};

/* Decide what the scheduler does with a message taken from the control
 * queue at now_ms. */
void ladder_plan(const amqp_basic_properties_t *p, int64_t now_ms, struct ladder_plan *plan);

/* Set LADDER_H_ID (headers made if there were none). 0 or -1. */
int ladder_set_id(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t id);

/* The properties a due message is delivered with: the scheduling headers
 * (the id too)
 * and the ladder's own dead-letter history removed, the original content
 * type back. Edits p in place (storage from pool). 0 or -1. */
int ladder_final(amqp_basic_properties_t *p, amqp_pool_t *pool);

/* Put the scheduling headers back on a returned delivery so it can go into
 * the ladder again (due at due_at). 0 or -1. */
int ladder_readd(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t exchange,
		 amqp_bytes_t routing_key, int64_t due_at);

/* The ladder's declarations, for whoever declares it. */
amqp_table_t ladder_rung_args(const struct ladder_rung *r, amqp_table_entry_t entries[3]);

#endif
