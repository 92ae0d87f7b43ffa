/* claims: where claim-check payloads live, per vhost: in the state layer
 * (LMDB, the default), in a filesystem directory or in an S3 bucket; one
 * interface whichever backend a vhost has. Payloads are written in chunks
 * as they arrive and read back in chunks; every write, fsync, request and
 * read runs off the workers' loops, and each result comes back to the
 * worker that asked. */
#ifndef ACEMQ_CLAIMS_H
#define ACEMQ_CLAIMS_H

#include "../worker.h"

#include <stddef.h>
#include <stdint.h>

struct state;
struct rules_claim_check;

#define CLAIMS_KEY_LEN 32         /* 128 random bits as lowercase hex */
#define CLAIMS_CHUNK   (1u << 20) /* bytes per stored chunk and per read */
/* An LMDB store keeps a payload of this size or more in a file of its own
 * under data_dir/claims/ (written and read as a filesystem store's are:
 * past the page cache, where LMDB's commit copies every page into it). */
#define CLAIMS_FILE_MIN (4u * CLAIMS_CHUNK)

/* Where a vhost's payloads go (copied: rules may be reloaded meanwhile). */
enum claims_type { CLAIMS_LMDB, CLAIMS_FILESYSTEM, CLAIMS_S3 };

struct claims_where {
	enum claims_type type;
	char name[300];   /* LMDB: the database name; filesystem: the directory */
	char files[300];  /* LMDB: the directory of its large payloads ("": none) */
	char bucket[64];  /* S3: the bucket */
	char prefix[256]; /* S3: put before the key to name the object */
};

void claims_init(struct state *st);
/* The store of vhost under rule cc. */
void claims_where(struct claims_where *out, const char *vhost,
		  const struct rules_claim_check *cc);
/* Only the form claims_key_new issues: 32 lowercase hex digits. */
int claims_key_valid(const uint8_t *key, size_t len);
/* The backend's name: "lmdb", "filesystem" or "s3". */
const char *claims_store_name(const struct claims_where *where);

/* ---- writing a payload ---- */

struct claims_upload;
/* progress: chunks became durable (or failed); done: the whole payload is
 * durable (rc 0) or not (rc < 0), the last callback: the upload is freed
 * after it. Both run on w's loop, never after claims_upload_abandon
 * (which a callback may call). */
struct claims_upload *claims_upload_begin(const struct claims_where *where, struct worker *w,
					  void (*progress)(void *arg),
					  void (*done)(void *arg, int rc), void *arg);
/* Append payload bytes (copied). -1 when the upload already failed. */
int claims_upload_write(struct claims_upload *u, const void *data, size_t len);
/* No more bytes: make the payload durable under its key, then done().
 * -1 when the upload failed already or could not be handed over: then no
 * callback comes, and the owner abandons it. */
int claims_upload_finish(struct claims_upload *u);
/* Only inside done(): the payload is not wanted after all; it is removed. */
void claims_upload_discard(struct claims_upload *u);
/* The message's content type, for stores that keep it with the payload
 * (before the first write). */
void claims_upload_set_type(struct claims_upload *u, const void *type, size_t len);
/* Bytes handed over and not yet durable. */
size_t claims_upload_pending(const struct claims_upload *u);
/* The backlog is at the store's high mark: pause the writer; then, below
 * its low mark: go on. */
int claims_upload_congested(const struct claims_upload *u);
int claims_upload_relieved(const struct claims_upload *u);
const char *claims_upload_key(const struct claims_upload *u);
int claims_upload_failed(const struct claims_upload *u);
/* The owner lets go: no more callbacks; an unfinished payload is removed;
 * the memory goes when the last store operation has returned. */
void claims_upload_abandon(struct claims_upload *u);

/* Store operations handed out and not yet completed (shutdown waits for
 * them, running the workers' posted completions, before the store goes). */
long claims_busy(void);

/* ---- reading a payload ---- */

struct claims_read;
/* opened: rc 0 and the payload's size, STATE_NOTFOUND-like rc 1 when the
 * key is not in the store, rc < 0 on an error. chunk: the next piece
 * (len 0 at the end), rc < 0 on an error. Run on w's loop. */
struct claims_read *
claims_read_open(const struct claims_where *where, struct worker *w, const char *key,
		 void (*opened)(void *arg, int rc, uint64_t size),
		 void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len), void *arg);
/* Ask for the next chunk (after opened, and after each chunk). */
void claims_read_next(struct claims_read *r);
/* Only in a chunk callback: the chunk's memory becomes the caller's, to be
 * let go with claims_kept_free (on any thread) once it is written out.
 * NULL when the backend cannot give it: then data is the store's until
 * the callback returns. */
void *claims_read_keep(struct claims_read *r);
void claims_kept_free(void *kept);
void claims_read_abandon(struct claims_read *r);

/* ---- retention ---- */

/* What a purge removed: whole payloads, and what uploads a crash cut
 * short left (LMDB chunks without their meta record; .partial files of a
 * filesystem store, or of an LMDB store's large payloads), with their
 * bytes. */
struct claims_purged {
	long payloads;
	uint64_t payload_bytes;
	long partial; /* LMDB chunks */
	uint64_t partial_bytes;
	long partial_files;
	uint64_t partial_file_bytes;
};

/* Blocking (never on a worker's loop): remove payloads older than
 * retention_s (0: keep them). With orphans (only before any upload can
 * start) also the chunks of uploads a crash cut short (a filesystem
 * store's partial files go once an hour old, start or not). Returns 0 and
 * fills *out (may be NULL), or -1. */
int claims_purge(const struct claims_where *where, long retention_s, int orphans,
		 struct claims_purged *out);

/* ---- operator views ---- */

/* Blocking (admin thread or a jobs thread): is key there, how big, how old. */
int claims_stat(const struct claims_where *where, const char *key, uint64_t *size,
		uint64_t *created_ms);

#endif
