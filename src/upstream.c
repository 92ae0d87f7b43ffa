/* upstream: the broker addresses, tried in order; a node that just failed
 * is skipped for a while. */
#include "upstream.h"

#include "log.h"

#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "config.h"

static struct upstream_node upstream_nodes[UPSTREAM_MAX];
static int upstream_n;
static long upstream_retry_ms = 10000;
static atomic_llong upstream_down_until[UPSTREAM_MAX]; /* ms, monotonic */

static long long upstream_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int upstream_add_sockaddr(const struct sockaddr *sa, int salen, const char *name)
{
	if (upstream_n == UPSTREAM_MAX || salen > (int)sizeof(struct sockaddr_storage))
		return -1;
	memcpy(&upstream_nodes[upstream_n].sa, sa, (size_t)salen);
	upstream_nodes[upstream_n].salen = salen;
	snprintf(upstream_nodes[upstream_n].name, sizeof(upstream_nodes[upstream_n].name), "%s",
		 name);
	upstream_n++;
	return 0;
}

int upstream_add(const char *addr)
{
	struct addrinfo hints, *res = NULL;
	char host[256], port[16];
	int p, rc;

	if (config_addr_split(addr, host, sizeof(host), &p) != 0)
		return -1;
	snprintf(port, sizeof(port), "%d", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) {
		fprintf(stderr, "upstream: cannot resolve %s\n", addr);
		return -1;
	}
	rc = upstream_add_sockaddr(res->ai_addr, (int)res->ai_addrlen, addr);
	freeaddrinfo(res);
	return rc;
}

void upstream_set_retry_ms(long ms)
{
	upstream_retry_ms = ms;
}

int upstream_count(void)
{
	return upstream_n;
}

const struct upstream_node *upstream_node(int i)
{
	return i >= 0 && i < upstream_n ? &upstream_nodes[i] : NULL;
}

int upstream_pick(unsigned tried)
{
	long long now = upstream_now_ms();
	int i, fallback = -1;

	for (i = 0; i < upstream_n; i++) {
		if (tried & (1u << i))
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

	if (i < 0 || i >= upstream_n)
		return;
	if (atomic_exchange(&upstream_down_until[i], until) == 0 && upstream_n > 1)
		log_warning("broker %s failed: skipped for %ld ms", upstream_nodes[i].name,
			    upstream_retry_ms);
}

int upstream_any_up(void)
{
	long long now = upstream_now_ms();
	int i;

	for (i = 0; i < upstream_n; i++)
		if (atomic_load(&upstream_down_until[i]) <= now)
			return 1;
	return 0;
}

void upstream_ok(int i)
{
	if (i >= 0 && i < upstream_n && atomic_exchange(&upstream_down_until[i], 0) != 0 &&
	    upstream_n > 1)
		log_info("broker %s answers again", upstream_nodes[i].name);
}
