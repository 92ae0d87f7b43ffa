/* claims_s3: the claim store backend on S3-compatible object storage. The
 * object's key is the rule's prefix plus the claim key and it holds exactly
 * the payload bytes, with the message's content type. A payload up to one
 * part is one PUT; a larger one a multipart upload whose parts go out as
 * they fill (a bounded number in flight), aborted when it fails or its
 * client goes. Reads are ranged GETs, one chunk at a time. */
#include "claims_backend.h"

#include "../log.h"
#include "s3.h"
#include "state.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define CLAIMS_S3_OBJECT     (256 + CLAIMS_KEY_LEN + 1)
#define CLAIMS_S3_ETAG       130
#define CLAIMS_S3_READ_CHUNK (2u * 1024 * 1024) /* bytes per ranged GET */
#define CLAIMS_S3_PAGE       "1000"             /* keys per ListObjectsV2 page */
#define CLAIMS_S3_PAGES      10                 /* pages a purge lists at most per run */
#define CLAIMS_S3_BATCH      16                 /* deletes in flight at once */
#define CLAIMS_S3_STALE_S    86400              /* a multipart upload this old is a leftover */
#define CLAIMS_S3_MAX_PARTS  10000              /* S3's limit */
#define CLAIMS_S3_STAT_MS    2000               /* GET /claims waits at most this */

enum claims_s3_kind { S3_CREATE, S3_PART, S3_PUT, S3_COMPLETE, S3_ABORT, S3_DELETE };

struct claims_s3_upload;

/* One request of an upload. */
struct claims_s3_op {
	struct s3_req req; /* first: its worker_call is the op's */
	struct claims_s3_upload *u;
	enum claims_s3_kind kind;
	uint8_t *buf;  /* owned: the part's bytes (mapped) or the XML sent */
	size_t len;    /* payload bytes it carries */
	size_t mapped; /* buf is a mapping of this many bytes (else malloc'd) */
	int number;    /* part number */
	struct claims_s3_op *next;
};

struct claims_s3_upload {
	struct claims_upload head;
	struct claims_where where;
	struct worker *w;
	char object[CLAIMS_S3_OBJECT];
	uint8_t *buf; /* the part being filled */
	size_t used, part_size;
	size_t pending; /* bytes in parts sent or waiting to be */
	int inflight;   /* requests out */
	char *upload_id;
	int nparts, parts_done;
	char (*etags)[CLAIMS_S3_ETAG];
	struct claims_s3_op *waiting, **waiting_tail; /* parts before the upload id */
	unsigned creating : 1, failed : 1, finishing : 1, durable : 1, abandoned : 1;
	unsigned calling : 1, stored : 1, completed : 1, complete_sent : 1, cleaned : 1;
};

#define claims_s3_of(up) ((struct claims_s3_upload *)(void *)(up))

/* Part buffers are mappings of their own: the pages go back to the system
 * the moment a part is done, whatever the allocator would keep, so the
 * proxy's memory follows the parts in flight. */
