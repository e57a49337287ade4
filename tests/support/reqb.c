/* reqb.c — CompileRequest messages built by hand (see tcctest.h). Fixed
 * capacities; exceeding one aborts the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcctest.h"

#define RB_VALUES 512
#define RB_NODES 512
#define RB_ARGS 12
#define RB_OUTS 5   /* batch norm (functional): 5 */
#define RB_STRS 4096

struct reqb {
  Tcc__V1__CompileRequest req;
  Tcc__V1__Graph graph;
  Tcc__V1__Target target;
  Tcc__V1__Options options;
  Tcc__V1__TensorValue vals[RB_VALUES];
  Tcc__V1__TensorValue *valp[RB_VALUES];
  Tcc__V1__TensorMeta metas[RB_VALUES];
  Tcc__V1__Device devs[RB_VALUES];
  int64_t sizes[RB_VALUES][16], strides[RB_VALUES][16];
  char *inputs[RB_VALUES], *outputs[RB_VALUES];
  Tcc__V1__Node nodes[RB_NODES];
  Tcc__V1__Node *nodep[RB_NODES];
  char *nodeouts[RB_NODES][RB_OUTS];
  Tcc__V1__NamedArgument nargs[RB_NODES][RB_ARGS];
  Tcc__V1__NamedArgument *nargp[RB_NODES][RB_ARGS];
  Tcc__V1__Argument args[RB_NODES][RB_ARGS];
  Tcc__V1__TensorRef refs[RB_NODES][RB_ARGS];
  Tcc__V1__Constant consts[RB_VALUES];
  Tcc__V1__Constant *constp[RB_VALUES];
  char *strs[RB_STRS];
  int nstrs;
};

static void need(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "reqb: capacity exceeded: %s\n", what);
    abort();
  }
}

char *reqb_str(reqb *b, const char *s) {
  need(b->nstrs < RB_STRS, "strings");
  char *c = strdup(s ? s : "");
  need(c != NULL, "memory");
  b->strs[b->nstrs++] = c;
  return c;
}

reqb *reqb_new(const char *isa) {
  reqb *b = calloc(1, sizeof *b);
  need(b != NULL, "memory");
  tcc__v1__compile_request__init(&b->req);
  tcc__v1__graph__init(&b->graph);
  tcc__v1__target__init(&b->target);
  tcc__v1__options__init(&b->options);
  b->target.device = TCC__V1__DEVICE_TYPE__CPU;
  b->target.cpu_isa = reqb_str(b, isa);
  b->req.graph = &b->graph;
  b->req.target = &b->target;
  b->req.options = &b->options;
  b->req.client = reqb_str(b, "test");
  b->graph.values = b->valp;
  b->graph.inputs = b->inputs;
  b->graph.outputs = b->outputs;
  b->graph.nodes = b->nodep;
  b->graph.constants = b->constp;
  return b;
}

void reqb_free(reqb *b) {
  if (!b) return;
  for (int i = 0; i < b->nstrs; i++) free(b->strs[i]);
  free(b);
}

Tcc__V1__TensorMeta *reqb_value(reqb *b, const char *name, int dt, int rank, const int64_t *sizes,
                                const int64_t *strides, int64_t offset) {
  size_t i = b->graph.n_values;
  need(i < RB_VALUES && rank <= 16, "values");
  Tcc__V1__TensorValue *v = &b->vals[i];
  Tcc__V1__TensorMeta *m = &b->metas[i];
  tcc__v1__tensor_value__init(v);
  tcc__v1__tensor_meta__init(m);
  tcc__v1__device__init(&b->devs[i]);
  b->devs[i].type = TCC__V1__DEVICE_TYPE__CPU;
  v->name = reqb_str(b, name);
  v->meta = m;
  m->dtype = (Tcc__V1__DType)dt;
  m->device = &b->devs[i];
  m->n_sizes = m->n_strides = (size_t)rank;
  m->sizes = b->sizes[i];
  m->strides = b->strides[i];
  m->storage_offset = offset;
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    b->sizes[i][d] = sizes[d];
    b->strides[i][d] = strides ? strides[d] : s;
    s *= sizes[d] > 1 ? sizes[d] : 1;
  }
  b->valp[i] = v;
  b->graph.n_values++;
  return m;
}

void reqb_input(reqb *b, const char *name) {
  need(b->graph.n_inputs < RB_VALUES, "inputs");
  b->inputs[b->graph.n_inputs++] = reqb_str(b, name);
}

