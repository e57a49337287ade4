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
 *      and it has more than TCC_MAX_SHARED_INLINE_OPS operations (compute
 *      once, read many).
 *   2. dead buffers: stores to temporaries nothing reads any more are
 *      dropped, and kernels left without stores die.
 *   3. merging: a kernel joins the nearest earlier live kernel with the
 *      same iteration space when no kernel in between (the target
 *      included) writes what it reads, reads what it writes or writes what
 *      it writes. Pointwise graphs whose outputs share a shape end as one
 *      loop nest.
 * Outputs stay stored exactly once.
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>

typedef struct fuse_ctx {
  tcc_program *p;
  const tcc_vx **producer;   /* per buffer: inlinable stored expression */
  int *writers;              /* per buffer: number of stores writing it */
  int *readers;              /* per buffer: kernels loading it before fusion */
} fuse_ctx;

/* Is store s of kernel k an identity write of its whole buffer? */
static int identity_store(const tcc_program *p, const tcc_kernel *k, const tcc_store *s) {
  const tcc_meta *m = &p->bufs[s->buf].layout;
  if (k->kind != TCC_OPK_POINTWISE || k->rank != m->rank) return 0;
  for (int d = 0; d < m->rank; d++)
    if (k->sizes[d] != m->sizes[d] || s->idx[d]->kind != TCC_IX_VAR || s->idx[d]->var != d)
      return 0;
  return 1;
}

static const tcc_vx *inline_rec(fuse_ctx *fc, tcc_ptrmap *memo, const tcc_vx *e) {
  tcc_program *p = fc->p;
  const tcc_vx *hit = tcc_ptrmap_get(memo, e);
  if (hit) return hit;
  const tcc_vx *r;
  if (e->op == TCC_PRIM_LOAD) {
    r = e;
    const tcc_vx *prod = fc->producer[e->buf];
    if (prod && prod->depth <= TCC_MAX_EXPR_DEPTH / 2 &&
        (fc->readers[e->buf] <= 1 || prod->ops <= TCC_MAX_SHARED_INLINE_OPS)) {
      r = tcc_vx_subst(p, prod, e->nidx, e->idx);
      if (!r) return NULL;
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

/* Adds the buffers e reads to the set (stamp[buf] == mark). */
static int collect_reads(const tcc_vx *e, tcc_ptrmap *seen, int *stamp, int mark, int *list,
                         int *n) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD && stamp[e->buf] != mark) {
    stamp[e->buf] = mark;
    list[(*n)++] = e->buf;
  }
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
  for (int s = 0; s < k->nstores; s++)
    if (collect_reads(k->stores[s].value, &seen, stamp, mark, tmp, n)) {
      tcc_ptrmap_free(&seen);
      return -1;
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
  if (!fc.readers) goto oom;
  for (int b = 0; b < nb; b++) stamp[b] = -1;
  for (int k = 0; k < nk; k++) {
    for (int s = 0; s < p->kernels[k].nstores; s++) fc.writers[p->kernels[k].stores[s].buf]++;
    int n;
    if (kernel_reads(p, &p->kernels[k], stamp, k, tmp, &reads[k], &n)) goto oom;
    for (int i = 0; i < n; i++) fc.readers[reads[k][i]]++;
  }

  /* 1. inline, in kernel order: producers are rewritten before use */
  for (int k = 0; k < nk; k++) {
    tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    tcc_ptrmap memo;
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
      if (fc.writers[st->buf] == 1 && identity_store(p, K, st)) fc.producer[st->buf] = st->value;
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

  /* 3. merge kernels over equal iteration spaces */
  int nlive = 0;
  for (int k = 0; k < nk; k++) {
    tcc_kernel *J = &p->kernels[k];
    if (J->dead) continue;
    int target = -1;
    for (int li = nlive - 1, steps = 0; li >= 0 && steps < TCC_FUSE_WINDOW; li--, steps++) {
      tcc_kernel *I = &p->kernels[live[li]];
      if (writes_any(I, reads[k], nreads[k]) || writes_any(J, reads[live[li]], nreads[live[li]]) ||
          writes_same(I, J))
        break;                                /* cannot move past it */
      int same = I->kind == J->kind && I->rank == J->rank;
      for (int d = 0; same && d < I->rank; d++) same = I->sizes[d] == J->sizes[d];
      if (same) {
        target = li;
        break;
      }
    }
    if (target < 0) {
      live[nlive++] = k;
      continue;
    }
    int ti = live[target];
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
    J->dead = 1;
  }
  if (p->oom) goto oom;
  return 0;

oom:
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory fusing");
}
