/*
 * test_cache.c — unit tests of libtcccache (kernels_cache/cache.h).
 *
 * Every test gets a fresh mkdtemp directory (fixture `dir`), removed
 * afterwards. Inputs are random (seeded from the clock; the seed is
 * printed, TCC_TEST_SEED=<n> replays it). Where a test needs to look
 * under the cache (corrupt a blob, age an entry, inject a fault) it opens
 * cache.db with its own sqlite3 connection, as another process would.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_testutil.h"
#include "tcctest.h"

static char *dir;       /* this test's scratch directory */
static char db_path[512];

static void dir_setup(void) {
  tt_seed("test_cache");
  dir = tt_tmpdir("cache-test");
  ck_assert_msg(dir != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(db_path, sizeof db_path, "%s/cache.db", dir);
}

static void dir_teardown(void) {
  if (dir) tt_remove_tree(dir);
  free(dir);
  dir = NULL;
}

/* ---- helpers --------------------------------------------------------- */

static tcc_cache *open_cache(int64_t max_bytes) {
  tcc_cache_options o = {.dir = dir, .max_bytes = max_bytes};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  int rc = tcc_cache_open(&o, &c, &err);
  ck_assert_msg(rc == 0, "open: %s", err.msg);
  ck_assert_ptr_nonnull(c);
  return c;
}

/* A stored random entry with its artifact, kept by the test. */
typedef struct stored {
  tcc_cache_entry e;
  uint8_t *artifact;
  size_t len;
} stored;

static void store_random(tcc_cache *c, stored *s, size_t len, double compile_ms) {
  s->len = len;
  s->artifact = tu_random_artifact(len);
  ck_assert_ptr_nonnull(s->artifact);
  ck_assert_int_eq(tu_random_entry(&s->e, s->artifact, len, compile_ms), 0);
  tcc_error err = {0};
  int rc = tcc_cache_store(c, &s->e, s->artifact, len, &err);
  ck_assert_msg(rc == 0, "store: %s", err.msg);
}

static void stored_free(stored *s) {
  tcc_cache_entry_clear(&s->e);
  free(s->artifact);
  memset(s, 0, sizeof *s);
}

static sqlite3 *raw_open(void) {
  sqlite3 *db = NULL;
  ck_assert_int_eq(sqlite3_open(db_path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

static void raw_exec(sqlite3 *db, const char *sql) {
  char *msg = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
  sqlite3_free(msg);
}

/* A cache holding one random entry a (len bytes, compile_ms), turned into
 * an older version by sql run on the closed file, then opened again,
 * which migrates it. */
/* Undoes migrations 6 (stored requests) and 5 (the graph digests);
 * prefixed to every downgrade. */
#define UNDO_V7 "DROP TABLE plans;"
#define UNDO_V6 UNDO_V7 "ALTER TABLE entries DROP COLUMN request;"
#define UNDO_V5                                                                              \
  UNDO_V6 "DROP INDEX entries_by_graph; DROP INDEX failures_by_graph;"                               \
  "ALTER TABLE entries DROP COLUMN graph; ALTER TABLE failures DROP COLUMN graph;"

static tcc_cache *downgraded(stored *a, size_t len, double compile_ms, const char *sql) {
  tcc_cache *c = open_cache(0);
  store_random(c, a, len, compile_ms);
  tcc_cache_close(c);
  sqlite3 *db = raw_open();
  raw_exec(db, sql);
  sqlite3_close(db);
  return open_cache(0);
}

static int64_t raw_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *s = NULL;
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return v;
}

/* The closed cache file's schema version (PRAGMA user_version). */
static int64_t file_version(void) {
  sqlite3 *db = raw_open();
  int64_t v = raw_int(db, "PRAGMA user_version");
  sqlite3_close(db);
  return v;
}

/* Flips one random bit of a blob's data from outside the cache. */
static void corrupt_blob(const uint8_t sha[TCC_SHA256_BYTES], size_t len) {
  sqlite3 *db = raw_open();
  sqlite3_stmt *s = NULL;
  ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT data FROM blobs WHERE sha256 = ?1", -1, &s,
                                      NULL), SQLITE_OK);
  sqlite3_bind_blob(s, 1, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
  ck_assert_int_eq((size_t)sqlite3_column_bytes(s, 0), len);
  uint8_t *data = malloc(len);
  memcpy(data, sqlite3_column_blob(s, 0), len);
  sqlite3_finalize(s);
  data[tt_rand_range(0, len - 1)] ^= (uint8_t)(1u << tt_rand_range(0, 7));
  ck_assert_int_eq(sqlite3_prepare_v2(db, "UPDATE blobs SET data = ?2 WHERE sha256 = ?1", -1, &s,
                                      NULL), SQLITE_OK);
  sqlite3_bind_blob(s, 1, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_blob(s, 2, data, (int)len, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(s);
  sqlite3_close(db);
  free(data);
}

/* Sets an entry column (last_used, created) from outside the cache. */
static void set_entry_int(const uint8_t hash[TCC_SHA256_BYTES], const char *col, int64_t v) {
  sqlite3 *db = raw_open();
  char sql[128];
  snprintf(sql, sizeof sql, "UPDATE entries SET %s = ?2 WHERE hash = ?1", col);
  sqlite3_stmt *s = NULL;
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_int64(s, 2, v);
  ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

static bool present(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES]) {
  tcc_cache_entry e;
  tcc_error err = {0};
  int rc = tcc_cache_get(c, hash, &e, &err);
  ck_assert_msg(rc == 0 || rc == TCC_E_NOT_FOUND, "get: %s", err.msg);
  tcc_cache_entry_clear(&e);
  return rc == 0;
}

static tcc_cache_stats stats_of(tcc_cache *c) {
  tcc_cache_stats st;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_stats_get(c, &st, &err) == 0, "stats: %s", err.msg);
  return st;
}

static void assert_entry_equal(const tcc_cache_entry *got, const tcc_cache_entry *want) {
  ck_assert_mem_eq(got->hash, want->hash, TCC_SHA256_BYTES);
  ck_assert_uint_eq(got->key_len, want->key_len);
  ck_assert_mem_eq(got->key, want->key, want->key_len);
  ck_assert_str_eq(got->target, want->target);
  ck_assert_int_eq(got->kind, want->kind);
  ck_assert_uint_eq(got->manifest_len, want->manifest_len);
  ck_assert_mem_eq(got->manifest, want->manifest, want->manifest_len);
  ck_assert_uint_eq(got->request_meta_len, want->request_meta_len);
  ck_assert_mem_eq(got->request_meta, want->request_meta, want->request_meta_len);
  ck_assert_mem_eq(got->artifact_sha256, want->artifact_sha256, TCC_SHA256_BYTES);
  ck_assert_int_eq(got->size, want->size);
  ck_assert_int_eq(got->kernels, want->kernels);
  ck_assert_double_eq(got->compile_ms, want->compile_ms); /* stored as a REAL: exact */
  ck_assert_uint_eq(got->signature_len, want->signature_len);
  ck_assert_mem_eq(got->signature, want->signature, want->signature_len);
  ck_assert_str_eq(got->key_id, want->key_id);
}

/* ---- tests ----------------------------------------------------------- */

START_TEST(test_store_lookup_reopen) {
  tcc_cache *c = open_cache(0);
  stored s;
  size_t len = (size_t)tt_rand_range(1000, 40000);
  double ms = (double)tt_rand_range(1, 1000000) / 7.0;
  int64_t t0 = (int64_t)time(NULL);
  store_random(c, &s, len, ms);
  int64_t t1 = (int64_t)time(NULL);

  tcc_cache_entry got;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_lookup(c, s.e.hash, s.e.key, s.e.key_len, &got, &err) == 0, "%s",
                err.msg);
  assert_entry_equal(&got, &s.e);
  ck_assert_int_eq(got.hits, 1);
  ck_assert_int_ge(got.created, t0);
  ck_assert_int_le(got.created, t1);
  ck_assert_int_ge(got.last_used, got.created);
  tcc_cache_entry_clear(&got);

  int n_hits = (int)tt_rand_range(2, 50);
  for (int i = 1; i < n_hits; i++) {
    ck_assert_int_eq(tcc_cache_lookup(c, s.e.hash, s.e.key, s.e.key_len, &got, &err), 0);
    ck_assert_int_eq(got.hits, i + 1);
    tcc_cache_entry_clear(&got);
  }
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, 1);
  ck_assert_int_eq(st.bytes, (int64_t)len);
  ck_assert_double_eq_tol(st.compile_seconds, ms / 1000.0, 1e-9 * ms);
  ck_assert_double_eq_tol(st.compile_seconds_saved, n_hits * ms / 1000.0, 1e-9 * n_hits * ms);
  tcc_cache_close(c);

  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_get(c, s.e.hash, &got, &err), 0);
  assert_entry_equal(&got, &s.e);
  ck_assert_int_eq(got.hits, n_hits); /* written by close's flush */
  tcc_cache_entry_clear(&got);
  st = stats_of(c);
  ck_assert_double_eq_tol(st.compile_seconds_saved, n_hits * ms / 1000.0, 1e-9 * n_hits * ms);

  uint8_t *data = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_read_artifact(c, s.e.artifact_sha256, &data, &n, &err), 0);
  ck_assert_uint_eq(n, len);
  ck_assert_mem_eq(data, s.artifact, len);
  free(data);
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  tcc_cache_close(c);

  /* The file is what cache.c documents. */
  sqlite3 *db = raw_open();
  ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), 7);
  ck_assert_int_eq(raw_int(db, "PRAGMA application_id"), 0x54434344);
  ck_assert_int_eq(raw_int(db, "PRAGMA auto_vacuum"), 2);
  sqlite3_close(db);
  stored_free(&s);
}
END_TEST

