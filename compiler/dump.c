/*
 * dump.c — human-readable listings of the IRs, for TCC_DUMP and tests.
 *
 * Graph:
 *   v0 = input 0  float32[10, 10] strides [10, 1] offset 0   # x
 *   v2 = aten.sin.default(self=v0)  float32[10, 10]          # sin
 *   return v4
 *
 * Program:
 *   buf0 input 0 float32[10, 10] strides [10, 1] offset 0
 *   kernel 0 pointwise over [10, 10]
 *     %0 = load buf0[i0, i1]
 *     %1 = sin %0
 *     store buf2[i0, i1] = %1
 *
 * Client names appear only as trailing comments, quoted safely.
 */
#include "loop.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

static void dump_meta(tcc_buf *b, const tcc_meta *m, int layout) {
  tcc_buf_printf(b, "%s[", tcc_dtype_name(m->dtype));
  for (int d = 0; d < m->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", m->sizes[d]);
  tcc_buf_puts(b, "]");
  if (!layout) return;
  tcc_buf_puts(b, " strides [");
  for (int d = 0; d < m->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", m->strides[d]);
  tcc_buf_printf(b, "] offset %" PRId64, m->offset);
}

static void dump_arg(tcc_buf *b, const tcc_arg *a) {
  switch (a->kind) {
  case TCC_ARG_NONE: tcc_buf_puts(b, "None"); break;
  case TCC_ARG_TENSOR: tcc_buf_printf(b, "v%d", a->v); break;
  case TCC_ARG_INT: tcc_buf_printf(b, "%" PRId64, a->i); break;
  case TCC_ARG_BOOL: tcc_buf_puts(b, a->i ? "True" : "False"); break;
  case TCC_ARG_FLOAT: tcc_buf_printf(b, "%.17g", a->f); break;
  case TCC_ARG_DTYPE: tcc_buf_puts(b, tcc_dtype_name((int)a->i)); break;
  case TCC_ARG_DEVICE: tcc_buf_puts(b, a->i == TCC__V1__DEVICE_TYPE__CUDA ? "cuda" : "cpu"); break;
  case TCC_ARG_STRING: {
    char q[80];
    tcc_buf_printf(b, "'%s'", tcc_quote_name(a->s, q, sizeof q));
    break;
  }
  case TCC_ARG_INTS:
  case TCC_ARG_FLOATS:
  case TCC_ARG_BOOLS:
  case TCC_ARG_TENSORS:
    tcc_buf_puts(b, "[");
    for (int i = 0; i < a->n; i++) {
      if (i) tcc_buf_puts(b, ", ");
      if (a->kind == TCC_ARG_INTS) tcc_buf_printf(b, "%" PRId64, a->ints[i]);
      else if (a->kind == TCC_ARG_FLOATS) tcc_buf_printf(b, "%.17g", a->floats[i]);
      else if (a->kind == TCC_ARG_BOOLS) tcc_buf_puts(b, a->bools[i] ? "True" : "False");
      else if (a->vals[i] < 0) tcc_buf_puts(b, "None");
      else tcc_buf_printf(b, "v%d", a->vals[i]);
    }
    tcc_buf_puts(b, "]");
    break;
  }
}

void tcc_dump_graph(const tcc_graph *g, tcc_buf *b) {
  char q[80];
  tcc_buf_printf(b, "graph: %d inputs, %d nodes, %d outputs; target %s; mode %d; dynamic %d\n",
                 g->ninputs, g->nnodes, g->noutputs, g->target_label, g->mode, g->dynamic);
  tcc_buf_printf(b, "identity: %s\n", g->identity ? g->identity : "");
  for (int v = 0; v < g->nvalues; v++) {
    const tcc_value *val = &g->values[v];
    if (val->kind == TCC_VAL_NODE) continue;
    tcc_buf_printf(b, "  v%d = %s %d  ", v, val->kind == TCC_VAL_INPUT ? "input" : "constant",
                   val->kind == TCC_VAL_INPUT ? val->def : v);
    dump_meta(b, &val->meta, 1);
    tcc_buf_printf(b, "   # %s\n", tcc_quote_name(val->name, q, sizeof q));
  }
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    tcc_buf_puts(b, "  ");
    for (int o = 0; o < n->nout; o++) {
      if (n->outs[o] < 0) tcc_buf_printf(b, "%s_", o ? ", " : "");
      else tcc_buf_printf(b, "%sv%d", o ? ", " : "", n->outs[o]);
    }
    tcc_buf_printf(b, " = %s(", n->op->name);
    for (int a = 0; a < n->nargs; a++) {
      tcc_buf_printf(b, "%s%s=", a ? ", " : "", n->op->schema.params[a].name);
      dump_arg(b, &n->args[a]);
    }
    tcc_buf_puts(b, ")");
    if (n->nout == 1 && n->outs[0] >= 0) {
      tcc_buf_puts(b, "  ");
      dump_meta(b, &g->values[n->outs[0]].meta, 0);
      tcc_buf_printf(b, "   # node %d, %s", n->src_index,
                     tcc_quote_name(g->values[n->outs[0]].name, q, sizeof q));
    } else {
      tcc_buf_printf(b, "   # node %d", n->src_index);
    }
    tcc_buf_puts(b, "\n");
  }
  tcc_buf_puts(b, "  return");
  for (int i = 0; i < g->noutputs; i++) tcc_buf_printf(b, "%s v%d", i ? "," : "", g->outputs[i]);
  tcc_buf_puts(b, "\n");
}

/* ---------------------------------------------------------- program */

typedef struct vdump vdump;
static int dump_vx(vdump *d, const tcc_vx *e);

/* Index text; VALUE parts name the value's number when d is given. */
static void dump_ix(const tcc_ix *e, tcc_buf *b, const tcc_ptrmap *ids) {
  switch (e->kind) {
  case TCC_IX_CONST: tcc_buf_printf(b, "%" PRId64, e->c); break;
  case TCC_IX_VAR: tcc_buf_printf(b, "i%d", e->var); break;
  case TCC_IX_ADD:
    dump_ix(e->a, b, ids);
    tcc_buf_puts(b, " + ");
    dump_ix(e->b, b, ids);
    break;
  case TCC_IX_MUL:
  case TCC_IX_DIV:
  case TCC_IX_MOD:
    tcc_buf_puts(b, "(");
    dump_ix(e->a, b, ids);
    tcc_buf_printf(b, ")%s%" PRId64,
                   e->kind == TCC_IX_MUL ? "*" : e->kind == TCC_IX_DIV ? "//" : "%", e->c);
    break;
  case TCC_IX_MIN:
  case TCC_IX_MAX:
    tcc_buf_printf(b, "%s(", e->kind == TCC_IX_MIN ? "min" : "max");
    dump_ix(e->a, b, ids);
    tcc_buf_printf(b, ", %" PRId64 ")", e->c);
    break;
  case TCC_IX_VALUE: {
    intptr_t id = ids ? (intptr_t)tcc_ptrmap_get(ids, e->v) : 0;
    if (id) tcc_buf_printf(b, "checked(%%%d < %" PRId64 ")", (int)id - 1, e->c);
    else tcc_buf_printf(b, "checked(value < %" PRId64 ")", e->c);
    break;
  }
  }
}

void tcc_dump_ix(const tcc_ix *e, tcc_buf *b) { dump_ix(e, b, NULL); }

static const char *prim_name(tcc_prim op) {
  switch (op) {
#define PRIM_NAME(id, arity, name) case TCC_PRIM_##id: return name;
    TCC_PRIMS(PRIM_NAME)
#undef PRIM_NAME
  default: return "?";
  }
}

static void dump_index(tcc_buf *b, int buf, int n, const tcc_ix *const *idx,
                       const tcc_ptrmap *ids) {
  tcc_buf_printf(b, "buf%d[", buf);
  for (int d = 0; d < n; d++) {
    if (d) tcc_buf_puts(b, ", ");
    dump_ix(idx[d], b, ids);
  }
  tcc_buf_puts(b, "]");
}

struct vdump {
  tcc_buf *b;
  tcc_ptrmap ids;
  int next;
};

/* Numbers the values inside an index's VALUE parts first. */
static int dump_ix_values(vdump *d, const tcc_ix *x) {
  if (!x) return 0;
  if (x->kind == TCC_IX_VALUE) return dump_vx(d, x->v) < 0 ? -1 : 0;
  if (dump_ix_values(d, x->a)) return -1;
  return dump_ix_values(d, x->b);
}

static const char *const red_names[] = {"sum", "prod", "max", "min", "argmax", "argmin"};

/* Prints e's operands first; returns e's number (or -1 for OOM). */
static int dump_vx(vdump *d, const tcc_vx *e) {
  intptr_t have = (intptr_t)tcc_ptrmap_get(&d->ids, e);
  if (have) return (int)have - 1;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int k = 0; k < e->nidx; k++)
      if (dump_ix_values(d, e->idx[k])) return -1;
  int a = e->a ? dump_vx(d, e->a) : 0, bb = e->b ? dump_vx(d, e->b) : 0;
  int cc = e->c ? dump_vx(d, e->c) : 0;
  if (a < 0 || bb < 0 || cc < 0) return -1;
  int id = d->next++;
  if (tcc_ptrmap_put(&d->ids, e, (void *)(intptr_t)(id + 1))) return -1;
  tcc_buf_printf(d->b, "    %%%d = %s ", id, tcc_dtype_name(e->dtype));
  if (e->op == TCC_PRIM_LOAD) {
    tcc_buf_puts(d->b, "load ");
    dump_index(d->b, e->buf, e->nidx, e->idx, &d->ids);
  } else if (e->op == TCC_PRIM_INDEX) {
    tcc_buf_puts(d->b, "index ");
    dump_ix(e->idx[0], d->b, &d->ids);
  } else if (e->op == TCC_PRIM_CONST) {
    if (tcc_dtype_is_float(e->dtype)) tcc_buf_printf(d->b, "const %.17g", e->f);
    else tcc_buf_printf(d->b, "const %" PRId64, e->i);
  } else if (e->op == TCC_PRIM_REDUCE) {
    tcc_buf_printf(d->b, "reduce %s %%%d over", e->i >= 0 && e->i < 6 ? red_names[e->i] : "?", a);
    for (int r = 0; r < e->nidx; r++)
      tcc_buf_printf(d->b, "%s i%d < %" PRId64, r ? "," : "", e->buf + r, e->idx[r]->c);
  } else if (e->op == TCC_PRIM_EXTERN && e->i == TCC_EXT_INDEX_ADD_ROWS) {
    tcc_buf_printf(d->b, "extern index-add-rows %%%d at %%%d [v %" PRId64 ", d %" PRId64 ", t %" PRId64
                   ", pad %" PRId64 "]", a, bb, e->idx[0]->c, e->idx[1]->c, e->idx[2]->c, e->idx[3]->c);
  } else if (e->op == TCC_PRIM_EXTERN && e->i != TCC_EXT_GEMM) {
    static const char *const conv_names[] = {[TCC_EXT_CONV_FWD] = "forward",
        [TCC_EXT_CONV_BWD_DATA] = "backward-data", [TCC_EXT_CONV_BWD_WEIGHTS] = "backward-weights"};
    tcc_buf_printf(d->b, "extern convolution %s %%%d, %%%d [", conv_names[e->i], a, bb);
    for (int r = 0; r < e->nidx; r++) tcc_buf_printf(d->b, "%s%" PRId64, r ? " " : "", e->idx[r]->c);
    tcc_buf_puts(d->b, "]");
  } else if (e->op == TCC_PRIM_EXTERN) {
    tcc_buf_printf(d->b, "extern gemm %%%d, %%%d [b %" PRId64 ", m %" PRId64 ", n %" PRId64
                   ", k %" PRId64 "]", a, bb, e->idx[0]->c, e->idx[1]->c, e->idx[2]->c, e->idx[3]->c);
  } else {
    tcc_buf_printf(d->b, "%s %%%d", prim_name(e->op), a);
    if (e->b) tcc_buf_printf(d->b, ", %%%d", bb);
    if (e->c) tcc_buf_printf(d->b, ", %%%d", cc);
  }
  tcc_buf_puts(d->b, "\n");
  return id;
}

