/* test_proxyproto: PROXY protocol v1 and v2 headers read (whole, cut
 * short, malformed, LOCAL and UNKNOWN, TLVs skipped) and v2 written and
 * read back. */
#include "tests/unit/unit.h"

#include "amqp/proxyproto.h"

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <string.h>

static const char *addr4(const struct sockaddr_storage *ss, char *buf, uint16_t *port)
{
	const struct sockaddr_in *s = (const struct sockaddr_in *)ss;

	*port = ntohs(s->sin_port);
	return inet_ntop(AF_INET, &s->sin_addr, buf, 64);
}

START_TEST(test_v1)
{
	const char *line = "PROXY TCP4 192.0.2.7 198.51.100.1 56324 5673\r\nAMQP";
	struct proxyproto_addr a;
	size_t used = 0, i;
	char buf[64];
	uint16_t port;

	ck_assert_int_eq(proxyproto_parse((const uint8_t *)line, strlen(line), &used, &a),
			 PROXYPROTO_OK);
	ck_assert_int_eq(used, strlen(line) - 4);
	ck_assert_str_eq(addr4(&a.src, buf, &port), "192.0.2.7");
	ck_assert_int_eq(port, 56324);
	ck_assert_str_eq(addr4(&a.dst, buf, &port), "198.51.100.1");
	ck_assert_int_eq(port, 5673);
	/* Every cut before the CRLF wants more. */
	for (i = 0; i < used - 1; i++)
		ck_assert_int_eq(proxyproto_parse((const uint8_t *)line, i, &used, &a),
				 PROXYPROTO_AGAIN);

	line = "PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n";
	ck_assert_int_eq(proxyproto_parse((const uint8_t *)line, strlen(line), &used, &a),
			 PROXYPROTO_OK);
	ck_assert_int_eq(a.src.ss_family, AF_INET6);
	line = "PROXY UNKNOWN\r\n";
	ck_assert_int_eq(proxyproto_parse((const uint8_t *)line, strlen(line), &used, &a),
			 PROXYPROTO_OK);
	ck_assert_int_eq(a.local, 1);
}
END_TEST

START_TEST(test_v1_bad)
{
	static const char *const bad[] = {
	    "AMQP\x00\x00\x09\x01",
	    "PROXY TCP4 192.0.2.7 198.51.100.1 56324\r\n",
	    "PROXY TCP4 192.0.2.7 198.51.100.1 56324 5673 9\r\n",
	    "PROXY TCP4 192.0.2.700 198.51.100.1 1 2\r\n",
	    "PROXY TCP4 2001:db8::1 198.51.100.1 1 2\r\n",
	    "PROXY TCP4 192.0.2.7 198.51.100.1 65536 2\r\n",
	    "PROXY TCP4 192.0.2.7 198.51.100.1 -1 2\r\n",
	    "PROXY TCP4 192.0.2.7 198.51.100.1 01 2\r\n",
	    "PROXY UDP4 192.0.2.7 198.51.100.1 1 2\r\n",
	    "PROXY  TCP4 192.0.2.7 198.51.100.1 1 2\r\n",
	};
	char longline[200];
	struct proxyproto_addr a;
	size_t used, i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(proxyproto_parse((const uint8_t *)bad[i],
					       strlen(bad[i]) ? strlen(bad[i]) : 8, &used,
					       &a) == PROXYPROTO_ERROR,
			      "accepted: %s", bad[i]);
	/* No CRLF within the longest line a v1 header may have. */
	memset(longline, 'x', sizeof(longline));
	memcpy(longline, "PROXY TCP4 ", 11);
	ck_assert_int_eq(
	    proxyproto_parse((const uint8_t *)longline, sizeof(longline), &used, &a),
	    PROXYPROTO_ERROR);
}
END_TEST

START_TEST(test_v2_round_trip)
{
	struct sockaddr_in s = {0}, d = {0};
	struct sockaddr_in6 s6 = {0}, d6 = {0};
	uint8_t out[PROXYPROTO_V2_MAX + 8];
	struct proxyproto_addr a;
	size_t n, used, i;
	char buf[64];
	uint16_t port;

	s.sin_family = d.sin_family = AF_INET;
	inet_pton(AF_INET, "203.0.113.9", &s.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &d.sin_addr);
	s.sin_port = htons(40000);
	d.sin_port = htons(5672);
	n = proxyproto_write_v2(out, (struct sockaddr *)&s, (struct sockaddr *)&d);
	ck_assert_int_eq(n, 28);
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_OK);
	ck_assert_int_eq(used, 28);
	ck_assert_str_eq(addr4(&a.src, buf, &port), "203.0.113.9");
	ck_assert_int_eq(port, 40000);
	for (i = 0; i < n; i++)
		ck_assert_int_eq(proxyproto_parse(out, i, &used, &a), PROXYPROTO_AGAIN);

	s6.sin6_family = d6.sin6_family = AF_INET6;
	inet_pton(AF_INET6, "2001:db8::9", &s6.sin6_addr);
	inet_pton(AF_INET6, "::1", &d6.sin6_addr);
	n = proxyproto_write_v2(out, (struct sockaddr *)&s6, (struct sockaddr *)&d6);
	ck_assert_int_eq(n, 52);
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_OK);
	ck_assert_int_eq(a.src.ss_family, AF_INET6);

	/* Mixed families are written as LOCAL. */
	n = proxyproto_write_v2(out, (struct sockaddr *)&s, (struct sockaddr *)&d6);
	ck_assert_int_eq(n, 16);
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_OK);
	ck_assert_int_eq(a.local, 1);
}
END_TEST

START_TEST(test_v2_tlv_and_bad)
{
	struct sockaddr_in s = {0}, d = {0};
	uint8_t out[64];
	struct proxyproto_addr a;
	size_t n, used;

	s.sin_family = d.sin_family = AF_INET;
	n = proxyproto_write_v2(out, (struct sockaddr *)&s, (struct sockaddr *)&d);
	/* A TLV after the addresses: skipped. */
	out[15] = 12 + 5;
	memcpy(out + n, "\x04\x00\x02zz", 5);
	ck_assert_int_eq(proxyproto_parse(out, n + 5, &used, &a), PROXYPROTO_OK);
	ck_assert_int_eq(used, n + 5);
	/* Version 1 in the binary form, an unknown command, a short block. */
	out[15] = 12;
	out[12] = 0x11;
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_ERROR);
	out[12] = 0x22;
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_ERROR);
	out[12] = 0x21;
	out[15] = 4;
	ck_assert_int_eq(proxyproto_parse(out, 20, &used, &a), PROXYPROTO_ERROR);
	/* UDP */
	out[13] = 0x12;
	out[15] = 12;
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_ERROR);
	/* The signature wrong half way. */
	out[5] = 0;
	ck_assert_int_eq(proxyproto_parse(out, n, &used, &a), PROXYPROTO_ERROR);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("proxyproto");

	tcase_add_test(tc, test_v1);
	tcase_add_test(tc, test_v1_bad);
	tcase_add_test(tc, test_v2_round_trip);
	tcase_add_test(tc, test_v2_tlv_and_bad);
	return unit_run("proxyproto", tc, 0);
}
