/*
 * test_codegen.c — the CUDA backend (compiler/cuda/schedule.c, emit.c) end to end on a
 * machine without a GPU: requests for target cuda:sm_80 and cuda:sm_90
 * go through tcc_prepare + tcc_compile (lower, fuse, place, CUDA C, NVRTC)
 * and the artifact is checked:
 *
 *   - kind CUBIN for the requested SM (ELF header), every manifest kernel
 *     an entry of the cubin (ELF symbols, and `cuobjdump -elf` when
 *     TCC_CUOBJDUMP names it), target "cuda:<arch>", an identity naming
 *     NVRTC, 1-D grid and block (block a multiple of 32, <= 1024);
 *   - ABI 1: the PTX of the same source declares, for each kernel,
 *     inputs + outputs + 1 parameters of .u64;
 *   - the guard key differs between archs and between CUDA and CPU.
 *
 * Graphs: every tests/graphs/ JSON file (a matmul becomes a cuBLAS step of
 * the manifest, checked to be a valid call over its buffers), and one small
 * request per op of the op table whose required parameters are tensors
 * and scalars (output metas found by asking the verifier), in float32,
 * and the unary ones also in float64, float16, bfloat16 and int32; plus
 * hand-written reductions (sum/amax/argmax/var over a dim, softmax,
 * log_softmax, layer_norm).
 * Skips (exit 77) when NVRTC is not available.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "tcc_nvrtc.h"
#include "tcc_dtype.h"
#include "tcctest.h"

static const char *const ARCHS[] = {"sm_80", "sm_90"};
static const char *cuobjdump;
static char *tmpdir;
static int objdumps;   /* cuobjdump runs left (each costs ~50 ms) */

/* Parameter count of .entry name in PTX, -1 when absent. Every
 * parameter must be .u64 (a pointer). */
static int ptx_params(const char *ptx, const char *name) {
  char want[64];
  snprintf(want, sizeof want, ".entry %s(", name);
  const char *p = strstr(ptx, want);
  if (!p) return -1;
  const char *end = strchr(p, ')');
  int n = 0;
  for (const char *q = strstr(p, ".param"); q && q < end; q = strstr(q + 1, ".param")) {
    ck_assert_msg(!strncmp(q, ".param .u64", 11), "kernel %s has a non-pointer parameter", name);
    n++;
  }
  return n;
}

/* Elements of storage a tensor meta spans (offset included). */
static int64_t meta_span(const Tcc__V1__TensorMeta *t) {
  return tcc_storage_elems(t->sizes, t->n_sizes, t->strides, t->n_strides, t->storage_offset);
}

/* One operand of a GEMM step: rows x cols (column-major, ld) per batch
 * entry must lie inside the buffer it names. */
static void check_ref(const Tcc__V1__Manifest *m, const Tcc__V1__BufferRef *ref, Tcc__V1__DType dt, int64_t rows,
                      int64_t cols, int64_t ld, int64_t stride, int64_t batch, const char *what) {
  ck_assert_ptr_nonnull(ref);
  ck_assert_int_ge(ld, rows > 1 ? rows : 1);
  int64_t es = tcc_dtype_size(dt);
  int64_t last = (batch - 1) * stride + (cols - 1) * ld + rows;   /* elements, one past */
  ck_assert_int_eq(ref->offset_bytes % es, 0);
  int64_t end = ref->offset_bytes + last * es;
  switch (ref->base_case) {
  case TCC__V1__BUFFER_REF__BASE_INPUT:
    ck_assert_uint_lt(ref->input, m->n_inputs);
    ck_assert_int_eq(m->inputs[ref->input]->dtype, dt);
    ck_assert_msg(end <= meta_span(m->inputs[ref->input]) * es, "%s: GEMM operand past input %u", what, ref->input);
    break;
  case TCC__V1__BUFFER_REF__BASE_OUTPUT:
    ck_assert_uint_lt(ref->output, m->n_outputs);
    ck_assert_msg(end <= meta_span(m->outputs[ref->output]) * es, "%s: GEMM operand past output", what);
    break;
  case TCC__V1__BUFFER_REF__BASE_WORKSPACE:
    ck_assert_msg(end <= m->workspace_bytes, "%s: GEMM operand [%lld, %lld) past the workspace (%lld)", what,
                  (long long)ref->offset_bytes, (long long)end, (long long)m->workspace_bytes);
    break;
  case TCC__V1__BUFFER_REF__BASE_CONSTANT:
    ck_assert_msg(ref->constant && !strncmp(ref->constant, "b", 1), "%s: bad constant name", what);
    break;
  default:
    ck_abort_msg("%s: GEMM operand without a base", what);
  }
}

/* A GEMM step is a valid cublasGemmStridedBatchedEx call over its buffers. */
static void check_gemm(const Tcc__V1__Manifest *m, const Tcc__V1__KernelInfo *ki, const char *what) {
  const Tcc__V1__GemmStep *G = ki->gemm;
  ck_assert(G->m >= 1 && G->n >= 1 && G->k >= 1 && G->batch_count >= 1);
  ck_assert_int_eq(G->a_dtype, G->b_dtype);
  ck_assert_double_eq(G->alpha, 1.0);
  ck_assert_double_eq(G->beta, 0.0);
  if (G->a_dtype == TCC__V1__DTYPE__FLOAT64) {
    ck_assert_int_eq(G->c_dtype, TCC__V1__DTYPE__FLOAT64);
    ck_assert_str_eq(G->compute_type, "64F");
  } else {   /* float32 accumulate; TF32 only where the target allows it */
    ck_assert_int_eq(G->c_dtype, TCC__V1__DTYPE__FLOAT32);
    ck_assert(!strcmp(G->compute_type, "32F") || !strcmp(G->compute_type, "32F_FAST_TF32"));
  }
  check_ref(m, G->a, G->a_dtype, G->trans_a ? G->k : G->m, G->trans_a ? G->m : G->k, G->lda, G->stride_a,
            G->batch_count, what);
  check_ref(m, G->b, G->b_dtype, G->trans_b ? G->n : G->k, G->trans_b ? G->k : G->n, G->ldb, G->stride_b,
            G->batch_count, what);
  check_ref(m, G->c, G->c_dtype, G->m, G->n, G->ldc, G->stride_c, G->batch_count, what);
  ck_assert_int_ne(G->c->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);
  ck_assert_int_ne(G->c->base_case, TCC__V1__BUFFER_REF__BASE_CONSTANT);
}

/* A convolution step is a valid cuDNN call: 1 to 3 spatial dims in
 * every list, the output size the geometry gives, a float dtype (TF32
 * only for float32), and dense NCHW operands inside the buffers they
 * name, the written one neither an input nor a constant. */
static void check_conv(const Tcc__V1__Manifest *m, const Tcc__V1__KernelInfo *ki, const char *what) {
  const Tcc__V1__ConvStep *C = ki->conv;
  size_t S = C->n_input_size;
  ck_assert_msg(S >= 1 && S <= 3 && C->n_kernel_size == S && C->n_output_size == S && C->n_stride == S &&
                    C->n_padding == S && C->n_dilation == S,
                "%s: conv step %s lists %zu spatial dims unevenly", what, ki->name, S);
  ck_assert(C->dtype == TCC__V1__DTYPE__FLOAT32 || C->dtype == TCC__V1__DTYPE__FLOAT64 ||
            C->dtype == TCC__V1__DTYPE__FLOAT16 || C->dtype == TCC__V1__DTYPE__BFLOAT16);
  ck_assert(!C->tf32 || C->dtype == TCC__V1__DTYPE__FLOAT32);
  ck_assert(C->groups >= 1 && C->in_channels % C->groups == 0 && C->out_channels % C->groups == 0);
  int64_t x = C->n * C->in_channels, y = C->n * C->out_channels, w = C->out_channels * (C->in_channels / C->groups);
  for (size_t d = 0; d < S; d++) {
    ck_assert_int_eq((C->input_size[d] + 2 * C->padding[d] - C->dilation[d] * (C->kernel_size[d] - 1) - 1) /
                             C->stride[d] + 1,
                     C->output_size[d]);
    x *= C->input_size[d], y *= C->output_size[d], w *= C->kernel_size[d];
  }
  int bd = C->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_DATA, bf = C->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER;
  ck_assert(C->kind == TCC__V1__CONV_STEP__KIND__FORWARD || bd || bf);
  const Tcc__V1__BufferRef *xr = bd ? C->dx : C->x, *wr = bf ? C->dw : C->w;
  check_ref(m, xr, C->dtype, x, 1, x, 0, 1, what);
  check_ref(m, wr, C->dtype, w, 1, w, 0, 1, what);
  check_ref(m, C->y, C->dtype, y, 1, y, 0, 1, what);
  const Tcc__V1__BufferRef *written = bd ? xr : bf ? wr : C->y;
  ck_assert_int_ne(written->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);
  ck_assert_int_ne(written->base_case, TCC__V1__BUFFER_REF__BASE_CONSTANT);
}

