/* replay: dead letters moved back where they came from, one thread and one
 * broker connection of the proxy's own per replay (see replay.h).
 *
 * The connection is engine_conn's (channel 1 takes messages with
 * basic.get, channel 2 publishes in confirm mode, channel 3 runs the
 * passive checks), not the vhost's engine: that one consumes the
 * scheduler's queue and carries its publishes, and a replay's pace is not
 * theirs. A message is taken only when the rate allows it and fewer than
 * REPLAY_WINDOW publishes are out; it is acknowledged on channel 1 when
 * its confirm comes (and it was not returned). Everything not moved is
 * left unacknowledged until the connection closes at the end, when the
 * broker puts it back: basic.get never hands it out twice in one replay,
 * and a proxy killed mid-replay loses nothing (a publish out at that
 * moment may be in both queues: at most REPLAY_WINDOW of them). */
#include "replay_int.h"

#include "engine_conn.h"
#include "log.h"
#include "store/state.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPLAY_DRAIN_MS  10000 /* confirms waited for at the end */
#define REPLAY_TICK_MS   100   /* a cancel is seen within this */
#define REPLAY_EXCHANGES 64    /* exchanges whose existence is remembered */

/* ---- the thread's own --------------------------------------------------------------- */

/* A publish out, until its confirm. */
struct replay_out {
	uint64_t seq, tag;
	int returned;
	amqp_bytes_t exchange, routing_key; /* malloc'd, to match a basic.return */
	struct replay_out *next;
};

struct replay_run {
	struct replay *j;
	struct engine_conn c;
	uint64_t next_seq;
	struct replay_out *out, **out_tail; /* in publish order */
	int nout;
	struct {
		char *name;
		int exists;
	} ex[REPLAY_EXCHANGES];
	int nex;
};

static uint64_t replay_clock_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void replay_skip(struct replay *j, enum replay_reason why)
{
	pthread_mutex_lock(&replay_lock);
	j->skipped[why]++;
	pthread_mutex_unlock(&replay_lock);
}

/* The replay cannot go on: the reason kept for its answer. -1. */
static int replay_fail(struct replay_run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int replay_fail(struct replay_run *r, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&replay_lock);
	if (r->j->error[0] == '\0') {
		va_start(ap, fmt);
		vsnprintf(r->j->error, sizeof(r->j->error), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&replay_lock);
	return -1;
}

/* A reply that is not normal, in words. -1. */
static int replay_fail_reply(struct replay_run *r, amqp_rpc_reply_t rep, const char *what)
{
	if (rep.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    (rep.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
	     rep.reply.id == AMQP_CONNECTION_CLOSE_METHOD)) {
		/* The two closes have the same first members. */
		const amqp_channel_close_t *cl = rep.reply.decoded;

		return replay_fail(r, "%s: %u %.*s", what, cl->reply_code,
				   (int)cl->reply_text.len, (const char *)cl->reply_text.bytes);
	}
	if (rep.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		return replay_fail(r, "%s: %s", what, amqp_error_string2(rep.library_error));
	return replay_fail(r, "%s failed", what);
}

/* The reply code of a broker's close in rep, or 0. */
static unsigned replay_close_code(amqp_rpc_reply_t rep)
{
	if (rep.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    (rep.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
	     rep.reply.id == AMQP_CONNECTION_CLOSE_METHOD))
		return ((const amqp_channel_close_t *)rep.reply.decoded)->reply_code;
	return 0;
}

static void replay_out_free(struct replay_out *p)
{
	free(p->exchange.bytes);
	free(p->routing_key.bytes);
	free(p);
}

/* Confirms of seq (or all up to it): a confirmed publish that was not
 * returned moves its message (acknowledged in the source); any other stays. */
static int replay_settle(struct replay_run *r, uint64_t seq, int multiple, int ok)
{
	struct replay_out **pp = &r->out, *p;
	int rc = 0;

	while ((p = *pp) != NULL && p->seq <= seq) {
		if (p->seq != seq && !multiple) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		if (p->next == NULL)
			r->out_tail = pp;
		r->nout--;
		if (ok && !p->returned) {
			if (amqp_basic_ack(r->c.amqp, ENGINE_CONN_CONSUME, p->tag, 0) !=
			    AMQP_STATUS_OK)
				rc = replay_fail(r, "acknowledging a message moved failed");
			else {
				pthread_mutex_lock(&replay_lock);
				r->j->moved++;
				pthread_mutex_unlock(&replay_lock);
			}
		} else {
			replay_skip(r->j, ok ? REPLAY_returned : REPLAY_nacked);
		}
		replay_out_free(p);
	}
	return rc;
}

static int replay_same(amqp_bytes_t a, amqp_bytes_t b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.bytes, b.bytes, a.len) == 0);
}

