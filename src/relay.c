/* relay: the frames between a session's two legs. The pump scans a leg's
 * input with a cursor and moves runs of frames no one reads as whole
 * evbuffer chains (no copy); a frame the proxy must read goes to
 * relay_method, a frame of a message the pipeline assembles to
 * relay_content. Content order is validated on the client's side as frames
 * pass, and frames of channels the proxy is closing itself are dropped. */
#include "relay.h"

#include "../amqp/content.h"
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "debug.h"
#include "fault.h"
#include "handshake.h"
#include "log.h"
#include "pipeline.h"
#include "request.h"
#include "response.h"
#include "session.h"
#include "transport.h"
#include "worker.h"

#include <event2/buffer.h>
#include <string.h>

/* Forward the frame at the front of from's input, unchanged. */
void relay_forward(struct session *s, struct leg *from, size_t len)
{
	struct evbuffer *in = transport_input(from->tr);
	struct evbuffer *out = session_out(s, from->dir);

	if (out)
		evbuffer_remove_buffer(in, out, len);
	else
		evbuffer_drain(in, len);
}

/* Decide what a delivery-like method means for tags and hooks. The method
 * frame is at the front of from's input. */
int relay_content_method(struct session *s, struct leg *from, struct channel *ch,
			 const struct frame_info *fi, amqp_method_number_t id, void *decoded)
{
	enum pipe_kind kind;
	struct pipe_msg *m;
	struct evbuffer *in = transport_input(from->tr);
	size_t len = frame_scan_wire_len(fi);
	int want, per_hook[PIPELINE_MAX_HOOKS];

	switch (id) {
	case AMQP_BASIC_PUBLISH_METHOD:
		kind = PIPE_PUBLISH;
		break;
	case AMQP_BASIC_DELIVER_METHOD:
		kind = PIPE_DELIVER;
		break;
	case AMQP_BASIC_GET_OK_METHOD:
		kind = PIPE_GET_OK;
		break;
	default:
		kind = PIPE_RETURN;
		break;
	}
	want = pipeline_wants(&s->pipe, ch, kind, id, decoded, per_hook);
	if (want) {
		m = pipe_msg_new(kind, ch->id);
		if (m == NULL) {
			session_shut(s, 541, "INTERNAL_ERROR - out of memory");
			return RELAY_CLOSED;
		}
		m->want = want;
		memcpy(m->hook_want, per_hook, sizeof(per_hook));
		if (kind == PIPE_DELIVER) {
			amqp_basic_deliver_t *d = decoded;

			m->broker_tag = d->delivery_tag;
			m->no_ack = channel_consumer_no_ack(ch, d->consumer_tag.bytes,
							    d->consumer_tag.len);
		} else if (kind == PIPE_GET_OK) {
			m->broker_tag = ((amqp_basic_get_ok_t *)decoded)->delivery_tag;
			m->no_ack = ch->get_no_ack;
		}
		ch->content[from->dir].msg = m;
		ch->content[from->dir].expect = EXPECT_HEADER;
		STATS_INC(&s->w->stats, messages_assembled);
		if (pipeline_collect(&s->pipe, ch, m, in, len, FRAME_METHOD) !=
		    PIPE_COLLECT_OK) {
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return RELAY_CLOSED;
		}
		return RELAY_DONE;
	}
	/* Streams through; only the tag and confirm numbering change. */
	if (!s->pipe.track) {
		/* nothing is renumbered */
	} else if (kind == PIPE_PUBLISH) {
		if (ch->confirm_mode)
			confirmmap_forward(&ch->confirms);
	} else if (kind == PIPE_DELIVER || kind == PIPE_GET_OK) {
		uint64_t *tagp;
		int no_ack;

		if (kind == PIPE_DELIVER) {
			amqp_basic_deliver_t *d = decoded;

			tagp = &d->delivery_tag;
			no_ack = channel_consumer_no_ack(ch, d->consumer_tag.bytes,
							 d->consumer_tag.len);
			/* Its hook no longer wants it (the rules changed): what
			 * was kept for its consumer goes first, and nothing more
			 * is kept for it. */
			if (ch->surplus)
				pipeline_surplus_cancel(&s->pipe, ch, d->consumer_tag.bytes,
							d->consumer_tag.len);
		} else {
			amqp_basic_get_ok_t *g = decoded;

			tagp = &g->delivery_tag;
			no_ack = ch->get_no_ack;
		}
		uint64_t client = tagmap_deliver(&ch->tags, *tagp, !no_ack);
		if (client != *tagp) {
			/* Encode before draining: the decoded strings point into in. */
			*tagp = client;
			method_write(session_out(s, DIR_TO_CLIENT), ch->id, id, decoded);
			evbuffer_drain(in, len);
			return RELAY_DONE;
		}
	}
	relay_forward(s, from, len);
	return RELAY_DONE;
}