/* Checks a successful CUDA compile of p for arch. */
static void check_artifact(const tcc_prepared *p, const tcc_artifact *a, const char *arch,
                           const char *what) {
  const tcc_graph *g = p->graph;
  ck_assert_int_eq(a->kind, TCC__V1__ARTIFACT_KIND__CUBIN);
  ck_assert_int_eq(tcc_cubin_sm(a->data, a->size), atoi(arch + 3));
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a->manifest_len, a->manifest);
  ck_assert_ptr_nonnull(m);
  char target[32];
  snprintf(target, sizeof target, "cuda:%s", arch);
  ck_assert_str_eq(m->target, target);
  ck_assert_msg(strstr(m->compiler, "nvrtc "), "%s: identity '%s' does not name NVRTC", what, m->compiler);
  ck_assert_int_eq((int)m->n_inputs, g->ninputs);
  ck_assert_int_eq((int)m->n_outputs, g->noutputs);
  ck_assert_int_ge((int)m->n_kernels, a->kernels);   /* + split stages */
  /* the PTX travels in the manifest: text, naming every __global__ */
  ck_assert_msg(m->ptx.len > 0, "%s: no PTX in the manifest", what);
  ck_assert_ptr_null(memchr(m->ptx.data, 0, m->ptx.len));
  char *mptx = strndup((const char *)m->ptx.data, m->ptx.len);
  ck_assert_ptr_nonnull(strstr(mptx, ".target sm_"));
  /* the PTX of the same source: parameter lists */
  const char **names = calloc(m->n_kernels + 1, sizeof *names);
  size_t n_names = 0;
  for (size_t k = 0; k < m->n_kernels; k++)
    if (strcmp(m->kernels[k]->kind, "extern")) names[n_names++] = m->kernels[k]->name;
  tcc_nvrtc_result r;
  tcc_error err;
  ck_assert_msg(tcc_nvrtc_build(a->source, arch, names, &r, &err) == 0, "%s: %s", what, err.msg);
  for (size_t k = 0; k < m->n_kernels; k++) {
    const Tcc__V1__KernelInfo *ki = m->kernels[k];
    if (!strcmp(ki->kind, "extern")) {   /* a cuBLAS or cuDNN step: no __global__, no launch config */
      ck_assert_msg(!ki->gemm != !ki->conv, "%s: extern step %s without one GEMM or convolution", what, ki->name);
      ck_assert_int_eq((int)ki->n_grid, 0);
      ck_assert_int_eq((int)ki->n_block, 0);
      ck_assert_int_eq(tcc_cubin_has_entry(a->data, a->size, ki->name), 0);
      if (ki->gemm) check_gemm(m, ki, what);
      else check_conv(m, ki, what);
      continue;
    }
    ck_assert_ptr_null(ki->gemm);
    ck_assert_ptr_null(ki->conv);
    ck_assert_int_eq(tcc_cubin_has_entry(a->data, a->size, ki->name), 1);
    char entry[64];
    snprintf(entry, sizeof entry, ".entry %s(", ki->name);
    ck_assert_msg(strstr(mptx, entry), "%s: the manifest's PTX lacks %s", what, entry);
    if (!strcmp(ki->kind, "split-reduction")) {   /* grid (groups, rows), then its k<j> */
      ck_assert_int_eq((int)ki->n_grid, 2);
      ck_assert(ki->grid[0] >= 2 && ki->grid[1] >= 1);
      ck_assert_uint_lt(k + 1, m->n_kernels);
      ck_assert_msg(!strncmp(ki->name, m->kernels[k + 1]->name, strlen(m->kernels[k + 1]->name)) &&
                        !strcmp(ki->name + strlen(m->kernels[k + 1]->name), "_split"),
                    "%s: %s is not followed by its final stage", what, ki->name);
    } else {
      ck_assert_int_eq((int)ki->n_grid, 1);
    }
    ck_assert_int_eq((int)ki->n_block, 1);
    ck_assert(ki->grid[0] >= 1 && ki->grid[0] <= 65536);
    ck_assert(ki->block[0] >= 32 && ki->block[0] <= 1024 && ki->block[0] % 32 == 0);
    ck_assert(!strcmp(ki->kind, "pointwise") || !strcmp(ki->kind, "reduction") ||
              !strcmp(ki->kind, "split-reduction"));
    ck_assert_int_eq(ptx_params(r.ptx, ki->name), g->ninputs + g->noutputs + 1);
  }
  free(mptx);
  if (strstr(a->source, "tcc_vec<float, 4> v0;")) /* a contiguous float32 output: 128-bit stores */
    ck_assert_msg(strstr(r.ptx, "st.global.v4.f32"), "%s: no 128-bit store in the PTX", what);
  tcc_nvrtc_result_free(&r);
  if (cuobjdump && objdumps > 0) {
    objdumps--;
    char path[1024];
    snprintf(path, sizeof path, "%s/k.cubin", tmpdir);
    ck_assert_int_eq(tt_write_file(path, a->data, a->size), 0);
    char *elf = tt_cuobjdump_run("-elf", path);
    for (size_t k = 0; k < m->n_kernels; k++) {
      char sec[64];
      snprintf(sec, sizeof sec, ".text.%s\n", m->kernels[k]->name);
      if (!strcmp(m->kernels[k]->kind, "extern"))   /* cuBLAS runs it: no code of ours */
        ck_assert_msg(!strstr(elf, sec), "%s: cuobjdump -elf lists extern step %s", what, sec);
      else
        ck_assert_msg(strstr(elf, sec), "%s: cuobjdump -elf lacks %s", what, sec);
    }
    free(elf);
  }
  free(names);
  tcc__v1__manifest__free_unpacked(m, NULL);
}

/* Prepares + compiles req for arch; returns tcc_compile's code (err
 * filled) and checks the artifact when it is 0. */
static int compile_for(Tcc__V1__CompileRequest *req, const char *arch, const char *what,
                       tcc_error *err) {
  tcc_prepared *p;
  int rc = tcc_prepare(req, "test-id", &p, err);
  ck_assert_msg(rc == 0, "%s: prepare: %s", what, err->msg);
  ck_assert_int_eq(p->device, TCC__V1__DEVICE_TYPE__CUDA);
  tcc_artifact a;
  rc = tcc_compile(p, NULL, &a, err);
  if (!rc) {
    check_artifact(p, &a, arch, what);
    tcc_artifact_free(&a);
  }
  tcc_prepared_free(p);
  return rc;
}

/* Prepares and compiles req for arch, asserting both succeed, and checks
 * the artifact (the caller frees it). */
static void compile_checked(Tcc__V1__CompileRequest *req, const char *arch, const char *what, tcc_artifact *art) {
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(req, "test-id", &p, &err) == 0, "%s: %s", what, err.msg);
  ck_assert_msg(tcc_compile(p, NULL, art, &err) == 0, "%s: %s", what, err.msg);
  check_artifact(p, art, arch, what);
  tcc_prepared_free(p);
}

/* ------------------------------------------------------------- graphs */

static int has_matmul(const Tcc__V1__CompileRequest *req) {
  for (size_t i = 0; i < req->graph->n_nodes; i++) {
    const char *t = req->graph->nodes[i]->target;
    if (strstr(t, "mm") || strstr(t, "matmul") || strstr(t, "linear") || strstr(t, "baddbmm") ||
        strstr(t, "convolution"))
      return 1;
  }
  return 0;
}

