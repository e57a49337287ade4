/*
 * lower_reduce.c — the reductions, softmax and the norms, lowered (the
 * `lower` column of ops.h; lower.c's header says what lowering is).
 *
 * Reductions are REDUCE expressions over fresh bound variables inside a
 * kernel over the output shape; composites (softmax, layer_norm, var,
 * logsumexp, batch norm, the backward ops) are written as one expression
 * each, with their row statistics as REDUCEs the schedule hoists out of
 * the element loop.
 */
#include "lower.h"

#include <math.h>
#include <string.h>

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
  return tcc_lower_body_at(lc, v, in);
}

static const tcc_vx *fold(tcc_program *p, tcc_reduce_kind k, tcc_dtype dt, const tcc_vx *body,
                          const red_space *rs) {
  return tcc_vx_reduce(p, k, dt, tcc_vx_cast(p, body, dt), rs->first, rs->nred, rs->sizes);
}

/* mean and the correction-scaled variance of body over rs (dtype cd) */
static const tcc_vx *mean_of(tcc_program *p, const tcc_vx *body, const red_space *rs, tcc_dtype cd) {
  return BIN(DIV, fold(p, TCC_RED_SUM, cd, body, rs), tcc_lower_cst(p, cd, (double)rs->count));
}

/* mean_of(body over rs) of graph value v over the dims in mask, or the
 * one lowered before for the same (v, mask, keepdim, dtype) (lc->means):
 * then rs's fresh variables go unused. */
static const tcc_vx *shared_mean(tcc_lower_ctx *lc, int v, uint32_t mask, int keepdim, const tcc_vx *body,
                                 const red_space *rs, tcc_dtype cd) {
  int n = lc->nmeans < 16 ? lc->nmeans : 16;
  for (int i = 0; i < n; i++) {
    const struct tcc_mean_memo *m = &lc->means[i];
    if (m->v == v && m->mask == mask && m->keepdim == keepdim && m->dt == cd) return m->mean;
  }
  const tcc_vx *mean = mean_of(lc->prog, body, rs, cd);
  if (mean) lc->means[lc->nmeans++ % 16] = (struct tcc_mean_memo){v, mask, keepdim, cd, mean};
  return mean;
}

static const tcc_vx *var_of(tcc_program *p, const tcc_vx *body, const tcc_vx *mean,
                            const red_space *rs, tcc_dtype cd, double correction) {
  const tcc_vx *dx = BIN(SUB, tcc_vx_cast(p, body, cd), mean);
  const tcc_vx *ss = fold(p, TCC_RED_SUM, cd, BIN(MUL, dx, dx), rs);
  double den = (double)rs->count - correction;
  return BIN(DIV, ss, tcc_lower_cst(p, cd, den > 0 ? den : 0));
}

