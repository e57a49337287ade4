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

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *tcc_shape_str(const int64_t *sizes, int rank, char *buf, size_t cap) {
  size_t o = 0;
  if (!cap) return buf;
  buf[0] = '\0';
  o += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)sizes[i]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
  return buf;
}

/* Requires: the element count of m's sizes fits int64. */
void tcc_meta_channels_last(tcc_meta *m) {
  tcc_meta_contiguous(m);
  if (m->rank != 4 && m->rank != 5) return;
  int64_t s = 1;
  int order[5] = {1, 0, 0, 0, 0}, n = 1;   /* innermost first: C, then spatial from the last */
  for (int d = m->rank - 1; d >= 2; d--) order[n++] = d;
  order[n++] = 0;
  for (int i = 0; i < n; i++) {
    int d = order[i];
    m->strides[d] = s;
    if (__builtin_mul_overflow(s, m->sizes[d] > 1 ? m->sizes[d] : 1, &s)) s = INT64_MAX;
  }
}

int tcc_meta_is_contiguous(const tcc_meta *m) {
  int64_t want = 1;
  for (int d = m->rank - 1; d >= 0; d--) {
    if (m->sizes[d] > 1 && m->strides[d] != want) return 0;
    want *= m->sizes[d];
  }
  return 1;
}

