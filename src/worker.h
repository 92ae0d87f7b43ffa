/* worker: a thread with its own event loop that owns the sessions handed to it. */
#ifndef ACEMQ_WORKER_H
#define ACEMQ_WORKER_H

#include "list.h"
#include "stats.h"

#include <amqp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct event;
struct session;
struct rules;
struct transport;

/* Settings every worker reads; written once before the workers start. */
struct worker_settings {
	long connect_timeout_ms;
	long handshake_timeout_ms;
	long drain_timeout_ms;
	long buffer_limit;
	long max_frame_pre_tune;
	long max_message_size;
	int proxy_protocol;          /* a PROXY header comes before the AMQP one */
	int upstream_proxy_protocol; /* send the broker a PROXY v2 header */
	/* How the broker leg connects (NULL: transport_connect); a seam for
	 * the session fuzzer. */
	struct transport *(*connect)(struct event_base *base, const struct sockaddr *sa,
				     int salen);
};

extern struct worker_settings worker_settings;

/* Work another thread hands back to a worker's loop (a store write that is
 * durable, a read that finished). The caller embeds it in its own request
 * and gets it back in fn, on the worker's thread; posting never fails. */
struct worker_call {
	void (*fn)(struct worker_call *c);
	struct worker_call *next;
};

struct worker_accept {
	int fd;
	int tls;
	struct sockaddr_storage sa;
	int salen;
};

struct worker {
	int index;
	pthread_t thread;
	struct event_base *base;
	struct event *notify;
	pthread_mutex_t lock;
	struct worker_accept *queue; /* sockets handed over, under lock */
	int nqueue, capqueue;
	int drain_request; /* under lock */
	int draining;
	struct event *drain_timer;
	struct list sessions; /* its sessions (struct session.link), newest first */
	unsigned long nsessions;
	struct stats stats;
	amqp_pool_t pool;                        /* scratch for decoding one frame at a time */
	struct rules *rules;                     /* the set this worker applies */
	struct rules *rules_pending;             /* under lock: the next set */
	struct worker_call *calls, **calls_tail; /* under lock: posted work */
	struct event *turn_end;                  /* runs what was deferred */
	struct worker_call *deferred, **deferred_tail;
	struct event *trim_timer; /* gives freed heap back after closes */
	unsigned long closes;     /* sessions ended since the last trim */
	uint64_t trimmed_ms;      /* when (monotonic ms), 0: never */
	int trim_armed;
	int fd_ready; /* libevent's entries exist for descriptors below */
};

/* Set up a worker's loop without starting its thread (tests drive it). */
int worker_init(struct worker *w, int index);
void worker_fini(struct worker *w);
int worker_start(struct worker *w, int index);
/* From any thread: hand over an accepted socket. */
int worker_assign(struct worker *w, int fd, const struct sockaddr *sa, int salen, int tls);
/* From any thread: stop taking work, drain, then exit the loop. */
void worker_drain(struct worker *w);
/* From any thread: run c->fn on the worker's loop, in posting order. */
void worker_post(struct worker *w, struct worker_call *c);
/* The same for a chain linked by next, first to last: one wake-up of the
 * worker for all of them (a source that completes many at once). */
void worker_post_chain(struct worker *w, struct worker_call *first, struct worker_call *last);
/* On a worker's own running thread: run c->fn once the events of this
 * turn of its loop have run (work gathered over a turn goes out as one).
 * Anywhere else (a loop driven by a test, another thread): -1, and the
 * caller does the work at once. */
int worker_defer(struct worker *w, struct worker_call *c);
/* On the worker: run what was posted (also done by the loop itself). */
void worker_run_posted(struct worker *w);
/* From any thread: apply a new rules set (takes a reference). */
void worker_set_rules(struct worker *w, struct rules *r);

void worker_session_add(struct worker *w, struct session *s);
void worker_session_remove(struct worker *w, struct session *s);

#endif
