/* config: the settings table that drives parsing, defaults, precedence and display. */
#ifndef ACEMQ_CONFIG_H
#define ACEMQ_CONFIG_H

#include <stdio.h>

#define CONFIG_MAX_LISTEN 16

/* X(id, name, type, default, min, max, help) */
#define CONFIG_SETTINGS(X)                                                                     \
	X(LISTEN, "listen", CFG_LIST, "127.0.0.1:5673", 0, 0,                                  \
	  "client address HOST:PORT ([v6]:PORT); repeatable")                                  \
	X(LISTEN_TLS, "listen_tls", CFG_LIST, "", 0, 0,                                        \
	  "TLS client address HOST:PORT (amqps); repeatable; empty: none")                     \
	X(TLS_CERT, "tls_cert", CFG_STR, "", 0, 0, "the listener's certificate chain (PEM)")   \
	X(TLS_KEY, "tls_key", CFG_STR, "", 0, 0, "the listener's private key (PEM)")           \
	X(TLS_CA, "tls_ca", CFG_STR, "", 0, 0,                                                 \
	  "CA certificates client certificates are verified against (PEM)")                    \
	X(TLS_VERIFY_CLIENT, "tls_verify_client", CFG_STR, "none", 0, 0,                       \
	  "client certificates: none, optional or required")                                   \
	X(UPSTREAM, "upstream", CFG_LIST, "127.0.0.1:5672", 0, 0,                              \
	  "broker address HOST:PORT; repeatable: tried in order for each client")              \
	X(UPSTREAM_TLS, "upstream_tls", CFG_INT, "0", 0, 1,                                    \
	  "1: the broker connections use TLS")                                                 \
	X(UPSTREAM_TLS_CA, "upstream_tls_ca", CFG_STR, "", 0, 0,                               \
	  "CA certificates the broker's certificate is verified against (empty: the "          \
	  "system's)")                                                                         \
	X(UPSTREAM_TLS_CERT, "upstream_tls_cert", CFG_STR, "", 0, 0,                           \
	  "a client certificate for the broker (PEM; empty: none)")                            \
	X(UPSTREAM_TLS_KEY, "upstream_tls_key", CFG_STR, "", 0, 0, "its private key (PEM)")    \
	X(UPSTREAM_TLS_NAME, "upstream_tls_name", CFG_STR, "", 0, 0,                           \
	  "the name the broker's certificate must carry (empty: the upstream address's "       \
	  "host)")                                                                             \
	X(UPSTREAM_RETRY_MS, "upstream_retry_ms", CFG_INT, "10000", 0, 3600000,                \
	  "how long a broker address that failed is tried last")                               \
	X(PROXY_PROTOCOL, "proxy_protocol", CFG_INT, "0", 0, 1,                                \
	  "1: clients come through a load balancer that sends a PROXY protocol v1/v2 "         \
	  "header (required)")                                                                 \
	X(UPSTREAM_PROXY_PROTOCOL, "upstream_proxy_protocol", CFG_INT, "0", 0, 1,              \
	  "1: send the broker a PROXY protocol v2 header with the client's address")           \
	X(RULES, "rules", CFG_STR, "", 0, 0, "rules directory (empty: none)")                  \
	X(DATA_DIR, "data_dir", CFG_STR, "/var/lib/acemq-proxy", 0, 0,                         \
	  "directory for the proxy's own state")                                               \
	X(ADMIN, "admin", CFG_STR, "", 0, 0, "admin HTTP address HOST:PORT (empty: off)")      \
	X(ADMIN_TOKEN, "admin_token", CFG_SECRET, "", 0, 0,                                    \
	  "bearer token the admin endpoint asks for (needed off loopback)")                    \
	X(ADMIN_TIMEOUT_S, "admin_timeout_s", CFG_INT, "10", 1, 3600,                          \
	  "admin connections: idle time, and time a request has to arrive whole")              \
	X(ADMIN_MAX_CONNECTIONS, "admin_max_connections", CFG_INT, "64", 1, 10000,             \
	  "admin connections open at once; more are closed at once")                           \
	X(ENGINE_USER, "engine_user", CFG_STR, "", 0, 0,                                       \
	  "the proxy's own broker user (scheduler, ladder, put-backs; empty: none)")           \
	X(ENGINE_PASSWORD, "engine_password", CFG_SECRET, "", 0, 0,                            \
	  "the password of engine_user")                                                       \
	X(ENGINE_HEARTBEAT_S, "engine_heartbeat_s", CFG_INT, "30", 0, 3600,                    \
	  "heartbeat of the proxy's own broker connections (0: none)")                         \
	X(WORKERS, "workers", CFG_INT, "0", 0, 256, "worker threads (0: one per core)")        \
	X(LOG_LEVEL, "log_level", CFG_LEVEL, "info", 0, 0, "error, warning, info or debug")    \
	X(CONNECT_TIMEOUT_MS, "connect_timeout_ms", CFG_INT, "5000", 1, 600000,                \
	  "time to reach the broker before the client is closed")                              \
	X(HANDSHAKE_TIMEOUT_MS, "handshake_timeout_ms", CFG_INT, "10000", 1, 600000,           \
	  "time a client has to open its connection")                                          \
	X(DRAIN_TIMEOUT_MS, "drain_timeout_ms", CFG_INT, "10000", 0, 3600000,                  \
	  "on SIGTERM, how long open connections may finish")                                  \
	X(BUFFER_LIMIT, "buffer_limit", CFG_INT, "1048576", 16384, 1073741824,                 \
	  "bytes queued towards one leg before the other pauses")                              \
	X(MAX_FRAME_PRE_TUNE, "max_frame_pre_tune", CFG_INT, "131072", 4096, 16777216,         \
	  "largest frame accepted before tune-ok")                                             \
	X(MAX_MESSAGE_SIZE, "max_message_size", CFG_INT, "134217728", 4096, 2147483647,        \
	  "largest message the proxy will hold whole")                                         \
	X(MAX_CONNECTIONS, "max_connections", CFG_INT, "10000", 1, 1000000,                    \
	  "client connections accepted at once")                                               \
	X(MAX_CONNECTIONS_PER_VHOST, "max_connections_per_vhost", CFG_INT, "0", 0, 1000000,    \
	  "client connections open on one vhost at once (0: no limit)")                        \
	X(MAX_CHANNELS, "max_channels", CFG_INT, "0", 0, 65535,                                \
	  "channels open on one client connection at once (0: no limit)")                      \
	X(STATE_MAP_MB, "state_map_mb", CFG_INT, "8192", 1, 16777216,                          \
	  "largest size of the LMDB state (MiB of address space)")                             \
	X(STATE_SYNC, "state_sync", CFG_INT, "2", 0, 2,                                        \
	  "2: each commit's pages fsynced before its meta page, which the next fsync makes "   \
	  "durable (safe on any filesystem); 1: a sync thread fsyncs commits while the next "  \
	  "ones are written (see architecture.md for power cuts); 0: no fsync (survives a "    \
	  "crash of the proxy, not of the host)")                                              \
	X(IO_THREADS, "io_threads", CFG_INT, "4", 1, 64,                                       \
	  "threads for store reads and filesystem writes")                                     \
	X(PURGE_INTERVAL_S, "purge_interval_s", CFG_INT, "3600", 0, 86400,                     \
	  "how often claim payloads past their retention are removed (0: never)")              \
	X(SCHEDULE_RECORD_MARGIN_S, "schedule_record_margin_s", CFG_INT, "86400", 0, 31536000, \
	  "how long past its due time a delayed message's record is kept "                     \
	  "while the message is not delivered")                                                \
	X(S3_ENDPOINT, "s3_endpoint", CFG_STR, "", 0, 0,                                       \
	  "S3 claim stores: scheme://host[:port] (empty: https://s3.REGION.amazonaws.com)")    \
	X(S3_REGION, "s3_region", CFG_STR, "us-east-1", 0, 0,                                  \
	  "S3 claim stores: the region requests are signed for")                               \
	X(S3_ACCESS_KEY, "s3_access_key", CFG_STR, "", 0, 0,                                   \
	  "S3 claim stores: the access key id")                                                \
	X(S3_SECRET_KEY, "s3_secret_key", CFG_SECRET, "", 0, 0,                                \
	  "S3 claim stores: the secret access key")                                            \
	X(S3_PATH_STYLE, "s3_path_style", CFG_INT, "-1", -1, 1,                                \
	  "S3 claim stores: 1 HOST/BUCKET/KEY, 0 BUCKET.HOST/KEY, -1: 1 for a custom "         \
	  "endpoint")                                                                          \
	X(S3_TIMEOUT_MS, "s3_timeout_ms", CFG_INT, "30000", 100, 3600000,                      \
	  "S3 claim stores: time one request may take, its retries included")                  \
	X(S3_CA, "s3_ca", CFG_STR, "", 0, 0,                                                   \
	  "S3 claim stores: CA certificates for the endpoint (PEM; empty: the system's)")      \
	X(S3_PART_SIZE, "s3_part_size", CFG_INT, "8388608", 5242880, 1073741824,               \
	  "S3 claim stores: bytes per part; a larger payload is a multipart upload")           \
	X(POSTGRES_URL, "postgres_url", CFG_SECRET, "", 0, 0,                                  \
	  "PostgreSQL connection string or URI for rules whose store is postgresql")           \
	X(POSTGRES_TIMEOUT_MS, "postgres_timeout_ms", CFG_INT, "2000", 10, 600000,             \
	  "longest a PostgreSQL round trip (or connect) may take before it counts as "         \
	  "failed")

