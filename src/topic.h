/* topic: AMQP topic patterns ("*" one word, "#" zero or more), compiled once. */
#ifndef ACEMQ_TOPIC_H
#define ACEMQ_TOPIC_H

#include <stddef.h>

struct topic;

/* Compile a pattern; NULL on allocation failure. */
struct topic *topic_compile(const char *pattern);
void topic_free(struct topic *t);
/* Does routing key (len bytes, not NUL-terminated) match? */
int topic_match(const struct topic *t, const char *key, size_t len);

#endif