static uint8_t *claims_s3_buf_new(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void claims_s3_buf_free(uint8_t *p, size_t size)
{
	if (p)
		munmap(p, size);
}

static void claims_s3_object(char *out, const struct claims_where *where, const char *key)
{
	snprintf(out, CLAIMS_S3_OBJECT, "%s%s", where->prefix, key);
}

static void claims_s3_op_done(struct worker_call *c);

static struct claims_s3_op *claims_s3_op_new(struct claims_s3_upload *u,
					     enum claims_s3_kind kind, const char *method)
{
	struct claims_s3_op *op = calloc(1, sizeof(*op));

	if (op == NULL)
		return NULL;
	s3_req_init(&op->req, method, u->where.bucket, u->object);
	if (op->req.key == NULL) {
		free(op);
		return NULL;
	}
	op->req.call.fn = claims_s3_op_done;
	op->req.w = u->w;
	op->u = u;
	op->kind = kind;
	return op;
}

static void claims_s3_op_free(struct claims_s3_op *op)
{
	s3_req_clear(&op->req);
	if (op->mapped)
		claims_s3_buf_free(op->buf, op->mapped);
	else
		free(op->buf);
	free(op);
}

static void claims_s3_send(struct claims_s3_upload *u, struct claims_s3_op *op)
{
	u->inflight++;
	claims_busy_add(1);
	s3_submit(&op->req);
}

/* A filled part (or the last) goes out, or waits for the upload id. */
static int claims_s3_part_out(struct claims_s3_upload *u)
{
	struct claims_s3_op *op;

	if (u->nparts == CLAIMS_S3_MAX_PARTS ||
	    (op = claims_s3_op_new(u, S3_PART, "PUT")) == NULL) {
		u->failed = 1;
		return -1;
	}
	op->buf = u->buf;
	op->mapped = u->part_size;
	op->len = u->used;
	op->req.body = op->buf;
	op->req.body_len = op->len;
	op->number = ++u->nparts;
	u->buf = NULL;
	u->used = 0;
	u->pending += op->len;
	if (u->upload_id) {
		char n[16];

		snprintf(n, sizeof(n), "%d", op->number);
		if (s3_req_query(&op->req, "partNumber", n) != 0 ||
		    s3_req_query(&op->req, "uploadId", u->upload_id) != 0) {
			u->pending -= op->len;
			claims_s3_op_free(op);
			u->failed = 1;
			return -1;
		}
		claims_s3_send(u, op);
		return 0;
	}
	*u->waiting_tail = op;
	u->waiting_tail = &op->next;
	if (!u->creating) {
		struct claims_s3_op *c = claims_s3_op_new(u, S3_CREATE, "POST");

		if (c == NULL || s3_req_query(&c->req, "uploads", NULL) != 0) {
			if (c)
				claims_s3_op_free(c);
			u->failed = 1;
			return -1;
		}
		snprintf(c->req.content_type, sizeof(c->req.content_type), "%s",
			 u->head.content_type);
		u->creating = 1;
		claims_s3_send(u, c);
	}
	return 0;
}

static void claims_s3_drop_waiting(struct claims_s3_upload *u)
{
	struct claims_s3_op *op;

	while ((op = u->waiting) != NULL) {
		u->waiting = op->next;
		u->pending -= op->len;
		claims_s3_op_free(op);
	}
	u->waiting_tail = &u->waiting;
}

static void claims_s3_free(struct claims_s3_upload *u)
{
	claims_s3_drop_waiting(u);
	claims_active_remove(u->head.key);
	claims_s3_buf_free(u->buf, u->part_size);
	free(u->upload_id);
	free(u->etags);
	free(u);
}

/* Freed once nothing is out and the owner let go or heard the end; what
 * is not durable is cleaned away first (the multipart upload aborted, an
 * object that may have been stored deleted). */
static void claims_s3_settle(struct claims_s3_upload *u)
{
	struct claims_s3_op *op;

	if (u->inflight > 0 || u->calling)
		return;
	if (!u->abandoned && !(u->finishing && u->head.done == NULL))
		return;
	if (!u->durable && !u->cleaned) {
		u->cleaned = 1;
		if (u->upload_id && !u->completed &&
		    (op = claims_s3_op_new(u, S3_ABORT, "DELETE")) != NULL) {
			if (s3_req_query(&op->req, "uploadId", u->upload_id) == 0)
				claims_s3_send(u, op);
			else
				claims_s3_op_free(op);
		}
		if (u->stored && (op = claims_s3_op_new(u, S3_DELETE, "DELETE")) != NULL)
			claims_s3_send(u, op);
		if (u->inflight > 0)
			return;
	}
	claims_s3_free(u);
}

static void claims_s3_try_complete(struct claims_s3_upload *u)
{
	struct claims_s3_op *op;
	size_t cap, n;
	int i;

	if (!u->finishing || u->failed || u->complete_sent || u->upload_id == NULL ||
	    u->waiting || u->used > 0 || u->parts_done != u->nparts)
		return;
	op = claims_s3_op_new(u, S3_COMPLETE, "POST");
	cap = 128 + (size_t)u->nparts * (CLAIMS_S3_ETAG + 64);
	if (op == NULL || (op->buf = malloc(cap)) == NULL ||
	    s3_req_query(&op->req, "uploadId", u->upload_id) != 0) {
		if (op)
			claims_s3_op_free(op);
		u->failed = 1;
		return;
	}
	n = (size_t)snprintf((char *)op->buf, cap, "<CompleteMultipartUpload>");
	for (i = 0; i < u->nparts; i++)
		n += (size_t)snprintf((char *)op->buf + n, cap - n,
				      "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>",
				      i + 1, u->etags[i]);
	n += (size_t)snprintf((char *)op->buf + n, cap - n, "</CompleteMultipartUpload>");
	snprintf(op->req.content_type, sizeof(op->req.content_type), "application/xml");
	op->req.body = op->buf;
	op->req.body_len = n;
	u->complete_sent = 1;
	u->stored = 1;
	claims_s3_send(u, op);
}

static const char *claims_s3_why(const struct s3_req *r)
{
	static __thread char why[200];
	char code[64];

	if (r->status == 0)
		return r->curl_error[0] ? r->curl_error : "no answer";
	if (s3_xml_get(r->text, "Code", code, sizeof(code)))
		snprintf(why, sizeof(why), "HTTP %ld %s", r->status, code);
	else
		snprintf(why, sizeof(why), "HTTP %ld", r->status);
	return why;
}

static void claims_s3_op_done(struct worker_call *c)
{
	struct claims_s3_op *op = (struct claims_s3_op *)(void *)c;
	struct claims_s3_upload *u = op->u;
	int ok = s3_ok(&op->req);

	claims_busy_add(-1);
	u->inflight--;
	switch (op->kind) {
	case S3_CREATE: {
		char id[1024];

		u->creating = 0;
		if (ok && s3_xml_get(op->req.text, "UploadId", id, sizeof(id)) && id[0])
			u->upload_id = strdup(id);
		if (u->upload_id == NULL && !u->failed) {
			u->failed = 1;
			log_error("claims: s3: starting the upload of %s/%s failed: %s",
				  u->where.bucket, u->object, claims_s3_why(&op->req));
		}
		if (u->failed || u->abandoned) {
			claims_s3_drop_waiting(u);
		} else {
			struct claims_s3_op *p = u->waiting;
			char n[16];

			u->waiting = NULL;
			u->waiting_tail = &u->waiting;
			while (p) {
				struct claims_s3_op *next = p->next;

				p->next = NULL;
				snprintf(n, sizeof(n), "%d", p->number);
				if (s3_req_query(&p->req, "partNumber", n) == 0 &&
				    s3_req_query(&p->req, "uploadId", u->upload_id) == 0) {
					claims_s3_send(u, p);
				} else {
					u->failed = 1;
					u->pending -= p->len;
					claims_s3_op_free(p);
				}
				p = next;
			}
		}
		break;
	}
	case S3_PART:
		u->pending -= op->len;
		if (ok && op->req.etag[0] && op->number <= u->nparts) {
			if (u->etags == NULL)
				u->etags = calloc(CLAIMS_S3_MAX_PARTS, sizeof(*u->etags));
			if (u->etags)
				snprintf(u->etags[op->number - 1], CLAIMS_S3_ETAG, "%s",
					 op->req.etag);
			u->parts_done++;
			ok = u->etags != NULL;
		}
		if (!ok && !u->failed) {
			u->failed = 1;
			log_error("claims: s3: part %d of %s/%s failed: %s", op->number,
				  u->where.bucket, u->object, claims_s3_why(&op->req));
		}
		break;
	case S3_PUT:
	case S3_COMPLETE:
		u->pending -= op->len;
		/* CompleteMultipartUpload may answer 200 with an error inside. */
		if (ok && op->kind == S3_COMPLETE && op->req.text &&
		    strstr(op->req.text, "<Error>"))
			ok = 0;
		/* A 4xx answer stored nothing: nothing to delete after it. */
		if (!ok && op->req.status >= 400 && op->req.status < 500)
			u->stored = 0;
		if (ok) {
			u->durable = 1;
			u->completed = 1;
		} else if (!u->failed) {
			u->failed = 1;
			log_error("claims: s3: storing %s/%s failed: %s", u->where.bucket,
				  u->object, claims_s3_why(&op->req));
		}
		break;
	case S3_ABORT:
	case S3_DELETE:
		if (!ok && op->req.status != 404)
			log_warning("claims: s3: removing %s/%s%s failed: %s", u->where.bucket,
				    u->object, op->kind == S3_ABORT ? " (abort)" : "",
				    claims_s3_why(&op->req));
		break;
	}
	claims_s3_op_free(op);
	u->calling = 1;
	if (!u->abandoned && !u->finishing && u->head.progress)
		u->head.progress(u->head.arg);
	if (!u->abandoned && u->finishing && u->head.done) {
		claims_s3_try_complete(u);
		if (u->inflight == 0 && (u->durable || u->failed)) {
			void (*done)(void *, int) = u->head.done;

			u->head.done = NULL;
			done(u->head.arg, u->durable && !u->failed ? 0 : -1);
		}
	}
	u->calling = 0;
	claims_s3_settle(u);
}

static struct claims_upload *claims_s3_new(const struct claims_where *where, struct worker *w)
{
	struct claims_s3_upload *u = calloc(1, sizeof(*u));

	if (u == NULL)
		return NULL;
	u->where = *where;
	u->w = w;
	u->part_size = s3_part_size();
	u->waiting_tail = &u->waiting;
	return &u->head;
}

static int claims_s3_write(struct claims_upload *up, const void *data, size_t len)
{
	struct claims_s3_upload *u = claims_s3_of(up);
	const uint8_t *p = data;

	if (u->failed)
		return -1;
	if (u->object[0] == 0)
		claims_s3_object(u->object, &u->where, u->head.key);
	while (len > 0) {
		size_t n;

		if (u->buf == NULL && (u->buf = claims_s3_buf_new(u->part_size)) == NULL) {
			u->failed = 1;
			return -1;
		}
		n = u->part_size - u->used;
		if (n > len)
			n = len;
		memcpy(u->buf + u->used, p, n);
		u->used += n;
		p += n;
		len -= n;
		if (u->used == u->part_size && claims_s3_part_out(u) != 0)
			return -1;
	}
	return 0;
}

static int claims_s3_finish(struct claims_upload *up)
{
	struct claims_s3_upload *u = claims_s3_of(up);

	if (u->failed)
		return -1;
	if (u->object[0] == 0)
		claims_s3_object(u->object, &u->where, u->head.key);
	u->finishing = 1;
	if (u->nparts == 0) {
		/* One part at most: a plain PUT. */
		struct claims_s3_op *op = claims_s3_op_new(u, S3_PUT, "PUT");

		if (op == NULL) {
			u->failed = 1;
			u->finishing = 0;
			return -1;
		}
		op->buf = u->buf;
		op->mapped = op->buf ? u->part_size : 0;
		op->len = u->used;
		op->req.body = op->buf;
		op->req.body_len = op->len;
		snprintf(op->req.content_type, sizeof(op->req.content_type), "%s",
			 u->head.content_type);
		u->buf = NULL;
		u->used = 0;
		u->pending += op->len;
		u->stored = 1;
		claims_s3_send(u, op);
		return 0;
	}
	if (u->used > 0)
		claims_s3_part_out(u);
	claims_s3_try_complete(u); /* every part may be in already */
	if (u->failed && u->inflight == 0) {
		u->finishing = 0; /* nothing out: no callback will come */
		return -1;
	}
	return 0;
}

static void claims_s3_discard(struct claims_upload *up)
{
	claims_s3_of(up)->durable = 0; /* settle, after the callback, removes it */
}

static size_t claims_s3_pending(const struct claims_upload *up)
{
	return ((const struct claims_s3_upload *)(const void *)up)->pending;
}

static int claims_s3_failed(const struct claims_upload *up)
{
	return ((const struct claims_s3_upload *)(const void *)up)->failed;
}

static void claims_s3_abandon(struct claims_upload *up)
{
	struct claims_s3_upload *u = claims_s3_of(up);

	if (u->object[0] == 0)
		claims_s3_object(u->object, &u->where, u->head.key);
	u->abandoned = 1;
	claims_s3_settle(u);
}

/* Two parts in flight pause the writer; one part done lets it go on. */
static size_t claims_s3_high(void)
{
	return 2 * s3_part_size();
}

static size_t claims_s3_low(void)
{
	return s3_part_size();
}

/* ---- reads ------------------------------------------------------------------- */

struct claims_s3_read {
	struct claims_read head;
	struct s3_req req;
	struct claims_where where;
	struct worker *w;
	char object[CLAIMS_S3_OBJECT];
	void (*opened)(void *arg, int rc, uint64_t size);
	void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len);
	void *arg;
	uint64_t size, offset;
	uint8_t *buf;
	unsigned opening : 1, busy : 1, abandoned : 1, eof : 1;
};

