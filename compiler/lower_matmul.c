/*
 * lower_matmul.c — matmuls lowered (mm, bmm, addmm, matmul, linear's
 * decompositions): a GEMM step (tcc_lower_gemm: an EXTERN kernel the
 * targets run through oneDNN, OpenBLAS or cuBLAS) over operands packed
 * (tcc_lower_pack) where their layout does not fit the library; conv.c
 * and attention.c use the same step.
 */
#include "lower.h"
#include "cpu/cpu_schedule.h"

#include <string.h>

/* ------------------------------------------------------------ matmul */

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
  if (!tcc_gemm_operand_affine(p, e, coef, &c0)) return 0;
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

/* The value of index expression e at loop variables vals[0..3); 0 when
 * it reads another expression's value (VALUE) or a variable past 2. */
static int ix_at(const tcc_ix *e, const int64_t *vals, int64_t *out) {
  int64_t a, b;
  switch (e->kind) {
  case TCC_IX_CONST: *out = e->c; return 1;
  case TCC_IX_VAR:
    if (e->var < 0 || e->var > 2) return 0;
    *out = vals[e->var];
    return 1;
  case TCC_IX_ADD:
    if (!ix_at(e->a, vals, &a) || !ix_at(e->b, vals, &b)) return 0;
    return !__builtin_add_overflow(a, b, out);
  case TCC_IX_MUL:
    if (!ix_at(e->a, vals, &a)) return 0;
    return !__builtin_mul_overflow(a, e->c, out);
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    if (!ix_at(e->a, vals, &a) || e->c <= 0 || a < 0) return 0;
    *out = e->kind == TCC_IX_DIV ? a / e->c : a % e->c;
    return 1;
  case TCC_IX_MIN:
  case TCC_IX_MAX:
    if (!ix_at(e->a, vals, &a)) return 0;
    *out = (e->kind == TCC_IX_MIN) == (a < e->c) ? a : e->c;
    return 1;
  default: return 0;
  }
}

/* The element offset of load e at (b, r, c) = vals; 0 when unknown. */
static int load_offset_at(const tcc_program *p, const tcc_vx *e, const int64_t *vals, int64_t *off) {
  const tcc_meta *L = &p->bufs[e->buf].layout;
  int64_t o = 0, x;
  for (int d = 0; d < e->nidx; d++)
    if (!ix_at(e->idx[d], vals, &x) || __builtin_mul_overflow(x, L->strides[d], &x) ||
        __builtin_add_overflow(o, x, &o))
      return 0;
  *off = o;
  return 1;
}

/* Does a GEMM operand over (b, r, c) that must be packed read its source
 * along r rather than c: one load (through a cast) one element apart
 * from (b, 0, 0) to (b, 1, 0) and not to (b, 0, 1)? Such an operand is
 * packed transposed, [B, C, R], which BLAS reads just as well, so the
 * packing kernel copies runs of the source instead of gathering at its
 * row stride: a bias gradient in attention's head layout [b, h, s, d]
 * feeding the weight gradient's GEMM (BERT's training step). */
static int packs_transposed(const tcc_program *p, const tcc_vx *e, int64_t R, int64_t C) {
  if (e && e->op == TCC_PRIM_CAST) e = e->a;
  if (!e || e->op != TCC_PRIM_LOAD || R < 2 || C < 2) return 0;
  int64_t o0, o_r, o_c;
  const int64_t v0[3] = {0, 0, 0}, vr[3] = {0, 1, 0}, vc[3] = {0, 0, 1};
  if (!load_offset_at(p, e, v0, &o0) || !load_offset_at(p, e, vr, &o_r) || !load_offset_at(p, e, vc, &o_c))
    return 0;
  return o_r - o0 == 1 && o_c - o0 != 1;
}

/* Body e over (b, r, c) packed row-major [sizes], or the pack made
 * before of the same body (lc->gemm_packs). */
static const tcc_vx *pack_once(tcc_lower_ctx *lc, const tcc_vx *e, const int64_t *sizes, tcc_dtype dt) {
  const int n = (int)(sizeof lc->gemm_packs / sizeof lc->gemm_packs[0]);
  for (int i = 0; i < lc->ngemm_packs && i < n; i++) {
    const struct tcc_gemm_pack *g = &lc->gemm_packs[i];
    if (g->body == e && g->dt == dt && !memcmp(g->sizes, sizes, sizeof g->sizes)) return g->packed;
  }
  const tcc_vx *packed = tcc_lower_materialize(lc, e, 3, sizes, dt);
  if (packed && e) {      /* the last n packs are kept */
    struct tcc_gemm_pack *g = &lc->gemm_packs[lc->ngemm_packs++ % n];
    *g = (struct tcc_gemm_pack){.body = e, .dt = dt, .packed = packed};
    memcpy(g->sizes, sizes, sizeof g->sizes);
  }
  return packed;
}

