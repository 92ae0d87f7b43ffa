/* pgstore: the PostgreSQL backend of idempotency keys and publish-dedup
 * windows. One thread owns one connection in pipeline mode; what the
 * workers queued while a round trip was out goes in the next one, as one
 * implicit transaction (one commit). Each operation is one statement that
 * decides atomically from the row and the database's clock, so proxies
 * whose clocks disagree still agree. A database that is down or hangs
 * costs each round trip at most the timeout: its operations fail (the
 * patterns fail open) and the connection is made again with backoff. */
#include "pgstore.h"

#include "../log.h"
#include "idem.h"
#include "pgconn.h"

#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define PGSTORE_BATCH_MAX      1024
#define PGSTORE_BACKOFF_MIN_MS 100
#define PGSTORE_BACKOFF_MAX_MS 5000

const double pgstore_bounds_ms[11] = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500};

static const char *const pgstore_tables[2] = {"acemq_idempotency", "acemq_dedup_publish"};

const char pgstore_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS acemq_schema (version integer PRIMARY KEY);\n"
    "CREATE TABLE IF NOT EXISTS acemq_idempotency (\n"
    "    vhost text NOT NULL,\n"
    "    scope text NOT NULL,          -- the queue\n"
    "    key bytea NOT NULL,\n"
    "    state smallint NOT NULL,      -- 1 claimed, 2 confirmed\n"
    "    until timestamptz NOT NULL,   -- the lease's end, or the retention's\n"
    "    owner bytea NOT NULL,         -- the delivery that claimed it\n"
    "    PRIMARY KEY (vhost, scope, key));\n"
    "CREATE INDEX IF NOT EXISTS acemq_idempotency_until ON acemq_idempotency (until);\n"
    "CREATE TABLE IF NOT EXISTS acemq_dedup_publish (\n"
    "    vhost text NOT NULL,\n"
    "    scope text NOT NULL,          -- the exchange\n"
    "    key bytea NOT NULL,           -- the header value (a long one hashed)\n"
    "    state smallint NOT NULL,      -- 1 reserved (in flight), 2 confirmed\n"
    "    until timestamptz NOT NULL,   -- the reservation's end, or the window's\n"
    "    owner bytea NOT NULL,         -- the publish that reserved it\n"
    "    PRIMARY KEY (vhost, scope, key));\n"
    "CREATE INDEX IF NOT EXISTS acemq_dedup_publish_until ON acemq_dedup_publish (until);\n"
    "INSERT INTO acemq_schema (version) VALUES (1) ON CONFLICT DO NOTHING;\n";

/* The three statements, for each table ($1 vhost, $2 scope, $3 key, $4
 * span in ms, $5 owner). A claim takes the row when it is absent, when its
 * time has passed, or when it is this owner's own claim (a claim sent
 * again after a lost connection); otherwise the row as it was says
 * duplicate or in progress. */
static const char pgstore_claim_sql[] =
    "WITH prev AS (SELECT state, until > statement_timestamp() AS live FROM %1$s "
    "WHERE vhost = $1 AND scope = $2 AND key = $3), "
    "took AS (INSERT INTO %1$s AS t (vhost, scope, key, state, until, owner) "
    "VALUES ($1, $2, $3, 1, statement_timestamp() + $4 * interval '1 millisecond', $5) "
    "ON CONFLICT (vhost, scope, key) DO UPDATE "
    "SET state = 1, until = EXCLUDED.until, owner = EXCLUDED.owner "
    "WHERE t.until <= statement_timestamp() OR (t.state = 1 AND t.owner = EXCLUDED.owner) "
    "RETURNING 1) "
    "SELECT EXISTS (SELECT 1 FROM took), (SELECT state FROM prev), (SELECT live FROM prev)";
/* Confirmed for the span, whoever held the claim; a live confirmation is
 * left as it is. */
static const char pgstore_confirm_sql[] =
    "INSERT INTO %1$s AS t (vhost, scope, key, state, until, owner) "
    "VALUES ($1, $2, $3, 2, statement_timestamp() + $4 * interval '1 millisecond', $5) "
    "ON CONFLICT (vhost, scope, key) DO UPDATE "
    "SET state = 2, until = EXCLUDED.until, owner = EXCLUDED.owner "
    "WHERE t.state <> 2 OR t.until <= statement_timestamp()";
