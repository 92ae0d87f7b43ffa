/* s3: requests to an S3-compatible object store, signed (sigv4) and sent
 * with libcurl's multi interface from one thread of their own; connections
 * are kept alive and reused. A request's completion is posted to the
 * worker that asked, or (s3_run) waited for by a thread that may block.
 * 5xx answers and transport errors are retried, a bounded number of
 * times, with a growing pause. */
#ifndef ACEMQ_S3_H
#define ACEMQ_S3_H

#include "../worker.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct config;

#define S3_MAX_QUERY 6

struct s3_settings {
	char *endpoint; /* scheme://host[:port]; empty: https://s3.REGION.amazonaws.com */
	char *region;
	char *access_key;
	char *secret_key;
	char *ca;       /* CA file for TLS; empty: the system's */
	int path_style; /* -1: on for a custom endpoint */
	long timeout_ms;
	size_t part_size;
};

/* Copy the settings (before any request; never on a running proxy). */
void s3_configure(const struct s3_settings *s);
/* The settings from the configuration table. */
void s3_configure_from(const struct config *cfg);
size_t s3_part_size(void);
/* Stop the thread (if started) once nothing is in flight. */
void s3_stop(void);

struct s3_req {
	struct worker_call call; /* with w: fn runs on w's loop once done */
	struct worker *w;        /* NULL: s3_run waits for it */
	/* ---- the request ---- */
	const char *method; /* GET, PUT, HEAD, DELETE, POST */
	char bucket[64];
	char *key; /* the object key, unencoded; NULL: the bucket itself */
	struct {
		char *name, *value; /* value NULL: a parameter without one */
	} query[S3_MAX_QUERY];
	int nquery;
	char content_type[256]; /* empty: none */
	int ranged;
	uint64_t range_from, range_to; /* inclusive */
	const uint8_t *body;           /* PUT/POST body (not owned), body_len bytes */
	size_t body_len;
	long timeout_ms; /* 0: s3_timeout_ms; else the shorter of the two */
	uint8_t *out;    /* a 2xx GET's bytes go here, at most out_cap */
	size_t out_cap;
	/* ---- the answer ---- */
	long status; /* HTTP status; 0: no answer (curl_error says why) */
	char curl_error[128];
	size_t out_len;
	char *text; /* any other answer body (XML), NUL-terminated, bounded */
	size_t text_len;
	char etag[130];
	uint64_t content_length;
	uint64_t total; /* from Content-Range */
	time_t last_modified;
	int attempts;
	/* ---- the thread's own ---- */
	void *easy;
	void *headers;
	size_t sent;
	uint64_t not_before_ms;
	uint64_t deadline_ms; /* s3_timeout_ms after the first attempt */
	int done;
	int overflow;
	struct s3_req *next;
};

/* Set up r for method on bucket/key (key copied; NULL: none). */
void s3_req_init(struct s3_req *r, const char *method, const char *bucket, const char *key);
/* Add a query parameter (copied; value NULL: none). -1 on no room/memory. */
int s3_req_query(struct s3_req *r, const char *name, const char *value);
/* Free what the request owns (key, query, answer text), not r itself. */
void s3_req_clear(struct s3_req *r);

/* Send r; its completion is posted to r->w. */
void s3_submit(struct s3_req *r);
/* Send r and wait for its answer (never on a worker's loop). */
void s3_run(struct s3_req *r);
/* Wait for r, submitted with w NULL, to be answered. */
void s3_run_wait(struct s3_req *r);
/* 2xx answered. */
int s3_ok(const struct s3_req *r);

/* The path a request for key (NULL: the bucket) in bucket is sent to and
 * signed with: /BUCKET/KEY in path style, else /KEY; the key encoded as
 * SigV4 asks, '/' kept. malloc'd. */
char *s3_request_path(const char *bucket, const char *key, int path_style);

/* The text of the first <tag>...</tag> at or after from in xml (entities
 * decoded) into out; returns a pointer past the closing tag or NULL. */
const char *s3_xml_get(const char *xml, const char *tag, char *out, size_t outlen);

#endif
