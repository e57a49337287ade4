/*
 * tcc_runtime.h — libtccruntime, what runs kernels: the CUDA loader and
 * launcher (cubins from tccd, run through the CUDA Driver API). Both
 * sides link it: libtccclient to run the artifacts it loads, and
 * tccd-bench (bench.c, the benchmark child of autotuning) to time CUDA
 * candidates. It knows nothing of RPC, the daemon or the compiler.
 *
 * libcuda is never linked: it is dlopen'ed ("libcuda.so.1", or
 * $TCC_CUDA_LIBRARY) on first use, so every program linking the runtime
 * loads and works on machines without a GPU or driver; only the calls
 * that need a device fail there, with TCC_E_FAILED_PRECONDITION
 * "libcuda.so.1 not found: no NVIDIA driver on this machine (...)". No
 * CUDA header is needed to build it (cuda_driver.h declares what it
 * uses), and no header here is named like one of NVIDIA's.
 *
 *   tcc_rt_cuda_available                 is there a driver and a device?
 *   tcc_rt_cuda_kernel_load[_manifest]    cubin (or PTX) -> module -> functions
 *   tcc_rt_cuda_kernel_launch             run the launch plan on a stream
 *   tcc_rt_cuda_kernel_unload
 *
 * Every function and type of the runtime is prefixed tcc_rt_ (the
 * compiler's CUDA backend owns tcc_cuda_*).
 *
 * The generic tcc_module_load (client/tccclient.h) sends an artifact here
 * when its manifest's target is "cuda:ARCH" and the bytes are a cubin;
 * tcc_module_run then launches on the default stream of the kernel's
 * context, and tcc_module_cuda() (tccclient.h) gives the
 * tcc_rt_cuda_kernel for stream and CUDA-graph control.
 *
 * Contexts. A kernel belongs to one CUDA context, chosen at load
 * (tcc_rt_cuda_options.context): the primary context of a device index (what
 * the CUDA runtime and PyTorch use), or the calling thread's current
 * context. Primary contexts this library retains stay retained for the
 * life of the process. Launches make the kernel's context current for
 * their duration (push/pop) when it is not already.
 *
 * Module cache. One CUmodule per (context, artifact digest), shared by
 * every kernel loaded from the same artifact in that context and unloaded
 * with the last of them. The digest is the caller's word that the bytes
 * hash to it (tcc_module_load checks it before it gets here).
 *
 * Cubin or PTX. A cubin for sm_XY runs on devices of compute capability
 * X.Z with Z >= Y; an "a" cubin (sm_90a) only on X.Y exactly. Otherwise
 * (another major arch: an sm_80 artifact on an H100), the PTX of the same
 * compile (tcc_nvrtc_result.ptx; compute_XY) is JIT-compiled by the
 * driver, which works on every device of capability >= X.Y (not for "a"
 * PTX). Without PTX that is TCC_E_FAILED_PRECONDITION "arch mismatch:
 * artifact sm_90, device sm_80 (...)". A driver older than the NVRTC that
 * made the PTX refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, reported).
 *
 * The launch plan and argument binding (ABI version 1, as on CPU). Each
 * launch runs one __global__ with its grid, block and dynamic shared
 * bytes, in plan order, on the caller's stream. EVERY kernel takes the
 * same parameters, all 8-byte device pointers:
 *
 *   (inputs[0..n_inputs), outputs[0..n_outputs), workspace)
 *
 * inputs in Graph.inputs order, outputs in Graph.outputs order, each
 * pointing at element 0 of the tensor's storage (the kernel applies
 * storage_offset and strides, which it was specialised for); workspace
 * is NULL when tcc_rt_cuda_kernel_workspace_bytes is 0, else at least
 * that many bytes (the plan's workspace_bytes, plus what cuDNN steps
 * need), 256-byte aligned (cudaMalloc's alignment); intermediates between the
 * plan's kernels live in it at offsets compiled into the code. Outputs
 * must not overlap inputs, each other or the workspace. When the driver
 * has cuFuncGetParamInfo (CUDA 12.4+), load checks every kernel takes
 * exactly that many 8-byte parameters.
 *
 * CUDA graphs (mode reduce-overhead: tcc_rt_cuda_options.graphs or
 * tcc_rt_cuda_kernel_set_graphs). The first launch with a given set of
 * pointers (inputs, outputs, workspace) captures the plan on the caller's
 * stream (cuStreamBeginCapture/EndCapture, thread-local mode) and
 * instantiates it; later launches with the same pointers replay it with
 * one cuGraphLaunch. Up to graph_cache_max executable graphs are kept per
 * kernel (least recently used dropped). The plan is launched directly,
 * without a graph, on the legacy default stream (NULL: it cannot be
 * captured) and when the stream is already being captured (the caller's
 * own graph then records the launches). tcc_rt_cuda_kernel_stats counts each
 * path.
 *
 * Thread-safety: every function may be called from several threads; one
 * kernel may be launched from several threads at once (graph capture for
 * one kernel is serialised by a lock).
 */
