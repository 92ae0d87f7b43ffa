/* test_state: the state layer over a real LMDB environment: writes reported
 * on the worker's loop once durable, group commit, reads and scans, a full
 * map failing only the writes that do not fit, persistence across a
 * reopen, and writes after close refused. */
#include "tests/unit/unit.h"

#include "src/store/state.h"
#include "src/worker.h"

#include <check.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct req {
	struct state_write w;
	struct state_op op;
	char key[32];
	int *done;
	int rc;
};

static struct worker tw;
static char tdir[64];

static void req_done(struct worker_call *c)
{
	struct req *r = (struct req *)c; /* call is the first member */

	r->rc = r->w.rc;
	(*r->done)++;
}

static void req_init(struct req *r, int *done, const char *db, int i, const void *val,
		     size_t vlen)
{
	memset(r, 0, sizeof(*r));
	snprintf(r->key, sizeof(r->key), "k%06d", i);
	r->op.db = db;
	r->op.key = r->key;
	r->op.klen = strlen(r->key);
	r->op.val = val;
	r->op.vlen = vlen;
	r->w.call.fn = req_done;
	r->w.w = &tw;
	r->w.ops = &r->op;
	r->w.nops = 1;
	r->done = done;
}

static void wait_done(int *done, int n)
{
	int spins = 0;

	while (*done < n && spins++ < 5000) {
		event_base_loop(tw.base, EVLOOP_NONBLOCK);
		worker_run_posted(&tw);
		usleep(1000);
	}
	ck_assert_int_eq(*done, n);
}

static struct state *open_state(uint64_t map)
{
	struct state_settings set = {tdir, map, 1};
	char err[256];
	struct state *st = state_open(&set, err, sizeof(err));

	ck_assert_msg(st != NULL, "%s", err);
	return st;
}

static void setup(void)
{
	evthread_use_pthreads();
	snprintf(tdir, sizeof(tdir), "/tmp/acemq-test-state-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	ck_assert_int_eq(worker_init(&tw, 0), 0);
}

static void teardown(void)
{
	char cmd[128];

	worker_fini(&tw);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

static void get_copy(void *arg, const void *val, size_t vlen)
{
	memcpy(arg, val, vlen);
	((char *)arg)[vlen] = 0;
}

static int count_keys(void *arg, const void *k, size_t klen, const void *v, size_t vlen)
{
	(*(int *)arg)++;
	return 0;
}

START_TEST(test_write_read_and_group_commit)
{
	struct state *st = open_state(64 << 20);
	static struct req r[200];
	struct state_counters c;
	char buf[64];
	int done = 0, i, n = 0;

	for (i = 0; i < 200; i++) {
		req_init(&r[i], &done, "claims:/", i, "value", 5);
		state_submit(st, &r[i].w);
	}
	wait_done(&done, 200);
	for (i = 0; i < 200; i++)
		ck_assert_int_eq(r[i].rc, STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_eq(c.writes, 200);
	/* Queued writes share commits. */
	ck_assert_msg(c.commits < 200, "commits %llu", (unsigned long long)c.commits);
	ck_assert_int_eq(state_get(st, "claims:/", "k000007", 7, get_copy, buf), STATE_OK);
	ck_assert_str_eq(buf, "value");
	ck_assert_int_eq(state_get(st, "claims:/", "nope", 4, get_copy, buf), STATE_NOTFOUND);
	ck_assert_int_eq(state_get(st, "claims:other", "k000007", 7, get_copy, buf),
			 STATE_NOTFOUND);
	ck_assert_int_eq(state_scan(st, "claims:/", NULL, 0, count_keys, &n), STATE_OK);
	ck_assert_int_eq(n, 200);
	/* Delete one. */
	req_init(&r[0], &done, "claims:/", 7, NULL, 0);
	state_submit(st, &r[0].w);
	wait_done(&done, 201);
	ck_assert_int_eq(state_get(st, "claims:/", "k000007", 7, get_copy, buf),
			 STATE_NOTFOUND);
	state_close(st);

	/* What was reported durable is there after a reopen. */
	st = open_state(64 << 20);
	ck_assert_int_eq(state_get(st, "claims:/", "k000199", 7, get_copy, buf), STATE_OK);
	ck_assert_str_eq(buf, "value");
	state_close(st);
}
END_TEST

START_TEST(test_full_map_fails_only_what_does_not_fit)
{
	struct state *st = open_state(1 << 20);
	static struct req r[3];
	static char big[4 << 20];
	struct state_counters c;
	char buf[64];
	int done = 0;

	req_init(&r[0], &done, "claims:/", 0, "small", 5);
	req_init(&r[1], &done, "claims:/", 1, big, sizeof(big));
	req_init(&r[2], &done, "claims:/", 2, "small", 5);
	state_submit(st, &r[0].w);
	state_submit(st, &r[1].w);
	state_submit(st, &r[2].w);
	wait_done(&done, 3);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	ck_assert_int_eq(r[1].rc, STATE_FULL);
	ck_assert_int_eq(r[2].rc, STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_ge(c.full_errors, 1);
	ck_assert_int_eq(state_get(st, "claims:/", "k000002", 7, get_copy, buf), STATE_OK);
	ck_assert_int_eq(state_get(st, "claims:/", "k000001", 7, get_copy, buf),
			 STATE_NOTFOUND);
	state_close(st);
}
END_TEST

START_TEST(test_bad_directory_is_an_error)
{
	struct state_settings set = {"/proc/acemq-no-such/dir", 1 << 20, 1};
	char err[256] = "";

	ck_assert_ptr_null(state_open(&set, err, sizeof(err)));
	ck_assert_msg(strstr(err, "/proc/acemq-no-such/dir") != NULL, "%s", err);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("state");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_write_read_and_group_commit);
	tcase_add_test(tc, test_full_map_fails_only_what_does_not_fit);
	tcase_add_test(tc, test_bad_directory_is_an_error);
	return unit_run("state", tc, 0);
}
