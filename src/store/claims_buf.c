/* claims_buf: the claim stores' stages and read buffers. Up to two of
 * each let go are kept for the next payloads: a fresh one costs a page
 * fault and a zeroed page every 4 KiB, a tenth of the proxy's CPU when
 * 10 MiB bodies are offloaded (docs/performance.md). */
#include "claims_buf.h"

#include "../debug.h"

#include <pthread.h>
#include <stdlib.h>

#define CLAIMS_SPARE 2

struct claims_spares {
	void *buf[CLAIMS_SPARE];
	int n;
};

static pthread_mutex_t claims_buf_lock = PTHREAD_MUTEX_INITIALIZER;
static struct claims_spares claims_spare_stages, claims_spare_chunks;

static struct claims_spares *claims_spares_of(size_t len)
{
	ACEMQ_ASSERT(len == CLAIMS_STAGE || len == CLAIMS_CHUNK);
	return len == CLAIMS_STAGE ? &claims_spare_stages : &claims_spare_chunks;
}

uint8_t *claims_buf_new(size_t len)
{
	struct claims_spares *s = claims_spares_of(len);
	void *p = NULL;

	pthread_mutex_lock(&claims_buf_lock);
	if (s->n > 0)
		p = s->buf[--s->n];
	pthread_mutex_unlock(&claims_buf_lock);
	if (p == NULL && posix_memalign(&p, CLAIMS_ALIGN, len) != 0)
		return NULL;
	return p;
}

void claims_buf_free(uint8_t *b, size_t len)
{
	struct claims_spares *s;

	if (b == NULL)
		return;
	s = claims_spares_of(len);
	pthread_mutex_lock(&claims_buf_lock);
	if (s->n < CLAIMS_SPARE) {
		s->buf[s->n++] = b;
		b = NULL;
	}
	pthread_mutex_unlock(&claims_buf_lock);
	free(b);
}

struct claims_kept {
	uint8_t *buf;
	size_t len;
};

void *claims_buf_kept(uint8_t *b, size_t len)
{
	struct claims_kept *k = malloc(sizeof(*k));

	if (k) {
		k->buf = b;
		k->len = len;
	}
	return k;
}

void claims_kept_free(void *kept)
{
	struct claims_kept *k = kept;

	if (k) {
		claims_buf_free(k->buf, k->len);
		free(k);
	}
}