/* Only this owner's own claim; never another's, never a confirmation. */
static const char pgstore_forget_sql[] = "DELETE FROM %1$s WHERE vhost = $1 AND scope = $2 AND "
					 "key = $3 AND state = 1 AND owner = $5 AND $4 >= 0";

struct pgstore {
	char *conninfo;
	long timeout_ms;
	pthread_t thread;
	pthread_mutex_t lock; /* the queue, stop, counters, up */
	int wake;             /* an eventfd: work was queued, or stop */
	struct state_write *head, **tail;
	int stop;
	PGconn *conn; /* the thread's */
	int failing;  /* an episode of failures is being logged */
	uint64_t retry_at;
	long backoff_ms;
	struct pgstore_counters counters;
};

/* After connecting: the timeouts, the schema (created when missing, under
 * an advisory lock so that proxies starting together do not race; a newer
 * version is refused), the statements prepared, pipeline mode. */
/* What is left of a deadline, in ms (at least 1: then the wait times out). */
static long pgstore_left(uint64_t deadline)
{
	uint64_t now = pgconn_now();

	return deadline > now ? (long)(deadline - now) : 1;
}

static int pgstore_setup(PGconn *c, long timeout_ms, uint64_t deadline, char *err,
			 size_t errlen)
{
	static const Oid types[5] = {25, 25, 17, 20, 17}; /* text text bytea int8 bytea */
	const char *const sqls[3] = {pgstore_claim_sql, pgstore_confirm_sql,
				     pgstore_forget_sql};
	char sql[2048], name[32];
	PGresult *res = NULL;
	int rc, t, k;
	long version;

	snprintf(sql, sizeof(sql), "SET statement_timeout = %ld", timeout_ms);
	rc = pgconn_exec(c, sql, pgstore_left(deadline), NULL, err, errlen);
	if (rc == PGCONN_OK)
		rc = pgconn_exec(c,
				 "SELECT to_regclass('acemq_schema') IS NOT NULL AND "
				 "to_regclass('acemq_idempotency') IS NOT NULL AND "
				 "to_regclass('acemq_dedup_publish') IS NOT NULL",
				 pgstore_left(deadline), &res, err, errlen);
	if (rc != PGCONN_OK)
		return rc;
	if (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "t") != 0) {
		/* One statement string: one transaction, the lock its own. */
		snprintf(sql, sizeof(sql), "SELECT pg_advisory_xact_lock(%d, %d);\n%s",
			 PGSTORE_LOCK_CLASS, PGSTORE_LOCK_SCHEMA, pgstore_schema_sql);
		rc = pgconn_exec(c, sql, pgstore_left(deadline), NULL, err, errlen);
		if (rc == PGCONN_OK)
			log_info("postgres: schema version %d created", PGSTORE_SCHEMA_VERSION);
	}
	PQclear(res);
	res = NULL;
	if (rc == PGCONN_OK)
		rc = pgconn_exec(c, "SELECT max(version) FROM acemq_schema",
				 pgstore_left(deadline), &res, err, errlen);
	if (rc != PGCONN_OK)
		return rc;
	version =
	    PQntuples(res) == 1 && !PQgetisnull(res, 0, 0) ? atol(PQgetvalue(res, 0, 0)) : 0;
	PQclear(res);
	if (version != PGSTORE_SCHEMA_VERSION) {
		snprintf(
		    err, errlen,
		    version > PGSTORE_SCHEMA_VERSION
			? "the schema is version %ld, newer than this proxy's (%d): refused"
			: "the schema version row says %ld, not %d: refused",
		    version, PGSTORE_SCHEMA_VERSION);
		return PGCONN_SQL;
	}
	for (t = 0; t < 2; t++)
		for (k = 0; k < 3; k++) {
			snprintf(sql, sizeof(sql), sqls[k], pgstore_tables[t]);
			snprintf(name, sizeof(name), "acemq_%d_%d", t, k);
			if (!PQsendPrepare(c, name, sql, 5, types))
				return PGCONN_LOST;
			rc = pgconn_collect(c, deadline, &res);
			if (rc != PGCONN_OK) {
				snprintf(err, errlen, "preparing: %s",
					 res ? PQresultErrorMessage(res) : PQerrorMessage(c));
				err[strcspn(err, "\n")] = 0;
				PQclear(res);
				return rc;
			}
			PQclear(res);
		}
	if (!PQenterPipelineMode(c)) {
		snprintf(err, errlen, "cannot enter pipeline mode");
		return PGCONN_LOST;
	}
	return PGCONN_OK;
}

