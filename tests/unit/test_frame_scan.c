/* test_frame_scan: the frame scanner on whole, split and broken frames. */
#include "amqp/frame_scan.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#define MAXP (131072u - 8u)

static size_t frame(uint8_t *out, uint8_t type, uint16_t ch, const void *payload, uint32_t len)
{
	out[0] = type;
	out[1] = (uint8_t)(ch >> 8);
	out[2] = (uint8_t)ch;
	out[3] = (uint8_t)(len >> 24);
	out[4] = (uint8_t)(len >> 16);
	out[5] = (uint8_t)(len >> 8);
	out[6] = (uint8_t)len;
	if (len)
		memcpy(out + 7, payload, len);
	out[7 + len] = 0xCE;
	return len + 8;
}

static const uint8_t publish_args[] = {0, 60, 0, 40, 0, 0, 0, 1, 'q', 0};
static const uint8_t header_args[] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0x10, 0, 2};

struct sample {
	uint8_t bytes[64];
	size_t len;
	uint8_t type;
	uint16_t channel;
};

static void samples(struct sample *s)
{
	s[0].len = frame(s[0].bytes, 1, 1, publish_args, sizeof(publish_args));
	s[0].type = 1;
	s[0].channel = 1;
	s[1].len = frame(s[1].bytes, 2, 1, header_args, sizeof(header_args));
	s[1].type = 2;
	s[1].channel = 1;
	s[2].len = frame(s[2].bytes, 3, 7, "abc", 3);
	s[2].type = 3;
	s[2].channel = 7;
	s[3].len = frame(s[3].bytes, 8, 0, NULL, 0);
	s[3].type = 8;
	s[3].channel = 0;
	s[4].len = frame(s[4].bytes, 3, 65535, "", 0);
	s[4].type = 3;
	s[4].channel = 65535;
}

START_TEST(split_at_every_byte)
{
	struct sample s[5];
	int i;
	size_t cut;

	samples(s);
	for (i = 0; i < 5; i++) {
		for (cut = 0; cut <= s[i].len; cut++) {
			struct evbuffer *b = evbuffer_new();
			struct frame_info fi;

			evbuffer_add(b, s[i].bytes, cut);
			if (cut < s[i].len) {
				ck_assert_int_eq(frame_scan_evbuffer(b, 0, MAXP, &fi),
						 FRAME_SCAN_AGAIN);
				ck_assert_int_eq(frame_scan_bytes(s[i].bytes, cut, MAXP, &fi),
						 FRAME_SCAN_AGAIN);
				/* the rest arrives in a second chain */
				evbuffer_add(b, s[i].bytes + cut, s[i].len - cut);
			}
			ck_assert_int_eq(frame_scan_evbuffer(b, 0, MAXP, &fi), FRAME_SCAN_OK);
			ck_assert_uint_eq(fi.type, s[i].type);
			ck_assert_uint_eq(fi.channel, s[i].channel);
			ck_assert_uint_eq(frame_scan_wire_len(&fi), s[i].len);
			if (fi.type == 1) {
				ck_assert_uint_eq(fi.class_id, 60);
				ck_assert_uint_eq(fi.method_id, 40);
			}
			evbuffer_free(b);
		}
	}
}
END_TEST

START_TEST(stream_of_frames_at_offsets)
{
	struct sample s[5];
	struct evbuffer *b = evbuffer_new();
	struct frame_info fi;
	size_t off = 0;
	int i;

	samples(s);
	for (i = 0; i < 5; i++)
		evbuffer_add(b, s[i].bytes, s[i].len);
	for (i = 0; i < 5; i++) {
		ck_assert_int_eq(frame_scan_evbuffer(b, off, MAXP, &fi), FRAME_SCAN_OK);
		ck_assert_uint_eq(fi.type, s[i].type);
		off += frame_scan_wire_len(&fi);
	}
	ck_assert_int_eq(frame_scan_evbuffer(b, off, MAXP, &fi), FRAME_SCAN_AGAIN);
	evbuffer_free(b);
}
END_TEST