void tcc_meta_contiguous(tcc_meta *m) {
  int64_t s = 1;
  for (int d = m->rank - 1; d >= 0; d--) {
    m->strides[d] = s;
    /* bounded: numel was checked (dynamic.c's probe sizes: saturates,
     * and the probe refuses such a tensor) */
    if (__builtin_mul_overflow(s, m->sizes[d] > 1 ? m->sizes[d] : 1, &s)) s = INT64_MAX;
  }
  m->offset = 0;
  m->numel = 1;
  for (int d = 0; d < m->rank; d++)
    if (__builtin_mul_overflow(m->numel, m->sizes[d], &m->numel)) m->numel = INT64_MAX;
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

/* ------------------------------------------------------ helpers */

/* The bound argument called `name` (NULL when the schema has none). */
const tcc_arg *tcc_node_arg(const tcc_node *n, const char *name) {
  int i = tcc_schema_param(&n->op->schema, name);
  return i < 0 ? NULL : &n->args[i];
}

#define ARG(name) tcc_node_arg(n, name)
#define BAD(...) tcc_error_set(err, TCC_E_INVALID_ARGUMENT, __VA_ARGS__)

static const tcc_meta *tensor_meta(const tcc_graph *g, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &g->values[a->v].meta : NULL;
}

/* Finishes an output: device, contiguous strides, numel; checks the
 * byte size fits int64. */
static int finish(const tcc_graph *g, tcc_meta *out, tcc_error *err) {
  int64_t numel = 1, bytes;
  out->device = g->target.device;
  for (int d = 0; d < out->rank; d++) {
    if (out->sizes[d] < 0) return BAD("negative size %lld in dim %d", (long long)out->sizes[d], d);
    if (__builtin_mul_overflow(numel, out->sizes[d], &numel))
      return BAD("element count overflows int64");
  }
  if (__builtin_mul_overflow(numel, (int64_t)8, &bytes)) return BAD("byte size overflows int64");
  tcc_meta_contiguous(out);
  return 0;
}

int tcc_norm_dim(int64_t d, int rank, int *out, tcc_error *err) {
  int r = rank > 0 ? rank : 1;
  if (d < -r || d >= r)
    return BAD("dim %lld out of range for a tensor of rank %d", (long long)d, rank);
  *out = (int)(d < 0 ? d + r : d);
  return 0;
}

/* The result dtype of a pointwise node without its output rule applied
 * (torch.result_type over the tensor and Scalar operands, not alpha). */
tcc_dtype tcc_operands_result_type(const tcc_graph *g, const tcc_node *n) {
  const tcc_schema *s = &n->op->schema;
  result_type rt = {0, 0, 0};
  for (int p = 0; p < n->nargs; p++) {
    const tcc_arg *a = &n->args[p];
    if (a->kind == TCC_ARG_TENSOR) {
      if (strcmp(s->params[p].name, "condition") == 0) continue;
      rt_tensor(&rt, &g->values[a->v].meta);
    } else if (s->params[p].type == TCC_PT_SCALAR && strcmp(s->params[p].name, "alpha") != 0 &&
               (a->kind == TCC_ARG_INT || a->kind == TCC_ARG_FLOAT || a->kind == TCC_ARG_BOOL)) {
      rt_scalar(&rt, a);
    }
  }
  tcc_dtype d = rt_result(&rt);
  return d ? d : TCC_DEFAULT_FLOAT;
}

/* ------------------------------------------------ pointwise variants */

int tcc_infer_compare(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int rc = pointwise_common(g, n, out, err);
  out->dtype = TCC__V1__DTYPE__BOOL;
  return rc;
}

int tcc_infer_logical(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  return tcc_infer_compare(g, n, out, err);
}

int tcc_infer_predicate(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  return tcc_infer_compare(g, n, out, err);
}

int tcc_infer_bitwise(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int rc = pointwise_common(g, n, out, err);
  if (rc) return rc;
  if (tcc_dtype_is_float(out->dtype))
    return BAD("bitwise ops need integer or bool operands, got %s", tcc_dtype_name(out->dtype));
  return 0;
}

int tcc_infer_div_mode(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_arg *m = ARG("rounding_mode");
  if (m && m->kind == TCC_ARG_STRING) {
    if (strcmp(m->s, "trunc") != 0 && strcmp(m->s, "floor") != 0)
      return BAD("rounding_mode must be 'trunc', 'floor' or None");
    return pointwise_common(g, n, out, err);
  }
  return tcc_infer_promote_float(g, n, out, err);
}

int tcc_infer_where(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int rc = pointwise_common(g, n, out, err);
  if (rc) return rc;
  out->dtype = tcc_operands_result_type(g, n);
  return 0;
}

int tcc_infer_same(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  if (!m) return BAD("expects a tensor");
  *out = *m;
  return finish(g, out, err);
}

int tcc_infer_to_copy(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int rc = tcc_infer_same(g, n, out, err);
  const tcc_arg *d = ARG("dtype");
  if (!rc && d && d->kind == TCC_ARG_DTYPE) out->dtype = (tcc_dtype)d->i;
  return rc;
}

/* ------------------------------------------------------- factories */

static tcc_dtype scalar_dtype(const tcc_arg *a) {
  return a->kind == TCC_ARG_FLOAT ? TCC_DEFAULT_FLOAT
       : a->kind == TCC_ARG_BOOL ? TCC__V1__DTYPE__BOOL : TCC__V1__DTYPE__INT64;
}

int tcc_infer_full(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_arg *size = ARG("size"), *fill = ARG("fill_value"), *s = ARG("s"), *dt = ARG("dtype");
  out->rank = 0;
  if (size) {
    if (size->n > TCC_MAX_DIMS) return BAD("rank %d exceeds %d", size->n, TCC_MAX_DIMS);
    out->rank = size->n;
    for (int d = 0; d < size->n; d++) out->sizes[d] = size->ints[d];
  }
  const tcc_arg *v = fill ? fill : s;
  out->dtype = dt && dt->kind == TCC_ARG_DTYPE ? (tcc_dtype)dt->i
             : v ? (s ? (v->kind == TCC_ARG_BOOL ? TCC__V1__DTYPE__BOOL : TCC_DEFAULT_FLOAT)
                      : scalar_dtype(v))
                 : TCC_DEFAULT_FLOAT;
  return finish(g, out, err);
}

int tcc_infer_full_like(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int rc = tcc_infer_same(g, n, out, err);
  const tcc_arg *dt = ARG("dtype");
  if (!rc && dt && dt->kind == TCC_ARG_DTYPE) out->dtype = (tcc_dtype)dt->i;
  return rc;
}

static double scalar_f(const tcc_arg *a) {
  return a->kind == TCC_ARG_FLOAT ? a->f : (double)a->i;
}

int tcc_infer_arange(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_arg *start = ARG("start"), *end = ARG("end"), *step = ARG("step"), *dt = ARG("dtype");
  int isf = end->kind == TCC_ARG_FLOAT || (start && start->kind == TCC_ARG_FLOAT) ||
            (step && step->kind == TCC_ARG_FLOAT);
  double a = start ? scalar_f(start) : 0, b = scalar_f(end), st = step ? scalar_f(step) : 1;
  if (st == 0 || !isfinite(a) || !isfinite(b) || !isfinite(st)) return BAD("arange: bad range");
  if ((st > 0 && b < a) || (st < 0 && b > a)) return BAD("arange: upper bound and step disagree");
  double len = ceil((b - a) / st);
  if (len > 9.0e15) return BAD("arange: too many elements");
  out->rank = 1;
  out->sizes[0] = (int64_t)len;
  out->dtype = dt && dt->kind == TCC_ARG_DTYPE ? (tcc_dtype)dt->i
             : isf ? TCC_DEFAULT_FLOAT : TCC__V1__DTYPE__INT64;
  return finish(g, out, err);
}

/* ------------------------------------------------------------ views */

/* Output sizes of reshaping m to `shape` (one -1 inferred). */
int tcc_reshape_sizes(const tcc_meta *m, const int64_t *shape, int n, int64_t *out,
                      tcc_error *err) {
  int infer = -1;
  int64_t known = 1;
  if (n > TCC_MAX_DIMS) return BAD("rank %d exceeds %d", n, TCC_MAX_DIMS);
  for (int d = 0; d < n; d++) {
    if (shape[d] == -1) {
      if (infer >= 0) return BAD("only one dim can be -1");
      infer = d;
    } else if (shape[d] < 0) {
      return BAD("invalid size %lld", (long long)shape[d]);
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      return BAD("size overflows");
    }
    out[d] = shape[d];
  }
  if (infer >= 0) {
    if (known == 0) return BAD("cannot infer -1 with other sizes 0");
    if (m->numel % known) return BAD("shape is invalid for input of size %lld", (long long)m->numel);
    out[infer] = m->numel / known;
    known = m->numel;
  }
  if (known != m->numel) {
    char b[200];
    return BAD("shape %s is invalid for input of size %lld", tcc_shape_str(out, n, b, sizeof b),
               (long long)m->numel);
  }
  return 0;
}

int tcc_infer_view(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *sz = &n->args[1];
  *out = *m;
  if (sz->kind != TCC_ARG_INTS) return BAD("size must be an int list");
  int rc = tcc_reshape_sizes(m, sz->ints, sz->n, out->sizes, err);
  if (rc) return rc;
  out->rank = sz->n;
  return finish(g, out, err);
}

int tcc_infer_permute(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *dims = ARG("dims");
  *out = *m;
  if (dims->n != m->rank) return BAD("permute: %d dims for rank %d", dims->n, m->rank);
  int seen[TCC_MAX_DIMS] = {0};
  for (int j = 0; j < dims->n; j++) {
    int d;
    int rc = tcc_norm_dim(dims->ints[j], m->rank, &d, err);
    if (rc) return rc;
    if (seen[d]++) return BAD("permute: dim %d repeated", d);
    out->sizes[j] = m->sizes[d];
  }
  return finish(g, out, err);
}

/* transpose.int and t: the two swapped dims. */
int tcc_transpose_dims(const tcc_graph *g, const tcc_node *n, int *d0, int *d1, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *a0 = ARG("dim0"), *a1 = ARG("dim1");
  if (!a0) {
    if (m->rank > 2) return BAD("t() expects a tensor with <= 2 dims");
    *d0 = 0;
    *d1 = m->rank == 2 ? 1 : 0;
    return 0;
  }
  int rc = tcc_norm_dim(a0->i, m->rank, d0, err);
  if (!rc) rc = tcc_norm_dim(a1->i, m->rank, d1, err);
  if (m->rank == 0) *d0 = *d1 = 0;
  return rc;
}

int tcc_infer_transpose(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  int d0, d1;
  int rc = tcc_transpose_dims(g, n, &d0, &d1, err);
  if (rc) return rc;
  *out = *m;
  if (m->rank) {
    out->sizes[d0] = m->sizes[d1];
    out->sizes[d1] = m->sizes[d0];
  }
  return finish(g, out, err);
}

int tcc_infer_expand(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *sz = ARG("size");
  if (sz->n < m->rank) return BAD("expand: %d sizes for rank %d", sz->n, m->rank);
  if (sz->n > TCC_MAX_DIMS) return BAD("rank %d exceeds %d", sz->n, TCC_MAX_DIMS);
  *out = *m;
  out->rank = sz->n;
  int lead = sz->n - m->rank;
  for (int d = 0; d < sz->n; d++) {
    int64_t want = sz->ints[d];
    if (d < lead) {
      if (want < 0) return BAD("expand: -1 in a new leading dim %d", d);
      out->sizes[d] = want;
      continue;
    }
    int64_t have = m->sizes[d - lead];
    if (want == -1) want = have;
    if (have != want && have != 1)
      return BAD("expand: size %lld must match %lld at dim %d (or be 1)", (long long)want,
                 (long long)have, d);
    out->sizes[d] = want;
  }
  return finish(g, out, err);
}

/* Which dims squeeze.* removes (mask bit d). */
uint32_t tcc_squeeze_mask(const tcc_graph *g, const tcc_node *n) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *dim = ARG("dim");
  uint32_t mask = 0;
  int r = m->rank > 0 ? m->rank : 1;
  if (!dim) {
    for (int d = 0; d < m->rank; d++)
      if (m->sizes[d] == 1) mask |= 1u << d;
  } else {
    int cnt = dim->kind == TCC_ARG_INTS ? dim->n : 1;
    for (int j = 0; j < cnt; j++) {
      int64_t dd = dim->kind == TCC_ARG_INTS ? dim->ints[j] : dim->i;
      if (dd < -r || dd >= r) continue;   /* checked in infer */
      int d = (int)(dd < 0 ? dd + r : dd);
      if (d < m->rank && m->sizes[d] == 1) mask |= 1u << d;
    }
  }
  return mask;
}

