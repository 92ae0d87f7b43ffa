/* pool_mux: a pooled client's frames onto its broker connection. The
 * client's handshake is answered here as its broker would (the start-ok
 * taken for the credential check, tune-ok and open answered); its channels
 * are renumbered; what would make the broker close the shared connection
 * (a frame on a channel not open, a second channel.open, a connection
 * method other than close) closes this client only, with the code the
 * broker would send; another client's exclusive queue is refused with 405
 * as the broker refuses it between connections. A publish goes over whole
 * (method, header and body) when it fits in half of buffer_limit, so a
 * client that vanishes mid-message leaves no half message on the shared
 * channel space; a larger one streams, and a client leaving in its middle
 * costs the broker connection (its other clients are told why). */
#include "../amqp/content.h"
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "debug.h"
#include "log.h"
#include "pool.h"
#include "pool_int.h"
#include "session.h"
#include "transport.h"
#include "worker.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for channel n in the client's tables. 0 or -1. */
static int pool_mux_grow(struct pool_att *a, uint16_t n)
{
	uint32_t want;
	uint16_t *map;
	uint8_t *refused;

	if (n < a->nmap)
		return 0;
	want = (uint32_t)n + 16;
	map = realloc(a->map, want * sizeof(*map));
	if (map == NULL)
		return -1;
	a->map = map;
	refused = realloc(a->refused, want);
	if (refused == NULL)
		return -1;
	a->refused = refused;
	memset(a->map + a->nmap, 0, (want - a->nmap) * sizeof(*map));
	memset(a->refused + a->nmap, 0, want - a->nmap);
	a->nmap = want;
	return 0;
}

/* The client's channel n is closed by the proxy (its broker channel, if
 * any, closed at the broker); its frames are dropped until its close-ok. */
static void pool_mux_refuse(struct pool_att *a, uint16_t n, uint16_t code, const char *text,
			    const struct frame_info *fi)
{
	if (a->map[n] && a->conn)
		pool_conn_orphan(a->conn, a->map[n]);
	a->map[n] = 0;
	a->refused[n] = 1;
	method_write_channel_close(a->down, n, code, text, fi->class_id, fi->method_id);
	pool_feed(a);
}

struct pool_queue *pool_mux_locked(struct pool_conn *c, const struct pool_att *a,
				   const char *name, size_t len)
{
	struct pool_queue *q;

	list_for_each_entry (q, &c->exclusive, conn_node)
		if (q->owner != a && strlen(q->name) == len && memcmp(q->name, name, len) == 0)
			return q;
	return NULL;
}

/* The queue a method names, for the exclusivity check; 0 when it names
 * none (or does not decode: the session checked its syntax already). */
static int pool_mux_queue_of(amqp_method_number_t id, void *m, amqp_bytes_t *q, int *exclusive,
			     int *nowait)
{
	*exclusive = 0;
	*nowait = 0;
	switch (id) {
	case AMQP_QUEUE_DECLARE_METHOD:
		*q = ((amqp_queue_declare_t *)m)->queue;
		*exclusive = ((amqp_queue_declare_t *)m)->exclusive;
		*nowait = ((amqp_queue_declare_t *)m)->nowait;
		return 1;
	case AMQP_QUEUE_BIND_METHOD:
		*q = ((amqp_queue_bind_t *)m)->queue;
		return 1;
	case AMQP_QUEUE_UNBIND_METHOD:
		*q = ((amqp_queue_unbind_t *)m)->queue;
		return 1;
	case AMQP_QUEUE_PURGE_METHOD:
		*q = ((amqp_queue_purge_t *)m)->queue;
		return 1;
	case AMQP_QUEUE_DELETE_METHOD:
		*q = ((amqp_queue_delete_t *)m)->queue;
		return 1;
	case AMQP_BASIC_CONSUME_METHOD:
		*q = ((amqp_basic_consume_t *)m)->queue;
		return 1;
	case AMQP_BASIC_GET_METHOD:
		*q = ((amqp_basic_get_t *)m)->queue;
		return 1;
	default:
		return 0;
	}
}

