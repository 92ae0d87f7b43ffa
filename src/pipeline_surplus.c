/* pipeline_surplus: the pipeline's side of surplus.h. A delivery for a
 * consumer the broker sends more than its prefetch is kept while the
 * client has its prefetch's worth; each settle of the client (as soon as a
 * hook sees it, before it goes upstream) lets the next one go. Settles are
 * seen inside walks of a channel's tags, so they only mark the channel;
 * pipeline_surplus_flow sends what may go once the walk is over. */
#include "pipeline_int.h"

#include "surplus.h"
#include "worker.h"

#include <event2/buffer.h>
#include <event2/event.h>

/* How often kept deliveries are looked at (a hook renews their claims
 * when a third of a lease has gone: a second's lease is the shortest). */
#define PIPELINE_SURPLUS_TICK_MS 250

static void pipeline_surplus_drop(void *m)
{
	pipe_msg_free(m);
}

/* The consumer a delivery is for, when ch keeps deliveries for any. */
static const amqp_bytes_t *pipeline_surplus_consumer(struct channel *ch, struct pipe_msg *m)
{
	if (ch->surplus == NULL || m->method_id != AMQP_BASIC_DELIVER_METHOD || m->no_ack)
		return NULL;
	return &((amqp_basic_deliver_t *)m->method)->consumer_tag;
}

/* How long a kept delivery has waited since it arrived or a hook renewed
 * its claim. */
static uint64_t pipeline_surplus_waited_ms(const struct pipe_msg *m, uint64_t now)
{
	uint64_t since = m->renewed_us > m->started_us ? m->renewed_us : m->started_us;

	return now > since ? (now - since) / 1000 : 0;
}

/* What ch keeps for consumers with room goes to the client; the hooks hear
 * how long each waited. */
static void pipeline_surplus_flow_channel(struct pipeline *p, struct channel *ch)
{
	struct pipe_msg *m;
	uint64_t tag, now = 0;
	int i;

	while (ch->surplus && (m = surplus_next(ch->surplus, &tag)) != NULL) {
		tagmap_unhold(&ch->tags, tag);
		if (ch->proxy_closing) {
			pipe_msg_free(m); /* the close gives it back */
			continue;
		}
		if (now == 0)
			now = pipeline_now_us();
		for (i = 0; i < p->nhooks; i++)
			if (p->hooks[i]->surplus_out)
				p->hooks[i]->surplus_out(p->hook_state[i], p, ch, tag,
							 pipeline_surplus_waited_ms(m, now));
		if (pipeline_deliver_now(p, ch, m) != 0)
			pipeline_close(p, 541, "INTERNAL_ERROR - out of memory");
	}
}

/* ---- kept deliveries, looked at while they wait ---- */

struct pipeline_surplus_look {
	struct pipeline *p;
	struct channel *ch;
	uint64_t now;
};

static void pipeline_surplus_look_one(void *arg, void *msg, uint64_t broker_tag)
{
	struct pipeline_surplus_look *l = arg;
	struct pipeline *p = l->p;
	struct pipe_msg *m = msg;
	uint64_t waited = pipeline_surplus_waited_ms(m, l->now);
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->surplus_waiting &&
		    p->hooks[i]->surplus_waiting(p->hook_state[i], p, l->ch, broker_tag,
						 waited))
			m->renewed_us = l->now;
}

static void pipeline_surplus_tick_in(struct pipeline *p, void *arg)
{
	struct pipeline_surplus_look l = {p, NULL, pipeline_now_us()};
	struct list *n, *next;
	struct surplus *s;

	(void)arg;
	for (n = p->surplus_kept.next; n != &p->surplus_kept; n = next) {
		next = n->next;
		s = list_entry(n, struct surplus, kept);
		l.ch = pipeline_channel(p, s->channel);
		if (l.ch == NULL || l.ch->surplus != s || surplus_waiting(s) == 0) {
			list_del(&s->kept); /* keeps nothing now: linked again when it does */
			continue;
		}
		surplus_each(s, pipeline_surplus_look_one, &l);
	}
	if (list_empty(&p->surplus_kept))
		evtimer_del(p->surplus_timer);
}

static void pipeline_surplus_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	pipeline_call(arg, pipeline_surplus_tick_in, NULL);
}

