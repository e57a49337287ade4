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
#include "lower.h"

#include <math.h>
#include <string.h>

/* Loop variables i0..i{rank-1}, the identity index of a shape. */
int tcc_lower_identity_index(tcc_program *p, int rank, const tcc_ix **idx) {
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
tcc_dtype tcc_lower_compute_dt(tcc_dtype d) {
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
  if (tcc_lower_identity_index(p, m->rank, idx))
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
    if (lc->channels_last[v]) tcc_meta_channels_last(&b.layout);
    else tcc_meta_contiguous(&b.layout);
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



const tcc_meta *tcc_lower_out_meta(tcc_lower_ctx *lc, const tcc_node *n, int o) {
  return n->outs[o] >= 0 ? &lc->g->values[n->outs[o]].meta : NULL;
}

const tcc_meta *tcc_lower_arg_meta(tcc_lower_ctx *lc, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &lc->g->values[a->v].meta : NULL;
}

const tcc_vx *tcc_lower_cst(tcc_program *p, tcc_dtype dt, double f) {
  return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, f, 0), dt);
}


/* Value v's body read at idx (one index per dim of v). */
const tcc_vx *tcc_lower_body_at(tcc_lower_ctx *lc, int v, const tcc_ix *const *idx) {
  const tcc_lval *lv = &lc->vals[v];
  return tcc_vx_subst(lc->prog, lv->body, lv->rank, idx);
}


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
int tcc_lower_result(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, o);
  if (!m) return 0;
  return tcc_lower_realize(lc, n, o, tcc_vx_cast(lc->prog, body, m->dtype), err);
}

/* Operand `a` broadcast to the output of node n, in dtype dt. */
const tcc_vx *tcc_lower_opnd(tcc_lower_ctx *lc, const tcc_node *n, const tcc_arg *a, tcc_dtype dt) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  return tcc_lower_operand(lc, a, m->rank, m->sizes, dt);
}

/* Realizes body (over `rank` vars of `sizes`) into a contiguous
 * temporary and returns the identity load of it. */
const tcc_vx *tcc_lower_materialize(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                                    tcc_dtype dt) {
  const tcc_ix *idx[TCC_MAX_DIMS];
  int id = tcc_lower_pack(lc, body, rank, sizes, dt);
  if (id < 0 || tcc_lower_identity_index(lc->prog, rank, idx)) return NULL;
  return tcc_vx_load(lc->prog, id, rank, idx);
}

int tcc_lower_temp(tcc_lower_ctx *lc, int rank, const int64_t *sizes, tcc_dtype dt) {
  tcc_buffer b = {.kind = TCC_BUF_TEMP, .pos = -1, .value = -1};
  b.layout.dtype = dt;
  b.layout.device = lc->g->target.device;
  b.layout.rank = rank;
  memcpy(b.layout.sizes, sizes, sizeof(int64_t) * (size_t)rank);
  tcc_meta_contiguous(&b.layout);
  return tcc_program_add_buffer(lc->prog, &b);
}

static int pack(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                tcc_dtype dt, int channels_last) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (!body || tcc_lower_identity_index(p, rank, idx)) return -1;
  int id = tcc_lower_temp(lc, rank, sizes, dt);
  if (id < 0) return -1;
  if (channels_last) tcc_meta_channels_last(&p->bufs[id].layout);
  int k = tcc_program_add_kernel(p, rank, sizes);
  if (k < 0 || tcc_kernel_add_store(p, k, id, idx, tcc_vx_cast(p, body, dt))) return -1;
  return id;
}

int tcc_lower_pack(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                   tcc_dtype dt) {
  return pack(lc, body, rank, sizes, dt, 0);
}

int tcc_lower_pack_channels_last(tcc_lower_ctx *lc, const tcc_vx *body, int rank,
                                 const int64_t *sizes, tcc_dtype dt) {
  return pack(lc, body, rank, sizes, dt, 1);
}

/* ------------------------------------------------- pointwise ops */

/* y = prim(x) */
int tcc_lower_unary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *x = tcc_lower_opnd(lc, n, &n->args[0], cd);
  tcc_prim op = n->op->prim;
  if (cd == TCC__V1__DTYPE__BOOL) {
    if (op == TCC_PRIM_BITNOT) op = TCC_PRIM_NOT;
    if (op == TCC_PRIM_ABS || op == TCC_PRIM_RELU || op == TCC_PRIM_SIGN) return tcc_lower_result(lc, n, 0, x, err);
    if (op == TCC_PRIM_NEG)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): negation on a bool tensor "
                           "is not supported", n->src_index, n->op->name);
  }
  if (op == TCC_PRIM_NOT) return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_NOT, x, NULL), err);
  return tcc_lower_result(lc, n, 0, tcc_vx_unary(p, op, x), err);
}

