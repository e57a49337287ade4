/*
 * emit.c — C source for the CPU target: prints the schedule
 * (cpu_schedule.h, schedule.c), decides nothing about how a kernel runs.
 *
 * Requires: a checked, planned, scheduled program.
 * Produces: one translation unit exporting
 *
 *   int tcc_entry(const void *const *inputs, void *const *outputs,
 *                 void *workspace);
 *
 * (the ABI of tcc.proto's Manifest): inputs[i] / outputs[i] point to
 * element [0] of each tensor's storage, in Graph.inputs / Graph.outputs
 * order; the kernels apply storage offsets and strides, and write outputs
 * with the strides their meta declares. Outputs must not overlap inputs,
 * each other or the workspace (the pointers are declared restrict).
 * Returns 0, or 1 when an index read from a tensor (gather, embedding,
 * index_select) was out of range or an integer division by zero
 * happened (PyTorch raises there; the outputs are then unspecified).
 * Programs with symbols (dynamic shapes, dynamic.c) export tcc_entry2
 * instead, which also takes the symbols' values (const int64_t *tcc_S)
 * and passes them to every kernel. A program the schedule marks
 * `threaded` runs its calls under the thread governor (prelude.c).
 *
 * Each live kernel becomes a static function with one loop nest, the
 * schedule's: its loops (planned nests index with the accesses' affine
 * forms, dim-order nests through the index expressions), each value
 * printed at its loop level (a row statistic's own reduction loop placed
 * where it is first needed), the parallel-for, simd and unroll pragmas,
 * the peeled element loop and the range-split loop (once per range, the
 * comparisons it decides constant: emit_ranges) where the schedule put
 * them, and each
 * group of sibling reductions (the schedule's red_lead: var and mean of
 * one row) in one shared loop. Reduction loops carry
 * `#pragma omp simd reduction(...)` so the C compiler vectorizes them
 * (reassociating float sums), except where the schedule says otherwise:
 * column sums (the element loop in blocks, sums in arrays, the row loop
 * around a SIMD loop over the block: emit_column_sums), pooling windows
 * (unrolled inside a SIMD element loop) and merged inner loops (one loop
 * over two reduction variables, affine loads indexed by it); a
 * reduction loop the schedule marks touches the next row's lines first
 * (put_row_prefetch), and the current row's lines of the element loop's
 * stores (put_prefetches, for writing). float16 values are _Float16, bfloat16
 * values their bits (uint16_t) converted through float. Indices are
 * int64_t (tensors past 2^31 elements index correctly).
 *
 * EXTERN GEMM kernels call oneDNN's dnnl_sgemm or cblas_?gemm, threaded
 * as the schedule's plan_gemm says (emit_dnnl_gemm, emit_extern), or,
 * few rows against nn.Linear's weight, stream its rows in a loop of
 * their own (emit_stream_gemm), or, up to eight rows against a weight
 * stored [K, N], split K among the threads (emit_split_k_gemm; 9-32
 * rows on AVX-512 through register tiles, emit_split_k_tiled_gemm), or,
 * with one side of 13-64 rows or columns, stream the other's rows
 * against it packed (emit_narrow_gemm).
 * Convolution EXTERNs (TCC_EXT_CONV_*) become a static tcc_dnnl_conv each
 * and one call of the oneDNN runtime that the source then carries
 * (runtime/onednn_conv.c; emit_conv_extern), with a destructor that frees
 * their primitives when the kernel is unloaded.
 *
 * Hygiene: nothing from the request reaches the source but numbers.
 * Identifiers are generated (k<n> kernels, b<n> buffers, c<n> constants,
 * t<n> temporaries, i<n> loop variables, i<n>b/e/c/m/q their blocks,
 * merged loops and prefetch steps, a<n> accumulators); floats are printed exactly as
 * hexadecimal literals ("%a"), NaN and infinities via <math.h> macros.
 */
#include "cpu_schedule.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* C99 for the system compiler (cpu/prelude.c's helpers). */
static const tcc_dialect c99 = {
  .ctype = tcc_cpu_ctype,
  .constant_qualifiers = "static const",
  .half_constants_as_values = 1,
  .halves_in_float = 0,
  .nan_f32 = "NAN",
  .nan_f64 = "((double)NAN)",
  .inf_f32 = "INFINITY",
  .inf_f64 = "((double)INFINITY)",
  .round = "nearbyint",
  .isinf_by_fabs = 0,
  .div_flag = ", &bad",
  .typed_float_helpers = 1,
};
#define D (&c99)



/* ------------------------------------------------------- constants */


/* ------------------------------------------------------- loop plan */


typedef struct kernel_emit {
  const tcc_program *p;
  const tcc_kernel *k;
  tcc_buf *b;
  const tcc_cpu_kernel_schedule *ks;   /* the schedule's decisions for k */
  tcc_ptrmap temps;          /* vx (or VALUE ix) -> temp number + 1; NULL: none */
  int ntemps;
  tcc_cpu_fv fv;             /* free variables (all_bound) */
  char *bound;               /* per var id: bound at this point of the code */
  int nvars;
  const void **scoped;       /* temps defined inside open reduction loops */
  int nscoped, capscoped;
  const char *vname[3];      /* extern: names of vars 0..2 (NULL: i<n>) */
  int naccs;                 /* accumulators */
  int walking;                /* in the kernel-level walk (not a scope) */
  int in_simd_element;       /* printing the body of an `omp simd` element
                                loop: reduction loops unroll (windows) */
  /* a merged reduction loop being printed (schedule.c, merged reduction
   * loops): its var i<merge_name>m runs outer * merge_n + inner of each
   * (outer, inner) pair, and affine loads print their index over it */
  int nmerge, merge_name;
  int merge_outer[TCC_CPU_MAX_GROUP], merge_inner[TCC_CPU_MAX_GROUP];
  int64_t merge_n;
  int64_t *coef;             /* nvars + 1 scratch coefficients */
  int peeling;               /* printing the peeled loop's middle range: the
                                schedule's peel[] clamps print unclamped */
  /* printing one range of the schedule's range split: its loop's var
   * range_var runs over [range_lo, range_hi), and only the nodes in
   * range_live print (-1: not in one) */
  int range_var;
  int64_t range_lo, range_hi;
  tcc_ptrmap range_live;
  int col_prologue;          /* printing the column values' loop: they are
                                computed, not loaded (emit_column_values) */
  int staging;              /* printing a staged row's loop: its value is
                                computed, not loaded (emit_staging_loop) */
  int oom;
} kernel_emit;

/* --------------------------------------------------------- indices */

static void put_var(kernel_emit *ke, int v) {
  if (v < 3 && ke->vname[v]) tcc_buf_puts(ke->b, ke->vname[v]);
  else tcc_buf_printf(ke->b, "i%d", v);
}

/* ------------------------------------------------- border peeling
 *
 * A gather that pads (a padded convolution's im2col pack, the stride-1
 * grad-input pack) reads through clamp(x, lo, hi), x = c + v in the
 * element loop's var v (c from outer vars), and selects 0 where x is out
 * of range. Clamped, the loads
 * are gathers (~2x slower for a 3x3 pack); in the middle range of v,
 * where every such x is within [lo, hi], each clamp is the identity. So
 * the element loop is printed three times: [0, ps) and [pe, n) as is,
 * [ps, pe) with those clamps printed as x (contiguous loads that
 * vectorize). Only unplanned (dim-order) nests, whose element loop holds
 * no reduction (a batch norm's statistics computed per channel before a
 * pack are fine): a planned nest's accesses are affine already. */


static const tcc_ix *peeled_inner(const kernel_emit *ke, const tcc_ix *e) {
  for (int i = 0; i < ke->ks->npeel; i++)
    if (ke->ks->peel[i] == e) {
      int64_t lo, hi;
      return tcc_cpu_clamp_parts(e, &lo, &hi);
    }
  return NULL;
}


/* Whether comparison e is (x >= c), (x > c), (x <= c) or (x < c) for the
 * argument x of a peeled clamp [lo, hi] and holds for all of [lo, hi]. */
static int peel_implies(const kernel_emit *ke, const tcc_vx *e) {
  if ((e->op != TCC_PRIM_GE && e->op != TCC_PRIM_GT && e->op != TCC_PRIM_LE && e->op != TCC_PRIM_LT) ||
      !e->a || !e->b || e->a->op != TCC_PRIM_INDEX || e->b->op != TCC_PRIM_CONST ||
      tcc_dtype_is_float(e->b->dtype))
    return 0;
  int64_t c = e->b->i;
  for (int i = 0; i < ke->ks->npeel; i++) {
    int64_t lo, hi;
    if (tcc_cpu_clamp_parts(ke->ks->peel[i], &lo, &hi) != e->a->idx[0]) continue;
    if ((e->op == TCC_PRIM_GE && c <= lo) || (e->op == TCC_PRIM_GT && lo != INT64_MIN && c < lo) ||
        (e->op == TCC_PRIM_LE && c >= hi) || (e->op == TCC_PRIM_LT && hi != INT64_MAX && c > hi))
      return 1;
  }
  return 0;
}


/* Declares ps_ and pe_: the range of v where every peeled clamp is the
 * identity, within [0, n). */
static void put_peel_range(kernel_emit *ke, int v, int64_t n, int indent) {
  tcc_buf *b = ke->b;
  tcc_buf_printf(b, "%*sint64_t ps_ = 0, pe_ = %" PRId64 ";\n", indent, "", n);
  for (int i = 0; i < ke->ks->npeel; i++) {
    int64_t lo, hi, coef[TCC_MAX_DIMS], c;
    const tcc_ix *x = tcc_cpu_clamp_parts(ke->ks->peel[i], &lo, &hi);
    tcc_cpu_peelable(x, v, coef, &c);
    tcc_buf_printf(b, "%*s{\n%*s  const int64_t c_ = %" PRId64, indent, "", indent, "", c);
    for (int d = 0; d < v; d++)
      if (coef[d]) {
        tcc_buf_printf(b, " + %" PRId64 " * ", coef[d]);
        put_var(ke, d);
      }
    tcc_buf_puts(b, ";\n");
    if (lo != INT64_MIN)
      tcc_buf_printf(b, "%*s  if (%" PRId64 " - c_ > ps_) ps_ = %" PRId64 " - c_;\n", indent, "", lo, lo);
    if (hi != INT64_MAX)
      tcc_buf_printf(b, "%*s  if (%" PRId64 " - c_ < pe_) pe_ = %" PRId64 " - c_;\n", indent, "", hi + 1,
                     hi + 1);
    tcc_buf_printf(b, "%*s}\n", indent, "");
  }
  tcc_buf_printf(b, "%*sif (ps_ > %" PRId64 ") ps_ = %" PRId64 ";\n%*sif (pe_ < ps_) pe_ = ps_;\n", indent, "",
                 n, n, indent, "");
}

/* ---------------------------------------------------- range split
 *
 * The schedule's range_loop prints once per range between the constants
 * its var is compared with (plan_range_split). Inside a range each such
 * comparison has one value (range_decides), a select on it is its chosen
 * operand, nodes only the unchosen operands need do not print
 * (range_live), and a clamp whose argument the range keeps within its
 * bounds prints as the argument (range_interval): a concatenation's
 * element reads its one input, unit-stride. */

/* 1 or 0: comparison e's value throughout the range being printed; -1:
 * not one it decides. */
static int range_decides(const kernel_emit *ke, const tcc_vx *e) {
  int v, below;
  int64_t at;
  if (ke->range_var < 0 || !tcc_cpu_range_pred(e, &v, &at, &below) || v != ke->range_var) return -1;
  if (at <= ke->range_lo) return !below;
  if (at >= ke->range_hi) return below;
  return -1;
}

/* [*lo, *hi]: the values affine index e takes in the range being
 * printed (the kernel's vars over their sizes, the range's over the
 * range). 0 when e is not affine in the kernel's vars. */
static int range_interval(const kernel_emit *ke, const tcc_ix *e, int64_t *lo, int64_t *hi) {
  int64_t coef[TCC_MAX_DIMS], c;
  if (!tcc_ix_affine(e, TCC_MAX_DIMS, coef, &c)) return 0;
  *lo = *hi = c;
  for (int d = 0; d < TCC_MAX_DIMS; d++) {
    if (!coef[d]) continue;
    if (d >= ke->k->rank) return 0;
    int64_t a = d == ke->range_var ? ke->range_lo : 0;
    int64_t z = d == ke->range_var ? ke->range_hi - 1 : ke->k->sizes[d] - 1, x, y;
    if (__builtin_mul_overflow(coef[d], a, &x) || __builtin_mul_overflow(coef[d], z, &y)) return 0;
    if (x > y) {
      int64_t t = x;
      x = y;
      y = t;
    }
    if (__builtin_add_overflow(*lo, x, lo) || __builtin_add_overflow(*hi, y, hi)) return 0;
  }
  return 1;
}

/* Clamp e's argument when the range being printed keeps it within the
 * clamp's bounds (the clamp is the identity there), else NULL. */
static const tcc_ix *range_unclamped(const kernel_emit *ke, const tcc_ix *e) {
  int64_t lo, hi, a, z;
  const tcc_ix *x = ke->range_var >= 0 ? tcc_cpu_clamp_parts(e, &lo, &hi) : NULL;
  return x && range_interval(ke, x, &a, &z) && a >= lo && z <= hi ? x : NULL;
}

static void range_live_ix(kernel_emit *ke, const tcc_ix *x);

/* Marks e and what it needs in the range being printed in range_live. */
static void range_live_vx(kernel_emit *ke, const tcc_vx *e) {
  if (!e || tcc_ptrmap_get(&ke->range_live, e)) return;
  if (tcc_ptrmap_put(&ke->range_live, e, e)) {
    ke->oom = 1;
    return;
  }
  int pick = e->op == TCC_PRIM_WHERE ? range_decides(ke, e->a) : -1;
  if (pick >= 0) {
    range_live_vx(ke, pick ? e->b : e->c);
    return;
  }
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) range_live_ix(ke, e->idx[d]);
  range_live_vx(ke, e->a);
  range_live_vx(ke, e->b);
  range_live_vx(ke, e->c);
}

static void range_live_ix(kernel_emit *ke, const tcc_ix *x) {
  if (!x) return;
  if (x->kind == TCC_IX_VALUE) range_live_vx(ke, x->v);
  range_live_ix(ke, x->a);
  range_live_ix(ke, x->b);
}

/* Index expressions are non-negative wherever DIV and MOD appear, so C's
 * truncating / and % are floor division and modulo there. */
static void put_ix(kernel_emit *ke, const tcc_ix *e) {
  tcc_buf *b = ke->b;
  switch (e->kind) {
  case TCC_IX_CONST: tcc_put_int64(b, e->c); break;
  case TCC_IX_VAR: put_var(ke, e->var); break;
  case TCC_IX_ADD:
    tcc_buf_puts(b, "(");
    put_ix(ke, e->a);
    tcc_buf_puts(b, " + ");
    put_ix(ke, e->b);
    tcc_buf_puts(b, ")");
    break;
  case TCC_IX_MUL:
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    tcc_buf_puts(b, "(");
    put_ix(ke, e->a);
    tcc_buf_printf(b, " %s ", e->kind == TCC_IX_MUL ? "*" : e->kind == TCC_IX_DIV ? "/" : "%");
    tcc_put_int64(b, e->c);
    tcc_buf_puts(b, ")");
    break;
  case TCC_IX_MIN:
  case TCC_IX_MAX: {
    const tcc_ix *unclamped = ke->peeling ? peeled_inner(ke, e) : range_unclamped(ke, e);
    if (unclamped) {
      put_ix(ke, unclamped);   /* in range here: the clamp is the identity */
      break;
    }
    tcc_buf_printf(b, "tcc_%s64(", e->kind == TCC_IX_MIN ? "min" : "max");
    put_ix(ke, e->a);
    tcc_buf_puts(b, ", ");
    tcc_put_int64(b, e->c);
    tcc_buf_puts(b, ")");
    break;
  }
  case TCC_IX_VALUE: {
    intptr_t t = (intptr_t)tcc_ptrmap_get(&ke->temps, e);
    tcc_buf_printf(b, "t%d", (int)(t - 1));
    break;
  }
  }
}


/* Storage index of (buf, idx) as C. */
static void put_index(kernel_emit *ke, int buf, const tcc_ix *const *idx) {
  tcc_buf *b = ke->b;
  const tcc_cpu_nest *pl = &ke->ks->nest;
  if (pl->affine) {
    const tcc_cpu_access *a = NULL;
    for (int i = 0; i < ke->ks->nacc; i++)
      if (ke->ks->acc[i].buf == buf && ke->ks->acc[i].idx == idx) a = &ke->ks->acc[i];
    int any = 0;
    if (a->c) {
      tcc_buf_printf(b, "%" PRId64, a->c);
      any = 1;
    }
    for (int j = 0; j < pl->nloops; j++) {
      int64_t cf = a->coef[pl->dims[j][pl->ndims[j] - 1]];
      if (!cf) continue;
      if (any) tcc_buf_puts(b, " + ");
      if (cf == 1) tcc_buf_printf(b, "i%d", j);
      else tcc_buf_printf(b, "%" PRId64 " * i%d", cf, j);
      any = 1;
    }
    if (!any) tcc_buf_puts(b, "0");
    return;
  }
  const tcc_meta *m = &ke->p->bufs[buf].layout;
  int64_t c;
  const int affine = tcc_linear_affine(m->rank, idx, m->strides, ke->nvars, ke->coef, &c);
  if (ke->nmerge && affine) {
    /* in a merged reduction loop: outer * n + inner reads as the merged var */
    int ok = 1;
    for (int i = 0; i < ke->nmerge && ok; i++)
      ok = ke->coef[ke->merge_outer[i]] == ke->coef[ke->merge_inner[i]] * ke->merge_n;
    if (ok) {
      tcc_buf_printf(b, "%" PRId64, c + m->offset);
      for (int v = 0; v < ke->nvars; v++) {
        int64_t cf = ke->coef[v];
        int merged = 0;
        for (int i = 0; i < ke->nmerge; i++) {
          if (v == ke->merge_outer[i]) merged = 1, cf = 0;
          if (v == ke->merge_inner[i] && ke->coef[v]) merged = 2;
        }
        if (!cf) continue;
        tcc_buf_printf(b, " + %" PRId64 " * ", cf);
        if (merged == 2) tcc_buf_printf(b, "i%dm", ke->merge_name);
        else put_var(ke, v);
      }
      return;
    }
  }
  /* An index that is no affine form of the loop variables (a padded
   * window's clamps, a reshape's div and mod, a gathered value) makes the
   * vector loop gather; with 64-bit lanes gcc kept such loops scalar
   * ("no vectype" for the load: a 3x3 stride-2 max pool of 16 x 64 x
   * 64 x 64 took 16.2 ms on two threads of the Zen 5 VM, 1.6 ms with the
   * index as int32, vectorized). Every index lies inside the buffer's
   * span (clamped, or checked to), so where the span fits an int32 the
   * index is computed as before and read as one; affine indices stay
   * int64, which gcc sees through to contiguous and strided loads. */
  const int narrow = !ke->p->graph->nsyms && m->span <= INT32_MAX && !affine;
  tcc_buf_printf(b, "%s%" PRId64, narrow ? "(int32_t)(" : "", m->offset);
  for (int d = 0; d < m->rank; d++) {
    if (idx[d]->kind == TCC_IX_CONST && idx[d]->c == 0) continue;
    tcc_buf_printf(b, " + %" PRId64 " * ", m->strides[d]);
    put_ix(ke, idx[d]);
  }
  if (narrow) tcc_buf_puts(b, ")");
}

/* ------------------------------------------------------------ body */


