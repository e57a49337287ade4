/*
 * test_driver_abi.c — runtime/cuda_driver.h (the Driver API subset the
 * loader declares itself, so it needs no toolkit) against the toolkit's
 * cuda.h: every constant equal, every handle and pointer the same size,
 * every symbol the loader dlsyms declared by cuda.h. Most of it is
 * checked at compile time; built only where cuda.h is found.
 */
#include <check.h>
#include <cuda.h>
#include <string.h>

#include "cuda_driver.h"
#include "tcctest.h"

#define SAME(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #ours " != " #theirs)

SAME(TCU_SUCCESS, CUDA_SUCCESS);
SAME(TCU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(TCU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(TCU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(TCU_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_IMAGE);
SAME(TCU_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_BINARY_FOR_GPU);
SAME(TCU_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_PTX);
SAME(TCU_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
SAME(TCU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME(TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
SAME(TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME(TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME(TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
SAME(TCU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME(TCU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
SAME(TCU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
SAME(TCU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER);
SAME(TCU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
SAME(TCU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER);
SAME(TCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
SAME(TCU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE);
SAME(TCU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
SAME(TCU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);

SAME(sizeof(tcu_result), sizeof(CUresult));
SAME(sizeof(tcu_device), sizeof(CUdevice));
SAME(sizeof(tcu_deviceptr), sizeof(CUdeviceptr));
SAME(sizeof(tcu_context), sizeof(CUcontext));
SAME(sizeof(tcu_module), sizeof(CUmodule));
SAME(sizeof(tcu_function), sizeof(CUfunction));
SAME(sizeof(tcu_stream), sizeof(CUstream));
SAME(sizeof(tcu_graph), sizeof(CUgraph));
SAME(sizeof(tcu_graph_exec), sizeof(CUgraphExec));
SAME(sizeof(tcu_event), sizeof(CUevent));
SAME(sizeof(int), sizeof(CUjit_option));
SAME(sizeof(int), sizeof(CUdevice_attribute));
SAME(sizeof(int), sizeof(CUfunction_attribute));
SAME(sizeof(int), sizeof(CUstreamCaptureStatus));
SAME(sizeof(int), sizeof(CUstreamCaptureMode));

/* Each symbol the loader resolves is a function cuda.h declares under
 * that exact name (sizeof: no reference, no link needed). */
#define DECLARED(name, ret, params) SAME(sizeof(&name), sizeof(void (*)(void)));
TCU_DRIVER_FUNCTIONS(DECLARED)
TCU_DRIVER_OPTIONAL(DECLARED)

/* cuda.h's macros map the public names to the symbols we dlsym. */
#define STR2(x) #x
#define STR(x) STR2(x)

START_TEST(public_names_map_to_the_symbols_we_load) {
  ck_assert_str_eq(STR(cuCtxPushCurrent), "cuCtxPushCurrent_v2");
  ck_assert_str_eq(STR(cuCtxPopCurrent), "cuCtxPopCurrent_v2");
  ck_assert_str_eq(STR(cuMemAlloc), "cuMemAlloc_v2");
  ck_assert_str_eq(STR(cuMemFree), "cuMemFree_v2");
  ck_assert_str_eq(STR(cuMemcpyHtoD), "cuMemcpyHtoD_v2");
  ck_assert_str_eq(STR(cuMemcpyDtoH), "cuMemcpyDtoH_v2");
  ck_assert_str_eq(STR(cuStreamDestroy), "cuStreamDestroy_v2");
  ck_assert_str_eq(STR(cuStreamBeginCapture), "cuStreamBeginCapture_v2");
  ck_assert_str_eq(STR(cuGraphInstantiate), "cuGraphInstantiateWithFlags");
  ck_assert_str_eq(STR(cuLaunchKernel), "cuLaunchKernel");
  ck_assert_str_eq(STR(cuGraphLaunch), "cuGraphLaunch");
  ck_assert_str_eq(STR(cuEventDestroy), "cuEventDestroy_v2");
  ck_assert_str_eq(STR(cuEventRecord), "cuEventRecord");
  ck_assert_int_ge(CUDA_VERSION, 12040); /* cuFuncGetParamInfo */
}
END_TEST

int main(void) {
  return tt_run_tests("cuda-driver-abi", 0, 0, (const TTest *[]){public_names_map_to_the_symbols_we_load, NULL});
}
