/*
 * pipeline.c — the compiler, top to bottom (after QBE's main.c).
 *
 *   tcc_prepare   decode -> verify -> canonicalize -> check -> key + hash
 *   tcc_compile   generate (lower -> fuse -> split -> place -> schedule ->
 *                 emit) -> build -> manifest
 *
 * Every pass of tcc_compile is followed by the IR checker; a broken
 * invariant is TCC_E_INTERNAL "IR check after <pass>: ...". With the
 * environment variable TCC_DUMP set (non-empty), each stage's IR is
 * written to <work_dir>/<guard hash>/NN-<stage>.txt (best effort: a dump
 * that cannot be written is skipped, never an error); the library itself
 * never prints.
 *
 * Thread-safety: tcc_prepare and tcc_compile share nothing but the op
 * table (parsed once, read-only). A tcc_prepared is immutable, so several
 * compiles and the loop thread may read one at the same time.
 */
#include "target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------ prepare */

int tcc_prepare(const Tcc__V1__CompileRequest *req, const char *identity, tcc_prepared **out,
                tcc_error *err) {
  tcc_error local;
  if (!err) err = &local;
  tcc_error_clear(err);
  *out = NULL;
  tcc_arena scratch;
  tcc_arena_init(&scratch);
  tcc_graph verified;
  tcc_prepared *p = calloc(1, sizeof *p);
  tcc_graph *g = calloc(1, sizeof *g);
  int rc;
  if (!p || !g) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  tcc_arena_init(&g->arena);
  p->graph = g;

  if ((rc = tcc_verify(req, &scratch, &verified, err))) goto fail;
  verified.identity = identity ? identity : "";
  const tcc_target *t = tcc_target_for(verified.target.device);
  if (t && t->identity) {
    /* the build tool's part of who compiles, hence of the key */
    char tool[512];
    t->identity(tool, sizeof tool);
    verified.identity = tcc_arena_printf(&scratch, "%s %s", verified.identity, tool);
    if (!verified.identity) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      goto fail;
    }
  }
  if ((rc = tcc_canonicalize(&verified, g, err))) goto fail;
  if ((rc = tcc_check_graph(g, err))) {
    tcc_error_prefix(err, "IR check after canonicalize");
    goto fail;
  }
  if ((rc = tcc_guard_key(g, &p->key, &p->key_len, err))) goto fail;
  tcc_sha256(p->key, p->key_len, p->hash);
  tcc_hex_encode(p->hash, sizeof p->hash, p->hash_hex);
  snprintf(p->target, sizeof p->target, "%s", g->target_label);
  p->device = (Tcc__V1__DeviceType)g->target.device;
  p->mode = (Tcc__V1__Mode)g->mode;
  p->dynamic = g->dynamic;
  p->nodes = (size_t)g->nnodes;
  tcc_arena_free(&scratch);
  *out = p;
  return 0;

fail:
  tcc_arena_free(&scratch);
  tcc_prepared_free(p);
  if (!p) free(g);
  return rc;
}

int tcc_prepare_bytes(const uint8_t *buf, size_t len, const char *identity, tcc_prepared **out,
                      tcc_error *err) {
  Tcc__V1__CompileRequest *req;
  *out = NULL;
  int rc = tcc_decode_request(buf, len, &req, err);
  if (rc) return rc;
  rc = tcc_prepare(req, identity, out, err);
  tcc__v1__compile_request__free_unpacked(req, NULL);
  return rc;
}

void tcc_prepared_free(tcc_prepared *p) {
  if (!p) return;
  if (p->graph) {
    tcc_arena_free(&p->graph->arena);
    free(p->graph);
  }
  free(p->key);
  free(p);
}

/* ------------------------------------------------------------- dumps */

typedef struct dumper {
  char dir[4096];      /* "" when dumps are off */
  int n;
} dumper;