static void claims_s3_read_free(struct claims_s3_read *r)
{
	s3_req_clear(&r->req);
	claims_s3_buf_free(r->buf, CLAIMS_S3_READ_CHUNK);
	free(r);
}

static void claims_s3_read_done(struct worker_call *c)
{
	struct claims_s3_read *r =
	    (struct claims_s3_read *)(void *)((char *)c - offsetof(struct claims_s3_read, req));
	int rc;

	claims_busy_add(-1);
	r->busy = 0;
	if (r->abandoned) {
		claims_s3_read_free(r);
		return;
	}
	if (r->opening) {
		r->opening = 0;
		if (s3_ok(&r->req)) {
			rc = 0;
			r->size = r->req.content_length;
		} else if (r->req.status == 404) {
			rc = 1;
		} else {
			rc = STATE_IO;
			log_error("claims: s3: looking up %s/%s failed: %s", r->where.bucket,
				  r->object, claims_s3_why(&r->req));
		}
		r->opened(r->arg, rc, r->size);
		return;
	}
	if (r->eof) {
		r->chunk(r->arg, 0, NULL, 0);
		return;
	}
	{
		uint64_t want = r->size - r->offset;

		if (want > CLAIMS_S3_READ_CHUNK)
			want = CLAIMS_S3_READ_CHUNK;
		if (!s3_ok(&r->req) || r->req.out_len != want) {
			log_error("claims: s3: reading %s/%s at %llu failed: %s",
				  r->where.bucket, r->object, (unsigned long long)r->offset,
				  s3_ok(&r->req) ? "a short answer" : claims_s3_why(&r->req));
			r->chunk(r->arg, STATE_IO, NULL, 0);
			return;
		}
		r->offset += want;
		r->chunk(r->arg, 0, r->buf, (size_t)want);
	}
}

