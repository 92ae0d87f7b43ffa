/* schedule: a publish with a delay header rewritten onto the schedule ladder. */
#include "schedule.h"

void schedule_register(void)
{
}
