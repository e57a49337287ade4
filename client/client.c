/*
 * client.c — libtccclient's RPC half: connect, unary calls, the streamed
 * Fetch, the local artifact cache, and the typed admin calls.
 *
 * gRPC C core, synchronously: every call gets its own pluck completion
 * queue, runs its batches with grpc_call_start_batch and waits for each
 * with grpc_completion_queue_pluck. The channel is thread-safe, so one
 * tcc_client serves any number of threads.
 *
 *   unary:  [SEND_INITIAL_METADATA SEND_MESSAGE SEND_CLOSE_FROM_CLIENT
 *            RECV_INITIAL_METADATA RECV_MESSAGE RECV_STATUS_ON_CLIENT]
 *   Fetch:  [SEND_INITIAL_METADATA SEND_MESSAGE SEND_CLOSE_FROM_CLIENT
 *            RECV_INITIAL_METADATA], then [RECV_MESSAGE] until it yields
 *            no message, then [RECV_STATUS_ON_CLIENT]
 *
 * Every call has a deadline (gpr monotonic clock), so pluck never waits
 * forever. A call that fails with UNAVAILABLE before any answer (the
 * daemon restarted, the channel went idle) waits once for the channel to
 * become READY and is retried: every tccd call is idempotent (Compile
 * deduplicates by guard hash). CANCELLED counts as UNAVAILABLE: the client
 * cancels no call whose status it reports, so it was the daemon going
 * away (killed, or shut down past its grace period) or the connection.
 *
 * Failing fast (wait_ready): a client never waits out a refused
 * connection. The channel's states, and what waiting for READY does in
 * each (connect, and the retry after UNAVAILABLE):
 *
 *   IDLE ──(try to connect)──► CONNECTING ──────────► READY: go on
 *                                 │    └─(connect timeout)─► UNAVAILABLE
 *                                 │       "not ready after N ms": a daemon
 *                                 │       slow to accept, packets dropped
 *                                 ▼
 *                          TRANSIENT_FAILURE ──► UNAVAILABLE at once,
 *                          (refused, no such     with gRPC's reason
 *                           name, TLS refused)
 *
 * gRPC's pick_first keeps a failed channel in TRANSIENT_FAILURE until a
 * connection is READY (it never shows CONNECTING again), so that state is
 * the verdict of the last attempt, and it tries again in the background.
 * How soon: after its reconnect backoff (gRPC's default grows to two
 * minutes) and, once calls have failed on the channel, after the next
 * re-resolution of the name (the DNS resolver's default cooldown is 30 s,
 * even for an IP address). Both are capped at RECONNECT_BACKOFF_MAX_MS, so
 * a daemon that comes back is used again within about a second; a call in
 * that second may still be answered UNAVAILABLE from the last verdict.
 * Nothing waits for a daemon that is restarting. (grpc_channel_reset_
 * connect_backoff on each failure made it slower, not faster: 5 s.)
 *
 * gRPC lifetime: the first connect runs grpc_init() (under a mutex, so
 * racing first connects are safe) and the library keeps that reference
 * for the life of the process, so connect/close cycles do not restart
 * gRPC's threads. tcc_client_library_shutdown() drops it for programs
 * that want a clean valgrind report; it is only safe once every client is
 * closed, which is why nothing calls it implicitly (an atexit handler
 * could run while another thread still uses a client).
 *
 * Local artifact cache (options.artifact_dir): one file per artifact,
 * named by its lowercase hex SHA-256, written to a temporary name and
 * renamed into place (readers never see a partial file), and verified on
 * every read: a file whose digest does not match is deleted and fetched
 * again. Failing to write the cache never fails a fetch.
 *
 * Signatures (tcc_sign.h): with trusted keys (options.trusted_keys or
 * $TCCD_TRUSTED_KEYS), a CompileResponse is accepted only when its
 * Artifact.signature verifies, with the key its key_id names, over the
 * response's guard hash, artifact digest and the manifest's bytes exactly
 * as they arrived (field 4, found by walking the top-level wire format,
 * never re-encoded). The artifact's bytes are then held to that digest
 * by fetch and by tcc_module_load, so nothing unsigned or altered is ever
 * loaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "client_internal.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tccclient.h"

#define DEFAULT_DEADLINE_MS 60000
#define DEFAULT_CONNECT_TIMEOUT_MS 5000
#define MAX_RECEIVE_BYTES (256 << 20)
#define MAX_ARTIFACT_BYTES ((int64_t)1 << 31)
#define RECONNECT_BACKOFF_MAX_MS 1000 /* a failed channel re-probes at least this often */
#define REASON_PROBE_MS 100           /* asking a failed channel why (connect_failure_reason) */

struct tcc_client {
  grpc_channel *channel;
  char *addr;
  int deadline_ms;
  int connect_timeout_ms;
  char *artifact_dir;        /* NULL = no local artifact cache */
  tcc_trusted_keys trusted;  /* signature check before anything loads */
  grpc_slice auth_value;     /* "Bearer TOKEN", or empty: no token */
  grpc_slice auth_key;       /* "authorization" */
};

/* ------------------------------------------------------------ gRPC init */

static pthread_mutex_t grpc_mu = PTHREAD_MUTEX_INITIALIZER;
static int grpc_live;

static void library_init(void) {
  pthread_mutex_lock(&grpc_mu);
  if (!grpc_live) {
    grpc_init();
    grpc_live = 1;
  }
  pthread_mutex_unlock(&grpc_mu);
}

void tcc_client_library_shutdown(void) {
  pthread_mutex_lock(&grpc_mu);
  if (grpc_live) {
    grpc_shutdown();
    grpc_live = 0;
  }
  pthread_mutex_unlock(&grpc_mu);
}

/* ------------------------------------------------------------ helpers */

static gpr_timespec deadline_after_ms(int ms) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static int effective_deadline_ms(const tcc_client *c, int deadline_ms) {
  return deadline_ms > 0 ? deadline_ms : c->deadline_ms;
}

static const char *state_name(grpc_connectivity_state s) {
  switch (s) {
  case GRPC_CHANNEL_IDLE: return "IDLE";
  case GRPC_CHANNEL_CONNECTING: return "CONNECTING";
  case GRPC_CHANNEL_READY: return "READY";
  case GRPC_CHANNEL_TRANSIENT_FAILURE: return "TRANSIENT_FAILURE";
  case GRPC_CHANNEL_SHUTDOWN: return "SHUTDOWN";
  }
  return "?";
}

/* Shuts down and destroys a pluck queue whose every event was plucked. */
static void cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
}

