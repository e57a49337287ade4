/*
 * cache.h — the persistent kernel cache (libtcccache), one SQLite file.
 *
 * Entries are keyed by guard hash and carry the canonical key bytes, which
 * are compared on every lookup so a hash collision can never serve the
 * wrong kernel. Artifacts are content-addressed blobs (SHA-256), verified
 * on every read: a corrupt blob is removed with the entries that use it
 * and reported as TCC_E_DATA_LOSS, never returned.
 *
 * Not thread-safe: one tcc_cache belongs to one thread (the daemon's loop
 * thread). Counters and hit bookkeeping are kept in memory and written by
 * tcc_cache_flush (the daemon's housekeeping timer calls it every second,
 * and tcc_cache_close calls it last).
 */
#ifndef TCC_CACHE_H
#define TCC_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tcc_digest.h"
#include "tcc_status.h"

typedef struct tcc_cache tcc_cache;

typedef struct tcc_cache_options {
  const char *dir;      /* created if missing; the database is dir/cache.db */
  int64_t max_bytes;    /* artifact byte budget; 0 = unlimited */
  int busy_timeout_ms;  /* wait for another writer; 0 = 5000 ms */
  int synchronous_full; /* 1: fsync the WAL at every commit, so stored
                         * entries survive power loss too (a store then
                         * costs one fsync); 0: synchronous=NORMAL, which
                         * survives any process crash (see cache.c) */
  /* The graph digest of a canonical key (compiler.h's
   * tcc_key_graph_digest; 0, or -1 for a key it cannot read), stored with
   * every entry and failure so tcc_cache_same_graph finds the keys of one
   * graph. NULL: none recorded (the cache never reads keys itself). */
  int (*graph_digest)(const uint8_t *key, size_t len, uint8_t out[TCC_SHA256_BYTES]);
} tcc_cache_options;

#define TCC_CACHE_SIGNATURE_MAX 64         /* an Ed25519 signature */
#define TCC_CACHE_KEY_ID_MAX 17            /* 16 hex digits + NUL */

/* One entry's metadata (no artifact bytes). Pointer fields are owned by
 * the entry: release with tcc_cache_entry_clear. */
typedef struct tcc_cache_entry {
  uint8_t hash[TCC_SHA256_BYTES];          /* guard hash */
  uint8_t *key;                            /* canonical key bytes */
  size_t key_len;
  char target[64];                         /* "cpu:x86-64-v2" */
  int kind;                                /* Tcc__V1__ArtifactKind */
  uint8_t *manifest;                       /* encoded tcc.v1.Manifest */
  size_t manifest_len;
  uint8_t *request_meta;                   /* encoded Target+Options, for `show` */
  size_t request_meta_len;
  uint8_t artifact_sha256[TCC_SHA256_BYTES];
  int64_t size;                            /* artifact bytes */
  int kernels;
  double compile_ms;
  int64_t created;                         /* unix seconds */
  int64_t last_used;
  int64_t hits;
  /* v3: the daemon's Ed25519 signature over (hash, artifact_sha256,
   * SHA-256(manifest)) (tcc_sign.h) and the signing key's id; length 0
   * and "" for an unsigned entry. */
  uint8_t signature[TCC_CACHE_SIGNATURE_MAX];
  size_t signature_len;
  char key_id[TCC_CACHE_KEY_ID_MAX];
  /* Store only: the entry was compiled elsewhere (the remote tier), so
   * its compile_ms is not added to the compile_seconds total. */
  int imported;
  /* Store only (v6): the encoded CompileRequest the entry was compiled
   * from, kept for warm runs (tcc_cache_list_requests); NULL: none. At
   * most TCC_CACHE_REQUEST_MAX bytes. Lookups never read it back. */
  const uint8_t *request;
  size_t request_len;
} tcc_cache_entry;

/* Named persistent counters (X(name)). */
#define TCC_CACHE_COUNTERS(X) \
  X(hits) X(misses) X(coalesced) X(remote_hits) X(negative_hits) \
  X(compiles) X(compile_failures) X(evictions) X(corrupt_blobs)  \
  X(requests) X(invalid_requests)                                \
  X(remote_errors) X(remote_stores) X(remote_lock_waits)         \
  X(remote_rejected) X(auth_failures) X(rejected_memory)         \
  X(corrupt_entries)                                             \
  X(autotune_runs) X(autotune_candidates) X(autotune_crashed)    \
  X(autotune_timeouts) X(autotune_wrong) X(autotune_record_hits) \
  X(autotune_untuned) X(autotune_ms) X(autotune_remote_record_hits) \
  X(object_hits) X(object_misses)                                \
  X(plan_hits) X(plan_misses) X(plans_stored)

