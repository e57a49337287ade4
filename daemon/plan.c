/*
 * plan.c — PutPlan and GetPlan: the daemon keeps plans (tcc.v1.Plan:
 * what a process needs to skip AOTAutograd's trace and tccd's
 * partitioning of one graph; docs/design.md "Plans"). The Python package
 * makes them and hands them over; the daemon is the only writer of the
 * store: it checks, encodes canonically, signs and keeps them.
 *
 * DESIGN
 *
 *   PutPlan ─► size (<= PLAN_MAX_BYTES) ─► offload thread: unpack, check
 *              the fields (format 1, key, versions, forward), every
 *              kernel's request prepared (tcc_prepare: its guard hash and
 *              canonical key, as Compile computes them), client labels
 *              and unknown fields dropped, packed again (canonical
 *              bytes), signed (tcc_sign.h's plan layout)
 *          ─► loop: every kernel's entry present in the cache with the
 *              same canonical key (else FAILED_PRECONDITION) ─► store
 *              (first writer wins: a kept key answers stored=false and
 *              keeps its plan) ─► [--redis: the RemotePlan published,
 *              record kind "plan", tag SHA-256(key) hex]
 *
 *   GetPlan ─► the store ─hit─► verify (the signature against the
 *              trusted keys when the daemon signs; a plan that fails is
 *              removed and answered DATA_LOSS) ─► HIT
 *           ─► miss, --redis: the record ─► RemotePlan checks (format,
 *              key, the signature whenever the daemon has trusted keys)
 *              ─► stored locally ─► REMOTE_HIT
 *           ─► otherwise NOT_FOUND
 *
 * Verifying hashes the whole plan (up to 64 MiB): plans over
 * PLAN_INLINE_BYTES are verified on an offload thread, as are all puts.
 * Everything else, the cache included, is the loop's.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"

#define PLAN_MAX_BYTES (64u << 20)     /* an encoded Plan */
#define PLAN_INLINE_BYTES (64u << 10)  /* verified on the loop up to this */
#define PLAN_TEXT_MAX 200              /* torch_version, package */
#define PLAN_RECORD_KIND "plan"        /* the remote tier's record kind */

/* One kernel a plan names: its guard hash and canonical key. */
typedef struct plan_kernel {
  uint8_t hash[TCC_SHA256_BYTES];
  uint8_t *key;
  size_t key_len;
} plan_kernel;

/* A PutPlan call on its way: what the offload thread made of it. */
typedef struct plan_put {
  tccd_state *st;
  tccd_call *c;
  grpc_byte_buffer *payload;
  tcc_error err;                 /* err.code != 0: refused */
  char key[TCC_CACHE_PLAN_KEY_MAX + 1];
  uint8_t *plan;                 /* canonical bytes */
  size_t plan_len;
  uint8_t sig[TCC_SIGNATURE_BYTES];
  size_t sig_len;
  plan_kernel *kernels;
  size_t nkernels;
} plan_put;

/* A GetPlan call on its way. */
typedef struct plan_get {
  tccd_state *st;
  tccd_call *c;
  char key[TCC_CACHE_PLAN_KEY_MAX + 1];
  tcc_cache_plan p;              /* the plan being answered */
  tcc_error err;                 /* verify's answer */
} plan_get;

/* ------------------------------------------------------------ checks */

/* Drops the unknown fields of m and of every message below it, so that
 * packing gives only what the schema says. */
static void strip_unknown(ProtobufCMessage *m) {
  if (!m) return;
  for (unsigned i = 0; i < m->n_unknown_fields; i++) free(m->unknown_fields[i].data);
  free(m->unknown_fields);
  m->unknown_fields = NULL;
  m->n_unknown_fields = 0;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    char *at = (char *)m + f->offset;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      if (*(uint32_t *)((char *)m + f->quantifier_offset) != f->id) continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(size_t *)((char *)m + f->quantifier_offset);
      ProtobufCMessage **v = *(ProtobufCMessage ***)at;
      for (size_t j = 0; j < n; j++) strip_unknown(v[j]);
    } else {
      strip_unknown(*(ProtobufCMessage **)at);
    }
  }
}

static int text_ok(const char *s) { return s && *s && strlen(s) <= PLAN_TEXT_MAX; }

/* Prepares every kernel of one graph part (forward or backward): its
 * request present, prepared as Compile prepares it, its client label
 * cleared. Returns 0 or a TCC_E_* code with err. */
