/* pipeline: the hook point where patterns see, rewrite, swallow or hold
 * whole messages, and the assembly of the messages they asked for. */
#ifndef ACEMQ_PIPELINE_H
#define ACEMQ_PIPELINE_H

#include <amqp.h>
#include <amqp_framing.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct session;
struct channel;

#define PIPELINE_MAX_HOOKS 8

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
	unsigned method_dirty : 1, props_dirty : 1, body_dirty : 1;
};

struct pipe_hook {
	const char *name;
	/* Only rewrites messages (never swallows, holds or answers) and keeps
	 * no state between messages: attached or detached at any time, and
	 * delivery tags need no translation for it. */
	int rewrite_only;
	/* Per session: return state to attach, or NULL to stay out. */
	void *(*attach)(struct session *s);
	void (*detach)(void *state);
	/* Whether the hook wants this message; method is decoded. */
	int (*wants)(void *state, struct session *s, struct channel *ch, enum pipe_kind kind,
		     amqp_method_number_t id, void *method);
	/* Streaming, for a body too large to hold: called once the header
	 * is in (method, props and body_size known); returning 1 takes the
	 * body as a stream. The proxy then holds none of it: each body
	 * chunk goes to stream_body, and by message() the hook must have put
	 * the replacement body in m->body and set body_dirty. */
	int (*stream_begin)(void *state, struct session *s, struct channel *ch,
			    struct pipe_msg *m);
	int (*stream_body)(void *state, struct session *s, struct channel *ch,
			   struct pipe_msg *m, const uint8_t *data, size_t len);
	enum pipe_verdict (*message)(void *state, struct session *s, struct channel *ch,
				     struct pipe_msg *m);
	/* The client settled a delivery (basic.ack/nack/reject), broker tag. */
	void (*settle)(void *state, struct session *s, struct channel *ch,
		       amqp_method_number_t how, uint64_t broker_tag);
	void (*channel_closed)(void *state, struct session *s, struct channel *ch);
	/* The output towards the client fell below its low mark. */
	void (*drained)(void *state, struct session *s);
	/* Once the header is in (props and body_size known): what the hook
	 * still wants of a message it asked for. When no hook wants it any
	 * more, the message goes on as it was and its body is not held. */
	int (*header_want)(void *state, struct session *s, struct channel *ch,
			   struct pipe_msg *m);
	/* Before a client's ack, nack or reject (client_tag, multiple) goes
	 * upstream: 0 lets it go; 1 holds it (and the client's later frames)
	 * until the hook calls pipeline_settle_release; it is then asked
	 * again. */
	int (*settle_gate)(void *state, struct session *s, struct channel *ch,
			   amqp_method_number_t how, uint64_t client_tag, int multiple);
	/* basic.recover: the broker redelivers what is unacked on ch. */
	void (*recovered)(void *state, struct session *s, struct channel *ch);
	/* New input arrived on a leg held for a waiting message (from: the
	 * direction it reads): a hook that batches store work may look ahead
	 * again, so what arrived joins the next commit. */
	void (*held_input)(void *state, struct session *s, int from);
	/* A publish that was assembled is disposed of: forwarded to the
	 * broker (forwarded 1; broker_seq is its confirm sequence number
	 * there when its channel is in confirm mode, else 0), or not
	 * (answered, refused, or dropped with its channel). ch is NULL when
	 * the channel is not at hand. m is only identified, never kept. */
	void (*published)(void *state, struct session *s, struct channel *ch,
			  struct pipe_msg *m, int forwarded, uint64_t broker_seq);
	/* The broker acked (acked 1) or nacked a forwarded publish: called
	 * once for each sequence number a (multiple) confirm covers. */
	void (*publish_settled)(void *state, struct session *s, struct channel *ch,
				uint64_t broker_seq, int acked);
};

void pipeline_register(const struct pipe_hook *hook);
/* Attach the registered hooks to a session; returns how many attached. */
int pipeline_attach(struct session *s);
void pipeline_detach(struct session *s);
/* New rules: re-decide which rewrite-only hooks apply to the session. */
void pipeline_refresh(struct session *s);

