/* pool: the pools of a worker, one per (vhost, user) of a pooled vhost;
 * the credential cache shared by every worker (a salted hash of a password
 * the broker accepted, never the password); a client attaching, shown a
 * broker's connection.start, its credentials checked (at once from the
 * cache, or by a broker connection opened with them), bound to the least
 * loaded connection, or waiting while every connection is full. */
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Shared by every worker: the connections a (vhost, user) has open, and
 * the hash of the password the broker last accepted for it. */
struct pool_key {
	struct pool_key *next;
	char vhost[128], user[128];
	int conns; /* under the lock */
	int users; /* pools of workers holding it */
	uint8_t hash[POOL_HASH_LEN];
	time_t trusted_until;
};

static struct {
	pthread_mutex_t lock;
	struct pool_key *keys;
	uint8_t salt[16];
	int salted;
	unsigned long conns, channels, waiting; /* gauges, atomic */
} pool_shared = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct list pool_list; /* this worker's pools */

static struct pool_key *pool_key_get(const char *vhost, const char *user)
{
	struct pool_key *k;

	pthread_mutex_lock(&pool_shared.lock);
	if (!pool_shared.salted)
		pool_shared.salted =
		    RAND_bytes(pool_shared.salt, sizeof(pool_shared.salt)) == 1;
	for (k = pool_shared.keys; k; k = k->next)
		if (strcmp(k->vhost, vhost) == 0 && strcmp(k->user, user) == 0)
			break;
	if (k == NULL && pool_shared.salted && (k = calloc(1, sizeof(*k))) != NULL) {
		snprintf(k->vhost, sizeof(k->vhost), "%s", vhost);
		snprintf(k->user, sizeof(k->user), "%s", user);
		k->next = pool_shared.keys;
		pool_shared.keys = k;
	}
	if (k)
		k->users++;
	pthread_mutex_unlock(&pool_shared.lock);
	return k;
}

