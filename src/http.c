/* http: a small HTTP/1.1 server on bufferevents with hard bounds on what a
 * peer may make it hold (see http.h), for the admin endpoint. */
#include "http.h"

#include "listener.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

/* How long a closing connection is read (and the bytes dropped) after its
 * last reply went out, so the reply is not lost to a reset. */
#define HTTP_LINGER_MS 2000
/* A listener that cannot accept (out of descriptors) rests this long. */
#define HTTP_PAUSE_MS 100

enum http_state {
	HTTP_IDLE,      /* between requests */
	HTTP_READ_HEAD, /* a request began: its head is coming */
	HTTP_READ_BODY, /* its head is in and allowed: its body is coming */
	HTTP_WRITING,   /* its reply is going out; nothing more is read */
	HTTP_LINGER     /* the last reply went out: reading and dropping till EOF */
};

struct http_request {
	struct http_conn *conn;
	char *head; /* the head as received, cut up by the parser */
	struct http_head h;
	const struct http_route *route;
	struct evbuffer *body;
	struct evbuffer *headers; /* extra reply headers */
	size_t need;              /* body bytes still to come */
	int replied;
};

struct http_conn {
	struct http_server *srv;
	struct bufferevent *bev;
	struct event *timer;
	enum http_state state;
	int close_after;
	size_t scanned; /* head bytes looked at for its end */
	struct http_request req;
	struct http_conn *prev, *next;
};

struct http_server {
	struct event_base *base;
	struct evconnlistener *lst;
	struct event *pause;
	struct http_settings set;
	const struct http_route *routes;
	int nroutes;
	size_t max_body; /* the largest any route takes */
	struct http_conn *conns;
	int nconns;
	int full; /* at max_connections: logged once until one is accepted */
};

static char http_root[] = "/";
static char http_empty[] = "";

/* ---- the request head ---------------------------------------------------- */

