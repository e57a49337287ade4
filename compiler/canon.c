/*
 * canon.c — the canonical graph and the guard key.
 *
 * Requires: a verified graph (verify.c): acyclic, every reference defined.
 *
 * Canonical graph
 * ---------------
 * Two requests that describe the same computation must give the same
 * graph, whatever the client named its values or in which (valid) order
 * it listed its nodes:
 *   - nodes: depth-first post-order from the graph outputs (in output
 *     order), each node's tensor arguments visited in schema order.
 *     Nodes no output depends on are dropped (they compute nothing the
 *     caller can see; ATen ops in these graphs are functional), but for
 *     writes into a graph input (index_put_), walked from after the
 *     outputs in request order.
 *   - values: graph inputs first (0..ninputs-1, call order, used or not),
 *     then constants and node outputs in order of first use / definition
 *     along the node order; a constant returned directly comes last.
 *   - arguments: one per schema parameter, defaults filled (verify.c).
 *
 * Guard key (format 1; format 2 with dynamic shapes)
 * ---------------------------------------------------
 * All integers little-endian; str = u32 byte length + bytes (no NUL);
 * f64 = IEEE-754 bit pattern as u64. The key is what the cache compares on
 * a hit; SHA-256(key) is the guard hash.
 *
 *   field                     encoding
 *   ------------------------  -------------------------------------------
 *   magic                     4 bytes "TCCK"
 *   key format                u32 1; 2 when the graph has symbols
 *   codegen version           u32 TCC_CODEGEN_VERSION
 *   compiler identity         str   (tcc_toolchain_identity)
 *   target device             u8    DeviceType: 1 CPU, 2 CUDA
 *   target arch               str   CPU: ISA ("x86-64-v2"); CUDA: "sm_90"
 *   TF32 (CUDA only)          u8    bit 0 convolutions, bit 1 matmuls
 *   target features           u32 n, n x str  (CPU: sorted, unique)
 *   mode                      u8    Mode
 *   dynamic                   u8    0/1
 *   symbols (format 2 only)   u32   number of symbols (dynamic.c)
 *   counts                    u32 nvalues, u32 ninputs, u32 nnodes,
 *                             u32 noutputs
 *   values, by canonical id:
 *     kind                    u8    0 input, 1 constant, 2 node output
 *     dtype                   u8    DType
 *     rank                    u8
 *     sizes                   rank x i64
 *     abi flag                u8    1 when the value is a graph input or
 *                                   output (its layout is part of the
 *                                   calling convention), else 0
 *     if abi flag:
 *       strides               rank x i64
 *       storage_offset        i64
 *       alignment class       u8    largest power of two <= 64 dividing
 *                                   offset * element size (64 for 0)
 *       device type           u8
 *     if constant:
 *       data                  u64 byte length + bytes (row-major)
 *   nodes, canonical order:
 *     op                      str   "aten.add.Tensor"
 *     nargs                   u32   = the schema's parameter count
 *     per argument            u8 kind (tcc_arg_kind) + payload:
 *       NONE                  -
 *       TENSOR                u32 value id
 *       INT BOOL DTYPE DEVICE i64
 *       FLOAT                 f64
 *       INTS                  u32 n + n x i64
 *       FLOATS                u32 n + n x f64
 *       BOOLS                 u32 n + n x u8
 *       TENSORS               u32 n + n x u32 (0xffffffff: None)
 *       STRING                str
 *     nouts                   u32
 *     outs                    nouts x u32 value id (0xffffffff: discarded)
 *   outputs                   noutputs x u32 value id
 *
 * Format 2 (dynamic shapes: `dynamic` set and some input dim marked
 * symbolic). Every size, stride and storage offset above (`sizes`,
 * `strides`, `storage_offset`) is taken from the graph at the example
 * sizes and compared with the graph at other symbol values
 * (tcc_dyn_probe_pair); where the two differ it is written as
 *   -1 - s             an input dim that is symbol s (numbered by first
 *                      appearance over inputs in call order, dims in order)
 *   TCC_KEY_DERIVED    (INT64_MIN) a number the graph derives from the
 *                      symbols (an intermediate's batch dim, a contiguous
 *                      stride over a symbolic dim)
 * so requests that differ only in the example values of their symbols
 * share a key. The guards are implied by the format: every symbol >= 2
 * (0 and 1 are specialised: such a dim is static), dims with one symbol
 * are equal, symbolic inputs are contiguous. Symbol names are not hashed.
 *
 * Not in the key, on purpose: value names, the client label, requires_grad,
 * device indices, fullgraph, the strides of intermediate values (the
 * compiler chooses those), the declared strides/offset of constants
 * (their data is row-major by definition), nodes no output depends on.
 */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------ canonicalize */

