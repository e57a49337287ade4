/*
 * test_fake_driver.c — the CUDA loader against fake_libcuda.so (a
 * recording stand-in for libcuda.so.1; TCC_CUDA_LIBRARY points at it), so
 * its decisions are checked on machines without a GPU: argument binding
 * (inputs, outputs, workspace), grid/block/shared per launch and their
 * order, context push/pop balance, cubin vs PTX vs "arch mismatch" by
 * compute capability, the module cache, CUDA graph capture/replay/LRU,
 * launches inside a caller's capture, the manifest path and the generic
 * tcc_module_load/run, the event helpers (timing against the fake's
 * programmable clock), and the error messages. Real kernels run in
 * test_gpu on a GPU machine.
 *
 * With TCC_FAKE_CUDA_INIT_ERROR=100 (a second registration) only the cuInit
 * failure is checked.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcc_runtime.h"
#include "tccclient.h"
#include "tcctest.h"

static const char *(*fake_events)(void);
static void (*fake_reset)(void);
static int (*fake_depth)(void);
static int (*fake_begin_capture)(void *stream, int mode);
static int (*fake_end_capture)(void *stream, void **graph);
static int (*fake_graph_destroy)(void *graph);
static int (*fake_push)(void *ctx);
static int (*fake_pop)(void **ctx);

/* The event log has lines starting with these, in this order (others
 * may come between). */
#define EXPECT_SEQ(...)                                                                       \
  do {                                                                                        \
    const char *const want_[] = {__VA_ARGS__};                                                \
    ck_assert_msg(tt_fake_events_in_order(fake_events(), want_, sizeof want_ / sizeof want_[0]), \
                  "events:\n%s", fake_events());                                              \
  } while (0)

static int log_count(const char *prefix) { return tt_fake_event_count(fake_events(), prefix); }

#define P(x) ((void *)(uintptr_t)(x))

static tcc_rt_cuda_kernel *load(int sm, const tcc_rt_cuda_launch *l, size_t n, size_t n_in, size_t n_out, uint64_t ws,
                             const char *arch, const tcc_rt_cuda_options *o, const char *digest) {
  uint8_t cubin[256];
  tt_fake_cubin(cubin, sm);
  tcc_rt_cuda_plan plan = {.arch = arch, .launches = l, .n_launches = n, .n_inputs = n_in, .n_outputs = n_out,
                        .workspace_bytes = ws};
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, digest, &plan, o, &k, &err) == 0, "%s", err.msg);
  ck_assert_int_eq(fake_depth(), 0);
  return k;
}

START_TEST(launches_bind_inputs_outputs_workspace) {
  fake_reset();
  tcc_rt_cuda_launch l = {.name = "k0_pointwise", .grid = {40}, .block = {256}};
  tcc_rt_cuda_kernel *k = load(90, &l, 1, 2, 1, 0, "sm_90", NULL, NULL);
  EXPECT_SEQ("push", "load cubin", "pop");
  fake_reset();
  tcc_error err = {0};
  const void *in[2] = {P(0x1000), P(0x2000)};
  void *out[1] = {P(0x3000)};
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out, NULL, &err), 0);
  EXPECT_SEQ("push", "launch k0_pointwise g=40,1,1 b=256,1,1 s=0 stream=0 p=1000,2000,3000,0", "pop");
  ck_assert_int_eq(fake_depth(), 0);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, NULL, out, NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "takes 2 inputs and 1 outputs"), "%s", err.msg);
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.direct_launches, 1);
  ck_assert_str_eq(st.device_arch, "sm_90");
  fake_reset();
  tcc_rt_cuda_kernel_unload(k);
  EXPECT_SEQ("push", "unload", "pop");
}
END_TEST

START_TEST(plans_run_in_order_with_workspace_and_shared) {
  setenv("TCC_FAKE_CUDA_NPARAMS", "3", 1);
  tcc_rt_cuda_launch l[2] = {
      {.name = "k0_row_sumsq", .grid = {37}, .block = {256}, .shared_bytes = 64 * 1024},
      {.name = "k1_sqrt", .grid = {1, 2}, .block = {128, 1, 1}},
  };
  fake_reset();
  tcc_rt_cuda_kernel *k = load(90, l, 2, 1, 1, 148, "sm_90", NULL, NULL);
  EXPECT_SEQ("load cubin", "set_attr k0_row_sumsq 8 65536");
  ck_assert_int_eq(log_count("set_attr k1_sqrt"), 0);
  tcc_error err = {0};
  const void *in[1] = {P(0xa0)};
  void *out[1] = {P(0xb0)};
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out, NULL, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "workspace of 148 bytes"), "%s", err.msg);
  fake_reset();
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out, P(0xc0), &err), 0);
  EXPECT_SEQ("launch k0_row_sumsq g=37,1,1 b=256,1,1 s=65536 stream=0 p=a0,b0,c0",
             "launch k1_sqrt g=1,2,1 b=128,1,1 s=0 stream=0 p=a0,b0,c0");
  tcc_rt_cuda_kernel_unload(k);
  unsetenv("TCC_FAKE_CUDA_NPARAMS");
}
END_TEST