int tcc_lower_reduce(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = tcc_lower_arg_meta(lc, &n->args[0]);
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m && n->nout > 1) m = tcc_lower_out_meta(lc, n, 1);
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
  tcc_dtype od = tcc_lower_out_meta(lc, n, 0) ? tcc_lower_out_meta(lc, n, 0)->dtype : x->dtype;
  tcc_dtype cd = tcc_lower_compute_dt(od), xd = tcc_lower_compute_dt(x->dtype);
  switch (id) {
  case TCC_OP_SUM: case TCC_OP_SUM_DIM:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_SUM, cd, body, &rs), err);
  case TCC_OP_PROD: case TCC_OP_PROD_DIM:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_PROD, cd, body, &rs), err);
  case TCC_OP_MEAN: case TCC_OP_MEAN_DIM:
    return tcc_lower_result(lc, n, 0, shared_mean(lc, n->args[0].v, mask, keepdim, body, &rs, cd), err);
  case TCC_OP_AMAX: case TCC_OP_MAX:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_MAX, cd, body, &rs), err);
  case TCC_OP_AMIN: case TCC_OP_MIN:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_MIN, cd, body, &rs), err);
  case TCC_OP_MAX_DIM: case TCC_OP_MIN_DIM: {
    int mx = id == TCC_OP_MAX_DIM;
    const tcc_vx *b = tcc_vx_cast(p, body, xd);
    rc = tcc_lower_result(lc, n, 0, tcc_vx_reduce(p, mx ? TCC_RED_MAX : TCC_RED_MIN, xd, b, rs.first, rs.nred, rs.sizes), err);
    if (!rc) rc = tcc_lower_result(lc, n, 1, tcc_vx_reduce(p, mx ? TCC_RED_ARGMAX : TCC_RED_ARGMIN, TCC__V1__DTYPE__INT64, b, rs.first, rs.nred, rs.sizes), err);
    return rc;
  }
  case TCC_OP_ARGMAX: case TCC_OP_ARGMIN:
    return tcc_lower_result(lc, n, 0, tcc_vx_reduce(p, id == TCC_OP_ARGMAX ? TCC_RED_ARGMAX : TCC_RED_ARGMIN,
                                          TCC__V1__DTYPE__INT64, tcc_vx_cast(p, body, xd), rs.first,
                                          rs.nred, rs.sizes), err);
  case TCC_OP_ANY: case TCC_OP_ANY_DIM: case TCC_OP_ANY_DIMS:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_MAX, TCC__V1__DTYPE__BOOL, body, &rs), err);
  case TCC_OP_ALL: case TCC_OP_ALL_DIM: case TCC_OP_ALL_DIMS:
    return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_MIN, TCC__V1__DTYPE__BOOL, body, &rs), err);
  case TCC_OP_VAR: case TCC_OP_STD: case TCC_OP_VAR_MEAN: {
    const tcc_arg *c = ARG("correction");
    double corr = c->kind == TCC_ARG_NONE ? 1.0 : c->kind == TCC_ARG_FLOAT ? c->f : (double)c->i;
    const tcc_vx *mean = shared_mean(lc, n->args[0].v, mask, keepdim, body, &rs, xd);
    red_space r2;   /* a second pass over fresh bound vars */
    const tcc_vx *body2 = red_body(lc, n->args[0].v, mask, keepdim, &r2);
    const tcc_vx *var = var_of(p, body2, mean, &r2, xd, corr);
    if (id == TCC_OP_STD) var = UN(SQRT, var);
    rc = tcc_lower_result(lc, n, 0, var, err);
    if (!rc && id == TCC_OP_VAR_MEAN) rc = tcc_lower_result(lc, n, 1, mean, err);
    return rc;
  }
  case TCC_OP_LOGSUMEXP: {
    const tcc_vx *b = tcc_vx_cast(p, body, cd);
    const tcc_vx *mx = tcc_vx_reduce(p, TCC_RED_MAX, cd, b, rs.first, rs.nred, rs.sizes);
    mx = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_ISINF, mx, NULL), tcc_lower_cst(p, cd, 0), mx);
    red_space r2;
    const tcc_vx *b2 = tcc_vx_cast(p, red_body(lc, n->args[0].v, mask, keepdim, &r2), cd);
    const tcc_vx *s = fold(p, TCC_RED_SUM, cd, UN(EXP, BIN(SUB, b2, mx)), &r2);
    return tcc_lower_result(lc, n, 0, BIN(ADD, UN(LOG, s), mx), err);
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
  const tcc_meta *x = tcc_lower_arg_meta(lc, &n->args[0]), *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  if (x->rank == 0) return tcc_lower_result(lc, n, 0, tcc_lower_body_at(lc, n->args[0].v, NULL), err);
  int d;
  int rc = tcc_norm_dim(ARG("dim")->i, x->rank, &d, err);
  if (rc) return rc;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  red_space rs;
  const tcc_vx *body = red_body(lc, n->args[0].v, 1u << d, 1, &rs); /* output var d stays i */
  const tcc_vx *j = tcc_vx_index(p, tcc_ix_var(p, rs.first)), *i = tcc_vx_index(p, tcc_ix_var(p, d));
  const tcc_vx *kept = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_LE, j, i), tcc_vx_cast(p, body, cd), tcc_lower_cst(p, cd, 0));
  return tcc_lower_result(lc, n, 0, fold(p, TCC_RED_SUM, cd, kept, &rs), err);
}

/* ------------------------------------------ softmax and its backward */

/* Body of value v at the identity index of its shape with dim `dim`
 * replaced by a fresh bound var; *first gets the var. */
static const tcc_vx *row_body(tcc_lower_ctx *lc, int v, int dim, red_space *rs) {
  return red_body(lc, v, 1u << dim, 1, rs);
}

