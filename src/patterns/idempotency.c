/* idempotency: deliveries from the queues a vhost's rules name are claimed
 * by key before the consumer sees them; a duplicate is acknowledged for it,
 * one in progress elsewhere is held and put back; the consumer's ack
 * confirms the key, its nack or reject forgets it, both durably before they
 * go upstream. Claims and settles waiting behind one another are handed to
 * the state layer together (look-ahead), so a batch costs one commit. */
#include "idempotency.h"

#include "../../amqp/content.h"
#include "../../amqp/frame_scan.h"
#include "../../amqp/method.h"
#include "../../amqp/table.h"
#include "../channel.h"
#include "../engine.h"
#include "../hash.h"
#include "../link.h"
#include "../log.h"
#include "../pipeline.h"
#include "../rules.h"
#include "../store/idem.h"
#include "../surplus.h"
#include "../vstats.h"
#include "../worker.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IDEMPOTENCY_BUCKETS 256
#define IDEMPOTENCY_VSTATS  4

enum idempotency_phase {
	PHASE_CLAIMING,  /* the claim is out */
	PHASE_ANSWERED,  /* answered; the delivery has not been decided yet */
	PHASE_DELIVERED, /* claimed and delivered: the client settles it */
	PHASE_HELD,      /* in progress elsewhere: held, then put back */
};

struct idempotency;

/* One delivery under a rule, by its channel and broker tag. */
struct idempotency_entry {
	struct idempotency *st;
	uint16_t channel;
	uint64_t broker_tag;
	enum idempotency_phase phase;
	enum idem_answer answer;
	int store_failed;
	struct pipe_msg *m;        /* waiting for the answer (PIPE_WAIT), or held */
	struct event *timer;       /* a held one's put-back */
	struct idempotency_op *op; /* the store operation out for it */
	struct engine_req *put;    /* a held one's put-back, out */
	struct vstats *vs;         /* its vhost and queue's counters */
	int put_rc;
	int postgresql;        /* its rule keeps the keys in PostgreSQL */
	unsigned settling : 1; /* its confirm or forget is out or done */
	unsigned settled : 1;  /* ... and done */
	unsigned counted : 1;  /* the settle gate waits for it */
	char *queue;
	char *key;
	size_t klen;
	long lease_s, retention_s, delay_s;
	struct list hnode; /* in the hook's entries */
};

/* A store operation; outlives its entry when the session goes (the link
 * cut: see link.h). */
struct idempotency_op {
	struct idem_req req; /* first: its worker_call is the completion */
	struct link to;      /* its entry */
};

struct idempotency {
	struct pipeline *p;
	uint64_t owner0;
	struct hash entries; /* by channel and broker tag */
	struct list buckets[IDEMPOTENCY_BUCKETS];
	struct {
		char *queue;
		struct vstats *vs;
	} vs[IDEMPOTENCY_VSTATS];
	unsigned vs_next;
	struct pipeline_mark ahead[2]; /* where the look-ahead got to, by leg */
	int gate_pending;              /* counted settles not yet done */
	int gate_waiting;              /* a client settle waits for them */
	amqp_pool_t pool;              /* look-ahead decoding */
};

static uint64_t idempotency_instance;
static struct state *idempotency_state;

void idempotency_init(struct state *st)
{
	idempotency_state = st;
	if (RAND_bytes((unsigned char *)&idempotency_instance, sizeof(idempotency_instance)) !=
	    1)
		idempotency_instance = (uint64_t)time(NULL);
}

static const struct rules_idempotency *idempotency_rule(struct pipeline *p, const char *queue)
{
	const struct rules_vhost *v = pipeline_rules(p);
	int i;

	if (v == NULL || queue == NULL)
		return NULL;
	for (i = 0; i < v->nidempotency; i++)
		if (strcmp(v->idempotency[i].queue, queue) == 0)
			return &v->idempotency[i];
	return NULL;
}

