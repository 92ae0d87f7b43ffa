/* pool_int: what pool.c, pool_conn.c and pool_mux.c share. */
#ifndef ACEMQ_POOL_INT_H
#define ACEMQ_POOL_INT_H

#include "list.h"
#include "rules.h"
#include "upstream.h"
#include "worker.h"

#include <amqp.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

struct transport;
struct event;
struct evbuffer;
struct worker;
struct session;

#define POOL_HASH_LEN 32

enum pool_slot_state {
	SLOT_FREE,
	SLOT_OPENING, /* channel.open sent for a client */
	SLOT_OPEN,
	SLOT_ORPHAN, /* its client went or gave it up: closing at the broker */
	SLOT_PROBE,  /* its client went: the qos(0) that decides keeping it is out */
	SLOT_KEPT,   /* open at the broker, kept for the next client (pool_chan) */
};

/* One broker channel (M) of a connection. */
struct pool_slot {
	struct pool_att *att;    /* NULL unless OPENING or OPEN */
	struct pool_att *waiter; /* orphaned by a closing client that awaits it */
	uint16_t n;              /* the client's number for it */
	uint8_t state;
	uint8_t exclusive_pending; /* a queue.declare exclusive is out on it */
	uint8_t closing;           /* POOL_CLOSE_* bits */
	uint64_t content_left;     /* body bytes of a publish still to come */
	/* pool_chan: keeping the channel for the next client */
	uint8_t confirm;   /* in confirm mode at the broker */
	uint8_t cselected; /* its client selected confirms */
	uint8_t dirty;     /* it holds state a new channel has not: not kept */
	uint8_t probe;     /* the qos(0) is out */
	uint8_t fresh;     /* taken from the kept ones, no method sent on it yet */
	uint8_t unsure;    /* a method not a publish went since it was kept */
	uint8_t hide_open; /* opened by the proxy for a client: its open-ok not shown */
	uint64_t bseq;     /* publishes on it since its confirm.select */
	uint64_t cbase;    /* bseq at its client's confirm.select */
	uint64_t floor;    /* every publish up to it confirmed... */
	uint64_t bits;     /* ...and those of floor+1+i for each bit i */
};

#define POOL_KEPT_MAX 32 /* channels of each kind kept per connection */

/* A broker channel is free again once every channel.close on it, from
 * either side, has had its close-ok (pool_conn_settle): never before, or a
 * late close-ok would reach the next client given the number. */
#define POOL_CLOSE_SENT 1 /* a channel.close went to the broker */
#define POOL_CLOSE_DONE 2 /* and the broker's close-ok came */
#define POOL_CLOSE_GOT  4 /* the broker sent channel.close: it waits for close-ok */

enum pool_conn_phase {
	CONN_CONNECTING,
	CONN_START,   /* header sent: waiting for connection.start */
	CONN_CREDS,   /* start kept: waiting for a client's start-ok */
	CONN_TUNE,    /* start-ok sent */
	CONN_OPENING, /* tune-ok and open sent */
	CONN_READY,
	CONN_CLOSING, /* connection.close sent, or the broker's answered */
};

struct pool_conn {
	uint64_t id;
	struct pool *pool;
	struct list node; /* in pool->conns */
	struct transport *tr;
	enum pool_conn_phase phase;
	struct pool_att *auth; /* whose credentials open it */
	uint8_t *start;        /* the broker's connection.start frame, replayed to clients */
	size_t start_len;
	uint32_t frame_max;
	uint16_t heartbeat;
	uint16_t nslots; /* channel numbers 1..nslots-1 */
	struct pool_slot *slots;
	unsigned used; /* slots not FREE (the kept ones too: open at the broker) */
	uint16_t kept[2][POOL_KEPT_MAX]; /* kept slots, plain [0] and in confirm mode [1] */
	unsigned nkept[2];
	uint16_t hint; /* where to look for a free slot */
	struct list atts;
	unsigned natts;
	unsigned nfull;              /* attachments whose input is full: broker reads stop */
	struct event *timer;         /* heartbeats, idle close, clients' heartbeats */
	time_t idle_since;           /* no attachment since (0: has some) */
	time_t last_out;             /* a frame was written to the broker */
	int at;                      /* the upstream address */
	unsigned tried;              /* addresses tried (a bit each) */
	unsigned check_only : 1;     /* over the bound: closes once the credentials pass */
	unsigned counted : 1;        /* counted in its key's connections */
	struct list exclusive;       /* struct pool_queue: exclusive queues, owner att */
	uint8_t hash[POOL_HASH_LEN]; /* the credentials it was opened with */
};

