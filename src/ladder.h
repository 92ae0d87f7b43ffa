/* ladder: the schedule ladder contract. */
#ifndef ACEMQ_LADDER_H
#define ACEMQ_LADDER_H
#endif
