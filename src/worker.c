/* worker: a thread with its own event loop that owns the sessions handed to it,
 * and gives the heap they freed back to the system after a burst of closes. */
#include "worker.h"

#include "build_config.h"
#include "debug.h"
#include "limits.h"
#include "log.h"
#include "pool.h"
#include "rules.h"
#include "session.h"

#include <event2/event.h>
#include <event2/util.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_MALLOC_TRIM
#include <malloc.h>
#endif

/* Freed heap goes back (malloc_trim) once a worker has no session left, or
 * after this many closes while others stay open; at most once per
 * interval per worker, a trim that comes due sooner waits for its end. */
#define WORKER_TRIM_CLOSES      1000
#define WORKER_TRIM_INTERVAL_MS 1000

/* Descriptor numbers whose libevent entries are made at once, ahead of the
 * sessions that will use them (see worker_fd_prepare). */
#define WORKER_FD_BLOCK 1024
/* Descriptor numbers below the file limit never prepared: near it, the
 * numbers the worker takes for a moment would be the listener's last ones
 * (its spare, a new client's). */
#define WORKER_FD_HEADROOM 64

struct worker_settings worker_settings;

/* The worker whose loop runs on this thread, if any. */
static __thread struct worker *worker_self;

static void worker_check_drained(struct worker *w)
{
	if (w->draining && w->nsessions == 0)
		event_base_loopexit(w->base, NULL);
}

static void worker_drain_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct session *s;

	if (w->nsessions)
		log_info("worker %d: closing %lu connections still open after %ld ms", w->index,
			 w->nsessions, worker_settings.drain_timeout_ms);
	list_for_each_entry_safe (s, &w->sessions, link)
		session_close(s, 320, "CONNECTION_FORCED - proxy shutting down");
	worker_check_drained(w);
}

void worker_post_chain(struct worker *w, struct worker_call *first, struct worker_call *last)
{
	int wake;

	last->next = NULL;
	pthread_mutex_lock(&w->lock);
	wake = w->calls == NULL; /* else the first of those queued woke it */
	if (wake)
		w->calls_tail = &w->calls;
	*w->calls_tail = first;
	w->calls_tail = &last->next;
	pthread_mutex_unlock(&w->lock);
	if (wake)
		event_active(w->notify, EV_READ, 0);
}

void worker_post(struct worker *w, struct worker_call *c)
{
	worker_post_chain(w, c, c);
}

void worker_run_posted(struct worker *w)
{
	struct worker_call *c, *next;

	pthread_mutex_lock(&w->lock);
	c = w->calls;
	w->calls = NULL;
	pthread_mutex_unlock(&w->lock);
	for (; c; c = next) {
		next = c->next;
		c->fn(c); /* may free c */
	}
}

static void worker_fd_noop(evutil_socket_t fd, short what, void *arg)
{
}

/* libevent keeps a small entry for every descriptor number a base has
 * watched (its evmap), made the first time and kept until the base is
 * freed. Made amid a burst of sessions, one such entry lands between every
 * two sessions' buffers and pins their pages once the sessions are gone:
 * malloc_trim then gives almost nothing back. So before a session whose
 * descriptor nears the numbers already prepared, the worker makes the
 * entries of the next block together: each free number in it is taken
 * with F_DUPFD (never one in use), watched and unwatched once, and closed;
 * never within WORKER_FD_HEADROOM of the file limit. */
static void worker_fd_prepare(struct worker *w, int fd)
{
	struct event *ev;
	int spare, x, y, end = fd + WORKER_FD_BLOCK;
	struct rlimit rl;

	if (fd < 0 || fd + 64 < w->fd_ready)
		return;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (rlim_t)end + WORKER_FD_HEADROOM > rl.rlim_cur)
		end = rl.rlim_cur > WORKER_FD_HEADROOM ? (int)(rl.rlim_cur - WORKER_FD_HEADROOM)
						       : 0;
	if (end <= w->fd_ready)
		return;
	spare = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (spare < 0)
		return; /* out of descriptors: later */
	ev = event_new(w->base, -1, EV_READ, worker_fd_noop, NULL);
	for (x = w->fd_ready; ev && x < end; x = y + 1) {
		y = fcntl(spare, F_DUPFD_CLOEXEC, x);
		if (y < 0)
			break;
		if (y < end &&
		    event_assign(ev, w->base, y, EV_READ, worker_fd_noop, NULL) == 0 &&
		    event_add(ev, NULL) == 0)
			event_del(ev);
		close(y);
	}
	if (ev)
		event_free(ev);
	close(spare);
	if (x > w->fd_ready)
		w->fd_ready = x < end ? x : end;
}

