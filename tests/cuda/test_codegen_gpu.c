/*
 * test_codegen_gpu.c — kernels that tcc_compile generates for CUDA
 * (compiler/cuda/schedule.c, emit.c) run on a real device through the
 * runtime's Driver API loader (runtime/tcc_runtime.h: cubin + Manifest
 * launch plan, ABI 1), compared with the CPU backend's .so (itself tested
 * against float64 references) on the same fresh random inputs (seed printed;
 * TCC_TEST_SEED replays it):
 *
 *   pointwise   sin(x) + cos(y) with broadcasting; float16 and bfloat16
 *               (x * 2 + 1); a 1-D tensor past the grid (grid-stride)
 *   reduction   softmax and log_softmax rows of 1, 33, 1000, 5000
 *               columns (one kernel: block reductions with warp
 *               shuffles), and 2048 rows of 197 (a warp per row);
 *               native_layer_norm (out, mean, rstd; 19 and 2048 rows of
 *               768: a block, a warp per row); sum over
 *               dim 0 (a column reduction); argmax with ties
 *   matmul      cuBLAS steps (float32 without TF32, float16/bfloat16 with
 *               float32 accumulation, float64) with bias/gelu epilogues,
 *               against float64 references; split reductions (sum of
 *               2^24 values; sums of x and x^2, split together) against
 *               float64 sums
 *
 * Tolerances: float32 |gpu - cpu| <= 2e-5 + 2e-5 |cpu| (different
 * summation orders and device math within 2 ulp); half types one unit of
 * their last place; int64 exact.
 * Skips (exit 77, "SKIP: no CUDA device (reason)") without a driver and
 * device, or without NVRTC. Run on a GPU machine with scripts/gpu-check.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler.h"
#include "tcc_nvrtc.h"
#include "tcc_dtype.h"
#include "tcc_runtime.h"
#include "tcctest.h"

static char dev_arch[16];
static unsigned seed;
static char *tmpdir;

static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Random bytes of a tensor: floats in [-3, 3), ints in [0, 7). */
static void fill(void *buf, size_t bytes, Tcc__V1__DType dt, unsigned *st) {
  size_t es = tcc_dtype_size(dt), n = bytes / es;
  for (size_t i = 0; i < n; i++) {
    double v = -3.0 + 6.0 * ((double)rand_r(st) / ((double)RAND_MAX + 1.0));
    char *p = (char *)buf + i * es;
    switch (dt) {
    case TCC__V1__DTYPE__FLOAT32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case TCC__V1__DTYPE__FLOAT64: memcpy(p, &v, 8); break;
    case TCC__V1__DTYPE__FLOAT16: {   /* a float16 from its bits: small normals */
      uint16_t h = (uint16_t)(((rand_r(st) & 1) << 15) | ((12 + rand_r(st) % 5) << 10) | (rand_r(st) & 0x3ff));
      memcpy(p, &h, 2);
      break;
    }
    case TCC__V1__DTYPE__BFLOAT16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      uint16_t h = (uint16_t)(u >> 16);
      memcpy(p, &h, 2);
      break;
    }
    case TCC__V1__DTYPE__INT64: { int64_t k = rand_r(st) % 7; memcpy(p, &k, 8); break; }
    default: memset(p, rand_r(st) % 7, es); break;
    }
  }
}

/* Compiles req for target (CPU when arch is NULL). */
static void compile(Tcc__V1__CompileRequest *req, reqb *b, const char *arch, tcc_artifact *a,
                    tcc_prepared **pp) {
  if (arch) tt_request_to_cuda(req, reqb_str(b, arch));
  else tt_request_to_cpu(req);
  tcc_error err;
  ck_assert_msg(tcc_prepare(req, "gpu-test", pp, &err) == 0, "prepare: %s", err.msg);
  ck_assert_msg(tcc_compile(*pp, NULL, a, &err) == 0, "compile for %s: %s", arch ? arch : "cpu", err.msg);
}