/* floor/ceil/round/trunc: identity on integers. */
int tcc_lower_rounding(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  if (!tcc_dtype_is_float(m->dtype)) return tcc_lower_result(lc, n, 0, tcc_lower_opnd(lc, n, &n->args[0], m->dtype), err);
  return tcc_lower_unary(lc, n, err);
}

/* isnan/isinf: false on integers. */
int tcc_lower_predicate(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  if (!tcc_dtype_is_float(x->dtype))
    return tcc_lower_result(lc, n, 0, tcc_vx_const(p, TCC__V1__DTYPE__BOOL, 0, 0), err);
  const tcc_vx *v = tcc_lower_opnd(lc, n, &n->args[0], tcc_lower_compute_dt(x->dtype));
  return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, n->op->prim, v, NULL), err);
}

/* x ** c for the constant exponents that ATen's CPU pow computes
 * without calling pow() (PowKernel.cpp: 2, 3 and -2 by multiplying, 0.5,
 * -0.5 and -1 as sqrt, rsqrt and reciprocal): eager's rounding, and a
 * loop that vectorizes (GPT-2's tanh GELU cubes its input). NULL for any
 * other exponent. */
static const tcc_vx *pow_by_constant(tcc_program *p, const tcc_vx *x, double c) {
  if (c == 2) return BIN(MUL, x, x);
  if (c == 3) return BIN(MUL, BIN(MUL, x, x), x);
  if (c == -2) return tcc_vx_unary(p, TCC_PRIM_RECIP, BIN(MUL, x, x));
  if (c == 0.5) return tcc_vx_unary(p, TCC_PRIM_SQRT, x);
  if (c == -0.5) return tcc_vx_unary(p, TCC_PRIM_RSQRT, x);
  if (c == -1) return tcc_vx_unary(p, TCC_PRIM_RECIP, x);
  return NULL;
}

/* y = prim(a, b), with b scaled by `alpha` when the schema has it
 * (add/sub: a + alpha * b). Bool add/mul are or/and. */
int tcc_lower_binary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  int ia = tcc_schema_param(&n->op->schema, "self");
  int ib = ia == 0 ? 1 : 0;
  if (ia < 0) ia = 0;
  const tcc_vx *a = tcc_lower_opnd(lc, n, &n->args[ia], cd);
  const tcc_vx *b = tcc_lower_opnd(lc, n, &n->args[ib], cd);
  tcc_prim op = n->op->prim;
  const tcc_arg *alpha = ARG("alpha");
  if (alpha) {
    int is_one = (alpha->kind == TCC_ARG_INT && alpha->i == 1) ||
                 (alpha->kind == TCC_ARG_FLOAT && alpha->f == 1.0) ||
                 (alpha->kind == TCC_ARG_BOOL && alpha->i == 1);
    if (!is_one) b = BIN(MUL, b, tcc_lower_operand(lc, alpha, 0, NULL, cd));
  }
  if (cd == TCC__V1__DTYPE__BOOL) {
    if (op == TCC_PRIM_ADD || op == TCC_PRIM_MAX) return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_OR, a, b), err);
    if (op == TCC_PRIM_MUL || op == TCC_PRIM_MIN) return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, TCC_PRIM_AND, a, b), err);
    if (op == TCC_PRIM_SUB)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): subtraction of bool "
                           "tensors is not supported", n->src_index, n->op->name);
  }
  if (op == TCC_PRIM_POW && tcc_dtype_is_float(cd) && a && b && b->op == TCC_PRIM_CONST) {
    const tcc_vx *y = pow_by_constant(p, a, b->f);
    if (y) return tcc_lower_result(lc, n, 0, y, err);
  }
  return tcc_lower_result(lc, n, 0, tcc_vx_binary(p, op, a, b), err);
}

int tcc_lower_square(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *x = tcc_lower_opnd(lc, n, &n->args[0], tcc_lower_compute_dt(m->dtype));
  if (x && x->dtype == TCC__V1__DTYPE__BOOL) return tcc_lower_result(lc, n, 0, x, err);
  return tcc_lower_result(lc, n, 0, BIN(MUL, x, x), err);
}

