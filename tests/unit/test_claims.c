/* test_claims: the claim stores over a real LMDB environment and a real
 * directory: keys, uploads in pieces read back identical, a payload that
 * does not fit failing without leaving a part behind, an abandoned upload
 * cleaned away, a missing key, the filesystem store's all-or-nothing file,
 * and its files written and read past the page cache (O_DIRECT) whatever
 * the payload's size against the filesystem's blocks. */
#define _GNU_SOURCE /* O_DIRECT */
#include "tests/unit/unit.h"

#include "src/jobs.h"
#include "src/rules.h"
#include "src/store/claims.h"
#include "src/store/claims_buf.h"
#include "src/store/state.h"
#include "src/worker.h"

#include <check.h>
#include <dirent.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static struct worker tw;
static char tdir[64], fsdir[128];
static struct state *st;

struct probe {
	int done, rc, opened, open_rc, chunks, progress;
	uint64_t size;
	uint8_t *got;
	size_t len;
	struct claims_read *r;
	char key[CLAIMS_KEY_LEN + 1];
};

static void pump_until(int *flag)
{
	int spins = 0;

	while (!*flag && spins++ < 20000) {
		event_base_loop(tw.base, EVLOOP_NONBLOCK);
		worker_run_posted(&tw);
		usleep(200);
	}
	ck_assert_msg(*flag, "no completion");
}

static void pump_a_while(void)
{
	int i;

	for (i = 0; i < 200; i++) {
		event_base_loop(tw.base, EVLOOP_NONBLOCK);
		worker_run_posted(&tw);
		usleep(1000);
	}
}

static void on_progress(void *arg)
{
	((struct probe *)arg)->progress++;
}

static void on_done(void *arg, int rc)
{
	struct probe *p = arg;

	p->done = 1;
	p->rc = rc;
}

static void on_opened(void *arg, int rc, uint64_t size)
{
	struct probe *p = arg;

	p->open_rc = rc;
	p->size = size;
	if (rc == 0)
		claims_read_next(p->r);
	else
		p->opened = 1;
}

static void on_chunk(void *arg, int rc, const uint8_t *data, size_t len)
{
	struct probe *p = arg;

	ck_assert_int_eq(rc, 0);
	if (len == 0) {
		p->opened = 1;
		return;
	}
	p->got = realloc(p->got, p->len + len);
	memcpy(p->got + p->len, data, len);
	p->len += len;
	p->chunks++;
	claims_read_next(p->r);
}

