/* sigv4: AWS Signature Version 4 (canonical request, string to sign,
 * derived key, Authorization header) with OpenSSL's SHA-256 and HMAC. */
#include "sigv4.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIGV4_ALGORITHM "AWS4-HMAC-SHA256"

/* A string that grows; on no memory it stays failed. */
struct sigv4_buf {
	char *s;
	size_t len, cap;
	int failed;
};

static void sigv4_add(struct sigv4_buf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->s, cap);
		if (p == NULL) {
			b->failed = 1;
			return;
		}
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = 0;
}

static void sigv4_adds(struct sigv4_buf *b, const char *s)
{
	sigv4_add(b, s, strlen(s));
}

static char *sigv4_take(struct sigv4_buf *b)
{
	if (b->failed) {
		free(b->s);
		return NULL;
	}
	if (b->s == NULL)
		return strdup("");
	return b->s;
}

size_t sigv4_encode(char *out, size_t outlen, const char *in, size_t len, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t i, n = 0;

	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)in[i];
		int plain = isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
			    (keep_slash && c == '/');

		if (plain) {
			if (n + 1 < outlen)
				out[n] = (char)c;
			n++;
		} else {
			if (n + 3 < outlen) {
				out[n] = '%';
				out[n + 1] = hex[c >> 4];
				out[n + 2] = hex[c & 15];
			}
			n += 3;
		}
	}
	if (outlen > 0)
		out[n < outlen ? n : outlen - 1] = 0;
	return n;
}

static char *sigv4_encoded(const char *s)
{
	size_t n = sigv4_encode(NULL, 0, s, strlen(s), 0);
	char *out = malloc(n + 1);

	if (out)
		sigv4_encode(out, n + 1, s, strlen(s), 0);
	return out;
}

struct sigv4_pair {
	char *name, *value; /* encoded; value NULL: none */
};

static int sigv4_pair_cmp(const void *a, const void *b)
{
	const struct sigv4_pair *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c != 0)
		return c;
	return strcmp(x->value ? x->value : "", y->value ? y->value : "");
}

char *sigv4_query_string(const struct sigv4_param *q, int n, int canonical)
{
	struct sigv4_pair *p = n > 0 ? calloc((size_t)n, sizeof(*p)) : NULL;
	struct sigv4_buf b = {0};
	int i;

	if (n > 0 && p == NULL)
		return NULL;
	for (i = 0; i < n; i++) {
		p[i].name = sigv4_encoded(q[i].name);
		p[i].value = q[i].value ? sigv4_encoded(q[i].value) : NULL;
		if (p[i].name == NULL || (q[i].value && p[i].value == NULL))
			b.failed = 1;
	}
	if (!b.failed && n > 1)
		qsort(p, (size_t)n, sizeof(*p), sigv4_pair_cmp);
	for (i = 0; i < n && !b.failed; i++) {
		if (i > 0)
			sigv4_add(&b, "&", 1);
		sigv4_adds(&b, p[i].name);
		/* Canonically a parameter always has "=", even without a value. */
		if (p[i].value || canonical)
			sigv4_add(&b, "=", 1);
		if (p[i].value)
			sigv4_adds(&b, p[i].value);
	}
	for (i = 0; i < n; i++) {
		free(p[i].name);
		free(p[i].value);
	}
	free(p);
	return sigv4_take(&b);
}

static void sigv4_hex(char *out, const unsigned char *d, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t i;

	for (i = 0; i < n; i++) {
		out[2 * i] = hex[d[i] >> 4];
		out[2 * i + 1] = hex[d[i] & 15];
	}
	out[2 * n] = 0;
}

void sigv4_sha256_hex(char out[SIGV4_HASH_LEN + 1], const void *data, size_t len)
{
	unsigned char d[SHA256_DIGEST_LENGTH];

	SHA256(data, len, d);
	sigv4_hex(out, d, sizeof(d));
}

void sigv4_date(char out[SIGV4_DATE_LEN + 1], time_t t)
{
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(out, SIGV4_DATE_LEN + 1, "%Y%m%dT%H%M%SZ", &tm);
}

struct sigv4_hdr {
	char *name; /* lowercase */
	char *value;
};

static int sigv4_hdr_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sigv4_hdr *)a)->name, ((const struct sigv4_hdr *)b)->name);
}

/* The headers, lowercased, trimmed, sorted; and the signed-headers list. */
static struct sigv4_hdr *sigv4_headers(const struct sigv4_request *req)
{
	struct sigv4_hdr *h = calloc((size_t)req->nheaders + 1, sizeof(*h));
	int i;

	if (h == NULL)
		return NULL;
	for (i = 0; i < req->nheaders; i++) {
		const char *v = req->headers[i].value;
		size_t j, n = 0, len;
		int space = 0;

		h[i].name = strdup(req->headers[i].name);
		len = strlen(v);
		h[i].value = malloc(len + 1);
		if (h[i].name == NULL || h[i].value == NULL)
			goto fail;
		for (j = 0; h[i].name[j]; j++)
			h[i].name[j] = (char)tolower((unsigned char)h[i].name[j]);
		while (*v == ' ' || *v == '\t')
			v++;
		for (j = 0; v[j]; j++) {
			if (v[j] == ' ' || v[j] == '\t') {
				space = 1;
				continue;
			}
			if (space && n > 0)
				h[i].value[n++] = ' ';
			space = 0;
			h[i].value[n++] = v[j];
		}
		h[i].value[n] = 0;
	}
	qsort(h, (size_t)req->nheaders, sizeof(*h), sigv4_hdr_cmp);
	return h;
fail:
	for (i = 0; i < req->nheaders; i++) {
		free(h[i].name);
		free(h[i].value);
	}
	free(h);
	return NULL;
}

