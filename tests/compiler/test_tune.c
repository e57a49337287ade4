/*
 * test_tune.c — compiler/tune.c: configs and records round-trip, a
 * default config builds exactly what tcc_compile builds, other configs
 * change only the pragmas, kernel signatures are equal for the same
 * kernel in different graphs and differ for other shapes, the benchmark
 * hook runs one kernel alone with the right result, and the output check
 * accepts reduction-order noise but not a wrong answer.
 * Random values are seeded from the clock (TCC_TEST_SEED replays).
 */
#include <check.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compiler.h"
#include "tcctest.h"

static int64_t range(int64_t lo, int64_t hi) { return lo + (int64_t)(tt_rand() % (uint64_t)(hi - lo + 1)); }

/* softmax(x) over the last dim of x[rows, cols]; with `extra`, also
 * s = sin(w[7, 9]) listed FIRST (another graph holding the same softmax). */
static tcc_prepared *softmax_graph(int64_t rows, int64_t cols, int extra) {
  reqb *b = reqb_new("x86-64-v2");
  int64_t sz[2] = {rows, cols}, wz[2] = {7, 9};
  if (extra) {
    reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, wz, NULL, 0);
    reqb_value(b, "s", TCC__V1__DTYPE__FLOAT32, 2, wz, NULL, 0);
    reqb_input(b, "w");
  }
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
  reqb_value(b, "y", TCC__V1__DTYPE__FLOAT32, 2, sz, NULL, 0);
  reqb_input(b, "x");
  if (extra) {
    reqb_unary(b, "aten.sin.default", "w", "s");
    reqb_output(b, "s");
  }
  Tcc__V1__Node *n = reqb_node(b, "aten._softmax.default", "y");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_int(b, n, "dim", -1);
  reqb_arg_bool(b, n, "half_to_float", 0);
  reqb_output(b, "y");
  reqb_options(b)->mode = TCC__V1__MODE__MAX_AUTOTUNE;
  tcc_prepared *p = NULL;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), "test-identity", &p, &err) == 0, "%s", err.msg);
  reqb_free(b);
  return p;
}

START_TEST(test_config_roundtrip) {
  for (int i = 0; i < 200; i++) {
    static const int widths[] = {0, 2, 4, 8, 16, 32};
    tcc_kernel_config c = {(int)range(-1, 1), (int)range(0, 64), (int)range(0, 4096), (int)range(0, 16),
                           (int)range(0, 64), widths[range(0, 5)], (int)range(0, 1)};
    char text[TCC_TUNE_CONFIG_TEXT];
    tcc_kernel_config_format(&c, text, sizeof text);
    tcc_kernel_config back;
    ck_assert_int_eq(tcc_kernel_config_parse(text, &back), 0);
    ck_assert_mem_eq(&back, &c, sizeof c);
    ck_assert_int_eq(tcc_kernel_config_is_default(&c), !c.parallel && !c.threads && !c.chunk &&
                                                           !c.unroll && !c.blas_threads && !c.vec &&
                                                           !c.order);
  }
  tcc_kernel_config c;
  ck_assert_int_eq(tcc_kernel_config_parse("par=2 thr=0 chunk=0 unroll=0 blas=0", &c), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_kernel_config_parse("par=1", &c), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_kernel_config_parse("par=1 thr=0 chunk=0 unroll=0 blas=0 vec=3 order=0", &c),
                   TCC_E_INVALID_ARGUMENT);   /* not a vector width */
  ck_assert_int_eq(tcc_kernel_config_parse("par=1 thr=0 chunk=0 unroll=0 blas=0 vec=8 order=2", &c),
                   TCC_E_INVALID_ARGUMENT);   /* not a loop order */
  ck_assert_int_eq(tcc_kernel_config_parse("par=1 thr=0 chunk=0 unroll=0 blas=0 vec=8 order=1", &c), 0);
  ck_assert_int_eq(c.vec, 8);
  ck_assert_int_eq(c.order, 1);
  tcc_kernel_config cands[TCC_TUNE_MAX_CANDIDATES];
  int n = tcc_tune_candidates(TCC__V1__DEVICE_TYPE__CPU, cands);
  ck_assert(n >= 4 && n <= TCC_TUNE_MAX_CANDIDATES);
  ck_assert(tcc_kernel_config_is_default(&cands[0]));
  for (int i = 1; i < n; i++) ck_assert(!tcc_kernel_config_is_default(&cands[i]));
  /* CUDA: the default first, then configs of the CUDA fields only, all different */
  n = tcc_tune_candidates(TCC__V1__DEVICE_TYPE__CUDA, cands);
  ck_assert(n >= 4 && n <= TCC_TUNE_MAX_CANDIDATES);
  ck_assert(tcc_kernel_config_is_default(&cands[0]));
  for (int i = 1; i < n; i++) {
    ck_assert(!tcc_kernel_config_is_default(&cands[i]));
    ck_assert(!cands[i].parallel && !cands[i].threads && !cands[i].chunk && !cands[i].unroll &&
              !cands[i].blas_threads && !cands[i].vec && !cands[i].order);
    for (int j = 0; j < i; j++) ck_assert(memcmp(&cands[i], &cands[j], sizeof cands[i]));
    char text[TCC_TUNE_CONFIG_TEXT];
    tcc_kernel_config back;
    ck_assert_int_eq(tcc_kernel_config_parse(tcc_kernel_config_format(&cands[i], text, sizeof text), &back), 0);
    ck_assert_mem_eq(&back, &cands[i], sizeof back);
  }
}
END_TEST