START_TEST(example_graphs) {
  tt_graph g = {0};
  while (tt_graph_next(&g)) {
    for (size_t a = 0; a < 2; a++) {
      Tcc__V1__CompileRequest *req = tt_graph_request(&g, ARCHS[a]);
      tcc_error err;
      int rc = compile_for(req, ARCHS[a], g.name, &err);
      ck_assert_msg(rc == 0, "%s for %s: %s", g.name, ARCHS[a], err.msg);
      printf("  %s %s: ok%s\n", g.name, ARCHS[a], has_matmul(req) ? " (cuBLAS step)" : "");
      if (!strcmp(g.name, "sin_cos.json")) {   /* 10x10 float32 contiguous: vectorized */
        char *src;
        size_t sl;
        tcc_prepared *p;
        ck_assert_int_eq(tcc_prepare(req, "test-id", &p, &err), 0);
        ck_assert_int_eq(tcc_generate_source(p, &src, &sl, NULL, &err), 0);
        ck_assert_ptr_nonnull(strstr(src, "tcc_vec<float, 4> v"));
        free(src);
        tcc_prepared_free(p);
      }
      protobuf_c_message_free_unpacked(&req->base, NULL);
    }
  }
  ck_assert_int_ge(g.count, 5);
}
END_TEST

/* ------------------------------------------------------- one-op graphs */

typedef struct outmeta {
  Tcc__V1__DType dt;
  int rank;
  int64_t sizes[TCC_MAX_DIMS];
} outmeta;

typedef struct param {
  char type[32], name[48];
  int has_default, kw;
} param;

/* Splits "name.overload(T a, T b=1, *, T c=2) -> (Tensor, Tensor)" into
 * params; returns their count and *nret (tensor returns). */
static int parse_schema(const char *schema, param *ps, int cap, int *nret) {
  const char *o = strchr(schema, '('), *arrow = strstr(schema, ") -> ");
  if (!o || !arrow) return -1;
  int n = 0, kw = 0;
  char buf[1024];
  size_t l = (size_t)(arrow - o - 1);
  if (l >= sizeof buf) return -1;
  memcpy(buf, o + 1, l);
  buf[l] = '\0';
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    if (!strcmp(tok, "*")) {
      kw = 1;
      continue;
    }
    if (n == cap) return -1;
    param *p = &ps[n++];
    memset(p, 0, sizeof *p);
    char *sp = strrchr(tok, ' ');
    if (!sp) return -1;
    snprintf(p->type, sizeof p->type, "%.*s", (int)(sp - tok), tok);
    snprintf(p->name, sizeof p->name, "%s", sp + 1);
    char *eq = strchr(p->name, '=');
    if (eq) {
      *eq = '\0';
      p->has_default = 1;
    }
    p->kw = kw;
  }
  const char *ret = arrow + 5;
  *nret = 0;
  for (const char *q = strstr(ret, "Tensor"); q; q = strstr(q + 1, "Tensor")) (*nret)++;
  return n;
}

static Tcc__V1__DType dtype_by_name(const char *name) {
  for (int d = 1; d < 32; d++) {
    const char *n = tcc_dtype_name((tcc_dtype)d);
    if (n && !strcmp(n, name)) return (Tcc__V1__DType)d;
  }
  return TCC__V1__DTYPE__DTYPE_UNSPECIFIED;
}

/* Reads "[4, 33]" into m. */
static int parse_shape(const char *s, outmeta *m) {
  if (*s != '[') return -1;
  m->rank = 0;
  s++;
  while (*s && *s != ']') {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || m->rank == TCC_MAX_DIMS) return -1;
    m->sizes[m->rank++] = v;
    s = end;
    while (*s == ',' || *s == ' ') s++;
  }
  return 0;
}

static const int64_t SHAPE[2] = {4, 33};

/* Builds op(x[, y]) with the tensor/scalar params; NULL when the op
 * needs parameters this generator does not make. */
static reqb *op_request(const tcc_op_info *op, Tcc__V1__DType dt, const outmeta *outs, int *nout) {
  param ps[32];
  int nret;
  int np = parse_schema(op->schema, ps, 32, &nret);
  if (np < 0 || nret < 1 || nret > 4 || strstr(op->schema, "-> Tensor[]")) return NULL;
  int required = 0;
  for (int i = 0; i < np; i++) required += !ps[i].has_default;
  if (required > 8) return NULL;   /* reqb's capacity */
  reqb *b = reqb_new("");
  reqb_value(b, "x", dt, 2, SHAPE, NULL, 0);
  reqb_value(b, "y", dt, 2, SHAPE, NULL, 0);
  reqb_value(b, "z", dt, 2, SHAPE, NULL, 0);
  static const char *const tnames[] = {"x", "y", "z"};
  int nt = 0;
  char oname[8][8];
  for (int r = 0; r < nret; r++) {
    snprintf(oname[r], sizeof oname[r], "o%d", r);
    reqb_value(b, oname[r], outs[r].dt, outs[r].rank, outs[r].sizes, NULL, 0);
  }
  Tcc__V1__Node *n = reqb_node(b, op->target, oname[0]);
  for (int r = 1; r < nret; r++) reqb_node_output(b, n, oname[r]);
  for (int i = 0; i < np; i++) {
    const param *p = &ps[i];
    if (p->has_default) continue;
    if (!strcmp(p->type, "Tensor")) {
      if (nt == 3) goto unsupported;
      reqb_arg_tensor(b, n, p->name, tnames[nt++]);
    } else if (!strcmp(p->type, "Scalar") || !strcmp(p->type, "float")) {
      reqb_arg_float(b, n, p->name, 0.5);
    } else if (!strcmp(p->type, "int") || !strcmp(p->type, "SymInt")) {
      reqb_arg_int(b, n, p->name, 1);
    } else if (!strcmp(p->type, "bool")) {
      reqb_arg_bool(b, n, p->name, 0);
    } else if (!strncmp(p->type, "int[", 4)) {
      static const int64_t one[1] = {1};
      reqb_arg_ints(b, n, p->name, 1, one);
    } else if (!strcmp(p->type, "SymInt[]")) {
      reqb_arg_ints(b, n, p->name, 2, SHAPE);
    } else if (strchr(p->type, '?')) {
      reqb_arg_none(b, n, p->name);
    } else {
      goto unsupported;
    }
  }
  for (int i = 0; i < nt; i++) reqb_input(b, tnames[i]);
  for (int r = 0; r < nret; r++) reqb_output(b, oname[r]);
  *nout = nret;
  return b;
unsupported:
  reqb_free(b);
  return NULL;
}

/* Finds the output metas (asking the verifier), then compiles for both
 * archs. Returns 1 compiled, 0 not expressible here, -1 matmul refused. */
static int compile_op(const tcc_op_info *op, Tcc__V1__DType dt, char *why, size_t cap) {
  outmeta outs[8];
  for (int r = 0; r < 8; r++) {
    outs[r].dt = dt;
    outs[r].rank = 2;
    outs[r].sizes[0] = SHAPE[0];
    outs[r].sizes[1] = SHAPE[1];
  }
  for (int attempt = 0; attempt < 12; attempt++) {
    int nout = 0;
    reqb *b = op_request(op, dt, outs, &nout);
    if (!b) {
      snprintf(why, cap, "parameters");
      return 0;
    }
    Tcc__V1__CompileRequest *req = reqb_req(b);
    tcc_prepared *p;
    tcc_error err;
    int rc = tcc_prepare(req, "test-id", &p, &err);
    if (rc) {
      const char *o = strstr(err.msg, "output 'o");
      const char *decl = strstr(err.msg, "but the op produces ");
      if (o && decl) {
        int r = o[9] - '0';
        const char *what = decl + 20;
        if (*what == '[') parse_shape(what, &outs[r]);
        else {
          char name[32];
          snprintf(name, sizeof name, "%s", what);
          outs[r].dt = dtype_by_name(name);
        }
        reqb_free(b);
        continue;
      }
      snprintf(why, cap, "%.200s", err.msg);
      reqb_free(b);
      return 0;
    }
    /* what the CPU backend cannot generate is no CUDA question */
    char *csrc;
    size_t clen;
    rc = tcc_generate_source(p, &csrc, &clen, NULL, &err);
    tcc_prepared_free(p);
    if (rc) {
      snprintf(why, cap, "CPU: %.200s", err.msg);
      reqb_free(b);
      return 0;
    }
    free(csrc);
    int result = 1;
    for (size_t a = 0; a < 2; a++) {
      tt_request_to_cuda(req, reqb_str(b, ARCHS[a]));
      char what[160];
      snprintf(what, sizeof what, "%s (%s)", op->target, tcc_dtype_name((tcc_dtype)dt));
      rc = compile_for(req, ARCHS[a], what, &err);
      if (rc == TCC_E_UNIMPLEMENTED && !strcmp(op->kind, "extern")) {   /* CPU attention: no CUDA */
        ck_assert_msg(strstr(err.msg, op->target), "%s", err.msg);
        result = -1;
        continue;
      }
      ck_assert_msg(rc == 0, "%s for %s: %s", what, ARCHS[a], err.msg);
    }
    reqb_free(b);
    return result;
  }
  snprintf(why, cap, "output metas not found");
  return 0;
}