/* A basic.return: the oldest publish out to the same exchange and routing
 * key that was not returned yet (returns come before their confirms, in
 * order). */
static int replay_returned(struct replay_run *r, amqp_frame_t *f)
{
	amqp_basic_return_t *ret = f->payload.method.decoded;
	amqp_bytes_t ex = ret->exchange, rk = ret->routing_key;
	struct replay_out *p;
	amqp_message_t msg;
	amqp_rpc_reply_t rep;

	for (p = r->out; p; p = p->next)
		if (!p->returned && replay_same(p->exchange, ex) &&
		    replay_same(p->routing_key, rk))
			break;
	if (p)
		p->returned = 1;
	/* Matched before the content is read: reading it may recycle the
	 * channel's pool, where the method's names are. */
	rep = amqp_read_message(r->c.amqp, f->channel, &msg, 0);
	if (rep.reply_type != AMQP_RESPONSE_NORMAL)
		return replay_fail_reply(r, rep, "reading a returned message");
	amqp_destroy_message(&msg);
	return 0;
}

static int replay_dispatch(struct replay_run *r, amqp_frame_t *f)
{
	if (f->frame_type != AMQP_FRAME_METHOD)
		return 0;
	switch (f->payload.method.id) {
	case AMQP_BASIC_RETURN_METHOD:
		return replay_returned(r, f);
	case AMQP_BASIC_ACK_METHOD: {
		amqp_basic_ack_t *a = f->payload.method.decoded;

		return replay_settle(r, a->delivery_tag, a->multiple, 1);
	}
	case AMQP_BASIC_NACK_METHOD: {
		amqp_basic_nack_t *n = f->payload.method.decoded;

		return replay_settle(r, n->delivery_tag, n->multiple, 0);
	}
	case AMQP_CHANNEL_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD: {
		amqp_channel_close_t *c = f->payload.method.decoded;

		return replay_fail(r, "%s closed by the broker: %u %.*s",
				   f->channel ? "a channel" : "the connection", c->reply_code,
				   (int)c->reply_text.len, (const char *)c->reply_text.bytes);
	}
	default:
		return 0;
	}
}

/* Handle what the broker sent; wait at most timeout_ms for something. */
static int replay_pump(struct replay_run *r, int timeout_ms)
{
	amqp_connection_state_t a = r->c.amqp;
	struct timeval zero = {0, 0};
	struct pollfd pf;
	amqp_frame_t f;
	int rc;

	if (!amqp_frames_enqueued(a) && !amqp_data_in_buffer(a)) {
		pf.fd = amqp_get_sockfd(a);
		pf.events = POLLIN;
		pf.revents = 0;
		if (poll(&pf, 1, timeout_ms) < 0 && errno != EINTR)
			return replay_fail(r, "poll: %s", strerror(errno));
	}
	for (;;) {
		/* A zero wait reads what is there and sends a heartbeat when
		 * one is due. */
		rc = amqp_simple_wait_frame_noblock(a, &f, &zero);
		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK)
			return replay_fail(r, "connection lost: %s", amqp_error_string2(rc));
		if (replay_dispatch(r, &f) != 0)
			return -1;
		amqp_maybe_release_buffers(a);
	}
	return 0;
}

/* ---- one message ---------------------------------------------------------------------- */

static int replay_is_string(const amqp_field_value_t *v)
{
	return v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES;
}

static const amqp_field_value_t *replay_field(const amqp_table_t *t, const char *key)
{
	size_t len = strlen(key);
	int i;

	for (i = 0; i < t->num_entries; i++)
		if (t->entries[i].key.len == len &&
		    memcmp(t->entries[i].key.bytes, key, len) == 0)
			return &t->entries[i].value;
	return NULL;
}

/* The exchange and first routing key of the first (latest) x-death
 * entry: 0, or -1 when there is none. */
