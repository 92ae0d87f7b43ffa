/* admin_replay: the admin endpoint's routes over replays of dead letters:
 * POST /replay starts one, GET /replay lists them, GET /replay/ID shows
 * one's progress and outcome, DELETE /replay/ID cancels it. */
#ifndef ACEMQ_ADMIN_REPLAY_H
#define ACEMQ_ADMIN_REPLAY_H

struct http_request;

#define ADMIN_REPLAY_MAX_BODY  4096  /* a request's JSON */
#define ADMIN_REPLAY_START_MS  10000 /* a start waited for before 202 "starting" */
#define ADMIN_REPLAY_CANCEL_MS 5000  /* a cancel waited for before 200 "running" */

/* The routes' handler; arg points to the admin's admin_rules_fn. */
void admin_replay(struct http_request *req, void *arg);

#endif
