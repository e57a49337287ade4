/*
 * daemon.h — tccd's internal table of contents.
 *
 * Threads (see server.c for the drawing):
 *   - the libuv loop thread owns ALL state: calls, jobs, the cache handle,
 *     counters. Every handler below runs on it.
 *   - one gRPC thread blocks in grpc_completion_queue_next and hands each
 *     (tag, ok) to the loop through a mutex-protected queue + uv_async.
 *   - the worker pool (libuv's thread pool, --workers threads) runs
 *     tcc_compile and the autotune builds; results come back to the loop.
 *   - two offload threads (offload.c) run what must not stall the loop:
 *     preparing requests over 64 KiB, gc's blob scan, malloc_trim.
 *
 * Grouped by defining file, chibicc-style.
 */
#ifndef TCCD_DAEMON_H
#define TCCD_DAEMON_H

#include <grpc/grpc.h>
#include <stdarg.h>
#include <stdint.h>
#include <uv.h>

#include "cache.h"
#include "compiler.h"
#include "tcc_sign.h"
#include "tcc_status.h"
#include "tune_child.h"

/* ------------------------------------------------------------- log.c */

typedef enum tccd_log_level {
  TCCD_LOG_ERROR, TCCD_LOG_WARN, TCCD_LOG_INFO, TCCD_LOG_DEBUG
} tccd_log_level;

/* --log-format: text lines, or one JSON object per line. */
typedef enum tccd_log_format { TCCD_LOG_TEXT, TCCD_LOG_JSON } tccd_log_format;

/* What a line about a call knows besides its message (the JSON fields;
 * text appends request_id= only). NULL or empty strings and negative
 * durations are left out. Start from TCCD_LOG_CTX_INIT or
 * tccd_call_log_ctx (call.c). */
typedef struct tccd_log_ctx {
  const char *request_id;
  const char *method;        /* "/tcc.v1.Compiler/Compile" */
  const char *client;        /* CompileRequest.client, the job/rank label */
  const char *guard_hash;    /* hex */
  int has_status, status;    /* the call's answer: 0 (OK) or a TCC_E_* code */
  double duration_ms;        /* since the call arrived */
  double queue_ms;           /* a compile: waiting for a worker */
  double compile_ms;         /* a compile: in the compiler (and autotuning) */
} tccd_log_ctx;
#define TCCD_LOG_CTX_INIT {.duration_ms = -1, .queue_ms = -1, .compile_ms = -1}

