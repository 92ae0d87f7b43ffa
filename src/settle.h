/* settle: the client's acks, nacks and rejects, and the broker's publisher
 * confirms, translated between the client's numbering and the broker's. */
#ifndef ACEMQ_SETTLE_H
#define ACEMQ_SETTLE_H

#include <amqp.h>
#include <stddef.h>
#include <stdint.h>

struct pipeline;
struct channel;

/* A client's basic.ack, basic.nack or basic.reject (decoded) on a channel
 * whose delivery tags are mapped: the broker's tags go upstream. Returns 0,
 * or -1 for a tag the client was never given, with the broker's words for
 * it in why: the caller closes the channel (406), as the broker would. */
int settle_client(struct pipeline *p, struct channel *ch, amqp_method_number_t id,
		  void *decoded, char *why, size_t whylen);
/* The broker's basic.ack or basic.nack of publishes on a channel whose
 * confirms are mapped: the client's sequence numbers go to the client.
 * Returns 0, or -1 when the broker confirmed a sequence number it was
 * never given (the caller logs it). */
int settle_broker_confirm(struct pipeline *p, struct channel *ch, amqp_method_number_t id,
			  void *decoded);
/* A held confirm (confirmmap_hold) is let go: if the broker answered it,
 * its client now hears the answer. */
void settle_confirm_release(struct pipeline *p, struct channel *ch, uint64_t broker_seq);

#endif
