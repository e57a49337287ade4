/*
 * emit_c.c — C source for the CPU target.
 *
 * Requires: a checked, planned program.
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
 * Returns 0.
 *
 * Each live kernel becomes a static function with one loop nest. When
 * every access of a kernel is affine in the loop variables, the nest is
 * planned: dims of size 1 vanish, loops follow the first store's strides
 * (largest outermost), and neighbouring loops merge when every access
 * strides through them as one (coef[outer] == coef[inner] * size[inner]),
 * so contiguous tensors run as one flat unit-stride loop the C compiler
 * vectorizes. Indices are int64_t.
 *
 * Hygiene: nothing from the request reaches the source but numbers.
 * Identifiers are generated (k<n> kernels, b<n> buffers, c<n> constants,
 * t<n> temporaries, i<n> loop variables); floats are printed exactly as
 * hexadecimal literals ("%a"), NaN and infinities via <math.h> macros.
 */
#include "loop.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  default: return NULL;
  }
}

/* v as a C99 hexadecimal literal ("0x1.8p+1", "-0x0p+0"), exact, built
 * from the bits rather than with printf's %a so that no locale (a ','
 * decimal point) can change it. v is finite. */
static void put_hexfloat(tcc_buf *b, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  int biased = (int)((u >> 52) & 0x7ff);
  uint64_t mant = u & ((UINT64_C(1) << 52) - 1);
  char digits[14];
  int n = 0;
  for (int shift = 48; shift >= 0 && mant << (12 + 48 - shift) != 0; shift -= 4)
    digits[n++] = "0123456789abcdef"[(mant >> shift) & 0xf];
  digits[n] = '\0';
  int lead = biased != 0;
  int exp = biased ? biased - 1023 : (mant ? -1022 : 0);
  tcc_buf_printf(b, "%s0x%d%s%sp%+d", (u >> 63) ? "-" : "", lead, n ? "." : "", digits, exp);
}

/* An exact C literal of value v in dtype d. */
static void put_float(tcc_buf *b, double v, tcc_dtype d) {
  int f32 = d == TCC__V1__DTYPE__FLOAT32;
  if (isnan(v)) {
    tcc_buf_puts(b, f32 ? "NAN" : "((double)NAN)");
  } else if (isinf(v)) {
    tcc_buf_printf(b, "%s%s", v < 0 ? "-" : "", f32 ? "INFINITY" : "((double)INFINITY)");
  } else {
    put_hexfloat(b, f32 ? (double)(float)v : v);
    if (f32) tcc_buf_puts(b, "f");
  }
}

static void put_int(tcc_buf *b, int64_t v) {
  if (v == INT64_MIN) tcc_buf_puts(b, "INT64_MIN");
  else tcc_buf_printf(b, "INT64_C(%" PRId64 ")", v);
}

static void put_literal(tcc_buf *b, const tcc_vx *e) {
  if (tcc_dtype_is_float(e->dtype)) put_float(b, e->f, e->dtype);
  else if (e->dtype == TCC__V1__DTYPE__INT64) put_int(b, e->i);
  else tcc_buf_printf(b, "((%s)%" PRId64 ")", ctype(e->dtype), e->i);
}

/* ------------------------------------------------------- constants */

static void emit_constant(tcc_buf *b, const tcc_buffer *B, int id) {
  const char *t = ctype(B->layout.dtype);
  int64_t n = B->layout.numel;
  int es = tcc_dtype_size(B->layout.dtype);
  tcc_buf_printf(b, "static const %s b%d_data[%" PRId64 "] = {", t, id, n ? n : 1);
  if (!n) tcc_buf_puts(b, "0");
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *p = B->data + i * es;
    tcc_buf_puts(b, i % 6 ? ", " : (i ? ",\n  " : "\n  "));
    switch (B->layout.dtype) {
    case TCC__V1__DTYPE__FLOAT32: {
      float f;
      memcpy(&f, p, 4);
      put_float(b, f, B->layout.dtype);
      break;
    }
    case TCC__V1__DTYPE__FLOAT64: {
      double f;
      memcpy(&f, p, 8);
      put_float(b, f, B->layout.dtype);
      break;
    }
    case TCC__V1__DTYPE__INT8: tcc_buf_printf(b, "%d", (int)*(const int8_t *)p); break;
    case TCC__V1__DTYPE__INT16: {
      int16_t v;
      memcpy(&v, p, 2);
      tcc_buf_printf(b, "%d", (int)v);
      break;
    }
    case TCC__V1__DTYPE__INT32: {
      int32_t v;
      memcpy(&v, p, 4);
      tcc_buf_printf(b, "%" PRId32, v);
      break;
    }
    case TCC__V1__DTYPE__INT64: {
      int64_t v;
      memcpy(&v, p, 8);
      put_int(b, v);
      break;
    }
    default: tcc_buf_printf(b, "%u", (unsigned)*p); break;
    }
  }
  tcc_buf_puts(b, "};\n");
}

