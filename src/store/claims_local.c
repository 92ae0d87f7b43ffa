/* claims_local: the claim store backends on this host: LMDB (the state
 * layer) and a filesystem directory, written and read in chunks off the
 * workers' loops. */
#define _GNU_SOURCE /* O_DIRECT */
#include "claims_local.h"
#include "claims_backend.h"
#include "claims_buf.h"

#include "../debug.h"
#include "../jobs.h"
#include "../log.h"
#include "../rules.h"
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An LMDB store's payload goes to a file once it fills a stage. */
_Static_assert(CLAIMS_FILE_MIN == CLAIMS_STAGE, "the file threshold is one stage");

static atomic_ullong claims_lanes;

static void claims_chunk_key(char out[CLAIMS_CHUNK_KEY + 1], const char *key, uint32_t i)
{
	snprintf(out, CLAIMS_CHUNK_KEY + 1, "%s#%08x", key, i);
}

static void claims_path(char *out, size_t len, const struct claims_where *w, const char *key,
			int tmp)
{
	snprintf(out, len, tmp ? "%s/.%s.partial" : "%s/%s", w->name, key);
}

/* The filesystem store reads and writes its files with O_DIRECT where the
 * filesystem allows it: a payload goes between the proxy's buffer and the
 * disk without a copy through the page cache (which cost more CPU than
 * anything else the claim check does; docs/performance.md). Buffers
 * (claims_buf.h), offsets and lengths are then multiples of CLAIMS_ALIGN;
 * a file's last block is written whole and the file cut to its size. A
 * filesystem that refuses O_DIRECT (tmpfs before Linux 6.6, some network
 * ones) is written through the page cache. */

/* O_DIRECT on fd turned on (1 if the filesystem took it) or off. */
static int claims_fs_direct(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);

	return fl >= 0 && fcntl(fd, F_SETFL, on ? fl | O_DIRECT : fl & ~O_DIRECT) == 0 && on;
}

/* fsync a directory: its entries made durable. 0, or -1. */
static int claims_fs_sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	if (fd < 0)
		return -1;
	rc = fsync(fd);
	close(fd);
	return rc == 0 ? 0 : -1;
}

/* An LMDB store's directory for large payloads (data_dir/claims/X), made
 * with its parent, each made durable in the directory above it. */
static int claims_fs_mkdirs(const char *dir)
{
	char path[sizeof(((struct claims_where *)0)->files)], *last, *mid;
	int rc = 0;

	snprintf(path, sizeof(path), "%s", dir);
	if ((last = strrchr(path, '/')) == NULL)
		return -1;
	*last = '\0'; /* data_dir/claims */
	if ((mid = strrchr(path, '/')) == NULL)
		return -1;
	if (mkdir(path, 0750) != 0 && errno != EEXIST)
		return -1;
	*mid = '\0';
	rc |= claims_fs_sync_dir(path); /* data_dir */
	*mid = '/';
	*last = '/';
	if (mkdir(path, 0750) != 0 && errno != EEXIST)
		return -1;
	*last = '\0';
	rc |= claims_fs_sync_dir(path); /* data_dir/claims */
	return rc;
}

/* ---- uploads -------------------------------------------------------- */

enum claims_req_kind { CLAIMS_CHUNK_REQ, CLAIMS_FINISH_REQ, CLAIMS_CLEANUP_REQ };

struct claims_local_upload {
	struct claims_upload head; /* key, callbacks */
	struct claims_where where;
	struct worker *w;
	uint8_t *buf; /* the chunk being filled */
	size_t used;
	uint32_t nchunks; /* chunks handed to the store */
	uint64_t size;
	size_t pending;
	int inflight;
	int fd;     /* filesystem: only touched on the upload's jobs lane */
	int direct; /* ... and so is this: fd is O_DIRECT */
	uint64_t lane;
	unsigned abandoned : 1, failed : 1, finishing : 1, durable : 1, cleaning : 1;
	unsigned submitted : 1; /* something may be in the store */
	unsigned calling : 1;   /* inside a callback: abandon only marks */
	int lane_failed;        /* filesystem: set and read on the lane only */
	/* An LMDB store's large payload, whose directory the lane makes: set
	 * before the first job, then only read there (not a bit beside those
	 * the worker changes meanwhile). */
	int own_dir;
};

