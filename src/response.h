/* response: the methods a broker sends on a channel that the proxy reads:
 * deliveries, get-oks and returns for the pipeline, publisher confirms,
 * consumers confirmed and cancelled, a channel's close-ok. */
#ifndef ACEMQ_RESPONSE_H
#define ACEMQ_RESPONSE_H

#include <amqp.h>

struct session;
struct leg;
struct channel;
struct frame_info;

/* A decoded method from the broker on channel ch (not 0). RELAY_*. */
int response_method(struct session *s, struct leg *from, const struct frame_info *fi,
		    struct channel *ch, amqp_method_number_t id, void *m);

#endif