/* ------------------------------------------------------- loop plan */

#define MAX_ACCESS 4096

typedef struct access {
  int buf;
  const tcc_ix *const *idx;  /* per buffer dim */
  int64_t coef[TCC_MAX_DIMS];/* affine over the kernel's vars */
  int64_t c;                 /* includes the storage offset */
} access;

typedef struct loop_plan {
  int affine;                /* loops planned, accesses affine */
  int nloops;
  int64_t size[TCC_MAX_DIMS];
  int dims[TCC_MAX_DIMS][TCC_MAX_DIMS];  /* kernel dims merged into loop j, outer first */
  int ndims[TCC_MAX_DIMS];
} loop_plan;

typedef struct kernel_emit {
  const tcc_program *p;
  const tcc_kernel *k;
  tcc_buf *b;
  tcc_ptrmap temps;          /* vx -> temp number + 1 */
  int ntemps;
  loop_plan plan;
  access *acc;
  int nacc;
  int overflow;              /* too many distinct accesses: unplanned */
} kernel_emit;

/* Linear storage index of access a as affine form; 0 when not affine. */
static int access_affine(const tcc_program *p, const tcc_kernel *k, access *a) {
  const tcc_meta *m = &p->bufs[a->buf].layout;
  for (int v = 0; v < k->rank; v++) a->coef[v] = 0;
  a->c = m->offset;
  for (int d = 0; d < m->rank; d++) {
    int64_t cf[TCC_MAX_DIMS], c0, t;
    if (!tcc_ix_affine(a->idx[d], k->rank, cf, &c0)) return 0;
    for (int v = 0; v < k->rank; v++)
      if (__builtin_mul_overflow(cf[v], m->strides[d], &t) ||
          __builtin_add_overflow(a->coef[v], t, &a->coef[v]))
        return 0;
    if (__builtin_mul_overflow(c0, m->strides[d], &t) || __builtin_add_overflow(a->c, t, &a->c))
      return 0;
  }
  return 1;
}

static void add_access(kernel_emit *ke, int buf, const tcc_ix *const *idx) {
  for (int i = 0; i < ke->nacc; i++)
    if (ke->acc[i].buf == buf && ke->acc[i].idx == idx) return;
  if (ke->nacc == MAX_ACCESS) {
    ke->overflow = 1;
    return;
  }
  ke->acc[ke->nacc].buf = buf;
  ke->acc[ke->nacc].idx = idx;
  ke->nacc++;
}

static int gather_loads(kernel_emit *ke, tcc_ptrmap *seen, const tcc_vx *e) {
  if (tcc_ptrmap_get(seen, e)) return 0;
  if (tcc_ptrmap_put(seen, e, e)) return -1;
  if (e->op == TCC_PRIM_LOAD) add_access(ke, e->buf, e->idx);
  if (e->a && gather_loads(ke, seen, e->a)) return -1;
  if (e->b && gather_loads(ke, seen, e->b)) return -1;
  if (e->c && gather_loads(ke, seen, e->c)) return -1;
  return 0;
}