START_TEST(arch_decides_cubin_ptx_or_mismatch) {
  tcc_rt_cuda_launch l = {.name = "k0", .grid = {1}, .block = {32}};
  uint8_t cubin[256];
  tcc_rt_cuda_plan plan = {.launches = &l, .n_launches = 1, .n_inputs = 2, .n_outputs = 1};
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};
  const char *ptx = "//\n.version 9.0\n.target sm_80\n";
  struct {
    int cc, sm;
    const char *arch;
    int with_ptx;
    const char *expect; /* "cubin", "ptx" or an error substring */
  } cases[] = {
      {90, 90, "sm_90", 0, "cubin"},
      {90, 90, "sm_90a", 0, "cubin"},
      {86, 80, "sm_80", 0, "cubin"},   /* same major, newer minor */
      {89, 86, "sm_86", 1, "cubin"},
      {90, 80, "sm_80", 0, "arch mismatch: artifact sm_80, device sm_90 (no PTX to JIT-compile"},
      {90, 80, "sm_80", 1, "ptx"},     /* another major: the PTX */
      {100, 90, "sm_90", 1, "ptx"},
      {80, 86, "sm_86", 1, "arch mismatch: artifact sm_86, device sm_80 (the PTX cannot run there either"},
      {80, 90, "sm_90", 1, "arch mismatch: artifact sm_90, device sm_80"},
      {100, 90, "sm_90a", 1, "arch mismatch: artifact sm_90a, device sm_100"}, /* 'a' PTX is not portable */
      {103, 100, "sm_100f", 0, "cubin"},                                     /* family */
      {120, 100, "sm_100a", 1, "arch mismatch: artifact sm_100a, device sm_120"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char cc[8];
    snprintf(cc, sizeof cc, "%d", cases[i].cc);
    setenv("TCC_FAKE_CUDA_CC", cc, 1);
    tt_fake_cubin(cubin, cases[i].sm);
    plan.arch = cases[i].arch;
    tcc_rt_cuda_options o = {.ptx = cases[i].with_ptx ? ptx : NULL};
    fake_reset();
    int rc = tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, &o, &k, &err);
    if (!strcmp(cases[i].expect, "cubin") || !strcmp(cases[i].expect, "ptx")) {
      ck_assert_msg(rc == 0, "case %zu: %s", i, err.msg);
      int ptx_loaded = log_count("load ptx") == 1;
      ck_assert_msg(ptx_loaded == !strcmp(cases[i].expect, "ptx"), "case %zu: events\n%s", i, fake_events());
      tcc_rt_cuda_stats st;
      tcc_rt_cuda_kernel_stats(k, &st);
      ck_assert_int_eq(st.from_ptx, ptx_loaded);
      tcc_rt_cuda_kernel_unload(k);
    } else {
      ck_assert_msg(rc == TCC_E_FAILED_PRECONDITION, "case %zu: rc %d %s", i, rc, err.msg);
      ck_assert_msg(strstr(err.msg, cases[i].expect), "case %zu: expected '%s' in: %s", i, cases[i].expect, err.msg);
      ck_assert_ptr_null(k);
      ck_assert_int_eq(log_count("load"), 0);
    }
    ck_assert_int_eq(fake_depth(), 0);
  }
  unsetenv("TCC_FAKE_CUDA_CC");
}
END_TEST

