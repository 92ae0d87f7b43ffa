/* pool_chan: broker channels kept open from one client to the next. A
 * client that closes a channel on which it only published, declared,
 * bound or selected confirms leaves the broker channel open: the proxy
 * sends it a basic.qos(0) (the state a new channel has) and, once its qos-ok
 * shows the broker did everything sent before it without closing the
 * channel (and, in confirm mode, once every publish on it is confirmed),
 * keeps it for the next client, who gets its channel.open-ok at once. A
 * channel kept in confirm mode on which the client then only published,
 * every publish confirmed, is kept again without the qos(0): the confirms
 * already show the broker did all it was sent.
 * Channels are kept in two kinds, plain and in confirm mode: a client's
 * first method after channel.open decides which it is given (confirm.select
 * takes one in confirm mode and is answered here; anything else a plain
 * one, opened at the broker if none is kept), so a client that never
 * selected confirms never sits on a channel in confirm mode and can still
 * select transactions. The broker's publish sequence on a kept channel goes
 * on from client to client: the confirms it sends are renumbered into the
 * client's own sequence (tag minus the sequence at its confirm.select). A
 * channel that saw a consume, a get, a qos, a transaction, flow or a
 * recover is closed at the broker when its client closes it, as before. */
#include "../amqp/method.h"
#include "debug.h"
#include "pool.h"
#include "pool_int.h"
#include "transport.h"
#include "worker.h"

#include <event2/buffer.h>
#include <string.h>
#include <time.h>

/* Whether every publish on a channel in confirm mode is confirmed. */
static int pool_chan_settled(const struct pool_slot *sl)
{
	return !sl->confirm || (sl->floor == sl->bseq && sl->bits == 0);
}

/* Keep m for the next client (its kind's stack), or close it at the
 * broker when it cannot be kept. */
static void pool_chan_keep(struct pool_conn *c, uint16_t m)
{
	struct pool_slot *sl = &c->slots[m];
	int k = sl->confirm ? 1 : 0;

	sl->att = NULL;
	sl->waiter = NULL;
	if (sl->dirty || !pool_chan_settled(sl) || sl->closing || sl->content_left ||
	    c->nkept[k] >= POOL_KEPT_MAX || c->phase != CONN_READY) {
		pool_conn_orphan(c, m);
		return;
	}
	sl->state = SLOT_KEPT;
	sl->fresh = 0;
	sl->unsure = 0;
	sl->cselected = 0;
	sl->cbase = 0;
	c->kept[k][c->nkept[k]++] = m;
	STATS_INC(&c->pool->home->stats, pool_channels_kept);
	pool_conn_idle_check(c);
}

/* Take m off its kind's stack (the broker closed it, or it is handed out). */
static void pool_chan_unkeep(struct pool_conn *c, uint16_t m)
{
	int k = c->slots[m].confirm ? 1 : 0;
	unsigned i;

	for (i = 0; i < c->nkept[k]; i++) {
		if (c->kept[k][i] == m) {
			c->kept[k][i] = c->kept[k][--c->nkept[k]];
			return;
		}
	}
	ACEMQ_ASSERT(!"a kept slot is on its stack");
}

/* The kept slot of kind k (1: confirm mode) to hand out next, or 0. */
static uint16_t pool_chan_top(const struct pool_conn *c, int k)
{
	return c->nkept[k] ? c->kept[k][c->nkept[k] - 1] : 0;
}

/* Bind kept slot m to client a's channel n. */
static void pool_chan_bind(struct pool_conn *c, uint16_t m, struct pool_att *a, uint16_t n)
{
	struct pool_slot *sl = &c->slots[m];

	pool_chan_unkeep(c, m);
	sl->state = SLOT_OPEN;
	sl->att = a;
	sl->n = n;
	a->map[n] = m;
	c->idle_since = 0;
}

/* Client a opens channel n: a kept channel bound to it (its open-ok is the
 * caller's to write), or 0 when none is kept. */
