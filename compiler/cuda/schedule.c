/*
 * schedule.c — the CUDA target's schedule pass: every decision about how
 * a kernel runs on the GPU, made once per program and kept in
 * p->sched.cuda (cuda_schedule.h) for the emitter, the NVRTC build and
 * the manifest.
 *
 * Per kernel (plan_kernel and the planners after it):
 *   rows       "row" = the leading kernel dims that the cooperative
 *              reductions read (a REDUCE that reads no variable bound
 *              outside it is folded by a whole block, or warp); the rest
 *              of the iteration space is shared by the row's threads.
 *   geometry   pointwise: POINTWISE_BLOCK threads, grid = numel / (block
 *              * items per thread * vector width), at most MAX_GRID
 *              blocks; reductions:
 *              the extent rounded up to a power of two, 32..MAX_RED_BLOCK
 *              (MAX_LONG_ROW_BLOCK for at most FEW_ROWS rows of at least
 *              LONG_ROW elements), one block per row, or one warp per row
 *              (WARP_ROWS rows a block) for rows of at most 32 elements,
 *              and for at least WARP_MANY_ROWS rows of at most
 *              WARP_ROW_MAX elements (attention softmaxes, layer norms);
 *              a reduction of at most SEQ_MAX_EXTENT elements is not
 *              cooperative (each thread folds its own). A tuning config
 *              (tcc_kernel_config: block, ipt, wrow, split, persist)
 *              replaces the matching choice.
 *   split      a long cooperative reduction into few rows, or siblings
 *              that fold in one loop, is folded in two launches (SPLIT_*
 *              below).
 *   persistent with the config's persist, inputs read more than once per
 *              row go to shared memory once per row (plan_row_cache).
 *   vector     pointwise kernels whose accesses are contiguous in the flat
 *              index take W elements per thread (plan_vector).
 *   indices    int when every extent and offset fits comfortably in 31
 *              bits, else long long (fits_int32).
 * The launch plan lists the steps in order: k<j>_split before k<j>, a
 * cuBLAS call for a GEMM (describe_gemm) or a cuDNN call for a
 * convolution (describe_conv), and grows the workspace by the
 * split reductions' partials.
 */
#include "cuda_schedule.h"
#include "tcc_nvrtc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- launch geometry */

#define POINTWISE_BLOCK 256
#define MAX_GRID 65536
#define MAX_RED_BLOCK 256
#define WARP_ROWS 8
/* Many rows of up to 1024 elements (ViT-B's 75,648 attention-softmax
 * rows of 197, BERT's layer norms of 768) fold a warp each, with
 * shuffles, as PyTorch's softmax and Inductor's persistent reductions
 * do: one 256-thread block per row left a quarter of it idle on 197
 * elements and paid three block-wide reductions (shared memory and
 * barriers) per row; 169 us a softmax on the H200 against Inductor's 68
 * (2026-11-28). With fewer rows a warp each would leave SMs idle. */
#define WARP_MANY_ROWS 2048
#define WARP_ROW_MAX 1024
#define IDX32_LIMIT (INT64_C(1) << 30)
#define FEW_ROWS 512
#define LONG_ROW 8192
#define MAX_LONG_ROW_BLOCK 1024
/* Split reductions: a cooperative reduction of at least SPLIT_MIN_EXTENT
 * elements per row, with at most SPLIT_MAX_ROWS rows, is folded in two
 * launches: k<j>_split, grid (groups, rows) of MAX_RED_BLOCK threads,
 * each block folding a grid-stride slice of its row into one partial per
 * reduction in the workspace (after the program's own, 256-byte aligned;
 * reduction c's at c * groups * rows slots of 8 bytes), then k<j>,
 * one block per row, folding the row's partials in a fixed order (so the
 * result is deterministic) and running the rest of the kernel. groups =
 * extent / SPLIT_CHUNK, at most SPLIT_MAX_GROUPS. */
#define SPLIT_MIN_EXTENT (INT64_C(1) << 16)
#define SPLIT_MAX_ROWS 64
#define SPLIT_CHUNK 8192
#define SPLIT_MAX_GROUPS 512

static int has_reduce_any(const tcc_kernel *k) {
  for (int s = 0; s < k->nstores; s++)
    if (tcc_vx_has_reduce(k->stores[s].value)) return 1;
  return 0;
}

/* Free-variable analysis: the highest kernel variable e reads (-1:
 * none) and whether it reads a variable bound outside it. Memoized. */
typedef struct fvinfo {
  int maxk;       /* highest kernel var read, -1 none */
  int nbound;     /* bound vars read free: first few kept */
  int bound[8];
  int overflow;   /* more than 8 free bound vars: treat as "has bound" */
} fvinfo;

typedef struct fvctx {
  tcc_ptrmap map;   /* vx -> fvinfo* (malloc'ed, in list) */
  fvinfo **all;
  int n, cap;
  int oom;
} fvctx;

static void fv_merge(fvinfo *dst, const fvinfo *src, int lo, int hi) {
  if (src->maxk > dst->maxk) dst->maxk = src->maxk;
  if (src->overflow) dst->overflow = 1;
  for (int i = 0; i < src->nbound; i++) {
    int v = src->bound[i];
    if (v >= lo && v < hi) continue;
    int have = 0;
    for (int j = 0; j < dst->nbound; j++) have |= dst->bound[j] == v;
    if (have) continue;
    if (dst->nbound == 8) dst->overflow = 1;
    else dst->bound[dst->nbound++] = v;
  }
}

static void fv_ix(fvctx *c, const tcc_ix *x, fvinfo *out);
static const fvinfo *fv_vx(fvctx *c, const tcc_vx *e);

static void fv_ix(fvctx *c, const tcc_ix *x, fvinfo *out) {
  if (!x) return;
  if (x->kind == TCC_IX_VAR) {
    fvinfo one = {.maxk = -1};
    if (x->var < TCC_FIRST_BOUND_VAR) one.maxk = x->var;
    else one.bound[one.nbound++] = x->var;
    fv_merge(out, &one, 0, 0);
  } else if (x->kind == TCC_IX_VALUE) {
    const fvinfo *s = fv_vx(c, x->v);
    if (s) fv_merge(out, s, 0, 0);
  } else {
    fv_ix(c, x->a, out);
    fv_ix(c, x->b, out);
  }
}

