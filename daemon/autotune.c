/*
 * autotune.c — max-autotune: candidate builds, benchmark children
 * (spawned and read by tune_child.c), tuning records (daemon.h,
 * "autotune.c").
 *
 * DESIGN
 *
 *   A compile job whose mode is max-autotune(-no-cudagraphs) goes from
 *   COMPILING to AUTOTUNING (compile.c) once its default artifact is
 *   built. A tuning run then moves through these steps; every arrow
 *   between a pool item and the loop is one uv_queue_work:
 *
 *     loop                         pool (--workers threads)
 *     ----                         ------------------------
 *     start ─────────────────────► signatures of the kernels (tune.c)
 *     signatures_done: records ◄──┘
 *       every kernel has one? ─────────────────────────────────┐
 *       else: one item per candidate ─► build candidate c      │
 *                                       (tcc_compile_tuned,     │
 *                                        benchmark hooks)       │
 *     build_done (last one) ─────────► bench: tccd-bench child  │
 *                                      per candidate, ONE AT A  │
 *                                      TIME (timings must not   │
 *                                      compete), under limits   │
 *     bench_done: discard crashed / ◄─┘                         │
 *       timed-out / wrong candidates (logged, counted),         │
 *       pick each kernel's best, store the records             │
 *     final ◄──────────────────────────────────────────────────┘
 *       every kernel default? ─► done (the default artifact stays:
 *                                byte for byte what default mode builds)
 *       else ─────────────────────► build with one config per kernel
 *     final_done ─► done(tuned artifact) ◄─┘
 *
 *   Candidate 0 is the default config: its outputs are the reference of
 *   the output check and its times the bar. A kernel takes another
 *   config only when that is at least TUNE_MIN_GAIN faster, so noise
 *   does not swap configs and max-autotune is never slower than default
 *   by choice. If the default candidate itself cannot be built or
 *   measured, the run ends with the default artifact (logged).
 *
 *   Tuning records: (kernel signature, target) -> config, times and
 *   candidates tried (compiler/tune.c's record, the cache's tuning
 *   table). They are looked up before anything is built, so a kernel
 *   met again in another graph costs no benchmark: the run goes straight
 *   to the final build (or to nothing when every record says default).
 *   With --redis, the kernels with no local record are then asked of
 *   Redis (tccd_remote_record_get, kind "tune", tag remote_tag's) all at
 *   once; signatures_done returns and the last answer (found, absent,
 *   error, timeout) moves the run on (tune_measure), so the loop never
 *   waits.
 *   A found record is untrusted: only one that decodes to a config among
 *   this daemon's own candidates is taken (and stored locally). Every
 *   new record is put to Redis as well as the cache.
 *
 *   CUDA targets: the first CUDA run probes the GPUs once per process
 *   (pick_gpu: tccd-bench --probe in a child, tune_child.c, so libcuda
 *   is never loaded here). With a device that runs the target's cubin natively (same
 *   major compute capability, minor at least the arch's), the run is the
 *   CPU one: the CUDA candidates (tune.c: block size, elements per
 *   thread, warp- or block-per-row and persistent reductions, split
 *   factor) are built by NVRTC and benchmarked in tccd-bench on that
 *   device (cuEvent timing, outputs checked against the default's),
 *   discarded, counted and recorded the same way. Without one (no
 *   driver, no device, another arch) tuning is not run: the emitter's
 *   launch heuristic (compiler/cuda/schedule.c: 256-thread blocks, one block per row
 *   for reductions) stays, and the entry is counted untuned (stats
 *   autotune_untuned) and logged as such, with the reason.
 *
 *   The pool items touch only their own fields of the run; everything
 *   else (cache, counters, the job) is the loop's. A shutdown
 *   (st->draining) ends a run at its next step with the default
 *   artifact.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

/* A config must beat the default's median by this much to be chosen. */
#define TUNE_MIN_GAIN 0.03

typedef struct tune_candidate {
  tccd_tune *run;
  int index;
  uv_work_t work;
  int build_rc;
  tcc_error build_err;
  tcc_artifact art;
  int bench_rc;
  tcc_error bench_err;
  tcc_bench_result res;
} tune_candidate;

