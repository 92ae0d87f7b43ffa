/* upstream: the broker addresses, tried in order for each new client; a
 * node that just failed is skipped for a while by every worker. The
 * global list comes from the settings; a vhost's rules may name a list of
 * its own, whose addresses join the same table (and its down marks). */
#ifndef ACEMQ_UPSTREAM_H
#define ACEMQ_UPSTREAM_H

#include <stddef.h>
#include <sys/socket.h>

#define UPSTREAM_MAX 32 /* addresses in all: the global list and every vhost's */

struct upstream_node {
	struct sockaddr_storage sa;
	int salen;
	char name[300];
};

/* An ordered list of addresses: indexes into the table. */
struct upstream_list {
	int n;
	unsigned char at[UPSTREAM_MAX];
};

/* Resolve "HOST:PORT" and add it to the global list; -1 (with the reason
 * on stderr) when it does not resolve or there are too many. Before the
 * workers start. */
int upstream_add(const char *addr);
/* The table index of "HOST:PORT", resolved and added when new (a rules
 * load, on the main thread, while workers read the table); -1 with the
 * reason in err. */
int upstream_intern(const char *addr, char *err, size_t errlen);
/* Set a node directly (tests). */
int upstream_add_sockaddr(const struct sockaddr *sa, int salen, const char *name);
void upstream_set_retry_ms(long ms);
const struct upstream_node *upstream_node(int i);

/* The next node of list (NULL: the global one) for a client that has
 * tried the nodes in tried (a bit per table index): the first untried one
 * not marked down, else the first untried one at all; -1 when every node
 * was tried. A disabled node is never picked. */
int upstream_pick(const struct upstream_list *list, unsigned tried);
/* A connect to node i failed (marked down for the retry time), or
 * succeeded (marked up). */
void upstream_failed(int i);
void upstream_ok(int i);
/* Whether some address of the global list is not marked down. */
int upstream_any_up(void);
/* Addresses in the table (the global list first: nglobal of them), and
 * whether node i is marked down now (admin views). */
int upstream_count(int *nglobal);
int upstream_down(int i);
/* The operator's switch (POST /upstreams/HOST:PORT/disable): new
 * connections skip a disabled node; those open stay. upstream_find gives
 * the index of the address named exactly so, or -1. Any thread. */
int upstream_find(const char *name);
void upstream_disable(int i, int off);
int upstream_disabled(int i);

#endif
