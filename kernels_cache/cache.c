/*
 * cache.c — the persistent kernel cache (see cache.h): one SQLite file,
 * dir/cache.db, owned by one thread.
 *
 * DESIGN
 *
 *   Reads are cheap and frequent (the daemon answers >10k hits/s from its
 *   loop thread), writes are rare (one per compile). So:
 *   - every statement is prepared once, at open (the STATEMENTS table);
 *   - a lookup is one indexed SELECT and never writes: the hit is recorded
 *     in memory (struct cache_pending) and written by tcc_cache_flush in
 *     one transaction, with the named counters;
 *   - a store is one write transaction: the blob (insert-or-ignore: blobs
 *     are content-addressed and shared), the entry, and eviction down to
 *     the byte budget when the new blob pushes the total over it;
 *   - the total of blob bytes is kept in the file by triggers (totals row
 *     'blob_bytes'), so the budget check is one row read, not a scan.
 *
 * DURABILITY
 *
 *   journal_mode=WAL, synchronous=NORMAL by default (see
 *   tcc_cache_options.synchronous_full). In WAL mode a commit is a write()
 *   of the frames to cache.db-wal; NORMAL skips the fsync on commit and
 *   syncs only at checkpoints. A process crash (kill -9, OOM, segfault)
 *   loses nothing that was committed: the frames are in the kernel's page
 *   cache and the next open replays the WAL (tests/cache/test_crash.c
 *   checks exactly this over 25 rounds of SIGKILL). An OS crash or power
 *   loss may lose the last commits but never corrupts the file: WAL frames
 *   carry checksums and a torn tail is discarded. For a cache that is the
 *   right trade: a lost entry costs one recompile, while an fsync per
 *   store runs on the daemon's loop thread, where a busy disk can stall
 *   every hit behind it for tens of milliseconds. Measured with
 *   tests/cache/bench_cache (1000 entries of 20 KB, budget full, so every
 *   store also evicts one; ext4 on a VM disk): store median 0.19-0.23 ms
 *   with NORMAL, 0.39 ms with FULL (p99 ~5 ms either way: the WAL
 *   checkpoint every ~1000 pages, which fsyncs). synchronous_full=1 turns
 *   on FULL (fsync of the WAL at every commit) for operators who want
 *   acknowledged entries to survive power loss too.
 *
 *   Other connection settings: foreign_keys=ON (the blob cascade),
 *   busy_timeout (default 5 s; a store that cannot get the write lock in
 *   time fails with TCC_E_UNAVAILABLE), cache_size 16 MiB (the pages a
 *   flush rewrites stay in memory: 1000 distinct hits flush in ~6 ms
 *   instead of ~15 ms with the default 2 MiB), secure_delete=FAST
 *   (Debian builds SQLite with secure_delete on, which writes zeros over
 *   every freed page: deleting a 1 MiB blob wrote 1 MiB of WAL, so a full
 *   disk could not delete anything; artifacts are not secrets).
 *
 * ON-DISK FORMAT (schema version 7; PRAGMA user_version = 7,
 * PRAGMA application_id = 0x54434344 "TCCD", auto_vacuum = INCREMENTAL)
 *
 *   Columns are listed in storage order: the small fixed-size columns come
 *   before the large blobs, so scans that only need sizes, hit counts and
 *   times (eviction, list, stats) never read overflow pages.
 *
 *   Table entries — one row per guard hash
 *   | column          | type    | meaning                                   |
 *   |-----------------|---------|-------------------------------------------|
 *   | hash            | BLOB PK | guard hash, 32 bytes                      |
 *   | target          | TEXT    | "cpu:x86-64-v2", "cuda:sm_90"             |
 *   | kind            | INTEGER | tcc.v1.ArtifactKind                       |
 *   | artifact_sha256 | BLOB FK | -> blobs.sha256, ON DELETE CASCADE        |
 *   | size            | INTEGER | artifact bytes                            |
 *   | kernels         | INTEGER | number of generated kernels               |
 *   | compile_ms      | REAL    | time spent compiling (incl. autotune)     |
 *   | created         | INTEGER | unix seconds                              |
 *   | last_used       | INTEGER | unix seconds of the last hit (or store)   |
 *   | hits            | INTEGER | hits served                               |
 *   | key             | BLOB    | canonical key bytes, compared on lookup   |
 *   | manifest        | BLOB    | encoded tcc.v1.Manifest                   |
 *   | request_meta    | BLOB    | encoded Target+Options (for `show`)       |
 *   | signature       | BLOB    | (v3) Ed25519 signature, x'' = unsigned    |
 *   | key_id          | TEXT    | (v3) signing key id, '' = unsigned        |
 *   Index entries_by_artifact(artifact_sha256): the FK child index.
 *   Index entries_by_value((compile_ms * (hits + 1)) / max(size, 1),
 *   last_used): the eviction order (lowest value first, older last use,
 *   then insertion order), so picking victims is a short index walk, not
 *   a sort of the whole table.
 *
 *   Table blobs — artifacts, content-addressed, shared by entries
 *   | column | type    | meaning                                          |
 *   |--------|---------|--------------------------------------------------|
 *   | sha256 | BLOB PK | SHA-256 of data, 32 bytes                        |
 *   | size   | INTEGER | length(data) when written                        |
 *   | data   | BLOB    | the artifact (.so or cubin)                      |
 *   Triggers blobs_add/blobs_del/blobs_resize keep totals.blob_bytes equal
 *   to SUM(blobs.size).
 *
 *   Table counters — the named counters of cache.h (TCC_CACHE_COUNTERS)
 *   | name  | TEXT PK | counter name ("hits", "evictions", ...)          |
 *   | value | INTEGER | running total since the cache was created, or    |
 *   |       |         | zeroed (tcc_cache_zero_counters: rows deleted)   |
 *
 *   Table totals — running sums that are not counters (value untyped)
 *   | name                  | value                                       |
 *   |-----------------------|---------------------------------------------|
 *   | blob_bytes            | INTEGER, SUM(blobs.size), trigger-kept      |
 *   | compile_seconds_saved | REAL, sum over hits of the entry compile_ms |
 *   | compile_seconds       | REAL, sum of compile_ms of every store (v2) |
 *   tcc_cache_zero_counters sets compile_seconds_saved and compile_seconds
 *   to 0 with the counters; blob_bytes is a gauge and stays.
 *
 *   Table failures (v2) — the negative cache: deterministic compile
 *   failures, answered again without recompiling. The guard key includes
 *   the compiler identity, so a new compiler never sees an old failure.
 *   | column  | type    | meaning                                          |
 *   |---------|---------|--------------------------------------------------|
 *   | hash    | BLOB PK | guard hash                                       |
 *   | code    | INTEGER | TCC_E_* code of the failure                      |
 *   | created | INTEGER | unix seconds                                     |
 *   | target  | TEXT    | as entries.target                                |
 *   | message | TEXT    | the error message returned to clients            |
 *   | key     | BLOB    | canonical key bytes, compared on lookup          |
 *
 *   Table tuning (v4) — autotuning records: the best config of one kernel
 *   for one target (compiler/tune.c encodes and decodes the record; the
 *   cache stores its bytes as they are, so another tier can copy them)
 *   | column    | type    | meaning                                        |
 *   |-----------|---------|------------------------------------------------|
 *   | signature | BLOB    | kernel signature (SHA-256), 32 bytes           |
 *   | target    | TEXT    | as entries.target                              |
 *   | created   | INTEGER | unix seconds                                   |
 *   | record    | BLOB    | serialized record ("tccd-tune/1 par=...")      |
 *   Primary key (signature, target).
 *
 *   Column graph (v5), on entries and failures — the graph digest of the
 *   key (compiler.h, tcc_key_graph_digest: the key without sizes, dtypes,
 *   scalars, target, compiler or mode), written by the graph_digest hook
 *   of tcc_cache_options at every store; NULL in rows stored before v5 or
 *   without the hook, filled in by the first tcc_cache_same_graph. Indexed,
 *   so the keys that one graph recompiled under are found without a scan.
 *
 *   Column request (v6), on entries — the encoded tcc.v1.CompileRequest
 *   the entry was compiled from, as it came (graph, target, options and
 *   client label), so a warm run (`tcctl warm`) can compile it again for
 *   another target; NULL in rows stored before v6, imported from the
 *   remote tier, or whose request was over TCC_CACHE_REQUEST_MAX. Not read
 *   by lookups.
 *
 *   Table plans (v7) — plans (tcc.v1.Plan, PutPlan/GetPlan): what a
 *   process needs to skip AOTAutograd's trace and the partitioning of one
 *   graph, stored by the daemon only (docs/design.md "Plans"). A key is
 *   written once (first writer wins: never replaced); the byte budget,
 *   eviction and gc leave plans alone; clear removes them.
 *   | column      | type    | meaning                                      |
 *   |-------------|---------|----------------------------------------------|
 *   | key         | TEXT PK | the plan's key, 1-200 characters             |
 *   | plan_sha256 | BLOB    | SHA-256(plan), checked on every read         |
 *   | signature   | BLOB    | Ed25519 (tcc_sign.h, plans), x'' = unsigned  |
 *   | key_id      | TEXT    | signing key id, '' = unsigned                |
 *   | created     | INTEGER | unix seconds                                 |
 *   | last_used   | INTEGER | unix seconds of the last get (or the put)    |
 *   | hits        | INTEGER | gets served                                  |
 *   | plan        | BLOB    | the encoded tcc.v1.Plan (last: large)        |
 *
 *   Invariants: every entries.artifact_sha256 has a blobs row (foreign key,
 *   foreign_keys=ON); a blob with no entry is removed in the transaction
 *   that drops its last entry (and by gc); sha256(data) == sha256 unless
 *   the disk lied, which tcc_cache_read_artifact and tcc_cache_gc detect.
 *
 * SCHEMA VERSIONS
 *
 *   MIGRATIONS lists SQL steps; step N takes the file from version N-1 to
 *   N and runs in its own BEGIN IMMEDIATE transaction together with
 *   PRAGMA user_version = N, so a crash mid-migration leaves the old
 *   version intact. Opening a file whose user_version is newer than
 *   TCC_CACHE_SCHEMA_VERSION fails with TCC_E_FAILED_PRECONDITION. To add
 *   version 2: append {2, "ALTER TABLE ...; CREATE TABLE ...;"} to
 *   MIGRATIONS, bump TCC_CACHE_SCHEMA_VERSION, extend the table above and
 *   add a test that opens a version-1 file.
 *
 *   Version 3 adds entries.signature and entries.key_id (see tcc_sign.h
 *   for what is signed); entries migrated from version 2 are unsigned
 *   (x'' and ''), which a signing daemon treats as a miss and replaces.
 *
 * ERRORS
 *
 *   Every SQLite failure becomes a TCC_E_* code (sqlite_code_to_status)
 *   with sqlite3_errmsg in the message. A write that fails rolls back its
 *   whole transaction, leaving the cache as it was, and in-memory pending
 *   bookkeeping is only cleared after a successful commit.
 */
#include "cache.h"

#include <errno.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#define TCC_CACHE_APPLICATION_ID 0x54434344 /* "TCCD" */
#define TCC_CACHE_SCHEMA_VERSION 7
#define TCC_CACHE_DEFAULT_BUSY_MS 5000
#define TCC_CACHE_EVICT_BATCH 16

/* ---------------------------------------------------------------------- */
/* Schema migrations                                                       */
/* ---------------------------------------------------------------------- */

typedef struct cache_migration {
  int version;     /* user_version after this step */
  const char *sql; /* run inside the step's transaction */
} cache_migration;

