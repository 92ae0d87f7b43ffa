/* dedup_publish: a publish whose deduplication header value was already
 * published within the window is answered by the proxy, not forwarded. */
#include "dedup_publish.h"

void dedup_publish_register(void)
{
}
