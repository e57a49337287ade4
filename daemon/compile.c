/*
 * compile.c — the Compile RPC: front end, cache lookup, single-flight
 * compile jobs on the worker pool, store, reply.
 *
 * DESIGN
 *
 *   request ─► admit by bytes (--request-memory-max)
 *           ─► read + decode + tcc_prepare (verify, canonicalize, guard
 *              hash): on the loop up to 64 KiB, else on an offload thread
 *           ─► cache lookup ──hit (verified once per process)──► reply HIT
 *              (its latency since the call arrived: tccd_cache_hit_seconds)
 *           ─► recorded failure (younger than --failure-ttl)? ──yes──► the
 *              same error (negative cache)
 *           ─► job for this hash in flight? ──yes──► wait on it (COALESCED)
 *           ─► backing off after a timeout? ──yes──► DEADLINE_EXCEEDED
 *           ─► storing blocked (a full disk)? ──yes──► RESOURCE_EXHAUSTED
 *           ─► queue full? ──yes──► RESOURCE_EXHAUSTED
 *           ─► new job ─► [--redis: the remote tier (remote.c): its entry,
 *                or the cluster lock, or a wait on the daemon compiling it]
 *           ─► uv_queue_work(tcc_compile) ... ─► job_done (loop):
 *                [max-autotune: AUTOTUNING (autotune.c) first: tuning
 *                records, candidate builds on the pool, benchmark
 *                children, the tuned build ─► job_tuned (loop)]
 *                store entry + blob (one transaction), reply MISS to the
 *                first caller and COALESCED to the others, or the error
 *                to all of them (and record it when it would repeat);
 *                write entry + artifact through to Redis, drop the lock.
 *
 * A job's life is one state machine (job_set_state asserts every move):
 *
 *   REMOTE ─────── verified remote entry (job_remote_done) ─────────┐
 *     │  compile here (miss, lock taken, Redis down or slow)         │
 *     ▼         worker picks it up               tcc_compile returned 0
 *   QUEUED ───────────────────────► COMPILING ─────────────────────► STORING
 *     │          (job_work)             │  │       (job_done)           │
 *     │                                 │  │ max-autotune               │
 *     │                                 │  ▼ (job_done)    tuned or not │
 *     │                                 │ AUTOTUNING ──────────────────►│
 *     │                                 │                (job_tuned)    │
 *     │                                 │ tcc_compile failed            │ store failed
 *     │ uv_cancel at shutdown           ▼                               ▼
 *     └────────────────────────────► FAILED ◄──────────────────────────┘
 *   REMOTE ── shutdown / queue full ──►  ▲                               │ stored
 *                                                              DONE ◄────┘
 *
 *   REMOTE     (--redis only) asking the cluster tier; no worker is used.
 *              Its outcome: a verified entry (stored locally, REMOTE_HIT
 *              to the first waiter), another daemon's verified failure
 *              record (recorded locally, its error to every waiter: FAILED)
 *              or "compile here" (QUEUED)
 *   QUEUED     in the pool's queue, waiting for a worker (queue depth;
 *              the wait until job_work starts: tccd_queue_wait_seconds)
 *   COMPILING  on a worker inside tcc_compile (running jobs); the only
 *              state a worker sets (atomically), all others are the loop's
 *   AUTOTUNING (max-autotune modes) the default artifact is built; the
 *              tuning run (autotune.c) builds and benchmarks candidates
 *              on the pool and in child processes. The job stays in the
 *              table (identical requests still coalesce) but has left
 *              the pool's queue accounting. A tuning failure is never a
 *              compile failure: the default artifact is stored instead.
 *   STORING    entry + blob written in one transaction (loop)
 *   DONE       stored; MISS (REMOTE_HIT) to the first waiter, COALESCED to
 *              the rest
 *   FAILED     the error to every waiter; recorded in the negative cache
 *              when it would repeat
 *
 * Everything here but job_work runs on the loop thread. job_work reads
 * only job->prep (immutable) and writes only job->artifact / job->err.
 * Waiting calls hold their handler reference until the job replies, so a
 * client that disconnects frees nothing the job still needs, and the
 * compile runs on for the others (and is stored either way).
 *
 * The reply is the packed CompileResponse followed by the manifest as raw
 * field 4: the manifest is stored encoded and is never decoded on a hit.
 */
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include <grpc/byte_buffer.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"

#define JOB_STATES(X) X(REMOTE) X(QUEUED) X(COMPILING) X(AUTOTUNING) X(STORING) X(DONE) X(FAILED)

typedef enum job_state {
#define JOB_STATE_ENUM(name) JOB_##name,
  JOB_STATES(JOB_STATE_ENUM)
#undef JOB_STATE_ENUM
} job_state;

static const char *const job_state_names[] = {
#define JOB_STATE_NAME(name) #name,
    JOB_STATES(JOB_STATE_NAME)
#undef JOB_STATE_NAME
};

typedef struct tccd_job {
  tccd_state *st;
  _Atomic int state;              /* job_state; see the drawing above */
  tcc_prepared *prep;
  uint8_t *request_meta;          /* encoded CompileRequest{target, options} */
  size_t request_meta_len;
  uint8_t *request;               /* the request to keep with the entry (warm runs), or NULL */
  size_t request_len;
  tccd_job_end_fn on_end;         /* a detached job's (warm run's) caller; NULL for calls */
  void *on_end_arg;
  uint64_t warm_id;               /* the warm run that started it (Jobs), or 0 */
  uv_work_t work;
  int rc;                         /* tcc_compile's result */
  tcc_error err;
  tcc_artifact artifact;
  tcc_cache_entry entry;          /* what is stored and replied; its pointers
                                   * borrow prep, artifact and request_meta,
                                   * or are owned (entry_owned: a remote hit) */
  int entry_owned;
  uint8_t *remote_artifact;       /* a remote hit's artifact bytes */
  size_t remote_artifact_len;
  tccd_remote_flight *flight;     /* REMOTE: the cluster lookup */
  int remote_locked;              /* compiling under the cluster lock */
  char remote_token[33];
  Tcc__V1__Timings timings;       /* the first caller's decode/hash/lookup */
  tccd_call *waiters;             /* first = the call that started the job */
  tccd_call **waiters_tail;
  int nwaiters;
  tccd_tune *tune;                /* AUTOTUNING: the run (autotune.c) */
  uint64_t start_ns;              /* created (for the Jobs RPC) */
  uint64_t queued_ns;             /* handed to the pool (loop) */
  uint64_t started_ns;            /* a worker picked it up (written by the worker) */
  int64_t held;                   /* request bytes admitted (compile_request) */
  struct tccd_job *next;          /* in its hash bucket */
} tccd_job;

#define JOB_BUCKETS 256
#define TRIM_AFTER_BYTES (64 << 20) /* held bytes worth a malloc_trim after */

/* A graph whose compile ran past --compile-timeout-ms: answered
 * DEADLINE_EXCEEDED at once until `until_ns`; each further timeout doubles
 * the wait (2x the timeout first, at most BACKOFF_MAX_MS). A success
 * forgets it. Kept in memory only: a restart forgets them all. */
typedef struct tccd_backoff {
  uint8_t hash[TCC_SHA256_BYTES];
  uint64_t until_ns;
  int64_t wait_ms;
  int timeouts;
  struct tccd_backoff *next;
} tccd_backoff;

#define BACKOFF_MAX_MS (3600 * 1000LL)
#define BACKOFF_MAX_ENTRIES 4096

