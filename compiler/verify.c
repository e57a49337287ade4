/*
 * verify.c — every check a CompileRequest must pass, in one place.
 *
 * Requires: nothing (the request may be any protobuf-c message, decoded
 * from the wire or built by hand; NULL strings read as "").
 * Produces: a verified graph in request node order whose values are the
 * request's declared TensorValues (value id = declaration index; those
 * nothing defines stay TCC_VAL_UNDEFINED) and whose nodes have their
 * arguments bound to schema parameters.
 *
 * Order of checks (the first failure is reported):
 *   1. limits (RESOURCE_EXHAUSTED), graph/target presence
 *   2. target and options
 *   3. value names unique; every TensorMeta valid
 *   4. definitions: graph inputs, constants, node outputs each define a
 *      declared value exactly once; constant data matches its meta
 *   5. nodes: known op (else UNIMPLEMENTED), arguments bound by name or
 *      position with types checked and defaults filled, tensor references
 *      defined, output count matches the schema
 *   6. graph outputs defined and non-empty
 *   7. no cycles. Nodes may be listed in any order: they are sorted
 *      topologically here (Kahn), and a cycle is reported with the node
 *      that closes it
 *   8. a node that writes into its input (index_put_) writes into a graph
 *      input that nothing else in the graph reads (else UNIMPLEMENTED)
 *   9. shapes and dtypes: each node's declared output meta must be what
 *      the op produces (infer.c)
 *
 * Messages name what is wrong and where: "node 3 (aten.add.Tensor):
 * argument 'other' must be Tensor, got int", "value 'x': negative size -2
 * in dim 0". Client names are quoted with tcc_quote_name (printable,
 * truncated).
 */
#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S(s) ((s) ? (s) : "")
/* A quoted client name, in a buffer that lives for the enclosing block. */
#define Q(name) tcc_quote_name((name), (char[80]){0}, 80)

const char *tcc_quote_name(const char *name, char *buf, size_t cap) {
  name = S(name);
  size_t o = 0, i = 0;
  if (cap < 8) {
    if (cap) buf[0] = '\0';
    return buf;
  }
  size_t max = cap - 4 < 64 ? cap - 4 : 64;
  for (; name[i] && o < max; i++) {
    unsigned char c = (unsigned char)name[i];
    buf[o++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
  }
  if (name[i]) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

#define SHAPE(sz, r) tcc_shape_str((sz), (r), (char[200]){0}, 200)

/* ---------------------------------------------------------- metadata */

int tcc_meta_from_proto(const Tcc__V1__TensorMeta *pm, tcc_meta *m, tcc_error *err) {
  memset(m, 0, sizeof *m);
  if (!pm) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "has no meta");
  if (pm->dtype == TCC__V1__DTYPE__DTYPE_UNSPECIFIED)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "dtype is unspecified");
  if (!tcc_dtype_valid((int)pm->dtype))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "unknown dtype %d", (int)pm->dtype);
  m->dtype = (int)pm->dtype;
  if (pm->device) {
    int d = (int)pm->device->type;
    if (d != TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED && d != TCC__V1__DEVICE_TYPE__CPU &&
        d != TCC__V1__DEVICE_TYPE__CUDA)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "unknown device type %d", d);
    m->device = d;
  }
  if (pm->n_sizes > TCC_MAX_DIMS)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "rank %zu exceeds TCC_MAX_DIMS (%d)",
                         pm->n_sizes, TCC_MAX_DIMS);
  if (pm->n_strides != pm->n_sizes)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%zu strides for %zu sizes",
                         pm->n_strides, pm->n_sizes);
  m->rank = (int)pm->n_sizes;
  if (pm->storage_offset < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "negative storage_offset %lld",
                         (long long)pm->storage_offset);
  m->offset = pm->storage_offset;
  int64_t numel = 1, maxidx = 0;
  for (int d = 0; d < m->rank; d++) {
    m->sizes[d] = pm->sizes[d];
    m->strides[d] = pm->strides[d];
    if (m->sizes[d] < 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "negative size %lld in dim %d",
                           (long long)m->sizes[d], d);
    if (m->strides[d] < 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "negative stride %lld in dim %d",
                           (long long)m->strides[d], d);
    if (__builtin_mul_overflow(numel, m->sizes[d], &numel))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "element count of %s overflows int64", SHAPE(pm->sizes, m->rank));
  }
  int64_t bytes;
  if (__builtin_mul_overflow(numel, (int64_t)tcc_dtype_size(m->dtype), &bytes))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "byte size of %s %s overflows int64",
                         tcc_dtype_name(m->dtype), SHAPE(pm->sizes, m->rank));
  m->numel = numel;
  if (numel > 0) {
    maxidx = m->offset;
    for (int d = 0; d < m->rank; d++) {
      int64_t reach;
      if (__builtin_mul_overflow(m->sizes[d] - 1, m->strides[d], &reach) ||
          __builtin_add_overflow(maxidx, reach, &maxidx))
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "strides and storage_offset reach past int64");
    }
    if (__builtin_add_overflow(maxidx, 1, &m->span) ||
        __builtin_mul_overflow(m->span, (int64_t)tcc_dtype_size(m->dtype), &bytes))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "storage byte span (offset + reachable elements) overflows int64");
  }
  return 0;
}