static void dump_open(dumper *d, const tcc_prepared *p, const tcc_build_options *opts) {
  const char *on = getenv("TCC_DUMP");
  d->dir[0] = '\0';
  d->n = 0;
  if (!on || !on[0]) return;
  const char *base = opts && opts->work_dir && opts->work_dir[0] ? opts->work_dir : getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  if ((size_t)snprintf(d->dir, sizeof d->dir, "%s/%s", base, p->hash_hex) >= sizeof d->dir ||
      (mkdir(d->dir, 0700) && errno != EEXIST))
    d->dir[0] = '\0';
}

static void dump_write(dumper *d, const char *stage, const char *text, size_t len) {
  if (!d->dir[0]) return;
  char path[4200];
  snprintf(path, sizeof path, "%s/%02d-%s", d->dir, d->n++, stage);
  FILE *f = fopen(path, "we");
  if (!f) return;
  fwrite(text, 1, len, f);
  fclose(f);
}

static void dump_graph(dumper *d, const char *stage, const tcc_graph *g) {
  if (!d->dir[0]) return;
  tcc_buf b = {0};
  tcc_dump_graph(g, &b);
  if (!b.failed) dump_write(d, stage, b.data, b.len);
  tcc_buf_free(&b);
}

static void dump_schedule(dumper *d, const tcc_target *t, const tcc_program *p) {
  if (!d->dir[0]) return;
  tcc_buf b = {0};
  t->dump(p, &b);
  if (!b.failed) dump_write(d, "schedule.txt", b.data ? b.data : "", b.len);
  tcc_buf_free(&b);
}

static void dump_prog(dumper *d, const char *stage, const tcc_program *p) {
  if (!d->dir[0]) return;
  tcc_buf b = {0};
  tcc_dump_program(p, &b);
  if (!b.failed) dump_write(d, stage, b.data, b.len);
  tcc_buf_free(&b);
}

/* ----------------------------------------------------------- targets */

static const tcc_target *const targets[] = {&tcc_target_cpu, &tcc_target_cuda};

const tcc_target *tcc_target_for(int device) {
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
    if ((int)targets[i]->device == device) return targets[i];
  return NULL;
}

/* ---------------------------------------------------------- manifest */

static Tcc__V1__TensorMeta *manifest_meta(tcc_arena *A, const tcc_meta *m) {
  Tcc__V1__TensorMeta *tm = tcc_arena_alloc(A, sizeof *tm);
  Tcc__V1__Device *dev = tcc_arena_alloc(A, sizeof *dev);
  int64_t *sz = tcc_arena_array(A, (size_t)m->rank + 1, sizeof *sz);
  int64_t *st = tcc_arena_array(A, (size_t)m->rank + 1, sizeof *st);
  if (!tm || !dev || !sz || !st) return NULL;
  tcc__v1__tensor_meta__init(tm);
  tcc__v1__device__init(dev);
  dev->type = (Tcc__V1__DeviceType)m->device;
  tm->dtype = (Tcc__V1__DType)m->dtype;
  tm->n_sizes = tm->n_strides = (size_t)m->rank;
  memcpy(sz, m->sizes, sizeof *sz * (size_t)m->rank);
  memcpy(st, m->strides, sizeof *st * (size_t)m->rank);
  tm->sizes = sz;
  tm->strides = st;
  tm->storage_offset = m->offset;
  tm->device = dev;
  return tm;
}

/* Where a tensor comes from, as GraphNode.args and Manifest.output_nodes
 * encode it: its node, -1-i for graph input i, INT32_MIN for a constant. */
static int32_t value_source(const tcc_graph *g, int v) {
  const tcc_value *val = &g->values[v];
  if (val->kind == TCC_VAL_NODE) return val->def;
  if (val->kind == TCC_VAL_INPUT) return -1 - val->def;
  return INT32_MIN;
}

/* The canonical graph's nodes and what each output reads (provenance for
 * `tcctl show --dot`). Returns 0 or -1 (out of memory). */
