/* jobs: threads that run blocking work off the workers' loops. */
#include "jobs.h"

#include <pthread.h>
#include <stdlib.h>

struct jobs_lane {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, **tail;
	int stop;
	int started;
};

static struct jobs_lane *jobs_lanes;
static int jobs_nlanes;

static void *jobs_main(void *arg)
{
	struct jobs_lane *l = arg;
	struct job *j;

	for (;;) {
		pthread_mutex_lock(&l->lock);
		while (l->head == NULL && !l->stop)
			pthread_cond_wait(&l->cond, &l->lock);
		j = l->head;
		if (j) {
			l->head = j->next;
			if (l->head == NULL)
				l->tail = &l->head;
		}
		pthread_mutex_unlock(&l->lock);
		if (j == NULL)
			return NULL; /* stopping, and nothing left */
		j->run(j);
		worker_post(j->w, &j->call);
	}
}

/* With no threads (tests), a job runs at once on the caller's thread and
 * its completion is still posted, so it arrives later on the loop. */
static int jobs_inline;

int jobs_start(int nthreads)
{
	int i;

	jobs_inline = nthreads == 0;
	if (jobs_inline)
		return 0;
	if (nthreads < 1)
		nthreads = 1;
	jobs_lanes = calloc((size_t)nthreads, sizeof(*jobs_lanes));
	if (jobs_lanes == NULL)
		return -1;
	jobs_nlanes = nthreads;
	for (i = 0; i < nthreads; i++) {
		struct jobs_lane *l = &jobs_lanes[i];

		pthread_mutex_init(&l->lock, NULL);
		pthread_cond_init(&l->cond, NULL);
		l->tail = &l->head;
		if (pthread_create(&l->thread, NULL, jobs_main, l) != 0)
			return -1;
		l->started = 1;
	}
	return 0;
}

void jobs_stop(void)
{
	int i;

	for (i = 0; i < jobs_nlanes; i++) {
		struct jobs_lane *l = &jobs_lanes[i];

		pthread_mutex_lock(&l->lock);
		l->stop = 1;
		pthread_cond_signal(&l->cond);
		pthread_mutex_unlock(&l->lock);
		if (l->started)
			pthread_join(l->thread, NULL);
		pthread_mutex_destroy(&l->lock);
		pthread_cond_destroy(&l->cond);
	}
	free(jobs_lanes);
	jobs_lanes = NULL;
	jobs_nlanes = 0;
}

void jobs_submit(struct job *j)
{
	struct jobs_lane *l;

	if (jobs_inline || jobs_nlanes == 0) { /* (or stopped: at shutdown) */
		j->run(j);
		worker_post(j->w, &j->call);
		return;
	}
	l = &jobs_lanes[j->lane % (uint64_t)jobs_nlanes];
	j->next = NULL;
	pthread_mutex_lock(&l->lock);
	*l->tail = j;
	l->tail = &j->next;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
}
