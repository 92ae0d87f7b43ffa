/* relay: the frames between a session's two legs: scanning, classifying
 * (moved untouched, or read), the pump that moves runs of untouched frames
 * without copying, messages assembled for the pipeline, and the channels
 * the proxy closes itself. */
#ifndef ACEMQ_RELAY_H
#define ACEMQ_RELAY_H

#include "channel.h"
#include "pipeline.h"

#include <amqp.h>
#include <stddef.h>
#include <stdint.h>

struct session;
struct leg;
struct frame_info;

/* What a method's reader did with the frame at the front of the input. */
enum {
	RELAY_CLOSED = -1, /* the session is closing or gone */
	RELAY_FORWARD = 0, /* nothing: the frame goes on as it is */
	RELAY_DONE = 1,    /* consumed, rewritten or forwarded already */
	RELAY_WAIT = 2,    /* left in the input: the leg is held, it is read again */
};

/* Move every complete frame from one leg towards the other. 0, or -1 when
 * the session is gone. */
int relay_pump(struct session *s, struct leg *from);
/* Forward len bytes at the front of from's input, unchanged. */
void relay_forward(struct session *s, struct leg *from, size_t len);
/* A content method (publish, deliver, get-ok, return): assembled for the
 * hooks that want it, or forwarded with its tag or confirm number mapped.
 * RELAY_DONE or RELAY_CLOSED. */
int relay_content_method(struct session *s, struct leg *from, struct channel *ch,
			 const struct frame_info *fi, amqp_method_number_t id, void *decoded);
/* For hooks that batch store work (pipeline_lookahead). */
void relay_lookahead(struct session *s, enum chan_dir from, struct pipeline_mark *mark,
		     int (*fn)(void *arg, const struct frame_info *fi, const uint8_t *payload,
			       size_t len),
		     void *arg);

#endif