static int http_tchar(unsigned char c)
{
	return c && (isalnum(c) || strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Cut the next line off *p (its CR LF or LF replaced by NULs); NULL when
 * no line ends before the end of the text. */
static char *http_line(char **p)
{
	char *s = *p, *nl = strchr(s, '\n');

	if (nl == NULL)
		return NULL;
	*p = nl + 1;
	if (nl > s && nl[-1] == '\r')
		nl[-1] = '\0';
	*nl = '\0';
	return s;
}

/* Whether a comma-separated header value lists token (case-insensitive). */
static int http_lists(const char *value, const char *token)
{
	size_t n = strlen(token);

	while (*value) {
		size_t len;

		while (*value == ' ' || *value == '\t' || *value == ',')
			value++;
		len = strcspn(value, ", \t");
		if (len == n && strncasecmp(value, token, n) == 0)
			return 1;
		value += len;
	}
	return 0;
}

static int http_content_length(const char *v, long long *out)
{
	long long n = 0;
	size_t i;

	if (v[0] == '\0' || strlen(v) > 18)
		return -1;
	for (i = 0; v[i]; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		n = n * 10 + (v[i] - '0');
	}
	if (*out >= 0 && *out != n)
		return -1; /* two lengths that differ */
	*out = n;
	return 0;
}

static int http_request_line(char *line, struct http_head *h)
{
	static const struct {
		const char *name;
		enum http_method m;
	} methods[] = {{"GET", HTTP_GET},
		       {"HEAD", HTTP_HEAD},
		       {"POST", HTTP_POST},
		       {"PUT", HTTP_PUT},
		       {"DELETE", HTTP_DELETE}};
	char *sp, *version, *q;
	size_t i;

	h->method = line;
	if ((sp = strchr(line, ' ')) == NULL)
		return 400;
	*sp = '\0';
	h->target = sp + 1;
	if ((sp = strchr(h->target, ' ')) == NULL)
		return 400;
	*sp = '\0';
	version = sp + 1;
	if (h->method[0] == '\0' || h->target[0] == '\0')
		return 400;
	for (i = 0; h->method[i]; i++)
		if (!http_tchar((unsigned char)h->method[i]))
			return 400;
	for (i = 0; h->target[i]; i++)
		if ((unsigned char)h->target[i] <= 0x20 || h->target[i] == 0x7f)
			return 400;
	if (strncmp(version, "HTTP/", 5) != 0)
		return 400;
	if (strcmp(version, "HTTP/1.1") == 0)
		h->minor = 1;
	else if (strcmp(version, "HTTP/1.0") == 0)
		h->minor = 0;
	else
		return 505;
	h->keep_alive = h->minor >= 1;
	h->m = HTTP_OTHER;
	for (i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
		if (strcmp(h->method, methods[i].name) == 0)
			h->m = methods[i].m;
	/* origin-form, or absolute-form (the path past the authority) */
	if (h->target[0] == '/') {
		h->path = h->target;
	} else if (strncasecmp(h->target, "http://", 7) == 0 ||
		   strncasecmp(h->target, "https://", 8) == 0) {
		char *auth = strstr(h->target, "//") + 2;

		h->path = auth + strcspn(auth, "/?");
		if (*h->path != '/') {
			/* no path: "/" (a query, if any, is dropped with it) */
			h->path = http_root;
		}
	} else if (strcmp(h->target, "*") == 0) {
		h->path = h->target;
	} else {
		return 400;
	}
	h->query = http_empty;
	if (h->path != http_root && (q = strchr(h->path, '?')) != NULL) {
		*q = '\0';
		h->query = q + 1;
	}
	return 0;
}

int http_parse_head(char *buf, struct http_head *h)
{
	char *p = buf, *line;
	int rc, saw_close = 0;

	memset(h, 0, sizeof(*h));
	h->length = -1;
	while (*p == '\r' || *p == '\n')
		p++;
	if ((line = http_line(&p)) == NULL)
		return 400;
	if ((rc = http_request_line(line, h)) != 0)
		return rc;
	for (;;) {
		char *colon, *value, *end;
		size_t i;

		if ((line = http_line(&p)) == NULL)
			return 400; /* no empty line ends the head */
		if (line[0] == '\0')
			break;
		if (line[0] == ' ' || line[0] == '\t')
			return 400; /* obsolete line folding */
		if ((colon = strchr(line, ':')) == NULL || colon == line)
			return 400;
		*colon = '\0';
		for (i = 0; line[i]; i++)
			if (!http_tchar((unsigned char)line[i]))
				return 400; /* white space before the colon, too */
		value = colon + 1;
		while (*value == ' ' || *value == '\t')
			value++;
		end = value + strlen(value);
		while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
			*--end = '\0';
		for (i = 0; value[i]; i++)
			if (((unsigned char)value[i] < 0x20 && value[i] != '\t') ||
			    value[i] == 0x7f)
				return 400;
		if (h->nheaders == HTTP_MAX_HEADERS)
			return 431;
		h->h[h->nheaders].name = line;
		h->h[h->nheaders].value = value;
		h->nheaders++;
		if (strcasecmp(line, "Content-Length") == 0) {
			if (http_content_length(value, &h->length) != 0)
				return 400;
		} else if (strcasecmp(line, "Transfer-Encoding") == 0) {
			h->chunked = 1;
		} else if (strcasecmp(line, "Connection") == 0) {
			if (http_lists(value, "close"))
				saw_close = 1;
			if (http_lists(value, "keep-alive"))
				h->keep_alive = 1;
		} else if (strcasecmp(line, "Expect") == 0) {
			if (strcasecmp(value, "100-continue") == 0)
				h->expect_continue = 1;
		}
	}
	if (saw_close)
		h->keep_alive = 0;
	return 0;
}

char *http_uri_decode(const char *s, size_t len)
{
	char *out = malloc(len + 1), *o = out;
	size_t i;

	if (out == NULL)
		return NULL;
	for (i = 0; i < len; i++) {
		if (s[i] == '%' && i + 2 < len && isxdigit((unsigned char)s[i + 1]) &&
		    isxdigit((unsigned char)s[i + 2])) {
			char hex[3] = {s[i + 1], s[i + 2], '\0'};
			long v = strtol(hex, NULL, 16);

			if (v == 0) {
				free(out);
				return NULL;
			}
			*o++ = (char)v;
			i += 2;
		} else {
			*o++ = s[i];
		}
	}
	*o = '\0';
	return out;
}

/* ---- requests and replies ------------------------------------------------ */

enum http_method http_method(const struct http_request *req)
{
	return req->h.m;
}

const char *http_path(const struct http_request *req)
{
	return req->h.path ? req->h.path : "";
}

const char *http_query(const struct http_request *req)
{
	return req->h.query ? req->h.query : "";
}

const char *http_header(const struct http_request *req, const char *name)
{
	int i;

	for (i = 0; i < req->h.nheaders; i++)
		if (strcasecmp(req->h.h[i].name, name) == 0)
			return req->h.h[i].value;
	return NULL;
}

struct evbuffer *http_body(const struct http_request *req)
{
	return req->body;
}

static const char *http_reason(int code)
{
	switch (code) {
	case 100:
		return "Continue";
	case 200:
		return "OK";
	case 400:
		return "Bad Request";
	case 401:
		return "Unauthorized";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 411:
		return "Length Required";
	case 413:
		return "Content Too Large";
	case 431:
		return "Request Header Fields Too Large";
	case 500:
		return "Internal Server Error";
	case 503:
		return "Service Unavailable";
	case 505:
		return "HTTP Version Not Supported";
	default:
		return code < 300 ? "OK" : code < 500 ? "Bad Request" : "Server Error";
	}
}

static void http_arm(struct http_conn *c, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	evtimer_add(c->timer, &tv);
}

static void http_request_clear(struct http_request *req)
{
	free(req->head);
	if (req->body)
		evbuffer_free(req->body);
	if (req->headers)
		evbuffer_free(req->headers);
	memset(req, 0, sizeof(*req));
}

void http_reply_header(struct http_request *req, const char *name, const char *value)
{
	if (req->headers == NULL && (req->headers = evbuffer_new()) == NULL)
		return;
	evbuffer_add_printf(req->headers, "%s: %s\r\n", name, value);
}

void http_reply(struct http_request *req, int code, const char *type, struct evbuffer *body)
{
	struct http_conn *c = req->conn;
	struct evbuffer *out = bufferevent_get_output(c->bev);
	size_t len = body ? evbuffer_get_length(body) : 0;

	if (req->replied)
		return;
	req->replied = 1;
	evbuffer_add_printf(out,
			    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			    "Cache-Control: no-store\r\nConnection: %s\r\n",
			    code, http_reason(code), type ? type : "text/plain", len,
			    c->close_after ? "close" : "keep-alive");
	if (req->headers)
		evbuffer_add_buffer(out, req->headers);
	evbuffer_add(out, "\r\n", 2);
	if (body && req->h.m != HTTP_HEAD)
		evbuffer_add_buffer(out, body);
	else if (body)
		evbuffer_drain(body, len);
	c->state = HTTP_WRITING;
	bufferevent_disable(c->bev, EV_READ);
	http_arm(c, c->srv->set.timeout_ms);
}

void http_reply_text(struct http_request *req, int code, const char *text)
{
	struct evbuffer *out = evbuffer_new();

	if (out)
		evbuffer_add(out, text, strlen(text));
	http_reply(req, code, "text/plain", out);
	if (out)
		evbuffer_free(out);
}

/* ---- connections --------------------------------------------------------- */

static void http_conn_free(struct http_conn *c)
{
	struct http_server *srv = c->srv;

	if (c->prev)
		c->prev->next = c->next;
	else
		srv->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	__atomic_sub_fetch(&srv->nconns, 1, __ATOMIC_RELAXED);
	http_request_clear(&c->req);
	event_free(c->timer);
	bufferevent_free(c->bev);
	free(c);
}

/* The reply went out and the connection ends: no more is sent; what the
 * peer still sends (a body never read) is dropped until it closes. */
static void http_linger(struct http_conn *c)
{
	long ms =
	    c->srv->set.timeout_ms < HTTP_LINGER_MS ? c->srv->set.timeout_ms : HTTP_LINGER_MS;

	shutdown(bufferevent_getfd(c->bev), SHUT_WR);
	c->state = HTTP_LINGER;
	evbuffer_drain(bufferevent_get_input(c->bev),
		       evbuffer_get_length(bufferevent_get_input(c->bev)));
	http_arm(c, ms);
	bufferevent_enable(c->bev, EV_READ);
}

/* A request the server answers itself, before any handler. */
static void http_refuse(struct http_conn *c, int code, const char *text)
{
	http_reply_text(&c->req, code, text);
}

static const struct http_route *http_route_find(const struct http_server *srv, const char *path)
{
	int i;

	for (i = 0; i < srv->nroutes; i++) {
		const char *rp = srv->routes[i].path;
		size_t n = strlen(rp);

		if (n > 1 && rp[n - 1] == '/' ? strncmp(path, rp, n) == 0
					      : strcmp(path, rp) == 0)
			return &srv->routes[i];
	}
	return NULL;
}

/* The head is in: the authorization, the route, the method and the body's
 * length are decided before a byte of the body is read. 0: read the body. */
static int http_start(struct http_conn *c)
{
	static const char *const names[] = {"GET", "HEAD", "POST", "PUT", "DELETE"};
	struct http_server *srv = c->srv;
	struct http_request *req = &c->req;
	const struct http_route *r = http_route_find(srv, req->h.path);
	unsigned allowed;
	char text[128];

	/* An answer now leaves a body unread: the connection ends with it. */
	c->close_after = !req->h.keep_alive || req->h.length > 0 || req->h.chunked;
	if ((r == NULL || !r->open) && srv->set.authorize &&
	    !srv->set.authorize(req, srv->set.authorize_arg)) {
		http_reply_header(req, "WWW-Authenticate", "Bearer");
		http_refuse(c, 401, "a bearer token is required\n");
		return -1;
	}
	if (r == NULL) {
		http_refuse(c, 404, "not found\n");
		return -1;
	}
	allowed = r->methods | (r->methods & HTTP_GET ? HTTP_HEAD : 0);
	if (!(allowed & req->h.m)) {
		size_t i, len = 0;

		for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (allowed & (1u << i))
				len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s",
							len ? ", " : "", names[i]);
		http_reply_header(req, "Allow", text);
		memmove(text + 4, text, len + 1);
		memcpy(text, "use ", 4);
		strcat(text, "\n");
		http_refuse(c, 405, text);
		return -1;
	}
	if (req->h.chunked) {
		http_refuse(c, 411, "a request body needs a Content-Length\n");
		return -1;
	}
	if (req->h.length > (long long)r->max_body) {
		if (r->max_body == 0)
			snprintf(text, sizeof(text), "%s %s takes no body\n", req->h.method,
				 req->h.path[0] == '/' && strlen(req->h.path) < 64 ? req->h.path
										   : "this");
		else
			snprintf(text, sizeof(text), "a body here is at most %zu bytes\n",
				 r->max_body);
		http_refuse(c, 413, text);
		return -1;
	}
	c->close_after = !req->h.keep_alive;
	req->route = r;
	req->need = req->h.length > 0 ? (size_t)req->h.length : 0;
	if (req->need > 0 && req->h.expect_continue)
		evbuffer_add_printf(bufferevent_get_output(c->bev),
				    "HTTP/1.1 100 Continue\r\n\r\n");
	c->state = HTTP_READ_BODY;
	return 0;
}

/* Take the head off the input once its empty line is there: 1 when taken
 * (and parsed), 0 while more is needed, -1 when the request was refused. */
static int http_take_head(struct http_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t len, n, i, end = 0;
	const char *p;
	int rc;

	if (c->scanned == 0) {
		/* Empty lines before a request line are ignored. */
		while ((len = evbuffer_get_length(in)) > 0 &&
		       ((p = (const char *)evbuffer_pullup(in, 1))[0] == '\r' || p[0] == '\n'))
			evbuffer_drain(in, 1);
	}
	len = evbuffer_get_length(in);
	n = len < HTTP_MAX_HEAD ? len : HTTP_MAX_HEAD;
	if (n == 0)
		return 0;
	p = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
	for (i = c->scanned; i < n && !end; i++) {
		if (p[i] != '\n')
			continue;
		if (i + 1 < n && p[i + 1] == '\n')
			end = i + 2;
		else if (i + 2 < n && p[i + 1] == '\r' && p[i + 2] == '\n')
			end = i + 3;
	}
	if (end == 0) {
		if (len >= HTTP_MAX_HEAD) {
			c->close_after = 1;
			http_refuse(c, 431, "the request head is too large\n");
			return -1;
		}
		c->scanned = n > 2 ? n - 2 : 0;
		return 0;
	}
	c->close_after = 1;
	if (memchr(p, '\0', end) != NULL) {
		http_refuse(c, 400, "bad request\n");
		return -1;
	}
	if ((c->req.head = malloc(end + 1)) == NULL) {
		http_refuse(c, 500, "out of memory\n");
		return -1;
	}
	evbuffer_remove(in, c->req.head, end);
	c->req.head[end] = '\0';
	if ((rc = http_parse_head(c->req.head, &c->req.h)) != 0) {
		memset(&c->req.h, 0, sizeof(c->req.h));
		http_refuse(c, rc,
			    rc == 431   ? "too many headers\n"
			    : rc == 505 ? "HTTP/1.0 or HTTP/1.1 only\n"
					: "bad request\n");
		return -1;
	}
	return 1;
}

static void http_dispatch(struct http_conn *c)
{
	struct http_request *req = &c->req;

	req->route->fn(req, req->route->arg);
	if (!req->replied)
		http_reply_text(req, 500, "no reply\n");
}

/* Run what the input holds as far as it goes. */
static void http_process(struct http_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	for (;;) {
		switch (c->state) {
		case HTTP_IDLE:
			if (evbuffer_get_length(in) == 0)
				return;
			/* A request began: it has timeout_ms to arrive whole. */
			http_request_clear(&c->req);
			c->req.conn = c;
			c->req.body = evbuffer_new();
			if (c->req.body == NULL) {
				http_conn_free(c);
				return;
			}
			c->state = HTTP_READ_HEAD;
			c->scanned = 0;
			http_arm(c, c->srv->set.timeout_ms);
			break;
		case HTTP_READ_HEAD:
			if (http_take_head(c) <= 0 || http_start(c) != 0)
				return;
			break;
		case HTTP_READ_BODY:
			if (evbuffer_get_length(in) < c->req.need)
				return;
			if (c->req.need)
				evbuffer_remove_buffer(in, c->req.body, c->req.need);
			http_dispatch(c);
			return;
		case HTTP_WRITING:
		case HTTP_LINGER:
			return;
		}
	}
}

static void http_read_cb(struct bufferevent *bev, void *arg)
{
	struct http_conn *c = arg;

	if (c->state == HTTP_LINGER) {
		struct evbuffer *in = bufferevent_get_input(bev);

		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	http_process(c);
}

static void http_write_cb(struct bufferevent *bev, void *arg)
{
	struct http_conn *c = arg;

	if (c->state != HTTP_WRITING || evbuffer_get_length(bufferevent_get_output(bev)) > 0)
		return;
	if (c->close_after) {
		http_linger(c);
		return;
	}
	http_request_clear(&c->req);
	c->state = HTTP_IDLE;
	http_arm(c, c->srv->set.timeout_ms);
	bufferevent_enable(bev, EV_READ);
	http_process(c); /* a request that came in behind the last one */
}

static void http_event_cb(struct bufferevent *bev, short what, void *arg)
{
	http_conn_free(arg);
}

static void http_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct http_conn *c = arg;

	if (c->state != HTTP_LINGER)
		log_debug("%s: connection closed after %ld ms %s", c->srv->set.name,
			  c->srv->set.timeout_ms,
			  c->state == HTTP_IDLE      ? "idle"
			  : c->state == HTTP_WRITING ? "without its reply taken"
						     : "without a whole request");
	http_conn_free(c);
}

/* ---- the listener -------------------------------------------------------- */

static void http_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
			   int salen, void *arg)
{
	struct http_server *srv = arg;
	struct http_conn *c;

	if (listener_accepted(fd) != 0)
		return;
	if (srv->nconns >= srv->set.max_connections) {
		if (!srv->full)
			log_warning(
			    "%s: %d connections open, the most allowed; more are closed "
			    "at once until one ends",
			    srv->set.name, srv->nconns);
		srv->full = 1;
		evutil_closesocket(fd);
		return;
	}
	if (srv->full)
		log_info("%s: accepting connections again", srv->set.name);
	srv->full = 0;
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		evutil_closesocket(fd);
		return;
	}
	c->srv = srv;
	c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
	c->timer = evtimer_new(srv->base, http_timer_cb, c);
	if (c->bev == NULL || c->timer == NULL) {
		if (c->bev)
			bufferevent_free(c->bev);
		else
			evutil_closesocket(fd);
		if (c->timer)
			event_free(c->timer);
		free(c);
		return;
	}
	bufferevent_setcb(c->bev, http_read_cb, http_write_cb, http_event_cb, c);
	/* Never more than a head and the largest body in hand. */
	bufferevent_setwatermark(c->bev, EV_READ, 0, HTTP_MAX_HEAD + srv->max_body);
	c->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = c;
	srv->conns = c;
	__atomic_add_fetch(&srv->nconns, 1, __ATOMIC_RELAXED);
	c->state = HTTP_IDLE;
	http_arm(c, srv->set.timeout_ms);
	bufferevent_enable(c->bev, EV_READ);
}