void reqb_output(reqb *b, const char *name) {
  need(b->graph.n_outputs < RB_VALUES, "outputs");
  b->outputs[b->graph.n_outputs++] = reqb_str(b, name);
}

void reqb_constant(reqb *b, const char *name, const void *data, size_t len) {
  size_t i = b->graph.n_constants;
  need(i < RB_VALUES, "constants");
  Tcc__V1__Constant *c = &b->consts[i];
  tcc__v1__constant__init(c);
  c->name = reqb_str(b, name);
  need(b->nstrs < RB_STRS, "strings");
  uint8_t *copy = malloc(len ? len : 1);
  need(copy != NULL, "memory");
  if (len) memcpy(copy, data, len);
  b->strs[b->nstrs++] = (char *)copy;
  c->data.data = copy;
  c->data.len = len;
  b->constp[i] = c;
  b->graph.n_constants++;
}

static int node_index(reqb *b, Tcc__V1__Node *n) { return (int)(n - b->nodes); }

Tcc__V1__Node *reqb_node(reqb *b, const char *target, const char *out) {
  size_t i = b->graph.n_nodes;
  need(i < RB_NODES, "nodes");
  Tcc__V1__Node *n = &b->nodes[i];
  tcc__v1__node__init(n);
  n->target = reqb_str(b, target);
  n->inputs = b->nargp[i];
  n->outputs = b->nodeouts[i];
  if (out) n->outputs[n->n_outputs++] = reqb_str(b, out);
  b->nodep[i] = n;
  b->graph.n_nodes++;
  return n;
}

void reqb_node_output(reqb *b, Tcc__V1__Node *n, const char *out) {
  need(n->n_outputs < RB_OUTS, "node outputs");
  n->outputs[n->n_outputs++] = reqb_str(b, out);
}

static Tcc__V1__Argument *new_arg(reqb *b, Tcc__V1__Node *n, const char *param) {
  int i = node_index(b, n);
  size_t k = n->n_inputs;
  need(k < RB_ARGS, "arguments");
  Tcc__V1__NamedArgument *na = &b->nargs[i][k];
  Tcc__V1__Argument *a = &b->args[i][k];
  tcc__v1__named_argument__init(na);
  tcc__v1__argument__init(a);
  na->name = reqb_str(b, param);
  na->arg = a;
  b->nargp[i][k] = na;
  n->n_inputs++;
  return a;
}

Tcc__V1__Argument *reqb_arg_tensor(reqb *b, Tcc__V1__Node *n, const char *param, const char *value) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  Tcc__V1__TensorRef *r = &b->refs[node_index(b, n)][n->n_inputs - 1];
  tcc__v1__tensor_ref__init(r);
  r->name = reqb_str(b, value);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_TENSOR;
  a->as_tensor = r;
  return a;
}

Tcc__V1__Argument *reqb_arg_int(reqb *b, Tcc__V1__Node *n, const char *param, int64_t v) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_INT;
  a->as_int = v;
  return a;
}

/* An int list; its storage is one builder-owned allocation (freed with
 * the strings). */
Tcc__V1__Argument *reqb_arg_ints(reqb *b, Tcc__V1__Node *n, const char *param, int count,
                                 const int64_t *v) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  need(b->nstrs < RB_STRS, "strings");
  Tcc__V1__IntList *l = calloc(1, sizeof *l + sizeof *v * (size_t)(count + 1));
  need(l != NULL, "memory");
  b->strs[b->nstrs++] = (char *)l;
  tcc__v1__int_list__init(l);
  l->values = (int64_t *)(l + 1);
  if (count) memcpy(l->values, v, sizeof *v * (size_t)count);
  l->n_values = (size_t)count;
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_INTS;
  a->as_ints = l;
  return a;
}

Tcc__V1__Argument *reqb_arg_float(reqb *b, Tcc__V1__Node *n, const char *param, double v) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_FLOAT;
  a->as_float = v;
  return a;
}

Tcc__V1__Argument *reqb_arg_bool(reqb *b, Tcc__V1__Node *n, const char *param, int v) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_BOOL;
  a->as_bool = v != 0;
  return a;
}

Tcc__V1__Argument *reqb_arg_none(reqb *b, Tcc__V1__Node *n, const char *param) {
  Tcc__V1__Argument *a = new_arg(b, n, param);
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_NONE;
  a->as_none = 1;
  return a;
}

