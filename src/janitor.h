/* janitor: the proxy's housekeeping off the message path: purging claim
 * payloads past their vhost's retention, and idempotency records and
 * publish-dedup values whose time ran out, on a thread of its own. */
#ifndef ACEMQ_JANITOR_H
#define ACEMQ_JANITOR_H

struct rules;
struct state;

/* Before the listeners open: remove what a crash left half-written. */
void janitor_startup(const struct rules *r);
/* Purge every interval_s seconds (0: never); idempotency records and
 * publish-dedup values live in st (may be NULL). */
int janitor_start(long interval_s, struct state *st);
/* The rules in force (takes a reference). */
void janitor_set_rules(struct rules *r);
void janitor_stop(void);

#endif
