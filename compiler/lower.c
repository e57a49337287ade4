/*
 * lower.c — canonical graph -> loop IR (the `lower` column of ops.h).
 *
 * Requires: a canonical graph (checked by tcc_check_graph).
 * Produces: one buffer per graph input (INPUT), constant (CONST) and graph
 * output position (OUTPUT, with the layout the client declared), and per
 * node output one kernel that computes it into its "home" buffer: the
 * OUTPUT buffer when the value is returned (extra stores for every further
 * position it is returned at), else a contiguous TEMP. Nothing is fused
 * here; a value read by a later node is a LOAD of its home buffer, and
 * fuse.c inlines it. A graph output that is an input or constant gets a
 * copy kernel.
 *
 * Lowering functions (one per `lower` name in ops.h) build the body of a
 * node's output over the loop variables of the output's shape, reading
 * operands with tcc_lower_operand (which broadcasts and casts), and hand
 * it to tcc_lower_realize.
 *
 * Dtypes: arithmetic runs in the node's result dtype (torch.result_type),
 * except that float16/bfloat16 values are computed in float32 and
 * rounded once when stored (TorchInductor does the same). Integer
 * arithmetic wraps and divides like PyTorch (cpu/emit.c).
 *
 * Views (view, permute, expand, slice, select, ...) make no kernel: the
 * output's body is the input's body with its indices rewritten. A view
 * that is a graph output gets a copy kernel.
 *
 * Reductions are REDUCE expressions over fresh bound variables inside a
 * kernel over the output shape; composites (softmax, layer_norm, var,
 * logsumexp, the backward ops) are written as one expression with their
 * reductions inside, so each lowers to one kernel per output and fuse.c
 * merges them. Matmuls are EXTERN kernels (OpenBLAS) into a temporary;
 * their epilogue (bias, alpha/beta) is a pointwise kernel fuse.c can
 * merge activations into. Convolutions (conv.c) are EXTERN steps too:
 * GEMMs over packed columns, or oneDNN convolutions on the CPU.
 */
#include "loop.h"

#include <math.h>
#include <string.h>

/* Loop variables i0..i{rank-1}, the identity index of a shape. */
static int identity_index(tcc_program *p, int rank, const tcc_ix **idx) {
  for (int d = 0; d < rank; d++)
    if (!(idx[d] = tcc_ix_var(p, d))) return -1;
  return 0;
}

size_t tcc_compiler_dtypes(int device, Tcc__V1__DType *out, size_t cap) {
  static const Tcc__V1__DType cpu[] = {
    TCC__V1__DTYPE__FLOAT32, TCC__V1__DTYPE__FLOAT64, TCC__V1__DTYPE__FLOAT16,
    TCC__V1__DTYPE__BFLOAT16, TCC__V1__DTYPE__INT8, TCC__V1__DTYPE__INT16,
    TCC__V1__DTYPE__INT32, TCC__V1__DTYPE__INT64, TCC__V1__DTYPE__UINT8, TCC__V1__DTYPE__BOOL};
  size_t n = sizeof cpu / sizeof cpu[0];
  if (device != TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED && device != TCC__V1__DEVICE_TYPE__CPU &&
      device != TCC__V1__DEVICE_TYPE__CUDA)
    return 0;
  for (size_t i = 0; i < n && i < cap; i++) out[i] = cpu[i]; /* CUDA stores and computes the same */
  return n;
}

/* Dtypes the CPU backend can load, convert and store. */
static int storage_dtype_ok(tcc_dtype d) { return tcc_dtype_valid(d); }

/* The dtype arithmetic on values of dtype d runs in. */
static tcc_dtype compute_dt(tcc_dtype d) {
  return d == TCC__V1__DTYPE__FLOAT16 || d == TCC__V1__DTYPE__BFLOAT16 ? TCC__V1__DTYPE__FLOAT32 : d;
}

const tcc_vx *tcc_lower_operand(tcc_lower_ctx *lc, const tcc_arg *a, int rank,
                                const int64_t *sizes, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  switch (a->kind) {
  case TCC_ARG_TENSOR: {
    const tcc_lval *v = &lc->vals[a->v];
    const tcc_ix *idx[TCC_MAX_DIMS];
    (void)sizes;
    for (int k = 0; k < v->rank; k++)   /* right-aligned; size-1 dims read index 0 */
      idx[k] = v->sizes[k] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, k + rank - v->rank);
    return tcc_vx_cast(p, tcc_vx_subst(p, v->body, v->rank, idx), dt);
  }
  case TCC_ARG_INT:
    return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__INT64, (double)a->i, a->i), dt);
  case TCC_ARG_FLOAT:
    return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, a->f, 0), dt);
  case TCC_ARG_BOOL:
    return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__BOOL, a->i ? 1.0 : 0.0, a->i != 0), dt);
  default: return NULL;
  }
}

int tcc_lower_realize(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                      tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_graph *g = lc->g;
  int v = n->outs[o];
  if (v < 0) return 0;
  if (!body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_meta *m = &g->values[v].meta;
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (identity_index(p, m->rank, idx))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  int k = tcc_program_add_kernel(p, m->rank, m->sizes);
  if (k < 0) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  int home = -1;
  for (int i = 0; i < g->noutputs; i++) {
    if (g->outputs[i] != v) continue;
    if (tcc_kernel_add_store(p, k, lc->out_buf[i], idx, body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    if (home < 0) home = lc->out_buf[i];
  }
  if (home < 0) {
    tcc_buffer b = {.kind = TCC_BUF_TEMP, .pos = -1, .layout = *m, .value = v};
    tcc_meta_contiguous(&b.layout);
    home = tcc_program_add_buffer(p, &b);
    if (home < 0 || tcc_kernel_add_store(p, k, home, idx, body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }
  tcc_lval *lv = &lc->vals[v];
  lv->rank = m->rank;
  memcpy(lv->sizes, m->sizes, sizeof lv->sizes);
  lv->dtype = m->dtype;
  lv->body = tcc_vx_load(p, home, m->rank, idx);
  if (!lv->body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  return 0;
}

/* ------------------------------------------------------------ helpers */

static const tcc_vx *materialize(tcc_lower_ctx *lc, const tcc_vx *body, int rank,
                                 const int64_t *sizes, tcc_dtype dt);

#define OOM() tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering")
#define ARG(name) tcc_node_arg(n, name)

static const tcc_meta *out_meta(tcc_lower_ctx *lc, const tcc_node *n, int o) {
  return n->outs[o] >= 0 ? &lc->g->values[n->outs[o]].meta : NULL;
}

static const tcc_meta *arg_meta(tcc_lower_ctx *lc, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &lc->g->values[a->v].meta : NULL;
}

static const tcc_vx *cst(tcc_program *p, tcc_dtype dt, double f) {
  return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, f, 0), dt);
}

#define BIN(op, x, y) tcc_vx_binary(p, TCC_PRIM_##op, x, y)
#define UN(op, x) tcc_vx_unary(p, TCC_PRIM_##op, x)

/* Value v's body read at idx (one index per dim of v). */
static const tcc_vx *body_at(tcc_lower_ctx *lc, int v, const tcc_ix *const *idx) {
  const tcc_lval *lv = &lc->vals[v];
  return tcc_vx_subst(lc->prog, lv->body, lv->rank, idx);
}

/* Identity index i0..i{rank-1}. */
static int ident(tcc_program *p, int rank, const tcc_ix **idx) { return identity_index(p, rank, idx); }

/* Sets a view's body: no kernel, unless the value is a graph output. */
static int set_view(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                    tcc_error *err) {
  int v = n->outs[o];
  if (v < 0) return 0;
  if (!body) return OOM();
  for (int i = 0; i < lc->g->noutputs; i++)
    if (lc->g->outputs[i] == v) return tcc_lower_realize(lc, n, o, body, err);
  const tcc_meta *m = &lc->g->values[v].meta;
  tcc_lval *lv = &lc->vals[v];
  lv->rank = m->rank;
  memcpy(lv->sizes, m->sizes, sizeof lv->sizes);
  lv->dtype = m->dtype;
  lv->body = body;
  return 0;
}

/* Result: cast to the output dtype and realized. */
static int result(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                  tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, o);
  if (!m) return 0;
  return tcc_lower_realize(lc, n, o, tcc_vx_cast(lc->prog, body, m->dtype), err);
}

/* Operand `a` broadcast to the output of node n, in dtype dt. */
static const tcc_vx *opnd(tcc_lower_ctx *lc, const tcc_node *n, const tcc_arg *a, tcc_dtype dt) {
  const tcc_meta *m = out_meta(lc, n, 0);
  return tcc_lower_operand(lc, a, m->rank, m->sizes, dt);
}

/* ------------------------------------------------- pointwise ops */

/* y = prim(x) */
int tcc_lower_unary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *x = opnd(lc, n, &n->args[0], cd);
  tcc_prim op = n->op->prim;
  if (cd == TCC__V1__DTYPE__BOOL) {
    if (op == TCC_PRIM_BITNOT) op = TCC_PRIM_NOT;
    if (op == TCC_PRIM_ABS || op == TCC_PRIM_RELU || op == TCC_PRIM_SIGN) return result(lc, n, 0, x, err);
    if (op == TCC_PRIM_NEG)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): negation on a bool tensor "
                           "is not supported", n->src_index, n->op->name);
  }
  if (op == TCC_PRIM_NOT) return result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_NOT, x, NULL), err);
  return result(lc, n, 0, tcc_vx_unary(p, op, x), err);
}

/* floor/ceil/round/trunc: identity on integers. */
int tcc_lower_rounding(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  if (!tcc_dtype_is_float(m->dtype)) return result(lc, n, 0, opnd(lc, n, &n->args[0], m->dtype), err);
  return tcc_lower_unary(lc, n, err);
}

/* isnan/isinf: false on integers. */
int tcc_lower_predicate(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  if (!tcc_dtype_is_float(x->dtype))
    return result(lc, n, 0, tcc_vx_const(p, TCC__V1__DTYPE__BOOL, 0, 0), err);
  const tcc_vx *v = opnd(lc, n, &n->args[0], compute_dt(x->dtype));
  return result(lc, n, 0, tcc_vx_pred(p, n->op->prim, v, NULL), err);
}

/* y = prim(a, b), with b scaled by `alpha` when the schema has it
 * (add/sub: a + alpha * b). Bool add/mul are or/and. */
int tcc_lower_binary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  int ia = tcc_schema_param(&n->op->schema, "self");
  int ib = ia == 0 ? 1 : 0;
  if (ia < 0) ia = 0;
  const tcc_vx *a = opnd(lc, n, &n->args[ia], cd);
  const tcc_vx *b = opnd(lc, n, &n->args[ib], cd);
  tcc_prim op = n->op->prim;
  const tcc_arg *alpha = ARG("alpha");
  if (alpha) {
    int is_one = (alpha->kind == TCC_ARG_INT && alpha->i == 1) ||
                 (alpha->kind == TCC_ARG_FLOAT && alpha->f == 1.0) ||
                 (alpha->kind == TCC_ARG_BOOL && alpha->i == 1);
    if (!is_one) b = BIN(MUL, b, tcc_lower_operand(lc, alpha, 0, NULL, cd));
  }
  if (cd == TCC__V1__DTYPE__BOOL) {
    if (op == TCC_PRIM_ADD || op == TCC_PRIM_MAX) return result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_OR, a, b), err);
    if (op == TCC_PRIM_MUL || op == TCC_PRIM_MIN) return result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_AND, a, b), err);
    if (op == TCC_PRIM_SUB)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): subtraction of bool "
                           "tensors is not supported", n->src_index, n->op->name);
  }
  return result(lc, n, 0, tcc_vx_binary(p, op, a, b), err);
}

