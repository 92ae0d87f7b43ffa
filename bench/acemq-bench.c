/* acemq-bench: AMQP 0-9-1 load generator; throughput, latency, a process's CPU and memory. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_PIDS 16
#define BENCH_MAX_IDLE 100000
#define BENCH_NS       1000000000ULL
/* After the timed window: how long publishers wait for outstanding confirms. */
#define BENCH_DRAIN_NS (5 * BENCH_NS)
/* After the timed window: when sockets of stuck threads are shut down. */
#define BENCH_WATCHDOG_NS (15 * BENCH_NS)
/* A prefill that has not finished by then is an error. */
#define BENCH_PREFILL_NS (300 * BENCH_NS)
/* Unused queues left by an interrupted run expire on the broker. */
#define BENCH_QUEUE_EXPIRES_MS 600000

#define BENCH_HEADERS_MAX 8

struct bench_opts {
	const char *host;
	int port;
	const char *user;
	const char *password;
	const char *vhost;
	int publishers;
	int consumers;
	size_t size;
	int confirms;
	int message_ids;                    /* each publish carries a unique message-id */
	long delay_ms;                      /* > 0: each publish carries an x-delay header */
	const char *exchange, *routing_key; /* publish there instead of the queue */
	const char *cacert;                 /* TLS: the CA the server is verified against */
	const char *id_header;              /* each publish carries a unique value in it */
	const char *reply_to;               /* each publish carries this reply-to */
	amqp_table_entry_t headers[BENCH_HEADERS_MAX]; /* --header: on every publish */
	int nheaders;
	int persistent;                     /* delivery_mode 2 on a durable queue */
	const char *queue_type;             /* x-queue-type of the queue (NULL: the broker's) */
	int window;
	int auto_ack;
	int prefetch;
	int ack_every;
	double rate;
	double duration;
	const char *queue;
	long prefill;
	int frame_max;
	pid_t pids[BENCH_MAX_PIDS];
	int npids;
	int idle;
	double idle_wait;
	int idle_threads;
	int quiet;
};

/* One sample set of latencies in nanoseconds. */
struct bench_samples {
	uint64_t *v;
	size_t n;
	size_t cap;
};

/* One unconfirmed publish: its send time, and 1 once acked, 2 once nacked. */
struct bench_slot {
	uint64_t sent_ns;
	unsigned char state;
};

/* One connection driven by one thread: a publisher or a consumer. */
struct bench_worker {
	pthread_t thread;
	int index;
	int is_publisher;
	int started;
	amqp_connection_state_t conn;
	atomic_int fd;
	atomic_int done;
	int failed;
	char error[256];
	/* publisher */
	uint64_t published;
	uint64_t confirmed;
	uint64_t nacked;
	uint64_t next_tag;
	uint64_t low_tag;
	struct bench_slot *ring;
	uint64_t last_publish_ns;
	/* consumer */
	uint64_t consumed;
	uint64_t bytes;
	uint64_t last_consume_ns;
	/* end-to-end latency (consumers) or confirm latency (publishers) */
	struct bench_samples lat;
};

/* What a target process looked like at one moment. */
struct bench_proc {
	double cpu_s;
	long hwm_kb;
	long rss_kb;
	int ok;
};

static struct bench_opts bench_opts = {
    .host = "127.0.0.1",
    .port = 5672,
    .user = "guest",
    .password = "guest",
    .vhost = "/",
    .publishers = 1,
    .consumers = 1,
    .size = 256,
    .confirms = 0,
    .window = 256,
    .auto_ack = 0,
    .prefetch = 100,
    .ack_every = 1,
    .rate = 0,
    .duration = 5,
    .queue = NULL,
    .prefill = 0,
    .frame_max = 131072,
    .npids = 0,
    .idle = 0,
    .idle_wait = 2,
    .idle_threads = 8,
    .quiet = 0,
};

static char bench_queue[256];
static uint64_t bench_start_ns;
static uint64_t bench_deadline_ns;
static atomic_int bench_stop;
static atomic_int bench_failed;
static atomic_ulong bench_consumed_total;
static pthread_barrier_t bench_barrier;

static uint64_t bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * BENCH_NS + (uint64_t)ts.tv_nsec;
}

