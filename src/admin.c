/* admin: the HTTP endpoint that shows counters and settings. */
#include "admin.h"

#include "config.h"
#include "log.h"
#include "stats.h"
#include "worker.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct evhttp *admin_http;
static const struct config *admin_cfg;
static struct worker *admin_workers;
static int admin_nworkers;
static admin_reload_fn admin_reload_cb;

static void admin_reload(struct evhttp_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	char *errors = NULL;

	if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
		evbuffer_add_printf(out, "use POST\n");
		evhttp_send_reply(req, 405, "Method Not Allowed", out);
	} else if (admin_reload_cb(&errors) == 0) {
		evbuffer_add_printf(out, "rules reloaded\n");
		evhttp_send_reply(req, 200, "OK", out);
	} else {
		evbuffer_add_printf(out, "%s", errors ? errors : "reload failed\n");
		evhttp_send_reply(req, 400, "Bad Request", out);
	}
	free(errors);
	evbuffer_free(out);
}

static void admin_stats(struct evhttp_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();
	struct stats sum;
	unsigned long open = 0;
	int i;

	memset(&sum, 0, sizeof(sum));
	for (i = 0; i < admin_nworkers; i++) {
		const struct stats *st = &admin_workers[i].stats;

#define ADMIN_SUM(name, help) sum.name += __atomic_load_n(&st->name, __ATOMIC_RELAXED);
		STATS_COUNTERS(ADMIN_SUM)
#undef ADMIN_SUM
		open += __atomic_load_n(&admin_workers[i].nsessions, __ATOMIC_RELAXED);
	}
	evbuffer_add_printf(out, "{\n  \"connections_open\": %lu", open);
#define ADMIN_PRINT(name, help) \
	evbuffer_add_printf(out, ",\n  \"%s\": %llu", #name, (unsigned long long)sum.name);
	STATS_COUNTERS(ADMIN_PRINT)
#undef ADMIN_PRINT
	evbuffer_add_printf(out, "\n}\n");
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "application/json");
	evhttp_send_reply(req, 200, "OK", out);
	evbuffer_free(out);
}

static void admin_config(struct evhttp_request *req, void *arg)
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
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
	evhttp_send_reply(req, 200, "OK", out);
	evbuffer_free(out);
}

static void admin_health(struct evhttp_request *req, void *arg)
{
	struct evbuffer *out = evbuffer_new();

	evbuffer_add_printf(out, "ok\n");
	evhttp_send_reply(req, 200, "OK", out);
	evbuffer_free(out);
}

int admin_open(struct event_base *base, const char *addr, const struct config *cfg,
	       struct worker *workers, int nworkers, admin_reload_fn reload)
{
	char host[256];
	int port;

	admin_cfg = cfg;
	admin_workers = workers;
	admin_nworkers = nworkers;
	admin_reload_cb = reload;
	if (config_addr_split(addr, host, sizeof(host), &port) != 0) {
		log_error("admin %s: not HOST:PORT", addr);
		return -1;
	}
	admin_http = evhttp_new(base);
	if (admin_http == NULL || evhttp_bind_socket(admin_http, host, (uint16_t)port) != 0) {
		log_error("admin %s: cannot listen", addr);
		return -1;
	}
	evhttp_set_cb(admin_http, "/stats", admin_stats, NULL);
	evhttp_set_cb(admin_http, "/config", admin_config, NULL);
	evhttp_set_cb(admin_http, "/health", admin_health, NULL);
	evhttp_set_cb(admin_http, "/reload", admin_reload, NULL);
	log_info("admin endpoint on %s", addr);
	return 0;
}

void admin_close(void)
{
	if (admin_http)
		evhttp_free(admin_http);
	admin_http = NULL;
}
