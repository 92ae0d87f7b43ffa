/* proxyproto: the PROXY protocol header (v1 text, v2 binary) that a load
 * balancer puts before a connection's first byte: read it, or write v2 for
 * the broker. Parsers return OK / AGAIN / ERROR and never allocate. */
#include "proxyproto.h"

#include "../src/debug.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

static const uint8_t proxyproto_sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
					   0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

/* How many of the first bytes agree with prefix: a partial match is AGAIN. */
static int proxyproto_prefix(const uint8_t *p, size_t len, const void *prefix, size_t n)
{
	size_t k = len < n ? len : n;

	if (memcmp(p, prefix, k) != 0)
		return PROXYPROTO_ERROR;
	return k < n ? PROXYPROTO_AGAIN : PROXYPROTO_OK;
}

static int proxyproto_v2(const uint8_t *p, size_t len, size_t *used,
			 struct proxyproto_addr *out)
{
	size_t body;
	uint8_t cmd, fam;

	if (len < 16)
		return PROXYPROTO_AGAIN;
	if ((p[12] & 0xF0) != 0x20)
		return PROXYPROTO_ERROR;
	cmd = p[12] & 0x0F;
	fam = p[13];
	body = (size_t)p[14] << 8 | p[15];
	if (cmd > 1)
		return PROXYPROTO_ERROR;
	if (len < 16 + body)
		return PROXYPROTO_AGAIN;
	memset(out, 0, sizeof(*out));
	*used = 16 + body;
	if (cmd == 0 || fam == 0x00) {
		out->local = 1; /* LOCAL, or UNSPEC: the socket's own addresses */
		return PROXYPROTO_OK;
	}
	if (fam == 0x11) { /* TCP over IPv4 */
		struct sockaddr_in *s = (struct sockaddr_in *)&out->src;
		struct sockaddr_in *d = (struct sockaddr_in *)&out->dst;

		if (body < 12)
			return PROXYPROTO_ERROR;
		s->sin_family = d->sin_family = AF_INET;
		memcpy(&s->sin_addr, p + 16, 4);
		memcpy(&d->sin_addr, p + 20, 4);
		memcpy(&s->sin_port, p + 24, 2);
		memcpy(&d->sin_port, p + 26, 2);
		out->srclen = out->dstlen = sizeof(struct sockaddr_in);
		return PROXYPROTO_OK;
	}
	if (fam == 0x21) { /* TCP over IPv6 */
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&out->src;
		struct sockaddr_in6 *d = (struct sockaddr_in6 *)&out->dst;

		if (body < 36)
			return PROXYPROTO_ERROR;
		s->sin6_family = d->sin6_family = AF_INET6;
		memcpy(&s->sin6_addr, p + 16, 16);
		memcpy(&d->sin6_addr, p + 32, 16);
		memcpy(&s->sin6_port, p + 48, 2);
		memcpy(&d->sin6_port, p + 50, 2);
		out->srclen = out->dstlen = sizeof(struct sockaddr_in6);
		return PROXYPROTO_OK;
	}
	return PROXYPROTO_ERROR; /* UDP and UNIX sockets are not AMQP's */
}

/* One space-separated field of a v1 line into buf; NULL if absent or too long. */
static const char *proxyproto_field(const char *s, const char *end, char *buf, size_t size)
{
	size_t n = 0;

	while (s < end && *s != ' ') {
		if (n + 1 >= size)
			return NULL;
		buf[n++] = *s++;
	}
	buf[n] = '\0';
	if (n == 0)
		return NULL;
	return s < end ? s + 1 : s;
}

static int proxyproto_port(const char *text, uint16_t *port)
{
	unsigned long v = 0;
	size_t i;

	if (text[0] == '\0' || (text[0] == '0' && text[1] != '\0'))
		return -1;
	for (i = 0; text[i]; i++) {
		if (text[i] < '0' || text[i] > '9' || i >= 5)
			return -1;
		v = v * 10 + (unsigned long)(text[i] - '0');
	}
	if (v > 65535)
		return -1;
	*port = htons((uint16_t)v);
	return 0;
}

static int proxyproto_v1(const uint8_t *p, size_t len, size_t *used,
			 struct proxyproto_addr *out)
{
	const char *line = (const char *)p, *end, *s;
	char proto[8], a[48], b[48], sp[8], dp[8];
	size_t i, n = len < PROXYPROTO_V1_MAX ? len : PROXYPROTO_V1_MAX;
	uint16_t sport, dport;

