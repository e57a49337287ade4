/*
 * test_dynamic.c — dynamic shapes: symbolic input dims, the guard key,
 * one ABI 2 artifact run at many sizes, guards, and what is refused.
 *
 * The graph (batch B symbolic as "s0", 37 = a width no vector length
 * divides):
 *   x [B, 37], y [B, 37], w [37], w2 [37, 5]
 *   out0 = softmax(x * w, -1) + y        pointwise + row reduction
 *   out1 = sum(y, dim 0)                 reduction over the symbolic dim
 *   out2 = mean(x)                       divisor 37 * B at run time
 *   out3 = x @ w2                        GEMM with symbolic M
 * compiled once (example B = 8) and run, through libtccclient's ABI 2
 * calls (bind, output layout, workspace, run), at B = 2, 3, 13, 64, 101
 * on fresh random inputs (seed printed; TCC_TEST_SEED replays it)
 * against a float64 reference: |got - want| <= 1e-5 + 1e-4 |want|.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "tccclient.h"
#include "tcctest.h"

#define W 37
#define N2 5

static char identity[256];
static unsigned seed;

static char *SYM_S0[] = {"s0", ""};
static char *SYM_BATCH[] = {"batch", ""};
static char *SYM_S1[] = {"s1", ""};
static int64_t DIM_LAST[] = {-1};
static int64_t DIM_ZERO[] = {0};
static Tcc__V1__IntList list_last = {PROTOBUF_C_MESSAGE_INIT(&tcc__v1__int_list__descriptor), 1, DIM_LAST};
static Tcc__V1__IntList list_zero = {PROTOBUF_C_MESSAGE_INIT(&tcc__v1__int_list__descriptor), 1, DIM_ZERO};

/* The test graph at example batch b; x's and y's dim 0 carry symbols
 * xs / ys (NULL: static). */
static reqb *graph(int64_t b, int dynamic, char **xs, char **ys) {
  reqb *r = reqb_new("x86-64-v2");
  Tcc__V1__TensorMeta *mx = reqb_value(r, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, W}, NULL, 0);
  Tcc__V1__TensorMeta *my = reqb_value(r, "y", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, W}, NULL, 0);
  if (xs) {
    mx->n_sym_sizes = 2;
    mx->sym_sizes = xs;
  }
  if (ys) {
    my->n_sym_sizes = 2;
    my->sym_sizes = ys;
  }
  reqb_value(r, "w", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){W}, NULL, 0);
  reqb_value(r, "w2", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){W, N2}, NULL, 0);
  reqb_value(r, "a", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, W}, NULL, 0);
  reqb_value(r, "sm", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, W}, NULL, 0);
  reqb_value(r, "out0", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, W}, NULL, 0);
  reqb_value(r, "out1", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){W}, NULL, 0);
  reqb_value(r, "out2", TCC__V1__DTYPE__FLOAT32, 0, NULL, NULL, 0);
  reqb_value(r, "out3", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){b, N2}, NULL, 0);
  reqb_input(r, "x");
  reqb_input(r, "y");
  reqb_input(r, "w");
  reqb_input(r, "w2");
  reqb_binary(r, "aten.mul.Tensor", "x", "w", "a");
  Tcc__V1__Node *n = reqb_node(r, "aten._softmax.default", "sm");
  reqb_arg_tensor(r, n, "self", "a");
  reqb_arg_int(r, n, "dim", -1);
  reqb_arg_bool(r, n, "half_to_float", 0);
  reqb_binary(r, "aten.add.Tensor", "sm", "y", "out0");
  n = reqb_node(r, "aten.sum.dim_IntList", "out1");
  reqb_arg_tensor(r, n, "self", "y");
  Tcc__V1__Argument *a = reqb_arg_int(r, n, "dim", 0);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_INTS;
  a->as_ints = &list_zero;
  reqb_unary(r, "aten.mean.default", "x", "out2");
  n = reqb_node(r, "aten.mm.default", "out3");
  reqb_arg_tensor(r, n, "self", "x");
  reqb_arg_tensor(r, n, "mat2", "w2");
  reqb_output(r, "out0");
  reqb_output(r, "out1");
  reqb_output(r, "out2");
  reqb_output(r, "out3");
  reqb_options(r)->dynamic = dynamic;
  (void)list_last;
  return r;
}

