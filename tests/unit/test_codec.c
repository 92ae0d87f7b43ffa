/* test_codec: method peek, method and property round trips through
 * rabbitmq-c's codec, and body re-framing at frame_max. */
#include "amqp/content.h"
#include "amqp/frame_scan.h"
#include "amqp/method.h"
#include "amqp/table.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static amqp_pool_t pool;

static void setup(void)
{
	init_amqp_pool(&pool, 4096);
}

static void teardown(void)
{
	empty_amqp_pool(&pool);
}

START_TEST(content_methods)
{
	ck_assert(method_has_content(AMQP_BASIC_PUBLISH_METHOD));
	ck_assert(method_has_content(AMQP_BASIC_DELIVER_METHOD));
	ck_assert(method_has_content(AMQP_BASIC_GET_OK_METHOD));
	ck_assert(method_has_content(AMQP_BASIC_RETURN_METHOD));
	ck_assert(!method_has_content(AMQP_BASIC_ACK_METHOD));
	ck_assert(!method_has_content(AMQP_CONNECTION_CLOSE_METHOD));
}
END_TEST

START_TEST(deliver_round_trip)
{
	struct evbuffer *b = evbuffer_new();
	amqp_basic_deliver_t d = {amqp_cstring_bytes("ctag-1"), 77, 1, amqp_cstring_bytes("ex"),
				  amqp_cstring_bytes("rk.a")};
	amqp_basic_deliver_t *back;
	struct frame_info fi;
	amqp_method_number_t id;
	void *m;

	ck_assert_int_eq(method_write(b, 3, AMQP_BASIC_DELIVER_METHOD, &d), 0);
	ck_assert_int_eq(frame_scan_evbuffer(b, 0, 4096, &fi), FRAME_SCAN_OK);
	ck_assert_uint_eq(fi.type, FRAME_METHOD);
	ck_assert_uint_eq(fi.channel, 3);
	ck_assert_uint_eq(fi.class_id, 60);
	ck_assert_uint_eq(fi.method_id, 60);
	ck_assert_int_eq(method_decode_evbuffer(b, fi.size, &pool, &id, &m), 0);
	ck_assert_uint_eq(id, AMQP_BASIC_DELIVER_METHOD);
	back = m;
	ck_assert_uint_eq(back->delivery_tag, 77);
	ck_assert_int_eq(back->redelivered, 1);
	ck_assert_int_eq((int)back->routing_key.len, 4);
	ck_assert(memcmp(back->routing_key.bytes, "rk.a", 4) == 0);
	evbuffer_free(b);
}
END_TEST

START_TEST(close_writer)
{
	struct evbuffer *b = evbuffer_new();
	struct frame_info fi;
	amqp_method_number_t id;
	amqp_connection_close_t *c;
	void *m;

	ck_assert_int_eq(method_write_connection_close(b, 501, "FRAME_ERROR - x", 60, 40), 0);
	ck_assert_int_eq(frame_scan_evbuffer(b, 0, 4096, &fi), FRAME_SCAN_OK);
	ck_assert_uint_eq(fi.channel, 0);
	ck_assert_int_eq(method_decode_evbuffer(b, fi.size, &pool, &id, &m), 0);
	c = m;
	ck_assert_uint_eq(id, AMQP_CONNECTION_CLOSE_METHOD);
	ck_assert_uint_eq(c->reply_code, 501);
	ck_assert_uint_eq(c->class_id, 60);
	ck_assert_uint_eq(c->method_id, 40);
	evbuffer_free(b);
}
END_TEST

START_TEST(truncated_method_refused)
{
	static const uint8_t p[] = {0, 60, 0, 40, 0, 0, 0, 200, 'q'};
	amqp_method_number_t id;
	void *m;

	ck_assert_int_ne(method_decode(p, sizeof(p), &pool, &id, &m), 0);
	ck_assert_int_ne(method_decode(p, 3, &pool, &id, &m), 0);
}
END_TEST

static amqp_table_entry_t inner_entries[2];
static amqp_table_entry_t outer_entries[4];
static amqp_field_value_t array_items[2];

