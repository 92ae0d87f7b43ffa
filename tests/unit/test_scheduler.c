/* test_scheduler: the scheduler as the engine's client, driven through a
 * link of the test's own (no broker): the ladder's declarations, what
 * becomes of each message from the control queue (dropped, hopped,
 * delivered, put back into the 1 s rung, refused), returns and confirms,
 * exchanges marked suspect after the publish channel closed, and its
 * counters. */
#include "amqp/table.h"
#include "src/engine.h"
#include "src/patterns/ladder.h"
#include "src/patterns/scheduler.h"
#include "src/rules.h"
#include "src/store/state.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXREC 16

/* What the scheduler asked of its link. */
struct published {
	char exchange[128], routing_key[128];
	uint64_t input;
	int kind;
	int64_t data;
	struct ladder_plan plan; /* of the properties it was published with */
	char plan_exchange[128];
	int has_schedule_headers;
	char content_type[64];
};

static struct {
	uint64_t acks[MAXREC];
	int nacks;
	struct published pubs[MAXREC];
	int npubs;
	char decl[32][160];
	int ndecl;
	int exists_calls;
	int exists_answer; /* what exchange_exists says */
	int fail_at_decl;  /* declaration number that fails (0: none) */
	int redeclares;
} rec;

static void copy_bytes(char *dst, size_t size, amqp_bytes_t b)
{
	size_t n = b.len < size - 1 ? b.len : size - 1;

	memcpy(dst, b.bytes, n);
	dst[n] = '\0';
}

static int fake_ack(const struct engine_link *l, uint64_t tag)
{
	(void)l;
	ck_assert_int_lt(rec.nacks, MAXREC);
	rec.acks[rec.nacks++] = tag;
	return 0;
}

static int fake_publish(const struct engine_link *l, const struct engine_publish *p)
{
	struct published *r;
	amqp_bytes_t ct;

	(void)l;
	ck_assert_int_lt(rec.npubs, MAXREC);
	r = &rec.pubs[rec.npubs++];
	copy_bytes(r->exchange, sizeof(r->exchange), p->exchange);
	copy_bytes(r->routing_key, sizeof(r->routing_key), p->routing_key);
	r->input = p->input;
	r->kind = p->kind;
	r->data = p->data;
	ladder_plan(p->props, (int64_t)state_now_ms(), &r->plan);
	if (r->plan.action == LADDER_DELIVER)
		copy_bytes(r->plan_exchange, sizeof(r->plan_exchange), r->plan.exchange);
	r->has_schedule_headers = (p->props->_flags & AMQP_BASIC_HEADERS_FLAG) &&
				  table_find(&p->props->headers, LADDER_H_EXCHANGE) >= 0;
	if (p->props->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG) {
		ct = p->props->content_type;
		copy_bytes(r->content_type, sizeof(r->content_type), ct);
	}
	return 0;
}

static int fake_exists(const struct engine_link *l, amqp_bytes_t name)
{
	(void)l;
	(void)name;
	rec.exists_calls++;
	return rec.exists_answer;
}

static int fake_decl(const char *text)
{
	ck_assert_int_lt(rec.ndecl, 32);
	snprintf(rec.decl[rec.ndecl], sizeof(rec.decl[0]), "%s", text);
	rec.ndecl++;
	return rec.fail_at_decl == rec.ndecl ? -1 : 0;
}

static int fake_declare_exchange(const struct engine_link *l, const char *name,
				 const char *type, const char *what)
{
	char t[160];

	(void)l;
	(void)what;
	snprintf(t, sizeof(t), "exchange %s %s", name, type);
	return fake_decl(t);
}

static int fake_declare_queue(const struct engine_link *l, const char *name, amqp_table_t args,
			      const char *what)
{
	char t[160];
	int i = table_find(&args, "x-message-ttl");
	amqp_bytes_t dlx = {0, NULL}, dlrk = {0, NULL};

	(void)l;
	(void)what;
	table_get_string(&args, "x-dead-letter-exchange", &dlx);
	table_get_string(&args, "x-dead-letter-routing-key", &dlrk);
	snprintf(t, sizeof(t), "queue %s ttl=%lld dlx=%.*s dlrk=%.*s n=%d", name,
		 i >= 0 ? (long long)args.entries[i].value.value.i64 : -1LL, (int)dlx.len,
		 dlx.bytes ? (const char *)dlx.bytes : "", (int)dlrk.len,
		 dlrk.bytes ? (const char *)dlrk.bytes : "", args.num_entries);
	return fake_decl(t);
}