/* A conversion of text x from dtype from to dtype to. */
static void put_cast(tcc_buf *b, tcc_dtype from, tcc_dtype to, const char *x) {
  if (to == TCC__V1__DTYPE__BOOL) {
    if (from == TCC__V1__DTYPE__BFLOAT16) tcc_buf_printf(b, "(uint8_t)(tcc_bf16_to_f32(%s) != 0)", x);
    else tcc_buf_printf(b, "(uint8_t)(%s != 0)", x);
  } else if (to == TCC__V1__DTYPE__BFLOAT16) {
    tcc_buf_printf(b, "tcc_f32_to_bf16((float)%s)", x);
  } else if (from == TCC__V1__DTYPE__BFLOAT16) {
    tcc_buf_printf(b, "(%s)tcc_bf16_to_f32(%s)", tcc_cpu_ctype(to), x);
  } else {
    tcc_buf_printf(b, "(%s)%s", tcc_cpu_ctype(to), x);
  }
}

/* The operand text of e: a literal or its temporary. */
static void operand_text(kernel_emit *ke, const tcc_vx *e, char *out, size_t cap) {
  if (e->op == TCC_PRIM_CONST) {
    tcc_buf lit = {0};
    tcc_c_put_literal(D, &lit, e);
    const char *t = lit.data ? lit.data : "0";
    snprintf(out, cap, t[0] == '-' ? "(%s)" : "%s", t);   /* never "--" or "- -x" */
    tcc_buf_free(&lit);
    return;
  }
  intptr_t t = (intptr_t)tcc_ptrmap_get(&ke->temps, e);
  snprintf(out, cap, "t%d", (int)(t - 1));
}

/* ------------------------------------------------- free variables */

/* Are all free vars of e bound at this point of the code? */
static int all_bound(kernel_emit *ke, const tcc_vx *e) {
  const tcc_varset *s = tcc_cpu_fv_vx(&ke->fv, e);
  for (int i = 0; i < s->n; i++)
    if (s->v[i] >= ke->nvars || !ke->bound[s->v[i]]) return 0;
  return 1;
}


/* ------------------------------------------------------- emission */

static int emit_node(kernel_emit *ke, const tcc_vx *e, int indent);

/* x / c or x % c (FLOORDIV, REM) of an argmax or argmin position x
 * (0 <= x < its window's size <= INT32_MAX) by a constant c > 0: as int32
 * division, which gcc vectorizes where int64 division has no SIMD form
 * (a max pool's index, decoded from its window position, kept the
 * element loop scalar). */
static int window_position_division(const tcc_vx *e) {
  if (e->op != TCC_PRIM_FLOORDIV && e->op != TCC_PRIM_REM) return 0;
  const tcc_vx *x = e->a, *c = e->b;
  if (x->op != TCC_PRIM_REDUCE || (x->i != TCC_RED_ARGMAX && x->i != TCC_RED_ARGMIN)) return 0;
  if (c->op != TCC_PRIM_CONST || tcc_dtype_is_float(c->dtype) || c->i <= 0 || c->i > INT32_MAX) return 0;
  int64_t n = 1;
  for (int r = 0; r < x->nidx; r++)
    if ((n *= x->idx[r]->c) > INT32_MAX) return 0;
  return 1;
}

static int define_temp(kernel_emit *ke, const void *key, int *t) {
  *t = ke->ntemps++;
  if (tcc_ptrmap_put(&ke->temps, key, (void *)(intptr_t)(*t + 1))) return -1;
  if (ke->nscoped >= 0 && ke->capscoped) {
    if (ke->nscoped == ke->capscoped) {
      int nc = ke->capscoped * 2;
      const void **ns = realloc(ke->scoped, sizeof *ns * (size_t)nc);
      if (!ns) return -1;
      ke->scoped = ns;
      ke->capscoped = nc;
    }
    ke->scoped[ke->nscoped++] = key;
  }
  return 0;
}

/* Temporaries for the index values inside an index. */
static int emit_ix_values(kernel_emit *ke, const tcc_ix *x, int indent) {
  if (!x) return 0;
  if (x->kind != TCC_IX_VALUE) {
    if (emit_ix_values(ke, x->a, indent)) return -1;
    return emit_ix_values(ke, x->b, indent);
  }
  if (tcc_ptrmap_get(&ke->temps, x)) return 0;
  if (emit_node(ke, x->v, indent)) return -1;
  char v[96];
  operand_text(ke, x->v, v, sizeof v);
  int t;
  if (define_temp(ke, x, &t)) return -1;
  tcc_buf_printf(ke->b, "%*sint64_t t%d = %s;\n%*sif (t%d < 0 || t%d >= %" PRId64 ") { bad = 1; t%d = 0; }\n",
                 indent, "", t, v, indent, "", t, t, x->c, t);
  return 0;
}

static const char *red_init(const tcc_vx *r) {
  int fl = tcc_dtype_is_float(r->dtype);
  switch ((tcc_reduce_kind)r->i) {
  case TCC_RED_SUM: return "0";
  case TCC_RED_PROD: return "1";
  case TCC_RED_MAX: return fl ? "-INFINITY" : "tcc_lowest";
  case TCC_RED_MIN: return fl ? "INFINITY" : "tcc_highest";
  default: return "0";
  }
}


/* How a REDUCE accumulates. A float32 sum adds each run of its innermost
 * loop (vectorised, at most TCC_SUM_BLOCK long) in float, and those
 * partial sums in double: eager PyTorch sums float32 in a cascade, whose
 * error hardly grows with the extent; one float accumulator's does, and
 * batch norm's statistics over a batch came out several times less
 * accurate than eager's. Summing everything in double costs up to 2x on
 * in-cache rows; the partials cost one add per run. */
static int float_partial(const tcc_vx *r) {
  return r->i == TCC_RED_SUM && r->dtype == TCC__V1__DTYPE__FLOAT32;
}

static const char *acc_ctype(const tcc_vx *r) {
  return float_partial(r) ? "double" : tcc_cpu_ctype(r->dtype);
}

/* The longest run of a float32 sum's innermost loop summed in float. */
#define TCC_SUM_BLOCK 256

/* Lane accumulators: a float sum's innermost loop, vectorised, adds into
 * one vector register, so a cheap summand (a row's sum of squares, a
 * product of two loads) waits on the add's latency, 3-4 cycles an
 * iteration. With TCC_SUM_VECTORS vectors of lanes (an array a<acc>q
 * indexed by the position in a chunk of that many elements) the adds of
 * a chunk are independent; the lanes are added together after the loop.
 * The loop over a chunk is marked `GCC ivdep`, not `omp simd`: gcc kept
 * the lanes in memory, not in registers, under `omp simd reduction(|:bad)`
 * (gcc 12), and it vectorises the loop without the pragma, as no lane
 * reads another's.
 * Returns the chunk's length in elements when every REDUCE of the group
 * is a float32 or float64 sum of one dtype whose innermost loop (static,
 * not merged, vectorised) is a whole number of chunks and whose summand
 * is cheap (tcc_vx_costly: an exp or a division is not waiting on the
 * add, and its library call would spill the lanes), else 0. */
#define TCC_SUM_VECTORS 4

/* Does exp node e print the prelude's inline tcc_expf (plan_inline_exp)? */
static int inline_exp(const kernel_emit *ke, const tcc_vx *e) {
  return e->op == TCC_PRIM_EXP && e->dtype == TCC__V1__DTYPE__FLOAT32 && ke->ks->inline_exp;
}

/* Does computing e at each step of loop variable v divide, take a root
 * or call a transcendental function (tcc_prim_costly; not an inline exp,
 * whose polynomial runs in the lanes like any arithmetic)? Parts that do not
 * read v are computed once outside that loop (emit_hoistable, or gcc's
 * invariant motion), a row's mean among them; a nested REDUCE is a loop
 * of its own. */
static int costly_in_loop(kernel_emit *ke, const tcc_vx *e, int v) {
  if (!e || e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_CONST) return 0;
  const tcc_varset *fv = tcc_cpu_fv_vx(&ke->fv, e);
  int reads_v = 0;
  for (int i = 0; i < fv->n && !reads_v; i++) reads_v = fv->v[i] == v;
  if (!reads_v) return 0;
  return e->op == TCC_PRIM_REDUCE || (tcc_prim_costly(e->op) && !inline_exp(ke, e)) ||
         costly_in_loop(ke, e->a, v) || costly_in_loop(ke, e->b, v) || costly_in_loop(ke, e->c, v);
}

static int sum_lanes(kernel_emit *ke, const tcc_vx *const *group, int ng, int simd, int merged,
                     int last, int64_t n_last) {
  const char *isa = ke->p->graph->target.isa;
  int vbytes = !isa ? 16 : strcmp(isa, "x86-64-v4") == 0 ? 64 : strcmp(isa, "x86-64-v3") == 0 ? 32 : 16;
  if (!simd || merged || last < 0 || ke->in_simd_element || ke->p->graph->nsyms) return 0;
  for (int g = 0; g < ng; g++)
    if (group[g]->i != TCC_RED_SUM || group[g]->dtype != group[0]->dtype ||
        (group[g]->dtype != TCC__V1__DTYPE__FLOAT32 && group[g]->dtype != TCC__V1__DTYPE__FLOAT64))
      return 0;
  int lanes = TCC_SUM_VECTORS * vbytes / (group[0]->dtype == TCC__V1__DTYPE__FLOAT32 ? 4 : 8);
  if (n_last < lanes || n_last % lanes || TCC_SUM_BLOCK % lanes) return 0;
  int costly = 0;
  for (int g = 0; g < ng && !costly; g++) costly = costly_in_loop(ke, group[g]->a, group[g]->buf + last);
  return costly ? 0 : lanes;
}

/* Emits (once) every part of e that can be computed at this point,
 * i.e. whose free vars are all bound: what a reduction loop hoists. */
static int emit_hoistable(kernel_emit *ke, const tcc_vx *e, tcc_ptrmap *seen, int indent) {
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(&ke->temps, e) || tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (all_bound(ke, e)) return emit_node(ke, e, indent);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++) {
      /* values inside indices: hoist their hoistable parts */
      const tcc_ix *vals[TCC_MAX_DIMS];
      int nv = tcc_ix_values(e->idx[d], vals, TCC_MAX_DIMS);
      for (int i = 0; i < nv; i++)
        if (emit_hoistable(ke, vals[i]->v, seen, indent)) return -1;
    }
  if (e->a && emit_hoistable(ke, e->a, seen, indent)) return -1;
  if (e->b && emit_hoistable(ke, e->b, seen, indent)) return -1;
  if (e->c && emit_hoistable(ke, e->c, seen, indent)) return -1;
  return 0;
}

/* The head of reduction loop r of r0's nest at *ind: with `blocked`,
 * the innermost one runs in blocks of TCC_SUM_BLOCK (open_sum_block
 * before, then this loop over the block). */
static void open_sum_block(kernel_emit *ke, int v, const char *sfx, int64_t n, int *ind) {
  tcc_buf_printf(ke->b, "%*sfor (int64_t i%d%sb = 0; i%d%sb < %" PRId64 "; i%d%sb += %d) {\n", *ind, "", v, sfx,
                 v, sfx, n, v, sfx, TCC_SUM_BLOCK);
  *ind += 2;
  tcc_buf_printf(ke->b, "%*sconst int64_t i%d%se = i%d%sb + %d < %" PRId64 " ? i%d%sb + %d : %" PRId64 ";\n",
                 *ind, "", v, sfx, v, sfx, TCC_SUM_BLOCK, n, v, sfx, TCC_SUM_BLOCK, n);
}

/* Prefetch streams (cpu_schedule.h) in loop v's block [lo, hi): each
 * one's lines, for writing when `write` (prefetchw where the ISA has it,
 * else prefetcht0). */
static void put_prefetches(kernel_emit *ke, const tcc_cpu_prefetch *fs, int n, int write, const char *lo,
                           const char *hi, int v, int ind) {
  tcc_buf *b = ke->b;
  for (int i = 0; i < n; i++) {
    const tcc_cpu_prefetch *f = &fs[i];
    tcc_buf_printf(b, "%*sfor (int64_t i%dq = %s; i%dq < %s; i%dq += %" PRId64 ")\n", ind, "", v, lo, v, hi, v,
                   f->step);
    tcc_buf_printf(b, "%*s  __builtin_prefetch(&b%d[%" PRId64, ind, "", f->buf, f->c);
    for (int t = 0; t < f->nterm; t++) tcc_buf_printf(b, " + %" PRId64 " * i%d", f->coef[t], f->var[t]);
    tcc_buf_printf(b, " + i%dq]%s);\n", v, write ? ", 1, 3" : "");
  }
}

/* The next-row prefetch (cpu_schedule.h) in loop v's block [lo, hi):
 * each stream's lines of the row row_ahead on, when the row loop has it. */
static void put_row_prefetch(kernel_emit *ke, const char *lo, const char *hi, int v, int ind) {
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  tcc_buf_printf(ke->b, "%*sif (i%d + %" PRId64 " < %" PRId64 ") {\n", ind, "", ks->row_var, ks->row_ahead,
                 ks->row_n);
  put_prefetches(ke, ks->prefetch, ks->nprefetch, 0, lo, hi, v, ind + 2);
  tcc_buf_printf(ke->b, "%*s}\n", ind, "");
}

static void open_red_loop(kernel_emit *ke, int v, const char *sfx, int64_t n, int in_block, int *ind) {
  if (in_block)
    tcc_buf_printf(ke->b, "%*sfor (int64_t i%d%s = i%d%sb; i%d%s < i%d%se; i%d%s++) {\n", *ind, "", v, sfx, v,
                   sfx, v, sfx, v, sfx, v, sfx);
  else
    tcc_buf_printf(ke->b, "%*sfor (int64_t i%d%s = 0; i%d%s < %" PRId64 "; i%d%s++) {\n", *ind, "", v, sfx, v,
                   sfx, n, v, sfx);
  *ind += 2;
}

/* Are the two innermost loops of the reductions of group[0..ng) one
 * merged loop (schedule.c, red_merged)? Every member must be marked. */
static int merged_group(const kernel_emit *ke, const tcc_vx *const *group, int ng) {
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  if (!ks->red_merged || group[0]->nidx < 2 || ng > TCC_CPU_MAX_GROUP) return 0;
  for (int g = 0; g < ng; g++) {
    int marked = 0;
    for (int i = 0; i < ks->nnodes && !marked; i++)
      if (ks->nodes[i] == group[g]) marked = ks->red_merged[i];
    if (!marked) return 0;
  }
  return 1;
}

/* Binds (on) or unbinds the reduction variables of a group's loop; on
 * binding, each later member's variables are named as the leader's. */
static void bind_red_vars(kernel_emit *ke, const tcc_vx *const *group, int ng, int ind, int on) {
  for (int g = 0; g < ng; g++)
    for (int r = 0; r < group[g]->nidx; r++) {
      int v = group[g]->buf + r;
      if (on && g && v != group[0]->buf + r)
        tcc_buf_printf(ke->b, "%*sconst int64_t i%d = i%d;\n", ind, "", v, group[0]->buf + r);
      if (v < ke->nvars) ke->bound[v] = (char)on;
    }
}

/* One reduction loop nest computing every REDUCE of group[0..ng) (same
 * extents), then their results as temporaries. */
/* The temporaries defined in a loop body since scoped mark go out of
 * scope with it. */
static void drop_scoped(kernel_emit *ke, int mark) {
  for (int i = mark; i < ke->nscoped; i++) tcc_ptrmap_put(&ke->temps, ke->scoped[i], NULL);
  ke->nscoped = mark;
}

/* Declares group member q's lanes a<acc>q (sum_lanes), zero. */
static void put_lanes(kernel_emit *ke, const tcc_vx *q, int acc, int lanes, int ind) {
  tcc_buf_printf(ke->b, "%*s%s a%dq[%d] __attribute__((aligned(64))) = {0};\n", ind, "", tcc_cpu_ctype(q->dtype),
                 acc, lanes);
}

/* Adds group member q's lanes a<acc>q (sum_lanes) into its accumulator:
 * the TCC_SUM_VECTORS vectors into one, then that vector's lanes. */
static void fold_lanes(kernel_emit *ke, const tcc_vx *q, int acc, int lanes, int ind) {
  const int w = lanes / TCC_SUM_VECTORS;
  tcc_buf_printf(ke->b, "%*s{\n%*s  #pragma omp simd\n%*s  for (int l = 0; l < %d; l++)\n"
                        "%*s    a%dq[l] = (a%dq[l] + a%dq[l + %d]) + (a%dq[l + %d] + a%dq[l + %d]);\n"
                        "%*s  %s s = 0;\n%*s  #pragma omp simd reduction(+:s)\n"
                        "%*s  for (int l = 0; l < %d; l++) s += a%dq[l];\n%*s  a%d += s;\n%*s}\n",
                 ind, "", ind, "", ind, "", w, ind, "", acc, acc, acc, w, acc, 2 * w, acc, 3 * w, ind, "",
                 tcc_cpu_ctype(q->dtype), ind, "", ind, "", w, acc, ind, "", acc, ind, "");
}

/* Closes the reduction loops 0..last that open_red_loop opened for a
 * group (and the sum block around the innermost, when blocked), folding
 * each float-run partial into its accumulator after the innermost loop:
 * a scalar a<acc>p, or (cb > 0, column sums) an array of cb. With lanes
 * (sum_lanes), the chunk loop closes too, and the lanes are folded after
 * each block, or (lanes_per_row) once after the whole innermost loop. */
static void close_red_loops(kernel_emit *ke, const tcc_vx *const *group, int ng, const int *acc, int last,
                            int blocked, int cb, int lanes, int lanes_per_row, int *ind) {
  tcc_buf *b = ke->b;
  for (int r = last; r >= 0; r--) {
    *ind -= 2;
    tcc_buf_printf(b, "%*s}\n", *ind, "");
    if (r == last && lanes) {
      *ind -= 2;
      tcc_buf_printf(b, "%*s}\n", *ind, "");
      if (!lanes_per_row)
        for (int g = 0; g < ng; g++) fold_lanes(ke, group[g], acc[g], lanes, *ind);
    }
    if (r == last && !lanes)
      for (int g = 0; g < ng; g++) {
        if (!float_partial(group[g])) continue;
        if (cb) tcc_buf_printf(b, "%*sfor (int q = 0; q < %d; q++) a%d[q] += a%dp[q];\n", *ind, "", cb, acc[g], acc[g]);
        else tcc_buf_printf(b, "%*sa%d += a%dp;\n", *ind, "", acc[g], acc[g]);
      }
    if (r == last && blocked) {
      *ind -= 2;
      tcc_buf_printf(b, "%*s}\n", *ind, "");
    }
    if (r == last && lanes_per_row)
      for (int g = 0; g < ng; g++) fold_lanes(ke, group[g], acc[g], lanes, *ind);
  }
}

/* A staged row (schedule.c, plan_staged_row): reduction r's argument
 * stored where the element loop stores, one SIMD loop before r's. */
static int emit_staging_loop(kernel_emit *ke, const tcc_vx *r, int indent) {
  const tcc_store *st = &ke->k->stores[0];
  const int v = r->buf;
  tcc_buf_printf(ke->b, "%*s#pragma omp simd reduction(|:bad)\n", indent, "");
  int ind = indent;
  open_red_loop(ke, v, "", r->idx[0]->c, 0, &ind);
  if (v < ke->nvars) ke->bound[v] = 1;
  int mark = ke->nscoped;
  ke->staging = 1;
  int rc = emit_node(ke, r->a, ind);
  ke->staging = 0;
  if (rc) return -1;
  char t[96];
  operand_text(ke, r->a, t, sizeof t);
  tcc_buf_printf(ke->b, "%*sb%d[", ind, "", st->buf);
  put_index(ke, st->buf, ke->ks->staged_idx);
  tcc_buf_printf(ke->b, "] = %s;\n", t);
  drop_scoped(ke, mark);
  if (v < ke->nvars) ke->bound[v] = 0;
  tcc_buf_printf(ke->b, "%*s}\n", indent, "");
  return 0;
}

