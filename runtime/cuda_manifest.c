/*
 * cuda_manifest.c — a tcc.v1.Manifest as a CUDA launch plan (the only
 * part of the CUDA loader that knows protobuf; cuda.c stays free of it).
 *
 * Manifest (today's fields)          launch plan
 *   target "cuda:sm_90a"        ->  plan.arch "sm_90a"
 *   kernels[i].name             ->  launches[i].name (the lowered symbol)
 *   kernels[i].grid  (1-3 dims) ->  launches[i].grid, missing dims = 1
 *   kernels[i].block (1-3 dims) ->  launches[i].block
 *   kernels[i].shared_bytes     ->  launches[i].shared_bytes
 *   n_inputs, n_outputs         ->  the ABI's pointer counts
 *   workspace_bytes             ->  plan.workspace_bytes
 *   kernels[i] kind "extern"    ->  launches[i].gemm: a cuBLAS call
 *     + gemm (GemmStep)             (sizes, leading dims, strides,
 *                                    dtypes, compute type, buffers)
 *   kernels[i] kind "extern"    ->  launches[i].conv: a cuDNN call
 *     + conv (ConvStep)             (kind, geometry, dtype, TF32, buffers)
 *   ptx                         ->  opts.ptx (JIT fallback) unless the
 *                                   caller gave one
 * Every value is range-checked here (grid/block entries 1..2^31-1 and
 * block <= 1024 threads, shared 0..2^31-1; GEMM sizes 0..2^31-1, leading
 * dims >= the rows they hold, known dtypes and compute types) so a bad
 * manifest is an INVALID_ARGUMENT naming kernel and field, never a
 * driver or cuBLAS error.
 */
#include <stdlib.h>
#include <string.h>

#include "tcc_runtime.h"
#include "tcc/v1/tcc.pb-c.h"

/* Copies one repeated dim field into out[3]. Returns 0 or an error. */
static int dims(const int64_t *v, size_t n, const char *field, size_t i, const char *name, uint32_t out[3],
                tcc_error *err) {
  if (n < 1 || n > 3)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): %s has %zu entries (1 to 3)", i,
                         name, field, n);
  for (size_t d = 0; d < 3; d++) {
    int64_t x = d < n ? v[d] : 1;
    if (x < 1 || x > INT32_MAX)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): %s[%zu] = %lld out of range",
                           i, name, field, d, (long long)x);
    out[d] = (uint32_t)x;
  }
  return 0;
}

/* One BufferRef (the step's field, "gemm.a") -> tcc_rt_cuda_buffer. */
static int buffer_ref(const Tcc__V1__BufferRef *r, const char *field, size_t i, const char *name,
                      tcc_rt_cuda_buffer *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  if (!r) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): %s missing", i, name,
                               field);
  switch (r->base_case) {
  case TCC__V1__BUFFER_REF__BASE_INPUT: out->base = TCC_RT_CUDA_BUF_INPUT, out->index = r->input; break;
  case TCC__V1__BUFFER_REF__BASE_OUTPUT: out->base = TCC_RT_CUDA_BUF_OUTPUT, out->index = r->output; break;
  case TCC__V1__BUFFER_REF__BASE_WORKSPACE: out->base = TCC_RT_CUDA_BUF_WORKSPACE; break;
  case TCC__V1__BUFFER_REF__BASE_CONSTANT: out->base = TCC_RT_CUDA_BUF_CONSTANT, out->constant = r->constant; break;
  default:
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): %s names no buffer", i,
                         name, field);
  }
  if (r->offset_bytes < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): %s offset %lld", i, name,
                         field, (long long)r->offset_bytes);
  out->offset_bytes = (uint64_t)r->offset_bytes;
  return 0;
}

