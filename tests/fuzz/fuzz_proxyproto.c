/* fuzz_proxyproto: read a PROXY protocol header from any bytes; a header
 * read must fit what was given, and what is written must read back. */
#include "amqp/proxyproto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proxyproto_addr a, b;
	uint8_t out[PROXYPROTO_V2_MAX];
	size_t used = 0, n, used2;

	if (proxyproto_parse(data, size, &used, &a) != PROXYPROTO_OK)
		return 0;
	if (used == 0 || used > size)
		abort();
	n = proxyproto_write_v2(out, a.local ? NULL : (struct sockaddr *)&a.src,
				a.local ? NULL : (struct sockaddr *)&a.dst);
	if (proxyproto_parse(out, n, &used2, &b) != PROXYPROTO_OK || used2 != n ||
	    b.local != a.local || (!a.local && memcmp(&a.src, &b.src, a.srclen) != 0))
		abort();
	return 0;
}
