/*
 * fuse.c — turn one-kernel-per-node into few kernels.
 *
 * Requires: a checked program whose kernels are in dependency order (a
 * kernel reads only buffers written by earlier kernels), as lower.c makes.
 * Produces: the same computation with
 *   1. inlining: a load of a buffer that one pointwise store writes at the
 *      identity index is replaced by the stored expression, substituted at
 *      the load's index (recompute instead of a round trip through memory;
 *      broadcasting reads become index arithmetic). A producer stays a
 *      load when its expression is deeper than TCC_MAX_EXPR_DEPTH / 2
 *      (which bounds expression depth), or when several kernels read it
 *      and it has more than TCC_MAX_SHARED_INLINE_OPS operations or, of
 *      TCC_STREAM_MIN_ELEMENTS elements or more, loads more than
 *      TCC_MAX_SHARED_INLINE_STREAMS buffers of at least half its size
 *      (compute once, read many: a pre-LN transformer's residual stream
 *      x + y1 + y2 + ... was recomputed whole in every later layer norm,
 *      in each of its passes), or when its buffer is stored anyway (a graph
 *      output, read by an EXTERN step such as a GEMM, or by a kernel
 *      that kept its load), its expression
 *      has more than TCC_MATERIALIZED_INLINE_OPS operations and the
 *      consumer cannot merge with it (a reduction, another iteration
 *      space, or a reader of what a kernel in between writes that stays
 *      there: an EXTERN step, a reduction over another space):
 *      recomputing a GELU backward's tanh inside a bias-grad reduction
 *      cost more than the whole GEMM it fed, and DenseNet's backward
 *      gathered its stem max pool's 2x2 windows twice, around the batch
 *      norm's per-channel sums. And it stays a
 *      load when it has more than TCC_AMPLIFIED_INLINE_OPS operations and
 *      the consumer's loops that the load's index depends on cover at
 *      least TCC_AMPLIFIED_FACTOR times as many elements as the
 *      producer's buffer holds (amplified): a convolution's im2col
 *      packing reads each element once per kernel tap, so a batch-norm
 *      backward inlined into it ran 9 times per element. A broadcasting
 *      read is not amplified (its index ignores the loops it broadcasts
 *      over, and cpu/emit.c hoists the value out of them) unless a loop
 *      it ignores lies between two it reads (gap_runs: the kernel's dims,
 *      then the bound variables of a reduction): nothing hoists the value
 *      out of that one. A producer that computes something costly (a
 *      division, square root or transcendental function) read across
 *      such loops of TCC_AMPLIFIED_FACTOR iterations or more stays a
 *      load: the torch.compile tutorial's numpy program sums an outer
 *      product, einsum('ij,ik->ijk', xn, yn) over j and k, and divided
 *      by yn's standard deviation 640 times per element of yn. Cheap
 *      ones (an attention mask read across the query rows) stay inlined.
 *      A producer holding a reduction (REDUCE) is inlined only where the
 *      reduction stays computed once per element of its own result: the
 *      load reads it at plain loop variables of the consumer that form a
 *      prefix of the consumer's loop nest (cpu/emit.c runs loops in dim
 *      order and hoists each value out of the loops it does not depend
 *      on), never at a reduction's bound variables. So softmax's max and
 *      sum end inside the one kernel that writes the result, computed
 *      once per row. It stays a load when an EXTERN kernel sits between
 *      its first and last reader (those readers cannot all merge into
 *      one kernel, so each would run the reduction again: a strided
 *      convolution's grad-input gather was computed three times in a
 *      ResNet backward).
 *   2. dead buffers: stores to temporaries nothing reads any more are
 *      dropped, and kernels left without stores die. Then a CPU GEMM
 *      step whose result only a plain copy reads, into an output of the
 *      same contiguous layout, writes that output itself
 *      (gemm_into_outputs): a weight gradient's copy.
 *   3. merging: a kernel joins the nearest earlier live kernel whose
 *      iteration space equals its own, or extends it or is extended by it
 *      in the prefix sense (the sizes other than 1 of the smaller space
 *      lead those of the larger: [N, 1] merges into [N, D], a row
 *      statistic stored once per row), when no kernel in between (the
 *      target included) writes what it reads, reads what it writes or
 *      writes what it writes. Spaces of different sizes merge only when
 *      the two kernels read a common buffer (a row statistic and the rows
 *      it summarizes), never an unrelated total into a large kernel: the
 *      CUDA target folds a kernel's reductions by row, so a 0-d sum merged
 *      into a batch norm left it one block for the whole tensor. EXTERN
 *      kernels never merge, nor kernels that store at an index read from
 *      a tensor (index_put_ into a graph input).
 * Outputs stay stored exactly once.
 *
 * With the environment variable TCC_NO_FUSION set (benchmarks: each op
 * its own kernel), steps 1 and 3 are skipped. It is not part of the
 * guard key: use it with a private cache.
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>

typedef struct fuse_ctx {
  tcc_program *p;
  const tcc_kernel *k;       /* the consumer being rewritten */
  int kid;                   /* its index */
  const tcc_vx **producer;   /* per buffer: inlinable stored expression */
  int *producer_kernel;      /* per buffer: the kernel storing producer */
  int *writers;              /* per buffer: number of stores writing it */
  int *readers;              /* per buffer: kernels loading it before fusion */
  char *stored;              /* per buffer: stored whatever fusion does (an
                                output, an EXTERN kernel's operand, or a
                                load an earlier consumer kept) */
  char *split;               /* per buffer: an EXTERN kernel between its
                                first and last reader */
  int *last_writer;          /* per buffer: the last kernel storing it */
  int *visited;              /* per kernel: apart_from_producer's mark */
  int mark;                  /* its last call's */
  int **reads;               /* per kernel: the buffers it loads, before */
  int *nreads;               /*   fusion (step 1 reads its consumer's) */
  const tcc_vx **bound;      /* per variable: the consumer's REDUCE that
                                binds it, or NULL (gap_runs) */
  int nbound;                /* its entries (p->next_var) */
} fuse_ctx;

