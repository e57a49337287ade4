/*
 * cuda_driver.h — the part of the CUDA Driver API (NVIDIA's <cuda.h>)
 * that cuda.c uses, declared here so libtccruntime builds without a CUDA
 * toolkit and never links libcuda (it is dlopen'ed; see tcc_runtime.h).
 *
 * Names are cuda.h's with the prefix tcu_/TCU_ instead of cu/CU, so a
 * file may include both: tests/cuda/test_driver_abi.c does, and checks
 * every constant and size below against the real header. The Driver API
 * keeps its ABI across releases (changed calls get new _v2/_v3 symbols),
 * so the symbols named in TCU_DRIVER_FUNCTIONS are the ones cuda.h maps
 * its names to for CUDA 12 and 13 without per-thread default streams.
 */
#ifndef TCC_RUNTIME_CUDA_DRIVER_H
#define TCC_RUNTIME_CUDA_DRIVER_H

#include <stddef.h>

typedef int tcu_result;                 /* CUresult */
typedef int tcu_device;                 /* CUdevice */
typedef unsigned long long tcu_deviceptr; /* CUdeviceptr */
typedef void *tcu_context;              /* CUcontext */
typedef void *tcu_module;               /* CUmodule */
typedef void *tcu_function;             /* CUfunction */
typedef void *tcu_stream;               /* CUstream */
typedef void *tcu_graph;                /* CUgraph */
typedef void *tcu_graph_exec;           /* CUgraphExec */
typedef void *tcu_event;                /* CUevent */

/* CUresult values named in messages or decisions. */
enum {
  TCU_SUCCESS = 0,
  TCU_ERROR_INVALID_VALUE = 1,
  TCU_ERROR_NOT_INITIALIZED = 3,
  TCU_ERROR_NO_DEVICE = 100,
  TCU_ERROR_INVALID_IMAGE = 200,
  TCU_ERROR_NO_BINARY_FOR_GPU = 209,
  TCU_ERROR_INVALID_PTX = 218,
  TCU_ERROR_UNSUPPORTED_PTX_VERSION = 222,
};