/* ---- the thread ---------------------------------------------------------------- */

static void pgstore_episode(struct pgstore *st, int ok, const char *why)
{
	pthread_mutex_lock(&st->lock);
	st->counters.up = ok;
	if (ok && st->failing)
		log_info("postgres: answers again");
	else if (!ok && !st->failing)
		log_error("postgres: %s; idempotency delivers and publish dedup forwards "
			  "until it answers (logged once until then)",
			  why);
	st->failing = !ok;
	pthread_mutex_unlock(&st->lock);
}

static void pgstore_drop(struct pgstore *st)
{
	if (st->conn)
		PQfinish(st->conn);
	st->conn = NULL;
}

/* Try to connect now, by the deadline; on failure the next try is after
 * the backoff. */
static void pgstore_try_connect(struct pgstore *st, uint64_t deadline)
{
	char err[512];
	int rc;

	st->conn = pgconn_connect(st->conninfo, pgstore_left(deadline), err, sizeof(err));
	rc = st->conn ? pgstore_setup(st->conn, st->timeout_ms, deadline, err, sizeof(err))
		      : PGCONN_LOST;
	pthread_mutex_lock(&st->lock);
	if (rc == PGCONN_OK)
		st->counters.connects++;
	else
		st->counters.connect_failures++;
	pthread_mutex_unlock(&st->lock);
	if (rc == PGCONN_OK) {
		st->backoff_ms = PGSTORE_BACKOFF_MIN_MS;
		pgstore_episode(st, 1, NULL);
		return;
	}
	pgstore_drop(st);
	pgstore_episode(st, 0, err);
	st->retry_at = pgconn_now() + (uint64_t)st->backoff_ms;
	st->backoff_ms = st->backoff_ms * 2 > PGSTORE_BACKOFF_MAX_MS ? PGSTORE_BACKOFF_MAX_MS
								     : st->backoff_ms * 2;
}

/* An operation, in the order the round trip sends it. */
struct pgstore_item {
	struct idem_req *r;
	int table;         /* 0 idempotency, 1 dedup */
	const char *vhost; /* in r->db */
	int seq;
};

static int pgstore_item_cmp(const void *a, const void *b)
{
	const struct pgstore_item *x = a, *y = b;
	size_t xs = strlen(x->r->key), ys = strlen(y->r->key), n;
	int c;

	/* Every proxy locks rows in the same order: no deadlock between two
	 * batches. The operations on one key keep their order. */
	if (x->table != y->table)
		return x->table - y->table;
	if ((c = strcmp(x->vhost, y->vhost)) != 0 || (c = strcmp(x->r->key, y->r->key)) != 0)
		return c;
	n = x->r->klen - xs < y->r->klen - ys ? x->r->klen - xs : y->r->klen - ys;
	if ((c = memcmp(x->r->key + xs, y->r->key + ys, n)) != 0)
		return c;
	if (x->r->klen - xs != y->r->klen - ys)
		return x->r->klen - xs < y->r->klen - ys ? -1 : 1;
	return x->seq - y->seq;
}

static int pgstore_send(PGconn *c, const struct pgstore_item *it)
{
	const struct idem_req *r = it->r;
	size_t slen = strlen(r->key);
	char name[32], span[24];
	const char *values[5];
	int lengths[5] = {0, 0, 0, 0, (int)sizeof(r->owner)};
	static const int formats[5] = {0, 0, 1, 0, 1};

	snprintf(name, sizeof(name), "acemq_%d_%d", it->table, (int)r->what);
	snprintf(span, sizeof(span), "%llu", (unsigned long long)r->span_ms);
	values[0] = it->vhost;
	values[1] = r->key; /* the scope: up to the NUL */
	values[2] = r->key + slen + 1;
	lengths[2] = (int)(r->klen - slen - 1);
	values[3] = span;
	values[4] = (const char *)r->owner;
	return PQsendQueryPrepared(c, name, 5, values, lengths, formats, 0);
}

