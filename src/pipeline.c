/* pipeline: the hook point where patterns see, rewrite, swallow or hold
 * whole messages, and the assembly of the messages they asked for. */
#include "pipeline.h"

#include "../amqp/content.h"
#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "debug.h"
#include "log.h"
#include "pipeline_int.h"
#include "rules.h"
#include "settle.h"
#include "worker.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct pipe_hook *pipeline_hooks[PIPELINE_MAX_HOOKS];
static int pipeline_nhooks;

void pipeline_register(const struct pipe_hook *hook)
{
	if (pipeline_nhooks < PIPELINE_MAX_HOOKS)
		pipeline_hooks[pipeline_nhooks++] = hook;
}

void pipeline_init(struct pipeline *p, const struct pipeline_host *host, void *owner,
		   struct worker *w, uint64_t id)
{
	memset(p, 0, sizeof(*p));
	p->host = host;
	p->owner = owner;
	p->w = w;
	p->id = id;
	p->peer = p->vhost = p->user = "";
	list_init(&p->surplus_due);
	list_init(&p->surplus_kept);
}

const struct rules_vhost *pipeline_rules(struct pipeline *p)
{
	struct rules *r = p->w->rules;

	if (r == NULL)
		return NULL;
	if (p->rules_generation != r->generation) {
		p->rules = rules_vhost(r, p->vhost);
		p->rules_generation = r->generation;
	}
	return p->rules;
}

struct channel *pipeline_channel(struct pipeline *p, uint16_t id)
{
	return p->host->channel(p->owner, id);
}

struct evbuffer *pipeline_out(struct pipeline *p, enum chan_dir dir)
{
	return p->host->out(p->owner, dir);
}

void pipeline_hold(struct pipeline *p, enum chan_dir from)
{
	p->host->hold(p->owner, from);
}

void pipeline_wake(struct pipeline *p, enum chan_dir from)
{
	p->host->wake(p->owner, from);
}

void pipeline_close(struct pipeline *p, uint16_t code, const char *text)
{
	p->host->close(p->owner, code, text);
}

void pipeline_channel_error(struct pipeline *p, struct channel *ch, uint16_t code,
			    const char *text, uint16_t class_id, uint16_t method_id)
{
	p->host->channel_error(p->owner, ch, code, text, class_id, method_id);
}

void pipeline_lookahead(struct pipeline *p, enum chan_dir from, struct pipeline_mark *mark,
			int (*fn)(void *arg, const struct frame_info *fi,
				  const uint8_t *payload, size_t len),
			void *arg)
{
	p->host->lookahead(p->owner, from, mark, fn, arg);
}

int pipeline_call(struct pipeline *p, void (*fn)(struct pipeline *p, void *arg), void *arg)
{
	return p->host->call(p->owner, fn, arg);
}

static void pipeline_attach_some(struct pipeline *p, int rewrite_only)
{
	int i;

	for (i = 0; i < pipeline_nhooks; i++) {
		void *st;

		if (pipeline_hooks[i]->rewrite_only != rewrite_only)
			continue;
		st = pipeline_hooks[i]->attach(p);
		if (st != NULL) {
			p->hooks[p->nhooks] = pipeline_hooks[i];
			p->hook_state[p->nhooks++] = st;
			if (!rewrite_only)
				p->track = 1;
		}
	}
}

int pipeline_attach(struct pipeline *p)
{
	pipeline_detach(p);
	p->track = 0;
	pipeline_attach_some(p, 0);
	pipeline_attach_some(p, 1);
	return p->nhooks;
}

void pipeline_refresh(struct pipeline *p)
{
	int i, n = 0;

	if (p->vhost[0] == '\0')
		return; /* not open yet: attach happens at connection.open */
	for (i = 0; i < p->nhooks; i++) {
		if (p->hooks[i]->rewrite_only) {
			if (p->hooks[i]->detach)
				p->hooks[i]->detach(p->hook_state[i]);
			continue;
		}
		p->hooks[n] = p->hooks[i];
		p->hook_state[n++] = p->hook_state[i];
	}
	p->nhooks = n;
	pipeline_attach_some(p, 1);
}

