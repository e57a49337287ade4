/*
 * lower.c — canonical graph -> loop IR (the `lower` column of ops.h).
 *
 * Requires: a canonical graph (checked by tcc_check_graph).
 * Produces: one buffer per graph input (INPUT), constant (CONST) and graph
 * output position (OUTPUT, with the layout the client declared), and per
 * node output one kernel that computes it into its "home" buffer: the
 * OUTPUT buffer when the value is returned (extra stores for every further
 * position it is returned at), else a contiguous TEMP. Nothing is fused
 * here; a value read by a later node is a LOAD of its home buffer, and
 * fuse.c inlines it. A graph output that is an input or constant gets a
 * copy kernel.
 *
 * Lowering functions (one per `lower` name in ops.h) build the body of a
 * node's output over the loop variables of the output's shape, reading
 * operands with tcc_lower_operand (which broadcasts and casts), and hand
 * it to tcc_lower_realize.
 *
 * Dtypes: arithmetic runs in float32 or float64 (the node's output
 * dtype, PyTorch's computation type for these ops); operands of other
 * dtypes are loaded and converted. Integer arithmetic, float16 and
 * bfloat16 are not lowered yet (UNIMPLEMENTED, naming the node).
 */
#include "loop.h"

#include <string.h>

/* Loop variables i0..i{rank-1}, the identity index of a shape. */
static int identity_index(tcc_program *p, int rank, const tcc_ix **idx) {
  for (int d = 0; d < rank; d++)
    if (!(idx[d] = tcc_ix_var(p, d))) return -1;
  return 0;
}

static int compute_dtype_ok(tcc_dtype d) {
  return d == TCC__V1__DTYPE__FLOAT32 || d == TCC__V1__DTYPE__FLOAT64;
}

size_t tcc_compiler_dtypes(int device, Tcc__V1__DType *out, size_t cap) {
  static const Tcc__V1__DType cpu[] = {TCC__V1__DTYPE__FLOAT32, TCC__V1__DTYPE__FLOAT64};
  if (device != TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED && device != TCC__V1__DEVICE_TYPE__CPU)
    return 0;
  for (size_t i = 0; i < 2 && i < cap; i++) out[i] = cpu[i];
  return 2;
}

/* Dtypes the CPU backend can load, convert and store. */
static int storage_dtype_ok(tcc_dtype d) {
  return d != TCC__V1__DTYPE__FLOAT16 && d != TCC__V1__DTYPE__BFLOAT16 && tcc_dtype_valid(d);
}

const tcc_vx *tcc_lower_operand(tcc_lower_ctx *lc, const tcc_arg *a, int rank,
                                const int64_t *sizes, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  switch (a->kind) {
  case TCC_ARG_TENSOR: {
    const tcc_lval *v = &lc->vals[a->v];
    const tcc_ix *idx[TCC_MAX_DIMS];
    (void)sizes;
    for (int k = 0; k < v->rank; k++)   /* right-aligned; size-1 dims read index 0 */
      idx[k] = v->sizes[k] == 1 ? tcc_ix_const(p, 0) : tcc_ix_var(p, k + rank - v->rank);
    return tcc_vx_cast(p, tcc_vx_subst(p, v->body, v->rank, idx), dt);
  }
  case TCC_ARG_INT: return tcc_vx_const(p, dt, (double)a->i, a->i);
  case TCC_ARG_FLOAT: return tcc_vx_const(p, dt, a->f, (int64_t)0);
  case TCC_ARG_BOOL: return tcc_vx_const(p, dt, a->i ? 1.0 : 0.0, a->i != 0);
  default: return NULL;
  }
}