/* A queue method on channel n: refused when it touches another client's
 * exclusive queue; an exclusive declare is noted. 0 to send it, 1 refused. */
static int pool_mux_queue(struct pool_att *a, struct pool_slot *sl, uint16_t n,
			  struct evbuffer *out, const struct frame_info *fi)
{
	struct worker *w = a->pool->home;
	amqp_method_number_t id;
	void *m;
	amqp_bytes_t q;
	int exclusive, nowait, refused = 0;
	char text[512];

	if (method_decode_evbuffer(out, fi->size, &w->pool, &id, &m) != 0 ||
	    !pool_mux_queue_of(id, m, &q, &exclusive, &nowait)) {
		empty_amqp_pool(&w->pool);
		return 0;
	}
	if (q.len && pool_mux_locked(a->conn, a, q.bytes, q.len)) {
		snprintf(
		    text, sizeof(text),
		    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%.*s' "
		    "in vhost '%s'. It could be originally declared on another connection "
		    "or the exclusive property value does not match that of the original "
		    "declaration.",
		    (int)(q.len > 200 ? 200 : q.len), (const char *)q.bytes, a->pool->vhost);
		STATS_INC(&w->stats, pool_refused_locked);
		pool_mux_refuse(a, n, 405, text, fi);
		refused = 1;
	} else if (id == AMQP_QUEUE_DECLARE_METHOD && exclusive) {
		sl->exclusive_pending = !nowait;
		if (nowait && q.len && q.len < sizeof(((struct pool_queue *)0)->name)) {
			struct pool_queue *e = calloc(1, sizeof(*e));

			if (e) {
				memcpy(e->name, q.bytes, q.len);
				e->owner = a;
				list_add(&e->node, &a->exclusive);
				list_add(&e->conn_node, &a->conn->exclusive);
			}
		}
	}
	empty_amqp_pool(&w->pool);
	return refused;
}

/* Whether the whole publish starting at the front of out is there (1, or
 * too large to wait for: it streams), not yet (0), or never (-1: another
 * frame came before its end, *cut bytes: the session ended the client in
 * the middle of it, and its close follows). */
static int pool_mux_publish_ready(struct pool_att *a, struct evbuffer *out,
				  const struct frame_info *fi, uint64_t *body, size_t *cut)
{
	size_t at = frame_scan_wire_len(fi), hold = (size_t)worker_settings.buffer_limit / 2;
	uint32_t max = a->conn->frame_max > 8 ? a->conn->frame_max - 8 : a->conn->frame_max;
	struct frame_info h, b;
	uint64_t size, got = 0;
	uint16_t cls;

	if (frame_scan_evbuffer(out, at, max, &h) != FRAME_SCAN_OK)
		return 0;
	*cut = at;
	if (h.type != FRAME_HEADER || h.channel != fi->channel)
		return -1;
	content_header_peek(h.peek, &cls, &size);
	*body = size;
	if (size > hold)
		return 1; /* streams */
	at += frame_scan_wire_len(&h);
	while (got < size) {
		if (frame_scan_evbuffer(out, at, max, &b) != FRAME_SCAN_OK)
			return 0;
		*cut = at;
		if (b.type != FRAME_BODY || b.channel != fi->channel)
			return -1;
		got += b.size;
		at += frame_scan_wire_len(&b);
	}
	return 1;
}

/* Methods the broker answers by closing the whole connection (540
 * NOT_IMPLEMENTED in RabbitMQ 3.x and 4.x): the client alone is closed,
 * with the broker's words. 1 when fi is one. */