static const cache_migration MIGRATIONS[] = {
  {1,
   "PRAGMA application_id = 1413694276;" /* 0x54434344 "TCCD" */
   "CREATE TABLE blobs ("
   "  sha256 BLOB PRIMARY KEY NOT NULL CHECK (length(sha256) = 32),"
   "  size   INTEGER NOT NULL,"
   "  data   BLOB NOT NULL);"
   "CREATE TABLE entries ("
   "  hash            BLOB PRIMARY KEY NOT NULL CHECK (length(hash) = 32),"
   "  target          TEXT NOT NULL,"
   "  kind            INTEGER NOT NULL,"
   "  artifact_sha256 BLOB NOT NULL REFERENCES blobs(sha256) ON DELETE CASCADE,"
   "  size            INTEGER NOT NULL,"
   "  kernels         INTEGER NOT NULL,"
   "  compile_ms      REAL NOT NULL,"
   "  created         INTEGER NOT NULL,"
   "  last_used       INTEGER NOT NULL,"
   "  hits            INTEGER NOT NULL DEFAULT 0,"
   "  key             BLOB NOT NULL,"
   "  manifest        BLOB NOT NULL,"
   "  request_meta    BLOB NOT NULL);"
   "CREATE INDEX entries_by_artifact ON entries(artifact_sha256);"
   "CREATE INDEX entries_by_value ON entries("
   "  (compile_ms * (hits + 1)) / max(size, 1), last_used);"
   "CREATE TABLE counters ("
   "  name  TEXT PRIMARY KEY NOT NULL,"
   "  value INTEGER NOT NULL);"
   "CREATE TABLE totals ("
   "  name  TEXT PRIMARY KEY NOT NULL,"
   "  value NOT NULL);"
   "INSERT INTO totals(name, value) VALUES ('blob_bytes', 0),"
   "                                       ('compile_seconds_saved', 0.0);"
   "CREATE TRIGGER blobs_add AFTER INSERT ON blobs BEGIN"
   "  UPDATE totals SET value = value + NEW.size WHERE name = 'blob_bytes'; END;"
   "CREATE TRIGGER blobs_del AFTER DELETE ON blobs BEGIN"
   "  UPDATE totals SET value = value - OLD.size WHERE name = 'blob_bytes'; END;"
   "CREATE TRIGGER blobs_resize AFTER UPDATE OF size ON blobs BEGIN"
   "  UPDATE totals SET value = value - OLD.size + NEW.size"
   "   WHERE name = 'blob_bytes'; END;"},
  {2,
   /* the negative cache, and compile time as a running total (it used to
    * be summed over the entries still stored) */
   "CREATE TABLE failures ("
   "  hash    BLOB PRIMARY KEY NOT NULL CHECK (length(hash) = 32),"
   "  code    INTEGER NOT NULL,"
   "  created INTEGER NOT NULL,"
   "  target  TEXT NOT NULL,"
   "  message TEXT NOT NULL,"
   "  key     BLOB NOT NULL);"
   "INSERT INTO totals(name, value)"
   "  SELECT 'compile_seconds', total(compile_ms) / 1000.0 FROM entries;"},
  {3,
   /* signed artifacts: the daemon's signature and key id per entry */
   "ALTER TABLE entries ADD COLUMN signature BLOB NOT NULL DEFAULT x'';"
   "ALTER TABLE entries ADD COLUMN key_id TEXT NOT NULL DEFAULT '';"},
  {4,
   /* autotuning records, reused across graphs */
   "CREATE TABLE tuning ("
   "  signature BLOB NOT NULL CHECK (length(signature) = 32),"
   "  target    TEXT NOT NULL,"
   "  created   INTEGER NOT NULL,"
   "  record    BLOB NOT NULL,"
   "  PRIMARY KEY (signature, target));"},
  {5,
   /* graph digests: the keys one graph recompiled under (tcctl explain) */
   "ALTER TABLE entries ADD COLUMN graph BLOB;"
   "ALTER TABLE failures ADD COLUMN graph BLOB;"
   "CREATE INDEX entries_by_graph ON entries(graph);"
   "CREATE INDEX failures_by_graph ON failures(graph);"},
  {6,
   /* the request each entry was compiled from (tcctl warm) */
   "ALTER TABLE entries ADD COLUMN request BLOB;"},
  {7,
   /* plans (PutPlan/GetPlan): first writer wins, so no replace */
   "CREATE TABLE plans ("
   "  key         TEXT PRIMARY KEY NOT NULL CHECK (length(key) BETWEEN 1 AND 200),"
   "  plan_sha256 BLOB NOT NULL CHECK (length(plan_sha256) = 32),"
   "  signature   BLOB NOT NULL DEFAULT x'',"
   "  key_id      TEXT NOT NULL DEFAULT '',"
   "  created     INTEGER NOT NULL,"
   "  last_used   INTEGER NOT NULL,"
   "  hits        INTEGER NOT NULL DEFAULT 0,"
   "  plan        BLOB NOT NULL);"},
};

_Static_assert(sizeof MIGRATIONS / sizeof MIGRATIONS[0] == TCC_CACHE_SCHEMA_VERSION,
               "one migration step per schema version");

/* ---------------------------------------------------------------------- */
/* Prepared statements: X(id, sql), prepared once at open                  */
/* ---------------------------------------------------------------------- */

#define ENTRY_META_COLS \
  "hash, target, kind, artifact_sha256, size, kernels, compile_ms, created, last_used, hits, key_id"
#define FAILURE_COLS "hash, code, message, created, target, length(key)"

#define STATEMENTS(X)                                                          \
  X(BEGIN, "BEGIN IMMEDIATE")                                                  \
  X(COMMIT, "COMMIT")                                                          \
  X(ROLLBACK, "ROLLBACK")                                                      \
  X(ENTRY_GET, "SELECT " ENTRY_META_COLS ", key, manifest, request_meta,"      \
               " signature FROM entries WHERE hash = ?1")                      \
  X(ENTRY_INSERT, "INSERT INTO entries(" ENTRY_META_COLS                       \
                  ", key, manifest, request_meta, signature, request)"         \
                  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?13, ?10, ?11, ?12, ?14, ?15)") \
  X(ENTRY_DELETE, "DELETE FROM entries WHERE hash = ?1 RETURNING artifact_sha256") \
  X(ENTRY_HIT, "UPDATE entries SET hits = hits + ?2,"                          \
               " last_used = max(last_used, ?3) WHERE hash = ?1")              \
  X(ENTRY_COUNT, "SELECT count(*), total(compile_ms) FROM entries")            \
  X(ENTRIES_BY_ARTIFACT, "SELECT hash FROM entries WHERE artifact_sha256 = ?1") \
  X(EVICT_CANDIDATES, "SELECT hash FROM entries WHERE hash IS NOT ?1"          \
                      " ORDER BY (compile_ms * (hits + 1)) / max(size, 1),"      \
                      " last_used, rowid LIMIT ?2")        \
  X(LIST_LAST_USED, "SELECT " ENTRY_META_COLS " FROM entries"                  \
                    " ORDER BY last_used DESC, hash ASC LIMIT ?1")             \
  X(LIST_HITS, "SELECT " ENTRY_META_COLS " FROM entries"                       \
               " ORDER BY hits DESC, last_used DESC, hash ASC LIMIT ?1")       \
  X(LIST_SIZE, "SELECT " ENTRY_META_COLS " FROM entries"                       \
               " ORDER BY size DESC, hash ASC LIMIT ?1")                       \
  X(LIST_CREATED, "SELECT " ENTRY_META_COLS " FROM entries"                    \
                  " ORDER BY created DESC, hash ASC LIMIT ?1")                 \
  X(BLOB_INSERT, "INSERT OR IGNORE INTO blobs(sha256, size, data)"             \
                 " VALUES (?1, ?2, ?3)")                                       \
  X(BLOB_GET, "SELECT size, data FROM blobs WHERE sha256 = ?1")                \
  X(BLOB_DELETE, "DELETE FROM blobs WHERE sha256 = ?1")                        \
  X(BLOB_DELETE_IF_ORPHAN, "DELETE FROM blobs WHERE sha256 = ?1 AND NOT EXISTS"\
                           " (SELECT 1 FROM entries WHERE artifact_sha256 = ?1)" \
                           " RETURNING size")                                  \
  X(BLOB_DELETE_ORPHANS, "DELETE FROM blobs WHERE NOT EXISTS"                  \
                         " (SELECT 1 FROM entries"                             \
                         "   WHERE artifact_sha256 = blobs.sha256)"            \
                         " RETURNING size")                                    \
  X(BLOB_ALL, "SELECT sha256 FROM blobs")                                      \
  X(BLOB_BYTES, "SELECT value FROM totals WHERE name = 'blob_bytes'")          \
  X(SAVED_GET, "SELECT value FROM totals WHERE name = 'compile_seconds_saved'")\
  X(SAVED_ADD, "UPDATE totals SET value = value + ?1"                          \
               " WHERE name = 'compile_seconds_saved'")                        \
  X(COMPILE_SECONDS_GET, "SELECT value FROM totals WHERE name = 'compile_seconds'") \
  X(COMPILE_SECONDS_ADD, "UPDATE totals SET value = value + ?1"                \
                         " WHERE name = 'compile_seconds'")                    \
  X(FAILURE_GET, "SELECT code, message, created, key FROM failures WHERE hash = ?1") \
  X(FAILURE_PUT, "INSERT OR REPLACE INTO failures(hash, code, created, target, message, key)" \
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?6)")                           \
  X(FAILURE_DELETE, "DELETE FROM failures WHERE hash = ?1")                    \
  X(FAILURE_COUNT, "SELECT count(*) FROM failures")                            \
  X(FAILURE_ROW, "SELECT " FAILURE_COLS " FROM failures WHERE hash = ?1")      \
  X(FAILURE_LIST, "SELECT " FAILURE_COLS " FROM failures"                      \
                  " ORDER BY created DESC, hash ASC LIMIT ?1")                 \
  X(TUNING_GET, "SELECT record FROM tuning WHERE signature = ?1 AND target = ?2") \
  X(TUNING_PUT, "INSERT OR REPLACE INTO tuning(signature, target, created, record)" \
                " VALUES (?1, ?2, ?3, ?4)")                                    \
  X(TUNING_COUNT, "SELECT count(*) FROM tuning")                               \
  X(COUNTER_GET, "SELECT name, value FROM counters")                           \
  X(COUNTER_ADD, "INSERT INTO counters(name, value) VALUES (?1, ?2)"           \
                 " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value") \
  X(ENTRY_SET_GRAPH, "UPDATE entries SET graph = ?2 WHERE hash = ?1")          \
  X(FAILURE_SET_GRAPH, "UPDATE failures SET graph = ?2 WHERE hash = ?1")       \
  X(GRAPH_UNKNOWN, "SELECT hash, key, 0 FROM entries WHERE graph IS NULL"      \
                   " UNION ALL SELECT hash, key, 1 FROM failures WHERE graph IS NULL") \
  X(SAME_GRAPH, "SELECT hash, key, 0, target, created FROM entries WHERE graph = ?1" \
                " UNION ALL SELECT hash, key, 1, target, created FROM failures WHERE graph = ?1" \
                " ORDER BY 5 DESC LIMIT ?2")                                   \
  X(REQUESTS, "SELECT hash, target, created FROM entries"                      \
              " WHERE request IS NOT NULL AND (?1 IS NULL OR target = ?1)"     \
              " AND (?2 IS NULL OR target IS NOT ?2) AND created >= ?3"        \
              " ORDER BY created DESC, hash ASC LIMIT ?4")                     \
  X(REQUESTS_MISSING, "SELECT count(*) FROM entries"                           \
                      " WHERE request IS NULL AND (?1 IS NULL OR target = ?1)" \
                      " AND (?2 IS NULL OR target IS NOT ?2) AND created >= ?3") \
  X(REQUEST_OF, "SELECT request FROM entries WHERE hash = ?1")                 \
  X(KEY_OF, "SELECT key, 0 FROM entries WHERE hash = ?1"                       \
            " UNION ALL SELECT key, 1 FROM failures WHERE hash = ?1") \
  X(COUNTERS_ZERO, "DELETE FROM counters")                                     \
  X(TOTALS_ZERO, "UPDATE totals SET value = 0.0"                               \
                 " WHERE name IN ('compile_seconds', 'compile_seconds_saved')") \
  X(CLEAR_ENTRIES, "DELETE FROM entries")                                      \
  X(CLEAR_BLOBS, "DELETE FROM blobs")                                          \
  X(CLEAR_FAILURES, "DELETE FROM failures")                                    \
  X(CLEAR_TUNING, "DELETE FROM tuning")                                        \
  X(CLEAR_PLANS, "DELETE FROM plans")                                          \
  X(PLAN_INSERT, "INSERT INTO plans(key, plan_sha256, signature, key_id, created, last_used, hits, plan)" \
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?5, 0, ?6) ON CONFLICT(key) DO NOTHING") \
  X(PLAN_GET, "SELECT plan_sha256, signature, key_id, created, last_used, hits, plan" \
              " FROM plans WHERE key = ?1")                                    \
  X(PLAN_HIT, "UPDATE plans SET hits = hits + 1, last_used = max(last_used, ?2) WHERE key = ?1") \
  X(PLAN_DELETE, "DELETE FROM plans WHERE key = ?1")                           \
  X(PLAN_TOTALS, "SELECT count(*), coalesce(sum(length(plan)), 0) FROM plans")

typedef enum cache_stmt_id {
#define STMT_ENUM(id, sql) ST_##id,
  STATEMENTS(STMT_ENUM)
#undef STMT_ENUM
  ST__COUNT
} cache_stmt_id;