static int claims_s3_read_send(struct claims_s3_read *r, const char *method)
{
	s3_req_clear(&r->req);
	s3_req_init(&r->req, method, r->where.bucket, r->object);
	r->req.call.fn = claims_s3_read_done;
	r->req.w = r->w;
	if (r->req.key == NULL)
		return -1;
	r->busy = 1;
	claims_busy_add(1);
	return 0;
}

static struct claims_read *
claims_s3_read_open(const struct claims_where *where, struct worker *w, const char *key,
		    void (*opened)(void *arg, int rc, uint64_t size),
		    void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len),
		    void *arg)
{
	struct claims_s3_read *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	r->head.be = &claims_s3_backend;
	r->where = *where;
	r->w = w;
	claims_s3_object(r->object, where, key);
	r->opened = opened;
	r->chunk = chunk;
	r->arg = arg;
	r->opening = 1;
	if (claims_s3_read_send(r, "HEAD") != 0) {
		free(r);
		return NULL;
	}
	s3_submit(&r->req);
	return &r->head;
}

static void claims_s3_read_next(struct claims_read *rd)
{
	struct claims_s3_read *r = (struct claims_s3_read *)(void *)rd;
	uint64_t want = r->size - r->offset;

	if (want == 0 ||
	    (r->buf == NULL && (r->buf = claims_s3_buf_new(CLAIMS_S3_READ_CHUNK)) == NULL) ||
	    claims_s3_read_send(r, "GET") != 0) {
		/* The end (or no memory: a short answer): said from the loop. */
		r->eof = want == 0;
		r->busy = 1;
		claims_busy_add(1);
		r->req.call.fn = claims_s3_read_done;
		r->req.status = 0;
		worker_post(r->w, &r->req.call);
		return;
	}
	if (want > CLAIMS_S3_READ_CHUNK)
		want = CLAIMS_S3_READ_CHUNK;
	r->req.ranged = 1;
	r->req.range_from = r->offset;
	r->req.range_to = r->offset + want - 1;
	r->req.out = r->buf;
	r->req.out_cap = CLAIMS_S3_READ_CHUNK;
	s3_submit(&r->req);
}