int tcc_lower_realize(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                      tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_graph *g = lc->g;
  int v = n->outs[o];
  if (v < 0) return 0;
  if (!body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_meta *m = &g->values[v].meta;
  const tcc_ix *idx[TCC_MAX_DIMS];
  if (identity_index(p, m->rank, idx))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  int k = tcc_program_add_kernel(p, m->rank, m->sizes);
  if (k < 0) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  int home = -1;
  for (int i = 0; i < g->noutputs; i++) {
    if (g->outputs[i] != v) continue;
    if (tcc_kernel_add_store(p, k, lc->out_buf[i], idx, body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    if (home < 0) home = lc->out_buf[i];
  }
  if (home < 0) {
    tcc_buffer b = {.kind = TCC_BUF_TEMP, .pos = -1, .layout = *m, .value = v};
    tcc_meta_contiguous(&b.layout);
    home = tcc_program_add_buffer(p, &b);
    if (home < 0 || tcc_kernel_add_store(p, k, home, idx, body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }
  tcc_lval *lv = &lc->vals[v];
  lv->rank = m->rank;
  memcpy(lv->sizes, m->sizes, sizeof lv->sizes);
  lv->dtype = m->dtype;
  lv->body = tcc_vx_load(p, home, m->rank, idx);
  if (!lv->body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  return 0;
}

/* ------------------------------------------------- lowering functions */

/* y = prim(x) */
int tcc_lower_unary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (n->outs[0] < 0) return 0;
  const tcc_meta *m = &lc->g->values[n->outs[0]].meta;
  const tcc_vx *x = tcc_lower_operand(lc, &n->args[0], m->rank, m->sizes, m->dtype);
  return tcc_lower_realize(lc, n, 0, tcc_vx_unary(lc->prog, n->op->prim, x), err);
}

/* y = prim(a, b), with b scaled by `alpha` when the schema has it
 * (add/sub: a + alpha * b). */
int tcc_lower_binary(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (n->outs[0] < 0) return 0;
  tcc_program *p = lc->prog;
  const tcc_meta *m = &lc->g->values[n->outs[0]].meta;
  const tcc_vx *a = tcc_lower_operand(lc, &n->args[0], m->rank, m->sizes, m->dtype);
  const tcc_vx *b = tcc_lower_operand(lc, &n->args[1], m->rank, m->sizes, m->dtype);
  int ai = tcc_schema_param(&n->op->schema, "alpha");
  if (ai >= 0) {
    const tcc_arg *alpha = &n->args[ai];
    int is_one = (alpha->kind == TCC_ARG_INT && alpha->i == 1) ||
                 (alpha->kind == TCC_ARG_FLOAT && alpha->f == 1.0) ||
                 (alpha->kind == TCC_ARG_BOOL && alpha->i == 1);
    if (!is_one)
      b = tcc_vx_binary(p, TCC_PRIM_MUL, b, tcc_lower_operand(lc, alpha, 0, NULL, m->dtype));
  }
  return tcc_lower_realize(lc, n, 0, tcc_vx_binary(p, n->op->prim, a, b), err);
}

/* ------------------------------------------------------------- driver */

/* Checks that the backend can lower node n's dtypes. */
static int node_dtypes_ok(const tcc_graph *g, const tcc_node *n, tcc_error *err) {
  for (int o = 0; o < n->nout; o++) {
    if (n->outs[o] < 0) continue;
    tcc_dtype d = g->values[n->outs[o]].meta.dtype;
    if (!compute_dtype_ok(d))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "node %d (%s): %s results are not supported by the CPU backend yet",
                           n->src_index, n->op->name, tcc_dtype_name(d));
  }
  FOR_EACH_TENSOR_ARG(n, v, {
    tcc_dtype d = g->values[v].meta.dtype;
    if (!storage_dtype_ok(d))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "node %d (%s): %s operands are not supported by the CPU backend yet",
                           n->src_index, n->op->name, tcc_dtype_name(d));
  })
  return 0;
}

int tcc_lower(tcc_program *p, tcc_error *err) {
  const tcc_graph *g = p->graph;
  tcc_lower_ctx lcs = {.prog = p, .g = g}, *lc = &lcs;
  lc->vals = tcc_arena_array(p->arena, (size_t)g->nvalues + 1, sizeof *lc->vals);
  lc->out_buf = tcc_arena_array(p->arena, (size_t)g->noutputs + 1, sizeof *lc->out_buf);
  if (!lc->vals || !lc->out_buf)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  const tcc_ix *idx[TCC_MAX_DIMS];

  /* Inputs and constants: buffers read through their layout. */
  for (int v = 0; v < g->nvalues; v++) {
    const tcc_value *val = &g->values[v];
    if (val->kind != TCC_VAL_INPUT && val->kind != TCC_VAL_CONST) continue;
    tcc_buffer b = {.kind = val->kind == TCC_VAL_INPUT ? TCC_BUF_INPUT : TCC_BUF_CONST,
                    .pos = val->def, .layout = val->meta, .value = v,
                    .data = val->data, .data_len = val->data_len};
    if (val->kind == TCC_VAL_CONST) b.pos = v;
    int id = tcc_program_add_buffer(p, &b);
    if (id < 0 || identity_index(p, val->meta.rank, idx))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    tcc_lval *lv = &lc->vals[v];
    lv->rank = val->meta.rank;
    memcpy(lv->sizes, val->meta.sizes, sizeof lv->sizes);
    lv->dtype = val->meta.dtype;
    lv->body = tcc_vx_load(p, id, lv->rank, idx);
    if (!lv->body) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }

  /* Output buffers, in return order, with the declared layouts. */
  for (int i = 0; i < g->noutputs; i++) {
    const tcc_value *val = &g->values[g->outputs[i]];
    if (!storage_dtype_ok(val->meta.dtype))
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "graph output %d: %s is not supported by the CPU backend yet", i,
                           tcc_dtype_name(val->meta.dtype));
    tcc_buffer b = {.kind = TCC_BUF_OUTPUT, .pos = i, .layout = val->meta,
                    .value = g->outputs[i]};
    if ((lc->out_buf[i] = tcc_program_add_buffer(p, &b)) < 0)
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }

  /* Nodes, in canonical (topological) order. */
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    int rc = node_dtypes_ok(g, n, err);
    if (rc) return rc;
    if ((rc = n->op->lower(lc, n, err))) return rc;
    if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
    for (int o = 0; o < n->nout; o++)
      if (n->outs[o] >= 0 && !lc->vals[n->outs[o]].body)
        return tcc_error_set(err, TCC_E_INTERNAL, "node %d (%s): lowering left output %d undefined",
                             n->src_index, n->op->name, o);
  }

  /* Outputs that are inputs or constants: copies. */
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const tcc_value *val = &g->values[v];
    if (val->kind == TCC_VAL_NODE) continue;
    int k = tcc_program_add_kernel(p, val->meta.rank, val->meta.sizes);
    if (k < 0 || identity_index(p, val->meta.rank, idx) ||
        tcc_kernel_add_store(p, k, lc->out_buf[i], idx, lc->vals[v].body))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  }
  if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering");
  return 0;
}
