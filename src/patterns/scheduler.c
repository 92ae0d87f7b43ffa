/* scheduler: the schedule pattern's side on the proxy's own broker
 * connection, as the engine's client, per vhost. Once connected it
 * declares the ladder (the exchange, the five rungs, the control queue);
 * with "engine": true it consumes the control queue: a message not yet
 * due hops into the largest rung that does not overshoot, a due one is
 * delivered to its target (when a schedule rule allows the target and the
 * exchange is there), an unroutable one goes back into the 1 s rung, one
 * without the scheduling headers is dropped and counted. Hops and
 * deliveries are published mandatory and confirmed, and the engine
 * acknowledges the input only after the confirm. A message whose record
 * (store/delayed.h) was cancelled is dropped when the scheduler sees it;
 * a delivered one's record is removed. The publish side is schedule.c;
 * the contract (names, rungs, headers, the plan) is ladder.c. */
#include "scheduler.h"

#include "../log.h"
#include "../rules.h"
#include "../store/delayed.h"
#include "../store/state.h"
#include "../vstats.h"
#include "ladder.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SCHEDULER_PREFETCH       256
#define SCHEDULER_EXCHANGE_CACHE 16
#define SCHEDULER_EXISTS_MS      10000 /* a passive check holds this long */
#define SCHEDULER_SUSPECT_MS     10000 /* an exchange whose publish closed the channel */

const int64_t scheduler_late_bounds[SCHEDULER_LATE_BUCKETS] = {50,   100,  250,   500,  1000,
							       2000, 5000, 10000, 60000};

/* What a publish of the scheduler's is (its engine_publish kind). */
enum scheduler_kind {
	SCHEDULER_DELIVER = 1, /* a due message to its target */
	SCHEDULER_HOP,         /* not yet due: into a rung */
	SCHEDULER_REHOP,       /* due but unroutable: into the smallest rung */
};

struct scheduler_exchange {
	char name[128];
	int64_t until;
	int suspect; /* 1: publishing to it closed the channel; 0: it exists */
};

/* A vhost's scheduler. */
struct scheduler {
	const struct engine_link *link;
	pthread_mutex_t lock;
	struct rules *rules; /* under lock: a reference */
	int ready;           /* atomic: the ladder is known declared */
	uint64_t stats[SCHEDULER_NSTATS];
	uint64_t late[SCHEDULER_LATE_BUCKETS + 1], late_count, late_sum_ms; /* atomic */
	/* The engine thread's own. */
	int malformed_logged;
	int64_t forbidden_logged_at;
	struct scheduler_exchange cache[SCHEDULER_EXCHANGE_CACHE];
};

static void scheduler_add(struct scheduler *sc, enum scheduler_stat what)
{
	__atomic_fetch_add(&sc->stats[what], 1, __ATOMIC_RELAXED);
}

void scheduler_count(struct engine *e, enum scheduler_stat what)
{
	struct scheduler *sc = engine_state(e);

	if (sc)
		scheduler_add(sc, what);
}

int scheduler_ladder_ready(struct engine *e)
{
	struct scheduler *sc = engine_state(e);

	return sc && __atomic_load_n(&sc->ready, __ATOMIC_ACQUIRE);
}

/* ---- the client's life ------------------------------------------------------------ */

static void *scheduler_attach(const struct engine_link *l)
{
	struct scheduler *sc = calloc(1, sizeof(*sc));

	if (sc == NULL)
		return NULL;
	sc->link = l;
	pthread_mutex_init(&sc->lock, NULL);
	return sc;
}

static void scheduler_detach(void *state)
{
	struct scheduler *sc = state;

	if (sc->rules)
		rules_unref(sc->rules);
	pthread_mutex_destroy(&sc->lock);
	free(sc);
}

static int scheduler_needs(const struct rules_vhost *v)
{
	if (!v->schedule.enabled)
		return 0;
	if (!engine_enabled())
		log_warning("engine: vhost %s: schedule rules, but engine_user is not set: "
			    "the proxy neither declares the ladder nor runs the scheduler",
			    v->vhost);
	return 1;
}

/* The ladder is declared while the vhost has a schedule rule; the control
 * queue consumed while that rule says "engine": true. */
