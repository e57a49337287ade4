/*
 * server.c — gRPC C core driven from a libuv loop.
 *
 * DESIGN
 *
 * gRPC's completion queue is a blocking API; libuv's loop wants file
 * descriptors. One dedicated thread bridges them and does nothing else:
 *
 *   gRPC thread                               loop thread
 *   -----------                               -----------
 *   ev = grpc_completion_queue_next()
 *   lock; events[] += (ev.tag, ev.ok); unlock
 *   uv_async_send(&wake)  ───────────────►  on_wake(): swap events[] out,
 *                                              tag->fn(tag->obj, ok) each
 *   GRPC_QUEUE_SHUTDOWN: push (NULL, 0),
 *   exit                  ───────────────►  join the thread, finish shutdown
 *
 * uv_async_send coalesces wake-ups, hence the vector. Every tag is a
 * tccd_tag {fn, obj}: completions are plain callbacks on the loop thread,
 * which owns all state, so nothing below takes a lock except the vector's.
 *
 * Before a registered call reaches its handler, tccd_auth_check
 * (security.c) holds its bearer token against the method's role in
 * TCCD_METHODS (only with --auth-tokens): UNAUTHENTICATED or
 * PERMISSION_DENIED ends it there.
 *
 * Each call is a tccd_call (call.c: its state machine, its references,
 * the replies). This file requests calls from gRPC (call.c's REQUESTED),
 * activates the ones that arrive (ACTIVE) and hands them to their
 * handler; call.c tells it when a call is freed (call_released), so it
 * knows when the last one is gone at shutdown. Nothing in call.c,
 * compile.c or rpc.c calls into this file.
 *
 * For every registered method a few requests are kept pending (the payload
 * arrives with the call: GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER), and
 * one generic request is kept pending so unknown methods get UNIMPLEMENTED
 * instead of hanging.
 *
 * Shutdown (tccd_server_shutdown):
 *   grpc_server_shutdown_and_notify ─► pending requests fail (freed),
 *   in-flight calls finish; after grace_ms grpc_server_cancel_all_calls;
 *   shutdown tag + no live calls ─► grpc_server_destroy,
 *   completion-queue shutdown ─► gRPC thread exits ─► done(st).
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"

/* How many requests to keep pending per method (hot methods get more;
 * one for a method not listed). */
static const int pending_per_method[TCCD_METHOD__COUNT] = {
    [TCCD_METHOD_COMPILE] = 16, [TCCD_METHOD_FETCH] = 4, [TCCD_METHOD_OPS] = 1,
    [TCCD_METHOD_STATS] = 2,    [TCCD_METHOD_LIST] = 1,
    [TCCD_METHOD_SHOW] = 1,     [TCCD_METHOD_EVICT] = 1,
    [TCCD_METHOD_GC] = 1,       [TCCD_METHOD_HEALTH_CHECK] = 2,
    [TCCD_METHOD_JOBS] = 1,     [TCCD_METHOD_EXPLAIN] = 1,
};

static const char *const method_names[TCCD_METHOD__COUNT] = {
#define TCCD_METHOD_NAME(id, name, fn, role) [TCCD_METHOD_##id] = name,
    TCCD_METHODS(TCCD_METHOD_NAME)
#undef TCCD_METHOD_NAME
};

typedef void (*tccd_handler)(tccd_state *, tccd_call *);
static const tccd_handler handlers[TCCD_METHOD__COUNT] = {
#define TCCD_METHOD_HANDLER(id, name, fn, role) [TCCD_METHOD_##id] = fn,
    TCCD_METHODS(TCCD_METHOD_HANDLER)
#undef TCCD_METHOD_HANDLER
};

static const tccd_role method_roles[TCCD_METHOD__COUNT] = {
#define TCCD_METHOD_ROLE(id, name, fn, role) [TCCD_METHOD_##id] = role,
    TCCD_METHODS(TCCD_METHOD_ROLE)
#undef TCCD_METHOD_ROLE
};

typedef struct cq_event {
  tccd_tag *tag;
  int ok;
} cq_event;

struct tccd_server {
  tccd_state *st;
  grpc_server *grpc;
  grpc_completion_queue *cq;
  void *registered[TCCD_METHOD__COUNT];
  int port;

  pthread_t cq_thread;
  uv_async_t wake;
  pthread_mutex_t lock;            /* guards events / nevents / cap */
  cq_event *events;
  size_t nevents, cap;
  int cq_thread_exited;            /* set on the loop when the sentinel arrives */

