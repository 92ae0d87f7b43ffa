/* session: one client connection and its broker connection, the frames
 * between them, and the state of the pair. */
#include "session.h"

#include "../amqp/content.h"
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "../amqp/proxyproto.h"
#include "config.h"
#include "greeting.h"
#include "limits.h"
#include "log.h"
#include "rules.h"
#include "settle.h"
#include "tls.h"
#include "upstream.h"
#include "vstats.h"
#include "worker.h"

#include "transport.h"
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define REPLY_CONNECTION_FORCED     320
#define REPLY_ACCESS_REFUSED        403
#define REPLY_COMMAND_INVALID       503
#define REPLY_FRAME_ERROR           501
#define REPLY_SYNTAX_ERROR          502
#define REPLY_CHANNEL_ERROR         504
#define REPLY_UNEXPECTED_FRAME      505
#define REPLY_PRECONDITION_FAILED   406
#define REPLY_NOT_ALLOWED           530
#define SESSION_CLOSE_WAIT_MS       2000
#define SESSION_FRAME_MAX_UNLIMITED (128u * 1024u * 1024u)

static const uint8_t session_amqp_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
/* Older headers RabbitMQ also answers (0-9 and 0-8): passed on as they are,
 * so the broker decides exactly as it would without the proxy. */
static const uint8_t session_legacy_headers[2][8] = {{'A', 'M', 'Q', 'P', 1, 1, 0, 9},
						     {'A', 'M', 'Q', 'P', 1, 1, 8, 0}};
static atomic_ullong session_next_id;

/* Everything that happens to a session from outside its own call stack:
 * transport callbacks, its timer, a completion. Each enters through
 * session_event, which applies the lifetime rule (session_accepts). */
enum session_event {
	SEV_READ,      /* a leg has new input */
	SEV_DRAINED,   /* a leg's output fell to its low mark */
	SEV_CONNECTED, /* the broker leg's connect finished */
	SEV_END,       /* a leg's peer closed (err 0) or its socket failed */
	SEV_SILENT,    /* a leg heard nothing for two heartbeat intervals */
	SEV_TIMER,     /* the session's timer: connect, handshake or close wait */
	SEV_RULES,     /* the worker swapped in a new rules set */
};

static void session_read_cb(struct transport *tr, void *arg);
static void session_write_cb(struct transport *tr, void *arg);
static void session_event_cb(struct transport *tr, int what, int err, void *arg);
static void session_event(struct session *s, struct leg *l, enum session_event ev, int err);
static int session_pump(struct session *s, struct leg *from);
static void session_forward(struct session *s, struct leg *from, size_t len);

static struct leg *session_other(struct session *s, struct leg *l)
{
	return l == &s->client ? &s->upstream : &s->client;
}

static const char *session_leg_name(struct session *s, struct leg *l)
{
	return l == &s->client ? "client" : "broker";
}

struct evbuffer *session_out(struct session *s, enum chan_dir dir)
{
	struct leg *to = dir == DIR_TO_BROKER ? &s->upstream : &s->client;

	return to->tr ? transport_output(to->tr) : NULL;
}

const struct rules_vhost *session_rules(struct session *s)
{
	struct rules *r = s->w->rules;

	if (r == NULL)
		return NULL;
	if (s->rules_generation != r->generation) {
		s->rules = rules_vhost(r, s->vhost);
		s->rules_generation = r->generation;
	}
	return s->rules;
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

	if (s->vhost_counted)
		limits_vhost_leave(s->vhost);
	pipeline_detach(s);
	for (i = 0; i < s->nchans; i++)
		channel_free(s->chans[i]);
	free(s->chans);
	if (s->timer)
		event_free(s->timer);
	greeting_free(s->greeting);
	s->w->stats.connections_closed++;
	worker_session_remove(s->w, s);
	free(s);
}

/* Lifetimes. Code on the stack of an event may end the session (a close, a
 * lost leg); the memory stays until the outermost event returns, so no
 * caller ever touches freed memory, and every event after the end finds the
 * session GONE (session_accepts). */
static void session_enter(struct session *s)
{
	s->depth++;
}

static void session_leave(struct session *s)
{
	if (--s->depth == 0 && s->state == SESSION_GONE)
		session_destroy(s);
}

static void session_set_state(struct session *s, enum session_state st);

/* The session is finished: both sockets close now, and the memory goes
 * when the current event returns. From here on every event and every
 * completion finds it gone. */
static void session_end(struct session *s)
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

static int session_connect_next(struct session *s);
static void session_shut(struct session *s, uint16_t code, const char *text);

/* The proxy greeted the client and no broker took the connection: the
 * client, waiting for open-ok, is told why. */
static void session_greeting_failed(struct session *s, uint16_t code, const char *text)
{
	session_log(s, LOG_WARNING, "refused: %s", text);
	greeting_free(s->greeting);
	s->greeting = NULL;
	session_shut(s, code, text);
}

/* No broker address answered. */
static void session_unreachable(struct session *s)
{
	char text[256];

	if (s->greeting == NULL) {
		session_end(s);
		return;
	}
	snprintf(text, sizeof(text), "CONNECTION_FORCED - no broker for vhost '%s' answers",
		 s->vhost);
	session_greeting_failed(s, REPLY_CONNECTION_FORCED, text);
}

