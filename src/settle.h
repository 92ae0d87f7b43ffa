/* settle: the client's acks, nacks and rejects, and the broker's publisher
 * confirms, translated between the client's numbering and the broker's. */
#ifndef ACEMQ_SETTLE_H
#define ACEMQ_SETTLE_H

#include <amqp.h>

struct session;
struct channel;

/* A client's basic.ack, basic.nack or basic.reject (decoded) on a channel
 * whose delivery tags are mapped: the broker's tags go upstream; a tag the
 * client was never given is a channel error, as at the broker. Returns 0. */
int settle_client(struct session *s, struct channel *ch, amqp_method_number_t id,
		  void *decoded);
/* The broker's basic.ack or basic.nack of publishes on a channel whose
 * confirms are mapped: the client's sequence numbers go to the client. */
void settle_broker_confirm(struct session *s, struct channel *ch, amqp_method_number_t id,
			   void *decoded);

#endif
