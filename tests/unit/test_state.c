/* test_state: the state layer over a real LMDB environment: writes reported
 * on the worker's loop once durable, group commit, reads and scans, a full
 * map failing only the writes that do not fit, persistence across a
 * reopen, writes after close refused, and the pipelined sync: commits go on
 * while a sync runs, no completion before the sync covering its commit, a
 * failed sync failing exactly the writes it covered; the data file kept
 * zero-filled ahead of the pages in use, never past the map. */
#include "tests/unit/unit.h"

#include "src/store/state.h"
#include "src/worker.h"

#include <check.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

static struct state *open_state_sync(uint64_t map, int sync)
{
	struct state_settings set = {tdir, map, sync};
	char err[256];
	struct state *st = state_open(&set, err, sizeof(err));

	ck_assert_msg(st != NULL, "%s", err);
	return st;
}

static struct state *open_state(uint64_t map)
{
	return open_state_sync(map, STATE_SYNC_PIPELINED);
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

static off_t data_file_size(void)
{
	char path[128];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/data.mdb", tdir);
	ck_assert_int_eq(stat(path, &sb), 0);
	return sb.st_size;
}

/* With a sync on, the data file stays zero-filled well past the pages in
 * use while it grows, and what was written reads back after a reopen. */
START_TEST(test_data_file_grown_ahead)
{
	static char val[1024];
	static struct req r[100];
	struct state_counters c;
	struct state *st;
	char buf[sizeof(val) + 1];
	int done = 0, i, round;

	memset(val, 'v', sizeof(val));
	st = open_state_sync(64 << 20, STATE_SYNC_SERIAL);
	for (round = 0; round < 60; round++) {
		for (i = 0; i < 100; i++) {
			req_init(&r[i], &done, "ahead", round * 100 + i, val, sizeof(val));
			state_submit(st, &r[i].w);
		}
		wait_done(&done, (round + 1) * 100);
		for (i = 0; i < 100; i++)
			ck_assert_int_eq(r[i].rc, STATE_OK);
		state_counters(st, &c);
		/* Looked at before each commit: at least half ahead then, less
		 * what one commit of 100 took. */
		ck_assert_msg(data_file_size() >= (off_t)c.used_bytes + STATE_GROW_AHEAD / 4,
			      "round %d: file %lld, used %llu", round,
			      (long long)data_file_size(), (unsigned long long)c.used_bytes);
		ck_assert_int_le(data_file_size(), (off_t)c.used_bytes + STATE_GROW_AHEAD);
	}
	ck_assert_uint_gt(c.used_bytes, 6u << 20); /* it grew past the first step */
	state_close(st);
	{
		/* Past the pages in use: zeros, nothing else. */
		char path[128], *rest;
		off_t len = data_file_size() - (off_t)c.used_bytes;
		FILE *f;
		off_t k;

		snprintf(path, sizeof(path), "%s/data.mdb", tdir);
		ck_assert_int_gt(len, 0);
		rest = malloc((size_t)len);
		f = fopen(path, "rb");
		ck_assert_ptr_nonnull(rest);
		ck_assert_ptr_nonnull(f);
		ck_assert_int_eq(fseeko(f, (off_t)c.used_bytes, SEEK_SET), 0);
		ck_assert_uint_eq(fread(rest, 1, (size_t)len, f), (size_t)len);
		for (k = 0; k < len; k++)
			ck_assert_msg(rest[k] == 0, "byte %lld past the pages in use",
				      (long long)k);
		fclose(f);
		free(rest);
	}

	st = open_state_sync(64 << 20, STATE_SYNC_SERIAL);
	for (i = 0; i < 6000; i += 599) {
		char key[32];

		snprintf(key, sizeof(key), "k%06d", i);
		ck_assert_int_eq(state_get(st, "ahead", key, strlen(key), get_copy, buf),
				 STATE_OK);
		ck_assert_int_eq(memcmp(buf, val, sizeof(val)), 0);
	}
	state_close(st);
}
END_TEST

START_TEST(test_data_file_not_grown_past_the_map)
{
	static struct req r[1];
	struct state *st;
	char path[128];
	int done = 0;

	/* No sync, nothing to gain: the file is LMDB's own size. */
	st = open_state_sync(64 << 20, STATE_SYNC_NONE);
	req_init(&r[0], &done, "ahead", 0, "small", 5);
	state_submit(st, &r[0].w);
	wait_done(&done, 1);
	ck_assert_int_lt(data_file_size(), 1 << 20);
	state_close(st);
	snprintf(path, sizeof(path), "%s/data.mdb", tdir);
	ck_assert_int_eq(unlink(path), 0);

	st = open_state_sync(1 << 20, STATE_SYNC_SERIAL);
	req_init(&r[0], &done, "ahead", 1, "small", 5);
	state_submit(st, &r[0].w);
	wait_done(&done, 2);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	ck_assert_int_eq(data_file_size(), 1 << 20);
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

/* A sync hook that holds the sync thread until released, then returns the
 * error it was given (0: the real sync runs). */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int entered; /* syncs that reached the hook */
	int open;    /* syncs let through */
	int fail;    /* errno for the next sync let through, then 0 */
};

static struct gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
static struct gate cgate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static int gate_hook(void *arg)
{
	struct gate *g = arg;
	int rc, me;

