/* pool_conn: one pooled broker connection: dialled with a client's
 * credentials, its handshake done by the proxy (the broker's
 * connection.start kept to show later clients), its heartbeats kept by the
 * proxy, and the broker's frames handed to the client owning each channel,
 * renumbered; connection-level frames fanned out (blocked/unblocked) or
 * ending every client on it (close). */
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "debug.h"
#include "dial.h"
#include "log.h"
#include "pool.h"
#include "pool_int.h"
#include "session.h"
#include "tls.h"
#include "transport.h"
#include "worker.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_HEARTBEAT_S 60 /* asked of the broker when it proposes none */

static const uint8_t pool_conn_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
static uint64_t pool_conn_ids; /* atomic */

struct transport *(*pool_connect)(struct event_base *base, const struct sockaddr *sa,
				  int salen);

static void pool_conn_read(struct transport *tr, void *arg);
static void pool_conn_drained(struct transport *tr, void *arg);
static void pool_conn_event(struct transport *tr, int what, int err, void *arg);
static void pool_conn_tick(evutil_socket_t fd, short what, void *arg);
static void pool_conn_free(struct pool_conn *c, uint16_t code, const char *text);

#define pool_conn_log(c, level, fmt, ...)                                              \
	log_msg(level, "pool=%llu vhost=%s user=%s " fmt, (unsigned long long)(c)->id, \
		(c)->pool->vhost, (c)->pool->user, ##__VA_ARGS__)

struct evbuffer *pool_conn_out(struct pool_conn *c)
{
	return transport_output(c->tr);
}

/* Room for one more broker channel. */
static int pool_conn_room_new(const struct pool_conn *c)
{
	return c->used < (unsigned)c->pool->cfg.max_channels && c->used + 1u < c->nslots;
}

/* Room for a client's channel: a kept one, or a new one. */
int pool_conn_room(const struct pool_conn *c)
{
	return pool_conn_kept(c) > 0 || pool_conn_room_new(c);
}

/* No client and no channel but kept ones: c is idle from now. */
void pool_conn_idle_check(struct pool_conn *c)
{
	if (c->natts == 0 && pool_conn_busy(c) == 0 && c->idle_since == 0)
		c->idle_since = time(NULL);
}

/* Connect to the pool's next broker address not tried yet. 0 or -1. */
static int pool_conn_dial(struct pool_conn *c)
{
	struct transport *(*connect)(struct event_base *, const struct sockaddr *, int) =
	    pool_connect              ? pool_connect
	    : worker_settings.connect ? worker_settings.connect
				      : transport_connect;
	struct pool *p = c->pool;
	const struct upstream_node *n;
	int i;

	while ((i = upstream_pick(p->upstreams.n ? &p->upstreams : NULL, c->tried)) >= 0) {
		n = upstream_node(i);
		c->tried |= 1u << i;
		c->at = i;
		c->tr = connect(p->home->base, (const struct sockaddr *)&n->sa, n->salen);
		if (c->tr && tls_upstream() && dial_tls(c->tr, n) != 0) {
			transport_free(c->tr);
			c->tr = NULL;
			errno = EPROTO;
		}
		if (c->tr) {
			transport_setcb(c->tr, pool_conn_read, pool_conn_drained,
					pool_conn_event, c);
			transport_set_read_high(c->tr, (size_t)worker_settings.buffer_limit);
			transport_set_write_low(c->tr,
						(size_t)worker_settings.buffer_limit / 2);
			evbuffer_add(transport_output(c->tr), pool_conn_header,
				     sizeof(pool_conn_header));
			c->phase = CONN_CONNECTING;
			return 0;
		}
		pool_conn_log(c, LOG_WARNING, "cannot connect to broker %s: %s", n->name,
			      strerror(errno));
		STATS_INC(&p->home->stats, upstream_failures);
		upstream_failed(i);
	}
	return -1;
}

/* A new connection; auth, when given, opens it with its credentials. Over
 * max_connections: NULL when check is 0, else a connection that only
 * checks the credentials (closed once they pass). */
struct pool_conn *pool_conn_new(struct pool *p, struct pool_att *auth, int check)
{
	struct pool_conn *c;
	int counted;

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	counted = pool_conns_take(p);
	if (!counted && !check) {
		free(c);
		return NULL;
	}
	c->id = __atomic_add_fetch(&pool_conn_ids, 1, __ATOMIC_RELAXED);
	c->pool = p;
	c->counted = counted;
	c->check_only = !counted;
	c->at = -1;
	c->frame_max = 131072;
	list_init(&c->atts);
	list_init(&c->exclusive);
	list_add_tail(&c->node, &p->conns);
	c->timer = event_new(p->home->base, -1, EV_PERSIST, pool_conn_tick, c);
	if (c->timer == NULL || pool_conn_dial(c) != 0) {
		c->auth = NULL;
		pool_conn_free(c, 0, NULL);
		return NULL;
	}
	{
		struct timeval tv = {1, 0};

		evtimer_add(c->timer, &tv);
	}
	if (auth) {
		c->auth = auth;
		auth->conn = c;
	}
	return c;
}

/* Send the client's start-ok as this connection's. */
static void pool_conn_send_creds(struct pool_conn *c)
{
	struct pool_att *a = c->auth;

	size_t len = a->startok ? evbuffer_get_length(a->startok) : 0;
	uint8_t *p = len ? evbuffer_pullup(a->startok, -1) : NULL;

	memcpy(c->hash, a->hash, sizeof(c->hash));
	if (p)
		evbuffer_add(transport_output(c->tr), p, len); /* kept: it may open another */
	c->phase = CONN_TUNE;
}

void pool_conn_give_creds(struct pool_conn *c, struct pool_att *a)
{
	c->auth = a;
	a->conn = c;
	if (c->phase == CONN_CREDS)
		pool_conn_send_creds(c);
}

/* ---- channels ------------------------------------------------------- */

int pool_conn_slot(struct pool_conn *c, struct pool_att *a, uint16_t n)
{
	unsigned i, m;

	if (!pool_conn_room_new(c) && a != NULL)
		return 0;
	for (i = 1; i < c->nslots; i++) {
		m = 1 + (c->hint + i - 1) % (c->nslots - 1u);
		if (c->slots[m].state == SLOT_FREE) {
			memset(&c->slots[m], 0, sizeof(c->slots[m]));
			c->slots[m].state = SLOT_OPENING;
			c->slots[m].att = a;
			c->slots[m].n = n;
			c->used++;
			c->hint = (uint16_t)m;
			c->idle_since = 0;
			pool_channels_add(1);
			return (int)m;
		}
	}
	return 0;
}

void pool_conn_free_slot(struct pool_conn *c, uint16_t m)
{
	struct pool_slot *sl = &c->slots[m];

	if (sl->state == SLOT_FREE)
		return;
	if (sl->att && sl->n < sl->att->nmap && sl->att->map[sl->n] == m)
		sl->att->map[sl->n] = 0;
	if (sl->waiter && sl->waiter->closing_chans > 0 && --sl->waiter->closing_chans == 0)
		pool_mux_closed(sl->waiter);
	memset(sl, 0, sizeof(*sl));
	ACEMQ_ASSERT(c->used > 0);
	c->used--;
	pool_channels_add(-1);
	pool_conn_idle_check(c);
	if (!list_empty(&c->pool->waiting))
		pool_retry_waiting(c->pool);
}

/* Freed once both sides' closes are answered (POOL_CLOSE_*). */
void pool_conn_settle(struct pool_conn *c, uint16_t m)
{
	uint8_t k = c->slots[m].closing;

	if ((k & (POOL_CLOSE_SENT | POOL_CLOSE_GOT)) && !(k & POOL_CLOSE_GOT) &&
	    (!(k & POOL_CLOSE_SENT) || (k & POOL_CLOSE_DONE)))
		pool_conn_free_slot(c, m);
}

/* Its client is gone or gave it up: closed at the broker (the broker's
 * own close answered), freed once the broker says so. */
void pool_conn_orphan(struct pool_conn *c, uint16_t m)
{
	struct pool_slot *sl = &c->slots[m];
	struct evbuffer *out = transport_output(c->tr);

	if (sl->att && sl->n < sl->att->nmap && sl->att->map[sl->n] == m)
		sl->att->map[sl->n] = 0;
	sl->att = NULL;
	sl->state = SLOT_ORPHAN;
	if (sl->closing & POOL_CLOSE_GOT) {
		/* The broker closed it: its close-ok ends it there (a
		 * channel.close after it would name a channel the broker no
		 * longer has, which it answers by closing the connection). */
		method_write(out, m, AMQP_CHANNEL_CLOSE_OK_METHOD,
			     &(amqp_channel_close_ok_t){0});
		sl->closing &= (uint8_t)~POOL_CLOSE_GOT;
		c->last_out = time(NULL);
		if (!(sl->closing & POOL_CLOSE_SENT)) {
			pool_conn_free_slot(c, m);
			return;
		}
	}
	if (!(sl->closing & POOL_CLOSE_SENT)) {
		method_write_channel_close(out, m, 200, "client gone", 0, 0);
		sl->closing |= POOL_CLOSE_SENT;
	}
	c->last_out = time(NULL);
	pool_conn_settle(c, m);
}

/* ---- frames from the broker ------------------------------------------ */

/* Every client on c: the frame at the front of in (len bytes), copied. */
static void pool_conn_fan_out(struct pool_conn *c, struct evbuffer *in, size_t len,
			      int only_blocked_capable)
{
	struct pool_att *a;
	uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)len);

	if (p == NULL)
		return;
	list_for_each_entry (a, &c->atts, node) {
		if (a->phase != ATT_OPEN || (only_blocked_capable && !a->caps_blocked))
			continue;
		evbuffer_add(a->down, p, len);
		pool_feed(a);
	}
}