static struct idempotency_entry *idempotency_find(struct idempotency *st, uint16_t ch,
						  uint64_t tag)
{
	struct idempotency_entry *e;

	hash_for_each_key (e, &st->entries, hash_mix(tag, ch), hnode)
		if (e->channel == ch && e->broker_tag == tag)
			return e;
	return NULL;
}

static void idempotency_entry_free(struct idempotency_entry *e)
{
	hash_del(&e->hnode);
	if (e->op)
		link_cut(&e->op->to); /* it completes on its own */
	if (e->put)
		e->put->owner = NULL;
	if (e->counted && !e->settled && e->st->gate_pending > 0)
		e->st->gate_pending--;
	if (e->timer)
		event_free(e->timer);
	if (e->m)
		pipe_msg_free(e->m);
	free(e->queue);
	free(e->key);
	free(e);
}

/* ---- store operations --------------------------------------------------- */

static void idempotency_done(struct worker_call *c);

/* Hand one operation on e's key to the state layer; the op points back to
 * e (the caller may cut that link: then nobody waits for it). */
static struct idempotency_op *idempotency_submit(struct idempotency *st,
						 struct idempotency_entry *e, enum idem_op what)
{
	struct idempotency_op *op = calloc(1, sizeof(*op));
	/* One owner per delivery: a forget gives up exactly its own claim. */
	uint64_t owner[2] = {idempotency_instance ^ hash_spread(e->broker_tag),
			     (st->p->id << 16) | e->channel};
	uint64_t span = what == IDEM_CLAIM     ? (uint64_t)e->lease_s * 1000
			: what == IDEM_CONFIRM ? (uint64_t)e->retention_s * 1000
					       : 0;

	if (op == NULL || idem_prepare(&op->req, what, st->p->vhost, e->queue, e->key, e->klen,
				       owner, state_now_ms(), span) != 0) {
		free(op);
		return NULL;
	}
	op->req.w.call.fn = idempotency_done;
	op->req.w.w = st->p->w;
	link_set(&op->to, e);
	if (idem_submit(idempotency_state, e->postgresql, &op->req) != 0) {
		free(op);
		return NULL;
	}
	return op;
}

/* A confirm or forget nobody waits for (the op holds copies of the key):
 * a no-ack delivery's confirm, or what a closing channel gives up. */
static void idempotency_let_go(struct idempotency_entry *e, enum idem_op what)
{
	struct idempotency_op *op;

	if (e->op) {
		/* Its claim is still out: this goes after it, in the same queue. */
		link_cut(&e->op->to);
		e->op = NULL;
	}
	op = idempotency_submit(e->st, e, what);
	if (op)
		link_cut(&op->to);
}

/* ---- deciding a delivery ---------------------------------------------------- */

static void idempotency_put_back(evutil_socket_t fd, short what, void *arg);

/* What happens to a delivery once its claim is answered. */
static enum pipe_verdict idempotency_decide(struct idempotency_entry *e, struct pipeline *p,
					    struct channel *ch)
{
	struct pipe_msg *m = e->m;
	struct timeval tv = {e->delay_s, 0};

	if (ch == NULL || ch->proxy_closing) {
		/* Its channel is going: the pipeline drops it, the broker
		 * requeues it; a claim of its own is given up. */
		if (e->answer == IDEM_CLAIMED && !e->store_failed)
			idempotency_let_go(e, IDEM_FORGET);
		e->m = NULL;
		idempotency_entry_free(e);
		return PIPE_PASS;
	}
	if (e->store_failed) {
		/* The store could not say: delivered (never lost; it may run
		 * twice). */
		STATS_INC(&p->w->stats, idem_store_errors);
		e->phase = PHASE_DELIVERED;
		e->m = NULL;
		if (m->no_ack)
			idempotency_entry_free(e);
		return PIPE_PASS;
	}
	switch (e->answer) {
	case IDEM_DUPLICATE:
		STATS_INC(&p->w->stats, idem_duplicate);
		vstats_add(e->vs, VSTATS_duplicate);
		e->m = NULL;
		idempotency_entry_free(e);
		return PIPE_SWALLOW; /* acknowledged upstream; never seen */
	case IDEM_IN_PROGRESS:
		STATS_INC(&p->w->stats, idem_in_progress);
		vstats_add(e->vs, VSTATS_in_progress);
		if (m->no_ack) {
			/* The broker let go of it already: delivered, not lost. */
			e->m = NULL;
			idempotency_entry_free(e);
			return PIPE_PASS;
		}
		e->phase = PHASE_HELD;
		e->timer = evtimer_new(p->w->base, idempotency_put_back, e);
		if (e->timer == NULL || evtimer_add(e->timer, &tv) != 0) {
			e->m = NULL;
			idempotency_entry_free(e);
			return PIPE_PASS;
		}
		return PIPE_HOLD; /* m stays with the entry */
	default:
		STATS_INC(&p->w->stats, idem_claimed);
		vstats_add(e->vs, VSTATS_claimed);
		e->phase = PHASE_DELIVERED;
		e->m = NULL;
		if (m->no_ack) {
			/* No settle will come: confirmed at delivery. */
			idempotency_let_go(e, IDEM_CONFIRM);
			idempotency_entry_free(e);
		}
		return PIPE_PASS;
	}
}

