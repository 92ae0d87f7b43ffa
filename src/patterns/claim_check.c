/* claim_check: bodies at or above a vhost's threshold go to its claim store
 * on publish and travel as 0xAC 0x01 0x01 KEY; on delivery, get-ok and
 * return a claim check is replaced by its payload, streamed at the pace of
 * the client, and an inline-framed body (0xAC 0x01 0x00) is unframed. */
#include "claim_check.h"

#include "../channel.h"
#include "../list.h"
#include "../log.h"
#include "../pipeline.h"
#include "../rules.h"
#include "../store/claims.h"
#include "../worker.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#define CLAIM_CHECK_MAGIC0     0xAC
#define CLAIM_CHECK_MAGIC1     0x01
#define CLAIM_CHECK_TAG_INLINE 0x00
#define CLAIM_CHECK_TAG_REF    0x01
#define CLAIM_CHECK_MAX_KEY    255   /* what a reference may carry */
#define CLAIM_CHECK_INLINE_MIN 65536 /* inline bodies looked at, at least */

/* A publish whose body goes to the store. While streaming, m belongs to
 * its channel; once the publish waits for durability it belongs here. */
struct claim_check_up {
	struct claim_check *cc;
	struct pipe_msg *m;
	uint16_t channel;
	struct claims_upload *u;
	uint8_t prefix[2];
	int nprefix;
	unsigned framed : 1;  /* the body is framed already: passed as it is */
	unsigned waiting : 1; /* message() returned PIPE_WAIT: m is ours */
	unsigned held : 1;    /* the client leg is held for the backlog */
	unsigned gone : 1;    /* its channel closed meanwhile */
	int rc;               /* the store's answer */
	struct list link;     /* in the hook's ups */
};

/* A delivery whose payload is read back from the store. */
struct claim_check_rd {
	struct claim_check *cc;
	struct pipe_msg *m;
	uint16_t channel;
	struct claims_read *r;
	char key[CLAIMS_KEY_LEN + 1];
	int started;      /* method and header went out */
	int want_next;    /* waiting for the client's output to drain */
	int gone;         /* its channel closed meanwhile */
	struct list link; /* in the hook's rds */
};

struct claim_check {
	struct pipeline *p;
	struct claims_where where;
	long threshold;
	enum rules_on_missing on_missing;
	struct list ups; /* newest first */
	struct list rds; /* newest first */
};

enum claim_check_form claim_check_form(const uint8_t *body, size_t len)
{
	if (len < 3 || body[0] != CLAIM_CHECK_MAGIC0 || body[1] != CLAIM_CHECK_MAGIC1)
		return CLAIM_CHECK_PLAIN;
	if (body[2] == CLAIM_CHECK_TAG_INLINE)
		return CLAIM_CHECK_INLINED;
	if (body[2] == CLAIM_CHECK_TAG_REF && len - 3 <= CLAIM_CHECK_MAX_KEY)
		return CLAIM_CHECK_REFERENCE;
	return CLAIM_CHECK_PLAIN;
}

void claim_check_printable(char *out, size_t outlen, const uint8_t *key, size_t len)
{
	size_t i;

	if (outlen == 0)
		return;
	for (i = 0; i < len && i + 1 < outlen; i++)
		out[i] = key[i] >= 0x20 && key[i] < 0x7f ? (char)key[i] : '?';
	out[i] = 0;
}

static const struct rules_claim_check *claim_check_rule(struct pipeline *p)
{
	const struct rules_vhost *v = pipeline_rules(p);

	return v && v->claim_check.enabled ? &v->claim_check : NULL;
}

static void *claim_check_attach(struct pipeline *p)
{
	const struct rules_claim_check *rule = claim_check_rule(p);
	struct claim_check *cc;

	if (rule == NULL || (cc = calloc(1, sizeof(*cc))) == NULL)
		return NULL;
	cc->p = p;
	list_init(&cc->ups);
	list_init(&cc->rds);
	claims_where(&cc->where, p->vhost, rule);
	cc->threshold = rule->threshold;
	cc->on_missing = rule->on_missing;
	return cc;
}

