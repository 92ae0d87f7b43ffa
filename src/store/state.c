/* state: one LMDB environment, its named databases, the writer thread that
 * group-commits, and what makes those commits durable before their
 * completions are posted: the next commit's fsync or a sync of its own
 * (state_sync=2), or a sync thread while the next ones are written (1). */
#include "state.h"

#include "../debug.h"
#include "../log.h"

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#define STATE_MAX_DBS    4096
#define STATE_GROW_CHUNK (256 << 10) /* bytes a pwrite */

struct state_dbi {
	char *name;
	MDB_dbi dbi;
};

/* The database of one op of a batch, resolved before its transaction. */
struct state_handle {
	MDB_dbi dbi;
	int rc;
};

struct state {
	MDB_env *env;
	int sync; /* STATE_SYNC_*: who makes commits durable */
	pthread_t writer;
	pthread_t syncer;     /* STATE_SYNC_PIPELINED only */
	pthread_mutex_t lock; /* the queues, stop, counters, the sync hook */
	pthread_cond_t cond;
	struct state_write *head, **tail;
	int stop;
	int busy;            /* the writer has writes taken but not yet handed on */
	pthread_cond_t idle; /* busy cleared with nothing queued (tests) */
	/* Committed writes waiting for the sync that covers them: the writer
	 * appends a batch once its transaction has committed, the sync thread
	 * takes them all before it syncs. */
	pthread_cond_t sync_cond;
	struct state_write *committed, **committed_tail;
	int sync_stop;
	int (*sync_hook)(void *arg); /* tests: runs before each sync */
	void *sync_hook_arg;
	int (*commit_hook)(void *arg); /* tests: runs before each group commit */
	void *commit_hook_arg;
	pthread_mutex_t dbi_lock; /* opening databases; the table */
	struct state_dbi *dbis;
	int ndbis;
	struct state_counters counters;
	int failing;                  /* an episode of write errors is being logged */
	struct state_handle *handles; /* the writer's: one per op of a batch */
	size_t caphandles;
	off_t file_end;  /* the writer's: the data file's size when last looked */
	int grow_failed; /* a zero-fill failed (a full disk): not tried again */
};

const char *state_dir(struct state *st)
{
	const char *path = NULL;

	return st && mdb_env_get_path(st->env, &path) == 0 ? path : NULL;
}