/* The put-back is settled: the original goes (acknowledged) once its copy
 * is confirmed in the queue; otherwise it is given back with a requeue. */
static void idempotency_put_back_settle_in(struct pipeline *p, void *arg)
{
	struct idempotency_entry *e = arg;
	struct channel *ch = pipeline_channel(p, e->channel);
	struct pipe_msg *m = e->m;
	struct vstats *vs = e->vs;
	int copied = e->put_rc == ENGINE_OK;

	e->m = NULL;
	idempotency_entry_free(e);
	if (ch == NULL) {
		pipe_msg_free(m);
		return;
	}
	if (copied) {
		STATS_INC(&p->w->stats, idem_put_back);
		vstats_add(vs, VSTATS_put_back);
		pipeline_ack(p, ch, m);
	} else {
		STATS_INC(&p->w->stats, idem_put_back_requeued);
		vstats_add(vs, VSTATS_requeued);
		pipeline_requeue(p, ch, m, 1);
	}
}

static void idempotency_put_back_done(struct worker_call *c)
{
	struct engine_req *r = (struct engine_req *)c;
	struct idempotency_entry *e = r->owner;

	if (e) {
		e->put = NULL;
		e->put_rc = r->rc;
	}
	engine_req_free(r);
	/* When the session is closing, its teardown frees e; the broker gets
	 * the original back (and the copy, if confirmed, is one more look at
	 * a key in progress: put back again later). */
	if (e)
		pipeline_call(e->st->p, idempotency_put_back_settle_in, e);
}

/* Republish the held delivery to its own queue over the proxy's own
 * connection, so no delivery attempt is spent (a quorum queue's
 * delivery-limit); without one, it is nacked with requeue. */
static void idempotency_put_back_in(struct pipeline *p, void *arg)
{
	struct idempotency_entry *e = arg;
	struct engine_req *r = NULL;
	amqp_bytes_t body = {0, NULL};

	if (e->m && !e->m->no_ack && engine_enabled() && pipeline_body_copy(e->m, &body) == 0 &&
	    (r = engine_req_new(p->w, ENGINE_PUBLISH, idempotency_put_back_done)) != NULL &&
	    engine_req_publish(r, "", e->queue, e->m->props, body) == 0) {
		r->owner = e;
		e->put = r;
		engine_submit(engine_get(p->vhost), r);
		return;
	}
	if (r)
		engine_req_free(r); /* it took the body */
	else
		free(body.bytes);
	e->put_rc = ENGINE_UNAVAILABLE;
	idempotency_put_back_settle_in(p, e);
}

static void idempotency_put_back(evutil_socket_t fd, short what, void *arg)
{
	struct idempotency_entry *e = arg;

	pipeline_call(e->st->p, idempotency_put_back_in, e);
}

