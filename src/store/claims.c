/* claims: the claim store's front: keys, where a vhost's payloads go, and
 * each call handed to the vhost's backend (LMDB, filesystem or S3). */
#include "claims.h"

#include "../rules.h"
#include "claims_backend.h"
#include "state.h"

#include <openssl/rand.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct state *claims_state;
static atomic_long claims_outstanding; /* store operations not yet completed */

/* Keys of the uploads in progress, so a purge leaves their parts be. */
static pthread_mutex_t claims_active_lock = PTHREAD_MUTEX_INITIALIZER;
static char (*claims_active)[CLAIMS_KEY_LEN + 1];
static size_t claims_nactive, claims_capactive;

void claims_active_add(const char *key)
{
	pthread_mutex_lock(&claims_active_lock);
	if (claims_nactive == claims_capactive) {
		size_t n = claims_capactive ? claims_capactive * 2 : 64;
		void *p = realloc(claims_active, n * sizeof(*claims_active));

		if (p) {
			claims_active = p;
			claims_capactive = n;
		}
	}
	if (claims_nactive < claims_capactive)
		memcpy(claims_active[claims_nactive++], key, CLAIMS_KEY_LEN + 1);
	pthread_mutex_unlock(&claims_active_lock);
}

void claims_active_remove(const char *key)
{
	size_t i;

	pthread_mutex_lock(&claims_active_lock);
	for (i = 0; i < claims_nactive; i++)
		if (memcmp(claims_active[i], key, CLAIMS_KEY_LEN) == 0) {
			memcpy(claims_active[i], claims_active[--claims_nactive],
			       CLAIMS_KEY_LEN + 1);
			break;
		}
	pthread_mutex_unlock(&claims_active_lock);
}

int claims_active_has(const void *key)
{
	size_t i;
	int found = 0;

	pthread_mutex_lock(&claims_active_lock);
	for (i = 0; i < claims_nactive && !found; i++)
		found = memcmp(claims_active[i], key, CLAIMS_KEY_LEN) == 0;
	pthread_mutex_unlock(&claims_active_lock);
	return found;
}

void claims_busy_add(long n)
{
	atomic_fetch_add(&claims_outstanding, n);
}

long claims_busy(void)
{
	return atomic_load(&claims_outstanding);
}

void claims_init(struct state *st)
{
	claims_state = st;
}

struct state *claims_state_get(void)
{
	return claims_state;
}

/* An LMDB store's directory for its large payloads: data_dir/claims/ and
 * the vhost's name in hex (any byte may be in a vhost's name), or its
 * SHA-256 when that is long. Empty when there is no state or no room. */
static void claims_files_dir(char *out, size_t len, const char *vhost)
{
	const char *dir = state_dir(claims_state);
	unsigned char sum[SHA256_DIGEST_LENGTH];
	const unsigned char *name = (const unsigned char *)vhost;
	char hex[2 * SHA256_DIGEST_LENGTH + 8], *h = hex;
	size_t n = strlen(vhost), i;
	int k;

	out[0] = '\0';
	if (dir == NULL)
		return;
	if (n > SHA256_DIGEST_LENGTH) {
		SHA256(name, n, sum);
		name = sum;
		n = sizeof(sum);
		h += snprintf(hex, sizeof(hex), "sha-");
	}
	for (i = 0; i < n; i++)
		h += snprintf(h, 3, "%02x", name[i]);
	k = snprintf(out, len, "%s/claims/%s", dir, hex);
	if (k < 0 || (size_t)k >= len)
		out[0] = '\0'; /* no room: the payloads stay in LMDB */
}

void claims_where(struct claims_where *out, const char *vhost,
		  const struct rules_claim_check *cc)
{
	memset(out, 0, sizeof(*out));
	switch (cc->store) {
	case RULES_STORE_FILESYSTEM:
		out->type = CLAIMS_FILESYSTEM;
		snprintf(out->name, sizeof(out->name), "%s",
			 cc->store_path ? cc->store_path : ".");
		break;
	case RULES_STORE_S3:
		out->type = CLAIMS_S3;
		snprintf(out->bucket, sizeof(out->bucket), "%s",
			 cc->store_bucket ? cc->store_bucket : "");
		snprintf(out->prefix, sizeof(out->prefix), "%s",
			 cc->store_prefix ? cc->store_prefix : "");
		break;
	case RULES_STORE_LMDB:
		out->type = CLAIMS_LMDB;
		snprintf(out->name, sizeof(out->name), "claims/%s", vhost);
		claims_files_dir(out->files, sizeof(out->files), vhost);
		break;
	}
}

