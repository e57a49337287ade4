/*
 * explain.c — the Explain RPC: why a request missed the cache.
 *
 * The guard key of the request (computed from a CompileRequest, or found
 * by guard hash among the entries, the recorded failures and the last
 * TCCD_RECENT_MISSES misses) is read into components (compiler.h,
 * tcc_key_parts_read) and compared with every key stored for the same
 * graph digest; the nearest ones, fewest differing causes first, come
 * back with the components that differ ("input 0 sizes [16, 128] vs
 * [8, 128]"). Causes are header, input, constant and argument parts;
 * intermediate layouts that differ because an input did are counted as
 * derived, not listed.
 *
 * An explain runs as a small machine, so that nothing slow runs on the
 * loop (a key of a large graph takes milliseconds to read):
 *
 *   LOOP    unpack; by hash: copy the key (cache or recent misses)
 *    |  offload
 *   PARTS   by request: tcc_prepare; read the key's parts (graph digest)
 *    |  loop
 *   SIBLINGS  the keys stored under that digest (SQLite: the loop's)
 *    |  offload
 *   DIFF    read each, diff, rank
 *    |  loop
 *   REPLY
 */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"

#define TCCD_RECENT_MISSES 64            /* keys of misses kept for explain */
#define TCCD_RECENT_MISS_KEY_MAX (1 << 20) /* larger keys are not kept */
#define EXPLAIN_SIBLINGS_MAX 256          /* stored keys compared, newest first */
#define EXPLAIN_DIFFS_MAX 16              /* differences listed per candidate */

/* ------------------------------------------------------------ recent misses */

typedef struct recent_miss {
  uint8_t hash[TCC_SHA256_BYTES];
  uint8_t *key;
  size_t key_len;
} recent_miss;

struct tccd_misses {
  recent_miss ring[TCCD_RECENT_MISSES];
  size_t next;
};

void tccd_explain_note_miss(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                            size_t key_len) {
  if (key_len > TCCD_RECENT_MISS_KEY_MAX) return;
  if (!st->misses && !(st->misses = calloc(1, sizeof *st->misses))) return;
  struct tccd_misses *m = st->misses;
  for (size_t i = 0; i < TCCD_RECENT_MISSES; i++)
    if (m->ring[i].key && memcmp(m->ring[i].hash, hash, TCC_SHA256_BYTES) == 0) return;
  uint8_t *copy = malloc(key_len ? key_len : 1);
  if (!copy) return;
  memcpy(copy, key, key_len);
  recent_miss *slot = &m->ring[m->next];
  m->next = (m->next + 1) % TCCD_RECENT_MISSES;
  free(slot->key);
  memcpy(slot->hash, hash, TCC_SHA256_BYTES);
  slot->key = copy;
  slot->key_len = key_len;
}

void tccd_explain_free(tccd_state *st) {
  if (!st->misses) return;
  for (size_t i = 0; i < TCCD_RECENT_MISSES; i++) free(st->misses->ring[i].key);
  free(st->misses);
  st->misses = NULL;
}

static const recent_miss *find_miss(const tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES]) {
  for (size_t i = 0; st->misses && i < TCCD_RECENT_MISSES; i++)
    if (st->misses->ring[i].key && memcmp(st->misses->ring[i].hash, hash, TCC_SHA256_BYTES) == 0)
      return &st->misses->ring[i];
  return NULL;
}

/* ------------------------------------------------------------ the run */

typedef enum explain_step { STEP_PARTS, STEP_DIFF } explain_step;

/* One stored key compared with the explained one. */
typedef struct candidate {
  const tcc_cache_keyed *row;
  int causes, derived;
  size_t ndiffs;
  Tcc__V1__KeyDifference diffs[EXPLAIN_DIFFS_MAX];
  Tcc__V1__KeyDifference *diff_ptrs[EXPLAIN_DIFFS_MAX];
} candidate;

