/* method: peek at, decode and re-encode method frames through rabbitmq-c's codec. */
#ifndef ACEMQ_METHOD_H
#define ACEMQ_METHOD_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

#define METHOD_ID(c, m)   ((amqp_method_number_t)(((uint32_t)(c) << 16) | (m)))
#define METHOD_ENCODE_MAX 131072u /* largest method frame the proxy writes */

/* Whether the method is followed by a content header and bodies. */
int method_has_content(amqp_method_number_t id);

/* Decode a method frame's payload (class, method, arguments). Returns 0 or
 * an amqp_status_enum error. Decoded data lives in pool. */
int method_decode(const uint8_t *payload, size_t len, amqp_pool_t *pool,
		  amqp_method_number_t *id, void **decoded);

/* Decode a method frame at the front of buf (frame of payload size len). */
int method_decode_evbuffer(struct evbuffer *buf, size_t len, amqp_pool_t *pool,
			   amqp_method_number_t *id, void **decoded);

/* Append a method frame to out. Returns 0 or -1 (too large, or bad method). */
int method_write(struct evbuffer *out, uint16_t channel, amqp_method_number_t id,
		 void *decoded);

/* Convenience writers for the methods the proxy originates. */
int method_write_connection_close(struct evbuffer *out, uint16_t code, const char *text,
				  uint16_t class_id, uint16_t method_id);
int method_write_channel_close(struct evbuffer *out, uint16_t channel, uint16_t code,
			       const char *text, uint16_t class_id, uint16_t method_id);
int method_write_basic_ack(struct evbuffer *out, uint16_t channel, uint64_t tag, int multiple);

#endif