static int manifest_graph(const tcc_graph *g, tcc_arena *A, Tcc__V1__Manifest *m) {
  m->n_graph_nodes = (size_t)g->nnodes;
  m->graph_nodes = tcc_arena_array(A, m->n_graph_nodes + 1, sizeof *m->graph_nodes);
  m->n_output_nodes = (size_t)g->noutputs;
  m->output_nodes = tcc_arena_array(A, m->n_output_nodes + 1, sizeof *m->output_nodes);
  if (!m->graph_nodes || !m->output_nodes) return -1;
  for (int i = 0; i < g->noutputs; i++) m->output_nodes[i] = value_source(g, g->outputs[i]);
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    Tcc__V1__GraphNode *gn = tcc_arena_alloc(A, sizeof *gn);
    if (!gn) return -1;
    tcc__v1__graph_node__init(gn);
    gn->target = (char *)n->op->name;
    size_t nargs = 0;
    FOR_EACH_TENSOR_ARG(n, v, { nargs += g->values[v].kind != TCC_VAL_CONST; });
    gn->args = tcc_arena_array(A, nargs + 1, sizeof *gn->args);
    if (!gn->args) return -1;
    FOR_EACH_TENSOR_ARG(n, v, {
      if (g->values[v].kind != TCC_VAL_CONST) gn->args[gn->n_args++] = value_source(g, v);
    });
    m->graph_nodes[k] = gn;
  }
  return 0;
}

/* Encodes the tcc.v1.Manifest of a built program into the artifact. */
static int encode_manifest(const tcc_target *t, const tcc_program *prog, const tcc_built *built, tcc_arena *A,
                           tcc_artifact *out, tcc_error *err) {
  const tcc_graph *g = prog->graph;
  Tcc__V1__Manifest m;
  tcc__v1__manifest__init(&m);
  m.abi_version = 1;
  m.entry = "tcc_entry";
  m.workspace_bytes = prog->workspace_bytes;
  m.target = (char *)g->target_label;
  m.compiler = (char *)(g->identity ? g->identity : "");
  m.n_inputs = (size_t)g->ninputs;
  m.n_outputs = (size_t)g->noutputs;
  m.inputs = tcc_arena_array(A, m.n_inputs + 1, sizeof *m.inputs);
  m.outputs = tcc_arena_array(A, m.n_outputs + 1, sizeof *m.outputs);
  int nk = tcc_program_live_kernels(prog);
  m.n_kernels = (size_t)nk;
  m.kernels = tcc_arena_array(A, (size_t)nk + 1, sizeof *m.kernels);
  if (!m.inputs || !m.outputs || !m.kernels || manifest_graph(g, A, &m)) goto oom;
  for (int i = 0; i < g->ninputs; i++)
    if (!(m.inputs[i] = manifest_meta(A, &g->values[g->inputs[i]].meta))) goto oom;
  for (int i = 0; i < g->noutputs; i++)
    if (!(m.outputs[i] = manifest_meta(A, &g->values[g->outputs[i]].meta))) goto oom;
  for (int k = 0, j = 0; k < prog->nkernels; k++) {
    const tcc_kernel *K = &prog->kernels[k];
    if (K->dead) continue;
    Tcc__V1__KernelInfo *ki = tcc_arena_alloc(A, sizeof *ki);
    if (!ki) goto oom;
    tcc__v1__kernel_info__init(ki);
    ki->name = tcc_arena_printf(A, "k%d", j);
    ki->kind = K->kind == TCC_OPK_EXTERN ? "extern" : "pointwise";
    for (int s = 0; s < K->nstores && K->kind != TCC_OPK_EXTERN; s++)
      if (tcc_vx_has_reduce(K->stores[s].value)) ki->kind = "reduction";
    ki->numel = 1;
    for (int d = 0; d < K->rank; d++) ki->numel *= K->sizes[d];
    ki->n_nodes = (size_t)K->nnodes;
    ki->nodes = K->nodes;
    if (!ki->name) goto oom;
    m.kernels[j++] = ki;
  }
  /* the target's part (CUDA: the launch plan, the PTX) */
  int rc;
  if (t->manifest && (rc = t->manifest(prog, built, A, &m, err))) return rc;
  out->manifest_len = tcc__v1__manifest__get_packed_size(&m);
  out->manifest = malloc(out->manifest_len ? out->manifest_len : 1);
  if (!out->manifest) goto oom;
  tcc__v1__manifest__pack(&m, out->manifest);
  out->kernels = nk;
  return 0;
oom:
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory encoding the manifest");
}

