/*
 * schedule.c — the CPU target's schedule pass: every decision about how
 * a kernel runs, made once per program and kept in p->sched.cpu
 * (cpu_schedule.h) for the emitter.
 *
 * Loop nests. A kernel whose accesses are all affine, with no reduction
 * and no index value, is planned into flat loops (plan_loops): dims of
 * size 1 vanish, loops follow the first store's strides (largest
 * outermost; a tuning config may order by the first load's), and
 * neighbouring loops merge when every access strides through them as one
 * (coef[outer] == coef[inner] * size[inner]), so contiguous tensors run
 * as one flat unit-stride loop the C compiler vectorizes. Any other
 * kernel runs one loop per dim -- in the first store's stride order when
 * its reductions are all per element (order_dims), else i0 outermost.
 *
 * Levels. Every value is computed in the outermost loop where all its
 * variables are bound (loop-invariant code motion, level_of): a row
 * statistic (REDUCE over bound variables) is computed once per row.
 *
 * Sibling reductions. Kernel-level reductions of one level and the same
 * extents whose inputs are ready together share one reduction loop (var
 * and mean of a row; group_reductions, in the order they are computed).
 *
 * Column values. In a planned nest, a costly value (a division, square
 * root or transcendental function) that varies along the element loop
 * alone -- a batch norm's 1 / sqrt(var + eps) when channels-last
 * activations run the channel innermost -- is computed once per call
 * into an array over that loop before the loops, and loaded from it
 * (plan_column_values): ResNet-50's epilogues did a square root and a
 * division per element.
 *
 * Next-row prefetch. In a row kernel (softmax, layer norm) the first
 * reduction over a row reads it from memory and the later passes from
 * cache, so memory idles while they compute; the second reduction's loop
 * touches the next row's cache lines of the first's loads, a block at a
 * time, with __builtin_prefetch (plan_row_prefetch); the last pass
 * before the element loop touches, for writing, the current row's lines
 * of the stores the element loop is first to write (plan_store_prefetch).
 *
 * Inline exps. A kernel whose float32 exp takes an argument holding a
 * constant below -87 (a mask's -inf), or any float32 exp on x86-64-v4,
 * prints the prelude's inline tcc_expf instead of libmvec's
 * (plan_inline_exp); one whose argument is x - max(x), a softmax's,
 * is <= 0 and drops the upper range check (plan_exp_le0).
 *
 * Parallelism and vectors. The outermost loop of size > 1 runs `omp
 * parallel for` when the kernel's work passes TCC_PARALLEL_WORK (dynamic
 * programs: an if() on the work at run time); the element loop (the
 * innermost) runs `omp simd` when its iterations store distinct elements
 * and it holds no reduction loop; a tuning config (tcc_kernel_config:
 * parallel, threads, chunk, unroll, vec, order) replaces the matching
 * choice.
 *
 * A static program with any kernel on OpenMP threads (a parallel loop,
 * a oneDNN step, GEMMs in batches or slabs) is `threaded`: its tcc_entry
 * runs the thread governor (cpu/prelude.c), which picks, call by call,
 * all threads or the calling thread alone by measured call times, so a
 * core taken by another process does not turn every barrier into a wait
 * for a time slice.
 *
 * Column sums. A kernel whose element loop computes sums over rows
 * that its summands read at a stride, while reading unit-stride along the
 * element loop's dim (the bias and layer-norm gradients of a training
 * step: [rows, columns] summed over rows), runs the element loop in
 * blocks of up to TCC_CPU_COL_BLOCK columns: the reduction loops go outside a
 * SIMD loop over the block, into an array of sums per block, so each row
 * is read as contiguous vectors instead of one gathered element per lane
 * (plan_column_sums).
 *
 * Merged reduction loops. A reduction whose innermost loop is short (a
 * batch norm's statistics over 4x4 maps) and whose loads read its two
 * innermost variables as one contiguous run runs them as one loop
 * (plan_merged_reductions), long enough to vectorize.
 *
 * Windows. Reductions in the element loop of at most TCC_CPU_WINDOW
 * steps each (pooling windows, max-pool's backward) unroll, and the
 * element loop runs `omp simd` around them.
 *
 * Border peeling. A kernel whose element loop reads through clamped
 * indices (the zero padding of a convolution's im2col pack) and holds no
 * reduction runs that loop in three ranges, the middle one without the
 * clamps, so its loads are contiguous instead of gathers (find_peels).
 * Only unplanned (dim-order) nests: a planned nest's accesses are affine.
 *
 * Range split. A kernel without reductions that compares a loop's var
 * with constants (a concatenation: element i1 of cat([x, y, z], 1) is
 * i1 < 128 ? x[..] : i1 < 160 ? y[..] : z[..], every input read through
 * a clamp that keeps the unchosen reads in bounds) runs that loop as one
 * loop per range between the constants, in which each comparison is a
 * constant (plan_range_split; cpu/emit.c prints each range with the
 * chosen operands alone and the clamps dropped). Selecting among all
 * inputs made every element of a DenseNet block's concatenation load all
 * of them: a 13-input one ran at a tenth of the memory's speed.
 *
 * GEMM steps: the library road and its threading (plan_gemm); few rows
 * against nn.Linear's weight stream its rows instead (plan_stream_rows),
 * up to 32 rows against a weight stored [K, N] split K among the
 * threads (plan_split_k, plan_split_k_tiled), and 13-64 rows against
 * nn.Linear's weight, or many rows against 13-64 columns, stream the
 * wide operand's rows against the narrow one packed (plan_narrow).
 */
#include "cpu_schedule.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The state of planning one kernel. */
typedef struct planner {
  const tcc_program *p;
  const tcc_kernel *k;
  tcc_cpu_kernel_schedule *ks;
  tcc_cpu_access *acc;       /* TCC_CPU_MAX_ACCESS entries */
  int nacc;
  int overflow;              /* too many distinct accesses: unplanned */
  int loop_order;            /* the kernel config's loop order (plan_loops) */
  tcc_cpu_fv fv;
} planner;

/* ------------------------------------------------- sibling reductions */

static int same_extent(const tcc_vx *a, const tcc_vx *b) {
  if (a->nidx != b->nidx) return 0;
  for (int r = 0; r < a->nidx; r++)
    if (a->idx[r] != b->idx[r]) return 0;
  return 1;
}

/* Does e need a reduction that is not computed yet (a REDUCE outside the
 * groups already closed, `done`)? Walks operands only, as the value's
 * expression does. */
static int needs_pending_reduce(const tcc_vx *e, const tcc_ptrmap *done, tcc_ptrmap *seen) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_REDUCE) return !tcc_ptrmap_get(done, e);
  return (e->a && needs_pending_reduce(e->a, done, seen)) || (e->b && needs_pending_reduce(e->b, done, seen)) ||
         (e->c && needs_pending_reduce(e->c, done, seen));
}

/* Groups the kernel-level reductions (ks->red_lead), in the order they
 * are computed: level by level, nodes in order. The first reduction not
 * yet grouped leads a group and takes every later one of its level with
 * the same extents whose input needs no reduction still pending (its own
 * group's included); argmax and argmin stay alone. */
static int group_reductions(const tcc_program *p, tcc_cpu_kernel_schedule *ks, int nlevels) {
  int nn = ks->nnodes;
  ks->red_lead = tcc_arena_array(p->arena, (size_t)nn + 1, sizeof *ks->red_lead);
  if (!ks->red_lead) return -1;
  for (int i = 0; i < nn; i++) ks->red_lead[i] = -1;
  tcc_ptrmap done;
  if (tcc_ptrmap_init(&done, 64)) return -1;
  int rc = 0;
  for (int lv = 0; lv <= nlevels && !rc; lv++)
    for (int i = 0; i < nn && !rc; i++) {
      const tcc_vx *e = ks->nodes[i];
      if (e->op != TCC_PRIM_REDUCE || ks->levels[i] != lv || ks->red_lead[i] >= 0) continue;
      ks->red_lead[i] = i;
      int ng = 1;
      int alone = e->i == TCC_RED_ARGMAX || e->i == TCC_RED_ARGMIN;
      for (int j = 0; j < nn && !alone && ng < TCC_CPU_MAX_GROUP; j++) {
        const tcc_vx *q = ks->nodes[j];
        if (j == i || q->op != TCC_PRIM_REDUCE || ks->levels[j] != lv || ks->red_lead[j] >= 0 ||
            !same_extent(q, e) || q->i == TCC_RED_ARGMAX || q->i == TCC_RED_ARGMIN)
          continue;
        tcc_ptrmap seen;
        if (tcc_ptrmap_init(&seen, 64)) {
          rc = -1;
          break;
        }
        int blocked = needs_pending_reduce(q->a, &done, &seen);
        tcc_ptrmap_free(&seen);
        if (!blocked) ks->red_lead[j] = i, ng++;
      }
      for (int j = 0; j < nn && !rc; j++)
        if (ks->red_lead[j] == i && tcc_ptrmap_put(&done, ks->nodes[j], ks->nodes[j])) rc = -1;
    }
  tcc_ptrmap_free(&done);
  return rc;
}

/* ----------------------------------------------------- masked exps */

static const char holds_yes, holds_no;

/* Does e hold a float constant below -87, where exp underflows (a mask's
 * -inf, torch.finfo(float32).min)? Memoized in seen. */
static int holds_huge_negative(const tcc_vx *e, tcc_ptrmap *seen) {
  const void *m = tcc_ptrmap_get(seen, e);
  if (m) return m == &holds_yes;
  int r = e->op == TCC_PRIM_CONST && (e->dtype == TCC__V1__DTYPE__FLOAT32 || e->dtype == TCC__V1__DTYPE__FLOAT64) &&
          e->f < -87.0;
  r = r || (e->a && holds_huge_negative(e->a, seen)) || (e->b && holds_huge_negative(e->b, seen)) ||
      (e->c && holds_huge_negative(e->c, seen));
  tcc_ptrmap_put(seen, e, r ? &holds_yes : &holds_no);
  return r;
}

/* Does a float32 exp in e take such an argument (masked), or any (!masked)? */
static int float32_exp(const tcc_vx *e, int masked, tcc_ptrmap *visited, tcc_ptrmap *seen) {
  if (tcc_ptrmap_get(visited, e)) return 0;
  tcc_ptrmap_put(visited, e, e);
  if (e->op == TCC_PRIM_EXP && e->dtype == TCC__V1__DTYPE__FLOAT32 && (!masked || holds_huge_negative(e->a, seen)))
    return 1;
  return (e->a && float32_exp(e->a, masked, visited, seen)) || (e->b && float32_exp(e->b, masked, visited, seen)) ||
         (e->c && float32_exp(e->c, masked, visited, seen));
}

/* Whether kernel k's float32 exps print the prelude's inline tcc_expf
 * (TCC_CPU_EXP_MASKED, TCC_CPU_EXP_ALL) or libmvec's expf (0). glibc's
 * vector expf leaves its fast path for all lanes when one argument is
 * below about -87.3, as masked attention scores are (-inf, or finfo.min
 * added): such kernels use tcc_expf_ftz (0 below FLT_MIN) on every
 * target. On x86-64-v4 every other float32 exp prints tcc_expf
 * (subnormals rounded), whose polynomial runs in fused multiply-adds:
 * on an AMD EPYC with AVX-512 (Zen 4) faster than libmvec's
 * _ZGVeN16v_expf (docs/design.md); built for AVX2 on that CPU the
 * inline exp was slower than libmvec's, so x86-64-v3 keeps libmvec. */
static int plan_inline_exp(const tcc_program *p, const tcc_kernel *k, int *out) {
  tcc_ptrmap visited = {0}, seen = {0};
  const char *isa = p->graph->target.isa;
  const int all = isa && strcmp(isa, "x86-64-v4") == 0;
  *out = 0;
  int rc = tcc_ptrmap_init(&visited, 64) || tcc_ptrmap_init(&seen, 64) ? -1 : 0;
  for (int st = 0; st < k->nstores && !*out && !rc; st++)
    if (float32_exp(k->stores[st].value, 1, &visited, &seen)) *out = TCC_CPU_EXP_MASKED;
  if (all && !*out && !rc) { /* a second walk: the first marked every node visited */
    tcc_ptrmap_free(&visited);
    visited = (tcc_ptrmap){0};
    rc = tcc_ptrmap_init(&visited, 64) ? -1 : 0;
    for (int st = 0; st < k->nstores && !*out && !rc; st++)
      if (float32_exp(k->stores[st].value, 0, &visited, &seen)) *out = TCC_CPU_EXP_ALL;
  }
  tcc_ptrmap_free(&visited);
  tcc_ptrmap_free(&seen);
  return rc;
}

/* Every REDUCE node and every float32 EXP node of e, inside reductions
 * too; 1 when either list is full. */
static int gather_exps(const tcc_vx *e, tcc_ptrmap *seen, const tcc_vx **reds, int *nred,
                       const tcc_vx **exps, int *nexp, int cap) {
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_REDUCE) {
    if (*nred == cap) return 1;
    reds[(*nred)++] = e;
  }
  if (e->op == TCC_PRIM_EXP && e->dtype == TCC__V1__DTYPE__FLOAT32) {
    if (*nexp == cap) return 1;
    exps[(*nexp)++] = e;
  }
  return (e->a && gather_exps(e->a, seen, reds, nred, exps, nexp, cap)) ||
         (e->b && gather_exps(e->b, seen, reds, nred, exps, nexp, cap)) ||
         (e->c && gather_exps(e->c, seen, reds, nred, exps, nexp, cap));
}

/* The values variable v takes in kernel k: [0, extent) of a kernel dim,
 * or of the bound variable of one of the REDUCEs `reds`; -1: unknown. */
static int64_t var_extent(const tcc_kernel *k, const tcc_vx *const *reds, int nred, int v) {
  if (v < k->rank) return k->sizes[v];
  int64_t ext = -1;
  for (int r = 0; r < nred; r++) {
    const tcc_vx *R = reds[r];
    if (v < R->buf || v >= R->buf + R->nidx) continue;
    int64_t x = R->idx[v - R->buf]->c;
    if (ext >= 0 && ext != x) return -1;
    ext = x;
  }
  return ext;
}