static int copy_arg(tcc_arena *A, const tcc_arg *in, const int *remap, tcc_arg *out) {
  *out = *in;
  switch (in->kind) {
  case TCC_ARG_TENSOR:
    out->v = remap[in->v];
    return 0;
  case TCC_ARG_TENSORS: {
    int *v = tcc_arena_array(A, (size_t)in->n + 1, sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < in->n; i++) v[i] = in->vals[i] < 0 ? -1 : remap[in->vals[i]];
    out->vals = v;
    return 0;
  }
  case TCC_ARG_INTS: {
    int64_t *v = tcc_arena_array(A, (size_t)in->n + 1, sizeof *v);
    if (!v) return -1;
    if (in->n) memcpy(v, in->ints, sizeof *v * (size_t)in->n);
    out->ints = v;
    return 0;
  }
  case TCC_ARG_FLOATS: {
    double *v = tcc_arena_array(A, (size_t)in->n + 1, sizeof *v);
    if (!v) return -1;
    if (in->n) memcpy(v, in->floats, sizeof *v * (size_t)in->n);
    out->floats = v;
    return 0;
  }
  case TCC_ARG_BOOLS: {
    uint8_t *v = tcc_arena_alloc(A, (size_t)in->n + 1);
    if (!v) return -1;
    if (in->n) memcpy(v, in->bools, (size_t)in->n);
    out->bools = v;
    return 0;
  }
  case TCC_ARG_STRING:
    out->s = tcc_arena_strdup(A, in->s);
    return out->s ? 0 : -1;
  default:
    return 0;
  }
}

/* A place in a node's tensor references: argument a, list element l. */
typedef struct arg_cursor {
  int a, l;
} arg_cursor;

/* The next tensor the node reads from *c on (the order of
 * FOR_EACH_TENSOR_ARG), advancing *c past it; -1 when there is none. */
static int next_tensor_ref(const tcc_node *node, arg_cursor *c) {
  for (; c->a < node->nargs; c->a++, c->l = 0) {
    const tcc_arg *a = &node->args[c->a];
    if (a->kind == TCC_ARG_TENSOR && c->l == 0) {
      c->l = 1;
      return a->v;
    }
    if (a->kind == TCC_ARG_TENSORS)
      while (c->l < a->n) {
        int v = a->vals[c->l++];
        if (v >= 0) return v;
      }
  }
  return -1;
}

/* Gives value v (old id) the next canonical id unless it has one. */
static void number(int *remap, int *next, int v) {
  if (remap[v] < 0) remap[v] = (*next)++;
}

/* Appends to order[*norder..] the nodes `root` depends on that are not
 * placed yet, then root: depth-first post-order. cursor[n] is where n's
 * walk over its tensor references (schema order) stands, so each
 * reference is looked at once: a node with 64k inputs costs 64k steps,
 * not 64k^2. */
static void post_order(const tcc_graph *in, int root, char *state, int *stack, arg_cursor *cursor,
                       int *order, int *norder) {
  if (state[root]) return;
  int sp = 0;
  stack[sp++] = root;
  state[root] = 1;
  cursor[root] = (arg_cursor){0, 0};
  while (sp) {
    int n = stack[sp - 1];
    int v, pushed = 0;
    while (!pushed && (v = next_tensor_ref(&in->nodes[n], &cursor[n])) >= 0) {
      const tcc_value *val = &in->values[v];
      if (val->kind == TCC_VAL_NODE && state[val->def] == 0) {
        state[val->def] = 1;
        cursor[val->def] = (arg_cursor){0, 0};
        stack[sp++] = val->def;
        pushed = 1;
      }
    }
    if (!pushed) {
      state[n] = 2;
      order[(*norder)++] = n;
      sp--;
    }
  }
}