static void setup_with(uint64_t map)
{
	struct state_settings set = {tdir, map, 1};
	char err[256];

	evthread_use_pthreads();
	snprintf(tdir, sizeof(tdir), "/tmp/acemq-test-claims-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	snprintf(fsdir, sizeof(fsdir), "%s/fs", tdir);
	ck_assert_int_eq(mkdir(fsdir, 0700), 0);
	ck_assert_int_eq(worker_init(&tw, 0), 0);
	ck_assert_int_eq(jobs_start(2), 0);
	st = state_open(&set, err, sizeof(err));
	ck_assert_msg(st != NULL, "%s", err);
	claims_init(st);
}

static void setup(void)
{
	setup_with(64 << 20);
}

static void setup_tiny(void)
{
	setup_with(1 << 20);
}

static void teardown(void)
{
	char cmd[128];

	jobs_stop();
	state_close(st);
	worker_run_posted(&tw);
	worker_fini(&tw);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

static void where(struct claims_where *w, int fs, const char *vhost)
{
	struct rules_claim_check cc = {0};

	cc.store = fs ? RULES_STORE_FILESYSTEM : RULES_STORE_LMDB;
	cc.store_path = fsdir;
	claims_where(w, vhost, &cc);
}

static uint8_t *pattern(size_t n)
{
	uint8_t *b = malloc(n);
	size_t i;

	for (i = 0; i < n; i++)
		b[i] = (uint8_t)(i * 31 + (i >> 11));
	return b;
}

/* Upload n bytes in uneven pieces; returns the probe (key filled). */
static void upload(struct claims_where *w, const uint8_t *data, size_t n, struct probe *p)
{
	struct claims_upload *u = claims_upload_begin(w, &tw, on_progress, on_done, p);
	size_t off = 0, step = 1;

	ck_assert_ptr_nonnull(u);
	snprintf(p->key, sizeof(p->key), "%s", claims_upload_key(u));
	ck_assert(claims_key_valid((const uint8_t *)p->key, strlen(p->key)));
	while (off < n) {
		size_t k = step < n - off ? step : n - off;

		claims_upload_write(u, data + off, k);
		off += k;
		step = step * 7 + 13;
		if (step > 300000)
			step = 1;
	}
	claims_upload_finish(u);
	pump_until(&p->done);
}

static void read_back(struct claims_where *w, const char *key, struct probe *p)
{
	p->r = claims_read_open(w, &tw, key, on_opened, on_chunk, p);
	ck_assert_ptr_nonnull(p->r);
	pump_until(&p->opened);
	claims_read_abandon(p->r);
}

static int count_keys(void *arg, const void *k, size_t klen, const void *v, size_t vlen)
{
	(*(int *)arg)++;
	return 0;
}

START_TEST(test_keys)
{
	ck_assert(claims_key_valid((const uint8_t *)"0123456789abcdef0123456789abcdef", 32));
	ck_assert(!claims_key_valid((const uint8_t *)"0123456789ABCDEF0123456789abcdef", 32));
	ck_assert(!claims_key_valid((const uint8_t *)"0123456789abcdef0123456789abcde", 31));
	ck_assert(!claims_key_valid((const uint8_t *)"../../etc/passwd", 16));
	ck_assert(!claims_key_valid((const uint8_t *)"../../etc/passwd../../etc/passwd", 32));
	ck_assert(!claims_key_valid((const uint8_t *)"", 0));
}
END_TEST

static void round_trip(int fs)
{
	struct claims_where w;
	size_t n = (5u << 20) / 2 + 3;
	uint8_t *data = pattern(n);
	struct probe up = {0}, rd = {0};

	where(&w, fs, "/");
	upload(&w, data, n, &up);
	ck_assert_int_eq(up.rc, 0);
	read_back(&w, up.key, &rd);
	ck_assert_int_eq(rd.open_rc, 0);
	ck_assert_uint_eq(rd.size, n);
	ck_assert_uint_eq(rd.len, n);
	ck_assert(memcmp(rd.got, data, n) == 0);
	ck_assert_int_ge(rd.chunks, fs ? 1 : 3); /* a file is read 4 MiB at a time */
	free(rd.got);
	free(data);
}

/* A reader that keeps each chunk's buffer (as the claim check hands it to
 * the client's output): none is reused while kept. */
struct keeper {
	struct claims_read *r;
	int opened, ended, kept_outside;
	int n;
	void *kept[16];
	const uint8_t *data[16];
	size_t len[16];
};

static void keeper_opened(void *arg, int rc, uint64_t size)
{
	struct keeper *k = arg;

	(void)size;
	ck_assert_int_eq(rc, 0);
	k->opened = 1;
	k->kept_outside = claims_read_keep(k->r) != NULL; /* not in a chunk callback */
	claims_read_next(k->r);
}

static void keeper_chunk(void *arg, int rc, const uint8_t *data, size_t len)
{
	struct keeper *k = arg;

	ck_assert_int_eq(rc, 0);
	if (len == 0) {
		k->ended = 1;
		return;
	}
	ck_assert_int_lt(k->n, 16);
	k->kept[k->n] = claims_read_keep(k->r);
	ck_assert_ptr_nonnull(k->kept[k->n]);
	ck_assert_ptr_null(claims_read_keep(k->r)); /* once */
	k->data[k->n] = data;
	k->len[k->n] = len;
	k->n++;
	claims_read_next(k->r);
}

static void kept_chunks(int fs)
{
	struct claims_where w;
	/* LMDB keeps a payload under 4 MiB itself, read 1 MiB at a time. */
	size_t n = fs ? (9u << 20) + 7 : (3u << 20) + 5, off = 0;
	uint8_t *data = pattern(n);
	struct probe up = {0};
	struct keeper k = {0};
	int i;

	where(&w, fs, "/");
	upload(&w, data, n, &up);
	ck_assert_int_eq(up.rc, 0);
	k.r = claims_read_open(&w, &tw, up.key, keeper_opened, keeper_chunk, &k);
	ck_assert_ptr_nonnull(k.r);
	pump_until(&k.ended);
	claims_read_abandon(k.r);
	ck_assert(!k.kept_outside);
	ck_assert_int_eq(k.n, fs ? 3 : 4); /* 4 MiB stages, 1 MiB chunks */
	/* Every kept chunk still holds what was read into it. */
	for (i = 0; i < k.n; i++) {
		ck_assert_uint_le(off + k.len[i], n);
		ck_assert(memcmp(k.data[i], data + off, k.len[i]) == 0);
		off += k.len[i];
		claims_kept_free(k.kept[i]);
	}
	ck_assert_uint_eq(off, n);
	free(data);
}

START_TEST(test_lmdb_chunks_kept)
{
	kept_chunks(0);
}
END_TEST

START_TEST(test_filesystem_chunks_kept)
{
	kept_chunks(1);
}
END_TEST

START_TEST(test_lmdb_round_trip)
{
	round_trip(0);
}
END_TEST

START_TEST(test_filesystem_round_trip)
{
	struct claims_where w;
	char path[256];
	FILE *f;
	size_t n = 100001;
	uint8_t *data = pattern(n), *file = malloc(n + 1);
	struct probe up = {0};
	struct dirent *e;
	DIR *d;

	round_trip(1);
	where(&w, 1, "/");
	upload(&w, data, n, &up);
	ck_assert_int_eq(up.rc, 0);
	/* Exactly the payload, under exactly the key. */
	snprintf(path, sizeof(path), "%s/%s", fsdir, up.key);
	f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fread(file, 1, n + 1, f), n);
	fclose(f);
	ck_assert(memcmp(file, data, n) == 0);
	/* No partial file is left. */
	d = opendir(fsdir);
	while ((e = readdir(d)) != NULL)
		ck_assert_msg(
		    strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
			claims_key_valid((const uint8_t *)e->d_name, strlen(e->d_name)),
		    "left %s", e->d_name);
	closedir(d);
	free(file);
	free(data);
}
END_TEST

/* Whether files in dir take O_DIRECT (not on tmpfs before Linux 6.6, nor
 * on some other filesystems): the store then uses the page cache. */
static int direct_io_works(const char *dir)
{
	char path[256];
	void *b = NULL;
	int fd, fl, ok;

	snprintf(path, sizeof(path), "%s/.probe", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	fl = fcntl(fd, F_GETFL);
	ck_assert_int_eq(posix_memalign(&b, 4096, 4096), 0);
	memset(b, 1, 4096);
	ok = fcntl(fd, F_SETFL, fl | O_DIRECT) == 0 && write(fd, b, 4096) == 4096;
	close(fd);
	unlink(path);
	free(b);
	return ok;
}

/* Pages of the file at path in the page cache. */
static size_t resident_pages(const char *path, size_t size)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = (size + (size_t)pg - 1) / (size_t)pg, i, in = 0;
	unsigned char *vec = malloc(n);
	int fd = open(path, O_RDONLY);
	void *m;

	ck_assert_int_ge(fd, 0);
	m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert(m != MAP_FAILED);
	ck_assert_int_eq(mincore(m, size, vec), 0);
	for (i = 0; i < n; i++)
		in += vec[i] & 1;
	munmap(m, size);
	close(fd);
	free(vec);
	return in;
}

/* Payloads on both sides of a block and of a stage (4 MiB, one write) come
 * back whole, in files of exactly their size; where the filesystem takes
 * O_DIRECT, neither the write nor the read leaves the payload in the page
 * cache (a truncated last block may be read in to be cut). */
START_TEST(test_filesystem_sizes_around_blocks)
{
	static const size_t sizes[] = {1,        4095,
				       4096,     4097,
				       65537,    (4u << 20) - 1,
				       4u << 20, (4u << 20) + 1,
				       3u << 20, (9u << 20) + 4097};
	int direct = direct_io_works(fsdir);
	struct claims_where w;
	size_t i;

	where(&w, 1, "/");
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		uint8_t *data = pattern(n);
		struct probe up = {0}, rd = {0};
		char path[256];
		struct stat sb;

		upload(&w, data, n, &up);
		ck_assert_int_eq(up.rc, 0);
		snprintf(path, sizeof(path), "%s/%s", fsdir, up.key);
		ck_assert_int_eq(stat(path, &sb), 0);
		ck_assert_uint_eq((uint64_t)sb.st_size, n);
		if (direct && n >= (1u << 20))
			ck_assert_uint_le(resident_pages(path, n), 2);
		read_back(&w, up.key, &rd);
		ck_assert_int_eq(rd.open_rc, 0);
		ck_assert_uint_eq(rd.len, n);
		ck_assert_msg(memcmp(rd.got, data, n) == 0, "%zu bytes read back differ", n);
		if (direct && n >= (1u << 20))
			ck_assert_uint_le(resident_pages(path, n), 2);
		free(rd.got);
		free(data);
	}
	if (!direct)
		fprintf(stderr, "test_claims: %s takes no O_DIRECT: the page cache path ran\n",
			fsdir);
}
END_TEST

