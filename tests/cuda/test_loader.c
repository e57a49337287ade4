/*
 * test_loader.c — the CUDA loader where no launch can happen: the clear
 * "no driver" error, the checks made before the driver is asked (not a
 * cubin, plan and manifest validation, arch agreement), and the generic
 * tcc_module_load's dispatch of CUDA artifacts.
 *
 * Two registrations (tests/cuda/meson.build):
 *   TCC_TEST_NO_DRIVER=1 with TCC_CUDA_LIBRARY=/nonexistent/libcuda.so.1:
 *     the driver is missing everywhere, so every driver-facing call must
 *     fail with "... not found: no NVIDIA driver on this machine";
 *   the system's libcuda.so.1: where dlopen finds none (this machine),
 *     the same message with "libcuda.so.1"; where there is a driver, the
 *     answer must be consistent with it.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc_runtime.h"
#include "tccclient.h"
#include "tcctest.h"

static int no_driver;          /* the driver is known to be missing */
static char driver_name[256];  /* what the loader dlopens */

static void assert_no_driver(const tcc_error *err) {
  char want[400];
  snprintf(want, sizeof want, "%s not found: no NVIDIA driver on this machine", driver_name);
  ck_assert_int_eq(err->code, TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err->msg, want), "expected '%s' in: %s", want, err->msg);
}

START_TEST(availability_is_reported_clearly) {
  tcc_error err = {0};
  int rc = tcc_rt_cuda_available(&err);
  if (no_driver) {
    ck_assert_int_eq(rc, TCC_E_FAILED_PRECONDITION);
    assert_no_driver(&err);
    int v = -1, n = -1;
    char arch[16];
    void *p = (void *)1, *s = (void *)1;
    ck_assert_int_eq(tcc_rt_cuda_driver_version(&v, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(tcc_rt_cuda_device_count(&n, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(tcc_rt_cuda_device_arch(0, arch, NULL, 0, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_int_eq(tcc_rt_cuda_malloc(0, 1024, &p, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_ptr_null(p);
    assert_no_driver(&err);
    ck_assert_int_eq(tcc_rt_cuda_stream_create(0, &s, &err), TCC_E_FAILED_PRECONDITION);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(tcc_rt_cuda_synchronize(0, NULL, &err), TCC_E_FAILED_PRECONDITION);
    printf("  no driver: %s\n", err.msg);
  } else if (rc == 0) {
    int n = 0, v = 0;
    char arch[16], name[128];
    ck_assert_int_eq(tcc_rt_cuda_device_count(&n, &err), 0);
    ck_assert_int_ge(n, 1);
    ck_assert_int_eq(tcc_rt_cuda_driver_version(&v, &err), 0);
    ck_assert_int_ge(v, 11000);
    ck_assert_int_eq(tcc_rt_cuda_device_arch(0, arch, name, sizeof name, &err), 0);
    ck_assert_msg(!strncmp(arch, "sm_", 3), "%s", arch);
    ck_assert_int_eq(tcc_rt_cuda_device_arch(n, arch, NULL, 0, &err), TCC_E_INVALID_ARGUMENT);
    printf("  driver %d, %d device(s), device 0: %s (%s)\n", v, n, name, arch);
  } else {
    ck_assert_int_eq(rc, TCC_E_FAILED_PRECONDITION);
    ck_assert_msg(strstr(err.msg, "cuInit failed") || strstr(err.msg, "no CUDA device"), "%s", err.msg);
    printf("  driver present, no usable device: %s\n", err.msg);
  }
}
END_TEST

START_TEST(cubins_are_checked_before_the_driver) {
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  tcc_rt_cuda_launch l = {.name = "k0", .grid = {1, 1, 1}, .block = {32, 1, 1}};
  tcc_rt_cuda_plan plan = {.arch = "sm_90", .launches = &l, .n_launches = 1, .n_inputs = 1, .n_outputs = 1};
  tcc_rt_cuda_kernel *k = (tcc_rt_cuda_kernel *)1;
  tcc_error err = {0};

  uint8_t so[256];
  memcpy(so, cubin, sizeof so);
  so[18] = 62; /* x86-64 */
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(so, sizeof so, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(k);
  ck_assert_msg(strstr(err.msg, "not a cubin"), "%s", err.msg);
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, 40, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);

  plan.arch = "sm_80";
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "says sm_80 but the cubin is for sm_90"), "%s", err.msg);
  plan.arch = "gfx90a";
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "gfx90a"), "%s", err.msg);
  plan.arch = "sm_90a";
  plan.n_launches = 0;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "no kernels"), "%s", err.msg);
  plan.n_launches = 1;
  l.name = "";
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "launch 1 of 1 has no kernel name"), "%s", err.msg);
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, NULL, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);

  if (no_driver) { /* a well-formed request reaches the driver, which is missing */
    l.name = "k0";
    plan.arch = NULL; /* read from the cubin */
    ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, "00", &plan, NULL, &k, &err),
                     TCC_E_FAILED_PRECONDITION);
    assert_no_driver(&err);
    ck_assert_ptr_null(k);
  }
}
END_TEST

