/*
 * rpc.c — the small RPCs: Fetch (streamed artifact), Ops, Stats, List, Show,
 * Evict, Gc, ZeroStats, Clear and grpc.health.v1.Health/Check. Compile
 * lives in compile.c.
 *
 * Each handler decodes its request (malformed: INVALID_ARGUMENT), asks the
 * cache, and finishes the call exactly once. All run on the loop thread.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tcc/v1/tcc.pb-c.h"
#include "tcc_config.h"

/* Parses a 64-digit hex guard hash / digest named `what`. */
static int parse_hash(tccd_call *c, const char *hex, const char *what, uint8_t out[TCC_SHA256_BYTES]) {
  if (tcc_hex_decode(hex, out, TCC_SHA256_BYTES) != 0) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "%s must be 64 hex digits, got '%.80s'", what, hex ? hex : "");
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ Fetch */

void tccd_rpc_fetch(tccd_state *st, tccd_call *c) {
  Tcc__V1__FetchRequest *req =
      (Tcc__V1__FetchRequest *)tccd_call_unpack(c, &tcc__v1__fetch_request__descriptor);
  if (!req) return;
  uint8_t sha[TCC_SHA256_BYTES], sig[TCC_SIGNATURE_BYTES];
  size_t sig_len = 0;
  char key_id[TCC_SIGN_KEY_ID_HEX] = "";
  int kind = TCC__V1__ARTIFACT_KIND__ARTIFACT_KIND_UNSPECIFIED;
  tcc_error err;
  size_t chunk = req->chunk_bytes > 0 && req->chunk_bytes < (4 << 20) ? (size_t)req->chunk_bytes : 0;
  if (req->sha256 && *req->sha256) {
    if (parse_hash(c, req->sha256, "sha256", sha) != 0) goto out;
  } else if (req->guard_hash && *req->guard_hash) {
    uint8_t hash[TCC_SHA256_BYTES];
    if (parse_hash(c, req->guard_hash, "guard_hash", hash) != 0) goto out;
    tcc_cache_entry e;
    if (tcc_cache_get(st->cache, hash, &e, &err) != 0) {
      tccd_call_fail_error(c, &err);
      goto out;
    }
    memcpy(sha, e.artifact_sha256, TCC_SHA256_BYTES);
    kind = e.kind;
    if (e.signature_len == TCC_SIGNATURE_BYTES) { /* so a client with trusted keys can verify it */
      memcpy(sig, e.signature, sizeof sig);
      sig_len = sizeof sig;
      snprintf(key_id, sizeof key_id, "%s", e.key_id);
    }
    tcc_cache_entry_clear(&e);
  } else {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "FetchRequest needs sha256 or guard_hash");
    goto out;
  }
  uint8_t *data;
  size_t len;
  if (tcc_cache_read_artifact(st->cache, sha, &data, &len, &err) != 0) {
    if (err.code == TCC_E_DATA_LOSS) tccd_call_log(TCCD_LOG_ERROR, c, "%s", err.msg);
    tccd_call_fail_error(c, &err);
    goto out;
  }
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(sha, TCC_SHA256_BYTES, hex);
  tccd_call_stream_artifact(c, data, len, hex, kind, chunk, sig, sig_len, key_id);
out:
  tcc__v1__fetch_request__free_unpacked(req, NULL);
}

/* ------------------------------------------------------------ Ops */

void tccd_rpc_ops(tccd_state *st, tccd_call *c) {
  Tcc__V1__OpsRequest *req = (Tcc__V1__OpsRequest *)tccd_call_unpack(c, &tcc__v1__ops_request__descriptor);
  if (!req) return;
  int device = req->device;
  tcc__v1__ops_request__free_unpacked(req, NULL);
  size_t nops = tcc_compiler_ops(device, NULL, 0);
  size_t ndt = tcc_compiler_dtypes(device, NULL, 0);
  tcc_op_info *info = calloc(nops ? nops : 1, sizeof *info);
  Tcc__V1__OpInfo *ops = calloc(nops ? nops : 1, sizeof *ops);
  Tcc__V1__OpInfo **ptrs = calloc(nops ? nops : 1, sizeof *ptrs);
  Tcc__V1__DType *dtypes = calloc(ndt ? ndt : 1, sizeof *dtypes);
  if (!info || !ops || !ptrs || !dtypes) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    nops = tcc_compiler_ops(device, info, nops);
    ndt = tcc_compiler_dtypes(device, dtypes, ndt);
    for (size_t i = 0; i < nops; i++) {
      tcc__v1__op_info__init(&ops[i]);
      ops[i].target = (char *)info[i].target;
      ops[i].schema = (char *)info[i].schema;
      ops[i].kind = (char *)info[i].kind;
      ptrs[i] = &ops[i];
    }
    Tcc__V1__OpsResponse r = TCC__V1__OPS_RESPONSE__INIT;
    r.n_ops = nops;
    r.ops = ptrs;
    r.n_dtypes = ndt;
    r.dtypes = dtypes;
    r.compiler = st->identity;
    tccd_call_reply(c, &r.base);
  }
  free(info);
  free(ops);
  free(ptrs);
  free(dtypes);
}

