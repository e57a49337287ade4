/*
 * call.c — one gRPC call on the server side: its life, its references,
 * and what a handler may do with it (read the request, reply, fail, or
 * stream an artifact). The handlers (compile.c, rpc.c) and the server
 * (server.c: requests calls from gRPC and dispatches them) both sit on
 * top of this file; it calls neither of them: the server hands each call
 * a `finished` callback to hear its status (the metrics count it) and a
 * `released` one to hear when it is freed.
 *
 * DESIGN
 *
 * A call's life is one state machine (call_set_state asserts every move):
 *
 *   REQUESTED ──request tag, ok──► ACTIVE ──reply / fail (call_finish)──────────► FINISHING
 *     │     (tccd_call_activate)    │   │                                          ▲  ▲  ▲
 *     │                             │   │ tccd_call_stream_artifact, more         │  │  │
 *     │                             │   ▼ than one chunk (stream_next)            │  │  │
 *     │                             │  STREAMING ──the last chunk (call_finish)───┘  │  │
 *     │                             │   │  │                                         │  │
 *     │                             │   │  └──a send failed (stream_stop)───────────┘  │
 *     │      client gone (on_close) │   │ client gone (on_close)                       │
 *     │                             ▼   ▼                                              │
 *     │                            CANCELLED ──reply / fail, or the stream stops at ───┘
 *     │                                         its next send (stream_stop)
 *     └──request tag, !ok (the server is shutting down)──► freed (tccd_call_unref)
 *
 *   REQUESTED  a request is pending in gRPC (grpc_server_request_*call);
 *              nothing has arrived. Holds one reference: the request's.
 *   ACTIVE     the call arrived; the handler owns it and must finish it
 *              exactly once (the request's reference became the
 *              handler's). RECV_CLOSE_ON_SERVER is pending (on_close).
 *   STREAMING  the handler handed it to tccd_call_stream_artifact: chunks
 *              go out one batch at a time (on_send_done sends the next);
 *              the stream holds the handler's reference.
 *   CANCELLED  the client went away (RECV_CLOSE said cancelled) while the
 *              call was ACTIVE or STREAMING. The handler (a compile
 *              waiter, say) still holds it and may still reply (the
 *              status goes nowhere); a stream stops at its next send.
 *   FINISHING  the status is sent or being sent (or a stream stopped):
 *              the handler's reference is dropped; the batches in flight
 *              complete, then the call is freed. A second reply is
 *              ignored. Entering it runs c->finished with the status
 *              (a stopped stream's: CANCELLED): once per call.
 *
 * c->refs counts what still points at the call: each batch in flight,
 * plus one held by the request and then by the handler until it
 * finishes the call (a compile waiter keeps that one while it waits).
 * The call is freed when refs drops to 0 (tccd_call_unref): in REQUESTED
 * (a request that failed) or FINISHING, never in between.
 *
 * Request ids: tccd_call_activate names every call that arrives (the
 * client's own x-request-id when sane, else a fresh id) and every answer
 * carries it back as x-request-id in the initial metadata, and again in
 * the trailing metadata of a failed call (a client that sees only the
 * trailers of an error still finds it). Every log line about the call
 * carries it (tccd_call_log), and call_finish writes the call's last line:
 * at info for a failure no handler logged, at debug otherwise.
 */
#include <assert.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"

static const char *const call_state_names[] = {
#define CALL_STATE_NAME(name) #name,
    TCCD_CALL_STATES(CALL_STATE_NAME)
#undef CALL_STATE_NAME
};

/* The allowed moves of the drawing; anything else is a bug. */
int tccd_call_transition_allowed(tccd_call_state from, tccd_call_state to) {
  switch (from) {
  case TCCD_CALL_REQUESTED: return to == TCCD_CALL_ACTIVE;
  case TCCD_CALL_ACTIVE: return to == TCCD_CALL_STREAMING || to == TCCD_CALL_CANCELLED || to == TCCD_CALL_FINISHING;
  case TCCD_CALL_STREAMING: return to == TCCD_CALL_CANCELLED || to == TCCD_CALL_FINISHING;
  case TCCD_CALL_CANCELLED: return to == TCCD_CALL_FINISHING;
  case TCCD_CALL_FINISHING: return 0;
  }
  return 0;
}

static void call_set_state(tccd_call *c, tccd_call_state to) {
  tccd_call_state from = c->state;
  if (!tccd_call_transition_allowed(from, to)) {
    log_error("%s call: illegal state change %s -> %s", c->method_name, call_state_names[from],
              call_state_names[to]);
    assert(!"illegal call state change");
  }
  c->state = to;
}