struct tccd_tune {
  tccd_state *st;
  const tcc_prepared *prep;
  tccd_tune_done done;
  void *arg;
  uint64_t start_ns;
  tcc_build_options build;
  tccd_bench_options bench;
  char bench_exe[PATH_MAX];
  uv_work_t work;              /* signatures, bench, final build */
  int rc;
  tcc_error err;
  tcc_tune_signatures sigs;
  int ncand;
  tcc_kernel_config cands[TCC_TUNE_MAX_CANDIDATES];
  tune_candidate cand[TCC_TUNE_MAX_CANDIDATES];
  int builds_pending;
  tcc_kernel_config *chosen;   /* per kernel */
  int *measure;                /* per kernel: no record, benchmark it */
  int nmeasure;
  _Atomic int benched;         /* candidates benchmarked so far */
  tcc_artifact final;
  int remote_pending;          /* Redis record gets not answered yet */
  int untuned;                 /* CUDA: no GPU fits the target (why says so) */
  char why[300];
};

/* One kernel's Redis record get (remote_record_done's arg). */
typedef struct tune_remote_get {
  tccd_tune *run;
  int kernel;
} tune_remote_get;

/* The benchmark child: $TCC_BENCH_EXE (a test switch), else tccd-bench
 * beside tccd. Its old name TCCD_BENCH_EXE is still read, with a warning,
 * until 0.2 (deprecated). On the loop thread. */
static void bench_exe_path(char *out, size_t cap) {
  const char *env = getenv("TCC_BENCH_EXE");
  if (!env || !env[0]) {
    static int warned;
    env = getenv("TCCD_BENCH_EXE");
    if (env && env[0] && !warned++)
      log_warn("TCCD_BENCH_EXE is deprecated (read until 0.2): set TCC_BENCH_EXE");
  }
  if (env && env[0]) {
    snprintf(out, cap, "%s", env);
    return;
  }
  char self[PATH_MAX - 16];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    snprintf(out, cap, "tccd-bench");
    return;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) *slash = '\0';
  snprintf(out, cap, "%s/tccd-bench", self);
}

int tccd_autotune_wanted(const tcc_prepared *prep) {
  return prep->mode == TCC__V1__MODE__MAX_AUTOTUNE ||
         prep->mode == TCC__V1__MODE__MAX_AUTOTUNE_NO_CUDAGRAPHS;
}

void tccd_autotune_progress(const tccd_tune *t, int *done, int *total) {
  *done = t ? atomic_load(&t->benched) : 0;
  *total = t ? (t->nmeasure ? t->ncand : 0) : 0;
}

/* Ends the run: done() with the tuned artifact (or none), then frees. */
static void tune_finish(tccd_tune *t, tcc_artifact *tuned) {
  tccd_state *st = t->st;
  double ms = tccd_ms_since(t->start_ns);
  tcc_cache_count(st->cache, TCC_COUNTER_autotune_ms, (int64_t)(ms + 0.5));
  tcc_artifact none;
  memset(&none, 0, sizeof none);
  t->done(t->arg, tuned ? tuned : &none, ms);
  for (int c = 0; c < t->ncand; c++) {
    tcc_artifact_free(&t->cand[c].art);
    tcc_bench_result_free(&t->cand[c].res);
  }
  tcc_artifact_free(&t->final);
  tcc_tune_signatures_free(&t->sigs);
  free(t->chosen);
  free(t->measure);
  free(t);
}

/* ------------------------------------------------------------ final build */

static void final_work(uv_work_t *w) {
  tccd_tune *t = w->data;
  t->rc = tcc_compile_tuned(t->prep, &t->build, t->chosen, t->sigs.nkernels, 0, &t->final, &t->err);
}

static void final_done(uv_work_t *w, int status) {
  tccd_tune *t = w->data;
  if (status == UV_ECANCELED || t->rc != 0) {
    log_warn("autotune %.12s: the tuned build failed, keeping the default: %s", t->prep->hash_hex,
             status == UV_ECANCELED ? "cancelled" : t->err.msg);
    tune_finish(t, NULL);
    return;
  }
  tune_finish(t, &t->final);
}

/* Builds the final artifact with t->chosen, unless every kernel keeps
 * the default (then the default artifact stays). */
