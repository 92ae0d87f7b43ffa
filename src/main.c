/* main: start-up, signals and shutdown of the acemq-proxy daemon. */
#include "admin.h"
#include "config.h"
#include "engine.h"
#include "hooks.h"
#include "janitor.h"
#include "jobs.h"
#include "limits.h"
#include "listener.h"
#include "log.h"
#include "patterns/dedup_publish.h"
#include "patterns/idempotency.h"
#include "probe.h"
#include "replay.h"
#include "rules.h"
#include "store/claims.h"
#include "store/delayed.h"
#include "store/idem.h"
#include "store/pgstore.h"
#include "store/s3.h"
#include "store/state.h"
#include "tls.h"
#include "upstream.h"
#include "worker.h"

#include "build_config.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static struct worker *main_workers;
static int main_nworkers;
static int main_stopping;
static const char *main_rules_dir;
static struct rules *main_rules; /* the set in force, for the admin view */
static pthread_mutex_t main_rules_lock = PTHREAD_MUTEX_INITIALIZER;

static struct rules *main_rules_get(void)
{
	struct rules *r;

	pthread_mutex_lock(&main_rules_lock);
	r = main_rules;
	if (r)
		rules_ref(r);
	pthread_mutex_unlock(&main_rules_lock);
	return r;
}

/* Load the rules directory and hand the set to every worker; on any error
 * the workers keep the set they have. */
static int main_load_rules(char **errors)
{
	char *text = NULL, *line, *save = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&text, &len);
	struct rules *r;
	int nerr, i;

	if (err == NULL)
		return -1;
	r = rules_load(main_rules_dir, err, &nerr);
	fclose(err);
	if (r == NULL) {
		for (line = strtok_r(text, "\n", &save); line;
		     line = strtok_r(NULL, "\n", &save))
			log_error("rules: %s", line);
		log_error("rules: %d error%s; the rules in force are kept", nerr,
			  nerr == 1 ? "" : "s");
		if (errors) {
			free(text);
			text = NULL;
			err = open_memstream(&text, &len);
			rules_unref(rules_load(main_rules_dir, err, &nerr));
			fclose(err);
			*errors = text;
			text = NULL;
		}
		free(text);
		return -1;
	}
	free(text);
	/* Before any worker greets with the set: the brokers' properties are
	 * being asked for, and clients wait for the first answers. */
	probe_rules(r);
	for (i = 0; i < main_nworkers; i++)
		worker_set_rules(&main_workers[i], r);
	janitor_set_rules(r);
	engine_sync(r);
	rules_ref(r);
	pthread_mutex_lock(&main_rules_lock);
	rules_unref(main_rules);
	main_rules = r;
	pthread_mutex_unlock(&main_rules_lock);
	if (main_nworkers)
		__atomic_add_fetch(&main_workers[0].stats.rules_reloads, 1, __ATOMIC_RELAXED);
	log_info("rules: %d vhost%s from %s", r->n, r->n == 1 ? "" : "s",
		 main_rules_dir && main_rules_dir[0] ? main_rules_dir : "(none)");
	rules_unref(r);
	return 0;
}

static void main_stop_cb(evutil_socket_t sig, short what, void *arg)
{
	struct event_base *base = arg;
	int i;

	if (main_stopping) {
		log_info("second signal: exiting now");
		exit(1);
	}
	main_stopping = 1;
	log_info("signal %d: no longer accepting; draining for up to %ld ms", (int)sig,
		 worker_settings.drain_timeout_ms);
	listener_close();
	admin_close();
	for (i = 0; i < main_nworkers; i++)
		worker_drain(&main_workers[i]);
	event_base_loopexit(base, NULL);
}

static void main_hup_cb(evutil_socket_t sig, short what, void *arg)
{
	char err[512];

	log_info("SIGHUP: reloading rules and TLS certificates");
	main_load_rules(NULL);
	if (tls_reload(err, sizeof(err)) != 0)
		log_error("TLS: %s; the certificates in force are kept", err);
}

static void main_raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Every check the start makes before it opens anything, for the start and
 * --check-config alike: the settings, the broker addresses, the rules, the
 * TLS files, the engine's settings, and the listen and admin addresses
 * (they resolve; an admin endpoint off loopback needs a token). Only
 * binding the ports is left to the start. Errors go to err; returns how
 * many. */
