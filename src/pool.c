/* pool: the pools of a pooled vhost, one per (vhost, user) and worker,
 * each kept on its home worker, which owns its broker connections; the
 * pools of one (vhost, user) share its bound, and a client whose worker
 * has no pool and no room under the bound for one uses another worker's,
 * reached through a pool_xfer (two buffers, two posted calls). Here: the
 * registry, a client attaching (shown a broker's connection.start), its
 * credentials trusted from a salted hash of the password the broker last
 * accepted (never the password) or checked by a broker connection opened
 * with them, bound to the least loaded connection, or waiting while every
 * one is full. */
#include "pool.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "debug.h"
#include "greeting.h"
#include "log.h"
#include "pool_int.h"
#include "session.h"
#include "transport.h"
#include "worker.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local struct list pool_homed; /* the pools this worker is home to */

static struct {
	pthread_mutex_t lock;
	struct pool *pools;
	uint8_t salt[16];
	int salted;
	unsigned long conns, channels, waiting; /* gauges, atomic */
} pool_shared = {.lock = PTHREAD_MUTEX_INITIALIZER};

void pool_channels_add(int delta)
{
	__atomic_add_fetch(&pool_shared.channels, (unsigned long)(long)delta, __ATOMIC_RELAXED);
}

/* Broker connections of p's (vhost, user), over its pools (a pool's
 * reservation counted): under the registry's lock. */
static unsigned pool_group_conns(const struct pool *p)
{
	const struct pool *q;
	unsigned n = 0;

	for (q = pool_shared.pools; q; q = q->next)
		if (strcmp(q->vhost, p->vhost) == 0 && strcmp(q->user, p->user) == 0)
			n += q->nconns + q->reserved;
	return n;
}

int pool_group_full(struct pool *p)
{
	int full;

	pthread_mutex_lock(&pool_shared.lock);
	full = pool_group_conns(p) >= (unsigned)p->cfg.max_connections;
	pthread_mutex_unlock(&pool_shared.lock);
	return full;
}

int pool_conns_take(struct pool *p)
{
	int took = 1;

	pthread_mutex_lock(&pool_shared.lock);
	if (p->reserved)
		p->reserved = 0; /* the room held for it since it was made */
	else if (pool_group_conns(p) >= (unsigned)p->cfg.max_connections)
		took = 0;
	if (took)
		p->nconns++;
	pthread_mutex_unlock(&pool_shared.lock);
	if (took)
		__atomic_add_fetch(&pool_shared.conns, 1ul, __ATOMIC_RELAXED);
	return took;
}

void pool_conns_drop(struct pool *p)
{
	pthread_mutex_lock(&pool_shared.lock);
	ACEMQ_ASSERT(p->nconns > 0);
	p->nconns--;
	pthread_mutex_unlock(&pool_shared.lock);
	__atomic_sub_fetch(&pool_shared.conns, 1ul, __ATOMIC_RELAXED);
}

static void pool_waiting_add(int delta)
{
	__atomic_add_fetch(&pool_shared.waiting, (unsigned long)(long)delta, __ATOMIC_RELAXED);
}

void pool_gauges(struct pool_gauges *g)
{
	g->connections = __atomic_load_n(&pool_shared.conns, __ATOMIC_RELAXED);
	g->channels = __atomic_load_n(&pool_shared.channels, __ATOMIC_RELAXED);
	g->waiting = __atomic_load_n(&pool_shared.waiting, __ATOMIC_RELAXED);
}

/* ---- the registry ----------------------------------------------------- */

/* The pool for a client of (vhost, user) on w, a reference taken: w's own
 * when it has a connection or room for one under the bound (a connection
 * reserved for it, so that a pool made or woken here can always open
 * one), else, at the bound, another worker's that holds connections. */