static int has_value_ix(const tcc_ix *e) {
  if (!e) return 0;
  if (e->kind == TCC_IX_VALUE) return 1;
  return has_value_ix(e->a) || has_value_ix(e->b);
}

/* Does K store at an index read from a tensor (index_put_ into an
 * input)? Such a kernel merges with no other: its stores are guarded
 * (cpu/emit.c, cuda/emit.c) in the plain element loop it keeps. */
static int stores_at_values(const tcc_program *p, const tcc_kernel *K) {
  for (int s = 0; s < K->nstores; s++)
    for (int d = 0; d < p->bufs[K->stores[s].buf].layout.rank; d++)
      if (has_value_ix(K->stores[s].idx[d])) return 1;
  return 0;
}

static int same_space(const tcc_kernel *A, const tcc_kernel *B) {
  if (A->rank != B->rank) return 0;
  for (int d = 0; d < A->rank; d++)
    if (A->sizes[d] != B->sizes[d]) return 0;
  return 1;
}

/* Is the current consumer one that cannot merge with the kernel storing
 * `buf`: a reduction, a different iteration space, or one that depends
 * on a kernel in between that stays there (an EXTERN step, or a
 * reduction over another space: a batch norm backward's per-channel sums
 * between a max pool's backward and the normalization that reads both),
 * directly or through kernels in between that it inlines? */
static int apart_from_producer(fuse_ctx *fc, int buf) {
  const tcc_program *p = fc->p;
  const int pk = fc->producer_kernel[buf];
  const tcc_kernel *P = &p->kernels[pk], *C = fc->k;
  if (C->kind != TCC_OPK_POINTWISE || !same_space(C, P)) return 1;
  int stack[64], sp = 0, mark = ++fc->mark;
  stack[sp++] = fc->kid;
  while (sp) {
    int k = stack[--sp];
    for (int i = 0; i < fc->nreads[k]; i++) {
      int w = fc->last_writer[fc->reads[k][i]];
      if (w <= pk || w >= fc->kid || fc->visited[w] == mark) continue;
      fc->visited[w] = mark;
      const tcc_kernel *X = &p->kernels[w];
      if (X->kind == TCC_OPK_EXTERN) return 1;
      if (!same_space(X, C))
        for (int s = 0; s < X->nstores; s++)
          if (tcc_vx_has_reduce(X->stores[s].value)) return 1;
      if (sp == 64) return 1;   /* too far to tell: keep the load */
      stack[sp++] = w;
    }
  }
  return 0;
}

/* Would the current consumer compute the producer of `buf`, read through
 * `load`, at least TCC_AMPLIFIED_FACTOR times per element of `buf`? Counts
 * the consumer's loops the load's index depends on (a bound variable of a
 * reduction is not counted: those loads stay as before). */
static int amplified(const fuse_ctx *fc, int buf, const tcc_vx *load) {
  uint32_t vars = 0;
  for (int d = 0; d < load->nidx; d++) vars |= tcc_ix_kernel_vars(load->idx[d]);
  double varying = 1, numel = 1;
  for (int d = 0; d < fc->k->rank; d++)
    if (vars & (1u << d)) varying *= (double)fc->k->sizes[d];
  const tcc_meta *m = &fc->p->bufs[buf].layout;
  for (int d = 0; d < m->rank; d++) numel *= (double)m->sizes[d];
  return varying >= TCC_AMPLIFIED_FACTOR * numel;
}

/* Notes in fc->bound the REDUCEs of e (the current consumer's). Returns
 * 0 or -1 (out of memory). */
static int note_reduces(fuse_ctx *fc, const tcc_vx *e, tcc_ptrmap *seen) {
  if (!e || tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_EXTERN) return 0;
  if (e->op == TCC_PRIM_REDUCE)
    for (int r = 0; r < e->nidx; r++)
      if (e->buf + r < fc->nbound) fc->bound[e->buf + r] = e;
  if (note_reduces(fc, e->a, seen) || note_reduces(fc, e->b, seen)) return -1;
  return note_reduces(fc, e->c, seen);
}

/* The bound variables index x reads, as bits by position in their REDUCE
 * (*red); *mixed is set when x reads those of two REDUCEs. */
