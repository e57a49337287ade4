/*
 * fake_libcuda.c — a stand-in for libcuda.so.1 (the Driver API subset of
 * runtime/cuda_driver.h) that runs on any machine, so the loader's logic
 * is tested where there is no GPU: which context is current, what is
 * loaded from cubin or PTX, every launch's kernel, grid, block, shared
 * bytes, stream and parameter values, stream capture, graph instantiation,
 * replay and destruction. Device memory is host memory.
 *
 * It writes one line per event into a log the test reads with
 * fake_cuda_events() (and empties with fake_cuda_reset()):
 *   retain D | push | pop | load cubin | load ptx | unload | set_attr NAME A V
 *   launch NAME g=X,Y,Z b=X,Y,Z s=N stream=S p=P1,P2,...
 *   capture S | end S | instantiate G (N nodes) | replay G S | destroy G
 * Replaying a graph logs its launches again as "  NAME ... p=...".
 * fake_libcublas.c logs its calls into the same log (fake_cuda_log).
 *
 * Knobs (environment, read on every query, so a test may change them):
 * TCC_FAKE_CUDA_CC (compute capability as "90"), TCC_FAKE_CUDA_NPARAMS
 * (parameters every kernel has), TCC_FAKE_CUDA_INIT_ERROR (cuInit's result).
 * Kernel names starting with "missing" are not in any module; a launch
 * with grid y > 65535 fails with CUDA_ERROR_INVALID_VALUE.
 *
 * Time (for tccd-bench's event timing): a fake GPU clock that each
 * launch outside a capture advances by its programmed duration;
 * cuEventRecord stamps an event with it, cuEventElapsedTime subtracts.
 * TCC_FAKE_CUDA_LAUNCH_US="RULE=US,..." programs durations in microseconds,
 * the first matching rule wins: RULE is a kernel name or "*", optionally
 * with "@b<threads per block>" ("k0@b512=5,k0=40,*=10"); unmatched
 * launches take 10 us. TCC_FAKE_CUDA_LAUNCH_FAIL="RULE,..." (same RULEs)
 * makes those launches fail with CUDA_ERROR_INVALID_VALUE. Neither logs.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;
static int ctx_token;                           /* the one primary context */
static _Thread_local void *stack[16];
static _Thread_local int depth;

static void event(const char *fmt, ...) {
  pthread_mutex_lock(&mu);
  va_list ap;
  va_start(ap, fmt);
  if (log_len < sizeof log_buf) log_len += (size_t)vsnprintf(log_buf + log_len, sizeof log_buf - log_len, fmt, ap);
  va_end(ap);
  if (log_len < sizeof log_buf - 1) log_buf[log_len++] = '\n', log_buf[log_len] = '\0';
  if (log_len > sizeof log_buf - 1) log_len = sizeof log_buf - 1;
  pthread_mutex_unlock(&mu);
}

EXPORT const char *fake_cuda_events(void) { return log_buf; }
/* fake_libcublas.c logs into the same log, so tests see one order. */
EXPORT void fake_cuda_log(const char *line) { event("%s", line); }
EXPORT void fake_cuda_reset(void) {
  pthread_mutex_lock(&mu);
  log_len = 0;
  log_buf[0] = '\0';
  pthread_mutex_unlock(&mu);
}
EXPORT int fake_cuda_depth(void) { return depth; }

/* ------------------------------------------------------------ handles */

typedef struct fn { char name[128]; } fn;
static fn fns[512];                             /* function handles, never freed */
static int n_fns;
typedef struct launch_rec {
  char line[512];
} launch_rec;
typedef struct graph {
  int id;
  launch_rec recs[16];
  int n;
} graph;
typedef struct stream { int id; graph *capturing; } stream;

static int next_id = 1;

static int knob(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && *e ? atoi(e) : dflt;
}