static struct pool *pool_get(struct worker *w, const char *vhost, const char *user,
			     int max_connections)
{
	struct pool *p, *mine = NULL, *other = NULL;
	unsigned group = 0;

	pthread_mutex_lock(&pool_shared.lock);
	if (!pool_shared.salted)
		pool_shared.salted =
		    RAND_bytes(pool_shared.salt, sizeof(pool_shared.salt)) == 1;
	for (p = pool_shared.pools; p; p = p->next) {
		if (strcmp(p->vhost, vhost) != 0 || strcmp(p->user, user) != 0)
			continue;
		group += p->nconns + p->reserved;
		if (p->home == w)
			mine = p;
		else if (p->nconns + p->reserved > 0 &&
			 (other == NULL || p->refs < other->refs))
			other = p;
	}
	p = mine;
	if (p == NULL || p->nconns + p->reserved == 0) {
		if (group >= (unsigned)max_connections && other)
			p = other;
		else if (p == NULL && pool_shared.salted &&
			 (p = calloc(1, sizeof(*p))) != NULL) {
			snprintf(p->vhost, sizeof(p->vhost), "%s", vhost);
			snprintf(p->user, sizeof(p->user), "%s", user);
			p->home = w;
			list_init(&p->homed);
			list_init(&p->conns);
			list_init(&p->waiting);
			p->next = pool_shared.pools;
			pool_shared.pools = p;
		}
		if (p && p->home == w && p->nconns + p->reserved == 0 &&
		    group < (unsigned)max_connections)
			p->reserved = 1;
	}
	if (p)
		p->refs++;
	pthread_mutex_unlock(&pool_shared.lock);
	return p;
}

/* On the home worker: a pool no client refers to and with no connection
 * goes. */
