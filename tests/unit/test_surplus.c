/* test_surplus: deliveries kept past a consumer's prefetch: admitted up to
 * the prefetch, kept in order, let go one per settle, drained by a cancel
 * or a stream, dropped by a recover or the channel's end. */
#include "src/surplus.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

static int dropped;

static void drop(void *msg)
{
	dropped++;
	free(msg);
}

static int *msg(int v)
{
	int *m = malloc(sizeof(*m));

	*m = v;
	return m;
}

/* The value of the next delivery that may go, or -1. */
static int next(struct surplus *s, uint64_t *tag)
{
	int *m = surplus_next(s, tag), v;

	if (m == NULL)
		return -1;
	v = *m;
	free(m);
	return v;
}

START_TEST(prefetch_asked)
{
	ck_assert_uint_eq(surplus_auto(1), 0);
	ck_assert_uint_eq(surplus_auto(SURPLUS_AUTO_MIN - 1), 0);
	ck_assert_uint_eq(surplus_auto(SURPLUS_AUTO_MIN), SURPLUS_EXTRA_MAX);
	ck_assert_uint_eq(surplus_auto(99), 0);
	ck_assert_uint_eq(surplus_auto(100), 1000);
	ck_assert_uint_eq(surplus_auto(65535), SURPLUS_EXTRA_MAX);
	ck_assert_uint_eq(surplus_prefetch(1, 1), 2);
	ck_assert_uint_eq(surplus_prefetch(100, 300), 400);
	ck_assert_uint_eq(surplus_prefetch(5, 60000), 5 + SURPLUS_EXTRA_MAX);
	ck_assert_uint_eq(surplus_prefetch(65000, 1000), 65535);
}
END_TEST

START_TEST(kept_past_the_prefetch_in_order)
{
	struct surplus *s = NULL;
	uint64_t t, tag;
	int *m;

	ck_assert_int_eq(surplus_add(&s, 7, "a", 1, 3), 0);
	ck_assert_uint_eq(s->channel, 7);
	for (t = 1; t <= 3; t++)
		ck_assert_int_eq(surplus_admit(s, "a", 1, t, NULL, 100, 0), 0);
	for (t = 4; t <= 8; t++) {
		m = msg((int)t);
		ck_assert_int_eq(surplus_admit(s, "a", 1, t, m, 100, 0), 1);
	}
	ck_assert_uint_eq(surplus_waiting(s), 5);
	ck_assert_ptr_null(surplus_next(s, &tag));
	/* Another consumer, or none, is not counted. */
	ck_assert_int_eq(surplus_admit(s, "b", 1, 9, NULL, 100, 0), 0);
	/* A settle of a tag not counted opens no room. */
	ck_assert_int_eq(surplus_settled(s, 9), 0);
	ck_assert_int_eq(surplus_settled(s, 4), 0);
	/* One settled (the middle one), one goes: the first kept. */
	ck_assert_int_eq(surplus_settled(s, 2), 1);
	ck_assert_int_eq(surplus_settled(s, 2), 0); /* once */
	ck_assert_int_eq(next(s, &tag), 4);
	ck_assert_uint_eq(tag, 4);
	ck_assert_int_eq(next(s, &tag), -1);
	/* Two settled: two go, in order. */
	ck_assert_int_eq(surplus_settled(s, 1), 1);
	ck_assert_int_eq(surplus_settled(s, 4), 1);
	ck_assert_int_eq(next(s, &tag), 5);
	ck_assert_int_eq(next(s, &tag), 6);
	ck_assert_int_eq(next(s, &tag), -1);
	/* A new delivery waits behind those kept, room or not. */
	ck_assert_int_eq(surplus_settled(s, 3), 1);
	m = msg(10);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 10, m, 100, 0), 1);
	ck_assert_int_eq(next(s, &tag), 7);
	ck_assert_int_eq(next(s, &tag), -1);
	dropped = 0;
	surplus_free(s, drop);
	ck_assert_int_eq(dropped, 2); /* 8 and 10 */
}
END_TEST

struct seen {
	int n;
	int v[8];
	uint64_t tag[8];
};

static void see(void *arg, void *m, uint64_t tag)
{
	struct seen *s = arg;

	ck_assert_int_lt(s->n, 8);
	s->v[s->n] = *(int *)m;
	s->tag[s->n++] = tag;
}

/* What is kept, over every consumer, is looked at (its claims renewed
 * while it waits): only what waits, never what went to the client. */
START_TEST(each_kept_delivery_seen)
{
	struct surplus *s = NULL;
	struct seen seen = {0};
	uint64_t tag;

	surplus_each(NULL, see, &seen);
	ck_assert_int_eq(surplus_add(&s, 1, "a", 1, 1), 0);
	ck_assert_int_eq(surplus_add(&s, 1, "b", 1, 1), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 1, NULL, 10, 0), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 2, msg(2), 10, 0), 1);
	ck_assert_int_eq(surplus_admit(s, "b", 1, 3, NULL, 10, 0), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 4, msg(4), 10, 0), 1);
	ck_assert_int_eq(surplus_admit(s, "b", 1, 5, msg(5), 10, 0), 1);
	surplus_each(s, see, &seen);
	ck_assert_int_eq(seen.n, 3);
	ck_assert_int_eq(seen.v[0] + seen.v[1] + seen.v[2], 11);
	ck_assert_uint_eq(seen.tag[0], 2); /* a's in order */
	ck_assert_uint_eq(seen.tag[1], 4);
	ck_assert_uint_eq(seen.tag[2], 5);
	/* One of a's goes: it is not seen again. */
	ck_assert_int_eq(surplus_settled(s, 1), 1);
	ck_assert_int_eq(next(s, &tag), 2);
	seen.n = 0;
	surplus_each(s, see, &seen);
	ck_assert_int_eq(seen.n, 2);
	ck_assert_uint_eq(seen.tag[0], 4);
	ck_assert_uint_eq(seen.tag[1], 5);
	dropped = 0;
	surplus_free(s, drop);
	ck_assert_int_eq(dropped, 2);
}
END_TEST