static int prepare_kernels(plan_put *p, const char *part, Tcc__V1__PlanGraphPart *g) {
  for (size_t i = 0; g && i < g->n_partitions; i++) {
    Tcc__V1__PlanPartition *pp = g->partitions[i];
    for (size_t j = 0; pp && j < pp->n_kernels; j++) {
      Tcc__V1__CompileRequest *req = pp->kernels[j] ? pp->kernels[j]->request : NULL;
      if (!req)
        return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "plan %s partition %zu kernel %zu has no request", part,
                             i, j);
      if (req->client && *req->client) req->client[0] = '\0'; /* a label, not in the key */
      tcc_prepared *prep = NULL;
      tcc_error err;
      int rc = tcc_prepare(req, p->st->identity, &prep, &err);
      if (rc != 0)
        return tcc_error_set(&p->err, rc, "plan %s partition %zu kernel %zu: %s", part, i, j, err.msg);
      plan_kernel *k = realloc(p->kernels, (p->nkernels + 1) * sizeof *k);
      if (k) p->kernels = k;
      if (!k || !(k[p->nkernels].key = malloc(prep->key_len ? prep->key_len : 1))) {
        tcc_prepared_free(prep);
        return tcc_error_set(&p->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      }
      k = &p->kernels[p->nkernels++];
      memcpy(k->hash, prep->hash, TCC_SHA256_BYTES);
      memcpy(k->key, prep->key, prep->key_len);
      k->key_len = prep->key_len;
      tcc_prepared_free(prep);
    }
  }
  return 0;
}

/* The plan's own fields. Returns 0 or TCC_E_INVALID_ARGUMENT with err. */
static int check_plan(plan_put *p, const Tcc__V1__Plan *plan) {
  if (!plan) return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "PutPlanRequest has no plan");
  if (plan->format != 1)
    return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "plan format %u is not supported (this daemon reads 1)",
                         plan->format);
  if (!tccd_name_ok(plan->key, TCC_CACHE_PLAN_KEY_MAX))
    return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT,
                         "plan key must be 1-%d characters of [A-Za-z0-9_.-], got '%.64s'%s", TCC_CACHE_PLAN_KEY_MAX,
                         plan->key ? plan->key : "", plan->key && strlen(plan->key) > 64 ? "..." : "");
  if (!text_ok(plan->torch_version) || !text_ok(plan->package))
    return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "plan %s must be 1-%d characters",
                         text_ok(plan->torch_version) ? "package" : "torch_version", PLAN_TEXT_MAX);
  if (!plan->forward) return tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "plan has no forward graph");
  return 0;
}

/* Offload thread: read, unpack, check, prepare the kernels, pack again,
 * sign. Touches only p, the immutable identity and the signing key. */
static void put_work(void *arg) {
  plan_put *p = arg;
  uint8_t *bytes = NULL;
  size_t len = 0;
  int rc = tccd_payload_read(p->payload, &bytes, &len, &p->err);
  grpc_byte_buffer_destroy(p->payload);
  p->payload = NULL;
  if (rc != 0) return;
  Tcc__V1__PutPlanRequest *req = tcc__v1__put_plan_request__unpack(NULL, len, bytes);
  free(bytes);
  if (!req) {
    tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "malformed tcc.v1.PutPlanRequest");
    return;
  }
  Tcc__V1__Plan *plan = req->plan;
  if (check_plan(p, plan) == 0 && prepare_kernels(p, "forward", plan->forward) == 0 &&
      prepare_kernels(p, "backward", plan->backward) == 0) {
    snprintf(p->key, sizeof p->key, "%s", plan->key);
    strip_unknown(&plan->base);
    p->plan_len = protobuf_c_message_get_packed_size(&plan->base);
    if (p->plan_len > PLAN_MAX_BYTES)
      tcc_error_set(&p->err, TCC_E_INVALID_ARGUMENT, "plan is %zu bytes encoded (limit %u)", p->plan_len,
                    PLAN_MAX_BYTES);
    else if (!(p->plan = malloc(p->plan_len ? p->plan_len : 1)))
      tcc_error_set(&p->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    else
      protobuf_c_message_pack(&plan->base, p->plan);
    if (p->plan && p->st->signing_key) {
      tcc_plan_sign(p->st->signing_key, p->key, p->plan, p->plan_len, p->sig);
      p->sig_len = TCC_SIGNATURE_BYTES;
    }
  }
  tcc__v1__put_plan_request__free_unpacked(req, NULL);
}