START_TEST(test_cuda_config_text) {
  static const int blocks[] = {0, 32, 64, 128, 256, 512, 1024}, ipts[] = {0, 1, 2, 4, 8, 16, 32, 64};
  for (int i = 0; i < 200; i++) {
    tcc_kernel_config c = {.block = blocks[range(0, 6)], .ipt = ipts[range(0, 7)], .wrow = (int)range(-1, 1),
                           .split = (int)range(0, 4096), .persist = (int)range(0, 1)};
    if (range(0, 1)) c.parallel = (int)range(-1, 1), c.vec = 4;
    char text[TCC_TUNE_CONFIG_TEXT];
    tcc_kernel_config_format(&c, text, sizeof text);
    ck_assert_int_eq(!!strstr(text, " block="), c.block || c.ipt || c.wrow || c.split || c.persist);
    tcc_kernel_config back;
    ck_assert_msg(tcc_kernel_config_parse(text, &back) == 0, "%s", text);
    ck_assert_mem_eq(&back, &c, sizeof c);
    ck_assert_int_eq(tcc_kernel_config_is_default(&c), !c.parallel && !c.vec && !c.block && !c.ipt &&
                                                           !c.wrow && !c.split && !c.persist);
  }
  tcc_kernel_config c;
  const char *base = "par=0 thr=0 chunk=0 unroll=0 blas=0 vec=0 order=0";
  static const char *const bad[] = {
      " block=96 ipt=0 wrow=0 split=0 persist=0", /* not a power of two */
      " block=2048 ipt=0 wrow=0 split=0 persist=0",
      " block=16 ipt=0 wrow=0 split=0 persist=0",
      " block=0 ipt=3 wrow=0 split=0 persist=0",
      " block=0 ipt=0 wrow=2 split=0 persist=0",
      " block=0 ipt=0 wrow=0 split=-1 persist=0",
      " block=0 ipt=0 wrow=0 split=5000 persist=0",
      " block=0 ipt=0 wrow=0 split=0 persist=2",
      " block=128 ipt=0 wrow=0 split=0",          /* a field missing */
      " block=128 ipt=0 wrow=0 split=0 persist=0 x",
      " garbage"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "%s%s", base, bad[i]);
    ck_assert_msg(tcc_kernel_config_parse(text, &c) == TCC_E_INVALID_ARGUMENT, "accepted '%s'", text);
  }
  char text[256];
  snprintf(text, sizeof text, "%s block=512 ipt=8 wrow=-1 split=128 persist=1", base);
  ck_assert_int_eq(tcc_kernel_config_parse(text, &c), 0);
  ck_assert_int_eq(c.block, 512);
  ck_assert_int_eq(c.ipt, 8);
  ck_assert_int_eq(c.wrow, -1);
  ck_assert_int_eq(c.split, 128);
  ck_assert_int_eq(c.persist, 1);
  /* a CPU record's text (no CUDA fields) still reads, CUDA fields zero */
  ck_assert_int_eq(tcc_kernel_config_parse(base, &c), 0);
  ck_assert(tcc_kernel_config_is_default(&c));
}
END_TEST

