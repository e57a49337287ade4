/*
 * fake_libcublas.c — a stand-in for libcublas.so (the calls
 * runtime/cuda_blas.c makes) that records every call into fake_libcuda's
 * event log, so a test sees cuBLAS steps and kernel launches in one
 * order:
 *   cublas create H | cublas destroy H | cublas stream H S
 *   cublas gemm TA TB m=.. n=.. k=.. lda=.. ldb=.. ldc=.. sa=.. sb=.. sc=..
 *     batch=.. types=A,B,C compute=C alpha=.. beta=.. A=ptr B=ptr C=ptr stream=S
 * (math mode is logged as "cublas math H M"). Inside a stream capture the
 * gemm line is recorded into the graph like a launch would be: here it
 * is logged as "cublas gemm (captured) ...". Knob: TCC_FAKE_CUBLAS_FAIL=1
 * makes every gemm return CUBLAS_STATUS_EXECUTION_FAILED (13).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

#define EXPORT __attribute__((visibility("default")))

void fake_cuda_log(const char *line);                                 /* fake_libcuda.c */
tcu_result cuStreamIsCapturing(tcu_stream s, int *status);            /* fake_libcuda.c */

typedef struct handle { int id; void *stream; } handle;
typedef struct stream_id { int id; } stream_id;   /* fake_libcuda's stream starts with its id */
static int next_handle = 1;

static int sid(void *s) { return s ? ((stream_id *)s)->id : 0; }

EXPORT int cublasCreate_v2(void **h) {
  handle *x = calloc(1, sizeof *x);
  x->id = next_handle++;
  *h = x;
  char line[64];
  snprintf(line, sizeof line, "cublas create %d", x->id);
  fake_cuda_log(line);
  return 0;
}
EXPORT int cublasDestroy_v2(void *h) {
  char line[64];
  snprintf(line, sizeof line, "cublas destroy %d", ((handle *)h)->id);
  fake_cuda_log(line);
  free(h);
  return 0;
}
EXPORT int cublasSetStream_v2(void *h, void *s) {
  ((handle *)h)->stream = s;
  return 0;
}
EXPORT int cublasSetMathMode(void *h, int mode) {
  char line[64];
  snprintf(line, sizeof line, "cublas math %d %d", ((handle *)h)->id, mode);
  fake_cuda_log(line);
  return 0;
}
EXPORT const char *cublasGetStatusName(int s) {
  return s == 13 ? "CUBLAS_STATUS_EXECUTION_FAILED" : s == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_?";
}
EXPORT int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
                                      int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
                                      const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute,
                                      int algo) {
  handle *x = h;
  double al, be;
  if (compute == 70) al = *(const double *)alpha, be = *(const double *)beta;
  else al = *(const float *)alpha, be = *(const float *)beta;
  int status = 0;
  cuStreamIsCapturing(x->stream, &status);
  char line[512];
  snprintf(line, sizeof line,
           "cublas gemm%s %c%c m=%d n=%d k=%d lda=%d ldb=%d ldc=%d sa=%lld sb=%lld sc=%lld batch=%d types=%d,%d,%d "
           "compute=%d algo=%d alpha=%g beta=%g A=%llx B=%llx C=%llx stream=%d",
           status ? " (captured)" : "", ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, lda, ldb, ldc, sa, sb, sc, batch, at,
           bt, ct, compute, algo, al, be, (unsigned long long)(uintptr_t)A, (unsigned long long)(uintptr_t)B,
           (unsigned long long)(uintptr_t)C, sid(x->stream));
  fake_cuda_log(line);
  const char *fail = getenv("TCC_FAKE_CUBLAS_FAIL");
  return fail && *fail == '1' ? 13 : 0;
}