/* Is exp node e's argument x - max(x): a - R, R a one-variable MAX and a
 * R's body at one of the values it folds (its bound variable read as a
 * variable over the same extent)? Then a <= R, and a - R rounds to <= 0,
 * or is NaN (a NaN, or inf - inf). */
static int exp_of_minus_max(const tcc_program *p, const tcc_kernel *k, const tcc_vx *e,
                            const tcc_vx *const *reds, int nred, int *out) {
  *out = 0;
  const tcc_vx *d = e->a, *R = d->b;
  if (d->op != TCC_PRIM_SUB || R->op != TCC_PRIM_REDUCE || R->i != TCC_RED_MAX || R->nidx != 1 ||
      R->dtype != TCC__V1__DTYPE__FLOAT32)
    return 0;
  int nv = R->buf + 1;
  const tcc_ix **sub = tcc_arena_array(p->arena, (size_t)nv, sizeof *sub);
  if (!sub) return -1;
  for (int v = 0; v < nv; v++) sub[v] = tcc_ix_var((tcc_program *)p, v);
  /* candidates: the kernel's dims, then the REDUCEs' bound variables */
  for (int c = 0; c < k->rank + nred && !*out; c++) {
    int u = c < k->rank ? c : reds[c - k->rank]->buf;
    if (c >= k->rank && reds[c - k->rank]->nidx != 1) continue;
    if (var_extent(k, reds, nred, u) != R->idx[0]->c) continue;
    sub[R->buf] = tcc_ix_var((tcc_program *)p, u);
    const tcc_vx *at = tcc_vx_subst((tcc_program *)p, R->a, nv, sub);
    if (!at) return -1;
    *out = at == d->a;
  }
  return 0;
}

/* The float32 exps of kernel k (whose exps print inline) that take x -
 * max(x): they print tcc_expf_le0 (prelude.c), without the clamp and the
 * select for an argument above 88.7; a masked softmax of [8, 8, 256,
 * 256] scores ran 1.23x faster, softmax and log-softmax of [1024, 4096]
 * 1.10x and 1.2x (Zen 4). */
static int plan_exp_le0(const tcc_program *p, const tcc_kernel *k, tcc_cpu_kernel_schedule *ks) {
  ks->nexp_le0 = 0;
  if (!ks->inline_exp) return 0;
  enum { CAP = 64 };
  const tcc_vx *reds[CAP], *exps[CAP];
  int nred = 0, nexp = 0, full = 0;
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) return -1;
  for (int st = 0; st < k->nstores && !full; st++)
    full = gather_exps(k->stores[st].value, &seen, reds, &nred, exps, &nexp, CAP);
  tcc_ptrmap_free(&seen);
  if (full) return 0;    /* an unknown extent could pass for a known one */
  for (int i = 0; i < nexp && ks->nexp_le0 < TCC_CPU_EXP_LE0; i++) {
    int le0;
    if (exp_of_minus_max(p, k, exps[i], reds, nred, &le0)) return -1;
    if (le0) ks->exp_le0[ks->nexp_le0++] = exps[i];
  }
  return 0;
}

/* ------------------------------------------------- kept summands */

static int level_of(planner *ke, const tcc_varset *s);

/* Is `want` reachable from e outside REDUCE bodies? Memoized in seen. */
static int holds_node(const tcc_vx *e, const tcc_vx *want, tcc_ptrmap *seen) {
  if (e == want) return 1;
  if (e->op == TCC_PRIM_REDUCE || tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  return (e->a && holds_node(e->a, want, seen)) || (e->b && holds_node(e->b, want, seen)) ||
         (e->c && holds_node(e->c, want, seen));
}

/* Does index e read a tensor value (TCC_IX_VALUE)? */
static int ix_reads_value(const tcc_ix *e) {
  if (!e) return 0;
  return e->kind == TCC_IX_VALUE || ix_reads_value(e->a) || ix_reads_value(e->b);
}

/* The kernel-level REDUCE nodes of e (not those inside other reductions). */
static int find_reductions(const tcc_vx *e, tcc_ptrmap *seen, const tcc_vx **out, int *n, int cap) {
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_REDUCE) {
    if (*n < cap) out[(*n)++] = e;
    return 0;
  }
  return (e->a && find_reductions(e->a, seen, out, n, cap)) || (e->b && find_reductions(e->b, seen, out, n, cap)) ||
         (e->c && find_reductions(e->c, seen, out, n, cap));
}

/* The kernel-level reductions of the one store of a float32 or float64
 * row (a dim-order nest of a static program, the store's index reading
 * no tensor values), at most cap of them: their count, 0 when the kernel
 * is no such row, -1 when out of memory. */
static int row_reductions(planner *ke, const tcc_vx **reds, int cap) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  const tcc_cpu_nest *pl = &ke->ks->nest;
  if (k->nstores != 1 || pl->affine || pl->permuted || pl->nloops < 1 || p->graph->nsyms) return 0;
  const tcc_store *st = &k->stores[0];
  tcc_dtype dt = p->bufs[st->buf].layout.dtype;
  if (dt != TCC__V1__DTYPE__FLOAT32 && dt != TCC__V1__DTYPE__FLOAT64) return 0;
  for (int d = 0; d < p->bufs[st->buf].layout.rank; d++)
    if (ix_reads_value(st->idx[d])) return 0;
  int n = 0;
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) return -1;
  find_reductions(st->value, &seen, reds, &n, cap);
  tcc_ptrmap_free(&seen);
  return n;
}

/* Softmax computes exp(x - max) twice, in the sum's loop and for the
 * output. When the one store's value holds, as a node of its own, the
 * summand of a one-variable SUM over the element loop's dim (that summand
 * with the bound variable read as the element loop's variable), of the
 * store's dtype, the sum's loop can write each summand where the element
 * loop will store, and the element loop load it back: one exp per element
 * instead of two. Only for dim-order nests of static programs (every
 * kernel dim a loop, the element loop's dim last), with the reduction
 * computed just outside the element loop. */
static int plan_kept_summand(planner *ke) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  ks->kept_red = ks->kept_node = NULL;
  ks->kept_idx = NULL;
  const tcc_vx *reds[16];
  int nred = row_reductions(ke, reds, 16);
  if (nred <= 0) return nred;
  const tcc_store *st = &k->stores[0];
  tcc_dtype dt = p->bufs[st->buf].layout.dtype;
  int de = pl->dims[pl->nloops - 1][0];   /* the element loop's kernel dim */
  tcc_ptrmap seen;
  for (int r = 0; r < nred; r++) {
    const tcc_vx *R = reds[r];
    if (R->i != TCC_RED_SUM || R->nidx != 1 || R->idx[0]->c != pl->size[pl->nloops - 1] ||
        R->a->dtype != dt || (tcc_vx_kernel_vars(R) >> de & 1))
      continue;
    /* computed inside every loop but the element loop, so the store's
     * other index variables are bound there */
    const tcc_varset *fv = tcc_cpu_fv_vx(&ke->fv, R);
    if (!fv) return -1;
    if (level_of(ke, fv) != pl->nloops - 1) continue;
    /* the summand at i<de>: substitute the bound variable */
    int nv = R->buf + 1;
    const tcc_ix **sub = tcc_arena_array(p->arena, (size_t)nv, sizeof *sub);
    if (!sub) return -1;
    for (int v = 0; v < nv; v++) sub[v] = tcc_ix_var((tcc_program *)p, v);
    sub[R->buf] = tcc_ix_var((tcc_program *)p, de);
    const tcc_vx *S = tcc_vx_subst((tcc_program *)p, R->a, nv, sub);
    if (!S) return -1;
    if (S == st->value || S->op == TCC_PRIM_LOAD || S->op == TCC_PRIM_CONST) continue;
    if (tcc_ptrmap_init(&seen, 64)) return -1;
    int held = holds_node(st->value, S, &seen);
    tcc_ptrmap_free(&seen);
    if (!held) continue;
    /* the store's index with i<de> read as the bound variable */
    const tcc_meta *m = &p->bufs[st->buf].layout;
    const tcc_ix **idx = tcc_arena_array(p->arena, (size_t)m->rank + 1, sizeof *idx);
    const tcc_ix **back = tcc_arena_array(p->arena, (size_t)de + 1, sizeof *back);
    if (!idx || !back) return -1;
    for (int v = 0; v <= de; v++) back[v] = tcc_ix_var((tcc_program *)p, v);
    back[de] = tcc_ix_var((tcc_program *)p, R->buf);
    for (int d = 0; d < m->rank; d++)
      if (!(idx[d] = tcc_ix_subst((tcc_program *)p, st->idx[d], de + 1, back))) return -1;
    ks->kept_red = R;
    ks->kept_node = S;
    ks->kept_idx = idx;
    return 0;
  }
  return 0;
}

/* Does e read (outside REDUCE bodies) a load of elements narrower than
 * `size` bytes? Memoized in seen. */
static int reads_narrower(const tcc_vx *e, int size, tcc_ptrmap *seen) {
  if (e->op == TCC_PRIM_REDUCE || e->op == TCC_PRIM_CONST || tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_LOAD && (int)tcc_dtype_size(e->dtype) < size) return 1;
  return (e->a && reads_narrower(e->a, size, seen)) || (e->b && reads_narrower(e->b, size, seen)) ||
         (e->c && reads_narrower(e->c, size, seen));
}

/* e with bound variable `from` read as variable `to`. */
static const tcc_vx *rename_var(const tcc_program *p, const tcc_vx *e, int from, int to) {
  int nv = (from > to ? from : to) + 1;
  const tcc_ix **sub = tcc_arena_array(p->arena, (size_t)nv, sizeof *sub);
  if (!sub) return NULL;
  for (int v = 0; v < nv; v++) sub[v] = tcc_ix_var((tcc_program *)p, v);
  sub[from] = tcc_ix_var((tcc_program *)p, to);
  return tcc_vx_subst((tcc_program *)p, e, nv, sub);
}

/* The store's index with the element loop's variable `de` read as `v`. */
static const tcc_ix *const *store_index_at(const tcc_program *p, const tcc_store *st, int de, int v) {
  const tcc_meta *m = &p->bufs[st->buf].layout;
  const tcc_ix **idx = tcc_arena_array(p->arena, (size_t)m->rank + 1, sizeof *idx);
  int nv = (de > v ? de : v) + 1;
  const tcc_ix **back = tcc_arena_array(p->arena, (size_t)nv, sizeof *back);
  if (!idx || !back) return NULL;
  for (int u = 0; u < nv; u++) back[u] = tcc_ix_var((tcc_program *)p, u);
  back[de] = tcc_ix_var((tcc_program *)p, v);
  for (int d = 0; d < m->rank; d++)
    if (!(idx[d] = tcc_ix_subst((tcc_program *)p, st->idx[d], nv, back))) return NULL;
  return idx;
}

/* Masked attention scores, softmax(where(mask, x * s, -inf)), compute
 * their argument where(mask, x * s, -inf) in the max's loop and again in
 * the sum's. With a one-byte mask and float scores in one loop, gcc
 * vectorizes it 64 lanes wide and the max's compare and select become
 * chains of mask-register shifts and merges (70 instructions a 64-element
 * step). So when a kernel's store row has two one-variable reductions
 * over the element loop's extent, the second's argument reading the
 * first's result and holding the first's whole argument A, and A (of the
 * store's float dtype) reads elements narrower than that dtype, a loop
 * before the first reduction's stores A where the element loop will
 * store, and both reductions (and the element loop, unless a kept
 * summand has overwritten A there) load it back: three float-only loops
 * after a select-and-store loop. Same nests as plan_kept_summand. */
static int plan_staged_row(planner *ke) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  ks->staged_red = ks->staged_red_node = ks->staged_node = ks->staged_next_node = NULL;
  ks->staged_idx = ks->staged_next_idx = NULL;
  const tcc_vx *reds[16];
  int nred = row_reductions(ke, reds, 16);
  if (nred <= 0) return nred;
  const tcc_store *st = &k->stores[0];
  tcc_dtype dt = p->bufs[st->buf].layout.dtype;
  int de = pl->dims[pl->nloops - 1][0];
  tcc_ptrmap seen;
  if (nred != 2) return 0;
  for (int r = 0; r < 2; r++) {
    const tcc_vx *R = reds[r];
    if (R->nidx != 1 || R->idx[0]->c != pl->size[pl->nloops - 1] || (tcc_vx_kernel_vars(R) >> de & 1))
      return 0;
    const tcc_varset *fv = tcc_cpu_fv_vx(&ke->fv, R);
    if (!fv) return -1;
    if (level_of(ke, fv) != pl->nloops - 1) return 0;
  }
  for (int r = 0; r < 2; r++) {
    const tcc_vx *R1 = reds[r], *R2 = reds[1 - r];
    const tcc_vx *A1 = R1->a;
    if (A1->dtype != dt || A1->op == TCC_PRIM_LOAD || A1->op == TCC_PRIM_CONST) continue;
    if (tcc_ptrmap_init(&seen, 64)) return -1;
    int after = holds_node(R2->a, R1, &seen);       /* R2's argument reads R1's result */
    tcc_ptrmap_free(&seen);
    if (!after) continue;
    if (tcc_ptrmap_init(&seen, 64)) return -1;
    int narrow = reads_narrower(A1, (int)tcc_dtype_size(dt), &seen);
    tcc_ptrmap_free(&seen);
    if (!narrow) continue;
    const tcc_vx *A2 = rename_var(p, A1, R1->buf, R2->buf), *A = rename_var(p, A1, R1->buf, de);
    if (!A2 || !A) return -1;
    if (tcc_ptrmap_init(&seen, 64)) return -1;
    int held = holds_node(R2->a, A2, &seen);
    tcc_ptrmap_free(&seen);
    if (!held || (ks->kept_red && ks->kept_red != R2)) continue;
    ks->staged_idx = store_index_at(p, st, de, R1->buf);
    ks->staged_next_idx = store_index_at(p, st, de, R2->buf);
    if (!ks->staged_idx || !ks->staged_next_idx) return -1;
    ks->staged_red = R1;
    ks->staged_red_node = A1;
    ks->staged_next_node = A2;
    ks->staged_node = ks->kept_red ? NULL : A;   /* a kept summand overwrites A */
    return 0;
  }
  return 0;
}