EXPORT tcu_result cuInit(unsigned flags) {
  (void)flags;
  return knob("TCC_FAKE_CUDA_INIT_ERROR", TCU_SUCCESS);
}
EXPORT tcu_result cuDriverGetVersion(int *v) { *v = 13000; return 0; }
EXPORT tcu_result cuGetErrorName(tcu_result r, const char **s) {
  *s = r == 1 ? "CUDA_ERROR_INVALID_VALUE" : r == 100 ? "CUDA_ERROR_NO_DEVICE" : r == 500 ? "CUDA_ERROR_NOT_FOUND"
     : "CUDA_ERROR_UNKNOWN";
  return 0;
}
EXPORT tcu_result cuGetErrorString(tcu_result r, const char **s) {
  *s = r == 1 ? "invalid argument" : r == 100 ? "no CUDA-capable device is detected" : r == 500 ? "named symbol not found"
     : "unknown error";
  return 0;
}
EXPORT tcu_result cuDeviceGetCount(int *n) { *n = 1; return 0; }
EXPORT tcu_result cuDeviceGet(tcu_device *d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 1; }
EXPORT tcu_result cuDeviceGetAttribute(int *v, int attr, tcu_device d) {
  (void)d;
  int cc = knob("TCC_FAKE_CUDA_CC", 90);
  switch (attr) {
  case TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = cc / 10; return 0;
  case TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = cc % 10; return 0;
  case TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; return 0;
  default: *v = 1024; return 0;
  }
}
EXPORT tcu_result cuDeviceGetName(char *name, int len, tcu_device d) { snprintf(name, (size_t)len, "Fake GPU %d", d); return 0; }
EXPORT tcu_result cuDevicePrimaryCtxRetain(tcu_context *ctx, tcu_device d) {
  event("retain %d", d);
  *ctx = &ctx_token;
  return 0;
}
EXPORT tcu_result cuCtxGetCurrent(tcu_context *ctx) { *ctx = depth ? stack[depth - 1] : NULL; return 0; }
EXPORT tcu_result cuCtxPushCurrent_v2(tcu_context ctx) {
  if (depth == 16) return 1;
  stack[depth++] = ctx;
  event("push");
  return 0;
}
EXPORT tcu_result cuCtxPopCurrent_v2(tcu_context *ctx) {
  if (!depth) return 1;
  *ctx = stack[--depth];
  event("pop");
  return 0;
}
EXPORT tcu_result cuCtxGetDevice(tcu_device *d) { *d = 0; return depth ? 0 : 201; }
EXPORT tcu_result cuCtxSynchronize(void) { return depth ? 0 : 201; }

EXPORT tcu_result cuModuleLoadData(tcu_module *m, const void *image) {
  if (!depth) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  event("load cubin");
  *m = (void *)image;
  return 0;
}
EXPORT tcu_result cuModuleLoadDataEx(tcu_module *m, const void *image, unsigned n, int *opts, void **vals) {
  (void)n, (void)opts, (void)vals;
  if (!depth) return 201;
  event("load ptx");
  *m = (void *)image;
  return 0;
}
EXPORT tcu_result cuModuleUnload(tcu_module m) { (void)m; event("unload%s", depth ? "" : " (no context!)"); return 0; }
EXPORT tcu_result cuModuleGetFunction(tcu_function *f, tcu_module m, const char *name) {
  (void)m;
  if (!strncmp(name, "missing", 7)) return 500;
  pthread_mutex_lock(&mu);
  fn *x = n_fns < 512 ? &fns[n_fns++] : &fns[511];
  pthread_mutex_unlock(&mu);
  snprintf(x->name, sizeof x->name, "%s", name);
  *f = x;
  return 0;
}
/* Globals of a module: "b<N>_data" exists (address 0x7000 + N * 0x100);
 * anything else is CUDA_ERROR_NOT_FOUND. */