static void idempotency_done_in(struct pipeline *p, void *arg)
{
	struct idempotency_op *op = arg;
	struct idempotency_entry *e = link_owner(&op->to);
	struct idempotency *st = e->st;
	struct channel *ch;
	struct pipe_msg *m;
	enum pipe_verdict v;

	e->op = NULL;
	if (op->req.what == IDEM_CLAIM) {
		e->answer = op->req.answer;
		if (op->req.lease_expired)
			vstats_add(e->vs, VSTATS_leases_expired);
		e->store_failed = op->req.w.rc != STATE_OK;
		e->phase = PHASE_ANSWERED;
		if (e->m == NULL)
			return; /* looked ahead: decided when it is read */
		ch = pipeline_channel(p, e->channel);
		m = e->m;
		v = idempotency_decide(e, p, ch);
		if (ch)
			pipeline_resume(p, ch, m, v);
		else
			pipeline_drop(p, m);
		return;
	}
	/* A confirm or forget is durable (or failed: the settle goes on, a
	 * redelivery is then at worst run again). */
	if (op->req.w.rc != STATE_OK)
		STATS_INC(&p->w->stats, idem_store_errors);
	e->settled = 1;
	if (e->counted && st->gate_pending > 0)
		st->gate_pending--;
	if (st->gate_waiting && st->gate_pending == 0) {
		st->gate_waiting = 0;
		pipeline_settle_release(p);
	}
}

static void idempotency_done(struct worker_call *c)
{
	struct idempotency_op *op = (struct idempotency_op *)c;
	struct idempotency_entry *e = link_owner(&op->to);

	if (e && !pipeline_call(e->st->p, idempotency_done_in, op))
		e->op = NULL;
	free(op);
}

/* ---- keys ------------------------------------------------------------------ */

/* The key of a message under rule r, into out (malloc'd); 0 if none. */
static size_t idempotency_key(const struct rules_idempotency *r, amqp_basic_properties_t *p,
			      struct evbuffer *body, char **out)
{
	char num[32];
	const void *src = NULL;
	size_t len = 0;

	*out = NULL;
	if (r->key == RULES_KEY_MESSAGE_ID) {
		if (p && (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)) {
			src = p->message_id.bytes;
			len = p->message_id.len;
		}
	} else if (r->key == RULES_KEY_HEADER) {
		if (p && (p->_flags & AMQP_BASIC_HEADERS_FLAG))
			len = table_get_text(&p->headers, r->key_name, num, &src);
	} else if (body) {
		size_t n = evbuffer_get_length(body);
		const char *text =
		    n ? (const char *)evbuffer_pullup(body, (ev_ssize_t)n) : NULL;
		cJSON *root = text ? cJSON_ParseWithLength(text, n) : NULL, *node = root;
		char path[256], *tok, *save = NULL;

		snprintf(path, sizeof(path), "%s", r->key_name);
		for (tok = strtok_r(path, ".", &save); node && tok;
		     tok = strtok_r(NULL, ".", &save))
			node = cJSON_IsObject(node)
				   ? cJSON_GetObjectItemCaseSensitive(node, tok)
				   : NULL;
		if (node && cJSON_IsString(node)) {
			*out = strdup(node->valuestring);
			len = *out ? strlen(*out) : 0;
		} else if (node && cJSON_IsNumber(node)) {
			snprintf(num, sizeof(num), "%.17g", node->valuedouble);
			*out = strdup(num);
			len = *out ? strlen(*out) : 0;
		}
		cJSON_Delete(root);
		if (len == 0) {
			free(*out);
			*out = NULL;
		}
		return len;
	}
	if (src == NULL || len == 0 || len > 255)
		return 0;
	*out = malloc(len);
	if (*out == NULL)
		return 0;
	memcpy(*out, src, len);
	return len;
}

/* The counters of a queue of the session's vhost (a few cached per session). */
static struct vstats *idempotency_vstats(struct idempotency *st, const char *queue)
{
	int i;

	for (i = 0; i < IDEMPOTENCY_VSTATS; i++)
		if (st->vs[i].queue && strcmp(st->vs[i].queue, queue) == 0)
			return st->vs[i].vs;
	i = st->vs_next++ % IDEMPOTENCY_VSTATS;
	free(st->vs[i].queue);
	st->vs[i].queue = strdup(queue);
	st->vs[i].vs = vstats_get(st->p->vhost, queue);
	return st->vs[i].vs;
}

