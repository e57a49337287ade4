/*
 * test_tune_gpu.c — CUDA autotuning on a real device (skips without one):
 *
 *   every candidate   each CUDA candidate config (compiler/tune.c) of a
 *                     pointwise kernel (sin(x) + cos(y), a size that is
 *                     no multiple of any block), a softmax with long rows
 *                     and one with short rows, and a split sum of 2 long
 *                     rows, built for the device's arch, launched through
 *                     the runtime's loader on fresh random inputs and
 *                     compared with a float64 reference;
 *   the tuning path   what the daemon does (daemon/autotune.c, through
 *                     daemon/tune_child.c): the GPU probe
 *                     (tccd-bench --probe) finds the device;
 *                     every candidate is benchmarked in the real
 *                     tccd-bench child (cuEvent timing) and its outputs
 *                     agree with the default's (tcc_bench_compare); the
 *                     fastest config per kernel is built and its outputs
 *                     match float64.
 *
 * Tolerances (float32): softmax |got - ref| <= 1e-5 |ref| + 1e-7;
 * sin + cos 4e-6 absolute; sums 2e-6 * sum |x|.
 * Inputs: uniform in [-3, 3) from the printed seed (TCC_TEST_SEED).
 * Skips (exit 77) without a CUDA driver and device, or without NVRTC.
 * TCC_BENCH_EXE names the benchmark child (meson sets it).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tcctest.h"
#include "tune_child.h"

static char dev_arch[16];
static unsigned seed;

/* ------------------------------------------------------------ the cases */

typedef struct tcase_def {
  const char *what;
  int64_t R, C;                  /* x [R, C] (and y for sin+cos) */
  int kind;                      /* 0 sin+cos, 1 softmax, 2 sum over dim 1 */
} tcase_def;

static const tcase_def CASES[] = {
  {"sin(x) + cos(y) [1000, 333]", 1000, 333, 0},
  {"softmax [64, 1000]", 64, 1000, 1},
  {"softmax [128, 20]", 128, 20, 1},
  {"sum [2, 300000] (split)", 2, 300000, 2},
};

static reqb *build(const tcase_def *c) {
  reqb *b = reqb_new("");
  int64_t sz[2] = {c->R, c->C};
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
  reqb_input(b, "x");
  if (c->kind == 0) {
    reqb_value(b, "y", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
    reqb_value(b, "s", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
    reqb_value(b, "k", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
    reqb_input(b, "y");
    reqb_unary(b, "aten.sin.default", "x", "s");
    reqb_unary(b, "aten.cos.default", "y", "k");
    reqb_binary(b, "aten.add.Tensor", "s", "k", "o");
  } else if (c->kind == 1) {
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
    Tcc__V1__Node *n = reqb_node(b, "aten._softmax.default", "o");
    reqb_arg_tensor(b, n, "self", "x");
    reqb_arg_int(b, n, "dim", 1);
    reqb_arg_bool(b, n, "half_to_float", 0);
  } else {
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 1, sz, NULL, 0);
    Tcc__V1__Node *n = reqb_node(b, "aten.sum.dim_IntList", "o");
    reqb_arg_tensor(b, n, "self", "x");
    reqb_arg_ints(b, n, "dim", 1, (int64_t[]){1});
  }
  reqb_output(b, "o");
  tt_request_to_cuda(reqb_req(b), reqb_str(b, dev_arch));
  return b;
}

/* Checks out (R x C, or R for sums) against float64 from x (and y). */
static void check_ref(const tcase_def *c, const float *x, const float *y, const float *out, const char *what) {
  int64_t R = c->R, C = c->C;
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C;
    if (c->kind == 0) {
      for (int64_t j = 0; j < C; j++) {
        double ref = sin((double)xr[j]) + cos((double)y[r * C + j]);
        ck_assert_msg(fabs(out[r * C + j] - ref) <= 4e-6, "%s [%lld, %lld]: %.9g, float64 %.9g (seed %u)", what,
                      (long long)r, (long long)j, out[r * C + j], ref, seed);
      }
    } else if (c->kind == 1) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < C; j++) mx = fmax(mx, xr[j]);
      for (int64_t j = 0; j < C; j++) sum += exp(xr[j] - mx);
      for (int64_t j = 0; j < C; j++) {
        double ref = exp(xr[j] - mx) / sum;
        ck_assert_msg(fabs(out[r * C + j] - ref) <= 1e-5 * fabs(ref) + 1e-7,
                      "%s [%lld, %lld]: %.9g, float64 %.9g (seed %u)", what, (long long)r, (long long)j,
                      out[r * C + j], ref, seed);
      }
    } else {
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < C; j++) ref += xr[j], mag += fabs(xr[j]);
      ck_assert_msg(fabs(out[r] - ref) <= 2e-6 * mag, "%s row %lld: %.9g, float64 %.9g (seed %u)", what,
                    (long long)r, out[r], ref, seed);
    }
  }
}

