/*
 * cutest.h — what the CUDA tests share: skipping (exit 77, which meson
 * counts as skipped, after one "SKIP: ..." line), the random seed (from
 * the clock, printed; TCC_TEST_SEED replays one), and the hand-written
 * CUDA C kernels that follow tccd's kernel ABI (every __global__ takes
 * inputs..., outputs..., workspace as pointers; extern "C" names), and
 * reading the example graphs (the .json files of tests/graphs).
 */
#ifndef TCC_CUTEST_H
#define TCC_CUTEST_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CUTEST_SKIP 77

/* Prints "SKIP: <why>" and exits 77. */
static inline void cutest_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void cutest_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("SKIP: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  exit(CUTEST_SKIP);
}

/* The run's seed, chosen and printed once. */
static inline unsigned cutest_seed(const char *test) {
  static unsigned seed;
  if (!seed) {
    const char *env = getenv("TCC_TEST_SEED");
    seed = env && *env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
    if (!seed) seed = 1;
    printf("%s: seed %u (TCC_TEST_SEED=%u replays it)\n", test, seed, seed);
    fflush(stdout);
  }
  return seed;
}

/* n uniform floats in [lo, hi). */
static inline void cutest_fill(float *v, size_t n, unsigned *state, float lo, float hi) {
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * ((float)rand_r(state) / ((float)RAND_MAX + 1.0f));
}

/* ------------------------------------------------------------------ kernels
 * Pointwise, n elements (N), one thread each:
 *   z = x * y + sin(x)          inputs (x, y), output (z), no workspace */
#define CUTEST_POINTWISE_NAME "k0_pointwise"
#define CUTEST_POINTWISE_SRC                                                     \
  "extern \"C\" __global__ void k0_pointwise(const float *x, const float *y,\n" \
  "                                          float *z, char *ws) {\n"           \
  "  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;\n"                   \
  "  if (i < N) z[i] = x[i] * y[i] + sinf(x[i]);\n"                             \
  "}\n"

/* Block reduction, rows R x columns C: out[r] = sqrt(sum_j x[r][j]^2), in
 * two kernels that meet in the workspace (R floats):
 *   k0_row_sumsq  one block per row; strided loads, warp shuffles, one
 *                 partial per warp in dynamic shared memory, warp 0 sums
 *   k1_sqrt       one thread per row */
#define CUTEST_REDUCE_NAMES "k0_row_sumsq", "k1_sqrt"
#define CUTEST_REDUCE_SRC                                                        \
  "extern \"C\" __global__ void k0_row_sumsq(const float *x, float *out, char *ws) {\n" \
  "  extern __shared__ float partial[];\n"                                      \
  "  float *acc = (float *)ws;\n"                                               \
  "  int r = blockIdx.x;\n"                                                     \
  "  float s = 0.f;\n"                                                          \
  "  for (int j = threadIdx.x; j < C; j += blockDim.x) {\n"                     \
  "    float v = x[(long)r * C + j];\n"                                         \
  "    s += v * v;\n"                                                           \
  "  }\n"                                                                       \
  "  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);\n" \
  "  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;\n"                   \
  "  if (lane == 0) partial[warp] = s;\n"                                       \
  "  __syncthreads();\n"                                                        \
  "  if (warp == 0) {\n"                                                        \
  "    s = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.f;\n"              \
  "    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);\n" \
  "    if (lane == 0) acc[r] = s;\n"                                            \
  "  }\n"                                                                       \
  "}\n"                                                                         \
  "extern \"C\" __global__ void k1_sqrt(const float *x, float *out, char *ws) {\n" \
  "  const float *acc = (const float *)ws;\n"                                   \
  "  int r = blockIdx.x * blockDim.x + threadIdx.x;\n"                          \
  "  if (r < R) out[r] = sqrtf(acc[r]);\n"                                      \
  "}\n"

/* A C++ template kernel (for lowered names) and a __device__ variable
 * (a name that is not a kernel). */
#define CUTEST_TEMPLATE_SRC                                                      \
  "template <int B> __global__ void scale(const float *x, float *y, char *ws) {\n" \
  "  int i = blockIdx.x * B + threadIdx.x;\n"                                   \
  "  y[i] = 2.f * x[i];\n"                                                      \
  "}\n"                                                                         \
  "__device__ float not_a_kernel;\n"


/* The next example graph (a *.json file) in directory `dir` open as d:
 * its file name in *name (valid until the next call) and its text,
 * NUL-terminated, malloc'd (the caller frees it), length in *len. NULL
 * when there are no more; exits (a failed test) when a file cannot be
 * read. */
static inline char *cutest_next_graph(DIR *d, const char *dir, const char **name, size_t *len) {
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l < 6 || strcmp(de->d_name + l - 5, ".json")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    FILE *f = fopen(path, "rb");
    char *json = malloc(1 << 22);
    if (!f || !json) {
      fprintf(stderr, "cannot read %s\n", path);
      exit(1);
    }
    *len = fread(json, 1, (1 << 22) - 1, f);
    json[*len] = '\0';
    fclose(f);
    *name = de->d_name;
    return json;
  }
  return NULL;
}

#endif