int tcc_lower_softmax(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0), *x = tcc_lower_arg_meta(lc, &n->args[0]);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, x->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
  if (tcc_lower_compute_dt(x->dtype) == TCC__V1__DTYPE__FLOAT64) cd = TCC__V1__DTYPE__FLOAT64;
  const tcc_ix *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  const tcc_vx *xi = tcc_vx_cast(p, tcc_lower_body_at(lc, n->args[0].v, id), cd);
  if (x->rank == 0) {   /* softmax of a scalar: 1 (log: 0) */
    int lg = n->op->id == TCC_OP_LOG_SOFTMAX || n->op->id == TCC_OP_LOG_SOFTMAX_INT;
    return tcc_lower_result(lc, n, 0, BIN(SUB, xi, lg ? xi : BIN(SUB, xi, tcc_lower_cst(p, cd, 1))), err);
  }
  red_space r1, r2;
  const tcc_vx *mx = fold(p, TCC_RED_MAX, cd, row_body(lc, n->args[0].v, dim, &r1), &r1);
  /* an all -inf row: subtract 0, giving nan like PyTorch */
  const tcc_vx *xr = tcc_vx_cast(p, row_body(lc, n->args[0].v, dim, &r2), cd);
  const tcc_vx *s = fold(p, TCC_RED_SUM, cd, UN(EXP, BIN(SUB, xr, mx)), &r2);
  int lg = n->op->id == TCC_OP_LOG_SOFTMAX || n->op->id == TCC_OP_LOG_SOFTMAX_INT;
  /* As eager's kernels compute it (aten/src/ATen/native/cpu/SoftMaxKernel.cpp):
   * the row's max + log(sum), or 1 / sum, once per row, so that each
   * element costs a subtraction or a multiplication: a division per
   * element made the softmax 1.3x slower than eager's (vdivps). */
  const tcc_vx *y = lg ? BIN(SUB, xi, BIN(ADD, mx, UN(LOG, s)))
                       : BIN(MUL, UN(EXP, BIN(SUB, xi, mx)), UN(RECIP, s));
  return tcc_lower_result(lc, n, 0, y, err);
}

int tcc_lower_softmax_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int gv = ARG("grad_output")->v, yv = ARG("output")->v;
  int dim, rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  tcc_dtype cd = tcc_lower_compute_dt(lc->g->values[gv].meta.dtype);
  const tcc_ix *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, m->rank, id)) return OOM();
  const tcc_vx *g = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, id), cd), *y = tcc_vx_cast(p, tcc_lower_body_at(lc, yv, id), cd);
  if (m->rank == 0) return tcc_lower_result(lc, n, 0, tcc_lower_cst(p, cd, 0), err);
  red_space rs;
  const tcc_vx *gr = tcc_vx_cast(p, row_body(lc, gv, dim, &rs), cd);
  if (n->op->id == TCC_OP_SOFTMAX_BACKWARD) {
    const tcc_ix *in[TCC_MAX_DIMS];
    for (int d = 0; d < m->rank; d++) in[d] = d == dim ? tcc_ix_var(p, rs.first) : tcc_ix_var(p, d);
    const tcc_vx *yr = tcc_vx_cast(p, tcc_lower_body_at(lc, yv, in), cd);
    const tcc_vx *s = fold(p, TCC_RED_SUM, cd, BIN(MUL, gr, yr), &rs);
    return tcc_lower_result(lc, n, 0, BIN(MUL, y, BIN(SUB, g, s)), err);
  }
  const tcc_vx *s = fold(p, TCC_RED_SUM, cd, gr, &rs);
  return tcc_lower_result(lc, n, 0, BIN(SUB, g, BIN(MUL, UN(EXP, y), s)), err);
}

/* ---------------------------------------------------------- norms */

/* Reads an optional per-normalized-element parameter (weight/bias) at
 * the output's index (its dims are the output's trailing dims). */
static const tcc_vx *param_at(tcc_lower_ctx *lc, const tcc_arg *a, int rank, tcc_dtype cd) {
  if (!a || a->kind != TCC_ARG_TENSOR) return NULL;
  const tcc_lval *lv = &lc->vals[a->v];
  const tcc_ix *in[TCC_MAX_DIMS];
  for (int d = 0; d < lv->rank; d++) in[d] = tcc_ix_var(lc->prog, rank - lv->rank + d);
  return tcc_vx_cast(lc->prog, tcc_lower_body_at(lc, a->v, in), cd);
}

int tcc_lower_layer_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = tcc_lower_compute_dt(x->dtype);
  uint32_t mask = 0;
  for (int d = axis; d < x->rank; d++) mask |= 1u << d;
  red_space r1, r2;
  /* statistics at index [i0..i{axis-1}, 0...]: shared by all outputs */
  const tcc_vx *mean = mean_of(p, red_body(lc, xv, mask, 1, &r1), &r1, cd);
  const tcc_vx *var = var_of(p, red_body(lc, xv, mask, 1, &r2), mean, &r2, cd, 0);
  const tcc_vx *rstd = UN(RSQRT, BIN(ADD, var, tcc_lower_cst(p, cd, ARG("eps")->f)));
  const tcc_ix *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  const tcc_vx *y = BIN(MUL, BIN(SUB, tcc_vx_cast(p, tcc_lower_body_at(lc, xv, id), cd), mean), rstd);
  const tcc_vx *w = param_at(lc, ARG("weight"), x->rank, cd), *b = param_at(lc, ARG("bias"), x->rank, cd);
  if (w) y = BIN(MUL, y, w);
  if (b) y = BIN(ADD, y, b);
  int rc = tcc_lower_result(lc, n, 0, y, err);
  if (!rc && n->nout > 1) rc = tcc_lower_result(lc, n, 1, mean, err);
  if (!rc && n->nout > 2) rc = tcc_lower_result(lc, n, 2, rstd, err);
  return rc;
}