START_TEST(every_op) {
  size_t n = tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CPU, NULL, 0);
  tcc_op_info *ops = calloc(n, sizeof *ops);
  tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CPU, ops, n);
  int built = 0, refused = 0, skipped = 0;
  for (size_t i = 0; i < n; i++) {
    char why[256] = "";
    int r = compile_op(&ops[i], TCC__V1__DTYPE__FLOAT32, why, sizeof why);
    if (!r) r = compile_op(&ops[i], TCC__V1__DTYPE__INT32, why, sizeof why);
    if (!r) r = compile_op(&ops[i], TCC__V1__DTYPE__BOOL, why, sizeof why);
    if (r > 0) built++;
    else if (r < 0) refused++;
    else {
      skipped++;
      printf("  not generated: %s (%s)\n", ops[i].target, why);
    }
    if (r > 0 && !strcmp(ops[i].kind, "pointwise")) {
      static const Tcc__V1__DType more[] = {TCC__V1__DTYPE__FLOAT64, TCC__V1__DTYPE__FLOAT16,
                                            TCC__V1__DTYPE__BFLOAT16, TCC__V1__DTYPE__INT32};
      for (size_t d = 0; d < 4; d++) compile_op(&ops[i], more[d], why, sizeof why);
    }
  }
  printf("  ops: %d compiled for sm_80 and sm_90, %d refused (extern, not matmul), %d not generated, of %zu\n",
         built, refused, skipped, n);
  ck_assert_int_gt(built, (int)n / 2);
  free(ops);
}
END_TEST

/* ------------------------------------------------------ reductions */

/* x [R, C] -> op over dim 1, compiled for both archs. */
static void reduction(const char *target, int ret_dt_same, int with_dim, int keepdim, Tcc__V1__DType dt,
                      Tcc__V1__DType odt, int64_t R, int64_t C) {
  for (size_t a = 0; a < 2; a++) {
    reqb *b = reqb_new("");
    reqb_value(b, "x", dt, 2, (int64_t[]){R, C}, NULL, 0);
    if (ret_dt_same) odt = dt;
    if (keepdim) reqb_value(b, "o", odt, 2, (int64_t[]){R, 1}, NULL, 0);
    else reqb_value(b, "o", odt, 1, (int64_t[]){R}, NULL, 0);
    reqb_input(b, "x");
    Tcc__V1__Node *n = reqb_node(b, target, "o");
    reqb_arg_tensor(b, n, "self", "x");
    if (with_dim) {
      Tcc__V1__Argument *arg = reqb_arg_int(b, n, "dim", 1);
      (void)arg;
    }
    if (keepdim) reqb_arg_bool(b, n, "keepdim", 1);
    reqb_output(b, "o");
    Tcc__V1__CompileRequest *req = reqb_req(b);
    tt_request_to_cuda(req, reqb_str(b, ARCHS[a]));
    tcc_error err;
    char what[128];
    snprintf(what, sizeof what, "%s [%lld, %lld]", target, (long long)R, (long long)C);
    int rc = compile_for(req, ARCHS[a], what, &err);
    ck_assert_msg(rc == 0, "%s: %s", what, err.msg);
    reqb_free(b);
  }
}

START_TEST(reductions_over_a_dim) {
  static const int64_t cols[] = {1, 7, 32, 1000, 5000};
  for (size_t c = 0; c < 5; c++) {
    reduction("aten.argmax.default", 0, 1, 0, TCC__V1__DTYPE__FLOAT32, TCC__V1__DTYPE__INT64, 6, cols[c]);
    reduction("aten.argmin.default", 0, 1, 1, TCC__V1__DTYPE__FLOAT64, TCC__V1__DTYPE__INT64, 3, cols[c]);
  }
}
END_TEST

/* softmax / log_softmax / layer_norm: ONE reduction kernel each. */
static void one_kernel(const char *target, Tcc__V1__DType dt, int64_t R, int64_t C) {
  for (size_t a = 0; a < 2; a++) {
    reqb *b = reqb_softmax(target, dt, R, C);
    tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
    tcc_artifact art;
    compile_checked(reqb_req(b), ARCHS[a], target, &art);
    ck_assert_int_eq(art.kernels, 1);
    /* a warp per row for rows of up to 32, and for many rows (2048 or
     * more) of up to 1024; else block reductions */
    int warp = C <= 32 || (R >= 2048 && C <= 1024);
    ck_assert_msg(strstr(art.source, warp ? "= tcc_warp_reduce(a" : "= tcc_block_reduce(a") &&
                      !strstr(art.source, warp ? "= tcc_block_reduce(a" : "= tcc_warp_reduce(a"),
                  "%s [%lld, %lld]: want %s reductions", target, (long long)R, (long long)C, warp ? "warp" : "block");
    ck_assert_ptr_nonnull(strstr(art.source, "__shfl_down_sync"));
    tcc_artifact_free(&art);
    reqb_free(b);
  }
}

START_TEST(softmax_is_one_kernel) {
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, 8, 1000);
  one_kernel("aten._log_softmax.default", TCC__V1__DTYPE__FLOAT32, 3, 77);
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__FLOAT16, 5, 4096);
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__BFLOAT16, 5, 300);
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, 100, 17);   /* warp per row */
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, 75648, 197); /* ViT-B's attention: warp */
  one_kernel("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, 2047, 197);  /* fewer rows: block */
  one_kernel("aten._log_softmax.default", TCC__V1__DTYPE__FLOAT32, 4096, 1025); /* longer rows: block */
}
END_TEST

/* native_layer_norm (out, mean, rstd): one kernel; sum/mean/var over
 * dim 0 (a column reduction) and a whole-tensor sum. */
static void ln_or_reduce(int which, Tcc__V1__DType dt, int64_t R, int64_t C) {
  static const int64_t dim0[1] = {0}, dim1[1] = {1};
  for (size_t a = 0; a < 2; a++) {
    reqb *b;
    const char *what;
    if (which == 0) {
      what = "layer_norm";
      b = reqb_layer_norm(dt, R, C, 0);
    } else {
      b = reqb_new("");
      reqb_value(b, "x", dt, 2, (int64_t[]){R, C}, NULL, 0);
      reqb_value(b, "w", dt, 1, (int64_t[]){C}, NULL, 0);
      reqb_input(b, "x");
      Tcc__V1__Node *n;
      if (which == 1) {
        what = "sum over dim 0";
        reqb_value(b, "o", tcc_dtype_is_float((tcc_dtype)dt) ? dt : TCC__V1__DTYPE__INT64, 1,
                   (int64_t[]){C}, NULL, 0);
        n = reqb_node(b, "aten.sum.dim_IntList", "o");
        reqb_arg_tensor(b, n, "self", "x");
        reqb_arg_ints(b, n, "dim", 1, dim0);
      } else {
        what = "var over dim 1";
        reqb_value(b, "o", dt, 1, (int64_t[]){R}, NULL, 0);
        n = reqb_node(b, "aten.var.correction", "o");
        reqb_arg_tensor(b, n, "self", "x");
        reqb_arg_ints(b, n, "dim", 1, dim1);
      }
      reqb_output(b, "o");
    }
    tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
    tcc_artifact art;
    compile_checked(reqb_req(b), ARCHS[a], what, &art);
    if (which == 0) ck_assert_int_eq(art.kernels, 1);
    int64_t red = which == 1 ? R : C;
    if (red > 16) {
      int rows = which == 1 ? C : R, warp = red <= 32 || (rows >= 2048 && red <= 1024);
      ck_assert_ptr_nonnull(strstr(art.source, warp ? "= tcc_warp_reduce(a" : "= tcc_block_reduce(a"));
    } else {
      /* at most 16 elements: each thread folds its own, no shuffles */
      ck_assert_ptr_null(strstr(art.source, "= tcc_block_reduce(a"));
      ck_assert_ptr_null(strstr(art.source, "= tcc_warp_reduce(a"));
      ck_assert_ptr_nonnull(strstr(art.source, "++) {"));
    }
    tcc_artifact_free(&art);
    reqb_free(b);
  }
}

