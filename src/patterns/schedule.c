/* schedule: a publish with a delay header rewritten onto the schedule
 * ladder, and recorded (store/delayed.h) so that it can be listed and
 * cancelled: the pattern's publish side; its scheduler is scheduler.c.
 * While one publish waits for its record, the delayed publishes behind it
 * are looked ahead at and their records written too, so that publishes
 * sent together share a commit. */
#include "schedule.h"

#include "../../amqp/content.h"
#include "../../amqp/frame_scan.h"
#include "../../amqp/method.h"
#include "../../amqp/table.h"
#include "../engine.h"
#include "../list.h"
#include "../log.h"
#include "../pipeline.h"
#include "../rules.h"
#include "../store/delayed.h"
#include "../store/state.h"
#include "../worker.h"
#include "ladder.h"
#include "scheduler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEDULE_AHEAD_MAX 128 /* records written ahead per connection */

struct schedule_wait;

struct schedule {
	struct pipeline *p;
	struct engine *engine; /* NULL: no credentials of the proxy's own */
	struct schedule_wait *waits;
	struct list ahead; /* schedule_wait.node: looked ahead at, in order */
	int nahead;
	amqp_pool_t pool; /* the look-ahead's decoding */
};

/* A rewritten publish waiting for its record to be written, then for
 * the ladder to be declared. One looked ahead at (m NULL, listed in
 * st->ahead) has its record written before its publish comes; its
 * signature tells that publish. */
struct schedule_wait {
	struct schedule *st; /* NULL once the session went */
	struct engine_req *req;
	struct delayed_rec *rec;
	int rec_rc;
	struct pipe_msg *m;
	uint16_t channel;
	struct schedule_wait *next;
	int submitted; /* its record was submitted */
	/* looked ahead at */
	struct list node;
	int64_t due_at;
	uint8_t key[DELAYED_KEY_LEN];
	int given_up;       /* the record is removed once written ... */
	char *forget_vhost; /* ... from this vhost (NULL: by the janitor) */
	size_t siglen;
	char sig[];
};

/* What tells a delayed publish: target, delay, message id, size. */
#define SCHEDULE_SIG_MAX (3 * (DELAYED_STR_MAX + 1) + 48)