static const fvinfo *fv_vx(fvctx *c, const tcc_vx *e) {
  const fvinfo *hit = tcc_ptrmap_get(&c->map, e);
  if (hit) return hit;
  fvinfo *f = calloc(1, sizeof *f);
  if (!f || (c->n == c->cap && !(c->cap = c->cap ? c->cap * 2 : 64,
                                  c->all = realloc(c->all, sizeof *c->all * (size_t)c->cap)))) {
    free(f);
    c->oom = 1;
    return NULL;
  }
  c->all[c->n++] = f;
  f->maxk = -1;
  fvinfo tmp = {.maxk = -1};
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) fv_ix(c, e->idx[d], &tmp);
  if (e->op != TCC_PRIM_EXTERN) {
    const tcc_vx *ops[3] = {e->a, e->b, e->c};
    for (int i = 0; i < 3; i++)
      if (ops[i]) {
        const fvinfo *s = fv_vx(c, ops[i]);
        if (s) fv_merge(&tmp, s, 0, 0);
      }
  }
  int lo = 0, hi = 0;
  if (e->op == TCC_PRIM_REDUCE) {
    lo = e->buf;
    hi = e->buf + e->nidx;
  }
  fv_merge(f, &tmp, lo, hi);
  if (tcc_ptrmap_put(&c->map, e, f)) c->oom = 1;
  return f;
}

static void fv_free(fvctx *c) {
  for (int i = 0; i < c->n; i++) free(c->all[i]);
  free(c->all);
  tcc_ptrmap_free(&c->map);
}

/* A REDUCE computed by the whole block: reads no variable bound outside,
 * and folds more than SEQ_MAX_EXTENT elements. A shorter one (a pooling
 * window of 9, a 3x3 convolution's taps) is folded by each thread in
 * turn: a warp per 9-element max-pool window kept 32 lanes for 9 loads
 * and three shuffles (4 ms of a ResNet-50 forward on an H200). */
#define SEQ_MAX_EXTENT 16

static int cooperative(fvctx *c, const tcc_vx *e) {
  const fvinfo *f = fv_vx(c, e);
  return f && !f->nbound && !f->overflow && tcc_cuda_reduce_extent(e) > SEQ_MAX_EXTENT;
}

typedef struct node_list {
  const tcc_vx **v;
  int n, cap;
} node_list;

static int list_push(node_list *l, const tcc_vx *e) {
  if (l->n == l->cap) {
    int nc = l->cap ? l->cap * 2 : 16;
    const tcc_vx **nv = realloc(l->v, sizeof *nv * (size_t)nc);
    if (!nv) return -1;
    l->v = nv;
    l->cap = nc;
  }
  l->v[l->n++] = e;
  return 0;
}

static int collect_coop_ix(fvctx *c, const tcc_ix *x, tcc_ptrmap *seen, node_list *out);

/* Post-order list of cooperative REDUCEs (inner ones first). */
static int collect_coop(fvctx *c, const tcc_vx *e, tcc_ptrmap *seen, node_list *out) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (collect_coop_ix(c, e->idx[d], seen, out)) return -1;
  if (e->op != TCC_PRIM_EXTERN) {
    if (e->a && collect_coop(c, e->a, seen, out)) return -1;
    if (e->b && collect_coop(c, e->b, seen, out)) return -1;
    if (e->c && collect_coop(c, e->c, seen, out)) return -1;
  }
  if (e->op == TCC_PRIM_REDUCE && cooperative(c, e)) return list_push(out, e);
  return c->oom ? -1 : 0;
}

static int collect_coop_ix(fvctx *c, const tcc_ix *x, tcc_ptrmap *seen, node_list *out) {
  if (!x) return 0;
  if (x->kind == TCC_IX_VALUE) return collect_coop(c, x->v, seen, out);
  if (collect_coop_ix(c, x->a, seen, out)) return -1;
  return collect_coop_ix(c, x->b, seen, out);
}



