/*
 * warm.c — warm runs (`tcctl warm`): the graphs this daemon holds,
 * compiled again for another target (another CUDA arch, another CPU ISA
 * level), so that a job landing on a new machine type starts with hits.
 * Cross-target compiles need no device: NVRTC builds for any arch.
 *
 * A run starts from a list taken at once: the entries that match its
 * filter (--from-target, --since, --limit) and keep the request they were
 * compiled from (cache schema 6; tcc_cache_list_requests, newest first).
 * It walks the list one entry at a time; its step is a small state
 * machine (step_set asserts every move):
 *
 *            worker idle: the entry's request read from the cache
 *   IDLE ─────────────────────────────────────────────────► PREPARING
 *    ▲  ▲   (gone: evicted since the list was taken; next)     │ offload thread:
 *    │  │                                                      │ decode, retarget,
 *    │  └──── cached or compiling already (present), ◄─────────┤ tcc_prepare
 *    │        or refused (failed)                              ▼
 *    └───────────────── the job ended (compiled / failed) ── COMPILING
 *                                                              (tccd_compile_detached)
 *   IDLE ── list walked, or shutdown ──► DONE
 *
 * Low priority: a step starts only while the pool has an idle worker and
 * no job is queued, and a run compiles one graph at a time, so a job's
 * request waits behind at most one warm compile per run. The compile is
 * an ordinary job (detached: no call waits on it), so a request for the
 * same graph and target coalesces with it. The housekeeping tick (each
 * second) and the end of every step pump the runs.
 *
 * The new entry keeps its own request (retargeted), so it can be warmed
 * further in turn. Runs are kept in memory for progress reports by id
 * (the last WARM_KEEP finished ones too); a restart forgets them, never
 * the entries they stored.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "tcc_target.h"
#include "tcc/v1/tcc.pb-c.h"

#define WARM_KEEP 16 /* finished runs kept for progress reports */

#define WARM_STEPS(X) X(IDLE) X(PREPARING) X(COMPILING) X(DONE)

typedef enum warm_step {
#define WARM_STEP_ENUM(name) WARM_##name,
  WARM_STEPS(WARM_STEP_ENUM)
#undef WARM_STEP_ENUM
} warm_step;

static const char *const warm_step_names[] = {
#define WARM_STEP_NAME(name) #name,
    WARM_STEPS(WARM_STEP_NAME)
#undef WARM_STEP_NAME
};

/* One warm run. */
typedef struct warm_run {
  tccd_state *st;
  uint64_t id;
  warm_step step;
  char spec[128];                 /* the target as asked (retargets requests) */
  char target[64];                /* its label, as entries carry it */
  char from[64];                  /* the source target's label, or "" */
  tcc_cache_stored_request *todo; /* the list, newest first */
  size_t n, next;
  uint32_t compiled, present, failed, gone, without;
  char last_error[512];
  uint64_t started_ns, ended_ns;
  /* PREPARING: in and out of the offload thread */
  uint8_t hash[TCC_SHA256_BYTES]; /* the source entry */
  uint8_t *request;               /* its request; then the retargeted one */
  size_t request_len;
  tcc_prepared *prep;
  tcc_error err;
  struct warm_run *next_run;
} warm_run;

typedef struct tccd_warms {
  warm_run *runs;                 /* newest first */
  uint64_t last_id;
} tccd_warms;

static int step_allowed(warm_step from, warm_step to) {
  switch (from) {
  case WARM_IDLE: return to == WARM_PREPARING || to == WARM_DONE;
  case WARM_PREPARING: return to == WARM_IDLE || to == WARM_COMPILING;
  case WARM_COMPILING: return to == WARM_IDLE;
  case WARM_DONE: return 0;
  }
  return 0;
}

static void step_set(warm_run *w, warm_step to) {
  if (!step_allowed(w->step, to)) {
    log_error("warm run %llu: illegal step %s -> %s", (unsigned long long)w->id, warm_step_names[w->step],
              warm_step_names[to]);
    assert(!"illegal warm run step");
  }
  w->step = to;
}

static void note_failure(warm_run *w, const uint8_t hash[TCC_SHA256_BYTES], const char *msg) {
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  w->failed++;
  snprintf(w->last_error, sizeof w->last_error, "%.16s: %s", hex, msg);
  log_debug("warm run %llu: %.12s for %s failed: %s", (unsigned long long)w->id, hex, w->target, msg);
}

static void pump(warm_run *w);

/* Offload thread: the stored request retargeted, encoded again (the new
 * entry keeps it) and prepared. Touches only w's PREPARING fields and the
 * immutable identity. */
