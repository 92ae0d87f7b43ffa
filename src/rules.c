/* rules: the per-vhost rules files, parsed, validated and compiled once. */
#include "rules.h"

#include "surplus.h"

#include "topic.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RULES_MAX_FILE (1024 * 1024)

struct rules_ctx {
	const char *file;
	FILE *err;
	int nerrors;
};

static uint64_t rules_generation;
static int rules_postgresql;
static int rules_upstream_proxy; /* upstream_proxy_protocol is on */

static void rules_error(struct rules_ctx *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rules_error(struct rules_ctx *c, const char *key, const char *fmt, ...)
{
	va_list ap;

	fprintf(c->err, "%s: %s: ", c->file, key);
	va_start(ap, fmt);
	vfprintf(c->err, fmt, ap);
	va_end(ap);
	fputc('\n', c->err);
	c->nerrors++;
}

/* Refuse keys of obj that are not in allowed (NULL-terminated). */
static void rules_known_keys(struct rules_ctx *c, const cJSON *obj, const char *path,
			     const char *const *allowed)
{
	const cJSON *it;
	char key[256];
	int i, ok;

	cJSON_ArrayForEach (it, obj) {
		ok = 0;
		for (i = 0; allowed[i]; i++)
			if (strcmp(it->string, allowed[i]) == 0)
				ok = 1;
		if (!ok) {
			snprintf(key, sizeof(key), "%s%s%s", path, path[0] ? "." : "",
				 it->string);
			rules_error(c, key, "unknown key");
		}
	}
}

static void rules_path(char *out, size_t len, const char *path, const char *key)
{
	snprintf(out, len, "%s%s%s", path, path[0] && key[0] != '[' ? "." : "", key);
}

static int rules_bool(struct rules_ctx *c, const cJSON *obj, const char *path, const char *name,
		      int def)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	char key[256];

	if (v == NULL)
		return def;
	if (!cJSON_IsBool(v)) {
		rules_path(key, sizeof(key), path, name);
		rules_error(c, key, "must be true or false");
		return def;
	}
	return cJSON_IsTrue(v);
}

static long rules_int(struct rules_ctx *c, const cJSON *obj, const char *path, const char *name,
		      long def, long min, long max)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	char key[256];
	double d;

	if (v == NULL)
		return def;
	rules_path(key, sizeof(key), path, name);
	if (!cJSON_IsNumber(v)) {
		rules_error(c, key, "must be a number");
		return def;
	}
	d = v->valuedouble;
	if (d != (double)(long)d) {
		rules_error(c, key, "must be a whole number");
		return def;
	}
	if ((long)d < min || (long)d > max) {
		rules_error(c, key, "%ld is out of range %ld..%ld", (long)d, min, max);
		return def;
	}
	return (long)d;
}

/* A string member: NULL when absent (or wrong, with an error). */
static char *rules_string(struct rules_ctx *c, const cJSON *obj, const char *path,
			  const char *name, int required)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	char key[256];

	rules_path(key, sizeof(key), path, name);
	if (v == NULL) {
		if (required)
			rules_error(c, key, "is required");
		return NULL;
	}
	if (!cJSON_IsString(v)) {
		rules_error(c, key, "must be a string");
		return NULL;
	}
	return strdup(v->valuestring);
}

static const cJSON *rules_object(struct rules_ctx *c, const cJSON *obj, const char *path,
				 const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	char key[256];

	if (v == NULL)
		return NULL;
	if (!cJSON_IsObject(v)) {
		rules_path(key, sizeof(key), path, name);
		rules_error(c, key, "must be an object");
		return NULL;
	}
	return v;
}

static void rules_matchlist_free(struct rules_matchlist *m)
{
	int i;

	for (i = 0; i < m->n; i++) {
		free(m->v[i].exchange);
		topic_free(m->v[i].rk);
	}
	free(m->v);
	m->v = NULL;
	m->n = 0;
}

