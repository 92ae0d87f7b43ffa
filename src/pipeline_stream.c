/* pipeline_stream: a delivery whose body a hook streams (the claim
 * check's rehydration): its method and header, then body frames cut at the
 * client's frame_max, copied or lent to the output without a copy. */
#include "../amqp/content.h"
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "channel.h"
#include "debug.h"
#include "pipeline_int.h"
#include "tagmap.h"

#include <event2/buffer.h>
#include <stdlib.h>

int pipeline_stream_out_begin(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			      uint64_t body_size)
{
	struct evbuffer *out = pipeline_out(p, DIR_TO_CLIENT);
	uint64_t *tagp = pipeline_tag_of(m);
	int rc;

	if (out == NULL || ch == NULL || ch->proxy_closing)
		return -1;
	pipeline_rewrite(p, ch, m);
	pipeline_surplus_stream(p, ch, m);
	if (tagp) {
		*tagp = p->track ? tagmap_deliver(&ch->tags, m->broker_tag, !m->no_ack)
				 : m->broker_tag;
	}
	rc = method_write(out, m->channel, m->method_id, m->method);
	rc |= content_header_write(out, m->channel, AMQP_BASIC_CLASS, body_size, m->props);
	evbuffer_drain(m->raw, evbuffer_get_length(m->raw));
	return rc ? -1 : 0;
}

/* A lent piece of a stream: the output's references to it, and who gets
 * it back when the last is written. */
struct pipeline_lent {
	unsigned refs;
	void (*release)(void *arg);
	void *arg;
};

static void pipeline_lent_put(struct pipeline_lent *l)
{
	ACEMQ_ASSERT(l->refs > 0);
	if (--l->refs == 0) {
		l->release(l->arg);
		free(l);
	}
}

static void pipeline_lent_written(const void *data, size_t len, void *arg)
{
	(void)data;
	(void)len;
	pipeline_lent_put(arg);
}

/* Body frames of data at the client's frame_max; with l, referring to it. */
static int pipeline_stream_frames(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
				  const uint8_t *at, size_t len, struct pipeline_lent *l)
{
	struct evbuffer *out = pipeline_out(p, DIR_TO_CLIENT);
	size_t chunk = p->frame_max > FRAME_OVERHEAD ? p->frame_max - FRAME_OVERHEAD : 4088;
	uint8_t head[FRAME_HEADER_SIZE];
	const uint8_t end = FRAME_END;

	if (out == NULL || ch == NULL || ch->proxy_closing)
		return -1;
	while (len > 0) {
		size_t n = len < chunk ? len : chunk;
		int rc;

		frame_scan_put_header(head, FRAME_BODY, m->channel, (uint32_t)n);
		if (evbuffer_add(out, head, sizeof(head)) != 0)
			return -1;
		if (l) {
			l->refs++;
			rc = evbuffer_add_reference(out, at, n, pipeline_lent_written, l);
			if (rc != 0)
				l->refs--; /* not added: its cleanup never runs */
		} else {
			rc = evbuffer_add(out, at, n);
		}
		if (rc != 0 || evbuffer_add(out, &end, 1) != 0)
			return -1;
		at += n;
		len -= n;
	}
	return 0;
}

int pipeline_stream_out(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			const void *data, size_t len)
{
	return pipeline_stream_frames(p, ch, m, data, len, NULL);
}

int pipeline_stream_out_lent(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			     const void *data, size_t len, void (*release)(void *arg),
			     void *arg)
{
	struct pipeline_lent *l = malloc(sizeof(*l));
	int rc;

	if (l == NULL) {
		rc = pipeline_stream_frames(p, ch, m, data, len, NULL);
		release(arg);
		return rc;
	}
	l->refs = 1; /* this call's own, put below */
	l->release = release;
	l->arg = arg;
	rc = pipeline_stream_frames(p, ch, m, data, len, l);
	pipeline_lent_put(l);
	return rc;
}

void pipeline_stream_out_end(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	enum chan_dir dir = pipeline_dir(m);

	pipe_msg_free(m);
	pipeline_wake(p, dir);
}
