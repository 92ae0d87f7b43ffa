/* test_tagmap: delivery tag and confirm sequence translation tables. */
#include "src/tagmap.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdlib.h>

struct rec {
	uint64_t tag[64];
	int multiple[64];
	int n;
};

static void record(void *arg, uint64_t tag, int multiple)
{
	struct rec *r = arg;

	r->tag[r->n] = tag;
	r->multiple[r->n++] = multiple;
}

/* Broker tags 1..9; the proxy swallows 3 and 6 (and settles them itself). */
static void deliver_skipping(struct tagmap *tm)
{
	uint64_t b;

	for (b = 1; b <= 9; b++) {
		if (b == 3 || b == 6)
			continue;
		tagmap_deliver(tm, b, 1);
	}
}

START_TEST(contiguous_client_tags)
{
	struct tagmap tm;
	uint64_t b, c, expect = 1;

	tagmap_init(&tm);
	for (b = 1; b <= 20; b++) {
		if (b % 3 == 0)
			continue;
		c = tagmap_deliver(&tm, b, 1);
		ck_assert_uint_eq(c, expect++);
	}
	ck_assert_uint_eq(tagmap_outstanding(&tm), 14);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(single_ack_lands_on_broker_tag)
{
	struct tagmap tm;
	struct rec r = {.n = 0};

	tagmap_init(&tm);
	deliver_skipping(&tm); /* client 1..7 = broker 1,2,4,5,7,8,9 */
	ck_assert_int_eq(tagmap_settle(&tm, 3, 0, record, &r), 0);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 4);
	ck_assert_int_eq(r.multiple[0], 0);
	/* settling it twice is an unknown tag */
	ck_assert_int_eq(tagmap_settle(&tm, 3, 0, record, &r), -1);
	ck_assert_int_eq(tagmap_settle(&tm, 99, 0, record, &r), -1);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(multiple_ack_translated)
{
	struct tagmap tm;
	struct rec r = {.n = 0};

	tagmap_init(&tm);
	deliver_skipping(&tm);
	ck_assert_int_eq(tagmap_settle(&tm, 5, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 7); /* client 5 = broker 7 */
	ck_assert_int_eq(r.multiple[0], 1);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 2);
	r.n = 0;
	ck_assert_int_eq(tagmap_settle(&tm, 0, 1, record, &r), 0); /* all */
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 9);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 0);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(multiple_ack_split_around_held)
{
	struct tagmap tm;
	struct rec r = {.n = 0};

	tagmap_init(&tm);
	tagmap_deliver(&tm, 1, 1);
	tagmap_hold(&tm, 2); /* the proxy holds broker tag 2 */
	tagmap_deliver(&tm, 3, 1);
	tagmap_deliver(&tm, 4, 1);
	/* A multiple ack must not settle the held tag 2. */
	ck_assert_int_eq(tagmap_settle(&tm, 3, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 3);
	ck_assert_uint_eq(r.tag[0], 1);
	ck_assert_uint_eq(r.tag[1], 3);
	ck_assert_uint_eq(r.tag[2], 4);
	ck_assert_int_eq(r.multiple[0] + r.multiple[1] + r.multiple[2], 0);
	tagmap_unhold(&tm, 2);
	ck_assert_uint_eq(tagmap_deliver(&tm, 2, 1), 4);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(no_ack_deliveries_not_tracked)
{
	struct tagmap tm;
	struct rec r = {.n = 0};

	tagmap_init(&tm);
	ck_assert_uint_eq(tagmap_deliver(&tm, 10, 0), 1);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 0);
	ck_assert_int_eq(tagmap_settle(&tm, 1, 0, record, &r), -1);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(many_outstanding_grow)
{
	struct tagmap tm;
	struct rec r = {.n = 0};
	uint64_t i;

	tagmap_init(&tm);
	for (i = 1; i <= 10000; i++)
		ck_assert_uint_eq(tagmap_deliver(&tm, i * 2, 1), i);
	for (i = 1; i <= 10000; i += 2) {
		r.n = 0;
		ck_assert_int_eq(tagmap_settle(&tm, i, 0, record, &r), 0);
		ck_assert_uint_eq(r.tag[0], i * 2);
	}
	ck_assert_uint_eq(tagmap_outstanding(&tm), 5000);
	r.n = 0;
	ck_assert_int_eq(tagmap_settle(&tm, 10000, 1, record, &r), 0);
	ck_assert_uint_eq(r.tag[0], 20000);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 0);
	tagmap_reset(&tm);
}
END_TEST

START_TEST(confirms_with_answered_publishes)
{
	struct confirmmap cm;
	struct rec r = {.n = 0};
	uint64_t i, c;

	confirmmap_init(&cm);
	/* Client publishes 1..10; the proxy answers 5 and 10 itself. */
	for (i = 1; i <= 10; i++) {
		c = i % 5 == 0 ? confirmmap_answer(&cm) : confirmmap_forward(&cm);
		ck_assert_uint_eq(c, i);
	}
	/* The broker saw 8 publishes: its ack 3 is the client's 3. */
	ck_assert_int_eq(confirmmap_settle(&cm, 3, 0, 1, record, &r), 0);
	ck_assert_uint_eq(r.tag[0], 3);
	/* broker 5 = client 6 */
	ck_assert_int_eq(confirmmap_settle(&cm, 5, 1, 1, record, &r), 0);
	ck_assert_uint_eq(r.tag[1], 6);
	ck_assert_int_eq(r.multiple[1], 1);
	/* broker 8 = client 9, multiple */
	ck_assert_int_eq(confirmmap_settle(&cm, 8, 1, 1, record, &r), 0);
	ck_assert_uint_eq(r.tag[2], 9);
	ck_assert_int_eq(confirmmap_settle(&cm, 8, 0, 1, record, &r), -1);
	confirmmap_reset(&cm);
}
END_TEST

static void covered(void *arg, uint64_t seq)
{
	record(arg, seq, 0);
}

START_TEST(confirms_covered)
{
	struct confirmmap cm;
	struct rec r = {.n = 0}, sink = {.n = 0};
	uint64_t i;

	confirmmap_init(&cm);
	/* Client publishes 1..6; the proxy answers 2: the broker sees 5. */
	for (i = 1; i <= 6; i++)
		if (i == 2)
			confirmmap_answer(&cm);
		else
			confirmmap_forward(&cm);
	/* A single confirm covers its own sequence number only. */
	confirmmap_covered(&cm, 2, 0, covered, &r);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 2);
	ck_assert_int_eq(confirmmap_settle(&cm, 2, 0, 1, record, &sink), 0);
	/* Settled ones are not covered again; multiple covers the rest below. */
	r.n = 0;
	confirmmap_covered(&cm, 4, 1, covered, &r);
	ck_assert_int_eq(r.n, 3);
	ck_assert_uint_eq(r.tag[0], 1);
	ck_assert_uint_eq(r.tag[1], 3);
	ck_assert_uint_eq(r.tag[2], 4);
	ck_assert_int_eq(confirmmap_settle(&cm, 4, 1, 1, record, &sink), 0);
	r.n = 0;
	confirmmap_covered(&cm, 4, 0, covered, &r);
	ck_assert_int_eq(r.n, 0);
	confirmmap_covered(&cm, 9, 1, covered, &r);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 5);
	confirmmap_reset(&cm);
}
END_TEST

