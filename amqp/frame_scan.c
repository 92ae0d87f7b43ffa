/* frame_scan: find, measure and validate AMQP 0-9-1 frames in a byte stream. */
#include "frame_scan.h"

#include "../src/debug.h"

#include <event2/buffer.h>
#include <string.h>

#define REPLY_FRAME_ERROR 501
#define PEEK_LEN          (FRAME_HEADER_SIZE + 12u) /* header and what frame_info keeps */

static uint16_t frame_scan_u16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t frame_scan_u32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
	       (uint32_t)p[3];
}

void frame_scan_put_header(uint8_t *p, uint8_t type, uint16_t channel, uint32_t size)
{
	p[0] = type;
	p[1] = (uint8_t)(channel >> 8);
	p[2] = (uint8_t)channel;
	p[3] = (uint8_t)(size >> 24);
	p[4] = (uint8_t)(size >> 16);
	p[5] = (uint8_t)(size >> 8);
	p[6] = (uint8_t)size;
}

static int frame_scan_fail(struct frame_info *fi, const char *why)
{
	fi->reply_code = REPLY_FRAME_ERROR;
	fi->error = why;
	return FRAME_SCAN_ERROR;
}

/* Check what the header (and, for methods, the first payload bytes) says.
 * have is how many bytes of p are valid, at least FRAME_HEADER_SIZE. */
static int frame_scan_head(const uint8_t *p, size_t have, uint32_t max_payload,
			   struct frame_info *fi)
{
	size_t n;

	ACEMQ_ASSERT(have >= FRAME_HEADER_SIZE);
	fi->type = p[0];
	fi->channel = frame_scan_u16(p + 1);
	fi->size = frame_scan_u32(p + 3);
	fi->class_id = 0;
	fi->method_id = 0;
	fi->reply_code = 0;
	fi->error = NULL;

	switch (fi->type) {
	case FRAME_METHOD:
		if (fi->size < 4)
			return frame_scan_fail(fi, "method frame too short");
		break;
	case FRAME_HEADER:
		if (fi->size < 14)
			return frame_scan_fail(fi, "content header frame too short");
		break;
	case FRAME_BODY:
		break;
	case FRAME_HEARTBEAT:
		if (fi->channel != 0)
			return frame_scan_fail(fi, "heartbeat frame on a channel other than 0");
		if (fi->size != 0)
			return frame_scan_fail(fi, "heartbeat frame with a payload");
		break;
	default:
		return frame_scan_fail(fi, "unknown frame type");
	}
	if (fi->size > max_payload)
		return frame_scan_fail(fi, "frame size exceeds frame_max");
	n = have - FRAME_HEADER_SIZE;
	if (n > fi->size)
		n = fi->size;
	if (n > sizeof(fi->peek))
		n = sizeof(fi->peek);
	memcpy(fi->peek, p + FRAME_HEADER_SIZE, n);
	if (fi->type == FRAME_METHOD && n >= 4) {
		fi->class_id = frame_scan_u16(fi->peek);
		fi->method_id = frame_scan_u16(fi->peek + 2);
	}
	return FRAME_SCAN_OK;
}

int frame_scan_bytes(const uint8_t *p, size_t len, uint32_t max_payload, struct frame_info *fi)
{
	int rc;

	if (len < FRAME_HEADER_SIZE)
		return FRAME_SCAN_AGAIN;
	rc = frame_scan_head(p, len, max_payload, fi);
	if (rc != FRAME_SCAN_OK)
		return rc;
	if (len < frame_scan_wire_len(fi))
		return FRAME_SCAN_AGAIN;
	if (p[FRAME_HEADER_SIZE + fi->size] != FRAME_END)
		return frame_scan_fail(fi, "frame end octet is not 0xCE");
	return FRAME_SCAN_OK;
}

void frame_cursor_init(struct frame_cursor *c, struct evbuffer *buf)
{
	int n = evbuffer_peek(buf, -1, NULL, c->v, FRAME_CURSOR_VECS), k;

	c->nv = n > FRAME_CURSOR_VECS ? FRAME_CURSOR_VECS : (n < 0 ? 0 : n);
	c->i = 0;
	c->at = 0;
	c->off = 0;
	c->len = 0;
	for (k = 0; k < c->nv; k++)
		c->len += c->v[k].iov_len;
	c->partial = c->len < evbuffer_get_length(buf);
}