int tcc_lower_div_mode(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *a = tcc_lower_opnd(lc, n, &n->args[0], cd), *b = tcc_lower_opnd(lc, n, &n->args[1], cd);
  const tcc_arg *mode = ARG("rounding_mode");
  tcc_prim op = TCC_PRIM_DIV;
  if (mode->kind == TCC_ARG_STRING) op = mode->s[0] == 't' ? TCC_PRIM_TRUNCDIV : TCC_PRIM_FLOORDIV;
  if (cd == TCC__V1__DTYPE__BOOL) {
    a = tcc_vx_cast(p, a, TCC__V1__DTYPE__INT64);
    b = tcc_vx_cast(p, b, TCC__V1__DTYPE__INT64);
  }
  return tcc_lower_result(lc, n, 0, tcc_vx_binary(p, op, a, b), err);
}

int tcc_lower_compare(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (!tcc_lower_out_meta(lc, n, 0)) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(tcc_operands_result_type(lc->g, n));
  const tcc_vx *a = tcc_lower_opnd(lc, n, &n->args[0], cd), *b = tcc_lower_opnd(lc, n, &n->args[1], cd);
  return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, n->op->prim, a, b), err);
}

int tcc_lower_logical(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (!tcc_lower_out_meta(lc, n, 0)) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *a = tcc_lower_opnd(lc, n, &n->args[0], TCC__V1__DTYPE__BOOL);
  const tcc_vx *b = n->op->prim == TCC_PRIM_NOT ? NULL : tcc_lower_opnd(lc, n, &n->args[1], TCC__V1__DTYPE__BOOL);
  return tcc_lower_result(lc, n, 0, tcc_vx_pred(p, n->op->prim, a, b), err);
}

int tcc_lower_where(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *c = tcc_lower_opnd(lc, n, ARG("condition"), TCC__V1__DTYPE__BOOL);
  const tcc_vx *a = tcc_lower_opnd(lc, n, ARG("self"), cd), *b = tcc_lower_opnd(lc, n, ARG("other"), cd);
  return tcc_lower_result(lc, n, 0, tcc_vx_where(p, c, a, b), err);
}

int tcc_lower_clamp(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *x = tcc_lower_opnd(lc, n, ARG("self"), cd);
  const tcc_arg *lo = ARG("min"), *hi = ARG("max");
  if (lo->kind == TCC_ARG_NONE && hi->kind == TCC_ARG_NONE)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d (%s): at least one of 'min' or "
                         "'max' must not be None", n->src_index, n->op->name);
  if (lo->kind != TCC_ARG_NONE) x = BIN(MAX, x, tcc_lower_opnd(lc, n, lo, cd));
  if (hi->kind != TCC_ARG_NONE) x = BIN(MIN, x, tcc_lower_opnd(lc, n, hi, cd));
  return tcc_lower_result(lc, n, 0, x, err);
}

/* gelu(x) = x ndtr(x) = x/2 (1 + erf(x/sqrt 2)), or the tanh approximation */
static const tcc_vx *gelu_of(tcc_program *p, const tcc_vx *x, int tanh_approx) {
  if (tanh_approx) {
    tcc_dtype d = x->dtype;
    const tcc_vx *half = tcc_lower_cst(p, d, 0.5), *one = tcc_lower_cst(p, d, 1.0);
    const tcc_vx *inner = BIN(MUL, tcc_lower_cst(p, d, 0.7978845608028654),
                              BIN(ADD, x, BIN(MUL, tcc_lower_cst(p, d, 0.044715), BIN(MUL, x, BIN(MUL, x, x)))));
    return BIN(MUL, BIN(MUL, half, x), BIN(ADD, one, UN(TANH, inner)));
  }
  return BIN(MUL, x, UN(NDTR, x));
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
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  int t, rc = approx_tanh(n, err, &t);
  if (rc) return rc;
  return tcc_lower_result(lc, n, 0, gelu_of(lc->prog, tcc_lower_opnd(lc, n, &n->args[0], tcc_lower_compute_dt(m->dtype)), t), err);
}