/* 1 when no two in-bounds indices of m reach the same element: with the
 * dims of size > 1 sorted by stride, each stride exceeds the furthest
 * reach of the smaller ones (sufficient; what torch calls
 * non-overlapping for every layout it produces). */
static int meta_non_overlapping(const tcc_meta *m) {
  int order[TCC_MAX_DIMS], n = 0;
  if (m->numel <= 1) return 1;
  for (int d = 0; d < m->rank; d++)
    if (m->sizes[d] > 1) order[n++] = d;
  for (int i = 1; i < n; i++)                 /* insertion sort by stride */
    for (int j = i; j > 0 && m->strides[order[j]] < m->strides[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  int64_t reach = 0;                          /* max index of dims so far */
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (m->strides[d] <= reach) return 0;
    reach += (m->sizes[d] - 1) * m->strides[d];  /* <= span: no overflow */
  }
  return 1;
}

/* ------------------------------------------------------------ target */

static const char *const cpu_isas[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};

/* CPU features accepted in Target.cpu_features: each becomes -m<feature>
 * on the kernel compiler's command line, so only known names pass. */
static const char *const cpu_features[] = {
  "adx", "aes", "amx-bf16", "amx-int8", "amx-tile", "avx", "avx2", "avx512bf16",
  "avx512bitalg", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512fp16",
  "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512vl", "avx512vnni",
  "avx512vpopcntdq", "avxvnni", "bmi", "bmi2", "f16c", "fma", "gfni", "lzcnt",
  "movbe", "pclmul", "popcnt", "sha", "sse3", "sse4.1", "sse4.2", "ssse3", "vaes",
  "vpclmulqdq",
};

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "sm_80", "sm_90a", "sm_100f": sm_ then 2-3 digits then an optional
 * letter. */
static int cuda_arch_ok(const char *s) {
  if (strncmp(s, "sm_", 3) != 0) return 0;
  s += 3;
  int digits = 0;
  while (*s >= '0' && *s <= '9') s++, digits++;
  if (digits < 2 || digits > 3) return 0;
  if (*s >= 'a' && *s <= 'z') s++;
  return *s == '\0';
}

static int verify_target(const Tcc__V1__Target *t, tcc_arena *A, tcc_graph *g,
                         tcc_error *err) {
  tcc_target_spec *ts = &g->target;
  int dev = (int)t->device;
  if (dev == TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: device is unspecified");
  if (dev != TCC__V1__DEVICE_TYPE__CPU && dev != TCC__V1__DEVICE_TYPE__CUDA)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: unknown device type %d", dev);
  ts->device = dev;
  ts->isa = "";
  ts->cuda_arch = "";
  ts->conv_tf32 = ts->matmul_tf32 = 0;
  if (dev == TCC__V1__DEVICE_TYPE__CUDA) {
    const char *arch = S(t->cuda_arch);
    if (!arch[0])
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: CUDA target without cuda_arch");
    if (!cuda_arch_ok(arch))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "target: bad cuda_arch '%s' (expected e.g. sm_80, sm_90a)", Q(arch));
    ts->cuda_arch = tcc_arena_strdup(A, arch);
    if (!ts->cuda_arch) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    snprintf(g->target_label, sizeof g->target_label, "cuda:%s", ts->cuda_arch);
    ts->conv_tf32 = t->cuda_conv_tf32 != 0;
    ts->matmul_tf32 = t->cuda_matmul_tf32 != 0;
    return 0;
  }
  const char *isa = S(t->cpu_isa);
  if (!isa[0]) isa = "x86-64-v2";
  size_t k;
  for (k = 0; k < sizeof cpu_isas / sizeof cpu_isas[0]; k++)
    if (strcmp(isa, cpu_isas[k]) == 0) break;
  if (k == sizeof cpu_isas / sizeof cpu_isas[0])
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "target: unknown cpu_isa '%s' (expected x86-64, x86-64-v2, "
                         "x86-64-v3 or x86-64-v4)", Q(isa));
  ts->isa = cpu_isas[k];
  size_t nf = t->n_cpu_features;
  if (nf > 64)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: %zu cpu_features (limit 64)", nf);
  const char **f = tcc_arena_array(A, nf ? nf : 1, sizeof *f);
  if (!f) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < nf; i++) {
    const char *name = S(t->cpu_features[i]);
    const char *const *hit = bsearch(&name, cpu_features,
                                     sizeof cpu_features / sizeof cpu_features[0],
                                     sizeof cpu_features[0], str_cmp);
    if (!hit)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: unknown cpu feature '%s'",
                           Q(name));
    f[i] = *hit;   /* static strings */
  }
  qsort(f, nf, sizeof *f, str_cmp);
  size_t u = 0;
  for (size_t i = 0; i < nf; i++)
    if (u == 0 || strcmp(f[u - 1], f[i]) != 0) f[u++] = f[i];
  ts->features = f;
  ts->nfeatures = (int)u;
  size_t o = (size_t)snprintf(g->target_label, sizeof g->target_label, "cpu:%s", ts->isa);
  for (size_t i = 0; i < u && o < sizeof g->target_label; i++)
    o += (size_t)snprintf(g->target_label + o, sizeof g->target_label - o, "+%s", f[i]);
  return 0;
}

