/* rules: the per-vhost rules files, parsed, validated and compiled once. */
#ifndef ACEMQ_RULES_H
#define ACEMQ_RULES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "upstream.h"

struct topic;

struct rules_match {
	char *exchange;   /* NULL: any ("*" or missing) */
	struct topic *rk; /* NULL: any routing key */
};

struct rules_matchlist {
	struct rules_match *v;
	int n;
};

enum rules_store { RULES_STORE_LMDB, RULES_STORE_FILESYSTEM, RULES_STORE_S3 };
enum rules_on_missing { RULES_MISSING_DEAD_LETTER, RULES_MISSING_PASS };
enum rules_key { RULES_KEY_MESSAGE_ID, RULES_KEY_HEADER, RULES_KEY_JSON };
/* Where idempotency keys and publish-dedup windows are kept: the embedded
 * LMDB state of this host, or PostgreSQL shared by a fleet. */
enum rules_keys_store { RULES_KEYS_LMDB, RULES_KEYS_POSTGRESQL };

struct rules_claim_check {
	int enabled;
	struct rules_matchlist match;
	long threshold;
	enum rules_store store;
	char *store_path;
	char *store_bucket; /* s3 */
	char *store_prefix; /* s3: before each key ("" when none) */
	long retention_s;
	enum rules_on_missing on_missing;
};

struct rules_schedule {
	int enabled;
	struct rules_matchlist match;
	char *header;
	int engine;
};

struct rules_dedup_publish {
	int enabled;
	struct rules_matchlist match;
	char *header;  /* the header whose value identifies a publish */
	long window_s; /* how long a confirmed value is remembered */
	enum rules_keys_store store;
};

struct rules_idempotency {
	char *queue;
	enum rules_key key;
	char *key_name; /* header name or JSON path */
	long lease_s, retention_s, in_progress_delay_s;
	long prefetch_ahead; /* beyond a consumer's prefetch; -1: surplus_auto */
	enum rules_keys_store store;
};

/* "pool": the vhost's clients share broker connections (pool.c). */
struct rules_pool {
	int enabled;
	long max_connections; /* broker connections per (vhost, user), all workers */
	long max_channels;    /* channels per broker connection */
	long idle_s;          /* a connection without clients closes after this */
	long auth_ttl_s;      /* a password the broker accepted is trusted this long */
};
/* "limits": rates a vhost's clients are held to (ratelimit.c); 0: none. */
struct rules_limits {
	long connections_per_s;   /* new connections a second, all workers */
	long publish_bytes_per_s; /* content bytes its publishers send a second */
	int alarm;                /* 1: only count and log, never refuse or slow */
};

struct rules_vhost {
	char *vhost;
	char *file;
	int reply_to;
	struct rules_claim_check claim_check;
	struct rules_schedule schedule;
	struct rules_dedup_publish dedup_publish;
	struct rules_idempotency *idempotency;
	int nidempotency;
	struct upstream_list upstream; /* n 0: the global list */
	struct rules_pool pool;
	struct rules_limits limits;
};

struct rules {
	int refs; /* atomic */
	uint64_t generation;
	struct rules_vhost *v;
	int n;
	int greets; /* a vhost names brokers of its own or pools: the proxy greets clients */
	int any_postgresql; /* a rule keeps its keys in PostgreSQL */
};

/* Load every *.json file of dir. Each error is printed to err as
 * "FILE: KEY: why"; returns NULL and sets *nerrors when any file is bad
 * (all-or-nothing), else a new set holding one reference. dir NULL or ""
 * gives an empty set. */
struct rules *rules_load(const char *dir, FILE *err, int *nerrors);
/* Whether the setting postgres_url is set: a rule asking for the
 * postgresql store fails the load without it (default: not set). */
void rules_set_postgresql(int configured);
/* Whether upstream_proxy_protocol is on: a pool fails the load with it. */
void rules_set_upstream_proxy(int on);
void rules_ref(struct rules *r);
void rules_unref(struct rules *r);
const struct rules_vhost *rules_vhost(const struct rules *r, const char *vhost);
/* "lmdb", "filesystem" or "s3". */
const char *rules_store_name(enum rules_store store);
/* Does a publish to exchange/routing key match the list? */
int rules_matches(const struct rules_matchlist *m, const char *exchange, size_t elen,
		  const char *rk, size_t rklen);

#endif
