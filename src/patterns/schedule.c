/* schedule: a publish with a delay header rewritten onto the schedule
 * ladder, and recorded (store/delayed.h) so that it can be listed and
 * cancelled: the pattern's publish side; its scheduler is scheduler.c. */
#include "schedule.h"

#include "../../amqp/table.h"
#include "../engine.h"
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

struct schedule_wait;

struct schedule {
	struct pipeline *p;
	struct engine *engine; /* NULL: no credentials of the proxy's own */
	struct schedule_wait *waits;
};

/* A rewritten publish waiting for its record to be written, then for
 * the ladder to be declared. */
struct schedule_wait {
	struct schedule *st; /* NULL once the session went */
	struct engine_req *req;
	struct delayed_rec *rec;
	int rec_rc;
	struct pipe_msg *m;
	uint16_t channel;
	struct schedule_wait *next;
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
	return st;
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

	for (w = st->waits; w; w = next) {
		next = w->next;
		pipe_msg_free(w->m);
		w->m = NULL;
		w->st = NULL;
		if (w->req == NULL && w->rec == NULL)
			free(w); /* its completion came and could not run */
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
	if (w->st == NULL) {
		free(w);
		return;
	}
	pipeline_call(w->st->p, schedule_recorded_in, w);
}

/* Give the rewritten publish its id and submit its record (w waits). */
static int schedule_record(struct schedule *st, struct pipeline *p, struct schedule_wait *w,
			   amqp_bytes_t exchange, amqp_bytes_t routing_key, int64_t due_at)
{
	const amqp_basic_properties_t *props = w->m->props;
	int has_mid = (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0;
	uint8_t key[DELAYED_KEY_LEN];
	char id[DELAYED_ID_LEN + 1];
	struct delayed_rec *r;

	delayed_key(key, due_at, delayed_nonce());
	delayed_id(id, key);
	if (ladder_set_id(w->m->props, &w->m->pool, amqp_cstring_bytes(id)) != 0 ||
	    (r = malloc(sizeof(*r))) == NULL)
		return -1;
	delayed_rec_prepare(r, p->vhost, key, exchange.bytes, exchange.len, routing_key.bytes,
			    routing_key.len, has_mid ? props->message_id.bytes : NULL,
			    has_mid ? props->message_id.len : 0, has_mid, w->m->body_size);
	r->w.call.fn = schedule_recorded;
	r->w.w = p->w;
	r->owner = w;
	w->rec = r;
	state_submit(delayed_state(), &r->w);
	return 0;
}

static enum pipe_verdict schedule_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	struct schedule *st = state;
	const struct rules_schedule *rule = schedule_rule(p);
	amqp_basic_publish_t *pub = m->method;
	amqp_bytes_t exchange, routing_key;
	const struct ladder_rung *rung;
	struct schedule_wait *w;
	enum ladder_delay d;
	int64_t ms = 0, now;

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
	rung = ladder_rung_for(ms);
	exchange = pub->exchange;
	routing_key = pub->routing_key;
	if (ladder_rewrite(m->props, &m->pool, exchange, routing_key, rule->header, now + ms) !=
	    0)
		return PIPE_REFUSE;
	pub->exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
	pub->routing_key = amqp_cstring_bytes(rung->queue);
	m->method_dirty = 1;
	m->props_dirty = 1;
	scheduler_count(st->engine, SCHEDULER_STAT_scheduled);
	if (delayed_state() == NULL && !schedule_ladder_needed(st))
		return PIPE_PASS;
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return PIPE_REFUSE;
	w->st = st;
	w->m = m;
	w->channel = ch->id;
	/* Waiting for the record (which goes on to the ladder) or the ladder. */
	if (delayed_state() ? schedule_record(st, p, w, exchange, routing_key, now + ms) != 0
			    : schedule_wait_ladder(st, p, w) != 0) {
		free(w);
		return PIPE_REFUSE;
	}
	w->next = st->waits;
	st->waits = w;
	return PIPE_WAIT;
}

static const struct pipe_hook schedule_hook = {
    .name = "schedule",
    .attach = schedule_attach,
    .detach = schedule_detach,
    .wants = schedule_wants,
    .header_want = schedule_header_want,
    .message = schedule_message,
};

void schedule_register(void)
{
	pipeline_register(&schedule_hook);
	scheduler_register();
}