int tcc_target_check(const Tcc__V1__Target *t, char label[64], tcc_error *err) {
  if (!t) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: missing");
  tcc_graph *g = calloc(1, sizeof *g);
  if (!g) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  tcc_arena A;
  tcc_arena_init(&A);
  int rc = verify_target(t, &A, g, err);
  if (rc == 0) snprintf(label, 64, "%s", g->target_label);
  tcc_arena_free(&A);
  free(g);
  return rc;
}

/* ------------------------------------------------------- name lookup */

typedef struct name_ref {
  const char *name;
  int index;
} name_ref;

static int name_ref_cmp(const void *a, const void *b) {
  const name_ref *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

typedef struct verify_ctx {
  const Tcc__V1__Graph *pg;
  tcc_arena *A;
  tcc_graph *g;
  name_ref *names;       /* sorted declared value names */
  int nnames;
  tcc_error *err;
} verify_ctx;

/* Declared value index of `name`, or -1. */
static int lookup(verify_ctx *vc, const char *name) {
  name_ref key = {S(name), -1};
  size_t lo = 0, hi = (size_t)vc->nnames;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(key.name, vc->names[mid].name);
    if (c == 0) return vc->names[mid].index;
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return -1;
}

/* "graph input 0", "constant 2", "node 3 (aten.sin.default)" into buf. */
static const char *def_where(verify_ctx *vc, const tcc_value *v, char *buf, size_t cap) {
  switch (v->kind) {
  case TCC_VAL_INPUT: snprintf(buf, cap, "graph input %d", v->def); break;
  case TCC_VAL_CONST: snprintf(buf, cap, "constant %d", v->def); break;
  case TCC_VAL_NODE:
    snprintf(buf, cap, "node %d (%s)", v->def,
             Q(vc->pg->nodes[v->def] ? vc->pg->nodes[v->def]->target : ""));
    break;
  default: snprintf(buf, cap, "nothing"); break;
  }
  return buf;
}
#define WHERE(v) def_where(vc, (v), (char[160]){0}, 160)

/* Marks value `id` as defined by (kind, def, out). `who` names the
 * definer in messages. */
static int define(verify_ctx *vc, int id, tcc_value_kind kind, int def, int out,
                  const char *who) {
  tcc_value *v = &vc->g->values[id];
  if (v->kind != TCC_VAL_UNDEFINED)
    return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                         "value '%s' is defined twice (by %s and by %s)", Q(v->name),
                         WHERE(v), who);
  v->kind = kind;
  v->def = def;
  v->def_out = out;
  return 0;
}

/* ---------------------------------------------------------- arguments */

static const char *proto_arg_name(int kind_case) {
  switch (kind_case) {
  case TCC__V1__ARGUMENT__KIND_AS_NONE: return "None";
  case TCC__V1__ARGUMENT__KIND_AS_TENSOR: return "Tensor";
  case TCC__V1__ARGUMENT__KIND_AS_INT: return "int";
  case TCC__V1__ARGUMENT__KIND_AS_FLOAT: return "float";
  case TCC__V1__ARGUMENT__KIND_AS_BOOL: return "bool";
  case TCC__V1__ARGUMENT__KIND_AS_INTS: return "int list";
  case TCC__V1__ARGUMENT__KIND_AS_FLOATS: return "float list";
  case TCC__V1__ARGUMENT__KIND_AS_DTYPE: return "dtype";
  case TCC__V1__ARGUMENT__KIND_AS_TENSORS: return "Tensor list";
  case TCC__V1__ARGUMENT__KIND_AS_STRING: return "string";
  case TCC__V1__ARGUMENT__KIND_AS_DEVICE: return "Device";
  case TCC__V1__ARGUMENT__KIND_AS_BOOLS: return "bool list";
  default: return "nothing";
  }
}

/* Resolves a tensor reference to a defined value id. */
static int resolve_tensor(verify_ctx *vc, const char *pname, const char *vname, int *out) {
  int id = lookup(vc, vname);
  if (id < 0)
    return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                         "argument '%s' names unknown value '%s'", pname, Q(vname));
  if (vc->g->values[id].kind == TCC_VAL_UNDEFINED)
    return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                         "argument '%s' names value '%s', which nothing defines (not a "
                         "graph input, constant or node output)", pname, Q(vname));
  *out = id;
  return 0;
}

/* Checks list length against T[N]; a single element is repeated, and an
 * int list may be empty: the op says what that means (pooling's stride=[]
 * is the kernel size, as in PyTorch; elsewhere it is refused). */