static void worker_notify_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct worker_accept *q;
	struct rules *rules;
	int n, i, drain;

	pthread_mutex_lock(&w->lock);
	q = w->queue;
	n = w->nqueue;
	w->queue = NULL;
	w->nqueue = w->capqueue = 0;
	drain = w->drain_request;
	rules = w->rules_pending;
	w->rules_pending = NULL;
	pthread_mutex_unlock(&w->lock);

	if (rules) {
		struct session *s;

		rules_unref(w->rules);
		w->rules = rules;
		/* The next one is taken first: a session may end (and leave
		 * the list) in its own event. */
		list_for_each_entry_safe (s, &w->sessions, link)
			session_rules_changed(s);
	}
	/* Each socket was counted in by the listener: one that gets no
	 * session is counted out here, a session's when it ends. */
	for (i = 0; i < n; i++) {
		worker_fd_prepare(w, q[i].fd);
		if (session_new(w, q[i].fd, (struct sockaddr *)&q[i].sa, q[i].salen,
				q[i].tls) == NULL)
			limits_connection_leave();
	}
	free(q);
	worker_run_posted(w);

	if (drain && !w->draining) {
		struct timeval tv = {worker_settings.drain_timeout_ms / 1000,
				     (worker_settings.drain_timeout_ms % 1000) * 1000};

		w->draining = 1;
		w->drain_timer = evtimer_new(w->base, worker_drain_deadline, w);
		evtimer_add(w->drain_timer, &tv);
		worker_check_drained(w);
	}
}

static uint64_t worker_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* glibc keeps what a burst of sessions freed (buffers, frames, TLS state)
 * in its arenas: thousands of idle connections closing leave tens of MB
 * resident. malloc_trim(0) hands the free pages of every arena back. */
static void worker_trim_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	w->trim_armed = 0;
	w->closes = 0;
	w->trimmed_ms = worker_now_ms();
#ifdef HAVE_MALLOC_TRIM
	malloc_trim(0);
#endif
	STATS_INC(&w->stats, heap_trims);
}

/* A session ended: trim when the worker is idle or many went, throttled.
 * The timer runs after this turn's events, so a burst costs one trim. */
static void worker_trim_consider(struct worker *w)
{
	uint64_t now, since;
	struct timeval tv = {0, 0};

	w->closes++;
	if (w->trim_armed || w->trim_timer == NULL ||
	    (w->nsessions > 0 && w->closes < WORKER_TRIM_CLOSES))
		return;
	now = worker_now_ms();
	since = now - w->trimmed_ms;
	if (w->trimmed_ms && since < WORKER_TRIM_INTERVAL_MS) {
		tv.tv_sec = 0;
		tv.tv_usec = (suseconds_t)(WORKER_TRIM_INTERVAL_MS - since) * 1000;
	}
	if (evtimer_add(w->trim_timer, &tv) == 0)
		w->trim_armed = 1;
}

int worker_defer(struct worker *w, struct worker_call *c)
{
	if (worker_self != w)
		return -1;
	c->next = NULL;
	if (w->deferred == NULL) {
		w->deferred_tail = &w->deferred;
		/* Queued behind the events already active in this turn. */
		event_active(w->turn_end, EV_READ, 0);
	}
	*w->deferred_tail = c;
	w->deferred_tail = &c->next;
	return 0;
}

