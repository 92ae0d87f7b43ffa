/* replay_jobs: the registry of replays (started, waited on, cancelled,
 * the ended ones kept for GET, the oldest dropped) and their JSON. Each
 * replay's work is its thread's (replay.c). */
#include "replay_int.h"

#include "engine_conn.h"
#include "json.h"
#include "store/state.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const replay_state_names[] = {"starting", "running", "done", "cancelled", "failed"};

pthread_mutex_t replay_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t replay_cond = PTHREAD_COND_INITIALIZER;
static struct replay *replay_list;
static long replay_next_id;

/* ---- the registry ---------------------------------------------------------------------- */

static struct replay *replay_find(long id)
{
	struct replay *j;

	for (j = replay_list; j; j = j->next)
		if (j->id == id)
			return j;
	return NULL;
}

static int replay_ended(const struct replay *j)
{
	return j->state >= REPLAY_DONE;
}

/* Unlink and free an ended replay (its thread has returned or is about to). */
static void replay_drop(struct replay **pp)
{
	struct replay *j = *pp;

	*pp = j->next;
	pthread_join(j->thread, NULL);
	free(j);
}

long replay_start(const struct replay_spec *spec)
{
	struct replay *j, **pp, **oldest;
	int running = 0, kept = 0;
	long id;

	if (!engine_conn_enabled())
		return REPLAY_ERR_DISABLED;
	pthread_mutex_lock(&replay_lock);
	for (j = replay_list; j; j = j->next) {
		if (replay_ended(j)) {
			kept++;
			continue;
		}
		running++;
		if (strcmp(j->spec.vhost, spec->vhost) == 0 &&
		    strcmp(j->spec.queue, spec->queue) == 0) {
			pthread_mutex_unlock(&replay_lock);
			return REPLAY_ERR_SAME;
		}
	}
	if (running >= REPLAY_MAX_RUNNING) {
		pthread_mutex_unlock(&replay_lock);
		return REPLAY_ERR_BUSY;
	}
	/* Room for one more ended one: the oldest go. */
	while (kept >= REPLAY_KEEP) {
		oldest = NULL;
		for (pp = &replay_list; *pp; pp = &(*pp)->next)
			if (replay_ended(*pp))
				oldest = pp;
		replay_drop(oldest);
		kept--;
	}
	if ((j = calloc(1, sizeof(*j))) == NULL) {
		pthread_mutex_unlock(&replay_lock);
		return REPLAY_ERR_NOMEM;
	}
	j->spec = *spec;
	j->id = id = ++replay_next_id;
	j->state = REPLAY_STARTING;
	j->start_status = 202;
	j->started_ms = state_now_ms();
	if (pthread_create(&j->thread, NULL, replay_main, j) != 0) {
		free(j);
		replay_next_id--;
		pthread_mutex_unlock(&replay_lock);
		return REPLAY_ERR_NOMEM;
	}
	j->next = replay_list;
	replay_list = j;
	pthread_mutex_unlock(&replay_lock);
	return id;
}

