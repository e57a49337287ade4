/*
 * attention.c — aten._scaled_dot_product_flash_attention_for_cpu and its
 * backward as GEMM extern steps with fused softmax kernels (the
 * `attention*` rows of ops.h).
 *
 * Requires: a canonical graph; verified tensor arguments.
 *
 * q [.., L, E], k [.., S, E], v [.., S, Ev]; the leading dims (equal for
 * the three) flatten into one GEMM batch b. With s = scale * q.k^T + mask
 * (a bool mask keeps where true, a float mask adds; is_causal keeps
 * key j <= query i):
 *
 *   forward    S = q k^T (GEMM); lse[b, i] = max_j s + log sum_j exp(s -
 *              max) (one reduction kernel); P = exp(s - lse) (pointwise,
 *              into a TEMP); out = P v (GEMM). Outputs: out, logsumexp.
 *   backward   P again from q, k and the saved logsumexp; dV = P^T dO,
 *              dP = dO v^T (GEMMs); D[b, i] = sum dO * out; dS = P (dP -
 *              D) * scale; dQ = dS k, dK = dS^T q (GEMMs).
 *
 * float32/float64; dropout_p > 0 and other dtypes are UNIMPLEMENTED, as is
 * CUDA. logsumexp is float32 for float32 inputs (what eager returns).
 */
#include "loop.h"

#include <math.h>
#include <string.h>

#define BAD(...) tcc_error_set(err, TCC_E_INVALID_ARGUMENT, __VA_ARGS__)
#define OOM() tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering")
#define ARG(name) tcc_node_arg(n, name)
#define BIN(op, x, y) tcc_vx_binary(p, TCC_PRIM_##op, x, y)

/* The shape of one attention node. */
typedef struct attn_geom {
  int nlead;                        /* leading (batch) dims */
  int64_t lead[TCC_MAX_DIMS];
  int64_t Bt, L, S, E, Ev;
  double scale;
  int causal;
} attn_geom;

static const tcc_meta *tmeta(const tcc_graph *g, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &g->values[a->v].meta : NULL;
}

/* Fills ag from node n. Returns 0 or TCC_E_INVALID_ARGUMENT. */
static int attn_geom_of(const tcc_graph *g, const tcc_node *n, attn_geom *ag, tcc_error *err) {
  const tcc_meta *q = tmeta(g, ARG("query")), *k = tmeta(g, ARG("key")), *v = tmeta(g, ARG("value"));
  memset(ag, 0, sizeof *ag);
  if (q->rank != 4 || k->rank != 4 || v->rank != 4)
    return BAD("query, key and value must be 4-D [batch, heads, seq, head size]");
  if (q->dtype != k->dtype || q->dtype != v->dtype) return BAD("query, key and value must have one dtype");
  int r = q->rank;
  ag->nlead = r - 2;
  ag->Bt = 1;
  for (int d = 0; d < r - 2; d++) {
    if (k->sizes[d] != q->sizes[d] || v->sizes[d] != q->sizes[d])
      return BAD("query, key and value must have equal batch dims");
    ag->lead[d] = q->sizes[d];
    ag->Bt *= q->sizes[d];
  }
  ag->L = q->sizes[r - 2];
  ag->E = q->sizes[r - 1];
  ag->S = k->sizes[r - 2];
  ag->Ev = v->sizes[r - 1];
  if (k->sizes[r - 1] != ag->E) return BAD("query and key must have one embedding size");
  if (v->sizes[r - 2] != ag->S) return BAD("key and value must have one sequence length");
  if (ag->Ev != ag->E) return BAD("query, key and value must have one head size");
  const tcc_arg *sc = ARG("scale");
  ag->scale = sc && sc->kind == TCC_ARG_FLOAT ? sc->f : 1.0 / sqrt((double)(ag->E > 0 ? ag->E : 1));
  ag->causal = ARG("is_causal")->i != 0;
  const tcc_meta *m = tmeta(g, ARG("attn_mask"));
  if (m) {
    if (m->rank > r) return BAD("attn_mask has too many dims");
    for (int d = 0; d < m->rank; d++) {
      int64_t want = d + r - m->rank >= r - 2 ? (d + r - m->rank == r - 2 ? ag->L : ag->S)
                                              : ag->lead[d + r - m->rank];
      if (m->sizes[d] != 1 && m->sizes[d] != want) return BAD("attn_mask does not broadcast to [.., L, S]");
    }
  }
  return 0;
}