/* A GemmStep -> tcc_rt_cuda_gemm_step, checked. */
static int gemm_step(const Tcc__V1__GemmStep *g, size_t i, const char *name, tcc_rt_cuda_gemm_step *out,
                     tcc_error *err) {
  memset(out, 0, sizeof *out);
  if (!g) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): extern step without a "
                               "gemm (this client runs only cuBLAS GEMM steps)", i, name);
  const int64_t v[] = {g->m, g->n, g->k, g->lda, g->ldb, g->ldc, g->batch_count};
  static const char *const f[] = {"m", "n", "k", "lda", "ldb", "ldc", "batch_count"};
  for (size_t j = 0; j < 7; j++)
    if (v[j] < 0 || v[j] > INT32_MAX)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): gemm.%s = %lld out of range",
                           i, name, f[j], (long long)v[j]);
  int64_t ra = g->trans_a ? g->k : g->m, rb = g->trans_b ? g->n : g->k;
  if (g->lda < (ra > 1 ? ra : 1) || g->ldb < (rb > 1 ? rb : 1) || g->ldc < (g->m > 1 ? g->m : 1))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): gemm leading dimensions "
                         "%lld/%lld/%lld are below the rows they hold", i, name, (long long)g->lda, (long long)g->ldb,
                         (long long)g->ldc);
  if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): negative gemm stride", i, name);
  int ok_ab = g->a_dtype == g->b_dtype &&
              (g->a_dtype == TCC__V1__DTYPE__FLOAT32 || g->a_dtype == TCC__V1__DTYPE__FLOAT64 ||
               g->a_dtype == TCC__V1__DTYPE__FLOAT16 || g->a_dtype == TCC__V1__DTYPE__BFLOAT16);
  int ok_c = g->c_dtype == TCC__V1__DTYPE__FLOAT32 || g->c_dtype == TCC__V1__DTYPE__FLOAT64 ||
             g->c_dtype == g->a_dtype;
  const char *ct = g->compute_type ? g->compute_type : "";
  if (!strcmp(ct, "32F")) out->compute = TCC_RT_CUDA_COMPUTE_32F;
  else if (!strcmp(ct, "32F_FAST_TF32")) out->compute = TCC_RT_CUDA_COMPUTE_32F_FAST_TF32;
  else if (!strcmp(ct, "64F")) out->compute = TCC_RT_CUDA_COMPUTE_64F;
  else
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): unknown gemm compute type "
                         "'%.32s'", i, name, ct);
  if (!ok_ab || !ok_c || (out->compute == TCC_RT_CUDA_COMPUTE_64F) != (g->c_dtype == TCC__V1__DTYPE__FLOAT64))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): gemm dtypes %d/%d/%d with "
                         "compute %s are not supported", i, name, g->a_dtype, g->b_dtype, g->c_dtype, ct);
  out->trans_a = g->trans_a, out->trans_b = g->trans_b;
  out->m = g->m, out->n = g->n, out->k = g->k;
  out->lda = g->lda, out->ldb = g->ldb, out->ldc = g->ldc;
  out->stride_a = g->stride_a, out->stride_b = g->stride_b, out->stride_c = g->stride_c;
  out->batch_count = g->batch_count;
  out->a_dtype = g->a_dtype, out->b_dtype = g->b_dtype, out->c_dtype = g->c_dtype;
  out->alpha = g->alpha, out->beta = g->beta;
  int rc = buffer_ref(g->a, "gemm.a", i, name, &out->a, err);
  if (!rc) rc = buffer_ref(g->b, "gemm.b", i, name, &out->b, err);
  if (!rc) rc = buffer_ref(g->c, "gemm.c", i, name, &out->c, err);
  return rc;
}

/* A ConvStep -> tcc_rt_cuda_conv_step, checked: a known kind and dtype,
 * 1 to 3 spatial dims with every list that long, sizes in range (cuDNN's
 * own checks come at load), the buffers its kind reads and writes. */
static int conv_step(const Tcc__V1__ConvStep *c, size_t i, const char *name, tcc_rt_cuda_conv_step *out,
                     tcc_error *err) {
  memset(out, 0, sizeof *out);
  if (c->kind < TCC__V1__CONV_STEP__KIND__FORWARD || c->kind > TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): unknown conv kind %d", i, name,
                         (int)c->kind);
  size_t S = c->n_input_size;
  if (S < 1 || S > 3 || c->n_kernel_size != S || c->n_output_size != S || c->n_stride != S || c->n_padding != S ||
      c->n_dilation != S)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): conv sizes, strides, padding "
                         "and dilation must each list the same 1 to 3 spatial dims", i, name);
  if (c->dtype < 1 || c->dtype > 4 || (c->tf32 && c->dtype != 1))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): conv dtype %d%s is not "
                         "supported", i, name, (int)c->dtype, c->tf32 ? " with TF32" : "");
  const int64_t lim = INT32_MAX;
  int bad = c->n < 1 || c->n > lim || c->in_channels < 1 || c->in_channels > lim || c->out_channels < 1 ||
            c->out_channels > lim || c->groups < 1 || c->groups > lim;
  for (size_t d = 0; d < S && !bad; d++)
    bad = c->input_size[d] < 1 || c->input_size[d] > lim || c->kernel_size[d] < 1 || c->kernel_size[d] > lim ||
          c->output_size[d] < 1 || c->output_size[d] > lim || c->stride[d] < 1 || c->stride[d] > lim ||
          c->padding[d] < 0 || c->padding[d] > lim || c->dilation[d] < 1 || c->dilation[d] > lim;
  if (bad) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): conv size out of range",
                                i, name);
  out->kind = (tcc_rt_cuda_conv_kind)c->kind;
  out->s = (int)S;
  out->n = c->n, out->c_in = c->in_channels, out->c_out = c->out_channels, out->groups = c->groups;
  for (size_t d = 0; d < S; d++) {
    out->in[d] = c->input_size[d], out->k[d] = c->kernel_size[d], out->out[d] = c->output_size[d];
    out->stride[d] = c->stride[d], out->pad[d] = c->padding[d], out->dil[d] = c->dilation[d];
  }
  out->dtype = c->dtype;
  out->tf32 = c->tf32;
  /* the roles: dy is y, dx is x, dw is w */
  const Tcc__V1__BufferRef *x = c->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_DATA ? c->dx : c->x;
  const Tcc__V1__BufferRef *w = c->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER ? c->dw : c->w;
  const char *xn = c->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_DATA ? "conv.dx" : "conv.x";
  const char *wn = c->kind == TCC__V1__CONV_STEP__KIND__BACKWARD_FILTER ? "conv.dw" : "conv.w";
  int rc = buffer_ref(x, xn, i, name, &out->x, err);
  if (!rc) rc = buffer_ref(w, wn, i, name, &out->w, err);
  if (!rc) rc = buffer_ref(c->y, c->kind == TCC__V1__CONV_STEP__KIND__FORWARD ? "conv.y" : "conv.dy", i, name,
                           &out->y, err);
  return rc;
}

