/* ladder: the schedule ladder's contract (names, arguments, headers), the
 * choice of rung, the delay header and the scheduler's decision for a
 * message taken from the control queue. No sockets, no threads. */
#include "ladder.h"

#include "../../amqp/table.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const struct ladder_rung ladder_rungs[LADDER_RUNGS] = {
    {"acemq.schedule.1h", 3600000}, {"acemq.schedule.10m", 600000},
    {"acemq.schedule.1m", 60000},   {"acemq.schedule.10s", 10000},
    {"acemq.schedule.1s", 1000},
};

const struct ladder_rung *ladder_smallest(void)
{
	return &ladder_rungs[LADDER_RUNGS - 1];
}

const struct ladder_rung *ladder_rung_for(int64_t remaining_ms)
{
	int i;

	for (i = 0; i < LADDER_RUNGS; i++)
		if (ladder_rungs[i].ttl_ms <= remaining_ms)
			return &ladder_rungs[i];
	return ladder_smallest();
}

static int ladder_int(const amqp_field_value_t *v, int64_t *out)
{
	switch (v->kind) {
	case AMQP_FIELD_KIND_I8:
		*out = v->value.i8;
		return 0;
	case AMQP_FIELD_KIND_U8:
		*out = v->value.u8;
		return 0;
	case AMQP_FIELD_KIND_I16:
		*out = v->value.i16;
		return 0;
	case AMQP_FIELD_KIND_U16:
		*out = v->value.u16;
		return 0;
	case AMQP_FIELD_KIND_I32:
		*out = v->value.i32;
		return 0;
	case AMQP_FIELD_KIND_U32:
		*out = v->value.u32;
		return 0;
	case AMQP_FIELD_KIND_I64:
		*out = v->value.i64;
		return 0;
	case AMQP_FIELD_KIND_U64:
		if (v->value.u64 > INT64_MAX)
			return -1;
		*out = (int64_t)v->value.u64;
		return 0;
	default:
		return -1;
	}
}

/* A double of milliseconds, rounded up; -1 if out of range. */
static int ladder_from_double(double d, int64_t *out)
{
	if (!isfinite(d) || d > 9.2e18 || d < -9.2e18)
		return -1;
	*out = (int64_t)d;
	if ((double)*out < d)
		(*out)++; /* rounded up: never early */
	return 0;
}

enum ladder_delay ladder_delay(const amqp_table_t *t, const char *name, int64_t *ms)
{
	int i = table_find(t, name);
	const amqp_field_value_t *v;
	int64_t n = 0;

	if (i < 0)
		return LADDER_DELAY_NONE;
	v = &t->entries[i].value;
	if (ladder_int(v, &n) == 0) {
		/* integer kinds */
	} else if (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES) {
		char buf[32], *end;
		size_t len = v->value.bytes.len, k = 0;

		if (len == 0 || len >= sizeof(buf))
			return LADDER_DELAY_BAD;
		memcpy(buf, v->value.bytes.bytes, len);
		buf[len] = '\0';
		if (buf[0] == '-' || buf[0] == '+')
			k = 1;
		if (buf[k] < '0' || buf[k] > '9')
			return LADDER_DELAY_BAD;
		errno = 0;
		n = strtoll(buf, &end, 10);
		if (errno != 0 || *end != '\0')
			return LADDER_DELAY_BAD;
	} else if (v->kind == AMQP_FIELD_KIND_F64) {
		if (ladder_from_double(v->value.f64, &n) != 0)
			return LADDER_DELAY_BAD;
	} else if (v->kind == AMQP_FIELD_KIND_F32) {
		if (ladder_from_double(v->value.f32, &n) != 0)
			return LADDER_DELAY_BAD;
	} else if (v->kind == AMQP_FIELD_KIND_DECIMAL) {
		double d = (double)(int32_t)v->value.decimal.value;
		unsigned k;

		for (k = 0; k < v->value.decimal.decimals; k++)
			d /= 10;
		if (ladder_from_double(d, &n) != 0)
			return LADDER_DELAY_BAD;
	} else {
		return LADDER_DELAY_BAD;
	}
	*ms = n;
	return n > 0 ? LADDER_DELAY_OK : LADDER_DELAY_NOW;
}

static void ladder_headers(amqp_basic_properties_t *p)
{
	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) {
		p->headers.num_entries = 0;
		p->headers.entries = NULL;
		p->_flags |= AMQP_BASIC_HEADERS_FLAG;
	}
}

static int ladder_add(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t exchange,
		      amqp_bytes_t routing_key, int64_t due_at, amqp_bytes_t content_type)
{
	amqp_field_value_t due = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = due_at};

	ladder_headers(p);
	if (table_set_string(&p->headers, pool, LADDER_H_EXCHANGE, exchange) != 0 ||
	    table_set_string(&p->headers, pool, LADDER_H_ROUTING, routing_key) != 0 ||
	    table_set(&p->headers, pool, LADDER_H_DUE_AT, &due) != 0 ||
	    table_set_string(&p->headers, pool, LADDER_H_CONTENT, content_type) != 0)
		return -1;
	return 0;
}

int ladder_rewrite(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t exchange,
		   amqp_bytes_t routing_key, const char *delay_header, int64_t due_at)
{
	amqp_bytes_t ct = {0, ""};

	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		ct = p->content_type;
	ladder_headers(p);
	table_remove(&p->headers, delay_header);
	return ladder_add(p, pool, exchange, routing_key, due_at, ct);
}

