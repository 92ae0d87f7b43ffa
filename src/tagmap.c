/* tagmap: translate delivery tags and confirm sequence numbers between a
 * client's view and the broker's when the proxy swallows, holds or answers. */
#include "tagmap.h"

#include "debug.h"

#include <stdlib.h>
#include <string.h>

enum { SIDE_CLIENT = 0, SIDE_BROKER = 1 };

static uint64_t *tagmap_at(struct tagmap_pairs *p, size_t i)
{
	ACEMQ_ASSERT(i < p->len);
	return p->v[(p->head + i) % p->cap];
}

static int tagmap_push(struct tagmap_pairs *p, uint64_t client, uint64_t broker)
{
	uint64_t *slot;

	/* The client side, numbered here, ascends: the binary search relies
	 * on it. (The broker side comes from the broker: not asserted.) */
	ACEMQ_ASSERT(p->len == 0 || tagmap_at(p, p->len - 1)[SIDE_CLIENT] < client);
	if (p->len == p->cap) {
		size_t ncap = p->cap ? p->cap * 2 : 16, i;
		uint64_t(*nv)[2] = malloc(ncap * sizeof(*nv));

		if (nv == NULL)
			return -1;
		for (i = 0; i < p->len; i++)
			memcpy(nv[i], tagmap_at(p, i), sizeof(nv[i]));
		free(p->v);
		p->v = nv;
		p->cap = ncap;
		p->head = 0;
	}
	slot = p->v[(p->head + p->len) % p->cap];
	slot[SIDE_CLIENT] = client;
	slot[SIDE_BROKER] = broker;
	p->len++;
	return 0;
}

static void tagmap_trim(struct tagmap_pairs *p)
{
	while (p->len > 0 && tagmap_at(p, 0)[SIDE_BROKER] == 0) {
		p->head = (p->head + 1) % p->cap;
		p->len--;
	}
	if (p->len == 0)
		p->head = 0;
}

/* Index of the pair whose side equals key, or -1 (binary search; tombstones
 * keep their client key, and broker keys are looked up linearly by range). */
static long tagmap_find(struct tagmap_pairs *p, int side, uint64_t key)
{
	size_t lo = 0, hi = p->len;

	if (side == SIDE_CLIENT) {
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			uint64_t k = tagmap_at(p, mid)[SIDE_CLIENT];

			if (k == key)
				return tagmap_at(p, mid)[SIDE_BROKER] ? (long)mid : -1;
			if (k < key)
				lo = mid + 1;
			else
				hi = mid;
		}
		return -1;
	}
	for (lo = 0; lo < p->len; lo++)
		if (tagmap_at(p, lo)[SIDE_BROKER] == key)
			return (long)lo;
	return -1;
}

/* From index *i on, the next pair not settled whose broker side is at most
 * upto, or NULL (*i then past the last one looked at). */
static uint64_t *tagmap_next_live(struct tagmap_pairs *p, size_t *i, uint64_t upto)
{
	for (; *i < p->len; (*i)++) {
		uint64_t *pair = tagmap_at(p, *i);

		if (pair[SIDE_BROKER] == 0)
			continue;
		return pair[SIDE_BROKER] <= upto ? pair : NULL;
	}
	return NULL;
}

static void tagmap_pairs_free(struct tagmap_pairs *p)
{
	free(p->v);
	memset(p, 0, sizeof(*p));
}

void tagmap_init(struct tagmap *tm)
{
	memset(tm, 0, sizeof(*tm));
}

void tagmap_reset(struct tagmap *tm)
{
	tagmap_pairs_free(&tm->out);
	free(tm->held);
	tagmap_init(tm);
}

uint64_t tagmap_deliver(struct tagmap *tm, uint64_t broker_tag, int needs_ack)
{
	uint64_t client = ++tm->next_client;

	if (!needs_ack)
		return client;
	if (tm->out.len == 0) {
		tm->disordered = 0;
		tm->top_broker = 0;
	}
	if (broker_tag < tm->top_broker)
		tm->disordered = 1;
	else
		tm->top_broker = broker_tag;
	if (tagmap_push(&tm->out, client, broker_tag) != 0)
		return 0;
	return client;
}

int tagmap_hold(struct tagmap *tm, uint64_t broker_tag)
{
	if (tm->nheld == tm->capheld) {
		size_t ncap = tm->capheld ? tm->capheld * 2 : 8;
		uint64_t *nh = realloc(tm->held, ncap * sizeof(*nh));

		if (nh == NULL)
			return -1;
		tm->held = nh;
		tm->capheld = ncap;
	}
	tm->held[tm->nheld++] = broker_tag;
	return 0;
}

void tagmap_unhold(struct tagmap *tm, uint64_t broker_tag)
{
	size_t i;

	for (i = 0; i < tm->nheld; i++) {
		if (tm->held[i] == broker_tag) {
			memmove(tm->held + i, tm->held + i + 1,
				(tm->nheld - i - 1) * sizeof(*tm->held));
			tm->nheld--;
			return;
		}
	}
	/* Holds balance: only a held delivery is let go, and only once. */
	ACEMQ_ASSERT(!"tagmap_unhold of a tag not held");
}

