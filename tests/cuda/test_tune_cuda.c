/*
 * test_tune_cuda.c — CUDA autotuning on a machine without a GPU: the
 * candidate configs (compiler/tune.c) and the emitter's honouring of
 * them (compiler/cuda/schedule.c, emit.c).
 *
 *   - every CUDA candidate of every tests/graphs example, plus a long
 *     split reduction and a short-row / long-row softmax, builds with
 *     NVRTC for sm_80 and sm_90 (tcc_compile_tuned, the config on every
 *     kernel);
 *   - each launch of the manifest agrees with the code: the kernel of the
 *     same name declares __launch_bounds__(block) with the manifest's
 *     block; and with the config: block = the config's block, a
 *     pointwise grid = ceil(numel / (block * ipt)) (at most 65536), a
 *     split stage's grid = the config's split, no split stage with
 *     split=1, one warp per row with wrow=1 (rows > 1), one block per row
 *     with wrow=-1; persist=1 puts a softmax row in shared memory once
 *     and reads it from there in every pass, and leaves kernels it does
 *     not apply to unchanged;
 *   - the default candidate (0) gives the same source and manifest bytes
 *     as tcc_compile (default mode artifacts unchanged);
 *   - tcc_tune_signatures_make works for CUDA (one signature per live kernel,
 *     the same kernel in another graph has the same one), and the
 *     daemon's tccd_gpu_pick (daemon/tune_child.c) picks only devices
 *     that run the cubin natively.
 * Skips (exit 77) when NVRTC is not available.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "tcc_nvrtc.h"
#include "tcctest.h"
#include "tune_child.h"

static const char *const ARCHS[] = {"sm_80", "sm_90"};
#define MAX_GRID 65536

/* The N of "__launch_bounds__(N) <name>(" in src, or -1. */
static long launch_bounds(const char *src, const char *name) {
  char want[96];
  snprintf(want, sizeof want, ") %s(", name);
  for (const char *p = strstr(src, want); p; p = strstr(p + 1, want)) {
    const char *q = p;
    while (q > src && q[-1] != '(') q--;
    if (q - src >= 18 && strncmp(q - 18, "__launch_bounds__(", 18) == 0) return strtol(q, NULL, 10);
  }
  return -1;
}

/* The header comment line of kernel name ("\n/\* k0: ...") in src, or NULL. */
static const char *kernel_comment(const char *src, const char *name) {
  char want[64];
  snprintf(want, sizeof want, "\n/* %s: ", name);
  return strstr(src, want);
}

/* The elements each thread of kernel name takes at once: W of its
 * vector loop's tcc_vec<T, W>, or 1 (schedule.c's vector_grid). */
static int vector_width(const char *src, const char *name) {
  const char *c = kernel_comment(src, name);
  if (!c) return 1;
  const char *end = strstr(c + 1, "\n/* k");
  const char *v = strstr(c, "tcc_vec<");
  if (!v || (end && v > end)) return 1;
  const char *comma = strchr(v, ',');
  return comma ? (int)strtol(comma + 1, NULL, 10) : 1;
}

/* Checks one candidate's artifact against its config; returns the number
 * of kernel launches checked. */
