/*
 * bench_cache.c — latency of the cache's hot operations (built, not run
 * as a test).
 *
 *   bench_cache [--full] [ENTRIES [SIZE [OPS]]]    defaults 1000 20480 10000
 *
 * Fills a scratch cache with ENTRIES entries of SIZE-byte random artifacts
 * and a budget of exactly ENTRIES * SIZE bytes, then times, per operation
 * (CLOCK_MONOTONIC around each call):
 *   store    OPS more stores (each one evicts one entry: steady state)
 *   lookup   OPS lookups of random live entries (key compare + hit record)
 *   read     OPS verified artifact reads (SHA-256 of SIZE bytes)
 *   flush    writing the hits the lookups recorded (one transaction),
 *            after a checkpoint so that none lands on its commit
 * and prints median, p90, p99 and max. --full opens with
 * synchronous_full=1 (an fsync per commit) to show what that costs.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "cache_testutil.h"
#include "tcctest.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void report(const char *name, double *t, size_t n) {
  qsort(t, n, sizeof *t, cmp_double);
  printf("%-8s n=%-6zu median %8.1f us   p90 %8.1f us   p99 %8.1f us   max %9.1f us\n", name,
         n, t[n / 2], t[n * 9 / 10], t[n * 99 / 100], t[n - 1]);
}

static _Noreturn void die(const char *what, const tcc_error *err) {
  fprintf(stderr, "bench_cache: %s: %s\n", what, err->msg);
  exit(1);
}

int main(int argc, char **argv) {
  int full = 0, a = 1;
  if (a < argc && strcmp(argv[a], "--full") == 0) full = 1, a++;
  size_t entries = a < argc ? strtoul(argv[a++], NULL, 10) : 1000;
  size_t size = a < argc ? strtoul(argv[a++], NULL, 10) : 20480;
  size_t ops = a < argc ? strtoul(argv[a++], NULL, 10) : 10000;
  if (!entries || !size || !ops) {
    fprintf(stderr, "usage: bench_cache [--full] [ENTRIES [SIZE [OPS]]]\n");
    return 2;
  }
  tt_seed("bench_cache");
  char *dir = tt_tmpdir("cache-test");
  if (!dir) return 1;
  tcc_cache_options o = {.dir = dir, .max_bytes = (int64_t)(entries * size),
                         .synchronous_full = full};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  if (tcc_cache_open(&o, &c, &err)) die("open", &err);

  /* Ring of the newest `entries` stored: with equal compile_ms the oldest
   * go first, so the ring is exactly what the cache holds. */
  tcc_cache_entry *ring = calloc(entries, sizeof *ring);
  uint8_t *art = malloc(size);
  double *t = malloc(ops * sizeof *t);
  size_t head = 0;
  double fill0 = now_us();
  for (size_t i = 0; i < entries + ops; i++) {
    tt_rand_bytes(art, size);
    tcc_cache_entry *e = &ring[head];
    head = (head + 1) % entries;
    tcc_cache_entry_clear(e);
    if (tu_random_entry(e, art, size, 100.0)) return 1;
    double t0 = now_us();
    if (tcc_cache_store(c, e, art, size, &err)) die("store", &err);
    if (i >= entries) t[i - entries] = now_us() - t0;
    if (i + 1 == entries)
      printf("filled %zu entries of %zu bytes in %.2f s (%s)\n", entries, size,
             (now_us() - fill0) / 1e6, full ? "synchronous=FULL" : "synchronous=NORMAL");
  }
  report("store", t, ops);

  tcc_cache_stats st;
  if (tcc_cache_stats_get(c, &st, &err)) die("stats", &err);
  printf("cache: %lld entries, %lld bytes (budget %lld), %lld evictions\n",
         (long long)st.entries, (long long)st.bytes, (long long)st.max_bytes,
         (long long)st.counters[TCC_COUNTER_evictions]);

  for (size_t i = 0; i < ops; i++) {
    tcc_cache_entry *e = &ring[tt_rand_range(0, entries - 1)], got;
    double t0 = now_us();
    if (tcc_cache_lookup(c, e->hash, e->key, e->key_len, &got, &err)) die("lookup", &err);
    t[i] = now_us() - t0;
    tcc_cache_entry_clear(&got);
  }
  report("lookup", t, ops);

  for (size_t i = 0; i < ops; i++) {
    tcc_cache_entry *e = &ring[tt_rand_range(0, entries - 1)];
    uint8_t *data = NULL;
    size_t n = 0;
    double t0 = now_us();
    if (tcc_cache_read_artifact(c, e->artifact_sha256, &data, &n, &err)) die("read", &err);
    t[i] = now_us() - t0;
    free(data);
  }
  report("read", t, ops);

  /* Checkpoint first (from a second connection, as another process
   * could), so the flush is timed without one landing on its commit. */
  char *db_path = NULL;
  sqlite3 *db = NULL;
  if (asprintf(&db_path, "%s/cache.db", dir) < 0 || sqlite3_open(db_path, &db) != SQLITE_OK ||
      sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL) != SQLITE_OK)
    fprintf(stderr, "bench_cache: checkpoint: %s\n", db ? sqlite3_errmsg(db) : "open failed");
  sqlite3_close(db);
  free(db_path);
  double t0 = now_us();
  if (tcc_cache_flush(c, &err)) die("flush", &err);
  printf("flush    %zu hits over %zu entries in one transaction: %.1f us\n", ops, entries,
         now_us() - t0);

  tcc_cache_close(c);
  for (size_t i = 0; i < entries; i++) tcc_cache_entry_clear(&ring[i]);
  free(ring);
  free(art);
  free(t);
  tt_remove_tree(dir);
  free(dir);
  return 0;
}