typedef struct explain_run {
  tccd_state *st;
  tccd_call *c;
  uint64_t start_ns;
  explain_step step;
  int max_nearest;
  Tcc__V1__CompileRequest *request; /* by request (owned) */
  uint8_t hash[TCC_SHA256_BYTES];
  uint8_t *key;                     /* the explained key (owned) */
  size_t key_len;
  const char *stored;               /* "entry", "failure", "" */
  tcc_key_parts parts;              /* of key */
  tcc_cache_keyed *siblings;        /* same graph digest, self excluded */
  size_t nsiblings;
  candidate *cands;                 /* one per sibling whose key read */
  size_t ncands;
  int rc;
  tcc_error err;
} explain_run;

static void run_free(explain_run *r) {
  if (r->request) tcc__v1__compile_request__free_unpacked(r->request, NULL);
  free(r->key);
  tcc_key_parts_free(&r->parts);
  for (size_t i = 0; i < r->ncands; i++)
    for (size_t j = 0; j < r->cands[i].ndiffs; j++) {
      free(r->cands[i].diffs[j].component);
      free(r->cands[i].diffs[j].value);
      free(r->cands[i].diffs[j].other);
    }
  free(r->cands);
  tcc_cache_keyed_free(r->siblings, r->nsiblings);
  free(r);
}

