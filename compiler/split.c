/*
 * split.c — a dim read through div and mod becomes two loops.
 *
 * Requires: a fused program (fuse.c) with static shapes. A program with
 * symbols is left as it is (dynamic.c fits the numbers of code generated
 * at several sizes, so the loop structure must not depend on the sizes).
 * Produces: the same computation where a pointwise kernel without
 * reductions that indexes with i_d / c or i_d % c (c a proper divisor of
 * dim d's size S) iterates dim d as two dims (S/c, c):
 *
 *   i_d = c * i_hi + i_lo,   i_d / c = i_hi,   i_d % c = i_lo
 *
 * Views make such indices: a reshape across a transpose, as when
 * attention merges its heads ([b, h, t, dh] -> [b*t, h*dh]), reads
 * element (i, j) at (i/t, j/dh, i%t, j%dh). Split, every access is affine
 * again, so cpu/emit.c plans the nest into unit-stride loops the C compiler
 * vectorizes instead of a division, a modulo and a gathered load per
 * element (6 ns per element in a BERT backward). TorchInductor splits
 * iteration ranges the same way.
 *
 * The rewrite substitutes i_d -> c*i_hi + i_lo with the kernel's extents
 * published in tcc_program.ix_extent, which lets tcc_ix_div/tcc_ix_mod
 * (expr.c) take the quotient and remainder apart; it repeats until no
 * kernel has such a dim or the kernel is TCC_MAX_DIMS deep.
 */
#include "loop.h"

typedef struct split_find {
  const tcc_kernel *k;
  tcc_ptrmap seen;             /* value expressions already walked */
  int dim;                     /* the dim to split, -1 none yet */
  int64_t c;                   /* its inner extent */
  int refuse;                  /* a REDUCE or EXTERN (or out of memory):
                                  leave the kernel as it is */
} split_find;

static void find_ix(split_find *f, const tcc_ix *e);

static void find_vx(split_find *f, const tcc_vx *e) {
  if (!e || f->refuse || tcc_ptrmap_get(&f->seen, e)) return;
  if (tcc_ptrmap_put(&f->seen, e, e)) {
    f->refuse = 1;
    return;
  }
  if (e->op == TCC_PRIM_REDUCE || e->op == TCC_PRIM_EXTERN) {
    f->refuse = 1;
    return;
  }
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) find_ix(f, e->idx[d]);
  find_vx(f, e->a);
  find_vx(f, e->b);
  find_vx(f, e->c);
}

static void find_ix(split_find *f, const tcc_ix *e) {
  if (!e || f->dim >= 0) return;
  if ((e->kind == TCC_IX_DIV || e->kind == TCC_IX_MOD) && e->a->kind == TCC_IX_VAR &&
      e->a->var < f->k->rank) {
    int64_t S = f->k->sizes[e->a->var];
    if (e->c > 1 && e->c < S && S % e->c == 0) {
      f->dim = e->a->var;
      f->c = e->c;
      return;
    }
  }
  if (e->kind == TCC_IX_VALUE) {
    find_vx(f, e->v);
    return;
  }
  if (e->kind != TCC_IX_CONST && e->kind != TCC_IX_VAR) {
    find_ix(f, e->a);
    find_ix(f, e->b);
  }
}

/* The dim of kernel k to split and its inner extent; 0 when none. */
static int find_split(const tcc_program *p, const tcc_kernel *k, int *dim, int64_t *c) {
  split_find f = {.k = k, .dim = -1};
  if (tcc_ptrmap_init(&f.seen, 64)) {
    tcc_ptrmap_free(&f.seen);
    return 0;
  }
  for (int s = 0; s < k->nstores && !f.refuse; s++) {
    const tcc_store *st = &k->stores[s];
    for (int d = 0; d < p->bufs[st->buf].layout.rank; d++) find_ix(&f, st->idx[d]);
    find_vx(&f, st->value);
  }
  tcc_ptrmap_free(&f.seen);
  if (f.refuse || f.dim < 0) return 0;
  *dim = f.dim;
  *c = f.c;
  return 1;
}

/* Splits dim d of kernel k into (S/c, c). Returns 0 or -1 (out of memory). */
static int split_dim(tcc_program *p, tcc_kernel *k, int d, int64_t c) {
  int64_t ext[TCC_MAX_DIMS];
  const tcc_ix *map[TCC_MAX_DIMS];
  for (int v = 0; v < k->rank; v++) {
    if (v < d) map[v] = tcc_ix_var(p, v);
    else if (v > d) map[v] = tcc_ix_var(p, v + 1);
    else map[v] = tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, d), c), tcc_ix_var(p, d + 1));
    if (!map[v]) return -1;
    int nv = v < d ? v : v + 1;
    ext[nv] = k->sizes[v];
  }
  ext[d] = k->sizes[d] / c;
  ext[d + 1] = c;
  p->ix_extent = ext;
  p->ix_nextent = k->rank + 1;
  int rc = 0;
  for (int s = 0; s < k->nstores && !rc; s++) {
    tcc_store *st = &k->stores[s];
    int r = p->bufs[st->buf].layout.rank;
    const tcc_ix **idx = tcc_arena_array(p->arena, (size_t)r + 1, sizeof *idx);
    if (!idx) rc = -1;
    for (int j = 0; j < r && !rc; j++)
      if (!(idx[j] = tcc_ix_subst(p, st->idx[j], k->rank, map))) rc = -1;
    if (!rc && !(st->value = tcc_vx_subst(p, st->value, k->rank, map))) rc = -1;
    if (!rc) st->idx = idx;
  }
  p->ix_extent = NULL;
  p->ix_nextent = 0;
  if (rc) return -1;
  k->rank++;
  for (int v = 0; v < k->rank; v++) k->sizes[v] = ext[v];
  return 0;
}

int tcc_split_dims(tcc_program *p, tcc_error *err) {
  if (p->graph->nsyms) return 0;
  for (int i = 0; i < p->nkernels; i++) {
    tcc_kernel *k = &p->kernels[i];
    int d;
    int64_t c;
    while (!k->dead && k->kind == TCC_OPK_POINTWISE && k->rank < TCC_MAX_DIMS &&
           find_split(p, k, &d, &c))
      if (split_dim(p, k, d, c) || p->oom)
        return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory splitting loops");
  }
  return 0;
}
