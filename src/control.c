/* control: an operator's actions on the connections open now (close, drain,
 * a vhost's publishers paused), on each session's own worker, the
 * process-wide list of paused vhosts, and the rules' rates applied to a
 * session (a connection refused, a publisher held while its vhost is in
 * debt). */
#include "control.h"

#include "json.h"
#include "limits.h"
#include "list.h"
#include "log.h"
#include "ratelimit.h"
#include "rules.h"
#include "session.h"
#include "tagmap.h"
#include "vstats.h"
#include "worker.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTROL_DEFAULT_REASON "closed by the proxy's operator"

/* The paused vhosts: a few, named by an operator. */
struct control_vhost {
	struct list link;
	char *name;
};

static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;
static struct list control_vhosts = {&control_vhosts, &control_vhosts};
static int control_npaused; /* atomic reads; written under the lock */

static struct control_vhost *control_find(const char *vhost)
{
	struct control_vhost *v;

	list_for_each_entry (v, &control_vhosts, link)
		if (strcmp(v->name, vhost) == 0)
			return v;
	return NULL;
}

int control_pause(const char *vhost, int on)
{
	struct control_vhost *v;
	int rc = 0;

	pthread_mutex_lock(&control_lock);
	v = control_find(vhost);
	if (on && v == NULL) {
		v = calloc(1, sizeof(*v));
		if (v == NULL || (v->name = strdup(vhost)) == NULL) {
			free(v);
			rc = -1;
		} else {
			list_add(&v->link, &control_vhosts);
			__atomic_add_fetch(&control_npaused, 1, __ATOMIC_RELAXED);
			rc = 1;
		}
	} else if (!on && v) {
		list_del(&v->link);
		free(v->name);
		free(v);
		__atomic_sub_fetch(&control_npaused, 1, __ATOMIC_RELAXED);
		rc = 1;
	}
	pthread_mutex_unlock(&control_lock);
	return rc;
}

int control_paused(const char *vhost)
{
	int on;

	if (__atomic_load_n(&control_npaused, __ATOMIC_RELAXED) == 0)
		return 0;
	pthread_mutex_lock(&control_lock);
	on = control_find(vhost) != NULL;
	pthread_mutex_unlock(&control_lock);
	return on;
}

int control_paused_count(void)
{
	return __atomic_load_n(&control_npaused, __ATOMIC_RELAXED);
}

void control_paused_json(struct evbuffer *out)
{
	struct control_vhost *v;
	int first = 1;

	evbuffer_add(out, "[", 1);
	pthread_mutex_lock(&control_lock);
	list_for_each_entry (v, &control_vhosts, link) {
		evbuffer_add_printf(out, "%s", first ? "" : ", ");
		json_cstring(out, v->name);
		first = 0;
	}
	pthread_mutex_unlock(&control_lock);
	evbuffer_add(out, "]", 1);
}

void control_paused_metrics(struct evbuffer *out)
{
	struct control_vhost *v;

	evbuffer_add_printf(out,
			    "# HELP acemq_proxy_vhost_paused 1 for a vhost whose publishers "
			    "an operator paused\n# TYPE acemq_proxy_vhost_paused gauge\n");
	pthread_mutex_lock(&control_lock);
	list_for_each_entry (v, &control_vhosts, link) {
		evbuffer_add_printf(out, "acemq_proxy_vhost_paused{vhost=\"");
		vstats_escape(out, v->name);
		evbuffer_add_printf(out, "\"} 1\n");
	}
	pthread_mutex_unlock(&control_lock);
}

/* ---- the session's side ---------------------------------------------- */

/* The client's frames wait (its next publish stays in its input), or go on. */
static void control_gate(struct session *s, int on)
{
	s->gated = on;
	if (!on && s->gate_held) {
		s->gate_held = 0;
		session_unhold(s, DIR_TO_BROKER);
	}
}

/* The vhost's limits in the worker's rules now, or NULL. */
static const struct rules_limits *control_limits(const struct session *s)
{
	const struct rules_vhost *v = s->w->rules ? rules_vhost(s->w->rules, s->vhost) : NULL;

	return v ? &v->limits : NULL;
}

int control_opened(struct session *s)
{
	const struct rules_limits *l = control_limits(s);

	if (control_paused(s->vhost))
		s->gated = 1;
	if (l == NULL)
		return 0;
	if (ratelimit_connection(s->vhost, l) != 0)
		return -1;
	if (l->connections_per_s > 0)
		limits_admitted(LIMITS_CONNECTION_RATE);
	s->rated = l->publish_bytes_per_s > 0;
	return 0;
}

void control_rules(struct session *s)
{
	const struct rules_limits *l;

	if (s->state != SESSION_OPEN)
		return;
	l = control_limits(s);
	s->rated = l && l->publish_bytes_per_s > 0;
	if (!s->rated && s->rate_bytes) {
		/* The pump may have stopped to ask: it goes on. */
		s->rate_bytes = 0;
		session_wake(s, &s->client);
	}
}

