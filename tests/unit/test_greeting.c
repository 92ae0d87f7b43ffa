/* test_greeting: the proxy's own side of the handshake, frame by frame:
 * what the client is offered (whose server properties, and when a client
 * waits for them), what is kept of its answers, and what the broker chosen
 * later is told. */
#include "amqp/frame_scan.h"
#include "amqp/method.h"
#include "src/greeting.h"
#include "src/upstream.h"
#include "src/worker.h"

#include "tests/unit/unit.h"

#include <arpa/inet.h>
#include <check.h>
#include <event2/buffer.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

static amqp_pool_t pool;

/* Decode the one method frame at the front of b (drained); the decoded
 * method points into a copy in the pool, not into b. */
static void *take(struct evbuffer *b, amqp_method_number_t want)
{
	struct frame_info fi;
	amqp_method_number_t id;
	void *m = NULL;
	uint8_t *payload;

	ck_assert_int_eq(frame_scan_evbuffer(b, 0, 1u << 20, &fi), FRAME_SCAN_OK);
	ck_assert_int_eq(fi.type, FRAME_METHOD);
	ck_assert_int_eq(fi.channel, 0);
	payload = amqp_pool_alloc(&pool, fi.size);
	ck_assert_ptr_nonnull(payload);
	evbuffer_drain(b, FRAME_HEADER_SIZE);
	ck_assert_int_eq(evbuffer_remove(b, payload, fi.size), (int)fi.size);
	evbuffer_drain(b, 1); /* the frame end */
	ck_assert_int_eq(method_decode(payload, fi.size, &pool, &id, &m), 0);
	ck_assert_uint_eq(id, want);
	return m;
}

/* A client frame written into in; its length. */
static size_t client_frame(struct evbuffer *in, amqp_method_number_t id, void *m)
{
	size_t before = evbuffer_get_length(in);

	ck_assert_int_eq(method_write(in, 0, id, m), 0);
	return evbuffer_get_length(in) - before;
}

static amqp_connection_start_ok_t start_ok(const char *mechanism)
{
	amqp_connection_start_ok_t s;

	memset(&s, 0, sizeof(s));
	s.mechanism = amqp_cstring_bytes(mechanism);
	s.response = amqp_cstring_bytes("\0guest\0guest");
	s.response.len = 12;
	s.locale = amqp_cstring_bytes("en_US");
	return s;
}

START_TEST(whole_handshake)
{
	struct greeting *g = greeting_new();
	struct evbuffer *in = evbuffer_new(), *to_client = evbuffer_new(),
			*to_broker = evbuffer_new();
	amqp_connection_start_t *st;
	amqp_connection_tune_t *tune, btune = {0, 0, 60};
	amqp_connection_tune_ok_t tok = {0, 8192, 30}, *sent;
	amqp_connection_open_t open;
	amqp_connection_start_ok_t so = start_ok("PLAIN"), *replayed;
	char why[256];
	size_t len;
	int i, caps = 0;

	init_amqp_pool(&pool, 4096);
	ck_assert_int_eq(greeting_start(g, to_client), 0);
	st = take(to_client, AMQP_CONNECTION_START_METHOD);
	ck_assert_int_eq(st->version_major, 0);
	ck_assert_int_eq(st->version_minor, 9);
	ck_assert_int_eq((int)st->mechanisms.len, 14);
	ck_assert(memcmp(st->mechanisms.bytes, "PLAIN AMQPLAIN", 14) == 0);
	for (i = 0; i < st->server_properties.num_entries; i++)
		if (st->server_properties.entries[i].key.len == 12 &&
		    memcmp(st->server_properties.entries[i].key.bytes, "capabilities", 12) == 0)
			caps = st->server_properties.entries[i].value.value.table.num_entries;
	ck_assert_int_ge(caps, 8);

	/* A tune-ok before the start-ok is out of order. */
	len = client_frame(in, AMQP_CONNECTION_TUNE_OK_METHOD, &tok);
	ck_assert_int_eq(greeting_tune_ok(g, &tok, in, len), -1);
	evbuffer_drain(in, len);

	len = client_frame(in, AMQP_CONNECTION_START_OK_METHOD, &so);
	ck_assert_int_eq(greeting_start_ok(g, &so, in, len, to_client), 0);
	ck_assert_uint_eq(evbuffer_get_length(in), 0);
	tune = take(to_client, AMQP_CONNECTION_TUNE_METHOD);
	ck_assert_int_eq(tune->channel_max, GREETING_CHANNEL_MAX);
	ck_assert_uint_eq(tune->frame_max, GREETING_FRAME_MAX);
	ck_assert_int_eq(tune->heartbeat, GREETING_HEARTBEAT_S);

	len = client_frame(in, AMQP_CONNECTION_TUNE_OK_METHOD, &tok);
	ck_assert_int_eq(greeting_tune_ok(g, &tok, in, len), 0);
	ck_assert_uint_eq(g->frame_max, 8192);
	ck_assert_int_eq(g->channel_max, GREETING_CHANNEL_MAX); /* 0: what was offered */
	ck_assert_int_eq(g->heartbeat, 30);

	memset(&open, 0, sizeof(open));
	open.virtual_host = amqp_cstring_bytes("v");
	len = client_frame(in, AMQP_CONNECTION_OPEN_METHOD, &open);
	ck_assert_int_eq(greeting_open(g, in, len), 0);

	/* The broker: the client's own start-ok, then tune-ok and open. */
	ck_assert_int_eq(greeting_broker_tune(g, &btune, to_broker, why, sizeof(why)), 320);
	ck_assert_int_eq(greeting_broker_start(g, to_broker), 0);
	replayed = take(to_broker, AMQP_CONNECTION_START_OK_METHOD);
	ck_assert_int_eq((int)replayed->response.len, 12);
	ck_assert(memcmp(replayed->response.bytes, "\0guest\0guest", 12) == 0);
	btune.channel_max = 100;
	btune.frame_max = 131072;
	ck_assert_int_eq(greeting_broker_tune(g, &btune, to_broker, why, sizeof(why)), 0);
	sent = take(to_broker, AMQP_CONNECTION_TUNE_OK_METHOD);
	ck_assert_int_eq(sent->channel_max, 100); /* the lower of the two */
	ck_assert_uint_eq(sent->frame_max, 8192);
	ck_assert_int_eq(sent->heartbeat, 30);
	take(to_broker, AMQP_CONNECTION_OPEN_METHOD);
	ck_assert_uint_eq(evbuffer_get_length(to_broker), 0);

	greeting_free(g);
	evbuffer_free(in);
	evbuffer_free(to_client);
	evbuffer_free(to_broker);
	empty_amqp_pool(&pool);
}
END_TEST