static void worker_turn_end_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct worker_call *c = w->deferred, *next;

	w->deferred = NULL;
	for (; c; c = next) {
		next = c->next;
		c->fn(c); /* may free c */
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	worker_self = w;
	/* The first block before the first session: a socket is not kept
	 * waiting for it. */
	worker_fd_prepare(w, 0);
	event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
	/* What the last turn deferred (the writes of sessions that went). */
	worker_turn_end_cb(-1, 0, w);
	pool_worker_fini(); /* its pooled broker connections */
	worker_self = NULL;
	return NULL;
}

int worker_init(struct worker *w, int index)
{
	memset(w, 0, sizeof(*w));
	w->index = index;
	list_init(&w->sessions);
	pthread_mutex_init(&w->lock, NULL);
	init_amqp_pool(&w->pool, 16384);
	w->base = event_base_new();
	if (w->base == NULL)
		return -1;
	/* Never added: other threads make it active to hand work over. */
	w->notify = event_new(w->base, -1, 0, worker_notify_cb, w);
	if (w->notify == NULL)
		return -1;
	w->turn_end = event_new(w->base, -1, 0, worker_turn_end_cb, w);
	if (w->turn_end == NULL)
		return -1;
	w->trim_timer = evtimer_new(w->base, worker_trim_cb, w);
	if (w->trim_timer == NULL)
		return -1;
	return 0;
}

int worker_start(struct worker *w, int index)
{
	if (worker_init(w, index) != 0)
		return -1;
	return pthread_create(&w->thread, NULL, worker_main, w) == 0 ? 0 : -1;
}

int worker_assign(struct worker *w, int fd, const struct sockaddr *sa, int salen, int tls)
{
	pthread_mutex_lock(&w->lock);
	if (w->nqueue == w->capqueue) {
		int ncap = w->capqueue ? w->capqueue * 2 : 16;
		struct worker_accept *nq = realloc(w->queue, (size_t)ncap * sizeof(*nq));

		if (nq == NULL) {
			pthread_mutex_unlock(&w->lock);
			return -1;
		}
		w->queue = nq;
		w->capqueue = ncap;
	}
	w->queue[w->nqueue].fd = fd;
	w->queue[w->nqueue].tls = tls;
	memcpy(&w->queue[w->nqueue].sa, sa, (size_t)salen);
	w->queue[w->nqueue].salen = salen;
	w->nqueue++;
	pthread_mutex_unlock(&w->lock);
	event_active(w->notify, EV_READ, 0);
	return 0;
}

void worker_drain(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	w->drain_request = 1;
	pthread_mutex_unlock(&w->lock);
	event_active(w->notify, EV_READ, 0);
}

void worker_set_rules(struct worker *w, struct rules *r)
{
	rules_ref(r);
	pthread_mutex_lock(&w->lock);
	if (w->rules_pending)
		rules_unref(w->rules_pending);
	w->rules_pending = r;
	pthread_mutex_unlock(&w->lock);
	event_active(w->notify, EV_READ, 0);
}

void worker_fini(struct worker *w)
{
	rules_unref(w->rules);
	rules_unref(w->rules_pending);
	if (w->drain_timer)
		event_free(w->drain_timer);
	event_free(w->notify);
	if (w->turn_end)
		event_free(w->turn_end);
	if (w->trim_timer)
		event_free(w->trim_timer);
	event_base_free(w->base);
	empty_amqp_pool(&w->pool);
	pthread_mutex_destroy(&w->lock);
}

void worker_session_add(struct worker *w, struct session *s)
{
	list_add(&s->link, &w->sessions);
	__atomic_store_n(&w->nsessions, w->nsessions + 1, __ATOMIC_RELAXED); /* read by admin */
}

void worker_session_remove(struct worker *w, struct session *s)
{
	list_del(&s->link);
	ACEMQ_ASSERT(w->nsessions > 0);
	__atomic_store_n(&w->nsessions, w->nsessions - 1, __ATOMIC_RELAXED); /* read by admin */
	limits_connection_leave();
	worker_trim_consider(w);
	worker_check_drained(w);
}
