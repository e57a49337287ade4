/*
 * emit_cuda.c — CUDA C for the CUDA target, and its NVRTC build.
 *
 * Requires: a checked, planned program (the same scheduled loop IR the C
 * emitter reads: fusion already grouped softmax and layer_norm into one
 * kernel each, and this emitter keeps that grouping: one __global__ per
 * live kernel).
 * Produces: one translation unit with no #includes (NVRTC 13 has no
 * built-in headers) holding, per live kernel j,
 *
 *   extern "C" __global__ void k<j>(const void *in0, ..., void *out0, ...,
 *                                   char *ws)
 *
 * (ABI 1 of runtime/tcc_runtime.h: inputs, outputs, workspace; every
 * kernel takes all of them). Shapes, strides, storage offsets and
 * workspace offsets are compiled in. The launch configuration of each kernel
 * (tcc_cuda_geometry_for) is a pure function of the kernel and its
 * tuning config (max-autotune: tcc_kernel_config's block, ipt, wrow,
 * split, persist; all zero = the heuristic below, byte for byte), so the
 * emitter (its __launch_bounds__) and the manifest agree.
 *
 * Kernel structure.
 *   pointwise  a grid-stride loop over the flattened iteration space
 *              (256 threads per block, at most 65536 blocks); the flat
 *              index is split into the loop variables, each value is
 *              computed once per element (common subexpressions share a
 *              temporary), stores use the buffers' strides. When every
 *              store (and any load that can) is contiguous in the flat
 *              index with an offset that is a multiple of W = 16 bytes /
 *              the widest element, and W divides the element count, each
 *              thread takes W consecutive elements: one W-wide load per
 *              such input (ld.global.v4.f32 for float32), the W lanes
 *              computed in an unrolled loop, one W-wide store per output
 *              (st.global.v4). The pointers' alignment is checked at run
 *              time (storage bases are normally 256-byte aligned); a
 *              misaligned call runs the scalar loop.
 *   reduction  "row" = the leading kernel dims that the reductions read
 *              (i0..i{r-1}, r = 1 + the highest kernel variable any
 *              reduction depends on); one block per row (grid-stride over
 *              rows). Each reduction whose value depends on the row only
 *              ("cooperative") is folded by the block: every thread
 *              folds a strided slice of the reduction domain, then warp
 *              shuffles (__shfl_down_sync) and one shared-memory stage
 *              combine the partials, and every thread receives the
 *              result. Reductions run in dependency order (softmax: max,
 *              then the sum that reads the max), then the threads share
 *              the row's remaining dims for the stores. So softmax and
 *              layer_norm are one kernel, looped over the row (each
 *              reduction re-reads the row; the tuning config persist=1
 *              copies such rows to shared memory once instead: see
 *              plan_row_cache). A reduction nested in another
 *              one's body that depends on the outer's variables is folded
 *              sequentially by each thread. Block size: the reduction
 *              extent rounded up to a power of two, 32..256. Rows of at
 *              most 32 elements go one warp per row (8 rows per block of
 *              256): the same structure with the lane for the thread and
 *              a warp reduction (shuffles, lane 0's result broadcast),
 *              no shared memory and no __syncthreads.
 *   split      a cooperative reduction of >= SPLIT_MIN_EXTENT elements into
 *              <= SPLIT_MAX_ROWS rows: k<j>_split folds grid-stride
 *              slices into partials in the workspace, k<j> folds the
 *              partials (see SPLIT_* below).
 *   extern     (GEMM) no code: a step of the launch plan the client runs
 *              with cublasGemmStridedBatchedEx (describe_gemm maps the
 *              row-major C = A B onto cuBLAS's column-major C^T = B^T A^T;
 *              the manifest's GemmStep carries the call). Other extern
 *              kinds are TCC_E_UNIMPLEMENTED naming the op.
 * The schedule (tcc_cuda_schedule_make) lists the plan's steps once for
 * the emitter, the NVRTC build (kernel names) and the manifest.
 * Indices are `int` when every extent and storage offset of the kernel
 * fits comfortably in 31 bits, else `long long`.
 *
 * Dtypes: float32, float64, int8/16/32/64, uint8, bool; float16 and
 * bfloat16 are stored as their bits (unsigned short) and converted with
 * PTX cvt instructions (lowering already computes them in float32).
 * Reductions fold in the dtype the IR gives them (float32 for half
 * inputs). Index values read from tensors (gather, embedding) that are
 * out of range read index 0 and integer division by zero yields 0: a
 * kernel has no way to report it under ABI 1 (the CPU target returns 1).
 *
 * Hygiene: as in emit_c.c, only numbers from the request reach the
 * source; floats are exact hexadecimal literals.
 */
#include "loop.h"
#include "nvrtc.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ types */

static const char *ctype(tcc_dtype d) {
  switch (d) {
  case TCC__V1__DTYPE__FLOAT32: return "float";
  case TCC__V1__DTYPE__FLOAT64: return "double";
  case TCC__V1__DTYPE__INT8: return "int8_t";
  case TCC__V1__DTYPE__INT16: return "int16_t";
  case TCC__V1__DTYPE__INT32: return "int32_t";
  case TCC__V1__DTYPE__INT64: return "int64_t";
  case TCC__V1__DTYPE__UINT8:
  case TCC__V1__DTYPE__BOOL: return "uint8_t";
  case TCC__V1__DTYPE__FLOAT16:
  case TCC__V1__DTYPE__BFLOAT16: return "uint16_t";   /* bits */
  default: return NULL;
  }
}

static int is_half(tcc_dtype d) {
  return d == TCC__V1__DTYPE__FLOAT16 || d == TCC__V1__DTYPE__BFLOAT16;
}

static int is_float(tcc_dtype d) { return tcc_dtype_is_float(d) && !is_half(d); }

static void put_float(tcc_buf *b, double v, tcc_dtype d) {
  int f32 = d != TCC__V1__DTYPE__FLOAT64;
  if (isnan(v)) {
    tcc_buf_puts(b, f32 ? "TCC_NANF" : "TCC_NAN");
  } else if (isinf(v)) {
    tcc_buf_printf(b, "%s%s", v < 0 ? "-" : "", f32 ? "TCC_INFF" : "TCC_INF");
  } else {
    tcc_put_hexfloat(b, f32 ? (double)(float)v : v);
    if (f32) tcc_buf_puts(b, "f");
  }
}

static void put_literal(tcc_buf *b, const tcc_vx *e) {
  if (tcc_dtype_is_float(e->dtype)) put_float(b, e->f, e->dtype);
  else if (e->dtype == TCC__V1__DTYPE__INT64) tcc_put_int64(b, e->i);
  else tcc_buf_printf(b, "((%s)%" PRId64 ")", ctype(e->dtype), e->i);
}

/* ------------------------------------------------------- constants */

static void emit_constant(tcc_buf *b, const tcc_buffer *B, int id) {
  int64_t n = B->layout.numel;
  tcc_buf_printf(b, "__device__ const %s b%d_data[%" PRId64 "] = ", ctype(B->layout.dtype), id,
                 n ? n : 1);
  tcc_put_constant_elements(b, B, put_float, 0);
}

/* ------------------------------------------------- launch geometry */