/* The handshake's frames. 0, or -1 when c is gone. */
static int pool_conn_handshake(struct pool_conn *c, struct evbuffer *in,
			       const struct frame_info *fi)
{
	struct pool *p = c->pool;
	size_t len = frame_scan_wire_len(fi);
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);
	struct evbuffer *out = transport_output(c->tr);
	void *decoded = NULL;
	struct pool_att *a;

	if (fi->type != FRAME_METHOD) {
		evbuffer_drain(in, len);
		return 0;
	}
	if (id == AMQP_CONNECTION_CLOSE_METHOD) {
		uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)len);

		pool_conn_log(c, LOG_WARNING, "the broker refused the connection");
		if (frame)
			pool_conn_refused(c, frame, len);
		method_write(out, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
			     &(amqp_connection_close_ok_t){0});
		evbuffer_drain(in, len);
		pool_conn_free(c, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - the broker refused the connection");
		return -1;
	}
	if (c->phase == CONN_START && id == AMQP_CONNECTION_START_METHOD) {
		c->start = malloc(len);
		if (c->start == NULL || evbuffer_remove(in, c->start, len) != (int)len) {
			pool_conn_free(c, 541, "INTERNAL_ERROR - out of memory");
			return -1;
		}
		c->start_len = len;
		c->phase = CONN_CREDS;
		list_for_each_entry_safe (a, &p->waiting, node)
			pool_show_start(a, c);
		if (c->auth)
			pool_conn_send_creds(c);
		return 0;
	}
	if (c->phase == CONN_TUNE && id == AMQP_CONNECTION_TUNE_METHOD &&
	    method_decode_evbuffer(in, fi->size, &p->home->pool, &id, &decoded) == 0) {
		amqp_connection_tune_t *t = decoded;
		amqp_connection_tune_ok_t ok;
		amqp_connection_open_t o = {amqp_cstring_bytes(p->vhost), amqp_empty_bytes, 0};
		unsigned chmax = t->channel_max ? t->channel_max : 65535;

		if (chmax > (unsigned)p->cfg.max_channels)
			chmax = (unsigned)p->cfg.max_channels;
		c->nslots = (uint16_t)(chmax + 1);
		c->slots = calloc(c->nslots, sizeof(*c->slots));
		c->frame_max = t->frame_max ? t->frame_max : 131072;
		c->heartbeat = t->heartbeat ? t->heartbeat : POOL_HEARTBEAT_S;
		ok.channel_max = (uint16_t)chmax;
		ok.frame_max = c->frame_max;
		ok.heartbeat = c->heartbeat;
		evbuffer_drain(in, len);
		empty_amqp_pool(&p->home->pool);
		if (c->slots == NULL ||
		    method_write(out, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &ok) != 0 ||
		    method_write(out, 0, AMQP_CONNECTION_OPEN_METHOD, &o) != 0) {
			pool_conn_free(c, 541, "INTERNAL_ERROR - out of memory");
			return -1;
		}
		transport_set_read_timeout(c->tr, 2000L * c->heartbeat);
		c->phase = CONN_OPENING;
		return 0;
	}
	if (c->phase == CONN_OPENING && id == AMQP_CONNECTION_OPEN_OK_METHOD) {
		evbuffer_drain(in, len);
		c->phase = CONN_READY;
		c->idle_since = time(NULL);
		upstream_ok(c->at);
		pool_conn_log(c, LOG_INFO, "broker connection open to %s channel_max=%u",
			      upstream_node(c->at)->name, c->nslots - 1u);
		pool_conn_opened(c);
		return 0;
	}
	empty_amqp_pool(&p->home->pool);
	pool_conn_log(c, LOG_WARNING, "broker sent method %u.%u during the handshake",
		      fi->class_id, fi->method_id);
	pool_conn_free(c, REPLY_CONNECTION_FORCED,
		       "CONNECTION_FORCED - the broker's handshake went wrong");
	return -1;
}

