/*
 * cuda_dnn.c — cuDNN loaded at run time for the convolution steps of a
 * CUDA launch plan. See cuda_dnn.h. A step is cuDNN's legacy
 * convolution API, set up the way PyTorch's Conv_v7 sets it up:
 *
 *   tensors   x, y (dy, dx): cudnnSetTensorNdDescriptor, dense NCHW
 *             strides; filter: cudnnSetFilterNdDescriptor, NCHW format;
 *             a 1-D convolution gets a height of 1 (cuDNN takes 4-D up)
 *   conv      cudnnSetConvolutionNdDescriptor, CROSS_CORRELATION,
 *             compute float (double for double), group count
 *   math      float16/bfloat16 TENSOR_OP; float32 DEFAULT (TF32 allowed)
 *             with tf32, else FMA (no TF32); double DEFAULT; then the
 *             math type of the chosen algorithm's perf record, except
 *             that float32 without tf32 stays FMA
 *   algorithm cudnnGet{Convolution}{Forward,BackwardData,BackwardFilter}
 *             Algorithm_v7's first supported result needing at most 1 GiB
 *             of workspace (else its first supported one), the workspace
 *             from cudnnGet*WorkspaceSize
 *   call      alpha 1, beta 0 (float; double for double)
 *
 * Enum values and the perf record layout are cuDNN 8/9's (cudnn_graph.h,
 * cudnn_cnn.h), part of its ABI: dtype FLOAT 0, DOUBLE 1, HALF 2,
 * BFLOAT16 9; format NCHW 0; mode CROSS_CORRELATION 1; math DEFAULT 0,
 * TENSOR_OP 1, FMA 3.
 */
#include "cuda_dnn.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *tdn_handle;
typedef void *tdn_desc;
typedef int tdn_status;
enum { TDN_FLOAT = 0, TDN_DOUBLE = 1, TDN_HALF = 2, TDN_BFLOAT16 = 9 };
enum { TDN_NCHW = 0 };
enum { TDN_CROSS_CORRELATION = 1 };
enum { TDN_DEFAULT_MATH = 0, TDN_TENSOR_OP_MATH = 1, TDN_FMA_MATH = 3 };
enum { TDN_MAX_ALGOS = 16 };
/* An algorithm needing more workspace than this (cuDNN's FFT ones can
 * ask for gigabytes) is passed over for the next supported one, as
 * PyTorch passes over those whose workspace it cannot allocate. */
#define TDN_WORKSPACE_CAP ((size_t)1 << 30)

/* cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: one layout */
typedef struct tdn_perf {
  int algo;
  tdn_status status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
} tdn_perf;