	pthread_mutex_lock(&g->lock);
	me = g->entered++;
	pthread_cond_broadcast(&g->cond);
	while (g->open <= me)
		pthread_cond_wait(&g->cond, &g->lock);
	rc = g->fail;
	g->fail = 0;
	pthread_mutex_unlock(&g->lock);
	return rc;
}

static void gate_reset(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->entered = g->open = g->fail = 0;
	pthread_mutex_unlock(&g->lock);
}

static int gate_entered(struct gate *g)
{
	int n;

	pthread_mutex_lock(&g->lock);
	n = g->entered;
	pthread_mutex_unlock(&g->lock);
	return n;
}

/* Wait (at most 10 s) until n callers have reached the hook. */
static void gate_wait_entered(struct gate *g, int n)
{
	struct timespec until;
	int entered;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&g->lock);
	while (g->entered < n &&
	       pthread_cond_timedwait(&g->cond, &g->lock, &until) != ETIMEDOUT)
		;
	entered = g->entered;
	pthread_mutex_unlock(&g->lock);
	ck_assert_int_ge(entered, n);
}

/* Let the next caller through, failing with err (0: it succeeds). */
static void gate_release(struct gate *g, int err)
{
	pthread_mutex_lock(&g->lock);
	g->fail = err;
	g->open++;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

/* Run the loop for a while: what should not arrive has had its chance. */
static void pump(int ms)
{
	int i;

	for (i = 0; i < ms; i++) {
		event_base_loop(tw.base, EVLOOP_NONBLOCK);
		worker_run_posted(&tw);
		usleep(1000);
	}
}

/* Until the writer has committed n writes in all: committed writes are
 * counted where they are handed to the sync thread, under the same lock,
 * so all of them wait for the next sync. */
static void wait_writes(struct state *st, uint64_t n)
{
	struct state_counters c;
	int spins = 0;

	for (;;) {
		state_counters(st, &c);
		if (c.writes >= n || spins++ >= 5000)
			break;
		usleep(1000);
	}
	ck_assert_uint_eq(c.writes, n);
}

/* Submit writes first..last-1 (keys k<i>) from this thread. */
static void submit(struct state *st, struct req *r, int *done, int first, int last)
{
	int i;

	for (i = first; i < last; i++) {
		req_init(&r[i], done, "claims:/", i, "value", 5);
		state_submit(st, &r[i].w);
	}
	pump(1); /* a turn's writes go to the writer */
}

START_TEST(test_completions_wait_for_the_sync_covering_them)
{
	struct state *st = open_state(64 << 20);
	static struct req r[50];
	struct state_counters c;
	char buf[64];
	int done = 0, i;

	gate_reset(&gate);
	state_test_sync_hook(st, gate_hook, &gate);
	/* One write, and the sync covering it held. */
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&gate, 1);
	/* The next writes commit while that sync is held (readers see them)
	 * and wait for a sync of their own; nothing completes meanwhile. */
	submit(st, r, &done, 1, 50);
	wait_writes(st, 50);
	ck_assert_int_eq(state_get(st, "claims:/", "k000049", 7, get_copy, buf), STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_ge(c.commits, 2);
	ck_assert_uint_eq(c.syncs, 0);
	pump(200);
	ck_assert_int_eq(done, 0);
	/* The first sync, once done, reports only the write it covered. */
	gate_release(&gate, 0);
	wait_done(&done, 1);
	gate_wait_entered(&gate, 2);
	pump(100);
	ck_assert_int_eq(done, 1);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	/* The second covers the rest. */
	gate_release(&gate, 0);
	wait_done(&done, 50);
	for (i = 0; i < 50; i++)
		ck_assert_int_eq(r[i].rc, STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_eq(c.syncs, 2);
	ck_assert_uint_eq(c.synced_writes, 50);
	state_test_sync_hook(st, NULL, NULL);
	state_close(st);
}
END_TEST

START_TEST(test_failed_sync_fails_every_write_it_covered)
{
	struct state *st = open_state(64 << 20);
	static struct req r[61];
	struct state_counters c;
	int done = 0, i;

	gate_reset(&gate);
	state_test_sync_hook(st, gate_hook, &gate);
	/* Sync 1 covers write 0 (held); writes 1-40 commit meanwhile, so sync
	 * 2 covers exactly them; 41-60 commit while sync 2 is held. */
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&gate, 1);
	submit(st, r, &done, 1, 41);
	wait_writes(st, 41);
	gate_release(&gate, 0);
	wait_done(&done, 1);
	gate_wait_entered(&gate, 2);
	submit(st, r, &done, 41, 61);
	wait_writes(st, 61);
	/* Sync 2 fails: every write it covered fails, and only those. */
	gate_release(&gate, EIO);
	wait_done(&done, 41);
	for (i = 1; i < 41; i++)
		ck_assert_int_eq(r[i].rc, STATE_IO);
	gate_wait_entered(&gate, 3);
	pump(100);
	ck_assert_int_eq(done, 41);
	gate_release(&gate, 0);
	wait_done(&done, 61);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	for (i = 41; i < 61; i++)
		ck_assert_int_eq(r[i].rc, STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_eq(c.write_errors, 40);
	ck_assert_uint_eq(c.syncs, 3);
	/* A full disk on sync is reported as such. */
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&gate, 4);
	gate_release(&gate, ENOSPC);
	wait_done(&done, 62);
	ck_assert_int_eq(r[0].rc, STATE_FULL);
	state_test_sync_hook(st, NULL, NULL);
	state_close(st);
}
END_TEST

/* Without a sync (state_sync=0) the hook never runs and writes complete,
 * counted, with no sync counted. */
START_TEST(test_sync_off)
{
	static struct req r[20];
	struct state_counters c;
	struct state *st;
	char buf[64];
	int done = 0, i;

	st = open_state_sync(64 << 20, STATE_SYNC_NONE);
	gate_reset(&gate);
	state_test_sync_hook(st, gate_hook, &gate);
	for (i = 0; i < 20; i++) {
		req_init(&r[i], &done, "claims:/", i, "value", 5);
		state_submit(st, &r[i].w);
	}
	wait_done(&done, 20);
	for (i = 0; i < 20; i++)
		ck_assert_int_eq(r[i].rc, STATE_OK);
	ck_assert_int_eq(gate_entered(&gate), 0);
	state_counters(st, &c);
	ck_assert_uint_eq(c.writes, 20);
	ck_assert_uint_eq(c.syncs, 0);
	ck_assert_uint_eq(c.synced_writes, 0);
	state_close(st);
	st = open_state(64 << 20);
	ck_assert_int_eq(state_get(st, "claims:/", "k000019", 7, get_copy, buf), STATE_OK);
	state_close(st);
}
END_TEST

/* state_sync=2: a commit's meta page is not synced by LMDB, so its writes
 * complete only after a later fsync: with nothing else queued, the
 * writer's own sync (held here: the write is committed, readers see it,
 * and it does not complete); a failed sync fails what it covered. */
START_TEST(test_serial_completion_waits_for_the_meta_sync)
{
	struct state *st = open_state_sync(64 << 20, STATE_SYNC_SERIAL);
	static struct req r[2];
	struct state_counters c;
	char buf[64];
	int done = 0;

	gate_reset(&gate);
	state_test_sync_hook(st, gate_hook, &gate);
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&gate, 1);
	ck_assert_int_eq(state_get(st, "claims:/", "k000000", 7, get_copy, buf), STATE_OK);
	pump(200);
	ck_assert_int_eq(done, 0);
	gate_release(&gate, 0);
	wait_done(&done, 1);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	/* Committed, but the sync that was to make it durable failed. */
	submit(st, r, &done, 1, 2);
	gate_wait_entered(&gate, 2);
	pump(100);
	ck_assert_int_eq(done, 1);
	gate_release(&gate, EIO);
	wait_done(&done, 2);
	ck_assert_int_eq(r[1].rc, STATE_IO);
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&gate, 3);
	gate_release(&gate, ENOSPC);
	wait_done(&done, 3);
	ck_assert_int_eq(r[0].rc, STATE_FULL);
	state_counters(st, &c);
	ck_assert_uint_eq(c.commits, 3);
	ck_assert_uint_eq(c.syncs, 3);
	ck_assert_uint_eq(c.synced_writes, 3);
	ck_assert_uint_eq(c.write_errors, 2);
	state_test_sync_hook(st, NULL, NULL);
	state_close(st);
}
END_TEST

