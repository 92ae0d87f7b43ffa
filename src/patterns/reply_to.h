/* reply_to: make the acemq-reply-to header and the reply-to property agree. */
#ifndef ACEMQ_REPLY_TO_H
#define ACEMQ_REPLY_TO_H

#include <amqp.h>
#include <amqp_framing.h>

#define REPLY_TO_HEADER "acemq-reply-to"
#define REPLY_TO_DIRECT "amq.rabbitmq.reply-to"

enum reply_to_change {
	REPLY_TO_SAME = 0,           /* nothing to do */
	REPLY_TO_HEADER_ADDED = 1,   /* the header was copied from the property */
	REPLY_TO_PROPERTY_SET = 2,   /* the property was copied from the header */
	REPLY_TO_MISMATCH = 4,       /* both present and different: header won */
	REPLY_TO_HEADER_DROPPED = 8, /* a bare direct reply-to name left the header */
};

/* Normalise props in place (storage from pool). publish says which side of
 * the broker the message is on: before it (a publish) or after (a
 * delivery). Returns a mask of reply_to_change, or -1 when out of memory. */
int reply_to_normalise(amqp_basic_properties_t *props, amqp_pool_t *pool, int publish);

void reply_to_register(void);

#endif
