/* test_reply_to: header/property normalisation on publish and delivery, and
 * the header-table edits it relies on. */
#include "amqp/content.h"
#include "amqp/table.h"
#include "src/patterns/reply_to.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static amqp_pool_t pool;
static amqp_table_entry_t entries[4];

static void setup(void)
{
	init_amqp_pool(&pool, 4096);
}

static void teardown(void)
{
	empty_amqp_pool(&pool);
}

static int bytes_is(amqp_bytes_t b, const char *s)
{
	return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
}

/* props with an optional reply-to and an optional header, plus one other
 * header of another type that must survive untouched. */
static void make(amqp_basic_properties_t *p, const char *prop, const char *head)
{
	int n = 0;

	memset(p, 0, sizeof(*p));
	entries[n].key = amqp_cstring_bytes("count");
	entries[n].value.kind = AMQP_FIELD_KIND_I32;
	entries[n++].value.value.i32 = 42;
	if (head) {
		entries[n].key = amqp_cstring_bytes(REPLY_TO_HEADER);
		entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
		entries[n++].value.value.bytes = amqp_cstring_bytes(head);
	}
	entries[n].key = amqp_cstring_bytes("stamp");
	entries[n].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
	entries[n++].value.value.u64 = 99;
	p->_flags = AMQP_BASIC_HEADERS_FLAG;
	p->headers.entries = entries;
	p->headers.num_entries = n;
	if (prop) {
		p->_flags |= AMQP_BASIC_REPLY_TO_FLAG;
		p->reply_to = amqp_cstring_bytes(prop);
	}
}

static const char *header_of(amqp_basic_properties_t *p)
{
	static char buf[256];
	amqp_bytes_t b;

	if (table_get_string(&p->headers, REPLY_TO_HEADER, &b) != 0)
		return NULL;
	snprintf(buf, sizeof(buf), "%.*s", (int)b.len, (char *)b.bytes);
	return buf;
}

static void others_intact(amqp_basic_properties_t *p)
{
	int i = table_find(&p->headers, "count");

	ck_assert_int_ge(i, 0);
	ck_assert_int_eq(p->headers.entries[i].value.kind, AMQP_FIELD_KIND_I32);
	ck_assert_int_eq(p->headers.entries[i].value.value.i32, 42);
	i = table_find(&p->headers, "stamp");
	ck_assert_int_ge(i, 0);
	ck_assert_int_eq(p->headers.entries[i].value.kind, AMQP_FIELD_KIND_TIMESTAMP);
}

START_TEST(property_only_adds_header)
{
	amqp_basic_properties_t p;

	make(&p, "replies", NULL);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_HEADER_ADDED);
	ck_assert_str_eq(header_of(&p), "replies");
	ck_assert(bytes_is(p.reply_to, "replies"));
	others_intact(&p);
	ck_assert_int_eq(table_find(&p.headers, REPLY_TO_HEADER), 2); /* appended */
}
END_TEST

START_TEST(header_only_sets_property)
{
	amqp_basic_properties_t p;

	make(&p, NULL, "answers");
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_PROPERTY_SET);
	ck_assert(p._flags & AMQP_BASIC_REPLY_TO_FLAG);
	ck_assert(bytes_is(p.reply_to, "answers"));
	others_intact(&p);
}
END_TEST

START_TEST(both_different_header_wins)
{
	amqp_basic_properties_t p;

	make(&p, "prop-q", "head-q");
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1),
			 REPLY_TO_PROPERTY_SET | REPLY_TO_MISMATCH);
	ck_assert(bytes_is(p.reply_to, "head-q"));
	ck_assert_str_eq(header_of(&p), "head-q");
}
END_TEST

START_TEST(agreeing_or_absent_untouched)
{
	amqp_basic_properties_t p;

	make(&p, "same", "same");
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_SAME);
	make(&p, NULL, NULL);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 0), REPLY_TO_SAME);
	memset(&p, 0, sizeof(p)); /* no headers table at all */
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_SAME);
	ck_assert_int_eq(p._flags, 0);
}
END_TEST

START_TEST(no_headers_table_gets_one)
{
	amqp_basic_properties_t p;

	memset(&p, 0, sizeof(p));
	p._flags = AMQP_BASIC_REPLY_TO_FLAG;
	p.reply_to = amqp_cstring_bytes("r");
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 0), REPLY_TO_HEADER_ADDED);
	ck_assert(p._flags & AMQP_BASIC_HEADERS_FLAG);
	ck_assert_int_eq(p.headers.num_entries, 1);
	ck_assert_str_eq(header_of(&p), "r");
}
END_TEST

