/* pipeline_int: what the pipeline's own files share: pipeline.c (messages
 * through the hooks), pipeline_surplus.c (deliveries kept past a
 * consumer's prefetch, let go as the client settles) and
 * pipeline_stream.c (bodies a hook streams to the client). */
#ifndef ACEMQ_PIPELINE_INT_H
#define ACEMQ_PIPELINE_INT_H

#include "pipeline.h"

/* A delivery goes to the client with its client-side tag; m is freed. */
int pipeline_deliver_now(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
/* A delivery about to go to the client: 0 when it goes now, 1 when it is
 * kept (its consumer is at its prefetch), -1 when it could not be. */
int pipeline_surplus_admit(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
/* A delivery whose body is streamed goes now: what was kept for its
 * consumer goes first. */
void pipeline_surplus_stream(struct pipeline *p, struct channel *ch, struct pipe_msg *m);

/* The pipeline goes: its kept deliveries' timer and list. */
void pipeline_surplus_fini(struct pipeline *p);
/* The monotonic clock messages are timed by, in microseconds. */
uint64_t pipeline_now_us(void);
/* Where a delivery's or get-ok's tag is (NULL: neither). */
uint64_t *pipeline_tag_of(struct pipe_msg *m);
/* The leg a message came from: its later frames wait while it waits. */
enum chan_dir pipeline_dir(const struct pipe_msg *m);
/* Rewrite-only hooks see a message that waited, once it is final. */
void pipeline_rewrite(struct pipeline *p, struct channel *ch, struct pipe_msg *m);

#endif
