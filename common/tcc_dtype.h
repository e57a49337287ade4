/*
 * tcc_dtype.h — element sizes, and the storage a strided tensor reaches.
 * The one table of dtype sizes: the compiler (compiler/dtype.c adds names
 * and promotion), the benchmark child (runtime/bench.c), the tools and the
 * tests call these.
 *
 * Dtypes are the wire enum's numbers (tcc.v1.DType in
 * proto/tcc/v1/tcc.proto), which never change:
 *
 *   number  dtype     bytes        number  dtype   bytes
 *   1       float32   4            6       int16   2
 *   2       float64   8            7       int32   4
 *   3       float16   2            8       int64   8
 *   4       bfloat16  2            9       uint8   1
 *   5       int8      1            10      bool    1
 *
 * common/ sits below proto/, so these take plain ints and arrays rather
 * than the generated types.
 */
#ifndef TCC_DTYPE_H
#define TCC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of one element of wire dtype d; 0 when d names none (0, or a
 * number past the table). */
int tcc_dtype_size(int d);

/* Elements of storage a tensor reaches: offset + sum((size - 1) * stride)
 * + 1, or 0 when a size is 0. A stride missing from strides (n_strides <
 * rank) counts as 0. */
int64_t tcc_storage_elems(const int64_t *sizes, size_t rank, const int64_t *strides, size_t n_strides,
                          int64_t offset);

#endif
