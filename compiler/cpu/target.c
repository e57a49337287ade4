/*
 * target.c — tcc_target_cpu (target.h): C built by the system compiler
 * into a .so (tcc_entry, or tcc_entry2 for dynamic shapes), and the
 * autotuning candidates the schedule understands (tcc_kernel_config's
 * parallel, threads, chunk, unroll, blas_threads, vec, order).
 */
#include "cpu_schedule.h"

#include <string.h>

static int cpu_candidates(tcc_kernel_config *out) {
  static const tcc_kernel_config cpu[] = {
    {0, 0, 0, 0, 0},  /* default */
    {1, 0, 0, 0, 0},  /* parallel */
    {-1, 0, 0, 0, 1}, /* serial */
    {1, 0, 0, 4, 0},  /* parallel + unroll 4 */
    {-1, 0, 0, 4, 1}, /* serial + unroll 4 */
    {1, 0, 8, 0, 0},  /* parallel, static chunks of 8 */
    {0, 0, 0, 0, 0, 4},   /* default, vector width 4 */
    {1, 0, 0, 0, 0, 16},  /* parallel, vector width 16 */
    {0, 0, 0, 0, 0, 0, 1},  /* loops ordered by the first load (reads contiguous) */
  };
  memcpy(out, cpu, sizeof cpu);
  return (int)(sizeof cpu / sizeof cpu[0]);
}

const tcc_target tcc_target_cpu = {
  .name = "cpu",
  .label = "CPU",
  .device = TCC__V1__DEVICE_TYPE__CPU,
  .artifact = TCC__V1__ARTIFACT_KIND__SHARED_OBJECT,
  .dynamic_shapes = 1,
  .bench_hooks = tcc_cpu_emit_bench_hooks,
  .identity = NULL,            /* the C compiler is in the daemon's identity already */
  .schedule = tcc_cpu_schedule_pass,
  .check = tcc_cpu_schedule_check,
  .dump = tcc_cpu_schedule_dump,
  .emit = tcc_cpu_emit,
  .build = tcc_cpu_build,
  .manifest = NULL,            /* ABI 1's generic manifest: entry tcc_entry */
  .candidates = cpu_candidates,
};
