/* fuzz_table: decode a field table; what decodes must encode again. */
#include "amqp/content.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	amqp_pool_t pool;
	amqp_table_t table;
	amqp_bytes_t in = {size, (void *)data};
	size_t off = 0, off2 = 0;
	uint8_t *buf;

	init_amqp_pool(&pool, 4096);
	if (amqp_decode_table(in, &pool, &table, &off) == 0) {
		amqp_bytes_t outb;

		buf = malloc(size * 2 + 64);
		outb.bytes = buf;
		outb.len = size * 2 + 64;
		if (buf && amqp_encode_table(outb, &table, &off2) != 0)
			abort();
		free(buf);
	}
	empty_amqp_pool(&pool);
	return 0;
}