void pipeline_detach(struct pipeline *p)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->detach)
			p->hooks[i]->detach(p->hook_state[i]);
	p->nhooks = 0;
	while (!list_empty(&p->surplus_due))
		list_del(p->surplus_due.next);
	pipeline_surplus_fini(p);
}

uint64_t pipeline_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

struct pipe_msg *pipe_msg_new(enum pipe_kind kind, uint16_t channel)
{
	struct pipe_msg *m = calloc(1, sizeof(*m));

	if (m == NULL)
		return NULL;
	m->kind = kind;
	m->channel = channel;
	m->streamer = -1;
	m->started_us = pipeline_now_us();
	init_amqp_pool(&m->pool, 4096);
	m->raw = evbuffer_new();
	if (m->raw == NULL) {
		pipe_msg_free(m);
		return NULL;
	}
	return m;
}

void pipe_msg_free(struct pipe_msg *m)
{
	if (m == NULL)
		return;
	empty_amqp_pool(&m->pool);
	if (m->raw)
		evbuffer_free(m->raw);
	if (m->body)
		evbuffer_free(m->body);
	free(m);
}

int pipeline_wants(struct pipeline *p, struct channel *ch, enum pipe_kind kind,
		   amqp_method_number_t id, void *method, int per_hook[PIPELINE_MAX_HOOKS])
{
	int i, want = 0;

	/* Every slot is written: a reload may attach a hook at a slot this
	 * message's later frames then read. */
	for (i = 0; i < PIPELINE_MAX_HOOKS; i++) {
		per_hook[i] =
		    i < p->nhooks && p->hooks[i]->wants
			? p->hooks[i]->wants(p->hook_state[i], p, ch, kind, id, method)
			: 0;
		want |= per_hook[i];
	}
	return want;
}

/* The header is in: ask again the hooks that can change their mind. */
static int pipeline_header_want(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	int i, want = 0;

	for (i = 0; i < p->nhooks; i++) {
		if (m->hook_want[i] && p->hooks[i]->header_want)
			m->hook_want[i] = p->hooks[i]->header_want(p->hook_state[i], p, ch, m);
		want |= m->hook_want[i];
	}
	return m->want = want;
}

/* Copy a body frame's payload (at the end of raw) into m->body. */
static int pipeline_copy_body(struct pipe_msg *m, size_t frame_len)
{
	static _Thread_local uint8_t chunk[16384];
	struct evbuffer_ptr pos;
	size_t off = evbuffer_get_length(m->raw) - frame_len + FRAME_HEADER_SIZE;
	size_t left = frame_len - FRAME_OVERHEAD;

	if (m->body == NULL && (m->body = evbuffer_new()) == NULL)
		return -1;
	while (left > 0) {
		size_t n = left < sizeof(chunk) ? left : sizeof(chunk);

		if (evbuffer_ptr_set(m->raw, &pos, off, EVBUFFER_PTR_SET) != 0 ||
		    evbuffer_copyout_from(m->raw, &pos, chunk, n) != (ev_ssize_t)n ||
		    evbuffer_add(m->body, chunk, n) != 0)
			return -1;
		off += n;
		left -= n;
	}
	return 0;
}

/* Give a streamed body frame's payload (at the front of in) to the hook. */
static int pipeline_stream_chunk(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
				 struct evbuffer *in, size_t frame_len)
{
	const struct pipe_hook *h = p->hooks[m->streamer];
	size_t left = frame_len - FRAME_OVERHEAD;
	unsigned char *data;

	evbuffer_drain(in, FRAME_HEADER_SIZE);
	data = left ? evbuffer_pullup(in, (ev_ssize_t)left) : NULL;
	if (left && data == NULL)
		return PIPE_COLLECT_FAILED;
	if (h->stream_body(p->hook_state[m->streamer], p, ch, m, data, left) != 0)
		return PIPE_COLLECT_FAILED;
	evbuffer_drain(in, left + 1);
	return PIPE_COLLECT_OK;
}

