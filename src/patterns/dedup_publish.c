/* dedup_publish: a publish whose deduplication header value was already
 * published within the window is answered by the proxy, not forwarded.
 * A value is reserved in the state layer while its publish is in flight
 * and remembered for the window once the broker has confirmed it (or once
 * it is forwarded on a channel without confirms); a nack, a basic.return,
 * a publish that is not forwarded after all or an outcome the proxy never
 * learns gives the reservation up, so a retry goes through. A publish of a
 * value in flight waits for that one's outcome. While a publish waits for
 * its check, the checks of the publishes behind it go out with it
 * (look-ahead): they share one commit. */
#include "dedup_publish.h"

#include "../../amqp/content.h"
#include "../../amqp/frame_scan.h"
#include "../../amqp/method.h"
#include "../../amqp/table.h"
#include "../channel.h"
#include "../hash.h"
#include "../link.h"
#include "../log.h"
#include "../pipeline.h"
#include "../rules.h"
#include "../store/idem.h"
#include "../vstats.h"
#include "../worker.h"
#include "reply_to.h"

#include <event2/event.h>
#include <inttypes.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEDUP_PUBLISH_LEASE_MS    10000 /* how long a publish in flight holds its value */
#define DEDUP_PUBLISH_POLL_MIN_MS 10    /* a value in flight elsewhere: asked again after */
#define DEDUP_PUBLISH_POLL_MAX_MS 250
#define DEDUP_PUBLISH_BUCKETS     256

enum dedup_publish_phase {
	PHASE_CHECKING,   /* its check is out; the publish waits for it */
	PHASE_WAITING,    /* the value is in flight elsewhere: checked again soon */
	PHASE_PASSED,     /* reserved and passed on; the pipeline has the publish */
	PHASE_CONFIRMING, /* forwarded: the broker's ack or nack decides */
};

struct dedup_publish;
struct dedup_publish_op;

/* One publish with a value, from its check to its outcome. */
struct dedup_publish_entry {
	struct dedup_publish *st;
	enum dedup_publish_phase phase;
	uint16_t channel;
	uint64_t broker_seq; /* CONFIRMING */
	uint64_t owner[2];
	struct pipe_msg *m; /* CHECKING, WAITING: ours; PASSED: its identity only */
	struct dedup_publish_op *op;
	struct event *timer; /* WAITING: the next check */
	long poll_ms;
	long window_s;
	int postgresql;         /* its rule keeps the values in PostgreSQL */
	unsigned mandatory : 1; /* a basic.return may come for it */
	unsigned returned : 1;  /* ... and did: not remembered */
	unsigned gone : 1;      /* its channel closed while it waited */
	unsigned waited : 1;    /* counted as waiting once */
	unsigned ahead : 1;     /* checked ahead: its publish is not read yet */
	unsigned answered : 1;  /* the check's answer is in rc and answer */
	unsigned reserved : 1;  /* the value is reserved for it in the store */
	unsigned recheck : 1;   /* an "in flight" answer to its check is stale */
	int rc;
	enum idem_answer answer;
	size_t elen, vlen;
	char exchange[256];
	char *value;
	struct list node;  /* in its list, in publish order */
	struct list hnode; /* CONFIRMING: in the table by channel and sequence */
};

/* A store operation; outlives its entry when nobody waits for it (the
 * link cut: see link.h). */
struct dedup_publish_op {
	struct idem_req req; /* first: its worker_call is the completion */
	struct link to;      /* its entry */
};

struct dedup_publish {
	struct pipeline *p;
	uint64_t seq;           /* publishes checked: their owners */
	struct list checks;     /* not forwarded yet, and looked ahead at */
	struct list confirming; /* forwarded, awaiting the broker */
	struct hash confirms;   /* the confirming ones by channel and sequence */
	struct list buckets[DEDUP_PUBLISH_BUCKETS];
	int nmandatory;   /* confirming mandatory ones a basic.return may be for */
	int nwaiting;     /* WAITING ones (the client's frames wait: one at most) */
	amqp_pool_t pool; /* look-ahead decoding */
};

