/*
 * make_corpus.c — writes the fuzzer's seed corpus (encoded
 * CompileRequests) into a directory: valid graphs that cover every op,
 * broadcasting, strides, offsets, constants and targets, and a few
 * invalid ones (cycle, dangling reference, bad dtype, unknown op, wrong
 * arity, truncation). The files in tests/fuzz/corpus/ were made with
 *   build-fuzz/tests/fuzz/make-corpus tests/fuzz/corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcctest.h"

#define F32 TCC__V1__DTYPE__FLOAT32
#define F64 TCC__V1__DTYPE__FLOAT64

static const char *dir;

static void save(reqb *b, const char *name, size_t cut) {
  size_t len;
  uint8_t *buf = reqb_pack(b, &len);
  if (cut && cut < len) len = cut;
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    perror(path);
    exit(1);
  }
  fclose(f);
  free(buf);
  reqb_free(b);
}

static reqb *sin_cos(void) { return reqb_sin_cos("x86-64-v2"); }

/* Every op, chained, over a broadcast of a transposed [4,1,5] and an
 * offset [3,5]; two outputs. */
static reqb *chain(int dt) {
  static const char *const unary[] = {"aten.neg.default", "aten.abs.default", "aten.exp.default",
                                      "aten.log.default", "aten.sqrt.default", "aten.sin.default",
                                      "aten.cos.default", "aten.tanh.default",
                                      "aten.sigmoid.default", "aten.relu.default"};
  static const char *const binary[] = {"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                                       "aten.div.Tensor"};
  static const char *const scalar[] = {"aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar",
                                       "aten.div.Scalar"};
  static const int64_t out[] = {4, 3, 5};
  reqb *b = reqb_new("x86-64-v3");
  reqb_value(b, "x", dt, 3, (int64_t[]){4, 1, 5}, (int64_t[]){1, 4, 4}, 3);
  reqb_value(b, "y", dt, 2, (int64_t[]){3, 5}, (int64_t[]){8, 1}, 7);
  reqb_input(b, "x");
  reqb_input(b, "y");
  char prev[16] = "x", name[16];
  int k = 0;
  for (size_t i = 0; i < 4; i++, k++) {
    snprintf(name, sizeof name, "t%d", k);
    reqb_value(b, name, dt, 3, out, NULL, 0);
    Tcc__V1__Node *n = reqb_binary(b, binary[i], prev, "y", name);
    if (i < 2) reqb_arg_float(b, n, "alpha", 0.5);
    strcpy(prev, name);
  }
  for (size_t i = 0; i < 4; i++, k++) {
    snprintf(name, sizeof name, "t%d", k);
    reqb_value(b, name, dt, 3, out, NULL, 0);
    Tcc__V1__Node *n = reqb_node(b, scalar[i], name);
    reqb_arg_tensor(b, n, "", prev);
    if (i % 2) reqb_arg_int(b, n, "", 3);
    else reqb_arg_float(b, n, "", 1.5);
    strcpy(prev, name);
  }
  for (size_t i = 0; i < 10; i++, k++) {
    snprintf(name, sizeof name, "t%d", k);
    reqb_value(b, name, dt, 3, out, NULL, 0);
    reqb_unary(b, unary[i], prev, name);
    strcpy(prev, name);
  }
  reqb_output(b, prev);
  reqb_output(b, "t3");
  return b;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make-corpus DIR\n");
    return 2;
  }
  dir = argv[1];
  save(sin_cos(), "sin_cos.bin", 0);
  save(chain(F32), "chain_f32.bin", 0);
  save(chain(F64), "chain_f64.bin", 0);

  reqb *b = sin_cos();   /* constants, an input returned, mixed dtypes */
  double w[10] = {0, 1, -2, 3.5, 1e300, -0.0, 7, 8, 9, 10};
  reqb_value(b, "w", F64, 1, (int64_t[]){10}, NULL, 0);
  reqb_constant(b, "w", w, sizeof w);
  reqb_value(b, "aw", F64, 2, (int64_t[]){10, 10}, NULL, 0);
  reqb_binary(b, "aten.mul.Tensor", "add", "w", "aw");
  reqb_output(b, "aw");
  reqb_output(b, "x");
  save(b, "constants.bin", 0);

  b = sin_cos();         /* CUDA target */
  tt_request_to_cuda(reqb_req(b), reqb_str(b, "sm_90"));
  save(b, "cuda.bin", 0);

  b = sin_cos();         /* options, features, requires_grad */
  reqb_options(b)->mode = TCC__V1__MODE__MAX_AUTOTUNE;
  reqb_options(b)->dynamic = 1;
  static char *feats[] = {"avx2", "fma"};
  reqb_target(b)->cpu_features = feats;
  reqb_target(b)->n_cpu_features = 2;
  reqb_req(b)->graph->values[0]->meta->requires_grad = 1;
  save(b, "options.bin", 0);

  b = sin_cos();         /* dynamic shapes: dim 0 of x and y is symbol s0 */
  reqb_options(b)->dynamic = 1;
  static char *syms[] = {"s0", ""};
  for (size_t i = 0; i < 2; i++) {
    reqb_req(b)->graph->values[i]->meta->sym_sizes = syms;
    reqb_req(b)->graph->values[i]->meta->n_sym_sizes = 2;
  }
  save(b, "dynamic.bin", 0);

  b = sin_cos();         /* invalid: cycle */
  reqb_req(b)->graph->nodes[0]->inputs[0]->arg->as_tensor->name = reqb_str(b, "add");
  save(b, "bad_cycle.bin", 0);
  b = sin_cos();         /* invalid: dangling */
  reqb_req(b)->graph->nodes[2]->inputs[1]->arg->as_tensor->name = reqb_str(b, "nope");
  save(b, "bad_dangling.bin", 0);
  b = sin_cos();         /* invalid: dtype */
  reqb_req(b)->graph->values[1]->meta->dtype = (Tcc__V1__DType)0;
  save(b, "bad_dtype.bin", 0);
  b = sin_cos();         /* unknown op */
  reqb_req(b)->graph->nodes[1]->target = reqb_str(b, "aten.foo.bar");
  save(b, "bad_op.bin", 0);
  b = sin_cos();         /* arity */
  reqb_arg_int(b, reqb_req(b)->graph->nodes[2], "", 2);
  save(b, "bad_arity.bin", 0);
  save(sin_cos(), "bad_truncated.bin", 150);
  return 0;
}