int tcc_lower_gelu_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int t, rc = approx_tanh(n, err, &t);
  if (rc) return rc;
  tcc_dtype d = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *g = tcc_lower_opnd(lc, n, ARG("grad_output"), d), *x = tcc_lower_opnd(lc, n, ARG("self"), d);
  const tcc_vx *r;
  if (t) {
    const tcc_vx *half = tcc_lower_cst(p, d, 0.5), *one = tcc_lower_cst(p, d, 1.0);
    const tcc_vx *beta = tcc_lower_cst(p, d, 0.7978845608028654), *kappa = tcc_lower_cst(p, d, 0.044715);
    const tcc_vx *x2 = BIN(MUL, x, x), *x3 = BIN(MUL, x2, x);
    const tcc_vx *th = UN(TANH, BIN(MUL, beta, BIN(ADD, x, BIN(MUL, kappa, x3))));
    const tcc_vx *left = BIN(MUL, half, x), *right = BIN(ADD, one, th);
    const tcc_vx *dl = BIN(MUL, half, right);
    const tcc_vx *dr = BIN(MUL, BIN(MUL, BIN(MUL, left, BIN(SUB, one, BIN(MUL, th, th))), beta),
                           BIN(ADD, one, BIN(MUL, tcc_lower_cst(p, d, 3.0 * 0.044715), x2)));
    r = BIN(MUL, g, BIN(ADD, dl, dr));
  } else {
    const tcc_vx *cdf = UN(NDTR, x);
    const tcc_vx *pdf = BIN(MUL, UN(EXP, BIN(MUL, tcc_lower_cst(p, d, -0.5), BIN(MUL, x, x))),
                            tcc_lower_cst(p, d, 0.3989422804014327));
    r = BIN(MUL, g, BIN(ADD, cdf, BIN(MUL, x, pdf)));
  }
  return tcc_lower_result(lc, n, 0, r, err);
}

int tcc_lower_silu(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *x = tcc_lower_opnd(lc, n, &n->args[0], tcc_lower_compute_dt(m->dtype));
  return tcc_lower_result(lc, n, 0, BIN(MUL, x, UN(SIGMOID, x)), err);
}

int tcc_lower_threshold_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *g = tcc_lower_opnd(lc, n, ARG("grad_output"), cd), *x = tcc_lower_opnd(lc, n, ARG("self"), cd);
  const tcc_vx *th = tcc_lower_opnd(lc, n, ARG("threshold"), cd);
  return tcc_lower_result(lc, n, 0, tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_LE, x, th), tcc_lower_cst(p, cd, 0), g), err);
}

int tcc_lower_sigmoid_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *g = tcc_lower_opnd(lc, n, &n->args[0], cd), *y = tcc_lower_opnd(lc, n, &n->args[1], cd);
  return tcc_lower_result(lc, n, 0, BIN(MUL, BIN(MUL, g, BIN(SUB, tcc_lower_cst(p, cd, 1), y)), y), err);
}

int tcc_lower_tanh_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *g = tcc_lower_opnd(lc, n, &n->args[0], cd), *y = tcc_lower_opnd(lc, n, &n->args[1], cd);
  return tcc_lower_result(lc, n, 0, BIN(MUL, g, BIN(SUB, tcc_lower_cst(p, cd, 1), BIN(MUL, y, y))), err);
}

/* _to_copy: a conversion (only device cpu, strided layout). */
int tcc_lower_to_copy(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_vx *v = tcc_lower_opnd(lc, n, &n->args[0], x->dtype);
  /* float16 <-> bfloat16 goes through float32 */
  if (tcc_lower_compute_dt(x->dtype) != x->dtype && tcc_lower_compute_dt(m->dtype) != m->dtype && x->dtype != m->dtype)
    v = tcc_vx_cast(p, v, TCC__V1__DTYPE__FLOAT32);
  return tcc_lower_result(lc, n, 0, v, err);
}

int tcc_lower_copy(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  return tcc_lower_result(lc, n, 0, tcc_lower_opnd(lc, n, &n->args[0], m->dtype), err);
}

int tcc_lower_dropout(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (ARG("train")->i)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): dropout in training mode (random "
                         "numbers) is not supported", n->src_index, n->op->name);
  return tcc_lower_copy(lc, n, err);
}

/* ------------------------------------------------------- factories */

int tcc_lower_full(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *v = ARG("fill_value");
  if (!v) v = ARG("s");
  const tcc_vx *c;
  if (v) c = tcc_lower_operand(lc, v, 0, NULL, m->dtype);
  else c = tcc_lower_cst(p, m->dtype, n->op->id == TCC_OP_ONES || n->op->id == TCC_OP_ONES_LIKE ? 1.0 : 0.0);
  return tcc_lower_result(lc, n, 0, c, err);
}