int ladder_readd(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t exchange,
		 amqp_bytes_t routing_key, int64_t due_at)
{
	amqp_bytes_t ct = {0, ""};

	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		ct = p->content_type;
	return ladder_add(p, pool, exchange, routing_key, due_at, ct);
}

int ladder_set_id(amqp_basic_properties_t *p, amqp_pool_t *pool, amqp_bytes_t id)
{
	ladder_headers(p);
	return table_set_string(&p->headers, pool, LADDER_H_ID, id);
}

void ladder_plan(const amqp_basic_properties_t *p, int64_t now_ms, struct ladder_plan *plan)
{
	const amqp_table_t *t = &p->headers;
	int i;

	memset(plan, 0, sizeof(*plan));
	plan->action = LADDER_MALFORMED;
	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return;
	/* The content type may be left out when the message had none. */
	if (table_get_string(t, LADDER_H_EXCHANGE, &plan->exchange) != 0 ||
	    table_get_string(t, LADDER_H_ROUTING, &plan->routing_key) != 0)
		return;
	i = table_find(t, LADDER_H_DUE_AT);
	if (i < 0 || ladder_int(&t->entries[i].value, &plan->due_at) != 0)
		return;
	if (table_get_string(t, LADDER_H_ID, &plan->id) != 0)
		plan->id.len = 0;
	if (plan->due_at <= now_ms) {
		plan->action = LADDER_DELIVER;
		return;
	}
	plan->action = LADDER_HOP;
	plan->rung = ladder_rung_for(plan->due_at - now_ms);
}

static int ladder_is_own(amqp_bytes_t queue)
{
	static const char prefix[] = LADDER_EXCHANGE ".";

	return queue.len >= sizeof(prefix) - 1 &&
	       memcmp(queue.bytes, prefix, sizeof(prefix) - 1) == 0;
}

/* Drop the ladder's entries from the broker's x-death list, and the
 * first/last death headers when they name a ladder queue. */
static void ladder_forget_deaths(amqp_table_t *t)
{
	static const char *const pairs[][4] = {
	    {"x-first-death-queue", "x-first-death-reason", "x-first-death-exchange", NULL},
	    {"x-last-death-queue", "x-last-death-reason", "x-last-death-exchange", NULL},
	};
	amqp_bytes_t q;
	int i, j, k;

	i = table_find(t, "x-death");
	if (i >= 0 && t->entries[i].value.kind == AMQP_FIELD_KIND_ARRAY) {
		amqp_array_t *a = &t->entries[i].value.value.array;

		for (j = 0, k = 0; j < a->num_entries; j++) {
			amqp_field_value_t *e = &a->entries[j];

			if (e->kind == AMQP_FIELD_KIND_TABLE &&
			    table_get_string(&e->value.table, "queue", &q) == 0 &&
			    ladder_is_own(q))
				continue;
			a->entries[k++] = *e;
		}
		a->num_entries = k;
		if (k == 0)
			table_remove(t, "x-death");
	}
	for (i = 0; i < 2; i++) {
		if (table_get_string(t, pairs[i][0], &q) != 0 || !ladder_is_own(q))
			continue;
		for (j = 0; pairs[i][j]; j++)
			table_remove(t, pairs[i][j]);
	}
}

int ladder_final(amqp_basic_properties_t *p, amqp_pool_t *pool)
{
	amqp_bytes_t ct;
	void *copy;

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return 0;
	if (table_get_string(&p->headers, LADDER_H_CONTENT, &ct) == 0) {
		if (ct.len == 0) {
			p->_flags &= ~AMQP_BASIC_CONTENT_TYPE_FLAG;
		} else {
			if ((copy = amqp_pool_alloc(pool, ct.len)) == NULL)
				return -1;
			memcpy(copy, ct.bytes, ct.len);
			p->content_type.bytes = copy;
			p->content_type.len = ct.len;
			p->_flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
		}
	}
	table_remove(&p->headers, LADDER_H_EXCHANGE);
	table_remove(&p->headers, LADDER_H_ROUTING);
	table_remove(&p->headers, LADDER_H_DUE_AT);
	table_remove(&p->headers, LADDER_H_CONTENT);
	table_remove(&p->headers, LADDER_H_ID);
	ladder_forget_deaths(&p->headers);
	return 0;
}

amqp_table_t ladder_rung_args(const struct ladder_rung *r, amqp_table_entry_t entries[3])
{
	amqp_table_t t;

	entries[0].key = amqp_cstring_bytes("x-message-ttl");
	entries[0].value.kind = AMQP_FIELD_KIND_I64;
	entries[0].value.value.i64 = r->ttl_ms;
	entries[1].key = amqp_cstring_bytes("x-dead-letter-exchange");
	entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
	entries[1].value.value.bytes = amqp_cstring_bytes(LADDER_EXCHANGE);
	entries[2].key = amqp_cstring_bytes("x-dead-letter-routing-key");
	entries[2].value.kind = AMQP_FIELD_KIND_UTF8;
	entries[2].value.value.bytes = amqp_cstring_bytes(LADDER_DUE);
	t.num_entries = 3;
	t.entries = entries;
	return t;
}