static unsigned scheduler_sync(void *state, struct rules *r)
{
	struct scheduler *sc = state;
	const struct rules_vhost *v;
	unsigned want = 0;

	pthread_mutex_lock(&sc->lock);
	if (sc->rules)
		rules_unref(sc->rules);
	sc->rules = r;
	if (r)
		rules_ref(r);
	v = r ? rules_vhost(r, sc->link->vhost) : NULL;
	if (v && v->schedule.enabled)
		want = ENGINE_WANT_DECLARE | (v->schedule.engine ? ENGINE_WANT_CONSUME : 0);
	pthread_mutex_unlock(&sc->lock);
	return want;
}

static int scheduler_declare(void *state)
{
	struct scheduler *sc = state;
	const struct engine_link *l = sc->link;
	amqp_table_entry_t ent[3];
	amqp_table_t args;
	int i;

	if (l->declare_exchange(l, LADDER_EXCHANGE, "direct", "declaring " LADDER_EXCHANGE) !=
	    0)
		return -1;
	for (i = 0; i <= LADDER_RUNGS; i++) {
		const char *q = i < LADDER_RUNGS ? ladder_rungs[i].queue : LADDER_DUE;

		args = i < LADDER_RUNGS ? ladder_rung_args(&ladder_rungs[i], ent)
					: amqp_empty_table;
		if (l->declare_queue(l, q, args, "declaring the ladder's queues") != 0 ||
		    l->bind_queue(l, q, LADDER_EXCHANGE, q, "binding the ladder's queues") != 0)
			return -1;
	}
	__atomic_store_n(&sc->ready, 1, __ATOMIC_RELEASE);
	return 0;
}

/* ---- target exchanges ------------------------------------------------------------- */

static struct scheduler_exchange *scheduler_cached(struct scheduler *sc, amqp_bytes_t name,
						   int64_t now)
{
	int i;

	for (i = 0; i < SCHEDULER_EXCHANGE_CACHE; i++) {
		struct scheduler_exchange *c = &sc->cache[i];

		if (c->until > now && strlen(c->name) == name.len &&
		    memcmp(c->name, name.bytes, name.len) == 0)
			return c;
	}
	return NULL;
}

/* One entry per name: a suspect mark replaces what a passive check found
 * (the check that came just before the delivery the broker refused). */
static void scheduler_cache(struct scheduler *sc, amqp_bytes_t name, int suspect, int64_t until)
{
	struct scheduler_exchange *c = &sc->cache[0];
	int i;

	if (name.len >= sizeof(c->name))
		return;
	for (i = 0; i < SCHEDULER_EXCHANGE_CACHE; i++)
		if (strlen(sc->cache[i].name) == name.len &&
		    memcmp(sc->cache[i].name, name.bytes, name.len) == 0)
			break;
	if (i < SCHEDULER_EXCHANGE_CACHE)
		c = &sc->cache[i];
	else
		for (i = 1; i < SCHEDULER_EXCHANGE_CACHE; i++)
			if (sc->cache[i].until < c->until)
				c = &sc->cache[i];
	memcpy(c->name, name.bytes, name.len);
	c->name[name.len] = '\0';
	c->suspect = suspect;
	c->until = until;
}

/* Whether a due message can go to exchange now: 1 yes, 0 no (missing, or
 * publishing to it closed the channel lately), -1 the connection failed. */
static int scheduler_exchange_ok(struct scheduler *sc, amqp_bytes_t name)
{
	int64_t now = (int64_t)state_now_ms();
	struct scheduler_exchange *c;
	int rc;

	if (name.len == 0)
		return 1; /* the default exchange */
	if ((c = scheduler_cached(sc, name, now)) != NULL)
		return !c->suspect;
	rc = sc->link->exchange_exists(sc->link, name);
	if (rc == 1)
		scheduler_cache(sc, name, 0, now + SCHEDULER_EXISTS_MS);
	return rc;
}

/* The proxy adds no privilege: whoever can write into the ladder cannot
 * make it deliver where no schedule rule of the vhost allows. */
