/*
 * pool.c — 2-D max and average pooling, forward and backward.
 *
 * Requires: a verified graph (the rows of ops.h bind the arguments).
 * Produces: output metas (infer) and loop-IR bodies (lower).
 *
 * Input: (N, C, H, W) or (C, H, W); the window of output (oh, ow) starts
 * at (oh * stride - pad) and takes kernel taps `dilation` apart (1 for
 * average pooling). Output sizes follow PyTorch's pooling_output_shape,
 * ceil_mode included; the argument checks are PyTorch's
 * (pool2d_shape_check), so what eager refuses is INVALID_ARGUMENT here.
 *
 *   max_pool2d_with_indices   MAX over the kh x kw taps, padding reads
 *                             -inf. The index output is the input plane's
 *                             flat index h * W + w of the tap eager picks:
 *                             the first maximum; the last NaN when the
 *                             window has one (eager's `val > max ||
 *                             isnan(val)`); the first tap inside the
 *                             input when every value is -inf.
 *   avg_pool2d                SUM over the taps inside the input, divided
 *                             by divisor_override, else the window's size
 *                             clipped to the padded input
 *                             (count_include_pad) or to the input.
 *   _adaptive_avg_pool2d      (at the end of this file) windows of sizes
 *                             that vary with the output position
 *   backward (both)           a gather, as Inductor lowers them: input
 *                             element (h, w) sums over the few windows
 *                             that can hold it (ceil(span / stride) per
 *                             dim) -- for max pooling those whose index
 *                             names (h, w). That reads `indices` as the
 *                             forward made it (AOTAutograd's graphs
 *                             always do); arbitrary indices pointing
 *                             outside their window would be missed.
 */
#include "graph.h"
#include "loop.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#define BAD(...) tcc_error_set(err, TCC_E_INVALID_ARGUMENT, __VA_ARGS__)
#define ARG(name) tcc_node_arg(n, name)
#define BIN(op, x, y) tcc_vx_binary(p, TCC_PRIM_##op, x, y)
#define PRED(op, x, y) tcc_vx_pred(p, TCC_PRIM_##op, x, y)
#define I64 TCC__V1__DTYPE__INT64

/* The geometry of one pooling node. */
typedef struct pool_geom {
  int lead;                      /* leading dims: 2 (N, C) or 1 (C) */
  int64_t H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} pool_geom;

static const tcc_meta *tmeta(const tcc_graph *g, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &g->values[a->v].meta : NULL;
}

/* An int[2] argument given as one or two values (`dflt` when empty and
 * dflt is not NULL). */
static int pair(const tcc_arg *a, const int64_t *dflt, int64_t *h, int64_t *w) {
  if (!a || a->kind != TCC_ARG_INTS) return -1;
  if (a->n == 0 && dflt) {
    *h = dflt[0];
    *w = dflt[1];
    return 0;
  }
  if (a->n != 1 && a->n != 2) return -1;
  *h = a->ints[0];
  *w = a->ints[a->n - 1];
  return 0;
}

/* floor(a / b) for b > 0 */
static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); }

/* PyTorch's pooling_output_shape. */
static int64_t out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, int ceil) {
  int64_t o = floor_div(in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0), stride) + 1;
  if (ceil && (o - 1) * stride >= in + pad) o--;
  return o;
}

