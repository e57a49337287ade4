/*
 * fake_tccd.c — the in-process stand-in for tccd (see fake_tccd.h).
 *
 * One server thread: request a call on the notification queue, serve it
 * to completion on a per-call pluck queue, repeat; a shutdown tag ends the
 * loop. Only test code: errors abort.
 */
#include "fake_tccd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "tcc_digest.h"

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "fake_tccd: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                   \
    }                                                                            \
  } while (0)

struct fake_tccd_private {
  grpc_server *server;
  grpc_completion_queue *cq;   /* notification queue (next) */
  pthread_t thread;
  uint8_t *artifact;
  size_t artifact_len;
  uint8_t *manifest;           /* packed */
  size_t manifest_len;
  char guard_hash[TCC_SHA256_HEX];
  char sha[TCC_SHA256_HEX];
  size_t chunk_bytes;
  int signed_;                 /* signature/key_id below are set */
  uint8_t signature[TCC_SIGNATURE_BYTES];
  char key_id[TCC_SIGN_KEY_ID_HEX];
  pthread_mutex_t mu;          /* guards last_target */
  char last_target[128];
};

static int tag_new, tag_shutdown;

/* ------------------------------------------------------------ call I/O */

typedef struct call_ctx {
  grpc_call *call;
  grpc_completion_queue *cq;   /* pluck, bound to the call */
} call_ctx;

