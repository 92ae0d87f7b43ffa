/* engine: the proxy's own broker connections, one per vhost that needs one,
 * each on a thread of its own with rabbitmq-c: the registry, the requests
 * workers hand over (publishes, declarations) with completions posted
 * back, the thread's loop (connect with backoff, heartbeats, frames read
 * and dispatched), the link a client works through, and the admin views.
 * Connecting is engine_conn.c, the publishes out engine_out.c, the request
 * objects engine_req.c.
 *
 * Channels: 1 consumes the client's queue, 2 publishes in confirm mode
 * (the client's publishes and the workers'), 3 runs declarations and the
 * passive checks that may close it. An input from the client's queue is
 * acknowledged only once what the client made of it is confirmed; a
 * connection that fails leaves its unacknowledged inputs to the broker,
 * which delivers them again. */
#include "engine_int.h"

#include "json.h"
#include "log.h"
#include "rules.h"
#include "store/state.h"
#include "upstream.h"
#include "vstats.h"

#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const struct engine_client *engine_client;
static pthread_mutex_t engine_list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct engine *engine_list;

int engine_enabled(void)
{
	return engine_conn_enabled();
}

int engine_configure(const struct config *cfg)
{
	return engine_conn_configure(cfg);
}

void engine_register(const struct engine_client *c)
{
	engine_client = c;
}

void *engine_state(struct engine *e)
{
	return e ? e->state : NULL;
}

struct engine *engine_next(struct engine *e)
{
	return e->next;
}

const char *engine_vhost(const struct engine *e)
{
	return e->vhost;
}

/* ---- the registry -------------------------------------------------------------- */

static void *engine_main(void *arg);
static void engine_link_init(struct engine *e);

struct engine *engine_get(const char *vhost)
{
	struct engine *e;

	pthread_mutex_lock(&engine_list_lock);
	for (e = engine_list; e; e = e->next)
		if (strcmp(e->vhost, vhost) == 0)
			break;
	if (e == NULL && (e = calloc(1, sizeof(*e))) != NULL) {
		if ((e->vhost = strdup(vhost)) == NULL || pipe(e->wake) != 0) {
			free(e->vhost);
			free(e);
			e = NULL;
			goto out;
		}
		engine_link_init(e);
		if (engine_client && (e->state = engine_client->attach(&e->link)) == NULL) {
			close(e->wake[0]);
			close(e->wake[1]);
			free(e->vhost);
			free(e);
			e = NULL;
			goto out;
		}
		fcntl(e->wake[0], F_SETFL, O_NONBLOCK);
		fcntl(e->wake[1], F_SETFL, O_NONBLOCK);
		fcntl(e->wake[0], F_SETFD, FD_CLOEXEC);
		fcntl(e->wake[1], F_SETFD, FD_CLOEXEC);
		pthread_mutex_init(&e->lock, NULL);
		e->queue_tail = &e->queue;
		e->pend_tail = &e->pend;
		engine_conn_init(&e->c, e->vhost);
		if (engine_enabled() && pthread_create(&e->thread, NULL, engine_main, e) == 0)
			e->started = 1;
		e->next = engine_list;
		engine_list = e;
	}
out:
	pthread_mutex_unlock(&engine_list_lock);
	return e;
}

static void engine_wake(struct engine *e)
{
	char c = 1;

	if (write(e->wake[1], &c, 1) < 0 && errno != EAGAIN)
		log_debug("engine: vhost %s: wake failed", e->vhost);
}

void engine_submit(struct engine *e, struct engine_req *r)
{
	int ok = 0;

	r->next = NULL;
	if (e && e->started) {
		pthread_mutex_lock(&e->lock);
		if (!e->stopping) {
			*e->queue_tail = r;
			e->queue_tail = &r->next;
			ok = 1;
		}
		pthread_mutex_unlock(&e->lock);
	}
	if (ok)
		engine_wake(e);
	else
		engine_complete(r, ENGINE_UNAVAILABLE);
}