static int list_len_ok(verify_ctx *vc, const tcc_param *q, size_t n, size_t *len) {
  *len = n;
  /* int[1] is PyTorch's "an int list, or one int": any length */
  if (q->list_len > 1 && n != (size_t)q->list_len) {
    if (n == 1) *len = (size_t)q->list_len;
    else if (n == 0 && q->type == TCC_PT_INT) *len = 0;
    else
      return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                           "argument '%s' must have %d elements, got %zu", q->name,
                           q->list_len, n);
  }
  return 0;
}

/* Converts one wire argument for parameter q into out (normalized: a
 * float parameter given an int holds a float, an int[N] given one int
 * holds N ints). Returns 0 or INVALID_ARGUMENT without node prefix. */
static int bind_arg(verify_ctx *vc, const tcc_param *q, const Tcc__V1__Argument *a,
                    tcc_arg *out) {
  tcc_arena *A = vc->A;
  int kc = a ? (int)a->kind_case : 0;
  char tbuf[48];
  memset(out, 0, sizeof *out);
  if (kc == TCC__V1__ARGUMENT__KIND_AS_NONE && q->optional) {
    out->kind = TCC_ARG_NONE;
    return 0;
  }
  if (q->is_list) {
    size_t len;
    switch (q->type) {
    case TCC_PT_TENSOR:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_TENSORS || !a->as_tensors) break;
      {
        const Tcc__V1__TensorList *tl = a->as_tensors;
        if (list_len_ok(vc, q, tl->n_values, &len)) return vc->err->code;
        if (len != tl->n_values)
          return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                               "argument '%s' must have %d tensors", q->name, q->list_len);
        int *vals = tcc_arena_array(A, len ? len : 1, sizeof *vals);
        if (!vals) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < len; i++) {
          const char *vn = tl->values[i] ? S(tl->values[i]->name) : "";
          if (!vn[0] && q->elem_optional) {
            vals[i] = -1;
            continue;
          }
          if (resolve_tensor(vc, q->name, vn, &vals[i])) return vc->err->code;
        }
        out->kind = TCC_ARG_TENSORS;
        out->n = (int)len;
        out->vals = vals;
        return 0;
      }
    case TCC_PT_INT:
      if (kc == TCC__V1__ARGUMENT__KIND_AS_INT && q->list_len) {
        int64_t *v = tcc_arena_array(A, (size_t)q->list_len, sizeof *v);
        if (!v) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        for (int i = 0; i < q->list_len; i++) v[i] = a->as_int;
        out->kind = TCC_ARG_INTS;
        out->n = q->list_len;
        out->ints = v;
        return 0;
      }
      if (kc != TCC__V1__ARGUMENT__KIND_AS_INTS || !a->as_ints) break;
      {
        const Tcc__V1__IntList *il = a->as_ints;
        if (list_len_ok(vc, q, il->n_values, &len)) return vc->err->code;
        if (len > TCC_MAX_VALUES)
          return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                               "argument '%s' has %zu elements", q->name, len);
        int64_t *v = tcc_arena_array(A, len ? len : 1, sizeof *v);
        if (!v) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < len; i++) v[i] = il->values[il->n_values == 1 ? 0 : i];
        out->kind = TCC_ARG_INTS;
        out->n = (int)len;
        out->ints = v;
        return 0;
      }
    case TCC_PT_FLOAT:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_FLOATS || !a->as_floats) break;
      {
        const Tcc__V1__FloatList *fl = a->as_floats;
        if (list_len_ok(vc, q, fl->n_values, &len)) return vc->err->code;
        if (len > TCC_MAX_VALUES)
          return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                               "argument '%s' has %zu elements", q->name, len);
        double *v = tcc_arena_array(A, len ? len : 1, sizeof *v);
        if (!v) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < len; i++) v[i] = fl->values[fl->n_values == 1 ? 0 : i];
        out->kind = TCC_ARG_FLOATS;
        out->n = (int)len;
        out->floats = v;
        return 0;
      }
    case TCC_PT_BOOL:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_BOOLS || !a->as_bools) break;
      {
        const Tcc__V1__BoolList *bl = a->as_bools;
        if (list_len_ok(vc, q, bl->n_values, &len)) return vc->err->code;
        if (len > TCC_MAX_VALUES)
          return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                               "argument '%s' has %zu elements", q->name, len);
        uint8_t *v = tcc_arena_alloc(A, len ? len : 1);
        if (!v) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < len; i++) v[i] = bl->values[bl->n_values == 1 ? 0 : i] != 0;
        out->kind = TCC_ARG_BOOLS;
        out->n = (int)len;
        out->bools = v;
        return 0;
      }
    default:
      break;
    }
  } else {
    switch (q->type) {
    case TCC_PT_TENSOR:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_TENSOR || !a->as_tensor) break;
      out->kind = TCC_ARG_TENSOR;
      return resolve_tensor(vc, q->name, a->as_tensor->name, &out->v);
    case TCC_PT_SCALAR:
      if (kc == TCC__V1__ARGUMENT__KIND_AS_INT) {
        out->kind = TCC_ARG_INT;
        out->i = a->as_int;
        return 0;
      }
      if (kc == TCC__V1__ARGUMENT__KIND_AS_FLOAT) {
        out->kind = TCC_ARG_FLOAT;
        out->f = a->as_float;
        return 0;
      }
      if (kc == TCC__V1__ARGUMENT__KIND_AS_BOOL) {
        out->kind = TCC_ARG_BOOL;
        out->i = a->as_bool != 0;
        return 0;
      }
      break;
    case TCC_PT_INT:
    case TCC_PT_LAYOUT:
    case TCC_PT_MEMFMT:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_INT) break;
      out->kind = TCC_ARG_INT;
      out->i = a->as_int;
      return 0;
    case TCC_PT_FLOAT:
      if (kc == TCC__V1__ARGUMENT__KIND_AS_INT) {
        out->kind = TCC_ARG_FLOAT;
        out->f = (double)a->as_int;
        return 0;
      }
      if (kc != TCC__V1__ARGUMENT__KIND_AS_FLOAT) break;
      out->kind = TCC_ARG_FLOAT;
      out->f = a->as_float;
      return 0;
    case TCC_PT_BOOL:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_BOOL) break;
      out->kind = TCC_ARG_BOOL;
      out->i = a->as_bool != 0;
      return 0;
    case TCC_PT_STR:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_STRING) break;
      out->kind = TCC_ARG_STRING;
      out->s = tcc_arena_strdup(A, a->as_string);
      if (!out->s) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      return 0;
    case TCC_PT_SCALARTYPE:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_DTYPE) break;
      if (!tcc_dtype_valid((int)a->as_dtype))
        return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "argument '%s': unknown dtype %d",
                             q->name, (int)a->as_dtype);
      out->kind = TCC_ARG_DTYPE;
      out->i = (int)a->as_dtype;
      return 0;
    case TCC_PT_DEVICE:
      if (kc != TCC__V1__ARGUMENT__KIND_AS_DEVICE || !a->as_device) break;
      if (a->as_device->type != TCC__V1__DEVICE_TYPE__CPU &&
          a->as_device->type != TCC__V1__DEVICE_TYPE__CUDA)
        return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                             "argument '%s': unknown device type %d", q->name,
                             (int)a->as_device->type);
      out->kind = TCC_ARG_DEVICE;
      out->i = (int)a->as_device->type;
      return 0;
    default:
      break;
    }
  }
  return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "argument '%s' must be %s, got %s",
                       q->name, tcc_param_type_str(q, tbuf, sizeof tbuf),
                       proto_arg_name(kc));
}