int tcc_canonicalize(const tcc_graph *in, tcc_graph *out, tcc_error *err) {
  tcc_arena scratch;
  tcc_arena_init(&scratch);
  memset(out, 0, sizeof *out);
  tcc_arena_init(&out->arena);
  tcc_arena *A = &out->arena;
  int nn = in->nnodes, nv = in->nvalues;

  int *order = tcc_arena_array(&scratch, (size_t)nn + 1, sizeof *order);
  char *state = tcc_arena_alloc(&scratch, (size_t)nn + 1);  /* 0 new, 1 open, 2 done */
  int *stack = tcc_arena_array(&scratch, (size_t)nn + 1, sizeof *stack);
  arg_cursor *cursor = tcc_arena_array(&scratch, (size_t)nn + 1, sizeof *cursor);
  int *remap = tcc_arena_array(&scratch, (size_t)nv + 1, sizeof *remap);
  if (!order || !state || !stack || !cursor || !remap) goto oom;

  /* Depth-first post-order from the outputs, then from each node that
   * writes into a graph input (index_put_) that no output depends on. */
  int norder = 0;
  for (int oi = 0; oi < in->noutputs; oi++) {
    const tcc_value *ov = &in->values[in->outputs[oi]];
    if (ov->kind == TCC_VAL_NODE) post_order(in, ov->def, state, stack, cursor, order, &norder);
  }
  for (int k = 0; k < nn; k++)
    if (tcc_op_writes_input(in->nodes[k].op)) post_order(in, k, state, stack, cursor, order, &norder);

  /* Renumber values. */
  for (int v = 0; v < nv; v++) remap[v] = -1;
  int next = 0;
  for (int i = 0; i < in->ninputs; i++) number(remap, &next, in->inputs[i]);
  for (int k = 0; k < norder; k++) {
    const tcc_node *node = &in->nodes[order[k]];
    FOR_EACH_TENSOR_ARG(node, v, {
      if (in->values[v].kind == TCC_VAL_CONST) number(remap, &next, v);
    })
    for (int o = 0; o < node->nout; o++)
      if (node->outs[o] >= 0) number(remap, &next, node->outs[o]);
  }
  for (int i = 0; i < in->noutputs; i++) number(remap, &next, in->outputs[i]);

  /* Build the canonical graph. */
  out->nvalues = next;
  out->nnodes = norder;
  out->ninputs = in->ninputs;
  out->noutputs = in->noutputs;
  out->values = tcc_arena_array(A, (size_t)next + 1, sizeof *out->values);
  out->nodes = tcc_arena_array(A, (size_t)norder + 1, sizeof *out->nodes);
  out->inputs = tcc_arena_array(A, (size_t)in->ninputs + 1, sizeof *out->inputs);
  out->outputs = tcc_arena_array(A, (size_t)in->noutputs + 1, sizeof *out->outputs);
  if (!out->values || !out->nodes || !out->inputs || !out->outputs) goto oom;
  for (int v = 0; v < nv; v++) {
    int c = remap[v];
    if (c < 0) continue;
    const tcc_value *iv = &in->values[v];
    tcc_value *cv = &out->values[c];
    *cv = *iv;
    cv->name = tcc_arena_strdup(A, iv->name);
    if (!cv->name) goto oom;
    if (iv->kind == TCC_VAL_CONST) {
      cv->def = -1;
      uint8_t *d = tcc_arena_alloc(A, iv->data_len);
      if (!d) goto oom;
      if (iv->data_len) memcpy(d, iv->data, iv->data_len);
      cv->data = d;
    }
  }
  for (int i = 0; i < in->ninputs; i++) out->inputs[i] = remap[in->inputs[i]];
  for (int i = 0; i < in->noutputs; i++) out->outputs[i] = remap[in->outputs[i]];
  for (int k = 0; k < norder; k++) {
    const tcc_node *src = &in->nodes[order[k]];
    tcc_node *dst = &out->nodes[k];
    dst->op = src->op;
    dst->src_index = src->src_index;
    dst->nargs = src->nargs;
    dst->nout = src->nout;
    dst->args = tcc_arena_array(A, (size_t)src->nargs + 1, sizeof *dst->args);
    dst->outs = tcc_arena_array(A, (size_t)src->nout + 1, sizeof *dst->outs);
    if (!dst->args || !dst->outs) goto oom;
    for (int a = 0; a < src->nargs; a++)
      if (copy_arg(A, &src->args[a], remap, &dst->args[a])) goto oom;
    for (int o = 0; o < src->nout; o++) {
      int v = src->outs[o];
      dst->outs[o] = v < 0 ? -1 : remap[v];
      if (v >= 0) {
        out->values[remap[v]].def = k;
        out->values[remap[v]].def_out = o;
      }
    }
  }

  /* Target, options and identity. */
  out->target = in->target;
  out->target.isa = tcc_arena_strdup(A, in->target.isa);
  out->target.cuda_arch = tcc_arena_strdup(A, in->target.cuda_arch);
  const char **f = tcc_arena_array(A, (size_t)in->target.nfeatures + 1, sizeof *f);
  if (!out->target.isa || !out->target.cuda_arch || !f) goto oom;
  for (int i = 0; i < in->target.nfeatures; i++) f[i] = in->target.features[i];  /* static */
  out->target.features = f;
  out->mode = in->mode;
  out->dynamic = in->dynamic;
  out->identity = tcc_arena_strdup(A, in->identity);
  if (!out->identity) goto oom;
  if (tcc_dyn_copy(in, out, A)) goto oom;
  memcpy(out->target_label, in->target_label, sizeof out->target_label);
  tcc_arena_free(&scratch);
  return 0;

oom:
  tcc_arena_free(&scratch);
  tcc_arena_free(&out->arena);
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory canonicalizing the graph");
}