static int pool_mux_fatal(struct pool_att *a, struct evbuffer *out, const struct frame_info *fi)
{
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);
	const uint8_t *p;
	const char *why = NULL;
	size_t at;

	if (id != AMQP_CHANNEL_FLOW_METHOD && id != AMQP_BASIC_QOS_METHOD &&
	    id != AMQP_BASIC_PUBLISH_METHOD)
		return 0;
	p = evbuffer_pullup(out, (ev_ssize_t)frame_scan_wire_len(fi));
	if (p == NULL)
		return 0;
	p += 7 + 4; /* the frame's header, class and method */
	switch (id) {
	case AMQP_CHANNEL_FLOW_METHOD:
		if (fi->size >= 5 && !(p[0] & 1))
			why = "NOT_IMPLEMENTED - active=false";
		break;
	case AMQP_BASIC_QOS_METHOD:
		if (fi->size >= 8 && (p[0] | p[1] | p[2] | p[3]))
			why = "NOT_IMPLEMENTED - prefetch_size!=0";
		break;
	default: /* basic.publish: ticket, exchange, routing key, bits */
		at = 2;
		if (at < (size_t)fi->size - 4)
			at += 1u + p[at];
		if (at < (size_t)fi->size - 4)
			at += 1u + p[at];
		if (at < (size_t)fi->size - 4 && (p[at] & 2))
			why = "NOT_IMPLEMENTED - immediate=true";
		break;
	}
	if (why == NULL)
		return 0;
	STATS_INC(&a->pool->home->stats, pool_refused_client_error);
	method_write_connection_close(a->down, 540, why, fi->class_id, fi->method_id);
	a->phase = ATT_CLOSING;
	pool_feed(a);
	return 1;
}

/* Move the frame at the front of out to the broker as channel m. */
static void pool_mux_move(struct pool_att *a, struct evbuffer *out, const struct frame_info *fi,
			  uint16_t m)
{
	size_t len = frame_scan_wire_len(fi);
	uint8_t *p = evbuffer_pullup(out, 3);

	ACEMQ_ASSERT(p != NULL);
	p[1] = (uint8_t)(m >> 8);
	p[2] = (uint8_t)m;
	evbuffer_remove_buffer(out, pool_conn_out(a->conn), len);
	a->conn->last_out = time(NULL);
}

