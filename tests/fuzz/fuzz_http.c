/* fuzz_http: the admin server's request head parser and percent-decoding
 * on any bytes; a head that parses has a method, a path that starts with
 * "/" (or is "*"), at most HTTP_MAX_HEADERS headers with names, and a
 * Content-Length that is none or a number. */
#include "src/http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char buf[HTTP_MAX_HEAD + 1];
	struct http_head h;
	char *dec;
	int i;

	/* What the server hands the parser: at most a head's bound, no NUL. */
	if (size > HTTP_MAX_HEAD || memchr(data, '\0', size) != NULL)
		return 0;
	memcpy(buf, data, size);
	buf[size] = '\0';
	if (http_parse_head(buf, &h) == 0) {
		if (h.method == NULL || h.method[0] == '\0' || h.path == NULL ||
		    h.query == NULL || (h.path[0] != '/' && strcmp(h.path, "*") != 0) ||
		    h.nheaders < 0 || h.nheaders > HTTP_MAX_HEADERS || h.length < -1)
			abort();
		for (i = 0; i < h.nheaders; i++)
			if (h.h[i].name[0] == '\0' || h.h[i].value == NULL)
				abort();
	}
	dec = http_uri_decode((const char *)data, size);
	if (dec && strlen(dec) > size)
		abort();
	free(dec);
	return 0;
}
