/* engine: the proxy's own broker connections, one per vhost that needs one,
 * each on a thread of its own with rabbitmq-c: the schedule ladder's
 * declarations, the scheduler, and put-backs of in-progress deliveries.
 *
 * Channels: 1 consumes the ladder's control queue, 2 publishes in confirm
 * mode (hops, deliveries, put-backs), 3 runs declarations and the passive
 * checks that may close it. An input from the control queue is acknowledged
 * only once what it became is confirmed; a connection that fails leaves its
 * unacknowledged inputs to the broker, which delivers them again. */
#include "engine.h"

#include "../amqp/proxyproto.h"
#include "config.h"
#include "ladder.h"
#include "log.h"
#include "rules.h"
#include "store/state.h"
#include "tls.h"
#include "upstream.h"
#include "vstats.h"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENGINE_CH_CONSUME     1
#define ENGINE_CH_PUBLISH     2
#define ENGINE_CH_RPC         3
#define ENGINE_PREFETCH       256
#define ENGINE_BACKOFF_MIN_MS 100
#define ENGINE_BACKOFF_MAX_MS 10000
#define ENGINE_EXCHANGE_CACHE 16
#define ENGINE_EXISTS_MS      10000 /* a passive check holds this long */
#define ENGINE_SUSPECT_MS     10000 /* an exchange whose publish closed the channel */

const int64_t engine_late_bounds[ENGINE_LATE_BUCKETS] = {50,   100,  250,   500,  1000,
							 2000, 5000, 10000, 60000};

enum engine_kind { PEND_REQ, PEND_DELIVER, PEND_HOP, PEND_REHOP };

/* A publish on channel 2 waiting for its confirm. */
struct engine_pending {
	uint64_t seq;
	enum engine_kind kind;
	struct engine_req *req; /* PEND_REQ */
	uint64_t input;         /* the control-queue delivery it settles, or 0 */
	int64_t due_at;
	amqp_bytes_t exchange, routing_key; /* malloc'd, to match a basic.return */
	unsigned done : 1, ok : 1, returned : 1;
	struct engine_pending *next;
};

struct engine_exchange {
	char name[128];
	int64_t until;
	int suspect; /* 1: publishing to it closed the channel; 0: it exists */
};

struct engine {
	char *vhost;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	struct engine_req *queue, **queue_tail; /* under lock */
	int stopping;                           /* under lock */
	int want_ladder, want_consume;          /* under lock */
	struct rules *rules;                    /* under lock: a reference */
	int wake[2];
	int ladder_ready, connected; /* atomic */
	struct engine_stats stats;
	uint64_t late[ENGINE_LATE_BUCKETS + 1], late_count, late_sum_ms; /* atomic */
	/* The thread's own. */
	amqp_connection_state_t conn;
	int consuming, ladder_declared;
	uint64_t next_seq;
	struct engine_pending *pend, **pend_tail; /* in publish order */
	int64_t retry_at, backoff_ms;
	int down_logged, malformed_logged;
	int64_t forbidden_logged_at;
	struct engine_exchange cache[ENGINE_EXCHANGE_CACHE];
	struct engine *next;
};

static struct {
	char *user, *password;
	char *hosts[CONFIG_MAX_LISTEN];
	int ports[CONFIG_MAX_LISTEN];
	int naddr;
	long connect_timeout_ms, heartbeat_s;
	int proxy_protocol; /* the broker reads a PROXY header first */
} engine_cfg;

static pthread_mutex_t engine_list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct engine *engine_list;

static void engine_add(struct engine *e, enum engine_stat what, uint64_t n)
{
	uint64_t *v = (uint64_t *)&e->stats + what;

	__atomic_fetch_add(v, n, __ATOMIC_RELAXED);
}

void engine_count(struct engine *e, enum engine_stat what)
{
	if (e)
		engine_add(e, what, 1);
}

int engine_enabled(void)
{
	return engine_cfg.user != NULL && engine_cfg.user[0] != '\0';
}

int engine_configure(const struct config *cfg)
{
	const struct config_value *up = &cfg->v[CFG_UPSTREAM];
	char host[256];
	int i, port;

	free(engine_cfg.user);
	free(engine_cfg.password);
	engine_cfg.user = strdup(config_str(cfg, CFG_ENGINE_USER));
	engine_cfg.password = strdup(config_str(cfg, CFG_ENGINE_PASSWORD));
	engine_cfg.connect_timeout_ms = config_num(cfg, CFG_CONNECT_TIMEOUT_MS);
	engine_cfg.heartbeat_s = config_num(cfg, CFG_ENGINE_HEARTBEAT_S);
	engine_cfg.proxy_protocol = (int)config_num(cfg, CFG_UPSTREAM_PROXY_PROTOCOL);
	if (engine_cfg.user == NULL || engine_cfg.password == NULL)
		return -1;
	for (i = 0; i < engine_cfg.naddr; i++)
		free(engine_cfg.hosts[i]);
	engine_cfg.naddr = 0;
	for (i = 0; i < up->nlist && i < CONFIG_MAX_LISTEN; i++) {
		if (config_addr_split(up->list[i], host, sizeof(host), &port) != 0)
			return -1;
		if ((engine_cfg.hosts[engine_cfg.naddr] = strdup(host)) == NULL)
			return -1;
		engine_cfg.ports[engine_cfg.naddr++] = port;
	}
	return 0;
}