static void parts_work(void *arg) {
  explain_run *r = arg;
  if (r->request) {
    tcc_prepared *prep;
    r->rc = tcc_prepare(r->request, r->st->identity, &prep, &r->err);
    if (r->rc) return;
    memcpy(r->hash, prep->hash, TCC_SHA256_BYTES);
    r->key = malloc(prep->key_len ? prep->key_len : 1);
    if (!r->key) {
      tcc_prepared_free(prep);
      r->rc = tcc_error_set(&r->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    memcpy(r->key, prep->key, prep->key_len);
    r->key_len = prep->key_len;
    tcc_prepared_free(prep);
  }
  r->rc = tcc_key_parts_read(r->key, r->key_len, &r->parts, &r->err);
}

static void collect_diff(void *arg, const tcc_key_part *a, const tcc_key_part *b) {
  candidate *cd = arg;
  if (a->cls == TCC_KEY_VALUE) {
    cd->derived++;
    return;
  }
  cd->causes++;
  if (cd->ndiffs == EXPLAIN_DIFFS_MAX) return;
  Tcc__V1__KeyDifference *d = &cd->diffs[cd->ndiffs];
  tcc__v1__key_difference__init(d);
  d->component = strdup(a->name);
  d->value = strdup(a->value);
  d->other = strdup(b->value);
  if (!d->component || !d->value || !d->other) {
    free(d->component), free(d->value), free(d->other);
    return; /* counted, not listed */
  }
  cd->ndiffs++; /* diff_ptrs are set once the candidates stop moving (qsort) */
}

static int candidate_order(const void *pa, const void *pb) {
  const candidate *a = pa, *b = pb;
  if (a->causes != b->causes) return a->causes < b->causes ? -1 : 1;
  if (a->derived != b->derived) return a->derived < b->derived ? -1 : 1;
  if (a->row->created != b->row->created) return a->row->created > b->row->created ? -1 : 1;
  return memcmp(a->row->hash, b->row->hash, TCC_SHA256_BYTES);
}

static void diff_work(void *arg) {
  explain_run *r = arg;
  r->cands = calloc(r->nsiblings ? r->nsiblings : 1, sizeof *r->cands);
  if (!r->cands) {
    r->rc = tcc_error_set(&r->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < r->nsiblings; i++) {
    tcc_key_parts other;
    tcc_error err;
    if (tcc_key_parts_read(r->siblings[i].key, r->siblings[i].key_len, &other, &err) != 0) continue;
    candidate *cd = &r->cands[r->ncands];
    cd->row = &r->siblings[i];
    if (tcc_key_parts_diff(&r->parts, &other, collect_diff, cd) >= 0) r->ncands++;
    tcc_key_parts_free(&other);
  }
  qsort(r->cands, r->ncands, sizeof *r->cands, candidate_order);
}

static void reply(explain_run *r) {
  char hash_hex[TCC_SHA256_HEX], graph_hex[TCC_SHA256_HEX], summary[1024];
  tcc_hex_encode(r->hash, TCC_SHA256_BYTES, hash_hex);
  tcc_hex_encode(r->parts.graph, TCC_SHA256_BYTES, graph_hex);
  size_t n = r->ncands < (size_t)r->max_nearest ? r->ncands : (size_t)r->max_nearest;
  for (size_t i = 0; i < r->ncands; i++)
    for (size_t j = 0; j < r->cands[i].ndiffs; j++) r->cands[i].diff_ptrs[j] = &r->cands[i].diffs[j];
  Tcc__V1__ExplainCandidate *cands = calloc(n ? n : 1, sizeof *cands);
  Tcc__V1__ExplainCandidate **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  char (*hex)[TCC_SHA256_HEX] = calloc(n ? n : 1, sizeof *hex);
  if (!cands || !ptrs || !hex) {
    tccd_call_fail(r->c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const candidate *cd = &r->cands[i];
    tcc__v1__explain_candidate__init(&cands[i]);
    tcc_hex_encode(cd->row->hash, TCC_SHA256_BYTES, hex[i]);
    cands[i].guard_hash = hex[i];
    cands[i].kind = (char *)(cd->row->failure ? "failure" : "entry");
    cands[i].target = (char *)cd->row->target;
    cands[i].created_unix = cd->row->created;
    cands[i].causes = cd->causes;
    cands[i].derived = cd->derived;
    cands[i].n_differences = cd->ndiffs;
    cands[i].differences = (Tcc__V1__KeyDifference **)cd->diff_ptrs;
    ptrs[i] = &cands[i];
  }
  /* the summary names the nearest candidate's first cause */
  if (r->ncands == 0 && r->nsiblings == 0) {
    snprintf(summary, sizeof summary,
             "no %sentry or recorded failure shares the graph: a new graph (its ops or their wiring differ "
             "from every stored one)",
             *r->stored ? "other " : "");
  } else if (r->ncands == 0) {
    snprintf(summary, sizeof summary, "%zu stored key(s) share the graph digest but could not be compared",
             r->nsiblings);
  } else {
    const candidate *best = &r->cands[0];
    if (best->ndiffs > 0) {
      const Tcc__V1__KeyDifference *d = best->diff_ptrs[0];
      char more[48] = "";
      if (best->causes > 1) snprintf(more, sizeof more, " (and %d more)", best->causes - 1);
      snprintf(summary, sizeof summary, "nearest %s %.12s differs in %s: %s vs %s%s",
               best->row->failure ? "failure" : "entry", hex[0], d->component, d->value, d->other, more);
    } else {
      snprintf(summary, sizeof summary, "nearest %s %.12s differs only in %d derived layout(s)",
               best->row->failure ? "failure" : "entry", hex[0], best->derived);
    }
  }
  Tcc__V1__ExplainResponse resp = TCC__V1__EXPLAIN_RESPONSE__INIT;
  resp.guard_hash = hash_hex;
  resp.stored = (char *)r->stored;
  resp.graph_digest = graph_hex;
  resp.same_graph = (int32_t)r->nsiblings;
  resp.n_nearest = n;
  resp.nearest = ptrs;
  resp.summary = summary;
  resp.elapsed_ms = tccd_ms_since(r->start_ns);
  tccd_call_log(TCCD_LOG_DEBUG, r->c, "explain %.12s: %s (%.2f ms)", hash_hex, summary, resp.elapsed_ms);
  tccd_call_reply(r->c, &resp.base);
out:
  free(cands);
  free(ptrs);
  free(hex);
}

static void step_done(void *arg, int cancelled) {
  explain_run *r = arg;
  if (cancelled) {
    tccd_call_fail(r->c, TCC_E_UNAVAILABLE, "tccd is shutting down");
    run_free(r);
    return;
  }
  if (r->rc) {
    tccd_call_fail_error(r->c, &r->err);
    run_free(r);
    return;
  }
  if (r->step == STEP_DIFF) {
    reply(r);
    run_free(r);
    return;
  }
  /* STEP_PARTS done: is the request's own key stored? Then the stored
   * keys of this graph, without this one. */
  tcc_error err;
  if (r->request) {
    uint8_t *key;
    size_t len;
    int failure;
    if (tcc_cache_key_of(r->st->cache, r->hash, &key, &len, &failure, &err) == 0) {
      r->stored = failure ? "failure" : "entry";
      free(key);
    }
  }
  if (tcc_cache_same_graph(r->st->cache, r->parts.graph, EXPLAIN_SIBLINGS_MAX + 1, &r->siblings, &r->nsiblings,
                           &err) != 0) {
    tccd_call_fail_error(r->c, &err);
    run_free(r);
    return;
  }
  for (size_t i = 0; i < r->nsiblings; i++)
    if (memcmp(r->siblings[i].hash, r->hash, TCC_SHA256_BYTES) == 0) {
      free(r->siblings[i].key);
      r->siblings[i] = r->siblings[--r->nsiblings];
      i--;
    }
  if (r->nsiblings > EXPLAIN_SIBLINGS_MAX) {
    for (size_t i = EXPLAIN_SIBLINGS_MAX; i < r->nsiblings; i++) free(r->siblings[i].key);
    r->nsiblings = EXPLAIN_SIBLINGS_MAX;
  }
  r->step = STEP_DIFF;
  if (tccd_offload_submit(r->st, diff_work, step_done, r) != 0) {
    tccd_call_fail(r->c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    run_free(r);
  }
}

void tccd_rpc_explain(tccd_state *st, tccd_call *c) {
  Tcc__V1__ExplainRequest *req =
      (Tcc__V1__ExplainRequest *)tccd_call_unpack(c, &tcc__v1__explain_request__descriptor);
  if (!req) return;
  explain_run *r = calloc(1, sizeof *r);
  if (!r) {
    tcc__v1__explain_request__free_unpacked(req, NULL);
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  r->st = st;
  r->c = c;
  r->start_ns = uv_hrtime();
  r->step = STEP_PARTS;
  r->stored = "";
  r->max_nearest = req->max_nearest > 0 ? (req->max_nearest < 64 ? req->max_nearest : 64) : 3;
  const char *hash = req->guard_hash ? req->guard_hash : "";
  if (req->request && *hash) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "ExplainRequest needs guard_hash or request, not both");
    goto fail;
  }
  if (req->request) {
    r->request = req->request; /* moved: the run prepares it off the loop */
    req->request = NULL;
  } else if (tcc_hex_decode(hash, r->hash, TCC_SHA256_BYTES) != 0) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "ExplainRequest needs a 64-digit guard_hash or a request, got '%.80s'",
                   hash);
    goto fail;
  } else {
    int failure = 0;
    tcc_error err;
    int rc = tcc_cache_key_of(st->cache, r->hash, &r->key, &r->key_len, &failure, &err);
    if (rc == 0) {
      r->stored = failure ? "failure" : "entry";
    } else if (rc == TCC_E_NOT_FOUND) {
      const recent_miss *m = find_miss(st, r->hash);
      if (!m) {
        tccd_call_fail(c, TCC_E_NOT_FOUND,
                       "no entry, recorded failure or recent miss has guard hash %s (explain a request file "
                       "instead: its key is computed)",
                       hash);
        goto fail;
      }
      if (!(r->key = malloc(m->key_len ? m->key_len : 1))) {
        tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
      }
      memcpy(r->key, m->key, m->key_len);
      r->key_len = m->key_len;
    } else {
      tccd_call_fail_error(c, &err);
      goto fail;
    }
  }
  tcc__v1__explain_request__free_unpacked(req, NULL);
  if (tccd_offload_submit(st, parts_work, step_done, r) != 0) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    run_free(r);
  }
  return;
fail:
  tcc__v1__explain_request__free_unpacked(req, NULL);
  run_free(r);
}
