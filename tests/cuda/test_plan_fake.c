/*
 * test_plan_fake.c — what the compiler emits for CUDA, run by the client
 * against the recording fake libcuda + libcublas (no GPU): the manifest
 * tcc_compile writes is the plan libtccclient executes. Checked:
 *
 *   gelu(x @ w.T + b)   load cubin, one cuBLAS handle; per run the GEMM
 *                       (op T on w, m = N, n = M, k = K, C in the
 *                       workspace at the manifest's offset, float32
 *                       compute without TF32) strictly before the fused
 *                       epilogue kernel, which gets (x, w, b, out, ws)
 *   sum of 2^20 values  k0_split with grid (groups, 1) before k0 with
 *                       grid 1, both on the same pointers
 *   a newer device      the manifest's PTX is JIT-compiled instead of the
 *                       cubin (TCC_FAKE_CUDA_CC=100 for an sm_90 artifact)
 *   relu(conv2d + bias) one cuDNN handle; at load the descriptors
 *                       (dense NCHW, groups, no TF32: FMA math) and the
 *                       first supported algorithm of the heuristics, its
 *                       workspace added after the plan's (one that asks
 *                       for over 1 GiB is passed over); per run the
 *                       forward call on the caller's pointers strictly
 *                       before the epilogue kernel; a failing call is
 *                       INTERNAL naming step and call; in a CUDA graph
 *                       the call is captured with the launches
 *   no libcudnn         (TCC_FAKE_NO_CUDNN=1, a second process) loading
 *                       a plan with a convolution step is
 *                       FAILED_PRECONDITION naming the library
 *
 * Skips (exit 77) without NVRTC or when TCC_CUDA_LIBRARY is not the fake.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tccclient.h"
#include "tcctest.h"

static const char *(*fake_events)(void);
static void (*fake_reset)(void);

#define P(x) ((void *)(uintptr_t)(x))

/* Index of the first event line starting with prefix, -1 when none. */
static int event_at(const char *prefix) { return tt_fake_event_at(fake_events(), prefix); }

/* Compiles b for sm_90 and loads it through the generic client path. */
static tcc_module *compile_and_load(reqb *b, Tcc__V1__Manifest **mout, tcc_artifact *a) {
  Tcc__V1__CompileRequest *req = reqb_req(b);
  tt_request_to_cuda(req, reqb_str(b, "sm_90"));
  tcc_error err = {0};
  tcc_prepared *p;
  ck_assert_msg(tcc_prepare(req, "plan-fake", &p, &err) == 0, "%s", err.msg);
  ck_assert_msg(tcc_compile(p, NULL, a, &err) == 0, "%s", err.msg);
  tcc_prepared_free(p);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a->manifest_len, a->manifest);
  ck_assert_ptr_nonnull(m);
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(a->sha256, sizeof a->sha256, hex);
  char np[16];
  snprintf(np, sizeof np, "%zu", m->n_inputs + m->n_outputs + 1);
  setenv("TCC_FAKE_CUDA_NPARAMS", np, 1);
  tcc_module *k = NULL;
  ck_assert_msg(tcc_module_load(a->data, a->size, hex, m, &k, &err) == 0, "%s", err.msg);
  *mout = m;
  return k;
}

START_TEST(gemm_then_epilogue) {
  reqb *b = reqb_linear_gelu(2, (int64_t[]){20, 64}, 96);
  fake_reset();
  tcc_artifact a;
  Tcc__V1__Manifest *m;
  tcc_module *k = compile_and_load(b, &m, &a);
  ck_assert_int_ge(event_at("load cubin"), 0);
  ck_assert_int_gt(event_at("cublas create"), event_at("load cubin"));
  ck_assert_int_eq((int)m->n_kernels, 2);
  const Tcc__V1__GemmStep *g = m->kernels[0]->gemm;
  ck_assert_ptr_nonnull(g);
  const void *in[3] = {P(0x10000), P(0x20000), P(0x30000)};
  void *out[1] = {P(0x40000)};
  fake_reset();
  tcc_error err = {0};
  ck_assert_msg(tcc_module_run(k, in, out, P(0x50000), &err) == 0, "%s", err.msg);
  char want[512];
  snprintf(want, sizeof want,
           "cublas gemm TN m=96 n=20 k=64 lda=64 ldb=64 ldc=96 sa=0 sb=0 sc=0 batch=1 types=0,0,0 compute=68 algo=-1 "
           "alpha=1 beta=0 A=20000 B=10000 C=%llx stream=0",
           (unsigned long long)(0x50000 + g->c->offset_bytes));
  int gi = event_at(want), ki = event_at("launch k1 ");
  ck_assert_msg(gi >= 0, "want '%s' in\n%s", want, fake_events());
  ck_assert_msg(ki > gi, "the epilogue must follow the GEMM:\n%s", fake_events());
  ck_assert_int_ge(event_at("launch k1 g="), 0);
  ck_assert_msg(strstr(fake_events(), "p=10000,20000,30000,40000,50000"), "%s", fake_events());
  ck_assert_int_ge(event_at("cublas math 1 0"), 0);   /* CUBLAS_DEFAULT_MATH: no TF32 */
  tcc_module_unload(k);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  reqb_free(b);
}
END_TEST

