/*
 * test_gpu.c — NVRTC-built kernels run through the CUDA loader on a real
 * device, against float64 CPU references on fresh random inputs:
 * pointwise, a two-kernel block reduction with a workspace, CUDA graph
 * capture + replay (and its cache), PTX JIT for another arch, the arch
 * mismatch error, launch failures naming the kernel, ABI checks, the
 * module cache, dynamic shared memory over 48 KiB, concurrent launches.
 *
 * Skips (exit 77, "SKIP: no CUDA device (reason)") where there is no
 * driver or device, and when NVRTC is not available. Needs no protobuf:
 * scripts/gpu-check builds it with cc alone on a GPU machine that lacks
 * the project's other dependencies.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc_nvrtc.h"
#include "tcc_runtime.h"
#include "tcctest.h"

static char dev_arch[16];      /* "sm_90" */
static int dev_major, dev_minor;

static void build(const char *src, const char *arch, const char *const *names, tcc_nvrtc_result *r) {
  tcc_error err = {0};
  ck_assert_msg(tcc_nvrtc_build(src, arch, names, r, &err) == 0, "%s: %s", arch, err.msg);
}

static void *dalloc(size_t bytes) {
  void *p = NULL;
  TT_OK(tcc_rt_cuda_malloc(0, bytes, &p, &e_));
  return p;
}
static void dfree(void *p) { TT_OK(tcc_rt_cuda_free(0, p, &e_)); }
static void htod(void *d, const void *h, size_t n) { TT_OK(tcc_rt_cuda_memcpy_htod(0, d, h, n, &e_)); }
static void dtoh(void *h, const void *d, size_t n) { TT_OK(tcc_rt_cuda_memcpy_dtoh(0, h, d, n, &e_)); }
static void sync_stream(void *s) { TT_OK(tcc_rt_cuda_synchronize(0, s, &e_)); }

/* ------------------------------------------------------------------ pointwise */

typedef struct pointwise {
  int n;
  tcc_nvrtc_result built;
  tcc_rt_cuda_launch launch;
  tcc_rt_cuda_plan plan;
  float *x, *y, *z;            /* host */
  void *dx, *dy, *dz;          /* device */
} pointwise;

static void pointwise_init(pointwise *p, const char *arch, int n) {
  memset(p, 0, sizeof *p);
  p->n = n;
  char src[2048];
  snprintf(src, sizeof src, "#define N %d\n%s", n, TT_CUDA_POINTWISE_SRC);
  const char *names[] = {TT_CUDA_POINTWISE_NAME, NULL};
  build(src, arch, names, &p->built);
  p->launch = (tcc_rt_cuda_launch){.name = p->built.lowered_names[0], .grid = {(uint32_t)(n + 255) / 256, 1, 1},
                                .block = {256, 1, 1}};
  p->plan = (tcc_rt_cuda_plan){.arch = arch, .launches = &p->launch, .n_launches = 1, .n_inputs = 2, .n_outputs = 1};
  p->x = malloc(n * sizeof(float));
  p->y = malloc(n * sizeof(float));
  p->z = malloc(n * sizeof(float));
  ck_assert(p->x && p->y && p->z);
  p->dx = dalloc(n * sizeof(float));
  p->dy = dalloc(n * sizeof(float));
  p->dz = dalloc(n * sizeof(float));
}

/* New random inputs, copied to the device. */
static void pointwise_fill(pointwise *p) {
  tt_fill_float(p->x, p->n, -3.0f, 3.0f);
  tt_fill_float(p->y, p->n, -2.0f, 2.0f);
  htod(p->dx, p->x, p->n * sizeof(float));
  htod(p->dy, p->y, p->n * sizeof(float));
}

/* Copies dz back and compares with x*y + sin(x) in float64:
 * |z - ref| <= 1e-5 + 1e-5 |ref|. */
static void pointwise_check(pointwise *p, void *dz) {
  dtoh(p->z, dz, p->n * sizeof(float));
  for (int i = 0; i < p->n; i++) {
    double ref = (double)p->x[i] * p->y[i] + sin((double)p->x[i]);
    ck_assert_msg(fabs(p->z[i] - ref) <= 1e-5 + 1e-5 * fabs(ref), "z[%d] = %.9g, expected %.9g (x %g, y %g)", i,
                  p->z[i], ref, p->x[i], p->y[i]);
  }
}