static void session_timer(struct session *s)
{
	switch (s->state) {
	case SESSION_CONNECTING:
		session_log(s, LOG_WARNING, "broker %s not reached within %ld ms",
			    upstream_node(s->upstream_at)->name,
			    worker_settings.connect_timeout_ms);
		s->w->stats.upstream_failures++;
		if (session_connect_next(s) == 0)
			return; /* the next broker address */
		session_unreachable(s);
		return;
	case SESSION_HEADER:
	case SESSION_HANDSHAKE:
		session_log(s, LOG_WARNING, "handshake not finished within %ld ms",
			    worker_settings.handshake_timeout_ms);
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

static void session_timer_set(struct session *s, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	evtimer_add(s->timer, &tv);
}

/* The one place the state changes. */
static void session_set_state(struct session *s, enum session_state st)
{
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
static void session_leg_finish(struct session *s, struct leg *l)
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
static int session_reap(struct session *s)
{
	if (s->client.tr == NULL && s->upstream.tr == NULL) {
		session_end(s);
		return 1;
	}
	return 0;
}

static void session_flush_and_go(struct session *s)
{
	if (s->state != SESSION_FLUSHING)
		session_set_state(s, SESSION_FLUSHING);
	session_leg_finish(s, &s->client);
	session_leg_finish(s, &s->upstream);
	session_reap(s);
}

/* The proxy closes the session itself (session_close from inside). */
static void session_shut(struct session *s, uint16_t code, const char *text)
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
		method_write_connection_close(out, REPLY_CONNECTION_FORCED,
					      "CONNECTION_FORCED - client closed by proxy", 0,
					      0);
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
static void session_channel_shut(struct session *s, struct channel *ch)
{
	if (ch->open && s->nopen > 0)
		s->nopen--;
	channel_reset(ch);
	ch->open = 0;
}

/* A limit refuses what the client asked for: connection.close 530 with the
 * reason, as the broker words its own limits; logged once per episode. */
static void session_refuse(struct session *s, enum limits_reason r, const struct frame_info *fi)
{
	char text[256];

	if (r == LIMITS_MAX_CHANNELS) {
		snprintf(text, sizeof(text),
			 "NOT_ALLOWED - number of channels opened (%u) has reached the proxy's "
			 "max_channels (%ld)",
			 s->nopen, limits_max_channels());
		s->w->stats.refused_max_channels++;
	} else {
		snprintf(text, sizeof(text),
			 "NOT_ALLOWED - connection limit (%ld) for vhost '%s' reached "
			 "(max_connections_per_vhost)",
			 limits_max_per_vhost(), s->vhost);
		s->w->stats.refused_max_connections_per_vhost++;
	}
	limits_refused(r, text);
	session_log(s, LOG_DEBUG, "refused: %s", text);
	if (s->client.tr && s->closable)
		method_write_connection_close(transport_output(s->client.tr), REPLY_NOT_ALLOWED,
					      text, fi->class_id, fi->method_id);
	s->closable = 0; /* written: session_shut adds none */
	session_shut(s, REPLY_NOT_ALLOWED, text);
}

/* A frame from the client broke the protocol. */
static void session_protocol_error(struct session *s, uint16_t code, const char *why,
				   uint16_t class_id, uint16_t method_id)
{
	char text[256];

	if (!s->logged_error) {
		session_log(s, LOG_WARNING, "protocol error %u: %s", code, why);
		s->logged_error = 1;
	}
	s->w->stats.protocol_errors++;
	if (strstr(why, " - ") != NULL)
		snprintf(text, sizeof(text), "%s", why);
	else
		snprintf(text, sizeof(text), "%s - %s",
			 code == REPLY_FRAME_ERROR        ? "FRAME_ERROR"
			 : code == REPLY_UNEXPECTED_FRAME ? "UNEXPECTED_FRAME"
			 : code == REPLY_CHANNEL_ERROR    ? "CHANNEL_ERROR"
			 : code == REPLY_SYNTAX_ERROR     ? "SYNTAX_ERROR"
			 : code == REPLY_NOT_ALLOWED      ? "NOT_ALLOWED"
							  : "INTERNAL_ERROR",
			 why);
	if (s->client.tr && s->closable)
		method_write_connection_close(transport_output(s->client.tr), code, text,
					      class_id, method_id);
	s->closable = 0; /* the close is written: session_shut adds none */
	session_shut(s, code, text);
}

static void session_leg_setup(struct session *s, struct leg *l, struct transport *tr,
			      enum chan_dir dir)
{
	l->tr = tr;
	l->s = s;
	l->dir = dir;
	transport_setcb(tr, session_read_cb, session_write_cb, session_event_cb, l);
	transport_set_read_high(tr, (size_t)worker_settings.buffer_limit);
	transport_set_write_low(tr, (size_t)worker_settings.buffer_limit / 2);
}

static void session_nodelay(evutil_socket_t fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void session_format_peer(char *out, size_t len, const struct sockaddr *sa)
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
	s->timer = evtimer_new(w->base, session_timer_cb, s);
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
	if (tr == NULL || s->timer == NULL) {
		if (tr)
			transport_free(tr);
		else if (fd >= 0)
			evutil_closesocket(fd);
		if (s->timer)
			event_free(s->timer);
		free(s);
		return NULL;
	}
	worker_session_add(w, s);
	w->stats.connections_accepted++;
	session_leg_setup(s, &s->client, tr, DIR_TO_BROKER);
	session_set_state(s, SESSION_HEADER);
	session_timer_set(s, worker_settings.handshake_timeout_ms);
	transport_read_enable(tr);
	session_log(s, LOG_DEBUG, "accepted");
	return s;
}

/* TLS to the broker: SNI and the name verified are upstream_tls_name, or
 * the host of the address. */
static int session_upstream_tls(struct session *s, struct transport *tr,
				const struct upstream_node *n)
{
	char host[256];
	int port;
	SSL *ssl;

	if (tls_upstream_name())
		snprintf(host, sizeof(host), "%s", tls_upstream_name());
	else if (config_addr_split(n->name, host, sizeof(host), &port) != 0)
		return -1;
	ssl = tls_client_new(host);
	if (ssl == NULL || transport_tls(tr, ssl) != 0) {
		SSL_free(ssl);
		return -1;
	}
	return 0;
}

/* Connect the broker leg to the next broker address this client has not
 * tried (a node that just failed comes last). The client has sent only
 * its header, which is queued again: a failover is invisible to it. */
static int session_connect_upstream(struct session *s)
{
	struct transport *(*connect)(struct event_base *, const struct sockaddr *, int) =
	    worker_settings.connect ? worker_settings.connect : transport_connect;
	struct transport *tr = NULL;
	const struct upstream_node *n;
	int i;

	while (tr == NULL && (i = upstream_pick(s->upstreams.n ? &s->upstreams : NULL,
						s->upstream_tried)) >= 0) {
		n = upstream_node(i);
		s->upstream_tried |= 1u << i;
		s->upstream_at = i;
		tr = connect(s->w->base, (const struct sockaddr *)&n->sa, n->salen);
		if (tr && tls_upstream() && session_upstream_tls(s, tr, n) != 0) {
			transport_free(tr);
			tr = NULL;
			errno = EPROTO;
		}
		if (tr == NULL) {
			session_log(s, LOG_WARNING, "cannot connect to broker %s: %s", n->name,
				    strerror(errno));
			s->w->stats.upstream_failures++;
			upstream_failed(i);
		}
	}
	if (tr == NULL)
		return -1;
	session_leg_setup(s, &s->upstream, tr, DIR_TO_CLIENT);
	session_set_state(s, SESSION_CONNECTING);
	/* The header is queued now and sent once connected; before it, the
	 * client's real address for the broker when asked for. */
	if (worker_settings.upstream_proxy_protocol) {
		uint8_t pp[PROXYPROTO_V2_MAX];
		size_t pplen = proxyproto_write_v2(
		    pp, s->peer_salen ? (struct sockaddr *)&s->peer_sa : NULL,
		    s->local_salen ? (struct sockaddr *)&s->local_sa : NULL);

		evbuffer_add(transport_output(tr), pp, pplen);
	}
	evbuffer_add(transport_output(tr), s->header, sizeof(s->header));
	transport_read_enable(tr);
	return 0;
}

/* The broker address being tried failed: the next one, if any. */
static int session_connect_next(struct session *s)
{
	upstream_failed(s->upstream_at);
	if (s->upstream.tr) {
		transport_free(s->upstream.tr);
		s->upstream.tr = NULL;
	}
	memset(&s->upstream, 0, sizeof(s->upstream));
	return session_connect_upstream(s);
}

#define SESSION_PROXY_HEADER_MAX 4096 /* a v2 header's TLVs beyond this are refused */

/* A load balancer's PROXY header, before the AMQP one: the client's real
 * address. Returns 0 to go on, 1 to wait for more, -1 if s is gone. */
static int session_proxy_header(struct session *s, struct evbuffer *in)
{
	size_t len = evbuffer_get_length(in), used = 0;
	struct proxyproto_addr a;
	const uint8_t *p;
	int rc;

	if (len > SESSION_PROXY_HEADER_MAX)
		len = SESSION_PROXY_HEADER_MAX;
	p = evbuffer_pullup(in, (ev_ssize_t)len);
	rc = p ? proxyproto_parse(p, len, &used, &a) : PROXYPROTO_ERROR;
	if (rc == PROXYPROTO_AGAIN && len < SESSION_PROXY_HEADER_MAX)
		return 1;
	if (rc != PROXYPROTO_OK) {
		session_log(s, LOG_WARNING,
			    "refused: no PROXY protocol header "
			    "(proxy_protocol is on)");
		s->w->stats.refused_proxy_protocol++;
		session_end(s);
		return -1;
	}
	evbuffer_drain(in, used);
	s->proxied = 1;
	if (!a.local) {
		char was[sizeof(s->peer)];

		memcpy(was, s->peer, sizeof(was));
		memcpy(&s->peer_sa, &a.src, a.srclen);
		s->peer_salen = a.srclen;
		memcpy(&s->local_sa, &a.dst, a.dstlen);
		s->local_salen = a.dstlen;
		session_format_peer(s->peer, sizeof(s->peer), (struct sockaddr *)&a.src);
		session_log(s, LOG_DEBUG, "PROXY header: the client is %s (via %s)", s->peer,
			    was);
	}
	return 0;
}

/* The client's protocol header. Returns 0 to go on, -1 if s is gone. */
static int session_header(struct session *s)
{
	struct evbuffer *in = transport_input(s->client.tr);
	uint8_t hdr[8];
	int rc;

	if (worker_settings.proxy_protocol && !s->proxied &&
	    (rc = session_proxy_header(s, in)) != 0)
		return rc;
	if (evbuffer_get_length(in) < sizeof(hdr))
		return 1;
	evbuffer_copyout(in, hdr, sizeof(hdr));
	if (memcmp(hdr, session_amqp_header, sizeof(hdr)) != 0 &&
	    memcmp(hdr, session_legacy_headers[0], sizeof(hdr)) != 0 &&
	    memcmp(hdr, session_legacy_headers[1], sizeof(hdr)) != 0) {
		session_log(s, LOG_WARNING, "not an AMQP 0-9-1 protocol header");
		s->w->stats.connections_refused++;
		evbuffer_add(transport_output(s->client.tr), session_amqp_header,
			     sizeof(session_amqp_header));
		s->client.done = 1;
		session_flush_and_go(s);
		return -1;
	}
	evbuffer_drain(in, sizeof(hdr));
	memcpy(s->header, hdr, sizeof(hdr));
	if (s->w->rules && s->w->rules->any_upstream) {
		/* The broker depends on the vhost, named only at
		 * connection.open: the proxy greets the client itself. */
		s->greeting = greeting_new();
		if (s->greeting == NULL ||
		    greeting_start(s->greeting, transport_output(s->client.tr)) != 0) {
			session_end(s);
			return -1;
		}
		s->started = 1;
		/* Its own handshake: a refusal says why, also before tune-ok. */
		s->closable = 1;
		session_set_state(s, SESSION_HANDSHAKE);
		return 0;
	}
	if (session_connect_upstream(s) != 0) {
		session_end(s);
		return -1;
	}
	return 0;
}

/* ---- frames the proxy looks at ---------------------------------------- */

static void session_leg_tune(struct session *s, struct leg *l)
{
	size_t room = (size_t)s->frame_max + 4096;

	if (l->tr == NULL)
		return;
	if (room < (size_t)worker_settings.buffer_limit)
		room = (size_t)worker_settings.buffer_limit;
	transport_set_read_high(l->tr, room);
	/* A peer is dead after two missed heartbeat intervals. */
	transport_set_read_timeout(l->tr, 2000L * s->heartbeat);
}

/* The client's tuning is known: frame_max and heartbeats apply to both
 * legs (the broker leg may come later: session_leg_tune). */
static void session_tuned(struct session *s, const amqp_connection_tune_ok_t *t)
{
	s->channel_max = t->channel_max ? t->channel_max : 65535;
	s->frame_max = t->frame_max          ? t->frame_max
		       : s->broker_frame_max ? s->broker_frame_max
					     : SESSION_FRAME_MAX_UNLIMITED;
	s->heartbeat = t->heartbeat;
	session_leg_tune(s, &s->client);
	/* Until tune-ok the broker meets a protocol error by closing the
	 * socket without a word; from here on it says connection.close. */
	s->closable = 1;
	session_leg_tune(s, &s->upstream);
}

static void session_start_ok(struct session *s, const amqp_connection_start_ok_t *m)
{
	const char *resp = m->response.bytes;
	size_t len = m->response.len, i, start;

	if (m->mechanism.len == 5 && memcmp(m->mechanism.bytes, "PLAIN", 5) == 0) {
		/* authzid NUL authcid NUL password: keep the authcid only. */
		for (i = 0; i < len && resp[i]; i++)
			;
		start = i + 1;
		for (i = start; i < len && resp[i]; i++)
			;
		if (start < len && i - start < sizeof(s->user))
			snprintf(s->user, sizeof(s->user), "%.*s", (int)(i - start),
				 resp + start);
	} else if (m->mechanism.len) {
		snprintf(s->user, sizeof(s->user), "(%.*s)", (int)m->mechanism.len,
			 (const char *)m->mechanism.bytes);
	}
}

/* connection.open names the vhost: its limit, its rules. 0, or -1 when
 * refused (the session is closing). */
static int session_opening(struct session *s, const amqp_connection_open_t *o,
			   const struct frame_info *fi)
{
	snprintf(s->vhost, sizeof(s->vhost), "%.*s", (int)o->virtual_host.len,
		 (const char *)o->virtual_host.bytes);
	if (limits_vhost_enter(s->vhost) != 0) {
		session_refuse(s, LIMITS_MAX_CONNECTIONS_PER_VHOST, fi);
		return -1;
	}
	s->vhost_counted = limits_max_per_vhost() > 0;
	pipeline_attach(s);
	return 0;
}

/* The proxy greets the client: its start-ok, tune-ok and open are taken
 * here (and kept for the broker), its close answered. 0, or -1 when the
 * session closed. */
static int session_greet_client(struct session *s, const struct frame_info *fi,
				amqp_method_number_t id, void *m)
{
	struct evbuffer *in = transport_input(s->client.tr);
	struct evbuffer *out = transport_output(s->client.tr);
	const struct rules_vhost *v;
	size_t len = frame_scan_wire_len(fi);
	int rc = -1;

	switch (id) {
	case AMQP_CONNECTION_START_OK_METHOD:
		session_start_ok(s, m);
		rc = greeting_start_ok(s->greeting, m, in, len, out);
		break;
	case AMQP_CONNECTION_TUNE_OK_METHOD:
		rc = greeting_tune_ok(s->greeting, m, in, len);
		if (rc == 0) {
			amqp_connection_tune_ok_t t = {s->greeting->channel_max,
						       s->greeting->frame_max,
						       s->greeting->heartbeat};

			session_tuned(s, &t);
		}
		break;
	case AMQP_CONNECTION_OPEN_METHOD:
		if (s->greeting->phase != GREETING_OPENING)
			break;
		if (session_opening(s, m, fi) != 0)
			return -1;
		if (greeting_open(s->greeting, in, len) != 0)
			break;
		v = session_rules(s);
		if (v)
			s->upstreams = v->upstream;
		/* The client's next frames wait for the broker's open-ok. */
		session_hold(s, DIR_TO_BROKER);
		if (session_connect_upstream(s) != 0) {
			session_unreachable(s);
			return -1;
		}
		return 0;
	case AMQP_CONNECTION_CLOSE_METHOD:
		/* The client gives up before a broker was chosen. */
		evbuffer_drain(in, len);
		method_write(out, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
			     &(amqp_connection_close_ok_t){0});
		s->client.done = 1;
		session_flush_and_go(s);
		return -1;
	default:
		break;
	}
	if (rc == 0)
		return 0;
	session_protocol_error(s, REPLY_COMMAND_INVALID,
			       id == AMQP_CONNECTION_START_OK_METHOD
				   ? "COMMAND_INVALID - connection.start-ok out of order, or a "
				     "mechanism other than PLAIN and AMQPLAIN"
				   : "COMMAND_INVALID - connection method out of order",
			       fi->class_id, fi->method_id);
	return -1;
}

/* The broker chosen for a greeted client: its start and tune are
 * answered with what the client said; its open-ok ends the greeting and
 * goes to the client, as does a connection.close. 0, or -1 when the
 * session closed. */
static int session_greet_broker(struct session *s, const struct frame_info *fi,
				amqp_method_number_t id, void *m)
{
	struct evbuffer *in = transport_input(s->upstream.tr);
	struct evbuffer *out = transport_output(s->upstream.tr);
	size_t len = frame_scan_wire_len(fi);
	char why[256];
	int code;

	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
		greeting_learn(&((amqp_connection_start_t *)m)->server_properties);
		evbuffer_drain(in, len);
		if (greeting_broker_start(s->greeting, out) == 0)
			return 0;
		snprintf(why, sizeof(why), "connection.start out of order");
		break;
	case AMQP_CONNECTION_TUNE_METHOD:
		evbuffer_drain(in, len);
		s->broker_frame_max = ((amqp_connection_tune_t *)m)->frame_max;
		code = greeting_broker_tune(s->greeting, m, out, why, sizeof(why));
		if (code == 0)
			return 0;
		if (code == REPLY_CONNECTION_FORCED)
			s->w->stats.upstream_failures++; /* the broker's fault */
		session_greeting_failed(s, (uint16_t)code, why);
		return -1;
	case AMQP_CONNECTION_OPEN_OK_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
		/* Open, or refused (credentials, vhost): the client has its
		 * answer, and from here frames pass as they do for any. */
		greeting_free(s->greeting);
		s->greeting = NULL;
		if (id == AMQP_CONNECTION_OPEN_OK_METHOD) {
			session_leg_tune(s, &s->upstream);
			session_set_state(s, SESSION_OPEN);
			session_log(s, LOG_INFO,
				    "open frame_max=%u channel_max=%u heartbeat=%u",
				    s->frame_max, s->channel_max, s->heartbeat);
		} else {
			s->close_seen = 1;
		}
		session_forward(s, &s->upstream, len);
		session_unhold(s, DIR_TO_BROKER);
		return 0;
	default:
		snprintf(why, sizeof(why), "broker sent method %u.%u during the handshake",
			 fi->class_id, fi->method_id);
		break;
	}
	session_log(s, LOG_WARNING, "broker handshake failed: %s", why);
	s->w->stats.upstream_failures++;
	session_greeting_failed(s, REPLY_CONNECTION_FORCED,
				"CONNECTION_FORCED - the broker's handshake went wrong");
	return -1;
}

/* Forward the frame at the front of from's input, unchanged. */
static void session_forward(struct session *s, struct leg *from, size_t len)
{
	struct evbuffer *in = transport_input(from->tr);
	struct evbuffer *out = session_out(s, from->dir);

	if (from->dir == DIR_TO_BROKER)
		s->w->stats.bytes_to_broker += len;
	else
		s->w->stats.bytes_to_client += len;
	if (out)
		evbuffer_remove_buffer(in, out, len);
	else
		evbuffer_drain(in, len);
}

void session_channel_error(struct session *s, struct channel *ch, uint16_t code,
			   const char *text, uint16_t class_id, uint16_t method_id)
{
	struct evbuffer *to_client = session_out(s, DIR_TO_CLIENT);
	struct evbuffer *to_broker = session_out(s, DIR_TO_BROKER);

	if (ch->proxy_closing)
		return;
	/* The client in the middle of a publish on it: a channel.close to the
	 * broker would be a frame out of order, so the connection goes. */
	if (ch->content[DIR_TO_BROKER].expect != EXPECT_METHOD) {
		session_shut(s, code, text);
		return;
	}
	if (to_client)
		method_write_channel_close(to_client, ch->id, code, text, class_id, method_id);
	/* The broker's side of the channel is closed too; its close-ok is
	 * dropped on the way back. */
	if (to_broker)
		method_write_channel_close(to_broker, ch->id, code, text, class_id, method_id);
	ch->proxy_closing =
	    (to_client ? CHAN_CLOSING_CLIENT : 0) | (to_broker ? CHAN_CLOSING_BROKER : 0);
}

/* Decide what a delivery-like method means for tags and hooks. The method
 * frame is at the front of from's input. */
static int session_content_method(struct session *s, struct leg *from, struct channel *ch,
				  const struct frame_info *fi, amqp_method_number_t id,
				  void *decoded)
{
	enum pipe_kind kind;
	struct pipe_msg *m;
	struct evbuffer *in = transport_input(from->tr);
	size_t len = frame_scan_wire_len(fi);
	int want, per_hook[PIPELINE_MAX_HOOKS];

	switch (id) {
	case AMQP_BASIC_PUBLISH_METHOD:
		kind = PIPE_PUBLISH;
		break;
	case AMQP_BASIC_DELIVER_METHOD:
		kind = PIPE_DELIVER;
		break;
	case AMQP_BASIC_GET_OK_METHOD:
		kind = PIPE_GET_OK;
		break;
	default:
		kind = PIPE_RETURN;
		break;
	}
	want = pipeline_wants(s, ch, kind, id, decoded, per_hook);
	if (want) {
		m = pipe_msg_new(kind, ch->id);
		if (m == NULL) {
			session_shut(s, 541, "INTERNAL_ERROR - out of memory");
			return -1;
		}
		m->want = want;
		memcpy(m->hook_want, per_hook, sizeof(per_hook));
		if (kind == PIPE_DELIVER) {
			amqp_basic_deliver_t *d = decoded;

			m->broker_tag = d->delivery_tag;
			m->no_ack = channel_consumer_no_ack(ch, d->consumer_tag.bytes,
							    d->consumer_tag.len);
		} else if (kind == PIPE_GET_OK) {
			m->broker_tag = ((amqp_basic_get_ok_t *)decoded)->delivery_tag;
			m->no_ack = ch->get_no_ack;
		}
		ch->content[from->dir].msg = m;
		ch->content[from->dir].expect = EXPECT_HEADER;
		s->w->stats.messages_assembled++;
		if (pipeline_collect(s, ch, m, in, len, FRAME_METHOD) != PIPE_COLLECT_OK) {
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return -1;
		}
		return 0;
	}
	/* Streams through; only the tag and confirm numbering change. */
	if (!s->track) {
		/* nothing is renumbered */
	} else if (kind == PIPE_PUBLISH) {
		if (ch->confirm_mode)
			confirmmap_forward(&ch->confirms);
	} else if (kind == PIPE_DELIVER || kind == PIPE_GET_OK) {
		uint64_t *tagp;
		int no_ack;

		if (kind == PIPE_DELIVER) {
			amqp_basic_deliver_t *d = decoded;

			tagp = &d->delivery_tag;
			no_ack = channel_consumer_no_ack(ch, d->consumer_tag.bytes,
							 d->consumer_tag.len);
		} else {
			amqp_basic_get_ok_t *g = decoded;

			tagp = &g->delivery_tag;
			no_ack = ch->get_no_ack;
		}
		uint64_t client = tagmap_deliver(&ch->tags, *tagp, !no_ack);
		if (client != *tagp) {
			/* Encode before draining: the decoded strings point into in. */
			*tagp = client;
			method_write(session_out(s, DIR_TO_CLIENT), ch->id, id, decoded);
			evbuffer_drain(in, len);
			return 0;
		}
	}
	session_forward(s, from, len);
	return 0;
}

/* A method frame the proxy must read. It is at the front of from's input.
 * Returns 0 to go on, -1 if the session closed. */
static int session_method(struct session *s, struct leg *from, const struct frame_info *fi,
			  struct channel *ch)
{
	struct evbuffer *in = transport_input(from->tr);
	size_t len = frame_scan_wire_len(fi);
	amqp_pool_t *pool = &s->w->pool;
	amqp_method_number_t id;
	void *m = NULL;
	int rc, hooks = s->nhooks > 0, track = s->track, to_broker = from->dir == DIR_TO_BROKER;

	rc = method_decode_evbuffer(in, fi->size, pool, &id, &m);
	if (rc != 0) {
		recycle_amqp_pool(pool);
		if (to_broker) {
			session_protocol_error(s, REPLY_SYNTAX_ERROR,
					       "method arguments do not decode", fi->class_id,
					       fi->method_id);
			return -1;
		}
		session_forward(s, from, len); /* the broker's; pass it on */
		return 0;
	}
	if (s->greeting && fi->channel == 0) {
		rc = to_broker ? session_greet_client(s, fi, id, m)
			       : session_greet_broker(s, fi, id, m);
		recycle_amqp_pool(pool);
		return rc;
	}
	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
		/* Learned for greeted clients, when the rules make some. */
		if (s->w->rules && s->w->rules->any_upstream)
			greeting_learn(&((amqp_connection_start_t *)m)->server_properties);
		s->started = 1;
		session_set_state(s, SESSION_HANDSHAKE);
		break;
	case AMQP_CONNECTION_START_OK_METHOD:
		session_start_ok(s, m);
		break;
	case AMQP_CONNECTION_TUNE_METHOD:
		s->broker_frame_max = ((amqp_connection_tune_t *)m)->frame_max;
		break;
	case AMQP_CONNECTION_TUNE_OK_METHOD:
		session_tuned(s, m);
		session_set_state(s, SESSION_OPEN);
		break;
	case AMQP_CONNECTION_OPEN_METHOD:
		if (session_opening(s, m, fi) != 0) {
			recycle_amqp_pool(pool);
			return -1;
		}
		break;
	case AMQP_CONNECTION_OPEN_OK_METHOD:
		session_log(s, LOG_INFO, "open frame_max=%u channel_max=%u heartbeat=%u",
			    s->frame_max, s->channel_max, s->heartbeat);
		break;
	case AMQP_CONNECTION_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_OK_METHOD:
		s->close_seen = 1;
		break;
	case AMQP_CHANNEL_OPEN_METHOD:
		if (ch && to_broker && !ch->open && limits_max_channels() > 0 &&
		    s->nopen >= (unsigned)limits_max_channels()) {
			session_refuse(s, LIMITS_MAX_CHANNELS, fi);
			recycle_amqp_pool(pool);
			return -1;
		}
		if (ch) {
			session_channel_shut(s, ch);
			if (to_broker) {
				ch->open = 1;
				s->nopen++;
			}
		}
		break;
	case AMQP_CHANNEL_CLOSE_OK_METHOD:
		if (ch) {
			pipeline_channel_closed(s, ch);
			session_channel_shut(s, ch);
		}
		break;
	case AMQP_CONFIRM_SELECT_METHOD:
		if (ch)
			ch->confirm_mode = 1;
		break;
	default:
		break;
	}
	if (ch && hooks) {
		switch (id) {
		case AMQP_BASIC_PUBLISH_METHOD:
		case AMQP_BASIC_DELIVER_METHOD:
		case AMQP_BASIC_GET_OK_METHOD:
		case AMQP_BASIC_RETURN_METHOD:
			rc = session_content_method(s, from, ch, fi, id, m);
			recycle_amqp_pool(pool);
			return rc;
		case AMQP_BASIC_ACK_METHOD:
		case AMQP_BASIC_NACK_METHOD:
		case AMQP_BASIC_REJECT_METHOD:
			if (!track)
				break;
			if (to_broker) {
				uint64_t tag = id == AMQP_BASIC_ACK_METHOD
						   ? ((amqp_basic_ack_t *)m)->delivery_tag
					       : id == AMQP_BASIC_NACK_METHOD
						   ? ((amqp_basic_nack_t *)m)->delivery_tag
						   : ((amqp_basic_reject_t *)m)->delivery_tag;
				int multiple = id == AMQP_BASIC_ACK_METHOD
						   ? ((amqp_basic_ack_t *)m)->multiple
					       : id == AMQP_BASIC_NACK_METHOD
						   ? ((amqp_basic_nack_t *)m)->multiple
						   : 0;

				/* A hook may need the settle to wait (the frame
				 * stays in the input and is read again). */
				if (pipeline_settle_gate(s, ch, id, tag, multiple)) {
					recycle_amqp_pool(pool);
					return 0;
				}
				evbuffer_drain(in, len);
				settle_client(s, ch, id, m);
				recycle_amqp_pool(pool);
				return 0;
			}
			if (ch->confirm_mode) {
				evbuffer_drain(in, len);
				settle_broker_confirm(s, ch, id, m);
				recycle_amqp_pool(pool);
				return 0;
			}
			break;
		case AMQP_BASIC_CONSUME_METHOD: {
			amqp_basic_consume_t *c = m;

			ch->consume_no_ack = c->no_ack;
			channel_set_str(&ch->consume_queue, c->queue.bytes, c->queue.len);
			if (c->consumer_tag.len)
				channel_consumer_add(ch, c->consumer_tag.bytes,
						     c->consumer_tag.len, c->no_ack,
						     ch->consume_queue);
			break;
		}
		case AMQP_BASIC_CONSUME_OK_METHOD: {
			amqp_basic_consume_ok_t *c = m;

			channel_consumer_remove(ch, c->consumer_tag.bytes, c->consumer_tag.len);
			channel_consumer_add(ch, c->consumer_tag.bytes, c->consumer_tag.len,
					     ch->consume_no_ack, ch->consume_queue);
			break;
		}
		case AMQP_BASIC_CANCEL_OK_METHOD: {
			amqp_basic_cancel_ok_t *c = m;

			channel_consumer_remove(ch, c->consumer_tag.bytes, c->consumer_tag.len);
			break;
		}
		case AMQP_BASIC_GET_METHOD: {
			amqp_basic_get_t *g = m;

			ch->get_no_ack = g->no_ack;
			channel_set_str(&ch->get_queue, g->queue.bytes, g->queue.len);
			break;
		}
		case AMQP_BASIC_RECOVER_METHOD:
		case AMQP_BASIC_RECOVER_ASYNC_METHOD:
			/* The broker redelivers everything unacked, with new tags. */
			pipeline_recovered(s, ch);
			tagmap_reset(&ch->tags);
			break;
		default:
			break;
		}
	}
	recycle_amqp_pool(pool);
	session_forward(s, from, len);
	return 0;
}

/* Which methods the proxy reads; every other one, including methods newer
 * than the codec (connection.update-secret), passes untouched and the
 * broker judges it. */
static int session_reads(const struct session *s, amqp_method_number_t id)
{
	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
	case AMQP_CONNECTION_START_OK_METHOD:
	case AMQP_CONNECTION_TUNE_METHOD:
	case AMQP_CONNECTION_TUNE_OK_METHOD:
	case AMQP_CONNECTION_OPEN_METHOD:
	case AMQP_CONNECTION_OPEN_OK_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_OK_METHOD:
	case AMQP_CHANNEL_OPEN_METHOD:
	case AMQP_CHANNEL_CLOSE_OK_METHOD:
	case AMQP_CONFIRM_SELECT_METHOD:
		return 1;
	/* Rewrite-only hooks see content methods; acks, consumes and gets
	 * matter only when tags are translated. */
	case AMQP_BASIC_PUBLISH_METHOD:
	case AMQP_BASIC_DELIVER_METHOD:
	case AMQP_BASIC_GET_OK_METHOD:
	case AMQP_BASIC_RETURN_METHOD:
		return s->nhooks > 0;
	case AMQP_BASIC_ACK_METHOD:
	case AMQP_BASIC_NACK_METHOD:
	case AMQP_BASIC_REJECT_METHOD:
	case AMQP_BASIC_CONSUME_METHOD:
	case AMQP_BASIC_CONSUME_OK_METHOD:
	case AMQP_BASIC_CANCEL_OK_METHOD:
	case AMQP_BASIC_GET_METHOD:
	case AMQP_BASIC_RECOVER_METHOD:
	case AMQP_BASIC_RECOVER_ASYNC_METHOD:
		return s->nhooks > 0 && s->track;
	default:
		return 0;
	}
}