/* Compiles req for the device, runs it once on fresh random inputs
 * (contiguous) and returns host copies of inputs and outputs (caller
 * frees each, and the arrays) and the manifest. */
static Tcc__V1__Manifest *gpu_run(reqb *b, const char *what, void ***hin_out, void ***hout_out) {
  Tcc__V1__CompileRequest *req = reqb_req(b);
  tcc_artifact ga;
  tcc_prepared *gp;
  compile(req, b, dev_arch, &ga, &gp);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, ga.manifest_len, ga.manifest);
  ck_assert_ptr_nonnull(m);
  size_t ni = m->n_inputs, no = m->n_outputs;
  void **hin = calloc(ni + 1, sizeof *hin), **din = calloc(ni + 1, sizeof *din);
  void **hout = calloc(no + 1, sizeof *hout), **dout = calloc(no + 1, sizeof *dout);
  unsigned st = seed ^ (unsigned)strlen(what);
  for (size_t i = 0; i < ni; i++) {
    size_t n = tt_meta_bytes(m->inputs[i]);
    hin[i] = malloc(n + 1);
    fill(hin[i], n, m->inputs[i]->dtype, &st);
    TT_OK(tcc_rt_cuda_malloc(0, n + 1, &din[i], &e_));
    TT_OK(tcc_rt_cuda_memcpy_htod(0, din[i], hin[i], n, &e_));
  }
  for (size_t o = 0; o < no; o++) {
    size_t n = tt_meta_bytes(m->outputs[o]);
    hout[o] = calloc(1, n + 1);
    TT_OK(tcc_rt_cuda_malloc(0, n + 1, &dout[o], &e_));
  }
  void *dws = NULL;
  if (m->workspace_bytes) TT_OK(tcc_rt_cuda_malloc(0, (size_t)m->workspace_bytes, &dws, &e_));
  tcc_rt_cuda_kernel *k;
  TT_OK(tcc_rt_cuda_kernel_load_manifest(ga.data, ga.size, NULL, m, NULL, &k, &e_));
  TT_OK(tcc_rt_cuda_kernel_launch(k, NULL, (const void *const *)din, dout, dws, &e_));
  TT_OK(tcc_rt_cuda_synchronize(0, NULL, &e_));
  for (size_t o = 0; o < no; o++)
    TT_OK(tcc_rt_cuda_memcpy_dtoh(0, hout[o], dout[o], tt_meta_bytes(m->outputs[o]), &e_));
  tcc_rt_cuda_kernel_unload(k);
  for (size_t i = 0; i < ni; i++) TT_OK(tcc_rt_cuda_free(0, din[i], &e_));
  for (size_t o = 0; o < no; o++) TT_OK(tcc_rt_cuda_free(0, dout[o], &e_));
  if (dws) TT_OK(tcc_rt_cuda_free(0, dws, &e_));
  free(din);
  free(dout);
  tcc_artifact_free(&ga);
  tcc_prepared_free(gp);
  *hin_out = hin;
  *hout_out = hout;
  return m;
}

static void free_all(void **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

static double elem(const void *buf, Tcc__V1__DType dt, size_t i);

/* Row sums of the float32 [rows, cols] input hin[0] (and, sums == 2,
 * of its squares) in hout[0] (hout[1]) against float64 sums of the same
 * terms: float32 partials stay within 1e-6 of sum|term|. */
static void sums_match_float64(void **hin, void **hout, int64_t rows, int64_t cols, int sums, const char *what) {
  for (int q = 0; q < sums; q++)
    for (int64_t r = 0; r < rows; r++) {
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < cols; j++) {
        double v = elem(hin[0], TCC__V1__DTYPE__FLOAT32, (size_t)(r * cols + j));
        v = q ? (double)((float)v * (float)v) : v;
        ref += v;
        mag += fabs(v);
      }
      double got = elem(hout[q], TCC__V1__DTYPE__FLOAT32, (size_t)r);
      ck_assert_msg(fabs(got - ref) <= 1e-6 * mag, "%s: sum %d row %lld: gpu %.9g, float64 %.9g (seed %u)", what, q,
                    (long long)r, got, ref, seed);
    }
}