int tcc_lower_square(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *x = opnd(lc, n, &n->args[0], compute_dt(m->dtype));
  if (x && x->dtype == TCC__V1__DTYPE__BOOL) return result(lc, n, 0, x, err);
  return result(lc, n, 0, BIN(MUL, x, x), err);
}

int tcc_lower_div_mode(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *a = opnd(lc, n, &n->args[0], cd), *b = opnd(lc, n, &n->args[1], cd);
  const tcc_arg *mode = ARG("rounding_mode");
  tcc_prim op = TCC_PRIM_DIV;
  if (mode->kind == TCC_ARG_STRING) op = mode->s[0] == 't' ? TCC_PRIM_TRUNCDIV : TCC_PRIM_FLOORDIV;
  if (cd == TCC__V1__DTYPE__BOOL) {
    a = tcc_vx_cast(p, a, TCC__V1__DTYPE__INT64);
    b = tcc_vx_cast(p, b, TCC__V1__DTYPE__INT64);
  }
  return result(lc, n, 0, tcc_vx_binary(p, op, a, b), err);
}

int tcc_lower_compare(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (!out_meta(lc, n, 0)) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(tcc_operands_result_type(lc->g, n));
  const tcc_vx *a = opnd(lc, n, &n->args[0], cd), *b = opnd(lc, n, &n->args[1], cd);
  return result(lc, n, 0, tcc_vx_pred(p, n->op->prim, a, b), err);
}

int tcc_lower_logical(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (!out_meta(lc, n, 0)) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *a = opnd(lc, n, &n->args[0], TCC__V1__DTYPE__BOOL);
  const tcc_vx *b = n->op->prim == TCC_PRIM_NOT ? NULL : opnd(lc, n, &n->args[1], TCC__V1__DTYPE__BOOL);
  return result(lc, n, 0, tcc_vx_pred(p, n->op->prim, a, b), err);
}

int tcc_lower_where(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *c = opnd(lc, n, ARG("condition"), TCC__V1__DTYPE__BOOL);
  const tcc_vx *a = opnd(lc, n, ARG("self"), cd), *b = opnd(lc, n, ARG("other"), cd);
  return result(lc, n, 0, tcc_vx_where(p, c, a, b), err);
}

int tcc_lower_clamp(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *x = opnd(lc, n, ARG("self"), cd);
  const tcc_arg *lo = ARG("min"), *hi = ARG("max");
  if (lo->kind == TCC_ARG_NONE && hi->kind == TCC_ARG_NONE)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): at least one of 'min' or "
                         "'max' must not be None", n->src_index, n->op->name);
  if (lo->kind != TCC_ARG_NONE) x = BIN(MAX, x, opnd(lc, n, lo, cd));
  if (hi->kind != TCC_ARG_NONE) x = BIN(MIN, x, opnd(lc, n, hi, cd));
  return result(lc, n, 0, x, err);
}

/* gelu(x) = x/2 (1 + erf(x/sqrt 2)), or the tanh approximation */
static const tcc_vx *gelu_of(tcc_program *p, const tcc_vx *x, int tanh_approx) {
  tcc_dtype d = x->dtype;
  const tcc_vx *half = cst(p, d, 0.5), *one = cst(p, d, 1.0);
  if (tanh_approx) {
    const tcc_vx *inner = BIN(MUL, cst(p, d, 0.7978845608028654),
                              BIN(ADD, x, BIN(MUL, cst(p, d, 0.044715), BIN(MUL, x, BIN(MUL, x, x)))));
    return BIN(MUL, BIN(MUL, half, x), BIN(ADD, one, UN(TANH, inner)));
  }
  return BIN(MUL, BIN(MUL, x, half), BIN(ADD, one, UN(ERF, BIN(MUL, x, cst(p, d, 0.70710678118654752440)))));
}

static int approx_tanh(const tcc_node *n, tcc_error *err, int *out) {
  const tcc_arg *a = tcc_node_arg(n, "approximate");
  *out = 0;
  if (!a || a->kind != TCC_ARG_STRING || strcmp(a->s, "none") == 0) return 0;
  if (strcmp(a->s, "tanh") == 0) {
    *out = 1;
    return 0;
  }
  return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): approximate must be 'none' or "
                       "'tanh'", n->src_index, n->op->name);
}

int tcc_lower_gelu(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  int t, rc = approx_tanh(n, err, &t);
  if (rc) return rc;
  return result(lc, n, 0, gelu_of(lc->prog, opnd(lc, n, &n->args[0], compute_dt(m->dtype)), t), err);
}

int tcc_lower_gelu_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int t, rc = approx_tanh(n, err, &t);
  if (rc) return rc;
  tcc_dtype d = compute_dt(m->dtype);
  const tcc_vx *g = opnd(lc, n, ARG("grad_output"), d), *x = opnd(lc, n, ARG("self"), d);
  const tcc_vx *half = cst(p, d, 0.5), *one = cst(p, d, 1.0), *r;
  if (t) {
    const tcc_vx *beta = cst(p, d, 0.7978845608028654), *kappa = cst(p, d, 0.044715);
    const tcc_vx *x2 = BIN(MUL, x, x), *x3 = BIN(MUL, x2, x);
    const tcc_vx *th = UN(TANH, BIN(MUL, beta, BIN(ADD, x, BIN(MUL, kappa, x3))));
    const tcc_vx *left = BIN(MUL, half, x), *right = BIN(ADD, one, th);
    const tcc_vx *dl = BIN(MUL, half, right);
    const tcc_vx *dr = BIN(MUL, BIN(MUL, BIN(MUL, left, BIN(SUB, one, BIN(MUL, th, th))), beta),
                           BIN(ADD, one, BIN(MUL, cst(p, d, 3.0 * 0.044715), x2)));
    r = BIN(MUL, g, BIN(ADD, dl, dr));
  } else {
    const tcc_vx *cdf = BIN(MUL, half, BIN(ADD, one, UN(ERF, BIN(MUL, x, cst(p, d, 0.70710678118654752440)))));
    const tcc_vx *pdf = BIN(MUL, UN(EXP, BIN(MUL, cst(p, d, -0.5), BIN(MUL, x, x))),
                            cst(p, d, 0.3989422804014327));
    r = BIN(MUL, g, BIN(ADD, cdf, BIN(MUL, x, pdf)));
  }
  return result(lc, n, 0, r, err);
}

int tcc_lower_silu(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *x = opnd(lc, n, &n->args[0], compute_dt(m->dtype));
  return result(lc, n, 0, BIN(MUL, x, UN(SIGMOID, x)), err);
}

int tcc_lower_threshold_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *g = opnd(lc, n, ARG("grad_output"), cd), *x = opnd(lc, n, ARG("self"), cd);
  const tcc_vx *th = opnd(lc, n, ARG("threshold"), cd);
  return result(lc, n, 0, tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_LE, x, th), cst(p, cd, 0), g), err);
}

int tcc_lower_sigmoid_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *g = opnd(lc, n, &n->args[0], cd), *y = opnd(lc, n, &n->args[1], cd);
  return result(lc, n, 0, BIN(MUL, BIN(MUL, g, BIN(SUB, cst(p, cd, 1), y)), y), err);
}

int tcc_lower_tanh_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *g = opnd(lc, n, &n->args[0], cd), *y = opnd(lc, n, &n->args[1], cd);
  return result(lc, n, 0, BIN(MUL, g, BIN(SUB, cst(p, cd, 1), BIN(MUL, y, y))), err);
}

/* _to_copy: a conversion (only device cpu, strided layout). */
int tcc_lower_to_copy(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *v = opnd(lc, n, &n->args[0], x->dtype);
  /* float16 <-> bfloat16 goes through float32 */
  if (compute_dt(x->dtype) != x->dtype && compute_dt(m->dtype) != m->dtype && x->dtype != m->dtype)
    v = tcc_vx_cast(p, v, TCC__V1__DTYPE__FLOAT32);
  return result(lc, n, 0, v, err);
}

int tcc_lower_copy(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  return result(lc, n, 0, opnd(lc, n, &n->args[0], m->dtype), err);
}

int tcc_lower_dropout(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (ARG("train")->i)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): dropout in training mode (random "
                         "numbers) is not supported", n->src_index, n->op->name);
  return tcc_lower_copy(lc, n, err);
}

/* ------------------------------------------------------- factories */

int tcc_lower_full(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *v = ARG("fill_value");
  if (!v) v = ARG("s");
  const tcc_vx *c;
  if (v) c = tcc_lower_operand(lc, v, 0, NULL, m->dtype);
  else c = cst(p, m->dtype, n->op->id == TCC_OP_ONES || n->op->id == TCC_OP_ONES_LIKE ? 1.0 : 0.0);
  return result(lc, n, 0, c, err);
}

int tcc_lower_arange(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *start = ARG("start"), *step = ARG("step");
  const tcc_vx *i = tcc_vx_index(p, tcc_ix_var(p, 0));
  if (tcc_dtype_is_float(m->dtype) || (start && start->kind == TCC_ARG_FLOAT) ||
      (step && step->kind == TCC_ARG_FLOAT)) {
    tcc_dtype d = TCC__V1__DTYPE__FLOAT64;
    const tcc_vx *a = start ? tcc_lower_operand(lc, start, 0, NULL, d) : cst(p, d, 0);
    const tcc_vx *s = step ? tcc_lower_operand(lc, step, 0, NULL, d) : cst(p, d, 1);
    return result(lc, n, 0, BIN(ADD, a, BIN(MUL, tcc_vx_cast(p, i, d), s)), err);
  }
  tcc_dtype d = TCC__V1__DTYPE__INT64;
  const tcc_vx *a = start ? tcc_lower_operand(lc, start, 0, NULL, d) : cst(p, d, 0);
  const tcc_vx *s = step ? tcc_lower_operand(lc, step, 0, NULL, d) : cst(p, d, 1);
  return result(lc, n, 0, BIN(ADD, a, BIN(MUL, i, s)), err);
}

/* ------------------------------------------------------------ views */

/* Index of a tensor of sizes `in` (rank ri) for the element of the
 * reshaped tensor of sizes `out` (rank ro) at index oidx: dims are
 * matched in groups of equal element count; a group's row-major offset
 * is split back with floor-div/mod (tcc_linear_affine sees through
 * them). */