/* Does this frame need more than a byte move? Validates content order on
 * the client's side as it goes. Returns 1 to look, 0 to move, -1 on a
 * protocol error (session closing). */
static int session_classify(struct session *s, struct leg *from, const struct frame_info *fi,
			    struct channel **chp)
{
	struct channel *ch = NULL;
	struct chan_error err;
	int code = 0, to_broker = from->dir == DIR_TO_BROKER;
	uint16_t cls;
	uint64_t body_size;

	*chp = NULL;
	if (fi->type == FRAME_HEARTBEAT)
		return 0;
	if (fi->channel == 0) {
		if (fi->type != FRAME_METHOD) {
			if (!to_broker)
				return 0;
			session_protocol_error(s, REPLY_UNEXPECTED_FRAME,
					       "content frame on channel 0", 0, 0);
			return -1;
		}
		return s->greeting ? 1
				   : session_reads(s, METHOD_ID(fi->class_id, fi->method_id));
	}
	if (s->state < SESSION_OPEN && to_broker) {
		session_protocol_error(s, REPLY_UNEXPECTED_FRAME,
				       "channel frame before the connection is tuned",
				       fi->class_id, fi->method_id);
		return -1;
	}
	/* Like the broker, the proxy bounds how many channels are open (the
	 * broker counts them), not which numbers they have. */
	ch = session_channel(s, fi->channel);
	if (ch == NULL) {
		session_shut(s, 541, "INTERNAL_ERROR - out of memory");
		return -1;
	}
	*chp = ch;
	if (ch->proxy_closing)
		return 1;
	if (fi->type == FRAME_METHOD) {
		amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);