static struct idempotency_entry *idempotency_entry_new(struct idempotency *st, uint16_t ch,
						       uint64_t tag, const char *queue,
						       const struct rules_idempotency *r,
						       char *key, size_t klen)
{
	struct idempotency_entry *e = calloc(1, sizeof(*e));

	if (e == NULL || (e->queue = strdup(queue)) == NULL) {
		free(e);
		free(key);
		return NULL;
	}
	e->st = st;
	e->channel = ch;
	e->broker_tag = tag;
	e->key = key;
	e->klen = klen;
	e->lease_s = r->lease_s;
	e->retention_s = r->retention_s;
	e->delay_s = r->in_progress_delay_s;
	e->postgresql = r->store == RULES_KEYS_POSTGRESQL;
	e->vs = idempotency_vstats(st, queue);
	hash_add(&st->entries, hash_mix(tag, ch), &e->hnode);
	return e;
}

/* Claim for e; -1 when it cannot even be asked. */
static int idempotency_claim(struct idempotency *st, struct idempotency_entry *e)
{
	e->op = idempotency_submit(st, e, IDEM_CLAIM);
	e->phase = PHASE_CLAIMING;
	return e->op ? 0 : -1;
}

/* ---- look-ahead: deliveries and settles behind the one that waits ---------- */

struct idempotency_ahead {
	struct idempotency *st;
	struct pipeline *p;
	/* a basic.deliver seen, waiting for its header */
	int pending;
	uint16_t channel;
	uint64_t tag;
	char queue[256];
	const struct rules_idempotency *rule;
};

static int idempotency_ahead_delivery(void *arg, const struct frame_info *fi,
				      const uint8_t *payload, size_t len)
{
	struct idempotency_ahead *a = arg;
	struct idempotency *st = a->st;
	amqp_method_number_t id;
	void *decoded;

	if (fi->type == FRAME_METHOD && payload && fi->class_id == 60 && fi->method_id == 60) {
		amqp_basic_deliver_t *d;
		struct channel *ch = pipeline_channel(a->p, fi->channel);
		const char *q;

		a->pending = 0;
		if (ch == NULL || method_decode(payload, len, &st->pool, &id, &decoded) != 0)
			goto out;
		d = decoded;
		q = channel_consumer_queue(ch, d->consumer_tag.bytes, d->consumer_tag.len);
		a->rule = idempotency_rule(a->p, q);
		if (a->rule == NULL || a->rule->key == RULES_KEY_JSON ||
		    channel_consumer_no_ack(ch, d->consumer_tag.bytes, d->consumer_tag.len) ||
		    idempotency_find(st, fi->channel, d->delivery_tag))
			goto out;
		a->pending = 1;
		a->channel = fi->channel;
		a->tag = d->delivery_tag;
		snprintf(a->queue, sizeof(a->queue), "%s", q);
		recycle_amqp_pool(&st->pool);
		return PIPELINE_AHEAD_AGAIN; /* until its header is in */
	} else if (fi->type == FRAME_HEADER && payload && a->pending &&
		   fi->channel == a->channel) {
		amqp_basic_properties_t *props = NULL;
		struct idempotency_entry *e;
		char *key;
		size_t klen;

		a->pending = 0;
		if (content_props_decode(payload, len, &st->pool, &props) != 0)
			goto out;
		klen = idempotency_key(a->rule, props, NULL, &key);
		if (klen == 0)
			goto out;
		e = idempotency_entry_new(st, a->channel, a->tag, a->queue, a->rule, key, klen);
		if (e && idempotency_claim(st, e) != 0)
			idempotency_entry_free(e);
	}
out:
	recycle_amqp_pool(&st->pool);
	return 0;
}

/* Settles the client sent behind the one that waits: their confirms and
 * forgets go out now, with it. */
struct idempotency_gate {
	struct idempotency *st;
	struct channel *ch;
	amqp_method_number_t how;
	int waiting;
	int submitted; /* settles handed over now */
};