static int fake_bind_queue(const struct engine_link *l, const char *queue, const char *exchange,
			   const char *routing_key, const char *what)
{
	char t[160];

	(void)l;
	(void)what;
	snprintf(t, sizeof(t), "bind %s %s %s", queue, exchange, routing_key);
	return fake_decl(t);
}

static void fake_redeclare(const struct engine_link *l)
{
	(void)l;
	rec.redeclares++;
}

static const struct engine_link link_ = {
    .vhost = "/",
    .ack = fake_ack,
    .publish = fake_publish,
    .exchange_exists = fake_exists,
    .declare_exchange = fake_declare_exchange,
    .declare_queue = fake_declare_queue,
    .bind_queue = fake_bind_queue,
    .redeclare = fake_redeclare,
};

static const struct engine_client *client = &scheduler_client;
static void *st;
static struct rules *rules;
static char dir[64];

static struct rules *load_rules(const char *text)
{
	char path[128];
	FILE *f;
	int nerr = 0;
	struct rules *r;

	strcpy(dir, "/tmp/acemq-sched-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/root.json", dir);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	r = rules_load(dir, stderr, &nerr);
	ck_assert_ptr_nonnull(r);
	unlink(path);
	rmdir(dir);
	return r;
}

#define RULES                                                                           \
	"{\"vhost\": \"/\", \"schedule\": {\"match\": [{\"exchange\": \"allowed-x\"}, " \
	"{\"exchange\": \"\", \"routing_key\": \"q.#\"}], \"engine\": %s}}"

static void setup(void)
{
	char text[512];

	memset(&rec, 0, sizeof(rec));
	rec.exists_answer = 1;
	snprintf(text, sizeof(text), RULES, "true");
	rules = load_rules(text);
	st = client->attach(&link_);
	ck_assert_ptr_nonnull(st);
	ck_assert_uint_eq(client->sync(st, rules), ENGINE_WANT_DECLARE | ENGINE_WANT_CONSUME);
}

static void teardown(void)
{
	client->detach(st);
	rules_unref(rules);
}

/* A message as the control queue gives it: scheduled for exchange and
 * routing key, due in due_in ms (negative: overdue). */
static void make(amqp_message_t *m, const char *exchange, const char *rk, int64_t due_in)
{
	memset(m, 0, sizeof(*m));
	init_amqp_pool(&m->pool, 4096);
	m->properties._flags = AMQP_BASIC_CONTENT_TYPE_FLAG;
	m->properties.content_type = amqp_cstring_bytes("application/json");
	m->body = amqp_cstring_bytes("{}");
	ck_assert_int_eq(ladder_rewrite(&m->properties, &m->pool, amqp_cstring_bytes(exchange),
					amqp_cstring_bytes(rk), "x-delay",
					(int64_t)state_now_ms() + due_in),
			 0);
	/* What the ladder's queues do to it on the way. */
	m->properties.content_type = amqp_cstring_bytes("changed/by-ladder");
}

static void unmake(amqp_message_t *m)
{
	empty_amqp_pool(&m->pool);
}

/* The stats member's text, for looking counters up. */
static char stats[4096];

static const char *stats_of(void)
{
	struct evbuffer *b = evbuffer_new();

	client->stats_json(st, b);
	return unit_text(b, stats, sizeof(stats));
}

static long long counter(const char *name)
{
	char key[64];
	const char *p;

	snprintf(key, sizeof(key), "\"%s\": ", name);
	p = strstr(stats_of(), key);
	ck_assert_msg(p != NULL, "%s not in %s", name, stats);
	return atoll(p + strlen(key));
}

/* Deliveries in the lateness buckets, all together. */
static long long late_total(void)
{
	const char *p = strstr(stats_of(), "\"lateness_ms\": {");
	long long n = 0;

	ck_assert_ptr_nonnull(p);
	while ((p = strstr(p, ": ")) != NULL) {
		p += 2;
		n += atoll(p);
	}
	return n;
}

START_TEST(test_sync_wants)
{
	char text[512];
	struct rules *r;

	snprintf(text, sizeof(text), RULES, "false");
	r = load_rules(text);
	ck_assert_uint_eq(client->sync(st, r), ENGINE_WANT_DECLARE);
	ck_assert(client->needs(rules_vhost(r, "/")));
	rules_unref(r);
	r = load_rules("{\"vhost\": \"/\", \"reply_to\": {\"enabled\": true}}");
	ck_assert_uint_eq(client->sync(st, r), 0);
	ck_assert(!client->needs(rules_vhost(r, "/")));
	rules_unref(r);
	ck_assert_uint_eq(client->sync(st, NULL), 0);
}
END_TEST