static uint32_t bound_reads(const fuse_ctx *fc, const tcc_ix *x, const tcc_vx **red, int *mixed) {
  if (!x || x->kind == TCC_IX_VALUE) return 0;
  if (x->kind == TCC_IX_VAR) {
    const tcc_vx *r = x->var >= TCC_FIRST_BOUND_VAR && x->var < fc->nbound ? fc->bound[x->var] : NULL;
    if (!r) return 0;
    if (*red && *red != r) *mixed = 1;
    *red = r;
    return 1u << (x->var - r->buf);
  }
  return bound_reads(fc, x->a, red, mixed) | bound_reads(fc, x->b, red, mixed);
}

/* How many times the current consumer computes a value read through
 * `load` over loops it does not read that lie between loops it reads
 * (cpu/emit.c hoists a value out of the loops inside the innermost one
 * it reads, never out of one between two it reads). The loops, outermost
 * first: the kernel's dims, then those of the REDUCE whose bound
 * variables the index reads (1 when it reads two REDUCEs'). A value read
 * at [i, k] in a kernel over [i, j, k] runs again for every j. */
static double gap_runs(const fuse_ctx *fc, const tcc_vx *load) {
  uint32_t kvars = 0, bvars = 0;
  const tcc_vx *red = NULL;
  int mixed = 0;
  for (int d = 0; d < load->nidx; d++) {
    kvars |= tcc_ix_kernel_vars(load->idx[d]);
    bvars |= bound_reads(fc, load->idx[d], &red, &mixed);
  }
  if (mixed) return 1;
  const int nk = fc->k->rank, n = nk + (red ? red->nidx : 0);
  double runs = 1, pending = 1;
  int seen = 0;
  for (int l = 0; l < n; l++) {
    int64_t size = l < nk ? fc->k->sizes[l] : red->idx[l - nk]->c;
    int reads = l < nk ? (kvars >> l) & 1 : (bvars >> (l - nk)) & 1;
    if (size <= 1) continue;
    if (!reads) pending *= (double)size;
    else {
      if (seen) runs *= pending;
      seen = 1;
      pending = 1;
    }
  }
  return runs;
}

/* Is store s of kernel k an identity write of its whole buffer? */
static int identity_store(const tcc_program *p, const tcc_kernel *k, const tcc_store *s) {
  const tcc_meta *m = &p->bufs[s->buf].layout;
  if (k->kind != TCC_OPK_POINTWISE || k->rank != m->rank) return 0;
  for (int d = 0; d < m->rank; d++)
    if (k->sizes[d] != m->sizes[d] || s->idx[d]->kind != TCC_IX_VAR || s->idx[d]->var != d)
      return 0;
  return 1;
}

/* Kernel variables the top-level REDUCEs of e depend on (bit mask). */
static int reduce_vars(const tcc_vx *e, tcc_ptrmap *seen, uint32_t *mask) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_REDUCE) {
    *mask |= tcc_vx_kernel_vars(e);
    return 0;
  }
  if (e->op == TCC_PRIM_EXTERN) return 0;
  if (e->a && reduce_vars(e->a, seen, mask)) return -1;
  if (e->b && reduce_vars(e->b, seen, mask)) return -1;
  if (e->c && reduce_vars(e->c, seen, mask)) return -1;
  return 0;
}

/* May producer `prod` (holding REDUCEs) be inlined at `load` in the
 * current consumer without recomputing its reductions (file header)? */
static int reduce_inline_ok(fuse_ctx *fc, const tcc_vx *prod, const tcc_vx *load) {
  if (!tcc_vx_has_reduce(prod)) return 1;
  if (fc->split[load->buf]) return 0;
  tcc_ptrmap seen;
  uint32_t pm = 0, cm = 0;
  if (tcc_ptrmap_init(&seen, 64) || reduce_vars(prod, &seen, &pm)) {
    tcc_ptrmap_free(&seen);
    return 0;
  }
  tcc_ptrmap_free(&seen);
  for (int d = 0; d < load->nidx; d++) {
    if (!(pm & (1u << d))) continue;
    const tcc_ix *x = load->idx[d];
    if (x->kind == TCC_IX_CONST) continue;
    if (x->kind != TCC_IX_VAR || x->var >= fc->k->rank) return 0;
    cm |= 1u << x->var;
  }
  int top = -1;
  for (int d = 0; d < fc->k->rank; d++)
    if (cm & (1u << d)) top = d;
  for (int d = 0; d < top; d++)
    if (fc->k->sizes[d] != 1 && !(cm & (1u << d))) return 0;
  return 1;
}

static const tcc_vx *inline_rec(fuse_ctx *fc, tcc_ptrmap *memo, const tcc_vx *e);

/* The buffers of at least `numel` / 2 elements that e loads, added to
 * set[0..*n) (at most cap; a select adds its condition's and its larger
 * branch's: each element reads one branch). Index values (gathers) are
 * not counted. Returns *n, or cap + 1 when the set overflows. */
