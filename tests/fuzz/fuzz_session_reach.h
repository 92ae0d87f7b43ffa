/* fuzz_session_reach: what each seed of the session fuzzer's corpus is for,
 * checked as the corpus is replayed (make check). */
#ifndef ACEMQ_FUZZ_SESSION_REACH_H
#define ACEMQ_FUZZ_SESSION_REACH_H

#include "src/stats.h"

/* After each input: the worker's counters before and after it ran. */
void fuzz_session_reach_ran(const struct stats *before, const struct stats *after);
/* For the replay driver (replay.c): after each file, and after the last;
 * non-zero fails the replay. */
int fuzz_replayed(const char *path);
int fuzz_replay_done(void);

#endif