static int emit_reduce_group(kernel_emit *ke, const tcc_vx *const *group, int ng, int indent) {
  tcc_buf *b = ke->b;
  const tcc_vx *r0 = group[0];
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return -1;
  }
  for (int g = 0; g < ng; g++)
    if (emit_hoistable(ke, group[g]->a, &seen, indent)) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
  tcc_ptrmap_free(&seen);
  for (int g = 0; g < ng; g++)
    if (group[g] == ke->ks->staged_red && ke->walking && emit_staging_loop(ke, group[g], indent)) return -1;
  int acc[64], simd = 1;
  for (int g = 0; g < ng; g++) {
    const tcc_vx *r = group[g];
    acc[g] = ke->naccs++;
    const char *init = red_init(r);
    if (!strcmp(init, "tcc_lowest") || !strcmp(init, "tcc_highest"))
      init = tcc_c_int_limit(r->dtype, !strcmp(init, "tcc_highest"));
    if (r->i == TCC_RED_ARGMAX || r->i == TCC_RED_ARGMIN) {
      const char *vt = tcc_cpu_ctype(r->a->dtype);
      int fl = tcc_dtype_is_float(r->a->dtype);
      tcc_buf_printf(b, "%*s%s a%dv = %s; int64_t a%d = 0;\n", indent, "", vt, acc[g],
                     fl ? (r->i == TCC_RED_ARGMAX ? "-INFINITY" : "INFINITY")
                        : tcc_c_int_limit(r->a->dtype, r->i == TCC_RED_ARGMIN),
                     acc[g]);
      simd = 0;
    } else {
      tcc_buf_printf(b, "%*s%s a%d = %s;\n", indent, "", acc_ctype(r), acc[g], init);
      if ((r->i == TCC_RED_MAX || r->i == TCC_RED_MIN) && tcc_dtype_is_float(r->dtype))
        tcc_buf_printf(b, "%*sint a%dn = 0;\n", indent, "", acc[g]);
    }
  }
  int ind = indent;
  int64_t total = 1;
  for (int r = 0; r < r0->nidx; r++) total *= r0->idx[r]->c;
  /* float32 sums: a float partial sum per run of the innermost loop (in
   * blocks of TCC_SUM_BLOCK when it is longer; static programs only, as
   * dynamic ones make no size-dependent choices), added into the double
   * accumulator after it (acc_ctype) */
  int partials = 0;
  for (int g = 0; g < ng; g++) partials |= float_partial(group[g]);
  const int merged = merged_group(ke, group, ng);
  const int last = r0->nidx - 1 - merged;          /* the innermost loop */
  int64_t n_last = last >= 0 ? r0->idx[last]->c : 1;
  if (merged) n_last *= r0->idx[last + 1]->c;
  const int v_last = r0->buf + last + merged;      /* a merged loop's var: i<v_last>m */
  const char *sfx = merged ? "m" : "";
  int blocked = partials && last >= 0 && n_last > TCC_SUM_BLOCK && !ke->p->graph->nsyms;
  const int lanes = sum_lanes(ke, group, ng, simd && total > 1, merged, last, n_last);
  /* float32 lanes each sum n_last / lanes elements in float: across the
   * blocks, folded once, while that is at most a block's length */
  const int lanes_per_row = lanes && (!blocked || n_last / lanes <= TCC_SUM_BLOCK);
  const int prefetch = r0 == ke->ks->prefetch_red && ke->walking && !merged && last == 0;
  const int store_prefetch = r0 == ke->ks->store_prefetch_red && ke->walking && !merged && last == 0;
  if ((prefetch || store_prefetch) && !blocked) {
    char n[24];
    snprintf(n, sizeof n, "%" PRId64, n_last);
    if (prefetch) put_row_prefetch(ke, "0", n, v_last, ind);
    if (store_prefetch) put_prefetches(ke, ke->ks->store_prefetch, ke->ks->nstore_prefetch, 1, "0", n, v_last, ind);
  }
  for (int r = 0; r <= last; r++) {
    if (r == last && lanes_per_row)
      for (int g = 0; g < ng; g++) put_lanes(ke, group[g], acc[g], lanes, ind);
    if (r == last && blocked) {
      open_sum_block(ke, v_last, sfx, n_last, &ind);
      char lo[24], hi[24];
      snprintf(lo, sizeof lo, "i%db", v_last);
      snprintf(hi, sizeof hi, "i%de", v_last);
      if (prefetch) put_row_prefetch(ke, lo, hi, v_last, ind);
      if (store_prefetch) put_prefetches(ke, ke->ks->store_prefetch, ke->ks->nstore_prefetch, 1, lo, hi, v_last, ind);
    }
    if (r == last)
      for (int g = 0; g < ng; g++) {
        if (lanes && !lanes_per_row) put_lanes(ke, group[g], acc[g], lanes, ind);
        else if (!lanes && float_partial(group[g])) tcc_buf_printf(b, "%*sfloat a%dp = 0;\n", ind, "", acc[g]);
      }
    if (r == last && lanes) { /* chunks of `lanes` elements, each lane its own accumulator */
      if (blocked)
        tcc_buf_printf(b, "%*sfor (int64_t i%do = i%db; i%do < i%de; i%do += %d) {\n", ind, "", v_last, v_last,
                       v_last, v_last, v_last, lanes);
      else
        tcc_buf_printf(b, "%*sfor (int64_t i%do = 0; i%do < %" PRId64 "; i%do += %d) {\n", ind, "", v_last,
                       v_last, n_last, v_last, lanes);
      ind += 2;
      tcc_buf_printf(b, "%*s#pragma GCC ivdep\n"
                        "%*sfor (int64_t i%dl = 0; i%dl < %d; i%dl++) {\n"
                        "%*s  const int64_t i%d = i%do + i%dl;\n",
                     ind, "", ind, "", v_last, v_last, lanes, v_last, ind, "", v_last, v_last, v_last);
      ind += 2;
      continue;
    }
    if (ke->in_simd_element) tcc_buf_printf(b, "%*s#pragma GCC unroll %d\n", ind, "", TCC_CPU_WINDOW);
    else if (r == last && simd && total > 1) {
      tcc_buf_printf(b, "%*s#pragma omp simd reduction(|:bad)", ind, "");
      if (ke->ks->simdlen) tcc_buf_printf(b, " simdlen(%d)", ke->ks->simdlen);
      for (int g = 0; g < ng; g++) {
        const tcc_vx *q = group[g];
        const char *op = q->i == TCC_RED_SUM ? "+" : q->i == TCC_RED_PROD ? "*"
                       : q->i == TCC_RED_MAX ? "max" : "min";
        tcc_buf_printf(b, " reduction(%s:a%d%s)", op, acc[g], float_partial(q) ? "p" : "");
        if ((q->i == TCC_RED_MAX || q->i == TCC_RED_MIN) && tcc_dtype_is_float(q->dtype))
          tcc_buf_printf(b, " reduction(|:a%dn)", acc[g]);
      }
      tcc_buf_puts(b, "\n");
    }
    if (r == last) open_red_loop(ke, v_last, sfx, n_last, blocked, &ind);
    else open_red_loop(ke, r0->buf + r, "", r0->idx[r]->c, 0, &ind);
  }
  if (merged) {
    int64_t n = r0->idx[last + 1]->c;
    tcc_buf_printf(b, "%*sconst int64_t i%d = i%dm / %" PRId64 ", i%d = i%dm %% %" PRId64 ";\n", ind, "",
                   v_last - 1, v_last, n, v_last, v_last, n);
    ke->nmerge = ng;
    ke->merge_name = v_last;
    ke->merge_n = n;
    for (int g = 0; g < ng; g++) {
      ke->merge_inner[g] = group[g]->buf + last + 1;
      ke->merge_outer[g] = ke->merge_inner[g] - 1;
    }
  }
  bind_red_vars(ke, group, ng, ind, 1);
  int mark = ke->nscoped;
  for (int g = 0; g < ng; g++) {
    const tcc_vx *q = group[g];
    if (emit_node(ke, q->a, ind)) return -1;
    char t[96];
    operand_text(ke, q->a, t, sizeof t);
    int a = acc[g];
    if (q == ke->ks->kept_red && ke->walking) {
      /* the summand where the element loop stores (it loads it back) */
      const tcc_store *st = &ke->k->stores[0];
      tcc_buf_printf(b, "%*sb%d[", ind, "", st->buf);
      put_index(ke, st->buf, ke->ks->kept_idx);
      tcc_buf_printf(b, "] = %s;\n", t);
    }
    switch ((tcc_reduce_kind)q->i) {
    case TCC_RED_SUM:
      if (q->dtype == TCC__V1__DTYPE__BOOL) tcc_buf_printf(b, "%*sa%d |= %s;\n", ind, "", a, t);
      else if (lanes) tcc_buf_printf(b, "%*sa%dq[i%dl] += %s;\n", ind, "", a, v_last, t);
      else if (float_partial(q)) tcc_buf_printf(b, "%*sa%dp += %s;\n", ind, "", a, t);
      else if (tcc_dtype_is_float(q->dtype)) tcc_buf_printf(b, "%*sa%d += %s;\n", ind, "", a, t);
      else tcc_buf_printf(b, "%*sa%d = (%s)((%s)a%d + (%s)%s);\n", ind, "", a, tcc_cpu_ctype(q->dtype), tcc_utype(q->dtype), a, tcc_utype(q->dtype), t);
      break;
    case TCC_RED_PROD:
      if (tcc_dtype_is_float(q->dtype)) tcc_buf_printf(b, "%*sa%d *= %s;\n", ind, "", a, t);
      else tcc_buf_printf(b, "%*sa%d = (%s)((%s)a%d * (%s)%s);\n", ind, "", a, tcc_cpu_ctype(q->dtype), tcc_utype(q->dtype), a, tcc_utype(q->dtype), t);
      break;
    case TCC_RED_MAX:
    case TCC_RED_MIN: {
      const char *cmp = q->i == TCC_RED_MAX ? ">" : "<";
      tcc_buf_printf(b, "%*sa%d = %s %s a%d ? %s : a%d;\n", ind, "", a, t, cmp, a, t, a);
      if (q->dtype == TCC__V1__DTYPE__FLOAT32 || q->dtype == TCC__V1__DTYPE__FLOAT64)
        tcc_buf_printf(b, "%*sa%dn |= tcc_nan_bit%s(%s);\n", ind, "", a, q->dtype == TCC__V1__DTYPE__FLOAT64 ? "64" : "32", t);
      else if (tcc_dtype_is_float(q->dtype))
        tcc_buf_printf(b, "%*sa%dn |= %s != %s;\n", ind, "", a, t, t);
      break;
    }
    case TCC_RED_ARGMAX:
    case TCC_RED_ARGMIN: {
      /* the first extreme, else the first NaN. In a SIMD element loop
       * (an unrolled window's argmax) branch-free, the NaN tests by
       * integer arithmetic (tcc_nan_bit): with `if (t > v || t != t ...)`
       * gcc kept a max pool's element loop scalar, 9x slower. */
      const char *cmp = q->i == TCC_RED_ARGMAX ? ">" : "<";
      const tcc_dtype vd = q->a->dtype;
      const char *bits = vd == TCC__V1__DTYPE__FLOAT64 ? "64" : vd == TCC__V1__DTYPE__FLOAT32 ? "32" : NULL;
      const int branch = !ke->in_simd_element || (!bits && tcc_dtype_is_float(vd));
      if (branch)
        tcc_buf_printf(b, "%*sif (%s %s a%dv || (%s != %s && a%dv == a%dv)) { a%dv = %s; a%d = ", ind, "",
                       t, cmp, a, t, t, a, a, a, t, a);
      else if (bits)
        tcc_buf_printf(b, "%*s{ const int u = (%s %s a%dv) | (tcc_nan_bit%s(%s) & (tcc_nan_bit%s(a%dv) ^ 1));"
                          " a%dv = u ? %s : a%dv; a%d = u ? ",
                       ind, "", t, cmp, a, bits, t, bits, a, a, t, a, a);
      else
        tcc_buf_printf(b, "%*s{ const int u = %s %s a%dv; a%dv = u ? %s : a%dv; a%d = u ? ", ind, "", t, cmp, a,
                       a, t, a, a);
      for (int r = 0; r < q->nidx; r++) tcc_buf_puts(b, "(");
      tcc_buf_puts(b, "0");
      for (int r = 0; r < q->nidx; r++)
        tcc_buf_printf(b, " * %" PRId64 " + i%d)", q->idx[r]->c, q->buf + r);
      if (branch) tcc_buf_puts(b, "; }\n");
      else tcc_buf_printf(b, " : a%d; }\n", a);
      break;
    }
    }
  }
  drop_scoped(ke, mark);
  ke->nmerge = 0;
  bind_red_vars(ke, group, ng, ind, 0);
  close_red_loops(ke, group, ng, acc, last, blocked, 0, lanes, lanes_per_row, &ind);
  for (int g = 0; g < ng; g++) {
    const tcc_vx *q = group[g];
    int t;
    if (define_temp(ke, q, &t)) return -1;
    if ((q->i == TCC_RED_MAX || q->i == TCC_RED_MIN) && tcc_dtype_is_float(q->dtype))
      tcc_buf_printf(b, "%*sconst %s t%d = a%dn ? (%s)NAN : a%d;\n", indent, "", tcc_cpu_ctype(q->dtype), t,
                     acc[g], tcc_cpu_ctype(q->dtype), acc[g]);
    else
      tcc_buf_printf(b, "%*sconst %s t%d = (%s)a%d;\n", indent, "", tcc_cpu_ctype(q->dtype), t,
                     tcc_cpu_ctype(q->dtype), acc[g]);
  }
  return 0;
}

/* The reductions computed in e's loop: e's group when e leads one
 * (schedule.c, group_reductions) and this is the kernel-level walk, else
 * e alone. */
static int reduce_group(const kernel_emit *ke, const tcc_vx *e, const tcc_vx **group) {
  int ng = 0;
  group[ng++] = e;
  if (!ke->walking || ke->nscoped != 0) return ng;
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  int lead = -1;
  for (int i = 0; i < ks->nnodes && lead < 0; i++)
    if (ks->nodes[i] == e && ks->red_lead[i] == i) lead = i;
  for (int j = 0; lead >= 0 && j < ks->nnodes; j++)
    if (j != lead && ks->red_lead[j] == lead) group[ng++] = ks->nodes[j];
  return ng;
}

/* Is e a float select in a SIMD element loop whose condition does not
 * vary along that loop (a concatenation's "which input", decided per
 * channel)? It prints as bit operations on a mask (tcc_pick32/64): gcc
 * left element loops with several such selects scalar (DenseNet's
 * concatenation + batch norm kernels) while reporting them vectorized. */
static int invariant_select(kernel_emit *ke, const tcc_vx *e) {
  if (e->op != TCC_PRIM_WHERE || !ke->in_simd_element || e->a->op == TCC_PRIM_CONST ||
      (e->dtype != TCC__V1__DTYPE__FLOAT32 && e->dtype != TCC__V1__DTYPE__FLOAT64))
    return 0;
  const tcc_cpu_nest *pl = &ke->ks->nest;
  const tcc_varset *s = tcc_cpu_fv_vx(&ke->fv, e->a);
  int j = pl->nloops - 1;
  if (j < 0 || !s) return 0;
  for (int i = 0; i < s->n; i++)
    for (int d = 0; d < pl->ndims[j]; d++)
      if (s->v[i] == pl->dims[j][d]) return 0;
  return 1;
}

/* Value e as a temporary loaded from the one store's buffer at idx,
 * where an earlier loop of the kernel stored it (a kept summand, a
 * staged row). */
static int load_from_store(kernel_emit *ke, const tcc_vx *e, const tcc_ix *const *idx, int indent) {
  const tcc_store *st = &ke->k->stores[0];
  int t;
  if (define_temp(ke, e, &t)) return -1;
  tcc_buf_printf(ke->b, "%*sconst %s t%d = b%d[", indent, "", tcc_cpu_ctype(e->dtype), t, st->buf);
  put_index(ke, st->buf, idx);
  tcc_buf_puts(ke->b, "];\n");
  return 0;
}

static int emit_node(kernel_emit *ke, const tcc_vx *e, int indent) {
  if (ke->oom) return -1;
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(&ke->temps, e)) return 0;
  if (e->op == TCC_PRIM_REDUCE) {
    const tcc_vx *group[TCC_CPU_MAX_GROUP];
    int ng = reduce_group(ke, e, group);
    return emit_reduce_group(ke, group, ng, indent);
  }
  if (ke->range_var >= 0 && !tcc_ptrmap_get(&ke->range_live, e)) return 0;   /* not needed in this range */
  int decided = range_decides(ke, e);
  if (decided >= 0) {
    int t;
    if (define_temp(ke, e, &t)) return -1;
    tcc_buf_printf(ke->b, "%*sconst uint8_t t%d = %d;\n", indent, "", t, decided);
    return 0;
  }
  int pick = e->op == TCC_PRIM_WHERE ? range_decides(ke, e->a) : -1;
  if (pick >= 0) {
    /* a select on a comparison this range decides: its chosen operand */
    const tcc_vx *x = pick ? e->b : e->c;
    char o[96];
    int t;
    if (emit_node(ke, x, indent) || define_temp(ke, e, &t)) return -1;
    operand_text(ke, x, o, sizeof o);
    tcc_buf_printf(ke->b, "%*sconst %s t%d = %s;\n", indent, "", tcc_cpu_ctype(e->dtype), t, o);
    return 0;
  }
  if (ke->peeling && peel_implies(ke, e)) {
    /* a range check of a peeled clamp's argument: true in the middle range */
    int t;
    if (define_temp(ke, e, &t)) return -1;
    tcc_buf_printf(ke->b, "%*sconst uint8_t t%d = 1;\n", indent, "", t);
    return 0;
  }
  for (int c = 0; c < ke->ks->ncol_vals && !ke->col_prologue; c++)
    if (e == ke->ks->col_vals[c]) {
      /* computed before the loops (emit_column_values) */
      int t;
      if (define_temp(ke, e, &t)) return -1;
      tcc_buf_printf(ke->b, "%*sconst %s t%d = h%d[i%d];\n", indent, "", tcc_cpu_ctype(e->dtype), t, c,
                     ke->ks->nest.nloops - 1);
      return 0;
    }
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_store *st = &ke->k->stores[0];
  if (e == ks->kept_node && ke->walking)         /* a sum's loop stored it there */
    return load_from_store(ke, e, st->idx, indent);
  if (ks->staged_red && ke->walking && !ke->staging &&
      (e == ks->staged_red_node || e == ks->staged_next_node || e == ks->staged_node))
    /* the staging loop stored it there */
    return load_from_store(ke, e, e == ks->staged_red_node ? ks->staged_idx
                                  : e == ks->staged_next_node ? ks->staged_next_idx : st->idx, indent);
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int d = 0; d < e->nidx; d++)
      if (emit_ix_values(ke, e->idx[d], indent)) return -1;
  if (e->a && emit_node(ke, e->a, indent)) return -1;
  if (e->b && emit_node(ke, e->b, indent)) return -1;
  if (e->c && emit_node(ke, e->c, indent)) return -1;
  int t;
  if (define_temp(ke, e, &t)) return -1;
  tcc_buf *b = ke->b;
  tcc_buf_printf(b, "%*sconst %s t%d = ", indent, "", tcc_cpu_ctype(e->dtype), t);
  char x[96] = "", y[96] = "", z[96] = "";
  if (e->a) operand_text(ke, e->a, x, sizeof x);
  if (e->b) operand_text(ke, e->b, y, sizeof y);
  if (e->c) operand_text(ke, e->c, z, sizeof z);
  if (e->op == TCC_PRIM_LOAD) {
    tcc_buf_printf(b, "b%d[", e->buf);
    put_index(ke, e->buf, e->idx);
    tcc_buf_puts(b, "]");
  } else if (e->op == TCC_PRIM_INDEX) {
    put_ix(ke, e->idx[0]);
  } else if (e->op == TCC_PRIM_CAST) {
    put_cast(b, e->a->dtype, e->dtype, x);
  } else if (invariant_select(ke, e)) {
    int wide = e->dtype == TCC__V1__DTYPE__FLOAT64;
    tcc_buf_printf(b, "tcc_pick%s(0u - (uint%s_t)%s, %s, %s)", wide ? "64" : "32", wide ? "64" : "32", x, y, z);
  } else if (window_position_division(e)) {
    tcc_buf_printf(b, "(%s)((int32_t)%s %s (int32_t)%s)", tcc_cpu_ctype(e->dtype), x,
                   e->op == TCC_PRIM_FLOORDIV ? "/" : "%", y);
  } else if (inline_exp(ke, e)) {
    int le0 = 0;
    for (int i = 0; i < ke->ks->nexp_le0; i++) le0 |= ke->ks->exp_le0[i] == e;
    tcc_buf_printf(b, "%s%s(%s)", ke->ks->inline_exp == TCC_CPU_EXP_MASKED ? "tcc_expf_ftz" : "tcc_expf",
                   le0 ? "_le0" : "", x);
  } else if (e->op == TCC_PRIM_ERF && e->dtype == TCC__V1__DTYPE__FLOAT32 &&
             strcmp(ke->p->graph->target.isa, "x86-64-v4") == 0) {
    tcc_buf_printf(b, "tcc_erff(%s)", x);   /* prelude.c: faster than libmvec's here */
  } else if (e->op == TCC_PRIM_NDTR && e->dtype == TCC__V1__DTYPE__FLOAT32) {
    tcc_buf_printf(b, "tcc_ndtrf(%s)", x);  /* prelude.c: GELU's, as PyTorch's CPU kernel computes it */
  } else {
    tcc_dtype od = e->op == TCC_PRIM_WHERE ? e->b->dtype : e->a ? e->a->dtype : e->dtype;
    tcc_c_put_prim(D, b, e->op, e->dtype, od, x, y, z);
  }
  tcc_buf_puts(b, ";\n");
  return 0;
}


