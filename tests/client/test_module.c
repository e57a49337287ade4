/*
 * test_kernel.c — tcc_module_load / run / unload on shared objects built
 * by the test itself (the C compiler via fork/exec), and the refusals that
 * must happen before anything is dlopen'ed.
 *
 * Each built object has a constructor that sets an environment variable
 * named after the test, so "was it dlopen'ed?" is observable. Inputs are
 * fresh random floats (seed printed; TCC_TEST_SEED replays), compared with
 * a float64 reference.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tcc_config.h"
#include "tccclient.h"
#include "tcctest.h"
#include "testutil.h"

/* ------------------------------------------------------------------ */

START_TEST(load_run_unload) {
  size_t len;
  uint8_t *so = tu_build_kernel("TCC_MARK_LOAD", NULL, &len);
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(so, len, hex);
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry", 1);
  unsetenv("TCC_MARK_LOAD");
  tcc_module *k = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_module_load(so, len, hex, &tm.m, &k, &err) == 0, "load: %s", err.msg);
  ck_assert_ptr_nonnull(k);
  ck_assert_ptr_nonnull(getenv("TCC_MARK_LOAD")); /* the constructor ran */
  free(so);                                       /* the kernel keeps its own copy */

  const Tcc__V1__Manifest *m = tcc_module_manifest(k);
  ck_assert_ptr_nonnull(m);
  ck_assert_ptr_ne(m, &tm.m);
  ck_assert_str_eq(m->entry, "tcc_entry");
  ck_assert_uint_eq(m->n_inputs, 2);
  ck_assert_int_eq(m->inputs[1]->sizes[0], TU_N);
  for (int rep = 0; rep < 3; rep++) tu_run_and_check(k, 0);

  /* The manifest as bytes reads back as the same manifest. */
  uint8_t *mb;
  size_t mlen;
  ck_assert_int_eq(tcc_module_manifest_bytes(k, &mb, &mlen, &err), 0);
  Tcc__V1__Manifest *back = tcc__v1__manifest__unpack(NULL, mlen, mb);
  ck_assert_ptr_nonnull(back);
  ck_assert_str_eq(back->target, "cpu:x86-64-v2");
  tcc__v1__manifest__free_unpacked(back, NULL);
  tcc_free(mb);
  tcc_module_unload(k);
}
END_TEST

START_TEST(digest_mismatch_refused_before_dlopen) {
  size_t len;
  uint8_t *so = tu_build_kernel("TCC_MARK_DIGEST", NULL, &len);
  char hex[TCC_SHA256_HEX], wrong[TCC_SHA256_HEX];
  tt_sha256_hex(so, len, hex);
  memcpy(wrong, hex, sizeof hex);
  wrong[10] = wrong[10] == '0' ? '1' : '0';
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry", 1);
  unsetenv("TCC_MARK_DIGEST");

  tcc_module *k = (tcc_module *)0x1;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_module_load(so, len, wrong, &tm.m, &k, &err), TCC_E_DATA_LOSS);
  ck_assert_ptr_null(k);
  char want[256];
  snprintf(want, sizeof want, "artifact digest mismatch: expected %s got %s", wrong, hex);
  ck_assert_str_eq(err.msg, want);

  /* One flipped byte in the artifact, with the right digest of the original. */
  so[len / 2] ^= 0x40;
  ck_assert_int_eq(tcc_module_load(so, len, hex, &tm.m, &k, &err), TCC_E_DATA_LOSS);
  ck_assert_ptr_null(k);
  ck_assert_ptr_nonnull(strstr(err.msg, "artifact digest mismatch: expected"));

  /* Not a digest at all. */
  ck_assert_int_eq(tcc_module_load(so, len, "abc", &tm.m, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(getenv("TCC_MARK_DIGEST")); /* never dlopen'ed */
  free(so);
}
END_TEST

START_TEST(wrong_entry_symbol_refused) {
  size_t len;
  uint8_t *so = tu_build_kernel("TCC_MARK_ENTRY", NULL, &len);
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(so, len, hex);
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry_nope", 1);
  tcc_module *k = (tcc_module *)0x1;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_module_load(so, len, hex, &tm.m, &k, &err), TCC_E_NOT_FOUND);
  ck_assert_ptr_null(k);
  ck_assert_ptr_nonnull(strstr(err.msg, "'tcc_entry_nope'"));

  /* An empty entry means the documented default, tcc_entry. */
  tu_manifest_init(&tm, "", 1);
  ck_assert_msg(tcc_module_load(so, len, hex, &tm.m, &k, &err) == 0, "%s", err.msg);
  tu_run_and_check(k, 0);
  tcc_module_unload(k);

  /* An entry that reports failure: the run fails with its code. */
  tu_manifest_init(&tm, "tcc_entry_fails", 1);
  ck_assert_int_eq(tcc_module_load(so, len, hex, &tm.m, &k, &err), 0);
  float x[TU_N] = {0}, y[TU_N] = {0}, o[TU_N];
  const void *ins[] = {x, y};
  void *outs[] = {o};
  ck_assert_int_eq(tcc_module_run(k, ins, outs, NULL, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "returned 7"));
  tcc_module_unload(k);
  free(so);
}
END_TEST