static int reshape_index(tcc_program *p, const int64_t *in, int ri, const int64_t *out, int ro,
                         const tcc_ix *const *oidx, const tcc_ix **iidx) {
  int64_t numel = 1;
  for (int d = 0; d < ri; d++) numel *= in[d];
  for (int d = 0; d < ri; d++) iidx[d] = tcc_ix_const(p, 0);
  if (numel == 0) return 0;
  int a[TCC_MAX_DIMS], b[TCC_MAX_DIMS], na = 0, nb = 0;
  for (int d = 0; d < ri; d++)
    if (in[d] != 1) a[na++] = d;
  for (int d = 0; d < ro; d++)
    if (out[d] != 1) b[nb++] = d;
  int i = 0, j = 0;
  while (i < na && j < nb) {
    int i2 = i + 1, j2 = j + 1;
    int64_t pa = in[a[i]], pb = out[b[j]];
    while (pa != pb) {
      if (pa < pb) pa *= in[a[i2++]];
      else pb *= out[b[j2++]];
    }
    /* group: in dims a[i..i2), out dims b[j..j2) */
    const tcc_ix *lin = tcc_ix_const(p, 0);
    for (int k = j; k < j2; k++) lin = tcc_ix_add(p, tcc_ix_mul(p, lin, out[b[k]]), oidx[b[k]]);
    for (int k = i2 - 1; k >= i; k--) {
      if (k == i) {
        iidx[a[k]] = lin;
      } else {
        iidx[a[k]] = tcc_ix_mod(p, lin, in[a[k]]);
        lin = tcc_ix_div(p, lin, in[a[k]]);
      }
    }
    i = i2;
    j = j2;
  }
  for (int d = 0; d < ri; d++)
    if (!iidx[d]) return -1;
  return 0;
}

/* view / reshape / squeeze / unsqueeze */
int tcc_lower_reshape(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *o[TCC_MAX_DIMS], *in[TCC_MAX_DIMS];
  if (ident(p, m->rank, o) || reshape_index(p, x->sizes, x->rank, m->sizes, m->rank, o, in))
    return OOM();
  return set_view(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_permute(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *in[TCC_MAX_DIMS];
  int perm[TCC_MAX_DIMS];
  const tcc_arg *dims = ARG("dims");
  if (dims) {
    for (int j = 0; j < x->rank; j++) {
      int rc = tcc_norm_dim(dims->ints[j], x->rank, &perm[j], err);
      if (rc) return rc;
    }
  } else {
    int d0, d1;
    int rc = tcc_transpose_dims(lc->g, n, &d0, &d1, err);
    if (rc) return rc;
    for (int j = 0; j < x->rank; j++) perm[j] = j;
    if (x->rank) {
      perm[d0] = d1;
      perm[d1] = d0;
    }
  }
  for (int j = 0; j < x->rank; j++) in[perm[j]] = tcc_ix_var(p, j);
  return set_view(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_expand(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *in[TCC_MAX_DIMS];
  int lead = m->rank - x->rank;
  for (int d = 0; d < x->rank; d++)
    in[d] = x->sizes[d] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, d + lead);
  return set_view(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_slice(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim;
  int64_t start, len, step;
  int rc = tcc_slice_params(lc->g, n, &dim, &start, &len, &step, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  in[dim] = tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, dim), step), tcc_ix_const(p, start));
  return set_view(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_select(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim;
  int64_t index;
  int rc = tcc_select_params(lc->g, n, &dim, &index, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++)
    in[d] = d < dim ? tcc_ix_var(p, d) : d == dim ? tcc_ix_const(p, index) : tcc_ix_var(p, d - 1);
  return set_view(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

/* Index of the element at row-major position q of a tensor of `sizes`
 * (q < its element count). */
static void unravel_row_major(tcc_program *p, const int64_t *sizes, int rank, const tcc_ix *q,
                              const tcc_ix **idx) {
  int outer = -1;
  for (int d = 0; d < rank && outer < 0; d++)
    if (sizes[d] != 1) outer = d;
  int64_t step = 1;
  for (int d = rank - 1; d >= 0; d--) {
    if (sizes[d] == 1) {
      idx[d] = tcc_ix_const(p, 0);
      continue;
    }
    const tcc_ix *t = step > 1 ? tcc_ix_div(p, q, step) : q;
    idx[d] = d == outer ? t : tcc_ix_mod(p, t, sizes[d]);
    step *= sizes[d];
  }
}

/* Row-major position off + sum(i_d * stride_d) of the output index. */
static const tcc_ix *strided_position(tcc_program *p, int64_t off, const tcc_arg *size,
                                      const tcc_arg *stride) {
  const tcc_ix *q = tcc_ix_const(p, off);
  for (int d = 0; d < size->n; d++)
    if (size->ints[d] != 1) q = tcc_ix_add(p, q, tcc_ix_mul(p, tcc_ix_var(p, d), stride->ints[d]));
  return q;
}

/* The greatest position a view of `size`/`stride` from `off` reaches
 * (off - 1 for an empty view). */
static __int128 view_reach(int64_t off, const tcc_arg *size, const tcc_arg *stride) {
  __int128 reach = off;
  for (int d = 0; d < size->n; d++) {
    if (size->ints[d] == 0) return (__int128)off - 1;
    reach += (__int128)(size->ints[d] - 1) * stride->ints[d];
  }
  return reach;
}

/* as_strided over a value computed in the graph: a view of the value's
 * row-major flattening (what eager reads when the value is a fresh tensor
 * laid out row-major, which the client checks before sending one: the
 * strides of intermediate values are not part of the key). */
static int as_strided_computed(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int v = n->args[0].v;
  const tcc_meta *x = &lc->g->values[v].meta;
  const tcc_arg *sz = ARG("size"), *st = ARG("stride"), *off = ARG("storage_offset");
  int64_t o = off->kind == TCC_ARG_INT ? off->i : 0;
  if (o < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): negative storage offset",
                         n->src_index, n->op->name);
  __int128 reach = view_reach(o, sz, st);
  if (reach >= x->numel)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): as_strided reaches element "
                         "%lld of a value of %lld elements", n->src_index, n->op->name,
                         (long long)reach, (long long)x->numel);
  const tcc_ix *in[TCC_MAX_DIMS];
  unravel_row_major(p, x->sizes, x->rank, strided_position(p, o, sz, st), in);
  return set_view(lc, n, 0, body_at(lc, v, in), err);
}

/* as_strided over a graph input or constant: a second view of its
 * storage (an aliasing buffer with the requested layout); over a computed
 * value, see as_strided_computed. */
int tcc_lower_as_strided(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int v = n->args[0].v;
  const tcc_value *src = &lc->g->values[v];
  if (src->kind != TCC_VAL_INPUT && src->kind != TCC_VAL_CONST) return as_strided_computed(lc, n, err);
  const tcc_arg *st = ARG("stride"), *off = ARG("storage_offset");
  tcc_meta lay = *m;
  lay.offset = off->kind == TCC_ARG_INT ? off->i : src->meta.offset;
  if (lay.offset < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): negative storage offset",
                         n->src_index, n->op->name);
  __int128 reach = lay.offset;
  for (int d = 0; d < lay.rank; d++) {
    lay.strides[d] = st->ints[d];
    if (lay.sizes[d] > 0) reach += (__int128)(lay.sizes[d] - 1) * lay.strides[d];
  }
  lay.span = lay.numel ? (int64_t)(reach + 1) : 0;
  if (lay.numel && reach >= src->meta.span)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): as_strided reaches element "
                         "%lld of a storage of %lld", n->src_index, n->op->name,
                         (long long)reach, (long long)src->meta.span);
  int home = -1;
  for (int b = 0; b < p->nbufs; b++)
    if (p->bufs[b].value == v && (p->bufs[b].kind == TCC_BUF_INPUT || p->bufs[b].kind == TCC_BUF_CONST))
      home = b;
  if (home < 0) return tcc_error_set(err, TCC_E_INTERNAL, "as_strided: no buffer for the input");
  tcc_buffer nb = p->bufs[home];
  nb.layout = lay;
  nb.layout.dtype = src->meta.dtype;
  int id = tcc_program_add_buffer(p, &nb);
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (id < 0 || ident(p, m->rank, idx)) return OOM();
  return set_view(lc, n, 0, tcc_vx_load(p, id, m->rank, idx), err);
}

/* True when `stride` is row-major for `size` (dims of size 1 aside). */
static int row_major_strides(const int64_t *size, const int64_t *stride, int rank) {
  int64_t step = 1;
  for (int d = rank - 1; d >= 0; d--) {
    if (size[d] == 1) continue;
    if (stride[d] != step) return 0;
    step *= size[d];
  }
  return 1;
}

/* as_strided_scatter(self, src, size, stride, offset): eager clones self
 * (row-major when self is contiguous, which the client checks for a
 * computed self and this checks for an input) and copies src into the
 * view. The view must be one row-major block [off, off + numel(src)) of
 * the clone: out = src there, self elsewhere. */
int tcc_lower_as_strided_scatter(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *self = ARG("self"), *srca = ARG("src");
  const tcc_arg *sz = ARG("size"), *st = ARG("stride"), *off = ARG("storage_offset");
  const tcc_value *sv = &lc->g->values[self->v];
  const tcc_meta *src = arg_meta(lc, srca);
  if (sv->kind != TCC_VAL_NODE && !row_major_strides(sv->meta.sizes, sv->meta.strides, sv->meta.rank))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): as_strided_scatter into a "
                         "non-contiguous input is not supported", n->src_index, n->op->name);
  if (!row_major_strides(sz->ints, st->ints, sz->n))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): as_strided_scatter into a view "
                         "that is not one row-major block is not supported", n->src_index,
                         n->op->name);
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_vx *base = opnd(lc, n, self, cd);
  int64_t o = off->kind == TCC_ARG_INT ? off->i : 0;
  if (src->numel == 0) return result(lc, n, 0, base, err);
  const tcc_ix *q = tcc_ix_const(p, 0);         /* row-major position of the output index */
  for (int d = 0; d < m->rank; d++) q = tcc_ix_add(p, tcc_ix_mul(p, q, m->sizes[d]), tcc_ix_var(p, d));
  int whole = o == 0 && src->numel == m->numel;
  const tcc_ix *at = tcc_ix_add(p, q, tcc_ix_const(p, -o));
  if (!whole) at = tcc_ix_clamp(p, at, src->numel);
  const tcc_ix *in[TCC_MAX_DIMS];
  unravel_row_major(p, src->sizes, src->rank, at, in);
  const tcc_vx *val = tcc_vx_cast(p, body_at(lc, srca->v, in), cd);
  if (!whole) {
    const tcc_vx *qv = tcc_vx_index(p, q);
    const tcc_vx *inside = tcc_vx_pred(
        p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_GE, qv, cst(p, TCC__V1__DTYPE__INT64, (double)o)),
        tcc_vx_pred(p, TCC_PRIM_LT, qv, cst(p, TCC__V1__DTYPE__INT64, (double)(o + src->numel))));
    val = tcc_vx_where(p, inside, val, base);
  }
  return result(lc, n, 0, val, err);
}

/* copy(self, src): src broadcast to self, in self's dtype. */
int tcc_lower_copy_into(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  return result(lc, n, 0, opnd(lc, n, ARG("src"), m->dtype), err);
}

int tcc_lower_alias(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  return set_view(lc, n, 0, lc->vals[n->args[0].v].body, err);
}

/* ------------------------------------------- cat, pad and indexing */