static void claim_check_up_free(struct claim_check_up *up)
{
	list_del(&up->link);
	if (up->waiting)
		pipe_msg_free(up->m);
	free(up);
}

static void claim_check_rd_free(struct claim_check_rd *rd)
{
	list_del(&rd->link);
	if (rd->m)
		pipe_msg_free(rd->m);
	free(rd);
}

static void claim_check_detach(void *state)
{
	struct claim_check *cc = state;
	struct claim_check_up *up;
	struct claim_check_rd *rd;

	while ((up = list_first_entry(&cc->ups, struct claim_check_up, link)) != NULL) {
		claims_upload_abandon(up->u);
		claim_check_up_free(up);
	}
	while ((rd = list_first_entry(&cc->rds, struct claim_check_rd, link)) != NULL) {
		claims_read_abandon(rd->r);
		claim_check_rd_free(rd);
	}
	free(cc);
}

static struct claim_check_up *claim_check_up_of(struct claim_check *cc, struct pipe_msg *m)
{
	struct claim_check_up *up;

	list_for_each_entry (up, &cc->ups, link)
		if (up->m == m)
			return up;
	return NULL;
}

static int claim_check_wants(void *state, struct pipeline *p, struct channel *ch,
			     enum pipe_kind kind, amqp_method_number_t id, void *method)
{
	const struct rules_claim_check *rule = claim_check_rule(p);

	if (rule == NULL)
		return PIPE_WANT_NONE;
	if (kind == PIPE_PUBLISH) {
		amqp_basic_publish_t *pub = method;

		return rules_matches(&rule->match, pub->exchange.bytes, pub->exchange.len,
				     pub->routing_key.bytes, pub->routing_key.len)
			   ? PIPE_WANT_MSG
			   : PIPE_WANT_NONE;
	}
	return PIPE_WANT_MSG; /* every delivery of the vhost, whoever published it */
}

static int claim_check_header_want(void *state, struct pipeline *p, struct channel *ch,
				   struct pipe_msg *m)
{
	struct claim_check *cc = state;
	uint64_t inline_max =
	    (uint64_t)(cc->threshold > CLAIM_CHECK_INLINE_MIN ? cc->threshold
							      : CLAIM_CHECK_INLINE_MIN) +
	    3;

	if (m->kind == PIPE_PUBLISH)
		return m->body_size >= (uint64_t)cc->threshold ? PIPE_WANT_MSG : PIPE_WANT_NONE;
	/* A claim check or an inline-framed body is small; a larger body is
	 * not framed by the proxy and goes on as it is. */
	if (m->body_size < 3 || m->body_size > inline_max)
		return PIPE_WANT_NONE;
	return PIPE_WANT_MSG | PIPE_WANT_BODY;
}

/* ---- publish ----------------------------------------------------------- */

static void claim_check_up_progress_in(struct pipeline *p, void *arg)
{
	struct claim_check_up *up = arg;

	if (up->held && claims_upload_relieved(up->u)) {
		up->held = 0;
		pipeline_wake(p, DIR_TO_BROKER);
	}
}

static void claim_check_up_progress(void *arg)
{
	struct claim_check_up *up = arg;

	pipeline_call(up->cc->p, claim_check_up_progress_in, up);
}

