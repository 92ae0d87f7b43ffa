/* settle: the client's acks, nacks and rejects, and the broker's publisher
 * confirms, translated between the client's numbering and the broker's when
 * hooks swallow, hold or answer messages (tagmap, confirmmap); hooks hear
 * of each settle and each publish's outcome. */
#include "settle.h"

#include "../amqp/method.h"
#include "channel.h"
#include "pipeline.h"
#include "tagmap.h"

#include <stdio.h>
#include <string.h>

struct settle_emit {
	struct evbuffer *out;
	uint16_t channel;
	amqp_method_number_t id;
	int requeue;
};

static void settle_emit(void *arg, uint64_t tag, int multiple)
{
	struct settle_emit *e = arg;

	if (e->id == AMQP_BASIC_ACK_METHOD) {
		method_write_basic_ack(e->out, e->channel, tag, multiple);
	} else if (e->id == AMQP_BASIC_NACK_METHOD) {
		amqp_basic_nack_t m = {tag, (amqp_boolean_t)multiple,
				       (amqp_boolean_t)e->requeue};

		method_write(e->out, e->channel, AMQP_BASIC_NACK_METHOD, &m);
	} else {
		amqp_basic_reject_t m = {tag, (amqp_boolean_t)e->requeue};

		method_write(e->out, e->channel, AMQP_BASIC_REJECT_METHOD, &m);
	}
}

struct settle_note {
	struct pipeline *p;
	struct channel *ch;
	struct settle_emit e;
};

/* Hooks hear of each delivery a settle covers (one basic.ack with
 * multiple may cover many). */
static void settle_noted(void *arg, uint64_t broker_tag)
{
	struct settle_note *n = arg;

	pipeline_settled(n->p, n->ch, n->e.id, broker_tag);
}

/* A client's ack, nack or reject on a channel whose tags are mapped. */
int settle_client(struct pipeline *p, struct channel *ch, amqp_method_number_t id,
		  void *decoded, char *why, size_t whylen)
{
	struct settle_note n = {p, ch, {pipeline_out(p, DIR_TO_BROKER), ch->id, id, 0}};
	uint64_t tag;
	int multiple = 0;

	if (id == AMQP_BASIC_ACK_METHOD) {
		amqp_basic_ack_t *m = decoded;

		tag = m->delivery_tag;
		multiple = m->multiple;
	} else if (id == AMQP_BASIC_NACK_METHOD) {
		amqp_basic_nack_t *m = decoded;

		tag = m->delivery_tag;
		multiple = m->multiple;
		n.e.requeue = m->requeue;
	} else {
		amqp_basic_reject_t *m = decoded;

		tag = m->delivery_tag;
		n.e.requeue = m->requeue;
	}
	if (n.e.out == NULL)
		return 0; /* the broker leg is gone: nothing to tell it */
	if (tagmap_covered(&ch->tags, tag, multiple, settle_noted, &n) != 0 ||
	    tagmap_settle(&ch->tags, tag, multiple, settle_emit, &n.e) != 0) {
		/* What the broker says for a tag it does not know. */
		snprintf(why, whylen, "PRECONDITION_FAILED - unknown delivery tag %llu",
			 (unsigned long long)tag);
		return -1;
	}
	return 0;
}

struct settle_confirm_note {
	struct pipeline *p;
	struct channel *ch;
	int acked;
};

static void settle_publish_outcome(void *arg, uint64_t broker_seq)
{
	struct settle_confirm_note *n = arg;

	pipeline_publish_settled(n->p, n->ch, broker_seq, n->acked);
}

/* The broker's ack or nack of publishes on a channel with mapped confirms. */
int settle_broker_confirm(struct pipeline *p, struct channel *ch, amqp_method_number_t id,
			  void *decoded)
{
	struct settle_emit e = {pipeline_out(p, DIR_TO_CLIENT), ch->id, id, 0};
	struct settle_confirm_note n = {p, ch, id == AMQP_BASIC_ACK_METHOD};
	uint64_t tag;
	int multiple;

	if (id == AMQP_BASIC_ACK_METHOD) {
		amqp_basic_ack_t *m = decoded;

		tag = m->delivery_tag;
		multiple = m->multiple;
	} else {
		amqp_basic_nack_t *m = decoded;

		tag = m->delivery_tag;
		multiple = m->multiple;
		e.requeue = m->requeue;
	}
	/* Hooks that follow their publishes learn each one's outcome. */
	if (pipeline_publish_watched(p))
		confirmmap_covered(&ch->confirms, tag, multiple, settle_publish_outcome, &n);
	if (e.out == NULL)
		return 0; /* the client is gone: nothing to tell it */
	return confirmmap_settle(&ch->confirms, tag, multiple, n.acked, settle_emit, &e) != 0
		   ? -1
		   : 0;
}

void settle_confirm_release(struct pipeline *p, struct channel *ch, uint64_t broker_seq)
{
	struct settle_emit e = {pipeline_out(p, DIR_TO_CLIENT), ch->id, AMQP_BASIC_ACK_METHOD,
				0};
	uint64_t client;
	int outcome = confirmmap_release(&ch->confirms, broker_seq, &client);

	if (outcome <= CONFIRM_NONE || e.out == NULL)
		return; /* not held, or the broker's confirm is still to come */
	if (outcome == CONFIRM_NACKED)
		e.id = AMQP_BASIC_NACK_METHOD;
	settle_emit(&e, client, 0);
}