static int streams(const tcc_program *p, const tcc_vx *e, double numel, int *set, int *n, int cap) {
  if (!e || *n > cap || e->op == TCC_PRIM_EXTERN) return *n;
  if (e->op == TCC_PRIM_LOAD) {
    if ((double)p->bufs[e->buf].layout.numel * 2 < numel) return *n;
    for (int i = 0; i < *n; i++)
      if (set[i] == e->buf) return *n;
    if (*n == cap) return *n = cap + 1;
    set[(*n)++] = e->buf;
    return *n;
  }
  streams(p, e->a, numel, set, n, cap);
  if (e->op != TCC_PRIM_WHERE) {
    streams(p, e->b, numel, set, n, cap);
    return streams(p, e->c, numel, set, n, cap);
  }
  int sb[TCC_MAX_SHARED_INLINE_STREAMS + 1], nb = *n, sc[TCC_MAX_SHARED_INLINE_STREAMS + 1], nc = *n;
  if (*n > cap) return *n;
  memcpy(sb, set, sizeof *set * (size_t)*n);
  memcpy(sc, set, sizeof *set * (size_t)*n);
  streams(p, e->b, numel, sb, &nb, cap);
  streams(p, e->c, numel, sc, &nc, cap);
  const int *win = nb >= nc ? sb : sc;
  *n = nb >= nc ? nb : nc;
  if (*n <= cap) memcpy(set, win, sizeof *set * (size_t)*n);
  return *n;
}

/* Does producer `prod` of buffer `buf`, one of at least
 * TCC_STREAM_MIN_ELEMENTS, stream more buffers than one read by several
 * kernels may recompute (TCC_MAX_SHARED_INLINE_STREAMS)? */
static int many_streams(const fuse_ctx *fc, int buf, const tcc_vx *prod) {
  int set[TCC_MAX_SHARED_INLINE_STREAMS + 1], n = 0;
  const int64_t numel = fc->p->bufs[buf].layout.numel;
  return numel >= TCC_STREAM_MIN_ELEMENTS &&
         streams(fc->p, prod, (double)numel, set, &n, TCC_MAX_SHARED_INLINE_STREAMS) >
             TCC_MAX_SHARED_INLINE_STREAMS;
}

static int costly(const tcc_vx *e) {
  tcc_ptrmap memo;
  if (tcc_ptrmap_init(&memo, 64)) {
    tcc_ptrmap_free(&memo);
    return 1;   /* out of memory: keep the load */
  }
  int c = tcc_vx_costly(e, &memo);
  tcc_ptrmap_free(&memo);
  return c;
}

/* Index e with the expressions inside its VALUE parts inlined. */
static const tcc_ix *inline_ix(fuse_ctx *fc, tcc_ptrmap *memo, const tcc_ix *e) {
  tcc_program *p = fc->p;
  switch (e->kind) {
  case TCC_IX_CONST:
  case TCC_IX_VAR: return e;
  case TCC_IX_VALUE: {
    const tcc_vx *v = inline_rec(fc, memo, e->v);
    return v == e->v ? e : tcc_ix_value(p, v, e->c);
  }
  case TCC_IX_ADD: {
    const tcc_ix *a = inline_ix(fc, memo, e->a), *b = inline_ix(fc, memo, e->b);
    return a == e->a && b == e->b ? e : tcc_ix_add(p, a, b);
  }
  default: {
    const tcc_ix *a = inline_ix(fc, memo, e->a);
    if (a == e->a || !a) return a ? e : NULL;
    switch (e->kind) {
    case TCC_IX_MUL: return tcc_ix_mul(p, a, e->c);
    case TCC_IX_DIV: return tcc_ix_div(p, a, e->c);
    case TCC_IX_MOD: return tcc_ix_mod(p, a, e->c);
    case TCC_IX_MIN: return tcc_ix_min(p, a, e->c);
    default: return tcc_ix_max(p, a, e->c);
    }
  }
  }
}

static const tcc_vx *inline_rec(fuse_ctx *fc, tcc_ptrmap *memo, const tcc_vx *e) {
  tcc_program *p = fc->p;
  const tcc_vx *hit = tcc_ptrmap_get(memo, e);
  if (hit) return hit;
  const tcc_vx *r;
  if (e->op == TCC_PRIM_EXTERN) {
    r = e;                     /* operands are the library's: never inlined */
  } else if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX) {
    r = e;
    int dyn = 0;
    for (int d = 0; d < e->nidx; d++) dyn |= has_value_ix(e->idx[d]);
    if (dyn) {                 /* inline into index values first */
      const tcc_ix *ni[TCC_MAX_DIMS];
      for (int d = 0; d < e->nidx; d++)
        if (!(ni[d] = inline_ix(fc, memo, e->idx[d]))) return NULL;
      r = e->op == TCC_PRIM_LOAD ? tcc_vx_load(p, e->buf, e->nidx, ni) : tcc_vx_index(p, ni[0]);
      if (!r) return NULL;
    }
    const tcc_vx *prod = e->op == TCC_PRIM_LOAD ? fc->producer[e->buf] : NULL;
    if (prod && prod->depth <= TCC_MAX_EXPR_DEPTH / 2 &&
        (fc->readers[e->buf] <= 1 ||
         (prod->ops <= TCC_MAX_SHARED_INLINE_OPS && !many_streams(fc, e->buf, prod))) &&
        !(fc->stored[e->buf] && prod->ops > TCC_MATERIALIZED_INLINE_OPS &&
          apart_from_producer(fc, e->buf)) &&
        !(prod->ops > TCC_AMPLIFIED_INLINE_OPS && amplified(fc, e->buf, r)) &&
        !(gap_runs(fc, r) >= TCC_AMPLIFIED_FACTOR && costly(prod)) &&
        reduce_inline_ok(fc, prod, r)) {
      r = tcc_vx_subst(p, prod, r->nidx, r->idx);
      if (!r || tcc_kernel_add_nodes(p, fc->kid, fc->producer_kernel[e->buf])) return NULL;
    } else if (prod) {
      fc->stored[e->buf] = 1;   /* this load stays: the buffer is stored anyway */
    }
  } else {
    const tcc_vx *a = e->a ? inline_rec(fc, memo, e->a) : NULL;
    const tcc_vx *b = e->b ? inline_rec(fc, memo, e->b) : NULL;
    const tcc_vx *c = e->c ? inline_rec(fc, memo, e->c) : NULL;
    r = tcc_vx_with_operands(p, e, a, b, c);
    if (r && r->depth > TCC_MAX_EXPR_DEPTH) r = e;   /* keep this subtree unfused */
  }
  if (!r || tcc_ptrmap_put(memo, e, r)) {
    p->oom = 1;
    return NULL;
  }
  return r;
}