/* Buffers are aligned for O_DIRECT, and the last two of a size let go
 * are the next ones handed out (no fresh pages to fault in). */
START_TEST(test_buffers_aligned_and_kept)
{
	uint8_t *a = claims_buf_new(CLAIMS_STAGE), *b = claims_buf_new(CLAIMS_STAGE);
	uint8_t *c = claims_buf_new(CLAIMS_STAGE), *r = claims_buf_new(CLAIMS_CHUNK);
	uint8_t *x, *y, *z, *kept[4];
	int i;

	/* What earlier tests of this process let go is taken out first. */
	for (i = 0; i < 4; i++)
		kept[i] = claims_buf_new(i < 2 ? CLAIMS_STAGE : CLAIMS_CHUNK);
	ck_assert(a && b && c && r);
	ck_assert_uint_eq((uintptr_t)a % CLAIMS_ALIGN, 0);
	ck_assert_uint_eq((uintptr_t)r % CLAIMS_ALIGN, 0);
	claims_buf_free(a, CLAIMS_STAGE);
	claims_buf_free(b, CLAIMS_STAGE);
	claims_buf_free(c, CLAIMS_STAGE); /* a third is freed */
	claims_buf_free(r, CLAIMS_CHUNK);
	claims_buf_free(NULL, CLAIMS_CHUNK);
	x = claims_buf_new(CLAIMS_STAGE);
	y = claims_buf_new(CLAIMS_STAGE);
	z = claims_buf_new(CLAIMS_CHUNK);
	ck_assert(x == b && y == a); /* the last let go first */
	ck_assert(z == r);
	claims_buf_free(x, CLAIMS_STAGE);
	claims_buf_free(y, CLAIMS_STAGE);
	claims_buf_free(z, CLAIMS_CHUNK);
	for (i = 0; i < 4; i++)
		claims_buf_free(kept[i], i < 2 ? CLAIMS_STAGE : CLAIMS_CHUNK);
}
END_TEST

