/* upstream: the broker addresses, tried in order for each new client; a
 * node that just failed is skipped for a while by every worker. */
#ifndef ACEMQ_UPSTREAM_H
#define ACEMQ_UPSTREAM_H

#include <sys/socket.h>

#define UPSTREAM_MAX 16

struct upstream_node {
	struct sockaddr_storage sa;
	int salen;
	char name[300];
};

/* Resolve "HOST:PORT" and add it; -1 (with the reason on stderr) when it
 * does not resolve or there are too many. */
int upstream_add(const char *addr);
/* Set a node directly (tests). */
int upstream_add_sockaddr(const struct sockaddr *sa, int salen, const char *name);
void upstream_set_retry_ms(long ms);
int upstream_count(void);
const struct upstream_node *upstream_node(int i);

/* The next node for a client that has tried the nodes in tried (a bit per
 * node): the first untried one not marked down, else the first untried
 * one at all; -1 when every node was tried. */
int upstream_pick(unsigned tried);
/* A connect to node i failed (marked down for the retry time), or
 * succeeded (marked up). */
void upstream_failed(int i);
void upstream_ok(int i);
/* Whether some address is not marked down. */
int upstream_any_up(void);

#endif
