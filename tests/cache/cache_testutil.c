/* cache_testutil.c — see cache_testutil.h. */
#include "cache_testutil.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

char *tu_tempdir(void) {
  const char *base = getenv("TMPDIR");
  char *path = NULL;
  if (asprintf(&path, "%s/tcc-cache-test-XXXXXX", base && *base ? base : "/tmp") < 0)
    return NULL;
  if (!mkdtemp(path)) {
    free(path);
    return NULL;
  }
  return path;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

int tu_remove_tree(const char *path) {
  return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static uint64_t rng_state;

uint64_t tu_seed(const char *who) {
  const char *env = getenv("TCC_TEST_SEED");
  uint64_t seed;
  if (env && *env) {
    seed = strtoull(env, NULL, 0);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
  }
  rng_state = seed;
  fprintf(stderr, "%s: seed %llu (replay with TCC_TEST_SEED=%llu)\n", who,
          (unsigned long long)seed, (unsigned long long)seed);
  return seed;
}

uint64_t tu_rand(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t tu_rand_range(uint64_t lo, uint64_t hi) {
  return lo + tu_rand() % (hi - lo + 1);
}

void tu_rand_bytes(void *out, size_t n) {
  uint8_t *p = out;
  while (n) {
    uint64_t r = tu_rand();
    size_t k = n < sizeof r ? n : sizeof r;
    memcpy(p, &r, k);
    p += k;
    n -= k;
  }
}

uint8_t *tu_random_artifact(size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  if (p) tu_rand_bytes(p, n);
  return p;
}

static uint8_t *random_blob(size_t lo, size_t hi, size_t *len) {
  *len = (size_t)tu_rand_range(lo, hi);
  return tu_random_artifact(*len);
}

int tu_random_entry(tcc_cache_entry *e, const uint8_t *artifact, size_t len, double compile_ms) {
  memset(e, 0, sizeof *e);
  tu_rand_bytes(e->hash, sizeof e->hash);
  e->key = random_blob(16, 512, &e->key_len);
  e->manifest = random_blob(1, 2048, &e->manifest_len);
  e->request_meta = random_blob(1, 128, &e->request_meta_len);
  if (!e->key || !e->manifest || !e->request_meta) {
    tcc_cache_entry_clear(e);
    return -1;
  }
  snprintf(e->target, sizeof e->target, "%s:%llx", tu_rand() & 1 ? "cpu" : "cuda",
           (unsigned long long)tu_rand());
  e->kind = (int)tu_rand_range(1, 2);
  e->kernels = (int)tu_rand_range(1, 40);
  e->compile_ms = compile_ms;
  e->size = (int64_t)len;
  tcc_sha256(artifact, len, e->artifact_sha256);
  if (tu_rand() & 1) { /* signed (v3): a random 64-byte signature and key id */
    tu_rand_bytes(e->signature, sizeof e->signature);
    e->signature_len = sizeof e->signature;
    snprintf(e->key_id, sizeof e->key_id, "%016llx", (unsigned long long)tu_rand());
  }
  return 0;
}