typedef struct tccd_jobs {
  tccd_job *buckets[JOB_BUCKETS];
  tccd_backoff *backoffs[JOB_BUCKETS];
  int nbackoffs;
  uint8_t (*verified)[TCC_SHA256_BYTES]; /* VERIFIED_SLOTS digests of entries checked */
  int64_t held_bytes;             /* admitted request bytes (x HELD_PER_BYTE) */
  int64_t held_peak;              /* since the last malloc_trim */
  int trims_due;                  /* malloc_trims still to run after a burst */
  int64_t in_pool;                /* handed to uv_queue_work, not yet done */
  char object_dir[4200];          /* the object cache (build.object_dir) */
  _Atomic int64_t running;        /* in COMPILING (workers update it) */
  tcc_build_options build;
} tccd_jobs;

/* The allowed moves of the drawing; anything else is a bug. */
static int job_transition_allowed(job_state from, job_state to) {
  switch (from) {
  case JOB_REMOTE: return to == JOB_QUEUED || to == JOB_STORING || to == JOB_FAILED;
  case JOB_QUEUED: return to == JOB_COMPILING || to == JOB_FAILED;
  case JOB_COMPILING: return to == JOB_STORING || to == JOB_AUTOTUNING || to == JOB_FAILED;
  case JOB_AUTOTUNING: return to == JOB_STORING || to == JOB_FAILED;
  case JOB_STORING: return to == JOB_DONE || to == JOB_FAILED;
  case JOB_DONE: case JOB_FAILED: return 0;
  }
  return 0;
}

static void job_set_state(struct tccd_job *job, job_state to);

/* ------------------------------------------------------------ job table */

static tccd_job **bucket_of(tccd_jobs *jobs, const uint8_t hash[TCC_SHA256_BYTES]) {
  return &jobs->buckets[hash[0]];
}

static tccd_job *job_find(tccd_jobs *jobs, const uint8_t hash[TCC_SHA256_BYTES]) {
  for (tccd_job *j = *bucket_of(jobs, hash); j; j = j->next)
    if (memcmp(j->prep->hash, hash, TCC_SHA256_BYTES) == 0) return j;
  return NULL;
}

static void job_unlink(tccd_jobs *jobs, tccd_job *job) {
  for (tccd_job **p = bucket_of(jobs, job->prep->hash); *p; p = &(*p)->next) {
    if (*p == job) {
      *p = job->next;
      return;
    }
  }
}

static void job_add_waiter(tccd_job *job, tccd_call *c) {
  c->next_waiter = NULL;
  *job->waiters_tail = c;
  job->waiters_tail = &c->next_waiter;
  job->nwaiters++;
}

/* A line about a job: the context of its first waiter (the call that
 * started it), its guard hash, and its queue and compile times once
 * known. */
static void job_log(const tccd_job *job, tccd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void job_log(const tccd_job *job, tccd_log_level level, const char *fmt, ...) {
  if (!tccd_log_enabled(level)) return;
  tccd_log_ctx ctx = TCCD_LOG_CTX_INIT;
  if (job->waiters) ctx = tccd_call_log_ctx(job->waiters);
  ctx.guard_hash = job->prep->hash_hex;
  if (job->started_ns) ctx.queue_ms = (double)(job->started_ns - job->queued_ns) / 1e6;
  if (job->artifact.compile_ms > 0) ctx.compile_ms = job->artifact.compile_ms;
  va_list ap;
  va_start(ap, fmt);
  tccd_log_fieldsv(level, &ctx, fmt, ap);
  va_end(ap);
}

static void job_set_state(tccd_job *job, job_state to) {
  job_state from = (job_state)atomic_load(&job->state);
  if (!job_transition_allowed(from, to)) {
    log_error("compile job %.12s: illegal state change %s -> %s", job->prep->hash_hex,
              job_state_names[from], job_state_names[to]);
    assert(!"illegal compile job state change");
  }
  atomic_store(&job->state, (int)to);
}

static void release_bytes(tccd_state *st, int64_t *held);

static void job_free(tccd_job *job) {
  tccd_state *st = job->st;
  int64_t held = job->held;
  if (job->on_end) {
    job_state state = (job_state)atomic_load(&job->state);
    int rc = state == JOB_DONE ? 0 : job->rc ? job->rc : TCC_E_UNKNOWN;
    job->on_end(job->on_end_arg, rc, rc == 0 ? "" : job->err.msg[0] ? job->err.msg : tcc_status_name(rc));
  }
  if (job->entry_owned) tcc_cache_entry_clear(&job->entry);
  free(job->remote_artifact);
  tcc_prepared_free(job->prep);
  tcc_artifact_free(&job->artifact);
  free(job->request_meta);
  free(job->request);
  free(job);
  if (held) release_bytes(st, &held); /* last: a trim then finds it all freed */
}

int tccd_jobs_init(tccd_state *st) {
  tccd_jobs *jobs = calloc(1, sizeof *jobs);
  if (!jobs) return -1;
  jobs->build.cc = st->cfg->cc;
  jobs->build.timeout_ms = st->cfg->compile_timeout_ms;
  jobs->build.identity = st->identity;
  if (st->cfg->object_cache_max_bytes > 0) {
    snprintf(jobs->object_dir, sizeof jobs->object_dir, "%s/objects", st->cfg->cache_dir);
    jobs->build.object_dir = jobs->object_dir;
    jobs->build.object_max_bytes = st->cfg->object_cache_max_bytes;
  }
  st->jobs = jobs;
  return 0;
}

void tccd_jobs_free(tccd_state *st) {
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_backoff *o = st->jobs->backoffs[b], *next; o; o = next) {
      next = o->next;
      free(o);
    }
  free(st->jobs->verified);
  free(st->jobs);
  st->jobs = NULL;
}

void tccd_jobs_stats(const tccd_state *st, tccd_job_stats *out) {
  out->running = atomic_load(&st->jobs->running);
  out->queued = st->jobs->in_pool - out->running;
  out->autotuning = 0;
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_job *j = st->jobs->buckets[b]; j; j = j->next)
      out->autotuning += atomic_load(&j->state) == JOB_AUTOTUNING;
}

/* ------------------------------------------------------------ timeouts */

static tccd_backoff **backoff_slot(tccd_jobs *jobs, const uint8_t hash[TCC_SHA256_BYTES]) {
  tccd_backoff **p = &jobs->backoffs[hash[0]];
  while (*p && memcmp((*p)->hash, hash, TCC_SHA256_BYTES) != 0) p = &(*p)->next;
  return p;
}

/* Drops every backoff that ended at least BACKOFF_MAX_MS ago (its graph
 * would start again from the first wait anyway). */
static void backoff_prune(tccd_jobs *jobs, uint64_t now) {
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_backoff **p = &jobs->backoffs[b]; *p;) {
      tccd_backoff *o = *p;
      if (now > o->until_ns + (uint64_t)BACKOFF_MAX_MS * 1000000) {
        *p = o->next;
        free(o);
        jobs->nbackoffs--;
      } else {
        p = &o->next;
      }
    }
}

/* A compile of hash ran past the timeout: start or double its backoff. */
static void backoff_note_timeout(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES]) {
  tccd_jobs *jobs = st->jobs;
  uint64_t now = uv_hrtime();
  tccd_backoff **p = backoff_slot(jobs, hash), *o = *p;
  if (!o) {
    if (jobs->nbackoffs >= BACKOFF_MAX_ENTRIES) backoff_prune(jobs, now);
    if (jobs->nbackoffs >= BACKOFF_MAX_ENTRIES || !(o = calloc(1, sizeof *o))) return;
    memcpy(o->hash, hash, TCC_SHA256_BYTES);
    o->next = jobs->backoffs[hash[0]];
    jobs->backoffs[hash[0]] = o;
    jobs->nbackoffs++;
    o->wait_ms = 2LL * st->cfg->compile_timeout_ms;
  } else {
    o->wait_ms *= 2;
  }
  if (o->wait_ms < 1000) o->wait_ms = 1000;
  if (o->wait_ms > BACKOFF_MAX_MS) o->wait_ms = BACKOFF_MAX_MS;
  o->timeouts++;
  o->until_ns = now + (uint64_t)o->wait_ms * 1000000;
}

