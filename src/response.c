/* response: the methods a broker sends on a channel that the proxy reads.
 * Deliveries, get-oks and returns go to the pipeline (or pass with their
 * tags mapped); publisher confirms are translated to the client's sequence
 * numbers (settle.c); consume-ok and cancel-ok keep the consumer table
 * whose no_ack flags the tag mapping needs. Everything else passes. */
#include "response.h"

#include "../amqp/frame_scan.h"
#include "log.h"
#include "pipeline.h"
#include "relay.h"
#include "session.h"
#include "settle.h"
#include "surplus.h"
#include "transport.h"

#include <event2/buffer.h>

int response_method(struct session *s, struct leg *from, const struct frame_info *fi,
		    struct channel *ch, amqp_method_number_t id, void *m)
{
	if (id == AMQP_CHANNEL_CLOSE_OK_METHOD) {
		pipeline_channel_closed(&s->pipe, ch);
		session_channel_shut(s, ch);
	}
	if (s->pipe.nhooks == 0)
		return RELAY_FORWARD;
	switch (id) {
	case AMQP_BASIC_DELIVER_METHOD:
	case AMQP_BASIC_GET_OK_METHOD:
	case AMQP_BASIC_RETURN_METHOD:
		return relay_content_method(s, from, ch, fi, id, m);
	case AMQP_BASIC_ACK_METHOD:
	case AMQP_BASIC_NACK_METHOD: {
		uint64_t tag = id == AMQP_BASIC_ACK_METHOD
				   ? ((amqp_basic_ack_t *)m)->delivery_tag
				   : ((amqp_basic_nack_t *)m)->delivery_tag;

		if (!s->pipe.track || !ch->confirm_mode)
			break;
		evbuffer_drain(transport_input(from->tr), frame_scan_wire_len(fi));
		if (settle_broker_confirm(&s->pipe, ch, id, m) != 0)
			session_log(s, LOG_WARNING,
				    "broker confirmed unknown sequence %llu on channel %u",
				    (unsigned long long)tag, ch->id);
		return RELAY_DONE;
	}
	case AMQP_BASIC_CONSUME_OK_METHOD: {
		amqp_basic_consume_ok_t *c = m;

		channel_consumer_remove(ch, c->consumer_tag.bytes, c->consumer_tag.len);
		channel_consumer_add(ch, c->consumer_tag.bytes, c->consumer_tag.len,
				     ch->consume_no_ack, ch->consume_queue);
		/* The broker was asked for more than the client's prefetch for
		 * it: what is past the client's prefetch is kept (surplus.h). */
		if (ch->consume_surplus &&
		    surplus_add(&ch->surplus, ch->id, c->consumer_tag.bytes,
				c->consumer_tag.len, ch->consume_surplus) != 0)
			session_log(s, LOG_WARNING,
				    "no memory to count deliveries on channel %u: its consumer "
				    "may get more than its prefetch",
				    ch->id);
		ch->consume_surplus = 0;
		break;
	}
	case AMQP_BASIC_QOS_OK_METHOD:
		if (ch->qos_unanswered == 0)
			break;
		/* The answer to the proxy's own basic.qos (a consume's). */
		ch->qos_unanswered--;
		evbuffer_drain(transport_input(from->tr), frame_scan_wire_len(fi));
		return RELAY_DONE;
	case AMQP_BASIC_CANCEL_METHOD: {
		amqp_basic_cancel_t *c = m;

		/* The broker cancels a consumer: what was kept for it goes
		 * first. */
		pipeline_surplus_cancel(&s->pipe, ch, c->consumer_tag.bytes,
					c->consumer_tag.len);
		break;
	}
	case AMQP_BASIC_CANCEL_OK_METHOD: {
		amqp_basic_cancel_ok_t *c = m;

		channel_consumer_remove(ch, c->consumer_tag.bytes, c->consumer_tag.len);
		break;
	}
	default:
		break;
	}
	return RELAY_FORWARD;
}