static int pool_geom_of(const tcc_graph *g, const tcc_node *n, int is_max, pool_geom *pg,
                        tcc_error *err) {
  const tcc_meta *x = tmeta(g, ARG("self"));
  const char *what = is_max ? "max_pool2d" : "avg_pool2d";
  memset(pg, 0, sizeof *pg);
  if (x->rank != 3 && x->rank != 4)
    return BAD("%s: expected a 3-D or 4-D input, got %d-D", what, x->rank);
  pg->lead = x->rank - 2;
  pg->H = x->sizes[x->rank - 2];
  pg->W = x->sizes[x->rank - 1];
  for (int d = x->rank == 4 ? 1 : 0; d < x->rank; d++)
    if (x->sizes[d] == 0) return BAD("%s: expected non-empty dims but dim %d is 0", what, d);
  if (pair(ARG("kernel_size"), NULL, &pg->kh, &pg->kw))
    return BAD("%s: kernel_size must be one int or two", what);
  int64_t k[2] = {pg->kh, pg->kw};
  if (pair(ARG("stride"), k, &pg->sh, &pg->sw)) return BAD("%s: stride must be one int or two", what);
  if (pair(ARG("padding"), NULL, &pg->ph, &pg->pw))
    return BAD("%s: padding must be one int or two", what);
  pg->dh = pg->dw = 1;
  if (is_max && pair(ARG("dilation"), NULL, &pg->dh, &pg->dw))
    return BAD("%s: dilation must be one int or two", what);
  if (pg->kh <= 0 || pg->kw <= 0) return BAD("%s: kernel size should be greater than zero", what);
  if (pg->sh <= 0 || pg->sw <= 0) return BAD("%s: stride should be greater than zero", what);
  if (pg->dh <= 0 || pg->dw <= 0) return BAD("%s: dilation should be greater than zero", what);
  if (pg->ph < 0 || pg->pw < 0) return BAD("%s: padding must be non-negative", what);
  if (pg->ph > ((pg->kh - 1) * pg->dh + 1) / 2 || pg->pw > ((pg->kw - 1) * pg->dw + 1) / 2)
    return BAD("%s: pad should be at most half of effective kernel size", what);
  const tcc_arg *ceil = ARG("ceil_mode");
  int c = ceil && ceil->kind == TCC_ARG_BOOL && ceil->i;
  pg->OH = out_size(pg->H, pg->kh, pg->ph, pg->sh, pg->dh, c);
  pg->OW = out_size(pg->W, pg->kw, pg->pw, pg->sw, pg->dw, c);
  if (pg->OH < 1 || pg->OW < 1)
    return BAD("%s: given input size %lldx%lld, the output size %lldx%lld is too small", what,
               (long long)pg->H, (long long)pg->W, (long long)pg->OH, (long long)pg->OW);
  return 0;
}

static int finish(const tcc_graph *g, tcc_meta *out, tcc_dtype dt, const tcc_meta *like,
                  const pool_geom *pg, int pooled) {
  *out = *like;
  out->dtype = dt;
  out->device = g->target.device;
  if (pooled) {
    out->sizes[out->rank - 2] = pg->OH;
    out->sizes[out->rank - 1] = pg->OW;
  }
  tcc_meta_contiguous(out);
  return 0;
}

static int check_float(const tcc_node *n, const tcc_meta *x, tcc_error *err) {
  if (!tcc_dtype_is_float(x->dtype))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %s input is not supported",
                         n->src_index, n->op->name, tcc_dtype_name(x->dtype));
  return 0;
}

/* grad_output (or indices) must have the pooled shape of self. */
static int check_pooled(const tcc_meta *t, const tcc_meta *x, const pool_geom *pg, const char *name,
                        tcc_error *err) {
  int ok = t->rank == x->rank && t->sizes[x->rank - 2] == pg->OH && t->sizes[x->rank - 1] == pg->OW;
  for (int d = 0; ok && d < pg->lead; d++) ok = t->sizes[d] == x->sizes[d];
  return ok ? 0 : BAD("%s must have the pooled shape of self", name);
}

int tcc_infer_max_pool2d(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  pool_geom pg;
  int rc = pool_geom_of(g, n, 1, &pg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("self"));
  finish(g, &out[0], x->dtype, x, &pg, 1);
  return finish(g, &out[1], I64, x, &pg, 1);
}

int tcc_infer_avg_pool2d(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  pool_geom pg;
  int rc = pool_geom_of(g, n, 0, &pg, err);
  if (rc) return rc;
  const tcc_arg *div = ARG("divisor_override");
  if (div && div->kind == TCC_ARG_INT && div->i == 0) return BAD("avg_pool2d: divisor must be not zero");
  const tcc_meta *x = tmeta(g, ARG("self"));
  return finish(g, out, x->dtype, x, &pg, 1);
}

int tcc_infer_max_pool2d_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                  tcc_error *err) {
  pool_geom pg;
  int rc = pool_geom_of(g, n, 1, &pg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("self")), *gy = tmeta(g, ARG("grad_output"));
  const tcc_meta *ix = tmeta(g, ARG("indices"));
  if (ix->dtype != I64) return BAD("max_pool2d backward: indices must be int64");
  if ((rc = check_pooled(gy, x, &pg, "grad_output", err)) || (rc = check_pooled(ix, x, &pg, "indices", err)))
    return rc;
  return finish(g, out, gy->dtype, x, &pg, 0);
}

int tcc_infer_avg_pool2d_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                  tcc_error *err) {
  pool_geom pg;
  int rc = pool_geom_of(g, n, 0, &pg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("self")), *gy = tmeta(g, ARG("grad_output"));
  const tcc_arg *div = ARG("divisor_override");
  if (div && div->kind == TCC_ARG_INT && div->i == 0) return BAD("avg_pool2d: divisor must be not zero");
  if ((rc = check_pooled(gy, x, &pg, "grad_output", err))) return rc;
  return finish(g, out, gy->dtype, x, &pg, 0);
}