static int prepare(reqb *r, tcc_prepared **p, tcc_error *err) {
  return tcc_prepare(reqb_req(r), identity, p, err);
}

/* The guard hash of the graph, or "" with the error in err. */
static void hash_of(int64_t b, int dynamic, char **xs, char **ys, char out[TCC_SHA256_HEX]) {
  reqb *r = graph(b, dynamic, xs, ys);
  tcc_prepared *p;
  tcc_error err = {0};
  int rc = prepare(r, &p, &err);
  ck_assert_msg(rc == 0, "prepare: %s", err.msg);
  memcpy(out, p->hash_hex, TCC_SHA256_HEX);
  tcc_prepared_free(p);
  reqb_free(r);
}

START_TEST(same_hash_for_every_example_size) {
  char h8[TCC_SHA256_HEX], h16[TCC_SHA256_HEX], hb[TCC_SHA256_HEX], hoff[TCC_SHA256_HEX],
      hstatic[TCC_SHA256_HEX], h1[TCC_SHA256_HEX], hx[TCC_SHA256_HEX];
  hash_of(8, 1, SYM_S0, SYM_S0, h8);
  hash_of(16, 1, SYM_S0, SYM_S0, h16);
  ck_assert_str_eq(h8, h16);
  hash_of(8, 1, SYM_BATCH, SYM_BATCH, hb);   /* names are not hashed */
  ck_assert_str_eq(h8, hb);
  hash_of(8, 0, SYM_S0, SYM_S0, hoff);       /* without dynamic: static */
  ck_assert_str_ne(h8, hoff);
  hash_of(8, 0, NULL, NULL, hstatic);
  ck_assert_str_eq(hoff, hstatic);           /* sym_sizes ignored */
  hash_of(16, 0, SYM_S0, SYM_S0, hx);
  ck_assert_str_ne(hoff, hx);                /* static sizes hash their values */
  hash_of(1, 1, SYM_S0, SYM_S0, h1);         /* 0/1 specialise */
  ck_assert_str_ne(h8, h1);
}
END_TEST

