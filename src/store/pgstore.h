/* pgstore: idempotency keys and publish-dedup windows in PostgreSQL, shared
 * by every proxy of a fleet. The same operations and answers as the LMDB
 * records (store/idem.h), decided by one statement each with the
 * database's clock, sent from a thread of its own over one connection in
 * pipeline mode; completions are posted to the requesting worker exactly
 * as the LMDB writer posts them. */
#ifndef ACEMQ_PGSTORE_H
#define ACEMQ_PGSTORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct pgstore;
struct idem_req;

#define PGSTORE_SCHEMA_VERSION 1
/* pg_advisory_lock(PGSTORE_LOCK_CLASS, n): 1 while the schema is created,
 * 2 while a proxy purges (one proxy of a fleet at a time). */
#define PGSTORE_LOCK_CLASS  1633906033 /* "acmq" */
#define PGSTORE_LOCK_SCHEMA 1
#define PGSTORE_LOCK_PURGE  2

struct pgstore_settings {
	const char *conninfo; /* a libpq connection string or URI */
	long timeout_ms;      /* a connect or a round trip, at most */
};

/* Start the thread, which connects (and creates the schema if missing) at
 * once and again with backoff whenever the connection is lost. NULL only
 * when out of memory or threads. */
struct pgstore *pgstore_open(const struct pgstore_settings *set);
/* Finish what is queued (failing it if the database does not answer),
 * then stop and close. */
void pgstore_close(struct pgstore *st);

/* From any thread: queue an operation prepared with idem_prepare or
 * idem_dedup_prepare; r->w.call.fn runs on r->w.w (or, w NULL, on the
 * store's thread) with r->w.rc and r->answer set. Operations queued in one
 * turn of a worker's loop go in one round trip. */
void pgstore_submit(struct pgstore *st, struct idem_req *r);

/* From a thread that may block (never a worker's loop): run n operations
 * together and wait for their answers. */
void pgstore_run(struct pgstore *st, struct idem_req **r, int n);

/* From a thread that may block (the janitor): delete rows whose time has
 * passed, in batches of batch rows, at most max_batches per table, under
 * an advisory lock so that one proxy of a fleet purges at a time. Returns
 * the rows removed, 0 when another proxy holds the lock, -1 on an error. */
long pgstore_purge(struct pgstore *st, long batch, int max_batches);

/* Connected, with a schema it can use, and the last round trip answered. */
int pgstore_ready(struct pgstore *st);

struct pgstore_counters {
	uint64_t ops[3];      /* claim, confirm, forget: sent */
	uint64_t op_errors;   /* answered with an error (the patterns fail open) */
	uint64_t round_trips; /* pipelines synced and answered (or not) */
	uint64_t round_trip_errors, timeouts;
	uint64_t connects, connect_failures;
	uint64_t purged;
	uint64_t hist[12]; /* round trips by duration: le pgstore_bounds_ms[i] */
	double seconds;    /* their total */
	int up;
};
extern const double pgstore_bounds_ms[11];
void pgstore_counters(struct pgstore *st, struct pgstore_counters *out);
/* The counters in Prometheus' text format. */
void pgstore_metrics(struct pgstore *st, FILE *out);

/* The SQL that creates schema version 1 (for the docs, the tests and an
 * operator who creates it ahead). */
extern const char pgstore_schema_sql[];

#endif
