/* table: edits of decoded field tables (message headers) that keep every
 * other entry, and its type, exactly as it was. */
#ifndef ACEMQ_TABLE_H
#define ACEMQ_TABLE_H

#include <amqp.h>
#include <stddef.h>

/* Index of key in t, or -1. */
int table_find(const amqp_table_t *t, const char *key);

/* The entry's value as bytes if it is a string (longstr or bytes kind);
 * returns 0 and fills out, or -1. */
int table_get_string(const amqp_table_t *t, const char *key, amqp_bytes_t *out);

/* Set key to value (of any kind, stored as it is): replaced in place if
 * present, else appended; a new entry's storage comes from pool. 0 or -1. */
int table_set(amqp_table_t *t, amqp_pool_t *pool, const char *key,
	      const amqp_field_value_t *value);

/* Set key to a longstr value: replaced in place if present, else appended.
 * New storage comes from pool. 0 or -1. */
int table_set_string(amqp_table_t *t, amqp_pool_t *pool, const char *key, amqp_bytes_t value);

/* An identity read from a header: a string as it is, an integer of any
 * width in decimal (written into num). Its length; 0 for another kind or
 * no such key. */
size_t table_get_text(const amqp_table_t *t, const char *key, char num[32], const void **out);

/* Remove key if present (order of the rest kept). Returns 1 if removed. */
int table_remove(amqp_table_t *t, const char *key);

#endif