/* A connection-level frame of an open connection. 0, or -1 when c is gone. */
static int pool_conn_level(struct pool_conn *c, struct evbuffer *in,
			   const struct frame_info *fi)
{
	size_t len = frame_scan_wire_len(fi);
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);

	if (fi->type == FRAME_METHOD && id == AMQP_CONNECTION_CLOSE_METHOD) {
		struct pool_att *a;
		uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)len);

		pool_conn_log(c, LOG_WARNING, "the broker closed the connection");
		/* Each client hears the broker's reason. */
		list_for_each_entry (a, &c->atts, node) {
			if (frame && a->phase != ATT_CLOSING) {
				evbuffer_add(a->down, frame, len);
				a->phase = ATT_CLOSING;
				pool_feed(a);
			}
		}
		method_write(transport_output(c->tr), 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
			     &(amqp_connection_close_ok_t){0});
		evbuffer_drain(in, len);
		pool_conn_free(c, 0, NULL);
		return -1;
	}
	if (fi->type == FRAME_METHOD &&
	    (id == AMQP_CONNECTION_BLOCKED_METHOD || id == AMQP_CONNECTION_UNBLOCKED_METHOD))
		pool_conn_fan_out(c, in, len, 1);
	else if (c->phase == CONN_CLOSING && id == AMQP_CONNECTION_CLOSE_OK_METHOD) {
		evbuffer_drain(in, len);
		pool_conn_free(c, 0, NULL);
		return -1;
	}
	evbuffer_drain(in, len);
	return 0;
}