/* Copy n bytes starting skip bytes past the cursor; 0 or -1. */
static int frame_cursor_copy(const struct frame_cursor *c, size_t skip, uint8_t *out, size_t n)
{
	int i = c->i;
	size_t at = c->at + skip;

	while (i < c->nv && at >= c->v[i].iov_len)
		at -= c->v[i++].iov_len;
	while (n > 0) {
		size_t take;

		if (i >= c->nv)
			return -1;
		ACEMQ_ASSERT(at <= c->v[i].iov_len);
		take = c->v[i].iov_len - at;
		if (take > n)
			take = n;
		memcpy(out, (const uint8_t *)c->v[i].iov_base + at, take);
		out += take;
		n -= take;
		at = 0;
		i++;
	}
	return 0;
}

int frame_cursor_advance(struct frame_cursor *c, size_t n)
{
	ACEMQ_ASSERT(c->off <= c->len);
	if (n > c->len - c->off)
		return -1;
	c->off += n;
	c->at += n;
	while (c->i < c->nv && c->at >= c->v[c->i].iov_len && c->at > 0) {
		if (c->at == c->v[c->i].iov_len && c->i + 1 == c->nv)
			break; /* at the very end */
		c->at -= c->v[c->i++].iov_len;
	}
	return 0;
}

int frame_cursor_scan(struct frame_cursor *c, uint32_t max_payload, struct frame_info *fi)
{
	size_t left = c->len - c->off, have;
	uint8_t head[PEEK_LEN], end;
	int rc;

	ACEMQ_ASSERT(c->off <= c->len);
	if (left < FRAME_HEADER_SIZE)
		return FRAME_SCAN_AGAIN;
	/* Fast path: the whole frame lies in the chain at the cursor. */
	if (c->i < c->nv) {
		size_t n;

		ACEMQ_ASSERT(c->at <= c->v[c->i].iov_len);
		n = c->v[c->i].iov_len - c->at;

		if (n >= FRAME_HEADER_SIZE) {
			rc = frame_scan_bytes((const uint8_t *)c->v[c->i].iov_base + c->at, n,
					      max_payload, fi);
			if (rc != FRAME_SCAN_AGAIN || n == left)
				return rc;
		}
	}
	/* The frame spans chains: copy its first bytes, look up its end. */
	have = left < PEEK_LEN ? left : PEEK_LEN;
	if (frame_cursor_copy(c, 0, head, have) != 0)
		return FRAME_SCAN_AGAIN;
	rc = frame_scan_head(head, have, max_payload, fi);
	if (rc != FRAME_SCAN_OK)
		return rc;
	if (left < frame_scan_wire_len(fi))
		return FRAME_SCAN_AGAIN;
	if (frame_cursor_copy(c, FRAME_HEADER_SIZE + fi->size, &end, 1) != 0)
		return FRAME_SCAN_AGAIN;
	if (end != FRAME_END)
		return frame_scan_fail(fi, "frame end octet is not 0xCE");
	return FRAME_SCAN_OK;
}

int frame_scan_evbuffer(struct evbuffer *buf, size_t offset, uint32_t max_payload,
			struct frame_info *fi)
{
	uint8_t head[PEEK_LEN];
	size_t len = evbuffer_get_length(buf);
	size_t have;
	struct evbuffer_ptr pos;
	uint8_t end;
	int rc;

	if (len < offset || len - offset < FRAME_HEADER_SIZE)
		return FRAME_SCAN_AGAIN;
	len -= offset;
	have = len < PEEK_LEN ? len : PEEK_LEN;
	if (evbuffer_ptr_set(buf, &pos, offset, EVBUFFER_PTR_SET) != 0 ||
	    evbuffer_copyout_from(buf, &pos, head, have) != (ev_ssize_t)have)
		return FRAME_SCAN_AGAIN;
	rc = frame_scan_head(head, have, max_payload, fi);
	if (rc != FRAME_SCAN_OK)
		return rc;
	if (len < frame_scan_wire_len(fi))
		return FRAME_SCAN_AGAIN;
	if (evbuffer_ptr_set(buf, &pos, FRAME_HEADER_SIZE + fi->size, EVBUFFER_PTR_ADD) != 0 ||
	    evbuffer_copyout_from(buf, &pos, &end, 1) != 1)
		return FRAME_SCAN_AGAIN;
	if (end != FRAME_END)
		return frame_scan_fail(fi, "frame end octet is not 0xCE");
	return FRAME_SCAN_OK;
}