/* ------------------------------------------------------------ references */

static void call_free(tccd_call *c) {
  assert(c->state == TCCD_CALL_REQUESTED || c->state == TCCD_CALL_FINISHING);
  tccd_server *srv = c->server;
  void (*released)(tccd_server *) = c->released;
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->request_md);
  if (c->method == TCCD_METHOD__COUNT) grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->send_buf) grpc_byte_buffer_destroy(c->send_buf);
  grpc_slice_unref(c->status_details);
  grpc_slice_unref(c->reply_md.value);
  free(c->stream_data);
  free(c);
  released(srv);
}

void tccd_call_unref(tccd_call *c) {
  if (--c->refs == 0) call_free(c);
}

tccd_call *tccd_call_new(tccd_server *srv, tccd_method_id m, const char *method_name,
                         void (*finished)(tccd_server *srv, tccd_method_id m, int code),
                         void (*released)(tccd_server *srv)) {
  tccd_call *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->server = srv;
  c->method = m;
  c->method_name = method_name;
  c->released = released;
  c->finished = finished;
  c->state = TCCD_CALL_REQUESTED;
  c->refs = 1; /* the pending request */
  c->status_details = grpc_empty_slice();
  c->reply_md.value = grpc_empty_slice();
  grpc_metadata_array_init(&c->request_md);
  if (m == TCCD_METHOD__COUNT) grpc_call_details_init(&c->details);
  return c;
}

/* RECV_CLOSE_ON_SERVER completed: the client is done, or gone. */
static void on_close(void *obj, int ok) {
  tccd_call *c = obj;
  (void)ok;
  if (c->close_cancelled_flag && (c->state == TCCD_CALL_ACTIVE || c->state == TCCD_CALL_STREAMING))
    call_set_state(c, TCCD_CALL_CANCELLED);
  tccd_call_unref(c);
}