START_TEST(layer_norm_and_dim_reductions) {
  ln_or_reduce(0, TCC__V1__DTYPE__FLOAT32, 16, 768);
  ln_or_reduce(0, TCC__V1__DTYPE__FLOAT32, 6304, 768);   /* ViT-B's 32 x 197 tokens: a warp per row */
  ln_or_reduce(0, TCC__V1__DTYPE__BFLOAT16, 3, 100);
  ln_or_reduce(0, TCC__V1__DTYPE__FLOAT64, 2, 5);
  ln_or_reduce(1, TCC__V1__DTYPE__FLOAT32, 1000, 3);
  ln_or_reduce(1, TCC__V1__DTYPE__INT32, 10, 7);
  ln_or_reduce(2, TCC__V1__DTYPE__FLOAT32, 7, 513);
}
END_TEST

/* permute, index_select / gather (index values read from a
 * tensor, int64). */
START_TEST(views_cat_and_indexing) {
  static const int64_t perm[2] = {1, 0};
  for (size_t a = 0; a < 2; a++) {
    for (int which = 0; which < 4; which += 1 + (which == 0)) {
      reqb *b = reqb_new("");
      reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, SHAPE, NULL, 0);
      reqb_input(b, "x");
      Tcc__V1__Node *n;
      if (which == 0) {
        reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){33, 4}, (int64_t[]){1, 33}, 0);
        n = reqb_node(b, "aten.permute.default", "o");
        reqb_arg_tensor(b, n, "self", "x");
        reqb_arg_ints(b, n, "dims", 2, perm);
        /* a view output aliasing an input is not a kernel: add 1 */
        reqb_value(b, "o2", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){33, 4}, NULL, 0);
        Tcc__V1__Node *m = reqb_node(b, "aten.add.Scalar", "o2");
        reqb_arg_tensor(b, m, "self", "o");
        reqb_arg_float(b, m, "other", 1.0);
        reqb_output(b, "o2");
      } else if (which == 2) {
        reqb_value(b, "i", TCC__V1__DTYPE__INT64, 1, (int64_t[]){5}, NULL, 0);
        reqb_input(b, "i");
        reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){5, 33}, NULL, 0);
        n = reqb_node(b, "aten.index_select.default", "o");
        reqb_arg_tensor(b, n, "self", "x");
        reqb_arg_int(b, n, "dim", 0);
        reqb_arg_tensor(b, n, "index", "i");
        reqb_output(b, "o");
      } else {
        reqb_value(b, "i", TCC__V1__DTYPE__INT64, 2, (int64_t[]){4, 3}, NULL, 0);
        reqb_input(b, "i");
        reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){4, 3}, NULL, 0);
        n = reqb_node(b, "aten.gather.default", "o");
        reqb_arg_tensor(b, n, "self", "x");
        reqb_arg_int(b, n, "dim", 1);
        reqb_arg_tensor(b, n, "index", "i");
        reqb_output(b, "o");
      }
      Tcc__V1__CompileRequest *req = reqb_req(b);
      tt_request_to_cuda(req, reqb_str(b, ARCHS[a]));
      tcc_error err;
      static const char *const names[] = {"permute", "", "index_select", "gather"};
      int rc = compile_for(req, ARCHS[a], names[which], &err);
      ck_assert_msg(rc == 0, "%s: %s", names[which], err.msg);
      reqb_free(b);
    }
  }
}
END_TEST

/* The key differs between archs and from CPU (same graph). */
START_TEST(keys_differ_by_arch) {
  char hashes[3][TCC_SHA256_HEX];
  for (int a = 0; a < 3; a++) {
    reqb *b = reqb_new("");
    reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, SHAPE, NULL, 0);
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, SHAPE, NULL, 0);
    reqb_input(b, "x");
    reqb_unary(b, "aten.sin.default", "x", "o");
    reqb_output(b, "o");
    if (a < 2) tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
    tcc_prepared *p;
    tcc_error err;
    ck_assert_msg(tcc_prepare(reqb_req(b), "test-id", &p, &err) == 0, "%s", err.msg);
    strcpy(hashes[a], p->hash_hex);
    if (a < 2) ck_assert_ptr_nonnull(memmem(p->key, p->key_len, "nvrtc ", 6));
    tcc_prepared_free(p);
    reqb_free(b);
  }
  ck_assert_str_ne(hashes[0], hashes[1]);
  ck_assert_str_ne(hashes[0], hashes[2]);
  ck_assert_str_ne(hashes[1], hashes[2]);
}
END_TEST

/* ------------------------------------------------------------ matmul */

/* Compiles req for both archs and returns the sm_90 manifest (caller
 * frees) after the generic checks. */
static Tcc__V1__Manifest *compile_manifest(reqb *b, const char *what, char **source) {
  Tcc__V1__Manifest *keep = NULL;
  for (size_t a = 0; a < 2; a++) {
    tt_request_to_cuda(reqb_req(b), reqb_str(b, ARCHS[a]));
    tcc_artifact art;
    compile_checked(reqb_req(b), ARCHS[a], what, &art);
    Tcc__V1__Manifest *mm = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
    for (size_t k = 0; k < mm->n_kernels; k++) {   /* constants cuBLAS reads are symbols of the cubin */
      const Tcc__V1__GemmStep *gs = mm->kernels[k]->gemm;
      const Tcc__V1__BufferRef *refs[2] = {gs ? gs->a : NULL, gs ? gs->b : NULL};
      for (int r = 0; r < 2; r++)
        if (refs[r] && refs[r]->base_case == TCC__V1__BUFFER_REF__BASE_CONSTANT)
          ck_assert_msg(memmem(art.data, art.size, refs[r]->constant, strlen(refs[r]->constant) + 1),
                        "%s: the cubin has no symbol %s", what, refs[r]->constant);
    }
    tcc__v1__manifest__free_unpacked(mm, NULL);
    if (a == 1) {
      keep = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
      if (source) *source = strdup(art.source);
    }
    tcc_artifact_free(&art);
  }
  ck_assert_ptr_nonnull(keep);
  return keep;
}

/* The extern steps of m, in order; returns their count. */
static int gemm_steps(const Tcc__V1__Manifest *m, const Tcc__V1__KernelInfo **out, int cap) {
  int n = 0;
  for (size_t k = 0; k < m->n_kernels; k++)
    if (!strcmp(m->kernels[k]->kind, "extern") && n < cap) out[n++] = m->kernels[k];
  return n;
}

/* o = x @ w, float32 [33, 70] @ [70, 45], into b. */
static void mm_33x70x45(reqb *b) {
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){33, 70}, NULL, 0);
  reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){70, 45}, NULL, 0);
  reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){33, 45}, NULL, 0);
  reqb_input(b, "x");
  reqb_input(b, "w");
  reqb_binary(b, "aten.mm.default", "x", "w", "o");
  reqb_req(b)->graph->nodes[0]->inputs[1]->name = reqb_str(b, "mat2");
  reqb_output(b, "o");
}

