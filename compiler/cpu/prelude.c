/*
 * prelude.c — the text every CPU translation unit starts with (emit.c):
 * headers, the SIMD clones of libm's functions, and the integer and
 * floating-point helpers whose semantics match PyTorch's (floor division,
 * remainders with the divisor's sign, division by zero flagged).
 */
#include "cpu_schedule.h"

/* The glibc vector math library (libmvec, linked through libm.so's
 * AS_NEEDED) has SIMD variants of these; declaring the simd clones lets
 * gcc vectorize loops that call them (as glibc's own headers do under
 * -ffast-math). Its results are within 4 ulp. */
const char tcc_cpu_prelude[] =
  "#include <math.h>\n#include <stdint.h>\n"
  "#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)\n"
  "#define TCC_SIMD __attribute__((__simd__(\"notinbranch\")))\n"
  "extern float expf(float) TCC_SIMD; extern float exp2f(float) TCC_SIMD;\n"
  "extern float expm1f(float) TCC_SIMD; extern float logf(float) TCC_SIMD;\n"
  "extern float log1pf(float) TCC_SIMD; extern float log2f(float) TCC_SIMD;\n"
  "extern float sinf(float) TCC_SIMD; extern float cosf(float) TCC_SIMD;\n"
  "extern float tanf(float) TCC_SIMD; extern float tanhf(float) TCC_SIMD;\n"
  "extern float erff(float) TCC_SIMD;\n"
  "extern double exp(double) TCC_SIMD; extern double exp2(double) TCC_SIMD;\n"
  "extern double expm1(double) TCC_SIMD; extern double log(double) TCC_SIMD;\n"
  "extern double log1p(double) TCC_SIMD; extern double log2(double) TCC_SIMD;\n"
  "extern double sin(double) TCC_SIMD; extern double cos(double) TCC_SIMD;\n"
  "extern double tan(double) TCC_SIMD; extern double tanh(double) TCC_SIMD;\n"
  "extern double erf(double) TCC_SIMD;\n"
  "#endif\n"
  "static inline int64_t tcc_min64(int64_t a, int64_t b) { return a < b ? a : b; }\n"
  "static inline int64_t tcc_max64(int64_t a, int64_t b) { return a > b ? a : b; }\n"
  "static inline float tcc_bf16_to_f32(uint16_t x) {\n"
  "  uint32_t u = (uint32_t)x << 16; float f; __builtin_memcpy(&f, &u, 4); return f;\n}\n"
  "static inline uint16_t tcc_f32_to_bf16(float f) {\n"
  "  uint32_t u; __builtin_memcpy(&u, &f, 4);\n"
  "  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);\n"
  "  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);\n}\n"
  "static inline int64_t tcc_truncdiv_i64(int64_t a, int64_t b, int *bad) {\n"
  "  if (b == 0) { *bad = 1; return 0; }\n"
  "  if (b == -1) return (int64_t)(0 - (uint64_t)a);\n  return a / b;\n}\n"
  "static inline int64_t tcc_floordiv_i64(int64_t a, int64_t b, int *bad) {\n"
  "  if (b == 0) { *bad = 1; return 0; }\n"
  "  if (b == -1) return (int64_t)(0 - (uint64_t)a);\n"
  "  int64_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q--; return q;\n}\n"
  "static inline int64_t tcc_fmod_i64(int64_t a, int64_t b, int *bad) {\n"
  "  if (b == 0) { *bad = 1; return 0; }\n  if (b == -1) return 0;\n  return a % b;\n}\n"
  "static inline int64_t tcc_rem_i64(int64_t a, int64_t b, int *bad) {\n"
  "  if (b == 0) { *bad = 1; return 0; }\n  if (b == -1) return 0;\n"
  "  int64_t r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;\n}\n"
  "static inline int64_t tcc_pow_i64(int64_t b, int64_t e) {\n"
  "  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;\n"
  "  uint64_t r = 1, x = (uint64_t)b;\n"
  "  while (e) { if (e & 1) r *= x; x *= x; e >>= 1; }\n  return (int64_t)r;\n}\n"
  "static inline double tcc_floordiv_f64(double a, double b) {\n"
  "  if (b == 0) return a / b;\n  double m = fmod(a, b), d = (a - m) / b;\n"
  "  if (m != 0 && ((b < 0) != (m < 0))) d -= 1;\n"
  "  if (d == 0) return copysign(0.0, a / b);\n"
  "  double f = floor(d); if (d - f > 0.5) f += 1; return f;\n}\n"
  "static inline float tcc_floordiv_f32(float a, float b) {\n"
  "  if (b == 0) return a / b;\n  float m = fmodf(a, b), d = (a - m) / b;\n"
  "  if (m != 0 && ((b < 0) != (m < 0))) d -= 1;\n"
  "  if (d == 0) return copysignf(0.0f, a / b);\n"
  "  float f = floorf(d); if (d - f > 0.5f) f += 1; return f;\n}\n"
  "static inline double tcc_rem_f64(double a, double b) {\n"
  "  double m = fmod(a, b); if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;\n}\n"
  "static inline float tcc_rem_f32(float a, float b) {\n"
  "  float m = fmodf(a, b); if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;\n}\n";

