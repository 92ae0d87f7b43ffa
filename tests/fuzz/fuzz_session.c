/* fuzz_session: a whole session driven in-process by a script of events:
 * client bytes, broker bytes, the broker connect completing or failing,
 * either peer closing or resetting, timers and read timeouts firing, rules
 * reloads. Both legs are socketpairs run by a real worker's event loop with
 * the real session, channel, pipeline and transport code, the reply_to,
 * claim_check (a filesystem store; store jobs run inline and complete
 * later on the loop), idempotency, dedup_publish and schedule patterns
 * (keys, windows and delayed records in a state layer of their own; the
 * confirms of delayed publishes held for their records) and the test hook
 * attached. A scripted broker answers the
 * handshake so inputs reach OPEN and the pipeline quickly.
 *
 * Invariants checked beyond ASan/UBSan: once both peers have gone and the
 * timers have fired, the session is gone (no hang, no leak of a session),
 * the worker is left with no sessions, and the connection the listener
 * would have counted in is counted out. Replayed as the seed corpus (make
 * check), each seed must also still reach what it was made for
 * (fuzz_session_reach.c). */
#include "amqp/content.h"
#include "amqp/frame_scan.h"
#include "amqp/method.h"
#include "fuzz_session_frames.h"
#include "fuzz_session_reach.h"
#include "src/control.h"
#include "src/hooks.h"
#include "src/jobs.h"
#include "src/limits.h"
#include "src/log.h"
#include "src/patterns/dedup_publish.h"
#include "src/patterns/idempotency.h"
#include "src/pool.h"
#include "src/ratelimit.h"
#include "src/rules.h"
#include "src/session.h"
#include "src/store/delayed.h"
#include "src/store/idem.h"
#include "src/store/state.h"
#include "src/surplus.h"
#include "src/transport.h"
#include "src/upstream.h"
#include "src/worker.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The script's operations; an input is a sequence of them. */
enum fuzz_op {
	OP_CLIENT_RAW,   /* n, bytes: raw bytes from the client */
	OP_BROKER_RAW,   /* n, bytes: raw bytes from the broker */
	OP_CONNECT_OK,   /* the broker leg's connect completes */
	OP_CONNECT_FAIL, /* it fails (connection refused) */
	OP_TIMER,        /* the session's timer fires */
	OP_CLIENT_CLOSE, /* the client closes its socket */
	OP_CLIENT_SHUT,  /* the client half-closes (shutdown write) */
	OP_BROKER_CLOSE, /* the broker closes its socket */
	OP_RELOAD, /* p: a rules reload (every pattern, none, brokers of "/"'s own, pooled),
		    * or from 0xc0 an operator's action (control.c) */
	OP_CLIENT_SILENT,  /* the client leg's read timeout fires */
	OP_BROKER_SILENT,  /* the broker leg's read timeout fires */
	OP_CLIENT_FRAME,   /* k, p: a well-formed client frame */
	OP_BROKER_FRAME,   /* k, p: a well-formed broker frame */
	OP_AUTO_BROKER,    /* the scripted broker answers (toggle) */
	OP_CLIENT_READING, /* the client stops or resumes reading (toggle) */
	OP_SHUTDOWN,       /* the worker closes the session (drain deadline) */
	OP_BROKER_ERROR,   /* the broker leg's socket fails (ECONNRESET) */
	OP_COUNT
};

struct fuzz {
	int ready;
	struct worker w;
	struct rules *rules[4];
	int client_fd, broker_fd; /* the peers' ends */
	int connect_refuse;       /* the next connect fails at once */
	int auto_broker, client_reading;
	int pool_connecting; /* fuzz_connect called for a pool */
	uint64_t sid;
	struct evbuffer *from_proxy; /* what the broker end has read */
	uint64_t confirm_seq[8];     /* per channel (mod 8): publishes seen */
	uint8_t confirm_on[8];
	struct state *st; /* the patterns' keys, windows and delayed records */
};

static struct fuzz fz;