START_TEST(drain_and_cancel)
{
	struct surplus *s = NULL;
	uint64_t tag;

	ck_assert_int_eq(surplus_add(&s, 1, "a", 1, 1), 0);
	ck_assert_int_eq(surplus_add(&s, 1, "b", 1, 1), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 1, NULL, 100, 0), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 2, msg(2), 100, 0), 1);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 3, msg(3), 100, 0), 1);
	ck_assert_int_eq(surplus_admit(s, "b", 1, 4, NULL, 100, 0), 0);
	ck_assert_int_eq(surplus_admit(s, "b", 1, 5, msg(5), 100, 0), 1);
	/* A stream for a: what waits for a goes first, then it goes now. */
	surplus_drain(s, "a", 1);
	ck_assert_int_eq(next(s, &tag), 2);
	ck_assert_int_eq(next(s, &tag), 3);
	ck_assert_int_eq(next(s, &tag), -1); /* b has no room */
	ck_assert_int_eq(surplus_admit(s, "a", 1, 6, NULL, 100, 1), 0);
	/* ... and a is at its prefetch again after the drain. */
	ck_assert_int_eq(surplus_admit(s, "a", 1, 7, msg(7), 100, 0), 1);
	/* b cancelled: its kept one goes, then b is forgotten. */
	surplus_cancel(s, "b", 1);
	ck_assert_int_eq(next(s, &tag), 5);
	ck_assert_int_eq(next(s, &tag), -1);
	ck_assert_int_eq(s->n, 1);
	ck_assert_int_eq(surplus_admit(s, "b", 1, 8, NULL, 100, 0), 0);
	/* recover: a's kept one dropped, nothing counted at the client. */
	dropped = 0;
	surplus_recover(s, drop);
	ck_assert_int_eq(dropped, 1);
	ck_assert_uint_eq(surplus_waiting(s), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 9, NULL, 100, 0), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 10, msg(10), 100, 0), 1);
	/* A cancel with nothing kept forgets it at once. */
	surplus_cancel(s, "zz", 2);
	dropped = 0;
	surplus_free(s, drop);
	ck_assert_int_eq(dropped, 1);
	surplus_free(NULL, drop);
}
END_TEST

START_TEST(many_settled_out_of_order)
{
	struct surplus *s = NULL;
	uint64_t t, tag;
	int n = 0;

	ck_assert_int_eq(surplus_add(&s, 1, "a", 1, 100), 0);
	for (t = 1; t <= 100; t++)
		ck_assert_int_eq(surplus_admit(s, "a", 1, t, NULL, 100, 0), 0);
	for (t = 101; t <= 150; t++)
		ck_assert_int_eq(surplus_admit(s, "a", 1, t, msg((int)t), 100, 0), 1);
	/* Odd tags first, then even: each opens room for one. */
	for (t = 1; t <= 100; t += 2)
		ck_assert_int_eq(surplus_settled(s, t), 1);
	while (next(s, &tag) > 0)
		n++;
	ck_assert_int_eq(n, 50);
	for (t = 2; t <= 100; t += 2)
		ck_assert_int_eq(surplus_settled(s, t), 0);
	ck_assert_int_eq(surplus_settled(s, 150), 0);
	surplus_free(s, drop);
}
END_TEST

/* Past SURPLUS_BYTES_MAX kept on the channel nothing more is kept: what
 * waits goes, and the new one after it, past the client's prefetch. */
START_TEST(bytes_bounded)
{
	struct surplus *s = NULL;
	uint64_t tag;
	size_t half = SURPLUS_BYTES_MAX / 2;

	ck_assert_int_eq(surplus_add(&s, 1, "a", 1, 1), 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 1, NULL, half, 0), SURPLUS_NOW);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 2, msg(2), half, 0), SURPLUS_KEPT);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 3, msg(3), half, 0), SURPLUS_KEPT);
	ck_assert_uint_eq(s->bytes, SURPLUS_BYTES_MAX);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 4, NULL, 1, 0), SURPLUS_FULL);
	ck_assert_int_eq(next(s, &tag), 2);
	ck_assert_int_eq(next(s, &tag), 3);
	ck_assert_int_eq(next(s, &tag), -1);
	ck_assert_uint_eq(s->bytes, 0);
	ck_assert_int_eq(surplus_admit(s, "a", 1, 4, NULL, 1, 1), SURPLUS_NOW);
	/* Room again once settled: kept as before. */
	ck_assert_int_eq(surplus_admit(s, "a", 1, 5, msg(5), half, 0), SURPLUS_KEPT);
	surplus_free(s, drop);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, prefetch_asked);
	tcase_add_test(tc, kept_past_the_prefetch_in_order);
	tcase_add_test(tc, each_kept_delivery_seen);
	tcase_add_test(tc, drain_and_cancel);
	tcase_add_test(tc, many_settled_out_of_order);
	tcase_add_test(tc, bytes_bounded);
	return unit_run("surplus", tc, 1);
}