static void run_batch(call_ctx *c, grpc_op *ops, size_t n) {
  void *tag = ops;
  CHECK(grpc_call_start_batch(c->call, ops, n, tag, NULL) == GRPC_CALL_OK);
  grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

/* Receives the request message into a malloc'd buffer (NULL if none). */
static uint8_t *recv_request(call_ctx *c, size_t *len) {
  grpc_byte_buffer *bb = NULL;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &bb;
  run_batch(c, &op, 1);
  if (!bb) return NULL;
  grpc_byte_buffer_reader r;
  CHECK(grpc_byte_buffer_reader_init(&r, bb));
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  grpc_byte_buffer_destroy(bb);
  *len = GRPC_SLICE_LENGTH(s);
  uint8_t *buf = malloc(*len + 1);
  memcpy(buf, GRPC_SLICE_START_PTR(s), *len);
  grpc_slice_unref(s);
  return buf;
}

static grpc_byte_buffer *buffer_of(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

/* Sends an optional message and a status, and waits for the close. */
static void finish(call_ctx *c, int *md_sent, const ProtobufCMessage *m, grpc_status_code code,
                   const char *details) {
  grpc_op ops[4];
  size_t n = 0;
  int cancelled = 0;
  grpc_byte_buffer *bb = m ? buffer_of(m) : NULL;
  grpc_slice det = grpc_slice_from_copied_string(details ? details : "");
  memset(ops, 0, sizeof ops);
  if (!*md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    *md_sent = 1;
  }
  if (bb) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = details ? &det : NULL;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &cancelled;
  run_batch(c, ops, n);
  grpc_slice_unref(det);
  if (bb) grpc_byte_buffer_destroy(bb);
}

static void send_message(call_ctx *c, int *md_sent, const ProtobufCMessage *m) {
  grpc_op ops[2];
  size_t n = 0;
  grpc_byte_buffer *bb = buffer_of(m);
  memset(ops, 0, sizeof ops);
  if (!*md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    *md_sent = 1;
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = bb;
  run_batch(c, ops, n);
  grpc_byte_buffer_destroy(bb);
}

/* ------------------------------------------------------------ handlers */

static void fill_summary(fake_tccd *f, Tcc__V1__EntrySummary *e) {
  tcc__v1__entry_summary__init(e);
  e->guard_hash = f->p->guard_hash;
  e->target = (char *)"cpu:x86-64-v2";
  e->kind = TCC__V1__ARTIFACT_KIND__SHARED_OBJECT;
  e->size = (int64_t)f->p->artifact_len;
  e->hits = 3;
  e->compile_ms = 123.456;
  e->created_unix = 1700000000;
  e->last_used_unix = 1700000600;
  e->kernels = 1;
  e->artifact_sha256 = f->p->sha;
  if (f->p->signed_) e->key_id = f->p->key_id;
}

static void handle(fake_tccd *f, call_ctx *c, const char *method) {
  struct fake_tccd_private *p = f->p;
  int md_sent = 0;
  size_t len = 0;
  uint8_t *req = recv_request(c, &len);
  Tcc__V1__Manifest *manifest = tcc__v1__manifest__unpack(NULL, p->manifest_len, p->manifest);
  CHECK(manifest);

  if (!strcmp(method, "/tcc.v1.Compiler/Compile")) {
    Tcc__V1__CompileRequest *r = tcc__v1__compile_request__unpack(NULL, len, req);
    if (!r) {
      finish(c, &md_sent, NULL, GRPC_STATUS_INVALID_ARGUMENT, "malformed tcc.v1.CompileRequest");
    } else {
      int n = atomic_fetch_add(&f->compile_calls, 1);
      pthread_mutex_lock(&p->mu);
      if (r->target)
        snprintf(p->last_target, sizeof p->last_target, "%s:%s",
                 r->target->device == TCC__V1__DEVICE_TYPE__CUDA ? "cuda" : "cpu",
                 r->target->device == TCC__V1__DEVICE_TYPE__CUDA ? r->target->cuda_arch : r->target->cpu_isa);
      else
        snprintf(p->last_target, sizeof p->last_target, "none");
      pthread_mutex_unlock(&p->mu);
      Tcc__V1__CompileResponse resp = TCC__V1__COMPILE_RESPONSE__INIT;
      Tcc__V1__Artifact art = TCC__V1__ARTIFACT__INIT;
      Tcc__V1__Timings tm = TCC__V1__TIMINGS__INIT;
      resp.guard_hash = p->guard_hash;
      resp.cache = n == 0 ? TCC__V1__CACHE_STATUS__MISS : TCC__V1__CACHE_STATUS__HIT;
      art.kind = TCC__V1__ARTIFACT_KIND__SHARED_OBJECT;
      art.sha256 = p->sha;
      art.size = (int64_t)p->artifact_len;
      tm.decode_ms = 0.25;
      tm.compile_ms = n == 0 ? 42.5 : 0;
      tm.total_ms = 43;
      uint8_t sig[TCC_SIGNATURE_BYTES];
      if (p->signed_) {
        memcpy(sig, p->signature, sizeof sig);
        if (f->tamper_signature) sig[5] ^= 0x10;
        art.signature.data = sig;
        art.signature.len = sizeof sig;
        art.key_id = p->key_id;
      }
      char *own_target = manifest->target; /* restored before the free below */
      if (f->tamper_manifest) manifest->target = (char *)"cpu:x86-64-v4";
      resp.artifact = &art;
      resp.manifest = manifest;
      resp.timings = &tm;
      finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
      manifest->target = own_target;
      tcc__v1__compile_request__free_unpacked(r, NULL);
    }
  } else if (!strcmp(method, "/tcc.v1.Compiler/Fetch")) {
    atomic_fetch_add(&f->fetch_calls, 1);
    Tcc__V1__FetchRequest *r = tcc__v1__fetch_request__unpack(NULL, len, req);
    int known = r && ((*r->sha256 && !strcmp(r->sha256, p->sha)) ||
                      (*r->guard_hash && !strcmp(r->guard_hash, p->guard_hash) && !f->entry_evicted));
    if (!known) {
      finish(c, &md_sent, NULL, GRPC_STATUS_NOT_FOUND, "no such artifact");
    } else {
      uint8_t *data = malloc(p->artifact_len + 1);
      memcpy(data, p->artifact, p->artifact_len);
      if (f->corrupt_fetch && p->artifact_len) data[p->artifact_len / 2] ^= 1;
      size_t off = 0;
      do {
        size_t n = p->artifact_len - off < p->chunk_bytes ? p->artifact_len - off : p->chunk_bytes;
        Tcc__V1__ArtifactChunk ch = TCC__V1__ARTIFACT_CHUNK__INIT;
        Tcc__V1__Artifact art = TCC__V1__ARTIFACT__INIT;
        uint8_t sig[TCC_SIGNATURE_BYTES];
        if (off == 0) {
          art.kind = TCC__V1__ARTIFACT_KIND__SHARED_OBJECT;
          art.sha256 = p->sha;
          art.size = (int64_t)p->artifact_len;
          if (p->signed_ && *r->guard_hash && !f->fetch_unsigned) { /* the entry's signature */
            memcpy(sig, p->signature, sizeof sig);
            if (f->tamper_fetch_signature) sig[9] ^= 0x04;
            art.signature.data = sig;
            art.signature.len = sizeof sig;
            art.key_id = p->key_id;
          }
          ch.artifact = &art;
        }
        ch.offset = (int64_t)off;
        ch.data.data = data + off;
        ch.data.len = n;
        off += n;
        if (off == p->artifact_len) finish(c, &md_sent, &ch.base, GRPC_STATUS_OK, NULL);
        else send_message(c, &md_sent, &ch.base);
      } while (off < p->artifact_len);
      free(data);
    }
    if (r) tcc__v1__fetch_request__free_unpacked(r, NULL);
  } else if (!strcmp(method, "/tcc.v1.Cache/Stats")) {
    if (f->cancel_stats) {
      grpc_call_cancel(c->call, NULL); /* the client sees CANCELLED */
    } else if (f->stall_stats) {
      /* Never answer: wait until the client's deadline (or
       * fake_tccd_stop) cancels the call. */
      atomic_fetch_add(&f->stalled, 1);
      int cancelled = 0;
      grpc_op op;
      memset(&op, 0, sizeof op);
      op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
      op.data.recv_close_on_server.cancelled = &cancelled;
      run_batch(c, &op, 1);
    } else {
      Tcc__V1__StatsResponse s = TCC__V1__STATS_RESPONSE__INIT;
      s.entries = f->entry_evicted ? 0 : 1;
      s.bytes = (int64_t)p->artifact_len;
      s.max_bytes = 1 << 30;
      s.hits = 30;
      s.misses = 8;
      s.coalesced = 2;
      s.compiles = 8;
      s.compile_failures = 1;
      s.evictions = 4;
      s.compile_seconds = 1.5;
      s.compile_seconds_saved = 12.25;
      s.requests = 41;
      s.invalid_requests = 1;
      s.uptime_seconds = 3725;
      s.version = (char *)"0.1.0-fake";
      s.workers = 2;
      s.remote_hits = 0;
      s.negative_hits = 0;
      finish(c, &md_sent, &s.base, GRPC_STATUS_OK, NULL);
    }
  } else if (!strcmp(method, "/tcc.v1.Cache/List")) {
    Tcc__V1__ListRequest *r = tcc__v1__list_request__unpack(NULL, len, req);
    f->last_list_limit = r ? r->limit : -1;
    Tcc__V1__ListResponse resp = TCC__V1__LIST_RESPONSE__INIT;
    Tcc__V1__EntrySummary e;
    Tcc__V1__EntrySummary *entries[1] = {&e};
    fill_summary(f, &e);
    if (!f->entry_evicted && !(r && r->failures)) { /* it records no failures */
      resp.n_entries = 1;
      resp.entries = entries;
      resp.total = 1;
    }
    finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
    if (r) tcc__v1__list_request__free_unpacked(r, NULL);
  } else if (!strcmp(method, "/tcc.v1.Cache/Show") || !strcmp(method, "/tcc.v1.Cache/Evict")) {
    int show = !strcmp(method, "/tcc.v1.Cache/Show");
    Tcc__V1__ShowRequest *r = tcc__v1__show_request__unpack(NULL, len, req); /* same shape as Evict */
    char msg[160];
    if (!r || strlen(r->guard_hash) != 64) {
      finish(c, &md_sent, NULL, GRPC_STATUS_INVALID_ARGUMENT, "guard_hash must be 64 hex digits");
    } else if (strcmp(r->guard_hash, p->guard_hash) || f->entry_evicted) {
      snprintf(msg, sizeof msg, "no cache entry %.64s", r->guard_hash);
      finish(c, &md_sent, NULL, GRPC_STATUS_NOT_FOUND, msg);
    } else if (show) {
      Tcc__V1__ShowResponse resp = TCC__V1__SHOW_RESPONSE__INIT;
      Tcc__V1__EntrySummary e;
      Tcc__V1__Options o = TCC__V1__OPTIONS__INIT;
      fill_summary(f, &e);
      resp.entry = &e;
      resp.manifest = manifest;
      resp.options = &o;
      resp.canonical_key.data = (uint8_t *)"canonical";
      resp.canonical_key.len = 9;
      finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
    } else {
      f->entry_evicted = 1;
      Tcc__V1__EvictResponse resp = TCC__V1__EVICT_RESPONSE__INIT;
      resp.evicted = 1;
      finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
    }
    if (r) tcc__v1__show_request__free_unpacked(r, NULL);
  } else if (!strcmp(method, "/tcc.v1.Cache/Gc")) {
    Tcc__V1__GcRequest *r = tcc__v1__gc_request__unpack(NULL, len, req);
    f->last_gc_max_bytes = r ? r->max_bytes : -1;
    Tcc__V1__GcResponse resp = TCC__V1__GC_RESPONSE__INIT;
    resp.evicted = 2;
    resp.freed_bytes = 2048;
    finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
    if (r) tcc__v1__gc_request__free_unpacked(r, NULL);
  } else if (!strcmp(method, "/grpc.health.v1.Health/Check")) {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    finish(c, &md_sent, &resp.base, GRPC_STATUS_OK, NULL);
  } else {
    finish(c, &md_sent, NULL, GRPC_STATUS_UNIMPLEMENTED, "no such method");
  }
  tcc__v1__manifest__free_unpacked(manifest, NULL);
  free(req);
}

/* ------------------------------------------------------------ loop */

static void *serve(void *arg) {
  fake_tccd *f = arg;
  struct fake_tccd_private *p = f->p;
  for (;;) {
    grpc_call *call = NULL;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_call_details_init(&details);
    grpc_metadata_array_init(&md);
    call_ctx c = {.cq = grpc_completion_queue_create_for_pluck(NULL)};
    CHECK(grpc_server_request_call(p->server, &call, &details, &md, c.cq, p->cq, &tag_new) == GRPC_CALL_OK);
    grpc_event ev;
    int done = 0;
    for (;;) {
      ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
      if (ev.type == GRPC_OP_COMPLETE && ev.tag == &tag_shutdown) {
        done = 1; /* the pending request_call fails next */
        continue;
      }
      break;
    }
    if (ev.type == GRPC_OP_COMPLETE && ev.tag == &tag_new && ev.success) {
      char *method = grpc_slice_to_c_string(details.method);
      c.call = call;
      handle(f, &c, method);
      gpr_free(method);
      grpc_call_unref(call);
    }
    grpc_call_details_destroy(&details);
    grpc_metadata_array_destroy(&md);
    grpc_completion_queue_shutdown(c.cq);
    grpc_completion_queue_destroy(c.cq);
    if (done || !(ev.type == GRPC_OP_COMPLETE && ev.success)) {
      if (!done) { /* wait for the shutdown tag */
        do ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        while (!(ev.type == GRPC_OP_COMPLETE && ev.tag == &tag_shutdown));
      }
      break;
    }
  }
  return NULL;
}

fake_tccd *fake_tccd_start(const fake_tccd_config *cfg) {
  fake_tccd *f = calloc(1, sizeof *f);
  struct fake_tccd_private *p = calloc(1, sizeof *p);
  f->p = p;
  p->artifact = malloc(cfg->artifact_len + 1);
  memcpy(p->artifact, cfg->artifact, cfg->artifact_len);
  p->artifact_len = cfg->artifact_len;
  p->manifest_len = tcc__v1__manifest__get_packed_size(cfg->manifest);
  p->manifest = malloc(p->manifest_len + 1);
  tcc__v1__manifest__pack(cfg->manifest, p->manifest);
  snprintf(p->guard_hash, sizeof p->guard_hash, "%s", cfg->guard_hash);
  uint8_t d[TCC_SHA256_BYTES];
  tcc_sha256(p->artifact, p->artifact_len, d);
  tcc_hex_encode(d, sizeof d, p->sha);
  p->chunk_bytes = cfg->chunk_bytes ? cfg->chunk_bytes : 1000;
  if (cfg->signing_key) { /* exactly what tccd signs: hash, digest, manifest bytes */
    uint8_t guard[TCC_SHA256_BYTES];
    CHECK(tcc_hex_decode(p->guard_hash, guard, sizeof guard) == 0);
    tcc_artifact_sign(cfg->signing_key, guard, d, p->manifest, p->manifest_len, p->signature);
    memcpy(p->key_id, cfg->signing_key->key_id, sizeof p->key_id);
    p->signed_ = 1;
  }
  pthread_mutex_init(&p->mu, NULL);

  grpc_init();
  grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0};
  grpc_channel_args args = {1, &arg};
  p->server = grpc_server_create(&args, NULL);
  p->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(p->server, p->cq, NULL);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(p->server, "127.0.0.1:0", creds);
  grpc_server_credentials_release(creds);
  CHECK(port > 0);
  snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", port);
  grpc_server_start(p->server);
  CHECK(pthread_create(&p->thread, NULL, serve, f) == 0);
  return f;
}

void fake_tccd_stop(fake_tccd *f) {
  struct fake_tccd_private *p = f->p;
  grpc_server_shutdown_and_notify(p->server, p->cq, &tag_shutdown);
  grpc_server_cancel_all_calls(p->server);
  pthread_join(p->thread, NULL);
  grpc_server_destroy(p->server);
  grpc_completion_queue_shutdown(p->cq);
  grpc_event ev;
  do ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  while (ev.type != GRPC_QUEUE_SHUTDOWN);
  grpc_completion_queue_destroy(p->cq);
  grpc_shutdown();
  pthread_mutex_destroy(&p->mu);
  free(p->artifact);
  free(p->manifest);
  free(p);
  free(f);
}

const char *fake_tccd_artifact_sha(const fake_tccd *f) { return f->p->sha; }

void fake_tccd_last_target(fake_tccd *f, char *buf, size_t size) {
  pthread_mutex_lock(&f->p->mu);
  snprintf(buf, size, "%s", f->p->last_target);
  pthread_mutex_unlock(&f->p->mu);
}
