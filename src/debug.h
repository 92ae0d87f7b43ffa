/* debug: ACEMQ_ASSERT(cond), the check of an invariant the code relies on
 * (a length checked before it is subtracted from, a hold released once, a
 * callback set before the events that call it). On when the build defines
 * ACEMQ_DEBUG (configure's --enable-debug, --enable-sanitizers,
 * --enable-tsan and --enable-fuzzing): a false condition logs file, line
 * and the expression to stderr and aborts. Off otherwise: nothing is
 * evaluated, but the expression is still compiled, so it cannot rot.
 * Header only: the wire layer and the fuzz targets use it without linking
 * the daemon. Keep conditions cheap and free of side effects. */
#ifndef ACEMQ_DEBUG_H
#define ACEMQ_DEBUG_H

#ifdef ACEMQ_DEBUG

#include <stdio.h>
#include <stdlib.h>

__attribute__((noreturn, cold)) static inline void debug_assert_fail(const char *file, int line,
								     const char *expr)
{
	fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
	fflush(stderr);
	abort();
}

#define ACEMQ_ASSERT(cond)                                            \
	do {                                                          \
		if (__builtin_expect(!(cond), 0))                     \
			debug_assert_fail(__FILE__, __LINE__, #cond); \
	} while (0)

#else

#define ACEMQ_ASSERT(cond) ((void)sizeof(!(cond)))

#endif

#endif