		if (to_broker || ch->content[from->dir].msg) {
			code = channel_content_method(ch, from->dir, id, method_has_content(id),
						      &err);
			if (code)
				goto bad;
		}
		return session_reads(s, id);
	}
	if (!to_broker && !ch->content[from->dir].msg)
		return 0;
	if (fi->type == FRAME_HEADER) {
		content_header_peek(fi->peek, &cls, &body_size);
		code = channel_content_header(ch, from->dir, cls, body_size, &err);
	} else {
		code = channel_content_body(ch, from->dir, fi->size, &err);
	}
	if (code)
		goto bad;
	return ch->content[from->dir].msg ? 1 : 0;
bad:
	if (!to_broker) {
		session_log(s, LOG_WARNING, "broker sent an out-of-order frame: %s", err.text);
		return 0;
	}
	session_protocol_error(s, (uint16_t)code, err.text, (uint16_t)(err.method >> 16),
			       (uint16_t)err.method);
	return -1;
}

/* A content frame of a message being assembled for a hook. */
static int session_content(struct session *s, struct leg *from, const struct frame_info *fi,
			   struct channel *ch)
{
	struct chan_content *c = &ch->content[from->dir];
	struct evbuffer *in = transport_input(from->tr);
	struct pipe_msg *m = c->msg;
	int rc;