/* Does expression e read the value of node r? (seen: visited nodes) */
static int reads_node(const tcc_vx *e, const tcc_vx *r, tcc_ptrmap *seen);
static int ix_reads_node(const tcc_ix *x, const tcc_vx *r, tcc_ptrmap *seen) {
  if (!x) return 0;
  if (x->kind == TCC_IX_VALUE && reads_node(x->v, r, seen)) return 1;
  return ix_reads_node(x->a, r, seen) || ix_reads_node(x->b, r, seen);
}
static int reads_node(const tcc_vx *e, const tcc_vx *r, tcc_ptrmap *seen) {
  if (!e) return 0;
  if (e == r) return 1;
  if (tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (ix_reads_node(e->idx[d], r, seen)) return 1;
  return reads_node(e->a, r, seen) || reads_node(e->b, r, seen) || reads_node(e->c, r, seen);
}

/* How many of the cooperative reductions from coop[i] on fold in one
 * loop (emit.c's emit_coop_group): the run of reductions with coop[i]'s extents
 * that read none of the run's earlier results. 1 when out of memory. */
int tcc_cuda_coop_group_size(const tcc_cuda_kernel_plan *kp, int i) {
  const tcc_vx *r0 = kp->coop[i];
  int n = 1;
  for (int k = i + 1; k < kp->ncoop; k++, n++) {
    const tcc_vx *r = kp->coop[k];
    int same = r->nidx == r0->nidx;
    for (int d = 0; same && d < r->nidx; d++) same = r->idx[d]->c == r0->idx[d]->c;
    /* its variables: r0's own, or ids no member binds (aliases of r0's) */
    for (int q = i; same && q < k && r->buf != r0->buf; q++)
      same = r->buf + r->nidx <= kp->coop[q]->buf || kp->coop[q]->buf + kp->coop[q]->nidx <= r->buf;
    if (!same) break;
    int reads = 0;
    for (int q = i; q < k && !reads; q++) {
      tcc_ptrmap seen;
      if (tcc_ptrmap_init(&seen, 64)) {
        tcc_ptrmap_free(&seen);
        return 1;
      }
      reads = reads_node(r->a, kp->coop[q], &seen);
      tcc_ptrmap_free(&seen);
    }
    if (reads) break;
  }
  return n;
}

/* The tuning config of kernel k (tune.c; NULL: the heuristic below). */
static const tcc_kernel_config *kernel_config(const tcc_program *p, const tcc_kernel *k) {
  if (!p->kcfg) return NULL;
  int kno = 0;
  for (const tcc_kernel *q = p->kernels; q < k; q++) kno += !q->dead;
  return tcc_kernel_config_of(p, kno);
}

/* The launch geometry below is the heuristic unless kernel k has a
 * tuning config (tcc_kernel_config: block, ipt, wrow, split), which
 * replaces the matching choice; every choice lands in kp->launch (and
 * split_block), which both the code (__launch_bounds__, the loops' row
 * counts) and the manifest read, so they cannot disagree. */
static int plan_kernel(const tcc_program *p, const tcc_kernel *k, fvctx *fc, tcc_cuda_kernel_plan *kp) {
  memset(kp, 0, sizeof *kp);
  const tcc_kernel_config *cfg = kernel_config(p, k);
  int64_t cblock = cfg ? cfg->block : 0, ipt = cfg && cfg->ipt > 0 ? cfg->ipt : 1;
  int wrow = cfg ? cfg->wrow : 0;
  kp->numel = 1;
  for (int d = 0; d < k->rank; d++) kp->numel *= k->sizes[d];
  kp->reduction = has_reduce_any(k);
  if (kp->reduction) {
    tcc_ptrmap seen;
    if (tcc_ptrmap_init(&seen, 64)) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
    int rc = 0;
    node_list coop = {0};
    for (int s = 0; s < k->nstores && !rc; s++) rc = collect_coop(fc, k->stores[s].value, &seen, &coop);
    tcc_ptrmap_free(&seen);
    kp->coop = coop.n ? tcc_arena_array(p->arena, (size_t)coop.n, sizeof *kp->coop) : NULL;
    if (!rc && coop.n && !kp->coop) rc = -1;
    if (!rc && coop.n) memcpy(kp->coop, coop.v, sizeof *kp->coop * (size_t)coop.n);
    kp->ncoop = coop.n;
    free(coop.v);
    if (rc) return -1;
    int maxk = -1;
    kp->red_max = 1;
    for (int i = 0; i < kp->ncoop; i++) {
      const fvinfo *f = fv_vx(fc, kp->coop[i]);
      if (f && f->maxk > maxk) maxk = f->maxk;
      int64_t ext = tcc_cuda_reduce_extent(kp->coop[i]);
      if (ext > kp->red_max) kp->red_max = ext;
    }
    if (!kp->ncoop) kp->reduction = 0;   /* every REDUCE nested: per thread */
    kp->row_rank = maxk + 1;
  }
  kp->rows = 1;
  for (int d = 0; d < kp->row_rank; d++) kp->rows *= k->sizes[d];
  kp->inner = kp->rows ? kp->numel / kp->rows : 0;
  if (!kp->rows) kp->inner = 0;
  int64_t block, grid;
  int short_rows = kp->red_max <= 32 || (kp->rows >= WARP_MANY_ROWS && kp->red_max <= WARP_ROW_MAX);
  if (kp->reduction && kp->rows > 1 && (wrow > 0 || (wrow == 0 && short_rows))) {
    /* short rows: a warp per row, WARP_ROWS rows per block */
    kp->warp_rows = cblock ? (int)(cblock / 32) : WARP_ROWS;
    block = 32 * (int64_t)kp->warp_rows;
    grid = (kp->rows + kp->warp_rows - 1) / kp->warp_rows;
  } else if (kp->reduction) {
    block = 32;
    while (block < kp->red_max && block < MAX_RED_BLOCK) block *= 2;
    /* few long rows (a batch norm's statistics: 64 channels of 401408
     * elements): one block per row leaves most SMs idle, so each block
     * gets as many threads as it may, for more loads in flight */
    if (kp->rows <= FEW_ROWS && kp->red_max >= LONG_ROW) block = MAX_LONG_ROW_BLOCK;
    if (cblock) block = cblock;
    grid = kp->rows;
  } else {
    block = cblock ? cblock : POINTWISE_BLOCK;
    grid = (kp->numel + block * ipt - 1) / (block * ipt);
  }
  /* A very long reduction into few rows: one block per row would leave
   * the GPU idle, so it is split (split_groups). So are sibling
   * reductions that fold in one loop (a batch norm backward's two sums
   * over 64 channels of 401,408: 64 blocks on 132 SMs), each with
   * partials of its own. */
  int splittable = kp->reduction && !kp->warp_rows && kp->ncoop >= 1 &&
                   tcc_cuda_coop_group_size(kp, 0) == kp->ncoop;
  for (int i = 0; splittable && i < kp->ncoop; i++)
    splittable = kp->coop[i]->i != TCC_RED_ARGMAX && kp->coop[i]->i != TCC_RED_ARGMIN;
  if (splittable && kp->rows >= 1 && kp->rows <= SPLIT_MAX_ROWS && kp->red_max >= SPLIT_MIN_EXTENT) {
    int64_t groups = (kp->red_max + SPLIT_CHUNK - 1) / SPLIT_CHUNK;
    if (groups > SPLIT_MAX_GROUPS) groups = SPLIT_MAX_GROUPS;
    if (cfg && cfg->split > 0) groups = cfg->split;
    if (groups >= 2) kp->split = groups;
    kp->split_block = cblock ? cblock : MAX_RED_BLOCK;
  }
  if (grid < 1) grid = 1;
  if (grid > MAX_GRID) grid = MAX_GRID;
  kp->launch.split_groups = kp->split;
  kp->launch.grid = grid;
  kp->launch.block = block;
  kp->launch.shared_bytes = 0;
  kp->launch.numel = kp->numel;
  kp->launch.reduction = has_reduce_any(k);
  return 0;
}

#define ROW_CACHE_BYTES (32 << 10)
#define MAX_IX_VARS 256

typedef struct row_window {
  int state;                  /* 0 unseen, 1 cacheable so far, -1 not */
  int loads;                  /* distinct loads of the buffer */
  int64_t lo, hi;             /* storage index - row base, every load */
  const tcc_ix *const *idx;   /* the first load's indices (its row dims) */
  unsigned rowdims;           /* bit d: dim d reads row variables only */
} row_window;

typedef struct row_walk {
  const tcc_program *p;
  int row_rank;
  int64_t ext[MAX_IX_VARS];   /* variable extents (0: unknown) */
  row_window *w;              /* per buffer */
  const char *written;        /* per buffer: stored by this kernel */
  tcc_ptrmap seen;
  int oom;
} row_walk;

/* Which variables x reads: row ones (< row_rank), others, a tensor value. */
static void ix_deps(const tcc_ix *x, int row_rank, int *row, int *other, int *value) {
  if (!x) return;
  if (x->kind == TCC_IX_VAR) *(x->var < row_rank ? row : other) = 1;
  if (x->kind == TCC_IX_VALUE) *value = 1;
  ix_deps(x->a, row_rank, row, other, value);
  ix_deps(x->b, row_rank, row, other, value);
}

/* Bounds past which ix_range gives up (no int64 overflow below). */
#define IX_RANGE_LIMIT (INT64_C(1) << 40)

static int ix_range_raw(const tcc_ix *x, const int64_t *ext, int64_t *lo, int64_t *hi);

/* [lo, hi] of x over the variables' extents. Returns 0, or -1 when x
 * cannot be bounded (a tensor value, an unknown variable, a bound beyond
 * IX_RANGE_LIMIT). */
static int ix_range(const tcc_ix *x, const int64_t *ext, int64_t *lo, int64_t *hi) {
  if (ix_range_raw(x, ext, lo, hi)) return -1;
  return *lo < -IX_RANGE_LIMIT || *hi > IX_RANGE_LIMIT ? -1 : 0;
}

static int ix_range_raw(const tcc_ix *x, const int64_t *ext, int64_t *lo, int64_t *hi) {
  int64_t alo, ahi, blo, bhi;
  switch (x->kind) {
  case TCC_IX_CONST: *lo = *hi = x->c; return 0;
  case TCC_IX_VAR:
    if (x->var < 0 || x->var >= MAX_IX_VARS || ext[x->var] <= 0) return -1;
    *lo = 0, *hi = ext[x->var] - 1;
    return 0;
  case TCC_IX_ADD:
    if (ix_range(x->a, ext, &alo, &ahi) || ix_range(x->b, ext, &blo, &bhi)) return -1;
    *lo = alo + blo, *hi = ahi + bhi;
    return 0;
  case TCC_IX_MUL:
    if (ix_range(x->a, ext, &alo, &ahi) || __builtin_mul_overflow(alo, x->c, &alo) ||
        __builtin_mul_overflow(ahi, x->c, &ahi))
      return -1;
    *lo = x->c >= 0 ? alo : ahi;
    *hi = x->c >= 0 ? ahi : alo;
    return 0;
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    if (ix_range(x->a, ext, &alo, &ahi) || alo < 0 || x->c <= 0) return -1;
    if (x->kind == TCC_IX_DIV) *lo = alo / x->c, *hi = ahi / x->c;
    else if (ahi < x->c) *lo = alo, *hi = ahi;
    else *lo = 0, *hi = x->c - 1;
    return 0;
  case TCC_IX_MIN:
  case TCC_IX_MAX:
    if (ix_range(x->a, ext, &alo, &ahi)) return -1;
    if (x->kind == TCC_IX_MIN) *lo = alo < x->c ? alo : x->c, *hi = ahi < x->c ? ahi : x->c;
    else *lo = alo > x->c ? alo : x->c, *hi = ahi > x->c ? ahi : x->c;
    return 0;
  case TCC_IX_VALUE: return -1;
  }
  return -1;
}

/* The same index expression (no tensor values)? */
static int ix_same(const tcc_ix *a, const tcc_ix *b) {
  if (a == b) return 1;
  if (!a || !b || a->kind != b->kind || a->kind == TCC_IX_VALUE || a->var != b->var || a->c != b->c) return 0;
  return ix_same(a->a, b->a) && ix_same(a->b, b->b);
}

/* One load of buffer e->buf: its window, or the buffer is not cacheable. */
static void row_load(row_walk *rw, const tcc_vx *e) {
  row_window *w = &rw->w[e->buf];
  const tcc_meta *m = &rw->p->bufs[e->buf].layout;
  if (w->state < 0) return;
  if (rw->written[e->buf] || rw->p->bufs[e->buf].kind == TCC_BUF_CONST || m->rank > 31) {
    w->state = -1;
    return;
  }
  unsigned rowdims = 0;
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < m->rank; d++) {
    int row = 0, other = 0, value = 0;
    ix_deps(e->idx[d], rw->row_rank, &row, &other, &value);
    int64_t dlo, dhi;
    if (value || (row && other)) {
      w->state = -1;
      return;
    }
    if (row) {
      rowdims |= 1u << d;
      continue;
    }
    if (ix_range(e->idx[d], rw->ext, &dlo, &dhi) || m->strides[d] > IX_RANGE_LIMIT ||
        __builtin_mul_overflow(dlo, m->strides[d], &dlo) || __builtin_mul_overflow(dhi, m->strides[d], &dhi) ||
        __builtin_add_overflow(lo, dlo, &lo) || __builtin_add_overflow(hi, dhi, &hi)) {
      w->state = -1;
      return;
    }
  }
  if (w->state == 0) {
    w->state = 1;
    w->idx = e->idx;
    w->rowdims = rowdims;
    w->lo = lo, w->hi = hi;
    w->loads = 1;
    return;
  }
  if (w->rowdims != rowdims) {
    w->state = -1;
    return;
  }
  for (int d = 0; d < m->rank; d++)
    if ((rowdims >> d & 1) && !ix_same(w->idx[d], e->idx[d])) {
      w->state = -1;
      return;
    }
  if (lo < w->lo) w->lo = lo;
  if (hi > w->hi) w->hi = hi;
  w->loads++;
}