  int64_t live_calls;              /* tccd_call objects, pending ones included */
  int shutting_down;
  int shutdown_tag_done;
  int destroyed;
  tccd_tag shutdown_tag;
  uv_timer_t grace_timer;
  void (*done)(tccd_state *);
};

/* ------------------------------------------------------------ the bridge */

static void *cq_thread_main(void *arg) {
  tccd_server *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
    int last = ev.type == GRPC_QUEUE_SHUTDOWN;
    pthread_mutex_lock(&srv->lock);
    if (srv->nevents == srv->cap) {
      size_t cap = srv->cap ? srv->cap * 2 : 256;
      cq_event *grown = realloc(srv->events, cap * sizeof *grown);
      if (!grown) abort(); /* cannot hand the event over: nothing sane to do */
      srv->events = grown;
      srv->cap = cap;
    }
    srv->events[srv->nevents++] = (cq_event){last ? NULL : ev.tag, last ? 0 : ev.success};
    pthread_mutex_unlock(&srv->lock);
    uv_async_send(&srv->wake);
    if (last) return NULL;
  }
}

static void server_finish_shutdown(tccd_server *srv);

static void on_wake(uv_async_t *h) {
  tccd_server *srv = h->data;
  cq_event stack_buf[64], *batch = stack_buf;
  size_t n;
  pthread_mutex_lock(&srv->lock);
  n = srv->nevents;
  if (n > 64) {
    batch = srv->events; /* take the whole vector; the thread allocates anew */
    srv->events = NULL;
    srv->cap = 0;
  } else {
    memcpy(stack_buf, srv->events, n * sizeof *batch);
  }
  srv->nevents = 0;
  pthread_mutex_unlock(&srv->lock);

  for (size_t i = 0; i < n; i++) {
    if (batch[i].tag == NULL) {
      srv->cq_thread_exited = 1;
      continue;
    }
    batch[i].tag->fn(batch[i].tag->obj, batch[i].ok);
  }
  if (batch != stack_buf) free(batch);
  if (srv->cq_thread_exited) server_finish_shutdown(srv);
}

/* ------------------------------------------------------------ calls */

static void request_registered(tccd_server *srv, tccd_method_id m);
static void request_generic(tccd_server *srv);

/* A call of ours was freed (call.c tells us): one live call fewer. */
static void call_released(tccd_server *srv) {
  srv->live_calls--;
  if (srv->shutting_down) server_finish_shutdown(srv);
}

/* A call of ours finished with a status: the metrics count it. */
static void call_finished(tccd_server *srv, tccd_method_id m, int code) {
  tccd_metrics_call_finished(srv->st->metrics, m, code);
}

/* A call in REQUESTED for method m (TCCD_METHOD__COUNT: the generic
 * request), counted live. NULL when out of memory. */
static tccd_call *call_new(tccd_server *srv, tccd_method_id m) {
  tccd_call *c = tccd_call_new(srv, m, m < TCCD_METHOD__COUNT ? method_names[m] : "unknown method",
                               call_finished, call_released);
  if (c) srv->live_calls++;
  return c;
}

/* ------------------------------------------------------------ requests */

tccd_role tccd_method_role_needed(const tccd_state *st, int method) {
  assert(method >= 0 && method < TCCD_METHOD__COUNT);
  if (method == TCCD_METHOD_PUT_PLAN && strcmp(st->cfg->plan_writers, "admin") == 0) return TCCD_ROLE_ADMIN;
  return method_roles[method];
}

static void on_registered_request(void *obj, int ok) {
  tccd_call *c = obj;
  tccd_server *srv = c->server;
  if (!ok) { /* the server is shutting down */
    tccd_call_unref(c);
    return;
  }
  if (!srv->shutting_down) request_registered(srv, c->method);
  tccd_call_activate(c);
  tcc_error err;
  if (tccd_auth_check(srv->st, &c->request_md, tccd_method_role_needed(srv->st, c->method), &err) != 0) {
    tcc_cache_count(srv->st->cache, TCC_COUNTER_auth_failures, 1);
    tccd_call_log(TCCD_LOG_INFO, c, "%s refused: %s: %s", method_names[c->method], tcc_status_name(err.code),
                  err.msg);
    c->failure_logged = 1;
    tccd_call_fail_error(c, &err);
    return;
  }
  handlers[c->method](srv->st, c);
}