/* The header is in: does a hook take the body as a stream? */
static void pipeline_stream_offer(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	int i;

	for (i = 0; i < p->nhooks; i++) {
		const struct pipe_hook *h = p->hooks[i];

		if (h->stream_begin && h->stream_body &&
		    h->stream_begin(p->hook_state[i], p, ch, m) == 1) {
			m->streamer = i;
			return;
		}
	}
}

int pipeline_collect(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
		     struct evbuffer *in, size_t frame_len, int frame_type)
{
	uint8_t *frame = NULL;
	uint16_t cls;

	if (frame_type == FRAME_BODY && m->streamer >= 0)
		return pipeline_stream_chunk(p, ch, m, in, frame_len);
	if (evbuffer_get_length(m->raw) + frame_len >
	    (size_t)worker_settings.max_message_size + 65536)
		return PIPE_COLLECT_TOO_LARGE;
	if (frame_type == FRAME_METHOD || frame_type == FRAME_HEADER) {
		/* rabbitmq-c decodes in place: give it bytes that stay put
		 * while the frames move on. */
		frame = amqp_pool_alloc(&m->pool, frame_len);
		if (frame == NULL ||
		    evbuffer_copyout(in, frame, frame_len) != (ev_ssize_t)frame_len)
			return PIPE_COLLECT_FAILED;
		frame += FRAME_HEADER_SIZE;
	}
	if (evbuffer_remove_buffer(in, m->raw, frame_len) != (int)frame_len)
		return PIPE_COLLECT_FAILED;
	switch (frame_type) {
	case FRAME_METHOD:
		m->raw_method_len = frame_len;
		return method_decode(frame, frame_len - FRAME_OVERHEAD, &m->pool, &m->method_id,
				     &m->method) == 0
			   ? PIPE_COLLECT_OK
			   : PIPE_COLLECT_FAILED;
	case FRAME_HEADER:
		m->raw_header_len = frame_len;
		content_header_peek(frame, &cls, &m->body_size);
		if (content_props_decode(frame, frame_len - FRAME_OVERHEAD, &m->pool,
					 &m->props) != 0)
			return PIPE_COLLECT_FAILED;
		m->headers_at_decode = (m->props->_flags & AMQP_BASIC_HEADERS_FLAG)
					   ? m->props->headers.num_entries
					   : -1;
		if (pipeline_header_want(p, ch, m) == 0)
			return PIPE_COLLECT_RELEASE;
		pipeline_stream_offer(p, ch, m);
		if (m->streamer < 0 &&
		    m->body_size > (uint64_t)worker_settings.max_message_size)
			return PIPE_COLLECT_TOO_LARGE;
		return PIPE_COLLECT_OK;
	default:
		if (m->want & PIPE_WANT_BODY)
			return pipeline_copy_body(m, frame_len) == 0 ? PIPE_COLLECT_OK
								     : PIPE_COLLECT_FAILED;
		return PIPE_COLLECT_OK;
	}
}

void pipeline_headers_appended(struct pipe_msg *m)
{
	m->props_appended = 1;
}

/* The header frame at the front of raw, with the headers a hook appended
 * spliced into its table: 0, or -1 when it must be encoded whole. */
static int pipeline_emit_appended(struct pipeline *p, struct pipe_msg *m, struct evbuffer *out)
{
	const amqp_table_t *h = &m->props->headers;
	int from = m->headers_at_decode < 0 ? 0 : m->headers_at_decode;
	uint8_t enc[4096];
	amqp_table_t added;
	size_t off = 0;
	const uint8_t *frame;

	if (!(m->props->_flags & AMQP_BASIC_HEADERS_FLAG) || h->num_entries < from)
		return -1;
	added.num_entries = h->num_entries - from;
	added.entries = h->entries + from;
	if (amqp_encode_table((amqp_bytes_t){sizeof(enc), enc}, &added, &off) != 0 || off < 4)
		return -1;
	if ((frame = evbuffer_pullup(m->raw, (ev_ssize_t)m->raw_header_len)) == NULL ||
	    content_header_append_headers(out, frame, m->raw_header_len, enc + 4, off - 4,
					  p->frame_max ? p->frame_max : 131072u) != 0)
		return -1;
	evbuffer_drain(m->raw, m->raw_header_len);
	return 0;
}

