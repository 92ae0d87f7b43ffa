/* stats: the proxy's counters, one X-macro list for storage, sums and display:
 * X(field, Prometheus metric, its labels, help). Counters sharing a metric
 * are listed together. */
#ifndef ACEMQ_STATS_H
#define ACEMQ_STATS_H

#include <stdint.h>

#define STATS_COUNTERS(X)                                                                    \
	X(connections_accepted, "acemq_proxy_connections_accepted_total", "",                \
	  "client connections accepted")                                                     \
	X(connections_closed, "acemq_proxy_connections_closed_total", "",                    \
	  "client connections closed")                                                       \
	X(heap_trims, "acemq_proxy_heap_trims_total", "",                                    \
	  "freed heap given back to the system after connections closed (malloc_trim)")      \
	X(connections_refused, "acemq_proxy_connections_refused_total",                      \
	  "reason=\"protocol_header\"", "connections refused, by reason")                    \
	X(refused_proxy_protocol, "acemq_proxy_connections_refused_total",                   \
	  "reason=\"proxy_protocol\"", "connections refused, by reason")                     \
	X(refused_max_connections, "acemq_proxy_connections_refused_total",                  \
	  "reason=\"max_connections\"", "connections refused, by reason")                    \
	X(refused_max_connections_per_vhost, "acemq_proxy_connections_refused_total",        \
	  "reason=\"max_connections_per_vhost\"", "connections refused, by reason")          \
	X(refused_max_channels, "acemq_proxy_connections_refused_total",                     \
	  "reason=\"max_channels\"", "connections refused, by reason")                       \
	X(refused_connection_rate, "acemq_proxy_connections_refused_total",                  \
	  "reason=\"connection_rate\"", "connections refused, by reason")                    \
	X(refused_no_descriptors, "acemq_proxy_connections_refused_total",                   \
	  "reason=\"file_descriptors\"", "connections refused, by reason")                   \
	X(upstream_failures, "acemq_proxy_upstream_failures_total", "",                      \
	  "broker connections that failed or were lost")                                     \
	X(protocol_errors, "acemq_proxy_protocol_errors_total", "",                          \
	  "connections closed for a protocol violation")                                     \
	X(frames_to_broker, "acemq_proxy_frames_total", "direction=\"to_broker\"",           \
	  "frames forwarded, by direction")                                                  \
	X(frames_to_client, "acemq_proxy_frames_total", "direction=\"to_client\"",           \
	  "frames forwarded, by direction")                                                  \
	X(bytes_to_broker, "acemq_proxy_bytes_total", "direction=\"to_broker\"",             \
	  "bytes written to each side, by direction")                                        \
	X(bytes_to_client, "acemq_proxy_bytes_total", "direction=\"to_client\"",             \
	  "bytes written to each side, by direction")                                        \
	X(messages_assembled, "acemq_proxy_messages_assembled_total", "",                    \
	  "messages assembled for a hook")                                                   \
	X(messages_swallowed, "acemq_proxy_messages_swallowed_total", "",                    \
	  "deliveries swallowed by a hook")                                                  \
	X(publishes_answered, "acemq_proxy_publishes_answered_total", "",                    \
	  "publishes answered by the proxy")                                                 \
	X(publishes_refused, "acemq_proxy_publishes_refused_total", "",                      \
	  "publishes refused (nack or channel closed)")                                      \
	X(backpressure_pauses, "acemq_proxy_backpressure_pauses_total", "",                  \
	  "times a leg paused because the other was full")                                   \
	X(rules_reloads, "acemq_proxy_rules_reloads_total", "",                              \
	  "rules sets loaded after start")                                                   \
	X(pool_auth_hits, "acemq_proxy_pool_auth_total", "result=\"cached\"",                \
	  "pooled clients' credentials, trusted from the cache or checked by the broker")    \
	X(pool_auth_misses, "acemq_proxy_pool_auth_total", "result=\"checked\"",             \
	  "pooled clients' credentials, trusted from the cache or checked by the broker")    \
	X(pool_refused_full, "acemq_proxy_pool_refused_total", "reason=\"full\"",            \
	  "pooled clients refused, by reason")                                               \
	X(pool_refused_client_error, "acemq_proxy_pool_refused_total",                       \
	  "reason=\"client_error\"", "pooled clients refused, by reason")                    \
	X(pool_refused_locked, "acemq_proxy_pool_refused_total", "reason=\"locked\"",        \
	  "pooled clients refused, by reason")                                               \
	X(pool_channels_kept_used, "acemq_proxy_pool_channels_kept_total", "event=\"used\"", \
	  "broker channels kept open between pooled clients, by event")                      \
	X(pool_channels_kept, "acemq_proxy_pool_channels_kept_total", "event=\"kept\"",      \
	  "broker channels kept open between pooled clients, by event")                      \
	X(pool_channels_kept_unprobed, "acemq_proxy_pool_channels_kept_total",               \
	  "event=\"kept_unprobed\"",                                                         \
	  "broker channels kept open between pooled clients, by event")                      \
	X(reply_to_header_added, "acemq_proxy_reply_to_total", "change=\"header_added\"",    \
	  "reply addresses normalised, by change")                                           \
	X(reply_to_property_set, "acemq_proxy_reply_to_total", "change=\"property_set\"",    \
	  "reply addresses normalised, by change")                                           \
	X(reply_to_mismatch, "acemq_proxy_reply_to_total", "change=\"mismatch\"",            \
	  "reply addresses normalised, by change")                                           \
	X(claims_offloaded, "acemq_proxy_claims_offloaded_total", "",                        \
	  "bodies offloaded to a claim store")                                               \
	X(claims_offloaded_bytes, "acemq_proxy_claims_offloaded_bytes_total", "",            \
	  "payload bytes offloaded")                                                         \
	X(claims_rehydrated, "acemq_proxy_claims_rehydrated_total", "",                      \
	  "claim checks replaced by their payload")                                          \
	X(claims_inline_stripped, "acemq_proxy_claims_inline_stripped_total", "",            \
	  "inline-framed bodies unframed")                                                   \
	X(claims_missing, "acemq_proxy_claims_missing_total", "why=\"not_in_store\"",        \
	  "claim checks without a payload, by why")                                          \
	X(claims_bad_keys, "acemq_proxy_claims_missing_total", "why=\"bad_key\"",            \
	  "claim checks without a payload, by why")                                          \
	X(claims_store_errors, "acemq_proxy_claims_store_errors_total", "",                  \
	  "claim store reads or writes that failed")                                         \
	X(idem_claimed, "acemq_proxy_idempotency_total", "answer=\"claimed\"",               \
	  "deliveries by the idempotency answer")                                            \
	X(idem_duplicate, "acemq_proxy_idempotency_total", "answer=\"duplicate\"",           \
	  "deliveries by the idempotency answer")                                            \
	X(idem_in_progress, "acemq_proxy_idempotency_total", "answer=\"in_progress\"",       \
	  "deliveries by the idempotency answer")                                            \
	X(idem_put_back, "acemq_proxy_idempotency_put_back_total", "how=\"republished\"",    \
	  "in-progress deliveries put back, by how")                                         \
	X(idem_put_back_requeued, "acemq_proxy_idempotency_put_back_total",                  \
	  "how=\"requeued\"", "in-progress deliveries put back, by how")                     \
	X(idem_no_key, "acemq_proxy_idempotency_no_key_total", "",                           \
	  "deliveries without a key, delivered untouched")                                   \
	X(idem_store_errors, "acemq_proxy_idempotency_store_errors_total", "",               \
	  "idempotency reads or writes that failed")                                         \
	X(idem_renewed, "acemq_proxy_idempotency_leases_renewed_total", "",                  \
	  "claims renewed as a delivery kept past its consumer's prefetch went to the "      \
	  "client, a third of its lease or more after it arrived")                           \
	X(surplus_kept, "acemq_proxy_surplus_total", "event=\"kept\"",                       \
	  "deliveries asked for beyond a consumer's prefetch: kept until the client had "    \
	  "room, or sent past it when its channel kept 16 MiB")                              \
	X(surplus_past, "acemq_proxy_surplus_total", "event=\"past_prefetch\"",              \
	  "deliveries asked for beyond a consumer's prefetch: kept until the client had "    \
	  "room, or sent past it when its channel kept 16 MiB")                              \
	X(dedup_first, "acemq_proxy_dedup_publish_total", "answer=\"first\"",                \
	  "publishes under publish dedup, by answer")                                        \
	X(dedup_duplicate, "acemq_proxy_dedup_publish_total", "answer=\"duplicate\"",        \
	  "publishes under publish dedup, by answer")                                        \
	X(dedup_waited, "acemq_proxy_dedup_publish_waited_total", "",                        \
	  "publishes that waited for an identical one in flight")                            \
	X(dedup_no_header, "acemq_proxy_dedup_publish_no_header_total", "",                  \
	  "matching publishes without a usable header, passed untouched")                    \
	X(dedup_forgotten, "acemq_proxy_dedup_publish_forgotten_total", "",                  \
	  "values not remembered (nacked, returned, not forwarded, outcome lost)")           \
	X(dedup_store_errors, "acemq_proxy_dedup_publish_store_errors_total", "",            \
	  "publish-dedup checks or writes that failed (the publish was forwarded)")