/* queue.declare-ok of an exclusive declare: the queue is its client's. */
static void pool_conn_exclusive(struct pool_conn *c, struct pool_slot *sl, struct evbuffer *in,
				const struct frame_info *fi)
{
	amqp_method_number_t id;
	void *decoded;
	struct pool_queue *q;
	amqp_queue_declare_ok_t *ok;

	sl->exclusive_pending = 0;
	if (method_decode_evbuffer(in, fi->size, &c->pool->home->pool, &id, &decoded) != 0) {
		empty_amqp_pool(&c->pool->home->pool);
		return;
	}
	ok = decoded;
	if (ok->queue.len < sizeof(q->name) && (q = calloc(1, sizeof(*q))) != NULL) {
		memcpy(q->name, ok->queue.bytes, ok->queue.len);
		q->owner = sl->att;
		list_add(&q->node, &sl->att->exclusive);
		list_add(&q->conn_node, &c->exclusive);
	}
	empty_amqp_pool(&c->pool->home->pool);
}

/* A frame on channel m, for its client (renumbered) or the proxy. */
static void pool_conn_channel(struct pool_conn *c, struct evbuffer *in,
			      const struct frame_info *fi)
{
	size_t len = frame_scan_wire_len(fi);
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);
	struct pool_slot *sl = fi->channel < c->nslots ? &c->slots[fi->channel] : NULL;
	int method = fi->type == FRAME_METHOD, freed = 0;
	struct pool_att *a;
	uint8_t *p;

	if (sl == NULL || sl->state == SLOT_FREE) {
		evbuffer_drain(in, len);
		return;
	}
	if (method && (id == AMQP_BASIC_ACK_METHOD || id == AMQP_BASIC_NACK_METHOD) &&
	    ((p = evbuffer_pullup(in, (ev_ssize_t)len)) == NULL ||
	     !pool_chan_confirm(sl, p, len))) {
		/* Counted, and not the client's (or no client's). */
		evbuffer_drain(in, len);
		return;
	}
	if (sl->state == SLOT_KEPT || sl->state == SLOT_PROBE) {
		if (method && id == AMQP_CHANNEL_CLOSE_METHOD) {
			evbuffer_drain(in, len);
			pool_chan_closed(c, fi->channel);
			return;
		}
		evbuffer_drain(in, len);
		if (method && id == AMQP_BASIC_QOS_OK_METHOD && sl->probe)
			pool_chan_probed(c, fi->channel);
		return;
	}
	if (sl->state == SLOT_ORPHAN) {
		if (method && id == AMQP_CHANNEL_CLOSE_METHOD) {
			method_write(transport_output(c->tr), fi->channel,
				     AMQP_CHANNEL_CLOSE_OK_METHOD,
				     &(amqp_channel_close_ok_t){0});
		} else if (method && id == AMQP_CHANNEL_CLOSE_OK_METHOD) {
			sl->closing |= POOL_CLOSE_DONE;
		}
		evbuffer_drain(in, len);
		pool_conn_settle(c, fi->channel);
		return;
	}
	a = sl->att;
	if (method) {
		if (id == AMQP_CHANNEL_OPEN_OK_METHOD && sl->hide_open) {
			/* Opened by the proxy for a client that has its open-ok. */
			sl->state = SLOT_OPEN;
			sl->hide_open = 0;
			evbuffer_drain(in, len);
			return;
		}
		if (id == AMQP_BASIC_QOS_OK_METHOD && sl->probe) {
			evbuffer_drain(in, len);
			pool_chan_probed(c, fi->channel);
			return;
		}
		if (id == AMQP_CHANNEL_OPEN_OK_METHOD)
			sl->state = SLOT_OPEN;
		else if (id == AMQP_QUEUE_DECLARE_OK_METHOD && sl->exclusive_pending)
			pool_conn_exclusive(c, sl, in, fi);
		else if (id == AMQP_CHANNEL_CLOSE_METHOD) {
			sl->closing |= POOL_CLOSE_GOT;
			sl->probe = 0; /* its qos-ok will not come */
		} else if (id == AMQP_CHANNEL_CLOSE_OK_METHOD)
			freed = 1;
	}
	p = evbuffer_pullup(in, 3);
	if (p == NULL) {
		evbuffer_drain(in, len);
		return;
	}
	p[1] = (uint8_t)(sl->n >> 8);
	p[2] = (uint8_t)sl->n;
	evbuffer_remove_buffer(in, a->down, len);
	pool_feed(a);
	if (freed) {
		sl->closing |= POOL_CLOSE_DONE;
		pool_conn_settle(c, fi->channel);
	}
}

