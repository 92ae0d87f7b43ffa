/* http: a small HTTP/1.1 server on bufferevents with hard bounds, for the
 * admin endpoint. A request head (request line and headers) is at most
 * HTTP_MAX_HEAD bytes and HTTP_MAX_HEADERS headers; a body is read only
 * where a route takes one, announced by Content-Length (no chunked request
 * bodies) and at most the route's max_body; the authorization is asked as
 * soon as the head is in, before a byte of the body is read. Each
 * connection has a deadline: timeout_ms idle between requests, timeout_ms
 * for a request to arrive whole once its first byte came, timeout_ms for
 * its reply to go out. Past max_connections a new connection is closed at
 * once. Keep-alive (HTTP/1.1 default, HTTP/1.0 on request) and
 * Connection: close are honoured; requests are answered one at a time. */
#ifndef ACEMQ_HTTP_H
#define ACEMQ_HTTP_H

#include <stddef.h>

struct event_base;
struct evbuffer;
struct http_server;
struct http_request;

#define HTTP_MAX_HEAD    8192
#define HTTP_MAX_HEADERS 64
/* The largest body any route may take. */
#define HTTP_MAX_BODY 65536

enum http_method {
	HTTP_GET = 1,
	HTTP_HEAD = 2,
	HTTP_POST = 4,
	HTTP_PUT = 8,
	HTTP_DELETE = 16,
	HTTP_OTHER = 32
};

/* Runs once the request is in whole (its body too); replies with
 * http_reply before it returns (a handler that does not is answered 500). */
typedef void (*http_handler_fn)(struct http_request *req, void *arg);

struct http_route {
	const char
	    *path; /* the exact path, or a prefix when it ends with '/' ("/" alone: exact) */
	unsigned methods; /* HTTP_GET | ...; GET allows HEAD too */
	size_t max_body;  /* request body bytes the route takes (0: none) */
	int open;         /* 1: no authorization asked (health checks) */
	http_handler_fn fn;
	void *arg;
};

/* Asked with the head alone, for every request but an open route's:
 * 1 authorized; 0: 401 and the body is never read. */
typedef int (*http_authorize_fn)(const struct http_request *req, void *arg);

struct http_settings {
	const char *name; /* in log lines ("admin") */
	long timeout_ms;
	int max_connections;
	http_authorize_fn authorize; /* NULL: none asked */
	void *authorize_arg;
};

/* Listen on host:port (the first address it resolves to) and serve the
 * routes (kept by reference, not copied); NULL with the reason in err. */
struct http_server *http_open(struct event_base *base, const char *host, int port,
			      const struct http_settings *set, const struct http_route *routes,
			      int nroutes, char *err, size_t errlen);
/* Stop listening and close every connection. */
void http_free(struct http_server *srv);
/* Connections open now. */
int http_connections(const struct http_server *srv);

/* A request, valid in its handler. */
enum http_method http_method(const struct http_request *req);
const char *http_path(const struct http_request *req);  /* as sent, no query */
const char *http_query(const struct http_request *req); /* "" when none */
/* The value of a header (the first of that name, case-insensitive), NULL. */
const char *http_header(const struct http_request *req, const char *name);
/* The body (empty when none). */
struct evbuffer *http_body(const struct http_request *req);

/* Add a header to the reply (before http_reply); name and value are copied. */
void http_reply_header(struct http_request *req, const char *name, const char *value);
/* Send the reply: body's contents are moved (body may be NULL); type NULL
 * means text/plain. Once per request. */
void http_reply(struct http_request *req, int code, const char *type, struct evbuffer *body);
/* A text reply. */
void http_reply_text(struct http_request *req, int code, const char *text);

/* %XX-decoded copy of s[0..len) (malloc'd); NULL for %00 or out of memory. */
char *http_uri_decode(const char *s, size_t len);

/* The request head parser, on its own for tests: buf holds the head up to
 * and including its empty line, NUL-terminated, and is cut up in place. */
struct http_head {
	char *method, *target, *path, *query;
	enum http_method m;
	int minor;           /* HTTP/1.minor */
	long long length;    /* Content-Length; -1: none */
	int chunked;         /* a Transfer-Encoding was sent */
	int keep_alive;      /* after the reply, the connection may stay */
	int expect_continue; /* Expect: 100-continue */
	int nheaders;
	struct {
		char *name, *value;
	} h[HTTP_MAX_HEADERS];
};
/* 0, or the status code the request gets (400, 431, 505). */
int http_parse_head(char *buf, struct http_head *h);

#endif