static void pointwise_free(pointwise *p) {
  dfree(p->dx), dfree(p->dy), dfree(p->dz);
  free(p->x), free(p->y), free(p->z);
  tcc_nvrtc_result_free(&p->built);
}

static int launch(tcc_rt_cuda_kernel *k, void *stream, pointwise *p, void *dz, tcc_error *err) {
  const void *in[2] = {p->dx, p->dy};
  void *out[1] = {dz};
  return tcc_rt_cuda_kernel_launch(k, stream, in, out, NULL, err);
}

START_TEST(pointwise_matches_cpu) {
  int n = 1000 + (int)(tt_rand() % 200000); /* rarely a multiple of the block */
  pointwise p;
  pointwise_init(&p, dev_arch, n);
  tcc_rt_cuda_kernel *k = NULL;
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, NULL, &k, &e_));
  for (int round = 0; round < 2; round++) {
    pointwise_fill(&p);
    TT_OK(launch(k, NULL, &p, p.dz, &e_));
    sync_stream(NULL);
    pointwise_check(&p, p.dz);
  }
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.direct_launches, 2);
  ck_assert_uint_eq(st.graph_captures, 0);
  ck_assert_int_eq(st.from_ptx, 0);
  ck_assert_str_eq(st.device_arch, dev_arch);
  printf("  pointwise: n = %d on %s\n", n, dev_arch);
  tcc_rt_cuda_kernel_unload(k);
  pointwise_free(&p);
}
END_TEST

/* ------------------------------------------------------------------ reduction */

/* Row L2 norms of an R x C matrix with the two-kernel plan; dynamic
 * shared bytes `shared` for the first kernel (>= 8 warps * 4). */
static void run_reduction(int rows, int cols, uint32_t shared) {
  char src[4096];
  snprintf(src, sizeof src, "#define R %d\n#define C %d\n%s", rows, cols, TT_CUDA_REDUCE_SRC);
  const char *names[] = {TT_CUDA_REDUCE_NAMES, NULL};
  tcc_nvrtc_result b;
  build(src, dev_arch, names, &b);
  tcc_rt_cuda_launch launches[2] = {
      {.name = b.lowered_names[0], .grid = {(uint32_t)rows}, .block = {256}, .shared_bytes = shared},
      {.name = b.lowered_names[1], .grid = {(uint32_t)(rows + 127) / 128}, .block = {128}},
  };
  tcc_rt_cuda_plan plan = {.arch = dev_arch, .launches = launches, .n_launches = 2, .n_inputs = 1, .n_outputs = 1,
                        .workspace_bytes = (uint64_t)rows * sizeof(float)};
  tcc_rt_cuda_kernel *k = NULL;
  TT_OK(tcc_rt_cuda_kernel_load(b.cubin, b.cubin_size, NULL, &plan, NULL, &k, &e_));

  size_t nx = (size_t)rows * cols;
  float *x = malloc(nx * sizeof *x), *out = malloc(rows * sizeof *out);
  ck_assert(x && out);
  tt_fill_float(x, nx, -1.0f, 1.0f);
  void *dx = dalloc(nx * sizeof *x), *dout = dalloc(rows * sizeof *out), *ws = dalloc(plan.workspace_bytes);
  htod(dx, x, nx * sizeof *x);
  tcc_error err = {0};
  const void *in[1] = {dx};
  void *outs[1] = {dout};
  /* The workspace is required. */
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, outs, NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "workspace"), "%s", err.msg);
  TT_OK(tcc_rt_cuda_kernel_launch(k, NULL, in, outs, ws, &e_));
  sync_stream(NULL);
  dtoh(out, dout, rows * sizeof *out);
  for (int r = 0; r < rows; r++) {
    double s = 0;
    for (int j = 0; j < cols; j++) s += (double)x[(size_t)r * cols + j] * x[(size_t)r * cols + j];
    double ref = sqrt(s);
    ck_assert_msg(fabs(out[r] - ref) <= 1e-5 * ref + 1e-6, "row %d: %.9g, expected %.9g", r, out[r], ref);
  }
  printf("  reduction: %d x %d, %u shared bytes\n", rows, cols, shared);
  dfree(dx), dfree(dout), dfree(ws);
  free(x), free(out);
  tcc_rt_cuda_kernel_unload(k);
  tcc_nvrtc_result_free(&b);
}

