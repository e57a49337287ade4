/*
 * check.c — IR checkers, run between passes (pipeline.c).
 *
 * A failed check is a compiler bug, never a user error: it returns
 * TCC_E_INTERNAL with the broken invariant, and the pipeline names the
 * pass that broke it. Checks are cheap (linear in the IR) and always on.
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>

#define FAIL(...) return tcc_error_set(err, TCC_E_INTERNAL, __VA_ARGS__)

/* ------------------------------------------------------------ graph */

int tcc_check_graph(const tcc_graph *g, tcc_error *err) {
  int nv = g->nvalues;
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    if (v < 0 || v >= nv) FAIL("graph input %d: value id %d out of range", i, v);
    if (g->values[v].kind != TCC_VAL_INPUT || g->values[v].def != i)
      FAIL("graph input %d: value v%d is not input %d", i, v, i);
  }
  for (int v = 0; v < nv; v++) {
    const tcc_value *val = &g->values[v];
    const tcc_meta *m = &val->meta;
    if (!tcc_dtype_valid(m->dtype) || m->rank < 0 || m->rank > TCC_MAX_DIMS)
      FAIL("value v%d: bad dtype or rank", v);
    switch (val->kind) {
    case TCC_VAL_INPUT:
      if (val->def < 0 || val->def >= g->ninputs || g->inputs[val->def] != v)
        FAIL("value v%d: claims to be input %d", v, val->def);
      break;
    case TCC_VAL_CONST:
      if (val->data_len != (size_t)m->numel * (size_t)tcc_dtype_size(m->dtype))
        FAIL("constant v%d: %zu data bytes for %lld elements", v, val->data_len,
             (long long)m->numel);
      break;
    case TCC_VAL_NODE:
      if (val->def < 0 || val->def >= g->nnodes || val->def_out < 0 ||
          val->def_out >= g->nodes[val->def].nout || g->nodes[val->def].outs[val->def_out] != v)
        FAIL("value v%d: claims node %d output %d, which is not it", v, val->def, val->def_out);
      break;
    default:
      FAIL("value v%d: undefined in a canonical graph", v);
    }
  }
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    if (!n->op || n->nargs != n->op->schema.nparams)
      FAIL("node %d: %d arguments for a schema of %d", k, n->nargs,
           n->op ? n->op->schema.nparams : -1);
    FOR_EACH_TENSOR_ARG(n, v, {
      if (v < 0 || v >= nv) FAIL("node %d (%s): argument value id %d out of range", k, n->op->name, v);
      const tcc_value *val = &g->values[v];
      if (val->kind == TCC_VAL_NODE && val->def >= k)
        FAIL("node %d (%s): reads v%d before node %d defines it (not topological)", k,
             n->op->name, v, val->def);
    })
    for (int o = 0; o < n->nout; o++) {
      int v = n->outs[o];
      if (v < -1 || v >= nv) FAIL("node %d: output id %d out of range", k, v);
      if (v >= 0 && (g->values[v].kind != TCC_VAL_NODE || g->values[v].def != k))
        FAIL("node %d: output v%d is defined elsewhere", k, v);
    }
  }
  if (g->noutputs <= 0) FAIL("graph without outputs");
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] < 0 || g->outputs[i] >= nv) FAIL("graph output %d: bad value id", i);
  return 0;
}

/* ---------------------------------------------------------- program */

typedef struct pcheck {
  const tcc_program *p;
  const tcc_kernel *k;
  int kno;
  tcc_ptrmap seen;
  char *written;        /* per buffer: written by an earlier kernel */
  tcc_error *err;
} pcheck;

/* Min and max of an index expression over the kernel's iteration space,
 * when affine. Returns 0 when not affine (then not checked). */
static int ix_range(const pcheck *c, const tcc_ix *e, int64_t *lo, int64_t *hi) {
  int64_t coef[TCC_MAX_DIMS], k0;
  if (!tcc_ix_affine(e, c->k->rank, coef, &k0)) return 0;
  __int128 l = k0, h = k0;
  for (int v = 0; v < c->k->rank; v++) {
    __int128 ext = (__int128)coef[v] * (c->k->sizes[v] - 1);
    if (c->k->sizes[v] == 0) return 0;   /* empty space: nothing is accessed */
    if (ext < 0) l += ext;
    else h += ext;
  }
  if (l < INT64_MIN || h > INT64_MAX) return 0;
  *lo = (int64_t)l;
  *hi = (int64_t)h;
  return 1;
}

