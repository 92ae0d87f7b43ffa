/* dedup_publish: a publish whose deduplication header value was already
 * published within the window is answered by the proxy, not forwarded. */
#ifndef ACEMQ_DEDUP_PUBLISH_H
#define ACEMQ_DEDUP_PUBLISH_H

struct state;

/* The state layer the windows live in (NULL: every publish is forwarded,
 * counted as a store error). */
void dedup_publish_init(struct state *st);
void dedup_publish_register(void);

#endif