static int start_batch(tccd_call *c, const grpc_op *ops, size_t n, tccd_tag *tag) {
  c->refs++;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK) {
    log_error("grpc_call_start_batch failed (%d) on %s", (int)e, c->method_name);
    c->refs--;
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ request ids */

/* A fresh id: 8 hex digits drawn once per process, then a counter (the
 * loop thread is the only caller). */
static void request_id_new(char *out) {
  static uint32_t prefix, counter;
  static int have_prefix;
  if (!have_prefix) {
    if (getrandom(&prefix, sizeof prefix, GRND_NONBLOCK) != (ssize_t)sizeof prefix)
      prefix = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
    have_prefix = 1;
  }
  snprintf(out, TCC_REQUEST_ID_MAX + 1, "%08x%08x", prefix, ++counter);
}

/* The call's id: the client's x-request-id when sane, else a fresh one;
 * kept as the x-request-id every answer carries. */
static void call_name(tccd_call *c) {
  c->request_id[0] = '\0';
  for (size_t i = 0; i < c->request_md.count; i++) {
    const grpc_metadata *m = &c->request_md.metadata[i];
    if (!grpc_slice_str_cmp(m->key, "x-request-id")) {
      size_t n = GRPC_SLICE_LENGTH(m->value);
      const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
      if (tcc_request_id_valid(v, n)) {
        memcpy(c->request_id, v, n);
        c->request_id[n] = '\0';
      }
      break;
    }
  }
  if (!c->request_id[0]) request_id_new(c->request_id);
  c->reply_md.key = grpc_slice_from_static_string("x-request-id");
  grpc_slice_unref(c->reply_md.value);
  c->reply_md.value = grpc_slice_from_copied_string(c->request_id);
}

void tccd_call_activate(tccd_call *c) {
  call_set_state(c, TCCD_CALL_ACTIVE);
  c->start_ns = uv_hrtime();
  call_name(c);
  c->close_tag = (tccd_tag){on_close, c};
  grpc_op op = {0};
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled_flag;
  start_batch(c, &op, 1, &c->close_tag);
}

tccd_log_ctx tccd_call_log_ctx(const tccd_call *c) {
  tccd_log_ctx ctx = TCCD_LOG_CTX_INIT;
  ctx.request_id = c->request_id;
  ctx.method = c->method_name;
  ctx.client = c->client;
  ctx.guard_hash = c->guard_hash;
  ctx.duration_ms = tccd_call_elapsed_ms(c);
  return ctx;
}

void tccd_call_log(tccd_log_level level, const tccd_call *c, const char *fmt, ...) {
  if (!tccd_log_enabled(level)) return;
  tccd_log_ctx ctx = tccd_call_log_ctx(c);
  va_list ap;
  va_start(ap, fmt);
  tccd_log_fieldsv(level, &ctx, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------ replies */

static void on_send_done(void *obj, int ok);

static grpc_byte_buffer *buffer_from(const uint8_t *data, size_t len) {
  grpc_slice s = grpc_slice_malloc(len);
  if (len) memcpy(GRPC_SLICE_START_PTR(s), data, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

static grpc_byte_buffer *buffer_from_message(const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

/* Fills zeroed ops with [initial metadata, unless sent already] [msg,
 * unless NULL: it becomes c->send_buf, destroyed on completion]. Returns
 * how many ops it filled. */
static size_t ops_send(tccd_call *c, grpc_op *ops, grpc_byte_buffer *msg) {
  size_t n = 0;
  if (!c->initial_md_sent) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 1;
    ops[n++].data.send_initial_metadata.metadata = &c->reply_md;
    c->initial_md_sent = 1;
  }
  if (msg) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = msg;
    c->send_buf = msg;
  }
  return n;
}

/* The call's last log line: its status and how long it took. */
static void call_log_end(const tccd_call *c, grpc_status_code status, const char *details) {
  tccd_log_level level = status != GRPC_STATUS_OK && !c->failure_logged ? TCCD_LOG_INFO : TCCD_LOG_DEBUG;
  if (!tccd_log_enabled(level)) return;
  tccd_log_ctx ctx = tccd_call_log_ctx(c);
  ctx.has_status = 1;
  ctx.status = -(int)status;
  if (status == GRPC_STATUS_OK)
    tccd_log_fields(level, &ctx, "%s OK in %.1f ms", c->method_name, ctx.duration_ms);
  else
    tccd_log_fields(level, &ctx, "%s failed in %.1f ms: %s: %s", c->method_name, ctx.duration_ms,
                    tcc_status_name(ctx.status), details ? details : "");
}

/* Sends [initial metadata] [message] [status] in one batch and drops the
 * handler's reference: FINISHING. msg may be NULL (status only). A call
 * FINISHING already keeps its first answer. A failure's trailing
 * metadata carries x-request-id too. */
static void call_finish(tccd_call *c, grpc_byte_buffer *msg, grpc_status_code status,
                        const char *details) {
  if (c->state == TCCD_CALL_FINISHING) {
    if (msg) grpc_byte_buffer_destroy(msg);
    return;
  }
  call_set_state(c, TCCD_CALL_FINISHING);
  c->finished(c->server, c->method, (int)status);
  call_log_end(c, status, details);
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = ops_send(c, ops, msg);
  grpc_slice_unref(c->status_details);
  c->status_details = details && *details ? grpc_slice_from_copied_string(details) : grpc_empty_slice();
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = status;
  if (status != GRPC_STATUS_OK) {
    ops[n].data.send_status_from_server.trailing_metadata_count = 1;
    ops[n].data.send_status_from_server.trailing_metadata = &c->reply_md;
  }
  ops[n++].data.send_status_from_server.status_details = &c->status_details;
  c->send_tag = (tccd_tag){on_send_done, c};
  start_batch(c, ops, n, &c->send_tag);
  tccd_call_unref(c); /* the handler's reference */
}

void tccd_call_reply(tccd_call *c, const ProtobufCMessage *msg) {
  call_finish(c, buffer_from_message(msg), GRPC_STATUS_OK, NULL);
}

void tccd_call_reply_bytes(tccd_call *c, const uint8_t *data, size_t len) {
  call_finish(c, buffer_from(data, len), GRPC_STATUS_OK, NULL);
}

void tccd_call_fail(tccd_call *c, int code, const char *fmt, ...) {
  char msg[TCC_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  grpc_status_code status = code < 0 ? (grpc_status_code)(-code) : GRPC_STATUS_UNKNOWN;
  call_finish(c, NULL, status, msg);
}

void tccd_call_fail_error(tccd_call *c, const tcc_error *err) {
  tccd_call_fail(c, err->code ? err->code : TCC_E_UNKNOWN, "%s", err->msg);
}

/* ------------------------------------------------------------ the request */

grpc_byte_buffer *tccd_call_take_payload(tccd_call *c) {
  grpc_byte_buffer *b = c->payload;
  c->payload = NULL;
  return b;
}

int tccd_payload_read(grpc_byte_buffer *payload, uint8_t **data, size_t *len, tcc_error *err) {
  *data = NULL;
  *len = 0;
  if (!payload) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "missing request message");
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, payload))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "request message could not be decompressed");
  grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  size_t n = GRPC_SLICE_LENGTH(s);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    grpc_slice_unref(s);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory reading a %zu-byte request", n);
  }
  memcpy(buf, GRPC_SLICE_START_PTR(s), n);
  grpc_slice_unref(s);
  *data = buf;
  *len = n;
  return 0;
}

