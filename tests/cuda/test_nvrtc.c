/*
 * test_nvrtc.c — libtccnvrtc on a machine without a GPU: CUDA C -> cubin
 * + PTX for sm_80, sm_90, sm_90a (and the other brief archs NVRTC knows),
 * lowered names, NVRTC's log on a syntax error, arch checks, the identity
 * string, options, concurrent builds, and the cubin ELF readers.
 * Skips (exit 77) when NVRTC is not available.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcc_nvrtc.h"
#include "tcctest.h"

static const char *const POINTWISE = "#define N 1000\n" TT_CUDA_POINTWISE_SRC;
static const char *const REDUCE = "#define R 7\n#define C 300\n" TT_CUDA_REDUCE_SRC;

/* Every arch of the brief that this NVRTC builds (sm_80, sm_90, sm_90a
 * are required: the test fails when NVRTC lacks them). */
static const char *const ARCHS[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"};
static const int ARCH_SM[] = {80, 86, 89, 90, 90, 100, 120};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

static int arch_required(const char *a) { return !strcmp(a, "sm_80") || !strcmp(a, "sm_90") || !strcmp(a, "sm_90a"); }

/* Checks one successful build: cubin, SM, entries, PTX, names. */
static void check_build(const tcc_nvrtc_result *r, const char *arch, int sm, const char *const *names, size_t n) {
  ck_assert_ptr_nonnull(r->cubin);
  ck_assert_uint_gt(r->cubin_size, 64);
  ck_assert_mem_eq(r->cubin, "\x7f" "ELF", 4);
  ck_assert_int_eq(r->cubin[18], 190); /* EM_CUDA */
  ck_assert_int_eq(tcc_cubin_sm(r->cubin, r->cubin_size), sm);
  ck_assert_str_eq(r->arch, arch);
  ck_assert_ptr_nonnull(r->ptx);
  ck_assert_uint_eq(strlen(r->ptx), r->ptx_size);
  char target[32];
  snprintf(target, sizeof target, ".target %s", arch);
  ck_assert_msg(strstr(r->ptx, target), "PTX lacks '%s'", target);
  ck_assert_uint_eq(r->n_kernels, n);
  for (size_t i = 0; i < n; i++) {
    ck_assert_str_eq(r->lowered_names[i], names[i]); /* extern "C": the name itself */
    ck_assert_int_eq(tcc_cubin_has_entry(r->cubin, r->cubin_size, names[i]), 1);
    char entry[128];
    snprintf(entry, sizeof entry, ".entry %s(", names[i]);
    ck_assert_msg(strstr(r->ptx, entry), "PTX lacks '%s'", entry);
  }
  ck_assert_int_eq(tcc_cubin_has_entry(r->cubin, r->cubin_size, "no_such_kernel"), 0);
  ck_assert_ptr_nonnull(r->log);
  ck_assert(r->compile_ms > 0);
}

START_TEST(builds_pointwise_and_reduction_for_each_arch) {
  char archs[512];
  tcc_error err = {0};
  ck_assert_int_eq(tcc_nvrtc_archs(archs, sizeof archs, &err), 0);
  int built = 0;
  for (size_t a = 0; a < N_ARCHS; a++) {
    if (tcc_nvrtc_check_arch(ARCHS[a], &err) != 0) {
      ck_assert_msg(!arch_required(ARCHS[a]), "NVRTC (%s) cannot build %s: %s", archs, ARCHS[a], err.msg);
      printf("  %s: not built by this NVRTC, skipped\n", ARCHS[a]);
      continue;
    }
    tcc_nvrtc_result r;
    const char *pw[] = {TT_CUDA_POINTWISE_NAME, NULL};
    ck_assert_msg(tcc_nvrtc_build(POINTWISE, ARCHS[a], pw, &r, &err) == 0, "%s: %s", ARCHS[a], err.msg);
    check_build(&r, ARCHS[a], ARCH_SM[a], pw, 1);
    printf("  %s pointwise: cubin %zu bytes, PTX %zu bytes, %.1f ms\n", ARCHS[a], r.cubin_size, r.ptx_size,
           r.compile_ms);
    tcc_nvrtc_result_free(&r);
    ck_assert_ptr_null(r.cubin);

    const char *rd[] = {TT_CUDA_REDUCE_NAMES, NULL};
    ck_assert_msg(tcc_nvrtc_build(REDUCE, ARCHS[a], rd, &r, &err) == 0, "%s: %s", ARCHS[a], err.msg);
    check_build(&r, ARCHS[a], ARCH_SM[a], rd, 2);
    ck_assert_msg(strstr(r.ptx, "shfl.sync.down"), "no warp shuffle in the reduction's PTX");
    printf("  %s reduction: cubin %zu bytes, PTX %zu bytes, %.1f ms\n", ARCHS[a], r.cubin_size, r.ptx_size,
           r.compile_ms);
    tcc_nvrtc_result_free(&r);
    built++;
  }
  ck_assert_int_ge(built, 3);
}
END_TEST

START_TEST(template_kernels_get_lowered_names) {
  tcc_nvrtc_result r;
  tcc_error err = {0};
  const char *names[] = {"scale<128>", "scale<64>", NULL};
  ck_assert_msg(tcc_nvrtc_build(TT_CUDA_TEMPLATE_SRC, "sm_90", names, &r, &err) == 0, "%s", err.msg);
  ck_assert_uint_eq(r.n_kernels, 2);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(!strncmp(r.lowered_names[i], "_Z", 2), "not mangled: %s", r.lowered_names[i]);
    ck_assert_ptr_nonnull(strstr(r.lowered_names[i], "scale"));
    ck_assert_int_eq(tcc_cubin_has_entry(r.cubin, r.cubin_size, r.lowered_names[i]), 1);
  }
  ck_assert_str_ne(r.lowered_names[0], r.lowered_names[1]);
  ck_assert_int_eq(tcc_cubin_has_entry(r.cubin, r.cubin_size, "scale<128>"), 0); /* the unmangled form is not a symbol */
  tcc_nvrtc_result_free(&r);
}
END_TEST