/* One store operation of an upload: a state write (LMDB) or a job
 * (filesystem); either way the worker_call comes first. */
struct claims_req {
	union {
		struct state_write sw;
		struct job job;
	} u;
	struct claims_local_upload *up;
	enum claims_req_kind kind;
	uint8_t *buf; /* CLAIMS_STAGE bytes, CLAIMS_ALIGN aligned */
	size_t len;
	uint64_t total; /* finish: the payload's size */
	uint32_t index;
	int rc;
	struct state_op *ops;
	char (*keys)[CLAIMS_CHUNK_KEY + 1];
	uint8_t meta[CLAIMS_META_LEN];
};

static void claims_upload_submit(struct claims_local_upload *u, enum claims_req_kind kind);

static void claims_upload_free(struct claims_local_upload *u)
{
	claims_active_remove(u->head.key);
	claims_buf_free(u->buf, CLAIMS_STAGE);
	free(u);
}

/* The one place an upload is freed: once nothing is out and its owner has
 * let go (abandoned) or heard the end (done), after a partial payload is
 * cleaned away. */
static void claims_upload_settle(struct claims_local_upload *u)
{
	if (u->inflight > 0 || u->calling)
		return;
	if (!u->abandoned && !(u->finishing && u->head.done == NULL))
		return;
	if (!u->durable && !u->cleaning && u->submitted) {
		u->cleaning = 1;
		claims_upload_submit(u, CLAIMS_CLEANUP_REQ);
		return;
	}
	claims_upload_free(u);
}

static void claims_req_done(struct worker_call *c)
{
	struct claims_req *r = (struct claims_req *)c;
	struct claims_local_upload *u = r->up;
	int rc = u->where.type == CLAIMS_FILESYSTEM ? r->rc : r->u.sw.rc;

	claims_busy_add(-1);
	ACEMQ_ASSERT(u->inflight > 0);
	u->inflight--;
	if (r->kind != CLAIMS_CLEANUP_REQ) {
		ACEMQ_ASSERT(r->len <= u->pending);
		u->pending -= r->len;
		if (rc < 0 && !u->failed) {
			u->failed = 1;
			log_error("claims: storing %s in %s failed: %s", u->head.key,
				  u->where.name,
				  rc == STATE_FULL ? "the store is full" : "an I/O error");
		}
	}
	if (r->kind == CLAIMS_FINISH_REQ && rc == 0 && !u->failed)
		u->durable = 1;
	claims_buf_free(r->buf, CLAIMS_STAGE);
	free(r->ops);
	free(r->keys);
	free(r);
	u->calling = 1;
	if (!u->abandoned && u->head.progress && !u->finishing)
		u->head.progress(u->head.arg);
	if (!u->abandoned && u->finishing && u->inflight == 0 && !u->cleaning && u->head.done) {
		void (*done)(void *, int) = u->head.done;

		u->head.done = NULL;
		done(u->head.arg, u->durable ? 0 : -1);
	}
	u->calling = 0;
	claims_upload_settle(u);
}

/* Filesystem operations, on the upload's jobs lane. */
static int claims_fs_write_all(struct claims_local_upload *u, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t k = write(u->fd, p, n);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && u->direct) {
				claims_fs_direct(u->fd, 0);
				u->direct = 0;
				continue;
			}
			return errno == ENOSPC || errno == EDQUOT ? STATE_FULL : STATE_IO;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The request's bytes; O_DIRECT writes the last block whole (zeros after
 * the payload, in the stage's room) and the file is then cut to size. */