START_TEST(key_documents_symbols) {
  reqb *r = graph(8, 1, SYM_S0, SYM_S0);
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_msg(prepare(r, &p, &err) == 0, "%s", err.msg);
  ck_assert_int_eq(p->graph->nsyms, 1);
  ck_assert_int_eq(p->key[4], 2);            /* key format 2 */
  /* x's dim 0 is written as -1 - 0 = -1 (all bytes 0xff) somewhere */
  int found = 0;
  for (size_t i = 0; i + 8 <= p->key_len && !found; i++)
    found = !memcmp(p->key + i, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
  ck_assert(found);
  tcc_prepared_free(p);
  reqb_free(r);
}
END_TEST

static float frand(void) { return (float)tt_uniform(-2.0, 2.0); }

static void check_close(const char *what, int64_t b, const float *got, const double *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(fabs((double)got[i] - want[i]) <= 1e-5 + 1e-4 * fabs(want[i]),
                  "seed %u B=%lld %s[%lld]: got %.9g want %.9g", seed, (long long)b, what,
                  (long long)i, (double)got[i], want[i]);
}

/* Runs the loaded kernel at batch b and compares with float64. */
static void run_at(tcc_module *k, int64_t b) {
  float *x = malloc(sizeof *x * (size_t)(b * W)), *y = malloc(sizeof *y * (size_t)(b * W));
  float w[W], w2[W * N2];
  for (int64_t i = 0; i < b * W; i++) {
    x[i] = frand();
    y[i] = frand();
  }
  for (int i = 0; i < W; i++) w[i] = frand();
  for (int i = 0; i < W * N2; i++) w2[i] = frand();
  int64_t sizes[] = {b, W, b, W, W, W, N2}, strides[] = {W, 1, W, 1, 1, N2, 1}, offs[4] = {0};
  int64_t syms[TCC_MODULE_MAX_SYMS];
  tcc_error err = {0};
  ck_assert_int_eq(tcc_module_symbols(k), 1);
  int rc = tcc_module_bind(k, sizes, strides, offs, syms, &err);
  ck_assert_msg(rc == 0, "bind at %lld: %s", (long long)b, err.msg);
  ck_assert_int_eq(syms[0], b);
  int64_t osz[4][2], ost[4][2];
  for (int o = 0; o < 4; o++) ck_assert_int_eq(tcc_module_output_layout(k, syms, o, osz[o], ost[o], &err), 0);
  ck_assert_int_eq(osz[0][0], b);
  ck_assert_int_eq(osz[0][1], W);
  ck_assert_int_eq(ost[0][0], W);
  ck_assert_int_eq(osz[1][0], W);
  ck_assert_int_eq(osz[3][0], b);
  ck_assert_int_eq(osz[3][1], N2);
  ck_assert_int_eq(ost[3][0], N2);
  float *o0 = malloc(sizeof *o0 * (size_t)(b * W)), o1[W], o2[1], *o3 = malloc(sizeof *o3 * (size_t)(b * N2));
  int64_t ws = tcc_module_workspace_bytes(k, syms);
  ck_assert_int_ge(ws, 0);
  void *wsp = ws ? aligned_alloc(64, ((size_t)ws + 63) & ~(size_t)63) : NULL;
  const void *ins[] = {x, y, w, w2};
  void *outs[] = {o0, o1, o2, o3};
  rc = tcc_module_run_sym(k, ins, outs, wsp, syms, &err);
  ck_assert_msg(rc == 0, "run at %lld: %s", (long long)b, err.msg);

  double *r0 = malloc(sizeof *r0 * (size_t)(b * W)), r1[W] = {0}, r2 = 0, *r3 = calloc((size_t)(b * N2), sizeof *r3);
  for (int64_t i = 0; i < b; i++) {
    double mx = -INFINITY, s = 0, a[W];
    for (int j = 0; j < W; j++) {
      a[j] = (double)x[i * W + j] * w[j];
      if (a[j] > mx) mx = a[j];
    }
    for (int j = 0; j < W; j++) s += exp(a[j] - mx);
    for (int j = 0; j < W; j++) r0[i * W + j] = exp(a[j] - mx) / s + y[i * W + j];
    for (int j = 0; j < W; j++) {
      r1[j] += y[i * W + j];
      r2 += x[i * W + j];
    }
    for (int n = 0; n < N2; n++)
      for (int j = 0; j < W; j++) r3[i * N2 + n] += (double)x[i * W + j] * w2[j * N2 + n];
  }
  r2 /= (double)(b * W);
  check_close("out0", b, o0, r0, b * W);
  check_close("out1", b, o1, r1, W);
  check_close("out2", b, o2, &r2, 1);
  check_close("out3", b, o3, r3, b * N2);
  free(x);
  free(y);
  free(o0);
  free(o3);
  free(r0);
  free(r3);
  free(wsp);
}

/* Compiles the graph at example batch 8 and loads it with libtccclient. */
static tcc_module *compile_and_load(tcc_artifact *art) {
  reqb *r = graph(8, 1, SYM_S0, SYM_S0);
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_msg(prepare(r, &p, &err) == 0, "%s", err.msg);
  int rc = tcc_compile(p, NULL, art, &err);
  ck_assert_msg(rc == 0, "compile: %s", err.msg);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, art->manifest_len, art->manifest);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(m->abi_version, 2);
  ck_assert_str_eq(m->entry, "tcc_entry2");
  ck_assert_int_eq(m->n_symbols, 1);
  ck_assert_str_eq(m->symbols[0], "s0");
  ck_assert_int_eq(m->outputs[0]->sizes[0], 8);   /* the example's layout */
  ck_assert_ptr_nonnull(strstr(art->source, "tcc_S[0]"));
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(art->sha256, sizeof art->sha256, hex);
  tcc_module *k;
  rc = tcc_module_load(art->data, art->size, hex, m, &k, &err);
  ck_assert_msg(rc == 0, "load: %s", err.msg);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_prepared_free(p);
  reqb_free(r);
  return k;
}