START_TEST(a_name_that_is_not_a_kernel_is_refused) {
  tcc_nvrtc_result r;
  tcc_error err = {0};
  const char *names[] = {"&not_a_kernel", NULL}; /* a __device__ variable's name expression */
  ck_assert_int_eq(tcc_nvrtc_build(TT_CUDA_TEMPLATE_SRC, "sm_80", names, &r, &err), TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "not_a_kernel") && strstr(err.msg, "not a __global__"), "%s", err.msg);
  ck_assert_ptr_null(r.cubin);
  ck_assert_ptr_null(r.lowered_names);

  const char *missing[] = {"k9_missing", NULL};
  ck_assert_int_eq(tcc_nvrtc_build(POINTWISE, "sm_80", missing, &r, &err), TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "k9_missing"), "%s", err.msg);
}
END_TEST

START_TEST(syntax_error_reports_the_nvrtc_log) {
  const char *src = "extern \"C\" __global__ void broken(float *x) {\n"
                    "  x[0] = undeclared_thing + ;\n"
                    "}\n";
  tcc_nvrtc_result r;
  tcc_error err = {0};
  const char *names[] = {"broken", NULL};
  tcc_nvrtc_options o = {.program_name = "kernel_under_test.cu"};
  ck_assert_int_eq(tcc_nvrtc_build_ex(src, "sm_90", names, &o, &r, &err), TCC_E_INTERNAL);
  ck_assert_int_eq(err.code, TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "NVRTC_ERROR_COMPILATION"), "%s", err.msg);
  ck_assert_msg(strstr(err.msg, "kernel_under_test.cu(2)"), "no file(line) in: %s", err.msg);
  ck_assert_msg(strstr(err.msg, "undeclared_thing"), "no identifier in: %s", err.msg);
  ck_assert_msg(strstr(err.msg, "sm_90"), "%s", err.msg);
  ck_assert_ptr_null(r.cubin);
  ck_assert_ptr_null(r.ptx);
}
END_TEST