/* CUdevice_attribute */
enum {
  TCU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

/* CUfunction_attribute */
enum {
  TCU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  TCU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  TCU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

/* CUjit_option */
enum {
  TCU_JIT_INFO_LOG_BUFFER = 3,
  TCU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  TCU_JIT_ERROR_LOG_BUFFER = 5,
  TCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

/* CUstreamCaptureStatus, CUstreamCaptureMode, CUstream_flags */
enum {
  TCU_STREAM_CAPTURE_STATUS_NONE = 0,
  TCU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  TCU_STREAM_NON_BLOCKING = 1,
};

/* X(symbol in libcuda.so.1, return, parameters). Every one is required
 * except those in TCU_DRIVER_OPTIONAL. */
#define TCU_DRIVER_FUNCTIONS(X)                                                        \
  X(cuInit, tcu_result, (unsigned flags))                                              \
  X(cuDriverGetVersion, tcu_result, (int *version))                                    \
  X(cuGetErrorName, tcu_result, (tcu_result r, const char **s))                        \
  X(cuGetErrorString, tcu_result, (tcu_result r, const char **s))                      \
  X(cuDeviceGetCount, tcu_result, (int *count))                                        \
  X(cuDeviceGet, tcu_result, (tcu_device *dev, int ordinal))                           \
  X(cuDeviceGetAttribute, tcu_result, (int *v, int attr, tcu_device dev))              \
  X(cuDeviceGetName, tcu_result, (char *name, int len, tcu_device dev))                \
  X(cuDevicePrimaryCtxRetain, tcu_result, (tcu_context *ctx, tcu_device dev))          \
  X(cuCtxGetCurrent, tcu_result, (tcu_context *ctx))                                   \
  X(cuCtxPushCurrent_v2, tcu_result, (tcu_context ctx))                                \
  X(cuCtxPopCurrent_v2, tcu_result, (tcu_context *ctx))                                \
  X(cuCtxGetDevice, tcu_result, (tcu_device *dev))                                     \
  X(cuCtxSynchronize, tcu_result, (void))                                              \
  X(cuModuleLoadData, tcu_result, (tcu_module *mod, const void *image))                \
  X(cuModuleLoadDataEx, tcu_result,                                                    \
    (tcu_module *mod, const void *image, unsigned n, int *opts, void **vals))          \
  X(cuModuleUnload, tcu_result, (tcu_module mod))                                      \
  X(cuModuleGetFunction, tcu_result, (tcu_function *fn, tcu_module mod, const char *name)) \
  X(cuModuleGetGlobal_v2, tcu_result,                                                  \
    (tcu_deviceptr *dptr, size_t *bytes, tcu_module mod, const char *name))            \
  X(cuFuncGetAttribute, tcu_result, (int *v, int attr, tcu_function fn))               \
  X(cuFuncSetAttribute, tcu_result, (tcu_function fn, int attr, int v))                \
  X(cuLaunchKernel, tcu_result,                                                        \
    (tcu_function fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
     unsigned bz, unsigned shared, tcu_stream s, void **params, void **extra))         \
  X(cuStreamCreate, tcu_result, (tcu_stream *s, unsigned flags))                       \
  X(cuStreamDestroy_v2, tcu_result, (tcu_stream s))                                    \
  X(cuStreamSynchronize, tcu_result, (tcu_stream s))                                   \
  X(cuStreamIsCapturing, tcu_result, (tcu_stream s, int *status))                      \
  X(cuStreamBeginCapture_v2, tcu_result, (tcu_stream s, int mode))                     \
  X(cuStreamEndCapture, tcu_result, (tcu_stream s, tcu_graph *g))                      \
  X(cuGraphInstantiateWithFlags, tcu_result,                                           \
    (tcu_graph_exec *exec, tcu_graph g, unsigned long long flags))                     \
  X(cuGraphLaunch, tcu_result, (tcu_graph_exec exec, tcu_stream s))                    \
  X(cuGraphExecDestroy, tcu_result, (tcu_graph_exec exec))                             \
  X(cuGraphDestroy, tcu_result, (tcu_graph g))                                         \
  X(cuMemAlloc_v2, tcu_result, (tcu_deviceptr *p, size_t bytes))                       \
  X(cuMemFree_v2, tcu_result, (tcu_deviceptr p))                                       \
  X(cuMemcpyHtoD_v2, tcu_result, (tcu_deviceptr dst, const void *src, size_t bytes))   \
  X(cuMemcpyDtoH_v2, tcu_result, (void *dst, tcu_deviceptr src, size_t bytes))    \
  X(cuMemcpyDtoD_v2, tcu_result, (tcu_deviceptr dst, tcu_deviceptr src, size_t bytes))

/* CUDA 12.4+: parameter layout of a kernel (used to check the ABI).
 * Events (timing; tccd-bench): in every driver, optional here so that
 * loading never depends on them; cuEventElapsedTime_v2 (12.8+) is taken
 * when there, else the original cuEventElapsedTime. */
#define TCU_DRIVER_OPTIONAL(X)                                                         \
  X(cuFuncGetParamInfo, tcu_result,                                                    \
    (tcu_function fn, size_t index, size_t *offset, size_t *size))                     \
  X(cuEventCreate, tcu_result, (tcu_event *e, unsigned flags))                         \
  X(cuEventRecord, tcu_result, (tcu_event e, tcu_stream s))                            \
  X(cuEventSynchronize, tcu_result, (tcu_event e))                                     \
  X(cuEventDestroy_v2, tcu_result, (tcu_event e))                                      \
  X(cuEventElapsedTime, tcu_result, (float *ms, tcu_event start, tcu_event end))       \
  X(cuEventElapsedTime_v2, tcu_result, (float *ms, tcu_event start, tcu_event end))

#endif