static void claims_s3_read_abandon(struct claims_read *rd)
{
	struct claims_s3_read *r = (struct claims_s3_read *)(void *)rd;

	if (r->busy)
		r->abandoned = 1;
	else
		claims_s3_read_free(r);
}

/* ---- lookups and retention ------------------------------------------------------ */

static int claims_s3_stat(const struct claims_where *where, const char *key, uint64_t *size,
			  uint64_t *created_ms)
{
	char object[CLAIMS_S3_OBJECT];
	struct s3_req r;
	int rc;

	claims_s3_object(object, where, key);
	s3_req_init(&r, "HEAD", where->bucket, object);
	if (r.key == NULL)
		return STATE_IO;
	/* An operator's lookup, answered on the admin's loop: short. */
	r.timeout_ms = CLAIMS_S3_STAT_MS;
	s3_run(&r);
	if (s3_ok(&r)) {
		*size = r.content_length;
		*created_ms = (uint64_t)r.last_modified * 1000;
		rc = 0;
	} else {
		rc = r.status == 404 ? 1 : STATE_IO;
		if (rc != 1)
			log_warning("claims: s3: looking up %s/%s failed: %s", where->bucket,
				    object, claims_s3_why(&r));
	}
	s3_req_clear(&r);
	return rc;
}