int tcc_lower_arange(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *start = ARG("start"), *step = ARG("step");
  const tcc_vx *i = tcc_vx_index(p, tcc_ix_var(p, 0));
  if (tcc_dtype_is_float(m->dtype) || (start && start->kind == TCC_ARG_FLOAT) ||
      (step && step->kind == TCC_ARG_FLOAT)) {
    tcc_dtype d = TCC__V1__DTYPE__FLOAT64;
    const tcc_vx *a = start ? tcc_lower_operand(lc, start, 0, NULL, d) : tcc_lower_cst(p, d, 0);
    const tcc_vx *s = step ? tcc_lower_operand(lc, step, 0, NULL, d) : tcc_lower_cst(p, d, 1);
    return tcc_lower_result(lc, n, 0, BIN(ADD, a, BIN(MUL, tcc_vx_cast(p, i, d), s)), err);
  }
  tcc_dtype d = TCC__V1__DTYPE__INT64;
  const tcc_vx *a = start ? tcc_lower_operand(lc, start, 0, NULL, d) : tcc_lower_cst(p, d, 0);
  const tcc_vx *s = step ? tcc_lower_operand(lc, step, 0, NULL, d) : tcc_lower_cst(p, d, 1);
  return tcc_lower_result(lc, n, 0, BIN(ADD, a, BIN(MUL, i, s)), err);
}

/* ------------------------------------------------------------ views */

/* Index of a tensor of sizes `in` (rank ri) for the element of the
 * reshaped tensor of sizes `out` (rank ro) at index oidx: dims are
 * matched in groups of equal element count; a group's row-major offset
 * is split back with floor-div/mod (tcc_linear_affine sees through
 * them). */
int tcc_lower_reshape_index(tcc_program *p, const int64_t *in, int ri, const int64_t *out, int ro,
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
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *o[TCC_MAX_DIMS], *in[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, m->rank, o) || tcc_lower_reshape_index(p, x->sizes, x->rank, m->sizes, m->rank, o, in))
    return OOM();
  return set_view(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_permute(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
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
  return set_view(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_expand(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *in[TCC_MAX_DIMS];
  int lead = m->rank - x->rank;
  for (int d = 0; d < x->rank; d++)
    in[d] = x->sizes[d] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, d + lead);
  return set_view(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_slice(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim;
  int64_t start, len, step;
  int rc = tcc_slice_params(lc->g, n, &dim, &start, &len, &step, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  in[dim] = tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, dim), step), tcc_ix_const(p, start));
  return set_view(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_select(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim;
  int64_t index;
  int rc = tcc_select_params(lc->g, n, &dim, &index, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++)
    in[d] = d < dim ? tcc_ix_var(p, d) : d == dim ? tcc_ix_const(p, index) : tcc_ix_var(p, d - 1);
  return set_view(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
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
  return set_view(lc, n, 0, tcc_lower_body_at(lc, v, in), err);
}

/* as_strided over a graph input or constant: a second view of its
 * storage (an aliasing buffer with the requested layout); over a computed
 * value, see as_strided_computed. */
int tcc_lower_as_strided(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
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
  if (id < 0 || tcc_lower_identity_index(p, m->rank, idx)) return OOM();
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
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *self = ARG("self"), *srca = ARG("src");
  const tcc_arg *sz = ARG("size"), *st = ARG("stride"), *off = ARG("storage_offset");
  const tcc_value *sv = &lc->g->values[self->v];
  const tcc_meta *src = tcc_lower_arg_meta(lc, srca);
  if (sv->kind != TCC_VAL_NODE && !row_major_strides(sv->meta.sizes, sv->meta.strides, sv->meta.rank))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): as_strided_scatter into a "
                         "non-contiguous input is not supported", n->src_index, n->op->name);
  if (!row_major_strides(sz->ints, st->ints, sz->n))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): as_strided_scatter into a view "
                         "that is not one row-major block is not supported", n->src_index,
                         n->op->name);
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_vx *base = tcc_lower_opnd(lc, n, self, cd);
  int64_t o = off->kind == TCC_ARG_INT ? off->i : 0;
  if (src->numel == 0) return tcc_lower_result(lc, n, 0, base, err);
  const tcc_ix *q = tcc_ix_const(p, 0);         /* row-major position of the output index */
  for (int d = 0; d < m->rank; d++) q = tcc_ix_add(p, tcc_ix_mul(p, q, m->sizes[d]), tcc_ix_var(p, d));
  int whole = o == 0 && src->numel == m->numel;
  const tcc_ix *at = tcc_ix_add(p, q, tcc_ix_const(p, -o));
  if (!whole) at = tcc_ix_clamp(p, at, src->numel);
  const tcc_ix *in[TCC_MAX_DIMS];
  unravel_row_major(p, src->sizes, src->rank, at, in);
  const tcc_vx *val = tcc_vx_cast(p, tcc_lower_body_at(lc, srca->v, in), cd);
  if (!whole) {
    const tcc_vx *qv = tcc_vx_index(p, q);
    const tcc_vx *inside = tcc_vx_pred(
        p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_GE, qv, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)o)),
        tcc_vx_pred(p, TCC_PRIM_LT, qv, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)(o + src->numel))));
    val = tcc_vx_where(p, inside, val, base);
  }
  return tcc_lower_result(lc, n, 0, val, err);
}