#define POINTWISE_BLOCK 256
#define MAX_GRID 65536
#define MAX_RED_BLOCK 256
#define WARP_ROWS 8
#define IDX32_LIMIT (INT64_C(1) << 30)
/* Split reductions: a cooperative reduction of at least SPLIT_MIN_EXTENT
 * elements per row, with at most SPLIT_MAX_ROWS rows, is folded in two
 * launches: k<j>_split, grid (groups, rows) of MAX_RED_BLOCK threads,
 * each block folding a grid-stride slice of its row into one partial in
 * the workspace (after the program's own, 256-byte aligned), then k<j>,
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

/* A REDUCE computed by the whole block: reads no variable bound outside. */
static int cooperative(fvctx *c, const tcc_vx *e) {
  const fvinfo *f = fv_vx(c, e);
  return f && !f->nbound && !f->overflow;
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

static int64_t reduce_extent(const tcc_vx *r) {
  int64_t n = 1;
  for (int i = 0; i < r->nidx; i++) n *= r->idx[i]->c;
  return n;
}

/* Everything about one kernel's shape on the GPU. */
typedef struct kplan {
  int reduction;          /* block-per-row kernel */
  int row_rank;           /* r: dims 0..r-1 are the row */
  int64_t rows, inner;    /* product of row dims / of the others */
  int64_t numel;
  int64_t red_max;        /* largest cooperative reduction extent */
  int warp_rows;          /* > 0: one warp per row, this many rows per block */
  node_list coop;         /* cooperative reductions, dependency order */
  int64_t split;          /* > 1: split reduction into this many groups per row */
  int64_t split_block;    /* threads per block of the split stage */
  tcc_cuda_geometry launch;
} kplan;

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
static int plan_kernel(const tcc_program *p, const tcc_kernel *k, fvctx *fc, kplan *kp) {
  memset(kp, 0, sizeof *kp);
  const tcc_kernel_config *cfg = kernel_config(p, k);
  int64_t cblock = cfg ? cfg->block : 0, ipt = cfg && cfg->ipt > 0 ? cfg->ipt : 1;
  int wrow = cfg ? cfg->wrow : 0;
  kp->numel = 1;
  for (int d = 0; d < k->rank; d++) kp->numel *= k->sizes[d];
  kp->reduction = has_reduce_any(k);
  (void)p;
  if (kp->reduction) {
    tcc_ptrmap seen;
    if (tcc_ptrmap_init(&seen, 64)) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
    int rc = 0;
    for (int s = 0; s < k->nstores && !rc; s++) rc = collect_coop(fc, k->stores[s].value, &seen, &kp->coop);
    tcc_ptrmap_free(&seen);
    if (rc) return -1;
    int maxk = -1;
    kp->red_max = 1;
    for (int i = 0; i < kp->coop.n; i++) {
      const fvinfo *f = fv_vx(fc, kp->coop.v[i]);
      if (f && f->maxk > maxk) maxk = f->maxk;
      int64_t ext = reduce_extent(kp->coop.v[i]);
      if (ext > kp->red_max) kp->red_max = ext;
    }
    if (!kp->coop.n) kp->reduction = 0;   /* every REDUCE nested: per thread */
    kp->row_rank = maxk + 1;
  }
  kp->rows = 1;
  for (int d = 0; d < kp->row_rank; d++) kp->rows *= k->sizes[d];
  kp->inner = kp->rows ? kp->numel / kp->rows : 0;
  if (!kp->rows) kp->inner = 0;
  int64_t block, grid;
  if (kp->reduction && kp->rows > 1 && (wrow > 0 || (wrow == 0 && kp->red_max <= 32))) {
    /* short rows: a warp per row, WARP_ROWS rows per block */
    kp->warp_rows = cblock ? (int)(cblock / 32) : WARP_ROWS;
    block = 32 * (int64_t)kp->warp_rows;
    grid = (kp->rows + kp->warp_rows - 1) / kp->warp_rows;
  } else if (kp->reduction) {
    block = 32;
    while (block < kp->red_max && block < MAX_RED_BLOCK) block *= 2;
    if (cblock) block = cblock;
    grid = kp->rows;
  } else {
    block = cblock ? cblock : POINTWISE_BLOCK;
    grid = (kp->numel + block * ipt - 1) / (block * ipt);
  }
  /* A very long reduction into few rows: one block per row would leave
   * the GPU idle, so it is split (split_groups). */
  if (kp->reduction && !kp->warp_rows && kp->coop.n == 1 && kp->rows >= 1 && kp->rows <= SPLIT_MAX_ROWS &&
      kp->red_max >= SPLIT_MIN_EXTENT && kp->coop.v[0]->i != TCC_RED_ARGMAX && kp->coop.v[0]->i != TCC_RED_ARGMIN) {
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

int tcc_cuda_geometry_for(const tcc_program *p, const tcc_kernel *k, tcc_cuda_geometry *out) {
  fvctx fc = {0};
  kplan kp;
  int rc = -1;
  if (!tcc_ptrmap_init(&fc.map, 64) && !plan_kernel(p, k, &fc, &kp) && !fc.oom) {
    *out = kp.launch;
    rc = 0;
  }
  free(kp.coop.v);
  fv_free(&fc);
  return rc;
}

/* ---------------------------------------------------------- emission */

#define MAX_VEC_ACCESS 32
#define ROW_CACHE_MAX 4

typedef struct memo_ent {
  const void *key;
  int t;
} memo_ent;

typedef struct cuda_emit {
  const tcc_program *p;
  const tcc_kernel *k;
  tcc_buf *b;
  fvctx fc;
  memo_ent *memo;          /* a stack: scopes truncate it */
  int nmemo, capmemo;
  int ntemps, naccs;
  const char *I;           /* index type */
  int warp;                /* reductions by one warp (lane, 32) */
  int oom;
  /* split reduction (kplan.split > 1): the reduction split_r folds the
   * row's split_groups partials at ws + split_off (final stage), or a
   * grid-stride slice into one partial (split stage) */
  const tcc_vx *split_r;
  int64_t split_groups, split_off;
  int split_stage;
  /* vectorized pointwise path: accesses contiguous in the flat index */
  int vec_width;           /* W elements per thread (0: off) */
  int in_lanes;            /* emitting the per-lane body */
  int nvacc;
  struct {
    int buf;
    const tcc_ix *const *idx;
    int64_t c;             /* storage index at flat index 0 */
    int store;
  } vacc[MAX_VEC_ACCESS];
  /* persistent rows (plan_row_cache): buffer rc[i].buf is read from
   * s<buf>[storage index - rb<buf>] */
  int nrc;
  struct {
    int buf;
    int64_t lo, w;
    const tcc_ix *const *idx;
    unsigned rowdims;
  } rc[ROW_CACHE_MAX];
} cuda_emit;

static int row_cache_of(const cuda_emit *ce, int buf);

static int memo_get(cuda_emit *ce, const void *key) {
  for (int i = ce->nmemo - 1; i >= 0; i--)
    if (ce->memo[i].key == key) return ce->memo[i].t;
  return -1;
}

static int memo_def(cuda_emit *ce, const void *key) {
  if (ce->nmemo == ce->capmemo) {
    int nc = ce->capmemo ? ce->capmemo * 2 : 256;
    memo_ent *nm = realloc(ce->memo, sizeof *nm * (size_t)nc);
    if (!nm) {
      ce->oom = 1;
      return -1;
    }
    ce->memo = nm;
    ce->capmemo = nc;
  }
  int t = ce->ntemps++;
  ce->memo[ce->nmemo].key = key;
  ce->memo[ce->nmemo].t = t;
  ce->nmemo++;
  return t;
}

static void put_ix(cuda_emit *ce, const tcc_ix *e) {
  tcc_buf *b = ce->b;
  switch (e->kind) {
  case TCC_IX_CONST: tcc_buf_printf(b, "((%s)%" PRId64 "LL)", ce->I, e->c); break;
  case TCC_IX_VAR: tcc_buf_printf(b, "i%d", e->var); break;
  case TCC_IX_ADD:
    tcc_buf_puts(b, "(");
    put_ix(ce, e->a);
    tcc_buf_puts(b, " + ");
    put_ix(ce, e->b);
    tcc_buf_puts(b, ")");
    break;
  case TCC_IX_MUL:
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    tcc_buf_puts(b, "(");
    put_ix(ce, e->a);
    tcc_buf_printf(b, " %s (%s)%" PRId64 "LL)",
                   e->kind == TCC_IX_MUL ? "*" : e->kind == TCC_IX_DIV ? "/" : "%", ce->I, e->c);
    break;
  case TCC_IX_MIN:
  case TCC_IX_MAX:
    tcc_buf_printf(b, "(%s)tcc_%s64(", ce->I, e->kind == TCC_IX_MIN ? "min" : "max");
    put_ix(ce, e->a);
    tcc_buf_printf(b, ", INT64_C(%" PRId64 "))", e->c);
    break;
  case TCC_IX_VALUE: tcc_buf_printf(b, "(%s)t%d", ce->I, memo_get(ce, e)); break;
  }
}

static void put_index(cuda_emit *ce, int buf, const tcc_ix *const *idx) {
  const tcc_meta *m = &ce->p->bufs[buf].layout;
  tcc_buf_printf(ce->b, "(%s)%" PRId64, ce->I, m->offset);
  for (int d = 0; d < m->rank; d++) {
    if (idx[d]->kind == TCC_IX_CONST && idx[d]->c == 0) continue;
    tcc_buf_printf(ce->b, " + (%s)%" PRId64 " * ", ce->I, m->strides[d]);
    put_ix(ce, idx[d]);
  }
}

/* CUDA for a primitive of result dtype d over operand texts of dtype od
 * (the device math library has the C99 names). */
static void put_prim(tcc_buf *b, tcc_prim op, tcc_dtype d, tcc_dtype od, const char *x,
                     const char *y, const char *z) {
  int fl = tcc_dtype_is_float(od);
  const char *f = od == TCC__V1__DTYPE__FLOAT64 ? "" : "f";
  const char *T = ctype(d);
  int isint = !fl;
  switch (op) {
  case TCC_PRIM_ROUND: tcc_buf_printf(b, "rint%s(%s)", f, x); break;
  case TCC_PRIM_ISINF:
    if (fl) tcc_buf_printf(b, "(uint8_t)(fabs%s(%s) == %s)", f, x, *f ? "TCC_INFF" : "TCC_INF");
    else tcc_buf_puts(b, "(uint8_t)0");
    break;
  case TCC_PRIM_DIV:
  case TCC_PRIM_TRUNCDIV:
    if (isint) tcc_buf_printf(b, "(%s)tcc_truncdiv_i64(%s, %s)", T, x, y);
    else if (op == TCC_PRIM_DIV) tcc_buf_printf(b, "%s / %s", x, y);
    else tcc_buf_printf(b, "trunc%s(%s / %s)", f, x, y);
    break;
  case TCC_PRIM_FLOORDIV:
    if (isint) tcc_buf_printf(b, "(%s)tcc_floordiv_i64(%s, %s)", T, x, y);
    else tcc_buf_printf(b, "tcc_floordiv(%s, %s)", x, y);
    break;
  case TCC_PRIM_FMOD:
    if (isint) tcc_buf_printf(b, "(%s)tcc_fmod_i64(%s, %s)", T, x, y);
    else tcc_buf_printf(b, "fmod%s(%s, %s)", f, x, y);
    break;
  case TCC_PRIM_REM:
    if (isint) tcc_buf_printf(b, "(%s)tcc_rem_i64(%s, %s)", T, x, y);
    else tcc_buf_printf(b, "tcc_rem(%s, %s)", x, y);
    break;
  default:
    if (!tcc_put_prim_common(b, op, d, T, isint, f, x, y, z))
      tcc_buf_printf(b, "/* bad prim %d */ 0", (int)op);
    break;
  }
}

static void put_cast(tcc_buf *b, tcc_dtype from, tcc_dtype to, const char *x) {
  const char *in = from == TCC__V1__DTYPE__FLOAT16 ? "tcc_h2f" : from == TCC__V1__DTYPE__BFLOAT16 ? "tcc_bf2f" : "";
  char conv[160];
  snprintf(conv, sizeof conv, "%s(%s)", in, x);
  if (to == TCC__V1__DTYPE__BOOL) tcc_buf_printf(b, "(uint8_t)(%s != 0)", conv);
  else if (to == TCC__V1__DTYPE__FLOAT16) tcc_buf_printf(b, "tcc_f2h((float)%s)", conv);
  else if (to == TCC__V1__DTYPE__BFLOAT16) tcc_buf_printf(b, "tcc_f2bf((float)%s)", conv);
  else tcc_buf_printf(b, "(%s)%s", ctype(to), conv);
}

static void operand_text(cuda_emit *ce, const tcc_vx *e, char *out, size_t cap) {
  if (e->op == TCC_PRIM_CONST) {
    tcc_buf lit = {0};
    put_literal(&lit, e);
    const char *t = lit.data ? lit.data : "0";
    snprintf(out, cap, t[0] == '-' ? "(%s)" : "%s", t);
    tcc_buf_free(&lit);
    return;
  }
  snprintf(out, cap, "t%d", memo_get(ce, e));
}

static int emit_node(cuda_emit *ce, const tcc_vx *e, int ind);

static int emit_ix_values(cuda_emit *ce, const tcc_ix *x, int ind) {
  if (!x) return 0;
  if (x->kind != TCC_IX_VALUE) {
    if (emit_ix_values(ce, x->a, ind)) return -1;
    return emit_ix_values(ce, x->b, ind);
  }
  if (memo_get(ce, x) >= 0) return 0;
  if (emit_node(ce, x->v, ind)) return -1;
  char v[96];
  operand_text(ce, x->v, v, sizeof v);
  int t = memo_def(ce, x);
  if (t < 0) return -1;
  tcc_buf_printf(ce->b, "%*sint64_t t%d = (int64_t)%s;\n%*sif (t%d < 0 || t%d >= INT64_C(%" PRId64 ")) t%d = 0;\n",
                 ind, "", t, v, ind, "", t, t, x->c, t);
  return 0;
}

static const char *int_limit(tcc_dtype d, int high) {
  switch (d) {
  case TCC__V1__DTYPE__INT8: return high ? "INT8_MAX" : "INT8_MIN";
  case TCC__V1__DTYPE__INT16: return high ? "INT16_MAX" : "INT16_MIN";
  case TCC__V1__DTYPE__INT32: return high ? "INT32_MAX" : "INT32_MIN";
  case TCC__V1__DTYPE__INT64: return high ? "INT64_MAX" : "INT64_MIN";
  default: return high ? "255" : "0";
  }
}

/* The identity of a fold (also what idle lanes contribute). */
static const char *red_identity(const tcc_vx *r, tcc_dtype vd) {
  int fl = tcc_dtype_is_float(vd);
  int dbl = vd == TCC__V1__DTYPE__FLOAT64;
  switch ((tcc_reduce_kind)r->i) {
  case TCC_RED_SUM: return "0";
  case TCC_RED_PROD: return "1";
  case TCC_RED_MAX:
  case TCC_RED_ARGMAX: return fl ? (dbl ? "-TCC_INF" : "-TCC_INFF") : int_limit(vd, 0);
  case TCC_RED_MIN:
  case TCC_RED_ARGMIN: return fl ? (dbl ? "TCC_INF" : "TCC_INFF") : int_limit(vd, 1);
  }
  return "0";
}

static const char *red_op(const tcc_vx *r) {
  switch ((tcc_reduce_kind)r->i) {
  case TCC_RED_SUM: return r->dtype == TCC__V1__DTYPE__BOOL ? "tcc_or" : "tcc_sum";
  case TCC_RED_PROD: return "tcc_prod";
  case TCC_RED_MAX: return "tcc_max";
  case TCC_RED_MIN: return "tcc_min";
  case TCC_RED_ARGMAX: return "tcc_argmax";
  case TCC_RED_ARGMIN: return "tcc_argmin";
  }
  return "tcc_sum";
}

/* Splits flat index `flat` into variables first.. with extents sizes[]
 * (row-major), declaring them. */
static void split_index(cuda_emit *ce, const char *flat, int first, int n, const int64_t *sizes,
                        const int *vars, int ind) {
  tcc_buf *b = ce->b;
  if (!n) return;
  tcc_buf_printf(b, "%*s%s q_%d = %s;\n", ind, "", ce->I, vars ? vars[0] : first, flat);
  for (int j = n - 1; j >= 0; j--) {
    int v = vars ? vars[j] : first + j;
    int q = vars ? vars[0] : first;
    if (j == 0) tcc_buf_printf(b, "%*sconst %s i%d = q_%d;\n", ind, "", ce->I, v, q);
    else {
      tcc_buf_printf(b, "%*sconst %s i%d = q_%d %% (%s)%" PRId64 "LL;\n", ind, "", ce->I, v, q, ce->I, sizes[j]);
      tcc_buf_printf(b, "%*sq_%d /= (%s)%" PRId64 "LL;\n", ind, "", q, ce->I, sizes[j]);
    }
  }
  tcc_buf_printf(b, "%*s(void)q_%d;", ind, "", vars ? vars[0] : first);
  for (int j = 0; j < n; j++) tcc_buf_printf(b, " (void)i%d;", vars ? vars[j] : first + j);
  tcc_buf_puts(b, "\n");
}

/* The per-thread fold of REDUCE r into accumulator a<acc> (and a<acc>i
 * for arg reductions), over the flat reduction index `j`. */
static int emit_fold_body(cuda_emit *ce, const tcc_vx *r, int acc, const char *j, int ind) {
  tcc_buf *b = ce->b;
  int64_t sizes[TCC_MAX_DIMS];
  int n = r->nidx;
  for (int i = 0; i < n; i++) sizes[i] = r->idx[i]->c;
  split_index(ce, j, r->buf, n, sizes, NULL, ind);
  int mark = ce->nmemo;
  if (emit_node(ce, r->a, ind)) return -1;
  char t[96];
  operand_text(ce, r->a, t, sizeof t);
  if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN)
    tcc_buf_printf(b, "%*s{ tcc_pair<%s> x_; x_.v = %s; x_.i = (int64_t)%s; a%d = %s(a%d, x_); }\n", ind, "",
                   ctype(r->a->dtype), t, j, acc, red_op(r), acc);
  else
    tcc_buf_printf(b, "%*sa%d = %s(a%d, (%s)%s);\n", ind, "", acc, red_op(r), acc, ctype(r->dtype), t);
  ce->nmemo = mark;
  return 0;
}

static int emit_acc_init(cuda_emit *ce, const tcc_vx *r, int acc, int ind) {
  tcc_buf *b = ce->b;
  if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN)
    tcc_buf_printf(b, "%*stcc_pair<%s> a%d; a%d.v = %s; a%d.i = INT64_MAX;\n", ind, "",
                   ctype(r->a->dtype), acc, acc, red_identity(r, r->a->dtype), acc);
  else
    tcc_buf_printf(b, "%*s%s a%d = (%s)%s;\n", ind, "", ctype(r->dtype), acc, ctype(r->dtype),
                   red_identity(r, r->dtype));
  return 0;
}

/* The result temp of a fold. */
static int emit_acc_result(cuda_emit *ce, const tcc_vx *r, int acc, int ind) {
  int t = memo_def(ce, r);
  if (t < 0) return -1;
  if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN)
    tcc_buf_printf(ce->b, "%*sconst int64_t t%d = a%d.i == INT64_MAX ? 0 : a%d.i;\n", ind, "", t, acc, acc);
  else
    tcc_buf_printf(ce->b, "%*sconst %s t%d = a%d;\n", ind, "", ctype(r->dtype), t, acc);
  return 0;
}

