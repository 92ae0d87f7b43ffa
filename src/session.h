/* session: one client connection and its broker connection, the frames
 * between them, and the state of the pair. */
#ifndef ACEMQ_SESSION_H
#define ACEMQ_SESSION_H

#include "channel.h"
#include "pipeline.h"
#include "upstream.h"

#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

struct transport;
struct event;
struct evbuffer;
struct worker;
struct rules_vhost;
struct frame_info;
struct greeting;

enum session_state {
	SESSION_HEADER,     /* waiting for the client's protocol header */
	SESSION_CONNECTING, /* connecting to the broker */
	SESSION_HANDSHAKE,  /* start .. tune-ok pass through */
	SESSION_OPEN,       /* tuned: frame_max and heartbeats apply */
	SESSION_CLOSING,    /* the proxy closes both legs itself */
	SESSION_FLUSHING,   /* the close handshake passed; flushing, then gone */
	SESSION_GONE,       /* sockets closed; freed when the current event returns */
};

struct leg {
	struct transport *tr;
	struct session *s;
	enum chan_dir dir;   /* direction of the frames this leg reads */
	unsigned paused : 1; /* reads stopped: the other leg's output is full */
	unsigned eof : 1;    /* the peer closed or failed */
	unsigned done : 1;   /* CLOSING: this leg finished its close handshake */
	unsigned held;       /* holds on this leg's frames (session_hold) */
};

struct session {
	uint64_t id;
	struct worker *w;
	enum session_state state;
	struct leg client, upstream;
	char peer[64];
	time_t opened;                             /* accepted at (wall clock) */
	struct sockaddr_storage peer_sa, local_sa; /* the client's, and ours it reached */
	socklen_t peer_salen, local_salen;
	char vhost[128];
	char user[128];
	uint32_t frame_max;        /* negotiated; bounds every frame */
	uint32_t broker_frame_max; /* from connection.tune */
	uint16_t channel_max;
	uint16_t heartbeat;
	unsigned depth;                 /* events on the stack (see session_event) */
	unsigned started : 1;           /* connection.start reached the client */
	unsigned client_flowing : 1;    /* the client's frames are read (started) */
	unsigned closable : 1;          /* the client may be sent connection.close */
	unsigned vhost_counted : 1;     /* counted against max_connections_per_vhost */
	unsigned nopen;                 /* channels the client has open */
	uint8_t header[8];              /* the client's protocol header, for a failover */
	unsigned upstream_tried;        /* broker addresses tried (a bit each) */
	int upstream_at;                /* the one being tried or used */
	struct upstream_list upstreams; /* the vhost's own brokers (n 0: the global list) */
	struct greeting *greeting;      /* the proxy greets the client, until open-ok */
	unsigned close_seen : 1;        /* a connection.close passed through */
	unsigned proxied : 1;           /* the load balancer's PROXY header was read */
	unsigned logged_error : 1;
	struct channel **chans;
	uint32_t nchans;
	struct event *timer;
	int nhooks;
	int track; /* hooks may swallow, hold or answer: translate tags */
	uint64_t rules_generation;
	const struct rules_vhost *rules; /* cached for rules_generation */
	const struct pipe_hook *hooks[PIPELINE_MAX_HOOKS];
	void *hook_state[PIPELINE_MAX_HOOKS];
	struct session *prev, *next; /* the worker's list */
	struct session *id_next;     /* the worker's id table */
};

/* Take over an accepted socket (tls: its client speaks TLS). */
struct session *session_new(struct worker *w, int fd, const struct sockaddr *sa, int salen,
			    int tls);
/* Close both legs with connection.close code (the proxy's own close). */
void session_close(struct session *s, uint16_t code, const char *text);
/* Frames read from one direction wait (a message waits for a hook) until
 * every hold is released; then they flow again. */
void session_hold(struct session *s, enum chan_dir from);
void session_unhold(struct session *s, enum chan_dir from);
/* Close one channel on both sides with code (the broker's close-ok is
 * dropped), as the broker does for a channel error. */
void session_channel_error(struct session *s, struct channel *ch, uint16_t code,
			   const char *text, uint16_t class_id, uint16_t method_id);
/* Run fn for a completion that arrived off the session's stack, under the
 * lifetime rule: not at all when the session started closing. Returns 1
 * if fn ran. */
int session_complete(struct session *s, void (*fn)(struct session *s, void *arg), void *arg);
/* For hooks that batch store work: each complete frame read from the
 * leg that sends towards `from` and not yet looked at, in order; payload
 * holds a method or header frame's bytes (NULL for a body). Stops when fn
 * returns nonzero. */
void session_lookahead(struct session *s, enum chan_dir from,
		       int (*fn)(void *arg, const struct frame_info *fi, const uint8_t *payload,
				 size_t len),
		       void *arg);
/* The worker swapped in a new rules set. */
void session_rules_changed(struct session *s);
/* A completion or timer that ran off the session's stack looks its session
 * up by id with worker_session_find and does nothing when it is gone. */

struct evbuffer *session_out(struct session *s, enum chan_dir dir);
struct channel *session_channel(struct session *s, uint16_t id);
/* One row of GET /connections, as a JSON object, on the session's worker. */
void session_describe(struct session *s, struct evbuffer *out);
/* The rules for the session's vhost as of now, or NULL. */
const struct rules_vhost *session_rules(struct session *s);

#define session_log(s, level, fmt, ...)                                                       \
	log_msg(level, "c=%llu client=%s vhost=%s user=%s " fmt, (unsigned long long)(s)->id, \
		(s)->peer, (s)->vhost[0] ? (s)->vhost : "-", (s)->user[0] ? (s)->user : "-",  \
		##__VA_ARGS__)

#endif