int tcc_lower_cat(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *ts = ARG("tensors");
  int dim, rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(m->dtype);
  int use[256], nu = 0;
  int64_t off[256];
  int64_t at = 0;
  for (int j = 0; j < ts->n; j++) {
    const tcc_meta *x = &lc->g->values[ts->vals[j]].meta;
    if ((x->rank == 1 && x->sizes[0] == 0 && m->rank != 1) || x->sizes[dim] == 0) continue;
    if (nu == 256)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): more than 256 non-empty inputs",
                           n->src_index, n->op->name);
    off[nu] = at;
    use[nu++] = j;
    at += x->sizes[dim];
  }
  const tcc_vx *body = NULL;
  const tcc_ix *id = tcc_ix_var(p, dim);
  for (int u = nu - 1; u >= 0; u--) {
    const tcc_meta *x = &lc->g->values[ts->vals[use[u]]].meta;
    const tcc_ix *in[TCC_MAX_DIMS];
    for (int d = 0; d < m->rank; d++) in[d] = tcc_ix_var(p, d);
    const tcc_ix *shifted = tcc_ix_add(p, id, tcc_ix_const(p, -off[u]));
    in[dim] = nu == 1 ? shifted : tcc_ix_clamp(p, shifted, x->sizes[dim]);
    const tcc_vx *v = tcc_vx_cast(p, body_at(lc, ts->vals[use[u]], in), cd);
    if (!body) {
      body = v;
    } else {
      const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_LT, tcc_vx_index(p, id),
                                    cst(p, TCC__V1__DTYPE__INT64, (double)(off[u] + x->sizes[dim])));
      body = tcc_vx_where(p, c, v, body);
    }
  }
  if (!body) body = cst(p, cd, 0);   /* empty result */
  return result(lc, n, 0, body, err);
}

int tcc_lower_pad(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = compute_dt(m->dtype);
  const tcc_arg *pad = ARG("pad");
  const tcc_vx *fill = tcc_lower_operand(lc, ARG("value"), 0, NULL, cd);
  const tcc_ix *in[TCC_MAX_DIMS];
  const tcc_vx *ok = NULL;
  int empty = 0;
  for (int d = 0; d < m->rank; d++) {
    int j = m->rank - 1 - d;   /* pad pair index */
    if (j >= pad->n / 2) {
      in[d] = tcc_ix_var(p, d);
      continue;
    }
    int64_t lo = pad->ints[2 * j];
    if (x->sizes[d] == 0) {
      empty = 1;
      in[d] = tcc_ix_const(p, 0);
      continue;
    }
    const tcc_ix *e = tcc_ix_add(p, tcc_ix_var(p, d), tcc_ix_const(p, -lo));
    if (lo > 0 || pad->ints[2 * j + 1] > 0) {
      const tcc_vx *ev = tcc_vx_index(p, e);
      const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_AND,
                                    tcc_vx_pred(p, TCC_PRIM_GE, ev, cst(p, TCC__V1__DTYPE__INT64, 0)),
                                    tcc_vx_pred(p, TCC_PRIM_LT, ev,
                                                cst(p, TCC__V1__DTYPE__INT64, (double)x->sizes[d])));
      ok = ok ? tcc_vx_pred(p, TCC_PRIM_AND, ok, c) : c;
      e = tcc_ix_clamp(p, e, x->sizes[d]);
    }
    in[d] = e;
  }
  if (empty) return result(lc, n, 0, fill, err);
  const tcc_vx *v = tcc_vx_cast(p, body_at(lc, n->args[0].v, in), cd);
  return result(lc, n, 0, ok ? tcc_vx_where(p, ok, v, fill) : v, err);
}

/* An index value read from tensor `ix` at index idx, as an index into a
 * dim of size `size` (negative values count from the end when wrap). */
static const tcc_ix *index_from(tcc_lower_ctx *lc, int ix, const tcc_ix *const *idx, int64_t size,
                                int wrap) {
  tcc_program *p = lc->prog;
  const tcc_vx *v = tcc_vx_cast(p, body_at(lc, ix, idx), TCC__V1__DTYPE__INT64);
  if (wrap) {
    const tcc_vx *neg = tcc_vx_pred(p, TCC_PRIM_LT, v, cst(p, TCC__V1__DTYPE__INT64, 0));
    v = tcc_vx_where(p, neg, BIN(ADD, v, cst(p, TCC__V1__DTYPE__INT64, (double)size)), v);
  }
  return tcc_ix_value(p, v, size);
}

int tcc_lower_index_select(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  const tcc_meta *im = arg_meta(lc, ARG("index"));
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS], *ii[1];
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  ii[0] = x->rank ? tcc_ix_var(p, dim) : tcc_ix_const(p, 0);
  if (x->rank) in[dim] = index_from(lc, ARG("index")->v, ii, x->sizes[dim], 0);
  (void)im;
  return result(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_gather(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS], *ii[TCC_MAX_DIMS];
  if (ident(p, m->rank, ii)) return OOM();
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  if (x->rank) in[dim] = index_from(lc, ARG("index")->v, ii, x->sizes[dim], 1);
  return result(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

/* x[..., i0, i1, ...]: each indexed dim reads its index tensor at the
 * result's broadcast position (size-1 dims of an index tensor at 0);
 * negative indices count from the end, out of range sets the kernel's
 * error flag. */
int tcc_lower_index(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_index_layout l;
  int rc = tcc_index_layout_of(lc->g, n, &l, err);
  if (rc) return rc;
  const tcc_arg *ix = ARG("indices");
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < l.first; d++) in[d] = tcc_ix_var(p, d);
  for (int k = 0; k < l.count; k++) {
    int t = ix->vals[l.first + k];
    const tcc_meta *tm = &lc->g->values[t].meta;
    const tcc_ix *ii[TCC_MAX_DIMS];
    for (int j = 0; j < tm->rank; j++)
      ii[j] = tm->sizes[j] == 1 ? tcc_ix_const(p, 0)
                                : tcc_ix_var(p, l.first + (l.rank - tm->rank) + j);
    in[l.first + k] = index_from(lc, t, ii, x->sizes[l.first + k], 1);
  }
  for (int d = l.first + l.count; d < x->rank; d++) in[d] = tcc_ix_var(p, d - l.count + l.rank);
  return result(lc, n, 0, body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_embedding(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *w = arg_meta(lc, ARG("weight"));
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *ii[TCC_MAX_DIMS], *in[2];
  if (ident(p, m->rank - 1, ii)) return OOM();
  in[0] = index_from(lc, ARG("indices")->v, ii, w->sizes[0], 0);
  in[1] = tcc_ix_var(p, m->rank - 1);
  return result(lc, n, 0, body_at(lc, ARG("weight")->v, in), err);
}

/* ------------------------------------------------------ reductions */

/* A reduction over the dims in `mask` of value v, in output index space
 * (the output keeps reduced dims as size 1 when keepdim). Fills *first
 * (the first bound var), sizes and *nred; returns v's body read at
 * [output vars for kept dims, bound vars for reduced dims]. */
typedef struct red_space {
  int first, nred;
  int64_t sizes[TCC_MAX_DIMS];
  int64_t count;             /* elements folded per output element */
} red_space;

static const tcc_vx *red_body(tcc_lower_ctx *lc, int v, uint32_t mask, int keepdim,
                              red_space *rs) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = &lc->g->values[v].meta;
  const tcc_ix *in[TCC_MAX_DIMS];
  rs->nred = 0;
  rs->count = 1;
  for (int d = 0; d < x->rank; d++)
    if (mask & (1u << d)) rs->nred++;
  rs->first = tcc_program_fresh_vars(p, rs->nred);
  int o = 0, r = 0;
  for (int d = 0; d < x->rank; d++) {
    if (mask & (1u << d)) {
      rs->sizes[r] = x->sizes[d];
      rs->count *= x->sizes[d];
      in[d] = tcc_ix_var(p, rs->first + r++);
      if (keepdim) o++;
    } else {
      in[d] = tcc_ix_var(p, o++);
    }
  }
  return body_at(lc, v, in);
}

static const tcc_vx *fold(tcc_program *p, tcc_reduce_kind k, tcc_dtype dt, const tcc_vx *body,
                          const red_space *rs) {
  return tcc_vx_reduce(p, k, dt, tcc_vx_cast(p, body, dt), rs->first, rs->nred, rs->sizes);
}

/* mean and the correction-scaled variance of body over rs (dtype cd) */
static const tcc_vx *mean_of(tcc_program *p, const tcc_vx *body, const red_space *rs, tcc_dtype cd) {
  return BIN(DIV, fold(p, TCC_RED_SUM, cd, body, rs), cst(p, cd, (double)rs->count));
}

static const tcc_vx *var_of(tcc_program *p, const tcc_vx *body, const tcc_vx *mean,
                            const red_space *rs, tcc_dtype cd, double correction) {
  const tcc_vx *dx = BIN(SUB, tcc_vx_cast(p, body, cd), mean);
  const tcc_vx *ss = fold(p, TCC_RED_SUM, cd, BIN(MUL, dx, dx), rs);
  double den = (double)rs->count - correction;
  return BIN(DIV, ss, cst(p, cd, den > 0 ? den : 0));
}

int tcc_lower_reduce(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = arg_meta(lc, &n->args[0]);
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m && n->nout > 1) m = out_meta(lc, n, 1);
  if (!m) return 0;
  uint32_t mask;
  int keepdim, rc = tcc_reduce_dims(lc->g, n, &mask, &keepdim, err);
  if (rc) return rc;
  tcc_op_id id = n->op->id;
  int argflat = (id == TCC_OP_ARGMAX || id == TCC_OP_ARGMIN) && ARG("dim")->kind == TCC_ARG_NONE;
  red_space rs;
  /* argmax without dim: flat over all dims; a keepdim result has all
   * dims of size 1, a plain one is 0-dim: read with no output vars */
  const tcc_vx *body = red_body(lc, n->args[0].v, mask, argflat ? 0 : keepdim, &rs);
  if (argflat && keepdim) {   /* output vars are all size 1: no var is read */
  }
  tcc_dtype od = out_meta(lc, n, 0) ? out_meta(lc, n, 0)->dtype : x->dtype;
  tcc_dtype cd = compute_dt(od), xd = compute_dt(x->dtype);
  switch (id) {
  case TCC_OP_SUM: case TCC_OP_SUM_DIM:
    return result(lc, n, 0, fold(p, TCC_RED_SUM, cd, body, &rs), err);
  case TCC_OP_PROD: case TCC_OP_PROD_DIM:
    return result(lc, n, 0, fold(p, TCC_RED_PROD, cd, body, &rs), err);
  case TCC_OP_MEAN: case TCC_OP_MEAN_DIM:
    return result(lc, n, 0, mean_of(p, body, &rs, cd), err);
  case TCC_OP_AMAX: case TCC_OP_MAX:
    return result(lc, n, 0, fold(p, TCC_RED_MAX, cd, body, &rs), err);
  case TCC_OP_AMIN: case TCC_OP_MIN:
    return result(lc, n, 0, fold(p, TCC_RED_MIN, cd, body, &rs), err);
  case TCC_OP_MAX_DIM: case TCC_OP_MIN_DIM: {
    int mx = id == TCC_OP_MAX_DIM;
    const tcc_vx *b = tcc_vx_cast(p, body, xd);
    rc = result(lc, n, 0, tcc_vx_reduce(p, mx ? TCC_RED_MAX : TCC_RED_MIN, xd, b, rs.first, rs.nred, rs.sizes), err);
    if (!rc) rc = result(lc, n, 1, tcc_vx_reduce(p, mx ? TCC_RED_ARGMAX : TCC_RED_ARGMIN, TCC__V1__DTYPE__INT64, b, rs.first, rs.nred, rs.sizes), err);
    return rc;
  }
  case TCC_OP_ARGMAX: case TCC_OP_ARGMIN:
    return result(lc, n, 0, tcc_vx_reduce(p, id == TCC_OP_ARGMAX ? TCC_RED_ARGMAX : TCC_RED_ARGMIN,
                                          TCC__V1__DTYPE__INT64, tcc_vx_cast(p, body, xd), rs.first,
                                          rs.nred, rs.sizes), err);
  case TCC_OP_ANY: case TCC_OP_ANY_DIM: case TCC_OP_ANY_DIMS:
    return result(lc, n, 0, fold(p, TCC_RED_MAX, TCC__V1__DTYPE__BOOL, body, &rs), err);
  case TCC_OP_ALL: case TCC_OP_ALL_DIM: case TCC_OP_ALL_DIMS:
    return result(lc, n, 0, fold(p, TCC_RED_MIN, TCC__V1__DTYPE__BOOL, body, &rs), err);
  case TCC_OP_VAR: case TCC_OP_STD: case TCC_OP_VAR_MEAN: {
    const tcc_arg *c = ARG("correction");
    double corr = c->kind == TCC_ARG_NONE ? 1.0 : c->kind == TCC_ARG_FLOAT ? c->f : (double)c->i;
    const tcc_vx *mean = mean_of(p, body, &rs, xd);
    red_space r2;   /* a second pass over fresh bound vars */
    const tcc_vx *body2 = red_body(lc, n->args[0].v, mask, keepdim, &r2);
    const tcc_vx *var = var_of(p, body2, mean, &r2, xd, corr);
    if (id == TCC_OP_STD) var = UN(SQRT, var);
    rc = result(lc, n, 0, var, err);
    if (!rc && id == TCC_OP_VAR_MEAN) rc = result(lc, n, 1, mean, err);
    return rc;
  }
  case TCC_OP_LOGSUMEXP: {
    const tcc_vx *b = tcc_vx_cast(p, body, cd);
    const tcc_vx *mx = tcc_vx_reduce(p, TCC_RED_MAX, cd, b, rs.first, rs.nred, rs.sizes);
    mx = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_ISINF, mx, NULL), cst(p, cd, 0), mx);
    red_space r2;
    const tcc_vx *b2 = tcc_vx_cast(p, red_body(lc, n->args[0].v, mask, keepdim, &r2), cd);
    const tcc_vx *s = fold(p, TCC_RED_SUM, cd, UN(EXP, BIN(SUB, b2, mx)), &r2);
    return result(lc, n, 0, BIN(ADD, UN(LOG, s), mx), err);
  }
  default:
    return tcc_error_set(err, TCC_E_INTERNAL, "reduce: unhandled op %s", n->op->name);
  }
}