/* Declares the kernel's buffer pointers, in buffer order. */
static void declare_buffers(kernel_emit *ke, const int *bufs, int nb) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_buf *b = ke->b;
  for (int u = 0; u < nb; u++) {
    int bi = bufs[u], written = 0;
    for (int s = 0; s < k->nstores; s++)
      if (k->stores[s].buf == bi) written = 1;
    const tcc_buffer *B = &p->bufs[bi];
    const char *t = tcc_cpu_ctype(B->layout.dtype);
    switch (B->kind) {
    case TCC_BUF_INPUT:   /* written: index_put_ into the caller's tensor */
      tcc_buf_printf(b, "  %s%s *restrict b%d = (%s *)in[%d];\n", written ? "" : "const ", t, bi, t, B->pos);
      break;
    case TCC_BUF_CONST:
      tcc_buf_printf(b, "  const %s *restrict b%d = b%d_data;\n", t, bi, B->value >= 0 ? bi : bi);
      break;
    case TCC_BUF_OUTPUT:
      tcc_buf_printf(b, "  %s%s *restrict b%d = (%s *)out[%d];\n", written ? "" : "const ", t, bi,
                     t, B->pos);
      break;
    case TCC_BUF_TEMP:
      tcc_buf_printf(b, "  %s%s *restrict b%d = (%s *)(ws + %" PRId64 ");\n", written ? "" : "const ",
                     t, bi, t, B->ws_offset);
      break;
    }
  }
}




/* The parallel-for pragma of a kernel's parallel loop; a tuning config
 * may have added a chunk size and a thread count. */
static void put_parallel_pragma(tcc_buf *b, int indent, const tcc_cpu_kernel_schedule *ks) {
  if (!ks->tuned) {
    tcc_buf_printf(b, "%*s#pragma omp parallel for schedule(static) reduction(|:bad)\n", indent, "");
    return;
  }
  tcc_buf_printf(b, "%*s#pragma omp parallel for schedule(static", indent, "");
  if (ks->chunk > 0) tcc_buf_printf(b, ", %d", ks->chunk);
  tcc_buf_puts(b, ") reduction(|:bad)");
  if (ks->threads > 0) tcc_buf_printf(b, " num_threads(%d)", ks->threads);
  tcc_buf_puts(b, "\n");
}

/* The first line of kernel kno's function. Dynamic programs (symbols,
 * dynamic.c) pass the symbols' values, tcc_S, to every kernel. */
static void put_kernel_head(tcc_buf *b, const tcc_program *p, int kno) {
  if (p->graph->nsyms)
    tcc_buf_printf(b, "static int k%d(const void *const *in, void *const *out, char *ws, "
                      "const int64_t *tcc_S) {\n  (void)tcc_S;\n", kno);
  else
    tcc_buf_printf(b, "static int k%d(const void *const *in, void *const *out, char *ws) {\n", kno);
}

/* Dynamic programs: the kernel's work (kernel_work) as a C expression of
 * its sizes, each printed on its own so that dynamic.c can turn it into
 * a size expression: the parallel loop is chosen at run time. */
static void put_work_expr(tcc_buf *b, const tcc_kernel *k, const tcc_vx *const *nodes, int n) {
  tcc_buf_puts(b, "1.0");
  for (int d = 0; d < k->rank; d++) tcc_buf_printf(b, " * (double)%" PRId64, k->sizes[d]);
  tcc_buf_puts(b, " * (1.0");
  for (int i = 0; i < n; i++)
    if (nodes[i]->op == TCC_PRIM_REDUCE) {
      tcc_buf_puts(b, " + 1.0");
      for (int r = 0; r < nodes[i]->nidx; r++)
        tcc_buf_printf(b, " * (double)%" PRId64, nodes[i]->idx[r]->c);
    }
  tcc_buf_puts(b, ")");
}

/* Element strides of buffer `buf` for a oneDNN step: its layout's, with
 * a dim of size 1 given the stride past the whole buffer (any stride
 * addresses it; oneDNN wants one that does not overlap the others). */
static void put_dnnl_strides(tcc_buf *b, const tcc_meta *L) {
  int64_t past = 1;
  for (int d = 0; d < L->rank; d++)
    if (L->sizes[d] > 1 && L->strides[d] * L->sizes[d] > past) past = L->strides[d] * L->sizes[d];
  tcc_buf_puts(b, "{");
  for (int d = 0; d < L->rank; d++)
    tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", L->sizes[d] == 1 ? past : L->strides[d]);
  tcc_buf_puts(b, "}");
}

/* A oneDNN convolution step (TCC_EXT_CONV_*): a static tcc_dnnl_conv
 * with its geometry and the operands' strides, run by the embedded
 * runtime (runtime/onednn_conv.c), which makes the primitive on the
 * first call. */
static int emit_conv_extern(kernel_emit *ke, int kno) {
  static const char *const what[] = {[TCC_EXT_CONV_FWD] = "forward",
      [TCC_EXT_CONV_BWD_DATA] = "backward data", [TCC_EXT_CONV_BWD_WEIGHTS] = "backward weights"};
  const tcc_program *p = ke->p;
  tcc_buf *b = ke->b;
  const tcc_store *st = &ke->k->stores[0];
  const tcc_vx *call = st->value, *A = call->a, *B = call->b;
  tcc_buf_printf(b, "\n/* k%d: extern convolution %s (oneDNN) */\n", kno, what[call->i]);
  tcc_buf_printf(b, "static tcc_dnnl_conv k%d_conv = {.kind = %d, .prm = {", kno,
                 (int)(call->i - TCC_EXT_CONV_FWD));
  for (int i = 0; i < call->nidx; i++) tcc_buf_printf(b, "%s%" PRId64, i ? ", " : "", call->idx[i]->c);
  tcc_buf_puts(b, "},\n  .sa = ");
  put_dnnl_strides(b, &p->bufs[A->buf].layout);
  tcc_buf_puts(b, ", .sb = ");
  put_dnnl_strides(b, &p->bufs[B->buf].layout);
  tcc_buf_puts(b, ",\n  .sc = ");
  put_dnnl_strides(b, &p->bufs[st->buf].layout);
  tcc_buf_puts(b, ", .lock = PTHREAD_MUTEX_INITIALIZER};\n");
  put_kernel_head(b, p, kno);
  tcc_buf_puts(b, "  (void)in; (void)out; (void)ws;\n");
  declare_buffers(ke, ke->ks->used, ke->ks->nused);
  tcc_buf_printf(b, "  return tcc_dnnl_conv_run(&k%d_conv, b%d + %" PRId64 ", b%d + %" PRId64 ", b%d);\n}\n",
                 kno, A->buf, p->bufs[A->buf].layout.offset, B->buf, p->bufs[B->buf].layout.offset,
                 st->buf);
  return 0;
}

/* The embedding backward's scatter-add (TCC_EXT_INDEX_ADD_ROWS):
 * out[ix[t], d] += a[t, d]. The threads zero the output in contiguous
 * runs of rows (a [V, D] table is most of the step's memory traffic),
 * then split the columns into blocks of
 * ROWADD_BLOCK and each walks every token in order over its block, so
 * no two threads write one element and each sum runs in token order
 * whatever the thread count (eager's index_add order); rows equal to
 * pad (when it is >= 0; -1 is none) are skipped, and an index out of range makes the step return 1
 * (the entry's "index out of range", as a gather's). */
#define ROWADD_BLOCK 64

static int emit_index_add_rows(kernel_emit *ke, int kno) {
  const tcc_program *p = ke->p;
  tcc_buf *b = ke->b;
  const tcc_store *st = &ke->k->stores[0];
  const tcc_vx *call = st->value, *A = call->a, *B = call->b;
  int64_t nv = call->idx[0]->c, nd = call->idx[1]->c, nt = call->idx[2]->c, pad = call->idx[3]->c;
  const char *t = tcc_cpu_ctype(call->dtype);
  int64_t blocks = (nd + ROWADD_BLOCK - 1) / ROWADD_BLOCK;
  tcc_buf_printf(b, "\n/* k%d: extern row index-add [%" PRId64 " tokens x %" PRId64 "] into %" PRId64
                    " rows */\n", kno, nt, nd, nv);
  put_kernel_head(b, p, kno);
  tcc_buf_puts(b, "  (void)in; (void)out; (void)ws;\n");
  declare_buffers(ke, ke->ks->used, ke->ks->nused);
  tcc_buf_printf(b, "  %s *restrict o = b%d + %" PRId64 ";\n", t, st->buf, p->bufs[st->buf].layout.offset);
  tcc_buf_printf(b, "  const %s *restrict g = b%d + %" PRId64 ";\n", t, A->buf, p->bufs[A->buf].layout.offset);
  tcc_buf_printf(b, "  const int64_t *restrict ix = b%d + %" PRId64 ";\n", B->buf, p->bufs[B->buf].layout.offset);
  tcc_buf_printf(b, "  int bad = 0;\n"
                    "  #pragma omp parallel if(%d)\n"
                    "  {\n"
                    "  #pragma omp for schedule(static)\n"
                    "  for (int64_t v0 = 0; v0 < %" PRId64 "; v0 += 256)\n"
                    "    memset(o + v0 * %" PRId64 ", 0, sizeof *o * %" PRId64 " * (size_t)(v0 + 256 < %" PRId64
                    " ? 256 : %" PRId64 " - v0));\n"
                    "  #pragma omp for schedule(static) reduction(|:bad)\n"
                    "  for (int64_t cb = 0; cb < %" PRId64 "; cb++) {\n"
                    "    const int64_t d0 = cb * %d, d1 = d0 + %d < %" PRId64 " ? d0 + %d : %" PRId64 ";\n"
                    "    for (int64_t t = 0; t < %" PRId64 "; t++) {\n"
                    "      const int64_t v = ix[t];\n"
                    "      if (v == %" PRId64 " && %d) continue;\n"
                    "      if (v < 0 || v >= %" PRId64 ") {\n"
                    "        bad = 1;\n"
                    "        continue;\n"
                    "      }\n"
                    "      %s *restrict row = o + v * %" PRId64 ";\n"
                    "      const %s *restrict src = g + t * %" PRId64 ";\n"
                    "      #pragma omp simd\n"
                    "      for (int64_t d = d0; d < d1; d++) row[d] += src[d];\n"
                    "    }\n  }\n  }\n  return bad;\n}\n",
                 blocks > 1 && nv * nd >= (INT64_C(1) << 15), nv, nd, nd, nv, nv, blocks, ROWADD_BLOCK,
                 ROWADD_BLOCK, nd, ROWADD_BLOCK, nd, nt, pad, pad >= 0, nv, t, nd, t, nd);
  return 0;
}

/* The start of a GEMM body that shares its chunks with the helper
 * thread (share.c): on the calling thread, with the helper held, the
 * job runs there; the body goes on (under the #if) for a chunk's call,
 * rq set. */
static void put_share_entry(tcc_buf *b, int64_t chunks, int64_t tile, int sums) {
  tcc_buf_printf(b, "#if defined(TCC_SELF) && defined(TCC_SHARE)\n"
                    "  const tcc_share_rq *rq = tcc_share_rq_now;\n"
                    "  if (!rq && tcc_share_mine) {\n"
                    "    const int r = tcc_share_run(TCC_SELF, P, TCC_NP, %" PRId64 ", %" PRId64 ", %d);\n"
                    "    if (r >= 0) return r;\n"
                    "  }\n",
                 chunks, tile, sums);
}

/* A float32 GEMM step through oneDNN's dnnl_sgemm (row-major, the
 * cblas_sgemm convention): its JIT kernels are chosen by the ISA features
 * the CPU reports (AVX2, AVX-512, AMX), never by its model name, and it
 * runs on the process's OpenMP threads with its own partitioning (a
 * one-row GEMM is a GEMV that reads each weight once). A batch of at least
 * TCC_GEMM_PARALLEL_FLOPS (or a `par` tuning config) runs its GEMMs in
 * parallel, each then on one thread; a `serial` config pins one thread.
 * Returns 1 from tcc_entry when oneDNN refuses (nothing is written). */
static int emit_dnnl_gemm(kernel_emit *ke) {
  const tcc_store *st = &ke->k->stores[0];
  const tcc_vx *call = st->value, *A = call->a, *B = call->b;
  tcc_buf *b = ke->b;
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  const int *trans = g->trans;
  const int64_t *ld = g->ld;
  const int batch_par = g->batch_par, serial = g->serial;
  tcc_buf_puts(b, "  int bad = 0;\n");
  if (g->share_rows) {
    /* on a busy machine, blocks of C are chunks the helper may take */
    const int64_t mb = g->share_rows, nb = g->share_cols, rb = (M + mb - 1) / mb, cb = (N + nb - 1) / nb;
    put_share_entry(b, Bt * rb * cb, mb * nb, 0);
    tcc_buf_printf(b, "  if (rq) {   /* chunk c: GEMM ib's rows from m0 and columns from n0, into the tile */\n"
                      "    const int64_t ib = rq->c / %" PRId64 ", m0 = rq->c %% %" PRId64 " * %" PRId64
                      ", n0 = rq->c / %" PRId64 " %% %" PRId64 " * %" PRId64 ";\n"
                      "    const int64_t mm = %" PRId64 " - m0 < %" PRId64 " ? %" PRId64 " - m0 : %" PRId64
                      ", nn = %" PRId64 " - n0 < %" PRId64 " ? %" PRId64 " - n0 : %" PRId64 ";\n"
                      "    float *const pc = b%d + ib * %" PRId64 " + m0 * %" PRId64 " + n0;\n"
                      "    if (rq->phase == 1) {\n"
                      "      if (!rq->own)\n"
                      "        for (int64_t m = 0; m < mm; m++)\n"
                      "          for (int64_t n = 0; n < nn; n++) pc[m * %" PRId64 " + n] = rq->tile[m * nn + n];\n"
                      "      return 0;\n"
                      "    }\n"
                      "    if (omp_get_max_threads() != 1) omp_set_num_threads(1);   /* the helper's own */\n",
                   rb * cb, rb, mb, rb, cb, nb, M, mb, M, mb, N, nb, N, nb, st->buf, M * N, N, N);
    ke->vname[0] = "ib";
    ke->vname[1] = ke->vname[2] = "0";
    tcc_buf_printf(b, "    const float *pa = b%d + (", A->buf);
    put_index(ke, A->buf, A->idx);
    tcc_buf_printf(b, ") + m0 * %" PRId64 ";\n    const float *pb = b%d + (", trans[0] ? INT64_C(1) : ld[0], B->buf);
    put_index(ke, B->buf, B->idx);
    tcc_buf_printf(b, ") + n0 * %" PRId64 ";\n"
                      "    return dnnl_sgemm('%c', '%c', mm, nn, %" PRId64 ", 1.0f, pa, %" PRId64
                      ", pb, %" PRId64 ", 0.0f, rq->own ? pc : rq->tile, rq->own ? %" PRId64 " : nn) != 0;\n"
                      "  }\n#endif\n",
                   trans[1] ? ld[1] : INT64_C(1), trans[0] ? 'T' : 'N', trans[1] ? 'T' : 'N', K, ld[0], ld[1], N);
  }
  if (serial)
    tcc_buf_puts(b, "  int omp_get_max_threads(void); void omp_set_num_threads(int);\n"
                    "  int saved_threads = omp_get_max_threads();\n  omp_set_num_threads(1);\n");
  if (batch_par) tcc_buf_puts(b, "  #pragma omp parallel for schedule(static) reduction(|:bad)\n");
  tcc_buf_printf(b, "  for (int64_t ib = 0; ib < %" PRId64 "; ib++) {\n", Bt);
  ke->vname[0] = "ib";
  ke->vname[1] = ke->vname[2] = "0";
  tcc_buf_printf(b, "    const float *pa = b%d + (", A->buf);
  put_index(ke, A->buf, A->idx);
  tcc_buf_printf(b, ");\n    const float *pb = b%d + (", B->buf);
  put_index(ke, B->buf, B->idx);
  tcc_buf_printf(b, ");\n    bad |= dnnl_sgemm('%c', '%c', %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, pa, %" PRId64
                    ", pb, %" PRId64 ", 0.0f, b%d + ib * %" PRId64 ", %" PRId64 ") != 0;\n  }\n",
                 trans[0] ? 'T' : 'N', trans[1] ? 'T' : 'N', M, N, K, ld[0], ld[1], st->buf, M * N, N);
  if (serial) tcc_buf_puts(b, "  omp_set_num_threads(saved_threads);\n");
  tcc_buf_puts(b, "  return bad;\n}\n");
  return 0;
}

/* The operand pointers pa, pb and pc of a generated GEMM kernel
 * (emit_stream_gemm, emit_split_k_gemm), the batch index 0, and its
 * vector type of `width` floats. */
static void put_gemm_operands(kernel_emit *ke, int width) {
  const tcc_store *st = &ke->k->stores[0];
  const tcc_vx *call = st->value;
  tcc_buf *b = ke->b;
  ke->vname[0] = ke->vname[1] = ke->vname[2] = "0";
  tcc_buf_printf(b, "  const float *restrict pa = b%d + (", call->a->buf);
  put_index(ke, call->a->buf, call->a->idx);
  tcc_buf_printf(b, ");\n  const float *restrict pb = b%d + (", call->b->buf);
  put_index(ke, call->b->buf, call->b->idx);
  tcc_buf_printf(b, ");\n  float *restrict pc = b%d;\n"
                    "  typedef float vec __attribute__((vector_size(%d), aligned(4)));\n"
                    "  typedef float vec8 __attribute__((vector_size(32)));\n"
                    "  typedef float vec4 __attribute__((vector_size(16)));\n",
                 st->buf, width * 4);
}

/* Declares `float s` at indent ind: the sum of vec v's `width` lanes (16
 * or 8) as a tree, halving the vector each step, so each accumulator
 * costs a few shuffles and adds rather than width - 1 dependent scalar
 * adds after as many lane extractions. */