int tcc_lower_rms_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = tcc_lower_compute_dt(x->dtype);
  const tcc_arg *e = ARG("eps");
  double eps = e->kind == TCC_ARG_FLOAT ? e->f
             : x->dtype == TCC__V1__DTYPE__FLOAT64 ? 2.220446049250313e-16
             : x->dtype == TCC__V1__DTYPE__FLOAT16 ? 0.0009765625
             : x->dtype == TCC__V1__DTYPE__BFLOAT16 ? 0.0078125 : 1.1920928955078125e-07;
  uint32_t mask = 0;
  for (int d = axis; d < x->rank; d++) mask |= 1u << d;
  red_space rs;
  const tcc_vx *xr = tcc_vx_cast(p, red_body(lc, xv, mask, 1, &rs), cd);
  const tcc_vx *ms = BIN(DIV, fold(p, TCC_RED_SUM, cd, BIN(MUL, xr, xr), &rs), tcc_lower_cst(p, cd, (double)rs.count));
  const tcc_ix *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  const tcc_vx *y = BIN(MUL, tcc_vx_cast(p, tcc_lower_body_at(lc, xv, id), cd), UN(RSQRT, BIN(ADD, ms, tcc_lower_cst(p, cd, eps))));
  const tcc_vx *w = param_at(lc, ARG("weight"), x->rank, cd);
  if (w) y = BIN(MUL, y, w);
  return tcc_lower_result(lc, n, 0, y, err);
}

int tcc_lower_layer_norm_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  int xv = ARG("input")->v, gv = ARG("grad_out")->v, mv = ARG("mean")->v, sv = ARG("rstd")->v;
  const tcc_meta *x = &lc->g->values[xv].meta;
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  tcc_dtype cd = tcc_lower_compute_dt(x->dtype);
  const tcc_arg *mask = ARG("output_mask");
  const tcc_arg *wa = ARG("weight");
  int64_t N = 1, M = 1;
  for (int d = axis; d < x->rank; d++) N *= x->sizes[d];
  for (int d = 0; d < axis; d++) M *= x->sizes[d];
  int rc = 0;
  /* mean/rstd are [..., 1, 1]: read at [i0..i{axis-1}, 0, ...] */
  const tcc_ix *st[TCC_MAX_DIMS], *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  for (int d = 0; d < x->rank; d++) st[d] = d < axis ? id[d] : tcc_ix_const(p, 0);
  const tcc_vx *mean = tcc_vx_cast(p, tcc_lower_body_at(lc, mv, st), cd);
  const tcc_vx *rstd = tcc_vx_cast(p, tcc_lower_body_at(lc, sv, st), cd);
  if (mask->bools[0] && n->outs[0] >= 0) {
    uint32_t rm = 0;
    for (int d = axis; d < x->rank; d++) rm |= 1u << d;
    red_space r1, r2;
    const tcc_vx *g1 = tcc_vx_cast(p, red_body(lc, gv, rm, 1, &r1), cd);
    /* bound reads of x, g, weight at [i0.., r...] */
    const tcc_ix *b1[TCC_MAX_DIMS];
    for (int d = 0; d < x->rank; d++) b1[d] = d < axis ? id[d] : tcc_ix_var(p, r1.first + d - axis);
    const tcc_vx *w1 = NULL;
    if (wa && wa->kind == TCC_ARG_TENSOR) w1 = tcc_vx_cast(p, tcc_lower_body_at(lc, wa->v, b1 + axis), cd);
    const tcc_vx *gw1 = w1 ? BIN(MUL, g1, w1) : g1;
    const tcc_vx *s1 = fold(p, TCC_RED_SUM, cd, gw1, &r1);
    const tcc_vx *g2 = tcc_vx_cast(p, red_body(lc, gv, rm, 1, &r2), cd);
    const tcc_ix *b2[TCC_MAX_DIMS];
    for (int d = 0; d < x->rank; d++) b2[d] = d < axis ? id[d] : tcc_ix_var(p, r2.first + d - axis);
    const tcc_vx *w2 = NULL;
    if (wa && wa->kind == TCC_ARG_TENSOR) w2 = tcc_vx_cast(p, tcc_lower_body_at(lc, wa->v, b2 + axis), cd);
    const tcc_vx *xh2 = BIN(MUL, BIN(SUB, tcc_vx_cast(p, tcc_lower_body_at(lc, xv, b2), cd), mean), rstd);
    const tcc_vx *s2 = fold(p, TCC_RED_SUM, cd, BIN(MUL, w2 ? BIN(MUL, g2, w2) : g2, xh2), &r2);
    const tcc_vx *g = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, id), cd);
    const tcc_vx *w = param_at(lc, wa, x->rank, cd);
    const tcc_vx *gw = w ? BIN(MUL, g, w) : g;
    const tcc_vx *xh = BIN(MUL, BIN(SUB, tcc_vx_cast(p, tcc_lower_body_at(lc, xv, id), cd), mean), rstd);
    const tcc_vx *dx = BIN(MUL, BIN(DIV, rstd, tcc_lower_cst(p, cd, (double)N)),
                           BIN(SUB, BIN(SUB, BIN(MUL, tcc_lower_cst(p, cd, (double)N), gw), s1), BIN(MUL, xh, s2)));
    rc = tcc_lower_result(lc, n, 0, dx, err);
  }
  for (int o = 1; o < 3 && !rc; o++) {
    if (!mask->bools[o] || n->nout <= o || n->outs[o] < 0) continue;
    /* grad_weight / grad_bias: sums over the leading dims */
    const tcc_meta *om = tcc_lower_out_meta(lc, n, o);
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
    const tcc_vx *g = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, b), cd);
    const tcc_vx *term = g;
    if (o == 1) {
      const tcc_vx *mb = tcc_vx_cast(p, tcc_lower_body_at(lc, mv, sb), cd);
      const tcc_vx *rb = tcc_vx_cast(p, tcc_lower_body_at(lc, sv, sb), cd);
      term = BIN(MUL, g, BIN(MUL, BIN(SUB, tcc_vx_cast(p, tcc_lower_body_at(lc, xv, b), cd), mb), rb));
    }
    const tcc_vx *s = axis ? tcc_vx_reduce(p, TCC_RED_SUM, cd, term, first, axis, sizes) : term;
    (void)om;
    (void)M;
    rc = tcc_lower_result(lc, n, o, s, err);
  }
  return rc;
}