/* ----------------------------------------------------------- lowering */

static tcc_dtype compute_dt(tcc_dtype d) {
  return d == TCC__V1__DTYPE__FLOAT16 || d == TCC__V1__DTYPE__BFLOAT16 ? TCC__V1__DTYPE__FLOAT32 : d;
}

static const tcc_vx *read(tcc_lower_ctx *lc, int v, const tcc_ix *const *idx, tcc_dtype dt) {
  const tcc_lval *lv = &lc->vals[v];
  return tcc_vx_cast(lc->prog, tcc_vx_subst(lc->prog, lv->body, lv->rank, idx), dt);
}

static int put(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body, tcc_error *err) {
  if (o >= n->nout || n->outs[o] < 0) return 0;
  if (!body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_meta *m = &lc->g->values[n->outs[o]].meta;
  return tcc_lower_realize(lc, n, o, tcc_vx_cast(lc->prog, body, m->dtype), err);
}

static const tcc_vx *fcst(tcc_program *p, tcc_dtype dt, double f) {
  return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, f, 0), dt);
}

static const tcc_vx *icst(tcc_program *p, int64_t i) { return tcc_vx_const(p, I64, (double)i, i); }

static const tcc_vx *ival(tcc_program *p, const tcc_ix *e) { return tcc_vx_index(p, e); }

/* 0 <= e < n, as a bool value */
static const tcc_vx *in_range(tcc_program *p, const tcc_ix *e, int64_t n) {
  const tcc_vx *v = ival(p, e);
  return tcc_vx_pred(p, TCC_PRIM_AND, PRED(GE, v, icst(p, 0)), PRED(LT, v, icst(p, n)));
}

static const tcc_vx *and3(tcc_program *p, const tcc_vx *a, const tcc_vx *b, const tcc_vx *c) {
  return tcc_vx_pred(p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_AND, a, b), c);
}

/* Output index variables: lead dims, then (oh, ow) / (h, w). */
static void lead_index(tcc_program *p, const pool_geom *pg, const tcc_ix **idx) {
  for (int d = 0; d < pg->lead + 2; d++) idx[d] = tcc_ix_var(p, d);
}

/* The input row and column (unclamped) of output (oh, ow)'s tap (a, b). */
static void tap_at(tcc_program *p, const pool_geom *pg, const tcc_ix *a, const tcc_ix *b,
                   const tcc_ix **h, const tcc_ix **w) {
  int L = pg->lead;
  *h = tcc_ix_add(p, tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, L), pg->sh), tcc_ix_const(p, -pg->ph)),
                  tcc_ix_mul(p, a, pg->dh));
  *w = tcc_ix_add(p, tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, L + 1), pg->sw), tcc_ix_const(p, -pg->pw)),
                  tcc_ix_mul(p, b, pg->dw));
}

/* The input element of output (oh, ow) at tap (a, b), clamped into the
 * input (the caller masks what lies outside: *ok_h for the row, *ok_w
 * for the column). */
static const tcc_vx *tap(tcc_lower_ctx *lc, int xv, const pool_geom *pg, const tcc_ix *a,
                         const tcc_ix *b, tcc_dtype cd, const tcc_vx **ok_h, const tcc_vx **ok_w) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[TCC_MAX_DIMS], *h, *w;
  lead_index(p, pg, idx);
  int L = pg->lead;
  tap_at(p, pg, a, b, &h, &w);
  *ok_h = in_range(p, h, pg->H);
  *ok_w = in_range(p, w, pg->W);
  idx[L] = tcc_ix_clamp(p, h, pg->H);
  idx[L + 1] = tcc_ix_clamp(p, w, pg->W);
  return read(lc, xv, idx, cd);
}

/* The input-plane flat index (h * W + w) of output (oh, ow)'s tap at
 * row-major tap position t (an int64 value): a = t / kw, b = t % kw. */
static const tcc_vx *tap_index(tcc_program *p, const pool_geom *pg, const tcc_vx *t) {
  const tcc_vx *a = BIN(FLOORDIV, t, icst(p, pg->kw)), *b = BIN(REM, t, icst(p, pg->kw));
  const tcc_vx *oh = ival(p, tcc_ix_var(p, pg->lead)), *ow = ival(p, tcc_ix_var(p, pg->lead + 1));
  const tcc_vx *h = BIN(ADD, BIN(SUB, BIN(MUL, oh, icst(p, pg->sh)), icst(p, pg->ph)),
                        BIN(MUL, a, icst(p, pg->dh)));
  const tcc_vx *w = BIN(ADD, BIN(SUB, BIN(MUL, ow, icst(p, pg->sw)), icst(p, pg->pw)),
                        BIN(MUL, b, icst(p, pg->dw)));
  return BIN(ADD, BIN(MUL, h, icst(p, pg->W)), w);
}

