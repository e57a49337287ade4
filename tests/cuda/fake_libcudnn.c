/*
 * fake_libcudnn.c — a stand-in for libcudnn.so (the legacy convolution
 * calls runtime/cuda_dnn.c makes) that records into fake_libcuda's event
 * log, so a test sees cuDNN steps, cuBLAS steps and kernel launches in
 * one order:
 *   cudnn create H | cudnn destroy H
 *   cudnn tensor D dtype=T dims=a,b,c,d strides=... | cudnn filter D dtype=T format=F dims=...
 *   cudnn conv D pad=.. stride=.. dil=.. mode=M compute=T | cudnn groups D G | cudnn math D M
 *   cudnn algos fwd|bwd-data|bwd-filter
 *   cudnn fwd|bwd-data|bwd-filter algo=A x=ptr w=ptr y=ptr ws=ptr ws_bytes=N alpha=1 beta=0 stream=S
 * (" (captured)" after the call's name inside a stream capture). The
 * heuristics return three algorithms: algorithm 0 NOT_SUPPORTED, then
 * algorithm 1 (math type 1), which needs TCC_FAKE_CUDNN_WS bytes of
 * workspace (default 4096), then algorithm 2, which needs none. Knob: TCC_FAKE_CUDNN_FAIL=1 makes every
 * convolution call return CUDNN_STATUS_EXECUTION_FAILED (8).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

#define EXPORT __attribute__((visibility("default")))

void fake_cuda_log(const char *line);                                 /* fake_libcuda.c */
tcu_result cuStreamIsCapturing(tcu_stream s, int *status);            /* fake_libcuda.c */

typedef struct handle { int id; void *stream; } handle;
typedef struct desc { int id; } desc;
typedef struct stream_id { int id; } stream_id;
typedef struct perf {
  int algo, status;
  float time;
  size_t memory;
  int determinism, math_type, reserved[3];
} perf;

static int next_id = 1;

static int sid(void *s) { return s ? ((stream_id *)s)->id : 0; }

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fake_cuda_log(line);
}

static void ints(char *buf, size_t cap, const int *v, int n) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", v[i]);
}

static size_t workspace(void) {
  const char *w = getenv("TCC_FAKE_CUDNN_WS");
  return w ? (size_t)strtoull(w, NULL, 10) : 4096;
}

static int conv_status(void) {
  const char *fail = getenv("TCC_FAKE_CUDNN_FAIL");
  return fail && *fail == '1' ? 8 : 0;
}

EXPORT int cudnnCreate(void **h) {
  handle *x = calloc(1, sizeof *x);
  x->id = next_id++;
  *h = x;
  logf_("cudnn create %d", x->id);
  return 0;
}
EXPORT int cudnnDestroy(void *h) {
  logf_("cudnn destroy %d", ((handle *)h)->id);
  free(h);
  return 0;
}
EXPORT int cudnnSetStream(void *h, void *s) {
  ((handle *)h)->stream = s;
  return 0;
}
EXPORT const char *cudnnGetErrorString(int s) {
  return s == 8 ? "CUDNN_STATUS_EXECUTION_FAILED" : s == 0 ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_?";
}

static int create(void **d) {
  desc *x = calloc(1, sizeof *x);
  x->id = next_id++;
  *d = x;
  return 0;
}
static int destroy(void *d) {
  free(d);
  return 0;
}
EXPORT int cudnnCreateTensorDescriptor(void **d) { return create(d); }
EXPORT int cudnnDestroyTensorDescriptor(void *d) { return destroy(d); }
EXPORT int cudnnCreateFilterDescriptor(void **d) { return create(d); }
EXPORT int cudnnDestroyFilterDescriptor(void *d) { return destroy(d); }
EXPORT int cudnnCreateConvolutionDescriptor(void **d) { return create(d); }
EXPORT int cudnnDestroyConvolutionDescriptor(void *d) { return destroy(d); }

EXPORT int cudnnSetTensorNdDescriptor(void *d, int dtype, int nb, const int *dims, const int *strides) {
  char a[96], b[96];
  ints(a, sizeof a, dims, nb);
  ints(b, sizeof b, strides, nb);
  logf_("cudnn tensor %d dtype=%d dims=%s strides=%s", ((desc *)d)->id, dtype, a, b);
  return 0;
}
EXPORT int cudnnSetFilterNdDescriptor(void *d, int dtype, int format, int nb, const int *dims) {
  char a[96];
  ints(a, sizeof a, dims, nb);
  logf_("cudnn filter %d dtype=%d format=%d dims=%s", ((desc *)d)->id, dtype, format, a);
  return 0;
}
EXPORT int cudnnSetConvolutionNdDescriptor(void *d, int n, const int *pad, const int *stride, const int *dil, int mode,
                                           int compute) {
  char a[64], b[64], c[64];
  ints(a, sizeof a, pad, n);
  ints(b, sizeof b, stride, n);
  ints(c, sizeof c, dil, n);
  logf_("cudnn conv %d pad=%s stride=%s dil=%s mode=%d compute=%d", ((desc *)d)->id, a, b, c, mode, compute);
  return 0;
}
EXPORT int cudnnSetConvolutionGroupCount(void *d, int g) {
  logf_("cudnn groups %d %d", ((desc *)d)->id, g);
  return 0;
}
EXPORT int cudnnSetConvolutionMathType(void *d, int m) {
  logf_("cudnn math %d %d", ((desc *)d)->id, m);
  return 0;
}

