/* session: one client connection and its broker connection: the pair's
 * state and lifetime, and the entry points the files of the session share.
 * The session is spread over files by concern (docs/architecture.md):
 *   session.c    lifetime, state, events, wake-ups, closing
 *   host.c       what the session offers its pipeline (the host interface)
 *   dial.c       connecting the broker leg (addresses, failover, TLS, PROXY)
 *   handshake.c  the protocol header, connection negotiation, the greeting
 *   relay.c      frames: classification, the pump, the lookahead, content
 *   request.c    methods the client sends that the proxy reads
 *   response.c   methods the broker sends that the proxy reads */
#ifndef ACEMQ_SESSION_H
#define ACEMQ_SESSION_H

#include "channel.h"
#include "limits.h"
#include "list.h"
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
	unsigned woken : 1;  /* pump it at the session's next wake-up */
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
	unsigned gated : 1;     /* its vhost is paused: publishes wait (control.c) */
	unsigned gate_held : 1; /* the client's frames wait at a publish */
	unsigned draining : 1;  /* closes once its publishes are confirmed */
	char *control_reason;   /* an operator's close or drain: the close's text */
	unsigned rated : 1;     /* its vhost's rules limit the publish rate */
	unsigned rate_held : 1; /* the client's frames wait for the rate */
	uint64_t rate_bytes;    /* content bytes read since the last take */
	struct event *later;    /* the rate's wait (made when first needed) */
	struct channel **chans;
	uint32_t nchans;
	struct event *timer;
	struct event *wake;   /* made active to pump woken legs later this turn */
	struct pipeline pipe; /* the hooks, and what they see of the session */
	struct list link;     /* in the worker's list */
};

/* Take over an accepted socket (tls: its client speaks TLS). */
struct session *session_new(struct worker *w, int fd, const struct sockaddr *sa, int salen,
			    int tls);
/* Close both legs with connection.close code (the proxy's own close). */
void session_close(struct session *s, uint16_t code, const char *text);
/* The worker swapped in a new rules set. */
void session_rules_changed(struct session *s);
/* One row of GET /connections, as a JSON object, on the session's worker. */
void session_describe(struct session *s, struct evbuffer *out);

/* ---- for the session's own files ---------------------------------------
 * The lifetime rule: every event enters through session_event, which drops
 * what a closing or gone session no longer takes; the memory goes only when
 * the outermost event returns. A completion that arrives later reaches the
 * session through its pipeline (pipeline_call), never by a stored pointer
 * that outlived it: hooks cut their links in detach.
 * The wake-up rule: nothing runs a leg's pump from inside another call. A
 * leg that can go on (its holds released, its peer drained, the broker's
 * connection.start passed) is marked and pumped from the session's wake
 * event, later in the same loop turn. */

#define REPLY_CONNECTION_FORCED   320
#define REPLY_ACCESS_REFUSED      403
#define REPLY_PRECONDITION_FAILED 406
#define REPLY_FRAME_ERROR         501
#define REPLY_SYNTAX_ERROR        502
#define REPLY_COMMAND_INVALID     503
#define REPLY_CHANNEL_ERROR       504
#define REPLY_UNEXPECTED_FRAME    505
#define REPLY_NOT_ALLOWED         530

/* Events on the session's stack: the memory goes only when the outermost
 * one leaves (session_leave frees a session that is gone). */
void session_enter(struct session *s);
void session_leave(struct session *s);
/* The one place the state changes. */
void session_set_state(struct session *s, enum session_state st);
/* The session is finished: both sockets close now (memory goes later). */
void session_end(struct session *s);
/* The proxy closes both legs itself with a connection.close. */
void session_shut(struct session *s, uint16_t code, const char *text);
/* Both legs flush what is queued for them, then the session ends. */
void session_flush_and_go(struct session *s);
/* Free a leg's socket once what is queued for it has been written. */
void session_leg_finish(struct session *s, struct leg *l);
/* Both legs gone: end. Returns 1 if it ended. */
int session_reap(struct session *s);
void session_leg_setup(struct session *s, struct leg *l, struct transport *tr,
		       enum chan_dir dir);
void session_timer_set(struct session *s, long ms);
/* TCP_NODELAY on a socket (nothing for a pipe's -1). */
void session_nodelay(int fd);
void session_format_peer(char *out, size_t len, const struct sockaddr *sa);
struct evbuffer *session_out(struct session *s, enum chan_dir dir);
/* The channel with this number, created when missing (frames from a leg),
 * or NULL when out of memory. */
struct channel *session_channel(struct session *s, uint16_t id);
/* A channel is closed (or opened anew): its state goes. */
void session_channel_shut(struct session *s, struct channel *ch);
/* Frames read from one direction wait until every hold is released; the
 * last release wakes the leg (see the wake-up rule). */
void session_hold(struct session *s, enum chan_dir from);
void session_unhold(struct session *s, enum chan_dir from);
/* The leg facing the other peer. */
static inline struct leg *session_other(struct session *s, struct leg *l)
{
	return l == &s->client ? &s->upstream : &s->client;
}
/* The session's SEV_LATER event in ms (control_later runs then). */
int session_later(struct session *s, long ms);
/* Mark a leg to be pumped at the next wake-up, later in this loop turn. */
void session_wake(struct session *s, struct leg *l);

#define session_log(s, level, fmt, ...)                                                       \
	log_msg(level, "c=%llu client=%s vhost=%s user=%s " fmt, (unsigned long long)(s)->id, \
		(s)->peer, (s)->vhost[0] ? (s)->vhost : "-", (s)->user[0] ? (s)->user : "-",  \
		##__VA_ARGS__)

#endif
