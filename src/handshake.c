/* handshake: a session's protocol header (and a load balancer's PROXY
 * header before it), connection negotiation read on the way through
 * (start-ok's user, tune-ok's limits, open's vhost), and the greeting: once
 * any rules file names brokers of its own, the proxy answers the client's
 * handshake itself (greeting.c) and replays it to the broker it chose. */
#include "handshake.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "../amqp/proxyproto.h"
#include "control.h"
#include "dial.h"
#include "fault.h"
#include "greeting.h"
#include "limits.h"
#include "log.h"
#include "pool.h"
#include "relay.h"
#include "rules.h"
#include "session.h"
#include "transport.h"
#include "upstream.h"
#include "worker.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

#define HANDSHAKE_FRAME_MAX_UNLIMITED (128u * 1024u * 1024u)
#define HANDSHAKE_PROXY_HEADER_MAX    4096 /* a v2 header's TLVs beyond this are refused */

static const uint8_t handshake_amqp_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
/* Older headers RabbitMQ also answers (0-9 and 0-8): passed on as they are,
 * so the broker decides exactly as it would without the proxy. */
static const uint8_t handshake_legacy_headers[2][8] = {{'A', 'M', 'Q', 'P', 1, 1, 0, 9},
						       {'A', 'M', 'Q', 'P', 1, 1, 8, 0}};

/* The proxy greeted the client and no broker took the connection: the
 * client, waiting for open-ok, is told why. */
void handshake_failed(struct session *s, uint16_t code, const char *text)
{
	session_log(s, LOG_WARNING, "refused: %s", text);
	greeting_free(s->greeting);
	s->greeting = NULL;
	session_shut(s, code, text);
}

/* A load balancer's PROXY header, before the AMQP one: the client's real
 * address. Returns 0 to go on, 1 to wait for more, -1 if s is gone. */