enum pool_att_phase {
	ATT_START,   /* waiting for a connection.start to show */
	ATT_STARTOK, /* start shown: waiting for the client's start-ok */
	ATT_AUTH,    /* its credentials are with a connection opening */
	ATT_WAIT,    /* credentials good; every connection is full */
	ATT_TUNE,    /* tune shown: waiting for tune-ok and open */
	ATT_OPEN,
	ATT_CLOSING, /* a connection.close was shown: frames dropped */
};

/* Where a client's session (on its worker, A) and its pool (on the pool's
 * home worker, P) meet: two buffers and two posted calls, under a lock.
 * Each side holds a reference, and so does each call while posted. */
struct pool_xfer {
	pthread_mutex_t lock;
	int refs;
	struct evbuffer *up;   /* A to P: what the session wrote for the broker */
	struct evbuffer *down; /* P to A: what the session is to read */
	struct worker_call to_a, to_p;
	struct worker *wa;
	struct pool *pool;
	/* under the lock */
	unsigned a_posted : 1, p_posted : 1;
	unsigned gone : 1;   /* A let go of the pipe */
	unsigned end : 1;    /* P: the broker side ended */
	unsigned kick : 1;   /* P: the broker side has room again */
	unsigned unfull : 1; /* A: the session read again after its input was full */
	/* A only */
	struct transport *tr; /* the session's broker leg (a pipe) */
	struct session *s;
	/* P only */
	struct pool_att *att;
	unsigned released : 1; /* P's reference given up */
	/* read by A, written by P */
	int64_t conn_id; /* atomic: the broker connection (0: none yet) */
	int at;          /* atomic: its broker address */
	int a_full;      /* atomic: written by A, the session's input is full */
	/* set by A before the first post */
	uint64_t session_id;
	uint64_t deadline_ms; /* monotonic: a wait for room ends here */
	struct rules_pool cfg;
	struct upstream_list upstreams;
};

/* A client session's end of the pool, on the pool's home worker. */
struct pool_att {
	struct pool_xfer *x;
	uint64_t session_id;
	struct pool *pool;
	struct pool_conn *conn; /* bound (ATT_TUNE on), or authenticating */
	struct evbuffer *up;    /* the session's frames, taken from x->up */
	struct evbuffer *down;  /* frames for the session, handed to x->down */
	struct list node;       /* in conn->atts or pool->waiting */
	enum pool_att_phase phase;
	uint16_t *map;    /* client channel N -> broker channel M (0: none) */
	uint8_t *refused; /* per N: closed by the pool, awaiting the client's close-ok */
	uint32_t nmap;
	uint8_t hash[POOL_HASH_LEN];
	struct evbuffer *startok;  /* the client's start-ok frame */
	uint16_t heartbeat;        /* the client's */
	time_t last_in;            /* a frame was given to the client */
	uint64_t wait_until;       /* monotonic ms: refused (530) past it while waiting */
	unsigned closing_chans;    /* its broker channels still closing before close-ok */
	unsigned caps_blocked : 1; /* the client takes connection.blocked */
	unsigned consumed : 1;     /* it sent basic.consume or basic.get */
	unsigned needs_check : 1;  /* waiting for the pool's credential check */
	unsigned full : 1;         /* counted in conn->nfull */
	struct list exclusive;     /* struct pool_queue it declared */
};