static float *random_floats(size_t n, unsigned *st) {
  float *p = malloc(n * sizeof *p + 1);
  for (size_t i = 0; i < n; i++) p[i] = (float)(-3.0 + 6.0 * ((double)rand_r(st) / ((double)RAND_MAX + 1.0)));
  return p;
}

/* Builds c with configs[k] for every live kernel, runs it once on the
 * device on x (and y) and checks the output against float64. */
static void run_and_check(const tcase_def *c, const tcc_kernel_config *cfg, int nk, const char *what) {
  reqb *b = build(c);
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), "gpu-tune-test", &p, &err) == 0, "%s: %s", what, err.msg);
  tcc_artifact a;
  ck_assert_msg(tcc_compile_tuned(p, NULL, cfg, nk, 0, &a, &err) == 0, "%s: %s", what, err.msg);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a.manifest_len, a.manifest);
  ck_assert_ptr_nonnull(m);
  unsigned st = seed ^ (unsigned)strlen(what) * 2654435761u;
  size_t n = (size_t)(c->R * c->C), nout = c->kind == 2 ? (size_t)c->R : n;
  float *x = random_floats(n, &st), *y = c->kind == 0 ? random_floats(n, &st) : NULL;
  float *out = calloc(nout, sizeof *out);
  void *din[2] = {NULL, NULL}, *dout[1] = {NULL}, *dws = NULL;
  TT_OK(tcc_rt_cuda_malloc(0, n * 4, &din[0], &e_));
  TT_OK(tcc_rt_cuda_memcpy_htod(0, din[0], x, n * 4, &e_));
  if (y) {
    TT_OK(tcc_rt_cuda_malloc(0, n * 4, &din[1], &e_));
    TT_OK(tcc_rt_cuda_memcpy_htod(0, din[1], y, n * 4, &e_));
  }
  TT_OK(tcc_rt_cuda_malloc(0, nout * 4, &dout[0], &e_));
  if (m->workspace_bytes) TT_OK(tcc_rt_cuda_malloc(0, (size_t)m->workspace_bytes, &dws, &e_));
  tcc_rt_cuda_kernel *k;
  TT_OK(tcc_rt_cuda_kernel_load_manifest(a.data, a.size, NULL, m, NULL, &k, &e_));
  TT_OK(tcc_rt_cuda_kernel_launch(k, NULL, (const void *const *)din, dout, dws, &e_));
  TT_OK(tcc_rt_cuda_synchronize(0, NULL, &e_));
  TT_OK(tcc_rt_cuda_memcpy_dtoh(0, out, dout[0], nout * 4, &e_));
  check_ref(c, x, y, out, what);
  tcc_rt_cuda_kernel_unload(k);
  TT_OK(tcc_rt_cuda_free(0, din[0], &e_));
  TT_OK(tcc_rt_cuda_free(0, din[1], &e_));
  TT_OK(tcc_rt_cuda_free(0, dout[0], &e_));
  TT_OK(tcc_rt_cuda_free(0, dws, &e_));
  free(x);
  free(y);
  free(out);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  tcc_prepared_free(p);
  reqb_free(b);
}

/* Case c built (*b) and prepared (*p), and its tuning signatures; the caller
 * frees all three. */
static void prepare_case(const tcase_def *c, reqb **b, tcc_prepared **p, tcc_tune_signatures *sigs) {
  *b = build(c);
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(*b), "gpu-tune-test", p, &err) == 0, "%s", err.msg);
  ck_assert_msg(tcc_tune_signatures_make(*p, sigs, &err) == 0, "%s", err.msg);
}

/* Live kernels of case c. */
static int live_kernels(const tcase_def *c) {
  reqb *b;
  tcc_prepared *p;
  tcc_tune_signatures sigs;
  prepare_case(c, &b, &p, &sigs);
  int nk = sigs.nkernels;
  tcc_tune_signatures_free(&sigs);
  tcc_prepared_free(p);
  reqb_free(b);
  return nk;
}

