/* replay: dead letters moved back where they came from. A replay takes up
 * to count messages from a queue, at most rate a second, and republishes
 * each to the exchange and routing key of its first x-death entry (or to a
 * target it was given), mandatory and confirmed; the message leaves the
 * source (basic.ack) only once its publish is confirmed and was not
 * returned. What it does not move (returned, refused, no target, a claim
 * check whose payload is gone) stays in the source unacknowledged until
 * the replay ends, so that the queue never hands it out twice, and goes
 * back when it ends. Each replay runs on a thread of its own with a broker
 * connection of the proxy's own (engine_conn: engine_user, the vhost's
 * brokers, TLS, the PROXY header), never on a worker's loop. */
#ifndef ACEMQ_REPLAY_H
#define ACEMQ_REPLAY_H

#include "store/claims.h"
#include "upstream.h"

#include <stdint.h>

struct evbuffer;

#define REPLAY_MAX_COUNT    100000 /* messages one replay may take */
#define REPLAY_MAX_RATE     10000  /* messages a second */
#define REPLAY_DEFAULT_RATE 100
#define REPLAY_MAX_RUNNING  4   /* replays at once */
#define REPLAY_KEEP         32  /* ended replays kept for GET, the oldest go first */
#define REPLAY_WINDOW       64  /* publishes out waiting for their confirm */
#define REPLAY_MAX_MISSING  100 /* missing payloads named in a replay's answer */
#define REPLAY_NAME_MAX     255 /* a vhost's, queue's, exchange's, routing key's bytes */

/* What to replay. */
struct replay_spec {
	char vhost[REPLAY_NAME_MAX + 1];
	char queue[REPLAY_NAME_MAX + 1];
	int has_target; /* exchange and routing_key given: every message goes there */
	char exchange[REPLAY_NAME_MAX + 1];
	char routing_key[REPLAY_NAME_MAX + 1];
	long count, rate;
	struct upstream_list upstream; /* the vhost's own brokers (n 0: the global list) */
	int claim_check;               /* the vhost has a claim_check rule: where says where */
	struct claims_where where;
};

/* replay_start's refusals. */
#define REPLAY_ERR_BUSY     -1 /* REPLAY_MAX_RUNNING run already */
#define REPLAY_ERR_SAME     -2 /* a replay of that queue runs already */
#define REPLAY_ERR_NOMEM    -3
#define REPLAY_ERR_DISABLED -4 /* no engine_user: no connection of the proxy's own */

/* Start a replay: its id (> 0), or a REPLAY_ERR_. */
long replay_start(const struct replay_spec *spec);
/* Wait at most ms for replay id to be running (connected, its queue and
 * target found) or to have failed starting. The HTTP status its start
 * gets: 202 running (or still connecting), 404 (the vhost, queue or
 * exchange is not there), 409, 503 (no broker answered); *why gets the
 * reason of a failure (a static string, or NULL). */
int replay_started(long id, long ms, const char **why);
/* Let a replay that failed starting go (its thread ended). */
void replay_forget(long id);
/* Cancel: stop taking messages, settle what is out. 1 cancelled, 0 it
 * had ended, -1 no such replay. */
int replay_cancel(long id);
/* Wait at most ms for replay id to end; 1 ended, 0 not yet, -1 no such. */
int replay_wait(long id, long ms);
/* Its JSON object (and a newline); -1 no such replay. */
int replay_json(long id, struct evbuffer *out);
/* {"replays": [...]}: every replay kept, the newest first. */
void replay_list_json(struct evbuffer *out);
/* Cancel every replay and wait for their threads (at shutdown). */
void replay_stop(void);

#endif