/* Client publishes 1..8, the proxy answers 2 itself (broker 1..7); the
 * client's confirms of broker 3 and 5 also wait for a release. */
START_TEST(confirms_held_until_released)
{
	struct confirmmap cm;
	struct rec r = {.n = 0};
	uint64_t i, client = 0;

	confirmmap_init(&cm);
	for (i = 1; i <= 8; i++) {
		if (i == 2) {
			confirmmap_answer(&cm);
			continue;
		}
		confirmmap_forward(&cm);
		if (cm.next_broker == 3 || cm.next_broker == 5)
			ck_assert_int_eq(confirmmap_hold(&cm, cm.next_broker), 0);
	}
	/* Held twice, or out of order: refused. */
	ck_assert_int_eq(confirmmap_hold(&cm, 5), -1);
	ck_assert_int_eq(confirmmap_hold(&cm, 4), -1);
	ck_assert_int_eq(confirmmap_pending(&cm), 1);
	/* A multiple ack of broker 1..6: 1..2 (client 1..3) at once as one,
	 * 4 and 6 alone (client 5 and 7), 3 and 5 kept. */
	ck_assert_int_eq(confirmmap_settle(&cm, 6, 1, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 3);
	ck_assert_uint_eq(r.tag[0], 3);
	ck_assert_int_eq(r.multiple[0], 1);
	ck_assert_uint_eq(r.tag[1], 5);
	ck_assert_int_eq(r.multiple[1], 0);
	ck_assert_uint_eq(r.tag[2], 7);
	ck_assert_int_eq(r.multiple[2], 0);
	/* Released: the broker's ack goes now, for its client number. */
	ck_assert_int_eq(confirmmap_release(&cm, 5, &client), CONFIRM_ACKED);
	ck_assert_uint_eq(client, 6);
	ck_assert_int_eq(confirmmap_release(&cm, 5, &client), -1);
	/* Still held below: a multiple ack of 7 goes alone. */
	ck_assert_int_eq(confirmmap_settle(&cm, 7, 1, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 4);
	ck_assert_uint_eq(r.tag[3], 8);
	ck_assert_int_eq(r.multiple[3], 0);
	ck_assert_int_eq(confirmmap_release(&cm, 3, &client), CONFIRM_ACKED);
	ck_assert_uint_eq(client, 4);
	ck_assert_int_eq(confirmmap_pending(&cm), 0);
	/* Released before the broker answered: its confirm then goes as
	 * any other; a nack kept back stays a nack. */
	confirmmap_forward(&cm); /* broker 8, client 9 */
	confirmmap_forward(&cm); /* broker 9, client 10 */
	ck_assert_int_eq(confirmmap_hold(&cm, 8), 0);
	ck_assert_int_eq(confirmmap_hold(&cm, 9), 0);
	ck_assert_int_eq(confirmmap_release(&cm, 8, &client), CONFIRM_NONE);
	ck_assert_int_eq(confirmmap_settle(&cm, 9, 1, 0, record, &r), 0);
	ck_assert_int_eq(r.n, 5);
	ck_assert_uint_eq(r.tag[4], 9);
	ck_assert_int_eq(confirmmap_release(&cm, 9, &client), CONFIRM_NACKED);
	ck_assert_uint_eq(client, 10);
	confirmmap_reset(&cm);
}
END_TEST

/* A kept delivery (broker 6) goes to the client after a later one (11):
 * a multiple ack of the later one's client tag covers exactly what the
 * client had, never the kept one now after it. */
START_TEST(multiple_ack_with_a_kept_delivery_out_of_order)
{
	struct tagmap tm;
	struct rec r = {0};
	uint64_t c6, c11;

	tagmap_init(&tm);
	ck_assert_uint_eq(tagmap_deliver(&tm, 5, 1), 1);
	ck_assert_int_eq(tagmap_hold(&tm, 6), 0);
	c11 = tagmap_deliver(&tm, 11, 1);
	ck_assert_uint_eq(c11, 2);
	ck_assert_int_eq(tagmap_settle(&tm, 1, 0, record, &r), 0); /* room: 6 goes */
	tagmap_unhold(&tm, 6);
	c6 = tagmap_deliver(&tm, 6, 1);
	ck_assert_uint_eq(c6, 3);
	ck_assert_uint_eq(tagmap_deliver(&tm, 12, 1), 4);
	r.n = 0;
	ck_assert_int_eq(tagmap_settle(&tm, 2, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 11);
	ck_assert_int_eq(r.multiple[0], 0);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 2);
	/* The rest, by an ack of everything: one by one, both. */
	r.n = 0;
	ck_assert_int_eq(tagmap_settle(&tm, 0, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 2);
	ck_assert_uint_eq(r.tag[0], 6);
	ck_assert_uint_eq(r.tag[1], 12);
	ck_assert_uint_eq(tagmap_outstanding(&tm), 0);
	/* In order again once nothing is out: one multiple ack. */
	tagmap_deliver(&tm, 13, 1);
	tagmap_deliver(&tm, 14, 1);
	r.n = 0;
	ck_assert_int_eq(tagmap_settle(&tm, 6, 1, record, &r), 0);
	ck_assert_int_eq(r.n, 1);
	ck_assert_uint_eq(r.tag[0], 14);
	ck_assert_int_eq(r.multiple[0], 1);
	tagmap_reset(&tm);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, contiguous_client_tags);
	tcase_add_test(tc, single_ack_lands_on_broker_tag);
	tcase_add_test(tc, multiple_ack_translated);
	tcase_add_test(tc, multiple_ack_split_around_held);
	tcase_add_test(tc, no_ack_deliveries_not_tracked);
	tcase_add_test(tc, many_outstanding_grow);
	tcase_add_test(tc, confirms_with_answered_publishes);
	tcase_add_test(tc, confirms_covered);
	tcase_add_test(tc, confirms_held_until_released);
	tcase_add_test(tc, multiple_ack_with_a_kept_delivery_out_of_order);
	return unit_run("tagmap", tc, 1);
}
