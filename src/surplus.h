/* surplus: deliveries a channel's consumer receives from the broker beyond
 * the client's prefetch. For a consumer whose queue a hook does store work
 * for (idempotency's claims), the proxy asks the broker for more than the
 * client asked for (surplus_prefetch), so that work runs while the client
 * is busy with earlier deliveries; what would put the client past its
 * prefetch waits here, in order, until the client settles enough. A leaf:
 * it counts and keeps; the pipeline delivers what it hands back. */
#ifndef ACEMQ_SURPLUS_H
#define ACEMQ_SURPLUS_H

#include "list.h"

#include <stddef.h>
#include <stdint.h>

/* At most this many deliveries asked for beyond a consumer's prefetch. */
#define SURPLUS_EXTRA_MAX 1000
/* At most this many bytes kept on a channel: past it, what would be kept
 * goes to the client, past its prefetch (large messages), rather than
 * the proxy holding many of them. */
#define SURPLUS_BYTES_MAX (16u << 20)

enum { SURPLUS_NOW = 0, SURPLUS_KEPT = 1, SURPLUS_FULL = 2 };

struct surplus_consumer;

/* A channel's consumers with a surplus (NULL in a channel without any). */
struct surplus {
	uint16_t channel;
	struct surplus_consumer *c;
	int n;
	struct list due;  /* in the pipeline's list: room opened, not yet used */
	struct list kept; /* in the pipeline's list: keeps deliveries (timed) */
	size_t bytes;     /* kept, over its consumers */
};

/* Below this prefetch a consumer is taken for a work queue's (fair
 * dispatch among consumers, long handlers: a delivery kept behind a busy
 * consumer would wait while another is idle): nothing is asked ahead for
 * it unless its rule says how much. From it on, a throughput consumer's. */
#define SURPLUS_AUTO_MIN 100

/* How many to ask for beyond a client's prefetch when its rule does not
 * say: SURPLUS_EXTRA_MAX from a prefetch of SURPLUS_AUTO_MIN on (what a
 * consumer at full speed gets through while a claim and a confirm are made
 * durable, with room to spare), none below it. */
uint16_t surplus_auto(uint16_t prefetch);
/* What to ask the broker for: the client's prefetch and extra, bounded. */
uint16_t surplus_prefetch(uint16_t prefetch, uint16_t extra);

/* A consumer of channel whose broker prefetch is surplus_prefetch(limit):
 * 0, or -1 (out of memory: it then has no surplus kept, and the client
 * may get up to the broker's prefetch). *sp is made on first use. */
int surplus_add(struct surplus **sp, uint16_t channel, const void *tag, size_t len,
		uint16_t limit);
/* A delivery of size bytes for consumer tag: SURPLUS_NOW when it goes to
 * the client now (counted against the client's prefetch until
 * surplus_settled), SURPLUS_KEPT when it waits here (msg kept until
 * surplus_next or a drop), SURPLUS_FULL when it may not wait (the channel
 * keeps SURPLUS_BYTES_MAX): what waits for its consumer is then let go
 * (surplus_next) and it is admitted again with now. A consumer with no
 * surplus is always SURPLUS_NOW. now: it cannot wait (a streamed body, or
 * full), and what waited for its consumer went first. */
int surplus_admit(struct surplus *s, const void *tag, size_t len, uint64_t broker_tag,
		  void *msg, size_t size, int now);
/* The client settled (or has sent its settle of) broker_tag: its consumer
 * has room for one more. 1 when a waiting delivery may now go. Once per
 * delivery; a tag not counted here is ignored. */
int surplus_settled(struct surplus *s, uint64_t broker_tag);
/* The next delivery that may go to the client (counted), and its broker
 * tag; NULL when none. */
void *surplus_next(struct surplus *s, uint64_t *broker_tag);
/* The consumer is cancelled: what waits for it may all go (surplus_next),
 * after which it is forgotten. */
void surplus_cancel(struct surplus *s, const void *tag, size_t len);
/* Everything waiting for consumer tag may go (surplus_next), room or not. */
void surplus_drain(struct surplus *s, const void *tag, size_t len);
/* Deliveries kept here, over every consumer. */
size_t surplus_waiting(const struct surplus *s);
/* fn for each delivery kept here (it must not change s). */
void surplus_each(struct surplus *s, void (*fn)(void *arg, void *msg, uint64_t broker_tag),
		  void *arg);
/* basic.recover: the broker redelivers everything unsettled: what waits is
 * dropped and nothing is counted at the client any more. */
void surplus_recover(struct surplus *s, void (*drop)(void *msg));
/* The channel is gone: everything dropped, s freed (NULL is fine). */
void surplus_free(struct surplus *s, void (*drop)(void *msg));

#endif
