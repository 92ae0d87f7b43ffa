/* claims_local: what the claim stores on this host (LMDB and a directory;
 * claims_local.c) share with their retention purge (claims_purge.c). */
#ifndef ACEMQ_CLAIMS_LOCAL_H
#define ACEMQ_CLAIMS_LOCAL_H

#include "claims.h"

#include <stddef.h>
#include <stdint.h>

/* LMDB layout, one database per vhost ("claims/VHOST"):
 *   KEY              -> meta: size (u64), created ms (u64), chunks (u32)
 *   KEY#NNNNNNNN     -> chunk NNNNNNNN (hex) of the payload
 * The meta record is written last, in the same transaction as the last
 * chunk: a payload without it is partial and never read. */
#define CLAIMS_META_LEN  20
#define CLAIMS_CHUNK_KEY (CLAIMS_KEY_LEN + 9)

#define claims_state (claims_state_get())

/* The backends' purge (claims.h, claims_purge). */
int claims_local_purge(const struct claims_where *where, long retention_s, int orphans,
		       struct claims_purged *out);

#endif