START_TEST(graphs_capture_replay_and_evict) {
  tcc_rt_cuda_launch l[2] = {{.name = "k0", .grid = {4}, .block = {64}}, {.name = "k1", .grid = {2}, .block = {32}}};
  tcc_rt_cuda_options o = {.graphs = 1, .graph_cache_max = 2};
  tcc_rt_cuda_kernel *k = load(90, l, 2, 2, 1, 0, "sm_90", &o, NULL);
  void *stream = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_rt_cuda_stream_create(0, &stream, &err), 0);
  const void *in[2] = {P(0x10), P(0x20)};
  void *out_a[1] = {P(0x30)}, *out_b[1] = {P(0x40)}, *out_c[1] = {P(0x50)};

  fake_reset();
  for (int i = 0; i < 3; i++) ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0);
  ck_assert_int_eq(log_count("capture"), 1);
  ck_assert_int_eq(log_count("instantiate"), 1);
  ck_assert_int_eq(log_count("replay"), 3);
  ck_assert_int_eq(log_count("launch"), 0); /* everything went through the graph */
  EXPECT_SEQ("capture", "end", "instantiate", "replay", "  k0 g=4,1,1 b=64,1,1 s=0", "  k1 g=2,1,1 b=32,1,1 s=0");
  ck_assert_msg(strstr(fake_events(), "p=10,20,30,0"), "%s", fake_events());

  fake_reset();
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_b, NULL, &err), 0); /* second set */
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0); /* hit: a is newest */
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_c, NULL, &err), 0); /* evicts b */
  ck_assert_int_eq(log_count("capture"), 2);
  ck_assert_int_eq(log_count("destroy"), 1);
  ck_assert_msg(strstr(fake_events(), "p=10,20,50,0"), "%s", fake_events());
  fake_reset();
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0); /* still cached */
  ck_assert_int_eq(log_count("capture"), 0);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_b, NULL, &err), 0); /* was evicted */
  ck_assert_int_eq(log_count("capture"), 1);

  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.graph_captures, 4);
  ck_assert_uint_eq(st.graph_replays, 8);
  ck_assert_uint_eq(st.direct_launches, 0);

  /* The legacy default stream: direct. */
  fake_reset();
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out_a, NULL, &err), 0);
  ck_assert_int_eq(log_count("launch"), 2);
  ck_assert_int_eq(log_count("capture"), 0);

  /* A stream the caller is capturing: our launches join its graph. */
  fake_reset();
  ck_assert_int_eq(fake_begin_capture(stream, 1), 0);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0);
  void *g = NULL;
  ck_assert_int_eq(fake_end_capture(stream, &g), 0);
  fake_graph_destroy(g);
  ck_assert_int_eq(log_count("capture"), 1); /* the caller's own */
  ck_assert_int_eq(log_count("replay"), 0);
  tcc_rt_cuda_kernel_stats(k, &st);
  ck_assert_uint_eq(st.direct_launches, 2);

  /* Off: the cached graphs are destroyed, launches are direct. */
  fake_reset();
  tcc_rt_cuda_kernel_set_graphs(k, 0);
  ck_assert_int_eq(log_count("destroy"), 2);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0);
  ck_assert_int_eq(log_count("launch"), 2);
  tcc_rt_cuda_kernel_set_graphs(k, 1);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out_a, NULL, &err), 0);
  fake_reset();
  tcc_rt_cuda_kernel_unload(k); /* destroys the graph it captured again */
  ck_assert_int_eq(log_count("destroy"), 1);
  ck_assert_int_eq(log_count("unload"), 1);
  ck_assert_int_eq(tcc_rt_cuda_stream_destroy(0, stream, &err), 0);
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

START_TEST(modules_are_cached_by_context_and_digest) {
  tcc_rt_cuda_launch l = {.name = "k0", .grid = {1}, .block = {32}};
  const char *d1 = "1111111111111111111111111111111111111111111111111111111111111111";
  const char *d2 = "2222222222222222222222222222222222222222222222222222222222222222";
  fake_reset();
  tcc_rt_cuda_kernel *a = load(90, &l, 1, 2, 1, 0, NULL, NULL, d1);
  tcc_rt_cuda_kernel *b = load(90, &l, 1, 2, 1, 0, NULL, NULL, d1);
  tcc_rt_cuda_kernel *c = load(90, &l, 1, 2, 1, 0, NULL, NULL, d2);
  tcc_rt_cuda_kernel *d = load(90, &l, 1, 2, 1, 0, NULL, NULL, NULL);
  ck_assert_int_eq(log_count("load cubin"), 3);
  fake_reset();
  tcc_rt_cuda_kernel_unload(a);
  ck_assert_int_eq(log_count("unload"), 0);
  tcc_rt_cuda_kernel_unload(b);
  ck_assert_int_eq(log_count("unload"), 1);
  tcc_rt_cuda_kernel_unload(c);
  tcc_rt_cuda_kernel_unload(d);
  ck_assert_int_eq(log_count("unload"), 3);
  ck_assert_int_eq(log_count("unload (no context!)"), 0);
}
END_TEST

START_TEST(errors_name_the_kernel) {
  tcc_error err = {0};
  tcc_rt_cuda_kernel *k = NULL;
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  tcc_rt_cuda_launch l[2] = {{.name = "k0", .grid = {1}, .block = {32}}, {.name = "missing_k1", .grid = {1}, .block = {32}}};
  tcc_rt_cuda_plan plan = {.launches = l, .n_launches = 2, .n_inputs = 2, .n_outputs = 1};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "kernel 'missing_k1' (launch 2 of 2) is not in the module: CUDA_ERROR_NOT_FOUND"),
                "%s", err.msg);
  ck_assert_int_eq(fake_depth(), 0);

  plan.n_launches = 1;
  plan.n_inputs = 3; /* the fake kernels take 4 parameters */
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "kernel 'k0' takes 4 parameters; the tccd ABI passes 5 (3 inputs, 1 outputs, workspace)"),
                "%s", err.msg);
  plan.n_inputs = 2;

  l[0].block[0] = 1025;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "1025 threads"), "%s", err.msg);
  l[0].block[0] = 32;
  l[0].shared_bytes = 300000;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "300000 bytes of dynamic"), "%s", err.msg);
  l[0].shared_bytes = 0;

  l[0].grid[1] = 70000;
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, NULL, &k, &err), 0);
  const void *in[2] = {P(1), P(2)};
  void *out[1] = {P(3)};
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out, NULL, &err), TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "kernel 'k0' (launch 1 of 1): cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (invalid argument)"),
                "%s", err.msg);
  ck_assert_int_eq(fake_depth(), 0);
  tcc_rt_cuda_kernel_unload(k);

  tcc_rt_cuda_options cur = {.context = TCC_RT_CUDA_CURRENT};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, &cur, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "no current CUDA context on this thread"), "%s", err.msg);
  tcc_rt_cuda_options dev = {.device = 3};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, &dev, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "no CUDA device 3 (this machine has 1)"), "%s", err.msg);
}
END_TEST