static void pgstore_answer(struct idem_req *r, PGresult *res)
{
	r->w.rc = STATE_OK;
	r->lease_expired = 0;
	switch (r->what) {
	case IDEM_CLAIM:
		if (PQntuples(res) != 1) {
			r->w.rc = STATE_IO;
		} else if (strcmp(PQgetvalue(res, 0, 0), "t") == 0) {
			r->answer = IDEM_CLAIMED;
			r->lease_expired = !PQgetisnull(res, 0, 1) &&
					   atoi(PQgetvalue(res, 0, 1)) == 1 &&
					   strcmp(PQgetvalue(res, 0, 2), "f") == 0;
		} else if (!PQgetisnull(res, 0, 1) && atoi(PQgetvalue(res, 0, 1)) == 2 &&
			   strcmp(PQgetvalue(res, 0, 2), "t") == 0) {
			r->answer = IDEM_DUPLICATE;
		} else {
			/* Claimed under a live lease (or taken by another proxy's
			 * claim since this statement began): asked again later. */
			r->answer = IDEM_IN_PROGRESS;
		}
		break;
	case IDEM_CONFIRM:
		r->answer = IDEM_DONE;
		break;
	case IDEM_FORGET:
		r->answer = strcmp(PQcmdTuples(res), "0") != 0 ? IDEM_DONE : IDEM_NOT_OWNER;
		break;
	}
}

static void pgstore_histogram(struct pgstore *st, uint64_t start, int rc)
{
	double ms = (double)(pgconn_now() - start);
	int i;

	pthread_mutex_lock(&st->lock);
	st->counters.round_trips++;
	if (rc == PGCONN_TIMEOUT)
		st->counters.timeouts++;
	else if (rc != PGCONN_OK)
		st->counters.round_trip_errors++;
	for (i = 0; i < 11 && ms > pgstore_bounds_ms[i]; i++)
		;
	st->counters.hist[i]++;
	st->counters.seconds += ms / 1000.0;
	pthread_mutex_unlock(&st->lock);
}

/* One round trip: the items sent in one pipeline, one implicit
 * transaction. PGCONN_OK with each answer set; PGCONN_SQL when a
 * statement failed (the transaction rolled back: none is answered);
 * PGCONN_LOST or PGCONN_TIMEOUT when the connection is of no more use. */
static int pgstore_round_trip(struct pgstore *st, struct pgstore_item *v, int n,
			      uint64_t deadline, char *err, size_t errlen)
{
	PGconn *c = st->conn;
	uint64_t start = pgconn_now();
	PGresult *res;
	int rc = PGCONN_OK, i, failed = 0, synced = 0;

	for (i = 0; i < n; i++)
		if (!pgstore_send(c, &v[i]))
			rc = PGCONN_LOST;
	if (rc == PGCONN_OK && !PQpipelineSync(c))
		rc = PGCONN_LOST;
	if (rc == PGCONN_OK)
		rc = pgconn_flush(c, deadline);
	/* Each statement's result, then a NULL; failures abort the rest up
	 * to the sync, whose own result ends the round trip. */
	for (i = 0; rc == PGCONN_OK && !synced;) {
		if ((rc = pgconn_wait(c, deadline)) != PGCONN_OK)
			break;
		res = PQgetResult(c);
		if (res == NULL)
			continue;
		switch (PQresultStatus(res)) {
		case PGRES_TUPLES_OK:
		case PGRES_COMMAND_OK:
			if (i < n)
				pgstore_answer(v[i++].r, res);
			break;
		case PGRES_PIPELINE_SYNC:
			synced = 1;
			break;
		case PGRES_PIPELINE_ABORTED:
			i++;
			failed = 1;
			break;
		default:
			if (!failed) {
				snprintf(err, errlen, "%s", PQresultErrorMessage(res));
				err[strcspn(err, "\n")] = 0;
			}
			failed = 1;
			i++;
			break;
		}
		PQclear(res);
	}
	if (rc == PGCONN_TIMEOUT)
		snprintf(err, errlen, "no answer within %ld ms", st->timeout_ms);
	else if (rc == PGCONN_LOST)
		snprintf(err, errlen, "%s", PQerrorMessage(c));
	err[strcspn(err, "\n")] = 0;
	if (rc == PGCONN_OK && (failed || i != n))
		rc = PGCONN_SQL;
	pgstore_histogram(st, start, rc);
	return rc;
}

static void pgstore_fail(struct pgstore_item *v, int n)
{
	int i;

	for (i = 0; i < n; i++)
		v[i].r->w.rc = STATE_IO;
}

