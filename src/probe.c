/* probe: asks each broker address of the lists in force what it announces,
 * for the greeting (src/greeting.c), on the main thread's loop: a
 * connection of the proxy's own sends the protocol header (in TLS, or
 * after a PROXY header naming its own two ends, as the sessions' broker
 * connections do), reads the broker's connection.start, hands its server
 * properties to the greeting and closes. An address is asked once it is
 * in a list and its properties are not known; one that does not answer
 * within connect_timeout_ms is asked again every upstream_retry_ms while it
 * stays unknown.
 *
 * Closing after connection.start is the quietest way out there is without
 * credentials: RabbitMQ logs a warning ("client unexpectedly closed TCP
 * connection") once per probe, where a start-ok it cannot accept or a
 * connection.close before it is logged as an error. */
#include "probe.h"

#include "../amqp/frame_scan.h"
#include "../amqp/method.h"
#include "../amqp/proxyproto.h"
#include "config.h"
#include "dial.h"
#include "greeting.h"
#include "log.h"
#include "rules.h"
#include "tls.h"
#include "transport.h"
#include "upstream.h"
#include "worker.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#define PROBE_FRAME_MAX 131072u /* a connection.start larger than this is refused */
#define PROBE_RETRY_MIN 1000L   /* ms: the least time between two asks */

static const uint8_t probe_amqp_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};

struct probe {
	int node;
	struct transport *tr; /* the ask in progress, or NULL */
	struct event *timer;  /* its deadline; without one: the next ask */
	int asked;            /* asks so far */
	int silent;           /* the last ask failed (logged once) */
};

static struct probe probe_nodes[UPSTREAM_MAX];
static struct event_base *probe_base;
static long probe_timeout_ms = 5000, probe_retry_ms = 10000;
static unsigned probe_in_force; /* the nodes of the lists in force */

static void probe_timer_set(struct probe *p, long ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

	evtimer_add(p->timer, &tv);
}

static void probe_close(struct probe *p)
{
	if (p->tr) {
		transport_free(p->tr);
		p->tr = NULL;
	}
	if (p->timer)
		evtimer_del(p->timer);
}

/* The ask ended without properties: asked again later, while the node is
 * in force and unknown. */
static void probe_failed(struct probe *p, const char *why)
{
	const struct upstream_node *n = upstream_node(p->node);

	probe_close(p);
	if (!p->silent)
		log_info("broker %s did not answer the greeting's probe (%s); asked again "
			 "every %ld ms",
			 n->name, why, probe_retry_ms);
	p->silent = 1;
	greeting_unanswered(p->node);
	if (probe_in_force & (1u << p->node))
		probe_timer_set(p, probe_retry_ms);
}

/* The broker's first frame: its connection.start, or a failure. */
static void probe_read_cb(struct transport *t, void *arg)
{
	struct probe *p = arg;
	struct evbuffer *in = transport_input(t);
	uint8_t first[4];
	struct frame_info fi;
	amqp_method_number_t id;
	amqp_pool_t pool;
	void *m = NULL;
	int rc;

	/* A broker that does not speak 0-9-1 answers with its own header. */
	if (evbuffer_copyout(in, first, sizeof(first)) == (ev_ssize_t)sizeof(first) &&
	    memcmp(first, probe_amqp_header, sizeof(first)) == 0) {
		probe_failed(p, "it refused the protocol header");
		return;
	}
	rc = frame_scan_evbuffer(in, 0, PROBE_FRAME_MAX - FRAME_OVERHEAD, &fi);
	if (rc == FRAME_SCAN_AGAIN)
		return;
	if (rc != FRAME_SCAN_OK || fi.type != FRAME_METHOD || fi.channel != 0 ||
	    METHOD_ID(fi.class_id, fi.method_id) != AMQP_CONNECTION_START_METHOD) {
		probe_failed(p, "its first frame was not connection.start");
		return;
	}
	init_amqp_pool(&pool, 4096);
	rc = method_decode_evbuffer(in, fi.size, &pool, &id, &m);
	if (rc == 0) {
		greeting_learn(p->node, &((amqp_connection_start_t *)m)->server_properties);
		if (p->silent)
			log_info("broker %s answers the greeting's probe",
				 upstream_node(p->node)->name);
		else
			log_debug("broker %s announced its server properties",
				  upstream_node(p->node)->name);
		p->silent = 0;
		probe_close(p);
	}
	empty_amqp_pool(&pool);
	if (rc != 0)
		probe_failed(p, "its connection.start does not decode");
}

