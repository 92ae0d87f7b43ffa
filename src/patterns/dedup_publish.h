/* dedup_publish: a publish whose deduplication header value was already
 * published within the window is answered by the proxy, not forwarded. */
#ifndef ACEMQ_DEDUP_PUBLISH_H
#define ACEMQ_DEDUP_PUBLISH_H

void dedup_publish_register(void);

#endif