START_TEST(the_callers_current_context_is_used_as_is) {
  static int callers_ctx;
  ck_assert_int_eq(fake_push(&callers_ctx), 0);
  tcc_rt_cuda_launch l = {.name = "k0", .grid = {1}, .block = {32}};
  tcc_rt_cuda_options o = {.context = TCC_RT_CUDA_CURRENT_OR_PRIMARY};
  fake_reset();
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  tcc_rt_cuda_plan plan = {.launches = &l, .n_launches = 1, .n_inputs = 2, .n_outputs = 1};
  tcc_rt_cuda_kernel *k = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_rt_cuda_kernel_load(cubin, sizeof cubin, NULL, &plan, &o, &k, &err), 0);
  const void *in[2] = {P(1), P(2)};
  void *out[1] = {P(3)};
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, NULL, in, out, NULL, &err), 0);
  ck_assert_int_eq(log_count("push"), 0); /* already current: nothing pushed */
  ck_assert_int_eq(log_count("retain"), 0);
  ck_assert_int_eq(log_count("launch k0"), 1);
  tcc_rt_cuda_kernel_unload(k);
  void *popped = NULL;
  ck_assert_int_eq(fake_pop(&popped), 0);
  ck_assert_ptr_eq(popped, &callers_ctx);
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

START_TEST(memory_helpers_round_trip) {
  tcc_error err = {0};
  float host[64], back[64];
  tt_fill_float(host, 64, -1.0f, 1.0f);
  void *d = NULL;
  ck_assert_int_eq(tcc_rt_cuda_malloc(0, sizeof host, &d, &err), 0);
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(tcc_rt_cuda_memcpy_htod(0, d, host, sizeof host, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_memcpy_dtoh(0, back, d, sizeof back, &err), 0);
  ck_assert_mem_eq(host, back, sizeof host);
  ck_assert_int_eq(tcc_rt_cuda_synchronize(0, NULL, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_free(0, d, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_malloc(7, 16, &d, &err), TCC_E_INVALID_ARGUMENT);
  int n = 0, v = 0;
  char arch[16], name[64];
  ck_assert_int_eq(tcc_rt_cuda_device_count(&n, &err), 0);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(tcc_rt_cuda_driver_version(&v, &err), 0);
  ck_assert_int_eq(v, 13000);
  setenv("TCC_FAKE_CUDA_CC", "86", 1);
  ck_assert_int_eq(tcc_rt_cuda_device_arch(0, arch, name, sizeof name, &err), 0);
  unsetenv("TCC_FAKE_CUDA_CC");
  ck_assert_str_eq(arch, "sm_86");
  ck_assert_str_eq(name, "Fake GPU 0");
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

/* The event helpers (tccd-bench's timing) against the fake GPU clock:
 * TCC_FAKE_CUDA_LAUNCH_US programs each launch's duration by kernel name and
 * block size; TCC_FAKE_CUDA_LAUNCH_FAIL makes launches fail. */
START_TEST(events_time_launches) {
  tcc_error err = {0};
  tcc_rt_cuda_launch l[2] = {{.name = "k0", .grid = {4}, .block = {512}}, {.name = "k1", .grid = {4}, .block = {128}}};
  setenv("TCC_FAKE_CUDA_NPARAMS", "3", 1);
  tcc_rt_cuda_kernel *k = load(90, l, 2, 1, 1, 0, "sm_90", NULL, NULL);
  setenv("TCC_FAKE_CUDA_LAUNCH_US", "k0@b256=1,k0@b512=7.5,*=20", 1);
  void *stream = NULL, *e0 = NULL, *e1 = NULL, *e2 = NULL;
  ck_assert_int_eq(tcc_rt_cuda_stream_create(0, &stream, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_create(0, &e0, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_create(0, &e1, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_create(0, &e2, &err), 0);
  const void *in[1] = {P(0x1000)};
  void *out[1] = {P(0x2000)};
  ck_assert_int_eq(tcc_rt_cuda_event_record(0, e0, stream, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out, NULL, &err), 0);   /* 7.5 + 20 us */
  ck_assert_int_eq(tcc_rt_cuda_event_record(0, e1, stream, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out, NULL, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_record(0, e2, stream, &err), 0);
  float ms = 0;
  ck_assert_int_eq(tcc_rt_cuda_event_elapsed_ms(0, e0, e1, &ms, &err), 0);
  ck_assert_float_eq_tol(ms, 0.0275f, 1e-6f);
  ck_assert_int_eq(tcc_rt_cuda_event_elapsed_ms(0, e0, e2, &ms, &err), 0);
  ck_assert_float_eq_tol(ms, 0.055f, 1e-6f);
  setenv("TCC_FAKE_CUDA_LAUNCH_FAIL", "k1@b128", 1);
  ck_assert_int_eq(tcc_rt_cuda_kernel_launch(k, stream, in, out, NULL, &err), TCC_E_INTERNAL);
  ck_assert_msg(strstr(err.msg, "k1") && strstr(err.msg, "cuLaunchKernel"), "%s", err.msg);
  unsetenv("TCC_FAKE_CUDA_LAUNCH_FAIL");
  unsetenv("TCC_FAKE_CUDA_LAUNCH_US");
  ck_assert_int_eq(tcc_rt_cuda_event_destroy(0, e0, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_destroy(0, e1, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_destroy(0, e2, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_event_destroy(0, NULL, &err), 0);
  ck_assert_int_eq(tcc_rt_cuda_stream_destroy(0, stream, &err), 0);
  ck_assert_int_eq(fake_depth(), 0);
  tcc_rt_cuda_kernel_unload(k);
  unsetenv("TCC_FAKE_CUDA_NPARAMS");
}
END_TEST

START_TEST(manifests_and_generic_kernels_launch) {
  uint8_t cubin[256];
  tt_fake_cubin(cubin, 90);
  int64_t grid[2] = {3, 5}, block[1] = {128};
  Tcc__V1__KernelInfo ki = TCC__V1__KERNEL_INFO__INIT;
  ki.name = (char *)"k0_fused";
  ki.n_grid = 2, ki.grid = grid, ki.n_block = 1, ki.block = block, ki.shared_bytes = 256;
  Tcc__V1__KernelInfo *kis[1] = {&ki};
  Tcc__V1__TensorMeta meta = TCC__V1__TENSOR_META__INIT;
  Tcc__V1__TensorMeta *ins[2] = {&meta, &meta}, *outs[1] = {&meta};
  Tcc__V1__Manifest m = TCC__V1__MANIFEST__INIT;
  m.abi_version = 1, m.target = (char *)"cuda:sm_90";
  m.n_kernels = 1, m.kernels = kis, m.n_inputs = 2, m.inputs = ins, m.n_outputs = 1, m.outputs = outs;
  m.workspace_bytes = 512;
  char hex[TCC_SHA256_HEX];
  tt_sha256_hex(cubin, sizeof cubin, hex);

  tcc_module *k = NULL;
  tcc_error err = {0};
  ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &m, &k, &err) == 0, "%s", err.msg);
  ck_assert_ptr_nonnull(tcc_module_cuda(k));
  const void *in[2] = {P(0x100), P(0x200)};
  void *out[1] = {P(0x300)};
  fake_reset();
  ck_assert_int_eq(tcc_module_run(k, in, out, P(0x400), &err), 0);
  EXPECT_SEQ("launch k0_fused g=3,5,1 b=128,1,1 s=256 stream=0 p=100,200,300,400");
  ck_assert_int_eq(tcc_module_run(k, in, out, NULL, &err), TCC_E_INVALID_ARGUMENT);
  tcc_module_unload(k);

  /* The manifest's arch must be the cubin's. */
  m.target = (char *)"cuda:sm_80";
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &m, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "the manifest says sm_80 but the cubin is for sm_90"), "%s", err.msg);
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

/* A manifest: k0 = cuBLAS GEMM (A = inputs[1], B = inputs[0] or a
 * constant, C = workspace + 256), then the epilogue kernel k1. */
typedef struct gemm_manifest {
  Tcc__V1__Manifest m;
  Tcc__V1__KernelInfo k0, k1;
  Tcc__V1__KernelInfo *kis[2];
  Tcc__V1__GemmStep g;
  Tcc__V1__BufferRef a, b, c;
  Tcc__V1__TensorMeta meta;
  Tcc__V1__TensorMeta *ins[2], *outs[1];
  int64_t grid[1], block[1];
} gemm_manifest;

static void gemm_manifest_init(gemm_manifest *x, Tcc__V1__DType dt) {
  memset(x, 0, sizeof *x);
  tcc__v1__manifest__init(&x->m);
  tcc__v1__kernel_info__init(&x->k0);
  tcc__v1__kernel_info__init(&x->k1);
  tcc__v1__gemm_step__init(&x->g);
  tcc__v1__buffer_ref__init(&x->a);
  tcc__v1__buffer_ref__init(&x->b);
  tcc__v1__buffer_ref__init(&x->c);
  tcc__v1__tensor_meta__init(&x->meta);
  x->a.base_case = TCC__V1__BUFFER_REF__BASE_INPUT, x->a.input = 1;
  x->b.base_case = TCC__V1__BUFFER_REF__BASE_INPUT, x->b.input = 0, x->b.offset_bytes = 16;
  x->c.base_case = TCC__V1__BUFFER_REF__BASE_WORKSPACE, x->c.workspace = 1, x->c.offset_bytes = 256;
  x->g.m = 45, x->g.n = 33, x->g.k = 70, x->g.lda = 45, x->g.ldb = 70, x->g.ldc = 45;
  x->g.trans_b = 1, x->g.ldb = 33;
  x->g.batch_count = 2, x->g.stride_a = 0, x->g.stride_b = 33 * 70, x->g.stride_c = 45 * 33;
  x->g.a_dtype = x->g.b_dtype = dt;
  x->g.c_dtype = dt == TCC__V1__DTYPE__FLOAT64 ? dt : TCC__V1__DTYPE__FLOAT32;
  x->g.compute_type = dt == TCC__V1__DTYPE__FLOAT64 ? (char *)"64F" : (char *)"32F";
  x->g.alpha = 1, x->g.beta = 0;
  x->g.a = &x->a, x->g.b = &x->b, x->g.c = &x->c;
  x->k0.name = (char *)"k0", x->k0.kind = (char *)"extern", x->k0.gemm = &x->g;
  x->grid[0] = 12, x->block[0] = 256;
  x->k1.name = (char *)"k1", x->k1.kind = (char *)"pointwise";
  x->k1.n_grid = 1, x->k1.grid = x->grid, x->k1.n_block = 1, x->k1.block = x->block;
  x->kis[0] = &x->k0, x->kis[1] = &x->k1;
  x->ins[0] = x->ins[1] = x->outs[0] = &x->meta;
  x->m.abi_version = 1, x->m.target = (char *)"cuda:sm_90";
  x->m.n_kernels = 2, x->m.kernels = x->kis;
  x->m.n_inputs = 2, x->m.inputs = x->ins, x->m.n_outputs = 1, x->m.outputs = x->outs;
  x->m.workspace_bytes = 256 + 2 * 45 * 33 * 4;
}

/* An sm_90 cubin for the manifests above and its digest; the fake's
 * kernels take 4 parameters. */
static void gemm_cubin(uint8_t cubin[256], char hex[TCC_SHA256_HEX]) {
  tt_fake_cubin(cubin, 90);
  tt_sha256_hex(cubin, 256, hex);
  setenv("TCC_FAKE_CUDA_NPARAMS", "4", 1);
}

/* The cuBLAS step runs before the epilogue kernel, with the manifest's
 * sizes and the ABI's pointers + offsets; float32 without TF32. */
START_TEST(gemm_steps_run_through_cublas_in_plan_order) {
  uint8_t cubin[256];
  char hex[TCC_SHA256_HEX];
  gemm_cubin(cubin, hex);
  gemm_manifest x;
  gemm_manifest_init(&x, TCC__V1__DTYPE__FLOAT32);
  tcc_module *k = NULL;
  tcc_error err = {0};
  fake_reset();
  ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err) == 0, "%s", err.msg);
  EXPECT_SEQ("load cubin", "cublas create");
  const void *in[2] = {P(0x1000), P(0x2000)};
  void *out[1] = {P(0x3000)};
  fake_reset();
  ck_assert_msg(tcc_module_run(k, in, out, P(0x4000), &err) == 0, "%s", err.msg);
  EXPECT_SEQ("cublas math 1 0",
             "cublas gemm NT m=45 n=33 k=70 lda=45 ldb=33 ldc=45 sa=0 sb=2310 sc=1485 batch=2 types=0,0,0 compute=68 "
             "algo=-1 alpha=1 beta=0 A=2000 B=1010 C=4100 stream=0",
             "launch k1 g=12,1,1 b=256,1,1 s=0 stream=0 p=1000,2000,3000,4000");
  ck_assert_int_eq(log_count("cublas gemm"), 1);
  ck_assert_int_eq(log_count("launch "), 1);

  /* reduce-overhead: the GEMM is captured into the graph with the kernel */
  void *stream;
  ck_assert_int_eq(tcc_rt_cuda_stream_create(0, &stream, &err), 0);
  tcc_rt_cuda_kernel_set_graphs(tcc_module_cuda(k), 1);
  fake_reset();
  ck_assert_msg(tcc_rt_cuda_kernel_launch(tcc_module_cuda(k), stream, in, out, P(0x4000), &err) == 0, "%s", err.msg);
  EXPECT_SEQ("capture", "cublas gemm (captured) NT m=45", "end", "instantiate", "replay", "  k1 g=12");
  ck_assert_int_eq(tcc_rt_cuda_stream_destroy(0, stream, &err), 0);

  /* a cuBLAS failure names the step */
  setenv("TCC_FAKE_CUBLAS_FAIL", "1", 1);
  ck_assert_int_eq(tcc_module_run(k, in, out, P(0x4000), &err), TCC_E_INTERNAL);
  unsetenv("TCC_FAKE_CUBLAS_FAIL");
  ck_assert_msg(strstr(err.msg, "step 'k0' (launch 1 of 2): cublasGemmStridedBatchedEx: CUBLAS_STATUS_EXECUTION_FAILED"),
                "%s", err.msg);
  fake_reset();
  tcc_module_unload(k);
  EXPECT_SEQ("cublas destroy 1", "unload");
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

/* Half operands with a float32 C; float64 with the 64F compute type and
 * double alpha; a constant operand found with cuModuleGetGlobal; bad
 * steps refused at load, naming the kernel and field. */
START_TEST(gemm_dtypes_constants_and_bad_steps) {
  uint8_t cubin[256];
  char hex[TCC_SHA256_HEX];
  gemm_cubin(cubin, hex);
  const void *in[2] = {P(0x1000), P(0x2000)};
  void *out[1] = {P(0x3000)};
  tcc_error err = {0};
  static const struct {
    Tcc__V1__DType dt;
    const char *want;
  } cases[] = {
      {TCC__V1__DTYPE__FLOAT16, "types=2,2,0 compute=68"},
      {TCC__V1__DTYPE__BFLOAT16, "types=14,14,0 compute=68"},
      {TCC__V1__DTYPE__FLOAT64, "types=1,1,1 compute=70 algo=-1 alpha=1 beta=0"},
  };
  for (size_t c = 0; c < 3; c++) {
    gemm_manifest x;
    gemm_manifest_init(&x, cases[c].dt);
    tcc_module *k = NULL;
    ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err) == 0, "%s", err.msg);
    fake_reset();
    ck_assert_msg(tcc_module_run(k, in, out, P(0x4000), &err) == 0, "%s", err.msg);
    ck_assert_msg(strstr(fake_events(), cases[c].want), "want %s in\n%s", cases[c].want, fake_events());
    tcc_module_unload(k);
  }
  /* a constant of the module as cuBLAS's B */
  gemm_manifest x;
  gemm_manifest_init(&x, TCC__V1__DTYPE__FLOAT32);
  x.b.base_case = TCC__V1__BUFFER_REF__BASE_CONSTANT, x.b.constant = (char *)"b3_data", x.b.offset_bytes = 8;
  tcc_module *k = NULL;
  fake_reset();
  ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err) == 0, "%s", err.msg);
  EXPECT_SEQ("load cubin", "global b3_data");
  fake_reset();
  ck_assert_msg(tcc_module_run(k, in, out, P(0x4000), &err) == 0, "%s", err.msg);
  EXPECT_SEQ("cublas gemm NT m=45", "launch k1");
  ck_assert_ptr_nonnull(strstr(fake_events(), " B=7308 "));
  tcc_module_unload(k);
  x.b.constant = (char *)"missing_data";
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "constant 'missing_data' is not in the module"), "%s", err.msg);
  /* bad steps: refused at load, naming the kernel and the field */
#define BAD_STEP(edit_stmt, want)                                                                      \
  do {                                                                                                 \
    gemm_manifest_init(&x, TCC__V1__DTYPE__FLOAT32);                                                   \
    edit_stmt;                                                                                         \
    ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_INVALID_ARGUMENT); \
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);                                              \
  } while (0)
  BAD_STEP(x.g.lda = 10, "manifest kernel 0 ('k0'): gemm leading dimensions");
  BAD_STEP(x.g.compute_type = (char *)"16F", "unknown gemm compute type '16F'");
  BAD_STEP(x.a.input = 7, "step 'k0' (launch 1 of 2): operand a names no buffer");
  BAD_STEP(x.k0.gemm = NULL, "extern step without a gemm");