START_TEST(every_candidate_vs_float64) {
  tcc_kernel_config cands[TCC_TUNE_MAX_CANDIDATES];
  int nc = tcc_tune_candidates(TCC__V1__DEVICE_TYPE__CUDA, cands);
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    int nk = live_kernels(&CASES[i]);
    for (int c = 0; c < nc; c++) {
      tcc_kernel_config *cfg = calloc((size_t)nk, sizeof *cfg);
      for (int k = 0; k < nk; k++) cfg[k] = cands[c];
      char what[256], text[TCC_TUNE_CONFIG_TEXT];
      snprintf(what, sizeof what, "%s, candidate %d (%s)", CASES[i].what, c,
               tcc_kernel_config_format(&cands[c], text, sizeof text));
      run_and_check(&CASES[i], cfg, nk, what);
      free(cfg);
    }
    printf("  %s: %d candidates match float64\n", CASES[i].what, nc);
  }
}
END_TEST

START_TEST(tuning_path_on_the_gpu) {
  const char *exe = getenv("TCC_BENCH_EXE");
  ck_assert_msg(exe && *exe, "TCC_BENCH_EXE is not set");
  tccd_gpu_probe_result probe;
  TT_OK(tccd_gpu_probe(exe, 60000, &probe, &e_));
  ck_assert_int_ge(probe.ndevices, 1);
  ck_assert_str_eq(probe.device[0].arch, dev_arch);
  ck_assert_int_eq(tccd_gpu_pick(&probe, dev_arch), 0);
  tcc_kernel_config cands[TCC_TUNE_MAX_CANDIDATES];
  int nc = tcc_tune_candidates(TCC__V1__DEVICE_TYPE__CUDA, cands);
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    const tcase_def *tc = &CASES[i];
    reqb *b;
    tcc_prepared *p;
    tcc_tune_signatures sigs;
    prepare_case(tc, &b, &p, &sigs);
    tcc_error err;
    int nk = sigs.nkernels;
    tcc_bench_result res[TCC_TUNE_MAX_CANDIDATES];
    tcc_artifact ref_art;
    memset(&ref_art, 0, sizeof ref_art);
    tccd_bench_options o = {.bench_exe = exe, .timeout_ms = 120000, .reps = 9, .input_sets = 3,
                           .seed = seed, .cuda_device = 0};
    tcc_kernel_config *best = calloc((size_t)nk, sizeof *best);
    double *best_ns = calloc((size_t)nk, sizeof *best_ns);
    for (int c = 0; c < nc; c++) {
      tcc_kernel_config *cfg = calloc((size_t)nk, sizeof *cfg);
      for (int k = 0; k < nk; k++) cfg[k] = cands[c];
      tcc_artifact a;
      ck_assert_msg(tcc_compile_tuned(p, NULL, cfg, nk, 1, &a, &err) == 0, "%s: %s", tc->what, err.msg);
      o.candidate = c;
      ck_assert_msg(tccd_bench_run(&o, &a, &res[c], &err) == 0, "%s candidate %d: %s", tc->what, c, err.msg);
      ck_assert_int_eq(res[c].nkernels, nk);
      ck_assert_int_eq(res[c].entry_bad, 0);
      for (int k = 0; k < nk; k++) {
        ck_assert_msg(res[c].kernel_ns[k] > 0 && res[c].kernel_ns[k] < 1e9, "%s candidate %d k%d: %.1f ns", tc->what,
                      c, k, res[c].kernel_ns[k]);
        if (c == 0 || res[c].kernel_ns[k] < best_ns[k]) best[k] = cands[c], best_ns[k] = res[c].kernel_ns[k];
      }
      if (c == 0) {
        ref_art = a;
      } else {
        ck_assert_msg(tcc_bench_compare(ref_art.manifest, ref_art.manifest_len, &res[0], &res[c], &err) == 0,
                      "%s candidate %d: %s", tc->what, c, err.msg);
        tcc_artifact_free(&a);
      }
      free(cfg);
    }
    char text[TCC_TUNE_CONFIG_TEXT];
    printf("  %s: default %.0f ns, best %.0f ns (%s)\n", tc->what, res[0].kernel_ns[0], best_ns[0],
           tcc_kernel_config_format(&best[0], text, sizeof text));
    char what[256];
    snprintf(what, sizeof what, "%s, tuned", tc->what);
    run_and_check(tc, best, nk, what);
    for (int c = 0; c < nc; c++) tcc_bench_result_free(&res[c]);
    tcc_artifact_free(&ref_art);
    free(best);
    free(best_ns);
    tcc_tune_signatures_free(&sigs);
    tcc_prepared_free(p);
    reqb_free(b);
  }
}
END_TEST

int main(void) {
  tt_need_gpu(dev_arch, NULL, 0);
  seed = (unsigned)tt_seed("test_tune_gpu");
  printf("device %s\n", dev_arch);
  return tt_run_tests("cuda tune gpu", 900, 1, (const TTest *[]){
      every_candidate_vs_float64,
      tuning_path_on_the_gpu,
      NULL}); /* one CUDA context for the process */
}
