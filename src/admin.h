/* admin: the HTTP endpoint that shows counters and settings. */
#ifndef ACEMQ_ADMIN_H
#define ACEMQ_ADMIN_H

struct event_base;
struct config;
struct worker;

int admin_open(struct event_base *base, const char *addr, const struct config *cfg,
	       struct worker *workers, int nworkers);
void admin_close(void);

#endif