uint16_t pool_chan_take(struct pool_conn *c, struct pool_att *a, uint16_t n)
{
	uint16_t m = pool_chan_top(c, 1);

	if (m == 0 && (m = pool_chan_top(c, 0)) == 0)
		return 0;
	pool_chan_bind(c, m, a, n);
	c->slots[m].fresh = 1;
	STATS_INC(&c->pool->home->stats, pool_channels_kept_used);
	return m;
}

/* The first method on a channel taken from the kept ones: the kind it
 * needs (confirm mode for confirm.select, plain for anything else). The
 * broker channel to send it on, which may be another than a->map[n]. */
uint16_t pool_chan_first(struct pool_conn *c, struct pool_att *a, uint16_t n, int confirm)
{
	uint16_t m = a->map[n], m2;
	struct pool_slot *sl = &c->slots[m];

	sl->fresh = 0;
	if (sl->confirm == confirm)
		return m;
	if ((m2 = pool_chan_top(c, confirm)) != 0) {
		/* One of the kind wanted is kept: swapped for it. */
		a->map[n] = 0;
		pool_chan_keep(c, m);
		pool_chan_bind(c, m2, a, n);
		return m2;
	}
	if (confirm)
		return m; /* a plain one: the confirm.select goes to the broker */
	/* In confirm mode, but the client did not select it: a plain channel
	 * opened at the broker (its open-ok not shown); the kept one stays
	 * kept. Without room for one, the client stays on it (the broker's
	 * confirms not shown to it). */
	m2 = (uint16_t)pool_conn_slot(c, a, n);
	if (m2 == 0)
		return m;
	c->slots[m2].hide_open = 1;
	method_write(pool_conn_out(c), m2, AMQP_CHANNEL_OPEN_METHOD,
		     &(amqp_channel_open_t){amqp_empty_bytes});
	a->map[n] = m2;
	sl->att = a; /* pool_chan_keep detaches it */
	pool_chan_keep(c, m);
	return m2;
}

/* What the client sends on broker channel m that bears on keeping it:
 * publishes counted (confirm mode), state a new channel would not have
 * marked. */
void pool_chan_sent(struct pool_slot *sl, amqp_method_number_t id)
{
	switch (id) {
	case AMQP_BASIC_PUBLISH_METHOD:
		if (sl->confirm)
			sl->bseq++;
		break;
	case AMQP_CHANNEL_CLOSE_METHOD:
	case AMQP_CHANNEL_CLOSE_OK_METHOD:
		break;
	case AMQP_CONFIRM_SELECT_METHOD: /* sent on: its select-ok may be out */
		sl->unsure = 1;
		break;
	default:
		if ((id >> 16) != 40 && (id >> 16) != 50)
			sl->dirty = 1;
		sl->unsure = 1;
		break;
	}
}

/* The client's confirm.select (nowait when it asked for no answer) on m.
 * 1 when answered here (the channel is in confirm mode at the broker
 * already), 0 to send it on. */
int pool_chan_select(struct pool_conn *c, uint16_t m, int nowait)
{
	struct pool_slot *sl = &c->slots[m];

	if (sl->confirm) {
		if (!sl->cselected)
			sl->cbase = sl->bseq; /* a second select numbers nothing anew */
		sl->cselected = 1;
		if (!nowait)
			method_write(sl->att->down, sl->n, AMQP_CONFIRM_SELECT_OK_METHOD,
				     &(amqp_confirm_select_ok_t){0});
		return 1;
	}
	sl->cselected = 1;
	sl->confirm = 1;
	sl->bseq = sl->floor = sl->bits = sl->cbase = 0;
	return 0;
}

/* The client closes channel m (it waits for the close-ok: client) or is
 * gone (the slot detached from it): 1 when the channel is to be kept (a
 * qos(0) sent, what it answers decides), 0 when the caller closes it. */