struct pipe_msg *pipe_msg_new(enum pipe_kind kind, uint16_t channel);
void pipe_msg_free(struct pipe_msg *m);

enum {
	PIPE_COLLECT_OK = 0,
	PIPE_COLLECT_RELEASE = 1, /* no hook wants it after all: pipeline_pass it */
	PIPE_COLLECT_TOO_LARGE = -1,
	PIPE_COLLECT_FAILED = -2,
};

/* Called by the session for each frame of a message it decided to
 * assemble; returns PIPE_COLLECT_OK, _TOO_LARGE when the message exceeds
 * max_message_size, or _FAILED (bad frame, no memory, a stream refused). */
int pipeline_collect(struct session *s, struct channel *ch, struct pipe_msg *m,
		     struct evbuffer *in, size_t frame_len, int frame_type);
/* The message is complete: run the hooks and dispose of it. */
int pipeline_complete(struct session *s, struct channel *ch, struct pipe_msg *m);
/* Forward what was collected of a message no hook wants after all; the
 * rest of its frames move as they are. */
int pipeline_pass(struct session *s, struct channel *ch, struct pipe_msg *m);

/* For hooks: finish a message that waited (PIPE_WAIT) with a final
 * verdict (not PIPE_WAIT or PIPE_HOLD); its leg's frames flow again. */
int pipeline_resume(struct session *s, struct channel *ch, struct pipe_msg *m,
		    enum pipe_verdict v);
/* For hooks: finish a waiting delivery (or return) whose body the hook
 * streams: the method and properties go out with body_size, then the body
 * in any number of pieces, re-framed at the client's frame_max. end frees
 * m and lets the leg's frames flow again. */
int pipeline_stream_out_begin(struct session *s, struct channel *ch, struct pipe_msg *m,
			      uint64_t body_size);
int pipeline_stream_out(struct session *s, struct channel *ch, struct pipe_msg *m,
			const void *data, size_t len);
void pipeline_stream_out_end(struct session *s, struct channel *ch, struct pipe_msg *m);
/* Let go of a message that waited, without a word to either side (its
 * channel went away); its leg's frames flow again. */
void pipeline_drop(struct session *s, struct pipe_msg *m);
/* Bytes queued towards the client (for a hook pacing a stream). */
size_t pipeline_client_backlog(struct session *s);

/* For hooks: forward a held delivery now, or give it back to the broker. */
int pipeline_release(struct session *s, struct channel *ch, struct pipe_msg *m);
int pipeline_requeue(struct session *s, struct channel *ch, struct pipe_msg *m, int requeue);
/* For hooks: acknowledge a held delivery upstream; the client never sees it. */
int pipeline_ack(struct session *s, struct channel *ch, struct pipe_msg *m);
/* The message's body (whole, as the publisher or broker sent it) in a new
 * malloc'd copy; 0 or -1. */
int pipeline_body_copy(const struct pipe_msg *m, amqp_bytes_t *out);

/* Which hooks want a message (each hook's answer in per_hook); 0 if none. */
int pipeline_wants(struct session *s, struct channel *ch, enum pipe_kind kind,
		   amqp_method_number_t id, void *method, int *per_hook);
void pipeline_settled(struct session *s, struct channel *ch, amqp_method_number_t how,
		      uint64_t broker_tag);
void pipeline_channel_closed(struct session *s, struct channel *ch);
void pipeline_drained(struct session *s);
void pipeline_recovered(struct session *s, struct channel *ch);
void pipeline_held_input(struct session *s, int from);
/* Whether a hook follows the broker's confirms of forwarded publishes. */
int pipeline_publish_watched(const struct session *s);
void pipeline_publish_settled(struct session *s, struct channel *ch, uint64_t broker_seq,
			      int acked);
/* Whether a client settle may go upstream now (0), or waits (1). */
int pipeline_settle_gate(struct session *s, struct channel *ch, amqp_method_number_t how,
			 uint64_t client_tag, int multiple);
/* For hooks: a settle that waited may be asked about again. */
void pipeline_settle_release(struct session *s);

#endif