/* Copies a byte buffer into a malloc'd array (+1 byte, so an empty message
 * is still a non-NULL pointer). Returns 0 or -1 when out of memory. */
static int byte_buffer_copy(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) return -1;
  grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  size_t n = GRPC_SLICE_LENGTH(s);
  uint8_t *buf = malloc(n + 1);
  if (buf) memcpy(buf, GRPC_SLICE_START_PTR(s), n);
  grpc_slice_unref(s);
  if (!buf) return -1;
  *out = buf;
  *len = n;
  return 0;
}

/* The daemon's x-request-id for the call (initial metadata, else
 * trailing) into out (TCC_REQUEST_ID_MAX + 1 bytes); "" when there is none
 * that is a valid request id. */
static void request_id_from(const grpc_metadata_array *initial_md, const grpc_metadata_array *trailing_md,
                            char *out) {
  out[0] = '\0';
  const grpc_metadata_array *arrays[2] = {initial_md, trailing_md};
  for (int a = 0; a < 2; a++)
    for (size_t i = 0; i < arrays[a]->count; i++) {
      const grpc_metadata *m = &arrays[a]->metadata[i];
      size_t n = GRPC_SLICE_LENGTH(m->value);
      const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
      if (grpc_slice_str_cmp(m->key, "x-request-id") == 0 && tcc_request_id_valid(v, n)) {
        memcpy(out, v, n);
        out[n] = '\0';
        return;
      }
    }
}

/* Turns a finished call's status into 0 or -(status) with the daemon's
 * message and request id (from its metadata); frees details and
 * error_string. CANCELLED becomes UNAVAILABLE (see the top of the file):
 * "cancelled by tccd or the connection: ...". */
static int status_to_error(grpc_status_code status, grpc_slice details, const char *error_string,
                           const char *method, const grpc_metadata_array *initial_md,
                           const grpc_metadata_array *trailing_md, tcc_error *err) {
  int rc = 0;
  if (status != GRPC_STATUS_OK) {
    int code = status > 0 && status <= 16 ? -(int)status : TCC_E_UNKNOWN;
    const char *pre = "";
    if (code == TCC_E_CANCELLED) {
      code = TCC_E_UNAVAILABLE;
      pre = "cancelled by tccd or the connection: ";
    }
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n)
      rc = tcc_error_set(err, code, "%s%.*s", pre, (int)n, (const char *)GRPC_SLICE_START_PTR(details));
    else
      rc = tcc_error_set(err, code, "%s%s failed: %s", pre, method, tcc_strerror(code));
    if (err) request_id_from(initial_md, trailing_md, err->request_id);
  }
  grpc_slice_unref(details);
  if (error_string) gpr_free((void *)error_string);
  return rc;
}

/* Waits up to timeout_ms for the channel to be READY (starting a connect
 * if idle), failing fast (see the top of the file): TRANSIENT_FAILURE,
 * there already or reached while waiting, returns at once. Returns 1 when
 * ready, else 0 with *last set to the state (CONNECTING or IDLE: the
 * timeout passed; TRANSIENT_FAILURE: an attempt failed). */
static int wait_ready(tcc_client *c, int timeout_ms, grpc_connectivity_state *last) {
  gpr_timespec deadline = deadline_after_ms(timeout_ms);
  grpc_completion_queue *cq = NULL;
  grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->channel, 1);
  int ready = 0;
  for (;;) {
    if (s == GRPC_CHANNEL_READY) {
      ready = 1;
      break;
    }
    if (s == GRPC_CHANNEL_SHUTDOWN || s == GRPC_CHANNEL_TRANSIENT_FAILURE) break;
    if (!cq) cq = grpc_completion_queue_create_for_pluck(NULL);
    void *tag = &s;
    grpc_channel_watch_connectivity_state(c->channel, s, deadline, cq, tag);
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success) break; /* timed out */
    s = grpc_channel_check_connectivity_state(c->channel, 1);
  }
  if (cq) cq_destroy(cq);
  if (last) *last = s;
  return ready;
}

/* ------------------------------------------------------------ connect */

static int unary_once(tcc_client *c, const char *method, const uint8_t *req, size_t req_len,
                      uint8_t **resp, size_t *resp_len, gpr_timespec deadline, tcc_error *err);

/* gRPC's reason for a failed connection, without its preamble: of
 * "failed to connect to all addresses; last error: UNKNOWN:
 * ipv4:127.0.0.1:1: Failed to connect to remote host: Connection
 * refused", what follows the last "last error: " and its status name
 * ("UNKNOWN: ", "UNAVAILABLE: "). NULL when msg is not such a message
 * (the call got through). */