/* state_sync=2 under load: the next commit's fsync covers the meta page
 * of the one before, whose writes complete then, with no sync of their
 * own; only the last commit, with nothing behind it, has one. */
START_TEST(test_serial_next_commit_covers_the_one_before)
{
	struct state *st = open_state_sync(64 << 20, STATE_SYNC_SERIAL);
	static struct req r[10];
	struct state_counters c;
	int done = 0, i;

	gate_reset(&gate);
	gate_reset(&cgate);
	state_test_sync_hook(st, gate_hook, &gate);
	state_test_commit_hook(st, gate_hook, &cgate);
	submit(st, r, &done, 0, 1);
	gate_wait_entered(&cgate, 1);
	submit(st, r, &done, 1, 10); /* queued behind the first commit */
	gate_release(&cgate, 0);
	/* The first commit is done; the second is held before it starts:
	 * the first's writes wait for an fsync. */
	gate_wait_entered(&cgate, 2);
	pump(200);
	ck_assert_int_eq(done, 0);
	gate_release(&cgate, 0);
	/* The second commit's writes wait for the writer's own sync (held);
	 * the first's completed without it. */
	gate_wait_entered(&gate, 1);
	wait_done(&done, 1);
	pump(100);
	ck_assert_int_eq(done, 1);
	ck_assert_int_eq(r[0].rc, STATE_OK);
	gate_release(&gate, 0);
	wait_done(&done, 10);
	for (i = 0; i < 10; i++)
		ck_assert_int_eq(r[i].rc, STATE_OK);
	state_counters(st, &c);
	ck_assert_uint_eq(c.commits, 2);
	ck_assert_uint_eq(c.syncs, 2); /* the second commit's, and the writer's */
	ck_assert_uint_eq(c.synced_writes, 10);
	ck_assert_int_eq(gate_entered(&gate), 1);
	state_test_sync_hook(st, NULL, NULL);
	state_test_commit_hook(st, NULL, NULL);
	state_close(st);
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
	tcase_add_test(tc, test_data_file_grown_ahead);
	tcase_add_test(tc, test_data_file_not_grown_past_the_map);
	tcase_add_test(tc, test_completions_wait_for_the_sync_covering_them);
	tcase_add_test(tc, test_failed_sync_fails_every_write_it_covered);
	tcase_add_test(tc, test_sync_off);
	tcase_add_test(tc, test_serial_completion_waits_for_the_meta_sync);
	tcase_add_test(tc, test_serial_next_commit_covers_the_one_before);
	return unit_run("state", tc, 0);
}
