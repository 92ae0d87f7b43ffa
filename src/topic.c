/* topic: AMQP topic patterns ("*" one word, "#" zero or more), compiled once. */
#include "topic.h"

#include <stdlib.h>
#include <string.h>

enum { WORD_LITERAL, WORD_STAR, WORD_HASH };

struct topic_word {
	int kind;
	const char *text;
	size_t len;
};

struct topic {
	int nwords;
	char *text;
	struct topic_word words[];
};

struct topic *topic_compile(const char *pattern)
{
	size_t len = strlen(pattern), i;
	int n = 1, w = 0;
	struct topic *t;
	char *p;

	for (i = 0; i < len; i++)
		n += pattern[i] == '.';
	t = calloc(1, sizeof(*t) + (size_t)n * sizeof(t->words[0]));
	if (t == NULL)
		return NULL;
	t->text = strdup(pattern);
	if (t->text == NULL) {
		free(t);
		return NULL;
	}
	p = t->text;
	for (;;) {
		char *dot = strchr(p, '.');
		size_t wl = dot ? (size_t)(dot - p) : strlen(p);
		struct topic_word *word = &t->words[w++];

		word->text = p;
		word->len = wl;
		word->kind = wl == 1 && p[0] == '*'   ? WORD_STAR
			     : wl == 1 && p[0] == '#' ? WORD_HASH
						      : WORD_LITERAL;
		if (dot == NULL)
			break;
		p = dot + 1;
	}
	t->nwords = w;
	return t;
}

void topic_free(struct topic *t)
{
	if (t == NULL)
		return;
	free(t->text);
	free(t);
}

/* Split the key into at most max words; returns the count, or -1 if more. */
static int topic_split(const char *key, size_t len, const char **start, size_t *wlen, int max)
{
	int n = 0;
	size_t i, s = 0;

	for (i = 0; i <= len; i++) {
		if (i == len || key[i] == '.') {
			if (n == max)
				return -1;
			start[n] = key + s;
			wlen[n++] = i - s;
			s = i + 1;
		}
	}
	return n;
}

int topic_match(const struct topic *t, const char *key, size_t len)
{
	enum { MAXW = 256 };
	const char *ks[MAXW];
	size_t kl[MAXW];
	/* can[j]: pattern words 0..i-1 can consume key words 0..j-1 */
	unsigned char can[MAXW + 1], next[MAXW + 1];
	int nk = topic_split(key, len, ks, kl, MAXW), i, j;

	if (nk < 0)
		return 0;
	memset(can, 0, sizeof(can));
	can[0] = 1;
	for (i = 0; i < t->nwords; i++) {
		const struct topic_word *w = &t->words[i];

		memset(next, 0, sizeof(next));
		for (j = 0; j <= nk; j++) {
			if (!can[j])
				continue;
			if (w->kind == WORD_HASH) {
				int k;

				for (k = j; k <= nk; k++)
					next[k] = 1;
				break;
			}
			if (j < nk && (w->kind == WORD_STAR ||
				       (w->len == kl[j] && memcmp(w->text, ks[j], kl[j]) == 0)))
				next[j + 1] = 1;
		}
		memcpy(can, next, sizeof(can));
	}
	return can[nk];
}