	rc = pipeline_collect(s, ch, m, in, frame_scan_wire_len(fi), fi->type);
	if (rc == PIPE_COLLECT_RELEASE) {
		/* No hook wants it after all: what was collected goes on, and
		 * the body moves as it comes. */
		c->msg = NULL;
		rc = pipeline_pass(s, ch, m);
		if (rc != 0) {
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return -1;
		}
		return 0;
	}
	if (rc == PIPE_COLLECT_TOO_LARGE && from->dir == DIR_TO_BROKER) {
		session_protocol_error(s, REPLY_FRAME_ERROR,
				       "FRAME_ERROR - message larger than max_message_size", 60,
				       40);
		return -1;
	}
	if (rc != PIPE_COLLECT_OK) {
		session_log(s, LOG_ERROR, "message on channel %u could not be handled (%s)",
			    ch->id,
			    rc == PIPE_COLLECT_TOO_LARGE ? "larger than max_message_size"
							 : "a hook refused it");
		session_shut(s, 541, "INTERNAL_ERROR - the proxy could not handle a message");
		return -1;
	}
	if (c->expect == EXPECT_METHOD) {
		c->msg = NULL;
		if (pipeline_complete(s, ch, m) != 0) {
			session_log(s, LOG_ERROR,
				    "message on channel %u could not be forwarded", ch->id);
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return -1;
		}
	}
	return 0;
}

