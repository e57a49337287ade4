/*
 * emit.c — CUDA C for the CUDA target: prints the schedule
 * (cuda_schedule.h, schedule.c: geometry, split reductions, persistent
 * rows, vector width, index type, launch order) and decides none of it.
 *
 * Requires: a checked, planned, scheduled program (the same loop IR the
 * C emitter reads: fusion already grouped softmax and layer_norm into one
 * kernel each, and this emitter keeps that grouping: one __global__ per
 * live kernel).
 * Produces: one translation unit with no #includes (NVRTC 13 has no
 * built-in headers) holding, per live kernel j,
 *
 *   extern "C" __global__ void k<j>(const void *in0, ..., void *out0, ...,
 *                                   char *ws)
 *
 * (ABI 1 of runtime/tcc_runtime.h: inputs, outputs, workspace; every
 * kernel takes all of them). Shapes, strides, storage offsets and workspace offsets
 * are compiled in. The launch configuration of each kernel
 * (schedule.c's plan_kernel) is a pure function of the kernel and its
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
 *              then the sum that reads the max); a run of them over the
 *              same extents where none reads another's result (a batch
 *              norm backward's sums) is folded in one loop with one
 *              accumulator each (emit_coop_group). Then the threads share
 *              the row's remaining dims for the stores. So softmax and
 *              layer_norm are one kernel, looped over the row (each
 *              reduction re-reads the row; the tuning config persist=1
 *              copies such rows to shared memory once instead: see
 *              plan_row_cache). A reduction nested in another
 *              one's body that depends on the outer's variables is folded
 *              sequentially by each thread, and so is one of at most
 *              16 elements (a pooling window). Block size: the
 *              reduction extent rounded up to a power of two, 32..256,
 *              or 1024 for few long rows (schedule.c). Rows of at
 *              most 32 elements, and many rows of at most 1024 (schedule.c:
 *              WARP_MANY_ROWS), go one warp per row (8 rows per block of
 *              256): the same structure with the lane for the thread and
 *              a warp reduction (shuffles, lane 0's result broadcast),
 *              no shared memory and no __syncthreads.
 *   split      a cooperative reduction of >= SPLIT_MIN_EXTENT elements into
 *              <= SPLIT_MAX_ROWS rows, or siblings that fold in one loop:
 *              k<j>_split folds grid-stride slices into partials in the
 *              workspace (one set per reduction), k<j> folds each
 *              reduction's partials (schedule.c: SPLIT_*).
 *   extern     (GEMM) no code: a step of the launch plan the client runs
 *              with cublasGemmStridedBatchedEx (describe_gemm maps the
 *              row-major C = A B onto cuBLAS's column-major C^T = B^T A^T;
 *              the manifest's GemmStep carries the call).
 *   extern     (convolution) no code either: a cuDNN call the client
 *              makes (describe_conv; the manifest's ConvStep). Other
 *              extern kinds are TCC_E_UNIMPLEMENTED naming the op.
 * The schedule lists the plan's steps once for the emitter, the NVRTC
 * build (kernel names) and the manifest.
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
 * Hygiene: as in the C emitter, only numbers from the request reach the
 * source; floats are exact hexadecimal literals.
 */
#include "cuda_schedule.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ types */


static int is_half(tcc_dtype d) {
  return d == TCC__V1__DTYPE__FLOAT16 || d == TCC__V1__DTYPE__BFLOAT16;
}

static int is_float(tcc_dtype d) { return tcc_dtype_is_float(d) && !is_half(d); }

/* CUDA C for NVRTC (the prelude's macros and templates). */
static const tcc_dialect cuda_c = {
  .ctype = tcc_cuda_ctype,
  .constant_qualifiers = "__device__ const",
  .half_constants_as_values = 0,
  .halves_in_float = 1,
  .nan_f32 = "TCC_NANF",
  .nan_f64 = "TCC_NAN",
  .inf_f32 = "TCC_INFF",
  .inf_f64 = "TCC_INF",
  .round = "rint",
  .isinf_by_fabs = 1,
  .div_flag = "",
  .typed_float_helpers = 0,
};
#define D (&cuda_c)



