/* json: JSON strings from arbitrary bytes (see json.h). */
#include "json.h"

#include <event2/buffer.h>
#include <stdint.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s[0..len) that starts past
 * ASCII, or 0: overlong forms, surrogates and code points past U+10FFFF
 * are not valid. */
static size_t json_utf8(const unsigned char *s, size_t len)
{
	unsigned char lo = 0x80, hi = 0xbf;
	size_t n, i;

	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4;
	else
		return 0;
	if (s[0] == 0xe0)
		lo = 0xa0;
	else if (s[0] == 0xed)
		hi = 0x9f;
	else if (s[0] == 0xf0)
		lo = 0x90;
	else if (s[0] == 0xf4)
		hi = 0x8f;
	if (len < n || s[1] < lo || s[1] > hi)
		return 0;
	for (i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

void json_string(struct evbuffer *out, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, run = 0, n;

	evbuffer_add(out, "\"", 1);
	while (i < len) {
		unsigned char c = u[i];

		if (c >= 0x20 && c != '"' && c != '\\' && c < 0x7f) {
			i++;
			run++;
			continue;
		}
		n = c >= 0x80 ? json_utf8(u + i, len - i) : 0;
		if (n) {
			i += n;
			run += n;
			continue;
		}
		if (run)
			evbuffer_add(out, s + i - run, run);
		run = 0;
		if (c == '"' || c == '\\')
			evbuffer_add_printf(out, "\\%c", c);
		else
			evbuffer_add_printf(out, "\\u%04x", c);
		i++;
	}
	if (run)
		evbuffer_add(out, s + len - run, run);
	evbuffer_add(out, "\"", 1);
}

void json_cstring(struct evbuffer *out, const char *s)
{
	json_string(out, s, strlen(s));
}