/* ----------------------------------------------------------- compile */

/* Runs a pass, then the checker; names the pass on failure. */
#define PASS(name, call)                                                   \
  do {                                                                     \
    if ((rc = (call))) return rc;                                          \
    if ((rc = tcc_check_program(prog, err))) {                             \
      tcc_error_prefix(err, "IR check after %s", name);                    \
      return rc;                                                           \
    }                                                                      \
    dump_prog(dump, name, prog);                                           \
  } while (0)

/* The passes from the canonical graph to source text. */
static int generate(const tcc_target *t, tcc_program *prog, tcc_buf *src, dumper *dump,
                    tcc_error *err) {
  int rc;
  if ((rc = tcc_check_graph(prog->graph, err))) {
    tcc_error_prefix(err, "IR check before lower");
    return rc;
  }
  PASS("lower.txt", tcc_lower(prog, err));
  PASS("fuse.txt", tcc_fuse(prog, err));
  PASS("split.txt", tcc_split_dims(prog, err));
  PASS("place.txt", tcc_place_buffers(prog, err));
  if ((rc = t->schedule(prog, err))) return rc;
  if ((rc = t->check(prog, err))) {
    tcc_error_prefix(err, "schedule check");
    return rc;
  }
  dump_schedule(dump, t, prog);
  if ((rc = t->emit(prog, src, err))) return rc;
  dump_write(dump, "kernel.c", src->data, src->len);
  return 0;
}

static int compile_dynamic(const tcc_prepared *p, const tcc_target *t,
                           const tcc_build_options *opts, tcc_artifact *out, tcc_error *err);
static int generate_source_dynamic(const tcc_prepared *p, const tcc_target *t, char **source,
                                   size_t *len, int *kernels, tcc_error *err);

static int generate_source(const tcc_prepared *p, const tcc_kernel_config *configs,
                           int nconfigs, int whole, char **source, size_t *len, int *kernels,
                           tcc_error *err) {
  tcc_error local;
  if (!err) err = &local;
  *source = NULL;
  *len = 0;
  const tcc_target *t = p && p->graph ? tcc_target_for(p->graph->target.device) : NULL;
  if (!t) return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "no backend for this target");
  if (p->graph->nsyms) {
    if (configs)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "tuned builds of dynamic-shape graphs are not supported yet");
    return generate_source_dynamic(p, t, source, len, kernels, err);
  }
  tcc_arena arena;
  tcc_arena_init(&arena);
  tcc_program prog;
  tcc_program_init(&prog, &arena, p->graph);
  prog.kcfg = configs;
  prog.nkcfg = configs ? nconfigs : 0;
  prog.whole_kernels = whole;
  tcc_buf src = {0};
  dumper dump = {.dir = ""};
  int rc = generate(t, &prog, &src, &dump, err);
  if (!rc) {
    if (kernels) *kernels = tcc_program_live_kernels(&prog);
    *source = tcc_buf_take(&src, len);
    if (!*source) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  tcc_buf_free(&src);
  tcc_program_free(&prog);
  tcc_arena_free(&arena);
  return rc;
}

int tcc_generate_source(const tcc_prepared *p, char **source, size_t *len, int *kernels,
                        tcc_error *err) {
  return generate_source(p, NULL, 0, 0, source, len, kernels, err);
}

int tcc_generate_source_whole(const tcc_prepared *p, char **source, size_t *len, int *kernels,
                              tcc_error *err) {
  return generate_source(p, NULL, 0, 1, source, len, kernels, err);
}

int tcc_generate_source_tuned(const tcc_prepared *p, const tcc_kernel_config *configs,
                              int nconfigs, char **source, size_t *len, tcc_error *err) {
  return generate_source(p, configs, nconfigs, 0, source, len, NULL, err);
}

/* tcc_compile and tcc_compile_tuned: configs (may be NULL) per live
 * kernel, bench_hooks appends tune.c's timing hooks (static shapes only). */
