/* limits: connection and channel limits the workers share. */
#include "limits.h"

#include "log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct limits_vhost {
	char *name;
	long open;
	struct limits_vhost *next;
};

static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static struct limits_vhost *limits_vhosts;
static long limits_per_vhost, limits_channels;
static int limits_episode[LIMITS_REASONS];

static const char *const limits_names[LIMITS_REASONS] = {
    "max_connections", "max_connections_per_vhost", "max_channels"};

void limits_init(long max_connections_per_vhost, long max_channels)
{
	limits_per_vhost = max_connections_per_vhost;
	limits_channels = max_channels;
}

long limits_max_channels(void)
{
	return limits_channels;
}

long limits_max_per_vhost(void)
{
	return limits_per_vhost;
}

void limits_refused(enum limits_reason r, const char *what)
{
	int first;

	pthread_mutex_lock(&limits_lock);
	first = !limits_episode[r];
	limits_episode[r] = 1;
	pthread_mutex_unlock(&limits_lock);
	if (first)
		log_warning("%s reached: %s (further refusals are not logged until one is "
			    "admitted again)",
			    limits_names[r], what);
}

void limits_admitted(enum limits_reason r)
{
	int was;

	pthread_mutex_lock(&limits_lock);
	was = limits_episode[r];
	limits_episode[r] = 0;
	pthread_mutex_unlock(&limits_lock);
	if (was)
		log_info("%s: admitting again", limits_names[r]);
}

static struct limits_vhost *limits_find(const char *vhost, int create)
{
	struct limits_vhost *v;

	for (v = limits_vhosts; v; v = v->next)
		if (strcmp(v->name, vhost) == 0)
			return v;
	if (!create || (v = calloc(1, sizeof(*v))) == NULL)
		return NULL;
	if ((v->name = strdup(vhost)) == NULL) {
		free(v);
		return NULL;
	}
	v->next = limits_vhosts;
	limits_vhosts = v;
	return v;
}

int limits_vhost_enter(const char *vhost)
{
	struct limits_vhost *v;
	int ok = 1;

	if (limits_per_vhost <= 0)
		return 0;
	pthread_mutex_lock(&limits_lock);
	v = limits_find(vhost, 1);
	if (v && v->open >= limits_per_vhost)
		ok = 0;
	else if (v)
		v->open++;
	pthread_mutex_unlock(&limits_lock);
	if (ok)
		limits_admitted(LIMITS_MAX_CONNECTIONS_PER_VHOST);
	return ok ? 0 : -1;
}

void limits_vhost_leave(const char *vhost)
{
	struct limits_vhost *v;

	if (limits_per_vhost <= 0)
		return;
	pthread_mutex_lock(&limits_lock);
	v = limits_find(vhost, 0);
	if (v && v->open > 0)
		v->open--;
	pthread_mutex_unlock(&limits_lock);
}
