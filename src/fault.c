/* fault: what the proxy tells a peer that broke a rule: a protocol error
 * (connection.close with the broker's reply code and words), a limit's
 * refusal (530, logged once per episode), and a channel error (the channel
 * closed on both sides, as the broker closes it). */
#include "fault.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "limits.h"
#include "log.h"
#include "session.h"
#include "transport.h"
#include "worker.h"

#include <stdio.h>
#include <string.h>

/* A limit refuses what the client asked for: connection.close 530 with the
 * reason, as the broker words its own limits; logged once per episode. */
void fault_refuse(struct session *s, enum limits_reason r, const struct frame_info *fi)
{
	char text[256];

	if (r == LIMITS_MAX_CHANNELS) {
		snprintf(text, sizeof(text),
			 "NOT_ALLOWED - number of channels opened (%u) has reached the proxy's "
			 "max_channels (%ld)",
			 s->nopen, limits_max_channels());
		STATS_INC(&s->w->stats, refused_max_channels);
	} else if (r == LIMITS_CONNECTION_RATE) {
		snprintf(text, sizeof(text),
			 "NOT_ALLOWED - vhost '%s' takes no more connections this second (its "
			 "rules' limits.connections_per_s)",
			 s->vhost);
		STATS_INC(&s->w->stats, refused_connection_rate);
	} else {
		snprintf(text, sizeof(text),
			 "NOT_ALLOWED - connection limit (%ld) for vhost '%s' reached "
			 "(max_connections_per_vhost)",
			 limits_max_per_vhost(), s->vhost);
		STATS_INC(&s->w->stats, refused_max_connections_per_vhost);
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
void fault_protocol(struct session *s, uint16_t code, const char *why, uint16_t class_id,
		    uint16_t method_id)
{
	char text[256];

	if (!s->logged_error) {
		session_log(s, LOG_WARNING, "protocol error %u: %s", code, why);
		s->logged_error = 1;
	}
	STATS_INC(&s->w->stats, protocol_errors);
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

void fault_channel(struct session *s, struct channel *ch, uint16_t code, const char *text,
		   uint16_t class_id, uint16_t method_id)
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
