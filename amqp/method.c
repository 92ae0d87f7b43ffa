/* method: peek at, decode and re-encode method frames through rabbitmq-c's codec. */
#include "method.h"

#include "frame_scan.h"

#include "../src/debug.h"

#include <event2/buffer.h>
#include <string.h>

int method_has_content(amqp_method_number_t id)
{
	switch (id) {
	case AMQP_BASIC_PUBLISH_METHOD:
	case AMQP_BASIC_DELIVER_METHOD:
	case AMQP_BASIC_GET_OK_METHOD:
	case AMQP_BASIC_RETURN_METHOD:
		return 1;
	default:
		return 0;
	}
}

int method_decode(const uint8_t *payload, size_t len, amqp_pool_t *pool,
		  amqp_method_number_t *id, void **decoded)
{
	amqp_bytes_t args;

	if (len < 4)
		return AMQP_STATUS_BAD_AMQP_DATA;
	*id = METHOD_ID((payload[0] << 8) | payload[1], (payload[2] << 8) | payload[3]);
	args.bytes = (void *)(payload + 4);
	args.len = len - 4;
	return amqp_decode_method(*id, pool, args, decoded);
}

int method_decode_evbuffer(struct evbuffer *buf, size_t len, amqp_pool_t *pool,
			   amqp_method_number_t *id, void **decoded)
{
	unsigned char *p = evbuffer_pullup(buf, (ev_ssize_t)(FRAME_HEADER_SIZE + len));

	if (p == NULL)
		return AMQP_STATUS_BAD_AMQP_DATA;
	return method_decode(p + FRAME_HEADER_SIZE, len, pool, id, decoded);
}

int method_write(struct evbuffer *out, uint16_t channel, amqp_method_number_t id, void *decoded)
{
	static _Thread_local uint8_t scratch[METHOD_ENCODE_MAX];
	uint8_t *p = scratch;
	amqp_bytes_t args;
	int n;
	uint32_t size;

	args.bytes = p + FRAME_HEADER_SIZE + 4;
	args.len = sizeof(scratch) - FRAME_OVERHEAD - 4;
	n = amqp_encode_method(id, decoded, args);
	if (n < 0)
		return -1;
	size = (uint32_t)n + 4;
	ACEMQ_ASSERT(FRAME_OVERHEAD + (size_t)size <= sizeof(scratch));
	frame_scan_put_header(p, FRAME_METHOD, channel, size);
	p[7] = (uint8_t)(id >> 24);
	p[8] = (uint8_t)(id >> 16);
	p[9] = (uint8_t)(id >> 8);
	p[10] = (uint8_t)id;
	p[FRAME_HEADER_SIZE + size] = FRAME_END;
	return evbuffer_add(out, p, FRAME_OVERHEAD + size);
}

int method_write_connection_close(struct evbuffer *out, uint16_t code, const char *text,
				  uint16_t class_id, uint16_t method_id)
{
	amqp_connection_close_t m;

	m.reply_code = code;
	m.reply_text = amqp_cstring_bytes(text);
	m.class_id = class_id;
	m.method_id = method_id;
	return method_write(out, 0, AMQP_CONNECTION_CLOSE_METHOD, &m);
}

int method_write_channel_close(struct evbuffer *out, uint16_t channel, uint16_t code,
			       const char *text, uint16_t class_id, uint16_t method_id)
{
	amqp_channel_close_t m;

	m.reply_code = code;
	m.reply_text = amqp_cstring_bytes(text);
	m.class_id = class_id;
	m.method_id = method_id;
	return method_write(out, channel, AMQP_CHANNEL_CLOSE_METHOD, &m);
}

int method_write_basic_ack(struct evbuffer *out, uint16_t channel, uint64_t tag, int multiple)
{
	amqp_basic_ack_t m;

	m.delivery_tag = tag;
	m.multiple = multiple ? 1 : 0;
	return method_write(out, channel, AMQP_BASIC_ACK_METHOD, &m);
}