/* Write a message out, re-encoding only the parts a hook changed. */
static int pipeline_emit(struct pipeline *p, struct pipe_msg *m, struct evbuffer *out)
{
	struct evbuffer *raw = m->raw;
	uint64_t size = m->body_size;
	int rc = 0;

	stats_msg_time(&p->w->stats, pipeline_now_us() - m->started_us);
	if (m->method_dirty) {
		evbuffer_drain(raw, m->raw_method_len);
		rc |= method_write(out, m->channel, m->method_id, m->method);
	} else {
		evbuffer_remove_buffer(raw, out, m->raw_method_len);
	}
	if (m->body_dirty)
		size = m->body ? evbuffer_get_length(m->body) : 0;
	if (m->props_appended && !m->props_dirty && !m->body_dirty &&
	    pipeline_emit_appended(p, m, out) == 0) {
		/* spliced */
	} else if (m->props_dirty || m->body_dirty || m->props_appended) {
		evbuffer_drain(raw, m->raw_header_len);
		rc |= content_header_write(out, m->channel, AMQP_BASIC_CLASS, size, m->props);
	} else {
		evbuffer_remove_buffer(raw, out, m->raw_header_len);
	}
	if (m->body_dirty) {
		evbuffer_drain(raw, evbuffer_get_length(raw));
		if (m->body)
			rc |= content_body_write(out, m->channel, m->body, p->frame_max);
	} else {
		evbuffer_add_buffer(out, raw);
	}
	return rc ? -1 : 0;
}

uint64_t *pipeline_tag_of(struct pipe_msg *m)
{
	if (m->method_id == AMQP_BASIC_DELIVER_METHOD)
		return &((amqp_basic_deliver_t *)m->method)->delivery_tag;
	if (m->method_id == AMQP_BASIC_GET_OK_METHOD)
		return &((amqp_basic_get_ok_t *)m->method)->delivery_tag;
	return NULL;
}

/* A delivery goes to the client with its client-side tag. */
int pipeline_deliver_now(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	uint64_t *tagp = pipeline_tag_of(m);
	uint64_t client;
	int rc;

	if (tagp) {
		client = p->track ? tagmap_deliver(&ch->tags, m->broker_tag, !m->no_ack)
				  : m->broker_tag;
		if (client != *tagp) {
			*tagp = client;
			m->method_dirty = 1;
		}
	}
	rc = pipeline_emit(p, m, pipeline_out(p, DIR_TO_CLIENT));
	pipe_msg_free(m);
	return rc;
}

/* A delivery goes to the client now, or waits while the client has its
 * prefetch's worth (pipeline_surplus.c). */
static int pipeline_deliver(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	int rc = pipeline_surplus_admit(p, ch, m);

	if (rc != 0)
		return rc > 0 ? 0 : -1;
	return pipeline_deliver_now(p, ch, m);
}

static void pipeline_settle_upstream(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	if (!m->no_ack)
		method_write_basic_ack(pipeline_out(p, DIR_TO_BROKER), ch->id, m->broker_tag,
				       0);
}

/* The leg a message came from: its later frames wait while it waits. */
enum chan_dir pipeline_dir(const struct pipe_msg *m)
{
	return m->kind == PIPE_PUBLISH ? DIR_TO_BROKER : DIR_TO_CLIENT;
}

/* Tell the hooks what became of a publish (see pipe_hook.published). */
static void pipeline_published(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			       int forwarded, uint64_t broker_seq)
{
	int i;

	if (m->kind != PIPE_PUBLISH)
		return;
	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->published)
			p->hooks[i]->published(p->hook_state[i], p, ch, m, forwarded,
					       broker_seq);
}

/* A publish the proxy will not forward: the client is told. */
static void pipeline_refuse(struct pipeline *p, struct channel *ch)
{
	if (ch->confirm_mode && p->track) {
		amqp_basic_nack_t n = {confirmmap_answer(&ch->confirms), 0, 0};

		method_write(pipeline_out(p, DIR_TO_CLIENT), ch->id, AMQP_BASIC_NACK_METHOD,
			     &n);
		return;
	}
	pipeline_channel_error(
	    p, ch, 541, "INTERNAL_ERROR - the proxy could not store the message", 60, 40);
}

