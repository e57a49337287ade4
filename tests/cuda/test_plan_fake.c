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

int main(void) {
  tt_need_nvrtc();
  void *h = tt_fake_cuda_open();
  tt_fake_cuda_sym(h, "fake_cuda_events", &fake_events);
  tt_fake_cuda_sym(h, "fake_cuda_reset", &fake_reset);
  int rc = tt_run_tests("cuda plan (fake driver)", 300, 1, (const TTest *[]){
      gemm_then_epilogue,
      split_reduction_and_ptx_fallback,
      NULL});
  dlclose(h);
  return rc;
}