static void put_vec_sum(tcc_buf *b, int ind, const char *v, int width) {
  if (width == 16)
    tcc_buf_printf(b, "%*sconst vec8 h_ = __builtin_shufflevector(%s, %s, 0, 1, 2, 3, 4, 5, 6, 7) +\n"
                      "%*s                 __builtin_shufflevector(%s, %s, 8, 9, 10, 11, 12, 13, 14, 15);\n",
                   ind, "", v, v, ind, "", v, v);
  else
    tcc_buf_printf(b, "%*sconst vec8 h_ = %s;\n", ind, "", v);
  tcc_buf_printf(b, "%*sconst vec4 q_ = __builtin_shufflevector(h_, h_, 0, 1, 2, 3) + __builtin_shufflevector(h_, h_, 4, 5, 6, 7);\n"
                    "%*sfloat s = (q_[0] + q_[2]) + (q_[1] + q_[3]);\n",
                 ind, "", ind, "");
}

/* A float32 GEMM of few rows against a weight stored [N, K]
 * (plan_stream_rows): each block of stream_rows weight rows is read once,
 * in vectors along k, and dotted with every row of A, whose rows stay in
 * cache; the block prefetches the next block's rows at the same k, so
 * the memory keeps streaming while the FMAs run, into L2 (prefetcht2;
 * locality 1). Non-temporal (prefetchnta, codegen 66-68) puts the lines
 * in L1 alone on an Intel Xeon with AVX-512 and AMX, where the next
 * block's lines are evicted before the loop reaches them: the GEMMs
 * read the weights 3x slower there (scripts/bench-gemm --cold-weights),
 * though on the Zen 5 VM it had made BERT-base's step 10% faster
 * (docs/design.md); into L1 with prefetcht0 the loop read 1.04-1.4x
 * slower on Zen 4. Accumulators are stream_rows x M vectors, summed
 * across lanes at the end; k's tail past the last whole vector is
 * scalar. Where A's rows would not stay in L1
 * (stream_kc), each group of blocks runs k in chunks, adding each
 * chunk's dots into C, so that the chunk of A is read from L1. Returns
 * 0. */
static int emit_stream_gemm(kernel_emit *ke) {
  const tcc_vx *call = ke->k->stores[0].value;
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  tcc_buf *b = ke->b;
  int64_t M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  int R = g->stream_rows, W = g->stream_width;
  const int G = TCC_CPU_STREAM_GROUP;
  int64_t lda = g->ld[0], ldb = g->ld[1], blocks = (N + R - 1) / R, kc = g->stream_kc;
  const int64_t groups = (blocks + G - 1) / G, cw = (int64_t)G * R; /* a group's columns of C */
  put_gemm_operands(ke, W);
  /* a group of blocks is a chunk the helper thread may take (share.c):
   * in a chunk's call it is computed into the tile (C's rows, cw
   * columns apart), or the tile stored */
  if (g->stream_par) {
    put_share_entry(b, groups, M * cw, 0);
    tcc_buf_printf(b, "  if (rq && rq->phase == 1) {\n"
                      "    const int64_t n0 = rq->c * %" PRId64 ", nn = %" PRId64 " - n0 < %" PRId64 " ? %" PRId64 " - n0 : %" PRId64 ";\n"
                      "    for (int m = 0; m < %" PRId64 "; m++)\n"
                      "      for (int64_t n = 0; n < nn; n++) pc[m * %" PRId64 " + n0 + n] = rq->tile[m * %" PRId64 " + n];\n"
                      "    return 0;\n"
                      "  }\n"
                      "  float *const tl = rq ? rq->tile : 0;\n"
                      "  const int64_t g0 = rq ? rq->c : 0, g1 = rq ? rq->c + 1 : %" PRId64 ";\n"
                      "#else\n",
                   cw, N, cw, N, cw, M, N, cw, groups);
  }
  tcc_buf_printf(b, "  float *const tl = 0;\n"
                    "  const int64_t g0 = 0, g1 = %" PRId64 ";\n", groups);
  if (g->stream_par) tcc_buf_puts(b, "#endif\n");
  tcc_buf_printf(b, "  #pragma omp parallel for schedule(static) if(%d && !tl)\n"
                    "  for (int64_t grp = g0; grp < g1; grp++)\n", g->stream_par);
  if (kc)
    tcc_buf_printf(b, "  for (int64_t k0 = 0; k0 < %" PRId64 "; k0 += %" PRId64 ")\n"
                      "  for (int64_t blk = grp * %d; blk < grp * %d + %d && blk < %" PRId64 "; blk++) {\n"
                      "    const int64_t kend = k0 + %" PRId64 " < %" PRId64 " ? k0 + %" PRId64 " : %" PRId64 ";\n",
                   K, kc, G, G, G, blocks, kc, K, kc, K);
  else
    tcc_buf_printf(b, "  for (int64_t blk = grp * %d; blk < grp * %d + %d && blk < %" PRId64 "; blk++) {\n"
                      "    const int64_t k0 = 0, kend = %" PRId64 ";\n",
                   G, G, G, blocks, K);
  /* `a` is pinned to a register: else gcc reads it from memory once per
   * weight row (R loads of A per vector of k, not 1) */
  tcc_buf_printf(b, "    const int64_t n0 = blk * %d;\n"
                    "    const int nr = %" PRId64 " - n0 < %d ? (int)(%" PRId64 " - n0) : %d;\n"
                    "    const float *w = pb + n0 * %" PRId64 ";\n"
                    "    const float *pf = pb + (n0 + %d < %" PRId64 " ? n0 + %d : n0) * %" PRId64 ";\n"
                    "    vec acc[%d][%" PRId64 "];\n"
                    "    for (int j = 0; j < %d; j++)\n"
                    "      for (int m = 0; m < %" PRId64 "; m++) acc[j][m] = (vec){0};\n"
                    "    int64_t k = k0;\n"
                    "    for (; k + %d <= kend; k += %d) {\n"
                    "      vec x[%d];\n"
                    "      for (int j = 0; j < %d; j++) {\n"
                    "        x[j] = *(const vec *)(w + (j < nr ? j : 0) * %" PRId64 " + k);\n"
                    "        if (%d || (k & 15) == 0) __builtin_prefetch(pf + j * %" PRId64 " + k, 0, 1);\n"
                    "      }\n"
                    "      for (int m = 0; m < %" PRId64 "; m++) {\n"
                    "        vec a = *(const vec *)(pa + m * %" PRId64 " + k);\n"
                    "        __asm__(\"\" : \"+v\"(a));\n"
                    "        for (int j = 0; j < %d; j++) acc[j][m] += a * x[j];\n"
                    "      }\n"
                    "    }\n"
                    "    for (int j = 0; j < nr; j++)\n"
                    "      for (int m = 0; m < %" PRId64 "; m++) {\n",
                 R, N, R, N, R, ldb, R, N, R, ldb, R, M, R, M, W, W, R, R, ldb, W == 16, ldb, M, lda, R, M);
  put_vec_sum(b, 8, "acc[j][m]", W);
  tcc_buf_printf(b, "        for (int64_t t = k; t < kend; t++) s += pa[m * %" PRId64 " + t] * w[j * %" PRId64 " + t];\n"
                    "        float *c = tl ? &tl[m * %" PRId64 " + n0 - grp * %" PRId64 " + j] : &pc[m * %" PRId64 " + n0 + j];\n"
                    "        *c = k0 ? *c + s : s;\n"
                    "      }\n"
                    "  }\n  return 0;\n}\n",
                 lda, ldb, cw, cw, N);
  return 0;
}

/* The last step of a split-K GEMM (emit_split_k_gemm,
 * emit_split_k_tiled_gemm): inside the region, where `when` holds, each
 * of the U threads adds the partial rows parts[0..U) over its share of
 * C's M x N columns into pc. */
static void put_partial_sum(tcc_buf *b, const char *when, int64_t M, int64_t N) {
  tcc_buf_printf(b, "    if (%s) {\n"
                    "      const int64_t n0 = %" PRId64 " * t / U, n1 = %" PRId64 " * (t + 1) / U;\n"
                    "      for (int m = 0; m < %" PRId64 "; m++)\n"
                    "        for (int64_t n = n0; n < n1; n++) {\n"
                    "          float s = 0;\n"
                    "          for (int u = 0; u < U; u++) s += parts[u][m * %" PRId64 " + n];\n"
                    "          pc[m * %" PRId64 " + n] = s;\n"
                    "        }\n"
                    "    }\n",
                 when, N, N, M, N, N);
}

/* Up to eight float32 rows against a weight stored [K, N]
 * (plan_split_k): each of the U threads (at most 64) adds x[m, k] W[k, :]
 * over its contiguous run of the weight's rows, split_k rows a pass, into
 * partial rows on its own stack, and prefetches the next pass's rows at
 * the same n into L2 as emit_stream_gemm's (on an AMD EPYC with
 * AVX-512 (Zen 4), weights from memory, GPT-2's one-row GEMMs ran
 * 1.1-1.2x faster than with none and eight rows 1.4-1.7x; non-temporal
 * 2.1x slower on an Intel Xeon; into L1 with prefetcht0 slower than
 * none on Zen 4, one two or four passes ahead no faster); after a
 * barrier each adds the partial rows over its share of the columns
 * into C. A second barrier keeps every partial row alive
 * until all are read (libgomp's workers leave the
 * region's function, and free its stack frame, before the region's
 * closing barrier). Returns 0. */
/* The partial rows part[M x N] of x[m, k] W[k, :] over k in [k0, k1)
 * (emit_split_k_gemm), R weight rows a pass, each pass prefetching the
 * next one's lines at the same n. */
static void put_split_k_rows(tcc_buf *b, int64_t M, int64_t N, int R, int W, int64_t lda, int64_t sa, int64_t ldb) {
  tcc_buf_printf(b, "      for (int64_t i = 0; i < %" PRId64 "; i++) part[i] = 0;\n"
                    "      int64_t k = k0;\n"
                    "      for (; k + %d <= k1; k += %d) {\n"
                    "        const float *w = pb + k * %" PRId64 ";\n"
                    "        vec x[%" PRId64 "][%d];\n"
                    "        for (int m = 0; m < %" PRId64 "; m++)\n"
                    "          for (int j = 0; j < %d; j++) x[m][j] = (vec){0} + pa[m * %" PRId64 " + (k + j) * %" PRId64 "];\n"
                    "        int64_t n = 0;\n"
                    "        for (; n + %d <= %" PRId64 "; n += %d) {\n"
                    "          vec wv[%d];\n"
                    "          for (int j = 0; j < %d; j++) {\n"
                    "            wv[j] = *(const vec *)(w + j * %" PRId64 " + n);\n"
                    "            if (%d || (n & 15) == 0) __builtin_prefetch(w + (%d + j) * %" PRId64 " + n, 0, 1);\n"
                    "          }\n"
                    "          for (int m = 0; m < %" PRId64 "; m++) {\n"
                    "            vec s = *(vec *)(part + m * %" PRId64 " + n);\n"
                    "            for (int j = 0; j < %d; j++) s += x[m][j] * wv[j];\n"
                    "            *(vec *)(part + m * %" PRId64 " + n) = s;\n"
                    "          }\n"
                    "        }\n"
                    "        for (; n < %" PRId64 "; n++)\n"
                    "          for (int m = 0; m < %" PRId64 "; m++)\n"
                    "            for (int j = 0; j < %d; j++) part[m * %" PRId64 " + n] += x[m][j][0] * w[j * %" PRId64 " + n];\n"
                    "      }\n"
                    "      for (; k < k1; k++)\n"
                    "        for (int m = 0; m < %" PRId64 "; m++) {\n"
                    "          const float x0 = pa[m * %" PRId64 " + k * %" PRId64 "];\n"
                    "          for (int64_t n = 0; n < %" PRId64 "; n++) part[m * %" PRId64 " + n] += x0 * pb[k * %" PRId64 " + n];\n"
                    "        }\n",
                 M * N, R, R, ldb, M, R, M, R, lda, sa, W, N, W, R, R, ldb, W == 16, R, ldb, M, N, R, N, N,
                 M, R, N, ldb, M, lda, sa, N, N, ldb);
}

/* Up to eight float32 rows against a weight stored [K, N]
 * (plan_split_k): each of the U threads (at most 64) adds x[m, k] W[k, :]
 * over its contiguous run of the weight's rows, split_k rows a pass, into
 * partial rows on its own stack, and prefetches the next pass's rows at
 * the same n into L2 as emit_stream_gemm's (on an AMD EPYC with
 * AVX-512 (Zen 4), weights from memory, GPT-2's one-row GEMMs ran
 * 1.1-1.2x faster than with none and eight rows 1.4-1.7x; non-temporal
 * 2.1x slower on an Intel Xeon; into L1 with prefetcht0 slower than
 * none on Zen 4, one two or four passes ahead no faster); after a
 * barrier each adds the partial rows over its share of the columns
 * into C. A second barrier keeps every partial row alive
 * until all are read (libgomp's workers leave the
 * region's function, and free its stack frame, before the region's
 * closing barrier). With the helper thread (share.c), a chunk is a run
 * of TCC_CPU_SPLIT_K_CHUNK bytes of the weight's rows: its partial rows
 * go into the tile, a committed tile is added into the thread's own
 * sums, and the job's end stores the two threads' sums into C.
 * Returns 0. */
static int emit_split_k_gemm(kernel_emit *ke) {
  const tcc_vx *call = ke->k->stores[0].value;
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  tcc_buf *b = ke->b;
  int64_t M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c, ca[3] = {0, 0, 0}, c0;
  tcc_gemm_operand_affine(ke->p, call->a, ca, &c0);
  int W = g->stream_width, R = g->split_k;
  int64_t lda = ca[1], sa = ca[2], ldb = g->ld[1];
  put_gemm_operands(ke, W);
  /* serial: no region, so that a call from inside another team neither
   * reads that team's size nor waits at its barriers */
  const int par = g->split_k_par;
  const char *barrier = par ? "    #pragma omp barrier\n" : "";
  if (par) {
    int64_t kc = TCC_CPU_SPLIT_K_CHUNK / (4 * N) / R * R;
    if (kc < R) kc = R;
    const int64_t chunks = (K + kc - 1) / kc;
    put_share_entry(b, chunks, M * N, 1);
    tcc_buf_printf(b, "  if (rq && rq->phase == 1) {\n"
                      "    for (int64_t i = 0; i < %" PRId64 "; i++) rq->sum[i] += rq->tile[i];\n"
                      "    return 0;\n"
                      "  }\n"
                      "  if (rq && rq->phase == 2) {\n"
                      "    for (int64_t i = 0; i < %" PRId64 "; i++) pc[i] = rq->sum[i] + rq->sum2[i];\n"
                      "    return 0;\n"
                      "  }\n"
                      "  if (rq) {\n"
                      "    float *const part = rq->tile;\n"
                      "    {\n"
                      "      const int64_t k0 = rq->c * %" PRId64 ", k1 = k0 + %" PRId64 " < %" PRId64 " ? k0 + %" PRId64 " : %" PRId64 ";\n",
                   M * N, M * N, kc, kc, K, kc, K);
    put_split_k_rows(b, M, N, R, W, lda, sa, ldb);
    tcc_buf_puts(b, "    }\n    return 0;\n  }\n#endif\n");
    tcc_buf_puts(b, "  int omp_get_num_threads(void), omp_get_thread_num(void);\n"
                    "  float *parts[64];\n"
                    "  #pragma omp parallel\n"
                    "  {\n"
                    "    const int T = omp_get_num_threads(), U = T < 64 ? T : 64, t = omp_get_thread_num();\n");
  } else
    tcc_buf_puts(b, "  float *parts[1];\n  {\n    const int U = 1, t = 0;\n");
  tcc_buf_printf(b, "    float part[%" PRId64 "] __attribute__((aligned(64)));\n"
                    "    if (t < U) {\n"
                    "      parts[t] = part;\n"
                    "      const int64_t k0 = %" PRId64 " * t / U, k1 = %" PRId64 " * (t + 1) / U;\n",
                 M * N, K, K);
  put_split_k_rows(b, M, N, R, W, lda, sa, ldb);
  tcc_buf_printf(b, "    }\n%s", barrier);
  put_partial_sum(b, "t < U", M, N);
  tcc_buf_printf(b, "%s  }\n  return 0;\n}\n", barrier);
  return 0;
}

/* The passes of a split-K-tiled GEMM (emit_split_k_tiled_gemm) over k
 * in [k0, k1) and C's columns [nlo, nhi), into the partial tile `part`
 * (row stride ldp, C's column nlo at its column 0), variables of the
 * text around it: P rows of W a pass; for each 48 columns, each block of
 * 8 rows of A loads its partial tile (24 vectors; zeros in the first
 * pass), adds the pass's x[m, k] W[k, n:n+48] with the A element
 * broadcast, and stores it back; every block prefetches its share of
 * the next pass's lines at the same columns into L2. Columns past the
 * last 48 are scalar. */
static void put_split_k_tiled_rows(tcc_buf *b, int64_t M, int P, int64_t lda, int64_t sa, int64_t ldb) {
  const int nq = (int)((M + 7) / 8);
  tcc_buf_printf(b, "      for (int64_t kb = k0; kb < k1; kb += %d) {\n"
                    "        const int64_t ke = kb + %d < k1 ? kb + %d : k1;\n"
                    "        int64_t n0 = nlo;\n"
                    "        for (; n0 + 48 <= nhi; n0 += 48)\n"
                    "          for (int64_t m0 = 0; m0 < %" PRId64 "; m0 += 8) {\n"
                    "            const int mr = %" PRId64 " - m0 < 8 ? (int)(%" PRId64 " - m0) : 8;\n"
                    "            const float *ar[8];\n"
                    "            for (int i = 0; i < 8; i++) ar[i] = pa + (m0 + i < %" PRId64 " ? m0 + i : %" PRId64 ") * %" PRId64 ";\n"
                    "            float *const pt = part + m0 * ldp + n0 - nlo;\n"
                    "            vec acc[8][3];\n"
                    "            for (int i = 0; i < 8; i++)\n"
                    "              for (int j = 0; j < 3; j++)\n"
                    "                acc[i][j] = kb == k0 || i >= mr ? (vec){0} : *(const vec *)(pt + i * ldp + j * 16);\n"
                    "            const int q = (int)(m0 / 8);\n"
                    "            for (int l = q * %d / %d; l < (q + 1) * %d / %d; l++)\n"
                    "              if (ke + l / 3 < k1) __builtin_prefetch(pb + (ke + l / 3) * %" PRId64 " + n0 + (l %% 3) * 16, 0, 1);\n"
                    "            for (int64_t k = kb; k < ke; k++) {\n"
                    "              const float *w = pb + k * %" PRId64 " + n0;\n"
                    "              vec x[3];\n"
                    "              for (int j = 0; j < 3; j++) x[j] = *(const vec *)(w + j * 16);\n"
                    "              #pragma GCC unroll 8\n"
                    "              for (int i = 0; i < 8; i++) {\n"
                    "                const float s = ar[i][k * %" PRId64 "];\n"
                    "                for (int j = 0; j < 3; j++) acc[i][j] += s * x[j];\n"
                    "              }\n"
                    "            }\n"
                    "            for (int i = 0; i < mr; i++)\n"
                    "              for (int j = 0; j < 3; j++) *(vec *)(pt + i * ldp + j * 16) = acc[i][j];\n"
                    "          }\n"
                    "        for (; n0 < nhi; n0++)\n"
                    "          for (int64_t m = 0; m < %" PRId64 "; m++) {\n"
                    "            float s = kb == k0 ? 0.0f : part[m * ldp + n0 - nlo];\n"
                    "            for (int64_t k = kb; k < ke; k++) s += pa[m * %" PRId64 " + k * %" PRId64 "] * pb[k * %" PRId64 " + n0];\n"
                    "            part[m * ldp + n0 - nlo] = s;\n"
                    "          }\n"
                    "      }\n",
                 P, P, P, M, M, M, M, M - 1, lda, P * 3, nq, P * 3, nq, ldb, ldb, sa, M, lda, sa, ldb);
}