/* Files in dir other than "." and "..": how many, and how many partial. */
static int files_in(const char *dir, int *partial)
{
	struct dirent *e;
	DIR *d = opendir(dir);
	int n = 0;

	*partial = 0;
	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		n++;
		*partial += strstr(e->d_name, ".partial") != NULL;
	}
	closedir(d);
	return n;
}

/* An LMDB store keeps a payload of CLAIMS_FILE_MIN or more in a file of its
 * own under data_dir/claims/ (the vhost's name in hex, or its SHA-256 when
 * long): nothing of it in LMDB, read back, its size and age looked up, an
 * abandoned one's partial file removed, and the retention purge removing
 * it. A smaller payload stays in LMDB. */
START_TEST(test_lmdb_large_payload_in_a_file)
{
	struct claims_where w, longw;
	size_t n = CLAIMS_FILE_MIN + 12345;
	uint8_t *data = pattern(n);
	struct probe up = {0}, rd = {0}, small = {0}, ab = {0}, lp = {0};
	struct claims_purged purged = {0};
	struct claims_upload *u;
	char dir[256], path[512], vh[64];
	struct timeval old[2];
	uint64_t size, created;
	struct stat sb;
	int keys = 0, partial;

	where(&w, 0, "/");
	snprintf(dir, sizeof(dir), "%s/claims/2f", tdir);
	ck_assert_str_eq(w.files, dir);
	ck_assert_int_eq(stat(dir, &sb), -1); /* made by the first large payload */
	upload(&w, data, n, &up);
	ck_assert_int_eq(up.rc, 0);
	snprintf(path, sizeof(path), "%s/%s", dir, up.key);
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_uint_eq((uint64_t)sb.st_size, n);
	ck_assert_int_eq(state_scan(st, w.name, NULL, 0, count_keys, &keys), STATE_OK);
	ck_assert_int_eq(keys, 0);
	read_back(&w, up.key, &rd);
	ck_assert_int_eq(rd.open_rc, 0);
	ck_assert_uint_eq(rd.len, n);
	ck_assert(memcmp(rd.got, data, n) == 0);
	ck_assert_int_eq(claims_stat(&w, up.key, &size, &created), 0);
	ck_assert_uint_eq(size, n);
	/* A small one stays in LMDB. */
	upload(&w, data, 100000, &small);
	ck_assert_int_eq(small.rc, 0);
	ck_assert_int_eq(state_scan(st, w.name, NULL, 0, count_keys, &keys), STATE_OK);
	ck_assert_int_gt(keys, 0);
	ck_assert_int_eq(files_in(dir, &partial), 1);
	/* A large upload abandoned half way leaves no partial file. */
	u = claims_upload_begin(&w, &tw, on_progress, on_done, &ab);
	claims_upload_write(u, data, CLAIMS_FILE_MIN + 1);
	pump_a_while();
	ck_assert_int_eq(files_in(dir, &partial), 2);
	ck_assert_int_eq(partial, 1);
	claims_upload_abandon(u);
	pump_a_while();
	ck_assert_int_eq(files_in(dir, &partial), 1);
	/* Past the retention, the purge removes it. */
	old[0].tv_sec = old[1].tv_sec = time(NULL) - 7200;
	old[0].tv_usec = old[1].tv_usec = 0;
	ck_assert_int_eq(utimes(path, old), 0);
	ck_assert_int_eq(claims_purge(&w, 3600, 0, &purged), 0);
	ck_assert_int_ge(purged.payloads, 1);
	ck_assert_int_eq(stat(path, &sb), -1);
	ck_assert_int_eq(claims_stat(&w, up.key, &size, &created), 1);
	ck_assert_int_eq(claims_stat(&w, small.key, &size, &created), 0);
	/* A long vhost name: its SHA-256. */
	memset(vh, 'v', 40);
	vh[40] = '\0';
	where(&longw, 0, vh);
	ck_assert_ptr_nonnull(strstr(longw.files, "/claims/sha-"));
	ck_assert_uint_eq(strlen(strstr(longw.files, "/claims/sha-")), 12 + 64);
	upload(&longw, data, n, &lp);
	ck_assert_int_eq(lp.rc, 0);
	ck_assert_int_eq(files_in(longw.files, &partial), 1);
	free(rd.got);
	free(data);
}
END_TEST

