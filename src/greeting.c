/* greeting: the proxy's own side of the connection handshake, and its
 * replay to the broker chosen by vhost; what each broker address announced
 * in its connection.start, and which of it a new client is shown. */
#include "greeting.h"

#include "../amqp/content.h"
#include "../amqp/method.h"
#include "link.h"
#include "list.h"
#include "upstream.h"
#include "worker.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build_config.h"

#define GREETING_PROPS_MAX 16384 /* larger properties are not learned */
#define GREETING_WAIT      (-2)  /* greeting_pick: ask again later */

enum greeting_node_state {
	GREETING_NODE_UNASKED,
	GREETING_NODE_ASKING, /* the first probe is out: clients wait for it */
	GREETING_NODE_SILENT, /* a probe failed: clients no longer wait */
	GREETING_NODE_KNOWN,
};

/* A client waiting for its connection.start (greeting_await): among the
 * waiting until released, then a call posted to its worker, which frees
 * it; its greeting, freed first, takes it off the list or cuts the link. */
struct greeting_waiter {
	struct worker_call call; /* first */
	struct worker *w;
	struct link to; /* the greeting */
	void (*resume)(void *owner);
	void *owner;
	struct list node; /* linked while waiting */
};

/* What each broker address announced, encoded, and who waits for it. */
static struct {
	pthread_mutex_t lock;
	struct {
		uint8_t *bytes;
		size_t len;
		enum greeting_node_state state;
	} node[UPSTREAM_MAX];
	unsigned in_force;
	struct list waiting;
} greeting_nodes = {.lock = PTHREAD_MUTEX_INITIALIZER,
		    .waiting = {&greeting_nodes.waiting, &greeting_nodes.waiting}};

/* The node whose properties a new client is shown, GREETING_WAIT while the
 * first answers are awaited, or -1 (the proxy's own). Under the lock. */
static int greeting_pick(void)
{
	unsigned tried = 0;
	int i, asking = 0;

	/* The global list, nodes marked down last, as clients are sent. */
	while ((i = upstream_pick(NULL, tried)) >= 0) {
		tried |= 1u << i;
		if (greeting_nodes.node[i].state == GREETING_NODE_KNOWN)
			return i;
		asking |= greeting_nodes.node[i].state == GREETING_NODE_ASKING;
	}
	if (asking)
		return GREETING_WAIT;
	for (i = 0; i < UPSTREAM_MAX; i++)
		if ((greeting_nodes.in_force & (1u << i)) &&
		    greeting_nodes.node[i].state == GREETING_NODE_KNOWN)
			return i;
	for (i = 0; i < UPSTREAM_MAX; i++)
		if ((greeting_nodes.in_force & (1u << i)) &&
		    greeting_nodes.node[i].state == GREETING_NODE_ASKING)
			return GREETING_WAIT;
	return -1;
}

/* On the waiter's worker, which also frees its greeting. */
static void greeting_resume(struct worker_call *c)
{
	struct greeting_waiter *wt = (struct greeting_waiter *)c;
	struct greeting *g = link_owner(&wt->to);

	if (g) {
		g->waiter = NULL;
		wt->resume(wt->owner);
	}
	free(wt);
}

/* Something became known or gave up: the clients waiting go on, when
 * there is no more to wait for. Under the lock (posting takes only the
 * worker's own lock, never held while a call runs). */
static void greeting_release(void)
{
	struct greeting_waiter *wt;

	if (list_empty(&greeting_nodes.waiting) || greeting_pick() == GREETING_WAIT)
		return;
	list_for_each_entry_safe (wt, &greeting_nodes.waiting, node) {
		list_del(&wt->node);
		wt->call.fn = greeting_resume;
		worker_post(wt->w, &wt->call);
	}
}

void greeting_learn(int node, const amqp_table_t *server_properties)
{
	static _Thread_local uint8_t scratch[GREETING_PROPS_MAX];
	amqp_bytes_t out = {sizeof(scratch), scratch};
	size_t len = 0;
	uint8_t *copy;

	if (node < 0 || node >= UPSTREAM_MAX ||
	    amqp_encode_table(out, (amqp_table_t *)server_properties, &len) != 0)
		return;
	pthread_mutex_lock(&greeting_nodes.lock);
	if (len != greeting_nodes.node[node].len ||
	    memcmp(greeting_nodes.node[node].bytes, scratch, len) != 0) {
		copy = realloc(greeting_nodes.node[node].bytes, len ? len : 1);
		if (copy) {
			memcpy(copy, scratch, len);
			greeting_nodes.node[node].bytes = copy;
			greeting_nodes.node[node].len = len;
			greeting_nodes.node[node].state = GREETING_NODE_KNOWN;
		}
	}
	greeting_release();
	pthread_mutex_unlock(&greeting_nodes.lock);
}