/* A REDUCE folded sequentially by one thread. */
static int emit_seq_reduce(cuda_emit *ce, const tcc_vx *r, int ind) {
  int acc = ce->naccs++;
  emit_acc_init(ce, r, acc, ind);
  tcc_buf_printf(ce->b, "%*sfor (%s j%d = 0; j%d < (%s)%" PRId64 "LL; j%d++) {\n", ind, "", ce->I, acc,
                 acc, ce->I, reduce_extent(r), acc);
  char j[32];
  snprintf(j, sizeof j, "j%d", acc);
  if (emit_fold_body(ce, r, acc, j, ind + 2)) return -1;
  tcc_buf_printf(ce->b, "%*s}\n", ind, "");
  return emit_acc_result(ce, r, acc, ind);
}

/* A REDUCE folded by the block (all threads reach this point). */
static int emit_coop_reduce(cuda_emit *ce, const tcc_vx *r, int ind) {
  int acc = ce->naccs++;
  emit_acc_init(ce, r, acc, ind);
  if (r == ce->split_r && !ce->split_stage) {
    /* final stage of a split reduction: fold the row's partials */
    tcc_buf_printf(ce->b, "%*sfor (int j%d = threadIdx.x; j%d < %" PRId64 "; j%d += blockDim.x)\n", ind, "", acc,
                   acc, ce->split_groups, acc);
    tcc_buf_printf(ce->b, "%*s  a%d = %s(a%d, ((const %s *)(ws + %" PRId64 "))[(long long)row * %" PRId64
                          " + j%d]);\n",
                   ind, "", acc, red_op(r), acc, ctype(r->dtype), ce->split_off, ce->split_groups, acc);
  } else {
    int grid_stride = r == ce->split_r;   /* split stage: the grid's blocks share the row */
    tcc_buf_printf(ce->b, "%*sfor (%s j%d = %s; j%d < (%s)%" PRId64 "LL; j%d += %s) {\n", ind, "", ce->I,
                   acc, grid_stride ? "blockIdx.x * blockDim.x + threadIdx.x" : ce->warp ? "lane" : "threadIdx.x",
                   acc, ce->I, reduce_extent(r), acc,
                   grid_stride ? "gridDim.x * blockDim.x" : ce->warp ? "32" : "blockDim.x");
    char j[32];
    snprintf(j, sizeof j, "j%d", acc);
    if (emit_fold_body(ce, r, acc, j, ind + 2)) return -1;
    tcc_buf_printf(ce->b, "%*s}\n", ind, "");
  }
  if (ce->warp) {
    tcc_buf_printf(ce->b, "%*sa%d = tcc_warp_reduce(a%d, tcc_%s_op());\n", ind, "", acc, acc, red_op(r) + 4);
  } else if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN) {
    tcc_buf_printf(ce->b, "%*s{ tcc_pair<%s> id_; id_.v = %s; id_.i = INT64_MAX;\n", ind, "",
                   ctype(r->a->dtype), red_identity(r, r->a->dtype));
    tcc_buf_printf(ce->b, "%*s  a%d = tcc_block_reduce(a%d, tcc_%s_op(), id_); }\n", ind, "", acc, acc,
                   red_op(r) + 4);
  } else {
    tcc_buf_printf(ce->b, "%*sa%d = tcc_block_reduce(a%d, tcc_%s_op(), (%s)%s);\n", ind, "", acc, acc,
                   red_op(r) + 4, ctype(r->dtype), red_identity(r, r->dtype));
  }
  return emit_acc_result(ce, r, acc, ind);
}