/* ---- requests ---------------------------------------------------------------- */

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

static int engine_props_copy(amqp_basic_properties_t *d, const amqp_basic_properties_t *p,
			     amqp_pool_t *pool)
{
	int rc = 0;

	*d = *p;
#define ENGINE_COPY(flag, field) \
	if (p->_flags & (flag))  \
		rc |= engine_bytes(pool, &d->field, p->field);
	ENGINE_COPY(AMQP_BASIC_CONTENT_TYPE_FLAG, content_type)
	ENGINE_COPY(AMQP_BASIC_CONTENT_ENCODING_FLAG, content_encoding)
	ENGINE_COPY(AMQP_BASIC_CORRELATION_ID_FLAG, correlation_id)
	ENGINE_COPY(AMQP_BASIC_REPLY_TO_FLAG, reply_to)
	ENGINE_COPY(AMQP_BASIC_EXPIRATION_FLAG, expiration)
	ENGINE_COPY(AMQP_BASIC_MESSAGE_ID_FLAG, message_id)
	ENGINE_COPY(AMQP_BASIC_TYPE_FLAG, type)
	ENGINE_COPY(AMQP_BASIC_USER_ID_FLAG, user_id)
	ENGINE_COPY(AMQP_BASIC_APP_ID_FLAG, app_id)
	ENGINE_COPY(AMQP_BASIC_CLUSTER_ID_FLAG, cluster_id)
#undef ENGINE_COPY
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		rc |= amqp_table_clone(&p->headers, &d->headers, pool) != AMQP_STATUS_OK;
	return rc ? -1 : 0;
}

