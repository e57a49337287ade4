/*
 * cuda_blas.c — cuBLAS loaded at run time for the extern (GEMM) steps of
 * a CUDA launch plan. See cuda_blas.h; the step's fields are cuBLAS's own
 * (tcc.v1.GemmStep), so a call is a translation of enums:
 *
 *   tcc.v1.DType      cudaDataType        compute            cublasComputeType_t + math mode
 *   FLOAT32  1        CUDA_R_32F   0      32F                CUBLAS_COMPUTE_32F 68, DEFAULT_MATH (no TF32)
 *   FLOAT64  2        CUDA_R_64F   1      32F_FAST_TF32      CUBLAS_COMPUTE_32F_FAST_TF32 77, TF32_TENSOR_OP_MATH
 *   FLOAT16  3        CUDA_R_16F   2      64F                CUBLAS_COMPUTE_64F 70, DEFAULT_MATH
 *   BFLOAT16 4        CUDA_R_16BF 14
 *
 * alpha and beta are float for the 32F compute types, double for 64F.
 * The constants are cuBLAS 12/13's (cublas_api.h, library_types.h); they
 * are part of cuBLAS's ABI and have not changed since CUDA 11.
 */
#include "cuda_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *tcb_handle;
typedef int tcb_status;
enum { TCB_OP_N = 0, TCB_OP_T = 1 };
enum { TCB_R_32F = 0, TCB_R_64F = 1, TCB_R_16F = 2, TCB_R_16BF = 14 };
enum { TCB_COMPUTE_32F = 68, TCB_COMPUTE_32F_FAST_TF32 = 77, TCB_COMPUTE_64F = 70 };
enum { TCB_DEFAULT_MATH = 0, TCB_TF32_TENSOR_OP_MATH = 3 };
enum { TCB_GEMM_DEFAULT = -1 };

/* X(symbol, return, parameters): required ones. */
#define TCB_FUNCTIONS(X)                                                                              \
  X(cublasCreate_v2, tcb_status, (tcb_handle * h))                                                  \
  X(cublasDestroy_v2, tcb_status, (tcb_handle h))                                                   \
  X(cublasSetStream_v2, tcb_status, (tcb_handle h, void *stream))                                   \
  X(cublasSetMathMode, tcb_status, (tcb_handle h, int mode))                                        \
  X(cublasGemmStridedBatchedEx, tcb_status,                                                         \
    (tcb_handle h, int transa, int transb, int m, int n, int k, const void *alpha, const void *A,     \
     int atype, int lda, long long stride_a, const void *B, int btype, int ldb, long long stride_b,   \
     const void *beta, void *C, int ctype, int ldc, long long stride_c, int batch, int compute, int algo))
#define TCB_OPTIONAL(X) X(cublasGetStatusName, const char *, (tcb_status s))

static struct {
  int ok;
  char why[600];
  void *lib;
#define TCB_FIELD(name, ret, params) ret(*name) params;
  TCB_FUNCTIONS(TCB_FIELD)
  TCB_OPTIONAL(TCB_FIELD)
#undef TCB_FIELD
} blas;

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

struct tcc_rt_cublas {
  tcb_handle h;
  pthread_mutex_t mu;   /* SetStream + Gemm as one */
};

static void blas_load(void) {
  const char *env = getenv("TCC_CUBLAS_LIBRARY");
  const char *tried[3] = {NULL, NULL, NULL};
  int n = 0;
  if (env && *env) tried[n++] = env;
  else tried[n++] = "libcublas.so.13", tried[n++] = "libcublas.so.12";
  const char *e = NULL;
  for (int i = 0; i < n && !blas.lib; i++) {
    blas.lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!blas.lib) e = dlerror();
  }
  if (!blas.lib) {
    snprintf(blas.why, sizeof blas.why,
             "%s not found: the plan has a matmul (cuBLAS) step; install cuBLAS (e.g. the nvidia-cublas wheel) or "
             "set TCC_CUBLAS_LIBRARY (%s)",
             tried[0], e ? e : "dlopen failed");
    return;
  }
  void *sym;