static const char *connect_error_text(const char *msg) {
  if (!strstr(msg, "failed to connect to all addresses")) return NULL;
  const char *m = msg, *p;
  while ((p = strstr(m, "last error: "))) m = p + strlen("last error: ");
  size_t caps = strspn(m, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
  if (caps && !strncmp(m + caps, ": ", 2)) m += caps + 2;
  return m;
}

/* Why a channel that never became READY failed ("...: Connection
 * refused"): a call on a channel in TRANSIENT_FAILURE fails at once with
 * the transport's last error as its details. Empty when there is none. */
static void connect_failure_reason(tcc_client *c, char *buf, size_t size) {
  tcc_error e = {0};
  uint8_t *resp = NULL;
  size_t len = 0;
  buf[0] = '\0';
  if (unary_once(c, TCC_METHOD_HEALTH_CHECK, (const uint8_t *)"", 0, &resp, &len,
                 deadline_after_ms(REASON_PROBE_MS), &e) == 0) {
    free(resp); /* it answered after all */
    return;
  }
  if (e.code != TCC_E_UNAVAILABLE) return;
  const char *m = connect_error_text(e.msg);
  if (!m) m = e.msg;
  size_t n = strnlen(m, size - 1);
  memcpy(buf, m, n);
  buf[n] = '\0';
}

/* Why a channel that is not READY (wait_ready returned 0 with state last
 * after waiting waited_ms) is not: gRPC's reason for a failed attempt, or
 * "not ready after N ms (channel STATE)" when one was still going. */
static void unreachable_reason(tcc_client *c, grpc_connectivity_state last, int waited_ms, char *buf,
                               size_t size) {
  buf[0] = '\0';
  if (last == GRPC_CHANNEL_TRANSIENT_FAILURE) connect_failure_reason(c, buf, size);
  if (!*buf) snprintf(buf, size, "not ready after %d ms (channel %s)", waited_ms, state_name(last));
}

/* A call failed UNAVAILABLE and the channel is not READY again: says so
 * in terms of the daemon. A call that never reached it (gRPC's "failed to
 * connect to all addresses") becomes "cannot reach tccd at ADDR: WHY"; one
 * that did and lost it ("Socket closed", "Connection reset", tccd's own
 * "tccd is shutting down...") becomes "tccd at ADDR went away during the
 * call: MSG (now: WHY)". Returns TCC_E_UNAVAILABLE. */
static int unavailable_error(tcc_client *c, grpc_connectivity_state last, int waited_ms, tcc_error *err) {
  if (!err) return TCC_E_UNAVAILABLE;
  char why[512];
  unreachable_reason(c, last, waited_ms, why, sizeof why);
  if (connect_error_text(err->msg))
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot reach tccd at %s: %s", c->addr, why);
  char during[TCC_ERROR_MSG_MAX];
  snprintf(during, sizeof during, "%s", err->msg);
  return tcc_error_set(err, TCC_E_UNAVAILABLE, "tccd at %s went away during the call: %s (now: %s)", c->addr,
                       during, why);
}

/* An option, else its environment variable; NULL when both are unset/"". */
static const char *opt_or_env(const char *opt, const char *env) {
  const char *v = opt ? opt : getenv(env);
  return v && *v ? v : NULL;
}

/* Reads a PEM file into a malloc'd string. Returns 0 or
 * TCC_E_INVALID_ARGUMENT / TCC_E_NOT_FOUND naming it. */
static int read_pem(const char *path, const char *what, char **out, tcc_error *err) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return tcc_error_set(err, errno == ENOENT ? TCC_E_NOT_FOUND : TCC_E_PERMISSION_DENIED, "%s %s: %s", what,
                         path, strerror(errno));
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  if (buf) len = fread(buf, 1, cap, f);
  int more = buf && len == cap && fgetc(f) != EOF;
  fclose(f);
  if (!buf) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  buf[len] = '\0';
  if (more || !strstr(buf, "-----BEGIN ")) {
    free(buf);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s %s is not a PEM file", what, path);
  }
  *out = buf;
  return 0;
}

/* Plaintext, or TLS from the options / $TCCD_TLS_*. Returns 0 with
 * *creds set, or a TCC_E_* code naming the unusable file. */
static int channel_credentials(const tcc_client_options *opts, grpc_channel_credentials **creds,
                               tcc_error *err) {
  const char *ca = opt_or_env(opts ? opts->tls_ca : NULL, "TCCD_TLS_CA");
  const char *cert = opt_or_env(opts ? opts->tls_cert : NULL, "TCCD_TLS_CERT");
  const char *key = opt_or_env(opts ? opts->tls_key : NULL, "TCCD_TLS_KEY");
  const char *tls_env = getenv("TCCD_TLS");
  int tls = (opts && opts->tls) || (tls_env && !strcmp(tls_env, "1")) || ca || cert || key;
  *creds = NULL;
  if (!tls) {
    *creds = grpc_insecure_credentials_create();
    return 0;
  }
  if (!cert != !key)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "a TLS client certificate needs its key (tls_cert and tls_key, "
                                                      "TCCD_TLS_CERT and TCCD_TLS_KEY) and the other way round");
  char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
  int rc = 0;
  if (ca) rc = read_pem(ca, "TLS CA", &ca_pem, err);
  if (!rc && cert) rc = read_pem(cert, "TLS certificate", &cert_pem, err);
  if (!rc && key) rc = read_pem(key, "TLS key", &key_pem, err);
  if (!rc) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key_pem, .cert_chain = cert_pem};
    *creds = grpc_ssl_credentials_create(ca_pem, cert ? &pair : NULL, NULL, NULL);
    if (!*creds) rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "gRPC refused the TLS settings");
  }
  if (key_pem) memset(key_pem, 0, strlen(key_pem));
  free(ca_pem);
  free(cert_pem);
  free(key_pem);
  return rc;
}