static int main_check(struct config *cfg, int nerr, FILE *err)
{
	char why[600];
	int i, rerr = 0, ids[] = {CFG_LISTEN, CFG_LISTEN_TLS};
	struct rules *r;
	const char *admin = config_str(cfg, CFG_ADMIN);

	for (i = 0; nerr == 0 && i < cfg->v[CFG_UPSTREAM].nlist; i++)
		if (upstream_add(cfg->v[CFG_UPSTREAM].list[i]) != 0)
			nerr++;
	upstream_set_retry_ms(config_num(cfg, CFG_UPSTREAM_RETRY_MS));
	rules_set_postgresql(config_str(cfg, CFG_POSTGRES_URL)[0] != '\0');
	rules_set_upstream_proxy((int)config_num(cfg, CFG_UPSTREAM_PROXY_PROTOCOL));
	r = rules_load(config_str(cfg, CFG_RULES), err, &rerr);
	rules_unref(r);
	nerr += rerr;
	if (config_num(cfg, CFG_UPSTREAM_TLS) && config_num(cfg, CFG_UPSTREAM_PROXY_PROTOCOL)) {
		fprintf(err, "upstream_tls and upstream_proxy_protocol together are not "
			     "supported\n");
		nerr++;
	}
	if (tls_configure(cfg, why, sizeof(why)) != 0) {
		fprintf(err, "TLS: %s\n", why);
		nerr++;
	}
	if (engine_configure(cfg) != 0) {
		fprintf(err, "engine: cannot read the broker addresses or credentials\n");
		nerr++;
	}
	for (i = 0; i < 2; i++) {
		const struct config_value *v = &cfg->v[ids[i]];
		int k;

		for (k = 0; k < v->nlist; k++)
			if (listener_check(v->list[k], why, sizeof(why)) != 0) {
				fprintf(err, "%s\n", why);
				nerr++;
			}
	}
	if (admin[0] &&
	    admin_check(admin, config_str(cfg, CFG_ADMIN_TOKEN), why, sizeof(why)) != 0) {
		fprintf(err, "%s\n", why);
		nerr++;
	}
	return nerr;
}