static int compile_program(const tcc_prepared *p, const tcc_build_options *opts,
                           const tcc_kernel_config *configs, int nconfigs, int bench_hooks,
                           tcc_artifact *out, tcc_error *err) {
  tcc_error local;
  if (!err) err = &local;
  tcc_error_clear(err);
  memset(out, 0, sizeof *out);
  double t0 = now_ms();
  if (!p || !p->graph) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no prepared graph");
  const tcc_graph *g = p->graph;
  const tcc_target *t = tcc_target_for(g->target.device);
  if (!t) return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "no backend for device type %d", g->target.device);
  if (g->nsyms && (configs || bench_hooks))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "tuned builds of dynamic-shape graphs are not supported yet");
  if (g->nsyms) return compile_dynamic(p, t, opts, out, err);

  int rc;
  tcc_arena arena;
  tcc_arena_init(&arena);
  tcc_program prog;
  tcc_program_init(&prog, &arena, g);
  prog.kcfg = configs;
  prog.nkcfg = configs ? nconfigs : 0;
  tcc_buf src = {0};
  tcc_built built = {0};
  dumper dump;
  dump_open(&dump, p, opts);
  dump_graph(&dump, "graph.txt", g);

  if ((rc = generate(t, &prog, &src, &dump, err))) goto done;
  if (bench_hooks) t->bench_hooks(&src, tcc_program_live_kernels(&prog));
  if ((rc = t->build(&prog, src.data, src.len, opts, &built, err))) goto done;
  out->data = built.data;
  out->size = built.size;
  out->bodies = built.bodies;
  out->bodies_reused = built.bodies_reused;
  built.data = NULL;
  if ((rc = encode_manifest(t, &prog, &built, &arena, out, err))) goto done;

  out->kind = t->artifact;
  tcc_sha256(out->data, out->size, out->sha256);
  out->source = tcc_buf_take(&src, NULL);
  if (!out->source) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  out->compile_ms = now_ms() - t0;

done:
  free(built.data);
  free(built.ptx);
  tcc_buf_free(&src);
  tcc_program_free(&prog);
  tcc_arena_free(&arena);
  if (rc) tcc_artifact_free(out);
  return rc;
}

int tcc_compile(const tcc_prepared *p, const tcc_build_options *opts, tcc_artifact *out,
                tcc_error *err) {
  return compile_program(p, opts, NULL, 0, 0, out, err);
}

int tcc_compile_tuned(const tcc_prepared *p, const tcc_build_options *opts,
                      const tcc_kernel_config *configs, int nconfigs, int bench_hooks,
                      tcc_artifact *out, tcc_error *err) {
  tcc_error local;
  if (!err) err = &local;
  memset(out, 0, sizeof *out);
  if (!p || !p->graph)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no prepared graph");
  const tcc_target *t = tcc_target_for(p->graph->target.device);
  if (!t) return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "tuned builds are for CPU and CUDA targets");
  return compile_program(p, opts, configs, nconfigs, t->bench_hooks ? bench_hooks : 0, out, err);
}

/* ------------------------------------------------- dynamic shapes */

/* The value at syms of the polynomial coef over k symbols. */
static int64_t poly_eval(int k, const int64_t *coef, const int64_t *syms) {
  int64_t sum = 0;
  for (int v = 0; v < (1 << k); v++) {
    int64_t t = coef[v];
    for (int j = 0; j < k; j++)
      if ((v >> j) & 1) t *= syms[j];
    sum += t;
  }
  return sum;
}

/* tcc.v1.SymExpr of coef (terms with a non-zero coefficient). */
static Tcc__V1__SymExpr *sym_expr(tcc_arena *A, int k, const int64_t *coef) {
  Tcc__V1__SymExpr *e = tcc_arena_alloc(A, sizeof *e);
  if (!e) return NULL;
  tcc__v1__sym_expr__init(e);
  e->terms = tcc_arena_array(A, (size_t)(1 << k), sizeof *e->terms);
  if (!e->terms) return NULL;
  for (int v = 0; v < (1 << k); v++) {
    if (!coef[v]) continue;
    Tcc__V1__SymTerm *t = tcc_arena_alloc(A, sizeof *t);
    int32_t *sy = tcc_arena_array(A, (size_t)k + 1, sizeof *sy);
    if (!t || !sy) return NULL;
    tcc__v1__sym_term__init(t);
    t->coef = coef[v];
    for (int j = 0; j < k; j++)
      if ((v >> j) & 1) sy[t->n_syms++] = j;
    t->syms = sy;
    e->terms[e->n_terms++] = t;
  }
  return e;
}