#undef BAD_STEP
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

/* Manifest.ptx: the driver's JIT runs it when the cubin's arch does not
 * fit the device; without it, a clear arch mismatch. */
START_TEST(manifest_ptx_is_the_jit_fallback) {
  uint8_t cubin[256];
  char hex[TCC_SHA256_HEX];
  gemm_cubin(cubin, hex);
  setenv("TCC_FAKE_CUDA_CC", "100", 1);   /* a Blackwell: sm_90 cubins do not run there */
  gemm_manifest x;
  gemm_manifest_init(&x, TCC__V1__DTYPE__FLOAT32);
  x.m.n_kernels = 1;
  x.kis[0] = &x.k1;
  static const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k1(\n)\n{ ret; }\n";
  x.m.ptx.data = (uint8_t *)ptx;
  x.m.ptx.len = strlen(ptx);
  tcc_module *k = NULL;
  tcc_error err = {0};
  fake_reset();
  ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err) == 0, "%s", err.msg);
  EXPECT_SEQ("load ptx");
  ck_assert_int_eq(log_count("load cubin"), 0);
  tcc_rt_cuda_stats st;
  tcc_rt_cuda_kernel_stats(tcc_module_cuda(k), &st);
  ck_assert_int_eq(st.from_ptx, 1);
  ck_assert_str_eq(st.device_arch, "sm_100");
  tcc_module_unload(k);
  /* the same device, no PTX: the message says what to do */
  x.m.ptx.len = 0;
  x.m.ptx.data = NULL;
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "arch mismatch: artifact sm_90, device sm_100 (no PTX to JIT-compile"), "%s",
                err.msg);
  /* an older device than the PTX: neither works */
  setenv("TCC_FAKE_CUDA_CC", "80", 1);
  x.m.ptx.data = (uint8_t *)ptx;
  x.m.ptx.len = strlen(ptx);
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "arch mismatch: artifact sm_90, device sm_80 (the PTX cannot run there either"),
                "%s", err.msg);
  /* PTX with a NUL byte is refused */
  setenv("TCC_FAKE_CUDA_CC", "100", 1);
  static const uint8_t bad[] = {'.', 'v', 0, 'x'};
  x.m.ptx.data = (uint8_t *)bad;
  x.m.ptx.len = sizeof bad;
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

