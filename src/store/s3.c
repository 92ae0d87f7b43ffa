/* s3: signed requests to an S3-compatible store through libcurl's multi
 * interface, on one thread of their own; completions posted back. */
#include "s3.h"

#include "../config.h"
#include "../log.h"
#include "sigv4.h"

#include <ctype.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define S3_ATTEMPTS   4                  /* a request is sent at most this often */
#define S3_BACKOFF_MS 200                /* then 400, 800 */
#define S3_TEXT_MAX   (4u * 1024 * 1024) /* an XML answer larger is an error */
#define S3_MAX_CONNS  16

static struct s3_settings s3_set = {
    .timeout_ms = 30000, .part_size = 8u << 20, .path_style = -1};
static char s3_scheme[8], s3_host[256]; /* host[:port] of the endpoint */

static pthread_mutex_t s3_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s3_cond = PTHREAD_COND_INITIALIZER;
static struct s3_req *s3_queue; /* submitted or waiting to be retried */
static CURLM *s3_multi;
static pthread_t s3_thread;
static int s3_started, s3_stopping;

static char *s3_strdup(const char *s)
{
	return strdup(s ? s : "");
}

void s3_configure(const struct s3_settings *s)
{
	const char *ep, *sep;

	free(s3_set.endpoint);
	free(s3_set.region);
	free(s3_set.access_key);
	free(s3_set.secret_key);
	free(s3_set.ca);
	s3_set = *s;
	s3_set.endpoint = s3_strdup(s->endpoint);
	s3_set.region = s3_strdup(s->region && s->region[0] ? s->region : "us-east-1");
	s3_set.access_key = s3_strdup(s->access_key);
	s3_set.secret_key = s3_strdup(s->secret_key);
	s3_set.ca = s3_strdup(s->ca);
	if (s3_set.path_style < 0)
		s3_set.path_style = s3_set.endpoint[0] != 0;
	ep = s3_set.endpoint;
	if (ep[0] == 0) {
		snprintf(s3_scheme, sizeof(s3_scheme), "https");
		snprintf(s3_host, sizeof(s3_host), "s3.%s.amazonaws.com", s3_set.region);
		return;
	}
	sep = strstr(ep, "://");
	snprintf(s3_scheme, sizeof(s3_scheme), "%.*s", sep ? (int)(sep - ep) : 5,
		 sep ? ep : "https");
	ep = sep ? sep + 3 : ep;
	snprintf(s3_host, sizeof(s3_host), "%.*s", (int)strcspn(ep, "/"), ep);
}

void s3_configure_from(const struct config *cfg)
{
	struct s3_settings s = {
	    .endpoint = (char *)config_str(cfg, CFG_S3_ENDPOINT),
	    .region = (char *)config_str(cfg, CFG_S3_REGION),
	    .access_key = (char *)config_str(cfg, CFG_S3_ACCESS_KEY),
	    .secret_key = (char *)config_str(cfg, CFG_S3_SECRET_KEY),
	    .ca = (char *)config_str(cfg, CFG_S3_CA),
	    .path_style = (int)config_num(cfg, CFG_S3_PATH_STYLE),
	    .timeout_ms = config_num(cfg, CFG_S3_TIMEOUT_MS),
	    .part_size = (size_t)config_num(cfg, CFG_S3_PART_SIZE),
	};

	s3_configure(&s);
}

size_t s3_part_size(void)
{
	return s3_set.part_size;
}

static uint64_t s3_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void s3_req_init(struct s3_req *r, const char *method, const char *bucket, const char *key)
{
	memset(r, 0, sizeof(*r));
	r->method = method;
	snprintf(r->bucket, sizeof(r->bucket), "%s", bucket);
	r->key = key ? strdup(key) : NULL;
}

int s3_req_query(struct s3_req *r, const char *name, const char *value)
{
	if (r->nquery == S3_MAX_QUERY)
		return -1;
	r->query[r->nquery].name = strdup(name);
	r->query[r->nquery].value = value ? strdup(value) : NULL;
	r->nquery++;
	return r->query[r->nquery - 1].name && (!value || r->query[r->nquery - 1].value) ? 0
											 : -1;
}

