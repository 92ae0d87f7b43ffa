/* vstats: counters per vhost and queue (the idempotency answers) and per
 * vhost (publish dedup), one X-macro list for storage, /stats and /metrics:
 * X(field, scope, Prometheus metric, its labels, help); scope Q counts per
 * vhost and queue, V per vhost. */
#ifndef ACEMQ_VSTATS_H
#define ACEMQ_VSTATS_H

#include <stdint.h>

struct evbuffer;

#define VSTATS_COUNTERS(X)                                                                     \
	X(claimed, Q, "acemq_proxy_idempotency_queue_total", "answer=\"claimed\"",             \
	  "deliveries by the idempotency answer, per vhost and queue")                         \
	X(duplicate, Q, "acemq_proxy_idempotency_queue_total", "answer=\"duplicate\"",         \
	  "deliveries by the idempotency answer, per vhost and queue")                         \
	X(in_progress, Q, "acemq_proxy_idempotency_queue_total", "answer=\"in_progress\"",     \
	  "deliveries by the idempotency answer, per vhost and queue")                         \
	X(no_key, Q, "acemq_proxy_idempotency_queue_total", "answer=\"no_key\"",               \
	  "deliveries by the idempotency answer, per vhost and queue")                         \
	X(put_back, Q, "acemq_proxy_idempotency_queue_put_back_total", "how=\"republished\"",  \
	  "in-progress deliveries put back, per vhost and queue, by how")                      \
	X(requeued, Q, "acemq_proxy_idempotency_queue_put_back_total", "how=\"requeued\"",     \
	  "in-progress deliveries put back, per vhost and queue, by how")                      \
	X(leases_expired, Q, "acemq_proxy_idempotency_queue_leases_expired_total", "",         \
	  "claims taken over because the previous holder's lease ran out, per vhost and "      \
	  "queue")                                                                             \
	X(dedup_first, V, "acemq_proxy_dedup_publish_vhost_total", "answer=\"first\"",         \
	  "publishes under publish dedup, per vhost, by answer")                               \
	X(dedup_duplicate, V, "acemq_proxy_dedup_publish_vhost_total", "answer=\"duplicate\"", \
	  "publishes under publish dedup, per vhost, by answer")                               \
	X(rate_refused, V, "acemq_proxy_rate_limit_total", "event=\"connection_refused\"",     \
	  "the rules' limits at work, per vhost, by event")                                    \
	X(rate_connection_over, V, "acemq_proxy_rate_limit_total",                             \
	  "event=\"connection_over\"", "the rules' limits at work, per vhost, by event")       \
	X(rate_slowed, V, "acemq_proxy_rate_limit_total", "event=\"publish_slowed\"",          \
	  "the rules' limits at work, per vhost, by event")                                    \
	X(rate_publish_over, V, "acemq_proxy_rate_limit_total", "event=\"publish_over\"",      \
	  "the rules' limits at work, per vhost, by event")

enum vstats_counter {
#define VSTATS_ENUM(name, scope, metric, labels, help) VSTATS_##name,
	VSTATS_COUNTERS(VSTATS_ENUM)
#undef VSTATS_ENUM
	    VSTATS_COUNT
};

struct vstats;

/* The counters of (vhost, queue), or of the vhost with queue NULL, created
 * on first use; the pointer stays valid until exit. NULL only when out of
 * memory. Rows are never freed, so callers name only a vhost and queue of
 * the rules (a pattern's hook is attached only to a vhost with rules, and
 * counts a queue only when a rule names it), and only for a publish or a
 * delivery, which come after the broker accepted the connection: no client
 * can add a row with a name of its own. */
struct vstats *vstats_get(const char *vhost, const char *queue);
void vstats_add(struct vstats *v, enum vstats_counter which);

/* s escaped into out for a Prometheus label value; the quotes are the
 * caller's (JSON strings: json.h). */
void vstats_escape(struct evbuffer *out, const char *s);

/* Admin views: a JSON array and Prometheus lines. */
void vstats_json(struct evbuffer *out);
void vstats_metrics(struct evbuffer *out);

#endif
