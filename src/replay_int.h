/* replay_int: a replay's state, shared by replay.c (its thread: the
 * connection, taking, publishing, settling) and replay_jobs.c (the
 * registry of replays, waiting on them, their JSON). */
#ifndef ACEMQ_REPLAY_INT_H
#define ACEMQ_REPLAY_INT_H

#include "replay.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define REPLAY_MESSAGE_ID 128 /* bytes of a message-id shown */

/* Why a message stayed in the source: X(name, what). */
#define REPLAY_REASONS(X)                                                          \
	X(returned, "unroutable: the broker returned it")                          \
	X(nacked, "the broker refused the publish")                                \
	X(no_x_death, "no x-death header to take the target from, and none given") \
	X(no_exchange, "its target exchange does not exist")                       \
	X(payload_missing, "a claim check whose payload is not in the store")      \
	X(bad_key, "a claim check with a key the store never issues")              \
	X(store_error, "the claim store could not be asked")                       \
	X(unsettled, "its publish was out when the replay ended (it may be in both)")

enum replay_reason {
#define REPLAY_ENUM(name, what) REPLAY_##name,
	REPLAY_REASONS(REPLAY_ENUM)
#undef REPLAY_ENUM
	    REPLAY_NREASONS,
	REPLAY_MOVE = -1
};

enum replay_state {
	REPLAY_STARTING,
	REPLAY_RUNNING,
	REPLAY_DONE,
	REPLAY_CANCELLED,
	REPLAY_FAILED
};

extern const char *const replay_state_names[];

struct replay_missing {
	char key[CLAIMS_KEY_LEN + 1];
	char message_id[REPLAY_MESSAGE_ID + 1];
	size_t id_len;
	int has_id;
};

struct replay {
	long id;
	struct replay_spec spec;
	pthread_t thread;
	int cancel; /* atomic */
	/* Under replay_lock. */
	enum replay_state state;
	int start_status; /* the HTTP status its start gets */
	const char *start_why;
	char error[256];
	int empty; /* the queue ran dry before count */
	long queued;
	uint64_t taken, moved, skipped[REPLAY_NREASONS];
	struct replay_missing missing[REPLAY_MAX_MISSING];
	int nmissing;
	uint64_t started_ms, ended_ms;
	struct replay *next; /* newest first */
};

/* The registry's lock (every member marked so) and its condition (a
 * replay started or ended). */
extern pthread_mutex_t replay_lock;
extern pthread_cond_t replay_cond;

/* replay.c: a replay's thread, started by the registry. */
void *replay_main(void *arg);

#endif
