/*
 * cache_testutil.h — helpers shared by the cache tests, the crash writer
 * and the benchmark: scratch directories, a seeded PRNG (the seed is
 * printed so a failure can be replayed with TCC_TEST_SEED=...), and
 * random cache entries.
 */
#ifndef TCC_CACHE_TESTUTIL_H
#define TCC_CACHE_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"

/* Creates a fresh directory under $TMPDIR (or /tmp) with mkdtemp.
 * Returns a malloc'd path, or NULL (errno set). */
char *tu_tempdir(void);

/* Removes path and everything under it (rm -rf). Returns 0 or -1. */
int tu_remove_tree(const char *path);

/* Seeds the PRNG from $TCC_TEST_SEED or the clock and pid, prints
 * "<who>: seed <n>" to stderr, and returns the seed. */
uint64_t tu_seed(const char *who);

/* Next pseudo-random 64-bit value (splitmix64). */
uint64_t tu_rand(void);

/* A value in [lo, hi]. */
uint64_t tu_rand_range(uint64_t lo, uint64_t hi);

/* Fills n bytes with pseudo-random data. */
void tu_rand_bytes(void *out, size_t n);

/* A random entry with owned key/manifest/request_meta for artifact:
 * random hash, key (16..512 bytes), manifest, request_meta, target,
 * kind, kernels, and half the time a random signature and key id;
 * artifact_sha256 computed from artifact; the given compile_ms. Release with tcc_cache_entry_clear. Returns 0 or -1 (OOM). */
int tu_random_entry(tcc_cache_entry *e, const uint8_t *artifact, size_t len, double compile_ms);

/* A malloc'd buffer of n random bytes (n may be 0: a 1-byte buffer). */
uint8_t *tu_random_artifact(size_t n);

#endif
