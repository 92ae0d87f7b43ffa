/* engine_conn: one rabbitmq-c connection of the proxy's own: the settings
 * it is made with, connecting (the vhost's brokers or the global list, in
 * order; TLS; the PROXY header; login; the three channels and confirm
 * mode), the retry backoff, replies checked and logged once per episode of
 * failure, and the declarations and checks on the RPC channel. */
#include "engine_conn.h"

#include "../amqp/proxyproto.h"
#include "config.h"
#include "log.h"
#include "store/state.h"
#include "tls.h"
#include "upstream.h"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define ENGINE_CONN_BACKOFF_MIN_MS 100
#define ENGINE_CONN_BACKOFF_MAX_MS 10000

static struct {
	char *user, *password;
	char *hosts[CONFIG_MAX_LISTEN];
	int ports[CONFIG_MAX_LISTEN];
	int naddr;
	long connect_timeout_ms, heartbeat_s;
	int proxy_protocol; /* the broker reads a PROXY header first */
} engine_conn_cfg;

int engine_conn_enabled(void)
{
	return engine_conn_cfg.user != NULL && engine_conn_cfg.user[0] != '\0';
}

long engine_conn_heartbeat_s(void)
{
	return engine_conn_cfg.heartbeat_s;
}

int engine_conn_configure(const struct config *cfg)
{
	const struct config_value *up = &cfg->v[CFG_UPSTREAM];
	char host[256];
	int i, port;

	free(engine_conn_cfg.user);
	free(engine_conn_cfg.password);
	engine_conn_cfg.user = strdup(config_str(cfg, CFG_ENGINE_USER));
	engine_conn_cfg.password = strdup(config_str(cfg, CFG_ENGINE_PASSWORD));
	engine_conn_cfg.connect_timeout_ms = config_num(cfg, CFG_CONNECT_TIMEOUT_MS);
	engine_conn_cfg.heartbeat_s = config_num(cfg, CFG_ENGINE_HEARTBEAT_S);
	engine_conn_cfg.proxy_protocol = (int)config_num(cfg, CFG_UPSTREAM_PROXY_PROTOCOL);
	if (engine_conn_cfg.user == NULL || engine_conn_cfg.password == NULL)
		return -1;
	for (i = 0; i < engine_conn_cfg.naddr; i++)
		free(engine_conn_cfg.hosts[i]);
	engine_conn_cfg.naddr = 0;
	for (i = 0; i < up->nlist && i < CONFIG_MAX_LISTEN; i++) {
		if (config_addr_split(up->list[i], host, sizeof(host), &port) != 0)
			return -1;
		if ((engine_conn_cfg.hosts[engine_conn_cfg.naddr] = strdup(host)) == NULL)
			return -1;
		engine_conn_cfg.ports[engine_conn_cfg.naddr++] = port;
	}
	return 0;
}

void engine_conn_init(struct engine_conn *c, const char *vhost)
{
	memset(c, 0, sizeof(*c));
	c->vhost = vhost;
	c->backoff_ms = ENGINE_CONN_BACKOFF_MIN_MS;
}

/* The next attempt waits: 0.1 s, doubling to 10 s while it fails. */
static void engine_conn_backoff(struct engine_conn *c)
{
	c->retry_at = (int64_t)state_now_ms() + c->backoff_ms;
	c->backoff_ms = c->backoff_ms * 2 > ENGINE_CONN_BACKOFF_MAX_MS
			    ? ENGINE_CONN_BACKOFF_MAX_MS
			    : c->backoff_ms * 2;
}

int engine_conn_reply_ok(struct engine_conn *c, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c->amqp);

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	if (c->down_logged)
		return -1; /* said once for this episode */
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
	     r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)) {
		amqp_channel_close_t *cl = r.reply.decoded;

		log_warning("engine: vhost %s: %s: %u %.*s", c->vhost, what, cl->reply_code,
			    (int)cl->reply_text.len, (const char *)cl->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		log_warning("engine: vhost %s: %s: %s", c->vhost, what,
			    amqp_error_string2(r.library_error));
	} else {
		log_warning("engine: vhost %s: %s failed", c->vhost, what);
	}
	return -1;
}