/* Runs req on the GPU (gpu_run) and on the CPU backend on the same
 * inputs; compares every output. */
static void run_and_compare(reqb *b, const char *what) {
  void **hin, **gout;
  Tcc__V1__Manifest *m = gpu_run(b, what, &hin, &gout);
  tcc_artifact ca;
  tcc_prepared *cp;
  compile(reqb_req(b), b, NULL, &ca, &cp);
  Tcc__V1__Manifest *cm = tcc__v1__manifest__unpack(NULL, ca.manifest_len, ca.manifest);
  ck_assert_ptr_nonnull(cm);
  /* the CPU reference */
  void *lib = tt_load_kernel(tmpdir, "ref.so", ca.data, ca.size);
  ck_assert_msg(lib != NULL, "%s", dlerror());
  int (*entry)(const void *const *, void *const *, void *) =
      (int (*)(const void *const *, void *const *, void *))dlsym(lib, "tcc_entry");
  ck_assert_ptr_nonnull(entry);
  size_t no = m->n_outputs;
  void **hout = calloc(no + 1, sizeof *hout);
  for (size_t o = 0; o < no; o++) hout[o] = calloc(1, tt_meta_bytes(m->outputs[o]) + 1);
  void *ws = malloc((size_t)cm->workspace_bytes + 64);
  void *cws = (void *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
  ck_assert_int_eq(entry((const void *const *)hin, hout, cws), 0);

  for (size_t o = 0; o < no; o++) {
    const Tcc__V1__TensorMeta *om = m->outputs[o];
    size_t n = tt_meta_bytes(om), es = tcc_dtype_size(om->dtype), bad = 0;
    for (size_t i = 0; i < n / es; i++) {
      double want, got, tol;
      const char *c = (const char *)hout[o] + i * es, *g = (const char *)gout[o] + i * es;
      switch (om->dtype) {
      case TCC__V1__DTYPE__FLOAT32: {
        float x, y;
        memcpy(&x, c, 4);
        memcpy(&y, g, 4);
        want = x, got = y, tol = 2e-5 + 2e-5 * fabs(want);
        break;
      }
      case TCC__V1__DTYPE__FLOAT64: {
        memcpy(&want, c, 8);
        memcpy(&got, g, 8);
        tol = 1e-12 + 1e-12 * fabs(want);
        break;
      }
      case TCC__V1__DTYPE__FLOAT16:
      case TCC__V1__DTYPE__BFLOAT16: {
        uint16_t x, y;
        memcpy(&x, c, 2);
        memcpy(&y, g, 2);
        int h = om->dtype == TCC__V1__DTYPE__FLOAT16;
        want = h ? half_to_float(x) : bf16_to_float(x);
        got = h ? half_to_float(y) : bf16_to_float(y);
        tol = (h ? 0x1p-10 : 0x1p-7) * (fabs(want) + 1e-3);
        break;
      }
      case TCC__V1__DTYPE__INT64: {
        int64_t x, y;
        memcpy(&x, c, 8);
        memcpy(&y, g, 8);
        want = (double)x, got = (double)y, tol = 0;
        break;
      }
      default: want = (unsigned char)*c, got = (unsigned char)*g, tol = 0; break;
      }
      if (!(fabs(want - got) <= tol) && !(isnan(want) && isnan(got))) {
        if (bad < 5) printf("  %s: output %zu element %zu: gpu %.9g, cpu %.9g\n", what, o, i, got, want);
        bad++;
      }
    }
    ck_assert_msg(bad == 0, "%s: output %zu: %zu of %zu elements differ (seed %u)", what, o, bad, n / es, seed);
  }
  printf("  %s: %zu kernel%s, gpu == cpu\n", what, m->n_kernels, m->n_kernels == 1 ? "" : "s");
  free_all(hin, m->n_inputs);
  free_all(hout, no);
  free_all(gout, no);
  free(ws);
  dlclose(lib);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc__v1__manifest__free_unpacked(cm, NULL);
  tcc_artifact_free(&ca);
  tcc_prepared_free(cp);
}

START_TEST(pointwise) {
  reqb *b = reqb_sin_cos_rows(300, 257);
  run_and_compare(b, "sin(x) + cos(y) [300, 257] + [257]");
  reqb_free(b);

  /* past one grid: grid-stride */
  int64_t big = (int64_t)65536 * 256 * 2 + 77;
  b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 1, &big, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 1, &big, NULL, 0);
  reqb_input(b, "x");
  reqb_unary(b, "aten.tanh.default", "x", "o");
  reqb_output(b, "o");
  run_and_compare(b, "tanh over 2 grids");
  reqb_free(b);
}
END_TEST