int tcc_lower_batch_norm(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = tcc_lower_arg_meta(lc, ARG("input"));
  tcc_dtype cd = tcc_lower_compute_dt(x->dtype);
  const tcc_ix *id[TCC_MAX_DIMS];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  const tcc_ix *c[1] = {id[1]};
  const tcc_vx *xv = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("input")->v, id), cd);
  const tcc_vx *mean = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_mean")->v, c), cd);
  const tcc_vx *var = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_var")->v, c), cd);
  const tcc_vx *y = BIN(MUL, BIN(SUB, xv, mean), UN(RSQRT, BIN(ADD, var, tcc_lower_cst(p, cd, ARG("eps")->f))));
  const tcc_arg *w = ARG("weight"), *b = ARG("bias");
  if (w->kind == TCC_ARG_TENSOR) y = BIN(MUL, y, tcc_vx_cast(p, tcc_lower_body_at(lc, w->v, c), cd));
  if (b->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, tcc_vx_cast(p, tcc_lower_body_at(lc, b->v, c), cd));
  int rc = tcc_lower_result(lc, n, 0, y, err);
  for (int o = 1; o < n->nout && !rc; o++) rc = tcc_lower_result(lc, n, o, tcc_lower_cst(p, cd, 0), err);
  return rc;
}

/* A channel's mean and biased variance over the dims in mask (all but
 * dim 1 of x), in one pass: sums of d = x - s and of d * d, with s the
 * channel's first element, give mean = s + S1 / n and var = S2 / n -
 * (S1 / n)^2. The two sums read nothing of each other, so they fold in
 * one loop (and split together over few long rows on CUDA), where a mean
 * and then a variance of (x - mean)^2 read the data twice, one after the
 * other: ResNet-50's first batch norm (64 channels of 401,408) took 328
 * us on the H200 for 2 x 103 MB. The shift keeps the cancellation of
 * E[d^2] - E[d]^2 to the spread of the data around one of its own
 * values (the shifted-data algorithm), not around zero. */
