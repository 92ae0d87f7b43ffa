/* stats: the proxy's counters, one X-macro list for storage, sums and display. */
#ifndef ACEMQ_STATS_H
#define ACEMQ_STATS_H

#include <stdint.h>

#define STATS_COUNTERS(X)                                                                      \
	X(connections_accepted, "client connections accepted")                                 \
	X(connections_closed, "client connections closed")                                     \
	X(connections_refused, "connections refused (limit or bad header)")                    \
	X(upstream_failures, "broker connections that failed or were lost")                    \
	X(protocol_errors, "connections closed for a protocol violation")                      \
	X(frames_to_broker, "frames forwarded to the broker")                                  \
	X(frames_to_client, "frames forwarded to clients")                                     \
	X(bytes_to_broker, "bytes forwarded to the broker")                                    \
	X(bytes_to_client, "bytes forwarded to clients")                                       \
	X(messages_assembled, "messages assembled for a hook")                                 \
	X(messages_swallowed, "deliveries swallowed by a hook")                                \
	X(publishes_answered, "publishes answered by the proxy")                               \
	X(publishes_refused, "publishes refused (nack or channel closed)")                     \
	X(backpressure_pauses, "times a leg paused because the other was full")                \
	X(refused_max_connections, "connections refused: max_connections")                     \
	X(refused_max_connections_per_vhost, "connections refused: max_connections_per_vhost") \
	X(refused_max_channels, "connections closed: max_channels")                            \
	X(rules_reloads, "rules sets loaded after start")                                      \
	X(reply_to_header_added, "acemq-reply-to headers added")                               \
	X(reply_to_property_set, "reply-to properties set from the header")                    \
	X(reply_to_mismatch, "messages whose header and property differed")                    \
	X(claims_offloaded, "bodies offloaded to a claim store")                               \
	X(claims_offloaded_bytes, "payload bytes offloaded")                                   \
	X(claims_rehydrated, "claim checks replaced by their payload")                         \
	X(claims_inline_stripped, "inline-framed bodies unframed")                             \
	X(claims_missing, "claim checks whose payload was not in the store")                   \
	X(claims_bad_keys, "claim checks with a key the store never issues")                   \
	X(claims_store_errors, "claim store reads or writes that failed")

struct stats {
#define STATS_FIELD(name, help) uint64_t name;
	STATS_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
};

#endif