/* A frame while the proxy closes the session itself: only close and
 * close-ok matter. */
static void session_closing_frame(struct session *s, struct leg *from,
				  const struct frame_info *fi)
{
	struct evbuffer *in = transport_input(from->tr);

	if (fi->type == FRAME_METHOD && fi->channel == 0 && fi->class_id == 10 &&
	    (fi->method_id == 50 || fi->method_id == 51)) {
		if (fi->method_id == 50 && from->tr)
			method_write(transport_output(from->tr), 0,
				     AMQP_CONNECTION_CLOSE_OK_METHOD,
				     &(amqp_connection_close_ok_t){0});
		from->done = 1;
	}
	evbuffer_drain(in, frame_scan_wire_len(fi));
}

/* Frames dropped on a channel the proxy is closing itself. */
static int session_channel_closing(struct session *s, struct leg *from,
				   const struct frame_info *fi, struct channel *ch)
{
	/* Each side answers the proxy's channel.close with close-ok (or
	 * crosses it with a close of its own, which the proxy answers);
	 * everything else on the channel meanwhile is dropped, as the broker
	 * drops it. The channel is closed when both sides have answered. */
	if (fi->type == FRAME_METHOD && fi->class_id == 20 &&
	    (fi->method_id == 40 || fi->method_id == 41)) {
		/* A crossing close is answered; the peer still owes its
		 * close-ok for the proxy's close, which ends its side. */
		if (fi->method_id == 40)
			method_write(transport_output(from->tr), ch->id,
				     AMQP_CHANNEL_CLOSE_OK_METHOD,
				     &(amqp_channel_close_ok_t){0});
		else
			ch->proxy_closing &=
			    ~(from->dir == DIR_TO_CLIENT ? CHAN_CLOSING_BROKER
							 : CHAN_CLOSING_CLIENT);
		/* The client is done before the broker: its next frames (a
		 * channel.open of the same number, say) wait for the broker's
		 * close-ok instead of being dropped. */
		if (ch->proxy_closing == CHAN_CLOSING_BROKER && !ch->closing_hold) {
			ch->closing_hold = 1;
			session_hold(s, DIR_TO_BROKER);
		}
		if (!ch->proxy_closing) {
			pipeline_channel_closed(s, ch);
			session_channel_shut(s, ch);
			if (ch->closing_hold) {
				ch->closing_hold = 0;
				evbuffer_drain(transport_input(from->tr),
					       frame_scan_wire_len(fi));
				session_unhold(s, DIR_TO_BROKER);
				return from->tr ? 0 : -1;
			}
		}
	}
	evbuffer_drain(transport_input(from->tr), frame_scan_wire_len(fi));
	return 0;
}

