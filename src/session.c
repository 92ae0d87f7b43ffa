/* session: one client connection and its broker connection: the pair's
 * state (one function changes it), its lifetime (every event enters through
 * session_event, which applies the lifetime rule), wake-ups, closing, and
 * the host interface its pipeline sees. Connecting the broker leg is
 * dial.c's, the handshake handshake.c's, frames relay.c's. */
#include "session.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "control.h"
#include "debug.h"
#include "dial.h"
#include "fault.h"
#include "greeting.h"
#include "handshake.h"
#include "host.h"
#include "json.h"
#include "limits.h"
#include "log.h"
#include "pool.h"
#include "relay.h"
#include "rules.h"
#include "tls.h"
#include "transport.h"
#include "upstream.h"
#include "vstats.h"
#include "worker.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_CLOSE_WAIT_MS 2000

static atomic_ullong session_next_id;

/* Everything that happens to a session from outside its own call stack:
 * transport callbacks, its timer, its wake-up, a completion. Each enters
 * through session_event, which applies the lifetime rule (session_accepts). */
enum session_event {
	SEV_READ,      /* a leg has new input */
	SEV_DRAINED,   /* a leg's output fell to its low mark */
	SEV_CONNECTED, /* the broker leg's connect finished */
	SEV_END,       /* a leg's peer closed (err 0) or its socket failed */
	SEV_SILENT,    /* a leg heard nothing for two heartbeat intervals */
	SEV_TIMER,     /* the session's timer: connect, handshake or close wait */
	SEV_RULES,     /* the worker swapped in a new rules set */
	SEV_WAKE,      /* legs marked woken are pumped */
	SEV_LATER,     /* the wait a rate limit asked for is over */
};

static void session_read_cb(struct transport *tr, void *arg);

static void session_write_cb(struct transport *tr, void *arg);

static void session_event_cb(struct transport *tr, int what, int err, void *arg);

static void session_event(struct session *s, struct leg *l, enum session_event ev, int err);
static void session_wake_cb(evutil_socket_t fd, short what, void *arg);

static const char *session_leg_name(struct session *s, struct leg *l)
{
	return l == &s->client ? "client" : "broker";
}

struct evbuffer *session_out(struct session *s, enum chan_dir dir)
{
	struct leg *to = dir == DIR_TO_BROKER ? &s->upstream : &s->client;

	return to->tr ? transport_output(to->tr) : NULL;
}

struct channel *session_channel(struct session *s, uint16_t id)
{
	if (id >= s->nchans) {
		uint32_t n = s->nchans ? s->nchans : 4;
		struct channel **nc;

		while (n <= id)
			n *= 2;
		if (n > 65536)
			n = 65536;
		nc = realloc(s->chans, n * sizeof(*nc));
		if (nc == NULL)
			return NULL;
		memset(nc + s->nchans, 0, (n - s->nchans) * sizeof(*nc));
		s->chans = nc;
		s->nchans = n;
	}
	if (s->chans[id] == NULL)
		s->chans[id] = channel_new(id);
	return s->chans[id];
}

/* The one place a session is torn down; only session_leave calls it, once
 * the last event on the session's stack has returned. */
static void session_destroy(struct session *s)
{
	uint32_t i;

	ACEMQ_ASSERT(s->depth == 0 && s->state == SESSION_GONE);

	if (s->vhost_counted)
		limits_vhost_leave(s->vhost);
	pipeline_detach(&s->pipe);
	for (i = 0; i < s->nchans; i++)
		channel_free(s->chans[i]);
	free(s->chans);
	if (s->timer)
		event_free(s->timer);
	if (s->wake)
		event_free(s->wake);
	if (s->later)
		event_free(s->later);
	greeting_free(s->greeting);
	free(s->control_reason);
	STATS_INC(&s->w->stats, connections_closed);
	worker_session_remove(s->w, s);
	free(s);
}

/* Lifetimes. Code on the stack of an event may end the session (a close, a
 * lost leg); the memory stays until the outermost event returns, so no
 * caller ever touches freed memory, and every event after the end finds the
 * session GONE (session_accepts). */
void session_enter(struct session *s)
{
	s->depth++;
}

void session_leave(struct session *s)
{
	ACEMQ_ASSERT(s->depth > 0);
	if (--s->depth == 0 && s->state == SESSION_GONE)
		session_destroy(s);
}