/* A method frame the proxy must read, at the front of from's input: decoded
 * once, read by the handshake (channel 0), the request side (from the
 * client) or the response side (from the broker), then forwarded unless the
 * reader consumed it. Returns RELAY_*. */
static int relay_method(struct session *s, struct leg *from, const struct frame_info *fi,
			struct channel *ch)
{
	struct evbuffer *in = transport_input(from->tr);
	amqp_pool_t *pool = &s->w->pool;
	amqp_method_number_t id;
	void *m = NULL;
	int rc;

	rc = method_decode_evbuffer(in, fi->size, pool, &id, &m);
	if (rc != 0) {
		recycle_amqp_pool(pool);
		if (from->dir == DIR_TO_BROKER) {
			fault_protocol(s, REPLY_SYNTAX_ERROR, "method arguments do not decode",
				       fi->class_id, fi->method_id);
			return RELAY_CLOSED;
		}
		rc = RELAY_FORWARD; /* the broker's; pass it on */
	} else {
		if (fi->channel == 0)
			rc = handshake_method(s, from, fi, id, m);
		else if (from->dir == DIR_TO_BROKER)
			rc = request_method(s, from, fi, ch, id, m);
		else
			rc = response_method(s, from, fi, ch, id, m);
		/* Decoded strings point into the input: recycled only now. */
		recycle_amqp_pool(pool);
	}
	/* A reader (a hook it called) may have closed the session and
	 * finished this leg. */
	if (from->tr == NULL)
		return RELAY_CLOSED;
	if (rc == RELAY_FORWARD)
		relay_forward(s, from, frame_scan_wire_len(fi));
	return rc;
}

/* Which methods the proxy reads; every other one, including methods newer
 * than the codec (connection.update-secret), passes untouched and the
 * broker judges it. */
static int relay_reads(const struct session *s, amqp_method_number_t id)
{
	switch (id) {
	case AMQP_CONNECTION_START_METHOD:
	case AMQP_CONNECTION_START_OK_METHOD:
	case AMQP_CONNECTION_TUNE_METHOD:
	case AMQP_CONNECTION_TUNE_OK_METHOD:
	case AMQP_CONNECTION_OPEN_METHOD:
	case AMQP_CONNECTION_OPEN_OK_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_OK_METHOD:
	case AMQP_CHANNEL_OPEN_METHOD:
	case AMQP_CHANNEL_CLOSE_OK_METHOD:
	case AMQP_CONFIRM_SELECT_METHOD:
		return 1;
	/* Rewrite-only hooks see content methods; acks, consumes and gets
	 * matter only when tags are translated. */
	case AMQP_BASIC_PUBLISH_METHOD:
	case AMQP_BASIC_DELIVER_METHOD:
	case AMQP_BASIC_GET_OK_METHOD:
	case AMQP_BASIC_RETURN_METHOD:
		return s->pipe.nhooks > 0;
	case AMQP_BASIC_ACK_METHOD:
	case AMQP_BASIC_NACK_METHOD:
	case AMQP_BASIC_REJECT_METHOD:
	case AMQP_BASIC_CONSUME_METHOD:
	case AMQP_BASIC_CONSUME_OK_METHOD:
	case AMQP_BASIC_CANCEL_OK_METHOD:
	case AMQP_BASIC_CANCEL_METHOD:
	case AMQP_BASIC_QOS_METHOD:
	case AMQP_BASIC_QOS_OK_METHOD:
	case AMQP_BASIC_GET_METHOD:
	case AMQP_BASIC_RECOVER_METHOD:
	case AMQP_BASIC_RECOVER_ASYNC_METHOD:
		return s->pipe.nhooks > 0 && s->pipe.track;
	default:
		return 0;
	}
}

