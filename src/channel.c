/* channel: per-channel state of a session: content order, consumers, tag maps. */
#include "channel.h"

#include "pipeline.h"
#include "surplus.h"

#include <stdio.h>
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

static void channel_drop_msg(void *m)
{
	pipe_msg_free(m);
}

static void channel_clear(struct channel *ch)
{
	int i;

	surplus_free(ch->surplus, channel_drop_msg);
	ch->surplus = NULL;
	ch->prefetch = ch->consume_surplus = 0;
	ch->prefetch_global = ch->qos_unanswered = 0;
	for (i = 0; i < 2; i++) {
		if (ch->content[i].msg)
			pipe_msg_free(ch->content[i].msg);
		memset(&ch->content[i], 0, sizeof(ch->content[i]));
	}
	tagmap_reset(&ch->tags);
	confirmmap_reset(&ch->confirms);
	for (i = 0; i < ch->nconsumers; i++) {
		free(ch->consumers[i].tag);
		free(ch->consumers[i].queue);
	}
	channel_set_str(&ch->consume_queue, NULL, 0);
	channel_set_str(&ch->get_queue, NULL, 0);
	free(ch->consumers);
	ch->consumers = NULL;
	ch->nconsumers = 0;
	ch->confirm_mode = 0;
	ch->published = ch->confirmed = 0;
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

void channel_set_str(char **slot, const void *bytes, size_t len)
{
	free(*slot);
	*slot = bytes ? strndup(bytes, len) : NULL;
}

int channel_consumer_add(struct channel *ch, const char *tag, size_t len, int no_ack,
			 const char *queue)
{
	struct chan_consumer *n =
	    realloc(ch->consumers, (size_t)(ch->nconsumers + 1) * sizeof(*n));

	if (n == NULL)
		return -1;
	ch->consumers = n;
	n[ch->nconsumers].tag = strndup(tag, len);
	n[ch->nconsumers].queue = queue ? strdup(queue) : NULL;
	n[ch->nconsumers].no_ack = no_ack;
	if (n[ch->nconsumers].tag == NULL) {
		free(n[ch->nconsumers].queue);
		return -1;
	}
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
	free(ch->consumers[i].queue);
	ch->consumers[i] = ch->consumers[--ch->nconsumers];
}

const char *channel_consumer_queue(const struct channel *ch, const char *tag, size_t len)
{
	int i = channel_consumer_find(ch, tag, len);

	return i < 0 ? NULL : ch->consumers[i].queue;
}

int channel_consumer_no_ack(const struct channel *ch, const char *tag, size_t len)
{
	int i = channel_consumer_find(ch, tag, len);

	return i < 0 ? 0 : ch->consumers[i].no_ack;
}

/* A frame that is not the one the content state expects. */
static int channel_unexpected(struct chan_content *c, struct chan_error *err)
{
	if (c->expect == EXPECT_METHOD) {
		snprintf(
		    err->text, sizeof(err->text),
		    "UNEXPECTED_FRAME - expected method frame, got non method frame instead");
		err->method = 0;
	} else if (c->expect == EXPECT_HEADER) {
		snprintf(
		    err->text, sizeof(err->text),
		    "UNEXPECTED_FRAME - expected content header for class %u, got non content "
		    "header frame instead",
		    (unsigned)(c->method >> 16));
		err->method = c->method;
	} else {
		snprintf(err->text, sizeof(err->text),
			 "UNEXPECTED_FRAME - expected content body, got non content body frame "
			 "instead");
		err->method = c->method;
	}
	return REPLY_UNEXPECTED_FRAME;
}

int channel_content_method(struct channel *ch, enum chan_dir dir, amqp_method_number_t id,
			   int has_content, struct chan_error *err)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_METHOD)
		return channel_unexpected(c, err);
	if (has_content) {
		c->expect = EXPECT_HEADER;
		c->method = id;
	}
	return 0;
}

int channel_content_header(struct channel *ch, enum chan_dir dir, uint16_t class_id,
			   uint64_t body_size, struct chan_error *err)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_HEADER)
		return channel_unexpected(c, err);
	c->class_id = class_id;
	c->remaining = body_size;
	c->expect = body_size ? EXPECT_BODY : EXPECT_METHOD;
	return 0;
}

int channel_content_body(struct channel *ch, enum chan_dir dir, uint32_t size,
			 struct chan_error *err)
{
	struct chan_content *c = &ch->content[dir];

	if (c->expect != EXPECT_BODY)
		return channel_unexpected(c, err);
	if (size > c->remaining) {
		snprintf(err->text, sizeof(err->text),
			 "UNEXPECTED_FRAME - content body frame longer than the body size");
		err->method = c->method;
		return REPLY_UNEXPECTED_FRAME;
	}
	c->remaining -= size;
	if (c->remaining == 0)
		c->expect = EXPECT_METHOD;
	return 0;
}