int tcc_infer_squeeze(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *dim = ARG("dim");
  if (dim) {
    int cnt = dim->kind == TCC_ARG_INTS ? dim->n : 1, d;
    for (int j = 0; j < cnt; j++) {
      int rc = tcc_norm_dim(dim->kind == TCC_ARG_INTS ? dim->ints[j] : dim->i, m->rank, &d, err);
      if (rc) return rc;
    }
  }
  uint32_t mask = tcc_squeeze_mask(g, n);
  *out = *m;
  out->rank = 0;
  for (int d = 0; d < m->rank; d++)
    if (!(mask & (1u << d))) out->sizes[out->rank++] = m->sizes[d];
  return finish(g, out, err);
}

int tcc_infer_unsqueeze(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  int d;
  if (m->rank >= TCC_MAX_DIMS) return BAD("rank exceeds %d", TCC_MAX_DIMS);
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank + 1, &d, err);
  if (rc) return rc;
  *out = *m;
  out->rank = m->rank + 1;
  for (int k = 0, j = 0; k < out->rank; k++) out->sizes[k] = k == d ? 1 : m->sizes[j++];
  return finish(g, out, err);
}

/* slice.Tensor's clamped start and output length along its dim. */
int tcc_slice_params(const tcc_graph *g, const tcc_node *n, int *dim, int64_t *start,
                     int64_t *len, int64_t *step, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  if (m->rank == 0) return BAD("slice() cannot be applied to a 0-dim tensor");
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, dim, err);
  if (rc) return rc;
  const tcc_arg *s = ARG("start"), *e = ARG("end");
  int64_t size = m->sizes[*dim];
  *step = ARG("step")->i;
  if (*step <= 0) return BAD("slice step must be positive");
  int64_t a = s->kind == TCC_ARG_INT ? s->i : 0;
  int64_t b = e->kind == TCC_ARG_INT ? e->i : INT64_MAX;
  if (a < 0) a = a + size < 0 ? 0 : a + size;
  if (b < 0) b = b + size < 0 ? 0 : b + size;
  if (a > size) a = size;
  if (b > size) b = size;
  if (b < a) b = a;
  *start = a;
  *len = (b - a + *step - 1) / *step;
  return 0;
}

int tcc_infer_slice(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int dim;
  int64_t start, len, step;
  int rc = tcc_slice_params(g, n, &dim, &start, &len, &step, err);
  if (rc) return rc;
  *out = *tensor_meta(g, &n->args[0]);
  out->sizes[dim] = len;
  return finish(g, out, err);
}

int tcc_select_params(const tcc_graph *g, const tcc_node *n, int *dim, int64_t *index,
                      tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  if (m->rank == 0) return BAD("select() cannot be applied to a 0-dim tensor");
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, dim, err);
  if (rc) return rc;
  int64_t i = ARG("index")->i, size = m->sizes[*dim];
  if (i < -size || i >= size)
    return BAD("select(): index %lld out of range for size %lld", (long long)i, (long long)size);
  *index = i < 0 ? i + size : i;
  return 0;
}

int tcc_infer_select(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  int dim;
  int64_t index;
  int rc = tcc_select_params(g, n, &dim, &index, err);
  if (rc) return rc;
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  *out = *m;
  out->rank = m->rank - 1;
  for (int d = dim; d < out->rank; d++) out->sizes[d] = m->sizes[d + 1];
  return finish(g, out, err);
}

int tcc_infer_as_strided(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *sz = ARG("size"), *st = ARG("stride");
  if (sz->n != st->n) return BAD("as_strided: %d sizes, %d strides", sz->n, st->n);
  if (sz->n > TCC_MAX_DIMS) return BAD("rank exceeds %d", TCC_MAX_DIMS);
  *out = *m;
  out->rank = sz->n;
  for (int d = 0; d < sz->n; d++) {
    if (st->ints[d] < 0) return BAD("as_strided: negative stride");
    out->sizes[d] = sz->ints[d];
  }
  return finish(g, out, err);
}

/* as_strided_scatter: self's meta; src has the view's sizes (as in eager)
 * and the view stays inside self's storage (self's elements, row-major:
 * eager scatters into a clone of self). */
int tcc_infer_as_strided_scatter(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                 tcc_error *err) {
  const tcc_meta *self = tensor_meta(g, ARG("self")), *src = tensor_meta(g, ARG("src"));
  const tcc_arg *sz = ARG("size"), *st = ARG("stride"), *off = ARG("storage_offset");
  if (sz->n != st->n) return BAD("as_strided_scatter: %d sizes, %d strides", sz->n, st->n);
  if (src->rank != sz->n) return BAD("as_strided_scatter: src has %d dims, the view %d",
                                     src->rank, sz->n);
  int64_t o = off->kind == TCC_ARG_INT ? off->i : 0, numel = 1;
  if (o < 0) return BAD("as_strided_scatter: negative storage offset");
  __int128 reach = o;
  for (int d = 0; d < sz->n; d++) {
    if (st->ints[d] < 0) return BAD("as_strided_scatter: negative stride");
    if (sz->ints[d] != src->sizes[d])
      return BAD("as_strided_scatter: src size %lld in dim %d, the view's %lld",
                 (long long)src->sizes[d], d, (long long)sz->ints[d]);
    numel *= sz->ints[d];
    if (sz->ints[d] > 0) reach += (__int128)(sz->ints[d] - 1) * st->ints[d];
  }
  if (numel && reach >= self->numel)
    return BAD("as_strided_scatter: the view reaches element %lld of %lld", (long long)reach,
               (long long)self->numel);
  *out = *self;
  return finish(g, out, err);
}