static void plan_put_free(plan_put *p) {
  if (p->payload) grpc_byte_buffer_destroy(p->payload);
  for (size_t i = 0; i < p->nkernels; i++) free(p->kernels[i].key);
  free(p->kernels);
  free(p->plan);
  free(p);
}

/* ------------------------------------------------------------ remote */

/* The record tag of a plan key: SHA-256(key) in hex. */
static void plan_tag(const char *key, char tag[TCC_SHA256_HEX]) {
  uint8_t d[TCC_SHA256_BYTES];
  tcc_sha256(key, strlen(key), d);
  tcc_hex_encode(d, TCC_SHA256_BYTES, tag);
}

/* Writes a stored plan through to the remote tier (fire and forget). */
static void publish(tccd_state *st, const char *key, const uint8_t *plan, size_t len, const uint8_t *sig,
                    size_t sig_len, const char *key_id) {
  if (!st->remote) return;
  Tcc__V1__RemotePlan r = TCC__V1__REMOTE_PLAN__INIT;
  r.format = 1;
  r.key = (char *)key;
  r.plan.data = (uint8_t *)plan;
  r.plan.len = len;
  r.signature.data = (uint8_t *)sig;
  r.signature.len = sig_len;
  r.key_id = (char *)key_id;
  r.created_unix = (int64_t)time(NULL);
  size_t n = protobuf_c_message_get_packed_size(&r.base);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return;
  protobuf_c_message_pack(&r.base, buf);
  char tag[TCC_SHA256_HEX];
  plan_tag(key, tag);
  if (tccd_remote_record_put(st, PLAN_RECORD_KIND, tag, buf, n, 1) != 0)
    log_debug("plan %.64s: not written to the remote tier (not connected)", key);
  free(buf);
}

/* ------------------------------------------------------------ PutPlan */

/* Loop: the kernels present, then the store and the answer. */
static void put_done(void *arg, int cancelled) {
  plan_put *p = arg;
  tccd_state *st = p->st;
  tccd_call *c = p->c;
  if (cancelled) {
    tccd_call_fail(c, TCC_E_UNAVAILABLE, "tccd is shutting down");
    goto out;
  }
  if (p->err.code != 0) {
    tccd_call_log(TCCD_LOG_INFO, c, "plan refused (%s): %s", tcc_status_name(p->err.code), p->err.msg);
    c->failure_logged = 1;
    tccd_call_fail_error(c, &p->err);
    goto out;
  }
  for (size_t i = 0; i < p->nkernels; i++) {
    const plan_kernel *k = &p->kernels[i];
    uint8_t *key = NULL;
    size_t key_len = 0;
    int failure = 0;
    tcc_error err;
    int rc = tcc_cache_key_of(st->cache, k->hash, &key, &key_len, &failure, &err);
    int same = rc == 0 && !failure && key_len == k->key_len && memcmp(key, k->key, key_len) == 0;
    free(key);
    if (rc != 0 && rc != TCC_E_NOT_FOUND) {
      tccd_call_fail_error(c, &err);
      goto out;
    }
    if (!same) {
      char hex[TCC_SHA256_HEX];
      tcc_hex_encode(k->hash, TCC_SHA256_BYTES, hex);
      tccd_call_fail(c, TCC_E_FAILED_PRECONDITION, "plan names a kernel this daemon has not compiled (guard %.12s)",
                     hex);
      goto out;
    }
  }
  const char *key_id = p->sig_len ? st->signing_key->key_id : "";
  int inserted = 0;
  tcc_error err;
  if (tcc_cache_plan_put(st->cache, p->key, p->plan, p->plan_len, p->sig, p->sig_len, key_id, &inserted, &err) !=
      0) {
    tccd_call_fail_error(c, &err);
    goto out;
  }
  if (inserted) {
    tcc_cache_count(st->cache, TCC_COUNTER_plans_stored, 1);
    publish(st, p->key, p->plan, p->plan_len, p->sig, p->sig_len, key_id);
  }
  tccd_call_log(TCCD_LOG_DEBUG, c, "plan %.64s: %s (%zu bytes, %zu kernels)", p->key,
                inserted ? "stored" : "kept already", p->plan_len, p->nkernels);
  Tcc__V1__PutPlanResponse r = TCC__V1__PUT_PLAN_RESPONSE__INIT;
  r.stored = inserted;
  r.bytes = (int64_t)p->plan_len;
  tccd_call_reply(c, &r.base);
out:
  plan_put_free(p);
}

