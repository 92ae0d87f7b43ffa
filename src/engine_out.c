/* engine_out: the publishes out on the engine's confirm channel: sent
 * (always mandatory), matched with the basic.return that comes before a
 * confirm, and settled by the confirm: a worker's request completed, or a
 * client's input acknowledged (confirmed, not returned) or rejected with
 * requeue, and the client told. */
#include "engine_int.h"

#include <stdlib.h>
#include <string.h>

struct engine_pending *engine_out_send(struct engine *e, struct engine_req *req,
				       const struct engine_publish *pub)
{
	struct engine_pending *p = calloc(1, sizeof(*p));
	amqp_bytes_t ex = pub->exchange, rk = pub->routing_key;

	if (p == NULL)
		return NULL;
	p->sent.exchange.bytes = malloc(ex.len + 1);
	p->sent.routing_key.bytes = malloc(rk.len + 1);
	if (p->sent.exchange.bytes == NULL || p->sent.routing_key.bytes == NULL)
		goto fail;
	memcpy(p->sent.exchange.bytes, ex.bytes, ex.len);
	memcpy(p->sent.routing_key.bytes, rk.bytes, rk.len);
	p->sent.exchange.len = ex.len;
	p->sent.routing_key.len = rk.len;
	if (amqp_basic_publish(e->c.amqp, ENGINE_CONN_PUBLISH, ex, rk, 1, 0, pub->props,
			       pub->body) != AMQP_STATUS_OK)
		goto fail;
	p->req = req;
	p->sent.kind = pub->kind;
	p->sent.data = pub->data;
	p->sent.data2 = pub->data2;
	p->sent.input = pub->input;
	p->seq = ++e->next_seq;
	if (e->pend == NULL)
		e->pend_tail = &e->pend;
	*e->pend_tail = p;
	e->pend_tail = &p->next;
	return p;
fail:
	free(p->sent.exchange.bytes);
	free(p->sent.routing_key.bytes);
	free(p);
	return NULL;
}

static void engine_out_free(struct engine_pending *p)
{
	free(p->sent.exchange.bytes);
	free(p->sent.routing_key.bytes);
	free(p);
}

/* A publish is settled: settle what it stood for. */
static int engine_out_finish(struct engine *e, struct engine_pending *p)
{
	enum engine_rc how = !p->ok             ? ENGINE_NACKED
			     : p->sent.returned ? ENGINE_RETURNED
						: ENGINE_OK;
	int rc = AMQP_STATUS_OK;

	if (p->req) {
		if (p->req->op == ENGINE_PUBLISH)
			engine_add(e,
				   how == ENGINE_OK ? ENGINE_STAT_put_back
						    : ENGINE_STAT_put_back_failed,
				   1);
		engine_complete(p->req, how);
	} else {
		/* Refused, or returned: the broker keeps the input and
		 * delivers it again. */
		if (p->sent.input && how == ENGINE_OK)
			rc = amqp_basic_ack(e->c.amqp, ENGINE_CONN_CONSUME, p->sent.input, 0);
		else if (p->sent.input)
			rc = amqp_basic_nack(e->c.amqp, ENGINE_CONN_CONSUME, p->sent.input, 0,
					     1);
		if (engine_client && engine_client->settled &&
		    engine_client->settled(e->state, &p->sent, how) != 0)
			rc = -1;
	}
	engine_out_free(p);
	return rc == AMQP_STATUS_OK ? 0 : -1;
}

int engine_out_confirmed(struct engine *e, uint64_t seq, int multiple, int ok)
{
	struct engine_pending **pp = &e->pend, *p;
	int rc = 0;

	/* The list is in sequence order: nothing after seq is covered. */
	while ((p = *pp) != NULL && p->seq <= seq) {
		if (p->seq == seq || multiple) {
			*pp = p->next;
			if (p->next == NULL)
				e->pend_tail = pp;
			p->ok = ok;
			rc |= engine_out_finish(e, p);
		} else {
			pp = &p->next;
		}
	}
	return rc;
}

/* The publish a return is for: the oldest unsettled one to the same
 * exchange and routing key. */
int engine_out_returned(struct engine *e, const amqp_basic_return_t *ret, amqp_message_t *msg)
{
	struct engine_pending *p;
	amqp_bytes_t ex = ret->exchange, rk = ret->routing_key;

	for (p = e->pend; p; p = p->next)
		if (!p->sent.returned && p->sent.exchange.len == ex.len &&
		    p->sent.routing_key.len == rk.len &&
		    (ex.len == 0 || memcmp(p->sent.exchange.bytes, ex.bytes, ex.len) == 0) &&
		    (rk.len == 0 || memcmp(p->sent.routing_key.bytes, rk.bytes, rk.len) == 0))
			break;
	if (p == NULL)
		return 0;
	p->sent.returned = 1;
	if (p->req || engine_client == NULL || engine_client->returned == NULL)
		return 0;
	return engine_client->returned(e->state, &p->sent, msg);
}

void engine_out_closed(struct engine *e)
{
	struct engine_pending *p;

	if (engine_client == NULL || engine_client->publish_closed == NULL)
		return;
	for (p = e->pend; p; p = p->next)
		if (p->req == NULL)
			engine_client->publish_closed(e->state, &p->sent);
}

void engine_out_fail(struct engine *e)
{
	struct engine_pending *p, *next;

	for (p = e->pend; p; p = next) {
		next = p->next;
		if (p->req) {
			if (p->req->op == ENGINE_PUBLISH)
				engine_add(e, ENGINE_STAT_put_back_failed, 1);
			engine_complete(p->req, ENGINE_FAILED);
		}
		engine_out_free(p);
	}
	e->pend = NULL;
	e->pend_tail = &e->pend;
}