static void row_walk_ix(row_walk *rw, const tcc_ix *x);

/* Every load under e (REDUCEs first record their variables' extents). */
static void row_walk_vx(row_walk *rw, const tcc_vx *e) {
  if (rw->oom || tcc_ptrmap_get(&rw->seen, e)) return;
  if (tcc_ptrmap_put(&rw->seen, e, e)) {
    rw->oom = 1;
    return;
  }
  if (e->op == TCC_PRIM_REDUCE)
    for (int i = 0; i < e->nidx; i++) {
      int v = e->buf + i;
      if (v >= 0 && v < MAX_IX_VARS && e->idx[i]->c > rw->ext[v]) rw->ext[v] = e->idx[i]->c;
    }
  if (e->op == TCC_PRIM_LOAD) row_load(rw, e);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) row_walk_ix(rw, e->idx[d]);
  if (e->op == TCC_PRIM_EXTERN) return;
  if (e->a) row_walk_vx(rw, e->a);
  if (e->b) row_walk_vx(rw, e->b);
  if (e->c) row_walk_vx(rw, e->c);
}

static void row_walk_ix(row_walk *rw, const tcc_ix *x) {
  if (!x) return;
  if (x->kind == TCC_IX_VALUE) row_walk_vx(rw, x->v);
  row_walk_ix(rw, x->a);
  row_walk_ix(rw, x->b);
}

/* Chooses kernel k's row caches (kp->nrc). Returns 0 or -1 (out of
 * memory). */
static int plan_row_cache(const tcc_program *p, const tcc_kernel *k, tcc_cuda_kernel_plan *kp) {
  row_walk *rw = calloc(1, sizeof *rw);
  row_window *w = calloc((size_t)p->nbufs + 1, sizeof *w);
  char *written = calloc((size_t)p->nbufs + 1, 1);
  int rc = -1;
  if (!rw || !w || !written || tcc_ptrmap_init(&rw->seen, 64)) goto done;
  rw->p = p;
  rw->row_rank = kp->row_rank;
  rw->w = w;
  rw->written = written;
  for (int d = 0; d < k->rank && d < MAX_IX_VARS; d++) rw->ext[d] = k->sizes[d];
  for (int s = 0; s < k->nstores; s++) written[k->stores[s].buf] = 1;
  for (int s = 0; s < k->nstores; s++) {
    row_walk_vx(rw, k->stores[s].value);
    for (int d = 0; d < p->bufs[k->stores[s].buf].layout.rank; d++) row_walk_ix(rw, k->stores[s].idx[d]);
  }
  if (rw->oom) goto done;
  int64_t bytes = 0;
  for (int bi = 0; bi < p->nbufs && kp->nrc < TCC_CUDA_ROW_CACHE_MAX; bi++) {
    if (w[bi].state != 1 || w[bi].loads < 2) continue;
    int64_t n = w[bi].hi - w[bi].lo + 1, sz = n * tcc_dtype_size(p->bufs[bi].layout.dtype);
    if (n < 1 || bytes + sz > ROW_CACHE_BYTES) continue;
    bytes += sz;
    kp->rc[kp->nrc].buf = bi;
    kp->rc[kp->nrc].lo = w[bi].lo;
    kp->rc[kp->nrc].w = n;
    kp->rc[kp->nrc].idx = w[bi].idx;
    kp->rc[kp->nrc].rowdims = w[bi].rowdims;
    kp->nrc++;
  }
  rc = 0;
done:
  if (rw) tcc_ptrmap_free(&rw->seen);
  free(rw);
  free(w);
  free(written);
  return rc;
}