/* A schema default as a bound argument. */
static int default_arg(verify_ctx *vc, const tcc_param *q, tcc_arg *out) {
  const tcc_default *d = &q->def;
  memset(out, 0, sizeof *out);
  out->kind = d->kind;
  out->i = d->i;
  out->f = d->f;
  if (d->kind == TCC_ARG_STRING) out->s = d->s;   /* static table storage */
  if (d->kind == TCC_ARG_INTS || d->kind == TCC_ARG_BOOLS) {
    out->n = d->n;
    if (d->kind == TCC_ARG_INTS) {
      out->ints = d->ints;
    } else {
      uint8_t *b = tcc_arena_alloc(vc->A, d->n ? (size_t)d->n : 1);
      if (!b) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      for (int i = 0; i < d->n; i++) b[i] = d->ints[i] != 0;
      out->bools = b;
    }
  }
  return 0;
}

/* Binds a node's wire arguments to its schema. Messages carry no node
 * prefix (the caller adds it). */
static int bind_node(verify_ctx *vc, const Tcc__V1__Node *pn, tcc_node *n) {
  const tcc_schema *s = &n->op->schema;
  int bound[TCC_SCHEMA_MAX_PARAMS] = {0};
  n->nargs = s->nparams;
  n->args = tcc_arena_array(vc->A, s->nparams ? (size_t)s->nparams : 1, sizeof *n->args);
  if (!n->args) return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if (pn->n_inputs > (size_t)s->nparams)
    return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                         "too many arguments: %zu given, %s takes %d", pn->n_inputs,
                         n->op->name, s->nparams);
  for (size_t k = 0; k < pn->n_inputs; k++) {
    const Tcc__V1__NamedArgument *na = pn->inputs[k];
    const char *name = na ? S(na->name) : "";
    int p;
    if (!name[0]) {
      p = (int)k;
      if (s->params[p].kwarg_only)
        return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                             "argument %zu is positional but parameter '%s' is keyword-only",
                             k, s->params[p].name);
    } else {
      p = tcc_schema_param(s, name);
      if (p < 0)
        return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "unknown parameter '%s'",
                             Q(name));
    }
    if (bound[p])
      return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "parameter '%s' given twice",
                           s->params[p].name);
    bound[p] = 1;
    if (!na || !na->arg || na->arg->kind_case == TCC__V1__ARGUMENT__KIND__NOT_SET)
      return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "argument '%s' has no value",
                           s->params[p].name);
    int rc = bind_arg(vc, &s->params[p], na->arg, &n->args[p]);
    if (rc) return rc;
  }
  for (int p = 0; p < s->nparams; p++) {
    if (bound[p]) continue;
    if (!s->params[p].has_default)
      return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT, "missing required argument '%s'",
                           s->params[p].name);
    int rc = default_arg(vc, &s->params[p], &n->args[p]);
    if (rc) return rc;
  }
  return 0;
}