static void greeting_set_state(int node, enum greeting_node_state state)
{
	if (node < 0 || node >= UPSTREAM_MAX)
		return;
	pthread_mutex_lock(&greeting_nodes.lock);
	if (greeting_nodes.node[node].state != GREETING_NODE_KNOWN)
		greeting_nodes.node[node].state = state;
	greeting_release();
	pthread_mutex_unlock(&greeting_nodes.lock);
}

void greeting_asking(int node)
{
	greeting_set_state(node, GREETING_NODE_ASKING);
}

void greeting_unanswered(int node)
{
	greeting_set_state(node, GREETING_NODE_SILENT);
}

void greeting_use_nodes(unsigned nodes)
{
	pthread_mutex_lock(&greeting_nodes.lock);
	greeting_nodes.in_force = nodes;
	greeting_release();
	pthread_mutex_unlock(&greeting_nodes.lock);
}

int greeting_known(int node)
{
	int known;

	if (node < 0 || node >= UPSTREAM_MAX)
		return 0;
	pthread_mutex_lock(&greeting_nodes.lock);
	known = greeting_nodes.node[node].state == GREETING_NODE_KNOWN;
	pthread_mutex_unlock(&greeting_nodes.lock);
	return known;
}

int greeting_await(struct greeting *g, struct worker *w, void (*resume)(void *owner),
		   void *owner)
{
	struct greeting_waiter *wt = NULL;

	pthread_mutex_lock(&greeting_nodes.lock);
	if (g->waiter == NULL && greeting_pick() == GREETING_WAIT &&
	    (wt = calloc(1, sizeof(*wt))) != NULL) {
		wt->w = w;
		link_set(&wt->to, g);
		wt->resume = resume;
		wt->owner = owner;
		list_add_tail(&wt->node, &greeting_nodes.waiting);
		g->waiter = wt;
	}
	pthread_mutex_unlock(&greeting_nodes.lock);
	return wt ? 0 : -1;
}

/* g is freed (on its worker): a waiter still waiting goes; one whose call
 * is posted no longer resumes it. */
static void greeting_unwait(struct greeting *g)
{
	struct greeting_waiter *wt = g->waiter;
	int waiting;

	pthread_mutex_lock(&greeting_nodes.lock);
	waiting = list_linked(&wt->node);
	list_del(&wt->node);
	pthread_mutex_unlock(&greeting_nodes.lock);
	if (waiting)
		free(wt);
	else
		link_cut(&wt->to);
	g->waiter = NULL;
}

void greeting_forget_waiting(void)
{
	struct greeting_waiter *wt;
	struct greeting *g;

	pthread_mutex_lock(&greeting_nodes.lock);
	list_for_each_entry_safe (wt, &greeting_nodes.waiting, node) {
		list_del(&wt->node);
		if ((g = link_owner(&wt->to)) != NULL)
			g->waiter = NULL;
		free(wt);
	}
	pthread_mutex_unlock(&greeting_nodes.lock);
}

/* The properties to show decoded into pool; 0, or -1 for the proxy's own. */
static int greeting_props(amqp_pool_t *pool, amqp_table_t *out)
{
	amqp_bytes_t copy = {0, NULL};
	size_t off = 0;
	int i;

	pthread_mutex_lock(&greeting_nodes.lock);
	i = greeting_pick();
	if (i >= 0 &&
	    (copy.bytes = amqp_pool_alloc(pool, greeting_nodes.node[i].len)) != NULL) {
		copy.len = greeting_nodes.node[i].len;
		memcpy(copy.bytes, greeting_nodes.node[i].bytes, copy.len);
	}
	pthread_mutex_unlock(&greeting_nodes.lock);
	if (copy.bytes == NULL)
		return -1;
	return amqp_decode_table(copy, pool, out, &off) == 0 ? 0 : -1;
}

struct greeting *greeting_new(void)
{
	struct greeting *g = calloc(1, sizeof(*g));

	if (g && (g->kept = evbuffer_new()) == NULL) {
		free(g);
		g = NULL;
	}
	return g;
}

void greeting_free(struct greeting *g)
{
	if (g == NULL)
		return;
	if (g->waiter)
		greeting_unwait(g);
	evbuffer_free(g->kept);
	free(g);
}