/* copy(self, src): self's meta, src broadcast to it. */
int tcc_infer_copy_into(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *self = tensor_meta(g, ARG("self")), *src = tensor_meta(g, ARG("src"));
  if (src->rank > self->rank)
    return BAD("copy: src of %d dims does not broadcast to %d", src->rank, self->rank);
  for (int d = 1; d <= src->rank; d++) {
    int64_t a = src->sizes[src->rank - d], b = self->sizes[self->rank - d];
    if (a != b && a != 1)
      return BAD("copy: src size %lld does not broadcast to %lld", (long long)a, (long long)b);
  }
  *out = *self;
  return finish(g, out, err);
}

/* --------------------------------------------- cat, pad, indexing */

int tcc_infer_cat(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_arg *ts = ARG("tensors");
  const tcc_meta *ref = NULL;
  tcc_dtype dt = 0;
  for (int j = 0; j < ts->n; j++) {
    const tcc_meta *m = &g->values[ts->vals[j]].meta;
    dt = dt ? tcc_dtype_promote(dt, m->dtype) : m->dtype;
    if (m->rank == 1 && m->sizes[0] == 0) continue;   /* legacy: skipped */
    if (!ref) ref = m;
  }
  if (!ts->n) return BAD("cat: expected a non-empty list of tensors");
  if (!ref) ref = &g->values[ts->vals[0]].meta;
  if (ref->rank == 0) return BAD("cat: zero-dimensional tensor cannot be concatenated");
  int dim;
  int rc = tcc_norm_dim(ARG("dim")->i, ref->rank, &dim, err);
  if (rc) return rc;
  *out = *ref;
  out->dtype = dt;
  out->sizes[dim] = 0;
  for (int j = 0; j < ts->n; j++) {
    const tcc_meta *m = &g->values[ts->vals[j]].meta;
    if (m->rank == 1 && m->sizes[0] == 0 && ref->rank != 1) continue;
    if (m->rank != ref->rank) return BAD("cat: tensor %d has rank %d, expected %d", j, m->rank, ref->rank);
    for (int d = 0; d < m->rank; d++)
      if (d != dim && m->sizes[d] != ref->sizes[d])
        return BAD("cat: sizes of tensors must match except in dimension %d (tensor %d, dim %d)",
                   dim, j, d);
    out->sizes[dim] += m->sizes[dim];
  }
  return finish(g, out, err);
}

int tcc_infer_pad(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *pad = ARG("pad");
  if (pad->n % 2 || pad->n / 2 > m->rank) return BAD("constant_pad_nd: bad pad length %d", pad->n);
  *out = *m;
  for (int j = 0; j < pad->n / 2; j++) {
    int d = m->rank - 1 - j;
    int64_t s = m->sizes[d] + pad->ints[2 * j] + pad->ints[2 * j + 1];
    if (s < 0) return BAD("constant_pad_nd: resulting size of dim %d is negative", d);
    out->sizes[d] = s;
  }
  return finish(g, out, err);
}

static int index_dtype_ok(const tcc_meta *m) {
  return m->dtype == TCC__V1__DTYPE__INT64 || m->dtype == TCC__V1__DTYPE__INT32;
}

int tcc_infer_index_select(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]), *ix = tensor_meta(g, ARG("index"));
  int dim;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  if (ix->rank > 1 || !index_dtype_ok(ix)) return BAD("index_select: index must be a 1-D int tensor");
  *out = *m;
  if (m->rank) out->sizes[dim] = ix->numel;
  return finish(g, out, err);
}

int tcc_infer_gather(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]), *ix = tensor_meta(g, ARG("index"));
  int dim;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  if (ix->dtype != TCC__V1__DTYPE__INT64) return BAD("gather: index must be int64");
  if (ix->rank != m->rank && !(m->rank == 0 && ix->rank <= 1))
    return BAD("gather: index rank %d differs from input rank %d", ix->rank, m->rank);
  for (int d = 0; d < ix->rank && d < m->rank; d++)
    if (d != dim && ix->sizes[d] > m->sizes[d]) return BAD("gather: index too large in dim %d", d);
  *out = *ix;
  out->dtype = m->dtype;
  return finish(g, out, err);
}

int tcc_index_layout_of(const tcc_graph *g, const tcc_node *n, tcc_index_layout *l,
                        tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *ix = ARG("indices");
  if (ix->n > m->rank)
    return BAD("index: too many indices (%d) for a tensor of rank %d", ix->n, m->rank);
  l->first = -1;
  l->count = 0;
  l->rank = 0;
  int last = -1;
  for (int k = 0; k < ix->n; k++) {
    if (ix->vals[k] < 0) continue;
    const tcc_meta *t = &g->values[ix->vals[k]].meta;
    if (t->dtype == TCC__V1__DTYPE__BOOL || t->dtype == TCC__V1__DTYPE__UINT8)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "boolean mask indices (their result size "
                           "depends on the data)");
    if (!index_dtype_ok(t)) return BAD("index: indices %d must be int32 or int64", k);
    if (l->first < 0) l->first = k;
    else if (last != k - 1)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index tensors in dims that are not "
                           "adjacent (None between them)");
    last = k;
    int64_t b[TCC_MAX_DIMS];
    int rb;
    int rc = tcc_broadcast(l->sizes, l->rank, t->sizes, t->rank, b, &rb, err);
    if (rc) return rc;
    memcpy(l->sizes, b, sizeof b);
    l->rank = rb;
  }
  if (l->first < 0) return BAD("index: no index tensor (all None)");
  l->count = last - l->first + 1;
  if (m->rank - l->count + l->rank > TCC_MAX_DIMS) return BAD("rank exceeds %d", TCC_MAX_DIMS);
  return 0;
}