static int claims_fs_write(struct claims_local_upload *u, struct claims_req *r)
{
	size_t len = r->len, whole = (len + CLAIMS_ALIGN - 1) & ~(size_t)(CLAIMS_ALIGN - 1);
	int rc;

	if (!u->direct || whole == len)
		return claims_fs_write_all(u, r->buf, len);
	/* Only a finishing request is short of a whole stage. */
	ACEMQ_ASSERT(r->kind == CLAIMS_FINISH_REQ && whole <= CLAIMS_STAGE);
	memset(r->buf + len, 0, whole - len);
	rc = claims_fs_write_all(u, r->buf, whole);
	if (rc == 0 && ftruncate(u->fd, (off_t)r->total) != 0)
		rc = STATE_IO;
	return rc;
}

static void claims_fs_run(struct job *j)
{
	struct claims_req *r = (struct claims_req *)j;
	struct claims_local_upload *u = r->up;
	char tmp[4200], final[4200];

	claims_path(tmp, sizeof(tmp), &u->where, u->head.key, 1);
	claims_path(final, sizeof(final), &u->where, u->head.key, 0);
	r->rc = 0;
	if (r->kind == CLAIMS_CLEANUP_REQ) {
		if (u->fd >= 0)
			close(u->fd);
		u->fd = -1;
		unlink(tmp);
		unlink(final); /* renamed, but not known durable */
		return;
	}
	if (u->lane_failed) {
		r->rc = u->lane_failed;
		return;
	}
	if (u->fd < 0) {
		u->fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
		if (u->fd < 0 && errno == ENOENT && u->own_dir &&
		    claims_fs_mkdirs(u->where.name) == 0)
			u->fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
		if (u->fd < 0) {
			r->rc = errno == ENOSPC || errno == EDQUOT ? STATE_FULL : STATE_IO;
			return;
		}
		u->direct = claims_fs_direct(u->fd, 1);
	}
	if (r->len)
		r->rc = claims_fs_write(u, r);
	if (r->rc != 0)
		u->lane_failed = r->rc;
	if (r->rc != 0 || r->kind != CLAIMS_FINISH_REQ)
		return;
	/* All or nothing for a reader: the whole file, synced, then renamed,
	 * then the directory synced. */
	if (fsync(u->fd) != 0 || close(u->fd) != 0) {
		u->fd = -1;
		r->rc = errno == ENOSPC || errno == EDQUOT ? STATE_FULL : STATE_IO;
		return;
	}
	u->fd = -1;
	if (rename(tmp, final) != 0) {
		r->rc = STATE_IO;
		return;
	}
	if (claims_fs_sync_dir(u->where.name) != 0)
		r->rc = STATE_IO;
}