static int emit_node(cuda_emit *ce, const tcc_vx *e, int ind) {
  if (ce->oom) return -1;
  if (e->op == TCC_PRIM_CONST || memo_get(ce, e) >= 0) return 0;
  if (e->op == TCC_PRIM_REDUCE) return emit_seq_reduce(ce, e, ind);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (emit_ix_values(ce, e->idx[d], ind)) return -1;
  if (e->a && emit_node(ce, e->a, ind)) return -1;
  if (e->b && emit_node(ce, e->b, ind)) return -1;
  if (e->c && emit_node(ce, e->c, ind)) return -1;
  char x[96] = "", y[96] = "", z[96] = "";
  if (e->a) operand_text(ce, e->a, x, sizeof x);
  if (e->b) operand_text(ce, e->b, y, sizeof y);
  if (e->c) operand_text(ce, e->c, z, sizeof z);
  int t = memo_def(ce, e);
  if (t < 0) return -1;
  tcc_buf *b = ce->b;
  tcc_buf_printf(b, "%*sconst %s t%d = ", ind, "", ctype(e->dtype), t);
  int va = -1;
  for (int i = 0; ce->in_lanes && i < ce->nvacc; i++)
    if (ce->vacc[i].buf == e->buf && ce->vacc[i].idx == e->idx && !ce->vacc[i].store) va = i;
  if (e->op == TCC_PRIM_LOAD && va >= 0) {
    tcc_buf_printf(b, "v%d.v[l]", va);
  } else if (e->op == TCC_PRIM_LOAD && row_cache_of(ce, e->buf) >= 0) {
    tcc_buf_printf(b, "s%d[(long long)(", e->buf);
    put_index(ce, e->buf, e->idx);
    tcc_buf_printf(b, ") - rb%d]", e->buf);
  } else if (e->op == TCC_PRIM_LOAD) {
    tcc_buf_printf(b, "b%d[", e->buf);
    put_index(ce, e->buf, e->idx);
    tcc_buf_puts(b, "]");
  } else if (e->op == TCC_PRIM_INDEX) {
    tcc_buf_puts(b, "(int64_t)");
    put_ix(ce, e->idx[0]);
  } else if (e->op == TCC_PRIM_CAST) {
    put_cast(b, e->a->dtype, e->dtype, x);
  } else {
    tcc_dtype od = e->op == TCC_PRIM_WHERE ? e->b->dtype : e->a ? e->a->dtype : e->dtype;
    put_prim(b, e->op, e->dtype, od, x, y, z);
  }
  tcc_buf_puts(b, ";\n");
  return 0;
}

static int emit_stores(cuda_emit *ce, int ind) {
  const tcc_kernel *k = ce->k;
  for (int s = 0; s < k->nstores; s++) {
    const tcc_store *st = &k->stores[s];
    if (emit_node(ce, st->value, ind)) return -1;
    const tcc_meta *m = &ce->p->bufs[st->buf].layout;
    for (int d = 0; d < m->rank; d++)
      if (emit_ix_values(ce, st->idx[d], ind)) return -1;
    char x[96];
    operand_text(ce, st->value, x, sizeof x);
    if (ce->in_lanes) {   /* store s is vacc[s] (stores come first) */
      tcc_buf_printf(ce->b, "%*sv%d.v[l] = %s;\n", ind, "", s, x);
      continue;
    }
    tcc_buf_printf(ce->b, "%*sb%d[", ind, "", st->buf);
    put_index(ce, st->buf, st->idx);
    tcc_buf_printf(ce->b, "] = %s;\n", x);
  }
  return 0;
}

/* ------------------------------------------ persistent reduction rows */

/* Kernel config persist=1 on a block-per-row reduction: every buffer the
 * row reads through two or more loads (softmax reads x in the max, in the
 * sum and in the stores), each load affine in the row's variables apart
 * from the rest, is copied once per row into shared memory: the window
 * [row base + lo, row base + hi] that interval arithmetic over the
 * variables' extents bounds every such load to (row base = the load's
 * terms in the row variables + the storage offset, the same for every
 * load of the buffer). Then each pass reads s<buf>[index - rb<buf>].
 * At most ROW_CACHE_MAX buffers and ROW_CACHE_BYTES of static shared
 * memory; a kernel with nothing to cache gets the looped code. */
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

/* Chooses ce's row caches (ce->nrc) for kernel k. Returns 0 or -1 (out
 * of memory). */
static int plan_row_cache(cuda_emit *ce, const kplan *kp) {
  const tcc_program *p = ce->p;
  const tcc_kernel *k = ce->k;
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
  for (int bi = 0; bi < p->nbufs && ce->nrc < ROW_CACHE_MAX; bi++) {
    if (w[bi].state != 1 || w[bi].loads < 2) continue;
    int64_t n = w[bi].hi - w[bi].lo + 1, sz = n * tcc_dtype_size(p->bufs[bi].layout.dtype);
    if (n < 1 || bytes + sz > ROW_CACHE_BYTES) continue;
    bytes += sz;
    ce->rc[ce->nrc].buf = bi;
    ce->rc[ce->nrc].lo = w[bi].lo;
    ce->rc[ce->nrc].w = n;
    ce->rc[ce->nrc].idx = w[bi].idx;
    ce->rc[ce->nrc].rowdims = w[bi].rowdims;
    ce->nrc++;
  }
  rc = 0;
done:
  if (rw) tcc_ptrmap_free(&rw->seen);
  free(rw);
  free(w);
  free(written);
  return rc;
}

/* The row cache of buffer buf (index into ce->rc), or -1. */
static int row_cache_of(const cuda_emit *ce, int buf) {
  for (int i = 0; i < ce->nrc; i++)
    if (ce->rc[i].buf == buf) return i;
  return -1;
}

/* At the top of a row: waits for the previous row's readers, copies each
 * cached window into shared memory (bounds-checked against the storage),
 * waits again. */
static void emit_row_fill(cuda_emit *ce, int ind) {
  tcc_buf *b = ce->b;
  tcc_buf_printf(b, "%*s__syncthreads();   /* the previous row's readers are done */\n", ind, "");
  for (int i = 0; i < ce->nrc; i++) {
    int bi = ce->rc[i].buf;
    const tcc_meta *m = &ce->p->bufs[bi].layout;
    tcc_buf_printf(b, "%*sconst long long rb%d = (long long)%" PRId64, ind, "", bi, m->offset + ce->rc[i].lo);
    for (int d = 0; d < m->rank; d++) {
      if (!(ce->rc[i].rowdims >> d & 1)) continue;
      tcc_buf_printf(b, " + (long long)%" PRId64 " * (long long)", m->strides[d]);
      put_ix(ce, ce->rc[i].idx[d]);
    }
    tcc_buf_puts(b, ";\n");
    tcc_buf_printf(b, "%*sfor (int w_ = threadIdx.x; w_ < %" PRId64 "; w_ += blockDim.x) {\n", ind, "",
                   ce->rc[i].w);
    tcc_buf_printf(b, "%*s  const long long g_ = rb%d + w_;\n", ind, "", bi);
    tcc_buf_printf(b, "%*s  s%d[w_] = (g_ >= 0 && g_ < %" PRId64 "LL) ? b%d[g_] : (%s)0;\n", ind, "", bi, m->span, bi,
                   ctype(m->dtype));
    tcc_buf_printf(b, "%*s}\n", ind, "");
  }
  tcc_buf_printf(b, "%*s__syncthreads();\n", ind, "");
}