START_TEST(compile_manifest_polynomials) {
  reqb *r = graph(8, 1, SYM_S0, SYM_S0);
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_msg(prepare(r, &p, &err) == 0, "%s", err.msg);
  tcc_artifact art;
  ck_assert_msg(tcc_compile(p, NULL, &art, &err) == 0, "%s", err.msg);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
  ck_assert_int_eq(m->n_sym_inputs, 4);
  ck_assert_int_eq(m->n_sym_outputs, 4);
  /* x: sizes [s0, 37], strides [37, 1] */
  const Tcc__V1__SymLayout *x = m->sym_inputs[0];
  ck_assert_int_eq(x->sizes[0]->n_terms, 1);
  ck_assert_int_eq(x->sizes[0]->terms[0]->coef, 1);
  ck_assert_int_eq(x->sizes[0]->terms[0]->n_syms, 1);
  ck_assert_int_eq(x->sizes[1]->terms[0]->coef, W);
  ck_assert_int_eq(x->sizes[1]->terms[0]->n_syms, 0);
  ck_assert_int_eq(x->strides[0]->terms[0]->coef, W);
  /* out3: [s0, 5] */
  ck_assert_int_eq(m->sym_outputs[3]->sizes[0]->terms[0]->n_syms, 1);
  ck_assert_int_eq(m->sym_outputs[3]->sizes[1]->terms[0]->coef, N2);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&art);
  /* tcc_generate_source (the fuzzer's back end) gives the same merged source */
  char *src;
  size_t len;
  int kernels = 0;
  ck_assert_msg(tcc_generate_source(p, &src, &len, &kernels, &err) == 0, "%s", err.msg);
  ck_assert_int_ge(kernels, 1);
  ck_assert_ptr_nonnull(strstr(src, "int tcc_entry2("));
  ck_assert_ptr_nonnull(strstr(src, "tcc_S[0]"));
  free(src);
  tcc_prepared_free(p);
  reqb_free(r);
}
END_TEST

START_TEST(cuda_is_unimplemented) {
  reqb *r = graph(8, 1, SYM_S0, SYM_S0);
  Tcc__V1__CompileRequest *q = reqb_req(r);
  q->target->device = TCC__V1__DEVICE_TYPE__CUDA;
  q->target->cuda_arch = "sm_80";
  q->target->cpu_isa = "";
  for (size_t i = 0; i < q->graph->n_values; i++) q->graph->values[i]->meta->device->type = TCC__V1__DEVICE_TYPE__CUDA;
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_msg(prepare(r, &p, &err) == 0, "%s", err.msg);
  tcc_artifact art;
  ck_assert_int_eq(tcc_compile(p, NULL, &art, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "dynamic shapes on CUDA"));
  tcc_prepared_free(p);
  reqb_free(r);
}
END_TEST

START_TEST(one_artifact_many_sizes) {
  tcc_artifact art;
  tcc_module *k = compile_and_load(&art);
  static const int64_t sizes[] = {2, 3, 13, 64, 101, 8};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) run_at(k, sizes[i]);
  tcc_module_unload(k);
  tcc_artifact_free(&art);
}
END_TEST

START_TEST(guards_refuse) {
  tcc_artifact art;
  tcc_module *k = compile_and_load(&art);
  int64_t syms[TCC_MODULE_MAX_SYMS];
  tcc_error err = {0};
  /* batch 1: a symbol is >= 2 */
  int64_t s1[] = {1, W, 1, W, W, W, N2};
  ck_assert_int_eq(tcc_module_bind(k, s1, NULL, NULL, syms, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "guard failed"));
  /* x and y disagree on s0 */
  int64_t s2[] = {4, W, 5, W, W, W, N2};
  ck_assert_int_eq(tcc_module_bind(k, s2, NULL, NULL, syms, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "input 1 dim 0"));
  /* a static dim differs */
  int64_t s3[] = {4, W + 1, 4, W + 1, W + 1, W, N2};
  ck_assert_int_eq(tcc_module_bind(k, s3, NULL, NULL, syms, &err), TCC_E_FAILED_PRECONDITION);
  /* not contiguous */
  int64_t s4[] = {4, W, 4, W, W, W, N2}, st4[] = {1, 4, W, 1, 1, N2, 1};
  ck_assert_int_eq(tcc_module_bind(k, s4, st4, NULL, syms, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "stride"));
  /* ABI 1 calls refuse an ABI 2 kernel */
  ck_assert_int_eq(tcc_module_run(k, NULL, NULL, NULL, &err), TCC_E_FAILED_PRECONDITION);
  tcc_module_unload(k);
  tcc_artifact_free(&art);
}
END_TEST