uint64_t state_now_ms(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

const char *state_strerror(int rc)
{
	switch (rc) {
	case STATE_OK:
		return "ok";
	case STATE_NOTFOUND:
		return "not found";
	case STATE_FULL:
		return "the state map or the disk is full";
	case STATE_TOOBIG:
		return "key or value too large";
	case STATE_CLOSED:
		return "the state layer is closed";
	default:
		return "I/O error";
	}
}

static int state_rc_of(int mdb)
{
	switch (mdb) {
	case 0:
		return STATE_OK;
	case MDB_NOTFOUND:
		return STATE_NOTFOUND;
	case MDB_MAP_FULL:
	case ENOSPC:
	case EDQUOT:
		return STATE_FULL;
	case MDB_BAD_VALSIZE:
		return STATE_TOOBIG;
	default:
		return STATE_IO;
	}
}

/* The handle of a named database; create it when create is set. Handles
 * are opened under dbi_lock in a transaction of their own, as LMDB asks,
 * and kept for the life of the environment. */
static int state_dbi(struct state *st, const char *name, int create, MDB_dbi *out)
{
	MDB_txn *txn;
	MDB_dbi dbi;
	int i, rc;

	pthread_mutex_lock(&st->dbi_lock);
	for (i = 0; i < st->ndbis; i++)
		if (strcmp(st->dbis[i].name, name) == 0) {
			*out = st->dbis[i].dbi;
			pthread_mutex_unlock(&st->dbi_lock);
			return STATE_OK;
		}
	rc = mdb_txn_begin(st->env, NULL, create ? 0 : MDB_RDONLY, &txn);
	if (rc == 0) {
		rc = mdb_dbi_open(txn, name, create ? MDB_CREATE : 0, &dbi);
		if (rc == 0)
			rc = mdb_txn_commit(txn);
		else
			mdb_txn_abort(txn);
	}
	if (rc == 0) {
		struct state_dbi *n = realloc(st->dbis, (size_t)(st->ndbis + 1) * sizeof(*n));
		char *copy = strdup(name);

		if (n == NULL || copy == NULL) {
			free(copy);
			if (n)
				st->dbis = n;
			rc = ENOMEM;
		} else {
			st->dbis = n;
			st->dbis[st->ndbis].name = copy;
			st->dbis[st->ndbis++].dbi = dbi;
			*out = dbi;
		}
	}
	pthread_mutex_unlock(&st->dbi_lock);
	return state_rc_of(rc);
}

/* Apply w's ops in txn; h holds their databases' handles. */
static int state_apply(MDB_txn *txn, struct state_write *w, const struct state_handle *h)
{
	int i, rc = 0;

	for (i = 0; i < w->nops && rc == 0; i++) {
		struct state_op *op = &w->ops[i];
		MDB_val k = {op->klen, (void *)op->key}, v = {op->vlen, (void *)op->val};
		MDB_dbi dbi = h[i].dbi;

		ACEMQ_ASSERT(op->key != NULL || op->klen == 0);
		if (h[i].rc != STATE_OK)
			return h[i].rc == STATE_NOTFOUND ? STATE_IO : h[i].rc;
		if (op->update) {
			MDB_val old;
			const void *nv = NULL;
			size_t nlen = 0;
			int got = mdb_get(txn, dbi, &k, &old);
			enum state_decision d;

			if (got != 0 && got != MDB_NOTFOUND)
				return state_rc_of(got);
			d = op->update(op->arg, got == 0 ? old.mv_data : NULL,
				       got == 0 ? old.mv_size : 0, &nv, &nlen);
			if (d == STATE_PUT) {
				MDB_val nval = {nlen, (void *)nv};

				rc = mdb_put(txn, dbi, &k, &nval, 0);
			} else if (d == STATE_DEL && got == 0) {
				rc = mdb_del(txn, dbi, &k, NULL);
			}
		} else if (op->val) {
			rc = mdb_put(txn, dbi, &k, &v, 0);
		} else {
			rc = mdb_del(txn, dbi, &k, NULL);
			if (rc == MDB_NOTFOUND)
				rc = 0;
		}
	}
	return state_rc_of(rc);
}

/* One transaction for a list of writes (or only its first, one); h holds
 * the handles of their ops in order. rc of the whole. */
static int state_commit(struct state *st, struct state_write *list, int one,
			const struct state_handle *h)
{
	MDB_txn *txn;
	struct state_write *w;
	int rc = mdb_txn_begin(st->env, NULL, 0, &txn);

	if (rc != 0)
		return state_rc_of(rc);
	for (w = list; w; w = one ? NULL : w->next) {
		rc = state_apply(txn, w, h);
		if (rc != STATE_OK) {
			mdb_txn_abort(txn);
			return rc;
		}
		h += w->nops;
	}
	return state_rc_of(mdb_txn_commit(txn));
}

/* The databases of a batch's ops, opened (created) in transactions of
 * their own before the group's: the writer never takes dbi_lock inside
 * its write transaction, where LMDB's writer lock is held, while
 * state_dbi takes the two the other way round. -1 without memory. */
static int state_handles(struct state *st, struct state_write *list)
{
	struct state_write *w;
	size_t nops = 0, k = 0;
	int i;

	for (w = list; w; w = w->next)
		nops += (size_t)w->nops;
	if (nops > st->caphandles) {
		size_t cap = nops < 64 ? 64 : nops;
		struct state_handle *h = realloc(st->handles, cap * sizeof(*h));

		if (h == NULL)
			return -1;
		st->handles = h;
		st->caphandles = cap;
	}
	for (w = list; w; w = w->next)
		for (i = 0; i < w->nops; i++, k++) {
			ACEMQ_ASSERT(w->ops[i].db != NULL);
			st->handles[k].rc = state_dbi(st, w->ops[i].db, 1, &st->handles[k].dbi);
		}
	return 0;
}

static void state_report(struct state *st, int rc)
{
	pthread_mutex_lock(&st->lock);
	if (rc == STATE_OK) {
		if (st->failing)
			log_info("state: writes succeed again");
		st->failing = 0;
	} else {
		st->counters.write_errors++;
		if (rc == STATE_FULL)
			st->counters.full_errors++;
		if (!st->failing)
			log_error("state: write failed: %s (logged once until writes succeed)",
				  state_strerror(rc));
		st->failing = 1;
	}
	pthread_mutex_unlock(&st->lock);
}

/* Report each write of list to whoever asked: its worker, or the thread
 * in state_write_wait. */
static void state_post_done(struct state *st, struct state_write *list)
{
	struct state_write *w, *next;
	struct worker_call *first, *last;
	struct worker *to;

	/* Each run of writes of one worker in one post: one wake-up. */
	while (list) {
		to = list->w;
		first = last = NULL;
		for (w = list; w && w->w == to; w = next) {
			next = w->next;
			state_report(st, w->rc);
			if (to == NULL) {
				w->call.fn(&w->call); /* a state_write_wait */
				continue;
			}
			if (last)
				last->next = &w->call;
			else
				first = &w->call;
			last = &w->call;
		}
		list = w;
		if (first)
			worker_post_chain(to, first, last); /* may free them */
	}
}

/* list was made durable by a sync that ended with rc (0, or an errno or
 * LMDB code): each write it covered fails with it; counted, then posted. */
static void state_synced(struct state *st, struct state_write *list, int rc)
{
	struct state_write *w;
	int n;

	for (w = list, n = 0; w; w = w->next, n++)
		if (rc != 0 && w->rc == STATE_OK)
			w->rc = state_rc_of(rc) == STATE_FULL ? STATE_FULL : STATE_IO;
	if (rc != 0)
		log_error("state: sync failed: %s; the %d writes it covered fail",
			  mdb_strerror(rc), n);
	pthread_mutex_lock(&st->lock);
	st->counters.syncs++;
	st->counters.synced_writes += (uint64_t)n;
	pthread_mutex_unlock(&st->lock);
	state_post_done(st, list);
}

/* The id of the last commit that wrote a meta page. */
static size_t state_last_txnid(struct state *st)
{
	MDB_envinfo info;

	return mdb_env_info(st->env, &info) == 0 ? info.me_last_txnid : 0;
}

/* Keep the data file zero-filled STATE_GROW_AHEAD past LMDB's last page.
 * A commit that takes new pages then writes into blocks the file already
 * has, so its fsync writes those pages alone: a commit that extends the
 * file also has its new size and block map written (on ext4 another
 * write and wait inside every fsync while the file grows). The zeros go
 * to the disk with the next commit's fsync. Runs on the writer between
 * commits, inside a write transaction so that no other writer can take
 * pages meanwhile; everything past the file's end is LMDB's free space
 * (its pages end at me_last_pgno), so the zeros land on nothing in use.
 * Never past the map's size; a failure (ENOSPC) stops the growing ahead
 * and leaves the file to LMDB as before. */
static void state_grow(struct state *st)
{
	MDB_envinfo info;
	MDB_stat stat;
	MDB_txn *txn;
	struct stat sb;
	off_t used, want;
	char *zeros;
	int fd;

	if (st->grow_failed || mdb_env_info(st->env, &info) != 0 ||
	    mdb_env_stat(st->env, &stat) != 0)
		return;
	used = (off_t)(info.me_last_pgno + 1) * (off_t)stat.ms_psize;
	if (st->file_end - used >= STATE_GROW_AHEAD / 2 ||
	    (uint64_t)st->file_end >= (uint64_t)info.me_mapsize)
		return;
	if (mdb_env_get_fd(st->env, &fd) != 0 || mdb_txn_begin(st->env, NULL, 0, &txn) != 0)
		return;
	zeros = NULL;
	if (mdb_env_info(st->env, &info) == 0 && fstat(fd, &sb) == 0) {
		used = (off_t)(info.me_last_pgno + 1) * (off_t)stat.ms_psize;
		want = used + STATE_GROW_AHEAD;
		if ((uint64_t)want > (uint64_t)info.me_mapsize)
			want = (off_t)info.me_mapsize;
		st->file_end = sb.st_size;
		if (st->file_end < want && (zeros = calloc(1, STATE_GROW_CHUNK)) == NULL)
			want = st->file_end;
		while (st->file_end < want) {
			size_t n = (size_t)(want - st->file_end);
			ssize_t put =
			    pwrite(fd, zeros, n < STATE_GROW_CHUNK ? n : STATE_GROW_CHUNK,
				   st->file_end);

			if (put < 0 && errno == EINTR)
				continue;
			if (put <= 0) {
				log_warning("state: cannot grow the data file ahead: %s",
					    put < 0 ? strerror(errno) : "short write");
				st->grow_failed = 1;
				break;
			}
			st->file_end += put;
		}
	}
	mdb_txn_abort(txn);
	free(zeros);
}

/* The writer has posted every write it took. */
static void state_idle(struct state *st)
{
	pthread_mutex_lock(&st->lock);
	st->busy = 0;
	if (st->head == NULL)
		pthread_cond_broadcast(&st->idle);
	pthread_mutex_unlock(&st->lock);
}

/* The writer. With state_sync=2 the environment is MDB_NOMETASYNC: LMDB
 * writes a commit's pages, fsyncs them, then writes its meta page without
 * a sync, so a power cut can only lose the last commits whole, never
 * leave a meta page whose pages are missing. A commit is durable once the
 * file's next fsync is done: that of the next commit that writes (it
 * fsyncs its pages, and with them the meta pages written before), or,
 * when nothing else is queued, a sync here. Until then its writes wait in
 * unsynced: under load one fsync a commit instead of LMDB's two. */
static void *state_writer(void *arg)
{
	struct state *st = arg;
	struct state_write *list, *w, *unsynced = NULL, **unsynced_tail = &unsynced;
	int (*hook)(void *), (*commit_hook)(void *);
	void *hook_arg, *commit_hook_arg;
	size_t off, before;
	int rc, n, have, serial = st->sync == STATE_SYNC_SERIAL;

	for (;;) {
		pthread_mutex_lock(&st->lock);
		while (st->head == NULL && !st->stop && unsynced == NULL)
			pthread_cond_wait(&st->cond, &st->lock);
		list = st->head;
		st->head = NULL;
		st->tail = &st->head;
		st->busy = list != NULL || unsynced != NULL;
		hook = st->sync_hook;
		hook_arg = st->sync_hook_arg;
		commit_hook = st->commit_hook;
		commit_hook_arg = st->commit_hook_arg;
		pthread_mutex_unlock(&st->lock);
		if (list == NULL && unsynced) {
			/* Nothing else to commit: a sync of its own. */
			rc = hook ? hook(hook_arg) : 0;
			if (rc == 0)
				rc = mdb_env_sync(st->env, 1);
			state_synced(st, unsynced, rc);
			unsynced = NULL;
			unsynced_tail = &unsynced;
			state_idle(st);
			continue;
		}
		if (list == NULL)
			return NULL;
		if (commit_hook)
			commit_hook(commit_hook_arg);
		before = serial && unsynced ? state_last_txnid(st) : 0;
		/* Everything queued, one transaction. */
		have = state_handles(st, list) == 0;
		if (st->sync != STATE_SYNC_NONE)
			state_grow(st);
		rc = have ? state_commit(st, list, 0, st->handles) : STATE_IO;
		if (rc == STATE_OK) {
			for (w = list, n = 0; w; w = w->next, n++)
				w->rc = STATE_OK;
		} else {
			/* One write spoiled the batch (a full map, a value too
			 * large): give each its own transaction, so only the
			 * ones that cannot be written fail. */
			for (w = list, n = 0, off = 0; w;
			     off += (size_t)w->nops, w = w->next, n++)
				w->rc =
				    have ? state_commit(st, w, 1, st->handles + off) : STATE_IO;
		}
		pthread_mutex_lock(&st->lock);
		st->counters.commits++;
		st->counters.writes += (uint64_t)n;
		if (st->sync == STATE_SYNC_PIPELINED) {
			/* Durable only once a sync that began after this
			 * commit is done: the sync thread posts them. */
			*st->committed_tail = list;
			for (w = list; w->next; w = w->next)
				;
			st->committed_tail = &w->next;
			pthread_cond_signal(&st->sync_cond);
			list = NULL;
		}
		pthread_mutex_unlock(&st->lock);
		if (serial) {
			if (unsynced && state_last_txnid(st) != before) {
				/* This commit fsynced the file after the meta
				 * pages of those waiting were written. */
				state_synced(st, unsynced, 0);
				unsynced = NULL;
				unsynced_tail = &unsynced;
			}
			*unsynced_tail = list;
			for (w = list; w->next; w = w->next)
				;
			unsynced_tail = &w->next;
			list = NULL;
		}
		state_post_done(st, list);
		if (unsynced == NULL)
			state_idle(st);
	}
}

/* The sync thread: take every write committed so far, make them durable
 * with one fdatasync of the environment, then post them. The writer keeps
 * committing meanwhile; what it commits during a sync waits for the next
 * one. A sync that fails fails every write it was to cover. */
static void *state_syncer(void *arg)
{
	struct state *st = arg;
	struct state_write *list;
	int (*hook)(void *);
	void *hook_arg;
	int rc;

	for (;;) {
		pthread_mutex_lock(&st->lock);
		while (st->committed == NULL && !st->sync_stop)
			pthread_cond_wait(&st->sync_cond, &st->lock);
		list = st->committed;
		st->committed = NULL;
		st->committed_tail = &st->committed;
		hook = st->sync_hook;
		hook_arg = st->sync_hook_arg;
		pthread_mutex_unlock(&st->lock);
		if (list == NULL)
			return NULL;
		rc = hook ? hook(hook_arg) : 0;
		if (rc == 0)
			rc = mdb_env_sync(st->env, 1);
		state_synced(st, list, rc);
	}
}

/* Stop the sync thread once it has synced and posted what was committed. */
static void state_stop_syncer(struct state *st)
{
	pthread_mutex_lock(&st->lock);
	st->sync_stop = 1;
	pthread_cond_signal(&st->sync_cond);
	pthread_mutex_unlock(&st->lock);
	pthread_join(st->syncer, NULL);
}

struct state *state_open(const struct state_settings *set, char *err, size_t errlen)
{
	struct state *st = calloc(1, sizeof(*st));
	int rc;

	if (st == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (mkdir(set->dir, 0750) != 0 && errno != EEXIST) {
		snprintf(err, errlen, "%s: %s", set->dir, strerror(errno));
		free(st);
		return NULL;
	}
	rc = mdb_env_create(&st->env);
	if (rc == 0)
		rc = mdb_env_set_maxdbs(st->env, STATE_MAX_DBS);
	if (rc == 0)
		rc = mdb_env_set_mapsize(st->env, (size_t)set->map_size);
	if (rc == 0)
		rc = mdb_env_set_maxreaders(st->env, 1024);
	if (rc == 0)
		rc = mdb_env_open(
		    st->env, set->dir,
		    MDB_NOTLS | (set->sync == STATE_SYNC_SERIAL ? MDB_NOMETASYNC : MDB_NOSYNC),
		    0640);
	if (rc != 0) {
		snprintf(err, errlen, "%s: %s", set->dir, mdb_strerror(rc));
		if (st->env)
			mdb_env_close(st->env);
		free(st);
		return NULL;
	}
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->dbi_lock, NULL);
	pthread_cond_init(&st->cond, NULL);
	pthread_cond_init(&st->idle, NULL);
	pthread_cond_init(&st->sync_cond, NULL);
	st->tail = &st->head;
	st->committed_tail = &st->committed;
	st->sync = set->sync;
	if (st->sync == STATE_SYNC_PIPELINED &&
	    pthread_create(&st->syncer, NULL, state_syncer, st) != 0) {
		snprintf(err, errlen, "cannot start the sync thread");
		goto fail;
	}
	if (pthread_create(&st->writer, NULL, state_writer, st) != 0) {
		snprintf(err, errlen, "cannot start the writer thread");
		if (st->sync == STATE_SYNC_PIPELINED)
			state_stop_syncer(st);
		goto fail;
	}
	return st;
fail:
	mdb_env_close(st->env);
	pthread_mutex_destroy(&st->lock);
	pthread_mutex_destroy(&st->dbi_lock);
	pthread_cond_destroy(&st->cond);
	pthread_cond_destroy(&st->idle);
	pthread_cond_destroy(&st->sync_cond);
	free(st);
	return NULL;
}

void state_close(struct state *st)
{
	int i;

	if (st == NULL)
		return;
	pthread_mutex_lock(&st->lock);
	st->stop = 1;
	pthread_cond_signal(&st->cond);
	pthread_mutex_unlock(&st->lock);
	pthread_join(st->writer, NULL);
	/* The writer ends only once the queue is empty; later writes were
	 * refused. What it committed last is synced before the syncer ends. */
	ACEMQ_ASSERT(st->head == NULL);
	if (st->sync == STATE_SYNC_PIPELINED)
		state_stop_syncer(st);
	ACEMQ_ASSERT(st->committed == NULL);
	for (i = 0; i < st->ndbis; i++)
		free(st->dbis[i].name);
	free(st->dbis);
	free(st->handles);
	mdb_env_close(st->env);
	pthread_mutex_destroy(&st->lock);
	pthread_mutex_destroy(&st->dbi_lock);
	pthread_cond_destroy(&st->cond);
	pthread_cond_destroy(&st->idle);
	pthread_cond_destroy(&st->sync_cond);
	free(st);
}

void state_test_sync_hook(struct state *st, int (*fn)(void *arg), void *arg)
{
	pthread_mutex_lock(&st->lock);
	st->sync_hook = fn;
	st->sync_hook_arg = arg;
	pthread_mutex_unlock(&st->lock);
}

void state_test_commit_hook(struct state *st, int (*fn)(void *arg), void *arg)
{
	pthread_mutex_lock(&st->lock);
	st->commit_hook = fn;
	st->commit_hook_arg = arg;
	pthread_mutex_unlock(&st->lock);
}

/* Queue a list of writes; one wake-up of the writer for all of them. */
static void state_enqueue(struct state *st, struct state_write *head, struct state_write **tail)
{
	struct state_write *w, *next;

	ACEMQ_ASSERT(head != NULL && *tail == NULL);
	pthread_mutex_lock(&st->lock);
	if (st->stop) {
		pthread_mutex_unlock(&st->lock);
		for (w = head; w; w = next) {
			next = w->next;
			w->rc = STATE_CLOSED;
			if (w->w)
				worker_post(w->w, &w->call);
			else
				w->call.fn(&w->call); /* state_post: nobody waits */
		}
		return;
	}
	*st->tail = head;
	st->tail = tail;
	pthread_cond_signal(&st->cond);
	pthread_mutex_unlock(&st->lock);
}

/* A worker's writes of one loop turn, handed to the writer together when
 * the turn ends: they share a commit however quick the writer is. */
struct state_turn {
	struct worker_call end;
	int armed; /* end is deferred on this thread's worker */
	struct state *st;
	struct state_write *head, **tail;
};

static __thread struct state_turn state_turn;

static void state_turn_send(struct state_turn *t)
{
	struct state_write *head = t->head;

	t->head = NULL;
	if (head)
		state_enqueue(t->st, head, t->tail);
}

static void state_turn_end(struct worker_call *c)
{
	struct state_turn *t = (struct state_turn *)c;

	t->armed = 0;
	state_turn_send(t);
}

void state_submit(struct state *st, struct state_write *w)
{
	struct state_turn *t = &state_turn;

	/* A write comes back to its worker, through its completion. */
	ACEMQ_ASSERT(w->w != NULL && w->call.fn != NULL);
	ACEMQ_ASSERT(w->nops >= 0 && (w->nops == 0 || w->ops != NULL));
	/* Nothing waits for a turn's end that is not deferred. */
	ACEMQ_ASSERT(t->armed || t->head == NULL);
	w->next = NULL;
	w->rc = STATE_OK;
	if (!t->armed) {
		t->end.fn = state_turn_end;
		if (w->w == NULL || worker_defer(w->w, &t->end) != 0) {
			state_enqueue(st, w, &w->next);
			return;
		}
		t->armed = 1;
	}
	if (t->head && t->st != st)
		state_turn_send(t); /* another environment (tests) */
	if (t->head == NULL) {
		t->st = st;
		t->tail = &t->head;
	}
	*t->tail = w;
	t->tail = &w->next;
}

void state_post(struct state *st, struct state_write *w)
{
	ACEMQ_ASSERT(w->w == NULL && w->call.fn != NULL);
	ACEMQ_ASSERT(w->nops >= 0 && (w->nops == 0 || w->ops != NULL));
	w->next = NULL;
	w->rc = STATE_OK;
	state_enqueue(st, w, &w->next);
}

int state_get(struct state *st, const char *db, const void *key, size_t klen,
	      void (*fn)(void *arg, const void *val, size_t vlen), void *arg)
{
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = {klen, (void *)key}, v;
	int rc = state_dbi(st, db, 0, &dbi);

	if (rc != STATE_OK)
		return rc;
	rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
	if (rc != 0)
		return state_rc_of(rc);
	rc = mdb_get(txn, dbi, &k, &v);
	if (rc == 0)
		fn(arg, v.mv_data, v.mv_size);
	mdb_txn_abort(txn);
	return state_rc_of(rc);
}

int state_scan(struct state *st, const char *db, const void *first, size_t flen,
	       int (*fn)(void *arg, const void *key, size_t klen, const void *val, size_t vlen),
	       void *arg)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_dbi dbi;
	MDB_val k = {flen, (void *)first}, v;
	int rc = state_dbi(st, db, 0, &dbi);

	if (rc != STATE_OK)
		return rc == STATE_NOTFOUND ? STATE_OK : rc;
	rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
	if (rc != 0)
		return state_rc_of(rc);
	rc = mdb_cursor_open(txn, dbi, &cur);
	if (rc == 0) {
		rc = mdb_cursor_get(cur, &k, &v, first ? MDB_SET_RANGE : MDB_FIRST);
		while (rc == 0 && fn(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size) == 0)
			rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
		mdb_cursor_close(cur);
	}
	mdb_txn_abort(txn);
	return rc == 0 || rc == MDB_NOTFOUND ? STATE_OK : state_rc_of(rc);
}

