/* surplus: deliveries a channel's consumer receives from the broker beyond
 * the client's prefetch, kept in order until the client has room for them
 * (see surplus.h). */
#include "surplus.h"

#include "debug.h"

#include <stdlib.h>
#include <string.h>

/* A delivery: at the client (msg NULL) or waiting here. */
struct surplus_slot {
	void *msg;
	uint64_t tag;
	size_t size;
};

/* Slots in broker tag order, taken from the front. */
struct surplus_fifo {
	struct surplus_slot *v;
	size_t head, len, cap;
};

struct surplus_consumer {
	char *tag;
	size_t taglen;
	uint16_t limit;          /* the client's prefetch */
	int cancelled;           /* what waits goes regardless of room; then forgotten */
	int draining;            /* what waits goes regardless of room, once */
	struct surplus_fifo out; /* at the client, not settled */
	struct surplus_fifo w;   /* waiting */
};

uint16_t surplus_auto(uint16_t prefetch)
{
	return prefetch < SURPLUS_AUTO_MIN ? 0 : SURPLUS_EXTRA_MAX;
}

uint16_t surplus_prefetch(uint16_t prefetch, uint16_t extra)
{
	if (extra > SURPLUS_EXTRA_MAX)
		extra = SURPLUS_EXTRA_MAX;
	return (uint32_t)prefetch + extra > 65535 ? 65535 : (uint16_t)(prefetch + extra);
}

static struct surplus_consumer *surplus_find(struct surplus *s, const void *tag, size_t len)
{
	int i;

	for (i = 0; s && i < s->n; i++)
		if (s->c[i].taglen == len && memcmp(s->c[i].tag, tag, len) == 0)
			return &s->c[i];
	return NULL;
}

static void surplus_consumer_free(struct surplus *s, struct surplus_consumer *c,
				  void (*drop)(void *msg))
{
	size_t i;

	/* Only a consumer with nothing waiting is let go without a drop. */
	ACEMQ_ASSERT(drop != NULL || c->w.len == 0);
	for (i = 0; i < c->w.len; i++) {
		s->bytes -= c->w.v[c->w.head + i].size;
		drop(c->w.v[c->w.head + i].msg);
	}
	free(c->w.v);
	free(c->out.v);
	free(c->tag);
}

static void surplus_remove(struct surplus *s, struct surplus_consumer *c,
			   void (*drop)(void *msg))
{
	int i = (int)(c - s->c);

	surplus_consumer_free(s, c, drop);
	memmove(&s->c[i], &s->c[i + 1], (size_t)(s->n - i - 1) * sizeof(*s->c));
	s->n--;
}

int surplus_add(struct surplus **sp, uint16_t channel, const void *tag, size_t len,
		uint16_t limit)
{
	struct surplus *s = *sp;
	struct surplus_consumer *n, *c;

	if (s == NULL) {
		if ((s = calloc(1, sizeof(*s))) == NULL)
			return -1;
		s->channel = channel;
		list_init(&s->due);
		list_init(&s->kept);
		*sp = s;
	}
	if ((c = surplus_find(s, tag, len)) != NULL) {
		c->limit = limit; /* the same tag again: the broker refuses it */
		return 0;
	}
	n = realloc(s->c, (size_t)(s->n + 1) * sizeof(*n));
	if (n == NULL)
		return -1;
	s->c = n;
	c = &s->c[s->n];
	memset(c, 0, sizeof(*c));
	if ((c->tag = malloc(len ? len : 1)) == NULL)
		return -1;
	memcpy(c->tag, tag, len);
	c->taglen = len;
	c->limit = limit;
	s->n++;
	return 0;
}

static int surplus_push(struct surplus_fifo *f, void *msg, uint64_t tag, size_t size)
{
	if (f->head + f->len == f->cap) {
		if (f->head > 0) {
			memmove(f->v, f->v + f->head, f->len * sizeof(*f->v));
			f->head = 0;
		} else {
			size_t ncap = f->cap ? f->cap * 2 : 16;
			struct surplus_slot *nv = realloc(f->v, ncap * sizeof(*nv));

			if (nv == NULL)
				return -1;
			f->v = nv;
			f->cap = ncap;
		}
	}
	f->v[f->head + f->len].msg = msg;
	f->v[f->head + f->len].tag = tag;
	f->v[f->head + f->len].size = size;
	f->len++;
	return 0;
}

static struct surplus_slot surplus_pop(struct surplus_fifo *f)
{
	struct surplus_slot sl = f->v[f->head++];

	if (--f->len == 0)
		f->head = 0;
	return sl;
}

