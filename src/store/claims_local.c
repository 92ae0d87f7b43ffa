/* claims_local: the claim store backends on this host: LMDB (the state
 * layer) and a filesystem directory, written and read in chunks off the
 * workers' loops. */
#define _GNU_SOURCE /* O_DIRECT */
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

/* LMDB layout, one database per vhost ("claims/VHOST"):
 *   KEY              -> meta: size (u64), created ms (u64), chunks (u32)
 *   KEY#NNNNNNNN     -> chunk NNNNNNNN (hex) of the payload
 * The meta record is written last, in the same transaction as the last
 * chunk: a payload without it is partial and never read. */
#define CLAIMS_META_LEN  20
#define CLAIMS_CHUNK_KEY (CLAIMS_KEY_LEN + 9)

static atomic_ullong claims_lanes;
#define claims_state (claims_state_get())

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
	int dfd;

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
	dfd = open(u->where.name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) != 0)
		r->rc = STATE_IO;
	if (dfd >= 0)
		close(dfd);
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
	if (r->opening) {
		if (r->where.type == CLAIMS_FILESYSTEM) {
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
		r->rc = state_get(claims_state, r->where.name, r->key, CLAIMS_KEY_LEN,
				  claims_copy_out, &c);
		if (r->rc == STATE_OK && (!c.ok || c.len != CLAIMS_META_LEN))
			r->rc = STATE_IO;
		if (r->rc == STATE_OK)
			memcpy(&r->size, meta, 8);
		return;
	}
	if (r->offset >= r->size) {
		r->rc = 0;
		return;
	}
	if (r->buf == NULL) {
		r->rc = STATE_IO; /* not had at open */
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
		r->chunk(r->arg, r->rc, r->buf, r->len);
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
	/* Taken here, on the worker, where it is given back. */
	/* A file is read a stage at a time (fewer trips to the disk, which
	 * O_DIRECT makes every read), LMDB a chunk at a time. */
	r->cap = where->type == CLAIMS_FILESYSTEM ? CLAIMS_STAGE : CLAIMS_CHUNK;
	if ((r->buf = claims_buf_new(r->cap)) == NULL) {
		free(r);
		return NULL;
	}
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
	ACEMQ_ASSERT(!r->busy && !r->abandoned && !r->opening);
	r->busy = 1;
	claims_busy_add(1);
	jobs_submit(&r->job);
}

static void claims_local_read_abandon(struct claims_read *rd)
{
	struct claims_local_read *r = claims_local_read_of(rd);

	if (r->busy)
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
	char path[4200];
	struct stat st;
	int rc;

	if (where->type == CLAIMS_FILESYSTEM) {
		claims_path(path, sizeof(path), where, key, 0);
		if (stat(path, &st) != 0)
			return errno == ENOENT ? 1 : STATE_IO;
		*size = (uint64_t)st.st_size;
		*created_ms = (uint64_t)st.st_mtime * 1000;
		return 0;
	}
	if (claims_state == NULL)
		return STATE_IO;
	rc = state_get(claims_state, where->name, key, CLAIMS_KEY_LEN, claims_copy_out, &c);
	if (rc != STATE_OK)
		return rc == STATE_NOTFOUND ? 1 : rc;
	if (c.len != CLAIMS_META_LEN)
		return STATE_IO;
	memcpy(size, meta, 8);
	memcpy(created_ms, meta + 8, 8);
	return 0;
}

/* ---- retention ------------------------------------------------------------ */

/* A record the sweep removes: a payload's meta record (bytes: the
 * payload's size), or a chunk, its payload's or an orphan's. */
struct claims_dead {
	char key[CLAIMS_CHUNK_KEY + 1];
	unsigned char orphan;
	uint64_t bytes;
};

struct claims_sweep {
	uint64_t cutoff_ms;
	char meta[CLAIMS_KEY_LEN]; /* the last meta record seen */
	int meta_expired, have_meta;
	int orphans; /* also chunks no payload owns (only before uploads start) */
	struct claims_dead *dead;
	size_t ndead, capdead;
};

static void claims_sweep_add(struct claims_sweep *sw, const void *key, size_t klen, int orphan,
			     uint64_t bytes)
{
	struct claims_dead *d;

	ACEMQ_ASSERT(klen < sizeof(d->key));
	if (sw->ndead == sw->capdead) {
		size_t n = sw->capdead ? sw->capdead * 2 : 256;
		void *p = realloc(sw->dead, n * sizeof(*sw->dead));

		if (p == NULL)
			return;
		sw->dead = p;
		sw->capdead = n;
	}
	d = &sw->dead[sw->ndead++];
	memcpy(d->key, key, klen);
	d->key[klen] = 0;
	d->orphan = (unsigned char)orphan;
	d->bytes = bytes;
}

static int claims_sweep_one(void *arg, const void *key, size_t klen, const void *val,
			    size_t vlen)
{
	struct claims_sweep *sw = arg;
	uint64_t created, size;

	if (klen == CLAIMS_KEY_LEN && vlen == CLAIMS_META_LEN) {
		memcpy(&size, val, 8);
		memcpy(&created, (const uint8_t *)val + 8, 8);
		memcpy(sw->meta, key, CLAIMS_KEY_LEN);
		sw->have_meta = 1;
		sw->meta_expired = sw->cutoff_ms && created < sw->cutoff_ms;
		if (sw->meta_expired)
			claims_sweep_add(sw, key, klen, 0, size);
	} else if (klen == CLAIMS_CHUNK_KEY) {
		int owned = sw->have_meta && memcmp(sw->meta, key, CLAIMS_KEY_LEN) == 0;

		/* A chunk goes with its expired payload; at start, before any
		 * upload, also when no payload owns it (a crash mid-upload). */
		if (owned && sw->meta_expired)
			claims_sweep_add(sw, key, klen, 0, 0);
		else if (!owned && sw->orphans)
			claims_sweep_add(sw, key, klen, 1, vlen);
	}
	return 0;
}

/* A filesystem store: payload files past the cutoff, and partial files an
 * hour old that no upload of this proxy is writing (the directory may be
 * shared: another proxy's upload may be in progress). */
static void claims_local_purge_directory(const char *dir, const struct claims_sweep *sw,
					 struct claims_purged *out)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4200];
	struct stat st;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		int partial = n == CLAIMS_KEY_LEN + 9 && e->d_name[0] == '.' &&
			      strcmp(e->d_name + 1 + CLAIMS_KEY_LEN, ".partial") == 0;
		const char *key = partial ? e->d_name + 1 : e->d_name;

		if (!partial && !claims_key_valid((const uint8_t *)key, n))
			continue; /* not ours: another library's or the operator's */
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) != 0)
			continue;
		if (partial ? claims_active_has(key) ||
				  (uint64_t)st.st_mtime * 1000 + 3600000 >= state_now_ms()
			    : !sw->cutoff_ms || (uint64_t)st.st_mtime * 1000 >= sw->cutoff_ms)
			continue;
		if (unlink(path) != 0)
			continue;
		if (partial) {
			out->partial++;
			out->partial_bytes += (uint64_t)st.st_size;
		} else {
			out->payloads++;
			out->payload_bytes += (uint64_t)st.st_size;
		}
	}
	closedir(d);
}