static void rules_parse_match(struct rules_ctx *c, const cJSON *obj, const char *path,
			      struct rules_matchlist *out)
{
	static const char *const keys[] = {"exchange", "routing_key", NULL};
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "match"), *it;
	char key[256], at[300];
	int i = 0;

	rules_path(key, sizeof(key), path, "match");
	if (list == NULL) {
		rules_error(c, key, "is required (a list of {exchange, routing_key})");
		return;
	}
	if (!cJSON_IsArray(list)) {
		rules_error(c, key, "must be a list");
		return;
	}
	out->v = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*out->v));
	cJSON_ArrayForEach (it, list) {
		struct rules_match *m = &out->v[out->n];
		char *ex, *rk;

		snprintf(at, sizeof(at), "%s[%d]", key, i++);
		if (!cJSON_IsObject(it)) {
			rules_error(c, at, "must be an object");
			continue;
		}
		rules_known_keys(c, it, at, keys);
		ex = rules_string(c, it, at, "exchange", 0);
		rk = rules_string(c, it, at, "routing_key", 0);
		if (ex && strcmp(ex, "*") == 0) {
			free(ex);
			ex = NULL;
		}
		m->exchange = ex;
		m->rk = rk ? topic_compile(rk) : NULL;
		free(rk);
		out->n++;
	}
}

/* {"type": "s3", "bucket": "...", "prefix": "claims/"}: a bucket name as S3
 * allows one (3-63 of a-z 0-9 . -); the prefix at most 255 bytes. */
static void rules_parse_s3_store(struct rules_ctx *c, const cJSON *store,
				 struct rules_claim_check *cc)
{
	const char *b;