void engine_sync(struct rules *r)
{
	struct engine *e;
	unsigned want;
	int i;

	for (i = 0; r && engine_client && engine_client->needs && i < r->n; i++)
		if (engine_client->needs(&r->v[i]))
			engine_get(r->v[i].vhost);
	pthread_mutex_lock(&engine_list_lock);
	for (e = engine_list; e; e = e->next) {
		want =
		    engine_client && engine_client->sync ? engine_client->sync(e->state, r) : 0;
		pthread_mutex_lock(&e->lock);
		if (e->rules)
			rules_unref(e->rules);
		e->rules = r;
		if (r)
			rules_ref(r);
		e->want = want;
		pthread_mutex_unlock(&e->lock);
		engine_wake(e);
	}
	pthread_mutex_unlock(&engine_list_lock);
}

void engine_stop(void)
{
	struct engine *e, *next;

	pthread_mutex_lock(&engine_list_lock);
	e = engine_list;
	engine_list = NULL;
	pthread_mutex_unlock(&engine_list_lock);
	for (; e; e = next) {
		next = e->next;
		pthread_mutex_lock(&e->lock);
		e->stopping = 1;
		pthread_mutex_unlock(&e->lock);
		engine_wake(e);
		if (e->started)
			pthread_join(e->thread, NULL);
		if (engine_client && e->state)
			engine_client->detach(e->state);
		if (e->rules)
			rules_unref(e->rules);
		close(e->wake[0]);
		close(e->wake[1]);
		pthread_mutex_destroy(&e->lock);
		free(e->vhost);
		free(e);
	}
}

/* ---- the connection -------------------------------------------------------------- */

/* Let the connection go; the broker gets back what was not acknowledged. */
static void engine_disconnect(struct engine *e, int failed)
{
	if (e->c.amqp == NULL)
		return;
	engine_conn_close(&e->c, failed);
	__atomic_store_n(&e->connected, 0, __ATOMIC_RELAXED);
	e->consuming = 0;
	e->declared = 0;
	engine_out_fail(e);
	if (failed)
		engine_add(e, ENGINE_STAT_failures, 1);
}

/* The vhost's own broker list from the rules in force (n 0: none). */
static struct upstream_list engine_upstreams(struct engine *e)
{
	struct upstream_list l = {0};
	const struct rules_vhost *v;

	pthread_mutex_lock(&e->lock);
	v = e->rules ? rules_vhost(e->rules, e->vhost) : NULL;
	if (v)
		l = v->upstream;
	pthread_mutex_unlock(&e->lock);
	return l;
}

static void engine_connect(struct engine *e)
{
	struct upstream_list own = engine_upstreams(e);
	int rc = engine_conn_open(&e->c, &own);

	if (rc == -1)
		engine_add(e, ENGINE_STAT_failures, 1);
	if (rc != 0)
		return;
	e->next_seq = 0;
	__atomic_store_n(&e->connected, 1, __ATOMIC_RELAXED);
	engine_add(e, ENGINE_STAT_connects, 1);
}

static int engine_declare(struct engine *e)
{
	if (engine_client && engine_client->declare && engine_client->declare(e->state) != 0)
		return -1;
	e->declared = 1;
	return 0;
}

static int engine_consume(struct engine *e)
{
	char what[160];

	amqp_basic_qos(e->c.amqp, ENGINE_CONN_CONSUME, 0, engine_client->prefetch, 0);
	if (engine_conn_reply_ok(&e->c, "basic.qos") != 0)
		return -1;
	amqp_basic_consume(e->c.amqp, ENGINE_CONN_CONSUME,
			   amqp_cstring_bytes(engine_client->queue), amqp_empty_bytes, 0, 0, 0,
			   amqp_empty_table);
	snprintf(what, sizeof(what), "consuming %s", engine_client->queue);
	if (engine_conn_reply_ok(&e->c, what) != 0)
		return -1;
	e->consuming = 1;
	log_info("engine: vhost %s: %s runs", e->vhost, engine_client->name);
	return 0;
}

/* ---- the link: what the client does, on the thread ---------------------------------- */

