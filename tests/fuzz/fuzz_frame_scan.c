/* fuzz_frame_scan: the frame scanner over bytes and over an evbuffer, which
 * must agree, never read out of bounds, and never accept a bad frame. */
#include "amqp/frame_scan.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct frame_info a, b, c;
	struct frame_cursor cur;
	struct evbuffer *buf = evbuffer_new();
	size_t off = 0, split = size ? data[0] % (size + 1) : 0;
	uint32_t max = 131072 - 8;
	int ra, rb;

	/* Two pieces, so the scanner crosses a chain boundary. */
	evbuffer_add(buf, data, split);
	evbuffer_add(buf, data + split, size - split);
	frame_cursor_init(&cur, buf);
	for (;;) {
		ra = frame_scan_bytes(data + off, size - off, max, &a);
		rb = frame_scan_evbuffer(buf, off, max, &b);
		if (ra != rb || frame_cursor_scan(&cur, max, &c) != ra || cur.off != off)
			abort();
		if (ra != FRAME_SCAN_OK)
			break;
		if (a.type != b.type || a.size != b.size || a.channel != b.channel ||
		    a.class_id != b.class_id || a.method_id != b.method_id)
			abort();
		if (data[off + FRAME_HEADER_SIZE + a.size] != FRAME_END)
			abort();
		off += frame_scan_wire_len(&a);
		if (frame_cursor_advance(&cur, frame_scan_wire_len(&a)) != 0)
			abort();
	}
	evbuffer_free(buf);
	return 0;
}
