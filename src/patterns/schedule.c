/* schedule: a publish with a delay header rewritten onto the schedule
 * ladder (the pattern's publish side; its scheduler is scheduler.c). */
#include "schedule.h"

#include "../../amqp/table.h"
#include "../engine.h"
#include "../log.h"
#include "../pipeline.h"
#include "../rules.h"
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

/* A rewritten publish waiting for the ladder to be declared. */
struct schedule_wait {
	struct schedule *st; /* NULL once the session went */
	struct engine_req *req;
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
		if (w->req == NULL)
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

static enum pipe_verdict schedule_message(void *state, struct pipeline *p, struct channel *ch,
					  struct pipe_msg *m)
{
	struct schedule *st = state;
	const struct rules_schedule *rule = schedule_rule(p);
	amqp_basic_publish_t *pub = m->method;
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
	if (ladder_rewrite(m->props, &m->pool, pub->exchange, pub->routing_key, rule->header,
			   now + ms) != 0)
		return PIPE_REFUSE;
	pub->exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
	pub->routing_key = amqp_cstring_bytes(rung->queue);
	m->method_dirty = 1;
	m->props_dirty = 1;
	scheduler_count(st->engine, SCHEDULER_STAT_scheduled);
	/* Without credentials of its own the proxy relies on whoever runs the
	 * scheduler to have declared the ladder (the broker answers 404 if not). */
	if (!engine_enabled() || scheduler_ladder_ready(st->engine))
		return PIPE_PASS;
	if ((w = calloc(1, sizeof(*w))) == NULL ||
	    (w->req = engine_req_new(p->w, ENGINE_DECLARE, schedule_ladder_done)) == NULL) {
		free(w);
		return PIPE_REFUSE;
	}
	w->st = st;
	w->m = m;
	w->channel = ch->id;
	w->req->owner = w;
	w->next = st->waits;
	st->waits = w;
	engine_submit(st->engine, w->req);
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