typedef enum tcc_cache_counter {
#define TCC_CACHE_COUNTER_ENUM(name) TCC_COUNTER_##name,
  TCC_CACHE_COUNTERS(TCC_CACHE_COUNTER_ENUM)
#undef TCC_CACHE_COUNTER_ENUM
  TCC_COUNTER__COUNT
} tcc_cache_counter;

typedef struct tcc_cache_stats {
  int64_t entries;
  int64_t bytes;                 /* artifact bytes stored */
  int64_t max_bytes;
  int64_t counters[TCC_COUNTER__COUNT];
  double compile_seconds;        /* total spent compiling, every store counted */
  int64_t failures;              /* recorded compile failures (negative cache) */
  double compile_seconds_saved;  /* sum over hits of the entry's compile time */
  int64_t tuning_records;        /* rows of the tuning table (v4) */
  int64_t plans;                 /* rows of the plans table (v7) */
  int64_t plan_bytes;            /* their encoded plan bytes */
} tcc_cache_stats;

typedef struct tcc_cache_gc_result {
  int64_t evicted;
  int64_t freed_bytes;
  int64_t corrupt_removed;
} tcc_cache_gc_result;

/* Opens (creating and migrating) dir/cache.db in WAL mode.
 * Returns 0, or TCC_E_FAILED_PRECONDITION when the directory is unusable
 * or the file is not a tccd cache / is newer than this build, with a
 * message naming the path. TCC_E_INVALID_ARGUMENT for a missing dir or a
 * negative max_bytes. */
int tcc_cache_open(const tcc_cache_options *opts, tcc_cache **out, tcc_error *err);

/* Flushes counters and closes. NULL is a no-op. */
void tcc_cache_close(tcc_cache *c);

/* Looks up a guard hash. On a hit whose stored key equals `key`, fills
 * *out, records the hit (in memory) and returns 0. Returns
 * TCC_E_NOT_FOUND on a miss, including a stored entry whose key differs
 * (a collision: the message says "guard hash collision").
 * *out is zeroed first, so tcc_cache_entry_clear is always safe; on a hit
 * out->hits and out->last_used already include this hit. The named
 * counters (hits, misses) are NOT touched: the daemon counts requests
 * (a local miss may still be a remote hit). */
int tcc_cache_lookup(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                     const uint8_t *key, size_t key_len,
                     tcc_cache_entry *out, tcc_error *err);

/* Fetches an entry (with key, manifest and request_meta) by guard hash
 * without counting a hit. Returns 0 or TCC_E_NOT_FOUND (or another code
 * on a database error); *out is zeroed first. */
int tcc_cache_get(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                  tcc_cache_entry *out, tcc_error *err);

/* Stores an entry and its artifact in one transaction (replacing an entry
 * with the same hash), then evicts down to the byte budget. `e->hits`,
 * `created` and `last_used` are set by the cache, and `e->size` is taken
 * from len. e->artifact_sha256 must be the SHA-256 of the artifact
 * (else TCC_E_INVALID_ARGUMENT). An artifact larger than the whole budget
 * is refused with TCC_E_RESOURCE_EXHAUSTED (nothing is evicted for it);
 * otherwise the new entry itself is never evicted by its own store.
 * Evictions count in the `evictions` counter. Returns 0, or a TCC_E_*
 * code with the cache unchanged (TCC_E_UNAVAILABLE when another process
 * held the write lock for longer than busy_timeout_ms). */
int tcc_cache_store(tcc_cache *c, const tcc_cache_entry *e,
                    const uint8_t *artifact, size_t len, tcc_error *err);

/* Reads an artifact by digest and verifies it. A blob whose digest does
 * not match is deleted with the entries that reference it, counted in
 * corrupt_blobs, and reported as TCC_E_DATA_LOSS. Missing: TCC_E_NOT_FOUND.
 * On success *data is malloc'd; the caller frees it. */
