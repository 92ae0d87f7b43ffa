/* test_probe: the greeting's probe against scripted brokers on loopback
 * sockets: the protocol header it sends, a connection.start read in two
 * pieces and decoded, the socket closed after it, a broker that answers
 * with its own protocol header or not at all, and a second ask later. */
#include "amqp/method.h"
#include "src/greeting.h"
#include "src/probe.h"
#include "src/rules.h"
#include "src/upstream.h"
#include "src/worker.h"

#include "tests/unit/unit.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct event_base *base;

static const uint8_t amqp_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};

static void nonblocking(int fd)
{
	ck_assert_int_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

/* A listener on loopback, added to the global list. */
static int broker(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fd, 4), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	ck_assert_int_eq(upstream_add_sockaddr((struct sockaddr *)&sa, (int)len, "probe-test"),
			 0);
	nonblocking(fd);
	return fd;
}

/* Run the probe's loop until done() holds (10 s at most). */
static int until(int (*done)(void *), void *arg)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		if (done(arg))
			return 1;
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
		usleep(1000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - t0.tv_sec < 10);
	return done(arg);
}

struct io {
	int fd;
	int got; /* accept: the socket; read: bytes, 0 at EOF, -1 none yet */
	uint8_t buf[64];
};

static int accepted(void *arg)
{
	struct io *io = arg;

	io->got = accept(io->fd, NULL, NULL);
	return io->got >= 0;
}

static int readable(void *arg)
{
	struct io *io = arg;
	ssize_t n = recv(io->fd, io->buf, sizeof(io->buf), 0);

	io->got = n >= 0 ? (int)n : -1;
	return n >= 0;
}

static int known(void *arg)
{
	return greeting_known(*(int *)arg);
}

/* The probe's connection to listener lst: accepted, and its header read. */
static int take_probe(int lst)
{
	struct io io = {lst, -1, {0}};

	ck_assert(until(accepted, &io));
	io.fd = io.got;
	nonblocking(io.fd);
	ck_assert(until(readable, &io));
	ck_assert_int_eq(io.got, 8);
	ck_assert(memcmp(io.buf, amqp_header, 8) == 0);
	return io.fd;
}

/* The socket is closed by the probe. */
static void closed_by_probe(int fd)
{
	struct io io = {fd, -1, {0}};

	ck_assert(until(readable, &io));
	ck_assert_int_eq(io.got, 0);
	close(fd);
}

/* A connection.start frame announcing product. */
static struct evbuffer *start_frame(const char *product)
{
	struct evbuffer *b = evbuffer_new();
	amqp_table_entry_t e;
	amqp_connection_start_t m;

	e.key = amqp_cstring_bytes("product");
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes = amqp_cstring_bytes(product);
	memset(&m, 0, sizeof(m));
	m.version_minor = 9;
	m.server_properties.num_entries = 1;
	m.server_properties.entries = &e;
	m.mechanisms = amqp_cstring_bytes("PLAIN");
	m.locales = amqp_cstring_bytes("en_US");
	ck_assert_int_eq(method_write(b, 0, AMQP_CONNECTION_START_METHOD, &m), 0);
	return b;
}

static void send_all(int fd, const void *p, size_t len)
{
	ck_assert_int_eq((int)send(fd, p, len, MSG_NOSIGNAL), (int)len);
}

/* The product a new client is shown. */
static void shown(const char *want)
{
	struct greeting *g = greeting_new();
	struct evbuffer *out = evbuffer_new();
	amqp_connection_start_t *m = NULL;
	amqp_method_number_t id;
	amqp_pool_t pool;
	amqp_table_entry_t *e;
	size_t len;
	uint8_t *frame;

	init_amqp_pool(&pool, 4096);
	ck_assert_int_eq(greeting_start(g, out), 0);
	len = evbuffer_get_length(out);
	frame = evbuffer_pullup(out, (ev_ssize_t)len);
	ck_assert_uint_gt(len, 8);
	ck_assert_int_eq(method_decode(frame + 7, len - 8, &pool, &id, (void **)&m), 0);
	ck_assert_uint_eq(id, AMQP_CONNECTION_START_METHOD);
	ck_assert_int_eq(m->server_properties.num_entries, 1);
	e = &m->server_properties.entries[0];
	ck_assert_int_eq((int)e->value.value.bytes.len, (int)strlen(want));
	ck_assert(memcmp(e->value.value.bytes.bytes, want, strlen(want)) == 0);
	empty_amqp_pool(&pool);
	greeting_free(g);
	evbuffer_free(out);
}

static int resumed;

static void resume(void *owner)
{
	resumed++;
}

START_TEST(asks_each_broker)
{
	struct rules r;
	struct worker w;
	struct greeting *waiting = greeting_new();
	struct evbuffer *start = start_frame("probed-broker");
	struct evbuffer *again = start_frame("asked-again");
	size_t len = evbuffer_get_length(start);
	uint8_t *p = evbuffer_pullup(start, -1);
	int lst[3], fd[3], node0 = 0, node1 = 1, i;

	ck_assert_int_eq(worker_init(&w, 0), 0);
	base = event_base_new();
	for (i = 0; i < 3; i++)
		lst[i] = broker();
	memset(&r, 0, sizeof(r));
	r.greets = 1;
	ck_assert_int_eq(probe_init(base, 300, 1000), 0);
	probe_rules(&r);
	/* Asked for the first time: a new client waits. */
	ck_assert_int_eq(greeting_await(waiting, &w, resume, NULL), 0);
	for (i = 0; i < 3; i++)
		fd[i] = take_probe(lst[i]);

	/* Node 0: its connection.start, in two pieces. */
	send_all(fd[0], p, 10);
	for (i = 0; i < 20; i++)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	ck_assert(!greeting_known(0));
	send_all(fd[0], p + 10, len - 10);
	ck_assert(until(known, &node0));
	closed_by_probe(fd[0]);
	worker_run_posted(&w);
	ck_assert_int_eq(resumed, 1);
	shown("probed-broker");

	/* Node 1 answers with its own header, node 2 not at all (300 ms). */
	send_all(fd[1], amqp_header, sizeof(amqp_header));
	closed_by_probe(fd[1]);
	closed_by_probe(fd[2]);
	ck_assert(!greeting_known(1) && !greeting_known(2));

	/* Node 1 is asked again, a second later; now it answers. */
	fd[1] = take_probe(lst[1]);
	send_all(fd[1], evbuffer_pullup(again, -1), evbuffer_get_length(again));
	ck_assert(until(known, &node1));
	closed_by_probe(fd[1]);
	shown("probed-broker"); /* node 0 still comes first */

	probe_stop();
	greeting_free(waiting);
	for (i = 0; i < 3; i++)
		close(lst[i]);
	evbuffer_free(start);
	evbuffer_free(again);
	event_base_free(base);
	worker_fini(&w);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, asks_each_broker);
	return unit_run("probe", tc, 0);
}
