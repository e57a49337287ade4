/*
 * dtype.c — element types: names, categories and torch.promote_types
 * (their sizes: common/tcc_dtype.c, the one table of them).
 *
 * Dtypes are the wire enum's numbers (tcc.v1.DType). Promotion follows
 * c10's promoteTypes table, written as its rules:
 *   bool < any integer < any float;
 *   two floats: the wider; float16 with bfloat16 gives float32;
 *   two integers: the wider; uint8 with a signed type gives the smallest
 *   signed type holding both (int8 -> int16).
 */
#include "graph.h"

typedef struct dtype_info {
  const char *name;
  int is_float, is_int, is_signed;
  int rank;  /* width order within its category */
} dtype_info;

static const dtype_info dtypes[] = {
  [TCC__V1__DTYPE__FLOAT32] = {"float32", 1, 0, 1, 2},
  [TCC__V1__DTYPE__FLOAT64] = {"float64", 1, 0, 1, 3},
  [TCC__V1__DTYPE__FLOAT16] = {"float16", 1, 0, 1, 1},
  [TCC__V1__DTYPE__BFLOAT16] = {"bfloat16", 1, 0, 1, 1},
  [TCC__V1__DTYPE__INT8] = {"int8", 0, 1, 1, 1},
  [TCC__V1__DTYPE__INT16] = {"int16", 0, 1, 1, 2},
  [TCC__V1__DTYPE__INT32] = {"int32", 0, 1, 1, 3},
  [TCC__V1__DTYPE__INT64] = {"int64", 0, 1, 1, 4},
  [TCC__V1__DTYPE__UINT8] = {"uint8", 0, 1, 0, 1},
  [TCC__V1__DTYPE__BOOL] = {"bool", 0, 0, 0, 0},
};

int tcc_dtype_valid(tcc_dtype d) {
  return d > 0 && d < (int)(sizeof dtypes / sizeof dtypes[0]) && dtypes[d].name;
}

const char *tcc_dtype_name(tcc_dtype d) {
  return tcc_dtype_valid(d) ? dtypes[d].name : "invalid";
}

int tcc_dtype_is_float(tcc_dtype d) { return tcc_dtype_valid(d) && dtypes[d].is_float; }

int tcc_dtype_is_int(tcc_dtype d) { return tcc_dtype_valid(d) && dtypes[d].is_int; }

tcc_dtype tcc_dtype_promote(tcc_dtype a, tcc_dtype b) {
  if (!tcc_dtype_valid(a)) return b;
  if (!tcc_dtype_valid(b) || a == b) return a;
  const dtype_info *x = &dtypes[a], *y = &dtypes[b];
  if (a == TCC__V1__DTYPE__BOOL) return b;
  if (b == TCC__V1__DTYPE__BOOL) return a;
  if (x->is_float != y->is_float) return x->is_float ? a : b;
  if (x->is_float) {
    if (x->rank == y->rank) return TCC__V1__DTYPE__FLOAT32; /* f16 + bf16 */
    return x->rank > y->rank ? a : b;
  }
  if (x->is_signed == y->is_signed) return x->rank > y->rank ? a : b;
  /* uint8 with a signed integer */
  tcc_dtype s = x->is_signed ? a : b;
  return s == TCC__V1__DTYPE__INT8 ? TCC__V1__DTYPE__INT16 : s;
}