int tcc_cache_read_artifact(tcc_cache *c, const uint8_t sha256[TCC_SHA256_BYTES],
                            uint8_t **data, size_t *len, tcc_error *err);

/* Removes one entry (and its blob when no other entry uses it). Not
 * counted in `evictions` (that counts budget evictions).
 * Returns 0 or TCC_E_NOT_FOUND. */
int tcc_cache_evict(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_error *err);

/* The reserve: dir/reserve, this many bytes kept for deletions on a full
 * disk (cache.c). */
#define TCC_CACHE_RESERVE_BYTES (8 << 20)

/* Verifies every blob (removing corrupt ones), removes blobs no entry
 * uses, and evicts down to max_bytes (0 = the open budget; both 0 = no
 * eviction), least valuable first: the lowest
 * compile_ms * (hits + 1) / size, older last use breaking ties. Then
 * returns freed pages to the file system. Fills *out (may be NULL).
 * Returns 0 or a TCC_E_* code. */
int tcc_cache_gc(tcc_cache *c, int64_t max_bytes, tcc_cache_gc_result *out, tcc_error *err);

/* The same in two halves, so that the slow one runs off the thread that
 * owns c (the daemon's loop):
 *   tcc_cache_scan_blobs: on any thread, while c is in use: opens its own
 *     read-only connection to db_path (tcc_cache_db_path), reads every
 *     blob and fills *corrupt (malloc'd, *n digests) with those whose
 *     bytes no longer match their digest or size. Returns 0 or a TCC_E_*
 *     code.
 *   tcc_cache_gc_finish: on c's thread: flushes, verifies again and
 *     removes the blobs the scan named (with the entries using them),
 *     then deletes unused blobs and evicts as tcc_cache_gc. */
const char *tcc_cache_db_path(const tcc_cache *c);
int tcc_cache_scan_blobs(const char *db_path, uint8_t (**corrupt)[TCC_SHA256_BYTES], size_t *n, tcc_error *err);
int tcc_cache_gc_finish(tcc_cache *c, int64_t max_bytes, const uint8_t (*corrupt)[TCC_SHA256_BYTES], size_t n,
                        tcc_cache_gc_result *out, tcc_error *err);

typedef enum tcc_cache_order {
  TCC_CACHE_ORDER_LAST_USED, TCC_CACHE_ORDER_HITS,
  TCC_CACHE_ORDER_SIZE, TCC_CACHE_ORDER_CREATED
} tcc_cache_order;

/* Lists up to limit entries (limit <= 0: all) (metadata, key/manifest
 * left NULL) in descending order of the chosen column, ties by hash.
 * Writes pending hit bookkeeping first, so hits/last_used are current
 * (if that write fails, e.g. another writer holds the lock, the list is
 * still returned, without the pending hits).
 * *out is malloc'd; free with tcc_cache_entries_free. Returns 0 or a
 * TCC_E_* code. */
int tcc_cache_list(tcc_cache *c, tcc_cache_order order, int limit,
                   tcc_cache_entry **out, size_t *n, tcc_error *err);
void tcc_cache_entries_free(tcc_cache_entry *entries, size_t n);

/* Frees an entry's key/manifest/request_meta and zeroes it. NULL is ok. */
void tcc_cache_entry_clear(tcc_cache_entry *e);

/* Adds delta to a persistent counter (in memory until the next flush). */
void tcc_cache_count(tcc_cache *c, tcc_cache_counter counter, int64_t delta);

/* Fills *out: entries, blob bytes (shared blobs counted once), budget,
 * counters and compile-seconds saved including pending in-memory deltas,
 * and compile_seconds = the running total of compile_ms of every store.
 * Returns 0 or a TCC_E_* code. */
int tcc_cache_stats_get(tcc_cache *c, tcc_cache_stats *out, tcc_error *err);

/* The negative cache: a compile failure that would repeat (the same graph,
 * compiler and target fail the same way), answered again without
 * recompiling. tcc_cache_evict removes it; a later successful store of the
 * same hash replaces it. */