static void pool_conn_read(struct transport *tr, void *arg)
{
	struct pool_conn *c = arg;
	struct evbuffer *in = transport_input(tr);
	struct frame_info fi;
	uint32_t max = c->phase == CONN_READY ? c->frame_max : 131072;
	int rc = FRAME_SCAN_AGAIN;

	while (c->nfull == 0 && (rc = frame_scan_evbuffer(in, 0, max > 8 ? max - 8 : max,
							  &fi)) == FRAME_SCAN_OK) {
		if (c->phase < CONN_READY) {
			if (pool_conn_handshake(c, in, &fi) != 0)
				return;
			max = c->phase == CONN_READY ? c->frame_max : 131072;
		} else if (fi.type == FRAME_HEARTBEAT) {
			evbuffer_drain(in, frame_scan_wire_len(&fi));
		} else if (fi.channel == 0) {
			if (pool_conn_level(c, in, &fi) != 0)
				return;
		} else {
			pool_conn_channel(c, in, &fi);
		}
	}
	if (c->nfull == 0 && rc == FRAME_SCAN_ERROR) {
		pool_conn_log(c, LOG_WARNING, "broker sent a bad frame: %s", fi.error);
		STATS_INC(&c->pool->home->stats, upstream_failures);
		pool_conn_free(c, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - broker sent a bad frame");
		return;
	}
	if (c->nfull)
		transport_read_disable(tr);
	transport_input_consumed(tr);
}

/* Clients' input has room again, or the broker's output drained: move on. */
void pool_conn_kick(struct pool_conn *c)
{
	if (c->tr == NULL || c->phase != CONN_READY)
		return;
	if (c->nfull == 0) {
		transport_read_enable(c->tr);
		if (evbuffer_get_length(transport_input(c->tr)))
			pool_conn_read(c->tr, c);
	}
}

/* The broker took what was queued: clients' frames that waited for room
 * move on. */
static void pool_conn_drained(struct transport *tr, void *arg)
{
	struct pool_conn *c = arg;
	struct pool_att *a;

	list_for_each_entry_safe (a, &c->atts, node)
		if (evbuffer_get_length(a->up))
			pool_mux_output(a);
}

static void pool_conn_event(struct transport *tr, int what, int err, void *arg)
{
	struct pool_conn *c = arg;

	if (what & TRANSPORT_CONNECTED) {
		session_nodelay(transport_fd(tr)); /* many clients' small frames */
		c->phase = CONN_START;
		transport_read_enable(tr);
		return;
	}
	if (c->phase == CONN_CONNECTING || (c->phase == CONN_START && !c->start)) {
		/* Before the broker spoke: the next address. */
		upstream_failed(c->at);
		transport_free(c->tr);
		c->tr = NULL;
		if (pool_conn_dial(c) == 0)
			return;
	}
	if (c->phase == CONN_TUNE && (what & (TRANSPORT_EOF | TRANSPORT_ERROR))) {
		/* Closed right after the start-ok: how a broker refuses
		 * credentials to a client that did not announce
		 * authentication_failure_close. */
		pool_conn_log(c, LOG_WARNING, "the broker refused the credentials");
		pool_conn_free(
		    c, REPLY_ACCESS_REFUSED,
		    "ACCESS_REFUSED - Login was refused using authentication mechanism "
		    "PLAIN. For details see the broker logfile.");
		return;
	}
	if (c->phase != CONN_CLOSING) {
		pool_conn_log(c, LOG_WARNING, "broker connection %s",
			      what & TRANSPORT_TIMEOUT ? "timed out (heartbeats)"
			      : what & TRANSPORT_EOF   ? "closed by the broker"
						       : transport_error(tr, err));
		STATS_INC(&c->pool->home->stats, upstream_failures);
	}
	pool_conn_free(c, REPLY_CONNECTION_FORCED,
		       "CONNECTION_FORCED - broker connection lost");
}

static void pool_conn_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pool_conn *c = arg;
	time_t now = time(NULL);
	struct pool_att *a;
	static const uint8_t beat[8] = {8, 0, 0, 0, 0, 0, 0, 0xCE};

	if (c->phase == CONN_CLOSING) {
		/* No close-ok within a tick or two: gone anyway. */
		if (c->idle_since && now - c->idle_since >= 2)
			pool_conn_free(c, 0, NULL);
		return;
	}
	if (c->phase != CONN_READY)
		return;
	if (now - c->last_out >= (c->heartbeat + 1) / 2) {
		evbuffer_add(transport_output(c->tr), beat, sizeof(beat));
		c->last_out = now;
	}
	/* Each client's own heartbeats, as its broker would send them. */
	list_for_each_entry (a, &c->atts, node) {
		if (a->phase == ATT_OPEN && a->heartbeat &&
		    now - a->last_in >= (a->heartbeat + 1) / 2) {
			evbuffer_add(a->down, beat, sizeof(beat));
			pool_feed(a);
		}
	}
	if (c->natts == 0 && pool_conn_busy(c) == 0 && c->idle_since &&
	    now - c->idle_since >= c->pool->cfg.idle_s)
		pool_conn_close(c, "idle");
}