static void on_generic_request(void *obj, int ok) {
  tccd_call *c = obj;
  tccd_server *srv = c->server;
  if (!ok) {
    tccd_call_unref(c);
    return;
  }
  if (!srv->shutting_down) request_generic(srv);
  tccd_call_activate(c);
  char method[256];
  size_t mlen = GRPC_SLICE_LENGTH(c->details.method);
  if (mlen >= sizeof method) mlen = sizeof method - 1;
  memcpy(method, GRPC_SLICE_START_PTR(c->details.method), mlen);
  method[mlen] = '\0';
  tccd_call_log(TCCD_LOG_DEBUG, c, "unknown method %s", method);
  tccd_call_fail(c, TCC_E_UNIMPLEMENTED, "unknown method %s", method);
}

static void request_registered(tccd_server *srv, tccd_method_id m) {
  tccd_call *c = call_new(srv, m);
  if (!c) {
    log_error("out of memory: cannot accept more %s calls", method_names[m]);
    return;
  }
  c->request_tag = (tccd_tag){on_registered_request, c};
  grpc_call_error e = grpc_server_request_registered_call(
      srv->grpc, srv->registered[m], &c->call, &c->deadline, &c->request_md,
      &c->payload, srv->cq, srv->cq, &c->request_tag);
  if (e != GRPC_CALL_OK) {
    log_error("grpc_server_request_registered_call(%s) failed: %d", method_names[m], (int)e);
    tccd_call_unref(c);
  }
}

static void request_generic(tccd_server *srv) {
  tccd_call *c = call_new(srv, TCCD_METHOD__COUNT);
  if (!c) return;
  c->request_tag = (tccd_tag){on_generic_request, c};
  grpc_call_error e = grpc_server_request_call(srv->grpc, &c->call, &c->details, &c->request_md,
                                               srv->cq, srv->cq, &c->request_tag);
  if (e != GRPC_CALL_OK) {
    log_error("grpc_server_request_call failed: %d", (int)e);
    tccd_call_unref(c);
  }
}

/* ------------------------------------------------------------ start */

/* Reads a whole PEM file (NUL-terminated, malloc'd) for --flag. Returns
 * NULL with a message in err when unreadable or not PEM. */
static char *read_pem(const char *path, const char *flag, tcc_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s: %s", flag, path, strerror(errno));
    return NULL;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *grown = cap <= (1 << 20) ? realloc(buf, cap) : NULL;
      if (!grown) {
        free(buf);
        fclose(f);
        tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s: too large for a PEM file", flag, path);
        return NULL;
      }
      buf = grown;
    }
    size_t n = fread(buf + len, 1, 4096, f);
    len += n;
    if (n < 4096) break;
  }
  fclose(f);
  buf[len] = '\0';
  if (!strstr(buf, "-----BEGIN ")) {
    free(buf);
    tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s is not a PEM file", flag, path);
    return NULL;
  }
  return buf;
}

/* Insecure credentials, or TLS from --tls-cert/--tls-key (and mTLS with
 * --tls-client-ca: clients must present a certificate that CA signed).
 * Returns NULL with err set when a file is unusable. */
static grpc_server_credentials *server_credentials(const tccd_config *cfg, tcc_error *err) {
  if (!cfg->tls_cert[0]) return grpc_insecure_server_credentials_create();
  char *cert = read_pem(cfg->tls_cert, "--tls-cert", err);
  char *key = cert ? read_pem(cfg->tls_key, "--tls-key", err) : NULL;
  char *ca = key && cfg->tls_client_ca[0] ? read_pem(cfg->tls_client_ca, "--tls-client-ca", err) : NULL;
  grpc_server_credentials *creds = NULL;
  if (cert && key && (ca || !cfg->tls_client_ca[0])) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!creds) tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "--tls-cert/--tls-key: gRPC refused them");
  }
  if (key) {
    memset(key, 0, strlen(key));
    free(key);
  }
  free(cert);
  free(ca);
  return creds;
}

/* gRPC reports a failed bind only as port 0; bind once ourselves to say why. */
static void explain_bind_failure(const char *listen, char *why, size_t cap) {
  struct addrinfo *res;
  if (tccd_listen_resolve(listen, &res, why, cap) != 0) return;
  snprintf(why, cap, "the address cannot be bound");
  int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0) {
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0)
      snprintf(why, cap, "%s%s", strerror(errno),
               errno == EADDRINUSE ? " (is another tccd running? choose another --listen port)" : "");
    close(fd);
  }
  freeaddrinfo(res);
}