static void fuzz_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static struct transport *fuzz_connect(struct event_base *base, const struct sockaddr *sa,
				      int salen)
{
	int sv[2];
	struct transport *t;

	if (fz.connect_refuse) {
		errno = ECONNREFUSED;
		return NULL;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return NULL;
	/* A pool's broker connection connects by itself (the script's
	 * connect ops are the session's). */
	t = fz.pool_connecting ? transport_connecting_fd(base, sv[0])
			       : transport_pending(base, sv[0]);
	if (t == NULL) {
		close(sv[0]);
		close(sv[1]);
		return NULL;
	}
	if (fz.broker_fd >= 0)
		close(fz.broker_fd);
	fz.broker_fd = sv[1];
	fuzz_nonblock(sv[1]);
	return t;
}

static struct transport *fuzz_pool_connect(struct event_base *base, const struct sockaddr *sa,
					   int salen)
{
	struct transport *t;

	fz.pool_connecting = 1;
	t = fuzz_connect(base, sa, salen);
	fz.pool_connecting = 0;
	return t;
}

static char fuzz_claims[64];

static char *fuzz_rules_dir(const char *json)
{
	char tmpl[] = "/tmp/fuzz-session-rules-XXXXXX", path[4200];
	char *dir = mkdtemp(tmpl);
	FILE *f;

	if (dir == NULL)
		abort();
	dir = strdup(dir);
	if (json) {
		snprintf(path, sizeof(path), "%s/r.json", dir);
		f = fopen(path, "w");
		if (f == NULL)
			abort();
		fputs(json, f);
		fclose(f);
	}
	return dir;
}

static struct rules *fuzz_rules(const char *json)
{
	char *dir = fuzz_rules_dir(json), path[4200];
	int nerr = 0;
	struct rules *r = rules_load(dir, stderr, &nerr);

	if (r == NULL)
		abort();
	snprintf(path, sizeof(path), "%s/r.json", dir);
	unlink(path);
	rmdir(dir);
	free(dir);
	return r;
}

static void fuzz_init(void)
{
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(5672)};

	signal(SIGPIPE, SIG_IGN);
	/* The state writer posts to the worker from its thread, as in the
	 * daemon. */
	evthread_use_pthreads();
	log_threshold = getenv("FUZZ_SESSION_LOG") ? LOG_DEBUG : LOG_ERROR;
	setenv("ACEMQ_PROXY_TEST_HOOK", "1", 1);
	hooks_register();
	/* Two broker addresses: a failed connect fails over to the next. */
	in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	upstream_add_sockaddr((struct sockaddr *)&in, sizeof(in), "fuzz-broker-a");
	upstream_add_sockaddr((struct sockaddr *)&in, sizeof(in), "fuzz-broker-b");
	upstream_set_retry_ms(0);
	worker_settings.connect_timeout_ms = 60000;
	worker_settings.handshake_timeout_ms = 60000;
	worker_settings.drain_timeout_ms = 1000;
	worker_settings.buffer_limit = 65536;
	worker_settings.max_frame_pre_tune = 131072;
	worker_settings.max_message_size = 1 << 20;
	worker_settings.connect = fuzz_connect;
	pool_connect = fuzz_pool_connect;
	if (worker_init(&fz.w, 0) != 0)
		abort();
	/* A claim store with one payload in it, for references to find. */
	snprintf(fuzz_claims, sizeof(fuzz_claims), "/tmp/fuzz-session-claims-XXXXXX");
	if (mkdtemp(fuzz_claims) == NULL || jobs_start(0) != 0)
		abort();
	{
		char path[128], json[1024], err[256];
		struct state_settings set = {NULL, 64 << 20, 0};
		struct state *st;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", fuzz_claims, FUZZ_CLAIM_KEY);
		f = fopen(path, "w");
		if (f == NULL)
			abort();
		fputs("the payload of a claim check", f);
		fclose(f);
		snprintf(
		    json, sizeof(json),
		    "{\"vhost\": \"/\", \"reply_to\": {\"enabled\": true}, "
		    "\"claim_check\": {\"match\": [{\"exchange\": \"*\"}], \"threshold\": "
		    "1000, \"on_missing\": \"dead-letter\", "
		    "\"store\": {\"type\": \"filesystem\", \"path\": \"%s\"}}, "
		    "\"schedule\": {\"match\": [{\"exchange\": \"\"}], \"engine\": false}, "
		    "\"idempotency\": [{\"queue\": \"q\", \"key\": \"message-id\", "
		    "\"lease_s\": 30, \"retention_s\": 60, \"in_progress_delay_s\": 0, "
		    "\"prefetch_ahead\": 5}], "
		    "\"dedup_publish\": {\"match\": [{\"exchange\": \"\"}], "
		    "\"window_s\": 60}, "
		    "\"limits\": {\"publish_bytes_per_s\": 4096}}",
		    fuzz_claims);
		fz.rules[0] = fuzz_rules(json);
		/* Idempotency keys in a state layer of their own (its writer is
		 * a thread: completions arrive on the loop when they do). */
		snprintf(path, sizeof(path), "%s/state", fuzz_claims);
		set.dir = path;
		st = state_open(&set, err, sizeof(err));
		if (st == NULL)
			abort();
		fz.st = st;
		idempotency_init(st);
		dedup_publish_init(st);
		/* Delayed publishes recorded there too (and looked ahead at). */
		delayed_init(st, 86400000);
	}
	fz.rules[1] = fuzz_rules(NULL);
	/* Brokers of the vhost's own: the proxy greets clients itself. */
	fz.rules[2] =
	    fuzz_rules("{\"vhost\": \"/\", \"reply_to\": {\"enabled\": true}, "
		       "\"upstream\": [\"127.0.0.1:5672\", \"127.0.0.1:5673\"], "
		       "\"limits\": {\"connections_per_s\": 1000000, \"publish_bytes_per_s\": "
		       "1000, \"mode\": \"alarm\"}}");
	/* Pooled: the session's broker leg is a pipe to a pool whose broker
	 * connection is the scripted broker. */
	fz.rules[3] = fuzz_rules("{\"vhost\": \"/\", \"reply_to\": {\"enabled\": true}, "
				 "\"pool\": {\"max_connections\": 1, \"idle_s\": 0}}");
	worker_set_rules(&fz.w, fz.rules[0]); /* in force from the first loop turn */
	fz.from_proxy = evbuffer_new();
	fz.ready = 1;
}

