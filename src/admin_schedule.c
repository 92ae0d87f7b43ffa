/* admin_schedule: the delayed messages of a vhost, read from the state
 * layer on the admin's thread (LMDB readers take no lock a worker waits
 * for) and cancelled through the state layer's writer. */
#include "admin_schedule.h"

#include "admin.h"
#include "http.h"
#include "json.h"
#include "rules.h"
#include "store/delayed.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADMIN_SCHEDULE_TARGETS 256 /* targets counted apart; the rest together */

static int admin_schedule_hex(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

char *admin_decode(const char *s, size_t len, int plus)
{
	char *out = malloc(len + 1), *o = out;
	size_t i;
	int hi, lo;

	if (out == NULL)
		return NULL;
	for (i = 0; i < len; i++) {
		if (s[i] == '%') {
			if (len - i < 3 || (hi = admin_schedule_hex(s[i + 1])) < 0 ||
			    (lo = admin_schedule_hex(s[i + 2])) < 0 || (hi | lo) == 0) {
				free(out);
				return NULL;
			}
			*o++ = (char)(hi << 4 | lo);
			i += 2;
		} else {
			*o++ = plus && s[i] == '+' ? ' ' : s[i];
		}
	}
	*o = '\0';
	return out;
}

/* The query's parameter name, decoded: 1 found (*val malloc'd), 0 absent,
 * -1 badly encoded. */
static int admin_schedule_param(const char *query, const char *name, char **val)
{
	size_t nlen = strlen(name);
	const char *p = query;

	*val = NULL;
	while (*p) {
		const char *end = strchr(p, '&'), *eq;

		if (end == NULL)
			end = p + strlen(p);
		eq = memchr(p, '=', (size_t)(end - p));
		if ((size_t)((eq ? eq : end) - p) == nlen && memcmp(p, name, nlen) == 0) {
			*val =
			    eq ? admin_decode(eq + 1, (size_t)(end - eq - 1), 1) : strdup("");
			return *val ? 1 : -1;
		}
		p = *end ? end + 1 : end;
	}
	return 0;
}

/* ---- GET /schedule/VHOST ---------------------------------------------------------------- */

struct admin_schedule_target {
	char exchange[DELAYED_STR_MAX], routing_key[DELAYED_STR_MAX];
	size_t elen, rlen;
	unsigned long n;
};

struct admin_schedule_list {
	struct evbuffer *page;
	const uint8_t *after;
	long limit, listed;
	unsigned long total, cancelled, others;
	char next[DELAYED_ID_LEN + 1];
	int more;
	struct admin_schedule_target *t;
	int nt;
};

static void admin_schedule_count(struct admin_schedule_list *l, const struct delayed_entry *e)
{
	struct admin_schedule_target *t;
	int i;

	for (i = 0; i < l->nt; i++) {
		t = &l->t[i];
		if (t->elen == e->elen && t->rlen == e->rlen &&
		    memcmp(t->exchange, e->exchange, e->elen) == 0 &&
		    memcmp(t->routing_key, e->routing_key, e->rlen) == 0) {
			t->n++;
			return;
		}
	}
	if (l->nt == ADMIN_SCHEDULE_TARGETS) {
		l->others++;
		return;
	}
	t = &l->t[l->nt++];
	memcpy(t->exchange, e->exchange, e->elen);
	memcpy(t->routing_key, e->routing_key, e->rlen);
	t->elen = e->elen;
	t->rlen = e->rlen;
	t->n = 1;
}

static int admin_schedule_one(void *arg, const struct delayed_entry *e)
{
	struct admin_schedule_list *l = arg;
	char id[DELAYED_ID_LEN + 1];

	if (e->status == DELAYED_CANCELLED) {
		l->cancelled++;
		return 0;
	}
	l->total++;
	admin_schedule_count(l, e);
	if (l->after && memcmp(e->key, l->after, DELAYED_KEY_LEN) <= 0)
		return 0;
	if (l->listed == l->limit) {
		l->more = 1;
		return 0;
	}
	delayed_id(id, e->key);
	evbuffer_add_printf(
	    l->page, "%s\n  {\"id\": \"%s\", \"message_id\": ", l->listed ? "," : "", id);
	if (e->has_message_id)
		json_string(l->page, e->message_id, e->mlen);
	else
		evbuffer_add_printf(l->page, "null");
	evbuffer_add_printf(l->page,
			    ", \"due_at\": %lld, \"exchange\": ", (long long)e->due_at);
	json_string(l->page, e->exchange, e->elen);
	evbuffer_add_printf(l->page, ", \"routing_key\": ");
	json_string(l->page, e->routing_key, e->rlen);
	evbuffer_add_printf(l->page, ", \"size\": %llu}", (unsigned long long)e->size);
	memcpy(l->next, id, sizeof(id));
	l->listed++;
	return 0;
}

static void admin_schedule_list(struct http_request *req, const char *vhost)
{
	struct admin_schedule_list l;
	uint8_t after[DELAYED_KEY_LEN];
	struct evbuffer *out;
	char *v = NULL, *end;
	int i, rc;

	memset(&l, 0, sizeof(l));
	l.limit = ADMIN_SCHEDULE_LIMIT;
	rc = admin_schedule_param(http_query(req), "limit", &v);
	if (rc == 1) {
		l.limit = strtol(v, &end, 10);
		if (v[0] < '0' || v[0] > '9' || *end != '\0' || l.limit < 1 ||
		    l.limit > ADMIN_SCHEDULE_LIMIT_MAX) {
			free(v);
			admin_error(req, 400, "limit is a number from 1 to 1000");
			return;
		}
	}
	free(v);
	if (rc < 0) {
		admin_error(req, 400, "bad percent-encoding in the query");
		return;
	}
	rc = admin_schedule_param(http_query(req), "after", &v);
	if (rc == 1 && delayed_parse_id(v, strlen(v), after) != 0) {
		free(v);
		admin_error(req, 400, "after is the id of a delayed message");
		return;
	}
	free(v);
	if (rc < 0) {
		admin_error(req, 400, "bad percent-encoding in the query");
		return;
	}
	l.after = rc == 1 ? after : NULL;
	l.page = evbuffer_new();
	l.t = calloc(ADMIN_SCHEDULE_TARGETS, sizeof(*l.t));
	if (l.page == NULL || l.t == NULL) {
		if (l.page)
			evbuffer_free(l.page);
		free(l.t);
		admin_error(req, 500, "out of memory");
		return;
	}
	/* Every record is read: the counts are the vhost's, the page is one
	 * stretch of them. */
	rc = delayed_scan(vhost, NULL, admin_schedule_one, &l);
	if (rc != STATE_OK) {
		evbuffer_free(l.page);
		free(l.t);
		admin_error(req, 503, "%s", state_strerror(rc));
		return;
	}
	out = evbuffer_new();
	evbuffer_add_printf(out, "{\"vhost\": ");
	json_string(out, vhost, strlen(vhost));
	evbuffer_add_printf(out, ", \"total\": %lu, \"cancelled\": %lu, \"pending\": [",
			    l.total, l.cancelled);
	evbuffer_add_buffer(out, l.page);
	evbuffer_add_printf(out, "%s], \"next\": ", l.listed ? "\n" : "");
	if (l.more)
		evbuffer_add_printf(out, "\"%s\"", l.next);
	else
		evbuffer_add_printf(out, "null");
	evbuffer_add_printf(out, ", \"targets\": [");
	for (i = 0; i < l.nt; i++) {
		evbuffer_add_printf(out, "%s\n  {\"exchange\": ", i ? "," : "");
		json_string(out, l.t[i].exchange, l.t[i].elen);
		evbuffer_add_printf(out, ", \"routing_key\": ");
		json_string(out, l.t[i].routing_key, l.t[i].rlen);
		evbuffer_add_printf(out, ", \"pending\": %lu}", l.t[i].n);
	}
	evbuffer_add_printf(out, "%s], \"other_targets_pending\": %lu}\n", l.nt ? "\n" : "",
			    l.others);
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
	evbuffer_free(l.page);
	free(l.t);
}

/* ---- DELETE ----------------------------------------------------------------------------- */

static void admin_schedule_cancel(struct http_request *req, const char *vhost, const char *id)
{
	uint8_t key[DELAYED_KEY_LEN];
	struct evbuffer *out;
	int rc;

	if (delayed_parse_id(id, strlen(id), key) != 0) {
		admin_error(req, 400, "not the id of a delayed message");
		return;
	}
	rc = delayed_cancel(vhost, key);
	if (rc == STATE_NOTFOUND) {
		admin_error(req, 404, "no delayed message with this id");
		return;
	}
	if (rc != STATE_OK) {
		admin_error(req, 503, "%s", state_strerror(rc));
		return;
	}
	out = evbuffer_new();
	evbuffer_add_printf(out, "{\"vhost\": ");
	json_string(out, vhost, strlen(vhost));
	evbuffer_add_printf(out, ", \"id\": \"%s\", \"cancelled\": true}\n", id);
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
}

static void admin_schedule_cancel_set(struct http_request *req, const char *vhost)
{
	char *ex = NULL, *rk = NULL;
	struct evbuffer *out;
	int e, r;
	long n;

	e = admin_schedule_param(http_query(req), "exchange", &ex);
	r = admin_schedule_param(http_query(req), "routing_key", &rk);
	if (e < 0 || r < 0) {
		admin_error(req, 400, "bad percent-encoding in the query");
		goto out;
	}
	if (e == 0) {
		admin_error(req, 400,
			    "name the target: ?exchange=NAME (empty: the default "
			    "exchange)[&routing_key=KEY]");
		goto out;
	}
	n = delayed_cancel_target(vhost, ex, rk);
	if (n < 0) {
		admin_error(req, 503, "the state could not be read or written");
		goto out;
	}
	out = evbuffer_new();
	evbuffer_add_printf(out, "{\"vhost\": ");
	json_string(out, vhost, strlen(vhost));
	evbuffer_add_printf(out, ", \"exchange\": ");
	json_string(out, ex, strlen(ex));
	evbuffer_add_printf(out, ", \"routing_key\": ");
	if (rk)
		json_string(out, rk, strlen(rk));
	else
		evbuffer_add_printf(out, "null");
	evbuffer_add_printf(out, ", \"cancelled\": %ld}\n", n);
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
out:
	free(ex);
	free(rk);
}

/* ---- the route -------------------------------------------------------------------------- */

void admin_schedule(struct http_request *req, void *arg)
{
	admin_rules_fn rules_cb = *(admin_rules_fn *)arg;
	const char *rest = http_path(req) + strlen("/schedule/");
	const char *slash = strchr(rest, '/');
	char *vhost = NULL, *id = NULL;
	struct rules *r = NULL;
	const struct rules_vhost *v;

	vhost = admin_decode(rest, slash ? (size_t)(slash - rest) : strlen(rest), 0);
	if (slash)
		id = admin_decode(slash + 1, strlen(slash + 1), 0);
	if (vhost == NULL || (slash && id == NULL)) {
		admin_error(req, 400, "bad percent-encoding in the path");
		goto out;
	}
	if (vhost[0] == '\0' || (id && (id[0] == '\0' || strchr(id, '/')))) {
		admin_error(req, 400,
			    "use /schedule/VHOST or /schedule/VHOST/ID (VHOST "
			    "percent-encoded, %%2F for /)");
		goto out;
	}
	r = rules_cb ? rules_cb() : NULL;
	v = r ? rules_vhost(r, vhost) : NULL;
	if (v == NULL || !v->schedule.enabled) {
		admin_error(req, 404, "no schedule rule for this vhost");
		goto out;
	}
	if (delayed_state() == NULL) {
		admin_error(req, 503, "the state layer is not open");
		goto out;
	}
	if (http_method(req) == HTTP_DELETE) {
		if (id)
			admin_schedule_cancel(req, vhost, id);
		else
			admin_schedule_cancel_set(req, vhost);
	} else if (id) {
		http_reply_header(req, "Allow", "DELETE");
		admin_error(req, 405, "a delayed message is cancelled with DELETE");
	} else {
		admin_schedule_list(req, vhost);
	}
out:
	rules_unref(r);
	free(vhost);
	free(id);
}
