/* test_http: the admin server's request head parser: request lines in
 * origin and absolute form, headers and their white space, Content-Length
 * (one, repeated, malformed), Transfer-Encoding, keep-alive by version and
 * Connection, and what it refuses (400, 431, 505); percent-decoding. */
#include "tests/unit/unit.h"

#include "src/http.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
	TCase *tc = tcase_create("http");

	tcase_add_test(tc, test_request_line);
	tcase_add_test(tc, test_headers);
	tcase_add_test(tc, test_framing);
	tcase_add_test(tc, test_uri_decode);
	return unit_run("http", tc, 1);
}