static const char *const STATEMENT_SQL[ST__COUNT] = {
#define STMT_SQL(id, sql) [ST_##id] = sql,
  STATEMENTS(STMT_SQL)
#undef STMT_SQL
};

/* ---------------------------------------------------------------------- */
/* Structures                                                              */
/* ---------------------------------------------------------------------- */

/* One entry's hits not yet written: a slot of an open-addressing table
 * keyed by guard hash. A slot whose hits is 0 is a forgotten entry; it
 * keeps its key so probing stays simple (the table is emptied at flush). */
typedef struct cache_pending_hit {
  uint8_t hash[TCC_SHA256_BYTES];
  bool used;
  int64_t hits;
  int64_t last_used;
} cache_pending_hit;

/* Everything recorded in memory and written by the next flush. */
typedef struct cache_pending {
  cache_pending_hit *slots; /* cap slots, cap a power of two or 0 */
  size_t cap;
  size_t used;              /* slots with used set */
  int64_t counters[TCC_COUNTER__COUNT];
  double saved_ms;          /* compile time saved by pending hits */
} cache_pending;

struct tcc_cache {
  sqlite3 *db;
  char *path;               /* dir/cache.db, for messages */
  char *reserve_path;       /* dir/reserve: space kept for deletions */
  int64_t max_bytes;        /* 0 = unlimited */
  sqlite3_stmt *st[ST__COUNT];
  cache_pending pending;
  int (*graph_digest)(const uint8_t *key, size_t len, uint8_t out[TCC_SHA256_BYTES]);
};

static const char *const COUNTER_NAMES[TCC_COUNTER__COUNT] = {
#define COUNTER_NAME(name) [TCC_COUNTER_##name] = #name,
  TCC_CACHE_COUNTERS(COUNTER_NAME)
#undef COUNTER_NAME
};

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */
/* ---------------------------------------------------------------------- */

/* Maps a SQLite result code (primary or extended) to a TCC_E_* code. */
static int sqlite_code_to_status(int rc) {
  switch (rc & 0xff) {
  case SQLITE_OK: case SQLITE_ROW: case SQLITE_DONE: return TCC_OK;
  case SQLITE_BUSY: case SQLITE_LOCKED: return TCC_E_UNAVAILABLE;
  case SQLITE_NOMEM: case SQLITE_FULL: case SQLITE_TOOBIG: return TCC_E_RESOURCE_EXHAUSTED;
  case SQLITE_INTERRUPT: return TCC_E_CANCELLED;
  case SQLITE_CORRUPT: case SQLITE_NOTADB: return TCC_E_DATA_LOSS;
  case SQLITE_READONLY: case SQLITE_CANTOPEN: case SQLITE_PERM: case SQLITE_AUTH:
    return TCC_E_FAILED_PRECONDITION;
  case SQLITE_RANGE: case SQLITE_MISMATCH: return TCC_E_INVALID_ARGUMENT;
  default: return TCC_E_INTERNAL; /* IOERR, CONSTRAINT, SCHEMA, MISUSE, ... */
  }
}

/* Fills err from the connection's last error; returns the TCC_E_* code. */
static int sql_error(tcc_cache *c, int rc, tcc_error *err, const char *what) {
  int code = sqlite_code_to_status(rc);
  if (code == TCC_OK) code = TCC_E_INTERNAL;
  return tcc_error_set(err, code, "cache %s: %s: %s (%s)", c->path, what,
                       sqlite3_errmsg(c->db), sqlite3_errstr(rc));
}

/* ---------------------------------------------------------------------- */
/* Statement helpers                                                       */
/* ---------------------------------------------------------------------- */

/* Binds n bytes as a BLOB; a zero-length blob is bound as such, not NULL. */
static int bind_bytes(sqlite3_stmt *s, int i, const void *p, size_t n) {
  return sqlite3_bind_blob64(s, i, n ? p : (const void *)"", n, SQLITE_STATIC);
}

/* Steps a statement that returns no rows (or whose rows are ignored) to
 * completion and resets it. Returns SQLITE_DONE or the error code. */
static int stmt_run(sqlite3_stmt *s) {
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {}
  sqlite3_reset(s);
  return rc;
}

/* Writes the graph digest of a stored row (statement `which`: entries or
 * failures) when the hook is set and the key reads; else leaves it NULL.
 * Returns SQLITE_DONE or the error code. */
static int set_graph(tcc_cache *c, cache_stmt_id which, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                     size_t key_len) {
  uint8_t graph[TCC_SHA256_BYTES];
  if (!c->graph_digest || c->graph_digest(key, key_len, graph) != 0) return SQLITE_DONE;
  sqlite3_stmt *s = c->st[which];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_blob(s, 2, graph, TCC_SHA256_BYTES, SQLITE_STATIC);
  return stmt_run(s);
}

/* Copies a blob column into a fresh allocation (NULL for an empty one).
 * Returns 0 or -1 when out of memory. */
static int column_dup(sqlite3_stmt *s, int col, uint8_t **out, size_t *len) {
  const void *p = sqlite3_column_blob(s, col);
  size_t n = (size_t)sqlite3_column_bytes(s, col);
  *out = NULL;
  *len = 0;
  if (n == 0 || !p) return 0;
  if (!(*out = malloc(n))) return -1;
  memcpy(*out, p, n);
  *len = n;
  return 0;
}

/* Makes room for one more element of size bytes in *v (len used of *cap),
 * doubling from `first`. Returns 0, or -1 (out of memory; *v unchanged). */
static int array_reserve(void **v, size_t *cap, size_t len, size_t size, size_t first) {
  if (len < *cap) return 0;
  size_t grown_cap = *cap ? *cap * 2 : first;
  void *grown = realloc(*v, grown_cap * size);
  if (!grown) return -1;
  *v = grown;
  *cap = grown_cap;
  return 0;
}

/* Copies a 32-byte blob column; returns false when the column is not one. */
static bool column_digest(sqlite3_stmt *s, int col, uint8_t out[TCC_SHA256_BYTES]) {
  if (sqlite3_column_bytes(s, col) != TCC_SHA256_BYTES) {
    memset(out, 0, TCC_SHA256_BYTES);
    return false;
  }
  memcpy(out, sqlite3_column_blob(s, col), TCC_SHA256_BYTES);
  return true;
}

/* Reads the ENTRY_META_COLS prefix of a row (columns 0..10) into e. */
static void row_to_meta(sqlite3_stmt *s, tcc_cache_entry *e) {
  column_digest(s, 0, e->hash);
  const char *t = (const char *)sqlite3_column_text(s, 1);
  snprintf(e->target, sizeof e->target, "%s", t ? t : "");
  e->kind = sqlite3_column_int(s, 2);
  column_digest(s, 3, e->artifact_sha256);
  e->size = sqlite3_column_int64(s, 4);
  e->kernels = sqlite3_column_int(s, 5);
  e->compile_ms = sqlite3_column_double(s, 6);
  e->created = sqlite3_column_int64(s, 7);
  e->last_used = sqlite3_column_int64(s, 8);
  e->hits = sqlite3_column_int64(s, 9);
  const char *id = (const char *)sqlite3_column_text(s, 10);
  snprintf(e->key_id, sizeof e->key_id, "%s", id ? id : "");
}

/* Starts a write transaction (waiting up to busy_timeout for other
 * writers). Returns 0 or a TCC_E_* code. */
static int txn_begin(tcc_cache *c, tcc_error *err) {
  int rc = stmt_run(c->st[ST_BEGIN]);
  return rc == SQLITE_DONE ? 0 : sql_error(c, rc, err, "begin transaction");
}

/* Rolls back the open transaction, if SQLite has not already done so. */
static void txn_rollback(tcc_cache *c) {
  if (!sqlite3_get_autocommit(c->db)) stmt_run(c->st[ST_ROLLBACK]);
}

/* Commits; on failure rolls back. Returns 0 or a TCC_E_* code. */
static int txn_commit(tcc_cache *c, tcc_error *err) {
  int rc = stmt_run(c->st[ST_COMMIT]);
  if (rc == SQLITE_DONE) return 0;
  int code = sql_error(c, rc, err, "commit");
  txn_rollback(c);
  return code;
}

/* Reads totals.blob_bytes into *bytes. Returns 0 or a TCC_E_* code. */
static int blob_bytes_get(tcc_cache *c, int64_t *bytes, tcc_error *err) {
  sqlite3_stmt *s = c->st[ST_BLOB_BYTES];
  int rc = sqlite3_step(s);
  *bytes = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  if (rc == SQLITE_ROW) rc = SQLITE_DONE;
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : sql_error(c, rc, err, "read blob byte total");
}

/* ---------------------------------------------------------------------- */
/* Pending hit bookkeeping                                                 */
/* ---------------------------------------------------------------------- */

static size_t pending_slot_index(const cache_pending *p, const uint8_t hash[TCC_SHA256_BYTES]) {
  uint64_t h;
  memcpy(&h, hash, sizeof h); /* guard hashes are SHA-256: already uniform */
  return (size_t)h & (p->cap - 1);
}

/* Finds the slot for hash, claiming an empty one when create is set.
 * Returns NULL when absent (or when growing the table failed). */
static cache_pending_hit *pending_find(cache_pending *p, const uint8_t hash[TCC_SHA256_BYTES],
                                       bool create) {
  if (create && (p->used + 1) * 2 > p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 256;
    cache_pending_hit *slots = calloc(cap, sizeof *slots);
    if (!slots) return NULL;
    cache_pending_hit *old = p->slots;
    size_t old_cap = p->cap;
    p->slots = slots;
    p->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
      if (!old[i].used) continue;
      size_t j = pending_slot_index(p, old[i].hash);
      while (slots[j].used) j = (j + 1) & (cap - 1);
      slots[j] = old[i];
    }
    free(old);
  }
  if (p->cap == 0) return NULL;
  for (size_t i = pending_slot_index(p, hash);; i = (i + 1) & (p->cap - 1)) {
    cache_pending_hit *s = &p->slots[i];
    if (!s->used) {
      if (!create) return NULL;
      memcpy(s->hash, hash, TCC_SHA256_BYTES);
      s->used = true;
      s->hits = 0;
      s->last_used = 0;
      p->used++;
      return s;
    }
    if (memcmp(s->hash, hash, TCC_SHA256_BYTES) == 0) return s;
  }
}

/* Drops pending hits of an entry that was removed or replaced. */
static void pending_forget(cache_pending *p, const uint8_t hash[TCC_SHA256_BYTES]) {
  cache_pending_hit *s = pending_find(p, hash, false);
  if (s) s->hits = 0, s->last_used = 0;
}

/* Merges an entry's pending hits into e (a row just read from the file). */
static void pending_merge(cache_pending *p, tcc_cache_entry *e) {
  cache_pending_hit *s = pending_find(p, e->hash, false);
  if (!s || s->hits == 0) return;
  e->hits += s->hits;
  if (s->last_used > e->last_used) e->last_used = s->last_used;
}

/* Drops the pending hits of every entry (after clear); counters stay. */
static void pending_forget_all(cache_pending *p) {
  if (p->cap) memset(p->slots, 0, p->cap * sizeof *p->slots);
  p->used = 0;
}

static bool pending_empty(const cache_pending *p) {
  if (p->used || p->saved_ms != 0) return false;
  for (int i = 0; i < TCC_COUNTER__COUNT; i++)
    if (p->counters[i]) return false;
  return true;
}

/* Forgets everything pending (after a commit wrote it). */
static void pending_clear(cache_pending *p) {
  if (p->cap > 4096) { /* a burst of distinct hits: give the memory back */
    free(p->slots);
    p->slots = NULL;
    p->cap = 0;
  } else if (p->cap) {
    memset(p->slots, 0, p->cap * sizeof *p->slots);
  }
  p->used = 0;
  memset(p->counters, 0, sizeof p->counters);
  p->saved_ms = 0;
}

/* Writes everything pending inside the caller's open transaction; the
 * caller clears it after committing. Returns 0 or a TCC_E_* code. */