/* First tap of the window inside the input along one dim: the smallest
 * start + k * dil >= 0, as an index expression. */
static const tcc_ix *first_inside(tcc_program *p, const tcc_ix *o, int64_t stride, int64_t pad,
                                  int64_t dil) {
  const tcc_ix *start = tcc_ix_add(p, tcc_ix_mul(p, o, stride), tcc_ix_const(p, -pad));
  const tcc_ix *before = tcc_ix_max(p, tcc_ix_mul(p, start, -1), 0);   /* taps' span in the pad */
  const tcc_ix *k = tcc_ix_div(p, tcc_ix_add(p, before, tcc_ix_const(p, dil - 1)), dil);
  return tcc_ix_add(p, start, tcc_ix_mul(p, k, dil));
}

/* What both forwards start with: the geometry, the compute dtype and
 * the input's value at tap (r, r + 1) of the output element (ok_h, ok_w:
 * the tap's row, its column lies inside the input). */
typedef struct pool_fwd {
  pool_geom pg;
  int xv;                        /* the input value */
  tcc_dtype cd;
  int64_t taps[2];
  int r;
  const tcc_vx *v, *ok_h, *ok_w;
} pool_fwd;

static int pool_fwd_of(tcc_lower_ctx *lc, const tcc_node *n, int is_max, pool_fwd *f,
                       tcc_error *err) {
  tcc_program *p = lc->prog;
  int rc = pool_geom_of(lc->g, n, is_max, &f->pg, err);
  if (rc) return rc;
  f->xv = ARG("self")->v;
  const tcc_meta *x = &lc->g->values[f->xv].meta;
  if ((rc = check_float(n, x, err))) return rc;
  f->cd = compute_dt(x->dtype);
  f->taps[0] = f->pg.kh;
  f->taps[1] = f->pg.kw;
  f->r = tcc_program_fresh_vars(p, 2);
  f->v = tap(lc, f->xv, &f->pg, tcc_ix_var(p, f->r), tcc_ix_var(p, f->r + 1), f->cd, &f->ok_h, &f->ok_w);
  return 0;
}

/* The tap's value, `fill` outside the input: a select per dim, so that
 * the row's (or in channels-last loops both) does not vary along the
 * SIMD element loop and prints as a mask (emit.c, invariant_select). As
 * one select on `ok_h && ok_w` gcc split it by the row's test and left
 * the loop scalar (a max pool's indices without a relu before it). */
static const tcc_vx *masked_tap(tcc_program *p, const pool_fwd *f, const tcc_vx *fill) {
  return tcc_vx_where(p, f->ok_h, tcc_vx_where(p, f->ok_w, f->v, fill), fill);
}

int tcc_lower_max_pool2d(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_fwd f;
  int rc = pool_fwd_of(lc, n, 1, &f, err);
  if (rc) return rc;
  const pool_geom *pg = &f.pg;
  tcc_dtype cd = f.cd;
  const tcc_vx *ninf = fcst(p, cd, -INFINITY);
  const tcc_vx *body = masked_tap(p, &f, ninf);
  const tcc_vx *mx = tcc_vx_reduce(p, TCC_RED_MAX, cd, body, f.r, 2, f.taps);
  if ((rc = put(lc, n, 0, mx, err))) return rc;
  if (n->nout < 2 || n->outs[1] < 0) return 0;

  /* the first maximum */
  const tcc_vx *am = tcc_vx_reduce(p, TCC_RED_ARGMAX, I64, body, f.r, 2, f.taps);
  const tcc_vx *first = tap_index(p, pg, am);
  /* the last NaN: the largest input index of a NaN tap (the taps inside
   * the input run in increasing index order), as a MAX of int64 values
   * over the same masked taps: gcc vectorized no element loop around an
   * argmax of bools, nor around `ok && isnan(v)` */
  const tcc_ix *th, *tw;
  tap_at(p, pg, tcc_ix_var(p, f.r), tcc_ix_var(p, f.r + 1), &th, &tw);
  const tcc_vx *is_nan = tcc_vx_pred(p, TCC_PRIM_ISNAN, body, NULL);
  const tcc_vx *at = ival(p, tcc_ix_add(p, tcc_ix_mul(p, th, pg->W), tw));
  const tcc_vx *nan_at = tcc_vx_where(p, is_nan, at, icst(p, -1));
  const tcc_vx *lastnan = tcc_vx_reduce(p, TCC_RED_MAX, I64, nan_at, f.r, 2, f.taps);
  /* every value -inf: the first tap inside the input */
  const tcc_ix *h0 = first_inside(p, tcc_ix_var(p, pg->lead), pg->sh, pg->ph, pg->dh);
  const tcc_ix *w0 = first_inside(p, tcc_ix_var(p, pg->lead + 1), pg->sw, pg->pw, pg->dw);
  const tcc_vx *inside = ival(p, tcc_ix_add(p, tcc_ix_mul(p, h0, pg->W), w0));
  const tcc_vx *idx = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_ISNAN, mx, NULL), lastnan,
                                   tcc_vx_where(p, PRED(EQ, mx, ninf), inside, first));
  return put(lc, n, 1, idx, err);
}

