/* idem: idempotency keys and publish-dedup windows in the state layer:
 * claim, confirm and forget under a lease, decided inside the writer's
 * transaction. */
#include "idem.h"

#include "../debug.h"
#include "../rules.h"
#include "pgstore.h"

#include <event2/buffer.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IDEM_STATE_CLAIMED = 1, IDEM_STATE_CONFIRMED = 2 };

static int idem_owned(const struct idem_record *cur, const uint64_t owner[2])
{
	return cur->owner[0] == owner[0] && cur->owner[1] == owner[1];
}

enum state_decision idem_decide(struct idem_req *r, const struct idem_record *cur)
{
	int live = cur && cur->until_ms > r->now_ms;

	memset(&r->rec, 0, sizeof(r->rec));
	switch (r->what) {
	case IDEM_CLAIM:
		if (live && cur->state == IDEM_STATE_CONFIRMED) {
			r->answer = IDEM_DUPLICATE;
			return STATE_KEEP;
		}
		/* Claimed under a live lease by anyone else (a second message
		 * with the key reaching the same consumer too: another
		 * delivery, another owner): in progress. The same owner (the
		 * same delivery) claiming again renews its lease, as
		 * PostgreSQL's claim does. */
		if (live && cur->state == IDEM_STATE_CLAIMED && !idem_owned(cur, r->owner)) {
			r->answer = IDEM_IN_PROGRESS;
			return STATE_KEEP;
		}
		/* Absent, or its time passed: claim it. */
		r->answer = IDEM_CLAIMED;
		r->lease_expired = cur != NULL && cur->state == IDEM_STATE_CLAIMED && !live;
		r->rec.state = IDEM_STATE_CLAIMED;
		r->rec.until_ms = r->now_ms + r->span_ms;
		memcpy(r->rec.owner, r->owner, sizeof(r->rec.owner));
		return STATE_PUT;
	case IDEM_CONFIRM:
		/* The handler accepted it: confirmed for the retention, whoever
		 * held the claim (a lease that ran out meanwhile changes
		 * nothing: it did run). */
		if (cur && cur->state == IDEM_STATE_CONFIRMED && live) {
			r->answer = IDEM_DONE;
			return STATE_KEEP;
		}
		r->answer = IDEM_DONE;
		r->rec.state = IDEM_STATE_CONFIRMED;
		r->rec.until_ms = r->now_ms + r->span_ms;
		memcpy(r->rec.owner, r->owner, sizeof(r->rec.owner));
		return STATE_PUT;
	case IDEM_FORGET:
		/* Only this owner's own claim; never another's, never a
		 * confirmation. */
		if (cur && cur->state == IDEM_STATE_CLAIMED && idem_owned(cur, r->owner)) {
			r->answer = IDEM_DONE;
			return STATE_DEL;
		}
		r->answer = IDEM_NOT_OWNER;
		return STATE_KEEP;
	}
	return STATE_KEEP;
}

static enum state_decision idem_update(void *arg, const void *old, size_t oldlen,
				       const void **val, size_t *vlen)
{
	struct idem_req *r = arg;
	struct idem_record cur;
	enum state_decision d;

	if (old && oldlen == sizeof(cur))
		memcpy(&cur, old, sizeof(cur));
	d = idem_decide(r, old && oldlen == sizeof(cur) ? &cur : NULL);
	*val = &r->rec;
	*vlen = sizeof(r->rec);
	return d;
}

/* The request around r->db and r->key, already filled. */
static void idem_fill(struct idem_req *r, enum idem_op what, const uint64_t owner[2],
		      uint64_t now_ms, uint64_t span_ms)
{
	memset(&r->op, 0, sizeof(r->op));
	r->what = what;
	r->now_ms = now_ms;
	r->span_ms = span_ms;
	memcpy(r->owner, owner, sizeof(r->owner));
	r->op.db = r->db;
	r->op.key = r->key;
	r->op.klen = r->klen;
	r->op.update = idem_update;
	r->op.arg = r;
	r->w.ops = &r->op;
	r->w.nops = 1;
}

int idem_prepare(struct idem_req *r, enum idem_op what, const char *vhost, const char *queue,
		 const void *key, size_t klen, const uint64_t owner[2], uint64_t now_ms,
		 uint64_t span_ms)
{
	size_t qlen = strlen(queue);

	if (qlen + 1 + klen > sizeof(r->key) || klen == 0)
		return -1;
	snprintf(r->db, sizeof(r->db), "idem/%s", vhost);
	/* Namespaced by queue: "QUEUE\0KEY". */
	memcpy(r->key, queue, qlen);
	r->key[qlen] = 0;
	memcpy(r->key + qlen + 1, key, klen);
	r->klen = qlen + 1 + klen;
	idem_fill(r, what, owner, now_ms, span_ms);
	return 0;
}

int idem_dedup_prepare(struct idem_req *r, enum idem_op what, const char *vhost,
		       const void *exchange, size_t elen, const void *value, size_t vlen,
		       const uint64_t owner[2], uint64_t now_ms, uint64_t span_ms)
{
	static const char hashed[] = "\xffsha256:";
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;

	if (elen > 255 || vlen == 0)
		return -1;
	snprintf(r->db, sizeof(r->db), "dedup/%s", vhost);
	/* Namespaced by exchange: "EXCHANGE\0VALUE", within LMDB's 511. */
	memcpy(r->key, exchange, elen);
	r->key[elen] = 0;
	r->klen = elen + 1;
	if (vlen <= IDEM_DEDUP_VALUE_MAX) {
		memcpy(r->key + r->klen, value, vlen);
		r->klen += vlen;
	} else {
		if (EVP_Digest(value, vlen, md, &mdlen, EVP_sha256(), NULL) != 1)
			return -1;
		memcpy(r->key + r->klen, hashed, sizeof(hashed) - 1);
		r->klen += sizeof(hashed) - 1;
		memcpy(r->key + r->klen, md, mdlen);
		r->klen += mdlen;
	}
	ACEMQ_ASSERT(r->klen <= sizeof(r->key));
	idem_fill(r, what, owner, now_ms, span_ms);
	return 0;
}