static int pending_write(tcc_cache *c, tcc_error *err) {
  cache_pending *p = &c->pending;
  int rc = SQLITE_DONE;
  for (size_t i = 0; i < p->cap && rc == SQLITE_DONE; i++) {
    cache_pending_hit *h = &p->slots[i];
    if (!h->used || h->hits == 0) continue;
    sqlite3_stmt *s = c->st[ST_ENTRY_HIT];
    sqlite3_bind_blob(s, 1, h->hash, TCC_SHA256_BYTES, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, h->hits);
    sqlite3_bind_int64(s, 3, h->last_used);
    rc = stmt_run(s);
  }
  for (int i = 0; i < TCC_COUNTER__COUNT && rc == SQLITE_DONE; i++) {
    if (!p->counters[i]) continue;
    sqlite3_stmt *s = c->st[ST_COUNTER_ADD];
    sqlite3_bind_text(s, 1, COUNTER_NAMES[i], -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, p->counters[i]);
    rc = stmt_run(s);
  }
  if (rc == SQLITE_DONE && p->saved_ms != 0) {
    sqlite3_bind_double(c->st[ST_SAVED_ADD], 1, p->saved_ms / 1000.0);
    rc = stmt_run(c->st[ST_SAVED_ADD]);
  }
  return rc == SQLITE_DONE ? 0 : sql_error(c, rc, err, "write hit bookkeeping");
}

/* ---------------------------------------------------------------------- */
/* The reserve                                                             */
/* ---------------------------------------------------------------------- */

/* On a full disk SQLite cannot even delete: a delete writes WAL frames.
 * So the cache keeps TCC_CACHE_RESERVE_BYTES of disk in dir/reserve, a
 * file of allocated blocks that nothing reads. A deletion that fails for
 * lack of space (evict, gc) removes the reserve and tries once more; the
 * reserve is made again (tcc_cache_flush, at most once a second from the
 * daemon's housekeeping) as soon as the disk has room for it and a
 * margin. */

/* Makes dir/reserve when it is missing and the disk has room for it with
 * as much again to spare. Returns 1 when the reserve is there. */
static int reserve_make(tcc_cache *c) {
  struct stat st;
  if (stat(c->reserve_path, &st) == 0 && st.st_size >= TCC_CACHE_RESERVE_BYTES) return 1;
  struct statvfs vfs;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", c->path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  if (statvfs(slash ? dir : ".", &vfs) != 0 ||
      (uint64_t)vfs.f_bavail * vfs.f_frsize < 2ull * TCC_CACHE_RESERVE_BYTES)
    return 0;
  int fd = open(c->reserve_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  int rc = posix_fallocate(fd, 0, TCC_CACHE_RESERVE_BYTES);
  close(fd);
  if (rc != 0) {
    unlink(c->reserve_path);
    return 0;
  }
  return 1;
}

/* Gives the reserve's space back to the file system. Returns 1 when there
 * was a reserve to give. */
static int reserve_release(tcc_cache *c) { return unlink(c->reserve_path) == 0; }


/* ---------------------------------------------------------------------- */
/* Open and close                                                          */
/* ---------------------------------------------------------------------- */

/* mkdir -p with mode 0700 for what it creates. Returns 0 or -1 (errno). */
static int make_dirs(const char *dir) {
  char *tmp = strdup(dir);
  if (!tmp) return -1;
  size_t n = strlen(tmp);
  while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
  int rc = 0;
  for (char *p = tmp + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
      rc = -1;
      break;
    }
    *p = saved;
    if (saved == '\0') break;
  }
  int e = errno;
  free(tmp);
  errno = e;
  return rc;
}

/* Checks that dir exists (creating it) and is a writable directory.
 * Returns 0 or TCC_E_FAILED_PRECONDITION naming it. */
static int check_dir(const char *dir, tcc_error *err) {
  struct stat st;
  if (make_dirs(dir) != 0)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache directory %s cannot be created: %s", dir, strerror(errno));
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache directory %s is not a directory", dir);
  if (access(dir, W_OK | X_OK) != 0)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache directory %s is not writable: %s", dir, strerror(errno));
  return 0;
}

/* Runs a one-row integer query ("PRAGMA user_version"). Returns the
 * SQLite result code (SQLITE_OK on success). */
static int query_int(sqlite3 *db, const char *sql, int64_t *out) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      *out = sqlite3_column_int64(s, 0);
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(s);
  return rc;
}

/* Decides whether the file is a fresh database, a tccd cache this build
 * can use, or something else. Sets *version (0 for a fresh file).
 * Returns 0 or TCC_E_FAILED_PRECONDITION naming the path. */
static int check_identity(tcc_cache *c, int64_t *version, tcc_error *err) {
  int64_t app = 0, tables = 0;
  int rc = query_int(c->db, "PRAGMA application_id", &app);
  if (rc == SQLITE_OK) rc = query_int(c->db, "PRAGMA user_version", version);
  if (rc == SQLITE_OK) rc = query_int(c->db, "SELECT count(*) FROM sqlite_schema", &tables);
  if (rc == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache %s is not a SQLite database (%s); move it away or pick "
                         "another --cache-dir", c->path, sqlite3_errmsg(c->db));
  if (rc != SQLITE_OK)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "cache %s cannot be read: %s",
                         c->path, sqlite3_errmsg(c->db));
  if (app == 0 && tables == 0 && *version == 0) return 0; /* fresh */
  if (app != TCC_CACHE_APPLICATION_ID)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "%s is a SQLite database but not a tccd cache "
                         "(application_id 0x%llx, expected 0x%x)",
                         c->path, (unsigned long long)app, TCC_CACHE_APPLICATION_ID);
  if (*version > TCC_CACHE_SCHEMA_VERSION)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache %s has schema version %lld, newer than this build "
                         "supports (%d); use a newer tccd or another --cache-dir",
                         c->path, (long long)*version, TCC_CACHE_SCHEMA_VERSION);
  return 0;
}

/* Applies every migration newer than the file's version, each in its own
 * transaction (re-reading the version inside it, so two processes opening
 * one fresh file do not both migrate). Returns 0 or a TCC_E_* code. */
static int migrate(tcc_cache *c, int64_t version, tcc_error *err) {
  for (size_t i = 0; i < sizeof MIGRATIONS / sizeof MIGRATIONS[0]; i++) {
    const cache_migration *m = &MIGRATIONS[i];
    if (m->version <= version) continue;
    char *msg = NULL;
    int rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    int64_t now = 0;
    if (rc == SQLITE_OK) rc = query_int(c->db, "PRAGMA user_version", &now);
    if (rc == SQLITE_OK && now < m->version) {
      rc = sqlite3_exec(c->db, m->sql, NULL, NULL, &msg);
      if (rc == SQLITE_OK) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", m->version);
        rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
      }
    }
    if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      int code = tcc_error_set(err, sqlite_code_to_status(rc),
                               "cache %s: migration to schema version %d failed: %s",
                               c->path, m->version, msg ? msg : sqlite3_errmsg(c->db));
      sqlite3_free(msg);
      if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
      return code;
    }
  }
  return 0;
}

/* Sets the connection's pragmas. Returns 0 or a TCC_E_* code. */
static int configure(tcc_cache *c, const tcc_cache_options *opts, bool fresh, tcc_error *err) {
  /* auto_vacuum only takes effect before the first table exists. */
  if (fresh && sqlite3_exec(c->db, "PRAGMA auto_vacuum = INCREMENTAL", NULL, NULL, NULL))
    return sql_error(c, sqlite3_errcode(c->db), err, "set auto_vacuum");
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(s);
  bool wal = rc == SQLITE_ROW &&
             sqlite3_stricmp((const char *)sqlite3_column_text(s, 0), "wal") == 0;
  sqlite3_finalize(s);
  if (rc != SQLITE_ROW) return sql_error(c, rc, err, "set journal_mode=WAL");
  if (!wal)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "cache %s: the file system does not support WAL mode", c->path);
  const char *sync = opts->synchronous_full ? "PRAGMA synchronous = FULL"
                                            : "PRAGMA synchronous = NORMAL";
  if ((rc = sqlite3_exec(c->db, sync, NULL, NULL, NULL)) != SQLITE_OK ||
      (rc = sqlite3_exec(c->db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL)) != SQLITE_OK ||
      (rc = sqlite3_exec(c->db, "PRAGMA cache_size = -16384", NULL, NULL, NULL)) != SQLITE_OK ||
      (rc = sqlite3_exec(c->db, "PRAGMA secure_delete = FAST", NULL, NULL, NULL)) != SQLITE_OK)
    return sql_error(c, rc, err, "set pragmas");
  return 0;
}

int tcc_cache_open(const tcc_cache_options *opts, tcc_cache **out, tcc_error *err) {
  if (out) *out = NULL;
  if (!opts || !out || !opts->dir || !opts->dir[0])
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache: no directory given");
  if (opts->max_bytes < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache: max_bytes %lld is negative",
                         (long long)opts->max_bytes);
  int code = check_dir(opts->dir, err);
  if (code) return code;

  tcc_cache *c = calloc(1, sizeof *c);
  if (!c || asprintf(&c->path, "%s/cache.db", opts->dir) < 0 ||
      asprintf(&c->reserve_path, "%s/reserve", opts->dir) < 0) {
    if (c) free(c->path);
    free(c);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache: out of memory");
  }
  c->max_bytes = opts->max_bytes;
  c->graph_digest = opts->graph_digest;

  struct stat st;
  if (stat(c->path, &st) == 0 && !S_ISREG(st.st_mode)) {
    code = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "cache %s is not a regular file",
                         c->path);
    goto fail;
  }
  int rc = sqlite3_open_v2(c->path, &c->db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           NULL);
  if (rc != SQLITE_OK) {
    code = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "cache %s cannot be opened: %s",
                         c->path, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_timeout(c->db, opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms
                                                        : TCC_CACHE_DEFAULT_BUSY_MS);

  int64_t version = 0;
  if ((code = check_identity(c, &version, err)) ||
      (code = configure(c, opts, version == 0, err)) ||
      (code = migrate(c, version, err)))
    goto fail;

  for (int i = 0; i < ST__COUNT; i++) {
    rc = sqlite3_prepare_v3(c->db, STATEMENT_SQL[i], -1, SQLITE_PREPARE_PERSISTENT,
                            &c->st[i], NULL);
    if (rc != SQLITE_OK) {
      code = sql_error(c, rc, err, "prepare statement");
      goto fail;
    }
  }
  reserve_make(c); /* best effort: a full disk at start has none */
  *out = c;
  return 0;

fail:
  for (int i = 0; i < ST__COUNT; i++) sqlite3_finalize(c->st[i]);
  sqlite3_close(c->db);
  free(c->path);
  free(c->reserve_path);
  free(c);
  return code;
}

void tcc_cache_close(tcc_cache *c) {
  if (!c) return;
  tcc_cache_flush(c, NULL); /* best effort: close cannot report */
  for (int i = 0; i < ST__COUNT; i++) sqlite3_finalize(c->st[i]);
  sqlite3_exec(c->db, "PRAGMA optimize", NULL, NULL, NULL);
  sqlite3_close(c->db);
  free(c->pending.slots);
  free(c->path);
  free(c->reserve_path);
  free(c);
}

/* ---------------------------------------------------------------------- */
/* Entries                                                                 */
/* ---------------------------------------------------------------------- */

void tcc_cache_entry_clear(tcc_cache_entry *e) {
  if (!e) return;
  free(e->key);
  free(e->manifest);
  free(e->request_meta);
  memset(e, 0, sizeof *e);
}

void tcc_cache_entries_free(tcc_cache_entry *entries, size_t n) {
  for (size_t i = 0; entries && i < n; i++) tcc_cache_entry_clear(&entries[i]);
  free(entries);
}

/* Reads the full entry for hash into *out (zeroed first). When key is
 * non-NULL, the stored key must equal it. Returns 0, TCC_E_NOT_FOUND, or
 * another TCC_E_* code. */
static int entry_read(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                      size_t key_len, bool check_key, tcc_cache_entry *out, tcc_error *err) {
  char hex[TCC_SHA256_HEX];
  sqlite3_stmt *s = c->st[ST_ENTRY_GET];
  memset(out, 0, sizeof *out);
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s);
  if (rc != SQLITE_ROW) {
    int code = rc == SQLITE_DONE ? 0 : sql_error(c, rc, err, "look up entry");
    sqlite3_reset(s);
    if (code) return code;
    tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
    return tcc_error_set(err, TCC_E_NOT_FOUND, "no cache entry for %s", hex);
  }
  if (check_key) {
    const void *stored = sqlite3_column_blob(s, 11);
    size_t n = (size_t)sqlite3_column_bytes(s, 11);
    if (n != key_len || (n && memcmp(stored, key, n) != 0)) {
      sqlite3_reset(s);
      tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
      return tcc_error_set(err, TCC_E_NOT_FOUND,
                           "guard hash collision: entry %s has a different canonical key "
                           "(%zu stored bytes vs %zu requested); treated as a miss",
                           hex, n, key_len);
    }
  }
  row_to_meta(s, out);
  int oom = column_dup(s, 11, &out->key, &out->key_len) |
            column_dup(s, 12, &out->manifest, &out->manifest_len) |
            column_dup(s, 13, &out->request_meta, &out->request_meta_len);
  size_t sig_len = (size_t)sqlite3_column_bytes(s, 14);
  if (sig_len > 0 && sig_len <= sizeof out->signature) {
    memcpy(out->signature, sqlite3_column_blob(s, 14), sig_len);
    out->signature_len = sig_len;
  }
  sqlite3_reset(s);
  if (oom) {
    tcc_cache_entry_clear(out);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache: out of memory reading entry");
  }
  pending_merge(&c->pending, out);
  return 0;
}