static int collect_reads(const tcc_vx *e, tcc_ptrmap *seen, int *stamp, int mark, int *list,
                         int *n);

static int collect_ix_reads(const tcc_ix *x, tcc_ptrmap *seen, int *stamp, int mark, int *list,
                            int *n) {
  if (!x) return 0;
  if (x->kind == TCC_IX_VALUE) return collect_reads(x->v, seen, stamp, mark, list, n);
  if (collect_ix_reads(x->a, seen, stamp, mark, list, n)) return -1;
  return collect_ix_reads(x->b, seen, stamp, mark, list, n);
}

/* Adds the buffers e reads to the set (stamp[buf] == mark). */
static int collect_reads(const tcc_vx *e, tcc_ptrmap *seen, int *stamp, int mark, int *list,
                         int *n) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD && stamp[e->buf] != mark) {
    stamp[e->buf] = mark;
    list[(*n)++] = e->buf;
  }
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (collect_ix_reads(e->idx[d], seen, stamp, mark, list, n)) return -1;
  if (e->a && collect_reads(e->a, seen, stamp, mark, list, n)) return -1;
  if (e->b && collect_reads(e->b, seen, stamp, mark, list, n)) return -1;
  if (e->c && collect_reads(e->c, seen, stamp, mark, list, n)) return -1;
  return 0;
}

/* Buffers kernel k reads, as an exact-size arena list; tmp has room for
 * every buffer id. */
static int kernel_reads(tcc_program *p, const tcc_kernel *k, int *stamp, int mark, int *tmp,
                        int **out, int *n) {
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return -1;
  }
  *n = 0;
  for (int s = 0; s < k->nstores; s++) {
    int fail = collect_reads(k->stores[s].value, &seen, stamp, mark, tmp, n);
    for (int d = 0; d < p->bufs[k->stores[s].buf].layout.rank && !fail; d++)
      fail = collect_ix_reads(k->stores[s].idx[d], &seen, stamp, mark, tmp, n);  /* index_put_'s */
    if (fail) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
  }
  tcc_ptrmap_free(&seen);
  *out = tcc_arena_array(p->arena, (size_t)*n + 1, sizeof **out);
  if (!*out) return -1;
  memcpy(*out, tmp, sizeof **out * (size_t)*n);
  return 0;
}

static int in_list(const int *l, int n, int x) {
  for (int i = 0; i < n; i++)
    if (l[i] == x) return 1;
  return 0;
}

/* Does kernel K store to a buffer in list? */
static int writes_any(const tcc_kernel *K, const int *list, int n) {
  for (int s = 0; s < K->nstores; s++)
    if (in_list(list, n, K->stores[s].buf)) return 1;
  return 0;
}

/* Do kernels A and B store to a common buffer? */
static int writes_same(const tcc_kernel *A, const tcc_kernel *B) {
  for (int s = 0; s < B->nstores; s++)
    for (int t = 0; t < A->nstores; t++)
      if (A->stores[t].buf == B->stores[s].buf) return 1;
  return 0;
}

/* Dims of size other than 1, in order. */
static int nonunit(const tcc_kernel *K, int *dims) {
  int n = 0;
  for (int d = 0; d < K->rank; d++)
    if (K->sizes[d] != 1) dims[n++] = d;
  return n;
}

static int64_t space_numel(const tcc_kernel *K) {
  int64_t n = 1;
  for (int d = 0; d < K->rank; d++) n *= K->sizes[d];
  return n;
}

/* Is one space's non-unit sizes a prefix of the other's? (Empty spaces
 * only merge with equal ones.) */
static int prefix_compatible(const tcc_kernel *A, const tcc_kernel *B) {
  int da[TCC_MAX_DIMS], db[TCC_MAX_DIMS];
  int na = nonunit(A, da), nb = nonunit(B, db);
  if (space_numel(A) == 0 || space_numel(B) == 0) {
    if (A->rank != B->rank) return 0;
    for (int d = 0; d < A->rank; d++)
      if (A->sizes[d] != B->sizes[d]) return 0;
    return 1;
  }
  int m = na < nb ? na : nb;
  for (int i = 0; i < m; i++)
    if (A->sizes[da[i]] != B->sizes[db[i]]) return 0;
  return 1;
}