static void claims_upload_submit(struct claims_local_upload *u, enum claims_req_kind kind)
{
	struct claims_req *r = calloc(1, sizeof(*r));
	uint32_t i, n = 0;

	if (r == NULL) {
		u->failed = 1;
		return;
	}
	r->up = u;
	r->kind = kind;
	/* An LMDB store's payload that fills a stage is a large one: it goes
	 * to a file of its own, before anything of it is in LMDB. */
	if (kind == CLAIMS_CHUNK_REQ && !u->submitted && u->where.type == CLAIMS_LMDB &&
	    u->where.files[0]) {
		u->where.type = CLAIMS_FILESYSTEM;
		memcpy(u->where.name, u->where.files, sizeof(u->where.name));
		u->own_dir = 1;
	}
	if (kind != CLAIMS_CLEANUP_REQ)
		u->submitted = 1;
	if (kind != CLAIMS_CLEANUP_REQ && (u->used > 0 || kind == CLAIMS_CHUNK_REQ)) {
		r->buf = u->buf;
		r->len = u->used;
		r->total = u->size;
		r->index = u->nchunks;
		u->nchunks += (uint32_t)((u->used + CLAIMS_CHUNK - 1) / CLAIMS_CHUNK);
		u->buf = NULL;
		u->used = 0;
		u->pending += r->len;
	}
	u->inflight++;
	claims_busy_add(1);
	r->u.sw.call.fn = claims_req_done;
	if (u->where.type == CLAIMS_FILESYSTEM) {
		r->u.job.run = claims_fs_run;
		r->u.job.w = u->w;
		r->u.job.lane = u->lane;
		jobs_submit(&r->u.job);
		return;
	}
	/* LMDB: chunks; the last chunks and the meta record; or removal. */
	n = kind == CLAIMS_CLEANUP_REQ ? u->nchunks + 1 : CLAIMS_STAGE_CHUNKS + 1;
	r->ops = calloc(n, sizeof(*r->ops));
	r->keys = calloc(n, sizeof(*r->keys));
	if (r->ops == NULL || r->keys == NULL) {
		r->u.sw.w = u->w;
		r->u.sw.rc = STATE_IO;
		worker_post(u->w, &r->u.sw.call);
		return;
	}
	n = 0;
	if (kind == CLAIMS_CLEANUP_REQ) {
		for (i = 0; i < u->nchunks; i++) {
			claims_chunk_key(r->keys[n], u->head.key, i);
			r->ops[n].db = u->where.name;
			r->ops[n].key = r->keys[n];
			r->ops[n].klen = CLAIMS_CHUNK_KEY;
			n++;
		}
		memcpy(r->keys[n], u->head.key, CLAIMS_KEY_LEN);
		r->ops[n].db = u->where.name;
		r->ops[n].key = r->keys[n];
		r->ops[n].klen = CLAIMS_KEY_LEN;
		n++;
	} else {
		for (i = 0; r->buf && (size_t)i * CLAIMS_CHUNK < r->len; i++) {
			size_t off = (size_t)i * CLAIMS_CHUNK, len = r->len - off;

			claims_chunk_key(r->keys[n], u->head.key, r->index + i);
			r->ops[n].db = u->where.name;
			r->ops[n].key = r->keys[n];
			r->ops[n].klen = CLAIMS_CHUNK_KEY;
			r->ops[n].val = r->buf + off;
			r->ops[n].vlen = len < CLAIMS_CHUNK ? len : CLAIMS_CHUNK;
			n++;
		}
		if (kind == CLAIMS_FINISH_REQ) {
			uint64_t now = state_now_ms();

			memcpy(r->meta, &u->size, 8);
			memcpy(r->meta + 8, &now, 8);
			memcpy(r->meta + 16, &u->nchunks, 4);
			memcpy(r->keys[n], u->head.key, CLAIMS_KEY_LEN);
			r->ops[n].db = u->where.name;
			r->ops[n].key = r->keys[n];
			r->ops[n].klen = CLAIMS_KEY_LEN;
			r->ops[n].val = r->meta;
			r->ops[n].vlen = CLAIMS_META_LEN;
			n++;
		}
		ACEMQ_ASSERT(n <= CLAIMS_STAGE_CHUNKS + 1); /* what r->ops holds */
	}
	r->u.sw.w = u->w;
	r->u.sw.ops = r->ops;
	r->u.sw.nops = (int)n;
	state_submit(claims_state, &r->u.sw);
}

#define claims_local_of(up) ((struct claims_local_upload *)(void *)(up))

static struct claims_upload *claims_local_new(const struct claims_where *where,
					      struct worker *w)
{
	struct claims_local_upload *u;

	if (where->type != CLAIMS_FILESYSTEM && claims_state == NULL)
		return NULL;
	u = calloc(1, sizeof(*u));
	if (u == NULL)
		return NULL;
	u->where = *where;
	u->w = w;
	u->fd = -1;
	u->lane = atomic_fetch_add(&claims_lanes, 1);
	return &u->head;
}

static int claims_local_write(struct claims_upload *up, const void *data, size_t len)
{
	struct claims_local_upload *u = claims_local_of(up);
	const uint8_t *p = data;

	if (u->failed)
		return -1;
	while (len > 0) {
		size_t n;

		if (u->buf == NULL && (u->buf = claims_buf_new(CLAIMS_STAGE)) == NULL) {
			u->failed = 1;
			return -1;
		}
		ACEMQ_ASSERT(u->used < CLAIMS_STAGE); /* a full stage went out */
		n = CLAIMS_STAGE - u->used;
		if (n > len)
			n = len;
		memcpy(u->buf + u->used, p, n);
		u->used += n;
		u->size += n;
		p += n;
		len -= n;
		if (u->used == CLAIMS_STAGE) {
			claims_upload_submit(u, CLAIMS_CHUNK_REQ);
			if (u->failed)
				return -1;
		}
	}
	return 0;
}

