/* cache_testutil.c — see cache_testutil.h. */
#include "cache_testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcctest.h"

uint8_t *tu_random_artifact(size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  if (p) tt_rand_bytes(p, n);
  return p;
}

static uint8_t *random_blob(size_t lo, size_t hi, size_t *len) {
  *len = (size_t)tt_rand_range(lo, hi);
  return tu_random_artifact(*len);
}

int tu_random_entry(tcc_cache_entry *e, const uint8_t *artifact, size_t len, double compile_ms) {
  memset(e, 0, sizeof *e);
  tt_rand_bytes(e->hash, sizeof e->hash);
  e->key = random_blob(16, 512, &e->key_len);
  e->manifest = random_blob(1, 2048, &e->manifest_len);
  e->request_meta = random_blob(1, 128, &e->request_meta_len);
  if (!e->key || !e->manifest || !e->request_meta) {
    tcc_cache_entry_clear(e);
    return -1;
  }
  snprintf(e->target, sizeof e->target, "%s:%llx", tt_rand() & 1 ? "cpu" : "cuda",
           (unsigned long long)tt_rand());
  e->kind = (int)tt_rand_range(1, 2);
  e->kernels = (int)tt_rand_range(1, 40);
  e->compile_ms = compile_ms;
  e->size = (int64_t)len;
  tcc_sha256(artifact, len, e->artifact_sha256);
  if (tt_rand() & 1) { /* signed (v3): a random 64-byte signature and key id */
    tt_rand_bytes(e->signature, sizeof e->signature);
    e->signature_len = sizeof e->signature;
    snprintf(e->key_id, sizeof e->key_id, "%016llx", (unsigned long long)tt_rand());
  }
  return 0;
}