int tcc_rt_cuda_kernel_load_manifest(const uint8_t *cubin, size_t len, const char *digest_hex,
                                     const struct Tcc__V1__Manifest *m, const tcc_rt_cuda_options *opts,
                                     tcc_rt_cuda_kernel **out, tcc_error *err) {
  *out = NULL;
  if (!m) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no manifest");
  const char *target = m->target ? m->target : "";
  if (strncmp(target, "cuda:", 5) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest target '%.64s' is not cuda:ARCH", target);
  if (m->n_kernels == 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the manifest lists no kernels");
  if (m->workspace_bytes < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest workspace_bytes %lld is negative",
                         (long long)m->workspace_bytes);
  tcc_rt_cuda_launch *launches = calloc(m->n_kernels, sizeof *launches);
  tcc_rt_cuda_gemm_step *gemms = calloc(m->n_kernels, sizeof *gemms);
  tcc_rt_cuda_conv_step *convs = calloc(m->n_kernels, sizeof *convs);
  char *ptx = NULL;
  if (!launches || !gemms || !convs) {
    free(launches), free(gemms), free(convs);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  int rc = 0;
  for (size_t i = 0; i < m->n_kernels && !rc; i++) {
    const Tcc__V1__KernelInfo *ki = m->kernels[i];
    const char *name = ki && ki->name ? ki->name : "";
    if (!*name) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu has no name", i);
      break;
    }
    launches[i].name = name;
    if (ki->conv) {   /* a cuDNN step */
      if ((rc = conv_step(ki->conv, i, name, &convs[i], err))) break;
      launches[i].conv = &convs[i];
      continue;
    }
    if (ki->gemm || (ki->kind && !strcmp(ki->kind, "extern"))) {   /* a cuBLAS step */
      if ((rc = gemm_step(ki->gemm, i, name, &gemms[i], err))) break;
      launches[i].gemm = &gemms[i];
      continue;
    }
    if ((rc = dims(ki->grid, ki->n_grid, "grid", i, name, launches[i].grid, err))) break;
    if ((rc = dims(ki->block, ki->n_block, "block", i, name, launches[i].block, err))) break;
    uint64_t threads = (uint64_t)launches[i].block[0] * launches[i].block[1] * launches[i].block[2];
    if (threads > 1024) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): block of %llu threads (at most 1024)",
                         i, name, (unsigned long long)threads);
      break;
    }
    if (ki->shared_bytes < 0 || ki->shared_bytes > INT32_MAX) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu ('%.100s'): shared_bytes %lld out of range", i,
                         name, (long long)ki->shared_bytes);
      break;
    }
    launches[i].shared_bytes = (uint32_t)ki->shared_bytes;
  }
  tcc_rt_cuda_options o = opts ? *opts : (tcc_rt_cuda_options){0};
  if (!rc && !o.ptx && m->ptx.len) {   /* the manifest's PTX, as text */
    if (memchr(m->ptx.data, 0, m->ptx.len))
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the manifest's PTX holds a NUL byte");
    else if (!(ptx = malloc(m->ptx.len + 1)))
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    else {
      memcpy(ptx, m->ptx.data, m->ptx.len);
      ptx[m->ptx.len] = '\0';
      o.ptx = ptx;
    }
  }
  if (!rc) {
    tcc_rt_cuda_plan plan = {
        .arch = target + 5,
        .launches = launches,
        .n_launches = m->n_kernels,
        .n_inputs = m->n_inputs,
        .n_outputs = m->n_outputs,
        .workspace_bytes = (uint64_t)m->workspace_bytes,
    };
    rc = tcc_rt_cuda_kernel_load(cubin, len, digest_hex, &plan, &o, out, err);
  }
  free(ptx);
  free(gemms);
  free(convs);
  free(launches);
  return rc;
}
