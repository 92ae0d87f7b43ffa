/* pipeline: the hook point where patterns see, rewrite, swallow or hold
 * whole messages, and the assembly of the messages they asked for. */
#ifndef ACEMQ_PIPELINE_H
#define ACEMQ_PIPELINE_H

#include "channel.h"
#include "list.h"
#include "log.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <stddef.h>
#include <stdint.h>

struct event;
struct evbuffer;
struct channel;
struct frame_info;
struct rules_vhost;
struct worker;
struct pipeline;

#define PIPELINE_MAX_HOOKS 8

/* Where a hook's look-ahead on a leg got to: the next one starts there
 * instead of at the first frame waiting (zeroed: at the first). */
struct pipeline_mark {
	const void *leg; /* the leg's transport it was taken on */
	uint64_t at;     /* a frame's start, counted in the leg's bytes read */
};

/* What a look-ahead callback answers for a frame. */
enum {
	PIPELINE_AHEAD_ON = 0,    /* looked at: the next one */
	PIPELINE_AHEAD_STOP = 1,  /* stop here */
	PIPELINE_AHEAD_AGAIN = 2, /* the next one, but look at this one again
				   * next time (a message starts here whose
				   * header is not in yet) */
};

/* What the pipeline asks of the connection that carries it. The session
 * sets it when it attaches; the pipeline never sees the session itself.
 * None of these runs the connection's pump: a leg that can go on again
 * is woken later in the same loop turn. */
struct pipeline_host {
	/* The output towards dir, or NULL when that leg is gone. */
	struct evbuffer *(*out)(void *owner, enum chan_dir dir);
	/* Frames read from the leg that sends towards from wait (hold), or
	 * may go on once every hold is released (wake; the leg is pumped
	 * later in this loop turn, never from inside the caller). */
	void (*hold)(void *owner, enum chan_dir from);
	void (*wake)(void *owner, enum chan_dir from);
	/* Close one channel on both sides, as the broker does for a
	 * channel error; or the whole connection. */
	void (*channel_error)(void *owner, struct channel *ch, uint16_t code, const char *text,
			      uint16_t class_id, uint16_t method_id);
	void (*close)(void *owner, uint16_t code, const char *text);
	/* The channel with this number, or NULL (never created here). */
	struct channel *(*channel)(void *owner, uint16_t id);
	/* Each complete frame not yet looked at on the leg that sends
	 * towards from, from mark on (see pipeline_lookahead). */
	void (*lookahead)(void *owner, enum chan_dir from, struct pipeline_mark *mark,
			  int (*fn)(void *arg, const struct frame_info *fi,
				    const uint8_t *payload, size_t len),
			  void *arg);
	/* Run fn now unless the connection started closing; 1 if it ran. */
	int (*call)(void *owner, void (*fn)(struct pipeline *p, void *arg), void *arg);
};

enum pipe_kind { PIPE_PUBLISH, PIPE_DELIVER, PIPE_GET_OK, PIPE_RETURN };

/* What a hook wants of a message, from wants(). */
enum { PIPE_WANT_NONE = 0, PIPE_WANT_MSG = 1, PIPE_WANT_BODY = 2 };

enum pipe_verdict {
	PIPE_PASS,    /* forward it (with any rewrite applied) */
	PIPE_SWALLOW, /* a delivery the client never sees; settled upstream */
	PIPE_HOLD,    /* the hook keeps it; it calls pipeline_release later */
	PIPE_ANSWER,  /* a publish the proxy answers itself (not forwarded) */
	PIPE_WAIT,    /* not yet: the hook keeps it and finishes it later with
		       * pipeline_resume; until then later frames from the
		       * same leg wait behind it */
	PIPE_REFUSE,  /* a publish not forwarded: basic.nack in confirm mode,
		       * otherwise its channel is closed with 541 */
	PIPE_REJECT,  /* a delivery the client never sees, rejected upstream
		       * without requeue (dead-lettered); a no-ack one, which
		       * the broker already let go, is delivered as it is */
};