int tcc_cache_lookup(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                     size_t key_len, tcc_cache_entry *out, tcc_error *err) {
  if (!c || !hash || !out || (!key && key_len))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache lookup: bad arguments");
  int code = entry_read(c, hash, key, key_len, true, out, err);
  if (code) return code;
  cache_pending_hit *h = pending_find(&c->pending, hash, true);
  if (h) { /* out of memory: the hit goes unrecorded, the answer stands */
    int64_t now = (int64_t)time(NULL);
    h->hits++;
    if (now > h->last_used) h->last_used = now;
    c->pending.saved_ms += out->compile_ms;
    out->hits++;
    if (now > out->last_used) out->last_used = now;
  }
  return 0;
}

int tcc_cache_get(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_cache_entry *out,
                  tcc_error *err) {
  if (!c || !hash || !out)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache get: bad arguments");
  return entry_read(c, hash, NULL, 0, false, out, err);
}

/* ---------------------------------------------------------------------- */
/* Removal and eviction (inside the caller's transaction)                  */
/* ---------------------------------------------------------------------- */

/* Deletes one entry and, when no other entry uses it, its blob. Adds the
 * freed blob bytes to *freed. Returns 0, TCC_E_NOT_FOUND (nothing
 * deleted), or another TCC_E_* code. */
static int entry_delete(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], int64_t *freed,
                        tcc_error *err) {
  sqlite3_stmt *s = c->st[ST_ENTRY_DELETE];
  uint8_t artifact[TCC_SHA256_BYTES];
  bool found = false;
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) found = column_digest(s, 0, artifact) || found;
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "delete entry");
  if (!found) return TCC_E_NOT_FOUND;
  pending_forget(&c->pending, hash);
  s = c->st[ST_BLOB_DELETE_IF_ORPHAN];
  sqlite3_bind_blob(s, 1, artifact, TCC_SHA256_BYTES, SQLITE_STATIC);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) *freed += sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : sql_error(c, rc, err, "delete unused blob");
}

/* Evicts the least valuable entries, never `keep` (may be NULL), until
 * the blob bytes are within budget or nothing else can go. Counts into
 * *evicted and *freed. Returns 0 or a TCC_E_* code. */
static int evict_to_budget(tcc_cache *c, int64_t budget, const uint8_t *keep,
                           int64_t *evicted, int64_t *freed, tcc_error *err) {
  for (;;) {
    int64_t bytes;
    int code = blob_bytes_get(c, &bytes, err);
    if (code) return code;
    if (bytes <= budget) return 0;

    uint8_t batch[TCC_CACHE_EVICT_BATCH][TCC_SHA256_BYTES];
    int n = 0, rc;
    sqlite3_stmt *s = c->st[ST_EVICT_CANDIDATES];
    if (keep) sqlite3_bind_blob(s, 1, keep, TCC_SHA256_BYTES, SQLITE_STATIC);
    else sqlite3_bind_null(s, 1);
    sqlite3_bind_int(s, 2, TCC_CACHE_EVICT_BATCH);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW && n < TCC_CACHE_EVICT_BATCH)
      if (column_digest(s, 0, batch[n])) n++;
    sqlite3_reset(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return sql_error(c, rc, err, "pick eviction victims");
    if (n == 0) return 0; /* only `keep` is left */

    int deleted = 0;
    for (int i = 0; i < n && bytes > budget; i++) {
      int64_t got = 0;
      code = entry_delete(c, batch[i], &got, err);
      if (code && code != TCC_E_NOT_FOUND) return code;
      if (!code) ++*evicted, deleted++;
      *freed += got;
      bytes -= got;
    }
    if (!deleted) return 0; /* cannot happen inside one transaction; never spin */
  }
}

/* ---------------------------------------------------------------------- */
/* Store                                                                   */
/* ---------------------------------------------------------------------- */

/* Checks a store request. Returns 0 or TCC_E_INVALID_ARGUMENT /
 * TCC_E_RESOURCE_EXHAUSTED (artifact alone over the budget). */
static int store_check(tcc_cache *c, const tcc_cache_entry *e, const uint8_t *artifact,
                       size_t len, tcc_error *err) {
  if (!e || (!artifact && len) || (!e->key && e->key_len) ||
      (!e->manifest && e->manifest_len) || (!e->request_meta && e->request_meta_len) ||
      (!e->request && e->request_len) || e->request_len > TCC_CACHE_REQUEST_MAX)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store: bad arguments");
  if (strnlen(e->target, sizeof e->target) == sizeof e->target)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store: target not terminated");
  if (strnlen(e->key_id, sizeof e->key_id) == sizeof e->key_id ||
      e->signature_len > sizeof e->signature)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store: bad signature or key id");
  if (len > (size_t)INT64_MAX / 2)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store: artifact too large");
  uint8_t digest[TCC_SHA256_BYTES];
  tcc_sha256(artifact ? (const void *)artifact : "", len, digest);
  if (memcmp(digest, e->artifact_sha256, TCC_SHA256_BYTES) != 0) {
    char want[TCC_SHA256_HEX], got[TCC_SHA256_HEX];
    tcc_hex_encode(e->artifact_sha256, TCC_SHA256_BYTES, want);
    tcc_hex_encode(digest, TCC_SHA256_BYTES, got);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "cache store: artifact_sha256 %s does not match the artifact (%s)",
                         want, got);
  }
  if (c->max_bytes > 0 && (int64_t)len > c->max_bytes)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED,
                         "cache store: artifact of %zu bytes is larger than the whole "
                         "cache budget (%lld bytes)", len, (long long)c->max_bytes);
  return 0;
}

/* The body of a store, inside its transaction. *flushed is set when the
 * pending bookkeeping was written too; *evicted counts evictions.
 * Returns 0 or a TCC_E_* code (the caller rolls back). */
