/*
 * bench_cuda.c — tccd's CUDA kernels timed on a GPU (scripts/gpu-check
 * runs it; scripts/bench_cuda.py adds the PyTorch eager and
 * torch.compile columns). Each case is built by tcc_compile for the
 * device's arch (no daemon), loaded with the runtime's Driver API loader
 * and launched on fresh random inputs; the figure is the median over 5
 * rounds of the mean time of a batch of launches (cuCtxSynchronize
 * around each batch, batch sized to ~50 ms). Achieved bandwidth = bytes
 * of every input and output / time, against the device-to-device copy
 * bandwidth measured here (cuMemcpyDtoD of 256 MiB: 2 x bytes / time).
 *
 *   bench-cuda [--quick] [--cases a,b] > cuda-bench.json
 *
 * Prints one JSON document: {"device", "arch", "copy_gbs", "cases":
 * [{"name", "kind", "tccd_ms", "bytes", "gbs", "pct_of_copy", "steps",
 * "compile_ms"}]}. Exits 77 ("SKIP: ...") without a CUDA device or NVRTC
 * (tt_need_gpu of tests/support).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler.h"
#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tcctest.h"

static char arch[16];
static int quick;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what, const tcc_error *e) {
  fprintf(stderr, "bench-cuda: %s: %s\n", what, e->msg);
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Times one request; prints its JSON object. */
static void run_case(reqb *b, const char *name, const char *kind, double copy_gbs, int *first) {
  Tcc__V1__CompileRequest *req = reqb_req(b);
  tt_request_to_cuda(req, reqb_str(b, arch));
  tcc_error err = {0};
  tcc_prepared *p;
  if (tcc_prepare(req, "bench-cuda", &p, &err)) die(name, &err);
  tcc_artifact a;
  if (tcc_compile(p, NULL, &a, &err)) die(name, &err);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, a.manifest_len, a.manifest);
  void **din = calloc(m->n_inputs + 1, sizeof *din), **dout = calloc(m->n_outputs + 1, sizeof *dout), *dws = NULL;
  size_t bytes = 0;
  unsigned seed = 12345;
  for (size_t i = 0; i < m->n_inputs; i++) {
    size_t n = tt_meta_bytes(m->inputs[i]);
    bytes += n;
    unsigned char *h = malloc(n);
    for (size_t j = 0; j < n; j++) h[j] = (unsigned char)(rand_r(&seed) & 0x3f);   /* small finite values */
    if (tcc_rt_cuda_malloc(0, n, &din[i], &err) || tcc_rt_cuda_memcpy_htod(0, din[i], h, n, &err)) die(name, &err);
    free(h);
  }
  for (size_t o = 0; o < m->n_outputs; o++) {
    size_t n = tt_meta_bytes(m->outputs[o]);
    bytes += n;
    if (tcc_rt_cuda_malloc(0, n, &dout[o], &err)) die(name, &err);
  }
  if (m->workspace_bytes && tcc_rt_cuda_malloc(0, (size_t)m->workspace_bytes, &dws, &err)) die(name, &err);
  tcc_rt_cuda_kernel *k;
  if (tcc_rt_cuda_kernel_load_manifest(a.data, a.size, NULL, m, NULL, &k, &err)) die(name, &err);
  void *stream;
  if (tcc_rt_cuda_stream_create(0, &stream, &err)) die(name, &err);
  /* warm up, size the batch */
  double t0 = now_ms();
  int iters = 0;
  do {
    if (tcc_rt_cuda_kernel_launch(k, stream, (const void *const *)din, dout, dws, &err)) die(name, &err);
    iters++;
    if (tcc_rt_cuda_synchronize(0, stream, &err)) die(name, &err);
  } while (now_ms() - t0 < 20 && iters < 1000);
  double one = (now_ms() - t0) / iters;
  int batch = (int)(50.0 / (one > 1e-3 ? one : 1e-3));
  if (batch < 3) batch = 3;
  if (batch > 5000) batch = 5000;
  if (quick) batch = batch / 10 + 1;
  double rounds[5];
  for (int r = 0; r < 5; r++) {
    double s = now_ms();
    for (int i = 0; i < batch; i++)
      if (tcc_rt_cuda_kernel_launch(k, stream, (const void *const *)din, dout, dws, &err)) die(name, &err);
    if (tcc_rt_cuda_synchronize(0, stream, &err)) die(name, &err);
    rounds[r] = (now_ms() - s) / batch;
  }
  qsort(rounds, 5, sizeof rounds[0], cmp_double);
  double ms = rounds[2], gbs = (double)bytes / (ms * 1e-3) / 1e9;
  printf("%s\n    {\"name\": \"%s\", \"kind\": \"%s\", \"tccd_ms\": %.6f, \"bytes\": %zu, \"gbs\": %.2f, "
         "\"pct_of_copy\": %.1f, \"steps\": %zu, \"compile_ms\": %.1f}",
         *first ? "" : ",", name, kind, ms, bytes, gbs, copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0, m->n_kernels,
         a.compile_ms);
  *first = 0;
  fflush(stdout);
  tcc_rt_cuda_kernel_unload(k);
  tcc_rt_cuda_stream_destroy(0, stream, &err);
  for (size_t i = 0; i < m->n_inputs; i++) tcc_rt_cuda_free(0, din[i], &err);
  for (size_t o = 0; o < m->n_outputs; o++) tcc_rt_cuda_free(0, dout[o], &err);
  if (dws) tcc_rt_cuda_free(0, dws, &err);
  free(din);
  free(dout);
  tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&a);
  tcc_prepared_free(p);
}