static tcc_dtype lse_dtype(tcc_dtype dt) {
  return dt == TCC__V1__DTYPE__FLOAT64 ? dt : TCC__V1__DTYPE__FLOAT32;
}

static int finish_meta(const tcc_graph *g, tcc_meta *out, tcc_dtype dt, int rank,
                       const int64_t *sizes) {
  out->dtype = dt;
  out->device = g->target.device;
  out->rank = rank;
  memcpy(out->sizes, sizes, sizeof(int64_t) * (size_t)rank);
  tcc_meta_contiguous(out);
  return 0;
}

/* Strides of m ([b, h, l, x] sizes) laid out as [b, l, h, x]: how eager's
 * CPU flash attention allocates its output and logsumexp (as
 * [b, l, h(, x)] transposed), so that the heads' merge that follows,
 * out.transpose(1, 2).reshape(b, l, h * x), is a view. */
static void heads_inner(tcc_meta *m) {
  int64_t x = m->rank == 4 ? m->sizes[3] : 1, h = m->sizes[1], l = m->sizes[2];
  if (m->rank == 4) m->strides[3] = 1;
  m->strides[1] = x;
  m->strides[2] = h * x;
  m->strides[0] = l * h * x;
}

/* Does m cover its elements once each, densely, in some order of its
 * dims (torch's non-overlapping and dense, what empty_like keeps)? */
static int dense_any_order(const tcc_meta *m) {
  int used[TCC_MAX_DIMS] = {0};
  int64_t want = 1;
  for (int i = 0; i < m->rank; i++) {
    int best = -1;
    for (int d = 0; d < m->rank; d++)
      if (!used[d] && m->sizes[d] > 1 && (best < 0 || m->strides[d] < m->strides[best])) best = d;
    if (best < 0) break;
    if (m->strides[best] != want) return 0;
    used[best] = 1;
    want *= m->sizes[best];
  }
  return 1;
}

int tcc_infer_attention(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  attn_geom ag;
  int rc = attn_geom_of(g, n, &ag, err);
  if (rc) return rc;
  const tcc_meta *q = tmeta(g, ARG("query"));
  int64_t sz[TCC_MAX_DIMS];
  memcpy(sz, q->sizes, sizeof(int64_t) * (size_t)q->rank);
  sz[q->rank - 1] = ag.Ev;
  finish_meta(g, &out[0], q->dtype, q->rank, sz);
  finish_meta(g, &out[1], lse_dtype(q->dtype), q->rank - 1, sz);
  heads_inner(&out[0]);
  heads_inner(&out[1]);
  return 0;
}

/* The gradients are laid out as their inputs when those are dense (eager
 * allocates them with empty_like): query's heads inner, as the forward's
 * projections made it, so the gradient's heads merge as a view. */
int tcc_infer_attention_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  attn_geom ag;
  int rc = attn_geom_of(g, n, &ag, err);
  if (rc) return rc;
  const char *names[3] = {"query", "key", "value"};
  for (int o = 0; o < 3; o++) {
    const tcc_meta *m = tmeta(g, ARG(names[o]));
    finish_meta(g, &out[o], m->dtype, m->rank, m->sizes);
    if (dense_any_order(m)) memcpy(out[o].strides, m->strides, sizeof(int64_t) * (size_t)m->rank);
  }
  return 0;
}

/* ---------------------------------------------------------- lowering */

static const tcc_vx *cst(tcc_program *p, tcc_dtype dt, double f) {
  return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, f, 0), dt);
}

/* Contiguous TEMP of `sizes` written with body (identity vars); returns a
 * load of it at idx, or NULL. */
static const tcc_vx *pack_at(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                             tcc_dtype dt, const tcc_ix *const *at) {
  int id = tcc_lower_pack(lc, body, rank, sizes, dt);
  return id < 0 ? NULL : tcc_vx_load(lc->prog, id, rank, at);
}

/* Value v read at (batch index b flattened over the leading dims, r, c). */
static const tcc_vx *at3(tcc_lower_ctx *lc, const attn_geom *ag, int v, const tcc_ix *b,
                         const tcc_ix *r, const tcc_ix *c, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  const tcc_ix *idx[TCC_MAX_DIMS];
  const tcc_ix *rem = b;
  int outer = 0;
  while (outer < ag->nlead - 1 && ag->lead[outer] == 1) outer++;
  for (int d = ag->nlead - 1; d >= 0; d--) {
    if (ag->lead[d] == 1) {
      idx[d] = tcc_ix_const(p, 0);
      continue;
    }
    idx[d] = d == outer ? rem : tcc_ix_mod(p, rem, ag->lead[d]);
    rem = tcc_ix_div(p, rem, ag->lead[d]);
  }
  idx[ag->nlead] = r;
  if (c) idx[ag->nlead + 1] = c;
  const tcc_lval *lv = &lc->vals[v];
  return tcc_vx_cast(p, tcc_vx_subst(p, lv->body, lv->rank, idx), dt);
}

