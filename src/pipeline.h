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

#define PIPELINE_MAX_HOOKS 4

enum pipe_kind { PIPE_PUBLISH, PIPE_DELIVER, PIPE_GET_OK, PIPE_RETURN };

/* What a hook wants of a message, from wants(). */
enum { PIPE_WANT_NONE = 0, PIPE_WANT_MSG = 1, PIPE_WANT_BODY = 2 };

enum pipe_verdict {
	PIPE_PASS,    /* forward it (with any rewrite applied) */
	PIPE_SWALLOW, /* a delivery the client never sees; settled upstream */
	PIPE_HOLD,    /* the hook keeps it; it calls pipeline_release later */
	PIPE_ANSWER,  /* a publish the proxy answers itself (not forwarded) */
};

struct pipe_msg {
	enum pipe_kind kind;
	uint16_t channel;
	amqp_pool_t pool;
	amqp_method_number_t method_id;
	void *method; /* decoded: amqp_basic_publish_t, _deliver_t, ... */
	amqp_basic_properties_t *props;
	uint64_t body_size;
	struct evbuffer *raw;  /* the original frames, in order */
	size_t raw_method_len; /* bytes of the method frame in raw */
	size_t raw_header_len; /* bytes of the header frame in raw */
	struct evbuffer *body; /* payload bytes when a hook asked for them */
	uint64_t broker_tag;   /* deliveries: the broker's delivery tag */
	int no_ack;            /* deliveries: the client will not settle it */
	int want;              /* union of what the hooks asked for */
	int streamer;          /* index of the hook taking the body as a stream, or -1 */
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
};

void pipeline_register(const struct pipe_hook *hook);
/* Attach the registered hooks to a session; returns how many attached. */
int pipeline_attach(struct session *s);
void pipeline_detach(struct session *s);
/* New rules: re-decide which rewrite-only hooks apply to the session. */
void pipeline_refresh(struct session *s);

struct pipe_msg *pipe_msg_new(enum pipe_kind kind, uint16_t channel);
void pipe_msg_free(struct pipe_msg *m);

enum { PIPE_COLLECT_OK = 0, PIPE_COLLECT_TOO_LARGE = -1, PIPE_COLLECT_FAILED = -2 };

/* Called by the session for each frame of a message it decided to
 * assemble; returns PIPE_COLLECT_OK, _TOO_LARGE when the message exceeds
 * max_message_size, or _FAILED (bad frame, no memory, a stream refused). */
int pipeline_collect(struct session *s, struct channel *ch, struct pipe_msg *m,
		     struct evbuffer *in, size_t frame_len, int frame_type);
/* The message is complete: run the hooks and dispose of it. */
int pipeline_complete(struct session *s, struct channel *ch, struct pipe_msg *m);

/* For hooks: forward a held delivery now, or give it back to the broker. */
int pipeline_release(struct session *s, struct channel *ch, struct pipe_msg *m);
int pipeline_requeue(struct session *s, struct channel *ch, struct pipe_msg *m, int requeue);

/* Which hooks want a message; 0 if none. */
int pipeline_wants(struct session *s, struct channel *ch, enum pipe_kind kind,
		   amqp_method_number_t id, void *method);
void pipeline_settled(struct session *s, struct channel *ch, amqp_method_number_t how,
		      uint64_t broker_tag);
void pipeline_channel_closed(struct session *s, struct channel *ch);

#endif