/* copy(self, src): src broadcast to self, in self's dtype. */
int tcc_lower_copy_into(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  return tcc_lower_result(lc, n, 0, tcc_lower_opnd(lc, n, ARG("src"), m->dtype), err);
}

int tcc_lower_alias(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  return set_view(lc, n, 0, lc->vals[n->args[0].v].body, err);
}

/* ------------------------------------------- cat, pad and indexing */

int tcc_lower_cat(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *ts = ARG("tensors");
  int dim, rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
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
    const tcc_vx *v = tcc_vx_cast(p, tcc_lower_body_at(lc, ts->vals[use[u]], in), cd);
    if (!body) {
      body = v;
    } else {
      const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_LT, tcc_vx_index(p, id),
                                    tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)(off[u] + x->sizes[dim])));
      body = tcc_vx_where(p, c, v, body);
    }
  }
  if (!body) body = tcc_lower_cst(p, cd, 0);   /* empty result */
  return tcc_lower_result(lc, n, 0, body, err);
}

int tcc_lower_pad(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
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
                                    tcc_vx_pred(p, TCC_PRIM_GE, ev, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, 0)),
                                    tcc_vx_pred(p, TCC_PRIM_LT, ev,
                                                tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)x->sizes[d])));
      ok = ok ? tcc_vx_pred(p, TCC_PRIM_AND, ok, c) : c;
      e = tcc_ix_clamp(p, e, x->sizes[d]);
    }
    in[d] = e;
  }
  if (empty) return tcc_lower_result(lc, n, 0, fill, err);
  const tcc_vx *v = tcc_vx_cast(p, tcc_lower_body_at(lc, n->args[0].v, in), cd);
  return tcc_lower_result(lc, n, 0, ok ? tcc_vx_where(p, ok, v, fill) : v, err);
}

/* An index value read from tensor `ix` at index idx, as an index into a
 * dim of size `size` (negative values count from the end when wrap). */
static const tcc_ix *index_from(tcc_lower_ctx *lc, int ix, const tcc_ix *const *idx, int64_t size,
                                int wrap) {
  tcc_program *p = lc->prog;
  const tcc_vx *v = tcc_vx_cast(p, tcc_lower_body_at(lc, ix, idx), TCC__V1__DTYPE__INT64);
  if (wrap) {
    const tcc_vx *neg = tcc_vx_pred(p, TCC_PRIM_LT, v, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, 0));
    v = tcc_vx_where(p, neg, BIN(ADD, v, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)size)), v);
  }
  return tcc_ix_value(p, v, size);
}

