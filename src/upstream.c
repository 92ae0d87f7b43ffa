/* upstream: the broker addresses, tried in order; a node that just failed
 * is skipped for a while. */
#include "upstream.h"

#include "log.h"

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "config.h"

static struct upstream_node upstream_nodes[UPSTREAM_MAX];
/* Nodes are only ever added, each filled in before the count that shows
 * it is published; the first upstream_nglobal form the global list. */
static atomic_int upstream_n;
static int upstream_nglobal;
static pthread_mutex_t upstream_lock = PTHREAD_MUTEX_INITIALIZER;
static long upstream_retry_ms = 10000;
static atomic_llong upstream_down_until[UPSTREAM_MAX]; /* ms, monotonic */
static atomic_int upstream_off[UPSTREAM_MAX];          /* disabled by the operator */

static long long upstream_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int upstream_append(const struct sockaddr *sa, int salen, const char *name)
{
	int n = atomic_load(&upstream_n);

	if (n == UPSTREAM_MAX || salen > (int)sizeof(struct sockaddr_storage))
		return -1;
	memcpy(&upstream_nodes[n].sa, sa, (size_t)salen);
	upstream_nodes[n].salen = salen;
	snprintf(upstream_nodes[n].name, sizeof(upstream_nodes[n].name), "%s", name);
	atomic_store(&upstream_n, n + 1);
	return n;
}

int upstream_add_sockaddr(const struct sockaddr *sa, int salen, const char *name)
{
	int i;

	pthread_mutex_lock(&upstream_lock);
	i = upstream_nglobal == atomic_load(&upstream_n) ? upstream_append(sa, salen, name)
							 : -1;
	if (i >= 0)
		upstream_nglobal++;
	pthread_mutex_unlock(&upstream_lock);
	return i < 0 ? -1 : 0;
}

/* Resolve addr; 0, or -1 with the reason in err. */
static int upstream_resolve(const char *addr, struct sockaddr_storage *sa, int *salen,
			    char *err, size_t errlen)
{
	struct addrinfo hints, *res = NULL;
	char host[256], port[16];
	int p;

	if (config_addr_split(addr, host, sizeof(host), &p) != 0) {
		snprintf(err, errlen, "%s is not HOST:PORT", addr);
		return -1;
	}
	snprintf(port, sizeof(port), "%d", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL ||
	    res->ai_addrlen > sizeof(*sa)) {
		if (res)
			freeaddrinfo(res);
		snprintf(err, errlen, "cannot resolve %s", addr);
		return -1;
	}
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	*salen = (int)res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

int upstream_add(const char *addr)
{
	struct sockaddr_storage sa;
	char err[320];
	int salen;

	if (upstream_resolve(addr, &sa, &salen, err, sizeof(err)) != 0) {
		fprintf(stderr, "upstream: %s\n", err);
		return -1;
	}
	return upstream_add_sockaddr((struct sockaddr *)&sa, salen, addr);
}

int upstream_intern(const char *addr, char *err, size_t errlen)
{
	struct sockaddr_storage sa;
	int salen, i, n;

	pthread_mutex_lock(&upstream_lock);
	n = atomic_load(&upstream_n);
	for (i = 0; i < n; i++)
		if (strcmp(upstream_nodes[i].name, addr) == 0)
			break;
	if (i == n) {
		if (upstream_resolve(addr, &sa, &salen, err, errlen) != 0)
			i = -1;
		else if ((i = upstream_append((struct sockaddr *)&sa, salen, addr)) < 0)
			snprintf(err, errlen, "more than %d broker addresses in all",
				 UPSTREAM_MAX);
	}
	pthread_mutex_unlock(&upstream_lock);
	return i;
}

void upstream_set_retry_ms(long ms)
{
	upstream_retry_ms = ms;
}

const struct upstream_node *upstream_node(int i)
{
	return i >= 0 && i < atomic_load(&upstream_n) ? &upstream_nodes[i] : NULL;
}

int upstream_pick(const struct upstream_list *list, unsigned tried)
{
	long long now = upstream_now_ms();
	int k, i, n = list ? list->n : upstream_nglobal, fallback = -1;

	for (k = 0; k < n; k++) {
		i = list ? list->at[k] : k;
		if ((tried & (1u << i)) || atomic_load(&upstream_off[i]))
			continue;
		if (atomic_load(&upstream_down_until[i]) <= now)
			return i;
		if (fallback < 0)
			fallback = i;
	}
	return fallback; /* all down: try them anyway, in order */
}

void upstream_failed(int i)
{
	long long until = upstream_now_ms() + upstream_retry_ms;

	if (i < 0 || i >= atomic_load(&upstream_n))
		return;
	if (atomic_exchange(&upstream_down_until[i], until) == 0 &&
	    atomic_load(&upstream_n) > 1)
		log_warning("broker %s failed: skipped for %ld ms", upstream_nodes[i].name,
			    upstream_retry_ms);
}

int upstream_any_up(void)
{
	long long now = upstream_now_ms();
	int i;

	for (i = 0; i < upstream_nglobal; i++)
		if (atomic_load(&upstream_down_until[i]) <= now &&
		    !atomic_load(&upstream_off[i]))
			return 1;
	return 0;
}

int upstream_count(int *nglobal)
{
	if (nglobal)
		*nglobal = upstream_nglobal;
	return atomic_load(&upstream_n);
}

int upstream_down(int i)
{
	return i >= 0 && i < atomic_load(&upstream_n) &&
	       atomic_load(&upstream_down_until[i]) > upstream_now_ms();
}

void upstream_ok(int i)
{
	if (i >= 0 && i < atomic_load(&upstream_n) &&
	    atomic_exchange(&upstream_down_until[i], 0) != 0 && atomic_load(&upstream_n) > 1)
		log_info("broker %s answers again", upstream_nodes[i].name);
}

int upstream_find(const char *name)
{
	int i, n = atomic_load(&upstream_n);

	for (i = 0; i < n; i++)
		if (strcmp(upstream_nodes[i].name, name) == 0)
			return i;
	return -1;
}

void upstream_disable(int i, int off)
{
	if (i < 0 || i >= atomic_load(&upstream_n))
		return;
	if (atomic_exchange(&upstream_off[i], off ? 1 : 0) != (off ? 1 : 0))
		log_info("broker %s %s", upstream_nodes[i].name,
			 off ? "disabled: new connections skip it" : "enabled");
}

int upstream_disabled(int i)
{
	return i >= 0 && i < atomic_load(&upstream_n) && atomic_load(&upstream_off[i]);
}