static int claims_local_purge(const struct claims_where *where, long retention_s, int orphans,
			      struct claims_purged *out)
{
	struct claims_sweep sw;
	size_t i, j;
	int rc = 0;

	memset(&sw, 0, sizeof(sw));
	sw.orphans = orphans;
	if (retention_s > 0)
		sw.cutoff_ms = state_now_ms() - (uint64_t)retention_s * 1000;
	if (where->type == CLAIMS_FILESYSTEM) {
		claims_local_purge_directory(where->name, &sw, out);
		return 0;
	}
	if (claims_state == NULL)
		return 0;
	if (state_scan(claims_state, where->name, NULL, 0, claims_sweep_one, &sw) != STATE_OK) {
		free(sw.dead);
		return -1;
	}
	for (i = 0; i < sw.ndead; i += 512) {
		struct state_op ops[512];
		size_t n = sw.ndead - i < 512 ? sw.ndead - i : 512;

		memset(ops, 0, sizeof(ops));
		for (j = 0; j < n; j++) {
			ops[j].db = where->name;
			ops[j].key = sw.dead[i + j].key;
			ops[j].klen = strlen(sw.dead[i + j].key);
		}
		if (state_write_wait(claims_state, ops, (int)n) != STATE_OK) {
			rc = -1;
			break;
		}
		for (j = 0; j < n; j++) {
			const struct claims_dead *d = &sw.dead[i + j];

			if (d->orphan) {
				out->partial++;
				out->partial_bytes += d->bytes;
			} else if (ops[j].klen == CLAIMS_KEY_LEN) {
				out->payloads++;
				out->payload_bytes += d->bytes;
			}
		}
	}
	free(sw.dead);
	return rc;
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
    .read_abandon = claims_local_read_abandon,
    .purge = claims_local_purge,
    .stat = claims_local_stat,
};