/* Without cuBLAS (TCC_CUBLAS_LIBRARY names nothing) a plan with a GEMM
 * step fails to load, saying so; plans without one load as before. */
START_TEST(gemm_steps_need_cublas) {
  uint8_t cubin[256];
  char hex[TCC_SHA256_HEX];
  gemm_cubin(cubin, hex);
  gemm_manifest x;
  gemm_manifest_init(&x, TCC__V1__DTYPE__FLOAT32);
  tcc_module *k = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "step 'k0' (launch 1 of 2): /nonexistent/libcublas.so.13 not found: the plan has a "
                                "matmul (cuBLAS) step"),
                "%s", err.msg);
  x.m.n_kernels = 1;
  x.kis[0] = &x.k1;
  ck_assert_msg(tcc_module_load(cubin, sizeof cubin, hex, &x.m, &k, &err) == 0, "%s", err.msg);
  tcc_module_unload(k);
  ck_assert_int_eq(fake_depth(), 0);
}
END_TEST

START_TEST(cuinit_failure_is_reported) {
  tcc_error err = {0};
  ck_assert_int_eq(tcc_rt_cuda_available(&err), TCC_E_FAILED_PRECONDITION);
  ck_assert_msg(strstr(err.msg, "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"), "%s",
                err.msg);
}
END_TEST

