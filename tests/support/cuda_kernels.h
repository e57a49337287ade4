/*
 * cuda_kernels.h — hand-written CUDA C kernels for the CUDA tests
 * (tcctest.h includes it): each follows tccd's kernel ABI (every
 * __global__ takes inputs..., outputs..., workspace as pointers;
 * extern "C" names). The sizes are macros the test defines in front of
 * the source ("#define N 1000\n" TT_CUDA_POINTWISE_SRC).
 */
#ifndef TCC_TEST_CUDA_KERNELS_H
#define TCC_TEST_CUDA_KERNELS_H

/* Pointwise, n elements (N), one thread each:
 *   z = x * y + sin(x)          inputs (x, y), output (z), no workspace */
#define TT_CUDA_POINTWISE_NAME "k0_pointwise"
#define TT_CUDA_POINTWISE_SRC                                                     \
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
#define TT_CUDA_REDUCE_NAMES "k0_row_sumsq", "k1_sqrt"
#define TT_CUDA_REDUCE_SRC                                                        \
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
#define TT_CUDA_TEMPLATE_SRC                                                      \
  "template <int B> __global__ void scale(const float *x, float *y, char *ws) {\n" \
  "  int i = blockIdx.x * B + threadIdx.x;\n"                                   \
  "  y[i] = 2.f * x[i];\n"                                                      \
  "}\n"                                                                         \
  "__device__ float not_a_kernel;\n"

#endif