START_TEST(half_types) {
  static const Tcc__V1__DType dts[] = {TCC__V1__DTYPE__FLOAT16, TCC__V1__DTYPE__BFLOAT16};
  for (int i = 0; i < 2; i++) {
    reqb *b = reqb_new("");
    reqb_value(b, "x", dts[i], 2, (int64_t[]){33, 65}, NULL, 0);
    reqb_value(b, "e", dts[i], 2, (int64_t[]){33, 65}, NULL, 0);
    reqb_value(b, "o", dts[i], 2, (int64_t[]){33, 65}, NULL, 0);
    reqb_input(b, "x");
    reqb_unary(b, "aten.exp.default", "x", "e");
    Tcc__V1__Node *n = reqb_node(b, "aten.mul.Tensor", "o");
    reqb_arg_tensor(b, n, "self", "e");
    reqb_arg_tensor(b, n, "other", "x");
    reqb_output(b, "o");
    run_and_compare(b, i ? "bfloat16 exp(x) * x" : "float16 exp(x) * x");
    reqb_free(b);
  }
}
END_TEST

static void softmax(const char *target, int64_t R, int64_t C) {
  reqb *b = reqb_softmax(target, TCC__V1__DTYPE__FLOAT32, R, C);
  char what[128];
  snprintf(what, sizeof what, "%s [%lld, %lld]", target, (long long)R, (long long)C);
  run_and_compare(b, what);
  reqb_free(b);
}

START_TEST(softmax_rows) {
  static const int64_t cols[] = {1, 33, 1000, 5000};
  for (int i = 0; i < 4; i++) {
    softmax("aten._softmax.default", 37, cols[i]);
    softmax("aten._log_softmax.default", 5, cols[i]);
  }
  softmax("aten._softmax.default", 2048, 197);        /* many rows: a warp each */
  softmax("aten._log_softmax.default", 2048, 197);
}
END_TEST

START_TEST(layer_norm_sum_argmax) {
  reqb *b = reqb_layer_norm(TCC__V1__DTYPE__FLOAT32, 19, 768, 1);
  run_and_compare(b, "native_layer_norm [19, 768]");
  reqb_free(b);
  b = reqb_layer_norm(TCC__V1__DTYPE__FLOAT32, 2048, 768, 1);
  run_and_compare(b, "native_layer_norm [2048, 768] (a warp per row)");
  reqb_free(b);
  /* two sums folded in one loop: against float64, since a sum's rounding
   * follows its order (|err| <= 1e-6 sum|term|, not 2e-5 of a result that
   * cancels) */
  b = reqb_sum_and_squares(37, 3000);
  void **hin, **hout;
  Tcc__V1__Manifest *m = gpu_run(b, "sum and sum of squares", &hin, &hout);
  sums_match_float64(hin, hout, 37, 3000, 2, "sum and sum of squares [37, 3000]");
  printf("  sum and sum of squares [37, 3000]: %zu kernel, matches float64\n", m->n_kernels);
  free_all(hin, m->n_inputs);
  free_all(hout, m->n_outputs);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);

  static const int64_t dim0[1] = {0};
  b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){1000, 3}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){3}, NULL, 0);
  reqb_input(b, "x");
  Tcc__V1__Node *n = reqb_node(b, "aten.sum.dim_IntList", "o");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_ints(b, n, "dim", 1, dim0);
  reqb_output(b, "o");
  run_and_compare(b, "sum over dim 0 of [1000, 3]");
  reqb_free(b);

  /* int64 inputs in [0, 7): many ties, first index wins */
  b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__INT64, 2, (int64_t[]){9, 700}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__INT64, 1, (int64_t[]){9}, NULL, 0);
  reqb_input(b, "x");
  n = reqb_node(b, "aten.argmax.default", "o");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_int(b, n, "dim", 1);
  reqb_output(b, "o");
  run_and_compare(b, "argmax with ties [9, 700]");
  reqb_free(b);
}
END_TEST