static void probe_event_cb(struct transport *t, int what, int err, void *arg)
{
	struct probe *p = arg;
	char why[256];

	if (what & TRANSPORT_CONNECTED)
		return;
	if (what & TRANSPORT_EOF)
		snprintf(why, sizeof(why), "it closed before connection.start");
	else
		snprintf(why, sizeof(why), "%s", transport_error(t, err));
	probe_failed(p, why);
}

static void probe_ask(struct probe *p)
{
	const struct upstream_node *n = upstream_node(p->node);
	struct sockaddr_storage local;
	socklen_t locallen = sizeof(local);
	uint8_t pp[PROXYPROTO_V2_MAX];

	if (n == NULL || p->tr || greeting_known(p->node) ||
	    !(probe_in_force & (1u << p->node)))
		return;
	evtimer_del(p->timer);
	if (p->asked++ == 0)
		greeting_asking(p->node);
	p->tr = transport_connect(probe_base, (const struct sockaddr *)&n->sa, n->salen);
	if (p->tr && tls_upstream() && dial_tls(p->tr, n) != 0) {
		transport_free(p->tr);
		p->tr = NULL;
		errno = EPROTO;
	}
	if (p->tr == NULL) {
		probe_failed(p, strerror(errno));
		return;
	}
	transport_setcb(p->tr, probe_read_cb, NULL, probe_event_cb, p);
	/* No client behind it: the PROXY header names this connection's own
	 * ends (RabbitMQ 3.10 fails a connection whose header says LOCAL). */
	if (worker_settings.upstream_proxy_protocol) {
		if (getsockname(transport_fd(p->tr), (struct sockaddr *)&local, &locallen) !=
		    0) {
			probe_failed(p, strerror(errno));
			return;
		}
		evbuffer_add(transport_output(p->tr), pp,
			     proxyproto_write_v2(pp, (struct sockaddr *)&local,
						 (const struct sockaddr *)&n->sa));
	}
	evbuffer_add(transport_output(p->tr), probe_amqp_header, sizeof(probe_amqp_header));
	transport_read_enable(p->tr);
	probe_timer_set(p, probe_timeout_ms);
}

static void probe_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct probe *p = arg;
	char why[64];

	if (p->tr == NULL) {
		probe_ask(p); /* the next ask */
		return;
	}
	snprintf(why, sizeof(why), "no connection.start within %ld ms", probe_timeout_ms);
	probe_failed(p, why);
}

int probe_init(struct event_base *base, long timeout_ms, long retry_ms)
{
	int i;

	probe_base = base;
	probe_timeout_ms = timeout_ms;
	probe_retry_ms = retry_ms < PROBE_RETRY_MIN ? PROBE_RETRY_MIN : retry_ms;
	for (i = 0; i < UPSTREAM_MAX; i++) {
		probe_nodes[i].node = i;
		probe_nodes[i].timer = evtimer_new(base, probe_timer_cb, &probe_nodes[i]);
		if (probe_nodes[i].timer == NULL)
			return -1;
	}
	return 0;
}

void probe_rules(const struct rules *r)
{
	unsigned nodes = 0;
	int i, k;

	if (probe_base == NULL)
		return;
	/* Only greeted clients are shown what a broker announced. */
	if (r && r->greets) {
		while ((i = upstream_pick(NULL, nodes)) >= 0)
			nodes |= 1u << i;
		for (k = 0; k < r->n; k++)
			for (i = 0; i < r->v[k].upstream.n; i++)
				nodes |= 1u << r->v[k].upstream.at[i];
	}
	probe_in_force = nodes;
	greeting_use_nodes(nodes);
	for (i = 0; i < UPSTREAM_MAX; i++) {
		if (nodes & (1u << i))
			probe_ask(&probe_nodes[i]);
		else if (probe_nodes[i].tr == NULL && probe_nodes[i].timer)
			evtimer_del(probe_nodes[i].timer); /* no more asks */
	}
}

void probe_stop(void)
{
	int i;

	for (i = 0; i < UPSTREAM_MAX; i++) {
		probe_close(&probe_nodes[i]);
		if (probe_nodes[i].timer)
			event_free(probe_nodes[i].timer);
		probe_nodes[i].timer = NULL;
	}
	probe_base = NULL;
	greeting_forget_waiting();
}