START_TEST(matmul_family) {
  const Tcc__V1__KernelInfo *g[4];
  /* mm: [M,K] @ [K,N] row-major = cuBLAS C^T = B^T A^T: m=N, n=M, both N */
  {
    reqb *b = reqb_new("");
    mm_33x70x45(b);
    Tcc__V1__Manifest *m = compile_manifest(b, "mm", NULL);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert_int_eq(g[0]->gemm->m, 45);
    ck_assert_int_eq(g[0]->gemm->n, 33);
    ck_assert_int_eq(g[0]->gemm->k, 70);
    ck_assert(!g[0]->gemm->trans_a && !g[0]->gemm->trans_b);
    ck_assert_int_eq(g[0]->gemm->lda, 45);
    ck_assert_int_eq(g[0]->gemm->ldb, 70);
    ck_assert_int_eq(g[0]->gemm->ldc, 45);
    ck_assert_int_eq(g[0]->gemm->a->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);
    ck_assert_int_eq(g[0]->gemm->a->input, 1);   /* cuBLAS's A is w */
    ck_assert_int_eq(g[0]->gemm->b->input, 0);
    ck_assert_str_eq(m->kernels[0]->kind, "extern");   /* the GEMM runs first */
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  /* linear(x [4,5,64], w [96,64], bias) then gelu: w read transposed
   * (op T), x flattened to M = 20; the epilogue kernel after the GEMM */
  {
    reqb *b = reqb_linear_gelu(3, (int64_t[]){4, 5, 64}, 96);
    char *src;
    Tcc__V1__Manifest *m = compile_manifest(b, "linear+gelu", &src);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert_int_eq(g[0]->gemm->m, 96);
    ck_assert_int_eq(g[0]->gemm->n, 20);
    ck_assert_int_eq(g[0]->gemm->k, 64);
    ck_assert(g[0]->gemm->trans_a && !g[0]->gemm->trans_b);
    ck_assert_int_eq(g[0]->gemm->lda, 64);
    ck_assert_int_eq(g[0]->gemm->c->base_case, TCC__V1__BUFFER_REF__BASE_WORKSPACE);
    /* the fused bias + gelu epilogue is one kernel launched after the GEMM */
    ck_assert_int_eq((int)m->n_kernels, 2);
    ck_assert_str_eq(m->kernels[0]->kind, "extern");
    ck_assert_str_eq(m->kernels[1]->kind, "pointwise");
    ck_assert_ptr_nonnull(strstr(src, "erff("));
    free(src);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  /* bmm in float16 / bfloat16 (half operands, float32 C) and float64;
   * addmm; matmul broadcasting [B,M,K] @ [K,N] (stride_b 0) */
  static const Tcc__V1__DType dts[] = {TCC__V1__DTYPE__FLOAT16, TCC__V1__DTYPE__BFLOAT16, TCC__V1__DTYPE__FLOAT64};
  for (size_t d = 0; d < 3; d++) {
    reqb *b = reqb_new("");
    reqb_value(b, "x", dts[d], 3, (int64_t[]){3, 16, 24}, NULL, 0);
    reqb_value(b, "y", dts[d], 3, (int64_t[]){3, 24, 8}, NULL, 0);
    reqb_value(b, "o", dts[d], 3, (int64_t[]){3, 16, 8}, NULL, 0);
    reqb_input(b, "x");
    reqb_input(b, "y");
    Tcc__V1__Node *n = reqb_node(b, "aten.bmm.default", "o");
    reqb_arg_tensor(b, n, "self", "x");
    reqb_arg_tensor(b, n, "mat2", "y");
    reqb_output(b, "o");
    Tcc__V1__Manifest *m = compile_manifest(b, "bmm", NULL);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert_int_eq(g[0]->gemm->a_dtype, dts[d]);
    ck_assert_int_eq(g[0]->gemm->batch_count, 3);
    ck_assert_int_eq(g[0]->gemm->stride_a, 24 * 8);
    ck_assert_int_eq(g[0]->gemm->stride_b, 16 * 24);
    ck_assert_int_eq(g[0]->gemm->stride_c, 16 * 8);
    ck_assert_int_eq(g[0]->gemm->a->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);   /* read as they are */
    ck_assert_int_eq(g[0]->gemm->b->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  {
    reqb *b = reqb_new("");
    reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 3, (int64_t[]){6, 10, 12}, NULL, 0);
    reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){12, 7}, NULL, 0);
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 3, (int64_t[]){6, 10, 7}, NULL, 0);
    reqb_input(b, "x");
    reqb_input(b, "w");
    reqb_binary(b, "aten.matmul.default", "x", "w", "o");
    reqb_output(b, "o");
    Tcc__V1__Manifest *m = compile_manifest(b, "matmul broadcast", NULL);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert(g[0]->gemm->batch_count == 6 || g[0]->gemm->batch_count == 1);
    if (g[0]->gemm->batch_count == 6) ck_assert_int_eq(g[0]->gemm->stride_a, 0);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  /* a constant weight: cuBLAS reads the module's __device__ array */
  {
    reqb *b = reqb_new("");
    float wdata[8 * 3];
    for (int i = 0; i < 24; i++) wdata[i] = 0.25f * (float)(i % 7) - 0.5f;
    reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){5, 8}, NULL, 0);
    reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){8, 3}, NULL, 0);
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){5, 3}, NULL, 0);
    reqb_input(b, "x");
    reqb_constant(b, "w", wdata, sizeof wdata);
    reqb_binary(b, "aten.mm.default", "x", "w", "o");
    reqb_req(b)->graph->nodes[0]->inputs[1]->name = reqb_str(b, "mat2");
    reqb_output(b, "o");
    char *src;
    Tcc__V1__Manifest *m = compile_manifest(b, "mm with a constant", &src);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert_int_eq(g[0]->gemm->a->base_case, TCC__V1__BUFFER_REF__BASE_CONSTANT);
    char decl[96];
    snprintf(decl, sizeof decl, "extern \"C\" __device__ const float %s[", g[0]->gemm->a->constant);
    ck_assert_msg(strstr(src, decl), "no '%s' in\n%.2000s", decl, src);
    free(src);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  {
    reqb *b = reqb_new("");
    reqb_value(b, "bias", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){9}, NULL, 0);
    reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){5, 11}, NULL, 0);
    reqb_value(b, "w", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){11, 9}, (int64_t[]){1, 11}, 0);   /* w.T view */
    reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){5, 9}, NULL, 0);
    reqb_input(b, "bias");
    reqb_input(b, "x");
    reqb_input(b, "w");
    Tcc__V1__Node *n = reqb_node(b, "aten.addmm.default", "o");
    reqb_arg_tensor(b, n, "self", "bias");
    reqb_arg_tensor(b, n, "mat1", "x");
    reqb_arg_tensor(b, n, "mat2", "w");
    reqb_output(b, "o");
    Tcc__V1__Manifest *m = compile_manifest(b, "addmm", NULL);
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ck_assert_int_eq((int)m->n_kernels, 2);   /* GEMM, then the bias epilogue */
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
}
END_TEST

/* A sum over 2^24 float32 into one value: a split reduction (grid > 1
 * for the first stage), and cuobjdump lists both stages; sums of rows;
 * two sibling sums (x and x^2, folded in one loop) split together, each
 * with its own partials. */