static int check_candidate(const char *what, const tcc_kernel_config *cfg, const tcc_artifact *a) {
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a->manifest_len, a->manifest);
  ck_assert_msg(m != NULL, "%s: manifest", what);
  int checked = 0, splits = 0;
  for (size_t i = 0; i < m->n_kernels; i++) {
    const Tcc__V1__KernelInfo *k = m->kernels[i];
    if (k->gemm || k->conv) continue;   /* a cuBLAS or cuDNN step: no config applies */
    ck_assert_msg(k->n_block == 1 && k->n_grid >= 1, "%s: %s has no launch", what, k->name);
    int64_t block = k->block[0], grid = k->grid[0];
    ck_assert_msg(block % 32 == 0 && block >= 32 && block <= 1024, "%s: %s block %lld", what, k->name,
                  (long long)block);
    long lb = launch_bounds(a->source, k->name);
    ck_assert_msg(lb == block, "%s: %s: manifest block %lld, code __launch_bounds__(%ld)", what, k->name,
                  (long long)block, lb);
    if (cfg->block)
      ck_assert_msg(block == cfg->block, "%s: %s block %lld, config %d", what, k->name, (long long)block,
                    cfg->block);
    if (!strcmp(k->kind, "pointwise")) {
      int64_t per = block * (cfg->ipt ? cfg->ipt : 1) * vector_width(a->source, k->name);
      int64_t want = (k->numel + per - 1) / per;
      if (want > MAX_GRID) want = MAX_GRID;
      if (want < 1) want = 1;
      ck_assert_msg(grid == want, "%s: %s (%lld elements) grid %lld, want %lld", what, k->name,
                    (long long)k->numel, (long long)grid, (long long)want);
    }
    if (!strcmp(k->kind, "split-reduction")) {
      splits++;
      ck_assert_int_eq(k->n_grid, 2);
      if (cfg->split > 1)
        ck_assert_msg(grid == cfg->split, "%s: %s split into %lld, config %d", what, k->name, (long long)grid,
                      cfg->split);
    }
    if (!strcmp(k->kind, "reduction") && cfg->wrow) {
      const char *c = kernel_comment(a->source, k->name);
      ck_assert_ptr_nonnull(c);
      const char *eol = strchr(c + 1, '\n');
      int warp = strstr(c, "one warp per row") && strstr(c, "one warp per row") < eol;
      int rows_gt1 = !(strstr(c, "(1 rows)") && strstr(c, "(1 rows)") < eol);
      if (cfg->wrow > 0 && rows_gt1 && strstr(c, " per row") && strstr(c, " per row") < eol)
        ck_assert_msg(warp, "%s: %s: wrow=1 but not a warp per row", what, k->name);
      if (cfg->wrow < 0) ck_assert_msg(!warp, "%s: %s: wrow=-1 but a warp per row", what, k->name);
    }
    checked++;
  }
  if (cfg->split == 1) ck_assert_msg(splits == 0, "%s: split=1 still splits", what);
  tcc__v1__manifest__free_unpacked(m, NULL);
  return checked;
}

/* Every candidate of req (already retargeted) for its arch: builds, and
 * checks; candidate 0 also against tcc_compile. Returns launches checked. */
static int every_candidate(const Tcc__V1__CompileRequest *req, const char *what) {
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(req, "test-id", &p, &err) == 0, "%s: %s", what, err.msg);
  tcc_artifact plain;
  ck_assert_msg(tcc_compile(p, NULL, &plain, &err) == 0, "%s: %s", what, err.msg);
  tcc_tune_signatures sigs;
  ck_assert_msg(tcc_tune_signatures_make(p, &sigs, &err) == 0, "%s: signatures: %s", what, err.msg);
  ck_assert_int_ge(sigs.nkernels, 1);
  tcc_kernel_config cands[TCC_TUNE_MAX_CANDIDATES];
  int n = tcc_tune_candidates(TCC__V1__DEVICE_TYPE__CUDA, cands);
  int checked = 0;
  for (int c = 0; c < n; c++) {
    tcc_kernel_config *cfg = calloc((size_t)sigs.nkernels, sizeof *cfg);
    for (int k = 0; k < sigs.nkernels; k++) cfg[k] = cands[c];
    tcc_artifact a;
    char name[256], text[TCC_TUNE_CONFIG_TEXT];
    snprintf(name, sizeof name, "%s candidate %d (%s)", what, c, tcc_kernel_config_format(&cands[c], text, sizeof text));
    ck_assert_msg(tcc_compile_tuned(p, NULL, cfg, sigs.nkernels, 1, &a, &err) == 0, "%s: %s", name, err.msg);
    ck_assert_int_eq(a.kind, TCC__V1__ARTIFACT_KIND__CUBIN);
    checked += check_candidate(name, &cands[c], &a);
    if (c == 0) {
      ck_assert_msg(!strcmp(a.source, plain.source), "%s: default config changes the source", what);
      ck_assert_msg(a.manifest_len == plain.manifest_len && !memcmp(a.manifest, plain.manifest, a.manifest_len),
                    "%s: default config changes the manifest", what);
    }
    tcc_artifact_free(&a);
    free(cfg);
  }
  tcc_tune_signatures_free(&sigs);
  tcc_artifact_free(&plain);
  tcc_prepared_free(p);
  return checked;
}

START_TEST(example_graph_candidates) {
  tt_graph g = {0};
  while (tt_graph_next(&g)) {
    for (size_t a = 0; a < 2; a++) {
      Tcc__V1__CompileRequest *req = tt_graph_request(&g, ARCHS[a]);
      char what[256];
      snprintf(what, sizeof what, "%s %s", g.name, ARCHS[a]);
      int n = every_candidate(req, what);
      printf("  %s: every candidate builds, %d launches checked\n", what, n);
      protobuf_c_message_free_unpacked(&req->base, NULL);
    }
  }
  ck_assert_int_ge(g.count, 5);
}
END_TEST