	cc->store_bucket = rules_string(c, store, "claim_check.store", "bucket", 1);
	cc->store_prefix = rules_string(c, store, "claim_check.store", "prefix", 0);
	if (cc->store_prefix == NULL)
		cc->store_prefix = strdup("");
	b = cc->store_bucket;
	if (b && (strlen(b) < 3 || strlen(b) > 63 ||
		  strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789.-") != strlen(b)))
		rules_error(c, "claim_check.store.bucket", "'%s' is not a bucket name", b);
	if (cc->store_prefix && strlen(cc->store_prefix) > 255)
		rules_error(c, "claim_check.store.prefix", "longer than 255 bytes");
}

const char *rules_store_name(enum rules_store store)
{
	return store == RULES_STORE_S3           ? "s3"
	       : store == RULES_STORE_FILESYSTEM ? "filesystem"
						 : "lmdb";
}

static void rules_parse_claim_check(struct rules_ctx *c, const cJSON *obj,
				    struct rules_claim_check *cc)
{
	static const char *const keys[] = {"match",       "threshold",  "store",
					   "retention_s", "on_missing", NULL};
	static const char *const store_keys[] = {"type", "path", "bucket", "prefix", NULL};
	const cJSON *store;
	char *s;

	cc->enabled = 1;
	rules_known_keys(c, obj, "claim_check", keys);
	rules_parse_match(c, obj, "claim_check", &cc->match);
	cc->threshold = rules_int(c, obj, "claim_check", "threshold", 65536, 0, 2147483647L);
	cc->retention_s =
	    rules_int(c, obj, "claim_check", "retention_s", 2592000, 0, 100L * 365 * 86400);
	cc->store = RULES_STORE_LMDB;
	store = rules_object(c, obj, "claim_check", "store");
	if (store) {
		rules_known_keys(c, store, "claim_check.store", store_keys);
		s = rules_string(c, store, "claim_check.store", "type", 0);
		if (s && strcmp(s, "filesystem") == 0) {
			cc->store = RULES_STORE_FILESYSTEM;
			cc->store_path = rules_string(c, store, "claim_check.store", "path", 1);
			if (cc->store_path && cc->store_path[0] != '/')
				rules_error(c, "claim_check.store.path",
					    "must be an absolute path");
		} else if (s && strcmp(s, "s3") == 0) {
			cc->store = RULES_STORE_S3;
			rules_parse_s3_store(c, store, cc);
		} else if (s && strcmp(s, "lmdb") != 0) {
			rules_error(c, "claim_check.store.type",
				    "'%s' is not lmdb, filesystem or s3", s);
		} else if (cJSON_GetObjectItemCaseSensitive(store, "path")) {
			rules_error(c, "claim_check.store.path", "only for type filesystem");
		}
		if (cc->store != RULES_STORE_S3 &&
		    (cJSON_GetObjectItemCaseSensitive(store, "bucket") ||
		     cJSON_GetObjectItemCaseSensitive(store, "prefix")))
			rules_error(c, "claim_check.store",
				    "bucket and prefix are only for type s3");
		free(s);
	}
	cc->on_missing = RULES_MISSING_DEAD_LETTER;
	s = rules_string(c, obj, "claim_check", "on_missing", 0);
	if (s && strcmp(s, "pass") == 0)
		cc->on_missing = RULES_MISSING_PASS;
	else if (s && strcmp(s, "dead-letter") != 0)
		rules_error(c, "claim_check.on_missing", "'%s' is not dead-letter or pass", s);
	free(s);
}

static void rules_parse_schedule(struct rules_ctx *c, const cJSON *obj,
				 struct rules_schedule *sc)
{
	static const char *const keys[] = {"match", "header", "engine", NULL};

	sc->enabled = 1;
	rules_known_keys(c, obj, "schedule", keys);
	rules_parse_match(c, obj, "schedule", &sc->match);
	sc->header = rules_string(c, obj, "schedule", "header", 0);
	if (sc->header == NULL)
		sc->header = strdup("x-delay");
	else if (sc->header[0] == '\0')
		rules_error(c, "schedule.header", "must not be empty");
	sc->engine = rules_bool(c, obj, "schedule", "engine", 1);
}

void rules_set_postgresql(int configured)
{
	rules_postgresql = configured;
}

void rules_set_upstream_proxy(int on)
{
	rules_upstream_proxy = on;
}

/* "pool": broker connections shared by the vhost's clients (pool.c). */
static void rules_parse_pool(struct rules_ctx *c, const cJSON *obj, struct rules_pool *p)
{
	static const char *const keys[] = {"max_connections", "max_channels_per_connection",
					   "idle_s", "auth_ttl_s", NULL};

	rules_known_keys(c, obj, "pool", keys);
	p->enabled = 1;
	p->max_connections = rules_int(c, obj, "pool", "max_connections", 8, 1, 10000);
	p->max_channels =
	    rules_int(c, obj, "pool", "max_channels_per_connection", 512, 1, 2047);
	p->idle_s = rules_int(c, obj, "pool", "idle_s", 30, 0, 86400);
	p->auth_ttl_s = rules_int(c, obj, "pool", "auth_ttl_s", 60, 0, 86400);
	if (rules_upstream_proxy)
		rules_error(c, "pool",
			    "cannot be used with upstream_proxy_protocol: a pooled broker "
			    "connection carries many clients, so no one client's address");
}

/* "limits": a vhost's connection and publish rates (ratelimit.c). */
static void rules_parse_limits(struct rules_ctx *c, const cJSON *obj, struct rules_limits *l)
{
	static const char *const keys[] = {"connections_per_s", "publish_bytes_per_s", "mode",
					   NULL};
	char *mode;

	rules_known_keys(c, obj, "limits", keys);
	l->connections_per_s = rules_int(c, obj, "limits", "connections_per_s", 0, 0, 1000000);
	l->publish_bytes_per_s =
	    rules_int(c, obj, "limits", "publish_bytes_per_s", 0, 0, 100000000000L);
	mode = rules_string(c, obj, "limits", "mode", 0);
	if (mode && strcmp(mode, "alarm") == 0)
		l->alarm = 1;
	else if (mode && strcmp(mode, "enforce") != 0)
		rules_error(c, "limits.mode", "must be \"enforce\" or \"alarm\"");
	free(mode);
}

/* "store": {"type": "lmdb" | "postgresql"} of an idempotency entry or of
 * dedup_publish. */
static enum rules_keys_store rules_parse_keys_store(struct rules_ctx *c, const cJSON *obj,
						    const char *at)
{
	static const char *const keys[] = {"type", NULL};
	enum rules_keys_store out = RULES_KEYS_LMDB;
	const cJSON *store = rules_object(c, obj, at, "store");
	char path[96], *s;

	if (store == NULL)
		return out;
	snprintf(path, sizeof(path), "%s.store", at);
	rules_known_keys(c, store, path, keys);
	s = rules_string(c, store, path, "type", 0);
	snprintf(path, sizeof(path), "%s.store.type", at);
	if (s && strcmp(s, "postgresql") == 0) {
		out = RULES_KEYS_POSTGRESQL;
		if (!rules_postgresql)
			rules_error(c, path,
				    "postgresql needs the setting postgres_url (or "
				    "ACEMQ_PROXY_POSTGRES_URL), which is empty");
	} else if (s && strcmp(s, "lmdb") != 0) {
		rules_error(c, path, "'%s' is not lmdb or postgresql", s);
	}
	free(s);
	return out;
}

static void rules_parse_dedup_publish(struct rules_ctx *c, const cJSON *obj,
				      struct rules_dedup_publish *d)
{
	static const char *const keys[] = {"match", "header", "window_s", "store", NULL};

	d->enabled = 1;
	rules_known_keys(c, obj, "dedup_publish", keys);
	rules_parse_match(c, obj, "dedup_publish", &d->match);
	d->header = rules_string(c, obj, "dedup_publish", "header", 0);
	if (d->header == NULL)
		d->header = strdup("x-deduplication-header");
	else if (d->header[0] == '\0')
		rules_error(c, "dedup_publish.header", "must not be empty");
	else if (strlen(d->header) > 255)
		rules_error(c, "dedup_publish.header", "is longer than 255 bytes");
	d->window_s = rules_int(c, obj, "dedup_publish", "window_s", 3600, 1, 365L * 86400);
	d->store = rules_parse_keys_store(c, obj, "dedup_publish");
}

static void rules_parse_idempotency(struct rules_ctx *c, const cJSON *list,
				    struct rules_vhost *v)
{
	static const char *const keys[] = {
	    "queue",          "key",   "lease_s", "retention_s", "in_progress_delay_s",
	    "prefetch_ahead", "store", NULL};
	const cJSON *it;
	char at[64];
	int i = 0;

	if (!cJSON_IsArray(list)) {
		rules_error(c, "idempotency", "must be a list");
		return;
	}
	v->idempotency = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(*v->idempotency));
	cJSON_ArrayForEach (it, list) {
		struct rules_idempotency *d = &v->idempotency[v->nidempotency];
		char *key;

		snprintf(at, sizeof(at), "idempotency[%d]", i++);
		if (!cJSON_IsObject(it)) {
			rules_error(c, at, "must be an object");
			continue;
		}
		rules_known_keys(c, it, at, keys);
		d->queue = rules_string(c, it, at, "queue", 1);
		key = rules_string(c, it, at, "key", 0);
		d->key = RULES_KEY_MESSAGE_ID;
		if (key && strncmp(key, "header:", 7) == 0 && key[7]) {
			d->key = RULES_KEY_HEADER;
			d->key_name = strdup(key + 7);
		} else if (key && strncmp(key, "json:", 5) == 0 && key[5]) {
			d->key = RULES_KEY_JSON;
			d->key_name = strdup(key + 5);
		} else if (key && strcmp(key, "message-id") != 0) {
			char kp[96];

			snprintf(kp, sizeof(kp), "%s.key", at);
			rules_error(c, kp, "'%s' is not message-id, header:NAME or json:FIELD",
				    key);
		}
		free(key);
		d->lease_s = rules_int(c, it, at, "lease_s", 30, 1, 86400);
		d->retention_s = rules_int(c, it, at, "retention_s", 21600, 1, 365L * 86400);
		d->in_progress_delay_s =
		    rules_int(c, it, at, "in_progress_delay_s", 5, 0, 3600);
		d->prefetch_ahead =
		    rules_int(c, it, at, "prefetch_ahead", -1, 0, SURPLUS_EXTRA_MAX);
		d->store = rules_parse_keys_store(c, it, at);
		v->nidempotency++;
	}
}

static void rules_vhost_free(struct rules_vhost *v)
{
	int i;

	free(v->vhost);
	free(v->file);
	rules_matchlist_free(&v->claim_check.match);
	free(v->claim_check.store_path);
	free(v->claim_check.store_bucket);
	free(v->claim_check.store_prefix);
	rules_matchlist_free(&v->schedule.match);
	free(v->schedule.header);
	rules_matchlist_free(&v->dedup_publish.match);
	free(v->dedup_publish.header);
	for (i = 0; i < v->nidempotency; i++) {
		free(v->idempotency[i].queue);
		free(v->idempotency[i].key_name);
	}
	free(v->idempotency);
	memset(v, 0, sizeof(*v));
}

/* What a path is, when it is not a regular file. */
static const char *rules_file_type(mode_t mode)
{
	if (S_ISDIR(mode))
		return "a directory";
	if (S_ISFIFO(mode))
		return "a FIFO";
	if (S_ISSOCK(mode))
		return "a socket";
	if (S_ISCHR(mode) || S_ISBLK(mode))
		return "a device";
	return "not a file";
}

/* The text of a rules file. Only a regular file is read (a symbolic link
 * to one is: a ConfigMap mounts its files so); the rest is refused before
 * it is opened, and the open never waits (O_NONBLOCK: a FIFO put there
 * after the check still opens at once, and fstat refuses it), so a load
 * can never block the thread that runs it. At most RULES_MAX_FILE bytes. */
static char *rules_read(struct rules_ctx *c, const char *path)
{
	struct stat st;
	char *buf, *nul;
	size_t n = 0;
	ssize_t r = 0;
	int fd;

	if (stat(path, &st) != 0) {
		rules_error(c, "(file)", "cannot open: %s", strerror(errno));
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		rules_error(c, "(file)", "not a regular file (%s)",
			    rules_file_type(st.st_mode));
		return NULL;
	}
	fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		rules_error(c, "(file)", "cannot open: %s", strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) != 0) {
		rules_error(c, "(file)", "cannot open: %s", strerror(errno));
		close(fd);
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		rules_error(c, "(file)", "not a regular file (%s)",
			    rules_file_type(st.st_mode));
		close(fd);
		return NULL;
	}
	if (st.st_size > RULES_MAX_FILE) {
		rules_error(c, "(file)", "%lld bytes: a rules file is at most 1 MiB (%d bytes)",
			    (long long)st.st_size, RULES_MAX_FILE);
		close(fd);
		return NULL;
	}
	buf = malloc(RULES_MAX_FILE + 1);
	/* Read to the end, one byte past the cap: the file may have grown. */
	while (
	    buf && n <= RULES_MAX_FILE &&
	    ((r = read(fd, buf + n, RULES_MAX_FILE + 1 - n)) > 0 || (r < 0 && errno == EINTR)))
		n += r > 0 ? (size_t)r : 0;
	if (buf && r < 0) {
		rules_error(c, "(file)", "cannot read: %s", strerror(errno));
		free(buf);
		buf = NULL;
	}
	close(fd);
	if (buf == NULL)
		return NULL;
	if (n > RULES_MAX_FILE) {
		rules_error(c, "(file)", "larger than 1 MiB: a rules file is at most %d bytes",
			    RULES_MAX_FILE);
		free(buf);
		return NULL;
	}
	if ((nul = memchr(buf, '\0', n)) != NULL) {
		rules_error(c, "(file)", "holds a NUL byte (at offset %zu): not JSON text",
			    (size_t)(nul - buf));
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

/* cJSON ends a string at an escaped NUL ("v\u0000x" reads as "v"), so
 * every string of the text is looked at for one before the text is
 * parsed, and refused with the key it belongs to, named as rules_path
 * names keys. Text that is not JSON is left to the parser. */
#define RULES_SCAN_DEPTH 16

struct rules_scan_level {
	char key[64]; /* an object: the key being read */
	int index;    /* an array: the element being read; -1: an object */
};

static void rules_scan_path(char *out, size_t len, const struct rules_scan_level *lv, int depth)
{
	size_t o = 0;
	int i;

	out[0] = '\0';
	for (i = 0; i < depth && i < RULES_SCAN_DEPTH && o < len; i++) {
		if (lv[i].index < 0)
			o +=
			    (size_t)snprintf(out + o, len - o, "%s%s", o ? "." : "", lv[i].key);
		else
			o += (size_t)snprintf(out + o, len - o, "[%d]", lv[i].index);
	}
}

static void rules_find_nul(struct rules_ctx *c, const char *text)
{
	struct rules_scan_level lv[RULES_SCAN_DEPTH];
	const char *p = text, *start, *q;
	struct rules_scan_level *top;
	char key[300];
	int depth = 0, nul;

	while (*p) {
		top = depth > 0 && depth <= RULES_SCAN_DEPTH ? &lv[depth - 1] : NULL;
		if (*p == '{' || *p == '[') {
			if (depth < RULES_SCAN_DEPTH) {
				lv[depth].key[0] = '\0';
				lv[depth].index = *p == '[' ? 0 : -1;
			}
			depth++;
		} else if (*p == '}' || *p == ']') {
			depth -= depth > 0;
		} else if (*p == ',' && top && top->index >= 0) {
			top->index++;
		} else if (*p == '"') {
			start = ++p;
			for (nul = 0; *p && *p != '"'; p++) {
				if (*p == '\\' && p[1]) {
					nul |= p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0;
					p++;
				}
			}
			for (q = *p ? p + 1 : p;
			     *q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'; q++)
				;
			if (*q == ':' && top && top->index < 0)
				snprintf(top->key, sizeof(top->key), "%.*s", (int)(p - start),
					 start);
			if (nul) {
				rules_scan_path(key, sizeof(key), lv, depth);
				rules_error(
				    c, key[0] ? key : "(file)",
				    "%s holds an escaped NUL (\\u0000), which would cut it "
				    "short",
				    *q == ':' ? "the key" : "the string");
			}
			if (*p == '\0')
				break;
		}
		p++;
	}
}

/* "upstream": ["HOST:PORT", ...], the vhost's brokers in the order tried;
 * each is resolved now (one that does not resolve fails the load). */
static void rules_parse_upstream(struct rules_ctx *c, const cJSON *o, struct upstream_list *l)
{
	const cJSON *it;
	char err[320];
	int i, k;

	if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) == 0) {
		rules_error(c, "upstream",
			    "must be a non-empty array of \"HOST:PORT\" strings");
		return;
	}
	cJSON_ArrayForEach (it, o) {
		if (!cJSON_IsString(it)) {
			rules_error(c, "upstream",
				    "must be a non-empty array of \"HOST:PORT\" strings");
			return;
		}
		i = upstream_intern(it->valuestring, err, sizeof(err));
		if (i < 0) {
			rules_error(c, "upstream", "%s", err);
			return;
		}
		for (k = 0; k < l->n && l->at[k] != i; k++)
			;
		if (k < l->n) {
			rules_error(c, "upstream", "%s is named twice", it->valuestring);
			return;
		}
		l->at[l->n++] = (unsigned char)i;
	}
}

/* Parse one file into v; returns the number of errors in it. */
static int rules_parse_file(struct rules_ctx *c, const char *path, struct rules_vhost *v)
{
	static const char *const keys[] = {
	    "vhost",       "reply_to", "claim_check", "schedule", "dedup_publish",
	    "idempotency", "upstream", "pool",        "limits",   NULL};
	static const char *const reply_keys[] = {"enabled", NULL};
	int before = c->nerrors;
	const cJSON *o;
	const char *p;
	cJSON *root;
	char *text = rules_read(c, path);

	if (text == NULL)
		return c->nerrors - before;
	rules_find_nul(c, text);
	root = cJSON_Parse(text);
	if (root == NULL) {
		const char *at = cJSON_GetErrorPtr();
		int line = 1;

		for (p = text; at && p < at; p++)
			line += *p == '\n';
		rules_error(c, "(file)", "not valid JSON (near line %d)", line);
		free(text);
		return c->nerrors - before;
	}
	free(text);
	if (!cJSON_IsObject(root)) {
		rules_error(c, "(file)", "must be a JSON object");
		cJSON_Delete(root);
		return c->nerrors - before;
	}
	v->file = strdup(path);
	rules_known_keys(c, root, "", keys);
	v->vhost = rules_string(c, root, "", "vhost", 1);
	for (p = v->vhost; p && *p; p++) {
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			rules_error(c, "vhost", "holds a control character (\\x%02x)",
				    (unsigned char)*p);
			break;
		}
	}
	o = rules_object(c, root, "", "reply_to");
	if (o) {
		rules_known_keys(c, o, "reply_to", reply_keys);
		v->reply_to = rules_bool(c, o, "reply_to", "enabled", 1);
	}
	o = rules_object(c, root, "", "claim_check");
	if (o)
		rules_parse_claim_check(c, o, &v->claim_check);
	o = rules_object(c, root, "", "schedule");
	if (o)
		rules_parse_schedule(c, o, &v->schedule);
	o = rules_object(c, root, "", "dedup_publish");
	if (o)
		rules_parse_dedup_publish(c, o, &v->dedup_publish);
	o = cJSON_GetObjectItemCaseSensitive(root, "idempotency");
	if (o)
		rules_parse_idempotency(c, o, v);
	o = cJSON_GetObjectItemCaseSensitive(root, "upstream");
	if (o)
		rules_parse_upstream(c, o, &v->upstream);
	o = rules_object(c, root, "", "pool");
	if (o)
		rules_parse_pool(c, o, &v->pool);
	o = rules_object(c, root, "", "limits");
	if (o)
		rules_parse_limits(c, o, &v->limits);
	cJSON_Delete(root);
	return c->nerrors - before;
}

