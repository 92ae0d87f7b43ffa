/* channel: per-channel state of a session: content order, consumers, tag maps. */
#include "channel.h"

#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#define REPLY_UNEXPECTED_FRAME 505

struct channel *channel_new(uint16_t id)
{
	struct channel *ch = calloc(1, sizeof(*ch));

	if (ch == NULL)
		return NULL;
	ch->id = id;
	tagmap_init(&ch->tags);
	confirmmap_init(&ch->confirms);
	return ch;
}

static void channel_clear(struct channel *ch)
{
	int i;

	for (i = 0; i < 2; i++) {
		if (ch->content[i].msg)
			pipe_msg_free(ch->content[i].msg);
		memset(&ch->content[i], 0, sizeof(ch->content[i]));
	}
	tagmap_reset(&ch->tags);
	confirmmap_reset(&ch->confirms);
	for (i = 0; i < ch->nconsumers; i++)
		free(ch->consumers[i].tag);
	free(ch->consumers);
	ch->consumers = NULL;
	ch->nconsumers = 0;
	ch->confirm_mode = 0;
	ch->get_no_ack = 0;
	ch->consume_no_ack = 0;
}

void channel_reset(struct channel *ch)
{
	channel_clear(ch);
}

void channel_free(struct channel *ch)
{
	if (ch == NULL)
		return;
	channel_clear(ch);
	free(ch);
}

int channel_consumer_add(struct channel *ch, const char *tag, size_t len, int no_ack)
{
	struct chan_consumer *n =
	    realloc(ch->consumers, (size_t)(ch->nconsumers + 1) * sizeof(*n));

	if (n == NULL)
		return -1;
	ch->consumers = n;
	n[ch->nconsumers].tag = strndup(tag, len);
	n[ch->nconsumers].no_ack = no_ack;
	if (n[ch->nconsumers].tag == NULL)
		return -1;
	ch->nconsumers++;
	return 0;
}

static int channel_consumer_find(const struct channel *ch, const char *tag, size_t len)
{
	int i;

	for (i = 0; i < ch->nconsumers; i++)
		if (strlen(ch->consumers[i].tag) == len &&
		    memcmp(ch->consumers[i].tag, tag, len) == 0)
			return i;
	return -1;
}

void channel_consumer_remove(struct channel *ch, const char *tag, size_t len)
{
	int i = channel_consumer_find(ch, tag, len);

	if (i < 0)
		return;
	free(ch->consumers[i].tag);
	ch->consumers[i] = ch->consumers[--ch->nconsumers];
}

int channel_consumer_no_ack(const struct channel *ch, const char *tag, size_t len)
{
	int i = channel_consumer_find(ch, tag, len);

	return i < 0 ? 0 : ch->consumers[i].no_ack;
}

int channel_content_method(struct channel *ch, enum chan_dir dir, int has_content,
			   const char **why)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_METHOD) {
		*why = c->expect == EXPECT_HEADER
			   ? "expected content header, got a method frame"
			   : "expected content body, got a method frame";
		return REPLY_UNEXPECTED_FRAME;
	}
	if (has_content)
		c->expect = EXPECT_HEADER;
	return 0;
}

int channel_content_header(struct channel *ch, enum chan_dir dir, uint16_t class_id,
			   uint64_t body_size, const char **why)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_HEADER) {
		*why = "content header frame without a content method";
		return REPLY_UNEXPECTED_FRAME;
	}
	c->class_id = class_id;
	c->remaining = body_size;
	c->expect = body_size ? EXPECT_BODY : EXPECT_METHOD;
	return 0;
}

int channel_content_body(struct channel *ch, enum chan_dir dir, uint32_t size, const char **why)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_BODY) {
		*why = "content body frame without a content header";
		return REPLY_UNEXPECTED_FRAME;
	}
	if (size > c->remaining) {
		*why = "content body frame longer than the header's body size";
		return REPLY_UNEXPECTED_FRAME;
	}
	c->remaining -= size;
	if (c->remaining == 0)
		c->expect = EXPECT_METHOD;
	return 0;
}