/* Answer a list of operations: one round trip; if a statement failed, one
 * each (so that only the one that cannot be done fails); if the connection
 * was lost, once more after connecting again at once. */
static void pgstore_batch(struct pgstore *st, struct pgstore_item *v, int n)
{
	uint64_t deadline = pgconn_now() + (uint64_t)st->timeout_ms;
	char err[512] = "";
	int rc = PGCONN_LOST, i, k;

	/* A connect and the round trip share one deadline. */
	if (st->conn == NULL && pgconn_now() >= st->retry_at)
		pgstore_try_connect(st, deadline);
	/* Down (and not yet time to try again): failed at once, so the
	 * patterns fail open without waiting. */
	for (k = 0; k < 2 && st->conn; k++) {
		rc = pgstore_round_trip(st, v, n, deadline, err, sizeof(err));
		if (rc != PGCONN_LOST)
			break;
		pgstore_drop(st);
		if (k == 0)
			pgstore_try_connect(st, deadline);
	}
	if (rc == PGCONN_SQL) {
		/* The database answers: the one by one get a deadline of their own. */
		deadline = pgconn_now() + (uint64_t)st->timeout_ms;

		log_warning("postgres: a round trip failed (%s); its operations are sent one "
			    "by one",
			    err);
		for (i = 0; i < n && rc != PGCONN_LOST && rc != PGCONN_TIMEOUT; i++) {
			v[i].r->w.rc = STATE_IO;
			rc = pgstore_round_trip(st, &v[i], 1, deadline, err, sizeof(err));
		}
		if (rc == PGCONN_SQL)
			rc = PGCONN_OK; /* what failed alone failed */
		for (; i < n; i++)
			v[i].r->w.rc = STATE_IO;
	} else if (rc != PGCONN_OK) {
		pgstore_fail(v, n);
	}
	if (rc == PGCONN_LOST || rc == PGCONN_TIMEOUT) {
		/* A hung connection cannot be trusted with the next batch. */
		pgstore_drop(st);
		if (st->conn == NULL && err[0])
			pgstore_episode(st, 0, err);
		if (pgconn_now() >= st->retry_at)
			st->retry_at = pgconn_now() + (uint64_t)st->backoff_ms;
	} else if (st->conn) {
		pgstore_episode(st, 1, NULL);
	}
	pthread_mutex_lock(&st->lock);
	for (i = 0; i < n; i++) {
		st->counters.ops[v[i].r->what]++;
		if (v[i].r->w.rc != STATE_OK)
			st->counters.op_errors++;
	}
	pthread_mutex_unlock(&st->lock);
}

static void pgstore_complete(struct state_write *list)
{
	struct state_write *w, *next;

	for (w = list; w; w = next) {
		next = w->next;
		if (w->w)
			worker_post(w->w, &w->call); /* may free w */
		else
			w->call.fn(&w->call);
	}
}

/* Nothing to send: wait for work (the wake-up), for the time to connect
 * again, or for the connection to say something: a database that shuts
 * down or a connection that breaks is noticed now, not by the next
 * operation (and /readyz follows). */
static void pgstore_idle(struct pgstore *st)
{
	struct pollfd p[2] = {{st->wake, POLLIN, 0}, {-1, POLLIN, 0}};
	uint64_t now = pgconn_now(), buf;
	int timeout = -1;

	if (st->conn)
		p[1].fd = PQsocket(st->conn);
	else
		timeout = st->retry_at > now ? (int)(st->retry_at - now) : 0;
	if (poll(p, 2, timeout) <= 0)
		return;
	if (p[0].revents & POLLIN)
		while (read(st->wake, &buf, sizeof(buf)) > 0)
			;
	if (st->conn && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
	    (PQconsumeInput(st->conn) == 0 || PQstatus(st->conn) == CONNECTION_BAD)) {
		char err[256];

		snprintf(err, sizeof(err), "connection lost: %s", PQerrorMessage(st->conn));
		err[strcspn(err, "\n")] = 0;
		pgstore_drop(st);
		pgstore_episode(st, 0, err);
		st->retry_at = pgconn_now(); /* at once, then with backoff */
	}
}

