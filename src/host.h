/* host: what a session offers its pipeline (struct pipeline_host). */
#ifndef ACEMQ_HOST_H
#define ACEMQ_HOST_H

#include "pipeline.h"

/* The host interface every session sets on its pipeline; owner is the
 * session. */
extern const struct pipeline_host host_of_session;

#endif