static int engine_link_ack(const struct engine_link *l, uint64_t tag)
{
	struct engine *e = l->ctx;

	return amqp_basic_ack(e->c.amqp, ENGINE_CONN_CONSUME, tag, 0) == AMQP_STATUS_OK ? 0
											: -1;
}

static int engine_link_publish(const struct engine_link *l, const struct engine_publish *p)
{
	return engine_out_send(l->ctx, NULL, p) ? 0 : -1;
}

static int engine_link_exchange_exists(const struct engine_link *l, amqp_bytes_t name)
{
	struct engine *e = l->ctx;

	return engine_conn_exchange_exists(&e->c, name);
}

static int engine_link_declare_exchange(const struct engine_link *l, const char *name,
					const char *type, const char *what)
{
	struct engine *e = l->ctx;

	return engine_conn_declare_exchange(&e->c, name, type, what);
}

static int engine_link_declare_queue(const struct engine_link *l, const char *name,
				     amqp_table_t args, const char *what)
{
	struct engine *e = l->ctx;

	return engine_conn_declare_queue(&e->c, name, args, what);
}

static int engine_link_bind_queue(const struct engine_link *l, const char *queue,
				  const char *exchange, const char *routing_key,
				  const char *what)
{
	struct engine *e = l->ctx;

	return engine_conn_bind_queue(&e->c, queue, exchange, routing_key, what);
}

static void engine_link_redeclare(const struct engine_link *l)
{
	struct engine *e = l->ctx;

	e->declared = 0;
}

static void engine_link_init(struct engine *e)
{
	e->link.vhost = e->vhost;
	e->link.ctx = e;
	e->link.ack = engine_link_ack;
	e->link.publish = engine_link_publish;
	e->link.exchange_exists = engine_link_exchange_exists;
	e->link.declare_exchange = engine_link_declare_exchange;
	e->link.declare_queue = engine_link_declare_queue;
	e->link.bind_queue = engine_link_bind_queue;
	e->link.redeclare = engine_link_redeclare;
}

/* ---- the thread -------------------------------------------------------------------- */

static int engine_run(struct engine *e, struct engine_req *r)
{
	struct engine_publish pub = {
	    r->exchange, r->routing_key, &r->props, r->body, 0, 0, 0, 0};
	struct engine_pending *p;

	if (r->op == ENGINE_DECLARE) {
		if (!e->declared && engine_declare(e) != 0) {
			engine_complete(r, ENGINE_FAILED);
			return -1;
		}
		engine_complete(r, ENGINE_OK);
		return 0;
	}
	p = engine_out_send(e, r, &pub);
	if (p == NULL) {
		engine_add(e, ENGINE_STAT_put_back_failed, 1);
		engine_complete(r, ENGINE_FAILED);
		return -1;
	}
	return 0;
}

static int engine_bytes(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_bytes_t src)
{
	dst->len = src.len;
	dst->bytes = amqp_pool_alloc(pool, src.len ? src.len : 1);
	if (dst->bytes == NULL)
		return -1;
	if (src.len)
		memcpy(dst->bytes, src.bytes, src.len);
	return 0;
}