/* cumsum along dim d as a masked reduction: out[.., i, ..] = sum over j
 * of (j <= i ? x[.., j, ..] : 0). Each element sums its whole row, so
 * the work is n^2 per row; the rows these graphs scan are positions and
 * masks (a sequence length), and it fuses with its producer like any
 * reduction. Floats sum in their compute dtype in the reduction's order,
 * not eager's left-to-right one. */
int tcc_lower_cumsum(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = arg_meta(lc, &n->args[0]), *m = out_meta(lc, n, 0);
  if (!m) return 0;
  if (x->rank == 0) return result(lc, n, 0, body_at(lc, n->args[0].v, NULL), err);
  int d;
  int rc = tcc_norm_dim(ARG("dim")->i, x->rank, &d, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(m->dtype);
  red_space rs;
  const tcc_vx *body = red_body(lc, n->args[0].v, 1u << d, 1, &rs); /* output var d stays i */
  const tcc_vx *j = tcc_vx_index(p, tcc_ix_var(p, rs.first)), *i = tcc_vx_index(p, tcc_ix_var(p, d));
  const tcc_vx *kept = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_LE, j, i), tcc_vx_cast(p, body, cd), cst(p, cd, 0));
  return result(lc, n, 0, fold(p, TCC_RED_SUM, cd, kept, &rs), err);
}

/* ------------------------------------------ softmax and its backward */

/* Body of value v at the identity index of its shape with dim `dim`
 * replaced by a fresh bound var; *first gets the var. */
static const tcc_vx *row_body(tcc_lower_ctx *lc, int v, int dim, red_space *rs) {
  return red_body(lc, v, 1u << dim, 1, rs);
}

int tcc_lower_softmax(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0), *x = arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(m->dtype);
  if (compute_dt(x->dtype) == TCC__V1__DTYPE__FLOAT64) cd = TCC__V1__DTYPE__FLOAT64;
  const tcc_ix *id[TCC_MAX_DIMS];
  if (ident(p, x->rank, id)) return OOM();
  const tcc_vx *xi = tcc_vx_cast(p, body_at(lc, n->args[0].v, id), cd);
  if (x->rank == 0) {   /* softmax of a scalar: 1 (log: 0) */
    int lg = n->op->id == TCC_OP_LOG_SOFTMAX || n->op->id == TCC_OP_LOG_SOFTMAX_INT;
    return result(lc, n, 0, BIN(SUB, xi, lg ? xi : BIN(SUB, xi, cst(p, cd, 1))), err);
  }
  red_space r1, r2;
  const tcc_vx *mx = fold(p, TCC_RED_MAX, cd, row_body(lc, n->args[0].v, dim, &r1), &r1);
  /* an all -inf row: subtract 0, giving nan like PyTorch */
  const tcc_vx *xr = tcc_vx_cast(p, row_body(lc, n->args[0].v, dim, &r2), cd);
  const tcc_vx *s = fold(p, TCC_RED_SUM, cd, UN(EXP, BIN(SUB, xr, mx)), &r2);
  int lg = n->op->id == TCC_OP_LOG_SOFTMAX || n->op->id == TCC_OP_LOG_SOFTMAX_INT;
  const tcc_vx *y = lg ? BIN(SUB, BIN(SUB, xi, mx), UN(LOG, s)) : BIN(DIV, UN(EXP, BIN(SUB, xi, mx)), s);
  return result(lc, n, 0, y, err);
}

int tcc_lower_softmax_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int gv = ARG("grad_output")->v, yv = ARG("output")->v;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(lc->g->values[gv].meta.dtype);
  const tcc_ix *id[TCC_MAX_DIMS];
  if (ident(p, m->rank, id)) return OOM();
  const tcc_vx *g = tcc_vx_cast(p, body_at(lc, gv, id), cd), *y = tcc_vx_cast(p, body_at(lc, yv, id), cd);
  if (m->rank == 0) return result(lc, n, 0, cst(p, cd, 0), err);
  red_space rs;
  const tcc_vx *gr = tcc_vx_cast(p, row_body(lc, gv, dim, &rs), cd);
  if (n->op->id == TCC_OP_SOFTMAX_BACKWARD) {
    const tcc_ix *in[TCC_MAX_DIMS];
    for (int d = 0; d < m->rank; d++) in[d] = d == dim ? tcc_ix_var(p, rs.first) : tcc_ix_var(p, d);
    const tcc_vx *yr = tcc_vx_cast(p, body_at(lc, yv, in), cd);
    const tcc_vx *s = fold(p, TCC_RED_SUM, cd, BIN(MUL, gr, yr), &rs);
    return result(lc, n, 0, BIN(MUL, y, BIN(SUB, g, s)), err);
  }
  const tcc_vx *s = fold(p, TCC_RED_SUM, cd, gr, &rs);
  return result(lc, n, 0, BIN(SUB, g, BIN(MUL, UN(EXP, y), s)), err);
}

/* ---------------------------------------------------------- norms */

/* Reads an optional per-normalized-element parameter (weight/bias) at
 * the output's index (its dims are the output's trailing dims). */
static const tcc_vx *param_at(tcc_lower_ctx *lc, const tcc_arg *a, int rank, tcc_dtype cd) {
  if (!a || a->kind != TCC_ARG_TENSOR) return NULL;
  const tcc_lval *lv = &lc->vals[a->v];
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < lv->rank; d++) in[d] = tcc_ix_var(lc->prog, rank - lv->rank + d);
  return tcc_vx_cast(lc->prog, body_at(lc, a->v, in), cd);
}

int tcc_lower_layer_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = compute_dt(x->dtype);
  uint32_t mask = 0;
  for (int d = axis; d < x->rank; d++) mask |= 1u << d;
  red_space r1, r2;
  /* statistics at index [i0..i{axis-1}, 0...]: shared by all outputs */
  const tcc_vx *mean = mean_of(p, red_body(lc, xv, mask, 1, &r1), &r1, cd);
  const tcc_vx *var = var_of(p, red_body(lc, xv, mask, 1, &r2), mean, &r2, cd, 0);
  const tcc_vx *rstd = UN(RSQRT, BIN(ADD, var, cst(p, cd, ARG("eps")->f)));
  const tcc_ix *id[TCC_MAX_DIMS];
  if (ident(p, x->rank, id)) return OOM();
  const tcc_vx *y = BIN(MUL, BIN(SUB, tcc_vx_cast(p, body_at(lc, xv, id), cd), mean), rstd);
  const tcc_vx *w = param_at(lc, ARG("weight"), x->rank, cd), *b = param_at(lc, ARG("bias"), x->rank, cd);
  if (w) y = BIN(MUL, y, w);
  if (b) y = BIN(ADD, y, b);
  int rc = result(lc, n, 0, y, err);
  if (!rc && n->nout > 1) rc = result(lc, n, 1, mean, err);
  if (!rc && n->nout > 2) rc = result(lc, n, 2, rstd, err);
  return rc;
}

int tcc_lower_rms_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = compute_dt(x->dtype);
  const tcc_arg *e = ARG("eps");
  double eps = e->kind == TCC_ARG_FLOAT ? e->f
             : x->dtype == TCC__V1__DTYPE__FLOAT64 ? 2.220446049250313e-16
             : x->dtype == TCC__V1__DTYPE__FLOAT16 ? 0.0009765625
             : x->dtype == TCC__V1__DTYPE__BFLOAT16 ? 0.0078125 : 1.1920928955078125e-07;
  uint32_t mask = 0;
  for (int d = axis; d < x->rank; d++) mask |= 1u << d;
  red_space rs;
  const tcc_vx *xr = tcc_vx_cast(p, red_body(lc, xv, mask, 1, &rs), cd);
  const tcc_vx *ms = BIN(DIV, fold(p, TCC_RED_SUM, cd, BIN(MUL, xr, xr), &rs), cst(p, cd, (double)rs.count));
  const tcc_ix *id[TCC_MAX_DIMS];
  if (ident(p, x->rank, id)) return OOM();
  const tcc_vx *y = BIN(MUL, tcc_vx_cast(p, body_at(lc, xv, id), cd), UN(RSQRT, BIN(ADD, ms, cst(p, cd, eps))));
  const tcc_vx *w = param_at(lc, ARG("weight"), x->rank, cd);
  if (w) y = BIN(MUL, y, w);
  return result(lc, n, 0, y, err);
}