START_TEST(refusals)
{
	struct greeting *g = greeting_new();
	struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
	amqp_connection_start_ok_t ext = start_ok("EXTERNAL"), plain = start_ok("AMQPLAIN");
	amqp_connection_tune_ok_t tok = {0, 0, 0};
	amqp_connection_tune_t small = {2047, 4096, 60};
	char why[256];
	size_t len;

	ck_assert_int_eq(greeting_start(g, out), 0);
	len = client_frame(in, AMQP_CONNECTION_START_OK_METHOD, &ext);
	ck_assert_int_eq(greeting_start_ok(g, &ext, in, len, out), -1);
	evbuffer_drain(in, len);
	len = client_frame(in, AMQP_CONNECTION_START_OK_METHOD, &plain);
	ck_assert_int_eq(greeting_start_ok(g, &plain, in, len, out), 0);
	/* A second start-ok is out of order. */
	len = client_frame(in, AMQP_CONNECTION_START_OK_METHOD, &plain);
	ck_assert_int_eq(greeting_start_ok(g, &plain, in, len, out), -1);
	evbuffer_drain(in, len);
	len = client_frame(in, AMQP_CONNECTION_TUNE_OK_METHOD, &tok);
	ck_assert_int_eq(greeting_tune_ok(g, &tok, in, len), 0);
	ck_assert_uint_eq(g->frame_max, GREETING_FRAME_MAX); /* 0: what was offered */
	evbuffer_add(in, "x", 1);
	ck_assert_int_eq(greeting_open(g, in, 1), 0);
	ck_assert_int_eq(greeting_broker_start(g, out), 0);
	/* A broker whose frame_max is below the client's: refused, with why. */
	ck_assert_int_eq(greeting_broker_tune(g, &small, out, why, sizeof(why)), 530);
	ck_assert_msg(strstr(why, "NOT_ALLOWED - the broker's frame_max (4096)") != NULL, "%s",
		      why);
	greeting_free(g);
	evbuffer_free(in);
	evbuffer_free(out);
}
END_TEST

/* The value of a longstr property, or "". */
static const char *prop(const amqp_table_t *t, const char *key, char *buf, size_t len)
{
	int i;

	buf[0] = '\0';
	for (i = 0; i < t->num_entries; i++)
		if (t->entries[i].key.len == strlen(key) &&
		    memcmp(t->entries[i].key.bytes, key, strlen(key)) == 0 &&
		    t->entries[i].value.kind == AMQP_FIELD_KIND_UTF8)
			snprintf(buf, len, "%.*s", (int)t->entries[i].value.value.bytes.len,
				 (const char *)t->entries[i].value.value.bytes.bytes);
	return buf;
}

static amqp_table_entry_t text(const char *key, const char *value)
{
	amqp_table_entry_t e;

	e.key = amqp_cstring_bytes(key);
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes = amqp_cstring_bytes(value);
	return e;
}

/* What a new client is shown: its product property. */
static const char *shown(char *buf, size_t len)
{
	struct greeting *g = greeting_new();
	struct evbuffer *out = evbuffer_new();
	amqp_connection_start_t *st;

	ck_assert_int_eq(greeting_start(g, out), 0);
	st = take(out, AMQP_CONNECTION_START_METHOD);
	ck_assert_int_eq((int)st->mechanisms.len, 14);
	ck_assert(memcmp(st->mechanisms.bytes, "PLAIN AMQPLAIN", 14) == 0);
	prop(&st->server_properties, "product", buf, len);
	greeting_free(g);
	evbuffer_free(out);
	return buf;
}

