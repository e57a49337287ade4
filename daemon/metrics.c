/*
 * metrics.c — the Prometheus page: GET /metrics on --metrics-listen.
 *
 * DESIGN
 *
 * Everything here runs on the loop thread, which owns what is measured:
 *   - the histograms (TCCD_HISTOGRAMS in daemon.h) and the per-method,
 *     per-status call counts are plain structs the loop updates
 *     (compile.c observes, call.c counts every finished call once);
 *   - the counters and gauges are what Stats answers (tccd_stats_fill),
 *     read at scrape time, so the page and `tcctl stats` never disagree;
 *   - the HTTP port is a libuv TCP listener on the same loop. A scrape
 *     is rendered in one go on the loop (a few KiB of text, one cache
 *     stats query: what a Stats call costs).
 *
 * The loop must never stall for a client, so the server is small and
 * bounded: one request per connection (Connection: close), request
 * headers up to METRICS_MAX_REQUEST bytes (else 431), METRICS_TIMEOUT_MS
 * from accept to the request and again to write the answer (a client that
 * sends nothing, or reads nothing, is cut off), at most METRICS_MAX_CONNS
 * connections (more are closed at once). Nothing blocks: reads, writes
 * and the TLS layer (OpenSSL over memory BIOs, fed from the socket's
 * reads, drained into uv_write) all go through the loop.
 *
 * Same rules as the gRPC port: with --auth-tokens a scrape needs
 * `Authorization: Bearer TOKEN` of either role (else 401, counted in
 * tccd_auth_failures_total); with --tls-cert/--tls-key it is HTTPS with
 * that certificate (and --tls-client-ca requires client certificates).
 *
 * A scrape connection's life (conn_set_state asserts every move):
 *
 *   accept ─► READING ──request complete, malformed or too large──► WRITING
 *               │                 (conn_respond)                     │
 *               │ EOF, read/TLS error, timeout,                      │ written, write error,
 *               │ too many connections, shutdown                     │ timeout, shutdown
 *               ▼ (conn_close)                                       ▼ (conn_close)
 *             CLOSING ◄──────────────────────────────────────────────┘
 *               │ tcp and timer handles closed (on_handle_closed)
 *               ▼ freed
 */
#include <arpa/inet.h>
#include <assert.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/ssl.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"
#include "tcc_config.h"

#define METRICS_MAX_CONNS 16
#define METRICS_MAX_REQUEST 8192
#define METRICS_TIMEOUT_MS 10000
#define HIST_MAX_BOUNDS 15
#define GRPC_CODES 17 /* OK .. UNAUTHENTICATED */

/* ------------------------------------------------------------ what is measured */

#define HIST_BOUNDS(id, name, help, ...) static const double bounds_##id[] = {__VA_ARGS__};
TCCD_HISTOGRAMS(HIST_BOUNDS)
#undef HIST_BOUNDS

