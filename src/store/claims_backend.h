/* claims_backend: what a claim store backend provides to the front in
 * claims.c (LMDB and filesystem in claims_local.c, S3 in claims_s3.c).
 * Every backend's upload and read begin with the heads below, so the
 * front dispatches on them; the pattern sees only claims.h. */
#ifndef ACEMQ_CLAIMS_BACKEND_H
#define ACEMQ_CLAIMS_BACKEND_H

#include "claims.h"

struct claims_backend;

struct claims_upload {
	const struct claims_backend *be;
	char key[CLAIMS_KEY_LEN + 1];
	char content_type[256]; /* the message's, for stores that keep one */
	void (*progress)(void *arg);
	void (*done)(void *arg, int rc);
	void *arg;
};

struct claims_read {
	const struct claims_backend *be;
};

struct claims_backend {
	const char *name; /* as rules and GET /claims say it */
	/* Allocate an upload whose head the front fills in (key, callbacks). */
	struct claims_upload *(*upload_new)(const struct claims_where *where, struct worker *w);
	int (*upload_write)(struct claims_upload *u, const void *data, size_t len);
	int (*upload_finish)(struct claims_upload *u);
	void (*upload_discard)(struct claims_upload *u);
	size_t (*upload_pending)(const struct claims_upload *u);
	int (*upload_failed)(const struct claims_upload *u);
	void (*upload_abandon)(struct claims_upload *u);
	/* The backlog (pending bytes) at which the writer pauses, and below
	 * which it goes on. */
	size_t (*upload_high)(void);
	size_t (*upload_low)(void);
	struct claims_read *(*read_open)(
	    const struct claims_where *where, struct worker *w, const char *key,
	    void (*opened)(void *arg, int rc, uint64_t size),
	    void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len), void *arg);
	void (*read_next)(struct claims_read *r);
	void *(*read_keep)(struct claims_read *r); /* NULL: chunks are copied */
	void (*read_abandon)(struct claims_read *r);
	int (*purge)(const struct claims_where *where, long retention_s, int orphans,
		     struct claims_purged *out);
	int (*stat)(const struct claims_where *where, const char *key, uint64_t *size,
		    uint64_t *created_ms);
};

extern const struct claims_backend claims_lmdb_backend;
extern const struct claims_backend claims_fs_backend;
extern const struct claims_backend claims_s3_backend;

/* Store operations in flight (shutdown waits for them). */
void claims_busy_add(long n);
/* Keys of the uploads in progress in this process. */
void claims_active_add(const char *key);
void claims_active_remove(const char *key);
int claims_active_has(const void *key);
/* The state layer (LMDB), NULL when it could not be opened. */
struct state *claims_state_get(void);

#endif