int tcc_lower_index_select(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  const tcc_meta *im = tcc_lower_arg_meta(lc, ARG("index"));
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS], *ii[1];
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  ii[0] = x->rank ? tcc_ix_var(p, dim) : tcc_ix_const(p, 0);
  if (x->rank) in[dim] = index_from(lc, ARG("index")->v, ii, x->sizes[dim], 0);
  (void)im;
  return tcc_lower_result(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

int tcc_lower_gather(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  const tcc_ix *in[TCC_MAX_DIMS], *ii[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, m->rank, ii)) return OOM();
  for (int d = 0; d < x->rank; d++) in[d] = tcc_ix_var(p, d);
  if (x->rank) in[dim] = index_from(lc, ARG("index")->v, ii, x->sizes[dim], 1);
  return tcc_lower_result(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

/* x[..., i0, i1, ...]: each indexed dim reads its index tensor at the
 * result's broadcast position (size-1 dims of an index tensor at 0);
 * negative indices count from the end, out of range sets the kernel's
 * error flag. */
int tcc_lower_index(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
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
  return tcc_lower_result(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, in), err);
}

/* index_put (tcc_infer_index_put checked the form):
 *  - a boolean mask over self's leading dims: out = mask ? value : self;
 *  - one 1-D integer index tensor ix of J entries at dim k: out =
 *    where(i_k == ix[J-1], v[.., J-1, ..], ... where(i_k == ix[0], v[.., 0,
 *    ..], self)), so the last of equal indices wins as in a sequential
 *    write; with accumulate, self + the sum of the matching values. Each
 *    ix[j] is read as a checked index (negative counts from the end; out
 *    of range sets the kernel's error flag, as a read would). */
int tcc_lower_index_put(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  const tcc_arg *ix = ARG("indices"), *acc = ARG("accumulate");
  int pos = 0;
  while (ix->vals[pos] < 0) pos++;
  const tcc_vx *self = tcc_lower_opnd(lc, n, ARG("self"), cd);
  const tcc_lval *mk = &lc->vals[ix->vals[pos]];
  if (lc->g->values[ix->vals[pos]].meta.dtype == TCC__V1__DTYPE__BOOL) {
    const tcc_ix *idx[TCC_MAX_DIMS];
    for (int d = 0; d < mk->rank; d++) idx[d] = mk->sizes[d] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, d);
    const tcc_vx *mask = tcc_vx_subst(p, mk->body, mk->rank, idx);
    /* the value is cast to self's dtype first, as PyTorch does */
    const tcc_vx *val = tcc_vx_cast(p, tcc_lower_opnd(lc, n, ARG("values"), m->dtype), cd);
    if (acc && acc->i) val = BIN(ADD, self, val);
    return tcc_lower_result(lc, n, 0, tcc_vx_where(p, mask, val, self), err);
  }
  const tcc_meta *vm = tcc_lower_arg_meta(lc, ARG("values"));
  const tcc_vx *here = tcc_vx_index(p, tcc_ix_var(p, pos)), *out = self, *sum = NULL;
  for (int64_t j = 0; j < mk->sizes[0]; j++) {
    const tcc_ix *jj[1] = {tcc_ix_const(p, j)};
    const tcc_vx *at = tcc_vx_index(p, index_from(lc, ix->vals[pos], jj, m->sizes[pos], 1));
    const tcc_ix *in[TCC_MAX_DIMS];
    for (int dv = 0; dv < vm->rank; dv++) {
      int d = dv + m->rank - vm->rank;
      in[dv] = vm->sizes[dv] == 1 ? tcc_ix_const(p, 0) : d == pos ? tcc_ix_const(p, j) : tcc_ix_var(p, d);
    }
    const tcc_vx *v = tcc_vx_cast(p, tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("values")->v, in), m->dtype), cd);
    const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, here, at);
    if (acc && acc->i) {
      const tcc_vx *add = tcc_vx_where(p, hit, v, tcc_lower_cst(p, cd, 0));
      sum = sum ? BIN(ADD, sum, add) : add;
    } else {
      out = tcc_vx_where(p, hit, v, out);
    }
  }
  if (sum) out = BIN(ADD, self, sum);
  return tcc_lower_result(lc, n, 0, out, err);
}

/* index_put_ into a graph input (tcc_infer_index_put_input checked the
 * form: one 1-D integer index tensor ix of J entries at dim k, the
 * input read by nothing else): a kernel over the indexed shape (self's
 * sizes with dim k's replaced by J) stores v[.., j, ..] at self[.., ix[j],
 * ..] in the input's own buffer, and the node's value is that buffer,
 * read after the write by whatever kernel uses it (they all come later in
 * program order, and fuse.c moves no kernel past one that writes what it
 * reads). ix[j] counts from the end when negative; out of range it sets
 * the kernel's error flag (CPU) and the store is skipped (both targets'
 * emitters guard stores at indices read from tensors), so an index out
 * of range writes nothing. Equal indices: one of their values wins,
 * unspecified which, as in PyTorch. */