static const struct hist_def {
  const char *name, *help;
  const double *bounds;
  int nbounds;
} hist_defs[TCCD_HIST__COUNT] = {
#define HIST_DEF(id, name, help, ...) \
  [TCCD_HIST_##id] = {name, help, bounds_##id, (int)(sizeof bounds_##id / sizeof(double))},
    TCCD_HISTOGRAMS(HIST_DEF)
#undef HIST_DEF
};

typedef struct histogram {
  uint64_t counts[HIST_MAX_BOUNDS + 1]; /* per bucket (not cumulative); the last: above every bound */
  uint64_t count;
  double sum;
} histogram;

/* The counters and gauges: StatsResponse fields, X(field, TYPE, name, help). */
#define STATS_METRICS(X)                                                                                   \
  X(entries, gauge, "tccd_cache_entries", "Entries in the local cache.")                                  \
  X(bytes, gauge, "tccd_cache_bytes", "Artifact bytes in the local cache.")                               \
  X(max_bytes, gauge, "tccd_cache_max_bytes", "The cache's byte budget (--cache-max-bytes; 0: unlimited).") \
  X(hits, counter, "tccd_cache_hits_total", "Compile calls answered from the local cache.")                \
  X(misses, counter, "tccd_cache_misses_total", "Compile calls that started a compile here.")              \
  X(coalesced, counter, "tccd_cache_coalesced_total", "Compile calls that waited on a compile in flight.")  \
  X(compiles, counter, "tccd_compiles_total", "Successful compiles.")                                      \
  X(compile_failures, counter, "tccd_compile_failures_total", "Compile jobs that failed.")                 \
  X(compile_seconds, counter, "tccd_compile_seconds_total", "Time spent compiling, every stored entry counted.") \
  X(compile_seconds_saved, counter, "tccd_compile_seconds_saved_total",                                    \
    "Compile time saved: the sum over hits of the entry's compile time.")                                  \
  X(evictions, counter, "tccd_cache_evictions_total", "Entries evicted.")                                  \
  X(corrupt_blobs, counter, "tccd_cache_corrupt_blobs_total", "Artifact blobs found corrupt.")              \
  X(corrupt_entries, counter, "tccd_cache_corrupt_entries_total",                                         \
    "Entries that failed verification before a hit and were compiled again.")                              \
  X(requests, counter, "tccd_compile_requests_total", "Compile calls received.")                           \
  X(invalid_requests, counter, "tccd_compile_invalid_requests_total", "Compile calls refused as invalid.")  \
  X(rejected_memory, counter, "tccd_rejected_memory_total", "Calls refused by --request-memory-max.")       \
  X(negative_hits, counter, "tccd_negative_hits_total", "Compile calls answered from the negative cache.")  \
  X(negative_entries, gauge, "tccd_negative_entries", "Recorded deterministic compile failures.")          \
  X(auth_failures, counter, "tccd_auth_failures_total", "Calls and scrapes refused for want of a valid token.") \
  X(queue_depth, gauge, "tccd_queue_depth", "Compile jobs waiting for a worker.")                          \
  X(running_jobs, gauge, "tccd_running_jobs", "Compile jobs in the compiler.")                             \
  X(autotuning_jobs, gauge, "tccd_autotuning_jobs", "Compile jobs being autotuned.")                       \
  X(workers, gauge, "tccd_workers", "Compile worker threads (--workers).")                                 \
  X(uptime_seconds, gauge, "tccd_uptime_seconds", "Seconds since tccd started.")                           \
  X(store_blocked, gauge, "tccd_store_blocked", "1 while a full disk blocks storing (misses are refused).")  \
  X(remote_enabled, gauge, "tccd_remote_enabled", "1 with a remote tier (--redis).")                       \
  X(remote_connected, gauge, "tccd_remote_connected", "1 while the remote tier answers.")                  \
  X(remote_hits, counter, "tccd_remote_hits_total", "Local misses answered from the remote tier.")          \
  X(remote_errors, counter, "tccd_remote_errors_total", "Failed, timed-out or refused remote operations.")  \
  X(remote_stores, counter, "tccd_remote_stores_total", "Entries written through to the remote tier.")     \
  X(remote_lock_waits, counter, "tccd_remote_lock_waits_total", "Compiles waited for on another daemon.")   \
  X(remote_rejected, counter, "tccd_remote_rejected_total", "Remote entries refused (digest, signature, key).") \
  X(autotune_runs, counter, "tccd_autotune_runs_total", "Tuning runs that benchmarked candidates.")         \
  X(autotune_candidates, counter, "tccd_autotune_candidates_total", "Candidate benchmark children run.")    \
  X(autotune_discarded, counter, "tccd_autotune_discarded_total", "Candidates discarded (crashed, timed out, wrong).") \
  X(autotune_crashed, counter, "tccd_autotune_crashed_total", "Benchmark children that died.")             \
  X(autotune_timeouts, counter, "tccd_autotune_timeouts_total", "Benchmark children killed at the timeout.") \
  X(autotune_wrong, counter, "tccd_autotune_wrong_total", "Candidates whose outputs disagreed with the default's.") \
  X(autotune_seconds, counter, "tccd_autotune_seconds_total", "Time spent autotuning.")                    \
  X(autotune_record_hits, counter, "tccd_autotune_record_hits_total", "Kernels configured from a stored tuning record.") \
  X(autotune_remote_record_hits, counter, "tccd_autotune_remote_record_hits_total",                       \
    "Of the tuning record hits: records found in the remote tier.")                                       \
  X(autotune_untuned, counter, "tccd_autotune_untuned_total", "max-autotune entries stored untuned.")       \
  X(object_hits, counter, "tccd_object_hits_total", "Kernel bodies linked from the object cache.")        \
  X(object_misses, counter, "tccd_object_misses_total", "Kernel bodies compiled (not in the object cache).") \
  X(tuning_records, gauge, "tccd_tuning_records", "Tuning records in the cache.")                          \
  X(plans, gauge, "tccd_plans", "Plans in the store.")                                                     \
  X(plan_bytes, gauge, "tccd_plan_bytes", "Encoded bytes of the stored plans.")                            \
  X(plan_hits, counter, "tccd_plan_hits_total", "GetPlan calls answered with a plan (local or remote).")   \
  X(plan_misses, counter, "tccd_plan_misses_total", "GetPlan calls answered NOT_FOUND.")                   \
  X(plans_stored, counter, "tccd_plans_stored_total", "PutPlan calls that stored a new plan.")

/* ------------------------------------------------------------ state */

typedef enum conn_state { CONN_READING, CONN_WRITING, CONN_CLOSING } conn_state;

static const char *const conn_state_names[] = {"READING", "WRITING", "CLOSING"};

typedef struct metrics_conn {
  tccd_metrics *m;
  conn_state state;
  uv_tcp_t tcp;
  uv_timer_t timer;
  int open_handles;             /* tcp + timer until both are closed */
  int writes;                   /* uv_write requests in flight */
  SSL *ssl;                     /* NULL: plain HTTP */
  BIO *in, *out;                /* TLS: bytes from the socket / for it (owned by ssl) */
  char req[METRICS_MAX_REQUEST + 1];
  size_t len;
  struct metrics_conn *next, **prev;
} metrics_conn;

struct tccd_metrics {
  tccd_state *st;
  histogram hist[TCCD_HIST__COUNT];
  uint64_t calls[TCCD_METHOD__COUNT + 1][GRPC_CODES]; /* [TCCD_METHOD__COUNT]: unknown methods */
  uv_tcp_t listener;
  int listening, port;
  SSL_CTX *tls;                 /* NULL: plain HTTP */
  metrics_conn *conns;
  int nconns;
  char rbuf[16384];             /* every read lands here first (one loop thread) */
};

typedef struct write_req {
  uv_write_t req;
  metrics_conn *c;
  size_t len;
  char data[];
} write_req;

/* ------------------------------------------------------------ observing */

void tccd_metrics_observe(tccd_state *st, tccd_histogram_id h, double seconds) {
  tccd_metrics *m = st->metrics;
  if (!m || !(seconds >= 0)) return; /* NaN or a clock step: not a latency */
  const struct hist_def *d = &hist_defs[h];
  int b = 0;
  while (b < d->nbounds && seconds > d->bounds[b]) b++;
  m->hist[h].counts[b]++;
  m->hist[h].count++;
  m->hist[h].sum += seconds;
}

void tccd_metrics_call_finished(tccd_metrics *metrics, tccd_method_id method, int code) {
  if (!metrics) return;
  if (code < 0 || code >= GRPC_CODES) code = -TCC_E_UNKNOWN;
  metrics->calls[method <= TCCD_METHOD__COUNT ? method : TCCD_METHOD__COUNT][code]++;
}

/* ------------------------------------------------------------ rendering */

typedef struct page {
  char *data;
  size_t len, cap;
  int oom;
} page;

static void page_printf(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void page_printf(page *p, const char *fmt, ...) {
  if (p->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->data ? p->data + p->len : NULL, p->data ? p->cap - p->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      p->oom = 1;
      return;
    }
    if (p->data && p->len + (size_t)n < p->cap) {
      p->len += (size_t)n;
      return;
    }
    size_t cap = p->cap ? p->cap : 8192;
    while (cap <= p->len + (size_t)n) cap *= 2;
    char *grown = realloc(p->data, cap);
    if (!grown) {
      p->oom = 1;
      return;
    }
    p->data = grown;
    p->cap = cap;
  }
}

/* A sample value as Prometheus reads it: the shortest form that
 * round-trips (integers without a fraction). */
static const char *fmt_value(double v, char buf[32]) {
  if (isnan(v)) return "NaN";
  if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, 32, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  return buf;
}

static void page_family(page *p, const char *name, const char *type, const char *help) {
  page_printf(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void page_sample(page *p, const char *name, const char *labels, double v) {
  char buf[32];
  page_printf(p, "%s%s %s\n", name, labels, fmt_value(v, buf));
}

static void render_histogram(page *p, const struct hist_def *d, const histogram *h) {
  char le[32], labels[64];
  page_family(p, d->name, "histogram", d->help);
  uint64_t cumulative = 0;
  for (int b = 0; b <= d->nbounds; b++) {
    cumulative += h->counts[b];
    snprintf(labels, sizeof labels, "{le=\"%s\"}", b < d->nbounds ? fmt_value(d->bounds[b], le) : "+Inf");
    page_printf(p, "%s_bucket%s %llu\n", d->name, labels, (unsigned long long)cumulative);
  }
  page_printf(p, "%s_sum %s\n%s_count %llu\n", d->name, fmt_value(h->sum, le), d->name,
              (unsigned long long)h->count);
}

static const char *const method_full_names[TCCD_METHOD__COUNT] = {
#define METHOD_NAME(id, name, fn, role) [TCCD_METHOD_##id] = name,
    TCCD_METHODS(METHOD_NAME)
#undef METHOD_NAME
};

/* The method label: "Compile" for "/tcc.v1.Compiler/Compile"; every
 * method gRPC does not know is "unknown" (clients do not pick labels). */
static const char *method_label(int m) {
  return m < TCCD_METHOD__COUNT ? strrchr(method_full_names[m], '/') + 1 : "unknown";
}

/* Renders the whole page into p. Returns 0, or a TCC_E_* code (the
 * cache could not be read) with a message in err. */
static int render(tccd_metrics *m, page *p, tcc_error *err) {
  Tcc__V1__StatsResponse r;
  int rc = tccd_stats_fill(m->st, &r, err);
  if (rc != 0) return rc;
#define STATS_RENDER(field, type, name, help) \
  page_family(p, name, #type, help);          \
  page_sample(p, name, "", (double)r.field);
  STATS_METRICS(STATS_RENDER)
#undef STATS_RENDER
  page_family(p, "tccd_requests_total", "counter", "gRPC calls finished, by method and status code.");
  for (int meth = 0; meth <= TCCD_METHOD__COUNT; meth++)
    for (int code = 0; code < GRPC_CODES; code++)
      if (m->calls[meth][code]) {
        char labels[128];
        snprintf(labels, sizeof labels, "{method=\"%s\",code=\"%s\"}", method_label(meth),
                 tcc_status_name(-code));
        page_sample(p, "tccd_requests_total", labels, (double)m->calls[meth][code]);
      }
  for (int h = 0; h < TCCD_HIST__COUNT; h++) render_histogram(p, &hist_defs[h], &m->hist[h]);
  page_family(p, "tccd_build_info", "gauge", "Always 1; the version is its label.");
  page_printf(p, "tccd_build_info{version=\"%s\"} 1\n", TCC_VERSION);
  return 0;
}

/* ------------------------------------------------------------ connections */

static int conn_transition_allowed(conn_state from, conn_state to) {
  switch (from) {
  case CONN_READING: return to == CONN_WRITING || to == CONN_CLOSING;
  case CONN_WRITING: return to == CONN_CLOSING;
  case CONN_CLOSING: return 0;
  }
  return 0;
}

static void conn_set_state(metrics_conn *c, conn_state to) {
  if (!conn_transition_allowed(c->state, to)) {
    log_error("metrics connection: illegal state change %s -> %s", conn_state_names[c->state],
              conn_state_names[to]);
    assert(!"illegal metrics connection state change");
  }
  c->state = to;
}

static void on_handle_closed(uv_handle_t *h) {
  metrics_conn *c = h->data;
  if (--c->open_handles > 0) return;
  *c->prev = c->next;
  if (c->next) c->next->prev = c->prev;
  c->m->nconns--;
  SSL_free(c->ssl); /* frees its BIOs; NULL is fine */
  free(c);
}

static void conn_close(metrics_conn *c) {
  if (c->state == CONN_CLOSING) return;
  conn_set_state(c, CONN_CLOSING);
  uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_timeout(uv_timer_t *t) {
  metrics_conn *c = t->data;
  log_debug("metrics: a connection %s for %d ms; closed", c->state == CONN_READING ? "sent no request" : "read no answer",
            METRICS_TIMEOUT_MS);
  conn_close(c);
}

static void on_write(uv_write_t *req, int status) {
  write_req *w = req->data;
  metrics_conn *c = w->c;
  free(w);
  c->writes--;
  if (status < 0) conn_close(c);
  else if (c->writes == 0 && c->state == CONN_WRITING) conn_close(c); /* answered: Connection: close */
}

/* Queues len bytes for the socket. Returns 0, or -1 (the connection is
 * closing). */
static int conn_send(metrics_conn *c, const char *data, size_t len) {
  if (c->state == CONN_CLOSING) return -1;
  write_req *w = malloc(sizeof *w + len);
  if (!w) {
    conn_close(c);
    return -1;
  }
  memcpy(w->data, data, len);
  w->len = len;
  w->c = c;
  w->req.data = w;
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_write) != 0) {
    free(w);
    conn_close(c);
    return -1;
  }
  c->writes++;
  return 0;
}

/* TLS: sends what OpenSSL wrote into the outgoing BIO. */
static int tls_flush(metrics_conn *c) {
  char buf[16384];
  int n;
  while ((n = BIO_read(c->out, buf, sizeof buf)) > 0)
    if (conn_send(c, buf, (size_t)n) != 0) return -1;
  return 0;
}

/* Sends the answer and closes once it is written. body may be NULL;
 * head_only (HEAD) sends the headers with the body's length only. */
static void conn_respond(metrics_conn *c, const char *status, const char *headers, const char *body,
                         size_t body_len, int head_only) {
  conn_set_state(c, CONN_WRITING);
  uv_read_stop((uv_stream_t *)&c->tcp);
  uv_timer_start(&c->timer, on_timeout, METRICS_TIMEOUT_MS, 0); /* to be read, this time */
  page p = {0};
  page_printf(&p,
              "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
              status, body && !strncmp(status, "200", 3) ? "text/plain; version=0.0.4; charset=utf-8"
                                                        : "text/plain; charset=utf-8",
              body_len, headers ? headers : "");
  if (!head_only && body) page_printf(&p, "%.*s", (int)body_len, body);
  if (p.oom) {
    free(p.data);
    conn_close(c);
    return;
  }
  if (c->ssl) {
    /* memory BIOs take everything at once */
    if (SSL_write(c->ssl, p.data, (int)p.len) != (int)p.len) {
      free(p.data);
      conn_close(c);
      return;
    }
    SSL_shutdown(c->ssl); /* close_notify rides along */
    if (tls_flush(c) == 0 && c->writes == 0) conn_close(c);
  } else {
    conn_send(c, p.data, p.len);
  }
  free(p.data);
}

static void respond_error(metrics_conn *c, const char *status, const char *headers, const char *msg) {
  char body[TCC_ERROR_MSG_MAX + 8];
  snprintf(body, sizeof body, "%s\n", msg);
  conn_respond(c, status, headers, body, strlen(body), 0);
}

/* The value of header `name` in the request (len bytes, not terminated);
 * NULL when absent. */
static const char *header_value(const char *req, const char *name, size_t *len) {
  size_t nlen = strlen(name);
  for (const char *line = strchr(req, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    const char *h = line + 1;
    if (strncasecmp(h, name, nlen) != 0 || h[nlen] != ':') continue;
    const char *v = h + nlen + 1;
    while (*v == ' ' || *v == '\t') v++;
    const char *end = v + strcspn(v, "\r\n");
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    *len = (size_t)(end - v);
    return v;
  }
  return NULL;
}

/* A whole request head is in c->req: answer it. */
static void conn_handle_request(metrics_conn *c) {
  tccd_metrics *m = c->m;
  char method[16], path[1024], version[16];
  if (sscanf(c->req, "%15[A-Z] %1023[^ \r\n] %15[^\r\n]", method, path, version) != 3 ||
      strncmp(version, "HTTP/1.", 7) != 0) {
    respond_error(c, "400 Bad Request", NULL, "expected an HTTP/1.x request line");
    return;
  }
  if (m->st->auth) {
    size_t len = 0;
    const char *v = header_value(c->req, "Authorization", &len);
    tcc_error err;
    int rc = v ? tccd_auth_check_value(m->st, v, len, TCCD_ROLE_CLIENT, &err)
               : tcc_error_set(&err, TCC_E_UNAUTHENTICATED,
                               "this tccd requires a bearer token (header 'Authorization: Bearer TOKEN')");
    if (rc != 0) {
      tcc_cache_count(m->st->cache, TCC_COUNTER_auth_failures, 1);
      log_info("metrics scrape refused: %s", err.msg);
      respond_error(c, "401 Unauthorized", "WWW-Authenticate: Bearer realm=\"tccd\"\r\n", err.msg);
      return;
    }
  }
  int head = strcmp(method, "HEAD") == 0;
  if (!head && strcmp(method, "GET") != 0) {
    respond_error(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD");
    return;
  }
  size_t plen = strcspn(path, "?");
  if (plen != 8 || strncmp(path, "/metrics", 8) != 0) {
    respond_error(c, "404 Not Found", NULL, "the metrics are at /metrics");
    return;
  }
  page p = {0};
  tcc_error err;
  if (render(m, &p, &err) != 0) {
    log_warn("metrics scrape failed: %s", err.msg);
    respond_error(c, "500 Internal Server Error", NULL, err.msg);
  } else if (p.oom) {
    respond_error(c, "500 Internal Server Error", NULL, "out of memory");
  } else {
    conn_respond(c, "200 OK", NULL, p.data, p.len, head);
  }
  free(p.data);
}

/* Request bytes arrived (decrypted). */
static void conn_input(metrics_conn *c, const char *data, size_t n) {
  if (c->len + n > METRICS_MAX_REQUEST) {
    respond_error(c, "431 Request Header Fields Too Large", NULL, "the request head is over 8 KiB");
    return;
  }
  memcpy(c->req + c->len, data, n);
  c->len += n;
  c->req[c->len] = '\0';
  if (memchr(c->req, '\0', c->len)) {
    respond_error(c, "400 Bad Request", NULL, "a NUL byte in the request");
    return;
  }
  if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) conn_handle_request(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  metrics_conn *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->m->rbuf, sizeof c->m->rbuf);
}

/* TLS: hands socket bytes to OpenSSL and request bytes on. */
static void tls_input(metrics_conn *c, const char *data, size_t n) {
  if (BIO_write(c->in, data, (int)n) != (int)n) {
    conn_close(c);
    return;
  }
  char plain[4096];
  while (c->state == CONN_READING) {
    int r = SSL_read(c->ssl, plain, sizeof plain);
    if (r > 0) {
      conn_input(c, plain, (size_t)r);
      continue;
    }
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ) break;
    char why[256];
    tccd_ssl_error_text(why, sizeof why);
    log_debug("metrics: TLS connection failed: %s", e == SSL_ERROR_ZERO_RETURN ? "closed by the peer" : why);
    tls_flush(c); /* an alert, if any */
    conn_close(c);
    return;
  }
  if (c->state == CONN_READING) tls_flush(c); /* handshake messages */
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  metrics_conn *c = s->data;
  if (nread < 0) {
    conn_close(c);
    return;
  }
  if (nread == 0 || c->state != CONN_READING) return;
  if (c->ssl) tls_input(c, buf->base, (size_t)nread);
  else conn_input(c, buf->base, (size_t)nread);
}

static void on_connection(uv_stream_t *server, int status) {
  tccd_metrics *m = server->data;
  if (status < 0) {
    log_warn("metrics: accept failed: %s", uv_strerror(status));
    return;
  }
  metrics_conn *c = calloc(1, sizeof *c);
  if (!c) {
    log_error("metrics: out of memory accepting a connection");
    return;
  }
  c->m = m;
  c->state = CONN_READING;
  uv_tcp_init(m->st->loop, &c->tcp);
  uv_timer_init(m->st->loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->open_handles = 2;
  c->next = m->conns;
  if (c->next) c->next->prev = &c->next;
  c->prev = &m->conns;
  m->conns = c;
  m->nconns++;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c);
    return;
  }
  if (m->nconns > METRICS_MAX_CONNS) {
    log_debug("metrics: over %d connections; one closed unanswered", METRICS_MAX_CONNS);
    conn_close(c);
    return;
  }
  if (m->tls) {
    c->ssl = SSL_new(m->tls); /* freed with the connection */
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    if (!c->ssl || !in || !out) {
      BIO_free(in);
      BIO_free(out);
      conn_close(c);
      return;
    }
    SSL_set_bio(c->ssl, in, out);
    c->in = in;
    c->out = out;
    SSL_set_accept_state(c->ssl);
  }
  uv_timer_start(&c->timer, on_timeout, METRICS_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ------------------------------------------------------------ start / stop */

/* The gRPC port's certificate (and client CA) for HTTPS. Returns NULL
 * with a message in err. */
static SSL_CTX *tls_context(const tccd_config *cfg, tcc_error *err) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  const char *what = "out of memory";
  if (!ctx) goto fail;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  what = cfg->tls_cert;
  if (SSL_CTX_use_certificate_chain_file(ctx, cfg->tls_cert) != 1) goto fail;
  what = cfg->tls_key;
  if (SSL_CTX_use_PrivateKey_file(ctx, cfg->tls_key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1)
    goto fail;
  if (cfg->tls_client_ca[0]) {
    what = cfg->tls_client_ca;
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(cfg->tls_client_ca);
    if (!names || SSL_CTX_load_verify_locations(ctx, cfg->tls_client_ca, NULL) != 1) {
      if (names) sk_X509_NAME_pop_free(names, X509_NAME_free);
      goto fail;
    }
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  return ctx;
fail:;
  char why[256];
  tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "--metrics-listen: cannot serve TLS with %s (%s)", what,
                tccd_ssl_error_text(why, sizeof why));
  SSL_CTX_free(ctx);
  return NULL;
}

/* Binds and listens on cfg->metrics_listen. Returns 0 or a code. */
static int metrics_listen(tccd_metrics *m, const char *listen, tcc_error *err) {
  struct addrinfo *res;
  char why[512];
  if (tccd_listen_resolve(listen, &res, why, sizeof why) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--metrics-listen %s", why);
  int rc;
  uv_tcp_init(m->st->loop, &m->listener);
  m->listener.data = m;
  m->listening = 1;
  rc = uv_tcp_bind(&m->listener, res->ai_addr, 0);
  freeaddrinfo(res);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&m->listener, 64, on_connection);
  if (rc != 0)
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot listen on %s (--metrics-listen): %s%s", listen,
                         uv_strerror(rc),
                         rc == UV_EADDRINUSE ? " (is another tccd running? choose another --metrics-listen port)" : "");
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getsockname(&m->listener, (struct sockaddr *)&ss, &len) == 0)
    m->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
  return 0;
}

int tccd_metrics_start(tccd_state *st, tcc_error *err) {
  for (int h = 0; h < TCCD_HIST__COUNT; h++) assert(hist_defs[h].nbounds <= HIST_MAX_BOUNDS);
  tccd_metrics *m = calloc(1, sizeof *m);
  if (!m) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  m->st = st;
  st->metrics = m;
  const tccd_config *cfg = st->cfg;
  if (!cfg->metrics_listen[0]) return 0;
  if (cfg->tls_cert[0] && !(m->tls = tls_context(cfg, err))) return err->code;
  return metrics_listen(m, cfg->metrics_listen, err);
}

int tccd_metrics_port(const tccd_state *st) { return st->metrics ? st->metrics->port : 0; }

void tccd_metrics_stop(tccd_state *st) {
  tccd_metrics *m = st->metrics;
  if (!m) return;
  if (m->listening) {
    m->listening = 0;
    uv_close((uv_handle_t *)&m->listener, NULL);
  }
  for (metrics_conn *c = m->conns; c; c = c->next) conn_close(c);
}

void tccd_metrics_free(tccd_state *st) {
  tccd_metrics *m = st->metrics;
  if (!m) return;
  assert(!m->conns);
  SSL_CTX_free(m->tls);
  free(m);
  st->metrics = NULL;
}
