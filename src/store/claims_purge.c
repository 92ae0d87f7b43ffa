/* claims_purge: the retention purge of the claim stores on this host:
 * payloads past the retention, and what uploads a crash cut short left
 * (LMDB chunks without their meta record, a directory's partial files). */
#include "claims_local.h"

#include "../debug.h"
#include "claims_backend.h"
#include "state.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A record the sweep removes: a payload's meta record (bytes: the
 * payload's size), or a chunk, its payload's or an orphan's. */
struct claims_dead {
	char key[CLAIMS_CHUNK_KEY + 1];
	unsigned char orphan;
	uint64_t bytes;
};

struct claims_sweep {
	uint64_t cutoff_ms;
	char meta[CLAIMS_KEY_LEN]; /* the last meta record seen */
	int meta_expired, have_meta;
	int orphans; /* also chunks no payload owns (only before uploads start) */
	struct claims_dead *dead;
	size_t ndead, capdead;
};

static void claims_sweep_add(struct claims_sweep *sw, const void *key, size_t klen, int orphan,
			     uint64_t bytes)
{
	struct claims_dead *d;

	ACEMQ_ASSERT(klen < sizeof(d->key));
	if (sw->ndead == sw->capdead) {
		size_t n = sw->capdead ? sw->capdead * 2 : 256;
		void *p = realloc(sw->dead, n * sizeof(*sw->dead));

		if (p == NULL)
			return;
		sw->dead = p;
		sw->capdead = n;
	}
	d = &sw->dead[sw->ndead++];
	memcpy(d->key, key, klen);
	d->key[klen] = 0;
	d->orphan = (unsigned char)orphan;
	d->bytes = bytes;
}

static int claims_sweep_one(void *arg, const void *key, size_t klen, const void *val,
			    size_t vlen)
{
	struct claims_sweep *sw = arg;
	uint64_t created, size;

	if (klen == CLAIMS_KEY_LEN && vlen == CLAIMS_META_LEN) {
		memcpy(&size, val, 8);
		memcpy(&created, (const uint8_t *)val + 8, 8);
		memcpy(sw->meta, key, CLAIMS_KEY_LEN);
		sw->have_meta = 1;
		sw->meta_expired = sw->cutoff_ms && created < sw->cutoff_ms;
		if (sw->meta_expired)
			claims_sweep_add(sw, key, klen, 0, size);
	} else if (klen == CLAIMS_CHUNK_KEY) {
		int owned = sw->have_meta && memcmp(sw->meta, key, CLAIMS_KEY_LEN) == 0;

		/* A chunk goes with its expired payload; at start, before any
		 * upload, also when no payload owns it (a crash mid-upload). */
		if (owned && sw->meta_expired)
			claims_sweep_add(sw, key, klen, 0, 0);
		else if (!owned && sw->orphans)
			claims_sweep_add(sw, key, klen, 1, vlen);
	}
	return 0;
}

/* A directory of payload files: those past the cutoff, and partial files
 * no upload of this proxy is writing: an hour old in a filesystem store
 * (the directory may be shared: another proxy's upload may be in
 * progress), or any at start in an LMDB store's own directory (own). */
static void claims_local_purge_directory(const char *dir, const struct claims_sweep *sw,
					 int own, struct claims_purged *out)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4200];
	struct stat st;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		int partial = n == CLAIMS_KEY_LEN + 9 && e->d_name[0] == '.' &&
			      strcmp(e->d_name + 1 + CLAIMS_KEY_LEN, ".partial") == 0;
		const char *key = partial ? e->d_name + 1 : e->d_name;

		if (!partial && !claims_key_valid((const uint8_t *)key, n))
			continue; /* not ours: another library's or the operator's */
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) != 0)
			continue;
		if (partial ? claims_active_has(key) ||
				  (!(own && sw->orphans) &&
				   (uint64_t)st.st_mtime * 1000 + 3600000 >= state_now_ms())
			    : !sw->cutoff_ms || (uint64_t)st.st_mtime * 1000 >= sw->cutoff_ms)
			continue;
		if (unlink(path) != 0)
			continue;
		if (partial) {
			out->partial_files++;
			out->partial_file_bytes += (uint64_t)st.st_size;
		} else {
			out->payloads++;
			out->payload_bytes += (uint64_t)st.st_size;
		}
	}
	closedir(d);
}

int claims_local_purge(const struct claims_where *where, long retention_s, int orphans,
		       struct claims_purged *out)
{
	struct claims_sweep sw;
	size_t i, j;
	int rc = 0;

	memset(&sw, 0, sizeof(sw));
	sw.orphans = orphans;
	if (retention_s > 0)
		sw.cutoff_ms = state_now_ms() - (uint64_t)retention_s * 1000;
	if (where->type == CLAIMS_FILESYSTEM) {
		claims_local_purge_directory(where->name, &sw, 0, out);
		return 0;
	}
	if (where->files[0])
		claims_local_purge_directory(where->files, &sw, 1, out); /* large payloads */
	if (claims_state == NULL)
		return 0;
	if (state_scan(claims_state, where->name, NULL, 0, claims_sweep_one, &sw) != STATE_OK) {
		free(sw.dead);
		return -1;
	}
	for (i = 0; i < sw.ndead; i += 512) {
		struct state_op ops[512];
		size_t n = sw.ndead - i < 512 ? sw.ndead - i : 512;

		memset(ops, 0, sizeof(ops));
		for (j = 0; j < n; j++) {
			ops[j].db = where->name;
			ops[j].key = sw.dead[i + j].key;
			ops[j].klen = strlen(sw.dead[i + j].key);
		}
		if (state_write_wait(claims_state, ops, (int)n) != STATE_OK) {
			rc = -1;
			break;
		}
		for (j = 0; j < n; j++) {
			const struct claims_dead *d = &sw.dead[i + j];

			if (d->orphan) {
				out->partial++;
				out->partial_bytes += d->bytes;
			} else if (ops[j].klen == CLAIMS_KEY_LEN) {
				out->payloads++;
				out->payload_bytes += d->bytes;
			}
		}
	}
	free(sw.dead);
	return rc;
}