static void idempotency_gate_one(void *arg, uint64_t broker_tag)
{
	struct idempotency_gate *g = arg;
	struct idempotency_entry *e = idempotency_find(g->st, g->ch->id, broker_tag);

	if (e == NULL || e->phase != PHASE_DELIVERED)
		return;
	if (!e->settling) {
		e->op = idempotency_submit(
		    g->st, e, g->how == AMQP_BASIC_ACK_METHOD ? IDEM_CONFIRM : IDEM_FORGET);
		if (e->op == NULL) {
			e->settling = e->settled = 1; /* cannot: let it go on */
			pipeline_surplus_seen(g->st->p, g->ch, broker_tag);
			return;
		}
		e->settling = 1;
		e->counted = 1;
		g->submitted++;
		g->st->gate_pending++;
		/* The client is done with it: its consumer may be sent the
		 * next delivery while the confirm is made durable. */
		pipeline_surplus_seen(g->st->p, g->ch, broker_tag);
	}
	if (!e->settled)
		g->waiting = 1;
}

static int idempotency_ahead_settle(void *arg, const struct frame_info *fi,
				    const uint8_t *payload, size_t len)
{
	struct idempotency_ahead *a = arg;
	struct idempotency *st = a->st;
	amqp_method_number_t id;
	void *decoded;
	struct idempotency_gate g = {st, NULL, 0, 0, 0};
	uint64_t tag = 0;
	int multiple = 0;

	if (fi->type != FRAME_METHOD || payload == NULL || fi->class_id != 60 ||
	    (fi->method_id != 80 && fi->method_id != 90 && fi->method_id != 120))
		return 0;
	g.ch = pipeline_channel(a->p, fi->channel);
	if (g.ch && method_decode(payload, len, &st->pool, &id, &decoded) == 0) {
		g.how = id;
		if (id == AMQP_BASIC_ACK_METHOD) {
			tag = ((amqp_basic_ack_t *)decoded)->delivery_tag;
			multiple = ((amqp_basic_ack_t *)decoded)->multiple;
		} else if (id == AMQP_BASIC_NACK_METHOD) {
			tag = ((amqp_basic_nack_t *)decoded)->delivery_tag;
			multiple = ((amqp_basic_nack_t *)decoded)->multiple;
		} else {
			tag = ((amqp_basic_reject_t *)decoded)->delivery_tag;
		}
		tagmap_covered(&g.ch->tags, tag, multiple, idempotency_gate_one, &g);
	}
	recycle_amqp_pool(&st->pool);
	return 0;
}

/* ---- the hook ------------------------------------------------------------------ */

static void *idempotency_attach(struct pipeline *p)
{
	const struct rules_vhost *v = pipeline_rules(p);
	struct idempotency *st;

	if (v == NULL || v->nidempotency == 0 || (st = calloc(1, sizeof(*st))) == NULL)
		return NULL;
	st->p = p;
	hash_init(&st->entries, st->buckets, IDEMPOTENCY_BUCKETS);
	init_amqp_pool(&st->pool, 4096);
	return st;
}

static void idempotency_detach(void *state)
{
	struct idempotency *st = state;
	struct idempotency_entry *e;
	size_t b;
	int i;

	/* The session is gone: what it claimed and did not settle is given up,
	 * so another consumer runs it without waiting for the lease. */
	hash_for_each_safe (b, e, &st->entries, hnode) {
		if (e->phase != PHASE_HELD && !(e->settling && e->settled) &&
		    (e->answer == IDEM_CLAIMED || e->phase == PHASE_CLAIMING))
			idempotency_let_go(e, IDEM_FORGET);
		idempotency_entry_free(e);
	}
	for (i = 0; i < IDEMPOTENCY_VSTATS; i++)
		free(st->vs[i].queue);
	empty_amqp_pool(&st->pool);
	free(st);
}