/* Vectorization of a pointwise kernel: every store, and the loads that
 * can, touch storage index c + e for flat index e (contiguous in the
 * iteration space's row-major order) with c a multiple of W, W = 16
 * bytes / the widest element among them, and W divides numel. Then each
 * thread handles W consecutive elements with one W-wide load per such
 * access and one W-wide store per output (128-bit for 4-byte types),
 * when the pointers are aligned at run time (else the scalar loop).
 * Returns W, or 0 when the kernel does not qualify. */
static int contiguous_access(cuda_emit *ce, int buf, const tcc_ix *const *idx, int64_t *c) {
  const tcc_kernel *k = ce->k;
  const tcc_meta *m = &ce->p->bufs[buf].layout;
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

static void vec_loads(cuda_emit *ce, const tcc_vx *e, tcc_ptrmap *seen, int *ok) {
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
    for (int i = 0; i < ce->nvacc; i++)
      have |= ce->vacc[i].buf == e->buf && ce->vacc[i].idx == e->idx && !ce->vacc[i].store;
    for (int d = 0; d < e->nidx; d++)
      if (e->idx[d]->kind == TCC_IX_VALUE) have = 1;   /* gathers stay scalar (and are not affine) */
    if (!have && ce->nvacc < MAX_VEC_ACCESS && contiguous_access(ce, e->buf, e->idx, &c)) {
      ce->vacc[ce->nvacc].buf = e->buf;
      ce->vacc[ce->nvacc].idx = e->idx;
      ce->vacc[ce->nvacc].c = c;
      ce->vacc[ce->nvacc].store = 0;
      ce->nvacc++;
    }
  }
  if (e->a) vec_loads(ce, e->a, seen, ok);
  if (e->b) vec_loads(ce, e->b, seen, ok);
  if (e->c) vec_loads(ce, e->c, seen, ok);
}

static int plan_vector(cuda_emit *ce, int64_t numel) {
  const tcc_kernel *k = ce->k;
  ce->nvacc = 0;
  if (k->nstores > MAX_VEC_ACCESS / 2) return 0;
  for (int s = 0; s < k->nstores; s++) {
    const tcc_store *st = &k->stores[s];
    int64_t c;
    if (!contiguous_access(ce, st->buf, st->idx, &c)) return 0;
    ce->vacc[ce->nvacc].buf = st->buf;
    ce->vacc[ce->nvacc].idx = st->idx;
    ce->vacc[ce->nvacc].c = c;
    ce->vacc[ce->nvacc].store = 1;
    ce->nvacc++;
  }
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return 0;
  }
  int ok = 1;
  for (int s = 0; s < k->nstores; s++) vec_loads(ce, k->stores[s].value, &seen, &ok);
  tcc_ptrmap_free(&seen);
  if (!ok) return 0;
  int es = 1;
  for (int i = 0; i < ce->nvacc; i++) {
    int e = tcc_dtype_size(ce->p->bufs[ce->vacc[i].buf].layout.dtype);
    if (e > es) es = e;
  }
  int W = 16 / es;
  if (W < 2 || numel % W) return 0;
  for (int i = 0; i < ce->nvacc; i++)
    if (ce->vacc[i].c % W) return 0;
  return W;
}

/* The vectorized grid-stride loop (plan_vector said W), then the scalar
 * fallback for misaligned pointers. */