/* ------------------------------------------------------- loop nests */

/* Linear storage index of access a as affine form; 0 when not affine. */
static int access_affine(const tcc_program *p, const tcc_kernel *k, tcc_cpu_access *a) {
  const tcc_meta *m = &p->bufs[a->buf].layout;
  int64_t c;
  if (!tcc_linear_affine(m->rank, a->idx, m->strides, k->rank, a->coef, &c)) return 0;
  return !__builtin_add_overflow(c, m->offset, &a->c);
}

static void add_access(planner *ke, int buf, const tcc_ix *const *idx) {
  for (int i = 0; i < ke->nacc; i++)
    if (ke->acc[i].buf == buf && ke->acc[i].idx == idx) return;
  if (ke->nacc == TCC_CPU_MAX_ACCESS) {
    ke->overflow = 1;
    return;
  }
  ke->acc[ke->nacc].buf = buf;
  ke->acc[ke->nacc].idx = idx;
  ke->nacc++;
}

/* Gathers loads; *simple stays 1 while the kernel has no reduction, no
 * index value and no data-dependent index (what flat loops allow).
 * *red_vars: the kernel vars every REDUCE reads (AND over them). */
static int gather_loads(planner *ke, tcc_ptrmap *seen, const tcc_vx *e, int *simple,
                        uint32_t *red_vars) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD) add_access(ke, e->buf, e->idx);
  if (e->op == TCC_PRIM_REDUCE) *red_vars &= tcc_vx_kernel_vars(e);
  if (e->op == TCC_PRIM_REDUCE || e->op == TCC_PRIM_INDEX) *simple = 0;
  if (e->a && gather_loads(ke, seen, e->a, simple, red_vars)) return -1;
  if (e->b && gather_loads(ke, seen, e->b, simple, red_vars)) return -1;
  if (e->c && gather_loads(ke, seen, e->c, simple, red_vars)) return -1;
  return 0;
}

/* A dim-order nest (not planned) runs its dims in the order of the first
 * store's strides, largest outermost, when that store is affine and every
 * REDUCE reads all the kernel's dims (a window reduction per element: it
 * sits in the element loop whatever the order). A channels_last store
 * then runs C innermost, unit-stride, instead of W at stride C. Otherwise
 * (a per-channel statistic would move inward and be recomputed) dims run
 * in order, i0 outermost. */
static void order_dims(planner *ke, uint32_t red_vars, uint32_t need) {
  const tcc_kernel *k = ke->k;
  tcc_cpu_nest *pl = &ke->ks->nest;
  int order[TCC_MAX_DIMS];
  for (int d = 0; d < k->rank; d++) order[d] = d;
  tcc_cpu_access first = ke->acc[0];
  if (!ke->overflow && ke->nacc > 0 && (red_vars & need) == need &&
      access_affine(ke->p, k, &first)) {
    int64_t key[TCC_MAX_DIMS];     /* dims of size 1 outermost: they loop once */
    for (int d = 0; d < k->rank; d++) key[d] = k->sizes[d] == 1 ? INT64_MAX : llabs(first.coef[d]);
    for (int i = 1; i < k->rank; i++)
      for (int j = i; j > 0 && key[order[j]] > key[order[j - 1]]; j--) {
        int t = order[j];
        order[j] = order[j - 1];
        order[j - 1] = t;
      }
  }
  pl->nloops = k->rank;
  for (int j = 0; j < k->rank; j++) {
    pl->size[j] = k->sizes[order[j]];
    pl->dims[j][0] = order[j];
    pl->ndims[j] = 1;
    pl->pos[order[j]] = j;
    pl->permuted |= order[j] != j;
  }
}

/* Plans the loop nest of ke->k (see the file header). */
static int plan_loops(planner *ke) {
  const tcc_kernel *k = ke->k;
  tcc_cpu_nest *pl = &ke->ks->nest;
  memset(pl, 0, sizeof *pl);
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return -1;
  }
  int simple = 1;
  uint32_t red_vars = ~0u;
  for (int s = 0; s < k->nstores; s++) add_access(ke, k->stores[s].buf, k->stores[s].idx);
  int nstore_acc = ke->nacc;
  for (int s = 0; s < k->nstores; s++)
    if (gather_loads(ke, &seen, k->stores[s].value, &simple, &red_vars)) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
  tcc_ptrmap_free(&seen);
  /* every store must write a distinct element per iteration */
  uint32_t need = 0;
  for (int d = 0; d < k->rank; d++)
    if (k->sizes[d] != 1) need |= 1u << d;
  for (int s = 0; s < k->nstores && simple; s++) {
    uint32_t have = 0;
    const tcc_meta *m = &ke->p->bufs[k->stores[s].buf].layout;
    for (int d = 0; d < m->rank; d++) have |= tcc_ix_kernel_vars(k->stores[s].idx[d]);
    simple = (have & need) == need;
  }
  pl->affine = !ke->overflow && simple;
  for (int i = 0; i < ke->nacc && pl->affine; i++)
    pl->affine = access_affine(ke->p, k, &ke->acc[i]);
  if (!pl->affine) {                           /* one loop per dim, no merging */
    order_dims(ke, red_vars, need);
    return 0;
  }
  /* Dims of size 1 vanish; order by the first store's |coef|, largest
   * outermost, stable (a tuning config may order by the first load's:
   * accesses are the distinct stores first, then the loads). */
  int order[TCC_MAX_DIMS], n = 0;
  for (int d = 0; d < k->rank; d++)
    if (k->sizes[d] != 1) order[n++] = d;
  const int64_t *key = ke->acc[0].coef;        /* acc[0] is the first store */
  if (ke->loop_order == 1 && nstore_acc < ke->nacc) key = ke->acc[nstore_acc].coef;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && llabs(key[order[j]]) > llabs(key[order[j - 1]]); j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (pl->nloops > 0) {
      int j = pl->nloops - 1;
      int inner = pl->dims[j][pl->ndims[j] - 1];  /* last merged = innermost */
      int ok = 1;
      for (int a = 0; a < ke->nacc && ok; a++) {
        int64_t want;
        ok = !__builtin_mul_overflow(ke->acc[a].coef[d], k->sizes[d], &want) &&
             ke->acc[a].coef[inner] == want;
      }
      int64_t sz;
      if (ok && !__builtin_mul_overflow(pl->size[j], k->sizes[d], &sz)) {
        pl->dims[j][pl->ndims[j]++] = d;
        pl->size[j] = sz;
        continue;
      }
    }
    pl->dims[pl->nloops][0] = d;
    pl->ndims[pl->nloops] = 1;
    pl->size[pl->nloops] = k->sizes[d];
    pl->nloops++;
  }
  return 0;
}


/* --------------------------------------------------- border peeling */

const tcc_ix *tcc_cpu_clamp_parts(const tcc_ix *e, int64_t *lo, int64_t *hi) {
  *lo = INT64_MIN;
  *hi = INT64_MAX;
  if (e->kind == TCC_IX_MIN && e->a->kind == TCC_IX_MAX) {
    *hi = e->c;
    *lo = e->a->c;
    return e->a->a;
  }
  if (e->kind == TCC_IX_MIN) *hi = e->c;
  else if (e->kind == TCC_IX_MAX) *lo = e->c;
  else return NULL;
  return e->a;
}

int tcc_cpu_peelable(const tcc_ix *x, int v, int64_t *coef, int64_t *c) {
  if (!tcc_ix_affine(x, TCC_MAX_DIMS, coef, c) || coef[v] != 1) return 0;
  for (int d = v + 1; d < TCC_MAX_DIMS; d++)
    if (coef[d]) return 0;
  return 1;
}

/* Collects into ke->ks->peel the clamps of index e that the element loop can
 * drop (the outermost clamp of each chain; nothing under a VALUE). */
static void find_peels(planner *ke, const tcc_ix *e, int v) {
  if (!e || e->kind == TCC_IX_VALUE) return;
  int64_t lo, hi, coef[TCC_MAX_DIMS], c;
  const tcc_ix *x = tcc_cpu_clamp_parts(e, &lo, &hi);
  if (x && tcc_cpu_peelable(x, v, coef, &c)) {
    for (int i = 0; i < ke->ks->npeel; i++)
      if (ke->ks->peel[i] == e) return;
    if (ke->ks->npeel < TCC_CPU_MAX_PEEL) ke->ks->peel[ke->ks->npeel++] = e;
    return;
  }
  find_peels(ke, e->a, v);
  find_peels(ke, e->b, v);
}


/* ------------------------------------------------------ range split */

int tcc_cpu_range_pred(const tcc_vx *e, int *var, int64_t *at, int *below) {
  if ((e->op != TCC_PRIM_LT && e->op != TCC_PRIM_LE && e->op != TCC_PRIM_GT && e->op != TCC_PRIM_GE) ||
      !e->a || !e->b || e->a->op != TCC_PRIM_INDEX || e->b->op != TCC_PRIM_CONST ||
      tcc_dtype_is_float(e->b->dtype))
    return 0;
  int64_t coef[TCC_MAX_DIMS], c0, t;
  if (!tcc_ix_affine(e->a->idx[0], TCC_MAX_DIMS, coef, &c0)) return 0;
  int v = -1;
  for (int d = 0; d < TCC_MAX_DIMS; d++)
    if (coef[d]) {
      if (coef[d] != 1 || v >= 0) return 0;
      v = d;
    }
  /* i_v + c0 < C holds below C - c0; <= below C - c0 + 1; > and >= the
   * other way round */
  int strict = e->op == TCC_PRIM_LT || e->op == TCC_PRIM_GE;
  if (v < 0 || __builtin_sub_overflow(e->b->i, c0, &t) || (!strict && __builtin_add_overflow(t, 1, &t)))
    return 0;
  *var = v;
  *at = t;
  *below = e->op == TCC_PRIM_LT || e->op == TCC_PRIM_LE;
  return 1;
}

/* Would a range split of the peeled element loop drop every clamp the
 * peeling drops? Those whose argument reads no outer var: the ranges
 * bound it (a concatenation along the last dim); one that does (an
 * im2col pack's row + tap) needs the peeling's bounds computed per row. */
static int peels_split(const tcc_cpu_kernel_schedule *ks) {
  for (int i = 0; i < ks->npeel; i++) {
    int64_t lo, hi, coef[TCC_MAX_DIMS], c;
    const tcc_ix *x = tcc_cpu_clamp_parts(ks->peel[i], &lo, &hi);
    if (!tcc_cpu_peelable(x, ks->peel_loop, coef, &c)) return 0;
    for (int d = 0; d < ks->peel_loop; d++)
      if (coef[d]) return 0;
  }
  return 1;
}

/* The loop of a dim-order nest whose var the most comparisons cut
 * (tcc_cpu_range_pred), at most TCC_CPU_MAX_RANGES ranges (the parallel
 * loop, each range a parallel region of its own: TCC_CPU_PAR_RANGES);
 * none in kernels with reductions, blocked element loops, or symbols.
 * It replaces the element loop's peeling where it drops the same clamps
 * (peels_split), and yields to it elsewhere. */
static void plan_range_split(planner *ke) {
  const tcc_program *p = ke->p;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  ks->range_loop = -1;
  ks->nranges = 0;
  if (p->graph->nsyms || pl->affine || ks->col_block || ks->prefetch_elem || ks->prefetch_red || ks->inner_red)
    return;
  for (int i = 0; i < ks->nnodes; i++)
    if (ks->nodes[i]->op == TCC_PRIM_REDUCE) return;
  int64_t cut[TCC_CPU_MAX_RANGES + 1];
  for (int j = 0; j < pl->nloops; j++) {
    if (pl->ndims[j] != 1 || (ks->peel_loop >= 0 && (j != ks->peel_loop || !peels_split(ks)))) continue;
    const int most = j == ks->par ? TCC_CPU_PAR_RANGES : TCC_CPU_MAX_RANGES;
    int ncut = 0, over = 0;
    for (int i = 0; i < ks->nnodes && !over; i++) {
      int v, below;
      int64_t at;
      if (!tcc_cpu_range_pred(ks->nodes[i], &v, &at, &below) || v != pl->dims[j][0] || at <= 0 ||
          at >= pl->size[j])
        continue;
      int x = 0;
      while (x < ncut && cut[x] < at) x++;
      if (x < ncut && cut[x] == at) continue;
      if (ncut + 1 >= most) {
        over = 1;
        break;
      }
      memmove(cut + x + 1, cut + x, sizeof *cut * (size_t)(ncut - x));
      cut[x] = at;
      ncut++;
    }
    if (over || ncut == 0 || ncut + 1 <= ks->nranges) continue;
    ks->range_loop = j;
    ks->nranges = ncut + 1;
    ks->range_at[0] = 0;
    memcpy(ks->range_at + 1, cut, sizeof *cut * (size_t)ncut);
    ks->range_at[ncut + 1] = pl->size[j];
  }
  if (ks->range_loop >= 0 && ks->peel_loop >= 0) ks->peel_loop = -1, ks->npeel = 0;
}

/* In a planned (affine) nest: does every store of the kernel move with
 * loop j, so that its iterations write distinct elements? */
static int stores_vary_in_loop(const planner *ke, int j) {
  const tcc_cpu_nest *pl = &ke->ks->nest;
  for (int s = 0; s < ke->k->nstores; s++) {
    const tcc_store *st = &ke->k->stores[s];
    const tcc_cpu_access *a = NULL;
    for (int i = 0; i < ke->nacc; i++)
      if (ke->acc[i].buf == st->buf && ke->acc[i].idx == st->idx) a = &ke->acc[i];
    if (!a || !a->coef[pl->dims[j][pl->ndims[j] - 1]]) return 0;
  }
  return 1;
}

/* -------------------------------------------------- free variables */

int tcc_cpu_fv_init(tcc_cpu_fv *f, tcc_arena *arena) {
  f->arena = arena;
  f->oom = 0;
  return tcc_ptrmap_init(&f->map, 64);
}

void tcc_cpu_fv_free(tcc_cpu_fv *f) { tcc_ptrmap_free(&f->map); }

static const tcc_varset empty_set = {0};