struct pipe_msg {
	enum pipe_kind kind;
	uint16_t channel;
	amqp_pool_t pool;
	amqp_method_number_t method_id;
	void *method; /* decoded: amqp_basic_publish_t, _deliver_t, ... */
	amqp_basic_properties_t *props;
	uint64_t body_size;
	struct evbuffer *raw;              /* the original frames, in order */
	size_t raw_method_len;             /* bytes of the method frame in raw */
	size_t raw_header_len;             /* bytes of the header frame in raw */
	struct evbuffer *body;             /* payload bytes when a hook asked for them */
	uint64_t broker_tag;               /* deliveries: the broker's delivery tag */
	int no_ack;                        /* deliveries: the client will not settle it */
	int want;                          /* union of what the hooks asked for */
	int hook_want[PIPELINE_MAX_HOOKS]; /* what each hook asked for */
	int next_hook;                     /* after a hook waited: the next to ask */
	int streamer;        /* index of the hook taking the body as a stream, or -1 */
	uint64_t started_us; /* monotonic: its first frame was read */
	uint64_t renewed_us; /* kept: a hook renewed its claim then (0: never) */
	unsigned method_dirty : 1, props_dirty : 1, body_dirty : 1;
	/* props differ from the frame only by headers appended after the
	 * headers_at_decode entries it had (-1: no table): the frame is
	 * spliced instead of re-encoded (see pipeline_headers_appended). */
	unsigned props_appended : 1;
	int headers_at_decode;
};

struct pipe_hook {
	const char *name;
	/* Only rewrites messages (never swallows, holds or answers) and keeps
	 * no state between messages: attached or detached at any time, and
	 * delivery tags need no translation for it. */
	int rewrite_only;
	/* Per connection: return state to attach, or NULL to stay out. */
	void *(*attach)(struct pipeline *p);
	void (*detach)(void *state);
	/* Whether the hook wants this message; method is decoded. */
	int (*wants)(void *state, struct pipeline *p, struct channel *ch, enum pipe_kind kind,
		     amqp_method_number_t id, void *method);
	/* Streaming, for a body too large to hold: called once the header
	 * is in (method, props and body_size known); returning 1 takes the
	 * body as a stream. The proxy then holds none of it: each body
	 * chunk goes to stream_body, and by message() the hook must have put
	 * the replacement body in m->body and set body_dirty. */
	int (*stream_begin)(void *state, struct pipeline *p, struct channel *ch,
			    struct pipe_msg *m);
	int (*stream_body)(void *state, struct pipeline *p, struct channel *ch,
			   struct pipe_msg *m, const uint8_t *data, size_t len);
	enum pipe_verdict (*message)(void *state, struct pipeline *p, struct channel *ch,
				     struct pipe_msg *m);
	/* The client settled a delivery (basic.ack/nack/reject), broker tag. */
	void (*settle)(void *state, struct pipeline *p, struct channel *ch,
		       amqp_method_number_t how, uint64_t broker_tag);
	void (*channel_closed)(void *state, struct pipeline *p, struct channel *ch);
	/* The output towards the client fell below its low mark. */
	void (*drained)(void *state, struct pipeline *p);
	/* Once the header is in (props and body_size known): what the hook
	 * still wants of a message it asked for. When no hook wants it any
	 * more, the message goes on as it was and its body is not held. */
	int (*header_want)(void *state, struct pipeline *p, struct channel *ch,
			   struct pipe_msg *m);
	/* Before a client's ack, nack or reject (client_tag, multiple) goes
	 * upstream: 0 lets it go; 1 holds it (and the client's later frames)
	 * until the hook calls pipeline_settle_release; it is then asked
	 * again. */
	int (*settle_gate)(void *state, struct pipeline *p, struct channel *ch,
			   amqp_method_number_t how, uint64_t client_tag, int multiple);
	/* basic.recover: the broker redelivers what is unacked on ch. */
	void (*recovered)(void *state, struct pipeline *p, struct channel *ch);
	/* New input arrived on a leg held for a waiting message (from: the
	 * direction it reads): a hook that batches store work may look ahead
	 * again, so what arrived joins the next commit. */
	void (*held_input)(void *state, struct pipeline *p, int from);
	/* A publish that was assembled is disposed of: forwarded to the
	 * broker (forwarded 1; broker_seq is its confirm sequence number
	 * there when its channel is in confirm mode, else 0), or not
	 * (answered, refused, or dropped with its channel). ch is NULL when
	 * the channel is not at hand. m is only identified, never kept. */
	void (*published)(void *state, struct pipeline *p, struct channel *ch,
			  struct pipe_msg *m, int forwarded, uint64_t broker_seq);
	/* The broker acked (acked 1) or nacked a forwarded publish: called
	 * once for each sequence number a (multiple) confirm covers. */
	void (*publish_settled)(void *state, struct pipeline *p, struct channel *ch,
				uint64_t broker_seq, int acked);
	/* How many deliveries beyond its prefetch a consumer of queue
	 * (acking, under that prefetch) should be sent by the broker, kept
	 * by the proxy until the client has room (surplus.h): the hook's
	 * store work for a delivery then runs while the client is still busy
	 * with earlier ones. 0: none. */
	int (*asks_ahead)(void *state, struct pipeline *p, const char *queue,
			  uint16_t prefetch);
	/* A delivery kept past its consumer's prefetch goes to the client now,
	 * waited_ms after it arrived or its claim was last renewed (a claim
	 * made then may want renewing). */
	void (*surplus_out)(void *state, struct pipeline *p, struct channel *ch,
			    uint64_t broker_tag, uint64_t waited_ms);
	/* The same, for a delivery still kept, a few times a second: 1 when
	 * the hook renewed what it holds for it (its clock starts again). */
	int (*surplus_waiting)(void *state, struct pipeline *p, struct channel *ch,
			       uint64_t broker_tag, uint64_t waited_ms);
};