int tccd_call_read_payload(tccd_call *c, uint8_t **data, size_t *len) {
  tcc_error err;
  if (tccd_payload_read(c->payload, data, len, &err) == 0) return 0;
  tccd_call_fail_error(c, &err);
  return -1;
}

ProtobufCMessage *tccd_call_unpack(tccd_call *c, const ProtobufCMessageDescriptor *desc) {
  uint8_t *bytes;
  size_t len;
  if (tccd_call_read_payload(c, &bytes, &len) != 0) return NULL;
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, bytes);
  free(bytes);
  if (!m) tccd_call_fail(c, TCC_E_INVALID_ARGUMENT, "malformed %s", desc->name);
  return m;
}

double tccd_call_elapsed_ms(const tccd_call *c) { return tccd_ms_since(c->start_ns); }

/* ------------------------------------------------------------ streaming */

static void stream_next(tccd_call *c);

void tccd_call_stream_artifact(tccd_call *c, uint8_t *data, size_t len, const char *sha_hex, int kind,
                               size_t chunk, const uint8_t *sig, size_t sig_len, const char *key_id) {
  c->stream_sig_len = sig && sig_len <= sizeof c->stream_sig ? sig_len : 0;
  if (c->stream_sig_len) memcpy(c->stream_sig, sig, c->stream_sig_len);
  snprintf(c->stream_key_id, sizeof c->stream_key_id, "%s", key_id && c->stream_sig_len ? key_id : "");
  c->stream_data = data;
  c->stream_len = len;
  c->stream_off = 0;
  c->stream_chunk = chunk ? chunk : 64 * 1024;
  snprintf(c->stream_sha, sizeof c->stream_sha, "%s", sha_hex);
  c->stream_kind = kind;
  stream_next(c);
}

/* The stream stops (a send failed, or the client is gone): the handler's
 * reference goes, no status is sent. */
static void stream_stop(tccd_call *c) {
  call_set_state(c, TCCD_CALL_FINISHING);
  c->finished(c->server, c->method, GRPC_STATUS_CANCELLED);
  tccd_call_unref(c);
}

/* Sends the next ArtifactChunk; the first one carries the metadata, the
 * last one rides with the OK status. */
static void stream_next(tccd_call *c) {
  size_t off = c->stream_off;
  size_t n = c->stream_len - off;
  if (n > c->stream_chunk) n = c->stream_chunk;
  int first = off == 0, last = off + n == c->stream_len;

  Tcc__V1__ArtifactChunk chunk = TCC__V1__ARTIFACT_CHUNK__INIT;
  Tcc__V1__Artifact meta = TCC__V1__ARTIFACT__INIT;
  if (first) {
    meta.kind = (Tcc__V1__ArtifactKind)c->stream_kind;
    meta.sha256 = c->stream_sha;
    meta.size = (int64_t)c->stream_len;
    meta.signature.data = c->stream_sig;
    meta.signature.len = c->stream_sig_len;
    meta.key_id = c->stream_key_id;
    chunk.artifact = &meta;
  }
  chunk.offset = (int64_t)off;
  chunk.data.data = c->stream_data + off;
  chunk.data.len = n;
  c->stream_off += n;
  grpc_byte_buffer *bb = buffer_from_message(&chunk.base);
  if (last) {
    call_finish(c, bb, GRPC_STATUS_OK, NULL);
    return;
  }
  if (c->state == TCCD_CALL_ACTIVE) call_set_state(c, TCCD_CALL_STREAMING);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t k = ops_send(c, ops, bb);
  c->send_tag = (tccd_tag){on_send_done, c};
  if (start_batch(c, ops, k, &c->send_tag) != 0) {
    grpc_byte_buffer_destroy(bb);
    c->send_buf = NULL;
    stream_stop(c);
  }
}

static void on_send_done(void *obj, int ok) {
  tccd_call *c = obj;
  if (c->send_buf) {
    grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = NULL;
  }
  if (c->state != TCCD_CALL_FINISHING) { /* a streaming step completed */
    if (ok && c->state == TCCD_CALL_STREAMING) stream_next(c);
    else stream_stop(c); /* the client is gone */
  }
  tccd_call_unref(c);
}
