/* log: one line per event on stderr, filtered by level, escaped as a
 * whole so that peer data cannot forge a line or reach a terminal raw. */
#include "log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

/* The formatted message before escaping, and the line as written: room
 * for every byte of the message escaped, within one atomic pipe write. */
#define LOG_MESSAGE 1000
#define LOG_LINE    4096

enum log_level log_threshold = LOG_INFO;

static const char *const log_names[] = {"error", "warning", "info", "debug"};

int log_level_parse(const char *name, enum log_level *out)
{
	unsigned i;

	for (i = 0; i < sizeof(log_names) / sizeof(log_names[0]); i++) {
		if (strcasecmp(name, log_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	if (strcasecmp(name, "warn") == 0) {
		*out = LOG_WARNING;
		return 0;
	}
	return -1;
}

const char *log_level_name(enum log_level level)
{
	return log_names[level];
}

/* The length of the well-formed UTF-8 sequence of 2 to 4 bytes at p (n
 * bytes left), or 0 (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF); *cp is its code point. */
static size_t log_utf8(const unsigned char *p, size_t n, uint32_t *cp)
{
	unsigned char lo = 0x80, hi = 0xbf;
	size_t len, i;

	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		len = 2;
		*cp = p[0] & 0x1f;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		len = 3;
		*cp = p[0] & 0x0f;
		if (p[0] == 0xe0)
			lo = 0xa0;
		else if (p[0] == 0xed)
			hi = 0x9f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		len = 4;
		*cp = p[0] & 0x07;
		if (p[0] == 0xf0)
			lo = 0x90;
		else if (p[0] == 0xf4)
			hi = 0x8f;
	} else {
		return 0;
	}
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		*cp = (*cp << 6) | (p[i] & 0x3f);
	}
	return len;
}

size_t log_escape(char *out, size_t cap, const char *in, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)in;
	size_t i = 0, o = 0, n, k;
	uint32_t cp;
	int esc;

	if (cap == 0)
		return 0;
	while (i < len) {
		if (p[i] >= 0x20 && p[i] < 0x7f) {
			n = 1;
			esc = 0;
		} else if (p[i] < 0x80) {
			n = 1;
			esc = 1; /* C0 and DEL */
		} else if ((n = log_utf8(p + i, len - i, &cp)) != 0) {
			/* C1, and the separators a viewer may take for a newline. */
			esc = cp < 0xa0 || cp == 0x2028 || cp == 0x2029;
		} else {
			n = 1;
			esc = 1; /* not UTF-8 */
		}
		if (p[i] == '\\') {
			if (cap - o < 3)
				break;
			out[o++] = '\\';
			out[o++] = '\\';
		} else if (esc) {
			if (cap - o < 4 * n + 1)
				break;
			for (k = 0; k < n; k++) {
				out[o++] = '\\';
				out[o++] = 'x';
				out[o++] = hex[p[i + k] >> 4];
				out[o++] = hex[p[i + k] & 15];
			}
		} else {
			if (cap - o < n + 1)
				break;
			memcpy(out + o, p + i, n);
			o += n;
		}
		i += n;
	}
	out[o] = '\0';
	return o;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	char msg[LOG_MESSAGE], line[LOG_LINE];
	struct timeval tv;
	struct tm tm;
	size_t n, mlen;
	va_list ap;
	int r;

	if (level > log_threshold)
		return;
	va_start(ap, fmt);
	r = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r < 0)
		r = 0;
	mlen = (size_t)r < sizeof(msg) ? (size_t)r : sizeof(msg) - 1;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03dZ %s ",
			      (int)(tv.tv_usec / 1000), log_names[level]);
	/* The prefix is short: the message has the rest, less the newline. */
	n += log_escape(line + n, sizeof(line) - n - 1, msg, mlen);
	line[n++] = '\n';
	fwrite(line, 1, n, stderr);
}
