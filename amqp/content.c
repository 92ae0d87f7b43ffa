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

#define CONTENT_FLAG_CONTENT_TYPE     0x8000u
#define CONTENT_FLAG_CONTENT_ENCODING 0x4000u
#define CONTENT_FLAG_HEADERS          0x2000u
#define CONTENT_FLAG_CONTINUED        0x0001u

static uint32_t content_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void content_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Skip a short string at *pos of a payload of len bytes. */
static int content_skip_shortstr(const uint8_t *payload, size_t len, size_t *pos)
{
	if (*pos >= len || len - *pos - 1 < payload[*pos])
		return -1;
	*pos += 1u + payload[*pos];
	return 0;
}

#define CONTENT_TABLE_DEPTH 16

static int content_value_valid(const uint8_t *p, size_t len, size_t *pos, int depth);

/* Whether p holds exactly a sequence of table entries (array ones have no
 * key): each read inside len, nothing left over. A table whose last entry
 * runs past its length is one a lenient decoder reads differently once
 * bytes follow it, so only an exact one is spliced. */
static int content_entries_valid(const uint8_t *p, size_t len, int keyed, int depth)
{
	size_t pos = 0;

	if (depth > CONTENT_TABLE_DEPTH)
		return 0;
	while (pos < len) {
		if (keyed && content_skip_shortstr(p, len, &pos) != 0)
			return 0;
		if (!content_value_valid(p, len, &pos, depth))
			return 0;
	}
	return 1;
}

static int content_value_valid(const uint8_t *p, size_t len, size_t *pos, int depth)
{
	size_t n;
	uint8_t kind;

	if (*pos >= len)
		return 0;
	kind = p[(*pos)++];
	switch (kind) {
	case 't':
	case 'b':
	case 'B':
		n = 1;
		break;
	case 's':
	case 'u':
		n = 2;
		break;
	case 'I':
	case 'i':
	case 'f':
		n = 4;
		break;
	case 'D':
		n = 5;
		break;
	case 'l':
	case 'L':
	case 'd':
	case 'T':
		n = 8;
		break;
	case 'V':
		n = 0;
		break;
	case 'S':
	case 'x':
	case 'F':
	case 'A':
		if (len - *pos < 4)
			return 0;
		n = content_be32(p + *pos);
		*pos += 4;
		if (len - *pos < n)
			return 0;
		if ((kind == 'F' || kind == 'A') &&
		    !content_entries_valid(p + *pos, n, kind == 'F', depth + 1))
			return 0;
		break;
	default:
		return 0;
	}
	if (len - *pos < n)
		return 0;
	*pos += n;
	return 1;
}

int content_header_append_headers(struct evbuffer *out, const uint8_t *frame, size_t len,
				  const uint8_t *entries, size_t elen, size_t max_frame)
{
	const uint8_t *payload = frame + FRAME_HEADER_SIZE;
	size_t plen, pos = CONTENT_HEADER_FIXED + 2, table_end, added;
	uint32_t table_len = 0;
	uint16_t flags;
	uint8_t head[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 2], prefix[4];
	const uint8_t end = FRAME_END;
	int had_table;

	if (len < FRAME_OVERHEAD + CONTENT_HEADER_FIXED + 2 || frame[0] != FRAME_HEADER ||
	    frame[len - 1] != FRAME_END || content_be32(frame + 3) != len - FRAME_OVERHEAD)
		return -1;
	plen = len - FRAME_OVERHEAD;
	flags =
	    (uint16_t)(payload[CONTENT_HEADER_FIXED] << 8 | payload[CONTENT_HEADER_FIXED + 1]);
	if (flags & CONTENT_FLAG_CONTINUED)
		return -1;
	if ((flags & CONTENT_FLAG_CONTENT_TYPE) &&
	    content_skip_shortstr(payload, plen, &pos) != 0)
		return -1;
	if ((flags & CONTENT_FLAG_CONTENT_ENCODING) &&
	    content_skip_shortstr(payload, plen, &pos) != 0)
		return -1;
	/* pos: where the headers table is, or would be. */
	had_table = (flags & CONTENT_FLAG_HEADERS) != 0;
	if (had_table) {
		if (plen - pos < 4)
			return -1;
		table_len = content_be32(payload + pos);
		if (plen - pos - 4 < table_len)
			return -1;
		table_end = pos + 4 + table_len;
		if (!content_entries_valid(payload + pos + 4, table_len, 1, 0))
			return -1;
	} else {
		table_end = pos;
	}
	added = elen + (had_table ? 0 : 4);
	if (elen > UINT32_MAX - table_len || len > max_frame || max_frame - len < added)
		return -1;
	memcpy(head, frame, sizeof(head));
	content_put_be32(head + 3, (uint32_t)(plen + added));
	flags |= CONTENT_FLAG_HEADERS;
	head[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED] = (uint8_t)(flags >> 8);
	head[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 1] = (uint8_t)flags;
	content_put_be32(prefix, table_len + (uint32_t)elen);
	/* The frame's header and flags, what precedes the table, the table's
	 * new length and its old entries, the new entries, the rest. */
	if (evbuffer_add(out, head, sizeof(head)) != 0 ||
	    evbuffer_add(out, payload + CONTENT_HEADER_FIXED + 2,
			 pos - (CONTENT_HEADER_FIXED + 2)) != 0 ||
	    evbuffer_add(out, prefix, sizeof(prefix)) != 0 ||
	    (had_table && evbuffer_add(out, payload + pos + 4, table_len) != 0) ||
	    evbuffer_add(out, entries, elen) != 0 ||
	    evbuffer_add(out, payload + table_end, plen - table_end) != 0 ||
	    evbuffer_add(out, &end, 1) != 0)
		return -1;
	return 0;
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