/* softmax over dim 1 of x [R, C]. (reqb_sum_rows: a split reduction
 * when C is long and R small.) */
static reqb *softmax_rows(int64_t R, int64_t C) {
  return reqb_softmax("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, R, C);
}

START_TEST(reduction_candidates) {
  struct {
    const char *what;
    reqb *(*make)(int64_t, int64_t);
    int64_t R, C;
  } cases[] = {
    {"split sum [2, 300000]", reqb_sum_rows, 2, 300000},
    {"sum [300, 70]", reqb_sum_rows, 300, 70},
    {"softmax [64, 1000]", softmax_rows, 64, 1000},
    {"softmax [128, 20]", softmax_rows, 128, 20},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (size_t a = 0; a < 2; a++) {
      reqb *b = cases[i].make(cases[i].R, cases[i].C);
      tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
      char what[128];
      snprintf(what, sizeof what, "%s %s", cases[i].what, ARCHS[a]);
      int n = every_candidate(reqb_req(b), what);
      printf("  %s: every candidate builds, %d launches checked\n", what, n);
      reqb_free(b);
    }
}
END_TEST

/* The split factor reaches the code: the split stage's partials and the
 * final fold use the config's group count. */
START_TEST(split_factor_in_the_code) {
  reqb *b = reqb_sum_rows(2, 300000);
  tt_request_to_cuda(reqb_req(b), reqb_str(b, "sm_90"));
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), "test-id", &p, &err) == 0, "%s", err.msg);
  tcc_kernel_config cfg = {.split = 128, .block = 512};
  tcc_artifact a;
  ck_assert_msg(tcc_compile_tuned(p, NULL, &cfg, 1, 0, &a, &err) == 0, "%s", err.msg);
  ck_assert_ptr_nonnull(strstr(a.source, "k0_split: first stage of k0's split reduction: grid (128, 2), block 512"));
  ck_assert_ptr_nonnull(strstr(a.source, "j0 < 128; j0 += blockDim.x"));
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a.manifest_len, a.manifest);
  ck_assert_int_ge(m->workspace_bytes, 128 * 2 * 4);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  tcc_prepared_free(p);
  reqb_free(b);
}
END_TEST

/* Source of b (retargeted to sm_90) under cfg on its one kernel. */
static char *source_under(reqb *b, tcc_kernel_config cfg) {
  tt_request_to_cuda(reqb_req(b), reqb_str(b, "sm_90"));
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), "test-id", &p, &err) == 0, "%s", err.msg);
  tcc_artifact a;
  ck_assert_msg(tcc_compile_tuned(p, NULL, &cfg, 1, 0, &a, &err) == 0, "%s", err.msg);
  char *src = a.source;
  a.source = NULL;
  tcc_artifact_free(&a);
  tcc_prepared_free(p);
  return src;
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *q = strstr(s, what); q; q = strstr(q + 1, what)) n++;
  return n;
}

/* persist=1: softmax reads its row from shared memory in all three
 * passes (one copy from global memory per row); a kernel that reads
 * its row once, or whose row does not fit, is the looped code. */
START_TEST(persistent_rows) {
  tcc_kernel_config persist = {.persist = 1}, def = {0};
  reqb *b = softmax_rows(64, 1000);
  char *src = source_under(b, persist);
  ck_assert_ptr_nonnull(strstr(src, "persistent: 1 input's row in shared memory"));
  ck_assert_ptr_nonnull(strstr(src, "__shared__ float s0[1000];"));
  ck_assert_int_eq(count(src, "s0[(long long)("), 3);   /* max, sum, stores */
  ck_assert_int_eq(count(src, "b0["), 1);               /* the copy */
  ck_assert_int_eq(count(src, "__syncthreads();"), 2 + 3);   /* the fill's two, the block reduction's three */
  free(src);
  reqb_free(b);
  struct {
    reqb *(*make)(int64_t, int64_t);
    int64_t R, C;
  } same[] = {{reqb_sum_rows, 300, 70}, {softmax_rows, 4, 20000}};
  for (int i = 0; i < 2; i++) {
    reqb *b1 = same[i].make(same[i].R, same[i].C), *b2 = same[i].make(same[i].R, same[i].C);
    char *s1 = source_under(b1, persist), *s2 = source_under(b2, def);
    ck_assert_msg(!strcmp(s1, s2), "case %d: persist=1 changed a kernel it does not apply to", i);
    free(s1);
    free(s2);
    reqb_free(b1);
    reqb_free(b2);
  }
}
END_TEST