/* 9 to 32 rows against a weight stored [K, N] (plan_split_k_tiled):
 * each of the U threads (at most 64) takes a contiguous run of the
 * weight's rows, as emit_split_k_gemm's, and walks it in passes of P
 * rows through 8 x 48 register tiles (put_split_k_tiled_rows); the
 * pass's first reads come from memory while every block prefetches the
 * next pass's lines. Partial rows are the thread's own, from the heap
 * (M x N floats); after a barrier each thread adds them over its share
 * of the columns into C, and after a second one frees its own. With the
 * helper thread (share.c), a chunk is 1 to TCC_CPU_SPLIT_K_TILED_RUNS
 * runs of 48 of C's columns (the last chunk to N) over all of K, computed
 * into the tile and stored into its columns of C: no sums, where a chunk
 * of k would add an M x N tile into them. Returns 0 (the kernel returns 1
 * when a thread's partial rows cannot be allocated). */
static int emit_split_k_tiled_gemm(kernel_emit *ke) {
  const tcc_vx *call = ke->k->stores[0].value;
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  tcc_buf *b = ke->b;
  int64_t M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c, ca[3] = {0, 0, 0}, c0;
  tcc_gemm_operand_affine(ke->p, call->a, ca, &c0);
  const int P = g->split_k_tiled;
  const int64_t lda = ca[1], sa = ca[2], ldb = g->ld[1], bytes = (M * N * 4 + 63) / 64 * 64;
  put_gemm_operands(ke, 16);
  if (g->split_k_par) {
    int64_t runs = N / 48 / 4; /* 4 chunks or more where N allows */
    if (runs < 1) runs = 1;
    if (runs > TCC_CPU_SPLIT_K_TILED_RUNS) runs = TCC_CPU_SPLIT_K_TILED_RUNS;
    const int64_t cw = 48 * runs, chunks = N / cw > 0 ? N / cw : 1;
    const int64_t last = N - (chunks - 1) * cw; /* the widest chunk's columns */
    put_share_entry(b, chunks, M * last, 0);
    tcc_buf_printf(b, "  if (rq) {\n"
                      "    const int64_t ldp = %" PRId64 ", nlo = rq->c * %" PRId64 ", nhi = rq->c == %" PRId64 " ? %" PRId64 " : nlo + %" PRId64 ";\n"
                      "    float *const part = rq->tile;\n"
                      "    if (rq->phase == 1) {\n"
                      "      for (int m = 0; m < %" PRId64 "; m++)\n"
                      "        for (int64_t n = nlo; n < nhi; n++) pc[m * %" PRId64 " + n] = part[m * ldp + n - nlo];\n"
                      "      return 0;\n"
                      "    }\n"
                      "    const int64_t k0 = 0, k1 = %" PRId64 ";\n",
                   last, cw, chunks - 1, N, cw, M, N, K);
    put_split_k_tiled_rows(b, M, P, lda, sa, ldb);
    tcc_buf_puts(b, "    return 0;\n  }\n#endif\n");
  }
  tcc_buf_printf(b, "  int omp_get_num_threads(void), omp_get_thread_num(void);\n"
                    "  void *aligned_alloc(__SIZE_TYPE__, __SIZE_TYPE__), free(void *);\n"
                    "  float *parts[64];\n"
                    "  int fail = 0;\n"
                    "  #pragma omp parallel if(%d)\n"
                    "  {\n"
                    "    const int T = omp_get_num_threads(), U = T < 64 ? T : 64, t = omp_get_thread_num();\n"
                    "    float *part = t < U ? aligned_alloc(64, %" PRId64 ") : 0;\n"
                    "    if (t < U) parts[t] = part;\n"
                    "    if (t < U && !part) {\n"
                    "      #pragma omp atomic write\n"
                    "      fail = 1;\n"
                    "    }\n"
                    "    #pragma omp barrier\n"
                    "    int failed;\n"
                    "    #pragma omp atomic read\n"
                    "    failed = fail;\n"
                    "    if (!failed && t < U) {\n"
                    "      const int64_t k0 = %" PRId64 " * t / U, k1 = %" PRId64 " * (t + 1) / U;\n"
                    "      const int64_t ldp = %" PRId64 ", nlo = 0, nhi = %" PRId64 ";\n"
                    "      if (k0 == k1)\n"
                    "        for (int64_t i = 0; i < %" PRId64 "; i++) part[i] = 0;\n",
                 g->split_k_par, bytes, K, K, N, N, M * N);
  put_split_k_tiled_rows(b, M, P, lda, sa, ldb);
  tcc_buf_puts(b, "    }\n"
                  "    #pragma omp barrier\n");
  put_partial_sum(b, "!failed && t < U", M, N);
  tcc_buf_puts(b, "    #pragma omp barrier\n"
                  "    free(part);\n"
                  "  }\n"
                  "  return fail;\n}\n");
  return 0;
}

/* One narrow side (plan_narrow): the narrow operand's K x n elements
 * (B's, or A's with narrow_b) are packed into a zero-padded [K][V x 16]
 * array (the threads share the pack), then each block of R rows of the
 * wide operand (A's rows, or B's stored [N, K]) is streamed once along
 * k, every element broadcast against the V vectors at its k into R x V
 * accumulators, while the next block's rows are prefetched at the same
 * k into L2 (one line each every 16 k, as emit_stream_gemm's); rows past
 * the last in the last block read the last row and are not stored. A's
 * rows store C's rows, the last vector's lanes past N one by one; B's
 * rows (narrow_b) store C's columns: the tile goes through a small array
 * and each row of C gets the block's run. Returns 0 (the kernel returns
 * 1 when the pack cannot be allocated). */
static int emit_narrow_gemm(kernel_emit *ke) {
  const tcc_vx *call = ke->k->stores[0].value;
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  tcc_buf *b = ke->b;
  int64_t M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c, ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}, c0;
  tcc_gemm_operand_affine(ke->p, call->a, ca, &c0);
  tcc_gemm_operand_affine(ke->p, call->b, cb, &c0);
  const int R = g->narrow_rows, V = g->narrow_vecs, tb = g->narrow_b;
  const int64_t wide = tb ? N : M, narrow = tb ? M : N, lds = tb ? cb[2] : ca[1];
  const int64_t pk = tb ? ca[2] : cb[1], pt = tb ? ca[1] : cb[2]; /* the packed one's k and narrow strides */
  const int64_t blocks = (wide + R - 1) / R, full = narrow / 16;
  put_gemm_operands(ke, 16);
  tcc_buf_printf(b, "  const float *restrict ps = %s, *restrict pn = %s;\n"
                    "  void *aligned_alloc(__SIZE_TYPE__, __SIZE_TYPE__), free(void *);\n"
                    "  float *restrict bt = aligned_alloc(64, %" PRId64 " * 64);\n"
                    "  if (!bt) return 1;\n"
                    "  #pragma omp parallel if(%d)\n"
                    "  {\n"
                    "  #pragma omp for schedule(static)\n"
                    "  for (int64_t k = 0; k < %" PRId64 "; k++)\n"
                    "    for (int64_t n = 0; n < %d; n++)\n"
                    "      bt[k * %d + n] = n < %" PRId64 " ? pn[k * %" PRId64 " + n * %" PRId64 "] : 0.0f;\n"
                    "  #pragma omp for schedule(static)\n"
                    "  for (int64_t blk = 0; blk < %" PRId64 "; blk++) {\n"
                    "    const int64_t s0 = blk * %d;\n"
                    "    const int sr = %" PRId64 " - s0 < %d ? (int)(%" PRId64 " - s0) : %d;\n"
                    "    const float *ar[%d], *pf[%d];\n"
                    "    for (int i = 0; i < %d; i++) {\n"
                    "      const int64_t r = s0 + i < %" PRId64 " ? s0 + i : %" PRId64 ";\n"
                    "      const int64_t q = s0 + %d + i < %" PRId64 " ? s0 + %d + i : %" PRId64 ";\n"
                    "      ar[i] = ps + r * %" PRId64 ";\n"
                    "      pf[i] = ps + q * %" PRId64 ";\n"
                    "    }\n"
                    "    vec acc[%d][%d];\n"
                    "    for (int i = 0; i < %d; i++)\n"
                    "      for (int j = 0; j < %d; j++) acc[i][j] = (vec){0};\n"
                    "    for (int64_t k = 0; k < %" PRId64 "; k++) {\n"
                    "      vec x[%d];\n"
                    "      for (int j = 0; j < %d; j++) x[j] = *(const vec *)(bt + k * %d + j * 16);\n"
                    "      if ((k & 15) == 0)\n"
                    "        for (int i = 0; i < %d; i++) __builtin_prefetch(pf[i] + k, 0, 1);\n"
                    "      #pragma GCC unroll %d\n"
                    "      for (int i = 0; i < %d; i++) {\n"
                    "        const float s = ar[i][k];\n"
                    "        for (int j = 0; j < %d; j++) acc[i][j] += s * x[j];\n"
                    "      }\n"
                    "    }\n",
                 tb ? "pb" : "pa", tb ? "pa" : "pb", K * V, g->narrow_par, K, V * 16, V * 16, narrow, pk, pt, blocks,
                 R, wide, R, wide, R, R, R, R, wide, wide - 1, R, wide, R, wide - 1, lds, lds, R, V, R, V, K, V, V,
                 V * 16, R, R, R, V);
  if (!tb)
    tcc_buf_printf(b, "    for (int i = 0; i < sr; i++) {\n"
                      "      float *c = pc + (s0 + i) * %" PRId64 ";\n"
                      "      for (int j = 0; j < %" PRId64 "; j++) *(vec *)(c + j * 16) = acc[i][j];\n"
                      "      for (int64_t n = %" PRId64 "; n < %" PRId64 "; n++) c[n] = acc[i][%" PRId64 "][n - %" PRId64 "];\n"
                      "    }\n",
                   N, full, full * 16, N, full < V ? full : 0, full * 16);
  else
    tcc_buf_printf(b, "    float tile[%d][%d] __attribute__((aligned(64)));\n"
                      "    for (int i = 0; i < %d; i++)\n"
                      "      for (int j = 0; j < %d; j++) *(vec *)(tile[i] + j * 16) = acc[i][j];\n"
                      "    for (int64_t m = 0; m < %" PRId64 "; m++)\n"
                      "      for (int i = 0; i < sr; i++) pc[m * %" PRId64 " + s0 + i] = tile[i][m];\n",
                   R, V * 16, R, V, M, N);
  tcc_buf_puts(b, "  }\n  }\n  free(bt);\n  return 0;\n}\n");
  return 0;
}

/* An EXTERN kernel: C[b] = A[b] . B[b] through oneDNN (float32, when
 * tcc_onednn_enabled) or cblas_?gemm (OpenBLAS). */
static int emit_extern(kernel_emit *ke, int kno) {
  const tcc_program *p = ke->p;
  const tcc_kernel *k = ke->k;
  tcc_buf *b = ke->b;
  const tcc_store *st = &k->stores[0];
  const tcc_vx *call = st->value, *A = call->a, *B = call->b;
  if (call->i == TCC_EXT_INDEX_ADD_ROWS) return emit_index_add_rows(ke, kno);
  if (call->i != TCC_EXT_GEMM) return emit_conv_extern(ke, kno);
  int64_t Bt = call->idx[0]->c, M = call->idx[1]->c, N = call->idx[2]->c, K = call->idx[3]->c;
  tcc_buf_printf(b, "\n/* k%d: extern gemm [%" PRId64 " x %" PRId64 " x %" PRId64 "] x %" PRId64 " */\n",
                 kno, M, N, K, Bt);
  put_kernel_head(b, p, kno);
  tcc_buf_puts(b, "  (void)in; (void)out; (void)ws;\n");
  declare_buffers(ke, ke->ks->used, ke->ks->nused);
  const char *T = tcc_cpu_ctype(call->dtype);
  if (M == 0 || N == 0 || Bt == 0) {
    tcc_buf_puts(b, "  return 0;\n}\n");
    return 0;
  }
  if (K == 0) {
    tcc_buf_printf(b, "  for (int64_t i = 0; i < %" PRId64 "; i++) b%d[i] = 0;\n  return 0;\n}\n",
                   Bt * M * N, st->buf);
    return 0;
  }
  const tcc_cpu_gemm *g = &ke->ks->gemm;
  if (g->stream_rows) return emit_stream_gemm(ke);
  if (g->split_k) return emit_split_k_gemm(ke);
  if (g->split_k_tiled) return emit_split_k_tiled_gemm(ke);
  if (g->narrow_rows) return emit_narrow_gemm(ke);
  if (g->onednn) return emit_dnnl_gemm(ke);
  const int *trans = g->trans;
  const int64_t *ld = g->ld;
  const char *fn = call->dtype == TCC__V1__DTYPE__FLOAT32 ? "cblas_sgemm" : "cblas_dgemm";
  const int batch_par = g->batch_par, slab_par = g->slab_par, blas_threads = g->blas_threads;
  if (blas_threads > 0)
    tcc_buf_printf(b, "  void openblas_set_num_threads(int); int openblas_get_num_threads(void);\n"
                      "  int saved_threads = openblas_get_num_threads();\n"
                      "  openblas_set_num_threads(%d);\n", blas_threads);
  if (batch_par) tcc_buf_puts(b, "  #pragma omp parallel for schedule(static)\n");
  tcc_buf_printf(b, "  for (int64_t ib = 0; ib < %" PRId64 "; ib++) {\n", Bt);
  ke->vname[0] = "ib";
  ke->vname[1] = ke->vname[2] = "0";
  tcc_buf_printf(b, "    const %s *pa = b%d + (", T, A->buf);
  put_index(ke, A->buf, A->idx);
  tcc_buf_printf(b, ");\n    const %s *pb = b%d + (", T, B->buf);
  put_index(ke, B->buf, B->idx);
  tcc_buf_puts(b, ");\n");
  if (slab_par) {
    /* rows [lo, hi) of C (from rows of A) or columns (from columns of
     * B): where a row of A / a column of B starts, per its layout. Rows
     * unless there are few: OpenBLAS gained nothing from column slabs of
     * 32 x 512 x 288 or 144 x 512 x 32, and 1.15-3.4x from row slabs */
    int by_rows = g->by_rows;
    int64_t n = by_rows ? M : N;
    int64_t step = by_rows ? (trans[0] ? 1 : ld[0]) : (trans[1] ? ld[1] : 1);
    tcc_buf_printf(b, "    int omp_get_num_threads(void), omp_get_thread_num(void);\n"
                      "    #pragma omp parallel\n    {\n"
                      "      int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();\n"
                      "      int64_t lo = %" PRId64 " * t / nt, hi = %" PRId64 " * (t + 1) / nt;\n"
                      "      if (hi > lo)\n", n, n);
    if (by_rows)
      tcc_buf_printf(b, "        %s(101, %d, %d, hi - lo, %" PRId64 ", %" PRId64 ", 1, pa + lo * %" PRId64
                        ", %" PRId64 ", pb, %" PRId64 ", 0, b%d + ib * %" PRId64 " + lo * %" PRId64
                        ", %" PRId64 ");\n",
                     fn, trans[0] ? 112 : 111, trans[1] ? 112 : 111, N, K, step, ld[0], ld[1],
                     st->buf, M * N, N, N);
    else
      tcc_buf_printf(b, "        %s(101, %d, %d, %" PRId64 ", hi - lo, %" PRId64 ", 1, pa, %" PRId64
                        ", pb + lo * %" PRId64 ", %" PRId64 ", 0, b%d + ib * %" PRId64 " + lo, %" PRId64
                        ");\n",
                     fn, trans[0] ? 112 : 111, trans[1] ? 112 : 111, M, K, ld[0], step, ld[1],
                     st->buf, M * N, N);
    tcc_buf_puts(b, "    }\n  }\n");
  } else {
    tcc_buf_printf(b, "    %s(101, %d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1, pa, %" PRId64
                      ", pb, %" PRId64 ", 0, b%d + ib * %" PRId64 ", %" PRId64 ");\n  }\n",
                   fn, trans[0] ? 112 : 111, trans[1] ? 112 : 111, M, N, K, ld[0], ld[1], st->buf,
                   M * N, N);
  }
  if (blas_threads > 0) tcc_buf_puts(b, "  openblas_set_num_threads(saved_threads);\n");
  tcc_buf_puts(b, "  return 0;\n}\n");
  return 0;
}

/* The nodes and stores of loop level lv. */
/* operand_text for tcc_c_put_store_guard */
static void operand_text_of(void *ctx, const tcc_vx *e, char *out, size_t cap) {
  operand_text((kernel_emit *)ctx, e, out, cap);
}

static int emit_level(kernel_emit *ke, int lv, int indent, const tcc_vx **nodes, int nn, const int *levels,
                      const int *slevels) {
  const tcc_kernel *k = ke->k;
  /* nodes is in post order from the stores, so the stores alone print
   * the element level of a planned nest in the same order; with column
   * values they leave out what only those use */
  int by_stores = ke->ks->ncol_vals && lv == ke->ks->nest.nloops;
  for (int i = 0; i < nn && !by_stores; i++)
    if (levels[i] == lv && emit_node(ke, nodes[i], indent)) return -1;
  for (int s = 0; s < k->nstores; s++) {
    if (slevels[s] != lv) continue;
    const tcc_store *st = &k->stores[s];
    char x[96];
    if (emit_node(ke, st->value, indent)) return -1;
    const tcc_meta *m = &ke->p->bufs[st->buf].layout;
    for (int d = 0; d < m->rank; d++)
      if (emit_ix_values(ke, st->idx[d], indent)) return -1;
    operand_text(ke, st->value, x, sizeof x);
    tcc_buf_printf(ke->b, "%*s", indent, "");
    tcc_c_put_store_guard(ke->b, st->idx, m->rank, operand_text_of, ke);
    tcc_buf_printf(ke->b, "b%d[", st->buf);
    put_index(ke, st->buf, st->idx);
    tcc_buf_printf(ke->b, "] = %s;\n", x);
  }
  return 0;
}

/* The column values of a planned nest (schedule.c, plan_column_values),
 * before its loops: per value an array h<c> over the element loop, filled
 * by one loop over it, whose var has the element loop's name, so the
 * value prints as it would there. The temporaries of that loop are
 * dropped after it; the element loop then loads h<c>[i<j>]. */
static int emit_column_values(kernel_emit *ke, int indent) {
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  int j = pl->nloops - 1;
  if (!ks->ncol_vals) return 0;
  for (int c = 0; c < ks->ncol_vals; c++)
    tcc_buf_printf(ke->b, "%*s%s h%d[%" PRId64 "];\n", indent, "", tcc_cpu_ctype(ks->col_vals[c]->dtype), c,
                   pl->size[j]);
  tcc_buf_printf(ke->b, "%*s#pragma omp simd reduction(|:bad)\n", indent, "");
  tcc_buf_printf(ke->b, "%*sfor (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", indent, "", j, j, pl->size[j], j);
  for (int d = 0; d < pl->ndims[j]; d++) ke->bound[pl->dims[j][d]] = 1;
  int mark = ke->nscoped, rc = 0;
  ke->col_prologue = 1;
  for (int c = 0; c < ks->ncol_vals && !rc; c++) {
    char x[96];
    rc = emit_node(ke, ks->col_vals[c], indent + 2);
    operand_text(ke, ks->col_vals[c], x, sizeof x);
    tcc_buf_printf(ke->b, "%*sh%d[i%d] = %s;\n", indent + 2, "", c, j, x);
  }
  ke->col_prologue = 0;
  drop_scoped(ke, mark);
  for (int d = 0; d < pl->ndims[j]; d++) ke->bound[pl->dims[j][d]] = 0;
  tcc_buf_printf(ke->b, "%*s}\n", indent, "");
  return rc;
}

/* Column sum `node`, accumulated in array a<acc> of the block, as the
 * temporary of the column i<v> (inside a loop over the block). */