#ifndef TCC_RUNTIME_H
#define TCC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "tcc_status.h"

/* (tcc/v1/tcc.pb-c.h declares it; the loader itself needs no protobuf.) */
struct Tcc__V1__Manifest;

typedef struct tcc_rt_cuda_kernel tcc_rt_cuda_kernel;

/* Where an operand of a cuBLAS step lives (tcc.v1.BufferRef): one of
 * the ABI's pointers, or a __device__ array of the module, + offset. */
typedef enum tcc_rt_cuda_buffer_base {
  TCC_RT_CUDA_BUF_INPUT = 1,      /* inputs[index] */
  TCC_RT_CUDA_BUF_OUTPUT = 2,     /* outputs[index] */
  TCC_RT_CUDA_BUF_WORKSPACE = 3,  /* the workspace */
  TCC_RT_CUDA_BUF_CONSTANT = 4,   /* the module global `constant` (cuModuleGetGlobal) */
} tcc_rt_cuda_buffer_base;

typedef struct tcc_rt_cuda_buffer {
  tcc_rt_cuda_buffer_base base;
  uint32_t index;
  const char *constant;
  uint64_t offset_bytes;
} tcc_rt_cuda_buffer;

/* cuBLAS compute types a step may ask for. */
typedef enum tcc_rt_cuda_compute {
  TCC_RT_CUDA_COMPUTE_32F = 0,            /* float32 accumulate, no TF32 (torch's default) */
  TCC_RT_CUDA_COMPUTE_32F_FAST_TF32 = 1,  /* TF32 tensor cores allowed */
  TCC_RT_CUDA_COMPUTE_64F = 2,
} tcc_rt_cuda_compute;

/* An extern step of the plan: one cublasGemmStridedBatchedEx call,
 * column-major (tcc.v1.GemmStep; dtypes are tcc.v1.DType values:
 * FLOAT32 1, FLOAT64 2, FLOAT16 3, BFLOAT16 4). */
typedef struct tcc_rt_cuda_gemm_step {
  int trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c, batch_count;
  int a_dtype, b_dtype, c_dtype;
  tcc_rt_cuda_compute compute;
  double alpha, beta;
  tcc_rt_cuda_buffer a, b, c;
} tcc_rt_cuda_gemm_step;

/* Which cuDNN call a convolution step makes. */
typedef enum tcc_rt_cuda_conv_kind {
  TCC_RT_CUDA_CONV_FORWARD = 1,          /* y = conv(x, w) */
  TCC_RT_CUDA_CONV_BACKWARD_DATA = 2,    /* dx from dy (y) and w */
  TCC_RT_CUDA_CONV_BACKWARD_FILTER = 3,  /* dw from x and dy (y) */
} tcc_rt_cuda_conv_kind;

/* An extern step of the plan: one cuDNN convolution, cross-correlation
 * as PyTorch computes it (tcc.v1.ConvStep). Tensors are dense NCHW
 * (NCDHW); s spatial dims, 1 to 3 (a 1-D convolution runs as a 2-D one
 * of height 1). x, w and y are read or written by kind: forward reads
 * x and w and writes y; backward data reads y (dy) and w and writes x
 * (dx); backward filter reads x and y (dy) and writes w (dw). dtype is
 * a tcc.v1.DType (FLOAT32 1, FLOAT64 2, FLOAT16 3, BFLOAT16 4). */
typedef struct tcc_rt_cuda_conv_step {
  tcc_rt_cuda_conv_kind kind;
  int s;
  int64_t n, c_in, c_out, groups;
  int64_t in[3], k[3], out[3], stride[3], pad[3], dil[3];
  int dtype;
  int tf32;                    /* float32: TF32 tensor cores allowed */
  tcc_rt_cuda_buffer x, w, y;
} tcc_rt_cuda_conv_step;

/* One launch of the plan. */
typedef struct tcc_rt_cuda_launch {
  const char *name;            /* the __global__'s symbol (lowered name) */
  uint32_t grid[3];            /* blocks; 0 counts as 1 */
  uint32_t block[3];           /* threads per block; 0 counts as 1 */
  uint32_t shared_bytes;       /* dynamic shared memory per block */
  /* Non-NULL: not a kernel but a cuBLAS call at this point of the plan
   * (grid/block unused; name only for messages). libcublas is dlopen'ed
   * like libcuda ($TCC_CUBLAS_LIBRARY, else libcublas.so.13, .so.12);
   * a plan with such a step fails to load without it:
   * FAILED_PRECONDITION "libcublas.so.13 not found: ...". One cuBLAS
   * handle per kernel, made in its context at load. */
  const tcc_rt_cuda_gemm_step *gemm;
  /* Non-NULL: a cuDNN call at this point of the plan. libcudnn is
   * dlopen'ed the same way ($TCC_CUDNN_LIBRARY, else libcudnn.so.9, .so.8:
   * in a process that imported torch, the one torch loaded). Its
   * algorithm is chosen at load by cuDNN's heuristics (as PyTorch does
   * without cudnn.benchmark) and its workspace comes after the plan's:
   * see tcc_rt_cuda_kernel_workspace_bytes. One cuDNN handle per kernel. */
  const tcc_rt_cuda_conv_step *conv;
} tcc_rt_cuda_launch;

