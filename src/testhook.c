/* testhook: a hook for tests only that swallows every third delivery and
 * answers every fifth publish, per channel, to exercise tag translation; and
 * takes bodies published with a routing key "stream.*" as a stream,
 * replacing each with "LENGTH:FNV1A64HEX" so a test can tell the proxy held
 * none of it. Sessions on a vhost whose name starts with "plain" are left
 * alone; on one whose name starts with "closer", a channel's close closes
 * the connection from inside the hook. Apart from it, with
 * ACEMQ_PROXY_TEST_COMMIT_DELAY_MS each group commit of the delayed
 * messages' records waits that long first, so that a test can tell what
 * waits for a record. */
#include "hooks.h"

#include "channel.h"
#include "log.h"
#include "pipeline.h"
#include "store/delayed.h"
#include "store/state.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct testhook_stream {
	uint64_t len;
	uint64_t hash;
};

struct testhook_state {
	struct testhook_stream stream; /* a session streams one body at a time per channel */
	uint32_t *deliveries;          /* per channel */
	uint32_t *publishes;
	uint32_t n;
};

static void *testhook_attach(struct pipeline *p)
{
	/* A vhost named plain* is left alone, for tests that compare. */
	if (strncmp(p->vhost, "plain", 5) == 0)
		return NULL;
	return calloc(1, sizeof(struct testhook_state));
}

static void testhook_detach(void *state)
{
	struct testhook_state *st = state;

	free(st->deliveries);
	free(st->publishes);
	free(st);
}

static uint32_t *testhook_counter(struct testhook_state *st, uint16_t ch, int pub)
{
	if (ch >= st->n) {
		uint32_t n = (uint32_t)ch + 16;
		uint32_t *d = realloc(st->deliveries, n * sizeof(*d));
		uint32_t *p;

		if (d == NULL)
			return NULL;
		st->deliveries = d;
		p = realloc(st->publishes, n * sizeof(*p));
		if (p == NULL)
			return NULL;
		st->publishes = p;
		for (; st->n < n; st->n++)
			st->deliveries[st->n] = st->publishes[st->n] = 0;
	}
	return pub ? &st->publishes[ch] : &st->deliveries[ch];
}

static int testhook_wants(void *state, struct pipeline *p, struct channel *ch,
			  enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	return kind == PIPE_RETURN ? PIPE_WANT_NONE : PIPE_WANT_MSG;
}

static enum pipe_verdict testhook_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	uint32_t *n = testhook_counter(state, ch->id, m->kind == PIPE_PUBLISH);

	if (n == NULL || m->streamer >= 0)
		return PIPE_PASS;
	++*n;
	if (m->kind == PIPE_PUBLISH)
		return *n % 5 == 0 ? PIPE_ANSWER : PIPE_PASS;
	return *n % 3 == 0 ? PIPE_SWALLOW : PIPE_PASS;
}

static int testhook_stream_begin(void *state, struct pipeline *p, struct channel *ch,
				 struct pipe_msg *m)
{
	struct testhook_state *st = state;
	amqp_basic_publish_t *pub = m->method;

	if (m->kind != PIPE_PUBLISH || pub->routing_key.len < 7 ||
	    memcmp(pub->routing_key.bytes, "stream.", 7) != 0)
		return 0;
	st->stream.len = 0;
	st->stream.hash = 0xcbf29ce484222325ULL;
	return 1;
}

static int testhook_stream_body(void *state, struct pipeline *p, struct channel *ch,
				struct pipe_msg *m, const uint8_t *data, size_t len)
{
	struct testhook_state *st = state;
	size_t i;

	for (i = 0; i < len; i++)
		st->stream.hash = (st->stream.hash ^ data[i]) * 0x100000001b3ULL;
	st->stream.len += len;
	if (st->stream.len == m->body_size) {
		char text[64];
		int n = snprintf(text, sizeof(text), "%llu:%016llx",
				 (unsigned long long)st->stream.len,
				 (unsigned long long)st->stream.hash);

		if (m->body == NULL && (m->body = evbuffer_new()) == NULL)
			return -1;
		evbuffer_add(m->body, text, (size_t)n);
		m->body_dirty = 1;
	}
	return 0;
}

static void testhook_channel_closed(void *state, struct pipeline *p, struct channel *ch)
{
	struct testhook_state *st = state;

	if (ch->id < st->n)
		st->deliveries[ch->id] = st->publishes[ch->id] = 0;
	/* A vhost named closer*: a closed channel closes the connection
	 * from inside the hook, so the callers' legs may be gone on return. */
	if (strncmp(p->vhost, "closer", 6) == 0)
		pipeline_close(p, 320, "CONNECTION_FORCED - closed by the test hook");
}

static const struct pipe_hook testhook = {
    .name = "test",
    .attach = testhook_attach,
    .detach = testhook_detach,
    .wants = testhook_wants,
    .message = testhook_message,
    .stream_begin = testhook_stream_begin,
    .stream_body = testhook_stream_body,
    .channel_closed = testhook_channel_closed,
};

static unsigned testhook_commit_delay_ms;

static int testhook_commit_sleep(void *arg)
{
	(void)arg;
	usleep(testhook_commit_delay_ms * 1000u);
	return 0;
}

/* Installs the delay once the records' state is open; never attaches. */
static void *testhook_delay_attach(struct pipeline *p)
{
	static int installed;

	(void)p;
	if (delayed_state() != NULL && !__atomic_exchange_n(&installed, 1, __ATOMIC_SEQ_CST))
		state_test_commit_hook(delayed_state(), testhook_commit_sleep, NULL);
	return NULL;
}

static const struct pipe_hook testhook_delay = {
    .name = "testhook-commit-delay",
    .attach = testhook_delay_attach,
};

void testhook_register(void)
{
	const char *delay = getenv("ACEMQ_PROXY_TEST_COMMIT_DELAY_MS");

	if (delay && atoi(delay) > 0) {
		testhook_commit_delay_ms = (unsigned)atoi(delay);
		log_warning("test hook: each commit of delayed messages' records waits %u ms",
			    testhook_commit_delay_ms);
		pipeline_register(&testhook_delay);
	}
	if (getenv("ACEMQ_PROXY_TEST_HOOK") && getenv("ACEMQ_PROXY_TEST_HOOK")[0] == '1') {
		log_warning("test hook enabled: every 3rd delivery swallowed, "
			    "every 5th publish answered");
		pipeline_register(&testhook);
	}
}