enum config_id {
#define CONFIG_ENUM(id, name, type, def, min, max, help) CFG_##id,
	CONFIG_SETTINGS(CONFIG_ENUM)
#undef CONFIG_ENUM
	    CFG_COUNT
};

/* CFG_SECRET: a string never shown (GET /config, --check-config). */
enum config_type { CFG_STR, CFG_ADDR, CFG_LIST, CFG_INT, CFG_LEVEL, CFG_SECRET };

struct config_value {
	char *str;
	long num;
	char *list[CONFIG_MAX_LISTEN];
	int nlist;
	const char *source; /* "default", "file", "environment", "command line" */
};

struct config {
	struct config_value v[CFG_COUNT];
	char *file;
	int check_only;
	int nerrors;
};

/* Fill cfg from defaults, the file, the environment and argv, in that order
 * of increasing precedence. Errors are printed to err with where they are;
 * returns the number of errors. Exits for --help and --version. */
int config_load(struct config *cfg, int argc, char **argv, FILE *err);
void config_free(struct config *cfg);
void config_dump(const struct config *cfg, FILE *out);

const char *config_str(const struct config *cfg, enum config_id id);
long config_num(const struct config *cfg, enum config_id id);

/* Split "host:port" or "[v6]:port". 0 or -1. */
int config_addr_split(const char *addr, char *host, size_t hostlen, int *port);

#endif