void tccd_rpc_put_plan(tccd_state *st, tccd_call *c) {
  if (strcmp(st->cfg->plan_writers, "none") == 0) {
    tccd_call_fail(c, TCC_E_PERMISSION_DENIED, "this daemon takes no plans (--plan-writers none)");
    return;
  }
  plan_put *p = calloc(1, sizeof *p);
  if (!p) {
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  p->st = st;
  p->c = c;
  p->payload = tccd_call_take_payload(c);
  size_t n = p->payload ? grpc_byte_buffer_length(p->payload) : 0;
  if (!p->payload) {
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "PutPlanRequest has no plan");
    plan_put_free(p);
    return;
  }
  if (n > PLAN_MAX_BYTES + 4096) { /* the request's framing on top of the plan */
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "PutPlanRequest is %zu bytes (a plan's limit is %u)", n,
                   PLAN_MAX_BYTES);
    plan_put_free(p);
    return;
  }
  if (tccd_offload_submit(st, put_work, put_done, p) == 0) return;
  put_work(p);
  put_done(p, 0);
}

/* ------------------------------------------------------------ GetPlan */

static void plan_get_free(plan_get *g) {
  tcc_cache_plan_free(&g->p);
  free(g);
}

/* Any thread: g->p's signature against the trusted keys into g->err
 * (only when the daemon signs; unsigned plans are served only with
 * --no-signing). Touches only g and the immutable trusted keys. */
static void verify_work(void *arg) {
  plan_get *g = arg;
  tcc_error_clear(&g->err);
  if (!g->st->signing_key) return;
  tcc_plan_verify(&g->st->trusted, g->p.key_id, g->key, g->p.plan, g->p.plan_len, g->p.signature,
                  g->p.signature_len, &g->err);
}

/* Answers a plan (counted in plan_hits). */
static void reply_plan(tccd_state *st, tccd_call *c, const tcc_cache_plan *p, Tcc__V1__CacheStatus status) {
  tcc_cache_count(st->cache, TCC_COUNTER_plan_hits, 1);
  Tcc__V1__GetPlanResponse r = TCC__V1__GET_PLAN_RESPONSE__INIT;
  r.plan.data = p->plan;
  r.plan.len = p->plan_len;
  r.signature.data = (uint8_t *)p->signature;
  r.signature.len = p->signature_len;
  r.key_id = (char *)p->key_id;
  r.cache = status;
  tccd_call_reply(c, &r.base);
}

/* Loop: the answer for a verified (or refused) plan. */
static void verify_done(void *arg, int cancelled) {
  plan_get *g = arg;
  tccd_state *st = g->st;
  tccd_call *c = g->c;
  if (cancelled) {
    tccd_call_fail(c, TCC_E_UNAVAILABLE, "tccd is shutting down");
  } else if (g->err.code != 0) {
    log_warn("plan %.64s fails verification (%s); removed", g->key, g->err.msg);
    tcc_error err;
    tcc_cache_plan_delete(st->cache, g->key, &err);
    tccd_call_fail(c, TCC_E_DATA_LOSS, "the stored plan for key '%.200s' fails verification (%s); removed", g->key,
                   g->err.msg);
  } else {
    reply_plan(st, c, &g->p, TCC__V1__CACHE_STATUS__HIT);
  }
  plan_get_free(g);
}

/* Verifies g->p (on an offload thread when it is large), then answers. */
static void verify_then_answer(plan_get *g) {
  if (g->st->signing_key && g->p.plan_len > PLAN_INLINE_BYTES &&
      tccd_offload_submit(g->st, verify_work, verify_done, g) == 0)
    return;
  verify_work(g);
  verify_done(g, 0);
}

static void answer_not_found(plan_get *g) {
  tcc_cache_count(g->st->cache, TCC_COUNTER_plan_misses, 1);
  tccd_call_fail(g->c, TCC_E_NOT_FOUND, "no plan for key '%.200s'", g->key);
  plan_get_free(g);
}

/* Checks a RemotePlan for g (format, key, the signature whenever the
 * daemon has trusted keys) and takes its plan into g->p. Returns 0 or
 * a code with the reason in err. */
