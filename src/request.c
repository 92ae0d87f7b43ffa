/* request: the methods a client sends on a channel that the proxy reads.
 * channel.open counts against max_channels; consumes and gets are
 * remembered, so their deliveries' tags can be mapped; publishes go to the
 * pipeline; the client's acks, nacks and rejects pass the hooks' gate and
 * are translated to the broker's tags (settle.c). Everything else passes. */
#include "request.h"

#include "../amqp/frame_scan.h"
#include "fault.h"
#include "limits.h"
#include "pipeline.h"
#include "relay.h"
#include "session.h"
#include "settle.h"
#include "transport.h"

#include <event2/buffer.h>

/* A client's basic.ack, nack or reject on a channel whose tags are mapped. */
static int request_settle(struct session *s, struct leg *from, const struct frame_info *fi,
			  struct channel *ch, amqp_method_number_t id, void *m)
{
	uint64_t tag = id == AMQP_BASIC_ACK_METHOD ? ((amqp_basic_ack_t *)m)->delivery_tag
		       : id == AMQP_BASIC_NACK_METHOD
			   ? ((amqp_basic_nack_t *)m)->delivery_tag
			   : ((amqp_basic_reject_t *)m)->delivery_tag;
	int multiple = id == AMQP_BASIC_ACK_METHOD    ? ((amqp_basic_ack_t *)m)->multiple
		       : id == AMQP_BASIC_NACK_METHOD ? ((amqp_basic_nack_t *)m)->multiple
						      : 0;
	char why[96];

	/* A hook may need the settle to wait: the frame stays in the input
	 * and is read again once the hook releases the leg. */
	if (pipeline_settle_gate(&s->pipe, ch, id, tag, multiple))
		return RELAY_WAIT;
	evbuffer_drain(transport_input(from->tr), frame_scan_wire_len(fi));
	if (settle_client(&s->pipe, ch, id, m, why, sizeof(why)) != 0)
		fault_channel(s, ch, REPLY_PRECONDITION_FAILED, why, (uint16_t)(id >> 16),
			      (uint16_t)id);
	return RELAY_DONE;
}

int request_method(struct session *s, struct leg *from, const struct frame_info *fi,
		   struct channel *ch, amqp_method_number_t id, void *m)
{
	switch (id) {
	case AMQP_CHANNEL_OPEN_METHOD:
		if (!ch->open && limits_max_channels() > 0 &&
		    s->nopen >= (unsigned)limits_max_channels()) {
			fault_refuse(s, LIMITS_MAX_CHANNELS, fi);
			return RELAY_CLOSED;
		}
		/* Whatever the number held goes, and the hooks hear of it as of
		 * a close: a second open of a live number would otherwise leave
		 * their entries on tags the reset forgot. */
		pipeline_channel_closed(&s->pipe, ch);
		session_channel_shut(s, ch);
		ch->open = 1;
		s->nopen++;
		break;
	case AMQP_CHANNEL_CLOSE_OK_METHOD:
		pipeline_channel_closed(&s->pipe, ch);
		session_channel_shut(s, ch);
		break;
	case AMQP_CONFIRM_SELECT_METHOD:
		ch->confirm_mode = 1;
		break;
	default:
		break;
	}
	if (s->pipe.nhooks == 0)
		return RELAY_FORWARD;
	switch (id) {
	case AMQP_BASIC_PUBLISH_METHOD:
		return relay_content_method(s, from, ch, fi, id, m);
	case AMQP_BASIC_ACK_METHOD:
	case AMQP_BASIC_NACK_METHOD:
	case AMQP_BASIC_REJECT_METHOD:
		if (!s->pipe.track)
			break;
		return request_settle(s, from, fi, ch, id, m);
	case AMQP_BASIC_CONSUME_METHOD: {
		amqp_basic_consume_t *c = m;

		ch->consume_no_ack = c->no_ack;
		channel_set_str(&ch->consume_queue, c->queue.bytes, c->queue.len);
		if (c->consumer_tag.len)
			channel_consumer_add(ch, c->consumer_tag.bytes, c->consumer_tag.len,
					     c->no_ack, ch->consume_queue);
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
		pipeline_recovered(&s->pipe, ch);
		tagmap_reset(&ch->tags);
		break;
	default:
		break;
	}
	return RELAY_FORWARD;
}