/* Fits one number over the probes (vals[p]) into *e, and its value at
 * the example sizes into *at_example. Returns 0 or UNIMPLEMENTED naming
 * `what`. */
static int fit_number(const tcc_graph *g, int np, const int64_t (*assign)[TCC_MAX_SYMS],
                      const int64_t *vals, tcc_arena *A, Tcc__V1__SymExpr **e,
                      int64_t *at_example, const char *what, tcc_error *err) {
  int64_t coef[1 << TCC_MAX_SYMS];
  if (tcc_dyn_fit(g->nsyms, np, assign, vals, coef))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                         "dynamic shapes: %s is not a polynomial in the symbols", what);
  if (e && !(*e = sym_expr(A, g->nsyms, coef)))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if (at_example) *at_example = poly_eval(g->nsyms, coef, g->sym_example);
  return 0;
}

/* The SymLayout of value v (graph value id) over the probes' graphs, and
 * its TensorMeta at the example sizes. */
static int sym_layout(const tcc_graph *g, int np, const int64_t (*assign)[TCC_MAX_SYMS],
                      const tcc_graph *pg, int v, tcc_arena *A, Tcc__V1__SymLayout **lay,
                      Tcc__V1__TensorMeta **meta, tcc_error *err) {
  int64_t vals[(1 << TCC_MAX_SYMS) + 2];
  tcc_meta ex = pg[0].values[v].meta;
  int rank = ex.rank, rc;
  Tcc__V1__SymLayout *L = tcc_arena_alloc(A, sizeof *L);
  if (!L) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  tcc__v1__sym_layout__init(L);
  L->sizes = tcc_arena_array(A, (size_t)rank + 1, sizeof *L->sizes);
  L->strides = tcc_arena_array(A, (size_t)rank + 1, sizeof *L->strides);
  if (!L->sizes || !L->strides) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  L->n_sizes = L->n_strides = (size_t)rank;
  for (int d = 0; d < rank; d++) {
    for (int p = 0; p < np; p++) vals[p] = pg[p].values[v].meta.sizes[d];
    if ((rc = fit_number(g, np, assign, vals, A, &L->sizes[d], &ex.sizes[d], "a size", err)))
      return rc;
    for (int p = 0; p < np; p++) vals[p] = pg[p].values[v].meta.strides[d];
    if ((rc = fit_number(g, np, assign, vals, A, &L->strides[d], &ex.strides[d], "a stride", err)))
      return rc;
  }
  for (int p = 0; p < np; p++) vals[p] = pg[p].values[v].meta.offset;
  if ((rc = fit_number(g, np, assign, vals, A, &L->storage_offset, &ex.offset, "an offset", err)))
    return rc;
  *lay = L;
  *meta = manifest_meta(A, &ex);
  return *meta ? 0 : tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
}