START_TEST(test_record_roundtrip) {
  tcc_error err;
  for (int i = 0; i < 100; i++) {
    tcc_tune_record r = {.config = {(int)range(-1, 1), 0, (int)range(0, 64), (int)range(0, 8), 1},
                         .best_ns = (double)range(1, 1000000000) / 7.0,
                         .default_ns = (double)range(1, 1000000000) / 3.0,
                         .tried = (int)range(1, 8),
                         .discarded = (int)range(0, 3)};
    uint8_t *bytes;
    size_t len;
    ck_assert_int_eq(tcc_tune_record_encode(&r, &bytes, &len, &err), 0);
    tcc_tune_record back;
    ck_assert_int_eq(tcc_tune_record_decode(bytes, len, &back, &err), 0);
    ck_assert_mem_eq(&back.config, &r.config, sizeof r.config);
    ck_assert(back.best_ns == r.best_ns && back.default_ns == r.default_ns);
    ck_assert_int_eq(back.tried, r.tried);
    ck_assert_int_eq(back.discarded, r.discarded);
    ck_assert_int_eq(tcc_tune_record_decode(bytes, len / 2, &back, &err), TCC_E_INVALID_ARGUMENT);
    free(bytes);
  }
  ck_assert_int_eq(tcc_tune_record_decode((const uint8_t *)"garbage", 7, NULL, &err), TCC_E_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_default_config_is_tcc_compile) {
  tcc_prepared *p = softmax_graph(range(20, 200), range(100, 700), 0);
  tcc_error err;
  tcc_artifact a, b, c;
  ck_assert_msg(tcc_compile(p, NULL, &a, &err) == 0, "%s", err.msg);
  tcc_kernel_config def[4] = {{0}};
  ck_assert_msg(tcc_compile_tuned(p, NULL, def, 4, 0, &b, &err) == 0, "%s", err.msg);
  ck_assert_str_eq(a.source, b.source);
  ck_assert_mem_eq(a.sha256, b.sha256, sizeof a.sha256);
  tcc_kernel_config par[1] = {{1, 2, 8, 0, 0}};
  ck_assert_msg(tcc_compile_tuned(p, NULL, par, 1, 0, &c, &err) == 0, "%s", err.msg);
  ck_assert_ptr_nonnull(strstr(c.source, "schedule(static, 8) reduction(|:bad) num_threads(2)"));
  ck_assert_ptr_null(strstr(a.source, " num_threads("));   /* no clause (the governor calls omp_set_num_threads) */
  ck_assert_ptr_null(strstr(a.source, "tcc_tune_kernel"));
  tcc_artifact_free(&a);
  tcc_artifact_free(&b);
  tcc_artifact_free(&c);
  tcc_prepared_free(p);
}
END_TEST

START_TEST(test_signatures_across_graphs) {
  int64_t rows = range(8, 64), cols = range(50, 300);
  tcc_prepared *a = softmax_graph(rows, cols, 0), *b = softmax_graph(rows, cols, 1),
               *c = softmax_graph(rows, cols + 1, 0);
  ck_assert(memcmp(a->hash, b->hash, TCC_SHA256_BYTES) != 0);
  tcc_tune_signatures pa, pb, pc;
  tcc_error err;
  ck_assert_msg(tcc_tune_signatures_make(a, &pa, &err) == 0, "%s", err.msg);
  ck_assert_msg(tcc_tune_signatures_make(b, &pb, &err) == 0, "%s", err.msg);
  ck_assert_msg(tcc_tune_signatures_make(c, &pc, &err) == 0, "%s", err.msg);
  ck_assert_int_eq(pa.nkernels, 1);
  ck_assert_int_eq(pb.nkernels, 2);
  ck_assert_str_eq(pa.kernels[0].kind, "reduction");
  int same = 0;
  for (int k = 0; k < pb.nkernels; k++)
    same += memcmp(pb.kernels[k].signature, pa.kernels[0].signature, TCC_SHA256_BYTES) == 0;
  ck_assert_int_eq(same, 1);
  ck_assert(memcmp(pc.kernels[0].signature, pa.kernels[0].signature, TCC_SHA256_BYTES) != 0);
  tcc_tune_signatures_free(&pa);
  tcc_tune_signatures_free(&pb);
  tcc_tune_signatures_free(&pc);
  tcc_prepared_free(a);
  tcc_prepared_free(b);
  tcc_prepared_free(c);
}
END_TEST

typedef int (*kernel_fn)(int, const void *const *, void *const *, void *);

START_TEST(test_hook_runs_one_kernel) {
  int64_t rows = range(4, 40), cols = range(10, 500);
  tcc_prepared *p = softmax_graph(rows, cols, 0);
  tcc_kernel_config cfg[1] = {{-1, 0, 0, 4, 1}};
  tcc_artifact a;
  tcc_error err;
  ck_assert_msg(tcc_compile_tuned(p, NULL, cfg, 1, 1, &a, &err) == 0, "%s", err.msg);
  char *dir = tt_tmpdir("test-tune");
  ck_assert_ptr_nonnull(dir);
  void *so = tt_load_kernel(dir, "k.so", a.data, a.size);
  ck_assert_msg(so != NULL, "%s", dlerror());
  kernel_fn k = (kernel_fn)dlsym(so, "tcc_tune_kernel");
  ck_assert_ptr_nonnull(k);
  size_t n = (size_t)(rows * cols);
  float *x = malloc(n * 4), *y = calloc(n, 4);
  tt_fill_float(x, n, -4, 4);
  const void *in[1] = {x};
  void *out[1] = {y};
  ck_assert_int_eq(k(0, in, out, NULL), 0);
  for (int64_t r = 0; r < rows; r++) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < cols; j++) mx = fmax(mx, x[r * cols + j]);
    for (int64_t j = 0; j < cols; j++) sum += exp(x[r * cols + j] - mx);
    for (int64_t j = 0; j < cols; j++) {
      double want = exp(x[r * cols + j] - mx) / sum;
      ck_assert_msg(fabs(y[r * cols + j] - want) <= 1e-6 + 1e-5 * want, "row %" PRId64 " col %" PRId64, r, j);
    }
  }
  /* the output check: identical and noisy outputs agree, a wrong one does not */
  tcc_bench_result ref = {.outputs = (uint8_t *)y, .outputs_len = n * 4};
  float *z = malloc(n * 4);
  memcpy(z, y, n * 4);
  tcc_bench_result cand = {.outputs = (uint8_t *)z, .outputs_len = n * 4};
  ck_assert_int_eq(tcc_bench_compare(a.manifest, a.manifest_len, &ref, &cand, &err), 0);
  size_t at = (size_t)range(0, (int64_t)n - 1);
  z[at] = nextafterf(z[at], 2.0f);
  ck_assert_int_eq(tcc_bench_compare(a.manifest, a.manifest_len, &ref, &cand, &err), 0);
  z[at] = y[at] + 0.01f;
  ck_assert_int_eq(tcc_bench_compare(a.manifest, a.manifest_len, &ref, &cand, &err), TCC_E_OUT_OF_RANGE);
  ck_assert_ptr_nonnull(strstr(err.msg, "element"));
  cand.outputs_len -= 4;
  ck_assert_int_eq(tcc_bench_compare(a.manifest, a.manifest_len, &ref, &cand, &err), TCC_E_OUT_OF_RANGE);
  free(x);
  free(y);
  free(z);
  tt_remove_tree(dir);
  free(dir);
  tcc_artifact_free(&a);
  tcc_prepared_free(p);
}
END_TEST

int main(void) {
  tt_seed("test_tune");
  return tt_run_tests("tune", 120, 0, (const TTest *[]){
      test_config_roundtrip,
      test_cuda_config_text,
      test_record_roundtrip,
      test_default_config_is_tcc_compile,
      test_signatures_across_graphs,
      test_hook_runs_one_kernel,
      NULL});
}
