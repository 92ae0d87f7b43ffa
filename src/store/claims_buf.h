/* claims_buf: the buffers of the claim stores on this host: a stage (what
 * an upload hands the store at a time) and a read buffer, aligned for
 * O_DIRECT; the last few let go are kept for the next payloads. */
#ifndef ACEMQ_CLAIMS_BUF_H
#define ACEMQ_CLAIMS_BUF_H

#include "claims.h"

#include <stddef.h>
#include <stdint.h>

/* An upload hands the store this much at a time (LMDB: one commit, one
 * fsync for four chunks; a file: one write). */
#define CLAIMS_STAGE_CHUNKS 4u
#define CLAIMS_STAGE        (CLAIMS_STAGE_CHUNKS * CLAIMS_CHUNK)
/* What O_DIRECT asks of buffers, file offsets and lengths. */
#define CLAIMS_ALIGN 4096u

/* len is CLAIMS_STAGE or CLAIMS_CHUNK; from any thread. NULL: no memory. */
uint8_t *claims_buf_new(size_t len);
/* b (NULL: nothing) of claims_buf_new(len) is let go. */
void claims_buf_free(uint8_t *b, size_t len);
/* b handed to a reader (claims_read_keep), let go by claims_kept_free.
 * NULL: no memory (b is still the caller's). */
void *claims_buf_kept(uint8_t *b, size_t len);

#endif