/* How to run an artifact: the plan and the ABI's argument counts. */
typedef struct tcc_rt_cuda_plan {
  const char *arch;            /* what the cubin was built for: "sm_90a";
                                  NULL = read the SM from the cubin (no suffix) */
  const tcc_rt_cuda_launch *launches;
  size_t n_launches;
  size_t n_inputs;
  size_t n_outputs;
  uint64_t workspace_bytes;
} tcc_rt_cuda_plan;

/* Which context a kernel is loaded into. */
typedef enum tcc_rt_cuda_context_kind {
  TCC_RT_CUDA_PRIMARY = 0,             /* the primary context of .device */
  TCC_RT_CUDA_CURRENT = 1,             /* the calling thread's current context
                                       (FAILED_PRECONDITION when none) */
  TCC_RT_CUDA_CURRENT_OR_PRIMARY = 2,  /* the current one, else .device's primary */
} tcc_rt_cuda_context_kind;

/* Load options; a zeroed struct (or NULL) = device 0's primary context,
 * no graphs, no PTX. */
typedef struct tcc_rt_cuda_options {
  int device;                  /* device index for TCC_RT_CUDA_PRIMARY */
  tcc_rt_cuda_context_kind context;
  int graphs;                  /* 1 = capture + replay CUDA graphs */
  size_t graph_cache_max;      /* executable graphs kept; 0 = 16 */
  const char *ptx;             /* PTX of the same compile (NUL-terminated),
                                  for the JIT fallback; NULL = none */
} tcc_rt_cuda_options;

/* What a kernel did so far. */
typedef struct tcc_rt_cuda_stats {
  uint64_t direct_launches;    /* plans launched kernel by kernel */
  uint64_t graph_captures;     /* graphs captured + instantiated */
  uint64_t graph_replays;      /* plans run as one cuGraphLaunch */
  int from_ptx;                /* the module was JIT-compiled from PTX */
  int device;                  /* the context's device index */
  char device_arch[16];        /* "sm_90" */
} tcc_rt_cuda_stats;

/* ---------------------------------------------------------------- driver */

/* Loads libcuda and runs cuInit once per process; 0 when a driver and at
 * least one device are there. Otherwise TCC_E_FAILED_PRECONDITION with
 * the reason: "libcuda.so.1 not found: no NVIDIA driver on this machine
 * (...)", "cuInit failed: CUDA_ERROR_NO_DEVICE (...)". */
int tcc_rt_cuda_available(tcc_error *err);

/* The driver's CUDA version (13000 = 13.0). Returns 0 or the error of
 * tcc_rt_cuda_available. */
int tcc_rt_cuda_driver_version(int *version, tcc_error *err);

/* Number of CUDA devices. Returns 0 or tcc_rt_cuda_available's error. */
int tcc_rt_cuda_device_count(int *count, tcc_error *err);

/* A device's arch ("sm_90") and name ("NVIDIA H100 80GB HBM3"; name may
 * be NULL). Returns 0, INVALID_ARGUMENT (no such device) or
 * tcc_rt_cuda_available's error. */
int tcc_rt_cuda_device_arch(int device, char arch[16], char *name, size_t name_cap,
                            tcc_error *err);

/* ---------------------------------------------------------------- kernels */

/* Loads a cubin (len bytes; digest_hex = its SHA-256, the module cache
 * key; NULL = do not share the module) into the context opts selects and
 * resolves every launch's function. Falls back to opts->ptx when the
 * cubin cannot run on the device (see the top of this file). Returns 0,
 *   TCC_E_INVALID_ARGUMENT   not a cubin, an empty plan, a zero or
 *                            oversized grid/block, a kernel whose
 *                            parameters do not match the ABI
 *   TCC_E_NOT_FOUND          a launch names a kernel the module lacks
 *   TCC_E_FAILED_PRECONDITION no driver/device, no current context,
 *                            "arch mismatch: artifact sm_90, device sm_80"
 *   TCC_E_INTERNAL           the driver refused the module (its JIT log
 *                            included)
 *   TCC_E_RESOURCE_EXHAUSTED out of memory */