/* Plans the loop nest of ke->k (see the file header). */
static int plan_loops(kernel_emit *ke) {
  const tcc_kernel *k = ke->k;
  loop_plan *pl = &ke->plan;
  memset(pl, 0, sizeof *pl);
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return -1;
  }
  for (int s = 0; s < k->nstores; s++) add_access(ke, k->stores[s].buf, k->stores[s].idx);
  for (int s = 0; s < k->nstores; s++)
    if (gather_loads(ke, &seen, k->stores[s].value)) {
      tcc_ptrmap_free(&seen);
      return -1;
    }
  tcc_ptrmap_free(&seen);
  pl->affine = !ke->overflow;
  for (int i = 0; i < ke->nacc && pl->affine; i++)
    pl->affine = access_affine(ke->p, k, &ke->acc[i]);
  if (!pl->affine) {                           /* natural order, no merging */
    pl->nloops = k->rank;
    for (int d = 0; d < k->rank; d++) {
      pl->size[d] = k->sizes[d];
      pl->dims[d][0] = d;
      pl->ndims[d] = 1;
    }
    return 0;
  }
  /* Dims of size 1 vanish; order by the first store's |coef|, largest
   * outermost, stable. */
  int order[TCC_MAX_DIMS], n = 0;
  for (int d = 0; d < k->rank; d++)
    if (k->sizes[d] != 1) order[n++] = d;
  const int64_t *key = ke->acc[0].coef;        /* acc[0] is the first store */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && llabs(key[order[j]]) > llabs(key[order[j - 1]]); j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  /* Merge neighbours, inner to outer. A loop is represented by its
   * innermost kernel dim's coefficients. */
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (pl->nloops > 0) {
      int j = pl->nloops - 1;
      int inner = pl->dims[j][pl->ndims[j] - 1];  /* last merged = innermost */
      int ok = 1;
      /* loop j (outer) then d (inner): d merges under j when every access
       * has coef[outer part] == coef[d] * size[d]. j's effective coef is
       * its innermost dim's coef. */
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

/* --------------------------------------------------------- indices */

static void put_ix(tcc_buf *b, const tcc_ix *e) {
  switch (e->kind) {
  case TCC_IX_CONST: put_int(b, e->c); break;
  case TCC_IX_VAR: tcc_buf_printf(b, "i%d", e->var); break;
  case TCC_IX_ADD:
    tcc_buf_puts(b, "(");
    put_ix(b, e->a);
    tcc_buf_puts(b, " + ");
    put_ix(b, e->b);
    tcc_buf_puts(b, ")");
    break;
  case TCC_IX_MUL:
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    tcc_buf_puts(b, "(");
    put_ix(b, e->a);
    tcc_buf_printf(b, " %s ", e->kind == TCC_IX_MUL ? "*" : e->kind == TCC_IX_DIV ? "/" : "%");
    put_int(b, e->c);
    tcc_buf_puts(b, ")");
    break;
  }
}

/* Storage index of (buf, idx) as C. */
static void put_index(kernel_emit *ke, int buf, const tcc_ix *const *idx) {
  tcc_buf *b = ke->b;
  const loop_plan *pl = &ke->plan;
  if (pl->affine) {
    const access *a = NULL;
    for (int i = 0; i < ke->nacc; i++)
      if (ke->acc[i].buf == buf && ke->acc[i].idx == idx) a = &ke->acc[i];
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
  tcc_buf_printf(b, "%" PRId64, m->offset);
  for (int d = 0; d < m->rank; d++) {
    tcc_buf_printf(b, " + %" PRId64 " * ", m->strides[d]);
    put_ix(b, idx[d]);
  }
}

/* ------------------------------------------------------------ body */

/* C for a unary/binary primitive over operand texts x, y. */
static void put_prim(tcc_buf *b, tcc_prim op, tcc_dtype d, const char *x, const char *y) {
  const char *f = d == TCC__V1__DTYPE__FLOAT32 ? "f" : "";
  const char *one = d == TCC__V1__DTYPE__FLOAT32 ? "1.0f" : "1.0";
  const char *zero = d == TCC__V1__DTYPE__FLOAT32 ? "0.0f" : "0.0";
  switch (op) {
  case TCC_PRIM_NEG: tcc_buf_printf(b, "-%s", x); break;
  case TCC_PRIM_ABS: tcc_buf_printf(b, "fabs%s(%s)", f, x); break;
  case TCC_PRIM_EXP: tcc_buf_printf(b, "exp%s(%s)", f, x); break;
  case TCC_PRIM_LOG: tcc_buf_printf(b, "log%s(%s)", f, x); break;
  case TCC_PRIM_SQRT: tcc_buf_printf(b, "sqrt%s(%s)", f, x); break;
  case TCC_PRIM_SIN: tcc_buf_printf(b, "sin%s(%s)", f, x); break;
  case TCC_PRIM_COS: tcc_buf_printf(b, "cos%s(%s)", f, x); break;
  case TCC_PRIM_TANH: tcc_buf_printf(b, "tanh%s(%s)", f, x); break;
  case TCC_PRIM_SIGMOID: tcc_buf_printf(b, "%s / (%s + exp%s(-%s))", one, one, f, x); break;
  case TCC_PRIM_RELU: tcc_buf_printf(b, "(%s < %s ? %s : %s)", x, zero, zero, x); break;
  case TCC_PRIM_ADD: tcc_buf_printf(b, "%s + %s", x, y); break;
  case TCC_PRIM_SUB: tcc_buf_printf(b, "%s - %s", x, y); break;
  case TCC_PRIM_MUL: tcc_buf_printf(b, "%s * %s", x, y); break;
  case TCC_PRIM_DIV: tcc_buf_printf(b, "%s / %s", x, y); break;
  default: tcc_buf_printf(b, "/* bad prim %d */ 0", (int)op); break;
  }
}

/* The operand text of e: a literal or its temporary. */
static void operand_text(kernel_emit *ke, const tcc_vx *e, char *out, size_t cap) {
  if (e->op == TCC_PRIM_CONST) {
    tcc_buf lit = {0};
    put_literal(&lit, e);
    const char *t = lit.data ? lit.data : "0";
    snprintf(out, cap, t[0] == '-' ? "(%s)" : "%s", t);   /* never "--" or "- -x" */
    tcc_buf_free(&lit);
    return;
  }
  intptr_t t = (intptr_t)tcc_ptrmap_get(&ke->temps, e);
  snprintf(out, cap, "t%d", (int)(t - 1));
}

/* Emits temporaries for e and its operands (post-order, once each). */
static int emit_value(kernel_emit *ke, const tcc_vx *e, int indent) {
  if (e->op == TCC_PRIM_CONST || tcc_ptrmap_get(&ke->temps, e)) return 0;
  if (e->a && emit_value(ke, e->a, indent)) return -1;
  if (e->b && emit_value(ke, e->b, indent)) return -1;
  if (e->c && emit_value(ke, e->c, indent)) return -1;
  int t = ke->ntemps++;
  if (tcc_ptrmap_put(&ke->temps, e, (void *)(intptr_t)(t + 1))) return -1;
  tcc_buf *b = ke->b;
  tcc_buf_printf(b, "%*sconst %s t%d = ", indent, "", ctype(e->dtype), t);
  char x[96] = "", y[96] = "";
  if (e->a) operand_text(ke, e->a, x, sizeof x);
  if (e->b) operand_text(ke, e->b, y, sizeof y);
  if (e->op == TCC_PRIM_LOAD) {
    tcc_buf_printf(b, "b%d[", e->buf);
    put_index(ke, e->buf, e->idx);
    tcc_buf_puts(b, "]");
  } else if (e->op == TCC_PRIM_CAST) {
    tcc_buf_printf(b, "(%s)%s", ctype(e->dtype), x);
  } else {
    put_prim(b, e->op, e->dtype, x, y);
  }
  tcc_buf_puts(b, ";\n");
  return 0;
}

static int emit_kernel(const tcc_program *p, const tcc_kernel *k, int kno, tcc_buf *b,
                       access *acc) {
  kernel_emit ke = {.p = p, .k = k, .b = b, .acc = acc};
  if (plan_loops(&ke)) return -1;
  tcc_buf_printf(b, "\n/* k%d: pointwise over [", kno);
  for (int d = 0; d < k->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", k->sizes[d]);
  tcc_buf_printf(b, "], %d loop%s */\n", ke.plan.nloops, ke.plan.nloops == 1 ? "" : "s");
  tcc_buf_printf(b, "static void k%d(const void *const *in, void *const *out, char *ws) {\n", kno);
  tcc_buf_puts(b, "  (void)in; (void)out; (void)ws;\n");
  /* buffer pointers, in buffer order */
  int used[MAX_ACCESS], nused = 0;
  for (int a = 0; a < ke.nacc; a++) {
    int j = nused;
    while (j > 0 && used[j - 1] > acc[a].buf) j--;   /* insertion into sorted, unique */
    if (j > 0 && used[j - 1] == acc[a].buf) continue;
    memmove(&used[j + 1], &used[j], sizeof *used * (size_t)(nused - j));
    used[j] = acc[a].buf;
    nused++;
  }
  for (int u = 0; u < nused; u++) {
    int bi = used[u], written = 0;
    for (int s = 0; s < k->nstores; s++)
      if (k->stores[s].buf == bi) written = 1;
    const tcc_buffer *B = &p->bufs[bi];
    const char *t = ctype(B->layout.dtype);
    switch (B->kind) {
    case TCC_BUF_INPUT:
      tcc_buf_printf(b, "  const %s *restrict b%d = (const %s *)in[%d];\n", t, bi, t, B->pos);
      break;
    case TCC_BUF_CONST:
      tcc_buf_printf(b, "  const %s *restrict b%d = b%d_data;\n", t, bi, bi);
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
  int64_t numel = 1;
  for (int d = 0; d < k->rank; d++) numel *= k->sizes[d];   /* checked in prepare */
  if (numel == 0) {
    tcc_buf_puts(b, "  /* no elements */\n}\n");
    return 0;
  }
  int indent = 2;
  for (int j = 0; j < ke.plan.nloops; j++) {
    tcc_buf_printf(b, "%*sfor (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", indent, "", j, j,
                   ke.plan.size[j], j);
    indent += 2;
  }
  if (tcc_ptrmap_init(&ke.temps, 64)) {
    tcc_ptrmap_free(&ke.temps);
    return -1;
  }
  for (int s = 0; s < k->nstores; s++) {
    const tcc_store *st = &k->stores[s];
    if (emit_value(&ke, st->value, indent)) {
      tcc_ptrmap_free(&ke.temps);
      return -1;
    }
    char x[96];
    operand_text(&ke, st->value, x, sizeof x);
    tcc_buf_printf(b, "%*sb%d[", indent, "", st->buf);
    put_index(&ke, st->buf, st->idx);
    tcc_buf_printf(b, "] = %s;\n", x);
  }
  tcc_ptrmap_free(&ke.temps);
  for (int j = ke.plan.nloops - 1; j >= 0; j--) {
    indent -= 2;
    tcc_buf_printf(b, "%*s}\n", indent, "");
  }
  tcc_buf_puts(b, "}\n");
  return 0;
}

int tcc_emit_c(const tcc_program *p, tcc_buf *b, tcc_error *err) {
  const tcc_graph *g = p->graph;
  for (int bi = 0; bi < p->nbufs; bi++)
    if (!p->bufs[bi].dead && !ctype(p->bufs[bi].layout.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "%s tensors are not supported by the CPU "
                           "backend yet", tcc_dtype_name(p->bufs[bi].layout.dtype));
  tcc_buf_printf(b,
                 "/* Generated by tccd (codegen %d) for %s.\n"
                 " * int tcc_entry(const void *const *inputs, void *const *outputs, void *workspace)\n"
                 " * %d inputs, %d outputs, %" PRId64 " workspace bytes. */\n"
                 "#include <math.h>\n#include <stdint.h>\n",
                 TCC_CODEGEN_VERSION, g->target_label, g->ninputs, g->noutputs,
                 p->workspace_bytes);
  for (int bi = 0; bi < p->nbufs; bi++)
    if (p->bufs[bi].kind == TCC_BUF_CONST && !p->bufs[bi].dead) {
      /* only constants some live kernel reads get emitted (fuse keeps them) */
      emit_constant(b, &p->bufs[bi], bi);
    }
  access *acc = malloc(sizeof *acc * MAX_ACCESS);
  if (!acc) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
  int kno = 0;
  for (int k = 0; k < p->nkernels; k++) {
    if (p->kernels[k].dead) continue;
    if (emit_kernel(p, &p->kernels[k], kno++, b, acc)) {
      free(acc);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
    }
  }
  free(acc);
  tcc_buf_puts(b, "\n__attribute__((visibility(\"default\")))\n"
                  "int tcc_entry(const void *const *inputs, void *const *outputs, void *workspace) {\n");
  for (int k = 0; k < kno; k++) tcc_buf_printf(b, "  k%d(inputs, outputs, (char *)workspace);\n", k);
  tcc_buf_puts(b, "  (void)inputs; (void)outputs; (void)workspace;\n  return 0;\n}\n");
  if (b->failed) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory emitting C");
  return 0;
}