/* A frame on a channel of an open client. 0 done, 1 wait for more. */
static int pool_mux_channel(struct pool_att *a, struct evbuffer *out,
			    const struct frame_info *fi)
{
	struct pool_conn *c = a->conn;
	size_t len = frame_scan_wire_len(fi);
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);
	int method = fi->type == FRAME_METHOD;
	uint16_t n = fi->channel, m;
	struct pool_slot *sl;
	uint64_t body = 0;
	size_t cut = 0;

	if (pool_mux_grow(a, n) != 0) {
		pool_att_close(a, 541, "INTERNAL_ERROR - out of memory");
		evbuffer_drain(out, len);
		return 0;
	}
	if (a->refused[n]) {
		/* Closed by the proxy: dropped until the client's close-ok. */
		if (method && id == AMQP_CHANNEL_CLOSE_OK_METHOD)
			a->refused[n] = 0;
		evbuffer_drain(out, len);
		return 0;
	}
	m = a->map[n];
	if (method && id == AMQP_CHANNEL_OPEN_METHOD) {
		if (m) {
			STATS_INC(&a->pool->home->stats, pool_refused_client_error);
			pool_att_close(a, REPLY_CHANNEL_ERROR,
				       "CHANNEL_ERROR - second 'channel.open' seen");
			evbuffer_drain(out, len);
			return 0;
		}
		m = pool_chan_take(c, a, n);
		if (m) {
			/* A kept channel: the broker's open-ok for it came. */
			evbuffer_drain(out, len);
			method_write(a->down, n, AMQP_CHANNEL_OPEN_OK_METHOD,
				     &(amqp_channel_open_ok_t){amqp_empty_bytes});
			pool_feed(a);
			return 0;
		}
		m = (uint16_t)pool_conn_slot(c, a, n);
		if (m == 0) {
			pool_mux_refuse(a, n, REPLY_NOT_ALLOWED,
					"NOT_ALLOWED - no free channel on the pooled broker "
					"connection (max_channels_per_connection)",
					fi);
			evbuffer_drain(out, len);
			return 0;
		}
		a->map[n] = m;
		pool_mux_move(a, out, fi, m);
		return 0;
	}
	if (m == 0) {
		/* The broker would close the whole connection for it. */
		STATS_INC(&a->pool->home->stats, pool_refused_client_error);
		pool_att_close(a, REPLY_CHANNEL_ERROR,
			       "CHANNEL_ERROR - expected 'channel.open'");
		evbuffer_drain(out, len);
		return 0;
	}
	sl = &c->slots[m];
	if (sl->closing & POOL_CLOSE_SENT) {
		/* Closed towards the broker: only the close-ok it may still
		 * owe goes; a second close or anything else would reach a
		 * closed channel (or, once freed, the next client's). */
		if (method && id == AMQP_CHANNEL_CLOSE_OK_METHOD &&
		    (sl->closing & POOL_CLOSE_GOT)) {
			pool_mux_move(a, out, fi, m);
			sl->closing &= (uint8_t)~POOL_CLOSE_GOT;
			pool_conn_settle(c, m);
			return 0;
		}
		evbuffer_drain(out, len);
		return 0;
	}
	if (sl->probe) {
		/* The client closed it; its close-ok comes with the qos-ok. */
		evbuffer_drain(out, len);
		return 0;
	}
	if (method) {
		if (sl->fresh && id != AMQP_CHANNEL_CLOSE_METHOD) {
			m = pool_chan_first(c, a, n, id == AMQP_CONFIRM_SELECT_METHOD);
			sl = &c->slots[m];
		}
		if (id == AMQP_CONFIRM_SELECT_METHOD) {
			const uint8_t *p = evbuffer_pullup(out, (ev_ssize_t)len);

			if (p && pool_chan_select(c, m, fi->size > 4 && (p[11] & 1))) {
				evbuffer_drain(out, len);
				pool_feed(a);
				return 0;
			}
		}
		if (fi->class_id == 50 || id == AMQP_BASIC_CONSUME_METHOD ||
		    id == AMQP_BASIC_GET_METHOD) {
			a->consumed |= fi->class_id == 60; /* deliveries may come */
			if (pool_mux_queue(a, sl, n, out, fi)) {
				evbuffer_drain(out, len);
				return 0;
			}
		} else if (pool_mux_fatal(a, out, fi)) {
			evbuffer_drain(out, len);
			return 0;
		} else if (id == AMQP_BASIC_PUBLISH_METHOD) {
			int ready = pool_mux_publish_ready(a, out, fi, &body, &cut);

			if (ready < 0) {
				/* Never sent: nothing half-sent on the broker's
				 * channel. */
				evbuffer_drain(out, cut);
				return 0;
			}
			if (ready == 0)
				return 1;
			sl->content_left = body; /* the header and bodies follow at once */
		} else if (id == AMQP_CHANNEL_CLOSE_METHOD) {
			if (pool_chan_retire(c, m, 1)) {
				/* Kept if the broker's answer to a qos(0) says so. */
				evbuffer_drain(out, len);
				return 0;
			}
			sl->closing |= POOL_CLOSE_SENT;
		} else if (id == AMQP_CHANNEL_CLOSE_OK_METHOD) {
			/* Answers the broker's close, or nothing the broker
			 * sent (a close the session made itself). */
			if (sl->closing & POOL_CLOSE_GOT) {
				pool_mux_move(a, out, fi, m);
				sl->closing &= (uint8_t)~POOL_CLOSE_GOT;
				sl->closing |= POOL_CLOSE_DONE; /* nothing more is owed */
				pool_conn_free_slot(c, m);
			} else {
				evbuffer_drain(out, len);
			}
			return 0;
		}
	} else if (fi->type == FRAME_BODY) {
		sl->content_left =
		    sl->content_left > fi->size ? sl->content_left - fi->size : 0;
	}
	if (method)
		pool_chan_sent(sl, id);
	pool_mux_move(a, out, fi, m);
	return 0;
}