/* -------------------------------------------------------------- key */

int tcc_align_class(int64_t offset, int elemsize) {
  uint64_t bytes = (uint64_t)offset * (uint64_t)elemsize;
  if (bytes == 0) return 64;
  int c = 1;
  while (c < 64 && bytes % (uint64_t)(c * 2) == 0) c *= 2;
  return c;
}

static void put_u8(tcc_buf *b, unsigned v) {
  unsigned char c = (unsigned char)v;
  tcc_buf_put(b, &c, 1);
}

static void put_u32(tcc_buf *b, uint32_t v) {
  unsigned char c[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 24)};
  tcc_buf_put(b, c, 4);
}

static void put_u64(tcc_buf *b, uint64_t v) {
  unsigned char c[8];
  for (int i = 0; i < 8; i++) c[i] = (unsigned char)(v >> (8 * i));
  tcc_buf_put(b, c, 8);
}

static void put_i64(tcc_buf *b, int64_t v) { put_u64(b, (uint64_t)v); }

static void put_f64(tcc_buf *b, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  put_u64(b, u);
}

static void put_str(tcc_buf *b, const char *s) {
  size_t n = strlen(s ? s : "");
  put_u32(b, (uint32_t)n);
  tcc_buf_put(b, s ? s : "", n);
}

static void put_id(tcc_buf *b, int id) { put_u32(b, id < 0 ? 0xffffffffu : (uint32_t)id); }

static void put_arg(tcc_buf *b, const tcc_arg *a) {
  put_u8(b, (unsigned)a->kind);
  switch (a->kind) {
  case TCC_ARG_NONE: break;
  case TCC_ARG_TENSOR: put_id(b, a->v); break;
  case TCC_ARG_INT:
  case TCC_ARG_BOOL:
  case TCC_ARG_DTYPE:
  case TCC_ARG_DEVICE: put_i64(b, a->i); break;
  case TCC_ARG_FLOAT: put_f64(b, a->f); break;
  case TCC_ARG_INTS:
    put_u32(b, (uint32_t)a->n);
    for (int i = 0; i < a->n; i++) put_i64(b, a->ints[i]);
    break;
  case TCC_ARG_FLOATS:
    put_u32(b, (uint32_t)a->n);
    for (int i = 0; i < a->n; i++) put_f64(b, a->floats[i]);
    break;
  case TCC_ARG_BOOLS:
    put_u32(b, (uint32_t)a->n);
    for (int i = 0; i < a->n; i++) put_u8(b, a->bools[i]);
    break;
  case TCC_ARG_TENSORS:
    put_u32(b, (uint32_t)a->n);
    for (int i = 0; i < a->n; i++) put_id(b, a->vals[i]);
    break;
  case TCC_ARG_STRING: put_str(b, a->s); break;
  }
}

/* Dynamic shapes: the key of a size, stride or offset `v` of value `id`
 * whose counterpart in the graph at other symbol values is `w`: v itself
 * when equal, else -1 - symbol for a symbolic input dim (`sym` >= 0),
 * else TCC_KEY_DERIVED. */
static void put_dyn(tcc_buf *b, int64_t v, int64_t w, int sym) {
  if (v == w) put_i64(b, v);
  else put_i64(b, sym >= 0 ? -1 - (int64_t)sym : TCC_KEY_DERIVED);
}