static amqp_table_entry_t greeting_bool(const char *key)
{
	amqp_table_entry_t e;

	e.key = amqp_cstring_bytes(key);
	e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
	e.value.value.boolean = 1;
	return e;
}

static amqp_table_entry_t greeting_text(const char *key, const char *value)
{
	amqp_table_entry_t e;

	e.key = amqp_cstring_bytes(key);
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes = amqp_cstring_bytes(value);
	return e;
}

int greeting_start(struct greeting *g, struct evbuffer *to_client)
{
	/* Before any broker has answered: what RabbitMQ 3.10 to 4.x
	 * announce, so clients enable the same features, under the proxy's
	 * name. */
	amqp_table_entry_t caps[] = {
	    greeting_bool("publisher_confirms"),
	    greeting_bool("exchange_exchange_bindings"),
	    greeting_bool("basic.nack"),
	    greeting_bool("consumer_cancel_notify"),
	    greeting_bool("connection.blocked"),
	    greeting_bool("consumer_priorities"),
	    greeting_bool("authentication_failure_close"),
	    greeting_bool("per_consumer_qos"),
	    greeting_bool("direct_reply_to"),
	};
	amqp_table_entry_t props[4];
	amqp_connection_start_t m;
	amqp_pool_t pool;
	int rc;

	memset(&m, 0, sizeof(m));
	init_amqp_pool(&pool, 4096);
	if (greeting_props(&pool, &m.server_properties) != 0) {
		props[0].key = amqp_cstring_bytes("capabilities");
		props[0].value.kind = AMQP_FIELD_KIND_TABLE;
		props[0].value.value.table.num_entries = (int)(sizeof(caps) / sizeof(caps[0]));
		props[0].value.value.table.entries = caps;
		props[1] = greeting_text("product", "acemq-proxy");
		props[2] = greeting_text("version", PACKAGE_VERSION);
		props[3] =
		    greeting_text("information", "an AMQP 0-9-1 proxy in front of RabbitMQ");
		m.server_properties.num_entries = (int)(sizeof(props) / sizeof(props[0]));
		m.server_properties.entries = props;
	}
	m.version_major = 0;
	m.version_minor = 9;
	/* The proxy replays the client's answer: mechanisms with one. */
	m.mechanisms = amqp_cstring_bytes("PLAIN AMQPLAIN");
	m.locales = amqp_cstring_bytes("en_US");
	g->phase = GREETING_STARTED;
	rc = method_write(to_client, 0, AMQP_CONNECTION_START_METHOD, &m);
	empty_amqp_pool(&pool);
	return rc;
}

static int greeting_is(const amqp_bytes_t *b, const char *s)
{
	return b->len == strlen(s) && memcmp(b->bytes, s, b->len) == 0;
}

int greeting_start_ok(struct greeting *g, const amqp_connection_start_ok_t *m,
		      struct evbuffer *in, size_t len, struct evbuffer *to_client)
{
	amqp_connection_tune_t t;

	if (g->phase != GREETING_STARTED ||
	    !(greeting_is(&m->mechanism, "PLAIN") || greeting_is(&m->mechanism, "AMQPLAIN")))
		return -1;
	if (evbuffer_remove_buffer(in, g->kept, len) != (int)len)
		return -1;
	g->start_ok_len = len;
	t.channel_max = GREETING_CHANNEL_MAX;
	t.frame_max = GREETING_FRAME_MAX;
	t.heartbeat = GREETING_HEARTBEAT_S;
	g->channel_max = t.channel_max;
	g->phase = GREETING_TUNED;
	return method_write(to_client, 0, AMQP_CONNECTION_TUNE_METHOD, &t);
}

int greeting_tune_ok(struct greeting *g, const amqp_connection_tune_ok_t *t,
		     struct evbuffer *in, size_t len)
{
	if (g->phase != GREETING_TUNED)
		return -1;
	evbuffer_drain(in, len);
	/* 0 or more than offered: what was offered (the proxy enforces it on
	 * every frame either way). */
	if (t->channel_max && t->channel_max < g->channel_max)
		g->channel_max = t->channel_max;
	g->frame_max = t->frame_max && t->frame_max < GREETING_FRAME_MAX ? t->frame_max
									 : GREETING_FRAME_MAX;
	g->heartbeat = t->heartbeat;
	g->phase = GREETING_OPENING;
	return 0;
}

int greeting_open(struct greeting *g, struct evbuffer *in, size_t len)
{
	if (g->phase != GREETING_OPENING)
		return -1;
	if (evbuffer_remove_buffer(in, g->kept, len) != (int)len)
		return -1;
	g->phase = GREETING_CHOSEN;
	return 0;
}