EXPORT tcu_result cuModuleGetGlobal_v2(tcu_deviceptr *p, size_t *bytes, tcu_module m, const char *name) {
  (void)m;
  int n;
  char tail[8];
  if (sscanf(name, "b%d_dat%1s", &n, tail) != 2 || strcmp(tail, "a")) return 500;
  *p = 0x7000 + (tcu_deviceptr)n * 0x100;
  if (bytes) *bytes = 256;
  event("global %s", name);
  return 0;
}
EXPORT tcu_result cuFuncGetAttribute(int *v, int attr, tcu_function f) {
  (void)f;
  *v = attr == TCU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
  return 0;
}
EXPORT tcu_result cuFuncSetAttribute(tcu_function f, int attr, int v) {
  event("set_attr %s %d %d", ((fn *)f)->name, attr, v);
  return 0;
}
EXPORT tcu_result cuFuncGetParamInfo(tcu_function f, size_t i, size_t *off, size_t *size) {
  (void)f;
  if ((int)i >= knob("TCC_FAKE_CUDA_NPARAMS", 4)) return TCU_ERROR_INVALID_VALUE;
  *off = i * 8, *size = 8;
  return 0;
}

/* ------------------------------------------------------------ time */

static double gpu_clock_us;                     /* behind mu */

/* Does RULE (text up to '=' / ',' / end) match kernel name with block
 * threads? */
static int rule_matches(const char *rule, size_t len, const char *name, unsigned threads) {
  const char *at = memchr(rule, '@', len);
  size_t nlen = at ? (size_t)(at - rule) : len;
  if (!(nlen == 1 && rule[0] == '*') && !(strlen(name) == nlen && strncmp(rule, name, nlen) == 0)) return 0;
  return !at || (at[1] == 'b' && (unsigned)atoi(at + 2) == threads);
}

/* The first rule of env var `var` matching the launch: its "=value" (or
 * "" without one), else NULL. */
static const char *launch_rule(const char *var, const char *name, unsigned threads) {
  const char *v = getenv(var);
  for (const char *p = v; p && *p;) {
    size_t n = strcspn(p, ",");
    size_t rlen = strcspn(p, "=,");
    if (rlen > n) rlen = n;
    if (rule_matches(p, rlen, name, threads)) return p[rlen] == '=' ? p + rlen + 1 : "";
    p += n + (p[n] == ',');
  }
  return NULL;
}

typedef struct fake_event { double t_us; } fake_event;

EXPORT tcu_result cuEventCreate(tcu_event *e, unsigned flags) {
  (void)flags;
  *e = calloc(1, sizeof(fake_event));
  return *e ? 0 : 2;
}
EXPORT tcu_result cuEventRecord(tcu_event e, tcu_stream s) {
  (void)s;
  if (!depth) return 201;
  pthread_mutex_lock(&mu);
  ((fake_event *)e)->t_us = gpu_clock_us;
  pthread_mutex_unlock(&mu);
  return 0;
}
EXPORT tcu_result cuEventSynchronize(tcu_event e) { return e ? 0 : TCU_ERROR_INVALID_VALUE; }
EXPORT tcu_result cuEventElapsedTime(float *ms, tcu_event a, tcu_event b) {
  *ms = (float)((((fake_event *)b)->t_us - ((fake_event *)a)->t_us) / 1000.0);
  return 0;
}
EXPORT tcu_result cuEventDestroy_v2(tcu_event e) { free(e); return 0; }

EXPORT tcu_result cuLaunchKernel(tcu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, tcu_stream s, void **params, void **extra) {
  (void)extra;
  if (!depth) return 201;
  if (gy > 65535) return TCU_ERROR_INVALID_VALUE;
  const char *kname = ((fn *)f)->name;
  if (launch_rule("TCC_FAKE_CUDA_LAUNCH_FAIL", kname, bx * by * bz)) return TCU_ERROR_INVALID_VALUE;
  if (!(s && ((stream *)s)->capturing)) {
    const char *us = launch_rule("TCC_FAKE_CUDA_LAUNCH_US", kname, bx * by * bz);
    pthread_mutex_lock(&mu);
    gpu_clock_us += us && *us ? atof(us) : 10.0;
    pthread_mutex_unlock(&mu);
  }
  stream *st = s;
  char line[512];
  int n = snprintf(line, sizeof line, "%s g=%u,%u,%u b=%u,%u,%u s=%u stream=%d p=", ((fn *)f)->name, gx, gy, gz, bx,
                   by, bz, shared, st ? st->id : 0);
  int nparams = knob("TCC_FAKE_CUDA_NPARAMS", 4);
  for (int i = 0; i < nparams && n < (int)sizeof line - 24; i++)
    n += snprintf(line + n, sizeof line - (size_t)n, "%s%llx", i ? "," : "", *(unsigned long long *)params[i]);
  if (st && st->capturing) {
    graph *g = st->capturing;
    if (g->n < 16) snprintf(g->recs[g->n++].line, sizeof g->recs[0].line, "%s", line);
  } else {
    event("launch %s", line);
  }
  return 0;
}

