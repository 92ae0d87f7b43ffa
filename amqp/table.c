/* table: edits of decoded field tables (message headers) that keep every
 * other entry, and its type, exactly as it was. */
#include "table.h"

#include "../src/debug.h"

#include <inttypes.h>
#include <stdio.h>
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

int table_set(amqp_table_t *t, amqp_pool_t *pool, const char *key,
	      const amqp_field_value_t *value)
{
	int i = table_find(t, key);
	amqp_table_entry_t *n;
	size_t klen = strlen(key);
	void *kcopy;

	if (i >= 0) {
		t->entries[i].value = *value;
		return 0;
	}
	n = amqp_pool_alloc(pool, (size_t)(t->num_entries + 1) * sizeof(*n));
	kcopy = amqp_pool_alloc(pool, klen);
	if (n == NULL || kcopy == NULL)
		return -1;
	if (t->num_entries)
		memcpy(n, t->entries, (size_t)t->num_entries * sizeof(*n));
	memcpy(kcopy, key, klen);
	n[t->num_entries].key.bytes = kcopy;
	n[t->num_entries].key.len = klen;
	n[t->num_entries].value = *value;
	t->entries = n;
	t->num_entries++;
	return 0;
}

int table_set_string(amqp_table_t *t, amqp_pool_t *pool, const char *key, amqp_bytes_t value)
{
	amqp_field_value_t v = {.kind = AMQP_FIELD_KIND_UTF8};

	v.value.bytes.bytes = amqp_pool_alloc(pool, value.len ? value.len : 1);
	if (v.value.bytes.bytes == NULL)
		return -1;
	memcpy(v.value.bytes.bytes, value.bytes, value.len);
	v.value.bytes.len = value.len;
	return table_set(t, pool, key, &v);
}

int table_remove(amqp_table_t *t, const char *key)
{
	int i = table_find(t, key);

	if (i < 0)
		return 0;
	ACEMQ_ASSERT(i < t->num_entries);
	memmove(&t->entries[i], &t->entries[i + 1],
		(size_t)(t->num_entries - i - 1) * sizeof(t->entries[0]));
	t->num_entries--;
	return 1;
}

size_t table_get_text(const amqp_table_t *t, const char *key, char num[32], const void **out)
{
	int i = table_find(t, key), n;
	const amqp_field_value_t *v;

	*out = NULL;
	if (i < 0)
		return 0;
	v = &t->entries[i].value;
	switch (v->kind) {
	case AMQP_FIELD_KIND_UTF8:
	case AMQP_FIELD_KIND_BYTES:
		*out = v->value.bytes.bytes;
		return v->value.bytes.len;
	case AMQP_FIELD_KIND_I8:
		n = snprintf(num, 32, "%" PRId8, v->value.i8);
		break;
	case AMQP_FIELD_KIND_U8:
		n = snprintf(num, 32, "%" PRIu8, v->value.u8);
		break;
	case AMQP_FIELD_KIND_I16:
		n = snprintf(num, 32, "%" PRId16, v->value.i16);
		break;
	case AMQP_FIELD_KIND_U16:
		n = snprintf(num, 32, "%" PRIu16, v->value.u16);
		break;
	case AMQP_FIELD_KIND_I32:
		n = snprintf(num, 32, "%" PRId32, v->value.i32);
		break;
	case AMQP_FIELD_KIND_U32:
		n = snprintf(num, 32, "%" PRIu32, v->value.u32);
		break;
	case AMQP_FIELD_KIND_I64:
		n = snprintf(num, 32, "%" PRId64, v->value.i64);
		break;
	case AMQP_FIELD_KIND_U64:
		n = snprintf(num, 32, "%" PRIu64, v->value.u64);
		break;
	default:
		return 0; /* a float, a table, ...: not an identity */
	}
	if (n <= 0 || n >= 32)
		return 0;
	*out = num;
	return (size_t)n;
}