/* s keeps a delivery: looked at while it keeps any. */
static void pipeline_surplus_timed(struct pipeline *p, struct surplus *s)
{
	struct timeval tv = {0, PIPELINE_SURPLUS_TICK_MS * 1000};

	if (list_linked(&s->kept))
		return;
	if (p->surplus_timer == NULL &&
	    (p->surplus_timer =
		 event_new(p->w->base, -1, EV_PERSIST, pipeline_surplus_tick, p)) == NULL)
		return; /* without memory for it, claims are renewed only as they go */
	list_add_tail(&s->kept, &p->surplus_kept);
	if (!evtimer_pending(p->surplus_timer, NULL))
		evtimer_add(p->surplus_timer, &tv);
}

void pipeline_surplus_fini(struct pipeline *p)
{
	while (!list_empty(&p->surplus_kept))
		list_del(p->surplus_kept.next);
	if (p->surplus_timer)
		event_free(p->surplus_timer);
	p->surplus_timer = NULL;
}

int pipeline_surplus_admit(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	const amqp_bytes_t *c = pipeline_surplus_consumer(ch, m);
	size_t size;

	if (c == NULL)
		return 0;
	size = evbuffer_get_length(m->raw) + (m->body ? evbuffer_get_length(m->body) : 0);
	switch (surplus_admit(ch->surplus, c->bytes, c->len, m->broker_tag, m, size, 0)) {
	case SURPLUS_KEPT:
		/* Kept (the channel frees it if it goes first); without the
		 * memory to note it held, the session closes. */
		STATS_INC(&p->w->stats, surplus_kept);
		pipeline_surplus_timed(p, ch->surplus);
		return tagmap_hold(&ch->tags, m->broker_tag) == 0 ? 1 : -1;
	case SURPLUS_FULL:
		/* The channel keeps enough bytes: what was kept for the
		 * consumer goes, and this one after it. */
		STATS_INC(&p->w->stats, surplus_past);
		pipeline_surplus_flow_channel(p, ch);
		(void)surplus_admit(ch->surplus, c->bytes, c->len, m->broker_tag, m, size, 1);
		return 0;
	default:
		return 0;
	}
}

void pipeline_surplus_stream(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	const amqp_bytes_t *c = pipeline_surplus_consumer(ch, m);

	if (c == NULL)
		return;
	/* A stream cannot wait: it goes now, past the client's prefetch if it
	 * must, after what was kept for its consumer. */
	surplus_drain(ch->surplus, c->bytes, c->len);
	pipeline_surplus_flow_channel(p, ch);
	(void)surplus_admit(ch->surplus, c->bytes, c->len, m->broker_tag, m, 0, 1);
}

void pipeline_surplus_flow(struct pipeline *p)
{
	struct surplus *s;
	struct channel *ch;

	while ((s = list_first_entry(&p->surplus_due, struct surplus, due)) != NULL) {
		list_del(&s->due);
		ch = pipeline_channel(p, s->channel);
		if (ch && ch->surplus == s)
			pipeline_surplus_flow_channel(p, ch);
	}
}

int pipeline_surplus_ahead(struct pipeline *p, const char *queue, uint16_t prefetch)
{
	int i, n, most = 0;

	for (i = 0; queue && i < p->nhooks; i++)
		if (p->hooks[i]->asks_ahead &&
		    (n = p->hooks[i]->asks_ahead(p->hook_state[i], p, queue, prefetch)) > most)
			most = n;
	return most;
}

void pipeline_surplus_seen(struct pipeline *p, struct channel *ch, uint64_t broker_tag)
{
	if (ch->surplus && surplus_settled(ch->surplus, broker_tag) &&
	    !list_linked(&ch->surplus->due))
		list_add_tail(&ch->surplus->due, &p->surplus_due);
}

void pipeline_surplus_cancel(struct pipeline *p, struct channel *ch, const void *tag,
			     size_t len)
{
	if (ch->surplus == NULL)
		return;
	surplus_cancel(ch->surplus, tag, len);
	pipeline_surplus_flow_channel(p, ch);
}

void pipeline_surplus_recover(struct pipeline *p, struct channel *ch)
{
	(void)p;
	surplus_recover(ch->surplus, pipeline_surplus_drop);
}
