/* log: one line per event on stderr, filtered by level. Every line is
 * escaped as a whole before it is written (log_escape), so no string a
 * client sent (a user or vhost name, client properties, a queue or
 * exchange name, a reason) can start a line of its own or reach the
 * operator's terminal as a control sequence, whichever call formats it. */
#ifndef ACEMQ_LOG_H
#define ACEMQ_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR, LOG_WARNING, LOG_INFO, LOG_DEBUG };

extern enum log_level log_threshold;

int log_level_parse(const char *name, enum log_level *out);
const char *log_level_name(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The len bytes of in as a log line may hold them, into out (cap bytes,
 * NUL-terminated when cap > 0): printable ASCII and well-formed UTF-8 pass
 * as they are; control characters (C0 with tab and newline, DEL, C1), the
 * Unicode line and paragraph separators and bytes that are not UTF-8
 * become \xNN, one per byte, and a backslash becomes \\ so that an escape
 * is never ambiguous. A sequence that would not fit whole is left out
 * with everything after it. Returns the length written. */
size_t log_escape(char *out, size_t cap, const char *in, size_t len);

#define log_error(...)   log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...)    log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                   \
	do {                                             \
		if (log_threshold >= LOG_DEBUG)          \
			log_msg(LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif
