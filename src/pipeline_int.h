/* pipeline_int: what the pipeline's own files share: pipeline.c (messages
 * through the hooks) and pipeline_surplus.c (deliveries kept past a
 * consumer's prefetch, let go as the client settles). */
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

#endif