static void bench_sleep_until(uint64_t when)
{
	struct timespec ts;

	ts.tv_sec = (time_t)(when / BENCH_NS);
	ts.tv_nsec = (long)(when % BENCH_NS);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static struct timeval bench_timeval(uint64_t ns)
{
	struct timeval tv;

	tv.tv_sec = (time_t)(ns / BENCH_NS);
	tv.tv_usec = (suseconds_t)((ns % BENCH_NS) / 1000);
	return tv;
}

static void bench_fail(struct bench_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void bench_fail(struct bench_worker *w, const char *fmt, ...)
{
	va_list ap;

	if (!w->failed) {
		va_start(ap, fmt);
		vsnprintf(w->error, sizeof(w->error), fmt, ap);
		va_end(ap);
	}
	w->failed = 1;
	atomic_store(&bench_failed, 1);
}

static void bench_reply_text(amqp_rpc_reply_t r, char *buf, size_t len)
{
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		snprintf(buf, len, "ok");
		break;
	case AMQP_RESPONSE_NONE:
		snprintf(buf, len, "no reply");
		break;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		snprintf(buf, len, "%s", amqp_error_string2(r.library_error));
		break;
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			amqp_connection_close_t *m = r.reply.decoded;

			snprintf(buf, len, "connection closed by server: %u %.*s",
				 m->reply_code, (int)m->reply_text.len,
				 (const char *)m->reply_text.bytes);
		} else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			amqp_channel_close_t *m = r.reply.decoded;

			snprintf(buf, len, "channel closed by server: %u %.*s", m->reply_code,
				 (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		} else {
			snprintf(buf, len, "unexpected server method 0x%08x", r.reply.id);
		}
		break;
	default:
		snprintf(buf, len, "unknown reply type %d", (int)r.reply_type);
		break;
	}
}

/* Checks an RPC reply; on failure records "what: why" in w. */
static int bench_check(struct bench_worker *w, amqp_rpc_reply_t r, const char *what)
{
	char text[200];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	bench_reply_text(r, text, sizeof(text));
	bench_fail(w, "%s: %s", what, text);
	return -1;
}

/* Opens a connection with channel 1; 0 on success. */
static int bench_connect(struct bench_worker *w, amqp_connection_state_t *out)
{
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	struct timeval tv = {10, 0};
	int rc;

	*out = NULL;
	conn = amqp_new_connection();
	if (!conn) {
		bench_fail(w, "out of memory");
		return -1;
	}
	if (bench_opts.cacert) {
		/* TLS, the server's certificate checked against the CA */
		sock = amqp_ssl_socket_new(conn);
		if (sock &&
		    amqp_ssl_socket_set_cacert(sock, bench_opts.cacert) != AMQP_STATUS_OK) {
			bench_fail(w, "cannot load %s", bench_opts.cacert);
			goto fail;
		}
	} else {
		sock = amqp_tcp_socket_new(conn);
	}
	if (!sock) {
		bench_fail(w, "cannot create socket");
		goto fail;
	}
	amqp_set_handshake_timeout(conn, &tv);
	tv.tv_sec = 30;
	amqp_set_rpc_timeout(conn, &tv);
	tv.tv_sec = 10;
	rc = amqp_socket_open_noblock(sock, bench_opts.host, bench_opts.port, &tv);
	if (rc != AMQP_STATUS_OK) {
		bench_fail(w, "connect %s:%d: %s", bench_opts.host, bench_opts.port,
			   amqp_error_string2(rc));
		goto fail;
	}
	if (bench_check(w,
			amqp_login(conn, bench_opts.vhost, 0, bench_opts.frame_max, 0,
				   AMQP_SASL_METHOD_PLAIN, bench_opts.user,
				   bench_opts.password),
			"login") < 0)
		goto fail;
	amqp_channel_open(conn, 1);
	if (bench_check(w, amqp_get_rpc_reply(conn), "channel.open") < 0)
		goto fail;
	*out = conn;
	atomic_store(&w->fd, amqp_get_sockfd(conn));
	return 0;
fail:
	amqp_destroy_connection(conn);
	return -1;
}

static void bench_disconnect(struct bench_worker *w)
{
	if (!w->conn)
		return;
	if (!w->failed)
		amqp_connection_close(w->conn, AMQP_REPLY_SUCCESS);
	atomic_store(&w->fd, -1);
	amqp_destroy_connection(w->conn);
	w->conn = NULL;
}

static int bench_samples_add(struct bench_samples *s, uint64_t v)
{
	uint64_t *grown;
	size_t cap;

	if (s->n == s->cap) {
		cap = s->cap ? s->cap * 2 : 65536;
		grown = realloc(s->v, cap * sizeof(*grown));
		if (!grown)
			return -1;
		s->v = grown;
		s->cap = cap;
	}
	s->v[s->n++] = v;
	return 0;
}

static int bench_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted samples, in nanoseconds. */
static uint64_t bench_percentile(const struct bench_samples *s, double p)
{
	double rank = p * (double)s->n;
	size_t k = (size_t)rank;

	if (!s->n)
		return 0;
	if ((double)k < rank)
		k++;
	if (k == 0)
		k = 1;
	if (k > s->n)
		k = s->n;
	return s->v[k - 1];
}

/* Appends every sample of the workers of one kind to out and sorts them. */
static void bench_samples_merge(struct bench_worker *ws, int n, struct bench_samples *out)
{
	size_t total = 0, at = 0;
	int i;

	for (i = 0; i < n; i++)
		total += ws[i].lat.n;
	out->n = 0;
	out->cap = total;
	out->v = total ? malloc(total * sizeof(*out->v)) : NULL;
	if (total && !out->v) {
		out->cap = 0;
		return;
	}
	for (i = 0; i < n; i++) {
		if (ws[i].lat.n)
			memcpy(out->v + at, ws[i].lat.v, ws[i].lat.n * sizeof(*out->v));
		at += ws[i].lat.n;
	}
	out->n = total;
	qsort(out->v, out->n, sizeof(*out->v), bench_cmp_u64);
}

/* Reads utime+stime (all threads) and the memory lines of a process. */
static struct bench_proc bench_proc_read(pid_t pid)
{
	struct bench_proc p = {0, -1, -1, 0};
	unsigned long ut, st;
	char path[64], buf[4096], *close_paren;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return p;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	close_paren = strrchr(buf, ')');
	if (!close_paren ||
	    sscanf(close_paren + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
		   &st) != 2)
		return p;
	p.cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return p;
	while (fgets(buf, sizeof(buf), f)) {
		if (strncmp(buf, "VmHWM:", 6) == 0)
			p.hwm_kb = strtol(buf + 6, NULL, 10);
		else if (strncmp(buf, "VmRSS:", 6) == 0)
			p.rss_kb = strtol(buf + 6, NULL, 10);
	}
	fclose(f);
	p.ok = 1;
	return p;
}

static void bench_raise_nofile(rlim_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur >= want)
		return;
	if (rl.rlim_max < want) {
		struct rlimit hard = {want, want};

		if (setrlimit(RLIMIT_NOFILE, &hard) == 0)
			return;
		want = rl.rlim_max;
	}
	rl.rlim_cur = want;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		fprintf(stderr, "acemq-bench: cannot raise the open files limit: %s\n",
			strerror(errno));
}

/* Publisher confirms: marks tag (and, if multiple, every tag below) done. */
static void bench_confirm(struct bench_worker *w, uint64_t tag, int multiple, int nack)
{
	uint64_t now = bench_now(), t, from;
	unsigned window = (unsigned)bench_opts.window;
	struct bench_slot *s;

	if (tag >= w->next_tag)
		tag = w->next_tag - 1;
	from = multiple ? w->low_tag : tag;
	if (from < w->low_tag)
		return;
	for (t = from; t <= tag; t++) {
		s = &w->ring[t % window];
		if (s->state)
			continue;
		s->state = nack ? 2 : 1;
		if (!nack)
			bench_samples_add(&w->lat, now - s->sent_ns);
	}
	while (w->low_tag < w->next_tag) {
		s = &w->ring[w->low_tag % window];
		if (!s->state)
			break;
		if (s->state == 2)
			w->nacked++;
		else
			w->confirmed++;
		s->state = 0;
		w->low_tag++;
	}
}