int tccd_server_start(tccd_state *st, tcc_error *err) {
  tccd_server *srv = calloc(1, sizeof *srv);
  if (!srv) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  srv->st = st;
  st->server = srv;
  pthread_mutex_init(&srv->lock, NULL);

  grpc_arg args[3];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[0].value.integer = 0; /* a second daemon on our port must fail */
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[1].value.integer = (int)TCC_MAX_REQUEST_BYTES;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[2].value.integer = -1;
  grpc_channel_args chargs = {3, args};
  srv->grpc = grpc_server_create(&chargs, NULL);
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(srv->grpc, srv->cq, NULL);
  for (int m = 0; m < TCCD_METHOD__COUNT; m++) {
    srv->registered[m] = grpc_server_register_method(
        srv->grpc, method_names[m], NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  }

  grpc_server_credentials *creds = server_credentials(st->cfg, err);
  srv->port = creds ? grpc_server_add_http2_port(srv->grpc, st->cfg->listen, creds) : 0;
  if (creds) grpc_server_credentials_release(creds);
  if (srv->port == 0) {
    char why[512];
    explain_bind_failure(st->cfg->listen, why, sizeof why);
    if (creds) tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot listen on %s: %s", st->cfg->listen, why);
    grpc_server_destroy(srv->grpc);
    grpc_completion_queue_shutdown(srv->cq);
    while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(srv->cq);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
    st->server = NULL;
    return err->code;
  }
  grpc_server_start(srv->grpc);

  uv_async_init(st->loop, &srv->wake, on_wake);
  srv->wake.data = srv;
  uv_timer_init(st->loop, &srv->grace_timer);
  srv->grace_timer.data = srv;
  for (int m = 0; m < TCCD_METHOD__COUNT; m++)
    for (int i = 0; i < (pending_per_method[m] > 0 ? pending_per_method[m] : 1); i++) /* a method left out: 1 */
      request_registered(srv, (tccd_method_id)m);
  request_generic(srv);

  if (pthread_create(&srv->cq_thread, NULL, cq_thread_main, srv) != 0)
    return tcc_error_set(err, TCC_E_INTERNAL, "cannot start the gRPC thread");
  return 0;
}

int tccd_server_port(const tccd_server *srv) { return srv->port; }

/* ------------------------------------------------------------ shutdown */

static void on_shutdown_tag(void *obj, int ok) {
  tccd_server *srv = obj;
  (void)ok;
  srv->shutdown_tag_done = 1;
  server_finish_shutdown(srv);
}

static void on_grace_expired(uv_timer_t *t) {
  tccd_server *srv = t->data;
  if (srv->live_calls > 0) {
    log_warn("shutdown: cancelling %lld call(s) still in flight after the grace period",
             (long long)srv->live_calls);
    tccd_jobs_abandon_waiters(srv->st);
    grpc_server_cancel_all_calls(srv->grpc);
  }
}

/* The wake handle is closed last; its close callback ends the shutdown. */
static void on_wake_closed(uv_handle_t *h) {
  tccd_server *srv = h->data;
  void (*done)(tccd_state *) = srv->done;
  srv->done = NULL;
  if (done) done(srv->st);
}

/* Advances shutdown as far as it can go; safe to call repeatedly. */
static void server_finish_shutdown(tccd_server *srv) {
  if (!srv->shutting_down) return;
  if (!srv->destroyed && srv->shutdown_tag_done && srv->live_calls == 0) {
    srv->destroyed = 1;
    uv_timer_stop(&srv->grace_timer);
    grpc_server_destroy(srv->grpc);
    srv->grpc = NULL;
    grpc_completion_queue_shutdown(srv->cq); /* the thread sees SHUTDOWN and exits */
  }
  if (srv->destroyed && srv->cq_thread_exited && !uv_is_closing((uv_handle_t *)&srv->wake)) {
    pthread_join(srv->cq_thread, NULL);
    grpc_completion_queue_destroy(srv->cq);
    srv->cq = NULL;
    uv_close((uv_handle_t *)&srv->grace_timer, NULL);
    uv_close((uv_handle_t *)&srv->wake, on_wake_closed);
  }
}

void tccd_server_shutdown(tccd_server *srv, int grace_ms, void (*done)(tccd_state *)) {
  if (srv->shutting_down) return;
  srv->shutting_down = 1;
  srv->done = done;
  srv->shutdown_tag = (tccd_tag){on_shutdown_tag, srv};
  grpc_server_shutdown_and_notify(srv->grpc, srv->cq, &srv->shutdown_tag);
  uv_timer_start(&srv->grace_timer, on_grace_expired, (uint64_t)(grace_ms > 0 ? grace_ms : 0), 0);
}

void tccd_server_free(tccd_server *srv) {
  if (!srv) return;
  free(srv->events);
  pthread_mutex_destroy(&srv->lock);
  free(srv);
}