START_TEST(reduction_matches_cpu) {
  run_reduction(5 + (int)(tt_rand() % 60), 100 + (int)(tt_rand() % 5000), 8 * sizeof(float));
}
END_TEST

START_TEST(dynamic_shared_memory_over_48k) {
  run_reduction(3 + (int)(tt_rand() % 20), 1000 + (int)(tt_rand() % 3000), 64 * 1024);
}
END_TEST

/* ------------------------------------------------------------------ graphs */

START_TEST(graphs_capture_once_and_replay) {
  pointwise p;
  pointwise_init(&p, dev_arch, 5000 + (int)(tt_rand() % 50000));
  tcc_rt_cuda_options o = {.graphs = 1, .graph_cache_max = 2};
  tcc_rt_cuda_kernel *k = NULL;
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &o, &k, &e_));
  void *stream = NULL;
  TT_OK(tcc_rt_cuda_stream_create(0, &stream, &e_));
  void *dz2 = dalloc(p.n * sizeof(float)), *dz3 = dalloc(p.n * sizeof(float));
  tcc_rt_cuda_stats st;

  /* Same pointers three times, new input values each time: one capture,
   * three replays, and every replay reads the current inputs. */
  for (int round = 0; round < 3; round++) {
    pointwise_fill(&p);
    TT_OK(launch(k, stream, &p, p.dz, &e_));
    sync_stream(stream);
    pointwise_check(&p, p.dz);
  }
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.graph_captures, 1);
  ck_assert_uint_eq(st.graph_replays, 3);
  ck_assert_uint_eq(st.direct_launches, 0);

  /* Other pointer sets capture again; the cache holds two. */
  TT_OK(launch(k, stream, &p, dz2, &e_));
  sync_stream(stream);
  pointwise_check(&p, dz2);
  TT_OK(launch(k, stream, &p, dz3, &e_)); /* evicts the first set */
  sync_stream(stream);
  pointwise_check(&p, dz3);
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.graph_captures, 3);
  pointwise_fill(&p);
  TT_OK(launch(k, stream, &p, dz3, &e_)); /* still cached */
  TT_OK(launch(k, stream, &p, p.dz, &e_)); /* was evicted: captured anew */
  sync_stream(stream);
  pointwise_check(&p, p.dz);
  pointwise_check(&p, dz3);
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.graph_captures, 4);
  ck_assert_uint_eq(st.graph_replays, 7);

  /* The legacy default stream cannot be captured: direct launches. */
  pointwise_fill(&p);
  TT_OK(launch(k, NULL, &p, p.dz, &e_));
  sync_stream(NULL);
  pointwise_check(&p, p.dz);
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.direct_launches, 1);

  /* Graphs off: direct on the stream too. */
  tcc_rt_cuda_kernel_set_graphs(k, 0);
  TT_OK(launch(k, stream, &p, dz2, &e_));
  sync_stream(stream);
  pointwise_check(&p, dz2);
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.direct_launches, 2);
  ck_assert_uint_eq(st.graph_captures, 4);
  printf("  graphs: %llu captures, %llu replays, %llu direct\n", (unsigned long long)st.graph_captures,
         (unsigned long long)st.graph_replays, (unsigned long long)st.direct_launches);

  TT_OK(tcc_rt_cuda_stream_destroy(0, stream, &e_));
  dfree(dz2), dfree(dz3);
  tcc_rt_cuda_kernel_unload(k);
  pointwise_free(&p);
}
END_TEST

/* ------------------------------------------------------------------ archs */

START_TEST(ptx_is_jit_compiled_for_another_major_arch) {
  const char *lower = dev_major >= 9 ? "sm_80" : dev_major == 8 ? "sm_75" : NULL;
  if (!lower) {
    printf("  no lower arch than %s that NVRTC builds: nothing to test\n", dev_arch);
    return;
  }
  pointwise p;
  pointwise_init(&p, lower, 4096 + (int)(tt_rand() % 4096));
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, NULL, &k, &err),
                   TCC_E_FAILED_PRECONDITION);
  char want[96];
  snprintf(want, sizeof want, "arch mismatch: artifact %s, device %s", lower, dev_arch);
  ck_assert_msg(strstr(err.msg, want), "expected '%s' in: %s", want, err.msg);
  ck_assert_ptr_null(k);

  tcc_rt_cuda_options o = {.ptx = p.built.ptx};
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &o, &k, &e_));
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_int_eq(st.from_ptx, 1);
  pointwise_fill(&p);
  TT_OK(launch(k, NULL, &p, p.dz, &e_));
  sync_stream(NULL);
  pointwise_check(&p, p.dz);
  printf("  %s artifact on %s: PTX JIT, results match\n", lower, dev_arch);
  tcc_rt_cuda_kernel_unload(k);
  pointwise_free(&p);
}
END_TEST

