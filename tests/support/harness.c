/* harness.c — running a Check suite, skipping, the seed (see tcctest.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tcctest.h"

void tt_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("SKIP: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  exit(TT_SKIP);
}

int tt_run_suite(Suite *s, int nofork) {
  SRunner *sr = srunner_create(s);
  if (nofork) srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int tt_run_tests(const char *name, double timeout_s, int nofork, const TTest *const *tests) {
  Suite *s = suite_create(name);
  TCase *tc = tcase_create(name);
  if (timeout_s > 0) tcase_set_timeout(tc, timeout_s);
  for (size_t i = 0; tests[i]; i++) tcase_add_test(tc, tests[i]);
  suite_add_tcase(s, tc);
  return tt_run_suite(s, nofork);
}

/* ------------------------------------------------------------ the seed */

static uint64_t seed, state;
static int seeded;

uint64_t tt_seed(const char *who) {
  if (!seeded) {
    const char *env = getenv("TCC_TEST_SEED");
    seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)(uint32_t)(time(NULL) ^ ((unsigned)getpid() << 16));
    state = seed;
    seeded = 1;
    fprintf(stderr, "%s: seed %llu (TCC_TEST_SEED=%llu replays it)\n", who, (unsigned long long)seed,
            (unsigned long long)seed);
  }
  return seed;
}

uint64_t tt_rand(void) { /* splitmix64 */
  if (!seeded) tt_seed("test");
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t tt_rand_range(uint64_t lo, uint64_t hi) {
  uint64_t span = hi - lo + 1;
  return span ? lo + tt_rand() % span : tt_rand();
}

double tt_uniform(double lo, double hi) { return lo + (hi - lo) * ((double)(tt_rand() >> 11) / 9007199254740992.0); }

void tt_rand_bytes(void *out, size_t n) {
  uint8_t *p = out;
  while (n) {
    uint64_t r = tt_rand();
    size_t k = n < sizeof r ? n : sizeof r;
    memcpy(p, &r, k);
    p += k;
    n -= k;
  }
}

void tt_fill_float(float *v, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) v[i] = (float)tt_uniform(lo, hi);
}