int tcc_client_connect(const char *addr, const tcc_client_options *opts, tcc_client **out,
                       tcc_error *err) {
  *out = NULL;
  const char *from = NULL; /* where addr came from, when not the caller */
  if (!addr || !*addr) {
    addr = getenv("TCCD_ADDR");
    from = "TCCD_ADDR";
  }
  if (!addr || !*addr) {
    addr = TCC_DEFAULT_ADDR;
    from = NULL;
  }
  int arc = tcc_client_addr_check(addr, err);
  if (arc) {
    if (from) tcc_error_prefix(err, "%s", from);
    return arc;
  }
  tcc_client *c = calloc(1, sizeof *c);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  c->addr = strdup(addr);
  c->deadline_ms = opts && opts->deadline_ms > 0 ? opts->deadline_ms : DEFAULT_DEADLINE_MS;
  c->connect_timeout_ms =
      opts && opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
  if (opts && opts->artifact_dir && *opts->artifact_dir) c->artifact_dir = strdup(opts->artifact_dir);
  if (!c->addr || (opts && opts->artifact_dir && *opts->artifact_dir && !c->artifact_dir)) {
    tcc_client_close(c);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  c->auth_key = grpc_slice_from_static_string("authorization");
  c->auth_value = grpc_empty_slice();
  const char *token = opts && opts->token ? opts->token : getenv("TCCD_TOKEN");
  if (token && *token) {
    for (const char *p = token; *p; p++)
      if (*p < 0x21 || *p > 0x7e) {
        tcc_client_close(c);
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "the bearer token must be visible ASCII without spaces");
      }
    size_t n = strlen(token) + 8;
    char *bearer = malloc(n);
    if (!bearer) {
      tcc_client_close(c);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
    snprintf(bearer, n, "Bearer %s", token);
    c->auth_value = grpc_slice_from_copied_string(bearer);
    memset(bearer, 0, n);
    free(bearer);
  }
  const char *trusted = opts && opts->trusted_keys ? opts->trusted_keys : getenv("TCCD_TRUSTED_KEYS");
  int krc = tcc_trusted_keys_load(trusted, &c->trusted, err);
  if (krc) {
    tcc_error_prefix(err, "%s", opts && opts->trusted_keys ? "trusted_keys" : "TCCD_TRUSTED_KEYS");
    tcc_client_close(c);
    return krc;
  }

  library_init();
  grpc_arg args[4];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = MAX_RECEIVE_BYTES;
  args[1].type = GRPC_ARG_INTEGER; /* tccd is local or in-cluster: never via $http_proxy */
  args[1].key = GRPC_ARG_ENABLE_HTTP_PROXY;
  args[1].value.integer = 0;
  args[2].type = GRPC_ARG_INTEGER; /* re-probe a failed channel soon (see the top of the file) */
  args[2].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
  args[2].value.integer = RECONNECT_BACKOFF_MAX_MS;
  args[3].type = GRPC_ARG_INTEGER;
  args[3].key = GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS;
  args[3].value.integer = RECONNECT_BACKOFF_MAX_MS;
  grpc_channel_args cargs = {4, args};
  grpc_channel_credentials *creds = NULL;
  int crc = channel_credentials(opts, &creds, err);
  if (crc) {
    tcc_client_close(c);
    return crc;
  }
  c->channel = grpc_channel_create(addr, creds, &cargs);
  grpc_channel_credentials_release(creds);
  if (!c->channel) {
    tcc_client_close(c);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "cannot create a channel to %s", addr);
  }

  grpc_connectivity_state last;
  if (!wait_ready(c, c->connect_timeout_ms, &last)) {
    char why[512];
    unreachable_reason(c, last, c->connect_timeout_ms, why, sizeof why);
    int rc = tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot reach tccd at %s: %s", addr, why);
    tcc_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

void tcc_client_close(tcc_client *c) {
  if (!c) return;
  if (c->channel) grpc_channel_destroy(c->channel);
  free(c->addr);
  free(c->artifact_dir);
  tcc_trusted_keys_free(&c->trusted);
  grpc_slice_unref(c->auth_value);
  free(c);
}

const char *tcc_client_addr(const tcc_client *c) { return c->addr; }

size_t tcc_client_trusted_keys(const tcc_client *c) { return c ? c->trusted.n : 0; }

/* ------------------------------------------------------------ unary */

/* Puts the bearer token (if any) on a SEND_INITIAL_METADATA op; md is the
 * caller's storage, alive until the batch is started. */
static void attach_token(const tcc_client *c, grpc_op *op, grpc_metadata *md) {
  if (GRPC_SLICE_LENGTH(c->auth_value) == 0) return;
  memset(md, 0, sizeof *md);
  md->key = c->auth_key;
  md->value = c->auth_value;
  op->data.send_initial_metadata.count = 1;
  op->data.send_initial_metadata.metadata = md;
}

/* One attempt of a unary call; *answered = whether the server sent any
 * message (a retry is only safe when it did not). */
/* Fills ops[0..4) with what every call starts with: initial metadata
 * (the bearer token, in *auth), the one request message, half-close, and
 * the server's initial metadata into *initial_md. */
static void request_ops(tcc_client *c, grpc_op *ops, grpc_metadata *auth, grpc_byte_buffer *send,
                        grpc_metadata_array *initial_md) {
  memset(ops, 0, 4 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  attach_token(c, &ops[0], auth);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = initial_md;
}

static int unary_once(tcc_client *c, const char *method, const uint8_t *req, size_t req_len,
                      uint8_t **resp, size_t *resp_len, gpr_timespec deadline, tcc_error *err) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice mslice = grpc_slice_from_copied_string(method);
  grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mslice,
                                             NULL, deadline, NULL);
  grpc_slice_unref(mslice);
  grpc_slice payload = grpc_slice_from_copied_buffer((const char *)req, req_len);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&payload, 1);
  grpc_slice_unref(payload);

  grpc_metadata_array initial_md, trailing_md;
  grpc_metadata_array_init(&initial_md);
  grpc_metadata_array_init(&trailing_md);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;

  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  grpc_metadata auth;
  request_ops(c, ops, &auth, send, &initial_md);
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  ops[5].data.recv_status_on_client.error_string = &error_string;

  int rc;
  void *tag = &ops;
  grpc_call_error ce = grpc_call_start_batch(call, ops, 6, tag, NULL);
  if (ce != GRPC_CALL_OK) {
    grpc_slice_unref(details);
    rc = tcc_error_set(err, TCC_E_INTERNAL, "%s: grpc_call_start_batch failed (%d)", method, (int)ce);
  } else {
    grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    rc = status_to_error(status, details, error_string, method, &initial_md, &trailing_md, err);
    if (rc == 0) {
      if (!recv)
        rc = tcc_error_set(err, TCC_E_INTERNAL, "%s: the daemon answered OK without a message", method);
      else if (byte_buffer_copy(recv, resp, resp_len) != 0)
        rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
  }
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_byte_buffer_destroy(send);
  grpc_metadata_array_destroy(&initial_md);
  grpc_metadata_array_destroy(&trailing_md);
  grpc_call_unref(call);
  cq_destroy(cq);
  return rc;
}

int tcc_client_call(tcc_client *c, const char *method, const uint8_t *req, size_t req_len,
                    uint8_t **resp, size_t *resp_len, int deadline_ms, tcc_error *err) {
  *resp = NULL;
  *resp_len = 0;
  if (!c) return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "not connected");
  int ms = effective_deadline_ms(c, deadline_ms);
  gpr_timespec deadline = deadline_after_ms(ms);
  int rc = unary_once(c, method, req, req_len, resp, resp_len, deadline, err);
  if (rc == TCC_E_UNAVAILABLE) {
    /* Once: wait for the channel (bounded by the call's own deadline). */
    int wait_ms = c->connect_timeout_ms < ms ? c->connect_timeout_ms : ms;
    grpc_connectivity_state last;
    if (!wait_ready(c, wait_ms, &last)) rc = unavailable_error(c, last, wait_ms, err);
    else if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline) < 0)
      rc = unary_once(c, method, req, req_len, resp, resp_len, deadline, err);
  }
  return rc;
}

/* Packs m into a malloc'd buffer (never NULL on success). */
static int pack_message(const ProtobufCMessage *m, uint8_t **out, size_t *len, tcc_error *err) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n + 1);
  if (!buf) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  protobuf_c_message_pack(m, buf);
  *out = buf;
  *len = n;
  return 0;
}

int tcc_client_call_message(tcc_client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                            int deadline_ms, tcc_error *err) {
  *resp = NULL;
  uint8_t *reqb = NULL, *respb = NULL;
  size_t reqn = 0, respn = 0;
  int rc = pack_message(req, &reqb, &reqn, err);
  if (rc) return rc;
  rc = tcc_client_call(c, method, reqb, reqn, &respb, &respn, deadline_ms, err);
  free(reqb);
  if (rc) return rc;
  *resp = protobuf_c_message_unpack(resp_desc, NULL, respn, respb);
  free(respb);
  if (!*resp)
    return tcc_error_set(err, TCC_E_INTERNAL, "%s: malformed %s from the daemon", method, resp_desc->name);
  return 0;
}

/* ------------------------------------------------------------ compile */