START_TEST(split_reduction_and_ptx_fallback) {
  reqb *b = reqb_sum_all(INT64_C(1) << 20);
  for (int newer = 0; newer < 2; newer++) {
    if (newer) setenv("TCC_FAKE_CUDA_CC", "100", 1);
    else unsetenv("TCC_FAKE_CUDA_CC");
    fake_reset();
    tcc_artifact a;
    Tcc__V1__Manifest *m;
    tcc_module *k = compile_and_load(b, &m, &a);
    ck_assert_int_ge(event_at(newer ? "load ptx" : "load cubin"), 0);
    ck_assert_int_lt(event_at(newer ? "load cubin" : "load ptx"), 0);
    const void *in[1] = {P(0x1000)};
    void *out[1] = {P(0x2000)};
    fake_reset();
    tcc_error err = {0};
    ck_assert_msg(tcc_module_run(k, in, out, P(0x3000), &err) == 0, "%s", err.msg);
    char want[128];
    snprintf(want, sizeof want, "launch k0_split g=%lld,1,1 b=256,1,1 s=0 stream=0 p=1000,2000,3000",
             (long long)m->kernels[0]->grid[0]);
    int si = event_at(want), fi = event_at("launch k0 g=1,1,1 ");
    ck_assert_msg(si >= 0 && fi > si, "want %s then k0 in\n%s", want, fake_events());
    ck_assert_int_ge(m->kernels[0]->grid[0], 2);
    tcc_module_unload(k);
    tcc__v1__manifest__free_unpacked(m, NULL);
    tcc_artifact_free(&a);
  }
  unsetenv("TCC_FAKE_CUDA_CC");
  reqb_free(b);
}
END_TEST

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