/* The session is finished: both sockets close now, and the memory goes
 * when the current event returns. From here on every event and every
 * completion finds it gone. */
void session_end(struct session *s)
{
	if (s->state == SESSION_GONE)
		return;
	session_log(s, LOG_INFO, "closed");
	if (s->client.tr)
		transport_free(s->client.tr);
	if (s->upstream.tr)
		transport_free(s->upstream.tr);
	s->client.tr = s->upstream.tr = NULL;
	session_set_state(s, SESSION_GONE);
}

static void session_timer(struct session *s)
{
	switch (s->state) {
	case SESSION_CONNECTING:
		session_log(s, LOG_WARNING, "broker %s not reached within %ld ms",
			    upstream_node(s->upstream_at)->name,
			    worker_settings.connect_timeout_ms);
		STATS_INC(&s->w->stats, upstream_failures);
		if (dial_next(s) == 0)
			return; /* the next broker address */
		dial_unreachable(s);
		return;
	case SESSION_HEADER:
	case SESSION_HANDSHAKE:
		session_log(s, LOG_WARNING, "handshake not finished within %ld ms",
			    worker_settings.handshake_timeout_ms);
		break;
	case SESSION_OPEN:
		if (control_timer(s))
			return;
		break;
	default:
		break;
	}
	session_end(s);
}

static void session_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct session *s = arg;

	session_event(s, NULL, SEV_TIMER, 0);
}

void session_timer_set(struct session *s, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	evtimer_add(s->timer, &tv);
}

/* The one place the state changes. */
void session_set_state(struct session *s, enum session_state st)
{
	/* A session that started closing never opens again; gone is final. */
	ACEMQ_ASSERT(s->state < SESSION_CLOSING || st >= SESSION_CLOSING);
	ACEMQ_ASSERT(s->state != SESSION_GONE || st == SESSION_GONE);
	s->state = st;
	switch (st) {
	case SESSION_CONNECTING:
		session_timer_set(s, worker_settings.connect_timeout_ms);
		break;
	case SESSION_HANDSHAKE:
		session_timer_set(s, worker_settings.handshake_timeout_ms);
		break;
	case SESSION_OPEN:
		evtimer_del(s->timer);
		break;
	case SESSION_CLOSING:
	case SESSION_FLUSHING:
		session_timer_set(s, SESSION_CLOSE_WAIT_MS);
		break;
	case SESSION_GONE:
		evtimer_del(s->timer);
		break;
	case SESSION_HEADER:
		break;
	}
}

/* Free a leg's socket once what is queued for it has been written. */
void session_leg_finish(struct session *s, struct leg *l)
{
	if (l->tr == NULL)
		return;
	transport_read_disable(l->tr);
	/* A broker leg still connecting has nothing the broker needs. */
	if (l->eof || transport_connecting(l->tr) ||
	    evbuffer_get_length(transport_output(l->tr)) == 0) {
		transport_free(l->tr);
		l->tr = NULL;
	} else {
		transport_set_write_low(l->tr, 0);
	}
}

/* Both legs are gone or going: end when they are. Returns 1 if ended. */
int session_reap(struct session *s)
{
	if (s->client.tr == NULL && s->upstream.tr == NULL) {
		session_end(s);
		return 1;
	}
	return 0;
}

void session_flush_and_go(struct session *s)
{
	if (s->state != SESSION_FLUSHING)
		session_set_state(s, SESSION_FLUSHING);
	session_leg_finish(s, &s->client);
	session_leg_finish(s, &s->upstream);
	session_reap(s);
}

/* The proxy closes the session itself (session_close from inside). */
void session_shut(struct session *s, uint16_t code, const char *text)
{
	struct evbuffer *out;

	if (s->state >= SESSION_CLOSING)
		return;
	s->client.done = 1;
	s->upstream.done = 1;
	if (s->client.tr && !s->client.eof && s->closable) {
		out = transport_output(s->client.tr);
		method_write_connection_close(out, code, text, 0, 0);
		s->client.done = 0;
	}
	if (s->upstream.tr && !s->upstream.eof && s->state >= SESSION_OPEN) {
		out = transport_output(s->upstream.tr);
		method_write_connection_close(
		    out, REPLY_CONNECTION_FORCED,
		    s->client.eof ? "CONNECTION_FORCED - client connection lost"
				  : "CONNECTION_FORCED - client closed by proxy",
		    0, 0);
		s->upstream.done = 0;
	}
	session_set_state(s, SESSION_CLOSING);
	if (s->client.done)
		session_leg_finish(s, &s->client);
	if (s->upstream.done)
		session_leg_finish(s, &s->upstream);
	session_reap(s);
}