static double copy_bandwidth(void) {
  size_t n = (size_t)256 << 20;
  void *a, *b;
  tcc_error err = {0};
  if (tcc_rt_cuda_malloc(0, n, &a, &err) || tcc_rt_cuda_malloc(0, n, &b, &err)) die("copy", &err);
  double best = 1e30;
  for (int r = 0; r < 6; r++) {
    double s = now_ms();
    if (tcc_rt_cuda_memcpy_dtod(0, b, a, n, &err) || tcc_rt_cuda_synchronize(0, NULL, &err)) die("copy", &err);
    double t = now_ms() - s;
    if (r && t < best) best = t;
  }
  tcc_rt_cuda_free(0, a, &err);
  tcc_rt_cuda_free(0, b, &err);
  return 2.0 * (double)n / (best * 1e-3) / 1e9;
}

static int wanted(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; (p = strstr(p, name)); p += n)
    if ((p == list || p[-1] == ',') && (p[n] == ',' || !p[n])) return 1;
  return 0;
}

int main(int argc, char **argv) {
  const char *cases = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = argv[++i];
    else {
      fprintf(stderr, "usage: bench-cuda [--quick] [--cases a,b]\n");
      return 2;
    }
  }
  char devname[256] = "";
  tt_need_gpu(arch, devname, sizeof devname);
  double copy_gbs = copy_bandwidth();
  printf("{\"device\": \"%s\", \"arch\": \"%s\", \"copy_gbs\": %.1f, \"cases\": [", devname, arch, copy_gbs);
  int first = 1;
  const Tcc__V1__DType F = TCC__V1__DTYPE__FLOAT32, H = TCC__V1__DTYPE__FLOAT16;
  int64_t R = quick ? 1024 : 4096, C = quick ? 1024 : 4096;
  const struct {
    const char *name;
    Tcc__V1__DType dt;
  } add_relu[] = {{"add_relu", F}, {"add_relu_f16", H}};   /* relu(x + y): 3 x 64 MiB in float32 */
  for (int i = 0; i < 2; i++) {
    if (!wanted(cases, add_relu[i].name)) continue;
    reqb *b = reqb_new("");
    reqb_value(b, "x", add_relu[i].dt, 2, (int64_t[]){R, C}, NULL, 0);
    reqb_value(b, "y", add_relu[i].dt, 2, (int64_t[]){R, C}, NULL, 0);
    reqb_value(b, "s", add_relu[i].dt, 2, (int64_t[]){R, C}, NULL, 0);
    reqb_value(b, "o", add_relu[i].dt, 2, (int64_t[]){R, C}, NULL, 0);
    reqb_input(b, "x");
    reqb_input(b, "y");
    reqb_binary(b, "aten.add.Tensor", "x", "y", "s");
    reqb_unary(b, "aten.relu.default", "s", "o");
    reqb_output(b, "o");
    run_case(b, add_relu[i].name, "pointwise", copy_gbs, &first);
    reqb_free(b);
  }
  if (wanted(cases, "sin_cos")) {   /* sin(x) + cos(y), y broadcast over rows */
    reqb *b = reqb_sin_cos_rows(R, C);
    run_case(b, "sin_cos", "pointwise", copy_gbs, &first);
    reqb_free(b);
  }
  static const char *const red[][2] = {{"softmax", "aten._softmax.default"}, {"log_softmax", "aten._log_softmax.default"}};
  for (int r = 0; r < 2; r++) {
    if (!wanted(cases, red[r][0])) continue;
    reqb *b = reqb_softmax(red[r][1], F, 2 * R, 1024);
    run_case(b, red[r][0], "reduction", copy_gbs, &first);
    reqb_free(b);
  }
  if (wanted(cases, "layer_norm")) {
    reqb *b = reqb_layer_norm(F, 2 * R, 1024, 1);
    run_case(b, "layer_norm", "reduction", copy_gbs, &first);
    reqb_free(b);
  }
  if (wanted(cases, "sum_rows")) {
    reqb *b = reqb_sum_rows(R, C);
    run_case(b, "sum_rows", "reduction", copy_gbs, &first);
    reqb_free(b);
  }
  if (wanted(cases, "sum_all")) {   /* 2^24 values into one: the split reduction */
    reqb *b = reqb_sum_all(quick ? INT64_C(1) << 20 : INT64_C(1) << 24);
    run_case(b, "sum_all", "split-reduction", copy_gbs, &first);
    reqb_free(b);
  }
  if (wanted(cases, "gelu_mlp")) {   /* gelu(x @ w.T + b): cuBLAS + the fused epilogue */
    reqb *b = reqb_linear_gelu(2, (int64_t[]){512, 768}, 3072);
    run_case(b, "gelu_mlp", "matmul", copy_gbs, &first);
    reqb_free(b);
  }
  printf("\n]}\n");
  return 0;
}