void s3_req_clear(struct s3_req *r)
{
	int i;

	free(r->key);
	r->key = NULL;
	for (i = 0; i < r->nquery; i++) {
		free(r->query[i].name);
		free(r->query[i].value);
	}
	r->nquery = 0;
	free(r->text);
	r->text = NULL;
	r->text_len = 0;
}

int s3_ok(const struct s3_req *r)
{
	return r->status >= 200 && r->status < 300 && !r->overflow;
}

/* ---- on the thread ---------------------------------------------------- */

static size_t s3_on_body(char *data, size_t size, size_t n, void *arg)
{
	struct s3_req *r = arg;
	long status = 0;

	n *= size;
	curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
	if (status >= 200 && status < 300 && r->out) {
		if (n > r->out_cap - r->out_len) {
			r->overflow = 1;
			return 0;
		}
		memcpy(r->out + r->out_len, data, n);
		r->out_len += n;
		return n;
	}
	if (r->text_len + n > S3_TEXT_MAX) {
		r->overflow = 1;
		return 0;
	}
	{
		char *t = realloc(r->text, r->text_len + n + 1);

		if (t == NULL) {
			r->overflow = 1;
			return 0;
		}
		r->text = t;
	}
	memcpy(r->text + r->text_len, data, n);
	r->text_len += n;
	r->text[r->text_len] = 0;
	return n;
}

static size_t s3_on_header(char *data, size_t size, size_t n, void *arg)
{
	struct s3_req *r = arg;
	char line[512], *v;
	size_t len = size * n, k;

	k = len < sizeof(line) - 1 ? len : sizeof(line) - 1;
	memcpy(line, data, k);
	line[k] = 0;
	line[strcspn(line, "\r\n")] = 0;
	v = strchr(line, ':');
	if (v == NULL)
		return len;
	*v++ = 0;
	while (*v == ' ')
		v++;
	if (strcasecmp(line, "etag") == 0)
		snprintf(r->etag, sizeof(r->etag), "%s", v);
	else if (strcasecmp(line, "content-length") == 0)
		r->content_length = strtoull(v, NULL, 10);
	else if (strcasecmp(line, "content-range") == 0 && (v = strchr(v, '/')) != NULL)
		r->total = strtoull(v + 1, NULL, 10);
	return len;
}

static size_t s3_on_read(char *data, size_t size, size_t n, void *arg)
{
	struct s3_req *r = arg;
	size_t left = r->body_len - r->sent;

	n *= size;
	if (n > left)
		n = left;
	if (n)
		memcpy(data, r->body + r->sent, n);
	r->sent += n;
	return n;
}

static struct curl_slist *s3_header(struct curl_slist *l, const char *name, const char *value,
				    int *failed)
{
	char line[2048];
	struct curl_slist *n;

	snprintf(line, sizeof(line), "%s: %s", name, value);
	n = curl_slist_append(l, line);
	if (n == NULL) {
		*failed = 1;
		return l;
	}
	return n;
}

char *s3_request_path(const char *bucket, const char *key, int path_style)
{
	size_t klen = key ? strlen(key) : 0;
	size_t plen = 2 + strlen(bucket) + 1 + sigv4_encode(NULL, 0, key ? key : "", klen, 1);
	char *path = malloc(plen + 1);
	size_t n;

	if (path == NULL)
		return NULL;
	if (path_style)
		n = (size_t)snprintf(path, plen + 1, "/%s%s", bucket, key ? "/" : "");
	else
		n = (size_t)snprintf(path, plen + 1, "/");
	sigv4_encode(path + n, plen + 1 - n, key ? key : "", klen, 1);
	return path;
}