START_TEST(test_missing_key_and_other_vhost)
{
	struct claims_where w, other;
	uint8_t data[10] = "0123456789";
	struct probe up = {0}, rd = {0}, rd2 = {0}, rd3 = {0};

	where(&w, 0, "a");
	where(&other, 0, "b");
	upload(&w, data, sizeof(data), &up);
	ck_assert_int_eq(up.rc, 0);
	read_back(&w, "0123456789abcdef0123456789abcdef", &rd);
	ck_assert_int_eq(rd.open_rc, 1);
	/* A key of vhost a names nothing in vhost b. */
	read_back(&other, up.key, &rd2);
	ck_assert_int_eq(rd2.open_rc, 1);
	read_back(&w, up.key, &rd3);
	ck_assert_int_eq(rd3.open_rc, 0);
	ck_assert_uint_eq(rd3.len, sizeof(data));
	free(rd3.got);
}
END_TEST

START_TEST(test_full_store_leaves_nothing)
{
	struct claims_where w;
	size_t n = (4u << 20) - 1; /* under CLAIMS_FILE_MIN: for LMDB */
	uint8_t *data = pattern(n);
	struct probe up = {0}, rd = {0}, ok = {0};
	int keys = 0;
	uint64_t size, created;

	where(&w, 0, "/");
	upload(&w, data, n, &up);
	ck_assert_int_lt(up.rc, 0);
	pump_a_while(); /* the cleanup of what did fit */
	ck_assert_int_eq(claims_stat(&w, up.key, &size, &created), 1);
	read_back(&w, up.key, &rd);
	ck_assert_int_eq(rd.open_rc, 1);
	ck_assert_int_eq(state_scan(st, w.name, NULL, 0, count_keys, &keys), STATE_OK);
	ck_assert_int_eq(keys, 0);
	/* A payload that fits still goes in. */
	upload(&w, data, 1000, &ok);
	ck_assert_int_eq(ok.rc, 0);
	ck_assert_int_eq(claims_stat(&w, ok.key, &size, &created), 0);
	ck_assert_uint_eq(size, 1000);
	free(data);
}
END_TEST