START_TEST(unknown_archs_are_rejected) {
  const char *bad[] = {"sm_79", "sm_30", "sm_9", "sm_", "compute_90", "sm_80a", "sm_90f", "sm_90x", "sm_900",
                       "SM_90", "", "cuda:sm_90", "sm_90 ", "sm_-9"};
  tcc_error err = {0};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(tcc_nvrtc_check_arch(bad[i], &err) == TCC_E_INVALID_ARGUMENT, "'%s' accepted", bad[i]);
    ck_assert_msg(strstr(err.msg, "unknown CUDA arch"), "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "sm_90"), "the message should list what is known: %s", err.msg);
    tcc_nvrtc_result r;
    ck_assert_int_eq(tcc_nvrtc_build(POINTWISE, bad[i], NULL, &r, &err), TCC_E_INVALID_ARGUMENT);
    ck_assert_ptr_null(r.cubin);
  }
  ck_assert_int_eq(tcc_nvrtc_check_arch(NULL, &err), TCC_E_INVALID_ARGUMENT);
  const char *good[] = {"sm_80", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_120"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(tcc_nvrtc_check_arch(good[i], &err) == 0, "%s: %s", good[i], err.msg);
}
END_TEST

START_TEST(identity_names_version_and_archs) {
  char id[600], archs[512];
  tcc_error err = {0};
  int major = 0, minor = -1;
  ck_assert_int_eq(tcc_nvrtc_version(&major, &minor, &err), 0);
  ck_assert_int_ge(major, 12);
  ck_assert_int_ge(minor, 0);
  ck_assert_int_eq(tcc_nvrtc_identity(id, sizeof id, &err), 0);
  char want[32];
  snprintf(want, sizeof want, "nvrtc %d.%d (", major, minor);
  ck_assert_msg(!strncmp(id, want, strlen(want)), "%s", id);
  ck_assert_int_eq(tcc_nvrtc_archs(archs, sizeof archs, &err), 0);
  ck_assert_ptr_nonnull(strstr(id, archs));
  ck_assert_ptr_nonnull(strstr(archs, "sm_80"));
  ck_assert_ptr_nonnull(strstr(archs, "sm_90"));
  printf("  identity: %s\n", id);
  char small[8];
  ck_assert_int_eq(tcc_nvrtc_identity(small, sizeof small, &err), TCC_E_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(tcc_nvrtc_archs(small, sizeof small, &err), TCC_E_RESOURCE_EXHAUSTED);
}
END_TEST

START_TEST(options_are_passed_and_checked) {
  tcc_nvrtc_result r;
  tcc_error err = {0};
  const char *pw[] = {TT_CUDA_POINTWISE_NAME, NULL};
  const char *extra[] = {"-DUNUSED_MACRO=1", NULL};
  tcc_nvrtc_options o = {.fast_math = 1, .line_info = 1, .max_registers = 32, .extra = extra};
  ck_assert_msg(tcc_nvrtc_build_ex(POINTWISE, "sm_80", pw, &o, &r, &err) == 0, "%s", err.msg);
  ck_assert_ptr_nonnull(strstr(r.ptx, ".loc")); /* -lineinfo */
  tcc_nvrtc_result_free(&r);
  tcc_nvrtc_result_free(&r); /* twice is fine */

  const char *bogus[] = {"--no-such-option", NULL};
  tcc_nvrtc_options b = {.extra = bogus};
  ck_assert_int_eq(tcc_nvrtc_build_ex(POINTWISE, "sm_80", pw, &b, &r, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "NVRTC_ERROR_INVALID_OPTION"), "%s", err.msg);
  ck_assert_int_eq(tcc_nvrtc_build(NULL, "sm_80", pw, &r, &err), TCC_E_INVALID_ARGUMENT);
}
END_TEST

typedef struct job {
  const char *src, *arch, *name;
  int rc;
  size_t cubin_size;
  char msg[256];
} job;

static void *build_job(void *p) {
  job *j = p;
  const char *names[] = {j->name, NULL};
  tcc_nvrtc_result r;
  tcc_error err = {0};
  j->rc = tcc_nvrtc_build(j->src, j->arch, names, &r, &err);
  j->cubin_size = r.cubin_size;
  snprintf(j->msg, sizeof j->msg, "%.200s", err.msg);
  if (!j->rc && tcc_cubin_has_entry(r.cubin, r.cubin_size, j->name) != 1) j->rc = -1000;
  tcc_nvrtc_result_free(&r);
  return NULL;
}

START_TEST(concurrent_builds) {
  job jobs[4] = {
      {POINTWISE, "sm_80", TT_CUDA_POINTWISE_NAME, 0, 0, ""},
      {POINTWISE, "sm_90", TT_CUDA_POINTWISE_NAME, 0, 0, ""},
      {REDUCE, "sm_90a", "k0_row_sumsq", 0, 0, ""},
      {REDUCE, "sm_80", "k1_sqrt", 0, 0, ""},
  };
  pthread_t t[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, build_job, &jobs[i]), 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(jobs[i].rc == 0, "job %d (%s): %d %s", i, jobs[i].arch, jobs[i].rc, jobs[i].msg);
    ck_assert_uint_gt(jobs[i].cubin_size, 0);
  }
}
END_TEST

START_TEST(cubin_readers_refuse_other_bytes) {
  uint8_t junk[128];
  tt_rand_bytes(junk, sizeof junk);
  junk[0] = 'X';
  ck_assert_int_eq(tcc_cubin_sm(junk, sizeof junk), -1);
  ck_assert_int_eq(tcc_cubin_has_entry(junk, sizeof junk, "k"), -1);
  memcpy(junk, "\x7f" "ELF\x02\x01", 6);
  junk[18] = 62; /* x86-64 */
  junk[19] = 0;
  ck_assert_int_eq(tcc_cubin_sm(junk, sizeof junk), -1);
  junk[18] = 190;
  /* A CUDA ELF header whose section table points outside the bytes. */
  memset(junk + 0x28, 0xff, 8);
  ck_assert_int_eq(tcc_cubin_has_entry(junk, sizeof junk, "k"), -1);
  ck_assert_int_eq(tcc_cubin_sm(NULL, 0), -1);

  /* A real cubin cut short: never read past the end. */
  tcc_nvrtc_result r;
  tcc_error err = {0};
  const char *pw[] = {TT_CUDA_POINTWISE_NAME, NULL};
  ck_assert_int_eq(tcc_nvrtc_build(POINTWISE, "sm_90", pw, &r, &err), 0);
  uint64_t shoff = 0;
  for (int i = 7; i >= 0; i--) shoff = shoff << 8 | r.cubin[0x28 + i];
  size_t sh_end = (size_t)shoff + 64 * (size_t)(r.cubin[0x3c] | r.cubin[0x3d] << 8);
  for (size_t cut = 0; cut < r.cubin_size; cut += 37) {
    int got = tcc_cubin_has_entry(r.cubin, cut, TT_CUDA_POINTWISE_NAME);
    if (cut < 64 || cut < sh_end) ck_assert_int_eq(got, -1); /* header or section table cut */
    ck_assert_int_ne(tcc_cubin_has_entry(r.cubin, cut, "k1_not_there"), 1);
  }
  ck_assert_int_eq(tcc_cubin_has_entry(r.cubin, r.cubin_size, TT_CUDA_POINTWISE_NAME), 1);
  tcc_nvrtc_result_free(&r);
}
END_TEST

/* opts.timeout_ms: a compile over its deadline is abandoned
 * (DEADLINE_EXCEEDED) and finishes in the background; one within it
 * returns as without a deadline, errors and NVRTC's log included. */
START_TEST(timeouts_abandon_the_compile) {
  const char *names[] = {TT_CUDA_POINTWISE_NAME, NULL};
  tcc_nvrtc_options o = {.timeout_ms = 1};
  tcc_nvrtc_result r;
  tcc_error err = {0};
  int rc = tcc_nvrtc_build_ex(POINTWISE, "sm_90", names, &o, &r, &err);
  ck_assert_int_eq(rc, TCC_E_DEADLINE_EXCEEDED);
  ck_assert_msg(strstr(err.msg, "nvrtc: compiling for sm_90 took longer than 1 ms (abandoned)"), "%s", err.msg);
  ck_assert_ptr_null(r.cubin);
  /* the abandoned compile ends on its own and frees what it made */
  for (int i = 0; i < 1200 && tcc_nvrtc_abandoned() > 0; i++) usleep(100 * 1000);
  ck_assert_int_eq(tcc_nvrtc_abandoned(), 0);
  o.timeout_ms = 120000;
  ck_assert_msg(tcc_nvrtc_build_ex(POINTWISE, "sm_90", names, &o, &r, &err) == 0, "%s", err.msg);
  check_build(&r, "sm_90", 90, names, 1);
  tcc_nvrtc_result_free(&r);
  rc = tcc_nvrtc_build_ex("extern \"C\" __global__ void k(float *p) { p[0] = undefined_thing; }\n", "sm_80", NULL,
                          &o, &r, &err);
  ck_assert_int_eq(rc, TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "undefined_thing"), "%s", err.msg);
}
END_TEST

int main(void) {
  tt_need_nvrtc();
  tt_seed("test_nvrtc");
  return tt_run_tests("nvrtc", 300, 0, (const TTest *[]){
      builds_pointwise_and_reduction_for_each_arch,
      template_kernels_get_lowered_names,
      a_name_that_is_not_a_kernel_is_refused,
      syntax_error_reports_the_nvrtc_log,
      unknown_archs_are_rejected,
      identity_names_version_and_archs,
      options_are_passed_and_checked,
      concurrent_builds,
      cubin_readers_refuse_other_bytes,
      timeouts_abandon_the_compile,
      NULL});
}
