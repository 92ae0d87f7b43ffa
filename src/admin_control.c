/* admin_control: the admin endpoint's actions on running connections:
 *   POST /connections/ID/close|drain       one client ({"reason": "..."})
 *   POST /vhosts/NAME/pause|resume|disconnect   every client of a vhost
 *   POST /upstreams/HOST:PORT/disable|enable|drain   a broker address
 * NAME and HOST:PORT are percent-encoded. Each action runs on every worker
 * (control.c); the answer says how many connections it reached. */
#include "admin_control.h"

#include "admin.h"
#include "admin_schedule.h"
#include "control.h"
#include "http.h"
#include "json.h"
#include "upstream.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADMIN_CONTROL_REASON_MAX 200 /* fits connection.close's reply text */

struct admin_control_job {
	struct control_target t;
	enum control_action a;
	char *vhost;
	char *reason;
};

static void admin_control_job_free(void *arg)
{
	struct admin_control_job *j = arg;

	free(j->vhost);
	free(j->reason);
	free(j);
}

static int admin_control_run(struct worker *w, void *arg, struct evbuffer *out)
{
	struct admin_control_job *j = arg;

	return control_apply(w, &j->t, j->a, j->reason);
}

/* The optional body {"reason": "..."}: 0, or -1 when refused (answered). */
static int admin_control_reason(struct http_request *req, char **reason)
{
	struct evbuffer *in = http_body(req);
	size_t len = in ? evbuffer_get_length(in) : 0, i;
	const cJSON *r;
	cJSON *body = NULL;
	char *text;

	*reason = NULL;
	if (len == 0)
		return 0;
	if ((text = malloc(len + 1)) != NULL) {
		evbuffer_copyout(in, text, len);
		text[len] = '\0';
		if (memchr(text, '\0', len) == NULL)
			body = cJSON_ParseWithOpts(text, NULL, 1);
		free(text);
	}
	if (!cJSON_IsObject(body)) {
		cJSON_Delete(body);
		admin_error(req, 400, "the body is not a JSON object");
		return -1;
	}
	r = cJSON_GetObjectItemCaseSensitive(body, "reason");
	if (r && !cJSON_IsString(r)) {
		cJSON_Delete(body);
		admin_error(req, 400, "reason: not a string");
		return -1;
	}
	if (r && strlen(r->valuestring) > ADMIN_CONTROL_REASON_MAX) {
		cJSON_Delete(body);
		admin_error(req, 400, "reason: over 200 bytes");
		return -1;
	}
	for (i = 0; r && r->valuestring[i]; i++) {
		if ((unsigned char)r->valuestring[i] < 0x20 || r->valuestring[i] == 0x7f) {
			cJSON_Delete(body);
			admin_error(req, 400, "reason: a control character");
			return -1;
		}
	}
	if (r && (*reason = strdup(r->valuestring)) == NULL) {
		cJSON_Delete(body);
		admin_error(req, 500, "out of memory");
		return -1;
	}
	cJSON_Delete(body);
	return 0;
}

/* PREFIX/NAME/VERB: NAME (decoded, malloc'd) and VERB; -1 if not of that
 * form, -2 if NAME is badly percent-encoded (or out of memory). */
static int admin_control_split(const char *path, const char *prefix, char **name,
			       const char **verb)
{
	const char *rest = path + strlen(prefix), *slash = strrchr(rest, '/');

	*name = NULL;
	if (slash == NULL || slash == rest || slash[1] == '\0')
		return -1;
	*verb = slash + 1;
	*name = admin_decode(rest, (size_t)(slash - rest), 0);
	return *name ? 0 : -2;
}

/* Not PREFIX/NAME/VERB (404), or NAME badly percent-encoded (400). */
static void admin_control_bad_path(struct http_request *req, int rc, const char *usage)
{
	if (rc == -2)
		admin_error(req, 400, "bad percent-encoding in the path");
	else
		admin_error(req, 404, "not %s", usage);
}

/* Fan the job out and answer {"KEY": ..., "action": VERB, "connections": N}
 * plus extra (", ..." or ""). Takes the job. */
static void admin_control_fan(struct http_request *req, struct admin_control_job *j,
			      const char *key, const char *value, const char *verb,
			      const char *extra)
{
	struct evbuffer *out;
	int n, missing = 0;

	n = admin_each_worker(admin_control_run, j, admin_control_job_free, NULL, &missing);
	if (n < 0) {
		admin_error(req, 500, "out of memory");
		return;
	}
	out = evbuffer_new();
	evbuffer_add_printf(out, "{\"%s\": ", key);
	json_cstring(out, value);
	evbuffer_add_printf(out,
			    ", \"action\": \"%s\", \"connections\": %d, "
			    "\"workers_not_answering\": %d%s}\n",
			    verb, n, missing, extra);
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
}

static struct admin_control_job *admin_control_job(enum control_action a)
{
	struct admin_control_job *j = calloc(1, sizeof(*j));

	if (j) {
		j->a = a;
		j->t.upstream = -1;
	}
	return j;
}