START_TEST(test_key_mismatch_is_miss) {
  tcc_cache *c = open_cache(0);
  stored s;
  store_random(c, &s, 4096, 12.5);
  tcc_cache_entry got;
  tcc_error err = {0};

  /* Same length, one byte different. */
  uint8_t *other = malloc(s.e.key_len);
  memcpy(other, s.e.key, s.e.key_len);
  other[tt_rand_range(0, s.e.key_len - 1)] ^= 0x40;
  ck_assert_int_eq(tcc_cache_lookup(c, s.e.hash, other, s.e.key_len, &got, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err.msg, "guard hash collision"));
  ck_assert_ptr_null(got.key);
  /* A prefix of the key. */
  ck_assert_int_eq(tcc_cache_lookup(c, s.e.hash, s.e.key, s.e.key_len - 1, &got, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err.msg, "guard hash collision"));
  /* An unknown hash is a plain miss. */
  uint8_t h[TCC_SHA256_BYTES];
  tt_rand_bytes(h, sizeof h);
  ck_assert_int_eq(tcc_cache_lookup(c, h, s.e.key, s.e.key_len, &got, &err), TCC_E_NOT_FOUND);
  ck_assert_ptr_null(strstr(err.msg, "collision"));
  /* Misses recorded no hit. */
  ck_assert_int_eq(tcc_cache_get(c, s.e.hash, &got, &err), 0);
  ck_assert_int_eq(got.hits, 0);
  tcc_cache_entry_clear(&got);
  free(other);
  stored_free(&s);
  tcc_cache_close(c);
}
END_TEST

START_TEST(test_read_artifact_roundtrip) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  for (int i = 0; i < 8; i++) {
    stored s;
    size_t len = (size_t)tt_rand_range(1, 200000);
    store_random(c, &s, len, 3.0);
    uint8_t *data = NULL;
    size_t n = 0;
    ck_assert_msg(tcc_cache_read_artifact(c, s.e.artifact_sha256, &data, &n, &err) == 0, "%s",
                  err.msg);
    ck_assert_uint_eq(n, len);
    ck_assert_mem_eq(data, s.artifact, len);
    uint8_t d[TCC_SHA256_BYTES];
    tcc_sha256(data, n, d);
    ck_assert_mem_eq(d, s.e.artifact_sha256, TCC_SHA256_BYTES);
    free(data);
    stored_free(&s);
  }
  uint8_t unknown[TCC_SHA256_BYTES], *data = (uint8_t *)&err;
  size_t n = 7;
  tt_rand_bytes(unknown, sizeof unknown);
  ck_assert_int_eq(tcc_cache_read_artifact(c, unknown, &data, &n, &err), TCC_E_NOT_FOUND);
  ck_assert_ptr_null(data);
  ck_assert_uint_eq(n, 0);
  tcc_cache_close(c);
}
END_TEST

START_TEST(test_corrupt_blob) {
  tcc_cache *c = open_cache(0);
  stored bad, good;
  store_random(c, &bad, (size_t)tt_rand_range(100, 50000), 40.0);
  store_random(c, &good, (size_t)tt_rand_range(100, 50000), 40.0);
  corrupt_blob(bad.e.artifact_sha256, bad.len);

  tcc_error err = {0};
  uint8_t *data = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_read_artifact(c, bad.e.artifact_sha256, &data, &n, &err),
                   TCC_E_DATA_LOSS);
  ck_assert_ptr_null(data);
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(bad.e.artifact_sha256, TCC_SHA256_BYTES, hex);
  ck_assert_msg(strstr(err.msg, hex) != NULL, "message names the digest: %s", err.msg);

  ck_assert(!present(c, bad.e.hash));
  tcc_cache_entry got;
  ck_assert_int_eq(tcc_cache_lookup(c, bad.e.hash, bad.e.key, bad.e.key_len, &got, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_read_artifact(c, bad.e.artifact_sha256, &data, &n, &err),
                   TCC_E_NOT_FOUND);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.counters[TCC_COUNTER_corrupt_blobs], 1);
  ck_assert_int_eq(st.entries, 1);
  ck_assert_int_eq(st.bytes, (int64_t)good.len);

  /* The other entry is untouched. */
  ck_assert_int_eq(tcc_cache_read_artifact(c, good.e.artifact_sha256, &data, &n, &err), 0);
  ck_assert_mem_eq(data, good.artifact, good.len);
  free(data);
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  tcc_cache_close(c);

  c = open_cache(0);
  ck_assert_int_eq(stats_of(c).counters[TCC_COUNTER_corrupt_blobs], 1);
  tcc_cache_close(c);
  stored_free(&bad);
  stored_free(&good);
}
END_TEST

START_TEST(test_eviction_by_budget) {
  enum { N = 24, SLOTS = 10, VALUABLE = 7 };
  const size_t len = 4096;
  tcc_cache *c = open_cache((int64_t)(SLOTS * len));
  stored s[N];
  bool valuable[N] = {false};
  /* VALUABLE random positions among the first N-2 (the hot one is 0). */
  for (int k = 0; k < VALUABLE;) {
    int i = (int)tt_rand_range(1, N - 2);
    if (!valuable[i]) valuable[i] = true, k++;
  }
  tcc_error err = {0};
  for (int i = 0; i < N; i++) {
    double ms = valuable[i] ? tt_rand_range(900, 5000) : tt_rand_range(1, 5);
    store_random(c, &s[i], len, ms);
    if (i == 0) { /* a cheap entry made valuable by its hits (pending in memory) */
      for (int h = 0; h < 6000; h++) {
        tcc_cache_entry got;
        ck_assert_int_eq(tcc_cache_lookup(c, s[0].e.hash, s[0].e.key, s[0].e.key_len, &got,
                                          &err), 0);
        tcc_cache_entry_clear(&got);
      }
    }
    tcc_cache_stats st = stats_of(c);
    ck_assert_int_le(st.bytes, SLOTS * (int64_t)len);
    ck_assert(present(c, s[i].e.hash)); /* never evicted by its own store */
  }
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, SLOTS);
  ck_assert_int_eq(st.bytes, SLOTS * (int64_t)len);
  ck_assert_int_eq(st.counters[TCC_COUNTER_evictions], N - SLOTS);
  ck_assert_msg(present(c, s[0].e.hash), "the hot cheap entry survives");
  for (int i = 0; i < N; i++)
    if (valuable[i]) ck_assert_msg(present(c, s[i].e.hash), "valuable entry %d survives", i);
  ck_assert(present(c, s[N - 1].e.hash));

  /* An artifact larger than the whole budget is refused, cache unchanged. */
  stored big;
  big.artifact = tu_random_artifact(SLOTS * len + 1);
  tu_random_entry(&big.e, big.artifact, SLOTS * len + 1, 1e6);
  ck_assert_int_eq(tcc_cache_store(c, &big.e, big.artifact, SLOTS * len + 1, &err),
                   TCC_E_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(stats_of(c).entries, SLOTS);
  big.len = SLOTS * len + 1;
  stored_free(&big);
  tcc_cache_close(c);

  c = open_cache((int64_t)(SLOTS * len));
  ck_assert_int_eq(stats_of(c).counters[TCC_COUNTER_evictions], N - SLOTS);
  tcc_cache_close(c);
  for (int i = 0; i < N; i++) stored_free(&s[i]);
}
END_TEST

START_TEST(test_evict_by_hash) {
  tcc_cache *c = open_cache(0);
  stored a, b;
  store_random(c, &a, 3000, 5);
  store_random(c, &b, 5000, 5);
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_evict(c, a.e.hash, &err), 0);
  ck_assert(!present(c, a.e.hash));
  ck_assert(present(c, b.e.hash));
  uint8_t *data = NULL;
  size_t n;
  ck_assert_int_eq(tcc_cache_read_artifact(c, a.e.artifact_sha256, &data, &n, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_evict(c, a.e.hash, &err), TCC_E_NOT_FOUND);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, 1);
  ck_assert_int_eq(st.bytes, 5000);
  ck_assert_int_eq(st.counters[TCC_COUNTER_evictions], 0); /* manual, not budget */
  tcc_cache_close(c);
  stored_free(&a);
  stored_free(&b);
}
END_TEST

/* The negative cache: recorded, found only with the same key, superseded
 * by a successful store, removed by evict, persistent across reopen. */
