/*
 * csource.c — the C source text both emitters (emit_c.c for the CPU,
 * emit_cuda.c for NVRTC) write alike: numbers and primitive operations.
 *
 * Numbers: nothing from a request reaches generated source but numbers,
 * and these functions are how they get there: floats as exact hexadecimal
 * literals built from their bits (no printf %a, so no locale can change
 * them), int64 values with INT64_C, a constant buffer's elements as an
 * initializer list.
 *
 * Primitives: the expression for each tcc_prim over operand texts, where
 * the two dialects agree (C99 math names, wrapping integer arithmetic
 * through the unsigned type). What differs is the target's: how a float
 * of a dtype is spelled (suffix, NaN and infinity macros), the C type of
 * a dtype, the math suffix of the operand dtype, rounding, isinf, and the
 * integer divisions and remainders, whose division by zero the CPU
 * target reports through a flag.
 */
#include "loop.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

void tcc_put_hexfloat(tcc_buf *b, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  int biased = (int)((u >> 52) & 0x7ff);
  uint64_t mant = u & ((UINT64_C(1) << 52) - 1);
  char digits[14];
  int n = 0;
  for (int shift = 48; shift >= 0 && mant << (12 + 48 - shift) != 0; shift -= 4)
    digits[n++] = "0123456789abcdef"[(mant >> shift) & 0xf];
  digits[n] = '\0';
  int lead = biased != 0;
  int exp = biased ? biased - 1023 : (mant ? -1022 : 0);
  tcc_buf_printf(b, "%s0x%d%s%sp%+d", (u >> 63) ? "-" : "", lead, n ? "." : "", digits, exp);
}

const char *tcc_utype(tcc_dtype d) {
  return d == TCC__V1__DTYPE__INT64 ? "uint64_t" : "uint32_t";
}

void tcc_put_int64(tcc_buf *b, int64_t v) {
  if (v == INT64_MIN) tcc_buf_puts(b, "INT64_MIN");
  else tcc_buf_printf(b, "INT64_C(%" PRId64 ")", v);
}

/* The value of IEEE half h (exact: every half is a float). */
static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return h & 0x8000 ? -v : v;
}

void tcc_put_constant_elements(tcc_buf *b, const tcc_buffer *B, tcc_put_float_fn *put_float,
                               int half_as_float) {
  int64_t n = B->layout.numel;
  int es = tcc_dtype_size(B->layout.dtype);
  tcc_buf_puts(b, "{");
  if (!n) tcc_buf_puts(b, "0");
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *p = B->data + i * es;
    tcc_buf_puts(b, i % 6 ? ", " : (i ? ",\n  " : "\n  "));
    switch (B->layout.dtype) {
    case TCC__V1__DTYPE__FLOAT32: {
      float f;
      memcpy(&f, p, 4);
      put_float(b, f, B->layout.dtype);
      break;
    }
    case TCC__V1__DTYPE__FLOAT64: {
      double f;
      memcpy(&f, p, 8);
      put_float(b, f, B->layout.dtype);
      break;
    }
    case TCC__V1__DTYPE__INT8: tcc_buf_printf(b, "%d", (int)*(const int8_t *)p); break;
    case TCC__V1__DTYPE__INT16: {
      int16_t v;
      memcpy(&v, p, 2);
      tcc_buf_printf(b, "%d", (int)v);
      break;
    }
    case TCC__V1__DTYPE__INT32: {
      int32_t v;
      memcpy(&v, p, 4);
      tcc_buf_printf(b, "%" PRId32, v);
      break;
    }
    case TCC__V1__DTYPE__INT64: {
      int64_t v;
      memcpy(&v, p, 8);
      tcc_put_int64(b, v);
      break;
    }
    case TCC__V1__DTYPE__FLOAT16:
    case TCC__V1__DTYPE__BFLOAT16: {
      uint16_t h;
      memcpy(&h, p, 2);
      if (half_as_float && B->layout.dtype == TCC__V1__DTYPE__FLOAT16)
        put_float(b, half_value(h), TCC__V1__DTYPE__FLOAT32);
      else
        tcc_buf_printf(b, "%u", (unsigned)h);
      break;
    }
    default: tcc_buf_printf(b, "%u", (unsigned)*p); break;
    }
  }
  tcc_buf_puts(b, "};\n");
}

