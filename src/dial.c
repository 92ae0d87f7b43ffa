/* dial: connecting a session's broker leg: the next broker address of the
 * vhost's list (a node that just failed comes last), TLS to the broker, and
 * the PROXY header that tells the broker the client's real address. A
 * failover before the broker has spoken is invisible to the client. */
#include "dial.h"

#include "../amqp/proxyproto.h"
#include "config.h"
#include "handshake.h"
#include "log.h"
#include "session.h"
#include "tls.h"
#include "transport.h"
#include "upstream.h"
#include "worker.h"

#include <errno.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

/* TLS to the broker: SNI and the name verified are upstream_tls_name, or
 * the host of the address. */
int dial_tls(struct transport *tr, const struct upstream_node *n)
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
int dial_upstream(struct session *s)
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
		if (tr && tls_upstream() && dial_tls(tr, n) != 0) {
			transport_free(tr);
			tr = NULL;
			errno = EPROTO;
		}
		if (tr == NULL) {
			session_log(s, LOG_WARNING, "cannot connect to broker %s: %s", n->name,
				    strerror(errno));
			STATS_INC(&s->w->stats, upstream_failures);
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
int dial_next(struct session *s)
{
	upstream_failed(s->upstream_at);
	if (s->upstream.tr) {
		transport_free(s->upstream.tr);
		s->upstream.tr = NULL;
	}
	memset(&s->upstream, 0, sizeof(s->upstream));
	return dial_upstream(s);
}

/* No broker address answered. */
void dial_unreachable(struct session *s)
{
	char text[256];

	if (s->greeting == NULL) {
		session_end(s);
		return;
	}
	snprintf(text, sizeof(text), "CONNECTION_FORCED - no broker for vhost '%s' answers",
		 s->vhost);
	handshake_failed(s, REPLY_CONNECTION_FORCED, text);
}

void dial_connected(struct session *s, struct leg *l)
{
	upstream_ok(s->upstream_at);
	session_nodelay(transport_fd(l->tr));
	session_set_state(s, SESSION_HANDSHAKE);
}
