/*
 * fuzz_prepare.c — libFuzzer target: arbitrary bytes through
 * tcc_prepare_bytes (decode, verify, canonicalize, guard key), and for
 * requests that prepare, the back end up to C source (lower, fuse, place,
 * emit; no C compiler is run). Built only with -Dfuzz=true and clang;
 * run it with scripts/fuzz.
 *
 * Besides crashes and sanitizer reports it checks invariants:
 *   - a failure has a TCC_E_* code and a non-empty message, and *out
 *     stays NULL;
 *   - a success has hash == SHA-256(key), and preparing the same bytes
 *     again gives the same key (determinism);
 *   - the back end either generates source or fails with a code other
 *     than INTERNAL (INTERNAL means an IR check failed: a compiler bug).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "loop.h"

#define ID "tccd-codegen/1 cc=fuzz"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tcc_prepared *p = (tcc_prepared *)&p;   /* must be overwritten */
  tcc_error err;
  int rc = tcc_prepare_bytes(data, size, ID, &p, &err);
  if (rc) {
    if (p != NULL || rc >= 0 || err.code != rc || !err.msg[0]) abort();
    return 0;
  }
  uint8_t h[TCC_SHA256_BYTES];
  tcc_sha256(p->key, p->key_len, h);
  if (memcmp(h, p->hash, sizeof h) != 0) abort();

  tcc_prepared *q;
  if (tcc_prepare_bytes(data, size, ID, &q, &err) != 0) abort();
  if (q->key_len != p->key_len || memcmp(q->key, p->key, p->key_len) != 0) abort();
  tcc_prepared_free(q);

  char *src;
  size_t len;
  int kernels = 0;
  rc = tcc_generate_source(p, &src, &len, &kernels, &err);
  if (rc == TCC_E_INTERNAL) abort();   /* an IR check failed */
  /* CPU source exports tcc_entry (tcc_entry2 with dynamic shapes); CUDA
   * source holds __global__ kernels (or only cuBLAS steps, described in
   * comments) */
  const char *entry = p->device == TCC__V1__DEVICE_TYPE__CUDA ? "__global__" : "int tcc_entry";
  if (rc == 0 && (kernels < 1 || (!strstr(src, entry) && !(p->device == TCC__V1__DEVICE_TYPE__CUDA &&
                                                            strstr(src, ": extern step, run by the client")))))
    abort();
  free(src);
  tcc_prepared_free(p);
  return 0;
}
