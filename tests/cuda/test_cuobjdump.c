/*
 * test_cuobjdump.c — NVIDIA's own tool reads what libtccnvrtc writes:
 * `cuobjdump -elf` names the arch (sm=80, sm=90, sm=90a) and
 * `cuobjdump -symbols` lists every kernel as an entry (STO_ENTRY).
 * $TCC_CUOBJDUMP names the tool (meson finds it in .deps/cuda or the
 * toolkit). Skips (exit 77) without NVRTC or cuobjdump.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcc_nvrtc.h"
#include "tcctest.h"

static char *dir;

/* Builds src for arch, writes the cubin and checks cuobjdump's view. */
static void check_arch(const char *src, const char *arch, const char *const *names, size_t n) {
  tcc_nvrtc_result r;
  tcc_error err = {0};
  ck_assert_msg(tcc_nvrtc_build(src, arch, names, &r, &err) == 0, "%s: %s", arch, err.msg);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s-%s.cubin", dir, names[0], arch);
  ck_assert_int_eq(tt_write_file(path, r.cubin, r.cubin_size), 0);

  char *elf = tt_cuobjdump_run("-elf", path);
  char want[32];
  snprintf(want, sizeof want, "sm=%s,", arch + 3); /* "sm=90a," */
  ck_assert_msg(strstr(elf, want), "cuobjdump -elf of %s lacks '%s':\n%.600s", arch, want, elf);
  free(elf);

  char *syms = tt_cuobjdump_run("-symbols", path);
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
    syms = tt_cuobjdump_run("-symbols", path); /* strtok consumed it */
  }
  free(syms);
  unlink(path);
  printf("  %s: cuobjdump sees %s and %zu entr%s\n", arch, want, n, n == 1 ? "y" : "ies");
  tcc_nvrtc_result_free(&r);
}

START_TEST(cuobjdump_lists_the_kernels) {
  const char *pw[] = {TT_CUDA_POINTWISE_NAME, NULL};
  const char *rd[] = {TT_CUDA_REDUCE_NAMES, NULL};
  const char *tp[] = {"scale<256>", NULL};
  const char *archs[] = {"sm_80", "sm_90", "sm_90a"};
  for (size_t a = 0; a < 3; a++) {
    check_arch("#define N 4096\n" TT_CUDA_POINTWISE_SRC, archs[a], pw, 1);
    check_arch("#define R 3\n#define C 1000\n" TT_CUDA_REDUCE_SRC, archs[a], rd, 2);
  }
  check_arch(TT_CUDA_TEMPLATE_SRC, "sm_90", tp, 1);
}
END_TEST

int main(void) {
  tt_need_nvrtc();
  const char *env = getenv("TCC_CUOBJDUMP");
  if (!tt_cuobjdump()) tt_skip("no cuobjdump (run scripts/setup-cuda; TCC_CUOBJDUMP=%s)", env ? env : "");
  if (!(dir = tt_tmpdir("cuobjdump"))) tt_skip("mkdtemp failed");
  int rc = tt_run_tests("cuobjdump", 300, 0, (const TTest *[]){cuobjdump_lists_the_kernels, NULL});
  rmdir(dir);
  free(dir);
  return rc;
}