typedef struct tcc_cache_failure {
  int code;                              /* TCC_E_* */
  char message[TCC_ERROR_MSG_MAX];
  int64_t created;                       /* unix seconds */
  /* Filled by tcc_cache_list_failures and tcc_cache_get_failure: */
  uint8_t hash[TCC_SHA256_BYTES];        /* guard hash */
  char target[64];                       /* as tcc_cache_entry.target */
  size_t key_len;                        /* bytes of its canonical key */
} tcc_cache_failure;

/* Records a failure (code < 0) for hash/key. Returns 0 or a TCC_E_* code. */
int tcc_cache_store_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                            const uint8_t *key, size_t key_len, const char *target,
                            int code, const char *message, tcc_error *err);

/* Returns 0 and fills *out when a failure is recorded for hash with this
 * exact key; TCC_E_NOT_FOUND otherwise. */
int tcc_cache_lookup_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                             const uint8_t *key, size_t key_len, tcc_cache_failure *out,
                             tcc_error *err);

/* Lists up to limit recorded failures (limit <= 0: all), newest first,
 * ties by hash (tcc_cache_stats.failures counts them all). *out is
 * malloc'd (free it). Returns 0 or a TCC_E_* code. */
int tcc_cache_list_failures(tcc_cache *c, int limit, tcc_cache_failure **out, size_t *n,
                            tcc_error *err);

/* The failure recorded for hash, whatever its key (for `tcctl show`, not
 * for answering requests: tcc_cache_lookup_failure compares keys).
 * Returns 0 or TCC_E_NOT_FOUND (or another code on a database error). */
int tcc_cache_get_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                          tcc_cache_failure *out, tcc_error *err);

/* Tuning records (schema v4): the best config of one kernel signature
 * for one target, as serialized record bytes (compiler.h's
 * tcc_tune_record_encode; the cache never looks inside, so another tier
 * can share them as they are). tcc_cache_tuning_get fills *record
 * (malloc'd; caller frees) and returns 0, or TCC_E_NOT_FOUND.
 * tcc_cache_tuning_put stores or replaces one (its own transaction);
 * returns 0 or a TCC_E_* code. */
int tcc_cache_tuning_get(tcc_cache *c, const uint8_t signature[TCC_SHA256_BYTES],
                         const char *target, uint8_t **record, size_t *len, tcc_error *err);
int tcc_cache_tuning_put(tcc_cache *c, const uint8_t signature[TCC_SHA256_BYTES],
                         const char *target, const uint8_t *record, size_t len, tcc_error *err);

/* The keys one graph was stored under (tcctl explain): entries and
 * recorded failures whose graph digest is `graph`, newest first, at most
 * limit (<= 0: all). Rows stored before schema v5 get their digest first
 * (one pass). *out is malloc'd: free with tcc_cache_keyed_free. Returns 0
 * or a TCC_E_* code. */
typedef struct tcc_cache_keyed {
  uint8_t hash[TCC_SHA256_BYTES];
  uint8_t *key;            /* canonical key bytes */
  size_t key_len;
  int failure;             /* 1: a recorded failure; 0: an entry */
  char target[64];
  int64_t created;         /* unix seconds */
} tcc_cache_keyed;
int tcc_cache_same_graph(tcc_cache *c, const uint8_t graph[TCC_SHA256_BYTES], int limit,
                         tcc_cache_keyed **out, size_t *n, tcc_error *err);
void tcc_cache_keyed_free(tcc_cache_keyed *k, size_t n);

/* Stored requests (v6), for warm runs that compile cached graphs for
 * another target. tcc_cache_list_requests lists the entries that keep
 * their request, newest first, at most limit (<= 0: all): only target's
 * (NULL: any), never not_target's (NULL: no such filter), created at or
 * after since (unix seconds); *without counts the entries the same
 * filter matches that keep none. *out is malloc'd (free()).
 * tcc_cache_request_of reads one back (malloc'd), or TCC_E_NOT_FOUND
 * (no entry, or it keeps no request). Both return 0 or a TCC_E_* code. */
#define TCC_CACHE_REQUEST_MAX (4u << 20)
typedef struct tcc_cache_stored_request {
  uint8_t hash[TCC_SHA256_BYTES];
  char target[64];
  int64_t created;
} tcc_cache_stored_request;
int tcc_cache_list_requests(tcc_cache *c, const char *target, const char *not_target, int64_t since, int limit,
                            tcc_cache_stored_request **out, size_t *n, int64_t *without, tcc_error *err);