static int shifted_stats(tcc_lower_ctx *lc, int v, uint32_t mask, tcc_dtype cd, const tcc_vx **mean,
                         const tcc_vx **var, double *count) {
  tcc_program *p = lc->prog;
  const tcc_meta *x = &lc->g->values[v].meta;
  red_space r1, r2;
  const tcc_vx *x1 = red_body(lc, v, mask, 0, &r1), *x2 = red_body(lc, v, mask, 0, &r2);
  const tcc_ix *first[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++)
    if (!(first[d] = (mask & (1u << d)) ? tcc_ix_const(p, 0) : tcc_ix_var(p, 0))) return -1;
  /* an empty channel has no first element to read: no shift */
  const tcc_vx *shift = r1.count ? tcc_vx_cast(p, tcc_lower_body_at(lc, v, first), cd) : tcc_lower_cst(p, cd, 0);
  const tcc_vx *d1 = BIN(SUB, tcc_vx_cast(p, x1, cd), shift);
  const tcc_vx *d2 = BIN(SUB, tcc_vx_cast(p, x2, cd), shift);
  const tcc_vx *n = tcc_lower_cst(p, cd, (double)r1.count);
  const tcc_vx *m1 = BIN(DIV, fold(p, TCC_RED_SUM, cd, d1, &r1), n);
  const tcc_vx *m2 = BIN(DIV, fold(p, TCC_RED_SUM, cd, BIN(MUL, d2, d2), &r2), n);
  *mean = BIN(ADD, shift, m1);
  *var = BIN(MAX, BIN(SUB, m2, BIN(MUL, m1, m1)), tcc_lower_cst(p, cd, 0));
  *count = (double)r1.count;
  return *mean && *var ? 0 : -1;
}

/* A per-channel statistic (over output index i0 = channel) as a value
 * the big kernel can read: node output o when it is kept, else a
 * temporary. Returns its body read at channel index `c`. */
static const tcc_vx *channel_stat(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                                  int64_t C, tcc_dtype dt, const tcc_ix *c, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[1] = {c};
  if (o >= 0 && o < n->nout && n->outs[o] >= 0 && lc->g->values[n->outs[o]].meta.numel == C) {
    if (tcc_lower_result(lc, n, o, body, err)) return NULL;
    return tcc_vx_cast(p, tcc_lower_body_at(lc, n->outs[o], idx), dt);
  }
  int64_t sz[1] = {C};
  const tcc_vx *ld = tcc_lower_materialize(lc, body, 1, sz, dt);
  return ld ? tcc_vx_subst(p, ld, 1, idx) : NULL;
}

/* Training batch norm (functional): batch statistics over every dim but
 * 1, the normalized output, saved mean / inverse std and the updated
 * running statistics (unbiased variance). With training false it is the
 * inference form with running statistics passed through. */