static int claims_local_finish(struct claims_upload *up)
{
	struct claims_local_upload *u = claims_local_of(up);

	if (u->failed)
		return -1;
	u->finishing = 1;
	claims_upload_submit(u, CLAIMS_FINISH_REQ);
	if (u->failed && u->inflight == 0) {
		u->finishing = 0; /* nothing went out: no callback will come */
		return -1;
	}
	return 0;
}

static void claims_local_discard(struct claims_upload *up)
{
	claims_local_of(up)->durable = 0; /* settle, after the callback, removes it */
}

static size_t claims_local_pending(const struct claims_upload *up)
{
	return ((const struct claims_local_upload *)(const void *)up)->pending;
}

static int claims_local_failed(const struct claims_upload *up)
{
	return ((const struct claims_local_upload *)(const void *)up)->failed;
}

static void claims_local_abandon(struct claims_upload *up)
{
	struct claims_local_upload *u = claims_local_of(up);

	u->abandoned = 1;
	claims_upload_settle(u);
}

/* The writer pauses with 4 MiB waiting to be written, goes on below 1. */
static size_t claims_local_high(void)
{
	return CLAIMS_STAGE;
}

static size_t claims_local_low(void)
{
	return CLAIMS_CHUNK;
}

/* ---- reads ----------------------------------------------------------- */

struct claims_local_read {
	struct claims_read head;
	struct job job;
	struct claims_where where;
	char key[CLAIMS_KEY_LEN + 1];
	void (*opened)(void *arg, int rc, uint64_t size);
	void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len);
	void *arg;
	int opening, busy, abandoned;
	int rc;
	int fd;
	int direct; /* fd is O_DIRECT */
	uint64_t size, offset;
	uint32_t index;
	uint8_t *buf; /* cap bytes, CLAIMS_ALIGN aligned */
	size_t cap;   /* a chunk (LMDB) or a stage (filesystem) */
	size_t len;
	uint8_t *lent; /* in a chunk callback: its buffer, until kept */
	int in_chunk;
};

struct claims_copy {
	uint8_t *to;
	size_t cap, len;
	int ok;
};

static void claims_copy_out(void *arg, const void *val, size_t vlen)
{
	struct claims_copy *c = arg;

	c->ok = vlen <= c->cap;
	if (c->ok) {
		memcpy(c->to, val, vlen);
		c->len = vlen;
	}
}