static int engine_dispatch(struct engine *e, amqp_frame_t *f)
{
	amqp_message_t msg;
	amqp_rpc_reply_t r;
	int rc;

	if (f->frame_type != AMQP_FRAME_METHOD)
		return 0;
	switch (f->payload.method.id) {
	case AMQP_BASIC_DELIVER_METHOD: {
		uint64_t tag =
		    ((amqp_basic_deliver_t *)f->payload.method.decoded)->delivery_tag;

		r = amqp_read_message(e->c.amqp, f->channel, &msg, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL)
			return -1;
		rc = engine_client->message(e->state, tag, &msg);
		amqp_destroy_message(&msg);
		return rc;
	}
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_basic_return_t ret = *(amqp_basic_return_t *)f->payload.method.decoded;
		amqp_pool_t keep;

		/* The method's strings live in the channel's pool, which reading
		 * the content may recycle: copy them first. */
		init_amqp_pool(&keep, 512);
		if (engine_bytes(&keep, &ret.exchange, ret.exchange) != 0 ||
		    engine_bytes(&keep, &ret.routing_key, ret.routing_key) != 0) {
			empty_amqp_pool(&keep);
			return -1;
		}
		r = amqp_read_message(e->c.amqp, f->channel, &msg, 0);
		rc = r.reply_type == AMQP_RESPONSE_NORMAL ? engine_out_returned(e, &ret, &msg)
							  : -1;
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
			amqp_destroy_message(&msg);
		empty_amqp_pool(&keep);
		return rc;
	}
	case AMQP_BASIC_ACK_METHOD: {
		amqp_basic_ack_t *a = f->payload.method.decoded;

		return engine_out_confirmed(e, a->delivery_tag, a->multiple, 1);
	}
	case AMQP_BASIC_NACK_METHOD: {
		amqp_basic_nack_t *n = f->payload.method.decoded;

		return engine_out_confirmed(e, n->delivery_tag, n->multiple, 0);
	}
	case AMQP_BASIC_CANCEL_METHOD:
		/* The queue went away: declare and consume again. */
		log_warning("engine: vhost %s: the broker cancelled %s's consumer", e->vhost,
			    engine_client->name);
		return -1;
	case AMQP_CHANNEL_CLOSE_METHOD: {
		amqp_channel_close_t *c = f->payload.method.decoded;

		log_warning("engine: vhost %s: channel %u closed by the broker: %u %.*s",
			    e->vhost, f->channel, c->reply_code, (int)c->reply_text.len,
			    (const char *)c->reply_text.bytes);
		if (f->channel == ENGINE_CONN_PUBLISH)
			engine_out_closed(e);
		return -1;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		amqp_connection_close_t *c = f->payload.method.decoded;

		log_warning("engine: vhost %s: connection closed by the broker: %u %.*s",
			    e->vhost, c->reply_code, (int)c->reply_text.len,
			    (const char *)c->reply_text.bytes);
		return -1;
	}
	default:
		return 0;
	}
}

/* Read and handle what the broker sent; wait at most timeout_ms for it. */
static int engine_pump(struct engine *e, int timeout_ms)
{
	struct pollfd pf[2];
	struct timeval zero = {0, 0};
	amqp_frame_t f;
	char buf[64];
	int rc;

	if (!amqp_frames_enqueued(e->c.amqp) && !amqp_data_in_buffer(e->c.amqp)) {
		pf[0].fd = amqp_get_sockfd(e->c.amqp);
		pf[0].events = POLLIN;
		pf[1].fd = e->wake[0];
		pf[1].events = POLLIN;
		if (poll(pf, 2, timeout_ms) < 0 && errno != EINTR)
			return -1;
		if (pf[1].revents)
			while (read(e->wake[0], buf, sizeof(buf)) > 0)
				;
	}
	for (;;) {
		/* A zero wait reads what is there and sends a heartbeat when
		 * one is due. */
		rc = amqp_simple_wait_frame_noblock(e->c.amqp, &f, &zero);
		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK) {
			log_warning("engine: vhost %s: connection lost: %s", e->vhost,
				    amqp_error_string2(rc));
			return -1;
		}
		if (engine_dispatch(e, &f) != 0)
			return -1;
		amqp_maybe_release_buffers(e->c.amqp);
	}
	return 0;
}

static void engine_idle(struct engine *e, int timeout_ms)
{
	struct pollfd pf = {e->wake[0], POLLIN, 0};
	char buf[64];

	if (poll(&pf, 1, timeout_ms) > 0)
		while (read(e->wake[0], buf, sizeof(buf)) > 0)
			;
}

