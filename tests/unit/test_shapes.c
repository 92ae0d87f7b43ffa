/* test_shapes: the shared shapes (list.h, hash.h, link.h) keep their
 * promises: order, O(1) removal, a second removal harmless, safe walks. */
#include "src/hash.h"
#include "src/link.h"
#include "src/list.h"

#include "tests/unit/unit.h"

#include <check.h>
#include <stdint.h>

struct item {
	int v;
	uint64_t key;
	struct list node;
};

static int collect(struct list *head, int *out, int max)
{
	struct item *it;
	int n = 0;

	list_for_each_entry (it, head, node)
		if (n < max)
			out[n++] = it->v;
	return n;
}

START_TEST(list_orders_and_unlinks)
{
	struct list head;
	struct item a = {1, 0, {NULL, NULL}}, b = {2, 0, {NULL, NULL}},
		    c = {3, 0, {NULL, NULL}};
	int got[4];

	list_init(&head);
	ck_assert(list_empty(&head));
	ck_assert_ptr_null(list_first_entry(&head, struct item, node));
	list_add_tail(&b.node, &head);
	list_add_tail(&c.node, &head);
	list_add(&a.node, &head);
	ck_assert_int_eq(collect(&head, got, 4), 3);
	ck_assert_int_eq(got[0], 1);
	ck_assert_int_eq(got[1], 2);
	ck_assert_int_eq(got[2], 3);
	ck_assert_ptr_eq(list_first_entry(&head, struct item, node), &a);

	/* The middle one goes; a second removal changes nothing. */
	list_del(&b.node);
	ck_assert(!list_linked(&b.node));
	list_del(&b.node);
	ck_assert_int_eq(collect(&head, got, 4), 2);
	ck_assert_int_eq(got[0], 1);
	ck_assert_int_eq(got[1], 3);
	ck_assert(list_linked(&a.node));
	ck_assert_ptr_eq(head.prev, &c.node);
}
END_TEST

START_TEST(list_safe_walk_may_remove_each)
{
	struct list head;
	struct item items[5], *it;
	int i, seen = 0;

	list_init(&head);
	for (i = 0; i < 5; i++) {
		items[i].v = i;
		list_add_tail(&items[i].node, &head);
	}
	list_for_each_entry_safe (it, &head, node) {
		ck_assert_int_eq(it->v, seen);
		seen++;
		list_del(&it->node);
		it->node.next = it->node.prev = NULL; /* as if freed */
	}
	ck_assert_int_eq(seen, 5);
	ck_assert(list_empty(&head));
}
END_TEST

START_TEST(hash_buckets_as_before)
{
	struct list bucket[256];
	struct hash h;
	struct item items[64], *it, *found;
	size_t b;
	int i, n = 0;

	hash_init(&h, bucket, 256);
	for (i = 0; i < 64; i++) {
		items[i].v = i;
		items[i].key = hash_mix((uint64_t)i + 1, (uint64_t)(i % 3));
		hash_add(&h, items[i].key, &items[i].node);
	}
	/* The bucket the patterns' own tables picked: the key's bits above 24. */
	ck_assert_ptr_eq(hash_bucket(&h, items[7].key),
			 &bucket[(((8ull * 0x9E3779B97F4A7C15ull) ^ 1) >> 24) % 256]);
	ck_assert_uint_eq(hash_spread(3), 3ull * 0x9E3779B97F4A7C15ull);
	found = NULL;
	hash_for_each_key (it, &h, items[40].key, node)
		if (it->v == 40)
			found = it;
	ck_assert_ptr_eq(found, &items[40]);
	hash_del(&items[40].node);
	hash_del(&items[40].node);
	found = NULL;
	hash_for_each_key (it, &h, items[40].key, node)
		if (it->v == 40)
			found = it;
	ck_assert_ptr_null(found);
	/* A walk over the whole table may take each one out. */
	hash_for_each_safe (b, it, &h, node) {
		n++;
		hash_del(&it->node);
	}
	ck_assert_int_eq(n, 63);
	for (b = 0; b < 256; b++)
		ck_assert(list_empty(&bucket[b]));
}
END_TEST

START_TEST(link_cut_leaves_no_owner)
{
	struct link l;
	int owner;

	link_set(&l, &owner);
	ck_assert_ptr_eq(link_owner(&l), &owner);
	link_cut(&l);
	ck_assert_ptr_null(link_owner(&l));
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, list_orders_and_unlinks);
	tcase_add_test(tc, list_safe_walk_may_remove_each);
	tcase_add_test(tc, hash_buckets_as_before);
	tcase_add_test(tc, link_cut_leaves_no_owner);
	return unit_run("shapes", tc, 1);
}
