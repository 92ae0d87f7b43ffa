/* ratelimit: a vhost's connection and publish rates (the rules' "limits"),
 * shared by every worker: a token bucket per vhost and rate, holding a
 * second's worth. Past the connection rate a client is refused (530) or,
 * in alarm mode, counted; past the byte rate its publishers wait (their
 * reads stop for as long as the bucket is in debt) or, in alarm mode, are
 * counted. Alarm mode logs once per episode (until the rate is kept again).
 * Only vhosts named in the rules have buckets: no client makes one. */
#ifndef ACEMQ_RATELIMIT_H
#define ACEMQ_RATELIMIT_H

#include <stddef.h>

struct rules_limits;

/* A connection of vhost opens: 0 admitted, -1 refused (enforce mode, over
 * the rate). */
int ratelimit_connection(const char *vhost, const struct rules_limits *l);
/* n content bytes a publisher of vhost sent: how many ms it waits before
 * it is read again (0: none). */
long ratelimit_publish(const char *vhost, const struct rules_limits *l, size_t n);
/* Tests: every bucket full again, as at start. */
void ratelimit_test_refill(void);

#endif