/* Every test starts from the fake's defaults (CC 9.0, 4 parameters). */
static void default_knobs(void) {
  unsetenv("TCC_FAKE_CUDA_CC");
  unsetenv("TCC_FAKE_CUDA_NPARAMS");
}

int main(void) {
  void *h = tt_fake_cuda_open();
  tt_fake_cuda_sym(h, "fake_cuda_events", &fake_events);
  tt_fake_cuda_sym(h, "fake_cuda_reset", &fake_reset);
  tt_fake_cuda_sym(h, "fake_cuda_depth", &fake_depth);
  tt_fake_cuda_sym(h, "cuStreamBeginCapture_v2", &fake_begin_capture);
  tt_fake_cuda_sym(h, "cuStreamEndCapture", &fake_end_capture);
  tt_fake_cuda_sym(h, "cuGraphDestroy", &fake_graph_destroy);
  tt_fake_cuda_sym(h, "cuCtxPushCurrent_v2", &fake_push);
  tt_fake_cuda_sym(h, "cuCtxPopCurrent_v2", &fake_pop);
  tt_seed("test_fake_driver");
  Suite *s = suite_create("cuda-fake-driver");
  TCase *tc = tcase_create("fake");
  tcase_add_checked_fixture(tc, default_knobs, NULL);
  if (getenv("TCC_FAKE_CUDA_INIT_ERROR")) {
    tcase_add_test(tc, cuinit_failure_is_reported);
  } else if (getenv("TCC_FAKE_NO_CUBLAS")) {
    tcase_add_test(tc, gemm_steps_need_cublas);
  } else {
    tcase_add_test(tc, gemm_steps_run_through_cublas_in_plan_order);
    tcase_add_test(tc, gemm_dtypes_constants_and_bad_steps);
    tcase_add_test(tc, manifest_ptx_is_the_jit_fallback);
    tcase_add_test(tc, launches_bind_inputs_outputs_workspace);
    tcase_add_test(tc, plans_run_in_order_with_workspace_and_shared);
    tcase_add_test(tc, arch_decides_cubin_ptx_or_mismatch);
    tcase_add_test(tc, graphs_capture_replay_and_evict);
    tcase_add_test(tc, modules_are_cached_by_context_and_digest);
    tcase_add_test(tc, errors_name_the_kernel);
    tcase_add_test(tc, the_callers_current_context_is_used_as_is);
    tcase_add_test(tc, memory_helpers_round_trip);
    tcase_add_test(tc, events_time_launches);
    tcase_add_test(tc, manifests_and_generic_kernels_launch);
  }
  suite_add_tcase(s, tc);
  int rc = tt_run_suite(s, 1); /* one driver state, as with the real one */
  dlclose(h);
  return rc;
}