static const tcc_varset *vs_make(tcc_cpu_fv *f, const int *v, int n) {
  if (!n) return &empty_set;
  tcc_varset *s = tcc_arena_alloc(f->arena, sizeof *s + sizeof(int) * (size_t)n);
  if (!s) {
    f->oom = 1;
    return &empty_set;
  }
  s->n = n;
  memcpy(s->v, v, sizeof(int) * (size_t)n);
  return s;
}

/* Sorted union of up to a few sets into buf (cap entries); drops vars in
 * [lo, hi). Returns the count, or -1 when over cap. */
static int vs_union(const tcc_varset *const *sets, int nsets, int lo, int hi, int *buf, int cap) {
  int n = 0;
  for (int s = 0; s < nsets; s++) {
    if (!sets[s]) continue;
    for (int i = 0; i < sets[s]->n; i++) {
      int v = sets[s]->v[i];
      if (v >= lo && v < hi) continue;
      int j = n;
      while (j > 0 && buf[j - 1] > v) j--;
      if (j > 0 && buf[j - 1] == v) continue;
      if (n == cap) return -1;
      memmove(&buf[j + 1], &buf[j], sizeof(int) * (size_t)(n - j));
      buf[j] = v;
      n++;
    }
  }
  return n;
}


static const tcc_varset *fv_ix(tcc_cpu_fv *f, const tcc_ix *e) {
  if (!e) return &empty_set;
  switch (e->kind) {
  case TCC_IX_CONST: return &empty_set;
  case TCC_IX_VAR: return vs_make(f, &e->var, 1);
  case TCC_IX_VALUE: return tcc_cpu_fv_vx(f, e->v);
  default: {
    const tcc_varset *s[2] = {fv_ix(f, e->a), fv_ix(f, e->b)};
    int buf[256];
    int n = vs_union(s, 2, 0, 0, buf, 256);
    if (n < 0) {
      f->oom = 1;
      return &empty_set;
    }
    return vs_make(f, buf, n);
  }
  }
}

const tcc_varset *tcc_cpu_fv_vx(tcc_cpu_fv *f, const tcc_vx *e) {
  const tcc_varset *hit = tcc_ptrmap_get(&f->map, e);
  if (hit) return hit;
  const tcc_varset *s[TCC_MAX_DIMS + 3];
  int ns = 0, lo = 0, hi = 0;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) s[ns++] = fv_ix(f, e->idx[d]);
  if (e->op != TCC_PRIM_EXTERN) {
    if (e->a) s[ns++] = tcc_cpu_fv_vx(f, e->a);
    if (e->b) s[ns++] = tcc_cpu_fv_vx(f, e->b);
    if (e->c) s[ns++] = tcc_cpu_fv_vx(f, e->c);
  }
  if (e->op == TCC_PRIM_REDUCE) {
    lo = e->buf;
    hi = e->buf + e->nidx;
  }
  int buf[256];
  int n = vs_union(s, ns, lo, hi, buf, 256);
  const tcc_varset *r = n < 0 ? (f->oom = 1, &empty_set) : vs_make(f, buf, n);
  if (tcc_ptrmap_put(&f->map, e, r)) f->oom = 1;
  return r;
}


/* ------------------------------------------------- levels, buffers */

/* Loop level of e: 0 when it reads no loop variable, else 1 + the
 * innermost loop it reads (planned loops: everything varying is
 * innermost). */
static int level_of(planner *ke, const tcc_varset *s) {
  int lv = 0;
  for (int i = 0; i < s->n; i++) {
    int v = s->v[i];
    if (v >= TCC_MAX_DIMS) return ke->ks->nest.nloops + 1;   /* bound: never at kernel level */
    if (ke->k->sizes[v] == 1 && !ke->ks->nest.affine) {
      if (lv < ke->ks->nest.pos[v] + 1) lv = ke->ks->nest.pos[v] + 1;
      continue;
    }
    int l = ke->ks->nest.affine ? ke->ks->nest.nloops : ke->ks->nest.pos[v] + 1;
    if (l > lv) lv = l;
  }
  return lv;
}

/* Post-order list of the kernel-level nodes (not inside reductions). */
static int collect_nodes(planner *ke, const tcc_vx *e, tcc_ptrmap *seen, const tcc_vx ***list,
                         int *n, int *cap) {
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  /* a kept summand, a staged row's value: loaded */
  if (e->op != TCC_PRIM_REDUCE && e != ke->ks->kept_node && e != ke->ks->staged_node) {
    if (e->a && collect_nodes(ke, e->a, seen, list, n, cap)) return -1;
    if (e->b && collect_nodes(ke, e->b, seen, list, n, cap)) return -1;
    if (e->c && collect_nodes(ke, e->c, seen, list, n, cap)) return -1;
  }
  if (*n == *cap) {
    int nc = *cap ? *cap * 2 : 64;
    const tcc_vx **nl = realloc(*list, sizeof *nl * (size_t)nc);
    if (!nl) return -1;
    *list = nl;
    *cap = nc;
  }
  (*list)[(*n)++] = e;
  return 0;
}

static void add_buf(int *used, int *nused, int buf) {
  int j = *nused;
  while (j > 0 && used[j - 1] > buf) j--;
  if (j > 0 && used[j - 1] == buf) return;
  memmove(&used[j + 1], &used[j], sizeof *used * (size_t)(*nused - j));
  used[j] = buf;
  (*nused)++;
}

static int used_buffers(const tcc_vx *e, tcc_ptrmap *seen, int *used, int *nused);

/* The buffers the values inside index x load. */
static int used_buffers_ix(const tcc_ix *x, tcc_ptrmap *seen, int *used, int *nused) {
  const tcc_ix *vals[TCC_MAX_DIMS];
  int nv = tcc_ix_values(x, vals, TCC_MAX_DIMS);
  for (int i = 0; i < nv; i++)
    if (used_buffers(vals[i]->v, seen, used, nused)) return -1;
  return 0;
}

/* Every buffer a kernel touches (loads anywhere, including inside
 * reductions and index values, and stores). */
static int used_buffers(const tcc_vx *e, tcc_ptrmap *seen, int *used, int *nused) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD) add_buf(used, nused, e->buf);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (used_buffers_ix(e->idx[d], seen, used, nused)) return -1;
  if (e->a && used_buffers(e->a, seen, used, nused)) return -1;
  if (e->b && used_buffers(e->b, seen, used, nused)) return -1;
  if (e->c && used_buffers(e->c, seen, used, nused)) return -1;
  return 0;
}

/* Calls visit(ctx, coef, affine) for each LOAD under roots[0..n) (a DFS
 * over the DAG, each node once), coef[0..p->next_var) its storage index's
 * linear form over the program's vars when `affine`. Returns 1 when every
 * visit returned 1, 0 when one returned 0 (the walk stops) or the DAG is
 * too deep, -1 when out of memory. */
static int each_load(const tcc_program *p, const tcc_vx *const *roots, int n,
                     int (*visit)(void *ctx, const tcc_vx *load, const int64_t *coef, int64_t c, int affine),
                     void *ctx) {
  const int nv = p->next_var;
  int64_t *coef = malloc(sizeof *coef * (size_t)(nv + 1));
  tcc_ptrmap seen;
  if (!coef || tcc_ptrmap_init(&seen, 64)) {
    free(coef);
    return -1;
  }
  const tcc_vx *stack[256];
  int sp = 0, ok = 1;
  for (int i = 0; i < n && sp < 256; i++) stack[sp++] = roots[i];
  while (sp && ok == 1) {
    const tcc_vx *e = stack[--sp];
    if (tcc_ptrmap_get(&seen, e)) continue;
    if (tcc_ptrmap_put(&seen, e, e)) {
      ok = -1;
      break;
    }
    if (e->op == TCC_PRIM_LOAD) {
      const tcc_meta *m = &p->bufs[e->buf].layout;
      int64_t c;
      int affine = tcc_linear_affine(m->rank, e->idx, m->strides, nv, coef, &c);
      ok = visit(ctx, e, coef, c, affine);
      continue;
    }
    const tcc_vx *kids[3] = {e->a, e->b, e->c};
    for (int k = 0; k < 3; k++)
      if (kids[k]) {
        if (sp == 256) ok = 0;
        else stack[sp++] = kids[k];
      }
  }
  tcc_ptrmap_free(&seen);
  free(coef);
  return ok;
}

/* each_load's visit for column sums: affine, unit stride or none along
 * the column, never unit stride along the row where it moves with the
 * column; notes a load that moves with the row too. */
typedef struct column_loads {
  int col, row, strided;
} column_loads;

static int column_load(void *ctx, const tcc_vx *load, const int64_t *coef, int64_t c0, int affine) {
  (void)load, (void)c0;
  column_loads *c = ctx;
  if (!affine || (coef[c->col] != 0 && coef[c->col] != 1) || (coef[c->col] != 0 && llabs(coef[c->row]) == 1))
    return 0;
  c->strided |= coef[c->col] == 1 && coef[c->row] != 0;
  return 1;
}

static int reduces_among_rec(const tcc_vx *e, const tcc_vx *const *sums, int n, tcc_ptrmap *seen) {
  if (!e || tcc_ptrmap_get(seen, e)) return 1;
  if (tcc_ptrmap_put(seen, e, e)) return 0;
  if (e->op == TCC_PRIM_REDUCE) {
    for (int i = 0; i < n; i++)
      if (sums[i] == e) return 1;
    return 0;
  }
  return reduces_among_rec(e->a, sums, n, seen) && reduces_among_rec(e->b, sums, n, seen) &&
         reduces_among_rec(e->c, sums, n, seen);
}

/* Are the reductions in e (not looking inside them) all among
 * sums[0..n)? 0 when out of memory too (no column sums then). */
static int reduces_among(const tcc_vx *e, const tcc_vx *const *sums, int n) {
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return 0;
  }
  int r = reduces_among_rec(e, sums, n, &seen);
  tcc_ptrmap_free(&seen);
  return r;
}

/* Column sums (see the file header): the element loop's sums, in stages
 * (groups of siblings, a later one's summands reading earlier sums, as
 * a batch norm's variance reads its mean), float sums of summands
 * without other reductions of their own,
 * whose loads are affine and read the element loop's dim at unit stride
 * (at least one of them moving with the innermost reduction variable) or
 * not at all (a per-row mean: one value per block row). Static dim-order
 * nests without a kept summand or peeling. Returns 0 or -1 (out of
 * memory). */
static int plan_column_sums(planner *ke) {
  const tcc_program *p = ke->p;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  int pv = pl->nloops - 1;
  if (!ks->inner_red || pl->affine || pv < 0 || pl->size[pv] < 16 || ks->kept_red || ks->npeel ||
      p->graph->nsyms)
    return 0;
  const tcc_vx *sums[TCC_CPU_COL_SUMS];
  int nsums = 0;
  for (int i = 0; i < ks->nnodes; i++) {
    const tcc_vx *e = ks->nodes[i];
    if (e->op != TCC_PRIM_REDUCE || ks->levels[i] != pl->nloops) continue;
    if (e->i != TCC_RED_SUM || (e->dtype != TCC__V1__DTYPE__FLOAT32 && e->dtype != TCC__V1__DTYPE__FLOAT64) ||
        nsums == TCC_CPU_COL_SUMS || e->nidx < 1 || !reduces_among(e->a, sums, nsums))
      return 0;
    sums[nsums++] = e;
  }
  if (!nsums) return 0;
  column_loads c = {.col = pl->dims[pv][0]};
  int ok = 1;
  for (int i = 0; i < nsums && ok == 1; i++) {   /* each stage's loads along its own rows */
    c.row = sums[i]->buf + sums[i]->nidx - 1;
    ok = each_load(p, sums + i, 1, column_load, &c);
  }
  if (ok < 0) return -1;
  /* 128 columns read 512 bytes of a float32 row per block row (1.6x
   * faster than 32 over a [1024, 30522] sum); narrower blocks where that
   * leaves fewer than 8 blocks to share among the threads */
  int64_t cb = (pl->size[pv] / 8 + 15) / 16 * 16;
  if (ok && c.strided) ks->col_block = cb < 16 ? 16 : cb > TCC_CPU_COL_BLOCK ? TCC_CPU_COL_BLOCK : (int)cb;
  return 0;
}

/* each_load's visit for merged loops: affine, the outer variable's
 * coefficient the inner's times the inner's extent. */
typedef struct merge_loads {
  int inner;
  int64_t n;
} merge_loads;

static int merge_load(void *ctx, const tcc_vx *load, const int64_t *coef, int64_t c, int affine) {
  (void)load, (void)c;
  const merge_loads *m = ctx;
  int64_t want;
  return affine && !__builtin_mul_overflow(coef[m->inner], m->n, &want) && coef[m->inner - 1] == want;
}

/* Merged reduction loops (see the file header): for each kernel-level
 * REDUCE whose innermost reduction loop is shorter than
 * TCC_CPU_MERGE_BELOW, 1 when every load of its summand is affine and
 * reads the two innermost reduction variables as one run (the outer's
 * coefficient the inner's times the inner's extent), and the summand
 * holds no reduction of its own. Returns 0 or -1 (out of memory). */
static int plan_merged_reductions(planner *ke) {
  const tcc_program *p = ke->p;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  ks->red_merged = tcc_arena_array(p->arena, (size_t)ks->nnodes + 1, sizeof *ks->red_merged);
  if (!ks->red_merged) return -1;
  if (p->graph->nsyms) return 0;
  for (int i = 0; i < ks->nnodes; i++) {
    const tcc_vx *q = ks->nodes[i];
    if (q->op != TCC_PRIM_REDUCE || q->nidx < 2 || q->i == TCC_RED_ARGMAX || q->i == TCC_RED_ARGMIN ||
        q->idx[q->nidx - 1]->c >= TCC_CPU_MERGE_BELOW || tcc_vx_has_reduce(q->a))
      continue;
    merge_loads m = {.inner = q->buf + q->nidx - 1, .n = q->idx[q->nidx - 1]->c};
    int ok = each_load(p, &q->a, 1, merge_load, &m);
    if (ok < 0) return -1;
    ks->red_merged[i] = ok;
  }
  return 0;
}

/* ------------------------------------------------- next-row prefetch */

