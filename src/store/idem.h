/* idem: idempotency keys per vhost and queue, and publish-dedup windows
 * per vhost and exchange, in the state layer: claim, confirm and forget
 * under a lease, with the three answers the AceMQ libraries share
 * (CLAIMED, DUPLICATE, IN_PROGRESS). */
#ifndef ACEMQ_IDEM_H
#define ACEMQ_IDEM_H

#include "state.h"

#include <stddef.h>
#include <stdint.h>

#define IDEM_KEY_MAX         512 /* queue (or exchange), a NUL, and the key */
#define IDEM_DEDUP_VALUE_MAX 255 /* longer publish-dedup values are kept hashed */

enum idem_answer {
	IDEM_CLAIMED,     /* first time (or the last claim's lease ran out): run it */
	IDEM_DUPLICATE,   /* confirmed within the retention: acknowledge, do not run */
	IDEM_IN_PROGRESS, /* claimed by someone else under a live lease */
	IDEM_DONE,        /* confirm or forget: applied */
	IDEM_NOT_OWNER,   /* confirm or forget: the claim is not this owner's (left alone) */
};

enum idem_op { IDEM_CLAIM, IDEM_CONFIRM, IDEM_FORGET };

/* The record: state, until (ms since the epoch: the lease's end, or the
 * retention's), and the owner of a claim. */
struct idem_record {
	uint8_t state; /* 1 claimed, 2 confirmed */
	uint8_t pad[7];
	uint64_t until_ms;
	uint64_t owner[2];
};

/* One operation; done runs on the worker w with answer (and w.rc). */
struct idem_req {
	struct state_write w; /* first: its call is the completion */
	struct state_op op;
	enum idem_op what;
	uint64_t now_ms, span_ms; /* lease (claim) or retention (confirm) */
	uint64_t owner[2];
	enum idem_answer answer;
	int lease_expired;      /* CLAIMED over a claim whose lease ran out */
	struct idem_record rec; /* the value written */
	char db[300];
	char key[IDEM_KEY_MAX];
	size_t klen;
};

/* Fill r for an operation on (vhost, queue, key); the caller sets
 * r->w.call.fn and r->w.w, then state_submit(st, &r->w). Returns -1 when
 * queue and key are too long to be a key. */
int idem_prepare(struct idem_req *r, enum idem_op what, const char *vhost, const char *queue,
		 const void *key, size_t klen, const uint64_t owner[2], uint64_t now_ms,
		 uint64_t span_ms);

/* The decision itself (exposed for tests): from the current record (or
 * NULL), what to answer and whether to write r->rec. */
enum state_decision idem_decide(struct idem_req *r, const struct idem_record *cur);

/* Blocking (janitor): remove records whose time has passed. */
long idem_purge(struct state *st, const char *vhost, uint64_t now_ms);

/* The same operations on publish-dedup windows: a value published to an
 * exchange of vhost, in the vhost's database of its own ("dedup/VHOST",
 * key "EXCHANGE\0VALUE"; a value longer than IDEM_DEDUP_VALUE_MAX is kept
 * as its SHA-256). A claim is the reservation of a publish in flight
 * (span: its lease), a confirm remembers the value for the window (span),
 * a forget gives up the owner's own reservation. Returns -1 for an empty
 * value or an exchange name longer than 255 bytes. */
int idem_dedup_prepare(struct idem_req *r, enum idem_op what, const char *vhost,
		       const void *exchange, size_t elen, const void *value, size_t vlen,
		       const uint64_t owner[2], uint64_t now_ms, uint64_t span_ms);
long idem_dedup_purge(struct state *st, const char *vhost, uint64_t now_ms);

/* The backends: the LMDB state of this host, or PostgreSQL (store/pgstore.h)
 * when the setting postgres_url is set. The patterns hand every operation to
 * idem_submit and do not know which backend answers. */
struct pgstore;
struct rules;
struct evbuffer;
void idem_set_postgresql(struct pgstore *pg);
struct pgstore *idem_postgresql(void);
/* Queue r, prepared, on st (postgresql 0) or on PostgreSQL; -1 when that
 * backend is not there (nothing queued). */
int idem_submit(struct state *st, int postgresql, struct idem_req *r);
/* Why the proxy is not ready as far as these backends go (NULL: ready): a
 * rule of r keeps its keys in PostgreSQL, which does not answer. */
const char *idem_unready(const struct rules *r);
/* Operations by backend, and PostgreSQL's own counters. */
void idem_metrics(struct evbuffer *out);

#endif
