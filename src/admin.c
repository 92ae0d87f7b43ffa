/* admin: the HTTP endpoint that shows counters and settings, on the
 * project's own bounded HTTP server (http.c). */
#include "admin.h"

#include "admin_control.h"
#include "admin_replay.h"
#include "admin_schedule.h"
#include "build_config.h"
#include "config.h"
#include "control.h"
#include "engine.h"
#include "http.h"
#include "json.h"
#include "limits.h"
#include "log.h"
#include "pool.h"
#include "rules.h"
#include "session.h"
#include "stats.h"
#include "store/claims.h"
#include "store/idem.h"
#include "store/state.h"
#include "upstream.h"
#include "vstats.h"
#include "worker.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#define ADMIN_HASH_LEN 32 /* SHA-256 */

static struct http_server *admin_http;
static const struct config *admin_cfg;
static struct worker *admin_workers;
static int admin_nworkers;
static admin_reload_fn admin_reload_cb;
static admin_rules_fn admin_rules_cb;
static int admin_token_set;
static unsigned char admin_token_hash[ADMIN_HASH_LEN];
static struct state *admin_state;
static time_t admin_started;

/* The status page (src/status.html, made a C array of its lines at build
 * time: status_html.c). */
extern const char *const status_html[];

void admin_set_state(struct state *st)
{
	admin_state = st;
}

static int admin_hash(const char *s, unsigned char out[ADMIN_HASH_LEN])
{
	unsigned int n = 0;

	return EVP_Digest(s, strlen(s), out, &n, EVP_sha256(), NULL) == 1 && n == ADMIN_HASH_LEN
		   ? 0
		   : -1;
}

/* With a token set, every request but the health checks carries it as a
 * bearer token (the scheme's name in any case, RFC 7235). Both sides are
 * hashed and the hashes compared in constant time: neither the length nor
 * any prefix of the token shows in the time an answer takes. Asked with
 * the request head alone, before any body is read. */
static int admin_authorize(const struct http_request *req, void *arg)
{
	const char *auth = http_header(req, "Authorization");
	unsigned char got[ADMIN_HASH_LEN];

	if (!admin_token_set)
		return 1;
	if (auth == NULL || strncasecmp(auth, "Bearer", 6) != 0 ||
	    (auth[6] != ' ' && auth[6] != '\t'))
		return 0;
	auth += 6;
	while (*auth == ' ' || *auth == '\t')
		auth++;
	if (admin_hash(auth, got) != 0)
		return 0;
	return CRYPTO_memcmp(got, admin_token_hash, ADMIN_HASH_LEN) == 0;
}

static void admin_json(struct http_request *req, int code, struct evbuffer *out)
{
	http_reply(req, code, "application/json", out);
}

