/* content: content header frames, basic properties and body re-framing. */
#include "content.h"

#include "frame_scan.h"

#include "../src/debug.h"

#include <event2/buffer.h>
#include <string.h>

#define CONTENT_PROPS_MAX 131072u

void content_header_peek(const uint8_t *payload, uint16_t *class_id, uint64_t *body_size)
{
	uint64_t n = 0;
	int i;

	*class_id = (uint16_t)((payload[0] << 8) | payload[1]);
	for (i = 4; i < 12; i++)
		n = (n << 8) | payload[i];
	*body_size = n;
}

int content_props_decode(const uint8_t *payload, size_t len, amqp_pool_t *pool,
			 amqp_basic_properties_t **props)
{
	amqp_bytes_t enc;
	uint16_t class_id;
	uint64_t size;

	if (len < CONTENT_HEADER_FIXED)
		return AMQP_STATUS_BAD_AMQP_DATA;
	content_header_peek(payload, &class_id, &size);
	if (class_id != AMQP_BASIC_CLASS)
		return AMQP_STATUS_BAD_AMQP_DATA;
	enc.bytes = (void *)(payload + CONTENT_HEADER_FIXED);
	enc.len = len - CONTENT_HEADER_FIXED;
	return amqp_decode_properties(class_id, pool, enc, (void **)props);
}

int content_header_write(struct evbuffer *out, uint16_t channel, uint16_t class_id,
			 uint64_t body_size, amqp_basic_properties_t *props)
{
	static _Thread_local uint8_t scratch[CONTENT_PROPS_MAX];
	uint8_t *p = scratch;
	uint8_t *h = p + FRAME_HEADER_SIZE;
	amqp_bytes_t enc;
	uint32_t size;
	int n, i;

	enc.bytes = h + CONTENT_HEADER_FIXED;
	enc.len = sizeof(scratch) - FRAME_OVERHEAD - CONTENT_HEADER_FIXED;
	n = amqp_encode_properties(class_id, props, enc);
	if (n < 0)
		return -1;
	size = (uint32_t)n + CONTENT_HEADER_FIXED;
	ACEMQ_ASSERT(FRAME_OVERHEAD + (size_t)size <= sizeof(scratch));
	frame_scan_put_header(p, FRAME_HEADER, channel, size);
	h[0] = (uint8_t)(class_id >> 8);
	h[1] = (uint8_t)class_id;
	h[2] = 0;
	h[3] = 0;
	for (i = 0; i < 8; i++)
		h[4 + i] = (uint8_t)(body_size >> (56 - 8 * i));
	h[size] = FRAME_END;
	return evbuffer_add(out, p, FRAME_OVERHEAD + size);
}

int content_body_write(struct evbuffer *out, uint16_t channel, struct evbuffer *body,
		       uint32_t frame_max)
{
	uint32_t chunk =
	    frame_max > FRAME_OVERHEAD ? frame_max - FRAME_OVERHEAD : 131072u - FRAME_OVERHEAD;
	uint8_t head[FRAME_HEADER_SIZE];
	const uint8_t end = FRAME_END;

	ACEMQ_ASSERT(chunk > 0);
	while (evbuffer_get_length(body) > 0) {
		size_t n = evbuffer_get_length(body);

		if (n > chunk)
			n = chunk;
		frame_scan_put_header(head, FRAME_BODY, channel, (uint32_t)n);
		if (evbuffer_add(out, head, sizeof(head)) != 0 ||
		    evbuffer_remove_buffer(body, out, n) != (int)n ||
		    evbuffer_add(out, &end, 1) != 0)
			return -1;
	}
	return 0;
}
