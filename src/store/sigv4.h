/* sigv4: AWS Signature Version 4 for the S3 store's requests, computed with
 * OpenSSL (SHA-256, HMAC-SHA256): the canonical request, the string to
 * sign, the derived key and the Authorization header. No I/O. */
#ifndef ACEMQ_SIGV4_H
#define ACEMQ_SIGV4_H

#include <stddef.h>
#include <time.h>

#define SIGV4_DATE_LEN 16 /* 20130524T000000Z */
#define SIGV4_HASH_LEN 64 /* lowercase hex SHA-256 */

/* A query parameter, unencoded. value NULL: a parameter without a value
 * (`?uploads`), canonically "uploads=". */
struct sigv4_param {
	const char *name;
	const char *value;
};

/* A header that is signed (name in any case; the value is trimmed and its
 * runs of spaces collapsed, as the canonical form asks). */
struct sigv4_header {
	const char *name;
	const char *value;
};

struct sigv4_request {
	const char *method;
	const char *path; /* the URI path exactly as sent (already encoded) */
	const struct sigv4_param *query;
	int nquery;
	const struct sigv4_header *headers; /* host, x-amz-date, ... */
	int nheaders;
	const char *payload_hash; /* hex SHA-256 of the body, or UNSIGNED-PAYLOAD */
};

struct sigv4_key {
	const char *access_key;
	const char *secret_key;
	const char *region;
	const char *service; /* "s3" */
};

/* The percent-encoding SigV4 asks for: unreserved bytes (A-Z a-z 0-9 - _
 * . ~) as they are, every other byte %XX in upper case; '/' kept when
 * keep_slash. Returns the encoded length (out NUL-terminated when it fits
 * in outlen), so a caller may ask with outlen 0 first. */
size_t sigv4_encode(char *out, size_t outlen, const char *in, size_t len, int keep_slash);
/* The query string as sent: encoded name=value pairs in canonical order
 * (by name, then value), a parameter without a value as its name alone.
 * malloc'd; NULL on no memory. */
char *sigv4_query_string(const struct sigv4_param *q, int n, int canonical);
void sigv4_sha256_hex(char out[SIGV4_HASH_LEN + 1], const void *data, size_t len);
/* x-amz-date of t: YYYYMMDDTHHMMSSZ. */
void sigv4_date(char out[SIGV4_DATE_LEN + 1], time_t t);
/* The canonical request (malloc'd), for tests and debugging. */
char *sigv4_canonical_request(const struct sigv4_request *req);
/* The Authorization header's value for req at amz_date. 0, or -1 when out
 * is too small or memory ran out. */
int sigv4_authorization(char *out, size_t outlen, const struct sigv4_key *key,
			const char *amz_date, const struct sigv4_request *req);

#endif