int tcc_lower_batch_norm_train(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_arg *xa = ARG("input");
  const tcc_meta *x = tcc_lower_arg_meta(lc, xa);
  int64_t C = x->sizes[1];
  tcc_dtype cd = tcc_lower_compute_dt(x->dtype);
  const tcc_ix *id[TCC_MAX_DIMS], *c0[1];
  if (tcc_lower_identity_index(p, x->rank, id)) return OOM();
  c0[0] = tcc_ix_var(p, 0);
  const tcc_vx *rm = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_mean")->v, c0), cd);
  const tcc_vx *rv = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_var")->v, c0), cd);
  double mom = ARG("momentum")->f, eps = ARG("eps")->f;
  const tcc_vx *mean_c, *rstd_c;
  int rc = 0;
  if (ARG("training")->i) {
    uint32_t mask = 0;
    for (int d = 0; d < x->rank; d++)
      if (d != 1) mask |= 1u << d;
    const tcc_vx *mean, *var;
    double cnt;
    if (shifted_stats(lc, xa->v, mask, cd, &mean, &var, &cnt)) return OOM();
    const tcc_vx *rstd = UN(RSQRT, BIN(ADD, var, tcc_lower_cst(p, cd, eps)));
    const tcc_vx *m = tcc_lower_cst(p, cd, mom), *one_m = tcc_lower_cst(p, cd, 1 - mom);
    const tcc_vx *unbiased = BIN(MUL, var, tcc_lower_cst(p, cd, cnt > 1 ? cnt / (cnt - 1) : INFINITY));
    if (n->nout > 3 && (rc = tcc_lower_result(lc, n, 3, BIN(ADD, BIN(MUL, one_m, rm), BIN(MUL, m, mean)), err))) return rc;
    if (n->nout > 4 && (rc = tcc_lower_result(lc, n, 4, BIN(ADD, BIN(MUL, one_m, rv), BIN(MUL, m, unbiased)), err))) return rc;
    mean_c = channel_stat(lc, n, 1, mean, C, cd, id[1], err);
    if (!mean_c) return err->code ? err->code : OOM();
    rstd_c = channel_stat(lc, n, 2, rstd, C, cd, id[1], err);
    if (!rstd_c) return err->code ? err->code : OOM();
  } else {
    const tcc_ix *c1[1] = {id[1]};
    mean_c = tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_mean")->v, c1), cd);
    rstd_c = UN(RSQRT, BIN(ADD, tcc_vx_cast(p, tcc_lower_body_at(lc, ARG("running_var")->v, c1), cd), tcc_lower_cst(p, cd, eps)));
    for (int o = 1; o < 3 && o < n->nout && !rc; o++) rc = tcc_lower_result(lc, n, o, tcc_lower_cst(p, cd, 0), err);
    if (!rc && n->nout > 3) rc = tcc_lower_result(lc, n, 3, rm, err);
    if (!rc && n->nout > 4) rc = tcc_lower_result(lc, n, 4, rv, err);
    if (rc) return rc;
  }
  const tcc_ix *c1[1] = {id[1]};
  const tcc_vx *y = BIN(MUL, BIN(SUB, tcc_vx_cast(p, tcc_lower_body_at(lc, xa->v, id), cd), mean_c), rstd_c);
  const tcc_arg *w = ARG("weight"), *b = ARG("bias");
  if (w->kind == TCC_ARG_TENSOR) y = BIN(MUL, y, tcc_vx_cast(p, tcc_lower_body_at(lc, w->v, c1), cd));
  if (b->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, tcc_vx_cast(p, tcc_lower_body_at(lc, b->v, c1), cd));
  return tcc_lower_result(lc, n, 0, y, err);
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
 * dim: the CPU takes the scatter-add EXTERN below (float32/float64, no
 * scale_grad_by_freq); elsewhere (CUDA, which has no scatter step yet)
 * more than this much work is refused, so a real vocabulary runs
 * PyTorch's scatter instead. */
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
  const tcc_vx *id = tcc_vx_cast(p, tcc_lower_body_at(lc, iv, ti), TCC__V1__DTYPE__INT64);
  const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, id, tcc_vx_index(p, tcc_ix_var(p, 1)));
  const tcc_vx *a = tcc_vx_where(p, hit, tcc_lower_cst(p, m->dtype, 1), tcc_lower_cst(p, m->dtype, 0));
  /* B(b, t, dim) = grad[t.., dim] */
  token_index(p, im, tcc_ix_var(p, 1), ti);
  ti[im->rank] = tcc_ix_var(p, 2);
  const tcc_vx *b = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, ti), m->dtype);
  const tcc_vx *c = tcc_lower_gemm(lc, a, b, 1, V, D, T, m->dtype);
  if (!c) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_ix *ci[3] = {tcc_ix_const(p, 0), tcc_ix_var(p, 0), tcc_ix_var(p, 1)};
  const tcc_vx *s = tcc_vx_subst(p, c, 3, ci);
  if (pad >= 0)
    s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_EQ, tcc_vx_index(p, tcc_ix_var(p, 0)),
                                    tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)pad)),
                     tcc_lower_cst(p, m->dtype, 0), s);
  return tcc_lower_result(lc, n, 0, s, err);
}

/* The CPU's form: a scatter-add EXTERN (TCC_EXT_INDEX_ADD_ROWS, tokens x
 * dim work) over the gradient as a contiguous [T, D] and the indices as
 * int64 [T] (each packed by a pointwise kernel), into a [V, D] TEMP in
 * the compute dtype; the result reads it (cast to the output's dtype). */
