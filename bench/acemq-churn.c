/* acemq-churn: the load of bench/churn, from C so that the load generator
 * costs little next to what it measures. Each cycle is what a PHP request
 * does: connect, the handshake (PLAIN guest/guest), channel.open,
 * confirm.select, one 256-byte publish to the default exchange, its
 * confirm, connection.close. CONCURRENCY threads run COUNT cycles each, one
 * after another, with blocking sockets.
 *     acemq-churn PORT VHOST QUEUE COUNT CONCURRENCY
 * Prints the cycles per second on its first line, then each cycle's time in
 * microseconds, one a line. Exits 1 on the first failure, saying why. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHURN_BODY 256

struct churn_wire {
	uint8_t bytes[1024];
	size_t len;
};

/* The frames a cycle sends, encoded once. */
static struct churn_wire churn_start_ok, churn_open, churn_channel, churn_publish, churn_close;
static int churn_port, churn_count;
static double *churn_times; /* seconds, churn_count per thread */

static void churn_put(struct churn_wire *w, const void *p, size_t n)
{
	if (w->len + n > sizeof(w->bytes)) {
		fprintf(stderr, "acemq-churn: a frame does not fit\n");
		exit(2);
	}
	memcpy(w->bytes + w->len, p, n);
	w->len += n;
}

static void churn_u8(struct churn_wire *w, uint8_t v)
{
	churn_put(w, &v, 1);
}

static void churn_u16(struct churn_wire *w, uint16_t v)
{
	uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};

	churn_put(w, b, 2);
}

static void churn_u32(struct churn_wire *w, uint32_t v)
{
	churn_u16(w, (uint16_t)(v >> 16));
	churn_u16(w, (uint16_t)v);
}

static void churn_shortstr(struct churn_wire *w, const char *s)
{
	size_t n = strlen(s);

	if (n > 255) {
		fprintf(stderr, "acemq-churn: %s: longer than a shortstr\n", s);
		exit(2);
	}
	churn_u8(w, (uint8_t)n);
	churn_put(w, s, n);
}

/* A frame of kind on channel around payload, appended to w. */
static void churn_frame(struct churn_wire *w, uint8_t kind, uint16_t channel,
			const struct churn_wire *payload)
{
	churn_u8(w, kind);
	churn_u16(w, channel);
	churn_u32(w, (uint32_t)payload->len);
	churn_put(w, payload->bytes, payload->len);
	churn_u8(w, 0xce);
}

static void churn_method(struct churn_wire *w, uint16_t channel, uint16_t cls, uint16_t mid,
			 const struct churn_wire *args)
{
	struct churn_wire p = {.len = 0};

	churn_u16(&p, cls);
	churn_u16(&p, mid);
	if (args)
		churn_put(&p, args->bytes, args->len);
	churn_frame(w, 1, channel, &p);
}

static void churn_encode(const char *vhost, const char *queue)
{
	struct churn_wire a = {.len = 0}, b = {.len = 0};
	uint8_t body[CHURN_BODY];

	churn_u32(&a, 0); /* client-properties: none */
	churn_shortstr(&a, "PLAIN");
	churn_u32(&a, 12);
	churn_put(&a, "\0guest\0guest", 12);
	churn_shortstr(&a, "en_US");
	churn_method(&churn_start_ok, 0, 10, 11, &a);

	a.len = 0; /* tune-ok and open, sent together */
	churn_u16(&a, 2047);
	churn_u32(&a, 131072);
	churn_u16(&a, 0);
	churn_method(&churn_open, 0, 10, 31, &a);
	a.len = 0;
	churn_shortstr(&a, vhost);
	churn_shortstr(&a, "");
	churn_u8(&a, 0);
	churn_method(&churn_open, 0, 10, 40, &a);

	a.len = 0; /* channel.open and confirm.select */
	churn_shortstr(&a, "");
	churn_method(&churn_channel, 1, 20, 10, &a);
	a.len = 0;
	churn_u8(&a, 0);
	churn_method(&churn_channel, 1, 85, 10, &a);

	a.len = 0; /* basic.publish, its header, its body */
	churn_u16(&a, 0);
	churn_shortstr(&a, "");
	churn_shortstr(&a, queue);
	churn_u8(&a, 0);
	churn_method(&churn_publish, 1, 60, 40, &a);
	b.len = 0;
	churn_u16(&b, 60);
	churn_u16(&b, 0);
	churn_u32(&b, 0);
	churn_u32(&b, CHURN_BODY);
	churn_u16(&b, 0);
	churn_frame(&churn_publish, 2, 1, &b);
	memset(body, 'x', sizeof(body));
	b.len = 0;
	churn_put(&b, body, sizeof(body));
	churn_frame(&churn_publish, 3, 1, &b);

	a.len = 0;
	churn_u16(&a, 200);
	churn_shortstr(&a, "bye");
	churn_u16(&a, 0);
	churn_u16(&a, 0);
	churn_method(&churn_close, 0, 10, 50, &a);
}