START_TEST(newer_arch_is_a_clear_mismatch) {
  const char *higher = dev_major < 12 ? "sm_120" : NULL;
  tcc_error err = {0};
  if (!higher || tcc_nvrtc_check_arch(higher, &err) != 0) return;
  pointwise p;
  pointwise_init(&p, higher, 1024);
  tcc_rt_cuda_options o = {.ptx = p.built.ptx}; /* compute_120 PTX cannot run on an older device either */
  tcc_rt_cuda_kernel *k = NULL;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &o, &k, &err),
                   TCC_E_FAILED_PRECONDITION);
  char want[96];
  snprintf(want, sizeof want, "arch mismatch: artifact sm_120, device %s", dev_arch);
  ck_assert_msg(strstr(err.msg, want), "expected '%s' in: %s", want, err.msg);
  pointwise_free(&p);

  /* The arch-specific cubin of the device's own arch runs natively. */
  char a_arch[20];
  snprintf(a_arch, sizeof a_arch, "%sa", dev_arch);
  if (dev_major >= 9 && tcc_nvrtc_check_arch(a_arch, &err) == 0) {
    pointwise_init(&p, a_arch, 2048);
    TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, NULL, &k, &e_));
    tcc_rt_cuda_stats st;
    tcc_rt_cuda_kernel_stats(k, &st);
    ck_assert_int_eq(st.from_ptx, 0);
    pointwise_fill(&p);
    TT_OK(launch(k, NULL, &p, p.dz, &e_));
    sync_stream(NULL);
    pointwise_check(&p, p.dz);
    tcc_rt_cuda_kernel_unload(k);
    pointwise_free(&p);
  }
}
END_TEST

/* ------------------------------------------------------------------ errors */

START_TEST(bad_plans_and_launches_name_the_kernel) {
  pointwise p;
  pointwise_init(&p, dev_arch, 2048);
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};

  tcc_rt_cuda_launch l = p.launch;
  tcc_rt_cuda_plan plan = p.plan;
  plan.launches = &l;
  l.name = "k9_nope";
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &plan, NULL, &k, &err),
                   TCC_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "kernel 'k9_nope' (launch 1 of 1) is not in the module"), "%s", err.msg);

  l = p.launch;
  l.block[0] = 2048;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &plan, NULL, &k, &err),
                   TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "2048 threads"), "%s", err.msg);

  int version = 0;
  TT_OK(tcc_rt_cuda_driver_version(&version, &e_));
  l = p.launch;
  plan.n_inputs = 3; /* the kernel takes 2 inputs */
  int rc = tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &plan, NULL, &k, &err);
  if (version >= 12040) {
    ck_assert_int_eq(rc, TCC_E_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, "takes 4 parameters; the tccd ABI passes 5"), "%s", err.msg);
  } else if (rc == 0) {
    tcc_rt_cuda_kernel_unload(k);
  }
  plan.n_inputs = 2;

  /* A grid the device refuses: the launch fails, naming the kernel. */
  l.grid[1] = 70000;
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &plan, NULL, &k, &e_));
  pointwise_fill(&p);
  ck_assert_int_eq(launch(k, NULL, &p, p.dz, &err), TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "kernel 'k0_pointwise' (launch 1 of 1): cuLaunchKernel: CUDA_ERROR_"), "%s",
                err.msg);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, NULL, NULL, NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "takes 2 inputs and 1 outputs"), "%s", err.msg);
  tcc_rt_cuda_kernel_unload(k);

  /* The caller's current context: there is none on this thread. */
  tcc_rt_cuda_options cur = {.context = TCC_RT_CUDA_CURRENT};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &cur, &k, &err),
                   TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "no current CUDA context"), "%s", err.msg);
  tcc_rt_cuda_options bad_dev = {.device = 1000};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &bad_dev, &k, &err),
                   TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "no CUDA device 1000"), "%s", err.msg);
  sync_stream(NULL); /* the failed launch left no sticky error */
  pointwise_free(&p);
}
END_TEST