static void all_props(amqp_basic_properties_t *p)
{
	memset(p, 0, sizeof(*p));
	inner_entries[0].key = amqp_cstring_bytes("n");
	inner_entries[0].value.kind = AMQP_FIELD_KIND_I64;
	inner_entries[0].value.value.i64 = -5;
	inner_entries[1].key = amqp_cstring_bytes("s");
	inner_entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
	inner_entries[1].value.value.bytes = amqp_cstring_bytes("deep");
	array_items[0].kind = AMQP_FIELD_KIND_BOOLEAN;
	array_items[0].value.boolean = 1;
	array_items[1].kind = AMQP_FIELD_KIND_DECIMAL;
	array_items[1].value.decimal.decimals = 2;
	array_items[1].value.decimal.value = 12345;
	outer_entries[0].key = amqp_cstring_bytes("acemq-reply-to");
	outer_entries[0].value.kind = AMQP_FIELD_KIND_UTF8;
	outer_entries[0].value.value.bytes = amqp_cstring_bytes("replies");
	outer_entries[1].key = amqp_cstring_bytes("nested");
	outer_entries[1].value.kind = AMQP_FIELD_KIND_TABLE;
	outer_entries[1].value.value.table.num_entries = 2;
	outer_entries[1].value.value.table.entries = inner_entries;
	outer_entries[2].key = amqp_cstring_bytes("list");
	outer_entries[2].value.kind = AMQP_FIELD_KIND_ARRAY;
	outer_entries[2].value.value.array.num_entries = 2;
	outer_entries[2].value.value.array.entries = array_items;
	outer_entries[3].key = amqp_cstring_bytes("when");
	outer_entries[3].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
	outer_entries[3].value.value.u64 = 1700000000;
	p->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
		    AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		    AMQP_BASIC_PRIORITY_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
		    AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_EXPIRATION_FLAG |
		    AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
		    AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_USER_ID_FLAG | AMQP_BASIC_APP_ID_FLAG |
		    AMQP_BASIC_CLUSTER_ID_FLAG;
	p->content_type = amqp_cstring_bytes("application/json");
	p->content_encoding = amqp_cstring_bytes("gzip");
	p->headers.num_entries = 4;
	p->headers.entries = outer_entries;
	p->delivery_mode = 2;
	p->priority = 7;
	p->correlation_id = amqp_cstring_bytes("corr");
	p->reply_to = amqp_cstring_bytes("replies");
	p->expiration = amqp_cstring_bytes("60000");
	p->message_id = amqp_cstring_bytes("m-1");
	p->timestamp = 1700000001;
	p->type = amqp_cstring_bytes("order");
	p->user_id = amqp_cstring_bytes("guest");
	p->app_id = amqp_cstring_bytes("app");
	p->cluster_id = amqp_cstring_bytes("c");
}

START_TEST(props_round_trip)
{
	amqp_basic_properties_t p, *back;
	struct evbuffer *b = evbuffer_new(), *b2 = evbuffer_new();
	struct frame_info fi;
	unsigned char *raw;
	uint16_t cls;
	uint64_t size;
	size_t len;

	all_props(&p);
	ck_assert_int_eq(content_header_write(b, 5, AMQP_BASIC_CLASS, 1 << 20, &p), 0);
	ck_assert_int_eq(frame_scan_evbuffer(b, 0, 131072, &fi), FRAME_SCAN_OK);
	ck_assert_uint_eq(fi.type, FRAME_HEADER);
	len = evbuffer_get_length(b);
	raw = evbuffer_pullup(b, -1);
	content_header_peek(raw + FRAME_HEADER_SIZE, &cls, &size);
	ck_assert_uint_eq(cls, 60);
	ck_assert_uint_eq(size, 1 << 20);
	ck_assert_int_eq(content_props_decode(raw + FRAME_HEADER_SIZE, fi.size, &pool, &back),
			 0);
	ck_assert_uint_eq(back->_flags, p._flags);
	ck_assert_uint_eq(back->priority, 7);
	ck_assert_uint_eq(back->timestamp, 1700000001);
	ck_assert_int_eq(back->headers.num_entries, 4);
	ck_assert_int_eq(back->headers.entries[1].value.kind, AMQP_FIELD_KIND_TABLE);
	ck_assert_int_eq(back->headers.entries[1].value.value.table.entries[0].value.value.i64,
			 -5);
	/* Re-encoding what was decoded gives the same bytes. */
	ck_assert_int_eq(content_header_write(b2, 5, AMQP_BASIC_CLASS, 1 << 20, back), 0);
	ck_assert_uint_eq(evbuffer_get_length(b2), len);
	ck_assert(memcmp(evbuffer_pullup(b2, -1), raw, len) == 0);
	evbuffer_free(b);
	evbuffer_free(b2);
}
END_TEST