START_TEST(test_negative_cache) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  uint8_t hash[TCC_SHA256_BYTES], key[40], other_key[40];
  tt_rand_bytes(hash, sizeof hash);
  tt_rand_bytes(key, sizeof key);
  memcpy(other_key, key, sizeof key);
  other_key[7] ^= 1;
  tcc_cache_failure f;
  ck_assert_int_eq(tcc_cache_lookup_failure(c, hash, key, sizeof key, &f, &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_store_failure(c, hash, key, sizeof key, "cpu:x86-64-v2",
                                           TCC_E_UNIMPLEMENTED, "unsupported op 'aten.x.y'", &err), 0);
  ck_assert_int_eq(tcc_cache_lookup_failure(c, hash, key, sizeof key, &f, &err), 0);
  ck_assert_int_eq(f.code, TCC_E_UNIMPLEMENTED);
  ck_assert_str_eq(f.message, "unsupported op 'aten.x.y'");
  ck_assert_int_eq(tcc_cache_lookup_failure(c, hash, other_key, sizeof other_key, &f, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_int_eq(stats_of(c).failures, 1);

  tcc_cache_close(c); /* persists */
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_lookup_failure(c, hash, key, sizeof key, &f, &err), 0);
  ck_assert_int_eq(tcc_cache_evict(c, hash, &err), 0); /* evict clears it */
  ck_assert_int_eq(tcc_cache_lookup_failure(c, hash, key, sizeof key, &f, &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_evict(c, hash, &err), TCC_E_NOT_FOUND);

  stored a; /* a successful store of the same hash supersedes a failure */
  store_random(c, &a, 1000, 5);
  ck_assert_int_eq(tcc_cache_store_failure(c, a.e.hash, a.e.key, a.e.key_len, "cpu",
                                           TCC_E_INTERNAL, "cc failed", &err), 0);
  ck_assert_int_eq(tcc_cache_store(c, &a.e, a.artifact, a.len, &err), 0);
  ck_assert_int_eq(tcc_cache_lookup_failure(c, a.e.hash, a.e.key, a.e.key_len, &f, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_int_eq(stats_of(c).failures, 0);
  ck_assert_int_eq(tcc_cache_store_failure(c, hash, key, sizeof key, "cpu", 0, "no code", &err),
                   TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
  stored_free(&a);
}
END_TEST

/* A version-1 file (before the negative cache) is migrated on open, its
 * entries kept, and compile_seconds carried over from them. */
START_TEST(test_migrate_from_v1) {
  stored a;
  tcc_cache *c = downgraded(&a, 2000, 1500,
                            UNDO_V5 "DROP TABLE tuning; DROP TABLE failures;"
                            "DELETE FROM totals WHERE name = 'compile_seconds';"
                            "ALTER TABLE entries DROP COLUMN signature; ALTER TABLE entries DROP COLUMN key_id;"
                            "PRAGMA user_version = 1;");
  ck_assert(present(c, a.e.hash));
  tcc_cache_stats st = stats_of(c);
  ck_assert(st.compile_seconds > 1.49 && st.compile_seconds < 1.51);
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_store_failure(c, a.e.hash, a.e.key, a.e.key_len, "cpu",
                                           TCC_E_INTERNAL, "x", &err), 0);
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  stored_free(&a);
}
END_TEST

/* A version-2 file (before signatures) is migrated on open: its entries
 * are kept, unsigned; signatures stored afterwards round-trip, also in
 * lists. */
START_TEST(test_migrate_from_v2) {
  stored a;
  tcc_cache *c = downgraded(&a, 1500, 20,
                            UNDO_V5 "DROP TABLE tuning;"
                            "ALTER TABLE entries DROP COLUMN signature; ALTER TABLE entries DROP COLUMN key_id;"
                            "PRAGMA user_version = 2;");
  tcc_error err = {0};
  tcc_cache_entry got;
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &got, &err), 0);
  ck_assert_uint_eq(got.signature_len, 0); /* migrated entries are unsigned */
  ck_assert_str_eq(got.key_id, "");
  ck_assert_mem_eq(got.manifest, a.e.manifest, a.e.manifest_len);
  tcc_cache_entry_clear(&got);

  stored b; /* a signed entry stored after the migration */
  store_random(c, &b, 900, 7);
  tt_rand_bytes(b.e.signature, sizeof b.e.signature);
  b.e.signature_len = sizeof b.e.signature;
  snprintf(b.e.key_id, sizeof b.e.key_id, "%016llx", (unsigned long long)tt_rand());
  ck_assert_int_eq(tcc_cache_store(c, &b.e, b.artifact, b.len, &err), 0);
  tcc_cache_close(c);
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_get(c, b.e.hash, &got, &err), 0);
  assert_entry_equal(&got, &b.e);
  tcc_cache_entry_clear(&got);
  tcc_cache_entry *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_list(c, TCC_CACHE_ORDER_CREATED, 0, &list, &n, &err), 0);
  ck_assert_uint_eq(n, 2);
  int seen = 0;
  for (size_t i = 0; i < n; i++) {
    int is_b = !memcmp(list[i].hash, b.e.hash, TCC_SHA256_BYTES);
    seen += is_b;
    ck_assert_str_eq(list[i].key_id, is_b ? b.e.key_id : "");
  }
  ck_assert_int_eq(seen, 1);
  tcc_cache_entries_free(list, n);
  /* a key id that is not terminated, or an oversized signature, is refused */
  memset(b.e.key_id, 'a', sizeof b.e.key_id);
  ck_assert_int_eq(tcc_cache_store(c, &b.e, b.artifact, b.len, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  stored_free(&a);
  stored_free(&b);
}
END_TEST

/* Tuning records (v4): absent until put, returned byte for byte, keyed
 * by (signature, target), replaced by a later put, kept across reopen,
 * counted in the stats. */
START_TEST(test_tuning_records) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  uint8_t sig[TCC_SHA256_BYTES], other[TCC_SHA256_BYTES];
  tt_rand_bytes(sig, sizeof sig);
  memcpy(other, sig, sizeof sig);
  other[tt_rand_range(0, sizeof other - 1)] ^= 0x10;
  uint8_t rec[300], rec2[300];
  size_t len = (size_t)tt_rand_range(1, sizeof rec), len2 = (size_t)tt_rand_range(1, sizeof rec2);
  tt_rand_bytes(rec, len);
  tt_rand_bytes(rec2, len2);
  uint8_t *got = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_tuning_get(c, sig, "cpu:x86-64-v2", &got, &n, &err), TCC_E_NOT_FOUND);
  ck_assert_ptr_null(got);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu:x86-64-v2", rec, len, &err), 0);
  ck_assert_int_eq(tcc_cache_tuning_get(c, sig, "cpu:x86-64-v2", &got, &n, &err), 0);
  ck_assert_uint_eq(n, len);
  ck_assert_mem_eq(got, rec, len);
  free(got);
  ck_assert_int_eq(tcc_cache_tuning_get(c, sig, "cpu:x86-64-v3", &got, &n, &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_tuning_get(c, other, "cpu:x86-64-v2", &got, &n, &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu:x86-64-v3", rec2, len2, &err), 0);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu:x86-64-v2", rec2, len2, &err), 0); /* replace */
  ck_assert_int_eq(stats_of(c).tuning_records, 2);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu", rec, 0, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_tuning_get(c, sig, "cpu:x86-64-v2", &got, &n, &err), 0);
  ck_assert_uint_eq(n, len2);
  ck_assert_mem_eq(got, rec2, len2);
  free(got);
  ck_assert_int_eq(stats_of(c).tuning_records, 2);
  tcc_cache_close(c);
}
END_TEST

/* A version-3 file (before tuning records) is migrated on open: its
 * entries are kept and records can be stored. */
START_TEST(test_migrate_from_v3) {
  stored a;
  tcc_cache *c = downgraded(&a, 1200, 30, UNDO_V5 "DROP TABLE tuning; PRAGMA user_version = 3;");
  ck_assert(present(c, a.e.hash));
  tcc_error err = {0};
  uint8_t sig[TCC_SHA256_BYTES], rec[16], *got = NULL;
  size_t n = 0;
  tt_rand_bytes(sig, sizeof sig);
  tt_rand_bytes(rec, sizeof rec);
  ck_assert_int_eq(stats_of(c).tuning_records, 0);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu", rec, sizeof rec, &err), 0);
  ck_assert_int_eq(tcc_cache_tuning_get(c, sig, "cpu", &got, &n, &err), 0);
  ck_assert_mem_eq(got, rec, sizeof rec);
  free(got);
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  stored_free(&a);
}
END_TEST

/* A test graph digest: the key's first byte names the graph (a key
 * starting with 0xff cannot be read). */
static int first_byte_digest(const uint8_t *key, size_t len, uint8_t out[TCC_SHA256_BYTES]) {
  if (len == 0 || key[0] == 0xff) return -1;
  memset(out, key[0], TCC_SHA256_BYTES);
  return 0;
}

static tcc_cache *open_with_digests(void) {
  tcc_cache_options o = {.dir = dir, .graph_digest = first_byte_digest};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_open(&o, &c, &err) == 0, "open: %s", err.msg);
  return c;
}

static int keyed_has(const tcc_cache_keyed *k, size_t n, const uint8_t hash[TCC_SHA256_BYTES], int failure) {
  for (size_t i = 0; i < n; i++)
    if (!memcmp(k[i].hash, hash, TCC_SHA256_BYTES)) return k[i].failure == failure;
  return 0;
}

/* Graph digests (v5): entries and failures are found by the digest of
 * their key, with their keys; rows stored without the hook (as before
 * v5) get theirs on the first lookup; a key the hook cannot read is
 * never found; key_of finds entries and failures. */