struct idem_sweep {
	uint64_t now_ms;
	char (*dead)[IDEM_KEY_MAX];
	size_t *lens;
	size_t n, cap;
};

static int idem_sweep_one(void *arg, const void *key, size_t klen, const void *val, size_t vlen)
{
	struct idem_sweep *sw = arg;
	struct idem_record rec;

	if (vlen != sizeof(rec) || klen > IDEM_KEY_MAX)
		return 0;
	memcpy(&rec, val, sizeof(rec));
	if (rec.until_ms > sw->now_ms)
		return 0;
	if (sw->n == sw->cap) {
		size_t cap = sw->cap ? sw->cap * 2 : 256;
		void *d = realloc(sw->dead, cap * sizeof(*sw->dead));
		void *l;

		if (d == NULL)
			return 1;
		sw->dead = d;
		l = realloc(sw->lens, cap * sizeof(*sw->lens));
		if (l == NULL)
			return 1;
		sw->lens = l;
		sw->cap = cap;
	}
	memcpy(sw->dead[sw->n], key, klen);
	sw->lens[sw->n++] = klen;
	return 0;
}

/* A record whose time passed is removed only if it still has not been
 * renewed when the delete runs. */
static enum state_decision idem_expired(void *arg, const void *old, size_t oldlen,
					const void **val, size_t *vlen)
{
	struct idem_record rec;

	if (old == NULL || oldlen != sizeof(rec))
		return STATE_KEEP;
	memcpy(&rec, old, sizeof(rec));
	return rec.until_ms <= *(const uint64_t *)arg ? STATE_DEL : STATE_KEEP;
}

/* Remove the records of database db whose time has passed. */
static long idem_purge_db(struct state *st, const char *db, uint64_t now_ms)
{
	struct idem_sweep sw;
	long removed = 0;
	size_t i, j;

	memset(&sw, 0, sizeof(sw));
	sw.now_ms = now_ms;
	if (state_scan(st, db, NULL, 0, idem_sweep_one, &sw) != STATE_OK) {
		free(sw.dead);
		free(sw.lens);
		return -1;
	}
	for (i = 0; i < sw.n; i += 512) {
		struct state_op ops[512];
		size_t n = sw.n - i < 512 ? sw.n - i : 512;

		ACEMQ_ASSERT(n > 0 && n <= 512);
		memset(ops, 0, sizeof(ops));
		for (j = 0; j < n; j++) {
			ops[j].db = db;
			ops[j].key = sw.dead[i + j];
			ops[j].klen = sw.lens[i + j];
			ops[j].update = idem_expired;
			ops[j].arg = &sw.now_ms;
		}
		if (state_write_wait(st, ops, (int)n) != STATE_OK)
			break;
		removed += (long)n;
	}
	free(sw.dead);
	free(sw.lens);
	return removed;
}

long idem_purge(struct state *st, const char *vhost, uint64_t now_ms)
{
	char db[300];

	snprintf(db, sizeof(db), "idem/%s", vhost);
	return idem_purge_db(st, db, now_ms);
}

long idem_dedup_purge(struct state *st, const char *vhost, uint64_t now_ms)
{
	char db[300];

	snprintf(db, sizeof(db), "dedup/%s", vhost);
	return idem_purge_db(st, db, now_ms);
}

static struct pgstore *idem_pg;
static uint64_t idem_ops[2][3]; /* backend, op; atomic */

void idem_set_postgresql(struct pgstore *pg)
{
	idem_pg = pg;
}

struct pgstore *idem_postgresql(void)
{
	return idem_pg;
}

int idem_submit(struct state *st, int postgresql, struct idem_req *r)
{
	if (postgresql ? idem_pg == NULL : st == NULL)
		return -1;
	__atomic_add_fetch(&idem_ops[postgresql != 0][r->what], 1, __ATOMIC_RELAXED);
	if (postgresql)
		pgstore_submit(idem_pg, r);
	else
		state_submit(st, &r->w);
	return 0;
}

const char *idem_unready(const struct rules *r)
{
	if (r == NULL || !r->any_postgresql || (idem_pg && pgstore_ready(idem_pg)))
		return NULL;
	return "the PostgreSQL state store does not answer";
}

void idem_metrics(struct evbuffer *out)
{
	static const char *const backends[2] = {"lmdb", "postgresql"};
	static const char *const ops[3] = {"claim", "confirm", "forget"};
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	int b, o;

	evbuffer_add_printf(out, "# HELP acemq_proxy_keys_operations_total idempotency and "
				 "publish-dedup operations, by backend and op\n"
				 "# TYPE acemq_proxy_keys_operations_total counter\n");
	for (b = 0; b < 2; b++)
		for (o = 0; o < 3; o++)
			evbuffer_add_printf(out,
					    "acemq_proxy_keys_operations_total{backend=\"%s\","
					    "op=\"%s\"} %llu\n",
					    backends[b], ops[o],
					    (unsigned long long)__atomic_load_n(
						&idem_ops[b][o], __ATOMIC_RELAXED));
	if (idem_pg == NULL || (f = open_memstream(&text, &len)) == NULL)
		return;
	pgstore_metrics(idem_pg, f);
	fclose(f);
	evbuffer_add(out, text, len);
	free(text);
}