void engine_conn_close(struct engine_conn *c, int failed)
{
	if (c->amqp == NULL)
		return;
	if (!failed)
		amqp_connection_close(c->amqp, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c->amqp);
	c->amqp = NULL;
	if (failed) {
		if (!c->down_logged)
			log_warning(
			    "engine: vhost %s: the connection of the proxy's own failed; "
			    "retrying",
			    c->vhost);
		c->down_logged = 1;
		engine_conn_backoff(c);
	}
}

void engine_conn_recovered(struct engine_conn *c)
{
	if (!c->down_logged)
		return;
	/* Connected and set up again: the episode is over. */
	log_info("engine: vhost %s: connected again", c->vhost);
	c->down_logged = 0;
	c->backoff_ms = ENGINE_CONN_BACKOFF_MIN_MS;
}

static int engine_conn_channel(struct engine_conn *c, amqp_channel_t ch)
{
	amqp_channel_open(c->amqp, ch);
	return engine_conn_reply_ok(c, "channel.open");
}

/* Told so, the broker cancels a consumer whose queue is deleted, instead
 * of dropping it silently. */
static const amqp_table_t *engine_conn_properties(amqp_table_entry_t caps[2],
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
static amqp_socket_t *engine_conn_tls_socket(struct engine_conn *c, const char *host)
{
	amqp_socket_t *sock = amqp_ssl_socket_new(c->amqp);
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
		if (!c->down_logged)
			log_warning(
			    "engine: vhost %s: cannot load the TLS CA or client certificate",
			    c->vhost);
		return NULL;
	}
	return sock;
}

/* A broker that reads the PROXY protocol wants a header on the engine's
 * connections too: the connection's own addresses (the proxy is the client). */