int main(int argc, char **argv)
{
	struct config cfg;
	struct event_base *base;
	struct event *sigterm, *sigint, *sighup;
	struct state *state = NULL;
	int nerr, i;
	long workers;

	nerr = config_load(&cfg, argc, argv, stderr);
	nerr = main_check(&cfg, nerr, stderr);
	if (cfg.check_only) {
		if (nerr)
			fprintf(stderr, "%d error%s in the configuration\n", nerr,
				nerr == 1 ? "" : "s");
		else
			printf("configuration ok\n");
		tls_free();
		config_free(&cfg);
		return nerr ? 1 : 0;
	}
	if (nerr) {
		fprintf(stderr, "%d error%s in the configuration; not starting\n", nerr,
			nerr == 1 ? "" : "s");
		tls_free();
		config_free(&cfg);
		return 1;
	}
	log_threshold = (enum log_level)config_num(&cfg, CFG_LOG_LEVEL);
	worker_settings.connect_timeout_ms = config_num(&cfg, CFG_CONNECT_TIMEOUT_MS);
	worker_settings.handshake_timeout_ms = config_num(&cfg, CFG_HANDSHAKE_TIMEOUT_MS);
	worker_settings.drain_timeout_ms = config_num(&cfg, CFG_DRAIN_TIMEOUT_MS);
	worker_settings.buffer_limit = config_num(&cfg, CFG_BUFFER_LIMIT);
	worker_settings.max_frame_pre_tune = config_num(&cfg, CFG_MAX_FRAME_PRE_TUNE);
	worker_settings.max_message_size = config_num(&cfg, CFG_MAX_MESSAGE_SIZE);
	worker_settings.proxy_protocol = (int)config_num(&cfg, CFG_PROXY_PROTOCOL);
	worker_settings.upstream_proxy_protocol =
	    (int)config_num(&cfg, CFG_UPSTREAM_PROXY_PROTOCOL);
	limits_init(config_num(&cfg, CFG_MAX_CONNECTIONS_PER_VHOST),
		    config_num(&cfg, CFG_MAX_CHANNELS));

	signal(SIGPIPE, SIG_IGN);
	main_raise_nofile();
	evthread_use_pthreads();
	hooks_register();
	main_rules_dir = config_str(&cfg, CFG_RULES);
	{
		struct state_settings set = {config_str(&cfg, CFG_DATA_DIR),
					     (uint64_t)config_num(&cfg, CFG_STATE_MAP_MB) << 20,
					     (int)config_num(&cfg, CFG_STATE_SYNC)};
		char err[512];

		state = state_open(&set, err, sizeof(err));
		if (state == NULL)
			log_error("state: cannot open %s; patterns that keep state in LMDB "
				  "refuse their messages until it can be opened",
				  err);
		claims_init(state);
		idempotency_init(state);
		dedup_publish_init(state);
		delayed_init(state,
			     (int64_t)config_num(&cfg, CFG_SCHEDULE_RECORD_MARGIN_S) * 1000);
	}
	s3_configure_from(&cfg);
	if (config_str(&cfg, CFG_POSTGRES_URL)[0]) {
		struct pgstore_settings set = {config_str(&cfg, CFG_POSTGRES_URL),
					       config_num(&cfg, CFG_POSTGRES_TIMEOUT_MS)};

		idem_set_postgresql(pgstore_open(&set));
		if (idem_postgresql() == NULL) {
			log_error("postgres: cannot start its thread");
			return 1;
		}
	}
	if (jobs_start((int)config_num(&cfg, CFG_IO_THREADS)) != 0) {
		log_error("cannot start the I/O threads");
		return 1;
	}

	workers = config_num(&cfg, CFG_WORKERS);
	if (workers == 0)
		workers = sysconf(_SC_NPROCESSORS_ONLN);
	if (workers < 1)
		workers = 1;
	main_nworkers = (int)workers;
	main_workers = calloc((size_t)main_nworkers, sizeof(*main_workers));
	for (i = 0; i < main_nworkers; i++) {
		if (worker_start(&main_workers[i], i) != 0) {
			log_error("cannot start worker %d", i);
			return 1;
		}
	}
	base = event_base_new();
	if (base == NULL || probe_init(base, config_num(&cfg, CFG_CONNECT_TIMEOUT_MS),
				       config_num(&cfg, CFG_UPSTREAM_RETRY_MS)) != 0) {
		log_error("cannot set up the main loop");
		return 1;
	}
	if (main_load_rules(NULL) != 0)
		return 1;
	janitor_startup(main_rules);
	if (janitor_start(config_num(&cfg, CFG_PURGE_INTERVAL_S), state) != 0) {
		log_error("cannot start the janitor thread");
		return 1;
	}
	/* The admin endpoint first: once a client is accepted, it answers. */
	admin_set_state(state);
	if (config_str(&cfg, CFG_ADMIN)[0] &&
	    admin_open(base, config_str(&cfg, CFG_ADMIN), &cfg, main_workers, main_nworkers,
		       main_load_rules, main_rules_get) != 0)
		return 1;
	if (listener_open(base, cfg.v[CFG_LISTEN].list, cfg.v[CFG_LISTEN].nlist, 0,
			  main_workers, main_nworkers,
			  config_num(&cfg, CFG_MAX_CONNECTIONS)) != 0 ||
	    listener_open(base, cfg.v[CFG_LISTEN_TLS].list, cfg.v[CFG_LISTEN_TLS].nlist, 1,
			  main_workers, main_nworkers,
			  config_num(&cfg, CFG_MAX_CONNECTIONS)) != 0)
		return 1;
	sigterm = evsignal_new(base, SIGTERM, main_stop_cb, base);
	sigint = evsignal_new(base, SIGINT, main_stop_cb, base);
	sighup = evsignal_new(base, SIGHUP, main_hup_cb, base);
	evsignal_add(sigterm, NULL);
	evsignal_add(sigint, NULL);
	evsignal_add(sighup, NULL);
	log_info("acemq-proxy %s: %d workers, upstream %s", PACKAGE_VERSION, main_nworkers,
		 upstream_node(0)->name);

	event_base_dispatch(base);

	/* The workers' loops end first; then the store threads, whose last
	 * completions are run before the workers are freed. */
	for (i = 0; i < main_nworkers; i++)
		pthread_join(main_workers[i].thread, NULL);
	probe_stop();
	replay_stop();
	engine_stop();
	/* Store operations of sessions that are gone still complete (and
	 * clean up after themselves) while the store threads run. */
	for (i = 0; claims_busy() > 0 && i < 10000; i++) {
		int k;

		for (k = 0; k < main_nworkers; k++)
			worker_run_posted(&main_workers[k]);
		usleep(1000);
	}
	janitor_stop();
	jobs_stop();
	s3_stop();
	tls_free();
	pgstore_close(idem_postgresql());
	state_close(state);
	rules_unref(main_rules);
	for (i = 0; i < main_nworkers; i++) {
		worker_run_posted(&main_workers[i]);
		worker_fini(&main_workers[i]);
	}
	log_info("stopped");
	event_free(sigterm);
	event_free(sigint);
	event_free(sighup);
	event_base_free(base);
	free(main_workers);
	config_free(&cfg);
	return 0;
}