static int scheduler_allowed(struct scheduler *sc, amqp_bytes_t ex, amqp_bytes_t rk)
{
	const struct rules_vhost *v;
	int ok = 0;

	pthread_mutex_lock(&sc->lock);
	v = sc->rules ? rules_vhost(sc->rules, sc->link->vhost) : NULL;
	if (v && v->schedule.enabled)
		ok = rules_matches(&v->schedule.match, (const char *)ex.bytes, ex.len,
				   (const char *)rk.bytes, rk.len);
	pthread_mutex_unlock(&sc->lock);
	return ok;
}

/* ---- the control queue ------------------------------------------------------------ */

static void scheduler_forbidden(struct scheduler *sc, const struct ladder_plan *plan)
{
	int64_t now = (int64_t)state_now_ms();

	scheduler_add(sc, SCHEDULER_STAT_forbidden);
	if (now - sc->forbidden_logged_at < 60000)
		return; /* one line a minute at most */
	sc->forbidden_logged_at = now;
	log_warning("engine: vhost %s: a scheduled message for exchange '%.*s' routing key "
		    "'%.*s' was dropped: no schedule rule allows it",
		    sc->link->vhost, (int)plan->exchange.len,
		    (const char *)plan->exchange.bytes, (int)plan->routing_key.len,
		    (const char *)plan->routing_key.bytes);
}

/* The record's key of a planned message: 1, or 0 when it has none (or an
 * id that does not go with its due time). */
static int scheduler_record_key(const struct ladder_plan *plan, uint8_t key[DELAYED_KEY_LEN])
{
	return plan->action != LADDER_MALFORMED && plan->id.len > 0 &&
	       delayed_parse_id(plan->id.bytes, plan->id.len, key) == 0 &&
	       delayed_key_due(key) == plan->due_at;
}

static int scheduler_message(void *state, uint64_t tag, amqp_message_t *msg)
{
	struct scheduler *sc = state;
	const struct engine_link *l = sc->link;
	struct engine_publish p = {.props = &msg->properties, .body = msg->body, .input = tag};
	uint8_t key[DELAYED_KEY_LEN];
	struct ladder_plan plan;
	int ok, recorded;

	ladder_plan(&msg->properties, (int64_t)state_now_ms(), &plan);
	p.data = plan.due_at;
	recorded = scheduler_record_key(&plan, key);
	if (recorded && delayed_cancelled(l->vhost, key)) {
		/* Cancelled through the admin endpoint: it goes no further. */
		scheduler_add(sc, SCHEDULER_STAT_cancelled);
		delayed_forget(l->vhost, key);
		return l->ack(l, tag);
	}
	switch (plan.action) {
	case LADDER_MALFORMED:
		scheduler_add(sc, SCHEDULER_STAT_malformed);
		if (!sc->malformed_logged)
			log_warning("engine: vhost %s: a message in " LADDER_DUE
				    " without the scheduling headers was dropped",
				    l->vhost);
		sc->malformed_logged = 1;
		return l->ack(l, tag);
	case LADDER_HOP:
		p.kind = SCHEDULER_HOP;
		p.exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
		p.routing_key = amqp_cstring_bytes(plan.rung->queue);
		break;
	case LADDER_DELIVER:
		if (!scheduler_allowed(sc, plan.exchange, plan.routing_key)) {
			scheduler_forbidden(sc, &plan);
			if (recorded)
				delayed_forget(l->vhost, key);
			return l->ack(l, tag);
		}
		ok = scheduler_exchange_ok(sc, plan.exchange);
		if (ok < 0)
			return -1;
		if (!ok) {
			scheduler_add(sc, SCHEDULER_STAT_unroutable);
			p.kind = SCHEDULER_REHOP;
			p.exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
			p.routing_key = amqp_cstring_bytes(ladder_smallest()->queue);
			break;
		}
		/* plan's names point into the headers ladder_final edits. */
		if (engine_bytes_copy(&msg->pool, &p.exchange, plan.exchange) != 0 ||
		    engine_bytes_copy(&msg->pool, &p.routing_key, plan.routing_key) != 0 ||
		    ladder_final(&msg->properties, &msg->pool) != 0)
			return -1;
		p.kind = SCHEDULER_DELIVER;
		p.data2 = recorded ? delayed_key_nonce(key) : 0;
		break;
	}
	return l->publish(l, &p);
}