static int shares_read(const int *a, int na, const int *b, int nb) {
  for (int i = 0; i < na; i++)
    if (in_list(b, nb, a[i])) return 1;
  return 0;
}

/* Rewrites the stores of S (a space prefix-compatible with L's) into L's
 * loop variables: S's non-unit dims become L's leading non-unit dims,
 * its unit dims index 0. Returns 0 or -1 (out of memory). */
static int remap_stores(tcc_program *p, tcc_kernel *S, const tcc_kernel *L) {
  int ds[TCC_MAX_DIMS], dl[TCC_MAX_DIMS];
  int ns = nonunit(S, ds);
  nonunit(L, dl);
  const tcc_ix *map[TCC_MAX_DIMS];
  int identity = S->rank <= L->rank;
  for (int d = 0; d < S->rank; d++) map[d] = tcc_ix_const(p, 0);
  for (int i = 0; i < ns; i++) {
    map[ds[i]] = tcc_ix_var(p, dl[i]);
    if (ds[i] != dl[i]) identity = 0;
  }
  for (int d = 0; d < S->rank && identity; d++)
    if (S->sizes[d] == 1 && !(d < L->rank && L->sizes[d] == 1)) identity = 0;
  if (identity) return 0;
  for (int s = 0; s < S->nstores; s++) {
    tcc_store *st = &S->stores[s];
    int r = p->bufs[st->buf].layout.rank;
    const tcc_ix **ni = tcc_arena_array(p->arena, (size_t)r + 1, sizeof *ni);
    if (!ni) return -1;
    for (int d = 0; d < r; d++)
      if (!(ni[d] = tcc_ix_subst(p, st->idx[d], S->rank, map))) return -1;
    st->idx = ni;
    if (!(st->value = tcc_vx_subst(p, st->value, S->rank, map))) return -1;
  }
  return 0;
}

/* Is kernel K a plain copy, one store O[..] = T[..] with the same storage
 * offset on both sides at every point, of contiguous buffers of one
 * dtype and size? Returns T's buffer, or -1. */
static int plain_copy(const tcc_program *p, const tcc_kernel *K) {
  if (K->dead || K->kind != TCC_OPK_POINTWISE || K->nstores != 1) return -1;
  const tcc_store *st = &K->stores[0];
  const tcc_vx *v = st->value;
  if (v->op != TCC_PRIM_LOAD) return -1;
  const tcc_meta *O = &p->bufs[st->buf].layout, *T = &p->bufs[v->buf].layout;
  if (O->dtype != T->dtype || v->dtype != O->dtype || O->numel != T->numel ||
      !tcc_meta_is_contiguous(O) || !tcc_meta_is_contiguous(T))
    return -1;
  int64_t co[TCC_MAX_DIMS], ct[TCC_MAX_DIMS], c0, c1;
  if (K->rank > TCC_MAX_DIMS ||
      !tcc_linear_affine(O->rank, st->idx, O->strides, K->rank, co, &c0) ||
      !tcc_linear_affine(T->rank, v->idx, T->strides, K->rank, ct, &c1) || c0 != c1 ||
      memcmp(co, ct, sizeof(int64_t) * (size_t)K->rank) != 0)
    return -1;
  return v->buf;
}

/* A CPU GEMM step's result T copied as it is (plain_copy) into an output
 * O, and read by nothing else: the GEMM writes O (its index the flat
 * offset of T's, reshaped), the copy and T die. A training step's weight
 * gradients came out of their GEMMs this way, a copy each (2% of BERT's
 * backward kernels). Convolutions keep their copy: written straight into
 * a fresh output, ResNet-50's training step ran slower (CHANGELOG
 * 2026-11-27). reads/nreads: each live kernel's buffers read. */