static int remote_plan_take(plan_get *g, const uint8_t *data, size_t len, tcc_error *err) {
  const tccd_state *st = g->st;
  Tcc__V1__RemotePlan *m = tcc__v1__remote_plan__unpack(NULL, len, data);
  if (!m) return tcc_error_set(err, TCC_E_DATA_LOSS, "the record is not a RemotePlan");
  int rc = 0;
  if (m->format != 1)
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "format %u (this daemon reads 1)", m->format);
  else if (strcmp(m->key, g->key) != 0)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "it names another key ('%.64s')", m->key);
  else if (m->plan.len == 0 || m->plan.len > PLAN_MAX_BYTES || m->signature.len > TCC_SIGNATURE_BYTES ||
           strlen(m->key_id) >= sizeof g->p.key_id)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "malformed (%zu plan bytes, %zu signature bytes)", m->plan.len,
                       m->signature.len);
  else if (st->trusted.n > 0)
    rc = tcc_plan_verify(&st->trusted, m->key_id, g->key, m->plan.data, m->plan.len, m->signature.data,
                         m->signature.len, err);
  if (rc == 0) {
    g->p.plan = m->plan.data; /* taken: the message frees what is left */
    g->p.plan_len = m->plan.len;
    m->plan.data = NULL;
    m->plan.len = 0;
    memcpy(g->p.signature, m->signature.data, m->signature.len);
    g->p.signature_len = m->signature.len;
    snprintf(g->p.key_id, sizeof g->p.key_id, "%s", m->key_id);
  }
  tcc__v1__remote_plan__free_unpacked(m, NULL);
  return rc;
}

/* Loop: the remote tier's answer for a local miss. */
static void remote_done(void *arg, int found, const uint8_t *data, size_t len) {
  plan_get *g = arg;
  tccd_state *st = g->st;
  if (found != 1) { /* absent, or refused / an error (remote.c counted and logged it) */
    answer_not_found(g);
    return;
  }
  tcc_error err;
  if (remote_plan_take(g, data, len, &err) != 0) {
    tcc_cache_count(st->cache, TCC_COUNTER_remote_rejected, 1);
    log_warn("remote plan for key %.64s refused: %s", g->key, err.msg);
    answer_not_found(g);
    return;
  }
  int inserted = 0;
  if (tcc_cache_plan_put(st->cache, g->key, g->p.plan, g->p.plan_len, g->p.signature, g->p.signature_len,
                         g->p.key_id, &inserted, &err) != 0)
    log_warn("remote plan for key %.64s not stored locally: %s", g->key, err.msg);
  tccd_call_log(TCCD_LOG_DEBUG, g->c, "plan %.64s: remote hit (%zu bytes)", g->key, g->p.plan_len);
  reply_plan(st, g->c, &g->p, TCC__V1__CACHE_STATUS__REMOTE_HIT);
  plan_get_free(g);
}

void tccd_rpc_get_plan(tccd_state *st, tccd_call *c) {
  Tcc__V1__GetPlanRequest *req =
      (Tcc__V1__GetPlanRequest *)tccd_call_unpack(c, &tcc__v1__get_plan_request__descriptor);
  if (!req) return;
  int key_ok = tccd_name_ok(req->key, TCC_CACHE_PLAN_KEY_MAX);
  plan_get *g = key_ok ? calloc(1, sizeof *g) : NULL;
  if (!key_ok)
    tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "plan key must be 1-%d characters of [A-Za-z0-9_.-]",
                   TCC_CACHE_PLAN_KEY_MAX);
  else if (!g)
    tccd_call_fail(c, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  else
    snprintf(g->key, sizeof g->key, "%s", req->key);
  tcc__v1__get_plan_request__free_unpacked(req, NULL);
  if (!g) return;
  g->st = st;
  g->c = c;
  tcc_error err;
  int rc = tcc_cache_plan_get(st->cache, g->key, &g->p, &err);
  if (rc == 0) {
    verify_then_answer(g);
    return;
  }
  if (rc != TCC_E_NOT_FOUND) { /* DATA_LOSS: a plan whose bytes no longer match (removed) */
    if (rc == TCC_E_DATA_LOSS) log_warn("%s", err.msg);
    tccd_call_fail_error(c, &err);
    plan_get_free(g);
    return;
  }
  char tag[TCC_SHA256_HEX];
  plan_tag(g->key, tag);
  if (tccd_remote_record_get(st, PLAN_RECORD_KIND, tag, remote_done, g) != 0) answer_not_found(g);
}