struct state_wait {
	struct state_write w;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done;
};

static void state_wait_done(struct worker_call *c)
{
	struct state_wait *sw = (struct state_wait *)c;

	pthread_mutex_lock(&sw->lock);
	sw->done = 1;
	pthread_cond_signal(&sw->cond);
	pthread_mutex_unlock(&sw->lock);
}

int state_write_wait(struct state *st, struct state_op *ops, int nops)
{
	struct state_wait sw;
	int rc;

	memset(&sw, 0, sizeof(sw));
	pthread_mutex_init(&sw.lock, NULL);
	pthread_cond_init(&sw.cond, NULL);
	sw.w.call.fn = state_wait_done;
	sw.w.ops = ops;
	sw.w.nops = nops;
	pthread_mutex_lock(&st->lock);
	if (st->stop) {
		pthread_mutex_unlock(&st->lock);
		rc = STATE_CLOSED;
		goto out;
	}
	sw.w.next = NULL;
	*st->tail = &sw.w;
	st->tail = &sw.w.next;
	pthread_cond_signal(&st->cond);
	pthread_mutex_unlock(&st->lock);
	pthread_mutex_lock(&sw.lock);
	while (!sw.done)
		pthread_cond_wait(&sw.cond, &sw.lock);
	pthread_mutex_unlock(&sw.lock);
	rc = sw.w.rc;
out:
	pthread_mutex_destroy(&sw.lock);
	pthread_cond_destroy(&sw.cond);
	return rc;
}

void state_counters(struct state *st, struct state_counters *out)
{
	MDB_envinfo info;
	MDB_stat stat;

	pthread_mutex_lock(&st->lock);
	*out = st->counters;
	pthread_mutex_unlock(&st->lock);
	if (mdb_env_info(st->env, &info) == 0 && mdb_env_stat(st->env, &stat) == 0) {
		out->used_bytes = (uint64_t)(info.me_last_pgno + 1) * stat.ms_psize;
		out->map_bytes = (uint64_t)info.me_mapsize;
	}
}

void state_test_settle(struct state *st)
{
	/* Pipelined, the sync thread posts after the writer is idle. */
	ACEMQ_ASSERT(st->sync != STATE_SYNC_PIPELINED);
	pthread_mutex_lock(&st->lock);
	while ((st->head != NULL || st->busy) && !st->stop)
		pthread_cond_wait(&st->idle, &st->lock);
	pthread_mutex_unlock(&st->lock);
}