static int store_in_txn(tcc_cache *c, const tcc_cache_entry *e, const uint8_t *artifact,
                        size_t len, bool *flushed, int64_t *evicted, tcc_error *err) {
  int64_t now = (int64_t)time(NULL), bytes = 0, freed = 0;
  int code, rc;

  /* The pending bookkeeping goes in with the entry: eviction weighs hits,
   * and the counters (the `compiles` that made this entry among them)
   * then survive a crash together with it. */
  if (!pending_empty(&c->pending)) {
    if ((code = pending_write(c, err))) return code;
    *flushed = true;
  }
  if (c->max_bytes > 0 && (code = blob_bytes_get(c, &bytes, err))) return code;

  /* Replacing: drop the old row (its blob goes below, if now unused). */
  uint8_t old_artifact[TCC_SHA256_BYTES];
  bool replaced = false;
  sqlite3_stmt *s = c->st[ST_ENTRY_DELETE];
  sqlite3_bind_blob(s, 1, e->hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) replaced = column_digest(s, 0, old_artifact);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "replace entry");

  s = c->st[ST_BLOB_INSERT];
  sqlite3_bind_blob(s, 1, e->artifact_sha256, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_int64(s, 2, (int64_t)len);
  bind_bytes(s, 3, artifact, len);
  if ((rc = stmt_run(s)) != SQLITE_DONE) return sql_error(c, rc, err, "insert blob");

  s = c->st[ST_ENTRY_INSERT];
  sqlite3_bind_blob(s, 1, e->hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_text(s, 2, e->target, -1, SQLITE_STATIC);
  sqlite3_bind_int(s, 3, e->kind);
  sqlite3_bind_blob(s, 4, e->artifact_sha256, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_int64(s, 5, (int64_t)len);
  sqlite3_bind_int(s, 6, e->kernels);
  sqlite3_bind_double(s, 7, e->compile_ms);
  sqlite3_bind_int64(s, 8, now);
  sqlite3_bind_int64(s, 9, now);
  bind_bytes(s, 10, e->key, e->key_len);
  bind_bytes(s, 11, e->manifest, e->manifest_len);
  bind_bytes(s, 12, e->request_meta, e->request_meta_len);
  sqlite3_bind_text(s, 13, e->key_id, -1, SQLITE_STATIC);
  bind_bytes(s, 14, e->signature, e->signature_len);
  if (e->request) sqlite3_bind_blob(s, 15, e->request, (int)e->request_len, SQLITE_STATIC);
  else sqlite3_bind_null(s, 15);
  if ((rc = stmt_run(s)) != SQLITE_DONE) return sql_error(c, rc, err, "insert entry");
  if ((rc = set_graph(c, ST_ENTRY_SET_GRAPH, e->hash, e->key, e->key_len)) != SQLITE_DONE)
    return sql_error(c, rc, err, "set entry graph");

  s = c->st[ST_COMPILE_SECONDS_ADD];
  sqlite3_bind_double(s, 1, e->imported ? 0.0 : e->compile_ms / 1000.0);
  if ((rc = stmt_run(s)) != SQLITE_DONE) return sql_error(c, rc, err, "add compile time");
  s = c->st[ST_FAILURE_DELETE]; /* a success supersedes a recorded failure */
  sqlite3_bind_blob(s, 1, e->hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  if ((rc = stmt_run(s)) != SQLITE_DONE) return sql_error(c, rc, err, "drop failure");

  if (replaced && memcmp(old_artifact, e->artifact_sha256, TCC_SHA256_BYTES) != 0) {
    s = c->st[ST_BLOB_DELETE_IF_ORPHAN];
    sqlite3_bind_blob(s, 1, old_artifact, TCC_SHA256_BYTES, SQLITE_STATIC);
    if ((rc = stmt_run(s)) != SQLITE_DONE) return sql_error(c, rc, err, "delete replaced blob");
  }

  if (c->max_bytes > 0)
    return evict_to_budget(c, c->max_bytes, e->hash, evicted, &freed, err);
  return 0;
}

int tcc_cache_store(tcc_cache *c, const tcc_cache_entry *e, const uint8_t *artifact,
                    size_t len, tcc_error *err) {
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store: no cache");
  int code = store_check(c, e, artifact, len, err);
  if (code) return code;
  if ((code = txn_begin(c, err))) return code;
  bool flushed = false;
  int64_t evicted = 0;
  code = store_in_txn(c, e, artifact, len, &flushed, &evicted, err);
  if (code) {
    txn_rollback(c);
    return code;
  }
  if ((code = txn_commit(c, err))) return code;
  if (flushed) pending_clear(&c->pending);
  pending_forget(&c->pending, e->hash);
  c->pending.counters[TCC_COUNTER_evictions] += evicted;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Artifacts                                                               */
/* ---------------------------------------------------------------------- */

/* Deletes a corrupt blob and (by the foreign key's cascade) every entry
 * using it, in one transaction; counts it. Returns 0 or a TCC_E_* code. */
static int blob_remove_corrupt(tcc_cache *c, const uint8_t sha[TCC_SHA256_BYTES],
                               tcc_error *err) {
  int code = txn_begin(c, err), rc = SQLITE_DONE;
  if (code) return code;
  sqlite3_stmt *s = c->st[ST_ENTRIES_BY_ARTIFACT];
  sqlite3_bind_blob(s, 1, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
  uint8_t h[TCC_SHA256_BYTES];
  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    if (column_digest(s, 0, h)) pending_forget(&c->pending, h);
  sqlite3_reset(s);
  if (rc == SQLITE_DONE) {
    sqlite3_bind_blob(c->st[ST_BLOB_DELETE], 1, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
    rc = stmt_run(c->st[ST_BLOB_DELETE]);
  }
  if (rc != SQLITE_DONE) {
    code = sql_error(c, rc, err, "delete corrupt blob");
    txn_rollback(c);
    return code;
  }
  if ((code = txn_commit(c, err))) return code;
  c->pending.counters[TCC_COUNTER_corrupt_blobs]++;
  return 0;
}

/* Reads and verifies one blob. With data NULL only verifies. Returns 0,
 * TCC_E_NOT_FOUND, TCC_E_DATA_LOSS (corrupt: removed), or another code. */
static int blob_read_verified(tcc_cache *c, const uint8_t sha[TCC_SHA256_BYTES],
                              uint8_t **data, size_t *len, tcc_error *err) {
  char hex[TCC_SHA256_HEX], got_hex[TCC_SHA256_HEX];
  tcc_hex_encode(sha, TCC_SHA256_BYTES, hex);
  sqlite3_stmt *s = c->st[ST_BLOB_GET];
  sqlite3_bind_blob(s, 1, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s);
  if (rc != SQLITE_ROW) {
    int code = rc == SQLITE_DONE
                   ? tcc_error_set(err, TCC_E_NOT_FOUND, "no artifact %s in the cache", hex)
                   : sql_error(c, rc, err, "read blob");
    sqlite3_reset(s);
    return code;
  }
  int64_t size = sqlite3_column_int64(s, 0);
  const void *p = sqlite3_column_blob(s, 1);
  size_t n = (size_t)sqlite3_column_bytes(s, 1);
  uint8_t got[TCC_SHA256_BYTES];
  tcc_sha256(p ? p : "", n, got);
  bool ok = (int64_t)n == size && memcmp(got, sha, TCC_SHA256_BYTES) == 0;
  uint8_t *copy = NULL;
  if (ok && data) {
    copy = malloc(n ? n : 1);
    if (copy && n) memcpy(copy, p, n);
  }
  sqlite3_reset(s);
  if (!ok) {
    tcc_hex_encode(got, TCC_SHA256_BYTES, got_hex);
    tcc_error cleanup;
    int code = blob_remove_corrupt(c, sha, &cleanup);
    return tcc_error_set(err, TCC_E_DATA_LOSS,
                         "artifact %s is corrupt in %s (%zu bytes, expected %lld, digest %s)"
                         "; %s",
                         hex, c->path, n, (long long)size, got_hex,
                         code ? cleanup.msg : "removed it and the entries using it");
  }
  if (data) {
    if (!copy)
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache: out of memory reading %s", hex);
    *data = copy;
    *len = n;
  }
  return 0;
}

int tcc_cache_read_artifact(tcc_cache *c, const uint8_t sha256[TCC_SHA256_BYTES],
                            uint8_t **data, size_t *len, tcc_error *err) {
  if (data) *data = NULL;
  if (len) *len = 0;
  if (!c || !sha256 || !data || !len)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache read_artifact: bad arguments");
  return blob_read_verified(c, sha256, data, len, err);
}

/* ---------------------------------------------------------------------- */
/* Maintenance                                                             */
/* ---------------------------------------------------------------------- */

static int evict_once(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_error *err);

int tcc_cache_evict(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_error *err) {
  if (!c || !hash) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache evict: bad arguments");
  int code = evict_once(c, hash, err);
  if (code == TCC_E_RESOURCE_EXHAUSTED && reserve_release(c)) /* a full disk: spend the reserve */
    code = evict_once(c, hash, err);
  return code;
}

static int evict_once(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_error *err) {
  int code = txn_begin(c, err);
  if (code) return code;
  int64_t freed = 0;
  code = entry_delete(c, hash, &freed, err);
  if (code == TCC_E_NOT_FOUND || code == 0) { /* a recorded failure goes too */
    sqlite3_stmt *s = c->st[ST_FAILURE_DELETE];
    sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
    int rc = stmt_run(s);
    if (rc != SQLITE_DONE) code = sql_error(c, rc, err, "drop failure");
    else if (sqlite3_changes(c->db) > 0) code = 0;
  }
  if (code) {
    txn_rollback(c);
    if (code == TCC_E_NOT_FOUND) {
      char hex[TCC_SHA256_HEX];
      tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
      tcc_error_set(err, code, "no cache entry for %s", hex);
    }
    return code;
  }
  return txn_commit(c, err);
}

/* Collects every blob digest into a malloc'd array. Returns 0 or a code. */
static int blob_list(tcc_cache *c, uint8_t (**out)[TCC_SHA256_BYTES], size_t *n,
                     tcc_error *err) {
  uint8_t (*v)[TCC_SHA256_BYTES] = NULL;
  size_t len = 0, cap = 0;
  sqlite3_stmt *s = c->st[ST_BLOB_ALL];
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (array_reserve((void **)&v, &cap, len, sizeof *v, 64)) {
      sqlite3_reset(s);
      free(v);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache gc: out of memory");
    }
    if (column_digest(s, 0, v[len])) len++;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(v);
    return sql_error(c, rc, err, "list blobs");
  }
  *out = v;
  *n = len;
  return 0;
}

/* Gives the free pages back to the file system a megabyte at a time:
 * an incremental vacuum writes the pages it moves to the WAL, and the
 * TRUNCATE checkpoint after each step copies them home, shrinks cache.db
 * and empties the WAL, so a nearly full disk needs only a step's worth of
 * room (one vacuum of a 37 MB file with 20 MB free pages failed for lack
 * of space; in steps it finished). Best effort: it stops at an error. */
static void vacuum_in_steps(tcc_cache *c) {
  for (int step = 0; step < 100000; step++) {
    sqlite3_stmt *s = NULL;
    int64_t free_pages = 0;
    if (sqlite3_prepare_v2(c->db, "PRAGMA freelist_count", -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
      free_pages = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (free_pages <= 0 || sqlite3_exec(c->db, "PRAGMA incremental_vacuum(256)", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(c->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) != SQLITE_OK)
      break;
  }
}

/* gc's sweep, after the blobs were verified: deletes unused blobs, evicts
 * to the budget (max_bytes, or the cache's), gives pages back. */
static int gc_sweep(tcc_cache *c, int64_t max_bytes, tcc_cache_gc_result *r, tcc_error *err) {
  int code;
  if ((code = txn_begin(c, err))) return code;
  sqlite3_stmt *s = c->st[ST_BLOB_DELETE_ORPHANS];
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) r->freed_bytes += sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) code = sql_error(c, rc, err, "delete unused blobs");
  int64_t budget = max_bytes ? max_bytes : c->max_bytes;
  if (!code && budget > 0)
    code = evict_to_budget(c, budget, NULL, &r->evicted, &r->freed_bytes, err);
  if (code) {
    txn_rollback(c);
    return code;
  }
  if ((code = txn_commit(c, err))) return code;
  c->pending.counters[TCC_COUNTER_evictions] += r->evicted;

  /* Give freed pages back to the file system (auto_vacuum=INCREMENTAL;
   * in WAL mode the file shrinks at the checkpoint), then hold the
   * reserve again if it was spent and there is room for it now. */
  vacuum_in_steps(c);
  reserve_make(c);
  return 0;
}

/* gc_sweep, once more with the reserve's space when the disk is full. */
static int gc_sweep_or_reserve(tcc_cache *c, int64_t max_bytes, tcc_cache_gc_result *r, tcc_error *err) {
  tcc_cache_gc_result before = *r; /* a rolled-back sweep counted what it did not do */
  int code = gc_sweep(c, max_bytes, r, err);
  if (code == TCC_E_RESOURCE_EXHAUSTED && reserve_release(c)) {
    *r = before;
    code = gc_sweep(c, max_bytes, r, err);
  }
  return code;
}

/* Verifies the blobs named by digests[0..n) on c's connection; a corrupt
 * one is removed (with the entries using it) and counted. */
static int gc_verify(tcc_cache *c, const uint8_t (*digests)[TCC_SHA256_BYTES], size_t n, tcc_cache_gc_result *r,
                     tcc_error *err) {
  for (size_t i = 0; i < n; i++) {
    tcc_error e;
    int rc = blob_read_verified(c, digests[i], NULL, NULL, &e);
    if (rc == TCC_E_DATA_LOSS) r->corrupt_removed++;
    else if (rc && rc != TCC_E_NOT_FOUND) {
      if (err) *err = e;
      return rc;
    }
  }
  return 0;
}

int tcc_cache_gc(tcc_cache *c, int64_t max_bytes, tcc_cache_gc_result *out, tcc_error *err) {
  tcc_cache_gc_result r = {0};
  if (out) *out = r;
  if (!c || max_bytes < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache gc: bad arguments");
  tcc_cache_flush(c, NULL); /* eviction weighs hits (on a full disk they wait) */

  uint8_t (*blobs)[TCC_SHA256_BYTES] = NULL;
  size_t n = 0;
  int code = blob_list(c, &blobs, &n, err);
  if (code) return code;
  code = gc_verify(c, (const uint8_t (*)[TCC_SHA256_BYTES])blobs, n, &r, err);
  free(blobs);
  if (code || (code = gc_sweep_or_reserve(c, max_bytes, &r, err))) return code;
  if (out) *out = r;
  return 0;
}

const char *tcc_cache_db_path(const tcc_cache *c) { return c->path; }

int tcc_cache_scan_blobs(const char *db_path, uint8_t (**corrupt)[TCC_SHA256_BYTES], size_t *n,
                         tcc_error *err) {
  *corrupt = NULL;
  *n = 0;
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    int code = tcc_error_set(err, TCC_E_UNAVAILABLE, "cache gc: cannot open %s to verify blobs: %s", db_path,
                             db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close(db);
    return code;
  }
  sqlite3_busy_timeout(db, TCC_CACHE_DEFAULT_BUSY_MS);
  sqlite3_stmt *s = NULL;
  rc = sqlite3_prepare_v2(db, "SELECT sha256, size, data FROM blobs", -1, &s, NULL);
  uint8_t (*v)[TCC_SHA256_BYTES] = NULL;
  size_t len = 0, cap = 0;
  int code = 0;
  while (s && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    uint8_t want[TCC_SHA256_BYTES], got[TCC_SHA256_BYTES];
    if (!column_digest(s, 0, want)) continue;
    int64_t size = sqlite3_column_int64(s, 1);
    const void *p = sqlite3_column_blob(s, 2);
    size_t bytes = (size_t)sqlite3_column_bytes(s, 2);
    tcc_sha256(p ? p : "", bytes, got);
    if ((int64_t)bytes == size && memcmp(got, want, TCC_SHA256_BYTES) == 0) continue;
    if (len == cap) {
      cap = cap ? cap * 2 : 16;
      void *grown = realloc(v, cap * sizeof *v);
      if (!grown) {
        code = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache gc: out of memory");
        break;
      }
      v = grown;
    }
    memcpy(v[len++], want, TCC_SHA256_BYTES);
  }
  if (!code && rc != SQLITE_DONE && rc != SQLITE_ROW)
    code = tcc_error_set(err, TCC_E_UNAVAILABLE, "cache gc: verifying blobs in %s: %s", db_path, sqlite3_errmsg(db));
  sqlite3_finalize(s);
  sqlite3_close(db);
  if (code) {
    free(v);
    return code;
  }
  *corrupt = v;
  *n = len;
  return 0;
}

int tcc_cache_gc_finish(tcc_cache *c, int64_t max_bytes, const uint8_t (*corrupt)[TCC_SHA256_BYTES], size_t n,
                        tcc_cache_gc_result *out, tcc_error *err) {
  tcc_cache_gc_result r = {0};
  if (out) *out = r;
  if (!c || max_bytes < 0 || (n && !corrupt))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache gc: bad arguments");
  tcc_cache_flush(c, NULL); /* eviction weighs hits (on a full disk they wait) */
  int code;
  if ((code = gc_verify(c, corrupt, n, &r, err)) || (code = gc_sweep_or_reserve(c, max_bytes, &r, err))) return code;
  if (out) *out = r;
  return 0;
}

/* One try of tcc_cache_clear: the deletions in one transaction. */
static int clear_once(tcc_cache *c, int tuning, tcc_cache_clear_result *r, tcc_error *err) {
  static const cache_stmt_id steps[] = {ST_CLEAR_ENTRIES, ST_CLEAR_BLOBS, ST_CLEAR_FAILURES, ST_CLEAR_PLANS,
                                        ST_CLEAR_TUNING};
  int64_t *counts[] = {&r->entries, NULL, &r->failures, &r->plans, &r->tuning_records};
  memset(r, 0, sizeof *r);
  int code = txn_begin(c, err);
  if (code) return code;
  code = blob_bytes_get(c, &r->bytes, err);
  for (size_t i = 0; !code && i < sizeof steps / sizeof steps[0]; i++) {
    if (steps[i] == ST_CLEAR_TUNING && !tuning) break;
    int rc = stmt_run(c->st[steps[i]]);
    if (rc != SQLITE_DONE) code = sql_error(c, rc, err, "clear");
    else if (counts[i]) *counts[i] = sqlite3_changes(c->db);
  }
  if (code) {
    txn_rollback(c);
    memset(r, 0, sizeof *r);
    return code;
  }
  return txn_commit(c, err);
}

int tcc_cache_clear(tcc_cache *c, int tuning, tcc_cache_clear_result *out, tcc_error *err) {
  tcc_cache_clear_result r;
  if (out) memset(out, 0, sizeof *out);
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache clear: no cache");
  int code = clear_once(c, tuning, &r, err);
  if (code == TCC_E_RESOURCE_EXHAUSTED && reserve_release(c)) /* a full disk: spend the reserve */
    code = clear_once(c, tuning, &r, err);
  if (code) return code;
  pending_forget_all(&c->pending);
  vacuum_in_steps(c);
  reserve_make(c);
  if (out) *out = r;
  return 0;
}

int tcc_cache_list(tcc_cache *c, tcc_cache_order order, int limit, tcc_cache_entry **out,
                   size_t *n, tcc_error *err) {
  if (out) *out = NULL;
  if (n) *n = 0;
  static const cache_stmt_id by_order[] = {
    [TCC_CACHE_ORDER_LAST_USED] = ST_LIST_LAST_USED, [TCC_CACHE_ORDER_HITS] = ST_LIST_HITS,
    [TCC_CACHE_ORDER_SIZE] = ST_LIST_SIZE, [TCC_CACHE_ORDER_CREATED] = ST_LIST_CREATED};
  if (!c || !out || !n || (unsigned)order >= sizeof by_order / sizeof by_order[0])
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache list: bad arguments");
  /* So hits and last_used are current; when the write lock is busy the
   * list still answers, with the pending hits not yet counted. */
  tcc_cache_flush(c, NULL);

  sqlite3_stmt *s = c->st[by_order[order]];
  sqlite3_bind_int(s, 1, limit > 0 ? limit : -1);
  tcc_cache_entry *v = NULL;
  size_t len = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (array_reserve((void **)&v, &cap, len, sizeof *v, 16)) {
      sqlite3_reset(s);
      tcc_cache_entries_free(v, len);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache list: out of memory");
    }
    memset(&v[len], 0, sizeof v[len]);
    row_to_meta(s, &v[len++]);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    tcc_cache_entries_free(v, len);
    return sql_error(c, rc, err, "list entries");
  }
  *out = v;
  *n = len;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Counters, stats, flush, integrity                                       */
/* ---------------------------------------------------------------------- */

const char *tcc_cache_counter_name(tcc_cache_counter counter) {
  return (unsigned)counter < TCC_COUNTER__COUNT ? COUNTER_NAMES[counter] : "unknown";
}

void tcc_cache_count(tcc_cache *c, tcc_cache_counter counter, int64_t delta) {
  if (c && (unsigned)counter < TCC_COUNTER__COUNT) c->pending.counters[counter] += delta;
}

int tcc_cache_stats_get(tcc_cache *c, tcc_cache_stats *out, tcc_error *err) {
  if (!c || !out) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache stats: bad arguments");
  memset(out, 0, sizeof *out);
  out->max_bytes = c->max_bytes;
  int code = blob_bytes_get(c, &out->bytes, err);
  if (code) return code;

  sqlite3_stmt *s = c->st[ST_ENTRY_COUNT];
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    out->entries = sqlite3_column_int64(s, 0);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_COMPILE_SECONDS_GET];
  if (rc == SQLITE_DONE && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    out->compile_seconds = sqlite3_column_double(s, 0);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_FAILURE_COUNT];
  if (rc == SQLITE_DONE && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    out->failures = sqlite3_column_int64(s, 0);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_TUNING_COUNT];
  if (rc == SQLITE_DONE && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    out->tuning_records = sqlite3_column_int64(s, 0);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_PLAN_TOTALS];
  if (rc == SQLITE_DONE && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    out->plans = sqlite3_column_int64(s, 0);
    out->plan_bytes = sqlite3_column_int64(s, 1);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_SAVED_GET];
  if (rc == SQLITE_DONE && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    out->compile_seconds_saved = sqlite3_column_double(s, 0);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);

  s = c->st[ST_COUNTER_GET];
  if (rc == SQLITE_DONE) {
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      const char *name = (const char *)sqlite3_column_text(s, 0);
      for (int i = 0; name && i < TCC_COUNTER__COUNT; i++)
        if (strcmp(name, COUNTER_NAMES[i]) == 0) out->counters[i] = sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
  }
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "read stats");

  for (int i = 0; i < TCC_COUNTER__COUNT; i++) out->counters[i] += c->pending.counters[i];
  out->compile_seconds_saved += c->pending.saved_ms / 1000.0;
  return 0;
}

int tcc_cache_zero_counters(tcc_cache *c, tcc_error *err) {
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache zero counters: no cache");
  int code = txn_begin(c, err);
  if (code) return code;
  int rc = stmt_run(c->st[ST_COUNTERS_ZERO]);
  if (rc == SQLITE_DONE) rc = stmt_run(c->st[ST_TOTALS_ZERO]);
  if (rc != SQLITE_DONE) {
    code = sql_error(c, rc, err, "zero counters");
    txn_rollback(c);
    return code;
  }
  if ((code = txn_commit(c, err))) return code;
  memset(c->pending.counters, 0, sizeof c->pending.counters);
  c->pending.saved_ms = 0;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* The negative cache                                                      */
/* ---------------------------------------------------------------------- */

/* Reads a FAILURE_COLS row into *f (zeroed first). */
static void row_to_failure(sqlite3_stmt *s, tcc_cache_failure *f) {
  memset(f, 0, sizeof *f);
  column_digest(s, 0, f->hash);
  f->code = sqlite3_column_int(s, 1);
  const char *msg = (const char *)sqlite3_column_text(s, 2);
  snprintf(f->message, sizeof f->message, "%s", msg ? msg : "");
  f->created = sqlite3_column_int64(s, 3);
  const char *t = (const char *)sqlite3_column_text(s, 4);
  snprintf(f->target, sizeof f->target, "%s", t ? t : "");
  f->key_len = (size_t)sqlite3_column_int64(s, 5);
}

int tcc_cache_list_failures(tcc_cache *c, int limit, tcc_cache_failure **out, size_t *n, tcc_error *err) {
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!c || !out || !n) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache list failures: bad arguments");
  sqlite3_stmt *s = c->st[ST_FAILURE_LIST];
  sqlite3_bind_int(s, 1, limit > 0 ? limit : -1);
  tcc_cache_failure *v = NULL;
  size_t len = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (array_reserve((void **)&v, &cap, len, sizeof *v, 16)) {
      sqlite3_reset(s);
      free(v);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "cache list failures: out of memory");
    }
    row_to_failure(s, &v[len++]);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(v);
    return sql_error(c, rc, err, "list failures");
  }
  *out = v;
  *n = len;
  return 0;
}

int tcc_cache_get_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], tcc_cache_failure *out,
                          tcc_error *err) {
  if (!c || !hash || !out) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache get failure: bad arguments");
  memset(out, 0, sizeof *out);
  sqlite3_stmt *s = c->st[ST_FAILURE_ROW];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s), found = rc == SQLITE_ROW;
  if (found) {
    row_to_failure(s, out);
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "read failure");
  if (!found) {
    char hex[TCC_SHA256_HEX];
    tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
    return tcc_error_set(err, TCC_E_NOT_FOUND, "no recorded failure for %s", hex);
  }
  return 0;
}