/* The ladder's declarations, exactly as the contract has them. */
START_TEST(test_declare)
{
	static const char *const want[] = {
	    "exchange acemq.schedule direct",
	    "queue acemq.schedule.1h ttl=3600000 dlx=acemq.schedule dlrk=acemq.schedule.due "
	    "n=3",
	    "bind acemq.schedule.1h acemq.schedule acemq.schedule.1h",
	    "queue acemq.schedule.10m ttl=600000 dlx=acemq.schedule dlrk=acemq.schedule.due "
	    "n=3",
	    "bind acemq.schedule.10m acemq.schedule acemq.schedule.10m",
	    "queue acemq.schedule.1m ttl=60000 dlx=acemq.schedule dlrk=acemq.schedule.due n=3",
	    "bind acemq.schedule.1m acemq.schedule acemq.schedule.1m",
	    "queue acemq.schedule.10s ttl=10000 dlx=acemq.schedule dlrk=acemq.schedule.due n=3",
	    "bind acemq.schedule.10s acemq.schedule acemq.schedule.10s",
	    "queue acemq.schedule.1s ttl=1000 dlx=acemq.schedule dlrk=acemq.schedule.due n=3",
	    "bind acemq.schedule.1s acemq.schedule acemq.schedule.1s",
	    "queue acemq.schedule.due ttl=-1 dlx= dlrk= n=0",
	    "bind acemq.schedule.due acemq.schedule acemq.schedule.due",
	};
	size_t i;

	ck_assert_str_eq(client->queue, "acemq.schedule.due");
	ck_assert_int_eq(client->prefetch, 256);
	/* A failed step: not ready. */
	rec.fail_at_decl = 4;
	ck_assert_int_eq(client->declare(st), -1);
	ck_assert_int_eq(counter("ladder_ready"), 0);
	rec.ndecl = 0;
	rec.fail_at_decl = 0;
	ck_assert_int_eq(client->declare(st), 0);
	ck_assert_int_eq(rec.ndecl, (int)(sizeof(want) / sizeof(want[0])));
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_str_eq(rec.decl[i], want[i]);
	ck_assert_int_eq(counter("ladder_ready"), 1);
}
END_TEST

/* Without the scheduling headers: acknowledged (dropped) and counted. */
START_TEST(test_malformed)
{
	amqp_message_t m;

	memset(&m, 0, sizeof(m));
	init_amqp_pool(&m.pool, 512);
	ck_assert_int_eq(client->message(st, 7, &m), 0);
	ck_assert_int_eq(rec.nacks, 1);
	ck_assert_uint_eq(rec.acks[0], 7);
	ck_assert_int_eq(rec.npubs, 0);
	ck_assert_int_eq(counter("malformed"), 1);
	unmake(&m);
}
END_TEST

/* Not yet due: into the largest rung that does not overshoot, with the
 * input; counted as a hop once confirmed. */