/* Dispose of a message by its final verdict. */
static int pipeline_finish(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
			   enum pipe_verdict v)
{
	uint64_t seq = 0;
	int rc;

	if (ch->proxy_closing) {
		/* Its channel was closed meanwhile: nothing more goes on it (a
		 * delivery is requeued by the close). */
		pipeline_published(p, ch, m, 0, 0);
		pipe_msg_free(m);
		return 0;
	}
	if (m->kind == PIPE_PUBLISH) {
		if (v == PIPE_ANSWER) {
			STATS_INC(&p->w->stats, publishes_answered);
			if (ch->confirm_mode)
				method_write_basic_ack(pipeline_out(p, DIR_TO_CLIENT), ch->id,
						       confirmmap_answer(&ch->confirms), 0);
			pipeline_published(p, ch, m, 0, 0);
			pipe_msg_free(m);
			return 0;
		}
		if (v == PIPE_REFUSE) {
			STATS_INC(&p->w->stats, publishes_refused);
			pipeline_refuse(p, ch);
			pipeline_published(p, ch, m, 0, 0);
			pipe_msg_free(m);
			return 0;
		}
		if (v == PIPE_SWALLOW) { /* its channel went away meanwhile */
			pipeline_published(p, ch, m, 0, 0);
			pipe_msg_free(m);
			return 0;
		}
		if (ch->confirm_mode && p->track) {
			confirmmap_forward(&ch->confirms);
			seq = ch->confirms.next_broker;
		}
		rc = pipeline_emit(p, m, pipeline_out(p, DIR_TO_BROKER));
		pipeline_published(p, ch, m, 1, seq);
		pipe_msg_free(m);
		return rc;
	}
	if (v == PIPE_REFUSE) {
		/* A delivery the proxy cannot complete: its channel closes, so
		 * the broker requeues it with everything else unacked. */
		pipeline_channel_error(
		    p, ch, 541,
		    "INTERNAL_ERROR - the proxy could not read the message's payload", 60, 60);
		pipe_msg_free(m);
		return 0;
	}
	if (v == PIPE_REJECT && m->kind != PIPE_RETURN && !m->no_ack) {
		amqp_basic_reject_t r = {m->broker_tag, 0};

		pipeline_settled(p, ch, AMQP_BASIC_REJECT_METHOD, m->broker_tag);
		method_write(pipeline_out(p, DIR_TO_BROKER), ch->id, AMQP_BASIC_REJECT_METHOD,
			     &r);
		v = PIPE_SWALLOW;
		m->no_ack = 1; /* settled above */
	}
	switch (v) {
	case PIPE_SWALLOW:
		STATS_INC(&p->w->stats, messages_swallowed);
		if (m->kind != PIPE_RETURN) {
			pipeline_settle_upstream(p, ch, m);
			pipeline_settled(p, ch, AMQP_BASIC_ACK_METHOD, m->broker_tag);
		}
		if (m->kind == PIPE_GET_OK) {
			amqp_basic_get_empty_t e = {amqp_empty_bytes};

			method_write(pipeline_out(p, DIR_TO_CLIENT), ch->id,
				     AMQP_BASIC_GET_EMPTY_METHOD, &e);
		}
		pipe_msg_free(m);
		return 0;
	case PIPE_HOLD:
		if (tagmap_hold(&ch->tags, m->broker_tag) != 0)
			return -1; /* the hook still owns m; the session closes */
		if (m->kind == PIPE_GET_OK) {
			/* The client's basic.get gets its answer now. */
			amqp_basic_get_empty_t e = {amqp_empty_bytes};

			method_write(pipeline_out(p, DIR_TO_CLIENT), ch->id,
				     AMQP_BASIC_GET_EMPTY_METHOD, &e);
		}
		return 0;
	default:
		return pipeline_deliver(p, ch, m);
	}
}

/* The hooks from the from'th on, until one decides; a hook that waits
 * is resumed from the next one. */