static int rules_json_name(const char *name)
{
	size_t n = strlen(name);

	return name[0] != '.' && n > 5 && strcmp(name + n - 5, ".json") == 0;
}

static int rules_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct rules *rules_load(const char *dir, FILE *err, int *nerrors)
{
	struct rules *r = calloc(1, sizeof(*r));
	struct rules_ctx c = {dir, err, 0};
	char **names = NULL, path[4096];
	int nnames = 0, i, j;
	struct dirent *e;
	DIR *d;

	*nerrors = 0;
	if (r == NULL)
		return NULL;
	r->refs = 1;
	r->generation = __atomic_add_fetch(&rules_generation, 1, __ATOMIC_RELAXED);
	if (dir == NULL || dir[0] == '\0')
		return r;
	d = opendir(dir);
	if (d == NULL) {
		rules_error(&c, "(directory)", "cannot open: %s", strerror(errno));
		*nerrors = c.nerrors;
		free(r);
		return NULL;
	}
	while ((e = readdir(d)) != NULL) {
		if (!rules_json_name(e->d_name))
			continue;
		char **grown = realloc(names, (size_t)(nnames + 1) * sizeof(*names));

		if (grown == NULL)
			break;
		names = grown;
		if ((names[nnames] = strdup(e->d_name)) != NULL)
			nnames++;
	}
	closedir(d);
	if (nnames) /* an empty directory is an empty set */
		qsort(names, (size_t)nnames, sizeof(*names), rules_cmp);
	r->v = calloc((size_t)nnames + 1, sizeof(*r->v));
	for (i = 0; i < nnames; i++) {
		struct rules_vhost *v = &r->v[r->n];

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		c.file = path;
		if (rules_parse_file(&c, path, v) != 0) {
			rules_vhost_free(v);
			continue;
		}
		for (j = 0; j < r->n; j++) {
			if (strcmp(r->v[j].vhost, v->vhost) == 0) {
				rules_error(&c, "vhost", "'%s' is already named by %s",
					    v->vhost, r->v[j].file);
				break;
			}
		}
		if (j < r->n) {
			rules_vhost_free(v);
			continue;
		}
		if (v->upstream.n || v->pool.enabled)
			r->greets = 1;
		if (v->dedup_publish.enabled && v->dedup_publish.store == RULES_KEYS_POSTGRESQL)
			r->any_postgresql = 1;
		for (j = 0; j < v->nidempotency; j++)
			if (v->idempotency[j].store == RULES_KEYS_POSTGRESQL)
				r->any_postgresql = 1;
		r->n++;
	}
	for (i = 0; i < nnames; i++)
		free(names[i]);
	free(names);
	*nerrors = c.nerrors;
	if (c.nerrors) {
		rules_unref(r);
		return NULL;
	}
	return r;
}

void rules_ref(struct rules *r)
{
	__atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
}

void rules_unref(struct rules *r)
{
	int i;

	if (r == NULL || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	for (i = 0; i < r->n; i++)
		rules_vhost_free(&r->v[i]);
	free(r->v);
	free(r);
}

const struct rules_vhost *rules_vhost(const struct rules *r, const char *vhost)
{
	int i;

	if (r == NULL)
		return NULL;
	for (i = 0; i < r->n; i++)
		if (strcmp(r->v[i].vhost, vhost) == 0)
			return &r->v[i];
	return NULL;
}

int rules_matches(const struct rules_matchlist *m, const char *exchange, size_t elen,
		  const char *rk, size_t rklen)
{
	int i;

	for (i = 0; i < m->n; i++) {
		const struct rules_match *x = &m->v[i];

		if (x->exchange && (strlen(x->exchange) != elen ||
				    (elen && memcmp(x->exchange, exchange, elen) != 0)))
			continue;
		if (x->rk && !topic_match(x->rk, rk, rklen))
			continue;
		return 1;
	}
	return 0;
}
