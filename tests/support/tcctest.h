/*
 * tcctest.h — the test helper library (tests/support/, libtcctest): what
 * the C tests share, one copy each. Every test runs on Check; this header
 * is the table of contents, grouped by the file that defines each part.
 *
 *   harness.c     running a Check suite, skipping (exit 77), the seed and
 *                 the random numbers drawn from it
 *   files.c       scratch directories, whole files, child processes
 *   graphs.c      the example graphs (the .json files of tests/graphs)
 *   kernel.c      artifacts the tests load themselves: CPU kernel .so
 *                 files, digests
 *   reqb.c        CompileRequest messages built by hand
 *   request.c     requests and tensor metas: retargeting, storage bytes,
 *                 example graphs as requests
 *   cuda.c        NVRTC and cuobjdump (links libtccnvrtc)
 *   gpu.c         a real CUDA device (links libtccruntime, libtccnvrtc)
 *   fake_cuda.c   the recording fake libcuda (tests/cuda/fake_libcuda.c)
 *   cuda_kernels.h  hand-written CUDA C kernels that follow tccd's ABI
 *
 * Skipping: a test that needs what this machine lacks (NVRTC, a GPU, a
 * program) prints one "SKIP: why" line and exits 77, which meson counts
 * as skipped (tt_skip and the tt_need_* helpers).
 *
 * Seeds: every random input comes from one seed per process, printed
 * once ("<test>: seed N (TCC_TEST_SEED=N replays it)"); TCC_TEST_SEED=N
 * replays a run.
 *
 * Each part is its own object in a static library, so a program links
 * only the parts it calls (and the libraries they call: see
 * tests/support/meson.build); the tools tcc-run, make-corpus and
 * bench-cuda use it too. The protobuf message types appear here as
 * incomplete types: include "tcc/v1/tcc.pb-c.h" (or compiler.h,
 * tccclient.h) to reach their fields. Functions that assert (Check) say
 * so; they may only run inside a test.
 */
#ifndef TCC_TCCTEST_H
#define TCC_TCCTEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "tcc_status.h"

/* ================================================================ harness.c */

/* The exit status meson counts as a skipped test. */
#define TT_SKIP 77