static void learn(int node, const char *product, const char *version)
{
	amqp_table_entry_t e[2] = {text("product", product), text("version", version)};
	amqp_table_t t = {2, e};

	greeting_learn(node, &t);
}

static int resumed;
static void *resumed_owner;

static void resume(void *owner)
{
	resumed++;
	resumed_owner = owner;
}

/* Nodes 0 and 1 form the global list, node 2 a vhost's. */
START_TEST(learned_properties)
{
	struct sockaddr_in sa;
	struct worker w;
	amqp_table_entry_t e[2] = {text("product", "RabbitMQ"), text("version", "3.10.8")};
	amqp_connection_start_t *st;
	struct evbuffer *out = evbuffer_new();
	struct greeting *g = greeting_new(), *gone;
	char buf[64], err[128];

	init_amqp_pool(&pool, 4096);
	ck_assert_int_eq(worker_init(&w, 0), 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons(1);
	ck_assert_int_eq(upstream_add_sockaddr((struct sockaddr *)&sa, sizeof(sa), "a:1"), 0);
	sa.sin_port = htons(2);
	ck_assert_int_eq(upstream_add_sockaddr((struct sockaddr *)&sa, sizeof(sa), "b:2"), 0);
	ck_assert_int_eq(upstream_intern("127.0.0.1:3", err, sizeof(err)), 2);
	upstream_set_retry_ms(600000);

	/* Nothing known, nothing asked: the proxy's own, at once. */
	ck_assert_int_eq(greeting_await(g, &w, resume, g), -1);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "acemq-proxy");

	/* The vhost's node asked for the first time: a client waits, and goes
	 * on once it answered; it is shown that node's properties. A client
	 * that went meanwhile is not resumed, whether it went before the
	 * answer or after it, its resumption on its way. */
	greeting_use_nodes(0x7);
	greeting_asking(2);
	ck_assert_int_eq(g->phase, GREETING_WAITING);
	ck_assert_int_eq(greeting_await(g, &w, resume, g), 0);
	gone = greeting_new();
	ck_assert_int_eq(greeting_await(gone, &w, resume, gone), 0);
	greeting_free(gone);
	gone = greeting_new();
	ck_assert_int_eq(greeting_await(gone, &w, resume, gone), 0);
	worker_run_posted(&w);
	ck_assert_int_eq(resumed, 0);
	learn(2, "RabbitMQ-vhost", "1");
	greeting_free(gone);
	worker_run_posted(&w);
	ck_assert_int_eq(resumed, 1);
	ck_assert_ptr_eq(resumed_owner, g);
	ck_assert_ptr_null(g->waiter);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ-vhost");
	/* Not in a list in force any more: not shown. */
	greeting_use_nodes(0x3);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "acemq-proxy");
	greeting_use_nodes(0x7);

	/* A node of the global list being asked comes first: clients wait
	 * for it, and when it gives up they see what is known. */
	greeting_asking(1);
	ck_assert_int_eq(greeting_await(g, &w, resume, g), 0);
	gone = greeting_new();
	ck_assert_int_eq(greeting_await(gone, &w, resume, gone), 0);
	greeting_unanswered(1);
	worker_run_posted(&w);
	ck_assert_int_eq(resumed, 3);
	ck_assert_int_eq(greeting_await(g, &w, resume, g), -1);
	greeting_free(gone);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ-vhost");

	/* The global list's broker, whole, with the proxy's mechanisms. */
	greeting_learn(1, &(amqp_table_t){2, e});
	ck_assert_int_eq(greeting_start(g, out), 0);
	st = take(out, AMQP_CONNECTION_START_METHOD);
	ck_assert_int_eq(st->server_properties.num_entries, 2);
	ck_assert_str_eq(prop(&st->server_properties, "product", buf, sizeof(buf)), "RabbitMQ");
	ck_assert_str_eq(prop(&st->server_properties, "version", buf, sizeof(buf)), "3.10.8");

	/* Its first node, in the order clients are sent: node 0, while it is
	 * not marked down. */
	learn(0, "RabbitMQ-first", "2");
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ-first");
	upstream_failed(0);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ");
	upstream_ok(0);
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ-first");
	/* What a node announces changes with it. */
	learn(0, "RabbitMQ-upgraded", "3");
	ck_assert_str_eq(shown(buf, sizeof(buf)), "RabbitMQ-upgraded");

	greeting_free(g);
	evbuffer_free(out);
	worker_fini(&w);
	empty_amqp_pool(&pool);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, whole_handshake);
	tcase_add_test(tc, refusals);
	tcase_add_test(tc, learned_properties); /* last: it learns for the process */
	return unit_run("greeting", tc, 0);
}
