/* fuzz_method: decode a method frame payload with rabbitmq-c's codec through
 * the proxy's wrapper; what decodes must re-encode. */
#include "amqp/frame_scan.h"
#include "amqp/method.h"

#include <event2/buffer.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	amqp_pool_t pool;
	amqp_method_number_t id;
	void *m;

	init_amqp_pool(&pool, 4096);
	if (method_decode(data, size, &pool, &id, &m) == 0) {
		struct evbuffer *out = evbuffer_new();

		if (size + 64 < METHOD_ENCODE_MAX && method_write(out, 1, id, m) != 0)
			abort();
		evbuffer_free(out);
	}
	empty_amqp_pool(&pool);
	return 0;
}
