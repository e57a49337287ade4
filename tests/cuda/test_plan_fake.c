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
 *                       cubin (FAKE_CUDA_CC=100 for an sm_90 artifact)
 *
 * Skips (exit 77) without NVRTC or when TCC_CUDA_LIBRARY is not the fake.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "cutest.h"
#include "nvrtc.h"
#include "reqb.h"
#include "tcc_runtime.h"
#include "tccclient.h"

static const char *(*fake_events)(void);
static void (*fake_reset)(void);

#define P(x) ((void *)(uintptr_t)(x))

/* Index of the first event line starting with prefix, -1 when none. */
static int event_at(const char *prefix) {
  int i = 0;
  for (const char *line = fake_events(); *line; i++) {
    if (!strncmp(line, prefix, strlen(prefix))) return i;
    const char *nl = strchr(line, '\n');
    if (!nl) break;
    line = nl + 1;
  }
  return -1;
}

/* Compiles b for sm_90 and loads it through the generic client path. */
static tcc_kernel *compile_and_load(reqb *b, Tcc__V1__Manifest **mout, tcc_artifact *a) {
  Tcc__V1__CompileRequest *req = reqb_req(b);
  req->target->device = TCC__V1__DEVICE_TYPE__CUDA;
  req->target->cuda_arch = reqb_str(b, "sm_90");
  for (size_t i = 0; i < req->graph->n_values; i++) req->graph->values[i]->meta->device->type = TCC__V1__DEVICE_TYPE__CUDA;
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
  setenv("FAKE_CUDA_NPARAMS", np, 1);
  tcc_kernel *k = NULL;
  ck_assert_msg(tcc_kernel_load(a->data, a->size, hex, m, &k, &err) == 0, "%s", err.msg);
  *mout = m;
  return k;
}

START_TEST(gemm_then_epilogue) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){20, 64}, NULL, 0);
  reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){96, 64}, NULL, 0);
  reqb_value(b, "bias", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){96}, NULL, 0);
  reqb_value(b, "l", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){20, 96}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){20, 96}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_input(b, "bias");
  Tcc__V1__Node *n = reqb_node(b, "aten.linear.default", "l");
  reqb_arg_tensor(b, n, "input", "x");
  reqb_arg_tensor(b, n, "weight", "w");
  reqb_arg_tensor(b, n, "bias", "bias");
  reqb_unary(b, "aten.gelu.default", "l", "o");
  reqb_output(b, "o");
  fake_reset();
  tcc_artifact a;
  Tcc__V1__Manifest *m;
  tcc_kernel *k = compile_and_load(b, &m, &a);
  ck_assert_int_ge(event_at("load cubin"), 0);
  ck_assert_int_gt(event_at("cublas create"), event_at("load cubin"));
  ck_assert_int_eq((int)m->n_kernels, 2);
  const Tcc__V1__GemmStep *g = m->kernels[0]->gemm;
  ck_assert_ptr_nonnull(g);
  const void *in[3] = {P(0x10000), P(0x20000), P(0x30000)};
  void *out[1] = {P(0x40000)};
  fake_reset();
  tcc_error err = {0};
  ck_assert_msg(tcc_kernel_run(k, in, out, P(0x50000), &err) == 0, "%s", err.msg);
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
  tcc_kernel_unload(k);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  reqb_free(b);
}
END_TEST

START_TEST(split_reduction_and_ptx_fallback) {
  int64_t n20 = INT64_C(1) << 20;
  reqb *b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 1, &n20, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 0, NULL, NULL, 0);
  reqb_input(b, "x");
  reqb_unary(b, "aten.sum.default", "x", "o");
  reqb_output(b, "o");
  for (int newer = 0; newer < 2; newer++) {
    if (newer) setenv("FAKE_CUDA_CC", "100", 1);
    else unsetenv("FAKE_CUDA_CC");
    fake_reset();
    tcc_artifact a;
    Tcc__V1__Manifest *m;
    tcc_kernel *k = compile_and_load(b, &m, &a);
    ck_assert_int_ge(event_at(newer ? "load ptx" : "load cubin"), 0);
    ck_assert_int_lt(event_at(newer ? "load cubin" : "load ptx"), 0);
    const void *in[1] = {P(0x1000)};
    void *out[1] = {P(0x2000)};
    fake_reset();
    tcc_error err = {0};
    ck_assert_msg(tcc_kernel_run(k, in, out, P(0x3000), &err) == 0, "%s", err.msg);
    char want[128];
    snprintf(want, sizeof want, "launch k0_split g=%lld,1,1 b=256,1,1 s=0 stream=0 p=1000,2000,3000",
             (long long)m->kernels[0]->grid[0]);
    int si = event_at(want), fi = event_at("launch k0 g=1,1,1 ");
    ck_assert_msg(si >= 0 && fi > si, "want %s then k0 in\n%s", want, fake_events());
    ck_assert_int_ge(m->kernels[0]->grid[0], 2);
    tcc_kernel_unload(k);
    tcc__v1__manifest__free_unpacked(m, NULL);
    tcc_artifact_free(&a);
  }
  unsetenv("FAKE_CUDA_CC");
  reqb_free(b);
}
END_TEST

int main(void) {
  tcc_error err = {0};
  if (tcc_nvrtc_available(&err)) cutest_skip("%s", err.msg);
  const char *path = getenv("TCC_CUDA_LIBRARY");
  if (!path || !strstr(path, "fake")) cutest_skip("TCC_CUDA_LIBRARY must name fake_libcuda.so");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) cutest_skip("cannot load %s: %s", path, dlerror());
  void *s1 = dlsym(h, "fake_cuda_events"), *s2 = dlsym(h, "fake_cuda_reset");
  if (!s1 || !s2) cutest_skip("not the fake driver");
  memcpy(&fake_events, &s1, sizeof s1);
  memcpy(&fake_reset, &s2, sizeof s2);
  Suite *s = suite_create("cuda plan (fake driver)");
  TCase *tc = tcase_create("plan");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, gemm_then_epilogue);
  tcase_add_test(tc, split_reduction_and_ptx_fallback);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  dlclose(h);
  return failed ? 1 : 0;
}
