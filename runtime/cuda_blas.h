/*
 * cuda_blas.h — cuBLAS for the CUDA loader's extern steps (internal to
 * libtccruntime; cuda.c is the only user).
 *
 * libcublas is dlopen'ed on first use, like libcuda: $TCC_CUBLAS_LIBRARY,
 * else "libcublas.so.13", else "libcublas.so.12", so the runtime loads
 * on machines without it and only plans with a GEMM step fail there. The
 * few declarations needed are in cuda_blas.c (no toolkit header).
 */
#ifndef TCC_RUNTIME_CUDA_BLAS_H
#define TCC_RUNTIME_CUDA_BLAS_H

#include "tcc_runtime.h"

typedef struct tcc_rt_cublas tcc_rt_cublas;

/* Loads cuBLAS once per process. Returns 0 or FAILED_PRECONDITION
 * "libcublas.so.13 not found: ... (set TCC_CUBLAS_LIBRARY)". */
int tcc_rt_cublas_available(tcc_error *err);

/* A cuBLAS handle in the calling thread's current CUDA context (cuda.c
 * makes the kernel's context current first). Returns 0, the error of
 * tcc_rt_cublas_available, or INTERNAL "cublasCreate: CUBLAS_STATUS_...". */
int tcc_rt_cublas_create(tcc_rt_cublas **out, tcc_error *err);

/* Runs step g on stream (NULL = legacy default) with operand pointers
 * a, b, c (device addresses, offsets applied). Serialised per handle.
 * Returns 0, INVALID_ARGUMENT (a dtype or compute type cuBLAS was not
 * asked for here) or INTERNAL "step 'k0' (launch 1 of 2):
 * cublasGemmStridedBatchedEx: CUBLAS_STATUS_...". */
int tcc_rt_cublas_gemm(tcc_rt_cublas *h, void *stream, const tcc_rt_cuda_gemm_step *g, const void *a, const void *b, void *c,
                       const char *name, size_t i, size_t n, tcc_error *err);

/* Destroys the handle (in the current context). NULL is fine. */
void tcc_rt_cublas_destroy(tcc_rt_cublas *h);

#endif
