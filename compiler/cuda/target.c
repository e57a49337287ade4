/*
 * target.c — tcc_target_cuda (target.h): CUDA C built by NVRTC into a
 * cubin for the requested arch, and the autotuning candidates the
 * schedule understands (tcc_kernel_config's block, ipt, wrow, split,
 * persist; the rest stays 0).
 */
#include "cuda_schedule.h"
#include "tcc_nvrtc.h"

#include <stdio.h>
#include <string.h>

/* CUDA entries are built by NVRTC: its version (and the archs it knows)
 * is part of who compiles, hence of the key. */
static void cuda_identity(char *out, size_t cap) {
  tcc_error err = {0};
  if (tcc_nvrtc_identity(out, cap, &err)) snprintf(out, cap, "nvrtc unavailable");
}

static int cuda_candidates(tcc_kernel_config *out) {
  static const tcc_kernel_config cuda[] = {
    {.block = 0},                 /* default: the schedule's heuristic */
    {.block = 128},
    {.block = 512},
    {.block = 1024},
    {.ipt = 4},                   /* 256 threads, 4 elements each */
    {.block = 512, .ipt = 8},
    {.wrow = 1},                  /* reductions: a warp per row */
    {.wrow = -1},                 /* reductions: a block per row, short rows too */
    {.split = 1},                 /* split reductions: not split */
    {.split = 128},
    {.split = 1024},
    {.persist = 1},               /* reductions: the row in shared memory */
  };
  memcpy(out, cuda, sizeof cuda);
  return (int)(sizeof cuda / sizeof cuda[0]);
}

const tcc_target tcc_target_cuda = {
  .name = "cuda",
  .label = "CUDA",
  .device = TCC__V1__DEVICE_TYPE__CUDA,
  .artifact = TCC__V1__ARTIFACT_KIND__CUBIN,
  .dynamic_shapes = 0,
  .bench_hooks = NULL,         /* the benchmark child launches each kernel's steps alone */
  .identity = cuda_identity,
  .schedule = tcc_cuda_schedule_pass,
  .check = tcc_cuda_schedule_check,
  .dump = tcc_cuda_schedule_dump,
  .emit = tcc_cuda_emit,
  .build = tcc_cuda_build,
  .manifest = tcc_cuda_manifest,
  .candidates = cuda_candidates,
};
