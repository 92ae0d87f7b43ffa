/* ratelimit: token buckets per vhost for the rules' connection and publish
 * rates, shared by the workers under one lock (a take is a few arithmetic
 * operations; only rated vhosts' sessions take). */
#include "ratelimit.h"

#include "log.h"
#include "rules.h"
#include "vstats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ratelimit_bucket {
	double tokens; /* may go below 0: a debt paid by waiting */
	int64_t at_ms; /* last refill (monotonic) */
	int episode;   /* over the rate, logged (alarm mode) until full again */
	int primed;    /* filled at its first take */
};

struct ratelimit_vhost {
	char *name;
	struct ratelimit_bucket conn, bytes;
	struct vstats *counters;
	struct ratelimit_vhost *next;
};

static pthread_mutex_t ratelimit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ratelimit_vhost *ratelimit_list;

static int64_t ratelimit_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Under the lock: the vhost's buckets, made on first use. */
static struct ratelimit_vhost *ratelimit_find(const char *vhost)
{
	struct ratelimit_vhost *v;

	for (v = ratelimit_list; v; v = v->next)
		if (strcmp(v->name, vhost) == 0)
			return v;
	if ((v = calloc(1, sizeof(*v))) == NULL || (v->name = strdup(vhost)) == NULL) {
		free(v);
		return NULL;
	}
	v->counters = vstats_get(vhost, NULL);
	v->next = ratelimit_list;
	ratelimit_list = v;
	return v;
}

/* Refill at rate a second, up to a second's worth; take n. */
static void ratelimit_take(struct ratelimit_bucket *b, double rate, double n, int64_t now)
{
	if (!b->primed) {
		b->primed = 1;
		b->tokens = rate;
		b->at_ms = now;
	}
	b->tokens += rate * (double)(now - b->at_ms) / 1000.0;
	if (b->tokens > rate)
		b->tokens = rate;
	b->at_ms = now;
	b->tokens -= n;
}

/* Charge n to a bucket of rate a second: the debt left (0: none). In alarm
 * mode there is never a debt: an excess is counted (over) and its episode
 * logged when it starts. An episode ends only when the bucket was full
 * before a take (a second's worth unused): a burst that dips below the rate
 * between two of its messages is still one episode, logged once. */
static double ratelimit_charge(struct ratelimit_vhost *v, struct ratelimit_bucket *b,
			       const char *what, long rate, double n, int alarm,
			       enum vstats_counter over, int64_t now)
{
	ratelimit_take(b, (double)rate, n, now);
	if (b->tokens >= 0) {
		if (b->tokens + n >= (double)rate)
			b->episode = 0;
		return 0;
	}
	if (!alarm)
		return -b->tokens;
	b->tokens = 0;
	vstats_add(v->counters, over);
	if (!b->episode)
		log_warning("vhost %s over its %s of %ld a second (limits mode alarm: counted, "
			    "not enforced; logged again after the rate is kept)",
			    v->name, what, rate);
	b->episode = 1;
	return 0;
}

int ratelimit_connection(const char *vhost, const struct rules_limits *l)
{
	int64_t now = ratelimit_now_ms();
	struct ratelimit_vhost *v;
	int refused = 0;

	if (l->connections_per_s <= 0)
		return 0;
	pthread_mutex_lock(&ratelimit_lock);
	if ((v = ratelimit_find(vhost)) != NULL &&
	    ratelimit_charge(v, &v->conn, "connections_per_s", l->connections_per_s, 1,
			     l->alarm, VSTATS_rate_connection_over, now) > 0) {
		v->conn.tokens += 1; /* refused: nothing taken */
		vstats_add(v->counters, VSTATS_rate_refused);
		refused = 1;
	}
	pthread_mutex_unlock(&ratelimit_lock);
	return refused ? -1 : 0;
}

long ratelimit_publish(const char *vhost, const struct rules_limits *l, size_t n)
{
	int64_t now = ratelimit_now_ms();
	struct ratelimit_vhost *v;
	double debt = 0;

	if (l->publish_bytes_per_s <= 0 || n == 0)
		return 0;
	pthread_mutex_lock(&ratelimit_lock);
	if ((v = ratelimit_find(vhost)) != NULL &&
	    (debt =
		 ratelimit_charge(v, &v->bytes, "publish_bytes_per_s", l->publish_bytes_per_s,
				  (double)n, l->alarm, VSTATS_rate_publish_over, now)) > 0)
		/* Paid by waiting: every publisher of the vhost that sends
		 * meanwhile waits its turn too. */
		vstats_add(v->counters, VSTATS_rate_slowed);
	pthread_mutex_unlock(&ratelimit_lock);
	return debt > 0 ? (long)(debt * 1000.0 / (double)l->publish_bytes_per_s) + 1 : 0;
}

void ratelimit_test_refill(void)
{
	struct ratelimit_vhost *v;

	pthread_mutex_lock(&ratelimit_lock);
	for (v = ratelimit_list; v; v = v->next)
		v->conn.primed = v->bytes.primed = 0;
	pthread_mutex_unlock(&ratelimit_lock);
}