static uint64_t dedup_publish_instance;
static struct state *dedup_publish_state;

void dedup_publish_init(struct state *st)
{
	dedup_publish_state = st;
	if (RAND_bytes((unsigned char *)&dedup_publish_instance,
		       sizeof(dedup_publish_instance)) != 1)
		dedup_publish_instance = (uint64_t)time(NULL);
}

static const struct rules_dedup_publish *dedup_publish_rule(struct pipeline *p)
{
	const struct rules_vhost *v = pipeline_rules(p);

	return v && v->dedup_publish.enabled ? &v->dedup_publish : NULL;
}

/* The value of header name in p: a string as it is, an integer in decimal
 * (written to num); its length, 0 when there is none to use. */
static size_t dedup_publish_value(const amqp_basic_properties_t *p, const char *name,
				  char num[32], const void **out)
{
	*out = NULL;
	if (p == NULL || !(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return 0;
	return table_get_text(&p->headers, name, num, out);
}

/* A publish to a direct reply-to address, or a request that names one as
 * its reply-to: never delayed or answered by a pattern. */
static int dedup_publish_direct(const amqp_bytes_t *exchange, const amqp_bytes_t *rk)
{
	size_t n = strlen(REPLY_TO_DIRECT);

	return exchange->len == 0 && rk->len >= n && memcmp(rk->bytes, REPLY_TO_DIRECT, n) == 0;
}

/* Whether the rule applies to a publish (props NULL: not known yet). */
static int dedup_publish_applies(const struct rules_dedup_publish *r,
				 const amqp_basic_publish_t *p,
				 const amqp_basic_properties_t *props)
{
	if (dedup_publish_direct(&p->exchange, &p->routing_key) ||
	    !rules_matches(&r->match, p->exchange.bytes, p->exchange.len, p->routing_key.bytes,
			   p->routing_key.len))
		return 0;
	/* A request answered by direct reply-to. */
	return props == NULL || !(props->_flags & AMQP_BASIC_REPLY_TO_FLAG) ||
	       !dedup_publish_direct(&amqp_empty_bytes, &props->reply_to);
}

/* ---- entries ------------------------------------------------------------ */

static struct dedup_publish_entry *dedup_publish_find(struct dedup_publish *st, uint16_t ch,
						      uint64_t seq)
{
	struct dedup_publish_entry *e;

	hash_for_each_key (e, &st->confirms, hash_mix(seq, ch), hnode)
		if (e->channel == ch && e->broker_seq == seq)
			return e;
	return NULL;
}

static void dedup_publish_free(struct dedup_publish_entry *e)
{
	struct dedup_publish *st = e->st;

	list_del(&e->node);
	if (e->phase == PHASE_CONFIRMING) {
		hash_del(&e->hnode);
		if (e->mandatory && !e->returned && st->nmandatory > 0)
			st->nmandatory--;
	} else if (e->phase == PHASE_WAITING) {
		st->nwaiting--;
	}
	if (e->op)
		link_cut(&e->op->to); /* it completes on its own */
	if (e->timer)
		event_free(e->timer);
	if (e->m && e->phase != PHASE_PASSED)
		pipe_msg_free(e->m);
	free(e->value);
	free(e);
}

static int dedup_publish_same(const struct dedup_publish_entry *a,
			      const struct dedup_publish_entry *b)
{
	return a->elen == b->elen && a->vlen == b->vlen &&
	       memcmp(a->exchange, b->exchange, a->elen) == 0 &&
	       memcmp(a->value, b->value, a->vlen) == 0;
}

/* ---- store operations ------------------------------------------------------ */

static void dedup_publish_done(struct worker_call *c);

/* Hand one operation on e's value to the state layer; the op points back
 * to e (the caller may cut that link: then nobody waits for it). */
static struct dedup_publish_op *dedup_publish_submit(struct dedup_publish_entry *e,
						     enum idem_op what)
{
	struct pipeline *p = e->st->p;
	struct dedup_publish_op *op;
	uint64_t span = what == IDEM_CLAIM     ? DEDUP_PUBLISH_LEASE_MS
			: what == IDEM_CONFIRM ? (uint64_t)e->window_s * 1000
					       : 0;

	if ((op = calloc(1, sizeof(*op))) == NULL)
		return NULL;
	if (idem_dedup_prepare(&op->req, what, p->vhost, e->exchange, e->elen, e->value,
			       e->vlen, e->owner, state_now_ms(), span) != 0) {
		free(op);
		return NULL;
	}
	op->req.w.call.fn = dedup_publish_done;
	op->req.w.w = p->w;
	link_set(&op->to, e);
	if (idem_submit(dedup_publish_state, e->postgresql, &op->req) != 0) {
		free(op);
		return NULL;
	}
	return op;
}

/* Remember e's value (confirm) or give its reservation up (forget);
 * nobody waits for it. */
static void dedup_publish_let_go(struct dedup_publish_entry *e, enum idem_op what)
{
	struct stats *stats = &e->st->p->w->stats;
	struct dedup_publish_op *op = dedup_publish_submit(e, what);

	if (op)
		link_cut(&op->to);
	else
		stats->dedup_store_errors++;
	if (what == IDEM_FORGET)
		stats->dedup_forgotten++;
}

static void dedup_publish_recheck(struct dedup_publish_entry *x);

/* The outcome of e is on its way to the store: the checks of the same
 * value that were told it is in flight are asked again now, in this
 * turn, so they go out with that outcome and share its commit: a publish
 * waiting for it, one looked ahead at, one whose check is still out. */
static void dedup_publish_kick(struct dedup_publish *st, const struct dedup_publish_entry *e)
{
	struct dedup_publish_entry *x;
	struct timeval now = {0, 0};

	list_for_each_entry_safe (x, &st->checks, node) {
		if (x == e || !dedup_publish_same(x, e))
			continue;
		if (x->phase == PHASE_WAITING && x->timer) {
			x->poll_ms = DEDUP_PUBLISH_POLL_MIN_MS;
			evtimer_del(x->timer);
			evtimer_add(x->timer, &now);
		} else if (x->op) {
			x->recheck = 1;
		} else if (x->ahead && x->answered && x->rc == STATE_OK &&
			   x->answer == IDEM_IN_PROGRESS) {
			dedup_publish_recheck(x);
		}
	}
}

static void dedup_publish_again(evutil_socket_t fd, short what, void *arg);

/* What a publish whose check is answered becomes, with e->m its message:
 * passed on (reserved), answered (a duplicate), or waiting (the value is
 * in flight elsewhere: asked again soon). e is freed unless it stays with
 * the publish; the caller keeps m in hand. */
static enum pipe_verdict dedup_publish_answer(struct dedup_publish_entry *e, struct pipeline *p,
					      struct channel *ch)
{
	struct timeval tv;

	if (e->rc != STATE_OK) {
		/* The store could not say: forwarded (never lost; it may be a
		 * duplicate), and not remembered. Counted by the completion. */
		e->m = NULL;
		dedup_publish_free(e);
		return PIPE_PASS;
	}
	switch (e->answer) {
	case IDEM_DUPLICATE:
		STATS_INC(&p->w->stats, dedup_duplicate);
		vstats_add(vstats_get(p->vhost, NULL), VSTATS_dedup_duplicate);
		pipeline_log(p, LOG_DEBUG, "dedup_publish: a duplicate on channel %u answered",
			     ch->id);
		e->m = NULL;
		dedup_publish_free(e);
		return PIPE_ANSWER;
	case IDEM_IN_PROGRESS:
		/* The same value is in flight: asked again until its outcome is
		 * known (or its lease runs out). */
		if (!e->waited) {
			e->waited = 1;
			STATS_INC(&p->w->stats, dedup_waited);
		}
		if (e->phase != PHASE_WAITING)
			e->st->nwaiting++;
		e->phase = PHASE_WAITING;
		if (e->timer == NULL)
			e->timer = evtimer_new(p->w->base, dedup_publish_again, e);
		tv.tv_sec = e->poll_ms / 1000;
		tv.tv_usec = (e->poll_ms % 1000) * 1000;
		if (e->timer == NULL || evtimer_add(e->timer, &tv) != 0) {
			STATS_INC(&p->w->stats, dedup_store_errors);
			e->m = NULL;
			dedup_publish_free(e);
			return PIPE_PASS;
		}
		e->poll_ms = e->poll_ms * 2 > DEDUP_PUBLISH_POLL_MAX_MS
				 ? DEDUP_PUBLISH_POLL_MAX_MS
				 : e->poll_ms * 2;
		return PIPE_WAIT;
	default:
		/* Reserved: passed on (other hooks may still have their say). */
		STATS_INC(&p->w->stats, dedup_first);
		vstats_add(vstats_get(p->vhost, NULL), VSTATS_dedup_first);
		e->phase = PHASE_PASSED;
		return PIPE_PASS;
	}
}

/* A publish that waited (PIPE_WAIT) has its answer: finish it. */
static void dedup_publish_resume(struct dedup_publish_entry *e, struct pipeline *p)
{
	struct channel *ch = pipeline_channel(p, e->channel);
	struct pipe_msg *m = e->m;
	enum pipe_verdict v;

	if (e->gone || ch == NULL || ch->proxy_closing) {
		/* Its channel went: the publish goes with it, and a
		 * reservation made for it is given up. */
		if (e->reserved)
			dedup_publish_let_go(e, IDEM_FORGET);
		e->m = NULL;
		dedup_publish_free(e);
		pipeline_drop(p, m);
		return;
	}
	v = dedup_publish_answer(e, p, ch);
	if (v != PIPE_WAIT)
		pipeline_resume(p, ch, m, v);
}

static void dedup_publish_again_in(struct pipeline *p, void *arg)
{
	struct dedup_publish_entry *e = arg;

	if (e->gone) {
		dedup_publish_resume(e, p);
		return;
	}
	e->st->nwaiting--;
	e->phase = PHASE_CHECKING;
	e->answered = 0;
	e->op = dedup_publish_submit(e, IDEM_CLAIM);
	if (e->op == NULL) {
		STATS_INC(&p->w->stats, dedup_store_errors);
		e->answered = 1;
		e->rc = STATE_IO;
		dedup_publish_resume(e, p);
	}
}

static void dedup_publish_again(evutil_socket_t fd, short what, void *arg)
{
	struct dedup_publish_entry *e = arg;

	pipeline_call(e->st->p, dedup_publish_again_in, e);
}

static void dedup_publish_done_in(struct pipeline *p, void *arg)
{
	struct dedup_publish_op *op = arg;
	struct dedup_publish_entry *e = link_owner(&op->to);

	e->op = NULL;
	e->answered = 1;
	e->rc = op->req.w.rc;
	e->answer = op->req.answer;
	e->reserved = e->rc == STATE_OK && e->answer == IDEM_CLAIMED;
	if (e->recheck && e->rc == STATE_OK && e->answer == IDEM_IN_PROGRESS) {
		/* The value's outcome was written after this check: ask
		 * again rather than wait. */
		dedup_publish_recheck(e);
		if (!e->answered)
			return;
	}
	if (e->m == NULL)
		return; /* looked ahead: decided when its publish is read */
	dedup_publish_resume(e, p);
}

/* Ask about x's value again (its check is not out); when it cannot be
 * asked, x is answered with a store error (forwarded, not remembered). */
static void dedup_publish_recheck(struct dedup_publish_entry *x)
{
	x->recheck = 0;
	x->answered = 0;
	x->op = dedup_publish_submit(x, IDEM_CLAIM);
	if (x->op == NULL) {
		STATS_INC(&x->st->p->w->stats, dedup_store_errors);
		x->answered = 1;
		x->rc = STATE_IO;
	}
}

static void dedup_publish_done(struct worker_call *c)
{
	struct dedup_publish_op *op = (struct dedup_publish_op *)c;
	struct dedup_publish_entry *e = link_owner(&op->to);

	if (op->req.w.rc != STATE_OK)
		STATS_INC(&op->req.w.w->stats, dedup_store_errors);
	if (e && !pipeline_call(e->st->p, dedup_publish_done_in, op)) {
		/* The session is closing: what it reserved is given up when it
		 * goes. */
		e->op = NULL;
		e->reserved = op->req.w.rc == STATE_OK && op->req.answer == IDEM_CLAIMED;
	}
	free(op);
}

/* ---- entries of publishes not forwarded yet --------------------------------- */

/* A new entry for a publish of value to exchange on channel ch, its check
 * out; NULL when it cannot be asked (no memory, no state layer). */
static struct dedup_publish_entry *dedup_publish_check(struct dedup_publish *st, uint16_t ch,
						       const void *exchange, size_t elen,
						       int mandatory, const void *v,
						       size_t vlen,
						       const struct rules_dedup_publish *r)
{
	struct dedup_publish_entry *e;

	if (elen >= sizeof(e->exchange) || (e = calloc(1, sizeof(*e))) == NULL)
		return NULL;
	if ((e->value = malloc(vlen)) == NULL) {
		free(e);
		return NULL;
	}
	e->st = st;
	e->channel = ch;
	e->owner[0] = dedup_publish_instance ^ hash_spread(++st->seq);
	e->owner[1] = (st->p->id << 16) | ch;
	e->poll_ms = DEDUP_PUBLISH_POLL_MIN_MS;
	e->window_s = r->window_s;
	e->postgresql = r->store == RULES_KEYS_POSTGRESQL;
	e->mandatory = mandatory != 0;
	e->elen = elen;
	memcpy(e->exchange, exchange, elen);
	e->vlen = vlen;
	memcpy(e->value, v, vlen);
	e->phase = PHASE_CHECKING;
	list_init(&e->hnode);
	list_add_tail(&e->node, &st->checks);
	e->op = dedup_publish_submit(e, IDEM_CLAIM);
	if (e->op == NULL) {
		dedup_publish_free(e);
		return NULL;
	}
	return e;
}

/* An entry whose publish will not come to it (or the session went):
 * its reservation, made or still being made, is given up. */
static void dedup_publish_discard(struct dedup_publish_entry *e)
{
	if (e->op) {
		/* Its claim is still out: the forget goes after it. */
		link_cut(&e->op->to);
		e->op = NULL;
		dedup_publish_let_go(e, IDEM_FORGET);
	} else if (e->reserved) {
		dedup_publish_let_go(e, IDEM_FORGET);
	}
	dedup_publish_free(e);
}

/* The entry a publish read now was checked ahead as, if any: the first
 * looked-ahead one of the same channel, exchange and value (those before
 * it were for publishes that never came: given up). */
static struct dedup_publish_entry *dedup_publish_take(struct dedup_publish *st, uint16_t ch,
						      const amqp_bytes_t *exchange,
						      const void *v, size_t vlen)
{
	struct dedup_publish_entry *e, *x, *found = NULL;

	list_for_each_entry (e, &st->checks, node)
		if (e->ahead && e->channel == ch && e->elen == exchange->len &&
		    e->vlen == vlen && memcmp(e->exchange, exchange->bytes, e->elen) == 0 &&
		    memcmp(e->value, v, vlen) == 0 && !e->gone) {
			found = e;
			break;
		}
	list_for_each_entry_safe (x, &st->checks, node) {
		if (x == found)
			break;
		if (x->ahead)
			dedup_publish_discard(x);
	}
	return found;
}

/* Look-ahead: the publishes the client sent behind the one that waits,
 * under the rule and with a value, are checked now, together. */
struct dedup_publish_ahead {
	struct dedup_publish *st;
	const struct rules_dedup_publish *r;
	int pending; /* a basic.publish seen, waiting for its header */
	uint16_t channel;
	int mandatory;
	size_t elen;
	char exchange[256];
};

static int dedup_publish_ahead_frame(void *arg, const struct frame_info *fi,
				     const uint8_t *payload, size_t len)
{
	struct dedup_publish_ahead *a = arg;
	struct dedup_publish *st = a->st;
	amqp_basic_properties_t *props = NULL;
	amqp_method_number_t id;
	void *decoded;
	const void *v;
	char num[32];
	size_t vlen;

	if (fi->type == FRAME_METHOD) {
		amqp_basic_publish_t *p;

		a->pending = 0;
		if (payload == NULL || fi->class_id != 60 || fi->method_id != 40 ||
		    method_decode(payload, len, &st->pool, &id, &decoded) != 0)
			goto out;
		p = decoded;
		if (p->exchange.len >= sizeof(a->exchange) ||
		    !dedup_publish_applies(a->r, p, NULL))
			goto out;
		a->pending = 1;
		a->channel = fi->channel;
		a->mandatory = p->mandatory;
		a->elen = p->exchange.len;
		memcpy(a->exchange, p->exchange.bytes, a->elen);
	} else if (fi->type == FRAME_HEADER && a->pending && fi->channel == a->channel) {
		struct dedup_publish_entry *e;

		a->pending = 0;
		if (payload == NULL ||
		    content_props_decode(payload, len, &st->pool, &props) != 0)
			goto out;
		vlen = dedup_publish_value(props, a->r->header, num, &v);
		if (vlen == 0 || ((props->_flags & AMQP_BASIC_REPLY_TO_FLAG) &&
				  dedup_publish_direct(&amqp_empty_bytes, &props->reply_to)))
			goto out; /* no value, or a request answered by direct reply-to */
		e = dedup_publish_check(st, a->channel, a->exchange, a->elen, a->mandatory, v,
					vlen, a->r);
		if (e)
			e->ahead = 1;
	}
out:
	recycle_amqp_pool(&st->pool);
	return 0;
}

/* ---- the hook ---------------------------------------------------------------- */

static void *dedup_publish_attach(struct pipeline *p)
{
	struct dedup_publish *st;

	if (dedup_publish_rule(p) == NULL || (st = calloc(1, sizeof(*st))) == NULL)
		return NULL;
	st->p = p;
	list_init(&st->checks);
	list_init(&st->confirming);
	hash_init(&st->confirms, st->buckets, DEDUP_PUBLISH_BUCKETS);
	init_amqp_pool(&st->pool, 4096);
	return st;
}

/* The session is gone: the outcome of what is in flight is not known, so
 * its reservations are given up (a retry is forwarded, never lost). */
static void dedup_publish_detach(void *state)
{
	struct dedup_publish *st = state;
	struct dedup_publish_entry *e;

	while ((e = list_first_entry(&st->checks, struct dedup_publish_entry, node)) != NULL)
		dedup_publish_discard(e);
	while ((e = list_first_entry(&st->confirming, struct dedup_publish_entry, node)) !=
	       NULL) {
		dedup_publish_let_go(e, IDEM_FORGET);
		dedup_publish_free(e);
	}
	empty_amqp_pool(&st->pool);
	free(st);
}

static int dedup_publish_wants(void *state, struct pipeline *p, struct channel *ch,
			       enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	struct dedup_publish *st = state;
	const struct rules_dedup_publish *r;
	amqp_basic_publish_t *pub = method;

	if (kind == PIPE_RETURN)
		return st->nmandatory > 0 ? PIPE_WANT_MSG : PIPE_WANT_NONE;
	if (kind != PIPE_PUBLISH || (r = dedup_publish_rule(p)) == NULL)
		return PIPE_WANT_NONE;
	return dedup_publish_applies(r, pub, NULL) ? PIPE_WANT_MSG : PIPE_WANT_NONE;
}

/* A basic.return: the oldest mandatory publish awaiting its confirm on
 * the channel with the same exchange and value is the one that came back
 * (the broker returns it before it acks it): not remembered. */
static void dedup_publish_returned(struct dedup_publish *st, struct channel *ch,
				   const amqp_basic_return_t *r, const void *v, size_t vlen)
{
	struct dedup_publish_entry *e;

	list_for_each_entry (e, &st->confirming, node)
		if (e->channel == ch->id && e->mandatory && !e->returned &&
		    e->elen == r->exchange.len && e->vlen == vlen &&
		    memcmp(e->exchange, r->exchange.bytes, e->elen) == 0 &&
		    memcmp(e->value, v, vlen) == 0) {
			e->returned = 1;
			st->nmandatory--;
			return;
		}
}

static int dedup_publish_header_want(void *state, struct pipeline *p, struct channel *ch,
				     struct pipe_msg *m)
{
	const struct rules_dedup_publish *r = dedup_publish_rule(p);
	const amqp_basic_properties_t *props = m->props;
	const void *v;
	char num[32];
	size_t vlen;

	if (r == NULL)
		return PIPE_WANT_NONE;
	vlen = dedup_publish_value(props, r->header, num, &v);
	if (m->kind == PIPE_RETURN) {
		/* Only looked at: the return goes on as it came. */
		if (vlen)
			dedup_publish_returned(state, ch, m->method, v, vlen);
		return PIPE_WANT_NONE;
	}
	if (vlen == 0) {
		STATS_INC(&p->w->stats, dedup_no_header);
		return PIPE_WANT_NONE; /* untouched, its body not held */
	}
	return dedup_publish_applies(r, m->method, props) ? PIPE_WANT_MSG : PIPE_WANT_NONE;
}

static enum pipe_verdict dedup_publish_message(void *state, struct pipeline *p,
					       struct channel *ch, struct pipe_msg *m)
{
	struct dedup_publish *st = state;
	const struct rules_dedup_publish *r = dedup_publish_rule(p);
	amqp_basic_publish_t *pub = m->method;
	struct dedup_publish_ahead a;
	struct dedup_publish_entry *e;
	const void *v;
	char num[32];
	size_t vlen;

	/* Asked about every message another hook assembled too. */
	if (m->kind != PIPE_PUBLISH || r == NULL || !dedup_publish_applies(r, pub, m->props))
		return PIPE_PASS;
	vlen = dedup_publish_value(m->props, r->header, num, &v);
	if (vlen == 0)
		return PIPE_PASS;
	e = dedup_publish_take(st, ch->id, &pub->exchange, v, vlen);
	if (e) {
		/* Checked ahead, with the batch before it. */
		e->ahead = 0;
		e->mandatory = pub->mandatory != 0;
		e->window_s = r->window_s;
		e->m = m;
		if (!e->answered)
			return PIPE_WAIT;
		if (e->rc != STATE_OK || e->answer != IDEM_IN_PROGRESS)
			return dedup_publish_answer(e, p, ch);
		/* In flight when it was looked ahead at: asked again now. */
		e->answered = 0;
		e->op = dedup_publish_submit(e, IDEM_CLAIM);
		if (e->op)
			return PIPE_WAIT;
		STATS_INC(&p->w->stats, dedup_store_errors);
		e->m = NULL;
		dedup_publish_free(e);
		return PIPE_PASS;
	}
	e = dedup_publish_check(st, ch->id, pub->exchange.bytes, pub->exchange.len,
				pub->mandatory, v, vlen, r);
	if (e == NULL) {
		/* Cannot even ask: forwarded, not remembered. */
		STATS_INC(&p->w->stats, dedup_store_errors);
		return PIPE_PASS;
	}
	e->m = m;
	/* The checks of the publishes behind it go out now, together; once
	 * per batch: those were looked ahead at. */
	memset(&a, 0, sizeof(a));
	a.st = st;
	a.r = r;
	pipeline_lookahead(p, DIR_TO_BROKER, NULL, dedup_publish_ahead_frame, &a);
	return PIPE_WAIT;
}

static void dedup_publish_published(void *state, struct pipeline *p, struct channel *ch,
				    struct pipe_msg *m, int forwarded, uint64_t broker_seq)
{
	struct dedup_publish *st = state;
	struct dedup_publish_entry *e, *old, *found = NULL;

	list_for_each_entry (e, &st->checks, node)
		if (e->phase == PHASE_PASSED && e->m == m) {
			found = e;
			break;
		}
	if ((e = found) == NULL)
		return;
	e->m = NULL;
	if (!forwarded || broker_seq == 0) {
		/* Not forwarded after all (another hook answered or refused
		 * it, its channel went): given up. Forwarded on a channel
		 * without confirms: remembered now. */
		dedup_publish_let_go(e, forwarded ? IDEM_CONFIRM : IDEM_FORGET);
		dedup_publish_kick(st, e);
		dedup_publish_free(e);
		return;
	}
	/* A sequence number still in the table belongs to a channel that was
	 * reset under it: that outcome will not come. */
	old = dedup_publish_find(st, e->channel, broker_seq);
	if (old) {
		dedup_publish_let_go(old, IDEM_FORGET);
		dedup_publish_free(old);
	}
	list_del(&e->node);
	e->phase = PHASE_CONFIRMING;
	e->broker_seq = broker_seq;
	list_add_tail(&e->node, &st->confirming);
	hash_add(&st->confirms, hash_mix(broker_seq, e->channel), &e->hnode);
	if (e->mandatory)
		st->nmandatory++;
}

static void dedup_publish_settled(void *state, struct pipeline *p, struct channel *ch,
				  uint64_t broker_seq, int acked)
{
	struct dedup_publish *st = state;
	struct dedup_publish_entry *e = dedup_publish_find(st, ch->id, broker_seq);

	if (e == NULL)
		return;
	/* Acked and routed: remembered for the window. Nacked, or returned
	 * unroutable (then acked): a retry must go through. */
	dedup_publish_let_go(e, acked && !e->returned ? IDEM_CONFIRM : IDEM_FORGET);
	dedup_publish_kick(st, e);
	dedup_publish_free(e);
}

static void dedup_publish_channel_closed(void *state, struct pipeline *p, struct channel *ch)
{
	struct dedup_publish *st = state;
	struct dedup_publish_entry *e;
	struct timeval now = {0, 0};

	list_for_each_entry_safe (e, &st->checks, node) {
		if (e->channel != ch->id || e->phase == PHASE_PASSED)
			continue; /* a passed one is reported by the pipeline */
		if (e->ahead) {
			dedup_publish_discard(e); /* its publish will not come */
			continue;
		}
		e->gone = 1;
		if (e->phase == PHASE_WAITING && e->timer) {
			evtimer_del(e->timer);
			evtimer_add(e->timer, &now);
		}
	}
	/* Confirms will not come: the outcome is not known. */
	list_for_each_entry_safe (e, &st->confirming, node) {
		if (e->channel != ch->id)
			continue;
		dedup_publish_let_go(e, IDEM_FORGET);
		dedup_publish_kick(st, e);
		dedup_publish_free(e);
	}
}

static const struct pipe_hook dedup_publish_hook = {
    .name = "dedup_publish",
    .attach = dedup_publish_attach,
    .detach = dedup_publish_detach,
    .wants = dedup_publish_wants,
    .header_want = dedup_publish_header_want,
    .message = dedup_publish_message,
    .channel_closed = dedup_publish_channel_closed,
    .published = dedup_publish_published,
    .publish_settled = dedup_publish_settled,
};

void dedup_publish_register(void)
{
	pipeline_register(&dedup_publish_hook);
}
