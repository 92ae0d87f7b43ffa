/* jobs: threads that run blocking work (store reads, file writes, fsync)
 * off the workers' loops and hand each result back to the worker that
 * asked. Jobs of one lane run one at a time, in submission order. */
#ifndef ACEMQ_JOBS_H
#define ACEMQ_JOBS_H

#include "worker.h"

#include <stdint.h>

struct job {
	struct worker_call call;    /* done: posted to w once run has returned */
	void (*run)(struct job *j); /* on a jobs thread */
	struct worker *w;
	uint64_t lane;
	struct job *next;
};

/* nthreads 0: run each job at once on the submitting thread (tests). */
int jobs_start(int nthreads);
void jobs_stop(void);
/* Run j->run on a jobs thread, then j->call.fn on j->w's loop. */
void jobs_submit(struct job *j);

#endif
