/*
 * test_schema.c — the op table and the FunctionSchema parser.
 *
 * Every row of ops.h must parse and name itself consistently; the parser
 * must handle the schema forms of native_functions.yaml that later ops
 * use, and reject malformed ones with a position.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "tcctest.h"

START_TEST(table_parses) {
  tcc_error err;
  ck_assert_int_eq(tcc_ops_init(&err), 0);
  ck_assert_int_eq(tcc_ops_init(&err), 0);   /* idempotent */
  for (int i = 0; i < TCC_OP_COUNT; i++) {
    const tcc_op *op = tcc_op_get(i);
    ck_assert_ptr_nonnull(op);
    ck_assert_ptr_eq(tcc_op_find(op->name), op);
    ck_assert_int_eq(op->id, i);
    ck_assert_ptr_nonnull(op->infer);
    ck_assert_ptr_nonnull(op->lower);
    ck_assert_int_ge(op->schema.nparams, 1);
    ck_assert_int_ge(op->schema.nreturns, 1);
  }
  ck_assert_ptr_null(tcc_op_find("aten.foo.bar"));
  ck_assert_ptr_null(tcc_op_find(""));
  ck_assert_ptr_null(tcc_op_find(NULL));
}
END_TEST

/* The ops this task must have, by their ATen overload names. */
START_TEST(required_ops_present) {
  static const char *const names[] = {
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
    "aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar",
    "aten.neg.default", "aten.abs.default", "aten.exp.default", "aten.log.default",
    "aten.sqrt.default", "aten.sin.default", "aten.cos.default", "aten.tanh.default",
    "aten.sigmoid.default", "aten.relu.default",
  };
  ck_assert_int_eq(tcc_ops_init(NULL), 0);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ck_assert_msg(tcc_op_find(names[i]) != NULL, "%s missing", names[i]);
}
END_TEST

START_TEST(add_tensor_schema) {
  ck_assert_int_eq(tcc_ops_init(NULL), 0);
  const tcc_schema *s = &tcc_op_find("aten.add.Tensor")->schema;
  ck_assert_str_eq(s->name, "add");
  ck_assert_str_eq(s->overload, "Tensor");
  ck_assert_int_eq(s->nparams, 3);
  ck_assert_str_eq(s->params[0].name, "self");
  ck_assert_int_eq(s->params[0].type, TCC_PT_TENSOR);
  ck_assert_int_eq(s->params[0].kwarg_only, 0);
  ck_assert_int_eq(s->params[0].has_default, 0);
  ck_assert_str_eq(s->params[1].name, "other");
  ck_assert_str_eq(s->params[2].name, "alpha");
  ck_assert_int_eq(s->params[2].type, TCC_PT_SCALAR);
  ck_assert_int_eq(s->params[2].kwarg_only, 1);
  ck_assert_int_eq(s->params[2].has_default, 1);
  ck_assert_int_eq(s->params[2].def.kind, TCC_ARG_INT);
  ck_assert_int_eq(s->params[2].def.i, 1);
  ck_assert_int_eq(tcc_schema_param(s, "alpha"), 2);
  ck_assert_int_eq(tcc_schema_param(s, "beta"), -1);
  /* add.Scalar: alpha is positional there */
  const tcc_schema *t = &tcc_op_find("aten.add.Scalar")->schema;
  ck_assert_int_eq(t->params[1].type, TCC_PT_SCALAR);
  ck_assert_int_eq(t->params[2].kwarg_only, 0);
  ck_assert_str_eq(tcc_op_find("aten.sin.default")->schema.overload, "");
}
END_TEST