static int read_column_sum(kernel_emit *ke, const tcc_vx *node, int acc, int v, int ind) {
  int t;
  if (define_temp(ke, node, &t)) return -1;
  tcc_buf_printf(ke->b, "%*sconst %s t%d = (%s)a%d[i%d - i%dc];\n", ind, "", tcc_cpu_ctype(node->dtype), t,
                 tcc_cpu_ctype(node->dtype), acc, v, v);
  return 0;
}

/* The element loop of column sums (schedule.c, plan_column_sums), at
 * `indent`, whole: blocks of ks->col_block columns; per block, each sum
 * in an array over the block's columns (float32 ones as float_partial
 * does: a float array per run of the innermost reduction loop, added
 * into a double one). The sums come in stages, one per group of
 * siblings (the schedule's red_lead) in node order, as a batch norm's
 * mean and then the variance around it: per stage, its reduction loops
 * around a SIMD loop over the block's columns, which reads the earlier
 * stages' sums from their arrays. Then the element loop over the
 * block, every sum read from its array. Parts of a summand that only
 * depend on the column are computed per row (no hoisting). */
static int emit_column_sums(kernel_emit *ke, int lv, int indent, const tcc_vx **nodes, int nn,
                            const int *levels, const int *slevels) {
  tcc_buf *b = ke->b;
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  const int j = pl->nloops - 1, v = pl->dims[j][0], cb = ks->col_block;
  const int64_t n = pl->size[j];
  const tcc_vx *sums[TCC_CPU_COL_SUMS];
  int nsum = 0, lead[TCC_CPU_COL_SUMS], acc[TCC_CPU_COL_SUMS];
  for (int i = 0; i < nn; i++)
    if (nodes[i]->op == TCC_PRIM_REDUCE && levels[i] == lv && nsum < TCC_CPU_COL_SUMS) {
      lead[nsum] = ks->red_lead[i];
      sums[nsum++] = nodes[i];
    }
  if (!nsum) return -1;
  if (j == ks->par) put_parallel_pragma(b, indent, ks);
  tcc_buf_printf(b, "%*sfor (int64_t i%dc = 0; i%dc < %" PRId64 "; i%dc += %d) {\n", indent, "", v, v, n, v, cb);
  int ind = indent + 2;
  tcc_buf_printf(b, "%*sconst int64_t i%de = i%dc + %d < %" PRId64 " ? i%dc + %d : %" PRId64 ";\n", ind, "", v, v,
                 cb, n, v, cb, n);
  for (int g = 0; g < nsum; g++) {
    acc[g] = ke->naccs++;
    tcc_buf_printf(b, "%*s%s a%d[%d] = {0};\n", ind, "", acc_ctype(sums[g]), acc[g], cb);
  }
  for (int first = 0; first < nsum;) {   /* one stage: the sums [first, end) of one group */
    int end = first + 1, partials = float_partial(sums[first]);
    while (end < nsum && lead[end] == lead[first]) partials |= float_partial(sums[end++]);
    const tcc_vx *const *group = sums + first;
    const int ng = end - first, *gacc = acc + first;
    const tcc_vx *r0 = group[0];
    const int last = r0->nidx - 1;
    const int blocked = partials && r0->idx[last]->c > TCC_SUM_BLOCK;
    for (int r = 0; r <= last; r++) {
      if (r == last && blocked) open_sum_block(ke, r0->buf + r, "", r0->idx[r]->c, &ind);
      if (r == last)
        for (int g = 0; g < ng; g++)
          if (float_partial(group[g])) tcc_buf_printf(b, "%*sfloat a%dp[%d] = {0};\n", ind, "", gacc[g], cb);
      open_red_loop(ke, r0->buf + r, "", r0->idx[r]->c, r == last && blocked, &ind);
    }
    bind_red_vars(ke, group, ng, ind, 1);
    tcc_buf_printf(b, "%*s#pragma omp simd reduction(|:bad)\n", ind, "");
    tcc_buf_printf(b, "%*sfor (int64_t i%d = i%dc; i%d < i%de; i%d++) {\n", ind, "", v, v, v, v, v);
    ke->bound[v] = 1;
    int mark = ke->nscoped;
    for (int g = 0; g < first; g++)
      if (read_column_sum(ke, sums[g], acc[g], v, ind + 2)) return -1;
    for (int g = 0; g < ng; g++) {
      char t[96];
      if (emit_node(ke, group[g]->a, ind + 2)) return -1;
      operand_text(ke, group[g]->a, t, sizeof t);
      tcc_buf_printf(b, "%*sa%d%s[i%d - i%dc] += %s;\n", ind + 2, "", gacc[g], float_partial(group[g]) ? "p" : "",
                     v, v, t);
    }
    drop_scoped(ke, mark);
    tcc_buf_printf(b, "%*s}\n", ind, "");
    bind_red_vars(ke, group, ng, ind, 0);
    close_red_loops(ke, group, ng, gacc, last, blocked, cb, 0, 0, &ind);
    first = end;
  }
  tcc_buf_printf(b, "%*s#pragma omp simd reduction(|:bad)\n", ind, "");
  tcc_buf_printf(b, "%*sfor (int64_t i%d = i%dc; i%d < i%de; i%d++) {\n", ind, "", v, v, v, v, v);
  for (int g = 0; g < nsum; g++)
    if (read_column_sum(ke, sums[g], acc[g], v, ind + 2)) return -1;
  if (emit_level(ke, lv, ind + 2, nodes, nn, levels, slevels)) return -1;
  tcc_buf_printf(b, "%*s}\n", ind, "");
  tcc_buf_printf(b, "%*s}\n", indent, "");
  return 0;
}

/* The pragma line of loop j, if any: parallel, simd or unrolled as the
 * schedule says. */
static void put_loop_pragma(kernel_emit *ke, int j, int indent) {
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  tcc_buf *b = ke->b;
  if (j == ks->par && ks->par_at_run_time) {
    tcc_buf_printf(b, "%*s#pragma omp parallel for schedule(static) reduction(|:bad) if(", indent, "");
    put_work_expr(b, ke->k, ks->nodes, ks->nnodes);
    tcc_buf_puts(b, " >= 65536.0)\n");
  } else if (j == ks->par)
    put_parallel_pragma(b, indent, ks);
  else if (j == ks->nest.nloops - 1 && ks->simd) {
    tcc_buf_printf(b, "%*s#pragma omp simd reduction(|:bad)", indent, "");
    if (ks->simdlen) tcc_buf_printf(b, " simdlen(%d)", ks->simdlen);
    tcc_buf_puts(b, "\n");
  } else if (j == ks->nest.nloops - 1 && ks->unroll)
    tcc_buf_printf(b, "%*s#pragma GCC unroll %d\n", indent, "", ks->unroll);
}

/* The range-split loop (opened at level lv) and the loops inside it,
 * once per range: each with the nodes its stores need there
 * (range_live), its comparisons constant and its temporaries its own. */
static int emit_ranges(kernel_emit *ke, int lv, int indent) {
  const tcc_cpu_kernel_schedule *ks = ke->ks;
  const tcc_cpu_nest *pl = &ks->nest;
  const tcc_kernel *k = ke->k;
  tcc_buf *b = ke->b;
  const int j0 = lv - 1;
  char *bound = malloc((size_t)ke->nvars + 1);
  if (!bound) return -1;
  memcpy(bound, ke->bound, (size_t)ke->nvars + 1);
  int rc = 0;
  for (int r = 0; r < ks->nranges && !rc; r++) {
    tcc_ptrmap_free(&ke->range_live);
    if (tcc_ptrmap_init(&ke->range_live, 64)) {
      rc = -1;
      break;
    }
    ke->range_var = pl->dims[j0][0];
    ke->range_lo = ks->range_at[r];
    ke->range_hi = ks->range_at[r + 1];
    for (int s = 0; s < k->nstores; s++) {
      range_live_vx(ke, k->stores[s].value);
      for (int d = 0; d < ke->p->bufs[k->stores[s].buf].layout.rank; d++) range_live_ix(ke, k->stores[s].idx[d]);
    }
    int mark = ke->nscoped, ind = indent;
    for (int l = lv; l <= pl->nloops && !rc; l++) {
      const int j = l - 1, iv = pl->dims[j][0];
      put_loop_pragma(ke, j, ind);
      if (j == j0)
        tcc_buf_printf(b, "%*sfor (int64_t i%d = %" PRId64 "; i%d < %" PRId64 "; i%d++) {   /* range %d */\n",
                       ind, "", iv, ke->range_lo, iv, ke->range_hi, iv, r);
      else
        tcc_buf_printf(b, "%*sfor (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", ind, "", iv, iv,
                       pl->size[j], iv);
      ke->bound[iv] = 1;
      ind += 2;
      ke->in_simd_element = l == pl->nloops && ks->simd;
      rc = emit_level(ke, l, ind, ks->nodes, ks->nnodes, ks->levels, ks->store_levels) || ke->oom;
    }
    for (int l = pl->nloops; l >= lv; l--) {
      ind -= 2;
      tcc_buf_printf(b, "%*s}\n", ind, "");
    }
    /* this range's temporaries are its own */
    for (int i = mark; i < ke->nscoped; i++) tcc_ptrmap_put(&ke->temps, ke->scoped[i], NULL);
    ke->nscoped = mark;
    memcpy(ke->bound, bound, (size_t)ke->nvars + 1);
  }
  ke->range_var = -1;
  tcc_ptrmap_free(&ke->range_live);
  free(bound);
  return rc ? -1 : 0;
}

static int emit_kernel(const tcc_program *p, const tcc_kernel *k, const tcc_cpu_kernel_schedule *ks,
                       tcc_buf *b) {
  const int kno = ks->kno;
  kernel_emit ke = {.p = p, .k = k, .ks = ks, .b = b, .range_var = -1};
  int rc = -1;
  if (tcc_ptrmap_init(&ke.temps, 64) || tcc_cpu_fv_init(&ke.fv, p->arena)) goto done;
  ke.nvars = p->next_var > TCC_MAX_DIMS ? p->next_var : TCC_MAX_DIMS;
  ke.bound = calloc((size_t)ke.nvars + 1, 1);
  ke.coef = malloc(sizeof *ke.coef * ((size_t)ke.nvars + 1));
  ke.capscoped = 64;
  ke.scoped = malloc(sizeof *ke.scoped * (size_t)ke.capscoped);
  if (!ke.bound || !ke.scoped || !ke.coef) goto done;
  if (k->kind == TCC_OPK_EXTERN) {
    rc = emit_extern(&ke, kno);
    goto done;
  }
  const tcc_cpu_nest *pl = &ks->nest;
  const tcc_vx **nodes = ks->nodes;
  const int *levels = ks->levels, *slevels = ks->store_levels;
  const int nn = ks->nnodes, pv = ks->peel_loop;
  int has_red = 0;
  for (int i = 0; i < nn; i++) has_red |= nodes[i]->op == TCC_PRIM_REDUCE;
  tcc_buf_printf(b, "\n/* k%d: %s over [", kno, has_red ? "reduction" : "pointwise");
  for (int d = 0; d < k->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", k->sizes[d]);
  tcc_buf_printf(b, "], %d loop%s%s */\n", pl->nloops, pl->nloops == 1 ? "" : "s",
                 pl->affine ? "" : " in dim order");
  put_kernel_head(b, p, kno);
  tcc_buf_puts(b, "  (void)in; (void)out; (void)ws;\n  int bad = 0;\n");
  declare_buffers(&ke, ks->used, ks->nused);
  int64_t numel = 1;
  for (int d = 0; d < k->rank; d++) numel *= k->sizes[d];   /* checked in prepare */
  if (numel == 0) {
    tcc_buf_puts(b, "  /* no elements */\n  return bad;\n}\n");
    rc = 0;
    goto done;
  }
  ke.walking = 1;
  ke.nscoped = 0;
  int indent = 2;
  for (int lv = 0; lv <= pl->nloops; lv++) {
    if (lv > 0 && lv - 1 == pv) {
      /* the element loop three times: [0, ps_), [ps_, pe_) unclamped, [pe_, n) */
      put_peel_range(&ke, pv, pl->size[pv], indent);
      ke.bound[pv] = 1;
      static const char *const from[] = {"0", "ps_", "pe_"}, *const to[] = {"ps_", "pe_", NULL};
      for (int copy = 0; copy < 3; copy++) {
        if (!ks->inner_red) tcc_buf_printf(b, "%*s#pragma omp simd reduction(|:bad)\n", indent, "");
        tcc_buf_printf(b, "%*sfor (int64_t i%d = %s; i%d < ", indent, "", pv, from[copy], pv);
        if (to[copy]) tcc_buf_puts(b, to[copy]);
        else tcc_buf_printf(b, "%" PRId64, pl->size[pv]);
        tcc_buf_printf(b, "; i%d++) {%s\n", pv, copy == 1 ? "   /* clamps in range */" : "");
        int mark = ke.nscoped;
        ke.peeling = copy == 1;
        if (emit_level(&ke, lv, indent + 2, nodes, nn, levels, slevels)) goto done_walking;
        ke.peeling = 0;
        for (int i = mark; i < ke.nscoped; i++) tcc_ptrmap_put(&ke.temps, ke.scoped[i], NULL);
        ke.nscoped = mark;
        tcc_buf_printf(b, "%*s}\n", indent, "");
      }
      break;
    }
    if (lv > 0 && lv == pl->nloops && ks->col_block) {
      if (emit_column_sums(&ke, lv, indent, nodes, nn, levels, slevels)) goto done_walking;
      break;
    }
    if (lv > 0) {
      int j = lv - 1;
      int iv = pl->affine ? j : pl->dims[j][0];   /* dim order: loop j binds i<dim> */
      const int blocks = j == pl->nloops - 1 && ks->prefetch_elem;   /* never the parallel loop */
      if (blocks) {
        /* the element loop in blocks, each touching the next row's first */
        char lo[24], hi[24];
        open_sum_block(&ke, iv, "", pl->size[j], &indent);
        snprintf(lo, sizeof lo, "i%db", iv);
        snprintf(hi, sizeof hi, "i%de", iv);
        put_row_prefetch(&ke, lo, hi, iv, indent);
      }
      if (j == ks->range_loop) {
        if (emit_ranges(&ke, lv, indent)) goto done_walking;
        break;
      }
      put_loop_pragma(&ke, j, indent);
      if (blocks)
        tcc_buf_printf(b, "%*sfor (int64_t i%d = i%db; i%d < i%de; i%d++) {\n", indent, "", iv, iv, iv, iv, iv);
      else
        tcc_buf_printf(b, "%*sfor (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", indent, "", iv, iv,
                       pl->size[j], iv);
      if (!pl->affine) ke.bound[iv] = 1;
      else
        for (int d = 0; d < pl->ndims[j]; d++) ke.bound[pl->dims[j][d]] = 1;
      indent += 2;
    }
    if (lv == 0 && pl->affine)
      for (int d = 0; d < k->rank; d++)
        if (k->sizes[d] == 1) ke.bound[d] = 1;
    ke.in_simd_element = lv == pl->nloops && ks->simd;
    if (emit_level(&ke, lv, indent, nodes, nn, levels, slevels)) goto done_walking;
    if (lv == 0 && emit_column_values(&ke, indent)) goto done_walking;
  }
  const int opened = ks->range_loop >= 0 ? ks->range_loop : pl->nloops - (pv >= 0 || ks->col_block);
  for (int j = opened - 1; j >= 0; j--) {
    indent -= 2;
    tcc_buf_printf(b, "%*s}\n", indent, "");
    if (j == pl->nloops - 1 && ks->prefetch_elem) {   /* its block loop */
      indent -= 2;
      tcc_buf_printf(b, "%*s}\n", indent, "");
    }
  }
  tcc_buf_puts(b, "  return bad;\n}\n");
  rc = ke.oom || ke.fv.oom ? -1 : 0;
done_walking:
  ke.walking = 0;
done:
  tcc_ptrmap_free(&ke.temps);
  tcc_cpu_fv_free(&ke.fv);
  free(ke.bound);
  free(ke.coef);
  free(ke.scoped);
  return rc;
}

/* ------------------------------------------------ shared kernel bodies
 *
 * Identical layers of a model give kernels that differ only in their
 * number and in where their buffers live (in[8] or in[20], ws + 0 or
 * ws + 27648). Each kernel kN is emitted as a body that takes its buffers
 * as a pointer table, and a line that says where they are:
 *
 *   TCC_BODY int tcc_b3f09a1c2d4e5b6a7(void *const *P);
 *   static const tcc_bsrc k12_s[] = {{0, 8, 0, 0}, {2, 0, INT64_C(27648), 0}}; (in[8], ws + 27648)
 *   #ifndef TCC_HAVE_B3f09a1c2d4e5b6a7
 *   __attribute__((noinline, weak)) TCC_BODY int tcc_b3f09a1c2d4e5b6a7(void *const *P) {
 *     const float *restrict b0 = (const float *)P[0];   (was b8 = in[8])
 *     float *restrict b1 = (float *)P[1];               (was b52 = ws + 27648)
 *     ... the kernel, its buffers renamed b0, b1, ... in declaration order
 *   }
 *   #endif
 *
 * A body is named by its text's digest (its first TCC_BODY_ID_HEX hex
 * digits), hidden, global and weak, so that the build can take it from an
 * object compiled for another artifact instead (the object cache,
 * build.c: -DTCC_HAVE_B<id> drops the definition here, the linker takes
 * the object's, and a body two linked objects both hold is one). It is
 * compiled in the preamble before TCC_CPU_PREAMBLE_END and reads nothing
 * else of its translation unit.
 *
 * and a body whose text an earlier kernel already has is not emitted
 * again: a 12-layer encoder compiles each of its layer's kernels once
 * (issue 22). A table after the kernels (tcc_kernels, run by tcc_run)
 * gives each kernel its body and buffers, or the whole function of a
 * kernel that is printed as it is. The transform reads the kernel's text
 * as emit_kernel wrote it (head, "(void)in..." line, declaration lines,
 * the rest); a kernel of another shape (a convolution step with its
 * static state, one that names in, out or ws past its declarations) is
 * printed whole, and so is every kernel of a dynamic program (dynamic.c
 * reads its probes' sources kernel by kernel) or of tune.c's signatures
 * (whole_kernels). */

typedef struct body_table {
  uint8_t (*digest)[TCC_SHA256_BYTES];
  int n, cap;
  tcc_buf entries;      /* the kernel table's initializers, kernel order */
} body_table;

static int is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* 1 when text holds the identifier `name` as a whole token. */
static int has_token(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *q = strstr(text, name); q; q = strstr(q + 1, name))
    if ((q == text || !is_ident(q[-1])) && !is_ident(q[n])) return 1;
  return 0;
}

/* Copies text to out, renaming each token b<I> whose I is in from[0..n)
 * to b<j> (its position), and each loop variable i<V> made past the
 * dims (V >= TCC_MAX_DIMS: a reduction's, and the loops and bounds
 * derived from it, i<V> with up to two of LOOP_VAR_SUFFIXES: a block's
 * i<V>b and i<V>e, a merged loop's i<V>m and i<V>mb, a prefetch's i<V>q,
 * column sums' i<V>c, lane chunks' i<V>o and i<V>l) to
 * i<TCC_MAX_DIMS + k>, k numbering them by first appearance:
 * those ids are numbered program-wide, so one layer's kernel would
 * otherwise differ from the next's. Dims (i0, i1, ...) and other tokens
 * (b3_data, int64_t, ib, t0, ...) stay. Returns -1 when out of memory. */