/* ------------------------------------------ against float64 references */

/* Element i of a host tensor of dtype dt, as double. */
static double elem(const void *buf, Tcc__V1__DType dt, size_t i) {
  const char *p = (const char *)buf + i * tcc_dtype_size(dt);
  switch (dt) {
  case TCC__V1__DTYPE__FLOAT32: { float f; memcpy(&f, p, 4); return f; }
  case TCC__V1__DTYPE__FLOAT64: { double d; memcpy(&d, p, 8); return d; }
  case TCC__V1__DTYPE__FLOAT16: { uint16_t h; memcpy(&h, p, 2); return half_to_float(h); }
  case TCC__V1__DTYPE__BFLOAT16: { uint16_t h; memcpy(&h, p, 2); return bf16_to_float(h); }
  default: return 0;
  }
}

/* [B, M, K] @ [B or 1, K, N] (+ bias[N]) (then gelu) against float64;
 * out dtype dt (inputs dt). tol: relative to sum_k |a||b| plus the
 * output's own rounding. */
static void matmul_case(const char *what, Tcc__V1__DType dt, int64_t B, int64_t M, int64_t K, int64_t N,
                        int b_batched, int bias, int gelu) {
  reqb *b = reqb_new("");
  int64_t xs[3] = {B, M, K}, ws[3] = {B, K, N}, os[3] = {B, M, N};
  reqb_value(b, "x", dt, 3, xs, NULL, 0);
  reqb_value(b, "w", dt, b_batched ? 3 : 2, b_batched ? ws : ws + 1, NULL, 0);
  reqb_value(b, "mm", dt, 3, os, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_binary(b, b_batched ? "aten.bmm.default" : "aten.matmul.default", "x", "w", "mm");
  if (b_batched) reqb_req(b)->graph->nodes[0]->inputs[1]->name = reqb_str(b, "mat2");
  const char *last = "mm";
  if (bias) {
    reqb_value(b, "bias", dt, 1, (int64_t[]){N}, NULL, 0);
    reqb_value(b, "ab", dt, 3, os, NULL, 0);
    reqb_input(b, "bias");
    reqb_binary(b, "aten.add.Tensor", "mm", "bias", "ab");
    last = "ab";
  }
  if (gelu) {
    reqb_value(b, "g", dt, 3, os, NULL, 0);
    reqb_unary(b, "aten.gelu.default", last, "g");
    last = "g";
  }
  reqb_output(b, last);
  void **hin, **hout;
  Tcc__V1__Manifest *m = gpu_run(b, what, &hin, &hout);
  int has_gemm = 0;
  for (size_t k = 0; k < m->n_kernels; k++) has_gemm |= m->kernels[k]->gemm != NULL;
  ck_assert_msg(has_gemm, "%s: no cuBLAS step", what);
  double out_ulp = dt == TCC__V1__DTYPE__FLOAT16 ? 0x1p-11 : dt == TCC__V1__DTYPE__BFLOAT16 ? 0x1p-8
                 : dt == TCC__V1__DTYPE__FLOAT64 ? 0x1p-52 : 0x1p-23;
  double acc_eps = dt == TCC__V1__DTYPE__FLOAT64 ? 1e-14 : 1e-5;   /* float32 accumulation, no TF32 */
  size_t bad = 0;
  double worst = 0;
  for (int64_t bb = 0; bb < B; bb++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
          double a = elem(hin[0], dt, (size_t)((bb * M + i) * K + k));
          double w = elem(hin[1], dt, (size_t)(((b_batched ? bb : 0) * K + k) * N + j));
          ref += a * w;
          mag += fabs(a * w);
        }
        /* the product is rounded to dt before the epilogue (as in eager) */
        double product = fabs(ref);
        if (bias) ref += elem(hin[2], dt, (size_t)j), mag += fabs(elem(hin[2], dt, (size_t)j));
        if (gelu) ref = 0.5 * ref * (1.0 + erf(ref / sqrt(2.0)));
        double got = elem(hout[0], dt, (size_t)((bb * M + i) * N + j));
        double tol = acc_eps * mag + 2 * out_ulp * (fabs(ref) + product) + 1e-30;
        double e = fabs(got - ref);
        if (e / (mag + 1e-30) > worst) worst = e / (mag + 1e-30);
        if (!(e <= tol)) {
          if (bad < 5) printf("  %s: [%lld, %lld, %lld]: gpu %.9g, float64 %.9g\n", what, (long long)bb, (long long)i,
                              (long long)j, got, ref);
          bad++;
        }
      }
  ck_assert_msg(bad == 0, "%s: %zu of %lld elements differ from float64 (seed %u)", what, bad,
                (long long)(B * M * N), seed);
  printf("  %s: %zu steps, max |err| / sum|a*b| = %.3g vs float64\n", what, m->n_kernels, worst);
  free_all(hin, m->n_inputs);
  free_all(hout, m->n_outputs);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
}