/* Reads a varint at *p (< end). Returns 0 or -1 when malformed. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* Finds the bytes of the single top-level length-delimited field `field`
 * of an encoded message. Returns 0 (found, or absent: *len 0 and *out
 * NULL) or -1 (malformed, or the field occurs more than once). */
static int wire_field_bytes(const uint8_t *msg, size_t len, uint32_t field, const uint8_t **out,
                            size_t *out_len) {
  const uint8_t *p = msg, *end = msg + len;
  *out = NULL;
  *out_len = 0;
  int seen = 0;
  while (p < end) {
    uint64_t tag, n;
    if (wire_varint(&p, end, &tag)) return -1;
    switch (tag & 7) {
    case 0: if (wire_varint(&p, end, &n)) return -1; break;
    case 1: if ((size_t)(end - p) < 8) return -1; p += 8; break;
    case 5: if ((size_t)(end - p) < 4) return -1; p += 4; break;
    case 2:
      if (wire_varint(&p, end, &n) || n > (uint64_t)(end - p)) return -1;
      if (tag >> 3 == field) {
        if (seen++) return -1;
        *out = p;
        *out_len = (size_t)n;
      }
      p += n;
      break;
    default: return -1;
    }
  }
  return 0;
}

/* The signature check every artifact goes through when the client has
 * trusted keys (Compile's answer, and an entry fetched by guard hash):
 * signature and key id over (guard hash, artifact digest, manifest bytes
 * as the daemon sent them). Returns 0 (verified, or no trusted keys) or
 * TCC_E_PERMISSION_DENIED / TCC_E_DATA_LOSS. */
static int verify_artifact(const tcc_client *c, const char *guard_hex, const char *sha_hex, const uint8_t *manifest,
                           size_t manifest_len, const uint8_t *sig, size_t sig_len, const char *key_id,
                           tcc_error *err) {
  if (c->trusted.n == 0) return 0;
  uint8_t guard[TCC_SHA256_BYTES], sha[TCC_SHA256_BYTES];
  if (!guard_hex || !sha_hex || tcc_hex_decode(guard_hex, guard, sizeof guard) ||
      tcc_hex_decode(sha_hex, sha, sizeof sha))
    return tcc_error_set(err, TCC_E_DATA_LOSS,
                         "artifact signature invalid: the response's guard hash or digest is malformed");
  if (sig_len == 0)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "artifact is unsigned and TCCD_TRUSTED_KEYS is set (guard hash %.12s; the daemon "
                         "runs --no-signing?)",
                         guard_hex);
  return tcc_artifact_verify(&c->trusted, key_id, guard, sha, manifest, manifest_len, sig, sig_len, err);
}

/* The signature check of a CompileResponse (its wire bytes and decoded
 * form): verify_artifact with the manifest's bytes exactly as they
 * arrived (field 4). */
static int verify_compile_response(const tcc_client *c, const uint8_t *bytes, size_t len,
                                   const Tcc__V1__CompileResponse *resp, tcc_error *err) {
  if (c->trusted.n == 0) return 0;
  const Tcc__V1__Artifact *a = resp->artifact;
  const uint8_t *manifest;
  size_t manifest_len;
  if (!a || wire_field_bytes(bytes, len, 4, &manifest, &manifest_len))
    return tcc_error_set(err, TCC_E_DATA_LOSS,
                         "artifact signature invalid: the response's artifact or manifest is malformed");
  return verify_artifact(c, resp->guard_hash, a->sha256, manifest, manifest_len, a->signature.data,
                         a->signature.len, a->key_id, err);
}

int client_compile_response_decode(const tcc_client *c, const uint8_t *bytes, size_t len,
                                       Tcc__V1__CompileResponse **resp, tcc_error *err) {
  *resp = tcc__v1__compile_response__unpack(NULL, len, bytes);
  if (!*resp)
    return tcc_error_set(err, TCC_E_INTERNAL, "%s: malformed tcc.v1.CompileResponse from the daemon",
                         TCC_METHOD_COMPILE);
  int rc = verify_compile_response(c, bytes, len, *resp, err);
  if (rc) {
    tcc__v1__compile_response__free_unpacked(*resp, NULL);
    *resp = NULL;
  }
  return rc;
}

int tcc_client_compile(tcc_client *c, const Tcc__V1__CompileRequest *req,
                       Tcc__V1__CompileResponse **resp, tcc_error *err) {
  *resp = NULL;
  uint8_t *reqb = NULL, *respb = NULL;
  size_t reqn = 0, respn = 0;
  int rc = pack_message(&req->base, &reqb, &reqn, err);
  if (rc) return rc;
  rc = tcc_client_call(c, TCC_METHOD_COMPILE, reqb, reqn, &respb, &respn, 0, err);
  free(reqb);
  if (rc) return rc;
  rc = client_compile_response_decode(c, respb, respn, resp, err);
  free(respb);
  return rc;
}

/* ------------------------------------------------------------ local artifact cache */

/* dir/hex into buf; returns 0 or -1 when it does not fit. */
static int artifact_path(const tcc_client *c, const char *hex, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s/%s", c->artifact_dir, hex);
  return n > 0 && (size_t)n < size ? 0 : -1;
}

/* Reads a verified artifact from the local cache. Returns 0 (hit) or -1
 * (absent, unreadable, or corrupt: a corrupt file is deleted). */
static int artifact_dir_read(const tcc_client *c, const char *hex, uint8_t **data, size_t *len) {
  char path[4096];
  if (!c->artifact_dir || artifact_path(c, hex, path, sizeof path)) return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  uint8_t *buf = NULL;
  size_t got = 0;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (buf = malloc((size_t)st.st_size + 1))) {
    while (got < (size_t)st.st_size) {
      ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
  }
  close(fd);
  if (!buf) return -1;
  if (got != (size_t)st.st_size || !tcc_digest_matches_hex(buf, got, hex)) {
    free(buf);
    unlink(path); /* corrupt: refetch */
    return -1;
  }
  *data = buf;
  *len = got;
  return 0;
}

/* Stores an artifact (already verified) in the local cache: tmp + rename.
 * Best effort: failures are ignored. */
static void artifact_dir_write(const tcc_client *c, const char *hex, const uint8_t *data, size_t len) {
  static atomic_uint counter;
  char path[4096], tmp[4096];
  if (!c->artifact_dir || artifact_path(c, hex, path, sizeof path)) return;
  int n = snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld.%u", c->artifact_dir, hex, (long)getpid(),
                   atomic_fetch_add(&counter, 1));
  if (n <= 0 || (size_t)n >= sizeof tmp) return;
  if (mkdir(c->artifact_dir, 0700) != 0 && errno != EEXIST) return;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  if (close(fd) != 0 || off != len || rename(tmp, path) != 0) unlink(tmp);
}