int tcc_infer_index(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  tcc_index_layout l;
  int rc = tcc_index_layout_of(g, n, &l, err);
  if (rc) return rc;
  *out = *m;
  out->rank = 0;
  for (int d = 0; d < l.first; d++) out->sizes[out->rank++] = m->sizes[d];
  for (int d = 0; d < l.rank; d++) out->sizes[out->rank++] = l.sizes[d];
  for (int d = l.first + l.count; d < m->rank; d++) out->sizes[out->rank++] = m->sizes[d];
  return finish(g, out, err);
}

/* index_put's integer form: one 1-D index tensor mm at dim pos of self
 * (m), values v broadcastable to the indexed shape (self's sizes with
 * dim pos's replaced by the index's length). */
static int integer_index_form(const tcc_meta *m, const tcc_meta *mm, const tcc_meta *v, int pos,
                              tcc_error *err) {
  if (!index_dtype_ok(mm)) return BAD("index_put: indices must be bool, int32 or int64");
  if (mm->rank != 1)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put with a %d-D index tensor", mm->rank);
  if (v->rank > m->rank) return BAD("index_put: values of rank %d for a tensor of rank %d", v->rank, m->rank);
  for (int dv = 0; dv < v->rank; dv++) {
    int d = dv + m->rank - v->rank;
    int64_t want = d == pos ? mm->sizes[0] : m->sizes[d];
    if (v->sizes[dv] != 1 && v->sizes[dv] != want)
      return BAD("index_put: values' size %" PRId64 " in dim %d does not broadcast to %" PRId64,
                 v->sizes[dv], dv, want);
  }
  return 0;
}

/* index_put with one boolean mask over self's leading dims and a value
 * of one element (x[x == 0] = 1, the masked assignment numpy programs
 * write): out = mask ? value : self (accumulate: self + value), a
 * pointwise select. Integer indices and multi-element values write
 * positions that depend on the data: UNIMPLEMENTED, so the client runs
 * them eagerly. */
/* Two forms compile, both selects over self (lower.c):
 *  - one boolean mask over leading dims and a one-element value
 *    (x[mask] = v);
 *  - one 1-D integer index tensor of at most TCC_INDEX_PUT_MAX entries in
 *    any position, values broadcastable to the indexed shape (self's
 *    sizes with that dim's replaced by the index's length): index_copy_,
 *    a StaticCache's update at the decoded position.
 * Other forms write where the data says in ways a select of this size
 * cannot follow: UNIMPLEMENTED (they run eagerly). */
int tcc_infer_index_put(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]), *v = tensor_meta(g, ARG("values"));
  const tcc_arg *ix = ARG("indices");
  if (!m || !v) return BAD("index_put: self and values must be tensors");
  if (ix->n > m->rank) return BAD("index_put: %d indices for a tensor of rank %d", ix->n, m->rank);
  int pos = -1;
  for (int k = 0; k < ix->n; k++) {
    if (ix->vals[k] < 0) continue;
    if (pos >= 0)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put: more than one index tensor");
    pos = k;
  }
  if (pos < 0) return BAD("index_put: no index tensor (all None)");
  const tcc_meta *mm = &g->values[ix->vals[pos]].meta;
  if (mm->dtype == TCC__V1__DTYPE__BOOL) {
    if (pos != 0)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put: a boolean mask after a None index");
    if (mm->rank > m->rank) return BAD("index_put: mask of rank %d for a tensor of rank %d", mm->rank, m->rank);
    for (int d = 0; d < mm->rank; d++)
      if (mm->sizes[d] != m->sizes[d])
        return BAD("index_put: the mask's size %" PRId64 " in dim %d differs from the tensor's %" PRId64,
                   mm->sizes[d], d, m->sizes[d]);
    if (v->numel != 1)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put of %" PRId64 " values (one value per "
                           "selected element: which goes where depends on the mask)", v->numel);
  } else {
    int rc = integer_index_form(m, mm, v, pos, err);
    if (rc) return rc;
    if (mm->sizes[0] > TCC_INDEX_PUT_MAX)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put of %" PRId64 " positions (a select "
                           "compiles up to %d)", mm->sizes[0], TCC_INDEX_PUT_MAX);
  }
  *out = *m;
  return finish(g, out, err);
}

/* index_put_ into a graph input, written where it lies (a StaticCache's
 * index_copy_ at the decoded position, the client's write_in_place):
 * one 1-D integer index tensor, any number of positions, no
 * accumulate, and self a graph input read by nothing else in the graph
 * (verify.c) -- its one use is this node, whose result every reader of
 * the new contents reads, so program order on that value orders the
 * write before them and no reader can see the write early or late
 * (lower.c). The rest runs eagerly: UNIMPLEMENTED. */
int tcc_infer_index_put_input(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]), *v = tensor_meta(g, ARG("values"));
  const tcc_arg *ix = ARG("indices"), *acc = ARG("accumulate");
  if (!m || !v) return BAD("index_put_: self and values must be tensors");
  /* self: a graph input read nowhere else (verify.c checked) */
  if (acc && acc->i) return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put_ with accumulate=True");
  if (ix->n > m->rank) return BAD("index_put_: %d indices for a tensor of rank %d", ix->n, m->rank);
  int pos = -1;
  for (int k = 0; k < ix->n; k++) {
    if (ix->vals[k] < 0) continue;
    if (pos >= 0) return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put_: more than one index tensor");
    pos = k;
  }
  if (pos < 0) return BAD("index_put_: no index tensor (all None)");
  const tcc_meta *mm = &g->values[ix->vals[pos]].meta;
  if (mm->dtype == TCC__V1__DTYPE__BOOL)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put_ with a boolean mask");
  int rc = integer_index_form(m, mm, v, pos, err);
  if (rc) return rc;
  if (m->sizes[pos] == 0)
    return mm->sizes[0] ? BAD("index_put_: index into dim %d of size 0", pos)
                        : tcc_error_set(err, TCC_E_UNIMPLEMENTED, "index_put_ of nothing into an empty dim");
  *out = *m;
  return finish(g, out, err);
}

/* scatter(self, dim, index, value): self with value written at
 * index[i][j]... along dim; index as gather's (same rank, no larger than
 * self outside dim), at most TCC_INDEX_PUT_MAX entries along dim (the
 * one-hot of a loss's backward has 1). */