static void *pgstore_main(void *arg)
{
	struct pgstore *st = arg;
	struct pgstore_item *v = calloc(PGSTORE_BATCH_MAX, sizeof(*v));
	struct state_write *list, *w, **tail;
	int n;

	for (;;) {
		pthread_mutex_lock(&st->lock);
		while (st->head == NULL && !st->stop &&
		       (st->conn != NULL || pgconn_now() < st->retry_at)) {
			pthread_mutex_unlock(&st->lock);
			pgstore_idle(st);
			pthread_mutex_lock(&st->lock);
		}
		if (st->head == NULL && st->stop) {
			pthread_mutex_unlock(&st->lock);
			break;
		}
		/* At most a batch; the rest stays for the next round trip. */
		list = st->head;
		for (n = 0, tail = &st->head; *tail && n < PGSTORE_BATCH_MAX;
		     tail = &(*tail)->next)
			n++;
		st->head = *tail;
		*tail = NULL;
		if (st->head == NULL)
			st->tail = &st->head;
		pthread_mutex_unlock(&st->lock);
		if (list == NULL) {
			/* eager: /readyz knows */
			pgstore_try_connect(st, pgconn_now() + (uint64_t)st->timeout_ms);
			continue;
		}
		if (v == NULL) {
			for (w = list; w; w = w->next)
				w->rc = STATE_IO;
			pgstore_complete(list);
			continue;
		}
		for (w = list, n = 0; w; w = w->next, n++) {
			struct idem_req *r = (struct idem_req *)w;

			v[n].r = r;
			v[n].table = strncmp(r->db, "dedup/", 6) == 0;
			v[n].vhost = r->db + (v[n].table ? 6 : 5);
			v[n].seq = n;
			r->w.rc = STATE_IO;
		}
		qsort(v, (size_t)n, sizeof(*v), pgstore_item_cmp);
		pgstore_batch(st, v, n);
		pgstore_complete(list);
	}
	pgstore_drop(st);
	free(v);
	return NULL;
}

/* ---- queueing -------------------------------------------------------------------- */

static void pgstore_wake(struct pgstore *st)
{
	uint64_t one = 1;

	if (write(st->wake, &one, sizeof(one)) < 0) {
		/* The counter is full: it is being woken anyway. */
	}
}

static void pgstore_enqueue(struct pgstore *st, struct state_write *head,
			    struct state_write **tail, int n)
{
	pthread_mutex_lock(&st->lock);
	*st->tail = head;
	st->tail = tail;
	pthread_mutex_unlock(&st->lock);
	pgstore_wake(st);
}

/* A worker's operations of one loop turn, handed over together when the
 * turn ends: they share a round trip however quick the thread is. */
struct pgstore_turn {
	struct worker_call end;
	int armed;
	int n;
	struct pgstore *st;
	struct state_write *head, **tail;
};

static __thread struct pgstore_turn pgstore_turn;

static void pgstore_turn_send(struct pgstore_turn *t)
{
	struct state_write *head = t->head;

	t->head = NULL;
	if (head)
		pgstore_enqueue(t->st, head, t->tail, t->n);
	t->n = 0;
}

static void pgstore_turn_end(struct worker_call *c)
{
	struct pgstore_turn *t = (struct pgstore_turn *)c;

	t->armed = 0;
	pgstore_turn_send(t);
}

void pgstore_submit(struct pgstore *st, struct idem_req *r)
{
	struct pgstore_turn *t = &pgstore_turn;
	struct state_write *w = &r->w;

	w->next = NULL;
	w->rc = STATE_OK;
	if (!t->armed) {
		t->end.fn = pgstore_turn_end;
		if (w->w == NULL || worker_defer(w->w, &t->end) != 0) {
			pgstore_enqueue(st, w, &w->next, 1);
			return;
		}
		t->armed = 1;
	}
	if (t->head && t->st != st)
		pgstore_turn_send(t);
	if (t->head == NULL) {
		t->st = st;
		t->tail = &t->head;
		t->n = 0;
	}
	*t->tail = w;
	t->tail = &w->next;
	t->n++;
}

/* Blocking callers: each operation's completion clears its fn, under one
 * lock, and wakes them all; each waits for its own. */
static pthread_mutex_t pgstore_wait_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pgstore_wait_cond = PTHREAD_COND_INITIALIZER;

static void pgstore_run_done(struct worker_call *c)
{
	pthread_mutex_lock(&pgstore_wait_lock);
	c->fn = NULL;
	pthread_cond_broadcast(&pgstore_wait_cond);
	pthread_mutex_unlock(&pgstore_wait_lock);
}