START_TEST(split_reduction) {
  static const int64_t shapes[][2] = {{1, INT64_C(1) << 24}, {4, 200000}, {4, 200000}};
  for (size_t s = 0; s < 3; s++) {
    reqb *b;
    int sums = s == 2 ? 2 : 1;
    if (s == 2) {
      b = reqb_sum_and_squares(shapes[s][0], shapes[s][1]);
    } else if (s == 0) {
      b = reqb_new("");
      reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, shapes[s], NULL, 0);
      reqb_value(b, "o", TCC__V1__DTYPE__FLOAT32, 0, NULL, NULL, 0);
      reqb_input(b, "x");
      reqb_unary(b, "aten.sum.default", "x", "o");
      reqb_output(b, "o");
    } else {
      b = reqb_sum_rows(shapes[s][0], shapes[s][1]);
    }
    char *src;
    objdumps++;
    Tcc__V1__Manifest *m = compile_manifest(b, "split sum", &src);
    ck_assert_int_eq((int)m->n_kernels, 2);
    ck_assert_str_eq(m->kernels[0]->kind, "split-reduction");
    ck_assert_str_eq(m->kernels[0]->name, "k0_split");
    ck_assert_int_ge(m->kernels[0]->grid[0], 2);
    ck_assert_int_eq(m->kernels[0]->grid[1], shapes[s][0]);
    ck_assert_str_eq(m->kernels[1]->name, "k0");
    ck_assert_int_eq(m->kernels[1]->grid[0], shapes[s][0]);
    ck_assert_int_ge(m->workspace_bytes, m->kernels[0]->grid[0] * shapes[s][0] * 8 * sums);
    ck_assert_ptr_nonnull(strstr(src, "gridDim.x * blockDim.x"));
    /* the split stage writes one partial per reduction, the final stage
     * folds each reduction's own */
    const char *stage = strstr(src, "k0_split(");
    ck_assert_ptr_nonnull(stage);
    long long at[2] = {-1, -1};
    int writes = 0;
    for (const char *q = stage; (q = strstr(q, "+ blockIdx.x] = a")); q++) {
      const char *w = q;
      while (w > stage && strncmp(w, "(ws + ", 6)) w--;
      if (writes < 2) at[writes] = strtoll(w + 6, NULL, 10);
      writes++;
    }
    ck_assert_int_eq(writes, sums);
    if (sums == 2) {
      ck_assert_ptr_nonnull(strstr(src, "2 reductions over the same 200000 elements, folded in one loop"));
      ck_assert_int_eq(at[1] - at[0], m->kernels[0]->grid[0] * shapes[s][0] * 8);
    }
    printf("  split %s [%lld, %lld]: %lld x %lld blocks, then %lld\n", sums == 2 ? "sum and sum of squares" : "sum",
           (long long)shapes[s][0], (long long)shapes[s][1], (long long)m->kernels[0]->grid[0],
           (long long)m->kernels[0]->grid[1], (long long)m->kernels[1]->grid[0]);
    free(src);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
}
END_TEST

/* float32 GEMMs compute in TF32 where the target allows it, as PyTorch
 * does: a convolution's with cuda_conv_tf32 (cudnn.allow_tf32), a
 * matmul's with cuda_matmul_tf32; the flags are part of the key. */
static const char *gemm_compute(int conv, int conv_tf32, int matmul_tf32, uint8_t key_hash[32]) {
  const Tcc__V1__DType dt = TCC__V1__DTYPE__FLOAT32;
  reqb *b = reqb_new("");
  if (conv) {
    reqb_value(b, "x", dt, 4, (int64_t[]){2, 3, 8, 8}, NULL, 0);
    reqb_value(b, "w", dt, 4, (int64_t[]){4, 3, 3, 3}, NULL, 0);
    reqb_value(b, "y", dt, 4, (int64_t[]){2, 4, 6, 6}, NULL, 0);
    reqb_input(b, "x");
    reqb_input(b, "w");
    Tcc__V1__Node *n = reqb_node(b, "aten.convolution.default", "y");
    reqb_arg_tensor(b, n, "input", "x");
    reqb_arg_tensor(b, n, "weight", "w");
    reqb_arg_none(b, n, "bias");
    reqb_arg_ints(b, n, "stride", 2, (int64_t[]){1, 1});
    reqb_arg_ints(b, n, "padding", 2, (int64_t[]){0, 0});
    reqb_arg_ints(b, n, "dilation", 2, (int64_t[]){1, 1});
    reqb_arg_bool(b, n, "transposed", 0);
    reqb_arg_ints(b, n, "output_padding", 2, (int64_t[]){0, 0});
    reqb_arg_int(b, n, "groups", 1);
    reqb_output(b, "y");
  } else {
    mm_33x70x45(b);
  }
  tt_request_to_cuda(reqb_req(b), reqb_str(b, "sm_90"));
  reqb_req(b)->target->cuda_conv_tf32 = conv_tf32;
  reqb_req(b)->target->cuda_matmul_tf32 = matmul_tf32;
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), "test-id", &p, &err) == 0, "%s", err.msg);
  memcpy(key_hash, p->hash, 32);
  tcc_prepared_free(p);
  Tcc__V1__Manifest *m = compile_manifest(b, conv ? "conv" : "mm", NULL);
  const Tcc__V1__KernelInfo *g[4];
  ck_assert_int_ge(gemm_steps(m, g, 4), 1);
  const char *ct;
  if (g[0]->conv) {   /* a cuDNN step: its own flag */
    ck_assert_int_eq(gemm_steps(m, g, 4), 1);
    ct = g[0]->conv->tf32 ? "32F_FAST_TF32" : "32F";
  } else {
    ct = strcmp(g[0]->gemm->compute_type, "32F") == 0 ? "32F" : "32F_FAST_TF32";
    for (int i = 0; i < gemm_steps(m, g, 4); i++) ck_assert_str_eq(g[i]->gemm->compute_type, ct);
  }
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
  return ct;
}

START_TEST(tf32_follows_the_target) {
  uint8_t h[6][32];
  for (int road = 0; road < 2; road++) {   /* cuDNN steps, then the GEMM road */
    if (road) setenv("TCC_NO_CUDNN", "1", 1);
    ck_assert_str_eq(gemm_compute(1, 1, 0, h[0]), "32F_FAST_TF32");   /* eager's default */
    ck_assert_str_eq(gemm_compute(1, 0, 0, h[1]), "32F");
    ck_assert_str_eq(gemm_compute(1, 0, 1, h[2]), "32F");             /* matmul's flag: not a conv's */
  }
  unsetenv("TCC_NO_CUDNN");
  ck_assert_str_eq(gemm_compute(0, 1, 0, h[3]), "32F");             /* eager's default */
  ck_assert_str_eq(gemm_compute(0, 0, 1, h[4]), "32F_FAST_TF32");
  ck_assert_str_eq(gemm_compute(0, 0, 0, h[5]), "32F");
  ck_assert(memcmp(h[0], h[1], 32) != 0);                           /* keyed */
  ck_assert(memcmp(h[3], h[5], 32) != 0);
}
END_TEST

/* Sibling reductions over the same elements of a row (a sum and a sum
 * of squares) fold in one loop; a reduction that reads another's result
 * (softmax's sum of exp(x - max)) does not join it. */