/* Remove tag from f; 1 if it was there. */
static int surplus_take(struct surplus_fifo *f, uint64_t tag)
{
	size_t lo = 0, hi = f->len;

	if (f->len == 0 || tag < f->v[f->head].tag || tag > f->v[f->head + f->len - 1].tag)
		return 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint64_t t = f->v[f->head + mid].tag;

		if (t == tag) {
			if (mid == 0) {
				(void)surplus_pop(f);
				return 1;
			}
			memmove(&f->v[f->head + mid], &f->v[f->head + mid + 1],
				(f->len - mid - 1) * sizeof(*f->v));
			f->len--;
			return 1;
		}
		if (t < tag)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

int surplus_admit(struct surplus *s, const void *tag, size_t len, uint64_t broker_tag,
		  void *msg, size_t size, int now)
{
	struct surplus_consumer *c = surplus_find(s, tag, len);

	if (c == NULL)
		return 0;
	/* Now: it cannot wait (a stream); whatever waited went first. */
	ACEMQ_ASSERT(!now || c->w.len == 0);
	if (c->w.len == 0 && (c->out.len < c->limit || c->cancelled || now)) {
		/* Counted if it can be; otherwise it goes uncounted, and the
		 * client may get one more than it asked for. */
		if (!c->cancelled)
			(void)surplus_push(&c->out, NULL, broker_tag, 0);
		return SURPLUS_NOW;
	}
	if (size > SURPLUS_BYTES_MAX - s->bytes ||
	    surplus_push(&c->w, msg, broker_tag, size) != 0) {
		/* Not kept: what waits goes, and it after. */
		c->draining = 1;
		return SURPLUS_FULL;
	}
	s->bytes += size;
	return SURPLUS_KEPT;
}

int surplus_settled(struct surplus *s, uint64_t broker_tag)
{
	int i;

	for (i = 0; s && i < s->n; i++)
		if (surplus_take(&s->c[i].out, broker_tag))
			return s->c[i].w.len > 0;
	return 0;
}

void *surplus_next(struct surplus *s, uint64_t *broker_tag)
{
	int i;

	for (i = 0; s && i < s->n; i++) {
		struct surplus_consumer *c = &s->c[i];
		struct surplus_slot w;

		if (c->w.len == 0) {
			c->draining = 0;
			if (c->cancelled) {
				surplus_remove(s, c, NULL);
				i--;
			}
			continue;
		}
		if (!c->cancelled && !c->draining && c->out.len >= c->limit)
			continue;
		w = surplus_pop(&c->w);
		s->bytes -= w.size;
		if (!c->cancelled)
			(void)surplus_push(&c->out, NULL, w.tag, 0);
		*broker_tag = w.tag;
		return w.msg;
	}
	return NULL;
}

void surplus_cancel(struct surplus *s, const void *tag, size_t len)
{
	struct surplus_consumer *c = surplus_find(s, tag, len);

	if (c == NULL)
		return;
	if (c->w.len == 0)
		surplus_remove(s, c, NULL);
	else
		c->cancelled = 1;
}

void surplus_drain(struct surplus *s, const void *tag, size_t len)
{
	struct surplus_consumer *c = surplus_find(s, tag, len);

	if (c && c->w.len > 0)
		c->draining = 1;
}

size_t surplus_waiting(const struct surplus *s)
{
	size_t n = 0;
	int i;

	for (i = 0; s && i < s->n; i++)
		n += s->c[i].w.len;
	return n;
}

void surplus_recover(struct surplus *s, void (*drop)(void *msg))
{
	int i;

	for (i = 0; s && i < s->n; i++) {
		struct surplus_consumer *c = &s->c[i];

		while (c->w.len > 0) {
			struct surplus_slot w = surplus_pop(&c->w);

			s->bytes -= w.size;
			drop(w.msg);
		}
		c->out.head = c->out.len = 0;
	}
}

void surplus_free(struct surplus *s, void (*drop)(void *msg))
{
	int i;

	if (s == NULL)
		return;
	list_del(&s->due);
	list_del(&s->kept);
	for (i = 0; i < s->n; i++)
		surplus_consumer_free(s, &s->c[i], drop);
	free(s->c);
	free(s);
}

void surplus_each(struct surplus *s, void (*fn)(void *arg, void *msg, uint64_t broker_tag),
		  void *arg)
{
	struct surplus_fifo *f;
	size_t j;
	int i;

	for (i = 0; s && i < s->n; i++) {
		f = &s->c[i].w;
		for (j = 0; j < f->len; j++)
			fn(arg, f->v[f->head + j].msg, f->v[f->head + j].tag);
	}
}