static int handshake_proxy_header(struct session *s, struct evbuffer *in)
{
	size_t len = evbuffer_get_length(in), used = 0;
	struct proxyproto_addr a;
	const uint8_t *p;
	int rc;

	if (len > HANDSHAKE_PROXY_HEADER_MAX)
		len = HANDSHAKE_PROXY_HEADER_MAX;
	p = evbuffer_pullup(in, (ev_ssize_t)len);
	rc = p ? proxyproto_parse(p, len, &used, &a) : PROXYPROTO_ERROR;
	if (rc == PROXYPROTO_AGAIN && len < HANDSHAKE_PROXY_HEADER_MAX)
		return 1;
	if (rc != PROXYPROTO_OK) {
		session_log(s, LOG_WARNING,
			    "refused: no PROXY protocol header "
			    "(proxy_protocol is on)");
		STATS_INC(&s->w->stats, refused_proxy_protocol);
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

/* The brokers' properties a greeted client waited for are known: its
 * connection.start goes out, and its frames flow. */
static void handshake_greet_now(struct pipeline *p, void *arg)
{
	struct session *s = p->owner;

	if (s->greeting == NULL || s->greeting->phase != GREETING_WAITING ||
	    s->client.tr == NULL)
		return;
	if (greeting_start(s->greeting, transport_output(s->client.tr)) != 0) {
		session_end(s);
		return;
	}
	s->started = 1;
	if (evbuffer_get_length(transport_input(s->client.tr)))
		session_wake(s, &s->client);
}

static void handshake_greet_resume(void *owner)
{
	struct session *s = owner;

	pipeline_call(&s->pipe, handshake_greet_now, NULL);
}

/* The client's protocol header. Returns 0 to go on, -1 if s is gone. */
int handshake_header(struct session *s)
{
	struct evbuffer *in = transport_input(s->client.tr);
	uint8_t hdr[8];
	int rc;

	if (worker_settings.proxy_protocol && !s->proxied &&
	    (rc = handshake_proxy_header(s, in)) != 0)
		return rc;
	if (evbuffer_get_length(in) < sizeof(hdr))
		return 1;
	evbuffer_copyout(in, hdr, sizeof(hdr));
	if (memcmp(hdr, handshake_amqp_header, sizeof(hdr)) != 0 &&
	    memcmp(hdr, handshake_legacy_headers[0], sizeof(hdr)) != 0 &&
	    memcmp(hdr, handshake_legacy_headers[1], sizeof(hdr)) != 0) {
		session_log(s, LOG_WARNING, "not an AMQP 0-9-1 protocol header");
		STATS_INC(&s->w->stats, connections_refused);
		evbuffer_add(transport_output(s->client.tr), handshake_amqp_header,
			     sizeof(handshake_amqp_header));
		s->client.done = 1;
		session_flush_and_go(s);
		return -1;
	}
	evbuffer_drain(in, sizeof(hdr));
	memcpy(s->header, hdr, sizeof(hdr));
	if (s->w->rules && s->w->rules->greets) {
		/* The broker depends on the vhost, named only at
		 * connection.open: the proxy greets the client itself. */
		s->greeting = greeting_new();
		if (s->greeting == NULL ||
		    (greeting_await(s->greeting, s->w, handshake_greet_resume, s) != 0 &&
		     greeting_start(s->greeting, transport_output(s->client.tr)) != 0)) {
			session_end(s);
			return -1;
		}
		/* Sent, or sent once the brokers' properties are in. */
		s->started = s->greeting->phase == GREETING_STARTED;
		/* Its own handshake: a refusal says why, also before tune-ok. */
		s->closable = 1;
		session_set_state(s, SESSION_HANDSHAKE);
		return 0;
	}
	if (dial_upstream(s) != 0) {
		session_end(s);
		return -1;
	}
	return 0;
}

/* ---- frames the proxy looks at ---------------------------------------- */

static void handshake_leg_tune(struct session *s, struct leg *l)
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
 * legs (the broker leg may come later: handshake_leg_tune). */
static void handshake_tuned(struct session *s, const amqp_connection_tune_ok_t *t)
{
	s->channel_max = t->channel_max ? t->channel_max : 65535;
	s->frame_max = t->frame_max          ? t->frame_max
		       : s->broker_frame_max ? s->broker_frame_max
					     : HANDSHAKE_FRAME_MAX_UNLIMITED;
	s->heartbeat = t->heartbeat;
	s->pipe.frame_max = s->frame_max;
	handshake_leg_tune(s, &s->client);
	/* Until tune-ok the broker meets a protocol error by closing the
	 * socket without a word; from here on it says connection.close. */
	s->closable = 1;
	handshake_leg_tune(s, &s->upstream);
}

static void handshake_start_ok(struct session *s, const amqp_connection_start_ok_t *m)
{
	const char *resp = m->response.bytes;
	size_t len = m->response.len, i, start;
	char pass[256];

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
	} else if (m->mechanism.len == 8 && memcmp(m->mechanism.bytes, "AMQPLAIN", 8) == 0 &&
		   greeting_credentials(m, s->user, sizeof(s->user), pass, sizeof(pass)) == 0) {
		memset(pass, 0, sizeof(pass)); /* only the user is kept */
	} else if (m->mechanism.len) {
		snprintf(s->user, sizeof(s->user), "(%.*s)", (int)m->mechanism.len,
			 (const char *)m->mechanism.bytes);
	}
}

/* connection.open names the vhost: its limit, its rules. 0, or -1 when
 * refused (the session is closing). */
static int handshake_opening(struct session *s, const amqp_connection_open_t *o,
			     const struct frame_info *fi)
{
	snprintf(s->vhost, sizeof(s->vhost), "%.*s", (int)o->virtual_host.len,
		 (const char *)o->virtual_host.bytes);
	if (limits_vhost_enter(s->vhost) != 0) {
		fault_refuse(s, LIMITS_MAX_CONNECTIONS_PER_VHOST, fi);
		return -1;
	}
	s->vhost_counted = limits_max_per_vhost() > 0;
	if (control_opened(s) != 0) {
		fault_refuse(s, LIMITS_CONNECTION_RATE, fi);
		return -1;
	}
	pipeline_attach(&s->pipe);
	return 0;
}

/* The proxy greets the client: its start-ok, tune-ok and open are taken
 * here (and kept for the broker), its close answered. 0, or -1 when the
 * session closed. */
static int handshake_greet_client(struct session *s, const struct frame_info *fi,
				  amqp_method_number_t id, void *m)
{
	struct evbuffer *in = transport_input(s->client.tr);
	struct evbuffer *out = transport_output(s->client.tr);
	const struct rules_vhost *v;
	size_t len = frame_scan_wire_len(fi);
	int rc = -1;

	switch (id) {
	case AMQP_CONNECTION_START_OK_METHOD:
		handshake_start_ok(s, m);
		rc = greeting_start_ok(s->greeting, m, in, len, out);
		break;
	case AMQP_CONNECTION_TUNE_OK_METHOD:
		rc = greeting_tune_ok(s->greeting, m, in, len);
		if (rc == 0) {
			amqp_connection_tune_ok_t t = {s->greeting->channel_max,
						       s->greeting->frame_max,
						       s->greeting->heartbeat};

			handshake_tuned(s, &t);
		}
		break;
	case AMQP_CONNECTION_OPEN_METHOD:
		if (s->greeting->phase != GREETING_OPENING)
			break;
		if (handshake_opening(s, m, fi) != 0)
			return -1;
		if (greeting_open(s->greeting, in, len) != 0)
			break;
		v = pipeline_rules(&s->pipe);
		if (v)
			s->upstreams = v->upstream;
		/* The client's next frames wait for the broker's open-ok. */
		session_hold(s, DIR_TO_BROKER);
		if (v && v->pool.enabled) {
			/* Its channels ride on a shared broker connection. */
			if (pool_dial(s, v) != 0) {
				handshake_failed(s, 541, "INTERNAL_ERROR - out of memory");
				return -1;
			}
			return 0;
		}
		if (dial_upstream(s) != 0) {
			dial_unreachable(s);
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
	fault_protocol(s, REPLY_COMMAND_INVALID,
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
static int handshake_greet_broker(struct session *s, const struct frame_info *fi,
				  amqp_method_number_t id, void *m)
{
	struct evbuffer *in = transport_input(s->upstream.tr);
	struct evbuffer *out = transport_output(s->upstream.tr);
	size_t len = frame_scan_wire_len(fi);
	char why[256];
	int code;

	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
		greeting_learn(s->upstream_at,
			       &((amqp_connection_start_t *)m)->server_properties);
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
			STATS_INC(&s->w->stats, upstream_failures); /* the broker's fault */
		handshake_failed(s, (uint16_t)code, why);
		return -1;
	case AMQP_CONNECTION_OPEN_OK_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
		/* Open, or refused (credentials, vhost): the client has its
		 * answer, and from here frames pass as they do for any. */
		greeting_free(s->greeting);
		s->greeting = NULL;
		if (id == AMQP_CONNECTION_OPEN_OK_METHOD) {
			handshake_leg_tune(s, &s->upstream);
			session_set_state(s, SESSION_OPEN);
			session_log(s, LOG_INFO,
				    "open frame_max=%u channel_max=%u heartbeat=%u",
				    s->frame_max, s->channel_max, s->heartbeat);
		} else {
			s->close_seen = 1;
		}
		relay_forward(s, &s->upstream, len);
		session_unhold(s, DIR_TO_BROKER);
		return 0;
	default:
		snprintf(why, sizeof(why), "broker sent method %u.%u during the handshake",
			 fi->class_id, fi->method_id);
		break;
	}
	session_log(s, LOG_WARNING, "broker handshake failed: %s", why);
	STATS_INC(&s->w->stats, upstream_failures);
	handshake_failed(s, REPLY_CONNECTION_FORCED,
			 "CONNECTION_FORCED - the broker's handshake went wrong");
	return -1;
}

/* A connection method (channel 0). While the proxy greets the client, the
 * greeting takes them; otherwise they pass through and the proxy reads
 * what it needs on the way. */
int handshake_method(struct session *s, struct leg *from, const struct frame_info *fi,
		     amqp_method_number_t id, void *m)
{
	if (s->greeting) {
		int rc = from->dir == DIR_TO_BROKER ? handshake_greet_client(s, fi, id, m)
						    : handshake_greet_broker(s, fi, id, m);

		return rc == 0 ? RELAY_DONE : RELAY_CLOSED;
	}
	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
		/* Learned for greeted clients, when the rules make some. */
		if (s->w->rules && s->w->rules->greets)
			greeting_learn(s->upstream_at,
				       &((amqp_connection_start_t *)m)->server_properties);
		s->started = 1;
		session_set_state(s, SESSION_HANDSHAKE);
		break;
	case AMQP_CONNECTION_START_OK_METHOD:
		handshake_start_ok(s, m);
		break;
	case AMQP_CONNECTION_TUNE_METHOD:
		s->broker_frame_max = ((amqp_connection_tune_t *)m)->frame_max;
		break;
	case AMQP_CONNECTION_TUNE_OK_METHOD:
		handshake_tuned(s, m);
		session_set_state(s, SESSION_OPEN);
		break;
	case AMQP_CONNECTION_OPEN_METHOD:
		if (handshake_opening(s, m, fi) != 0)
			return RELAY_CLOSED;
		break;
	case AMQP_CONNECTION_OPEN_OK_METHOD:
		session_log(s, LOG_INFO, "open frame_max=%u channel_max=%u heartbeat=%u",
			    s->frame_max, s->channel_max, s->heartbeat);
		break;
	case AMQP_CONNECTION_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_OK_METHOD:
		s->close_seen = 1;
		break;
	default:
		break;
	}
	return RELAY_FORWARD;
}