int tcc_infer_scatter(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]), *ix = tensor_meta(g, ARG("index"));
  int dim;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &dim, err);
  if (rc) return rc;
  if (ix->dtype != TCC__V1__DTYPE__INT64) return BAD("scatter: index must be int64");
  if (ix->rank != m->rank || m->rank == 0)
    return BAD("scatter: index rank %d differs from self's %d", ix->rank, m->rank);
  for (int d = 0; d < m->rank; d++)
    if (d != dim && ix->sizes[d] > m->sizes[d]) return BAD("scatter: index too large in dim %d", d);
  if (ix->sizes[dim] > TCC_INDEX_PUT_MAX)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "scatter of %" PRId64 " entries along dim %d (a "
                         "select compiles up to %d)", ix->sizes[dim], dim, TCC_INDEX_PUT_MAX);
  *out = *m;
  return finish(g, out, err);
}

int tcc_infer_embedding(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *w = tensor_meta(g, ARG("weight")), *ix = tensor_meta(g, ARG("indices"));
  if (w->rank != 2) return BAD("embedding: weight must be 2-D");
  if (!index_dtype_ok(ix)) return BAD("embedding: indices must be int32 or int64");
  if (ix->rank + 1 > TCC_MAX_DIMS) return BAD("rank exceeds %d", TCC_MAX_DIMS);
  *out = *ix;
  out->dtype = w->dtype;
  out->rank = ix->rank + 1;
  out->sizes[ix->rank] = w->sizes[1];
  return finish(g, out, err);
}

int tcc_infer_embedding_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                 tcc_error *err) {
  const tcc_meta *gr = tensor_meta(g, ARG("grad_output")), *ix = tensor_meta(g, ARG("indices"));
  if (!index_dtype_ok(ix)) return BAD("embedding_dense_backward: indices must be int");
  if (gr->rank != ix->rank + 1) return BAD("embedding_dense_backward: grad rank mismatch");
  out->rank = 2;
  out->sizes[0] = ARG("num_weights")->i;
  out->sizes[1] = gr->sizes[gr->rank - 1];
  out->dtype = gr->dtype;
  return finish(g, out, err);
}

/* ------------------------------------------------------ reductions */

int tcc_reduce_dims(const tcc_graph *g, const tcc_node *n, uint32_t *mask, int *keepdim,
                    tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  const tcc_arg *dim = ARG("dim"), *kd = ARG("keepdim");
  *keepdim = kd && kd->kind == TCC_ARG_BOOL ? (int)kd->i : 0;
  *mask = 0;
  int all = !dim || dim->kind == TCC_ARG_NONE || (dim->kind == TCC_ARG_INTS && dim->n == 0);
  if (all) {
    *mask = m->rank ? (uint32_t)((1ull << m->rank) - 1) : 0;
    return 0;
  }
  int cnt = dim->kind == TCC_ARG_INTS ? dim->n : 1;
  for (int j = 0; j < cnt; j++) {
    int d;
    int rc = tcc_norm_dim(dim->kind == TCC_ARG_INTS ? dim->ints[j] : dim->i, m->rank, &d, err);
    if (rc) return rc;
    if (*mask & (1u << d)) return BAD("dim %d appears multiple times in the list of dims", d);
    if (m->rank) *mask |= 1u << d;
  }
  return 0;
}

static int64_t reduced_numel(const tcc_meta *m, uint32_t mask) {
  int64_t r = 1;
  for (int d = 0; d < m->rank; d++)
    if (mask & (1u << d)) r *= m->sizes[d];
  return r;
}

static void reduced_shape(const tcc_meta *m, uint32_t mask, int keepdim, tcc_meta *out) {
  out->rank = 0;
  for (int d = 0; d < m->rank; d++) {
    if (mask & (1u << d)) {
      if (keepdim) out->sizes[out->rank++] = 1;
    } else {
      out->sizes[out->rank++] = m->sizes[d];
    }
  }
}

int tcc_infer_reduce(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  uint32_t mask;
  int keepdim;
  int rc = tcc_reduce_dims(g, n, &mask, &keepdim, err);
  if (rc) return rc;
  const tcc_arg *dt = ARG("dtype");
  tcc_dtype in = m->dtype, res = in;
  switch (n->op->id) {
  case TCC_OP_SUM: case TCC_OP_SUM_DIM: case TCC_OP_PROD: case TCC_OP_PROD_DIM:
    res = dt && dt->kind == TCC_ARG_DTYPE ? (tcc_dtype)dt->i
        : tcc_dtype_is_float(in) ? in : TCC__V1__DTYPE__INT64;
    break;
  case TCC_OP_MEAN: case TCC_OP_MEAN_DIM:
    res = dt && dt->kind == TCC_ARG_DTYPE ? (tcc_dtype)dt->i : in;
    if (!tcc_dtype_is_float(res))
      return BAD("mean(): could not infer output dtype: input dtype should be floating point, got %s",
                 tcc_dtype_name(res));
    break;
  case TCC_OP_ARGMAX: case TCC_OP_ARGMIN: res = TCC__V1__DTYPE__INT64; break;
  case TCC_OP_ANY: case TCC_OP_ANY_DIM: case TCC_OP_ANY_DIMS:
  case TCC_OP_ALL: case TCC_OP_ALL_DIM: case TCC_OP_ALL_DIMS:
    res = in == TCC__V1__DTYPE__UINT8 ? in : TCC__V1__DTYPE__BOOL;
    break;
  case TCC_OP_VAR: case TCC_OP_STD: case TCC_OP_VAR_MEAN: case TCC_OP_LOGSUMEXP:
    if (!tcc_dtype_is_float(in)) {
      if (n->op->id != TCC_OP_LOGSUMEXP) return BAD("std and var only support floating point inputs");
      res = TCC_DEFAULT_FLOAT;
    }
    break;
  default: break;
  }
  if ((n->op->id == TCC_OP_MAX || n->op->id == TCC_OP_MIN || n->op->id == TCC_OP_MAX_DIM ||
       n->op->id == TCC_OP_MIN_DIM || n->op->id == TCC_OP_AMAX || n->op->id == TCC_OP_AMIN ||
       n->op->id == TCC_OP_ARGMAX || n->op->id == TCC_OP_ARGMIN) && reduced_numel(m, mask) == 0)
    return BAD("cannot reduce over an empty tensor: the operation has no identity");
  out->dtype = res;
  if ((n->op->id == TCC_OP_ARGMAX || n->op->id == TCC_OP_ARGMIN) &&
      ARG("dim")->kind == TCC_ARG_NONE) {
    out->rank = 0;
    if (keepdim) {
      out->rank = m->rank;
      for (int d = 0; d < m->rank; d++) out->sizes[d] = 1;
    }
  } else {
    reduced_shape(m, mask, keepdim, out);
  }
  int nout = n->nout;
  rc = finish(g, out, err);
  if (rc) return rc;
  for (int o = 1; o < nout; o++) {
    out[o] = out[0];
    if (n->op->id == TCC_OP_MAX_DIM || n->op->id == TCC_OP_MIN_DIM) {
      out[o].dtype = TCC__V1__DTYPE__INT64;
    }
  }
  return 0;
}

