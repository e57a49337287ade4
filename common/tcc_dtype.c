/* tcc_dtype.c — element sizes by wire dtype number (see tcc_dtype.h). */
#include "tcc_dtype.h"

static const int sizes[] = {
  [1] = 4,  /* float32 */
  [2] = 8,  /* float64 */
  [3] = 2,  /* float16 */
  [4] = 2,  /* bfloat16 */
  [5] = 1,  /* int8 */
  [6] = 2,  /* int16 */
  [7] = 4,  /* int32 */
  [8] = 8,  /* int64 */
  [9] = 1,  /* uint8 */
  [10] = 1, /* bool */
};

int tcc_dtype_size(int d) { return d > 0 && d < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[d] : 0; }

int64_t tcc_storage_elems(const int64_t *sizes_, size_t rank, const int64_t *strides, size_t n_strides,
                          int64_t offset) {
  int64_t last = 0;
  for (size_t d = 0; d < rank; d++) {
    if (sizes_[d] == 0) return 0;
    last += (sizes_[d] - 1) * (d < n_strides ? strides[d] : 0);
  }
  return offset + last + 1;
}