/* ------------------------------------------------------------ Stats */

/* A StatsResponse and the warnings it points to. */
#define STATS_WARNINGS_MAX 3
typedef struct stats_reply {
  Tcc__V1__StatsResponse r;
  char *warnings[STATS_WARNINGS_MAX];
  char text[STATS_WARNINGS_MAX][640];
} stats_reply;

/* What an operator should know now (StatsResponse.warnings). */
static void stats_warnings(const tccd_state *st, stats_reply *out) {
  size_t n = 0;
  if (st->open_without_auth) { /* HOST of --listen, with the bound port (--listen may say :0) */
    const char *colon = strrchr(st->cfg->listen, ':');
    int host_len = colon ? (int)(colon - st->cfg->listen) : (int)strlen(st->cfg->listen);
    snprintf(out->text[n++], sizeof out->text[0],
             "listening on %.*s:%d without auth (--auth-tokens): anyone who can reach this port can compile, "
             "evict, clear and read the cache",
             host_len, st->cfg->listen, tccd_server_port(st->server));
  }
  if (st->store_blocked)
    snprintf(out->text[n++], sizeof out->text[0], "storing blocked: %s", st->store_blocked_reason);
  if (out->r.remote_enabled && !out->r.remote_connected)
    snprintf(out->text[n++], sizeof out->text[0], "redis tier disconnected (%s)", out->r.remote_address);
  for (size_t i = 0; i < n; i++) out->warnings[i] = out->text[i];
  out->r.n_warnings = n;
  out->r.warnings = out->warnings;
}

/* Fills *out from the cache's statistics cs and the daemon's state (no
 * warnings). */