/* An exclusive queue a client declared on a pooled connection. */
struct pool_queue {
	struct list node;      /* in the att's list */
	struct list conn_node; /* in the conn's list */
	struct pool_att *owner;
	char name[256];
};

/* Per (vhost, user) and worker, kept on its home worker: what is not
 * marked otherwise is touched on the home worker only. */
struct pool {
	struct pool *next; /* the registry (under its lock) */
	struct list homed; /* in its home worker's list */
	char vhost[128], user[128];
	struct worker *home;
	int refs; /* under the registry's lock: clients attached or attaching */
	struct rules_pool cfg;
	struct upstream_list upstreams;
	struct list conns, waiting;
	unsigned nconns;   /* under the registry's lock: counted against the bound */
	unsigned reserved; /* under the registry's lock: 1 while room is held for
			    * its first connection (pool_get) */
	struct event *wait_timer;
	uint8_t hash[POOL_HASH_LEN]; /* of the password the broker last accepted */
	time_t trusted_until;
};

/* Channels kept for the next client, and the channels clients use. */
static inline unsigned pool_conn_kept(const struct pool_conn *c)
{
	return c->nkept[0] + c->nkept[1];
}

static inline unsigned pool_conn_busy(const struct pool_conn *c)
{
	return c->used - pool_conn_kept(c);
}

/* pool.c */
void pool_show_start(struct pool_att *a, const struct pool_conn *c);
void pool_credentials_in(struct pool_att *a);
void pool_conn_opened(struct pool_conn *c);
void pool_conn_refused(struct pool_conn *c, const uint8_t *frame, size_t len);
void pool_conn_gone(struct pool_conn *c);
void pool_bind(struct pool_att *a, struct pool_conn *c);
void pool_att_close(struct pool_att *a, uint16_t code, const char *text);
void pool_feed(struct pool_att *a);
void pool_channels_add(int delta);
void pool_att_end(struct pool_att *a);
int pool_conns_take(struct pool *p);
void pool_conns_drop(struct pool *p);
int pool_group_full(struct pool *p);
void pool_retry_waiting(struct pool *p);

/* pool_conn.c */
struct pool_conn *pool_conn_new(struct pool *p, struct pool_att *auth, int check);
void pool_conn_free_slot(struct pool_conn *c, uint16_t m);
void pool_conn_settle(struct pool_conn *c, uint16_t m);
void pool_conn_close(struct pool_conn *c, const char *why);
void pool_conn_give_creds(struct pool_conn *c, struct pool_att *a);
int pool_conn_slot(struct pool_conn *c, struct pool_att *a, uint16_t n);
void pool_conn_orphan(struct pool_conn *c, uint16_t m);
void pool_conn_kick(struct pool_conn *c);
struct evbuffer *pool_conn_out(struct pool_conn *c);
int pool_conn_room(const struct pool_conn *c);
void pool_conn_idle_check(struct pool_conn *c);

/* pool_chan.c */
uint16_t pool_chan_take(struct pool_conn *c, struct pool_att *a, uint16_t n);
uint16_t pool_chan_first(struct pool_conn *c, struct pool_att *a, uint16_t n, int confirm);
void pool_chan_sent(struct pool_slot *sl, amqp_method_number_t id);
int pool_chan_select(struct pool_conn *c, uint16_t m, int nowait);
int pool_chan_retire(struct pool_conn *c, uint16_t m, int client);
void pool_chan_probed(struct pool_conn *c, uint16_t m);
int pool_chan_confirm(struct pool_slot *sl, uint8_t *p, size_t len);
void pool_chan_closed(struct pool_conn *c, uint16_t m);

/* pool_mux.c */
void pool_mux_output(void *arg);
void pool_mux_leave(struct pool_att *a, int wait);
void pool_mux_closed(struct pool_att *a);
struct pool_queue *pool_mux_locked(struct pool_conn *c, const struct pool_att *a,
				   const char *name, size_t len);

#endif