/* POST /connections/ID/close|drain */
static void admin_control_connection(struct http_request *req)
{
	const char *path = http_path(req), *verb;
	struct admin_control_job *j;
	char *idtext = NULL, *end, *reason;
	unsigned long long id;
	struct evbuffer *out;
	int n, rc, missing = 0;

	rc = admin_control_split(path, "/connections/", &idtext, &verb);
	if (rc != 0 || (strcmp(verb, "close") != 0 && strcmp(verb, "drain") != 0)) {
		free(idtext);
		admin_control_bad_path(req, rc,
				       "/connections/ID/close or /connections/ID/drain");
		return;
	}
	id = strtoull(idtext, &end, 10);
	if (idtext[0] < '0' || idtext[0] > '9' || *end != '\0' || id == 0 ||
	    strlen(idtext) > 20) {
		free(idtext);
		admin_error(req, 400, "a connection id is a positive number");
		return;
	}
	free(idtext);
	if (admin_control_reason(req, &reason) != 0)
		return;
	j = admin_control_job(strcmp(verb, "close") == 0 ? CONTROL_CLOSE : CONTROL_DRAIN);
	if (j == NULL) {
		free(reason);
		admin_error(req, 500, "out of memory");
		return;
	}
	j->t.id = id;
	j->reason = reason;
	n = admin_each_worker(admin_control_run, j, admin_control_job_free, NULL, &missing);
	if (n < 0) {
		admin_error(req, 500, "out of memory");
		return;
	}
	if (n == 0 && missing > 0) {
		admin_error(req, 504,
			    "%d worker(s) did not answer within a second: the action may still "
			    "happen",
			    missing);
		return;
	}
	if (n == 0) {
		admin_error(req, 404, "no such connection (or it is closing already)");
		return;
	}
	out = evbuffer_new();
	evbuffer_add_printf(out, "{\"id\": %llu, \"action\": \"%s\", \"connections\": %d}\n",
			    id, verb, n);
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
}

/* POST /vhosts/NAME/pause|resume|disconnect */
static void admin_control_vhost(struct http_request *req)
{
	struct admin_control_job *j;
	const char *verb;
	char *name = NULL, *reason = NULL;
	enum control_action a;
	int rc;

	if ((rc = admin_control_split(http_path(req), "/vhosts/", &name, &verb)) != 0) {
		free(name);
		admin_control_bad_path(req, rc, "/vhosts/NAME/pause, resume or disconnect");
		return;
	}
	if (strlen(name) > 127) {
		free(name);
		admin_error(req, 400, "a vhost name is at most 127 bytes");
		return;
	}
	if (strcmp(verb, "pause") == 0) {
		a = CONTROL_GATE;
	} else if (strcmp(verb, "resume") == 0) {
		a = CONTROL_UNGATE;
	} else if (strcmp(verb, "disconnect") == 0) {
		a = CONTROL_DRAIN;
		if (admin_control_reason(req, &reason) != 0) {
			free(name);
			return;
		}
	} else {
		free(name);
		admin_error(req, 404, "not /vhosts/NAME/pause, resume or disconnect");
		return;
	}
	if (a != CONTROL_DRAIN && control_pause(name, a == CONTROL_GATE) < 0) {
		free(name);
		admin_error(req, 500, "out of memory");
		return;
	}
	/* The job's copy goes with the job, perhaps after this answer. */
	if ((j = admin_control_job(a)) == NULL || (j->vhost = strdup(name)) == NULL) {
		free(j);
		free(name);
		free(reason);
		admin_error(req, 500, "out of memory");
		return;
	}
	j->t.vhost = j->vhost;
	j->reason = reason;
	admin_control_fan(req, j, "vhost", name, verb,
			  a == CONTROL_DRAIN     ? ""
			  : control_paused(name) ? ", \"paused\": true"
						 : ", \"paused\": false");
	free(name);
}

/* POST /upstreams/HOST:PORT/disable|enable|drain */
static void admin_control_upstream(struct http_request *req)
{
	struct admin_control_job *j;
	const char *verb;
	char *name = NULL, extra[64];
	int i, rc;

	rc = admin_control_split(http_path(req), "/upstreams/", &name, &verb);
	if (rc != 0 || (strcmp(verb, "disable") != 0 && strcmp(verb, "enable") != 0 &&
			strcmp(verb, "drain") != 0)) {
		free(name);
		admin_control_bad_path(req, rc,
				       "/upstreams/HOST:PORT/disable, enable or drain");
		return;
	}
	if ((i = upstream_find(name)) < 0) {
		free(name);
		admin_error(req, 404, "no such broker address (GET /stats lists them)");
		return;
	}
	if (strcmp(verb, "drain") != 0) {
		struct evbuffer *out = evbuffer_new();

		upstream_disable(i, strcmp(verb, "disable") == 0);
		evbuffer_add_printf(out, "{\"address\": ");
		json_cstring(out, name);
		evbuffer_add_printf(out, ", \"action\": \"%s\", \"disabled\": %s}\n", verb,
				    upstream_disabled(i) ? "true" : "false");
		http_reply(req, 200, "application/json", out);
		evbuffer_free(out);
		free(name);
		return;
	}
	if ((j = admin_control_job(CONTROL_DRAIN)) == NULL) {
		free(name);
		admin_error(req, 500, "out of memory");
		return;
	}
	j->t.upstream = i;
	snprintf(extra, sizeof(extra), ", \"disabled\": %s",
		 upstream_disabled(i) ? "true" : "false");
	admin_control_fan(req, j, "address", name, verb, extra);
	free(name);
}

void admin_control(struct http_request *req, void *arg)
{
	const char *path = http_path(req);

	(void)arg;
	if (strncmp(path, "/connections/", 13) == 0)
		admin_control_connection(req);
	else if (strncmp(path, "/vhosts/", 8) == 0)
		admin_control_vhost(req);
	else
		admin_control_upstream(req);
}
