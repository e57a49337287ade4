/*
 * cuda_schedule.h — the CUDA target (tcc_target_cuda, target.h): its
 * schedule, which schedule.c decides and emit.c, build.c and the manifest
 * read.
 *
 *   schedule.c   per kernel: rows and cooperative reductions, launch
 *                geometry (block, grid, warp rows), split reductions,
 *                persistent rows (row caches), vector width, index type;
 *                the launch plan (steps in order, cuBLAS calls) and the
 *                workspace; its checker and dump
 *   emit.c       CUDA C for the scheduled program (printing only)
 *   build.c      NVRTC -> cubin + PTX; the manifest's launch plan
 *   target.c     tcc_target_cuda and its tuning candidates
 */
#ifndef TCC_CUDA_SCHEDULE_H
#define TCC_CUDA_SCHEDULE_H

#include "target.h"

#define TCC_CUDA_MAX_VEC_ACCESS 32
#define TCC_CUDA_ROW_CACHE_MAX 4

/* How a kernel is launched (1-D grid and block; no dynamic shared
 * memory): the emitter compiles for it, the manifest records it. */
typedef struct tcc_cuda_geometry {
  int64_t grid, block, shared_bytes, numel;
  int reduction;              /* holds a REDUCE */
  int64_t split_groups;       /* > 1: a split reduction (k<j>_split runs first) */
} tcc_cuda_geometry;

/* Everything about one kernel's shape on the GPU. */
typedef struct tcc_cuda_kernel_plan {
  int reduction;              /* block-per-row kernel */
  int row_rank;               /* r: dims 0..r-1 are the row */
  int64_t rows, inner;        /* product of row dims / of the others */
  int64_t numel;
  int64_t red_max;            /* largest cooperative reduction extent */
  int warp_rows;              /* > 0: one warp per row, this many rows per block */
  const tcc_vx **coop;        /* cooperative reductions, dependency order */
  int ncoop;
  int64_t split;              /* > 1: split reduction into this many groups per row */
  int64_t split_block;        /* threads per block of the split stage */
  tcc_cuda_geometry launch;
  const char *used;           /* per buffer: the kernel touches it */
  int idx32;                  /* every index fits int */
  /* vectorized pointwise path: accesses contiguous in the flat index */
  int vec_width;              /* W elements per thread (0: off) */
  int nvacc;
  struct {
    int buf;
    const tcc_ix *const *idx;
    int64_t c;                /* storage index at flat index 0 */
    int store;
  } vacc[TCC_CUDA_MAX_VEC_ACCESS];
  /* persistent rows: buffer rc[i].buf is read from s<buf>[storage index
   * - rb<buf>], a window of w elements from lo past the row's base */
  int nrc;
  struct {
    int buf;
    int64_t lo, w;
    const tcc_ix *const *idx;
    unsigned rowdims;
  } rc[TCC_CUDA_ROW_CACHE_MAX];
} tcc_cuda_kernel_plan;

/* Where a cuBLAS operand lives (tcc.v1.BufferRef). */
typedef enum tcc_cuda_base { TCC_CUDA_INPUT, TCC_CUDA_OUTPUT, TCC_CUDA_WORKSPACE, TCC_CUDA_CONSTANT } tcc_cuda_base;
typedef struct tcc_cuda_ref {
  tcc_cuda_base base;
  int index;                  /* INPUT/OUTPUT position; CONSTANT: buffer id (symbol b<id>_data) */
  int64_t offset_bytes;
} tcc_cuda_ref;

/* An EXTERN (GEMM) kernel as one cublasGemmStridedBatchedEx call, in
 * cuBLAS's column-major terms (tcc.v1.GemmStep documents the fields). */
typedef struct tcc_cuda_gemm {
  int trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch;
  tcc_dtype ab_dtype, c_dtype;
  const char *compute;        /* "32F", "64F" */
  tcc_cuda_ref a, b, c;
} tcc_cuda_gemm;

/* An EXTERN convolution kernel (TCC_EXT_CONV_*, conv.c) as one cuDNN
 * call (tcc.v1.ConvStep): the EXTERN's parameters (TCC_CONV_*), its
 * operands a and b and its result c, each a dense NCHW tensor. */
typedef struct tcc_cuda_conv {
  int kind;                   /* TCC_EXT_CONV_FWD, _BWD_DATA, _BWD_WEIGHTS */
  int64_t prm[TCC_CONV_NPARAM];
  tcc_dtype dtype;
  int tf32;                   /* float32 with cudnn.allow_tf32 */
  tcc_cuda_ref a, b, c;
} tcc_cuda_conv;

