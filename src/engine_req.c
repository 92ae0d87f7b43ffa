/* engine_req: a worker's request to the engine: made with its pool, given
 * a publish to carry (exchange, routing key and properties copied, the
 * body taken), and freed with what it owns. Submitting and completing
 * requests is the engine's (engine.c). */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

struct engine_req *engine_req_new(struct worker *w, enum engine_op op,
				  void (*done)(struct worker_call *c))
{
	struct engine_req *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	r->w = w;
	r->op = op;
	r->call.fn = done;
	init_amqp_pool(&r->pool, 4096);
	return r;
}

int engine_bytes_copy(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_bytes_t src)
{
	dst->len = src.len;
	dst->bytes = amqp_pool_alloc(pool, src.len ? src.len : 1);
	if (dst->bytes == NULL)
		return -1;
	if (src.len)
		memcpy(dst->bytes, src.bytes, src.len);
	return 0;
}

static int engine_req_props(amqp_basic_properties_t *d, const amqp_basic_properties_t *p,
			    amqp_pool_t *pool)
{
	int rc = 0;

	*d = *p;
#define ENGINE_REQ_COPY(flag, field) \
	if (p->_flags & (flag))      \
		rc |= engine_bytes_copy(pool, &d->field, p->field);
	ENGINE_REQ_COPY(AMQP_BASIC_CONTENT_TYPE_FLAG, content_type)
	ENGINE_REQ_COPY(AMQP_BASIC_CONTENT_ENCODING_FLAG, content_encoding)
	ENGINE_REQ_COPY(AMQP_BASIC_CORRELATION_ID_FLAG, correlation_id)
	ENGINE_REQ_COPY(AMQP_BASIC_REPLY_TO_FLAG, reply_to)
	ENGINE_REQ_COPY(AMQP_BASIC_EXPIRATION_FLAG, expiration)
	ENGINE_REQ_COPY(AMQP_BASIC_MESSAGE_ID_FLAG, message_id)
	ENGINE_REQ_COPY(AMQP_BASIC_TYPE_FLAG, type)
	ENGINE_REQ_COPY(AMQP_BASIC_USER_ID_FLAG, user_id)
	ENGINE_REQ_COPY(AMQP_BASIC_APP_ID_FLAG, app_id)
	ENGINE_REQ_COPY(AMQP_BASIC_CLUSTER_ID_FLAG, cluster_id)
#undef ENGINE_REQ_COPY
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		rc |= amqp_table_clone(&p->headers, &d->headers, pool) != AMQP_STATUS_OK;
	return rc ? -1 : 0;
}

int engine_req_publish(struct engine_req *r, const char *exchange, const char *routing_key,
		       const amqp_basic_properties_t *props, amqp_bytes_t body)
{
	r->body = body;
	if (engine_bytes_copy(&r->pool, &r->exchange, amqp_cstring_bytes(exchange)) != 0 ||
	    engine_bytes_copy(&r->pool, &r->routing_key, amqp_cstring_bytes(routing_key)) != 0)
		return -1;
	if (props)
		return engine_req_props(&r->props, props, &r->pool);
	memset(&r->props, 0, sizeof(r->props));
	return 0;
}

void engine_req_free(struct engine_req *r)
{
	if (r == NULL)
		return;
	empty_amqp_pool(&r->pool);
	free(r->body.bytes);
	free(r);
}