/* The session under test while it lives (the worker's list holds it
 * until it is freed; a gone one is not looked at). */
static struct session *fuzz_session(void)
{
	struct session *s;

	list_for_each_entry (s, &fz.w.sessions, link)
		if (s->id == fz.sid)
			return s->state == SESSION_GONE ? NULL : s;
	return NULL;
}

static void fuzz_write(int fd, struct evbuffer *b)
{
	size_t n = evbuffer_get_length(b);
	const uint8_t *p = evbuffer_pullup(b, -1);

	if (fd >= 0 && n)
		(void)!write(fd, p, n); /* a full socket drops the rest */
	evbuffer_drain(b, n);
}

static void fuzz_write_bytes(int fd, const uint8_t *p, size_t n)
{
	if (fd >= 0 && n)
		(void)!write(fd, p, n);
}

static void fuzz_broker_answer(void)
{
	struct evbuffer *out = evbuffer_new();
	amqp_pool_t pool;
	struct frame_info fi;
	uint8_t hdr[8];

	init_amqp_pool(&pool, 4096);
	for (;;) {
		size_t have = evbuffer_get_length(fz.from_proxy);

		if (have >= 8) {
			evbuffer_copyout(fz.from_proxy, hdr, 8);
			if (memcmp(hdr, "AMQP", 4) == 0) {
				evbuffer_drain(fz.from_proxy, 8);
				fuzz_broker_frame(out, 0, 0);
				continue;
			}
		}
		if (frame_scan_evbuffer(fz.from_proxy, 0, 1u << 20, &fi) != FRAME_SCAN_OK) {
			if (have > (1u << 20))
				evbuffer_drain(fz.from_proxy, have); /* lost sync */
			break;
		}
		if (fi.type == FRAME_METHOD) {
			amqp_method_number_t id = METHOD_ID(fi.class_id, fi.method_id);
			uint16_t ch = fi.channel;
			uint8_t k = 0xff, p = (uint8_t)((ch + 2) % 3);

			switch (id) {
			case AMQP_CONNECTION_START_OK_METHOD:
				k = 1;
				break;
			case AMQP_CONNECTION_OPEN_METHOD:
				k = 2;
				break;
			case AMQP_CHANNEL_OPEN_METHOD:
				k = 3;
				break;
			case AMQP_CONFIRM_SELECT_METHOD:
				fz.confirm_on[ch % 8] = 1;
				k = 4;
				break;
			case AMQP_BASIC_CONSUME_METHOD:
				k = 10;
				break;
			case AMQP_BASIC_QOS_METHOD:
				k = 15;
				p = (uint8_t)(0x81 + p);
				break;
			case AMQP_CONNECTION_CLOSE_METHOD:
				k = 13;
				break;
			case AMQP_CHANNEL_CLOSE_METHOD:
				fz.confirm_on[ch % 8] = 0;
				fz.confirm_seq[ch % 8] = 0;
				k = 14;
				break;
			case AMQP_BASIC_PUBLISH_METHOD:
				if (fz.confirm_on[ch % 8])
					method_write_basic_ack(out, ch,
							       ++fz.confirm_seq[ch % 8], 0);
				break;
			default:
				break;
			}
			if (k != 0xff)
				fuzz_broker_frame(out, k, p);
		}
		evbuffer_drain(fz.from_proxy, frame_scan_wire_len(&fi));
	}
	empty_amqp_pool(&pool);
	fuzz_write(fz.broker_fd, out);
	evbuffer_free(out);
}