/* The operand e over (b, r, c), extents B x R x C, packed where BLAS
 * cannot read it as it is: row-major, or transposed (packs_transposed). */
static const tcc_vx *gemm_operand(tcc_lower_ctx *lc, const tcc_vx *e, int64_t B, int64_t R, int64_t C,
                                  tcc_dtype dt) {
  tcc_program *p = lc->prog;
  if (!packs_transposed(p, e, R, C)) {
    int64_t sizes[3] = {B, R, C};
    return pack_once(lc, e, sizes, dt);
  }
  const tcc_ix *sw[3] = {tcc_ix_var(p, 0), tcc_ix_var(p, 2), tcc_ix_var(p, 1)};
  int64_t sizes[3] = {B, C, R};
  const tcc_vx *t = pack_once(lc, tcc_vx_subst(p, e, 3, sw), sizes, dt);
  return t ? tcc_vx_subst(p, t, 3, sw) : NULL;
}

/* Is the GEMM operand e over (b, k, n) a buffer stored [n, k] (k's
 * stride 1, n's at least K): nn.Linear's weight? */
static int stored_n_by_k(const tcc_program *p, const tcc_vx *e, int64_t K, int64_t N) {
  if (!e || e->op != TCC_PRIM_LOAD || K < 2 || N < 2) return 0;
  int64_t coef[3], c0;
  return p->bufs[e->buf].layout.dtype == e->dtype && tcc_gemm_operand_affine(p, e, coef, &c0) &&
         coef[1] == 1 && coef[2] >= K;
}

/* Few rows (FEW_ROWS_MAX) times nn.Linear's weight, float32 on the CPU's
 * oneDNN road: dnnl_sgemm runs C = A . W^T 1.6-2.5x slower than C^T =
 * W . A^T (an AVX-512 Xeon, 2 threads: 32 x 2048 x 8192 in 10.5 ms
 * against 4.3; 9 x 768 x 3072 in 519 us against 352; torch's MKL 7.0 ms
 * and 571 us), so the step computes C^T and C is read through it. Fewer
 * rows on AVX2 and AVX-512 stream the weight's rows in a kernel of their
 * own instead (tcc_cpu_gemm_stream_rows), faster than either, and so do
 * 13-64 rows on AVX-512 (tcc_cpu_gemm_narrow), writing C itself. */
#define FEW_ROWS_MAX 32

static const tcc_vx *gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *bb, int64_t B,
                          int64_t M, int64_t N, int64_t K, tcc_dtype dt);

static int transposed_product(const tcc_lower_ctx *lc, const tcc_vx *bb, int64_t M, int64_t N,
                              int64_t K, tcc_dtype dt) {
  return lc->g->target.device == TCC__V1__DEVICE_TYPE__CPU && dt == TCC__V1__DTYPE__FLOAT32 &&
         tcc_onednn_enabled() && !lc->g->nsyms && M > tcc_cpu_gemm_stream_rows(lc->g->target.isa) &&
         !tcc_cpu_gemm_narrow(lc->g->target.isa, M, N, K) &&
         M >= 2 && M <= FEW_ROWS_MAX && N >= 4 * M &&
         bb->dtype == dt && stored_n_by_k(lc->prog, bb, K, N);
}

/* Does the CPU stream B's rows for this GEMM (cpu/schedule.c,
 * plan_stream_rows): float32, one batch, few rows, B nn.Linear's weight?
 * Its A must then be read along k in rows. */
static int streams_rows(const tcc_lower_ctx *lc, const tcc_vx *bb, int64_t B, int64_t M, int64_t N, int64_t K,
                        tcc_dtype dt) {
  return lc->g->target.device == TCC__V1__DEVICE_TYPE__CPU && dt == TCC__V1__DTYPE__FLOAT32 && !lc->g->nsyms &&
         B == 1 && M >= 2 && M <= tcc_cpu_gemm_stream_rows(lc->g->target.isa) && K >= 8 && bb &&
         bb->dtype == dt && stored_n_by_k(lc->prog, bb, K, N);
}