/* Build, sign and hand one attempt of r to the multi handle. */
static int s3_start(struct s3_req *r, uint64_t deadline)
{
	struct sigv4_param q[S3_MAX_QUERY];
	struct sigv4_header h[5];
	struct sigv4_key key = {s3_set.access_key, s3_set.secret_key, s3_set.region, "s3"};
	struct sigv4_request sr;
	char date[SIGV4_DATE_LEN + 1], hash[SIGV4_HASH_LEN + 1], host[400], range[64];
	char auth[1024], *path = NULL, *query = NULL, *url = NULL;
	size_t ulen;
	struct curl_slist *hl = NULL;
	int i, nh = 0, failed = 0;
	uint64_t now = s3_now_ms();
	CURL *e;

	r->status = 0;
	r->curl_error[0] = 0;
	r->out_len = 0;
	free(r->text);
	r->text = NULL;
	r->text_len = 0;
	r->etag[0] = 0;
	r->content_length = r->total = 0;
	r->last_modified = 0;
	r->sent = 0;
	r->overflow = 0;
	r->attempts++;
	path = s3_request_path(r->bucket, r->key, s3_set.path_style);
	if (path == NULL)
		return -1;
	if (s3_set.path_style)
		snprintf(host, sizeof(host), "%s", s3_host);
	else
		snprintf(host, sizeof(host), "%s.%s", r->bucket, s3_host);
	for (i = 0; i < r->nquery; i++) {
		q[i].name = r->query[i].name;
		q[i].value = r->query[i].value;
	}
	query = sigv4_query_string(q, r->nquery, 0);
	ulen = strlen(s3_scheme) + 3 + strlen(host) + strlen(path) + 2 +
	       (query ? strlen(query) : 0);
	url = malloc(ulen + 1);
	if (query == NULL || url == NULL)
		goto fail;
	snprintf(url, ulen + 1, "%s://%s%s%s%s", s3_scheme, host, path, query[0] ? "?" : "",
		 query);
	sigv4_date(date, time(NULL));
	sigv4_sha256_hex(hash, r->body ? (const void *)r->body : "", r->body_len);
	h[nh++] = (struct sigv4_header){"host", host};
	h[nh++] = (struct sigv4_header){"x-amz-content-sha256", hash};
	h[nh++] = (struct sigv4_header){"x-amz-date", date};
	if (r->ranged) {
		snprintf(range, sizeof(range), "bytes=%llu-%llu",
			 (unsigned long long)r->range_from, (unsigned long long)r->range_to);
		h[nh++] = (struct sigv4_header){"range", range};
	}
	if (r->content_type[0])
		h[nh++] = (struct sigv4_header){"content-type", r->content_type};
	sr = (struct sigv4_request){r->method, path, q, r->nquery, h, nh, hash};
	if (sigv4_authorization(auth, sizeof(auth), &key, date, &sr) != 0)
		goto fail;
	for (i = 0; i < nh; i++)
		hl = s3_header(hl, h[i].name, h[i].value, &failed);
	hl = s3_header(hl, "Authorization", auth, &failed);
	hl = curl_slist_append(hl, "Expect:"); /* no 100-continue round trip */
	if (!r->content_type[0] && strcmp(r->method, "POST") == 0)
		hl = curl_slist_append(hl, "Content-Type:");
	e = curl_easy_init();
	if (e == NULL || hl == NULL || failed) {
		if (e)
			curl_easy_cleanup(e);
		goto fail;
	}
	r->easy = e;
	r->headers = hl;
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(e, CURLOPT_PRIVATE, r);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, s3_on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, s3_on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(e, CURLOPT_FILETIME, 1L);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(deadline > now ? deadline - now : 1));
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)(deadline > now ? deadline - now : 1));
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->curl_error);
	if (s3_set.ca[0])
		curl_easy_setopt(e, CURLOPT_CAINFO, s3_set.ca);
	if (strcmp(r->method, "HEAD") == 0) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	} else if (strcmp(r->method, "PUT") == 0) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, s3_on_read);
		curl_easy_setopt(e, CURLOPT_READDATA, r);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
	} else if (strcmp(r->method, "POST") == 0) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body ? (const char *)r->body : "");
	} else if (strcmp(r->method, "GET") != 0) {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
	}
	free(path);
	free(query);
	free(url);
	if (curl_multi_add_handle(s3_multi, e) != CURLM_OK) {
		curl_easy_cleanup(e);
		curl_slist_free_all(hl);
		r->easy = r->headers = NULL;
		return -1;
	}
	return 0;