void tcc_dump_program(const tcc_program *p, tcc_buf *b) {
  static const char *const kinds[] = {"input", "output", "const", "temp"};
  tcc_buf_printf(b, "program: %d buffers, %d live kernels, workspace %" PRId64 " bytes\n", p->nbufs,
                 tcc_program_live_kernels(p), p->workspace_bytes);
  for (int i = 0; i < p->nbufs; i++) {
    const tcc_buffer *B = &p->bufs[i];
    tcc_buf_printf(b, "  buf%d %s %d ", i, kinds[B->kind], B->pos);
    dump_meta(b, &B->layout, 1);
    if (B->kind == TCC_BUF_TEMP && p->planned && !B->dead)
      tcc_buf_printf(b, " ws+%" PRId64, B->ws_offset);
    if (B->value >= 0) tcc_buf_printf(b, "  (v%d)", B->value);
    if (B->written_in_place) tcc_buf_puts(b, "  written in place");
    tcc_buf_puts(b, B->dead ? "  dead\n" : "\n");
  }
  for (int k = 0; k < p->nkernels; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    tcc_buf_printf(b, "  kernel %d %s over [", k, K->kind == TCC_OPK_EXTERN ? "extern" : "pointwise");
    for (int d = 0; d < K->rank; d++) tcc_buf_printf(b, "%s%" PRId64, d ? ", " : "", K->sizes[d]);
    tcc_buf_puts(b, "]\n");
    vdump vd = {.b = b};
    if (tcc_ptrmap_init(&vd.ids, 64)) {
      tcc_ptrmap_free(&vd.ids);
      b->failed = 1;
      return;
    }
    for (int s = 0; s < K->nstores; s++) {
      int id = dump_vx(&vd, K->stores[s].value);
      tcc_buf_puts(b, "    store ");
      dump_index(b, K->stores[s].buf, p->bufs[K->stores[s].buf].layout.rank, K->stores[s].idx,
                 &vd.ids);
      tcc_buf_printf(b, " = %%%d\n", id);
    }
    tcc_ptrmap_free(&vd.ids);
  }
}