/* Schemas of ops a later task adds: the parser must take them now. */
START_TEST(future_schemas) {
  static const char *const good[] = {
    "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
    "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
    "convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
    "avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
    "gelu(Tensor self, *, str approximate='none') -> Tensor",
    "add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",
    "var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
    "native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_invstd, bool train, float eps, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
    "leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor",
    "hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor",
    "arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    "aten::unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]",
    "native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)",
    "_foreach_add.Scalar(Tensor[] self, Scalar scalar) -> Tensor[]",
    "nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)",
    "_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
    "std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
    "bernoulli.p(Tensor self, float p=0.5, *, Generator? generator=None) -> Tensor",
    "full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    "_fused_moving_avg_obs_fq_helper(Tensor self, Tensor observer_on, Tensor fake_quant_on, Tensor(a!) running_min, Tensor(b!) running_max, Tensor(c!) scale, Tensor(d!) zero_point, float averaging_const, int quant_min, int quant_max, int ch_axis, bool per_row_fake_quant=False, bool symmetric_quant=False) -> (Tensor output, Tensor mask)",
    "foo() -> ()",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    tcc_schema s;
    tcc_error err;
    int rc = tcc_schema_parse(good[i], &s, &err);
    ck_assert_msg(rc == 0, "%s: %s", good[i], err.msg);
  }
  tcc_schema s;
  ck_assert_int_eq(tcc_schema_parse(good[0], &s, NULL), 0);
  ck_assert_int_eq(s.params[1].type, TCC_PT_INT);
  ck_assert_int_eq(s.params[1].is_list, 1);
  ck_assert_int_eq(s.params[1].list_len, 1);
  ck_assert_int_eq(s.params[1].optional, 1);
  ck_assert_int_eq(s.params[1].has_default, 0);
  ck_assert_int_eq(s.params[2].def.kind, TCC_ARG_BOOL);
  ck_assert_int_eq(s.params[3].kwarg_only, 1);
  ck_assert_int_eq(s.params[3].def.kind, TCC_ARG_NONE);

  ck_assert_int_eq(tcc_schema_parse(good[3], &s, NULL), 0);
  ck_assert_int_eq(s.nreturns, -1);                    /* Tensor[] */
  ck_assert_int_eq(tcc_schema_parse(good[4], &s, NULL), 0);
  ck_assert_int_eq(s.params[1].elem_optional, 1);      /* Tensor?[] */
  ck_assert_int_eq(s.params[1].optional, 0);
  ck_assert_int_eq(tcc_schema_parse(good[6], &s, NULL), 0);
  ck_assert_int_eq(s.params[3].def.kind, TCC_ARG_INTS);  /* int[2] padding=0 -> [0, 0] */
  ck_assert_int_eq(s.params[3].def.n, 2);
  ck_assert_int_eq(s.params[2].def.n, 0);                 /* stride=[] */
  ck_assert_int_eq(tcc_schema_parse(good[7], &s, NULL), 0);
  ck_assert_str_eq(s.params[1].def.s, "none");
  ck_assert_int_eq(tcc_schema_parse(good[8], &s, NULL), 0);
  ck_assert_int_eq(s.params[0].mutates, 1);
  ck_assert_int_eq(tcc_schema_parse(good[12], &s, NULL), 0);
  ck_assert_int_eq(s.nreturns, 3);
  ck_assert_int_eq(s.params[9].list_len, 3);
  ck_assert_int_eq(tcc_schema_parse(good[13], &s, NULL), 0);
  ck_assert_int_eq(s.params[1].def.kind, TCC_ARG_FLOAT);
  ck_assert(s.params[1].def.f == 0.01);
  ck_assert_int_eq(tcc_schema_parse(good[14], &s, NULL), 0);
  ck_assert_int_eq(s.params[1].def.kind, TCC_ARG_INT);
  ck_assert_int_eq(s.params[1].def.i, -1);
  ck_assert_int_eq(tcc_schema_parse(good[25], &s, NULL), 0);
  ck_assert_int_eq(s.nparams, 0);
  ck_assert_int_eq(s.nreturns, 0);
}
END_TEST

START_TEST(bad_schemas) {
  static const struct {
    const char *text, *want;
  } bad[] = {
    {"add(Tensor self", "expected ',' or ')'"},
    {"foo(Blah x) -> Tensor", "unknown type"},
    {"f(Tensor x, Tensor x) -> Tensor", "duplicate parameter"},
    {"f(int x=None) -> Tensor", "None default on a non-optional"},
    {"f(Tensor x) Tensor", "expected '->'"},
    {"f(Tensor x) -> Tensor junk more", "trailing text"},
    {"f(int[0] x) -> Tensor", "bad list length"},
    {"f(bool x=maybe) -> Tensor", "bad bool default"},
    {"f(int x=1.5) -> Tensor", "bad int default"},
    {"f(Tensor x, *, *, Tensor y) -> Tensor", "second '*'"},
    {"", "expected a name"},
    {"f(Tensor(a x -> Tensor", "unterminated alias"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tcc_schema s;
    tcc_error err;
    ck_assert_int_eq(tcc_schema_parse(bad[i].text, &s, &err), TCC_E_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, bad[i].want) != NULL, "'%s': got '%s'", bad[i].text, err.msg);
    ck_assert_msg(strstr(err.msg, "offset") != NULL, "no position in '%s'", err.msg);
  }
}
END_TEST

START_TEST(param_type_text) {
  tcc_schema s;
  char buf[48];
  ck_assert_int_eq(tcc_schema_parse("f(Tensor?[] a, int[2]? b, Scalar c) -> Tensor", &s, NULL), 0);
  ck_assert_str_eq(tcc_param_type_str(&s.params[0], buf, sizeof buf), "Tensor?[]");
  ck_assert_str_eq(tcc_param_type_str(&s.params[1], buf, sizeof buf), "int[2]?");
  ck_assert_str_eq(tcc_param_type_str(&s.params[2], buf, sizeof buf), "Scalar");
}
END_TEST

