/* admin_replay: the admin endpoint's routes over replays of dead letters:
 * POST /replay starts one, GET /replay lists them, GET /replay/ID shows
 * one's progress and outcome, DELETE /replay/ID cancels it. */
#ifndef ACEMQ_ADMIN_REPLAY_H
#define ACEMQ_ADMIN_REPLAY_H

struct http_request;

#define ADMIN_REPLAY_MAX_BODY 4096 /* a request's JSON */
/* Waited for on the listeners' thread, at most: a start (then 202
 * "starting"; a failure shows in GET later) and a cancel (then 200
 * "running"). */
#define ADMIN_REPLAY_START_MS  3000
#define ADMIN_REPLAY_CANCEL_MS 3000

/* The routes' handler; arg points to the admin's admin_rules_fn. */
void admin_replay(struct http_request *req, void *arg);

#endif
