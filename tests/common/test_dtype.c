/*
 * test_dtype.c — the one table of element sizes (common/tcc_dtype.h)
 * against the wire enum it is keyed by, and the storage span of strided
 * tensors.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_dtype.h"
#include "tcctest.h"

START_TEST(sizes_follow_the_wire_enum) {
  static const struct {
    Tcc__V1__DType d;
    int bytes;
  } want[] = {
      {TCC__V1__DTYPE__FLOAT32, 4}, {TCC__V1__DTYPE__FLOAT64, 8}, {TCC__V1__DTYPE__FLOAT16, 2},
      {TCC__V1__DTYPE__BFLOAT16, 2}, {TCC__V1__DTYPE__INT8, 1},   {TCC__V1__DTYPE__INT16, 2},
      {TCC__V1__DTYPE__INT32, 4},   {TCC__V1__DTYPE__INT64, 8},   {TCC__V1__DTYPE__UINT8, 1},
      {TCC__V1__DTYPE__BOOL, 1},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(tcc_dtype_size(want[i].d) == want[i].bytes, "dtype %d: %d bytes, want %d", want[i].d,
                  tcc_dtype_size(want[i].d), want[i].bytes);
  ck_assert_int_eq(tcc_dtype_size(TCC__V1__DTYPE__DTYPE_UNSPECIFIED), 0);
  ck_assert_int_eq(tcc_dtype_size(TCC__V1__DTYPE__BOOL + 1), 0);
  ck_assert_int_eq(tcc_dtype_size(-1), 0);
}
END_TEST

START_TEST(storage_spans) {
  const int64_t sizes[] = {4, 3, 5}, dense[] = {15, 5, 1}, bcast[] = {0, 5, 1}, tposed[] = {1, 4, 12};
  ck_assert_int_eq(tcc_storage_elems(sizes, 3, dense, 3, 0), 60);
  ck_assert_int_eq(tcc_storage_elems(sizes, 3, dense, 3, 7), 67);
  ck_assert_int_eq(tcc_storage_elems(sizes, 3, bcast, 3, 0), 15);
  ck_assert_int_eq(tcc_storage_elems(sizes, 3, tposed, 3, 0), 3 + 8 + 48 + 1);
  ck_assert_int_eq(tcc_storage_elems(sizes, 3, dense, 1, 0), 46); /* missing strides count as 0 */
  ck_assert_int_eq(tcc_storage_elems(NULL, 0, NULL, 0, 3), 4);    /* a 0-d tensor at offset 3 */
  const int64_t empty[] = {4, 0, 5};
  ck_assert_int_eq(tcc_storage_elems(empty, 3, dense, 3, 9), 0);
}
END_TEST

int main(void) {
  return tt_run_tests("dtype", 0, 0, (const TTest *[]){sizes_follow_the_wire_enum, storage_spans, NULL});
}