START_TEST(direct_reply_to_on_publish)
{
	amqp_basic_properties_t p;

	/* The bare pseudo-queue is never copied into the header... */
	make(&p, REPLY_TO_DIRECT, NULL);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_SAME);
	ck_assert_ptr_null(header_of(&p));
	/* ...and a header holding it moves to the property only. */
	make(&p, NULL, REPLY_TO_DIRECT);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1),
			 REPLY_TO_HEADER_DROPPED | REPLY_TO_PROPERTY_SET);
	ck_assert_ptr_null(header_of(&p));
	ck_assert(bytes_is(p.reply_to, REPLY_TO_DIRECT));
	others_intact(&p);
	make(&p, REPLY_TO_DIRECT, REPLY_TO_DIRECT);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_HEADER_DROPPED);
	ck_assert_ptr_null(header_of(&p));
}
END_TEST

START_TEST(direct_reply_to_on_delivery)
{
	amqp_basic_properties_t p;
	const char *real = "amq.rabbitmq.reply-to.g1h2AA5yZXBseUAxMDAwMDAwMQAAAAAA.pQ==";

	/* The broker rewrote the property: the header gets the real name. */
	make(&p, real, NULL);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 0), REPLY_TO_HEADER_ADDED);
	ck_assert_str_eq(header_of(&p), real);
	/* Published elsewhere with the bare name in the header too. */
	make(&p, real, REPLY_TO_DIRECT);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 0), REPLY_TO_HEADER_ADDED);
	ck_assert_str_eq(header_of(&p), real);
	ck_assert(bytes_is(p.reply_to, real));
}
END_TEST

START_TEST(edited_table_encodes_others_identically)
{
	amqp_basic_properties_t p;
	struct evbuffer *before = evbuffer_new(), *after = evbuffer_new();
	amqp_basic_properties_t *back;
	unsigned char *raw;
	size_t len;

	make(&p, "r", NULL);
	ck_assert_int_eq(content_header_write(before, 1, 60, 0, &p), 0);
	reply_to_normalise(&p, &pool, 1);
	table_remove(&p.headers, REPLY_TO_HEADER);
	ck_assert_int_eq(content_header_write(after, 1, 60, 0, &p), 0);
	/* Adding then removing the header gives back the very same bytes. */
	len = evbuffer_get_length(before);
	ck_assert_uint_eq(evbuffer_get_length(after), len);
	ck_assert(memcmp(evbuffer_pullup(before, -1), evbuffer_pullup(after, -1), len) == 0);
	raw = evbuffer_pullup(after, -1);
	ck_assert_int_eq(content_props_decode(raw + 7, len - 8, &pool, &back), 0);
	ck_assert_int_eq(back->headers.num_entries, 2);
	evbuffer_free(before);
	evbuffer_free(after);
}
END_TEST

START_TEST(non_string_header_ignored)
{
	amqp_basic_properties_t p;

	amqp_bytes_t b;

	/* A header of that name that is not a string is no address: the
	 * property's value replaces it. */
	make(&p, "q", NULL);
	entries[0].key = amqp_cstring_bytes(REPLY_TO_HEADER); /* an int32 */
	ck_assert_int_eq(table_get_string(&p.headers, REPLY_TO_HEADER, &b), -1);
	ck_assert_int_eq(reply_to_normalise(&p, &pool, 1), REPLY_TO_HEADER_ADDED);
	ck_assert_str_eq(header_of(&p), "q");
	ck_assert_int_eq(p.headers.num_entries, 2);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, property_only_adds_header);
	tcase_add_test(tc, header_only_sets_property);
	tcase_add_test(tc, both_different_header_wins);
	tcase_add_test(tc, agreeing_or_absent_untouched);
	tcase_add_test(tc, no_headers_table_gets_one);
	tcase_add_test(tc, direct_reply_to_on_publish);
	tcase_add_test(tc, direct_reply_to_on_delivery);
	tcase_add_test(tc, edited_table_encodes_others_identically);
	tcase_add_test(tc, non_string_header_ignored);
	return unit_run("reply_to", tc, 1);
}