static void claim_check_up_done_in(struct pipeline *p, void *arg)
{
	struct claim_check_up *up = arg;
	struct channel *ch = pipeline_channel(p, up->channel);
	struct pipe_msg *m = up->m;
	enum pipe_verdict v = PIPE_REFUSE;

	if (up->held) {
		up->held = 0;
		pipeline_wake(p, DIR_TO_BROKER);
	}
	if (up->gone || ch == NULL || ch->proxy_closing) {
		v = PIPE_SWALLOW; /* its channel went away: dropped */
	} else if (up->rc == 0) {
		uint8_t head[3] = {CLAIM_CHECK_MAGIC0, CLAIM_CHECK_MAGIC1, CLAIM_CHECK_TAG_REF};

		if (m->body == NULL)
			m->body = evbuffer_new();
		if (m->body && evbuffer_add(m->body, head, 3) == 0 &&
		    evbuffer_add(m->body, claims_upload_key(up->u), CLAIMS_KEY_LEN) == 0) {
			m->body_dirty = 1;
			v = PIPE_PASS;
			STATS_INC(&p->w->stats, claims_offloaded);
			STATS_ADD(&p->w->stats, claims_offloaded_bytes, m->body_size);
		}
	}
	/* A durable payload nothing will refer to is removed. */
	if (v != PIPE_PASS && up->rc == 0)
		claims_upload_discard(up->u);
	up->u = NULL;    /* freed by the store after this callback */
	up->waiting = 0; /* m goes to the pipeline */
	claim_check_up_free(up);
	if (ch)
		pipeline_resume(p, ch, m, v);
	else
		pipeline_drop(p, m);
}

static void claim_check_up_done(void *arg, int rc)
{
	struct claim_check_up *up = arg;

	up->rc = rc;
	if (rc != 0) {
		STATS_INC(&up->cc->p->w->stats, claims_store_errors);
		pipeline_log(up->cc->p, LOG_WARNING,
			     "claim check: the store refused a payload; publish refused");
	}
	if (!pipeline_call(up->cc->p, claim_check_up_done_in, up)) {
		/* The session is closing: the publish is not forwarded. */
		if (rc == 0)
			claims_upload_discard(up->u);
		up->u = NULL;
		claim_check_up_free(up);
	}
}

static int claim_check_stream_begin(void *state, struct pipeline *p, struct channel *ch,
				    struct pipe_msg *m)
{
	struct claim_check *cc = state;
	struct claim_check_up *up;

	if (m->kind != PIPE_PUBLISH || m->body_size < (uint64_t)cc->threshold)
		return 0;
	up = calloc(1, sizeof(*up));
	if (up == NULL)
		return 0;
	up->cc = cc;
	up->m = m;
	up->channel = ch->id;
	up->u = claims_upload_begin(&cc->where, p->w, claim_check_up_progress,
				    claim_check_up_done, up);
	if (up->u && m->props && (m->props->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG))
		claims_upload_set_type(up->u, m->props->content_type.bytes,
				       m->props->content_type.len);
	/* Without an upload the publish is refused at the end. */
	list_add(&up->link, &cc->ups);
	return 1;
}

/* Bytes of an already framed body are kept as they are. */
static int claim_check_keep(struct pipe_msg *m, const uint8_t *p, size_t len)
{
	if (m->body == NULL && (m->body = evbuffer_new()) == NULL)
		return -1;
	/* Held whole, so bounded like any message the proxy holds. */
	if (evbuffer_get_length(m->body) + len > (size_t)worker_settings.max_message_size)
		return -1;
	return evbuffer_add(m->body, p, len);
}

static int claim_check_stream_body(void *state, struct pipeline *p, struct channel *ch,
				   struct pipe_msg *m, const uint8_t *data, size_t len)
{
	struct claim_check_up *up = claim_check_up_of(state, m);

	if (up == NULL)
		return -1;
	/* The first two bytes say whether the body is framed already. */
	while (up->nprefix < 2 && len > 0) {
		up->prefix[up->nprefix++] = *data++;
		len--;
		if (up->nprefix < 2)
			continue;
		if (up->prefix[0] == CLAIM_CHECK_MAGIC0 &&
		    up->prefix[1] == CLAIM_CHECK_MAGIC1) {
			up->framed = 1;
			claims_upload_abandon(up->u);
			up->u = NULL;
			if (claim_check_keep(m, up->prefix, 2) != 0)
				return -1;
		} else if (up->u) {
			claims_upload_write(up->u, up->prefix, 2);
		}
	}
	if (len == 0)
		return 0;
	if (up->framed)
		return claim_check_keep(m, data, len);
	if (up->u == NULL || claims_upload_write(up->u, data, len) != 0)
		return 0; /* refused at the end; the rest of the body is dropped */
	if (!up->held && claims_upload_congested(up->u)) {
		up->held = 1;
		pipeline_hold(p, DIR_TO_BROKER);
	}
	return 0;
}

