/* fuzz_props: decode a content header's properties; whatever decodes must
 * re-encode and decode to the same bytes. A header entry is spliced into
 * the frame as it is (reading nothing past it, whatever it holds); what
 * decoded before must decode after with that entry last and every other
 * flag kept. The schedule ladder's readers
 * (the delay header, the scheduler's plan, the final properties) run on
 * what decoded, as they do on what a client or the control queue sends. */
#include "amqp/content.h"
#include "amqp/frame_scan.h"
#include "src/patterns/ladder.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The payload framed exactly (a fresh allocation, so ASan sees any read
 * past it), then a header entry spliced in. */
static int fuzz_props_splice(struct evbuffer *out, const uint8_t *payload, size_t len)
{
	static const uint8_t entry[] = {5, 'f', 'u', 'z', 'z', 'k', 'S', 0, 0, 0, 2, 'o', 'k'};
	uint8_t *frame = malloc(len + FRAME_OVERHEAD);
	int rc;

	if (frame == NULL || len > UINT32_MAX) {
		free(frame);
		return -1;
	}
	frame_scan_put_header(frame, FRAME_HEADER, 1, (uint32_t)len);
	memcpy(frame + FRAME_HEADER_SIZE, payload, len);
	frame[FRAME_HEADER_SIZE + len] = FRAME_END;
	rc = content_header_append_headers(out, frame, len + FRAME_OVERHEAD, entry,
					   sizeof(entry), 1u << 20);
	free(frame);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	amqp_pool_t pool, pool2;
	amqp_basic_properties_t *props, *again;
	uint8_t head[CONTENT_HEADER_FIXED] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
	uint8_t *payload = malloc(size + sizeof(head));
	struct evbuffer *out, *spliced;
	unsigned char *p;
	size_t len;
	int spliced_rc;

	if (payload == NULL)
		return 0;
	memcpy(payload, head, sizeof(head));
	memcpy(payload + sizeof(head), data, size);
	init_amqp_pool(&pool, 4096);
	init_amqp_pool(&pool2, 4096);
	spliced = evbuffer_new();
	spliced_rc = fuzz_props_splice(spliced, payload, size + sizeof(head));
	if (content_props_decode(payload, size + sizeof(head), &pool, &props) == 0) {
		if (spliced_rc == 0) {
			amqp_basic_properties_t *sp;
			int had = (props->_flags & AMQP_BASIC_HEADERS_FLAG)
				      ? props->headers.num_entries
				      : 0;

			len = evbuffer_get_length(spliced);
			p = evbuffer_pullup(spliced, -1);
			if (content_props_decode(p + FRAME_HEADER_SIZE, len - FRAME_OVERHEAD,
						 &pool2, &sp) != 0 ||
			    sp->_flags != (props->_flags | AMQP_BASIC_HEADERS_FLAG) ||
			    sp->headers.num_entries != had + 1 ||
			    sp->headers.entries[had].key.len != 5 ||
			    memcmp(sp->headers.entries[had].key.bytes, "fuzzk", 5) != 0)
				abort();
		}
		out = evbuffer_new();
		if (content_header_write(out, 1, AMQP_BASIC_CLASS, 5, props) == 0) {
			len = evbuffer_get_length(out);
			p = evbuffer_pullup(out, -1);
			if (content_props_decode(p + FRAME_HEADER_SIZE, len - FRAME_OVERHEAD,
						 &pool2, &again) != 0)
				abort();
			/* Continuation words carry no basic property: only the
			 * defined bits must survive the round trip. */
			if ((again->_flags & 0xFFFC) != (props->_flags & 0xFFFC))
				abort();
		}
		evbuffer_free(out);
		if (props->_flags & AMQP_BASIC_HEADERS_FLAG) {
			struct ladder_plan plan;
			int64_t ms;

			ladder_delay(&props->headers, "x-delay", &ms);
			ladder_plan(props, 1700000000000, &plan);
			if (plan.action == LADDER_HOP && plan.rung == NULL)
				abort();
			ladder_final(props, &pool);
		}
	}
	evbuffer_free(spliced);
	empty_amqp_pool(&pool);
	empty_amqp_pool(&pool2);
	free(payload);
	return 0;
}
