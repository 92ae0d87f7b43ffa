/* pgconn: libpq with a deadline on every wait, for the PostgreSQL store's
 * thread and the janitor. */
#ifndef ACEMQ_PGCONN_H
#define ACEMQ_PGCONN_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

enum { PGCONN_OK = 0, PGCONN_LOST = -1, PGCONN_TIMEOUT = -2, PGCONN_SQL = -3 };

/* Monotonic milliseconds: deadlines. */
uint64_t pgconn_now(void);
/* Connect within timeout_ms, non-blocking afterwards; NULL with the reason
 * in err (which never holds the connection string). */
PGconn *pgconn_connect(const char *conninfo, long timeout_ms, char *err, size_t errlen);
/* Send what libpq holds. */
int pgconn_flush(PGconn *c, uint64_t deadline);
/* Until a result can be taken without blocking. */
int pgconn_wait(PGconn *c, uint64_t deadline);
/* The results of what was sent (outside pipeline mode): the last one, or
 * the first error, in *out; PGCONN_SQL on an error. */
int pgconn_collect(PGconn *c, uint64_t deadline, PGresult **out);
/* A simple query within timeout_ms and its last result (out may be NULL);
 * on failure the reason in err. */
int pgconn_exec(PGconn *c, const char *sql, long timeout_ms, PGresult **out, char *err,
		size_t errlen);

#endif
