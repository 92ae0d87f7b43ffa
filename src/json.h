/* json: JSON strings written from bytes anyone may have chosen (a vhost, a
 * queue, a routing key, a message id): quoted and escaped so that the
 * document stays valid whatever the bytes. Valid UTF-8 passes as it is;
 * any other byte is written as \u00XX (read as Latin-1); quotes,
 * backslashes and control characters are escaped. */
#ifndef ACEMQ_JSON_H
#define ACEMQ_JSON_H

#include <stddef.h>

struct evbuffer;

/* "s" for len bytes of s. */
void json_string(struct evbuffer *out, const char *s, size_t len);
/* "s" for a NUL-terminated s. */
void json_cstring(struct evbuffer *out, const char *s);

#endif