START_TEST(sibling_reductions_fold_in_one_loop) {
  reqb *b = reqb_sum_and_squares(64, 5000);
  char *src = NULL;
  Tcc__V1__Manifest *m = compile_manifest(b, "sum and sum of squares", &src);
  ck_assert_int_eq((int)m->n_kernels, 1);
  ck_assert_msg(strstr(src, "2 reductions over the same 5000 elements, folded in one loop"), "%s", src);
  printf("  sum and sum of squares [64, 5000]: 1 kernel, one loop for both\n");
  free(src);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
  b = reqb_softmax("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, 8, 1000);
  m = compile_manifest(b, "softmax", &src);
  ck_assert_ptr_null(strstr(src, "folded in one loop"));
  free(src);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
}
END_TEST

/* Training batch norm under autocast on CUDA: a bfloat16 input with
 * float32 weight, bias and running statistics. The saved mean and rstd
 * are float32 there (PyTorch casts them to the input's dtype on the CPU
 * only); declaring them so compiles. */
START_TEST(autocast_batch_norm_saves_float32_statistics) {
  const Tcc__V1__DType bf = TCC__V1__DTYPE__BFLOAT16, f = TCC__V1__DTYPE__FLOAT32;
  reqb *b = reqb_new("");
  reqb_value(b, "x", bf, 4, (int64_t[]){4, 8, 6, 6}, NULL, 0);
  const char *pnames[4] = {"w", "bias", "rm", "rv"};
  for (int i = 0; i < 4; i++) reqb_value(b, pnames[i], f, 1, (int64_t[]){8}, NULL, 0);
  reqb_value(b, "y", bf, 4, (int64_t[]){4, 8, 6, 6}, NULL, 0);
  const char *onames[4] = {"mean", "rstd", "rm_out", "rv_out"};
  for (int i = 0; i < 4; i++) reqb_value(b, onames[i], f, 1, (int64_t[]){8}, NULL, 0);
  reqb_input(b, "x");
  for (int i = 0; i < 4; i++) reqb_input(b, pnames[i]);
  Tcc__V1__Node *n = reqb_node(b, "aten._native_batch_norm_legit_functional.default", "y");
  for (int i = 0; i < 4; i++) reqb_node_output(b, n, onames[i]);
  reqb_arg_tensor(b, n, "input", "x");
  reqb_arg_tensor(b, n, "weight", "w");
  reqb_arg_tensor(b, n, "bias", "bias");
  reqb_arg_tensor(b, n, "running_mean", "rm");
  reqb_arg_tensor(b, n, "running_var", "rv");
  reqb_arg_bool(b, n, "training", 1);
  reqb_arg_float(b, n, "momentum", 0.1);
  reqb_arg_float(b, n, "eps", 1e-5);
  reqb_output(b, "y");
  for (int i = 0; i < 4; i++) reqb_output(b, onames[i]);
  Tcc__V1__Manifest *m = compile_manifest(b, "bfloat16 batch norm, float32 statistics", NULL);
  ck_assert_int_eq((int)m->n_outputs, 5);
  ck_assert_int_eq(m->outputs[0]->dtype, bf);
  for (int i = 1; i < 5; i++) ck_assert_int_eq(m->outputs[i]->dtype, f);
  printf("  autocast batch norm (bfloat16 input, float32 statistics): %zu steps\n", m->n_kernels);
  tcc__v1__manifest__free_unpacked(m, NULL);
  reqb_free(b);
}
END_TEST

/* Convolutions on CUDA are cuDNN steps (ConvStep): the forward reads x
 * and w where they are and writes the workspace, and one epilogue kernel
 * adds the bias and applies the relu after it; bfloat16 compiles too
 * (the GEMM road refuses it). The backward is a backward-data and a
 * backward-filter step. TCC_NO_CUDNN=1 takes the im2col + cuBLAS road. */
START_TEST(convolutions_are_cudnn_steps) {
  const Tcc__V1__DType dts[2] = {TCC__V1__DTYPE__FLOAT32, TCC__V1__DTYPE__BFLOAT16};
  for (int i = 0; i < 2; i++) {
    reqb *b = reqb_conv_bias_relu(dts[i]);
    char *src = NULL;
    Tcc__V1__Manifest *m = compile_manifest(b, "conv + bias + relu", &src);
    ck_assert_int_eq((int)m->n_kernels, 2);
    const Tcc__V1__ConvStep *C = m->kernels[0]->conv;
    ck_assert_ptr_nonnull(C);
    ck_assert_int_eq(C->kind, TCC__V1__CONV_STEP__KIND__FORWARD);
    ck_assert_int_eq(C->n, 2);
    ck_assert_int_eq(C->in_channels, 8);
    ck_assert_int_eq(C->out_channels, 12);
    ck_assert_int_eq(C->groups, 2);
    ck_assert_int_eq((int)C->n_input_size, 2);
    ck_assert_int_eq(C->output_size[0], 5);
    ck_assert_int_eq(C->stride[1], 2);
    ck_assert_int_eq(C->padding[0], 1);
    ck_assert_int_eq(C->dtype, dts[i]);
    ck_assert_int_eq(C->tf32, 0);   /* the request's target leaves cuda_conv_tf32 off */
    ck_assert_int_eq(C->x->base_case, TCC__V1__BUFFER_REF__BASE_INPUT);
    ck_assert_int_eq(C->x->input, 0);
    ck_assert_int_eq(C->w->input, 1);
    ck_assert_int_eq(C->y->base_case, TCC__V1__BUFFER_REF__BASE_WORKSPACE);
    ck_assert_str_eq(m->kernels[1]->kind, "pointwise");
    ck_assert_ptr_nonnull(strstr(src, "through cuDNN: cudnnConvolutionForward"));
    printf("  conv2d groups 2 + bias, relu (%s): cuDNN forward, then 1 epilogue kernel\n",
           dts[i] == TCC__V1__DTYPE__FLOAT32 ? "float32" : "bfloat16");
    free(src);
    tcc__v1__manifest__free_unpacked(m, NULL);
    reqb_free(b);
  }
  /* the backward, from the example graph (grad_input, grad_weight, grad_bias) */
  tt_graph g = {0};
  int seen = 0;
  while (tt_graph_next(&g)) {
    if (strcmp(g.name, "conv_backward.json")) continue;
    for (int road = 0; road < 2; road++) {
      if (road) setenv("TCC_NO_CUDNN", "1", 1);
      Tcc__V1__CompileRequest *req = tt_graph_request(&g, "sm_90");
      tcc_artifact art;
      compile_checked(req, "sm_90", g.name, &art);
      Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
      int kinds[4] = {0}, gemms = 0;
      for (size_t k = 0; k < m->n_kernels; k++) {
        if (m->kernels[k]->conv) kinds[m->kernels[k]->conv->kind]++;
        if (m->kernels[k]->gemm) gemms++;
      }
      if (!road) {
        ck_assert_int_eq(kinds[TCC__V1__CONV_STEP__KIND__BACKWARD_DATA], 1);
        ck_assert_int_eq(kinds[TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER], 1);
        ck_assert_int_eq(gemms, 0);
      } else {
        ck_assert_int_eq(kinds[1] + kinds[2] + kinds[3], 0);
        ck_assert_int_ge(gemms, 2);
      }
      printf("  conv backward stride 2 (%s): %d cuDNN steps, %d cuBLAS steps, %zu steps in all\n",
             road ? "TCC_NO_CUDNN=1" : "default", kinds[2] + kinds[3], gemms, m->n_kernels);
      tcc__v1__manifest__free_unpacked(m, NULL);
      tcc_artifact_free(&art);
      protobuf_c_message_free_unpacked(&req->base, NULL);
    }
    unsetenv("TCC_NO_CUDNN");
    seen = 1;
  }
  ck_assert_msg(seen, "no conv_backward.json among the example graphs");
}
END_TEST

/* tcc_compiler_ops(CUDA) lists the matmul family (cuBLAS steps). */
START_TEST(cuda_ops_list_matmul) {
  size_t n = tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CUDA, NULL, 0);
  tcc_op_info *ops = calloc(n, sizeof *ops);
  tcc_compiler_ops(TCC__V1__DEVICE_TYPE__CUDA, ops, n);
  int found = 0;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ops[i].target, "aten.mm.default") || !strcmp(ops[i].target, "aten.bmm.default") ||
        !strcmp(ops[i].target, "aten.addmm.default") || !strcmp(ops[i].target, "aten.linear.default") ||
        !strcmp(ops[i].target, "aten.matmul.default"))
      found++;
  ck_assert_int_eq(found, 5);
  free(ops);
}
END_TEST

int main(void) {
  tt_need_nvrtc();
  cuobjdump = tt_cuobjdump();
  if (!cuobjdump) printf("no cuobjdump (TCC_CUOBJDUMP): cubins checked by their ELF symbols only\n");
  objdumps = 40;
  if (!(tmpdir = tt_tmpdir("cudagen"))) return 1;
  Suite *s = suite_create("cuda codegen");
  TCase *tc = tcase_create("graphs");   /* CK_RUN_CASE=graphs: the quick part (valgrind) */
  tcase_set_timeout(tc, 1200);
  tcase_add_test(tc, keys_differ_by_arch);
  tcase_add_test(tc, example_graphs);
  tcase_add_test(tc, softmax_is_one_kernel);
  tcase_add_test(tc, sibling_reductions_fold_in_one_loop);
  tcase_add_test(tc, cuda_ops_list_matmul);
  suite_add_tcase(s, tc);
  tc = tcase_create("ops");
  tcase_set_timeout(tc, 1200);
  tcase_add_test(tc, matmul_family);
  tcase_add_test(tc, tf32_follows_the_target);
  tcase_add_test(tc, convolutions_are_cudnn_steps);
  tcase_add_test(tc, autocast_batch_norm_saves_float32_statistics);
  tcase_add_test(tc, split_reduction);
  tcase_add_test(tc, reductions_over_a_dim);
  tcase_add_test(tc, layer_norm_and_dim_reductions);
  tcase_add_test(tc, views_cat_and_indexing);
  tcase_add_test(tc, every_op);
  suite_add_tcase(s, tc);
  int rc = tt_run_suite(s, 0);
  tt_remove_tree(tmpdir);
  free(tmpdir);
  return rc;
}