struct churn_conn {
	int fd;
	uint8_t buf[65536];
	size_t have;
};

static void churn_fail(const char *what)
{
	fprintf(stderr, "acemq-churn: %s\n", what);
	exit(1);
}

static void churn_send(struct churn_conn *c, const struct churn_wire *w)
{
	size_t off = 0;

	while (off < w->len) {
		ssize_t n = send(c->fd, w->bytes + off, w->len - off, MSG_NOSIGNAL);

		if (n <= 0)
			churn_fail("send failed");
		off += (size_t)n;
	}
}

/* Read frames until a method frame; fail unless it is cls.mid. */
static void churn_expect(struct churn_conn *c, uint16_t cls, uint16_t mid)
{
	for (;;) {
		while (c->have >= 7) {
			const uint8_t *p = c->buf;
			uint32_t size = (uint32_t)p[3] << 24 | (uint32_t)p[4] << 16 |
					(uint32_t)p[5] << 8 | p[6];
			size_t whole;
			uint16_t gc, gm;

			if (size > sizeof(c->buf) - 8)
				churn_fail("a frame larger than the read buffer");
			whole = (size_t)size + 8;
			if (c->have < whole)
				break;
			gc = p[0] == 1 && size >= 4 ? (uint16_t)(p[7] << 8 | p[8]) : 0;
			gm = p[0] == 1 && size >= 4 ? (uint16_t)(p[9] << 8 | p[10]) : 0;
			memmove(c->buf, c->buf + whole, c->have - whole);
			c->have -= whole;
			if (gc == 0)
				continue; /* not a method (a heartbeat) */
			if (gc != cls || gm != mid) {
				char msg[96];

				snprintf(msg, sizeof(msg), "expected method %u.%u, got %u.%u",
					 cls, mid, gc, gm);
				churn_fail(msg);
			}
			return;
		}
		ssize_t n = recv(c->fd, c->buf + c->have, sizeof(c->buf) - c->have, 0);

		if (n <= 0)
			churn_fail("the connection closed");
		c->have += (size_t)n;
	}
}

static double churn_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double churn_cycle(struct churn_conn *c)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)churn_port)};
	static const struct churn_wire header = {.bytes = "AMQP\0\0\x09\x01", .len = 8};
	double t0 = churn_now();
	int one = 1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	c->fd = socket(AF_INET, SOCK_STREAM, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		churn_fail("cannot connect");
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->have = 0;
	churn_send(c, &header);
	churn_expect(c, 10, 10);
	churn_send(c, &churn_start_ok);
	churn_expect(c, 10, 30);
	churn_send(c, &churn_open);
	churn_expect(c, 10, 41);
	churn_send(c, &churn_channel);
	churn_expect(c, 20, 11);
	churn_expect(c, 85, 11);
	churn_send(c, &churn_publish);
	churn_expect(c, 60, 80);
	churn_send(c, &churn_close);
	churn_expect(c, 10, 51);
	close(c->fd);
	return churn_now() - t0;
}

static void *churn_thread(void *arg)
{
	double *times = arg;
	struct churn_conn *c = malloc(sizeof(*c));
	int i;

	if (c == NULL)
		churn_fail("out of memory");
	for (i = 0; i < churn_count; i++)
		times[i] = churn_cycle(c);
	free(c);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t *threads;
	int conc, i, j;
	double t0, elapsed;

	if (argc != 6) {
		fprintf(stderr, "usage: acemq-churn PORT VHOST QUEUE COUNT CONCURRENCY\n");
		return 2;
	}
	churn_port = atoi(argv[1]);
	churn_count = atoi(argv[4]);
	conc = atoi(argv[5]);
	if (churn_port <= 0 || churn_port > 65535 || churn_count <= 0 || conc <= 0 ||
	    conc > 1024) {
		fprintf(stderr, "acemq-churn: bad PORT, COUNT or CONCURRENCY\n");
		return 2;
	}
	churn_encode(argv[2], argv[3]);
	churn_times = calloc((size_t)churn_count * (size_t)conc, sizeof(*churn_times));
	threads = calloc((size_t)conc, sizeof(*threads));
	if (churn_times == NULL || threads == NULL)
		churn_fail("out of memory");
	t0 = churn_now();
	for (i = 0; i < conc; i++)
		if (pthread_create(&threads[i], NULL, churn_thread,
				   churn_times + (size_t)i * (size_t)churn_count) != 0)
			churn_fail("cannot start a thread");
	for (i = 0; i < conc; i++)
		pthread_join(threads[i], NULL);
	elapsed = churn_now() - t0;
	printf("%.1f\n", (double)churn_count * conc / elapsed);
	for (i = 0; i < conc; i++)
		for (j = 0; j < churn_count; j++)
			printf("%.0f\n",
			       churn_times[(size_t)i * (size_t)churn_count + (size_t)j] * 1e6);
	free(threads);
	free(churn_times);
	return 0;
}