/* Vectorization of a pointwise kernel: every store, and the loads that
 * can, touch storage index c + e for flat index e (contiguous in the
 * iteration space's row-major order) with c a multiple of W, W = 16
 * bytes / the widest element among them, and W divides numel. Then each
 * thread handles W consecutive elements with one W-wide load per such
 * access and one W-wide store per output (128-bit for 4-byte types),
 * when the pointers are aligned at run time (else the scalar loop).
 * Returns W, or 0 when the kernel does not qualify. */
static int contiguous_access(const tcc_program *p, const tcc_kernel *k, int buf, const tcc_ix *const *idx,
                             int64_t *c) {
  const tcc_meta *m = &p->bufs[buf].layout;
  int64_t coef[TCC_MAX_DIMS], c0;
  if (!tcc_linear_affine(m->rank, idx, m->strides, k->rank, coef, &c0)) return 0;
  int64_t want = 1;
  for (int d = k->rank - 1; d >= 0; d--) {
    if (k->sizes[d] != 1 && coef[d] != want) return 0;
    want *= k->sizes[d];
  }
  *c = c0 + m->offset;
  return 1;
}

static void vec_loads(const tcc_program *p, const tcc_kernel *k, tcc_cuda_kernel_plan *kp, const tcc_vx *e,
                      tcc_ptrmap *seen, int *ok) {
  if (!*ok || tcc_ptrmap_get(seen, e)) return;
  if (tcc_ptrmap_put(seen, e, e)) {
    *ok = 0;
    return;
  }
  if (e->op == TCC_PRIM_REDUCE || e->op == TCC_PRIM_EXTERN) {
    *ok = 0;
    return;
  }
  if (e->op == TCC_PRIM_LOAD) {
    int64_t c;
    int have = 0;
    for (int i = 0; i < kp->nvacc; i++)
      have |= kp->vacc[i].buf == e->buf && kp->vacc[i].idx == e->idx && !kp->vacc[i].store;
    for (int d = 0; d < e->nidx; d++)
      if (e->idx[d]->kind == TCC_IX_VALUE) have = 1;   /* gathers stay scalar (and are not affine) */
    if (!have && kp->nvacc < TCC_CUDA_MAX_VEC_ACCESS && contiguous_access(p, k, e->buf, e->idx, &c)) {
      kp->vacc[kp->nvacc].buf = e->buf;
      kp->vacc[kp->nvacc].idx = e->idx;
      kp->vacc[kp->nvacc].c = c;
      kp->vacc[kp->nvacc].store = 0;
      kp->nvacc++;
    }
  }
  if (e->a) vec_loads(p, k, kp, e->a, seen, ok);
  if (e->b) vec_loads(p, k, kp, e->b, seen, ok);
  if (e->c) vec_loads(p, k, kp, e->c, seen, ok);
}

static int plan_vector(const tcc_program *p, const tcc_kernel *k, tcc_cuda_kernel_plan *kp, int64_t numel) {
  kp->nvacc = 0;
  if (k->nstores > TCC_CUDA_MAX_VEC_ACCESS / 2) return 0;
  for (int s = 0; s < k->nstores; s++) {
    const tcc_store *st = &k->stores[s];
    int64_t c;
    if (!contiguous_access(p, k, st->buf, st->idx, &c)) return 0;
    kp->vacc[kp->nvacc].buf = st->buf;
    kp->vacc[kp->nvacc].idx = st->idx;
    kp->vacc[kp->nvacc].c = c;
    kp->vacc[kp->nvacc].store = 1;
    kp->nvacc++;
  }
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return 0;
  }
  int ok = 1;
  for (int s = 0; s < k->nstores; s++) vec_loads(p, k, kp, k->stores[s].value, &seen, &ok);
  tcc_ptrmap_free(&seen);
  if (!ok) return 0;
  int es = 1;
  for (int i = 0; i < kp->nvacc; i++) {
    int e = tcc_dtype_size(p->bufs[kp->vacc[i].buf].layout.dtype);
    if (e > es) es = e;
  }
  int W = 16 / es;
  if (W < 2 || numel % W) return 0;
  for (int i = 0; i < kp->nvacc; i++)
    if (kp->vacc[i].c % W) return 0;
  return W;
}

/* A vectorized kernel's threads take vec_width elements each: as many
 * blocks as cover numel / W. (plan_kernel sized the grid for one element
 * a thread, which left three blocks in four with no work: GELU over
 * ViT-B's 19.4M elements took 66 us on the H200, Inductor's 36.) A call
 * whose pointers fail the alignment check runs the scalar loop over the
 * same grid, striding. */
static void vector_grid(tcc_cuda_kernel_plan *kp, int64_t ipt) {
  int64_t per_block = kp->launch.block * ipt * kp->vec_width;
  int64_t grid = (kp->numel + per_block - 1) / per_block;
  kp->launch.grid = grid < 1 ? 1 : grid > MAX_GRID ? MAX_GRID : grid;
}

/* Buffers a kernel touches (sorted ids) into used (length nbufs). */
static void mark_ix(const tcc_ix *x, char *used, tcc_ptrmap *seen);
static void mark_used(const tcc_vx *e, char *used, tcc_ptrmap *seen) {
  if (tcc_ptrmap_get(seen, e)) return;
  tcc_ptrmap_put(seen, e, e);
  if (e->op == TCC_PRIM_LOAD) used[e->buf] = 1;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) mark_ix(e->idx[d], used, seen);
  if (e->a) mark_used(e->a, used, seen);
  if (e->b) mark_used(e->b, used, seen);
  if (e->c) mark_used(e->c, used, seen);
}
static void mark_ix(const tcc_ix *x, char *used, tcc_ptrmap *seen) {
  if (!x) return;
  if (x->kind == TCC_IX_VALUE) mark_used(x->v, used, seen);
  mark_ix(x->a, used, seen);
  mark_ix(x->b, used, seen);
}

/* Does every index of the kernel fit in int? */
static int fits_int32(const tcc_program *p, const tcc_kernel *k, const char *used, const tcc_cuda_kernel_plan *kp) {
  if (kp->numel >= IDX32_LIMIT) return 0;
  for (int bi = 0; bi < p->nbufs; bi++) {
    if (!used[bi]) continue;
    const tcc_meta *m = &p->bufs[bi].layout;
    if (m->span + m->offset >= IDX32_LIMIT) return 0;
    for (int d = 0; d < m->rank; d++)
      if (m->strides[d] >= IDX32_LIMIT || m->strides[d] <= -IDX32_LIMIT) return 0;
  }
  for (int i = 0; i < kp->ncoop; i++)
    if (tcc_cuda_reduce_extent(kp->coop[i]) >= IDX32_LIMIT) return 0;
  (void)k;
  return 1;
}

