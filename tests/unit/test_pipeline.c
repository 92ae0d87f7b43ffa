/* test_pipeline: the pipeline and the settle translation without sockets,
 * through a host of the test's own that records what the pipeline asks of
 * the connection (holds, wake-ups, frames written). */
#include "../../amqp/content.h"
#include "../../amqp/frame_scan.h"
#include "../../amqp/method.h"
#include "../../src/channel.h"
#include "../../src/pipeline.h"
#include "../../src/settle.h"
#include "../../src/worker.h"
#include "unit.h"

#include <event2/buffer.h>
#include <string.h>

struct host {
	struct evbuffer *out[2];
	int holds[2], wakes[2], closes, channel_errors;
	struct channel *ch;
};

static struct host H;
static struct worker W;
static struct pipeline P;

static struct evbuffer *host_out(void *owner, enum chan_dir dir)
{
	return ((struct host *)owner)->out[dir];
}

static void host_hold(void *owner, enum chan_dir from)
{
	((struct host *)owner)->holds[from]++;
}

static void host_wake(void *owner, enum chan_dir from)
{
	((struct host *)owner)->wakes[from]++;
}

static void host_channel_error(void *owner, struct channel *ch, uint16_t code, const char *text,
			       uint16_t class_id, uint16_t method_id)
{
	((struct host *)owner)->channel_errors++;
}

static void host_close(void *owner, uint16_t code, const char *text)
{
	((struct host *)owner)->closes++;
}

static struct channel *host_channel(void *owner, uint16_t id)
{
	struct host *h = owner;

	return h->ch && h->ch->id == id ? h->ch : NULL;
}

static void host_lookahead(void *owner, enum chan_dir from, struct pipeline_mark *mark,
			   int (*fn)(void *arg, const struct frame_info *fi,
				     const uint8_t *payload, size_t len),
			   void *arg)
{
}

static int host_call(void *owner, void (*fn)(struct pipeline *p, void *arg), void *arg)
{
	fn(&P, arg);
	return 1;
}

static const struct pipeline_host test_host = {
    .out = host_out,
    .hold = host_hold,
    .wake = host_wake,
    .channel_error = host_channel_error,
    .close = host_close,
    .channel = host_channel,
    .lookahead = host_lookahead,
    .call = host_call,
};

/* A hook that makes every publish wait, gates every settle, and records
 * the settles it hears of. */
static struct pipe_msg *waiting;
static uint64_t settled_tag;
static int gate;

static void *hook_attach(struct pipeline *p)
{
	static int state;

	return &state;
}

static int hook_wants(void *state, struct pipeline *p, struct channel *ch, enum pipe_kind kind,
		      amqp_method_number_t id, void *method)
{
	return PIPE_WANT_MSG;
}

static enum pipe_verdict hook_message(void *state, struct pipeline *p, struct channel *ch,
				      struct pipe_msg *m)
{
	waiting = m;
	return PIPE_WAIT;
}

static void hook_settle(void *state, struct pipeline *p, struct channel *ch,
			amqp_method_number_t how, uint64_t broker_tag)
{
	settled_tag = broker_tag;
}

static int hook_gate(void *state, struct pipeline *p, struct channel *ch,
		     amqp_method_number_t how, uint64_t client_tag, int multiple)
{
	return gate;
}

static const struct pipe_hook test_hook = {
    .name = "test",
    .attach = hook_attach,
    .wants = hook_wants,
    .message = hook_message,
    .settle = hook_settle,
    .settle_gate = hook_gate,
};

static void setup(void)
{
	static int registered;

	if (!registered) {
		pipeline_register(&test_hook);
		registered = 1;
	}
	memset(&H, 0, sizeof(H));
	memset(&W, 0, sizeof(W));
	H.out[0] = evbuffer_new();
	H.out[1] = evbuffer_new();
	H.ch = channel_new(1);
	H.ch->open = 1;
	worker_settings.max_message_size = 1 << 20;
	pipeline_init(&P, &test_host, &H, &W, 7);
	P.vhost = "v";
	P.frame_max = 131072;
	ck_assert_int_eq(pipeline_attach(&P), 1);
	ck_assert_int_eq(P.track, 1);
	waiting = NULL;
	settled_tag = 0;
	gate = 0;
}

static void teardown(void)
{
	pipeline_detach(&P);
	channel_free(H.ch);
	evbuffer_free(H.out[0]);
	evbuffer_free(H.out[1]);
}