/* A one-kernel CUDA manifest over test-owned storage. */
typedef struct tm_cuda {
  Tcc__V1__Manifest m;
  Tcc__V1__KernelInfo ki;
  Tcc__V1__KernelInfo *kis[1];
  int64_t grid[4], block[4];
  Tcc__V1__TensorMeta meta[2];
  Tcc__V1__TensorMeta *ins[1], *outs[1];
} tm_cuda;

static void tm_init(tm_cuda *t) {
  memset(t, 0, sizeof *t);
  tcc__v1__manifest__init(&t->m);
  tcc__v1__kernel_info__init(&t->ki);
  tcc__v1__tensor_meta__init(&t->meta[0]);
  tcc__v1__tensor_meta__init(&t->meta[1]);
  t->ins[0] = &t->meta[0];
  t->outs[0] = &t->meta[1];
  t->grid[0] = 40, t->block[0] = 256;
  t->ki.name = (char *)"k0_pointwise";
  t->ki.kind = (char *)"pointwise";
  t->ki.n_grid = 1, t->ki.grid = t->grid;
  t->ki.n_block = 1, t->ki.block = t->block;
  t->kis[0] = &t->ki;
  t->m.abi_version = 1;
  t->m.target = (char *)"cuda:sm_90";
  t->m.n_kernels = 1, t->m.kernels = t->kis;
  t->m.n_inputs = 1, t->m.inputs = t->ins;
  t->m.n_outputs = 1, t->m.outputs = t->outs;
}

START_TEST(manifests_are_validated) {
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  tm_cuda t;
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};
#define EXPECT(edit_stmt, want)                                                                         \
  do {                                                                                                  \
    tm_init(&t);                                                                                        \
    edit_stmt;                                                                                          \
    ck_assert_int_eq(tcc_rt_cuda_kernel_load_manifest(cubin, sizeof cubin, NULL, &t.m, NULL, &k, &err),    \
                     TCC_E_INVALID_ARGUMENT);                                                           \
    ck_assert_msg(strstr(err.msg, want), "expected '%s' in: %s", want, err.msg);                        \
    ck_assert_ptr_null(k);                                                                              \
  } while (0)

  EXPECT(t.m.target = (char *)"cpu:x86-64-v2", "is not cuda:ARCH");
  EXPECT(t.m.target = NULL, "is not cuda:ARCH");
  EXPECT(t.m.n_kernels = 0, "no kernels");
  EXPECT(t.ki.name = (char *)"", "kernel 0 has no name");
  EXPECT(t.ki.n_grid = 0, "'k0_pointwise'): grid has 0 entries");
  EXPECT(t.ki.n_block = 4, "block has 4 entries");
  EXPECT(t.grid[0] = 0, "grid[0] = 0 out of range");
  EXPECT((t.ki.n_grid = 2, t.grid[1] = -3), "grid[1] = -3 out of range");
  EXPECT(t.grid[0] = (int64_t)1 << 40, "out of range");
  EXPECT(t.block[0] = 2048, "block of 2048 threads");
  EXPECT((t.ki.n_block = 3, t.block[0] = 32, t.block[1] = 32, t.block[2] = 2), "block of 2048 threads");
  EXPECT(t.ki.shared_bytes = -1, "shared_bytes -1 out of range");
  EXPECT(t.m.workspace_bytes = -8, "workspace_bytes -8 is negative");
  EXPECT(t.m.target = (char *)"cuda:sm_86", "says sm_86 but the cubin is for sm_90");
  EXPECT(t.m.target = (char *)"cuda:", "bad CUDA arch");
