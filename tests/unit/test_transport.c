/* test_transport: the socket layer over real sockets: large reads, the read
 * high mark, end of stream, stuck writes and drain, connect, timeouts. */
#include "tests/unit/unit.h"

#include "src/transport.h"

#include <check.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct probe {
	struct event_base *base;
	struct transport *t;
	size_t consume; /* drain input in read_cb */
	int reads, drains, events, last_event, last_err;
	size_t got;
};

static void probe_read(struct transport *t, void *arg)
{
	struct probe *p = arg;
	struct evbuffer *in = transport_input(t);

	p->reads++;
	if (p->consume) {
		p->got += evbuffer_get_length(in);
		evbuffer_drain(in, evbuffer_get_length(in));
		transport_input_consumed(t);
	}
}

static void probe_drained(struct transport *t, void *arg)
{
	struct probe *p = arg;

	p->drains++;
	event_base_loopbreak(p->base);
}

static void probe_event(struct transport *t, int what, int err, void *arg)
{
	struct probe *p = arg;

	p->events++;
	p->last_event = what;
	p->last_err = err;
	event_base_loopbreak(p->base);
}

static void run_for(struct event_base *base, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	event_base_loopexit(base, &tv);
	event_base_dispatch(base);
}

static void pair(struct probe *p, int *peer)
{
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	memset(p, 0, sizeof(*p));
	p->base = event_base_new();
	p->t = transport_new(p->base, sv[0]);
	ck_assert_ptr_nonnull(p->t);
	transport_setcb(p->t, probe_read, probe_drained, probe_event, p);
	evutil_make_socket_nonblocking(sv[1]);
	*peer = sv[1];
}

static void unpair(struct probe *p, int peer)
{
	transport_free(p->t);
	event_base_free(p->base);
	if (peer >= 0)
		close(peer);
}

START_TEST(reads_large_chunks_then_eof)
{
	static char data[1 << 20];
	struct probe p;
	size_t sent = 0;
	int peer;

	pair(&p, &peer);
	p.consume = 1;
	transport_read_enable(p.t);
	memset(data, 'x', sizeof(data));
	while (sent < sizeof(data)) {
		ssize_t n = write(peer, data + sent, sizeof(data) - sent);

		if (n > 0)
			sent += (size_t)n;
		run_for(p.base, 5);
	}
	close(peer);
	while (p.events == 0)
		run_for(p.base, 50);
	ck_assert_uint_eq(p.got, sizeof(data));
	ck_assert_int_eq(p.last_event, TRANSPORT_EOF);
	/* far fewer wake-ups than 4 KiB reads would take */
	ck_assert_int_lt(p.reads, (int)(sizeof(data) / 4096));
	unpair(&p, -1);
}
END_TEST

START_TEST(read_high_mark_pauses_and_resumes)
{
	static char data[512 * 1024];
	struct probe p;
	int peer;

	pair(&p, &peer);
	transport_set_read_high(p.t, 64 * 1024);
	transport_read_enable(p.t);
	ck_assert_int_gt(write(peer, data, sizeof(data)), 128 * 1024);
	run_for(p.base, 50);
	/* stopped at the mark (plus at most one read's worth) */
	ck_assert_uint_ge(evbuffer_get_length(transport_input(p.t)), 64 * 1024);
	ck_assert_uint_le(evbuffer_get_length(transport_input(p.t)), 64 * 1024 + 2 * 65536);
	evbuffer_drain(transport_input(p.t), 1 << 20);
	transport_input_consumed(p.t);
	run_for(p.base, 50);
	ck_assert_uint_gt(evbuffer_get_length(transport_input(p.t)), 0);
	unpair(&p, peer);
}
END_TEST

START_TEST(stuck_writes_wait_then_drain)
{
	static char data[4 << 20], sink[65536];
	struct probe p;
	int peer, i;
	size_t read_back = 0;

	pair(&p, &peer);
	transport_set_write_low(p.t, 1024);
	evbuffer_add(transport_output(p.t), data, sizeof(data));
	run_for(p.base, 20);
	/* the peer reads nothing: most of it is still queued */
	ck_assert_uint_gt(evbuffer_get_length(transport_output(p.t)), 1 << 20);
	ck_assert_int_eq(p.drains, 0);
	for (i = 0; i < 2000 && p.drains == 0; i++) {
		ssize_t n = read(peer, sink, sizeof(sink));

		if (n > 0)
			read_back += (size_t)n;
		run_for(p.base, 1);
	}
	ck_assert_int_eq(p.drains, 1);
	ck_assert_uint_le(evbuffer_get_length(transport_output(p.t)), 1024);
	ck_assert_uint_gt(read_back, 3 << 20);
	unpair(&p, peer);
}
END_TEST

START_TEST(connect_success_and_refusal)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct probe p;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	getsockname(lfd, (struct sockaddr *)&sa, &len);

	memset(&p, 0, sizeof(p));
	p.base = event_base_new();
	p.t = transport_connect(p.base, (struct sockaddr *)&sa, sizeof(sa));
	ck_assert_ptr_nonnull(p.t);
	transport_setcb(p.t, probe_read, probe_drained, probe_event, &p);
	evbuffer_add(transport_output(p.t), "AMQP", 4); /* queued while connecting */
	transport_read_enable(p.t);
	run_for(p.base, 1000);
	ck_assert_int_eq(p.last_event, TRANSPORT_CONNECTED);
	run_for(p.base, 20);
	{
		int c = accept(lfd, NULL, NULL);
		char buf[8];

		ck_assert_int_ge(c, 0);
		ck_assert_int_eq(read(c, buf, sizeof(buf)), 4);
		close(c);
	}
	transport_free(p.t);

	close(lfd); /* now nothing listens there */
	p.events = 0;
	p.t = transport_connect(p.base, (struct sockaddr *)&sa, sizeof(sa));
	if (p.t != NULL) {
		transport_setcb(p.t, probe_read, probe_drained, probe_event, &p);
		transport_read_enable(p.t);
		run_for(p.base, 1000);
		ck_assert_int_eq(p.last_event, TRANSPORT_ERROR);
		ck_assert_int_eq(p.last_err, ECONNREFUSED);
		transport_free(p.t);
	} else {
		ck_assert_int_eq(errno, ECONNREFUSED);
	}
	event_base_free(p.base);
}
END_TEST

START_TEST(read_timeout)
{
	struct probe p;
	int peer;

	pair(&p, &peer);
	transport_set_read_timeout(p.t, 100);
	transport_read_enable(p.t);
	run_for(p.base, 1000);
	ck_assert_int_eq(p.last_event, TRANSPORT_TIMEOUT);
	/* disabled reading also stops the clock */
	p.events = 0;
	transport_read_disable(p.t);
	run_for(p.base, 300);
	ck_assert_int_eq(p.events, 0);
	unpair(&p, peer);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, reads_large_chunks_then_eof);
	tcase_add_test(tc, read_high_mark_pauses_and_resumes);
	tcase_add_test(tc, stuck_writes_wait_then_drain);
	tcase_add_test(tc, connect_success_and_refusal);
	tcase_add_test(tc, read_timeout);
	return unit_run("transport", tc, 1);
}