/* The proxy closes c (idle, checked, or the worker ending): its clients
 * are told, the broker is sent connection.close; c goes on its close-ok
 * or within two ticks. */
void pool_conn_close(struct pool_conn *c, const char *why)
{
	if (c->phase != CONN_READY || why == NULL) {
		pool_conn_free(c, REPLY_CONNECTION_FORCED,
			       "CONNECTION_FORCED - broker connection closed by the proxy");
		return;
	}
	pool_conn_log(c, LOG_INFO, "broker connection closed: %s", why);
	method_write_connection_close(transport_output(c->tr), 200, why, 0, 0);
	c->phase = CONN_CLOSING;
	c->idle_since = time(NULL);
}

/* c goes: its clients hear code/text (code 0: they were told already),
 * and their legs end. */
static void pool_conn_free(struct pool_conn *c, uint16_t code, const char *text)
{
	struct pool_att *a;
	struct pool_queue *q;
	unsigned m;

	if (c->auth) {
		struct pool_att *auth = c->auth;

		c->auth = NULL;
		auth->conn = NULL;
		if (code)
			pool_att_close(auth, code, text);
	}
	list_for_each_entry_safe (a, &c->atts, node) {
		list_del(&a->node);
		list_init(&a->node);
		if (code)
			pool_att_close(a, code, text);
		a->conn = NULL;
		a->full = 0;
		pool_att_end(a);
	}
	list_for_each_entry_safe (q, &c->exclusive, conn_node) {
		list_del(&q->conn_node);
		list_del(&q->node);
		free(q);
	}
	for (m = 1; m < c->nslots; m++)
		if (c->slots[m].state != SLOT_FREE)
			pool_channels_add(-1);
	if (c->timer)
		event_free(c->timer);
	if (c->tr)
		transport_free(c->tr);
	if (c->counted)
		pool_conns_drop(c->pool);
	free(c->slots);
	free(c->start);
	pool_conn_gone(c);
	free(c);
}