/* The ABI 2 manifest of a dynamic compile from its probes. */
static int encode_manifest_dynamic(const tcc_graph *g, int np,
                                   const int64_t (*assign)[TCC_MAX_SYMS], const tcc_graph *pg,
                                   const tcc_program *prog, tcc_arena *A, tcc_artifact *out,
                                   tcc_error *err) {
  Tcc__V1__Manifest m;
  tcc__v1__manifest__init(&m);
  int rc;
  int64_t vals[(1 << TCC_MAX_SYMS) + 2];
  m.abi_version = 2;
  m.entry = "tcc_entry2";
  m.target = (char *)g->target_label;
  m.compiler = (char *)(g->identity ? g->identity : "");
  m.n_symbols = (size_t)g->nsyms;
  m.symbols = (char **)g->sym_names;
  m.n_inputs = m.n_sym_inputs = (size_t)g->ninputs;
  m.n_outputs = m.n_sym_outputs = (size_t)g->noutputs;
  m.inputs = tcc_arena_array(A, m.n_inputs + 1, sizeof *m.inputs);
  m.outputs = tcc_arena_array(A, m.n_outputs + 1, sizeof *m.outputs);
  m.sym_inputs = tcc_arena_array(A, m.n_inputs + 1, sizeof *m.sym_inputs);
  m.sym_outputs = tcc_arena_array(A, m.n_outputs + 1, sizeof *m.sym_outputs);
  int nk = tcc_program_live_kernels(&prog[0]);
  m.n_kernels = (size_t)nk;
  m.kernels = tcc_arena_array(A, (size_t)nk + 1, sizeof *m.kernels);
  if (!m.inputs || !m.outputs || !m.sym_inputs || !m.sym_outputs || !m.kernels ||
      manifest_graph(g, A, &m))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory encoding the manifest");
  for (int i = 0; i < g->ninputs; i++)
    if ((rc = sym_layout(g, np, assign, pg, g->inputs[i], A, &m.sym_inputs[i], &m.inputs[i], err)))
      return rc;
  for (int i = 0; i < g->noutputs; i++)
    if ((rc = sym_layout(g, np, assign, pg, g->outputs[i], A, &m.sym_outputs[i], &m.outputs[i], err)))
      return rc;
  for (int p = 0; p < np; p++) vals[p] = prog[p].workspace_bytes;
  if ((rc = fit_number(g, np, assign, vals, A, &m.sym_workspace_bytes, &m.workspace_bytes,
                       "the workspace size", err)))
    return rc;
  for (int k = 0, j = 0; k < prog[0].nkernels; k++) {
    const tcc_kernel *K = &prog[0].kernels[k];
    if (K->dead) continue;
    Tcc__V1__KernelInfo *ki = tcc_arena_alloc(A, sizeof *ki);
    if (!ki) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    tcc__v1__kernel_info__init(ki);
    ki->name = tcc_arena_printf(A, "k%d", j);
    if (!ki->name) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    ki->kind = K->kind == TCC_OPK_EXTERN ? "extern" : "pointwise";
    for (int s = 0; s < K->nstores && K->kind != TCC_OPK_EXTERN; s++)
      if (tcc_vx_has_reduce(K->stores[s].value)) ki->kind = "reduction";
    ki->n_nodes = (size_t)K->nnodes;
    ki->nodes = K->nodes;
    for (int p = 0; p < np; p++) {     /* kernel k is live in every probe */
      vals[p] = 1;
      for (int d = 0; d < prog[p].kernels[k].rank; d++) vals[p] *= prog[p].kernels[k].sizes[d];
    }
    if ((rc = fit_number(g, np, assign, vals, A, NULL, &ki->numel, "a kernel's size", err)))
      return rc;
    m.kernels[j++] = ki;
  }
  out->manifest_len = tcc__v1__manifest__get_packed_size(&m);
  out->manifest = malloc(out->manifest_len ? out->manifest_len : 1);
  if (!out->manifest) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  tcc__v1__manifest__pack(&m, out->manifest);
  out->kernels = nk;
  return 0;
}

/* The probes of a dynamic compile: each probe's graph, program, source. */
typedef struct dyn_probes {
  tcc_arena arena;
  int np, inited;
  int64_t assign[(1 << TCC_MAX_SYMS) + 2][TCC_MAX_SYMS];
  tcc_graph *pg;
  tcc_program *prog;
  tcc_buf *src;
} dyn_probes;

static void dyn_free(dyn_probes *d) {
  for (int i = 0; i < d->inited; i++) {
    tcc_program_free(&d->prog[i]);
    tcc_buf_free(&d->src[i]);
  }
  tcc_arena_free(&d->arena);
}

/* The passes at every probe and the sources merged into *merged, one
 * source over tcc_S[] (dynamic.c's header). Free d with dyn_free. */
