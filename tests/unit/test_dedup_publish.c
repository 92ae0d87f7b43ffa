/* test_dedup_publish: publish-dedup windows on a real state layer: a
 * value reserved while in flight, remembered once confirmed, given up on a
 * nack; leases and windows running out; the purge; values namespaced by
 * exchange and vhost and apart from idempotency keys; long values kept
 * hashed; the window kept across a reopen. */
#include "tests/unit/unit.h"

#include "src/store/idem.h"
#include "src/store/state.h"
#include "src/worker.h"

#include <check.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEASE  10000
#define WINDOW 60000

static struct worker tw;
static char tdir[64];
static struct state *st;
static const uint64_t A[2] = {7, 1}, B[2] = {7, 2}, C[2] = {8, 1};

struct pending {
	struct idem_req r; /* first: its completion is the worker_call */
	int done;
};

static void on_done(struct worker_call *c)
{
	((struct pending *)c)->done = 1;
}

static void run(struct pending *p)
{
	int spins = 0;

	p->r.w.call.fn = on_done;
	p->r.w.w = &tw;
	state_submit(st, &p->r.w);
	/* The completion is posted to the worker: run it there. */
	while (!p->done && spins++ < 5000) {
		worker_run_posted(&tw);
		usleep(500);
	}
	ck_assert(p->done);
	ck_assert_int_eq(p->r.w.rc, STATE_OK);
}

static enum idem_answer opv(enum idem_op what, const char *vhost, const char *exchange,
			    const void *value, size_t vlen, const uint64_t owner[2],
			    uint64_t now)
{
	struct pending p;
	uint64_t span = what == IDEM_CLAIM ? LEASE : what == IDEM_CONFIRM ? WINDOW : 0;

	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(idem_dedup_prepare(&p.r, what, vhost, exchange, strlen(exchange),
					    value, vlen, owner, now, span),
			 0);
	run(&p);
	return p.r.answer;
}

static enum idem_answer op(enum idem_op what, const char *vhost, const char *exchange,
			   const char *value, const uint64_t owner[2], uint64_t now)
{
	return opv(what, vhost, exchange, value, strlen(value), owner, now);
}

static void open_state(void)
{
	struct state_settings set = {tdir, 64 << 20, 1};
	char err[256];

	st = state_open(&set, err, sizeof(err));
	ck_assert_msg(st != NULL, "%s", err);
}

static void setup(void)
{
	evthread_use_pthreads();
	snprintf(tdir, sizeof(tdir), "/tmp/acemq-test-dedup-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	ck_assert_int_eq(worker_init(&tw, 0), 0);
	open_state();
}

static void teardown(void)
{
	char cmd[128];

	state_close(st);
	worker_fini(&tw);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_remember_once_confirmed)
{
	/* The first publish reserves the value while it is in flight. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", A, 1000), IDEM_CLAIMED);
	/* An identical publish meanwhile: in flight, not yet a duplicate. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", B, 1500), IDEM_IN_PROGRESS);
	/* The broker acked the first: remembered for the window. */
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "orders", "v1", A, 2000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", B, 2500), IDEM_DUPLICATE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", C, 2000 + WINDOW - 1),
			 IDEM_DUPLICATE);
	/* A forget never undoes a remembered value. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "orders", "v1", A, 3000), IDEM_NOT_OWNER);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", B, 3000), IDEM_DUPLICATE);
	/* A second confirm does not stretch the window. */
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "orders", "v1", B, 30000), IDEM_DONE);
	/* Past the window it is a first publish again. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "v1", C, 2000 + WINDOW), IDEM_CLAIMED);
}
END_TEST

START_TEST(test_nack_gives_up)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "n", A, 1000), IDEM_CLAIMED);
	/* Another's forget cannot give up A's reservation. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "orders", "n", B, 1100), IDEM_NOT_OWNER);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "n", B, 1200), IDEM_IN_PROGRESS);
	/* The broker nacked A's publish: its retry is a first publish. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "orders", "n", A, 1300), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "n", B, 1400), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "orders", "n", B, 1500), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "orders", "n", A, 1600), IDEM_DUPLICATE);
}
END_TEST

START_TEST(test_lease_runs_out)
{
	/* A proxy that died with a publish in flight holds its value only
	 * for the lease. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "k", A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "k", B, 1000 + LEASE - 1), IDEM_IN_PROGRESS);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "k", B, 1000 + LEASE), IDEM_CLAIMED);
	/* A's confirm arriving late still remembers the value. */
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "x", "k", A, 1000 + LEASE + 5), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "k", C, 1000 + LEASE + 6), IDEM_DUPLICATE);
}
END_TEST