/* Whether a library the client dlopens (cuBLAS, cuDNN) loads here the
 * way the client loads it: the path in env, else soname, else fallback. */
static int have_library(const char *env, const char *soname, const char *fallback) {
  const char *path = getenv(env);
  const char *names[] = {path && *path ? path : soname, path && *path ? NULL : fallback};
  for (int i = 0; i < 2; i++) {
    void *h = names[i] ? dlopen(names[i], RTLD_NOW | RTLD_LOCAL) : NULL;
    if (h) {
      dlclose(h);
      return 1;
    }
  }
  return 0;
}

static int have_cublas(void) { return have_library("TCC_CUBLAS_LIBRARY", "libcublas.so.13", "libcublas.so.12"); }

START_TEST(matmul_vs_float64) {
  if (!have_cublas()) {
    printf("  SKIP matmul: no libcublas.so.13/.so.12 here (set TCC_CUBLAS_LIBRARY; scripts/gpu-check looks for it)\n");
    return;
  }
  matmul_case("matmul [1,130,256] @ [256,96] + bias, gelu (float32)", TCC__V1__DTYPE__FLOAT32, 1, 130, 256, 96, 0, 1,
              1);
  matmul_case("matmul [6,10,12] @ [12,7] (float32, broadcast)", TCC__V1__DTYPE__FLOAT32, 6, 10, 12, 7, 0, 0, 0);
  matmul_case("bmm [3,64,80] @ [3,80,48] (float16)", TCC__V1__DTYPE__FLOAT16, 3, 64, 80, 48, 1, 0, 0);
  matmul_case("bmm [3,64,80] @ [3,80,48] + bias (bfloat16)", TCC__V1__DTYPE__BFLOAT16, 3, 64, 80, 48, 1, 1, 0);
  matmul_case("bmm [2,33,65] @ [2,65,17] (float64)", TCC__V1__DTYPE__FLOAT64, 2, 33, 65, 17, 1, 0, 0);
}
END_TEST

static int have_cudnn(void) { return have_library("TCC_CUDNN_LIBRARY", "libcudnn.so.9", "libcudnn.so.8"); }

