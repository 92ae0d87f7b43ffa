/* log: one line per event on stderr, filtered by level. */
#ifndef ACEMQ_LOG_H
#define ACEMQ_LOG_H

enum log_level { LOG_ERROR, LOG_WARNING, LOG_INFO, LOG_DEBUG };

extern enum log_level log_threshold;

int log_level_parse(const char *name, enum log_level *out);
const char *log_level_name(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...)   log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...)    log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                   \
	do {                                             \
		if (log_threshold >= LOG_DEBUG)          \
			log_msg(LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif
