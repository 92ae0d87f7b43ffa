/* probe: asks each broker address of the lists in force what it announces
 * in connection.start, for the greeting (see greeting.h), with a short
 * connection of the proxy's own on the main thread's loop. */
#ifndef ACEMQ_PROBE_H
#define ACEMQ_PROBE_H

struct event_base;
struct rules;

/* Before the first probe_rules: the loop, how long an ask may take
 * (connect_timeout_ms) and how long until an address that did not answer
 * is asked again (upstream_retry_ms, at least a second). 0 or -1. */
int probe_init(struct event_base *base, long timeout_ms, long retry_ms);
/* A rules set comes into force (at start, on reload): when it makes the
 * proxy greet clients, every address of the global list and of the vhosts'
 * lists whose properties are not known is asked; other addresses no
 * longer are. */
void probe_rules(const struct rules *r);
/* Close what is in progress (at exit, the loop stopped). */
void probe_stop(void);

#endif