/* --------------------------------------------- decomposed composites */

/* cumsum: the input's shape; integers and bool sum as int64 unless a
 * dtype is given (PyTorch's rule). */
int tcc_infer_cumsum(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  int d;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &d, err);
  if (rc) return rc;
  *out = *m;
  const tcc_arg *dt = ARG("dtype");
  if (dt && dt->kind == TCC_ARG_DTYPE) out->dtype = (tcc_dtype)dt->i;
  else if (!tcc_dtype_is_float(m->dtype)) out->dtype = TCC__V1__DTYPE__INT64;
  return finish(g, out, err);
}

int tcc_infer_softmax(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, &n->args[0]);
  int d;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &d, err);
  if (rc) return rc;
  *out = *m;
  const tcc_arg *h = ARG("half_to_float"), *dt = ARG("dtype");
  if (!tcc_dtype_is_float(m->dtype) && !(dt && dt->kind == TCC_ARG_DTYPE))
    return BAD("softmax needs a floating point input, got %s", tcc_dtype_name(m->dtype));
  if (h && h->i) out->dtype = TCC__V1__DTYPE__FLOAT32;
  if (dt && dt->kind == TCC_ARG_DTYPE) out->dtype = (tcc_dtype)dt->i;
  return finish(g, out, err);
}

int tcc_infer_softmax_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                               tcc_error *err) {
  const tcc_meta *m = tensor_meta(g, ARG("grad_output")), *y = tensor_meta(g, ARG("output"));
  int d;
  int rc = tcc_norm_dim(ARG("dim")->i, m->rank, &d, err);
  if (rc) return rc;
  if (m->rank != y->rank) return BAD("grad_output and output shapes differ");
  for (int k = 0; k < m->rank; k++)
    if (m->sizes[k] != y->sizes[k]) return BAD("grad_output and output shapes differ");
  *out = *m;
  out->dtype = (tcc_dtype)ARG("input_dtype")->i;
  return finish(g, out, err);
}

/* The first normalized dim of a layer norm (rank - len(normalized_shape)). */
int tcc_norm_axis(const tcc_meta *m, const tcc_arg *shape, tcc_error *err) {
  if (shape->n > m->rank || shape->n == 0) return BAD("normalized_shape has %d dims for rank %d", shape->n, m->rank), -1;
  int axis = m->rank - shape->n;
  for (int j = 0; j < shape->n; j++)
    if (m->sizes[axis + j] != shape->ints[j]) {
      BAD("normalized_shape does not match the input's trailing sizes");
      return -1;
    }
  return axis;
}

static int check_param(const tcc_graph *g, const tcc_arg *a, const tcc_meta *x, int axis,
                       const char *what, tcc_error *err) {
  const tcc_meta *w = tensor_meta(g, a);
  if (!w) return 0;
  if (w->rank != x->rank - axis) return BAD("%s must have the normalized shape", what);
  for (int d = 0; d < w->rank; d++)
    if (w->sizes[d] != x->sizes[axis + d]) return BAD("%s must have the normalized shape", what);
  return 0;
}

int tcc_infer_layer_norm(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *x = tensor_meta(g, ARG("input"));
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  if (!tcc_dtype_is_float(x->dtype)) return BAD("layer norm needs a floating point input");
  int rc = check_param(g, ARG("weight"), x, axis, "weight", err);
  if (!rc && ARG("bias")) rc = check_param(g, ARG("bias"), x, axis, "bias", err);
  if (rc) return rc;
  out[0] = *x;
  if ((rc = finish(g, &out[0], err))) return rc;
  for (int o = 1; o < n->nout; o++) {   /* mean, rstd: [..., 1, 1] */
    out[o] = *x;
    for (int d = axis; d < x->rank; d++) out[o].sizes[d] = 1;
    if ((rc = finish(g, &out[o], err))) return rc;
  }
  return 0;
}

int tcc_infer_layer_norm_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                                  tcc_error *err) {
  const tcc_meta *x = tensor_meta(g, ARG("input")), *go = tensor_meta(g, ARG("grad_out"));
  int axis = tcc_norm_axis(x, ARG("normalized_shape"), err);
  if (axis < 0) return err->code;
  if (go->rank != x->rank) return BAD("grad_out and input shapes differ");
  for (int d = 0; d < x->rank; d++)
    if (go->sizes[d] != x->sizes[d]) return BAD("grad_out and input shapes differ");
  const tcc_meta *w = tensor_meta(g, ARG("weight")), *b = tensor_meta(g, ARG("bias"));
  int rc = check_param(g, ARG("weight"), x, axis, "weight", err);
  if (rc) return rc;
  out[0] = *x;
  if ((rc = finish(g, &out[0], err))) return rc;
  for (int o = 1; o < 3 && o < n->nout; o++) {
    const tcc_meta *src = o == 1 ? w : b;
    if (!src) src = w ? w : b;
    if (src) {
      out[o] = *src;
    } else {
      out[o] = *x;
      out[o].rank = x->rank - axis;
      for (int d = 0; d < out[o].rank; d++) out[o].sizes[d] = x->sizes[axis + d];
    }
    out[o].dtype = x->dtype;
    if ((rc = finish(g, &out[o], err))) return rc;
  }
  return 0;
}

int tcc_infer_batch_norm(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *x = tensor_meta(g, ARG("input"));
  if (x->rank < 2) return BAD("batch norm needs an input of rank >= 2");
  int64_t c = x->sizes[1];
  const char *names[] = {"weight", "bias", "running_mean", "running_var"};
  for (int j = 0; j < 4; j++) {
    const tcc_meta *m = tensor_meta(g, ARG(names[j]));
    if (m && (m->rank != 1 || m->sizes[0] != c)) return BAD("%s must have %lld elements", names[j], (long long)c);
  }
  out[0] = *x;
  int rc = finish(g, &out[0], err);
  for (int o = 1; o < n->nout && !rc; o++) {
    out[o] = *x;
    out[o].rank = 1;
    out[o].sizes[0] = 0;
    rc = finish(g, &out[o], err);
  }
  return rc;
}