/* 2024-01-31T12:34:56.000Z */
static time_t claims_s3_iso_time(const char *s)
{
	struct tm tm;

	memset(&tm, 0, sizeof(tm));
	if (sscanf(s, "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
		   &tm.tm_min, &tm.tm_sec) != 6)
		return 0;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return timegm(&tm);
}

/* Where the last purge of a bucket and prefix stopped, so that each run
 * goes on from there and a large bucket is covered over several runs. */
static pthread_mutex_t claims_s3_cursor_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	char bucket[64], prefix[256];
	char after[CLAIMS_S3_OBJECT];
} claims_s3_cursors[32];

static int claims_s3_cursor(const struct claims_where *where)
{
	int i;

	for (i = 0; i < 32; i++)
		if (claims_s3_cursors[i].bucket[0] == 0 ||
		    (strcmp(claims_s3_cursors[i].bucket, where->bucket) == 0 &&
		     strcmp(claims_s3_cursors[i].prefix, where->prefix) == 0))
			break;
	if (i == 32)
		i = 0;
	snprintf(claims_s3_cursors[i].bucket, sizeof(claims_s3_cursors[i].bucket), "%s",
		 where->bucket);
	snprintf(claims_s3_cursors[i].prefix, sizeof(claims_s3_cursors[i].prefix), "%s",
		 where->prefix);
	return i;
}