static size_t schedule_sig(char *out, amqp_bytes_t exchange, amqp_bytes_t routing_key,
			   const amqp_basic_properties_t *props, int64_t ms, uint64_t size)
{
	amqp_bytes_t mid = {0, NULL};
	size_t n = 0;

	if (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		mid = props->message_id;
	if (exchange.len > DELAYED_STR_MAX || routing_key.len > DELAYED_STR_MAX ||
	    mid.len > DELAYED_STR_MAX)
		return 0; /* not looked ahead at */
	if (exchange.len)
		memcpy(out + n, exchange.bytes, exchange.len);
	n += exchange.len;
	out[n++] = 0;
	if (routing_key.len)
		memcpy(out + n, routing_key.bytes, routing_key.len);
	n += routing_key.len;
	out[n++] = 0;
	if (mid.len)
		memcpy(out + n, mid.bytes, mid.len);
	n += mid.len;
	n += (size_t)snprintf(out + n, 48, "%c%" PRId64 ":%" PRIu64,
			      (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) ? 1 : 2, ms, size);
	return n;
}

static const struct rules_schedule *schedule_rule(struct pipeline *p)
{
	const struct rules_vhost *v = pipeline_rules(p);

	return v && v->schedule.enabled ? &v->schedule : NULL;
}

static void *schedule_attach(struct pipeline *p)
{
	struct schedule *st;

	if (schedule_rule(p) == NULL || (st = calloc(1, sizeof(*st))) == NULL)
		return NULL;
	st->p = p;
	st->engine = engine_get(p->vhost);
	list_init(&st->ahead);
	init_amqp_pool(&st->pool, 4096);
	return st;
}

/* w's publish is not forwarded after all: its record, if one was
 * submitted, goes, now or once written. */
static void schedule_give_up(struct schedule *st, struct schedule_wait *w)
{
	w->m = NULL;
	if (w->submitted && w->rec != NULL) {
		w->st = NULL;
		w->given_up = 1;
		w->forget_vhost = strdup(st->p->vhost); /* NULL: left to the janitor */
		return;
	}
	if (w->submitted && w->rec_rc == STATE_OK)
		delayed_forget(st->p->vhost, w->key);
	free(w);
}

/* A record written ahead whose publish will not come (its channel or
 * connection went, or it was not the publish that came). */
static void schedule_ahead_discard(struct schedule *st, struct schedule_wait *w)
{
	list_del(&w->node);
	st->nahead--;
	schedule_give_up(st, w);
}

static void schedule_unlink(struct schedule *st, struct schedule_wait *w)
{
	struct schedule_wait **p;

	for (p = &st->waits; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			return;
		}
}

static void schedule_detach(void *state)
{
	struct schedule *st = state;
	struct schedule_wait *w, *next;

	/* Publishes never forwarded: their records go too. */
	for (w = st->waits; w; w = next) {
		next = w->next;
		pipe_msg_free(w->m);
		w->m = NULL;
		if (w->req != NULL) {
			/* Waiting for the ladder: the engine's completion
			 * frees it. */
			if (w->submitted && w->rec_rc == STATE_OK)
				delayed_forget(st->p->vhost, w->key);
			w->st = NULL;
		} else {
			schedule_give_up(st, w);
		}
	}
	while ((w = list_first_entry(&st->ahead, struct schedule_wait, node)) != NULL)
		schedule_ahead_discard(st, w);
	empty_amqp_pool(&st->pool);
	free(st);
}

static int schedule_wants(void *state, struct pipeline *p, struct channel *ch,
			  enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	const struct rules_schedule *rule = schedule_rule(p);
	amqp_basic_publish_t *pub = method;

	if (kind != PIPE_PUBLISH || rule == NULL)
		return PIPE_WANT_NONE;
	return rules_matches(&rule->match, pub->exchange.bytes, pub->exchange.len,
			     pub->routing_key.bytes, pub->routing_key.len)
		   ? PIPE_WANT_MSG
		   : PIPE_WANT_NONE;
}

static int schedule_has_header(struct pipeline *p, struct pipe_msg *m)
{
	const struct rules_schedule *rule = schedule_rule(p);
	int64_t ms;

	return rule && m->props && (m->props->_flags & AMQP_BASIC_HEADERS_FLAG) &&
	       ladder_delay(&m->props->headers, rule->header, &ms) != LADDER_DELAY_NONE;
}

/* Only a publish that carries the delay header is held. */
static int schedule_header_want(void *state, struct pipeline *p, struct channel *ch,
				struct pipe_msg *m)
{
	return schedule_has_header(p, m) ? PIPE_WANT_MSG : PIPE_WANT_NONE;
}

static void schedule_ladder_in(struct pipeline *p, void *arg)
{
	struct schedule_wait *w = arg;
	struct channel *ch = pipeline_channel(p, w->channel);
	struct pipe_msg *m = w->m;

	schedule_unlink(w->st, w);
	free(w);
	if (ch)
		pipeline_resume(p, ch, m, PIPE_PASS);
	else
		pipeline_drop(p, m);
}

static void schedule_refused_in(struct pipeline *p, void *arg)
{
	struct schedule_wait *w = arg;
	struct channel *ch = pipeline_channel(p, w->channel);
	struct pipe_msg *m = w->m;

	schedule_unlink(w->st, w);
	free(w);
	pipeline_log(p, LOG_WARNING,
		     "a scheduled publish was refused: the schedule ladder "
		     "could not be declared");
	if (ch)
		pipeline_resume(p, ch, m, PIPE_REFUSE);
	else
		pipeline_drop(p, m);
}

static void schedule_ladder_done(struct worker_call *c)
{
	struct engine_req *r = (struct engine_req *)c;
	struct schedule_wait *w = r->owner;
	enum engine_rc rc = r->rc;

	engine_req_free(r);
	w->req = NULL;
	if (w->st == NULL) {
		free(w);
		return;
	}
	/* Not run when the session is closing: detach then frees w. */
	pipeline_call(w->st->p, rc == ENGINE_OK ? schedule_ladder_in : schedule_refused_in, w);
}

/* Wait (w, already listed) for the ladder's declaration: 0 asked, -1. */
static int schedule_wait_ladder(struct schedule *st, struct pipeline *p,
				struct schedule_wait *w)
{
	if ((w->req = engine_req_new(p->w, ENGINE_DECLARE, schedule_ladder_done)) == NULL)
		return -1;
	w->req->owner = w;
	engine_submit(st->engine, w->req);
	return 0;
}

/* Without credentials of its own the proxy relies on whoever runs the
 * scheduler to have declared the ladder (the broker answers 404 if not). */
static int schedule_ladder_needed(struct schedule *st)
{
	return engine_enabled() && !scheduler_ladder_ready(st->engine);
}

/* The record is written (or could not be: the message goes on, neither
 * listed nor cancellable); next, the ladder. */
static void schedule_recorded_in(struct pipeline *p, void *arg)
{
	struct schedule_wait *w = arg;
	struct schedule *st = w->st;

	if (w->rec_rc != STATE_OK)
		pipeline_log(p, LOG_DEBUG,
			     "a scheduled publish could not be recorded (%s): it is not "
			     "listed and cannot be cancelled",
			     state_strerror(w->rec_rc));
	if (schedule_ladder_needed(st)) {
		if (schedule_wait_ladder(st, p, w) == 0)
			return;
		schedule_refused_in(p, w);
		return;
	}
	schedule_ladder_in(p, w);
}

static void schedule_recorded(struct worker_call *c)
{
	struct delayed_rec *r = (struct delayed_rec *)c;
	struct schedule_wait *w = r->owner;

	w->rec_rc = r->w.rc;
	w->rec = NULL;
	free(r);
	if (w->given_up) {
		if (w->rec_rc == STATE_OK && w->forget_vhost)
			delayed_forget(w->forget_vhost, w->key);
		free(w->forget_vhost);
		free(w);
		return;
	}
	if (w->st == NULL) {
		free(w);
		return;
	}
	if (w->m == NULL)
		return; /* written ahead: its publish finds it done */
	pipeline_call(w->st->p, schedule_recorded_in, w);
}

/* Submit the record of w's publish, under w->key. 0, or -1 (nothing in
 * flight). */
static int schedule_submit(struct pipeline *p, struct schedule_wait *w, amqp_bytes_t exchange,
			   amqp_bytes_t routing_key, const amqp_basic_properties_t *props,
			   uint64_t size)
{
	int has_mid = (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0;
	struct delayed_rec *r;

	if ((r = malloc(sizeof(*r))) == NULL)
		return -1;
	delayed_rec_prepare(r, p->vhost, w->key, exchange.bytes, exchange.len,
			    routing_key.bytes, routing_key.len,
			    has_mid ? props->message_id.bytes : NULL,
			    has_mid ? props->message_id.len : 0, has_mid, size);
	r->w.call.fn = schedule_recorded;
	r->w.w = p->w;
	r->owner = w;
	w->rec = r;
	w->submitted = 1;
	state_submit(delayed_state(), &r->w);
	return 0;
}

/* The rewritten publish's id header, from w->key. */
static int schedule_set_id(struct schedule_wait *w)
{
	char id[DELAYED_ID_LEN + 1];

	delayed_id(id, w->key);
	return ladder_set_id(w->m->props, &w->m->pool, amqp_cstring_bytes(id));
}

/* ---- the look-ahead ------------------------------------------------------ */

struct schedule_ahead {
	struct schedule *st;
	const struct rules_schedule *rule;
	int pending; /* a matching basic.publish seen, waiting for its header */
	uint16_t channel;
	amqp_bytes_t exchange, routing_key; /* into names */
	char names[2 * (DELAYED_STR_MAX + 1)];
};

/* One frame behind a waiting publish: a delayed publish's record is
 * written now, listed for its publish to take. */
static int schedule_ahead_frame(void *arg, const struct frame_info *fi, const uint8_t *payload,
				size_t len)
{
	struct schedule_ahead *a = arg;
	struct schedule *st = a->st;
	amqp_basic_properties_t *props;
	amqp_method_number_t id;
	struct schedule_wait *w;
	char sig[SCHEDULE_SIG_MAX];
	uint16_t cls;
	uint64_t size;
	int64_t ms, now;
	size_t n;
	void *decoded;

	if (st->nahead >= SCHEDULE_AHEAD_MAX)
		return 1;
	if (fi->type == FRAME_METHOD) {
		amqp_basic_publish_t *pub;

		a->pending = 0;
		if (payload == NULL || fi->class_id != 60 || fi->method_id != 40 ||
		    method_decode(payload, len, &st->pool, &id, &decoded) != 0)
			goto out;
		pub = decoded;
		if (pub->exchange.len > DELAYED_STR_MAX ||
		    pub->routing_key.len > DELAYED_STR_MAX ||
		    !rules_matches(&a->rule->match, pub->exchange.bytes, pub->exchange.len,
				   pub->routing_key.bytes, pub->routing_key.len))
			goto out;
		a->pending = 1;
		a->channel = fi->channel;
		if (pub->exchange.len)
			memcpy(a->names, pub->exchange.bytes, pub->exchange.len);
		if (pub->routing_key.len)
			memcpy(a->names + DELAYED_STR_MAX + 1, pub->routing_key.bytes,
			       pub->routing_key.len);
		a->exchange = (amqp_bytes_t){pub->exchange.len, a->names};
		a->routing_key =
		    (amqp_bytes_t){pub->routing_key.len, a->names + DELAYED_STR_MAX + 1};
	} else if (fi->type == FRAME_HEADER && a->pending && fi->channel == a->channel) {
		a->pending = 0;
		if (payload == NULL || len < CONTENT_HEADER_FIXED ||
		    content_props_decode(payload, len, &st->pool, &props) != 0 ||
		    !(props->_flags & AMQP_BASIC_HEADERS_FLAG) ||
		    ladder_delay(&props->headers, a->rule->header, &ms) != LADDER_DELAY_OK)
			goto out;
		content_header_peek(payload, &cls, &size);
		now = (int64_t)state_now_ms();
		if (ms > INT64_MAX - now)
			ms = INT64_MAX - now;
		n = schedule_sig(sig, a->exchange, a->routing_key, props, ms, size);
		if (n == 0 || (w = calloc(1, sizeof(*w) + n)) == NULL)
			goto out;
		w->st = st;
		w->channel = a->channel;
		w->due_at = now + ms;
		w->siglen = n;
		memcpy(w->sig, sig, n);
		delayed_key(w->key, w->due_at, delayed_nonce());
		if (schedule_submit(st->p, w, a->exchange, a->routing_key, props, size) != 0) {
			free(w);
			goto out;
		}
		list_add_tail(&w->node, &st->ahead);
		st->nahead++;
	}
out:
	recycle_amqp_pool(&st->pool);
	return 0;
}

/* The record written ahead for this publish of channel, if any: those
 * listed before it on the channel were not the publishes that came, and
 * go. */
static struct schedule_wait *schedule_ahead_take(struct schedule *st, uint16_t channel,
						 const char *sig, size_t siglen)
{
	struct schedule_wait *w;

	list_for_each_entry_safe (w, &st->ahead, node) {
		if (w->channel != channel)
			continue;
		if (w->siglen == siglen && memcmp(w->sig, sig, siglen) == 0) {
			list_del(&w->node);
			st->nahead--;
			return w;
		}
		schedule_ahead_discard(st, w);
	}
	return NULL;
}

static void schedule_channel_closed(void *state, struct pipeline *p, struct channel *ch)
{
	struct schedule *st = state;
	struct schedule_wait *w;

	list_for_each_entry_safe (w, &st->ahead, node)
		if (w->channel == ch->id)
			schedule_ahead_discard(st, w);
}

/* ---- the hook ------------------------------------------------------------ */

/* A rewritten publish goes on once its record is written and the ladder
 * declared: PIPE_PASS when both are (w freed), PIPE_WAIT (w listed). */
static enum pipe_verdict schedule_continue(struct schedule *st, struct pipeline *p,
					   struct schedule_wait *w)
{
	if (w->rec == NULL) {
		if (w->rec_rc != STATE_OK)
			pipeline_log(
			    p, LOG_DEBUG,
			    "a scheduled publish could not be recorded (%s): it is not "
			    "listed and cannot be cancelled",
			    state_strerror(w->rec_rc));
		if (!schedule_ladder_needed(st)) {
			free(w);
			return PIPE_PASS;
		}
		if (schedule_wait_ladder(st, p, w) != 0) {
			schedule_give_up(st, w);
			return PIPE_REFUSE;
		}
	}
	w->next = st->waits;
	st->waits = w;
	return PIPE_WAIT;
}

static enum pipe_verdict schedule_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	struct schedule *st = state;
	const struct rules_schedule *rule = schedule_rule(p);
	amqp_basic_publish_t *pub = m->method;
	amqp_bytes_t exchange, routing_key;
	const struct ladder_rung *rung;
	struct schedule_wait *w = NULL;
	struct schedule_ahead a;
	enum ladder_delay d;
	char sig[SCHEDULE_SIG_MAX];
	int64_t ms = 0, now, due;
	size_t siglen = 0;
	int taken;

	if (rule == NULL || m->kind != PIPE_PUBLISH || m->props == NULL ||
	    !(m->props->_flags & AMQP_BASIC_HEADERS_FLAG))
		return PIPE_PASS;
	d = ladder_delay(&m->props->headers, rule->header, &ms);
	if (d == LADDER_DELAY_NONE)
		return PIPE_PASS;
	if (d != LADDER_DELAY_OK) {
		/* Delivered at once, without the header; a bad value is
		 * counted twice: delivered at once, and bad. */
		scheduler_count(st->engine, SCHEDULER_STAT_sched_now);
		if (d == LADDER_DELAY_BAD)
			scheduler_count(st->engine, SCHEDULER_STAT_sched_bad);
		if (table_remove(&m->props->headers, rule->header))
			m->props_dirty = 1;
		return PIPE_PASS;
	}
	now = (int64_t)state_now_ms();
	if (ms > INT64_MAX - now)
		ms = INT64_MAX - now;
	exchange = pub->exchange;
	routing_key = pub->routing_key;
	if (delayed_state()) {
		siglen = schedule_sig(sig, exchange, routing_key, m->props, ms, m->body_size);
		w = schedule_ahead_take(st, ch->id, sig, siglen);
	}
	/* Looked ahead at: due when its record says. */
	due = w ? w->due_at : now + ms;
	rung = ladder_rung_for(due - now);
	taken = w != NULL;
	if (!taken) {
		if ((w = calloc(1, sizeof(*w))) == NULL)
			return PIPE_REFUSE;
		w->st = st;
		w->channel = ch->id;
		w->rec_rc = STATE_OK;
		delayed_key(w->key, due, delayed_nonce());
	}
	w->m = m;
	/* The record is made of the publish as it came: before the rewrite. */
	if (delayed_state() && !taken &&
	    schedule_submit(p, w, exchange, routing_key, m->props, m->body_size) != 0) {
		free(w);
		return PIPE_REFUSE;
	}
	if (ladder_rewrite(m->props, &m->pool, exchange, routing_key, rule->header, due) != 0 ||
	    (delayed_state() && schedule_set_id(w) != 0)) {
		schedule_give_up(st, w);
		return PIPE_REFUSE;
	}
	pub->exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
	pub->routing_key = amqp_cstring_bytes(rung->queue);
	m->method_dirty = 1;
	m->props_dirty = 1;
	scheduler_count(st->engine, SCHEDULER_STAT_scheduled);
	if (!taken && delayed_state() && list_empty(&st->ahead)) {
		/* The records of the delayed publishes behind this one are
		 * written now, in the same commit if they can be. */
		memset(&a, 0, sizeof(a));
		a.st = st;
		a.rule = rule;
		pipeline_lookahead(p, DIR_TO_BROKER, schedule_ahead_frame, &a);
	}
	return schedule_continue(st, p, w);
}

static const struct pipe_hook schedule_hook = {
    .name = "schedule",
    .attach = schedule_attach,
    .detach = schedule_detach,
    .wants = schedule_wants,
    .header_want = schedule_header_want,
    .message = schedule_message,
    .channel_closed = schedule_channel_closed,
};

void schedule_register(void)
{
	pipeline_register(&schedule_hook);
	scheduler_register();
}
