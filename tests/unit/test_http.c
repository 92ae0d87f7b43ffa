/* test_http: the admin server's request head parser (request lines in
 * origin and absolute form, headers and their white space, Content-Length
 * one, repeated or malformed, Transfer-Encoding, keep-alive by version and
 * Connection, 400, 431 and 505) and percent-decoding; then the server
 * itself on a loop of its own, with a route that takes a body: bodies read
 * whole, 100-continue, pipelined and keep-alive requests, HEAD, 401 before
 * the body, 413 and 411 unread, a head past its bound, the deadlines and
 * the connection cap. And JSON strings written from any bytes. */
#include "tests/unit/unit.h"

#include "src/http.h"
#include "src/json.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static char buf[HTTP_MAX_HEAD * 2];

static int parse(const char *text, struct http_head *h)
{
	snprintf(buf, sizeof(buf), "%s", text);
	return http_parse_head(buf, h);
}

START_TEST(test_request_line)
{
	struct http_head h;

	ck_assert_int_eq(parse("GET /stats?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", &h), 0);
	ck_assert_str_eq(h.method, "GET");
	ck_assert_int_eq(h.m, HTTP_GET);
	ck_assert_str_eq(h.path, "/stats");
	ck_assert_str_eq(h.query, "x=1");
	ck_assert_int_eq(h.minor, 1);
	ck_assert_int_eq(h.keep_alive, 1);
	ck_assert_int_eq(h.length, -1);
	ck_assert_int_eq(h.nheaders, 1);
	/* bare LF line ends, empty lines before the request line */
	ck_assert_int_eq(parse("\r\n\nPOST /reload HTTP/1.0\n\n", &h), 0);
	ck_assert_int_eq(h.m, HTTP_POST);
	ck_assert_int_eq(h.keep_alive, 0);
	/* absolute form */
	ck_assert_int_eq(parse("GET http://h:1/rules?a HTTP/1.1\r\n\r\n", &h), 0);
	ck_assert_str_eq(h.path, "/rules");
	ck_assert_str_eq(h.query, "a");
	ck_assert_int_eq(parse("GET http://h:1 HTTP/1.1\r\n\r\n", &h), 0);
	ck_assert_str_eq(h.path, "/");
	ck_assert_int_eq(parse("PATCH / HTTP/1.1\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.m, HTTP_OTHER);

	ck_assert_int_eq(parse("GET /\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET  / HTTP/1.1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/2.0\r\n\r\n", &h), 505);
	ck_assert_int_eq(parse("GET / FTP/1.0\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("G(T / HTTP/1.1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET stats HTTP/1.1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET /a\x01 HTTP/1.1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\n", &h), 400); /* no end */
}
END_TEST

START_TEST(test_headers)
{
	struct http_head h;
	char big[HTTP_MAX_HEAD * 2];
	size_t len;
	int i;

	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nAuthorization:   bearer  t0k \t\r\n"
			       "X-Empty:\r\n\r\n",
			       &h),
			 0);
	ck_assert_int_eq(h.nheaders, 2);
	ck_assert_str_eq(h.h[0].name, "Authorization");
	ck_assert_str_eq(h.h[0].value, "bearer  t0k");
	ck_assert_str_eq(h.h[1].value, "");
	/* white space before the colon, folding, no colon, control bytes */
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nHost : a\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nnocolon\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\n: v\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nA: b\x1b[31m\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", &h), 400);
	/* at most HTTP_MAX_HEADERS */
	len = (size_t)snprintf(big, sizeof(big), "GET / HTTP/1.1\r\n");
	for (i = 0; i < HTTP_MAX_HEADERS; i++)
		len += (size_t)snprintf(big + len, sizeof(big) - len, "H%d: v\r\n", i);
	snprintf(big + len, sizeof(big) - len, "\r\n");
	ck_assert_int_eq(parse(big, &h), 0);
	ck_assert_int_eq(h.nheaders, HTTP_MAX_HEADERS);
	snprintf(big + len, sizeof(big) - len, "One-More: v\r\n\r\n");
	ck_assert_int_eq(parse(big, &h), 431);
}
END_TEST

START_TEST(test_framing)
{
	struct http_head h;

	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: 42\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.length, 42);
	ck_assert_int_eq(
	    parse("POST / HTTP/1.1\r\ncontent-length: 7\r\nContent-Length: 7\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.length, 7);
	ck_assert_int_eq(
	    parse("POST / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n", &h),
	    400);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n", &h), 400);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", &h), 400);
	ck_assert_int_eq(
	    parse("POST / HTTP/1.1\r\nContent-Length: 1000000000000000000000\r\n\r\n", &h),
	    400);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n", &h),
			 0);
	ck_assert_int_eq(h.length, 1000000000000LL);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.chunked, 1);
	ck_assert_int_eq(parse("POST / HTTP/1.1\r\nExpect: 100-Continue\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.expect_continue, 1);
	/* keep-alive: 1.1 unless close; 1.0 only when asked */
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nConnection: Keep-Alive, close\r\n\r\n", &h),
			 0);
	ck_assert_int_eq(h.keep_alive, 0);
	ck_assert_int_eq(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.keep_alive, 1);
	ck_assert_int_eq(parse("GET / HTTP/1.1\r\nConnection: closed\r\n\r\n", &h), 0);
	ck_assert_int_eq(h.keep_alive, 1);
}
END_TEST

START_TEST(test_uri_decode)
{
	char *s;

	s = http_uri_decode("a%2Fb%zz%4", 10);
	ck_assert_str_eq(s, "a/b%zz%4");
	free(s);
	s = http_uri_decode("%2f+x", 3);
	ck_assert_str_eq(s, "/");
	free(s);
	ck_assert_ptr_null(http_uri_decode("a%00b", 5));
}
END_TEST

/* ---- the server on a loop of its own ------------------------------------ */

static struct event_base *srv_base;
static struct http_server *srv;
static pthread_t srv_thread;
static int srv_port;

static void echo(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();

	evbuffer_add_printf(out, "%s %s ", http_path(req), http_query(req));
	evbuffer_add_buffer(out, http_body(req));
	http_reply(req, 200, NULL, out);
	evbuffer_free(out);
}

static void silent(struct http_request *req, void *arg)
{
	/* replies nothing: the server answers 500 */
}

static int authorize(const struct http_request *req, void *arg)
{
	const char *v = http_header(req, "x-ok");

	return v && strcmp(v, "yes") == 0;
}

static const struct http_route routes[] = {
    {"/echo", HTTP_POST | HTTP_PUT, 16, 0, echo, NULL},
    {"/get", HTTP_GET, 0, 0, echo, NULL},
    {"/open", HTTP_GET, 0, 1, echo, NULL},
    {"/silent", HTTP_GET, 0, 1, silent, NULL},
    {"/tree/", HTTP_GET, 0, 1, echo, NULL},
};

static void *srv_run(void *arg)
{
	event_base_loop(srv_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void srv_start(long timeout_ms, int max_connections)
{
	struct http_settings set = {"test", timeout_ms, max_connections, authorize, NULL};
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	char err[256];
	int fd;

	evthread_use_pthreads();
	srv_base = event_base_new();
	ck_assert_ptr_nonnull(srv_base);
	/* a free port */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	srv_port = ntohs(sa.sin_port);
	close(fd);
	srv = http_open(srv_base, "127.0.0.1", srv_port, &set, routes,
			(int)(sizeof(routes) / sizeof(routes[0])), err, sizeof(err));
	ck_assert_msg(srv != NULL, "%s", err);
	ck_assert_int_eq(pthread_create(&srv_thread, NULL, srv_run, NULL), 0);
}

static void srv_stop(void)
{
	event_base_loopbreak(srv_base);
	pthread_join(srv_thread, NULL);
	http_free(srv);
	event_base_free(srv_base);
}

static int dial(void)
{
	struct sockaddr_in sa;
	struct timeval tv = {5, 0};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)srv_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void say(int fd, const char *text)
{
	ck_assert_int_eq(send(fd, text, strlen(text), MSG_NOSIGNAL), (ssize_t)strlen(text));
}

/* Read until the peer closes (or times out: -1 in *closed); NUL-terminated. */
static char *hear_all(int fd, int *closed)
{
	static char got[65536];
	size_t n = 0;
	ssize_t r;

	while (n < sizeof(got) - 1 && (r = recv(fd, got + n, sizeof(got) - 1 - n, 0)) > 0)
		n += (size_t)r;
	got[n] = '\0';
	*closed = r == 0 || (r < 0 && errno == ECONNRESET) ? 1 : -1;
	return got;
}

/* Read until text has come (the connection stays open). */
static char *hear_until(int fd, const char *text)
{
	static char got[65536];
	size_t n = 0;
	ssize_t r;

	got[0] = '\0';
	while (strstr(got, text) == NULL && n < sizeof(got) - 1 &&
	       (r = recv(fd, got + n, sizeof(got) - 1 - n, 0)) > 0) {
		n += (size_t)r;
		got[n] = '\0';
	}
	return got;
}

START_TEST(test_server_bodies)
{
	int fd, closed;
	char *got;

	srv_start(5000, 8);
	/* a body read whole; keep-alive; pipelined requests answered in order */
	fd = dial();
	say(fd, "POST /echo?q=1 HTTP/1.1\r\nX-Ok: yes\r\nContent-Length: 5\r\n\r\nhel");
	usleep(50000);
	say(fd, "lo");
	got = hear_until(fd, "/echo q=1 hello");
	ck_assert_msg(strncmp(got, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", got);
	ck_assert_ptr_nonnull(strstr(got, "Content-Length: 15\r\n"));
	ck_assert_ptr_nonnull(strstr(got, "Connection: keep-alive\r\n"));
	say(fd, "PUT /echo HTTP/1.1\r\nX-Ok: yes\r\nContent-Length: 2\r\n\r\nabGET /get "
		"HTTP/1.1\r\nX-Ok: yes\r\n\r\nHEAD /open HTTP/1.1\r\n\r\nGET /tree/a/b "
		"HTTP/1.1\r\nConnection: close\r\n\r\n");
	got = hear_all(fd, &closed);
	ck_assert_int_eq(closed, 1);
	ck_assert_msg(strstr(got, "/echo  ab") != NULL && strstr(got, "/get  ") != NULL &&
			  strstr(got, "/tree/a/b  ") != NULL,
		      "%s", got);
	ck_assert_ptr_null(strstr(got, "/open")); /* HEAD: no body */
	ck_assert_ptr_nonnull(strstr(got, "Connection: close\r\n"));
	ck_assert(strstr(got, "/echo  ab") < strstr(got, "/get  "));
	close(fd);

	/* Expect: 100-continue */
	fd = dial();
	say(fd, "POST /echo HTTP/1.1\r\nX-Ok: yes\r\nExpect: 100-continue\r\n"
		"Content-Length: 3\r\n\r\n");
	got = hear_until(fd, "\r\n\r\n");
	ck_assert_str_eq(got, "HTTP/1.1 100 Continue\r\n\r\n");
	say(fd, "xyz");
	got = hear_until(fd, "xyz");
	ck_assert_ptr_nonnull(strstr(got, "200 OK"));
	close(fd);

	/* a handler that replies nothing; HTTP/1.0 closes */
	fd = dial();
	say(fd, "GET /silent HTTP/1.0\r\n\r\n");
	got = hear_all(fd, &closed);
	ck_assert_int_eq(closed, 1);
	ck_assert_msg(strncmp(got, "HTTP/1.1 500 ", 13) == 0, "%s", got);
	close(fd);
	srv_stop();
}
END_TEST

START_TEST(test_server_refusals)
{
	char big[HTTP_MAX_HEAD + 100];
	int fd, closed;
	char *got;

	srv_start(5000, 8);
	/* no authorization: 401 with the body announced and never sent */
	fd = dial();
	say(fd, "POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\n");
	got = hear_all(fd, &closed);
	ck_assert_int_eq(closed, 1);
	ck_assert_msg(strncmp(got, "HTTP/1.1 401 ", 13) == 0, "%s", got);
	ck_assert_ptr_nonnull(strstr(got, "WWW-Authenticate: Bearer\r\n"));
	close(fd);
	/* unknown path (after the authorization), method, sizes, chunked */
	fd = dial();
	say(fd, "GET /nope HTTP/1.1\r\nX-Ok: yes\r\n\r\n");
	ck_assert_ptr_nonnull(strstr(hear_until(fd, "not found"), " 404 "));
	say(fd, "DELETE /echo HTTP/1.1\r\nX-Ok: yes\r\n\r\n");
	got = hear_until(fd, "use POST, PUT\n");
	ck_assert_msg(strstr(got, " 405 ") && strstr(got, "Allow: POST, PUT\r\n"), "%s", got);
	say(fd, "POST /echo HTTP/1.1\r\nX-Ok: yes\r\nContent-Length: 17\r\n\r\n");
	got = hear_all(fd, &closed);
	ck_assert_int_eq(closed, 1);
	ck_assert_msg(strstr(got, " 413 ") != NULL, "%s", got);
	close(fd);
	fd = dial();
	say(fd, "POST /echo HTTP/1.1\r\nX-Ok: yes\r\nTransfer-Encoding: chunked\r\n\r\n");
	got = hear_all(fd, &closed);
	ck_assert_msg(closed == 1 && strstr(got, " 411 ") != NULL, "%s", got);
	close(fd);
	/* a head past its bound */
	fd = dial();
	memset(big, 'a', sizeof(big));
	memcpy(big, "GET /open HTTP/1.1\r\nX: ", 23);
	big[sizeof(big) - 1] = '\0';
	say(fd, big);
	got = hear_all(fd, &closed);
	ck_assert_msg(closed == 1 && strstr(got, " 431 ") != NULL, "%s", got);
	close(fd);
	fd = dial();
	{
		static const char nul[] = "GET /open HTTP/1.1\r\nX: a\0b\r\n\r\n";

		ck_assert_int_eq(send(fd, nul, sizeof(nul) - 1, MSG_NOSIGNAL),
				 (ssize_t)sizeof(nul) - 1);
	}
	got = hear_all(fd, &closed);
	ck_assert_msg(closed == 1 && strstr(got, " 400 ") != NULL, "%s", got);
	close(fd);
	srv_stop();
}
END_TEST

START_TEST(test_server_deadlines_and_cap)
{
	struct timeval t0, t1;
	int fds[4], fd, closed, i;
	char *got;
	long ms;

	srv_start(300, 3);
	/* idle, and a head that trickles in: closed at the deadline */
	fds[0] = dial();
	fds[1] = dial();
	gettimeofday(&t0, NULL);
	for (i = 0; i < 5; i++) {
		send(fds[1], "G", 1, MSG_NOSIGNAL);
		usleep(100000);
	}
	for (i = 0; i < 2; i++) {
		got = hear_all(fds[i], &closed);
		ck_assert_int_eq(closed, 1);
		ck_assert_str_eq(got, "");
		close(fds[i]);
	}
	gettimeofday(&t1, NULL);
	ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_usec - t0.tv_usec) / 1000;
	ck_assert_msg(ms < 3000, "closed after %ld ms", ms);
	srv_stop();

	srv_start(5000, 3);
	for (i = 0; i < 3; i++)
		fds[i] = dial();
	usleep(100000);
	ck_assert_int_eq(http_connections(srv), 3);
	fd = dial();
	got = hear_all(fd, &closed);
	ck_assert_int_eq(closed, 1); /* the fourth: closed at once */
	close(fd);
	close(fds[0]);
	usleep(100000);
	fds[0] = dial();
	say(fds[0], "GET /open HTTP/1.1\r\n\r\n");
	ck_assert_ptr_nonnull(strstr(hear_until(fds[0], "/open"), "200 OK"));
	for (i = 0; i < 3; i++)
		close(fds[i]);
	srv_stop();
}
END_TEST

/* What json_string writes for len bytes of s. */
static const char *json_of(const char *s, size_t len)
{
	static char text[256];
	struct evbuffer *out = evbuffer_new();

	json_string(out, s, len);
	return unit_text(out, text, sizeof(text));
}

START_TEST(test_json_string)
{
	ck_assert_str_eq(json_of("plain /vhost", 12), "\"plain /vhost\"");
	ck_assert_str_eq(json_of("a\"b\\c", 5), "\"a\\\"b\\\\c\"");
	ck_assert_str_eq(json_of("\n\x1b[2J\x7f", 6), "\"\\u000a\\u001b[2J\\u007f\"");
	ck_assert_str_eq(json_of("a\0b", 3), "\"a\\u0000b\"");
	/* Valid UTF-8 passes: 2, 3 and 4 bytes. */
	ck_assert_str_eq(json_of("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9),
			 "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
	/* Not UTF-8: a stray byte, a sequence cut short, an overlong form, a
	 * surrogate, past U+10FFFF: each byte as \u00XX. */
	ck_assert_str_eq(json_of("\xff", 1), "\"\\u00ff\"");
	ck_assert_str_eq(json_of("x\xe2\x82", 3), "\"x\\u00e2\\u0082\"");
	ck_assert_str_eq(json_of("\xc0\x80", 2), "\"\\u00c0\\u0080\"");
	ck_assert_str_eq(json_of("\xed\xa0\x80", 3), "\"\\u00ed\\u00a0\\u0080\"");
	ck_assert_str_eq(json_of("\xf4\x90\x80\x80", 4), "\"\\u00f4\\u0090\\u0080\\u0080\"");
	ck_assert_str_eq(json_of("", 0), "\"\"");
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("http");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_server_bodies);
	tcase_add_test(tc, test_server_refusals);
	tcase_add_test(tc, test_server_deadlines_and_cap);

	tcase_add_test(tc, test_request_line);
	tcase_add_test(tc, test_headers);
	tcase_add_test(tc, test_framing);
	tcase_add_test(tc, test_uri_decode);
	tcase_add_test(tc, test_json_string);
	return unit_run("http", tc, 1);
}
