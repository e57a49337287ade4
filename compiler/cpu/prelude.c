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
  "extern float erff(float) TCC_SIMD; extern float powf(float, float) TCC_SIMD;\n"
  "extern double exp(double) TCC_SIMD; extern double exp2(double) TCC_SIMD;\n"
  "extern double expm1(double) TCC_SIMD; extern double log(double) TCC_SIMD;\n"
  "extern double log1p(double) TCC_SIMD; extern double log2(double) TCC_SIMD;\n"
  "extern double sin(double) TCC_SIMD; extern double cos(double) TCC_SIMD;\n"
  "extern double tan(double) TCC_SIMD; extern double tanh(double) TCC_SIMD;\n"
  "extern double erf(double) TCC_SIMD; extern double pow(double, double) TCC_SIMD;\n"
  "#endif\n"
  /* exp for float32 without libmvec's slow path (schedule.c,
   * plan_inline_exp): Cody-Waite reduction by ln 2, Cephes' polynomial
   * (under 1 ulp against exp in double), the exponent added to the bits.
   * Fused multiply-adds where the target has them (TCC_FMAF; the build's
   * -ffp-contract=off fuses nothing itself): half the polynomial's
   * instructions. tcc_expf, every float32 exp on x86-64-v4, scales by
   * 2^n as 2^(n - n/2) 2^(n/2), so a result below FLT_MIN rounds once
   * into the subnormals, as the exact value would; tcc_expf_ftz, a
   * masked score's exp, returns 0 below FLT_MIN (one multiply and two
   * integer steps fewer: a softmax of masked scores ran 1.1x faster). */
  "#ifdef __FMA__\n#define TCC_FMAF(a, b, c) __builtin_fmaf(a, b, c)\n"
  "#else\n#define TCC_FMAF(a, b, c) ((a) * (b) + (c))\n#endif\n"
  /* exp(x) = e * 2^n, e in [0.7, 1.42]: e, and n + 1.5 * 2^23 as a
   * float's bits in *k (n = x log2(e) rounded by adding 1.5 * 2^23, for
   * |x| < 2^21: no rounding or float-to-int instructions; the low 9 bits
   * of 1.5 * 2^23 are 0, so k << 23 is n << 23) */
  "static inline float tcc_exp_poly(float x, uint32_t *k) {\n"
  "  const float t = TCC_FMAF(x, 1.44269504088896341f, 0x1.8p23f), nf = t - 0x1.8p23f;\n"
  "  const float r = TCC_FMAF(nf, 2.12194440e-4f, TCC_FMAF(nf, -0.693359375f, x));\n"
  "  float p = 1.9875691500e-4f;\n"
  "  p = TCC_FMAF(p, r, 1.3981999507e-3f); p = TCC_FMAF(p, r, 8.3334519073e-3f);\n"
  "  p = TCC_FMAF(p, r, 4.1665795894e-2f); p = TCC_FMAF(p, r, 1.6666665459e-1f);\n"
  "  p = TCC_FMAF(p, r, 5.0000001201e-1f);\n"
  "  __builtin_memcpy(k, &t, 4);\n"
  "  return TCC_FMAF(p, r * r, r) + 1.0f;\n}\n"
  "static inline int32_t tcc_exp_n(uint32_t k) { return (int32_t)(k - 0x4b400000u); }\n"
  "static inline float tcc_times_pow2(float e, int32_t n) {\n"
  "  uint32_t u; __builtin_memcpy(&u, &e, 4);\n"
  "  u += (uint32_t)n << 23;\n"
  "  float y; __builtin_memcpy(&y, &u, 4);\n"
  "  return y;\n}\n"
  /* exp(x) for x in [-87.33654, 88.72]: no checks */
  "static inline float tcc_exp_in_range(float x) {\n"
  "  uint32_t k; const float e = tcc_exp_poly(x, &k);\n"
  "  return tcc_times_pow2(e, (int32_t)k);\n}\n"
  "static inline float tcc_expf_ftz(float x) {\n"
  "  const float xc = x < -87.33654f ? -87.33654f : x > 0x1.62e42ep+6f ? 0x1.62e42ep+6f : x;\n"
  "  const float y = tcc_exp_in_range(xc);\n"
  "  return x < -87.33654f ? 0.0f : x > 0x1.62e42ep+6f ? __builtin_inff() : x != x ? x : y;\n}\n"
  "static inline float tcc_expf(float x) {\n"
  "  const float xc = x < -103.972084f ? -103.972084f : x > 0x1.62e42ep+6f ? 0x1.62e42ep+6f : x;\n"
  "  uint32_t k; const float e = tcc_exp_poly(xc, &k);\n"
  "  const int32_t n = tcc_exp_n(k), h = n >> 1;\n"
  "  const float y = tcc_times_pow2(e, n - h) * tcc_times_pow2(1.0f, h);\n"
  "  return x < -103.972084f ? 0.0f : x > 0x1.62e42ep+6f ? __builtin_inff() : x != x ? x : y;\n}\n"
  /* the same for an argument known <= 0 or NaN (x - max(x): schedule.c,
   * plan_exp_le0). No clamp: where x is below the cut, e and n are
   * garbage (NaN for -inf) that the last select drops. 2^n is applied by
   * multiplying by 2^m (m <= 0, made from its exponent bits: 0, a power
   * of 2 or inf for garbage, never a subnormal or a NaN), so a NaN
   * argument stays NaN through e, with no select for it: a NaN's
   * payload added to the bits could have made it a number. (With that
   * select, the masked softmax took 1.2x as long on Zen 5.) */
  "static inline float tcc_pow2_le0(int32_t m) {\n"
  "  const uint32_t b = ((uint32_t)m << 23) + 0x3f800000u;\n"
  "  float y; __builtin_memcpy(&y, &b, 4);\n"
  "  return y;\n}\n"
  "static inline float tcc_expf_ftz_le0(float x) {\n"
  "  uint32_t k; const float e = tcc_exp_poly(x, &k);\n"
  "  const float y = e * tcc_pow2_le0((int32_t)k);\n"
  "  return x < -87.33654f ? 0.0f : y;\n}\n"
  "static inline float tcc_expf_le0(float x) {\n"
  "  uint32_t k; const float e = tcc_exp_poly(x, &k);\n"
  "  const int32_t n = tcc_exp_n(k), h = n >> 1;\n"
  "  const float y = e * tcc_pow2_le0(n - h) * tcc_pow2_le0(h);\n"
  "  return x < -103.972084f ? 0.0f : y;\n}\n"
  /* erf for float32 on AVX-512 targets (emit.c): |a| <= 0.927734375 an
   * odd polynomial, above 1 - exp(p(|a|)) with |a| clamped at 4 (erf is
   * 1 in float from 3.92), so p lies in [-16.5, -0.9] and the exp needs
   * no range checks; both computed and one picked, as a SIMD lane must.
   * Coefficients: N. Juffa's erff; under 1.2 ulp against erf in double
   * over every float (checked with and without FMA). On an AVX-512 Xeon
   * it ran 1.3x faster than libmvec's _ZGVeN16v_erff (0.62 against 0.81
   * ns an element, one thread, in cache); on AVX2 libmvec's was faster,
   * so other targets keep erff. */
  "static inline float tcc_erff(float a) {\n"
  "  const float t = __builtin_fabsf(a), s = a * a;\n"
  "  float q = -5.96761703e-4f;\n"
  "  q = TCC_FMAF(q, s, 4.99119423e-3f); q = TCC_FMAF(q, s, -2.67681349e-2f);\n"
  "  q = TCC_FMAF(q, s, 1.12819925e-1f); q = TCC_FMAF(q, s, -3.76125336e-1f);\n"
  "  q = TCC_FMAF(q, s, 1.28379166e-1f); q = TCC_FMAF(q, a, a);\n"
  "  const float tc = t < 4.0f ? t : 4.0f, sc = tc * tc;\n"
  "  float r = TCC_FMAF(-1.72853470e-5f, tc, 3.83197126e-4f);\n"
  "  const float u = TCC_FMAF(-3.88396438e-3f, tc, 2.42546219e-2f);\n"
  "  r = TCC_FMAF(r, sc, u); r = TCC_FMAF(r, tc, -1.06777877e-1f);\n"
  "  r = TCC_FMAF(r, tc, -6.34846687e-1f); r = TCC_FMAF(r, tc, -1.28717512e-1f);\n"
  "  r = TCC_FMAF(r, tc, -tc);\n"
  "  const float big = __builtin_copysignf(1.0f - tcc_exp_in_range(r), a);\n"
  "  return t > 0.927734375f ? big : q;\n}\n"
  /* The standard normal CDF for float32, GELU's (x ndtr(x)): PyTorch's
   * CPU kernels compute GELU's erf by Abramowitz and Stegun 7.1.26,
   * erfc(a) ~ t (a1 + t (a2 + ..)) exp(-a^2) with t = 1 / (1 + p a),
   * absolute error under 1.5e-7; so does this, with the sign applied to
   * erfc (no 1 - 1 cancellation below 0) and the exp taken over
   * [-86, 0] (below it erfc is 0 in float): a NaN goes through t. One
   * polynomial and a division instead of tcc_erff's two polynomials and
   * a select: GELU in 0.46 against 0.60 ns an element (one thread, in
   * cache, an AVX-512 Xeon; eager's 0.42). */
  "static inline float tcc_ndtrf(float x) {\n"
  "  const float z = x * 0.70710678118654752f, a = __builtin_fabsf(z);\n"
  "  const float t = 1.0f / TCC_FMAF(0.3275911f, a, 1.0f);\n"
  "  float r = TCC_FMAF(1.061405429f, t, -1.453152027f);\n"
  "  r = TCC_FMAF(r, t, 1.421413741f); r = TCC_FMAF(r, t, -0.284496736f);\n"
  "  r = TCC_FMAF(r, t, 0.254829592f);\n"
  "  const float s = -(z * z);\n"
  "  const float h = 0.5f * (r * t * tcc_exp_in_range(s < -86.0f ? -86.0f : s));   /* erfc(|z|) / 2 */\n"
  "  return z < 0.0f ? h : 1.0f - h;\n}\n"
  /* x is a NaN, by integer arithmetic alone: a max/min reduction's NaN
   * flag (emit.c). With a compare (x != x) gcc vectorized no element loop
   * around an unrolled pooling window (ResNet-50's stem ran scalar, 12x
   * slower). */
  "static inline int tcc_nan_bit32(float x) {\n"
  "  uint32_t u; __builtin_memcpy(&u, &x, 4); return (int)(((u & 0x7fffffffu) + 0x007fffffu) >> 31);\n}\n"
  "static inline int tcc_nan_bit64(double x) {\n"
  "  uint64_t u; __builtin_memcpy(&u, &x, 8);\n"
  "  return (int)(((u & 0x7fffffffffffffffu) + 0x000fffffffffffffu) >> 63);\n}\n"
  /* m ? a : b for a mask m of all ones or zeros, by bit operations: a
   * select on a condition that does not vary along a SIMD loop (emit.c,
   * invariant_select) */
  "static inline float tcc_pick32(uint32_t m, float a, float b) {\n"
  "  uint32_t x, y; __builtin_memcpy(&x, &a, 4); __builtin_memcpy(&y, &b, 4);\n"
  "  x = (x & m) | (y & ~m); float r; __builtin_memcpy(&r, &x, 4); return r;\n}\n"
  "static inline double tcc_pick64(uint64_t m, double a, double b) {\n"
  "  uint64_t x, y; __builtin_memcpy(&x, &a, 8); __builtin_memcpy(&y, &b, 8);\n"
  "  x = (x & m) | (y & ~m); double r; __builtin_memcpy(&r, &x, 8); return r;\n}\n"
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