/* Does this frame need more than a byte move? Validates content order on
 * the client's side as it goes, and counts publishes in confirm mode and
 * their answers (control.c drains by them). Returns 1 to look, 0 to move,
 * RELAY_GATE to stop before it, -1 on a protocol error (session closing). */
#define RELAY_GATE 3

/* Content bytes a rated publisher sends between two asks of its bucket. */
#define RELAY_RATE_CHUNK 16384

static int relay_classify(struct session *s, struct leg *from, const struct frame_info *fi,
			  struct channel **chp)
{
	struct channel *ch = NULL;
	struct chan_error err;
	int code = 0, to_broker = from->dir == DIR_TO_BROKER;
	uint16_t cls;
	uint64_t body_size;

	*chp = NULL;
	if (fi->type == FRAME_HEARTBEAT)
		return 0;
	if (fi->channel == 0) {
		if (fi->type != FRAME_METHOD) {
			if (!to_broker)
				return 0;
			fault_protocol(s, REPLY_UNEXPECTED_FRAME, "content frame on channel 0",
				       0, 0);
			return -1;
		}
		return s->greeting ? 1 : relay_reads(s, METHOD_ID(fi->class_id, fi->method_id));
	}
	if (s->state < SESSION_OPEN && to_broker) {
		fault_protocol(s, REPLY_UNEXPECTED_FRAME,
			       "channel frame before the connection is tuned", fi->class_id,
			       fi->method_id);
		return -1;
	}
	/* Like the broker, the proxy bounds how many channels are open (the
	 * broker counts them), not which numbers they have. */
	ch = session_channel(s, fi->channel);
	if (ch == NULL) {
		session_shut(s, 541, "INTERNAL_ERROR - out of memory");
		return -1;
	}
	*chp = ch;
	if (ch->proxy_closing)
		return 1;
	if (fi->type == FRAME_METHOD) {
		amqp_method_number_t id = METHOD_ID(fi->class_id, fi->method_id);

		if (ch->confirm_mode && id == AMQP_BASIC_PUBLISH_METHOD && to_broker) {
			/* A paused vhost's publish waits, its frame unread. */
			if (s->gated)
				return RELAY_GATE;
			ch->published++;
		} else if (s->gated && id == AMQP_BASIC_PUBLISH_METHOD && to_broker) {
			return RELAY_GATE;
		} else if (ch->confirm_mode && !to_broker && fi->size >= 12 &&
			   (id == AMQP_BASIC_ACK_METHOD || id == AMQP_BASIC_NACK_METHOD)) {
			/* The delivery tag follows class and method ids. */
			uint64_t tag = 0;
			int i;

			for (i = 4; i < 12; i++)
				tag = tag << 8 | fi->peek[i];
			if (tag > ch->confirmed)
				ch->confirmed = tag;
		}
		if (to_broker || ch->content[from->dir].msg) {
			code = channel_content_method(ch, from->dir, id, method_has_content(id),
						      &err);
			if (code)
				goto bad;
		}
		return relay_reads(s, id);
	}
	if (!to_broker && !ch->content[from->dir].msg)
		return 0;
	if (fi->type == FRAME_HEADER) {
		content_header_peek(fi->peek, &cls, &body_size);
		code = channel_content_header(ch, from->dir, cls, body_size, &err);
	} else {
		code = channel_content_body(ch, from->dir, fi->size, &err);
	}
	if (code)
		goto bad;
	return ch->content[from->dir].msg ? 1 : 0;
bad:
	if (!to_broker) {
		session_log(s, LOG_WARNING, "broker sent an out-of-order frame: %s", err.text);
		return 0;
	}
	fault_protocol(s, (uint16_t)code, err.text, (uint16_t)(err.method >> 16),
		       (uint16_t)err.method);
	return -1;
}

/* A content frame of a message being assembled for a hook. */
static int relay_content(struct session *s, struct leg *from, const struct frame_info *fi,
			 struct channel *ch)
{
	struct chan_content *c = &ch->content[from->dir];
	struct evbuffer *in = transport_input(from->tr);
	struct pipe_msg *m = c->msg;
	int rc;