static int emit_vector_loop(cuda_emit *ce, int64_t numel, int W) {
  tcc_buf *b = ce->b;
  const tcc_kernel *k = ce->k;
  tcc_buf_puts(b, "  if (");
  for (int i = 0; i < ce->nvacc; i++) {
    const tcc_meta *m = &ce->p->bufs[ce->vacc[i].buf].layout;
    tcc_buf_printf(b, "%s((unsigned long long)b%d %% %d) == 0", i ? " && " : "", ce->vacc[i].buf,
                   W * tcc_dtype_size(m->dtype));
  }
  tcc_buf_puts(b, ") {\n");
  tcc_buf_printf(b, "    for (%s e4 = (%s)blockIdx.x * blockDim.x + threadIdx.x; e4 < (%s)%" PRId64
                    "LL; e4 += (%s)gridDim.x * blockDim.x) {\n",
                 ce->I, ce->I, ce->I, numel / W, ce->I);
  for (int i = 0; i < ce->nvacc; i++) {
    const tcc_meta *m = &ce->p->bufs[ce->vacc[i].buf].layout;
    const char *T = ctype(m->dtype);
    if (ce->vacc[i].store)
      tcc_buf_printf(b, "      tcc_vec<%s, %d> v%d;\n", T, W, i);
    else
      tcc_buf_printf(b, "      const tcc_vec<%s, %d> v%d = *(const tcc_vec<%s, %d> *)(b%d + (%s)%" PRId64
                        "LL + e4 * %d);\n", T, W, i, T, W, ce->vacc[i].buf, ce->I, ce->vacc[i].c, W);
  }
  tcc_buf_printf(b, "#pragma unroll\n      for (int l = 0; l < %d; l++) {\n", W);
  tcc_buf_printf(b, "        const %s e = e4 * %d + l;\n", ce->I, W);
  int mark = ce->nmemo;
  split_index(ce, "e", 0, k->rank, k->sizes, NULL, 8);
  ce->in_lanes = 1;
  int rc = emit_stores(ce, 8);
  ce->in_lanes = 0;
  ce->nmemo = mark;
  if (rc) return -1;
  tcc_buf_puts(b, "      }\n");
  for (int i = 0; i < ce->nvacc; i++) {
    if (!ce->vacc[i].store) continue;
    const char *T = ctype(ce->p->bufs[ce->vacc[i].buf].layout.dtype);
    tcc_buf_printf(b, "      *(tcc_vec<%s, %d> *)(b%d + (%s)%" PRId64 "LL + e4 * %d) = v%d;\n", T, W,
                   ce->vacc[i].buf, ce->I, ce->vacc[i].c, W, i);
  }
  tcc_buf_puts(b, "    }\n    return;\n  }\n");
  return 0;
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
static int fits_int32(const tcc_program *p, const tcc_kernel *k, const char *used, const kplan *kp) {
  if (kp->numel >= IDX32_LIMIT) return 0;
  for (int bi = 0; bi < p->nbufs; bi++) {
    if (!used[bi]) continue;
    const tcc_meta *m = &p->bufs[bi].layout;
    if (m->span + m->offset >= IDX32_LIMIT) return 0;
    for (int d = 0; d < m->rank; d++)
      if (m->strides[d] >= IDX32_LIMIT || m->strides[d] <= -IDX32_LIMIT) return 0;
  }
  for (int i = 0; i < kp->coop.n; i++)
    if (reduce_extent(kp->coop.v[i]) >= IDX32_LIMIT) return 0;
  (void)k;
  return 1;
}

/* Emits live kernel k as __global__ k<kno>, or, with split_stage, the
 * first launch of its split reduction as k<kno>_split; split_off is the
 * workspace offset of its partials (when kplan.split). */
static int emit_kernel(const tcc_program *p, const tcc_kernel *k, int kno, tcc_buf *b, int split_stage,
                       int64_t split_off) {
  const tcc_graph *g = p->graph;
  cuda_emit ce = {.p = p, .k = k, .b = b, .split_stage = split_stage, .split_off = split_off};
  kplan kp = {0};
  char *used = calloc((size_t)p->nbufs + 1, 1);
  int rc = -1;
  if (!used || tcc_ptrmap_init(&ce.fc.map, 64)) goto done;
  if (plan_kernel(p, k, &ce.fc, &kp) || ce.fc.oom) goto done;
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
  ce.I = fits_int32(p, k, used, &kp) ? "int" : "long long";
  if (kp.split > 1) {
    ce.split_r = kp.coop.v[0];
    ce.split_groups = kp.split;
  }
  const tcc_kernel_config *kcfg = kernel_config(p, k);
  if (kcfg && kcfg->persist && kp.reduction && !kp.warp_rows && kp.split <= 1 && !split_stage && kp.numel &&
      plan_row_cache(&ce, &kp))
    goto done;

  if (split_stage) {
    tcc_buf_printf(b, "\n/* k%d_split: first stage of k%d's split reduction: grid (%" PRId64 ", %" PRId64
                      "), block %" PRId64 "; block (g, row) folds a grid-stride slice of row's %" PRId64
                      " elements into partial [row * %" PRId64 " + g] at ws + %" PRId64 "; %s indices */\n",
                   kno, kno, kp.split, kp.rows, kp.split_block, kp.red_max, kp.split, split_off, ce.I);
    tcc_buf_printf(b, "extern \"C\" __global__ void __launch_bounds__(%" PRId64 ") k%d_split(", kp.split_block,
                   kno);
  } else {
    tcc_buf_printf(b, "\n/* k%d: %s over [", kno, kp.launch.reduction ? "reduction" : "pointwise");
    for (int d = 0; d < k->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", k->sizes[d]);
    tcc_buf_printf(b, "]; grid %" PRId64 ", block %" PRId64, kp.launch.grid, kp.launch.block);
    if (kp.reduction)
      tcc_buf_printf(b, "; one %s per row of dims 0..%d (%" PRId64 " rows), %d %s reduction%s",
                     kp.warp_rows ? "warp" : "block", kp.row_rank - 1, kp.rows, kp.coop.n,
                     kp.warp_rows ? "warp" : "block", kp.coop.n == 1 ? "" : "s");
    if (kp.split > 1)
      tcc_buf_printf(b, "; split: folds the %" PRId64 " partials per row k%d_split left at ws + %" PRId64, kp.split,
                     kno, split_off);
    if (ce.nrc)
      tcc_buf_printf(b, "; persistent: %d input%s row in shared memory", ce.nrc, ce.nrc == 1 ? "'s" : "s'");
    tcc_buf_printf(b, "; %s indices */\n", ce.I);
    tcc_buf_printf(b, "extern \"C\" __global__ void __launch_bounds__(%" PRId64 ") k%d(", kp.launch.block, kno);
  }
  for (int i = 0; i < g->ninputs; i++) tcc_buf_printf(b, "const void *__restrict__ in%d, ", i);
  for (int i = 0; i < g->noutputs; i++) tcc_buf_printf(b, "void *__restrict__ out%d, ", i);
  tcc_buf_puts(b, "char *__restrict__ ws) {\n");
  for (int i = 0; i < g->ninputs; i++) tcc_buf_printf(b, "  (void)in%d;\n", i);
  for (int i = 0; i < g->noutputs; i++) tcc_buf_printf(b, "  (void)out%d;\n", i);
  tcc_buf_puts(b, "  (void)ws;\n");
  for (int bi = 0; bi < p->nbufs; bi++) {
    if (!used[bi]) continue;
    const tcc_buffer *B = &p->bufs[bi];
    int written = 0;
    for (int s = 0; s < k->nstores; s++) written |= k->stores[s].buf == bi;
    const char *t = ctype(B->layout.dtype), *c = written ? "" : "const ";
    switch (B->kind) {
    case TCC_BUF_INPUT:
      tcc_buf_printf(b, "  const %s *__restrict__ b%d = (const %s *)in%d;\n", t, bi, t, B->pos);
      break;
    case TCC_BUF_CONST: tcc_buf_printf(b, "  const %s *__restrict__ b%d = b%d_data;\n", t, bi, bi); break;
    case TCC_BUF_OUTPUT:
      tcc_buf_printf(b, "  %s%s *__restrict__ b%d = (%s *)out%d;\n", c, t, bi, t, B->pos);
      break;
    case TCC_BUF_TEMP:
      tcc_buf_printf(b, "  %s%s *__restrict__ b%d = (%s *)(ws + %" PRId64 ");\n", c, t, bi, t, B->ws_offset);
      break;
    }
  }
  for (int i = 0; i < ce.nrc; i++)
    tcc_buf_printf(b, "  __shared__ %s s%d[%" PRId64 "];\n", ctype(p->bufs[ce.rc[i].buf].layout.dtype), ce.rc[i].buf,
                   ce.rc[i].w);
  if (kp.numel == 0) {
    tcc_buf_puts(b, "  /* no elements */\n}\n");
    rc = 0;
    goto done;
  }
  int rank = k->rank;
  if (!kp.reduction) {
    int W = kp.launch.reduction ? 0 : plan_vector(&ce, kp.numel);
    if (W && emit_vector_loop(&ce, kp.numel, W)) goto done;
    tcc_buf_printf(b, "  for (%s e = (%s)blockIdx.x * blockDim.x + threadIdx.x; e < (%s)%" PRId64
                      "LL; e += (%s)gridDim.x * blockDim.x) {\n",
                   ce.I, ce.I, ce.I, kp.numel, ce.I);
    split_index(&ce, "e", 0, rank, k->sizes, NULL, 4);
    if (emit_stores(&ce, 4)) goto done;
    tcc_buf_puts(b, "  }\n}\n");
  } else if (split_stage) {
    tcc_buf_printf(b, "  for (%s row = blockIdx.y; row < (%s)%" PRId64 "LL; row += gridDim.y) {\n", ce.I, ce.I,
                   kp.rows);
    split_index(&ce, "row", 0, kp.row_rank, k->sizes, NULL, 4);
    if (emit_coop_reduce(&ce, kp.coop.v[0], 4)) goto done;
    tcc_buf_printf(b, "    if (threadIdx.x == 0) ((%s *)(ws + %" PRId64 "))[(long long)row * %" PRId64
                      " + blockIdx.x] = a%d;\n  }\n}\n",
                   ctype(kp.coop.v[0]->dtype), split_off, kp.split, ce.naccs - 1);
  } else {
    ce.warp = kp.warp_rows > 0;
    if (ce.warp)
      tcc_buf_printf(b, "  const int lane = threadIdx.x & 31;\n"
                        "  for (%s row = (%s)blockIdx.x * %d + (threadIdx.x >> 5); row < (%s)%" PRId64
                        "LL; row += (%s)gridDim.x * %d) {\n",
                     ce.I, ce.I, kp.warp_rows, ce.I, kp.rows, ce.I, kp.warp_rows);
    else
      tcc_buf_printf(b, "  for (%s row = blockIdx.x; row < (%s)%" PRId64 "LL; row += gridDim.x) {\n", ce.I,
                     ce.I, kp.rows);
    split_index(&ce, "row", 0, kp.row_rank, k->sizes, NULL, 4);
    if (ce.nrc) emit_row_fill(&ce, 4);
    for (int i = 0; i < kp.coop.n; i++)
      if (emit_coop_reduce(&ce, kp.coop.v[i], 4)) goto done;
    tcc_buf_printf(b, "    for (%s e = %s; e < (%s)%" PRId64 "LL; e += %s) {\n", ce.I,
                   ce.warp ? "lane" : "threadIdx.x", ce.I, kp.inner, ce.warp ? "32" : "blockDim.x");
    int mark = ce.nmemo;
    int vars[TCC_MAX_DIMS];
    for (int d = kp.row_rank; d < rank; d++) vars[d - kp.row_rank] = d;
    split_index(&ce, "e", kp.row_rank, rank - kp.row_rank, k->sizes + kp.row_rank, vars, 6);
    if (emit_stores(&ce, 6)) goto done;
    ce.nmemo = mark;
    tcc_buf_puts(b, "    }\n  }\n}\n");
  }
  rc = ce.oom ? -1 : 0;
done:
  free(used);
  free(ce.memo);
  free(kp.coop.v);
  fv_free(&ce.fc);
  return rc;
}

/* What every translation unit starts with: fixed-width types, limits,
 * half conversions (PTX cvt), integer helpers matching the CPU target,
 * and the block reduction. */
static const char prelude[] =
  "typedef signed char int8_t; typedef short int16_t; typedef int int32_t;\n"
  "typedef long long int64_t; typedef unsigned char uint8_t;\n"
  "typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
  "typedef unsigned long long uint64_t;\n"
  "#define INT64_C(c) c##LL\n"
  "#define INT8_MIN (-128)\n#define INT8_MAX 127\n#define INT16_MIN (-32768)\n#define INT16_MAX 32767\n"
  "#define INT32_MIN (-2147483647 - 1)\n#define INT32_MAX 2147483647\n"
  "#define INT64_MIN (-9223372036854775807LL - 1)\n#define INT64_MAX 9223372036854775807LL\n"
  "#define TCC_INFF __int_as_float(0x7f800000)\n#define TCC_NANF __int_as_float(0x7fc00000)\n"
  "#define TCC_INF __longlong_as_double(0x7ff0000000000000LL)\n"
  "#define TCC_NAN __longlong_as_double(0x7ff8000000000000LL)\n"
  "static __device__ __forceinline__ float tcc_h2f(uint16_t h) {\n"
  "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;\n}\n"
  "static __device__ __forceinline__ uint16_t tcc_f2h(float f) {\n"
  "  uint16_t h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
  "static __device__ __forceinline__ float tcc_bf2f(uint16_t h) { return __int_as_float((int)h << 16); }\n"
  "static __device__ __forceinline__ uint16_t tcc_f2bf(float f) {\n"
  "  uint16_t h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
  "static __device__ __forceinline__ int64_t tcc_min64(int64_t a, int64_t b) { return a < b ? a : b; }\n"
  "static __device__ __forceinline__ int64_t tcc_max64(int64_t a, int64_t b) { return a > b ? a : b; }\n"
  "static __device__ __forceinline__ int64_t tcc_truncdiv_i64(int64_t a, int64_t b) {\n"
  "  if (b == 0) return 0;\n  if (b == -1) return (int64_t)(0 - (uint64_t)a);\n  return a / b;\n}\n"
  "static __device__ __forceinline__ int64_t tcc_floordiv_i64(int64_t a, int64_t b) {\n"
  "  if (b == 0) return 0;\n  if (b == -1) return (int64_t)(0 - (uint64_t)a);\n"
  "  int64_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q--; return q;\n}\n"
  "static __device__ __forceinline__ int64_t tcc_fmod_i64(int64_t a, int64_t b) {\n"
  "  if (b == 0 || b == -1) return 0;\n  return a % b;\n}\n"
  "static __device__ __forceinline__ int64_t tcc_rem_i64(int64_t a, int64_t b) {\n"
  "  if (b == 0 || b == -1) return 0;\n"
  "  int64_t r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;\n}\n"
  "static __device__ __forceinline__ int64_t tcc_pow_i64(int64_t b, int64_t e) {\n"
  "  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;\n"
  "  uint64_t r = 1, x = (uint64_t)b;\n"
  "  while (e) { if (e & 1) r *= x; x *= x; e >>= 1; }\n  return (int64_t)r;\n}\n"
  "template <class T> static __device__ __forceinline__ T tcc_floordiv(T a, T b) {\n"
  "  if (b == 0) return a / b;\n  T m = fmod(a, b), d = (a - m) / b;\n"
  "  if (m != 0 && ((b < 0) != (m < 0))) d -= 1;\n"
  "  if (d == 0) return copysign((T)0, a / b);\n"
  "  T f = floor(d); if (d - f > (T)0.5) f += 1; return f;\n}\n"
  "template <class T> static __device__ __forceinline__ T tcc_rem(T a, T b) {\n"
  "  T m = fmod(a, b); if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;\n}\n"
  "/* W elements in one aligned access (ld/st.global.v4 for 16 bytes) */\n"
  "template <class T, int W> struct alignas(sizeof(T) * W) tcc_vec { T v[W]; };\n"
  "/* folds: NaN wins max/min; arg folds keep the first index of the best value */\n"
  "template <class T> struct tcc_pair { T v; int64_t i; };\n"
  "template <class T> static __device__ __forceinline__ T tcc_sum(T a, T b) { return (T)(a + b); }\n"
  "template <class T> static __device__ __forceinline__ T tcc_or(T a, T b) { return (T)(a | b); }\n"
  "template <class T> static __device__ __forceinline__ T tcc_prod(T a, T b) { return (T)(a * b); }\n"
  "template <class T> static __device__ __forceinline__ T tcc_max(T a, T b) { return (a > b || a != a) ? a : b; }\n"
  "template <class T> static __device__ __forceinline__ T tcc_min(T a, T b) { return (a < b || a != a) ? a : b; }\n"
  "template <class T> static __device__ __forceinline__ tcc_pair<T> tcc_argbest(tcc_pair<T> a, tcc_pair<T> b, bool mx) {\n"
  "  bool an = a.v != a.v, bn = b.v != b.v;\n"
  "  if (an || bn) return (an && (!bn || a.i < b.i)) ? a : b;\n"
  "  if (a.v == b.v) return a.i <= b.i ? a : b;\n"
  "  return (mx ? a.v > b.v : a.v < b.v) ? a : b;\n}\n"
  "template <class T> static __device__ __forceinline__ tcc_pair<T> tcc_argmax(tcc_pair<T> a, tcc_pair<T> b) { return tcc_argbest(a, b, true); }\n"
  "template <class T> static __device__ __forceinline__ tcc_pair<T> tcc_argmin(tcc_pair<T> a, tcc_pair<T> b) { return tcc_argbest(a, b, false); }\n"
  "struct tcc_sum_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_sum(a, b); } };\n"
  "struct tcc_or_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_or(a, b); } };\n"
  "struct tcc_prod_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_prod(a, b); } };\n"
  "struct tcc_max_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_max(a, b); } };\n"
  "struct tcc_min_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_min(a, b); } };\n"
  "struct tcc_argmax_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_argmax(a, b); } };\n"
  "struct tcc_argmin_op { template <class T> __device__ T operator()(T a, T b) const { return tcc_argmin(a, b); } };\n"
  "/* warp shuffles: 32/64-bit types as they are, narrow ints through int */\n"
  "template <class T> static __device__ __forceinline__ T tcc_shfl_down(T v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }\n"
  "template <> __device__ __forceinline__ int8_t tcc_shfl_down(int8_t v, int o) { return (int8_t)__shfl_down_sync(0xffffffffu, (int)v, o); }\n"
  "template <> __device__ __forceinline__ uint8_t tcc_shfl_down(uint8_t v, int o) { return (uint8_t)__shfl_down_sync(0xffffffffu, (int)v, o); }\n"
  "template <> __device__ __forceinline__ int16_t tcc_shfl_down(int16_t v, int o) { return (int16_t)__shfl_down_sync(0xffffffffu, (int)v, o); }\n"
  "template <class T> static __device__ __forceinline__ tcc_pair<T> tcc_shfl_down(tcc_pair<T> v, int o) {\n"
  "  tcc_pair<T> r; r.v = tcc_shfl_down(v.v, o); r.i = tcc_shfl_down(v.i, o); return r;\n}\n"
  "template <class T> static __device__ __forceinline__ T tcc_shfl_idx(T v, int l) { return __shfl_sync(0xffffffffu, v, l); }\n"
  "template <> __device__ __forceinline__ int8_t tcc_shfl_idx(int8_t v, int l) { return (int8_t)__shfl_sync(0xffffffffu, (int)v, l); }\n"
  "template <> __device__ __forceinline__ uint8_t tcc_shfl_idx(uint8_t v, int l) { return (uint8_t)__shfl_sync(0xffffffffu, (int)v, l); }\n"
  "template <> __device__ __forceinline__ int16_t tcc_shfl_idx(int16_t v, int l) { return (int16_t)__shfl_sync(0xffffffffu, (int)v, l); }\n"
  "template <class T> static __device__ __forceinline__ tcc_pair<T> tcc_shfl_idx(tcc_pair<T> v, int l) {\n"
  "  tcc_pair<T> r; r.v = tcc_shfl_idx(v.v, l); r.i = tcc_shfl_idx(v.i, l); return r;\n}\n"
  "/* Warp reduction (all 32 lanes converged): shuffles down to lane 0,\n"
  " * whose result every lane receives (one order: lanes agree bit for bit). */\n"
  "template <class T, class Op> static __device__ __forceinline__ T tcc_warp_reduce(T v, Op op) {\n"
  "  for (int o = 16; o > 0; o >>= 1) v = op(v, tcc_shfl_down(v, o));\n"
  "  return tcc_shfl_idx(v, 0);\n}\n"
  "/* Block reduction (blockDim.x a multiple of 32, at most 1024): warp\n"
  " * shuffles, one partial per warp in shared memory, warp 0 folds them;\n"
  " * every thread returns the block's result. */\n"
  "template <class T, class Op> static __device__ __forceinline__ T tcc_block_reduce(T v, Op op, T id) {\n"
  "  __shared__ T sh[32];\n"
  "  for (int o = 16; o > 0; o >>= 1) v = op(v, tcc_shfl_down(v, o));\n"
  "  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
  "  __syncthreads();\n"
  "  if (lane == 0) sh[w] = v;\n"
  "  __syncthreads();\n"
  "  if (w == 0) {\n"
  "    v = lane < nw ? sh[lane] : id;\n"
  "    for (int o = 16; o > 0; o >>= 1) v = op(v, tcc_shfl_down(v, o));\n"
  "    if (lane == 0) sh[0] = v;\n"
  "  }\n"
  "  __syncthreads();\n"
  "  return sh[0];\n}\n";

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

/* Row-major C[b, m, n] = A[b, m, :] . B[b, :, n] as cuBLAS's column-major
 * C^T = B^T A^T: cuBLAS's A is our B (N x K), its B our A (K x M). */
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
  g->compute = e->dtype == TCC__V1__DTYPE__FLOAT64 ? "64F" : "32F";
  g->a = buffer_ref(p, e->b->buf, ob);
  g->b = buffer_ref(p, e->a->buf, oa);
  g->c = buffer_ref(p, st->buf, oc);
  const int64_t lim = INT32_MAX;
  if (g->m > lim || g->n > lim || g->k > lim || g->batch > lim || g->lda > lim || g->ldb > lim || g->ldc > lim)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "matmul of [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                         "] (batch, M, N, K): cuBLAS takes sizes up to 2^31-1", Bn, M, N, Kd);
  return 0;
}