static void backoff_forget(tccd_jobs *jobs, const uint8_t hash[TCC_SHA256_BYTES]) {
  tccd_backoff **p = backoff_slot(jobs, hash), *o = *p;
  if (!o) return;
  *p = o->next;
  free(o);
  jobs->nbackoffs--;
}

/* Fills err and returns 1 while hash is backing off after a timeout. */
static int backoff_active(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const char *hash_hex,
                          tcc_error *err) {
  tccd_backoff *o = *backoff_slot(st->jobs, hash);
  uint64_t now = uv_hrtime();
  if (!o || now >= o->until_ns) return 0;
  tcc_error_set(err, TCC_E_DEADLINE_EXCEEDED,
                "the compile of guard hash %s ran past --compile-timeout-ms (%d ms) %d time(s); it is not "
                "tried again for another %.0f s",
                hash_hex, st->cfg->compile_timeout_ms, o->timeouts, (double)(o->until_ns - now) / 1e9);
  return 1;
}

/* ------------------------------------------------------------ integrity */

/* Every entry is verified before it is first answered HIT by this
 * process: its signature (when the daemon signs: an edited manifest or
 * digest no longer verifies) and its artifact's bytes against the digest.
 * What passed is remembered by a digest of everything the reply carries
 * (hash, artifact digest, manifest, signature), in a direct-mapped table
 * of VERIFIED_SLOTS: an entry edited in cache.db later has another digest
 * and is verified again; one pushed out of the table too. The artifact's
 * bytes are read once per process and entry (a blob corrupted later is
 * still refused by every Fetch and by the client's digest check). */
#define VERIFIED_SLOTS 8192

static void entry_digest(const tcc_cache_entry *e, uint8_t out[TCC_SHA256_BYTES]) {
  tcc_sha256_ctx ctx;
  tcc_sha256_init(&ctx);
  tcc_sha256_update(&ctx, e->hash, TCC_SHA256_BYTES);
  tcc_sha256_update(&ctx, e->artifact_sha256, TCC_SHA256_BYTES);
  tcc_sha256_update(&ctx, e->manifest, e->manifest_len);
  tcc_sha256_update(&ctx, e->signature, e->signature_len);
  tcc_sha256_update(&ctx, e->key_id, strlen(e->key_id));
  tcc_sha256_final(&ctx, out);
}

/* Returns 0 when e may be answered HIT, else the reason in err (the
 * caller removes the entry and compiles instead). */
