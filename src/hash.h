/* hash: a chained hash table of a fixed number of buckets, each a list
 * (list.h) of the elements whose key falls in it. The owner provides the
 * bucket array (its size is the table's, fixed) and the elements, which
 * embed a struct list; a key is a 64-bit mix of what identifies an element
 * (hash_mix). Adding and removing are O(1); an element is found by walking
 * its key's bucket and comparing. Header-only. */
#ifndef ACEMQ_HASH_H
#define ACEMQ_HASH_H

#include "list.h"

#include <stddef.h>
#include <stdint.h>

/* 2^64 divided by the golden ratio: multiplying by it spreads a counter's
 * consecutive values over all 64 bits (Fibonacci hashing). */
#define HASH_GOLDEN 0x9E3779B97F4A7C15ull

struct hash {
	struct list *bucket;
	size_t n;
};

/* A number spread over all 64 bits. */
static inline uint64_t hash_spread(uint64_t x)
{
	return x * HASH_GOLDEN;
}

/* The key of a number within a small space, e.g. a delivery tag or
 * confirm sequence number on its channel. */
static inline uint64_t hash_mix(uint64_t x, uint64_t small)
{
	return hash_spread(x) ^ small;
}

/* A table over n buckets the owner keeps (n > 0), all empty. */
static inline void hash_init(struct hash *h, struct list *bucket, size_t n)
{
	size_t i;

	h->bucket = bucket;
	h->n = n;
	for (i = 0; i < n; i++)
		list_init(&bucket[i]);
}

/* The bucket of a key (its upper bits: the low ones of a product carry
 * little of the multiplier's spread). */
static inline struct list *hash_bucket(const struct hash *h, uint64_t key)
{
	return &h->bucket[(key >> 24) % h->n];
}

/* node becomes the first element of its key's bucket. */
static inline void hash_add(struct hash *h, uint64_t key, struct list *node)
{
	list_add(node, hash_bucket(h, key));
}

/* node leaves the table (again harmless: see list_del). */
static inline void hash_del(struct list *node)
{
	list_del(node);
}

/* Each element pos in key's bucket (compare to find the one). */
#define hash_for_each_key(pos, h, key, member) \
	list_for_each_entry (pos, hash_bucket((h), (key)), member)

/* Each element pos of the table, bucket by bucket, with i (a size_t) the
 * bucket; the body may take pos out of the table (or free it). */
#define hash_for_each_safe(i, pos, h, member) \
	for ((i) = 0; (i) < (h)->n; (i)++)    \
		list_for_each_entry_safe (pos, &(h)->bucket[i], member)

#endif
