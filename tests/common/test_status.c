/*
 * test_status.c — request ids (common/tcc_status.h): which client-sent
 * x-request-id values tccd keeps (the rest it replaces), and that a
 * tcc_error forgets its request id when it is set again.
 */
#include <check.h>
#include <string.h>

#include "tcc_status.h"
#include "tcctest.h"

START_TEST(request_ids_sane_or_not) {
  static const char *const ok[] = {"a", "job-7.rank_3", "3f2a9c0e00000001", "ABC.def_-0"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    ck_assert_msg(tcc_request_id_valid(ok[i], strlen(ok[i])), "'%s' refused", ok[i]);
  static const char *const bad[] = {"", "has space", "new\nline", "tab\t", "esc\x1b[31m", "quote\"",
                                    "semi;colon", "caf\xc3\xa9", "\xff", "a/b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(!tcc_request_id_valid(bad[i], strlen(bad[i])), "'%s' accepted", bad[i]);
  char nul[] = {'a', '\0', 'b'};
  ck_assert(!tcc_request_id_valid(nul, sizeof nul));
  char longest[TCC_REQUEST_ID_MAX + 1];
  memset(longest, 'x', sizeof longest);
  ck_assert(tcc_request_id_valid(longest, TCC_REQUEST_ID_MAX));
  ck_assert(!tcc_request_id_valid(longest, TCC_REQUEST_ID_MAX + 1));
}
END_TEST

START_TEST(error_set_clears_the_request_id) {
  tcc_error err;
  memset(&err, 'z', sizeof err);
  tcc_error_set(&err, TCC_E_INTERNAL, "boom");
  ck_assert_str_eq(err.request_id, "");
  strcpy(err.request_id, "abc");
  tcc_error_prefix(&err, "ctx");
  ck_assert_str_eq(err.msg, "ctx: boom");
  ck_assert_str_eq(err.request_id, "abc");
  tcc_error_clear(&err);
  ck_assert_str_eq(err.request_id, "");
}
END_TEST

int main(void) {
  return tt_run_tests("status", 0, 0, (const TTest *[]){request_ids_sane_or_not, error_set_clears_the_request_id, NULL});
}
