/* test_ladder: the schedule ladder's contract: rung choice (hop sequences),
 * the delay header's kinds, the publish rewrite, the scheduler's plan for
 * a message from the control queue, and the final properties. */
#include "tests/unit/unit.h"

#include "amqp/table.h"
#include "src/patterns/ladder.h"
#include "src/store/delayed.h"

#include <check.h>
#include <string.h>

/* The rungs a message with delay_ms passes through, as "1h,1h,..." */
static void hops(int64_t delay_ms, char *out, size_t len)
{
	int64_t left = delay_ms;

	out[0] = '\0';
	do {
		const struct ladder_rung *r = ladder_rung_for(left);
		const char *name = r->queue + strlen("acemq.schedule.");

		if (out[0])
			strncat(out, ",", len - strlen(out) - 1);
		strncat(out, name, len - strlen(out) - 1);
		left -= r->ttl_ms;
	} while (left > 0);
}

START_TEST(test_rungs)
{
	char seq[256];

	hops(4 * 3600 * 1000LL, seq, sizeof(seq));
	ck_assert_str_eq(seq, "1h,1h,1h,1h");
	hops(90 * 1000, seq, sizeof(seq));
	ck_assert_str_eq(seq, "1m,10s,10s,10s");
	hops(400, seq, sizeof(seq));
	ck_assert_str_eq(seq, "1s");
	hops(3000, seq, sizeof(seq));
	ck_assert_str_eq(seq, "1s,1s,1s");
	hops(3600 * 1000LL + 1, seq, sizeof(seq));
	ck_assert_str_eq(seq, "1h,1s");
	ck_assert_str_eq(ladder_rung_for(600000)->queue, "acemq.schedule.10m");
	ck_assert_str_eq(ladder_rung_for(599999)->queue, "acemq.schedule.1m");
	ck_assert_str_eq(ladder_smallest()->queue, "acemq.schedule.1s");
	/* The contract's TTLs. */
	ck_assert_int_eq(ladder_rungs[0].ttl_ms, 3600000);
	ck_assert_int_eq(ladder_rungs[1].ttl_ms, 600000);
	ck_assert_int_eq(ladder_rungs[2].ttl_ms, 60000);
	ck_assert_int_eq(ladder_rungs[3].ttl_ms, 10000);
	ck_assert_int_eq(ladder_rungs[4].ttl_ms, 1000);
}
END_TEST

static amqp_table_entry_t ent[8];

static amqp_table_t one(amqp_field_value_t v)
{
	amqp_table_t t = {1, ent};

	ent[0].key = amqp_cstring_bytes("x-delay");
	ent[0].value = v;
	return t;
}

static enum ladder_delay delay_of(amqp_field_value_t v, int64_t *ms)
{
	amqp_table_t t = one(v);

	return ladder_delay(&t, "x-delay", ms);
}

START_TEST(test_delay_kinds)
{
	amqp_field_value_t v;
	amqp_table_t empty = {0, NULL};
	int64_t ms = 0;

	ck_assert_int_eq(ladder_delay(&empty, "x-delay", &ms), LADDER_DELAY_NONE);
	v.kind = AMQP_FIELD_KIND_I32;
	v.value.i32 = 3000;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_OK);
	ck_assert_int_eq(ms, 3000);
	v.kind = AMQP_FIELD_KIND_I64;
	v.value.i64 = 86400000LL * 365;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_OK);
	ck_assert_int_eq(ms, 86400000LL * 365);
	v.kind = AMQP_FIELD_KIND_U8;
	v.value.u8 = 7;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_OK);
	v.kind = AMQP_FIELD_KIND_I16;
	v.value.i16 = -5;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_NOW);
	v.kind = AMQP_FIELD_KIND_I32;
	v.value.i32 = 0;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_NOW);
	v.kind = AMQP_FIELD_KIND_U64;
	v.value.u64 = UINT64_MAX;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
	v.kind = AMQP_FIELD_KIND_UTF8;
	v.value.bytes = amqp_cstring_bytes("2500");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_OK);
	ck_assert_int_eq(ms, 2500);
	v.value.bytes = amqp_cstring_bytes("-1");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_NOW);
	v.value.bytes = amqp_cstring_bytes("soon");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
	v.value.bytes = amqp_cstring_bytes("12abc");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
	v.value.bytes = amqp_cstring_bytes("");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
	v.value.bytes = amqp_cstring_bytes("99999999999999999999999");
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
	v.kind = AMQP_FIELD_KIND_F64;
	v.value.f64 = 1500.2;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_OK);
	ck_assert_int_eq(ms, 1501); /* rounded up: never early */
	v.kind = AMQP_FIELD_KIND_BOOLEAN;
	v.value.boolean = 1;
	ck_assert_int_eq(delay_of(v, &ms), LADDER_DELAY_BAD);
}
END_TEST