/* each_load's visit for the next-row prefetch: keeps (up to
 * TCC_CPU_PREFETCH, one per buffer) the loads that read the reduction's
 * var at unit stride, move with the row var, and read no var but those
 * and the loops' around the row (bound before the reduction runs). */
typedef struct row_loads {
  const tcc_program *p;
  tcc_cpu_kernel_schedule *ks;
  int inner, level;           /* the reduction's var; its loop level */
} row_loads;

/* The stream of buffer buf's access c + sum coef[v] * i<v> along var
 * `along` (dropped: the prefetching loop's i<v>q takes its place), or 0
 * when it reads a var not bound at loop level `level`. */
static int prefetch_stream(const tcc_program *p, const tcc_cpu_kernel_schedule *ks, int buf, const int64_t *coef,
                           int64_t c, int along, int level, tcc_cpu_prefetch *f) {
  const tcc_cpu_nest *pl = &ks->nest;
  *f = (tcc_cpu_prefetch){.buf = buf, .c = c + p->bufs[buf].layout.offset};
  for (int v = 0; v < p->next_var; v++) {
    if (!coef[v] || v == along) continue;
    if (v >= TCC_MAX_DIMS || v >= pl->nloops || pl->pos[v] >= level || f->nterm == TCC_MAX_DIMS) return 0;
    f->var[f->nterm] = v;
    f->coef[f->nterm++] = coef[v];
  }
  int64_t size = tcc_dtype_size(p->bufs[buf].layout.dtype);
  f->step = size > 0 && size <= TCC_CPU_LINE ? TCC_CPU_LINE / size : 1;
  return 1;
}

static int row_load(void *ctx, const tcc_vx *load, const int64_t *coef, int64_t c, int affine) {
  row_loads *r = ctx;
  tcc_cpu_kernel_schedule *ks = r->ks;
  if (!affine || coef[r->inner] != 1 || coef[ks->row_var] <= 0 || ks->nprefetch == TCC_CPU_PREFETCH) return 1;
  for (int i = 0; i < ks->nprefetch; i++)
    if (ks->prefetch[i].buf == load->buf) return 1;
  tcc_cpu_prefetch f;   /* the next row: one row var step on (row_ahead moves it on) */
  if (prefetch_stream(r->p, ks, load->buf, coef, c + coef[ks->row_var], r->inner, r->level, &f))
    ks->prefetch[ks->nprefetch++] = f;
  return 1;
}

/* A REDUCE of e's (not looking inside reductions) with r's extents, or
 * NULL. */
static const tcc_vx *reduce_within(const tcc_vx *e, const tcc_vx *r, tcc_ptrmap *seen) {
  if (!e || tcc_ptrmap_get(seen, e)) return NULL;
  tcc_ptrmap_put(seen, e, e);   /* a memo: out of memory costs walks */
  if (e->op == TCC_PRIM_REDUCE) return same_extent(e, r) ? e : NULL;
  const tcc_vx *f = reduce_within(e->a, r, seen);
  if (!f) f = reduce_within(e->b, r, seen);
  if (!f) f = reduce_within(e->c, r, seen);
  return f;
}

/* The stores' prefetch (cpu_schedule.h) in the loop of `carrier`, the
 * pass before the element loop, at loop level `level`: the element
 * loop's stores (unless a reduction's loop writes one first: kept_red)
 * that run along the element loop at unit stride over the row's extent
 * n, move with the row var and read no var but those and the loops'
 * around `level`. On an AMD EPYC with AVX-512 (Zen 4), [1024, 4096]
 * float32 rows from memory: log_softmax 1.2x faster, layer norm 1.18x,
 * rms norm 1.1x (one process, interleaved rounds, a C harness of the
 * kernels). A softmax's stores, first written by its sum's loop, gained
 * nothing from a prefetch in its max's loop. Returns 0 or -1 (out of
 * memory). */
static int plan_store_prefetch(planner *ke, const tcc_vx *carrier, int level, int64_t n) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  const int elem = pl->nloops - 1;
  ks->store_prefetch_red = NULL;
  ks->nstore_prefetch = 0;
  if (ks->kept_red || elem < 1 || pl->ndims[elem] != 1 || pl->size[elem] != n) return 0;
  const int ev = pl->dims[elem][0];
  int64_t *coef = malloc(sizeof *coef * (size_t)(p->next_var + 1));
  if (!coef) return -1;
  for (int s = 0; s < k->nstores && ks->nstore_prefetch < TCC_CPU_PREFETCH; s++) {
    const tcc_store *st = &k->stores[s];
    const tcc_meta *m = &p->bufs[st->buf].layout;
    int64_t c;
    if (ks->store_levels[s] != pl->nloops ||
        !tcc_linear_affine(m->rank, st->idx, m->strides, p->next_var, coef, &c) || coef[ev] != 1 ||
        coef[ks->row_var] <= 0)
      continue;
    int ok = 1;
    for (int i = 0; i < ks->nstore_prefetch; i++)
      if (ks->store_prefetch[i].buf == st->buf) ok = 0;
    tcc_cpu_prefetch f;
    if (ok && prefetch_stream(p, ks, st->buf, coef, c, ev, level, &f) && n >= 4 * f.step)
      ks->store_prefetch[ks->nstore_prefetch++] = f;
  }
  free(coef);
  if (ks->nstore_prefetch) ks->store_prefetch_red = carrier;
  return 0;
}

/* Next-row prefetch (cpu_schedule.h): static dim-order row kernels on
 * the OpenMP threads with a kernel-level reduction r2 over one var whose
 * row an earlier reduction r1 of the same extent has read: the leader of
 * an earlier group of r2's level (a layer norm's mean before its
 * variance), or one in r2's summand, computed before r2's loop (a
 * softmax's max before its sum). The rows of r1's loads must be at least
 * 4 lines long. On an AMD EPYC (AVX2), rows from memory, softmax over
 * [1024, 4096] took 4.02 ms with it against 4.38, log_softmax 4.32
 * against 5.14 (docs/benchmarks.md, CPU kernels). Returns 0 or -1 (out
 * of memory). */
static int plan_row_prefetch(planner *ke) {
  const tcc_program *p = ke->p;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  ks->prefetch_red = NULL;
  ks->nprefetch = ks->prefetch_elem = 0;
  if (p->graph->nsyms || pl->affine || ks->par < 0 || ks->inner_red || ks->col_block) return 0;
  const tcc_vx *r1 = NULL, *r2 = NULL;
  int first = -1, level = 0;
  for (int i = 0; i < ks->nnodes && !r1; i++) {
    const tcc_vx *e = ks->nodes[i];
    if (ks->red_lead[i] != i || e->nidx != 1 || ks->red_merged[i] || e->i == TCC_RED_ARGMAX || e->i == TCC_RED_ARGMIN)
      continue;
    for (int j = 0; j < i && !r1; j++)
      if (ks->red_lead[j] == j && ks->levels[j] == ks->levels[i] && same_extent(ks->nodes[j], e)) r1 = ks->nodes[j], first = j;
    if (!r1) {
      tcc_ptrmap seen;
      if (tcc_ptrmap_init(&seen, 64)) {
        tcc_ptrmap_free(&seen);
        return -1;
      }
      r1 = reduce_within(e->a, e, &seen);
      tcc_ptrmap_free(&seen);
    }
    if (r1) r2 = e, level = ks->levels[i];
  }
  /* no second reduction: the element loop reads the row again (rms
   * norm's x * rsqrt(mean(x^2) + eps)) when it runs in SIMD lanes right
   * inside the rows and has r1's extent */
  const int elem = pl->nloops - 1;
  int in_elem = 0;   /* r1 alone, its row read again by the element loop */
  if (!r2 && ks->simd && elem >= 1 && elem != ks->par && ks->peel_loop < 0)
    for (int i = 0; i < ks->nnodes && !r1; i++) {
      const tcc_vx *e = ks->nodes[i];
      if (ks->red_lead[i] == i && ks->levels[i] == elem && e->nidx == 1 && !ks->red_merged[i] &&
          e->idx[0]->c == pl->size[elem])
        r1 = e, level = elem, in_elem = 1;
    }
  if (!(r2 || in_elem) || level < 1 || r1->i == TCC_RED_ARGMAX || r1->i == TCC_RED_ARGMIN) return 0;
  int row_loop = level - 1;
  while (row_loop >= 0 && pl->size[row_loop] < 2) row_loop--;
  if (row_loop < 0) return 0;
  ks->row_var = pl->dims[row_loop][0];
  ks->row_n = pl->size[row_loop];
  row_loads r = {.p = p, .ks = ks, .inner = r1->buf, .level = level};
  if (each_load(p, &r1->a, 1, row_load, &r) < 0) return -1;
  for (int g = 0; g < ks->nnodes; g++)   /* r1's siblings */
    if (first >= 0 && g != first && ks->red_lead[g] == first && each_load(p, &ks->nodes[g]->a, 1, row_load, &r) < 0)
      return -1;
  /* rows of fewer than 4 lines are not worth a loop of their own */
  int64_t n = r1->idx[0]->c, row_bytes = 0;
  int keep = 0;
  for (int i = 0; i < ks->nprefetch; i++)
    if (n >= 4 * ks->prefetch[i].step) {
      int64_t bytes = n * tcc_dtype_size(p->bufs[ks->prefetch[i].buf].layout.dtype);
      if (bytes > row_bytes) row_bytes = bytes;
      ks->prefetch[keep++] = ks->prefetch[i];
    }
  ks->nprefetch = keep;
  /* the row TCC_CPU_PREFETCH_AHEAD bytes on: masked attention scores'
   * rows of 256 float32 (1 KB), prefetched 1 row ahead, took 1.2-1.25x
   * the time of 2-8 rows ahead (Zen 5, one process, interleaved rounds,
   * the generated C in a harness); 16 rows ahead was slower again */
  ks->row_ahead = row_bytes ? (TCC_CPU_PREFETCH_AHEAD + row_bytes - 1) / row_bytes : 1;
  if (ks->row_ahead > ks->row_n - 1) ks->row_ahead = ks->row_n - 1;
  if (ks->row_ahead < 1) ks->row_ahead = 1;
  for (int i = 0; i < keep; i++)   /* the row var's term holds its stride */
    for (int t = 0; t < ks->prefetch[i].nterm; t++)
      if (ks->prefetch[i].var[t] == ks->row_var) ks->prefetch[i].c += ks->prefetch[i].coef[t] * (ks->row_ahead - 1);
  ks->prefetch_red = keep && !in_elem ? r2 : NULL;
  ks->prefetch_elem = keep && in_elem;
  return keep ? plan_store_prefetch(ke, in_elem ? r1 : r2, level, n) : 0;
}

/* Work estimate: the elements stored, plus each reduction's steps times
 * the times it runs, which its loop level says (a row statistic above
 * the element loop runs once a row, not once an element: 9 rows of
 * BERT's 768-wide layer norm are 21 K steps, not 11 M). Dynamic programs
 * print numel * (1 + extents) instead (emit.c, put_work_expr): their
 * loops are not planned. */
static double kernel_work(const tcc_kernel *k, const tcc_cpu_kernel_schedule *ks) {
  const tcc_cpu_nest *pl = &ks->nest;
  double numel = 1, work;
  for (int d = 0; d < k->rank; d++) numel *= (double)k->sizes[d];
  work = numel;
  for (int i = 0; i < ks->nnodes; i++)
    if (ks->nodes[i]->op == TCC_PRIM_REDUCE) {
      double e = 1, runs = 1;
      for (int r = 0; r < ks->nodes[i]->nidx; r++) e *= (double)ks->nodes[i]->idx[r]->c;
      if (ks->levels[i] > pl->nloops) runs = numel;
      else
        for (int j = 0; j < ks->levels[i]; j++) runs *= (double)pl->size[j];
      work += runs * e;
    }
  return work;
}

/* ---------------------------------------------------- column values */

/* Does e vary along the element loop of a planned nest and nothing
 * else (dims of size 1 aside)? */
static int col_only(planner *ke, const tcc_vx *e) {
  const tcc_cpu_nest *pl = &ke->ks->nest;
  const tcc_varset *s = tcc_cpu_fv_vx(&ke->fv, e);
  if (!s || s->n == 0) return 0;
  for (int i = 0; i < s->n; i++) {
    int v = s->v[i], in = v < TCC_MAX_DIMS && ke->k->sizes[v] == 1;
    for (int d = 0; d < pl->ndims[pl->nloops - 1] && !in; d++) in = pl->dims[pl->nloops - 1][d] == v;
    if (!in) return 0;
  }
  return 1;
}

/* Column values (cpu_schedule.h): the operands of element-loop values
 * that vary along other loops too, when they vary along the element
 * loop alone and compute something costly. Static planned nests of two
 * loops or more only, as many as fit TCC_CPU_COL_BYTES. */
static int plan_column_values(planner *ke) {
  const tcc_program *p = ke->p;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  ks->ncol_vals = 0;
  if (!pl->affine || pl->nloops < 2 || p->graph->nsyms)
    return 0;
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 16)) return -1;
  for (int i = 0; i < ks->nnodes && ks->ncol_vals < TCC_CPU_COL_VALUES; i++) {
    const tcc_vx *e = ks->nodes[i];
    if (ks->levels[i] != pl->nloops || col_only(ke, e)) continue;
    const tcc_vx *ops[3] = {e->a, e->b, e->c};
    for (int o = 0; o < 3 && ks->ncol_vals < TCC_CPU_COL_VALUES; o++) {
      const tcc_vx *a = ops[o];
      int known = 0;
      for (int c = 0; c < ks->ncol_vals; c++) known |= ks->col_vals[c] == a;
      if (!a || known || !tcc_cpu_ctype(a->dtype) || !col_only(ke, a) || !tcc_vx_costly(a, &seen)) continue;
      if ((ks->ncol_vals + 1) * pl->size[pl->nloops - 1] * 8 > TCC_CPU_COL_BYTES) break;
      ks->col_vals[ks->ncol_vals++] = a;
    }
  }
  tcc_ptrmap_free(&seen);
  return ke->fv.oom ? -1 : 0;
}

/* ------------------------------------------------------ one kernel */

/* Plans pointwise kernel ke->k (see the file header). Returns 0 or -1
 * (out of memory). */