/* A connection-level frame of an open client. */
static void pool_mux_connection(struct pool_att *a, struct evbuffer *out,
				const struct frame_info *fi)
{
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);

	evbuffer_drain(out, frame_scan_wire_len(fi));
	if (fi->type != FRAME_METHOD)
		return;
	switch (id) {
	case AMQP_CONNECTION_CLOSE_METHOD:
		/* The client leaves: as a broker does, its channels are closed
		 * (its exclusive queues deleted first) before its close-ok, so
		 * the next client never meets its consumers or deliveries. A
		 * client that never consumed nor declared an exclusive queue
		 * left nothing another could meet: answered at once, its
		 * channels closing behind. */
		a->phase = ATT_CLOSING;
		if (!a->consumed && list_empty(&a->exclusive)) {
			pool_mux_closed(a);
			pool_mux_leave(a, 0);
		} else {
			pool_mux_leave(a, 1);
		}
		break;
	case AMQP_CONNECTION_CLOSE_OK_METHOD:
		break;
	case METHOD_ID(10, 70): /* connection.update-secret */
		STATS_INC(&a->pool->home->stats, pool_refused_client_error);
		pool_att_close(a, REPLY_NOT_ALLOWED,
			       "NOT_ALLOWED - connection.update-secret is refused on a pooled "
			       "connection: it would change the secret of a broker connection "
			       "other clients share");
		break;
	default:
		STATS_INC(&a->pool->home->stats, pool_refused_client_error);
		pool_att_close(a, REPLY_COMMAND_INVALID,
			       "COMMAND_INVALID - connection method not allowed here");
		break;
	}
}

/* The client's handshake, answered as its broker would. 0 done, 1 wait. */
static int pool_mux_handshake(struct pool_att *a, struct evbuffer *out,
			      const struct frame_info *fi)
{
	amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);
	struct worker *w = a->pool->home;
	size_t len = frame_scan_wire_len(fi);
	void *m;

	if (fi->type == FRAME_HEARTBEAT) {
		evbuffer_drain(out, len);
		return 0;
	}
	if (a->phase == ATT_STARTOK && fi->type == FRAME_METHOD &&
	    id == AMQP_CONNECTION_START_OK_METHOD) {
		if (a->startok == NULL && (a->startok = evbuffer_new()) == NULL) {
			pool_att_close(a, 541, "INTERNAL_ERROR - out of memory");
			return 0;
		}
		evbuffer_remove_buffer(out, a->startok, len);
		pool_credentials_in(a);
		return 0;
	}
	if (a->phase != ATT_TUNE)
		return 1; /* nothing is expected before the proxy answers */
	if (fi->type == FRAME_METHOD && id == AMQP_CONNECTION_TUNE_OK_METHOD) {
		if (method_decode_evbuffer(out, fi->size, &w->pool, &id, &m) == 0)
			a->heartbeat = ((amqp_connection_tune_ok_t *)m)->heartbeat;
		empty_amqp_pool(&w->pool);
		evbuffer_drain(out, len);
		return 0;
	}
	if (fi->type == FRAME_METHOD && id == AMQP_CONNECTION_OPEN_METHOD) {
		amqp_connection_open_ok_t ok = {amqp_empty_bytes};

		evbuffer_drain(out, len);
		a->phase = ATT_OPEN;
		method_write(a->down, 0, AMQP_CONNECTION_OPEN_OK_METHOD, &ok);
		pool_feed(a);
		return 0;
	}
	pool_att_close(a, REPLY_COMMAND_INVALID,
		       "COMMAND_INVALID - connection method out of order");
	return 0;
}

/* The pipe's output: what the client's session wrote for the broker. */
void pool_mux_output(void *arg)
{
	struct pool_att *a = arg;
	struct evbuffer *out = a->up;
	uint32_t max;
	struct frame_info fi;

	for (;;) {
		if (a->phase == ATT_CLOSING) {
			/* The client's close-ok for the close it was shown: the
			 * leg ends, as a broker's socket would close. */
			while (frame_scan_evbuffer(out, 0, 131072 - 8, &fi) == FRAME_SCAN_OK) {
				if (fi.type == FRAME_METHOD && fi.channel == 0 &&
				    METHOD_ID(fi.class_id, fi.method_id) ==
					AMQP_CONNECTION_CLOSE_OK_METHOD)
					pool_att_end(a);
				evbuffer_drain(out, frame_scan_wire_len(&fi));
			}
			evbuffer_drain(out, evbuffer_get_length(out));
			return;
		}
		max = a->conn && a->conn->frame_max > 8 ? a->conn->frame_max - 8 : 131072 - 8;
		if (frame_scan_evbuffer(out, 0, max, &fi) != FRAME_SCAN_OK)
			return; /* the session wrote whole frames: the rest comes */
		if (a->phase != ATT_OPEN) {
			if (pool_mux_handshake(a, out, &fi))
				return;
			continue;
		}
		ACEMQ_ASSERT(a->conn != NULL);
		/* The broker's side is full: the rest waits for its drain
		 * (checked at methods: a message's frames go together). */
		if (fi.type == FRAME_METHOD && evbuffer_get_length(pool_conn_out(a->conn)) >=
						   (size_t)worker_settings.buffer_limit)
			return;
		if (fi.type == FRAME_HEARTBEAT)
			evbuffer_drain(out, frame_scan_wire_len(&fi));
		else if (fi.channel == 0)
			pool_mux_connection(a, out, &fi);
		else if (pool_mux_channel(a, out, &fi))
			return;
	}
}