static int tagmap_held_below(const struct tagmap *tm, uint64_t broker_tag)
{
	size_t i;

	for (i = 0; i < tm->nheld; i++)
		if (tm->held[i] < broker_tag)
			return 1;
	return 0;
}

int tagmap_settle(struct tagmap *tm, uint64_t client_tag, int multiple, tagmap_emit_fn emit,
		  void *arg)
{
	struct tagmap_pairs *p = &tm->out;
	size_t i, n = 0;
	uint64_t top = 0;
	long at;

	if (!multiple) {
		at = tagmap_find(p, SIDE_CLIENT, client_tag);
		if (at < 0)
			return -1;
		emit(arg, tagmap_at(p, (size_t)at)[SIDE_BROKER], 0);
		tagmap_at(p, (size_t)at)[SIDE_BROKER] = 0;
		tagmap_trim(p);
		return 0;
	}
	if (client_tag != 0 && tagmap_find(p, SIDE_CLIENT, client_tag) < 0)
		return -1;
	for (i = 0; i < p->len; i++) {
		uint64_t *pair = tagmap_at(p, i);

		if (client_tag != 0 && pair[SIDE_CLIENT] > client_tag)
			break;
		if (pair[SIDE_BROKER] != 0) {
			top = pair[SIDE_BROKER];
			n++;
		}
	}
	if (n == 0)
		return client_tag == 0 ? 0 : -1;
	if (!tm->disordered && !tagmap_held_below(tm, top)) {
		emit(arg, top, 1);
		for (i = 0; i < p->len && tagmap_at(p, i)[SIDE_BROKER] <= top; i++)
			tagmap_at(p, i)[SIDE_BROKER] = 0;
	} else {
		/* One by one: a single multiple settle up to top would also
		 * cover a delivery held, or one the client has later. */
		for (i = 0; i < p->len; i++) {
			uint64_t *pair = tagmap_at(p, i);

			if (client_tag != 0 && pair[SIDE_CLIENT] > client_tag)
				break;
			if (pair[SIDE_BROKER] != 0) {
				emit(arg, pair[SIDE_BROKER], 0);
				pair[SIDE_BROKER] = 0;
			}
		}
	}
	tagmap_trim(p);
	return 0;
}

int tagmap_covered(const struct tagmap *tm, uint64_t client_tag, int multiple,
		   void (*fn)(void *arg, uint64_t broker_tag), void *arg)
{
	const struct tagmap_pairs *p = &tm->out;
	size_t i;
	long at;

	if (!multiple) {
		at = tagmap_find((struct tagmap_pairs *)p, SIDE_CLIENT, client_tag);
		if (at < 0)
			return -1;
		fn(arg, tagmap_at((struct tagmap_pairs *)p, (size_t)at)[SIDE_BROKER]);
		return 0;
	}
	if (client_tag != 0 &&
	    tagmap_find((struct tagmap_pairs *)p, SIDE_CLIENT, client_tag) < 0)
		return -1;
	for (i = 0; i < p->len; i++) {
		uint64_t *pair = tagmap_at((struct tagmap_pairs *)p, i);

		if (client_tag != 0 && pair[SIDE_CLIENT] > client_tag)
			break;
		if (pair[SIDE_BROKER] != 0)
			fn(arg, pair[SIDE_BROKER]);
	}
	return 0;
}

size_t tagmap_outstanding(const struct tagmap *tm)
{
	size_t i, n = 0;

	for (i = 0; i < tm->out.len; i++)
		if (tm->out.v[(tm->out.head + i) % tm->out.cap][SIDE_BROKER])
			n++;
	return n;
}

void confirmmap_init(struct confirmmap *cm)
{
	memset(cm, 0, sizeof(*cm));
}

void confirmmap_reset(struct confirmmap *cm)
{
	tagmap_pairs_free(&cm->out);
	free(cm->held);
	confirmmap_init(cm);
}

uint64_t confirmmap_forward(struct confirmmap *cm)
{
	uint64_t client = ++cm->next_client;

	if (tagmap_push(&cm->out, client, ++cm->next_broker) != 0)
		return 0;
	return client;
}

uint64_t confirmmap_answer(struct confirmmap *cm)
{
	return ++cm->next_client;
}