START_TEST(abi_version_mismatch_refused) {
  size_t len;
  uint8_t *so = tu_build_kernel("TCC_MARK_ABI", NULL, &len);
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(so, len, hex);
  unsetenv("TCC_MARK_ABI");
  unsigned versions[] = {0, 2, 99};
  for (int i = 0; i < 3; i++) {
    tu_manifest tm;
    tu_manifest_init(&tm, "tcc_entry", versions[i]);
    tcc_module *k = (tcc_module *)0x1;
    tcc_error err = {0};
    ck_assert_int_eq(tcc_module_load(so, len, hex, &tm.m, &k, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_ptr_null(k);
    ck_assert_ptr_nonnull(strstr(err.msg, "ABI version"));
  }
  ck_assert_ptr_null(getenv("TCC_MARK_ABI"));
  free(so);
}
END_TEST

START_TEST(not_a_shared_object_refused) {
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry", 1);
  uint8_t junk[200];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)tt_rand();
  junk[0] = 'X';
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(junk, sizeof junk, hex);
  tcc_module *k = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_module_load(junk, sizeof junk, hex, &tm.m, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "not an ELF"));

  /* An ELF for the CUDA machine (a cubin): not loadable here. */
  memcpy(junk, "\x7f" "ELF", 4);
  junk[18] = 190;
  junk[19] = 0;
  tt_sha256_hex(junk, sizeof junk, hex);
  ck_assert_int_eq(tcc_module_load(junk, sizeof junk, hex, &tm.m, &k, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "cubin"));

  /* An ELF header but garbage after it: dlopen refuses, we report it. */
  junk[18] = 62; /* EM_X86_64 */
  tt_sha256_hex(junk, sizeof junk, hex);
  ck_assert_int_eq(tcc_module_load(junk, sizeof junk, hex, &tm.m, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(err.msg, "dlopen"));
  ck_assert_ptr_null(k);
}
END_TEST

START_TEST(distinct_kernels_never_confused) {
  /* glibc matches loaded objects by path name: /proc/self/fd/N must
   * never hand back a previously loaded kernel. */
  size_t la, lb;
  uint8_t *a = tu_build_kernel("TCC_MARK_A", NULL, &la);
  uint8_t *b = tu_build_kernel("TCC_MARK_B", "-DDOUBLE_IT", &lb);
  char ha[TCC_SHA256_HEX], hb[TCC_SHA256_HEX];
  tt_sha256_hex(a, la, ha);
  tt_sha256_hex(b, lb, hb);
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry", 1);
  tcc_error err = {0};
  for (int round = 0; round < 5; round++) {
    tcc_module *ka, *kb;
    ck_assert_int_eq(tcc_module_load(a, la, ha, &tm.m, &ka, &err), 0);
    tcc_module_unload(ka); /* frees its descriptor number for the next load */
    ck_assert_int_eq(tcc_module_load(b, lb, hb, &tm.m, &kb, &err), 0);
    tu_run_and_check(kb, 1);
    ck_assert_int_eq(tcc_module_load(a, la, ha, &tm.m, &ka, &err), 0);
    tu_run_and_check(ka, 0);
    tu_run_and_check(kb, 1);
    tcc_module_unload(kb);
    tcc_module_unload(ka);
  }
  free(a);
  free(b);
}
END_TEST

START_TEST(bytes_api_and_workspace) {
  size_t len;
  uint8_t *so = tu_build_kernel("TCC_MARK_BYTES", NULL, &len);
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(so, len, hex);
  tu_manifest tm;
  tu_manifest_init(&tm, "tcc_entry", 1);
  tm.m.workspace_bytes = 64;
  size_t mlen = tcc__v1__manifest__get_packed_size(&tm.m);
  uint8_t *mb = malloc(mlen);
  tcc__v1__manifest__pack(&tm.m, mb);

  tcc_error *err = tcc_error_new();
  tcc_module *k = NULL;
  ck_assert_int_eq(tcc_module_load_bytes(so, len, hex, (const uint8_t *)"\xff\xff", 2, &k, err),
                   TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_error_code(err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tcc_error_message(err), "Manifest"));
  ck_assert_int_eq(tcc_module_load_bytes(so, len, hex, mb, mlen, &k, err), 0);
  float x[TU_N] = {0}, y[TU_N] = {0}, o[TU_N];
  const void *ins[] = {x, y};
  void *outs[] = {o};
  ck_assert_int_eq(tcc_module_run(k, ins, outs, NULL, err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tcc_error_message(err), "workspace of 64 bytes"));
  char ws[64];
  ck_assert_int_eq(tcc_module_run(k, ins, outs, ws, err), 0);
  ck_assert(fabsf(o[0] - 1.0f) < 1e-6f); /* sin(0) + cos(0) */
  tcc_module_unload(k);
  tcc_error_free(err);
  free(mb);
  free(so);
  ck_assert_str_eq(tcc_client_version(), TCC_VERSION);
}
END_TEST

static Suite *kernel_suite(void) {
  Suite *s = suite_create("kernel");
  TCase *tc = tcase_create("load");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, load_run_unload);
  tcase_add_test(tc, digest_mismatch_refused_before_dlopen);
  tcase_add_test(tc, wrong_entry_symbol_refused);
  tcase_add_test(tc, abi_version_mismatch_refused);
  tcase_add_test(tc, not_a_shared_object_refused);
  tcase_add_test(tc, distinct_kernels_never_confused);
  tcase_add_test(tc, bytes_api_and_workspace);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  tt_seed("test_kernel");
  int rc = tt_run_suite(kernel_suite(), 0);
  rmdir(tu_tmpdir());
  return rc;
}