/* relu(conv2d(x, w, bias, stride, pad, groups)) (float32), against a
 * float64 direct convolution: with cudnn set, a cuDNN forward step and
 * the bias + relu epilogue kernel; else (TCC_NO_CUDNN=1) the GEMM road,
 * an im2col packing kernel, a cuBLAS GEMM step and the epilogue. */
static void conv_case(const char *what, int cudnn, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh,
                      int64_t kw, int64_t stride, int64_t pad, int64_t groups) {
  if (cudnn) unsetenv("TCC_NO_CUDNN");
  else setenv("TCC_NO_CUDNN", "1", 1);
  const Tcc__V1__DType dt = TCC__V1__DTYPE__FLOAT32;
  int64_t Ho = (H + 2 * pad - kh) / stride + 1, Wo = (W + 2 * pad - kw) / stride + 1, Cg = C / groups;
  reqb *b = reqb_new("");
  reqb_value(b, "x", dt, 4, (int64_t[]){N, C, H, W}, NULL, 0);
  reqb_value(b, "w", dt, 4, (int64_t[]){O, Cg, kh, kw}, NULL, 0);
  reqb_value(b, "bias", dt, 1, (int64_t[]){O}, NULL, 0);
  reqb_value(b, "y", dt, 4, (int64_t[]){N, O, Ho, Wo}, NULL, 0);
  reqb_value(b, "r", dt, 4, (int64_t[]){N, O, Ho, Wo}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_input(b, "bias");
  Tcc__V1__Node *n = reqb_node(b, "aten.convolution.default", "y");
  reqb_arg_tensor(b, n, "input", "x");
  reqb_arg_tensor(b, n, "weight", "w");
  reqb_arg_tensor(b, n, "bias", "bias");
  reqb_arg_ints(b, n, "stride", 2, (int64_t[]){stride, stride});
  reqb_arg_ints(b, n, "padding", 2, (int64_t[]){pad, pad});
  reqb_arg_ints(b, n, "dilation", 2, (int64_t[]){1, 1});
  reqb_arg_bool(b, n, "transposed", 0);
  reqb_arg_ints(b, n, "output_padding", 2, (int64_t[]){0, 0});
  reqb_arg_int(b, n, "groups", groups);
  reqb_unary(b, "aten.relu.default", "y", "r");
  reqb_output(b, "r");
  void **hin, **hout;
  Tcc__V1__Manifest *m = gpu_run(b, what, &hin, &hout);
  int has_gemm = 0, has_conv = 0;
  for (size_t k = 0; k < m->n_kernels; k++)
    has_gemm |= m->kernels[k]->gemm != NULL, has_conv |= m->kernels[k]->conv != NULL;
  ck_assert_msg(cudnn ? has_conv && !has_gemm : has_gemm && !has_conv, "%s: no %s step", what,
                cudnn ? "cuDNN" : "cuBLAS");
  size_t bad = 0;
  for (int64_t nn = 0; nn < N; nn++)
    for (int64_t o = 0; o < O; o++)
      for (int64_t i = 0; i < Ho; i++)
        for (int64_t j = 0; j < Wo; j++) {
          double ref = elem(hin[2], dt, (size_t)o), mag = fabs(ref);
          int64_t g = o / (O / groups);
          for (int64_t c = 0; c < Cg; c++)
            for (int64_t u = 0; u < kh; u++)
              for (int64_t v = 0; v < kw; v++) {
                int64_t y = i * stride - pad + u, x = j * stride - pad + v;
                if (y < 0 || y >= H || x < 0 || x >= W) continue;
                double a = elem(hin[0], dt, (size_t)(((nn * C + g * Cg + c) * H + y) * W + x));
                double wv = elem(hin[1], dt, (size_t)(((o * Cg + c) * kh + u) * kw + v));
                ref += a * wv;
                mag += fabs(a * wv);
              }
          ref = ref > 0 ? ref : 0;
          double got = elem(hout[0], dt, (size_t)(((nn * O + o) * Ho + i) * Wo + j));
          if (!(fabs(got - ref) <= 1e-5 * mag + 0x1p-22 * fabs(ref) + 1e-30)) {
            if (bad < 5) printf("  %s: [%lld, %lld, %lld, %lld]: gpu %.9g, float64 %.9g\n", what, (long long)nn,
                                (long long)o, (long long)i, (long long)j, got, ref);
            bad++;
          }
        }
  ck_assert_msg(bad == 0, "%s: %zu elements differ from float64 (seed %u)", what, bad, seed);
  printf("  %s (%s): %zu steps, matches float64\n", what, cudnn ? "cuDNN" : "im2col + cuBLAS", m->n_kernels);
  unsetenv("TCC_NO_CUDNN");
  free_all(hin, m->n_inputs);
  free_all(hout, m->n_outputs);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
}

START_TEST(conv_vs_float64) {
  if (!have_cublas()) {
    printf("  SKIP conv: no libcublas.so.13/.so.12 here (set TCC_CUBLAS_LIBRARY; scripts/gpu-check looks for it)\n");
    return;
  }
  int roads = have_cudnn() ? 2 : 1;
  if (roads == 1) printf("  SKIP conv through cuDNN: no libcudnn.so.9/.so.8 here (set TCC_CUDNN_LIBRARY)\n");
  for (int cudnn = 0; cudnn < roads; cudnn++) {
    conv_case("conv2d 3x3 pad 1 [4,16,20,20] -> 32 + bias, relu", cudnn, 4, 16, 20, 20, 32, 3, 3, 1, 1, 1);
    conv_case("conv2d 3x3 stride 2 [2,8,17,17] -> 12, groups 4", cudnn, 2, 8, 17, 17, 12, 3, 3, 2, 1, 4);
    conv_case("conv2d 1x1 [1,64,8,8] -> 32", cudnn, 1, 64, 8, 8, 32, 1, 1, 1, 0, 1);
  }
}
END_TEST

/* Split reductions: a sum of 2^24 float32 into one value, 4 rows of
 * 200000, and the sums of x and x^2 over 4 rows of 200000 (siblings split
 * together), against float64 sums (float32 partials: |err| <= 1e-6
 * sum|term|). */
START_TEST(split_reduction_vs_float64) {
  static const int64_t shapes[][2] = {{1, INT64_C(1) << 24}, {4, 200000}, {4, 200000}};
  for (int s = 0; s < 3; s++) {
    int sums = s == 2 ? 2 : 1;
    reqb *b = sums == 2 ? reqb_sum_and_squares(shapes[s][0], shapes[s][1]) : reqb_sum_rows(shapes[s][0], shapes[s][1]);
    void **hin, **hout;
    Tcc__V1__Manifest *m = gpu_run(b, "split sum", &hin, &hout);
    ck_assert_str_eq(m->kernels[0]->kind, "split-reduction");
    sums_match_float64(hin, hout, shapes[s][0], shapes[s][1], sums, "split sum");
    printf("  split %s [%lld, %lld]: %lld x %lld partial blocks, matches float64\n",
           sums == 2 ? "sum and sum of squares" : "sum", (long long)shapes[s][0], (long long)shapes[s][1],
           (long long)m->kernels[0]->grid[0], (long long)m->kernels[0]->grid[1]);
    free_all(hin, m->n_inputs);
    free_all(hout, m->n_outputs);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
}
END_TEST

int main(void) {
  tt_need_gpu(dev_arch, NULL, 0);
  seed = (unsigned)tt_seed("test_codegen_gpu");
  printf("device %s\n", dev_arch);
  if (!(tmpdir = tt_tmpdir("cudagen-gpu"))) return 1;
  int rc = tt_run_tests("cuda codegen gpu", 600, 1, (const TTest *[]){
      pointwise,
      half_types,
      softmax_rows,
      layer_norm_sum_argmax,
      matmul_vs_float64,
      conv_vs_float64,
      split_reduction_vs_float64,
      NULL}); /* one CUDA context for the process */
  tt_remove_tree(tmpdir);
  free(tmpdir);
  return rc;
}