/* The thread governor, in the sources of programs whose kernels run on
 * OpenMP threads (tcc_cpu_schedule.threaded). A parallel region ends in a
 * barrier, so when another process holds a core, every region waits for
 * a scheduler time slice of the thread that shares it: on 2 cores with
 * one busy, BERT-base's 9-token step went from 46 ms to over 500. The
 * governor times each call of tcc_entry and runs it either on the
 * OpenMP threads (mode 0) or on the calling thread alone (mode 1, by
 * omp_set_num_threads(1) for the call: loops, oneDNN and GEMM batches
 * all follow it), whichever mode's cost over its last 8 calls is lower.
 * A mode's cost is the median of those calls, or their mean where two or
 * more took over twice the median: with a neighbour on a core, most
 * calls on all threads finish as fast as on a quiet machine and one in
 * three to five waits 4-100 ms for a time slice (a GPT-2 decode step's
 * 1 ms artifacts: 0.7-0.8 ms on most calls, 1.1 on one thread), which a
 * median hides and a mean counts; a quiet machine's lone hiccup (about
 * 1 call in 130) moves neither. Call 0 is a warm-up (thread start,
 * oneDNN's JIT) and is not counted; calls 1-2 sample mode 0 and 3-4
 * mode 1; after that the other mode is probed once every g x (its cost /
 * the best's) calls, g = 4, 8, 16 for the first three probes and 32
 * after, so a probe costs about 1/32 of a call whichever mode wins; a
 * mode that stops being the best is first probed a whole gap later (a
 * probe already due would meet the neighbour's next wait). A probe
 * faster than the best mode's cost is followed by another on the next
 * call until the probed mode's cost is the lower or a probe is slow: a
 * freed core, or a start whose samples a noisy neighbour slowed, is
 * found in one run of probes (before, a second probe a whole gap later:
 * one GPT-2 decode process in six ran its steady state on one thread,
 * 2x slow, after two slow samples at the start).
 * In mode 1 a call also holds the artifact's helper thread, which takes
 * chunks of its streamed GEMMs and never makes the caller wait
 * (share.c). tcc_gov_begin returns the mode, plus 2 for a probe
 * (tcc_gov_end's argument). With one OpenMP thread, or with
 * TCC_NO_GOVERNOR set in the process (a debug switch), it does nothing;
 * TCC_ONE_THREAD (tests, benchmarks) runs every call in mode 1. State is per artifact;
 * concurrent calls race only on statistics (relaxed atomics). */