START_TEST(test_same_graph) {
  tcc_error err = {0};
  stored a, b, old, bad;
  tcc_cache *c = open_cache(0); /* no hook: rows without a digest */
  store_random(c, &old, 300, 3);
  old.e.key[0] = 7;
  ck_assert_int_eq(tcc_cache_store(c, &old.e, old.artifact, old.len, &err), 0); /* replaced: key byte set */
  tcc_cache_close(c);
  c = open_with_digests();
  store_random(c, &a, 400, 4);
  a.e.key[0] = 7;
  ck_assert_int_eq(tcc_cache_store(c, &a.e, a.artifact, a.len, &err), 0);
  store_random(c, &b, 500, 5);
  b.e.key[0] = 9; /* another graph */
  ck_assert_int_eq(tcc_cache_store(c, &b.e, b.artifact, b.len, &err), 0);
  store_random(c, &bad, 600, 6);
  bad.e.key[0] = 0xff;
  ck_assert_int_eq(tcc_cache_store(c, &bad.e, bad.artifact, bad.len, &err), 0);
  uint8_t fhash[TCC_SHA256_BYTES], fkey[24];
  tt_rand_bytes(fhash, sizeof fhash);
  tt_rand_bytes(fkey, sizeof fkey);
  fkey[0] = 7;
  ck_assert_int_eq(tcc_cache_store_failure(c, fhash, fkey, sizeof fkey, "cpu", TCC_E_INTERNAL, "x", &err), 0);

  uint8_t g7[TCC_SHA256_BYTES];
  memset(g7, 7, sizeof g7);
  tcc_cache_keyed *k = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_same_graph(c, g7, 0, &k, &n, &err), 0);
  ck_assert_uint_eq(n, 3); /* a, the failure and the old row (backfilled) */
  ck_assert(keyed_has(k, n, a.e.hash, 0) && keyed_has(k, n, old.e.hash, 0) && keyed_has(k, n, fhash, 1));
  for (size_t i = 0; i < n; i++) ck_assert_uint_eq(k[i].key[0], 7);
  tcc_cache_keyed_free(k, n);
  ck_assert_int_eq(tcc_cache_same_graph(c, g7, 2, &k, &n, &err), 0); /* the limit */
  ck_assert_uint_eq(n, 2);
  tcc_cache_keyed_free(k, n);

  uint8_t *key = NULL;
  size_t len = 0;
  int failure = -1;
  ck_assert_int_eq(tcc_cache_key_of(c, fhash, &key, &len, &failure, &err), 0);
  ck_assert_int_eq(failure, 1);
  ck_assert_uint_eq(len, sizeof fkey);
  ck_assert_mem_eq(key, fkey, len);
  free(key);
  ck_assert_int_eq(tcc_cache_key_of(c, b.e.hash, &key, &len, &failure, &err), 0);
  ck_assert_int_eq(failure, 0);
  ck_assert_mem_eq(key, b.e.key, len);
  free(key);
  uint8_t nohash[TCC_SHA256_BYTES];
  tt_rand_bytes(nohash, sizeof nohash);
  ck_assert_int_eq(tcc_cache_key_of(c, nohash, &key, &len, &failure, &err), TCC_E_NOT_FOUND);
  tcc_cache_close(c);

  sqlite3 *db = raw_open(); /* every row has a digest now; the unreadable key an empty one */
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM entries WHERE graph IS NULL"), 0);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM entries WHERE length(graph) = 0"), 1);
  sqlite3_close(db);
  stored_free(&a);
  stored_free(&b);
  stored_free(&old);
  stored_free(&bad);
}
END_TEST

/* A version-4 file (before graph digests) is migrated on open. */
START_TEST(test_migrate_from_v4) {
  stored a;
  tcc_cache *c = downgraded(&a, 800, 10, UNDO_V5 "PRAGMA user_version = 4;");
  ck_assert(present(c, a.e.hash));
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  stored_free(&a);
}
END_TEST

/* A version-5 file (before stored requests) is migrated on open; its
 * entries keep no request, which the warm listing counts. */