static void stats_from(const tccd_state *st, const tcc_cache_stats *cache_stats, Tcc__V1__StatsResponse *out) {
  const tcc_cache_stats cs = *cache_stats;
  tccd_job_stats js;
  tccd_jobs_stats(st, &js);
  Tcc__V1__StatsResponse r = TCC__V1__STATS_RESPONSE__INIT;
  r.entries = cs.entries;
  r.bytes = cs.bytes;
  r.max_bytes = cs.max_bytes;
  r.hits = cs.counters[TCC_COUNTER_hits];
  r.misses = cs.counters[TCC_COUNTER_misses];
  r.coalesced = cs.counters[TCC_COUNTER_coalesced];
  r.compiles = cs.counters[TCC_COUNTER_compiles];
  r.compile_failures = cs.counters[TCC_COUNTER_compile_failures];
  r.evictions = cs.counters[TCC_COUNTER_evictions];
  r.corrupt_blobs = cs.counters[TCC_COUNTER_corrupt_blobs];
  r.remote_hits = cs.counters[TCC_COUNTER_remote_hits];
  r.negative_hits = cs.counters[TCC_COUNTER_negative_hits];
  r.requests = cs.counters[TCC_COUNTER_requests];
  r.invalid_requests = cs.counters[TCC_COUNTER_invalid_requests];
  r.compile_seconds = cs.compile_seconds;
  r.negative_entries = cs.failures;
  r.compile_seconds_saved = cs.compile_seconds_saved;
  r.uptime_seconds = (int64_t)((uv_hrtime() - st->started_ns) / 1000000000ull);
  r.version = (char *)TCC_VERSION;
  r.queue_depth = js.queued;
  r.running_jobs = js.running;
  r.workers = st->cfg->workers;
  r.remote_errors = cs.counters[TCC_COUNTER_remote_errors];
  r.remote_stores = cs.counters[TCC_COUNTER_remote_stores];
  r.remote_lock_waits = cs.counters[TCC_COUNTER_remote_lock_waits];
  r.remote_rejected = cs.counters[TCC_COUNTER_remote_rejected];
  r.auth_failures = cs.counters[TCC_COUNTER_auth_failures];
  r.autotune_runs = cs.counters[TCC_COUNTER_autotune_runs];
  r.autotune_candidates = cs.counters[TCC_COUNTER_autotune_candidates];
  r.autotune_crashed = cs.counters[TCC_COUNTER_autotune_crashed];
  r.autotune_timeouts = cs.counters[TCC_COUNTER_autotune_timeouts];
  r.autotune_wrong = cs.counters[TCC_COUNTER_autotune_wrong];
  r.autotune_discarded = r.autotune_crashed + r.autotune_timeouts + r.autotune_wrong;
  r.autotune_seconds = (double)cs.counters[TCC_COUNTER_autotune_ms] / 1000.0;
  r.autotune_record_hits = cs.counters[TCC_COUNTER_autotune_record_hits];
  r.autotune_untuned = cs.counters[TCC_COUNTER_autotune_untuned];
  r.autotune_remote_record_hits = cs.counters[TCC_COUNTER_autotune_remote_record_hits];
  r.store_blocked = st->store_blocked;
  r.store_blocked_reason = (char *)st->store_blocked_reason;
  r.rejected_memory = cs.counters[TCC_COUNTER_rejected_memory];
  r.corrupt_entries = cs.counters[TCC_COUNTER_corrupt_entries];
  r.tuning_records = cs.tuning_records;
  r.object_hits = cs.counters[TCC_COUNTER_object_hits];
  r.object_misses = cs.counters[TCC_COUNTER_object_misses];
  r.plans = cs.plans;
  r.plan_bytes = cs.plan_bytes;
  r.plan_hits = cs.counters[TCC_COUNTER_plan_hits];
  r.plan_misses = cs.counters[TCC_COUNTER_plan_misses];
  r.plans_stored = cs.counters[TCC_COUNTER_plans_stored];
  r.autotuning_jobs = js.autotuning;
  r.signing_key_id = st->signing_key ? st->signing_key->key_id : (char *)"";
  int remote_on = 0, remote_connected = 0;
  const char *remote_address = "";
  tccd_remote_info(st, &remote_on, &remote_connected, &remote_address);
  r.remote_enabled = remote_on;
  r.remote_connected = remote_connected;
  r.remote_address = (char *)remote_address;
  *out = r;
}

int tccd_stats_fill(const tccd_state *st, Tcc__V1__StatsResponse *out, tcc_error *err) {
  tcc_cache_stats cs;
  int rc = tcc_cache_stats_get(st->cache, &cs, err);
  if (rc != 0) return rc;
  stats_from(st, &cs, out);
  return 0;
}

/* Stats, and ZeroStats (zero set): the statistics now, then (ZeroStats)
 * the counters restart from 0. */
static void stats_answer(tccd_state *st, tccd_call *c, const ProtobufCMessageDescriptor *req_desc, int zero) {
  ProtobufCMessage *req = tccd_call_unpack(c, req_desc);
  if (!req) return;
  protobuf_c_message_free_unpacked(req, NULL);
  tcc_cache_stats cs;
  tcc_error err;
  if (tcc_cache_stats_get(st->cache, &cs, &err) != 0 || (zero && tcc_cache_zero_counters(st->cache, &err) != 0)) {
    tccd_call_fail_error(c, &err);
    return;
  }
  if (zero) tccd_call_log(TCCD_LOG_INFO, c, "statistics zeroed on request");
  stats_reply sr;
  memset(&sr, 0, sizeof sr);
  stats_from(st, &cs, &sr.r);
  stats_warnings(st, &sr);
  tccd_call_reply(c, &sr.r.base);
}

void tccd_rpc_stats(tccd_state *st, tccd_call *c) { stats_answer(st, c, &tcc__v1__stats_request__descriptor, 0); }

void tccd_rpc_zero_stats(tccd_state *st, tccd_call *c) {
  stats_answer(st, c, &tcc__v1__zero_stats_request__descriptor, 1);
}