	ACEMQ_ASSERT(m != NULL); /* classify looks at content only while assembling */
	rc = pipeline_collect(&s->pipe, ch, m, in, frame_scan_wire_len(fi), fi->type);
	if (rc == PIPE_COLLECT_RELEASE) {
		/* No hook wants it after all: what was collected goes on, and
		 * the body moves as it comes. */
		c->msg = NULL;
		rc = pipeline_pass(&s->pipe, ch, m);
		if (rc != 0) {
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return -1;
		}
		return 0;
	}
	if (rc == PIPE_COLLECT_TOO_LARGE && from->dir == DIR_TO_BROKER) {
		fault_protocol(s, REPLY_FRAME_ERROR,
			       "FRAME_ERROR - message larger than max_message_size", 60, 40);
		return -1;
	}
	if (rc != PIPE_COLLECT_OK) {
		session_log(s, LOG_ERROR, "message on channel %u could not be handled (%s)",
			    ch->id,
			    rc == PIPE_COLLECT_TOO_LARGE ? "larger than max_message_size"
							 : "a hook refused it");
		session_shut(s, 541, "INTERNAL_ERROR - the proxy could not handle a message");
		return -1;
	}
	if (c->expect == EXPECT_METHOD) {
		c->msg = NULL;
		if (pipeline_complete(&s->pipe, ch, m) != 0) {
			session_log(s, LOG_ERROR,
				    "message on channel %u could not be forwarded", ch->id);
			session_shut(s, 541,
				     "INTERNAL_ERROR - the proxy could not handle a message");
			return -1;
		}
	}
	return 0;
}

/* A frame while the proxy closes the session itself: only close and
 * close-ok matter. */
static void relay_closing_frame(struct session *s, struct leg *from,
				const struct frame_info *fi)
{
	struct evbuffer *in = transport_input(from->tr);

	if (fi->type == FRAME_METHOD && fi->channel == 0 && fi->class_id == 10 &&
	    (fi->method_id == 50 || fi->method_id == 51)) {
		if (fi->method_id == 50 && from->tr)
			method_write(transport_output(from->tr), 0,
				     AMQP_CONNECTION_CLOSE_OK_METHOD,
				     &(amqp_connection_close_ok_t){0});
		from->done = 1;
	}
	evbuffer_drain(in, frame_scan_wire_len(fi));
}

/* Frames dropped on a channel the proxy is closing itself. */
static int relay_channel_closing(struct session *s, struct leg *from,
				 const struct frame_info *fi, struct channel *ch)
{
	/* Each side answers the proxy's channel.close with close-ok (or
	 * crosses it with a close of its own, which the proxy answers);
	 * everything else on the channel meanwhile is dropped, as the broker
	 * drops it. The channel is closed when both sides have answered. */
	if (fi->type == FRAME_METHOD && fi->class_id == 20 &&
	    (fi->method_id == 40 || fi->method_id == 41)) {
		/* A crossing close is answered; the peer still owes its
		 * close-ok for the proxy's close, which ends its side. */
		if (fi->method_id == 40)
			method_write(transport_output(from->tr), ch->id,
				     AMQP_CHANNEL_CLOSE_OK_METHOD,
				     &(amqp_channel_close_ok_t){0});
		else
			ch->proxy_closing &=
			    ~(from->dir == DIR_TO_CLIENT ? CHAN_CLOSING_BROKER
							 : CHAN_CLOSING_CLIENT);
		/* The client is done before the broker: its next frames (a
		 * channel.open of the same number, say) wait for the broker's
		 * close-ok instead of being dropped. */
		if (ch->proxy_closing == CHAN_CLOSING_BROKER && !ch->closing_hold) {
			ch->closing_hold = 1;
			session_hold(s, DIR_TO_BROKER);
		}
		if (!ch->proxy_closing) {
			pipeline_channel_closed(&s->pipe, ch);
			session_channel_shut(s, ch);
			/* A hook may have closed the session (the test hook on
			 * closer* vhosts does): the leg may be gone. */
			if (from->tr == NULL)
				return -1;
			if (ch->closing_hold) {
				ch->closing_hold = 0;
				evbuffer_drain(transport_input(from->tr),
					       frame_scan_wire_len(fi));
				/* The client's leg is woken, not pumped from here. */
				session_unhold(s, DIR_TO_BROKER);
				return 0;
			}
		}
	}
	evbuffer_drain(transport_input(from->tr), frame_scan_wire_len(fi));
	return 0;
}

static void relay_pause(struct session *s, struct leg *from)
{
	if (!from->paused) {
		from->paused = 1;
		STATS_INC(&s->w->stats, backpressure_pauses);
		transport_read_disable(from->tr);
	}
}