static int64_t i64_of(const amqp_table_t *t, const char *key)
{
	int i = table_find(t, key);

	ck_assert_int_ge(i, 0);
	ck_assert_int_eq(t->entries[i].value.kind, AMQP_FIELD_KIND_I64);
	return t->entries[i].value.value.i64;
}

static void str_is(const amqp_table_t *t, const char *key, const char *want)
{
	amqp_bytes_t b;

	ck_assert_int_eq(table_get_string(t, key, &b), 0);
	ck_assert_int_eq(b.len, strlen(want));
	ck_assert(memcmp(b.bytes, want, b.len) == 0);
}

START_TEST(test_rewrite_plan_final)
{
	amqp_pool_t pool;
	amqp_basic_properties_t p;
	struct ladder_plan plan;
	amqp_field_value_t v;

	init_amqp_pool(&pool, 4096);
	memset(&p, 0, sizeof(p));
	p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG;
	p.content_type = amqp_cstring_bytes("application/json");
	v.kind = AMQP_FIELD_KIND_I32;
	v.value.i32 = 90000;
	p.headers = one(v);
	ent[1].key = amqp_cstring_bytes("other");
	ent[1].value.kind = AMQP_FIELD_KIND_UTF8;
	ent[1].value.value.bytes = amqp_cstring_bytes("kept");
	p.headers.num_entries = 2;

	ck_assert_int_eq(ladder_rewrite(&p, &pool, amqp_cstring_bytes("billing"),
					amqp_cstring_bytes("invoice.due"), "x-delay", 1000000),
			 0);
	ck_assert_int_eq(table_find(&p.headers, "x-delay"), -1);
	str_is(&p.headers, "other", "kept");
	str_is(&p.headers, LADDER_H_EXCHANGE, "billing");
	str_is(&p.headers, LADDER_H_ROUTING, "invoice.due");
	str_is(&p.headers, LADDER_H_CONTENT, "application/json");
	ck_assert_int_eq(i64_of(&p.headers, LADDER_H_DUE_AT), 1000000);
	ck_assert_int_eq(p.headers.num_entries, 5);

	/* Not yet due: the largest rung that does not overshoot. */
	ladder_plan(&p, 1000000 - 90000, &plan);
	ck_assert_int_eq(plan.action, LADDER_HOP);
	ck_assert_str_eq(plan.rung->queue, "acemq.schedule.1m");
	ladder_plan(&p, 1000000 - 400, &plan);
	ck_assert_int_eq(plan.action, LADDER_HOP);
	ck_assert_str_eq(plan.rung->queue, "acemq.schedule.1s");
	/* Due at or after due_at, never before. */
	ladder_plan(&p, 999999, &plan);
	ck_assert_int_eq(plan.action, LADDER_HOP);
	ladder_plan(&p, 1000000, &plan);
	ck_assert_int_eq(plan.action, LADDER_DELIVER);
	ck_assert_int_eq(plan.due_at, 1000000);
	ck_assert_int_eq(plan.exchange.len, 7);
	ck_assert(memcmp(plan.exchange.bytes, "billing", 7) == 0);

	/* The final properties: the four headers gone, the content type back. */
	p.content_type = amqp_cstring_bytes("changed/by-ladder");
	ck_assert_int_eq(ladder_final(&p, &pool), 0);
	ck_assert_int_eq(p.headers.num_entries, 1);
	str_is(&p.headers, "other", "kept");
	ck_assert_int_eq(p.content_type.len, strlen("application/json"));
	ck_assert(memcmp(p.content_type.bytes, "application/json", p.content_type.len) == 0);
	empty_amqp_pool(&pool);
}
END_TEST

/* The record's id travels with the message and its key parses back; the
 * delivered message does not carry it. */