/* ------------------------------------------------------------ List / Show */

static void fill_summary(Tcc__V1__EntrySummary *s, const tcc_cache_entry *e,
                         char hash_hex[TCC_SHA256_HEX], char sha_hex[TCC_SHA256_HEX]) {
  tcc_hex_encode(e->hash, TCC_SHA256_BYTES, hash_hex);
  tcc_hex_encode(e->artifact_sha256, TCC_SHA256_BYTES, sha_hex);
  s->guard_hash = hash_hex;
  s->target = (char *)e->target;
  s->kind = (Tcc__V1__ArtifactKind)e->kind;
  s->size = e->size;
  s->hits = e->hits;
  s->compile_ms = e->compile_ms;
  s->created_unix = e->created;
  s->last_used_unix = e->last_used;
  s->kernels = e->kernels;
  s->artifact_sha256 = sha_hex;
  s->key_id = (char *)e->key_id;
}

/* A recorded failure as the wire has it; strings point into f and hex. */
static void fill_failure(Tcc__V1__FailureSummary *s, const tcc_cache_failure *f, char hex[TCC_SHA256_HEX]) {
  tcc__v1__failure_summary__init(s);
  tcc_hex_encode(f->hash, TCC_SHA256_BYTES, hex);
  s->guard_hash = hex;
  s->target = (char *)f->target;
  s->code = (char *)tcc_status_name(f->code);
  s->message = (char *)f->message;
  s->created_unix = f->created;
  s->key_size = (int64_t)f->key_len;
}

void tccd_rpc_list(tccd_state *st, tccd_call *c) {
  Tcc__V1__ListRequest *req =
      (Tcc__V1__ListRequest *)tccd_call_unpack(c, &tcc__v1__list_request__descriptor);
  if (!req) return;
  tcc_cache_order order = TCC_CACHE_ORDER_LAST_USED;
  const char *ob = req->order_by ? req->order_by : "";
  if (!*ob || strcmp(ob, "last_used") == 0) order = TCC_CACHE_ORDER_LAST_USED;
  else if (strcmp(ob, "hits") == 0) order = TCC_CACHE_ORDER_HITS;
  else if (strcmp(ob, "size") == 0) order = TCC_CACHE_ORDER_SIZE;
  else if (strcmp(ob, "created") == 0) order = TCC_CACHE_ORDER_CREATED;
  else {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT,
                   "order_by must be last_used, hits, size or created, got '%.40s'", ob);
    tcc__v1__list_request__free_unpacked(req, NULL);
    return;
  }
  int limit = req->limit > 0 ? req->limit : 100;
  if (limit > 10000) limit = 10000;
  int failures = req->failures;
  tcc__v1__list_request__free_unpacked(req, NULL);

  /* the entries, or (ListRequest.failures) the recorded failures */
  tcc_cache_entry *entries = NULL;
  tcc_cache_failure *fs = NULL;
  size_t n = 0;
  tcc_error err;
  tcc_cache_stats cs;
  if ((failures ? tcc_cache_list_failures(st->cache, limit, &fs, &n, &err)
                : tcc_cache_list(st->cache, order, limit, &entries, &n, &err)) != 0 ||
      tcc_cache_stats_get(st->cache, &cs, &err) != 0) {
    tcc_cache_entries_free(entries, n);
    free(fs);
    tccd_call_fail_error(c, &err);
    return;
  }
  Tcc__V1__EntrySummary *sums = failures ? NULL : calloc(n ? n : 1, sizeof *sums);
  Tcc__V1__FailureSummary *fsums = failures ? calloc(n ? n : 1, sizeof *fsums) : NULL;
  void **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  char (*hex)[2][TCC_SHA256_HEX] = calloc(n ? n : 1, sizeof *hex);
  if ((!sums && !fsums) || !ptrs || !hex) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory listing %zu %s", n, failures ? "failures" : "entries");
  } else {
    for (size_t i = 0; i < n; i++) {
      if (failures) {
        fill_failure(&fsums[i], &fs[i], hex[i][0]);
        ptrs[i] = &fsums[i];
      } else {
        tcc__v1__entry_summary__init(&sums[i]);
        fill_summary(&sums[i], &entries[i], hex[i][0], hex[i][1]);
        ptrs[i] = &sums[i];
      }
    }
    Tcc__V1__ListResponse r = TCC__V1__LIST_RESPONSE__INIT;
    if (failures) {
      r.n_failures = n;
      r.failures = (Tcc__V1__FailureSummary **)ptrs;
      r.total = cs.failures;
    } else {
      r.n_entries = n;
      r.entries = (Tcc__V1__EntrySummary **)ptrs;
      r.total = cs.entries;
    }
    tccd_call_reply(c, &r.base);
  }
  free(sums);
  free(fsums);
  free(ptrs);
  free(hex);
  free(fs);
  tcc_cache_entries_free(entries, failures ? 0 : n);
}