static enum pipe_verdict claim_check_publish(struct claim_check *cc, struct pipeline *p,
					     struct pipe_msg *m)
{
	struct claim_check_up *up = claim_check_up_of(cc, m);

	if (up == NULL)
		return PIPE_PASS;     /* below the threshold: untouched */
	if (up->nprefix < 2 && up->u) /* a body of 0 or 1 bytes */
		claims_upload_write(up->u, up->prefix, (size_t)up->nprefix);
	up->waiting = 1;
	if (up->framed) {
		/* Kept as it is; waits for nothing, but goes through the same
		 * completion so the message is disposed of in one place. */
		m->body_dirty = 1;
		if (m->body == NULL)
			m->body = evbuffer_new();
		up->waiting = 0;
		claim_check_up_free(up);
		return PIPE_PASS;
	}
	if (up->u == NULL || claims_upload_failed(up->u) || claims_upload_finish(up->u) != 0) {
		STATS_INC(&p->w->stats, claims_store_errors);
		claims_upload_abandon(up->u);
		up->u = NULL;
		if (up->held) {
			up->held = 0;
			pipeline_wake(p, DIR_TO_BROKER);
		}
		up->waiting = 0;
		claim_check_up_free(up);
		pipeline_log(p, LOG_WARNING, "claim check: the store refused a payload");
		return PIPE_REFUSE;
	}
	return PIPE_WAIT;
}

/* ---- delivery ------------------------------------------------------------ */

static void claim_check_rd_end(struct pipeline *p, struct claim_check_rd *rd,
			       enum pipe_verdict v)
{
	struct channel *ch = pipeline_channel(p, rd->channel);
	struct pipe_msg *m = rd->m;

	rd->m = NULL;
	claims_read_abandon(rd->r);
	rd->r = NULL;
	claim_check_rd_free(rd);
	if (ch == NULL) {
		/* Its channel went (or the client never opened it): the
		 * delivery goes with it, and its leg flows again. */
		pipeline_drop(p, m);
		return;
	}
	pipeline_resume(p, ch, m, v);
}

static enum pipe_verdict claim_check_missing(struct claim_check *cc, struct pipeline *p,
					     const char *why, const char *key)
{
	STATS_INC(&p->w->stats, claims_missing);
	pipeline_log(p, LOG_WARNING, "claim check: %s (key %.64s): %s", why, key,
		     cc->on_missing == RULES_MISSING_PASS ? "delivered as it is"
							  : "dead-lettered");
	return cc->on_missing == RULES_MISSING_PASS ? PIPE_PASS : PIPE_REJECT;
}

struct claim_check_opened {
	struct claim_check_rd *rd;
	int rc;
	uint64_t size;
};

static void claim_check_read_opened_in(struct pipeline *p, void *arg)
{
	struct claim_check_opened *o = arg;
	struct claim_check_rd *rd = o->rd;
	struct channel *ch = pipeline_channel(p, rd->channel);

	if (rd->gone || ch == NULL) {
		/* Its channel closed: the broker has it back already. */
		struct pipe_msg *m = rd->m;

		rd->m = NULL;
		claims_read_abandon(rd->r);
		rd->r = NULL;
		claim_check_rd_free(rd);
		pipeline_stream_out_end(p, ch, m);
		return;
	}
	if (o->rc == 1) {
		claim_check_rd_end(
		    p, rd, claim_check_missing(rd->cc, p, "payload not in the store", rd->key));
		return;
	}
	if (o->rc != 0) {
		STATS_INC(&p->w->stats, claims_store_errors);
		pipeline_log(p, LOG_ERROR, "claim check: reading %s failed", rd->key);
		claim_check_rd_end(p, rd, PIPE_REFUSE);
		return;
	}
	if (pipeline_stream_out_begin(p, ch, rd->m, o->size) != 0) {
		claim_check_rd_end(p, rd, PIPE_REFUSE);
		return;
	}
	rd->started = 1;
	claims_read_next(rd->r);
}

