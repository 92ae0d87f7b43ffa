/* engine_conn: one rabbitmq-c connection of the proxy's own: the settings
 * it is made with, connecting (the vhost's brokers or the global list, in
 * order; TLS; the PROXY header; login; the three channels and confirm
 * mode), the retry backoff, replies checked and logged once per episode of
 * failure, and the declarations and checks on the RPC channel. */
#ifndef ACEMQ_ENGINE_CONN_H
#define ACEMQ_ENGINE_CONN_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stdint.h>

struct config;
struct upstream_list;

#define ENGINE_CONN_CONSUME 1 /* the client's consumer */
#define ENGINE_CONN_PUBLISH 2 /* confirm mode: every publish */
#define ENGINE_CONN_RPC     3 /* declarations, and passive checks that may close it */

struct engine_conn {
	const char *vhost;
	amqp_connection_state_t amqp; /* NULL: not connected */
	int64_t retry_at, backoff_ms;
	int down_logged;  /* a failure was said: quiet until connected again */
	uint16_t refused; /* the last login's refusal by the broker (530: no such
			   * vhost, or not the user's), or 0 */
};

/* Settings: credentials, broker addresses, timeouts. 0 or -1. */
int engine_conn_configure(const struct config *cfg);
int engine_conn_enabled(void);
long engine_conn_heartbeat_s(void);

void engine_conn_init(struct engine_conn *c, const char *vhost);
/* Connect to own's brokers (n 0: the global list), the first that
 * answers. 0; -1 with the next attempt put off (the backoff doubles); -2
 * when no socket could be made (out of memory, TLS files that do not
 * load): tried again at the next turn, not counted as a failure. */
int engine_conn_open(struct engine_conn *c, const struct upstream_list *own);
/* Let the connection go: closed in good order, or failed (said once per
 * episode, the next attempt put off). */
void engine_conn_close(struct engine_conn *c, int failed);
/* Connected and set up again after failing: said once, backoff reset. */
void engine_conn_recovered(struct engine_conn *c);
/* The last RPC's reply: 0, or -1 (logged, naming what, once per episode). */
int engine_conn_reply_ok(struct engine_conn *c, const char *what);

/* On the RPC channel, durable: 0 or -1. */
int engine_conn_declare_exchange(struct engine_conn *c, const char *name, const char *type,
				 const char *what);
int engine_conn_declare_queue(struct engine_conn *c, const char *name, amqp_table_t args,
			      const char *what);
int engine_conn_bind_queue(struct engine_conn *c, const char *queue, const char *exchange,
			   const char *routing_key, const char *what);
/* A passive declaration: 1 it exists, 0 the broker closed the channel
 * (opened again), -1 the connection failed. */
int engine_conn_exchange_exists(struct engine_conn *c, amqp_bytes_t name);

#endif
