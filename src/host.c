/* host: what a session offers its pipeline (struct pipeline_host): the
 * outputs of its legs, holds and wake-ups, channel and connection errors,
 * channels by number (never created here), the lookahead, and completions
 * run under the session's lifetime rule. */
#include "host.h"

#include "fault.h"
#include "relay.h"
#include "session.h"

/* The pipeline's view of a channel: the one with this number while the
 * client has it open, never created here, so a completion that finds
 * none knows the channel went. */
static struct channel *host_channel(void *owner, uint16_t id)
{
	struct session *s = owner;
	struct channel *ch = id < s->nchans ? s->chans[id] : NULL;

	return ch && ch->open ? ch : NULL;
}

static struct evbuffer *host_out(void *owner, enum chan_dir dir)
{
	return session_out(owner, dir);
}

static void host_hold(void *owner, enum chan_dir from)
{
	session_hold(owner, from);
}

static void host_wake(void *owner, enum chan_dir from)
{
	session_unhold(owner, from);
}

static void host_channel_error(void *owner, struct channel *ch, uint16_t code, const char *text,
			       uint16_t class_id, uint16_t method_id)
{
	fault_channel(owner, ch, code, text, class_id, method_id);
}

static void host_close(void *owner, uint16_t code, const char *text)
{
	session_close(owner, code, text);
}

static void host_lookahead(void *owner, enum chan_dir from, struct pipeline_mark *mark,
			   int (*fn)(void *arg, const struct frame_info *fi,
				     const uint8_t *payload, size_t len),
			   void *arg)
{
	relay_lookahead(owner, from, mark, fn, arg);
}

/* A completion that arrived off the session's stack runs under the
 * lifetime rule: not at all once the session started closing. */
static int host_call(void *owner, void (*fn)(struct pipeline *p, void *arg), void *arg)
{
	struct session *s = owner;
	int ran = 0;

	session_enter(s);
	if (s->state < SESSION_CLOSING) {
		fn(&s->pipe, arg);
		ran = 1;
	}
	session_leave(s);
	return ran;
}

const struct pipeline_host host_of_session = {
    .out = host_out,
    .hold = host_hold,
    .wake = host_wake,
    .channel_error = host_channel_error,
    .close = host_close,
    .channel = host_channel,
    .lookahead = host_lookahead,
    .call = host_call,
};