static int gemm_into_outputs(tcc_program *p, int **reads, const int *nreads) {
  if (p->graph->target.device != TCC__V1__DEVICE_TYPE__CPU) return 0;
  int nb = p->nbufs, nk = p->nkernels;
  int *nreaders = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *nreaders);
  int *writer = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *writer);
  if (!nreaders || !writer) return -1;
  for (int b = 0; b < nb; b++) writer[b] = -1;
  for (int k = 0; k < nk; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    for (int i = 0; i < nreads[k]; i++) nreaders[reads[k][i]]++;
    for (int s = 0; s < K->nstores; s++) writer[K->stores[s].buf] = writer[K->stores[s].buf] == -1 ? k : -2;
  }
  for (int k = 0; k < nk; k++) {
    tcc_kernel *K = &p->kernels[k];
    int t = plain_copy(p, K);
    if (t < 0) continue;
    int o = K->stores[0].buf, e = writer[t];
    if (p->bufs[o].kind != TCC_BUF_OUTPUT || p->bufs[t].kind != TCC_BUF_TEMP || nreaders[t] != 1 ||
        writer[o] != k || e < 0 || e >= k)
      continue;
    tcc_kernel *E = &p->kernels[e];
    const tcc_vx *call = E->stores[0].value;
    if (E->kind != TCC_OPK_EXTERN || E->nstores != 1 || call->op != TCC_PRIM_EXTERN || call->i != TCC_EXT_GEMM)
      continue;
    /* E's store index over T, as a flat offset, split over O's dims */
    const tcc_meta *T = &p->bufs[t].layout, *O = &p->bufs[o].layout;
    const tcc_ix *flat = tcc_ix_const(p, 0), *idx[TCC_MAX_DIMS];
    for (int d = 0; d < T->rank; d++)
      flat = tcc_ix_add(p, flat, tcc_ix_mul(p, E->stores[0].idx[d], T->strides[d]));
    for (int d = 0; d < O->rank; d++) {
      const tcc_ix *q = O->strides[d] > 1 ? tcc_ix_div(p, flat, O->strides[d]) : flat;
      idx[d] = d > 0 && O->sizes[d] > 0 ? tcc_ix_mod(p, q, O->sizes[d]) : q;
    }
    if (p->oom) return -1;
    const tcc_ix **copy = tcc_arena_array(p->arena, (size_t)O->rank + 1, sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, idx, sizeof(*copy) * (size_t)O->rank);
    E->stores[0].buf = o;
    E->stores[0].idx = copy;
    K->dead = 1;
    p->bufs[t].dead = 1;
    writer[o] = e;
  }
  return 0;
}