static int engine_conn_proxy_header(struct engine_conn *c)
{
	struct sockaddr_storage src, dst;
	socklen_t slen = sizeof(src), dlen = sizeof(dst);
	uint8_t pp[PROXYPROTO_V2_MAX];
	int fd = amqp_get_sockfd(c->amqp);
	size_t n;

	if (getsockname(fd, (struct sockaddr *)&src, &slen) != 0 ||
	    getpeername(fd, (struct sockaddr *)&dst, &dlen) != 0)
		return -1;
	n = proxyproto_write_v2(pp, (struct sockaddr *)&src, (struct sockaddr *)&dst);
	return send(fd, pp, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* A socket to the first of the brokers that answers: 0, -1 none answered,
 * -2 no socket could be made. */
static int engine_conn_reach(struct engine_conn *c, const struct upstream_list *own,
			     const struct timeval *tv)
{
	int naddr = own->n ? own->n : engine_conn_cfg.naddr, port, i, rc = -1;
	amqp_socket_t *sock;
	char host[256];
	const char *h;

	for (i = 0; i < naddr && rc != 0; i++) {
		/* An address the operator disabled is skipped (the global
		 * list's are the table's first). */
		if (upstream_disabled(own->n ? own->at[i] : i))
			continue;
		/* The vhost's own brokers when its rules name them. */
		if (own->n == 0) {
			h = engine_conn_cfg.hosts[i];
			port = engine_conn_cfg.ports[i];
		} else if (config_addr_split(upstream_node(own->at[i])->name, host,
					     sizeof(host), &port) == 0) {
			h = host;
		} else {
			continue;
		}
		if ((c->amqp = amqp_new_connection()) == NULL)
			return -2;
		sock = tls_upstream() ? engine_conn_tls_socket(c, h)
				      : amqp_tcp_socket_new(c->amqp);
		if (sock == NULL) {
			amqp_destroy_connection(c->amqp);
			c->amqp = NULL;
			return -2;
		}
		rc = amqp_socket_open_noblock(sock, h, port, tv);
		if (rc != AMQP_STATUS_OK) {
			if (!c->down_logged)
				log_warning("engine: vhost %s: cannot reach %s:%d: %s",
					    c->vhost, h, port, amqp_error_string2(rc));
			amqp_destroy_connection(c->amqp);
			c->amqp = NULL;
			rc = -1;
		}
	}
	return rc;
}

int engine_conn_open(struct engine_conn *c, const struct upstream_list *own)
{
	struct timeval tv = {engine_conn_cfg.connect_timeout_ms / 1000,
			     (engine_conn_cfg.connect_timeout_ms % 1000) * 1000};
	struct timeval rpc = {30, 0};
	amqp_table_entry_t caps[2], props[2];
	amqp_table_t cprops;
	amqp_rpc_reply_t r;
	int rc;

	c->refused = 0;
	rc = engine_conn_reach(c, own, &tv);
	if (rc == -2)
		return -2;
	if (rc != 0)
		goto failed;
	if (engine_conn_cfg.proxy_protocol && engine_conn_proxy_header(c) != 0)
		goto failed_conn;
	amqp_set_handshake_timeout(c->amqp, &tv);
	amqp_set_rpc_timeout(c->amqp, &rpc);
	r = amqp_login_with_properties(
	    c->amqp, c->vhost, 0, 131072, (int)engine_conn_cfg.heartbeat_s,
	    engine_conn_properties(caps, props, &cprops), AMQP_SASL_METHOD_PLAIN,
	    engine_conn_cfg.user, engine_conn_cfg.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
		    r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			c->refused = ((amqp_connection_close_t *)r.reply.decoded)->reply_code;
		if (!c->down_logged)
			engine_conn_reply_ok(c, "login");
		goto failed_conn;
	}
	if (engine_conn_channel(c, ENGINE_CONN_CONSUME) != 0 ||
	    engine_conn_channel(c, ENGINE_CONN_PUBLISH) != 0 ||
	    engine_conn_channel(c, ENGINE_CONN_RPC) != 0)
		goto failed_conn;
	amqp_confirm_select(c->amqp, ENGINE_CONN_PUBLISH);
	if (engine_conn_reply_ok(c, "confirm.select") != 0)
		goto failed_conn;
	if (!c->down_logged)
		log_info("engine: vhost %s: connected as %s", c->vhost, engine_conn_cfg.user);
	return 0;

failed_conn:
	amqp_destroy_connection(c->amqp);
	c->amqp = NULL;
failed:
	if (!c->down_logged)
		log_warning("engine: vhost %s: no connection of the proxy's own; retrying",
			    c->vhost);
	c->down_logged = 1;
	engine_conn_backoff(c);
	return -1;
}

/* ---- on the RPC channel ------------------------------------------------------------ */

int engine_conn_declare_exchange(struct engine_conn *c, const char *name, const char *type,
				 const char *what)
{
	amqp_exchange_declare(c->amqp, ENGINE_CONN_RPC, amqp_cstring_bytes(name),
			      amqp_cstring_bytes(type), 0, 1, 0, 0, amqp_empty_table);
	return engine_conn_reply_ok(c, what);
}

int engine_conn_declare_queue(struct engine_conn *c, const char *name, amqp_table_t args,
			      const char *what)
{
	amqp_queue_declare(c->amqp, ENGINE_CONN_RPC, amqp_cstring_bytes(name), 0, 1, 0, 0,
			   args);
	return engine_conn_reply_ok(c, what);
}

int engine_conn_bind_queue(struct engine_conn *c, const char *queue, const char *exchange,
			   const char *routing_key, const char *what)
{
	amqp_queue_bind(c->amqp, ENGINE_CONN_RPC, amqp_cstring_bytes(queue),
			amqp_cstring_bytes(exchange), amqp_cstring_bytes(routing_key),
			amqp_empty_table);
	return engine_conn_reply_ok(c, what);
}

int engine_conn_exchange_exists(struct engine_conn *c, amqp_bytes_t name)
{
	amqp_rpc_reply_t r;

	amqp_exchange_declare(c->amqp, ENGINE_CONN_RPC, name, amqp_cstring_bytes("direct"), 1,
			      0, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 1;
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		amqp_channel_close_ok_t ok = {0};

		if (amqp_send_method(c->amqp, ENGINE_CONN_RPC, AMQP_CHANNEL_CLOSE_OK_METHOD,
				     &ok) != AMQP_STATUS_OK ||
		    engine_conn_channel(c, ENGINE_CONN_RPC) != 0)
			return -1;
		return 0;
	}
	engine_conn_reply_ok(c, "checking an exchange");
	return -1;
}
