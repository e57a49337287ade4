/*
 * build.c — the CUDA target's build and manifest: the scheduled
 * program's CUDA C through NVRTC (tcc_nvrtc.h, dlopen'ed: no GPU needed) into
 * a cubin and its PTX for exactly the target's arch, each __global__
 * checked to lower to its plain name; and the manifest's launch plan (one
 * KernelInfo per step of p->sched.cuda, in launch order: grid, block,
 * shared memory, or the GemmStep of a cuBLAS call; the PTX).
 */
#include "cuda_schedule.h"
#include "tcc_nvrtc.h"

#include <stdlib.h>
#include <string.h>

int tcc_cuda_build(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
                   tcc_built *out, tcc_error *err) {
  (void)len;
  memset(out, 0, sizeof *out);
  const char *arch = p->graph->target.cuda_arch;
  if (!arch || !arch[0]) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "target: no CUDA arch");
  const tcc_cuda_schedule *sch = p->sched.cuda;
  const char **names = calloc((size_t)sch->n_global + 1, sizeof *names);
  if (!names) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int i = 0, j = 0; i < sch->n; i++)
    if (!tcc_cuda_step_is_library(&sch->steps[i])) names[j++] = sch->steps[i].name;
  tcc_nvrtc_result r;
  memset(&r, 0, sizeof r);
  tcc_nvrtc_options no = {.timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 120000};
  int rc = tcc_nvrtc_build_ex(src, arch, names, &no, &r, err);
  if (!rc) {
    for (int j = 0; j < sch->n_global && !rc; j++)
      if (strcmp(r.lowered_names[j], names[j]))
        rc = tcc_error_set(err, TCC_E_INTERNAL, "nvrtc: kernel %s lowered to '%.64s'", names[j], r.lowered_names[j]);
    if (!rc) {
      out->data = r.cubin;
      out->size = r.cubin_size;
      r.cubin = NULL;
      out->ptx = r.ptx;
      out->ptx_len = r.ptx_size;
      r.ptx = NULL;
    }
  }
  tcc_nvrtc_result_free(&r);
  free(names);
  return rc;
}

/* ---------------------------------------------------------- manifest */

static Tcc__V1__BufferRef *manifest_ref(tcc_arena *A, const tcc_cuda_ref *r) {
  Tcc__V1__BufferRef *m = tcc_arena_alloc(A, sizeof *m);
  if (!m) return NULL;
  tcc__v1__buffer_ref__init(m);
  switch (r->base) {
  case TCC_CUDA_INPUT: m->base_case = TCC__V1__BUFFER_REF__BASE_INPUT, m->input = (uint32_t)r->index; break;
  case TCC_CUDA_OUTPUT: m->base_case = TCC__V1__BUFFER_REF__BASE_OUTPUT, m->output = (uint32_t)r->index; break;
  case TCC_CUDA_WORKSPACE: m->base_case = TCC__V1__BUFFER_REF__BASE_WORKSPACE, m->workspace = 1; break;
  case TCC_CUDA_CONSTANT:
    m->base_case = TCC__V1__BUFFER_REF__BASE_CONSTANT;
    if (!(m->constant = tcc_arena_printf(A, "b%d_data", r->index))) return NULL;
    break;
  }
  m->offset_bytes = r->offset_bytes;
  return m;
}

/* A convolution step as a tcc.v1.ConvStep (operands by role). */
static Tcc__V1__ConvStep *manifest_conv(tcc_arena *A, const tcc_cuda_conv *C) {
  Tcc__V1__ConvStep *cs = tcc_arena_alloc(A, sizeof *cs);
  int S = (int)C->prm[TCC_CONV_S];
  int64_t *v = tcc_arena_array(A, 6 * (size_t)S, sizeof *v);
  if (!cs || !v) return NULL;
  tcc__v1__conv_step__init(cs);
  cs->n = C->prm[TCC_CONV_N];
  cs->in_channels = C->prm[TCC_CONV_CIN];
  cs->out_channels = C->prm[TCC_CONV_COUT];
  cs->groups = C->prm[TCC_CONV_G];
  int64_t **lists[6] = {&cs->input_size, &cs->kernel_size, &cs->output_size, &cs->stride, &cs->padding, &cs->dilation};
  size_t *counts[6] = {&cs->n_input_size, &cs->n_kernel_size, &cs->n_output_size, &cs->n_stride, &cs->n_padding,
                       &cs->n_dilation};
  const int first[6] = {TCC_CONV_IN, TCC_CONV_K, TCC_CONV_O, TCC_CONV_STRIDE, TCC_CONV_PAD, TCC_CONV_DIL};
  for (int l = 0; l < 6; l++) {
    *lists[l] = v + l * S;
    *counts[l] = (size_t)S;
    for (int d = 0; d < S; d++) (*lists[l])[d] = C->prm[first[l] + d];
  }
  cs->dtype = (Tcc__V1__DType)C->dtype;
  cs->tf32 = C->tf32;
  /* the EXTERN's (a, b, result) by kind: forward (x, w, y), backward
   * data (dy, w, dx), backward filter (x, dy, dw) */
  Tcc__V1__BufferRef **roles[3];
  switch (C->kind) {
  case TCC_EXT_CONV_FWD:
    cs->kind = TCC__V1__CONV_STEP__KIND__FORWARD;
    roles[0] = &cs->x, roles[1] = &cs->w, roles[2] = &cs->y;
    break;
  case TCC_EXT_CONV_BWD_DATA:
    cs->kind = TCC__V1__CONV_STEP__KIND__BACKWARD_DATA;
    roles[0] = &cs->y, roles[1] = &cs->w, roles[2] = &cs->dx;
    break;
  default:
    cs->kind = TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER;
    roles[0] = &cs->x, roles[1] = &cs->y, roles[2] = &cs->dw;
    break;
  }
  if (!(*roles[0] = manifest_ref(A, &C->a)) || !(*roles[1] = manifest_ref(A, &C->b)) ||
      !(*roles[2] = manifest_ref(A, &C->c)))
    return NULL;
  return cs;
}