static void http_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct http_server *srv = arg;

	evconnlistener_enable(srv->lst);
}

static void http_accept_error_cb(struct evconnlistener *l, void *arg)
{
	struct http_server *srv = arg;
	int err = EVUTIL_SOCKET_ERROR();
	enum listener_shed_result rc = listener_shed(evconnlistener_get_fd(l), err);

	if (rc == LISTENER_SHED_CLOSED || rc == LISTENER_SHED_NONE)
		return;
	if (rc == LISTENER_SHED_OTHER)
		log_warning("%s: accept failed: %s", srv->set.name,
			    evutil_socket_error_to_string(err));
	/* Rather than spin on a connection it cannot take. */
	evconnlistener_disable(l);
	{
		struct timeval tv = {0, HTTP_PAUSE_MS * 1000};

		evtimer_add(srv->pause, &tv);
	}
}

struct http_server *http_open(struct event_base *base, const char *host, int port,
			      const struct http_settings *set, const struct http_route *routes,
			      int nroutes, char *err, size_t errlen)
{
	struct http_server *srv = calloc(1, sizeof(*srv));
	struct addrinfo hints, *res = NULL;
	char service[16];
	int i, rc;

	if (srv == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	srv->base = base;
	srv->set = *set;
	srv->routes = routes;
	srv->nroutes = nroutes;
	for (i = 0; i < nroutes; i++)
		if (routes[i].max_body > srv->max_body)
			srv->max_body = routes[i].max_body;
	if (srv->max_body > HTTP_MAX_BODY) {
		snprintf(err, errlen, "a route takes a body over %d bytes", HTTP_MAX_BODY);
		free(srv);
		return NULL;
	}
	snprintf(service, sizeof(service), "%d", port);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if ((rc = getaddrinfo(host, service, &hints, &res)) != 0 || res == NULL) {
		snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(rc));
		free(srv);
		return NULL;
	}
	srv->pause = evtimer_new(base, http_resume_cb, srv);
	srv->lst = evconnlistener_new_bind(base, http_accept_cb, srv,
					   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
					       LEV_OPT_CLOSE_ON_EXEC,
					   128, res->ai_addr, (int)res->ai_addrlen);
	freeaddrinfo(res);
	if (srv->lst == NULL || srv->pause == NULL) {
		snprintf(err, errlen, "cannot listen: %s",
			 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		http_free(srv);
		return NULL;
	}
	evconnlistener_set_error_cb(srv->lst, http_accept_error_cb);
	return srv;
}

void http_free(struct http_server *srv)
{
	if (srv == NULL)
		return;
	while (srv->conns)
		http_conn_free(srv->conns);
	if (srv->lst)
		evconnlistener_free(srv->lst);
	if (srv->pause)
		event_free(srv->pause);
	free(srv);
}

int http_connections(const struct http_server *srv)
{
	return srv ? __atomic_load_n(&srv->nconns, __ATOMIC_RELAXED) : 0;
}