const char tcc_cpu_governor[] =
  "#include <time.h>\n"
  "int omp_get_max_threads(void); void omp_set_num_threads(int);\n"
  "static int64_t tcc_gov_ns[2][8];  /* per mode: the last 8 call times (ns; 0: none) */\n"
  "static int64_t tcc_gov_calls, tcc_gov_probe_at, tcc_gov_slot[2], tcc_gov_probes;\n"
  "static int64_t tcc_gov_now(void) {\n"
  "  struct timespec t; timespec_get(&t, TIME_UTC);\n"
  "  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;\n}\n"
  "/* Mode m's cost: the median of its last calls (the lower middle), or\n"
  " * their mean where two or more took over twice the median; 0: none. */\n"
  "static int64_t tcc_gov_cost(int m) {\n"
  "  int64_t v[8], sum = 0; int n = 0;\n"
  "  for (int i = 0; i < 8; i++) {\n"
  "    int64_t x = __atomic_load_n(&tcc_gov_ns[m][i], __ATOMIC_RELAXED);\n"
  "    if (x <= 0) continue;\n"
  "    int j = n++;\n"
  "    for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];\n"
  "    v[j] = x; sum += x;\n  }\n"
  "  if (n == 0) return 0;\n"
  "  int64_t med = v[(n - 1) / 2]; int slow = 0;\n"
  "  for (int i = 0; i < n; i++) slow += v[i] > 2 * med;\n"
  "  return slow >= 2 ? sum / n : med;\n}\n"
  "/* Schedules the next probe of a mode that costs mo against the best's\n"
  " * mb, k probes made so far. */\n"
  "static void tcc_gov_plan_probe(int64_t c, int64_t k, int64_t mb, int64_t mo) {\n"
  "  double r = mb > 0 && mo > 0 ? (double)mo / (double)mb : 1.0;\n"
  "  int64_t gap = (int64_t)((k < 3 ? 4 << k : 32) * (r < 1.0 ? 1.0 : r > 32.0 ? 32.0 : r));\n"
  "  __atomic_store_n(&tcc_gov_probe_at, c + gap, __ATOMIC_RELAXED);\n}\n"
  "/* The mode of this call (-1: one thread anyway); sets the threads. */\n"
  "static int tcc_gov_begin(int *saved) {\n"
  "  static int off = -1;  /* TCC_NO_GOVERNOR (a debug switch): always all threads */\n"
  "  if (__atomic_load_n(&off, __ATOMIC_RELAXED) < 0) {\n"
  "    char *getenv(const char *);\n"
  "    __atomic_store_n(&off, getenv(\"TCC_NO_GOVERNOR\") != 0, __ATOMIC_RELAXED);\n  }\n"
  "  static int one = -1;  /* TCC_ONE_THREAD (tests, benchmarks): always the calling thread */\n"
  "  if (__atomic_load_n(&one, __ATOMIC_RELAXED) < 0) {\n"
  "    char *getenv(const char *), *e = getenv(\"TCC_ONE_THREAD\");\n"
  "    __atomic_store_n(&one, e && e[0] && !(e[0] == '0' && !e[1]), __ATOMIC_RELAXED);\n  }\n"
  "  *saved = omp_get_max_threads();\n"
  "  if (*saved <= 1 || __atomic_load_n(&off, __ATOMIC_RELAXED)) return -1;\n"
  "  int64_t c = __atomic_fetch_add(&tcc_gov_calls, 1, __ATOMIC_RELAXED);\n"
  "  int mode;\n"
  "  if (__atomic_load_n(&one, __ATOMIC_RELAXED)) mode = 1;\n"
  "  else if (c < 5) mode = c >= 3;\n"
  "  else {\n"
  "    int64_t m0 = tcc_gov_cost(0), m1 = tcc_gov_cost(1);\n"
  "    int best = m1 > 0 && m1 < m0, other = !best;\n"
  "    mode = best;\n"
  "    if (c >= __atomic_load_n(&tcc_gov_probe_at, __ATOMIC_RELAXED)) {\n"
  "      int64_t mb = best ? m1 : m0, mo = other ? m1 : m0;\n"
  "      tcc_gov_plan_probe(c, __atomic_fetch_add(&tcc_gov_probes, 1, __ATOMIC_RELAXED), mb, mo);\n"
  "      mode = other | 2;\n    }\n  }\n"
  "  if ((mode & 1) == 1) {\n"
  "    omp_set_num_threads(1);\n"
  "#ifdef TCC_SHARE\n"
  "    tcc_share_enter();   /* streamed GEMMs share chunks with the helper (share.c) */\n"
  "#endif\n"
  "  }\n  return mode;\n}\n"
  "static void tcc_gov_end(int mode, int saved, int64_t t0) {\n"
  "  if (mode < 0) return;\n"
  "  const int probe = mode & 2;\n"
  "  mode &= 1;\n"
  "  if (mode == 1) {\n"
  "#ifdef TCC_SHARE\n"
  "    tcc_share_leave();\n"
  "#endif\n"
  "    omp_set_num_threads(saved);\n  }\n"
  "  int64_t dt = tcc_gov_now() - t0;\n"
  "  int64_t c = __atomic_load_n(&tcc_gov_calls, __ATOMIC_RELAXED);\n"
  "  if (c <= 1 || dt <= 0) return;  /* the warm-up */\n"
  "  int64_t i = __atomic_fetch_add(&tcc_gov_slot[mode], 1, __ATOMIC_RELAXED) % 8;\n"
  "  __atomic_store_n(&tcc_gov_ns[mode][i], dt, __ATOMIC_RELAXED);\n"
  "  int64_t mb = tcc_gov_cost(!mode), mc = tcc_gov_cost(mode);\n"
  "  if (probe && dt < mb && mc >= mb)  /* not yet the best: probe again next call */\n"
  "    __atomic_store_n(&tcc_gov_probe_at, c, __ATOMIC_RELAXED);\n"
  "  else if (!probe && c >= 5 && mb > 0 && mc > mb)  /* the best no more: its first probe a gap on */\n"
  "    tcc_gov_plan_probe(c, __atomic_load_n(&tcc_gov_probes, __ATOMIC_RELAXED), mb, mc);\n}\n";