START_TEST(body_reframed_at_frame_max)
{
	struct evbuffer *body = evbuffer_new(), *out = evbuffer_new();
	uint8_t data[10000];
	struct frame_info fi;
	size_t total = 0, off = 0;
	int frames = 0;

	memset(data, 'x', sizeof(data));
	evbuffer_add(body, data, sizeof(data));
	ck_assert_int_eq(content_body_write(out, 2, body, 4096), 0);
	ck_assert_uint_eq(evbuffer_get_length(body), 0);
	while (frame_scan_evbuffer(out, off, 4096 - 8, &fi) == FRAME_SCAN_OK) {
		ck_assert_uint_eq(fi.type, FRAME_BODY);
		ck_assert_uint_le(fi.size, 4096 - 8);
		total += fi.size;
		off += frame_scan_wire_len(&fi);
		frames++;
	}
	ck_assert_uint_eq(off, evbuffer_get_length(out));
	ck_assert_uint_eq(total, sizeof(data));
	ck_assert_int_eq(frames, 3);
	evbuffer_free(body);
	evbuffer_free(out);
}
END_TEST

/* A header read as an identity: strings as they are, integers of every
 * width in decimal, anything else none. */
/* Decode frame (in b), append entries with table_set_string, and check
 * that splicing them in gives the same bytes as encoding every property. */
static void splice_matches_encode(struct evbuffer *b, int nadd)
{
	amqp_basic_properties_t *back;
	struct evbuffer *spliced = evbuffer_new(), *encoded = evbuffer_new();
	size_t len = evbuffer_get_length(b), off = 0;
	unsigned char *raw = evbuffer_pullup(b, -1);
	uint8_t enc[1024];
	amqp_table_t added;
	int from, i;

	ck_assert_int_eq(
	    content_props_decode(raw + FRAME_HEADER_SIZE, len - FRAME_OVERHEAD, &pool, &back),
	    0);
	from = (back->_flags & AMQP_BASIC_HEADERS_FLAG) ? back->headers.num_entries : 0;
	if (!(back->_flags & AMQP_BASIC_HEADERS_FLAG)) {
		back->headers.num_entries = 0;
		back->_flags |= AMQP_BASIC_HEADERS_FLAG;
	}
	for (i = 0; i < nadd; i++) {
		char key[32];

		snprintf(key, sizeof(key), "added-%d", i);
		ck_assert_int_eq(table_set_string(&back->headers, &pool, key,
						  amqp_cstring_bytes("amq.gen-reply")),
				 0);
	}
	added.num_entries = back->headers.num_entries - from;
	added.entries = back->headers.entries + from;
	ck_assert_int_eq(amqp_encode_table((amqp_bytes_t){sizeof(enc), enc}, &added, &off), 0);
	ck_assert_int_eq(
	    content_header_append_headers(spliced, raw, len, enc + 4, off - 4, 131072), 0);
	ck_assert_int_eq(content_header_write(encoded, 5, AMQP_BASIC_CLASS, 1 << 20, back), 0);
	ck_assert_uint_eq(evbuffer_get_length(spliced), evbuffer_get_length(encoded));
	ck_assert(memcmp(evbuffer_pullup(spliced, -1), evbuffer_pullup(encoded, -1),
			 evbuffer_get_length(encoded)) == 0);
	evbuffer_free(spliced);
	evbuffer_free(encoded);
}

START_TEST(headers_spliced_as_encoded)
{
	amqp_basic_properties_t p;
	struct evbuffer *b;
	int shape;

	/* No properties; a content type only; both short strings and no
	 * table; every property with a table of four. */
	for (shape = 0; shape < 4; shape++) {
		memset(&p, 0, sizeof(p));
		if (shape == 3) {
			all_props(&p);
		} else if (shape >= 1) {
			p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_REPLY_TO_FLAG;
			p.content_type = amqp_cstring_bytes("text/plain");
			p.reply_to = amqp_cstring_bytes("replies");
			if (shape == 2) {
				p._flags |= AMQP_BASIC_CONTENT_ENCODING_FLAG;
				p.content_encoding = amqp_cstring_bytes("");
			}
		}
		b = evbuffer_new();
		ck_assert_int_eq(content_header_write(b, 5, AMQP_BASIC_CLASS, 1 << 20, &p), 0);
		splice_matches_encode(b, 1);
		splice_matches_encode(b, 2);
		evbuffer_free(b);
	}
}
END_TEST

