/* request: the methods a client sends on a channel that the proxy reads:
 * channel.open against max_channels, consumers and gets (whose deliveries'
 * tags it maps), publishes for the pipeline, and the client's settles. */
#ifndef ACEMQ_REQUEST_H
#define ACEMQ_REQUEST_H

#include <amqp.h>

struct session;
struct leg;
struct channel;
struct frame_info;

/* A decoded method from the client on channel ch (not 0). RELAY_*. */
int request_method(struct session *s, struct leg *from, const struct frame_info *fi,
		   struct channel *ch, amqp_method_number_t id, void *m);

#endif