/* ------------------------------------------------------------ matmul */

int tcc_infer_matmul(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_arg *a0 = &n->args[0], *a1 = &n->args[1];
  const tcc_meta *A, *B;
  tcc_op_id id = n->op->id;
  if (id == TCC_OP_ADDMM) {
    A = tensor_meta(g, ARG("mat1"));
    B = tensor_meta(g, ARG("mat2"));
  } else {
    A = tensor_meta(g, a0);
    B = tensor_meta(g, a1);
  }
  if (A->dtype != B->dtype)
    return BAD("expected both operands to have the same dtype, got %s and %s",
               tcc_dtype_name(A->dtype), tcc_dtype_name(B->dtype));
  out->dtype = A->dtype;
  switch (id) {
  case TCC_OP_MM:
  case TCC_OP_ADDMM:
    if (A->rank != 2 || B->rank != 2) return BAD("mm: both operands must be 2-D");
    if (A->sizes[1] != B->sizes[0])
      return BAD("mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                 (long long)A->sizes[0], (long long)A->sizes[1], (long long)B->sizes[0],
                 (long long)B->sizes[1]);
    out->rank = 2;
    out->sizes[0] = A->sizes[0];
    out->sizes[1] = B->sizes[1];
    if (id == TCC_OP_ADDMM) {
      const tcc_meta *bias = tensor_meta(g, a0);
      int64_t tmp[TCC_MAX_DIMS];
      int r;
      int rc = tcc_broadcast(bias->sizes, bias->rank, out->sizes, 2, tmp, &r, err);
      if (rc) return rc;
      if (r != 2 || tmp[0] != out->sizes[0] || tmp[1] != out->sizes[1])
        return BAD("addmm: self must broadcast to the result");
      out->dtype = tcc_dtype_promote(bias->dtype, A->dtype);
      if (bias->dtype != A->dtype) return BAD("addmm: self and mat1 dtypes differ");
    }
    break;
  case TCC_OP_BMM:
    if (A->rank != 3 || B->rank != 3) return BAD("bmm: both operands must be 3-D");
    if (A->sizes[0] != B->sizes[0] || A->sizes[2] != B->sizes[1])
      return BAD("bmm: shapes cannot be multiplied");
    out->rank = 3;
    out->sizes[0] = A->sizes[0];
    out->sizes[1] = A->sizes[1];
    out->sizes[2] = B->sizes[2];
    break;
  case TCC_OP_LINEAR: {
    if (B->rank != 2 && B->rank != 1) return BAD("linear: weight must be 1-D or 2-D");
    if (A->rank < 1) return BAD("linear: input must have at least 1 dim");
    int64_t k = B->sizes[B->rank - 1];
    if (A->sizes[A->rank - 1] != k) return BAD("linear: input and weight shapes cannot be multiplied");
    *out = *A;
    if (B->rank == 2) out->sizes[A->rank - 1] = B->sizes[0];
    else out->rank = A->rank - 1;
    const tcc_meta *bias = tensor_meta(g, ARG("bias"));
    if (bias) {
      int64_t tmp[TCC_MAX_DIMS];
      int r;
      int rc = tcc_broadcast(bias->sizes, bias->rank, out->sizes, out->rank, tmp, &r, err);
      if (rc) return rc;
      if (r != out->rank) return BAD("linear: bias must broadcast to the result");
      if (bias->dtype != A->dtype) return BAD("linear: bias dtype differs");
    }
    out->dtype = A->dtype;
    break;
  }
  case TCC_OP_MATMUL: {
    if (A->rank == 0 || B->rank == 0) return BAD("matmul: both arguments need at least 1 dim");
    int64_t ka = A->sizes[A->rank - 1];
    int64_t kb = B->rank == 1 ? B->sizes[0] : B->sizes[B->rank - 2];
    if (ka != kb) return BAD("matmul: shapes cannot be multiplied");
    int64_t ba[TCC_MAX_DIMS], bb[TCC_MAX_DIMS];
    int ra = A->rank > 2 ? A->rank - 2 : 0, rb = B->rank > 2 ? B->rank - 2 : 0, r;
    memcpy(ba, A->sizes, sizeof(int64_t) * (size_t)ra);
    memcpy(bb, B->sizes, sizeof(int64_t) * (size_t)rb);
    int rc = tcc_broadcast(ba, ra, bb, rb, out->sizes, &r, err);
    if (rc) return rc;
    out->rank = r;
    if (A->rank >= 2) out->sizes[out->rank++] = A->sizes[A->rank - 2];
    if (B->rank >= 2) out->sizes[out->rank++] = B->sizes[B->rank - 1];
    if (out->rank > TCC_MAX_DIMS) return BAD("rank exceeds %d", TCC_MAX_DIMS);
    break;
  }
  default: return BAD("not a matmul");
  }
  return finish(g, out, err);
}

int tcc_infer_batch_norm_train(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                               tcc_error *err) {
  int rc = tcc_infer_batch_norm(g, n, out, err);
  if (rc) return rc;
  const tcc_meta *x = tensor_meta(g, ARG("input")), *rm = tensor_meta(g, ARG("running_mean"));
  int training = (int)ARG("training")->i;
  /* what PyTorch declares: saved statistics in the input's dtype on the
   * CPU, in its computation dtype on CUDA (float32 for float16/bfloat16
   * inputs: torch._decomp's native_batch_norm_helper casts them back on
   * the CPU only), as autocast's ResNet-50 training graphs carry them */
  tcc_dtype acc = x->dtype;
  if (g->target.device == TCC__V1__DEVICE_TYPE__CUDA &&
      (x->dtype == TCC__V1__DTYPE__FLOAT16 || x->dtype == TCC__V1__DTYPE__BFLOAT16))
    acc = TCC__V1__DTYPE__FLOAT32;
  for (int o = 1; o < n->nout && o < 5; o++) {
    out[o] = *rm;
    out[o].dtype = tcc_dtype_promote(rm->dtype, x->dtype);
    if (o < 3) {
      out[o].dtype = training ? acc : x->dtype;
      if (!training) out[o].sizes[0] = 0;
    }
    if ((rc = finish(g, &out[o], err))) return rc;
  }
  return 0;
}