int tcc_lower_layer_norm_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v, gv = ARG("grad_out")->v, mv = ARG("mean")->v, sv = ARG("rstd")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = compute_dt(x->dtype);
  const tcc_arg *mask = ARG("output_mask");
  const tcc_arg *wa = ARG("weight");
  int64_t N = 1, M = 1;
  for (int d = axis; d < x->rank; d++) N *= x->sizes[d];
  for (int d = 0; d < axis; d++) M *= x->sizes[d];
  int rc = 0;
  /* mean/rstd are [..., 1, 1]: read at [i0..i{axis-1}, 0, ...] */
  const tcc_ix *st[TCC_MAX_DIMS], *id[TCC_MAX_DIMS];
  if (ident(p, x->rank, id)) return OOM();
  for (int d = 0; d < x->rank; d++) st[d] = d < axis ? id[d] : tcc_ix_const(p, 0);
  const tcc_vx *mean = tcc_vx_cast(p, body_at(lc, mv, st), cd);
  const tcc_vx *rstd = tcc_vx_cast(p, body_at(lc, sv, st), cd);
  if (mask->bools[0] && n->outs[0] >= 0) {
    uint32_t rm = 0;
    for (int d = axis; d < x->rank; d++) rm |= 1u << d;
    red_space r1, r2;
    const tcc_vx *g1 = tcc_vx_cast(p, red_body(lc, gv, rm, 1, &r1), cd);
    /* bound reads of x, g, weight at [i0.., r...] */
    const tcc_ix *b1[TCC_MAX_DIMS];
    for (int d = 0; d < x->rank; d++) b1[d] = d < axis ? id[d] : tcc_ix_var(p, r1.first + d - axis);
    const tcc_vx *w1 = NULL;
    if (wa && wa->kind == TCC_ARG_TENSOR) w1 = tcc_vx_cast(p, body_at(lc, wa->v, b1 + axis), cd);
    const tcc_vx *gw1 = w1 ? BIN(MUL, g1, w1) : g1;
    const tcc_vx *s1 = fold(p, TCC_RED_SUM, cd, gw1, &r1);
    const tcc_vx *g2 = tcc_vx_cast(p, red_body(lc, gv, rm, 1, &r2), cd);
    const tcc_ix *b2[TCC_MAX_DIMS];
    for (int d = 0; d < x->rank; d++) b2[d] = d < axis ? id[d] : tcc_ix_var(p, r2.first + d - axis);
    const tcc_vx *w2 = NULL;
    if (wa && wa->kind == TCC_ARG_TENSOR) w2 = tcc_vx_cast(p, body_at(lc, wa->v, b2 + axis), cd);
    const tcc_vx *xh2 = BIN(MUL, BIN(SUB, tcc_vx_cast(p, body_at(lc, xv, b2), cd), mean), rstd);
    const tcc_vx *s2 = fold(p, TCC_RED_SUM, cd, BIN(MUL, w2 ? BIN(MUL, g2, w2) : g2, xh2), &r2);
    const tcc_vx *g = tcc_vx_cast(p, body_at(lc, gv, id), cd);
    const tcc_vx *w = param_at(lc, wa, x->rank, cd);
    const tcc_vx *gw = w ? BIN(MUL, g, w) : g;
    const tcc_vx *xh = BIN(MUL, BIN(SUB, tcc_vx_cast(p, body_at(lc, xv, id), cd), mean), rstd);
    const tcc_vx *dx = BIN(MUL, BIN(DIV, rstd, cst(p, cd, (double)N)),
                           BIN(SUB, BIN(SUB, BIN(MUL, cst(p, cd, (double)N), gw), s1), BIN(MUL, xh, s2)));
    rc = result(lc, n, 0, dx, err);
  }
  for (int o = 1; o < 3 && !rc; o++) {
    if (!mask->bools[o] || n->nout <= o || n->outs[o] < 0) continue;
    /* grad_weight / grad_bias: sums over the leading dims */
    const tcc_meta *om = out_meta(lc, n, o);
    int first = tcc_program_fresh_vars(p, axis);
    int64_t sizes[TCC_MAX_DIMS];
    const tcc_ix *b[TCC_MAX_DIMS], *sb[TCC_MAX_DIMS];
    for (int d = 0; d < x->rank; d++) {
      if (d < axis) {
        sizes[d] = x->sizes[d];
        b[d] = tcc_ix_var(p, first + d);
      } else {
        b[d] = tcc_ix_var(p, d - axis);
      }
      sb[d] = d < axis ? b[d] : tcc_ix_const(p, 0);
    }
    const tcc_vx *g = tcc_vx_cast(p, body_at(lc, gv, b), cd);
    const tcc_vx *term = g;
    if (o == 1) {
      const tcc_vx *mb = tcc_vx_cast(p, body_at(lc, mv, sb), cd);
      const tcc_vx *rb = tcc_vx_cast(p, body_at(lc, sv, sb), cd);
      term = BIN(MUL, g, BIN(MUL, BIN(SUB, tcc_vx_cast(p, body_at(lc, xv, b), cd), mb), rb));
    }
    const tcc_vx *s = axis ? tcc_vx_reduce(p, TCC_RED_SUM, cd, term, first, axis, sizes) : term;
    (void)om;
    (void)M;
    rc = result(lc, n, o, s, err);
  }
  return rc;
}

int tcc_lower_batch_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = arg_meta(lc, ARG("input"));
  tcc_dtype cd = compute_dt(x->dtype);
  const tcc_ix *id[TCC_MAX_DIMS];
  if (ident(p, x->rank, id)) return OOM();
  const tcc_ix *c[1] = {id[1]};
  const tcc_vx *xv = tcc_vx_cast(p, body_at(lc, ARG("input")->v, id), cd);
  const tcc_vx *mean = tcc_vx_cast(p, body_at(lc, ARG("running_mean")->v, c), cd);
  const tcc_vx *var = tcc_vx_cast(p, body_at(lc, ARG("running_var")->v, c), cd);
  const tcc_vx *y = BIN(MUL, BIN(SUB, xv, mean), UN(RSQRT, BIN(ADD, var, cst(p, cd, ARG("eps")->f))));
  const tcc_arg *w = ARG("weight"), *b = ARG("bias");
  if (w->kind == TCC_ARG_TENSOR) y = BIN(MUL, y, tcc_vx_cast(p, body_at(lc, w->v, c), cd));
  if (b->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, tcc_vx_cast(p, body_at(lc, b->v, c), cd));
  int rc = result(lc, n, 0, y, err);
  for (int o = 1; o < n->nout && !rc; o++) rc = result(lc, n, o, cst(p, cd, 0), err);
  return rc;
}

/* A per-channel statistic (over output index i0 = channel) as a value
 * the big kernel can read: node output o when it is kept, else a
 * temporary. Returns its body read at channel index `c`. */
static const tcc_vx *channel_stat(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                                  int64_t C, tcc_dtype dt, const tcc_ix *c, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[1] = {c};
  if (o >= 0 && o < n->nout && n->outs[o] >= 0 && lc->g->values[n->outs[o]].meta.numel == C) {
    if (result(lc, n, o, body, err)) return NULL;
    return tcc_vx_cast(p, body_at(lc, n->outs[o], idx), dt);
  }
  int64_t sz[1] = {C};
  const tcc_vx *ld = materialize(lc, body, 1, sz, dt);
  return ld ? tcc_vx_subst(p, ld, 1, idx) : NULL;
}

/* Training batch norm (functional): batch statistics over every dim but
 * 1, the normalized output, saved mean / inverse std and the updated
 * running statistics (unbiased variance). With training false it is the
 * inference form with running statistics passed through. */
int tcc_lower_batch_norm_train(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_arg *xa = ARG("input");
  const tcc_meta *x = arg_meta(lc, xa);
  int64_t C = x->sizes[1];
  tcc_dtype cd = compute_dt(x->dtype);
  const tcc_ix *id[TCC_MAX_DIMS], *c0[1];
  if (ident(p, x->rank, id)) return OOM();
  c0[0] = tcc_ix_var(p, 0);
  const tcc_vx *rm = tcc_vx_cast(p, body_at(lc, ARG("running_mean")->v, c0), cd);
  const tcc_vx *rv = tcc_vx_cast(p, body_at(lc, ARG("running_var")->v, c0), cd);
  double mom = ARG("momentum")->f, eps = ARG("eps")->f;
  const tcc_vx *mean_c, *rstd_c;
  int rc = 0;
  if (ARG("training")->i) {
    uint32_t mask = 0;
    for (int d = 0; d < x->rank; d++)
      if (d != 1) mask |= 1u << d;
    red_space r1, r2;
    const tcc_vx *mean = mean_of(p, red_body(lc, xa->v, mask, 0, &r1), &r1, cd);
    const tcc_vx *var = var_of(p, red_body(lc, xa->v, mask, 0, &r2), mean, &r2, cd, 0);
    const tcc_vx *rstd = UN(RSQRT, BIN(ADD, var, cst(p, cd, eps)));
    double cnt = (double)r1.count;
    const tcc_vx *m = cst(p, cd, mom), *one_m = cst(p, cd, 1 - mom);
    const tcc_vx *unbiased = BIN(MUL, var, cst(p, cd, cnt > 1 ? cnt / (cnt - 1) : INFINITY));
    if (n->nout > 3 && (rc = result(lc, n, 3, BIN(ADD, BIN(MUL, one_m, rm), BIN(MUL, m, mean)), err))) return rc;
    if (n->nout > 4 && (rc = result(lc, n, 4, BIN(ADD, BIN(MUL, one_m, rv), BIN(MUL, m, unbiased)), err))) return rc;
    mean_c = channel_stat(lc, n, 1, mean, C, cd, id[1], err);
    if (!mean_c) return err->code ? err->code : OOM();
    rstd_c = channel_stat(lc, n, 2, rstd, C, cd, id[1], err);
    if (!rstd_c) return err->code ? err->code : OOM();
  } else {
    const tcc_ix *c1[1] = {id[1]};
    mean_c = tcc_vx_cast(p, body_at(lc, ARG("running_mean")->v, c1), cd);
    rstd_c = UN(RSQRT, BIN(ADD, tcc_vx_cast(p, body_at(lc, ARG("running_var")->v, c1), cd), cst(p, cd, eps)));
    for (int o = 1; o < 3 && o < n->nout && !rc; o++) rc = result(lc, n, o, cst(p, cd, 0), err);
    if (!rc && n->nout > 3) rc = result(lc, n, 3, rm, err);
    if (!rc && n->nout > 4) rc = result(lc, n, 4, rv, err);
    if (rc) return rc;
  }
  const tcc_ix *c1[1] = {id[1]};
  const tcc_vx *y = BIN(MUL, BIN(SUB, tcc_vx_cast(p, body_at(lc, xa->v, id), cd), mean_c), rstd_c);
  const tcc_arg *w = ARG("weight"), *b = ARG("bias");
  if (w->kind == TCC_ARG_TENSOR) y = BIN(MUL, y, tcc_vx_cast(p, body_at(lc, w->v, c1), cd));
  if (b->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, tcc_vx_cast(p, body_at(lc, b->v, c1), cd));
  return result(lc, n, 0, y, err);
}

/* grad_weight[w, d] = sum over positions p with indices[p] == w (and w
 * != padding_idx) of grad[p, d], divided by the count of w when
 * scale_grad_by_freq: a reduction over all index positions per weight
 * row (O(num_weights * positions * dim)). */
/* embedding_dense_backward: every weight row sums the gradient rows of
 * the tokens whose index equals it. For float32/float64 that is a GEMM,
 * onehot[row, token] . grad[token, dim] (the one-hot matrix packed by a
 * pointwise kernel, then BLAS); other dtypes take a masked reduction.
 * Either costs rows x tokens x dim, where a scatter-add costs tokens x
 * dim (the loop IR has no scatter yet): above this many it is refused,
 * so a real vocabulary runs PyTorch's scatter instead. */
#define TCC_EMBEDDING_BACKWARD_MAX_WORK (1 << 24)

