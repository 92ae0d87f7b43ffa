/* test_idem: the idempotency answers on a real state layer: claim, the
 * duplicate after confirm, in-progress under another's live lease, forget
 * giving up only one's own claim, leases and retention running out, the
 * purge, and keys namespaced by queue and vhost. */
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

static struct worker tw;
static char tdir[64];
static struct state *st;
static const uint64_t A[2] = {1, 10}, B[2] = {1, 20}, C[2] = {2, 10};

struct pending {
	struct idem_req r; /* first: its completion is the worker_call */
	int done;
};

static void on_done(struct worker_call *c)
{
	((struct pending *)c)->done = 1;
}

static enum idem_answer op(enum idem_op what, const char *vhost, const char *queue,
			   const char *key, const uint64_t owner[2], uint64_t now,
			   uint64_t span)
{
	struct pending p;
	int spins = 0;

	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(
	    idem_prepare(&p.r, what, vhost, queue, key, strlen(key), owner, now, span), 0);
	p.r.w.call.fn = on_done;
	p.r.w.w = &tw;
	state_submit(st, &p.r.w);
	/* The completion is posted to the worker: run it there. */
	while (!p.done && spins++ < 5000) {
		worker_run_posted(&tw);
		usleep(500);
	}
	ck_assert(p.done);
	ck_assert_int_eq(p.r.w.rc, STATE_OK);
	return p.r.answer;
}

static void setup(void)
{
	struct state_settings set = {tdir, 64 << 20, 1};
	char err[256];

	evthread_use_pthreads();
	snprintf(tdir, sizeof(tdir), "/tmp/acemq-test-idem-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	ck_assert_int_eq(worker_init(&tw, 0), 0);
	st = state_open(&set, err, sizeof(err));
	ck_assert_msg(st != NULL, "%s", err);
}

static void teardown(void)
{
	char cmd[128];

	state_close(st);
	worker_fini(&tw);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_three_answers)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", A, 1000, 30000), IDEM_CLAIMED);
	/* Another consumer while A's lease is live. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", B, 2000, 30000), IDEM_IN_PROGRESS);
	/* A second message of the key to A's consumer is another delivery,
	 * another owner (C): in progress too. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", C, 3000, 30000), IDEM_IN_PROGRESS);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "q", "m1", A, 4000, 60000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", B, 5000, 30000), IDEM_DUPLICATE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", A, 5000, 30000), IDEM_DUPLICATE);
	/* A forget never undoes a confirmation. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "q", "m1", A, 6000, 0), IDEM_NOT_OWNER);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", B, 7000, 30000), IDEM_DUPLICATE);
	/* Past the retention, it runs again. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "m1", B, 64001, 30000), IDEM_CLAIMED);
}
END_TEST

START_TEST(test_forget_and_leases)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "k", A, 1000, 30000), IDEM_CLAIMED);
	/* B cannot give up A's claim. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "q", "k", B, 2000, 0), IDEM_NOT_OWNER);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "k", B, 2000, 30000), IDEM_IN_PROGRESS);
	/* A nacks: its claim goes, a retry runs. */
	ck_assert_int_eq(op(IDEM_FORGET, "/", "q", "k", A, 3000, 0), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "k", B, 3000, 30000), IDEM_CLAIMED);
	/* B dies holding it: once the lease is over, A may run it. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "k", A, 32999, 30000), IDEM_IN_PROGRESS);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "k", A, 33001, 30000), IDEM_CLAIMED);
}
END_TEST

/* The same owner (the same delivery) claiming again renews its lease. */
START_TEST(test_claim_renewed_by_its_owner)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "r", A, 1000, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "r", A, 20000, 30000), IDEM_CLAIMED);
	/* Past the first lease, inside the renewed one: in progress. */
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "r", B, 40000, 30000), IDEM_IN_PROGRESS);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "r", B, 50001, 30000), IDEM_CLAIMED);
}
END_TEST

START_TEST(test_namespaces)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q1", "k", A, 1000, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "q1", "k", A, 1000, 60000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q2", "k", B, 1000, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "other", "q1", "k", B, 1000, 30000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q1", "k", B, 1000, 30000), IDEM_DUPLICATE);
}
END_TEST

START_TEST(test_purge)
{
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "old", A, 1000, 1000), IDEM_CLAIMED);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "q", "gone", A, 1000, 1000), IDEM_DONE);
	ck_assert_int_eq(op(IDEM_CONFIRM, "/", "q", "kept", A, 1000, 100000), IDEM_DONE);
	ck_assert_int_eq(idem_purge(st, "/", 5000), 2);
	ck_assert_int_eq(op(IDEM_CLAIM, "/", "q", "kept", B, 6000, 1000), IDEM_DUPLICATE);
	ck_assert_int_eq(idem_purge(st, "/", 6000), 0);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("idem");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_three_answers);
	tcase_add_test(tc, test_forget_and_leases);
	tcase_add_test(tc, test_claim_renewed_by_its_owner);
	tcase_add_test(tc, test_namespaces);
	tcase_add_test(tc, test_purge);
	return unit_run("idem", tc, 0);
}
