/* debug: assertions on invariants, on in debug, sanitizer and fuzzing
 * builds (ACEMQ_DEBUG) and compiled out otherwise. */
#ifndef ACEMQ_DEBUG_H
#define ACEMQ_DEBUG_H

#include <stdio.h>
#include <stdlib.h>

#ifdef ACEMQ_DEBUG
#define ACEMQ_ASSERT(cond)                                                                   \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                      \
			abort();                                                             \
		}                                                                            \
	} while (0)
#else
#define ACEMQ_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

#endif