#define LOOP_VAR_SUFFIXES "bcelmoq"
static int rename_tokens(tcc_buf *out, const char *text, const int *from, int n) {
  int *vars = NULL, nvars = 0, cap = 0;
  const char *q = text;
  while (*q) {
    if ((*q == 'b' || *q == 'i') && (q == text || !is_ident(q[-1])) && q[1] >= '0' && q[1] <= '9') {
      const char *e = q + 1;
      int v = 0;
      while (*e >= '0' && *e <= '9' && v < 100000000) v = v * 10 + (*e++ - '0');
      char suffix[2];
      int nsuffix = 0;
      while (*q == 'i' && nsuffix < 2 && *e && strchr(LOOP_VAR_SUFFIXES, *e)) suffix[nsuffix++] = *e++;
      if (!is_ident(*e)) {
        int j = -1;
        if (*q == 'b') {
          for (int i = 0; i < n && j < 0; i++)
            if (from[i] == v) j = i;
        } else if (v < TCC_MAX_DIMS) {
          j = v; /* a kernel dim: the same in every layer, and named so in dumps */
        } else {
          for (int i = 0; i < nvars && j < 0; i++)
            if (vars[i] == v) j = TCC_MAX_DIMS + i;
          if (j < 0) {
            if (nvars == cap) {
              int *more = realloc(vars, sizeof *vars * (size_t)(cap = cap ? cap * 2 : 16));
              if (!more) {
                free(vars);
                return -1;
              }
              vars = more;
            }
            vars[nvars] = v;
            j = TCC_MAX_DIMS + nvars++;
          }
        }
        if (j >= 0) {
          tcc_buf_printf(out, "%c%d", *q, j);
          tcc_buf_put(out, suffix, (size_t)nsuffix);
          q = e;
          continue;
        }
      }
    }
    tcc_buf_put(out, q, 1);
    q++;
  }
  free(vars);
  return out->failed ? -1 : 0;
}

/* After the kernels: the kernel table and its runner (tcc_entry and the
 * benchmark hooks call kernel k through tcc_run). A shared kernel's entry
 * is data, not code: 363 wrapper functions (a 24-layer encoder) cost the
 * C compiler about as much as every kernel body together. */
static const char kernel_table_head[] =
    "\n/* the kernels: a whole one is called as it is; a shared one's body gets its buffers,\n"
    " * each from base 0 in[index], 1 out[index], 2 ws + offset or 3 data */\n"
    "#define TCC_KERNEL_TABLE 1\n"
    "typedef struct tcc_kent {\n"
    "  int (*whole)(const void *const *, void *const *, char *);\n"
    "  int (*body)(void *const *);\n"
    "  const tcc_bsrc *s;\n"
    "  int n;\n"
    "} tcc_kent;\n"
    "static const tcc_kent tcc_kernels[] = {\n";
static const char kernel_table_tail[] =
    "};\n"
    "static int tcc_run(int k, const void *const *in, void *const *out, char *ws) {\n"
    "  const tcc_kent *e = &tcc_kernels[k];\n"
    "  if (e->whole) return e->whole(in, out, ws);\n"
    "  void *P[256];\n"
    "  for (int j = 0; j < e->n; j++)\n"
    "    P[j] = e->s[j].base == 0 ? (void *)in[e->s[j].index] : e->s[j].base == 1 ? out[e->s[j].index]\n"
    "         : e->s[j].base == 2 ? (void *)(ws + e->s[j].offset) : (void *)e->s[j].data;\n"
    "  return e->body(P);\n}\n";
static const char bsrc_type[] =
    "\ntypedef struct tcc_bsrc { int base, index; int64_t offset; const void *data; } tcc_bsrc;\n"
    "#define TCC_BODY __attribute__((visibility(\"hidden\")))\n";

/* Appends buffer j's entry of a wrapper's table, from the declaration's
 * right side [src, end) as declare_buffers prints it: "(T *)in[K]",
 * "(T *)out[K]", "(T *)(ws + OFF)" or "b<I>_data". Returns 0, or -1 for
 * another form (the kernel is then printed whole). */
static int put_source(tcc_buf *srcs, const char *src, const char *end, int j) {
  const char *sep = j ? ", " : "";
  const char *at;
  size_t n = (size_t)(end - src);
  char text[160];
  if (n >= sizeof text) return -1;
  memcpy(text, src, n);
  text[n] = '\0';
  if ((at = strstr(text, " *)in[")))
    tcc_buf_printf(srcs, "%s{0, %d, 0, 0}", sep, atoi(at + 6));
  else if ((at = strstr(text, " *)out[")))
    tcc_buf_printf(srcs, "%s{1, %d, 0, 0}", sep, atoi(at + 7));
  else if ((at = strstr(text, " *)(ws + ")))
    tcc_buf_printf(srcs, "%s{2, 0, INT64_C(%lld), 0}", sep, strtoll(at + 9, NULL, 10));
  else if (text[0] == 'b' && n > 5 && strcmp(text + n - 5, "_data") == 0)
    tcc_buf_printf(srcs, "%s{3, 0, 0, %s}", sep, text);
  else
    return -1;
  return 0;
}

/* The streamed GEMMs (emit_stream_gemm, emit_split_k_gemm,
 * emit_split_k_tiled_gemm, emit_narrow_gemm) are built
 * with their multiply-adds contracted into FMAs, which the build's
 * -ffp-contract=off keeps out of every other kernel: a GEMM's sums
 * follow no eager order anyway (the libraries use FMAs too), and with
 * 9 rows separate multiplies and adds bound the kernel near the
 * memory's rate (an Intel Xeon with AVX-512, 9 x 3072 x 768: weights in
 * cache 38-41 GB/s against 51-57 with FMAs, from memory 24.5 against
 * 25.7). The pragmas wrap the kernel's definition, inside its body's
 * #ifndef, so that the object cache compiles them with it (build.c). */
static const char fma_push[] = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n"
                               "#pragma GCC optimize(\"fp-contract=fast\")\n#endif\n";
static const char fma_pop[] = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif\n";

static int contracts_madds(const tcc_kernel *k, const tcc_cpu_kernel_schedule *ks) {
  return k->kind == TCC_OPK_EXTERN &&
         (ks->gemm.stream_rows || ks->gemm.split_k || ks->gemm.split_k_tiled || ks->gemm.narrow_rows);
}

/* Appends kernel text kt (one kernel as emit_kernel wrote it) to b as a
 * shared body and a wrapper, or as it is; fma: between fma_push and
 * fma_pop. Returns 0, or -1 when out of memory. */
static int emit_shared(tcc_buf *b, const char *kt, int kno, int fma, body_table *bodies) {
  const char *comment_end = strstr(kt, "*/\n");
  const char *head = comment_end ? comment_end + 3 : NULL;
  const char *head_end = head && strncmp(head, "static int k", 12) == 0 ? strchr(head, '\n') : NULL;
  const char *q = head_end ? head_end + 1 : NULL;
  static const char void_line[] = "  (void)in; (void)out; (void)ws;\n";
  if (!q || strncmp(q, void_line, sizeof void_line - 1) != 0) {
    tcc_buf_puts(b, fma ? fma_push : "");
    tcc_buf_puts(b, kt);
    tcc_buf_puts(b, fma ? fma_pop : "");
    tcc_buf_printf(&bodies->entries, "  {k%d, 0, 0, 0},\n", kno);
    return b->failed || bodies->entries.failed ? -1 : 0;
  }
  q += sizeof void_line - 1;
  /* the declarations: "  [const ]T *restrict b<I> = SRC;" each */
  enum { MAX_PARAMS = 256 };
  int from[MAX_PARAMS], n = 0;
  tcc_buf decl = {0}, srcs = {0}, rest = {0}, generic = {0};
  int ok = 1;
  const char *rest_at = q;
  for (;;) {
    const char *eol = strchr(q, '\n');
    if (!eol) break;
    if (strncmp(q, "  int bad = 0;\n", 15) == 0) { /* fused kernels declare bad first */
      tcc_buf_puts(&decl, "  int bad = 0;\n");
      q = rest_at = eol + 1;
      continue;
    }
    const char *r = strstr(q, " *restrict b");
    const char *eq = r && r < eol ? strstr(r, " = ") : NULL;
    if (!eq || eq > eol || eol[-1] != ';' || n == MAX_PARAMS) break;
    int idx = atoi(r + 12);
    const char *type_at = q + 2;
    tcc_buf_printf(&decl, "  %.*s *restrict b%d = (%.*s *)P[%d];\n", (int)(r - type_at), type_at, n,
                   (int)(r - type_at), type_at, n);
    if (put_source(&srcs, eq + 3, eol - 1, n) != 0) {
      ok = 0;
      break;
    }
    from[n++] = idx;
    q = eol + 1;
    rest_at = q;
  }
  if (n == 0) ok = 0;
  if (ok == 1) {
    if (rename_tokens(&rest, rest_at, from, n) || decl.failed || srcs.failed) {
      ok = -1;
    } else if (has_token(rest.data, "in") || has_token(rest.data, "out") || has_token(rest.data, "ws")) {
      ok = 0; /* the body reads the tables themselves: keep it whole */
    }
  }
  if (ok != 1) {
    tcc_buf_free(&decl), tcc_buf_free(&srcs), tcc_buf_free(&rest);
    if (ok < 0) return -1;
    tcc_buf_puts(b, kt);
    tcc_buf_printf(&bodies->entries, "  {k%d, 0, 0, 0},\n", kno);
    return b->failed || bodies->entries.failed ? -1 : 0;
  }
  tcc_buf_puts(&generic, "(void *const *P) {\n  (void)P;\n");
  tcc_buf_put(&generic, decl.data, decl.len);
  tcc_buf_put(&generic, rest.data, rest.len);
  uint8_t digest[TCC_SHA256_BYTES];
  if (generic.failed) {
    tcc_buf_free(&decl), tcc_buf_free(&srcs), tcc_buf_free(&rest), tcc_buf_free(&generic);
    return -1;
  }
  tcc_sha256_ctx h;   /* the text, and whether it is built with FMAs */
  tcc_sha256_init(&h);
  tcc_sha256_update(&h, generic.data, generic.len);
  tcc_sha256_update(&h, fma ? "fma" : "", fma ? 3 : 0);
  tcc_sha256_final(&h, digest);
  int id = -1, fresh = 0;
  for (int i = 0; i < bodies->n && id < 0; i++)
    if (memcmp(bodies->digest[i], digest, sizeof digest) == 0) id = i;
  if (id < 0) {
    if (bodies->n == bodies->cap) {
      int cap = bodies->cap ? bodies->cap * 2 : 64;
      void *more = realloc(bodies->digest, sizeof *bodies->digest * (size_t)cap);
      if (!more) {
        tcc_buf_free(&decl), tcc_buf_free(&srcs), tcc_buf_free(&rest), tcc_buf_free(&generic);
        return -1;
      }
      bodies->digest = more;
      bodies->cap = cap;
    }
    id = bodies->n++;
    memcpy(bodies->digest[id], digest, sizeof digest);
    fresh = 1;
  }
  /* the kernel's comment, where its buffers are, then a new body: kN's
   * text runs from its comment to k(N+1)'s */
  char name[TCC_BODY_ID_HEX + 1];
  tcc_hex_encode(bodies->digest[id], TCC_BODY_ID_HEX / 2, name);
  tcc_buf_put(b, kt, (size_t)(head - kt));
  if (fresh) tcc_buf_printf(b, "TCC_BODY int tcc_b%s(void *const *P);\n", name);
  tcc_buf_printf(b, "static const tcc_bsrc k%d_s[] = {%s}; /* k%d runs tcc_b%s */\n", kno, srcs.data, kno, name);
  tcc_buf_printf(&bodies->entries, "  {0, tcc_b%s, k%d_s, %d},\n", name, kno, n);
  if (fresh) {
    /* TCC_SELF and TCC_NP: a body that shares its chunks with the
     * helper thread (share.c) passes itself and its pointer table */
    tcc_buf_printf(b, "#ifndef TCC_HAVE_B%s\n#define TCC_SELF tcc_b%s\n#define TCC_NP %d\n"
                      "%s__attribute__((noinline, weak)) TCC_BODY int tcc_b%s", name, name, n,
                   fma ? fma_push : "", name);
    tcc_buf_put(b, generic.data, generic.len);
    tcc_buf_printf(b, "%s#undef TCC_SELF\n#undef TCC_NP\n#endif /* B%s */\n", fma ? fma_pop : "", name);
  }
  tcc_buf_free(&decl), tcc_buf_free(&srcs), tcc_buf_free(&rest), tcc_buf_free(&generic);
  return b->failed || bodies->entries.failed ? -1 : 0;
}

int tcc_cpu_emit(const tcc_program *p, tcc_buf *b, tcc_error *err) {
  const tcc_graph *g = p->graph;
  const tcc_cpu_schedule *sch = p->sched.cpu;
  const int has_conv = sch->has_conv, has_dnnl_gemm = sch->has_dnnl_gemm, has_extern = sch->has_cblas;
  tcc_buf_printf(b,
                 "/* Generated by tccd (codegen %d) for %s.\n"
                 " * int tcc_entry(const void *const *inputs, void *const *outputs, void *workspace)\n"
                 " * %d inputs, %d outputs, %" PRId64 " workspace bytes. */\n",
                 TCC_CODEGEN_VERSION, g->target_label, g->ninputs, g->noutputs,
                 p->workspace_bytes);
  const int governed = sch->threaded && !g->nsyms;  /* dynamic programs: times vary with the sizes */
  if (has_conv || governed) tcc_buf_puts(b, "#define _POSIX_C_SOURCE 200809L   /* pthreads, posix_memalign */\n");
  tcc_buf_puts(b, tcc_cpu_prelude);
  if (governed) {
    tcc_buf_puts(b, tcc_cpu_share);
    tcc_buf_puts(b, tcc_cpu_governor);
  }
  if (has_conv) tcc_buf_puts(b, tcc_onednn_conv_runtime);
  if (has_extern)
    tcc_buf_puts(b, "void cblas_sgemm(int, int, int, int, int, int, float, const float *, int,\n"
                    "                 const float *, int, float, float *, int);\n"
                    "void cblas_dgemm(int, int, int, int, int, int, double, const double *, int,\n"
                    "                 const double *, int, double, double *, int);\n");
  if (has_dnnl_gemm && !has_conv) /* the convolution runtime includes it already */
    tcc_buf_puts(b, "#include <oneapi/dnnl/dnnl.h> /* dnnl_sgemm */\n");
  tcc_buf_puts(b, TCC_CPU_PREAMBLE_END); /* shared bodies are compiled in what comes before (build.c) */
  for (int bi = 0; bi < p->nbufs; bi++)
    if (p->bufs[bi].kind == TCC_BUF_CONST && !p->bufs[bi].dead) {
      /* only constants some live kernel reads get emitted (fuse keeps them) */
      int first = 1;   /* aliases (as_strided) share the first buffer's data */
      for (int bj = 0; bj < bi; bj++)
        if (p->bufs[bj].kind == TCC_BUF_CONST && p->bufs[bj].data == p->bufs[bi].data && !p->bufs[bj].dead)
          first = 0;
      (void)first;
      tcc_c_put_constant(D, b, &p->bufs[bi], bi);
    }
  int kno = 0;
  body_table bodies = {0};
  const char *ns = getenv("TCC_NO_SHARED_BODIES"); /* benchmarks of the road without (in the identity) */
  /* not for dynamic programs: dynamic.c derives sizes by comparing the
   * sources of two probes, whose kernels must correspond one to one */
  const int shared = !(ns && ns[0] && strcmp(ns, "0") != 0) && !p->whole_kernels && !g->nsyms;
  for (int k = 0; k < p->nkernels; k++) {
    if (p->kernels[k].dead) continue;
    tcc_buf kt = {0};
    int rc = emit_kernel(p, &p->kernels[k], &sch->kernels[k], &kt);
    const int fma = contracts_madds(&p->kernels[k], &sch->kernels[k]);
    if (!rc && kt.failed) rc = -1;
    else if (!rc && shared) {
      if (kno == 0) tcc_buf_puts(b, bsrc_type);
      rc = emit_shared(b, kt.data, kno, fma, &bodies);
    }
    else if (!rc) {
      tcc_buf_puts(b, fma ? fma_push : "");
      tcc_buf_put(b, kt.data, kt.len);
      tcc_buf_puts(b, fma ? fma_pop : "");
    }
    tcc_buf_free(&kt);
    if (rc) {
      free(bodies.digest);
      tcc_buf_free(&bodies.entries);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
    }
    kno++;
  }
  free(bodies.digest);
  if (has_conv) {
    /* the steps' oneDNN objects go when the kernel is unloaded */
    tcc_buf_puts(b, "\n__attribute__((destructor)) static void tcc_dnnl_unload(void) {\n");
    kno = 0;
    for (int k = 0; k < p->nkernels; k++) {
      if (p->kernels[k].dead) continue;
      const tcc_kernel *K = &p->kernels[k];
      if (K->kind == TCC_OPK_EXTERN && tcc_ext_is_conv((int)K->stores[0].value->i))
        tcc_buf_printf(b, "  tcc_dnnl_release(&k%d_conv);\n", kno);
      kno++;
    }
    tcc_buf_puts(b, "  tcc_dnnl_engine_release();\n}\n");
  }
  if (shared && kno > 0) {
    tcc_buf_puts(b, kernel_table_head);
    tcc_buf_put(b, bodies.entries.data, bodies.entries.len);
    tcc_buf_puts(b, kernel_table_tail);
  }
  tcc_buf_free(&bodies.entries);
  if (g->nsyms) {
    /* ABI 2 (dynamic shapes): the symbols' values come with the call */
    tcc_buf_puts(b, "\n__attribute__((visibility(\"default\")))\n"
                    "int tcc_entry2(const void *const *inputs, void *const *outputs, void *workspace,\n"
                    "               const int64_t *tcc_S) {\n"
                    "  int bad = 0;\n  (void)tcc_S;\n");
    for (int k = 0; k < kno; k++)
      tcc_buf_printf(b, "  bad |= k%d(inputs, outputs, (char *)workspace, tcc_S);\n", k);
    tcc_buf_puts(b, "  (void)inputs; (void)outputs; (void)workspace;\n  return bad;\n}\n");
    if (b->failed) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
    return 0;
  }
  tcc_buf_puts(b, "\n__attribute__((visibility(\"default\")))\n"
                  "int tcc_entry(const void *const *inputs, void *const *outputs, void *workspace) {\n"
                  "  int bad = 0;\n");
  if (governed)
    tcc_buf_puts(b, "  int tcc_threads, tcc_mode = tcc_gov_begin(&tcc_threads);\n"
                    "  int64_t tcc_t0 = tcc_mode >= 0 ? tcc_gov_now() : 0;\n");
  if (shared && kno > 0)
    tcc_buf_printf(b, "  for (int k = 0; k < %d; k++) bad |= tcc_run(k, inputs, outputs, (char *)workspace);\n",
                   kno);
  else
    for (int k = 0; k < kno; k++)
      tcc_buf_printf(b, "  bad |= k%d(inputs, outputs, (char *)workspace);\n", k);
  if (governed) tcc_buf_puts(b, "  tcc_gov_end(tcc_mode, tcc_threads, tcc_t0);\n");
  tcc_buf_puts(b, "  (void)inputs; (void)outputs; (void)workspace;\n  return bad;\n}\n");
  if (b->failed) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
  return 0;
}

void tcc_cpu_emit_bench_hooks(tcc_buf *src, int nkernels) {
  tcc_buf_puts(src, "\n/* benchmark hooks (tuning builds only) */\n"
                    "__attribute__((visibility(\"default\")))\n"
                    "int tcc_tune_kernel(int k, const void *const *inputs, void *const *outputs,"
                    " void *workspace) {\n  (void)inputs; (void)outputs; (void)workspace;\n"
                    "#ifdef TCC_KERNEL_TABLE\n"
                    "  if (k >= 0 && k < (int)(sizeof tcc_kernels / sizeof tcc_kernels[0]))\n"
                    "    return tcc_run(k, inputs, outputs, (char *)workspace);\n"
                    "#else\n"
                    "  switch (k) {\n");
  for (int k = 0; k < nkernels; k++)
    tcc_buf_printf(src, "  case %d: return k%d(inputs, outputs, (char *)workspace);\n", k, k);
  tcc_buf_puts(src, "  }\n#endif\n  return 0;\n}\n");
}