static struct confirmhold *confirmmap_held(struct confirmmap *cm, uint64_t broker_seq)
{
	size_t lo = 0, hi = cm->nheld;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (cm->held[mid].broker == broker_seq)
			return &cm->held[mid];
		if (cm->held[mid].broker < broker_seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* A multiple confirm that reaches a held publish: what lies below the
 * lowest held one goes as one multiple confirm, every other one alone,
 * and the held ones keep the broker's outcome. */
static int confirmmap_settle_around(struct confirmmap *cm, uint64_t broker_seq, int acked,
				    tagmap_emit_fn emit, void *arg)
{
	struct tagmap_pairs *p = &cm->out;
	uint64_t lowest = cm->held[0].broker, top = 0;
	struct confirmhold *h;
	uint64_t *pair;
	size_t i;
	int any = 0;

	for (i = 0; (pair = tagmap_next_live(p, &i, broker_seq)) != NULL; i++) {
		if (pair[SIDE_BROKER] < lowest) {
			top = pair[SIDE_CLIENT];
		} else {
			if (top) {
				emit(arg, top, 1);
				top = 0;
			}
			if ((h = confirmmap_held(cm, pair[SIDE_BROKER])) != NULL)
				h->outcome = acked ? CONFIRM_ACKED : CONFIRM_NACKED;
			else
				emit(arg, pair[SIDE_CLIENT], 0);
		}
		pair[SIDE_BROKER] = 0;
		any = 1;
	}
	if (top)
		emit(arg, top, 1);
	tagmap_trim(p);
	return any ? 0 : -1;
}

int confirmmap_settle(struct confirmmap *cm, uint64_t broker_seq, int multiple, int acked,
		      tagmap_emit_fn emit, void *arg)
{
	struct tagmap_pairs *p = &cm->out;
	struct confirmhold *h;
	uint64_t top = 0, *pair;
	size_t i;
	long at;

	if (!multiple) {
		at = tagmap_find(p, SIDE_BROKER, broker_seq);
		if (at < 0)
			return -1;
		if ((h = confirmmap_held(cm, broker_seq)) != NULL)
			h->outcome = acked ? CONFIRM_ACKED : CONFIRM_NACKED;
		else
			emit(arg, tagmap_at(p, (size_t)at)[SIDE_CLIENT], 0);
		tagmap_at(p, (size_t)at)[SIDE_BROKER] = 0;
		tagmap_trim(p);
		return 0;
	}
	if (cm->nheld > 0 && cm->held[0].broker <= broker_seq)
		return confirmmap_settle_around(cm, broker_seq, acked, emit, arg);
	/* Client seqs the proxy answered were confirmed at once, so a multiple
	 * confirm up to the highest forwarded one covers exactly these. */
	for (i = 0; (pair = tagmap_next_live(p, &i, broker_seq)) != NULL; i++) {
		top = pair[SIDE_CLIENT];
		pair[SIDE_BROKER] = 0;
	}
	tagmap_trim(p);
	if (top == 0)
		return -1;
	emit(arg, top, 1);
	return 0;
}

int confirmmap_hold(struct confirmmap *cm, uint64_t broker_seq)
{
	struct tagmap_pairs *p = &cm->out;
	uint64_t client = 0;
	size_t i;

	/* Held as it is forwarded: its pair is at the end. */
	for (i = p->len; i > 0; i--)
		if (tagmap_at(p, i - 1)[SIDE_BROKER] == broker_seq) {
			client = tagmap_at(p, i - 1)[SIDE_CLIENT];
			break;
		}
	if (client == 0 || (cm->nheld > 0 && cm->held[cm->nheld - 1].broker >= broker_seq))
		return -1;
	if (cm->nheld == cm->capheld) {
		size_t ncap = cm->capheld ? cm->capheld * 2 : 16;
		struct confirmhold *nh = realloc(cm->held, ncap * sizeof(*nh));

		if (nh == NULL)
			return -1;
		cm->held = nh;
		cm->capheld = ncap;
	}
	cm->held[cm->nheld++] = (struct confirmhold){broker_seq, client, CONFIRM_NONE};
	return 0;
}

int confirmmap_release(struct confirmmap *cm, uint64_t broker_seq, uint64_t *client)
{
	struct confirmhold *h = confirmmap_held(cm, broker_seq);
	int outcome;

	if (h == NULL)
		return -1;
	outcome = h->outcome;
	*client = h->client;
	memmove(h, h + 1, (size_t)(cm->held + cm->nheld - (h + 1)) * sizeof(*h));
	cm->nheld--;
	return outcome;
}

void confirmmap_covered(const struct confirmmap *cm, uint64_t broker_seq, int multiple,
			void (*fn)(void *arg, uint64_t broker_seq), void *arg)
{
	struct tagmap_pairs *p = (struct tagmap_pairs *)&cm->out;
	size_t i;

	for (i = 0; i < p->len; i++) {
		uint64_t seq = tagmap_at(p, i)[SIDE_BROKER];

		if (seq == 0)
			continue;
		if (seq > broker_seq)
			break;
		if (!multiple && seq != broker_seq)
			continue;
		fn(arg, seq);
		if (!multiple)
			break;
	}
}

int confirmmap_pending(const struct confirmmap *cm)
{
	size_t i;

	if (cm->nheld > 0)
		return 1;
	for (i = 0; i < cm->out.len; i++)
		if (cm->out.v[(cm->out.head + i) % cm->out.cap][SIDE_BROKER] != 0)
			return 1;
	return 0;
}