START_TEST(promotion) {
  const int F32 = TCC__V1__DTYPE__FLOAT32, F64 = TCC__V1__DTYPE__FLOAT64,
            F16 = TCC__V1__DTYPE__FLOAT16, BF16 = TCC__V1__DTYPE__BFLOAT16,
            I8 = TCC__V1__DTYPE__INT8, U8 = TCC__V1__DTYPE__UINT8, I32 = TCC__V1__DTYPE__INT32,
            I64 = TCC__V1__DTYPE__INT64, B = TCC__V1__DTYPE__BOOL, I16 = TCC__V1__DTYPE__INT16;
  ck_assert_int_eq(tcc_dtype_promote(F32, F64), F64);
  ck_assert_int_eq(tcc_dtype_promote(F64, F32), F64);
  ck_assert_int_eq(tcc_dtype_promote(F16, BF16), F32);
  ck_assert_int_eq(tcc_dtype_promote(F16, F32), F32);
  ck_assert_int_eq(tcc_dtype_promote(I64, F16), F16);
  ck_assert_int_eq(tcc_dtype_promote(U8, I8), I16);
  ck_assert_int_eq(tcc_dtype_promote(U8, I32), I32);
  ck_assert_int_eq(tcc_dtype_promote(B, U8), U8);
  ck_assert_int_eq(tcc_dtype_promote(I32, I64), I64);
  ck_assert_int_eq(tcc_dtype_promote(B, B), B);
  ck_assert_int_eq(tcc_dtype_size(F64), 8);
  ck_assert_int_eq(tcc_dtype_size(0), 0);
  ck_assert_int_eq(tcc_dtype_valid(11), 0);
  ck_assert_str_eq(tcc_dtype_name(BF16), "bfloat16");
}
END_TEST

START_TEST(published_ops) {
  size_t n = tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CPU, NULL, 0);
  ck_assert_uint_eq(n, TCC_OP_COUNT);
  tcc_op_info *ops = calloc(n, sizeof *ops);
  ck_assert_uint_eq(tcc_compiler_ops(0, ops, n), n);
  ck_assert_str_eq(ops[0].target, "aten.add.Tensor");
  ck_assert_str_eq(ops[0].schema, "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  ck_assert_str_eq(ops[0].kind, "pointwise");
  for (size_t i = 0; i < n; i++) ck_assert_ptr_nonnull(tcc_op_find(ops[i].target));
  free(ops);
  tcc_op_info one;
  ck_assert_uint_eq(tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CPU, &one, 1), n);   /* truncated */
  /* CUDA: every op but the CPU attention op; the extern steps are the
   * matmul family and convolution (cuBLAS GEMMs on the client) */
  size_t ncuda = tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CUDA, NULL, 0);
  ck_assert_uint_gt(ncuda, 100);
  ck_assert_uint_le(ncuda, n);
  tcc_op_info *cops = calloc(ncuda, sizeof *cops);
  ck_assert_uint_eq(tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CUDA, cops, ncuda), ncuda);
  int mm = 0, conv = 0;
  for (size_t i = 0; i < ncuda; i++) {
    if (!strcmp(cops[i].kind, "extern"))
      ck_assert_msg(strstr(cops[i].target, "mm.") || strstr(cops[i].target, "matmul") ||
                        strstr(cops[i].target, "linear") || strstr(cops[i].target, "convolution"),
                    "CUDA lists extern op %s", cops[i].target);
    mm += !strcmp(cops[i].target, "aten.mm.default");
    conv += !strncmp(cops[i].target, "aten.convolution", 16);
    ck_assert_ptr_null(strstr(cops[i].target, "flash_attention"));
  }
  ck_assert_int_eq(mm, 1);
  ck_assert_int_eq(conv, 2);
  free(cops);
  ck_assert_uint_eq(tcc_compiler_ops(7, NULL, 0), 0);  /* an unknown device */
  Tcc__V1__DType dts[4];
  ck_assert_uint_eq(tcc_compiler_dtypes(TCC__V1__DEVICE_TYPE__CPU, dts, 4), 10);
  ck_assert_int_eq(dts[0], TCC__V1__DTYPE__FLOAT32);
  ck_assert_int_eq(dts[1], TCC__V1__DTYPE__FLOAT64);
  ck_assert_uint_eq(tcc_compiler_dtypes(TCC__V1__DEVICE_TYPE__CUDA, dts, 4), 10);
}
END_TEST

int main(void) {
  return tt_run_tests("schema", 0, 0, (const TTest *[]){
      table_parses,
      required_ops_present,
      add_tensor_schema,
      future_schemas,
      bad_schemas,
      param_type_text,
      promotion,
      published_ops,
      NULL});
}