int greeting_broker_start(struct greeting *g, struct evbuffer *out)
{
	if (g->phase != GREETING_CHOSEN)
		return -1;
	/* The broker has spoken, so this address is the one: no failover
	 * needs the start-ok again. */
	g->phase = GREETING_REPLAYED;
	return evbuffer_remove_buffer(g->kept, out, g->start_ok_len) == (int)g->start_ok_len
		   ? 0
		   : -1;
}

int greeting_broker_tune(struct greeting *g, const amqp_connection_tune_t *t,
			 struct evbuffer *out, char *why, size_t whylen)
{
	amqp_connection_tune_ok_t ok;

	if (g->phase != GREETING_REPLAYED) {
		snprintf(why, whylen,
			 "CONNECTION_FORCED - the broker sent connection.tune out of order");
		return 320;
	}
	if (t->frame_max && t->frame_max < g->frame_max) {
		snprintf(why, whylen,
			 "NOT_ALLOWED - the broker's frame_max (%u) is below the %u the client "
			 "was offered",
			 t->frame_max, g->frame_max);
		return 530;
	}
	ok.channel_max = g->channel_max;
	if (t->channel_max && t->channel_max < ok.channel_max)
		ok.channel_max = t->channel_max;
	ok.frame_max = g->frame_max;
	ok.heartbeat = g->heartbeat;
	g->phase = GREETING_OPENED;
	if (method_write(out, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &ok) != 0) {
		snprintf(why, whylen, "INTERNAL_ERROR - cannot write connection.tune-ok");
		return 541;
	}
	evbuffer_add_buffer(out, g->kept); /* the open */
	return 0;
}

/* AMQPLAIN's response: a field table's entries without the table's length;
 * the long-string value of key, or -1. */
static int greeting_amqplain(const uint8_t *p, size_t len, const char *key, char *out,
			     size_t outlen)
{
	size_t at = 0, klen = strlen(key);

	while (at < len) {
		size_t n = p[at++], vlen;
		const uint8_t *name = p + at;

		if (n > len - at)
			return -1;
		at += n;
		if (at >= len || p[at] != 'S')
			return -1; /* only long strings are expected here */
		at++;
		if (len - at < 4)
			return -1;
		vlen = (size_t)p[at] << 24 | (size_t)p[at + 1] << 16 | (size_t)p[at + 2] << 8 |
		       p[at + 3];
		at += 4;
		if (vlen > len - at)
			return -1;
		if (n == klen && memcmp(name, key, n) == 0) {
			if (vlen >= outlen)
				return -1;
			memcpy(out, p + at, vlen);
			out[vlen] = '\0';
			return 0;
		}
		at += vlen;
	}
	return -1;
}

int greeting_credentials(const amqp_connection_start_ok_t *m, char *user, size_t ulen,
			 char *pass, size_t plen)
{
	const uint8_t *r = m->response.bytes;
	size_t len = m->response.len, i, u;

	if (ulen == 0 || plen == 0)
		return -1;
	if (greeting_is(&m->mechanism, "AMQPLAIN"))
		return greeting_amqplain(r, len, "LOGIN", user, ulen) == 0 &&
			       greeting_amqplain(r, len, "PASSWORD", pass, plen) == 0
			   ? 0
			   : -1;
	if (!greeting_is(&m->mechanism, "PLAIN"))
		return -1;
	/* authzid NUL authcid NUL password */
	for (i = 0; i < len && r[i]; i++)
		;
	if (i >= len)
		return -1;
	u = ++i;
	for (; i < len && r[i]; i++)
		;
	if (i >= len || i - u >= ulen || len - i - 1 >= plen)
		return -1;
	memcpy(user, r + u, i - u);
	user[i - u] = '\0';
	memcpy(pass, r + i + 1, len - i - 1);
	pass[len - i - 1] = '\0';
	return 0;
}

int greeting_capability(const amqp_table_t *props, const char *name)
{
	int i, j;

	for (i = 0; i < props->num_entries; i++) {
		const amqp_table_entry_t *e = &props->entries[i];

		if (e->value.kind != AMQP_FIELD_KIND_TABLE ||
		    !greeting_is(&e->key, "capabilities"))
			continue;
		for (j = 0; j < e->value.value.table.num_entries; j++) {
			const amqp_table_entry_t *c = &e->value.value.table.entries[j];

			if (greeting_is(&c->key, name) &&
			    c->value.kind == AMQP_FIELD_KIND_BOOLEAN)
				return c->value.value.boolean != 0;
		}
	}
	return 0;
}