static void claim_check_read_opened(void *arg, int rc, uint64_t size)
{
	struct claim_check_rd *rd = arg;
	struct claim_check_opened o = {rd, rc, size};

	if (!pipeline_call(rd->cc->p, claim_check_read_opened_in, &o)) {
		claims_read_abandon(rd->r);
		rd->r = NULL;
		claim_check_rd_free(rd);
	}
}

struct claim_check_chunk {
	struct claim_check_rd *rd;
	int rc;
	const uint8_t *data;
	size_t len;
};

/* The payload is out (or cannot be): the delivery is finished. */
static void claim_check_rd_finish(struct pipeline *p, struct claim_check_rd *rd, int ok)
{
	struct channel *ch = pipeline_channel(p, rd->channel);
	struct pipe_msg *m = rd->m;

	rd->m = NULL;
	claims_read_abandon(rd->r);
	rd->r = NULL;
	claim_check_rd_free(rd);
	if (!ok) {
		/* Part of the body is out: the message cannot be finished on
		 * its channel, so the connection goes (the broker requeues). */
		STATS_INC(&p->w->stats, claims_store_errors);
		pipeline_close(p, 541,
			       "INTERNAL_ERROR - the proxy could not read a message's payload");
	} else if (ch && !ch->proxy_closing) {
		STATS_INC(&p->w->stats, claims_rehydrated);
	}
	pipeline_stream_out_end(p, ch, m);
}

/* A chunk goes to the client: the store's buffer itself where it can be
 * had (no copy), else copied. */
static int claim_check_out(struct pipeline *p, struct channel *ch, struct claim_check_rd *rd,
			   const struct claim_check_chunk *c)
{
	void *kept = claims_read_keep(rd->r);

	if (kept == NULL)
		return pipeline_stream_out(p, ch, rd->m, c->data, c->len);
	return pipeline_stream_out_lent(p, ch, rd->m, c->data, c->len, claims_kept_free, kept);
}

static void claim_check_read_chunk_in(struct pipeline *p, void *arg)
{
	struct claim_check_chunk *c = arg;
	struct claim_check_rd *rd = c->rd;
	struct channel *ch = pipeline_channel(p, rd->channel);

	if (rd->gone) {
		claim_check_rd_finish(p, rd, 1); /* its channel went: the close requeued it */
		return;
	}
	if (c->rc != 0 || ch == NULL || (c->len && claim_check_out(p, ch, rd, c) != 0)) {
		pipeline_log(p, LOG_ERROR, "claim check: reading %s failed mid-way", rd->key);
		claim_check_rd_finish(p, rd, 0);
		return;
	}
	if (c->len == 0) {
		claim_check_rd_finish(p, rd, 1);
		return;
	}
	/* At the client's pace: the next chunk once its output drains. */
	if (pipeline_client_backlog(p) < (size_t)worker_settings.buffer_limit)
		claims_read_next(rd->r);
	else
		rd->want_next = 1;
}

static void claim_check_read_chunk(void *arg, int rc, const uint8_t *data, size_t len)
{
	struct claim_check_rd *rd = arg;
	struct claim_check_chunk c = {rd, rc, data, len};

	if (!pipeline_call(rd->cc->p, claim_check_read_chunk_in, &c)) {
		claims_read_abandon(rd->r);
		rd->r = NULL;
		claim_check_rd_free(rd);
	}
}

static void claim_check_drained(void *state, struct pipeline *p)
{
	struct claim_check *cc = state;
	struct claim_check_rd *rd;

	list_for_each_entry (rd, &cc->rds, link)
		if (rd->want_next &&
		    pipeline_client_backlog(p) < (size_t)worker_settings.buffer_limit) {
			rd->want_next = 0;
			claims_read_next(rd->r);
		}
}

