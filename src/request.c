/* request: the methods a client sends on a channel that the proxy reads.
 * channel.open counts against max_channels; consumes and gets are
 * remembered, so their deliveries' tags can be mapped; publishes go to the
 * pipeline; the client's acks, nacks and rejects pass the hooks' gate and
 * are translated to the broker's tags (settle.c). Everything else passes. */
#include "request.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "fault.h"
#include "limits.h"
#include "pipeline.h"
#include "relay.h"
#include "session.h"
#include "settle.h"
#include "surplus.h"
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
	pipeline_surplus_flow(&s->pipe);
	return RELAY_DONE;
}

/* A basic.consume whose deliveries a hook wants claimed ahead: the broker
 * is asked for more than the client's prefetch for this consumer alone
 * (a basic.qos before it, the client's own after it, their qos-oks not
 * passed on), and the proxy keeps what is past the client's prefetch
 * (surplus.h). RELAY_FORWARD when it is not such a consume. */
static int request_consume_ahead(struct session *s, struct leg *from,
				 const struct frame_info *fi, struct channel *ch,
				 amqp_basic_consume_t *c)
{
	struct evbuffer *out = pipeline_out(&s->pipe, DIR_TO_BROKER);
	amqp_basic_qos_t more = {0, 0, 0}, own = {0, ch->prefetch, 0};
	int extra;

	if (c->no_ack || ch->prefetch == 0 || ch->prefetch_global || out == NULL ||
	    (c->nowait && c->consumer_tag.len == 0) ||
	    (extra = pipeline_surplus_ahead(&s->pipe, ch->consume_queue, ch->prefetch)) <= 0)
		return RELAY_FORWARD;
	more.prefetch_count = surplus_prefetch(ch->prefetch, (uint16_t)extra);
	if (more.prefetch_count == ch->prefetch)
		return RELAY_FORWARD;
	if (c->nowait) {
		/* No consume-ok will name it: it is counted from now. */
		if (surplus_add(&ch->surplus, ch->id, c->consumer_tag.bytes,
				c->consumer_tag.len, ch->prefetch) != 0)
			return RELAY_FORWARD;
	} else {
		ch->consume_surplus = ch->prefetch;
	}
	if (method_write(out, ch->id, AMQP_BASIC_QOS_METHOD, &more) != 0 ||
	    evbuffer_remove_buffer(transport_input(from->tr), out, frame_scan_wire_len(fi)) !=
		(int)frame_scan_wire_len(fi) ||
	    method_write(out, ch->id, AMQP_BASIC_QOS_METHOD, &own) != 0) {
		session_shut(s, 541, "INTERNAL_ERROR - out of memory");
		return RELAY_CLOSED;
	}
	ch->qos_unanswered += 2;
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
		return request_consume_ahead(s, from, fi, ch, c);
	}
	case AMQP_BASIC_QOS_METHOD: {
		amqp_basic_qos_t *q = m;

		if (q->global)
			ch->prefetch_global = q->prefetch_count > 0;
		else
			ch->prefetch = q->prefetch_count;
		break;
	}
	case AMQP_BASIC_CANCEL_METHOD: {
		amqp_basic_cancel_t *c = m;

		/* What was kept for it goes before the cancel does: the client
		 * sees no delivery of it after its cancel-ok. */
		pipeline_surplus_cancel(&s->pipe, ch, c->consumer_tag.bytes,
					c->consumer_tag.len);
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
		pipeline_surplus_recover(&s->pipe, ch);
		tagmap_reset(&ch->tags);
		break;
	default:
		break;
	}
	return RELAY_FORWARD;
}