START_TEST(test_migrate_from_v5) {
  stored a;
  tcc_cache *c = downgraded(&a, 900, 12, UNDO_V6 "PRAGMA user_version = 5;");
  ck_assert(present(c, a.e.hash));
  tcc_cache_stored_request *rows = NULL;
  size_t n = 0;
  int64_t without = -1;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_list_requests(c, NULL, NULL, 0, 0, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(without, 1);
  free(rows);
  uint8_t *req = NULL;
  size_t len = 0;
  ck_assert_int_eq(tcc_cache_request_of(c, a.e.hash, &req, &len, &err), TCC_E_NOT_FOUND);
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  stored_free(&a);
}
END_TEST

/* A version-6 file (before plans) is migrated on open: its entries are
 * kept and plans can be stored. */
START_TEST(test_migrate_from_v6) {
  stored a;
  tcc_cache *c = downgraded(&a, 700, 9, UNDO_V7 "PRAGMA user_version = 6;");
  ck_assert(present(c, a.e.hash));
  tcc_error err = {0};
  ck_assert_int_eq(stats_of(c).plans, 0);
  const uint8_t plan[] = "plan bytes";
  int inserted = 0;
  ck_assert_int_eq(tcc_cache_plan_put(c, "key", plan, sizeof plan, NULL, 0, "", &inserted, &err), 0);
  ck_assert_int_eq(inserted, 1);
  tcc_cache_close(c);
  ck_assert_int_eq(file_version(), 7);
  c = open_cache(0);
  tcc_cache_plan p;
  ck_assert_int_eq(tcc_cache_plan_get(c, "key", &p, &err), 0);
  ck_assert_uint_eq(p.plan_len, sizeof plan);
  tcc_cache_plan_free(&p);
  tcc_cache_close(c);
  stored_free(&a);
}
END_TEST

/* Plans (v7): absent until put; the first put of a key wins (a second
 * one, even with other bytes, changes nothing and says so); a get
 * returns the bytes, signature and key id as stored and counts a hit;
 * they survive a reopen; stats count rows and bytes; a plan altered in
 * the file is removed and reported as DATA_LOSS; delete; bad arguments. */
START_TEST(test_plans) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  uint8_t plan[2000], other[100], sig[TCC_CACHE_SIGNATURE_MAX];
  size_t len = (size_t)tt_rand_range(1, sizeof plan);
  tt_rand_bytes(plan, len);
  tt_rand_bytes(other, sizeof other);
  tt_rand_bytes(sig, sizeof sig);
  tcc_cache_plan p;
  ck_assert_int_eq(tcc_cache_plan_get(c, "tccd.a", &p, &err), TCC_E_NOT_FOUND);
  ck_assert_ptr_null(p.plan);
  int inserted = -1;
  ck_assert_int_eq(tcc_cache_plan_put(c, "tccd.a", plan, len, sig, sizeof sig, "0123456789abcdef", &inserted, &err), 0);
  ck_assert_int_eq(inserted, 1);
  ck_assert_int_eq(tcc_cache_plan_put(c, "tccd.a", other, sizeof other, NULL, 0, "", &inserted, &err), 0);
  ck_assert_int_eq(inserted, 0);
  ck_assert_int_eq(tcc_cache_plan_put(c, "tccd.b", other, sizeof other, NULL, 0, "", &inserted, &err), 0);
  ck_assert_int_eq(inserted, 1);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.plans, 2);
  ck_assert_int_eq(st.plan_bytes, (int64_t)(len + sizeof other));
  for (int round = 1; round <= 2; round++) {
    ck_assert_int_eq(tcc_cache_plan_get(c, "tccd.a", &p, &err), 0);
    ck_assert_uint_eq(p.plan_len, len);
    ck_assert_mem_eq(p.plan, plan, len);
    ck_assert_uint_eq(p.signature_len, sizeof sig);
    ck_assert_mem_eq(p.signature, sig, sizeof sig);
    ck_assert_str_eq(p.key_id, "0123456789abcdef");
    ck_assert_int_eq(p.hits, round);
    ck_assert_int_ge(p.last_used, p.created);
    tcc_cache_plan_free(&p);
    ck_assert_ptr_null(p.plan);
    tcc_cache_close(c);
    c = open_cache(0);
  }
  ck_assert_int_eq(tcc_cache_plan_get(c, "tccd.b", &p, &err), 0);
  ck_assert_uint_eq(p.signature_len, 0);
  ck_assert_str_eq(p.key_id, "");
  tcc_cache_plan_free(&p);
  tcc_cache_close(c);

  sqlite3 *db = raw_open(); /* zero a's plan from outside */
  raw_exec(db, "UPDATE plans SET plan = CAST(zeroblob(length(plan)) AS BLOB) WHERE key = 'tccd.a'");
  sqlite3_close(db);
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_plan_get(c, "tccd.a", &p, &err), TCC_E_DATA_LOSS);
  ck_assert_ptr_null(p.plan);
  ck_assert_int_eq(tcc_cache_plan_get(c, "tccd.a", &p, &err), TCC_E_NOT_FOUND); /* removed */
  ck_assert_int_eq(tcc_cache_plan_delete(c, "tccd.b", &err), 0);
  ck_assert_int_eq(tcc_cache_plan_delete(c, "tccd.b", &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(stats_of(c).plans, 0);

  char long_key[TCC_CACHE_PLAN_KEY_MAX + 2];
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = '\0';
  ck_assert_int_eq(tcc_cache_plan_put(c, long_key, plan, len, NULL, 0, "", NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_cache_plan_put(c, "", plan, len, NULL, 0, "", NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_cache_plan_put(c, "k", plan, 0, NULL, 0, "", NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_cache_plan_put(c, "k", plan, len, NULL, 65, "", NULL, &err), TCC_E_INVALID_ARGUMENT);
  long_key[TCC_CACHE_PLAN_KEY_MAX] = '\0';
  ck_assert_int_eq(tcc_cache_plan_put(c, long_key, plan, len, NULL, 0, "", &inserted, &err), 0);
  ck_assert_int_eq(inserted, 1);
  tcc_cache_close(c);
}
END_TEST

/* Stored requests (v6): kept with their entry, listed by target (only
 * one, or all but one), age and count, newest first, read back byte for
 * byte, gone with the entry; one over TCC_CACHE_REQUEST_MAX is refused. */
START_TEST(test_stored_requests) {
  tcc_cache *c = open_cache(0);
  enum { N = 6 };
  tcc_cache_entry e[N];
  uint8_t *req[N], *art[N];
  size_t req_len[N];
  tcc_error err = {0};
  for (int i = 0; i < N; i++) {
    art[i] = tu_random_artifact(300 + (size_t)i);
    ck_assert_int_eq(tu_random_entry(&e[i], art[i], 300 + (size_t)i, 5), 0);
    snprintf(e[i].target, sizeof e[i].target, "%s", i % 2 ? "cuda:sm_80" : "cpu:x86-64-v3");
    req_len[i] = (size_t)tt_rand_range(1, 5000);
    req[i] = tu_random_artifact(req_len[i]);
    if (i != N - 1) { /* the last keeps none */
      e[i].request = req[i];
      e[i].request_len = req_len[i];
    }
    ck_assert_int_eq(tcc_cache_store(c, &e[i], art[i], 300 + (size_t)i, &err), 0);
  }
  sqlite3 *db = raw_open(); /* ages: entry i created i hours ago */
  for (int i = 0; i < N; i++) {
    char hex[TCC_SHA256_HEX], sql[256];
    tcc_hex_encode(e[i].hash, TCC_SHA256_BYTES, hex);
    snprintf(sql, sizeof sql, "UPDATE entries SET created = created - %d WHERE hash = x'%s'", 3600 * i, hex);
    raw_exec(db, sql);
  }
  sqlite3_close(db);

  tcc_cache_stored_request *rows = NULL;
  size_t n = 0;
  int64_t without = 0;
  ck_assert_int_eq(tcc_cache_list_requests(c, NULL, NULL, 0, 0, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, N - 1);
  ck_assert_int_eq(without, 1);
  for (size_t k = 0; k < n; k++) ck_assert_mem_eq(rows[k].hash, e[k].hash, TCC_SHA256_BYTES); /* newest first */
  free(rows);
  ck_assert_int_eq(tcc_cache_list_requests(c, "cuda:sm_80", NULL, 0, 0, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, 2); /* 1 and 3; 5 keeps none */
  ck_assert_int_eq(without, 1);
  free(rows);
  ck_assert_int_eq(tcc_cache_list_requests(c, NULL, "cuda:sm_80", 0, 0, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, 3); /* 0, 2, 4 */
  for (size_t k = 0; k < n; k++) ck_assert_str_eq(rows[k].target, "cpu:x86-64-v3");
  ck_assert_int_eq(without, 0);
  free(rows);
  int64_t since = (int64_t)time(NULL) - 3600 * 2 - 60; /* entries 0, 1, 2 */
  ck_assert_int_eq(tcc_cache_list_requests(c, NULL, NULL, since, 0, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, 3);
  free(rows);
  ck_assert_int_eq(tcc_cache_list_requests(c, NULL, NULL, 0, 2, &rows, &n, &without, &err), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_mem_eq(rows[1].hash, e[1].hash, TCC_SHA256_BYTES);
  free(rows);

  for (int i = 0; i < N; i++) {
    uint8_t *got = NULL;
    size_t len = 0;
    int rc = tcc_cache_request_of(c, e[i].hash, &got, &len, &err);
    if (i == N - 1) {
      ck_assert_int_eq(rc, TCC_E_NOT_FOUND);
      continue;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(len, req_len[i]);
    ck_assert_mem_eq(got, req[i], len);
    free(got);
  }
  ck_assert_int_eq(tcc_cache_evict(c, e[0].hash, &err), 0);
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert_int_eq(tcc_cache_request_of(c, e[0].hash, &got, &len, &err), TCC_E_NOT_FOUND);

  tcc_cache_entry big;
  uint8_t *big_art = tu_random_artifact(100);
  ck_assert_int_eq(tu_random_entry(&big, big_art, 100, 1), 0);
  big.request = req[1];
  big.request_len = TCC_CACHE_REQUEST_MAX + 1; /* refused before it is read */
  ck_assert_int_eq(tcc_cache_store(c, &big, big_art, 100, &err), TCC_E_INVALID_ARGUMENT);
  big.request = NULL;
  tcc_cache_entry_clear(&big);
  free(big_art);
  tcc_cache_close(c);
  for (int i = 0; i < N; i++) {
    e[i].request = NULL; /* borrowed */
    tcc_cache_entry_clear(&e[i]);
    free(req[i]);
    free(art[i]);
  }
}
END_TEST

/* An entry imported from the remote tier was compiled elsewhere: its
 * compile time is not added to this cache's compile_seconds. */
START_TEST(test_imported_store) {
  tcc_cache *c = open_cache(0);
  stored a;
  double ms = (double)tt_rand_range(1000, 9000);
  store_random(c, &a, 700, ms);
  double before = stats_of(c).compile_seconds;
  ck_assert(before > ms / 1000.0 - 1e-9 && before < ms / 1000.0 + 1e-9);
  uint8_t *art = tu_random_artifact(800);
  tcc_cache_entry e;
  ck_assert_int_eq(tu_random_entry(&e, art, 800, ms), 0);
  e.imported = 1;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_store(c, &e, art, 800, &err), 0);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, 2);
  ck_assert_double_eq(st.compile_seconds, before);
  tcc_cache_close(c);
  tcc_cache_entry_clear(&e);
  free(art);
  stored_free(&a);
}
END_TEST

START_TEST(test_shared_blob) {
  tcc_cache *c = open_cache(0);
  size_t len = (size_t)tt_rand_range(1000, 30000);
  uint8_t *art = tu_random_artifact(len);
  tcc_cache_entry e1, e2;
  tu_random_entry(&e1, art, len, 10);
  tu_random_entry(&e2, art, len, 20);
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_store(c, &e1, art, len, &err), 0);
  ck_assert_int_eq(tcc_cache_store(c, &e2, art, len, &err), 0);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, 2);
  ck_assert_int_eq(st.bytes, (int64_t)len); /* one blob */

  ck_assert_int_eq(tcc_cache_evict(c, e1.hash, &err), 0);
  uint8_t *data = NULL;
  size_t n = 0;
  ck_assert_int_eq(tcc_cache_read_artifact(c, e2.artifact_sha256, &data, &n, &err), 0);
  ck_assert_mem_eq(data, art, len);
  free(data);
  ck_assert_int_eq(stats_of(c).bytes, (int64_t)len);

  ck_assert_int_eq(tcc_cache_evict(c, e2.hash, &err), 0);
  ck_assert_int_eq(tcc_cache_read_artifact(c, e2.artifact_sha256, &data, &n, &err),
                   TCC_E_NOT_FOUND);
  st = stats_of(c);
  ck_assert_int_eq(st.entries, 0);
  ck_assert_int_eq(st.bytes, 0);
  tcc_cache_close(c);
  tcc_cache_entry_clear(&e1);
  tcc_cache_entry_clear(&e2);
  free(art);
}
END_TEST

START_TEST(test_replace_entry) {
  tcc_cache *c = open_cache(0);
  stored a;
  store_random(c, &a, 2000, 5);
  tcc_cache_entry got;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &got, &err), 0);
  tcc_cache_entry_clear(&got);

  size_t len2 = 3333;
  uint8_t *art2 = tu_random_artifact(len2);
  tcc_cache_entry e2 = a.e; /* same hash and key, new artifact */
  tcc_sha256(art2, len2, e2.artifact_sha256);
  e2.compile_ms = 77;
  ck_assert_int_eq(tcc_cache_store(c, &e2, art2, len2, &err), 0);
  ck_assert_int_eq(tcc_cache_get(c, a.e.hash, &got, &err), 0);
  ck_assert_mem_eq(got.artifact_sha256, e2.artifact_sha256, TCC_SHA256_BYTES);
  ck_assert_int_eq(got.size, (int64_t)len2);
  ck_assert_int_eq(got.hits, 0); /* the old entry's hits went with it */
  ck_assert_double_eq(got.compile_ms, 77);
  tcc_cache_entry_clear(&got);
  uint8_t *data = NULL;
  size_t n;
  ck_assert_int_eq(tcc_cache_read_artifact(c, a.e.artifact_sha256, &data, &n, &err),
                   TCC_E_NOT_FOUND);
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_eq(st.entries, 1);
  ck_assert_int_eq(st.bytes, (int64_t)len2);
  tcc_cache_close(c);
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_get(c, a.e.hash, &got, &err), 0);
  ck_assert_int_eq(got.hits, 0);
  tcc_cache_entry_clear(&got);
  tcc_cache_close(c);
  free(art2);
  stored_free(&a);
}
END_TEST

START_TEST(test_store_rejects_bad_digest) {
  tcc_cache *c = open_cache(0);
  size_t len = 1000;
  uint8_t *art = tu_random_artifact(len);
  tcc_cache_entry e;
  tu_random_entry(&e, art, len, 1);
  e.artifact_sha256[tt_rand_range(0, 31)] ^= 1;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_store(c, &e, art, len, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "does not match"));
  ck_assert_int_eq(stats_of(c).entries, 0);
  tcc_cache_entry_clear(&e);
  free(art);
  tcc_cache_close(c);
}
END_TEST

START_TEST(test_gc) {
  enum { N = 8 };
  const size_t len = 2048;
  tcc_cache *c = open_cache(0);
  stored s[N];
  for (int i = 0; i < N; i++) store_random(c, &s[i], len, 100); /* equal value */
  /* Distinct ages: entry i last used at base + i; entry 5 corrupt. */
  int64_t base = (int64_t)time(NULL) - 100000;
  for (int i = 0; i < N; i++) set_entry_int(s[i].e.hash, "last_used", base + i);
  corrupt_blob(s[5].e.artifact_sha256, len);

  tcc_cache_gc_result r;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_gc(c, 0, &r, &err) == 0, "%s", err.msg); /* unlimited: verify only */
  ck_assert_int_eq(r.corrupt_removed, 1);
  ck_assert_int_eq(r.evicted, 0);
  ck_assert(!present(c, s[5].e.hash));
  ck_assert_int_eq(stats_of(c).entries, N - 1);

  /* Budget for 4: the 3 oldest (0, 1, 2) go — equal value, older first. */
  ck_assert_msg(tcc_cache_gc(c, 4 * (int64_t)len, &r, &err) == 0, "%s", err.msg);
  ck_assert_int_eq(r.evicted, 3);
  ck_assert_int_eq(r.freed_bytes, 3 * (int64_t)len);
  ck_assert_int_eq(r.corrupt_removed, 0);
  for (int i = 0; i < N; i++)
    if (i != 5) ck_assert_msg(present(c, s[i].e.hash) == (i >= 3), "entry %d", i);

  /* Value beats age: the oldest survivor (3) gets hits and outlives 4. */
  tcc_cache_entry got;
  for (int h = 0; h < 3; h++) {
    ck_assert_int_eq(tcc_cache_lookup(c, s[3].e.hash, s[3].e.key, s[3].e.key_len, &got, &err), 0);
    tcc_cache_entry_clear(&got);
  }
  ck_assert_int_eq(tcc_cache_flush(c, &err), 0);
  set_entry_int(s[3].e.hash, "last_used", base); /* oldest again, but hit */
  ck_assert_int_eq(tcc_cache_gc(c, 3 * (int64_t)len, &r, &err), 0);
  ck_assert_int_eq(r.evicted, 1);
  ck_assert(present(c, s[3].e.hash));
  ck_assert(!present(c, s[4].e.hash));
  tcc_cache_stats st = stats_of(c);
  ck_assert_int_le(st.bytes, 3 * (int64_t)len);
  ck_assert_int_eq(st.counters[TCC_COUNTER_evictions], 4);
  ck_assert_int_eq(st.counters[TCC_COUNTER_corrupt_blobs], 1);
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  tcc_cache_close(c);
  for (int i = 0; i < N; i++) stored_free(&s[i]);
}
END_TEST

/* gc in two halves, as the daemon runs it: the blob scan on its own
 * read-only connection (another thread in the daemon) while the cache
 * stays open, then the finish on the cache's connection. */
START_TEST(test_gc_scan_then_finish) {
  enum { N = 6 };
  const size_t len = 4096;
  tcc_cache *c = open_cache(0);
  stored s[N];
  for (int i = 0; i < N; i++) store_random(c, &s[i], len, 100);
  corrupt_blob(s[1].e.artifact_sha256, len);
  corrupt_blob(s[4].e.artifact_sha256, len);

  uint8_t (*bad)[TCC_SHA256_BYTES] = NULL;
  size_t nbad = 0;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_scan_blobs(tcc_cache_db_path(c), &bad, &nbad, &err) == 0, "%s", err.msg);
  ck_assert_int_eq(nbad, 2);
  int seen1 = 0, seen4 = 0;
  for (size_t i = 0; i < nbad; i++) {
    seen1 |= memcmp(bad[i], s[1].e.artifact_sha256, TCC_SHA256_BYTES) == 0;
    seen4 |= memcmp(bad[i], s[4].e.artifact_sha256, TCC_SHA256_BYTES) == 0;
  }
  ck_assert(seen1 && seen4);
  ck_assert(present(c, s[1].e.hash)); /* the scan removes nothing */

  /* the finish verifies again: a digest the scan named that is fine now
   * (here: a good one passed in) is kept */
  memcpy(bad[0], s[0].e.artifact_sha256, TCC_SHA256_BYTES);
  tcc_cache_gc_result r;
  ck_assert_msg(tcc_cache_gc_finish(c, 0, (const uint8_t (*)[TCC_SHA256_BYTES])bad, nbad, &r, &err) == 0, "%s",
                err.msg);
  ck_assert_int_eq(r.corrupt_removed, 1);
  ck_assert(present(c, s[0].e.hash));
  int gone = !present(c, s[1].e.hash) + !present(c, s[4].e.hash);
  ck_assert_int_eq(gone, 1);
  free(bad);

  ck_assert_int_eq(tcc_cache_scan_blobs("/nonexistent/dir/cache.db", &bad, &nbad, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dir/cache.db"));
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  tcc_cache_close(c);
  for (int i = 0; i < N; i++) stored_free(&s[i]);
}
END_TEST

START_TEST(test_list_ordering) {
  enum { N = 6 };
  tcc_cache *c = open_cache(0);
  stored s[N];
  tcc_error err = {0};
  int64_t base = (int64_t)time(NULL) - 50000;
  for (int i = 0; i < N; i++) {
    store_random(c, &s[i], (size_t)tt_rand_range(100, 9000), 1);
    set_entry_int(s[i].e.hash, "created", base + (int64_t)tt_rand_range(0, 40000));
    set_entry_int(s[i].e.hash, "last_used", base + (int64_t)tt_rand_range(0, 40000));
    int hits = (int)tt_rand_range(0, 20);
    for (int h = 0; h < hits; h++) {
      tcc_cache_entry got;
      ck_assert_int_eq(tcc_cache_lookup(c, s[i].e.hash, s[i].e.key, s[i].e.key_len, &got, &err), 0);
      tcc_cache_entry_clear(&got);
    }
  }
  for (int order = TCC_CACHE_ORDER_LAST_USED; order <= TCC_CACHE_ORDER_CREATED; order++) {
    tcc_cache_entry *v = NULL;
    size_t n = 0;
    ck_assert_msg(tcc_cache_list(c, order, 0, &v, &n, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(n, N);
    for (size_t i = 0; i < n; i++) {
      ck_assert_ptr_null(v[i].key);
      ck_assert_ptr_null(v[i].manifest);
      ck_assert(present(c, v[i].hash));
      if (i == 0) continue;
      int64_t a = 0, b = 0;
      switch (order) {
      case TCC_CACHE_ORDER_LAST_USED: a = v[i - 1].last_used, b = v[i].last_used; break;
      case TCC_CACHE_ORDER_HITS: a = v[i - 1].hits, b = v[i].hits; break;
      case TCC_CACHE_ORDER_SIZE: a = v[i - 1].size, b = v[i].size; break;
      case TCC_CACHE_ORDER_CREATED: a = v[i - 1].created, b = v[i].created; break;
      }
      ck_assert_msg(a >= b, "order %d: row %zu (%lld) after row %zu (%lld)", order, i,
                    (long long)b, i - 1, (long long)a);
    }
    /* The list agrees with get (hits include pending ones). */
    for (size_t i = 0; i < n; i++) {
      tcc_cache_entry got;
      ck_assert_int_eq(tcc_cache_get(c, v[i].hash, &got, &err), 0);
      ck_assert_int_eq(got.hits, v[i].hits);
      ck_assert_int_eq(got.size, v[i].size);
      ck_assert_mem_eq(got.artifact_sha256, v[i].artifact_sha256, TCC_SHA256_BYTES);
      tcc_cache_entry_clear(&got);
    }
    tcc_cache_entries_free(v, n);

    ck_assert_int_eq(tcc_cache_list(c, order, 2, &v, &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    tcc_cache_entries_free(v, n);
  }
  for (int i = 0; i < N; i++) stored_free(&s[i]);
  tcc_cache_close(c);
}
END_TEST

START_TEST(test_counters_persist) {
  tcc_cache *c = open_cache(0);
  int64_t want[TCC_COUNTER__COUNT] = {0};
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < TCC_COUNTER__COUNT; i++) {
      int64_t d = (int64_t)tt_rand_range(1, 100000);
      tcc_cache_count(c, (tcc_cache_counter)i, d);
      want[i] += d;
    }
    tcc_cache_stats st = stats_of(c); /* includes pending deltas */
    for (int i = 0; i < TCC_COUNTER__COUNT; i++) ck_assert_int_eq(st.counters[i], want[i]);
    if (round == 1) {
      tcc_error err = {0};
      ck_assert_int_eq(tcc_cache_flush(c, &err), 0);
    }
  }
  tcc_cache_close(c);
  c = open_cache(0);
  tcc_cache_stats st = stats_of(c);
  for (int i = 0; i < TCC_COUNTER__COUNT; i++)
    ck_assert_msg(st.counters[i] == want[i], "%s: %lld != %lld",
                  tcc_cache_counter_name((tcc_cache_counter)i), (long long)st.counters[i],
                  (long long)want[i]);
  ck_assert_str_eq(tcc_cache_counter_name(TCC_COUNTER_corrupt_blobs), "corrupt_blobs");
  tcc_cache_close(c);
}
END_TEST

/* tcc_cache_zero_counters: counters (flushed and pending) and the
 * compile-time totals restart from 0, on disk too; entries, blob bytes,
 * pending hits, failures and tuning records stay. */
START_TEST(test_zero_counters) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  stored a;
  store_random(c, &a, 2000, 40);
  tcc_cache_entry e;
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &e, &err), 0); /* a pending hit */
  tcc_cache_entry_clear(&e);
  for (int i = 0; i < TCC_COUNTER__COUNT; i++) tcc_cache_count(c, (tcc_cache_counter)i, 7);
  ck_assert_int_eq(tcc_cache_flush(c, &err), 0);
  for (int i = 0; i < TCC_COUNTER__COUNT; i++) tcc_cache_count(c, (tcc_cache_counter)i, 3); /* pending */
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &e, &err), 0);
  tcc_cache_entry_clear(&e);
  uint8_t sig[TCC_SHA256_BYTES], rec[8] = "record!";
  tt_rand_bytes(sig, sizeof sig);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu", rec, sizeof rec, &err), 0);
  ck_assert_int_eq(tcc_cache_store_failure(c, sig, rec, sizeof rec, "cpu", TCC_E_INTERNAL, "cc", &err), 0);
  tcc_cache_stats before = stats_of(c);
  ck_assert_int_eq(before.counters[TCC_COUNTER_hits], 10);
  ck_assert(before.compile_seconds > 0 && before.compile_seconds_saved > 0);

  ck_assert_int_eq(tcc_cache_zero_counters(c, &err), 0);
  for (int round = 0; round < 2; round++) { /* now, and after a reopen */
    tcc_cache_stats st = stats_of(c);
    for (int i = 0; i < TCC_COUNTER__COUNT; i++) ck_assert_int_eq(st.counters[i], 0);
    ck_assert(st.compile_seconds == 0 && st.compile_seconds_saved == 0);
    ck_assert_int_eq(st.entries, 1);
    ck_assert_int_eq(st.bytes, before.bytes);
    ck_assert_int_eq(st.failures, 1);
    ck_assert_int_eq(st.tuning_records, 1);
    ck_assert_int_eq(tcc_cache_get(c, a.e.hash, &e, &err), 0);
    ck_assert_int_eq(e.hits, 2); /* the entry's hits are not a counter */
    tcc_cache_entry_clear(&e);
    tcc_cache_close(c);
    c = open_cache(0);
  }
  tcc_cache_count(c, TCC_COUNTER_hits, 1); /* counting goes on */
  ck_assert_int_eq(stats_of(c).counters[TCC_COUNTER_hits], 1);
  ck_assert_int_eq(tcc_cache_zero_counters(NULL, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
  stored_free(&a);
}
END_TEST

/* tcc_cache_list_failures (newest first, all fields) and
 * tcc_cache_get_failure (by hash alone, whatever the key). */
START_TEST(test_list_and_get_failures) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  tcc_cache_failure *fs = NULL, f;
  size_t n = 99;
  ck_assert_int_eq(tcc_cache_list_failures(c, 0, &fs, &n, &err), 0);
  ck_assert_uint_eq(n, 0);
  free(fs);
  enum { N = 5 };
  uint8_t hash[N][TCC_SHA256_BYTES], key[N][24];
  for (int i = 0; i < N; i++) {
    tt_rand_bytes(hash[i], sizeof hash[i]);
    tt_rand_bytes(key[i], sizeof key[i]);
    char msg[64], target[32];
    snprintf(msg, sizeof msg, "failure %d\nsecond line", i);
    snprintf(target, sizeof target, "cpu:x86-64-v%d", i);
    ck_assert_int_eq(tcc_cache_store_failure(c, hash[i], key[i], (size_t)(8 + i), target, TCC_E_INTERNAL - i,
                                             msg, &err), 0);
  }
  sqlite3 *db = raw_open(); /* distinct creation times: failure i at 1000 + i */
  for (int i = 0; i < N; i++) {
    sqlite3_stmt *st;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "UPDATE failures SET created = ?1 WHERE hash = ?2", -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, 1000 + i);
    sqlite3_bind_blob(st, 2, hash[i], TCC_SHA256_BYTES, SQLITE_STATIC);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  ck_assert_int_eq(tcc_cache_list_failures(c, 0, &fs, &n, &err), 0);
  ck_assert_uint_eq(n, N);
  for (size_t j = 0; j < n; j++) {
    int i = N - 1 - (int)j; /* newest first */
    ck_assert_mem_eq(fs[j].hash, hash[i], TCC_SHA256_BYTES);
    ck_assert_int_eq(fs[j].code, TCC_E_INTERNAL - i);
    ck_assert_int_eq(fs[j].created, 1000 + i);
    ck_assert_uint_eq(fs[j].key_len, (size_t)(8 + i));
    char want[64];
    snprintf(want, sizeof want, "failure %d\nsecond line", i);
    ck_assert_str_eq(fs[j].message, want);
    snprintf(want, sizeof want, "cpu:x86-64-v%d", i);
    ck_assert_str_eq(fs[j].target, want);
  }
  free(fs);
  ck_assert_int_eq(tcc_cache_list_failures(c, 2, &fs, &n, &err), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_mem_eq(fs[1].hash, hash[N - 2], TCC_SHA256_BYTES);
  free(fs);

  ck_assert_int_eq(tcc_cache_get_failure(c, hash[2], &f, &err), 0);
  ck_assert_mem_eq(f.hash, hash[2], TCC_SHA256_BYTES);
  ck_assert_int_eq(f.code, TCC_E_INTERNAL - 2);
  ck_assert_str_eq(f.target, "cpu:x86-64-v2");
  ck_assert_uint_eq(f.key_len, 10);
  ck_assert_int_eq(tcc_cache_evict(c, hash[2], &err), 0);
  ck_assert_int_eq(tcc_cache_get_failure(c, hash[2], &f, &err), TCC_E_NOT_FOUND);
  ck_assert(strstr(err.msg, "no recorded failure for "));
  ck_assert_int_eq(tcc_cache_list_failures(NULL, 0, &fs, &n, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
}
END_TEST

/* tcc_cache_clear: every entry, blob and failure goes (tuning records
 * only when asked), counters stay, pending hits of the cleared entries
 * are not written back, and the cache works afterwards. */
START_TEST(test_clear) {
  tcc_cache *c = open_cache(0);
  tcc_error err = {0};
  stored a, b, shared;
  store_random(c, &a, 3000, 10);
  store_random(c, &b, 5000, 20);
  store_random(c, &shared, 1000, 5);
  shared.e.hash[0] ^= 1; /* a second entry on the same blob */
  ck_assert_int_eq(tcc_cache_store(c, &shared.e, shared.artifact, shared.len, &err), 0);
  tcc_cache_entry e;
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &e, &err), 0); /* pending hit */
  tcc_cache_entry_clear(&e);
  uint8_t h[TCC_SHA256_BYTES], sig[TCC_SHA256_BYTES], rec[4] = "rec";
  tt_rand_bytes(h, sizeof h);
  tt_rand_bytes(sig, sizeof sig);
  ck_assert_int_eq(tcc_cache_store_failure(c, h, rec, sizeof rec, "cpu", TCC_E_INTERNAL, "cc", &err), 0);
  ck_assert_int_eq(tcc_cache_tuning_put(c, sig, "cpu", rec, sizeof rec, &err), 0);
  ck_assert_int_eq(tcc_cache_plan_put(c, "k1", rec, sizeof rec, NULL, 0, "", NULL, &err), 0);
  ck_assert_int_eq(tcc_cache_plan_put(c, "k2", rec, sizeof rec, NULL, 0, "", NULL, &err), 0);
  tcc_cache_count(c, TCC_COUNTER_misses, 4);

  tcc_cache_clear_result r;
  ck_assert_int_eq(tcc_cache_clear(c, 0, &r, &err), 0);
  ck_assert_int_eq(r.entries, 4);
  ck_assert_int_eq(r.bytes, 9000);
  ck_assert_int_eq(r.failures, 1);
  ck_assert_int_eq(r.plans, 2);
  ck_assert_int_eq(r.tuning_records, 0);
  for (int round = 0; round < 2; round++) {
    tcc_cache_stats st = stats_of(c);
    ck_assert_int_eq(st.entries, 0);
    ck_assert_int_eq(st.bytes, 0);
    ck_assert_int_eq(st.failures, 0);
    ck_assert_int_eq(st.tuning_records, 1);
    ck_assert_int_eq(st.plans, 0);
    ck_assert_int_eq(st.plan_bytes, 0);
    ck_assert_int_eq(st.counters[TCC_COUNTER_misses], 4);
    ck_assert(!present(c, a.e.hash) && !present(c, shared.e.hash));
    tcc_cache_close(c); /* the pending hit of a is not resurrected */
    c = open_cache(0);
  }
  sqlite3 *db = raw_open();
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM blobs"), 0);
  ck_assert_int_eq(raw_int(db, "SELECT value FROM totals WHERE name = 'blob_bytes'"), 0);
  sqlite3_close(db);

  ck_assert_int_eq(tcc_cache_store(c, &b.e, b.artifact, b.len, &err), 0); /* usable again */
  ck_assert(present(c, b.e.hash));
  ck_assert_int_eq(tcc_cache_clear(c, 1, &r, &err), 0);
  ck_assert_int_eq(r.entries, 1);
  ck_assert_int_eq(r.tuning_records, 1);
  ck_assert_int_eq(stats_of(c).tuning_records, 0);
  ck_assert_int_eq(tcc_cache_clear(c, 1, &r, &err), 0); /* an empty cache: nothing to do */
  ck_assert_int_eq(r.entries + r.bytes + r.failures + r.tuning_records, 0);
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  ck_assert_int_eq(tcc_cache_clear(NULL, 0, &r, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
  stored_free(&a);
  stored_free(&b);
  stored_free(&shared);
}
END_TEST

static void expect_open_fails(const char *path, const char *needle) {
  tcc_cache_options o = {.dir = path};
  tcc_cache *c = (tcc_cache *)&o;
  tcc_error err = {0};
  int rc = tcc_cache_open(&o, &c, &err);
  ck_assert_msg(rc == TCC_E_FAILED_PRECONDITION, "open %s: %d %s", path, rc, err.msg);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err.msg, path) != NULL, "message names %s: %s", path, err.msg);
  if (needle) ck_assert_msg(strstr(err.msg, needle) != NULL, "'%s' in: %s", needle, err.msg);
}

START_TEST(test_unusable_dir) {
  char file[600], under[700];
  snprintf(file, sizeof file, "%s/plain-file", dir);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fputs("not a directory\n", f);
  fclose(f);
  snprintf(under, sizeof under, "%s/sub/cache", file); /* parent is a file */
  expect_open_fails(under, NULL);
  expect_open_fails(file, NULL);

  /* cache.db is a directory. */
  ck_assert_int_eq(mkdir(db_path, 0700), 0);
  expect_open_fails(dir, NULL);
  ck_assert_int_eq(rmdir(db_path), 0);

  if (geteuid() != 0) { /* root writes anywhere */
    char ro[600];
    snprintf(ro, sizeof ro, "%s/ro", dir);
    ck_assert_int_eq(mkdir(ro, 0500), 0);
    expect_open_fails(ro, "not writable");
    chmod(ro, 0700);
  }

  /* A missing nested directory is created, mode 0700. */
  char nested[600];
  snprintf(nested, sizeof nested, "%s/a/b/c", dir);
  tcc_cache_options o = {.dir = nested};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_cache_open(&o, &c, &err) == 0, "%s", err.msg);
  tcc_cache_close(c);
  struct stat st;
  ck_assert_int_eq(stat(nested, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
}
END_TEST

START_TEST(test_garbage_file) {
  size_t n = (size_t)tt_rand_range(100, 20000);
  uint8_t *junk = tu_random_artifact(n);
  FILE *f = fopen(db_path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(junk, 1, n, f), n);
  fclose(f);
  free(junk);
  expect_open_fails(dir, "not a SQLite database");
  /* Left as it was: the cache never overwrites a file it does not own. */
  struct stat st;
  ck_assert_int_eq(stat(db_path, &st), 0);
  ck_assert_int_eq(st.st_size, (off_t)n);
}
END_TEST

START_TEST(test_foreign_sqlite_file) {
  sqlite3 *db = raw_open();
  raw_exec(db, "CREATE TABLE notes(t TEXT); INSERT INTO notes VALUES ('mine');");
  sqlite3_close(db);
  expect_open_fails(dir, "not a tccd cache");
}
END_TEST

START_TEST(test_newer_schema) {
  tcc_cache_close(open_cache(0));
  sqlite3 *db = raw_open();
  int v = (int)tt_rand_range(7, 1000); /* the current version is 6 */
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v);
  raw_exec(db, sql);
  sqlite3_close(db);
  expect_open_fails(dir, "newer than this build");
}
END_TEST

/* A failed store (a fault injected by a trigger after the blob insert)
 * rolls back: neither the blob nor the entry remain, and an existing
 * entry being replaced is intact. */
START_TEST(test_failed_store_rolls_back) {
  tcc_cache *c = open_cache(0);
  stored a;
  store_random(c, &a, 5000, 9);
  tcc_cache_stats before = stats_of(c);

  sqlite3 *db = raw_open();
  raw_exec(db, "CREATE TRIGGER fault BEFORE INSERT ON entries"
               " BEGIN SELECT RAISE(ABORT, 'injected fault'); END;");
  size_t len = 7000;
  uint8_t *art = tu_random_artifact(len);
  tcc_cache_entry e;
  tu_random_entry(&e, art, len, 1);
  tcc_error err = {0};
  int rc = tcc_cache_store(c, &e, art, len, &err);
  ck_assert_int_lt(rc, 0);
  ck_assert_msg(strstr(err.msg, "injected fault") != NULL, "sqlite message kept: %s", err.msg);
  uint8_t *data = NULL;
  size_t n;
  ck_assert_int_eq(tcc_cache_read_artifact(c, e.artifact_sha256, &data, &n, &err),
                   TCC_E_NOT_FOUND);

  /* Replacing `a` fails too and leaves it as it was. */
  tcc_cache_entry r = a.e;
  memcpy(r.artifact_sha256, e.artifact_sha256, TCC_SHA256_BYTES);
  ck_assert_int_lt(tcc_cache_store(c, &r, art, len, &err), 0);
  tcc_cache_entry got;
  ck_assert_int_eq(tcc_cache_get(c, a.e.hash, &got, &err), 0);
  assert_entry_equal(&got, &a.e);
  tcc_cache_entry_clear(&got);
  tcc_cache_stats after = stats_of(c);
  ck_assert_int_eq(after.entries, before.entries);
  ck_assert_int_eq(after.bytes, before.bytes);

  raw_exec(db, "DROP TRIGGER fault");
  sqlite3_close(db);
  ck_assert_msg(tcc_cache_store(c, &e, art, len, &err) == 0, "%s", err.msg);
  ck_assert(present(c, e.hash));
  ck_assert_int_eq(tcc_cache_integrity_check(c, &err), 0);
  tcc_cache_entry_clear(&e);
  free(art);
  stored_free(&a);
  tcc_cache_close(c);
}
END_TEST

/* Another process holding the write lock: a store waits busy_timeout_ms,
 * then fails UNAVAILABLE with nothing written; hits stay pending. */
START_TEST(test_busy_writer) {
  tcc_cache_options o = {.dir = dir, .busy_timeout_ms = 50};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_cache_open(&o, &c, &err), 0);
  stored a;
  store_random(c, &a, 1000, 2);
  tcc_cache_entry got;
  ck_assert_int_eq(tcc_cache_lookup(c, a.e.hash, a.e.key, a.e.key_len, &got, &err), 0);
  tcc_cache_entry_clear(&got);
  tcc_cache_count(c, TCC_COUNTER_compiles, 5);

  sqlite3 *db = raw_open();
  raw_exec(db, "BEGIN IMMEDIATE");
  stored b;
  b.len = 1000;
  b.artifact = tu_random_artifact(b.len);
  tu_random_entry(&b.e, b.artifact, b.len, 1);
  ck_assert_int_eq(tcc_cache_store(c, &b.e, b.artifact, b.len, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "locked"));
  ck_assert_int_eq(tcc_cache_flush(c, &err), TCC_E_UNAVAILABLE);
  raw_exec(db, "ROLLBACK");
  sqlite3_close(db);

  ck_assert(!present(c, b.e.hash));
  ck_assert_int_eq(tcc_cache_flush(c, &err), 0); /* pending survived the failure */
  tcc_cache_close(c);
  c = open_cache(0);
  ck_assert_int_eq(tcc_cache_get(c, a.e.hash, &got, &err), 0);
  ck_assert_int_eq(got.hits, 1);
  tcc_cache_entry_clear(&got);
  ck_assert_int_eq(stats_of(c).counters[TCC_COUNTER_compiles], 5);
  tcc_cache_close(c);
  stored_free(&a);
  stored_free(&b);
}
END_TEST

