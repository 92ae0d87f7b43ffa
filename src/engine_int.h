/* engine_int: the engine's state, shared by its own files only: engine.c
 * (the registry, the thread, the link, the views) and engine_out.c (the
 * publishes out on the confirm channel). */
#ifndef ACEMQ_ENGINE_INT_H
#define ACEMQ_ENGINE_INT_H

#include "engine.h"
#include "engine_conn.h"

#include <pthread.h>

/* A publish on channel 2 waiting for its confirm: a worker's request, or
 * the client's own. */
struct engine_pending {
	uint64_t seq;
	struct engine_req *req;  /* NULL: the client's */
	struct engine_sent sent; /* names malloc'd, to match a basic.return */
	int ok;
	struct engine_pending *next;
};

struct engine {
	char *vhost;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	struct engine_req *queue, **queue_tail; /* under lock */
	int stopping;                           /* under lock */
	unsigned want;                          /* under lock: ENGINE_WANT_ flags */
	struct rules *rules;                    /* under lock: a reference */
	int wake[2];
	int connected; /* atomic */
	struct engine_stats stats;
	struct engine_link link;
	void *state; /* the client's */
	/* The thread's own. */
	struct engine_conn c;
	int consuming, declared;
	uint64_t next_seq;
	struct engine_pending *pend, **pend_tail; /* in publish order */
	struct engine *next;
};

/* The registered client, or NULL. */
extern const struct engine_client *engine_client;

static inline void engine_add(struct engine *e, enum engine_stat what, uint64_t n)
{
	uint64_t *v = (uint64_t *)&e->stats + what;

	__atomic_fetch_add(v, n, __ATOMIC_RELAXED);
}

static inline void engine_complete(struct engine_req *r, enum engine_rc rc)
{
	r->rc = rc;
	worker_post(r->w, &r->call);
}

/* engine_out.c, on the thread. Publish (mandatory) and keep it until its
 * confirm: req for a worker's request, NULL for the client's. */
struct engine_pending *engine_out_send(struct engine *e, struct engine_req *req,
				       const struct engine_publish *pub);
/* A confirm (ok) or a refusal (!ok) of seq, or of all up to it. 0 or -1. */
int engine_out_confirmed(struct engine *e, uint64_t seq, int multiple, int ok);
/* A basic.return and the message returned. 0 or -1. */
int engine_out_returned(struct engine *e, const amqp_basic_return_t *ret, amqp_message_t *msg);
/* The broker closed the publish channel: the client learns what was out. */
void engine_out_closed(struct engine *e);
/* The connection went: requests out fail, the client's publishes are
 * forgotten (their inputs return to the queue). */
void engine_out_fail(struct engine *e);

#endif