static void pool_maybe_free(struct pool *p)
{
	struct pool **pp;
	int go;

	pthread_mutex_lock(&pool_shared.lock);
	go = p->refs == 0 && list_empty(&p->conns);
	if (go) {
		for (pp = &pool_shared.pools; *pp && *pp != p; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = p->next;
	}
	pthread_mutex_unlock(&pool_shared.lock);
	if (!go)
		return;
	ACEMQ_ASSERT(list_empty(&p->waiting));
	list_del(&p->homed);
	if (p->wait_timer)
		event_free(p->wait_timer);
	OPENSSL_cleanse(p->hash, sizeof(p->hash));
	free(p);
}

static void pool_unref(struct pool *p)
{
	pthread_mutex_lock(&pool_shared.lock);
	ACEMQ_ASSERT(p->refs > 0);
	p->refs--;
	pthread_mutex_unlock(&pool_shared.lock);
	pool_maybe_free(p);
}

void pool_conn_gone(struct pool_conn *c)
{
	struct pool *p = c->pool;

	list_del(&c->node);
	pool_retry_waiting(p);
	pool_maybe_free(p);
}

/* ---- the meeting point ------------------------------------------------ */

static void pool_to_a(struct worker_call *call);
static void pool_to_p(struct worker_call *call);

static void pool_xfer_unref(struct pool_xfer *x)
{
	int refs;

	pthread_mutex_lock(&x->lock);
	refs = --x->refs;
	pthread_mutex_unlock(&x->lock);
	if (refs)
		return;
	evbuffer_free(x->up);
	evbuffer_free(x->down);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

/* Under x->lock: the call to the other side, once until it runs. */
static void pool_post_a(struct pool_xfer *x)
{
	if (x->a_posted)
		return;
	x->a_posted = 1;
	x->refs++;
	worker_post(x->wa, &x->to_a);
}

static void pool_post_p(struct pool_xfer *x)
{
	if (x->p_posted)
		return;
	x->p_posted = 1;
	x->refs++;
	worker_post(x->pool->home, &x->to_p);
}

/* P: frames for the client go to its worker. */
void pool_feed(struct pool_att *a)
{
	struct pool_xfer *x = a->x;
	int full;

	a->last_in = time(NULL);
	pthread_mutex_lock(&x->lock);
	evbuffer_add_buffer(x->down, a->down);
	full = __atomic_load_n(&x->a_full, __ATOMIC_RELAXED) ||
	       evbuffer_get_length(x->down) >= (size_t)worker_settings.buffer_limit;
	pool_post_a(x);
	pthread_mutex_unlock(&x->lock);
	if (full && a->conn && !a->full) {
		/* Its session reads no more for now: the broker's frames wait
		 * (for every client of the connection). */
		a->full = 1;
		a->conn->nfull++;
	}
}

/* P: the broker side is gone; the session reads what it was given, then
 * the end. */
void pool_att_end(struct pool_att *a)
{
	pthread_mutex_lock(&a->x->lock);
	evbuffer_add_buffer(a->x->down, a->down);
	a->x->end = 1;
	pool_post_a(a->x);
	pthread_mutex_unlock(&a->x->lock);
}

/* A: what P sent, into the session's pipe. */
static void pool_to_a(struct worker_call *call)
{
	struct pool_xfer *x =
	    (struct pool_xfer *)(void *)((char *)call - offsetof(struct pool_xfer, to_a));
	struct transport *tr;
	size_t n;
	int end, kick, at;

	pthread_mutex_lock(&x->lock);
	x->a_posted = 0;
	tr = x->tr;
	n = evbuffer_get_length(x->down);
	if (tr)
		evbuffer_add_buffer(transport_input(tr), x->down);
	else
		evbuffer_drain(x->down, n);
	end = x->end;
	kick = x->kick;
	x->kick = 0;
	pthread_mutex_unlock(&x->lock);
	if (tr) {
		at = __atomic_load_n(&x->at, __ATOMIC_RELAXED);
		if (at >= 0)
			x->s->upstream_at = at;
		transport_pipe_count(tr, n, 0);
		if (n) {
			transport_pipe_fed(tr);
			if (transport_pipe_full(tr))
				__atomic_store_n(&x->a_full, 1, __ATOMIC_RELAXED);
		}
		if (kick)
			transport_pipe_kick(tr);
		if (end)
			transport_pipe_end(tr, TRANSPORT_EOF, 0); /* x is no longer its peer */
	}
	pool_xfer_unref(x);
}

/* A: the session wrote for the broker; P takes it (while P's side is
 * below buffer_limit: above, the session's own backpressure applies). */
static void pool_pipe_output(void *arg)
{
	struct pool_xfer *x = arg;
	struct evbuffer *out = transport_output(x->tr);
	size_t n;

	pthread_mutex_lock(&x->lock);
	if (evbuffer_get_length(x->up) < (size_t)worker_settings.buffer_limit) {
		n = evbuffer_get_length(out);
		evbuffer_add_buffer(x->up, out);
		pool_post_p(x);
		pthread_mutex_unlock(&x->lock);
		transport_pipe_count(x->tr, 0, n);
		return;
	}
	pthread_mutex_unlock(&x->lock);
}

/* A: the session read its input down after it had been full. */
static void pool_pipe_consumed(void *arg)
{
	struct pool_xfer *x = arg;

	if (!__atomic_load_n(&x->a_full, __ATOMIC_RELAXED))
		return;
	__atomic_store_n(&x->a_full, 0, __ATOMIC_RELAXED);
	pthread_mutex_lock(&x->lock);
	x->unfull = 1;
	pool_post_p(x);
	pthread_mutex_unlock(&x->lock);
}

/* A: the session freed its pipe. */
static void pool_pipe_gone(void *arg)
{
	struct pool_xfer *x = arg;

	pthread_mutex_lock(&x->lock);
	x->tr = NULL;
	x->s = NULL;
	x->gone = 1;
	pool_post_p(x);
	pthread_mutex_unlock(&x->lock);
	pool_xfer_unref(x); /* A's */
}

static const struct transport_pipe_ops pool_pipe_ops = {
    .output = pool_pipe_output,
    .consumed = pool_pipe_consumed,
    .gone = pool_pipe_gone,
};

/* ---- clients, on the home worker -------------------------------------- */

void pool_show_start(struct pool_att *a, const struct pool_conn *c)
{
	if (a->phase != ATT_START)
		return;
	evbuffer_add(a->down, c->start, c->start_len);
	a->phase = ATT_STARTOK;
	pool_feed(a);
}

/* The client is shown a connection.close as the broker would send it;
 * its frames are dropped from here on. */
void pool_att_close(struct pool_att *a, uint16_t code, const char *text)
{
	if (a->phase == ATT_CLOSING)
		return;
	method_write_connection_close(a->down, code, text, 0, 0);
	a->phase = ATT_CLOSING;
	pool_feed(a);
}

static uint64_t pool_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* a waits for room (or for the pool's credential check) until its
 * deadline: set when it came, before its session's handshake timeout, so
 * the pool's refusal (530, with the reason) is what the client hears. */
static void pool_wait_start(struct pool_att *a)
{
	a->phase = ATT_WAIT;
	pool_waiting_add(1);
}

static void pool_att_unwait(struct pool_att *a)
{
	if (a->phase == ATT_WAIT)
		pool_waiting_add(-1);
}

/* The least loaded ready connection with room for a client, or NULL. */
static struct pool_conn *pool_pick(struct pool *p)
{
	struct pool_conn *c, *best = NULL;

	list_for_each_entry (c, &p->conns, node) {
		if (c->phase != CONN_READY || c->check_only || !pool_conn_room(c))
			continue;
		if (best == NULL || pool_conn_busy(c) < pool_conn_busy(best))
			best = c;
	}
	return best;
}

void pool_bind(struct pool_att *a, struct pool_conn *c)
{
	amqp_connection_tune_t t = {0, c->frame_max, 0};

	pool_att_unwait(a);
	list_del(&a->node);
	list_add_tail(&a->node, &c->atts);
	c->natts++;
	c->idle_since = 0;
	a->conn = c;
	a->phase = ATT_TUNE;
	__atomic_store_n(&a->x->at, c->at, __ATOMIC_RELAXED);
	__atomic_store_n(&a->x->conn_id, (int64_t)c->id, __ATOMIC_RELAXED);
	method_write(a->down, 0, AMQP_CONNECTION_TUNE_METHOD, &t);
	pool_feed(a);
}

static void pool_check(struct pool_att *a);

static void pool_wait_cb(evutil_socket_t fd, short what, void *arg)
{
	pool_retry_waiting(arg);
}

/* Credentials known good: a connection for the client now (one open, one
 * opened for a connection.start, a new one under the bound), or a wait. */
static void pool_place(struct pool_att *a)
{
	struct pool *p = a->pool;
	struct pool_conn *c = pool_pick(p);
	struct timeval tv = {0, 100000};

	if (c) {
		pool_bind(a, c);
		return;
	}
	list_for_each_entry (c, &p->conns, node) {
		if (c->phase <= CONN_CREDS && c->auth == NULL && !c->check_only) {
			pool_att_unwait(a);
			a->phase = ATT_AUTH;
			pool_conn_give_creds(c, a);
			return;
		}
	}
	if (pool_conn_new(p, a, 0) != NULL) {
		pool_att_unwait(a);
		a->phase = ATT_AUTH;
		return;
	}
	if (a->phase != ATT_WAIT) {
		a->phase = ATT_WAIT;
		pool_wait_start(a);
	}
	if (p->wait_timer == NULL)
		p->wait_timer = evtimer_new(p->home->base, pool_wait_cb, p);
	if (p->wait_timer)
		evtimer_add(p->wait_timer, &tv);
}

/* Clients waiting for room: placed now if there is some; refused once
 * their time is up. */
void pool_retry_waiting(struct pool *p)
{
	struct pool_att *a;
	uint64_t now = pool_now_ms();

	list_for_each_entry_safe (a, &p->waiting, node) {
		if (a->phase != ATT_WAIT)
			continue;
		if (now >= a->wait_until) {
			pool_att_unwait(a);
			a->phase = ATT_STARTOK; /* pool_att_close sets CLOSING */
			STATS_INC(&p->home->stats, pool_refused_full);
			pool_att_close(a, REPLY_NOT_ALLOWED,
				       "NOT_ALLOWED - every pooled broker connection of this "
				       "vhost and user is full");
			continue;
		}
		if (a->needs_check)
			pool_check(a);
		else
			pool_place(a);
	}
}

/* The hash of what authenticates the client (its user and password,
 * salted); -1 when its start-ok does not decode. */
static int pool_hash(struct pool_att *a)
{
	amqp_connection_start_ok_t *m;
	amqp_method_number_t id;
	struct frame_info fi;
	char user[256], pass[256];
	amqp_pool_t scratch;
	EVP_MD_CTX *ctx;
	void *decoded;
	unsigned int len = 0;
	int rc = -1;

	if (frame_scan_evbuffer(a->startok, 0, GREETING_FRAME_MAX, &fi) != FRAME_SCAN_OK)
		return -1;
	init_amqp_pool(&scratch, 4096);
	if (method_decode_evbuffer(a->startok, fi.size, &scratch, &id, &decoded) != 0 ||
	    id != AMQP_CONNECTION_START_OK_METHOD) {
		empty_amqp_pool(&scratch);
		return -1;
	}
	m = decoded;
	a->caps_blocked = greeting_capability(&m->client_properties, "connection.blocked");
	if (greeting_credentials(m, user, sizeof(user), pass, sizeof(pass)) == 0 &&
	    (ctx = EVP_MD_CTX_new()) != NULL) {
		if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
		    EVP_DigestUpdate(ctx, pool_shared.salt, sizeof(pool_shared.salt)) == 1 &&
		    EVP_DigestUpdate(ctx, user, strlen(user) + 1) == 1 &&
		    EVP_DigestUpdate(ctx, pass, strlen(pass)) == 1 &&
		    EVP_DigestFinal_ex(ctx, a->hash, &len) == 1 && len == POOL_HASH_LEN)
			rc = 0;
		EVP_MD_CTX_free(ctx);
	}
	OPENSSL_cleanse(pass, sizeof(pass));
	empty_amqp_pool(&scratch);
	return rc;
}

/* The client's start-ok is in a->startok: trusted at once, or checked by
 * the broker on a connection opened with it. */
void pool_credentials_in(struct pool_att *a)
{
	struct pool *p = a->pool;

	if (pool_hash(a) != 0) {
		pool_att_close(
		    a, REPLY_ACCESS_REFUSED,
		    "ACCESS_REFUSED - Login was refused using authentication mechanism "
		    "PLAIN. For details see the broker logfile.");
		return;
	}
	if (p->trusted_until > time(NULL) &&
	    CRYPTO_memcmp(p->hash, a->hash, POOL_HASH_LEN) == 0) {
		STATS_INC(&p->home->stats, pool_auth_hits);
		pool_place(a);
		return;
	}
	STATS_INC(&p->home->stats, pool_auth_misses);
	pool_check(a);
}

/* The broker checks a's credentials: on a connection opened and waiting
 * for some, on a new one under the bound, or, at the bound, on one short
 * connection at a time per pool (the bound is passed by one at most; the
 * other clients to check wait for it). */
static void pool_check(struct pool_att *a)
{
	struct pool *p = a->pool;
	struct pool_conn *c;
	struct timeval tv = {0, 100000};

	list_for_each_entry (c, &p->conns, node) {
		if (c->phase <= CONN_CREDS && c->auth == NULL) {
			pool_att_unwait(a);
			a->needs_check = 0;
			a->phase = ATT_AUTH;
			pool_conn_give_creds(c, a);
			return;
		}
	}
	if (pool_group_full(p)) {
		list_for_each_entry (c, &p->conns, node) {
			if (c->check_only && c->phase != CONN_CLOSING) {
				/* Another check is out: wait for it. */
				if (a->phase != ATT_WAIT) {
					a->phase = ATT_WAIT;
					pool_wait_start(a);
				}
				a->needs_check = 1;
				if (p->wait_timer == NULL)
					p->wait_timer =
					    evtimer_new(p->home->base, pool_wait_cb, p);
				if (p->wait_timer)
					evtimer_add(p->wait_timer, &tv);
				return;
			}
		}
	}
	pool_att_unwait(a);
	a->needs_check = 0;
	a->phase = ATT_AUTH;
	if (pool_conn_new(p, a, 1) == NULL)
		pool_att_close(a, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - no broker could be reached");
}

/* The broker opened c with c->auth's credentials. */
void pool_conn_opened(struct pool_conn *c)
{
	struct pool_att *a = c->auth;
	struct pool *p = c->pool;

	c->auth = NULL;
	if (a == NULL)
		return;
	memcpy(p->hash, a->hash, POOL_HASH_LEN);
	p->trusted_until = time(NULL) + p->cfg.auth_ttl_s;
	a->conn = NULL;
	if (c->check_only) {
		pool_conn_close(c, "credentials checked");
		pool_place(a);
		return;
	}
	pool_bind(a, c);
}

/* The broker refused c's credentials or vhost: its client is told in the
 * broker's words. */
void pool_conn_refused(struct pool_conn *c, const uint8_t *frame, size_t len)
{
	struct pool_att *a = c->auth;

	c->auth = NULL;
	if (a == NULL || a->phase == ATT_CLOSING)
		return;
	a->conn = NULL;
	evbuffer_add(a->down, frame, len);
	a->phase = ATT_CLOSING;
	pool_feed(a);
}

/* P: a new client (posted by pool_dial). */
static struct pool_att *pool_attach(struct pool_xfer *x)
{
	struct pool *p = x->pool;
	struct pool_att *a = calloc(1, sizeof(*a));
	struct pool_conn *c;

	if (a == NULL || (a->up = evbuffer_new()) == NULL ||
	    (a->down = evbuffer_new()) == NULL) {
		if (a && a->up)
			evbuffer_free(a->up);
		free(a);
		return NULL;
	}
	if (!list_linked(&p->homed)) {
		if (pool_homed.next == NULL)
			list_init(&pool_homed);
		list_add(&p->homed, &pool_homed);
	}
	/* The rules in force when the client came apply to what opens now. */
	p->cfg = x->cfg;
	p->upstreams = x->upstreams;
	a->x = x;
	a->wait_until = x->deadline_ms;
	a->session_id = x->session_id;
	a->pool = p;
	a->phase = ATT_START;
	list_init(&a->exclusive);
	list_add_tail(&a->node, &p->waiting);
	/* A connection.start to show: any connection of the pool that has
	 * one, else one being opened (which shows it when it comes). */
	list_for_each_entry (c, &p->conns, node) {
		if (c->start) {
			pool_show_start(a, c);
			return a;
		}
	}
	list_for_each_entry (c, &p->conns, node)
		if (c->phase < CONN_CREDS)
			return a;
	if (pool_conn_new(p, NULL, 1) == NULL)
		pool_att_close(a, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - no broker could be reached");
	return a;
}

/* P: the client's session let go; what it held at the broker goes. */
static void pool_detach(struct pool_att *a)
{
	struct pool_conn *c = a->conn;

	pool_att_unwait(a);
	if (c && c->auth == a)
		c->auth = NULL;
	pool_mux_leave(a, 0);
	if (c && c->slots) {
		unsigned m;

		for (m = 1; m < c->nslots; m++)
			if (c->slots[m].waiter == a)
				c->slots[m].waiter = NULL;
	}
	c = a->conn; /* leaving may have cost the connection */
	if (a->full && c && c->nfull > 0 && --c->nfull == 0)
		pool_conn_kick(c);
	list_del(&a->node);
	if (c && a->phase >= ATT_TUNE && c->natts > 0 && --c->natts == 0)
		c->idle_since = time(NULL);
	if (a->startok)
		evbuffer_free(a->startok);
	OPENSSL_cleanse(a->hash, sizeof(a->hash));
	evbuffer_free(a->up);
	evbuffer_free(a->down);
	free(a->map);
	free(a->refused);
	free(a);
}

/* P: what A posted: a new client, its frames, room again, its end. */
static void pool_to_p(struct worker_call *call)
{
	struct pool_xfer *x =
	    (struct pool_xfer *)(void *)((char *)call - offsetof(struct pool_xfer, to_p));
	struct pool *p = x->pool;
	struct pool_att *a = x->att;
	int gone, unfull, kick;

	if (a == NULL && !x->gone)
		a = x->att = pool_attach(x);
	pthread_mutex_lock(&x->lock);
	x->p_posted = 0;
	kick = evbuffer_get_length(x->up) >= (size_t)worker_settings.buffer_limit;
	if (a)
		evbuffer_add_buffer(a->up, x->up);
	else
		evbuffer_drain(x->up, evbuffer_get_length(x->up));
	gone = x->gone;
	unfull = x->unfull;
	x->unfull = 0;
	if (kick && !gone) {
		x->kick = 1; /* A may give more */
		pool_post_a(x);
	}
	pthread_mutex_unlock(&x->lock);
	if (a) {
		if (unfull && a->full) {
			a->full = 0;
			if (a->conn && a->conn->nfull > 0 && --a->conn->nfull == 0)
				pool_conn_kick(a->conn);
		}
		pool_mux_output(a);
		if (gone) {
			pool_detach(a);
			x->att = NULL;
		}
	}
	if (gone && !x->released) {
		x->released = 1;
		pool_xfer_unref(x); /* P's */
		pool_unref(p);
	}
	pool_xfer_unref(x); /* the call's */
}

/* What is left of s's handshake time, less a margin for the refusal to
 * reach the client first. */
static long pool_wait_budget_ms(const struct session *s)
{
	long total = worker_settings.handshake_timeout_ms;
	long spent = (long)(time(NULL) - s->opened) * 1000;
	long left = total - spent - 1000;

	return left > 200 ? left : 200;
}

int pool_dial(struct session *s, const struct rules_vhost *v)
{
	struct pool_xfer *x = calloc(1, sizeof(*x));
	struct pool *p;

	if (x == NULL)
		return -1;
	p = pool_get(s->w, s->vhost, s->user, v->pool.max_connections);
	if (p == NULL) {
		free(x);
		return -1;
	}
	x->up = evbuffer_new();
	x->down = evbuffer_new();
	x->tr = x->up && x->down ? transport_pipe(s->w->base, &pool_pipe_ops, x) : NULL;
	if (x->tr == NULL) {
		if (x->up)
			evbuffer_free(x->up);
		if (x->down)
			evbuffer_free(x->down);
		free(x);
		pool_unref(p);
		return -1;
	}
	pthread_mutex_init(&x->lock, NULL);
	x->refs = 2; /* A's and P's */
	x->to_a.fn = pool_to_a;
	x->to_p.fn = pool_to_p;
	x->wa = s->w;
	x->pool = p;
	x->s = s;
	x->at = -1;
	x->session_id = s->id;
	/* A client waiting for room is refused a little before its
	 * handshake timeout (counted from its accept) would close it. */
	x->deadline_ms = pool_now_ms() + (uint64_t)pool_wait_budget_ms(s);
	x->cfg = v->pool;
	x->upstreams = v->upstream;
	session_leg_setup(s, &s->upstream, x->tr, DIR_TO_CLIENT);
	transport_read_enable(x->tr);
	session_set_state(s, SESSION_CONNECTING);
	/* Named in its log lines until bound: the pool's first address. */
	s->upstream_at = upstream_pick(v->upstream.n ? &v->upstream : NULL, 0);
	pthread_mutex_lock(&x->lock);
	pool_post_p(x); /* attach */
	pthread_mutex_unlock(&x->lock);
	return 0;
}

int64_t pool_conn_id(struct transport *tr)
{
	struct pool_xfer *x = transport_pipe_peer(tr, &pool_pipe_ops);

	return x ? __atomic_load_n(&x->conn_id, __ATOMIC_RELAXED) : -1;
}

/* On a worker's thread as it ends: the connections of the pools it is home
 * to close (their clients, on any worker, are told), and the pools leave
 * its list. */
void pool_worker_fini(void)
{
	struct pool *p;
	struct pool_conn *c;

	if (pool_homed.next == NULL)
		return;
	list_for_each_entry_safe (p, &pool_homed, homed) {
		int last = list_empty(&p->conns);

		while (!last) {
			c = list_first_entry(&p->conns, struct pool_conn, node);
			last = c->node.next == &p->conns;
			pool_conn_close(c, NULL); /* the last one may free p */
		}
	}
	/* What is left (pools whose clients still hold them, let go later
	 * by calls the main thread runs) must not point into this thread's
	 * list, which ends with the thread. */
	list_for_each_entry_safe (p, &pool_homed, homed)
		list_del(&p->homed);
}