/* ------------------------------------------------------ the schedule */

static int64_t align256(int64_t x) { return (x + 255) & ~(int64_t)255; }

/* Where buffer bi starts, as a cuBLAS operand base. */
static tcc_cuda_ref buffer_ref(const tcc_program *p, int bi, int64_t elem_offset) {
  const tcc_buffer *B = &p->bufs[bi];
  tcc_cuda_ref r = {.index = B->pos};
  int64_t bytes = elem_offset * tcc_dtype_size(B->layout.dtype);
  switch (B->kind) {
  case TCC_BUF_INPUT: r.base = TCC_CUDA_INPUT; break;
  case TCC_BUF_OUTPUT: r.base = TCC_CUDA_OUTPUT; break;
  case TCC_BUF_CONST: r.base = TCC_CUDA_CONSTANT, r.index = bi; break;
  case TCC_BUF_TEMP: r.base = TCC_CUDA_WORKSPACE, bytes += B->ws_offset; break;
  }
  r.offset_bytes = bytes;
  return r;
}

/* The column-major form of a logical R x C matrix whose element (i, j)
 * is at i * si + j * sj: op N with ld, or op T (stored transposed).
 * Returns 0, or -1 when cuBLAS cannot read it as it is. */
static int blas_view(int64_t R, int64_t C, int64_t si, int64_t sj, int *trans, int64_t *ld) {
  int64_t r1 = R > 1 ? R : 1, c1 = C > 1 ? C : 1;
  if ((si == 1 || R == 1) && (C == 1 || sj >= r1)) {
    *trans = 0;
    *ld = C == 1 ? r1 : sj;
    return 0;
  }
  if ((sj == 1 || C == 1) && (R == 1 || si >= c1)) {
    *trans = 1;
    *ld = R == 1 ? c1 : si;
    return 0;
  }
  return -1;
}

/* The affine form of a load/store over (b, r, c): strides per var and the
 * element offset (storage offset included). */
static int operand_affine(const tcc_program *p, int buf, int nidx, const tcc_ix *const *idx, int64_t coef[3],
                          int64_t *c0) {
  const tcc_meta *L = &p->bufs[buf].layout;
  if (!tcc_linear_affine(nidx, idx, L->strides, 3, coef, c0)) return -1;
  *c0 += L->offset;
  return 0;
}

/* Does GEMM kernel K come from a convolution (its provenance node)? */
static int gemm_of_conv(const tcc_program *p, const tcc_kernel *K) {
  for (int i = 0; i < K->nnodes; i++) {
    int id = p->graph->nodes[K->nodes[i]].op->id;
    if (id == TCC_OP_CONVOLUTION || id == TCC_OP_CONVOLUTION_BACKWARD) return 1;
  }
  return 0;
}

/* Row-major C[b, m, n] = A[b, m, :] . B[b, :, n] as cuBLAS's column-major
 * C^T = B^T A^T: cuBLAS's A is our B (N x K), its B our A (K x M).
 * float32 computes in TF32 where the target allows it as PyTorch does:
 * a convolution's GEMMs with cudnn.allow_tf32, other GEMMs with
 * cuda.matmul.allow_tf32. */
static int describe_gemm(const tcc_program *p, const tcc_kernel *K, tcc_cuda_gemm *g, tcc_error *err) {
  const tcc_store *st = &K->stores[0];
  const tcc_vx *e = st->value;
  int64_t Bn = e->idx[0]->c, M = e->idx[1]->c, N = e->idx[2]->c, Kd = e->idx[3]->c;
  int64_t ca[3], cb[3], cc[3], oa, ob, oc;
  if (operand_affine(p, e->a->buf, e->a->nidx, e->a->idx, ca, &oa) ||
      operand_affine(p, e->b->buf, e->b->nidx, e->b->idx, cb, &ob) ||
      operand_affine(p, st->buf, p->bufs[st->buf].layout.rank, st->idx, cc, &oc))
    return tcc_error_set(err, TCC_E_INTERNAL, "CUDA GEMM: an operand is not affine");
  memset(g, 0, sizeof *g);
  g->m = N, g->n = M, g->k = Kd, g->batch = Bn;
  int tc;
  if (blas_view(N, Kd, cb[2], cb[1], &g->trans_a, &g->lda) || blas_view(Kd, M, ca[2], ca[1], &g->trans_b, &g->ldb) ||
      blas_view(N, M, cc[2], cc[1], &tc, &g->ldc) || tc)
    return tcc_error_set(err, TCC_E_INTERNAL, "CUDA GEMM: an operand's strides do not fit cuBLAS");
  g->stride_a = Bn > 1 ? cb[0] : 0;
  g->stride_b = Bn > 1 ? ca[0] : 0;
  g->stride_c = Bn > 1 ? cc[0] : 0;
  g->ab_dtype = e->a->dtype;
  g->c_dtype = e->dtype;
  const tcc_target_spec *ts = &p->graph->target;
  int tf32 = e->a->dtype == TCC__V1__DTYPE__FLOAT32 && e->dtype == TCC__V1__DTYPE__FLOAT32 &&
             (gemm_of_conv(p, K) ? ts->conv_tf32 : ts->matmul_tf32);
  g->compute = e->dtype == TCC__V1__DTYPE__FLOAT64 ? "64F" : tf32 ? "32F_FAST_TF32" : "32F";
  g->a = buffer_ref(p, e->b->buf, ob);
  g->b = buffer_ref(p, e->a->buf, oa);
  g->c = buffer_ref(p, st->buf, oc);
  const int64_t lim = INT32_MAX;
  if (g->m > lim || g->n > lim || g->k > lim || g->batch > lim || g->lda > lim || g->ldb > lim || g->ldc > lim)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "matmul of [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                         "] (batch, M, N, K): cuBLAS takes sizes up to 2^31-1", Bn, M, N, Kd);
  return 0;
}

/* Is e the identity load of a whole dense row-major buffer? */
static int dense_operand(const tcc_program *p, const tcc_vx *e) {
  if (!e || e->op != TCC_PRIM_LOAD) return 0;
  const tcc_meta *L = &p->bufs[e->buf].layout;
  if (e->nidx != L->rank || !tcc_meta_is_contiguous(L)) return 0;
  for (int d = 0; d < L->rank; d++)
    if (e->idx[d]->kind != TCC_IX_VAR || e->idx[d]->var != d) return 0;
  return 1;
}

/* A convolution EXTERN kernel as one cuDNN call. conv.c hands it dense
 * operands (packed when they were not) and a dense TEMP to write; the
 * result is cross-checked here. float32 may use TF32 with
 * cudnn.allow_tf32, as PyTorch's cuDNN convolutions do. */