fail:
	curl_slist_free_all(hl);
	free(path);
	free(query);
	free(url);
	return -1;
}

static void s3_complete(struct s3_req *r)
{
	if (r->w) {
		worker_post(r->w, &r->call); /* r may be gone after this */
		return;
	}
	pthread_mutex_lock(&s3_lock);
	r->done = 1;
	pthread_cond_broadcast(&s3_cond);
	pthread_mutex_unlock(&s3_lock);
}

/* Transport errors worth another try; a certificate or a URL that is
 * wrong stays wrong. */
static int s3_retryable(CURLcode rc)
{
	switch (rc) {
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_WRITE_ERROR:
		return 0;
	default:
		return rc != CURLE_OK;
	}
}

/* The attempt ended: done, or queued again after a pause. */
static void s3_ended(struct s3_req *r, CURLcode rc, uint64_t deadline)
{
	long status = 0;
	curl_off_t mtime = -1;
	uint64_t now = s3_now_ms(), pause;

	curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_getinfo(r->easy, CURLINFO_FILETIME_T, &mtime);
	curl_multi_remove_handle(s3_multi, r->easy);
	curl_easy_cleanup(r->easy);
	curl_slist_free_all(r->headers);
	r->easy = r->headers = NULL;
	r->status = rc == CURLE_OK ? status : 0;
	r->last_modified = mtime >= 0 ? (time_t)mtime : 0;
	if (rc != CURLE_OK && r->curl_error[0] == 0)
		snprintf(r->curl_error, sizeof(r->curl_error), "%s", curl_easy_strerror(rc));
	pause = (uint64_t)S3_BACKOFF_MS << (r->attempts - 1);
	if (((s3_retryable(rc) && !r->overflow) || r->status >= 500) &&
	    r->attempts < S3_ATTEMPTS && now + pause < deadline) {
		log_debug("s3: %s %s/%s: %s; retried in %llu ms", r->method, r->bucket,
			  r->key ? r->key : "",
			  rc != CURLE_OK ? r->curl_error : "a server error",
			  (unsigned long long)pause);
		r->not_before_ms = now + pause;
		pthread_mutex_lock(&s3_lock);
		r->next = s3_queue;
		s3_queue = r;
		pthread_mutex_unlock(&s3_lock);
		return;
	}
	if (rc != CURLE_OK)
		log_debug("s3: %s %s/%s failed: %s", r->method, r->bucket, r->key ? r->key : "",
			  r->curl_error);
	s3_complete(r);
}

static void *s3_main(void *arg)
{
	for (;;) {
		struct s3_req *ready = NULL, **pp, *r;
		uint64_t now = s3_now_ms();
		long wait = 1000;
		struct CURLMsg *msg;
		int running = 0, left;

		pthread_mutex_lock(&s3_lock);
		for (pp = &s3_queue; (r = *pp) != NULL;) {
			if (r->not_before_ms <= now) {
				*pp = r->next;
				r->next = ready;
				ready = r;
			} else {
				if ((long)(r->not_before_ms - now) < wait)
					wait = (long)(r->not_before_ms - now);
				pp = &r->next;
			}
		}
		pthread_mutex_unlock(&s3_lock);
		while ((r = ready) != NULL) {
			ready = r->next;
			r->next = NULL;
			/* The first attempt fixes the deadline; retries keep it. */
			if (r->attempts == 0)
				r->deadline_ms =
				    now + (uint64_t)(r->timeout_ms > 0 &&
							     r->timeout_ms < s3_set.timeout_ms
							 ? r->timeout_ms
							 : s3_set.timeout_ms);
			if (s3_start(r, r->deadline_ms) != 0) {
				snprintf(r->curl_error, sizeof(r->curl_error),
					 "the request could not be built");
				r->status = 0;
				s3_complete(r);
			}
		}
		curl_multi_perform(s3_multi, &running);
		while ((msg = curl_multi_info_read(s3_multi, &left)) != NULL) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
			s3_ended(r, msg->data.result, r->deadline_ms);
		}
		pthread_mutex_lock(&s3_lock);
		if (s3_stopping && s3_queue == NULL && running == 0) {
			pthread_mutex_unlock(&s3_lock);
			break;
		}
		if (s3_queue && wait > 0 && s3_queue->not_before_ms <= s3_now_ms())
			wait = 0;
		pthread_mutex_unlock(&s3_lock);
		curl_multi_poll(s3_multi, NULL, 0, (int)wait, NULL);
	}
	return arg;
}