static int entry_verify(tccd_state *st, const tcc_cache_entry *e, tcc_error *err) {
  tccd_jobs *jobs = st->jobs;
  uint8_t d[TCC_SHA256_BYTES];
  entry_digest(e, d);
  uint32_t slot = ((uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16) % VERIFIED_SLOTS;
  if (jobs->verified && memcmp(jobs->verified[slot], d, TCC_SHA256_BYTES) == 0) return 0;
  int rc = 0;
  if (st->signing_key)
    rc = tcc_artifact_verify(&st->trusted, e->key_id, e->hash, e->artifact_sha256, e->manifest, e->manifest_len,
                             e->signature, e->signature_len, err);
  if (rc == 0) {
    uint8_t *data = NULL;
    size_t len = 0;
    rc = tcc_cache_read_artifact(st->cache, e->artifact_sha256, &data, &len, err);
    free(data);
    if (rc == 0 && (int64_t)len != e->size)
      rc = tcc_error_set(err, TCC_E_DATA_LOSS, "the entry says %lld bytes, its artifact has %zu",
                         (long long)e->size, len);
  }
  if (rc != 0) return rc;
  if (!jobs->verified) jobs->verified = calloc(VERIFIED_SLOTS, TCC_SHA256_BYTES);
  if (jobs->verified) memcpy(jobs->verified[slot], d, TCC_SHA256_BYTES);
  return 0;
}

/* ------------------------------------------------------------ replies */

/* Answers a call with entry e (hash, kind, digest, size, manifest,
 * signature and key id are used). */
static void reply_entry(tccd_call *c, const tcc_cache_entry *e, Tcc__V1__CacheStatus status,
                        const Tcc__V1__Timings *timings) {
  char hash_hex[TCC_SHA256_HEX], sha_hex[TCC_SHA256_HEX];
  tcc_hex_encode(e->hash, TCC_SHA256_BYTES, hash_hex);
  tcc_hex_encode(e->artifact_sha256, TCC_SHA256_BYTES, sha_hex);
  const uint8_t *manifest = e->manifest;
  size_t manifest_len = e->manifest_len;

  Tcc__V1__Artifact artifact = TCC__V1__ARTIFACT__INIT;
  artifact.kind = (Tcc__V1__ArtifactKind)e->kind;
  artifact.sha256 = sha_hex;
  artifact.size = e->size;
  artifact.signature.data = (uint8_t *)e->signature;
  artifact.signature.len = e->signature_len;
  artifact.key_id = (char *)e->key_id;
  Tcc__V1__Timings t = *timings;
  t.total_ms = tccd_call_elapsed_ms(c);
  Tcc__V1__CompileResponse resp = TCC__V1__COMPILE_RESPONSE__INIT;
  resp.guard_hash = hash_hex;
  resp.cache = status;
  resp.artifact = &artifact;
  resp.timings = &t;

  /* packed response + field 4 (manifest, length-delimited) appended */
  size_t head = protobuf_c_message_get_packed_size(&resp.base);
  uint8_t *buf = malloc(head + 11 + manifest_len);
  if (!buf) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory building the reply");
    return;
  }
  size_t n = protobuf_c_message_pack(&resp.base, buf);
  buf[n++] = (4 << 3) | 2;
  size_t v = manifest_len;
  do {
    buf[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    v >>= 7;
  } while (v);
  memcpy(buf + n, manifest, manifest_len);
  n += manifest_len;
  tccd_call_reply_bytes(c, buf, n);
  free(buf);
}

static void reply_error_to_waiters(tccd_job *job, int code, const char *msg) {
  tccd_call *c = job->waiters;
  job->waiters = NULL;
  job->waiters_tail = &job->waiters;
  while (c) {
    tccd_call *next = c->next_waiter;
    tccd_call_fail(c, code, "%s", msg);
    c = next;
  }
}

/* ------------------------------------------------------------ the job */

static void job_work(uv_work_t *w) {
  tccd_job *job = w->data;
  tccd_jobs *jobs = job->st->jobs;
  /* worker thread: touch nothing but the job's own compile fields, its
   * atomic state and the atomic running count */
  job->started_ns = uv_hrtime();
  job_set_state(job, JOB_COMPILING);
  atomic_fetch_add(&jobs->running, 1);
  job->rc = tcc_compile(job->prep, &jobs->build, &job->artifact, &job->err);
  atomic_fetch_sub(&jobs->running, 1);
}

/* Fills job->entry from the compiled artifact and signs it (when the
 * daemon has a key). Its pointers borrow the job's buffers. */
static void job_entry_fill(tccd_job *job) {
  tccd_state *st = job->st;
  tcc_cache_entry *e = &job->entry;
  memset(e, 0, sizeof *e);
  memcpy(e->hash, job->prep->hash, TCC_SHA256_BYTES);
  e->key = job->prep->key;
  e->key_len = job->prep->key_len;
  snprintf(e->target, sizeof e->target, "%s", job->prep->target);
  e->kind = job->artifact.kind;
  e->manifest = job->artifact.manifest;
  e->manifest_len = job->artifact.manifest_len;
  e->request_meta = job->request_meta;
  e->request_meta_len = job->request_meta_len;
  e->request = job->request;
  e->request_len = job->request_len;
  memcpy(e->artifact_sha256, job->artifact.sha256, TCC_SHA256_BYTES);
  e->size = (int64_t)job->artifact.size;
  e->kernels = job->artifact.kernels;
  e->compile_ms = job->artifact.compile_ms;
  if (st->signing_key) {
    tcc_artifact_sign(st->signing_key, e->hash, e->artifact_sha256, e->manifest, e->manifest_len,
                      e->signature);
    e->signature_len = TCC_SIGNATURE_BYTES;
    memcpy(e->key_id, st->signing_key->key_id, sizeof e->key_id);
  }
}

/* ------------------------------------------------------------ a full disk
 *
 * A store that fails for lack of space (RESOURCE_EXHAUSTED: SQLite's
 * FULL) evicts a tenth of the cache by value, or three reserves' worth if
 * that is more (the reserve pays for the deletions on a full disk and is
 * made again from what they free: cache.c), and tries once more. If that fails
 * too, storing is *blocked*: misses are answered RESOURCE_EXHAUSTED at
 * once instead of being compiled and thrown away, and Stats says why.
 * Housekeeping unblocks once the disk has room again
 * (tccd_store_check), and so does a successful `tcctl gc` or `evict`. */
#define STORE_UNBLOCK_FREE_BYTES (32 << 20)

static void store_block(tccd_state *st, const char *why) {
  if (!st->store_blocked) log_error("cache: storing is blocked until there is disk space again: %s", why);
  st->store_blocked = 1;
  snprintf(st->store_blocked_reason, sizeof st->store_blocked_reason, "%.500s", why);
}

void tccd_store_unblock(tccd_state *st, const char *why) {
  if (!st->store_blocked) return;
  st->store_blocked = 0;
  st->store_blocked_reason[0] = '\0';
  log_info("cache: storing again (%s)", why);
}

void tccd_store_check(tccd_state *st) {
  if (!st->store_blocked) return;
  struct statvfs vfs;
  if (statvfs(st->cfg->cache_dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize >= STORE_UNBLOCK_FREE_BYTES)
    tccd_store_unblock(st, "the disk has room again");
}

static void job_store(tccd_job *job) {
  tccd_state *st = job->st;
  job_entry_fill(job);
  tcc_error err;
  int rc = tcc_cache_store(st->cache, &job->entry, job->artifact.data, job->artifact.size, &err);
  if (rc == TCC_E_RESOURCE_EXHAUSTED) {
    tcc_cache_stats cs;
    tcc_cache_gc_result gr = {0};
    tcc_error gerr;
    if (tcc_cache_stats_get(st->cache, &cs, &gerr) != 0) cs.bytes = 0;
    int64_t room = cs.bytes / 10 > 3LL * TCC_CACHE_RESERVE_BYTES ? cs.bytes / 10 : 3LL * TCC_CACHE_RESERVE_BYTES;
    if (cs.bytes > 0 &&
        tcc_cache_gc_finish(st->cache, cs.bytes - room > 0 ? cs.bytes - room : 1, NULL, 0, &gr, &gerr) == 0)
      log_warn("cache: a store failed for lack of space (%s); evicted %lld entries (%lld bytes)", err.msg,
               (long long)gr.evicted, (long long)gr.freed_bytes);
    rc = tcc_cache_store(st->cache, &job->entry, job->artifact.data, job->artifact.size, &err);
    if (rc == TCC_E_RESOURCE_EXHAUSTED) store_block(st, err.msg);
  }
  if (rc != 0) {
    job->rc = err.code;
    tcc_error_set(&job->err, err.code, "compiled, but could not store the artifact: %s", err.msg);
  }
}

/* Failure classes. Deterministic: what the same graph, compiler and
 * target would meet again (an op the back end cannot lower, the C
 * compiler's diagnostic about the source): recorded in the negative cache
 * for --failure-ttl, locally and in Redis. Everything else is transient
 * (the compiler killed by a signal or missing, out of memory or disk,
 * NVRTC's internal errors: common/tcc_spawn.c's table; timeouts; a store that
 * failed) and never recorded; a timeout starts a backoff instead. */
static int failure_is_deterministic(int code) {
  return code == TCC_E_UNIMPLEMENTED || code == TCC_E_INTERNAL || code == TCC_E_INVALID_ARGUMENT ||
         code == TCC_E_OUT_OF_RANGE;
}

/* Drops the cluster lock this job holds (a compile that failed or never
 * ran), so another daemon may try. */
static void job_release_lock(tccd_job *job) {
  if (!job->remote_locked) return;
  tccd_remote_release(job->st, job->prep->hash, job->remote_token);
  job->remote_locked = 0;
}

/* `compiled`: the compile itself failed (not the store after it), so a
 * deterministic failure may be recorded for next time. */
static void job_fail(tccd_job *job, int compiled) {
  tccd_state *st = job->st;
  job_set_state(job, JOB_FAILED);
  tcc_cache_count(st->cache, TCC_COUNTER_compile_failures, 1);
  if (job->rc == TCC_E_CANCELLED && st->draining) {
    job->rc = TCC_E_UNAVAILABLE;
    tcc_error_prefix(&job->err, "tccd is shutting down");
  }
  int deterministic = compiled && failure_is_deterministic(job->rc);
  job_log(job, TCCD_LOG_WARN, "compile %.12s failed (%s, %s): %s", job->prep->hash_hex, tcc_status_name(job->rc),
           deterministic ? "deterministic" : "transient", job->err.msg);
  if (deterministic && st->cfg->failure_ttl_s > 0) {
    tcc_error serr;
    if (tcc_cache_store_failure(st->cache, job->prep->hash, job->prep->key, job->prep->key_len,
                                job->prep->target, job->rc, job->err.msg, &serr) != 0)
      log_warn("could not record the failure: %s", serr.msg);
    /* shared with the cluster too, dropping the cluster lock if ours */
    tccd_remote_publish_failure(st, job->prep->hash, job->prep->key, job->prep->key_len, job->prep->target,
                                job->rc, job->err.msg, job->remote_locked ? job->remote_token : NULL);
    job->remote_locked = 0;
  } else if (!deterministic) {
    if (compiled && job->rc == TCC_E_DEADLINE_EXCEEDED) backoff_note_timeout(st, job->prep->hash);
    tcc_error_prefix(&job->err, "transient failure, not cached; a retry may succeed");
  }
  reply_error_to_waiters(job, job->rc, job->err.msg);
  job_release_lock(job);
}

static void job_succeed(tccd_job *job) {
  job_set_state(job, JOB_DONE);
  backoff_forget(job->st->jobs, job->prep->hash);
  job_log(job, TCCD_LOG_INFO, "compile %.12s %s: %d kernel(s), %zu bytes, %.1f ms, %d waiter(s)",
           job->prep->hash_hex, job->prep->target, job->artifact.kernels, job->artifact.size,
           job->artifact.compile_ms, job->nwaiters);
  /* the first caller compiled (compile_ms); the others waited on its
   * compile (original_compile_ms, compile_ms 0) */
  Tcc__V1__Timings t = job->timings;
  t.compile_ms = job->artifact.compile_ms;
  Tcc__V1__CacheStatus status_of = TCC__V1__CACHE_STATUS__MISS;
  for (tccd_call *c = job->waiters, *next; c; c = next) {
    next = c->next_waiter;
    reply_entry(c, &job->entry, status_of, &t);
    status_of = TCC__V1__CACHE_STATUS__COALESCED;
    t.compile_ms = 0;
    t.original_compile_ms = job->artifact.compile_ms;
  }
  /* write through: entry + artifact, dropping the cluster lock if ours */
  tccd_remote_publish(job->st, &job->entry, job->artifact.data, job->artifact.size,
                      job->remote_locked ? job->remote_token : NULL);
  job->remote_locked = 0;
}

/* STORING, then DONE (or FAILED when the store fails). */
static void job_store_and_reply(tccd_job *job) {
  job_set_state(job, JOB_STORING);
  job_store(job);
  if (job->rc != 0) job_fail(job, 0);
  else job_succeed(job);
}

/* Shutdown cut a max-autotune job short: its waiters (if any are left)
 * get UNAVAILABLE and nothing is stored, so the graph is compiled and
 * tuned again after the restart. Frees the job. */
static void job_end_unstored(tccd_job *job) {
  job->rc = TCC_E_UNAVAILABLE;
  job_set_state(job, JOB_FAILED);
  job_log(job, TCCD_LOG_INFO, "compile %.12s: tccd is shutting down before its autotune finished; nothing stored",
          job->prep->hash_hex);
  reply_error_to_waiters(job, TCC_E_UNAVAILABLE, "tccd is shutting down; the autotune did not finish and nothing was stored");
  job_release_lock(job);
  job_free(job);
}

/* Back on the loop: the tuning run ended (autotune.c). A tuned artifact
 * replaces the default one; the time spent tuning counts as compile time. */
static void job_tuned(void *arg, tcc_artifact *tuned, double autotune_ms) {
  tccd_job *job = arg;
  job->tune = NULL;
  if (job->st->draining) { /* a tuning run cut short: nothing under the tuned key */
    tcc_artifact_free(tuned);
    job_unlink(job->st->jobs, job);
    job_end_unstored(job);
    return;
  }
  double ms = job->artifact.compile_ms + autotune_ms;
  if (tuned->data) {
    tcc_artifact_free(&job->artifact);
    job->artifact = *tuned;
    memset(tuned, 0, sizeof *tuned);
  }
  job->artifact.compile_ms = ms;
  job_unlink(job->st->jobs, job);
  job_store_and_reply(job);
  job_free(job);
}

/* A compile succeeded: counted, and its time observed. */
static void job_count_compile(tccd_job *job) {
  tcc_cache_count(job->st->cache, TCC_COUNTER_compiles, 1);
  tcc_cache_count(job->st->cache, TCC_COUNTER_object_hits, job->artifact.bodies_reused);
  tcc_cache_count(job->st->cache, TCC_COUNTER_object_misses, job->artifact.bodies - job->artifact.bodies_reused);
  tccd_metrics_observe(job->st, TCCD_HIST_COMPILE, job->artifact.compile_ms / 1000.0);
}

/* Back on the loop: the worker finished (or the job was cancelled). */
static void job_done(uv_work_t *w, int status) {
  tccd_job *job = w->data;
  tccd_state *st = job->st;
  tccd_jobs *jobs = st->jobs;
  jobs->in_pool--;
  if (status != UV_ECANCELED) /* the worker's writes are visible here: libuv hands over under a lock */
    tccd_metrics_observe(st, TCCD_HIST_QUEUE_WAIT, (double)(job->started_ns - job->queued_ns) / 1e9);
  if (status != UV_ECANCELED && job->rc == 0 && tccd_autotune_wanted(job->prep) && st->draining) {
    job_unlink(jobs, job); /* never tuned: stored under the max-autotune key it would stay untuned */
    job_end_unstored(job);
    return;
  }
  if (status != UV_ECANCELED && job->rc == 0 && tccd_autotune_wanted(job->prep)) {
    job_count_compile(job);
    job_set_state(job, JOB_AUTOTUNING);
    job->tune = tccd_autotune_start(st, job->prep, job_tuned, job);
    if (job->tune) return; /* job_tuned goes on; the job stays in the table */
    job_unlink(jobs, job);
    job_store_and_reply(job);
    job_free(job);
    return;
  }
  job_unlink(jobs, job);

  if (status == UV_ECANCELED) {
    job->rc = TCC_E_UNAVAILABLE;
    job_set_state(job, JOB_FAILED);
    reply_error_to_waiters(job, TCC_E_UNAVAILABLE, "tccd is shutting down; the compile was not started");
    job_release_lock(job);
  } else if (job->rc != 0) {
    job_fail(job, 1);
  } else {
    job_count_compile(job);
    job_store_and_reply(job);
  }
  job_free(job);
}

/* Hands the job to the pool (--workers threads, UV_THREADPOOL_SIZE): a
 * miss, counted here (a remote hit is not one). */
static void job_start(tccd_state *st, tccd_job *job) {
  tccd_jobs *jobs = st->jobs;
  job->work.data = job;
  if (atomic_load(&job->state) == JOB_REMOTE) job_set_state(job, JOB_QUEUED);
  jobs->in_pool++;
  job->queued_ns = uv_hrtime();
  if (!job->on_end) tcc_cache_count(st->cache, TCC_COUNTER_misses, 1); /* a warm run's compile is no miss */
  int rc = uv_queue_work(st->loop, &job->work, job_work, job_done);
  assert(rc == 0);
  (void)rc;
}

/* Ends a job that never reached the pool (REMOTE): unlinks and frees it. */
static void job_end_early(tccd_job *job, int code, const char *msg) {
  job_unlink(job->st->jobs, job);
  job->rc = code;
  tcc_error_set(&job->err, code, "%s", msg);
  job_set_state(job, JOB_FAILED);
  reply_error_to_waiters(job, code, msg);
  job_release_lock(job);
  job_free(job);
}

/* The remote tier answered a REMOTE job (remote.c): a verified entry is
 * stored locally and answered (REMOTE_HIT, then COALESCED); otherwise the
 * job is compiled here. */
static void job_remote_done(void *arg, tccd_remote_result *res) {
  tccd_job *job = arg;
  tccd_state *st = job->st;
  job->flight = NULL;
  if (res->failed) { /* another daemon's recorded failure: the same error, no compile */
    tcc_error serr;
    if (tcc_cache_store_failure(st->cache, job->prep->hash, job->prep->key, job->prep->key_len, job->prep->target,
                                res->fail_code, res->fail_message, &serr) != 0)
      log_warn("could not record the remote failure: %s", serr.msg);
    tcc_cache_count(st->cache, TCC_COUNTER_negative_hits, 1);
    job_log(job, TCCD_LOG_INFO, "compile %.12s: a failure recorded by another daemon answered again",
            job->prep->hash_hex);
    char msg[TCC_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%.700s (recorded failure for guard hash %s, shared through the remote tier)",
             res->fail_message, job->prep->hash_hex);
    job_end_early(job, res->fail_code, msg);
    return;
  }
  if (!res->hit) {
    job->remote_locked = res->locked;
    memcpy(job->remote_token, res->token, sizeof job->remote_token);
    if (st->jobs->in_pool >= (int64_t)st->cfg->workers + st->cfg->queue_max) {
      job_end_early(job, TCC_E_RESOURCE_EXHAUSTED, "compile queue full; retry later");
      return;
    }
    job_log(job, TCCD_LOG_DEBUG, "compile %.12s: not in the remote tier%s; compiling here", job->prep->hash_hex,
              res->locked ? " (cluster lock taken)" : "");
    job_start(st, job);
    return;
  }
  job->entry = res->entry; /* ownership moves to the job */
  job->entry_owned = 1;
  job->entry.imported = 1;
  job->remote_artifact = res->artifact;
  job->remote_artifact_len = res->artifact_len;
  job_set_state(job, JOB_STORING);
  tcc_error err;
  if (tcc_cache_store(st->cache, &job->entry, job->remote_artifact, job->remote_artifact_len, &err) != 0) {
    job_log(job, TCCD_LOG_WARN, "compile %.12s: could not store the remote entry: %s", job->prep->hash_hex, err.msg);
    job_end_early(job, err.code, err.msg);
    return;
  }
  tccd_remote_touch(st, job->prep->hash);
  tcc_cache_count(st->cache, TCC_COUNTER_remote_hits, 1);
  job_unlink(st->jobs, job);
  job_set_state(job, JOB_DONE);
  job_log(job, TCCD_LOG_INFO, "compile %.12s %s: remote hit%s (signed by %s), %d waiter(s)", job->prep->hash_hex,
           job->prep->target, res->waited ? " after waiting on another daemon" : "",
           job->entry.signature_len ? job->entry.key_id : "nobody", job->nwaiters);
  Tcc__V1__Timings t = job->timings;
  t.compile_ms = 0; /* compiled by another daemon */
  t.original_compile_ms = job->entry.compile_ms;
  Tcc__V1__CacheStatus status_of = TCC__V1__CACHE_STATUS__REMOTE_HIT;
  for (tccd_call *c = job->waiters, *next; c; c = next) {
    next = c->next_waiter;
    reply_entry(c, &job->entry, status_of, &t);
    status_of = TCC__V1__CACHE_STATUS__COALESCED;
  }
  job->waiters = NULL;
  job_free(job);
}

void tccd_jobs_cancel_queued(tccd_state *st) {
  tccd_jobs *jobs = st->jobs;
  for (int b = 0; b < JOB_BUCKETS; b++) {
    for (tccd_job *j = jobs->buckets[b], *next; j; j = next) {
      next = j->next;
      if (atomic_load(&j->state) == JOB_REMOTE) { /* asking Redis: never reached the pool */
        tccd_remote_cancel(j->flight);
        j->flight = NULL;
        job_end_early(j, TCC_E_UNAVAILABLE, "tccd is shutting down; the compile was not started");
      } else {
        uv_cancel((uv_req_t *)&j->work); /* fails for running work; fine */
      }
    }
  }
}

void tccd_jobs_abandon_waiters(tccd_state *st) {
  tccd_jobs *jobs = st->jobs;
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_job *j = jobs->buckets[b]; j; j = j->next)
      reply_error_to_waiters(j, TCC_E_UNAVAILABLE, "tccd is shutting down; the compile was cancelled");
}

void tccd_jobs_cancel_running(tccd_state *st) {
  (void)st;
  tcc_tools_cancel(); /* compilers and benchmark children die; their jobs fail, storing nothing */
}

/* ------------------------------------------------------------ Jobs */

/* The jobs in flight, oldest first: what `tcctl compile` shows while it
 * waits. Read-only. */
void tccd_rpc_jobs(tccd_state *st, tccd_call *c) {
  Tcc__V1__JobsRequest *req = (Tcc__V1__JobsRequest *)tccd_call_unpack(c, &tcc__v1__jobs_request__descriptor);
  if (!req) return;
  tcc__v1__jobs_request__free_unpacked(req, NULL);
  size_t n = 0;
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_job *j = st->jobs->buckets[b]; j; j = j->next) n++;
  Tcc__V1__JobInfo *infos = calloc(n + 1, sizeof *infos);
  Tcc__V1__JobInfo **ptrs = calloc(n + 1, sizeof *ptrs);
  if (!infos || !ptrs) {
    free(infos);
    free(ptrs);
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  size_t i = 0;
  for (int b = 0; b < JOB_BUCKETS; b++)
    for (tccd_job *j = st->jobs->buckets[b]; j; j = j->next, i++) {
      Tcc__V1__JobInfo *ji = &infos[i];
      tcc__v1__job_info__init(ji);
      ji->guard_hash = j->prep->hash_hex;
      ji->target = j->prep->target;
      ji->state = (char *)job_state_names[atomic_load(&j->state)];
      ji->elapsed_ms = tccd_ms_since(j->start_ns);
      ji->waiters = j->nwaiters;
      ji->warm_id = j->warm_id;
      int done = 0, total = 0;
      if (j->tune) tccd_autotune_progress(j->tune, &done, &total);
      ji->candidates_done = done;
      ji->candidates_total = total;
      ptrs[i] = ji;
    }
  /* oldest first */
  for (size_t a = 1; a < n; a++)
    for (size_t k = a; k > 0 && ptrs[k]->elapsed_ms > ptrs[k - 1]->elapsed_ms; k--) {
      Tcc__V1__JobInfo *tmp = ptrs[k];
      ptrs[k] = ptrs[k - 1];
      ptrs[k - 1] = tmp;
    }
  Tcc__V1__JobsResponse r = TCC__V1__JOBS_RESPONSE__INIT;
  r.n_jobs = n;
  r.jobs = ptrs;
  tccd_call_reply(c, &r.base);
  free(ptrs);
  free(infos);
}

/* ------------------------------------------------------------ the RPC */

/* May this daemon serve a stored entry? Without signing, anything; with
 * it, only entries signed by a key it trusts (its own or --trusted-keys):
 * unsigned entries (from --no-signing runs or schema v2) are recompiled. */
static int entry_servable(const tccd_state *st, const tcc_cache_entry *e) {
  if (!st->signing_key) return 1;
  if (e->signature_len != TCC_SIGNATURE_BYTES) return 0;
  for (size_t i = 0; i < st->trusted.n; i++)
    if (strcmp(st->trusted.keys[i].key_id, e->key_id) == 0) return 1;
  return 0;
}

/* Is a recorded failure still answered? For --failure-ttl after it was
 * recorded (0: never). An older one is compiled again (and recorded
 * again if it fails the same way). */
static int failure_fresh(const tccd_state *st, const tcc_cache_failure *f) {
  int64_t age = (int64_t)time(NULL) - f->created;
  return st->cfg->failure_ttl_s > 0 && age <= st->cfg->failure_ttl_s;
}

/* The request's target and options (request_meta, for `show`). NULL when
 * out of memory. The whole request an entry keeps for warm runs is the
 * bytes as they came (prepare_work): nothing to encode on a hit. */
static uint8_t *encode_request_meta(const Tcc__V1__CompileRequest *req, size_t *len) {
  Tcc__V1__CompileRequest meta = TCC__V1__COMPILE_REQUEST__INIT;
  meta.target = req->target;
  meta.options = req->options;
  *len = protobuf_c_message_get_packed_size(&meta.base);
  uint8_t *buf = malloc(*len ? *len : 1);
  if (buf) protobuf_c_message_pack(&meta.base, buf);
  return buf;
}

/* One Compile call on its way to a job: its request message, then what
 * preparation made of it. */
typedef struct compile_request {
  tccd_state *st;
  tccd_call *c;
  grpc_byte_buffer *payload;      /* until read (prepare_work) */
  int64_t held;                   /* bytes admitted for it (admit_bytes) */
  tcc_prepared *prep;             /* NULL when preparation failed: err says why */
  uint8_t *request_meta;          /* encoded CompileRequest{target, options} */
  size_t request_meta_len;
  uint8_t *request;               /* the encoded request as it came (<= TCC_CACHE_REQUEST_MAX), or NULL */
  size_t request_len;
  tcc_error err;
  Tcc__V1__Timings t;
  char client[TCCD_CLIENT_LABEL_MAX + 1]; /* CompileRequest.client, cut (for logs) */
} compile_request;

/* Requests up to this size are prepared on the loop at once (a few tens
 * of microseconds); larger ones on an offload thread. */
#define INLINE_PREPARE_BYTES (64u << 10)

/* Memory admission: what a request holds, from its arrival until its
 * job ends, is estimated as HELD_PER_BYTE x its encoded size (decoded
 * message, canonical graph, key and the compiler's IR: measured ~5.5x on
 * a 256 MiB request). Past --request-memory-max the call gets
 * RESOURCE_EXHAUSTED at once. */
#define HELD_PER_BYTE 8

/* Admits n bytes of request (0 when it fits, else fills err). */
static int admit_bytes(tccd_state *st, size_t n, int64_t *held, tcc_error *err) {
  tccd_jobs *jobs = st->jobs;
  int64_t want = (int64_t)n * HELD_PER_BYTE;
  int64_t max = st->cfg->request_memory_max;
  if (max > 0 && jobs->held_bytes + want > max) {
    tcc_cache_count(st->cache, TCC_COUNTER_rejected_memory, 1);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED,
                         "request of %zu bytes not admitted: requests being prepared and compiled hold ~%lld "
                         "MiB and --request-memory-max is %lld MiB; retry later",
                         n, (long long)(jobs->held_bytes >> 20), (long long)(max >> 20));
  }
  jobs->held_bytes += want;
  if (jobs->held_bytes > jobs->held_peak) jobs->held_peak = jobs->held_bytes;
  *held = want;
  return 0;
}