static void prepare_work(void *arg) {
  warm_run *w = arg;
  Tcc__V1__CompileRequest *req = NULL;
  if (tcc_decode_request(w->request, w->request_len, &req, &w->err) != 0) return;
  free(w->request);
  w->request = NULL;
  if (tcc_request_retarget(req, w->spec) != 0) {
    tcc_error_set(&w->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory retargeting the request");
  } else if (tcc_prepare(req, w->st->identity, &w->prep, &w->err) == 0) {
    w->request_len = protobuf_c_message_get_packed_size(&req->base);
    if ((w->request = malloc(w->request_len ? w->request_len : 1)))
      protobuf_c_message_pack(&req->base, w->request);
  }
  tcc__v1__compile_request__free_unpacked(req, NULL);
}

static void compiled(void *arg, int rc, const char *msg) {
  warm_run *w = arg;
  if (rc == 0) w->compiled++;
  else note_failure(w, w->hash, msg);
  step_set(w, WARM_IDLE);
  pump(w);
}

static void prepare_done(void *arg, int cancelled) {
  warm_run *w = arg;
  tcc_prepared *prep = w->prep;
  uint8_t *request = w->request;
  size_t request_len = w->request_len;
  w->prep = NULL;
  w->request = NULL;
  if (cancelled || !prep) {
    note_failure(w, w->hash, cancelled ? "tccd is shutting down" : w->err.msg);
    tcc_prepared_free(prep);
    free(request);
    step_set(w, WARM_IDLE);
    pump(w);
    return;
  }
  if (!request) request_len = 0; /* out of memory: the new entry keeps none */
  step_set(w, WARM_COMPILING);
  tcc_error err;
  tcc_error_clear(&err);
  int rc = tccd_compile_detached(w->st, prep, request, request_len, w->id, compiled, w, &err);
  if (rc == 0) return; /* `compiled` goes on */
  if (rc == 1) w->present++;
  else note_failure(w, w->hash, err.msg);
  step_set(w, WARM_IDLE);
  pump(w);
}

/* May a warm step start now? Only with an idle worker and nothing queued. */
static int pool_idle(tccd_state *st) {
  tccd_job_stats js;
  tccd_jobs_stats(st, &js);
  return js.queued == 0 && js.running < st->cfg->workers;
}

/* Takes the run's next step when it is IDLE and the pool allows. */
static void pump(warm_run *w) {
  tccd_state *st = w->st;
  while (w->step == WARM_IDLE) {
    if (st->draining || w->next >= w->n) {
      step_set(w, WARM_DONE);
      w->ended_ns = uv_hrtime();
      log_info("warm run %llu for %s done: %u compiled, %u present, %u failed, %u gone, %u without a request, "
               "%.1f s",
               (unsigned long long)w->id, w->target, w->compiled, w->present, w->failed, w->gone, w->without,
               (double)(w->ended_ns - w->started_ns) / 1e9);
      free(w->todo);
      w->todo = NULL;
      return;
    }
    if (!pool_idle(st)) return; /* the next tick or step end tries again */
    memcpy(w->hash, w->todo[w->next++].hash, TCC_SHA256_BYTES);
    tcc_error err;
    int rc = tcc_cache_request_of(st->cache, w->hash, &w->request, &w->request_len, &err);
    if (rc == TCC_E_NOT_FOUND) {
      w->gone++;
      continue;
    }
    if (rc != 0) {
      note_failure(w, w->hash, err.msg);
      continue;
    }
    tcc_error_clear(&w->err);
    step_set(w, WARM_PREPARING);
    if (tccd_offload_submit(st, prepare_work, prepare_done, w) != 0) {
      free(w->request);
      w->request = NULL;
      note_failure(w, w->hash, "out of memory");
      step_set(w, WARM_IDLE);
    }
  }
}

void tccd_warm_pump(tccd_state *st) {
  if (!st->warms) return;
  for (warm_run *w = st->warms->runs; w; w = w->next_run) pump(w);
}

static void run_free(warm_run *w) {
  free(w->todo);
  free(w->request);
  tcc_prepared_free(w->prep);
  free(w);
}

void tccd_warm_free(tccd_state *st) {
  if (!st->warms) return;
  for (warm_run *w = st->warms->runs, *next; w; w = next) {
    next = w->next_run;
    assert(w->step == WARM_DONE || w->step == WARM_IDLE); /* the loop has ended: nothing in flight */
    run_free(w);
  }
  free(st->warms);
  st->warms = NULL;
}

/* Drops finished runs beyond the newest WARM_KEEP. */
static void prune(tccd_warms *ws) {
  int kept = 0;
  for (warm_run **p = &ws->runs; *p;) {
    warm_run *w = *p;
    if (w->step == WARM_DONE && ++kept > WARM_KEEP) {
      *p = w->next_run;
      run_free(w);
    } else {
      p = &w->next_run;
    }
  }
}

static void reply_progress(tccd_call *c, const warm_run *w) {
  Tcc__V1__WarmResponse r = TCC__V1__WARM_RESPONSE__INIT;
  r.warm_id = w->id;
  r.target = (char *)w->target;
  r.from_target = (char *)w->from;
  r.total = (uint32_t)w->n;
  r.compiled = w->compiled;
  r.present = w->present;
  r.failed = w->failed;
  r.gone = w->gone;
  r.without_request = w->without;
  r.done = w->step == WARM_DONE;
  r.last_error = (char *)w->last_error;
  r.elapsed_ms = (double)((w->ended_ns ? w->ended_ns : uv_hrtime()) - w->started_ns) / 1e6;
  tccd_call_reply(c, &r.base);
}

/* The label of a target spec (tcc_target_check), or fails the call. */
static int target_label(tccd_call *c, const char *what, const char *spec, char label[64]) {
  Tcc__V1__Target *t = tcc_target_parse(spec);
  if (!t) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "%s must be cpu, cpu:ISA[+FEATURE...] or cuda:sm_XX, got '%.100s'",
                   what, spec);
    return -1;
  }
  tcc_error err;
  int rc = tcc_target_check(t, label, &err);
  tcc__v1__target__free_unpacked(t, NULL);
  if (rc != 0) { /* "target: unknown cpu_isa ..." */
    const char *msg = strncmp(err.msg, "target: ", 8) == 0 ? err.msg + 8 : err.msg;
    tccd_call_fail(c, rc, "%s: %s", what, msg);
    return -1;
  }
  return 0;
}

