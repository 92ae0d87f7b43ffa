/* frame_scan: find, measure and validate AMQP 0-9-1 frames in a byte stream. */
#ifndef ACEMQ_FRAME_SCAN_H
#define ACEMQ_FRAME_SCAN_H

#include <event2/buffer.h>
#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER_SIZE 7u /* type(1) channel(2) size(4) */
#define FRAME_OVERHEAD    8u /* header plus the end octet */
#define FRAME_END         0xCEu
#define FRAME_MIN_SIZE    4096u /* frame_max floor the spec guarantees */

enum frame_type {
	FRAME_METHOD = 1,
	FRAME_HEADER = 2,
	FRAME_BODY = 3,
	FRAME_HEARTBEAT = 8,
};

enum frame_scan_rc {
	FRAME_SCAN_OK,    /* a whole, well-formed frame is at the front */
	FRAME_SCAN_AGAIN, /* need more bytes */
	FRAME_SCAN_ERROR, /* the stream is broken: reply_code and error say why */
};

struct frame_info {
	uint8_t type;
	uint16_t channel;
	uint32_t size;       /* payload length */
	uint16_t class_id;   /* method frames: the method's class */
	uint16_t method_id;  /* method frames: the method within the class */
	uint8_t peek[12];    /* the first payload bytes (fewer if shorter) */
	uint16_t reply_code; /* on error: the connection.close code to send */
	const char *error;   /* on error: a static description */
};

/* Total bytes a scanned frame occupies on the wire. */
static inline size_t frame_scan_wire_len(const struct frame_info *fi)
{
	return (size_t)fi->size + FRAME_OVERHEAD;
}

/* Write a frame's 7-byte header (type, channel, payload size) at p. */
void frame_scan_put_header(uint8_t *p, uint8_t type, uint16_t channel, uint32_t size);

/* Scan the frame at the front of p[0..len). max_payload bounds the payload
 * size (the negotiated frame_max minus FRAME_OVERHEAD). Never allocates. */
int frame_scan_bytes(const uint8_t *p, size_t len, uint32_t max_payload, struct frame_info *fi);

/* A position in an evbuffer that moves forward frame by frame over the
 * buffer's chains, read once with evbuffer_peek: no call into libevent per
 * frame, and a frame inside one chain is read in place. Valid while the
 * buffer is not changed. */
#define FRAME_CURSOR_VECS 64

struct frame_cursor {
	struct evbuffer_iovec v[FRAME_CURSOR_VECS];
	int nv;      /* chains seen */
	int i;       /* the chain the cursor is in */
	size_t at;   /* offset within v[i] */
	size_t off;  /* bytes from the buffer's start */
	size_t len;  /* bytes the seen chains hold */
	int partial; /* the buffer has more chains than were seen */
};

void frame_cursor_init(struct frame_cursor *c, struct evbuffer *buf);
/* Scan the frame at the cursor (as frame_scan_bytes); the cursor stays.
 * FRAME_SCAN_AGAIN with partial set means the frame reaches past the
 * chains seen: set the cursor again once the frames before it are gone. */
int frame_cursor_scan(struct frame_cursor *c, uint32_t max_payload, struct frame_info *fi);
/* Move the cursor n bytes on (at most to the end of what was seen). */
int frame_cursor_advance(struct frame_cursor *c, size_t n);

/* The same over an evbuffer, for the frame starting offset bytes in; the
 * buffer is not modified. */
int frame_scan_evbuffer(struct evbuffer *buf, size_t offset, uint32_t max_payload,
			struct frame_info *fi);

#endif