START_TEST(static_request_unchanged) {
  /* dynamic without symbols, and symbols without dynamic: ABI 1 */
  for (int c = 0; c < 2; c++) {
    reqb *r = c ? graph(8, 1, NULL, NULL) : graph(8, 0, SYM_S0, SYM_S0);
    tcc_prepared *p;
    tcc_error err = {0};
    ck_assert_msg(prepare(r, &p, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(p->graph->nsyms, 0);
    ck_assert_int_eq(p->key[4], 1);
    tcc_artifact art;
    ck_assert_msg(tcc_compile(p, NULL, &art, &err) == 0, "%s", err.msg);
    Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
    ck_assert_int_eq(m->abi_version, 1);
    ck_assert_int_eq(m->n_symbols, 0);
    ck_assert_ptr_null(strstr(art.source, "tcc_S"));
    tcc__v1__manifest__free_unpacked(m, NULL);
    tcc_artifact_free(&art);
    tcc_prepared_free(p);
    reqb_free(r);
  }
}
END_TEST

START_TEST(unequal_symbols_that_must_match_are_refused) {
  /* out0 = softmax(...x...) + y needs x's and y's batch equal: with two
   * symbols the graph fails at other sizes */
  reqb *r = graph(8, 1, SYM_S0, SYM_S1);
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_int_eq(prepare(r, &p, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "dynamic shapes"));
  reqb_free(r);
}
END_TEST

START_TEST(fixed_size_argument_is_refused) {
  /* view(x, [8 * 37]) fixes the batch: UNIMPLEMENTED, not a wrong kernel */
  reqb *r = reqb_new("x86-64-v2");
  Tcc__V1__TensorMeta *mx = reqb_value(r, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){8, W}, NULL, 0);
  mx->n_sym_sizes = 2;
  mx->sym_sizes = SYM_S0;
  reqb_value(r, "v", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){8 * W}, NULL, 0);
  reqb_input(r, "x");
  Tcc__V1__Node *n = reqb_node(r, "aten.view.default", "v");
  reqb_arg_tensor(r, n, "self", "x");
  static int64_t shape[] = {8 * W};
  static Tcc__V1__IntList sl = {PROTOBUF_C_MESSAGE_INIT(&tcc__v1__int_list__descriptor), 1, shape};
  Tcc__V1__Argument *a = reqb_arg_int(r, n, "size", 0);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_INTS;
  a->as_ints = &sl;
  reqb_output(r, "v");
  reqb_options(r)->dynamic = 1;
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_int_eq(prepare(r, &p, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "aten.view.default"));
  reqb_free(r);
}
END_TEST

START_TEST(bad_sym_sizes) {
  reqb *r = graph(8, 1, SYM_S0, SYM_S0);
  Tcc__V1__TensorMeta *mx = reqb_req(r)->graph->values[0]->meta;
  static char *bad[] = {"0bad", ""};
  mx->sym_sizes = bad;
  tcc_prepared *p;
  tcc_error err = {0};
  ck_assert_int_eq(prepare(r, &p, &err), TCC_E_INVALID_ARGUMENT);
  mx->sym_sizes = SYM_S0;
  mx->n_sym_sizes = 1;   /* not the rank */
  ck_assert_int_eq(prepare(r, &p, &err), TCC_E_INVALID_ARGUMENT);
  reqb_free(r);
}
END_TEST

int main(void) {
  tcc_error err = {0};
  if (tcc_toolchain_identity(NULL, identity, sizeof identity, &err)) {
    fprintf(stderr, "toolchain: %s\n", err.msg);
    return 1;
  }
  seed = (unsigned)tt_seed("test_dynamic");
  Suite *s = suite_create("dynamic");
  /* "front": nothing generated runs (CK_RUN_CASE=front under valgrind);
   * "run": compiled kernels run (OpenBLAS, OpenMP) */
  TCase *tf = tcase_create("front");
  tcase_set_timeout(tf, 300);
  tcase_add_test(tf, same_hash_for_every_example_size);
  tcase_add_test(tf, key_documents_symbols);
  tcase_add_test(tf, static_request_unchanged);
  tcase_add_test(tf, unequal_symbols_that_must_match_are_refused);
  tcase_add_test(tf, fixed_size_argument_is_refused);
  tcase_add_test(tf, bad_sym_sizes);
  tcase_add_test(tf, compile_manifest_polynomials);
  tcase_add_test(tf, cuda_is_unimplemented);
  suite_add_tcase(s, tf);
  TCase *tc = tcase_create("run");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, one_artifact_many_sizes);
  tcase_add_test(tc, guards_refuse);
  suite_add_tcase(s, tc);
  return tt_run_suite(s, 0);
}