int tcc_guard_key(const tcc_graph *g, uint8_t **key, size_t *len, tcc_error *err) {
  tcc_buf b = {0};
  /* Dynamic shapes: the graph at the example sizes and at other sizes
   * tell which numbers depend on the symbols. */
  tcc_arena dyn_arena;
  tcc_graph at0, at1;
  tcc_arena_init(&dyn_arena);
  if (g->nsyms) {
    int rc = tcc_dyn_probe_pair(g, &dyn_arena, &at0, &at1, err);
    if (rc) {
      tcc_arena_free(&dyn_arena);
      return rc;
    }
  }
  char *abi = calloc((size_t)g->nvalues + 1, 1);
  if (!abi) {
    tcc_arena_free(&dyn_arena);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int i = 0; i < g->ninputs; i++) abi[g->inputs[i]] = 1;
  for (int i = 0; i < g->noutputs; i++) abi[g->outputs[i]] = 1;

  tcc_buf_put(&b, "TCCK", 4);
  put_u32(&b, g->nsyms ? 2 : 1);
  put_u32(&b, TCC_CODEGEN_VERSION);
  put_str(&b, g->identity);
  put_u8(&b, (unsigned)g->target.device);
  put_str(&b, g->target.device == TCC__V1__DEVICE_TYPE__CUDA ? g->target.cuda_arch
                                                             : g->target.isa);
  if (g->target.device == TCC__V1__DEVICE_TYPE__CUDA)
    put_u8(&b, (unsigned)(g->target.conv_tf32 | g->target.matmul_tf32 << 1));
  put_u32(&b, (uint32_t)g->target.nfeatures);
  for (int i = 0; i < g->target.nfeatures; i++) put_str(&b, g->target.features[i]);
  put_u8(&b, (unsigned)g->mode);
  put_u8(&b, g->dynamic ? 1 : 0);
  if (g->nsyms) put_u32(&b, (uint32_t)g->nsyms);
  put_u32(&b, (uint32_t)g->nvalues);
  put_u32(&b, (uint32_t)g->ninputs);
  put_u32(&b, (uint32_t)g->nnodes);
  put_u32(&b, (uint32_t)g->noutputs);
  for (int v = 0; v < g->nvalues; v++) {
    const tcc_value *val = &g->values[v];
    const tcc_meta *m = &val->meta;
    put_u8(&b, val->kind == TCC_VAL_INPUT ? 0 : val->kind == TCC_VAL_CONST ? 1 : 2);
    put_u8(&b, (unsigned)m->dtype);
    put_u8(&b, (unsigned)m->rank);
    const tcc_meta *m1 = g->nsyms ? &at1.values[v].meta : m;
    if (g->nsyms) m = &at0.values[v].meta;
    for (int d = 0; d < m->rank; d++)
      put_dyn(&b, m->sizes[d], m1->sizes[d],
              g->nsyms && val->kind == TCC_VAL_INPUT ? g->sym_of[val->def * TCC_MAX_DIMS + d] : -1);
    put_u8(&b, abi[v]);
    if (abi[v]) {
      for (int d = 0; d < m->rank; d++) put_dyn(&b, m->strides[d], m1->strides[d], -1);
      put_dyn(&b, m->offset, m1->offset, -1);
      put_u8(&b, (unsigned)tcc_align_class(m->offset, tcc_dtype_size(m->dtype)));
      put_u8(&b, (unsigned)m->device);
    }
    if (val->kind == TCC_VAL_CONST) {
      put_u64(&b, (uint64_t)val->data_len);
      tcc_buf_put(&b, val->data, val->data_len);
    }
  }
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    put_str(&b, n->op->name);
    put_u32(&b, (uint32_t)n->nargs);
    for (int a = 0; a < n->nargs; a++) put_arg(&b, &n->args[a]);
    put_u32(&b, (uint32_t)n->nout);
    for (int o = 0; o < n->nout; o++) put_id(&b, n->outs[o]);
  }
  for (int i = 0; i < g->noutputs; i++) put_id(&b, g->outputs[i]);
  free(abi);
  tcc_arena_free(&dyn_arena);
  size_t n;
  char *data = tcc_buf_take(&b, &n);
  if (!data) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory encoding the key");
  *key = (uint8_t *)data;
  *len = n;
  return 0;
}