void session_close(struct session *s, uint16_t code, const char *text)
{
	session_enter(s);
	session_shut(s, code, text);
	session_leave(s);
}

/* A channel is closed (or opened anew): its state goes. */
void session_channel_shut(struct session *s, struct channel *ch)
{
	if (ch->open && s->nopen > 0)
		s->nopen--;
	channel_reset(ch);
	ch->open = 0;
}

void session_leg_setup(struct session *s, struct leg *l, struct transport *tr,
		       enum chan_dir dir)
{
	l->tr = tr;
	l->s = s;
	l->dir = dir;
	transport_setcb(tr, session_read_cb, session_write_cb, session_event_cb, l);
	/* Every byte written to a side counts, whatever wrote it: frames
	 * relayed, messages the pipeline rewrote or rehydrated, the proxy's
	 * own frames. */
	transport_count_sent(tr, dir == DIR_TO_BROKER ? &s->w->stats.bytes_to_client
						      : &s->w->stats.bytes_to_broker);
	transport_set_read_high(tr, (size_t)worker_settings.buffer_limit);
	transport_set_write_low(tr, (size_t)worker_settings.buffer_limit / 2);
}

void session_nodelay(int fd)
{
	int one = 1;

	if (fd >= 0) /* a pipe to a pool has no socket */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void session_format_peer(char *out, size_t len, const struct sockaddr *sa)
{
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
		snprintf(out, len, "%s:%d", host, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
		snprintf(out, len, "[%s]:%d", host, port);
	} else {
		snprintf(out, len, "unix");
	}
}

struct session *session_new(struct worker *w, int fd, const struct sockaddr *sa, int salen,
			    int tls)
{
	struct session *s = calloc(1, sizeof(*s));
	struct transport *tr;

	if (s == NULL) {
		evutil_closesocket(fd);
		return NULL;
	}
	s->id = ++session_next_id;
	s->w = w;
	s->opened = time(NULL);
	session_format_peer(s->peer, sizeof(s->peer), sa);
	if (salen > 0 && (size_t)salen <= sizeof(s->peer_sa)) {
		memcpy(&s->peer_sa, sa, (size_t)salen);
		s->peer_salen = (socklen_t)salen;
	}
	s->local_salen = sizeof(s->local_sa);
	if (getsockname(fd, (struct sockaddr *)&s->local_sa, &s->local_salen) != 0)
		s->local_salen = 0;
	s->frame_max = (uint32_t)worker_settings.max_frame_pre_tune;
	pipeline_init(&s->pipe, &host_of_session, s, w, s->id);
	s->pipe.peer = s->peer;
	s->pipe.vhost = s->vhost;
	s->pipe.user = s->user;
	s->pipe.frame_max = s->frame_max;
	s->timer = evtimer_new(w->base, session_timer_cb, s);
	s->wake = event_new(w->base, -1, 0, session_wake_cb, s);
	session_nodelay(fd);
	tr = transport_new(w->base, fd);
	if (tr && tls) {
		SSL *ssl = tls_server_new();

		if (ssl == NULL || transport_tls(tr, ssl) != 0) {
			SSL_free(ssl);
			transport_free(tr);
			tr = NULL;
			fd = -1; /* closed with the transport */
		}
	}
	if (tr == NULL || s->timer == NULL || s->wake == NULL) {
		if (tr)
			transport_free(tr);
		else if (fd >= 0)
			evutil_closesocket(fd);
		if (s->timer)
			event_free(s->timer);
		if (s->wake)
			event_free(s->wake);
		free(s);
		return NULL;
	}
	worker_session_add(w, s);
	STATS_INC(&w->stats, connections_accepted);
	session_leg_setup(s, &s->client, tr, DIR_TO_BROKER);
	session_set_state(s, SESSION_HEADER);
	session_timer_set(s, worker_settings.handshake_timeout_ms);
	transport_read_enable(tr);
	session_log(s, LOG_DEBUG, "accepted");
	return s;
}

/* Whether a message towards the broker stopped half way on some channel. */
static int session_mid_message(const struct session *s)
{
	uint32_t i;

	for (i = 0; i < s->nchans; i++)
		if (s->chans[i] && s->chans[i]->content[DIR_TO_BROKER].expect != EXPECT_METHOD)
			return 1;
	return 0;
}

/* The client vanished (its leg marked eof). An open broker connection is
 * asked to close: the broker handles every frame before a connection.close,
 * where a socket that just ends may lose the publishes it still holds (as
 * it would without the proxy). Not after half a message: that one is lost
 * either way, and a pool could not tell the close from the message's
 * body. */
static void session_client_gone(struct session *s)
{
	if (s->state == SESSION_OPEN && s->upstream.tr && !s->upstream.eof &&
	    !session_mid_message(s)) {
		session_shut(s, REPLY_CONNECTION_FORCED, "client connection lost");
		return;
	}
	session_flush_and_go(s);
}

/* A leg failed or ended. */
static void session_leg_lost(struct session *s, struct leg *l, const char *why)
{
	struct leg *other = session_other(s, l);

	l->eof = 1;
	if (s->state == SESSION_CLOSING) {
		l->done = 1;
		session_leg_finish(s, l);
		if (other->done)
			session_leg_finish(s, other);
		session_reap(s);
		return;
	}
	if (l == &s->upstream && s->state < SESSION_FLUSHING && !s->close_seen &&
	    (s->greeting ? s->greeting->phase == GREETING_CHOSEN : !s->started)) {
		/* The broker closed before its connection.start (a node that
		 * is starting or stopping): the client has seen nothing of
		 * it, so the next address is tried, as for a refused connect. */
		session_log(s, LOG_WARNING, "broker %s closed before connection.start: %s",
			    upstream_node(s->upstream_at)->name, why);
		STATS_INC(&s->w->stats, upstream_failures);
		if (dial_next(s) != 0)
			dial_unreachable(s);
		return;
	}
	if (l == &s->upstream && s->greeting && s->state < SESSION_FLUSHING) {
		/* A greeted client waits for open-ok. A broker that closes
		 * right after the credentials refused them (as RabbitMQ does
		 * for a client that did not ask for a connection.close). */
		int login = s->greeting->phase == GREETING_REPLAYED;

		session_log(s, LOG_WARNING, "broker connection lost in the handshake: %s", why);
		session_leg_finish(s, l);
		handshake_failed(
		    s, login ? REPLY_ACCESS_REFUSED : REPLY_CONNECTION_FORCED,
		    login ? "ACCESS_REFUSED - login refused by the broker (it closed the "
			    "connection after the credentials)"
			  : "CONNECTION_FORCED - broker connection lost in the handshake");
		return;
	}
	if (s->state == SESSION_FLUSHING || s->close_seen || s->state <= SESSION_CONNECTING) {
		session_flush_and_go(s);
		return;
	}
	if (l == &s->upstream) {
		session_log(s, LOG_WARNING, "broker connection lost: %s", why);
		STATS_INC(&s->w->stats, upstream_failures);
		session_leg_finish(s, l);
		session_shut(s, REPLY_CONNECTION_FORCED,
			     "CONNECTION_FORCED - broker connection lost");
		return;
	}
	session_log(s, LOG_INFO, "client connection lost: %s", why);
	session_client_gone(s);
}

/* A leg's output drained: finish a closing leg, or resume the other leg. */
static void session_drained(struct session *s, struct leg *l)
{
	struct leg *other = session_other(s, l);

	if (s->state >= SESSION_CLOSING || (l->eof && other->eof)) {
		if (evbuffer_get_length(transport_output(l->tr)) == 0 &&
		    (s->state == SESSION_FLUSHING || l->done)) {
			transport_free(l->tr);
			l->tr = NULL;
			session_reap(s);
		}
		return;
	}
	if (other->paused && other->tr) {
		other->paused = 0;
		transport_read_enable(other->tr);
		session_wake(s, other);
	}
	if (l == &s->client && s->pipe.nhooks && s->state < SESSION_CLOSING)
		pipeline_drained(&s->pipe);
}

static void session_silent(struct session *s, struct leg *l)
{
	if (l == &s->upstream && s->state == SESSION_OPEN) {
		session_log(s, LOG_WARNING, "broker missed heartbeats");
		l->eof = 1;
		STATS_INC(&s->w->stats, upstream_failures);
		session_leg_finish(s, l);
		session_shut(s, REPLY_CONNECTION_FORCED,
			     "CONNECTION_FORCED - broker missed heartbeats");
		return;
	}
	session_log(s, LOG_WARNING, "%s missed heartbeats", session_leg_name(s, l));
	l->eof = 1;
	if (l == &s->client)
		session_client_gone(s);
	else
		session_flush_and_go(s);
}

static void session_leg_end(struct session *s, struct leg *l, int err)
{
	char why[128];

	if (err && s->state == SESSION_CONNECTING && l == &s->upstream) {
		session_log(s, LOG_WARNING, "cannot connect to broker %s: %s",
			    upstream_node(s->upstream_at)->name, transport_error(l->tr, err));
		STATS_INC(&s->w->stats, upstream_failures);
		if (dial_next(s) != 0)
			dial_unreachable(s);
		return;
	}
	snprintf(why, sizeof(why), "%s", err ? transport_error(l->tr, err) : "end of stream");
	if (err == EPROTO && l == &s->client && s->state == SESSION_HEADER)
		session_log(s, LOG_WARNING, "TLS handshake with the client failed: %s", why);
	/* Frames that arrived before the end still go through. */
	if (s->state != SESSION_FLUSHING && relay_pump(s, l) != 0)
		return;
	if (l->tr != NULL)
		session_leg_lost(s, l, why);
}

/* The lifetime rule, in one place: which events a session still takes.
 * A session that is gone takes none, and neither does a leg whose socket
 * is freed; one that started closing takes only those that can finish it
 * (frames, for the close handshake; drained output; a leg's end; the
 * close-wait timer). */
static int session_accepts(const struct session *s, const struct leg *l, enum session_event ev)
{
	if (s->state == SESSION_GONE || (l != NULL && l->tr == NULL))
		return 0;
	switch (ev) {
	case SEV_CONNECTED:
		return s->state == SESSION_CONNECTING && l == &s->upstream;
	case SEV_SILENT:
	case SEV_RULES:
	case SEV_LATER:
		return s->state < SESSION_CLOSING;
	case SEV_READ:
	case SEV_DRAINED:
	case SEV_END:
	case SEV_TIMER:
	case SEV_WAKE:
		return 1;
	}
	return 0;
}

/* New input on a leg, or a leg woken: its frames move, unless a message
 * from it waits for a hook (which may look ahead at what arrived). */
static void session_read(struct session *s, struct leg *l)
{
	if (l->held && s->state == SESSION_OPEN)
		pipeline_held_input(&s->pipe, (int)l->dir);
	if (s->state != SESSION_GONE && l->tr && relay_pump(s, l) == 0 && s->rated &&
	    l == &s->client)
		control_rate(s);
}

static void session_event(struct session *s, struct leg *l, enum session_event ev, int err)
{
	session_enter(s);
	if (session_accepts(s, l, ev)) {
		switch (ev) {
		case SEV_READ:
			session_read(s, l);
			break;
		case SEV_WAKE:
			if (s->client.woken) {
				s->client.woken = 0;
				if (s->client.tr)
					session_read(s, &s->client);
			}
			if (s->upstream.woken && s->state != SESSION_GONE) {
				s->upstream.woken = 0;
				if (s->upstream.tr)
					session_read(s, &s->upstream);
			}
			break;
		case SEV_DRAINED:
			session_drained(s, l);
			break;
		case SEV_CONNECTED:
			dial_connected(s, l);
			break;
		case SEV_END:
			session_leg_end(s, l, err);
			break;
		case SEV_SILENT:
			session_silent(s, l);
			break;
		case SEV_TIMER:
			session_timer(s);
			break;
		case SEV_RULES:
			pipeline_refresh(&s->pipe);
			control_rules(s);
			break;
		case SEV_LATER:
			control_later(s);
			break;
		}
		/* connection.start just passed: the client's frames that
		 * waited for it go at the wake-up. */
		if (s->started && !s->client_flowing && s->state < SESSION_GONE) {
			s->client_flowing = 1;
			if (s->client.tr && evbuffer_get_length(transport_input(s->client.tr)))
				session_wake(s, &s->client);
		}
		if (s->draining)
			control_check(s);
	}
	session_leave(s);
}

static void session_later_cb(evutil_socket_t fd, short what, void *arg)
{
	session_event(arg, NULL, SEV_LATER, 0);
}

int session_later(struct session *s, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	if (s->later == NULL &&
	    (s->later = evtimer_new(s->w->base, session_later_cb, s)) == NULL)
		return -1;
	return evtimer_add(s->later, &tv);
}

static void session_wake_cb(evutil_socket_t fd, short what, void *arg)
{
	session_event(arg, NULL, SEV_WAKE, 0);
}

void session_wake(struct session *s, struct leg *l)
{
	ACEMQ_ASSERT(l == &s->client || l == &s->upstream);
	l->woken = 1;
	/* Runs after the events already active in this loop turn. */
	event_active(s->wake, EV_READ, 0);
}

void session_hold(struct session *s, enum chan_dir from)
{
	(from == DIR_TO_BROKER ? &s->client : &s->upstream)->held++;
}

void session_unhold(struct session *s, enum chan_dir from)
{
	struct leg *l = from == DIR_TO_BROKER ? &s->client : &s->upstream;

	/* Every release pairs with a hold: a hook that released twice
	 * would let frames overtake a message still waiting. */
	ACEMQ_ASSERT(l->held > 0);
	if (l->held && --l->held == 0)
		session_wake(s, l);
}

void session_describe(struct session *s, struct evbuffer *out)
{
	static const char *const states[] = {"header",  "connecting", "handshake", "open",
					     "closing", "flushing",   "gone"};
	uint64_t cin = 0, cout = 0, bin = 0, bout = 0;
	int64_t pooled;

	if (s->client.tr)
		transport_bytes(s->client.tr, &cin, &cout);
	if (s->upstream.tr)
		transport_bytes(s->upstream.tr, &bin, &bout);
	evbuffer_add_printf(out, "{\"id\": %llu, \"address\": ", (unsigned long long)s->id);
	json_cstring(out, s->peer);
	evbuffer_add_printf(out, ", \"vhost\": ");
	json_cstring(out, s->vhost);
	evbuffer_add_printf(out, ", \"user\": ");
	json_cstring(out, s->user);
	/* A pooled client: the pooled broker connection it rides on (0
	 * while it waits for one). */
	pooled = s->upstream.tr ? pool_conn_id(s->upstream.tr) : -1;
	if (pooled >= 0)
		evbuffer_add_printf(out, ", \"pool_connection\": %lld", (long long)pooled);
	evbuffer_add_printf(
	    out,
	    ", \"state\": \"%s\", \"channels\": %u, \"broker\": \"%s\", "
	    "\"bytes_from_client\": %llu, \"bytes_to_client\": %llu, "
	    "\"bytes_to_broker\": %llu, \"bytes_from_broker\": %llu, "
	    "\"age_s\": %lld, \"worker\": %d}",
	    states[s->state], s->nopen,
	    s->upstream.tr && s->upstream_at >= 0 ? upstream_node(s->upstream_at)->name : "",
	    (unsigned long long)cin, (unsigned long long)cout, (unsigned long long)bout,
	    (unsigned long long)bin, (long long)(time(NULL) - s->opened), s->w->index);
}

void session_rules_changed(struct session *s)
{
	session_event(s, NULL, SEV_RULES, 0);
}

static void session_read_cb(struct transport *tr, void *arg)
{
	struct leg *l = arg;

	session_event(l->s, l, SEV_READ, 0);
}

static void session_write_cb(struct transport *tr, void *arg)
{
	struct leg *l = arg;

	session_event(l->s, l, SEV_DRAINED, 0);
}

static void session_event_cb(struct transport *tr, int what, int err, void *arg)
{
	struct leg *l = arg;

	if (what & TRANSPORT_CONNECTED)
		session_event(l->s, l, SEV_CONNECTED, 0);
	else if (what & TRANSPORT_TIMEOUT)
		session_event(l->s, l, SEV_SILENT, 0);
	else
		session_event(l->s, l, SEV_END, (what & TRANSPORT_ERROR) ? err : 0);
}