/* The time a message a hook looked at spent in the proxy, from its first
 * frame read to its last frame queued out: bucket bounds in microseconds. */
#define STATS_TIME_BUCKETS 10
#define STATS_TIME_BOUNDS_US                                                         \
	{                                                                            \
		100, 500, 1000, 5000, 10000, 50000, 100000, 500000, 1000000, 5000000 \
	}

struct stats {
#define STATS_FIELD(name, metric, labels, help) uint64_t name;
	STATS_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
	uint64_t msg_time[STATS_TIME_BUCKETS + 1]; /* the last: above every bound */
	uint64_t msg_time_sum_us, msg_time_count;
};

/* A worker's counters have one writer, that worker, and are read by the
 * admin thread: a relaxed load and store (a plain add on the common
 * machines, no locked instruction) that never tears a value. A counter
 * another thread bumps too (the listener's refusals) uses an atomic add. */
static inline void stats_add(uint64_t *counter, uint64_t n)
{
	__atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELAXED);
}
#define STATS_ADD(st, name, n) stats_add(&(st)->name, (uint64_t)(n))
#define STATS_INC(st, name)    STATS_ADD(st, name, 1)

/* On the worker that owns st. */
static inline void stats_msg_time(struct stats *st, uint64_t us)
{
	static const uint64_t bounds[STATS_TIME_BUCKETS] = STATS_TIME_BOUNDS_US;
	int i;

	for (i = 0; i < STATS_TIME_BUCKETS && us > bounds[i]; i++)
		;
	STATS_INC(st, msg_time[i]);
	STATS_ADD(st, msg_time_sum_us, us);
	STATS_INC(st, msg_time_count);
}

#endif