static const struct claims_backend *claims_backend_of(const struct claims_where *where)
{
	switch (where->type) {
	case CLAIMS_FILESYSTEM:
		return &claims_fs_backend;
	case CLAIMS_S3:
		return &claims_s3_backend;
	case CLAIMS_LMDB:
		break;
	}
	return &claims_lmdb_backend;
}

const char *claims_store_name(const struct claims_where *where)
{
	return claims_backend_of(where)->name;
}

int claims_key_valid(const uint8_t *key, size_t len)
{
	size_t i;

	if (len != CLAIMS_KEY_LEN)
		return 0;
	for (i = 0; i < len; i++)
		if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f')))
			return 0;
	return 1;
}

static int claims_key_new(char out[CLAIMS_KEY_LEN + 1])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t r[CLAIMS_KEY_LEN / 2];
	int i;

	if (RAND_bytes(r, sizeof(r)) != 1)
		return -1;
	for (i = 0; i < (int)sizeof(r); i++) {
		out[2 * i] = hex[r[i] >> 4];
		out[2 * i + 1] = hex[r[i] & 15];
	}
	out[CLAIMS_KEY_LEN] = 0;
	return 0;
}

/* ---- uploads ------------------------------------------------------------ */

struct claims_upload *claims_upload_begin(const struct claims_where *where, struct worker *w,
					  void (*progress)(void *arg),
					  void (*done)(void *arg, int rc), void *arg)
{
	char key[CLAIMS_KEY_LEN + 1];
	struct claims_upload *u;

	if (claims_key_new(key) != 0)
		return NULL;
	u = claims_backend_of(where)->upload_new(where, w);
	if (u == NULL)
		return NULL;
	u->be = claims_backend_of(where);
	memcpy(u->key, key, sizeof(key));
	u->progress = progress;
	u->done = done;
	u->arg = arg;
	claims_active_add(u->key);
	return u;
}

void claims_upload_set_type(struct claims_upload *u, const void *type, size_t len)
{
	const uint8_t *t = type;
	size_t i;

	/* It becomes an HTTP header: printable ASCII only, else none. */
	u->content_type[0] = 0;
	if (len >= sizeof(u->content_type))
		return;
	for (i = 0; i < len; i++)
		if (t[i] < 0x20 || t[i] > 0x7e)
			return;
	if (len)
		memcpy(u->content_type, type, len);
	u->content_type[len] = 0;
}

int claims_upload_write(struct claims_upload *u, const void *data, size_t len)
{
	return u->be->upload_write(u, data, len);
}

int claims_upload_finish(struct claims_upload *u)
{
	return u->be->upload_finish(u);
}

void claims_upload_discard(struct claims_upload *u)
{
	u->be->upload_discard(u);
}

size_t claims_upload_pending(const struct claims_upload *u)
{
	return u->be->upload_pending(u);
}

int claims_upload_congested(const struct claims_upload *u)
{
	return u->be->upload_pending(u) >= u->be->upload_high();
}

int claims_upload_relieved(const struct claims_upload *u)
{
	return u->be->upload_pending(u) <= u->be->upload_low();
}

const char *claims_upload_key(const struct claims_upload *u)
{
	return u->key;
}

int claims_upload_failed(const struct claims_upload *u)
{
	return u->be->upload_failed(u);
}

void claims_upload_abandon(struct claims_upload *u)
{
	if (u)
		u->be->upload_abandon(u);
}

/* ---- reads, retention, lookups ----------------------------------------------- */

struct claims_read *
claims_read_open(const struct claims_where *where, struct worker *w, const char *key,
		 void (*opened)(void *arg, int rc, uint64_t size),
		 void (*chunk)(void *arg, int rc, const uint8_t *data, size_t len), void *arg)
{
	struct claims_read *r =
	    claims_backend_of(where)->read_open(where, w, key, opened, chunk, arg);

	if (r)
		r->be = claims_backend_of(where);
	return r;
}

void claims_read_next(struct claims_read *r)
{
	r->be->read_next(r);
}

void *claims_read_keep(struct claims_read *r)
{
	return r->be->read_keep ? r->be->read_keep(r) : NULL;
}

void claims_read_abandon(struct claims_read *r)
{
	if (r)
		r->be->read_abandon(r);
}

int claims_purge(const struct claims_where *where, long retention_s, int orphans,
		 struct claims_purged *out)
{
	struct claims_purged none;

	if (out == NULL)
		out = &none;
	memset(out, 0, sizeof(*out));
	return claims_backend_of(where)->purge(where, retention_s, orphans, out);
}

int claims_stat(const struct claims_where *where, const char *key, uint64_t *size,
		uint64_t *created_ms)
{
	if (!claims_key_valid((const uint8_t *)key, strlen(key)))
		return 1;
	return claims_backend_of(where)->stat(where, key, size, created_ms);
}