static int check_index(pcheck *c, int buf, int nidx, const tcc_ix *const *idx, const char *what) {
  tcc_error *err = c->err;
  const tcc_program *p = c->p;
  if (buf < 0 || buf >= p->nbufs) FAIL("kernel %d: %s of buffer %d out of range", c->kno, what, buf);
  const tcc_buffer *B = &p->bufs[buf];
  if (B->dead) FAIL("kernel %d: %s of dead buffer %d", c->kno, what, buf);
  if (nidx != B->layout.rank)
    FAIL("kernel %d: %s of buffer %d with %d indices, rank %d", c->kno, what, buf, nidx,
         B->layout.rank);
  for (int d = 0; d < nidx; d++) {
    int64_t lo, hi;
    if (!idx[d]) FAIL("kernel %d: %s of buffer %d: missing index %d", c->kno, what, buf, d);
    if (ix_range(c, idx[d], &lo, &hi) && (lo < 0 || hi >= B->layout.sizes[d]))
      FAIL("kernel %d: %s of buffer %d: index %d spans [%lld, %lld], size %lld", c->kno, what, buf,
           d, (long long)lo, (long long)hi, (long long)B->layout.sizes[d]);
  }
  return 0;
}

static int check_vx(pcheck *c, const tcc_vx *e);

/* Checks the expressions inside an index (VALUE parts). */
static int check_ix_values(pcheck *c, const tcc_ix *x) {
  tcc_error *err = c->err;
  if (!x) return 0;
  if (x->kind == TCC_IX_VALUE) {
    if (!x->v || x->v->dtype != TCC__V1__DTYPE__INT64 || x->c <= 0)
      FAIL("kernel %d: index value must be int64 into a non-empty dim", c->kno);
    return check_vx(c, x->v);
  }
  int rc = check_ix_values(c, x->a);
  return rc ? rc : check_ix_values(c, x->b);
}

static int is_pred(tcc_prim op) {
  switch (op) {
  case TCC_PRIM_EQ: case TCC_PRIM_NE: case TCC_PRIM_LT: case TCC_PRIM_LE: case TCC_PRIM_GT:
  case TCC_PRIM_GE: case TCC_PRIM_AND: case TCC_PRIM_OR: case TCC_PRIM_XOR: case TCC_PRIM_NOT:
  case TCC_PRIM_ISNAN: case TCC_PRIM_ISINF:
    return 1;
  default:
    return 0;
  }
}