static void tune_final(tccd_tune *t) {
  int tuned = 0;
  for (int k = 0; k < t->sigs.nkernels; k++) tuned |= !tcc_kernel_config_is_default(&t->chosen[k]);
  if (!tuned || t->st->draining) {
    log_debug("autotune %.12s: every kernel keeps the default config", t->prep->hash_hex);
    tune_finish(t, NULL);
    return;
  }
  t->work.data = t;
  if (uv_queue_work(t->st->loop, &t->work, final_work, final_done) != 0) tune_finish(t, NULL);
}

/* ------------------------------------------------------------ benchmarks */

static void bench_work(uv_work_t *w) {
  tccd_tune *t = w->data;
  /* one child at a time, the default first: its outputs are the reference */
  for (int c = 0; c < t->ncand; c++) {
    tune_candidate *cd = &t->cand[c];
    if (cd->build_rc != 0) continue;
    tccd_bench_options o = t->bench;
    o.candidate = c;
    cd->bench_rc = tccd_bench_run(&o, &cd->art, &cd->res, &cd->bench_err);
    if (cd->bench_rc == 0 && cd->res.nkernels != t->sigs.nkernels)
      cd->bench_rc = tcc_error_set(&cd->bench_err, TCC_E_DATA_LOSS,
                                   "benchmark child reported %d kernels, expected %d",
                                   cd->res.nkernels, t->sigs.nkernels);
    atomic_fetch_add(&t->benched, 1);
    if (c == 0 && cd->bench_rc != 0) break; /* nothing to compare with */
  }
}

/* The Redis record kind of tuning records; the tag is remote_tag's. */
#define REMOTE_KIND "tune"

/* Kernel k's record tag: hex SHA-256(signature || target), the same
 * (signature, target) pair as the cache's tuning table key. */
static void remote_tag(const tccd_tune *t, int k, char tag[TCC_SHA256_HEX]) {
  uint8_t d[TCC_SHA256_BYTES];
  tcc_sha256_ctx ctx;
  tcc_sha256_init(&ctx);
  tcc_sha256_update(&ctx, t->sigs.kernels[k].signature, TCC_SHA256_BYTES);
  tcc_sha256_update(&ctx, t->prep->target, strlen(t->prep->target));
  tcc_sha256_final(&ctx, d);
  tcc_hex_encode(d, TCC_SHA256_BYTES, tag);
}

/* Stores the tuning record of kernel k (best candidate `best`). */
static void tune_record(tccd_tune *t, int k, int best, int tried, int discarded) {
  tcc_tune_record r = {.config = t->cands[best],
                       .best_ns = t->cand[best].res.kernel_ns[k],
                       .default_ns = t->cand[0].res.kernel_ns[k],
                       .tried = tried,
                       .discarded = discarded};
  uint8_t *bytes;
  size_t len;
  tcc_error err;
  if (tcc_tune_record_encode(&r, &bytes, &len, &err) == 0) {
    if (tcc_cache_tuning_put(t->st->cache, t->sigs.kernels[k].signature, t->prep->target, bytes,
                             len, &err) != 0)
      log_warn("autotune: could not store the tuning record: %s", err.msg);
    if (t->st->remote) {
      char tag[TCC_SHA256_HEX];
      remote_tag(t, k, tag);
      tccd_remote_record_put(t->st, REMOTE_KIND, tag, bytes, len, 0); /* -1: not connected, not shared */
    }
    free(bytes);
  }
}