START_TEST(test_bad_arguments) {
  tcc_error err = {0};
  tcc_cache *c = NULL;
  tcc_cache_options o = {.dir = NULL};
  ck_assert_int_eq(tcc_cache_open(&o, &c, &err), TCC_E_INVALID_ARGUMENT);
  o.dir = dir;
  o.max_bytes = -1;
  ck_assert_int_eq(tcc_cache_open(&o, &c, &err), TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(NULL);
  c = open_cache(0);
  tcc_cache_entry e;
  ck_assert_int_eq(tcc_cache_store(c, NULL, NULL, 0, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_cache_get(c, NULL, &e, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_cache_list(c, (tcc_cache_order)99, 0, NULL, NULL, &err),
                   TCC_E_INVALID_ARGUMENT);
  tcc_cache_close(c);
}
END_TEST

static Suite *cache_suite(void) {
  Suite *s = suite_create("cache");
  TCase *t = tcase_create("cache");
  tcase_add_checked_fixture(t, dir_setup, dir_teardown);
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_store_lookup_reopen);
  tcase_add_test(t, test_key_mismatch_is_miss);
  tcase_add_test(t, test_read_artifact_roundtrip);
  tcase_add_test(t, test_corrupt_blob);
  tcase_add_test(t, test_eviction_by_budget);
  tcase_add_test(t, test_evict_by_hash);
  tcase_add_test(t, test_shared_blob);
  tcase_add_test(t, test_negative_cache);
  tcase_add_test(t, test_migrate_from_v1);
  tcase_add_test(t, test_migrate_from_v4);
  tcase_add_test(t, test_same_graph);
  tcase_add_test(t, test_migrate_from_v2);
  tcase_add_test(t, test_migrate_from_v3);
  tcase_add_test(t, test_tuning_records);
  tcase_add_test(t, test_imported_store);
  tcase_add_test(t, test_replace_entry);
  tcase_add_test(t, test_store_rejects_bad_digest);
  tcase_add_test(t, test_gc);
  tcase_add_test(t, test_gc_scan_then_finish);
  tcase_add_test(t, test_list_ordering);
  tcase_add_test(t, test_counters_persist);
  tcase_add_test(t, test_zero_counters);
  tcase_add_test(t, test_list_and_get_failures);
  tcase_add_test(t, test_clear);
  tcase_add_test(t, test_unusable_dir);
  tcase_add_test(t, test_garbage_file);
  tcase_add_test(t, test_foreign_sqlite_file);
  tcase_add_test(t, test_newer_schema);
  tcase_add_test(t, test_migrate_from_v5);
  tcase_add_test(t, test_migrate_from_v6);
  tcase_add_test(t, test_plans);
  tcase_add_test(t, test_stored_requests);
  tcase_add_test(t, test_failed_store_rolls_back);
  tcase_add_test(t, test_busy_writer);
  tcase_add_test(t, test_bad_arguments);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return tt_run_suite(cache_suite(), 0);
}