START_TEST(plan_signatures) {
  /* softmax alone, and softmax next to a sum: the softmax kernel has the
   * same signature in both; sm_80 and sm_90 differ */
  uint8_t sig[2][2][TCC_SHA256_BYTES];
  for (int a = 0; a < 2; a++)
    for (int g = 0; g < 2; g++) {
      reqb *b = reqb_new("");
      reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){64, 1000}, NULL, 0);
      reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){64, 1000}, NULL, 0);
      reqb_input(b, "x");
      if (g == 1) {
        reqb_value(b, "y", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){8, 8}, NULL, 0);
        reqb_value(b, "s", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){8, 8}, NULL, 0);
        reqb_input(b, "y");
        reqb_unary(b, "aten.sin.default", "y", "s");
        reqb_output(b, "s");
      }
      Tcc__V1__Node *n = reqb_node(b, "aten._softmax.default", "o");
      reqb_arg_tensor(b, n, "self", "x");
      reqb_arg_int(b, n, "dim", 1);
      reqb_arg_bool(b, n, "half_to_float", 0);
      reqb_output(b, "o");
      tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
      tcc_prepared *p;
      tcc_error err;
      ck_assert_msg(tcc_prepare(reqb_req(b), "test-id", &p, &err) == 0, "%s", err.msg);
      tcc_tune_signatures sigs;
      ck_assert_msg(tcc_tune_signatures_make(p, &sigs, &err) == 0, "%s", err.msg);
      ck_assert_int_eq(sigs.nkernels, g + 1);
      int sm = -1;
      for (int k = 0; k < sigs.nkernels; k++)
        if (!strcmp(sigs.kernels[k].kind, "reduction")) sm = k;
      ck_assert_int_ge(sm, 0);
      if (g == 1) {
        ck_assert_str_eq(sigs.kernels[1 - sm].kind, "pointwise");
        ck_assert(memcmp(sigs.kernels[0].signature, sigs.kernels[1].signature, TCC_SHA256_BYTES));
      }
      memcpy(sig[a][g], sigs.kernels[sm].signature, TCC_SHA256_BYTES);
      tcc_tune_signatures_free(&sigs);
      tcc_prepared_free(p);
      reqb_free(b);
    }
  ck_assert_mem_eq(sig[0][0], sig[0][1], TCC_SHA256_BYTES);
  ck_assert_mem_eq(sig[1][0], sig[1][1], TCC_SHA256_BYTES);
  ck_assert(memcmp(sig[0][0], sig[1][0], TCC_SHA256_BYTES));
}
END_TEST

START_TEST(probe_pick) {
  tccd_gpu_probe_result r;
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_90"), -1);   /* no device */
  r.ndevices = 3;
  snprintf(r.device[0].arch, sizeof r.device[0].arch, "sm_75");
  snprintf(r.device[1].arch, sizeof r.device[1].arch, "sm_86");
  snprintf(r.device[2].arch, sizeof r.device[2].arch, "sm_90");
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_80"), 1);    /* 8.6 runs sm_80 cubins */
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_86"), 1);
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_89"), -1);   /* 8.6 < 8.9 */
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_90"), 2);
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_90a"), 2);
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_100"), -1);  /* another major: not natively */
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_86a"), 1);
  ck_assert_int_eq(tccd_gpu_pick(&r, "sm_80a"), -1);  /* "a": that arch exactly */
  ck_assert_int_eq(tccd_gpu_pick(&r, "garbage"), -1);
  ck_assert_int_eq(tccd_gpu_pick(&r, NULL), -1);
}
END_TEST

int main(void) {
  tcc_error err;
  Suite *s = suite_create("cuda tune");
  TCase *tc = tcase_create("pick");
  tcase_add_test(tc, probe_pick);
  suite_add_tcase(s, tc);
  int nvrtc = tcc_nvrtc_available(&err) == 0;
  if (!nvrtc) printf("no NVRTC (%s): only the probe test runs\n", err.msg);
  if (nvrtc) {
    tc = tcase_create("quick");   /* CK_RUN_CASE=quick: what valgrind runs */
    tcase_set_timeout(tc, 1500);
    tcase_add_test(tc, split_factor_in_the_code);
    tcase_add_test(tc, persistent_rows);
    suite_add_tcase(s, tc);
    tc = tcase_create("candidates");
    tcase_set_timeout(tc, 1500);
    tcase_add_test(tc, plan_signatures);
    tcase_add_test(tc, reduction_candidates);
    tcase_add_test(tc, example_graph_candidates);
    suite_add_tcase(s, tc);
  }
  return tt_run_suite(s, 0);
}