START_TEST(test_hop)
{
	amqp_message_t m;
	struct engine_sent s = {0};

	make(&m, "allowed-x", "k", 90000);
	ck_assert_int_eq(client->message(st, 9, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.nacks, 0);
	ck_assert_int_eq(rec.npubs, 1);
	ck_assert_str_eq(rec.pubs[0].exchange, "acemq.schedule");
	ck_assert_str_eq(rec.pubs[0].routing_key, "acemq.schedule.1m");
	ck_assert_uint_eq(rec.pubs[0].input, 9);
	ck_assert(rec.pubs[0].has_schedule_headers);
	ck_assert_int_eq(rec.exists_calls, 0);
	s.kind = rec.pubs[0].kind;
	s.data = rec.pubs[0].data;
	s.input = 9;
	ck_assert_int_eq(counter("hops"), 0);
	ck_assert_int_eq(client->settled(st, &s, ENGINE_OK), 0);
	ck_assert_int_eq(counter("hops"), 1);
	/* Refused: nothing counted, the ladder still taken as there. */
	ck_assert_int_eq(client->settled(st, &s, ENGINE_NACKED), 0);
	ck_assert_int_eq(counter("hops"), 1);
	ck_assert_int_eq(rec.redeclares, 0);
}
END_TEST

/* Due: to its target with the final properties; the exchange is looked at
 * once and then remembered; delivered and its lateness counted once
 * confirmed. */
START_TEST(test_deliver)
{
	amqp_message_t m;
	struct engine_sent s = {0};

	make(&m, "allowed-x", "k.1", -30);
	ck_assert_int_eq(client->message(st, 11, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 1);
	ck_assert_str_eq(rec.pubs[0].exchange, "allowed-x");
	ck_assert_str_eq(rec.pubs[0].routing_key, "k.1");
	ck_assert_uint_eq(rec.pubs[0].input, 11);
	ck_assert(!rec.pubs[0].has_schedule_headers);
	ck_assert_str_eq(rec.pubs[0].content_type, "application/json");
	ck_assert_int_eq(rec.exists_calls, 1);
	s.kind = rec.pubs[0].kind;
	s.data = rec.pubs[0].data;
	s.input = 11;
	ck_assert_int_eq(client->settled(st, &s, ENGINE_OK), 0);
	ck_assert_int_eq(counter("delivered"), 1);
	ck_assert_int_eq(late_total(), 1);

	/* The default exchange is never looked at; a known one not again. */
	make(&m, "", "q.a", 0);
	ck_assert_int_eq(client->message(st, 12, &m), 0);
	unmake(&m);
	make(&m, "allowed-x", "k.2", 0);
	ck_assert_int_eq(client->message(st, 13, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 3);
	ck_assert_str_eq(rec.pubs[1].exchange, "");
	ck_assert_str_eq(rec.pubs[1].routing_key, "q.a");
	ck_assert_str_eq(rec.pubs[2].exchange, "allowed-x");
	ck_assert_int_eq(rec.exists_calls, 1);
}
END_TEST

/* Due, but no schedule rule allows the target: dropped and counted. */
START_TEST(test_forbidden)
{
	amqp_message_t m;

	make(&m, "elsewhere", "k", -1);
	ck_assert_int_eq(client->message(st, 21, &m), 0);
	unmake(&m);
	make(&m, "", "not-q.a", -1);
	ck_assert_int_eq(client->message(st, 22, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 0);
	ck_assert_int_eq(rec.nacks, 2);
	ck_assert_uint_eq(rec.acks[1], 22);
	ck_assert_int_eq(counter("forbidden"), 2);
	ck_assert_int_eq(rec.exists_calls, 0);
}
END_TEST

/* A target exchange that is not there: back into the 1 s rung, with the
 * scheduling headers kept; asked again next time (a missing exchange is
 * not remembered). */
START_TEST(test_missing_exchange)
{
	amqp_message_t m;

	rec.exists_answer = 0;
	make(&m, "allowed-x", "k", -5);
	ck_assert_int_eq(client->message(st, 31, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 1);
	ck_assert_str_eq(rec.pubs[0].exchange, "acemq.schedule");
	ck_assert_str_eq(rec.pubs[0].routing_key, "acemq.schedule.1s");
	ck_assert_uint_eq(rec.pubs[0].input, 31);
	ck_assert_int_eq(rec.pubs[0].plan.action, LADDER_DELIVER);
	ck_assert_str_eq(rec.pubs[0].plan_exchange, "allowed-x");
	ck_assert_int_eq(counter("unroutable"), 1);
	make(&m, "allowed-x", "k", -5);
	ck_assert_int_eq(client->message(st, 32, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.exists_calls, 2);
	/* The connection failed while asking: the callback fails. */
	rec.exists_answer = -1;
	make(&m, "allowed-x", "k", -5);
	ck_assert_int_eq(client->message(st, 33, &m), -1);
	unmake(&m);
}
END_TEST

/* A delivery the broker returned: into the 1 s rung again, rebuilt from
 * what came back, its input handed on; the original's confirm then
 * settles nothing. */
START_TEST(test_returned_delivery)
{
	amqp_message_t m, back;
	struct engine_sent s = {0};

	make(&m, "allowed-x", "k", -1);
	ck_assert_int_eq(client->message(st, 41, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 1);
	s.kind = rec.pubs[0].kind;
	s.data = rec.pubs[0].data;
	s.input = 41;
	s.exchange = amqp_cstring_bytes("allowed-x");
	s.routing_key = amqp_cstring_bytes("k");
	s.returned = 1;
	/* What the broker returns: the final properties. */
	memset(&back, 0, sizeof(back));
	init_amqp_pool(&back.pool, 1024);
	back.properties._flags = AMQP_BASIC_CONTENT_TYPE_FLAG;
	back.properties.content_type = amqp_cstring_bytes("application/json");
	back.body = amqp_cstring_bytes("{}");
	ck_assert_int_eq(client->returned(st, &s, &back), 0);
	unmake(&back);
	ck_assert_uint_eq(s.input, 0);
	ck_assert_int_eq(rec.npubs, 2);
	ck_assert_str_eq(rec.pubs[1].exchange, "acemq.schedule");
	ck_assert_str_eq(rec.pubs[1].routing_key, "acemq.schedule.1s");
	ck_assert_uint_eq(rec.pubs[1].input, 41);
	ck_assert_int_eq(rec.pubs[1].plan.action, LADDER_DELIVER);
	ck_assert_str_eq(rec.pubs[1].plan_exchange, "allowed-x");
	ck_assert_int_eq(counter("unroutable"), 1);
	ck_assert_int_eq(client->settled(st, &s, ENGINE_RETURNED), 0);
	ck_assert_int_eq(counter("delivered"), 0);
	ck_assert_int_eq(rec.redeclares, 0);
}
END_TEST

/* A hop the ladder could not take (a rung gone): the ladder is declared
 * again, and not taken as ready meanwhile. */
START_TEST(test_returned_hop)
{
	amqp_message_t back;
	struct engine_sent s = {0};

	ck_assert_int_eq(client->declare(st), 0);
	ck_assert_int_eq(counter("ladder_ready"), 1);
	make(&back, "allowed-x", "k", 90000);
	ck_assert_int_eq(client->message(st, 51, &back), 0);
	s.kind = rec.pubs[0].kind;
	s.input = 51;
	s.exchange = amqp_cstring_bytes("acemq.schedule");
	s.routing_key = amqp_cstring_bytes("acemq.schedule.1m");
	s.returned = 1;
	ck_assert_int_eq(client->returned(st, &s, &back), 0);
	unmake(&back);
	ck_assert_int_eq(rec.npubs, 1); /* nothing published for it */
	ck_assert_uint_eq(s.input, 51);
	ck_assert_int_eq(client->settled(st, &s, ENGINE_RETURNED), 0);
	ck_assert_int_eq(rec.redeclares, 1);
	ck_assert_int_eq(counter("ladder_ready"), 0);
	ck_assert_int_eq(counter("hops"), 0);
}
END_TEST

/* The publish channel closed with a delivery out: its exchange is suspect
 * for a while, and due messages for it go into the 1 s rung without
 * asking. A hop out when it closed marks nothing. */
START_TEST(test_suspect_after_close)
{
	amqp_message_t m;
	struct engine_sent s = {0};

	make(&m, "allowed-x", "k", 90000);
	ck_assert_int_eq(client->message(st, 60, &m), 0);
	unmake(&m);
	s.kind = rec.pubs[0].kind;
	s.exchange = amqp_cstring_bytes("allowed-x");
	client->publish_closed(st, &s);

	make(&m, "allowed-x", "k", -1);
	ck_assert_int_eq(client->message(st, 61, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.exists_calls, 1);
	ck_assert_str_eq(rec.pubs[1].exchange, "allowed-x");
	memset(&s, 0, sizeof(s));
	s.kind = rec.pubs[1].kind;
	s.input = 61;
	s.exchange = amqp_cstring_bytes("allowed-x");
	s.routing_key = amqp_cstring_bytes("k");
	client->publish_closed(st, &s);

	make(&m, "allowed-x", "k", -1);
	ck_assert_int_eq(client->message(st, 62, &m), 0);
	unmake(&m);
	ck_assert_int_eq(rec.npubs, 3);
	ck_assert_str_eq(rec.pubs[2].exchange, "acemq.schedule");
	ck_assert_str_eq(rec.pubs[2].routing_key, "acemq.schedule.1s");
	ck_assert_uint_eq(rec.pubs[2].input, 62);
	ck_assert_int_eq(rec.exists_calls, 1);
	ck_assert_int_eq(counter("unroutable"), 1);
}
END_TEST

/* Every counter and the lateness buckets are in the stats member. */
START_TEST(test_stats_names)
{
	static const char *const names[] = {"ladder_ready", "scheduled", "sched_now",
					    "sched_bad",    "delivered", "hops",
					    "malformed",    "forbidden", "unroutable"};
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		ck_assert_int_eq(counter(names[i]), 0);
	ck_assert(strstr(stats_of(), "\"lateness_ms\": {\"le_50\": 0, ") != NULL);
	ck_assert(strstr(stats_of(), "\"le_60000\": 0, \"more\": 0}") != NULL);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("scheduler");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_sync_wants);
	tcase_add_test(tc, test_declare);
	tcase_add_test(tc, test_malformed);
	tcase_add_test(tc, test_hop);
	tcase_add_test(tc, test_deliver);
	tcase_add_test(tc, test_forbidden);
	tcase_add_test(tc, test_missing_exchange);
	tcase_add_test(tc, test_returned_delivery);
	tcase_add_test(tc, test_returned_hop);
	tcase_add_test(tc, test_suspect_after_close);
	tcase_add_test(tc, test_stats_names);
	return unit_run("scheduler", tc, 0);
}
