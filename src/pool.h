/* pool: broker connections shared by the clients of a pooled vhost (the
 * rules' "pool"): per (vhost, user), opened with that user's credentials,
 * each carrying many clients' channels, renumbered both ways. A pooled
 * session's broker leg is a pipe (transport_pipe) whose peer is the pool:
 * the session, its relay and its pipeline run unchanged. Files:
 *   pool.c       pools, the credential cache, attaching and waiting
 *   pool_conn.c  one broker connection: its handshake, its frames to clients
 *   pool_mux.c   a client's frames onto a broker connection */
#ifndef ACEMQ_POOL_H
#define ACEMQ_POOL_H

#include <stdint.h>

struct session;
struct rules_vhost;
struct evbuffer;
struct transport;
struct event_base;
struct sockaddr;

/* The session's broker leg becomes a pipe to its vhost's pool (the
 * greeting goes on as if a broker answered). 0, or -1 (out of memory). */
int pool_dial(struct session *s, const struct rules_vhost *v);
/* The broker connection a pooled session's leg rides on (its id, 0 while
 * waiting), or -1 when tr is not a pool's pipe. */
int64_t pool_conn_id(struct transport *tr);
/* On a worker's thread as it ends: its pools' connections are closed. */
void pool_worker_fini(void);
/* A seam for tests: how a pooled broker connection connects (NULL: as
 * the sessions' broker legs do). */
extern struct transport *(*pool_connect)(struct event_base *base, const struct sockaddr *sa,
					 int salen);
/* Gauges for /metrics and /stats: connections, channels in use, clients
 * waiting, over every worker. */
struct pool_gauges {
	unsigned long connections, channels, waiting;
};
void pool_gauges(struct pool_gauges *g);

#endif
