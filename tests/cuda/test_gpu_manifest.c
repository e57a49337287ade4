/*
 * test_gpu_manifest.c — a CUDA artifact the way a client gets it from
 * tccd: cubin bytes + their SHA-256 + a tcc.v1.Manifest (target
 * "cuda:ARCH", kernels with grid/block/shared_bytes), loaded with the
 * generic tcc_module_load and run with tcc_module_run (default stream)
 * and through tcc_module_cuda (a stream, graphs), against float64 CPU
 * references on fresh random inputs.
 * Skips (exit 77) with no CUDA device or no NVRTC.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tccclient.h"
#include "tcctest.h"

static char dev_arch[16];

START_TEST(generic_load_and_run_of_a_reduction_artifact) {
  int rows = 4 + (int)(tt_rand() % 50), cols = 64 + (int)(tt_rand() % 3000);
  char src[4096];
  snprintf(src, sizeof src, "#define R %d\n#define C %d\n%s", rows, cols, TT_CUDA_REDUCE_SRC);
  const char *names[] = {TT_CUDA_REDUCE_NAMES, NULL};
  tcc_nvrtc_result b;
  TT_OK(tcc_nvrtc_build(src, dev_arch, names, &b, &e_));

  /* The manifest tccd would send. */
  char target[32];
  snprintf(target, sizeof target, "cuda:%s", dev_arch);
  int64_t grid0[1] = {rows}, block0[1] = {256}, grid1[2] = {(rows + 127) / 128, 1}, block1[3] = {128, 1, 1};
  Tcc__V1__KernelInfo k0 = TCC__V1__KERNEL_INFO__INIT, k1 = TCC__V1__KERNEL_INFO__INIT;
  k0.name = b.lowered_names[0], k0.kind = (char *)"reduction";
  k0.n_grid = 1, k0.grid = grid0, k0.n_block = 1, k0.block = block0, k0.shared_bytes = 32;
  k1.name = b.lowered_names[1], k1.kind = (char *)"pointwise";
  k1.n_grid = 2, k1.grid = grid1, k1.n_block = 3, k1.block = block1;
  Tcc__V1__KernelInfo *kis[2] = {&k0, &k1};
  Tcc__V1__TensorMeta in_meta = TCC__V1__TENSOR_META__INIT, out_meta = TCC__V1__TENSOR_META__INIT;
  Tcc__V1__TensorMeta *ins[1] = {&in_meta}, *outs[1] = {&out_meta};
  Tcc__V1__Manifest m = TCC__V1__MANIFEST__INIT;
  m.abi_version = 1;
  m.target = target;
  m.n_kernels = 2, m.kernels = kis;
  m.n_inputs = 1, m.inputs = ins;
  m.n_outputs = 1, m.outputs = outs;
  m.workspace_bytes = rows * (int64_t)sizeof(float);

  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(b.cubin, b.cubin_size, hex);
  tcc_module *k = NULL;
  TT_OK(tcc_module_load(b.cubin, b.cubin_size, hex, &m, &k, &e_));
  ck_assert_ptr_nonnull(tcc_module_cuda(k));
  ck_assert_str_eq(tcc_module_manifest(k)->target, target);

  size_t nx = (size_t)rows * cols;
  float *x = malloc(nx * sizeof *x), *out = malloc(rows * sizeof *out);
  ck_assert(x && out);
  void *dx, *dout, *ws, *stream;
  TT_OK(tcc_rt_cuda_malloc(0, nx * sizeof *x, &dx, &e_));
  TT_OK(tcc_rt_cuda_malloc(0, rows * sizeof *out, &dout, &e_));
  TT_OK(tcc_rt_cuda_malloc(0, (size_t)m.workspace_bytes, &ws, &e_));
  TT_OK(tcc_rt_cuda_stream_create(0, &stream, &e_));
  tcc_rt_cuda_kernel_set_graphs(tcc_module_cuda(k), 1);
  for (int round = 0; round < 3; round++) {
    tt_fill_float(x, nx, -2.0f, 2.0f);
    TT_OK(tcc_rt_cuda_memcpy_htod(0, dx, x, nx * sizeof *x, &e_));
    const void *in[1] = {dx};
    void *o[1] = {dout};
    if (round == 0) {
      TT_OK(tcc_module_run(k, in, o, ws, &e_)); /* the generic call: default stream */
      TT_OK(tcc_rt_cuda_synchronize(0, NULL, &e_));
    } else {
      TT_OK(tcc_rt_cuda_kernel_launch(tcc_module_cuda(k), stream, in, o, ws, &e_));
      TT_OK(tcc_rt_cuda_synchronize(0, stream, &e_));
    }
    TT_OK(tcc_rt_cuda_memcpy_dtoh(0, out, dout, rows * sizeof *out, &e_));
    for (int r = 0; r < rows; r++) {
      double s = 0;
      for (int j = 0; j < cols; j++) s += (double)x[(size_t)r * cols + j] * x[(size_t)r * cols + j];
      ck_assert_msg(fabs(out[r] - sqrt(s)) <= 1e-5 * sqrt(s) + 1e-6, "round %d row %d: %.9g vs %.9g", round, r,
                    out[r], sqrt(s));
    }
  }
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(tcc_module_cuda(k), &st);
  ck_assert_uint_eq(st.direct_launches, 1);
  ck_assert_uint_eq(st.graph_captures, 1);
  ck_assert_uint_eq(st.graph_replays, 2);

  /* A manifest that lies about the arch is refused before the driver. */
  tcc_module *k2 = NULL;
  tcc_error err = {0};
  m.target = (char *)(dev_arch[3] == '8' ? "cuda:sm_90" : "cuda:sm_80");
  ck_assert_int_eq(tcc_module_load(b.cubin, b.cubin_size, hex, &m, &k2, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "but the cubin is for"), "%s", err.msg);

  tcc_module_unload(k);
  TT_OK(tcc_rt_cuda_stream_destroy(0, stream, &e_));
  TT_OK(tcc_rt_cuda_free(0, dx, &e_));
  TT_OK(tcc_rt_cuda_free(0, dout, &e_));
  TT_OK(tcc_rt_cuda_free(0, ws, &e_));
  free(x), free(out);
  tcc_nvrtc_result_free(&b);
}
END_TEST

int main(void) {
  tt_need_gpu(dev_arch, NULL, 0);
  tt_seed("test_gpu_manifest");
  return tt_run_tests("cuda-gpu-manifest", 300, 1, (const TTest *[]){
      generic_load_and_run_of_a_reduction_artifact,
      NULL});
}