#undef EXPECT
  ck_assert_int_eq(tcc_rt_cuda_kernel_load_manifest(cubin, sizeof cubin, NULL, NULL, NULL, &k, &err),
                   TCC_E_INVALID_ARGUMENT);

  if (no_driver) {
    tm_init(&t);
    t.m.target = (char *)"cuda:sm_90a";
    ck_assert_int_eq(tcc_rt_cuda_kernel_load_manifest(cubin, sizeof cubin, NULL, &t.m, NULL, &k, &err),
                     TCC_E_FAILED_PRECONDITION);
    assert_no_driver(&err);
  }
}
END_TEST

START_TEST(generic_load_dispatches_cuda_artifacts) {
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(cubin, sizeof cubin, hex);
  tm_cuda t;
  tm_init(&t);
  tcc_module *k = NULL;
  tcc_error err = {0};

  /* A cubin with a CUDA manifest goes to the CUDA loader (where there is
   * a driver, test_gpu_manifest loads real ones). */
  if (no_driver) {
    ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &t.m, &k, &err), TCC_E_FAILED_PRECONDITION);
    assert_no_driver(&err);
    ck_assert_msg(strstr(err.msg, "CUDA artifact ") && strstr(err.msg, "cuda:sm_90"), "%s", err.msg);
    ck_assert_ptr_null(k);
  }

  /* The digest is still checked first. */
  char wrong[TCC_SHA256_HEX];
  memcpy(wrong, hex, sizeof wrong);
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, wrong, &t.m, &k, &err), TCC_E_DATA_LOSS);

  /* A cubin with a CPU manifest, and a CUDA manifest with a CPU ELF. */
  t.m.target = (char *)"cpu:x86-64-v2";
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &t.m, &k, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_msg(strstr(err.msg, "cubin") && strstr(err.msg, "cpu:x86-64-v2"), "%s", err.msg);
  cubin[18] = 62;
  tt_sha256_hex(cubin, sizeof cubin, hex);
  t.m.target = (char *)"cuda:sm_90";
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &t.m, &k, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_msg(strstr(err.msg, "not a cubin"), "%s", err.msg);
  ck_assert_ptr_null(tcc_module_cuda(NULL));
}
END_TEST

START_TEST(null_kernels_are_harmless) {
  tcc_error err = {0};
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(NULL, NULL, NULL, NULL, NULL, &err), TCC_E_INVALID_ARGUMENT);
  tcc_rt_cuda_kernel_unload(NULL);
  tcc_rt_cuda_kernel_set_graphs(NULL, 1);
  tcc_rt_cuda_stats st;
  memset(&st, 0xab, sizeof st);
  tcc_rt_cuda_kernel_stats(NULL, &st);
  ck_assert_uint_eq(st.direct_launches + st.graph_captures + st.graph_replays, 0);
  ck_assert_int_eq(tcc_rt_cuda_free(0, NULL, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_stream_destroy(0, NULL, &err), 0);
}
END_TEST

int main(void) {
  const char *lib = getenv("TCC_CUDA_LIBRARY");
  snprintf(driver_name, sizeof driver_name, "%s", lib && *lib ? lib : "libcuda.so.1");
  no_driver = getenv("TCC_TEST_NO_DRIVER") != NULL;
  if (!no_driver) { /* is there one? (probe without keeping it) */
    void *h = dlopen(driver_name, RTLD_NOW | RTLD_LOCAL);
    if (h)
      dlclose(h);
    else
      no_driver = 1;
  }
  printf("test_loader: %s %s\n", driver_name, no_driver ? "is missing (the error is asserted)" : "is present");
  tt_seed("test_loader");
  return tt_run_tests("cuda-loader", 0, 1, (const TTest *[]){
      availability_is_reported_clearly,
      cubins_are_checked_before_the_driver,
      manifests_are_validated,
      generic_load_dispatches_cuda_artifacts,
      null_kernels_are_harmless,
      NULL});
}