void pgstore_run(struct pgstore *st, struct idem_req **r, int n)
{
	struct state_write *head = NULL, **tail = &head;
	int i;

	if (n <= 0)
		return;
	for (i = 0; i < n; i++) {
		r[i]->w.w = NULL;
		r[i]->w.call.fn = pgstore_run_done;
		r[i]->w.rc = STATE_OK;
		r[i]->w.next = NULL;
		*tail = &r[i]->w;
		tail = &r[i]->w.next;
	}
	pgstore_enqueue(st, head, tail, n);
	pthread_mutex_lock(&pgstore_wait_lock);
	for (i = 0; i < n; i++)
		while (r[i]->w.call.fn != NULL)
			pthread_cond_wait(&pgstore_wait_cond, &pgstore_wait_lock);
	pthread_mutex_unlock(&pgstore_wait_lock);
}

/* ---- the janitor's purge ----------------------------------------------------------- */

long pgstore_purge(struct pgstore *st, long batch, int max_batches)
{
	char err[512], sql[512];
	PGresult *res = NULL;
	PGconn *c = pgconn_connect(st->conninfo, st->timeout_ms, err, sizeof(err));
	long removed = 0, n;
	int t, k, rc = PGCONN_LOST, locked = 0;

	if (c == NULL) {
		log_warning("postgres: purge: %s", err);
		return -1;
	}
	snprintf(sql, sizeof(sql), "SET statement_timeout = %ld", st->timeout_ms);
	rc = pgconn_exec(c, sql, st->timeout_ms, NULL, err, sizeof(err));
	/* One proxy of a fleet at a time; the others skip this round. */
	snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_lock(%d, %d)", PGSTORE_LOCK_CLASS,
		 PGSTORE_LOCK_PURGE);
	if (rc == PGCONN_OK)
		rc = pgconn_exec(c, sql, st->timeout_ms, &res, err, sizeof(err));
	locked =
	    rc == PGCONN_OK && PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	for (t = 0; locked && rc == PGCONN_OK && t < 2; t++)
		for (k = 0; rc == PGCONN_OK && k < max_batches; k++) {
			/* A bounded batch; rows a claim holds are left for
			 * later rather than waited for. */
			snprintf(sql, sizeof(sql),
				 "DELETE FROM %1$s WHERE ctid = ANY (ARRAY (SELECT ctid FROM "
				 "%1$s WHERE until <= statement_timestamp() LIMIT %2$ld FOR "
				 "UPDATE SKIP LOCKED)) AND until <= statement_timestamp()",
				 pgstore_tables[t], batch);
			rc = pgconn_exec(c, sql, st->timeout_ms, &res, err, sizeof(err));
			if (rc != PGCONN_OK)
				break;
			n = atol(PQcmdTuples(res));
			PQclear(res);
			removed += n;
			if (n < batch)
				break;
		}
	if (locked) {
		snprintf(sql, sizeof(sql), "SELECT pg_advisory_unlock(%d, %d)",
			 PGSTORE_LOCK_CLASS, PGSTORE_LOCK_PURGE);
		pgconn_exec(c, sql, st->timeout_ms, NULL, err, sizeof(err));
	}
	PQfinish(c);
	if (rc != PGCONN_OK) {
		log_warning("postgres: purge: %s", err);
		return -1;
	}
	pthread_mutex_lock(&st->lock);
	st->counters.purged += (uint64_t)removed;
	pthread_mutex_unlock(&st->lock);
	if (!locked)
		log_debug("postgres: purge: another proxy is purging");
	return removed;
}

/* ---- life and counters ---------------------------------------------------------------- */

struct pgstore *pgstore_open(const struct pgstore_settings *set)
{
	struct pgstore *st = calloc(1, sizeof(*st));

	if (st == NULL || (st->conninfo = strdup(set->conninfo)) == NULL) {
		free(st);
		return NULL;
	}
	st->timeout_ms = set->timeout_ms;
	st->backoff_ms = PGSTORE_BACKOFF_MIN_MS;
	st->tail = &st->head;
	pthread_mutex_init(&st->lock, NULL);
	st->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (st->wake < 0 || pthread_create(&st->thread, NULL, pgstore_main, st) != 0) {
		if (st->wake >= 0)
			close(st->wake);
		pthread_mutex_destroy(&st->lock);
		free(st->conninfo);
		free(st);
		return NULL;
	}
	return st;
}