/* ------------------------------------------------------- constants */


/* ---------------------------------------------------------- emission */

typedef struct memo_ent {
  const void *key;
  int t;
} memo_ent;

typedef struct cuda_emit {
  const tcc_program *p;
  const tcc_kernel *k;
  const tcc_cuda_kernel_plan *kp;   /* the schedule's plan of k */
  tcc_buf *b;
  memo_ent *memo;          /* a stack: scopes truncate it */
  int nmemo, capmemo;
  int ntemps, naccs;
  const char *I;           /* index type */
  int warp;                /* reductions by one warp (lane, 32) */
  int oom;
  /* split reduction (plan split > 1): each cooperative reduction c folds
   * the row's split_groups partials at ws + split_off + c * split_slots
   * * 8 (final stage), or a grid-stride slice into one partial (split
   * stage) */
  int64_t split_groups, split_off, split_slots;
  int split_stage;
  /* vectorized pointwise path (the plan's vacc[]) */
  int vec_width;           /* W elements per thread (0: off) */
  int in_lanes;            /* emitting the per-lane body */
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


static void put_cast(tcc_buf *b, tcc_dtype from, tcc_dtype to, const char *x) {
  const char *in = from == TCC__V1__DTYPE__FLOAT16 ? "tcc_h2f" : from == TCC__V1__DTYPE__BFLOAT16 ? "tcc_bf2f" : "";
  char conv[160];
  snprintf(conv, sizeof conv, "%s(%s)", in, x);
  if (to == TCC__V1__DTYPE__BOOL) tcc_buf_printf(b, "(uint8_t)(%s != 0)", conv);
  else if (to == TCC__V1__DTYPE__FLOAT16) tcc_buf_printf(b, "tcc_f2h((float)%s)", conv);
  else if (to == TCC__V1__DTYPE__BFLOAT16) tcc_buf_printf(b, "tcc_f2bf((float)%s)", conv);
  else tcc_buf_printf(b, "(%s)%s", tcc_cuda_ctype(to), conv);
}

static void operand_text(cuda_emit *ce, const tcc_vx *e, char *out, size_t cap) {
  if (e->op == TCC_PRIM_CONST) {
    tcc_buf lit = {0};
    tcc_c_put_literal(D, &lit, e);
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


/* The identity of a fold (also what idle lanes contribute). */
static const char *red_identity(const tcc_vx *r, tcc_dtype vd) {
  int fl = tcc_dtype_is_float(vd);
  int dbl = vd == TCC__V1__DTYPE__FLOAT64;
  switch ((tcc_reduce_kind)r->i) {
  case TCC_RED_SUM: return "0";
  case TCC_RED_PROD: return "1";
  case TCC_RED_MAX:
  case TCC_RED_ARGMAX: return fl ? (dbl ? "-TCC_INF" : "-TCC_INFF") : tcc_c_int_limit(vd, 0);
  case TCC_RED_MIN:
  case TCC_RED_ARGMIN: return fl ? (dbl ? "TCC_INF" : "TCC_INFF") : tcc_c_int_limit(vd, 1);
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

/* Binds REDUCE r's variables to the flat reduction index `j`. */
static void bind_reduce_vars(cuda_emit *ce, const tcc_vx *r, const char *j, int ind) {
  int64_t sizes[TCC_MAX_DIMS];
  for (int i = 0; i < r->nidx; i++) sizes[i] = r->idx[i]->c;
  split_index(ce, j, r->buf, r->nidx, sizes, NULL, ind);
}

/* Folds REDUCE r's summand at the bound variables into a<acc>. */
static int emit_fold(cuda_emit *ce, const tcc_vx *r, int acc, const char *j, int ind) {
  tcc_buf *b = ce->b;
  if (emit_node(ce, r->a, ind)) return -1;
  char t[96];
  operand_text(ce, r->a, t, sizeof t);
  if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN)
    tcc_buf_printf(b, "%*s{ tcc_pair<%s> x_; x_.v = %s; x_.i = (int64_t)%s; a%d = %s(a%d, x_); }\n", ind, "",
                   tcc_cuda_ctype(r->a->dtype), t, j, acc, red_op(r), acc);
  else
    tcc_buf_printf(b, "%*sa%d = %s(a%d, (%s)%s);\n", ind, "", acc, red_op(r), acc, tcc_cuda_ctype(r->dtype), t);
  return 0;
}

/* The per-thread fold of REDUCE r into accumulator a<acc> (and a<acc>i
 * for arg reductions), over the flat reduction index `j`. */
static int emit_fold_body(cuda_emit *ce, const tcc_vx *r, int acc, const char *j, int ind) {
  bind_reduce_vars(ce, r, j, ind);
  int mark = ce->nmemo;
  int rc = emit_fold(ce, r, acc, j, ind);
  ce->nmemo = mark;
  return rc;
}

static int emit_acc_init(cuda_emit *ce, const tcc_vx *r, int acc, int ind) {
  tcc_buf *b = ce->b;
  if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN)
    tcc_buf_printf(b, "%*stcc_pair<%s> a%d; a%d.v = %s; a%d.i = INT64_MAX;\n", ind, "",
                   tcc_cuda_ctype(r->a->dtype), acc, acc, red_identity(r, r->a->dtype), acc);
  else
    tcc_buf_printf(b, "%*s%s a%d = (%s)%s;\n", ind, "", tcc_cuda_ctype(r->dtype), acc, tcc_cuda_ctype(r->dtype),
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
    tcc_buf_printf(ce->b, "%*sconst %s t%d = a%d;\n", ind, "", tcc_cuda_ctype(r->dtype), t, acc);
  return 0;
}

/* A REDUCE folded sequentially by one thread. */
static int emit_seq_reduce(cuda_emit *ce, const tcc_vx *r, int ind) {
  int acc = ce->naccs++;
  emit_acc_init(ce, r, acc, ind);
  tcc_buf_printf(ce->b, "%*sfor (%s j%d = 0; j%d < (%s)%" PRId64 "LL; j%d++) {\n", ind, "", ce->I, acc,
                 acc, ce->I, tcc_cuda_reduce_extent(r), acc);
  char j[32];
  snprintf(j, sizeof j, "j%d", acc);
  if (emit_fold_body(ce, r, acc, j, ind + 2)) return -1;
  tcc_buf_printf(ce->b, "%*s}\n", ind, "");
  return emit_acc_result(ce, r, acc, ind);
}

static int emit_coop_finish(cuda_emit *ce, const tcc_vx *r, int acc, int ind);

/* The workspace offset of cooperative reduction r's split partials. */
static int64_t split_partials(const cuda_emit *ce, const tcc_vx *r) {
  int c = 0;
  while (c < ce->kp->ncoop && ce->kp->coop[c] != r) c++;
  assert(c < ce->kp->ncoop);
  return ce->split_off + c * ce->split_slots * (int64_t)sizeof(double);
}

/* A REDUCE folded by the block (all threads reach this point). */
static int emit_coop_reduce(cuda_emit *ce, const tcc_vx *r, int ind) {
  int acc = ce->naccs++;
  emit_acc_init(ce, r, acc, ind);
  if (ce->split_groups > 1 && !ce->split_stage) {
    /* final stage of a split reduction: fold the row's partials */
    tcc_buf_printf(ce->b, "%*sfor (int j%d = threadIdx.x; j%d < %" PRId64 "; j%d += blockDim.x)\n", ind, "", acc,
                   acc, ce->split_groups, acc);
    tcc_buf_printf(ce->b, "%*s  a%d = %s(a%d, ((const %s *)(ws + %" PRId64 "))[(long long)row * %" PRId64
                          " + j%d]);\n",
                   ind, "", acc, red_op(r), acc, tcc_cuda_ctype(r->dtype), split_partials(ce, r),
                   ce->split_groups, acc);
  } else {
    int grid_stride = ce->split_stage;   /* split stage: the grid's blocks share the row */
    tcc_buf_printf(ce->b, "%*sfor (%s j%d = %s; j%d < (%s)%" PRId64 "LL; j%d += %s) {\n", ind, "", ce->I,
                   acc, grid_stride ? "blockIdx.x * blockDim.x + threadIdx.x" : ce->warp ? "lane" : "threadIdx.x",
                   acc, ce->I, tcc_cuda_reduce_extent(r), acc,
                   grid_stride ? "gridDim.x * blockDim.x" : ce->warp ? "32" : "blockDim.x");
    char j[32];
    snprintf(j, sizeof j, "j%d", acc);
    if (emit_fold_body(ce, r, acc, j, ind + 2)) return -1;
    tcc_buf_printf(ce->b, "%*s}\n", ind, "");
  }
  return emit_coop_finish(ce, r, acc, ind);
}

/* Cooperative reductions rs[0..n) over the same extents, none reading
 * another's result, folded in ONE loop: each element's loads and
 * shared subexpressions are computed once for all n accumulators (the
 * variables of rs[k > 0] are aliases of rs[0]'s). A batch norm's
 * backward sums dy and dy * (x - mean) over the same 100k elements per
 * channel with a long fused chain in dy; folded one by one, every sum
 * re-read the chain's inputs. Each accumulator folds the same elements
 * in the same order as alone, so the results are the same bits. */
static int emit_coop_group(cuda_emit *ce, const tcc_vx *const *rs, int n, int ind) {
  if (n == 1) return emit_coop_reduce(ce, rs[0], ind);
  int acc0 = ce->naccs;
  ce->naccs += n;
  tcc_buf *b = ce->b;
  tcc_buf_printf(b, "%*s/* %d reductions over the same %" PRId64 " elements, folded in one loop */\n", ind, "", n,
                 tcc_cuda_reduce_extent(rs[0]));
  for (int k = 0; k < n; k++) emit_acc_init(ce, rs[k], acc0 + k, ind);
  tcc_buf_printf(b, "%*sfor (%s j%d = %s; j%d < (%s)%" PRId64 "LL; j%d += %s) {\n", ind, "", ce->I, acc0,
                 ce->split_stage ? "blockIdx.x * blockDim.x + threadIdx.x" : ce->warp ? "lane" : "threadIdx.x",
                 acc0, ce->I, tcc_cuda_reduce_extent(rs[0]), acc0,
                 ce->split_stage ? "gridDim.x * blockDim.x" : ce->warp ? "32" : "blockDim.x");
  char j[32];
  snprintf(j, sizeof j, "j%d", acc0);
  bind_reduce_vars(ce, rs[0], j, ind + 2);
  for (int k = 1; k < n; k++)   /* (siblings of one node may share the variables already) */
    for (int d = 0; d < rs[k]->nidx && rs[k]->buf != rs[0]->buf; d++)
      tcc_buf_printf(b, "%*sconst %s i%d = i%d; (void)i%d;\n", ind + 2, "", ce->I, rs[k]->buf + d, rs[0]->buf + d,
                     rs[k]->buf + d);
  int mark = ce->nmemo;
  for (int k = 0; k < n; k++)
    if (emit_fold(ce, rs[k], acc0 + k, j, ind + 2)) return -1;
  ce->nmemo = mark;
  tcc_buf_printf(b, "%*s}\n", ind, "");
  for (int k = 0; k < n; k++)
    if (emit_coop_finish(ce, rs[k], acc0 + k, ind)) return -1;
  return 0;
}

/* After the per-thread folds of a cooperative REDUCE r into a<acc>: the
 * block (or warp) reduction and its result temp. */
static int emit_coop_finish(cuda_emit *ce, const tcc_vx *r, int acc, int ind) {
  if (ce->warp) {
    tcc_buf_printf(ce->b, "%*sa%d = tcc_warp_reduce(a%d, tcc_%s_op());\n", ind, "", acc, acc, red_op(r) + 4);
  } else if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN) {
    tcc_buf_printf(ce->b, "%*s{ tcc_pair<%s> id_; id_.v = %s; id_.i = INT64_MAX;\n", ind, "",
                   tcc_cuda_ctype(r->a->dtype), red_identity(r, r->a->dtype));
    tcc_buf_printf(ce->b, "%*s  a%d = tcc_block_reduce(a%d, tcc_%s_op(), id_); }\n", ind, "", acc, acc,
                   red_op(r) + 4);
  } else {
    tcc_buf_printf(ce->b, "%*sa%d = tcc_block_reduce(a%d, tcc_%s_op(), (%s)%s);\n", ind, "", acc, acc,
                   red_op(r) + 4, tcc_cuda_ctype(r->dtype), red_identity(r, r->dtype));
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
  tcc_buf_printf(b, "%*sconst %s t%d = ", ind, "", tcc_cuda_ctype(e->dtype), t);
  int va = -1;
  for (int i = 0; ce->in_lanes && i < ce->kp->nvacc; i++)
    if (ce->kp->vacc[i].buf == e->buf && ce->kp->vacc[i].idx == e->idx && !ce->kp->vacc[i].store) va = i;
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
    tcc_c_put_prim(D, b, e->op, e->dtype, od, x, y, z);
  }
  tcc_buf_puts(b, ";\n");
  return 0;
}

/* operand_text for tcc_c_put_store_guard */
static void operand_text_of(void *ctx, const tcc_vx *e, char *out, size_t cap) {
  operand_text((cuda_emit *)ctx, e, out, cap);
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
    tcc_buf_printf(ce->b, "%*s", ind, "");
    tcc_c_put_store_guard(ce->b, st->idx, m->rank, operand_text_of, ce);
    tcc_buf_printf(ce->b, "b%d[", st->buf);
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
/* The row cache of buffer buf (index into ce->rc), or -1. */
static int row_cache_of(const cuda_emit *ce, int buf) {
  for (int i = 0; i < ce->kp->nrc; i++)
    if (ce->kp->rc[i].buf == buf) return i;
  return -1;
}

/* At the top of a row: waits for the previous row's readers, copies each
 * cached window into shared memory (bounds-checked against the storage),
 * waits again. */
static void emit_row_fill(cuda_emit *ce, int ind) {
  tcc_buf *b = ce->b;
  tcc_buf_printf(b, "%*s__syncthreads();   /* the previous row's readers are done */\n", ind, "");
  for (int i = 0; i < ce->kp->nrc; i++) {
    int bi = ce->kp->rc[i].buf;
    const tcc_meta *m = &ce->p->bufs[bi].layout;
    tcc_buf_printf(b, "%*sconst long long rb%d = (long long)%" PRId64, ind, "", bi, m->offset + ce->kp->rc[i].lo);
    for (int d = 0; d < m->rank; d++) {
      if (!(ce->kp->rc[i].rowdims >> d & 1)) continue;
      tcc_buf_printf(b, " + (long long)%" PRId64 " * (long long)", m->strides[d]);
      put_ix(ce, ce->kp->rc[i].idx[d]);
    }
    tcc_buf_puts(b, ";\n");
    tcc_buf_printf(b, "%*sfor (int w_ = threadIdx.x; w_ < %" PRId64 "; w_ += blockDim.x) {\n", ind, "",
                   ce->kp->rc[i].w);
    tcc_buf_printf(b, "%*s  const long long g_ = rb%d + w_;\n", ind, "", bi);
    tcc_buf_printf(b, "%*s  s%d[w_] = (g_ >= 0 && g_ < %" PRId64 "LL) ? b%d[g_] : (%s)0;\n", ind, "", bi, m->span, bi,
                   tcc_cuda_ctype(m->dtype));
    tcc_buf_printf(b, "%*s}\n", ind, "");
  }
  tcc_buf_printf(b, "%*s__syncthreads();\n", ind, "");
}

/* The vectorized grid-stride loop (plan_vector said W), then the scalar
 * fallback for misaligned pointers. */
static int emit_vector_loop(cuda_emit *ce, int64_t numel, int W) {
  tcc_buf *b = ce->b;
  const tcc_kernel *k = ce->k;
  tcc_buf_puts(b, "  if (");
  for (int i = 0; i < ce->kp->nvacc; i++) {
    const tcc_meta *m = &ce->p->bufs[ce->kp->vacc[i].buf].layout;
    tcc_buf_printf(b, "%s((unsigned long long)b%d %% %d) == 0", i ? " && " : "", ce->kp->vacc[i].buf,
                   W * tcc_dtype_size(m->dtype));
  }
  tcc_buf_puts(b, ") {\n");
  tcc_buf_printf(b, "    for (%s e4 = (%s)blockIdx.x * blockDim.x + threadIdx.x; e4 < (%s)%" PRId64
                    "LL; e4 += (%s)gridDim.x * blockDim.x) {\n",
                 ce->I, ce->I, ce->I, numel / W, ce->I);
  for (int i = 0; i < ce->kp->nvacc; i++) {
    const tcc_meta *m = &ce->p->bufs[ce->kp->vacc[i].buf].layout;
    const char *T = tcc_cuda_ctype(m->dtype);
    if (ce->kp->vacc[i].store)
      tcc_buf_printf(b, "      tcc_vec<%s, %d> v%d;\n", T, W, i);
    else
      tcc_buf_printf(b, "      const tcc_vec<%s, %d> v%d = *(const tcc_vec<%s, %d> *)(b%d + (%s)%" PRId64
                        "LL + e4 * %d);\n", T, W, i, T, W, ce->kp->vacc[i].buf, ce->I, ce->kp->vacc[i].c, W);
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
  for (int i = 0; i < ce->kp->nvacc; i++) {
    if (!ce->kp->vacc[i].store) continue;
    const char *T = tcc_cuda_ctype(ce->p->bufs[ce->kp->vacc[i].buf].layout.dtype);
    tcc_buf_printf(b, "      *(tcc_vec<%s, %d> *)(b%d + (%s)%" PRId64 "LL + e4 * %d) = v%d;\n", T, W,
                   ce->kp->vacc[i].buf, ce->I, ce->kp->vacc[i].c, W, i);
  }
  tcc_buf_puts(b, "    }\n    return;\n  }\n");
  return 0;
}

/* Emits step st: live kernel k as __global__ k<kno>, or the first
 * launch of its split reduction, k<kno>_split, whose partials sit at
 * split_off in the workspace. */
static int emit_kernel(const tcc_program *p, const tcc_cuda_step *st, tcc_buf *b) {
  const tcc_graph *g = p->graph;
  const tcc_kernel *k = &p->kernels[st->kernel];
  const tcc_cuda_kernel_plan *kp = st->plan;
  const int kno = st->kno, split_stage = st->split_stage;
  const int64_t split_off = st->split_off;
  const char *used = kp->used;
  cuda_emit ce = {.p = p, .k = k, .kp = kp, .b = b, .split_stage = split_stage, .split_off = split_off};
  int rc = -1;
  ce.I = kp->idx32 ? "int" : "long long";
  if (kp->split > 1) {
    ce.split_groups = kp->split;
    ce.split_slots = kp->split * kp->rows;
  }

  if (split_stage) {
    tcc_buf_printf(b, "\n/* k%d_split: first stage of k%d's split reduction: grid (%" PRId64 ", %" PRId64
                      "), block %" PRId64 "; block (g, row) folds a grid-stride slice of row's %" PRId64
                      " elements into partial [row * %" PRId64 " + g] of each of its %d reduction%s at ws + %" PRId64
                      " (%" PRId64 " slots apart); %s indices */\n",
                   kno, kno, kp->split, kp->rows, kp->split_block, kp->red_max, kp->split, kp->ncoop,
                   kp->ncoop == 1 ? "" : "s", split_off, ce.split_slots, ce.I);
    tcc_buf_printf(b, "extern \"C\" __global__ void __launch_bounds__(%" PRId64 ") k%d_split(", kp->split_block,
                   kno);
  } else {
    tcc_buf_printf(b, "\n/* k%d: %s over [", kno, kp->launch.reduction ? "reduction" : "pointwise");
    for (int d = 0; d < k->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", k->sizes[d]);
    tcc_buf_printf(b, "]; grid %" PRId64 ", block %" PRId64, kp->launch.grid, kp->launch.block);
    if (kp->reduction)
      tcc_buf_printf(b, "; one %s per row of dims 0..%d (%" PRId64 " rows), %d %s reduction%s",
                     kp->warp_rows ? "warp" : "block", kp->row_rank - 1, kp->rows, kp->ncoop,
                     kp->warp_rows ? "warp" : "block", kp->ncoop == 1 ? "" : "s");
    if (kp->split > 1)
      tcc_buf_printf(b, "; split: folds the %" PRId64 " partials per row k%d_split left at ws + %" PRId64, kp->split,
                     kno, split_off);
    if (kp->nrc)
      tcc_buf_printf(b, "; persistent: %d input%s row in shared memory", kp->nrc, kp->nrc == 1 ? "'s" : "s'");
    tcc_buf_printf(b, "; %s indices */\n", ce.I);
    tcc_buf_printf(b, "extern \"C\" __global__ void __launch_bounds__(%" PRId64 ") k%d(", kp->launch.block, kno);
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
    const char *t = tcc_cuda_ctype(B->layout.dtype), *c = written ? "" : "const ";
    switch (B->kind) {
    case TCC_BUF_INPUT:   /* written: index_put_ into the caller's tensor */
      tcc_buf_printf(b, "  %s%s *__restrict__ b%d = (%s *)in%d;\n", c, t, bi, t, B->pos);
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
  for (int i = 0; i < kp->nrc; i++)
    tcc_buf_printf(b, "  __shared__ %s s%d[%" PRId64 "];\n", tcc_cuda_ctype(p->bufs[kp->rc[i].buf].layout.dtype), kp->rc[i].buf,
                   kp->rc[i].w);
  if (kp->numel == 0) {
    tcc_buf_puts(b, "  /* no elements */\n}\n");
    rc = 0;
    goto done;
  }
  int rank = k->rank;
  if (!kp->reduction) {
    int W = kp->vec_width;
    if (W && emit_vector_loop(&ce, kp->numel, W)) goto done;
    tcc_buf_printf(b, "  for (%s e = (%s)blockIdx.x * blockDim.x + threadIdx.x; e < (%s)%" PRId64
                      "LL; e += (%s)gridDim.x * blockDim.x) {\n",
                   ce.I, ce.I, ce.I, kp->numel, ce.I);
    split_index(&ce, "e", 0, rank, k->sizes, NULL, 4);
    if (emit_stores(&ce, 4)) goto done;
    tcc_buf_puts(b, "  }\n}\n");
  } else if (split_stage) {
    tcc_buf_printf(b, "  for (%s row = blockIdx.y; row < (%s)%" PRId64 "LL; row += gridDim.y) {\n", ce.I, ce.I,
                   kp->rows);
    split_index(&ce, "row", 0, kp->row_rank, k->sizes, NULL, 4);
    int acc0 = ce.naccs;   /* the schedule splits only reductions that fold in one loop */
    if (emit_coop_group(&ce, (const tcc_vx *const *)kp->coop, kp->ncoop, 4)) goto done;
    tcc_buf_puts(b, "    if (threadIdx.x == 0) {\n");
    for (int c = 0; c < kp->ncoop; c++)
      tcc_buf_printf(b, "      ((%s *)(ws + %" PRId64 "))[(long long)row * %" PRId64 " + blockIdx.x] = a%d;\n",
                     tcc_cuda_ctype(kp->coop[c]->dtype), split_partials(&ce, kp->coop[c]), kp->split, acc0 + c);
    tcc_buf_puts(b, "    }\n  }\n}\n");
  } else {
    ce.warp = kp->warp_rows > 0;
    if (ce.warp)
      tcc_buf_printf(b, "  const int lane = threadIdx.x & 31;\n"
                        "  for (%s row = (%s)blockIdx.x * %d + (threadIdx.x >> 5); row < (%s)%" PRId64
                        "LL; row += (%s)gridDim.x * %d) {\n",
                     ce.I, ce.I, kp->warp_rows, ce.I, kp->rows, ce.I, kp->warp_rows);
    else
      tcc_buf_printf(b, "  for (%s row = blockIdx.x; row < (%s)%" PRId64 "LL; row += gridDim.x) {\n", ce.I,
                     ce.I, kp->rows);
    split_index(&ce, "row", 0, kp->row_rank, k->sizes, NULL, 4);
    if (kp->nrc) emit_row_fill(&ce, 4);
    for (int i = 0, n; i < kp->ncoop; i += n) {
      n = kp->split > 1 ? 1 : tcc_cuda_coop_group_size(kp, i);
      if (emit_coop_group(&ce, kp->coop + i, n, 4)) goto done;
    }
    tcc_buf_printf(b, "    for (%s e = %s; e < (%s)%" PRId64 "LL; e += %s) {\n", ce.I,
                   ce.warp ? "lane" : "threadIdx.x", ce.I, kp->inner, ce.warp ? "32" : "blockDim.x");
    int mark = ce.nmemo;
    int vars[TCC_MAX_DIMS];
    for (int d = kp->row_rank; d < rank; d++) vars[d - kp->row_rank] = d;
    split_index(&ce, "e", kp->row_rank, rank - kp->row_rank, k->sizes + kp->row_rank, vars, 6);
    if (emit_stores(&ce, 6)) goto done;
    ce.nmemo = mark;
    tcc_buf_puts(b, "    }\n  }\n}\n");
  }
  rc = ce.oom ? -1 : 0;
done:
  free(ce.memo);
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

/* ------------------------------------------------------- translation unit */

int tcc_cuda_emit(const tcc_program *p, tcc_buf *b, tcc_error *err) {
  const tcc_graph *g = p->graph;
  const tcc_cuda_schedule *sch = p->sched.cuda;
  int rc = 0;
  (void)is_float;
  tcc_buf_printf(b,
                 "/* Generated by tccd (codegen %d) for %s.\n"
                 " * ABI 1: every kernel takes (inputs..., outputs..., workspace).\n"
                 " * %d inputs, %d outputs, %" PRId64 " workspace bytes. */\n",
                 TCC_CODEGEN_VERSION, g->target_label, g->ninputs, g->noutputs, sch->workspace_bytes);
  tcc_buf_puts(b, prelude);
  for (int bi = 0; bi < p->nbufs; bi++) {
    if (p->bufs[bi].kind != TCC_BUF_CONST || p->bufs[bi].dead) continue;
    int exported = 0;   /* read by cuBLAS or cuDNN: the client finds it with cuModuleGetGlobal */
    for (int i = 0; i < sch->n; i++) {
      const tcc_cuda_step *st = &sch->steps[i];
      const tcc_cuda_ref *a = st->is_gemm ? &st->gemm.a : &st->conv.a, *r = st->is_gemm ? &st->gemm.b : &st->conv.b;
      if (tcc_cuda_step_is_library(st))
        exported |= (a->base == TCC_CUDA_CONSTANT && a->index == bi) ||
                    (r->base == TCC_CUDA_CONSTANT && r->index == bi);
    }
    if (exported) tcc_buf_puts(b, "extern \"C\" ");
    tcc_c_put_constant(D, b, &p->bufs[bi], bi);
  }
  for (int i = 0; i < sch->n && !rc; i++) {
    const tcc_cuda_step *st = &sch->steps[i];
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
    if (st->is_conv) {
      static const char *const what[] = {[TCC_EXT_CONV_FWD] = "cudnnConvolutionForward",
          [TCC_EXT_CONV_BWD_DATA] = "cudnnConvolutionBackwardData",
          [TCC_EXT_CONV_BWD_WEIGHTS] = "cudnnConvolutionBackwardFilter"};
      const tcc_cuda_conv *C = &st->conv;
      tcc_buf_printf(b, "\n/* k%d: extern step, run by the client through cuDNN: %s(N=%" PRId64 ", Cin=%" PRId64
                        ", Cout=%" PRId64 ", groups=%" PRId64 ", %s%s) */\n",
                     st->kno, what[C->kind], C->prm[TCC_CONV_N], C->prm[TCC_CONV_CIN], C->prm[TCC_CONV_COUT],
                     C->prm[TCC_CONV_G], tcc_dtype_name(C->dtype), C->tf32 ? ", TF32" : "");
      continue;
    }
    if (emit_kernel(p, st, b)) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting CUDA");
  }
  if (!rc && b->failed) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting CUDA");
  return rc;
}
