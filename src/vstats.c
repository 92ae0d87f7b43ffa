/* vstats: counters per vhost and queue (the idempotency answers) and per
 * vhost (publish dedup), one X-macro list for storage, /stats and /metrics. */
#include "vstats.h"
#include "json.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct vstats {
	char *vhost, *queue;      /* queue NULL: the vhost's own counters */
	uint64_t v[VSTATS_COUNT]; /* atomic */
	struct vstats *next;
};

static pthread_mutex_t vstats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vstats *vstats_list;

struct vstats *vstats_get(const char *vhost, const char *queue)
{
	struct vstats *v;

	pthread_mutex_lock(&vstats_lock);
	for (v = vstats_list; v; v = v->next)
		if (strcmp(v->vhost, vhost) == 0 &&
		    (queue ? v->queue && strcmp(v->queue, queue) == 0 : v->queue == NULL))
			break;
	if (v == NULL && (v = calloc(1, sizeof(*v))) != NULL) {
		v->vhost = strdup(vhost);
		v->queue = queue ? strdup(queue) : NULL;
		if (v->vhost == NULL || (queue && v->queue == NULL)) {
			free(v->vhost);
			free(v->queue);
			free(v);
			v = NULL;
		} else {
			v->next = vstats_list;
			vstats_list = v;
		}
	}
	pthread_mutex_unlock(&vstats_lock);
	return v;
}

void vstats_add(struct vstats *v, enum vstats_counter which)
{
	if (v)
		__atomic_fetch_add(&v->v[which], 1, __ATOMIC_RELAXED);
}

void vstats_escape(struct evbuffer *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			evbuffer_add_printf(out, "\\%c", *s);
		else if (*s == '\n')
			evbuffer_add(out, "\\n", 2);
		else
			evbuffer_add(out, s, 1);
	}
}

/* Whether a row holds the counters of a scope: Q rows name a queue. */
#define VSTATS_IN_Q(v) ((v)->queue != NULL)
#define VSTATS_IN_V(v) ((v)->queue == NULL)

void vstats_json(struct evbuffer *out)
{
	struct vstats *v;
	int first = 1;

	pthread_mutex_lock(&vstats_lock);
	evbuffer_add_printf(out, "[");
	for (v = vstats_list; v; v = v->next) {
		evbuffer_add_printf(out, "%s\n    {\"vhost\": ", first ? "" : ",");
		json_cstring(out, v->vhost);
		if (v->queue) {
			evbuffer_add_printf(out, ", \"queue\": ");
			json_cstring(out, v->queue);
		}
#define VSTATS_JSON(name, scope, metric, labels, help)                                        \
	if (VSTATS_IN_##scope(v))                                                             \
		evbuffer_add_printf(out, ", \"%s\": %llu", #name,                             \
				    (unsigned long long)__atomic_load_n(&v->v[VSTATS_##name], \
									__ATOMIC_RELAXED));
		VSTATS_COUNTERS(VSTATS_JSON)
#undef VSTATS_JSON
		evbuffer_add_printf(out, "}");
		first = 0;
	}
	evbuffer_add_printf(out, "%s]", first ? "" : "\n  ");
	pthread_mutex_unlock(&vstats_lock);
}

void vstats_metrics(struct evbuffer *out)
{
	struct vstats *v;
	const char *family = "";
	int any;

	pthread_mutex_lock(&vstats_lock);
#define VSTATS_METRIC(name, scope, metric, labels, help)                                      \
	for (any = 0, v = vstats_list; v && !any; v = v->next)                                \
		any = VSTATS_IN_##scope(v);                                                   \
	if (any && strcmp(family, metric) != 0) {                                             \
		family = metric;                                                              \
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n", metric, help,   \
				    metric);                                                  \
	}                                                                                     \
	for (v = vstats_list; v; v = v->next) {                                               \
		if (!VSTATS_IN_##scope(v))                                                    \
			continue;                                                             \
		evbuffer_add_printf(out, "%s{vhost=\"", metric);                              \
		vstats_escape(out, v->vhost);                                                 \
		if (v->queue) {                                                               \
			evbuffer_add_printf(out, "\",queue=\"");                              \
			vstats_escape(out, v->queue);                                         \
		}                                                                             \
		evbuffer_add_printf(out, "\"%s%s} %llu\n", labels[0] ? "," : "", labels,      \
				    (unsigned long long)__atomic_load_n(&v->v[VSTATS_##name], \
									__ATOMIC_RELAXED));   \
	}
	VSTATS_COUNTERS(VSTATS_METRIC)
#undef VSTATS_METRIC
	pthread_mutex_unlock(&vstats_lock);
}