/* Prints "SKIP: <why>" on stdout and exits 77. */
void tt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Runs suite s (and frees it): the tail of every test's main(). nofork
 * runs the tests in this process (CK_NOFORK: CUDA does not survive
 * fork(), and a fake driver's state must persist); otherwise Check's
 * default (CK_FORK, or $CK_FORK). Returns main's exit status: 0 when
 * every test passed, 1 otherwise. */
int tt_run_suite(Suite *s, int nofork);

/* The common case: one suite of one test case, both called name, holding
 * tests (a NULL-terminated list of START_TEST names), each allowed
 * timeout_s seconds (0: Check's default), run by tt_run_suite:
 *   return tt_run_tests("nvrtc", 300, 0, (const TTest *[]){a, b, NULL}); */
int tt_run_tests(const char *name, double timeout_s, int nofork, const TTest *const *tests);

/* The run's seed: $TCC_TEST_SEED, else from the clock and the pid.
 * Chosen once per process and printed once on stderr, naming `who`.
 * Seeds tt_rand. */
uint64_t tt_seed(const char *who);

/* Random numbers from the seed (splitmix64; tt_seed("test") when no seed
 * was chosen yet). A forked Check test starts from its parent's state. */
uint64_t tt_rand(void);
uint64_t tt_rand_range(uint64_t lo, uint64_t hi);   /* in [lo, hi] */
double tt_uniform(double lo, double hi);            /* in [lo, hi) */
void tt_rand_bytes(void *out, size_t n);
void tt_fill_float(float *v, size_t n, float lo, float hi); /* uniform */

/* Asserts that `call`, which must use &e_ as its tcc_error buffer,
 * returns 0; the failure names the call and its message:
 *   TT_OK(tcc_rt_cuda_malloc(0, n, &p, &e_)); */
#define TT_OK(call)                                           \
  do {                                                        \
    tcc_error e_ = {0};                                       \
    int rc_ = (call);                                         \
    ck_assert_msg(rc_ == 0, "%s: %d %s", #call, rc_, e_.msg); \
  } while (0)

/* ================================================================== files.c */

/* A fresh directory $TMPDIR/tcc-<tag>-XXXXXX (/tmp without TMPDIR).
 * Returns its malloc'd path, or NULL (errno set). */
char *tt_tmpdir(const char *tag);

/* Removes path and everything under it (rm -rf). Returns 0 or -1. */
int tt_remove_tree(const char *path);

/* Entries of directory path other than . and ..; -1 when unreadable. */
int tt_dir_entries(const char *path);

/* A whole file, malloc'd and NUL-terminated, its length in *len (len may
 * be NULL); NULL when it cannot be read. */
char *tt_read_file(const char *path, size_t *len);

/* Writes len bytes to path (created or truncated). Returns 0 or -1. */
int tt_write_file(const char *path, const void *data, size_t len);

/* Runs argv (fork/exec, PATH searched) and waits. stdin_path feeds its
 * stdin, stdout_path and stderr_path receive its streams (each optional).
 * Returns its exit status, or -1 (not started, or killed by a signal). */
int tt_run(char *const argv[], const char *stdin_path, const char *stdout_path, const char *stderr_path);

/* Runs shell command cmd and returns what it wrote on stdout (malloc'd,
 * NUL-terminated; append "2>&1" for stderr too), its pclose status in
 * *status; NULL when it cannot be started. */
char *tt_popen(const char *cmd, int *status);

/* ================================================================= graphs.c */

/* The example graphs' directory: $TCC_GRAPHS, else tests/graphs of the
 * source tree this library was built from. */
const char *tt_graphs_dir(void);

/* The path of example graph `name` ("sin_cos.json"), in a static buffer
 * (valid until the next call). */
const char *tt_graph_path(const char *name);

/* The text of example graph name (malloc'd, NUL-terminated), its length
 * in *len; NULL when it cannot be read. */
char *tt_graph_read(const char *name, size_t *len);

/* Every example graph in name order, one at a time:
 *   tt_graph g = {0};
 *   while (tt_graph_next(&g)) use(g.name, g.json, g.len);
 * tt_graph_next reads the next .json file (freeing the previous one) and
 * returns 1, or frees everything and returns 0 after the last one. It
 * asserts (Check) that the directory and every file can be read. */
typedef struct tt_graph {
  const char *name; /* "sin_cos.json" */
  char *json;       /* its text, NUL-terminated */
  size_t len;
  int index, count; /* position: this is graph index of count */
  char **names_;    /* private */
} tt_graph;
int tt_graph_next(tt_graph *g);

/* ================================================================= kernel.c */

/* The SHA-256 of data[len] in lowercase hex (TCC_SHA256_HEX bytes with
 * the NUL: 65), as artifacts are named. */
void tt_sha256_hex(const void *data, size_t len, char hex[65]);

/* dlopens a CPU kernel .so as libtccclient does (client/module.c): the
 * runtimes a kernel pulls in (libgomp, OpenBLAS, oneDNN) stay mapped for
 * the life of the process, so a dlclose never unmaps them under their
 * parked worker threads. NULL (dlerror() says why) on failure. */
void *tt_dlopen_kernel(const char *so);

/* Writes the .so bytes data[len] to dir/name and tt_dlopen_kernel's it.
 * NULL when it cannot be written (errno) or loaded (dlerror()). */
void *tt_load_kernel(const char *dir, const char *name, const void *data, size_t len);

/* =================================================================== reqb.c */

/* The generated message types (tcc/v1/tcc.pb-c.h defines them). */
typedef struct Tcc__V1__CompileRequest Tcc__V1__CompileRequest;
typedef struct Tcc__V1__TensorMeta Tcc__V1__TensorMeta;
typedef struct Tcc__V1__Node Tcc__V1__Node;
typedef struct Tcc__V1__Argument Tcc__V1__Argument;
typedef struct Tcc__V1__Target Tcc__V1__Target;
typedef struct Tcc__V1__Options Tcc__V1__Options;

/* A reqb builds one tcc.v1.CompileRequest and owns every part of it
 * (fixed-size tables, no per-field frees; exceeding one aborts).
 * reqb_req() gives the message, which a test may also poke at directly
 * to make it invalid. reqb_free frees everything.
 *
 *   reqb *b = reqb_new("x86-64-v2");
 *   reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){10, 10}, NULL, 0);
 *   ...
 *   reqb_input(b, "x");
 *   Tcc__V1__Node *n = reqb_node(b, "aten.sin.default", "s");
 *   reqb_arg_tensor(b, n, "self", "x");
 *   reqb_output(b, "s");
 */
typedef struct reqb reqb;

/* A CPU request for ISA isa ("" = default). */
reqb *reqb_new(const char *isa);
void reqb_free(reqb *b);

/* Declares a value of dtype dt (a Tcc__V1__DType). strides NULL =
 * contiguous. Returns its meta. */
Tcc__V1__TensorMeta *reqb_value(reqb *b, const char *name, int dt, int rank, const int64_t *sizes,
                                const int64_t *strides, int64_t offset);
void reqb_input(reqb *b, const char *name);
void reqb_output(reqb *b, const char *name);
void reqb_constant(reqb *b, const char *name, const void *data, size_t len);

/* A node with one output (out may be NULL for none). */
Tcc__V1__Node *reqb_node(reqb *b, const char *target, const char *out);
/* Adds another output name to n. */
void reqb_node_output(reqb *b, Tcc__V1__Node *n, const char *out);

/* Arguments; param "" binds positionally. Each returns the Argument. */
Tcc__V1__Argument *reqb_arg_tensor(reqb *b, Tcc__V1__Node *n, const char *param, const char *value);
Tcc__V1__Argument *reqb_arg_int(reqb *b, Tcc__V1__Node *n, const char *param, int64_t v);
Tcc__V1__Argument *reqb_arg_float(reqb *b, Tcc__V1__Node *n, const char *param, double v);
Tcc__V1__Argument *reqb_arg_bool(reqb *b, Tcc__V1__Node *n, const char *param, int v);
Tcc__V1__Argument *reqb_arg_none(reqb *b, Tcc__V1__Node *n, const char *param);
/* An int list (copied into the builder). */
Tcc__V1__Argument *reqb_arg_ints(reqb *b, Tcc__V1__Node *n, const char *param, int count, const int64_t *v);

/* Convenience: out = target(self=x) / target(self=x, other=y). The values
 * must be declared separately. */
Tcc__V1__Node *reqb_unary(reqb *b, const char *target, const char *x, const char *out);
Tcc__V1__Node *reqb_binary(reqb *b, const char *target, const char *x, const char *y, const char *out);

Tcc__V1__CompileRequest *reqb_req(reqb *b);
Tcc__V1__Target *reqb_target(reqb *b);
Tcc__V1__Options *reqb_options(reqb *b);
/* The encoded request (malloc'ed). */
uint8_t *reqb_pack(reqb *b, size_t *len);
/* A string owned by the builder (for poking names into the message). */
char *reqb_str(reqb *b, const char *s);

/* Graphs several tests build (CPU requests, default ISA unless said;
 * input x, output o unless said):
 *   reqb_sin_cos      foo(x, y) = sin(x) + cos(y) on 10x10 float32 for
 *                     ISA isa: tests/graphs/sin_cos.json (values x, y,
 *                     sin, cos, add)
 *   reqb_sin_cos_rows sin(x) + cos(y) in float32, x [rows, cols], y [cols]
 *                     broadcast over the rows (values x, y, s, c, o)
 *   reqb_sum_all      sum of float32 x [n] into o, 0-d
 *   reqb_softmax      target(x [rows, cols], dim 1, half_to_float false)
 *                     in dtype dt: aten._softmax.default or
 *                     aten._log_softmax.default
 *   reqb_sum_rows     sum over dim 1 of float32 x [rows, cols]: o [rows]
 *   reqb_sum_and_squares  sums over dim 1 of float32 x [rows, cols] and of
 *                     x2 = x * x: outputs o and q [rows]
 *   reqb_layer_norm   native_layer_norm of x [rows, cols] in dtype dt
 *                     over the last dim, weight w [cols], bias bb [cols]
 *                     (none without with_bias), eps 1e-5; outputs o,
 *                     mean m [rows, 1], rstd r [rows, 1]
 *   reqb_linear_gelu  gelu(linear(x, w, bias)) in float32: x of sizes
 *                     x_sizes[rank] (the last is K), w [n, K], bias [n];
 *                     l and o have x's sizes with n last
 *   reqb_conv_bias_relu relu(conv2d(x, w, bias)) in dtype dt: x [2, 8,
 *                     9, 9], w [12, 4, 3, 3], bias [12], groups 2,
 *                     stride 2, padding 1; c and y [2, 12, 5, 5] */
reqb *reqb_sin_cos(const char *isa);
reqb *reqb_sin_cos_rows(int64_t rows, int64_t cols);
reqb *reqb_sum_all(int64_t n);
reqb *reqb_softmax(const char *target, int dt, int64_t rows, int64_t cols);
reqb *reqb_sum_rows(int64_t rows, int64_t cols);
reqb *reqb_sum_and_squares(int64_t rows, int64_t cols);
reqb *reqb_layer_norm(int dt, int64_t rows, int64_t cols, int with_bias);
reqb *reqb_linear_gelu(int rank, const int64_t *x_sizes, int64_t n);
reqb *reqb_conv_bias_relu(int dt);

/* ================================================================ request.c */

/* Points req at target cuda:<arch>: the target and every value's device
 * (arch is kept, not copied: reqb_str gives one the builder owns). */
void tt_request_to_cuda(Tcc__V1__CompileRequest *req, char *arch);
/* ... and back at the CPU (the target's cuda_arch is left as it is). */
void tt_request_to_cpu(Tcc__V1__CompileRequest *req);

/* Example graph g parsed as a CompileRequest (free it with
 * protobuf_c_message_free_unpacked), pointed at cuda:<cuda_arch> unless
 * cuda_arch is NULL. Asserts (Check) that it parses and has a target. */
Tcc__V1__CompileRequest *tt_graph_request(const tt_graph *g, const char *cuda_arch);

/* Bytes of storage a tensor reaches (common/tcc_dtype.h): offset, strides
 * and element size included; 0 for an empty one. */
size_t tt_meta_bytes(const Tcc__V1__TensorMeta *m);

/* =================================================================== cuda.c */

/* Skips (exit 77: "SKIP: NVRTC not available: why") unless NVRTC loads. */
void tt_need_nvrtc(void);

/* $TCC_CUOBJDUMP when it names an executable, else NULL. */
const char *tt_cuobjdump(void);

/* Runs `cuobjdump flag file` (tt_cuobjdump() names it) and returns what
 * it printed, stderr included (malloc'd). Asserts (Check) that it ran
 * and exited 0. */
char *tt_cuobjdump_run(const char *flag, const char *file);

/* ==================================================================== gpu.c */

/* Skips unless there is a CUDA driver and device 0 ("no CUDA device
 * (why)"), NVRTC loads, and NVRTC builds for the device's arch; fills
 * arch ("sm_90") and, when name is not NULL, the device's name. A driver
 * that cannot say device 0's arch is a failure (exit 1). */
void tt_need_gpu(char arch[16], char *name, size_t name_cap);

/* ============================================================== fake_cuda.c */

/* dlopens the recording fake libcuda that $TCC_CUDA_LIBRARY names (meson
 * points it there); skips when it names something else or cannot be
 * loaded. */
void *tt_fake_cuda_open(void);

/* Stores symbol `name` of the fake h into the function pointer at fn;
 * skips ("fake driver lacks <name>") when it has none:
 *   tt_fake_cuda_sym(h, "fake_cuda_events", &fake_events); */
void tt_fake_cuda_sym(void *h, const char *name, void *fn);

/* The fake's event log (its fake_cuda_events(): one line per driver or
 * cuBLAS call, "launch k0 g=40,1,1 b=256,1,1 ..."), searched by line
 * prefix: the index of the first line starting with prefix (-1 when
 * none); how many lines start with it; whether lines starting with
 * want[0], want[1], ... appear in that order (others may come between). */
int tt_fake_event_at(const char *log, const char *prefix);
int tt_fake_event_count(const char *log, const char *prefix);
int tt_fake_events_in_order(const char *log, const char *const *want, size_t n);

/* 256 bytes that pass for a cubin for sm_<sm> (sm 90: sm_90): the ELF
 * header of a CUDA 13 cubin (ELF ABI 8, EM_CUDA, e_flags naming the
 * arch), random bytes after it. Enough for the loader's checks and the
 * fake driver; nothing to run. */
void tt_fake_cubin(uint8_t b[256], int sm);

/* ============================================================ cuda_kernels.h */

#include "cuda_kernels.h"

#endif