/* avg_pool2d's divisor for output (oh, ow), a value of dtype cd. */
static const tcc_vx *avg_divisor(tcc_program *p, const tcc_node *n, const pool_geom *pg,
                                 const tcc_ix *oh, const tcc_ix *ow, tcc_dtype cd) {
  const tcc_arg *div = ARG("divisor_override");
  if (div && div->kind == TCC_ARG_INT) return fcst(p, cd, (double)div->i);
  const tcc_arg *inc = ARG("count_include_pad");
  int include_pad = !inc || inc->kind != TCC_ARG_BOOL || inc->i;
  const tcc_ix *hs = tcc_ix_add(p, tcc_ix_mul(p, oh, pg->sh), tcc_ix_const(p, -pg->ph));
  const tcc_ix *ws = tcc_ix_add(p, tcc_ix_mul(p, ow, pg->sw), tcc_ix_const(p, -pg->pw));
  const tcc_ix *he = tcc_ix_min(p, tcc_ix_add(p, hs, tcc_ix_const(p, pg->kh)), pg->H + pg->ph);
  const tcc_ix *we = tcc_ix_min(p, tcc_ix_add(p, ws, tcc_ix_const(p, pg->kw)), pg->W + pg->pw);
  if (!include_pad) {
    hs = tcc_ix_max(p, hs, 0);
    ws = tcc_ix_max(p, ws, 0);
    he = tcc_ix_min(p, he, pg->H);
    we = tcc_ix_min(p, we, pg->W);
  }
  const tcc_vx *rows = ival(p, tcc_ix_add(p, he, tcc_ix_mul(p, hs, -1)));
  const tcc_vx *cols = ival(p, tcc_ix_add(p, we, tcc_ix_mul(p, ws, -1)));
  return tcc_vx_cast(p, BIN(MUL, rows, cols), cd);
}

int tcc_lower_avg_pool2d(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_fwd f;
  int rc = pool_fwd_of(lc, n, 0, &f, err);
  if (rc) return rc;
  const tcc_vx *inside = masked_tap(p, &f, fcst(p, f.cd, 0));
  const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, f.cd, inside, f.r, 2, f.taps);
  const tcc_vx *div = avg_divisor(p, n, &f.pg, tcc_ix_var(p, f.pg.lead), tcc_ix_var(p, f.pg.lead + 1),
                                  f.cd);
  return put(lc, n, 0, BIN(DIV, sum, div), err);
}

/* Backward: input element (h, w) (the output's vars) and the windows
 * that can hold it, candidates (ca, cb) < ceil(span / stride) per dim:
 * oh = (h + pad) / stride - ca. *ok: the window exists and its span
 * [oh * stride - pad, + span) holds h (and the same for w). */
static void window_of(tcc_program *p, const pool_geom *pg, int c, const tcc_ix **oh,
                      const tcc_ix **ow, const tcc_vx **ok) {
  int L = pg->lead;
  int64_t span_h = (pg->kh - 1) * pg->dh + 1, span_w = (pg->kw - 1) * pg->dw + 1;
  const tcc_ix *h = tcc_ix_var(p, L), *w = tcc_ix_var(p, L + 1);
  *oh = tcc_ix_add(p, tcc_ix_div(p, tcc_ix_add(p, h, tcc_ix_const(p, pg->ph)), pg->sh),
                   tcc_ix_mul(p, tcc_ix_var(p, c), -1));
  *ow = tcc_ix_add(p, tcc_ix_div(p, tcc_ix_add(p, w, tcc_ix_const(p, pg->pw)), pg->sw),
                   tcc_ix_mul(p, tcc_ix_var(p, c + 1), -1));
  /* h < oh * stride - pad + span */
  const tcc_vx *hin = PRED(LT, ival(p, h), ival(p, tcc_ix_add(p, tcc_ix_mul(p, *oh, pg->sh),
                                                             tcc_ix_const(p, span_h - pg->ph))));
  const tcc_vx *win = PRED(LT, ival(p, w), ival(p, tcc_ix_add(p, tcc_ix_mul(p, *ow, pg->sw),
                                                             tcc_ix_const(p, span_w - pg->pw))));
  *ok = tcc_vx_pred(p, TCC_PRIM_AND, and3(p, in_range(p, *oh, pg->OH), in_range(p, *ow, pg->OW), hin),
                    win);
}

