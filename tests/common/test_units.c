/*
 * test_units.c — the one byte-size grammar (common/tcc_units.h) that
 * tccd's flags and tcctl's options share.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "tcc_units.h"
#include "tcctest.h"

START_TEST(sizes_parse) {
  static const struct {
    const char *s;
    int64_t want;
  } ok[] = {
      {"0", 0}, {"4096", 4096}, {"7B", 7}, {"1k", 1024}, {"1K", 1024}, {"512M", 512LL << 20},
      {"1.5G", 3LL << 29}, {"10G", 10LL << 30}, {"10Gi", 10LL << 30}, {"10GiB", 10LL << 30},
      {"10GB", 10LL << 30}, {"2T", 2LL << 40}, {"1mib", 1 << 20},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int64_t v = -1;
    ck_assert_msg(tcc_parse_bytes(ok[i].s, &v) == 0, "'%s' refused", ok[i].s);
    ck_assert_msg(v == ok[i].want, "'%s' -> %lld, want %lld", ok[i].s, (long long)v, (long long)ok[i].want);
  }
}
END_TEST

START_TEST(non_sizes_are_refused) {
  static const char *const bad[] = {"", "G", "-1", "+1", "1Q", "1GG", "1iB", "1 G", "nan", "1e30", "10Gx",
                                    "9223372036854775807T"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t v = 42;
    ck_assert_msg(tcc_parse_bytes(bad[i], &v) == -1, "'%s' accepted as %lld", bad[i], (long long)v);
    ck_assert_int_eq(v, 42);
  }
  ck_assert_int_eq(tcc_parse_bytes(NULL, NULL), -1);
}
END_TEST

int main(void) {
  return tt_run_tests("units", 0, 0, (const TTest *[]){sizes_parse, non_sizes_are_refused, NULL});
}
