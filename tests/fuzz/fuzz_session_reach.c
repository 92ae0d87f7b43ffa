/* fuzz_session_reach: what the seeds of make-seeds.py are for, checked as
 * the corpus is replayed (make check): each seed named below must make
 * the worker's counters it names grow. A seed that stops reaching its
 * pattern's path (a changed default, a rule the harness no longer sets, a
 * window its deliveries no longer fill) then fails the replay, instead of
 * passing while it exercises nothing. Under libFuzzer nothing here runs
 * but the counting. */
#include "fuzz_session_reach.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REACH_MAX 4

static const struct fuzz_reach {
	const char *seed;
	const char *counters[FUZZ_REACH_MAX];
} fuzz_reaches[] = {
    {"backpressure", {"backpressure_pauses"}},
    {"broker-lost", {"upstream_failures"}},
    {"claim-offload", {"claims_offloaded"}},
    {"claim-rehydrate", {"claims_rehydrated", "claims_missing", "claims_bad_keys"}},
    {"claim-rehydrate-slow-client", {"claims_rehydrated"}},
    {"control-close-in-flight", {"dedup_first", "dedup_waited"}},
    {"control-drain-in-flight", {"dedup_first", "publishes_answered"}},
    {"control-drain-then-grace", {"claims_offloaded", "dedup_first"}},
    {"control-pause-publish-resume", {"claims_offloaded", "dedup_forgotten"}},
    {"dedup-publish", {"dedup_first", "dedup_duplicate"}},
    {"dedup-publish-in-flight", {"dedup_waited", "dedup_duplicate", "dedup_forgotten"}},
    {"greeting-no-broker", {"upstream_failures"}},
    {"greeting-out-of-order", {"protocol_errors"}},
    {"idempotency-duplicates", {"idem_claimed", "idem_in_progress", "idem_put_back_requeued"}},
    {"idempotency-get-and-close", {"idem_claimed", "idem_in_progress"}},
    {"idempotency-surplus", {"idem_claimed", "surplus_kept"}},
    {"idempotency-surplus-client-vanishes", {"surplus_kept"}},
    {"idempotency-surplus-renewed", {"surplus_kept", "idem_renewed"}},
    {"pool-kept-channel", {"pool_channels_kept", "pool_channels_kept_used"}},
    {"pool-kept-channel-client-vanishes", {"pool_auth_misses"}},
    {"regress-pool-ended-pipe-freed", {"claims_rehydrated"}},
    {"reload-mid-session", {"reply_to_mismatch"}},
    {"stream-publish", {"claims_offloaded", "dedup_first"}},
    {"valid-session", {"messages_swallowed", "reply_to_property_set"}},
};

#define FUZZ_NREACHES (sizeof(fuzz_reaches) / sizeof(fuzz_reaches[0]))

static const struct fuzz_counter {
	const char *name;
	size_t off;
} fuzz_counters[] = {
#define FUZZ_COUNTER(name, metric, labels, help) {#name, offsetof(struct stats, name)},
    STATS_COUNTERS(FUZZ_COUNTER)
#undef FUZZ_COUNTER
};

#define FUZZ_NCOUNTERS (sizeof(fuzz_counters) / sizeof(fuzz_counters[0]))

static uint64_t fuzz_grown[FUZZ_NCOUNTERS]; /* by the last input */
static unsigned char fuzz_seen[FUZZ_NREACHES];

static uint64_t fuzz_at(const struct stats *st, size_t i)
{
	uint64_t v;

	memcpy(&v, (const char *)st + fuzz_counters[i].off, sizeof(v));
	return v;
}

void fuzz_session_reach_ran(const struct stats *before, const struct stats *after)
{
	size_t i;

	for (i = 0; i < FUZZ_NCOUNTERS; i++)
		fuzz_grown[i] = fuzz_at(after, i) - fuzz_at(before, i);
}

static int fuzz_grew(const char *name)
{
	size_t i;

	for (i = 0; i < FUZZ_NCOUNTERS; i++)
		if (strcmp(fuzz_counters[i].name, name) == 0)
			return fuzz_grown[i] != 0;
	fprintf(stderr, "fuzz_session: no counter named %s\n", name);
	return 0;
}

/* The replay driver, after each file: -1 when it is a seed named above
 * whose counters did not all grow. ACEMQ_FUZZ_SHOW_REACH=1 prints what
 * every file made grow, for writing the table. */
int fuzz_replayed(const char *path)
{
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	size_t i, j;
	int bad = 0;

	if (getenv("ACEMQ_FUZZ_SHOW_REACH")) {
		printf("%s:", base);
		for (i = 0; i < FUZZ_NCOUNTERS; i++)
			if (fuzz_grown[i])
				printf(" %s=%llu", fuzz_counters[i].name,
				       (unsigned long long)fuzz_grown[i]);
		printf("\n");
	}
	for (i = 0; i < FUZZ_NREACHES; i++) {
		if (strcmp(fuzz_reaches[i].seed, base) != 0)
			continue;
		fuzz_seen[i] = 1;
		for (j = 0; j < FUZZ_REACH_MAX && fuzz_reaches[i].counters[j]; j++)
			if (!fuzz_grew(fuzz_reaches[i].counters[j])) {
				fprintf(stderr, "fuzz_session: seed %s no longer reaches %s\n",
					base, fuzz_reaches[i].counters[j]);
				bad = -1;
			}
	}
	return bad;
}

/* After the last file: -1 when a seed named above was not replayed. */
int fuzz_replay_done(void)
{
	size_t i;
	int bad = 0;

	for (i = 0; i < FUZZ_NREACHES; i++)
		if (!fuzz_seen[i]) {
			fprintf(stderr, "fuzz_session: seed %s was not replayed\n",
				fuzz_reaches[i].seed);
			bad = -1;
		}
	return bad;
}
