/*
 * cache_testutil.h — what the cache tests, the crash writer and the
 * benchmark share beyond tests/support (tcctest.h: scratch directories,
 * the printed seed and its random numbers): random cache entries.
 */
#ifndef TCC_CACHE_TESTUTIL_H
#define TCC_CACHE_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"

/* A random entry with owned key/manifest/request_meta for artifact:
 * random hash, key (16..512 bytes), manifest, request_meta, target,
 * kind, kernels, and half the time a random signature and key id;
 * artifact_sha256 computed from artifact; the given compile_ms. Release with tcc_cache_entry_clear. Returns 0 or -1 (OOM). */
int tu_random_entry(tcc_cache_entry *e, const uint8_t *artifact, size_t len, double compile_ms);

/* A malloc'd buffer of n random bytes (n may be 0: a 1-byte buffer). */
uint8_t *tu_random_artifact(size_t n);

#endif