/* The pipeline of one connection: what a hook sees of it (its worker,
 * vhost and rules, its channels through the host), and the hooks attached.
 * Embedded in the session; owned by pipeline.c. */
struct pipeline {
	const struct pipeline_host *host;
	void *owner;
	struct worker *w;
	uint64_t id;       /* the connection's id (logs, store owners) */
	const char *peer;  /* for log lines: the client's address */
	const char *vhost; /* "" until connection.open */
	const char *user;
	uint32_t frame_max; /* the client's, for frames the pipeline writes */
	int nhooks;
	int track; /* hooks may swallow, hold or answer: translate tags */
	uint64_t rules_generation;
	const struct rules_vhost *rules; /* cached for rules_generation */
	const struct pipe_hook *hooks[PIPELINE_MAX_HOOKS];
	void *hook_state[PIPELINE_MAX_HOOKS];
	struct list surplus_due;     /* channels' surpluses with room opened */
	struct list surplus_kept;    /* channels' surpluses keeping deliveries */
	struct event *surplus_timer; /* looks at kept deliveries while there are any */
};

void pipeline_register(const struct pipe_hook *hook);
/* Set up a connection's pipeline (no hooks attached yet). */
void pipeline_init(struct pipeline *p, const struct pipeline_host *host, void *owner,
		   struct worker *w, uint64_t id);
/* Attach the registered hooks; returns how many attached. */
int pipeline_attach(struct pipeline *p);
void pipeline_detach(struct pipeline *p);
/* New rules: re-decide which rewrite-only hooks apply. */
void pipeline_refresh(struct pipeline *p);
/* The rules for the connection's vhost as of now, or NULL. */
const struct rules_vhost *pipeline_rules(struct pipeline *p);