static void claims_read_run(struct job *j)
{
	struct claims_local_read *r =
	    (struct claims_local_read *)(void *)((char *)j -
						 offsetof(struct claims_local_read, job));
	char path[4200], ck[CLAIMS_CHUNK_KEY + 1];
	uint8_t meta[CLAIMS_META_LEN];
	struct claims_copy c = {meta, sizeof(meta), 0, 0};
	struct stat st;
	ssize_t n;

	r->len = 0;
	if (r->opening && r->where.type != CLAIMS_FILESYSTEM) {
		r->rc = state_get(claims_state, r->where.name, r->key, CLAIMS_KEY_LEN,
				  claims_copy_out, &c);
		if (r->rc == STATE_OK && (!c.ok || c.len != CLAIMS_META_LEN))
			r->rc = STATE_IO;
		if (r->rc == STATE_OK)
			memcpy(&r->size, meta, 8);
		if (r->rc != STATE_NOTFOUND || !r->where.files[0])
			return;
		/* Not in LMDB: a large payload, in a file of its own. */
		r->where.type = CLAIMS_FILESYSTEM;
		memcpy(r->where.name, r->where.files, sizeof(r->where.name));
	}
	if (r->opening) {
		claims_path(path, sizeof(path), &r->where, r->key, 0);
		r->fd = open(path, O_RDONLY | O_CLOEXEC);
		if (r->fd < 0) {
			r->rc = errno == ENOENT ? 1 : STATE_IO;
			return;
		}
		r->rc = fstat(r->fd, &st) == 0 ? 0 : STATE_IO;
		r->size = (uint64_t)st.st_size;
		r->direct = claims_fs_direct(r->fd, 1);
		return;
	}
	if (r->offset >= r->size) {
		r->rc = 0;
		return;
	}
	if (r->buf == NULL) {
		r->rc = STATE_IO; /* no memory for it */
		return;
	}
	if (r->where.type == CLAIMS_FILESYSTEM) {
		/* Whole stages from a multiple of one: aligned for O_DIRECT. */
		for (;;) {
			n = read(r->fd, r->buf, r->cap);
			if (n < 0 && errno == EINVAL && r->direct) {
				claims_fs_direct(r->fd, 0);
				r->direct = 0;
			} else if (n >= 0 || errno != EINTR) {
				break;
			}
		}
		r->rc = n < 0 ? STATE_IO : 0;
		r->len = n > 0 ? (size_t)n : 0;
		if (n == 0 && r->offset < r->size)
			r->rc = STATE_IO; /* shorter than it was */
	} else {
		c.to = r->buf;
		c.cap = CLAIMS_CHUNK;
		claims_chunk_key(ck, r->key, r->index);
		r->rc = state_get(claims_state, r->where.name, ck, CLAIMS_CHUNK_KEY,
				  claims_copy_out, &c);
		if (r->rc == STATE_OK && !c.ok)
			r->rc = STATE_IO;
		r->len = c.len;
		if (r->rc == STATE_NOTFOUND || (r->rc == 0 && r->len == 0))
			r->rc = STATE_IO; /* the meta promised more */
	}
	if (r->rc == 0) {
		ACEMQ_ASSERT(r->offset < r->size);
		if (r->len > r->size - r->offset)
			r->len = (size_t)(r->size - r->offset);
		r->offset += r->len;
		r->index++;
	}
}

static void claims_read_free(struct claims_local_read *r)
{
	if (r->fd >= 0)
		close(r->fd);
	claims_buf_free(r->buf, r->cap);
	free(r);
}

static void claims_read_done(struct worker_call *c)
{
	struct claims_local_read *r =
	    (struct claims_local_read *)(void *)((char *)c -
						 offsetof(struct claims_local_read, job.call));

	claims_busy_add(-1);
	r->busy = 0;
	if (r->abandoned) {
		claims_read_free(r);
		return;
	}
	if (r->opening) {
		r->opening = 0;
		r->opened(r->arg, r->rc, r->size);
	} else {
		/* The buffer is had only while a read is out: a reader that
		 * waits for its client to drain holds none. */
		size_t cap = r->cap;

		r->lent = r->buf; /* claims_local_read_keep may take it */
		r->buf = NULL;
		r->in_chunk = 1;
		r->chunk(r->arg, r->rc, r->lent, r->len); /* may abandon r */
		r->in_chunk = 0;
		claims_buf_free(r->lent, cap);
		r->lent = NULL;
		if (r->abandoned && !r->busy)
			claims_read_free(r);
	}
}

static struct claims_read *
claims_local_read_open(const struct claims_where *where, struct worker *w, const char *key,
		       void (*opened)(void *arg, int rc, uint64_t size),
		       void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len),
		       void *arg)
{
	struct claims_local_read *r;

	if (where->type != CLAIMS_FILESYSTEM && claims_state == NULL)
		return NULL;
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return NULL;
	r->head.be =
	    where->type == CLAIMS_FILESYSTEM ? &claims_fs_backend : &claims_lmdb_backend;
	r->where = *where;
	memcpy(r->key, key, CLAIMS_KEY_LEN);
	r->opened = opened;
	r->chunk = chunk;
	r->arg = arg;
	r->fd = -1;
	r->opening = 1;
	r->busy = 1;
	r->job.call.fn = claims_read_done;
	r->job.run = claims_read_run;
	r->job.w = w;
	r->job.lane = atomic_fetch_add(&claims_lanes, 1);
	claims_busy_add(1);
	jobs_submit(&r->job);
	return &r->head;
}

#define claims_local_read_of(rd) ((struct claims_local_read *)(void *)(rd))

