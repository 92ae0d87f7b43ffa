/* admin_replay: replays of dead letters started, shown and cancelled from
 * the admin endpoint. The request is checked here (strictly: every member
 * known, names bounded, count and rate in range); the replay itself runs
 * on a thread of its own (replay.c), and the start is waited for only
 * until its connection is up and its queue found, so that an unknown
 * vhost, queue or exchange is answered 404 at once. */
#include "admin_replay.h"

#include "admin.h"
#include "http.h"
#include "replay.h"
#include "rules.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void admin_replay_reply(struct http_request *req, int code, struct evbuffer *out)
{
	http_reply(req, code, "application/json", out);
}

/* A name member: absent (0, dst untouched), a string of 1..REPLAY_NAME_MAX
 * bytes (or 0..: empty allowed) copied (0), or -1 (answered). */
static int admin_replay_name(struct http_request *req, const cJSON *body, const char *key,
			     char *dst, int empty_ok)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(body, key);
	size_t len;

	if (it == NULL)
		return 0;
	if (!cJSON_IsString(it) || it->valuestring == NULL) {
		admin_error(req, 400, "%s must be a string", key);
		return -1;
	}
	len = strlen(it->valuestring);
	if ((len == 0 && !empty_ok) || len > REPLAY_NAME_MAX) {
		admin_error(req, 400, "%s must be %d to %d bytes", key, empty_ok ? 0 : 1,
			    REPLAY_NAME_MAX);
		return -1;
	}
	memcpy(dst, it->valuestring, len + 1);
	return 0;
}

/* An integer member in [1, max]: absent (0, *v untouched), 0, or -1 (answered). */
static int admin_replay_int(struct http_request *req, const cJSON *body, const char *key,
			    long max, long *v)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(body, key);
	double d;

	if (it == NULL)
		return 0;
	d = cJSON_IsNumber(it) ? it->valuedouble : 0;
	if (!cJSON_IsNumber(it) || d != (double)(long)d || d < 1 || d > (double)max) {
		admin_error(req, 400, "%s must be an integer from 1 to %ld", key, max);
		return -1;
	}
	*v = (long)d;
	return 0;
}

/* The request's members into spec: 0, or -1 (answered). */
static int admin_replay_spec(struct http_request *req, const cJSON *body,
			     struct replay_spec *spec)
{
	static const char *const known[] = {"vhost", "queue",    "count",
					    "rate",  "exchange", "routing_key"};
	const cJSON *it;
	size_t i;

	if (!cJSON_IsObject(body)) {
		admin_error(req, 400, "the body must be a JSON object");
		return -1;
	}
	cJSON_ArrayForEach (it, body) {
		for (i = 0; i < sizeof(known) / sizeof(known[0]); i++)
			if (it->string && strcmp(it->string, known[i]) == 0)
				break;
		if (i == sizeof(known) / sizeof(known[0])) {
			admin_error(req, 400, "unknown member %.64s",
				    it->string ? it->string : "");
			return -1;
		}
	}
	spec->rate = REPLAY_DEFAULT_RATE;
	if (admin_replay_name(req, body, "vhost", spec->vhost, 0) != 0 ||
	    admin_replay_name(req, body, "queue", spec->queue, 0) != 0 ||
	    admin_replay_name(req, body, "exchange", spec->exchange, 1) != 0 ||
	    admin_replay_name(req, body, "routing_key", spec->routing_key, 1) != 0 ||
	    admin_replay_int(req, body, "count", REPLAY_MAX_COUNT, &spec->count) != 0 ||
	    admin_replay_int(req, body, "rate", REPLAY_MAX_RATE, &spec->rate) != 0)
		return -1;
	if (spec->vhost[0] == '\0' || spec->queue[0] == '\0' || spec->count == 0) {
		admin_error(req, 400, "vhost, queue and count are required");
		return -1;
	}
	/* Either names a target: the other defaults to "" (the default
	 * exchange; an empty routing key). */
	spec->has_target = cJSON_GetObjectItemCaseSensitive(body, "exchange") != NULL ||
			   cJSON_GetObjectItemCaseSensitive(body, "routing_key") != NULL;
	return 0;
}