/* A stream in more chains than a cursor sees at once: scanning goes on
 * after the scanned frames are drained and the cursor is set again. */
START_TEST(cursor_over_many_chains)
{
	static uint8_t bytes[300 * 16];
	struct evbuffer *b = evbuffer_new();
	struct frame_cursor cur;
	struct frame_info fi;
	size_t n = 0, i, scanned = 0;
	int frames = 0, resets = 0;

	for (i = 0; i < 300; i++)
		n += frame(bytes + n, 3, (uint16_t)(i + 1), "abcdefgh", 8);
	for (i = 0; i < n; i += 3) /* one chain per 3 bytes */
		evbuffer_add_reference(b, bytes + i, i + 3 <= n ? 3 : n - i, NULL, NULL);
	frame_cursor_init(&cur, b);
	ck_assert(cur.partial);
	for (;;) {
		int rc = frame_cursor_scan(&cur, MAXP, &fi);

		if (rc == FRAME_SCAN_AGAIN && cur.partial) {
			evbuffer_drain(b, scanned);
			scanned = 0;
			frame_cursor_init(&cur, b);
			resets++;
			continue;
		}
		if (rc == FRAME_SCAN_AGAIN)
			break;
		ck_assert_int_eq(rc, FRAME_SCAN_OK);
		ck_assert_uint_eq(fi.channel, (unsigned)frames + 1);
		ck_assert_int_eq(frame_cursor_advance(&cur, frame_scan_wire_len(&fi)), 0);
		scanned += frame_scan_wire_len(&fi);
		frames++;
	}
	ck_assert_int_eq(frames, 300);
	ck_assert_int_gt(resets, 10);
	evbuffer_free(b);
}
END_TEST

static void expect_error(const uint8_t *p, size_t len, uint32_t maxp, uint16_t code)
{
	struct frame_info fi;
	struct evbuffer *b = evbuffer_new();

	ck_assert_int_eq(frame_scan_bytes(p, len, maxp, &fi), FRAME_SCAN_ERROR);
	ck_assert_uint_eq(fi.reply_code, code);
	ck_assert_ptr_nonnull(fi.error);
	evbuffer_add(b, p, len);
	ck_assert_int_eq(frame_scan_evbuffer(b, 0, maxp, &fi), FRAME_SCAN_ERROR);
	ck_assert_uint_eq(fi.reply_code, code);
	evbuffer_free(b);
}

START_TEST(bad_frames)
{
	uint8_t f[256];
	size_t n;

	n = frame(f, 3, 1, "abc", 3);
	f[n - 1] = 0x00; /* end octet */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 9, 1, "abc", 3); /* unknown type */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 8, 1, NULL, 0); /* heartbeat on a channel */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 8, 0, "x", 1); /* heartbeat with payload */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 1, 1, "\0\x3c", 2); /* method too short */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 2, 1, "\0\x3c\0\0", 4); /* header too short */
	expect_error(f, n, MAXP, 501);
	n = frame(f, 3, 1, "abcdefgh", 8); /* over frame_max */
	expect_error(f, n, 7, 501);
}
END_TEST

START_TEST(oversize_detected_from_header_alone)
{
	/* A frame that claims 4 GiB is refused before its payload arrives. */
	uint8_t f[7] = {3, 0, 1, 0xff, 0xff, 0xff, 0xff};
	struct frame_info fi;

	ck_assert_int_eq(frame_scan_bytes(f, sizeof(f), MAXP, &fi), FRAME_SCAN_ERROR);
	ck_assert_uint_eq(fi.reply_code, 501);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, split_at_every_byte);
	tcase_add_test(tc, stream_of_frames_at_offsets);
	tcase_add_test(tc, cursor_over_many_chains);
	tcase_add_test(tc, bad_frames);
	tcase_add_test(tc, oversize_detected_from_header_alone);
	return unit_run("frame_scan", tc, 1);
}
