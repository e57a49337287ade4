/*
 * csource.c — the C-family expression printer both emitters (cpu/emit.c
 * for the system C compiler, cuda/emit.c for NVRTC) share: numbers,
 * literals, constant buffers and primitive operations, each spelled in
 * the target's dialect (tcc_dialect: its C types, float literal macros,
 * rounding and isinf spellings, the division helpers' shape).
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

/* tcc_c_put_prim's ops both dialects spell alike (C type T; isint:
 * integer operands; math suffix f, "f" or ""). Returns 1, or 0 for the
 * ops the dialect decides (ROUND, ISINF, DIV, TRUNCDIV, FLOORDIV, FMOD,
 * REM), writing nothing. */
static int put_prim_common(tcc_buf *b, tcc_prim op, tcc_dtype d, const char *T, int isint, const char *f,
                           const char *x, const char *y, const char *z);

void tcc_c_put_float(const tcc_dialect *D, tcc_buf *b, double v, tcc_dtype d) {
  int f32 = D->halves_in_float ? d != TCC__V1__DTYPE__FLOAT64 : d == TCC__V1__DTYPE__FLOAT32;
  if (isnan(v)) {
    tcc_buf_puts(b, f32 ? D->nan_f32 : D->nan_f64);
  } else if (isinf(v)) {
    tcc_buf_printf(b, "%s%s", v < 0 ? "-" : "", f32 ? D->inf_f32 : D->inf_f64);
  } else {
    tcc_put_hexfloat(b, f32 ? (double)(float)v : v);
    if (f32) tcc_buf_puts(b, "f");
  }
}

void tcc_c_put_literal(const tcc_dialect *D, tcc_buf *b, const tcc_vx *e) {
  if (tcc_dtype_is_float(e->dtype)) tcc_c_put_float(D, b, e->f, e->dtype);
  else if (e->dtype == TCC__V1__DTYPE__INT64) tcc_put_int64(b, e->i);
  else tcc_buf_printf(b, "((%s)%" PRId64 ")", D->ctype(e->dtype), e->i);
}

const char *tcc_c_int_limit(tcc_dtype d, int high) {
  switch (d) {
  case TCC__V1__DTYPE__INT8: return high ? "INT8_MAX" : "INT8_MIN";
  case TCC__V1__DTYPE__INT16: return high ? "INT16_MAX" : "INT16_MIN";
  case TCC__V1__DTYPE__INT32: return high ? "INT32_MAX" : "INT32_MIN";
  case TCC__V1__DTYPE__INT64: return high ? "INT64_MAX" : "INT64_MIN";
  default: return high ? "255" : "0";
  }
}

void tcc_c_put_constant(const tcc_dialect *D, tcc_buf *b, const tcc_buffer *B, int id) {
  int64_t n = B->layout.numel;
  tcc_buf_printf(b, "%s %s b%d_data[%" PRId64 "] = ", D->constant_qualifiers, D->ctype(B->layout.dtype), id,
                 n ? n : 1);
  tcc_put_constant_elements(D, b, B);
}

void tcc_c_put_prim(const tcc_dialect *D, tcc_buf *b, tcc_prim op, tcc_dtype d, tcc_dtype od, const char *x,
                    const char *y, const char *z) {
  int fl = tcc_dtype_is_float(od);
  const char *f = D->halves_in_float ? (od == TCC__V1__DTYPE__FLOAT64 ? "" : "f")
                                     : (od == TCC__V1__DTYPE__FLOAT32 ? "f" : "");
  const char *T = D->ctype(d), *bad = D->div_flag;
  int isint = !fl;
  switch (op) {
  case TCC_PRIM_ROUND: tcc_buf_printf(b, "%s%s(%s)", D->round, f, x); break;
  case TCC_PRIM_ISINF:
    if (!fl) tcc_buf_puts(b, "(uint8_t)0");
    else if (D->isinf_by_fabs) tcc_buf_printf(b, "(uint8_t)(fabs%s(%s) == %s)", f, x, *f ? D->inf_f32 : D->inf_f64);
    else tcc_buf_printf(b, "(uint8_t)(isinf(%s) != 0)", x);
    break;
  case TCC_PRIM_DIV:
  case TCC_PRIM_TRUNCDIV:
    if (isint) tcc_buf_printf(b, "(%s)tcc_truncdiv_i64(%s, %s%s)", T, x, y, bad);
    else if (op == TCC_PRIM_DIV) tcc_buf_printf(b, "%s / %s", x, y);
    else tcc_buf_printf(b, "trunc%s(%s / %s)", f, x, y);
    break;
  case TCC_PRIM_FLOORDIV:
  case TCC_PRIM_REM: {
    const char *fn = op == TCC_PRIM_FLOORDIV ? "floordiv" : "rem";
    if (isint) tcc_buf_printf(b, "(%s)tcc_%s_i64(%s, %s%s)", T, fn, x, y, bad);
    else if (D->typed_float_helpers) tcc_buf_printf(b, "tcc_%s_f%s(%s, %s)", fn, *f ? "32" : "64", x, y);
    else tcc_buf_printf(b, "tcc_%s(%s, %s)", fn, x, y);
    break;
  }
  case TCC_PRIM_FMOD:
    if (isint) tcc_buf_printf(b, "(%s)tcc_fmod_i64(%s, %s%s)", T, x, y, bad);
    else tcc_buf_printf(b, "fmod%s(%s, %s)", f, x, y);
    break;
  default:
    if (!put_prim_common(b, op, d, T, isint, f, x, y, z))
      tcc_buf_printf(b, "/* bad prim %d */ 0", (int)op);
    break;
  }
}

void tcc_put_constant_elements(const tcc_dialect *D, tcc_buf *b, const tcc_buffer *B) {
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
      tcc_c_put_float(D, b, f, B->layout.dtype);
      break;
    }
    case TCC__V1__DTYPE__FLOAT64: {
      double f;
      memcpy(&f, p, 8);
      tcc_c_put_float(D, b, f, B->layout.dtype);
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
      if (D->half_constants_as_values && B->layout.dtype == TCC__V1__DTYPE__FLOAT16)
        tcc_c_put_float(D, b, half_value(h), TCC__V1__DTYPE__FLOAT32);
      else
        tcc_buf_printf(b, "%u", (unsigned)h);
      break;
    }
    default: tcc_buf_printf(b, "%u", (unsigned)*p); break;
    }
  }
  tcc_buf_puts(b, "};\n");
}

static int put_prim_common(tcc_buf *b, tcc_prim op, tcc_dtype d, const char *T, int isint,
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
  case TCC_PRIM_NDTR:
    tcc_buf_printf(b, "((%s)0.5 * ((%s)1 + erf%s(%s * (%s)0.70710678118654752440)))", T, T, f, x, T);
    break;
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

void tcc_c_put_store_guard(tcc_buf *b, const tcc_ix *const *idx, int rank, tcc_operand_text_fn *text, void *ctx) {
  int any = 0;
  for (int d = 0; d < rank; d++) {
    const tcc_ix *vals[TCC_MAX_DIMS];
    int nv = tcc_ix_values(idx[d], vals, TCC_MAX_DIMS);
    for (int i = 0; i < nv; i++, any = 1) {
      char v[96];
      text(ctx, vals[i]->v, v, sizeof v);
      tcc_buf_printf(b, "%s(uint64_t)(int64_t)(%s) < (uint64_t)INT64_C(%" PRId64 ")", any ? " && " : "if (", v,
                     vals[i]->c);
    }
  }
  if (any) tcc_buf_puts(b, ") ");
}
