/*
 * test_cuobjdump.c — NVIDIA's own tool reads what libtccnvrtc writes:
 * `cuobjdump -elf` names the arch (sm=80, sm=90, sm=90a) and
 * `cuobjdump -symbols` lists every kernel as an entry (STO_ENTRY).
 * $CUOBJDUMP names the tool (meson finds it in .deps/cuda or the
 * toolkit). Skips (exit 77) without NVRTC or cuobjdump.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cutest.h"
#include "nvrtc.h"

static const char *cuobjdump;
static char dir[] = "/tmp/tcc-cuobjdump-XXXXXX";

/* Runs `cuobjdump FLAG file` and returns its stdout (malloc'd). */
static char *run(const char *flag, const char *file) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' %s '%s' 2>&1", cuobjdump, flag, file);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  ck_assert_ptr_nonnull(out);
  size_t n;
  while ((n = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (len + 1 == cap) {
      cap *= 2;
      out = realloc(out, cap);
      ck_assert_ptr_nonnull(out);
    }
  }
  out[len] = '\0';
  int status = pclose(p);
  ck_assert_msg(status == 0, "%s failed (%d): %s", cmd, status, out);
  return out;
}

/* Builds src for arch, writes the cubin and checks cuobjdump's view. */
static void check_arch(const char *src, const char *arch, const char *const *names, size_t n) {
  tcc_nvrtc_result r;
  tcc_error err = {0};
  ck_assert_msg(tcc_nvrtc_build(src, arch, names, &r, &err) == 0, "%s: %s", arch, err.msg);
  char path[128];
  snprintf(path, sizeof path, "%s/%s-%s.cubin", dir, names[0], arch);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(r.cubin, 1, r.cubin_size, f), r.cubin_size);
  fclose(f);

  char *elf = run("-elf", path);
  char want[32];
  snprintf(want, sizeof want, "sm=%s,", arch + 3); /* "sm=90a," */
  ck_assert_msg(strstr(elf, want), "cuobjdump -elf of %s lacks '%s':\n%.600s", arch, want, elf);
  free(elf);

  char *syms = run("-symbols", path);
  for (size_t i = 0; i < n; i++) {
    int found = 0;
    for (char *line = strtok(syms, "\n"); line; line = strtok(NULL, "\n")) {
      size_t ll = strlen(line), nl = strlen(r.lowered_names[i]);
      if (strstr(line, "STT_FUNC") && strstr(line, "STO_ENTRY") && ll > nl &&
          !strcmp(line + ll - nl, r.lowered_names[i]) && line[ll - nl - 1] == ' ')
        found = 1;
    }
    ck_assert_msg(found, "cuobjdump -symbols of the %s cubin lists no entry %s", arch, r.lowered_names[i]);
    free(syms);
    syms = run("-symbols", path); /* strtok consumed it */
  }
  free(syms);
  unlink(path);
  printf("  %s: cuobjdump sees %s and %zu entr%s\n", arch, want, n, n == 1 ? "y" : "ies");
  tcc_nvrtc_result_free(&r);
}

START_TEST(cuobjdump_lists_the_kernels) {
  const char *pw[] = {CUTEST_POINTWISE_NAME, NULL};
  const char *rd[] = {CUTEST_REDUCE_NAMES, NULL};
  const char *tp[] = {"scale<256>", NULL};
  const char *archs[] = {"sm_80", "sm_90", "sm_90a"};
  for (size_t a = 0; a < 3; a++) {
    check_arch("#define N 4096\n" CUTEST_POINTWISE_SRC, archs[a], pw, 1);
    check_arch("#define R 3\n#define C 1000\n" CUTEST_REDUCE_SRC, archs[a], rd, 2);
  }
  check_arch(CUTEST_TEMPLATE_SRC, "sm_90", tp, 1);
}
END_TEST

int main(void) {
  tcc_error err = {0};
  if (tcc_nvrtc_available(&err) != 0) cutest_skip("%s", err.msg); /* "NVRTC not available: why" */
  cuobjdump = getenv("CUOBJDUMP");
  if (!cuobjdump || !*cuobjdump || access(cuobjdump, X_OK) != 0)
    cutest_skip("no cuobjdump (run scripts/setup-cuda; CUOBJDUMP=%s)", cuobjdump ? cuobjdump : "");
  if (!mkdtemp(dir)) cutest_skip("mkdtemp failed");
  Suite *s = suite_create("cuobjdump");
  TCase *tc = tcase_create("cuobjdump");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, cuobjdump_lists_the_kernels);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  rmdir(dir);
  return failed ? 1 : 0;
}
