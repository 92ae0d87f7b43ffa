/* limits: connection and channel limits the workers share. */
#include "limits.h"

#include "log.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The vhosts with connections open, in a chained hash table that grows
 * with them: an entry goes when its last connection does, so names a
 * client made up before authenticating (greeting mode) do not stay. */
struct limits_vhost {
	char *name;
	long open;
	struct limits_vhost *next;
};

#define LIMITS_BUCKETS_MIN 64

static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static struct limits_vhost **limits_table;
static size_t limits_nbuckets, limits_count;
static uint64_t limits_seed;
static long limits_per_vhost, limits_channels;
static int limits_episode[LIMITS_REASONS];
static long limits_open; /* atomic: client connections counted in */

static const char *const limits_names[LIMITS_REASONS] = {
    "max_connections", "max_connections_per_vhost", "max_channels", "limits.connections_per_s"};

void limits_init(long max_connections_per_vhost, long max_channels)
{
	struct timespec ts;

	if (RAND_bytes((unsigned char *)&limits_seed, sizeof(limits_seed)) != 1) {
		clock_gettime(CLOCK_REALTIME, &ts);
		limits_seed =
		    (uint64_t)ts.tv_sec << 32 ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
	}
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

int limits_connection_enter(long max)
{
	long n = __atomic_load_n(&limits_open, __ATOMIC_RELAXED);

	do {
		if (n >= max)
			return -1;
	} while (!__atomic_compare_exchange_n(&limits_open, &n, n + 1, 0, __ATOMIC_ACQ_REL,
					      __ATOMIC_RELAXED));
	return 0;
}

void limits_connection_leave(void)
{
	__atomic_sub_fetch(&limits_open, 1, __ATOMIC_ACQ_REL);
}

long limits_connections_open(void)
{
	return __atomic_load_n(&limits_open, __ATOMIC_RELAXED);
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

/* FNV-1a from a seed drawn at start, so which names share a bucket is
 * not known in advance; then a final mix. */
static size_t limits_hash(const char *name)
{
	uint64_t h = limits_seed ^ 0xcbf29ce484222325ULL;

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 0x100000001b3ULL;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return (size_t)h;
}

/* Twice the buckets when the entries outnumber them (a failed grow keeps
 * the table: chains get longer, nothing is lost). */
static void limits_grow(void)
{
	size_t n = limits_nbuckets ? limits_nbuckets * 2 : LIMITS_BUCKETS_MIN, i;
	struct limits_vhost **t = calloc(n, sizeof(*t)), *v, *next;

	if (t == NULL)
		return;
	for (i = 0; i < limits_nbuckets; i++) {
		for (v = limits_table[i]; v; v = next) {
			next = v->next;
			v->next = t[limits_hash(v->name) & (n - 1)];
			t[limits_hash(v->name) & (n - 1)] = v;
		}
	}
	free(limits_table);
	limits_table = t;
	limits_nbuckets = n;
}

/* Under limits_lock: the entry of vhost, or NULL; *slot is the link that
 * points at it (or where a new one goes). */
static struct limits_vhost *limits_find(const char *vhost, struct limits_vhost ***slot)
{
	struct limits_vhost **p;

	if (limits_nbuckets == 0)
		return NULL;
	for (p = &limits_table[limits_hash(vhost) & (limits_nbuckets - 1)]; *p; p = &(*p)->next)
		if (strcmp((*p)->name, vhost) == 0)
			break;
	*slot = p;
	return *p;
}

static struct limits_vhost *limits_add(const char *vhost)
{
	struct limits_vhost *v, **slot;

	if (limits_count >= limits_nbuckets)
		limits_grow();
	if (limits_nbuckets == 0 || (v = calloc(1, sizeof(*v))) == NULL)
		return NULL;
	if ((v->name = strdup(vhost)) == NULL) {
		free(v);
		return NULL;
	}
	limits_find(vhost, &slot);
	v->next = *slot;
	*slot = v;
	limits_count++;
	return v;
}

long limits_vhosts_tracked(void)
{
	long n;

	pthread_mutex_lock(&limits_lock);
	n = (long)limits_count;
	pthread_mutex_unlock(&limits_lock);
	return n;
}

int limits_vhost_enter(const char *vhost)
{
	struct limits_vhost *v, **slot;
	int ok = 1;

	if (limits_per_vhost <= 0)
		return 0;
	pthread_mutex_lock(&limits_lock);
	v = limits_find(vhost, &slot);
	if (v == NULL)
		v = limits_add(vhost);
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
	struct limits_vhost *v, **slot;

	if (limits_per_vhost <= 0)
		return;
	pthread_mutex_lock(&limits_lock);
	v = limits_find(vhost, &slot);
	if (v && v->open > 0)
		v->open--;
	if (v && v->open == 0) {
		*slot = v->next;
		limits_count--;
		free(v->name);
		free(v);
	}
	pthread_mutex_unlock(&limits_lock);
}