/* The thread starts with the first request (under s3_lock). */
static int s3_ensure_started(void)
{
	if (s3_started)
		return 0;
	if (s3_set.region == NULL) {
		struct s3_settings d = {
		    .timeout_ms = 30000, .part_size = 8u << 20, .path_style = -1};

		s3_configure(&d);
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	s3_multi = curl_multi_init();
	if (s3_multi == NULL)
		return -1;
	curl_multi_setopt(s3_multi, CURLMOPT_MAXCONNECTS, (long)S3_MAX_CONNS);
	curl_multi_setopt(s3_multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)S3_MAX_CONNS);
	if (pthread_create(&s3_thread, NULL, s3_main, NULL) != 0) {
		curl_multi_cleanup(s3_multi);
		s3_multi = NULL;
		return -1;
	}
	s3_started = 1;
	return 0;
}

void s3_submit(struct s3_req *r)
{
	int ok;

	r->attempts = 0;
	r->not_before_ms = 0;
	r->done = 0;
	pthread_mutex_lock(&s3_lock);
	ok = !s3_stopping && s3_ensure_started() == 0;
	if (ok) {
		r->next = s3_queue;
		s3_queue = r;
	}
	pthread_mutex_unlock(&s3_lock);
	if (!ok) {
		r->status = 0;
		snprintf(r->curl_error, sizeof(r->curl_error), "the S3 client is not running");
		s3_complete(r);
		return;
	}
	curl_multi_wakeup(s3_multi);
}

void s3_run(struct s3_req *r)
{
	r->w = NULL;
	s3_submit(r);
	s3_run_wait(r);
}

void s3_run_wait(struct s3_req *r)
{
	pthread_mutex_lock(&s3_lock);
	while (!r->done)
		pthread_cond_wait(&s3_cond, &s3_lock);
	pthread_mutex_unlock(&s3_lock);
}

void s3_stop(void)
{
	int started;

	pthread_mutex_lock(&s3_lock);
	s3_stopping = 1;
	started = s3_started;
	pthread_mutex_unlock(&s3_lock);
	if (!started)
		return;
	curl_multi_wakeup(s3_multi);
	pthread_join(s3_thread, NULL);
	curl_multi_cleanup(s3_multi);
	s3_multi = NULL;
	curl_global_cleanup();
	pthread_mutex_lock(&s3_lock);
	s3_started = 0;
	s3_stopping = 0;
	pthread_mutex_unlock(&s3_lock);
}

/* ---- answers ------------------------------------------------------------ */

static void s3_xml_decode(char *s)
{
	static const struct {
		const char *ent;
		char c;
	} ents[] = {
	    {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
	char *w = s;
	size_t i;

	while (*s) {
		for (i = 0; *s == '&' && i < sizeof(ents) / sizeof(ents[0]); i++)
			if (strncmp(s, ents[i].ent, strlen(ents[i].ent)) == 0)
				break;
		if (*s == '&' && i < sizeof(ents) / sizeof(ents[0])) {
			*w++ = ents[i].c;
			s += strlen(ents[i].ent);
		} else {
			*w++ = *s++;
		}
	}
	*w = 0;
}

const char *s3_xml_get(const char *xml, const char *tag, char *out, size_t outlen)
{
	char open[64], close[64];
	const char *a, *b;
	size_t n;

	if (xml == NULL || outlen == 0)
		return NULL;
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	a = strstr(xml, open);
	if (a == NULL)
		return NULL;
	a += strlen(open);
	b = strstr(a, close);
	if (b == NULL)
		return NULL;
	n = (size_t)(b - a);
	if (n >= outlen)
		n = outlen - 1;
	memcpy(out, a, n);
	out[n] = 0;
	s3_xml_decode(out);
	return b + strlen(close);
}