static void sigv4_headers_free(struct sigv4_hdr *h, int n)
{
	int i;

	for (i = 0; h && i < n; i++) {
		free(h[i].name);
		free(h[i].value);
	}
	free(h);
}

static void sigv4_signed_list(struct sigv4_buf *b, const struct sigv4_hdr *h, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		if (i > 0)
			sigv4_add(b, ";", 1);
		sigv4_adds(b, h[i].name);
	}
}

char *sigv4_canonical_request(const struct sigv4_request *req)
{
	struct sigv4_hdr *h = sigv4_headers(req);
	char *query = sigv4_query_string(req->query, req->nquery, 1);
	struct sigv4_buf b = {0};
	int i;

	if (h == NULL || query == NULL) {
		sigv4_headers_free(h, req->nheaders);
		free(query);
		return NULL;
	}
	sigv4_adds(&b, req->method);
	sigv4_add(&b, "\n", 1);
	sigv4_adds(&b, req->path && req->path[0] ? req->path : "/");
	sigv4_add(&b, "\n", 1);
	sigv4_adds(&b, query);
	sigv4_add(&b, "\n", 1);
	for (i = 0; i < req->nheaders; i++) {
		sigv4_adds(&b, h[i].name);
		sigv4_add(&b, ":", 1);
		sigv4_adds(&b, h[i].value);
		sigv4_add(&b, "\n", 1);
	}
	sigv4_add(&b, "\n", 1);
	sigv4_signed_list(&b, h, req->nheaders);
	sigv4_add(&b, "\n", 1);
	sigv4_adds(&b, req->payload_hash);
	sigv4_headers_free(h, req->nheaders);
	free(query);
	return sigv4_take(&b);
}

static int sigv4_hmac(unsigned char out[32], const void *key, size_t klen, const char *msg)
{
	unsigned int n = 32;

	return HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out,
		    &n) != NULL
		   ? 0
		   : -1;
}

int sigv4_authorization(char *out, size_t outlen, const struct sigv4_key *key,
			const char *amz_date, const struct sigv4_request *req)
{
	char *canonical = sigv4_canonical_request(req);
	char chash[SIGV4_HASH_LEN + 1], day[9], scope[256], sig[SIGV4_HASH_LEN + 1];
	struct sigv4_buf sts = {0}, list = {0};
	unsigned char k[32];
	struct sigv4_hdr *h;
	char *secret;
	size_t slen;
	int rc = -1, n;

	if (canonical == NULL || strlen(amz_date) != SIGV4_DATE_LEN)
		goto out;
	sigv4_sha256_hex(chash, canonical, strlen(canonical));
	memcpy(day, amz_date, 8);
	day[8] = 0;
	n = snprintf(scope, sizeof(scope), "%s/%s/%s/aws4_request", day, key->region,
		     key->service);
	if (n < 0 || (size_t)n >= sizeof(scope))
		goto out;
	sigv4_adds(&sts, SIGV4_ALGORITHM "\n");
	sigv4_adds(&sts, amz_date);
	sigv4_add(&sts, "\n", 1);
	sigv4_adds(&sts, scope);
	sigv4_add(&sts, "\n", 1);
	sigv4_adds(&sts, chash);
	if (sts.failed)
		goto out;
	/* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" secret, day), region), service),
	 * "aws4_request") */
	slen = strlen(key->secret_key) + 4;
	secret = malloc(slen + 1);
	if (secret == NULL)
		goto out;
	snprintf(secret, slen + 1, "AWS4%s", key->secret_key);
	n = sigv4_hmac(k, secret, slen, day);
	OPENSSL_cleanse(secret, slen);
	free(secret);
	if (n != 0 || sigv4_hmac(k, k, 32, key->region) != 0 ||
	    sigv4_hmac(k, k, 32, key->service) != 0 ||
	    sigv4_hmac(k, k, 32, "aws4_request") != 0 || sigv4_hmac(k, k, 32, sts.s) != 0)
		goto out;
	sigv4_hex(sig, k, 32);
	h = sigv4_headers(req);
	if (h == NULL)
		goto out;
	sigv4_signed_list(&list, h, req->nheaders);
	sigv4_headers_free(h, req->nheaders);
	if (list.failed)
		goto out;
	n = snprintf(out, outlen,
		     SIGV4_ALGORITHM " Credential=%s/%s, SignedHeaders=%s, Signature=%s",
		     key->access_key, scope, list.s ? list.s : "", sig);
	rc = n >= 0 && (size_t)n < outlen ? 0 : -1;
out:
	OPENSSL_cleanse(k, sizeof(k));
	free(canonical);
	free(sts.s);
	free(list.s);
	return rc;
}