static void bench_done(uv_work_t *w, int status) {
  tccd_tune *t = w->data;
  tccd_state *st = t->st;
  const char *h = t->prep->hash_hex;
  tune_candidate *ref = &t->cand[0];
  if (status == UV_ECANCELED || ref->build_rc != 0 || ref->bench_rc != 0) {
    log_warn("autotune %.12s: the default config could not be measured (%s); keeping it untuned", h,
             status == UV_ECANCELED ? "cancelled"
             : ref->build_rc        ? ref->build_err.msg
                                    : ref->bench_err.msg);
    if (ref->bench_rc == TCC_E_DEADLINE_EXCEEDED)
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_timeouts, 1);
    else if (ref->build_rc == 0 && status != UV_ECANCELED)
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_crashed, 1);
    tune_finish(t, NULL);
    return;
  }
  int valid[TCC_TUNE_MAX_CANDIDATES] = {0}, tried = 0, discarded = 0;
  char cfg[TCC_TUNE_CONFIG_TEXT];
  for (int c = 0; c < t->ncand; c++) {
    tune_candidate *cd = &t->cand[c];
    tcc_kernel_config_format(&t->cands[c], cfg, sizeof cfg);
    if (cd->build_rc != 0) {
      log_warn("autotune %.12s: candidate %d (%s) discarded: build failed: %s", h, c, cfg,
               cd->build_err.msg);
      discarded++;
      continue;
    }
    tried++;
    if (cd->bench_rc != 0) {
      int timeout = cd->bench_rc == TCC_E_DEADLINE_EXCEEDED;
      tcc_cache_count(st->cache, timeout ? TCC_COUNTER_autotune_timeouts : TCC_COUNTER_autotune_crashed, 1);
      log_warn("autotune %.12s: candidate %d (%s) discarded: %s: %s", h, c, cfg,
               timeout ? "timed out" : "crashed", cd->bench_err.msg);
      discarded++;
      continue;
    }
    tcc_error cerr;
    if (c > 0 && !ref->res.entry_bad &&
        tcc_bench_compare(ref->art.manifest, ref->art.manifest_len, &ref->res, &cd->res, &cerr) != 0) {
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_wrong, 1);
      log_warn("autotune %.12s: candidate %d (%s) discarded: wrong output: %s", h, c, cfg, cerr.msg);
      discarded++;
      continue;
    }
    valid[c] = 1;
  }
  tcc_cache_count(st->cache, TCC_COUNTER_autotune_candidates, tried);
  for (int k = 0; k < t->sigs.nkernels; k++) {
    if (!t->measure[k]) continue;
    int best = 0;
    double best_ns = ref->res.kernel_ns[k];
    for (int c = 1; c < t->ncand; c++)
      if (valid[c] && t->cand[c].res.kernel_ns[k] < best_ns) {
        best = c;
        best_ns = t->cand[c].res.kernel_ns[k];
      }
    if (best_ns > ref->res.kernel_ns[k] * (1 - TUNE_MIN_GAIN)) best = 0;
    t->chosen[k] = t->cands[best];
    tune_record(t, k, best, tried, discarded);
    log_info("autotune %.12s: k%d (%s) -> candidate %d (%s): %.0f ns vs default %.0f ns", h, k,
             t->sigs.kernels[k].kind, best, tcc_kernel_config_format(&t->cands[best], cfg, sizeof cfg),
             t->cand[best].res.kernel_ns[k], ref->res.kernel_ns[k]);
  }
  tune_final(t);
}

/* ------------------------------------------------------------ candidate builds */