static int describe_conv(const tcc_program *p, const tcc_kernel *K, tcc_cuda_conv *c, tcc_error *err) {
  const tcc_store *st = &K->stores[0];
  const tcc_vx *e = st->value;
  const tcc_meta *out = &p->bufs[st->buf].layout;
  int ok = e->nidx == TCC_CONV_NPARAM && dense_operand(p, e->a) && dense_operand(p, e->b) &&
           tcc_meta_is_contiguous(out) && e->a->dtype == e->dtype && e->b->dtype == e->dtype && out->dtype == e->dtype;
  for (int d = 0; ok && d < out->rank; d++) ok = st->idx[d]->kind == TCC_IX_VAR && st->idx[d]->var == d;
  if (!ok) return tcc_error_set(err, TCC_E_INTERNAL, "CUDA convolution: an operand is not a dense NCHW buffer");
  memset(c, 0, sizeof *c);
  c->kind = (int)e->i;
  for (int i = 0; i < TCC_CONV_NPARAM; i++) c->prm[i] = e->idx[i]->c;
  if (c->prm[TCC_CONV_TRANSPOSED])
    return tcc_error_set(err, TCC_E_INTERNAL, "CUDA convolution: transposed convolutions take the GEMM road");
  c->dtype = e->dtype;
  c->tf32 = e->dtype == TCC__V1__DTYPE__FLOAT32 && p->graph->target.conv_tf32;
  c->a = buffer_ref(p, e->a->buf, p->bufs[e->a->buf].layout.offset);
  c->b = buffer_ref(p, e->b->buf, p->bufs[e->b->buf].layout.offset);
  c->c = buffer_ref(p, st->buf, out->offset);
  if (c->c.base == TCC_CUDA_CONSTANT || c->c.base == TCC_CUDA_INPUT)
    return tcc_error_set(err, TCC_E_INTERNAL, "CUDA convolution: writes a constant or an input");
  return 0;
}

/* An extern step other than a GEMM or a convolution: UNIMPLEMENTED
 * naming the node whose value it writes. */
static int unsupported_extern(const tcc_program *p, const tcc_kernel *K, tcc_error *err) {
  const tcc_graph *g = p->graph;
  const tcc_buffer *B = &p->bufs[K->stores[0].buf];
  const char *op = "extern";
  int node = -1;
  for (int n = 0; n < g->nnodes && node < 0 && B->value >= 0; n++)
    for (int o = 0; o < g->nodes[n].nout; o++)
      if (g->nodes[n].outs[o] == B->value) node = g->nodes[n].src_index, op = g->nodes[n].op->name;
  for (int n = 0; n < g->nnodes && node < 0; n++)
    if (g->nodes[n].op->kind == TCC_OPK_EXTERN && !tcc_cuda_extern_op(g->nodes[n].op->id))
      node = g->nodes[n].src_index, op = g->nodes[n].op->name;
  return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "'%s' (node %d) is not supported by the CUDA backend yet", op, node);
}

/* The plan of live kernel k (not extern), in the program's arena. */
static int plan_one(const tcc_program *p, const tcc_kernel *k, int kno, tcc_cuda_kernel_plan **out) {
  tcc_cuda_kernel_plan *kp = tcc_arena_alloc(p->arena, sizeof *kp);
  char *used = tcc_arena_alloc(p->arena, (size_t)p->nbufs + 1);
  fvctx fc = {0};
  int rc = -1;
  if (!kp || !used || tcc_ptrmap_init(&fc.map, 64) || plan_kernel(p, k, &fc, kp) || fc.oom) goto done;
  memset(used, 0, (size_t)p->nbufs + 1);
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    goto done;
  }
  for (int s = 0; s < k->nstores; s++) {
    used[k->stores[s].buf] = 1;
    mark_used(k->stores[s].value, used, &seen);
    const tcc_meta *m = &p->bufs[k->stores[s].buf].layout;
    for (int d = 0; d < m->rank; d++) mark_ix(k->stores[s].idx[d], used, &seen);
  }
  tcc_ptrmap_free(&seen);
  kp->used = used;
  kp->idx32 = fits_int32(p, k, used, kp);
  const tcc_kernel_config *kcfg = tcc_kernel_config_of(p, kno);
  if (kcfg && kcfg->persist && kp->reduction && !kp->warp_rows && kp->split <= 1 && kp->numel &&
      plan_row_cache(p, k, kp))
    goto done;
  if (!kp->reduction && !kp->launch.reduction && kp->numel &&
      (kp->vec_width = plan_vector(p, k, kp, kp->numel)))
    vector_grid(kp, kcfg && kcfg->ipt > 0 ? kcfg->ipt : 1);
  *out = kp;
  rc = 0;
done:
  fv_free(&fc);
  return rc;
}

