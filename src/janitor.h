/* janitor: the proxy's housekeeping off the message path: purging claim
 * payloads past their vhost's retention, on a thread of its own. */
#ifndef ACEMQ_JANITOR_H
#define ACEMQ_JANITOR_H

struct rules;

/* Before the listeners open: remove what a crash left half-written. */
void janitor_startup(const struct rules *r);
/* Purge every interval_s seconds (0: never). */
int janitor_start(long interval_s);
/* The rules in force (takes a reference). */
void janitor_set_rules(struct rules *r);
void janitor_stop(void);

#endif