/* The token index (multi-dim, over the indices' sizes) of flat index t. */
static void token_index(tcc_program *p, const tcc_meta *im, const tcc_ix *t, const tcc_ix **out) {
  for (int d = im->rank - 1; d >= 0; d--) {
    out[d] = d == 0 ? t : tcc_ix_mod(p, t, im->sizes[d]);
    if (d) t = tcc_ix_div(p, t, im->sizes[d]);
  }
}

/* The GEMM form (above): C[0, row, dim] = sum_t onehot[0, row, t] g[0, t, dim]. */
static int embedding_backward_gemm(tcc_lower_ctx *lc, const tcc_node *n, const tcc_meta *m, int gv,
                                   int iv, int64_t pad, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *im = &lc->g->values[iv].meta;
  int64_t T = im->numel, D = m->sizes[1], V = m->sizes[0];
  const tcc_ix *ti[TCC_MAX_DIMS + 1];
  /* A(b, row, t) = ids[t] == row */
  token_index(p, im, tcc_ix_var(p, 2), ti);
  const tcc_vx *id = tcc_vx_cast(p, body_at(lc, iv, ti), TCC__V1__DTYPE__INT64);
  const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, id, tcc_vx_index(p, tcc_ix_var(p, 1)));
  const tcc_vx *a = tcc_vx_where(p, hit, cst(p, m->dtype, 1), cst(p, m->dtype, 0));
  /* B(b, t, dim) = grad[t.., dim] */
  token_index(p, im, tcc_ix_var(p, 1), ti);
  ti[im->rank] = tcc_ix_var(p, 2);
  const tcc_vx *b = tcc_vx_cast(p, body_at(lc, gv, ti), m->dtype);
  const tcc_vx *c = tcc_lower_gemm(lc, a, b, 1, V, D, T, m->dtype);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_ix *ci[3] = {tcc_ix_const(p, 0), tcc_ix_var(p, 0), tcc_ix_var(p, 1)};
  const tcc_vx *s = tcc_vx_subst(p, c, 3, ci);
  if (pad >= 0)
    s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_EQ, tcc_vx_index(p, tcc_ix_var(p, 0)),
                                    cst(p, TCC__V1__DTYPE__INT64, (double)pad)),
                     cst(p, m->dtype, 0), s);
  return result(lc, n, 0, s, err);
}

int tcc_lower_embedding_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int gv = ARG("grad_output")->v, iv = ARG("indices")->v;
  const tcc_meta *im = &lc->g->values[iv].meta;
  double work = (double)m->sizes[0] * (double)m->sizes[1] * (double)(im->numel ? im->numel : 1);
  if (work > TCC_EMBEDDING_BACKWARD_MAX_WORK)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %lld rows x %lld tokens x %lld "
                         "dims is too much work for the dense forms (one-hot GEMM or masked "
                         "reduction: more than %d; a "
                         "scatter-add kernel is not implemented)", n->src_index, n->op->name,
                         (long long)m->sizes[0], (long long)im->numel, (long long)m->sizes[1],
                         TCC_EMBEDDING_BACKWARD_MAX_WORK);
  tcc_dtype cd = compute_dt(m->dtype);
  int64_t pad_idx = ARG("padding_idx")->i;
  if ((m->dtype == TCC__V1__DTYPE__FLOAT32 || m->dtype == TCC__V1__DTYPE__FLOAT64) &&
      !ARG("scale_grad_by_freq")->i && im->numel > 0)
    return embedding_backward_gemm(lc, n, m, gv, iv, pad_idx, err);
  int nr = im->rank, first = tcc_program_fresh_vars(p, nr ? nr : 1);
  int64_t sizes[TCC_MAX_DIMS];
  const tcc_ix *b[TCC_MAX_DIMS];
  for (int d = 0; d < nr; d++) {
    sizes[d] = im->sizes[d];
    b[d] = tcc_ix_var(p, first + d);
  }
  b[nr] = tcc_ix_var(p, 1);
  const tcc_vx *w = tcc_vx_index(p, tcc_ix_var(p, 0));
  const tcc_vx *idx = tcc_vx_cast(p, body_at(lc, iv, b), TCC__V1__DTYPE__INT64);
  const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, idx, w);
  int64_t pad = ARG("padding_idx")->i;
  const tcc_vx *g = tcc_vx_cast(p, body_at(lc, gv, b), cd);
  const tcc_vx *zero = cst(p, cd, 0);
  const tcc_vx *s;
  if (nr == 0) {
    s = tcc_vx_where(p, hit, g, zero);
  } else {
    s = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, hit, g, zero), first, nr, sizes);
    if (ARG("scale_grad_by_freq")->i) {
      int f2 = tcc_program_fresh_vars(p, nr);
      const tcc_ix *b2[TCC_MAX_DIMS];
      for (int d = 0; d < nr; d++) b2[d] = tcc_ix_var(p, f2 + d);
      const tcc_vx *h2 = tcc_vx_pred(p, TCC_PRIM_EQ, tcc_vx_cast(p, body_at(lc, iv, b2), TCC__V1__DTYPE__INT64), w);
      const tcc_vx *cnt = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, h2, cst(p, cd, 1), zero), f2, nr, sizes);
      s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_GT, cnt, zero), BIN(DIV, s, cnt), zero);
    }
  }
  if (pad >= 0)
    s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_EQ, w, cst(p, TCC__V1__DTYPE__INT64, (double)pad)), zero, s);
  return result(lc, n, 0, s, err);
}

/* ------------------------------------------------------------ matmul */

int tcc_lower_temp(tcc_lower_ctx *lc, int rank, const int64_t *sizes, tcc_dtype dt) {
  tcc_buffer b = {.kind = TCC_BUF_TEMP, .pos = -1, .value = -1};
  b.layout.dtype = dt;
  b.layout.device = lc->g->target.device;
  b.layout.rank = rank;
  memcpy(b.layout.sizes, sizes, sizeof(int64_t) * (size_t)rank);
  tcc_meta_contiguous(&b.layout);
  return tcc_program_add_buffer(lc->prog, &b);
}

int tcc_lower_pack(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                   tcc_dtype dt) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (!body || identity_index(p, rank, idx)) return -1;
  int id = tcc_lower_temp(lc, rank, sizes, dt);
  if (id < 0) return -1;
  int k = tcc_program_add_kernel(p, rank, sizes);
  if (k < 0 || tcc_kernel_add_store(p, k, id, idx, tcc_vx_cast(p, body, dt))) return -1;
  return id;
}

/* Realizes body (over `rank` vars of `sizes`) into a contiguous
 * temporary and returns the identity load of it. */
static const tcc_vx *materialize(tcc_lower_ctx *lc, const tcc_vx *body, int rank,
                                 const int64_t *sizes, tcc_dtype dt) {
  const tcc_ix *idx[TCC_MAX_DIMS];
  int id = tcc_lower_pack(lc, body, rank, sizes, dt);
  if (id < 0 || identity_index(lc->prog, rank, idx)) return NULL;
  return tcc_vx_load(lc->prog, id, rank, idx);
}

/* Can a GEMM operand over vars (b, r, c) with extents R x C be passed to
 * BLAS as it is? It must be one load whose storage offset is affine in
 * r and c (not necessarily in b) with a unit stride in one of them. */
static int blas_operand_ok(const tcc_program *p, const tcc_vx *e, int64_t R, int64_t C) {
  if (!e || e->op != TCC_PRIM_LOAD) return 0;
  const tcc_meta *L = &p->bufs[e->buf].layout;
  if (L->dtype != e->dtype) return 0;
  for (int d = 0; d < e->nidx; d++) {
    uint32_t v = tcc_ix_kernel_vars(e->idx[d]);
    if ((v & 1u) && (v & 6u)) return 0;        /* mixes batch and matrix vars */
  }
  int64_t coef[3], c0;
  /* matrix part: batch var 0 fixed by substituting it away is not
   * possible here, so require the whole offset to be affine in (r, c)
   * once batch-only dims are dropped */
  const tcc_ix *idx[TCC_MAX_DIMS];
  int64_t st[TCC_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < e->nidx; d++) {
    if (tcc_ix_kernel_vars(e->idx[d]) & 1u) continue;
    idx[n] = e->idx[d];
    st[n++] = L->strides[d];
  }
  if (!tcc_linear_affine(n, idx, st, 3, coef, &c0)) return 0;
  int64_t cr = coef[1], cc = coef[2];
  if (cr > INT32_MAX || cc > INT32_MAX) return 0;
  int64_t mc = C > 1 ? C : 1, mr = R > 1 ? R : 1;
  if ((cc == 1 || C == 1) && (R == 1 || cr >= mc)) return 1;
  if ((cr == 1 || R == 1) && (C == 1 || cc >= mr)) return 1;
  return 0;
}

/* CUDA only: cuBLAS's strided-batched call needs the operand's batch
 * offset affine in b too (a broadcast batch of an operand that is itself
 * batched is not); such operands are materialized. */
static int cuda_batch_affine(const tcc_program *p, const tcc_vx *e) {
  const tcc_meta *L = &p->bufs[e->buf].layout;
  int64_t coef[3], c0;
  return tcc_linear_affine(e->nidx, e->idx, L->strides, 3, coef, &c0);
}

/* Adds the GEMM C[b, m, n] = A[b, m, :] . B[b, :, n] as an EXTERN kernel;
 * a and bb are bodies over (b, m, k) and (b, k, n). Returns a load of C
 * over (b, m, n), or NULL when out of memory. */
static const tcc_vx *gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *bb, int64_t B,
                          int64_t M, int64_t N, int64_t K, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  int64_t as[3] = {B, M, K}, bs[3] = {B, K, N}, cs[3] = {B, M, N};
  /* CUDA: float16/bfloat16 operands stay half (cuBLAS reads them and
   * accumulates in float32 into a float32 C); CPU computes in float32. */
  int cuda = lc->g->target.device == TCC__V1__DEVICE_TYPE__CUDA;
  tcc_dtype od = dt;
  if (cuda && a && bb && a->dtype == bb->dtype && dt == TCC__V1__DTYPE__FLOAT32 &&
      (a->dtype == TCC__V1__DTYPE__FLOAT16 || a->dtype == TCC__V1__DTYPE__BFLOAT16))
    od = a->dtype;
  a = tcc_vx_cast(p, a, od);
  bb = tcc_vx_cast(p, bb, od);
  if (!blas_operand_ok(p, a, M, K) || (cuda && !cuda_batch_affine(p, a))) a = materialize(lc, a, 3, as, od);
  if (!blas_operand_ok(p, bb, K, N) || (cuda && !cuda_batch_affine(p, bb))) bb = materialize(lc, bb, 3, bs, od);
  int id = tcc_lower_temp(lc, 3, cs, dt);
  const tcc_ix *idx[3];
  if (id < 0 || ident(p, 3, idx)) return NULL;
  int64_t dims[4] = {B, M, N, K};
  const tcc_vx *call = tcc_vx_extern(p, TCC_EXT_GEMM, dt, a, bb, 4, dims);
  int k = tcc_program_add_kernel(p, 3, cs);
  if (k < 0 || tcc_kernel_add_store(p, k, id, idx, call)) return NULL;
  p->kernels[k].kind = TCC_OPK_EXTERN;
  return tcc_vx_load(p, id, 3, idx);
}

