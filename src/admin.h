/* admin: the HTTP endpoint that shows counters and settings. */
#ifndef ACEMQ_ADMIN_H
#define ACEMQ_ADMIN_H

#include <stddef.h>

struct event_base;
struct config;
struct worker;
struct rules;
struct state;
struct evbuffer;
struct http_request;

/* Reload the rules; 0, or -1 with the errors in errors (malloc'd). */
typedef int (*admin_reload_fn)(char **errors);

/* The rules in force, with a reference for the caller. */
typedef struct rules *(*admin_rules_fn)(void);

/* The rule the start applies to the admin address: HOST:PORT that
 * resolves, and off loopback (any address the host resolves to is not
 * loopback) only with a token. 0, or -1 with the reason in err. */
int admin_check(const char *addr, const char *token, char *err, size_t errlen);
int admin_open(struct event_base *base, const char *addr, const struct config *cfg,
	       struct worker *workers, int nworkers, admin_reload_fn reload,
	       admin_rules_fn rules);
void admin_close(void);
/* Run fn(w, arg, out) on every worker's own thread and wait a second at
 * most: returns the sum of what they returned (-1 out of memory), what
 * they wrote (in rows, when not NULL) and how many did not answer in time
 * (in missing). arg must outlive a late worker: free_arg (may be NULL)
 * frees it after the last one ran. On the admin's thread. */
typedef int (*admin_each_fn)(struct worker *w, void *arg, struct evbuffer *out);
int admin_each_worker(admin_each_fn fn, void *arg, void (*free_arg)(void *arg),
		      struct evbuffer *rows, int *missing);

/* An error answer: {"error": "..."} with code (4xx, 5xx). */
void admin_error(struct http_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The state layer whose counters /stats and /metrics show (may be NULL). */
void admin_set_state(struct state *st);

#endif