int pool_chan_retire(struct pool_conn *c, uint16_t m, int client)
{
	struct pool_slot *sl = &c->slots[m];

	if (sl->probe) {
		if (!client) {
			sl->att = NULL;
			sl->state = SLOT_PROBE;
		}
		return 1;
	}
	if (sl->fresh) {
		/* Nothing was sent on it: kept as it is. */
		if (!client && sl->att && sl->n < sl->att->nmap && sl->att->map[sl->n] == m) {
			sl->att->map[sl->n] = 0;
			sl->att = NULL;
		}
		pool_chan_probed(c, m);
		return 1;
	}
	if (sl->state != SLOT_OPEN || sl->dirty || sl->closing || sl->content_left ||
	    sl->exclusive_pending || sl->hide_open || c->phase != CONN_READY)
		return 0;
	if (!sl->unsure && sl->confirm && pool_chan_settled(sl)) {
		/* Kept in confirm mode, and since then only publishes, each
		 * confirmed: the broker did all of them, nothing sent can still
		 * close it. Kept without asking. */
		if (!client && sl->att && sl->n < sl->att->nmap && sl->att->map[sl->n] == m) {
			sl->att->map[sl->n] = 0;
			sl->att = NULL;
		}
		STATS_INC(&c->pool->home->stats, pool_channels_kept_unprobed);
		pool_chan_probed(c, m);
		return 1;
	}
	method_write(pool_conn_out(c), m, AMQP_BASIC_QOS_METHOD, &(amqp_basic_qos_t){0, 0, 0});
	c->last_out = time(NULL);
	sl->probe = 1;
	if (!client) {
		if (sl->att && sl->n < sl->att->nmap && sl->att->map[sl->n] == m)
			sl->att->map[sl->n] = 0;
		sl->att = NULL;
		sl->state = SLOT_PROBE;
	}
	return 1;
}

/* The broker answered the qos(0) on m: everything before it was done. A
 * client waiting for its close-ok gets it; the channel is kept. */
void pool_chan_probed(struct pool_conn *c, uint16_t m)
{
	struct pool_slot *sl = &c->slots[m];
	struct pool_att *a = sl->att;

	sl->probe = 0;
	if (a) {
		if (sl->n < a->nmap && a->map[sl->n] == m)
			a->map[sl->n] = 0;
		method_write(a->down, sl->n, AMQP_CHANNEL_CLOSE_OK_METHOD,
			     &(amqp_channel_close_ok_t){0});
		pool_feed(a);
	}
	pool_chan_keep(c, m);
}

/* A confirm (basic.ack or nack) the broker sent on m: its tag is counted
 * against the publishes and renumbered into the client's sequence. 1 to
 * pass it on (p: the frame, rewritten in place), 0 to drop it. */
int pool_chan_confirm(struct pool_slot *sl, uint8_t *p, size_t len)
{
	uint64_t tag = 0, d;
	int multiple, i;

	if (!sl->confirm || len < 7 + 4 + 9 + 1)
		return 1; /* not the proxy's to count */
	for (i = 0; i < 8; i++)
		tag = tag << 8 | p[11 + i];
	multiple = p[19] & 1;
	if (tag > sl->floor) {
		d = tag - sl->floor;
		if (multiple) {
			sl->bits = d >= 64 ? 0 : sl->bits >> d;
			sl->floor = tag;
		} else if (d <= 64) {
			sl->bits |= 1ull << (d - 1);
		} else {
			sl->dirty = 1; /* too far out of order to count: not kept */
		}
		while (sl->bits & 1) {
			sl->bits >>= 1;
			sl->floor++;
		}
	}
	if (sl->att == NULL || !sl->cselected || tag <= sl->cbase)
		return 0;
	tag -= sl->cbase;
	for (i = 7; i >= 0; i--, tag >>= 8)
		p[11 + i] = (uint8_t)tag;
	return 1;
}

/* The broker closed kept or probed channel m: answered and freed. */
void pool_chan_closed(struct pool_conn *c, uint16_t m)
{
	if (c->slots[m].state == SLOT_KEPT)
		pool_chan_unkeep(c, m);
	method_write(pool_conn_out(c), m, AMQP_CHANNEL_CLOSE_OK_METHOD,
		     &(amqp_channel_close_ok_t){0});
	c->last_out = time(NULL);
	pool_conn_free_slot(c, m);
}
