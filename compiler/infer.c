/*
 * infer.c — shape and dtype rules (the `infer` column of ops.h).
 *
 * Requires: the node's arguments bound and type-checked (verify.c) and its
 * tensor arguments' metas valid.
 * Produces: the dtype and sizes of each output (strides: contiguous; the
 * declared strides of a node output are the client's choice and are
 * checked separately).
 *
 * Pointwise ops broadcast like PyTorch (sizes aligned on the right, a dim
 * of size 1 stretches) and pick their dtype like torch.result_type: the
 * operands are the op's Tensor parameters and its Scalar parameters other
 * than `alpha`; dimensioned tensors outrank zero-dim tensors, which
 * outrank Python scalars, unless a lower group holds a higher category
 * (bool < integer < float).
 */
#include "graph.h"

#include <string.h>

/* Requires: the element count of m's sizes fits int64. */
void tcc_meta_contiguous(tcc_meta *m) {
  int64_t s = 1;
  for (int d = m->rank - 1; d >= 0; d--) {
    m->strides[d] = s;
    s *= m->sizes[d] > 1 ? m->sizes[d] : 1;  /* bounded: numel was checked */
  }
  m->offset = 0;
  m->numel = 1;
  for (int d = 0; d < m->rank; d++) m->numel *= m->sizes[d];
  m->span = m->numel;
}

int tcc_broadcast(const int64_t *a, int ra, const int64_t *b, int rb, int64_t *out, int *rout,
                  tcc_error *err) {
  int r = ra > rb ? ra : rb;
  for (int i = 0; i < r; i++) {             /* i counts from the right */
    int64_t x = i < ra ? a[ra - 1 - i] : 1;
    int64_t y = i < rb ? b[rb - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) {
      char sa[200], sb[200];
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "shapes %s and %s cannot broadcast: dim %d is %lld vs %lld",
                           tcc_shape_str(a, ra, sa, sizeof sa), tcc_shape_str(b, rb, sb, sizeof sb),
                           -1 - i, (long long)x, (long long)y);
    }
    out[r - 1 - i] = x == 1 ? y : x;
  }
  *rout = r;
  return 0;
}

int tcc_infer_node(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  for (int o = 0; o < n->nout; o++) memset(&out[o], 0, sizeof out[o]);
  return n->op->infer(g, n, out, err);
}

/* ----------------------------------------------------- type promotion */

/* c10's combine_categories(higher, lower): the lower-priority group only
 * counts when it holds a higher category. 0 = no dtype yet. */
static tcc_dtype combine(tcc_dtype higher, tcc_dtype lower) {
  if (!higher) return lower;
  if (tcc_dtype_is_float(higher)) return higher;
  if (higher == TCC__V1__DTYPE__BOOL || tcc_dtype_is_float(lower))
    return lower ? tcc_dtype_promote(higher, lower) : higher;
  return higher;
}

typedef struct result_type {
  tcc_dtype dim, zero, wrapped;
} result_type;

static void rt_tensor(result_type *rt, const tcc_meta *m) {
  if (m->rank > 0) rt->dim = rt->dim ? tcc_dtype_promote(rt->dim, m->dtype) : m->dtype;
  else rt->zero = rt->zero ? tcc_dtype_promote(rt->zero, m->dtype) : m->dtype;
}

static void rt_scalar(result_type *rt, const tcc_arg *a) {
  tcc_dtype d = a->kind == TCC_ARG_FLOAT ? TCC_DEFAULT_FLOAT
              : a->kind == TCC_ARG_INT ? TCC__V1__DTYPE__INT64 : TCC__V1__DTYPE__BOOL;
  rt->wrapped = rt->wrapped ? tcc_dtype_promote(rt->wrapped, d) : d;
}

static tcc_dtype rt_result(const result_type *rt) {
  return combine(rt->dim, combine(rt->zero, rt->wrapped));
}

/* Broadcast shape and result dtype of a pointwise node's operands. */
static int pointwise_common(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                            tcc_error *err) {
  const tcc_schema *s = &n->op->schema;
  result_type rt = {0, 0, 0};
  int64_t sizes[TCC_MAX_DIMS];
  int rank = 0, have_tensor = 0;
  for (int p = 0; p < n->nargs; p++) {
    const tcc_arg *a = &n->args[p];
    if (a->kind == TCC_ARG_TENSOR) {
      const tcc_meta *m = &g->values[a->v].meta;
      rt_tensor(&rt, m);
      int64_t tmp[TCC_MAX_DIMS];
      int r;
      int rc = tcc_broadcast(sizes, rank, m->sizes, m->rank, tmp, &r, err);
      if (rc) return rc;
      if (r > TCC_MAX_DIMS)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "broadcast rank exceeds %d",
                             TCC_MAX_DIMS);
      memcpy(sizes, tmp, sizeof(int64_t) * (size_t)r);
      rank = r;
      have_tensor = 1;
    } else if (s->params[p].type == TCC_PT_SCALAR && strcmp(s->params[p].name, "alpha") != 0 &&
               (a->kind == TCC_ARG_INT || a->kind == TCC_ARG_FLOAT || a->kind == TCC_ARG_BOOL)) {
      rt_scalar(&rt, a);
    }
  }
  if (!have_tensor)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "pointwise op without a tensor operand");
  out->dtype = rt_result(&rt);
  out->device = g->target.device;
  out->rank = rank;
  memcpy(out->sizes, sizes, sizeof(int64_t) * (size_t)rank);
  /* The element count of a broadcast shape can exceed every operand's. */
  int64_t numel = 1, bytes;
  for (int d = 0; d < rank; d++)
    if (__builtin_mul_overflow(numel, sizes[d], &numel))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "broadcast element count overflows int64");
  if (__builtin_mul_overflow(numel, (int64_t)8, &bytes))   /* widest dtype a result can take */
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "broadcast byte size overflows int64");
  tcc_meta_contiguous(out);
  return 0;
}

/* Result dtype = torch.result_type of the operands. */
int tcc_infer_promote(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  return pointwise_common(g, n, out, err);
}

/* As promote, but integer/bool results become the default float (true
 * division, transcendental functions). */
int tcc_infer_promote_float(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                            tcc_error *err) {
  int rc = pointwise_common(g, n, out, err);
  if (rc) return rc;
  if (!tcc_dtype_is_float(out->dtype)) out->dtype = TCC_DEFAULT_FLOAT;
  return 0;
}