/* The masked, scaled score at (b, i, j) given the raw q.k^T value there. */
static const tcc_vx *score(tcc_lower_ctx *lc, const tcc_node *n, const attn_geom *ag,
                           const tcc_vx *qk, const tcc_ix *b, const tcc_ix *i, const tcc_ix *j,
                           tcc_dtype dt) {
  tcc_program *p = lc->prog;
  const tcc_vx *s = BIN(MUL, qk, cst(p, dt, ag->scale));
  const tcc_vx *ninf = cst(p, dt, -INFINITY);
  const tcc_arg *ma = ARG("attn_mask");
  if (ma && ma->kind == TCC_ARG_TENSOR) {
    const tcc_meta *m = &lc->g->values[ma->v].meta;
    int r = ag->nlead + 2;
    /* the full index (lead.., i, j), then right-aligned onto the mask */
    const tcc_ix *full[TCC_MAX_DIMS], *mi[TCC_MAX_DIMS];
    const tcc_ix *rem = b;
    for (int d = ag->nlead - 1; d >= 0; d--) {
      full[d] = d == 0 ? rem : tcc_ix_mod(p, rem, ag->lead[d]);
      rem = tcc_ix_div(p, rem, ag->lead[d]);
    }
    full[r - 2] = i;
    full[r - 1] = j;
    for (int d = 0; d < m->rank; d++)
      mi[d] = m->sizes[d] == 1 ? tcc_ix_const(p, 0) : full[d + r - m->rank];
    const tcc_lval *lv = &lc->vals[ma->v];
    const tcc_vx *mv = tcc_vx_subst(p, lv->body, lv->rank, mi);
    if (m->dtype == TCC__V1__DTYPE__BOOL) s = tcc_vx_where(p, mv, s, ninf);
    else s = BIN(ADD, s, tcc_vx_cast(p, mv, dt));
  }
  if (ag->causal)
    s = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_GT, tcc_vx_index(p, j), tcc_vx_index(p, i)), ninf, s);
  return s;
}

/* Checks what the CPU lowering takes; returns the compute dtype or 0. */
static tcc_dtype attn_dtype(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_dtype dt = tmeta(lc->g, ARG("query"))->dtype;
  if (lc->g->target.device == TCC__V1__DEVICE_TYPE__CUDA) {
    tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): attention on CUDA is not supported yet",
                  n->src_index, n->op->name);
    return 0;
  }
  if (ARG("dropout_p")->f != 0) {
    tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): attention dropout is not supported",
                  n->src_index, n->op->name);
    return 0;
  }
  if (dt != TCC__V1__DTYPE__FLOAT32 && dt != TCC__V1__DTYPE__FLOAT64) {
    tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %s attention is not supported by the CPU "
                  "backend (float32 and float64 only)", n->src_index, n->op->name, tcc_dtype_name(dt));
    return 0;
  }
  return dt;
}

static int put(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body, tcc_error *err) {
  if (o >= n->nout || n->outs[o] < 0) return 0;
  if (!body) return OOM();
  const tcc_meta *m = &lc->g->values[n->outs[o]].meta;
  return tcc_lower_realize(lc, n, o, tcc_vx_cast(lc->prog, body, m->dtype), err);
}

/* Flat batch index of an output's leading vars i0..i{nlead-1}. */
static const tcc_ix *flat_lead(tcc_program *p, const attn_geom *ag) {
  const tcc_ix *lin = tcc_ix_const(p, 0);
  for (int d = 0; d < ag->nlead; d++) lin = tcc_ix_add(p, tcc_ix_mul(p, lin, ag->lead[d]), tcc_ix_var(p, d));
  return lin;
}

/* P[b, i, j] = exp(score - lse) packed as [Bt, L, S] (loaded at the
 * identity (b, i, j)); lse is a body over (b, i) as vars 0, 1. qk is the
 * GEMM result over (b, i, j). */