void control_rate(struct session *s)
{
	const struct rules_limits *l;
	long wait;

	if (s->rate_bytes == 0 || s->state != SESSION_OPEN)
		return;
	l = control_limits(s);
	wait = l ? ratelimit_publish(s->vhost, l, (size_t)s->rate_bytes) : 0;
	s->rate_bytes = 0;
	if (s->rate_held)
		return;
	if (wait <= 0) {
		/* The pump stopped to ask: it goes on. */
		session_wake(s, &s->client);
		return;
	}
	/* Its frames wait in its socket (TCP backpressure) until then. */
	if (session_later(s, wait) != 0) {
		session_wake(s, &s->client);
		return;
	}
	s->rate_held = 1;
	session_hold(s, DIR_TO_BROKER);
}

void control_later(struct session *s)
{
	if (s->rate_held) {
		s->rate_held = 0;
		session_unhold(s, DIR_TO_BROKER);
	}
}

/* Whether the broker has answered every publish of the session's channels
 * in confirm mode. With the proxy's own numbering (hooks that answer some
 * publishes themselves), what waits is what the confirm map holds. */
static int control_confirmed(const struct session *s)
{
	uint32_t i;

	for (i = 0; i < s->nchans; i++) {
		const struct channel *ch = s->chans[i];

		if (ch == NULL || !ch->confirm_mode)
			continue;
		/* A publish still with a hook has no entry in the map yet. */
		if (s->pipe.track ? confirmmap_pending(&ch->confirms) ||
					ch->confirms.next_client < ch->published
				  : ch->confirmed < ch->published)
			return 0;
	}
	return 1;
}

static void control_close(struct session *s)
{
	char text[256];

	snprintf(text, sizeof(text), "CONNECTION_FORCED - %s",
		 s->control_reason ? s->control_reason : CONTROL_DEFAULT_REASON);
	session_shut(s, REPLY_CONNECTION_FORCED, text);
	/* A client held (paused, rated, drained) may have stopped being
	 * read: its close-ok is behind what waits. */
	if (s->client.tr && s->state == SESSION_CLOSING)
		session_wake(s, &s->client);
}

void control_check(struct session *s)
{
	if (s->draining && s->state == SESSION_OPEN && control_confirmed(s)) {
		session_log(s, LOG_INFO, "drained: every publish answered");
		control_close(s);
	}
}

int control_timer(struct session *s)
{
	if (!s->draining)
		return 0;
	session_log(s, LOG_INFO, "drain's grace of %ld ms ran out",
		    worker_settings.drain_timeout_ms);
	control_close(s);
	return 1;
}

static void control_reason(struct session *s, const char *reason)
{
	free(s->control_reason);
	s->control_reason = reason && reason[0] ? strdup(reason) : NULL;
}

/* One session: called between its events (enter/leave keep its memory). */
/* One session: 1 if it was acted on (a closing one is not). */
static int control_act(struct session *s, enum control_action a, const char *reason)
{
	switch (a) {
	case CONTROL_GATE:
	case CONTROL_UNGATE:
		control_gate(s, a == CONTROL_GATE);
		return 1;
	case CONTROL_CLOSE:
	case CONTROL_DRAIN:
		break;
	}
	if (s->state >= SESSION_CLOSING)
		return 0;
	control_reason(s, reason);
	session_log(s, LOG_INFO, "%s by the operator",
		    a == CONTROL_CLOSE ? "closed" : "draining");
	/* Before it is open a client cannot be told: its sockets close. */
	if (s->state < SESSION_OPEN) {
		session_end(s);
		return 1;
	}
	if (a == CONTROL_CLOSE) {
		control_close(s);
		return 1;
	}
	if (s->draining)
		return 1;
	/* Nothing more from the client; what it published is answered. */
	s->draining = 1;
	session_hold(s, DIR_TO_BROKER);
	session_timer_set(s, worker_settings.drain_timeout_ms);
	control_check(s);
	return 1;
}

static int control_matches(const struct session *s, const struct control_target *t)
{
	if (s->state == SESSION_GONE)
		return 0;
	if (t->id && s->id != t->id)
		return 0;
	/* The vhost is named from connection.open on (a greeted or pooled
	 * client's before its broker leg is up: a pause reaches it too). */
	if (t->vhost && (s->vhost[0] == '\0' || strcmp(s->vhost, t->vhost) != 0))
		return 0;
	/* One connecting still may fail over to another address. */
	if (t->upstream >= 0 && (s->state < SESSION_OPEN || s->upstream.tr == NULL ||
				 s->upstream_at != t->upstream))
		return 0;
	return 1;
}

int control_apply(struct worker *w, const struct control_target *t, enum control_action a,
		  const char *reason)
{
	struct session *s;
	int n = 0;

	list_for_each_entry_safe (s, &w->sessions, link) {
		if (!control_matches(s, t))
			continue;
		session_enter(s);
		n += control_act(s, a, reason);
		session_leave(s);
	}
	return n;
}