static enum pipe_verdict pipeline_run(struct pipeline *p, struct channel *ch,
				      struct pipe_msg *m, int from)
{
	enum pipe_verdict v = PIPE_PASS;
	int i;

	for (i = from; i < p->nhooks && v == PIPE_PASS; i++)
		if (p->hooks[i]->message)
			v = p->hooks[i]->message(p->hook_state[i], p, ch, m);
	m->next_hook = i;
	return v;
}

int pipeline_complete(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	enum pipe_verdict v;

	if ((m->want & PIPE_WANT_BODY) && m->body == NULL)
		m->body = evbuffer_new();
	v = pipeline_run(p, ch, m, 0);
	if (v == PIPE_PASS && m->streamer >= 0 && !m->body_dirty) {
		/* The body went to the stream and nothing replaced it. */
		log_error("hook %s streamed a body and gave no replacement",
			  p->hooks[m->streamer]->name);
		pipeline_published(p, ch, m, 0, 0);
		pipe_msg_free(m);
		return -1;
	}
	if (v == PIPE_WAIT) {
		pipeline_hold(p, pipeline_dir(m));
		return 0;
	}
	return pipeline_finish(p, ch, m, v);
}

int pipeline_pass(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	return pipeline_finish(p, ch, m, PIPE_PASS);
}

/* Rewrite-only hooks see a message that waited, once it is final. */
void pipeline_rewrite(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->rewrite_only && p->hooks[i]->message)
			p->hooks[i]->message(p->hook_state[i], p, ch, m);
}

int pipeline_resume(struct pipeline *p, struct channel *ch, struct pipe_msg *m,
		    enum pipe_verdict v)
{
	enum chan_dir dir = pipeline_dir(m);
	int rc;

	/* A waiting message is finished once, on a channel still at hand. */
	ACEMQ_ASSERT(ch != NULL && m != NULL);
	/* The hooks after the one that waited have their say. */
	if (v == PIPE_PASS && !ch->proxy_closing)
		v = pipeline_run(p, ch, m, m->next_hook);
	if (v == PIPE_WAIT)
		return 0; /* another hook waits: the leg stays held */
	rc = pipeline_finish(p, ch, m, v);
	pipeline_wake(p, dir);
	return rc;
}

void pipeline_drop(struct pipeline *p, struct pipe_msg *m)
{
	enum chan_dir dir = pipeline_dir(m);

	pipeline_published(p, NULL, m, 0, 0);
	pipe_msg_free(m);
	pipeline_wake(p, dir);
}

size_t pipeline_client_backlog(struct pipeline *p)
{
	struct evbuffer *out = pipeline_out(p, DIR_TO_CLIENT);

	return out ? evbuffer_get_length(out) : 0;
}

int pipeline_release(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	tagmap_unhold(&ch->tags, m->broker_tag);
	return pipeline_deliver(p, ch, m);
}

int pipeline_requeue(struct pipeline *p, struct channel *ch, struct pipe_msg *m, int requeue)
{
	tagmap_unhold(&ch->tags, m->broker_tag);
	if (!m->no_ack) {
		amqp_basic_nack_t n = {m->broker_tag, 0, (amqp_boolean_t)requeue};

		method_write(pipeline_out(p, DIR_TO_BROKER), ch->id, AMQP_BASIC_NACK_METHOD,
			     &n);
	}
	pipe_msg_free(m);
	return 0;
}

int pipeline_ack(struct pipeline *p, struct channel *ch, struct pipe_msg *m)
{
	tagmap_unhold(&ch->tags, m->broker_tag);
	if (!m->no_ack)
		method_write_basic_ack(pipeline_out(p, DIR_TO_BROKER), ch->id, m->broker_tag,
				       0);
	pipe_msg_free(m);
	return 0;
}