int tcc_lower_index_put_input(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_arg *ix = ARG("indices");
  int pos = 0;
  while (ix->vals[pos] < 0) pos++;
  int self = n->args[0].v, home = -1;
  for (int b = 0; b < p->nbufs; b++)
    if (p->bufs[b].value == self && p->bufs[b].kind == TCC_BUF_INPUT) home = b;
  if (home < 0) return tcc_error_set(err, TCC_E_INTERNAL, "index_put_: no buffer for the input");
  const tcc_meta *vm = tcc_lower_arg_meta(lc, ARG("values"));
  int64_t sizes[TCC_MAX_DIMS];
  memcpy(sizes, m->sizes, sizeof sizes);
  sizes[pos] = lc->g->values[ix->vals[pos]].meta.sizes[0];
  const tcc_ix *at[TCC_MAX_DIMS], *in[TCC_MAX_DIMS], *jj[1] = {tcc_ix_var(p, pos)};
  for (int d = 0; d < m->rank; d++)
    at[d] = d == pos ? index_from(lc, ix->vals[pos], jj, m->sizes[pos], 1) : tcc_ix_var(p, d);
  for (int dv = 0; dv < vm->rank; dv++) {
    int d = dv + m->rank - vm->rank;
    in[dv] = vm->sizes[dv] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, d);
  }
  /* the value is cast to self's dtype first, as PyTorch does */
  const tcc_vx *v = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("values")->v, in), m->dtype);
  int k = tcc_program_add_kernel(p, m->rank, sizes);
  if (k < 0 || !v || !at[pos] || tcc_kernel_add_store(p, k, home, at, v)) return OOM();
  p->bufs[home].written_in_place = 1;
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, m->rank, idx)) return OOM();
  return set_view(lc, n, 0, tcc_vx_load(p, home, m->rank, idx), err);
}

/* scatter.value: out[i] = value where some j has index[i with i_dim = j]
 * == i_dim (i inside index's extent in the other dims), else self[i]. */
int tcc_lower_scatter(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *im = tcc_lower_arg_meta(lc, ARG("index"));
  if (!m) return 0;
  tcc_program *p = lc->prog;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  int dim, rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  const tcc_vx *self = tcc_lower_opnd(lc, n, ARG("self"), cd);
  const tcc_vx *val = tcc_vx_cast(p, tcc_lower_opnd(lc, n, ARG("value"), m->dtype), cd);
  /* inside index's extent in every dim but dim */
  const tcc_vx *inside = NULL;
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < m->rank; d++) {
    in[d] = tcc_ix_var(p, d);
    if (d == dim || im->sizes[d] == m->sizes[d]) continue;
    if (im->sizes[d] == 0) return tcc_lower_result(lc, n, 0, self, err);
    const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_LT, tcc_vx_index(p, in[d]),
                                  tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)im->sizes[d]));
    inside = inside ? tcc_vx_pred(p, TCC_PRIM_AND, inside, c) : c;
    in[d] = tcc_ix_clamp(p, in[d], im->sizes[d]);
  }
  const tcc_vx *here = tcc_vx_index(p, tcc_ix_var(p, dim)), *any = NULL;
  for (int64_t j = 0; j < im->sizes[dim]; j++) {
    in[dim] = tcc_ix_const(p, j);
    const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, here,
                                    tcc_vx_index(p, index_from(lc, ARG("index")->v, in, m->sizes[dim], 1)));
    any = any ? tcc_vx_pred(p, TCC_PRIM_OR, any, hit) : hit;
  }
  if (!any) return tcc_lower_result(lc, n, 0, self, err);
  if (inside) any = tcc_vx_pred(p, TCC_PRIM_AND, inside, any);
  return tcc_lower_result(lc, n, 0, tcc_vx_where(p, any, val, self), err);
}

int tcc_lower_embedding(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *w = tcc_lower_arg_meta(lc, ARG("weight"));
  if (!m) return 0;
  tcc_program *p = lc->prog;
  const tcc_ix *ii[TCC_MAX_DIMS], *in[2];
  if (tcc_lower_identity_index(p, m->rank - 1, ii)) return OOM();
  in[0] = index_from(lc, ARG("indices")->v, ii, w->sizes[0], 0);
  in[1] = tcc_ix_var(p, m->rank - 1);
  return tcc_lower_result(lc, n, 0, tcc_lower_body_at(lc, ARG("weight")->v, in), err);
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
  lc->channels_last = tcc_arena_array(p->arena, (size_t)g->nvalues + 1, sizeof *lc->channels_last);
  if (!lc->vals || !lc->out_buf || !lc->channels_last)
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
    if (id < 0 || tcc_lower_identity_index(p, val->meta.rank, idx))
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

  tcc_conv_plan_layouts(lc);
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
    if (k < 0 || tcc_lower_identity_index(p, val->meta.rank, idx) ||
        tcc_kernel_add_store(p, k, lc->out_buf[i], idx, lc->vals[v].body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }
  if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  return 0;
}