int tcc_cache_store_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                            const uint8_t *key, size_t key_len, const char *target,
                            int code, const char *message, tcc_error *err) {
  if (!c || !hash || (!key && key_len) || code >= 0 || !message)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache store failure: bad arguments");
  sqlite3_stmt *s = c->st[ST_FAILURE_PUT];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_int(s, 2, code);
  sqlite3_bind_int64(s, 3, (int64_t)time(NULL));
  sqlite3_bind_text(s, 4, target ? target : "", -1, SQLITE_STATIC);
  sqlite3_bind_text(s, 5, message, -1, SQLITE_STATIC);
  bind_bytes(s, 6, key, key_len);
  int rc = stmt_run(s); /* its own transaction; the graph digest is an index, not data */
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "store failure");
  if ((rc = set_graph(c, ST_FAILURE_SET_GRAPH, hash, key, key_len)) != SQLITE_DONE)
    return sql_error(c, rc, err, "set failure graph");
  return 0;
}

int tcc_cache_lookup_failure(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES],
                             const uint8_t *key, size_t key_len, tcc_cache_failure *out,
                             tcc_error *err) {
  if (!c || !hash || !out || (!key && key_len))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache lookup failure: bad arguments");
  memset(out, 0, sizeof *out);
  sqlite3_stmt *s = c->st[ST_FAILURE_GET];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s), found = 0;
  if (rc == SQLITE_ROW) {
    const void *stored = sqlite3_column_blob(s, 3);
    size_t n = (size_t)sqlite3_column_bytes(s, 3);
    if (n == key_len && (n == 0 || memcmp(stored, key, n) == 0)) {
      out->code = sqlite3_column_int(s, 0);
      const unsigned char *msg = sqlite3_column_text(s, 1);
      snprintf(out->message, sizeof out->message, "%s", msg ? (const char *)msg : "");
      out->created = sqlite3_column_int64(s, 2);
      found = 1;
    }
    rc = SQLITE_DONE;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "look up failure");
  if (!found) return tcc_error_set(err, TCC_E_NOT_FOUND, "no recorded failure");
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Tuning records                                                          */
/* ---------------------------------------------------------------------- */

int tcc_cache_tuning_get(tcc_cache *c, const uint8_t signature[TCC_SHA256_BYTES],
                         const char *target, uint8_t **record, size_t *len, tcc_error *err) {
  if (!c || !signature || !target || !record || !len)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache tuning get: bad arguments");
  *record = NULL;
  *len = 0;
  sqlite3_stmt *s = c->st[ST_TUNING_GET];
  sqlite3_bind_blob(s, 1, signature, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
  int rc = sqlite3_step(s), found = 0;
  if (rc == SQLITE_ROW) {
    found = 1;
    rc = column_dup(s, 0, record, len) ? SQLITE_NOMEM : SQLITE_DONE;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "read tuning record");
  if (!found) return tcc_error_set(err, TCC_E_NOT_FOUND, "no tuning record");
  return 0;
}

int tcc_cache_tuning_put(tcc_cache *c, const uint8_t signature[TCC_SHA256_BYTES],
                         const char *target, const uint8_t *record, size_t len, tcc_error *err) {
  if (!c || !signature || !target || !record || len == 0 || len > (1u << 20))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache tuning put: bad arguments");
  sqlite3_stmt *s = c->st[ST_TUNING_PUT];
  sqlite3_bind_blob(s, 1, signature, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 3, (sqlite3_int64)time(NULL));
  bind_bytes(s, 4, record, len);
  int rc = stmt_run(s); /* one statement: its own transaction */
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "store tuning record");
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Plans                                                                   */
/* ---------------------------------------------------------------------- */

static int plan_key_ok(const char *key) {
  size_t n = key ? strlen(key) : 0;
  return n >= 1 && n <= TCC_CACHE_PLAN_KEY_MAX;
}

int tcc_cache_plan_put(tcc_cache *c, const char *key, const uint8_t *plan, size_t len, const uint8_t *sig,
                       size_t sig_len, const char *key_id, int *inserted, tcc_error *err) {
  if (inserted) *inserted = 0;
  if (!c || !plan_key_ok(key) || !plan || len == 0 || sig_len > TCC_CACHE_SIGNATURE_MAX || (sig_len && !sig) ||
      strlen(key_id ? key_id : "") >= TCC_CACHE_KEY_ID_MAX)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache plan put: bad arguments");
  uint8_t sha[TCC_SHA256_BYTES];
  tcc_sha256(plan, len, sha);
  sqlite3_stmt *s = c->st[ST_PLAN_INSERT];
  sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
  sqlite3_bind_blob(s, 2, sha, TCC_SHA256_BYTES, SQLITE_STATIC);
  bind_bytes(s, 3, sig, sig_len);
  sqlite3_bind_text(s, 4, key_id ? key_id : "", -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 5, (sqlite3_int64)time(NULL));
  bind_bytes(s, 6, plan, len);
  int rc = stmt_run(s); /* one statement: its own transaction */
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "store plan");
  if (inserted) *inserted = sqlite3_changes(c->db) > 0;
  return 0;
}

int tcc_cache_plan_delete(tcc_cache *c, const char *key, tcc_error *err) {
  if (!c || !key) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache plan delete: bad arguments");
  sqlite3_stmt *s = c->st[ST_PLAN_DELETE];
  sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
  int rc = stmt_run(s);
  if (rc != SQLITE_DONE) return sql_error(c, rc, err, "delete plan");
  if (sqlite3_changes(c->db) == 0) return tcc_error_set(err, TCC_E_NOT_FOUND, "no plan for key '%.200s'", key);
  return 0;
}