static void replay_deadline(struct timespec *ts, long ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

int replay_started(long id, long ms, const char **why)
{
	struct timespec until;
	struct replay *j;
	int status = 404;

	replay_deadline(&until, ms);
	*why = NULL;
	pthread_mutex_lock(&replay_lock);
	while ((j = replay_find(id)) != NULL && j->state == REPLAY_STARTING)
		if (pthread_cond_timedwait(&replay_cond, &replay_lock, &until) != 0)
			break;
	if (j) {
		status = j->start_status;
		*why = j->start_why;
	}
	pthread_mutex_unlock(&replay_lock);
	return status;
}

void replay_forget(long id)
{
	struct replay **pp;

	pthread_mutex_lock(&replay_lock);
	for (pp = &replay_list; *pp; pp = &(*pp)->next)
		if ((*pp)->id == id && replay_ended(*pp)) {
			replay_drop(pp);
			break;
		}
	pthread_mutex_unlock(&replay_lock);
}

int replay_cancel(long id)
{
	struct replay *j;
	int rc = -1;

	pthread_mutex_lock(&replay_lock);
	if ((j = replay_find(id)) != NULL) {
		rc = !replay_ended(j);
		if (rc)
			__atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&replay_lock);
	return rc;
}

int replay_wait(long id, long ms)
{
	struct timespec until;
	struct replay *j;
	int rc = -1;

	replay_deadline(&until, ms);
	pthread_mutex_lock(&replay_lock);
	while ((j = replay_find(id)) != NULL && !replay_ended(j))
		if (pthread_cond_timedwait(&replay_cond, &replay_lock, &until) != 0)
			break;
	if (j)
		rc = replay_ended(j);
	pthread_mutex_unlock(&replay_lock);
	return rc;
}

void replay_stop(void)
{
	struct replay *j;

	pthread_mutex_lock(&replay_lock);
	for (j = replay_list; j; j = j->next)
		__atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
	while (replay_list) {
		j = replay_list;
		replay_list = j->next;
		/* The thread takes the lock to say it ended: not held while
		 * it is waited for. */
		pthread_mutex_unlock(&replay_lock);
		pthread_join(j->thread, NULL);
		free(j);
		pthread_mutex_lock(&replay_lock);
	}
	pthread_mutex_unlock(&replay_lock);
}

/* ---- views ------------------------------------------------------------------------------ */

static void replay_one_json(const struct replay *j, struct evbuffer *out)
{
	static const char *const names[] = {
#define REPLAY_NAME(name, what) #name,
	    REPLAY_REASONS(REPLAY_NAME)
#undef REPLAY_NAME
	};
	uint64_t skipped = 0;
	int i;

	for (i = 0; i < REPLAY_NREASONS; i++)
		skipped += j->skipped[i];
	evbuffer_add_printf(out, "{\"id\": %ld, \"vhost\": ", j->id);
	json_string(out, j->spec.vhost, strlen(j->spec.vhost));
	evbuffer_add_printf(out, ", \"queue\": ");
	json_string(out, j->spec.queue, strlen(j->spec.queue));
	if (j->spec.has_target) {
		evbuffer_add_printf(out, ", \"target\": {\"exchange\": ");
		json_string(out, j->spec.exchange, strlen(j->spec.exchange));
		evbuffer_add_printf(out, ", \"routing_key\": ");
		json_string(out, j->spec.routing_key, strlen(j->spec.routing_key));
		evbuffer_add_printf(out, "}");
	} else {
		evbuffer_add_printf(out, ", \"target\": \"x-death\"");
	}
	evbuffer_add_printf(
	    out,
	    ", \"count\": %ld, \"rate\": %ld, \"state\": \"%s\", \"queued\": %ld, "
	    "\"taken\": %llu, \"moved\": %llu, \"skipped\": %llu, "
	    "\"skipped_by\": {",
	    j->spec.count, j->spec.rate, replay_state_names[j->state], j->queued,
	    (unsigned long long)j->taken, (unsigned long long)j->moved,
	    (unsigned long long)skipped);
	for (i = 0; i < REPLAY_NREASONS; i++)
		evbuffer_add_printf(out, "%s\"%s\": %llu", i ? ", " : "", names[i],
				    (unsigned long long)j->skipped[i]);
	evbuffer_add_printf(out, "}, \"missing\": [");
	for (i = 0; i < j->nmissing; i++) {
		evbuffer_add_printf(out, "%s{\"key\": \"%s\"", i ? ", " : "",
				    j->missing[i].key);
		if (j->missing[i].has_id) {
			evbuffer_add_printf(out, ", \"message_id\": ");
			json_string(out, j->missing[i].message_id, j->missing[i].id_len);
		}
		evbuffer_add_printf(out, "}");
	}
	evbuffer_add_printf(out, "], \"empty\": %s, \"started_at_ms\": %llu, \"ended_at_ms\": ",
			    j->empty ? "true" : "false", (unsigned long long)j->started_ms);
	if (replay_ended(j))
		evbuffer_add_printf(out, "%llu", (unsigned long long)j->ended_ms);
	else
		evbuffer_add_printf(out, "null");
	if (j->start_why || j->error[0]) {
		const char *e = j->start_why ? j->start_why : j->error;

		evbuffer_add_printf(out, ", \"error\": ");
		json_string(out, e, strlen(e));
	}
	evbuffer_add_printf(out, "}");
}

int replay_json(long id, struct evbuffer *out)
{
	struct replay *j;

	pthread_mutex_lock(&replay_lock);
	j = replay_find(id);
	if (j) {
		replay_one_json(j, out);
		evbuffer_add_printf(out, "\n");
	}
	pthread_mutex_unlock(&replay_lock);
	return j ? 0 : -1;
}

void replay_list_json(struct evbuffer *out)
{
	struct replay *j;

	pthread_mutex_lock(&replay_lock);
	evbuffer_add_printf(out, "{\"replays\": [");
	for (j = replay_list; j; j = j->next) {
		evbuffer_add_printf(out, "%s\n  ", j == replay_list ? "" : ",");
		replay_one_json(j, out);
	}
	evbuffer_add_printf(out, "%s]}\n", replay_list ? "\n" : "");
	pthread_mutex_unlock(&replay_lock);
}