/* An extern step other than a GEMM (convolution, ...): UNIMPLEMENTED
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

int tcc_cuda_schedule_make(const tcc_program *p, tcc_cuda_schedule *s, tcc_error *err) {
  memset(s, 0, sizeof *s);
  int nk = tcc_program_live_kernels(p);
  s->steps = calloc((size_t)nk * 2 + 1, sizeof *s->steps);
  if (!s->steps) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
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
      st->kind = "extern";
      st->is_gemm = 1;
      if (K->stores[0].value->op != TCC_PRIM_EXTERN || K->stores[0].value->i != TCC_EXT_GEMM)
        rc = unsupported_extern(p, K, err);
      else
        rc = describe_gemm(p, K, &st->gemm, err);
      s->n++;
      kno++;
      continue;
    }
    fvctx fc = {0};
    kplan kp;
    memset(&kp, 0, sizeof kp);
    if (tcc_ptrmap_init(&fc.map, 64) || plan_kernel(p, K, &fc, &kp) || fc.oom) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      const char *kind = kp.launch.reduction ? "reduction" : "pointwise";
      if (kp.split > 1) {
        int64_t off = align256(ws);
        ws = off + kp.split * kp.rows * (int64_t)sizeof(double);
        tcc_cuda_step *sp = st;
        snprintf(sp->name, sizeof sp->name, "k%d_split", kno);
        sp->kind = "split-reduction";
        sp->split_stage = 1;
        sp->grid[0] = kp.split;
        sp->grid[1] = kp.rows;
        sp->block = kp.split_block;
        sp->numel = kp.red_max * kp.rows;
        sp->split_off = off;
        s->n_global++;
        st = &s->steps[++s->n];
        st->kernel = k;
        st->kno = kno;
        snprintf(st->name, sizeof st->name, "k%d", kno);
        st->numel = kp.numel;
        st->split_off = off;
      }
      st->kind = kind;
      st->grid[0] = kp.launch.grid;
      st->grid[1] = 1;
      st->block = kp.launch.block;
      st->shared_bytes = kp.launch.shared_bytes;
      s->n_global++;
      s->n++;
    }
    free(kp.coop.v);
    fv_free(&fc);
    kno++;
  }
  s->workspace_bytes = ws;
  if (rc) tcc_cuda_schedule_free(s);
  return rc;
}

void tcc_cuda_schedule_free(tcc_cuda_schedule *s) {
  free(s->steps);
  memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------- translation unit */