static const tcc_vx *probs(tcc_lower_ctx *lc, const tcc_node *n, const attn_geom *ag,
                           const tcc_vx *qk, const tcc_vx *lse, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  const tcc_ix *b = tcc_ix_var(p, 0), *i = tcc_ix_var(p, 1), *j = tcc_ix_var(p, 2);
  const tcc_vx *s = score(lc, n, ag, qk, b, i, j, dt);
  const tcc_vx *pr = tcc_vx_unary(p, TCC_PRIM_EXP, BIN(SUB, s, tcc_vx_cast(p, lse, dt)));
  int64_t sz[3] = {ag->Bt, ag->L, ag->S};
  const tcc_ix *at[3] = {b, i, j};
  return pack_at(lc, pr, 3, sz, dt, at);
}

int tcc_lower_attention(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  attn_geom ag;
  int rc = attn_geom_of(lc->g, n, &ag, err);
  if (rc) return rc;
  tcc_dtype dt = attn_dtype(lc, n, err);
  if (!dt) return err->code;
  tcc_dtype ld = lse_dtype(dt);
  int qv = ARG("query")->v, kv = ARG("key")->v, vv = ARG("value")->v;
  const tcc_ix *b = tcc_ix_var(p, 0), *r = tcc_ix_var(p, 1), *c = tcc_ix_var(p, 2);
  /* S = q k^T over (b, i, j) */
  const tcc_vx *qk = tcc_lower_gemm(lc, at3(lc, &ag, qv, b, r, c, dt), at3(lc, &ag, kv, b, c, r, dt),
                                    ag.Bt, ag.L, ag.S, ag.E, dt);
  if (!qk) return OOM();
  /* lse[b, i] over kernel vars (b, i), j bound */
  int jv = tcc_program_fresh_vars(p, 1);
  const tcc_ix *jb = tcc_ix_var(p, jv), *sub[3] = {b, r, jb};
  const tcc_vx *sj = score(lc, n, &ag, tcc_vx_subst(p, qk, 3, sub), b, r, jb, dt);
  int64_t ext[1] = {ag.S};
  const tcc_vx *mx = tcc_vx_reduce(p, TCC_RED_MAX, dt, sj, jv, 1, ext);
  /* a row masked everywhere has max -inf: subtract 0 instead (lse = -inf) */
  const tcc_vx *mxs = tcc_vx_where(p, tcc_vx_pred(p, TCC_PRIM_ISINF, mx, NULL), cst(p, dt, 0), mx);
  int jv2 = tcc_program_fresh_vars(p, 1);
  const tcc_ix *jb2 = tcc_ix_var(p, jv2), *sub2[3] = {b, r, jb2};
  const tcc_vx *sj2 = score(lc, n, &ag, tcc_vx_subst(p, qk, 3, sub2), b, r, jb2, dt);
  const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, dt, tcc_vx_unary(p, TCC_PRIM_EXP, BIN(SUB, sj2, mxs)),
                                    jv2, 1, ext);
  const tcc_vx *lse_body = BIN(ADD, mxs, tcc_vx_unary(p, TCC_PRIM_LOG, sum));
  int64_t lsz[2] = {ag.Bt, ag.L};
  const tcc_ix *lat[2] = {b, r};
  const tcc_vx *lse = pack_at(lc, lse_body, 2, lsz, dt, lat);
  if (!lse) return OOM();
  const tcc_vx *pr = probs(lc, n, &ag, qk, lse, dt);
  if (!pr) return OOM();
  const tcc_vx *o = tcc_lower_gemm(lc, pr, at3(lc, &ag, vv, b, r, c, dt), ag.Bt, ag.L, ag.Ev, ag.S, dt);
  if (!o) return OOM();
  /* outputs over (lead.., i, e) and (lead.., i) */
  const tcc_ix *oi[3] = {flat_lead(p, &ag), tcc_ix_var(p, ag.nlead), tcc_ix_var(p, ag.nlead + 1)};
  if ((rc = put(lc, n, 0, tcc_vx_subst(p, o, 3, oi), err))) return rc;
  const tcc_ix *li[2] = {oi[0], oi[1]};
  return put(lc, n, 1, tcc_vx_cast(p, tcc_vx_subst(p, lse, 2, li), ld), err);
}

