/* gpu.c — a real CUDA device for the GPU tests (see tcctest.h). */
#include <stdio.h>
#include <stdlib.h>

#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tcctest.h"

void tt_need_gpu(char arch[16], char *name, size_t name_cap) {
  tcc_error err = {0};
  if (tcc_rt_cuda_available(&err)) tt_skip("no CUDA device (%s)", err.msg);
  tt_need_nvrtc();
  if (tcc_rt_cuda_device_arch(0, arch, name, name ? name_cap : 0, &err)) {
    fprintf(stderr, "device 0's arch: %s\n", err.msg);
    exit(EXIT_FAILURE);
  }
  if (tcc_nvrtc_check_arch(arch, &err)) tt_skip("NVRTC cannot build for this device (%s)", err.msg);
}