int engine_req_publish(struct engine_req *r, const char *exchange, const char *routing_key,
		       const amqp_basic_properties_t *props, amqp_bytes_t body)
{
	r->body = body;
	if (engine_bytes(&r->pool, &r->exchange, amqp_cstring_bytes(exchange)) != 0 ||
	    engine_bytes(&r->pool, &r->routing_key, amqp_cstring_bytes(routing_key)) != 0)
		return -1;
	if (props)
		return engine_props_copy(&r->props, props, &r->pool);
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

static void engine_complete(struct engine_req *r, enum engine_rc rc)
{
	r->rc = rc;
	worker_post(r->w, &r->call);
}

/* ---- the registry -------------------------------------------------------------- */

static void *engine_main(void *arg);

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
		fcntl(e->wake[0], F_SETFL, O_NONBLOCK);
		fcntl(e->wake[1], F_SETFL, O_NONBLOCK);
		fcntl(e->wake[0], F_SETFD, FD_CLOEXEC);
		fcntl(e->wake[1], F_SETFD, FD_CLOEXEC);
		pthread_mutex_init(&e->lock, NULL);
		e->queue_tail = &e->queue;
		e->pend_tail = &e->pend;
		e->backoff_ms = ENGINE_BACKOFF_MIN_MS;
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

int engine_ladder_ready(struct engine *e)
{
	return e && __atomic_load_n(&e->ladder_ready, __ATOMIC_ACQUIRE);
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
	int i;

	for (i = 0; r && i < r->n; i++) {
		const struct rules_vhost *v = &r->v[i];

		if (!v->schedule.enabled)
			continue;
		if (!engine_enabled())
			log_warning(
			    "engine: vhost %s: schedule rules, but engine_user is not set: "
			    "the proxy neither declares the ladder nor runs the scheduler",
			    v->vhost);
		engine_get(v->vhost);
	}
	pthread_mutex_lock(&engine_list_lock);
	for (e = engine_list; e; e = e->next) {
		const struct rules_vhost *v = r ? rules_vhost(r, e->vhost) : NULL;

		pthread_mutex_lock(&e->lock);
		if (e->rules)
			rules_unref(e->rules);
		e->rules = r;
		if (r)
			rules_ref(r);
		e->want_ladder = v && v->schedule.enabled;
		e->want_consume = v && v->schedule.enabled && v->schedule.engine;
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

static int engine_reply_ok(struct engine *e, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(e->conn);

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	if (e->down_logged)
		return -1; /* said once for this episode */
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
	     r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)) {
		amqp_channel_close_t *c = r.reply.decoded;

		log_warning("engine: vhost %s: %s: %u %.*s", e->vhost, what, c->reply_code,
			    (int)c->reply_text.len, (const char *)c->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		log_warning("engine: vhost %s: %s: %s", e->vhost, what,
			    amqp_error_string2(r.library_error));
	} else {
		log_warning("engine: vhost %s: %s failed", e->vhost, what);
	}
	return -1;
}

static void engine_fail_pending(struct engine *e)
{
	struct engine_pending *p, *next;

	for (p = e->pend; p; p = next) {
		next = p->next;
		if (p->req) {
			if (p->req->op == ENGINE_PUBLISH)
				engine_add(e, ENGINE_STAT_put_back_failed, 1);
			engine_complete(p->req, ENGINE_FAILED);
		}
		free(p->exchange.bytes);
		free(p->routing_key.bytes);
		free(p);
	}
	e->pend = NULL;
	e->pend_tail = &e->pend;
}

/* Let the connection go; the broker gets back what was not acknowledged. */
static void engine_disconnect(struct engine *e, int failed)
{
	if (e->conn == NULL)
		return;
	if (!failed)
		amqp_connection_close(e->conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(e->conn);
	e->conn = NULL;
	__atomic_store_n(&e->connected, 0, __ATOMIC_RELAXED);
	e->consuming = 0;
	e->ladder_declared = 0;
	engine_fail_pending(e);
	if (failed) {
		if (!e->down_logged)
			log_warning(
			    "engine: vhost %s: the connection of the proxy's own failed; "
			    "retrying",
			    e->vhost);
		e->down_logged = 1;
		engine_add(e, ENGINE_STAT_failures, 1);
		e->retry_at = (int64_t)state_now_ms() + e->backoff_ms;
		e->backoff_ms = e->backoff_ms * 2 > ENGINE_BACKOFF_MAX_MS
				    ? ENGINE_BACKOFF_MAX_MS
				    : e->backoff_ms * 2;
	}
}

static int engine_open_channel(struct engine *e, amqp_channel_t ch)
{
	amqp_channel_open(e->conn, ch);
	return engine_reply_ok(e, "channel.open");
}

/* Told so, the broker cancels the scheduler's consumer when the control
 * queue is deleted, instead of dropping it silently. */
static const amqp_table_t *engine_client_properties(amqp_table_entry_t caps[2],
						    amqp_table_entry_t props[2],
						    amqp_table_t *table)
{
	caps[0].key = amqp_cstring_bytes("consumer_cancel_notify");
	caps[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[0].value.value.boolean = 1;
	caps[1].key = amqp_cstring_bytes("publisher_confirms");
	caps[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[1].value.value.boolean = 1;
	props[0].key = amqp_cstring_bytes("capabilities");
	props[0].value.kind = AMQP_FIELD_KIND_TABLE;
	props[0].value.value.table.num_entries = 2;
	props[0].value.value.table.entries = caps;
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes("acemq-proxy engine");
	table->num_entries = 2;
	table->entries = props;
	return table;
}

/* TLS like the workers' broker connections: the broker's certificate is
 * verified (its name is the address's host), a client certificate given
 * when configured. */
static amqp_socket_t *engine_tls_socket(struct engine *e, const char *host)
{
	amqp_socket_t *sock = amqp_ssl_socket_new(e->conn);
	unsigned char ip[16];
	/* rabbitmq-c checks a host name against the certificate's names only:
	 * for an address, the chain is verified and not the name. */
	int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
	const char *ca =
	    tls_upstream_ca() ? tls_upstream_ca() : "/etc/ssl/certs/ca-certificates.crt";

	if (sock == NULL)
		return NULL;
	amqp_ssl_socket_set_verify_peer(sock, 1);
	amqp_ssl_socket_set_verify_hostname(sock, !is_ip);
	if (amqp_ssl_socket_set_cacert(sock, ca) != AMQP_STATUS_OK ||
	    (tls_upstream_cert() &&
	     amqp_ssl_socket_set_key(sock, tls_upstream_cert(), tls_upstream_key()) !=
		 AMQP_STATUS_OK)) {
		if (!e->down_logged)
			log_warning(
			    "engine: vhost %s: cannot load the TLS CA or client certificate",
			    e->vhost);
		return NULL;
	}
	return sock;
}

/* A broker that reads the PROXY protocol wants a header on the engine's
 * connections too: the connection's own addresses (the proxy is the client). */
static int engine_proxy_header(struct engine *e)
{
	struct sockaddr_storage src, dst;
	socklen_t slen = sizeof(src), dlen = sizeof(dst);
	uint8_t pp[PROXYPROTO_V2_MAX];
	int fd = amqp_get_sockfd(e->conn);
	size_t n;

	if (getsockname(fd, (struct sockaddr *)&src, &slen) != 0 ||
	    getpeername(fd, (struct sockaddr *)&dst, &dlen) != 0)
		return -1;
	n = proxyproto_write_v2(pp, (struct sockaddr *)&src, (struct sockaddr *)&dst);
	return send(fd, pp, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
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

static int engine_connect(struct engine *e)
{
	struct timeval tv = {engine_cfg.connect_timeout_ms / 1000,
			     (engine_cfg.connect_timeout_ms % 1000) * 1000};
	struct timeval rpc = {30, 0};
	amqp_table_entry_t caps[2], props[2];
	amqp_table_t cprops;
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	int i, rc = -1;

	struct upstream_list own = engine_upstreams(e);
	int naddr = own.n ? own.n : engine_cfg.naddr, port;
	char host[256];
	const char *h;

	for (i = 0; i < naddr && rc != 0; i++) {
		/* The vhost's own brokers when its rules name them. */
		if (own.n == 0) {
			h = engine_cfg.hosts[i];
			port = engine_cfg.ports[i];
		} else if (config_addr_split(upstream_node(own.at[i])->name, host, sizeof(host),
					     &port) == 0) {
			h = host;
		} else {
			continue;
		}
		if ((e->conn = amqp_new_connection()) == NULL)
			return -1;
		sock = tls_upstream() ? engine_tls_socket(e, h) : amqp_tcp_socket_new(e->conn);
		if (sock == NULL) {
			amqp_destroy_connection(e->conn);
			e->conn = NULL;
			return -1;
		}
		rc = amqp_socket_open_noblock(sock, h, port, &tv);
		if (rc != AMQP_STATUS_OK) {
			if (!e->down_logged)
				log_warning("engine: vhost %s: cannot reach %s:%d: %s",
					    e->vhost, h, port, amqp_error_string2(rc));
			amqp_destroy_connection(e->conn);
			e->conn = NULL;
			rc = -1;
		}
	}
	if (rc != 0)
		goto failed;
	if (engine_cfg.proxy_protocol && engine_proxy_header(e) != 0)
		goto failed_conn;
	amqp_set_handshake_timeout(e->conn, &tv);
	amqp_set_rpc_timeout(e->conn, &rpc);
	r = amqp_login_with_properties(
	    e->conn, e->vhost, 0, 131072, (int)engine_cfg.heartbeat_s,
	    engine_client_properties(caps, props, &cprops), AMQP_SASL_METHOD_PLAIN,
	    engine_cfg.user, engine_cfg.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		if (!e->down_logged)
			engine_reply_ok(e, "login");
		goto failed_conn;
	}
	if (engine_open_channel(e, ENGINE_CH_CONSUME) != 0 ||
	    engine_open_channel(e, ENGINE_CH_PUBLISH) != 0 ||
	    engine_open_channel(e, ENGINE_CH_RPC) != 0)
		goto failed_conn;
	amqp_confirm_select(e->conn, ENGINE_CH_PUBLISH);
	if (engine_reply_ok(e, "confirm.select") != 0)
		goto failed_conn;
	e->next_seq = 0;
	__atomic_store_n(&e->connected, 1, __ATOMIC_RELAXED);
	engine_add(e, ENGINE_STAT_connects, 1);
	if (!e->down_logged)
		log_info("engine: vhost %s: connected as %s", e->vhost, engine_cfg.user);
	return 0;

failed_conn:
	amqp_destroy_connection(e->conn);
	e->conn = NULL;
failed:
	if (!e->down_logged)
		log_warning("engine: vhost %s: no connection of the proxy's own; retrying",
			    e->vhost);
	e->down_logged = 1;
	engine_add(e, ENGINE_STAT_failures, 1);
	e->retry_at = (int64_t)state_now_ms() + e->backoff_ms;
	e->backoff_ms = e->backoff_ms * 2 > ENGINE_BACKOFF_MAX_MS ? ENGINE_BACKOFF_MAX_MS
								  : e->backoff_ms * 2;
	return -1;
}

static int engine_declare_ladder(struct engine *e)
{
	amqp_table_entry_t ent[3];
	amqp_table_t args;
	int i;

	amqp_exchange_declare(e->conn, ENGINE_CH_RPC, amqp_cstring_bytes(LADDER_EXCHANGE),
			      amqp_cstring_bytes("direct"), 0, 1, 0, 0, amqp_empty_table);
	if (engine_reply_ok(e, "declaring " LADDER_EXCHANGE) != 0)
		return -1;
	for (i = 0; i <= LADDER_RUNGS; i++) {
		const char *q = i < LADDER_RUNGS ? ladder_rungs[i].queue : LADDER_DUE;

		args = i < LADDER_RUNGS ? ladder_rung_args(&ladder_rungs[i], ent)
					: amqp_empty_table;
		amqp_queue_declare(e->conn, ENGINE_CH_RPC, amqp_cstring_bytes(q), 0, 1, 0, 0,
				   args);
		if (engine_reply_ok(e, "declaring the ladder's queues") != 0)
			return -1;
		amqp_queue_bind(e->conn, ENGINE_CH_RPC, amqp_cstring_bytes(q),
				amqp_cstring_bytes(LADDER_EXCHANGE), amqp_cstring_bytes(q),
				amqp_empty_table);
		if (engine_reply_ok(e, "binding the ladder's queues") != 0)
			return -1;
	}
	e->ladder_declared = 1;
	__atomic_store_n(&e->ladder_ready, 1, __ATOMIC_RELEASE);
	return 0;
}

static int engine_consume(struct engine *e)
{
	amqp_basic_qos(e->conn, ENGINE_CH_CONSUME, 0, ENGINE_PREFETCH, 0);
	if (engine_reply_ok(e, "basic.qos") != 0)
		return -1;
	amqp_basic_consume(e->conn, ENGINE_CH_CONSUME, amqp_cstring_bytes(LADDER_DUE),
			   amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
	if (engine_reply_ok(e, "consuming " LADDER_DUE) != 0)
		return -1;
	e->consuming = 1;
	log_info("engine: vhost %s: the scheduler runs", e->vhost);
	return 0;
}

/* ---- exchanges ------------------------------------------------------------------- */

static struct engine_exchange *engine_cached(struct engine *e, amqp_bytes_t name, int64_t now)
{
	int i;

	for (i = 0; i < ENGINE_EXCHANGE_CACHE; i++) {
		struct engine_exchange *c = &e->cache[i];

		if (c->until > now && strlen(c->name) == name.len &&
		    memcmp(c->name, name.bytes, name.len) == 0)
			return c;
	}
	return NULL;
}

static void engine_cache(struct engine *e, amqp_bytes_t name, int suspect, int64_t until)
{
	struct engine_exchange *c = &e->cache[0];
	int i;

	if (name.len >= sizeof(c->name))
		return;
	for (i = 1; i < ENGINE_EXCHANGE_CACHE; i++)
		if (e->cache[i].until < c->until)
			c = &e->cache[i];
	memcpy(c->name, name.bytes, name.len);
	c->name[name.len] = '\0';
	c->suspect = suspect;
	c->until = until;
}

/* Whether a due message can go to exchange now: 1 yes, 0 no (missing, or
 * publishing to it closed the channel lately), -1 the connection failed. */
static int engine_exchange_ok(struct engine *e, amqp_bytes_t name)
{
	int64_t now = (int64_t)state_now_ms();
	struct engine_exchange *c;
	amqp_rpc_reply_t r;

	if (name.len == 0)
		return 1; /* the default exchange */
	if ((c = engine_cached(e, name, now)) != NULL)
		return !c->suspect;
	amqp_exchange_declare(e->conn, ENGINE_CH_RPC, name, amqp_cstring_bytes("direct"), 1, 0,
			      0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(e->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		engine_cache(e, name, 0, now + ENGINE_EXISTS_MS);
		return 1;
	}
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		amqp_channel_close_ok_t ok = {0};

		if (amqp_send_method(e->conn, ENGINE_CH_RPC, AMQP_CHANNEL_CLOSE_OK_METHOD,
				     &ok) != AMQP_STATUS_OK ||
		    engine_open_channel(e, ENGINE_CH_RPC) != 0)
			return -1;
		return 0;
	}
	engine_reply_ok(e, "checking an exchange");
	return -1;
}

/* ---- publishing -------------------------------------------------------------------- */

static struct engine_pending *engine_publish(struct engine *e, enum engine_kind kind,
					     amqp_bytes_t exchange, amqp_bytes_t routing_key,
					     const amqp_basic_properties_t *props,
					     amqp_bytes_t body)
{
	struct engine_pending *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return NULL;
	p->exchange.bytes = malloc(exchange.len + 1);
	p->routing_key.bytes = malloc(routing_key.len + 1);
	if (p->exchange.bytes == NULL || p->routing_key.bytes == NULL)
		goto fail;
	memcpy(p->exchange.bytes, exchange.bytes, exchange.len);
	memcpy(p->routing_key.bytes, routing_key.bytes, routing_key.len);
	p->exchange.len = exchange.len;
	p->routing_key.len = routing_key.len;
	if (amqp_basic_publish(e->conn, ENGINE_CH_PUBLISH, exchange, routing_key, 1, 0, props,
			       body) != AMQP_STATUS_OK)
		goto fail;
	p->kind = kind;
	p->seq = ++e->next_seq;
	if (e->pend == NULL)
		e->pend_tail = &e->pend;
	*e->pend_tail = p;
	e->pend_tail = &p->next;
	return p;
fail:
	free(p->exchange.bytes);
	free(p->routing_key.bytes);
	free(p);
	return NULL;
}

static void engine_late(struct engine *e, int64_t late_ms)
{
	int i;

	if (late_ms < 0)
		late_ms = 0;
	for (i = 0; i < ENGINE_LATE_BUCKETS && late_ms > engine_late_bounds[i]; i++)
		;
	__atomic_fetch_add(&e->late[i], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&e->late_count, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&e->late_sum_ms, (uint64_t)late_ms, __ATOMIC_RELAXED);
}

/* A publish is settled: settle what it stood for. */
static int engine_finish(struct engine *e, struct engine_pending *p)
{
	int rc = 0;

	if (p->req) {
		enum engine_rc how = !p->ok        ? ENGINE_NACKED
				     : p->returned ? ENGINE_RETURNED
						   : ENGINE_OK;

		if (p->req->op == ENGINE_PUBLISH)
			engine_add(e,
				   how == ENGINE_OK ? ENGINE_STAT_put_back
						    : ENGINE_STAT_put_back_failed,
				   1);
		engine_complete(p->req, how);
	} else if (p->input) {
		if (p->ok && !(p->returned && p->kind != PEND_DELIVER)) {
			rc = amqp_basic_ack(e->conn, ENGINE_CH_CONSUME, p->input, 0);
			if (p->kind == PEND_DELIVER) {
				engine_add(e, ENGINE_STAT_delivered, 1);
				engine_late(e, (int64_t)state_now_ms() - p->due_at);
			} else if (p->kind == PEND_HOP) {
				engine_add(e, ENGINE_STAT_hops, 1);
			}
		} else {
			/* Refused, or a hop the ladder could not take (a rung
			 * gone): the broker keeps it and delivers it again. */
			if (p->returned) {
				__atomic_store_n(&e->ladder_ready, 0, __ATOMIC_RELEASE);
				e->ladder_declared = 0;
			}
			rc = amqp_basic_nack(e->conn, ENGINE_CH_CONSUME, p->input, 0, 1);
		}
	}
	free(p->exchange.bytes);
	free(p->routing_key.bytes);
	free(p);
	return rc == AMQP_STATUS_OK ? 0 : -1;
}

static int engine_confirmed(struct engine *e, uint64_t seq, int multiple, int ok)
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
			rc |= engine_finish(e, p);
		} else {
			pp = &p->next;
		}
	}
	return rc;
}

/* A basic.return comes before the confirm of the publish it returns: the
 * oldest unsettled publish to the same exchange and routing key. A due
 * message that came back goes into the smallest rung again, rebuilt from
 * what was returned. */
static int engine_returned(struct engine *e, const amqp_basic_return_t *ret,
			   amqp_message_t *msg)
{
	struct engine_pending *p, *rehop;
	amqp_bytes_t ex = ret->exchange, rk = ret->routing_key;

	for (p = e->pend; p; p = p->next)
		if (!p->returned && p->exchange.len == ex.len && p->routing_key.len == rk.len &&
		    (ex.len == 0 || memcmp(p->exchange.bytes, ex.bytes, ex.len) == 0) &&
		    (rk.len == 0 || memcmp(p->routing_key.bytes, rk.bytes, rk.len) == 0))
			break;
	if (p == NULL)
		return 0;
	p->returned = 1;
	if (p->kind != PEND_DELIVER)
		return 0;
	engine_add(e, ENGINE_STAT_unroutable, 1);
	if (ladder_readd(&msg->properties, &msg->pool, ex, rk, p->due_at) != 0)
		return -1;
	rehop = engine_publish(e, PEND_REHOP, amqp_cstring_bytes(LADDER_EXCHANGE),
			       amqp_cstring_bytes(ladder_smallest()->queue), &msg->properties,
			       msg->body);
	if (rehop == NULL)
		return -1;
	rehop->input = p->input;
	p->input = 0;
	return 0;
}

/* ---- the scheduler ------------------------------------------------------------------ */

static int engine_allowed(struct engine *e, amqp_bytes_t ex, amqp_bytes_t rk)
{
	const struct rules_vhost *v;
	int ok = 0;

	pthread_mutex_lock(&e->lock);
	v = e->rules ? rules_vhost(e->rules, e->vhost) : NULL;
	if (v && v->schedule.enabled)
		ok = rules_matches(&v->schedule.match, (const char *)ex.bytes, ex.len,
				   (const char *)rk.bytes, rk.len);
	pthread_mutex_unlock(&e->lock);
	return ok;
}

static int engine_schedule(struct engine *e, uint64_t tag, amqp_message_t *msg)
{
	struct ladder_plan plan;
	struct engine_pending *p = NULL;
	int ok;

	ladder_plan(&msg->properties, (int64_t)state_now_ms(), &plan);
	switch (plan.action) {
	case LADDER_MALFORMED:
		engine_add(e, ENGINE_STAT_malformed, 1);
		if (!e->malformed_logged)
			log_warning("engine: vhost %s: a message in " LADDER_DUE
				    " without the scheduling headers was dropped",
				    e->vhost);
		e->malformed_logged = 1;
		return amqp_basic_ack(e->conn, ENGINE_CH_CONSUME, tag, 0) == AMQP_STATUS_OK
			   ? 0
			   : -1;
	case LADDER_HOP:
		p = engine_publish(e, PEND_HOP, amqp_cstring_bytes(LADDER_EXCHANGE),
				   amqp_cstring_bytes(plan.rung->queue), &msg->properties,
				   msg->body);
		break;
	case LADDER_DELIVER:
		if (!engine_allowed(e, plan.exchange, plan.routing_key)) {
			int64_t now = (int64_t)state_now_ms();

			engine_add(e, ENGINE_STAT_forbidden, 1);
			if (now - e->forbidden_logged_at >= 60000) {
				/* One line a minute at most. */
				e->forbidden_logged_at = now;
				log_warning(
				    "engine: vhost %s: a scheduled message for exchange "
				    "'%.*s' routing key '%.*s' was dropped: no schedule rule "
				    "allows it",
				    e->vhost, (int)plan.exchange.len,
				    (const char *)plan.exchange.bytes,
				    (int)plan.routing_key.len,
				    (const char *)plan.routing_key.bytes);
			}
			return amqp_basic_ack(e->conn, ENGINE_CH_CONSUME, tag, 0) ==
				       AMQP_STATUS_OK
				   ? 0
				   : -1;
		}
		ok = engine_exchange_ok(e, plan.exchange);
		if (ok < 0)
			return -1;
		if (!ok) {
			engine_add(e, ENGINE_STAT_unroutable, 1);
			p = engine_publish(e, PEND_REHOP, amqp_cstring_bytes(LADDER_EXCHANGE),
					   amqp_cstring_bytes(ladder_smallest()->queue),
					   &msg->properties, msg->body);
			break;
		}
		{
			/* plan's names point into the headers ladder_final edits. */
			amqp_bytes_t ex, rk;

			if (engine_bytes(&msg->pool, &ex, plan.exchange) != 0 ||
			    engine_bytes(&msg->pool, &rk, plan.routing_key) != 0 ||
			    ladder_final(&msg->properties, &msg->pool) != 0)
				return -1;
			p = engine_publish(e, PEND_DELIVER, ex, rk, &msg->properties,
					   msg->body);
		}
		break;
	}
	if (p == NULL)
		return -1;
	p->input = tag;
	p->due_at = plan.due_at;
	return 0;
}

/* ---- requests on the thread ---------------------------------------------------------- */

static int engine_run(struct engine *e, struct engine_req *r)
{
	struct engine_pending *p;

	if (r->op == ENGINE_LADDER) {
		if (!e->ladder_declared && engine_declare_ladder(e) != 0) {
			engine_complete(r, ENGINE_FAILED);
			return -1;
		}
		engine_complete(r, ENGINE_OK);
		return 0;
	}
	p = engine_publish(e, PEND_REQ, r->exchange, r->routing_key, &r->props, r->body);
	if (p == NULL) {
		engine_add(e, ENGINE_STAT_put_back_failed, 1);
		engine_complete(r, ENGINE_FAILED);
		return -1;
	}
	p->req = r;
	return 0;
}

/* Mark the exchanges of deliveries out when the publish channel closed, so
 * that what closed it does not come round again at once. */
static void engine_suspect_pending(struct engine *e)
{
	struct engine_pending *p;
	int64_t until = (int64_t)state_now_ms() + ENGINE_SUSPECT_MS;

	for (p = e->pend; p; p = p->next)
		if (p->kind == PEND_DELIVER)
			engine_cache(e, p->exchange, 1, until);
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

		r = amqp_read_message(e->conn, f->channel, &msg, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL)
			return -1;
		rc = engine_schedule(e, tag, &msg);
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
		r = amqp_read_message(e->conn, f->channel, &msg, 0);
		rc = r.reply_type == AMQP_RESPONSE_NORMAL ? engine_returned(e, &ret, &msg) : -1;
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
			amqp_destroy_message(&msg);
		empty_amqp_pool(&keep);
		return rc;
	}
	case AMQP_BASIC_ACK_METHOD: {
		amqp_basic_ack_t *a = f->payload.method.decoded;

		return engine_confirmed(e, a->delivery_tag, a->multiple, 1);
	}
	case AMQP_BASIC_NACK_METHOD: {
		amqp_basic_nack_t *n = f->payload.method.decoded;

		return engine_confirmed(e, n->delivery_tag, n->multiple, 0);
	}
	case AMQP_BASIC_CANCEL_METHOD:
		/* The control queue went away: declare and consume again. */
		log_warning("engine: vhost %s: the broker cancelled the scheduler's consumer",
			    e->vhost);
		return -1;
	case AMQP_CHANNEL_CLOSE_METHOD: {
		amqp_channel_close_t *c = f->payload.method.decoded;

		log_warning("engine: vhost %s: channel %u closed by the broker: %u %.*s",
			    e->vhost, f->channel, c->reply_code, (int)c->reply_text.len,
			    (const char *)c->reply_text.bytes);
		if (f->channel == ENGINE_CH_PUBLISH)
			engine_suspect_pending(e);
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

	if (!amqp_frames_enqueued(e->conn) && !amqp_data_in_buffer(e->conn)) {
		pf[0].fd = amqp_get_sockfd(e->conn);
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
		rc = amqp_simple_wait_frame_noblock(e->conn, &f, &zero);
		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK) {
			log_warning("engine: vhost %s: connection lost: %s", e->vhost,
				    amqp_error_string2(rc));
			return -1;
		}
		if (engine_dispatch(e, &f) != 0)
			return -1;
		amqp_maybe_release_buffers(e->conn);
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
	int stopping, want_ladder, want_consume, tick;

	tick = engine_cfg.heartbeat_s > 0 ? (int)(engine_cfg.heartbeat_s * 1000 / 4) : 1000;
	if (tick > 1000 || tick <= 0)
		tick = 1000;
	for (;;) {
		pthread_mutex_lock(&e->lock);
		stopping = e->stopping;
		want_ladder = e->want_ladder;
		want_consume = e->want_consume;
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
		if (e->conn == NULL && (want_ladder || want_consume || reqs) &&
		    (int64_t)state_now_ms() >= e->retry_at)
			engine_connect(e);
		if (e->conn == NULL) {
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
		if ((want_ladder || want_consume) && !e->ladder_declared &&
		    engine_declare_ladder(e) != 0)
			goto failed;
		if (want_consume && !e->consuming && engine_consume(e) != 0)
			goto failed;
		if (!want_consume && e->consuming) {
			/* The rules stopped the scheduler: start over without it. */
			engine_disconnect(e, 0);
			continue;
		}
		if (e->down_logged) {
			/* Connected and set up again: the episode is over. */
			log_info("engine: vhost %s: connected again", e->vhost);
			e->down_logged = 0;
			e->backoff_ms = ENGINE_BACKOFF_MIN_MS;
		}
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
	if (e->conn)
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
	int i, first = 1;

	pthread_mutex_lock(&engine_list_lock);
	evbuffer_add_printf(out, "{");
	for (e = engine_list; e; e = e->next) {
		evbuffer_add_printf(out, "%s\n    \"", first ? "" : ",");
		vstats_escape(out, e->vhost, 1);
		evbuffer_add_printf(out, "\": {\"connected\": %d, \"ladder_ready\": %d",
				    __atomic_load_n(&e->connected, __ATOMIC_RELAXED),
				    engine_ladder_ready(e));
#define ENGINE_JSON(name, metric, labels, help)           \
	evbuffer_add_printf(out, ", \"%s\": %llu", #name, \
			    (unsigned long long)engine_load(&e->stats.name));
		ENGINE_COUNTERS(ENGINE_JSON)
#undef ENGINE_JSON
		evbuffer_add_printf(out, ", \"lateness_ms\": {");
		for (i = 0; i <= ENGINE_LATE_BUCKETS; i++) {
			if (i < ENGINE_LATE_BUCKETS)
				evbuffer_add_printf(
				    out, "\"le_%lld\": ", (long long)engine_late_bounds[i]);
			else
				evbuffer_add_printf(out, "\"more\": ");
			evbuffer_add_printf(out, "%llu%s",
					    (unsigned long long)engine_load(&e->late[i]),
					    i < ENGINE_LATE_BUCKETS ? ", " : "");
		}
		evbuffer_add_printf(out, "}}");
		first = 0;
	}
	evbuffer_add_printf(out, "%s}", first ? "" : "\n  ");
	pthread_mutex_unlock(&engine_list_lock);
}

void engine_metrics(struct evbuffer *out)
{
	struct engine *e;
	const char *family = "";
	uint64_t cum;
	int i;

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
		vstats_escape(out, e->vhost, 0);                                            \
		evbuffer_add_printf(out, "\"%s%s} %llu\n", labels[0] ? "," : "", labels,    \
				    (unsigned long long)engine_load(&e->stats.name));       \
	}
	ENGINE_COUNTERS(ENGINE_METRIC)
#undef ENGINE_METRIC
	evbuffer_add_printf(out, "# HELP acemq_proxy_schedule_lateness_seconds time from a "
				 "scheduled message's due time to its delivery\n"
				 "# TYPE acemq_proxy_schedule_lateness_seconds histogram\n");
	for (e = engine_list; e; e = e->next) {
		for (cum = 0, i = 0; i <= ENGINE_LATE_BUCKETS; i++) {
			cum += engine_load(&e->late[i]);
			evbuffer_add_printf(
			    out, "acemq_proxy_schedule_lateness_seconds_bucket{vhost=\"");
			vstats_escape(out, e->vhost, 0);
			if (i < ENGINE_LATE_BUCKETS)
				evbuffer_add_printf(out, "\",le=\"%g\"} %llu\n",
						    (double)engine_late_bounds[i] / 1000,
						    (unsigned long long)cum);
			else
				evbuffer_add_printf(out, "\",le=\"+Inf\"} %llu\n",
						    (unsigned long long)cum);
		}
		evbuffer_add_printf(out, "acemq_proxy_schedule_lateness_seconds_sum{vhost=\"");
		vstats_escape(out, e->vhost, 0);
		evbuffer_add_printf(out, "\"} %g\n",
				    (double)engine_load(&e->late_sum_ms) / 1000);
		evbuffer_add_printf(out,
				    "acemq_proxy_schedule_lateness_seconds_count{vhost=\"");
		vstats_escape(out, e->vhost, 0);
		evbuffer_add_printf(out, "\"} %llu\n",
				    (unsigned long long)engine_load(&e->late_count));
	}
out:
	pthread_mutex_unlock(&engine_list_lock);
}