static void candidates(const pool_geom *pg, int64_t *c) {
  c[0] = ((pg->kh - 1) * pg->dh + 1 + pg->sh - 1) / pg->sh;
  c[1] = ((pg->kw - 1) * pg->dw + 1 + pg->sw - 1) / pg->sw;
}

/* A pooled tensor v read at window (oh, ow) (clamped) of the output's lead dims. */
static const tcc_vx *pooled_at(tcc_lower_ctx *lc, int v, const pool_geom *pg, const tcc_ix *oh,
                               const tcc_ix *ow, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[TCC_MAX_DIMS];
  lead_index(p, pg, idx);
  idx[pg->lead] = tcc_ix_clamp(p, oh, pg->OH);
  idx[pg->lead + 1] = tcc_ix_clamp(p, ow, pg->OW);
  return read(lc, v, idx, dt);
}

/* What both backwards start with: the geometry, the compute dtype and
 * the candidate windows (bound vars from *c) of the output element. */
typedef struct pool_grad {
  pool_geom pg;
  tcc_dtype cd;
  int64_t cand[2];
  int c;
  const tcc_ix *oh, *ow;
  const tcc_vx *ok;
} pool_grad;

static int pool_grad_of(tcc_lower_ctx *lc, const tcc_node *n, int is_max, pool_grad *pgr,
                        tcc_error *err) {
  tcc_program *p = lc->prog;
  int rc = pool_geom_of(lc->g, n, is_max, &pgr->pg, err);
  if (rc) return rc;
  const tcc_meta *m = &lc->g->values[n->outs[0]].meta;
  if ((rc = check_float(n, m, err))) return rc;
  pgr->cd = compute_dt(m->dtype);
  candidates(&pgr->pg, pgr->cand);
  pgr->c = tcc_program_fresh_vars(p, 2);
  window_of(p, &pgr->pg, pgr->c, &pgr->oh, &pgr->ow, &pgr->ok);
  return 0;
}

int tcc_lower_max_pool2d_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_grad b;
  int rc = pool_grad_of(lc, n, 1, &b, err);
  if (rc) return rc;
  const pool_geom *pg = &b.pg;
  const tcc_vx *here = BIN(ADD, BIN(MUL, ival(p, tcc_ix_var(p, pg->lead)), icst(p, pg->W)),
                           ival(p, tcc_ix_var(p, pg->lead + 1)));
  const tcc_vx *picked = PRED(EQ, pooled_at(lc, ARG("indices")->v, pg, b.oh, b.ow, I64), here);
  const tcc_vx *gy = pooled_at(lc, ARG("grad_output")->v, pg, b.oh, b.ow, b.cd);
  const tcc_vx *body =
      tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_AND, b.ok, picked), gy, fcst(p, b.cd, 0));
  return put(lc, n, 0, tcc_vx_reduce(p, TCC_RED_SUM, b.cd, body, b.c, 2, b.cand), err);
}

int tcc_lower_avg_pool2d_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_grad b;
  int rc = pool_grad_of(lc, n, 0, &b, err);
  if (rc) return rc;
  const pool_geom *pg = &b.pg;
  const tcc_ix *ohc = tcc_ix_clamp(p, b.oh, pg->OH), *owc = tcc_ix_clamp(p, b.ow, pg->OW);
  const tcc_vx *gy = pooled_at(lc, ARG("grad_output")->v, pg, b.oh, b.ow, b.cd);
  const tcc_vx *share = BIN(DIV, gy, avg_divisor(p, n, pg, ohc, owc, b.cd));
  const tcc_vx *body = tcc_vx_where(p, b.ok, share, fcst(p, b.cd, 0));
  return put(lc, n, 0, tcc_vx_reduce(p, TCC_RED_SUM, b.cd, body, b.c, 2, b.cand), err);
}