START_TEST(test_abandoned_upload_cleaned)
{
	struct claims_where w;
	size_t n = 3u << 20;
	uint8_t *data = pattern(n);
	struct probe p = {0};
	struct claims_upload *u;
	int keys = 0;

	where(&w, 0, "/");
	u = claims_upload_begin(&w, &tw, on_progress, on_done, &p);
	claims_upload_write(u, data, n); /* three chunks handed over */
	claims_upload_abandon(u);        /* the client vanished */
	pump_a_while();
	ck_assert_int_eq(p.done, 0); /* no callback after abandon */
	ck_assert_int_eq(state_scan(st, w.name, NULL, 0, count_keys, &keys), STATE_OK);
	ck_assert_int_eq(keys, 0);
	free(data);
}
END_TEST

START_TEST(test_purge_removes_crash_leftovers)
{
	struct claims_where w;
	struct probe kept = {0}, rd = {0};
	uint8_t data[5000];
	struct state_op op = {0};
	struct claims_purged purged;
	char chunk[64];
	int keys = 0;

	memset(data, 7, sizeof(data));
	where(&w, 0, "/");
	upload(&w, data, sizeof(data), &kept);
	ck_assert_int_eq(kept.rc, 0);
	/* A chunk without its meta record: what a crash mid-upload leaves. */
	snprintf(chunk, sizeof(chunk), "%s#00000000", "00112233445566778899aabbccddeeff");
	op.db = w.name;
	op.key = chunk;
	op.klen = strlen(chunk);
	op.val = data;
	op.vlen = 100;
	ck_assert_int_eq(state_write_wait(st, &op, 1), STATE_OK);
	/* Retention 0 keeps payloads; orphans go, and are counted. */
	ck_assert_int_eq(claims_purge(&w, 0, 1, &purged), 0);
	ck_assert_int_eq(purged.payloads, 0);
	ck_assert_int_eq(purged.partial, 1);
	ck_assert_uint_eq(purged.partial_bytes, 100);
	ck_assert_int_eq(state_scan(st, w.name, NULL, 0, count_keys, &keys), STATE_OK);
	ck_assert_int_eq(keys, 2); /* the kept payload's meta and chunk */
	read_back(&w, kept.key, &rd);
	ck_assert_int_eq(rd.open_rc, 0);
	ck_assert_uint_eq(rd.len, sizeof(data));
	free(rd.got);
}
END_TEST

START_TEST(test_filesystem_bad_directory)
{
	struct claims_where w;
	struct probe up = {0};
	uint8_t data[100] = {0};

	where(&w, 1, "/");
	snprintf(w.name, sizeof(w.name), "%s/no-such-dir", fsdir);
	upload(&w, data, sizeof(data), &up);
	ck_assert_int_lt(up.rc, 0);
}
END_TEST

int main(void)
{
	TCase *tc = tcase_create("claims"), *tiny = tcase_create("claims-tiny-map");
	Suite *s = suite_create("claims");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_keys);
	tcase_add_test(tc, test_buffers_aligned_and_kept);
	tcase_add_test(tc, test_lmdb_round_trip);
	tcase_add_test(tc, test_lmdb_large_payload_in_a_file);
	tcase_add_test(tc, test_filesystem_round_trip);
	tcase_add_test(tc, test_lmdb_chunks_kept);
	tcase_add_test(tc, test_filesystem_chunks_kept);
	tcase_add_test(tc, test_filesystem_sizes_around_blocks);
	tcase_add_test(tc, test_missing_key_and_other_vhost);
	tcase_add_test(tc, test_abandoned_upload_cleaned);
	tcase_add_test(tc, test_filesystem_bad_directory);
	tcase_add_test(tc, test_purge_removes_crash_leftovers);
	tcase_add_checked_fixture(tiny, setup_tiny, teardown);
	tcase_set_timeout(tiny, 60);
	tcase_add_test(tiny, test_full_store_leaves_nothing);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, tiny);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