static int replay_x_death(const amqp_message_t *msg, amqp_bytes_t *ex, amqp_bytes_t *rk)
{
	const amqp_field_value_t *xd, *e, *rks;
	const amqp_table_t *first;

	if (!(msg->properties._flags & AMQP_BASIC_HEADERS_FLAG))
		return -1;
	xd = replay_field(&msg->properties.headers, "x-death");
	if (xd == NULL || xd->kind != AMQP_FIELD_KIND_ARRAY ||
	    xd->value.array.num_entries < 1 ||
	    xd->value.array.entries[0].kind != AMQP_FIELD_KIND_TABLE)
		return -1;
	first = &xd->value.array.entries[0].value.table;
	e = replay_field(first, "exchange");
	rks = replay_field(first, "routing-keys");
	if (e == NULL || !replay_is_string(e) || rks == NULL ||
	    rks->kind != AMQP_FIELD_KIND_ARRAY || rks->value.array.num_entries < 1 ||
	    !replay_is_string(&rks->value.array.entries[0]))
		return -1;
	*ex = e->value.bytes;
	*rk = rks->value.array.entries[0].value.bytes;
	return 0;
}

/* Whether an exchange exists, asked once per replay for each name (the
 * broker would close the publish channel for one that does not): 1, 0, -1. */
static int replay_exchange_exists(struct replay_run *r, amqp_bytes_t name)
{
	int i, rc;

	if (name.len == 0)
		return 1; /* the default exchange */
	for (i = 0; i < r->nex; i++)
		if (strlen(r->ex[i].name) == name.len &&
		    memcmp(r->ex[i].name, name.bytes, name.len) == 0)
			return r->ex[i].exists;
	rc = engine_conn_exchange_exists(&r->c, name);
	if (rc < 0)
		return replay_fail(r, "checking an exchange failed");
	if (r->nex < REPLAY_EXCHANGES && memchr(name.bytes, '\0', name.len) == NULL &&
	    (r->ex[r->nex].name = malloc(name.len + 1)) != NULL) {
		memcpy(r->ex[r->nex].name, name.bytes, name.len);
		r->ex[r->nex].name[name.len] = '\0';
		r->ex[r->nex++].exists = rc;
	}
	return rc;
}

/* A claim check's payload must still be there: the reference alone moves. */
static enum replay_reason replay_claim(struct replay_run *r, const amqp_message_t *msg)
{
	const struct replay_spec *s = &r->j->spec;
	const uint8_t *b = msg->body.bytes;
	char key[CLAIMS_KEY_LEN + 1];
	uint64_t size, created;
	struct replay_missing *m;
	int rc;

