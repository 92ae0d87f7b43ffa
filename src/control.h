/* control: what an operator asks of the connections open now, the rules'
 * rate limits on a session (the buckets are ratelimit.c's), and the
 * switch that outlives them: a connection closed or drained, a vhost's
 * publishers paused (a client's frames stop at its next publish, as during
 * a broker alarm; deliveries and acks of clients that only consume go on),
 * every client of a vhost or of a broker address drained. The paused
 * vhosts are process-wide; an action on a session runs on its own worker.
 * A drained client is closed (connection.close 320) once the broker has
 * answered every publish of its channels in confirm mode, or when the
 * drain's grace period (drain_timeout) ends. */
#ifndef ACEMQ_CONTROL_H
#define ACEMQ_CONTROL_H

#include <stdint.h>

struct evbuffer;
struct session;
struct worker;

/* ---- the paused vhosts (any thread) ---------------------------------- */
/* Pause or resume vhost: 1 if that changed something, 0 if it was so
 * already, -1 out of memory. */
int control_pause(const char *vhost, int on);
int control_paused(const char *vhost);
int control_paused_count(void);
/* The paused vhosts as a JSON array, and as /metrics lines. */
void control_paused_json(struct evbuffer *out);
void control_paused_metrics(struct evbuffer *out);

/* ---- actions on sessions (on their worker) --------------------------- */
enum control_action {
	CONTROL_CLOSE, /* connection.close 320 with the reason, at once */
	CONTROL_DRAIN, /* connection.close 320 once its publishes are confirmed */
	CONTROL_GATE,  /* the vhost was paused */
	CONTROL_UNGATE /* the vhost was resumed */
};

/* Which sessions: id 0, vhost NULL, upstream -1 each match any. */
struct control_target {
	uint64_t id;
	const char *vhost;
	int upstream; /* the index of the broker address its leg reached */
};

/* Apply to the sessions of w that match; returns how many did. */
int control_apply(struct worker *w, const struct control_target *t, enum control_action a,
		  const char *reason);

/* ---- the session's side ---------------------------------------------- */
/* connection.open named the vhost: gated if it is paused; its rules'
 * connection rate applied (-1: refused, the caller says why). */
int control_opened(struct session *s);
/* The client's frames were pumped: a rated vhost's publisher waits when
 * its vhost is over its byte rate (ratelimit.c). */
void control_rate(struct session *s);
/* The wait is over (SEV_LATER): the client is read again. */
void control_later(struct session *s);
/* A new rules set: whether the vhost is rated now. */
void control_rules(struct session *s);
/* After each of the session's events: a drained session whose publishes
 * are all answered closes. */
void control_check(struct session *s);
/* The session's timer fired while open: the drain's grace ran out (1), or
 * the timer was not the drain's (0). */
int control_timer(struct session *s);

#endif
