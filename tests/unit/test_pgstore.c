/* test_pgstore: the idempotency and publish-dedup decisions of the
 * PostgreSQL backend against a real database (ACEMQ_TEST_POSTGRES_URL;
 * skipped, exit 77, without one): the three answers, forget giving up only
 * the owner's claim, leases and retention on the database's clock whatever
 * the proxy's, batches in one round trip, a bad operation failing alone,
 * two connections racing for the same keys, the schema created once and a
 * newer one refused, and the purge under its advisory lock. Each run works
 * in a database of its own, dropped at the end. */
#include "tests/unit/unit.h"

#include "src/store/idem.h"
#include "src/store/pgstore.h"
#include "src/store/state.h"

#include <check.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char admin_url[1024], db_url[2048], dbname[64];
static struct pgstore *pg;
static const uint64_t A[2] = {1, 10}, B[2] = {1, 20};

/* url with its dbname replaced, as a keyword/value string. */
static void with_dbname(const char *url, const char *db, char *out, size_t len)
{
	PQconninfoOption *opts = PQconninfoParse(url, NULL), *o;
	size_t n = 0;

	out[0] = 0;
	if (opts == NULL)
		exit(1);
	for (o = opts; o->keyword; o++) {
		const char *v = strcmp(o->keyword, "dbname") == 0 ? db : o->val;

		if (v == NULL || v[0] == 0)
			continue;
		n += (size_t)snprintf(out + n, len - n, "%s='%s' ", o->keyword, v);
		if (n >= len)
			exit(1);
	}
	PQconninfoFree(opts);
}

static PGresult *sql(const char *url, const char *q)
{
	PGconn *c = PQconnectdb(url);
	PGresult *r;

	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "test_pgstore: %s", PQerrorMessage(c));
		exit(1);
	}
	r = PQexec(c, q);
	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "test_pgstore: %s: %s", q, PQresultErrorMessage(r));
		exit(1);
	}
	PQfinish(c);
	return r;
}

static void sql_do(const char *url, const char *q)
{
	PQclear(sql(url, q));
}

static long sql_num(const char *url, const char *q)
{
	PGresult *r = sql(url, q);
	long n = atol(PQgetvalue(r, 0, 0));

	PQclear(r);
	return n;
}

static struct pgstore *open_store(const char *url, long timeout_ms)
{
	struct pgstore_settings set = {url, timeout_ms};
	struct pgstore *s = pgstore_open(&set);

	if (s == NULL)
		exit(1);
	return s;
}

struct op {
	struct idem_req r;
};

static void prep(struct op *o, enum idem_op what, int dedup, const char *vhost,
		 const char *scope, const char *key, const uint64_t owner[2], uint64_t now,
		 uint64_t span)
{
	memset(o, 0, sizeof(*o));
	if (dedup)
		ck_assert_int_eq(idem_dedup_prepare(&o->r, what, vhost, scope, strlen(scope),
						    key, strlen(key), owner, now, span),
				 0);
	else
		ck_assert_int_eq(
		    idem_prepare(&o->r, what, vhost, scope, key, strlen(key), owner, now, span),
		    0);
}

static enum idem_answer run1(struct pgstore *s, enum idem_op what, int dedup, const char *key,
			     const uint64_t owner[2], uint64_t span)
{
	struct op o;
	struct idem_req *r = &o.r;

	prep(&o, what, dedup, "/", "orders", key, owner, state_now_ms(), span);
	pgstore_run(s, &r, 1);
	ck_assert_int_eq(o.r.w.rc, STATE_OK);
	return o.r.answer;
}

#define CLAIM(k, o, span)   run1(pg, IDEM_CLAIM, 0, k, o, span)
#define CONFIRM(k, o, span) run1(pg, IDEM_CONFIRM, 0, k, o, span)
#define FORGET(k, o)        run1(pg, IDEM_FORGET, 0, k, o, 0)

