/*
 * place.c — where temporaries live.
 *
 * Requires: a fused program (dead buffers marked), kernels in execution
 * order.
 * Produces: a workspace byte offset for each live TEMP buffer (64-byte
 * aligned) and the total in p->workspace_bytes, which the manifest tells
 * the caller to allocate.
 *
 * Temporaries share memory: a buffer lives from the first kernel that
 * writes it to the last kernel that reads it (both included), and two
 * buffers whose lifetimes overlap never overlap in the workspace. Buffers
 * are placed in order of first write, each at the lowest offset where it
 * fits among the blocks live at any point of its lifetime (first fit).
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>

typedef struct life {
  int first, last;     /* kernel indices; first = -1: never written */
  int64_t bytes;
} life;

static void touch_ix(const tcc_ix *x, life *L, int k);

static void touch(const tcc_vx *e, life *L, int k, tcc_ptrmap *seen) {
  if (tcc_ptrmap_get(seen, e)) return;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_LOAD && L[e->buf].last < k) L[e->buf].last = k;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) touch_ix(e->idx[d], L, k);
  if (e->a) touch(e->a, L, k, seen);
  if (e->b) touch(e->b, L, k, seen);
  if (e->c) touch(e->c, L, k, seen);
}

static void touch_ix(const tcc_ix *x, life *L, int k) {
  if (!x) return;
  if (x->kind == TCC_IX_VALUE) {
    tcc_ptrmap seen;
    if (!tcc_ptrmap_init(&seen, 16)) touch(x->v, L, k, &seen);
    tcc_ptrmap_free(&seen);
    return;
  }
  touch_ix(x->a, L, k);
  touch_ix(x->b, L, k);
}

int tcc_place_buffers(tcc_program *p, tcc_error *err) {
  int nb = p->nbufs;
  life *L = calloc((size_t)nb + 1, sizeof *L);
  int *order = calloc((size_t)nb + 1, sizeof *order);
  int *placed = calloc((size_t)nb + 1, sizeof *placed);
  int rc = 0;
  if (!L || !order || !placed) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory placing buffers");
    goto done;
  }
  for (int b = 0; b < nb; b++) L[b].first = L[b].last = -1;
  for (int k = 0; k < p->nkernels; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    tcc_ptrmap seen;
    if (tcc_ptrmap_init(&seen, 64)) {
      tcc_ptrmap_free(&seen);
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory placing buffers");
      goto done;
    }
    for (int s = 0; s < K->nstores; s++) {
      int b = K->stores[s].buf;
      if (L[b].first < 0) L[b].first = k;
      if (L[b].last < k) L[b].last = k;
      touch(K->stores[s].value, L, k, &seen);
      for (int d = 0; d < p->bufs[b].layout.rank; d++) touch_ix(K->stores[s].idx[d], L, k);
    }
    tcc_ptrmap_free(&seen);
  }
  int n = 0;
  for (int b = 0; b < nb; b++) {
    tcc_buffer *B = &p->bufs[b];
    if (B->kind != TCC_BUF_TEMP || B->dead) continue;
    int64_t bytes;
    if (__builtin_mul_overflow(B->layout.span, (int64_t)tcc_dtype_size(B->layout.dtype), &bytes) ||
        __builtin_add_overflow(bytes, 63, &bytes)) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "workspace size overflows int64");
      goto done;
    }
    L[b].bytes = bytes & ~(int64_t)63;
    /* Dynamic programs: 8 bytes per element (aligned for every dtype),
     * so that sizes and offsets stay polynomials in the symbols. */
    if (p->graph->nsyms && __builtin_mul_overflow(B->layout.span, (int64_t)8, &L[b].bytes)) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "workspace size overflows int64");
      goto done;
    }
    if (L[b].first < 0) L[b].first = L[b].last = 0;
    order[n++] = b;
  }
  /* by first write (stable) */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && L[order[j]].first < L[order[j - 1]].first; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    int b = order[i];
    int64_t off = 0;
    /* first fit: raise off past every placed, lifetime-overlapping block
     * it collides with, until none collides (dynamic programs: one after
     * the other, no reuse) */
    if (p->graph->nsyms) off = total;
    for (int moved = !p->graph->nsyms; moved;) {
      moved = 0;
      for (int j = 0; j < i; j++) {
        int c = placed[j];
        if (L[c].last < L[b].first || L[b].last < L[c].first) continue;
        int64_t co = p->bufs[c].ws_offset;
        if (off < co + L[c].bytes && co < off + L[b].bytes) {
          off = co + L[c].bytes;
          moved = 1;
        }
      }
    }
    p->bufs[b].ws_offset = off;
    placed[i] = b;
    int64_t end;
    if (__builtin_add_overflow(off, L[b].bytes, &end)) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "workspace size overflows int64");
      goto done;
    }
    if (end > total) total = end;
  }
  p->workspace_bytes = total;
  p->planned = 1;
done:
  free(L);
  free(order);
  free(placed);
  return rc;
}