/* ------------------------------------------------------------- cycles */

/* Kahn's algorithm over the node dependency graph; fills order[] with a
 * topological order (ties broken by request index). On a cycle, reports
 * the node that closes it. */
static int topo_sort(verify_ctx *vc, int *order) {
  tcc_graph *g = vc->g;
  int nn = g->nnodes;
  int *indeg = tcc_arena_array(vc->A, (size_t)nn + 1, sizeof *indeg);
  int *head = tcc_arena_array(vc->A, (size_t)nn + 1, sizeof *head);   /* adjacency */
  int nedges = 0;
  for (int i = 0; i < nn; i++) FOR_EACH_TENSOR_ARG(&g->nodes[i], v, { (void)v; nedges++; })
  int *next = tcc_arena_array(vc->A, (size_t)nedges + 1, sizeof *next);
  int *dst = tcc_arena_array(vc->A, (size_t)nedges + 1, sizeof *dst);
  if (!indeg || !head || !next || !dst)
    return tcc_error_set(vc->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < nn; i++) head[i] = -1;
  int e = 0;
  for (int i = 0; i < nn; i++)
    FOR_EACH_TENSOR_ARG(&g->nodes[i], v, {
      if (g->values[v].kind == TCC_VAL_NODE) {
        int src = g->values[v].def;
        dst[e] = i;
        next[e] = head[src];
        head[src] = e++;
        indeg[i]++;
      }
    })
  /* A min-ordered ready set would sort ties by index; a FIFO seeded in
   * index order is deterministic too, and that is all we need. */
  int qh = 0, qt = 0;
  for (int i = 0; i < nn; i++)
    if (indeg[i] == 0) order[qt++] = i;
  while (qh < qt) {
    int m = order[qh++];
    for (int k = head[m]; k >= 0; k = next[k])
      if (--indeg[dst[k]] == 0) order[qt++] = dst[k];
  }
  if (qt == nn) return 0;

  /* Every node left has a predecessor left: walk predecessors until one
   * repeats; that node is on a cycle. */
  int start = -1;
  for (int i = 0; i < nn && start < 0; i++)
    if (indeg[i] > 0) start = i;
  int *seen = head;                       /* reuse: step at which visited */
  for (int i = 0; i < nn; i++) seen[i] = -1;
  int cur = start, step = 0;
  while (seen[cur] < 0) {
    seen[cur] = step++;
    int pred = -1;
    FOR_EACH_TENSOR_ARG(&g->nodes[cur], v, {
      if (pred < 0 && g->values[v].kind == TCC_VAL_NODE && indeg[g->values[v].def] > 0)
        pred = g->values[v].def;
    })
    cur = pred;
  }
  /* cur is on the cycle; name the value through which it reads a node of
   * the cycle. */
  const tcc_node *n = &g->nodes[cur];
  int via = -1;
  FOR_EACH_TENSOR_ARG(n, v, {
    if (via < 0 && g->values[v].kind == TCC_VAL_NODE && indeg[g->values[v].def] > 0) via = v;
  })
  const tcc_value *vv = &g->values[via];
  if (vv->def == cur)
    return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                         "node %d (%s): cycle: it reads its own output '%s'", cur,
                         n->op->name, Q(vv->name));
  return tcc_error_set(vc->err, TCC_E_INVALID_ARGUMENT,
                       "node %d (%s): cycle: it reads '%s', defined by node %d, which "
                       "depends on node %d's own output",
                       cur, n->op->name, Q(vv->name), vv->def, cur);
}

/* -------------------------------------------------------------- verify */

