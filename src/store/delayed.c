/* delayed: the records of delayed messages, in the state layer's database
 * "schedule/VHOST": listed in due order, cancelled, removed when the
 * message is delivered or past due plus a margin. */
#include "delayed.h"

#include "../debug.h"

#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value: a head, then the exchange, the routing key and the message
 * id, their lengths in the head. */
#define DELAYED_HEAD 16

static struct state *delayed_st;
static int64_t delayed_margin;

void delayed_init(struct state *st, int64_t margin_ms)
{
	delayed_st = st;
	delayed_margin = margin_ms;
}

struct state *delayed_state(void)
{
	return delayed_st;
}

int64_t delayed_margin_ms(void)
{
	return delayed_margin;
}

static void delayed_db(char db[300], const char *vhost)
{
	snprintf(db, 300, "schedule/%s", vhost);
}

void delayed_key(uint8_t key[DELAYED_KEY_LEN], int64_t due_at, uint64_t nonce)
{
	uint64_t due = due_at < 0 ? 0 : (uint64_t)due_at;
	int i;

	for (i = 0; i < 8; i++) {
		key[i] = (uint8_t)(due >> (56 - 8 * i));
		key[8 + i] = (uint8_t)(nonce >> (56 - 8 * i));
	}
}

static uint64_t delayed_be64(const uint8_t *b)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return v;
}