static const char *idempotency_queue_of(struct channel *ch, enum pipe_kind kind, void *method)
{
	if (kind == PIPE_DELIVER) {
		amqp_basic_deliver_t *d = method;

		return channel_consumer_queue(ch, d->consumer_tag.bytes, d->consumer_tag.len);
	}
	return kind == PIPE_GET_OK ? ch->get_queue : NULL;
}

static int idempotency_wants(void *state, struct pipeline *p, struct channel *ch,
			     enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	const struct rules_idempotency *r =
	    idempotency_rule(p, idempotency_queue_of(ch, kind, method));

	if (r == NULL)
		return PIPE_WANT_NONE;
	return r->key == RULES_KEY_JSON ? PIPE_WANT_MSG | PIPE_WANT_BODY : PIPE_WANT_MSG;
}

static enum pipe_verdict idempotency_message(void *state, struct pipeline *p,
					     struct channel *ch, struct pipe_msg *m)
{
	struct idempotency *st = state;
	const struct rules_idempotency *r;
	struct idempotency_entry *e;
	struct idempotency_ahead a;
	char *key;
	size_t klen;
	int fresh = 0;

	if (m->kind != PIPE_DELIVER && m->kind != PIPE_GET_OK)
		return PIPE_PASS;
	e = idempotency_find(st, ch->id, m->broker_tag);
	if (e == NULL) {
		fresh = 1;
		r = idempotency_rule(p, idempotency_queue_of(ch, m->kind, m->method));
		if (r == NULL)
			return PIPE_PASS;
		klen = idempotency_key(r, m->props, m->body, &key);
		if (klen == 0) {
			STATS_INC(&p->w->stats, idem_no_key);
			vstats_add(idempotency_vstats(st, r->queue), VSTATS_no_key);
			return PIPE_PASS;
		}
		e = idempotency_entry_new(st, ch->id, m->broker_tag,
					  idempotency_queue_of(ch, m->kind, m->method), r, key,
					  klen);
		if (e == NULL)
			return PIPE_PASS;
		if (idempotency_claim(st, e) != 0) {
			idempotency_entry_free(e);
			STATS_INC(&p->w->stats, idem_store_errors);
			return PIPE_PASS;
		}
	}
	e->m = m;
	if (e->phase == PHASE_ANSWERED)
		return idempotency_decide(e, p, ch);
	/* Claims for the deliveries behind this one go out now, together;
	 * once per batch: the ones behind were claimed by the look-ahead. */
	if (fresh) {
		memset(&a, 0, sizeof(a));
		a.st = st;
		a.p = p;
		pipeline_lookahead(p, DIR_TO_CLIENT, &st->ahead[DIR_TO_CLIENT],
				   idempotency_ahead_delivery, &a);
	}
	return PIPE_WAIT;
}

/* More of the broker's deliveries (or the client's settles) arrived while
 * one waits: their claims (confirms) join the commit about to be made. */
static void idempotency_held_input(void *state, struct pipeline *p, int from)
{
	struct idempotency *st = state;
	struct idempotency_ahead a;

	memset(&a, 0, sizeof(a));
	a.st = st;
	a.p = p;
	if (from == DIR_TO_CLIENT)
		pipeline_lookahead(p, DIR_TO_CLIENT, &st->ahead[DIR_TO_CLIENT],
				   idempotency_ahead_delivery, &a);
	else if (st->gate_waiting)
		pipeline_lookahead(p, DIR_TO_BROKER, &st->ahead[DIR_TO_BROKER],
				   idempotency_ahead_settle, &a);
}

static int idempotency_settle_gate(void *state, struct pipeline *p, struct channel *ch,
				   amqp_method_number_t how, uint64_t client_tag, int multiple)
{
	struct idempotency *st = state;
	struct idempotency_gate g = {st, ch, how, 0, 0};
	struct idempotency_ahead a;

	if (tagmap_covered(&ch->tags, client_tag, multiple, idempotency_gate_one, &g) != 0 ||
	    !g.waiting)
		return 0;
	st->gate_waiting = 1;
	/* The settles behind it go out with it (once per batch). */
	if (g.submitted) {
		memset(&a, 0, sizeof(a));
		a.st = st;
		a.p = p;
		pipeline_lookahead(p, DIR_TO_BROKER, &st->ahead[DIR_TO_BROKER],
				   idempotency_ahead_settle, &a);
	}
	return 1;
}