static void session_pause(struct session *s, struct leg *from)
{
	if (!from->paused) {
		from->paused = 1;
		s->w->stats.backpressure_pauses++;
		transport_read_disable(from->tr);
	}
}

/* Move every complete frame from one leg towards the other. Returns 0, or
 * -1 when the session is gone. */
static int session_pump(struct session *s, struct leg *from)
{
	struct evbuffer *in = transport_input(from->tr);
	struct leg *to = session_other(s, from);
	struct evbuffer *out;
	size_t run = 0, limit = (size_t)worker_settings.buffer_limit;
	uint32_t max;
	unsigned long frames = 0;
	size_t out_len = 0;
	struct frame_cursor cur;
	struct frame_info fi;
	struct channel *ch;
	int rc, look, fresh = 1, slow = 0;

	if (s->state == SESSION_HEADER) {
		rc = session_header(s);
		if (rc != 0)
			return rc < 0 ? -1 : 0;
	}
	/* The client's frames wait until the broker has spoken
	 * (connection.start passed): the broker judges nothing earlier
	 * either, and events keep the order they have on the wire. */
	if (from == &s->client && !s->started)
		return 0;
	/* The cursor sits at the end of the run of untouched frames; it is
	 * set again whenever the input changes under it. */
	for (;;) {
		/* A message from this leg waits for a hook: so do the frames
		 * behind it (the close handshake never waits). */
		if (from->held && s->state < SESSION_CLOSING)
			break;
		if (fresh) {
			out = to->tr ? transport_output(to->tr) : NULL;
			out_len = out ? evbuffer_get_length(out) : 0;
			frame_cursor_init(&cur, in);
			fresh = 0;
		}
		if (out && s->state < SESSION_CLOSING && out_len + run >= limit) {
			session_pause(s, from);
			break;
		}
		/* As the broker does, a payload may be as large as frame_max
		 * itself; the proxy writes none over frame_max - 8. The broker's
		 * own frames are trusted to at least the pre-tune cap. */
		max = s->frame_max;
		if (from->dir == DIR_TO_CLIENT &&
		    max < (uint32_t)worker_settings.max_frame_pre_tune)
			max = (uint32_t)worker_settings.max_frame_pre_tune;
		rc = frame_cursor_scan(&cur, max, &fi);
		if (rc == FRAME_SCAN_AGAIN && cur.partial) {
			/* More chains than the cursor saw: move what is scanned,
			 * or scan this one frame the slow way. */
			if (run) {
				session_forward(s, from, run);
				run = 0;
				fresh = 1;
				continue;
			}
			rc = frame_scan_evbuffer(in, 0, max, &fi);
			slow = 1;
		}
		if (rc == FRAME_SCAN_AGAIN)
			break;
		if (rc == FRAME_SCAN_ERROR) {
			if (run && out)
				evbuffer_remove_buffer(in, out, run);
			if (from->dir == DIR_TO_BROKER) {
				session_protocol_error(s, fi.reply_code, fi.error, fi.class_id,
						       fi.method_id);
			} else {
				session_log(s, LOG_WARNING, "broker sent a bad frame: %s",
					    fi.error);
				s->w->stats.upstream_failures++;
				from->eof = 1;
				session_shut(s, REPLY_CONNECTION_FORCED,
					     "CONNECTION_FORCED - broker sent a bad frame");
			}
			return -1;
		}
		frames++;
		if (s->state >= SESSION_CLOSING) {
			session_closing_frame(s, from, &fi);
			fresh = 1;
			continue;
		}
		look = session_classify(s, from, &fi, &ch);
		if (look < 0)
			return -1;
		if (look == 0 && slow) {
			session_forward(s, from, frame_scan_wire_len(&fi));
			slow = 0;
			fresh = 1;
			continue;
		}
		if (look == 0) {
			run += frame_scan_wire_len(&fi);
			frame_cursor_advance(&cur, frame_scan_wire_len(&fi));
			continue;
		}
		fresh = 1;
		slow = 0;
		if (run) {
			session_forward(s, from, run);
			run = 0;
		}
		if (ch && ch->proxy_closing)
			rc = session_channel_closing(s, from, &fi, ch);
		else if (fi.type == FRAME_METHOD)
			rc = session_method(s, from, &fi, ch);
		else
			rc = session_content(s, from, &fi, ch);
		if (rc < 0 || from->tr == NULL)
			return -1;
	}
	if (run)
		session_forward(s, from, run);
	if (from->dir == DIR_TO_BROKER)
		s->w->stats.frames_to_broker += frames;
	else
		s->w->stats.frames_to_client += frames;
	if (s->state == SESSION_CLOSING) {
		if (s->client.done)
			session_leg_finish(s, &s->client);
		if (s->upstream.done)
			session_leg_finish(s, &s->upstream);
		return session_reap(s) ? -1 : 0;
	}
	if (from->tr)
		transport_input_consumed(from->tr);
	return 0;
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
		s->w->stats.upstream_failures++;
		if (session_connect_next(s) != 0)
			session_unreachable(s);
		return;
	}
	if (l == &s->upstream && s->greeting && s->state < SESSION_FLUSHING) {
		/* A greeted client waits for open-ok. A broker that closes
		 * right after the credentials refused them (as RabbitMQ does
		 * for a client that did not ask for a connection.close). */
		int login = s->greeting->phase == GREETING_REPLAYED;

		session_log(s, LOG_WARNING, "broker connection lost in the handshake: %s", why);
		session_leg_finish(s, l);
		session_greeting_failed(
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
		s->w->stats.upstream_failures++;
		session_leg_finish(s, l);
		session_shut(s, REPLY_CONNECTION_FORCED,
			     "CONNECTION_FORCED - broker connection lost");
		return;
	}
	/* The client vanished: the broker sees its socket close, as it
	 * would without the proxy. */
	session_log(s, LOG_INFO, "client connection lost: %s", why);
	session_flush_and_go(s);
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
		session_event(s, other, SEV_READ, 0);
	}
	if (l == &s->client && s->nhooks && s->state < SESSION_CLOSING)
		pipeline_drained(s);
}