/* Move every complete frame from one leg towards the other. Returns 0, or
 * -1 when the session is gone. */
int relay_pump(struct session *s, struct leg *from)
{
	struct evbuffer *in = transport_input(from->tr);
	struct leg *to = session_other(s, from);
	struct evbuffer *out;
	size_t run = 0, limit = (size_t)worker_settings.buffer_limit;
	uint32_t max;
	unsigned long frames = 0;
	size_t out_len = 0;
	struct frame_cursor cur;
	struct frame_info fi;
	struct channel *ch;
	int rc, look, fresh = 1, slow = 0;

	ACEMQ_ASSERT(from->tr != NULL && s->state != SESSION_GONE);

	if (s->state == SESSION_HEADER) {
		rc = handshake_header(s);
		if (rc != 0)
			return rc < 0 ? -1 : 0;
	}
	/* The client's frames wait until the broker has spoken
	 * (connection.start passed): the broker judges nothing earlier
	 * either, and events keep the order they have on the wire. */
	if (from == &s->client && !s->started)
		return 0;
	/* The cursor sits at the end of the run of untouched frames; it is
	 * set again whenever the input changes under it. */
	for (;;) {
		/* A message from this leg waits for a hook: so do the frames
		 * behind it (the close handshake never waits). */
		if (from->held && s->state < SESSION_CLOSING)
			break;
		/* A rated publisher stops every chunk to ask its vhost's
		 * bucket (control_rate), which may make it wait. */
		if (s->rate_bytes >= RELAY_RATE_CHUNK && from->dir == DIR_TO_BROKER &&
		    s->state < SESSION_CLOSING)
			break;
		if (fresh) {
			out = to->tr ? transport_output(to->tr) : NULL;
			out_len = out ? evbuffer_get_length(out) : 0;
			frame_cursor_init(&cur, in);
			fresh = 0;
		}
		if (out && s->state < SESSION_CLOSING && out_len + run >= limit) {
			relay_pause(s, from);
			break;
		}
		/* As the broker does, a payload may be as large as frame_max
		 * itself; the proxy writes none over frame_max - 8. The broker's
		 * own frames are trusted to at least the pre-tune cap. */
		max = s->frame_max;
		if (from->dir == DIR_TO_CLIENT &&
		    max < (uint32_t)worker_settings.max_frame_pre_tune)
			max = (uint32_t)worker_settings.max_frame_pre_tune;
		rc = frame_cursor_scan(&cur, max, &fi);
		if (rc == FRAME_SCAN_AGAIN && cur.partial) {
			/* More chains than the cursor saw: move what is scanned,
			 * or scan this one frame the slow way. */
			if (run) {
				relay_forward(s, from, run);
				run = 0;
				fresh = 1;
				continue;
			}
			rc = frame_scan_evbuffer(in, 0, max, &fi);
			slow = 1;
		}
		if (rc == FRAME_SCAN_AGAIN)
			break;
		if (rc == FRAME_SCAN_ERROR) {
			if (run && out)
				evbuffer_remove_buffer(in, out, run);
			if (from->dir == DIR_TO_BROKER) {
				fault_protocol(s, fi.reply_code, fi.error, fi.class_id,
					       fi.method_id);
			} else {
				session_log(s, LOG_WARNING, "broker sent a bad frame: %s",
					    fi.error);
				STATS_INC(&s->w->stats, upstream_failures);
				from->eof = 1;
				session_shut(s, REPLY_CONNECTION_FORCED,
					     "CONNECTION_FORCED - broker sent a bad frame");
			}
			return -1;
		}
		frames++;
		/* Content from the client is a publish's: a rated vhost's
		 * publishers are read at its rate (control_rate). */
		if (s->rated && fi.type != FRAME_METHOD && fi.type != FRAME_HEARTBEAT &&
		    from->dir == DIR_TO_BROKER)
			s->rate_bytes += frame_scan_wire_len(&fi);
		if (s->state >= SESSION_CLOSING) {
			relay_closing_frame(s, from, &fi);
			fresh = 1;
			continue;
		}
		look = relay_classify(s, from, &fi, &ch);
		if (look < 0)
			return -1;
		if (look == RELAY_GATE) {
			/* Read again when the vhost resumes (control.c). */
			s->gate_held = 1;
			session_hold(s, DIR_TO_BROKER);
			break;
		}
		if (look == 0 && slow) {
			relay_forward(s, from, frame_scan_wire_len(&fi));
			slow = 0;
			fresh = 1;
			continue;
		}
		if (look == 0) {
			run += frame_scan_wire_len(&fi);
			frame_cursor_advance(&cur, frame_scan_wire_len(&fi));
			continue;
		}
		fresh = 1;
		slow = 0;
		if (run) {
			relay_forward(s, from, run);
			run = 0;
		}
		if (ch && ch->proxy_closing)
			rc = relay_channel_closing(s, from, &fi, ch);
		else if (fi.type == FRAME_METHOD)
			rc = relay_method(s, from, &fi, ch);
		else
			rc = relay_content(s, from, &fi, ch);
		if (rc < 0 || from->tr == NULL)
			return -1;
		/* A frame left in the input (a settle a hook holds) is counted
		 * when it finally goes, not each time it is scanned. */
		if (rc == RELAY_WAIT)
			frames--;
	}
	if (run)
		relay_forward(s, from, run);
	if (from->dir == DIR_TO_BROKER)
		STATS_ADD(&s->w->stats, frames_to_broker, frames);
	else
		STATS_ADD(&s->w->stats, frames_to_client, frames);
	/* Reading goes on below the high mark (also while closing: the
	 * close handshake may sit behind what a full input held back). */
	if (from->tr)
		transport_input_consumed(from->tr);
	if (s->state == SESSION_CLOSING) {
		if (s->client.done)
			session_leg_finish(s, &s->client);
		if (s->upstream.done)
			session_leg_finish(s, &s->upstream);
		return session_reap(s) ? -1 : 0;
	}
	return 0;
}

