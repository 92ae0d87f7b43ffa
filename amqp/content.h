/* content: content header frames, basic properties and body re-framing. */
#ifndef ACEMQ_CONTENT_H
#define ACEMQ_CONTENT_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

#define CONTENT_HEADER_FIXED 12u /* class(2) weight(2) body size(8) */

/* Read class and body size from a content header payload (len >= 12). */
void content_header_peek(const uint8_t *payload, uint16_t *class_id, uint64_t *body_size);

/* Decode the properties of a content header payload. 0 or amqp error. */
int content_props_decode(const uint8_t *payload, size_t len, amqp_pool_t *pool,
			 amqp_basic_properties_t **props);

/* Append a content header frame for props. 0 or -1. */
int content_header_write(struct evbuffer *out, uint16_t channel, uint16_t class_id,
			 uint64_t body_size, amqp_basic_properties_t *props);

/* Append encoded table entries (entries, elen bytes: each a key and a
 * typed value, no length prefix) to the headers table of an encoded basic
 * content header frame (frame, len: the whole frame), making the table if
 * the frame has none, and write the frame so edited to out. Everything
 * else stays byte for byte. 0; -1 when this frame cannot be edited so (a
 * malformed one, property flags continued, the edited frame past
 * max_frame): nothing was written (out of memory: -1, out is left as the
 * caller's error path finds it). */
int content_header_append_headers(struct evbuffer *out, const uint8_t *frame, size_t len,
				  const uint8_t *entries, size_t elen, size_t max_frame);

/* Move body bytes from body into out as body frames of at most frame_max
 * bytes each (frame_max 0 means no limit beyond the codec's). */
int content_body_write(struct evbuffer *out, uint16_t channel, struct evbuffer *body,
		       uint32_t frame_max);

/* rabbitmq-c exports its table codec without declaring it in a public
 * header; these are its signatures. */
int amqp_decode_table(amqp_bytes_t encoded, amqp_pool_t *pool, amqp_table_t *output,
		      size_t *offset);
int amqp_encode_table(amqp_bytes_t encoded, amqp_table_t *input, size_t *offset);

#endif