int64_t delayed_key_due(const uint8_t key[DELAYED_KEY_LEN])
{
	uint64_t v = delayed_be64(key);

	return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

uint64_t delayed_key_nonce(const uint8_t key[DELAYED_KEY_LEN])
{
	return delayed_be64(key + 8);
}

/* Nonces are drawn from the random generator this many at a time: one
 * call for each is an eighth of the proxy's CPU for delayed publishes
 * (OpenSSL's generator sets itself up again on every call). */
#define DELAYED_NONCES 64

uint64_t delayed_nonce(void)
{
	static __thread uint64_t pool[DELAYED_NONCES];
	static __thread int left;
	static uint64_t fallback;
	uint64_t n;

	if (left == 0 && RAND_bytes((unsigned char *)pool, sizeof(pool)) == 1)
		left = DELAYED_NONCES;
	if (left > 0)
		n = pool[--left];
	else
		n = __atomic_add_fetch(&fallback, 1, __ATOMIC_RELAXED) ^ state_now_ms() << 20;
	return n ? n : 1;
}

void delayed_id(char out[DELAYED_ID_LEN + 1], const uint8_t key[DELAYED_KEY_LEN])
{
	static const char hex[] = "0123456789abcdef";
	int i;

	for (i = 0; i < DELAYED_KEY_LEN; i++) {
		out[2 * i] = hex[key[i] >> 4];
		out[2 * i + 1] = hex[key[i] & 15];
	}
	out[DELAYED_ID_LEN] = '\0';
}

static int delayed_hex(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int delayed_parse_id(const void *id, size_t len, uint8_t key[DELAYED_KEY_LEN])
{
	const unsigned char *s = id;
	int i, hi, lo;

	if (len != DELAYED_ID_LEN)
		return -1;
	for (i = 0; i < DELAYED_KEY_LEN; i++) {
		hi = delayed_hex(s[2 * i]);
		lo = delayed_hex(s[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		key[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* ---- values --------------------------------------------------------------------------- */

static size_t delayed_cut(size_t n)
{
	return n > DELAYED_STR_MAX ? DELAYED_STR_MAX : n;
}

void delayed_rec_prepare(struct delayed_rec *r, const char *vhost,
			 const uint8_t key[DELAYED_KEY_LEN], const void *exchange, size_t elen,
			 const void *routing_key, size_t rlen, const void *message_id,
			 size_t mlen, int has_message_id, uint64_t size)
{
	uint8_t *v = r->val;

	elen = delayed_cut(elen);
	rlen = delayed_cut(rlen);
	mlen = has_message_id ? delayed_cut(mlen) : 0;
	memset(v, 0, DELAYED_HEAD);
	v[0] = DELAYED_PENDING;
	v[1] = (uint8_t)elen;
	v[2] = (uint8_t)rlen;
	v[3] = (uint8_t)mlen;
	v[4] = has_message_id != 0;
	memcpy(v + 8, &size, sizeof(size));
	memcpy(v + DELAYED_HEAD, exchange, elen);
	memcpy(v + DELAYED_HEAD + elen, routing_key, rlen);
	if (mlen)
		memcpy(v + DELAYED_HEAD + elen + rlen, message_id, mlen);
	r->vlen = DELAYED_HEAD + elen + rlen + mlen;
	delayed_db(r->db, vhost);
	memcpy(r->key, key, DELAYED_KEY_LEN);
	memset(&r->op, 0, sizeof(r->op));
	r->op.db = r->db;
	r->op.key = r->key;
	r->op.klen = DELAYED_KEY_LEN;
	r->op.val = r->val;
	r->op.vlen = r->vlen;
	r->w.ops = &r->op;
	r->w.nops = 1;
}

/* Decode a record: 0, or -1 when it is not one. */
static int delayed_decode(const void *key, size_t klen, const void *val, size_t vlen,
			  struct delayed_entry *e)
{
	const uint8_t *v = val;

	if (klen != DELAYED_KEY_LEN || vlen < DELAYED_HEAD ||
	    vlen != (size_t)DELAYED_HEAD + v[1] + v[2] + v[3])
		return -1;
	memcpy(e->key, key, DELAYED_KEY_LEN);
	e->due_at = delayed_key_due(e->key);
	e->status = v[0] == DELAYED_CANCELLED ? DELAYED_CANCELLED : DELAYED_PENDING;
	e->elen = v[1];
	e->rlen = v[2];
	e->mlen = v[3];
	e->has_message_id = v[4];
	memcpy(&e->size, v + 8, sizeof(e->size));
	e->exchange = (const char *)v + DELAYED_HEAD;
	e->routing_key = e->exchange + e->elen;
	e->message_id = e->routing_key + e->rlen;
	return 0;
}

/* ---- the scheduler's side ------------------------------------------------------------- */

static void delayed_status_of(void *arg, const void *val, size_t vlen)
{
	const uint8_t *v = val;

	*(int *)arg = vlen >= DELAYED_HEAD && v[0] == DELAYED_CANCELLED;
}

int delayed_cancelled(const char *vhost, const uint8_t key[DELAYED_KEY_LEN])
{
	char db[300];
	int cancelled = 0;

	if (delayed_st == NULL)
		return 0;
	delayed_db(db, vhost);
	if (state_get(delayed_st, db, key, DELAYED_KEY_LEN, delayed_status_of, &cancelled) !=
	    STATE_OK)
		return 0;
	return cancelled;
}

struct delayed_del {
	struct state_write w; /* first */
	struct state_op op;
	char db[300];
	uint8_t key[DELAYED_KEY_LEN];
};

static void delayed_del_done(struct worker_call *c)
{
	free(c);
}

void delayed_forget(const char *vhost, const uint8_t key[DELAYED_KEY_LEN])
{
	struct delayed_del *d;

	if (delayed_st == NULL || (d = calloc(1, sizeof(*d))) == NULL)
		return;
	delayed_db(d->db, vhost);
	memcpy(d->key, key, DELAYED_KEY_LEN);
	d->op.db = d->db;
	d->op.key = d->key;
	d->op.klen = DELAYED_KEY_LEN;
	d->w.ops = &d->op;
	d->w.nops = 1;
	d->w.call.fn = delayed_del_done;
	state_post(delayed_st, &d->w);
}

/* ---- the admin's side ----------------------------------------------------------------- */

struct delayed_walk {
	const uint8_t *after;
	int (*fn)(void *arg, const struct delayed_entry *e);
	void *arg;
};

static int delayed_walk_one(void *arg, const void *key, size_t klen, const void *val,
			    size_t vlen)
{
	struct delayed_walk *wk = arg;
	struct delayed_entry e;

	if (wk->after && klen == DELAYED_KEY_LEN && memcmp(key, wk->after, klen) == 0)
		return 0;
	if (delayed_decode(key, klen, val, vlen, &e) != 0)
		return 0;
	return wk->fn(wk->arg, &e);
}

int delayed_scan(const char *vhost, const uint8_t *after,
		 int (*fn)(void *arg, const struct delayed_entry *e), void *arg)
{
	struct delayed_walk wk = {after, fn, arg};
	char db[300];

	if (delayed_st == NULL)
		return STATE_CLOSED;
	delayed_db(db, vhost);
	return state_scan(delayed_st, db, after, after ? DELAYED_KEY_LEN : 0, delayed_walk_one,
			  &wk);
}

/* A cancellation decided in the writer's transaction: a pending record
 * becomes cancelled; a cancelled one stays; an absent one is not made. */
struct delayed_cancel_op {
	uint8_t buf[DELAYED_HEAD + 3 * DELAYED_STR_MAX];
	int found;
};

static enum state_decision delayed_cancel_update(void *arg, const void *old, size_t oldlen,
						 const void **val, size_t *vlen)
{
	struct delayed_cancel_op *c = arg;

	c->found = old != NULL;
	if (old == NULL || oldlen < DELAYED_HEAD || oldlen > sizeof(c->buf))
		return STATE_KEEP;
	if (((const uint8_t *)old)[0] == DELAYED_CANCELLED)
		return STATE_KEEP;
	memcpy(c->buf, old, oldlen);
	c->buf[0] = DELAYED_CANCELLED;
	*val = c->buf;
	*vlen = oldlen;
	return STATE_PUT;
}

int delayed_cancel(const char *vhost, const uint8_t key[DELAYED_KEY_LEN])
{
	struct delayed_cancel_op c = {.found = 0};
	struct state_op op;
	char db[300];
	int rc;

	if (delayed_st == NULL)
		return STATE_CLOSED;
	delayed_db(db, vhost);
	memset(&op, 0, sizeof(op));
	op.db = db;
	op.key = key;
	op.klen = DELAYED_KEY_LEN;
	op.update = delayed_cancel_update;
	op.arg = &c;
	rc = state_write_wait(delayed_st, &op, 1);
	if (rc != STATE_OK)
		return rc;
	return c.found ? STATE_OK : STATE_NOTFOUND;
}

/* Keys collected by a scan, to be written afterwards. */
struct delayed_keys {
	const char *exchange, *routing_key;
	int64_t before; /* purge: records due before this */
	uint8_t (*k)[DELAYED_KEY_LEN];
	size_t n, cap;
	int failed;
};

static int delayed_keys_add(struct delayed_keys *ks, const uint8_t *key)
{
	if (ks->n == ks->cap) {
		size_t cap = ks->cap ? ks->cap * 2 : 256;
		void *k = realloc(ks->k, cap * sizeof(*ks->k));

		if (k == NULL) {
			ks->failed = 1;
			return 1;
		}
		ks->k = k;
		ks->cap = cap;
	}
	memcpy(ks->k[ks->n++], key, DELAYED_KEY_LEN);
	return 0;
}

static int delayed_target_one(void *arg, const struct delayed_entry *e)
{
	struct delayed_keys *ks = arg;

	if (e->status != DELAYED_PENDING || e->elen != strlen(ks->exchange) ||
	    memcmp(e->exchange, ks->exchange, e->elen) != 0)
		return 0;
	if (ks->routing_key && (e->rlen != strlen(ks->routing_key) ||
				memcmp(e->routing_key, ks->routing_key, e->rlen) != 0))
		return 0;
	return delayed_keys_add(ks, e->key);
}

#define DELAYED_BATCH 256

/* Write ks's keys in batches: cancelled (cancel 1) or deleted. */
static long delayed_write_keys(const char *vhost, struct delayed_keys *ks, int cancel)
{
	struct delayed_cancel_op *c = NULL;
	struct state_op ops[DELAYED_BATCH];
	char db[300];
	long done = 0;
	size_t i, j, n;

	if (cancel && (c = calloc(DELAYED_BATCH, sizeof(*c))) == NULL)
		return -1;
	delayed_db(db, vhost);
	for (i = 0; i < ks->n; i += n) {
		n = ks->n - i < DELAYED_BATCH ? ks->n - i : DELAYED_BATCH;
		ACEMQ_ASSERT(n > 0 && n <= DELAYED_BATCH);
		memset(ops, 0, sizeof(ops));
		for (j = 0; j < n; j++) {
			ops[j].db = db;
			ops[j].key = ks->k[i + j];
			ops[j].klen = DELAYED_KEY_LEN;
			if (cancel) {
				ops[j].update = delayed_cancel_update;
				ops[j].arg = &c[j];
			}
		}
		if (state_write_wait(delayed_st, ops, (int)n) != STATE_OK) {
			done = -1;
			break;
		}
		done += (long)n;
	}
	free(c);
	return done;
}

long delayed_cancel_target(const char *vhost, const char *exchange, const char *routing_key)
{
	struct delayed_keys ks = {exchange, routing_key, 0, NULL, 0, 0, 0};
	long n;

	if (delayed_st == NULL)
		return -1;
	if (delayed_scan(vhost, NULL, delayed_target_one, &ks) != STATE_OK || ks.failed) {
		free(ks.k);
		return -1;
	}
	n = delayed_write_keys(vhost, &ks, 1);
	free(ks.k);
	return n;
}

static int delayed_old_one(void *arg, const struct delayed_entry *e)
{
	struct delayed_keys *ks = arg;

	if (e->due_at >= ks->before)
		return 1; /* due order: the rest is later */
	return delayed_keys_add(ks, e->key);
}

long delayed_purge(const char *vhost, int64_t now_ms)
{
	struct delayed_keys ks = {NULL, NULL, now_ms - delayed_margin, NULL, 0, 0, 0};
	long n;

	if (delayed_st == NULL)
		return 0;
	if (delayed_scan(vhost, NULL, delayed_old_one, &ks) != STATE_OK) {
		free(ks.k);
		return -1;
	}
	n = delayed_write_keys(vhost, &ks, 0);
	free(ks.k);
	return n;
}
