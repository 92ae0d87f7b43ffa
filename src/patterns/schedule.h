/* schedule: a publish with a delay header rewritten onto the schedule ladder. */
#ifndef ACEMQ_SCHEDULE_H
#define ACEMQ_SCHEDULE_H

void schedule_register(void);

#endif