/* Run the requests, CLAIMS_S3_BATCH at a time, and wait for them. */
static long claims_s3_run_all(struct s3_req *reqs, int n, const char *what)
{
	long ok = 0;
	int i, j;

	for (i = 0; i < n; i += CLAIMS_S3_BATCH) {
		int m = n - i < CLAIMS_S3_BATCH ? n - i : CLAIMS_S3_BATCH;

		for (j = 0; j < m; j++) {
			reqs[i + j].w = NULL;
			s3_submit(&reqs[i + j]);
		}
		for (j = 0; j < m; j++) {
			struct s3_req *r = &reqs[i + j];

			s3_run_wait(r);
			if (s3_ok(r) || r->status == 404)
				ok++;
			else
				log_warning("claims: s3: %s %s/%s failed: %s", what, r->bucket,
					    r->key, claims_s3_why(r));
			s3_req_clear(r);
		}
	}
	return ok;
}

/* Multipart uploads under the prefix that a crash or a lost connection
 * left open a day ago are aborted (one page a run). */
static void claims_s3_abort_stale(const struct claims_where *where)
{
	struct s3_req list, *aborts;
	char key[CLAIMS_S3_OBJECT], id[1024], when[64];
	const char *p, *e;
	size_t plen = strlen(where->prefix);
	int n = 0;
	time_t now = time(NULL);

	s3_req_init(&list, "GET", where->bucket, NULL);
	if (s3_req_query(&list, "uploads", NULL) != 0 ||
	    s3_req_query(&list, "prefix", where->prefix) != 0 ||
	    s3_req_query(&list, "max-uploads", CLAIMS_S3_PAGE) != 0) {
		s3_req_clear(&list);
		return;
	}
	s3_run(&list);
	if (!s3_ok(&list)) {
		log_warning("claims: s3: listing the uploads of %s/%s failed: %s",
			    where->bucket, where->prefix, claims_s3_why(&list));
		s3_req_clear(&list);
		return;
	}
	aborts = calloc(1000, sizeof(*aborts));
	for (p = list.text; aborts && p && (p = strstr(p, "<Upload>")) != NULL && n < 1000;
	     p = e) {
		e = strstr(p, "</Upload>");
		if (e == NULL)
			break;
		if (!s3_xml_get(p, "Key", key, sizeof(key)) ||
		    !s3_xml_get(p, "UploadId", id, sizeof(id)) ||
		    !s3_xml_get(p, "Initiated", when, sizeof(when)))
			continue;
		if (strlen(key) != plen + CLAIMS_KEY_LEN ||
		    strncmp(key, where->prefix, plen) != 0 ||
		    !claims_key_valid((const uint8_t *)key + plen, CLAIMS_KEY_LEN) ||
		    claims_active_has(key + plen) ||
		    claims_s3_iso_time(when) + CLAIMS_S3_STALE_S > now)
			continue;
		s3_req_init(&aborts[n], "DELETE", where->bucket, key);
		if (aborts[n].key == NULL || s3_req_query(&aborts[n], "uploadId", id) != 0) {
			s3_req_clear(&aborts[n]);
			continue;
		}
		n++;
	}
	if (n > 0)
		log_info("claims: s3: %s/%s: %ld stale multipart upload%s aborted",
			 where->bucket, where->prefix, claims_s3_run_all(aborts, n, "aborting"),
			 n == 1 ? "" : "s");
	free(aborts);
	s3_req_clear(&list);
}

static int claims_s3_purge(const struct claims_where *where, long retention_s, int orphans,
			   struct claims_purged *out)
{
	char token[1024] = "", key[CLAIMS_S3_OBJECT], when[64], after[CLAIMS_S3_OBJECT];
	size_t plen = strlen(where->prefix);
	time_t cutoff = time(NULL) - retention_s;
	long removed = 0;
	int page, cur, failed = 0, truncated = 1;