static void build_work(uv_work_t *w) {
  tune_candidate *cd = w->data;
  tccd_tune *t = cd->run;
  int nk = t->sigs.nkernels;
  tcc_kernel_config *cfg = calloc((size_t)nk + 1, sizeof *cfg);
  if (!cfg) {
    cd->build_rc = tcc_error_set(&cd->build_err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (int k = 0; k < nk; k++) cfg[k] = t->cands[cd->index];
  cd->build_rc = tcc_compile_tuned(t->prep, &t->build, cfg, nk, 1, &cd->art, &cd->build_err);
  free(cfg);
}

static void build_done(uv_work_t *w, int status) {
  tune_candidate *cd = w->data;
  tccd_tune *t = cd->run;
  if (status == UV_ECANCELED)
    cd->build_rc = tcc_error_set(&cd->build_err, TCC_E_UNAVAILABLE, "cancelled");
  if (--t->builds_pending > 0) return;
  if (t->st->draining) {
    tune_finish(t, NULL);
    return;
  }
  tcc_cache_count(t->st->cache, TCC_COUNTER_autotune_runs, 1);
  t->work.data = t;
  if (uv_queue_work(t->st->loop, &t->work, bench_work, bench_done) != 0) tune_finish(t, NULL);
}

/* ------------------------------------------------------ signatures + records */

/* The GPUs a benchmark child sees: probed once per daemon process, by
 * the first CUDA tuning run (on a pool thread: tccd-bench --probe, so
 * the daemon never loads libcuda itself). */
static pthread_mutex_t gpu_probe_mu = PTHREAD_MUTEX_INITIALIZER;
static int gpu_probed;
static tccd_gpu_probe_result gpu_probe;

/* CUDA: the device to benchmark t's target on (t->bench.cuda_device), or
 * t->untuned with the reason. Pool thread. */
static void pick_gpu(tccd_tune *t) {
  pthread_mutex_lock(&gpu_probe_mu);
  if (!gpu_probed) {
    tcc_error err;
    if (tccd_gpu_probe(t->bench_exe, t->bench.timeout_ms, &gpu_probe, &err) != 0)
      snprintf(gpu_probe.why, sizeof gpu_probe.why, "%.200s", err.msg);
    gpu_probed = 1;
  }
  const char *arch = strchr(t->prep->target, ':');
  int dev = tccd_gpu_pick(&gpu_probe, arch ? arch + 1 : "");
  if (dev >= 0) {
    t->bench.cuda_device = dev;
  } else {
    t->untuned = 1;
    if (gpu_probe.ndevices == 0)
      snprintf(t->why, sizeof t->why, "no GPU on this daemon: %.250s", gpu_probe.why);
    else
      snprintf(t->why, sizeof t->why, "no GPU on this daemon runs %s natively (device 0 is %s)",
               arch ? arch + 1 : t->prep->target, gpu_probe.device[0].arch);
  }
  pthread_mutex_unlock(&gpu_probe_mu);
}

static void signatures_work(uv_work_t *w) {
  tccd_tune *t = w->data;
  if (t->prep->device == TCC__V1__DEVICE_TYPE__CUDA) {
    pick_gpu(t);
    if (t->untuned) return;
  }
  t->rc = tcc_tune_signatures_make(t->prep, &t->sigs, &t->err);
}

static void tune_measure(tccd_tune *t);

/* A kernel's record from Redis (remote_record_get's done, on the loop):
 * a found record that decodes to one of this daemon's own candidates is
 * stored locally and spares the kernel its benchmark; anything else is
 * ignored (a bad one counted in remote_rejected). The last answer moves
 * the run on. */
static void remote_record_done(void *arg, int found, const uint8_t *data, size_t len) {
  tune_remote_get *g = arg;
  tccd_tune *t = g->run;
  int k = g->kernel;
  free(g);
  tccd_state *st = t->st;
  tcc_tune_record r;
  tcc_error err;
  if (found == 1) {
    int ok = tcc_tune_record_decode(data, len, &r, &err) == 0;
    if (ok) {
      ok = 0;
      for (int c = 0; c < t->ncand; c++) ok |= memcmp(&r.config, &t->cands[c], sizeof r.config) == 0;
      if (!ok) tcc_error_set(&err, TCC_E_INVALID_ARGUMENT, "its config is not one of this daemon's candidates");
    }
    if (ok) {
      if (tcc_cache_tuning_put(st->cache, t->sigs.kernels[k].signature, t->prep->target, data, len, &err) != 0)
        log_warn("autotune: could not store the remote tuning record: %s", err.msg);
      t->chosen[k] = r.config;
      t->measure[k] = 0;
      t->nmeasure--;
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_record_hits, 1);
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_remote_record_hits, 1);
      log_debug("autotune %.12s: k%d has a tuning record from the cluster (%.12s)", t->prep->hash_hex, k,
                t->sigs.kernels[k].signature_hex);
    } else {
      tcc_cache_count(st->cache, TCC_COUNTER_remote_rejected, 1);
      log_warn("autotune %.12s: ignoring k%d's tuning record from the cluster: %s", t->prep->hash_hex, k,
               err.msg);
    }
  }
  if (--t->remote_pending == 0) tune_measure(t);
}

/* Asks Redis for the record of every kernel still to measure; each get
 * that was sent adds one to remote_pending (its done runs later). */
static void tune_ask_remote(tccd_tune *t) {
  for (int k = 0; k < t->sigs.nkernels; k++) {
    if (!t->measure[k]) continue;
    tune_remote_get *g = calloc(1, sizeof *g);
    if (!g) break;
    g->run = t;
    g->kernel = k;
    char tag[TCC_SHA256_HEX];
    remote_tag(t, k, tag);
    t->remote_pending++;
    if (tccd_remote_record_get(t->st, REMOTE_KIND, tag, remote_record_done, g) != 0) {
      t->remote_pending--;
      free(g);
      break; /* not connected: measure here */
    }
  }
}