static void *engine_main(void *arg)
{
	struct engine *e = arg;
	struct engine_req *reqs, *r;
	int stopping, tick;
	long hb = engine_conn_heartbeat_s();
	unsigned want;

	tick = hb > 0 ? (int)(hb * 1000 / 4) : 1000;
	if (tick > 1000 || tick <= 0)
		tick = 1000;
	for (;;) {
		pthread_mutex_lock(&e->lock);
		stopping = e->stopping;
		want = e->want;
		reqs = e->queue;
		e->queue = NULL;
		e->queue_tail = &e->queue;
		pthread_mutex_unlock(&e->lock);
		if (stopping) {
			while ((r = reqs) != NULL) {
				reqs = r->next;
				engine_complete(r, ENGINE_UNAVAILABLE);
			}
			break;
		}
		if (e->c.amqp == NULL && (want || reqs) &&
		    (int64_t)state_now_ms() >= e->c.retry_at)
			engine_connect(e);
		if (e->c.amqp == NULL) {
			/* Nothing waits for a connection that is not there. */
			while ((r = reqs) != NULL) {
				reqs = r->next;
				if (r->op == ENGINE_PUBLISH)
					engine_add(e, ENGINE_STAT_put_back_failed, 1);
				engine_complete(r, ENGINE_UNAVAILABLE);
			}
			engine_idle(e, tick);
			continue;
		}
		if (want && !e->declared && engine_declare(e) != 0)
			goto failed;
		if ((want & ENGINE_WANT_CONSUME) && !e->consuming && engine_consume(e) != 0)
			goto failed;
		if (!(want & ENGINE_WANT_CONSUME) && e->consuming) {
			/* The rules stopped the consumer: start over without it. */
			engine_disconnect(e, 0);
			continue;
		}
		engine_conn_recovered(&e->c);
		while ((r = reqs) != NULL) {
			reqs = r->next;
			if (engine_run(e, r) != 0)
				goto failed;
		}
		if (engine_pump(e, tick) == 0)
			continue;
	failed:
		while ((r = reqs) != NULL) {
			reqs = r->next;
			engine_complete(r, ENGINE_FAILED);
		}
		engine_disconnect(e, 1);
	}
	if (e->c.amqp)
		engine_disconnect(e, 0);
	return NULL;
}

/* ---- admin views ---------------------------------------------------------------------- */

static uint64_t engine_load(const uint64_t *v)
{
	return __atomic_load_n(v, __ATOMIC_RELAXED);
}

void engine_stats_json(struct evbuffer *out)
{
	struct engine *e;
	int first = 1;

	pthread_mutex_lock(&engine_list_lock);
	evbuffer_add_printf(out, "{");
	for (e = engine_list; e; e = e->next) {
		evbuffer_add_printf(out, "%s\n    ", first ? "" : ",");
		json_cstring(out, e->vhost);
		evbuffer_add_printf(out, ": {\"connected\": %d",
				    __atomic_load_n(&e->connected, __ATOMIC_RELAXED));
#define ENGINE_JSON(name, metric, labels, help)           \
	evbuffer_add_printf(out, ", \"%s\": %llu", #name, \
			    (unsigned long long)engine_load(&e->stats.name));
		ENGINE_COUNTERS(ENGINE_JSON)
#undef ENGINE_JSON
		if (engine_client && engine_client->stats_json && e->state)
			engine_client->stats_json(e->state, out);
		evbuffer_add_printf(out, "}");
		first = 0;
	}
	evbuffer_add_printf(out, "%s}", first ? "" : "\n  ");
	pthread_mutex_unlock(&engine_list_lock);
}

void engine_metrics(struct evbuffer *out)
{
	struct engine *e;
	const char *family = "";

	pthread_mutex_lock(&engine_list_lock);
	if (engine_list == NULL)
		goto out;
#define ENGINE_METRIC(name, metric, labels, help)                                           \
	if (strcmp(family, metric) != 0) {                                                  \
		family = metric;                                                            \
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n", metric, help, \
				    metric);                                                \
	}                                                                                   \
	for (e = engine_list; e; e = e->next) {                                             \
		evbuffer_add_printf(out, "%s{vhost=\"", metric);                            \
		vstats_escape(out, e->vhost);                                               \
		evbuffer_add_printf(out, "\"%s%s} %llu\n", labels[0] ? "," : "", labels,    \
				    (unsigned long long)engine_load(&e->stats.name));       \
	}
	ENGINE_COUNTERS(ENGINE_METRIC)
#undef ENGINE_METRIC
	if (engine_client && engine_client->metrics)
		engine_client->metrics(out, engine_list);
out:
	pthread_mutex_unlock(&engine_list_lock);
}
