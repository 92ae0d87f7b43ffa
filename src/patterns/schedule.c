/* schedule: a publish with a delay header rewritten onto the schedule
 * ladder, and recorded (store/delayed.h) so that it can be listed and
 * cancelled: the pattern's publish side; its scheduler is scheduler.c.
 * A rewritten publish is forwarded at once while its record is written;
 * its client's confirm waits for both the broker's and the record's
 * commit, so the commit overlaps the broker's work instead of adding to
 * it, and the records of publishes sent together share a commit. A
 * publish the broker nacks (it is not on the ladder) has its record
 * removed. */
#include "schedule.h"

#include "../../amqp/table.h"
#include "../debug.h"
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

#include <stdlib.h>
#include <string.h>

/* Records being written per connection before a delayed publish waits for
 * its own (the client's input is then read no further until it is). */
#define SCHEDULE_RECORDS_MAX 1024

struct schedule {
	struct pipeline *p;
	struct engine *engine; /* NULL: no credentials of the proxy's own */
	struct list pending;   /* schedule_pub.node, in the order published */
	int nrecords;          /* records being written */
	int unsent;            /* those in pending whose publish is not disposed of */
	int unanswered;        /* those in pending the broker is still to confirm */
};

/* A rewritten publish, from the hook until its record is written and its
 * publish disposed of (forwarded or not). */
struct schedule_pub {
	struct schedule *st;     /* NULL once the session went */
	struct list node;        /* in st->pending while st */
	struct engine_req *req;  /* the ladder's declaration, awaited */
	struct delayed_rec *rec; /* the record, being written */
	int rec_rc;
	int submitted;      /* a record was submitted */
	struct pipe_msg *m; /* until forwarded or not */
	int waiting;        /* m waits (PIPE_WAIT) for the ladder or the record */
	uint16_t channel;
	uint64_t broker_seq; /* its client's confirm held for the record, or 0 */
	uint64_t seq;        /* its broker sequence number until the broker's answer */
	int nacked;          /* the broker nacked it: its record goes once written */
	int given_up;        /* not forwarded: the record goes once written ... */
	char *forget_vhost;  /* ... from this vhost (NULL: by the janitor) */
	uint8_t key[DELAYED_KEY_LEN];
};

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
	list_init(&st->pending);
	return st;
}

/* w's publish is disposed of (forwarded or not). */
static void schedule_sent(struct schedule *st, struct schedule_pub *w)
{
	if (w->m != NULL) {
		w->m = NULL;
		st->unsent--;
	}
}

/* w is done with: its record written (or none), its publish disposed of. */
static void schedule_done(struct schedule_pub *w)
{
	schedule_sent(w->st, w);
	list_del(&w->node);
	free(w);
}

/* The broker answered w's publish (or never will: its channel closed). */
static void schedule_answered(struct schedule *st, struct schedule_pub *w)
{
	if (w->seq != 0) {
		w->seq = 0;
		st->unanswered--;
	}
}

/* w's record is written and its publish forwarded: done with once the
 * broker has answered; a nacked one's record goes. */
static void schedule_settle(struct schedule *st, struct schedule_pub *w)
{
	if (w->seq != 0)
		return; /* publish_settled finishes it */
	if (w->nacked && w->rec_rc == STATE_OK)
		delayed_forget(st->p->vhost, w->key);
	schedule_done(w);
}

/* w's publish is not forwarded after all (or its session went before it
 * was): its record, if one was submitted, goes, now or once written. */
static void schedule_give_up(struct schedule *st, struct schedule_pub *w)
{
	list_del(&w->node);
	schedule_sent(st, w);
	if (w->rec != NULL) {
		st->nrecords--;
		w->st = NULL;
		w->given_up = 1;
		w->forget_vhost = strdup(st->p->vhost); /* NULL: left to the janitor */
		return;
	}
	if (w->submitted && w->rec_rc == STATE_OK)
		delayed_forget(st->p->vhost, w->key);
	if (w->req != NULL)
		w->st = NULL; /* the ladder's completion frees it */
	else
		free(w);
}