static int embedding_backward_scatter(tcc_lower_ctx *lc, const tcc_node *n, const tcc_meta *m, int gv,
                                      int iv, int64_t pad, tcc_dtype cd, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_meta *im = &lc->g->values[iv].meta;
  int64_t T = im->numel, D = m->sizes[1], V = m->sizes[0];
  const tcc_ix *ti[TCC_MAX_DIMS + 1];
  token_index(p, im, tcc_ix_var(p, 0), ti);
  ti[im->rank] = tcc_ix_var(p, 1);
  const tcc_vx *g = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, ti), cd);
  const int64_t gs[2] = {T, D}, is[1] = {T}, os[2] = {V, D};
  g = g ? tcc_lower_materialize(lc, g, 2, gs, cd) : NULL;
  token_index(p, im, tcc_ix_var(p, 0), ti);
  const tcc_vx *ix = tcc_vx_cast(p, tcc_lower_body_at(lc, iv, ti), TCC__V1__DTYPE__INT64);
  ix = ix ? tcc_lower_materialize(lc, ix, 1, is, TCC__V1__DTYPE__INT64) : NULL;
  /* a graph output of this dtype, contiguous, returned once: the step
   * writes it in place (no [V, D] copy from a TEMP, 94 MB for BERT) */
  int id = -1, v = n->outs[0], nout = 0, ob = -1;
  for (int i = 0; i < lc->g->noutputs; i++)
    if (lc->g->outputs[i] == v) nout++, ob = lc->out_buf[i];
  if (nout == 1 && m->dtype == cd) {
    tcc_meta c = p->bufs[ob].layout;
    tcc_meta_contiguous(&c);
    if (c.offset == 0 && !memcmp(c.strides, p->bufs[ob].layout.strides, sizeof(int64_t) * 2) &&
        p->bufs[ob].layout.offset == 0)
      id = ob;
  }
  int direct = id >= 0;
  if (!direct) id = tcc_lower_temp(lc, 2, os, cd);
  const tcc_ix *idx[2];
  const int64_t prm[4] = {V, D, T, pad};
  const tcc_vx *call = g && ix ? tcc_vx_extern(p, TCC_EXT_INDEX_ADD_ROWS, cd, g, ix, 4, prm) : NULL;
  if (!call || id < 0 || tcc_lower_identity_index(p, 2, idx))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  int k = tcc_program_add_kernel(p, 2, os);
  if (k < 0 || tcc_kernel_add_store(p, k, id, idx, call))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  p->kernels[k].kind = TCC_OPK_EXTERN;
  if (!direct) return tcc_lower_result(lc, n, 0, tcc_vx_cast(p, tcc_vx_load(p, id, 2, idx), m->dtype), err);
  tcc_lval *lv = &lc->vals[v];
  lv->rank = 2;
  memcpy(lv->sizes, os, sizeof os);
  lv->dtype = m->dtype;
  lv->body = tcc_vx_load(p, id, 2, idx);
  return lv->body ? 0 : tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
}

int tcc_lower_embedding_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
  if (!m) return 0;
  tcc_program *p = lc->prog;
  int gv = ARG("grad_output")->v, iv = ARG("indices")->v;
  const tcc_meta *im = &lc->g->values[iv].meta;
  if (lc->g->target.device == TCC__V1__DEVICE_TYPE__CPU && !ARG("scale_grad_by_freq")->i && im->numel > 0 &&
      m->rank == 2 && !lc->g->nsyms) {
    tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
    if (cd == TCC__V1__DTYPE__FLOAT32 || cd == TCC__V1__DTYPE__FLOAT64)
      return embedding_backward_scatter(lc, n, m, gv, iv, ARG("padding_idx")->i, cd, err);
  }
  double work = (double)m->sizes[0] * (double)m->sizes[1] * (double)(im->numel ? im->numel : 1);
  if (work > TCC_EMBEDDING_BACKWARD_MAX_WORK)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %lld rows x %lld tokens x %lld "
                         "dims is too much work for the dense forms (one-hot GEMM or masked "
                         "reduction: more than %d; a "
                         "scatter-add kernel is not implemented)", n->src_index, n->op->name,
                         (long long)m->sizes[0], (long long)im->numel, (long long)m->sizes[1],
                         TCC_EMBEDDING_BACKWARD_MAX_WORK);
  tcc_dtype cd = tcc_lower_compute_dt(m->dtype);
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
  const tcc_vx *idx = tcc_vx_cast(p, tcc_lower_body_at(lc, iv, b), TCC__V1__DTYPE__INT64);
  const tcc_vx *hit = tcc_vx_pred(p, TCC_PRIM_EQ, idx, w);
  int64_t pad = ARG("padding_idx")->i;
  const tcc_vx *g = tcc_vx_cast(p, tcc_lower_body_at(lc, gv, b), cd);
  const tcc_vx *zero = tcc_lower_cst(p, cd, 0);
  const tcc_vx *s;
  if (nr == 0) {
    s = tcc_vx_where(p, hit, g, zero);
  } else {
    s = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, hit, g, zero), first, nr, sizes);
    if (ARG("scale_grad_by_freq")->i) {
      int f2 = tcc_program_fresh_vars(p, nr);
      const tcc_ix *b2[TCC_MAX_DIMS];
      for (int d = 0; d < nr; d++) b2[d] = tcc_ix_var(p, f2 + d);
      const tcc_vx *h2 = tcc_vx_pred(p, TCC_PRIM_EQ, tcc_vx_cast(p, tcc_lower_body_at(lc, iv, b2), TCC__V1__DTYPE__INT64), w);
      const tcc_vx *cnt = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, h2, tcc_lower_cst(p, cd, 1), zero), f2, nr, sizes);
      s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_GT, cnt, zero), BIN(DIV, s, cnt), zero);
    }
  }
  if (pad >= 0)
    s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_EQ, w, tcc_lower_cst(p, TCC__V1__DTYPE__INT64, (double)pad)), zero, s);
  return tcc_lower_result(lc, n, 0, s, err);
}