static enum pipe_verdict claim_check_delivery(struct claim_check *cc, struct pipeline *p,
					      struct channel *ch, struct pipe_msg *m)
{
	size_t len = m->body ? evbuffer_get_length(m->body) : 0;
	const uint8_t *body = len ? evbuffer_pullup(m->body, (ev_ssize_t)len) : NULL;
	struct claim_check_rd *rd;
	char shown[CLAIM_CHECK_MAX_KEY + 1];
	size_t klen = len > 3 ? len - 3 : 0;

	switch (claim_check_form(body, len)) {
	case CLAIM_CHECK_PLAIN:
		return PIPE_PASS;
	case CLAIM_CHECK_INLINED:
		evbuffer_drain(m->body, 3);
		m->body_dirty = 1;
		STATS_INC(&p->w->stats, claims_inline_stripped);
		return PIPE_PASS;
	case CLAIM_CHECK_REFERENCE:
		break;
	}
	if (!claims_key_valid(body + 3, klen)) {
		STATS_INC(&p->w->stats, claims_bad_keys);
		claim_check_printable(shown, sizeof(shown), body + 3, klen);
		return claim_check_missing(cc, p, "a key the store never issues", shown);
	}
	rd = calloc(1, sizeof(*rd));
	if (rd == NULL)
		return PIPE_REFUSE;
	rd->cc = cc;
	rd->m = m;
	rd->channel = ch->id;
	memcpy(rd->key, body + 3, CLAIMS_KEY_LEN);
	rd->key[CLAIMS_KEY_LEN] = 0;
	list_add(&rd->link, &cc->rds);
	rd->r = claims_read_open(&cc->where, p->w, rd->key, claim_check_read_opened,
				 claim_check_read_chunk, rd);
	if (rd->r == NULL) {
		rd->m = NULL;
		claim_check_rd_free(rd);
		return PIPE_REFUSE;
	}
	return PIPE_WAIT;
}

static enum pipe_verdict claim_check_message(void *state, struct pipeline *p,
					     struct channel *ch, struct pipe_msg *m)
{
	if (m->kind == PIPE_PUBLISH)
		return claim_check_publish(state, p, m);
	return claim_check_delivery(state, p, ch, m);
}

static void claim_check_channel_closed(void *state, struct pipeline *p, struct channel *ch)
{
	struct claim_check *cc = state;
	struct claim_check_up *up;
	struct claim_check_rd *rd;

	list_for_each_entry_safe (up, &cc->ups, link) {
		if (up->channel != ch->id)
			continue;
		if (up->waiting) {
			up->gone = 1; /* finished, without a word, when the store answers */
			continue;
		}
		/* Still streaming: the channel frees the message. */
		claims_upload_abandon(up->u);
		if (up->held)
			pipeline_wake(p, DIR_TO_BROKER);
		claim_check_up_free(up);
	}
	list_for_each_entry (rd, &cc->rds, link)
		if (rd->channel == ch->id)
			rd->gone = 1;
}

/* A publish disposed of before its message() reached this hook (a hook
 * before it answered it): its upload, streamed at header time, goes. */
static void claim_check_published(void *state, struct pipeline *p, struct channel *ch,
				  struct pipe_msg *m, int forwarded, uint64_t broker_seq)
{
	struct claim_check_up *up = claim_check_up_of(state, m);

	if (up == NULL || up->waiting)
		return;
	claims_upload_abandon(up->u);
	up->u = NULL;
	if (up->held) {
		up->held = 0;
		pipeline_wake(p, DIR_TO_BROKER);
	}
	claim_check_up_free(up);
}

static const struct pipe_hook claim_check_hook = {
    .name = "claim_check",
    .attach = claim_check_attach,
    .detach = claim_check_detach,
    .wants = claim_check_wants,
    .header_want = claim_check_header_want,
    .stream_begin = claim_check_stream_begin,
    .stream_body = claim_check_stream_body,
    .message = claim_check_message,
    .channel_closed = claim_check_channel_closed,
    .drained = claim_check_drained,
    .published = claim_check_published,
};

void claim_check_register(void)
{
	pipeline_register(&claim_check_hook);
}