START_TEST(test_id_travels_and_goes_on_delivery)
{
	amqp_basic_properties_t p;
	amqp_pool_t pool;
	struct ladder_plan plan;
	uint8_t key[DELAYED_KEY_LEN], back[DELAYED_KEY_LEN];
	char id[DELAYED_ID_LEN + 1];

	init_amqp_pool(&pool, 4096);
	memset(&p, 0, sizeof(p));
	delayed_key(key, 1700000000123LL, 0x0102030405060708ULL);
	delayed_id(id, key);
	ck_assert_str_eq(id, "0000018bcfe5687b0102030405060708");
	ck_assert_int_eq(delayed_key_due(key), 1700000000123LL);
	ck_assert(delayed_key_nonce(key) == 0x0102030405060708ULL);
	ck_assert_int_eq(delayed_parse_id(id, strlen(id), back), 0);
	ck_assert(memcmp(back, key, sizeof(key)) == 0);
	ck_assert_int_eq(delayed_parse_id(id, strlen(id) - 1, back), -1);
	ck_assert_int_eq(delayed_parse_id("0000018BCFE5687B0102030405060708", 32, back), -1);
	ck_assert_int_eq(delayed_parse_id("0000018bcfe5687b010203040506070g", 32, back), -1);
	ck_assert(delayed_nonce() != 0);
	{
		/* Drawn in batches: across several batches, none repeats. */
		uint64_t seen[300];
		int i, j;

		for (i = 0; i < 300; i++) {
			seen[i] = delayed_nonce();
			ck_assert(seen[i] != 0);
			for (j = 0; j < i; j++)
				ck_assert(seen[j] != seen[i]);
		}
	}

	ck_assert_int_eq(ladder_rewrite(&p, &pool, amqp_cstring_bytes(""),
					amqp_cstring_bytes("q"), "x-delay", 1700000000123LL),
			 0);
	ck_assert_int_eq(ladder_set_id(&p, &pool, amqp_cstring_bytes(id)), 0);
	ladder_plan(&p, 1700000000000LL, &plan);
	ck_assert_int_eq(plan.action, LADDER_HOP);
	ck_assert_int_eq(plan.id.len, DELAYED_ID_LEN);
	ck_assert(memcmp(plan.id.bytes, id, DELAYED_ID_LEN) == 0);
	ck_assert_int_eq(ladder_final(&p, &pool), 0);
	ck_assert_int_eq(table_find(&p.headers, LADDER_H_ID), -1);
	ck_assert_int_eq(p.headers.num_entries, 0);
	/* Without the id, a plan has none. */
	ck_assert_int_eq(ladder_rewrite(&p, &pool, amqp_cstring_bytes(""),
					amqp_cstring_bytes("q"), "x-delay", 5),
			 0);
	ladder_plan(&p, 6, &plan);
	ck_assert_int_eq(plan.action, LADDER_DELIVER);
	ck_assert_int_eq(plan.id.len, 0);
	empty_amqp_pool(&pool);
}
END_TEST

START_TEST(test_malformed_and_no_content_type)
{
	amqp_pool_t pool;
	amqp_basic_properties_t p;
	struct ladder_plan plan;

	init_amqp_pool(&pool, 4096);
	memset(&p, 0, sizeof(p));
	ladder_plan(&p, 0, &plan);
	ck_assert_int_eq(plan.action, LADDER_MALFORMED);

	/* A publish without a content type: none at the end either. */
	ck_assert_int_eq(
	    ladder_readd(&p, &pool, amqp_cstring_bytes(""), amqp_cstring_bytes("q"), 5), 0);
	str_is(&p.headers, LADDER_H_CONTENT, "");
	ladder_plan(&p, 5, &plan);
	ck_assert_int_eq(plan.action, LADDER_DELIVER);
	ck_assert_int_eq(plan.exchange.len, 0);
	ck_assert_int_eq(ladder_final(&p, &pool), 0);
	ck_assert(!(p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG));
	ck_assert_int_eq(p.headers.num_entries, 0);

	/* due-at of the wrong kind, or a missing target: malformed. */
	ck_assert_int_eq(
	    ladder_readd(&p, &pool, amqp_cstring_bytes("x"), amqp_cstring_bytes("q"), 5), 0);
	ck_assert_int_eq(
	    table_set_string(&p.headers, &pool, LADDER_H_DUE_AT, amqp_cstring_bytes("5")), 0);
	ladder_plan(&p, 5, &plan);
	ck_assert_int_eq(plan.action, LADDER_MALFORMED);
	ck_assert_int_eq(table_remove(&p.headers, LADDER_H_DUE_AT), 1);
	ladder_plan(&p, 5, &plan);
	ck_assert_int_eq(plan.action, LADDER_MALFORMED);
	empty_amqp_pool(&pool);
}
END_TEST