/* A closing client's broker channels are all closed: its close-ok. The
 * client closes its socket then (the side that sent connection.close
 * does), as it would with a broker; a second connection.close it sent
 * meanwhile is dropped. */
void pool_mux_closed(struct pool_att *a)
{
	method_write(a->down, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
		     &(amqp_connection_close_ok_t){0});
	pool_feed(a);
}

/* Close broker channel m of the leaving client a; with wait, a hears of
 * it (pool_mux_closed once the last of them is closed). */
static void pool_mux_orphan(struct pool_att *a, struct pool_conn *c, uint16_t m, int wait)
{
	if (wait) {
		c->slots[m].waiter = a;
		a->closing_chans++;
	}
	pool_conn_orphan(c, m);
}

/* The client leaves (wait: it sent connection.close and waits for the
 * close-ok) or its session let go: its exclusive queues deleted, then its
 * channels closed at the broker (which requeues its unacknowledged
 * deliveries and cancels its consumers). */
void pool_mux_leave(struct pool_att *a, int wait)
{
	struct pool_conn *c = a->conn;
	struct pool_queue *q;
	uint32_t n;
	int m0 = 0;

	if (c == NULL || a->phase < ATT_TUNE || c->slots == NULL) {
		list_for_each_entry_safe (q, &a->exclusive, node) {
			list_del(&q->node);
			list_del(&q->conn_node);
			free(q);
		}
		if (wait)
			pool_mux_closed(a);
		return;
	}
	for (n = 0; n < a->nmap; n++) {
		if (a->map[n] && c->slots[a->map[n]].content_left) {
			/* Half a message on a broker channel: it cannot be
			 * finished or withdrawn, so the connection goes (and
			 * each of its clients is told). */
			pool_conn_close(c, NULL);
			return;
		}
		if (a->map[n] && !m0 && c->slots[a->map[n]].state != SLOT_FREE &&
		    !(c->slots[a->map[n]].closing & POOL_CLOSE_SENT))
			m0 = a->map[n];
	}
	a->closing_chans++; /* until every channel below is counted */
	if (!list_empty(&a->exclusive)) {
		struct evbuffer *out = transport_output(c->tr);

		if (m0 == 0 && (m0 = pool_conn_slot(c, NULL, 0)) != 0)
			method_write(out, (uint16_t)m0, AMQP_CHANNEL_OPEN_METHOD,
				     &(amqp_channel_open_t){amqp_empty_bytes});
		list_for_each_entry_safe (q, &a->exclusive, node) {
			amqp_queue_delete_t d = {0, amqp_cstring_bytes(q->name), 0, 0, 1};

			if (m0)
				method_write(out, (uint16_t)m0, AMQP_QUEUE_DELETE_METHOD, &d);
			list_del(&q->node);
			list_del(&q->conn_node);
			free(q);
		}
		if (m0 && c->slots[m0].att == NULL)
			pool_mux_orphan(a, c, (uint16_t)m0, wait);
		else if (m0) /* closed, so the close-ok waits for the deletes */
			c->slots[m0].dirty = 1;
	}
	for (n = 0; n < a->nmap; n++)
		if (a->map[n] && !pool_chan_retire(c, a->map[n], 0))
			pool_mux_orphan(a, c, a->map[n], wait);
	if (--a->closing_chans == 0 && wait)
		pool_mux_closed(a);
}