static int plan_kernel(planner *ke) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_kernel_config *cfg = p->graph->nsyms ? NULL : tcc_kernel_config_of(p, ks->kno);
  ke->loop_order = cfg ? cfg->order : 0;
  if (plan_loops(ke) || plan_kept_summand(ke) || plan_staged_row(ke)) return -1;
  tcc_cpu_nest *pl = &ks->nest;
  /* the nodes outside reductions, the buffers, the loop levels */
  const tcc_vx **list = NULL;
  int nn = 0, capn = 0, nused = 0, fail = 0;
  int *used = tcc_arena_array(p->arena, (size_t)p->nbufs + 1, sizeof *used);
  tcc_ptrmap seen;
  if (!used || tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return -1;
  }
  for (int s = 0; s < k->nstores && !fail; s++) {
    fail = collect_nodes(ke, k->stores[s].value, &seen, &list, &nn, &capn);
    add_buf(used, &nused, k->stores[s].buf);
  }
  tcc_ptrmap_free(&seen);
  if (fail || tcc_ptrmap_init(&seen, 64)) {
    free(list);
    return -1;
  }
  for (int s = 0; s < k->nstores && !fail; s++) {
    fail = used_buffers(k->stores[s].value, &seen, used, &nused);
    for (int d = 0; d < p->bufs[k->stores[s].buf].layout.rank && !fail; d++)
      fail = used_buffers_ix(k->stores[s].idx[d], &seen, used, &nused);
  }
  tcc_ptrmap_free(&seen);
  ks->nodes = tcc_arena_array(p->arena, (size_t)nn + 1, sizeof *ks->nodes);
  ks->levels = tcc_arena_array(p->arena, (size_t)nn + 1, sizeof *ks->levels);
  ks->store_levels = tcc_arena_array(p->arena, (size_t)k->nstores + 1, sizeof *ks->store_levels);
  if (fail || !ks->nodes || !ks->levels || !ks->store_levels) {
    free(list);
    return -1;
  }
  if (nn) memcpy(ks->nodes, list, sizeof *list * (size_t)nn);
  free(list);
  ks->nnodes = nn;
  ks->used = used;
  ks->nused = nused;
  for (int i = 0; i < nn; i++) ks->levels[i] = level_of(ke, tcc_cpu_fv_vx(&ke->fv, ks->nodes[i]));
  for (int s = 0; s < k->nstores; s++) {
    const tcc_store *st = &k->stores[s];
    int lv = level_of(ke, tcc_cpu_fv_vx(&ke->fv, st->value));
    const tcc_meta *m = &p->bufs[st->buf].layout;
    for (int d = 0; d < m->rank; d++) {
      int l = level_of(ke, fv_ix(&ke->fv, st->idx[d]));
      if (l > lv) lv = l;
    }
    ks->store_levels[s] = lv;
  }
  if (ke->fv.oom || group_reductions(p, ks, pl->nloops + 1) || plan_inline_exp(p, k, &ks->inline_exp) ||
      plan_exp_le0(p, k, ks) ||
      plan_merged_reductions(ke) || plan_column_values(ke))
    return -1;
  ks->par = ks->peel_loop = ks->range_loop = -1;
  int64_t numel = 1;
  for (int d = 0; d < k->rank; d++) numel *= k->sizes[d];   /* checked in prepare */
  if (numel == 0) return 0;                                  /* no loops run */
  /* the parallel loop: the outermost of size > 1 above TCC_PARALLEL_WORK
   * (dynamic programs: chosen at run time), or as the config says */
  ks->simdlen = cfg ? cfg->vec : 0;
  ks->tuned = cfg != NULL;
  ks->threads = cfg ? cfg->threads : 0;
  ks->chunk = cfg ? cfg->chunk : 0;
  if (cfg && cfg->parallel) {
    for (int j = 0; j < pl->nloops && ks->par < 0 && cfg->parallel > 0; j++)
      if (pl->size[j] > 1) ks->par = j;
  } else if (p->graph->nsyms || kernel_work(k, ks) >= TCC_PARALLEL_WORK)
    for (int j = 0; j < pl->nloops && ks->par < 0; j++)
      if (pl->size[j] > 1) ks->par = j;
  ks->par_at_run_time = p->graph->nsyms && ks->par >= 0;
  /* a reduction loop inside the element loop: no simd there (OpenMP does
   * not nest simd constructs) */
  for (int i = 0; i < nn; i++)
    if (ks->nodes[i]->op == TCC_PRIM_REDUCE && ks->levels[i] == pl->nloops) ks->inner_red = 1;
  /* border peeling of the element loop */
  int pv = pl->nloops - 1;
  if (!pl->affine && !pl->permuted && !ks->inner_red && pv >= 0 && pv < k->rank && pv != ks->par &&
      pl->size[pv] > 1 && !p->graph->nsyms)
    for (int i = 0; i < nn; i++)
      if (ks->nodes[i]->op == TCC_PRIM_LOAD)
        for (int d = 0; d < ks->nodes[i]->nidx; d++) find_peels(ke, ks->nodes[i]->idx[d], pv);
  if (ks->npeel) ks->peel_loop = pv;
  if (plan_column_sums(ke)) return -1;
  /* pooling windows: reductions in the element loop of a few steps each
   * unroll, and the element loop runs in SIMD lanes (max-pool's backward
   * checks 2x2 windows per input element: a 2-lane SIMD loop before) */
  if (ks->inner_red && !ks->col_block && !p->graph->nsyms) {
    ks->window_unrolled = 1;
    for (int i = 0; i < nn; i++)
      if (ks->nodes[i]->op == TCC_PRIM_REDUCE && ks->levels[i] == pl->nloops) {
        int64_t steps = 1;
        for (int r = 0; r < ks->nodes[i]->nidx; r++) steps *= ks->nodes[i]->idx[r]->c;
        if (steps > TCC_CPU_WINDOW) ks->window_unrolled = 0;
      }
  }
  /* the element loop (not the parallel one): iterations store distinct
   * elements and read nothing the kernel writes (tcc_check_program), so
   * it may run in SIMD lanes; this lets gcc if-convert selects (masks)
   * into blends (with build.c's -fno-trapping-math; a planned loop too).
   * Otherwise a config may unroll it. */
  if (pv >= 0 && pv != ks->par) {
    if (pl->size[pv] > 1 && (!ks->inner_red || ks->window_unrolled) && (!pl->affine || stores_vary_in_loop(ke, pv)))
      ks->simd = 1;
    else if (cfg && cfg->unroll > 0) ks->unroll = cfg->unroll;
  }
  if (plan_row_prefetch(ke)) return -1;
  plan_range_split(ke);
  return 0;
}

int tcc_cpu_gemm_stream_rows(const char *isa) {
  if (!isa) return 0;
  if (strcmp(isa, "x86-64-v4") == 0) return 12;
  if (strcmp(isa, "x86-64-v3") == 0) return 12;
  return 0;
}

/* Few rows against nn.Linear's weight (tcc_cpu_gemm_stream_rows): a
 * float32 GEMM of one batch whose A has unit-stride rows and whose B is
 * stored [N, K] (k's stride 1) streams B's rows, as many a block as keep
 * the block's accumulators (rows x M vectors) in registers: with the
 * rows' vectors and A's in AVX-512's 32 (3 rows a block for 9 rows of A,
 * since codegen 59: 2 before, whose loop read each vector of A from
 * memory twice), 12 of AVX2's 16, one weight row a block from 7 rows on
 * AVX2 (an AVX-512 Xeon, 2 threads, weights from memory: 9 x 768 x 3072
 * at 23 GB/s against dnnl_sgemm's 13, 16 rows no faster than oneDNN; an
 * AMD EPYC with AVX2: 9 x 768 x 3072 in 0.82 ms against dnnl_sgemm's 1.27,
 * 9 x 3072 x 768 in 1.02 against 1.21, docs/benchmarks.md). One row too:
 * on an AMD EPYC with AVX-512 (Zen 4), weights from memory, GPT-2's tied
 * LM head (1 x 768 x 50257) in 6.3 ms against dnnl_sgemm's 8.1, a Llama
 * decoder's 2048-wide GEMMs 0.86-0.94x its time (built for AVX2 on the
 * same CPU: 0.74x, and 0.93-1.01x). A's rows past TCC_CPU_STREAM_L1
 * bytes run k in chunks (stream_kc). Returns 1 when it does. */
static int plan_stream_rows(const tcc_program *p, const tcc_vx *call, tcc_cpu_gemm *g,
                            const tcc_kernel_config *cfg) {
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  const char *isa = p->graph->target.isa;
  const int v4 = isa && strcmp(isa, "x86-64-v4") == 0;
  int most = tcc_cpu_gemm_stream_rows(isa), width = v4 ? 16 : 8;
  int64_t ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}, c0;
  if (call->dtype != TCC__V1__DTYPE__FLOAT32 || p->graph->nsyms || Bt != 1 || M < 1 || M > most ||
      N < 2 || K < width || g->trans[0] || !g->trans[1] || !tcc_gemm_operand_affine(p, call->a, ca, &c0) ||
      !tcc_gemm_operand_affine(p, call->b, cb, &c0) || ca[2] != 1 || (M > 1 && ca[1] < K) || cb[1] != 1 || cb[2] < K)
    return 0;
  /* AVX-512: rows x M accumulators, the rows' vectors and A's vector in
   * 32 registers, at most 4 rows (on the Zen 5 VM, weights from memory,
   * one thread: 1 x 8192 x 2048 1.10-1.16x faster than with 8, 4 x 2048
   * x 8192 1.1x faster than with 6; two threads alike); AVX2: rows x M
   * accumulators in 12 of its 16, at most 8 */
  int rows = v4 ? 31 / ((int)M + 1) : 12 / (int)M, most_rows = v4 ? 4 : 8;
  g->stream_rows = rows < 1 ? 1 : rows > most_rows ? most_rows : rows;
  g->stream_width = width;
  g->stream_kc = 0;
  if (M * K * 4 > TCC_CPU_STREAM_L1) {
    int64_t kc = TCC_CPU_STREAM_A_BYTES / (4 * M) / 64 * 64;
    g->stream_kc = kc < 64 ? 64 : kc;
  }
  /* a tuning config's `par` decides; without one, the GEMM's size */
  g->stream_par = cfg && cfg->parallel ? cfg->parallel > 0
                                       : 2.0 * (double)M * (double)N * (double)K >= TCC_GEMM_PARALLEL_FLOPS &&
                                             N > g->stream_rows;
  return 1;
}

/* One to SPLIT_K_MAX_ROWS float32 rows against a weight stored [K, N],
 * unit stride along n (GPT-2's Conv1D in a decode step, one sequence or
 * a batch): oneDNN's GEMV splits such a weight among the threads by
 * columns, so each thread reads a strided panel of every row, and its
 * GEMM packs it; split by rows, each thread streams one contiguous run
 * (emit_split_k_gemm), SPLIT_K_PASS rows a pass. M x N is bounded so
 * that each thread's partial rows fit its stack. Returns 1 when it
 * applies. */
#define SPLIT_K_MAX_ROWS 8
#define SPLIT_K_MAX_ELEMS 32768 /* floats of partial rows: 128 KB of a thread's stack */
#define SPLIT_K_PASS 8
static int plan_split_k(const tcc_program *p, const tcc_vx *call, tcc_cpu_gemm *g, const tcc_kernel_config *cfg) {
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  int64_t ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}, c0;
  const char *isa = p->graph->target.isa;
  if (call->dtype != TCC__V1__DTYPE__FLOAT32 || p->graph->nsyms || Bt != 1 || M < 1 || M > SPLIT_K_MAX_ROWS ||
      N < 8 || M * N > SPLIT_K_MAX_ELEMS || K < 8 || !isa || !tcc_cpu_gemm_stream_rows(isa) || g->trans[1] ||
      !tcc_gemm_operand_affine(p, call->a, ca, &c0) || !tcc_gemm_operand_affine(p, call->b, cb, &c0) ||
      cb[2] != 1 || cb[1] < N)
    return 0;
  g->split_k = SPLIT_K_PASS;
  g->stream_width = strcmp(isa, "x86-64-v4") == 0 ? 16 : 8;
  g->split_k_par = cfg && cfg->parallel ? cfg->parallel > 0
                                        : 2.0 * (double)M * (double)N * (double)K >= TCC_GEMM_PARALLEL_FLOPS;
  return 1;
}

/* One narrow side, float32 on AVX-512 (emit_narrow_gemm): 13-64 rows
 * against nn.Linear's weight, the weight's rows streamed (narrow_b), or
 * many rows against 13-64 columns, A's. dnnl_sgemm packs the wide
 * operand as if the product were large and read nn.Linear's weight at
 * 7-12 GB/s on an Intel Xeon with AVX-512 (2 threads, weights from
 * memory, C = x . W^T or C^T = W . x^T: 32 x 768 x 50257, GPT-2's tied
 * LM head over a 32-token prompt, in 12.9-16.8 ms; 32 x 2048 x 8192 in
 * 5.0-8.8); streamed, each weight element broadcast once against x's
 * packed vectors, 8.3 and 3.9 ms. MobileNetV3's and ResNet-50's
 * pointwise convolutions (NHWC: 6272-100352 pixels against 24-64
 * channels out) run as fast as dnnl_sgemm here, but for 16 channels in
 * (0.95x), so k is at least 32. Rows a block: as many as keep rows x
 * vecs accumulators in 24 of the 32 registers, at most 12 (with 14 the
 * loop read 2x slower). Returns 1 when it applies. */
#define NARROW_MIN 13
#define NARROW_MAX 64
#define NARROW_MIN_WIDE 64

int tcc_cpu_gemm_narrow(const char *isa, int64_t narrow, int64_t wide, int64_t K) {
  return isa && strcmp(isa, "x86-64-v4") == 0 && narrow >= NARROW_MIN && narrow <= NARROW_MAX &&
         wide >= NARROW_MIN_WIDE && wide >= 4 * narrow && K >= 32;
}