/* The ladder's own dead-letter history goes; anything else stays. */
START_TEST(test_final_forgets_ladder_deaths)
{
	amqp_pool_t pool;
	amqp_basic_properties_t p;
	amqp_table_entry_t d1[1], d2[1];
	amqp_field_value_t deaths[2];

	init_amqp_pool(&pool, 4096);
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(
	    ladder_readd(&p, &pool, amqp_cstring_bytes("x"), amqp_cstring_bytes("q"), 5), 0);
	d1[0].key = amqp_cstring_bytes("queue");
	d1[0].value.kind = AMQP_FIELD_KIND_UTF8;
	d1[0].value.value.bytes = amqp_cstring_bytes("acemq.schedule.1s");
	d2[0].key = amqp_cstring_bytes("queue");
	d2[0].value.kind = AMQP_FIELD_KIND_UTF8;
	d2[0].value.value.bytes = amqp_cstring_bytes("orders");
	deaths[0].kind = AMQP_FIELD_KIND_TABLE;
	deaths[0].value.table.num_entries = 1;
	deaths[0].value.table.entries = d1;
	deaths[1].kind = AMQP_FIELD_KIND_TABLE;
	deaths[1].value.table.num_entries = 1;
	deaths[1].value.table.entries = d2;
	{
		amqp_field_value_t a = {.kind = AMQP_FIELD_KIND_ARRAY};
		amqp_table_entry_t *n =
		    amqp_pool_alloc(&pool, (size_t)(p.headers.num_entries + 3) * sizeof(*n));

		a.value.array.num_entries = 2;
		a.value.array.entries = deaths;
		memcpy(n, p.headers.entries, (size_t)p.headers.num_entries * sizeof(*n));
		p.headers.entries = n;
		n[p.headers.num_entries].key = amqp_cstring_bytes("x-death");
		n[p.headers.num_entries++].value = a;
	}
	ck_assert_int_eq(table_set_string(&p.headers, &pool, "x-first-death-queue",
					  amqp_cstring_bytes("acemq.schedule.1s")),
			 0);
	ck_assert_int_eq(table_set_string(&p.headers, &pool, "x-first-death-reason",
					  amqp_cstring_bytes("expired")),
			 0);
	ck_assert_int_eq(ladder_final(&p, &pool), 0);
	ck_assert_int_eq(table_find(&p.headers, "x-first-death-queue"), -1);
	ck_assert_int_eq(table_find(&p.headers, "x-first-death-reason"), -1);
	{
		int i = table_find(&p.headers, "x-death");

		ck_assert_int_ge(i, 0);
		ck_assert_int_eq(p.headers.entries[i].value.value.array.num_entries, 1);
		str_is(&p.headers.entries[i].value.value.array.entries[0].value.table, "queue",
		       "orders");
	}
	empty_amqp_pool(&pool);
}
END_TEST

START_TEST(test_rung_args)
{
	amqp_table_entry_t e[3];
	amqp_table_t t = ladder_rung_args(&ladder_rungs[3], e);

	ck_assert_int_eq(t.num_entries, 3);
	ck_assert_int_eq(i64_of(&t, "x-message-ttl"), 10000);
	str_is(&t, "x-dead-letter-exchange", "acemq.schedule");
	str_is(&t, "x-dead-letter-routing-key", "acemq.schedule.due");
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("ladder");

	tcase_add_test(tc, test_rungs);
	tcase_add_test(tc, test_delay_kinds);
	tcase_add_test(tc, test_rewrite_plan_final);
	tcase_add_test(tc, test_id_travels_and_goes_on_delivery);
	tcase_add_test(tc, test_malformed_and_no_content_type);
	tcase_add_test(tc, test_final_forgets_ladder_deaths);
	tcase_add_test(tc, test_rung_args);
	return unit_run("ladder", tc, 0);
}