void pgstore_close(struct pgstore *st)
{
	if (st == NULL)
		return;
	pthread_mutex_lock(&st->lock);
	st->stop = 1;
	pthread_mutex_unlock(&st->lock);
	pgstore_wake(st);
	pthread_join(st->thread, NULL);
	close(st->wake);
	pthread_mutex_destroy(&st->lock);
	/* The connection string may hold a password. */
	memset(st->conninfo, 0, strlen(st->conninfo));
	free(st->conninfo);
	free(st);
}

int pgstore_ready(struct pgstore *st)
{
	int up;

	pthread_mutex_lock(&st->lock);
	up = st->counters.up;
	pthread_mutex_unlock(&st->lock);
	return up;
}

void pgstore_counters(struct pgstore *st, struct pgstore_counters *out)
{
	pthread_mutex_lock(&st->lock);
	*out = st->counters;
	pthread_mutex_unlock(&st->lock);
}

void pgstore_metrics(struct pgstore *st, FILE *out)
{
	static const char *const ops[3] = {"claim", "confirm", "forget"};
	struct pgstore_counters c;
	uint64_t cum = 0;
	int i;

	pgstore_counters(st, &c);
	fprintf(out,
		"# HELP acemq_proxy_postgres_up 1 when the PostgreSQL state store answers\n"
		"# TYPE acemq_proxy_postgres_up gauge\n"
		"acemq_proxy_postgres_up %d\n",
		c.up);
	fprintf(out, "# HELP acemq_proxy_postgres_operations_total operations sent to "
		     "PostgreSQL, by op\n"
		     "# TYPE acemq_proxy_postgres_operations_total counter\n");
	for (i = 0; i < 3; i++)
		fprintf(out, "acemq_proxy_postgres_operations_total{op=\"%s\"} %llu\n", ops[i],
			(unsigned long long)c.ops[i]);
	fprintf(
	    out,
	    "# HELP acemq_proxy_postgres_operation_errors_total operations PostgreSQL did "
	    "not answer (the patterns failed open)\n"
	    "# TYPE acemq_proxy_postgres_operation_errors_total counter\n"
	    "acemq_proxy_postgres_operation_errors_total %llu\n"
	    "# HELP acemq_proxy_postgres_round_trip_errors_total round trips that failed, by "
	    "why\n"
	    "# TYPE acemq_proxy_postgres_round_trip_errors_total counter\n"
	    "acemq_proxy_postgres_round_trip_errors_total{why=\"timeout\"} %llu\n"
	    "acemq_proxy_postgres_round_trip_errors_total{why=\"other\"} %llu\n"
	    "# HELP acemq_proxy_postgres_connects_total connections made, by result\n"
	    "# TYPE acemq_proxy_postgres_connects_total counter\n"
	    "acemq_proxy_postgres_connects_total{result=\"ok\"} %llu\n"
	    "acemq_proxy_postgres_connects_total{result=\"failed\"} %llu\n"
	    "# HELP acemq_proxy_postgres_purged_total rows past their time deleted by this "
	    "proxy's janitor\n"
	    "# TYPE acemq_proxy_postgres_purged_total counter\n"
	    "acemq_proxy_postgres_purged_total %llu\n"
	    "# HELP acemq_proxy_postgres_round_trip_seconds pipelined round trips (one "
	    "commit each)\n"
	    "# TYPE acemq_proxy_postgres_round_trip_seconds histogram\n",
	    (unsigned long long)c.op_errors, (unsigned long long)c.timeouts,
	    (unsigned long long)c.round_trip_errors, (unsigned long long)c.connects,
	    (unsigned long long)c.connect_failures, (unsigned long long)c.purged);
	for (i = 0; i < 11; i++) {
		cum += c.hist[i];
		fprintf(out, "acemq_proxy_postgres_round_trip_seconds_bucket{le=\"%g\"} %llu\n",
			pgstore_bounds_ms[i] / 1000.0, (unsigned long long)cum);
	}
	cum += c.hist[11];
	fprintf(out,
		"acemq_proxy_postgres_round_trip_seconds_bucket{le=\"+Inf\"} %llu\n"
		"acemq_proxy_postgres_round_trip_seconds_sum %.6f\n"
		"acemq_proxy_postgres_round_trip_seconds_count %llu\n",
		(unsigned long long)cum, c.seconds, (unsigned long long)c.round_trips);
}