/* X(symbol, return, parameters) */
#define TDN_FUNCTIONS(X)                                                                                       \
  X(cudnnCreate, tdn_status, (tdn_handle * h))                                                                 \
  X(cudnnDestroy, tdn_status, (tdn_handle h))                                                                  \
  X(cudnnSetStream, tdn_status, (tdn_handle h, void *stream))                                                  \
  X(cudnnCreateTensorDescriptor, tdn_status, (tdn_desc * d))                                                   \
  X(cudnnSetTensorNdDescriptor, tdn_status, (tdn_desc d, int dtype, int nb, const int *dims, const int *strides)) \
  X(cudnnDestroyTensorDescriptor, tdn_status, (tdn_desc d))                                                    \
  X(cudnnCreateFilterDescriptor, tdn_status, (tdn_desc * d))                                                   \
  X(cudnnSetFilterNdDescriptor, tdn_status, (tdn_desc d, int dtype, int format, int nb, const int *dims))      \
  X(cudnnDestroyFilterDescriptor, tdn_status, (tdn_desc d))                                                    \
  X(cudnnCreateConvolutionDescriptor, tdn_status, (tdn_desc * d))                                              \
  X(cudnnSetConvolutionNdDescriptor, tdn_status,                                                               \
    (tdn_desc d, int n, const int *pad, const int *stride, const int *dil, int mode, int compute))              \
  X(cudnnSetConvolutionGroupCount, tdn_status, (tdn_desc d, int groups))                                       \
  X(cudnnSetConvolutionMathType, tdn_status, (tdn_desc d, int math))                                           \
  X(cudnnDestroyConvolutionDescriptor, tdn_status, (tdn_desc d))                                               \
  X(cudnnGetConvolutionForwardAlgorithm_v7, tdn_status,                                                        \
    (tdn_handle h, tdn_desc x, tdn_desc w, tdn_desc c, tdn_desc y, int req, int *ret, tdn_perf *perf))          \
  X(cudnnGetConvolutionForwardWorkspaceSize, tdn_status,                                                       \
    (tdn_handle h, tdn_desc x, tdn_desc w, tdn_desc c, tdn_desc y, int algo, size_t *bytes))                    \
  X(cudnnConvolutionForward, tdn_status,                                                                       \
    (tdn_handle h, const void *alpha, tdn_desc xd, const void *x, tdn_desc wd, const void *w, tdn_desc c,       \
     int algo, void *ws, size_t ws_bytes, const void *beta, tdn_desc yd, void *y))                              \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7, tdn_status,                                                   \
    (tdn_handle h, tdn_desc w, tdn_desc dy, tdn_desc c, tdn_desc dx, int req, int *ret, tdn_perf *perf))        \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize, tdn_status,                                                  \
    (tdn_handle h, tdn_desc w, tdn_desc dy, tdn_desc c, tdn_desc dx, int algo, size_t *bytes))                  \
  X(cudnnConvolutionBackwardData, tdn_status,                                                                  \
    (tdn_handle h, const void *alpha, tdn_desc wd, const void *w, tdn_desc dyd, const void *dy, tdn_desc c,     \
     int algo, void *ws, size_t ws_bytes, const void *beta, tdn_desc dxd, void *dx))                            \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7, tdn_status,                                                 \
    (tdn_handle h, tdn_desc x, tdn_desc dy, tdn_desc c, tdn_desc dw, int req, int *ret, tdn_perf *perf))        \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize, tdn_status,                                                \
    (tdn_handle h, tdn_desc x, tdn_desc dy, tdn_desc c, tdn_desc dw, int algo, size_t *bytes))                  \
  X(cudnnConvolutionBackwardFilter, tdn_status,                                                                \
    (tdn_handle h, const void *alpha, tdn_desc xd, const void *x, tdn_desc dyd, const void *dy, tdn_desc c,     \
     int algo, void *ws, size_t ws_bytes, const void *beta, tdn_desc dwd, void *dw))
#define TDN_OPTIONAL(X) X(cudnnGetErrorString, const char *, (tdn_status s))

static struct {
  int ok;
  char why[600];
  void *lib;
#define TDN_FIELD(name, ret, params) ret(*name) params;
  TDN_FUNCTIONS(TDN_FIELD)
  TDN_OPTIONAL(TDN_FIELD)
#undef TDN_FIELD
} dnn;

static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;

struct tcc_rt_cudnn {
  tdn_handle h;
  pthread_mutex_t mu;   /* SetStream + the call as one */
};

struct tcc_rt_cudnn_conv {
  tcc_rt_cuda_conv_kind kind;
  int dtype;            /* cuDNN's */
  tdn_desc x, y, w, conv;
  int algo;
  size_t workspace;
};

static void dnn_load(void) {
  const char *env = getenv("TCC_CUDNN_LIBRARY");
  const char *tried[3] = {NULL, NULL, NULL};
  int n = 0;
  if (env && *env) tried[n++] = env;
  else tried[n++] = "libcudnn.so.9", tried[n++] = "libcudnn.so.8";
  const char *e = NULL;
  for (int i = 0; i < n && !dnn.lib; i++) {
    dnn.lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!dnn.lib) e = dlerror();
  }
  if (!dnn.lib) {
    snprintf(dnn.why, sizeof dnn.why,
             "%s not found: the plan has a convolution (cuDNN) step; install cuDNN (e.g. the nvidia-cudnn wheel "
             "PyTorch depends on) or set TCC_CUDNN_LIBRARY (%s)",
             tried[0], e ? e : "dlopen failed");
    return;
  }
  void *sym;