int tcc_fuse(tcc_program *p, tcc_error *err) {
  fuse_ctx fc = {.p = p};
  int nb = p->nbufs, nk = p->nkernels;
  fc.producer = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *fc.producer);
  fc.writers = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *fc.writers);
  int *stamp = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *stamp);
  int **reads = tcc_arena_array(p->arena, (size_t)nk + 1, sizeof *reads);
  int *nreads = tcc_arena_array(p->arena, (size_t)nk + 1, sizeof *nreads);
  int *live = tcc_arena_array(p->arena, (size_t)nk + 1, sizeof *live);
  int *tmp = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *tmp);
  if (!fc.producer || !fc.writers || !stamp || !reads || !nreads || !live || !tmp) goto oom;
  fc.readers = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *fc.readers);
  fc.producer_kernel = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *fc.producer_kernel);
  fc.last_writer = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *fc.last_writer);
  fc.visited = tcc_arena_array(p->arena, (size_t)nk + 1, sizeof *fc.visited);
  fc.reads = reads;
  fc.nreads = nreads;
  fc.stored = tcc_arena_alloc(p->arena, (size_t)nb + 1);
  fc.split = tcc_arena_alloc(p->arena, (size_t)nb + 1);
  fc.nbound = p->next_var;
  fc.bound = tcc_arena_array(p->arena, (size_t)fc.nbound + 1, sizeof *fc.bound);
  if (!fc.bound) goto oom;
  int *first_reader = tcc_arena_array(p->arena, (size_t)nb + 1, sizeof *first_reader);
  int *externs_before = tcc_arena_array(p->arena, (size_t)nk + 1, sizeof *externs_before);
  if (!fc.readers || !fc.producer_kernel || !fc.stored || !fc.split || !first_reader ||
      !externs_before || !fc.last_writer || !fc.visited)
    goto oom;
  for (int k = 0; k < nk; k++) fc.visited[k] = 0;
  for (int b = 0; b < nb; b++) {
    stamp[b] = -1;
    first_reader[b] = -1;
    fc.stored[b] = p->bufs[b].kind == TCC_BUF_OUTPUT;
    fc.split[b] = 0;
    fc.last_writer[b] = -1;
  }
  externs_before[0] = 0;
  for (int k = 0; k < nk; k++) {
    externs_before[k + 1] = externs_before[k] + (p->kernels[k].kind == TCC_OPK_EXTERN);
    for (int s = 0; s < p->kernels[k].nstores; s++) {
      fc.writers[p->kernels[k].stores[s].buf]++;
      fc.last_writer[p->kernels[k].stores[s].buf] = k;
    }
    int n;
    if (kernel_reads(p, &p->kernels[k], stamp, k, tmp, &reads[k], &n)) goto oom;
    nreads[k] = n;
    for (int i = 0; i < n; i++) {
      int b = reads[k][i];
      fc.readers[b]++;
      if (p->kernels[k].kind == TCC_OPK_EXTERN) fc.stored[b] = 1;
      if (first_reader[b] < 0) first_reader[b] = k;
      else if (externs_before[k] - externs_before[first_reader[b] + 1] > 0) fc.split[b] = 1;
    }
  }

  const char *nf = getenv("TCC_NO_FUSION");
  int fuse_on = !(nf && nf[0] && strcmp(nf, "0") != 0);
  /* 1. inline, in kernel order: producers are rewritten before use */
  for (int k = 0; k < nk && fuse_on; k++) {
    tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    fc.k = K;
    fc.kid = k;
    tcc_ptrmap memo;
    for (int v = 0; v < fc.nbound; v++) fc.bound[v] = NULL;
    if (tcc_ptrmap_init(&memo, 64)) {
      tcc_ptrmap_free(&memo);
      goto oom;
    }
    for (int s = 0; s < K->nstores; s++)
      if (note_reduces(&fc, K->stores[s].value, &memo)) {
        tcc_ptrmap_free(&memo);
        goto oom;
      }
    tcc_ptrmap_free(&memo);
    if (tcc_ptrmap_init(&memo, 64)) {
      tcc_ptrmap_free(&memo);
      goto oom;
    }
    for (int s = 0; s < K->nstores; s++) {
      tcc_store *st = &K->stores[s];
      st->value = inline_rec(&fc, &memo, st->value);
      if (!st->value) {
        tcc_ptrmap_free(&memo);
        goto oom;
      }
    }
    tcc_ptrmap_free(&memo);
    for (int s = 0; s < K->nstores; s++) {
      const tcc_store *st = &K->stores[s];
      if (fc.writers[st->buf] == 1 && identity_store(p, K, st)) {
        fc.producer[st->buf] = st->value;
        fc.producer_kernel[st->buf] = k;
      }
    }
  }

  /* 2. drop stores to temporaries no live later kernel reads */
  for (int b = 0; b < nb; b++) stamp[b] = -1;
  char *needed = tcc_arena_alloc(p->arena, (size_t)nb + 1);
  if (!needed) goto oom;
  for (int k = nk - 1; k >= 0; k--) {
    tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    int keep = 0;
    for (int s = 0; s < K->nstores; s++) {
      const tcc_buffer *B = &p->bufs[K->stores[s].buf];
      if (B->kind != TCC_BUF_TEMP || needed[K->stores[s].buf]) K->stores[keep++] = K->stores[s];
    }
    K->nstores = keep;
    if (!keep) {
      K->dead = 1;
      continue;
    }
    if (kernel_reads(p, K, stamp, k, tmp, &reads[k], &nreads[k])) goto oom;
    for (int i = 0; i < nreads[k]; i++) needed[reads[k][i]] = 1;
  }
  for (int b = 0; b < nb; b++)
    if (p->bufs[b].kind == TCC_BUF_TEMP && !needed[b]) p->bufs[b].dead = 1;

  /* 2b. (before merging, which would hide the copies) a GEMM result
   * copied as it is into an output is written there by the GEMM */
  if (fuse_on && !p->graph->nsyms && gemm_into_outputs(p, reads, nreads)) goto oom;

  /* 3. merge kernels over equal iteration spaces */
  int nlive = 0;
  for (int k = 0; k < nk; k++) {
    tcc_kernel *J = &p->kernels[k];
    if (J->dead) continue;
    int target = -1;
    if (!fuse_on) {
      live[nlive++] = k;
      continue;
    }
    for (int li = nlive - 1, steps = 0; li >= 0 && steps < TCC_FUSE_WINDOW; li--, steps++) {
      tcc_kernel *I = &p->kernels[live[li]];
      if (writes_any(I, reads[k], nreads[k]) || writes_any(J, reads[live[li]], nreads[live[li]]) ||
          writes_same(I, J))
        break;                                /* cannot move past it */
      /* spaces of another size merge only where they read a common
       * buffer (a row statistic beside the rows it summarizes): an
       * unrelated total (a loss's count of valid labels) merged into a
       * [32, 64, 112, 112] batch norm left the CUDA target one row, one
       * block of 32 threads for 25.7M elements (329 ms of a ResNet-50
       * step) */
      if (I->kind == TCC_OPK_POINTWISE && J->kind == TCC_OPK_POINTWISE &&
          !stores_at_values(p, I) && !stores_at_values(p, J) && prefix_compatible(I, J) &&
          (same_space(I, J) || shares_read(reads[k], nreads[k], reads[live[li]], nreads[live[li]]))) {
        target = li;
        break;
      }
    }
    if (target < 0) {
      live[nlive++] = k;
      continue;
    }
    int ti = live[target];
    tcc_kernel *I = &p->kernels[ti];
    if (space_numel(J) > space_numel(I) || (space_numel(J) == space_numel(I) && J->rank > I->rank)) {
      /* the target grows to J's space: move its stores over */
      if (remap_stores(p, I, J)) goto oom;
      I->rank = J->rank;
      memcpy(I->sizes, J->sizes, sizeof I->sizes);
    }
    if (remap_stores(p, J, I)) goto oom;
    for (int s = 0; s < J->nstores; s++) {
      const tcc_store *st = &J->stores[s];
      if (tcc_kernel_add_store(p, ti, st->buf, st->idx, st->value)) goto oom;
    }
    int *merged = tcc_arena_array(p->arena, (size_t)(nreads[ti] + nreads[k]) + 1, sizeof *merged);
    if (!merged) goto oom;
    int m = 0;
    for (int i = 0; i < nreads[ti]; i++) merged[m++] = reads[ti][i];
    for (int i = 0; i < nreads[k]; i++)
      if (!in_list(reads[ti], nreads[ti], reads[k][i])) merged[m++] = reads[k][i];
    reads[ti] = merged;
    nreads[ti] = m;
    if (tcc_kernel_add_nodes(p, ti, k)) goto oom;
    J->dead = 1;
  }
  if (p->oom) goto oom;
  return 0;

oom:
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory fusing");
}