/* Show of a hash with no entry: its recorded failure, or NOT_FOUND. */
static void show_failure(tccd_state *st, tccd_call *c, const uint8_t hash[TCC_SHA256_BYTES]) {
  tcc_cache_failure f;
  tcc_error err;
  int rc = tcc_cache_get_failure(st->cache, hash, &f, &err);
  if (rc == TCC_E_NOT_FOUND) {
    char hex[TCC_SHA256_HEX];
    tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
    tccd_call_fail(c, TCC_E_NOT_FOUND, "no cache entry or recorded failure for %s", hex);
    return;
  }
  if (rc != 0) {
    tccd_call_fail_error(c, &err);
    return;
  }
  char hex[TCC_SHA256_HEX];
  Tcc__V1__FailureSummary sum;
  fill_failure(&sum, &f, hex);
  Tcc__V1__ShowResponse r = TCC__V1__SHOW_RESPONSE__INIT;
  r.failure = &sum;
  tccd_call_reply(c, &r.base);
}

void tccd_rpc_show(tccd_state *st, tccd_call *c) {
  Tcc__V1__ShowRequest *req =
      (Tcc__V1__ShowRequest *)tccd_call_unpack(c, &tcc__v1__show_request__descriptor);
  if (!req) return;
  uint8_t hash[TCC_SHA256_BYTES];
  int bad = parse_hash(c, req->guard_hash, "guard_hash", hash);
  tcc__v1__show_request__free_unpacked(req, NULL);
  if (bad) return;
  tcc_cache_entry e;
  tcc_error err;
  int rc = tcc_cache_get(st->cache, hash, &e, &err);
  if (rc == TCC_E_NOT_FOUND) {
    show_failure(st, c, hash);
    return;
  }
  if (rc != 0) {
    tccd_call_fail_error(c, &err);
    return;
  }
  char hash_hex[TCC_SHA256_HEX], sha_hex[TCC_SHA256_HEX];
  Tcc__V1__EntrySummary sum = TCC__V1__ENTRY_SUMMARY__INIT;
  fill_summary(&sum, &e, hash_hex, sha_hex);
  Tcc__V1__ShowResponse r = TCC__V1__SHOW_RESPONSE__INIT;
  r.entry = &sum;
  Tcc__V1__Manifest *manifest = tcc__v1__manifest__unpack(NULL, e.manifest_len, e.manifest);
  Tcc__V1__CompileRequest *meta =
      e.request_meta ? tcc__v1__compile_request__unpack(NULL, e.request_meta_len, e.request_meta) : NULL;
  r.manifest = manifest;
  if (meta) {
    r.options = meta->options;
    r.target_spec = meta->target;
  }
  r.canonical_key.data = e.key;
  r.canonical_key.len = e.key_len;
  tccd_call_reply(c, &r.base);
  if (manifest) tcc__v1__manifest__free_unpacked(manifest, NULL);
  if (meta) tcc__v1__compile_request__free_unpacked(meta, NULL);
  tcc_cache_entry_clear(&e);
}

/* ------------------------------------------------------------ Evict / Gc */

/* An Evict waiting on Redis (with a remote tier, the hash's shared keys
 * go too: see tccd_remote_evict). Redis goes first and the local copy
 * when it has answered: the other way round, a request in between would
 * miss locally, find the entry still in Redis and store it here again. */
typedef struct evict_wait {
  tccd_state *st;
  tccd_call *c;
  uint8_t hash[TCC_SHA256_BYTES];
} evict_wait;

/* Evicts the local entry (and recorded failure), then answers what went
 * locally and, with a remote tier, in Redis (res NULL: none). Nothing
 * anywhere (and no Redis error) is NOT_FOUND. */