	for (i = 0; i + 1 < n; i++)
		if (p[i] == '\r' && p[i + 1] == '\n')
			break;
	if (i + 1 >= n)
		return len < PROXYPROTO_V1_MAX ? PROXYPROTO_AGAIN : PROXYPROTO_ERROR;
	/* "PROXY " matched, and holds no CR: the line's end is past it. */
	ACEMQ_ASSERT(i >= 6);
	end = line + i;
	memset(out, 0, sizeof(*out));
	*used = i + 2;
	s = line + 6; /* "PROXY " */
	if ((s = proxyproto_field(s, end, proto, sizeof(proto))) == NULL)
		return PROXYPROTO_ERROR;
	if (strcmp(proto, "UNKNOWN") == 0) {
		out->local = 1;
		return PROXYPROTO_OK;
	}
	if ((s = proxyproto_field(s, end, a, sizeof(a))) == NULL ||
	    (s = proxyproto_field(s, end, b, sizeof(b))) == NULL ||
	    (s = proxyproto_field(s, end, sp, sizeof(sp))) == NULL ||
	    proxyproto_field(s, end, dp, sizeof(dp)) == NULL)
		return PROXYPROTO_ERROR;
	if (memchr(s, ' ', (size_t)(end - s)) != NULL)
		return PROXYPROTO_ERROR; /* a sixth field */
	if (proxyproto_port(sp, &sport) != 0 || proxyproto_port(dp, &dport) != 0)
		return PROXYPROTO_ERROR;
	if (strcmp(proto, "TCP4") == 0) {
		struct sockaddr_in *src = (struct sockaddr_in *)&out->src;
		struct sockaddr_in *dst = (struct sockaddr_in *)&out->dst;

		src->sin_family = dst->sin_family = AF_INET;
		if (inet_pton(AF_INET, a, &src->sin_addr) != 1 ||
		    inet_pton(AF_INET, b, &dst->sin_addr) != 1)
			return PROXYPROTO_ERROR;
		src->sin_port = sport;
		dst->sin_port = dport;
		out->srclen = out->dstlen = sizeof(struct sockaddr_in);
		return PROXYPROTO_OK;
	}
	if (strcmp(proto, "TCP6") == 0) {
		struct sockaddr_in6 *src = (struct sockaddr_in6 *)&out->src;
		struct sockaddr_in6 *dst = (struct sockaddr_in6 *)&out->dst;

		src->sin6_family = dst->sin6_family = AF_INET6;
		if (inet_pton(AF_INET6, a, &src->sin6_addr) != 1 ||
		    inet_pton(AF_INET6, b, &dst->sin6_addr) != 1)
			return PROXYPROTO_ERROR;
		src->sin6_port = sport;
		dst->sin6_port = dport;
		out->srclen = out->dstlen = sizeof(struct sockaddr_in6);
		return PROXYPROTO_OK;
	}
	return PROXYPROTO_ERROR;
}

int proxyproto_parse(const uint8_t *p, size_t len, size_t *used, struct proxyproto_addr *out)
{
	int rc;

	if (len == 0)
		return PROXYPROTO_AGAIN;
	if (p[0] == proxyproto_sig[0]) {
		rc = proxyproto_prefix(p, len, proxyproto_sig, sizeof(proxyproto_sig));
		return rc == PROXYPROTO_OK ? proxyproto_v2(p, len, used, out) : rc;
	}
	rc = proxyproto_prefix(p, len, "PROXY ", 6);
	return rc == PROXYPROTO_OK ? proxyproto_v1(p, len, used, out) : rc;
}

size_t proxyproto_write_v2(uint8_t *out, const struct sockaddr *src, const struct sockaddr *dst)
{
	memcpy(out, proxyproto_sig, sizeof(proxyproto_sig));
	if (src && dst && src->sa_family == AF_INET && dst->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)src;
		const struct sockaddr_in *d = (const struct sockaddr_in *)dst;

		out[12] = 0x21;
		out[13] = 0x11;
		out[14] = 0;
		out[15] = 12;
		memcpy(out + 16, &s->sin_addr, 4);
		memcpy(out + 20, &d->sin_addr, 4);
		memcpy(out + 24, &s->sin_port, 2);
		memcpy(out + 26, &d->sin_port, 2);
		return 28;
	}
	if (src && dst && src->sa_family == AF_INET6 && dst->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)src;
		const struct sockaddr_in6 *d = (const struct sockaddr_in6 *)dst;

		out[12] = 0x21;
		out[13] = 0x21;
		out[14] = 0;
		out[15] = 36;
		memcpy(out + 16, &s->sin6_addr, 16);
		memcpy(out + 32, &d->sin6_addr, 16);
		memcpy(out + 48, &s->sin6_port, 2);
		memcpy(out + 50, &d->sin6_port, 2);
		return 52;
	}
	out[12] = 0x20; /* LOCAL */
	out[13] = 0x00;
	out[14] = 0;
	out[15] = 0;
	return 16;
}
