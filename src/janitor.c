/* janitor: housekeeping off the message path, on a thread of its own. */
#include "janitor.h"

#include "log.h"
#include "rules.h"
#include "store/claims.h"
#include "store/delayed.h"
#include "store/idem.h"
#include "store/pgstore.h"
#include "store/state.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

static pthread_t janitor_thread;
static pthread_mutex_t janitor_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t janitor_cond = PTHREAD_COND_INITIALIZER;
static struct rules *janitor_rules;
static long janitor_interval;
static int janitor_stopping, janitor_running;
static struct state *janitor_state;

static const char *janitor_s(long n)
{
	return n == 1 ? "" : "s";
}

/* One vhost's claim store: what went is logged, at start too. */
static void janitor_claims(const struct rules_vhost *v, int orphans)
{
	struct claims_where where;
	struct claims_purged p;
	int rc;

	claims_where(&where, v->vhost, &v->claim_check);
	rc = claims_purge(&where, v->claim_check.retention_s, orphans, &p);
	if (p.payloads > 0)
		log_info(
		    "janitor: vhost %s: %ld claim payload%s past %ld s removed (%llu bytes)",
		    v->vhost, p.payloads, janitor_s(p.payloads), v->claim_check.retention_s,
		    (unsigned long long)p.payload_bytes);
	if (p.partial > 0)
		log_info("janitor: vhost %s: %ld orphaned chunk%s of claim uploads cut short "
			 "removed (%llu bytes)",
			 v->vhost, p.partial, janitor_s(p.partial),
			 (unsigned long long)p.partial_bytes);
	if (p.partial_files > 0)
		log_info("janitor: vhost %s: %ld partial file%s of claim uploads cut short "
			 "removed (%llu bytes)",
			 v->vhost, p.partial_files, janitor_s(p.partial_files),
			 (unsigned long long)p.partial_file_bytes);
	if (rc < 0)
		log_warning("janitor: vhost %s: the claim store could not be purged", v->vhost);
}

static void janitor_purge(const struct rules *r, int orphans)
{
	long n;
	int i;

	for (i = 0; r && i < r->n; i++) {
		const struct rules_vhost *v = &r->v[i];

		if (v->claim_check.enabled)
			janitor_claims(v, orphans);
		if (v->nidempotency > 0 && janitor_state && !orphans) {
			n = idem_purge(janitor_state, v->vhost, state_now_ms());
			if (n > 0)
				log_info("janitor: vhost %s: %ld idempotency record%s past "
					 "their time removed",
					 v->vhost, n, janitor_s(n));
		}
		if (v->schedule.enabled && janitor_state && !orphans) {
			n = delayed_purge(v->vhost, (int64_t)state_now_ms());
			if (n > 0)
				log_info("janitor: vhost %s: %ld delayed-message record%s past "
					 "their due time removed",
					 v->vhost, n, janitor_s(n));
		}
		if (v->dedup_publish.enabled && janitor_state && !orphans) {
			n = idem_dedup_purge(janitor_state, v->vhost, state_now_ms());
			if (n > 0)
				log_info("janitor: vhost %s: %ld publish-dedup value%s past "
					 "their window removed",
					 v->vhost, n, janitor_s(n));
		}
	}
	/* PostgreSQL's rows are the fleet's: one purge for every vhost, by
	 * one proxy at a time, never at start-up. */
	if (r && r->any_postgresql && idem_postgresql() && !orphans) {
		n = pgstore_purge(idem_postgresql(), 1000, 100);
		if (n > 0)
			log_info("janitor: %ld PostgreSQL key%s past their time removed", n,
				 janitor_s(n));
	}
}

void janitor_startup(const struct rules *r)
{
	janitor_purge(r, 1);
}

static void *janitor_main(void *arg)
{
	struct timespec until;
	struct rules *r;

	pthread_mutex_lock(&janitor_lock);
	while (!janitor_stopping) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += janitor_interval;
		while (!janitor_stopping && pthread_cond_timedwait(&janitor_cond, &janitor_lock,
								   &until) != ETIMEDOUT)
			;
		if (janitor_stopping)
			break;
		r = janitor_rules;
		if (r)
			rules_ref(r);
		pthread_mutex_unlock(&janitor_lock);
		janitor_purge(r, 0);
		rules_unref(r);
		pthread_mutex_lock(&janitor_lock);
	}
	pthread_mutex_unlock(&janitor_lock);
	return NULL;
}

int janitor_start(long interval_s, struct state *st)
{
	janitor_state = st;
	if (interval_s <= 0)
		return 0;
	janitor_interval = interval_s;
	if (pthread_create(&janitor_thread, NULL, janitor_main, NULL) != 0)
		return -1;
	janitor_running = 1;
	return 0;
}

void janitor_set_rules(struct rules *r)
{
	rules_ref(r);
	pthread_mutex_lock(&janitor_lock);
	rules_unref(janitor_rules);
	janitor_rules = r;
	pthread_mutex_unlock(&janitor_lock);
}

void janitor_stop(void)
{
	pthread_mutex_lock(&janitor_lock);
	janitor_stopping = 1;
	pthread_cond_signal(&janitor_cond);
	pthread_mutex_unlock(&janitor_lock);
	if (janitor_running)
		pthread_join(janitor_thread, NULL);
	janitor_running = 0;
	rules_unref(janitor_rules);
	janitor_rules = NULL;
}