int tcc_cache_request_of(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], uint8_t **request, size_t *len,
                         tcc_error *err);

/* The key stored for hash (an entry's, else a recorded failure's; *failure
 * says which) as a malloc'd copy. Returns 0, TCC_E_NOT_FOUND or a
 * TCC_E_* code. */
int tcc_cache_key_of(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], uint8_t **key, size_t *len,
                     int *failure, tcc_error *err);

/* Restarts the counters from 0: the counters table, the pending deltas,
 * and the totals compile_seconds and compile_seconds_saved, in one
 * transaction (entries, blob bytes, pending hits of entries, failures and
 * tuning records stay). Returns 0 or a TCC_E_* code, nothing changed. */
int tcc_cache_zero_counters(tcc_cache *c, tcc_error *err);

typedef struct tcc_cache_clear_result {
  int64_t entries;          /* entries removed */
  int64_t bytes;            /* blob bytes freed */
  int64_t failures;         /* recorded failures removed */
  int64_t tuning_records;   /* tuning records removed */
  int64_t plans;            /* plans removed */
} tcc_cache_clear_result;

/* Removes every entry, blob, recorded failure and plan (and every tuning record
 * when tuning is set) in one transaction, then gives the pages back to the
 * file system, as gc does (with the reserve's space on a full disk).
 * Counters are kept; removals are not counted as evictions. Fills *out
 * (may be NULL). Returns 0 or a TCC_E_* code, the cache unchanged. */
int tcc_cache_clear(tcc_cache *c, int tuning, tcc_cache_clear_result *out, tcc_error *err);

/* Plans (v7): encoded tcc.v1.Plan messages by key, written once by the
 * daemon (the first writer wins: a put never replaces) with their
 * signature; the cache never looks inside. tcc_cache_plan_put stores one
 * (key 1-TCC_CACHE_PLAN_KEY_MAX bytes, plan non-empty) unless the key is
 * taken; *inserted (may be NULL) says which. tcc_cache_plan_get fills
 * *out (zeroed first; free with tcc_cache_plan_free), counting a hit and
 * last_used, or returns TCC_E_NOT_FOUND; a plan whose bytes no longer
 * match the digest stored with it is deleted and reported as
 * TCC_E_DATA_LOSS. tcc_cache_plan_delete removes one (TCC_E_NOT_FOUND
 * when absent). Each returns 0 or a TCC_E_* code. Plans are outside the
 * byte budget (eviction and gc leave them); tcc_cache_clear removes them. */
#define TCC_CACHE_PLAN_KEY_MAX 200
typedef struct tcc_cache_plan {
  uint8_t *plan;                           /* encoded tcc.v1.Plan, malloc'd */
  size_t plan_len;
  uint8_t plan_sha256[TCC_SHA256_BYTES];
  uint8_t signature[TCC_CACHE_SIGNATURE_MAX];
  size_t signature_len;                    /* 0: unsigned */
  char key_id[TCC_CACHE_KEY_ID_MAX];
  int64_t created, last_used, hits;        /* unix seconds; gets served */
} tcc_cache_plan;
int tcc_cache_plan_put(tcc_cache *c, const char *key, const uint8_t *plan, size_t len, const uint8_t *sig,
                       size_t sig_len, const char *key_id, int *inserted, tcc_error *err);
int tcc_cache_plan_get(tcc_cache *c, const char *key, tcc_cache_plan *out, tcc_error *err);
int tcc_cache_plan_delete(tcc_cache *c, const char *key, tcc_error *err);
void tcc_cache_plan_free(tcc_cache_plan *p);

/* Writes pending counters and hit bookkeeping in one transaction.
 * Returns 0 (also when nothing was pending) or a TCC_E_* code; on
 * failure the pending deltas are kept for the next try. */
int tcc_cache_flush(tcc_cache *c, tcc_error *err);

/* PRAGMA integrity_check and foreign_key_check; 0 when both are clean,
 * else TCC_E_DATA_LOSS + SQLite's report. (Blob digests are checked by
 * tcc_cache_gc, not here.) */
int tcc_cache_integrity_check(tcc_cache *c, tcc_error *err);

/* The counter's name as stored ("evictions"); "unknown" when out of range. */
const char *tcc_cache_counter_name(tcc_cache_counter counter);

#endif