void relay_lookahead(struct session *s, enum chan_dir from, struct pipeline_mark *mark,
		     int (*fn)(void *arg, const struct frame_info *fi, const uint8_t *payload,
			       size_t len),
		     void *arg)
{
	static _Thread_local uint8_t scratch[65536];
	struct leg *l = from == DIR_TO_BROKER ? &s->client : &s->upstream;
	uint32_t max = s->frame_max;
	struct evbuffer_ptr pos;
	struct frame_info fi;
	struct evbuffer *in;
	uint64_t read, sent, first; /* bytes the leg read; where its input starts */
	size_t off = 0, again = (size_t)-1;
	int n, rc = PIPELINE_AHEAD_ON;

	if (l->tr == NULL || s->state != SESSION_OPEN)
		return;
	if (max < (uint32_t)worker_settings.max_frame_pre_tune)
		max = (uint32_t)worker_settings.max_frame_pre_tune;
	in = transport_input(l->tr);
	transport_bytes(l->tr, &read, &sent);
	first = read - evbuffer_get_length(in);
	/* Frames before the mark were looked at already (the input holds
	 * whole frames from its start: the mark is a frame's start too). */
	if (mark && mark->leg == l->tr && mark->at > first &&
	    mark->at - first <= evbuffer_get_length(in))
		off = (size_t)(mark->at - first);
	for (n = 0; n < 4096; n++) {
		const uint8_t *p = NULL;
		size_t plen = 0;

		if (frame_scan_evbuffer(in, off, max, &fi) != FRAME_SCAN_OK)
			break;
		if ((fi.type == FRAME_METHOD || fi.type == FRAME_HEADER) &&
		    fi.size <= sizeof(scratch) &&
		    evbuffer_ptr_set(in, &pos, off + FRAME_HEADER_SIZE, EVBUFFER_PTR_SET) ==
			0 &&
		    evbuffer_copyout_from(in, &pos, scratch, fi.size) == (ev_ssize_t)fi.size) {
			p = scratch;
			plen = fi.size;
		}
		rc = fn(arg, &fi, p, plen);
		if (rc == PIPELINE_AHEAD_STOP)
			break;
		if (rc == PIPELINE_AHEAD_AGAIN && again == (size_t)-1)
			again = off;
		else if (rc == PIPELINE_AHEAD_ON)
			again = (size_t)-1;
		off += frame_scan_wire_len(&fi);
	}
	if (mark) {
		mark->leg = l->tr;
		mark->at = first + (again != (size_t)-1 ? again : off);
	}
}