EXPORT tcu_result cuStreamCreate(tcu_stream *s, unsigned flags) {
  (void)flags;
  stream *st = calloc(1, sizeof *st);
  pthread_mutex_lock(&mu);
  st->id = next_id++;
  pthread_mutex_unlock(&mu);
  *s = st;
  return 0;
}
EXPORT tcu_result cuStreamDestroy_v2(tcu_stream s) { free(s); return 0; }
EXPORT tcu_result cuStreamSynchronize(tcu_stream s) { (void)s; return 0; }
EXPORT tcu_result cuStreamIsCapturing(tcu_stream s, int *status) {
  *status = s && ((stream *)s)->capturing ? 1 : 0;
  return 0;
}
EXPORT tcu_result cuStreamBeginCapture_v2(tcu_stream s, int mode) {
  stream *st = s;
  if (!st || st->capturing || mode != TCU_STREAM_CAPTURE_MODE_THREAD_LOCAL) return TCU_ERROR_INVALID_VALUE;
  st->capturing = calloc(1, sizeof *st->capturing);
  pthread_mutex_lock(&mu);
  st->capturing->id = next_id++;
  pthread_mutex_unlock(&mu);
  event("capture %d", st->id);
  return 0;
}
EXPORT tcu_result cuStreamEndCapture(tcu_stream s, tcu_graph *g) {
  stream *st = s;
  if (!st->capturing) return TCU_ERROR_INVALID_VALUE;
  *g = st->capturing;
  st->capturing = NULL;
  event("end %d", st->id);
  return 0;
}
EXPORT tcu_result cuGraphInstantiateWithFlags(tcu_graph_exec *e, tcu_graph g, unsigned long long flags) {
  (void)flags;
  graph *x = malloc(sizeof *x);
  memcpy(x, g, sizeof *x);
  pthread_mutex_lock(&mu);
  x->id = next_id++;
  pthread_mutex_unlock(&mu);
  event("instantiate %d (%d nodes)", x->id, x->n);
  *e = x;
  return 0;
}
EXPORT tcu_result cuGraphLaunch(tcu_graph_exec e, tcu_stream s) {
  graph *x = e;
  event("replay %d %d", x->id, s ? ((stream *)s)->id : 0);
  for (int i = 0; i < x->n; i++) event("  %s", x->recs[i].line);
  return 0;
}
EXPORT tcu_result cuGraphExecDestroy(tcu_graph_exec e) {
  event("destroy %d", ((graph *)e)->id);
  free(e);
  return 0;
}
EXPORT tcu_result cuGraphDestroy(tcu_graph g) { free(g); return 0; }

EXPORT tcu_result cuMemAlloc_v2(tcu_deviceptr *p, size_t bytes) {
  void *m = malloc(bytes ? bytes : 1);
  if (!m) return 2;
  *p = (tcu_deviceptr)(uintptr_t)m;
  return 0;
}
EXPORT tcu_result cuMemFree_v2(tcu_deviceptr p) { free((void *)(uintptr_t)p); return 0; }
EXPORT tcu_result cuMemcpyHtoD_v2(tcu_deviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
EXPORT tcu_result cuMemcpyDtoH_v2(void *d, tcu_deviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
EXPORT tcu_result cuMemcpyDtoD_v2(tcu_deviceptr d, tcu_deviceptr s, size_t n) { memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return 0; }