/* Body of value v (shape sizes[0..rank)) read as a [B, R, C] operand over
 * vars (b, r, c): the leading dims (broadcast to `batch`, right-aligned)
 * flatten into b, the trailing two are r and c. `trans` swaps the last
 * two dims (weight of linear); rank-1 operands are a row (as_row) or a
 * column. */
static const tcc_vx *as_operand(tcc_lower_ctx *lc, int v, const int64_t *batch, int nb,
                                int trans, int as_row) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = &lc->g->values[v].meta;
  const tcc_ix *in[TCC_MAX_DIMS];
  const tcc_ix *bvar = tcc_ix_var(p, 0), *r = tcc_ix_var(p, 1), *c = tcc_ix_var(p, 2);
  if (trans) {
    const tcc_ix *t = r;
    r = c;
    c = t;
  }
  if (x->rank == 1) {
    in[0] = as_row ? c : r;
    return body_at(lc, v, in);
  }
  int xb = x->rank - 2;
  /* unflatten b over the broadcast batch shape */
  const tcc_ix *bi[TCC_MAX_DIMS];
  const tcc_ix *rem = bvar;
  for (int d = nb - 1; d >= 0; d--) {
    bi[d] = d == 0 ? rem : tcc_ix_mod(p, rem, batch[d]);
    rem = tcc_ix_div(p, rem, batch[d]);
  }
  for (int d = 0; d < xb; d++) {
    int bd = d + nb - xb;
    in[d] = x->sizes[d] == 1 ? tcc_ix_const(p, 0) : bi[bd];
  }
  in[xb] = r;
  in[xb + 1] = c;
  return body_at(lc, v, in);
}

int tcc_lower_matmul(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_op_id id = n->op->id;
  int av, bv;
  if (id == TCC_OP_ADDMM) {
    av = ARG("mat1")->v;
    bv = ARG("mat2")->v;
  } else {
    av = n->args[0].v;
    bv = n->args[1].v;
  }
  const tcc_meta *A = &lc->g->values[av].meta, *Bm = &lc->g->values[bv].meta;
  tcc_dtype dt = A->dtype, gd;
  if (dt == TCC__V1__DTYPE__FLOAT32 || dt == TCC__V1__DTYPE__FLOAT16 || dt == TCC__V1__DTYPE__BFLOAT16)
    gd = TCC__V1__DTYPE__FLOAT32;
  else if (dt == TCC__V1__DTYPE__FLOAT64)
    gd = dt;
  else
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %s matmul is not supported by the "
                         "CPU backend", n->src_index, n->op->name, tcc_dtype_name(dt));
  int64_t batch[TCC_MAX_DIMS], B = 1, M, N, K;
  int nb = 0, trans_b = 0;
  int a_rank = A->rank, b_rank = Bm->rank;
  if (id == TCC_OP_LINEAR) {
    /* x [..., K] . w^T: flatten all of x's leading dims into M */
    trans_b = 1;
    K = A->sizes[a_rank - 1];
    N = b_rank == 2 ? Bm->sizes[0] : 1;
    M = 1;
    for (int d = 0; d < a_rank - 1; d++) M *= A->sizes[d];
  } else {
    K = A->sizes[a_rank - 1];
    M = a_rank >= 2 ? A->sizes[a_rank - 2] : 1;
    N = b_rank >= 2 ? Bm->sizes[b_rank - 1] : 1;
    int ra = a_rank > 2 ? a_rank - 2 : 0, rb = b_rank > 2 ? b_rank - 2 : 0, r;
    int64_t ba[TCC_MAX_DIMS], bb[TCC_MAX_DIMS];
    memcpy(ba, A->sizes, sizeof(int64_t) * (size_t)ra);
    memcpy(bb, Bm->sizes, sizeof(int64_t) * (size_t)rb);
    if (tcc_broadcast(ba, ra, bb, rb, batch, &r, err)) return err->code;
    nb = r;
    for (int d = 0; d < nb; d++) B *= batch[d];
  }
  const tcc_vx *a, *b;
  if (id == TCC_OP_LINEAR) {
    /* A(b, m, k) = x[unflatten(m), k] */
    const tcc_ix *o[2] = {tcc_ix_var(p, 1), tcc_ix_var(p, 2)}, *in[TCC_MAX_DIMS];
    int64_t flat[2] = {M, K};
    if (reshape_index(p, A->sizes, a_rank, flat, 2, o, in)) return OOM();
    a = body_at(lc, av, in);
    if (b_rank == 2) {
      b = as_operand(lc, bv, NULL, 0, 1, 0);
    } else {
      const tcc_ix *w[1] = {tcc_ix_var(p, 1)};
      b = body_at(lc, bv, w);
    }
  } else {
    a = as_operand(lc, av, batch, nb, 0, 1);
    b = as_operand(lc, bv, batch, nb, 0, 0);
    (void)trans_b;
  }
  const tcc_vx *c = gemm(lc, a, b, B, M, N, K, gd);
  if (!c) return OOM();
  /* C over (b, m, n) -> the output's index */
  const tcc_ix *ci[3], *out[TCC_MAX_DIMS];
  if (ident(p, m->rank, out)) return OOM();
  if (id == TCC_OP_LINEAR) {
    ci[0] = tcc_ix_const(p, 0);
    const tcc_ix *lin = tcc_ix_const(p, 0);
    int lead = b_rank == 2 ? m->rank - 1 : m->rank;
    for (int d = 0; d < lead; d++) lin = tcc_ix_add(p, tcc_ix_mul(p, lin, m->sizes[d]), out[d]);
    ci[1] = lin;
    ci[2] = b_rank == 2 ? out[m->rank - 1] : tcc_ix_const(p, 0);
  } else {
    const tcc_ix *lin = tcc_ix_const(p, 0);
    for (int d = 0; d < nb; d++) lin = tcc_ix_add(p, tcc_ix_mul(p, lin, batch[d]), out[d]);
    ci[0] = lin;
    ci[1] = a_rank >= 2 ? out[nb] : tcc_ix_const(p, 0);
    ci[2] = b_rank >= 2 ? out[m->rank - 1] : tcc_ix_const(p, 0);
  }
  const tcc_vx *y = tcc_vx_subst(p, c, 3, ci);
  /* epilogue: bias, alpha, beta */
  if (id == TCC_OP_ADDMM) {
    const tcc_arg *beta = ARG("beta"), *alpha = ARG("alpha");
    double bf = beta->kind == TCC_ARG_FLOAT ? beta->f : (double)beta->i;
    double af = alpha->kind == TCC_ARG_FLOAT ? alpha->f : (double)alpha->i;
    if (af != 1.0) y = BIN(MUL, y, cst(p, gd, af));
    if (bf != 0.0) {
      const tcc_vx *bias = opnd(lc, n, &n->args[0], gd);
      if (bf != 1.0) bias = BIN(MUL, bias, cst(p, gd, bf));
      y = BIN(ADD, bias, y);
    }
  } else if (id == TCC_OP_LINEAR && ARG("bias")->kind == TCC_ARG_TENSOR) {
    y = BIN(ADD, y, opnd(lc, n, ARG("bias"), gd));
  }
  return result(lc, n, 0, y, err);
}
/* gemm() for extern lowerings in other files (conv.c). */
const tcc_vx *tcc_lower_gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *b, int64_t batch,
                             int64_t M, int64_t N, int64_t K, tcc_dtype dt) {
  return gemm(lc, a, b, batch, M, N, K, dt);
}

/* ------------------------------------------------------------- driver */

/* Checks that the backend can lower node n's dtypes. */
static int node_dtypes_ok(const tcc_graph *g, const tcc_node *n, tcc_error *err) {
  for (int o = 0; o < n->nout; o++) {
    if (n->outs[o] < 0) continue;
    tcc_dtype d = g->values[n->outs[o]].meta.dtype;
    if (!storage_dtype_ok(d))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "node %d (%s): %s results are not supported by the CPU backend yet",
                           n->src_index, n->op->name, tcc_dtype_name(d));
  }
  FOR_EACH_TENSOR_ARG(n, v, {
    tcc_dtype d = g->values[v].meta.dtype;
    if (!storage_dtype_ok(d))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "node %d (%s): %s operands are not supported by the CPU backend yet",
                           n->src_index, n->op->name, tcc_dtype_name(d));
  })
  return 0;
}

int tcc_lower(tcc_program *p, tcc_error *err) {
  const tcc_graph *g = p->graph;
  tcc_lower_ctx lcs = {.prog = p, .g = g}, *lc = &lcs;
  lc->vals = tcc_arena_array(p->arena, (size_t)g->nvalues + 1, sizeof *lc->vals);
  lc->out_buf = tcc_arena_array(p->arena, (size_t)g->noutputs + 1, sizeof *lc->out_buf);
  if (!lc->vals || !lc->out_buf)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_ix *idx[TCC_MAX_DIMS];

  /* Inputs and constants: buffers read through their layout. */
  for (int v = 0; v < g->nvalues; v++) {
    const tcc_value *val = &g->values[v];
    if (val->kind != TCC_VAL_INPUT && val->kind != TCC_VAL_CONST) continue;
    tcc_buffer b = {.kind = val->kind == TCC_VAL_INPUT ? TCC_BUF_INPUT : TCC_BUF_CONST,
                    .pos = val->def, .layout = val->meta, .value = v,
                    .data = val->data, .data_len = val->data_len};
    if (val->kind == TCC_VAL_CONST) b.pos = v;
    int id = tcc_program_add_buffer(p, &b);
    if (id < 0 || identity_index(p, val->meta.rank, idx))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    tcc_lval *lv = &lc->vals[v];
    lv->rank = val->meta.rank;
    memcpy(lv->sizes, val->meta.sizes, sizeof lv->sizes);
    lv->dtype = val->meta.dtype;
    lv->body = tcc_vx_load(p, id, lv->rank, idx);
    if (!lv->body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }

  /* Output buffers, in return order, with the declared layouts. */
  for (int i = 0; i < g->noutputs; i++) {
    const tcc_value *val = &g->values[g->outputs[i]];
    if (!storage_dtype_ok(val->meta.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "graph output %d: %s is not supported by the CPU backend yet", i,
                           tcc_dtype_name(val->meta.dtype));
    tcc_buffer b = {.kind = TCC_BUF_OUTPUT, .pos = i, .layout = val->meta,
                    .value = g->outputs[i]};
    if ((lc->out_buf[i] = tcc_program_add_buffer(p, &b)) < 0)
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }

  /* Nodes, in canonical (topological) order. */
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    int rc = node_dtypes_ok(g, n, err);
    if (rc) return rc;
    p->cur_node = k;
    rc = n->op->lower(lc, n, err);
    p->cur_node = -1;
    if (rc) return rc;
    if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    for (int o = 0; o < n->nout; o++)
      if (n->outs[o] >= 0 && !lc->vals[n->outs[o]].body)
        return tcc_error_set(err, TCC_E_INTERNAL, "node %d (%s): lowering left output %d undefined",
                             n->src_index, n->op->name, o);
  }

  /* Outputs that are inputs or constants: copies. */
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const tcc_value *val = &g->values[v];
    if (val->kind == TCC_VAL_NODE) continue;
    int k = tcc_program_add_kernel(p, val->meta.rank, val->meta.sizes);
    if (k < 0 || identity_index(p, val->meta.rank, idx) ||
        tcc_kernel_add_store(p, k, lc->out_buf[i], idx, lc->vals[v].body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }
  if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  return 0;
}
