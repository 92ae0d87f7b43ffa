/* tagmap: translate delivery tags and confirm sequence numbers between a
 * client's view and the broker's when the proxy swallows, holds or answers. */
#ifndef ACEMQ_TAGMAP_H
#define ACEMQ_TAGMAP_H

#include <stddef.h>
#include <stdint.h>

/* Pairs (client, broker), both strictly ascending; removed pairs are
 * tombstoned (broker == 0) and trimmed from the front. */
struct tagmap_pairs {
	uint64_t (*v)[2];
	size_t head, len, cap;
};

struct tagmap {
	struct tagmap_pairs out; /* deliveries the client must still settle */
	uint64_t *held;          /* broker tags the proxy holds, ascending */
	size_t nheld, capheld;
	uint64_t next_client; /* last client delivery tag issued */
	uint64_t top_broker;  /* the highest broker tag in out */
	int disordered;       /* out's broker side does not ascend (a kept
			       * delivery went after a later one) */
};

/* A forwarded publish whose client confirm also waits for the proxy (its
 * record written): the broker's answer is kept here until it is released. */
struct confirmhold {
	uint64_t broker, client;
	int outcome; /* CONFIRM_* */
};

enum { CONFIRM_NONE = 0, CONFIRM_ACKED = 1, CONFIRM_NACKED = 2 };

struct confirmmap {
	struct tagmap_pairs out;  /* forwarded publishes awaiting the broker */
	uint64_t next_client;     /* last client publish sequence number */
	uint64_t next_broker;     /* last broker publish sequence number */
	struct confirmhold *held; /* ascending by broker */
	size_t nheld, capheld;
};

/* Emit one broker-side (or client-side) settle: tag and multiple flag. */
typedef void (*tagmap_emit_fn)(void *arg, uint64_t tag, int multiple);

void tagmap_init(struct tagmap *tm);
void tagmap_reset(struct tagmap *tm);

/* A delivery goes to the client: returns its client tag; needs_ack says the
 * client will settle it (not no-ack). */
uint64_t tagmap_deliver(struct tagmap *tm, uint64_t broker_tag, int needs_ack);
/* The proxy keeps a delivery the broker still counts as unacked. */
int tagmap_hold(struct tagmap *tm, uint64_t broker_tag);
void tagmap_unhold(struct tagmap *tm, uint64_t broker_tag);
/* The client settles client_tag (multiple as in basic.ack/nack; tag 0 with
 * multiple means all). Emits the broker-side settles; -1 for an unknown tag. */
int tagmap_settle(struct tagmap *tm, uint64_t client_tag, int multiple, tagmap_emit_fn emit,
		  void *arg);
size_t tagmap_outstanding(const struct tagmap *tm);
/* The broker tags a settle of client_tag would cover, without settling:
 * fn for each; -1 for an unknown tag. */
int tagmap_covered(const struct tagmap *tm, uint64_t client_tag, int multiple,
		   void (*fn)(void *arg, uint64_t broker_tag), void *arg);

void confirmmap_init(struct confirmmap *cm);
void confirmmap_reset(struct confirmmap *cm);
/* A publish is forwarded: returns the client's sequence number for it. */
uint64_t confirmmap_forward(struct confirmmap *cm);
/* A publish is answered by the proxy: returns its client sequence number. */
uint64_t confirmmap_answer(struct confirmmap *cm);
/* The broker confirmed broker_seq (multiple as in basic.ack; acked 0 for a
 * nack): emits the client-side confirms, each held one kept back until it
 * is released. -1 if nothing matched. */
int confirmmap_settle(struct confirmmap *cm, uint64_t broker_seq, int multiple, int acked,
		      tagmap_emit_fn emit, void *arg);
/* The client's confirm of forwarded broker_seq waits for a release too.
 * 0, or -1 (not forwarded, already held, or out of memory). */
int confirmmap_hold(struct confirmmap *cm, uint64_t broker_seq);
/* Let a held confirm go: CONFIRM_NONE while the broker has not answered
 * (its confirm then goes as any other), else the broker's outcome, to be
 * sent now for *client; -1 if broker_seq is not held. */
int confirmmap_release(struct confirmmap *cm, uint64_t broker_seq, uint64_t *client);
/* Whether a forwarded publish still waits for the broker's answer or a
 * release. */
int confirmmap_pending(const struct confirmmap *cm);
/* The broker sequence numbers a confirm of broker_seq (multiple as in
 * basic.ack) covers, without settling: fn for each, in order. */
void confirmmap_covered(const struct confirmmap *cm, uint64_t broker_seq, int multiple,
			void (*fn)(void *arg, uint64_t broker_seq), void *arg);

#endif