START_TEST(headers_splice_refuses_what_it_cannot_edit)
{
	amqp_basic_properties_t p;
	struct evbuffer *b = evbuffer_new(), *out = evbuffer_new();
	const uint8_t entry[] = {1, 'k', 'S', 0, 0, 0, 1, 'v'};
	uint8_t frame[256];
	size_t len;

	memset(&p, 0, sizeof(p));
	p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG;
	p.content_type = amqp_cstring_bytes("text/plain");
	ck_assert_int_eq(content_header_write(b, 5, AMQP_BASIC_CLASS, 10, &p), 0);
	len = evbuffer_get_length(b);
	ck_assert_uint_le(len, sizeof(frame));
	evbuffer_copyout(b, frame, len);
	/* As it is: edited, and one entry longer. */
	ck_assert_int_eq(
	    content_header_append_headers(out, frame, len, entry, sizeof(entry), 4096), 0);
	ck_assert_uint_eq(evbuffer_get_length(out), len + sizeof(entry));
	evbuffer_drain(out, evbuffer_get_length(out));
	/* Past max_frame. */
	ck_assert_int_eq(
	    content_header_append_headers(out, frame, len, entry, sizeof(entry), len + 7), -1);
	/* Truncated: the frame's size no longer agrees, or its end octet. */
	ck_assert_int_eq(content_header_append_headers(out, frame, len - 1, entry, 8, 4096),
			 -1);
	/* The content type's length runs past the frame. */
	frame[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 2] = 250;
	ck_assert_int_eq(content_header_append_headers(out, frame, len, entry, 8, 4096), -1);
	frame[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 2] = 10;
	/* The table's length runs past the frame. */
	frame[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 2 + 11] = 0x7f;
	ck_assert_int_eq(content_header_append_headers(out, frame, len, entry, 8, 4096), -1);
	frame[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 2 + 11] = 0;
	/* Property flags continued into a second word. */
	frame[FRAME_HEADER_SIZE + CONTENT_HEADER_FIXED + 1] |= 1;
	ck_assert_int_eq(content_header_append_headers(out, frame, len, entry, 8, 4096), -1);
	ck_assert_uint_eq(evbuffer_get_length(out), 0);
	evbuffer_free(b);
	evbuffer_free(out);
}
END_TEST

START_TEST(table_text_of_each_kind)
{
	amqp_table_entry_t e[4];
	amqp_table_t t = {4, e};
	const void *out;
	char num[32];

	e[0].key = amqp_cstring_bytes("s");
	e[0].value.kind = AMQP_FIELD_KIND_UTF8;
	e[0].value.value.bytes = amqp_cstring_bytes("order-7");
	e[1].key = amqp_cstring_bytes("u16");
	e[1].value.kind = AMQP_FIELD_KIND_U16;
	e[1].value.value.u16 = 65535;
	e[2].key = amqp_cstring_bytes("i64");
	e[2].value.kind = AMQP_FIELD_KIND_I64;
	e[2].value.value.i64 = INT64_MIN;
	e[3].key = amqp_cstring_bytes("f");
	e[3].value.kind = AMQP_FIELD_KIND_F64;
	e[3].value.value.f64 = 1.5;
	ck_assert_int_eq(table_get_text(&t, "s", num, &out), 7);
	ck_assert(memcmp(out, "order-7", 7) == 0);
	ck_assert_int_eq(table_get_text(&t, "u16", num, &out), 5);
	ck_assert(memcmp(out, "65535", 5) == 0);
	ck_assert_int_eq(table_get_text(&t, "i64", num, &out), 20);
	ck_assert(memcmp(out, "-9223372036854775808", 20) == 0);
	ck_assert_int_eq(table_get_text(&t, "f", num, &out), 0);
	ck_assert_int_eq(table_get_text(&t, "missing", num, &out), 0);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, content_methods);
	tcase_add_test(tc, deliver_round_trip);
	tcase_add_test(tc, close_writer);
	tcase_add_test(tc, truncated_method_refused);
	tcase_add_test(tc, props_round_trip);
	tcase_add_test(tc, body_reframed_at_frame_max);
	tcase_add_test(tc, headers_spliced_as_encoded);
	tcase_add_test(tc, headers_splice_refuses_what_it_cannot_edit);
	tcase_add_test(tc, table_text_of_each_kind);
	return unit_run("codec", tc, 1);
}