int tcc_cuda_schedule_pass(tcc_program *p, tcc_error *err) {
  for (int bi = 0; bi < p->nbufs; bi++)
    if (!p->bufs[bi].dead && !tcc_cuda_ctype(p->bufs[bi].layout.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "%s tensors are not supported by the CUDA "
                           "backend yet", tcc_dtype_name(p->bufs[bi].layout.dtype));
  tcc_cuda_schedule *s = tcc_arena_alloc(p->arena, sizeof *s);
  int nk = tcc_program_live_kernels(p);
  if (!s || !(s->steps = tcc_arena_array(p->arena, (size_t)nk * 2 + 1, sizeof *s->steps)))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  memset(s->steps, 0, sizeof *s->steps * ((size_t)nk * 2 + 1));
  s->n = s->n_global = 0;
  int64_t ws = p->workspace_bytes;
  int rc = 0;
  for (int k = 0, kno = 0; k < p->nkernels && !rc; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    tcc_cuda_step *st = &s->steps[s->n];
    st->kernel = k;
    st->kno = kno;
    snprintf(st->name, sizeof st->name, "k%d", kno);
    st->numel = 1;
    for (int d = 0; d < K->rank; d++) st->numel *= K->sizes[d];
    if (K->kind == TCC_OPK_EXTERN) {
      const tcc_vx *call = K->stores[0].value;
      st->kind = "extern";
      if (call->op == TCC_PRIM_EXTERN && call->i == TCC_EXT_GEMM) {
        st->is_gemm = 1;
        rc = describe_gemm(p, K, &st->gemm, err);
      } else if (call->op == TCC_PRIM_EXTERN && tcc_ext_is_conv((int)call->i)) {
        st->is_conv = 1;
        rc = describe_conv(p, K, &st->conv, err);
      } else {
        st->is_gemm = 1;   /* (no launch either way) */
        rc = unsupported_extern(p, K, err);
      }
      s->n++;
      kno++;
      continue;
    }
    tcc_cuda_kernel_plan *kp = NULL;
    if (plan_one(p, K, kno, &kp)) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    const char *kind = kp->launch.reduction ? "reduction" : "pointwise";
    if (kp->split > 1) {
      int64_t off = align256(ws);
      ws = off + kp->split * kp->rows * kp->ncoop * (int64_t)sizeof(double);
      tcc_cuda_step *sp = st;
      snprintf(sp->name, sizeof sp->name, "k%d_split", kno);
      sp->kind = "split-reduction";
      sp->split_stage = 1;
      sp->grid[0] = kp->split;
      sp->grid[1] = kp->rows;
      sp->block = kp->split_block;
      sp->numel = kp->red_max * kp->rows;
      sp->split_off = off;
      sp->plan = kp;
      s->n_global++;
      st = &s->steps[++s->n];
      st->kernel = k;
      st->kno = kno;
      snprintf(st->name, sizeof st->name, "k%d", kno);
      st->numel = kp->numel;
      st->split_off = off;
    }
    st->kind = kind;
    st->grid[0] = kp->launch.grid;
    st->grid[1] = 1;
    st->block = kp->launch.block;
    st->shared_bytes = kp->launch.shared_bytes;
    st->plan = kp;
    s->n_global++;
    s->n++;
    kno++;
  }
  s->workspace_bytes = ws;
  if (!rc) p->sched.cuda = s;
  return rc;
}

/* ------------------------------------------------------ check and dump */

int tcc_cuda_schedule_check(const tcc_program *p, tcc_error *err) {
  const tcc_cuda_schedule *s = p->sched.cuda;
  if (!s) return tcc_error_set(err, TCC_E_INTERNAL, "no CUDA schedule");
  int live = tcc_program_live_kernels(p), kno = 0, global = 0;
  for (int i = 0; i < s->n; i++) {
    const tcc_cuda_step *st = &s->steps[i];
    if (st->kernel < 0 || st->kernel >= p->nkernels || p->kernels[st->kernel].dead)
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: not a live kernel", st->name);
    if (st->kno != kno)
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: out of launch order", st->name);
    if (tcc_cuda_step_is_library(st)) {
      if (st->is_gemm == st->is_conv)
        return tcc_error_set(err, TCC_E_INTERNAL, "step %s: both a GEMM and a convolution", st->name);
      kno++;
      continue;
    }
    global++;
    const tcc_cuda_kernel_plan *kp = st->plan;
    if (!kp) return tcc_error_set(err, TCC_E_INTERNAL, "step %s: no plan", st->name);
    int64_t block = st->block;
    if (block < 32 || block > 1024 || block % 32)
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: block %" PRId64 " is not 32..1024 threads in warps",
                           st->name, block);
    if (st->grid[0] < 1 || st->grid[0] > (st->split_stage ? INT32_MAX : MAX_GRID) || st->grid[1] < 1)
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: grid %" PRId64 " x %" PRId64 " out of range", st->name,
                           st->grid[0], st->grid[1]);
    if (kp->warp_rows && kp->launch.block != 32 * (int64_t)kp->warp_rows)
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: %d warp rows in a block of %" PRId64, st->name,
                           kp->warp_rows, kp->launch.block);
    if (st->split_stage != (kp->split > 1 && (i + 1 < s->n && s->steps[i + 1].kernel == st->kernel)))
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: split stage without its final step", st->name);
    if (kp->split > 1 && (st->split_off % 256 || st->split_off + kp->split * kp->rows * kp->ncoop * 8 >
                                                      s->workspace_bytes))
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: partials outside the workspace", st->name);
    if (kp->nrc && (kp->warp_rows || kp->split > 1 || !kp->reduction))
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: row caches outside a block-per-row kernel", st->name);
    if (kp->vec_width && (kp->reduction || kp->numel % kp->vec_width))
      return tcc_error_set(err, TCC_E_INTERNAL, "step %s: vector width %d does not divide the elements",
                           st->name, kp->vec_width);
    if (!st->split_stage) kno++;
  }
  if (kno != live)
    return tcc_error_set(err, TCC_E_INTERNAL, "launch plan covers %d of %d kernels", kno, live);
  if (global > s->n || s->n_global != global)
    return tcc_error_set(err, TCC_E_INTERNAL, "launch plan counts %d launches, has %d", s->n_global, global);
  if (s->workspace_bytes < p->workspace_bytes)
    return tcc_error_set(err, TCC_E_INTERNAL, "workspace shrank");
  return 0;
}

void tcc_cuda_schedule_dump(const tcc_program *p, tcc_buf *b) {
  const tcc_cuda_schedule *s = p->sched.cuda;
  if (!s) return;
  tcc_buf_printf(b, "cuda schedule: %d steps, %d launches, workspace %" PRId64 " bytes\n", s->n, s->n_global,
                 s->workspace_bytes);
  for (int i = 0; i < s->n; i++) {
    const tcc_cuda_step *st = &s->steps[i];
    tcc_buf_printf(b, "  %s (kernel %d) %s", st->name, st->kernel, st->kind);
    if (st->is_gemm) {
      const tcc_cuda_gemm *G = &st->gemm;
      tcc_buf_printf(b, ": cuBLAS %c%c m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " batch=%" PRId64 " %s\n",
                     G->trans_a ? 'T' : 'N', G->trans_b ? 'T' : 'N', G->m, G->n, G->k, G->batch, G->compute);
      continue;
    }
    if (st->is_conv) {
      static const char *const what[] = {[TCC_EXT_CONV_FWD] = "forward", [TCC_EXT_CONV_BWD_DATA] = "backward-data",
                                         [TCC_EXT_CONV_BWD_WEIGHTS] = "backward-filter"};
      const tcc_cuda_conv *C = &st->conv;
      tcc_buf_printf(b, ": cuDNN convolution %s N=%" PRId64 " Cin=%" PRId64 " Cout=%" PRId64 " groups=%" PRId64
                     " %s%s\n", what[C->kind], C->prm[TCC_CONV_N], C->prm[TCC_CONV_CIN], C->prm[TCC_CONV_COUT],
                     C->prm[TCC_CONV_G], tcc_dtype_name(C->dtype), C->tf32 ? " tf32" : "");
      continue;
    }
    const tcc_cuda_kernel_plan *kp = st->plan;
    tcc_buf_printf(b, ": grid %" PRId64 " x %" PRId64 ", block %" PRId64 ", %s indices", st->grid[0], st->grid[1],
                   st->block, kp->idx32 ? "int" : "long long");
    if (kp->reduction)
      tcc_buf_printf(b, "; rows %" PRId64 " (dims 0..%d) by %s, %d cooperative reduction%s up to %" PRId64,
                     kp->rows, kp->row_rank - 1, kp->warp_rows ? "warp" : "block", kp->ncoop,
                     kp->ncoop == 1 ? "" : "s", kp->red_max);
    if (kp->split > 1)
      tcc_buf_printf(b, "; split %" PRId64 " groups, partials at ws + %" PRId64, kp->split, st->split_off);
    if (kp->nrc) {
      tcc_buf_puts(b, "; persistent rows of");
      for (int r = 0; r < kp->nrc; r++) tcc_buf_printf(b, " b%d[%" PRId64 "]", kp->rc[r].buf, kp->rc[r].w);
    }
    if (kp->vec_width) tcc_buf_printf(b, "; vector width %d over %d accesses", kp->vec_width, kp->nvacc);
    tcc_buf_puts(b, "\n");
  }
}