static void pool_key_put(struct pool_key *k)
{
	struct pool_key **pp;

	pthread_mutex_lock(&pool_shared.lock);
	if (--k->users == 0 && k->conns == 0) {
		for (pp = &pool_shared.keys; *pp && *pp != k; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = k->next;
		OPENSSL_cleanse(k->hash, sizeof(k->hash));
		free(k);
	}
	pthread_mutex_unlock(&pool_shared.lock);
}

/* 1 when hash is the one the broker last accepted, within auth_ttl_s. */
int pool_key_trust(struct pool *p, const uint8_t *hash)
{
	int ok;

	pthread_mutex_lock(&pool_shared.lock);
	ok = p->key->trusted_until > time(NULL) &&
	     CRYPTO_memcmp(p->key->hash, hash, POOL_HASH_LEN) == 0;
	pthread_mutex_unlock(&pool_shared.lock);
	return ok;
}

static void pool_key_trusted(struct pool *p, const uint8_t *hash)
{
	pthread_mutex_lock(&pool_shared.lock);
	memcpy(p->key->hash, hash, POOL_HASH_LEN);
	p->key->trusted_until = time(NULL) + p->cfg.auth_ttl_s;
	pthread_mutex_unlock(&pool_shared.lock);
}

/* Claim a connection under max_connections (1), or not (0). */
int pool_key_room(struct pool *p)
{
	int ok;

	pthread_mutex_lock(&pool_shared.lock);
	ok = p->key->conns < p->cfg.max_connections;
	if (ok)
		p->key->conns++;
	pthread_mutex_unlock(&pool_shared.lock);
	if (ok)
		__atomic_add_fetch(&pool_shared.conns, 1, __ATOMIC_RELAXED);
	return ok;
}

void pool_key_count(struct pool *p, int delta)
{
	pthread_mutex_lock(&pool_shared.lock);
	p->key->conns += delta;
	pthread_mutex_unlock(&pool_shared.lock);
	__atomic_add_fetch(&pool_shared.conns, (unsigned long)(long)delta, __ATOMIC_RELAXED);
}

void pool_channels_add(int delta)
{
	__atomic_add_fetch(&pool_shared.channels, (unsigned long)(long)delta, __ATOMIC_RELAXED);
}

void pool_gauges(struct pool_gauges *g)
{
	g->connections = __atomic_load_n(&pool_shared.conns, __ATOMIC_RELAXED);
	g->channels = __atomic_load_n(&pool_shared.channels, __ATOMIC_RELAXED);
	g->waiting = __atomic_load_n(&pool_shared.waiting, __ATOMIC_RELAXED);
}

/* ---- pools ---------------------------------------------------------- */

static struct pool *pool_find(struct worker *w, const struct rules_vhost *v, const char *vhost,
			      const char *user)
{
	struct pool *p;

	if (pool_list.next == NULL)
		list_init(&pool_list);
	list_for_each_entry (p, &pool_list, node)
		if (strcmp(p->vhost, vhost) == 0 && strcmp(p->user, user) == 0) {
			p->cfg = v->pool; /* a reload applies to new clients */
			p->upstreams = v->upstream;
			return p;
		}
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	p->w = w;
	snprintf(p->vhost, sizeof(p->vhost), "%s", vhost);
	snprintf(p->user, sizeof(p->user), "%s", user);
	p->cfg = v->pool;
	p->upstreams = v->upstream;
	list_init(&p->conns);
	list_init(&p->waiting);
	p->key = pool_key_get(vhost, user);
	if (p->key == NULL) {
		free(p);
		return NULL;
	}
	list_add(&p->node, &pool_list);
	return p;
}

/* A pool with no connection and no client goes. */
static void pool_maybe_free(struct pool *p)
{
	if (!list_empty(&p->conns) || !list_empty(&p->waiting))
		return;
	list_del(&p->node);
	if (p->wait_timer)
		event_free(p->wait_timer);
	pool_key_put(p->key);
	free(p);
}

void pool_conn_gone(struct pool_conn *c)
{
	struct pool *p = c->pool;

	list_del(&c->node);
	pool_retry_waiting(p);
	pool_maybe_free(p);
}

int pool_dial(struct session *s, const struct rules_vhost *v)
{
	struct pool_att *a = calloc(1, sizeof(*a));
	struct pool_conn *c;
	struct pool *p;

	if (a == NULL)
		return -1;
	p = pool_find(s->w, v, s->vhost, s->user);
	if (p == NULL) {
		free(a);
		return -1;
	}
	a->s = s;
	a->pool = p;
	a->phase = ATT_START;
	list_init(&a->exclusive);
	list_add_tail(&a->node, &p->waiting);
	a->tr = transport_pipe(s->w->base, &pool_pipe_ops, a);
	if (a->tr == NULL) {
		list_del(&a->node);
		free(a);
		pool_maybe_free(p);
		return -1;
	}
	session_leg_setup(s, &s->upstream, a->tr, DIR_TO_CLIENT);
	transport_read_enable(a->tr);
	session_set_state(s, SESSION_CONNECTING);
	/* Named in its log lines until bound: the pool's first address. */
	s->upstream_at = upstream_pick(p->upstreams.n ? &p->upstreams : NULL, 0);
	/* A connection.start to show: any connection of the pool that has
	 * one, else one being opened (which shows it when it comes). */
	list_for_each_entry (c, &p->conns, node) {
		if (c->start) {
			pool_show_start(a, c);
			return 0;
		}
	}
	list_for_each_entry (c, &p->conns, node)
		if (c->phase < CONN_CREDS)
			return 0;
	if (pool_conn_new(p, NULL, 1) == NULL)
		pool_att_close(a, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - no broker could be reached");
	return 0;
}

int64_t pool_conn_id(struct transport *tr)
{
	struct pool_att *a = transport_pipe_peer(tr, &pool_pipe_ops);

	if (a == NULL)
		return -1;
	return a->conn && a->phase >= ATT_TUNE ? (int64_t)a->conn->id : 0;
}

/* Frames for the client: its session reads them later in this turn. */
void pool_feed(struct pool_att *a)
{
	a->last_in = time(NULL);
	transport_pipe_fed(a->tr);
	if (a->conn && !a->full && transport_pipe_full(a->tr)) {
		/* Its session reads no more for now: the broker's frames wait
		 * (for every client of the connection). */
		a->full = 1;
		a->conn->nfull++;
		pool_conn_kick(a->conn);
	}
}

void pool_show_start(struct pool_att *a, const struct pool_conn *c)
{
	if (a->phase != ATT_START)
		return;
	evbuffer_add(transport_input(a->tr), c->start, c->start_len);
	a->phase = ATT_STARTOK;
	pool_feed(a);
}

/* The client is shown a connection.close as the broker would send it;
 * its frames are dropped from here on. */
void pool_att_close(struct pool_att *a, uint16_t code, const char *text)
{
	if (a->phase == ATT_CLOSING)
		return;
	method_write_connection_close(transport_input(a->tr), code, text, 0, 0);
	a->phase = ATT_CLOSING;
	pool_feed(a);
}

/* The least loaded ready connection with room for a client, or NULL. */
static struct pool_conn *pool_pick(struct pool *p)
{
	struct pool_conn *c, *best = NULL;

	list_for_each_entry (c, &p->conns, node) {
		if (c->phase != CONN_READY || c->check_only || !pool_conn_room(c))
			continue;
		if (best == NULL || c->used < best->used)
			best = c;
	}
	return best;
}

void pool_bind(struct pool_att *a, struct pool_conn *c)
{
	amqp_connection_tune_t t = {0, c->frame_max, 0};

	list_del(&a->node);
	if (a->phase == ATT_WAIT)
		__atomic_sub_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
	list_add_tail(&a->node, &c->atts);
	c->natts++;
	c->idle_since = 0;
	a->conn = c;
	a->s->upstream_at = c->at;
	a->phase = ATT_TUNE;
	method_write(transport_input(a->tr), 0, AMQP_CONNECTION_TUNE_METHOD, &t);
	pool_feed(a);
}

static void pool_wait_cb(evutil_socket_t fd, short what, void *arg)
{
	pool_retry_waiting(arg);
}

/* Credentials known good: a connection for the client now, a new one
 * (under the bound), or a wait. */
static void pool_place(struct pool_att *a)
{
	struct pool *p = a->pool;
	struct pool_conn *c = pool_pick(p);
	struct timeval tv = {0, 100000};

	if (c) {
		pool_bind(a, c);
		return;
	}
	/* One opened for a client's connection.start takes these. */
	list_for_each_entry (c, &p->conns, node) {
		if (c->phase <= CONN_CREDS && c->auth == NULL && !c->check_only) {
			if (a->phase == ATT_WAIT)
				__atomic_sub_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
			a->phase = ATT_AUTH;
			pool_conn_give_creds(c, a);
			return;
		}
	}
	if (a->phase != ATT_WAIT) {
		a->phase = ATT_WAIT;
		a->wait_until =
		    time(NULL) + (worker_settings.handshake_timeout_ms + 999) / 1000;
		__atomic_add_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
	}
	if (pool_conn_new(p, a, 0) != NULL) {
		a->phase = ATT_AUTH;
		__atomic_sub_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
		return;
	}
	if (p->wait_timer == NULL)
		p->wait_timer = evtimer_new(p->w->base, pool_wait_cb, p);
	if (p->wait_timer)
		evtimer_add(p->wait_timer, &tv);
}

/* Clients waiting for room: placed now if there is some; refused once
 * their time is up. */
void pool_retry_waiting(struct pool *p)
{
	struct pool_att *a;
	time_t now = time(NULL);

	list_for_each_entry_safe (a, &p->waiting, node) {
		if (a->phase != ATT_WAIT)
			continue;
		if (now >= a->wait_until) {
			__atomic_sub_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
			list_del(&a->node);
			list_init(&a->node);
			a->phase = ATT_STARTOK; /* pool_att_close sets CLOSING */
			STATS_INC(&p->w->stats, pool_refused_full);
			pool_att_close(a, REPLY_NOT_ALLOWED,
				       "NOT_ALLOWED - every pooled broker connection of this "
				       "vhost and user is full");
			continue;
		}
		pool_place(a);
	}
}

/* The hash of what authenticates the client: mechanism response's user
 * and password, salted; -1 when start-ok does not decode. */
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
	struct pool_conn *c;

	if (pool_hash(a) != 0) {
		pool_att_close(
		    a, REPLY_ACCESS_REFUSED,
		    "ACCESS_REFUSED - Login was refused using authentication mechanism "
		    "PLAIN. For details see the broker logfile.");
		return;
	}
	if (pool_key_trust(p, a->hash)) {
		STATS_INC(&p->w->stats, pool_auth_hits);
		pool_place(a);
		return;
	}
	STATS_INC(&p->w->stats, pool_auth_misses);
	/* A connection opened and waiting for credentials takes these. */
	list_for_each_entry (c, &p->conns, node) {
		if (c->phase == CONN_CREDS && c->auth == NULL) {
			a->phase = ATT_AUTH;
			pool_conn_give_creds(c, a);
			return;
		}
	}
	a->phase = ATT_AUTH;
	if (pool_conn_new(p, a, 1) == NULL)
		pool_att_close(a, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - no broker could be reached");
}

/* The broker opened c with c->auth's credentials. */
void pool_conn_opened(struct pool_conn *c)
{
	struct pool_att *a = c->auth;

	c->auth = NULL;
	if (a == NULL)
		return;
	pool_key_trusted(c->pool, a->hash);
	if (c->check_only) {
		pool_conn_close(c, "credentials checked");
		a->phase = ATT_WAIT;
		__atomic_add_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
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
	evbuffer_add(transport_input(a->tr), frame, len);
	a->phase = ATT_CLOSING;
	pool_feed(a);
}

/* ---- the pipe's peer ------------------------------------------------ */

static void pool_pipe_consumed(void *arg)
{
	struct pool_att *a = arg;

	if (a->full && !transport_pipe_full(a->tr)) {
		a->full = 0;
		if (a->conn && a->conn->nfull > 0 && --a->conn->nfull == 0)
			pool_conn_kick(a->conn);
	}
}

static void pool_pipe_gone(void *arg)
{
	struct pool_att *a = arg;
	struct pool *p = a->pool;

	if (a->full && a->conn && a->conn->nfull > 0 && --a->conn->nfull == 0)
		pool_conn_kick(a->conn);
	if (a->phase == ATT_WAIT)
		__atomic_sub_fetch(&pool_shared.waiting, 1, __ATOMIC_RELAXED);
	if (a->conn && a->conn->auth == a)
		a->conn->auth = NULL;
	pool_mux_leave(a); /* its channels closed at the broker */
	if (list_linked(&a->node))
		list_del(&a->node);
	if (a->conn) {
		ACEMQ_ASSERT(a->conn->natts > 0 || a->phase < ATT_TUNE);
		if (a->phase >= ATT_TUNE && a->conn->natts > 0 && --a->conn->natts == 0)
			a->conn->idle_since = time(NULL);
	}
	if (a->startok)
		evbuffer_free(a->startok);
	OPENSSL_cleanse(a->hash, sizeof(a->hash));
	free(a->map);
	free(a->refused);
	free(a);
	pool_retry_waiting(p);
	pool_maybe_free(p);
}

const struct transport_pipe_ops pool_pipe_ops = {
    .output = pool_mux_output,
    .consumed = pool_pipe_consumed,
    .gone = pool_pipe_gone,
};

void pool_worker_fini(void)
{
	struct pool *p;
	struct pool_conn *c;

	if (pool_list.next == NULL)
		return;
	list_for_each_entry_safe (p, &pool_list, node) {
		list_for_each_entry_safe (c, &p->conns, node)
			pool_conn_close(c, NULL);
	}
}