START_TEST(modules_are_shared_by_digest) {
  pointwise p;
  pointwise_init(&p, dev_arch, 3000);
  const char *digest = "5f1d0000000000000000000000000000000000000000000000000000000000aa";
  tcc_rt_cuda_kernel *a = NULL, *b = NULL, *c = NULL;
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, digest, &p.plan, NULL, &a, &e_));
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, digest, &p.plan, NULL, &b, &e_));
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, NULL, &c, &e_));
  tcc_rt_cuda_kernel_unload(a); /* b keeps the shared module loaded */
  pointwise_fill(&p);
  TT_OK(launch(b, NULL, &p, p.dz, &e_));
  sync_stream(NULL);
  pointwise_check(&p, p.dz);
  tcc_rt_cuda_kernel_unload(b);
  pointwise_fill(&p);
  TT_OK(launch(c, NULL, &p, p.dz, &e_));
  sync_stream(NULL);
  pointwise_check(&p, p.dz);
  tcc_rt_cuda_kernel_unload(c);
  pointwise_free(&p);
}
END_TEST

/* ------------------------------------------------------------------ threads */

typedef struct worker {
  tcc_rt_cuda_kernel *k;
  pointwise *p;
  void *dz;
  float *z;
  int rc;
  char msg[256];
} worker;

static void *work(void *arg) {
  worker *w = arg;
  void *stream = NULL;
  tcc_error err = {0};
  w->rc = tcc_rt_cuda_stream_create(0, &stream, &err);
  for (int i = 0; i < 20 && !w->rc; i++) w->rc = launch(w->k, stream, w->p, w->dz, &err);
  if (!w->rc) w->rc = tcc_rt_cuda_synchronize(0, stream, &err);
  if (!w->rc) w->rc = tcc_rt_cuda_memcpy_dtoh(0, w->z, w->dz, w->p->n * sizeof(float), &err);
  tcc_rt_cuda_stream_destroy(0, stream, NULL);
  snprintf(w->msg, sizeof w->msg, "%.200s", err.msg);
  return NULL;
}

START_TEST(concurrent_launches_from_threads) {
  pointwise p;
  pointwise_init(&p, dev_arch, 10000 + (int)(tt_rand() % 10000));
  tcc_rt_cuda_options o = {.graphs = 1};
  tcc_rt_cuda_kernel *k = NULL;
  TT_OK(tcc_rt_cuda_kernel_load(p.built.cubin, p.built.cubin_size, NULL, &p.plan, &o, &k, &e_));
  pointwise_fill(&p);
  worker w[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){.k = k, .p = &p, .dz = dalloc(p.n * sizeof(float)), .z = malloc(p.n * sizeof(float))};
    ck_assert_int_eq(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(w[i].rc == 0, "thread %d: %s", i, w[i].msg);
    TT_OK(tcc_rt_cuda_memcpy_htod(0, p.dz, w[i].z, p.n * sizeof(float), &e_));
    pointwise_check(&p, p.dz);
    dfree(w[i].dz);
    free(w[i].z);
  }
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.graph_captures, 4);
  ck_assert_uint_eq(st.graph_replays, 80);
  tcc_rt_cuda_kernel_unload(k);
  pointwise_free(&p);
}
END_TEST

int main(void) {
  tcc_error err = {0};
  char name[128] = "";
  tt_need_gpu(dev_arch, name, sizeof name);
  dev_major = atoi(dev_arch + 3) / 10; /* "sm_86" -> 8.6, "sm_120" -> 12.0 */
  dev_minor = atoi(dev_arch + 3) % 10;
  int version = 0;
  tcc_rt_cuda_driver_version(&version, &err);
  printf("test_gpu: device 0 = %s (%s), driver %d\n", name, dev_arch, version);
  tt_seed("test_gpu");

  return tt_run_tests("cuda-gpu", 300, 1, (const TTest *[]){
      pointwise_matches_cpu,
      reduction_matches_cpu,
      dynamic_shared_memory_over_48k,
      graphs_capture_once_and_replay,
      ptx_is_jit_compiled_for_another_major_arch,
      newer_arch_is_a_clear_mismatch,
      bad_plans_and_launches_name_the_kernel,
      modules_are_shared_by_digest,
      concurrent_launches_from_threads,
      NULL}); /* CUDA does not survive fork() */
}
