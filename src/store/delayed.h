/* delayed: the records of delayed messages in the state layer, one per
 * publish the schedule pattern rewrote onto the ladder: listed in due
 * order, cancelled (the scheduler then drops the message), and removed
 * when the message is delivered or long past due. */
#ifndef ACEMQ_DELAYED_H
#define ACEMQ_DELAYED_H

#include "state.h"

#include <stddef.h>
#include <stdint.h>

/* A record's key: the due time (ms since the epoch, big-endian) and a
 * random nonce, so that the database's order is the due order. Its id is
 * the key in 32 lowercase hex digits (the ladder's LADDER_H_ID header). */
#define DELAYED_KEY_LEN 16
#define DELAYED_ID_LEN  32
#define DELAYED_STR_MAX 255 /* exchange, routing key, message id: shortstr */

enum delayed_status { DELAYED_PENDING = 1, DELAYED_CANCELLED = 2 };

/* A record as read. */
struct delayed_entry {
	uint8_t key[DELAYED_KEY_LEN];
	int64_t due_at;
	enum delayed_status status;
	uint64_t size;
	const char *exchange, *routing_key, *message_id; /* into the read */
	size_t elen, rlen, mlen;
	int has_message_id;
};

/* Set the state layer the records live in (NULL: none are kept) and how
 * long past its due time a record stays at most. */
void delayed_init(struct state *st, int64_t margin_ms);
struct state *delayed_state(void);
int64_t delayed_margin_ms(void);

void delayed_key(uint8_t key[DELAYED_KEY_LEN], int64_t due_at, uint64_t nonce);
int64_t delayed_key_due(const uint8_t key[DELAYED_KEY_LEN]);
uint64_t delayed_key_nonce(const uint8_t key[DELAYED_KEY_LEN]);
/* A fresh nonce: random, never 0. */
uint64_t delayed_nonce(void);
/* The id of key, NUL-terminated. */
void delayed_id(char out[DELAYED_ID_LEN + 1], const uint8_t key[DELAYED_KEY_LEN]);
/* The key of an id: 0, or -1 when it is not one. */
int delayed_parse_id(const void *id, size_t len, uint8_t key[DELAYED_KEY_LEN]);

/* The publish side's write of a new record; the caller sets w.call.fn,
 * w.w and owner, then state_submit(delayed_state(), &r->w). */
struct delayed_rec {
	struct state_write w; /* first: its call is the completion */
	struct state_op op;
	void *owner;
	char db[300];
	uint8_t key[DELAYED_KEY_LEN];
	size_t vlen;
	uint8_t val[16 + 3 * DELAYED_STR_MAX];
};
/* Fill r. Strings longer than DELAYED_STR_MAX are cut. */
void delayed_rec_prepare(struct delayed_rec *r, const char *vhost,
			 const uint8_t key[DELAYED_KEY_LEN], const void *exchange, size_t elen,
			 const void *routing_key, size_t rlen, const void *message_id,
			 size_t mlen, int has_message_id, uint64_t size);

/* From a thread that may read (never a worker's loop): 1 the record is
 * there and cancelled, 0 otherwise (pending, absent, unreadable). */
int delayed_cancelled(const char *vhost, const uint8_t key[DELAYED_KEY_LEN]);
/* From any thread: remove the record, without waiting. */
void delayed_forget(const char *vhost, const uint8_t key[DELAYED_KEY_LEN]);

/* From a thread that may block: walk vhost's records in due order from
 * after (exclusive; NULL: the start) while fn returns 0. A state rc. */
int delayed_scan(const char *vhost, const uint8_t *after,
		 int (*fn)(void *arg, const struct delayed_entry *e), void *arg);
/* Cancel one pending record: STATE_OK (cancelled now, or already),
 * STATE_NOTFOUND, or an error. */
int delayed_cancel(const char *vhost, const uint8_t key[DELAYED_KEY_LEN]);
/* Cancel every pending record for exchange (and routing_key, unless
 * NULL): how many, or -1 when the state could not be read or written. */
long delayed_cancel_target(const char *vhost, const char *exchange, const char *routing_key);
/* Janitor: remove the records due before now minus the margin. */
long delayed_purge(const char *vhost, int64_t now_ms);

#endif
