/*
 * testutil.h — what the client tests share beyond tests/support
 * (tcctest.h): build a test kernel (a shared object implementing
 * tcc_entry) with the system C compiler, its manifest, and a float64
 * reference check.
 *
 * The kernel: out0[i] = sin(x[i]) + cos(y[i]) over TU_N float32 elements
 * (out0 = 2 x with -DDOUBLE_IT); its constructor sets the environment
 * variable `marker`, so a test can see whether it was ever dlopen'ed;
 * tcc_entry_fails returns 7.
 */
#ifndef TCC_TESTUTIL_H
#define TCC_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "tccclient.h"

#define TU_N 257

/* A private temporary directory for this process (created once). */
const char *tu_tmpdir(void);

/* Builds the test kernel; returns the .so bytes (malloc'd). Aborts the
 * test (Check) when the compiler fails. */
uint8_t *tu_build_kernel(const char *marker, const char *extra_define, size_t *len);

/* A manifest for the test kernel: two float32[TU_N] inputs, one output. */
typedef struct tu_manifest {
  Tcc__V1__Manifest m;
  Tcc__V1__TensorMeta metas[3];
  Tcc__V1__TensorMeta *inputs[2], *outputs[1];
  Tcc__V1__KernelInfo kernel;
  Tcc__V1__KernelInfo *kernels[1];
  int64_t sizes[1], strides[1];
} tu_manifest;

void tu_manifest_init(tu_manifest *t, const char *entry, unsigned abi);

/* Runs k on fresh random inputs and checks out0 against the float64
 * reference (sin + cos, or 2x when doubled). */
void tu_run_and_check(tcc_module *k, int doubled);

#endif
