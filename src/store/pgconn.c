/* pgconn: libpq on a thread that may block, with a deadline on every wait:
 * connecting, sending and reading results never take longer than asked,
 * whatever the database (or a socket that accepts and never answers)
 * does. */
#include "pgconn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

uint64_t pgconn_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int pgconn_left(uint64_t deadline)
{
	uint64_t now = pgconn_now();

	return deadline > now ? (int)(deadline - now) : 0;
}

/* Connect (asynchronously, so that a database that does not answer costs
 * at most timeout_ms). NULL on failure, with the reason in err. */
PGconn *pgconn_connect(const char *conninfo, long timeout_ms, char *err, size_t errlen)
{
	uint64_t deadline = pgconn_now() + (uint64_t)timeout_ms;
	PGconn *c = PQconnectStart(conninfo);
	PostgresPollingStatusType ps = PGRES_POLLING_WRITING;

	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	while (PQstatus(c) != CONNECTION_BAD && ps != PGRES_POLLING_OK &&
	       ps != PGRES_POLLING_FAILED) {
		struct pollfd p = {PQsocket(c), ps == PGRES_POLLING_READING ? POLLIN : POLLOUT,
				   0};
		int n = poll(&p, 1, pgconn_left(deadline));

		if (n == 0) {
			snprintf(err, errlen, "no answer within %ld ms", timeout_ms);
			PQfinish(c);
			return NULL;
		}
		if (n < 0 && errno != EINTR)
			break;
		ps = PQconnectPoll(c);
	}
	if (PQstatus(c) != CONNECTION_OK) {
		snprintf(err, errlen, "%s", PQerrorMessage(c));
		err[strcspn(err, "\n")] = 0;
		PQfinish(c);
		return NULL;
	}
	if (PQsetnonblocking(c, 1) != 0) {
		snprintf(err, errlen, "cannot make the connection non-blocking");
		PQfinish(c);
		return NULL;
	}
	return c;
}

/* Send what libpq holds. */
int pgconn_flush(PGconn *c, uint64_t deadline)
{
	for (;;) {
		int f = PQflush(c), n;
		struct pollfd p = {PQsocket(c), POLLIN | POLLOUT, 0};

		if (f == 0)
			return PGCONN_OK;
		if (f < 0)
			return PGCONN_LOST;
		n = poll(&p, 1, pgconn_left(deadline));
		if (n == 0)
			return PGCONN_TIMEOUT;
		if (n < 0 && errno != EINTR)
			return PGCONN_LOST;
		if ((p.revents & POLLIN) && PQconsumeInput(c) == 0)
			return PGCONN_LOST;
	}
}

/* Until a result can be taken without blocking. */
int pgconn_wait(PGconn *c, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = {PQsocket(c), POLLIN, 0};
		int n;

		if (PQconsumeInput(c) == 0)
			return PGCONN_LOST;
		if (!PQisBusy(c))
			return PGCONN_OK;
		n = poll(&p, 1, pgconn_left(deadline));
		if (n == 0)
			return PGCONN_TIMEOUT;
		if (n < 0 && errno != EINTR)
			return PGCONN_LOST;
	}
}

/* The results of what was sent (outside pipeline mode): the last one, or
 * the first error, in *out (NULL: none); PGCONN_SQL on an error. */
int pgconn_collect(PGconn *c, uint64_t deadline, PGresult **out)
{
	PGresult *res, *keep = NULL;
	int rc = pgconn_flush(c, deadline), bad = 0;

	while (rc == PGCONN_OK && (rc = pgconn_wait(c, deadline)) == PGCONN_OK &&
	       (res = PQgetResult(c)) != NULL) {
		ExecStatusType s = PQresultStatus(res);

		if (bad) {
			PQclear(res); /* the first error is kept */
			continue;
		}
		PQclear(keep);
		keep = res;
		bad = s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK;
	}
	if (out)
		*out = keep;
	else
		PQclear(keep);
	return rc != PGCONN_OK ? rc : bad ? PGCONN_SQL : PGCONN_OK;
}

/* A simple query and its results (outside pipeline mode). */
int pgconn_exec(PGconn *c, const char *sql, long timeout_ms, PGresult **out, char *err,
		size_t errlen)
{
	uint64_t deadline = pgconn_now() + (uint64_t)timeout_ms;
	PGresult *res = NULL;
	int rc;

	if (out)
		*out = NULL;
	if (!PQsendQuery(c, sql)) {
		snprintf(err, errlen, "%s", PQerrorMessage(c));
		err[strcspn(err, "\n")] = 0;
		return PGCONN_LOST;
	}
	rc = pgconn_collect(c, deadline, &res);
	if (rc == PGCONN_TIMEOUT)
		snprintf(err, errlen, "no answer within %ld ms", timeout_ms);
	else if (rc != PGCONN_OK)
		snprintf(err, errlen, "%s",
			 res ? PQresultErrorMessage(res) : PQerrorMessage(c));
	if (rc != PGCONN_OK)
		err[strcspn(err, "\n")] = 0;
	if (out && rc == PGCONN_OK)
		*out = res;
	else
		PQclear(res);
	return rc;
}
