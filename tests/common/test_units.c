/*
 * test_units.c — the byte-size and duration grammars (common/tcc_units.h)
 * that tccd's flags and tcctl's options share.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
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

START_TEST(durations_parse) {
  static const struct {
    const char *s;
    int64_t want;
  } ok[] = {{"0", 0}, {"3600", 3600}, {"90s", 90}, {"90m", 5400}, {"12h", 43200}, {"30d", 2592000}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int64_t v = -1;
    ck_assert_msg(tcc_parse_seconds(ok[i].s, &v) == 0, "'%s' refused", ok[i].s);
    ck_assert_msg(v == ok[i].want, "'%s' -> %lld, want %lld", ok[i].s, (long long)v, (long long)ok[i].want);
  }
  int64_t n = (int64_t)tt_rand_range(0, 1000000);
  char buf[32];
  snprintf(buf, sizeof buf, "%lldh", (long long)n);
  int64_t v = -1;
  ck_assert_int_eq(tcc_parse_seconds(buf, &v), 0);
  ck_assert_int_eq(v, n * 3600);
}
END_TEST

START_TEST(non_durations_are_refused) {
  static const char *const bad[] = {"", "h", "-1", "+1", "1.5h", "1w", "1hh", "1 h", " 1", "9223372036854775807d"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t v = 42;
    ck_assert_msg(tcc_parse_seconds(bad[i], &v) == -1, "'%s' accepted as %lld", bad[i], (long long)v);
    ck_assert_int_eq(v, 42);
  }
  ck_assert_int_eq(tcc_parse_seconds(NULL, NULL), -1);
}
END_TEST

int main(void) {
  return tt_run_tests("units", 0, 0,
                      (const TTest *[]){sizes_parse, non_sizes_are_refused, durations_parse,
                                        non_durations_are_refused, NULL});
}