/* A due message that came back goes into the smallest rung again, rebuilt
 * from what was returned; its input goes with it. */
static int scheduler_returned(void *state, struct engine_sent *s, amqp_message_t *msg)
{
	struct scheduler *sc = state;
	struct engine_publish p = {.props = &msg->properties, .body = msg->body};

	if (s->kind != SCHEDULER_DELIVER)
		return 0;
	scheduler_add(sc, SCHEDULER_STAT_unroutable);
	if (ladder_readd(&msg->properties, &msg->pool, s->exchange, s->routing_key, s->data) !=
	    0)
		return -1;
	if (s->data2) {
		/* Its record's id goes back with it: still listed, cancellable. */
		uint8_t key[DELAYED_KEY_LEN];
		char id[DELAYED_ID_LEN + 1];

		delayed_key(key, s->data, s->data2);
		delayed_id(id, key);
		if (ladder_set_id(&msg->properties, &msg->pool, amqp_cstring_bytes(id)) != 0)
			return -1;
		s->data2 = 0; /* not delivered: the record stays */
	}
	p.kind = SCHEDULER_REHOP;
	p.exchange = amqp_cstring_bytes(LADDER_EXCHANGE);
	p.routing_key = amqp_cstring_bytes(ladder_smallest()->queue);
	p.input = s->input;
	if (sc->link->publish(sc->link, &p) != 0)
		return -1;
	s->input = 0;
	return 0;
}

static void scheduler_late(struct scheduler *sc, int64_t late_ms)
{
	int i;

	if (late_ms < 0)
		late_ms = 0;
	for (i = 0; i < SCHEDULER_LATE_BUCKETS && late_ms > scheduler_late_bounds[i]; i++)
		;
	__atomic_fetch_add(&sc->late[i], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&sc->late_count, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&sc->late_sum_ms, (uint64_t)late_ms, __ATOMIC_RELAXED);
}

static int scheduler_settled(void *state, const struct engine_sent *s, enum engine_rc rc)
{
	struct scheduler *sc = state;

	if (s->input == 0)
		return 0; /* handed on to a publish of its own */
	if (rc == ENGINE_OK) {
		if (s->kind == SCHEDULER_DELIVER) {
			scheduler_add(sc, SCHEDULER_STAT_delivered);
			scheduler_late(sc, (int64_t)state_now_ms() - s->data);
			if (s->data2) {
				uint8_t key[DELAYED_KEY_LEN];

				delayed_key(key, s->data, s->data2);
				delayed_forget(sc->link->vhost, key);
			}
		} else if (s->kind == SCHEDULER_HOP) {
			scheduler_add(sc, SCHEDULER_STAT_hops);
		}
	} else if (s->returned) {
		/* A hop the ladder could not take: a rung is gone. */
		__atomic_store_n(&sc->ready, 0, __ATOMIC_RELEASE);
		sc->link->redeclare(sc->link);
	}
	return 0;
}

/* Mark the exchanges of deliveries out when the publish channel closed, so
 * that what closed it does not come round again at once. */
static void scheduler_publish_closed(void *state, const struct engine_sent *s)
{
	struct scheduler *sc = state;

	if (s->kind == SCHEDULER_DELIVER)
		scheduler_cache(sc, s->exchange, 1,
				(int64_t)state_now_ms() + SCHEDULER_SUSPECT_MS);
}

/* ---- admin views ------------------------------------------------------------------ */

static uint64_t scheduler_load(const uint64_t *v)
{
	return __atomic_load_n(v, __ATOMIC_RELAXED);
}