static int algos(const char *what, int req, int *ret, perf *p) {
  logf_("cudnn algos %s", what);
  if (req < 3) return 3;   /* CUDNN_STATUS_BAD_PARAM */
  memset(p, 0, 3 * sizeof *p);
  p[0] = (perf){.algo = 0, .status = 3000, .memory = 0};
  p[1] = (perf){.algo = 1, .status = 0, .memory = workspace(), .math_type = 1};
  p[2] = (perf){.algo = 2, .status = 0, .memory = 0, .math_type = 1};
  *ret = 3;
  return 0;
}
EXPORT int cudnnGetConvolutionForwardAlgorithm_v7(void *h, void *x, void *w, void *c, void *y, int req, int *ret,
                                                  perf *p) {
  (void)h, (void)x, (void)w, (void)c, (void)y;
  return algos("fwd", req, ret, p);
}
EXPORT int cudnnGetConvolutionBackwardDataAlgorithm_v7(void *h, void *w, void *dy, void *c, void *dx, int req, int *ret,
                                                       perf *p) {
  (void)h, (void)w, (void)dy, (void)c, (void)dx;
  return algos("bwd-data", req, ret, p);
}
EXPORT int cudnnGetConvolutionBackwardFilterAlgorithm_v7(void *h, void *x, void *dy, void *c, void *dw, int req,
                                                         int *ret, perf *p) {
  (void)h, (void)x, (void)dy, (void)c, (void)dw;
  return algos("bwd-filter", req, ret, p);
}
static int ws_size(int algo, size_t *bytes) {
  *bytes = algo == 1 ? workspace() : 0;
  return 0;
}
EXPORT int cudnnGetConvolutionForwardWorkspaceSize(void *h, void *x, void *w, void *c, void *y, int algo, size_t *b) {
  (void)h, (void)x, (void)w, (void)c, (void)y;
  return ws_size(algo, b);
}
EXPORT int cudnnGetConvolutionBackwardDataWorkspaceSize(void *h, void *w, void *dy, void *c, void *dx, int algo,
                                                        size_t *b) {
  (void)h, (void)w, (void)dy, (void)c, (void)dx;
  return ws_size(algo, b);
}
EXPORT int cudnnGetConvolutionBackwardFilterWorkspaceSize(void *h, void *x, void *dy, void *c, void *dw, int algo,
                                                          size_t *b) {
  (void)h, (void)x, (void)dy, (void)c, (void)dw;
  return ws_size(algo, b);
}

static int call(const char *what, void *h, const void *alpha, const void *x, const void *w, const void *y, int algo,
                void *ws, size_t ws_bytes, const void *beta) {
  handle *hh = h;
  int status = 0;
  cuStreamIsCapturing(hh->stream, &status);
  logf_("cudnn %s%s algo=%d x=%llx w=%llx y=%llx ws=%llx ws_bytes=%zu alpha=%g beta=%g stream=%d", what,
        status ? " (captured)" : "", algo, (unsigned long long)(uintptr_t)x, (unsigned long long)(uintptr_t)w,
        (unsigned long long)(uintptr_t)y, (unsigned long long)(uintptr_t)ws, ws_bytes, *(const float *)alpha,
        *(const float *)beta, sid(hh->stream));
  return conv_status();
}
EXPORT int cudnnConvolutionForward(void *h, const void *alpha, void *xd, const void *x, void *wd, const void *w,
                                   void *c, int algo, void *ws, size_t wsb, const void *beta, void *yd, void *y) {
  (void)xd, (void)wd, (void)c, (void)yd;
  return call("fwd", h, alpha, x, w, y, algo, ws, wsb, beta);
}
EXPORT int cudnnConvolutionBackwardData(void *h, const void *alpha, void *wd, const void *w, void *dyd, const void *dy,
                                        void *c, int algo, void *ws, size_t wsb, const void *beta, void *dxd, void *dx) {
  (void)wd, (void)dyd, (void)c, (void)dxd;
  return call("bwd-data", h, alpha, dx, w, dy, algo, ws, wsb, beta);
}
EXPORT int cudnnConvolutionBackwardFilter(void *h, const void *alpha, void *xd, const void *x, void *dyd,
                                          const void *dy, void *c, int algo, void *ws, size_t wsb, const void *beta,
                                          void *dwd, void *dw) {
  (void)xd, (void)dyd, (void)c, (void)dwd;
  return call("bwd-filter", h, alpha, x, dw, dy, algo, ws, wsb, beta);
}