/* Handles one frame sent to a publisher; -1 when the connection is unusable. */
static int bench_publisher_frame(struct bench_worker *w, amqp_frame_t *f)
{
	if (f->frame_type != AMQP_FRAME_METHOD)
		return 0;
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		amqp_basic_ack_t *m = f->payload.method.decoded;

		bench_confirm(w, m->delivery_tag, m->multiple, 0);
		return 0;
	}
	case AMQP_BASIC_NACK_METHOD: {
		amqp_basic_nack_t *m = f->payload.method.decoded;

		bench_confirm(w, m->delivery_tag, m->multiple, 1);
		return 0;
	}
	case AMQP_CHANNEL_CLOSE_METHOD: {
		amqp_channel_close_t *m = f->payload.method.decoded;

		bench_fail(w, "channel closed by server: %u %.*s", m->reply_code,
			   (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		return -1;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		amqp_connection_close_t *m = f->payload.method.decoded;

		bench_fail(w, "connection closed by server: %u %.*s", m->reply_code,
			   (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		return -1;
	}
	default:
		return 0;
	}
}

/* Reads what the broker sent a publisher, waiting up to wait_ns for the first frame. */
static int bench_publisher_poll(struct bench_worker *w, uint64_t wait_ns)
{
	amqp_frame_t f;
	struct timeval tv = bench_timeval(wait_ns);
	int rc;

	for (;;) {
		rc = amqp_simple_wait_frame_noblock(w->conn, &f, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
			return 0;
		if (rc != AMQP_STATUS_OK) {
			bench_fail(w, "reading confirms: %s", amqp_error_string2(rc));
			return -1;
		}
		if (bench_publisher_frame(w, &f) < 0)
			return -1;
		if (!amqp_frames_enqueued(w->conn) && !amqp_data_in_buffer(w->conn))
			break;
		tv.tv_sec = 0;
		tv.tv_usec = 0;
	}
	amqp_maybe_release_buffers(w->conn);
	return 0;
}

/*
 * Publishes until deadline, or until limit messages when limit is not 0,
 * one every interval_ns when that is not 0. With stamp, the first 8 bytes
 * of each body carry the send time; otherwise they are 0.
 */
static void bench_publish_loop(struct bench_worker *w, uint64_t start, uint64_t deadline,
			       uint64_t limit, uint64_t interval_ns, int stamp)
{
	amqp_bytes_t body, rkey = amqp_cstring_bytes(
			       bench_opts.routing_key ? bench_opts.routing_key : bench_queue);
	amqp_bytes_t exchange =
	    bench_opts.exchange ? amqp_cstring_bytes(bench_opts.exchange) : amqp_empty_bytes;
	uint64_t now, next = start, zero = 0, drain_until;
	unsigned window = (unsigned)bench_opts.window;
	size_t i;
	int rc;

	body.len = bench_opts.size;
	body.bytes = malloc(body.len);
	if (!body.bytes) {
		bench_fail(w, "out of memory");
		return;
	}
	for (i = 0; i < body.len; i++)
		((unsigned char *)body.bytes)[i] = (unsigned char)('a' + i % 26);
	memcpy(body.bytes, &zero, sizeof(zero));
	if (interval_ns)
		next =
		    start + interval_ns * (uint64_t)w->index / (uint64_t)bench_opts.publishers;

	for (;;) {
		now = bench_now();
		if (now >= deadline || atomic_load(&bench_stop) ||
		    (limit && w->published >= limit))
			break;
		if (interval_ns && now < next) {
			if (bench_opts.confirms) {
				if (bench_publisher_poll(w, next - now) < 0)
					break;
			} else {
				bench_sleep_until(next < deadline ? next : deadline);
			}
			continue;
		}
		if (bench_opts.confirms && w->next_tag - w->low_tag >= window) {
			uint64_t wait = deadline - now;

			if (bench_publisher_poll(w, wait < BENCH_NS / 10 ? wait
									 : BENCH_NS / 10) < 0)
				break;
			continue;
		}
		if (interval_ns)
			next += interval_ns;
		if (stamp)
			memcpy(body.bytes, &now, sizeof(now));
		if (bench_opts.message_ids || bench_opts.delay_ms > 0 || bench_opts.id_header ||
		    bench_opts.persistent || bench_opts.reply_to || bench_opts.nheaders) {
			char id[48];
			amqp_basic_properties_t props;
			amqp_table_entry_t hdr[2 + BENCH_HEADERS_MAX];

			props._flags = 0;
			props.headers.num_entries = 0;
			props.headers.entries = hdr;
			snprintf(id, sizeof(id), "%d-%d-%" PRIu64, (int)getpid(), w->index,
				 w->published);
			if (bench_opts.persistent) {
				props._flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
				props.delivery_mode = 2;
			}
			if (bench_opts.reply_to) {
				props._flags |= AMQP_BASIC_REPLY_TO_FLAG;
				props.reply_to = amqp_cstring_bytes(bench_opts.reply_to);
			}
			if (bench_opts.message_ids) {
				props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
				props.message_id = amqp_cstring_bytes(id);
			}
			if (bench_opts.delay_ms > 0) {
				hdr[props.headers.num_entries].key =
				    amqp_cstring_bytes("x-delay");
				hdr[props.headers.num_entries].value.kind = AMQP_FIELD_KIND_I64;
				hdr[props.headers.num_entries++].value.value.i64 =
				    bench_opts.delay_ms;
			}
			if (bench_opts.id_header) {
				/* a unique value in the named header (publish dedup) */
				hdr[props.headers.num_entries].key =
				    amqp_cstring_bytes(bench_opts.id_header);
				hdr[props.headers.num_entries].value.kind =
				    AMQP_FIELD_KIND_UTF8;
				hdr[props.headers.num_entries++].value.value.bytes =
				    amqp_cstring_bytes(id);
			}
			memcpy(hdr + props.headers.num_entries, bench_opts.headers,
			       (size_t)bench_opts.nheaders * sizeof(hdr[0]));
			props.headers.num_entries += bench_opts.nheaders;
			if (props.headers.num_entries)
				props._flags |= AMQP_BASIC_HEADERS_FLAG;
			rc = amqp_basic_publish(w->conn, 1, exchange, rkey, 0, 0, &props, body);
		} else {
			rc = amqp_basic_publish(w->conn, 1, exchange, rkey, 0, 0, NULL, body);
		}
		if (rc != AMQP_STATUS_OK) {
			bench_fail(w, "basic.publish: %s", amqp_error_string2(rc));
			break;
		}
		if (bench_opts.confirms) {
			struct bench_slot *s = &w->ring[w->next_tag % window];

			s->sent_ns = now;
			s->state = 0;
			w->next_tag++;
		}
		w->published++;
		w->last_publish_ns = now;
	}
	free(body.bytes);

	if (!bench_opts.confirms || w->failed)
		return;
	drain_until = bench_now() + (limit ? BENCH_PREFILL_NS : BENCH_DRAIN_NS);
	while (w->low_tag < w->next_tag) {
		now = bench_now();
		if (now >= drain_until) {
			if (limit)
				bench_fail(w, "%" PRIu64 " confirms missing",
					   w->next_tag - w->low_tag);
			break;
		}
		if (bench_publisher_poll(w, BENCH_NS / 10) < 0)
			break;
	}
}

static int bench_publisher_setup(struct bench_worker *w)
{
	w->next_tag = 1;
	w->low_tag = 1;
	if (bench_connect(w, &w->conn) < 0)
		return -1;
	if (!bench_opts.confirms)
		return 0;
	w->ring = calloc((size_t)bench_opts.window, sizeof(*w->ring));
	if (!w->ring) {
		bench_fail(w, "out of memory");
		return -1;
	}
	amqp_confirm_select(w->conn, 1);
	return bench_check(w, amqp_get_rpc_reply(w->conn), "confirm.select");
}

static void *bench_publisher_main(void *arg)
{
	struct bench_worker *w = arg;
	uint64_t interval = 0;
	int ok = bench_publisher_setup(w) == 0;

	pthread_barrier_wait(&bench_barrier);
	if (ok && !atomic_load(&bench_failed)) {
		if (bench_opts.rate > 0)
			interval = (uint64_t)((double)BENCH_NS * bench_opts.publishers /
					      bench_opts.rate);
		bench_publish_loop(w, bench_start_ns, bench_deadline_ns, 0, interval, 1);
	}
	bench_disconnect(w);
	atomic_store(&w->done, 1);
	return NULL;
}

static int bench_consumer_setup(struct bench_worker *w)
{
	if (bench_connect(w, &w->conn) < 0)
		return -1;
	if (!bench_opts.auto_ack || bench_opts.prefetch > 0) {
		amqp_basic_qos(w->conn, 1, 0, (uint16_t)bench_opts.prefetch, 0);
		if (bench_check(w, amqp_get_rpc_reply(w->conn), "basic.qos") < 0)
			return -1;
	}
	amqp_basic_consume(w->conn, 1, amqp_cstring_bytes(bench_queue), amqp_empty_bytes, 0,
			   bench_opts.auto_ack, 0, amqp_empty_table);
	return bench_check(w, amqp_get_rpc_reply(w->conn), "basic.consume");
}

/* A frame other than a delivery reached a consumer; -1 ends the consumer. */
static int bench_consumer_other(struct bench_worker *w)
{
	amqp_frame_t f;
	int rc = amqp_simple_wait_frame(w->conn, &f);

	if (rc != AMQP_STATUS_OK) {
		bench_fail(w, "reading: %s", amqp_error_string2(rc));
		return -1;
	}
	if (f.frame_type != AMQP_FRAME_METHOD)
		return 0;
	switch (f.payload.method.id) {
	case AMQP_BASIC_CANCEL_METHOD:
		bench_fail(w, "consumer cancelled by server");
		return -1;
	case AMQP_CHANNEL_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
		return bench_publisher_frame(w, &f);
	default:
		return 0;
	}
}

static void bench_consume_loop(struct bench_worker *w)
{
	uint64_t now, sent, unacked = 0, last_tag = 0;
	amqp_envelope_t env;
	amqp_rpc_reply_t r;
	struct timeval tv;

	for (;;) {
		if (atomic_load(&bench_stop) || bench_now() >= bench_deadline_ns)
			break;
		amqp_maybe_release_buffers(w->conn);
		tv.tv_sec = 0;
		tv.tv_usec = 100000;
		r = amqp_consume_message(w->conn, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
			if (r.library_error == AMQP_STATUS_TIMEOUT)
				continue;
			if (r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
				if (bench_consumer_other(w) < 0)
					break;
				continue;
			}
		}
		if (bench_check(w, r, "basic.consume") < 0)
			break;
		now = bench_now();
		if (now <= bench_deadline_ns) {
			w->consumed++;
			w->bytes += env.message.body.len;
			w->last_consume_ns = now;
			atomic_fetch_add(&bench_consumed_total, 1);
			if (env.message.body.len >= sizeof(sent)) {
				memcpy(&sent, env.message.body.bytes, sizeof(sent));
				if (sent && sent <= now)
					bench_samples_add(&w->lat, now - sent);
			}
		}
		if (!bench_opts.auto_ack) {
			last_tag = env.delivery_tag;
			if (++unacked >= (uint64_t)bench_opts.ack_every) {
				if (amqp_basic_ack(w->conn, 1, last_tag,
						   bench_opts.ack_every > 1) !=
				    AMQP_STATUS_OK) {
					bench_fail(w, "basic.ack failed");
					amqp_destroy_envelope(&env);
					break;
				}
				unacked = 0;
			}
		}
		amqp_destroy_envelope(&env);
	}
	if (unacked && !w->failed)
		amqp_basic_ack(w->conn, 1, last_tag, 1);
}

static void *bench_consumer_main(void *arg)
{
	struct bench_worker *w = arg;
	int ok = bench_consumer_setup(w) == 0;

	pthread_barrier_wait(&bench_barrier);
	if (ok && !atomic_load(&bench_failed))
		bench_consume_loop(w);
	bench_disconnect(w);
	atomic_store(&w->done, 1);
	return NULL;
}

static int bench_queue_setup(struct bench_worker *w)
{
	amqp_table_entry_t arg[2];
	amqp_table_t args;
	int durable = bench_opts.persistent || bench_opts.queue_type != NULL;

	if (bench_connect(w, &w->conn) < 0)
		return -1;
	amqp_queue_delete(w->conn, 1, amqp_cstring_bytes(bench_queue), 0, 0);
	if (bench_check(w, amqp_get_rpc_reply(w->conn), "queue.delete") < 0)
		return -1;
	arg[0].key = amqp_cstring_bytes("x-expires");
	arg[0].value.kind = AMQP_FIELD_KIND_I32;
	arg[0].value.value.i32 = BENCH_QUEUE_EXPIRES_MS;
	args.num_entries = 1;
	args.entries = arg;
	if (bench_opts.queue_type) {
		arg[1].key = amqp_cstring_bytes("x-queue-type");
		arg[1].value.kind = AMQP_FIELD_KIND_UTF8;
		arg[1].value.value.bytes = amqp_cstring_bytes(bench_opts.queue_type);
		args.num_entries = 2;
	}
	amqp_queue_declare(w->conn, 1, amqp_cstring_bytes(bench_queue), 0, durable, 0, 0, args);
	return bench_check(w, amqp_get_rpc_reply(w->conn), "queue.declare");
}

static void bench_queue_teardown(struct bench_worker *w)
{
	if (!w->conn)
		return;
	amqp_queue_delete(w->conn, 1, amqp_cstring_bytes(bench_queue), 0, 0);
	bench_check(w, amqp_get_rpc_reply(w->conn), "queue.delete");
	bench_disconnect(w);
}

static int bench_prefill(void)
{
	struct bench_worker w;
	uint64_t t0 = bench_now(), t1;
	int ok;

	memset(&w, 0, sizeof(w));
	atomic_init(&w.fd, -1);
	if (bench_publisher_setup(&w) < 0) {
		fprintf(stderr, "acemq-bench: prefill: %s\n", w.error);
		bench_disconnect(&w);
		free(w.ring);
		return -1;
	}
	bench_publish_loop(&w, t0, t0 + BENCH_PREFILL_NS, (uint64_t)bench_opts.prefill, 0, 0);
	t1 = bench_now();
	ok = !w.failed && w.published == (uint64_t)bench_opts.prefill;
	if (!ok)
		fprintf(stderr, "acemq-bench: prefill: %s\n", w.failed ? w.error : "timed out");
	else if (!bench_opts.quiet)
		printf("prefill    %" PRIu64 " msg in %.2f s\n", w.published,
		       (double)(t1 - t0) / BENCH_NS);
	bench_disconnect(&w);
	free(w.ring);
	free(w.lat.v);
	return ok ? 0 : -1;
}

static void bench_print_latency(const char *label, const char *key, struct bench_samples *s,
				char *result, size_t len)
{
	size_t n = strlen(result);
	double p50 = (double)bench_percentile(s, 0.50) / 1000.0;
	double p90 = (double)bench_percentile(s, 0.90) / 1000.0;
	double p99 = (double)bench_percentile(s, 0.99) / 1000.0;
	double p999 = (double)bench_percentile(s, 0.999) / 1000.0;
	double max = s->n ? (double)s->v[s->n - 1] / 1000.0 : 0;

	if (!bench_opts.quiet && s->n)
		printf("%-10s p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f "
		       "ms  (%zu samples)\n",
		       label, p50 / 1000, p90 / 1000, p99 / 1000, p999 / 1000, max / 1000,
		       s->n);
	if (n < len)
		snprintf(result + n, len - n,
			 " %s_samples=%zu %s_p50_us=%.1f %s_p90_us=%.1f %s_p99_us=%.1f "
			 "%s_p999_us=%.1f %s_max_us=%.1f",
			 key, s->n, key, p50, key, p90, key, p99, key, p999, key, max);
}

static void bench_append(char *result, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void bench_append(char *result, size_t len, const char *fmt, ...)
{
	size_t n = strlen(result);
	va_list ap;

	if (n >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(result + n, len - n, fmt, ap);
	va_end(ap);
}

static void bench_snapshot(struct bench_proc *out)
{
	int i;

	for (i = 0; i < bench_opts.npids; i++)
		out[i] = bench_proc_read(bench_opts.pids[i]);
}

static const char *bench_onoff(int v)
{
	return v ? "on" : "off";
}

static int bench_load(void)
{
	struct bench_proc before[BENCH_MAX_PIDS], after[BENCH_MAX_PIDS];
	struct bench_worker setup, *ws;
	struct bench_samples e2e, conf;
	uint64_t published = 0, confirmed = 0, nacked = 0, consumed = 0, bytes = 0;
	uint64_t end_ns, pub_end = 0, now;
	double window_s, pub_s, cons_s;
	int n = bench_opts.publishers + bench_opts.consumers, i, failed = 0, all_done;
	char result[2048], rate[32];
	struct rusage ru;

	memset(&setup, 0, sizeof(setup));
	atomic_init(&setup.fd, -1);
	if (bench_queue_setup(&setup) < 0) {
		fprintf(stderr, "acemq-bench: %s\n", setup.error);
		bench_disconnect(&setup);
		return 1;
	}
	if (bench_opts.prefill > 0 && bench_prefill() < 0) {
		bench_queue_teardown(&setup);
		return 1;
	}

	ws = calloc((size_t)n, sizeof(*ws));
	if (!ws || pthread_barrier_init(&bench_barrier, NULL, (unsigned)n + 1) != 0) {
		fprintf(stderr, "acemq-bench: out of memory\n");
		bench_queue_teardown(&setup);
		return 1;
	}
	/* Consumers first, so that they are subscribed before anything is published. */
	for (i = 0; i < n; i++) {
		struct bench_worker *w = &ws[i];

		w->is_publisher = i >= bench_opts.consumers;
		w->index = w->is_publisher ? i - bench_opts.consumers : i;
		atomic_init(&w->fd, -1);
		if (pthread_create(&w->thread, NULL,
				   w->is_publisher ? bench_publisher_main : bench_consumer_main,
				   w) != 0) {
			fprintf(stderr, "acemq-bench: cannot create a thread\n");
			exit(1);
		}
		w->started = 1;
	}

	bench_snapshot(before);
	bench_start_ns = bench_now();
	bench_deadline_ns = bench_start_ns + (uint64_t)(bench_opts.duration * (double)BENCH_NS);
	pthread_barrier_wait(&bench_barrier);

	for (;;) {
		now = bench_now();
		if (now >= bench_deadline_ns || atomic_load(&bench_failed))
			break;
		if (bench_opts.publishers == 0 && bench_opts.prefill > 0 &&
		    atomic_load(&bench_consumed_total) >= (unsigned long)bench_opts.prefill)
			break;
		bench_sleep_until(now + BENCH_NS / 200);
	}
	end_ns = now < bench_deadline_ns ? now : bench_deadline_ns;
	bench_snapshot(after);
	atomic_store(&bench_stop, 1);

	/* Threads end by themselves; one that is stuck in a socket call is woken. */
	for (;;) {
		all_done = 1;
		for (i = 0; i < n; i++)
			if (!atomic_load(&ws[i].done))
				all_done = 0;
		if (all_done)
			break;
		if (bench_now() >= end_ns + BENCH_WATCHDOG_NS) {
			for (i = 0; i < n; i++) {
				int fd = atomic_load(&ws[i].fd);

				if (!atomic_load(&ws[i].done) && fd >= 0)
					shutdown(fd, SHUT_RDWR);
			}
			fprintf(
			    stderr,
			    "acemq-bench: threads stuck after the run; sockets shut down\n");
			break;
		}
		bench_sleep_until(bench_now() + BENCH_NS / 100);
	}
	for (i = 0; i < n; i++)
		pthread_join(ws[i].thread, NULL);
	bench_queue_teardown(&setup);

	for (i = 0; i < n; i++) {
		struct bench_worker *w = &ws[i];

		if (w->failed) {
			fprintf(stderr, "acemq-bench: %s %d: %s\n",
				w->is_publisher ? "publisher" : "consumer", w->index, w->error);
			failed = 1;
		}
		if (w->is_publisher) {
			published += w->published;
			confirmed += w->confirmed;
			nacked += w->nacked;
			if (w->last_publish_ns > pub_end)
				pub_end = w->last_publish_ns;
		} else {
			consumed += w->consumed;
			bytes += w->bytes;
		}
	}
	if (setup.failed) {
		fprintf(stderr, "acemq-bench: %s\n", setup.error);
		failed = 1;
	}
	bench_samples_merge(ws, bench_opts.consumers, &e2e);
	bench_samples_merge(ws + bench_opts.consumers, bench_opts.publishers, &conf);

	window_s = (double)(end_ns - bench_start_ns) / BENCH_NS;
	if (window_s <= 0)
		window_s = 1e-9;
	pub_s = window_s;
	cons_s = window_s;

	if (bench_opts.rate > 0)
		snprintf(rate, sizeof(rate), "%.0f msg/s", bench_opts.rate);
	else
		snprintf(rate, sizeof(rate), "max");
	if (!bench_opts.quiet) {
		printf("target     %s:%d  queue %s  size %zu B  frame_max %d\n",
		       bench_opts.host, bench_opts.port, bench_queue, bench_opts.size,
		       bench_opts.frame_max);
		printf("load       publishers %d  consumers %d  confirms %s (window %d)  ack "
		       "%s (every %d)  prefetch %d  rate %s  duration %.2f s\n",
		       bench_opts.publishers, bench_opts.consumers,
		       bench_onoff(bench_opts.confirms), bench_opts.window,
		       bench_opts.auto_ack ? "auto" : "manual", bench_opts.ack_every,
		       bench_opts.prefetch, rate, window_s);
		printf("published  %" PRIu64 " msg  %.1f msg/s", published,
		       (double)published / pub_s);
		if (bench_opts.confirms)
			printf("  (confirmed %" PRIu64 ", nacked %" PRIu64 ")", confirmed,
			       nacked);
		printf("\n");
		printf("consumed   %" PRIu64 " msg  %.1f msg/s  %.1f MB/s\n", consumed,
		       (double)consumed / cons_s, (double)bytes / cons_s / 1e6);
	}
	snprintf(
	    result, sizeof(result),
	    "RESULT mode=load target=%s:%d size=%zu publishers=%d consumers=%d confirms=%d "
	    "ack=%s prefetch=%d rate=%.0f prefill=%ld duration_s=%.3f published=%" PRIu64
	    " confirmed=%" PRIu64 " nacked=%" PRIu64 " consumed=%" PRIu64
	    " consumed_bytes=%" PRIu64 " pub_rate=%.1f cons_rate=%.1f cons_mbps=%.2f",
	    bench_opts.host, bench_opts.port, bench_opts.size, bench_opts.publishers,
	    bench_opts.consumers, bench_opts.confirms, bench_opts.auto_ack ? "auto" : "manual",
	    bench_opts.prefetch, bench_opts.rate, bench_opts.prefill, window_s, published,
	    confirmed, nacked, consumed, bytes, (double)published / pub_s,
	    (double)consumed / cons_s, (double)bytes / cons_s / 1e6);
	bench_print_latency("latency", "lat", &e2e, result, sizeof(result));
	if (bench_opts.confirms)
		bench_print_latency("confirm", "confirm", &conf, result, sizeof(result));

	for (i = 0; i < bench_opts.npids; i++) {
		double cpu = after[i].cpu_s - before[i].cpu_s;
		/* Per message consumed, or published when nothing consumes. */
		uint64_t count = consumed ? consumed : published;
		uint64_t nbytes = bytes ? bytes : published * (uint64_t)bench_opts.size;
		double per_m = count ? cpu * 1e6 / (double)count : 0;
		double per_gb = nbytes ? cpu * 1e9 / (double)nbytes : 0;

		if (!before[i].ok || !after[i].ok) {
			fprintf(stderr, "acemq-bench: cannot read /proc/%d\n",
				(int)bench_opts.pids[i]);
			failed = 1;
			continue;
		}
		if (!bench_opts.quiet)
			printf("pid %-6d cpu %.2f s (%.1f%% of one core, %.2f s per million "
			       "consumed)  VmHWM %ld kB  VmRSS %ld kB\n",
			       (int)bench_opts.pids[i], cpu, cpu * 100 / window_s, per_m,
			       after[i].hwm_kb, after[i].rss_kb);
		bench_append(result, sizeof(result),
			     " pid%d=%d cpu%d_s=%.2f cpu%d_per_M=%.3f cpu%d_per_GB=%.3f "
			     "hwm%d_kb=%ld rss%d_kb=%ld",
			     i, (int)bench_opts.pids[i], i, cpu, i, per_m, i, per_gb, i,
			     after[i].hwm_kb, i, after[i].rss_kb);
	}
	if (getrusage(RUSAGE_SELF, &ru) == 0)
		bench_append(result, sizeof(result), " bench_cpu_s=%.2f",
			     (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
				 (double)ru.ru_stime.tv_sec +
				 (double)ru.ru_stime.tv_usec / 1e6);
	bench_append(result, sizeof(result), " errors=%d", failed);
	printf("%s\n", result);
	fflush(stdout);

	for (i = 0; i < n; i++) {
		free(ws[i].ring);
		free(ws[i].lat.v);
	}
	free(e2e.v);
	free(conf.v);
	free(ws);
	pthread_barrier_destroy(&bench_barrier);
	return failed;
}

/* Idle mode: connections held by bench_idle_main threads. */
struct bench_idle {
	pthread_t thread;
	int first;
	int step;
	int opened;
	int failed;
	char error[256];
};

static amqp_connection_state_t *bench_idle_conns;
static int bench_idle_closing;

static void *bench_idle_main(void *arg)
{
	struct bench_idle *t = arg;
	struct bench_worker w;
	int i;

	for (i = t->first; i < bench_opts.idle; i += t->step) {
		if (bench_idle_closing) {
			if (bench_idle_conns[i]) {
				amqp_connection_close(bench_idle_conns[i], AMQP_REPLY_SUCCESS);
				amqp_destroy_connection(bench_idle_conns[i]);
				bench_idle_conns[i] = NULL;
			}
			continue;
		}
		memset(&w, 0, sizeof(w));
		atomic_init(&w.fd, -1);
		if (bench_connect(&w, &bench_idle_conns[i]) < 0) {
			if (!t->failed)
				snprintf(t->error, sizeof(t->error), "%s", w.error);
			t->failed++;
			/* Once one fails, more are unlikely to work: stop this thread. */
			break;
		}
		t->opened++;
	}
	return NULL;
}

static int bench_idle_run(struct bench_idle *ts, int nthreads, int closing)
{
	int i, opened = 0;

	bench_idle_closing = closing;
	for (i = 0; i < nthreads; i++) {
		ts[i].first = i;
		ts[i].step = nthreads;
		if (pthread_create(&ts[i].thread, NULL, bench_idle_main, &ts[i]) != 0) {
			fprintf(stderr, "acemq-bench: cannot create a thread\n");
			exit(1);
		}
	}
	for (i = 0; i < nthreads; i++) {
		pthread_join(ts[i].thread, NULL);
		opened += ts[i].opened;
	}
	return opened;
}

static int bench_idle_mode(void)
{
	struct bench_proc before[BENCH_MAX_PIDS], after[BENCH_MAX_PIDS], closed[BENCH_MAX_PIDS];
	int nthreads = bench_opts.idle_threads, opened, failures = 0, i;
	struct bench_idle *ts;
	uint64_t t0, t1;
	char result[2048];

	if (nthreads > bench_opts.idle)
		nthreads = bench_opts.idle;
	bench_raise_nofile((rlim_t)bench_opts.idle + 256);
	bench_idle_conns = calloc((size_t)bench_opts.idle, sizeof(*bench_idle_conns));
	ts = calloc((size_t)nthreads, sizeof(*ts));
	if (!bench_idle_conns || !ts) {
		fprintf(stderr, "acemq-bench: out of memory\n");
		return 1;
	}
	bench_snapshot(before);
	t0 = bench_now();
	opened = bench_idle_run(ts, nthreads, 0);
	t1 = bench_now();
	for (i = 0; i < nthreads; i++) {
		if (ts[i].failed) {
			if (!failures)
				fprintf(stderr, "acemq-bench: opening connections: %s\n",
					ts[i].error);
			failures += ts[i].failed;
		}
	}
	bench_sleep_until(bench_now() + (uint64_t)(bench_opts.idle_wait * (double)BENCH_NS));
	bench_snapshot(after);
	bench_idle_run(ts, nthreads, 1);
	bench_sleep_until(bench_now() + BENCH_NS);
	bench_snapshot(closed);

	if (!bench_opts.quiet) {
		printf("target     %s:%d  idle connections %d (opened %d in %.2f s, %.0f/s)  "
		       "frame_max %d\n",
		       bench_opts.host, bench_opts.port, bench_opts.idle, opened,
		       (double)(t1 - t0) / BENCH_NS,
		       opened / ((double)(t1 - t0) / BENCH_NS + 1e-9), bench_opts.frame_max);
	}
	snprintf(result, sizeof(result),
		 "RESULT mode=idle target=%s:%d connections=%d opened=%d open_s=%.3f",
		 bench_opts.host, bench_opts.port, bench_opts.idle, opened,
		 (double)(t1 - t0) / BENCH_NS);
	for (i = 0; i < bench_opts.npids; i++) {
		double per_conn;

		if (!before[i].ok || !after[i].ok) {
			fprintf(stderr, "acemq-bench: cannot read /proc/%d\n",
				(int)bench_opts.pids[i]);
			failures++;
			continue;
		}
		per_conn = opened ? (double)(after[i].rss_kb - before[i].rss_kb) / opened : 0;
		if (!bench_opts.quiet)
			printf("pid %-6d VmRSS %ld kB -> %ld kB with the connections (%.1f kB "
			       "per connection), %ld kB after closing; VmHWM %ld kB\n",
			       (int)bench_opts.pids[i], before[i].rss_kb, after[i].rss_kb,
			       per_conn, closed[i].rss_kb, after[i].hwm_kb);
		bench_append(
		    result, sizeof(result),
		    " pid%d=%d rss%d_before_kb=%ld rss%d_kb=%ld rss%d_per_conn_kb=%.2f "
		    "rss%d_closed_kb=%ld hwm%d_kb=%ld cpu%d_s=%.2f",
		    i, (int)bench_opts.pids[i], i, before[i].rss_kb, i, after[i].rss_kb, i,
		    per_conn, i, closed[i].rss_kb, i, after[i].hwm_kb, i,
		    after[i].cpu_s - before[i].cpu_s);
	}
	bench_append(result, sizeof(result), " errors=%d", failures ? 1 : 0);
	printf("%s\n", result);
	fflush(stdout);
	free(ts);
	free(bench_idle_conns);
	return failures ? 1 : 0;
}

static void bench_usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: acemq-bench [options]\n"
	    "  -H, --host HOST          broker or proxy address (default 127.0.0.1)\n"
	    "  -p, --port PORT          port (default 5672)\n"
	    "      --target HOST:PORT   both at once\n"
	    "      --user U, --password P, --vhost V   credentials (guest, guest, /)\n"
	    "  -P, --publishers N       publisher connections (default 1)\n"
	    "  -C, --consumers N        consumer connections (default 1)\n"
	    "  -s, --size BYTES         message size, K/M suffixes (default 256, at least 8)\n"
	    "  -c, --confirms           publisher confirms\n"
	    "      --window N           unconfirmed messages per publisher (default 256)\n"
	    "      --message-ids        give each publish a unique message-id property\n"
	    "      --persistent         persistent messages (delivery_mode 2), durable queue\n"
	    "      --queue-type TYPE    declare the queue with x-queue-type TYPE (quorum:\n"
	    "                           durable)\n"
	    "      --delay MS           give each publish an x-delay header of MS\n"
	    "      --exchange NAME      publish to this exchange (default: \"\")\n"
	    "      --routing-key KEY    with this routing key (default: the queue)\n"
	    "      --tls-ca FILE        connect with TLS, the server verified against FILE\n"
	    "      --id-header NAME     give each publish a unique value in header NAME\n"
	    "      --reply-to NAME      give each publish the reply-to property NAME\n"
	    "      --header NAME=VALUE  give each publish this header (a string; i:N for a\n"
	    "                           64-bit integer); repeated, up to 8\n"
	    "  -a, --auto-ack           consumers use auto-ack (default: manual acks)\n"
	    "      --ack-every N        ack every Nth delivery with multiple=true (default 1)\n"
	    "  -q, --prefetch N         basic.qos prefetch count, 0 unlimited (default 100)\n"
	    "  -r, --rate MSGS          total publish rate in msg/s, 0 as fast as possible "
	    "(default 0)\n"
	    "  -d, --duration SECONDS   length of the measured run (default 5)\n"
	    "  -Q, --queue NAME         queue to (re)declare and delete (default "
	    "acemq-bench-PID)\n"
	    "      --prefill N          publish N messages before the run (not measured)\n"
	    "      --frame-max BYTES    frame_max asked for (default 131072)\n"
	    "      --pid PID[,PID]      process to measure (CPU, VmHWM, VmRSS); repeatable\n"
	    "      --idle-connections K open K connections, wait, measure RSS, close\n"
	    "      --idle-wait SECONDS  wait before measuring idle connections (default 2)\n"
	    "      --idle-threads N     threads opening idle connections (default 8)\n"
	    "      --quiet              only the RESULT line\n"
	    "  -h, --help\n"
	    "The last line printed is 'RESULT key=value ...'. Latency is end to end,\n"
	    "from the CLOCK_MONOTONIC stamp in the first 8 bytes of each body.\n");
}

static int bench_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s)
		return -1;
	if (*end == 'k' || *end == 'K') {
		v *= 1024;
		end++;
	} else if (*end == 'm' || *end == 'M') {
		v *= 1024 * 1024;
		end++;
	} else if (*end == 'g' || *end == 'G') {
		v *= 1024L * 1024 * 1024;
		end++;
	}
	if (*end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static int bench_parse_double(const char *s, double min, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= min))
		return -1;
	*out = v;
	return 0;
}

static int bench_parse_pids(const char *arg)
{
	char *copy = strdup(arg), *tok, *save = NULL;
	long v;

	if (!copy)
		return -1;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (bench_opts.npids == BENCH_MAX_PIDS ||
		    bench_parse_long(tok, 1, 1L << 30, &v) < 0) {
			free(copy);
			return -1;
		}
		bench_opts.pids[bench_opts.npids++] = (pid_t)v;
	}
	free(copy);
	return 0;
}

static int bench_parse_target(const char *arg)
{
	static char host[256];
	const char *colon = strrchr(arg, ':');
	long port;

	if (!colon || colon == arg || (size_t)(colon - arg) >= sizeof(host) ||
	    bench_parse_long(colon + 1, 1, 65535, &port) < 0)
		return -1;
	memcpy(host, arg, (size_t)(colon - arg));
	host[colon - arg] = '\0';
	bench_opts.host = host;
	bench_opts.port = (int)port;
	return 0;
}

enum {
	BENCH_OPT_TARGET = 256,
	BENCH_OPT_USER,
	BENCH_OPT_PASSWORD,
	BENCH_OPT_VHOST,
	BENCH_OPT_WINDOW,
	BENCH_OPT_ACK_EVERY,
	BENCH_OPT_PREFILL,
	BENCH_OPT_FRAME_MAX,
	BENCH_OPT_PID,
	BENCH_OPT_IDLE,
	BENCH_OPT_IDLE_WAIT,
	BENCH_OPT_IDLE_THREADS,
	BENCH_OPT_QUIET,
	BENCH_OPT_MESSAGE_IDS,
	BENCH_OPT_DELAY,
	BENCH_OPT_EXCHANGE,
	BENCH_OPT_ROUTING_KEY,
	BENCH_OPT_TLS_CA,
	BENCH_OPT_ID_HEADER,
	BENCH_OPT_REPLY_TO,
	BENCH_OPT_HEADER,
	BENCH_OPT_PERSISTENT,
	BENCH_OPT_QUEUE_TYPE,
};

static const struct option bench_long_opts[] = {
    {"host", required_argument, NULL, 'H'},
    {"port", required_argument, NULL, 'p'},
    {"target", required_argument, NULL, BENCH_OPT_TARGET},
    {"user", required_argument, NULL, BENCH_OPT_USER},
    {"password", required_argument, NULL, BENCH_OPT_PASSWORD},
    {"vhost", required_argument, NULL, BENCH_OPT_VHOST},
    {"publishers", required_argument, NULL, 'P'},
    {"consumers", required_argument, NULL, 'C'},
    {"size", required_argument, NULL, 's'},
    {"confirms", no_argument, NULL, 'c'},
    {"window", required_argument, NULL, BENCH_OPT_WINDOW},
    {"message-ids", no_argument, NULL, BENCH_OPT_MESSAGE_IDS},
    {"persistent", no_argument, NULL, BENCH_OPT_PERSISTENT},
    {"queue-type", required_argument, NULL, BENCH_OPT_QUEUE_TYPE},
    {"delay", required_argument, NULL, BENCH_OPT_DELAY},
    {"exchange", required_argument, NULL, BENCH_OPT_EXCHANGE},
    {"routing-key", required_argument, NULL, BENCH_OPT_ROUTING_KEY},
    {"tls-ca", required_argument, NULL, BENCH_OPT_TLS_CA},
    {"id-header", required_argument, NULL, BENCH_OPT_ID_HEADER},
    {"reply-to", required_argument, NULL, BENCH_OPT_REPLY_TO},
    {"header", required_argument, NULL, BENCH_OPT_HEADER},
    {"auto-ack", no_argument, NULL, 'a'},
    {"ack-every", required_argument, NULL, BENCH_OPT_ACK_EVERY},
    {"prefetch", required_argument, NULL, 'q'},
    {"rate", required_argument, NULL, 'r'},
    {"duration", required_argument, NULL, 'd'},
    {"queue", required_argument, NULL, 'Q'},
    {"prefill", required_argument, NULL, BENCH_OPT_PREFILL},
    {"frame-max", required_argument, NULL, BENCH_OPT_FRAME_MAX},
    {"pid", required_argument, NULL, BENCH_OPT_PID},
    {"idle-connections", required_argument, NULL, BENCH_OPT_IDLE},
    {"idle-wait", required_argument, NULL, BENCH_OPT_IDLE_WAIT},
    {"idle-threads", required_argument, NULL, BENCH_OPT_IDLE_THREADS},
    {"quiet", no_argument, NULL, BENCH_OPT_QUIET},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* --header NAME=VALUE: a string, or i:N a 64-bit integer. 0, or -1. */
static int bench_header(char *arg)
{
	amqp_table_entry_t *e = &bench_opts.headers[bench_opts.nheaders];
	char *eq = strchr(arg, '=');

	if (eq == NULL || eq == arg || bench_opts.nheaders >= BENCH_HEADERS_MAX) {
		fprintf(stderr, "acemq-bench: --header NAME=VALUE, at most %d\n",
			BENCH_HEADERS_MAX);
		return -1;
	}
	*eq++ = 0;
	e->key = amqp_cstring_bytes(arg);
	if (strncmp(eq, "i:", 2) == 0) {
		e->value.kind = AMQP_FIELD_KIND_I64;
		e->value.value.i64 = strtoll(eq + 2, NULL, 10);
	} else {
		e->value.kind = AMQP_FIELD_KIND_UTF8;
		e->value.value.bytes = amqp_cstring_bytes(eq);
	}
	bench_opts.nheaders++;
	return 0;
}

static int bench_parse_args(int argc, char **argv)
{
	long v;
	int c, bad;

	while ((c = getopt_long(argc, argv, "H:p:P:C:s:caq:r:d:Q:h", bench_long_opts, NULL)) !=
	       -1) {
		bad = 0;
		switch (c) {
		case 'H':
			bench_opts.host = optarg;
			break;
		case 'p':
			bad = bench_parse_long(optarg, 1, 65535, &v);
			bench_opts.port = (int)v;
			break;
		case BENCH_OPT_TARGET:
			bad = bench_parse_target(optarg);
			break;
		case BENCH_OPT_USER:
			bench_opts.user = optarg;
			break;
		case BENCH_OPT_PASSWORD:
			bench_opts.password = optarg;
			break;
		case BENCH_OPT_VHOST:
			bench_opts.vhost = optarg;
			break;
		case 'P':
			bad = bench_parse_long(optarg, 0, 1000, &v);
			bench_opts.publishers = (int)v;
			break;
		case 'C':
			bad = bench_parse_long(optarg, 0, 1000, &v);
			bench_opts.consumers = (int)v;
			break;
		case 's':
			bad = bench_parse_long(optarg, 8, 512L * 1024 * 1024, &v);
			bench_opts.size = (size_t)v;
			break;
		case 'c':
			bench_opts.confirms = 1;
			break;
		case BENCH_OPT_WINDOW:
			bad = bench_parse_long(optarg, 1, 1 << 20, &v);
			bench_opts.window = (int)v;
			break;
		case BENCH_OPT_MESSAGE_IDS:
			bench_opts.message_ids = 1;
			break;
		case BENCH_OPT_PERSISTENT:
			bench_opts.persistent = 1;
			break;
		case BENCH_OPT_QUEUE_TYPE:
			bench_opts.queue_type = optarg;
			break;
		case BENCH_OPT_DELAY:
			bench_opts.delay_ms = atol(optarg);
			break;
		case BENCH_OPT_EXCHANGE:
			bench_opts.exchange = optarg;
			break;
		case BENCH_OPT_ROUTING_KEY:
			bench_opts.routing_key = optarg;
			break;
		case BENCH_OPT_TLS_CA:
			bench_opts.cacert = optarg;
			break;
		case BENCH_OPT_ID_HEADER:
			bench_opts.id_header = optarg;
			break;
		case BENCH_OPT_REPLY_TO:
			bench_opts.reply_to = optarg;
			break;
		case BENCH_OPT_HEADER:
			if (bench_header(optarg) != 0)
				return -1;
			break;
		case 'a':
			bench_opts.auto_ack = 1;
			break;
		case BENCH_OPT_ACK_EVERY:
			bad = bench_parse_long(optarg, 1, 65535, &v);
			bench_opts.ack_every = (int)v;
			break;
		case 'q':
			bad = bench_parse_long(optarg, 0, 65535, &v);
			bench_opts.prefetch = (int)v;
			break;
		case 'r':
			bad = bench_parse_double(optarg, 0, &bench_opts.rate);
			break;
		case 'd':
			bad = bench_parse_double(optarg, 0.01, &bench_opts.duration) ||
			      bench_opts.duration > 86400;
			break;
		case 'Q':
			bad = strlen(optarg) >= sizeof(bench_queue);
			bench_opts.queue = optarg;
			break;
		case BENCH_OPT_PREFILL:
			bad = bench_parse_long(optarg, 0, 1L << 40, &bench_opts.prefill);
			break;
		case BENCH_OPT_FRAME_MAX:
			bad = bench_parse_long(optarg, 4096, 1 << 30, &v);
			bench_opts.frame_max = (int)v;
			break;
		case BENCH_OPT_PID:
			bad = bench_parse_pids(optarg);
			break;
		case BENCH_OPT_IDLE:
			bad = bench_parse_long(optarg, 1, BENCH_MAX_IDLE, &v);
			bench_opts.idle = (int)v;
			break;
		case BENCH_OPT_IDLE_WAIT:
			bad = bench_parse_double(optarg, 0, &bench_opts.idle_wait) ||
			      bench_opts.idle_wait > 3600;
			break;
		case BENCH_OPT_IDLE_THREADS:
			bad = bench_parse_long(optarg, 1, 256, &v);
			bench_opts.idle_threads = (int)v;
			break;
		case BENCH_OPT_QUIET:
			bench_opts.quiet = 1;
			break;
		case 'h':
			bench_usage(stdout);
			exit(0);
		default:
			bench_usage(stderr);
			return -1;
		}
		if (bad) {
			fprintf(stderr, "acemq-bench: bad value for option %s: %s\n",
				argv[optind - 1], optarg ? optarg : "");
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "acemq-bench: unexpected argument: %s\n", argv[optind]);
		return -1;
	}
	if (!bench_opts.idle && bench_opts.publishers + bench_opts.consumers == 0) {
		fprintf(stderr, "acemq-bench: no publishers and no consumers\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (bench_parse_args(argc, argv) < 0)
		return 2;
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (bench_opts.queue)
		snprintf(bench_queue, sizeof(bench_queue), "%s", bench_opts.queue);
	else
		snprintf(bench_queue, sizeof(bench_queue), "acemq-bench-%d", (int)getpid());
	if (bench_opts.idle)
		return bench_idle_mode();
	bench_raise_nofile((rlim_t)(bench_opts.publishers + bench_opts.consumers) + 64);
	return bench_load();
}