static void evict_finish(tccd_state *st, tccd_call *c, const uint8_t hash[TCC_SHA256_BYTES],
                         const tccd_remote_evict_result *res) {
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  char *removed[3];
  size_t n = 0;
  if (res && !res->error) {
    if (res->entry) removed[n++] = "entry";
    if (res->artifact) removed[n++] = "artifact";
    if (res->failure) removed[n++] = "failure";
  }
  tcc_error err;
  int code = tcc_cache_evict(st->cache, hash, &err);
  if (code != 0 && (code != TCC_E_NOT_FOUND || !res)) { /* without a remote tier: as it says */
    if (n) tccd_call_log(TCCD_LOG_WARN, c, "evict %.12s: removed from redis, but not locally: %s", hex, err.msg);
    tccd_call_fail_error(c, &err);
    return;
  }
  if (code != 0 && !n && !res->error) {
    tccd_call_fail(c, TCC_E_NOT_FOUND, "no cache entry or recorded failure for %s, here or in redis", hex);
    return;
  }
  int local = code == 0;
  if (local) tccd_store_unblock(st, "an entry was evicted");
  tccd_call_log(TCCD_LOG_INFO, c, "evicted %.12s on request: %s locally; redis: %s%s%s", hex,
                local ? "removed" : "nothing",
                !res ? "none" : res->error ? "not removed (" : n ? "removed" : "nothing stored",
                res && res->error ? res->message : "", res && res->error ? ")" : "");
  Tcc__V1__EvictResponse r = TCC__V1__EVICT_RESPONSE__INIT;
  r.evicted = local;
  r.remote_enabled = res != NULL;
  r.n_remote_removed = n;
  r.remote_removed = removed;
  r.remote_error = (char *)(res && res->error ? res->message : "");
  tccd_call_reply(c, &r.base);
}

static void evict_remote_done(void *arg, const tccd_remote_evict_result *res) {
  evict_wait *w = arg;
  evict_finish(w->st, w->c, w->hash, res);
  free(w);
}

void tccd_rpc_evict(tccd_state *st, tccd_call *c) {
  Tcc__V1__EvictRequest *req =
      (Tcc__V1__EvictRequest *)tccd_call_unpack(c, &tcc__v1__evict_request__descriptor);
  if (!req) return;
  uint8_t hash[TCC_SHA256_BYTES];
  int bad = parse_hash(c, req->guard_hash, "guard_hash", hash);
  tcc__v1__evict_request__free_unpacked(req, NULL);
  if (bad) return;
  if (!st->remote) {
    evict_finish(st, c, hash, NULL);
    return;
  }
  evict_wait *w = calloc(1, sizeof *w);
  if (!w) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->st = st;
  w->c = c;
  memcpy(w->hash, hash, sizeof hash);
  tcc_error err;
  int rc = tccd_remote_evict(st, hash, evict_remote_done, w, &err);
  if (rc == 0) return; /* evict_remote_done finishes */
  free(w);
  tccd_remote_evict_result res;
  memset(&res, 0, sizeof res);
  res.error = rc == -1 ? TCC_E_UNAVAILABLE : rc;
  snprintf(res.message, sizeof res.message, "%s", rc == -1 ? "the remote tier is closed" : err.msg);
  evict_finish(st, c, hash, &res);
}

/* A gc in progress: its blobs are verified on an offload thread (reading
 * every artifact takes seconds for a large cache), the rest on the loop. */
typedef struct gc_run {
  tccd_state *st;
  tccd_call *c;
  int64_t max_bytes;
  char db_path[4200];
  uint8_t (*corrupt)[TCC_SHA256_BYTES];
  size_t ncorrupt;
  int rc;
  tcc_error err;
} gc_run;

static void gc_scan_work(void *arg) {
  gc_run *g = arg;
  g->rc = tcc_cache_scan_blobs(g->db_path, &g->corrupt, &g->ncorrupt, &g->err);
}