static int plan_narrow(const tcc_program *p, const tcc_vx *call, tcc_cpu_gemm *g, const tcc_kernel_config *cfg) {
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  int64_t ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}, c0;
  const char *isa = p->graph->target.isa;
  if (call->dtype != TCC__V1__DTYPE__FLOAT32 || p->graph->nsyms || Bt != 1 ||
      !tcc_gemm_operand_affine(p, call->a, ca, &c0) || !tcc_gemm_operand_affine(p, call->b, cb, &c0))
    return 0;
  /* A's rows streamed (along k: unit stride), or B's (stored [N, K]) */
  int a_wide = tcc_cpu_gemm_narrow(isa, N, M, K) && ca[2] == 1 && ca[1] >= K;
  int b_wide = tcc_cpu_gemm_narrow(isa, M, N, K) && cb[1] == 1 && cb[2] >= K;
  if (!a_wide && !b_wide) return 0;
  int64_t narrow = a_wide ? N : M, wide = a_wide ? M : N;
  int vecs = (int)((narrow + 15) / 16), rows = 24 / vecs;
  g->narrow_b = !a_wide;
  g->narrow_vecs = vecs;
  g->narrow_rows = rows > 12 ? 12 : rows;
  g->narrow_par = cfg && cfg->parallel ? cfg->parallel > 0
                                       : 2.0 * (double)M * (double)N * (double)K >= TCC_GEMM_PARALLEL_FLOPS &&
                                             wide > g->narrow_rows;
  return 1;
}

/* 9 to SPLIT_K_TILED_MAX_ROWS float32 rows against a weight stored
 * [K, N] on AVX-512 (GPT-2's Conv1D over a prompt): dnnl_sgemm and MKL
 * packed the weight and read it at 7-11 GB/s on an Intel Xeon with
 * AVX-512 (2 threads, weights from memory: 32 x 768 x 3072 in 1.2 ms,
 * MKL 0.94); split K as plan_split_k's, each thread streams its run in
 * passes of SPLIT_K_TILED_PASS rows through 8 x 48 register tiles (0.74
 * ms). Returns 1 when it applies. */
#define SPLIT_K_TILED_MAX_ROWS 32
#define SPLIT_K_TILED_PASS 32
static int plan_split_k_tiled(const tcc_program *p, const tcc_vx *call, tcc_cpu_gemm *g,
                              const tcc_kernel_config *cfg) {
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  int64_t ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}, c0;
  const char *isa = p->graph->target.isa;
  if (call->dtype != TCC__V1__DTYPE__FLOAT32 || p->graph->nsyms || Bt != 1 || M <= SPLIT_K_MAX_ROWS ||
      M > SPLIT_K_TILED_MAX_ROWS || N < 48 || K < 16 || !isa || strcmp(isa, "x86-64-v4") != 0 || g->trans[1] ||
      !tcc_gemm_operand_affine(p, call->a, ca, &c0) || !tcc_gemm_operand_affine(p, call->b, cb, &c0) ||
      cb[2] != 1 || cb[1] < N)
    return 0;
  g->split_k_tiled = SPLIT_K_TILED_PASS;
  g->split_k_par = cfg && cfg->parallel ? cfg->parallel > 0
                                        : 2.0 * (double)M * (double)N * (double)K >= TCC_GEMM_PARALLEL_FLOPS;
  return 1;
}

/* Blocks of C that a oneDNN GEMM step shares with the helper thread
 * of a busy machine (share.c): on one thread, while another process
 * holds the other core, oneDNN's GEMMs (BERT-base's at 8 x 128 tokens)
 * had run on the calling thread alone. A block takes up to
 * TCC_CPU_SHARE_COLS of C's columns and as many rows as keep it near
 * TCC_CPU_SHARE_BLOCK_FLOPS and within the helper's tile (16 rows at
 * least, in 16s); chunks run a batch entry's blocks down each block
 * column, so a thread's next block reads the columns of B in its cache.
 * Not shared below TCC_CPU_SHARE_FLOPS or with fewer than 2 blocks. */
static void plan_dnnl_share(tcc_cpu_gemm *g, int64_t Bt, int64_t M, int64_t N, int64_t K) {
  if (2.0 * (double)M * (double)N * (double)K * (double)Bt < TCC_CPU_SHARE_FLOPS) return;
  const int64_t cols = N < TCC_CPU_SHARE_COLS ? N : TCC_CPU_SHARE_COLS;
  int64_t rows = (int64_t)(TCC_CPU_SHARE_BLOCK_FLOPS / (2.0 * (double)cols * (double)K));
  if (rows > TCC_CPU_SHARE_TILE / cols) rows = TCC_CPU_SHARE_TILE / cols;
  rows = rows < 16 ? 16 : rows / 16 * 16;
  if (rows >= M) rows = M;
  const int64_t chunks = Bt * ((M + rows - 1) / rows) * ((N + cols - 1) / cols);
  if (rows * cols > TCC_CPU_SHARE_TILE || chunks < 2 || chunks > TCC_CPU_SHARE_MAX) return;
  g->share_rows = rows;
  g->share_cols = cols;
}

/* The road and threading of an extern GEMM step, C[b] = A[b] . B[b]:
 * oneDNN's dnnl_sgemm for float32 (when tcc_onednn_enabled), else
 * cblas_?gemm. A tuning config may pin OpenBLAS's threads, or run the
 * batch in parallel with one BLAS thread per GEMM. Without one, a GEMM of
 * at least TCC_GEMM_PARALLEL_FLOPS runs on the kernels' OpenMP threads
 * (the pool PyTorch's ops use too): the batch in parallel, or (OpenBLAS)
 * one GEMM cut into a slab of rows (of columns when C has fewer than 16
 * rows and more columns) per thread, each a one-thread BLAS call.
 * Dynamic programs keep one shape of code. */
static void plan_gemm(const tcc_program *p, const tcc_kernel *k, int kno, tcc_cpu_gemm *g) {
  const tcc_store *st = &k->stores[0];
  const tcc_vx *call = st->value;
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  /* layout of each operand over (b, row, col) */
  const tcc_vx *ops[2] = {call->a, call->b};
  int64_t rows[2] = {M, K}, cols[2] = {K, N};
  for (int o = 0; o < 2; o++) {
    int64_t coef[3] = {0, 0, 0}, c0;
    tcc_gemm_operand_affine(p, ops[o], coef, &c0);
    int64_t R = rows[o], C = cols[o], cr = coef[1], cc = coef[2];
    int64_t mc = C > 1 ? C : 1, mr = R > 1 ? R : 1;
    if ((cc == 1 || C == 1) && (R == 1 || cr >= mc)) {
      g->trans[o] = 0;
      g->ld[o] = R == 1 ? mc : cr;
    } else {
      g->trans[o] = 1;
      g->ld[o] = C == 1 ? mr : cc;
    }
  }
  const tcc_kernel_config *cfg = tcc_kernel_config_of(p, kno);
  int auto_par = !cfg && !p->graph->nsyms &&
                 2.0 * (double)M * (double)N * (double)K * (double)Bt >= TCC_GEMM_PARALLEL_FLOPS;
  if (plan_stream_rows(p, call, g, cfg) || plan_split_k(p, call, g, cfg) || plan_split_k_tiled(p, call, g, cfg) ||
      plan_narrow(p, call, g, cfg))
    return;
  g->onednn = call->dtype == TCC__V1__DTYPE__FLOAT32 && tcc_onednn_enabled();
  g->batch_par = Bt > 1 && ((cfg && cfg->parallel > 0) || auto_par);
  if (g->onednn) {
    g->serial = cfg && cfg->parallel < 0;
    if (!g->serial && !p->graph->nsyms) plan_dnnl_share(g, Bt, M, N, K);
    return;
  }
  g->slab_par = Bt == 1 && auto_par && (M > 1 || N > 1);
  g->by_rows = M >= N || M >= 16;
  g->blas_threads = g->batch_par || g->slab_par ? 1 : !cfg ? 0 : cfg->parallel < 0 ? 1 : cfg->blas_threads;
}

/* ------------------------------------------------------------ the pass */