Tcc__V1__Node *reqb_unary(reqb *b, const char *target, const char *x, const char *out) {
  Tcc__V1__Node *n = reqb_node(b, target, out);
  reqb_arg_tensor(b, n, "self", x);
  return n;
}

Tcc__V1__Node *reqb_binary(reqb *b, const char *target, const char *x, const char *y,
                           const char *out) {
  Tcc__V1__Node *n = reqb_node(b, target, out);
  reqb_arg_tensor(b, n, "self", x);
  reqb_arg_tensor(b, n, "other", y);
  return n;
}

Tcc__V1__CompileRequest *reqb_req(reqb *b) { return &b->req; }
Tcc__V1__Target *reqb_target(reqb *b) { return &b->target; }
Tcc__V1__Options *reqb_options(reqb *b) { return &b->options; }

uint8_t *reqb_pack(reqb *b, size_t *len) {
  *len = tcc__v1__compile_request__get_packed_size(&b->req);
  uint8_t *buf = malloc(*len ? *len : 1);
  need(buf != NULL, "memory");
  tcc__v1__compile_request__pack(&b->req, buf);
  return buf;
}

reqb *reqb_sin_cos(const char *isa) {
  static const int64_t s[] = {10, 10};
  const int f32 = TCC__V1__DTYPE__FLOAT32;
  reqb *b = reqb_new(isa);
  reqb_value(b, "x", f32, 2, s, NULL, 0);
  reqb_value(b, "y", f32, 2, s, NULL, 0);
  reqb_value(b, "sin", f32, 2, s, NULL, 0);
  reqb_value(b, "cos", f32, 2, s, NULL, 0);
  reqb_value(b, "add", f32, 2, s, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "y");
  reqb_unary(b, "aten.sin.default", "x", "sin");
  reqb_unary(b, "aten.cos.default", "y", "cos");
  reqb_binary(b, "aten.add.Tensor", "sin", "cos", "add");
  reqb_output(b, "add");
  return b;
}

reqb *reqb_sin_cos_rows(int64_t rows, int64_t cols) {
  const int f32 = TCC__V1__DTYPE__FLOAT32;
  reqb *b = reqb_new("");
  reqb_value(b, "x", f32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "y", f32, 1, (int64_t[]){cols}, NULL, 0);
  reqb_value(b, "s", f32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "c", f32, 1, (int64_t[]){cols}, NULL, 0);
  reqb_value(b, "o", f32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "y");
  reqb_unary(b, "aten.sin.default", "x", "s");
  reqb_unary(b, "aten.cos.default", "y", "c");
  reqb_binary(b, "aten.add.Tensor", "s", "c", "o");
  reqb_output(b, "o");
  return b;
}

reqb *reqb_sum_all(int64_t n) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 1, &n, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 0, NULL, NULL, 0);
  reqb_input(b, "x");
  reqb_unary(b, "aten.sum.default", "x", "o");
  reqb_output(b, "o");
  return b;
}

reqb *reqb_softmax(const char *target, int dt, int64_t rows, int64_t cols) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", dt, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "o", dt, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_input(b, "x");
  Tcc__V1__Node *n = reqb_node(b, target, "o");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_int(b, n, "dim", 1);
  reqb_arg_bool(b, n, "half_to_float", 0);
  reqb_output(b, "o");
  return b;
}

reqb *reqb_sum_rows(int64_t rows, int64_t cols) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){rows}, NULL, 0);
  reqb_input(b, "x");
  Tcc__V1__Node *n = reqb_node(b, "aten.sum.dim_IntList", "o");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_ints(b, n, "dim", 1, (int64_t[]){1});
  reqb_output(b, "o");
  return b;
}

reqb *reqb_sum_and_squares(int64_t rows, int64_t cols) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "x2", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){rows}, NULL, 0);
  reqb_value(b, "q", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){rows}, NULL, 0);
  reqb_input(b, "x");
  Tcc__V1__Node *n = reqb_node(b, "aten.sum.dim_IntList", "o");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_ints(b, n, "dim", 1, (int64_t[]){1});
  n = reqb_node(b, "aten.mul.Tensor", "x2");
  reqb_arg_tensor(b, n, "self", "x");
  reqb_arg_tensor(b, n, "other", "x");
  n = reqb_node(b, "aten.sum.dim_IntList", "q");
  reqb_arg_tensor(b, n, "self", "x2");
  reqb_arg_ints(b, n, "dim", 1, (int64_t[]){1});
  reqb_output(b, "o");
  reqb_output(b, "q");
  return b;
}