START_TEST(conv_step_then_epilogue) {
  reqb *b = reqb_conv_bias_relu(TCC__V1__DTYPE__FLOAT32);
  fake_reset();
  tcc_artifact a;
  Tcc__V1__Manifest *m;
  tcc_module *k = compile_and_load(b, &m, &a);
  ck_assert_int_eq((int)m->n_kernels, 2);
  ck_assert_ptr_nonnull(m->kernels[0]->conv);
  ck_assert_int_gt(event_at("cudnn create"), event_at("load cubin"));
  ck_assert_msg(event_at("cudnn filter ") >= 0 && strstr(fake_events(), "format=0 dims=12,4,3,3"), "%s",
                fake_events());
  ck_assert_msg(strstr(fake_events(), "dtype=0 dims=2,8,9,9 strides=648,81,9,1"), "%s", fake_events());
  ck_assert_msg(strstr(fake_events(), "dims=2,12,5,5 strides=300,25,5,1"), "%s", fake_events());
  ck_assert_msg(strstr(fake_events(), "pad=1,1 stride=2,2 dil=1,1 mode=1 compute=0"), "%s", fake_events());
  ck_assert_msg(strstr(fake_events(), "cudnn groups ") && strstr(strstr(fake_events(), "cudnn groups "), " 2\n"),
                "%s", fake_events());
  ck_assert_int_ge(event_at("cudnn algos fwd"), 0);
  /* float32 without TF32: FMA math (3), not the algorithm's tensor-op math */
  const char *math = strstr(fake_events(), "cudnn math ");
  ck_assert_ptr_nonnull(math);
  ck_assert_msg(strstr(math, " 3\n") == strchr(math, '\n') - 2, "%s", fake_events());
  ck_assert_ptr_null(strstr(math + 1, "cudnn math "));
  uint64_t ws = (uint64_t)tcc_module_workspace_bytes(k, NULL);
  ck_assert_uint_eq(ws, align256((uint64_t)m->workspace_bytes) + 4096);
  const void *in[3] = {P(0x10000), P(0x20000), P(0x30000)};
  void *out[1] = {P(0x40000)};
  for (int fail = 0; fail < 2; fail++) {
    if (fail) setenv("TCC_FAKE_CUDNN_FAIL", "1", 1);
    fake_reset();
    tcc_error err = {0};
    int rc = tcc_module_run(k, in, out, P(0x100000), &err);
    if (fail) {
      ck_assert_int_eq(rc, TCC_E_INTERNAL);
      ck_assert_msg(strstr(err.msg, "step 'k0' (launch 1 of 2): cudnnConvolutionForward: "
                                    "CUDNN_STATUS_EXECUTION_FAILED"), "%s", err.msg);
      unsetenv("TCC_FAKE_CUDNN_FAIL");
      continue;
    }
    ck_assert_msg(rc == 0, "%s", err.msg);
    char want[256];
    snprintf(want, sizeof want, "cudnn fwd algo=1 x=10000 w=20000 y=%llx ws=%llx ws_bytes=4096 alpha=1 beta=0 stream=0",
             (unsigned long long)(0x100000 + m->kernels[0]->conv->y->offset_bytes),
             (unsigned long long)(0x100000 + align256((uint64_t)m->workspace_bytes)));
    int ci = event_at(want), ki = event_at("launch k1 ");
    ck_assert_msg(ci >= 0, "want '%s' in\n%s", want, fake_events());
    ck_assert_msg(ki > ci, "the epilogue must follow the convolution:\n%s", fake_events());
  }
  /* a CUDA graph records the call with the launches */
  tcc_rt_cuda_kernel *ck = tcc_module_cuda(k);
  ck_assert_ptr_nonnull(ck);
  tcc_rt_cuda_kernel_set_graphs(ck, 1);
  void *stream = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_rt_cuda_stream_create(0, &stream, &err) == 0, "%s", err.msg);
  fake_reset();
  ck_assert_msg(tcc_rt_cuda_kernel_launch(ck, stream, in, out, P(0x100000), &err) == 0, "%s", err.msg);
  ck_assert_msg(event_at("cudnn fwd (captured) algo=1") >= 0, "%s", fake_events());
  ck_assert_msg(tcc_rt_cuda_stream_destroy(0, stream, &err) == 0, "%s", err.msg);
  tcc_module_unload(k);
  ck_assert_int_ge(event_at("cudnn destroy"), 0);
  /* an algorithm asking for 3 GiB of workspace is passed over for the next */
  setenv("TCC_FAKE_CUDNN_WS", "3221225472", 1);
  tcc_module *k2 = NULL;
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(a.sha256, sizeof a.sha256, hex);
  ck_assert_msg(tcc_module_load(a.data, a.size, hex, m, &k2, &err) == 0, "%s", err.msg);
  ck_assert_uint_eq((uint64_t)tcc_module_workspace_bytes(k2, NULL), (uint64_t)m->workspace_bytes);
  fake_reset();
  ck_assert_msg(tcc_module_run(k2, in, out, P(0x100000), &err) == 0, "%s", err.msg);
  ck_assert_msg(event_at("cudnn fwd algo=2 ") >= 0 && strstr(fake_events(), "ws_bytes=0"), "%s", fake_events());
  tcc_module_unload(k2);
  unsetenv("TCC_FAKE_CUDNN_WS");
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  reqb_free(b);
}
END_TEST

START_TEST(conv_step_without_cudnn) {
  reqb *b = reqb_conv_bias_relu(TCC__V1__DTYPE__FLOAT32);
  Tcc__V1__CompileRequest *req = reqb_req(b);
  tt_request_to_cuda(req, reqb_str(b, "sm_90"));
  tcc_error err = {0};
  tcc_prepared *p;
  ck_assert_msg(tcc_prepare(req, "plan-fake", &p, &err) == 0, "%s", err.msg);
  tcc_artifact a;
  ck_assert_msg(tcc_compile(p, NULL, &a, &err) == 0, "%s", err.msg);
  tcc_prepared_free(p);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a.manifest_len, a.manifest);
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(a.sha256, sizeof a.sha256, hex);
  setenv("TCC_FAKE_CUDA_NPARAMS", "5", 1);
  tcc_module *k = NULL;
  int rc = tcc_module_load(a.data, a.size, hex, m, &k, &err);
  ck_assert_int_eq(rc, TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_null(k);
  ck_assert_msg(strstr(err.msg, "libcudnn.so.9 not found") && strstr(err.msg, "TCC_CUDNN_LIBRARY"), "%s", err.msg);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  reqb_free(b);
}
END_TEST

int main(void) {
  tt_need_nvrtc();
  void *h = tt_fake_cuda_open();
  tt_fake_cuda_sym(h, "fake_cuda_events", &fake_events);
  tt_fake_cuda_sym(h, "fake_cuda_reset", &fake_reset);
  const char *no_cudnn = getenv("TCC_FAKE_NO_CUDNN");
  int rc = no_cudnn && *no_cudnn == '1'
               ? tt_run_tests("cuda plan (fake driver, no cuDNN)", 300, 1, (const TTest *[]){
                     conv_step_without_cudnn,
                     NULL})
               : tt_run_tests("cuda plan (fake driver)", 300, 1, (const TTest *[]){
                     gemm_then_epilogue,
                     split_reduction_and_ptx_fallback,
                     conv_step_then_epilogue,
                     NULL});
  dlclose(h);
  return rc;
}