static int check_vx(pcheck *c, const tcc_vx *e) {
  tcc_error *err = c->err;
  if (tcc_ptrmap_get(&c->seen, e)) return 0;
  if (tcc_ptrmap_put(&c->seen, e, e)) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if (e->op <= TCC_PRIM_NONE || e->op >= TCC_PRIM_COUNT) FAIL("kernel %d: bad primitive", c->kno);
  if (e->depth > TCC_MAX_EXPR_DEPTH + 8) FAIL("kernel %d: expression depth %d", c->kno, e->depth);
  if (!tcc_dtype_valid(e->dtype)) FAIL("kernel %d: expression of invalid dtype", c->kno);
  switch (e->op) {
  case TCC_PRIM_LOAD: {
    int rc = check_index(c, e->buf, e->nidx, e->idx, "load");
    if (rc) return rc;
    for (int d = 0; d < e->nidx; d++)
      if ((rc = check_ix_values(c, e->idx[d]))) return rc;
    const tcc_buffer *B = &c->p->bufs[e->buf];
    if (e->dtype != B->layout.dtype) FAIL("kernel %d: load dtype differs from buffer %d", c->kno, e->buf);
    if ((B->kind == TCC_BUF_TEMP || B->kind == TCC_BUF_OUTPUT) && !c->written[e->buf])
      FAIL("kernel %d: reads buffer %d before any kernel writes it", c->kno, e->buf);
    for (int s = 0; s < c->k->nstores; s++)
      if (c->k->stores[s].buf == e->buf)
        FAIL("kernel %d: reads buffer %d, which it also writes", c->kno, e->buf);
    return 0;
  }
  case TCC_PRIM_CONST: return 0;
  case TCC_PRIM_INDEX:
    if (e->nidx != 1 || !e->idx[0] || e->dtype != TCC__V1__DTYPE__INT64)
      FAIL("kernel %d: malformed index value", c->kno);
    return check_ix_values(c, e->idx[0]);
  case TCC_PRIM_CAST:
    if (!e->a) FAIL("kernel %d: cast without operand", c->kno);
    return check_vx(c, e->a);
  case TCC_PRIM_REDUCE:
    if (!e->a || e->nidx < 0 || e->nidx > TCC_MAX_DIMS || e->buf < TCC_FIRST_BOUND_VAR)
      FAIL("kernel %d: malformed reduction", c->kno);
    if (e->i < TCC_RED_SUM || e->i > TCC_RED_ARGMIN) FAIL("kernel %d: bad reduction kind", c->kno);
    if ((e->i == TCC_RED_ARGMAX || e->i == TCC_RED_ARGMIN) ? e->dtype != TCC__V1__DTYPE__INT64
                                                           : e->a->dtype != e->dtype)
      FAIL("kernel %d: reduction dtype differs from its body", c->kno);
    if (!tcc_dtype_is_float(e->a->dtype) && e->a->dtype != TCC__V1__DTYPE__INT64 &&
        e->a->dtype != TCC__V1__DTYPE__BOOL && e->i != TCC_RED_ARGMAX && e->i != TCC_RED_ARGMIN &&
        e->i != TCC_RED_MAX && e->i != TCC_RED_MIN)
      FAIL("kernel %d: %s reduction", c->kno, tcc_dtype_name(e->a->dtype));
    if (e->a->dtype == TCC__V1__DTYPE__FLOAT16 || e->a->dtype == TCC__V1__DTYPE__BFLOAT16)
      FAIL("kernel %d: reduction over a storage-only dtype", c->kno);
    return check_vx(c, e->a);
  case TCC_PRIM_EXTERN:
    if (c->k->kind != TCC_OPK_EXTERN || c->k->nstores != 1)
      FAIL("kernel %d: library call outside an extern kernel", c->kno);
    if (e->i != TCC_EXT_GEMM && !tcc_ext_is_conv((int)e->i) && e->i != TCC_EXT_INDEX_ADD_ROWS)
      FAIL("kernel %d: unknown library call %lld", c->kno, (long long)e->i);
    if (e->i == TCC_EXT_INDEX_ADD_ROWS) {
      if (e->nidx != 4 || c->p->graph->target.device != TCC__V1__DEVICE_TYPE__CPU || !e->a || !e->b ||
          e->a->op != TCC_PRIM_LOAD || e->b->op != TCC_PRIM_LOAD || e->a->dtype != e->dtype ||
          e->b->dtype != TCC__V1__DTYPE__INT64 ||
          (e->dtype != TCC__V1__DTYPE__FLOAT32 && e->dtype != TCC__V1__DTYPE__FLOAT64))
        FAIL("kernel %d: malformed row index-add call", c->kno);
      const tcc_buffer *A = &c->p->bufs[e->a->buf], *B = &c->p->bufs[e->b->buf];
      if (A->dead || B->dead || ((A->kind == TCC_BUF_TEMP || A->kind == TCC_BUF_OUTPUT) && !c->written[e->a->buf]) ||
          ((B->kind == TCC_BUF_TEMP || B->kind == TCC_BUF_OUTPUT) && !c->written[e->b->buf]))
        FAIL("kernel %d: extern reads a buffer before it is written", c->kno);
      return 0;
    }
    /* convolutions: oneDNN on the CPU (float32), cuDNN on CUDA (float
     * dtypes, operands of the result's dtype) */
    if (e->i != TCC_EXT_GEMM &&
        (e->nidx != TCC_CONV_NPARAM ||
         (c->p->graph->target.device == TCC__V1__DEVICE_TYPE__CPU ? e->dtype != TCC__V1__DTYPE__FLOAT32
                                                                  : !tcc_dtype_is_float(e->dtype) || !e->a ||
                                                                        e->a->dtype != e->dtype)))
      FAIL("kernel %d: malformed convolution call", c->kno);
    if (!e->a || !e->b || e->a->op != TCC_PRIM_LOAD || e->b->op != TCC_PRIM_LOAD ||
        e->a->dtype != e->b->dtype || (e->i == TCC_EXT_GEMM && e->nidx != 4) ||
        (e->a->dtype != e->dtype &&   /* CUDA: half operands, float32 result */
         !(e->dtype == TCC__V1__DTYPE__FLOAT32 && c->p->graph->target.device == TCC__V1__DEVICE_TYPE__CUDA &&
           (e->a->dtype == TCC__V1__DTYPE__FLOAT16 || e->a->dtype == TCC__V1__DTYPE__BFLOAT16))))
      FAIL("kernel %d: extern operands must be loads of its dtype", c->kno);
    if (e->dtype != TCC__V1__DTYPE__FLOAT32 && e->dtype != TCC__V1__DTYPE__FLOAT64 &&
        !(tcc_ext_is_conv((int)e->i) && c->p->graph->target.device == TCC__V1__DEVICE_TYPE__CUDA))
      FAIL("kernel %d: extern call in %s", c->kno, tcc_dtype_name(e->dtype));
    {
      const tcc_buffer *A = &c->p->bufs[e->a->buf], *B = &c->p->bufs[e->b->buf];
      if (A->dead || B->dead || ((A->kind == TCC_BUF_TEMP || A->kind == TCC_BUF_OUTPUT) && !c->written[e->a->buf]) ||
          ((B->kind == TCC_BUF_TEMP || B->kind == TCC_BUF_OUTPUT) && !c->written[e->b->buf]))
        FAIL("kernel %d: extern reads a buffer before it is written", c->kno);
    }
    return 0;
  default:
    break;
  }
  if (c->k->kind == TCC_OPK_EXTERN) FAIL("kernel %d: extern kernel with arithmetic", c->kno);
  int arity = 0;
#define ARITY(id, n, name) if (e->op == TCC_PRIM_##id) arity = n;
  TCC_PRIMS(ARITY)
#undef ARITY
  const tcc_vx *ops[3] = {e->a, e->b, e->c};
  for (int i = 0; i < arity; i++) {
    if (!ops[i]) FAIL("kernel %d: %d-ary primitive missing operand %d", c->kno, arity, i);
    int rc = check_vx(c, ops[i]);
    if (rc) return rc;
  }
  if (e->dtype == TCC__V1__DTYPE__FLOAT16 || e->dtype == TCC__V1__DTYPE__BFLOAT16)
    FAIL("kernel %d: arithmetic in a storage-only dtype", c->kno);
  if (is_pred(e->op)) {
    if (e->dtype != TCC__V1__DTYPE__BOOL) FAIL("kernel %d: predicate not bool", c->kno);
    if (arity == 2 && ops[0]->dtype != ops[1]->dtype) FAIL("kernel %d: comparing different dtypes", c->kno);
    if ((e->op == TCC_PRIM_AND || e->op == TCC_PRIM_OR || e->op == TCC_PRIM_XOR || e->op == TCC_PRIM_NOT) &&
        ops[0]->dtype != TCC__V1__DTYPE__BOOL)
      FAIL("kernel %d: logical op on a non-bool", c->kno);
    return 0;
  }
  if (e->op == TCC_PRIM_WHERE) {
    if (ops[0]->dtype != TCC__V1__DTYPE__BOOL || ops[1]->dtype != e->dtype || ops[2]->dtype != e->dtype)
      FAIL("kernel %d: where operand dtypes", c->kno);
    return 0;
  }
  for (int i = 0; i < arity; i++)
    if (ops[i]->dtype != e->dtype) FAIL("kernel %d: operand dtype differs from result", c->kno);
  return 0;
}