static void trim_work(void *arg) {
  (void)arg;
  malloc_trim(0);
}

static void trim_done(void *arg, int cancelled) {
  (void)arg;
  (void)cancelled;
}

/* Gives admitted bytes back. When the last large request is gone, the
 * heap's free memory goes back to the system (malloc_trim, on an offload
 * thread: it walks the heap), so RSS returns to its baseline after a
 * burst. */
static void release_bytes(tccd_state *st, int64_t *held) {
  tccd_jobs *jobs = st->jobs;
  jobs->held_bytes -= *held;
  *held = 0;
  assert(jobs->held_bytes >= 0);
  if (jobs->held_bytes == 0 && jobs->held_peak >= (int64_t)TRIM_AFTER_BYTES) {
    jobs->held_peak = 0;
    jobs->trims_due = 3; /* now, and at the next two housekeeping ticks: gRPC frees its
                          * buffers of the last calls a little later */
    tccd_jobs_trim(st);
  }
}

void tccd_jobs_trim(tccd_state *st) {
  tccd_jobs *jobs = st->jobs;
  if (jobs->trims_due <= 0 || jobs->held_bytes > 0) return;
  jobs->trims_due--;
  tccd_offload_submit(st, trim_work, trim_done, NULL);
}

/* Any thread (the loop for small requests, an offload thread for large
 * ones): read, decode (the compiler's decoder, whose errors name the
 * field and byte offset), verify, canonicalize and hash. Touches only r
 * and the immutable identity. */