static void gc_scan_done(void *arg, int cancelled) {
  gc_run *g = arg;
  tccd_call *c = g->c;
  tcc_cache_gc_result res;
  if (cancelled) {
    tccd_call_fail(c, TCC_E_UNAVAILABLE, "tccd is shutting down; gc did not run");
  } else if (g->rc != 0) {
    tccd_call_fail_error(c, &g->err);
  } else if (tcc_cache_gc_finish(g->st->cache, g->max_bytes, (const uint8_t (*)[TCC_SHA256_BYTES])g->corrupt,
                                 g->ncorrupt, &res, &g->err) != 0) {
    tccd_call_fail_error(c, &g->err);
  } else {
    tccd_call_log(TCCD_LOG_INFO, c, "gc: evicted %lld entries, freed %lld bytes, removed %lld corrupt blobs",
                  (long long)res.evicted, (long long)res.freed_bytes, (long long)res.corrupt_removed);
    if (res.freed_bytes > 0) tccd_store_unblock(g->st, "gc freed space");
    Tcc__V1__GcResponse r = TCC__V1__GC_RESPONSE__INIT;
    r.evicted = res.evicted;
    r.freed_bytes = res.freed_bytes;
    r.corrupt_removed = res.corrupt_removed;
    tccd_call_reply(c, &r.base);
  }
  free(g->corrupt);
  free(g);
}

void tccd_rpc_gc(tccd_state *st, tccd_call *c) {
  Tcc__V1__GcRequest *req = (Tcc__V1__GcRequest *)tccd_call_unpack(c, &tcc__v1__gc_request__descriptor);
  if (!req) return;
  int64_t max_bytes = req->max_bytes;
  tcc__v1__gc_request__free_unpacked(req, NULL);
  if (max_bytes < 0) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "max_bytes must not be negative");
    return;
  }
  gc_run *g = calloc(1, sizeof *g);
  if (!g) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  g->st = st;
  g->c = c;
  g->max_bytes = max_bytes;
  snprintf(g->db_path, sizeof g->db_path, "%s", tcc_cache_db_path(st->cache));
  if (tccd_offload_submit(st, gc_scan_work, gc_scan_done, g) != 0) {
    free(g);
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
}

/* ------------------------------------------------------------ Clear */

/* Empties the local cache (entries, artifacts, recorded failures; tuning
 * records when asked). A Redis tier is left alone: it is the fleet's, and
 * ClearResponse.remote_enabled tells the caller so. */
void tccd_rpc_clear(tccd_state *st, tccd_call *c) {
  Tcc__V1__ClearRequest *req = (Tcc__V1__ClearRequest *)tccd_call_unpack(c, &tcc__v1__clear_request__descriptor);
  if (!req) return;
  int tuning = req->tuning;
  tcc__v1__clear_request__free_unpacked(req, NULL);
  tcc_cache_clear_result res;
  tcc_error err;
  if (tcc_cache_clear(st->cache, tuning, &res, &err) != 0) {
    tccd_call_fail_error(c, &err);
    return;
  }
  log_info("cleared on request: %lld entries (%lld bytes), %lld recorded failures, %lld plans, %lld tuning "
           "records%s",
           (long long)res.entries, (long long)res.bytes, (long long)res.failures, (long long)res.plans,
           (long long)res.tuning_records, st->remote ? "; the redis tier is left as it is" : "");
  if (res.bytes > 0) tccd_store_unblock(st, "the cache was cleared");
  Tcc__V1__ClearResponse r = TCC__V1__CLEAR_RESPONSE__INIT;
  r.entries = res.entries;
  r.bytes = res.bytes;
  r.failures = res.failures;
  r.tuning_records = res.tuning_records;
  r.plans = res.plans;
  r.remote_enabled = st->remote != NULL;
  tccd_call_reply(c, &r.base);
}

/* ------------------------------------------------------------ Health */

void tccd_rpc_health_check(tccd_state *st, tccd_call *c) {
  Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *)tccd_call_unpack(
      c, &grpc__health__v1__health_check_request__descriptor);
  if (!req) return;
  const char *svc = req->service ? req->service : "";
  int known = !*svc || strcmp(svc, "tcc.v1.Compiler") == 0 || strcmp(svc, "tcc.v1.Cache") == 0;
  if (!known) {
    tccd_call_fail(c, TCC_E_NOT_FOUND, "unknown service '%.100s'", svc);
  } else {
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = st->draining ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                            : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    tccd_call_reply(c, &r.base);
  }
  grpc__health__v1__health_check_request__free_unpacked(req, NULL);
}