int tcc_check_program(const tcc_program *p, tcc_error *err) {
  pcheck c = {.p = p, .err = err};
  if (p->oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  c.written = calloc((size_t)p->nbufs + 1, 1);
  int *stores = calloc((size_t)p->nbufs + 1, sizeof *stores);
  int rc = 0;
  if (!c.written || !stores) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (int k = 0; k < p->nkernels && !rc; k++) {
    const tcc_kernel *K = &p->kernels[k];
    if (K->dead) continue;
    c.k = K;
    c.kno = k;
    if (K->nstores <= 0) {
      rc = tcc_error_set(err, TCC_E_INTERNAL, "kernel %d: live without stores", k);
      break;
    }
    if (tcc_ptrmap_init(&c.seen, 64)) {
      tcc_ptrmap_free(&c.seen);
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    for (int s = 0; s < K->nstores && !rc; s++) {
      const tcc_store *st = &K->stores[s];
      rc = check_index(&c, st->buf, st->buf >= 0 && st->buf < p->nbufs ? p->bufs[st->buf].layout.rank : -1,
                       st->idx, "store");
      for (int d = 0; !rc && d < p->bufs[st->buf].layout.rank; d++) rc = check_ix_values(&c, st->idx[d]);
      if (rc) break;
      const tcc_buffer *B = &p->bufs[st->buf];
      if ((B->kind == TCC_BUF_INPUT && !B->written_in_place) || B->kind == TCC_BUF_CONST)
        rc = tcc_error_set(err, TCC_E_INTERNAL, "kernel %d: stores into read-only buffer %d", k, st->buf);
      else if (st->value->dtype != B->layout.dtype)
        rc = tcc_error_set(err, TCC_E_INTERNAL, "kernel %d: stores %s into %s buffer %d", k,
                           tcc_dtype_name(st->value->dtype), tcc_dtype_name(B->layout.dtype), st->buf);
      else
        rc = check_vx(&c, st->value);
      stores[st->buf]++;
    }
    tcc_ptrmap_free(&c.seen);
    for (int s = 0; s < K->nstores; s++) c.written[K->stores[s].buf] = 1;
  }
  for (int b = 0; b < p->nbufs && !rc; b++)
    if (p->bufs[b].kind == TCC_BUF_OUTPUT && stores[b] != 1)
      rc = tcc_error_set(err, TCC_E_INTERNAL, "output buffer %d (position %d) stored %d times", b,
                         p->bufs[b].pos, stores[b]);
done:
  free(c.written);
  free(stores);
  return rc;
}