START_TEST(test_answers)
{
	ck_assert_int_eq(CLAIM("k1", A, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(CLAIM("k1", B, 30000), IDEM_IN_PROGRESS);
	ck_assert_int_eq(CONFIRM("k1", A, 600000), IDEM_DONE);
	ck_assert_int_eq(CLAIM("k1", B, 30000), IDEM_DUPLICATE);
	ck_assert_int_eq(CLAIM("k1", A, 30000), IDEM_DUPLICATE);
	/* A confirmation is never forgotten. */
	ck_assert_int_eq(FORGET("k1", A), IDEM_NOT_OWNER);
	ck_assert_int_eq(CLAIM("k1", B, 30000), IDEM_DUPLICATE);
	ck_assert(pgstore_ready(pg));
}
END_TEST

START_TEST(test_forget_only_own)
{
	ck_assert_int_eq(CLAIM("k2", A, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(FORGET("k2", B), IDEM_NOT_OWNER);
	ck_assert_int_eq(CLAIM("k2", B, 30000), IDEM_IN_PROGRESS);
	ck_assert_int_eq(FORGET("k2", A), IDEM_DONE);
	ck_assert_int_eq(CLAIM("k2", B, 30000), IDEM_CLAIMED);
	/* The same owner asking again (a claim sent again after a lost
	 * connection) keeps its claim. */
	ck_assert_int_eq(CLAIM("k2", B, 30000), IDEM_CLAIMED);
}
END_TEST

START_TEST(test_lease_and_retention_run_out)
{
	struct op o;
	struct idem_req *r = &o.r;

	ck_assert_int_eq(CLAIM("k3", A, 1), IDEM_CLAIMED);
	usleep(30000);
	prep(&o, IDEM_CLAIM, 0, "/", "orders", "k3", B, state_now_ms(), 30000);
	pgstore_run(pg, &r, 1);
	ck_assert_int_eq(o.r.answer, IDEM_CLAIMED);
	ck_assert_int_eq(o.r.lease_expired, 1);
	ck_assert_int_eq(CONFIRM("k3", B, 1), IDEM_DONE);
	usleep(30000);
	prep(&o, IDEM_CLAIM, 0, "/", "orders", "k3", A, state_now_ms(), 30000);
	pgstore_run(pg, &r, 1);
	ck_assert_int_eq(o.r.answer, IDEM_CLAIMED);
	ck_assert_int_eq(o.r.lease_expired, 0);
}
END_TEST

/* The proxies' clocks do not matter: only the database's. */
START_TEST(test_database_clock)
{
	struct op o;
	struct idem_req *r = &o.r;
	uint64_t now = state_now_ms();

	prep(&o, IDEM_CLAIM, 0, "/", "orders", "k4", A, now + 3600 * 1000, 30000);
	pgstore_run(pg, &r, 1);
	ck_assert_int_eq(o.r.answer, IDEM_CLAIMED);
	/* B's clock is two hours ahead: by it, A's lease ran out. */
	prep(&o, IDEM_CLAIM, 0, "/", "orders", "k4", B, now + 7200 * 1000, 30000);
	pgstore_run(pg, &r, 1);
	ck_assert_int_eq(o.r.answer, IDEM_IN_PROGRESS);
}
END_TEST

START_TEST(test_namespaces)
{
	struct op o[4];
	struct idem_req *r[4] = {&o[0].r, &o[1].r, &o[2].r, &o[3].r};
	char big[600];
	int i;

	ck_assert_int_eq(CLAIM("k5", A, 30000), IDEM_CLAIMED);
	prep(&o[0], IDEM_CLAIM, 0, "/", "other-queue", "k5", B, 0, 30000);
	prep(&o[1], IDEM_CLAIM, 0, "other-vhost", "orders", "k5", B, 0, 30000);
	prep(&o[2], IDEM_CLAIM, 1, "/", "orders", "k5", B, 0, 30000); /* dedup */
	memset(big, 'v', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	prep(&o[3], IDEM_CLAIM, 1, "/", "orders", big, B, 0, 30000); /* hashed */
	pgstore_run(pg, r, 4);
	for (i = 0; i < 4; i++) {
		ck_assert_int_eq(o[i].r.w.rc, STATE_OK);
		ck_assert_int_eq(o[i].r.answer, IDEM_CLAIMED);
	}
	ck_assert_int_eq(sql_num(db_url, "SELECT count(*) FROM acemq_dedup_publish WHERE "
					 "length(key) = 8 + 32"),
			 1);
}
END_TEST

/* Many operations in one round trip, in order per key; one that cannot be
 * done (a vhost that is not UTF-8) fails alone. */
START_TEST(test_batch)
{
	static struct op o[300];
	static struct idem_req *r[300];
	char key[32];
	int i;

	for (i = 0; i < 100; i++) {
		snprintf(key, sizeof(key), "b%d", i);
		prep(&o[3 * i], IDEM_CLAIM, 0, "/", "orders", key, A, 0, 30000);
		prep(&o[3 * i + 1], i % 2 ? IDEM_FORGET : IDEM_CONFIRM, 0, "/", "orders", key,
		     A, 0, 600000);
		prep(&o[3 * i + 2], IDEM_CLAIM, 0, i == 50 ? "\xff\xfe" : "/", "orders", key, B,
		     0, 30000);
	}
	for (i = 0; i < 300; i++)
		r[i] = &o[i].r;
	pgstore_run(pg, r, 300);
	for (i = 0; i < 100; i++) {
		ck_assert_int_eq(o[3 * i].r.w.rc, STATE_OK);
		ck_assert_int_eq(o[3 * i].r.answer, IDEM_CLAIMED);
		ck_assert_int_eq(o[3 * i + 1].r.answer, IDEM_DONE);
		if (i == 50) {
			ck_assert_int_ne(o[3 * i + 2].r.w.rc, STATE_OK);
			continue;
		}
		ck_assert_int_eq(o[3 * i + 2].r.w.rc, STATE_OK);
		ck_assert_int_eq(o[3 * i + 2].r.answer, i % 2 ? IDEM_CLAIMED : IDEM_DUPLICATE);
	}
}
END_TEST

/* Two proxies (two connections) race for the same keys: each is claimed
 * exactly once. */
struct racer {
	struct pgstore *s;
	const uint64_t *owner;
	int claimed;
};

static void *race(void *arg)
{
	struct racer *x = arg;
	struct op *o = calloc(200, sizeof(*o));
	struct idem_req *r[200];
	char key[32];
	int round, i;

	for (round = 0; round < 5; round++) {
		for (i = 0; i < 40; i++) {
			snprintf(key, sizeof(key), "race%d", (round * 40 + (i * 7) % 40));
			prep(&o[i], IDEM_CLAIM, 1, "/", "amq.topic", key, x->owner, 0, 30000);
			r[i] = &o[i].r;
		}
		pgstore_run(x->s, r, 40);
		for (i = 0; i < 40; i++)
			x->claimed += o[i].r.w.rc == STATE_OK && o[i].r.answer == IDEM_CLAIMED;
	}
	free(o);
	return NULL;
}

START_TEST(test_two_connections_race)
{
	struct pgstore *other = open_store(db_url, 5000);
	struct racer a = {pg, A, 0}, b = {other, B, 0};
	pthread_t ta, tb;

	/* pgstore_run serialises its callers; each racer waits on its own. */
	pthread_create(&ta, NULL, race, &a);
	pthread_create(&tb, NULL, race, &b);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	ck_assert_int_eq(a.claimed + b.claimed, 200);
	ck_assert_int_eq(sql_num(db_url, "SELECT count(*) FROM acemq_dedup_publish WHERE "
					 "encode(key, 'escape') LIKE 'race%'"),
			 200);
	pgstore_close(other);
}
END_TEST

START_TEST(test_purge)
{
	char key[32], lockq[128];
	int i;
	PGconn *holder;
	PGresult *res;

	for (i = 0; i < 25; i++) {
		snprintf(key, sizeof(key), "p%d", i);
		ck_assert_int_eq(CLAIM(key, A, 30000), IDEM_CLAIMED);
		ck_assert_int_eq(CONFIRM(key, A, i < 20 ? 1 : 600000), IDEM_DONE);
	}
	usleep(30000);
	/* Another proxy purging: this one leaves it alone. */
	holder = PQconnectdb(db_url);
	snprintf(lockq, sizeof(lockq), "SELECT pg_advisory_lock(%d, %d)", PGSTORE_LOCK_CLASS,
		 PGSTORE_LOCK_PURGE);
	res = PQexec(holder, lockq);
	ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
	PQclear(res);
	ck_assert_int_eq(pgstore_purge(pg, 7, 100), 0);
	PQfinish(holder);
	/* In batches of 7: all 20 whose time passed, none of the others. */
	ck_assert_int_ge(pgstore_purge(pg, 7, 100), 20);
	ck_assert_int_eq(sql_num(db_url, "SELECT count(*) FROM acemq_idempotency WHERE "
					 "encode(key, 'escape') LIKE 'p%' AND until <= now()"),
			 0);
	ck_assert_int_eq(CLAIM("p3", B, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(CLAIM("p22", B, 30000), IDEM_DUPLICATE);
}
END_TEST

/* A newer schema is refused: the operations fail (the patterns fail
 * open), and the store is not ready. */
START_TEST(test_newer_schema_refused)
{
	struct pgstore *s;
	struct op o;
	struct idem_req *r = &o.r;

	ck_assert_int_eq(sql_num(db_url, "SELECT max(version) FROM acemq_schema"),
			 PGSTORE_SCHEMA_VERSION);
	sql_do(db_url, "INSERT INTO acemq_schema VALUES (99)");
	s = open_store(db_url, 2000);
	prep(&o, IDEM_CLAIM, 0, "/", "orders", "schema", A, 0, 30000);
	pgstore_run(s, &r, 1);
	ck_assert_int_ne(o.r.w.rc, STATE_OK);
	ck_assert(!pgstore_ready(s));
	pgstore_close(s);
	sql_do(db_url, "DELETE FROM acemq_schema WHERE version = 99");
}
END_TEST

int main(void)
{
	const char *url = getenv("ACEMQ_TEST_POSTGRES_URL");
	char q[128];
	TCase *tc;
	int rc;

	if (url == NULL || url[0] == 0) {
		printf("test_pgstore: ACEMQ_TEST_POSTGRES_URL is not set: skipped\n");
		return 77;
	}
	snprintf(admin_url, sizeof(admin_url), "%s", url);
	snprintf(dbname, sizeof(dbname), "acemq_unit_%d", (int)getpid());
	snprintf(q, sizeof(q), "CREATE DATABASE %s", dbname);
	sql_do(admin_url, q);
	with_dbname(admin_url, dbname, db_url, sizeof(db_url));
	pg = open_store(db_url, 5000);
	tc = tcase_create("pgstore");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_answers);
	tcase_add_test(tc, test_forget_only_own);
	tcase_add_test(tc, test_lease_and_retention_run_out);
	tcase_add_test(tc, test_database_clock);
	tcase_add_test(tc, test_namespaces);
	tcase_add_test(tc, test_batch);
	tcase_add_test(tc, test_two_connections_race);
	tcase_add_test(tc, test_purge);
	tcase_add_test(tc, test_newer_schema_refused);
	rc = unit_run("pgstore", tc, 0);
	pgstore_close(pg);
	snprintf(q, sizeof(q), "DROP DATABASE %s WITH (FORCE)", dbname);
	sql_do(admin_url, q);
	return rc;
}