/* ------------------------------------------------ adaptive average pooling
 *
 * _adaptive_avg_pool2d(x, (OH, OW)): output (oh, ow) is the mean of the
 * input window rows [floor(oh H / OH), ceil((oh + 1) H / OH)) and columns
 * likewise (PyTorch's start_index / end_index); windows differ in size
 * when OH does not divide H. Forward: a SUM over the largest window's taps,
 * masked to the window's own, divided by its size. Backward: input (h, w)
 * sums grad / size over the windows that hold it; the first is
 * floor(h OH / H) (no earlier window reaches h) and at most
 * ceil(OH / H) + 1 do. */

/* Window bounds along one dim of size `in` pooled to `out`, at index e. */
static const tcc_ix *adaptive_start(tcc_program *p, const tcc_ix *e, int64_t in, int64_t out) {
  return tcc_ix_div(p, tcc_ix_mul(p, e, in), out);
}
static const tcc_ix *adaptive_end(tcc_program *p, const tcc_ix *e, int64_t in, int64_t out) {
  return tcc_ix_div(p, tcc_ix_add(p, tcc_ix_mul(p, e, in), tcc_ix_const(p, in + out - 1)), out);
}
static int64_t adaptive_max_window(int64_t in, int64_t out) {
  int64_t k = 0;
  for (int64_t o = 0; o < out; o++) {
    int64_t w = ((o + 1) * in + out - 1) / out - o * in / out;
    if (w > k) k = w;
  }
  return k;
}

/* The geometry: lead dims and sizes (output_size from the node, or the
 * grad's last two sizes for the backward). */
static int adaptive_geom(const tcc_graph *g, const tcc_node *n, int backward, pool_geom *pg, tcc_error *err) {
  const tcc_meta *x = tmeta(g, ARG("self"));
  if (!x || (x->rank != 3 && x->rank != 4))
    return BAD("adaptive_avg_pool2d: expected a 3-D or 4-D input");
  memset(pg, 0, sizeof *pg);
  pg->lead = x->rank - 2;
  pg->H = x->sizes[x->rank - 2];
  pg->W = x->sizes[x->rank - 1];
  for (int d = 0; d < pg->lead; d++)
    if (x->sizes[d] == 0) return BAD("adaptive_avg_pool2d: empty input (dim %d)", d);
  if (backward) {
    const tcc_meta *gy = tmeta(g, ARG("grad_output"));
    if (!gy || gy->rank != x->rank) return BAD("adaptive_avg_pool2d backward: grad_output rank");
    for (int d = 0; d < pg->lead; d++)
      if (gy->sizes[d] != x->sizes[d]) return BAD("adaptive_avg_pool2d backward: grad_output size in dim %d", d);
    pg->OH = gy->sizes[gy->rank - 2];
    pg->OW = gy->sizes[gy->rank - 1];
  } else {
    const tcc_arg *os = ARG("output_size");
    if (!os || os->kind != TCC_ARG_INTS || os->n != 2) return BAD("adaptive_avg_pool2d: output_size must be 2 ints");
    pg->OH = os->ints[0];
    pg->OW = os->ints[1];
  }
  if (pg->OH <= 0 || pg->OW <= 0 || pg->H <= 0 || pg->W <= 0)
    return BAD("adaptive_avg_pool2d: sizes must be positive (input %" PRId64 "x%" PRId64 ", output %" PRId64
               "x%" PRId64 ")", pg->H, pg->W, pg->OH, pg->OW);
  return check_float(n, x, err);
}

int tcc_infer_adaptive_avg_pool2d(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  pool_geom pg;
  int rc = adaptive_geom(g, n, 0, &pg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("self"));
  return finish(g, out, x->dtype, x, &pg, 1);
}

int tcc_infer_adaptive_avg_pool2d_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                           tcc_error *err) {
  pool_geom pg;
  int rc = adaptive_geom(g, n, 1, &pg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("self")), *gy = tmeta(g, ARG("grad_output"));
  return finish(g, out, gy->dtype, x, &pg, 0);
}

/* The size of window (oh, ow), as a value of dtype cd. */
static const tcc_vx *adaptive_count(tcc_program *p, const pool_geom *pg, const tcc_ix *oh, const tcc_ix *ow,
                                    tcc_dtype cd) {
  const tcc_vx *kh = BIN(SUB, ival(p, adaptive_end(p, oh, pg->H, pg->OH)), ival(p, adaptive_start(p, oh, pg->H, pg->OH)));
  const tcc_vx *kw = BIN(SUB, ival(p, adaptive_end(p, ow, pg->W, pg->OW)), ival(p, adaptive_start(p, ow, pg->W, pg->OW)));
  return tcc_vx_cast(p, BIN(MUL, kh, kw), cd);
}