/* Read what the proxy wrote to each peer. */
static void fuzz_peers_read(void)
{
	uint8_t buf[65536];
	ssize_t n;

	while (fz.client_reading && fz.client_fd >= 0 &&
	       (n = read(fz.client_fd, buf, sizeof(buf))) > 0)
		;
	while (fz.broker_fd >= 0 && (n = read(fz.broker_fd, buf, sizeof(buf))) > 0)
		if (fz.auto_broker)
			evbuffer_add(fz.from_proxy, buf, (size_t)n);
	if (fz.auto_broker)
		fuzz_broker_answer();
	else
		evbuffer_drain(fz.from_proxy, evbuffer_get_length(fz.from_proxy));
}

static void fuzz_run(void)
{
	int i;

	for (i = 0; i < 6; i++) {
		/* The state writer's completions are on the loop before it
		 * runs: a script means the same on every run. */
		state_test_settle(fz.st);
		event_base_loop(fz.w.base, EVLOOP_NONBLOCK);
		fuzz_peers_read();
	}
}

static void fuzz_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void fuzz_age(void *arg, void *msg, uint64_t broker_tag)
{
	struct pipe_msg *m = msg;

	(void)arg;
	(void)broker_tag;
	m->started_us = m->renewed_us = 0;
}

static void fuzz_op(const uint8_t *d, size_t len, size_t *at)
{
	uint8_t op = d[(*at)++] % OP_COUNT, a = 0, b = 0;
	struct session *s = fuzz_session();
	size_t n;

	if (*at < len)
		a = d[*at];
	if (*at + 1 < len)
		b = d[*at + 1];
	switch (op) {
	case OP_CLIENT_RAW:
	case OP_BROKER_RAW:
		(*at)++;
		n = a < len - *at ? a : len - *at;
		fuzz_write_bytes(op == OP_CLIENT_RAW ? fz.client_fd : fz.broker_fd, d + *at, n);
		*at += n;
		break;
	case OP_CONNECT_OK:
	case OP_CONNECT_FAIL:
		if (s && s->upstream.tr && transport_connecting(s->upstream.tr))
			transport_connect_done(s->upstream.tr,
					       op == OP_CONNECT_OK ? 0 : ECONNREFUSED);
		fz.connect_refuse = op == OP_CONNECT_FAIL && !s;
		break;
	case OP_TIMER:
		/* The look at kept deliveries, when any are kept (they have
		 * waited long: their claims are renewed); else the session's. */
		if (s && s->pipe.surplus_timer &&
		    evtimer_pending(s->pipe.surplus_timer, NULL)) {
			struct list *k;

			for (k = s->pipe.surplus_kept.next; k != &s->pipe.surplus_kept;
			     k = k->next)
				surplus_each(list_entry(k, struct surplus, kept), fuzz_age,
					     NULL);
			event_active(s->pipe.surplus_timer, EV_TIMEOUT, 1);
		} else if (s) {
			event_active(s->timer, EV_TIMEOUT, 1);
		}
		break;
	case OP_CLIENT_CLOSE:
		fuzz_close(&fz.client_fd);
		break;
	case OP_CLIENT_SHUT:
		if (fz.client_fd >= 0)
			shutdown(fz.client_fd, SHUT_WR);
		break;
	case OP_BROKER_CLOSE:
		fuzz_close(&fz.broker_fd);
		break;
	case OP_RELOAD:
		(*at)++;
		if (a < 0xc0) {
			worker_set_rules(&fz.w, fz.rules[a % 4]);
		} else {
			/* An operator's action: close, drain, pause, resume. */
			struct control_target t = {0, NULL, -1};

			if (a & 4)
				t.vhost = "/";
			control_apply(&fz.w, &t, (enum control_action)(a & 3),
				      (a & 8) ? "fuzzed" : NULL);
		}
		break;
	case OP_CLIENT_SILENT:
		if (s && s->client.tr)
			transport_inject(s->client.tr, TRANSPORT_TIMEOUT, 0);
		break;
	case OP_BROKER_SILENT:
		if (s && s->upstream.tr)
			transport_inject(s->upstream.tr, TRANSPORT_TIMEOUT, 0);
		break;
	case OP_BROKER_ERROR:
		if (s && s->upstream.tr)
			transport_inject(s->upstream.tr, TRANSPORT_ERROR, ECONNRESET);
		break;
	case OP_CLIENT_FRAME:
	case OP_BROKER_FRAME: {
		struct evbuffer *out = evbuffer_new();

		*at += 2;
		if (op == OP_CLIENT_FRAME)
			fuzz_client_frame(out, a, b);
		else
			fuzz_broker_frame(out, a, b);
		fuzz_write(op == OP_CLIENT_FRAME ? fz.client_fd : fz.broker_fd, out);
		evbuffer_free(out);
		break;
	}
	case OP_AUTO_BROKER:
		fz.auto_broker = !fz.auto_broker;
		break;
	case OP_CLIENT_READING:
		fz.client_reading = !fz.client_reading;
		break;
	case OP_SHUTDOWN:
		if (s)
			session_close(s, 320, "CONNECTION_FORCED - proxy shutting down");
		break;
	}
	fuzz_run();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
	struct pool_gauges pg;
	int sv[2], i;
	size_t at = 0;
	struct stats before;

	if (!fz.ready)
		fuzz_init();
	/* An input means the same alone and amid a run: every pattern on,
	 * whatever the one before reloaded to, no key, value or delayed
	 * record left by it, and the vhost's byte rate not spent by it. */
	if (fz.w.rules != fz.rules[0])
		worker_set_rules(&fz.w, fz.rules[0]);
	idem_purge(fz.st, "/", UINT64_MAX);
	idem_dedup_purge(fz.st, "/", UINT64_MAX);
	delayed_purge("/", INT64_MAX);
	ratelimit_test_refill();
	state_test_settle(fz.st);
	event_base_loop(fz.w.base, EVLOOP_NONBLOCK);
	before = fz.w.stats; /* what grows from here is this input's */
	fuzz_session_reach_ran(&before, &before);
	fz.broker_fd = -1;
	fz.connect_refuse = 0;
	fz.auto_broker = 1;
	fz.client_reading = 1;
	memset(fz.confirm_seq, 0, sizeof(fz.confirm_seq));
	memset(fz.confirm_on, 0, sizeof(fz.confirm_on));
	fuzz_frames_reset();
	evbuffer_drain(fz.from_proxy, evbuffer_get_length(fz.from_proxy));
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return 0;
	fz.client_fd = sv[1];
	fuzz_nonblock(sv[1]);
	peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Counted in as the listener does; counted out when the session ends. */
	if (limits_connection_enter(1) != 0)
		abort();
	if (session_new(&fz.w, sv[0], (struct sockaddr *)&peer, sizeof(peer), 0) == NULL) {
		limits_connection_leave();
		close(sv[1]);
		return 0;
	}
	fz.sid = list_first_entry(&fz.w.sessions, struct session, link)->id;
	fuzz_run();
	while (at < size)
		fuzz_op(data, size, &at);

	/* Both peers go away; whatever state the session is in, it must end
	 * once its timers have run. */
	fuzz_close(&fz.client_fd);
	fuzz_close(&fz.broker_fd);
	fuzz_run();
	for (i = 0; i < 4 && (fuzz_session() || (pool_gauges(&pg), pg.connections)); i++) {
		struct session *s = fuzz_session();

		if (s && s->upstream.tr && transport_connecting(s->upstream.tr))
			transport_connect_done(s->upstream.tr, ECONNREFUSED);
		else if (s)
			event_active(s->timer, EV_TIMEOUT, 1);
		/* A pool's connection that lost its broker before it spoke
		 * tries the next address: that broker goes too. */
		fuzz_close(&fz.broker_fd);
		fuzz_run();
	}
	fuzz_session_reach_ran(&before, &fz.w.stats);
	pool_gauges(&pg);
	if (fuzz_session() != NULL || fz.w.nsessions != 0 || limits_connections_open() != 0 ||
	    pg.connections != 0 || pg.waiting != 0) {
		fprintf(
		    stderr,
		    "fuzz_session: the session outlived both peers (state %d), or its pool's "
		    "connections (%lu) or waiting clients (%lu) did\n",
		    fuzz_session() ? (int)fuzz_session()->state : -1, pg.connections,
		    pg.waiting);
		abort();
	}
	return 0;
}
