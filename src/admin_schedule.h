/* admin_schedule: the admin endpoint's routes over delayed messages:
 * GET /schedule/VHOST lists them in due order, DELETE /schedule/VHOST/ID
 * cancels one, DELETE /schedule/VHOST?exchange=&routing_key= a set. */
#ifndef ACEMQ_ADMIN_SCHEDULE_H
#define ACEMQ_ADMIN_SCHEDULE_H

#include <stddef.h>

struct http_request;

#define ADMIN_SCHEDULE_LIMIT     100  /* entries a page holds unless asked */
#define ADMIN_SCHEDULE_LIMIT_MAX 1000 /* the most a page may hold */

/* The route's handler; arg points to the admin's admin_rules_fn. */
void admin_schedule(struct http_request *req, void *arg);

/* Strict %XX decoding of s[0..len) (malloc'd, NUL-terminated): NULL for a
 * '%' not followed by two hex digits, for %00, or out of memory; plus
 * decodes to a space when plus is set (a query's values). */
char *admin_decode(const char *s, size_t len, int plus);

#endif
