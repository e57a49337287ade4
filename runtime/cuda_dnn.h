/*
 * cuda_dnn.h — cuDNN for the CUDA loader's convolution steps (internal to
 * libtccruntime; cuda.c is the only user).
 *
 * libcudnn is dlopen'ed on first use, like libcuda and libcublas:
 * $TCC_CUDNN_LIBRARY, else "libcudnn.so.9", else "libcudnn.so.8". In a
 * process that imported torch that is the library torch already loaded
 * (dlopen matches it by soname). The runtime loads on machines without
 * it; only plans with a convolution step fail there. cuDNN's legacy
 * convolution API is declared in cuda_dnn.c (no toolkit header).
 *
 *   tcc_rt_cudnn_create         a handle in the current context
 *   tcc_rt_cudnn_conv_prepare   descriptors + algorithm + workspace size
 *   tcc_rt_cudnn_conv_run       the call, on a stream
 */
#ifndef TCC_RUNTIME_CUDA_DNN_H
#define TCC_RUNTIME_CUDA_DNN_H

#include "tcc_runtime.h"

typedef struct tcc_rt_cudnn tcc_rt_cudnn;
typedef struct tcc_rt_cudnn_conv tcc_rt_cudnn_conv;

/* Loads cuDNN once per process. Returns 0 or FAILED_PRECONDITION
 * "libcudnn.so.9 not found: ... (set TCC_CUDNN_LIBRARY)". */
int tcc_rt_cudnn_available(tcc_error *err);

/* A cuDNN handle in the calling thread's current CUDA context. Returns 0,
 * the error of tcc_rt_cudnn_available, or INTERNAL "cudnnCreate: ...". */
int tcc_rt_cudnn_create(tcc_rt_cudnn **out, tcc_error *err);

/* Describes step s (checked: INVALID_ARGUMENT for sizes cuDNN cannot
 * take) and picks its algorithm with cuDNN's heuristics
 * (cudnnGet*Algorithm_v7: the first that cuDNN reports as supported, as
 * PyTorch does without cudnn.benchmark). *workspace_bytes is what the
 * algorithm needs. Returns 0, INVALID_ARGUMENT, or INTERNAL naming the
 * step and the cuDNN call that failed. */
int tcc_rt_cudnn_conv_prepare(tcc_rt_cudnn *h, const tcc_rt_cuda_conv_step *s, const char *name,
                              tcc_rt_cudnn_conv **out, uint64_t *workspace_bytes, tcc_error *err);

/* Runs a prepared step on stream with device addresses x, w, y (the
 * step's roles; the one it writes may not alias the others) and a
 * workspace of at least the prepared size (NULL when that is 0).
 * Serialised per handle. Returns 0 or INTERNAL "step 'k3' (launch 4 of
 * 9): cudnnConvolutionForward: CUDNN_STATUS_...". */
int tcc_rt_cudnn_conv_run(tcc_rt_cudnn *h, void *stream, const tcc_rt_cudnn_conv *c, const void *x, const void *w,
                          const void *y, void *workspace, const char *name, size_t i, size_t n, tcc_error *err);

/* Frees a prepared step. NULL is fine. */
void tcc_rt_cudnn_conv_free(tcc_rt_cudnn_conv *c);

/* Destroys the handle (in the current context). NULL is fine. */
void tcc_rt_cudnn_destroy(tcc_rt_cudnn *h);

#endif