int tcc_lower_adaptive_avg_pool2d(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_geom pg;
  int rc = adaptive_geom(lc->g, n, 0, &pg, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(tmeta(lc->g, ARG("self"))->dtype);
  int L = pg.lead;
  int64_t taps[2] = {adaptive_max_window(pg.H, pg.OH), adaptive_max_window(pg.W, pg.OW)};
  int r = tcc_program_fresh_vars(p, 2);
  const tcc_ix *oh = tcc_ix_var(p, L), *ow = tcc_ix_var(p, L + 1);
  const tcc_ix *h = tcc_ix_add(p, adaptive_start(p, oh, pg.H, pg.OH), tcc_ix_var(p, r));
  const tcc_ix *w = tcc_ix_add(p, adaptive_start(p, ow, pg.W, pg.OW), tcc_ix_var(p, r + 1));
  const tcc_vx *ok = tcc_vx_pred(p, TCC_PRIM_AND, PRED(LT, ival(p, h), ival(p, adaptive_end(p, oh, pg.H, pg.OH))),
                                 PRED(LT, ival(p, w), ival(p, adaptive_end(p, ow, pg.W, pg.OW))));
  const tcc_ix *idx[TCC_MAX_DIMS];
  lead_index(p, &pg, idx);
  idx[L] = tcc_ix_clamp(p, h, pg.H);
  idx[L + 1] = tcc_ix_clamp(p, w, pg.W);
  const tcc_vx *v = read(lc, ARG("self")->v, idx, cd);
  const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, ok, v, fcst(p, cd, 0)), r, 2, taps);
  return put(lc, n, 0, BIN(DIV, sum, adaptive_count(p, &pg, oh, ow, cd)), err);
}

int tcc_lower_adaptive_avg_pool2d_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  pool_geom pg;
  int rc = adaptive_geom(lc->g, n, 1, &pg, err);
  if (rc) return rc;
  tcc_dtype cd = compute_dt(tmeta(lc->g, ARG("grad_output"))->dtype);
  int L = pg.lead;
  int64_t cand[2] = {(pg.OH + pg.H - 1) / pg.H + 1, (pg.OW + pg.W - 1) / pg.W + 1};
  int c = tcc_program_fresh_vars(p, 2);
  const tcc_ix *h = tcc_ix_var(p, L), *w = tcc_ix_var(p, L + 1);
  const tcc_ix *oh = tcc_ix_add(p, tcc_ix_div(p, tcc_ix_mul(p, h, pg.OH), pg.H), tcc_ix_var(p, c));
  const tcc_ix *ow = tcc_ix_add(p, tcc_ix_div(p, tcc_ix_mul(p, w, pg.OW), pg.W), tcc_ix_var(p, c + 1));
  /* window (oh, ow) exists and holds (h, w): start <= h < end per dim
   * (windows overlap when OH does not divide H) */
  const tcc_vx *hin = tcc_vx_pred(p, TCC_PRIM_AND, PRED(GE, ival(p, h), ival(p, adaptive_start(p, oh, pg.H, pg.OH))),
                                  PRED(LT, ival(p, h), ival(p, adaptive_end(p, oh, pg.H, pg.OH))));
  const tcc_vx *win = tcc_vx_pred(p, TCC_PRIM_AND, PRED(GE, ival(p, w), ival(p, adaptive_start(p, ow, pg.W, pg.OW))),
                                  PRED(LT, ival(p, w), ival(p, adaptive_end(p, ow, pg.W, pg.OW))));
  const tcc_vx *ok = and3(p, PRED(LT, ival(p, oh), icst(p, pg.OH)), PRED(LT, ival(p, ow), icst(p, pg.OW)),
                          tcc_vx_pred(p, TCC_PRIM_AND, hin, win));
  const tcc_ix *ohc = tcc_ix_clamp(p, oh, pg.OH), *owc = tcc_ix_clamp(p, ow, pg.OW);
  const tcc_ix *idx[TCC_MAX_DIMS];
  lead_index(p, &pg, idx);
  idx[L] = ohc;
  idx[L + 1] = owc;
  const tcc_vx *gy = read(lc, ARG("grad_output")->v, idx, cd);
  const tcc_vx *term = BIN(DIV, gy, adaptive_count(p, &pg, ohc, owc, cd));
  const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, cd, tcc_vx_where(p, ok, term, fcst(p, cd, 0)), c, 2, cand);
  return put(lc, n, 0, sum, err);
}
