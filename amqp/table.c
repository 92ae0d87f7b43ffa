/* table: edits of decoded field tables (message headers) that keep every
 * other entry, and its type, exactly as it was. */
#include "table.h"

#include <string.h>

int table_find(const amqp_table_t *t, const char *key)
{
	size_t len = strlen(key);
	int i;

	for (i = 0; i < t->num_entries; i++)
		if (t->entries[i].key.len == len &&
		    memcmp(t->entries[i].key.bytes, key, len) == 0)
			return i;
	return -1;
}

int table_get_string(const amqp_table_t *t, const char *key, amqp_bytes_t *out)
{
	int i = table_find(t, key);
	const amqp_field_value_t *v;

	if (i < 0)
		return -1;
	v = &t->entries[i].value;
	if (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES)
		return -1;
	*out = v->value.bytes;
	return 0;
}

int table_set_string(amqp_table_t *t, amqp_pool_t *pool, const char *key, amqp_bytes_t value)
{
	int i = table_find(t, key);
	amqp_table_entry_t *e;
	size_t klen = strlen(key);
	void *copy;

	copy = amqp_pool_alloc(pool, value.len ? value.len : 1);
	if (copy == NULL)
		return -1;
	memcpy(copy, value.bytes, value.len);
	if (i >= 0) {
		e = &t->entries[i];
	} else {
		amqp_table_entry_t *n =
		    amqp_pool_alloc(pool, (size_t)(t->num_entries + 1) * sizeof(*n));
		void *kcopy = amqp_pool_alloc(pool, klen);

		if (n == NULL || kcopy == NULL)
			return -1;
		if (t->num_entries)
			memcpy(n, t->entries, (size_t)t->num_entries * sizeof(*n));
		memcpy(kcopy, key, klen);
		e = &n[t->num_entries];
		e->key.bytes = kcopy;
		e->key.len = klen;
		t->entries = n;
		t->num_entries++;
	}
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes.bytes = copy;
	e->value.value.bytes.len = value.len;
	return 0;
}

int table_remove(amqp_table_t *t, const char *key)
{
	int i = table_find(t, key);

	if (i < 0)
		return 0;
	memmove(&t->entries[i], &t->entries[i + 1],
		(size_t)(t->num_entries - i - 1) * sizeof(t->entries[0]));
	t->num_entries--;
	return 1;
}