int tcc_verify(const Tcc__V1__CompileRequest *req, tcc_arena *A, tcc_graph *g,
               tcc_error *err) {
  int rc = tcc_ops_init(err);
  if (rc) return rc;
  memset(g, 0, sizeof *g);
  if (!req) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no request");
  const Tcc__V1__Graph *pg = req->graph;
  if (!pg) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "request has no graph");
  if (!req->target) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "request has no target");

  /* 1. limits */
  if (pg->n_nodes > TCC_MAX_NODES)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "graph has %zu nodes (limit %d)",
                         pg->n_nodes, TCC_MAX_NODES);
  if (pg->n_values > TCC_MAX_VALUES)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "graph has %zu values (limit %d)",
                         pg->n_values, TCC_MAX_VALUES);
  if (pg->n_inputs > TCC_MAX_VALUES || pg->n_outputs > TCC_MAX_VALUES ||
      pg->n_constants > TCC_MAX_VALUES)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED,
                         "graph has %zu inputs, %zu outputs, %zu constants (limit %d each)",
                         pg->n_inputs, pg->n_outputs, pg->n_constants, TCC_MAX_VALUES);

  /* 2. target, options */
  rc = verify_target(req->target, A, g, err);
  if (rc) return rc;
  if (req->options) {
    int mode = (int)req->options->mode;
    if (mode < TCC__V1__MODE__DEFAULT || mode > TCC__V1__MODE__MAX_AUTOTUNE_NO_CUDAGRAPHS)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "options: unknown mode %d", mode);
    g->mode = mode;
    g->dynamic = req->options->dynamic != 0;
  }

  verify_ctx vcs = {.pg = pg, .A = A, .g = g, .err = err}, *vc = &vcs;

  /* 3. value names and metas */
  int nv = (int)pg->n_values;
  g->nvalues = nv;
  g->values = tcc_arena_array(A, (size_t)nv + 1, sizeof *g->values);
  vc->names = tcc_arena_array(A, (size_t)nv + 1, sizeof *vc->names);
  if (!g->values || !vc->names) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < nv; i++) {
    const Tcc__V1__TensorValue *pv = pg->values[i];
    if (!pv) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "value %d is missing", i);
    g->values[i].name = S(pv->name);
    g->values[i].def = -1;
    vc->names[i].name = S(pv->name);
    vc->names[i].index = i;
  }
  vc->nnames = nv;
  qsort(vc->names, (size_t)nv, sizeof *vc->names, name_ref_cmp);
  for (int i = 1; i < nv; i++)
    if (strcmp(vc->names[i - 1].name, vc->names[i].name) == 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "duplicate value name '%s' (values %d and %d)",
                           Q(vc->names[i].name), vc->names[i - 1].index, vc->names[i].index);
  for (int i = 0; i < nv; i++) {
    tcc_meta *m = &g->values[i].meta;
    if (tcc_meta_from_proto(pg->values[i]->meta, m, err)) {
      tcc_error_prefix(err, "value '%s'", Q(g->values[i].name));
      return err->code;
    }
    if (m->device == TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED) m->device = g->target.device;
    if (m->device != g->target.device)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "value '%s' is on %s but the target is %s", Q(g->values[i].name),
                           m->device == TCC__V1__DEVICE_TYPE__CUDA ? "cuda" : "cpu",
                           g->target.device == TCC__V1__DEVICE_TYPE__CUDA ? "cuda" : "cpu");
  }

  /* 4. definitions: inputs, constants, node outputs */
  g->ninputs = (int)pg->n_inputs;
  g->inputs = tcc_arena_array(A, (size_t)g->ninputs + 1, sizeof *g->inputs);
  if (!g->inputs) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < g->ninputs; i++) {
    const char *name = S(pg->inputs[i]);
    int id = lookup(vc, name);
    if (id < 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "graph input %d '%s' has no TensorValue", i, Q(name));
    char who[48];
    snprintf(who, sizeof who, "graph input %d", i);
    if ((rc = define(vc, id, TCC_VAL_INPUT, i, 0, who))) return rc;
    g->inputs[i] = id;
  }
  for (int i = 0; i < (int)pg->n_constants; i++) {
    const Tcc__V1__Constant *pc = pg->constants[i];
    if (!pc) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "constant %d is missing", i);
    int id = lookup(vc, pc->name);
    if (id < 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "constant %d '%s' has no TensorValue", i, Q(pc->name));
    char who[48];
    snprintf(who, sizeof who, "constant %d", i);
    if ((rc = define(vc, id, TCC_VAL_CONST, i, 0, who))) return rc;
    tcc_value *v = &g->values[id];
    uint64_t want = (uint64_t)v->meta.numel * (uint64_t)tcc_dtype_size(v->meta.dtype);
    if ((uint64_t)pc->data.len != want)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "constant '%s': data has %zu bytes but %s %s needs %llu",
                           Q(pc->name), pc->data.len, tcc_dtype_name(v->meta.dtype),
                           SHAPE(v->meta.sizes, v->meta.rank), (unsigned long long)want);
    /* Constant data is dense row-major whatever the meta's layout says. */
    tcc_meta_contiguous(&v->meta);
    v->data = pc->data.data;
    v->data_len = pc->data.len;
  }
  int nn = (int)pg->n_nodes;
  g->nnodes = nn;
  g->nodes = tcc_arena_array(A, (size_t)nn + 1, sizeof *g->nodes);
  if (!g->nodes) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < nn; i++) {
    const Tcc__V1__Node *pn = pg->nodes[i];
    tcc_node *n = &g->nodes[i];
    n->src_index = i;
    if (!pn) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d is missing", i);
    n->op = tcc_op_find(S(pn->target));
    if (!n->op)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "unsupported op '%s' (node %d)",
                           Q(pn->target), i);
    const tcc_schema *s = &n->op->schema;
    if (s->nreturns >= 0 ? pn->n_outputs != (size_t)s->nreturns : pn->n_outputs > TCC_MAX_VALUES)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "node %d (%s): %zu outputs given, the op returns %d", i,
                           n->op->name, pn->n_outputs, s->nreturns);
    n->nout = (int)pn->n_outputs;
    n->outs = tcc_arena_array(A, (size_t)n->nout + 1, sizeof *n->outs);
    if (!n->outs) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    for (int o = 0; o < n->nout; o++) {
      const char *name = S(pn->outputs[o]);
      n->outs[o] = -1;
      if (!name[0]) continue;                       /* discarded output */
      int id = lookup(vc, name);
      if (id < 0)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "node %d (%s): output '%s' has no TensorValue", i, n->op->name,
                             Q(name));
      char who[96];
      snprintf(who, sizeof who, "node %d (%s)", i, n->op->name);
      if ((rc = define(vc, id, TCC_VAL_NODE, i, o, who))) return rc;
      n->outs[o] = id;
    }
  }

  /* 5. node arguments */
  for (int i = 0; i < nn; i++) {
    tcc_node *n = &g->nodes[i];
    if ((rc = bind_node(vc, pg->nodes[i], n))) {
      tcc_error_prefix(err, "node %d (%s)", i, n->op->name);
      return rc;
    }
  }

  /* 6. graph outputs */
  if (pg->n_outputs == 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "graph has no outputs");
  g->noutputs = (int)pg->n_outputs;
  g->outputs = tcc_arena_array(A, (size_t)g->noutputs, sizeof *g->outputs);
  if (!g->outputs) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0; i < g->noutputs; i++) {
    const char *name = S(pg->outputs[i]);
    int id = lookup(vc, name);
    if (id < 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "graph output %d names unknown value '%s'", i, Q(name));
    if (g->values[id].kind == TCC_VAL_UNDEFINED)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "graph output %d names value '%s', which nothing defines", i,
                           Q(name));
    if (!meta_non_overlapping(&g->values[id].meta))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "graph output %d '%s': strides %s over sizes %s make elements "
                           "overlap; an output must not overlap itself", i, Q(name),
                           SHAPE(g->values[id].meta.strides, g->values[id].meta.rank),
                           SHAPE(g->values[id].meta.sizes, g->values[id].meta.rank));
    g->outputs[i] = id;
  }

  /* 7. cycles */
  int *order = tcc_arena_array(A, (size_t)nn + 1, sizeof *order);
  if (!order) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if ((rc = topo_sort(vc, order))) return rc;

  /* 8. writes into graph inputs (index_put_): into an input the graph
   * reads nowhere else, so that program order on the write's result
   * orders every reader of the new contents after it (lower.c); anything
   * else runs eagerly. One pass counts every value's uses. */
  int *uses = NULL;
  for (int k = 0; k < nn; k++) {
    const tcc_node *n = &g->nodes[order[k]];
    if (!tcc_op_writes_input(n->op)) continue;
    if (!uses) {
      uses = tcc_arena_array(A, (size_t)g->nvalues + 1, sizeof *uses);
      if (!uses) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      for (int j = 0; j < nn; j++) FOR_EACH_TENSOR_ARG(&g->nodes[j], v, { uses[v]++; })
      for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i]]++;
    }
    int self = n->args[0].kind == TCC_ARG_TENSOR ? n->args[0].v : -1;
    if (self < 0 || g->values[self].kind != TCC_VAL_INPUT)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): writes in place only into a graph input",
                           n->src_index, n->op->name);
    if (uses[self] != 1)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): the graph reads the input it writes "
                           "elsewhere too (%d uses)", n->src_index, n->op->name, uses[self]);
  }

  /* 9. shapes and dtypes, in topological order */
  tcc_meta inferred[TCC_SCHEMA_MAX_RETURNS];
  for (int k = 0; k < nn; k++) {
    const tcc_node *n = &g->nodes[order[k]];
    tcc_meta *out = inferred;
    tcc_meta *heap = NULL;
    if (n->nout > TCC_SCHEMA_MAX_RETURNS) {
      heap = out = tcc_arena_array(A, (size_t)n->nout, sizeof *out);
      if (!heap) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((rc = tcc_infer_node(g, n, out, err))) {
      tcc_error_prefix(err, "node %d (%s)", n->src_index, n->op->name);
      return rc;
    }
    for (int o = 0; o < n->nout; o++) {
      if (n->outs[o] < 0) continue;
      const tcc_value *v = &g->values[n->outs[o]];
      const tcc_meta *dm = &v->meta, *im = &out[o];
      if (dm->dtype != im->dtype)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "node %d (%s): output '%s' is declared %s but the op produces %s",
                             n->src_index, n->op->name, Q(v->name), tcc_dtype_name(dm->dtype),
                             tcc_dtype_name(im->dtype));
      int same = dm->rank == im->rank;
      for (int d = 0; same && d < dm->rank; d++) same = dm->sizes[d] == im->sizes[d];
      if (!same)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "node %d (%s): output '%s' is declared with shape %s but the op "
                             "produces %s", n->src_index, n->op->name, Q(v->name),
                             SHAPE(dm->sizes, dm->rank), SHAPE(im->sizes, im->rank));
    }
  }

  /* 10. dynamic shapes: the symbolic input dims */
  if (g->dynamic) return tcc_dyn_verify(req, A, g, err);
  return 0;
}