static void session_connected(struct session *s, struct leg *l)
{
	upstream_ok(s->upstream_at);
	session_nodelay(transport_fd(l->tr));
	session_set_state(s, SESSION_HANDSHAKE);
}

static void session_silent(struct session *s, struct leg *l)
{
	if (l == &s->upstream && s->state == SESSION_OPEN) {
		session_log(s, LOG_WARNING, "broker missed heartbeats");
		l->eof = 1;
		s->w->stats.upstream_failures++;
		session_leg_finish(s, l);
		session_shut(s, REPLY_CONNECTION_FORCED,
			     "CONNECTION_FORCED - broker missed heartbeats");
		return;
	}
	session_log(s, LOG_WARNING, "%s missed heartbeats", session_leg_name(s, l));
	l->eof = 1;
	session_flush_and_go(s);
}

static void session_leg_end(struct session *s, struct leg *l, int err)
{
	char why[128];

	if (err && s->state == SESSION_CONNECTING && l == &s->upstream) {
		session_log(s, LOG_WARNING, "cannot connect to broker %s: %s",
			    upstream_node(s->upstream_at)->name, transport_error(l->tr, err));
		s->w->stats.upstream_failures++;
		if (session_connect_next(s) != 0)
			session_unreachable(s);
		return;
	}
	snprintf(why, sizeof(why), "%s", err ? transport_error(l->tr, err) : "end of stream");
	if (err == EPROTO && l == &s->client && s->state == SESSION_HEADER)
		session_log(s, LOG_WARNING, "TLS handshake with the client failed: %s", why);
	/* Frames that arrived before the end still go through. */
	if (s->state != SESSION_FLUSHING && session_pump(s, l) != 0)
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
		return s->state < SESSION_CLOSING;
	case SEV_READ:
	case SEV_DRAINED:
	case SEV_END:
	case SEV_TIMER:
		return 1;
	}
	return 0;
}

static void session_event(struct session *s, struct leg *l, enum session_event ev, int err)
{
	session_enter(s);
	if (session_accepts(s, l, ev)) {
		switch (ev) {
		case SEV_READ:
			if (l->held && s->state == SESSION_OPEN)
				pipeline_held_input(s, (int)l->dir);
			if (s->state != SESSION_GONE && l->tr)
				session_pump(s, l);
			break;
		case SEV_DRAINED:
			session_drained(s, l);
			break;
		case SEV_CONNECTED:
			session_connected(s, l);
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
			pipeline_refresh(s);
			break;
		}
		/* connection.start just passed: the client's frames that
		 * waited for it go now. */
		if (s->started && !s->client_flowing && s->state < SESSION_GONE) {
			s->client_flowing = 1;
			if (s->client.tr && evbuffer_get_length(transport_input(s->client.tr)))
				session_event(s, &s->client, SEV_READ, 0);
		}
	}
	session_leave(s);
}

void session_lookahead(struct session *s, enum chan_dir from,
		       int (*fn)(void *arg, const struct frame_info *fi, const uint8_t *payload,
				 size_t len),
		       void *arg)
{
	static _Thread_local uint8_t scratch[65536];
	struct leg *l = from == DIR_TO_BROKER ? &s->client : &s->upstream;
	uint32_t max = s->frame_max;
	struct evbuffer_ptr pos;
	struct frame_info fi;
	struct evbuffer *in;
	size_t off = 0;
	int n;

	if (l->tr == NULL || s->state != SESSION_OPEN)
		return;
	if (max < (uint32_t)worker_settings.max_frame_pre_tune)
		max = (uint32_t)worker_settings.max_frame_pre_tune;
	in = transport_input(l->tr);
	for (n = 0; n < 4096; n++) {
		const uint8_t *p = NULL;
		size_t plen = 0;

		if (frame_scan_evbuffer(in, off, max, &fi) != FRAME_SCAN_OK)
			break;
		if ((fi.type == FRAME_METHOD || fi.type == FRAME_HEADER) &&
		    fi.size <= sizeof(scratch) &&
		    evbuffer_ptr_set(in, &pos, off + FRAME_HEADER_SIZE, EVBUFFER_PTR_SET) ==
			0 &&
		    evbuffer_copyout_from(in, &pos, scratch, fi.size) == (ev_ssize_t)fi.size) {
			p = scratch;
			plen = fi.size;
		}
		if (fn(arg, &fi, p, plen))
			break;
		off += frame_scan_wire_len(&fi);
	}
}

void session_hold(struct session *s, enum chan_dir from)
{
	(from == DIR_TO_BROKER ? &s->client : &s->upstream)->held++;
}

void session_unhold(struct session *s, enum chan_dir from)
{
	struct leg *l = from == DIR_TO_BROKER ? &s->client : &s->upstream;

	if (l->held && --l->held == 0)
		session_event(s, l, SEV_READ, 0);
}

int session_complete(struct session *s, void (*fn)(struct session *s, void *arg), void *arg)
{
	int ran = 0;

	session_enter(s);
	if (s->state < SESSION_CLOSING) {
		fn(s, arg);
		ran = 1;
	}
	session_leave(s);
	return ran;
}

static void session_json_string(struct evbuffer *out, const char *v)
{
	evbuffer_add(out, "\"", 1);
	vstats_escape(out, v, 1);
	evbuffer_add(out, "\"", 1);
}

void session_describe(struct session *s, struct evbuffer *out)
{
	static const char *const states[] = {"header",  "connecting", "handshake", "open",
					     "closing", "flushing",   "gone"};
	uint64_t cin = 0, cout = 0, bin = 0, bout = 0;

	if (s->client.tr)
		transport_bytes(s->client.tr, &cin, &cout);
	if (s->upstream.tr)
		transport_bytes(s->upstream.tr, &bin, &bout);
	evbuffer_add_printf(out, "{\"id\": %llu, \"address\": ", (unsigned long long)s->id);
	session_json_string(out, s->peer);
	evbuffer_add_printf(out, ", \"vhost\": ");
	session_json_string(out, s->vhost);
	evbuffer_add_printf(out, ", \"user\": ");
	session_json_string(out, s->user);
	evbuffer_add_printf(out,
			    ", \"state\": \"%s\", \"channels\": %u, \"broker\": \"%s\", "
			    "\"bytes_from_client\": %llu, \"bytes_to_client\": %llu, "
			    "\"bytes_to_broker\": %llu, \"bytes_from_broker\": %llu, "
			    "\"age_s\": %lld, \"worker\": %d}",
			    states[s->state], s->nopen,
			    s->upstream.tr ? upstream_node(s->upstream_at)->name : "",
			    (unsigned long long)cin, (unsigned long long)cout,
			    (unsigned long long)bout, (unsigned long long)bin,
			    (long long)(time(NULL) - s->opened), s->w->index);
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
