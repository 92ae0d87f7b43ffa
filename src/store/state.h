/* state: the proxy's own state in one LMDB environment under --data-dir:
 * named databases per vhost and purpose, reads from any thread, and writes
 * through one writer thread that commits everything queued in one
 * transaction (group commit); a sync thread makes the commits durable while
 * the next ones are written, and each requester is told when its write is
 * durable. */
#ifndef ACEMQ_STATE_H
#define ACEMQ_STATE_H

#include "../worker.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct state;

enum state_rc {
	STATE_OK = 0,
	STATE_NOTFOUND = 1,
	STATE_FULL = -1,   /* the map (or the disk) is full */
	STATE_IO = -2,     /* an I/O error, or LMDB refused */
	STATE_TOOBIG = -3, /* a key or value LMDB cannot hold */
	STATE_CLOSED = -4, /* the state layer is shutting down */
};

enum state_decision { STATE_KEEP, STATE_PUT, STATE_DEL };

/* A read-modify-write: given the key's value in the transaction (NULL when
 * absent), decide; for STATE_PUT set *val and *vlen (memory valid until
 * the write is done). Runs on the writer thread, perhaps twice (a batch
 * that failed is retried write by write): decide from old alone. */
typedef enum state_decision (*state_update_fn)(void *arg, const void *old, size_t oldlen,
					       const void **val, size_t *vlen);

/* One put or delete, or an update. The memory of db, key and val belongs
 * to the caller until the write's done runs. */
struct state_op {
	const char *db; /* a named database, created on first write */
	const void *key;
	size_t klen;
	const void *val; /* NULL: delete the key (unless update is set) */
	size_t vlen;
	state_update_fn update;
	void *arg;
};

/* A write: ops applied atomically in the next group commit; done(w) runs
 * on the worker w once it is durable (rc 0) or failed (rc < 0). */
struct state_write {
	struct worker_call call; /* fn: the completion, on the worker */
	struct worker *w;
	struct state_op *ops;
	int nops;
	int rc;
	struct state_write *next;
};

/* Who makes commits durable. */
enum state_sync {
	STATE_SYNC_NONE = 0,      /* nobody: MDB_NOSYNC, the page cache only */
	STATE_SYNC_PIPELINED = 1, /* the sync thread, overlapping later commits */
	STATE_SYNC_SERIAL = 2,    /* each commit's pages fsynced by LMDB, its meta
				   * page by the next commit's fsync or the writer's */
};

/* With a sync on, the data file is kept zero-filled this far past LMDB's
 * last page, grown again once less than half of it is left (never past
 * the map's size): commits then write into blocks the file already has. */
#define STATE_GROW_AHEAD ((off_t)8 << 20)

struct state_settings {
	const char *dir;
	uint64_t map_size; /* bytes */
	int sync;          /* enum state_sync */
};

/* Open (creating dir) and start the writer thread. NULL on failure, with
 * the reason in err. */
struct state *state_open(const struct state_settings *set, char *err, size_t errlen);
/* Stop the writer after it has written what was queued, then close. */
void state_close(struct state *st);

/* From any thread: queue a write. */
void state_submit(struct state *st, struct state_write *w);

/* From any thread, w->w NULL: queue a write nobody waits for; its
 * completion runs on the writer thread (it must be quick and must not
 * block), or at once on the caller's when the layer is closed. */
void state_post(struct state *st, struct state_write *w);

/* From a thread that may block (never a worker's loop): write and wait
 * until durable. */
int state_write_wait(struct state *st, struct state_op *ops, int nops);

/* From any thread but a worker's loop: look key up in db and hand the
 * value to fn inside the read transaction (the bytes are valid only
 * there). Returns STATE_OK, STATE_NOTFOUND or an error. */
int state_get(struct state *st, const char *db, const void *key, size_t klen,
	      void (*fn)(void *arg, const void *val, size_t vlen), void *arg);

/* Walk db's keys from first (inclusive; NULL: the start) while fn returns
 * 0; fn may collect keys to delete later. */
int state_scan(struct state *st, const char *db, const void *first, size_t flen,
	       int (*fn)(void *arg, const void *key, size_t klen, const void *val, size_t vlen),
	       void *arg);

/* Counters since start, for the admin view. */
struct state_counters {
	uint64_t commits, writes, write_errors, full_errors;
	uint64_t syncs, synced_writes;  /* syncs done, and the writes they made durable */
	uint64_t used_bytes, map_bytes; /* pages in use, and the map's size */
};
void state_counters(struct state *st, struct state_counters *out);

const char *state_strerror(int rc);

/* Tests: fn(arg) runs before each sync made for its own sake (on the sync
 * thread with state_sync=1, on the writer with 2); it may block (holding
 * the writes of that sync back), and a non-zero errno it returns stands
 * for the sync failing. NULL removes it. */
void state_test_sync_hook(struct state *st, int (*fn)(void *arg), void *arg);
/* Tests: fn(arg) runs on the writer before each group commit (it may
 * block, letting writes queue behind it). */
void state_test_commit_hook(struct state *st, int (*fn)(void *arg), void *arg);
/* Tests (state_sync 0 or 2): wait until every write queued so far has been
 * written and its completion posted (a session fuzzer that sees each
 * completion at the same point of its script every run). */
void state_test_settle(struct state *st);

/* Wall-clock milliseconds since the epoch: the time stored in records. */
uint64_t state_now_ms(void);
/* The directory the environment lives in (data_dir), or NULL. */
const char *state_dir(struct state *st);

#endif