/* Parses "error", "warn", "info", "debug". Returns 0 or -1. */
int tccd_log_parse_level(const char *s, tccd_log_level *out);
/* Parses "text", "json". Returns 0 or -1. */
int tccd_log_parse_format(const char *s, tccd_log_format *out);
void tccd_log_set_level(tccd_log_level level);
void tccd_log_set_format(tccd_log_format format);
int tccd_log_enabled(tccd_log_level level);
void tccd_log(tccd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A line with fields (ctx may be NULL: a plain line). */
void tccd_log_fields(tccd_log_level level, const tccd_log_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tccd_log_fieldsv(tccd_log_level level, const tccd_log_ctx *ctx, const char *fmt, va_list ap);
#define log_error(...) tccd_log(TCCD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  tccd_log(TCCD_LOG_WARN, __VA_ARGS__)
#define log_info(...)  tccd_log(TCCD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) do { if (tccd_log_enabled(TCCD_LOG_DEBUG)) tccd_log(TCCD_LOG_DEBUG, __VA_ARGS__); } while (0)

/* ------------------------------------------------------------- config.c */

#define TCCD_DEFAULT_LISTEN "127.0.0.1:7311"

typedef struct tccd_config {
  char listen[256];          /* --listen HOST:PORT */
  char cache_dir[4096];      /* --cache-dir */
  int workers;               /* --workers (default: number of cores) */
  int queue_max;             /* --queue-max: queued compiles beyond workers */
  int64_t cache_max_bytes;   /* --cache-max-bytes (0 = unlimited) */
  tccd_log_level log_level;  /* --log-level */
  tccd_log_format log_format; /* --log-format */
  char cc[1024];             /* --cc: C compiler for CPU kernels */
  int compile_timeout_ms;    /* --compile-timeout-ms */
  int shutdown_grace_ms;     /* --shutdown-grace-ms */
  char port_file[4096];      /* --port-file: write the bound port here */
  char signing_key[4096];    /* --signing-key: Ed25519 secret key file */
  int no_signing;            /* --no-signing: serve unsigned artifacts */
  char trusted_keys[8192];   /* --trusted-keys: .pub files accepted from Redis */
  char auth_tokens[4096];    /* --auth-tokens: "role token" lines */
  char tls_cert[4096];       /* --tls-cert: PEM chain */
  char tls_key[4096];        /* --tls-key: PEM key */
  char tls_client_ca[4096];  /* --tls-client-ca: require client certs (mTLS) */
  char redis[1024];          /* --redis URL: the remote tier */
  int64_t redis_ttl_s;       /* --redis-ttl */
  int redis_timeout_ms;      /* --redis-timeout-ms */
  int allow_root;            /* --allow-root */
  int autotune_timeout_ms;   /* --autotune-timeout-ms: one benchmark child */
  int autotune_reps;         /* --autotune-reps */
  int64_t failure_ttl_s;     /* --failure-ttl: negative-cache lifetime (0: off) */
  int64_t request_memory_max; /* --request-memory-max: admission budget (0: none) */
  int64_t object_cache_max_bytes; /* --object-cache-max-bytes (0: no object cache) */
  char plan_writers[16];     /* --plan-writers: client, admin or none (who may PutPlan) */
  int redis_trust_unsigned;  /* --redis-trust-unsigned: --no-signing with --redis */
  char metrics_listen[256];  /* --metrics-listen HOST:PORT: Prometheus page ("": off) */
} tccd_config;

/* Fills cfg from defaults, then TCCD_<FLAG> environment variables, then
 * argv. Returns 0 to run, 1 when --help/--version was handled (exit 0),
 * or -1 with a message in err (exit 2). */
int tccd_config_load(tccd_config *cfg, int argc, char **argv, tcc_error *err);
void tccd_config_usage(FILE *out);
/* Resolves a listen address, HOST:PORT or [V6]:PORT (an empty HOST:
 * every address), for binding. Returns 0 with *out (freeaddrinfo it), or
 * -1 with why filled ("expects HOST:PORT", "cannot resolve 'h': ..."). */
struct addrinfo;
int tccd_listen_resolve(const char *listen, struct addrinfo **out, char *why, size_t cap);

/* ------------------------------------------------------------- server.c */

typedef struct tccd_server tccd_server;
typedef struct tccd_call tccd_call;

/* A completion-queue tag: what to run on the loop when a batch completes. */
typedef struct tccd_tag {
  void (*fn)(void *obj, int ok);
  void *obj;
} tccd_tag;

/* Who may call a method when --auth-tokens is set: OPEN needs no token,
 * CLIENT a client or admin token, ADMIN an admin token. */
typedef enum tccd_role { TCCD_ROLE_OPEN, TCCD_ROLE_CLIENT, TCCD_ROLE_ADMIN } tccd_role;

/* The registered methods: X(ID, full name, handler, role). */
#define TCCD_METHODS(X)                                                                  \
  X(COMPILE, "/tcc.v1.Compiler/Compile", tccd_rpc_compile, TCCD_ROLE_CLIENT)             \
  X(FETCH, "/tcc.v1.Compiler/Fetch", tccd_rpc_fetch, TCCD_ROLE_CLIENT)                   \
  X(OPS, "/tcc.v1.Compiler/Ops", tccd_rpc_ops, TCCD_ROLE_CLIENT)                         \
  X(JOBS, "/tcc.v1.Compiler/Jobs", tccd_rpc_jobs, TCCD_ROLE_CLIENT)                      \
  X(STATS, "/tcc.v1.Cache/Stats", tccd_rpc_stats, TCCD_ROLE_CLIENT)                      \
  X(LIST, "/tcc.v1.Cache/List", tccd_rpc_list, TCCD_ROLE_CLIENT)                         \
  X(SHOW, "/tcc.v1.Cache/Show", tccd_rpc_show, TCCD_ROLE_CLIENT)                         \
  X(EXPLAIN, "/tcc.v1.Cache/Explain", tccd_rpc_explain, TCCD_ROLE_CLIENT)                \
  X(EVICT, "/tcc.v1.Cache/Evict", tccd_rpc_evict, TCCD_ROLE_ADMIN)                       \
  X(GC, "/tcc.v1.Cache/Gc", tccd_rpc_gc, TCCD_ROLE_ADMIN)                                \
  X(ZERO_STATS, "/tcc.v1.Cache/ZeroStats", tccd_rpc_zero_stats, TCCD_ROLE_ADMIN)         \
  X(CLEAR, "/tcc.v1.Cache/Clear", tccd_rpc_clear, TCCD_ROLE_ADMIN)                       \
  X(WARM, "/tcc.v1.Cache/Warm", tccd_rpc_warm, TCCD_ROLE_ADMIN)                          \
  X(PUT_PLAN, "/tcc.v1.Cache/PutPlan", tccd_rpc_put_plan, TCCD_ROLE_CLIENT)              \
  X(GET_PLAN, "/tcc.v1.Cache/GetPlan", tccd_rpc_get_plan, TCCD_ROLE_CLIENT)              \
  X(HEALTH_CHECK, "/grpc.health.v1.Health/Check", tccd_rpc_health_check, TCCD_ROLE_OPEN)

typedef enum tccd_method_id {
#define TCCD_METHOD_ENUM(id, name, fn, role) TCCD_METHOD_##id,
  TCCD_METHODS(TCCD_METHOD_ENUM)
#undef TCCD_METHOD_ENUM
  TCCD_METHOD__COUNT
} tccd_method_id;

/* Daemon-wide runtime state; lives on the loop thread. */
typedef struct tccd_state {
  tccd_config *cfg;
  tccd_server *server;
  uv_loop_t *loop;
  tcc_cache *cache;
  char identity[512];              /* compiler identity for guard keys */
  uint64_t started_ns;
  struct tccd_jobs *jobs;          /* compile.c */
  int draining;                    /* shutting down: refuse new compiles */
  tcc_sign_key *signing_key;       /* --signing-key; NULL with --no-signing */
  tcc_trusted_keys trusted;        /* own public key + --trusted-keys */
  struct tccd_auth *auth;          /* --auth-tokens; NULL = every call is open */
  struct tccd_remote *remote;      /* --redis; NULL = no remote tier */
  struct tccd_offload *offload;    /* offload.c: threads for work kept off the loop */
  struct tccd_metrics *metrics;    /* metrics.c: histograms, per-status counts, the HTTP port */
  int store_blocked;               /* compile.c: the disk is full, nothing can be stored */
  char store_blocked_reason[512];
  struct tccd_misses *misses;      /* explain.c: keys of recent misses */
  struct tccd_warms *warms;        /* warm.c: warm runs, for progress by id */
  int open_without_auth;           /* main.c: listening beyond loopback without --auth-tokens */
} tccd_state;

/* The role a call of `method` needs: the method table's, except PutPlan
 * with --plan-writers admin (server.c). */
tccd_role tccd_method_role_needed(const tccd_state *st, int method);

/* Creates the server, binds cfg->listen (refusing a port already in use),
 * registers the methods and starts the gRPC thread. Returns 0, or -1 with
 * a message in err. */
int tccd_server_start(tccd_state *st, tcc_error *err);

/* Begins a graceful shutdown: stop accepting, let in-flight calls finish
 * for up to grace_ms, then cancel them. `done` runs on the loop once every
 * call is gone and the gRPC thread has stopped. */
void tccd_server_shutdown(tccd_server *srv, int grace_ms, void (*done)(tccd_state *));

/* Frees what tccd_server_start made; call after `done` ran. */
void tccd_server_free(tccd_server *srv);

/* The bound port (after start). */
int tccd_server_port(const tccd_server *srv);

/* ------------------------------------------------------------- call.c */

/* Request ids (TCC_REQUEST_ID_MAX): a sane client-sent x-request-id is
 * kept, anything else replaced by 16 hex digits (a per-process random
 * prefix and a counter). The client label is cut for logs. */
#define TCCD_CLIENT_LABEL_MAX 64

/* A call's life (see call.c's drawing): X(state). */
#define TCCD_CALL_STATES(X) X(REQUESTED) X(ACTIVE) X(STREAMING) X(CANCELLED) X(FINISHING)

typedef enum tccd_call_state {
#define TCCD_CALL_STATE_ENUM(name) TCCD_CALL_##name,
  TCCD_CALL_STATES(TCCD_CALL_STATE_ENUM)
#undef TCCD_CALL_STATE_ENUM
} tccd_call_state;

/* One incoming call. Created when the server requests a call from gRPC,
 * freed when its last reference is dropped (see call.c). */
struct tccd_call {
  tccd_server *server;
  tccd_method_id method;           /* TCCD_METHOD__COUNT: an unknown method */
  const char *method_name;         /* for logs */
  void (*released)(tccd_server *); /* runs once the call is freed */
  void (*finished)(tccd_server *, tccd_method_id, int); /* runs once, with the status */
  tccd_call_state state;           /* see call.c's drawing */
  grpc_call *call;
  grpc_call_details details;       /* unknown methods only */
  tccd_tag request_tag;            /* gRPC handed us this call */
  int refs;                        /* batches in flight + 1 until finished */
  gpr_timespec deadline;
  grpc_metadata_array request_md;
  grpc_byte_buffer *payload;       /* the request message, or NULL */
  uint64_t start_ns;               /* when it arrived (uv_hrtime) */
  char request_id[TCC_REQUEST_ID_MAX + 1]; /* set on arrival; sent back as x-request-id */
  char guard_hash[TCC_SHA256_HEX];  /* Compile: once prepared (for logs) */
  char client[TCCD_CLIENT_LABEL_MAX + 1]; /* Compile: CompileRequest.client, cut (for logs) */
  int failure_logged;              /* a handler logged its failure at info already */
  grpc_metadata reply_md;          /* x-request-id, in initial (and failed calls' trailing) metadata */
  tccd_tag close_tag, send_tag;
  grpc_byte_buffer *send_buf;      /* in flight, destroyed on completion */
  grpc_slice status_details;
  int close_cancelled_flag;        /* filled by RECV_CLOSE_ON_SERVER */
  /* server streaming (Fetch): what is left to send */
  uint8_t *stream_data;
  size_t stream_len, stream_off, stream_chunk;
  char stream_sha[TCC_SHA256_HEX];
  int stream_kind;
  uint8_t stream_sig[TCC_SIGNATURE_BYTES]; /* the entry's signature (Fetch by guard hash) */
  size_t stream_sig_len;
  char stream_key_id[TCC_SIGN_KEY_ID_HEX];
  int initial_md_sent;
  /* compile waiters: next call waiting on the same job */
  tccd_call *next_waiter;
};

/* 1 when the call machine allows from -> to (the table call.c asserts). */
int tccd_call_transition_allowed(tccd_call_state from, tccd_call_state to);

/* For the server: a call in REQUESTED for method m (TCCD_METHOD__COUNT:
 * the generic request) holding one reference, the pending request's;
 * finished(srv, m, grpc status code) runs once when it finishes;
 * released(srv) runs after it is freed. NULL when out of memory. */
tccd_call *tccd_call_new(tccd_server *srv, tccd_method_id m, const char *method_name,
                         void (*finished)(tccd_server *srv, tccd_method_id m, int code),
                         void (*released)(tccd_server *srv));
/* For the server: the call arrived (REQUESTED -> ACTIVE); the request's
 * reference becomes the handler's, and the client's going away is
 * watched (RECV_CLOSE_ON_SERVER). */
void tccd_call_activate(tccd_call *c);
/* Drops one reference; the last frees the call. */
void tccd_call_unref(tccd_call *c);

/* Reply helpers: each finishes the call (exactly one per call). */
void tccd_call_reply(tccd_call *c, const ProtobufCMessage *msg);
void tccd_call_reply_bytes(tccd_call *c, const uint8_t *data, size_t len);
void tccd_call_fail(tccd_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tccd_call_fail_error(tccd_call *c, const tcc_error *err);

/* Server streaming: send `data` as ArtifactChunk messages, then OK; the
 * first chunk's Artifact carries digest, kind, size and (sig_len > 0) the
 * entry's signature and key id. Takes ownership of data (malloc'd). */
void tccd_call_stream_artifact(tccd_call *c, uint8_t *data, size_t len, const char *sha_hex, int kind,
                               size_t chunk, const uint8_t *sig, size_t sig_len, const char *key_id);

/* The request payload as one malloc'd buffer (caller frees). Returns 0 or
 * fails the call itself and returns -1. */
int tccd_call_read_payload(tccd_call *c, uint8_t **data, size_t *len);
/* The request payload unpacked as a `desc` message (free with
 * protobuf_c_message_free_unpacked(m, NULL)), or NULL after failing the
 * call ("malformed tcc.v1.WarmRequest"). */
ProtobufCMessage *tccd_call_unpack(tccd_call *c, const ProtobufCMessageDescriptor *desc);

/* Moves the request message out of the call (the caller destroys it
 * with grpc_byte_buffer_destroy; any thread may read it). NULL when the
 * call has none. */
grpc_byte_buffer *tccd_call_take_payload(tccd_call *c);

/* Reads a request message into one malloc'd buffer, on any thread.
 * Returns 0, or a TCC_E_* code with a message in err. */
int tccd_payload_read(grpc_byte_buffer *payload, uint8_t **data, size_t *len, tcc_error *err);

/* Milliseconds since the call arrived. */
double tccd_call_elapsed_ms(const tccd_call *c);

/* The log context of a call: its request id, method, client label, guard
 * hash and time since arrival (the strings borrow c). */
tccd_log_ctx tccd_call_log_ctx(const tccd_call *c);
/* A line about a call (tccd_log_fields with tccd_call_log_ctx). */
void tccd_call_log(tccd_log_level level, const tccd_call *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------- rpc.c */

/* Handlers: each owns the call from here on and must finish it. */
#define TCCD_HANDLER_DECL(id, name, fn, role) void fn(tccd_state *st, tccd_call *c);
TCCD_METHODS(TCCD_HANDLER_DECL)
#undef TCCD_HANDLER_DECL

/* Fills *out with what Stats answers: the cache's counters and the
 * daemon's gauges (its strings borrow st and TCC_VERSION; valid until
 * the loop moves on). Stats and the metrics page both read it. Returns 0
 * or a TCC_E_* code with a message in err. */
struct Tcc__V1__StatsResponse;
int tccd_stats_fill(const tccd_state *st, struct Tcc__V1__StatsResponse *out, tcc_error *err);

/* ------------------------------------------------------------- offload.c */

typedef struct tccd_offload tccd_offload;

/* Threads for work that must not run on the loop (see offload.c). */
int tccd_offload_start(tccd_state *st);
/* Runs work(arg) on an offload thread, then done(arg, 0) on the loop;
 * done(arg, 1) without the work when tccd_offload_stop comes first.
 * Returns 0, or -1 (out of memory, or no pool) when nothing will run. */
int tccd_offload_submit(tccd_state *st, void (*work)(void *arg), void (*done)(void *arg, int cancelled),
                        void *arg);
/* Cancels what is queued, joins the threads, closes the handle. */
void tccd_offload_stop(tccd_state *st);

/* ------------------------------------------------------------- metrics.c */

typedef struct tccd_metrics tccd_metrics;

/* The latency histograms the loop fills: X(ID, metric name, help,
 * bucket upper bounds in seconds). */
#define TCCD_HISTOGRAMS(X)                                                                         \
  X(CACHE_HIT, "tccd_cache_hit_seconds",                                                          \
    "Time from a Compile call's arrival to its cache-hit reply.",                                  \
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)                            \
  X(COMPILE, "tccd_compile_duration_seconds",                                                     \
    "Time a successful compile job spent in the compiler on a worker (autotuning excluded).",      \
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)                                         \
  X(QUEUE_WAIT, "tccd_queue_wait_seconds",                                                        \
    "Time from a compile job being queued to a worker starting it.",                               \
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)

typedef enum tccd_histogram_id {
#define TCCD_HISTOGRAM_ENUM(id, name, help, ...) TCCD_HIST_##id,
  TCCD_HISTOGRAMS(TCCD_HISTOGRAM_ENUM)
#undef TCCD_HISTOGRAM_ENUM
  TCCD_HIST__COUNT
} tccd_histogram_id;

/* Makes st->metrics and, with --metrics-listen, binds the metrics port
 * (TLS with the gRPC port's certificate when --tls-cert is set). Returns
 * 0, TCC_E_INVALID_ARGUMENT / FAILED_PRECONDITION (a bad address or TLS
 * file: exit 2) or TCC_E_UNAVAILABLE (the port cannot be bound: exit 1),
 * with a message in err. */
int tccd_metrics_start(tccd_state *st, tcc_error *err);
/* The bound metrics port (0: not listening). */
int tccd_metrics_port(const tccd_state *st);
/* On the loop: one observation of `seconds` in histogram h. */
void tccd_metrics_observe(tccd_state *st, tccd_histogram_id h, double seconds);
/* On the loop (for server.c, as calls finish): a call of `method`
 * (TCCD_METHOD__COUNT: an unknown one) finished with gRPC status code
 * `code`. metrics may be NULL (nothing is counted). */
void tccd_metrics_call_finished(tccd_metrics *metrics, tccd_method_id method, int code);
/* Stops listening and closes every scrape connection (shutdown). */
void tccd_metrics_stop(tccd_state *st);
/* Frees st->metrics once its handles have closed (after uv_run). */
void tccd_metrics_free(tccd_state *st);

/* ------------------------------------------------------------- compile.c */

typedef struct tccd_job_stats {
  int64_t queued;       /* waiting for a worker */
  int64_t running;      /* in tcc_compile */
  int64_t autotuning;   /* in AUTOTUNING (max-autotune) */
} tccd_job_stats;

/* A detached job's end (on the loop): rc 0 when stored, else its TCC_E_*
 * code and message. */
typedef void (*tccd_job_end_fn)(void *arg, int rc, const char *msg);

int tccd_jobs_init(tccd_state *st);
/* Compiles a prepared request with no call waiting (warm run warm_id): a
 * job like a miss's, coalescing with requests for the same hash, that
 * keeps `request` (its encoded CompileRequest) with the entry. Takes prep
 * and request. Returns 0 (on_end runs when the job ends), 1 when the hash is
 * cached or compiling already (nothing started), or a TCC_E_* code (a
 * recorded failure, a backoff, shutdown, storing blocked) with err. */
int tccd_compile_detached(tccd_state *st, tcc_prepared *prep, uint8_t *request, size_t request_len,
                          uint64_t warm_id, tccd_job_end_fn on_end, void *arg, tcc_error *err);
void tccd_jobs_stats(const tccd_state *st, tccd_job_stats *out);
/* Shutdown, first step: cancels queued jobs (their waiters get
 * UNAVAILABLE); running ones go on until the grace period ends
 * (tccd_jobs_cancel_running). */
void tccd_jobs_cancel_queued(tccd_state *st);
/* Shutdown, after the grace period: every call still waiting on a running
 * compile gets UNAVAILABLE now. */
void tccd_jobs_abandon_waiters(tccd_state *st);
/* Shutdown, after the grace period: kills every compiler and benchmark
 * child (tcc_tools_cancel); their jobs fail as transient and store
 * nothing, and a max-autotune job cut short stores nothing either. */
void tccd_jobs_cancel_running(tccd_state *st);
void tccd_jobs_free(tccd_state *st);
/* Housekeeping: after a burst of large requests, gives the heaps' free
 * memory back to the system (malloc_trim on an offload thread). */
void tccd_jobs_trim(tccd_state *st);
/* Housekeeping: unblocks storing once the cache's disk has room again. */
void tccd_store_check(tccd_state *st);
/* Unblocks storing (a gc or evict freed space); why goes to the log. */
void tccd_store_unblock(tccd_state *st, const char *why);

/* ------------------------------------------------------------- explain.c */

/* Keeps the key of a miss (the last 64, keys up to 1 MiB), so a client
 * that just missed can ask why by guard hash before anything is stored. */
void tccd_explain_note_miss(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                            size_t key_len);
void tccd_explain_free(tccd_state *st);

/* ------------------------------------------------------------- warm.c */

/* Housekeeping (and each step's end): moves every warm run on while a
 * worker is idle. */
void tccd_warm_pump(tccd_state *st);
/* Frees the runs, after the loop has ended and after tccd_jobs_free. */
void tccd_warm_free(tccd_state *st);

/* ------------------------------------------------------------- autotune.c */

typedef struct tccd_tune tccd_tune;

/* Called on the loop when a tuning run ends. *tuned is the artifact to
 * store instead of the default one (ownership moves to the callee), or
 * all zero when the default artifact stays (untuned, nothing better, or
 * tuning failed). autotune_ms is the time tuning took. */
typedef void (*tccd_tune_done)(void *arg, tcc_artifact *tuned, double autotune_ms);

/* 1 when a compiled job with this preparation is autotuned (mode
 * max-autotune or max-autotune-no-cudagraphs). */
int tccd_autotune_wanted(const tcc_prepared *prep);

/* Starts autotuning prep (compiled already; on the loop): looks up
 * tuning records, builds the candidates in parallel on the pool,
 * benchmarks them one at a time in tccd-bench children, records the
 * winners, builds the final artifact. prep must outlive the run.
 * Returns the run (for progress); done(arg, ...) then runs exactly
 * once, later, on the loop. Returns NULL when nothing is measured: a
 * CUDA target (no GPU here: the launch heuristic stays and the entry
 * is counted untuned) or out of memory; done never runs then and the
 * default artifact stays. */
tccd_tune *tccd_autotune_start(tccd_state *st, const tcc_prepared *prep, tccd_tune_done done,
                               void *arg);
/* Progress of a run: candidates benchmarked so far and in all. */
void tccd_autotune_progress(const tccd_tune *t, int *done, int *total);

/* ------------------------------------------------------------- tune_child.c
 *
 * The benchmark child (tccd-bench, runtime/bench.c) run on one candidate
 * (tccd_bench_run) and the GPU probe (tccd_gpu_probe, tccd_gpu_pick):
 * declared in tune_child.h (included above), which tests compile without
 * libuv or gRPC. */

/* ------------------------------------------------------------- security.c */

/* Refuses root (unless --allow-root), loads the signing key and the
 * trusted keys (and the auth tokens). Returns 0, or a TCC_E_* code with a
 * message in err. tccd_security_free releases (and wipes) what it loaded. */
int tccd_security_init(tccd_state *st, tcc_error *err);
/* After the cache dir exists: with neither --signing-key nor --no-signing,
 * loads CACHE_DIR/signing.key, generating it on first start. */
int tccd_security_default_key(tccd_state *st, tcc_error *err);
void tccd_security_free(tccd_state *st);

/* Checks the call's `authorization: Bearer <token>` metadata against the
 * method's role (st->auth NULL or the role OPEN: always 0). Returns 0,
 * TCC_E_UNAUTHENTICATED (no or unknown token) or TCC_E_PERMISSION_DENIED
 * (a client token on an admin method), with a message that never
 * contains the token. */
int tccd_auth_check(const tccd_state *st, const grpc_metadata_array *md, tccd_role need,
                    tcc_error *err);
/* OpenSSL's first queued error as text in buf ("" when none), clearing
 * the queue. Returns buf. */
const char *tccd_ssl_error_text(char *buf, size_t cap);
/* The same check of one authorization value ("Bearer TOKEN", len bytes,
 * not NUL-terminated), for the metrics port's HTTP header. */
int tccd_auth_check_value(const tccd_state *st, const char *value, size_t len, tccd_role need,
                          tcc_error *err);

/* ------------------------------------------------------------- remote.c */

typedef struct tccd_remote tccd_remote;
typedef struct tccd_remote_flight tccd_remote_flight;

/* A flight's life (see remote.c's drawing): X(state). */
#define TCCD_FLIGHT_STATES(X) X(PROBE) X(LOCK) X(WAIT) X(HIT) X(FAILURE) X(COMPILE) X(CANCELLED)

typedef enum tccd_flight_state {
#define TCCD_FLIGHT_STATE_ENUM(name) TCCD_FLIGHT_##name,
  TCCD_FLIGHT_STATES(TCCD_FLIGHT_STATE_ENUM)
#undef TCCD_FLIGHT_STATE_ENUM
} tccd_flight_state;

/* 1 when the flight machine allows from -> to (the table remote.c asserts). */
int tccd_flight_transition_allowed(tccd_flight_state from, tccd_flight_state to);

/* How a cluster-wide lookup ended (see remote.c's drawing). */
typedef struct tccd_remote_result {
  int hit;                 /* 1: entry + artifact below, verified */
  int locked;              /* compile here holding the cluster lock (token) */
  int waited;              /* it waited on another daemon's compile */
  char token[33];          /* the lock's token when locked */
  tcc_cache_entry entry;   /* hit: owned by the receiver (tcc_cache_entry_clear) */
  uint8_t *artifact;       /* hit: malloc'd, owned by the receiver */
  size_t artifact_len;
  int failed;              /* a verified failure record: answer its error */
  int fail_code;           /* failed: TCC_E_* */
  char fail_message[TCC_ERROR_MSG_MAX];
} tccd_remote_result;

typedef void (*tccd_remote_done)(void *arg, tccd_remote_result *res);

/* With --redis: parses the URL and starts connecting (never blocks; a
 * Redis that is down is retried in the background). Returns 0, or
 * TCC_E_INVALID_ARGUMENT for a malformed URL. */
int tccd_remote_init(tccd_state *st, tcc_error *err);

/* Drops the connection and frees the tier (on shutdown). */
void tccd_remote_close(tccd_state *st);

/* Starts the cluster-wide lookup of a local miss: the entry from Redis,
 * or the lock to compile it, or a wait on the daemon that holds it.
 * done(arg, res) runs later on the loop, exactly once unless cancelled.
 * Returns NULL (done never runs) when there is no remote tier or no
 * connection: compile locally at once. */
tccd_remote_flight *tccd_remote_begin(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES],
                                      const uint8_t *key, size_t key_len, tccd_remote_done done,
                                      void *arg);
/* Forgets a flight; its done never runs. */
void tccd_remote_cancel(tccd_remote_flight *f);

/* Writes an entry and its artifact through to Redis (with the TTL) and
 * drops the cluster lock when token (may be NULL) still holds it. */
void tccd_remote_publish(tccd_state *st, const tcc_cache_entry *e, const uint8_t *artifact, size_t len,
                         const char *token);
/* Drops the cluster lock if token still holds it (a failed compile). */
void tccd_remote_release(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const char *token);
/* Refreshes the TTL of an entry and its artifact. */
void tccd_remote_touch(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES]);
/* Shares a deterministic compile failure (the negative cache) with the
 * cluster (tccd:{hash}:failure: format 2, naming this daemon's compiler
 * identity, signed when the daemon signs, living min(--failure-ttl,
 * --redis-ttl)) and drops the cluster lock when token (may be NULL) holds
 * it. Other codes are not shared (transient failures never are). */
void tccd_remote_publish_failure(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                                 size_t key_len, const char *target, int code, const char *message,
                                 const char *token);

/* What tccd_remote_evict removed from the shared tier. */
typedef struct tccd_remote_evict_result {
  int entry, artifact, failure;    /* 1: that key existed and was deleted */
  int error;                       /* 0, or a TCC_E_* code: Redis did not delete (message says why) */
  char message[TCC_ERROR_MSG_MAX];
} tccd_remote_evict_result;
typedef void (*tccd_remote_evict_done)(void *arg, const tccd_remote_evict_result *res);
/* `tcctl evict` cluster-wide: deletes tccd:{hash}:entry, :artifact and
 * :failure in one script (the lock, held by a compile in progress, and
 * tuning records, shared by every graph with that kernel, stay).
 * done(arg, res) runs later on the loop exactly once (an error reply, a
 * timeout (--redis-timeout-ms) or shutdown come as res->error). Returns
 * 0; -1 when there is no remote tier; TCC_E_UNAVAILABLE with a message
 * in err when the node for the hash is not connected (done never runs
 * then). */
int tccd_remote_evict(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], tccd_remote_evict_done done,
                      void *arg, tcc_error *err);

/* Records: opaque blobs shared cluster-wide under tccd:{<tag>}:rec:<kind>
 * (e.g. kind "tune", tag the hex of a tuning-record key): the hook for
 * tuning records. tag and kind: 1-128 characters of [0-9A-Za-z_.-]; the
 * tag is the hash tag (the Redis Cluster slot). A put is signed with the
 * daemon's key (when it signs) and written with the TTL; a get verifies
 * the signature whenever the daemon has trusted keys, so a record came
 * from a trusted daemon or is not returned -- but a consumer must still
 * treat its contents as input to validate (a tuning record should only
 * choose among candidates the daemon generated itself).
 *
 * tccd_remote_record_put: fire-and-forget; with keep_existing, a record
 * already there stays (SET ... NX: the first writer wins, as plans do).
 * Returns 0 (sent), -1 (no
 * remote tier or not connected; nothing sent) or TCC_E_INVALID_ARGUMENT.
 * tccd_remote_record_get: done(arg, found, data, len) runs later on the
 * loop exactly once -- found 1 with the blob (valid during the call), 0
 * when absent, -1 on an error, a timeout (--redis-timeout-ms), a record
 * that fails verification, or shutdown -- unless it returns non-zero (as
 * put), when done never runs. */
typedef void (*tccd_remote_record_done)(void *arg, int found, const uint8_t *data, size_t len);
/* 1 when s is 1-max characters of [0-9A-Za-z_.-]: a record's kind or tag
 * (max 128; no braces, the tag is the hash tag), a plan's key (200). */
int tccd_name_ok(const char *s, size_t max);
int tccd_remote_record_put(tccd_state *st, const char *kind, const char *tag, const uint8_t *data, size_t len,
                           int keep_existing);
int tccd_remote_record_get(tccd_state *st, const char *kind, const char *tag, tccd_remote_record_done done,
                           void *arg);

/* For Stats: enabled, connected, "host:port/db". */
void tccd_remote_info(const tccd_state *st, int *enabled, int *connected, const char **address);

/* ------------------------------------------------------------- redis_cluster.c */

/* The Redis connection layer under remote.c: one server or a Redis
 * Cluster (found by asking CLUSTER SLOTS), commands routed by the hash
 * slot of their key, MOVED/ASK/TRYAGAIN followed (see the file's drawing). */
typedef struct tccd_redis tccd_redis;
struct redisReply;

/* A node's connection (see redis_cluster.c's drawing): X(state). */
#define TCCD_REDIS_NODE_STATES(X) X(DOWN) X(CONNECTING) X(CONNECTED) X(CLOSED)

typedef enum tccd_redis_node_state {
#define TCCD_REDIS_NODE_STATE_ENUM(name) TCCD_REDIS_NODE_##name,
  TCCD_REDIS_NODE_STATES(TCCD_REDIS_NODE_STATE_ENUM)
#undef TCCD_REDIS_NODE_STATE_ENUM
} tccd_redis_node_state;

/* 1 when the node machine allows from -> to (the table redis_cluster.c
 * asserts). */
int tccd_redis_node_transition_allowed(tccd_redis_node_state from, tccd_redis_node_state to);

/* Connection-level news for the owner (remote.c counts and logs them). */
typedef struct tccd_redis_events {
  void *arg;
  void (*trouble)(void *arg, const char *msg); /* a failure: no connection, lost, hung */
  void (*healthy)(void *arg);                  /* a node (re)connected */
} tccd_redis_events;

/* A command's answer: a hiredis reply (an error reply made by the layer
 * starts with "tccd: "), or NULL when the layer closed. Valid only during
 * the call. */
typedef void (*tccd_redis_reply_fn)(void *arg, struct redisReply *reply);

typedef struct tccd_redis_stats {
  int cluster;          /* the servers are a Redis Cluster */
  int nodes;            /* known nodes (seeds + masters of the slot map) */
  int connected_nodes;
  int64_t moved, ask;   /* redirections followed */
} tccd_redis_stats;

/* Parses urls ("redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" or several,
 * comma-separated; later ones may drop the scheme) and starts connecting
 * to every seed (never blocks). Returns 0, or TCC_E_INVALID_ARGUMENT with
 * a message (never the password). */
int tccd_redis_open(uv_loop_t *loop, const char *urls, int timeout_ms, const tccd_redis_events *ev,
                    tccd_redis **out, tcc_error *err);
/* Sends argv (binary-safe when lens is set) to the node owning key's hash
 * slot (key NULL: any node). Returns 0 (fn runs later, exactly once) or
 * -1 when that node is not connected (nothing sent, fn never runs). */
int tccd_redis_command(tccd_redis *rc, const char *key, size_t key_len, int argc, const char **argv,
                       const size_t *lens, tccd_redis_reply_fn fn, void *arg);
/* The hash slot of a key: CRC16-XMODEM of its {hash tag} (or of the whole
 * key) mod 16384, as the Redis Cluster spec. */
int tccd_redis_slot(const char *key, size_t len);
/* 1 when a node answers (single: the server; cluster: any node). */
int tccd_redis_connected(const tccd_redis *rc);
/* 1 when commands may be sent (a connection is up or being made). */
int tccd_redis_usable(const tccd_redis *rc);
/* "host:port[,host:port...]/db" (the seeds), never the password. */
const char *tccd_redis_display(const tccd_redis *rc);
void tccd_redis_info(const tccd_redis *rc, tccd_redis_stats *out);
/* Drops every connection (pending commands get fn(arg, NULL)) and frees
 * the layer once its timer has closed. */
void tccd_redis_close(tccd_redis *rc);

/* ------------------------------------------------------------- util */

static inline double tccd_ms_since(uint64_t start_ns) {
  return (double)(uv_hrtime() - start_ns) / 1e6;
}

#endif