static void claims_local_read_next(struct claims_read *rd)
{
	struct claims_local_read *r = claims_local_read_of(rd);

	/* One read at a time, never after the reader let go. */
	ACEMQ_ASSERT(!r->busy && !r->abandoned && !r->opening && r->buf == NULL);
	/* Taken here, on the worker, where it is given back. A file is read
	 * a stage at a time (fewer trips to the disk, which O_DIRECT makes
	 * every read), LMDB a chunk at a time. */
	r->cap = r->where.type == CLAIMS_FILESYSTEM ? CLAIMS_STAGE : CLAIMS_CHUNK;
	r->buf = claims_buf_new(r->cap); /* NULL: the read fails */
	r->busy = 1;
	claims_busy_add(1);
	jobs_submit(&r->job);
}

static void *claims_local_read_keep(struct claims_read *rd)
{
	struct claims_local_read *r = claims_local_read_of(rd);
	void *kept;

	if (!r->in_chunk || r->lent == NULL)
		return NULL; /* not in a chunk callback, or kept already */
	kept = claims_buf_kept(r->lent, r->cap);
	if (kept)
		r->lent = NULL;
	return kept;
}

static void claims_local_read_abandon(struct claims_read *rd)
{
	struct claims_local_read *r = claims_local_read_of(rd);

	if (r->busy || r->in_chunk)
		r->abandoned = 1;
	else
		claims_read_free(r);
}

/* ---- operator views ---------------------------------------------------- */

static int claims_local_stat(const struct claims_where *where, const char *key, uint64_t *size,
			     uint64_t *created_ms)
{
	uint8_t meta[CLAIMS_META_LEN];
	struct claims_copy c = {meta, sizeof(meta), 0, 0};
	const char *dir = where->name;
	char path[4200];
	struct stat st;
	int rc;

	if (where->type != CLAIMS_FILESYSTEM) {
		if (claims_state == NULL)
			return STATE_IO;
		rc = state_get(claims_state, where->name, key, CLAIMS_KEY_LEN, claims_copy_out,
			       &c);
		if (rc == STATE_OK && c.len != CLAIMS_META_LEN)
			return STATE_IO;
		if (rc == STATE_OK) {
			memcpy(size, meta, 8);
			memcpy(created_ms, meta + 8, 8);
			return 0;
		}
		if (rc != STATE_NOTFOUND || !where->files[0])
			return rc;
		dir = where->files; /* a large payload's file? */
	}
	snprintf(path, sizeof(path), "%s/%s", dir, key);
	if (stat(path, &st) != 0)
		return errno == ENOENT ? 1 : STATE_IO;
	*size = (uint64_t)st.st_size;
	*created_ms = (uint64_t)st.st_mtime * 1000;
	return 0;
}

const struct claims_backend claims_lmdb_backend = {
    .name = "lmdb",
    .upload_new = claims_local_new,
    .upload_write = claims_local_write,
    .upload_finish = claims_local_finish,
    .upload_discard = claims_local_discard,
    .upload_pending = claims_local_pending,
    .upload_failed = claims_local_failed,
    .upload_abandon = claims_local_abandon,
    .upload_high = claims_local_high,
    .upload_low = claims_local_low,
    .read_open = claims_local_read_open,
    .read_next = claims_local_read_next,
    .read_keep = claims_local_read_keep,
    .read_abandon = claims_local_read_abandon,
    .purge = claims_local_purge,
    .stat = claims_local_stat,
};

const struct claims_backend claims_fs_backend = {
    .name = "filesystem",
    .upload_new = claims_local_new,
    .upload_write = claims_local_write,
    .upload_finish = claims_local_finish,
    .upload_discard = claims_local_discard,
    .upload_pending = claims_local_pending,
    .upload_failed = claims_local_failed,
    .upload_abandon = claims_local_abandon,
    .upload_high = claims_local_high,
    .upload_low = claims_local_low,
    .read_open = claims_local_read_open,
    .read_next = claims_local_read_next,
    .read_keep = claims_local_read_keep,
    .read_abandon = claims_local_read_abandon,
    .purge = claims_local_purge,
    .stat = claims_local_stat,
};