/* One step of a CUDA launch plan: a kernel launch, a cuBLAS call or a
 * cuDNN call. */
typedef struct tcc_cuda_step {
  char name[32];              /* "k3", "k3_split" (the __global__), "k1" (extern) */
  const char *kind;           /* "pointwise", "reduction", "split-reduction", "extern" */
  int kernel;                 /* index in p->kernels */
  int kno;                    /* live-kernel number (the j of k<j>) */
  int split_stage;            /* 1: k<j>_split */
  int64_t grid[2], block, shared_bytes, numel;
  int64_t split_off;          /* workspace offset of the partials (split kernels) */
  const tcc_cuda_kernel_plan *plan;   /* launches: the kernel's plan */
  int is_gemm;                /* a cuBLAS call (gemm) */
  tcc_cuda_gemm gemm;
  int is_conv;                /* a cuDNN call (conv) */
  tcc_cuda_conv conv;
} tcc_cuda_step;

/* Is step st a library call (no __global__ of ours)? */
static inline int tcc_cuda_step_is_library(const tcc_cuda_step *st) { return st->is_gemm || st->is_conv; }

/* The schedule of a program: its launch plan, in the program's arena. */
typedef struct tcc_cuda_schedule {
  tcc_cuda_step *steps;       /* in launch order */
  int n;
  int n_global;               /* steps that are __global__ launches */
  int64_t workspace_bytes;    /* the program's + split partials */
} tcc_cuda_schedule;

/* schedule.c: the schedule pass. Returns 0, TCC_E_UNIMPLEMENTED (an
 * extern step other than a GEMM or a convolution; a GEMM cuBLAS cannot
 * express: sizes over 2^31-1) or TCC_E_RESOURCE_EXHAUSTED. */
int tcc_cuda_schedule_pass(tcc_program *p, tcc_error *err);
int tcc_cuda_schedule_check(const tcc_program *p, tcc_error *err);
void tcc_cuda_schedule_dump(const tcc_program *p, tcc_buf *b);

/* The CUDA C type of a dtype (float16/bfloat16 as their bits), or NULL:
 * not supported. */
static inline const char *tcc_cuda_ctype(tcc_dtype d) {
  switch (d) {
  case TCC__V1__DTYPE__FLOAT32: return "float";
  case TCC__V1__DTYPE__FLOAT64: return "double";
  case TCC__V1__DTYPE__INT8: return "int8_t";
  case TCC__V1__DTYPE__INT16: return "int16_t";
  case TCC__V1__DTYPE__INT32: return "int32_t";
  case TCC__V1__DTYPE__INT64: return "int64_t";
  case TCC__V1__DTYPE__UINT8:
  case TCC__V1__DTYPE__BOOL: return "uint8_t";
  case TCC__V1__DTYPE__FLOAT16:
  case TCC__V1__DTYPE__BFLOAT16: return "uint16_t";   /* bits */
  default: return NULL;
  }
}

/* The product of a REDUCE's extents. */
static inline int64_t tcc_cuda_reduce_extent(const tcc_vx *r) {
  int64_t n = 1;
  for (int i = 0; i < r->nidx; i++) n *= r->idx[i]->c;
  return n;
}

/* schedule.c: how many of kp's cooperative reductions from coop[i] on
 * fold in one loop (same extents, none reading another's result). */
int tcc_cuda_coop_group_size(const tcc_cuda_kernel_plan *kp, int i);

/* emit.c: CUDA C for the scheduled program (ABI 1: one extern "C"
 * __global__ k<j> per live kernel, each taking (inputs..., outputs...,
 * workspace), k<j>_split before split reductions; no code for GEMM
 * steps, which the client runs with cuBLAS). TCC_E_UNIMPLEMENTED for
 * dtypes it cannot do. */
int tcc_cuda_emit(const tcc_program *p, tcc_buf *src, tcc_error *err);

/* build.c: NVRTC -> cubin and PTX for p's target arch (tcc_nvrtc.h); stops
 * waiting for NVRTC after opts->timeout_ms (TCC_E_DEADLINE_EXCEEDED);
 * NVRTC's log is in the error on failure. */
int tcc_cuda_build(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
                   tcc_built *out, tcc_error *err);
/* build.c: the manifest's launch plan (kernels with their launch configs
 * and GEMM steps, workspace_bytes, ptx). */
int tcc_cuda_manifest(const tcc_program *p, const tcc_built *built, tcc_arena *A, Tcc__V1__Manifest *m,
                      tcc_error *err);

#endif