int tcc_put_prim_common(tcc_buf *b, tcc_prim op, tcc_dtype d, const char *T, int isint,
                        const char *f, const char *x, const char *y, const char *z) {
  const char *U = tcc_utype(d);
  switch (op) {
  case TCC_PRIM_NEG:
    if (isint) tcc_buf_printf(b, "(%s)(0 - (%s)%s)", T, U, x);
    else tcc_buf_printf(b, "-%s", x);
    break;
  case TCC_PRIM_ABS:
    if (isint) tcc_buf_printf(b, "(%s < 0 ? (%s)(0 - (%s)%s) : %s)", x, T, U, x, x);
    else tcc_buf_printf(b, "fabs%s(%s)", f, x);
    break;
  case TCC_PRIM_EXP: tcc_buf_printf(b, "exp%s(%s)", f, x); break;
  case TCC_PRIM_EXP2: tcc_buf_printf(b, "exp2%s(%s)", f, x); break;
  case TCC_PRIM_EXPM1: tcc_buf_printf(b, "expm1%s(%s)", f, x); break;
  case TCC_PRIM_LOG: tcc_buf_printf(b, "log%s(%s)", f, x); break;
  case TCC_PRIM_LOG1P: tcc_buf_printf(b, "log1p%s(%s)", f, x); break;
  case TCC_PRIM_LOG2: tcc_buf_printf(b, "log2%s(%s)", f, x); break;
  case TCC_PRIM_SQRT: tcc_buf_printf(b, "sqrt%s(%s)", f, x); break;
  case TCC_PRIM_RSQRT: tcc_buf_printf(b, "(%s)1 / sqrt%s(%s)", T, f, x); break;
  case TCC_PRIM_RECIP: tcc_buf_printf(b, "(%s)1 / %s", T, x); break;
  case TCC_PRIM_SIN: tcc_buf_printf(b, "sin%s(%s)", f, x); break;
  case TCC_PRIM_COS: tcc_buf_printf(b, "cos%s(%s)", f, x); break;
  case TCC_PRIM_TAN: tcc_buf_printf(b, "tan%s(%s)", f, x); break;
  case TCC_PRIM_TANH: tcc_buf_printf(b, "tanh%s(%s)", f, x); break;
  case TCC_PRIM_ERF: tcc_buf_printf(b, "erf%s(%s)", f, x); break;
  case TCC_PRIM_SIGMOID: tcc_buf_printf(b, "(%s)1 / ((%s)1 + exp%s(-%s))", T, T, f, x); break;
  case TCC_PRIM_RELU: tcc_buf_printf(b, "(%s < 0 ? (%s)0 : %s)", x, T, x); break;
  case TCC_PRIM_FLOOR: tcc_buf_printf(b, "floor%s(%s)", f, x); break;
  case TCC_PRIM_CEIL: tcc_buf_printf(b, "ceil%s(%s)", f, x); break;
  case TCC_PRIM_TRUNC: tcc_buf_printf(b, "trunc%s(%s)", f, x); break;
  case TCC_PRIM_SIGN: tcc_buf_printf(b, "(%s)((%s > 0) - (%s < 0))", T, x, x); break;
  case TCC_PRIM_NOT: tcc_buf_printf(b, "(uint8_t)!%s", x); break;
  case TCC_PRIM_BITNOT: tcc_buf_printf(b, "(%s)~%s", T, x); break;
  case TCC_PRIM_ISNAN: tcc_buf_printf(b, "(uint8_t)(%s != %s)", x, x); break;
  case TCC_PRIM_ADD:
  case TCC_PRIM_SUB:
  case TCC_PRIM_MUL: {
    const char *o = op == TCC_PRIM_ADD ? "+" : op == TCC_PRIM_SUB ? "-" : "*";
    if (isint) tcc_buf_printf(b, "(%s)((%s)%s %s (%s)%s)", T, U, x, o, U, y);
    else tcc_buf_printf(b, "%s %s %s", x, o, y);
    break;
  }
  case TCC_PRIM_POW:
    if (isint) tcc_buf_printf(b, "(%s)tcc_pow_i64(%s, %s)", T, x, y);
    else tcc_buf_printf(b, "pow%s(%s, %s)", f, x, y);
    break;
  case TCC_PRIM_MAX: tcc_buf_printf(b, "((%s > %s || %s != %s) ? %s : %s)", x, y, x, x, x, y); break;
  case TCC_PRIM_MIN: tcc_buf_printf(b, "((%s < %s || %s != %s) ? %s : %s)", x, y, x, x, x, y); break;
  case TCC_PRIM_ATAN2: tcc_buf_printf(b, "atan2%s(%s, %s)", f, x, y); break;
  case TCC_PRIM_EQ: tcc_buf_printf(b, "(uint8_t)(%s == %s)", x, y); break;
  case TCC_PRIM_NE: tcc_buf_printf(b, "(uint8_t)(%s != %s)", x, y); break;
  case TCC_PRIM_LT: tcc_buf_printf(b, "(uint8_t)(%s < %s)", x, y); break;
  case TCC_PRIM_LE: tcc_buf_printf(b, "(uint8_t)(%s <= %s)", x, y); break;
  case TCC_PRIM_GT: tcc_buf_printf(b, "(uint8_t)(%s > %s)", x, y); break;
  case TCC_PRIM_GE: tcc_buf_printf(b, "(uint8_t)(%s >= %s)", x, y); break;
  case TCC_PRIM_AND: tcc_buf_printf(b, "(uint8_t)(%s && %s)", x, y); break;
  case TCC_PRIM_OR: tcc_buf_printf(b, "(uint8_t)(%s || %s)", x, y); break;
  case TCC_PRIM_XOR: tcc_buf_printf(b, "(uint8_t)((%s != 0) != (%s != 0))", x, y); break;
  case TCC_PRIM_BITAND: tcc_buf_printf(b, "(%s)(%s & %s)", T, x, y); break;
  case TCC_PRIM_BITOR: tcc_buf_printf(b, "(%s)(%s | %s)", T, x, y); break;
  case TCC_PRIM_BITXOR: tcc_buf_printf(b, "(%s)(%s ^ %s)", T, x, y); break;
  case TCC_PRIM_WHERE: tcc_buf_printf(b, "(%s ? %s : %s)", x, y, z); break;
  default: return 0;
  }
  return 1;
}