#define TDN_RESOLVE(name, ret, params)                                                                  \
  if (!(sym = dlsym(dnn.lib, #name))) {                                                                 \
    snprintf(dnn.why, sizeof dnn.why, "%s has no symbol %s: cuDNN 8 or 9 is needed", tried[0], #name); \
    return;                                                                                             \
  }                                                                                                     \
  memcpy(&dnn.name, &sym, sizeof sym);
  TDN_FUNCTIONS(TDN_RESOLVE)
#undef TDN_RESOLVE
#define TDN_RESOLVE_OPTIONAL(name, ret, params) \
  if ((sym = dlsym(dnn.lib, #name))) memcpy(&dnn.name, &sym, sizeof sym);
  TDN_OPTIONAL(TDN_RESOLVE_OPTIONAL)
#undef TDN_RESOLVE_OPTIONAL
  dnn.ok = 1;
}

int tcc_rt_cudnn_available(tcc_error *err) {
  pthread_once(&dnn_once, dnn_load);
  if (dnn.ok) return 0;
  return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s", dnn.why);
}

/* "CUDNN_STATUS_NOT_SUPPORTED (3000)" */
static void status_text(tdn_status s, char *buf, size_t cap) {
  const char *name = dnn.cudnnGetErrorString ? dnn.cudnnGetErrorString(s) : NULL;
  snprintf(buf, cap, "%s (%d)", name ? name : "cudnnStatus", s);
}

static int dnn_fail(tcc_error *err, tdn_status s, const char *name, const char *what) {
  char t[96];
  status_text(s, t, sizeof t);
  return tcc_error_set(err, TCC_E_INTERNAL, "step '%.100s': %s: %s", name, what, t);
}

int tcc_rt_cudnn_create(tcc_rt_cudnn **out, tcc_error *err) {
  *out = NULL;
  int rc = tcc_rt_cudnn_available(err);
  if (rc) return rc;
  tcc_rt_cudnn *c = calloc(1, sizeof *c);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  tdn_status s = dnn.cudnnCreate(&c->h);
  if (s != 0) {
    free(c);
    return dnn_fail(err, s, "", "cudnnCreate");
  }
  pthread_mutex_init(&c->mu, NULL);
  *out = c;
  return 0;
}

static int dnn_dtype(int dtype) {
  switch (dtype) {
  case 1: return TDN_FLOAT;
  case 2: return TDN_DOUBLE;
  case 3: return TDN_HALF;
  case 4: return TDN_BFLOAT16;
  default: return -1;
  }
}

void tcc_rt_cudnn_conv_free(tcc_rt_cudnn_conv *c) {
  if (!c) return;
  if (c->x) dnn.cudnnDestroyTensorDescriptor(c->x);
  if (c->y) dnn.cudnnDestroyTensorDescriptor(c->y);
  if (c->w) dnn.cudnnDestroyFilterDescriptor(c->w);
  if (c->conv) dnn.cudnnDestroyConvolutionDescriptor(c->conv);
  free(c);
}

/* Dense NCHW strides of dims[0..nb). */
static void dense_strides(const int *dims, int nb, int *strides) {
  int64_t s = 1;
  for (int d = nb - 1; d >= 0; d--) {
    strides[d] = (int)s;
    s *= dims[d];
  }
}

/* Is every value of the step a size cuDNN takes (an int, in range)? */
static int step_fits(const tcc_rt_cuda_conv_step *s) {
  if (s->s < 1 || s->s > 3 || s->n < 1 || s->c_in < 1 || s->c_out < 1 || s->groups < 1 || s->c_in % s->groups ||
      s->c_out % s->groups)
    return 0;
  int64_t x = s->n * s->c_in, y = s->n * s->c_out, w = s->c_out * (s->c_in / s->groups);
  for (int d = 0; d < s->s; d++) {
    if (s->in[d] < 1 || s->k[d] < 1 || s->out[d] < 1 || s->stride[d] < 1 || s->pad[d] < 0 || s->dil[d] < 1 ||
        s->pad[d] > INT32_MAX || s->stride[d] > INT32_MAX || s->dil[d] > INT32_MAX)
      return 0;
    x *= s->in[d], y *= s->out[d], w *= s->k[d];
    if (x > INT32_MAX || y > INT32_MAX || w > INT32_MAX) return 0;
    /* the output size the geometry gives */
    if ((s->in[d] + 2 * s->pad[d] - s->dil[d] * (s->k[d] - 1) - 1) / s->stride[d] + 1 != s->out[d]) return 0;
  }
  return 1;
}

/* The first supported algorithm of the heuristics' list whose workspace
 * is under TDN_WORKSPACE_CAP, else the first supported one. */
static int pick(const tdn_perf *perf, int n) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (perf[i].status != 0) continue;
    if (perf[i].memory <= TDN_WORKSPACE_CAP) return i;
    if (first < 0) first = i;
  }
  return first;
}

int tcc_rt_cudnn_conv_prepare(tcc_rt_cudnn *h, const tcc_rt_cuda_conv_step *s, const char *name,
                              tcc_rt_cudnn_conv **out, uint64_t *workspace_bytes, tcc_error *err) {
  *out = NULL;
  *workspace_bytes = 0;
  int dt = dnn_dtype(s->dtype);
  if (dt < 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s': a dtype cuDNN is not called with here",
                                   name);
  if (s->kind < TCC_RT_CUDA_CONV_FORWARD || s->kind > TCC_RT_CUDA_CONV_BACKWARD_FILTER)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s': unknown convolution kind %d", name, s->kind);
  if (!step_fits(s))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s': convolution sizes cuDNN cannot take", name);
  tcc_rt_cudnn_conv *c = calloc(1, sizeof *c);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  c->kind = s->kind;
  c->dtype = dt;
  /* spatial dims, a 1-D convolution as 2-D of height 1 */
  int S = s->s < 2 ? 2 : s->s, off = S - s->s, nb = 2 + S;
  int xin[3], kk[3], yo[3], pad[3], str[3], dil[3];
  for (int d = 0; d < S; d++) {
    int j = d - off;
    xin[d] = j < 0 ? 1 : (int)s->in[j];
    kk[d] = j < 0 ? 1 : (int)s->k[j];
    yo[d] = j < 0 ? 1 : (int)s->out[j];
    pad[d] = j < 0 ? 0 : (int)s->pad[j];
    str[d] = j < 0 ? 1 : (int)s->stride[j];
    dil[d] = j < 0 ? 1 : (int)s->dil[j];
  }
  int xd[5] = {(int)s->n, (int)s->c_in}, yd[5] = {(int)s->n, (int)s->c_out},
      wd[5] = {(int)s->c_out, (int)(s->c_in / s->groups)}, st[5];
  memcpy(xd + 2, xin, sizeof(int) * (size_t)S);
  memcpy(yd + 2, yo, sizeof(int) * (size_t)S);
  memcpy(wd + 2, kk, sizeof(int) * (size_t)S);
  int math = dt == TDN_HALF || dt == TDN_BFLOAT16 ? TDN_TENSOR_OP_MATH
             : dt == TDN_FLOAT && !s->tf32       ? TDN_FMA_MATH
                                                 : TDN_DEFAULT_MATH;
  const char *what = "cudnnCreateTensorDescriptor";
  tdn_status r = dnn.cudnnCreateTensorDescriptor(&c->x);
  if (!r) r = dnn.cudnnCreateTensorDescriptor(&c->y);
  if (!r) what = "cudnnCreateFilterDescriptor", r = dnn.cudnnCreateFilterDescriptor(&c->w);
  if (!r) what = "cudnnCreateConvolutionDescriptor", r = dnn.cudnnCreateConvolutionDescriptor(&c->conv);
  if (!r)
    dense_strides(xd, nb, st), what = "cudnnSetTensorNdDescriptor",
    r = dnn.cudnnSetTensorNdDescriptor(c->x, dt, nb, xd, st);
  if (!r) dense_strides(yd, nb, st), r = dnn.cudnnSetTensorNdDescriptor(c->y, dt, nb, yd, st);
  if (!r) what = "cudnnSetFilterNdDescriptor", r = dnn.cudnnSetFilterNdDescriptor(c->w, dt, TDN_NCHW, nb, wd);
  if (!r)
    what = "cudnnSetConvolutionNdDescriptor",
    r = dnn.cudnnSetConvolutionNdDescriptor(c->conv, S, pad, str, dil, TDN_CROSS_CORRELATION,
                                            dt == TDN_DOUBLE ? TDN_DOUBLE : TDN_FLOAT);
  if (!r) what = "cudnnSetConvolutionGroupCount", r = dnn.cudnnSetConvolutionGroupCount(c->conv, (int)s->groups);
  if (!r) what = "cudnnSetConvolutionMathType", r = dnn.cudnnSetConvolutionMathType(c->conv, math);
  tdn_perf perf[TDN_MAX_ALGOS];
  int got = 0;
  memset(perf, 0, sizeof perf);
  if (!r) {
    switch (s->kind) {
    case TCC_RT_CUDA_CONV_FORWARD:
      what = "cudnnGetConvolutionForwardAlgorithm_v7";
      r = dnn.cudnnGetConvolutionForwardAlgorithm_v7(h->h, c->x, c->w, c->conv, c->y, TDN_MAX_ALGOS, &got, perf);
      break;
    case TCC_RT_CUDA_CONV_BACKWARD_DATA:
      what = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
      r = dnn.cudnnGetConvolutionBackwardDataAlgorithm_v7(h->h, c->w, c->y, c->conv, c->x, TDN_MAX_ALGOS, &got, perf);
      break;
    default:
      what = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
      r = dnn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(h->h, c->x, c->y, c->conv, c->w, TDN_MAX_ALGOS, &got,
                                                            perf);
      break;
    }
  }
  if (r) {
    int rc = dnn_fail(err, r, name, what);
    tcc_rt_cudnn_conv_free(c);
    return rc;
  }
  int best = pick(perf, got < TDN_MAX_ALGOS ? got : TDN_MAX_ALGOS);
  if (best < 0) {
    tcc_rt_cudnn_conv_free(c);
    return tcc_error_set(err, TCC_E_INTERNAL, "step '%.100s': %s: no supported algorithm (%d tried)", name, what, got);
  }
  c->algo = perf[best].algo;
  if (perf[best].math_type != math && !(dt == TDN_FLOAT && !s->tf32))
    what = "cudnnSetConvolutionMathType", r = dnn.cudnnSetConvolutionMathType(c->conv, perf[best].math_type);
  if (!r) {
    switch (s->kind) {
    case TCC_RT_CUDA_CONV_FORWARD:
      what = "cudnnGetConvolutionForwardWorkspaceSize";
      r = dnn.cudnnGetConvolutionForwardWorkspaceSize(h->h, c->x, c->w, c->conv, c->y, c->algo, &c->workspace);
      break;
    case TCC_RT_CUDA_CONV_BACKWARD_DATA:
      what = "cudnnGetConvolutionBackwardDataWorkspaceSize";
      r = dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(h->h, c->w, c->y, c->conv, c->x, c->algo, &c->workspace);
      break;
    default:
      what = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
      r = dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(h->h, c->x, c->y, c->conv, c->w, c->algo, &c->workspace);
      break;
    }
  }
  if (r) {
    int rc = dnn_fail(err, r, name, what);
    tcc_rt_cudnn_conv_free(c);
    return rc;
  }
  *workspace_bytes = c->workspace;
  *out = c;
  return 0;
}

int tcc_rt_cudnn_conv_run(tcc_rt_cudnn *h, void *stream, const tcc_rt_cudnn_conv *c, const void *x, const void *w,
                          const void *y, void *workspace, const char *name, size_t i, size_t n, tcc_error *err) {
  float af = 1.0f, bf = 0.0f;
  double ad = 1.0, bd = 0.0;
  const void *alpha = c->dtype == TDN_DOUBLE ? (const void *)&ad : (const void *)&af;
  const void *beta = c->dtype == TDN_DOUBLE ? (const void *)&bd : (const void *)&bf;
  pthread_mutex_lock(&h->mu);
  const char *what = "cudnnSetStream";
  tdn_status r = dnn.cudnnSetStream(h->h, stream);
  if (!r) {
    switch (c->kind) {
    case TCC_RT_CUDA_CONV_FORWARD:
      what = "cudnnConvolutionForward";
      r = dnn.cudnnConvolutionForward(h->h, alpha, c->x, x, c->w, w, c->conv, c->algo, workspace, c->workspace, beta,
                                      c->y, (void *)y);
      break;
    case TCC_RT_CUDA_CONV_BACKWARD_DATA:
      what = "cudnnConvolutionBackwardData";
      r = dnn.cudnnConvolutionBackwardData(h->h, alpha, c->w, w, c->y, y, c->conv, c->algo, workspace, c->workspace,
                                           beta, c->x, (void *)x);
      break;
    default:
      what = "cudnnConvolutionBackwardFilter";
      r = dnn.cudnnConvolutionBackwardFilter(h->h, alpha, c->x, x, c->y, y, c->conv, c->algo, workspace,
                                             c->workspace, beta, c->w, (void *)w);
      break;
    }
  }
  pthread_mutex_unlock(&h->mu);
  if (!r) return 0;
  char t[96];
  status_text(r, t, sizeof t);
  return tcc_error_set(err, TCC_E_INTERNAL, "step '%.100s' (launch %zu of %zu): %s: %s", name, i + 1, n, what, t);
}

void tcc_rt_cudnn_destroy(tcc_rt_cudnn *h) {
  if (!h) return;
  dnn.cudnnDestroy(h->h);
  pthread_mutex_destroy(&h->mu);
  free(h);
}