/* Is operand e over (b, m, k) one load of rows along k (k's stride 1)? */
static int rows_along_k(const tcc_program *p, const tcc_vx *e, int64_t K) {
  int64_t coef[3], c0;
  return e && e->op == TCC_PRIM_LOAD && p->bufs[e->buf].layout.dtype == e->dtype &&
         tcc_gemm_operand_affine(p, e, coef, &c0) && coef[2] == 1 && coef[1] >= K;
}

/* Adds the GEMM C[b, m, n] = A[b, m, :] . B[b, :, n] as an EXTERN kernel;
 * a and bb are bodies over (b, m, k) and (b, k, n). Returns a load of C
 * over (b, m, n) (of C^T's buffer, for transposed_product), or NULL when
 * out of memory. */
static const tcc_vx *gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *bb, int64_t B,
                          int64_t M, int64_t N, int64_t K, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  if (a && bb && transposed_product(lc, bb, M, N, K, dt)) {
    const tcc_ix *sw[3] = {tcc_ix_var(p, 0), tcc_ix_var(p, 2), tcc_ix_var(p, 1)};
    /* C^T[b, n, m] = B^T[b, n, :] . A^T[b, :, m] */
    const tcc_vx *ct = gemm(lc, tcc_vx_subst(p, bb, 3, sw), tcc_vx_subst(p, a, 3, sw), B, N, M, K, dt);
    return ct ? tcc_vx_subst(p, ct, 3, sw) : NULL;
  }
  int64_t cs[3] = {B, M, N};
  /* CUDA: float16/bfloat16 operands stay half (cuBLAS reads them and
   * accumulates in float32 into a float32 C); CPU computes in float32. */
  int cuda = lc->g->target.device == TCC__V1__DEVICE_TYPE__CUDA;
  tcc_dtype od = dt;
  if (cuda && a && bb && a->dtype == bb->dtype && dt == TCC__V1__DTYPE__FLOAT32 &&
      (a->dtype == TCC__V1__DTYPE__FLOAT16 || a->dtype == TCC__V1__DTYPE__BFLOAT16))
    od = a->dtype;
  a = tcc_vx_cast(p, a, od);
  bb = tcc_vx_cast(p, bb, od);
  const int streams = streams_rows(lc, bb, B, M, N, K, dt);
  if (streams && !rows_along_k(p, a, K)) {
    int64_t sizes[3] = {B, M, K};
    a = pack_once(lc, a, sizes, od);
  } else if (!blas_operand_ok(p, a, M, K) || (cuda && !cuda_batch_affine(p, a))) {
    a = gemm_operand(lc, a, B, M, K, od);
  }
  if (!blas_operand_ok(p, bb, K, N) || (cuda && !cuda_batch_affine(p, bb))) bb = gemm_operand(lc, bb, B, K, N, od);
  int id = tcc_lower_temp(lc, 3, cs, dt);
  const tcc_ix *idx[3];
  if (id < 0 || tcc_lower_identity_index(p, 3, idx)) return NULL;
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
    return tcc_lower_body_at(lc, v, in);
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
  return tcc_lower_body_at(lc, v, in);
}

int tcc_lower_matmul(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  const tcc_meta *m = tcc_lower_out_meta(lc, n, 0);
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
    if (tcc_lower_reshape_index(p, A->sizes, a_rank, flat, 2, o, in)) return OOM();
    a = tcc_lower_body_at(lc, av, in);
    if (b_rank == 2) {
      b = as_operand(lc, bv, NULL, 0, 1, 0);
    } else {
      const tcc_ix *w[1] = {tcc_ix_var(p, 1)};
      b = tcc_lower_body_at(lc, bv, w);
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
  if (tcc_lower_identity_index(p, m->rank, out)) return OOM();
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
    if (af != 1.0) y = BIN(MUL, y, tcc_lower_cst(p, gd, af));
    if (bf != 0.0) {
      const tcc_vx *bias = tcc_lower_opnd(lc, n, &n->args[0], gd);
      if (bf != 1.0) bias = BIN(MUL, bias, tcc_lower_cst(p, gd, bf));
      y = BIN(ADD, bias, y);
    }
  } else if (id == TCC_OP_LINEAR && ARG("bias")->kind == TCC_ARG_TENSOR) {
    y = BIN(ADD, y, tcc_lower_opnd(lc, n, ARG("bias"), gd));
  }
  return tcc_lower_result(lc, n, 0, y, err);
}
/* gemm() for extern lowerings in other files (conv.c). */
const tcc_vx *tcc_lower_gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *b, int64_t batch,
                             int64_t M, int64_t N, int64_t K, tcc_dtype dt) {
  return gemm(lc, a, b, batch, M, N, K, dt);
}