static void prepare_work(void *arg) {
  compile_request *r = arg;
  uint64_t t0 = uv_hrtime();
  uint8_t *bytes = NULL;
  size_t len = 0;
  Tcc__V1__CompileRequest *req = NULL;
  int rc = tccd_payload_read(r->payload, &bytes, &len, &r->err);
  if (r->payload) grpc_byte_buffer_destroy(r->payload);
  r->payload = NULL;
  if (rc == 0) rc = tcc_decode_request(bytes, len, &req, &r->err);
  if (rc == 0 && len <= TCC_CACHE_REQUEST_MAX) { /* kept with the entry should it miss (warm runs) */
    r->request = bytes;
    r->request_len = len;
  } else {
    free(bytes);
  }
  r->t.decode_ms = tccd_ms_since(t0);
  if (rc != 0) return;
  snprintf(r->client, sizeof r->client, "%s", req->client ? req->client : "");
  uint64_t t1 = uv_hrtime();
  if (tcc_prepare(req, r->st->identity, &r->prep, &r->err) == 0) {
    r->request_meta = encode_request_meta(req, &r->request_meta_len);
    if (!r->request_meta) {
      tcc_prepared_free(r->prep);
      r->prep = NULL;
      tcc_error_set(&r->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
  }
  r->t.hash_ms = tccd_ms_since(t1);
  tcc__v1__compile_request__free_unpacked(req, NULL);
}

static void compile_request_free(compile_request *r) {
  tccd_state *st = r->st;
  int64_t held = r->held;
  if (r->payload) grpc_byte_buffer_destroy(r->payload);
  tcc_prepared_free(r->prep);
  free(r->request_meta);
  free(r->request);
  free(r);
  if (held) release_bytes(st, &held);
}

/* A new job for a prepared request, linked into the table: it takes
 * *prep, *request_meta, *request and *held (each left NULL or 0). NULL
 * when out of memory (nothing taken). */
static tccd_job *job_create(tccd_state *st, tcc_prepared **prep, uint8_t **request_meta, size_t request_meta_len,
                            uint8_t **request, size_t request_len, int64_t *held, const Tcc__V1__Timings *t) {
  tccd_job *job = calloc(1, sizeof *job);
  if (!job) return NULL;
  job->st = st;
  job->prep = *prep;
  *prep = NULL;
  job->request_meta = *request_meta;
  job->request_meta_len = request_meta_len;
  *request_meta = NULL;
  job->request = *request;
  job->request_len = request_len;
  *request = NULL;
  job->held = *held;
  *held = 0;
  job->start_ns = uv_hrtime();
  if (t) job->timings = *t;
  else tcc__v1__timings__init(&job->timings);
  job->waiters_tail = &job->waiters;
  tccd_job **bucket = bucket_of(st->jobs, job->prep->hash);
  job->next = *bucket;
  *bucket = job;
  return job;
}

/* Sets a new job going: to the remote tier first (--redis; returns 1),
 * else to the pool (returns 0). */
static int job_begin(tccd_state *st, tccd_job *job) {
  if (st->remote) {
    atomic_store(&job->state, (int)JOB_REMOTE);
    job->flight = tccd_remote_begin(st, job->prep->hash, job->prep->key, job->prep->key_len, job_remote_done, job);
    if (job->flight) return 1;
  } else {
    atomic_store(&job->state, (int)JOB_QUEUED); /* a new job's first state */
  }
  job_start(st, job);
  return 0;
}

/* A servable, verified entry for hash? 0 (filled: clear it), or
 * TCC_E_NOT_FOUND (after dropping an entry that fails verification), or
 * another TCC_E_* code. `c` (may be NULL) is the call, for its log lines. */
static int lookup_servable(tccd_state *st, tccd_call *c, const tcc_prepared *prep, tcc_cache_entry *entry,
                           tcc_error *err) {
  int rc = tcc_cache_lookup(st->cache, prep->hash, prep->key, prep->key_len, entry, err);
  if (rc == 0 && !entry_servable(st, entry)) {
    if (c)
      tccd_call_log(TCCD_LOG_INFO, c, "cache entry %.12s is %s; compiling it again to serve a signed artifact",
                    prep->hash_hex, entry->signature_len ? "signed by a key this daemon does not trust" : "unsigned");
    tcc_cache_entry_clear(entry);
    rc = tcc_error_set(err, TCC_E_NOT_FOUND, "unsigned entry");
  }
  if (rc == 0 && entry_verify(st, entry, err) != 0) {
    log_warn("cache entry %.12s fails verification (%s); removed, compiling it again", prep->hash_hex, err->msg);
    tcc_cache_count(st->cache, TCC_COUNTER_corrupt_entries, 1);
    tcc_error eerr;
    tcc_cache_evict(st->cache, prep->hash, &eerr); /* may be gone already with its blob */
    tcc_cache_entry_clear(entry);
    rc = TCC_E_NOT_FOUND;
  }
  return rc;
}

int tccd_compile_detached(tccd_state *st, tcc_prepared *prep, uint8_t *request, size_t request_len,
                          uint64_t warm_id, tccd_job_end_fn on_end, void *arg, tcc_error *err) {
  tcc_cache_entry entry;
  uint8_t *meta = NULL;
  int rc = lookup_servable(st, NULL, prep, &entry, err);
  if (rc == 0) {
    tcc_cache_entry_clear(&entry);
    rc = 1;
    goto out;
  }
  tcc_cache_failure failure;
  if (tcc_cache_lookup_failure(st->cache, prep->hash, prep->key, prep->key_len, &failure, err) == 0 &&
      failure_fresh(st, &failure)) {
    rc = tcc_error_set(err, failure.code, "%s (recorded failure)", failure.message);
    goto out;
  }
  if (job_find(st->jobs, prep->hash)) {
    rc = 1;
    goto out;
  }
  if (backoff_active(st, prep->hash, prep->hash_hex, err)) {
    rc = err->code;
    goto out;
  }
  if (st->draining || st->store_blocked) {
    rc = tcc_error_set(err, st->draining ? TCC_E_UNAVAILABLE : TCC_E_RESOURCE_EXHAUSTED, "%s",
                       st->draining ? "tccd is shutting down" : "the cache cannot store new entries");
    goto out;
  }
  /* request_meta: the stored request without its graph */
  Tcc__V1__CompileRequest *req = tcc__v1__compile_request__unpack(NULL, request_len, request);
  size_t meta_len = 0;
  if (req) {
    meta = encode_request_meta(req, &meta_len);
    tcc__v1__compile_request__free_unpacked(req, NULL);
  }
  int64_t held = 0;
  tccd_job *job = meta ? job_create(st, &prep, &meta, meta_len, &request, request_len, &held, NULL) : NULL;
  if (!job) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  job->on_end = on_end;
  job->on_end_arg = arg;
  job->warm_id = warm_id;
  job_log(job, TCCD_LOG_DEBUG, "compile %.12s: warm run %llu, queued (%zu nodes, %s)", job->prep->hash_hex,
          (unsigned long long)warm_id, job->prep->nodes, job->prep->target);
  job_begin(st, job);
  return 0;
out:
  tcc_prepared_free(prep);
  free(request);
  free(meta);
  return rc;
}

/* On the loop, once prepared: the cache, the negative cache, a timeout's
 * backoff, a job in flight, or a new job. Every path ends at `done`. */
static void compile_prepared(compile_request *r) {
  tccd_state *st = r->st;
  tccd_call *c = r->c;
  tcc_prepared *prep = r->prep;
  tcc_error err;
  tcc_error_clear(&err);
  memcpy(c->client, r->client, sizeof c->client);
  if (prep) memcpy(c->guard_hash, prep->hash_hex, sizeof c->guard_hash);
  if (!prep) {
    tcc_cache_count(st->cache, TCC_COUNTER_invalid_requests, 1);
    tccd_call_log(TCCD_LOG_INFO, c, "compile rejected (%s): %s", tcc_status_name(r->err.code), r->err.msg);
    c->failure_logged = 1;
    tccd_call_fail_error(c, &r->err);
    goto done;
  }

  uint64_t t2 = uv_hrtime();
  tcc_cache_entry entry;
  int rc = lookup_servable(st, c, prep, &entry, &err);
  r->t.lookup_ms = tccd_ms_since(t2);
  if (rc == 0) {
    tcc_cache_count(st->cache, TCC_COUNTER_hits, 1);
    r->t.compile_ms = 0;
    r->t.original_compile_ms = entry.compile_ms;
    reply_entry(c, &entry, TCC__V1__CACHE_STATUS__HIT, &r->t);
    tccd_metrics_observe(st, TCCD_HIST_CACHE_HIT, tccd_call_elapsed_ms(c) / 1000.0);
    tccd_call_log(TCCD_LOG_DEBUG, c, "compile %.12s hit (%.3f ms)", prep->hash_hex, tccd_call_elapsed_ms(c));
    tcc_cache_entry_clear(&entry);
    goto done;
  }
  if (rc != TCC_E_NOT_FOUND) tccd_call_log(TCCD_LOG_WARN, c, "cache lookup failed, compiling instead: %s", err.msg);
  else if (strstr(err.msg, "collision")) tccd_call_log(TCCD_LOG_WARN, c, "%s", err.msg); /* stored key differs */

  tcc_cache_failure failure;
  if (tcc_cache_lookup_failure(st->cache, prep->hash, prep->key, prep->key_len, &failure, &err) == 0 &&
      failure_fresh(st, &failure)) {
    tcc_cache_count(st->cache, TCC_COUNTER_negative_hits, 1);
    tccd_call_log(TCCD_LOG_DEBUG, c, "compile %.12s: recorded failure answered again", prep->hash_hex);
    tccd_call_fail(c, failure.code, "%s (recorded failure for guard hash %s; `tcctl evict %s` clears it)",
                   failure.message, prep->hash_hex, prep->hash_hex);
    goto done;
  }

  tccd_explain_note_miss(st, prep->hash, prep->key, prep->key_len);
  tccd_job *job = job_find(st->jobs, prep->hash);
  if (job) {
    tcc_cache_count(st->cache, TCC_COUNTER_coalesced, 1);
    job_add_waiter(job, c);
    goto done;
  }
  if (backoff_active(st, prep->hash, prep->hash_hex, &err)) {
    tccd_call_log(TCCD_LOG_DEBUG, c, "compile %.12s: backing off after a timeout", prep->hash_hex);
    tccd_call_fail_error(c, &err);
    goto done;
  }
  if (st->draining) {
    tccd_call_fail(c, TCC_E_UNAVAILABLE, "tccd is shutting down");
    goto done;
  }
  if (st->store_blocked) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED,
                   "the cache cannot store new entries (%s); tccd does not compile what it would throw away: "
                   "free disk space, or `tcctl gc --max-bytes N`; retry later",
                   st->store_blocked_reason);
    goto done;
  }
  tccd_jobs *jobs = st->jobs;
  if (jobs->in_pool >= (int64_t)st->cfg->workers + st->cfg->queue_max) {
    tccd_job_stats js;
    tccd_jobs_stats(st, &js);
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED,
                   "compile queue full (%lld queued, %lld running, --queue-max %d); retry later",
                   (long long)js.queued, (long long)js.running, st->cfg->queue_max);
    goto done;
  }
  job = job_create(st, &r->prep, &r->request_meta, r->request_meta_len, &r->request, r->request_len, &r->held,
                   &r->t);
  if (!job) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  job_add_waiter(job, c);
  if (job_begin(st, job)) {
    tccd_call_log(TCCD_LOG_DEBUG, c, "compile %.12s local miss: asking the remote tier", prep->hash_hex);
    goto done;
  }
  tccd_call_log(TCCD_LOG_DEBUG, c, "compile %.12s miss: queued (%zu nodes, %s)", prep->hash_hex, prep->nodes,
                prep->target);