/* ------------------------------------------------------------ fetch */

/* Where a Fetch stream's chunks go. */
typedef struct fetch_sink {
  uint8_t *data;
  size_t size;               /* from the first chunk's Artifact.size */
  size_t received;
  int have_meta;
  char sha256[TCC_SHA256_HEX];
  /* the first chunk's Artifact.signature and key_id (a fetch by guard
   * hash; signature_len 0: none), for verify_artifact */
  uint8_t signature[TCC_SIGNATURE_BYTES];
  size_t signature_len;      /* as received: verify_artifact refuses any but 64 */
  char key_id[48];
} fetch_sink;

/* Takes one ArtifactChunk. Returns 0 or TCC_E_DATA_LOSS. */
static int fetch_take_chunk(fetch_sink *s, const uint8_t *bytes, size_t n, tcc_error *err) {
  Tcc__V1__ArtifactChunk *ch = tcc__v1__artifact_chunk__unpack(NULL, n, bytes);
  if (!ch) return tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: malformed ArtifactChunk");
  int rc = 0;
  if (!s->have_meta) {
    if (!ch->artifact) {
      rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: the first chunk carries no artifact metadata");
      goto out;
    }
    if (ch->artifact->size < 0 || ch->artifact->size > MAX_ARTIFACT_BYTES) {
      rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: implausible artifact size %lld",
                         (long long)ch->artifact->size);
      goto out;
    }
    if (!tcc_hex_is_sha256(ch->artifact->sha256)) {
      rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: bad artifact digest '%.80s'", ch->artifact->sha256);
      goto out;
    }
    tcc_hex_lower_copy(ch->artifact->sha256, s->sha256);
    s->signature_len = ch->artifact->signature.len;
    memcpy(s->signature, ch->artifact->signature.data,
           s->signature_len < sizeof s->signature ? s->signature_len : sizeof s->signature);
    snprintf(s->key_id, sizeof s->key_id, "%s", ch->artifact->key_id ? ch->artifact->key_id : "");
    s->size = (size_t)ch->artifact->size;
    s->data = malloc(s->size + 1);
    if (!s->data) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte artifact", s->size);
      goto out;
    }
    s->have_meta = 1;
  }
  if (ch->offset != (int64_t)s->received || ch->data.len > s->size - s->received) {
    rc = tcc_error_set(err, TCC_E_DATA_LOSS,
                       "Fetch: chunk of %zu bytes at offset %lld does not continue the %zu of %zu received",
                       ch->data.len, (long long)ch->offset, s->received, s->size);
    goto out;
  }
  if (ch->data.len) memcpy(s->data + s->received, ch->data.data, ch->data.len);
  s->received += ch->data.len;
out:
  tcc__v1__artifact_chunk__free_unpacked(ch, NULL);
  return rc;
}

/* Runs one Fetch call into s. */
static int fetch_stream(tcc_client *c, const Tcc__V1__FetchRequest *req, fetch_sink *s, tcc_error *err) {
  uint8_t *reqb = NULL;
  size_t reqn = 0;
  int rc = pack_message(&req->base, &reqb, &reqn, err);
  if (rc) return rc;
  gpr_timespec deadline = deadline_after_ms(c->deadline_ms);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice mslice = grpc_slice_from_static_string(TCC_METHOD_FETCH);
  grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mslice,
                                             NULL, deadline, NULL);
  grpc_slice payload = grpc_slice_from_copied_buffer((const char *)reqb, reqn);
  free(reqb);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&payload, 1);
  grpc_slice_unref(payload);
  grpc_metadata_array initial_md, trailing_md;
  grpc_metadata_array_init(&initial_md);
  grpc_metadata_array_init(&trailing_md);
  grpc_op ops[4];
  void *tag = &ops;
  int stream_rc = 0;

  grpc_metadata auth;
  request_ops(c, ops, &auth, send, &initial_md);
  if (grpc_call_start_batch(call, ops, 4, tag, NULL) != GRPC_CALL_OK) {
    stream_rc = tcc_error_set(err, TCC_E_INTERNAL, "Fetch: grpc_call_start_batch failed");
    grpc_call_cancel(call, NULL);
    goto status;
  }
  grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

  /* Messages until the stream ends (no message) or a chunk is refused. */
  for (;;) {
    grpc_byte_buffer *recv = NULL;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &recv;
    if (grpc_call_start_batch(call, ops, 1, tag, NULL) != GRPC_CALL_OK) break;
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!ev.success || !recv) {
      if (recv) grpc_byte_buffer_destroy(recv);
      break;
    }
    uint8_t *bytes;
    size_t n;
    if (byte_buffer_copy(recv, &bytes, &n) != 0) {
      stream_rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      stream_rc = fetch_take_chunk(s, bytes, n, err);
      free(bytes);
    }
    grpc_byte_buffer_destroy(recv);
    if (stream_rc) {
      grpc_call_cancel(call, NULL);
      break;
    }
  }

status:;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &trailing_md;
  ops[0].data.recv_status_on_client.status = &status;
  ops[0].data.recv_status_on_client.status_details = &details;
  ops[0].data.recv_status_on_client.error_string = &error_string;
  if (grpc_call_start_batch(call, ops, 1, tag, NULL) == GRPC_CALL_OK) {
    grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    tcc_error status_err;
    rc = status_to_error(status, details, error_string, TCC_METHOD_FETCH, &initial_md, &trailing_md, &status_err);
    /* Our own refusal of a chunk wins over the CANCELLED it caused. */
    if (stream_rc) rc = stream_rc;
    else if (rc && err) *err = status_err;
  } else {
    grpc_slice_unref(details);
    rc = stream_rc ? stream_rc : tcc_error_set(err, TCC_E_INTERNAL, "Fetch: cannot receive the status");
  }
  grpc_byte_buffer_destroy(send);
  grpc_metadata_array_destroy(&initial_md);
  grpc_metadata_array_destroy(&trailing_md);
  grpc_call_unref(call);
  cq_destroy(cq);
  if (rc == 0 && !s->have_meta)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: the stream ended without any chunk");
  if (rc == 0 && s->received != s->size)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: artifact truncated: %zu of %zu bytes", s->received,
                       s->size);
  return rc;
}