static void signatures_done(uv_work_t *w, int status) {
  tccd_tune *t = w->data;
  tccd_state *st = t->st;
  if (t->untuned && status != UV_ECANCELED) {
    tcc_cache_count(st->cache, TCC_COUNTER_autotune_untuned, 1);
    log_info("autotune %.12s: %s; the launch heuristic stays (untuned)", t->prep->hash_hex, t->why);
    tune_finish(t, NULL);
    return;
  }
  if (status == UV_ECANCELED || t->rc != 0 || st->draining) {
    if (t->rc) log_warn("autotune %.12s: no kernel signatures: %s", t->prep->hash_hex, t->err.msg);
    tune_finish(t, NULL);
    return;
  }
  int nk = t->sigs.nkernels;
  t->chosen = calloc((size_t)nk + 1, sizeof *t->chosen);
  t->measure = calloc((size_t)nk + 1, sizeof *t->measure);
  if (!t->chosen || !t->measure) {
    tune_finish(t, NULL);
    return;
  }
  for (int k = 0; k < nk; k++) {
    uint8_t *bytes;
    size_t len;
    tcc_error err;
    tcc_tune_record r;
    int rc = tcc_cache_tuning_get(st->cache, t->sigs.kernels[k].signature, t->prep->target, &bytes,
                                  &len, &err);
    if (rc == 0) {
      rc = tcc_tune_record_decode(bytes, len, &r, &err);
      free(bytes);
    }
    if (rc == 0) {
      t->chosen[k] = r.config;
      tcc_cache_count(st->cache, TCC_COUNTER_autotune_record_hits, 1);
      log_debug("autotune %.12s: k%d has a tuning record (%.12s)", t->prep->hash_hex, k,
                t->sigs.kernels[k].signature_hex);
    } else {
      if (rc != TCC_E_NOT_FOUND) log_warn("autotune: ignoring a tuning record: %s", err.msg);
      t->measure[k] = 1;
      t->nmeasure++;
    }
  }
  t->ncand = tcc_tune_candidates(t->prep->device, t->cands);
  if (t->nmeasure > 0 && st->remote) tune_ask_remote(t);
  if (t->remote_pending == 0) tune_measure(t);
}

/* Builds every candidate for the kernels still without a record (or, with
 * none left, goes straight to the final build). */
static void tune_measure(tccd_tune *t) {
  tccd_state *st = t->st;
  if (t->nmeasure == 0 || st->draining) {
    tune_final(t);
    return;
  }
  t->builds_pending = t->ncand;
  log_info("autotune %.12s: %d kernel(s) to measure, %d candidate(s)", t->prep->hash_hex,
           t->nmeasure, t->ncand);
  for (int c = 0; c < t->ncand; c++) {
    tune_candidate *cd = &t->cand[c];
    cd->run = t;
    cd->index = c;
    cd->work.data = cd;
    if (uv_queue_work(st->loop, &cd->work, build_work, build_done) != 0) {
      cd->build_rc = tcc_error_set(&cd->build_err, TCC_E_RESOURCE_EXHAUSTED, "cannot queue the build");
      t->builds_pending--;
    }
  }
  if (t->builds_pending == 0) tune_finish(t, NULL);
}

tccd_tune *tccd_autotune_start(tccd_state *st, const tcc_prepared *prep, tccd_tune_done done,
                               void *arg) {
  tccd_tune *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->st = st;
  t->prep = prep;
  t->done = done;
  t->arg = arg;
  t->start_ns = uv_hrtime();
  t->build.cc = st->cfg->cc;
  t->build.timeout_ms = st->cfg->compile_timeout_ms;
  bench_exe_path(t->bench_exe, sizeof t->bench_exe);
  t->bench.bench_exe = t->bench_exe;
  t->bench.timeout_ms = st->cfg->autotune_timeout_ms;
  t->bench.reps = st->cfg->autotune_reps;
  t->bench.input_sets = 3;
  t->bench.seed = (uint64_t)time(NULL) ^ ((uint64_t)prep->hash[0] << 32 | prep->hash[1]);
  t->work.data = t;
  if (uv_queue_work(st->loop, &t->work, signatures_work, signatures_done) != 0) {
    free(t);
    return NULL;
  }
  return t;
}
