/* log: one line per event on stderr, filtered by level. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

enum log_level log_threshold = LOG_INFO;

static const char *const log_names[] = {"error", "warning", "info", "debug"};

int log_level_parse(const char *name, enum log_level *out)
{
	unsigned i;

	for (i = 0; i < sizeof(log_names) / sizeof(log_names[0]); i++) {
		if (strcasecmp(name, log_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	if (strcasecmp(name, "warn") == 0) {
		*out = LOG_WARNING;
		return 0;
	}
	return -1;
}

const char *log_level_name(enum log_level level)
{
	return log_names[level];
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	char line[1024];
	struct timeval tv;
	struct tm tm;
	size_t n;
	va_list ap;

	if (level > log_threshold)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03dZ %s ",
			      (int)(tv.tv_usec / 1000), log_names[level]);
	va_start(ap, fmt);
	if (n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	n = strlen(line);
	if (n >= sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	fwrite(line, 1, n, stderr);
}