int tcc_cuda_manifest(const tcc_program *p, const tcc_built *built, tcc_arena *A, Tcc__V1__Manifest *m,
                      tcc_error *err) {
  const tcc_cuda_schedule *sch = p->sched.cuda;
  m->entry = "";
  m->workspace_bytes = sch->workspace_bytes;
  m->n_kernels = (size_t)sch->n;
  m->kernels = tcc_arena_array(A, (size_t)sch->n + 1, sizeof *m->kernels);
  if (!m->kernels) goto oom;
  for (int i = 0; i < sch->n; i++) {
    const tcc_cuda_step *st = &sch->steps[i];
    Tcc__V1__KernelInfo *ki = tcc_arena_alloc(A, sizeof *ki);
    if (!ki) goto oom;
    tcc__v1__kernel_info__init(ki);
    ki->name = tcc_arena_strdup(A, st->name);
    ki->kind = (char *)st->kind;
    ki->numel = st->numel;
    ki->n_nodes = (size_t)p->kernels[st->kernel].nnodes;   /* provenance (tcctl show --dot) */
    ki->nodes = p->kernels[st->kernel].nodes;
    if (!ki->name) goto oom;
    if (st->is_gemm) {
      const tcc_cuda_gemm *G = &st->gemm;
      Tcc__V1__GemmStep *gs = tcc_arena_alloc(A, sizeof *gs);
      if (!gs) goto oom;
      tcc__v1__gemm_step__init(gs);
      gs->trans_a = G->trans_a, gs->trans_b = G->trans_b;
      gs->m = G->m, gs->n = G->n, gs->k = G->k;
      gs->lda = G->lda, gs->ldb = G->ldb, gs->ldc = G->ldc;
      gs->stride_a = G->stride_a, gs->stride_b = G->stride_b, gs->stride_c = G->stride_c;
      gs->batch_count = G->batch;
      gs->a_dtype = gs->b_dtype = (Tcc__V1__DType)G->ab_dtype;
      gs->c_dtype = (Tcc__V1__DType)G->c_dtype;
      gs->compute_type = (char *)G->compute;
      gs->alpha = 1.0;
      gs->beta = 0.0;
      if (!(gs->a = manifest_ref(A, &G->a)) || !(gs->b = manifest_ref(A, &G->b)) || !(gs->c = manifest_ref(A, &G->c)))
        goto oom;
      ki->gemm = gs;
    } else if (st->is_conv) {
      if (!(ki->conv = manifest_conv(A, &st->conv))) goto oom;
    } else {
      int two = st->split_stage || st->grid[1] > 1;
      int64_t *grid = tcc_arena_array(A, 2, sizeof *grid);
      int64_t *block = tcc_arena_array(A, 1, sizeof *block);
      if (!grid || !block) goto oom;
      grid[0] = st->grid[0];
      grid[1] = st->grid[1];
      block[0] = st->block;
      ki->grid = grid;
      ki->n_grid = two ? 2 : 1;
      ki->block = block;
      ki->n_block = 1;
      ki->shared_bytes = st->shared_bytes;
    }
    m->kernels[i] = ki;
  }
  if (built && built->ptx && built->ptx_len) {
    m->ptx.data = (uint8_t *)built->ptx;
    m->ptx.len = built->ptx_len;
  }
  return 0;
oom:
  return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory encoding the manifest");
}