int tcc_lower_attention_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  attn_geom ag;
  int rc = attn_geom_of(lc->g, n, &ag, err);
  if (rc) return rc;
  tcc_dtype dt = attn_dtype(lc, n, err);
  if (!dt) return err->code;
  int qv = ARG("query")->v, kv = ARG("key")->v, vv = ARG("value")->v;
  int gv = ARG("grad_out")->v, ov = ARG("out")->v, lv = ARG("logsumexp")->v;
  const tcc_ix *b = tcc_ix_var(p, 0), *r = tcc_ix_var(p, 1), *c = tcc_ix_var(p, 2);
  const tcc_vx *qk = tcc_lower_gemm(lc, at3(lc, &ag, qv, b, r, c, dt), at3(lc, &ag, kv, b, c, r, dt),
                                    ag.Bt, ag.L, ag.S, ag.E, dt);
  if (!qk) return OOM();
  const tcc_vx *pr = probs(lc, n, &ag, qk, at3(lc, &ag, lv, b, r, NULL, dt), dt);
  if (!pr) return OOM();
  const tcc_ix *tr[3] = {b, c, r};   /* (b, r, c) -> read at (b, c, r) */
  /* dV[b, j, e] = sum_i P[b, i, j] dO[b, i, e] */
  if (n->nout > 2 && n->outs[2] >= 0) {
    const tcc_vx *dv = tcc_lower_gemm(lc, tcc_vx_subst(p, pr, 3, tr), at3(lc, &ag, gv, b, r, c, dt),
                                      ag.Bt, ag.S, ag.Ev, ag.L, dt);
    if (!dv) return OOM();
    const tcc_ix *oi[3] = {flat_lead(p, &ag), tcc_ix_var(p, ag.nlead), tcc_ix_var(p, ag.nlead + 1)};
    if ((rc = put(lc, n, 2, tcc_vx_subst(p, dv, 3, oi), err))) return rc;
  }
  if (!(n->outs[0] >= 0 || (n->nout > 1 && n->outs[1] >= 0))) return 0;
  /* dP[b, i, j] = sum_e dO[b, i, e] v[b, j, e] */
  const tcc_vx *dp = tcc_lower_gemm(lc, at3(lc, &ag, gv, b, r, c, dt), at3(lc, &ag, vv, b, c, r, dt),
                                    ag.Bt, ag.L, ag.S, ag.Ev, dt);
  if (!dp) return OOM();
  /* D[b, i] = sum_e dO * out */
  int ev = tcc_program_fresh_vars(p, 1);
  const tcc_ix *eb = tcc_ix_var(p, ev);
  int64_t ext[1] = {ag.Ev};
  const tcc_vx *dsum = tcc_vx_reduce(p, TCC_RED_SUM, dt,
                                     BIN(MUL, at3(lc, &ag, gv, b, r, eb, dt), at3(lc, &ag, ov, b, r, eb, dt)),
                                     ev, 1, ext);
  int64_t lsz[2] = {ag.Bt, ag.L};
  const tcc_ix *lat[2] = {b, r};
  const tcc_vx *D = pack_at(lc, dsum, 2, lsz, dt, lat);
  if (!D) return OOM();
  /* dS = P (dP - D) scale, packed */
  int64_t ssz[3] = {ag.Bt, ag.L, ag.S};
  const tcc_ix *sat[3] = {b, r, c};
  const tcc_vx *ds = pack_at(lc, BIN(MUL, BIN(MUL, pr, BIN(SUB, dp, D)), cst(p, dt, ag.scale)), 3, ssz, dt, sat);
  if (!ds) return OOM();
  const tcc_ix *oi[3] = {flat_lead(p, &ag), tcc_ix_var(p, ag.nlead), tcc_ix_var(p, ag.nlead + 1)};
  if (n->outs[0] >= 0) {   /* dQ[b, i, e] = sum_j dS[b, i, j] k[b, j, e] */
    const tcc_vx *dq = tcc_lower_gemm(lc, ds, at3(lc, &ag, kv, b, r, c, dt), ag.Bt, ag.L, ag.E, ag.S, dt);
    if (!dq || (rc = put(lc, n, 0, tcc_vx_subst(p, dq, 3, oi), err))) return dq ? rc : OOM();
  }
  if (n->nout > 1 && n->outs[1] >= 0) {   /* dK[b, j, e] = sum_i dS[b, i, j] q[b, i, e] */
    const tcc_vx *dk = tcc_lower_gemm(lc, tcc_vx_subst(p, ds, 3, tr), at3(lc, &ag, qv, b, r, c, dt),
                                      ag.Bt, ag.S, ag.E, ag.L, dt);
    if (!dk || (rc = put(lc, n, 1, tcc_vx_subst(p, dk, 3, oi), err))) return dk ? rc : OOM();
  }
  return 0;
}
