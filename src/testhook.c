/* testhook: a hook for tests only that swallows every third delivery and
 * answers every fifth publish, per channel, to exercise tag translation. */
#include "hooks.h"

#include "channel.h"
#include "log.h"
#include "pipeline.h"
#include "session.h"

#include <stdlib.h>

struct testhook_state {
	uint32_t *deliveries; /* per channel */
	uint32_t *publishes;
	uint32_t n;
};

static void *testhook_attach(struct session *s)
{
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

static int testhook_wants(void *state, struct session *s, struct channel *ch,
			  enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	return kind == PIPE_RETURN ? PIPE_WANT_NONE : PIPE_WANT_MSG;
}

static enum pipe_verdict testhook_message(void *state, struct session *s, struct channel *ch,
					  struct pipe_msg *m)
{
	uint32_t *n = testhook_counter(state, ch->id, m->kind == PIPE_PUBLISH);

	if (n == NULL)
		return PIPE_PASS;
	++*n;
	if (m->kind == PIPE_PUBLISH)
		return *n % 5 == 0 ? PIPE_ANSWER : PIPE_PASS;
	return *n % 3 == 0 ? PIPE_SWALLOW : PIPE_PASS;
}

static void testhook_channel_closed(void *state, struct session *s, struct channel *ch)
{
	struct testhook_state *st = state;

	if (ch->id < st->n)
		st->deliveries[ch->id] = st->publishes[ch->id] = 0;
}

static const struct pipe_hook testhook = {
    .name = "test",
    .attach = testhook_attach,
    .detach = testhook_detach,
    .wants = testhook_wants,
    .message = testhook_message,
    .channel_closed = testhook_channel_closed,
};

void testhook_register(void)
{
	if (getenv("ACEMQ_PROXY_TEST_HOOK") && getenv("ACEMQ_PROXY_TEST_HOOK")[0] == '1') {
		log_warning("test hook enabled: every 3rd delivery swallowed, "
			    "every 5th publish answered");
		pipeline_register(&testhook);
	}
}