static void idempotency_settle(void *state, struct pipeline *p, struct channel *ch,
			       amqp_method_number_t how, uint64_t broker_tag)
{
	struct idempotency_entry *e = idempotency_find(state, ch->id, broker_tag);

	if (e && e->phase == PHASE_DELIVERED) {
		/* Settled without a confirm or forget of its own: another hook
		 * disposed of it before the client saw it; its claim goes. */
		if (!e->settling)
			idempotency_let_go(e, IDEM_FORGET);
		idempotency_entry_free(e);
	}
}

/* The channel closed, or the broker redelivers everything unacked on it
 * (basic.recover): keys claimed for it and not settled are forgotten. */
static void idempotency_channel_gone(void *state, struct pipeline *p, struct channel *ch)
{
	struct idempotency *st = state;
	struct idempotency_entry *e;
	size_t b;

	hash_for_each_safe (b, e, &st->entries, hnode) {
		if (e->channel != ch->id)
			continue;
		if (e->m && e->phase != PHASE_HELD) {
			/* Still waiting for its answer: decided then. */
			continue;
		}
		if (e->phase != PHASE_HELD && !e->settling &&
		    (e->answer == IDEM_CLAIMED || e->phase == PHASE_CLAIMING))
			idempotency_let_go(e, IDEM_FORGET);
		if (e->counted && !e->settled)
			continue; /* the gate waits for it */
		idempotency_entry_free(e);
	}
}

/* A kept delivery's claim was made when it arrived, or last renewed
 * waited_ms ago. Once a third of its lease has gone, the lease is renewed
 * (a claim again, as the same owner): while it waits, so that it never
 * runs out before the client has it, and as it goes to the client, so its
 * handler has a whole lease. 1 when renewed. */
static int idempotency_renew(void *state, struct pipeline *p, struct channel *ch,
			     uint64_t broker_tag, uint64_t waited_ms)
{
	struct idempotency_entry *e = idempotency_find(state, ch->id, broker_tag);

	if (e == NULL || e->phase != PHASE_DELIVERED || e->settling || e->store_failed ||
	    e->answer != IDEM_CLAIMED || waited_ms * 3 < (uint64_t)e->lease_s * 1000)
		return 0;
	STATS_INC(&p->w->stats, idem_renewed);
	idempotency_let_go(e, IDEM_CLAIM);
	return 1;
}

static void idempotency_surplus_out(void *state, struct pipeline *p, struct channel *ch,
				    uint64_t broker_tag, uint64_t waited_ms)
{
	(void)idempotency_renew(state, p, ch, broker_tag, waited_ms);
}

/* Claims are made ahead of the client for a consumer of a rule's queue:
 * the broker sends more than the client's prefetch (the rule's
 * prefetch_ahead, or surplus_auto), the proxy keeps the rest. */
static int idempotency_asks_ahead(void *state, struct pipeline *p, const char *queue,
				  uint16_t prefetch)
{
	const struct rules_idempotency *r = idempotency_rule(p, queue);

	(void)state;
	if (r == NULL)
		return 0;
	return r->prefetch_ahead >= 0 ? (int)r->prefetch_ahead : surplus_auto(prefetch);
}

static const struct pipe_hook idempotency_hook = {
    .name = "idempotency",
    .attach = idempotency_attach,
    .detach = idempotency_detach,
    .wants = idempotency_wants,
    .message = idempotency_message,
    .settle = idempotency_settle,
    .settle_gate = idempotency_settle_gate,
    .channel_closed = idempotency_channel_gone,
    .recovered = idempotency_channel_gone,
    .held_input = idempotency_held_input,
    .asks_ahead = idempotency_asks_ahead,
    .surplus_out = idempotency_surplus_out,
    .surplus_waiting = idempotency_renew,
};

void idempotency_register(void)
{
	pipeline_register(&idempotency_hook);
}