/* A publish of body on channel 1, as the client's frames. */
static struct evbuffer *publish_frames(const char *body)
{
	struct evbuffer *in = evbuffer_new(), *b = evbuffer_new();
	amqp_basic_publish_t pub = {0, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"), 0, 0};
	amqp_basic_properties_t props = {0};

	ck_assert_int_eq(method_write(in, 1, AMQP_BASIC_PUBLISH_METHOD, &pub), 0);
	ck_assert_int_eq(content_header_write(in, 1, AMQP_BASIC_CLASS, strlen(body), &props),
			 0);
	evbuffer_add(b, body, strlen(body));
	ck_assert_int_eq(content_body_write(in, 1, b, 131072), 0);
	evbuffer_free(b);
	return in;
}

/* Feed every frame of in to the pipeline as the relay does. */
static struct pipe_msg *collect(struct evbuffer *in)
{
	struct pipe_msg *m = pipe_msg_new(PIPE_PUBLISH, 1);
	struct frame_info fi;

	ck_assert_ptr_nonnull(m);
	m->want = PIPE_WANT_MSG;
	m->hook_want[0] = PIPE_WANT_MSG;
	while (frame_scan_evbuffer(in, 0, 131072, &fi) == FRAME_SCAN_OK)
		ck_assert_int_eq(
		    pipeline_collect(&P, H.ch, m, in, frame_scan_wire_len(&fi), fi.type),
		    PIPE_COLLECT_OK);
	return m;
}

/* A reload between a message's frames may attach a hook at a slot the
 * message then reads: every slot past the attached hooks is written 0. */
START_TEST(test_wants_writes_every_slot)
{
	int per_hook[PIPELINE_MAX_HOOKS], i;
	amqp_basic_publish_t pub = {0};

	memset(per_hook, 0x55, sizeof(per_hook));
	ck_assert_int_eq(
	    pipeline_wants(&P, H.ch, PIPE_PUBLISH, AMQP_BASIC_PUBLISH_METHOD, &pub, per_hook),
	    PIPE_WANT_MSG);
	ck_assert_int_eq(per_hook[0], PIPE_WANT_MSG);
	for (i = 1; i < PIPELINE_MAX_HOOKS; i++)
		ck_assert_int_eq(per_hook[i], 0);
}
END_TEST

/* A message that waits holds its leg; finishing it later writes it out
 * and wakes the leg through the host, which pumps later: the pipeline
 * never runs the connection's pump itself. */
START_TEST(test_wait_holds_and_resume_wakes)
{
	struct evbuffer *in = publish_frames("hello");
	size_t sent = evbuffer_get_length(in);
	struct pipe_msg *m = collect(in);

	ck_assert_int_eq(pipeline_complete(&P, H.ch, m), 0);
	ck_assert_ptr_eq(waiting, m);
	ck_assert_int_eq(H.holds[DIR_TO_BROKER], 1);
	ck_assert_int_eq(H.wakes[DIR_TO_BROKER], 0);
	ck_assert_uint_eq(evbuffer_get_length(H.out[DIR_TO_BROKER]), 0);

	ck_assert_int_eq(pipeline_resume(&P, H.ch, m, PIPE_PASS), 0);
	ck_assert_int_eq(H.wakes[DIR_TO_BROKER], 1);
	ck_assert_int_eq(H.holds[DIR_TO_BROKER], 1);
	/* The publish went out whole, as the client's bytes. */
	ck_assert_uint_eq(evbuffer_get_length(H.out[DIR_TO_BROKER]), sent);
	evbuffer_free(in);
}
END_TEST

/* A waiting message whose channel went is let go without a word, and
 * its leg woken. */
START_TEST(test_drop_wakes)
{
	struct evbuffer *in = publish_frames("x");
	struct pipe_msg *m = collect(in);

	ck_assert_int_eq(pipeline_complete(&P, H.ch, m), 0);
	pipeline_drop(&P, m);
	ck_assert_int_eq(H.wakes[DIR_TO_BROKER], 1);
	ck_assert_uint_eq(evbuffer_get_length(H.out[DIR_TO_BROKER]), 0);
	evbuffer_free(in);
}
END_TEST

/* A gated settle holds the client's leg; its release wakes it. */
START_TEST(test_settle_gate)
{
	gate = 1;
	ck_assert_int_eq(pipeline_settle_gate(&P, H.ch, AMQP_BASIC_ACK_METHOD, 1, 0), 1);
	ck_assert_int_eq(H.holds[DIR_TO_BROKER], 1);
	pipeline_settle_release(&P);
	ck_assert_int_eq(H.wakes[DIR_TO_BROKER], 1);
	gate = 0;
	ck_assert_int_eq(pipeline_settle_gate(&P, H.ch, AMQP_BASIC_ACK_METHOD, 1, 0), 0);
	ck_assert_int_eq(H.holds[DIR_TO_BROKER], 1);
}
END_TEST

/* The client's ack goes upstream with the broker's tag, and the hooks
 * hear of it; a tag never given is an error the caller raises, in the
 * broker's words, with nothing written. */
START_TEST(test_settle_client)
{
	amqp_basic_ack_t ack = {1, 0};
	amqp_basic_ack_t bad = {9, 0};
	char why[96];
	struct frame_info fi;
	amqp_pool_t pool;
	amqp_method_number_t id;
	void *decoded;

	ck_assert_uint_eq(tagmap_deliver(&H.ch->tags, 100, 1), 1);
	ck_assert_int_eq(settle_client(&P, H.ch, AMQP_BASIC_ACK_METHOD, &ack, why, sizeof(why)),
			 0);
	ck_assert_uint_eq(settled_tag, 100);
	ck_assert_int_eq(frame_scan_evbuffer(H.out[DIR_TO_BROKER], 0, 131072, &fi),
			 FRAME_SCAN_OK);
	init_amqp_pool(&pool, 4096);
	ck_assert_int_eq(
	    method_decode_evbuffer(H.out[DIR_TO_BROKER], fi.size, &pool, &id, &decoded), 0);
	ck_assert_uint_eq(id, AMQP_BASIC_ACK_METHOD);
	ck_assert_uint_eq(((amqp_basic_ack_t *)decoded)->delivery_tag, 100);
	empty_amqp_pool(&pool);
	evbuffer_drain(H.out[DIR_TO_BROKER], evbuffer_get_length(H.out[DIR_TO_BROKER]));

	ck_assert_int_eq(settle_client(&P, H.ch, AMQP_BASIC_ACK_METHOD, &bad, why, sizeof(why)),
			 -1);
	ck_assert_str_eq(why, "PRECONDITION_FAILED - unknown delivery tag 9");
	ck_assert_uint_eq(evbuffer_get_length(H.out[DIR_TO_BROKER]), 0);
	ck_assert_int_eq(H.channel_errors, 0); /* raised by the caller, not here */
}
END_TEST

/* The broker's confirms are told to the client in the client's numbers:
 * with one publish answered by the proxy, broker sequence 1 is client 2. */
START_TEST(test_settle_broker_confirm)
{
	amqp_basic_ack_t ack = {1, 0};
	amqp_basic_ack_t unknown = {5, 0};
	struct frame_info fi;
	amqp_pool_t pool;
	amqp_method_number_t id;
	void *decoded;

	H.ch->confirm_mode = 1;
	ck_assert_uint_eq(confirmmap_answer(&H.ch->confirms), 1);
	confirmmap_forward(&H.ch->confirms);
	ck_assert_int_eq(settle_broker_confirm(&P, H.ch, AMQP_BASIC_ACK_METHOD, &ack), 0);
	ck_assert_int_eq(frame_scan_evbuffer(H.out[DIR_TO_CLIENT], 0, 131072, &fi),
			 FRAME_SCAN_OK);
	init_amqp_pool(&pool, 4096);
	ck_assert_int_eq(
	    method_decode_evbuffer(H.out[DIR_TO_CLIENT], fi.size, &pool, &id, &decoded), 0);
	ck_assert_uint_eq(id, AMQP_BASIC_ACK_METHOD);
	ck_assert_uint_eq(((amqp_basic_ack_t *)decoded)->delivery_tag, 2);
	empty_amqp_pool(&pool);
	ck_assert_int_eq(settle_broker_confirm(&P, H.ch, AMQP_BASIC_ACK_METHOD, &unknown), -1);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("pipeline");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_wants_writes_every_slot);
	tcase_add_test(tc, test_wait_holds_and_resume_wakes);
	tcase_add_test(tc, test_drop_wakes);
	tcase_add_test(tc, test_settle_gate);
	tcase_add_test(tc, test_settle_client);
	tcase_add_test(tc, test_settle_broker_confirm);
	return unit_run("pipeline", tc, 1);
}