/* POST /replay. */
static void admin_replay_post(struct http_request *req, admin_rules_fn rules_fn)
{
	struct evbuffer *in = http_body(req), *out;
	size_t len = evbuffer_get_length(in);
	struct replay_spec spec;
	const struct rules_vhost *v;
	struct rules *r;
	const char *why;
	char where[48], *text;
	cJSON *body = NULL;
	long id;
	int status;

	memset(&spec, 0, sizeof(spec));
	/* NUL-terminated, nothing after the value; no NUL inside. */
	if (len > 0 && (text = malloc(len + 1)) != NULL) {
		evbuffer_copyout(in, text, len);
		text[len] = '\0';
		if (memchr(text, '\0', len) == NULL)
			body = cJSON_ParseWithOpts(text, NULL, 1);
		free(text);
	}
	if (body == NULL) {
		admin_error(req, 400, "the body is not JSON");
		return;
	}
	status = admin_replay_spec(req, body, &spec);
	cJSON_Delete(body);
	if (status != 0)
		return;
	/* The vhost's brokers and claim store, as the rules say now. */
	r = rules_fn ? rules_fn() : NULL;
	v = r ? rules_vhost(r, spec.vhost) : NULL;
	if (v) {
		spec.upstream = v->upstream;
		if (v->claim_check.enabled) {
			spec.claim_check = 1;
			claims_where(&spec.where, spec.vhost, &v->claim_check);
		}
	}
	rules_unref(r);
	id = replay_start(&spec);
	switch (id) {
	case REPLAY_ERR_DISABLED:
		admin_error(req, 503,
			    "no engine_user is set: the proxy has no broker connection of "
			    "its own");
		return;
	case REPLAY_ERR_BUSY:
		admin_error(req, 429, "%d replays run already", REPLAY_MAX_RUNNING);
		return;
	case REPLAY_ERR_SAME:
		admin_error(req, 409, "a replay of this queue runs already");
		return;
	case REPLAY_ERR_NOMEM:
		admin_error(req, 503, "out of memory");
		return;
	default:
		break;
	}
	status = replay_started(id, ADMIN_REPLAY_START_MS, &why);
	if (status != 202) {
		replay_forget(id);
		admin_error(req, status, "%s", why ? why : "not started");
		return;
	}
	out = evbuffer_new();
	replay_json(id, out);
	snprintf(where, sizeof(where), "/replay/%ld", id);
	http_reply_header(req, "Location", where);
	admin_replay_reply(req, 202, out);
	evbuffer_free(out);
}

/* The ID of /replay/ID: > 0, or -1. */
static long admin_replay_id(const char *s)
{
	long v = 0;

	if (*s == '\0' || *s == '0')
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > (LONG_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v;
}

void admin_replay(struct http_request *req, void *arg)
{
	admin_rules_fn rules_fn = arg ? *(admin_rules_fn *)arg : NULL;
	const char *path = http_path(req);
	enum http_method m = http_method(req);
	struct evbuffer *out;
	long id;
	int rc;

	if (strcmp(path, "/replay") == 0) {
		if (m == HTTP_POST) {
			admin_replay_post(req, rules_fn);
			return;
		}
		out = evbuffer_new();
		replay_list_json(out);
		admin_replay_reply(req, 200, out);
		evbuffer_free(out);
		return;
	}
	id = admin_replay_id(path + strlen("/replay/"));
	if (id < 0) {
		admin_error(req, 404, "use /replay/ID");
		return;
	}
	if (m == HTTP_DELETE) {
		rc = replay_cancel(id);
		if (rc < 0) {
			admin_error(req, 404, "no replay %ld", id);
			return;
		}
		if (rc == 0) {
			admin_error(req, 409, "replay %ld has ended", id);
			return;
		}
		replay_wait(id, ADMIN_REPLAY_CANCEL_MS);
	}
	out = evbuffer_new();
	if (replay_json(id, out) != 0)
		admin_error(req, 404, "no replay %ld", id);
	else
		admin_replay_reply(req, 200, out);
	evbuffer_free(out);
}