#define TCB_RESOLVE(name, ret, params)                                                              \
  if (!(sym = dlsym(blas.lib, #name))) {                                                            \
    snprintf(blas.why, sizeof blas.why, "%s has no symbol %s: cuBLAS 12 or newer is needed", tried[0], #name); \
    return;                                                                                         \
  }                                                                                                 \
  memcpy(&blas.name, &sym, sizeof sym);
  TCB_FUNCTIONS(TCB_RESOLVE)
#undef TCB_RESOLVE
#define TCB_RESOLVE_OPTIONAL(name, ret, params) \
  if ((sym = dlsym(blas.lib, #name))) memcpy(&blas.name, &sym, sizeof sym);
  TCB_OPTIONAL(TCB_RESOLVE_OPTIONAL)
#undef TCB_RESOLVE_OPTIONAL
  blas.ok = 1;
}

int tcc_rt_cublas_available(tcc_error *err) {
  pthread_once(&blas_once, blas_load);
  if (blas.ok) return 0;
  return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s", blas.why);
}

/* "CUBLAS_STATUS_NOT_SUPPORTED (15)" */
static void status_text(tcb_status s, char *buf, size_t cap) {
  const char *name = blas.cublasGetStatusName ? blas.cublasGetStatusName(s) : NULL;
  snprintf(buf, cap, "%s (%d)", name ? name : "cublasStatus", s);
}

int tcc_rt_cublas_create(tcc_rt_cublas **out, tcc_error *err) {
  *out = NULL;
  int rc = tcc_rt_cublas_available(err);
  if (rc) return rc;
  tcc_rt_cublas *c = calloc(1, sizeof *c);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  tcb_status s = blas.cublasCreate_v2(&c->h);
  if (s != 0) {
    char t[96];
    status_text(s, t, sizeof t);
    free(c);
    return tcc_error_set(err, TCC_E_INTERNAL, "cublasCreate: %s", t);
  }
  pthread_mutex_init(&c->mu, NULL);
  *out = c;
  return 0;
}

static int data_type(int dtype) {
  switch (dtype) {
  case 1: return TCB_R_32F;
  case 2: return TCB_R_64F;
  case 3: return TCB_R_16F;
  case 4: return TCB_R_16BF;
  default: return -1;
  }
}

int tcc_rt_cublas_gemm(tcc_rt_cublas *h, void *stream, const tcc_rt_cuda_gemm_step *g, const void *a, const void *b, void *c,
                       const char *name, size_t i, size_t n, tcc_error *err) {
  int at = data_type(g->a_dtype), bt = data_type(g->b_dtype), ct = data_type(g->c_dtype);
  if (at < 0 || bt < 0 || ct < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s': a dtype cuBLAS is not called with here",
                         name);
  int compute, math = TCB_DEFAULT_MATH;
  float af = (float)g->alpha, bf = (float)g->beta;
  double ad = g->alpha, bd = g->beta;
  const void *alpha = &af, *beta = &bf;
  switch (g->compute) {
  case TCC_RT_CUDA_COMPUTE_32F: compute = TCB_COMPUTE_32F; break;
  case TCC_RT_CUDA_COMPUTE_32F_FAST_TF32: compute = TCB_COMPUTE_32F_FAST_TF32, math = TCB_TF32_TENSOR_OP_MATH; break;
  case TCC_RT_CUDA_COMPUTE_64F: compute = TCB_COMPUTE_64F, alpha = &ad, beta = &bd; break;
  default: return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s': unknown compute type", name);
  }
  if (g->m == 0 || g->n == 0 || g->batch_count == 0) return 0;
  pthread_mutex_lock(&h->mu);
  tcb_status s = blas.cublasSetStream_v2(h->h, stream);
  const char *what = "cublasSetStream";
  if (s == 0) s = blas.cublasSetMathMode(h->h, math), what = "cublasSetMathMode";
  if (s == 0)
    s = blas.cublasGemmStridedBatchedEx(h->h, g->trans_a ? TCB_OP_T : TCB_OP_N, g->trans_b ? TCB_OP_T : TCB_OP_N,
                                        (int)g->m, (int)g->n, (int)g->k, alpha, a, at, (int)g->lda, g->stride_a, b, bt,
                                        (int)g->ldb, g->stride_b, beta, c, ct, (int)g->ldc, g->stride_c,
                                        (int)g->batch_count, compute, TCB_GEMM_DEFAULT),
    what = "cublasGemmStridedBatchedEx";
  pthread_mutex_unlock(&h->mu);
  if (s == 0) return 0;
  char t[96];
  status_text(s, t, sizeof t);
  return tcc_error_set(err, TCC_E_INTERNAL, "step '%.100s' (launch %zu of %zu): %s: %s", name, i + 1, n, what, t);
}

void tcc_rt_cublas_destroy(tcc_rt_cublas *h) {
  if (!h) return;
  blas.cublasDestroy_v2(h->h);
  pthread_mutex_destroy(&h->mu);
  free(h);
}