/* Fetch with one retry when the channel was UNAVAILABLE. */
static int fetch_with_retry(tcc_client *c, const Tcc__V1__FetchRequest *req, fetch_sink *s,
                            tcc_error *err) {
  int rc = fetch_stream(c, req, s, err);
  if (rc == TCC_E_UNAVAILABLE) {
    grpc_connectivity_state last;
    if (!wait_ready(c, c->connect_timeout_ms, &last)) return unavailable_error(c, last, c->connect_timeout_ms, err);
    if (!s->have_meta) { /* nothing was received: safe to ask again */
      free(s->data);
      memset(s, 0, sizeof *s);
      rc = fetch_stream(c, req, s, err);
    }
  }
  return rc;
}

int tcc_client_fetch(tcc_client *c, const char *sha256_hex, uint8_t **data, size_t *len, tcc_error *err) {
  *data = NULL;
  *len = 0;
  if (!c) return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "not connected");
  if (!tcc_hex_is_sha256(sha256_hex))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "artifact digest must be 64 hex digits, got '%.80s'",
                         sha256_hex ? sha256_hex : "");
  char hex[TCC_SHA256_HEX];
  tcc_hex_lower_copy(sha256_hex, hex);
  if (artifact_dir_read(c, hex, data, len) == 0) return 0;

  Tcc__V1__FetchRequest req = TCC__V1__FETCH_REQUEST__INIT;
  req.sha256 = hex;
  fetch_sink s;
  memset(&s, 0, sizeof s);
  int rc = fetch_with_retry(c, &req, &s, err);
  if (rc == 0 && strcmp(s.sha256, hex) != 0)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "Fetch: asked for artifact %s, the daemon sent %s", hex, s.sha256);
  if (rc == 0) rc = tcc_digest_check(s.data, s.size, hex, err);
  if (rc) {
    free(s.data);
    return rc;
  }
  artifact_dir_write(c, hex, s.data, s.size);
  *data = s.data;
  *len = s.size;
  return 0;
}

/* With trusted keys, the signature check of an entry fetched by guard
 * hash: verify_artifact, as for Compile, with the signature and key id of
 * the Fetch's first chunk and the entry's manifest from a Show call (field
 * 2's bytes as they arrived: the manifest the daemon stored, which it
 * re-encodes byte for byte). Returns 0 or a TCC_E_* code. */
static int verify_fetched_entry(tcc_client *c, const char *hash, const fetch_sink *s, tcc_error *err) {
  if (c->trusted.n == 0) return 0;
  Tcc__V1__ShowRequest req = TCC__V1__SHOW_REQUEST__INIT;
  req.guard_hash = (char *)hash;
  uint8_t *reqb = NULL, *respb = NULL;
  size_t reqn = 0, respn = 0;
  int rc = pack_message(&req.base, &reqb, &reqn, err);
  if (rc) return rc;
  rc = tcc_client_call(c, TCC_METHOD_SHOW, reqb, reqn, &respb, &respn, 0, err);
  free(reqb);
  if (rc) {
    tcc_error_prefix(err, "verifying the signature of entry %.12s", hash);
    return rc;
  }
  const uint8_t *manifest = NULL;
  size_t manifest_len = 0;
  Tcc__V1__ShowResponse *show = tcc__v1__show_response__unpack(NULL, respn, respb);
  const char *signer = show && show->entry && show->entry->key_id ? show->entry->key_id : "";
  if (!show || wire_field_bytes(respb, respn, 2, &manifest, &manifest_len))
    rc = tcc_error_set(err, TCC_E_DATA_LOSS,
                       "artifact signature invalid: malformed tcc.v1.ShowResponse for entry %.12s", hash);
  else if (s->signature_len == 0 && *signer)
    rc = tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                       "cannot verify the artifact of entry %.12s (signed by key %.40s) against the trusted keys: "
                       "tccd's Fetch sent no signature with it",
                       hash, signer);
  else
    rc = verify_artifact(c, hash, s->sha256, manifest, manifest_len, s->signature, s->signature_len, s->key_id,
                         err);
  if (show) tcc__v1__show_response__free_unpacked(show, NULL);
  free(respb);
  return rc;
}

int tcc_client_fetch_entry(tcc_client *c, const char *guard_hash_hex, uint8_t **data, size_t *len,
                           char sha256_hex[TCC_SHA256_HEX], tcc_error *err) {
  *data = NULL;
  *len = 0;
  if (!c) return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "not connected");
  if (!tcc_hex_is_sha256(guard_hash_hex))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "guard hash must be 64 hex digits, got '%.80s'",
                         guard_hash_hex ? guard_hash_hex : "");
  char hash[TCC_SHA256_HEX];
  tcc_hex_lower_copy(guard_hash_hex, hash);
  Tcc__V1__FetchRequest req = TCC__V1__FETCH_REQUEST__INIT;
  req.guard_hash = hash;
  fetch_sink s;
  memset(&s, 0, sizeof s);
  int rc = fetch_with_retry(c, &req, &s, err);
  if (rc == 0) rc = tcc_digest_check(s.data, s.size, s.sha256, err);
  if (rc == 0) rc = verify_fetched_entry(c, hash, &s, err);
  if (rc) {
    free(s.data);
    return rc;
  }
  artifact_dir_write(c, s.sha256, s.data, s.size);
  if (sha256_hex) memcpy(sha256_hex, s.sha256, TCC_SHA256_HEX);
  *data = s.data;
  *len = s.size;
  return 0;
}

/* ------------------------------------------------------------ get_kernel */

int tcc_client_get_module(tcc_client *c, const Tcc__V1__CompileRequest *req, tcc_module **out,
                          Tcc__V1__CompileResponse **resp_out, tcc_error *err) {
  *out = NULL;
  if (resp_out) *resp_out = NULL;
  Tcc__V1__CompileResponse *resp = NULL;
  int rc = tcc_client_compile(c, req, &resp, err);
  if (rc) return rc;
  if (!resp->artifact || !resp->manifest) {
    rc = tcc_error_set(err, TCC_E_INTERNAL, "Compile: the response has no %s",
                       resp->artifact ? "manifest" : "artifact");
  } else {
    uint8_t *data;
    size_t len;
    rc = tcc_client_fetch(c, resp->artifact->sha256, &data, &len, err);
    if (rc == 0) {
      rc = tcc_module_load(data, len, resp->artifact->sha256, resp->manifest, out, err);
      free(data);
    }
  }
  if (rc == 0 && resp_out) *resp_out = resp;
  else tcc__v1__compile_response__free_unpacked(resp, NULL);
  return rc;
}

/* ------------------------------------------------------------ admin */