static void scheduler_stats_json(void *state, struct evbuffer *out)
{
	struct scheduler *sc = state;
	int i;

	evbuffer_add_printf(out, ", \"ladder_ready\": %d",
			    __atomic_load_n(&sc->ready, __ATOMIC_ACQUIRE));
#define SCHEDULER_JSON(name, metric, labels, help) \
	evbuffer_add_printf(                       \
	    out, ", \"%s\": %llu", #name,          \
	    (unsigned long long)scheduler_load(&sc->stats[SCHEDULER_STAT_##name]));
	SCHEDULER_COUNTERS(SCHEDULER_JSON)
#undef SCHEDULER_JSON
	evbuffer_add_printf(out, ", \"lateness_ms\": {");
	for (i = 0; i <= SCHEDULER_LATE_BUCKETS; i++) {
		if (i < SCHEDULER_LATE_BUCKETS)
			evbuffer_add_printf(
			    out, "\"le_%lld\": ", (long long)scheduler_late_bounds[i]);
		else
			evbuffer_add_printf(out, "\"more\": ");
		evbuffer_add_printf(out, "%llu%s",
				    (unsigned long long)scheduler_load(&sc->late[i]),
				    i < SCHEDULER_LATE_BUCKETS ? ", " : "");
	}
	evbuffer_add_printf(out, "}");
}

static void scheduler_label(struct evbuffer *out, const char *metric, struct engine *e)
{
	evbuffer_add_printf(out, "%s{vhost=\"", metric);
	vstats_escape(out, engine_vhost(e));
}

static void scheduler_metrics(struct evbuffer *out, struct engine *list)
{
	const char *family = "";
	struct scheduler *sc;
	struct engine *e;
	uint64_t cum;
	int i;

#define SCHEDULER_METRIC(name, metric, labels, help)                                        \
	if (strcmp(family, metric) != 0) {                                                  \
		family = metric;                                                            \
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n", metric, help, \
				    metric);                                                \
	}                                                                                   \
	for (e = list; e; e = engine_next(e)) {                                             \
		sc = engine_state(e);                                                       \
		scheduler_label(out, metric, e);                                            \
		evbuffer_add_printf(                                                        \
		    out, "\",%s} %llu\n", labels,                                           \
		    (unsigned long long)(sc ? scheduler_load(                               \
						  &sc->stats[SCHEDULER_STAT_##name])        \
					    : 0));                                          \
	}
	SCHEDULER_COUNTERS(SCHEDULER_METRIC)
#undef SCHEDULER_METRIC
	evbuffer_add_printf(out, "# HELP acemq_proxy_schedule_lateness_seconds time from a "
				 "scheduled message's due time to its delivery\n"
				 "# TYPE acemq_proxy_schedule_lateness_seconds histogram\n");
	for (e = list; e; e = engine_next(e)) {
		if ((sc = engine_state(e)) == NULL)
			continue;
		for (cum = 0, i = 0; i <= SCHEDULER_LATE_BUCKETS; i++) {
			cum += scheduler_load(&sc->late[i]);
			scheduler_label(out, "acemq_proxy_schedule_lateness_seconds_bucket", e);
			if (i < SCHEDULER_LATE_BUCKETS)
				evbuffer_add_printf(out, "\",le=\"%g\"} %llu\n",
						    (double)scheduler_late_bounds[i] / 1000,
						    (unsigned long long)cum);
			else
				evbuffer_add_printf(out, "\",le=\"+Inf\"} %llu\n",
						    (unsigned long long)cum);
		}
		scheduler_label(out, "acemq_proxy_schedule_lateness_seconds_sum", e);
		evbuffer_add_printf(out, "\"} %g\n",
				    (double)scheduler_load(&sc->late_sum_ms) / 1000);
		scheduler_label(out, "acemq_proxy_schedule_lateness_seconds_count", e);
		evbuffer_add_printf(out, "\"} %llu\n",
				    (unsigned long long)scheduler_load(&sc->late_count));
	}
}

const struct engine_client scheduler_client = {
    .name = "the scheduler",
    .queue = LADDER_DUE,
    .prefetch = SCHEDULER_PREFETCH,
    .attach = scheduler_attach,
    .detach = scheduler_detach,
    .needs = scheduler_needs,
    .sync = scheduler_sync,
    .declare = scheduler_declare,
    .message = scheduler_message,
    .returned = scheduler_returned,
    .settled = scheduler_settled,
    .publish_closed = scheduler_publish_closed,
    .stats_json = scheduler_stats_json,
    .metrics = scheduler_metrics,
};

void scheduler_register(void)
{
	engine_register(&scheduler_client);
}