void admin_error(struct http_request *req, int code, const char *fmt, ...)
{
	struct evbuffer *out = evbuffer_new();
	char text[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	evbuffer_add_printf(out, "{\"error\": ");
	json_cstring(out, text);
	evbuffer_add_printf(out, "}\n");
	http_reply(req, code, "application/json", out);
	evbuffer_free(out);
}

/* GET /claims/VHOST/KEY: is the payload in the vhost's store, how large and
 * how old; never the payload itself. */
static void admin_claims(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	const char *rest = http_path(req) + strlen("/claims/");
	const char *slash = strrchr(rest, '/');
	char *vhost = NULL, *key = NULL;
	struct rules *r = NULL;
	const struct rules_vhost *v;
	struct claims_where where;
	uint64_t size = 0, created = 0;
	int rc;

	if (slash == NULL || slash == rest) {
		evbuffer_add_printf(out, "{\"error\": \"use /claims/VHOST/KEY\"}\n");
		admin_json(req, 400, out);
		goto out;
	}
	/* VHOST is percent-encoded ("/" is %2F): decode it alone. */
	vhost = http_uri_decode(rest, (size_t)(slash - rest));
	key = http_uri_decode(slash + 1, strlen(slash + 1));
	if (vhost == NULL || key == NULL) {
		evbuffer_add_printf(out, "{\"error\": \"a name holds %%00\"}\n");
		admin_json(req, 400, out);
		goto out;
	}
	r = admin_rules_cb ? admin_rules_cb() : NULL;
	v = r ? rules_vhost(r, vhost) : NULL;
	evbuffer_add_printf(out, "{\"vhost\": ");
	json_cstring(out, vhost);
	evbuffer_add_printf(out, ", \"key\": ");
	json_cstring(out, key);
	if (v == NULL || !v->claim_check.enabled) {
		evbuffer_add_printf(out,
				    ", \"present\": false, \"error\": \"no claim_check rule "
				    "for this vhost\"}\n");
		admin_json(req, 404, out);
		goto out;
	}
	if (!claims_key_valid((const uint8_t *)key, strlen(key))) {
		evbuffer_add_printf(out, ", \"present\": false, \"error\": \"not a key this "
					 "store issues\"}\n");
		admin_json(req, 400, out);
		goto out;
	}
	claims_where(&where, vhost, &v->claim_check);
	rc = claims_stat(&where, key, &size, &created);
	evbuffer_add_printf(out, ", \"store\": \"%s\"", claims_store_name(&where));
	if (rc == 0) {
		uint64_t now = state_now_ms();
		evbuffer_add_printf(
		    out,
		    ", \"present\": true, \"size\": %llu, \"age_s\": %llu, "
		    "\"retention_s\": %ld}\n",
		    (unsigned long long)size,
		    (unsigned long long)(now > created ? (now - created) / 1000 : 0),
		    v->claim_check.retention_s);
		admin_json(req, 200, out);
	} else if (rc == 1) {
		evbuffer_add_printf(out, ", \"present\": false}\n");
		admin_json(req, 404, out);
	} else {
		evbuffer_add_printf(out,
				    ", \"present\": null, \"error\": \"the store could not "
				    "be read\"}\n");
		admin_json(req, 503, out);
	}
out:
	rules_unref(r);
	free(vhost);
	free(key);
	evbuffer_free(out);
}

/* Work fanned out to every worker, each on its own thread; the caller
 * waits a second at most. A worker that does not answer in time (it is
 * draining, or stuck) runs it later against the shared record, which goes
 * with its last reference. */
struct admin_fanout {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct evbuffer *rows;
	int pending, refs, total;
	admin_each_fn fn;
	void *arg;
	void (*free_arg)(void *arg);
};

struct admin_fanout_call {
	struct worker_call call; /* first */
	struct worker *w;
	struct admin_fanout *all;
};

static void admin_fanout_unref(struct admin_fanout *all)
{
	int last;

	pthread_mutex_lock(&all->lock);
	last = --all->refs == 0;
	pthread_mutex_unlock(&all->lock);
	if (!last)
		return;
	if (all->free_arg)
		all->free_arg(all->arg);
	evbuffer_free(all->rows);
	pthread_cond_destroy(&all->cond);
	pthread_mutex_destroy(&all->lock);
	free(all);
}

static void admin_fanout_run(struct worker_call *c)
{
	struct admin_fanout_call *fc = (struct admin_fanout_call *)c;
	struct admin_fanout *all = fc->all;
	struct evbuffer *mine = evbuffer_new();
	int n = all->fn(fc->w, all->arg, mine);

	pthread_mutex_lock(&all->lock);
	if (mine)
		evbuffer_add_buffer(all->rows, mine);
	all->total += n;
	all->pending--;
	pthread_cond_signal(&all->cond);
	pthread_mutex_unlock(&all->lock);
	if (mine)
		evbuffer_free(mine);
	admin_fanout_unref(all);
	free(fc);
}

int admin_each_worker(admin_each_fn fn, void *arg, void (*free_arg)(void *arg),
		      struct evbuffer *rows, int *missing)
{
	struct admin_fanout *all;
	struct timespec until;
	int i, total;

	if ((all = calloc(1, sizeof(*all))) == NULL || (all->rows = evbuffer_new()) == NULL) {
		free(all);
		if (free_arg)
			free_arg(arg);
		return -1;
	}
	pthread_mutex_init(&all->lock, NULL);
	pthread_cond_init(&all->cond, NULL);
	all->refs = 1;
	all->fn = fn;
	all->arg = arg;
	all->free_arg = free_arg;
	for (i = 0; i < admin_nworkers; i++) {
		struct admin_fanout_call *fc = calloc(1, sizeof(*fc));

		if (fc == NULL)
			continue;
		fc->call.fn = admin_fanout_run;
		fc->w = &admin_workers[i];
		fc->all = all;
		pthread_mutex_lock(&all->lock);
		all->pending++;
		all->refs++;
		pthread_mutex_unlock(&all->lock);
		worker_post(&admin_workers[i], &fc->call);
	}
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 1;
	pthread_mutex_lock(&all->lock);
	while (all->pending > 0 && pthread_cond_timedwait(&all->cond, &all->lock, &until) == 0)
		;
	if (missing)
		*missing = all->pending;
	total = all->total;
	if (rows)
		evbuffer_add_buffer(rows, all->rows);
	pthread_mutex_unlock(&all->lock);
	admin_fanout_unref(all);
	return total;
}

/* GET /connections: a row per client, each worker describing its own
 * sessions. */
static int admin_describe(struct worker *w, void *arg, struct evbuffer *mine)
{
	struct session *s;
	int n = 0;

	list_for_each_entry (s, &w->sessions, link) {
		if (mine == NULL)
			break;
		if (s->state == SESSION_GONE)
			continue;
		evbuffer_add_printf(mine, "\n    ");
		session_describe(s, mine);
		evbuffer_add_printf(mine, ",");
		n++;
	}
	return n;
}

static void admin_connections(struct http_request *req, void *arg)
{
	struct evbuffer *rows = evbuffer_new(), *out = evbuffer_new();
	int n, missing = 0;
	size_t len;

	n = rows && out ? admin_each_worker(admin_describe, NULL, NULL, rows, &missing) : -1;
	if (n < 0) {
		http_reply_text(req, 500, "out of memory\n");
		goto done;
	}
	evbuffer_add_printf(out,
			    "{\n  \"connections\": %d,\n  \"workers_not_answering\": %d,"
			    "\n  \"rows\": [",
			    n, missing);
	len = evbuffer_get_length(rows);
	if (len > 0) {
		const char *text = (const char *)evbuffer_pullup(rows, -1);

		/* Every row ends with a comma; the last one's goes. */
		evbuffer_add(out, text, text[len - 1] == ',' ? len - 1 : len);
		evbuffer_add_printf(out, "\n  ");
	}
	evbuffer_add_printf(out, "]\n}\n");
	http_reply(req, 200, "application/json", out);
done:
	if (rows)
		evbuffer_free(rows);
	if (out)
		evbuffer_free(out);
}

static void admin_reload(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	char *errors = NULL;

	if (admin_reload_cb(&errors) == 0) {
		evbuffer_add_printf(out, "rules reloaded\n");
		http_reply(req, 200, NULL, out);
	} else {
		evbuffer_add_printf(out, "%s", errors ? errors : "reload failed\n");
		http_reply(req, 400, NULL, out);
	}
	free(errors);
	evbuffer_free(out);
}

/* The workers' counters summed; returns the connections open now. */
static unsigned long admin_sum(struct stats *sum)
{
	unsigned long open = 0;
	int i;

	memset(sum, 0, sizeof(*sum));
	for (i = 0; i < admin_nworkers; i++) {
		const struct stats *st = &admin_workers[i].stats;

#define ADMIN_SUM(name, metric, labels, help) \
	sum->name += __atomic_load_n(&st->name, __ATOMIC_RELAXED);
		STATS_COUNTERS(ADMIN_SUM)
#undef ADMIN_SUM
		open += __atomic_load_n(&admin_workers[i].nsessions, __ATOMIC_RELAXED);
	}
	return open;
}

/* The broker addresses and whether each is marked down now. */
static void admin_upstreams(struct evbuffer *out)
{
	int i, nglobal, n = upstream_count(&nglobal);

	evbuffer_add_printf(out, ",\n  \"upstreams\": [");
	for (i = 0; i < n; i++) {
		evbuffer_add_printf(out, "%s{\"address\": ", i ? ", " : "");
		json_cstring(out, upstream_node(i)->name);
		evbuffer_add_printf(out, ", \"global\": %s, \"down\": %s, \"disabled\": %s}",
				    i < nglobal ? "true" : "false",
				    upstream_down(i) ? "true" : "false",
				    upstream_disabled(i) ? "true" : "false");
	}
	evbuffer_add_printf(out, "]");
}

static void admin_stats(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	struct pool_gauges pg;
	struct stats sum;
	unsigned long open;

	open = admin_sum(&sum);
	pool_gauges(&pg);
	evbuffer_add_printf(
	    out,
	    "{\n  \"version\": \"%s\",\n  \"uptime_s\": %lld,\n  \"workers\": "
	    "%d,\n  \"connections_open\": %lu,\n  \"pool_connections\": %lu,\n  "
	    "\"pool_channels\": %lu,\n  \"pool_waiting\": %lu",
	    PACKAGE_VERSION, (long long)(time(NULL) - admin_started), admin_nworkers, open,
	    pg.connections, pg.channels, pg.waiting);
	/* Counted against max_connections: from the accept (before a
	 * worker makes it a session) until the session ends. */
	evbuffer_add_printf(out, ",\n  \"connections_counted\": %ld",
			    limits_connections_open());
	admin_upstreams(out);
	evbuffer_add_printf(out, ",\n  \"paused_vhosts\": ");
	control_paused_json(out);
	if (admin_state) {
		struct state_counters c;

		state_counters(admin_state, &c);
		evbuffer_add_printf(
		    out,
		    ",\n  \"state_commits\": %llu,\n  \"state_writes\": %llu,\n  "
		    "\"state_write_errors\": %llu,\n  \"state_full_errors\": %llu,\n  "
		    "\"state_used_bytes\": %llu,\n  \"state_map_bytes\": %llu",
		    (unsigned long long)c.commits, (unsigned long long)c.writes,
		    (unsigned long long)c.write_errors, (unsigned long long)c.full_errors,
		    (unsigned long long)c.used_bytes, (unsigned long long)c.map_bytes);
		evbuffer_add_printf(
		    out, ",\n  \"state_syncs\": %llu,\n  \"state_synced_writes\": %llu",
		    (unsigned long long)c.syncs, (unsigned long long)c.synced_writes);
	}
#define ADMIN_PRINT(name, metric, labels, help) \
	evbuffer_add_printf(out, ",\n  \"%s\": %llu", #name, (unsigned long long)sum.name);
	STATS_COUNTERS(ADMIN_PRINT)
#undef ADMIN_PRINT
	evbuffer_add_printf(out, ",\n  \"engines\": ");
	engine_stats_json(out);
	evbuffer_add_printf(out, ",\n  \"queues\": ");
	vstats_json(out);
	evbuffer_add_printf(out, "\n}\n");
	http_reply(req, 200, "application/json", out);
	evbuffer_free(out);
}

/* The histogram of the time messages a hook looked at spent in the proxy. */
static void admin_msg_time(struct evbuffer *out)
{
	static const uint64_t bounds[STATS_TIME_BUCKETS] = STATS_TIME_BOUNDS_US;
	uint64_t b[STATS_TIME_BUCKETS + 1] = {0}, sum = 0, count = 0, cum = 0;
	int i, k;

	for (i = 0; i < admin_nworkers; i++) {
		const struct stats *st = &admin_workers[i].stats;

		for (k = 0; k <= STATS_TIME_BUCKETS; k++)
			b[k] += __atomic_load_n(&st->msg_time[k], __ATOMIC_RELAXED);
		sum += __atomic_load_n(&st->msg_time_sum_us, __ATOMIC_RELAXED);
		count += __atomic_load_n(&st->msg_time_count, __ATOMIC_RELAXED);
	}
	evbuffer_add_printf(out, "# HELP acemq_proxy_message_seconds time a message a pattern "
				 "looked at spent in the proxy\n"
				 "# TYPE acemq_proxy_message_seconds histogram\n");
	for (k = 0; k <= STATS_TIME_BUCKETS; k++) {
		cum += b[k];
		if (k < STATS_TIME_BUCKETS)
			evbuffer_add_printf(
			    out, "acemq_proxy_message_seconds_bucket{le=\"%g\"} %llu\n",
			    (double)bounds[k] / 1e6, (unsigned long long)cum);
		else
			evbuffer_add_printf(
			    out, "acemq_proxy_message_seconds_bucket{le=\"+Inf\"} %llu\n",
			    (unsigned long long)cum);
	}
	evbuffer_add_printf(
	    out,
	    "acemq_proxy_message_seconds_sum %g\nacemq_proxy_message_seconds_count "
	    "%llu\n",
	    (double)sum / 1e6, (unsigned long long)count);
}

/* The pools' gauges (connection pooling, pool.c). */
static void admin_pool_metrics(struct evbuffer *out)
{
	struct pool_gauges g;

	pool_gauges(&g);
	evbuffer_add_printf(
	    out,
	    "# HELP acemq_proxy_pool_connections pooled broker connections open now\n"
	    "# TYPE acemq_proxy_pool_connections gauge\n"
	    "acemq_proxy_pool_connections %lu\n"
	    "# HELP acemq_proxy_pool_channels broker channels in use on pooled connections\n"
	    "# TYPE acemq_proxy_pool_channels gauge\n"
	    "acemq_proxy_pool_channels %lu\n"
	    "# HELP acemq_proxy_pool_clients_waiting pooled clients waiting for room\n"
	    "# TYPE acemq_proxy_pool_clients_waiting gauge\n"
	    "acemq_proxy_pool_clients_waiting %lu\n",
	    g.connections, g.channels, g.waiting);
}

/* GET /metrics: the counters in Prometheus' text format. */
static void admin_metrics(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	struct stats sum;
	unsigned long open;
	const char *family = "";

	open = admin_sum(&sum);
	evbuffer_add_printf(out,
			    "# HELP acemq_proxy_connections_open client connections open now\n"
			    "# TYPE acemq_proxy_connections_open gauge\n"
			    "acemq_proxy_connections_open %lu\n",
			    open);
	admin_pool_metrics(out);
	control_paused_metrics(out);
	if (admin_state) {
		struct state_counters c;

		state_counters(admin_state, &c);
		evbuffer_add_printf(
		    out,
		    "# HELP acemq_proxy_state_commits_total LMDB write transactions committed\n"
		    "# TYPE acemq_proxy_state_commits_total counter\n"
		    "acemq_proxy_state_commits_total %llu\n"
		    "# HELP acemq_proxy_state_writes_total writes in them (group commit)\n"
		    "# TYPE acemq_proxy_state_writes_total counter\n"
		    "acemq_proxy_state_writes_total %llu\n"
		    "# HELP acemq_proxy_state_write_errors_total state writes that failed, by "
		    "why\n"
		    "# TYPE acemq_proxy_state_write_errors_total counter\n"
		    "acemq_proxy_state_write_errors_total{why=\"full\"} %llu\n"
		    "acemq_proxy_state_write_errors_total{why=\"other\"} %llu\n"
		    "# HELP acemq_proxy_state_used_bytes LMDB pages in use (claims, keys, "
		    "windows)\n"
		    "# TYPE acemq_proxy_state_used_bytes gauge\n"
		    "acemq_proxy_state_used_bytes %llu\n"
		    "# HELP acemq_proxy_state_map_bytes the largest the LMDB state may grow\n"
		    "# TYPE acemq_proxy_state_map_bytes gauge\n"
		    "acemq_proxy_state_map_bytes %llu\n",
		    (unsigned long long)c.commits, (unsigned long long)c.writes,
		    (unsigned long long)c.full_errors,
		    (unsigned long long)(c.write_errors - c.full_errors),
		    (unsigned long long)c.used_bytes, (unsigned long long)c.map_bytes);
		evbuffer_add_printf(
		    out,
		    "# HELP acemq_proxy_state_syncs_total fsyncs that made state commits "
		    "durable\n"
		    "# TYPE acemq_proxy_state_syncs_total counter\n"
		    "acemq_proxy_state_syncs_total %llu\n"
		    "# HELP acemq_proxy_state_synced_writes_total writes made durable by them\n"
		    "# TYPE acemq_proxy_state_synced_writes_total counter\n"
		    "acemq_proxy_state_synced_writes_total %llu\n",
		    (unsigned long long)c.syncs, (unsigned long long)c.synced_writes);
	}
	/* Counters of one metric are listed together: HELP and TYPE once. */
#define ADMIN_METRIC(name, metric, labels, help)                                            \
	if (strcmp(family, metric) != 0) {                                                  \
		family = metric;                                                            \
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n", metric, help, \
				    metric);                                                \
	}                                                                                   \
	evbuffer_add_printf(out, "%s%s%s%s %llu\n", metric, labels[0] ? "{" : "", labels,   \
			    labels[0] ? "}" : "", (unsigned long long)sum.name);
	STATS_COUNTERS(ADMIN_METRIC)
#undef ADMIN_METRIC
	admin_msg_time(out);
	engine_metrics(out);
	idem_metrics(out);
	vstats_metrics(out);
	http_reply(req, 200, "text/plain; version=0.0.4", out);
	evbuffer_free(out);
}

static void admin_config(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (f) {
		config_dump(admin_cfg, f);
		fclose(f);
		evbuffer_add(out, text, len);
		free(text);
	}
	http_reply(req, 200, "text/plain", out);
	evbuffer_free(out);
}

/* GET /readyz: a broker address answers (none is marked down). While the
 * proxy drains the admin endpoint is closed, which a load balancer reads
 * as not ready. */
static void admin_ready(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	struct rules *r = admin_rules_cb ? admin_rules_cb() : NULL;
	const char *unready = idem_unready(r);

	rules_unref(r);
	if (unready) {
		evbuffer_add_printf(out, "%s\n", unready);
		http_reply(req, 503, NULL, out);
	} else if (upstream_any_up()) {
		evbuffer_add_printf(out, "ready\n");
		http_reply(req, 200, NULL, out);
	} else {
		evbuffer_add_printf(out, "no broker address answers\n");
		http_reply(req, 503, NULL, out);
	}
	evbuffer_free(out);
}

/* GET /rules: the rules in force: each vhost's file and its patterns. */
static void admin_rules(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	struct rules *r;
	int i;

	r = admin_rules_cb ? admin_rules_cb() : NULL;
	evbuffer_add_printf(out, "{\"generation\": %llu, \"vhosts\": [",
			    r ? (unsigned long long)r->generation : 0ULL);
	for (i = 0; r && i < r->n; i++) {
		const struct rules_vhost *v = &r->v[i];

		evbuffer_add_printf(out, "%s\n  {\"vhost\": ", i ? "," : "");
		json_cstring(out, v->vhost);
		evbuffer_add_printf(out, ", \"file\": ");
		json_cstring(out, v->file ? v->file : "");
		evbuffer_add_printf(out, ", \"reply_to\": %s", v->reply_to ? "true" : "false");
		if (v->claim_check.enabled)
			evbuffer_add_printf(
			    out,
			    ", \"claim_check\": {\"threshold\": %ld, \"store\": \"%s\", "
			    "\"retention_s\": %ld, \"on_missing\": \"%s\"}",
			    v->claim_check.threshold, rules_store_name(v->claim_check.store),
			    v->claim_check.retention_s,
			    v->claim_check.on_missing == RULES_MISSING_PASS ? "pass"
									    : "dead-letter");
		if (v->dedup_publish.enabled) {
			evbuffer_add_printf(out, ", \"dedup_publish\": {\"header\": ");
			json_cstring(out, v->dedup_publish.header);
			evbuffer_add_printf(out, ", \"window_s\": %ld}",
					    v->dedup_publish.window_s);
		}
		if (v->upstream.n) {
			int k;

			evbuffer_add_printf(out, ", \"upstream\": [");
			for (k = 0; k < v->upstream.n; k++) {
				evbuffer_add_printf(out, "%s", k ? ", " : "");
				json_cstring(out, upstream_node(v->upstream.at[k])->name);
			}
			evbuffer_add_printf(out, "]");
		}
		if (v->limits.connections_per_s || v->limits.publish_bytes_per_s)
			evbuffer_add_printf(out,
					    ", \"limits\": {\"connections_per_s\": %ld, "
					    "\"publish_bytes_per_s\": %ld, \"mode\": \"%s\"}",
					    v->limits.connections_per_s,
					    v->limits.publish_bytes_per_s,
					    v->limits.alarm ? "alarm" : "enforce");
		evbuffer_add_printf(out, ", \"schedule\": %s, \"idempotency\": %d}",
				    v->schedule.enabled ? "true" : "false", v->nidempotency);
	}
	evbuffer_add_printf(out, "%s]}\n", r && r->n ? "\n" : "");
	rules_unref(r);
	admin_json(req, 200, out);
	evbuffer_free(out);
}

/* GET /: the status page. It holds nothing but code: what it shows it
 * reads from the routes below, with the token the reader types in. */
static void admin_status_page(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	int i;

	for (i = 0; status_html[i]; i++)
		evbuffer_add(out, status_html[i], strlen(status_html[i]));
	http_reply_header(req, "Cache-Control", "no-store");
	http_reply_header(req, "Content-Security-Policy",
			  "default-src 'none'; script-src 'unsafe-inline'; style-src "
			  "'unsafe-inline'; connect-src 'self'; img-src data:");
	http_reply(req, 200, "text/html; charset=utf-8", out);
	evbuffer_free(out);
}

static void admin_health(struct http_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	evbuffer_add_printf(out, "ok\n");
	http_reply(req, 200, NULL, out);
	evbuffer_free(out);
}

/* Whether every address host resolves to is a loopback one: 1, 0, or -1
 * when it does not resolve. The name's spelling decides nothing ("127.x"
 * may be any host's name). */
static int admin_loopback(const char *host)
{
	struct addrinfo hints, *res = NULL, *ai;
	int all = 1;

	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL)
		return -1;
	for (ai = res; ai; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *in = (const struct sockaddr_in *)ai->ai_addr;

			if ((ntohl(in->sin_addr.s_addr) >> 24) != 127)
				all = 0;
		} else if (ai->ai_family == AF_INET6) {
			const struct in6_addr *a =
			    &((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;

			if (!IN6_IS_ADDR_LOOPBACK(a) &&
			    !(IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127))
				all = 0;
		} else {
			all = 0;
		}
	}
	freeaddrinfo(res);
	return all;
}

int admin_check(const char *addr, const char *token, char *err, size_t errlen)
{
	char host[256];
	int port, lo;

	if (config_addr_split(addr, host, sizeof(host), &port) != 0) {
		snprintf(err, errlen, "admin %s: not HOST:PORT", addr);
		return -1;
	}
	lo = admin_loopback(host);
	if (lo < 0) {
		snprintf(err, errlen, "admin %s: %s does not resolve", addr, host);
		return -1;
	}
	/* Counters, rules and reloads are not for the whole network: off
	 * loopback the endpoint needs a token. */
	if (lo == 0 && (token == NULL || token[0] == '\0')) {
		snprintf(err, errlen,
			 "admin %s: not a loopback address (not every address %s resolves to "
			 "is), and no admin_token is set",
			 addr, host);
		return -1;
	}
	return 0;
}

/* GET serves HEAD too; only the health checks and the status page (which
 * asks for the token itself) are open without a token;
 * a route that takes a body says how large. */
static const struct http_route admin_routes[] = {
    {"/stats", HTTP_GET, 0, 0, admin_stats, NULL},
    {"/config", HTTP_GET, 0, 0, admin_config, NULL},
    {"/health", HTTP_GET, 0, 1, admin_health, NULL},
    {"/healthz", HTTP_GET, 0, 1, admin_health, NULL},
    {"/metrics", HTTP_GET, 0, 0, admin_metrics, NULL},
    {"/readyz", HTTP_GET, 0, 1, admin_ready, NULL},
    {"/rules", HTTP_GET, 0, 0, admin_rules, NULL},
    {"/reload", HTTP_POST, 0, 0, admin_reload, NULL},
    {"/connections", HTTP_GET, 0, 0, admin_connections, NULL},
    {"/connections/", HTTP_POST, ADMIN_CONTROL_MAX_BODY, 0, admin_control, NULL},
    {"/vhosts/", HTTP_POST, ADMIN_CONTROL_MAX_BODY, 0, admin_control, NULL},
    {"/upstreams/", HTTP_POST, 0, 0, admin_control, NULL},
    {"/claims/", HTTP_GET, 0, 0, admin_claims, NULL},
    {"/schedule/", HTTP_GET | HTTP_DELETE, 0, 0, admin_schedule, &admin_rules_cb},
    {"/replay", HTTP_GET | HTTP_POST, ADMIN_REPLAY_MAX_BODY, 0, admin_replay, &admin_rules_cb},
    {"/replay/", HTTP_GET | HTTP_DELETE, 0, 0, admin_replay, &admin_rules_cb},
    {"/", HTTP_GET, 0, 1, admin_status_page, NULL},
};

int admin_open(struct event_base *base, const char *addr, const struct config *cfg,
	       struct worker *workers, int nworkers, admin_reload_fn reload,
	       admin_rules_fn rules)
{
	const char *token = config_str(cfg, CFG_ADMIN_TOKEN);
	struct http_settings set = {"admin", config_num(cfg, CFG_ADMIN_TIMEOUT_S) * 1000,
				    (int)config_num(cfg, CFG_ADMIN_MAX_CONNECTIONS),
				    admin_authorize, NULL};
	char host[256], err[600];
	int port;

	admin_cfg = cfg;
	admin_started = time(NULL);
	admin_workers = workers;
	admin_nworkers = nworkers;
	admin_reload_cb = reload;
	admin_rules_cb = rules;
	if (admin_check(addr, token, err, sizeof(err)) != 0 ||
	    config_addr_split(addr, host, sizeof(host), &port) != 0) {
		log_error("%s", err);
		return -1;
	}
	admin_token_set = token[0] != '\0';
	if (admin_token_set && admin_hash(token, admin_token_hash) != 0) {
		log_error("admin: cannot hash the token");
		return -1;
	}
	admin_http =
	    http_open(base, host, port, &set, admin_routes,
		      (int)(sizeof(admin_routes) / sizeof(admin_routes[0])), err, sizeof(err));
	if (admin_http == NULL) {
		log_error("admin %s: %s", addr, err);
		return -1;
	}
	log_info("admin endpoint on %s", addr);
	return 0;
}

void admin_close(void)
{
	http_free(admin_http);
	admin_http = NULL;
}