void tccd_rpc_warm(tccd_state *st, tccd_call *c) {
  Tcc__V1__WarmRequest *req = (Tcc__V1__WarmRequest *)tccd_call_unpack(c, &tcc__v1__warm_request__descriptor);
  if (!req) return;
  if (!st->warms && !(st->warms = calloc(1, sizeof *st->warms))) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if (req->warm_id) {
    warm_run *w = st->warms->runs;
    while (w && w->id != req->warm_id) w = w->next_run;
    if (w) reply_progress(c, w);
    else tccd_call_fail(c, TCC_E_NOT_FOUND, "no warm run %llu (runs are forgotten at a restart)",
                        (unsigned long long)req->warm_id);
    goto out;
  }
  if (st->draining) {
    tccd_call_fail(c, TCC_E_UNAVAILABLE, "tccd is shutting down");
    goto out;
  }
  if (req->since_seconds < 0) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "since_seconds must be >= 0, got %lld", (long long)req->since_seconds);
    goto out;
  }
  warm_run *w = calloc(1, sizeof *w);
  if (!w) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  w->st = st;
  const char *spec = req->target ? req->target : "";
  snprintf(w->spec, sizeof w->spec, "%s", spec);
  if (strlen(spec) >= sizeof w->spec) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "target spec too long");
    run_free(w);
    goto out;
  }
  if (target_label(c, "target", spec, w->target) != 0 ||
      (req->from_target && *req->from_target && target_label(c, "from_target", req->from_target, w->from) != 0)) {
    run_free(w);
    goto out;
  }
  if (w->from[0] && strcmp(w->from, w->target) == 0) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "target and from_target are both %s", w->target);
    run_free(w);
    goto out;
  }
  int64_t since = req->since_seconds ? (int64_t)time(NULL) - req->since_seconds : 0;
  int64_t without = 0;
  tcc_error err;
  if (tcc_cache_list_requests(st->cache, w->from[0] ? w->from : NULL, w->target, since,
                              req->limit > 0 && req->limit <= INT32_MAX ? (int)req->limit : 0, &w->todo, &w->n,
                              &without, &err) != 0) {
    tccd_call_fail_error(c, &err);
    run_free(w);
    goto out;
  }
  w->without = (uint32_t)without;
  w->id = ++st->warms->last_id;
  w->started_ns = uv_hrtime();
  w->next_run = st->warms->runs;
  st->warms->runs = w;
  log_info("warm run %llu: %zu entries of %s to compile for %s (%u keep no request)", (unsigned long long)w->id,
           w->n, w->from[0] ? w->from : "every other target", w->target, w->without);
  pump(w);
  reply_progress(c, w);
  prune(st->warms);
out:
  tcc__v1__warm_request__free_unpacked(req, NULL);
}