done:
  compile_request_free(r);
}

static void prepare_done(void *arg, int cancelled) {
  compile_request *r = arg;
  if (cancelled) {
    tccd_call_fail(r->c, TCC_E_UNAVAILABLE, "tccd is shutting down");
    compile_request_free(r);
    return;
  }
  compile_prepared(r);
}

/* The Compile handler: admits the request by bytes, then prepares it on
 * the loop (small) or on an offload thread (large), then
 * compile_prepared. */
void tccd_rpc_compile(tccd_state *st, tccd_call *c) {
  tcc_cache_count(st->cache, TCC_COUNTER_requests, 1);
  compile_request *r = calloc(1, sizeof *r);
  if (!r) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  tcc__v1__timings__init(&r->t);
  r->st = st;
  r->c = c;
  r->payload = tccd_call_take_payload(c);
  size_t n = r->payload ? grpc_byte_buffer_length(r->payload) : 0;
  if (n > TCC_MAX_REQUEST_BYTES) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "CompileRequest is %zu bytes (limit %u)", n,
                   TCC_MAX_REQUEST_BYTES);
    compile_request_free(r);
    return;
  }
  if (admit_bytes(st, n, &r->held, &r->err) != 0) {
    tccd_call_fail_error(c, &r->err);
    compile_request_free(r);
    return;
  }
  if (n > INLINE_PREPARE_BYTES && tccd_offload_submit(st, prepare_work, prepare_done, r) == 0) return;
  prepare_work(r);
  compile_prepared(r);
}