START_TEST(test_namespaces)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "ex1", "v", A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "ex1", "v", A, 1000), IDEM_DONE);
	/* Per exchange, per vhost. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "ex2", "v", B, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "", "v", B, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "other", "ex1", "v", B, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "ex1", "v", B, 1000), IDEM_DUPLICATE);
	/* "ex\0 1v" and "ex1\0v" are different keys. */
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "ex", "1v", 2, B, 1000), IDEM_CLAIMED);
	/* Idempotency keys of a queue with the same names are apart. */
	{
		struct pending p;

		memset(&p, 0, sizeof(p));
		ck_assert_int_eq(
		    idem_prepare(&p.r, IDEM_CLAIM, "/", "ex1", "v", 1, C, 1000, LEASE), 0);
		run(&p);
		ck_assert_int_eq(p.r.answer, IDEM_CLAIMED);
	}
}
END_TEST

START_TEST(test_values)
{
	char big[1000], other[1000], edge[256];
	struct idem_req r;

	memset(big, 'a', sizeof(big));
	memcpy(other, big, sizeof(other));
	other[999] = 'b';
	memset(edge, 'e', sizeof(edge));
	/* Longer than a key may be: kept as its hash, still exact. */
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", big, sizeof(big), A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(opv(IDEM_CONFIRM, "/", "x", big, sizeof(big), A, 1000), IDEM_DONE);
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", big, sizeof(big), B, 1000), IDEM_DUPLICATE);
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", other, sizeof(other), B, 1000),
			 IDEM_CLAIMED);
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", big, 255, B, 1000), IDEM_CLAIMED);
	/* The longest exchange with the longest value kept as it is. */
	memset(big, 'z', 255);
	big[255] = 0;
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", big, edge, 255, A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", big, edge, 256, A, 1000), IDEM_CLAIMED);
	/* Bytes, not strings: a NUL inside a value is part of it. */
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", "a\0b", 3, A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(opv(IDEM_CLAIM, "/", "x", "a\0c", 3, B, 1000), IDEM_CLAIMED);
	/* Not a value. */
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(idem_dedup_prepare(&r, IDEM_CLAIM, "/", "x", 1, "", 0, A, 1, 1), -1);
	memset(big, 'z', 256);
	ck_assert_int_eq(idem_dedup_prepare(&r, IDEM_CLAIM, "/", big, 256, "v", 1, A, 1, 1),
			 -1);
}
END_TEST

START_TEST(test_purge)
{
	/* A reservation whose lease ran out, a value past its window, one
	 * still in its window, and one of another vhost. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "stale", A, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "x", "gone", A, 1000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "x", "kept", A, 50000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CONFIRM, "v2", "x", "gone", A, 1000), IDEM_DONE);
	ck_assert_int_eq(idem_dedup_purge(st, "/", 1000 + WINDOW + 1), 2);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "kept", B, 1000 + WINDOW + 2),
			 IDEM_DUPLICATE);
	ck_assert_int_eq(idem_dedup_purge(st, "/", 1000 + WINDOW + 3), 0);
	/* Idempotency's purge leaves publish-dedup values alone. */
	ck_assert_int_eq(idem_purge(st, "v2", 1000 + WINDOW + 1), 0);
	ck_assert_int_eq(idem_dedup_purge(st, "v2", 1000 + WINDOW + 1), 1);
	/* A vhost without a database purges nothing. */
	ck_assert_int_eq(idem_dedup_purge(st, "none", 1000 + WINDOW + 1), 0);
}
END_TEST

START_TEST(test_reopen_keeps_window)
{
	uint64_t now = state_now_ms();

	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "durable", A, now), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "x", "durable", A, now), IDEM_DONE);
	/* A restart of the proxy: the environment closed and opened again. */
	state_close(st);
	open_state();
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "x", "durable", B, now + 1), IDEM_DUPLICATE);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("dedup_publish");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_remember_once_confirmed);
	tcase_add_test(tc, test_nack_gives_up);
	tcase_add_test(tc, test_lease_runs_out);
	tcase_add_test(tc, test_namespaces);
	tcase_add_test(tc, test_values);
	tcase_add_test(tc, test_purge);
	tcase_add_test(tc, test_reopen_keeps_window);
	return unit_run("dedup_publish", tc, 0);
}