/* Reads a PLAN_GET row into *out. Returns SQLITE_DONE or SQLITE_NOMEM. */
static int row_to_plan(sqlite3_stmt *s, tcc_cache_plan *out) {
  column_digest(s, 0, out->plan_sha256);
  size_t n = (size_t)sqlite3_column_bytes(s, 1);
  if (n <= sizeof out->signature) {
    if (n) memcpy(out->signature, sqlite3_column_blob(s, 1), n);
    out->signature_len = n;
  }
  const char *id = (const char *)sqlite3_column_text(s, 2);
  snprintf(out->key_id, sizeof out->key_id, "%s", id ? id : "");
  out->created = sqlite3_column_int64(s, 3);
  out->last_used = sqlite3_column_int64(s, 4);
  out->hits = sqlite3_column_int64(s, 5);
  return column_dup(s, 6, &out->plan, &out->plan_len) ? SQLITE_NOMEM : SQLITE_DONE;
}

int tcc_cache_plan_get(tcc_cache *c, const char *key, tcc_cache_plan *out, tcc_error *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!c || !key || !out) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache plan get: bad arguments");
  sqlite3_stmt *s = c->st[ST_PLAN_GET];
  sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
  int rc = sqlite3_step(s), found = 0;
  if (rc == SQLITE_ROW) {
    found = 1;
    rc = row_to_plan(s, out);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    tcc_cache_plan_free(out);
    return sql_error(c, rc, err, "read plan");
  }
  if (!found) return tcc_error_set(err, TCC_E_NOT_FOUND, "no plan for key '%.200s'", key);
  uint8_t got[TCC_SHA256_BYTES];
  tcc_sha256(out->plan, out->plan_len, got);
  if (memcmp(got, out->plan_sha256, TCC_SHA256_BYTES) != 0) {
    tcc_cache_plan_free(out);
    tcc_cache_plan_delete(c, key, NULL);
    return tcc_error_set(err, TCC_E_DATA_LOSS, "cache %s: the plan for key '%.200s' does not match its digest; removed",
                         c->path, key);
  }
  int64_t now = (int64_t)time(NULL);
  s = c->st[ST_PLAN_HIT];
  sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 2, now);
  if (stmt_run(s) == SQLITE_DONE) { /* a busy writer costs the bookkeeping, never the answer */
    out->hits++;
    if (now > out->last_used) out->last_used = now;
  }
  return 0;
}

void tcc_cache_plan_free(tcc_cache_plan *p) {
  if (!p) return;
  free(p->plan);
  memset(p, 0, sizeof *p);
}

int tcc_cache_flush(tcc_cache *c, tcc_error *err) {
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache flush: no cache");
  reserve_make(c); /* after a full disk: again once there is room */
  if (pending_empty(&c->pending)) return 0;
  int code = txn_begin(c, err);
  if (code) return code;
  if ((code = pending_write(c, err))) {
    txn_rollback(c);
    return code;
  }
  if ((code = txn_commit(c, err))) return code;
  pending_clear(&c->pending);
  return 0;
}

int tcc_cache_integrity_check(tcc_cache *c, tcc_error *err) {
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache integrity_check: no cache");
  static const char *const checks[] = {"PRAGMA integrity_check", "PRAGMA foreign_key_check"};
  char report[TCC_ERROR_MSG_MAX / 2];
  size_t used = 0;
  report[0] = '\0';
  for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++) {
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, checks[k], -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
      /* integrity_check: one row "ok" when clean; foreign_key_check: no
       * rows when clean, else (table, rowid, parent, fkid). */
      const char *text = (const char *)sqlite3_column_text(s, 0);
      if (k == 0 && text && strcmp(text, "ok") == 0) { rc = SQLITE_OK; continue; }
      int w = k == 0 ? snprintf(report + used, sizeof report - used, "%s%s",
                                used ? "; " : "", text ? text : "?")
                     : snprintf(report + used, sizeof report - used,
                                "%sforeign key violation in %s rowid %lld", used ? "; " : "",
                                text ? text : "?", (long long)sqlite3_column_int64(s, 1));
      if (w > 0) used += (size_t)w < sizeof report - used ? (size_t)w : sizeof report - used - 1;
      rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE) {
      int code = sql_error(c, rc, err, checks[k]);
      sqlite3_finalize(s);
      return code;
    }
    sqlite3_finalize(s);
  }
  if (used)
    return tcc_error_set(err, TCC_E_DATA_LOSS, "cache %s failed its integrity check: %s",
                         c->path, report);
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Keys by graph (tcctl explain)                                           */
/* ---------------------------------------------------------------------- */

/* Fills in the graph digest of rows stored before v5 (or without the
 * hook): one pass, one transaction. A key the hook cannot read gets an
 * empty digest, so it is not read again. */
static int backfill_graphs(tcc_cache *c, tcc_error *err) {
  if (!c->graph_digest) return 0;
  typedef struct todo { uint8_t hash[TCC_SHA256_BYTES], graph[TCC_SHA256_BYTES]; int failure, ok; } todo;
  todo *rows = NULL;
  size_t n = 0, cap = 0;
  sqlite3_stmt *s = c->st[ST_GRAPH_UNKNOWN];
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (n == cap) {
      todo *more = realloc(rows, (cap = cap ? cap * 2 : 64) * sizeof *rows);
      if (!more) {
        sqlite3_reset(s);
        free(rows);
        return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory reading graph digests");
      }
      rows = more;
    }
    todo *t = &rows[n++];
    memcpy(t->hash, sqlite3_column_blob(s, 0), TCC_SHA256_BYTES);
    t->ok = c->graph_digest(sqlite3_column_blob(s, 1), (size_t)sqlite3_column_bytes(s, 1), t->graph) == 0;
    t->failure = sqlite3_column_int(s, 2);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(rows);
    return sql_error(c, rc, err, "read keys without a graph digest");
  }
  if (n == 0) return 0;
  if ((rc = stmt_run(c->st[ST_BEGIN])) != SQLITE_DONE) {
    free(rows);
    return sql_error(c, rc, err, "begin");
  }
  for (size_t i = 0; i < n && rc == SQLITE_DONE; i++) {
    s = c->st[rows[i].failure ? ST_FAILURE_SET_GRAPH : ST_ENTRY_SET_GRAPH];
    sqlite3_bind_blob(s, 1, rows[i].hash, TCC_SHA256_BYTES, SQLITE_STATIC);
    bind_bytes(s, 2, rows[i].graph, rows[i].ok ? TCC_SHA256_BYTES : 0);
    rc = stmt_run(s);
  }
  free(rows);
  if (rc != SQLITE_DONE) {
    stmt_run(c->st[ST_ROLLBACK]);
    return sql_error(c, rc, err, "write graph digests");
  }
  if ((rc = stmt_run(c->st[ST_COMMIT])) != SQLITE_DONE) {
    stmt_run(c->st[ST_ROLLBACK]);
    return sql_error(c, rc, err, "commit graph digests");
  }
  return 0;
}

int tcc_cache_same_graph(tcc_cache *c, const uint8_t graph[TCC_SHA256_BYTES], int limit, tcc_cache_keyed **out,
                         size_t *n, tcc_error *err) {
  *out = NULL;
  *n = 0;
  if (!c || !graph) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache same graph: bad arguments");
  int rc = backfill_graphs(c, err);
  if (rc) return rc;
  sqlite3_stmt *s = c->st[ST_SAME_GRAPH];
  sqlite3_bind_blob(s, 1, graph, TCC_SHA256_BYTES, SQLITE_STATIC);
  sqlite3_bind_int(s, 2, limit > 0 ? limit : -1);
  tcc_cache_keyed *rows = NULL;
  size_t cap = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      tcc_cache_keyed *more = realloc(rows, (cap = cap ? cap * 2 : 16) * sizeof *rows);
      if (!more) break;
      rows = more;
    }
    tcc_cache_keyed *k = &rows[*n];
    memset(k, 0, sizeof *k);
    memcpy(k->hash, sqlite3_column_blob(s, 0), TCC_SHA256_BYTES);
    if (column_dup(s, 1, &k->key, &k->key_len) != 0) break;
    k->failure = sqlite3_column_int(s, 2);
    const unsigned char *target = sqlite3_column_text(s, 3);
    snprintf(k->target, sizeof k->target, "%s", target ? (const char *)target : "");
    k->created = sqlite3_column_int64(s, 4);
    ++*n;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    tcc_cache_keyed_free(rows, *n);
    *out = NULL;
    *n = 0;
    if (rc == SQLITE_ROW) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory reading keys");
    return sql_error(c, rc, err, "read keys of a graph");
  }
  *out = rows;
  return 0;
}

void tcc_cache_keyed_free(tcc_cache_keyed *k, size_t n) {
  for (size_t i = 0; k && i < n; i++) free(k[i].key);
  free(k);
}

/* ---------------------------------------------------------------------- */
/* Stored requests (tcctl warm)                                            */
/* ---------------------------------------------------------------------- */

/* Binds the filters shared by REQUESTS and REQUESTS_MISSING. */
static void bind_request_filter(sqlite3_stmt *s, const char *target, const char *not_target, int64_t since) {
  if (target) sqlite3_bind_text(s, 1, target, -1, SQLITE_STATIC);
  else sqlite3_bind_null(s, 1);
  if (not_target) sqlite3_bind_text(s, 2, not_target, -1, SQLITE_STATIC);
  else sqlite3_bind_null(s, 2);
  sqlite3_bind_int64(s, 3, since);
}

int tcc_cache_list_requests(tcc_cache *c, const char *target, const char *not_target, int64_t since, int limit,
                            tcc_cache_stored_request **out, size_t *n, int64_t *without, tcc_error *err) {
  *out = NULL;
  *n = 0;
  *without = 0;
  if (!c) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cache list requests: no cache");
  sqlite3_stmt *s = c->st[ST_REQUESTS_MISSING];
  bind_request_filter(s, target, not_target, since);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) *without = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  if (rc != SQLITE_ROW) return sql_error(c, rc, err, "count entries without a request");
  s = c->st[ST_REQUESTS];
  bind_request_filter(s, target, not_target, since);
  sqlite3_bind_int(s, 4, limit > 0 ? limit : -1);
  tcc_cache_stored_request *rows = NULL;
  size_t cap = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      tcc_cache_stored_request *more = realloc(rows, (cap = cap ? cap * 2 : 64) * sizeof *rows);
      if (!more) break;
      rows = more;
    }
    tcc_cache_stored_request *r = &rows[(*n)++];
    memset(r, 0, sizeof *r);
    column_digest(s, 0, r->hash);
    const unsigned char *t = sqlite3_column_text(s, 1);
    snprintf(r->target, sizeof r->target, "%s", t ? (const char *)t : "");
    r->created = sqlite3_column_int64(s, 2);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(rows);
    *n = 0;
    if (rc == SQLITE_ROW) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory listing requests");
    return sql_error(c, rc, err, "list stored requests");
  }
  *out = rows;
  return 0;
}

int tcc_cache_request_of(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], uint8_t **request, size_t *len,
                         tcc_error *err) {
  *request = NULL;
  *len = 0;
  sqlite3_stmt *s = c->st[ST_REQUEST_OF];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s), code = 0;
  if (rc == SQLITE_ROW && sqlite3_column_type(s, 0) == SQLITE_BLOB) {
    if (column_dup(s, 0, request, len) != 0) code = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
    code = tcc_error_set(err, TCC_E_NOT_FOUND, rc == SQLITE_ROW ? "the entry keeps no request" : "no cache entry");
  } else {
    code = sql_error(c, rc, err, "read request");
  }
  sqlite3_reset(s);
  return code;
}

int tcc_cache_key_of(tcc_cache *c, const uint8_t hash[TCC_SHA256_BYTES], uint8_t **key, size_t *len, int *failure,
                     tcc_error *err) {
  *key = NULL;
  *len = 0;
  sqlite3_stmt *s = c->st[ST_KEY_OF];
  sqlite3_bind_blob(s, 1, hash, TCC_SHA256_BYTES, SQLITE_STATIC);
  int rc = sqlite3_step(s), code = 0;
  if (rc == SQLITE_ROW) {
    *failure = sqlite3_column_int(s, 1);
    if (column_dup(s, 0, key, len) != 0) code = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  } else if (rc == SQLITE_DONE) {
    code = tcc_error_set(err, TCC_E_NOT_FOUND, "no cache entry or recorded failure");
  } else {
    code = sql_error(c, rc, err, "read key");
  }
  sqlite3_reset(s);
  return code;
}
