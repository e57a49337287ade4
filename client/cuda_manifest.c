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
 * Every value is range-checked here (grid/block entries 1..2^31-1 and
 * block <= 1024 threads, shared 0..2^31-1) so a bad manifest is an
 * INVALID_ARGUMENT naming kernel and field, never a driver error.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
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

int tcc_cuda_kernel_load_manifest(const uint8_t *cubin, size_t len, const char *digest_hex,
                                  const struct Tcc__V1__Manifest *m, const tcc_cuda_options *opts,
                                  tcc_cuda_kernel **out, tcc_error *err) {
  *out = NULL;
  if (!m) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no manifest");
  const char *target = m->target ? m->target : "";
  if (strncmp(target, "cuda:", 5) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest target '%.64s' is not cuda:ARCH", target);
  if (m->n_kernels == 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the manifest lists no kernels");
  if (m->workspace_bytes < 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest workspace_bytes %lld is negative",
                         (long long)m->workspace_bytes);
  tcc_cuda_launch *launches = calloc(m->n_kernels, sizeof *launches);
  if (!launches) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  int rc = 0;
  for (size_t i = 0; i < m->n_kernels && !rc; i++) {
    const Tcc__V1__KernelInfo *ki = m->kernels[i];
    const char *name = ki && ki->name ? ki->name : "";
    if (!*name) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "manifest kernel %zu has no name", i);
      break;
    }
    launches[i].name = name;
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
  if (!rc) {
    tcc_cuda_plan plan = {
        .arch = target + 5,
        .launches = launches,
        .n_launches = m->n_kernels,
        .n_inputs = m->n_inputs,
        .n_outputs = m->n_outputs,
        .workspace_bytes = (uint64_t)m->workspace_bytes,
    };
    rc = tcc_cuda_kernel_load(cubin, len, digest_hex, &plan, opts, out, err);
  }
  free(launches);
  return rc;
}