	/* The run at start (orphans) is not waited for a bucket: it would hold
	 * the listeners for as long as the store takes, or is unreachable. The
	 * periodic runs do it all. */
	if (orphans)
		return 0;
	claims_s3_abort_stale(where);
	if (retention_s <= 0)
		return 0;
	pthread_mutex_lock(&claims_s3_cursor_lock);
	cur = claims_s3_cursor(where);
	snprintf(after, sizeof(after), "%s", claims_s3_cursors[cur].after);
	pthread_mutex_unlock(&claims_s3_cursor_lock);
	for (page = 0; page < CLAIMS_S3_PAGES && truncated && !failed; page++) {
		struct s3_req list, *dels = calloc(1000, sizeof(*dels));
		const char *p, *e;
		int n = 0;

		s3_req_init(&list, "GET", where->bucket, NULL);
		if (dels == NULL || s3_req_query(&list, "list-type", "2") != 0 ||
		    s3_req_query(&list, "prefix", where->prefix) != 0 ||
		    s3_req_query(&list, "max-keys", CLAIMS_S3_PAGE) != 0 ||
		    (token[0] && s3_req_query(&list, "continuation-token", token) != 0) ||
		    (!token[0] && after[0] && s3_req_query(&list, "start-after", after) != 0)) {
			s3_req_clear(&list);
			free(dels);
			return -1;
		}
		s3_run(&list);
		if (!s3_ok(&list)) {
			log_warning("claims: s3: listing %s/%s failed: %s", where->bucket,
				    where->prefix, claims_s3_why(&list));
			s3_req_clear(&list);
			free(dels);
			return -1;
		}
		for (p = list.text; p && (p = strstr(p, "<Contents>")) != NULL && n < 1000;
		     p = e) {
			e = strstr(p, "</Contents>");
			if (e == NULL)
				break;
			if (!s3_xml_get(p, "Key", key, sizeof(key)) ||
			    !s3_xml_get(p, "LastModified", when, sizeof(when)))
				continue;
			snprintf(after, sizeof(after), "%s", key);
			/* Only what the proxy writes: prefix plus a claim key. */
			if (strlen(key) != plen + CLAIMS_KEY_LEN ||
			    strncmp(key, where->prefix, plen) != 0 ||
			    !claims_key_valid((const uint8_t *)key + plen, CLAIMS_KEY_LEN) ||
			    claims_s3_iso_time(when) >= cutoff)
				continue;
			s3_req_init(&dels[n], "DELETE", where->bucket, key);
			if (dels[n].key != NULL)
				n++;
		}
		truncated = strstr(list.text ? list.text : "",
				   "<IsTruncated>true</IsTruncated>") != NULL;
		if (!truncated ||
		    !s3_xml_get(list.text, "NextContinuationToken", token, sizeof(token)))
			truncated = 0;
		removed += claims_s3_run_all(dels, n, "deleting");
		free(dels);
		s3_req_clear(&list);
	}
	pthread_mutex_lock(&claims_s3_cursor_lock);
	/* The whole listing was seen: the next run starts from the top. */
	snprintf(claims_s3_cursors[cur].after, sizeof(claims_s3_cursors[cur].after), "%s",
		 truncated ? after : "");
	pthread_mutex_unlock(&claims_s3_cursor_lock);
	out->payloads = removed;
	return 0;
}

const struct claims_backend claims_s3_backend = {
    .name = "s3",
    .upload_new = claims_s3_new,
    .upload_write = claims_s3_write,
    .upload_finish = claims_s3_finish,
    .upload_discard = claims_s3_discard,
    .upload_pending = claims_s3_pending,
    .upload_failed = claims_s3_failed,
    .upload_abandon = claims_s3_abandon,
    .upload_high = claims_s3_high,
    .upload_low = claims_s3_low,
    .read_open = claims_s3_read_open,
    .read_next = claims_s3_read_next,
    .read_abandon = claims_s3_read_abandon,
    .purge = claims_s3_purge,
    .stat = claims_s3_stat,
};