int tcc_client_health(tcc_client *c, const char *service, int *serving_status, tcc_error *err) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)(service ? service : "");
  ProtobufCMessage *resp;
  int rc = tcc_client_call_message(c, TCC_METHOD_HEALTH_CHECK, &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, &resp, 0, err);
  if (rc) return rc;
  if (serving_status) *serving_status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

int tcc_client_stats(tcc_client *c, Tcc__V1__StatsResponse **out, tcc_error *err) {
  Tcc__V1__StatsRequest req = TCC__V1__STATS_REQUEST__INIT;
  return tcc_client_call_message(c, TCC_METHOD_STATS, &req.base, &tcc__v1__stats_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_jobs(tcc_client *c, Tcc__V1__JobsResponse **out, tcc_error *err) {
  Tcc__V1__JobsRequest req = TCC__V1__JOBS_REQUEST__INIT;
  return tcc_client_call_message(c, TCC_METHOD_JOBS, &req.base, &tcc__v1__jobs_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_list(tcc_client *c, int limit, const char *order_by, Tcc__V1__ListResponse **out,
                    tcc_error *err) {
  Tcc__V1__ListRequest req = TCC__V1__LIST_REQUEST__INIT;
  req.limit = limit;
  req.order_by = (char *)(order_by ? order_by : "");
  return tcc_client_call_message(c, TCC_METHOD_LIST, &req.base, &tcc__v1__list_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_show(tcc_client *c, const char *guard_hash_hex, Tcc__V1__ShowResponse **out, tcc_error *err) {
  Tcc__V1__ShowRequest req = TCC__V1__SHOW_REQUEST__INIT;
  req.guard_hash = (char *)(guard_hash_hex ? guard_hash_hex : "");
  return tcc_client_call_message(c, TCC_METHOD_SHOW, &req.base, &tcc__v1__show_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_explain(tcc_client *c, const char *guard_hash_hex, const Tcc__V1__CompileRequest *request,
                       int max_nearest, Tcc__V1__ExplainResponse **out, tcc_error *err) {
  Tcc__V1__ExplainRequest req = TCC__V1__EXPLAIN_REQUEST__INIT;
  req.guard_hash = (char *)(guard_hash_hex ? guard_hash_hex : "");
  req.request = (Tcc__V1__CompileRequest *)request;
  req.max_nearest = max_nearest;
  return tcc_client_call_message(c, TCC_METHOD_EXPLAIN, &req.base, &tcc__v1__explain_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_evict(tcc_client *c, const char *guard_hash_hex, int *evicted, tcc_error *err) {
  Tcc__V1__EvictRequest req = TCC__V1__EVICT_REQUEST__INIT;
  req.guard_hash = (char *)(guard_hash_hex ? guard_hash_hex : "");
  ProtobufCMessage *resp;
  int rc = tcc_client_call_message(c, TCC_METHOD_EVICT, &req.base, &tcc__v1__evict_response__descriptor,
                                   &resp, 0, err);
  if (rc) return rc;
  if (evicted) *evicted = ((Tcc__V1__EvictResponse *)resp)->evicted ? 1 : 0;
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

int tcc_client_list_failures(tcc_client *c, int limit, Tcc__V1__ListResponse **out, tcc_error *err) {
  Tcc__V1__ListRequest req = TCC__V1__LIST_REQUEST__INIT;
  req.limit = limit;
  req.failures = 1;
  return tcc_client_call_message(c, TCC_METHOD_LIST, &req.base, &tcc__v1__list_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_zero_stats(tcc_client *c, Tcc__V1__StatsResponse **out, tcc_error *err) {
  Tcc__V1__ZeroStatsRequest req = TCC__V1__ZERO_STATS_REQUEST__INIT;
  return tcc_client_call_message(c, TCC_METHOD_ZERO_STATS, &req.base, &tcc__v1__stats_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_clear(tcc_client *c, int tuning, Tcc__V1__ClearResponse **out, tcc_error *err) {
  Tcc__V1__ClearRequest req = TCC__V1__CLEAR_REQUEST__INIT;
  req.tuning = tuning != 0;
  return tcc_client_call_message(c, TCC_METHOD_CLEAR, &req.base, &tcc__v1__clear_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_warm(tcc_client *c, const Tcc__V1__WarmRequest *req, Tcc__V1__WarmResponse **out, tcc_error *err) {
  return tcc_client_call_message(c, TCC_METHOD_WARM, &req->base, &tcc__v1__warm_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_ops(tcc_client *c, int device, Tcc__V1__OpsResponse **out, tcc_error *err) {
  Tcc__V1__OpsRequest req = TCC__V1__OPS_REQUEST__INIT;
  req.device = (Tcc__V1__DeviceType)device;
  return tcc_client_call_message(c, TCC_METHOD_OPS, &req.base, &tcc__v1__ops_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}

int tcc_client_get_plan_bytes(tcc_client *c, const char *key, uint8_t **plan, size_t *plan_len, int *cache_status,
                              tcc_error *err) {
  *plan = NULL;
  *plan_len = 0;
  if (cache_status) *cache_status = 0;
  Tcc__V1__GetPlanRequest req = TCC__V1__GET_PLAN_REQUEST__INIT;
  req.key = (char *)(key ? key : "");
  ProtobufCMessage *m;
  int rc = tcc_client_call_message(c, TCC_METHOD_GET_PLAN, &req.base, &tcc__v1__get_plan_response__descriptor, &m,
                                   0, err);
  if (rc) return rc;
  Tcc__V1__GetPlanResponse *r = (Tcc__V1__GetPlanResponse *)m;
  if (c->trusted.n > 0 && r->signature.len == 0)
    rc = tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                       "plan for key '%.200s' is unsigned and TCCD_TRUSTED_KEYS is set (the daemon runs "
                       "--no-signing?)",
                       req.key);
  else if (c->trusted.n > 0)
    rc = tcc_plan_verify(&c->trusted, r->key_id, req.key, r->plan.data, r->plan.len, r->signature.data,
                         r->signature.len, err);
  if (rc == 0) {
    *plan = r->plan.data; /* taken: the message frees what is left */
    *plan_len = r->plan.len;
    r->plan.data = NULL;
    r->plan.len = 0;
    if (cache_status) *cache_status = (int)r->cache;
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}

int tcc_client_gc(tcc_client *c, int64_t max_bytes, Tcc__V1__GcResponse **out, tcc_error *err) {
  Tcc__V1__GcRequest req = TCC__V1__GC_REQUEST__INIT;
  req.max_bytes = max_bytes;
  return tcc_client_call_message(c, TCC_METHOD_GC, &req.base, &tcc__v1__gc_response__descriptor,
                                 (ProtobufCMessage **)out, 0, err);
}