/* For hooks: the host's services (see struct pipeline_host). */
struct channel *pipeline_channel(struct pipeline *p, uint16_t id);
struct evbuffer *pipeline_out(struct pipeline *p, enum chan_dir dir);
void pipeline_hold(struct pipeline *p, enum chan_dir from);
void pipeline_wake(struct pipeline *p, enum chan_dir from);
void pipeline_close(struct pipeline *p, uint16_t code, const char *text);
void pipeline_channel_error(struct pipeline *p, struct channel *ch, uint16_t code,
			    const char *text, uint16_t class_id, uint16_t method_id);
/* fn for each complete frame waiting on the leg that sends towards from,
 * from *mark on (NULL: from the first); *mark then says where to start
 * next time. fn answers PIPELINE_AHEAD_*. */
void pipeline_lookahead(struct pipeline *p, enum chan_dir from, struct pipeline_mark *mark,
			int (*fn)(void *arg, const struct frame_info *fi,
				  const uint8_t *payload, size_t len),
			void *arg);
/* Run fn for a completion that arrived off the connection's stack, under
 * the lifetime rule: not at all when it started closing. 1 if fn ran. */
int pipeline_call(struct pipeline *p, void (*fn)(struct pipeline *p, void *arg), void *arg);

#define pipeline_log(p, level, fmt, ...)                                                      \
	log_msg(level, "c=%llu client=%s vhost=%s user=%s " fmt, (unsigned long long)(p)->id, \
		(p)->peer, (p)->vhost[0] ? (p)->vhost : "-", (p)->user[0] ? (p)->user : "-",  \
		##__VA_ARGS__)

struct pipe_msg *pipe_msg_new(enum pipe_kind kind, uint16_t channel);
void pipe_msg_free(struct pipe_msg *m);

enum {
	PIPE_COLLECT_OK = 0,
	PIPE_COLLECT_RELEASE = 1, /* no hook wants it after all: pipeline_pass it */
	PIPE_COLLECT_TOO_LARGE = -1,
	PIPE_COLLECT_FAILED = -2,
};

/* Called by the relay for each frame of a message it decided to
 * assemble; returns PIPE_COLLECT_OK, _TOO_LARGE when the message exceeds
 * max_message_size, or _FAILED (bad frame, no memory, a stream refused). */
int pipeline_collect(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
		     struct evbuffer *in, size_t frame_len, int frame_type);
/* The message is complete: run the hooks and dispose of it. */
int pipeline_complete(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
/* Forward what was collected of a message no hook wants after all; the
 * rest of its frames move as they are. */
int pipeline_pass(struct pipeline *p, struct channel *ch, struct pipe_msg *m);

/* For hooks: finish a message that waited (PIPE_WAIT) with a final
 * verdict (not PIPE_WAIT or PIPE_HOLD); its leg's frames flow again. */
int pipeline_resume(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
		    enum pipe_verdict v);
/* For hooks: finish a waiting delivery (or return) whose body the hook
 * streams: the method and properties go out with body_size, then the body
 * in any number of pieces, re-framed at the client's frame_max. end frees
 * m and lets the leg's frames flow again. */
int pipeline_stream_out_begin(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			      uint64_t body_size);
int pipeline_stream_out(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			const void *data, size_t len);
/* As pipeline_stream_out, without copying data: the client's output
 * refers to it until it is written (or the connection goes), then
 * release(arg) runs on this worker, exactly once, whatever this returns. */
int pipeline_stream_out_lent(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			     const void *data, size_t len, void (*release)(void *arg),
			     void *arg);
void pipeline_stream_out_end(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
/* Let go of a message that waited, without a word to either side (its
 * channel went away); its leg's frames flow again. */
void pipeline_drop(struct pipeline *p, struct pipe_msg *m);
/* Bytes queued towards the client (for a hook pacing a stream). */
size_t pipeline_client_backlog(struct pipeline *p);

/* For hooks: forward a held delivery now, or give it back to the broker. */
int pipeline_release(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
int pipeline_requeue(struct pipeline *p, struct channel *ch, struct pipe_msg *m, int requeue);
/* For hooks: acknowledge a held delivery upstream; the client never sees it. */
int pipeline_ack(struct pipeline *p, struct channel *ch, struct pipe_msg *m);
/* The message's body (whole, as the publisher or broker sent it) in a new
 * malloc'd copy; 0 or -1. */
int pipeline_body_copy(const struct pipe_msg *m, amqp_bytes_t *out);
/* A hook's only change to m->props was appending entries to its headers
 * table (made if it had none): the header frame is then edited in place,
 * the appended entries encoded alone, instead of encoding every property
 * again. Any other change sets props_dirty, which wins. */
void pipeline_headers_appended(struct pipe_msg *m);

/* Which hooks want a message: each hook's answer in per_hook, which has
 * PIPELINE_MAX_HOOKS slots, every one written (0 past the attached
 * hooks); 0 if none. */
int pipeline_wants(struct pipeline *p, struct channel *ch, enum pipe_kind kind,
		   amqp_method_number_t id, void *method, int per_hook[PIPELINE_MAX_HOOKS]);
void pipeline_settled(struct pipeline *p, struct channel *ch, amqp_method_number_t how,
		      uint64_t broker_tag);
void pipeline_channel_closed(struct pipeline *p, struct channel *ch);
void pipeline_drained(struct pipeline *p);
void pipeline_recovered(struct pipeline *p, struct channel *ch);
void pipeline_held_input(struct pipeline *p, int from);
/* Whether a hook follows the broker's confirms of forwarded publishes. */
int pipeline_publish_watched(const struct pipeline *p);
void pipeline_publish_settled(struct pipeline *p, struct channel *ch, uint64_t broker_seq,
			      int acked);
/* How many beyond the client's prefetch the hooks ask for, for a consumer
 * of queue (the most any asks: pipe_hook.asks_ahead). */
int pipeline_surplus_ahead(struct pipeline *p, const char *queue, uint16_t prefetch);
/* For hooks: the client has sent its settle of broker_tag, which waits
 * (settle_gate): its consumer may be sent the next delivery kept for it
 * (marked only; pipeline_surplus_flow sends it). Also called for every
 * settle that goes upstream. */
void pipeline_surplus_seen(struct pipeline *p, struct channel *ch, uint64_t broker_tag);
/* Send the deliveries kept for consumers that have room now. */
void pipeline_surplus_flow(struct pipeline *p);
/* A consumer is cancelled (by the client or the broker): what was kept
 * for it goes to the client now, before the cancel's answer. */
void pipeline_surplus_cancel(struct pipeline *p, struct channel *ch, const void *tag,
			     size_t len);
/* basic.recover on ch: what was kept is dropped (the broker resends it). */
void pipeline_surplus_recover(struct pipeline *p, struct channel *ch);
/* Whether a client settle may go upstream now (0), or waits (1). */
int pipeline_settle_gate(struct pipeline *p, struct channel *ch, amqp_method_number_t how,
			 uint64_t client_tag, int multiple);
/* For hooks: a settle that waited may be asked about again. */
void pipeline_settle_release(struct pipeline *p);
/* For hooks: the client's confirm of a publish forwarded as broker_seq
 * (pipe_hook.published) also waits for pipeline_confirm_release. 0, or -1
 * (then it goes when the broker's does). */
int pipeline_confirm_hold(struct pipeline *p, struct channel *ch, uint64_t broker_seq);
/* The hold is over: the broker's answer, if it came, goes to the client;
 * nothing when the channel closed since. */
void pipeline_confirm_release(struct pipeline *p, uint16_t channel, uint64_t broker_seq);

#endif
