/*
 * test_nvrtc_missing.c — with NVRTC missing (TCC_NVRTC_LIBRARY names a
 * file that does not exist, or the build has no CUDA), every call fails
 * with FAILED_PRECONDITION saying what was tried and how to get it; the
 * ELF readers, which need no NVRTC, still work.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "tcc_nvrtc.h"
#include "tcctest.h"

START_TEST(every_call_says_nvrtc_is_missing) {
  tcc_error err = {0};
  ck_assert_int_eq(tcc_nvrtc_available(&err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(!strncmp(err.msg, "NVRTC not available: ", 21), "%s", err.msg);
  const char *lib = getenv("TCC_NVRTC_LIBRARY");
  if (lib && *lib && !strstr(err.msg, "configured without CUDA"))
    ck_assert_msg(strstr(err.msg, lib), "the message should name %s: %s", lib, err.msg);
  ck_assert_msg(strstr(err.msg, "setup-cuda"), "the message should say how to get NVRTC: %s", err.msg);

  tcc_nvrtc_result r;
  const char *names[] = {"k", NULL};
  ck_assert_int_eq(tcc_nvrtc_build("extern \"C\" __global__ void k() {}", "sm_90", names, &r, &err),
                   TCC_E_FAILED_PRECONDITION);
  ck_assert_ptr_null(r.cubin);
  char buf[256];
  ck_assert_int_eq(tcc_nvrtc_identity(buf, sizeof buf, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_int_eq(tcc_nvrtc_archs(buf, sizeof buf, &err), TCC_E_FAILED_PRECONDITION);
  int major = 1, minor = 1;
  ck_assert_int_eq(tcc_nvrtc_version(&major, &minor, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_int_eq(tcc_nvrtc_check_arch("sm_90", &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_int_eq(tcc_cubin_sm((const uint8_t *)"nope", 4), -1);
}
END_TEST

int main(void) {
  return tt_run_tests("nvrtc-missing", 0, 0, (const TTest *[]){every_call_says_nvrtc_is_missing, NULL});
}