	/* A vhost without the rule has no store to ask: its bodies are
	 * ordinary, as on delivery. */
	if (!s->claim_check || msg->body.len < 3 || b[0] != 0xAC || b[1] != 0x01 ||
	    b[2] != 0x01)
		return REPLAY_MOVE;
	if (!claims_key_valid(b + 3, msg->body.len - 3))
		return REPLAY_bad_key;
	memcpy(key, b + 3, CLAIMS_KEY_LEN);
	key[CLAIMS_KEY_LEN] = '\0';
	rc = claims_stat(&s->where, key, &size, &created);
	if (rc == 0)
		return REPLAY_MOVE;
	if (rc != 1)
		return REPLAY_store_error;
	pthread_mutex_lock(&replay_lock);
	if (r->j->nmissing < REPLAY_MAX_MISSING) {
		m = &r->j->missing[r->j->nmissing++];
		memcpy(m->key, key, sizeof(m->key));
		m->has_id = (msg->properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0;
		m->id_len = 0;
		if (m->has_id) {
			m->id_len = msg->properties.message_id.len < REPLAY_MESSAGE_ID
					? msg->properties.message_id.len
					: REPLAY_MESSAGE_ID;
			if (m->id_len)
				memcpy(m->message_id, msg->properties.message_id.bytes,
				       m->id_len);
		}
	}
	pthread_mutex_unlock(&replay_lock);
	log_info("replay %ld: vhost %s: %s: the payload of claim check %s is gone; left "
		 "there",
		 r->j->id, s->vhost, s->queue, key);
	return REPLAY_payload_missing;
}

static int replay_copy(amqp_bytes_t *dst, amqp_bytes_t src)
{
	dst->len = src.len;
	dst->bytes = malloc(src.len ? src.len : 1);
	if (dst->bytes == NULL)
		return -1;
	if (src.len)
		memcpy(dst->bytes, src.bytes, src.len);
	return 0;
}

static int replay_publish(struct replay_run *r, uint64_t tag, amqp_bytes_t ex, amqp_bytes_t rk,
			  const amqp_message_t *msg)
{
	struct replay_out *p = calloc(1, sizeof(*p));

	if (p == NULL || replay_copy(&p->exchange, ex) != 0 ||
	    replay_copy(&p->routing_key, rk) != 0) {
		if (p)
			replay_out_free(p);
		return replay_fail(r, "out of memory");
	}
	/* As it was, x-death and all; mandatory. */
	if (amqp_basic_publish(r->c.amqp, ENGINE_CONN_PUBLISH, ex, rk, 1, 0, &msg->properties,
			       msg->body) != AMQP_STATUS_OK) {
		replay_out_free(p);
		return replay_fail(r, "publishing failed");
	}
	p->seq = ++r->next_seq;
	p->tag = tag;
	*r->out_tail = p;
	r->out_tail = &p->next;
	r->nout++;
	return 0;
}

/* Take one message and send it on, or leave it: 0, 1 the queue is empty,
 * -1 the replay cannot go on. */
static int replay_one(struct replay_run *r)
{
	const struct replay_spec *s = &r->j->spec;
	amqp_connection_state_t a = r->c.amqp;
	enum replay_reason why = REPLAY_MOVE;
	amqp_bytes_t ex, rk;
	amqp_message_t msg;
	amqp_rpc_reply_t rep;
	uint64_t tag;
	int rc = 0;

	rep = amqp_basic_get(a, ENGINE_CONN_CONSUME, amqp_cstring_bytes(s->queue), 0);
	if (rep.reply_type != AMQP_RESPONSE_NORMAL)
		return replay_fail_reply(r, rep, "basic.get");
	if (rep.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
		return 1;
	tag = ((amqp_basic_get_ok_t *)rep.reply.decoded)->delivery_tag;
	rep = amqp_read_message(a, ENGINE_CONN_CONSUME, &msg, 0);
	if (rep.reply_type != AMQP_RESPONSE_NORMAL)
		return replay_fail_reply(r, rep, "reading a message");
	pthread_mutex_lock(&replay_lock);
	r->j->taken++;
	pthread_mutex_unlock(&replay_lock);
	if (s->has_target) {
		ex = amqp_cstring_bytes(s->exchange);
		rk = amqp_cstring_bytes(s->routing_key);
	} else if (replay_x_death(&msg, &ex, &rk) != 0) {
		why = REPLAY_no_x_death;
	}
	if (why == REPLAY_MOVE && !s->has_target) {
		rc = replay_exchange_exists(r, ex);
		if (rc == 0)
			why = REPLAY_no_exchange;
	}
	if (rc >= 0 && why == REPLAY_MOVE)
		why = replay_claim(r, &msg);
	if (rc >= 0 && why == REPLAY_MOVE)
		rc = replay_publish(r, tag, ex, rk, &msg);
	else if (rc >= 0)
		replay_skip(r->j, why); /* unacknowledged: back to the source at the end */
	amqp_destroy_message(&msg);
	return rc < 0 ? -1 : 0;
}

/* ---- the replay's life ---------------------------------------------------------------- */

static void replay_set_start(struct replay *j, enum replay_state st, int status,
			     const char *why)
{
	pthread_mutex_lock(&replay_lock);
	j->state = st;
	j->start_status = status;
	j->start_why = why;
	pthread_cond_broadcast(&replay_cond);
	pthread_mutex_unlock(&replay_lock);
}

/* Connect, find the queue (and the target given): the status its start gets. */
static int replay_begin(struct replay_run *r, const char **why)
{
	struct replay *j = r->j;
	amqp_queue_declare_ok_t *ok;
	amqp_rpc_reply_t rep;
	int rc;

	engine_conn_init(&r->c, j->spec.vhost);
	r->c.down_logged = 1; /* a replay says what failed itself */
	rc = engine_conn_open(&r->c, &j->spec.upstream);
	if (rc != 0) {
		if (r->c.refused == 530) {
			*why = "the broker has no such vhost, or engine_user may not use it";
			return 404;
		}
		*why = "no broker answered for the vhost";
		return 503;
	}
	ok = amqp_queue_declare(r->c.amqp, ENGINE_CONN_RPC, amqp_cstring_bytes(j->spec.queue),
				1, 0, 0, 0, amqp_empty_table);
	if (ok == NULL) {
		rep = amqp_get_rpc_reply(r->c.amqp);
		rc = (int)replay_close_code(rep);
		*why = rc == 404   ? "no such queue"
		       : rc == 405 ? "the queue is another connection's (exclusive)"
		       : rc == 403 ? "engine_user may not use the queue"
				   : "the broker did not answer about the queue";
		return rc == 404 ? 404 : rc == 405 || rc == 403 ? 409 : 503;
	}
	pthread_mutex_lock(&replay_lock);
	j->queued = (long)ok->message_count;
	pthread_mutex_unlock(&replay_lock);
	/* The default exchange cannot be declared, even passively: always there. */
	if (j->spec.has_target && j->spec.exchange[0] != '\0') {
		rc = engine_conn_exchange_exists(&r->c, amqp_cstring_bytes(j->spec.exchange));
		if (rc <= 0) {
			*why = rc == 0 ? "no such exchange"
				       : "the broker did not answer about "
					 "the exchange";
			return rc == 0 ? 404 : 503;
		}
	}
	return 202;
}

void *replay_main(void *arg)
{
	struct replay_run run;
	struct replay *j = arg;
	const char *why = NULL;
	uint64_t t0, now, due, deadline;
	int status, empty = 0, failed = 0, cancelled, rc;
	long wait;

	memset(&run, 0, sizeof(run));
	run.j = j;
	run.out_tail = &run.out;
	status = replay_begin(&run, &why);
	if (status != 202) {
		log_info("replay %ld: vhost %s: %s: not started: %s", j->id, j->spec.vhost,
			 j->spec.queue, why);
		engine_conn_close(&run.c, 0);
		pthread_mutex_lock(&replay_lock);
		j->ended_ms = state_now_ms();
		pthread_mutex_unlock(&replay_lock);
		replay_set_start(j, REPLAY_FAILED, status, why);
		return NULL;
	}
	log_info("replay %ld: vhost %s: %s: %ld waiting; taking up to %ld at %ld/s", j->id,
		 j->spec.vhost, j->spec.queue, j->queued, j->spec.count, j->spec.rate);
	replay_set_start(j, REPLAY_RUNNING, 202, NULL);
	t0 = replay_clock_ms();
	for (;;) {
		if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
			break;
		pthread_mutex_lock(&replay_lock);
		rc = j->taken >= (uint64_t)j->spec.count;
		due = t0 + j->taken * 1000 / (uint64_t)j->spec.rate;
		pthread_mutex_unlock(&replay_lock);
		if (rc)
			break;
		now = replay_clock_ms();
		if (now < due || run.nout >= REPLAY_WINDOW) {
			wait = now < due ? (long)(due - now) : REPLAY_TICK_MS;
			if (replay_pump(&run, wait > REPLAY_TICK_MS ? REPLAY_TICK_MS
								    : (int)wait) != 0) {
				failed = 1;
				break;
			}
			continue;
		}
		rc = replay_one(&run);
		if (rc == 0)
			rc = replay_pump(&run, 0);
		if (rc > 0)
			empty = 1;
		if (rc != 0) {
			failed = rc < 0;
			break;
		}
	}
	/* What is out settles (or not) before the connection goes. */
	deadline = replay_clock_ms() + REPLAY_DRAIN_MS;
	while (!failed && run.nout > 0 && replay_clock_ms() < deadline)
		if (replay_pump(&run, REPLAY_TICK_MS) != 0)
			failed = 1;
	while (run.out) {
		struct replay_out *p = run.out;

		run.out = p->next;
		replay_skip(j, REPLAY_unsettled);
		replay_out_free(p);
	}
	/* Closing gives back everything not acknowledged. */
	engine_conn_close(&run.c, failed);
	while (run.nex > 0)
		free(run.ex[--run.nex].name);
	cancelled = __atomic_load_n(&j->cancel, __ATOMIC_RELAXED);
	pthread_mutex_lock(&replay_lock);
	j->empty = empty;
	j->ended_ms = state_now_ms();
	j->state = failed ? REPLAY_FAILED : cancelled ? REPLAY_CANCELLED : REPLAY_DONE;
	log_info("replay %ld: vhost %s: %s: %s: %llu taken, %llu moved%s%s", j->id,
		 j->spec.vhost, j->spec.queue, replay_state_names[j->state],
		 (unsigned long long)j->taken, (unsigned long long)j->moved, failed ? ": " : "",
		 failed ? j->error : "");
	pthread_cond_broadcast(&replay_cond);
	pthread_mutex_unlock(&replay_lock);
	return NULL;
}