static int dyn_generate(const tcc_prepared *p, const tcc_target *t, dumper *dump,
                        dyn_probes *d, tcc_buf *merged, tcc_error *err) {
  const tcc_graph *g = p->graph;
  memset(d, 0, sizeof *d);
  tcc_arena_init(&d->arena);
  if (!t->dynamic_shapes)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                         "dynamic shapes on %s are not supported yet (compile with "
                         "options.dynamic off, or without sym_sizes)", t->label);
  d->np = tcc_dyn_probes(g, d->assign);
  d->pg = tcc_arena_array(&d->arena, (size_t)d->np, sizeof *d->pg);
  d->prog = tcc_arena_array(&d->arena, (size_t)d->np, sizeof *d->prog);
  d->src = tcc_arena_array(&d->arena, (size_t)d->np, sizeof *d->src);
  const char **text = tcc_arena_array(&d->arena, (size_t)d->np, sizeof *text);
  if (!d->pg || !d->prog || !d->src || !text)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  int rc, nsymbolic = 0;
  for (int i = 0; i < d->np; i++) {
    if ((rc = tcc_dyn_graph_at(g, d->assign[i], &d->arena, &d->pg[i], err))) return rc;
    tcc_program_init(&d->prog[i], &d->arena, &d->pg[i]);
    d->inited = i + 1;
    dumper quiet = {.dir = ""};
    if ((rc = generate(t, &d->prog[i], &d->src[i], i == 0 ? dump : &quiet, err))) return rc;
    if (d->src[i].failed || !d->src[i].data)
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    text[i] = d->src[i].data;
  }
  if ((rc = tcc_dyn_fit_source(g->nsyms, d->np, (const int64_t(*)[TCC_MAX_SYMS])d->assign, text,
                               merged, &nsymbolic, err)))
    return rc;
  dump_write(dump, "kernel-dynamic.c", merged->data, merged->len);
  return 0;
}

/* tcc_compile of a graph with symbols: one build of the merged source,
 * an ABI 2 manifest. */
static int compile_dynamic(const tcc_prepared *p, const tcc_target *t,
                           const tcc_build_options *opts, tcc_artifact *out, tcc_error *err) {
  const tcc_graph *g = p->graph;
  double t0 = now_ms();
  dyn_probes d;
  tcc_buf merged = {0};
  dumper dump;
  dump_open(&dump, p, opts);
  dump_graph(&dump, "graph.txt", g);
  int rc = dyn_generate(p, t, &dump, &d, &merged, err);
  if (rc) goto done;
  tcc_built built = {0};
  if ((rc = t->build(&d.prog[0], merged.data, merged.len, opts, &built, err))) goto done;
  out->data = built.data;
  out->size = built.size;
  free(built.ptx);
  if ((rc = encode_manifest_dynamic(g, d.np, (const int64_t(*)[TCC_MAX_SYMS])d.assign, d.pg,
                                    d.prog, &d.arena, out, err)))
    goto done;
  out->kind = t->artifact;
  tcc_sha256(out->data, out->size, out->sha256);
  out->source = tcc_buf_take(&merged, NULL);
  if (!out->source) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  out->compile_ms = now_ms() - t0;
done:
  tcc_buf_free(&merged);
  dyn_free(&d);
  if (rc) tcc_artifact_free(out);
  return rc;
}

/* tcc_generate_source of a graph with symbols: the merged source. */
static int generate_source_dynamic(const tcc_prepared *p, const tcc_target *t, char **source,
                                   size_t *len, int *kernels, tcc_error *err) {
  dyn_probes d;
  tcc_buf merged = {0};
  dumper dump = {.dir = ""};
  int rc = dyn_generate(p, t, &dump, &d, &merged, err);
  if (!rc) {
    if (kernels) *kernels = tcc_program_live_kernels(&d.prog[0]);
    *source = tcc_buf_take(&merged, len);
    if (!*source) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  tcc_buf_free(&merged);
  dyn_free(&d);
  return rc;
}

void tcc_artifact_free(tcc_artifact *a) {
  if (!a) return;
  free(a->data);
  free(a->manifest);
  free(a->source);
  memset(a, 0, sizeof *a);
}