static void schedule_detach(void *state)
{
	struct schedule *st = state;
	struct schedule_pub *w;

	while ((w = list_first_entry(&st->pending, struct schedule_pub, node)) != NULL) {
		if (w->m != NULL) {
			/* Never forwarded: its record goes too. A waiting
			 * publish is the hook's to free. */
			if (w->waiting)
				pipe_msg_free(w->m);
			schedule_give_up(st, w);
			continue;
		}
		/* Forwarded: its record stays; a completion to come frees it. */
		list_del(&w->node);
		if (w->rec != NULL || w->req != NULL)
			w->st = NULL;
		else
			free(w);
	}
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

/* Without credentials of its own the proxy relies on whoever runs the
 * scheduler to have declared the ladder (the broker answers 404 if not). */
static int schedule_ladder_needed(struct schedule *st)
{
	return engine_enabled() && !scheduler_ladder_ready(st->engine);
}

/* A waiting publish goes on (PIPE_PASS) or is refused; published() then
 * hears of it. */
static void schedule_resume(struct pipeline *p, struct schedule_pub *w, enum pipe_verdict v)
{
	struct channel *ch = pipeline_channel(p, w->channel);
	struct pipe_msg *m = w->m;

	w->waiting = 0;
	if (ch)
		pipeline_resume(p, ch, m, v);
	else
		pipeline_drop(p, m);
}

static void schedule_ladder_in(struct pipeline *p, void *arg)
{
	schedule_resume(p, arg, PIPE_PASS);
}

static void schedule_refused_in(struct pipeline *p, void *arg)
{
	pipeline_log(p, LOG_WARNING,
		     "a scheduled publish was refused: the schedule ladder "
		     "could not be declared");
	schedule_resume(p, arg, PIPE_REFUSE);
}

static void schedule_ladder_done(struct worker_call *c)
{
	struct engine_req *r = (struct engine_req *)c;
	struct schedule_pub *w = r->owner;
	enum engine_rc rc = r->rc;

	engine_req_free(r);
	w->req = NULL;
	if (w->st == NULL) {
		if (w->rec == NULL && !w->given_up)
			free(w);
		return;
	}
	/* Not run when the session is closing: detach then frees w. */
	pipeline_call(w->st->p, rc == ENGINE_OK ? schedule_ladder_in : schedule_refused_in, w);
}

/* w's publish waits for the ladder's declaration: 0 asked, -1. */
static int schedule_wait_ladder(struct pipeline *p, struct schedule_pub *w)
{
	if ((w->req = engine_req_new(p->w, ENGINE_DECLARE, schedule_ladder_done)) == NULL)
		return -1;
	w->req->owner = w;
	engine_submit(w->st->engine, w->req);
	w->waiting = 1;
	return 0;
}

/* The record is written (or could not be: the message goes on, neither
 * listed nor cancellable). */
static void schedule_recorded_in(struct pipeline *p, void *arg)
{
	struct schedule_pub *w = arg;

	if (w->rec_rc != STATE_OK)
		pipeline_log(p, LOG_DEBUG,
			     "a scheduled publish could not be recorded (%s): it is not "
			     "listed and cannot be cancelled",
			     state_strerror(w->rec_rc));
	if (w->waiting && w->req == NULL) {
		/* It waited for its record (too many being written). */
		if (!schedule_ladder_needed(w->st))
			schedule_resume(p, w, PIPE_PASS);
		else if (schedule_wait_ladder(p, w) != 0)
			schedule_resume(p, w, PIPE_REFUSE);
		return;
	}
	if (w->m != NULL)
		return; /* still on its way: published() finishes it */
	if (w->broker_seq)
		pipeline_confirm_release(p, w->channel, w->broker_seq);
	w->broker_seq = 0;
	schedule_settle(w->st, w);
}

static void schedule_recorded(struct worker_call *c)
{
	struct delayed_rec *r = (struct delayed_rec *)c;
	struct schedule_pub *w = r->owner;

	w->rec_rc = r->w.rc;
	w->rec = NULL;
	free(r);
	if (w->given_up) {
		if (w->rec_rc == STATE_OK && w->forget_vhost)
			delayed_forget(w->forget_vhost, w->key);
		free(w->forget_vhost);
		if (w->req == NULL)
			free(w);
		else
			w->given_up = 0; /* the ladder's completion frees it */
		return;
	}
	if (w->st == NULL) {
		if (w->req == NULL)
			free(w);
		return;
	}
	w->st->nrecords--;
	/* Not run when the session is closing: detach then frees w. */
	pipeline_call(w->st->p, schedule_recorded_in, w);
}

/* Submit the record of w's publish, under w->key. 0, or -1 (nothing in
 * flight). */
static int schedule_submit(struct pipeline *p, struct schedule_pub *w, amqp_bytes_t exchange,
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
static int schedule_set_id(struct schedule_pub *w)
{
	char id[DELAYED_ID_LEN + 1];

	delayed_id(id, w->key);
	return ladder_set_id(w->m->props, &w->m->pool, amqp_cstring_bytes(id));
}

/* ---- the hook ------------------------------------------------------------ */

static struct schedule_pub *schedule_find(struct schedule *st, const struct pipe_msg *m)
{
	struct list *n;

	if (st->unsent == 0)
		return NULL; /* not a delayed publish, or one forwarded already */
	/* Most often the last one: a publish is forwarded as it passes. */
	for (n = st->pending.prev; n != &st->pending; n = n->prev) {
		struct schedule_pub *w = list_entry(n, struct schedule_pub, node);

		if (w->m == m)
			return w;
	}
	return NULL;
}

/* The publish is forwarded (its client's confirm then waits for the
 * record too) or not (its record goes). */
static void schedule_published(void *state, struct pipeline *p, struct channel *ch,
			       struct pipe_msg *m, int forwarded, uint64_t broker_seq)
{
	struct schedule *st = state;
	struct schedule_pub *w = schedule_find(st, m);

	if (w == NULL)
		return;
	schedule_sent(st, w);
	if (!forwarded) {
		schedule_give_up(st, w);
		return;
	}
	/* A waiting publish goes on only once it waits no more. */
	ACEMQ_ASSERT(!w->waiting && w->req == NULL);
	if (broker_seq && ch) {
		w->seq = broker_seq;
		st->unanswered++;
	}
	if (w->rec == NULL) {
		schedule_settle(st, w);
		return;
	}
	if (broker_seq && ch && pipeline_confirm_hold(p, ch, broker_seq) == 0)
		w->broker_seq = broker_seq;
}

/* The broker's answer to a forwarded publish: a nacked delayed one is not
 * on the ladder, so its record goes (now, or once written). */
static void schedule_publish_settled(void *state, struct pipeline *p, struct channel *ch,
				     uint64_t broker_seq, int acked)
{
	struct schedule *st = state;
	struct schedule_pub *e, *w = NULL;

	if (st->unanswered == 0 || ch == NULL)
		return;
	/* Answered in order, so most often the first. */
	list_for_each_entry (e, &st->pending, node)
		if (e->seq == broker_seq && e->channel == ch->id) {
			w = e;
			break;
		}
	if (w == NULL)
		return;
	schedule_answered(st, w);
	if (!acked)
		w->nacked = 1;
	if (w->rec == NULL && w->m == NULL)
		schedule_settle(st, w);
}

/* A closed channel's confirms are gone, and its numbers start again; its
 * publishes the broker did not answer keep their records (they may be on
 * the ladder). */
static void schedule_channel_closed(void *state, struct pipeline *p, struct channel *ch)
{
	struct schedule *st = state;
	struct schedule_pub *w;

	list_for_each_entry_safe (w, &st->pending, node) {
		if (w->channel != ch->id)
			continue;
		w->broker_seq = 0;
		schedule_answered(st, w);
		if (w->rec == NULL && w->m == NULL)
			schedule_settle(st, w);
	}
}

static enum pipe_verdict schedule_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	struct schedule *st = state;
	const struct rules_schedule *rule = schedule_rule(p);
	amqp_basic_publish_t *pub = m->method;
	const struct ladder_rung *rung;
	struct schedule_pub *w;
	enum ladder_delay d;
	int64_t ms = 0, now, due;

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
	due = now + ms;
	rung = ladder_rung_for(ms);
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return PIPE_REFUSE;
	w->st = st;
	w->channel = ch->id;
	w->rec_rc = STATE_OK;
	w->m = m;
	st->unsent++;
	list_add_tail(&w->node, &st->pending);
	delayed_key(w->key, due, delayed_nonce());
	/* The record is made of the publish as it came: before the rewrite. */
	if (delayed_state()) {
		if (schedule_submit(p, w, pub->exchange, pub->routing_key, m->props,
				    m->body_size) != 0) {
			schedule_done(w);
			return PIPE_REFUSE;
		}
		st->nrecords++;
	}
	if (ladder_rewrite(m->props, &m->pool, pub->exchange, pub->routing_key, rule->header,
			   due) != 0 ||
	    (delayed_state() && schedule_set_id(w) != 0)) {
		schedule_give_up(st, w);
		return PIPE_REFUSE;
	}
	pub->exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
	pub->routing_key = amqp_cstring_bytes(rung->queue);
	m->method_dirty = 1;
	m->props_dirty = 1;
	scheduler_count(st->engine, SCHEDULER_STAT_scheduled);
	if (schedule_ladder_needed(st)) {
		if (schedule_wait_ladder(p, w) != 0) {
			schedule_give_up(st, w);
			return PIPE_REFUSE;
		}
		return PIPE_WAIT;
	}
	if (w->rec != NULL && st->nrecords > SCHEDULE_RECORDS_MAX) {
		w->waiting = 1; /* resumed by schedule_recorded_in */
		return PIPE_WAIT;
	}
	return PIPE_PASS;
}

static const struct pipe_hook schedule_hook = {
    .name = "schedule",
    .attach = schedule_attach,
    .detach = schedule_detach,
    .wants = schedule_wants,
    .header_want = schedule_header_want,
    .message = schedule_message,
    .channel_closed = schedule_channel_closed,
    .published = schedule_published,
    .publish_settled = schedule_publish_settled,
};

void schedule_register(void)
{
	pipeline_register(&schedule_hook);
	scheduler_register();
}