int tcc_rt_cuda_kernel_load(const uint8_t *cubin, size_t len, const char *digest_hex,
                            const tcc_rt_cuda_plan *plan, const tcc_rt_cuda_options *opts,
                            tcc_rt_cuda_kernel **out, tcc_error *err);

/* The same with the plan taken from a tcc.v1.Manifest (cuda_manifest.c):
 * arch from manifest->target ("cuda:sm_90a"), one launch per
 * manifest->kernels[i] (name, grid, block: 1 to 3 entries each, required;
 * shared_bytes) or, for kind "extern", one cuBLAS call (a GemmStep) or
 * one cuDNN call (a ConvStep);
 * the input/output counts and workspace_bytes; and manifest->ptx as the
 * PTX fallback when opts->ptx is NULL. INVALID_ARGUMENT names the kernel
 * and field that is missing or out of range. */
int tcc_rt_cuda_kernel_load_manifest(const uint8_t *cubin, size_t len,
                                     const char *digest_hex,
                                     const struct Tcc__V1__Manifest *manifest,
                                     const tcc_rt_cuda_options *opts,
                                     tcc_rt_cuda_kernel **out, tcc_error *err);

/* The workspace a launch needs, in bytes: the plan's workspace_bytes,
 * then (256-byte aligned) what the cuDNN algorithms chosen at load need.
 * Callers allocate this much, not the manifest's figure. 0 for NULL. */
uint64_t tcc_rt_cuda_kernel_workspace_bytes(const tcc_rt_cuda_kernel *k);

/* Runs the plan on stream (a CUstream / cudaStream_t; NULL = the legacy
 * default stream). Asynchronous, like any CUDA launch: errors of the
 * kernels themselves show at the next synchronisation. Pointers are
 * device pointers as the ABI above says. Returns 0,
 * TCC_E_INVALID_ARGUMENT (missing pointers) or TCC_E_INTERNAL "kernel
 * 'k1_sum' (launch 2 of 3): cuLaunchKernel: CUDA_ERROR_... (...)". */
int tcc_rt_cuda_kernel_launch(tcc_rt_cuda_kernel *k, void *stream,
                              const void *const *inputs, void *const *outputs,
                              void *workspace, tcc_error *err);

/* Turns graph capture + replay on or off for later launches (off drops
 * the captured graphs). */
void tcc_rt_cuda_kernel_set_graphs(tcc_rt_cuda_kernel *k, int on);

/* Copies the counters and facts of a kernel into *out. */
void tcc_rt_cuda_kernel_stats(tcc_rt_cuda_kernel *k, tcc_rt_cuda_stats *out);

/* Unloads (the module goes with its last kernel). NULL is fine. */
void tcc_rt_cuda_kernel_unload(tcc_rt_cuda_kernel *k);

/* ---------------------------------------------------------------- memory
 * Small helpers for callers without a CUDA runtime of their own (tests,
 * tools): each runs in the primary context of `device`. */

int tcc_rt_cuda_malloc(int device, size_t bytes, void **dptr, tcc_error *err);
int tcc_rt_cuda_free(int device, void *dptr, tcc_error *err);
int tcc_rt_cuda_memcpy_htod(int device, void *dst, const void *src, size_t bytes,
                            tcc_error *err);
int tcc_rt_cuda_memcpy_dtoh(int device, void *dst, const void *src, size_t bytes,
                            tcc_error *err);
int tcc_rt_cuda_memcpy_dtod(int device, void *dst, const void *src, size_t bytes, tcc_error *err);
/* A non-blocking stream (*stream) of the device's primary context. */
int tcc_rt_cuda_stream_create(int device, void **stream, tcc_error *err);
int tcc_rt_cuda_stream_destroy(int device, void *stream, tcc_error *err);
/* Waits for the stream (NULL: the whole context); reports a kernel's
 * failure ("CUDA_ERROR_ILLEGAL_ADDRESS ..."). */
int tcc_rt_cuda_synchronize(int device, void *stream, tcc_error *err);

/* Events for timing on a stream (tccd-bench): create (default flags,
 * timing on), record on a stream (NULL: the legacy default stream),
 * elapsed milliseconds from start to end (waits for end first), destroy.
 * Each returns 0, tcc_rt_cuda_available's error, FAILED_PRECONDITION when
 * the driver lacks the event calls, or INTERNAL with the CUDA error. */
int tcc_rt_cuda_event_create(int device, void **event, tcc_error *err);
int tcc_rt_cuda_event_record(int device, void *event, void *stream, tcc_error *err);
int tcc_rt_cuda_event_elapsed_ms(int device, void *start, void *end, float *ms, tcc_error *err);
int tcc_rt_cuda_event_destroy(int device, void *event, tcc_error *err);

#endif