int tcc_emit_cuda(const tcc_program *p, tcc_buf *b, tcc_error *err) {
  const tcc_graph *g = p->graph;
  for (int bi = 0; bi < p->nbufs; bi++)
    if (!p->bufs[bi].dead && !ctype(p->bufs[bi].layout.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "%s tensors are not supported by the CUDA "
                           "backend yet", tcc_dtype_name(p->bufs[bi].layout.dtype));
  tcc_cuda_schedule sch;
  int rc = tcc_cuda_schedule_make(p, &sch, err);
  if (rc) return rc;
  (void)is_float;
  tcc_buf_printf(b,
                 "/* Generated by tccd (codegen %d) for %s.\n"
                 " * ABI 1: every kernel takes (inputs..., outputs..., workspace).\n"
                 " * %d inputs, %d outputs, %" PRId64 " workspace bytes. */\n",
                 TCC_CODEGEN_VERSION, g->target_label, g->ninputs, g->noutputs, sch.workspace_bytes);
  tcc_buf_puts(b, prelude);
  for (int bi = 0; bi < p->nbufs; bi++) {
    if (p->bufs[bi].kind != TCC_BUF_CONST || p->bufs[bi].dead) continue;
    int exported = 0;   /* read by cuBLAS: the client finds it with cuModuleGetGlobal */
    for (int i = 0; i < sch.n; i++)
      if (sch.steps[i].is_gemm)
        exported |= (sch.steps[i].gemm.a.base == TCC_CUDA_CONSTANT && sch.steps[i].gemm.a.index == bi) ||
                    (sch.steps[i].gemm.b.base == TCC_CUDA_CONSTANT && sch.steps[i].gemm.b.index == bi);
    if (exported) tcc_buf_puts(b, "extern \"C\" ");
    emit_constant(b, &p->bufs[bi], bi);
  }
  for (int i = 0; i < sch.n && !rc; i++) {
    const tcc_cuda_step *st = &sch.steps[i];
    if (st->is_gemm) {
      const tcc_cuda_gemm *G = &st->gemm;
      tcc_buf_printf(b, "\n/* k%d: extern step, run by the client through cuBLAS: "
                        "cublasGemmStridedBatchedEx(%c, %c, m=%" PRId64 ", n=%" PRId64 ", k=%" PRId64
                        ", lda=%" PRId64 ", ldb=%" PRId64 ", ldc=%" PRId64 ", batch=%" PRId64 ", %s -> %s, "
                        "compute %s) */\n",
                     st->kno, G->trans_a ? 'T' : 'N', G->trans_b ? 'T' : 'N', G->m, G->n, G->k, G->lda, G->ldb,
                     G->ldc, G->batch, tcc_dtype_name(G->ab_dtype), tcc_dtype_name(G->c_dtype), G->compute);
      continue;
    }
    if (emit_kernel(p, &p->kernels[st->kernel], st->kno, b, st->split_stage, st->split_off))
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting CUDA");
  }
  tcc_cuda_schedule_free(&sch);
  if (!rc && b->failed) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting CUDA");
  return rc;
}

/* ------------------------------------------------------------- build */

int tcc_build_cuda(const tcc_program *p, const char *src, const tcc_build_options *opts, uint8_t **cubin,
                   size_t *cubin_len, char **ptx, size_t *ptx_len, tcc_error *err) {
  *cubin = NULL;
  *cubin_len = 0;
  if (ptx) *ptx = NULL;
  if (ptx_len) *ptx_len = 0;
  const char *arch = p->graph->target.cuda_arch;
  if (!arch || !arch[0]) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: no CUDA arch");
  tcc_cuda_schedule sch;
  int rc = tcc_cuda_schedule_make(p, &sch, err);
  if (rc) return rc;
  const char **names = calloc((size_t)sch.n_global + 1, sizeof *names);
  if (!names) {
    tcc_cuda_schedule_free(&sch);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int i = 0, j = 0; i < sch.n; i++)
    if (!sch.steps[i].is_gemm) names[j++] = sch.steps[i].name;
  tcc_nvrtc_result r;
  memset(&r, 0, sizeof r);
  tcc_nvrtc_options no = {.timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 120000};
  rc = tcc_nvrtc_build_ex(src, arch, names, &no, &r, err);
  if (!rc) {
    for (int j = 0; j < sch.n_global && !rc; j++)
      if (strcmp(r.lowered_names[j], names[j]))
        rc = tcc_error_set(err, TCC_E_INTERNAL, "nvrtc: kernel %s lowered to '%.64s'", names[j], r.lowered_names[j]);
    if (!rc) {
      *cubin = r.cubin;
      *cubin_len = r.cubin_size;
      r.cubin = NULL;
      if (ptx) {
        *ptx = r.ptx;
        r.ptx = NULL;
        if (ptx_len) *ptx_len = r.ptx_size;
      }
    }
  }
  tcc_nvrtc_result_free(&r);
  free(names);
  tcc_cuda_schedule_free(&sch);
  return rc;
}

int tcc_build_cubin(const tcc_program *p, const char *src, size_t len,
                    const tcc_build_options *opts, uint8_t **out, size_t *outlen, tcc_error *err) {
  (void)len;
  return tcc_build_cuda(p, src, opts, out, outlen, NULL, NULL, err);
}

/* ---------------------------------------------------------- manifest */

static Tcc__V1__BufferRef *manifest_ref(tcc_arena *A, const tcc_cuda_ref *r) {
  Tcc__V1__BufferRef *m = tcc_arena_alloc(A, sizeof *m);
  if (!m) return NULL;
  tcc__v1__buffer_ref__init(m);
  switch (r->base) {
  case TCC_CUDA_INPUT: m->base_case = TCC__V1__BUFFER_REF__BASE_INPUT, m->input = (uint32_t)r->index; break;
  case TCC_CUDA_OUTPUT: m->base_case = TCC__V1__BUFFER_REF__BASE_OUTPUT, m->output = (uint32_t)r->index; break;
  case TCC_CUDA_WORKSPACE: m->base_case = TCC__V1__BUFFER_REF__BASE_WORKSPACE, m->workspace = 1; break;
  case TCC_CUDA_CONSTANT:
    m->base_case = TCC__V1__BUFFER_REF__BASE_CONSTANT;
    if (!(m->constant = tcc_arena_printf(A, "b%d_data", r->index))) return NULL;
    break;
  }
  m->offset_bytes = r->offset_bytes;
  return m;
}

int tcc_cuda_manifest_fill(const tcc_program *p, tcc_arena *A, Tcc__V1__Manifest *m, const char *ptx,
                           size_t ptx_len, tcc_error *err) {
  tcc_cuda_schedule sch;
  int rc = tcc_cuda_schedule_make(p, &sch, err);
  if (rc) return rc;
  m->workspace_bytes = sch.workspace_bytes;
  m->n_kernels = (size_t)sch.n;
  m->kernels = tcc_arena_array(A, (size_t)sch.n + 1, sizeof *m->kernels);
  if (!m->kernels) goto oom;
  for (int i = 0; i < sch.n; i++) {
    const tcc_cuda_step *st = &sch.steps[i];
    Tcc__V1__KernelInfo *ki = tcc_arena_alloc(A, sizeof *ki);
    if (!ki) goto oom;
    tcc__v1__kernel_info__init(ki);
    ki->name = tcc_arena_strdup(A, st->name);
    ki->kind = (char *)st->kind;
    ki->numel = st->numel;
    ki->n_nodes = (size_t)p->kernels[st->kernel].nnodes;   /* provenance (tcctl show --dot) */
    ki->nodes = p->kernels[st->kernel].nodes;
    if (!ki->name) goto oom;
    if (st->is_gemm) {
      const tcc_cuda_gemm *G = &st->gemm;
      Tcc__V1__GemmStep *gs = tcc_arena_alloc(A, sizeof *gs);
      if (!gs) goto oom;
      tcc__v1__gemm_step__init(gs);
      gs->trans_a = G->trans_a, gs->trans_b = G->trans_b;
      gs->m = G->m, gs->n = G->n, gs->k = G->k;
      gs->lda = G->lda, gs->ldb = G->ldb, gs->ldc = G->ldc;
      gs->stride_a = G->stride_a, gs->stride_b = G->stride_b, gs->stride_c = G->stride_c;
      gs->batch_count = G->batch;
      gs->a_dtype = gs->b_dtype = (Tcc__V1__DType)G->ab_dtype;
      gs->c_dtype = (Tcc__V1__DType)G->c_dtype;
      gs->compute_type = (char *)G->compute;
      gs->alpha = 1.0;
      gs->beta = 0.0;
      if (!(gs->a = manifest_ref(A, &G->a)) || !(gs->b = manifest_ref(A, &G->b)) || !(gs->c = manifest_ref(A, &G->c)))
        goto oom;
      ki->gemm = gs;
    } else {
      int two = st->split_stage || st->grid[1] > 1;
      int64_t *grid = tcc_arena_array(A, 2, sizeof *grid);
      int64_t *block = tcc_arena_array(A, 1, sizeof *block);
      if (!grid || !block) goto oom;
      grid[0] = st->grid[0];
      grid[1] = st->grid[1];
      block[0] = st->block;
      ki->grid = grid;
      ki->n_grid = two ? 2 : 1;
      ki->block = block;
      ki->n_block = 1;
      ki->shared_bytes = st->shared_bytes;
    }
    m->kernels[i] = ki;
  }
  if (ptx && ptx_len) {
    m->ptx.data = (uint8_t *)ptx;
    m->ptx.len = ptx_len;
  }
  tcc_cuda_schedule_free(&sch);
  return 0;
oom:
  tcc_cuda_schedule_free(&sch);
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory encoding the manifest");
}