int tcc_cpu_schedule_pass(tcc_program *p, tcc_error *err) {
  for (int bi = 0; bi < p->nbufs; bi++)
    if (!p->bufs[bi].dead && !tcc_cpu_ctype(p->bufs[bi].layout.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "%s tensors are not supported by the CPU "
                           "backend yet", tcc_dtype_name(p->bufs[bi].layout.dtype));
  tcc_cpu_schedule *s = tcc_arena_alloc(p->arena, sizeof *s);
  tcc_cpu_access *acc = malloc(sizeof *acc * TCC_CPU_MAX_ACCESS);
  if (!s || !acc || !(s->kernels = tcc_arena_array(p->arena, (size_t)p->nkernels + 1, sizeof *s->kernels))) {
    free(acc);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory scheduling");
  }
  memset(s->kernels, 0, sizeof *s->kernels * ((size_t)p->nkernels + 1));
  s->has_conv = s->has_dnnl_gemm = s->has_cblas = s->threaded = 0;
  int rc = 0;
  for (int k = 0, kno = 0; k < p->nkernels && !rc; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    tcc_cpu_kernel_schedule *ks = &s->kernels[k];
    ks->live = 1;
    ks->kno = kno++;
    ks->par = ks->peel_loop = ks->range_loop = -1;
    if (K->kind == TCC_OPK_EXTERN) {
      const tcc_store *st = &K->stores[0];
      const tcc_vx *call = st->value;
      int *used = tcc_arena_array(p->arena, 3, sizeof *used);
      if (!used) {
        rc = -1;
        break;
      }
      add_buf(used, &ks->nused, call->a->buf);
      add_buf(used, &ks->nused, call->b->buf);
      add_buf(used, &ks->nused, st->buf);
      ks->used = used;
      if (call->i == TCC_EXT_INDEX_ADD_ROWS) {
        s->threaded = 1;
        continue;
      }
      if (call->i != TCC_EXT_GEMM) {
        s->has_conv = s->threaded = 1;
        continue;
      }
      plan_gemm(p, K, ks->kno, &ks->gemm);
      if (ks->gemm.onednn) s->has_dnnl_gemm = 1;
      else if (!ks->gemm.stream_rows && !ks->gemm.split_k && !ks->gemm.split_k_tiled && !ks->gemm.narrow_rows)
        s->has_cblas = 1;
      if (ks->gemm.batch_par || ks->gemm.slab_par || ks->gemm.stream_par || ks->gemm.split_k_par || ks->gemm.narrow_par ||
          (ks->gemm.onednn && !ks->gemm.serial))
        s->threaded = 1;
      continue;
    }
    planner ke = {.p = p, .k = K, .ks = ks, .acc = acc};
    if (tcc_cpu_fv_init(&ke.fv, p->arena)) rc = -1;
    else rc = plan_kernel(&ke);
    ks->acc = ke.nacc ? tcc_arena_array(p->arena, (size_t)ke.nacc, sizeof *ks->acc) : NULL;
    if (!rc && ke.nacc && !ks->acc) rc = -1;
    if (!rc && ke.nacc) memcpy(ks->acc, acc, sizeof *acc * (size_t)ke.nacc);
    ks->nacc = ke.nacc;
    if (ks->par >= 0) s->threaded = 1;
    tcc_cpu_fv_free(&ke.fv);
  }
  free(acc);
  if (rc) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory scheduling");
  p->sched.cpu = s;
  return 0;
}

/* ------------------------------------------------------ check and dump */

int tcc_cpu_schedule_check(const tcc_program *p, tcc_error *err) {
  const tcc_cpu_schedule *s = p->sched.cpu;
  if (!s) return tcc_error_set(err, TCC_E_INTERNAL, "no CPU schedule");
  for (int k = 0, kno = 0; k < p->nkernels; k++) {
    const tcc_kernel *K = &p->kernels[k];
    const tcc_cpu_kernel_schedule *ks = &s->kernels[k];
    if (ks->live != !K->dead) return tcc_error_set(err, TCC_E_INTERNAL, "kernel %d: liveness", k);
    if (K->dead) continue;
    if (ks->kno != kno++) return tcc_error_set(err, TCC_E_INTERNAL, "kernel %d: numbered out of order", k);
    for (int i = 1; i < ks->nused; i++)
      if (ks->used[i - 1] >= ks->used[i]) return tcc_error_set(err, TCC_E_INTERNAL, "k%d: buffers unsorted", ks->kno);
    for (int st = 0; st < K->nstores; st++) {
      int have = 0;
      for (int i = 0; i < ks->nused; i++) have |= ks->used[i] == K->stores[st].buf;
      if (!have) return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a stored buffer is not declared", ks->kno);
    }
    if (K->kind == TCC_OPK_EXTERN) {
      const tcc_cpu_gemm *g = &ks->gemm;
      if ((g->slab_par && g->batch_par) || (g->onednn && (g->slab_par || g->blas_threads)))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: GEMM threaded two ways", ks->kno);
      if (g->stream_rows && (g->onednn || g->batch_par || g->slab_par || g->trans[0] || !g->trans[1] ||
                             (g->stream_width != 8 && g->stream_width != 16) || g->stream_kc < 0 ||
                             g->stream_kc % 64))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a streamed GEMM on a library's road", ks->kno);
      if ((g->split_k && g->split_k_tiled) || (g->split_k_tiled && (g->onednn || g->stream_rows)))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a GEMM split K two ways", ks->kno);
      if (g->narrow_rows && (g->onednn || g->batch_par || g->slab_par || g->stream_rows || g->split_k || g->split_k_tiled ||
                             g->narrow_vecs < 1 || g->narrow_vecs > NARROW_MAX / 16 ||
                             g->narrow_rows * g->narrow_vecs > 24))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a narrow GEMM on another road", ks->kno);
      if ((g->share_rows || g->share_cols) &&
          (!g->onednn || g->serial || g->share_rows < 1 || g->share_cols < 1 ||
           g->share_rows * g->share_cols > TCC_CPU_SHARE_TILE))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a shared GEMM off oneDNN's road", ks->kno);
      continue;
    }
    const tcc_cpu_nest *pl = &ks->nest;
    if (pl->nloops < 0 || pl->nloops > TCC_MAX_DIMS)
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: %d loops", ks->kno, pl->nloops);
    int seen[TCC_MAX_DIMS] = {0};
    for (int j = 0; j < pl->nloops; j++) {
      int64_t size = 1;
      for (int i = 0; i < pl->ndims[j]; i++) {
        int d = pl->dims[j][i];
        if (d < 0 || d >= K->rank || seen[d]++)
          return tcc_error_set(err, TCC_E_INTERNAL, "k%d: loop %d runs dim %d twice or out of range", ks->kno, j, d);
        size *= K->sizes[d];
      }
      if (size != pl->size[j])
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: loop %d runs %" PRId64 " of its dims' %" PRId64 " iterations",
                             ks->kno, j, pl->size[j], size);
    }
    for (int d = 0; d < K->rank; d++)
      if (!seen[d] && K->sizes[d] != 1)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: dim %d has no loop", ks->kno, d);
    if (ks->par < -1 || ks->par >= pl->nloops || (ks->par >= 0 && pl->size[ks->par] < 2))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: parallel loop %d of %d", ks->kno, ks->par, pl->nloops);
    int elem = pl->nloops - 1;
    if ((ks->simd || ks->unroll) && (elem < 0 || elem == ks->par))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: simd or unroll on the parallel loop", ks->kno);
    if (ks->simd && ks->inner_red && !ks->window_unrolled)
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: simd around a reduction loop", ks->kno);
    if (ks->window_unrolled && (!ks->inner_red || ks->col_block))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: unrolled windows without a window", ks->kno);
    if (ks->col_block && (!ks->inner_red || ks->simd || ks->peel_loop >= 0 || ks->kept_red || pl->affine))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: column sums with another element-loop plan", ks->kno);
    if (ks->peel_loop >= 0 && (ks->peel_loop != elem || ks->peel_loop == ks->par || !ks->npeel || pl->affine))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: peeling loop %d", ks->kno, ks->peel_loop);
    if (ks->range_loop >= 0) {
      int j = ks->range_loop, ok = j < pl->nloops && !pl->affine && pl->ndims[j] == 1 && ks->nranges >= 2 &&
                                 ks->nranges <= (j == ks->par ? TCC_CPU_PAR_RANGES : TCC_CPU_MAX_RANGES) &&
                                 ks->peel_loop < 0 && !ks->col_block && !ks->prefetch_elem && !ks->inner_red &&
                                 ks->range_at[0] == 0 && ks->range_at[ks->nranges] == pl->size[j];
      for (int r = 0; ok && r < ks->nranges; r++) ok = ks->range_at[r] < ks->range_at[r + 1];
      for (int i = 0; ok && i < ks->nnodes; i++) ok = ks->nodes[i]->op != TCC_PRIM_REDUCE;
      if (!ok) return tcc_error_set(err, TCC_E_INTERNAL, "k%d: range split of loop %d in %d ranges", ks->kno, j, ks->nranges);
    }
    for (int i = 0; i < ks->nnodes; i++)
      if (ks->levels[i] < 0 || ks->levels[i] > pl->nloops + 1)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a node at loop level %d of %d", ks->kno, ks->levels[i],
                             pl->nloops);
    for (int i = 0; i < ks->nnodes; i++) {
      int l = ks->red_lead[i];
      if ((l >= 0) != (ks->nodes[i]->op == TCC_PRIM_REDUCE) || l > i ||
          (l >= 0 && (ks->red_lead[l] != l || ks->levels[l] != ks->levels[i])))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: node %d in the reduction group of node %d", ks->kno, i, l);
    }
    for (int i = 0; i < ks->nnodes; i++)
      if (ks->red_merged[i] && (ks->nodes[i]->op != TCC_PRIM_REDUCE || ks->nodes[i]->nidx < 2))
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: node %d merges loops it does not have", ks->kno, i);
    if (ks->prefetch_elem && (ks->prefetch_red || !ks->simd || ks->peel_loop >= 0 || elem == ks->par))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a blocked element loop that cannot be", ks->kno);
    if (ks->staged_red && (ks->staged_red->op != TCC_PRIM_REDUCE || ks->staged_red->nidx != 1 ||
                           ks->staged_red_node != ks->staged_red->a || !ks->staged_idx || !ks->staged_next_node ||
                           !ks->staged_next_idx || K->nstores != 1 || (ks->kept_red && ks->staged_node)))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a staged row that cannot be", ks->kno);
    if ((ks->prefetch_red || ks->prefetch_elem) && (ks->nprefetch < 1 || ks->nprefetch > TCC_CPU_PREFETCH || ks->row_var < 0 ||
                             ks->row_var >= K->rank || ks->row_n != K->sizes[ks->row_var] || ks->row_n < 2 ||
                             ks->row_ahead < 1 || ks->row_ahead >= ks->row_n ||
                             (ks->prefetch_red && (ks->prefetch_red->op != TCC_PRIM_REDUCE ||
                                                   ks->prefetch_red->nidx != 1))))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a next-row prefetch without a row", ks->kno);
    for (int i = 0; i < ks->nprefetch; i++)
      if (ks->prefetch[i].buf < 0 || ks->prefetch[i].buf >= p->nbufs || ks->prefetch[i].step < 1)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: prefetch stream %d", ks->kno, i);
    if ((ks->store_prefetch_red != NULL) != (ks->nstore_prefetch > 0) || ks->nstore_prefetch > TCC_CPU_PREFETCH ||
        (ks->store_prefetch_red && (!(ks->prefetch_red || ks->prefetch_elem) || ks->kept_red ||
                                    ks->store_prefetch_red->op != TCC_PRIM_REDUCE || ks->store_prefetch_red->nidx != 1)))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: a stores' prefetch without a row pass", ks->kno);
    for (int i = 0; i < ks->nstore_prefetch; i++)
      if (ks->store_prefetch[i].buf < 0 || ks->store_prefetch[i].buf >= p->nbufs || ks->store_prefetch[i].step < 1)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: store prefetch stream %d", ks->kno, i);
    if (ks->nexp_le0 < 0 || ks->nexp_le0 > TCC_CPU_EXP_LE0 || (ks->nexp_le0 && !ks->inline_exp))
      return tcc_error_set(err, TCC_E_INTERNAL, "k%d: %d exps <= 0 noted", ks->kno, ks->nexp_le0);
    for (int i = 0; i < ks->nexp_le0; i++)
      if (ks->exp_le0[i]->op != TCC_PRIM_EXP || ks->exp_le0[i]->a->op != TCC_PRIM_SUB ||
          ks->exp_le0[i]->a->b->op != TCC_PRIM_REDUCE || ks->exp_le0[i]->a->b->i != TCC_RED_MAX)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: exp %d noted <= 0 is not of x - max", ks->kno, i);
    for (int st = 0; st < K->nstores; st++)
      if (ks->store_levels[st] < 0 || ks->store_levels[st] > pl->nloops)
        return tcc_error_set(err, TCC_E_INTERNAL, "k%d: store %d at loop level %d of %d", ks->kno, st,
                             ks->store_levels[st], pl->nloops);
  }
  return 0;
}

void tcc_cpu_schedule_dump(const tcc_program *p, tcc_buf *b) {
  const tcc_cpu_schedule *s = p->sched.cpu;
  if (!s) return;
  tcc_buf_printf(b, "cpu schedule%s%s%s%s\n", s->has_conv ? ", oneDNN convolutions" : "",
                 s->has_dnnl_gemm ? ", oneDNN GEMMs" : "", s->has_cblas ? ", OpenBLAS GEMMs" : "",
                 s->threaded ? ", thread governor" : "");
  for (int k = 0; k < p->nkernels; k++) {
    const tcc_kernel *K = &p->kernels[k];
    const tcc_cpu_kernel_schedule *ks = &s->kernels[k];
    if (!ks->live) continue;
    tcc_buf_printf(b, "  k%d (kernel %d):", ks->kno, k);
    if (K->kind == TCC_OPK_EXTERN) {
      const tcc_cpu_gemm *g = &ks->gemm;
      if (K->stores[0].value->i == TCC_EXT_INDEX_ADD_ROWS) {
        tcc_buf_puts(b, " row index-add, column blocks in parallel\n");
        continue;
      }
      if (K->stores[0].value->i != TCC_EXT_GEMM) {
        tcc_buf_puts(b, " oneDNN convolution\n");
        continue;
      }
      if (g->stream_rows) {
        tcc_buf_printf(b, " GEMM streaming B's rows, %d a block, %d-float vectors, A ld %" PRId64
                          ", B^T ld %" PRId64 "%s", g->stream_rows, g->stream_width, g->ld[0], g->ld[1],
                       g->stream_par ? ", blocks in parallel" : "");
        if (g->stream_kc)
          tcc_buf_printf(b, ", k in chunks of %" PRId64 " through groups of %d blocks", g->stream_kc,
                         TCC_CPU_STREAM_GROUP);
        tcc_buf_puts(b, "\n");
        continue;
      }
      if (g->split_k_tiled) {
        tcc_buf_printf(b, " GEMM splitting K, passes of %d rows through 8 x 48 tiles%s\n", g->split_k_tiled,
                       g->split_k_par ? ", on the threads" : "");
        continue;
      }
      if (g->narrow_rows) {
        tcc_buf_printf(b, " GEMM streaming %s's rows, %d a block, against %s packed in %d vectors a k%s\n",
                       g->narrow_b ? "B^T" : "A", g->narrow_rows, g->narrow_b ? "A^T" : "B", g->narrow_vecs,
                       g->narrow_par ? ", blocks in parallel" : "");
        continue;
      }
      tcc_buf_printf(b, " GEMM by %s, A%s ld %" PRId64 ", B%s ld %" PRId64 "%s%s%s", g->onednn ? "oneDNN" : "OpenBLAS",
                     g->trans[0] ? "^T" : "", g->ld[0], g->trans[1] ? "^T" : "", g->ld[1],
                     g->batch_par ? ", batch in parallel" : "",
                     g->slab_par ? (g->by_rows ? ", row slabs per thread" : ", column slabs per thread") : "",
                     g->serial ? ", one thread" : "");
      if (g->blas_threads) tcc_buf_printf(b, ", %d BLAS thread%s", g->blas_threads, g->blas_threads == 1 ? "" : "s");
      if (g->share_rows)
        tcc_buf_printf(b, ", shared busy in %" PRId64 " x %" PRId64 " blocks", g->share_rows, g->share_cols);
      tcc_buf_puts(b, "\n");
      continue;
    }
    const tcc_cpu_nest *pl = &ks->nest;
    tcc_buf_printf(b, " %s nest", pl->affine ? "planned" : pl->permuted ? "stride-order" : "dim-order");
    for (int j = 0; j < pl->nloops; j++) {
      tcc_buf_printf(b, " %s%" PRId64 "(", j ? "x " : "[", pl->size[j]);
      for (int i = 0; i < pl->ndims[j]; i++) tcc_buf_printf(b, "%si%d", i ? "," : "", pl->dims[j][i]);
      tcc_buf_puts(b, ")");
    }
    tcc_buf_puts(b, pl->nloops ? "]" : " []");
    if (ks->par >= 0)
      tcc_buf_printf(b, "; parallel loop %d%s", ks->par, ks->par_at_run_time ? " (if the work is large)" : "");
    if (ks->tuned && (ks->threads || ks->chunk))
      tcc_buf_printf(b, " threads %d chunk %d", ks->threads, ks->chunk);
    if (ks->simd) tcc_buf_puts(b, "; simd element loop");
    if (ks->simdlen) tcc_buf_printf(b, " simdlen %d", ks->simdlen);
    if (ks->unroll) tcc_buf_printf(b, "; element loop unrolled %d", ks->unroll);
    if (ks->inner_red) tcc_buf_puts(b, "; reduction in the element loop");
    if (ks->col_block) tcc_buf_printf(b, " (column sums, blocks of %d)", ks->col_block);
    if (ks->window_unrolled) tcc_buf_puts(b, " (windows unrolled)");
    if (ks->peel_loop >= 0) tcc_buf_printf(b, "; loop %d peeled around %d clamps", ks->peel_loop, ks->npeel);
    if (ks->range_loop >= 0) tcc_buf_printf(b, "; loop %d in %d ranges", ks->range_loop, ks->nranges);
    if (ks->inline_exp) tcc_buf_puts(b, ks->inline_exp == TCC_CPU_EXP_MASKED ? "; masked exps inline" : "; exps inline");
    if (ks->nexp_le0) tcc_buf_printf(b, " (%d of x - max(x))", ks->nexp_le0);
    if (ks->prefetch_red || ks->prefetch_elem)
      tcc_buf_printf(b, "; row %" PRId64 " on prefetched (%d stream%s%s)", ks->row_ahead, ks->nprefetch,
                     ks->nprefetch == 1 ? "" : "s", ks->prefetch_elem ? ", element loop in blocks" : "");
    if (ks->nstore_prefetch)
      tcc_buf_printf(b, "; stores prefetched (%d stream%s)", ks->nstore_prefetch, ks->nstore_prefetch == 1 ? "" : "s");
    if (ks->kept_node) tcc_buf_puts(b, "; a sum's summands kept in the output");
    if (ks->staged_red) tcc_buf_puts(b, "; a reduction's argument staged in the output");
    if (ks->ncol_vals) tcc_buf_printf(b, "; %d column value%s", ks->ncol_vals, ks->ncol_vals == 1 ? "" : "s");
    int merged = 0;
    for (int i = 0; i < ks->nnodes; i++) merged += ks->red_merged[i];
    if (merged) tcc_buf_printf(b, "; %d reduction%s with merged inner loops", merged, merged == 1 ? "" : "s");
    tcc_buf_printf(b, "; %d accesses, %d buffers\n", ks->nacc, ks->nused);
    /* where values are computed: per loop level, values (of which reductions) */
    for (int lv = 0; lv <= pl->nloops + 1; lv++) {
      int n = 0, red = 0, loops = 0, stores = 0;
      for (int i = 0; i < ks->nnodes; i++)
        if (ks->levels[i] == lv) n++, red += ks->nodes[i]->op == TCC_PRIM_REDUCE, loops += ks->red_lead[i] == i;
      for (int st = 0; st < K->nstores; st++) stores += ks->store_levels[st] == lv;
      if (n || stores)
        tcc_buf_printf(b, "    level %d: %d values (%d reductions in %d loops), %d stores\n", lv, n, red, loops,
                       stores);
    }
  }
}