int pipeline_body_copy(const struct pipe_msg *m, amqp_bytes_t *out)
{
	struct evbuffer_ptr pos;
	uint8_t head[FRAME_HEADER_SIZE];
	size_t off = m->raw_method_len + m->raw_header_len, total = evbuffer_get_length(m->raw);
	size_t have = 0;

	out->len = 0;
	out->bytes = NULL;
	if (m->body_size > (uint64_t)SIZE_MAX - 1 ||
	    (out->bytes = malloc(m->body_size + 1)) == NULL)
		return -1;
	if (m->body && !m->body_dirty && evbuffer_get_length(m->body) == m->body_size) {
		evbuffer_copyout(m->body, out->bytes, m->body_size);
		out->len = m->body_size;
		return 0;
	}
	while (have < m->body_size && off + FRAME_OVERHEAD <= total) {
		uint32_t size;

		if (evbuffer_ptr_set(m->raw, &pos, off, EVBUFFER_PTR_SET) != 0 ||
		    evbuffer_copyout_from(m->raw, &pos, head, sizeof(head)) !=
			(ev_ssize_t)sizeof(head))
			break;
		size = (uint32_t)head[3] << 24 | (uint32_t)head[4] << 16 |
		       (uint32_t)head[5] << 8 | head[6];
		if (size > m->body_size - have || off + FRAME_OVERHEAD + size > total)
			break;
		if (size && (evbuffer_ptr_set(m->raw, &pos, off + FRAME_HEADER_SIZE,
					      EVBUFFER_PTR_SET) != 0 ||
			     evbuffer_copyout_from(m->raw, &pos, (uint8_t *)out->bytes + have,
						   size) != (ev_ssize_t)size))
			break;
		have += size;
		off += FRAME_OVERHEAD + size;
	}
	if (have != m->body_size) {
		free(out->bytes);
		out->bytes = NULL;
		return -1;
	}
	out->len = have;
	return 0;
}

void pipeline_settled(struct pipeline *p, struct channel *ch, amqp_method_number_t how,
		      uint64_t broker_tag)
{
	int i;

	pipeline_surplus_seen(p, ch, broker_tag);
	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->settle)
			p->hooks[i]->settle(p->hook_state[i], p, ch, how, broker_tag);
}

void pipeline_held_input(struct pipeline *p, int from)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->held_input)
			p->hooks[i]->held_input(p->hook_state[i], p, from);
	pipeline_surplus_flow(p);
}

void pipeline_drained(struct pipeline *p)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->drained)
			p->hooks[i]->drained(p->hook_state[i], p);
}

void pipeline_recovered(struct pipeline *p, struct channel *ch)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->recovered)
			p->hooks[i]->recovered(p->hook_state[i], p, ch);
}

int pipeline_publish_watched(const struct pipeline *p)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->publish_settled)
			return 1;
	return 0;
}

void pipeline_publish_settled(struct pipeline *p, struct channel *ch, uint64_t broker_seq,
			      int acked)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->publish_settled)
			p->hooks[i]->publish_settled(p->hook_state[i], p, ch, broker_seq,
						     acked);
}

int pipeline_settle_gate(struct pipeline *p, struct channel *ch, amqp_method_number_t how,
			 uint64_t client_tag, int multiple)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->settle_gate &&
		    p->hooks[i]->settle_gate(p->hook_state[i], p, ch, how, client_tag,
					     multiple)) {
			pipeline_hold(p, DIR_TO_BROKER);
			pipeline_surplus_flow(p);
			return 1;
		}
	return 0;
}

void pipeline_settle_release(struct pipeline *p)
{
	pipeline_wake(p, DIR_TO_BROKER);
}

int pipeline_confirm_hold(struct pipeline *p, struct channel *ch, uint64_t broker_seq)
{
	(void)p;
	return ch->confirm_mode ? confirmmap_hold(&ch->confirms, broker_seq) : -1;
}

void pipeline_confirm_release(struct pipeline *p, uint16_t channel, uint64_t broker_seq)
{
	struct channel *ch = pipeline_channel(p, channel);

	if (ch != NULL)
		settle_confirm_release(p, ch, broker_seq);
}

void pipeline_channel_closed(struct pipeline *p, struct channel *ch)
{
	int i;

	for (i = 0; i < p->nhooks; i++)
		if (p->hooks[i]->channel_closed)
			p->hooks[i]->channel_closed(p->hook_state[i], p, ch);
}