reqb *reqb_layer_norm(int dt, int64_t rows, int64_t cols, int with_bias) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", dt, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "w", dt, 1, (int64_t[]){cols}, NULL, 0);
  if (with_bias) reqb_value(b, "bb", dt, 1, (int64_t[]){cols}, NULL, 0);
  reqb_value(b, "o", dt, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "m", dt, 2, (int64_t[]){rows, 1}, NULL, 0);
  reqb_value(b, "r", dt, 2, (int64_t[]){rows, 1}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  if (with_bias) reqb_input(b, "bb");
  Tcc__V1__Node *n = reqb_node(b, "aten.native_layer_norm.default", "o");
  reqb_node_output(b, n, "m");
  reqb_node_output(b, n, "r");
  reqb_arg_tensor(b, n, "input", "x");
  reqb_arg_ints(b, n, "normalized_shape", 1, (int64_t[]){cols});
  reqb_arg_tensor(b, n, "weight", "w");
  if (with_bias) reqb_arg_tensor(b, n, "bias", "bb");
  else reqb_arg_none(b, n, "bias");
  reqb_arg_float(b, n, "eps", 1e-5);
  reqb_output(b, "o");
  reqb_output(b, "m");
  reqb_output(b, "r");
  return b;
}

reqb *reqb_linear_gelu(int rank, const int64_t *x_sizes, int64_t n) {
  need(rank >= 1 && rank <= 16, "rank");
  int64_t out[16];
  memcpy(out, x_sizes, sizeof *out * (size_t)rank);
  out[rank - 1] = n;
  const int f32 = TCC__V1__DTYPE__FLOAT32;
  reqb *b = reqb_new("");
  reqb_value(b, "x", f32, rank, x_sizes, NULL, 0);
  reqb_value(b, "w", f32, 2, (int64_t[]){n, x_sizes[rank - 1]}, NULL, 0);
  reqb_value(b, "bias", f32, 1, (int64_t[]){n}, NULL, 0);
  reqb_value(b, "l", f32, rank, out, NULL, 0);
  reqb_value(b, "o", f32, rank, out, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_input(b, "bias");
  Tcc__V1__Node *node = reqb_node(b, "aten.linear.default", "l");
  reqb_arg_tensor(b, node, "input", "x");
  reqb_arg_tensor(b, node, "weight", "w");
  reqb_arg_tensor(b, node, "bias", "bias");
  reqb_unary(b, "aten.gelu.default", "l", "o");
  reqb_output(b, "o");
  return b;
}

reqb *reqb_conv_bias_relu(int dt) {
  reqb *b = reqb_new("");
  reqb_value(b, "x", dt, 4, (int64_t[]){2, 8, 9, 9}, NULL, 0);
  reqb_value(b, "w", dt, 4, (int64_t[]){12, 4, 3, 3}, NULL, 0);
  reqb_value(b, "bias", dt, 1, (int64_t[]){12}, NULL, 0);
  reqb_value(b, "c", dt, 4, (int64_t[]){2, 12, 5, 5}, NULL, 0);
  reqb_value(b, "y", dt, 4, (int64_t[]){2, 12, 5, 5}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_input(b, "bias");
  Tcc__V1__Node *n = reqb_node(b, "aten.convolution.default", "c");
  reqb_arg_tensor(b, n, "input", "x");
  reqb_arg_tensor(b, n, "weight", "w");
  reqb_arg_tensor(b, n, "bias", "bias");
  reqb_arg_ints(b, n, "stride", 2, (int64_t[]){2, 2});
  reqb_arg_ints(b, n, "padding", 2, (int64_t[]){1, 1});
  reqb_arg_ints(b, n, "dilation", 2, (int64_t[]){1, 1});
  reqb_arg_bool(b, n, "transposed", 0);
  reqb_arg_ints(b, n, "output_padding", 2, (int64_t[]){0, 0});
  reqb_arg_int(b, n, "groups", 2);
  n = reqb_node(b, "aten.relu.default", "y");
  reqb_arg_tensor(b, n, "self", "c");
  reqb_output(b, "y");
  return b;
}
