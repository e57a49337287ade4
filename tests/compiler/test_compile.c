/*
 * test_compile.c — end to end: build a request, tcc_prepare, tcc_compile
 * with the system C compiler, dlopen the .so, run tcc_entry on fresh
 * random inputs and compare with a float64 reference computed here.
 *
 * Inputs are drawn from a seeded generator (seed from the clock, printed;
 * TCC_TEST_SEED=<n> replays). Output storage is prefilled with a sentinel
 * so that writes outside an output's view are caught.
 *
 * TCC_TEST_SHOW_SOURCE=1 prints every generated source to stderr.
 *
 * Tolerances (|got - ref| <= atol + rtol * |ref|):
 *   float64: rtol 1e-12, atol 1e-12
 *   float32, one or two ops: rtol 1e-5, atol 1e-6 (libm float functions
 *            are within a few ulp)
 *   float32, chains: rtol 1e-4, atol 1e-5 (each op rounds to float; a
 *            chain of ~20 ops with transcendental steps compounds that)
 */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compiler.h"
#include "cpu_schedule.h"
#include "tcc_dtype.h"
#include "tcctest.h"

#define F32 TCC__V1__DTYPE__FLOAT32
#define F64 TCC__V1__DTYPE__FLOAT64
#define I32 TCC__V1__DTYPE__INT32

static unsigned seed;
static char identity[256];

/* ------------------------------------------------------------ random */

static int rng_int(int n) { return (int)(tt_rand() % (uint64_t)n); }

/* --------------------------------------------------------- test graph */

#define TG_MAX 400
#define SENTINEL 12345.0

typedef struct tv {
  char name[16];
  int dtype, rank;
  int64_t sizes[16], strides[16], offset;
  int64_t numel;
  int is_input;
  double lo, hi;           /* input range */
  double *ref;             /* dense row-major reference */
  Tcc__V1__TensorMeta *meta;
} tv;

enum { OP_UNARY, OP_BINARY, OP_SCALAR };

typedef struct top {
  const char *target;
  int kind, out, a, b;
  double s, alpha;
  int has_alpha, int_scalar;
} top;

typedef struct tg {
  reqb *b;
  int nv, nops, ninputs, noutputs;
  tv v[TG_MAX];
  top ops[TG_MAX];
  int inputs[16], outputs[16];
  double rtol, atol;
} tg;

static tg *tg_new(void) {
  tg *t = calloc(1, sizeof *t);
  t->b = reqb_new("");
  t->rtol = 1e-5;
  t->atol = 1e-6;
  return t;
}

static void tg_free(tg *t) {
  for (int i = 0; i < t->nv; i++) free(t->v[i].ref);
  reqb_free(t->b);
  free(t);
}

static int64_t numel_of(int rank, const int64_t *s) {
  int64_t n = 1;
  for (int d = 0; d < rank; d++) n *= s[d];
  return n;
}

static int tg_value(tg *t, int dtype, int rank, const int64_t *sizes, const int64_t *strides,
                    int64_t offset) {
  ck_assert_int_lt(t->nv, TG_MAX);
  tv *v = &t->v[t->nv];
  snprintf(v->name, sizeof v->name, "v%d", t->nv);
  v->dtype = dtype;
  v->rank = rank;
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    v->sizes[d] = sizes[d];
    v->strides[d] = strides ? strides[d] : s;
    s *= sizes[d] > 1 ? sizes[d] : 1;
  }
  v->offset = offset;
  v->numel = numel_of(rank, sizes);
  v->meta = reqb_value(t->b, v->name, dtype, rank, sizes, v->strides, offset);
  return t->nv++;
}

static int tg_input(tg *t, int dtype, int rank, const int64_t *sizes, const int64_t *strides,
                    int64_t offset, double lo, double hi) {
  int i = tg_value(t, dtype, rank, sizes, strides, offset);
  t->v[i].is_input = 1;
  t->v[i].lo = lo;
  t->v[i].hi = hi;
  reqb_input(t->b, t->v[i].name);
  t->inputs[t->ninputs++] = i;
  return i;
}

static int is_float_op(const char *target) {
  static const char *const f[] = {"aten.exp.", "aten.log.", "aten.sqrt.", "aten.sin.", "aten.cos.",
                                  "aten.tanh.", "aten.sigmoid.", "aten.div."};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (strncmp(target, f[i], strlen(f[i])) == 0) return 1;
  return 0;
}

static int result_dtype(int a, int b, const char *target) {
  int d = a == F64 || b == F64 ? F64 : (a == F32 || b == F32) ? F32 : a;
  if (d != F32 && d != F64 && is_float_op(target)) d = F32;
  return d;
}

static int tg_unary(tg *t, const char *target, int a) {
  const tv *x = &t->v[a];
  int o = tg_value(t, result_dtype(x->dtype, 0, target), x->rank, x->sizes, NULL, 0);
  reqb_unary(t->b, target, x->name, t->v[o].name);
  t->ops[t->nops++] = (top){.target = target, .kind = OP_UNARY, .out = o, .a = a};
  return o;
}

/* alpha: NAN = not given. */
static int tg_binary(tg *t, const char *target, int a, int b, double alpha) {
  const tv *x = &t->v[a], *y = &t->v[b];
  int64_t sizes[16];
  int r = x->rank > y->rank ? x->rank : y->rank;
  for (int i = 0; i < r; i++) {
    int64_t p = i < x->rank ? x->sizes[x->rank - 1 - i] : 1;
    int64_t q = i < y->rank ? y->sizes[y->rank - 1 - i] : 1;
    sizes[r - 1 - i] = p == 1 ? q : p;
  }
  /* zero-dim tensors do not decide the dtype when a dimensioned one is there */
  int dt = x->rank == 0 && y->rank > 0 ? result_dtype(y->dtype, 0, target)
         : y->rank == 0 && x->rank > 0 ? result_dtype(x->dtype, 0, target)
                                        : result_dtype(x->dtype, y->dtype, target);
  int o = tg_value(t, dt, r, sizes, NULL, 0);
  Tcc__V1__Node *n = reqb_binary(t->b, target, x->name, y->name, t->v[o].name);
  if (!isnan(alpha)) reqb_arg_float(t->b, n, "alpha", alpha);
  t->ops[t->nops++] = (top){.target = target, .kind = OP_BINARY, .out = o, .a = a, .b = b,
                            .alpha = alpha, .has_alpha = !isnan(alpha)};
  return o;
}

static int tg_scalar(tg *t, const char *target, int a, double s, int int_scalar, double alpha) {
  const tv *x = &t->v[a];
  int o = tg_value(t, result_dtype(x->dtype, 0, target), x->rank, x->sizes, NULL, 0);
  Tcc__V1__Node *n = reqb_node(t->b, target, t->v[o].name);
  reqb_arg_tensor(t->b, n, "", x->name);   /* positional this time */
  if (int_scalar) reqb_arg_int(t->b, n, "", (int64_t)s);
  else reqb_arg_float(t->b, n, "", s);
  if (!isnan(alpha)) reqb_arg_float(t->b, n, "alpha", alpha);
  t->ops[t->nops++] = (top){.target = target, .kind = OP_SCALAR, .out = o, .a = a, .s = s,
                            .alpha = alpha, .has_alpha = !isnan(alpha), .int_scalar = int_scalar};
  return o;
}

/* Returns value v; strides NULL keeps contiguous. */
static void tg_output(tg *t, int v, const int64_t *strides, int64_t offset) {
  tv *x = &t->v[v];
  if (strides)
    for (int d = 0; d < x->rank; d++) x->meta->strides[d] = x->strides[d] = strides[d];
  x->meta->storage_offset = x->offset = offset;
  reqb_output(t->b, x->name);
  t->outputs[t->noutputs++] = v;
}

/* ----------------------------------------------------------- storage */

static int64_t span_of(const tv *v) {
  if (v->numel == 0) return v->offset + 1;
  int64_t m = v->offset;
  for (int d = 0; d < v->rank; d++) m += (v->sizes[d] - 1) * v->strides[d];
  return m + 1;
}

static double load(const void *base, int dtype, int64_t i) {
  if (dtype == F64) return ((const double *)base)[i];
  if (dtype == F32) return ((const float *)base)[i];
  return ((const int32_t *)base)[i];
}

static void store(void *base, int dtype, int64_t i, double x) {
  if (dtype == F64) ((double *)base)[i] = x;
  else if (dtype == F32) ((float *)base)[i] = (float)x;
  else ((int32_t *)base)[i] = (int32_t)x;
}

/* Storage index of the row-major element number e of v. */
static int64_t storage_index(const tv *v, int64_t e) {
  int64_t off = v->offset;
  for (int d = v->rank - 1; d >= 0; d--) {
    int64_t i = v->sizes[d] ? e % v->sizes[d] : 0;
    e = v->sizes[d] ? e / v->sizes[d] : 0;
    off += i * v->strides[d];
  }
  return off;
}

/* Element of x (dense ref) read at output element e of shape (r, sizes). */
static double bcast(const tv *x, int r, const int64_t *sizes, int64_t e) {
  int64_t idx[16], off = 0, mul = 1;
  for (int d = r - 1; d >= 0; d--) {
    idx[d] = sizes[d] ? e % sizes[d] : 0;
    e = sizes[d] ? e / sizes[d] : 0;
  }
  for (int d = x->rank - 1; d >= 0; d--) {
    int od = d + r - x->rank;
    off += (x->sizes[d] == 1 ? 0 : idx[od]) * mul;
    mul *= x->sizes[d];
  }
  return x->ref[off];
}

static double apply(const char *target, double a, double b) {
  if (!strncmp(target, "aten.add.", 9)) return a + b;
  if (!strncmp(target, "aten.sub.", 9)) return a - b;
  if (!strncmp(target, "aten.mul.", 9)) return a * b;
  if (!strncmp(target, "aten.div.", 9)) return a / b;
  if (!strcmp(target, "aten.neg.default")) return -a;
  if (!strcmp(target, "aten.abs.default")) return fabs(a);
  if (!strcmp(target, "aten.exp.default")) return exp(a);
  if (!strcmp(target, "aten.log.default")) return log(a);
  if (!strcmp(target, "aten.sqrt.default")) return sqrt(a);
  if (!strcmp(target, "aten.sin.default")) return sin(a);
  if (!strcmp(target, "aten.cos.default")) return cos(a);
  if (!strcmp(target, "aten.tanh.default")) return tanh(a);
  if (!strcmp(target, "aten.sigmoid.default")) return 1.0 / (1.0 + exp(-a));
  if (!strcmp(target, "aten.relu.default")) return a < 0 ? 0.0 : a;
  ck_abort_msg("no reference for %s", target);
  return 0;
}

/* Float64 reference of every value, from the inputs' storage. */
static void reference(tg *t, void **in_storage) {
  for (int k = 0; k < t->ninputs; k++) {
    tv *v = &t->v[t->inputs[k]];
    free(v->ref);
    v->ref = malloc(sizeof(double) * (size_t)(v->numel ? v->numel : 1));
    for (int64_t e = 0; e < v->numel; e++)
      v->ref[e] = load(in_storage[k], v->dtype, storage_index(v, e));
  }
  for (int k = 0; k < t->nops; k++) {
    const top *op = &t->ops[k];
    tv *o = &t->v[op->out];
    free(o->ref);
    o->ref = malloc(sizeof(double) * (size_t)(o->numel ? o->numel : 1));
    for (int64_t e = 0; e < o->numel; e++) {
      double a = bcast(&t->v[op->a], o->rank, o->sizes, e);
      double b = op->kind == OP_BINARY ? bcast(&t->v[op->b], o->rank, o->sizes, e) : op->s;
      if (op->has_alpha) b *= op->alpha;
      o->ref[e] = apply(op->target, a, b);
    }
  }
}

static int close_enough(double got, double ref, double rtol, double atol) {
  if (isnan(ref)) return isnan(got);
  if (isinf(ref)) return got == ref;
  return fabs(got - ref) <= atol + rtol * fabs(ref);
}

/* ----------------------------------------------------- compile + run */

typedef int entry_fn(const void *const *, void *const *, void *);

typedef struct built {
  void *dl;
  entry_fn *entry;
  tcc_artifact art;
  Tcc__V1__Manifest *manifest;
  char dir[256];
} built;

/* A fresh scratch directory (asserted), in a static buffer. */
static char *make_tmpdir(void) {
  static char dir[256];
  char *d = tt_tmpdir("test");
  ck_assert_ptr_nonnull(d);
  snprintf(dir, sizeof dir, "%s", d);
  free(d);
  return dir;
}

/* Builds t (with the object cache in object_dir when not NULL). */
static void build_in(tg *t, built *out, const char *object_dir, int64_t object_max_bytes) {
  memset(out, 0, sizeof *out);
  size_t len;
  uint8_t *buf = reqb_pack(t->b, &len);
  tcc_prepared *p;
  tcc_error err;
  int rc = tcc_prepare_bytes(buf, len, identity, &p, &err);
  free(buf);
  ck_assert_msg(rc == 0, "prepare: %s", err.msg);
  snprintf(out->dir, sizeof out->dir, "%s", make_tmpdir());
  tcc_build_options o = {.cc = NULL, .work_dir = out->dir, .timeout_ms = 60000, .object_dir = object_dir,
                         .object_max_bytes = object_max_bytes, .identity = identity};
  rc = tcc_compile(p, &o, &out->art, &err);
  tcc_prepared_free(p);
  ck_assert_msg(rc == 0, "compile: %s", err.msg);
  ck_assert_int_eq(tt_dir_entries(out->dir), 0);   /* build dir cleaned up */
  ck_assert_int_eq(out->art.kind, TCC__V1__ARTIFACT_KIND__SHARED_OBJECT);
  uint8_t h[TCC_SHA256_BYTES];
  tcc_sha256(out->art.data, out->art.size, h);
  ck_assert(memcmp(h, out->art.sha256, sizeof h) == 0);
  out->dl = tt_load_kernel(out->dir, "k.so", out->art.data, out->art.size);
  ck_assert_msg(out->dl != NULL, "dlopen: %s", dlerror());
  out->entry = (entry_fn *)dlsym(out->dl, "tcc_entry");
  ck_assert_ptr_nonnull(out->entry);
  out->manifest = tcc__v1__manifest__unpack(NULL, out->art.manifest_len, out->art.manifest);
  ck_assert_ptr_nonnull(out->manifest);
  ck_assert_uint_eq(out->manifest->abi_version, 1);
  ck_assert_str_eq(out->manifest->entry, "tcc_entry");
  ck_assert_str_eq(out->manifest->compiler, identity);
  ck_assert_uint_eq(out->manifest->n_inputs, (size_t)t->ninputs);
  ck_assert_uint_eq(out->manifest->n_outputs, (size_t)t->noutputs);
  ck_assert_uint_eq(out->manifest->n_kernels, (size_t)out->art.kernels);
  ck_assert_int_ge(out->art.kernels, 1);
  ck_assert_ptr_nonnull(out->art.source);
  if (getenv("TCC_TEST_SHOW_SOURCE")) fputs(out->art.source, stderr);   /* debugging aid */
}

static void build(tg *t, built *out) { build_in(t, out, NULL, 0); }

static void unbuild(built *b) {
  if (b->dl) dlclose(b->dl);
  if (b->manifest) tcc__v1__manifest__free_unpacked(b->manifest, NULL);
  tcc_artifact_free(&b->art);
  tt_remove_tree(b->dir);
}

/* Runs the built kernel `rounds` times on fresh inputs and checks every
 * output element (and that nothing outside the outputs' views changed). */
static void run_and_check(tg *t, built *bt, int rounds) {
  for (int round = 0; round < rounds; round++) {
    void *in[16], *out[16];
    for (int k = 0; k < t->ninputs; k++) {
      tv *v = &t->v[t->inputs[k]];
      int64_t span = span_of(v);
      in[k] = malloc((size_t)span * (size_t)tcc_dtype_size(v->dtype));
      for (int64_t i = 0; i < span; i++) {
        double x = tt_uniform(v->lo, v->hi);
        if (v->dtype == I32) x = floor(x);
        store(in[k], v->dtype, i, x);
      }
    }
    for (int k = 0; k < t->noutputs; k++) {
      tv *v = &t->v[t->outputs[k]];
      int64_t span = span_of(v);
      out[k] = malloc((size_t)span * (size_t)tcc_dtype_size(v->dtype));
      for (int64_t i = 0; i < span; i++) store(out[k], v->dtype, i, SENTINEL);
    }
    void *ws = malloc((size_t)bt->manifest->workspace_bytes + 1);
    ck_assert_int_eq(bt->entry((const void *const *)in, (void *const *)out, ws), 0);
    free(ws);
    reference(t, in);
    for (int k = 0; k < t->noutputs; k++) {
      tv *v = &t->v[t->outputs[k]];
      int64_t span = span_of(v);
      char *touched = calloc((size_t)span, 1);
      for (int64_t e = 0; e < v->numel; e++) {
        int64_t si = storage_index(v, e);
        touched[si] = 1;
        double got = load(out[k], v->dtype, si), ref = v->ref[e];
        ck_assert_msg(close_enough(got, ref, t->rtol, t->atol),
                      "seed %u: output %d element %lld: got %.17g, want %.17g (|diff| %.3g)", seed,
                      k, (long long)e, got, ref, fabs(got - ref));
      }
      for (int64_t i = 0; i < span; i++)
        if (!touched[i])
          ck_assert_msg(load(out[k], v->dtype, i) == SENTINEL,
                        "seed %u: output %d storage %lld outside the view was written", seed, k,
                        (long long)i);
      free(touched);
    }
    for (int k = 0; k < t->ninputs; k++) free(in[k]);
    for (int k = 0; k < t->noutputs; k++) free(out[k]);
  }
}

/* Builds, runs, checks; returns the number of kernels. */
static int check_graph(tg *t) {
  built bt;
  build(t, &bt);
  run_and_check(t, &bt, 3);
  int k = bt.art.kernels;
  unbuild(&bt);
  return k;
}

/* ------------------------------------------------------------- tests */

/* sin(x) + cos(y) on [rows, cols] float32 inputs in [-4, 4). */
static tg *sin_cos_graph(int64_t rows, int64_t cols) {
  tg *t = tg_new();
  int64_t s[] = {rows, cols};
  int x = tg_input(t, F32, 2, s, NULL, 0, -4, 4), y = tg_input(t, F32, 2, s, NULL, 0, -4, 4);
  int z = tg_binary(t, "aten.add.Tensor", tg_unary(t, "aten.sin.default", x),
                    tg_unary(t, "aten.cos.default", y), NAN);
  tg_output(t, z, NULL, 0);
  return t;
}

START_TEST(sin_cos) {
  tg *t = sin_cos_graph(10, 10);
  built bt;
  build(t, &bt);
  ck_assert_int_eq(bt.art.kernels, 1);                      /* fused */
  ck_assert_ptr_nonnull(strstr(bt.art.source, "sinf("));
  ck_assert_ptr_nonnull(strstr(bt.art.source, "cosf("));
  ck_assert_ptr_nonnull(strstr(bt.art.source, "int tcc_entry("));
  ck_assert_ptr_nonnull(strstr(bt.art.source, "i0 < 100;"));  /* one flat loop */
  ck_assert_ptr_null(strstr(bt.art.source, "tcc_gov_begin"));  /* serial: no governor */
  ck_assert_str_eq(bt.manifest->target, "cpu:x86-64-v2");
  ck_assert_int_eq(bt.manifest->kernels[0]->numel, 100);
  ck_assert_str_eq(bt.manifest->kernels[0]->kind, "pointwise");
  ck_assert_uint_eq(bt.manifest->outputs[0]->n_sizes, 2);
  ck_assert(bt.art.compile_ms > 0);
  run_and_check(t, &bt, 3);
  unbuild(&bt);
  tg_free(t);
}
END_TEST

/* A program with a parallel loop runs its calls under the thread
 * governor (cpu/prelude.c): calls 1-2 on every OpenMP thread, 3-4 on the
 * calling thread, then the faster mode with probes of the other. Every
 * call's outputs are right, and the caller's OpenMP thread count is the
 * same after each call as before (PyTorch's own ops read it). */
START_TEST(thread_governor) {
  tg *t = sin_cos_graph(512, 512);
  built bt;
  build(t, &bt);
  ck_assert_ptr_nonnull(strstr(bt.art.source, "#pragma omp parallel for"));
  ck_assert_ptr_nonnull(strstr(bt.art.source, "tcc_gov_begin(&tcc_threads)"));
  void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);   /* the kernel's */
  ck_assert_ptr_nonnull(gomp);
  int (*get_max)(void) = (int (*)(void))dlsym(gomp, "omp_get_max_threads");
  void (*set_num)(int) = (void (*)(int))dlsym(gomp, "omp_set_num_threads");
  ck_assert(get_max && set_num);
  for (int threads = 1; threads <= 3; threads++) {
    set_num(threads);
    for (int call = 0; call < 12; call++) {
      run_and_check(t, &bt, 1);
      ck_assert_int_eq(get_max(), threads);
    }
  }
  dlclose(gomp);
  unbuild(&bt);
  tg_free(t);
}
END_TEST

/* The governor's choices (cpu/prelude.c's tcc_cpu_governor, compiled
 * into a driver with a stand-in OpenMP whose thread count it reads):
 * each scenario gives a call's time on all threads (t0) and on one (t1):
 * quiet, a noisy start, a busy core, a core freed, a neighbour's time
 * slices from the start and from call 30, a quiet machine's hiccups;
 * and the driver prints the mode of each of 600 calls ('0' all threads,
 * '1' one) and 'X' where a call leaves the thread count changed. */
static const char governor_driver[] =
    "static int threads = 2;\n"
    "int omp_get_max_threads(void) { return threads; }\n"
    "void omp_set_num_threads(int n) { threads = n; }\n"
    "%s\n"
    "#include <stdio.h>\n"
    "int main(int argc, char **argv) {\n"
    "  int scenario = argv[1][0] - '0';\n"
    "  for (int call = 0; call < 600; call++) {\n"
    "    int saved, mode = tcc_gov_begin(&saved), one = threads == 1;\n"
    "    int64_t t0 = 1000000, t1 = 2000000;   /* quiet: all threads 2x faster */\n"
    "    if (scenario == 1 && (call == 1 || call == 2)) t0 = 5000000;   /* noisy start */\n"
    "    if (scenario == 2 || (scenario == 3 && call < 200)) t0 = 4000000;   /* a busy core */\n"
    "    if (scenario == 4) t0 = call %% 4 == 1 ? 40000000 : 800000, t1 = 1100000;   /* waits for a slice */\n"
    "    if (scenario == 5 && call %% 150 == 0 && call) t0 = 40000000;   /* a quiet machine's hiccups */\n"
    "    if (scenario == 6)   /* slices from call 30, three calls in ten at random */\n"
    "      t0 = call >= 30 && ((unsigned)call * 2654435761u >> 13) %% 10 < 3 ? 40000000 : 800000, t1 = 1100000;\n"
    "    tcc_gov_end(mode, saved, tcc_gov_now() - (one ? t1 : t0));\n"
    "    putchar(threads != 2 ? 'X' : one ? '1' : '0');\n"
    "  }\n"
    "  return 0;\n"
    "}\n";

static int count_char(const char *s, int from, int to, char c) {
  int n = 0;
  for (int i = from; i < to; i++) n += s[i] == c;
  return n;
}

START_TEST(thread_governor_choices) {
  char *dir = make_tmpdir(), src[300], bin[300], cmd[700];
  snprintf(src, sizeof src, "%s/gov.c", dir);
  snprintf(bin, sizeof bin, "%s/gov", dir);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#include <stdint.h>\n");
  fprintf(f, governor_driver, tcc_cpu_governor);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -std=c11 -O1 -o %s %s", bin, src);
  ck_assert_int_eq(system(cmd), 0);
  char modes[7][601];
  for (int sc = 0; sc < 7; sc++) {
    snprintf(cmd, sizeof cmd, "%s %d", bin, sc);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(modes[sc], 1, 600, p);
    modes[sc][n] = 0;
    ck_assert_int_eq(pclose(p), 0);
    ck_assert_uint_eq(n, 600);
    ck_assert_ptr_null(strchr(modes[sc], 'X'));   /* the thread count restored */
    ck_assert_int_eq(strncmp(modes[sc], "00011", 5), 0);   /* the samples */
  }
  /* quiet: all threads but for the probes (at most 1 call in 16 after the
   * samples, 1 in 50 from call 100) */
  ck_assert_int_le(count_char(modes[0], 5, 600, '1'), 595 / 16);
  ck_assert_int_le(count_char(modes[0], 100, 600, '1'), 500 / 50);
  /* a noisy start (calls 1-2 slowed 5x) makes one thread look faster; the
   * first probe of all threads and its confirmation right after undo that
   * (a probe a whole gap later left calls 6-84 on one thread) */
  ck_assert_int_le(count_char(modes[1], 5, 40, '1'), 3);
  ck_assert_int_le(count_char(modes[1], 40, 600, '1'), 560 / 50);
  /* a busy core (all threads 2x slower than one): one thread but for the
   * probes */
  ck_assert_int_le(count_char(modes[2], 5, 600, '0'), 595 / 16);
  ck_assert_int_le(count_char(modes[2], 100, 600, '0'), 500 / 50);
  /* the core freed at call 200: all threads again within 80 calls */
  ck_assert_int_le(count_char(modes[3], 100, 200, '0'), 100 / 25);
  ck_assert_int_le(count_char(modes[3], 280, 600, '1'), 320 / 25);
  /* a neighbour's time slices: on all threads most calls are faster than
   * on one (0.8 against 1.1 ms) but one in four waits 40 ms: one thread
   * but for the probes (a median of all threads' calls chose them) */
  ck_assert_int_le(count_char(modes[4], 20, 600, '0'), 580 / 50);
  /* a quiet machine's lone hiccups (40 ms at calls 150, 300, 450) leave
   * all threads on */
  ck_assert_int_le(count_char(modes[5], 100, 600, '1'), 500 / 50);
  /* the slices from call 30, three calls in ten, after a quiet start:
   * one thread but for the probes (leaving all threads puts off their
   * next probe by a whole gap) */
  ck_assert_int_le(count_char(modes[6], 40, 600, '0'), 560 / 50);
}
END_TEST

/* Every supported op in one chain, with broadcasting ([4,1,5] x [3,5]),
 * a transposed input, storage offsets, a permuted output layout and a
 * second output: one fused kernel. */
static void chain(int dtype) {
  tg *t = tg_new();
  if (dtype == F32) {
    t->rtol = 1e-4;
    t->atol = 1e-5;
  } else {
    t->rtol = t->atol = 1e-12;
  }
  /* x: [4,1,5] stored transposed ([5,1,4] contiguous), offset 3 */
  int x = tg_input(t, dtype, 3, (int64_t[]){4, 1, 5}, (int64_t[]){1, 4, 4}, 3, -2, 2);
  /* y: [3,5] positive, rows padded to 8, offset 7 */
  int y = tg_input(t, dtype, 2, (int64_t[]){3, 5}, (int64_t[]){8, 1}, 7, 0.5, 2);
  int a1 = tg_binary(t, "aten.add.Tensor", x, y, 0.5);
  int a2 = tg_binary(t, "aten.sub.Tensor", a1, x, 2.0);
  int a3 = tg_binary(t, "aten.mul.Tensor", a2, y, NAN);
  int a4 = tg_binary(t, "aten.div.Tensor", a3, y, NAN);
  int a5 = tg_scalar(t, "aten.add.Scalar", a4, 1.5, 0, NAN);
  int a6 = tg_scalar(t, "aten.sub.Scalar", a5, 0.25, 0, 2.0);
  int a7 = tg_scalar(t, "aten.mul.Scalar", a6, -3, 1, NAN);
  int a8 = tg_scalar(t, "aten.div.Scalar", a7, 7, 1, NAN);
  int a9 = tg_unary(t, "aten.neg.default", a8);
  int a10 = tg_unary(t, "aten.abs.default", a9);
  int a11 = tg_unary(t, "aten.exp.default", tg_unary(t, "aten.neg.default", a10));
  int a12 = tg_unary(t, "aten.log.default", tg_scalar(t, "aten.add.Scalar", a11, 1, 1, NAN));
  int a13 = tg_unary(t, "aten.sqrt.default", a12);
  int a14 = tg_unary(t, "aten.sin.default", a13);
  int a15 = tg_unary(t, "aten.cos.default", a14);
  int a16 = tg_unary(t, "aten.tanh.default", a15);
  int a17 = tg_unary(t, "aten.sigmoid.default", a16);
  int a18 = tg_unary(t, "aten.relu.default", tg_scalar(t, "aten.sub.Scalar", a17, 0.6, 0, NAN));
  /* output 0: [4,3,5] laid out as [5,4,3] (dims permuted), offset 2 */
  tg_output(t, a18, (int64_t[]){3, 1, 12}, 2);
  tg_output(t, a9, NULL, 0);
  ck_assert_int_eq(check_graph(t), 1);
  tg_free(t);
}

START_TEST(chain_f32) { chain(F32); }
END_TEST

START_TEST(chain_f64) { chain(F64); }
END_TEST

START_TEST(broadcast) {
  for (int dt = F32; dt <= F64; dt++) {
    tg *t = tg_new();
    if (dt == F64) t->rtol = t->atol = 1e-12;
    int a = tg_input(t, dt, 3, (int64_t[]){4, 1, 5}, NULL, 0, -3, 3);
    int b = tg_input(t, dt, 2, (int64_t[]){3, 5}, NULL, 0, -3, 3);
    tg_output(t, tg_binary(t, "aten.add.Tensor", a, b, NAN), NULL, 0);
    /* [1,5,1] * [3,1,2] -> [3,5,2] */
    int c = tg_input(t, dt, 3, (int64_t[]){1, 5, 1}, NULL, 0, -3, 3);
    int d = tg_input(t, dt, 3, (int64_t[]){3, 1, 2}, NULL, 0, -3, 3);
    tg_output(t, tg_binary(t, "aten.mul.Tensor", c, d, NAN), NULL, 0);
    ck_assert_int_eq(check_graph(t), 2);   /* two iteration spaces */
    tg_free(t);
  }
}
END_TEST

START_TEST(strided) {
  tg *t = tg_new();
  /* transposed input and output, both with offsets */
  int x = tg_input(t, F32, 2, (int64_t[]){6, 7}, (int64_t[]){1, 6}, 5, -1, 1);
  int y = tg_input(t, F32, 2, (int64_t[]){6, 7}, (int64_t[]){14, 2}, 1, -1, 1);   /* every other */
  int z = tg_binary(t, "aten.sub.Tensor", tg_unary(t, "aten.tanh.default", x), y, NAN);
  tg_output(t, z, (int64_t[]){1, 6}, 4);
  ck_assert_int_eq(check_graph(t), 1);
  tg_free(t);
}
END_TEST

START_TEST(small_and_empty) {
  tg *t = tg_new();
  int s = tg_input(t, F32, 0, NULL, NULL, 0, -1, 1);                 /* 0-dim */
  int v = tg_input(t, F32, 1, (int64_t[]){3}, NULL, 0, -1, 1);
  tg_output(t, tg_binary(t, "aten.mul.Tensor", s, v, NAN), NULL, 0);  /* [] * [3] */
  tg_output(t, tg_unary(t, "aten.exp.default", s), NULL, 0);         /* [] output */
  int e = tg_input(t, F32, 2, (int64_t[]){0, 3}, NULL, 0, -1, 1);     /* size-0 */
  tg_output(t, tg_binary(t, "aten.add.Tensor", e, v, NAN), NULL, 0);
  int o = tg_input(t, F32, 3, (int64_t[]){1, 1, 4}, (int64_t[]){9, 9, 2}, 1, -1, 1);
  tg_output(t, tg_unary(t, "aten.neg.default", o), NULL, 0);
  check_graph(t);
  tg_free(t);
}
END_TEST

START_TEST(mixed_dtypes) {
  tg *t = tg_new();
  int a = tg_input(t, F32, 2, (int64_t[]){3, 4}, NULL, 0, -2, 2);
  int b = tg_input(t, F64, 1, (int64_t[]){4}, NULL, 0, -2, 2);
  int c = tg_input(t, F64, 0, NULL, NULL, 0, -2, 2);
  int ab = tg_binary(t, "aten.add.Tensor", a, b, NAN);   /* float64 */
  int ac = tg_binary(t, "aten.mul.Tensor", a, c, NAN);   /* float32: c is zero-dim */
  ck_assert_int_eq(t->v[ab].dtype, F64);
  ck_assert_int_eq(t->v[ac].dtype, F32);
  tg_output(t, ab, NULL, 0);
  tg_output(t, ac, NULL, 0);
  int i = tg_input(t, I32, 1, (int64_t[]){6}, NULL, 0, -5, 5);
  tg_output(t, tg_unary(t, "aten.exp.default", i), NULL, 0);   /* int32 -> float32 */
  tg_output(t, tg_scalar(t, "aten.div.Scalar", i, 4, 1, NAN), NULL, 0);
  check_graph(t);
  tg_free(t);
}
END_TEST

START_TEST(special_values) {
  tg *t = tg_new();
  t->rtol = t->atol = 0;
  int x = tg_input(t, F64, 1, (int64_t[]){5}, NULL, 0, -1, 1);
  tg_output(t, tg_scalar(t, "aten.add.Scalar", x, INFINITY, 0, NAN), NULL, 0);
  tg_output(t, tg_scalar(t, "aten.mul.Scalar", x, NAN, 0, NAN), NULL, 0);
  tg_output(t, tg_scalar(t, "aten.sub.Scalar", x, -INFINITY, 0, NAN), NULL, 0);
  int y = tg_input(t, F32, 1, (int64_t[]){5}, NULL, 0, -1, 1);
  tg_output(t, tg_scalar(t, "aten.add.Scalar", y, -0.0, 0, NAN), NULL, 0);
  tg_output(t, tg_scalar(t, "aten.mul.Scalar", y, 0.1, 0, NAN), NULL, 0);   /* rounds to float */
  t->rtol = 1e-7;
  check_graph(t);
  tg_free(t);
}
END_TEST

START_TEST(constants_and_copies) {
  tg *t = tg_new();
  int x = tg_input(t, F64, 2, (int64_t[]){3, 5}, NULL, 0, -2, 2);
  t->rtol = t->atol = 1e-12;
  /* a constant: not an input, its data travels in the request */
  int w = tg_value(t, F64, 1, (int64_t[]){5}, NULL, 0);
  double wd[5] = {0.0, 0.1, -0.2, 1e300, -3.5};
  reqb_constant(t->b, t->v[w].name, wd, sizeof wd);
  t->v[w].ref = malloc(sizeof wd);
  memcpy(t->v[w].ref, wd, sizeof wd);
  int s = tg_binary(t, "aten.mul.Tensor", x, w, NAN);
  tg_output(t, s, NULL, 0);
  tg_output(t, x, NULL, 0);                      /* an input returned */
  tg_output(t, s, NULL, 0);                      /* the same value twice */
  int c = tg_unary(t, "aten.cos.default", s);    /* an output used again */
  tg_output(t, c, NULL, 0);
  check_graph(t);
  tg_free(t);
}
END_TEST

/* Fusion limits leave intermediates in the workspace: a chain deeper than
 * TCC_MAX_EXPR_DEPTH / 2 is cut into several kernels, and a large
 * expression read by two consumers is computed once. */
START_TEST(workspace_temporaries) {
  tg *t = tg_new();
  t->rtol = t->atol = 1e-12;
  int x = tg_input(t, F64, 2, (int64_t[]){3, 7}, NULL, 0, -2, 2);
  int v = x;
  for (int i = 0; i < 150; i++) v = tg_unary(t, i % 2 ? "aten.cos.default" : "aten.sin.default", v);
  tg_output(t, v, NULL, 0);
  built bt;
  build(t, &bt);
  ck_assert_int_gt(bt.art.kernels, 1);
  ck_assert_int_gt(bt.manifest->workspace_bytes, 0);
  run_and_check(t, &bt, 2);
  unbuild(&bt);
  tg_free(t);

  t = tg_new();
  t->rtol = t->atol = 1e-12;
  x = tg_input(t, F64, 2, (int64_t[]){4, 5}, NULL, 0, -2, 2);
  int y = tg_input(t, F64, 2, (int64_t[]){4, 5}, NULL, 0, -2, 2);
  v = x;
  for (int i = 0; i < 70; i++) v = tg_unary(t, "aten.sin.default", v);
  tg_output(t, tg_binary(t, "aten.add.Tensor", v, y, NAN), NULL, 0);
  tg_output(t, tg_binary(t, "aten.mul.Tensor", v, y, NAN), NULL, 0);
  build(t, &bt);
  ck_assert_int_eq(bt.art.kernels, 2);                        /* shared, then both outputs */
  ck_assert_int_eq(bt.manifest->workspace_bytes, 4 * 5 * 8 + 64 - (4 * 5 * 8) % 64);
  run_and_check(t, &bt, 2);
  unbuild(&bt);
  tg_free(t);
}
END_TEST

/* Random graphs: random shapes with broadcasting, layouts, offsets, op
 * chains (kept well-conditioned: log/sqrt/div see positive operands). */
START_TEST(random_graphs) {
  static const char *const unary[] = {"aten.neg.default", "aten.abs.default", "aten.sin.default",
                                      "aten.cos.default", "aten.tanh.default",
                                      "aten.sigmoid.default", "aten.relu.default"};
  static const char *const binary[] = {"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor"};
  static const char *const scalar[] = {"aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar"};
  static const int64_t dims[] = {1, 2, 3, 5, 8, 13};
  for (int iter = 0; iter < 12; iter++) {
    tg *t = tg_new();
    int dt = rng_int(2) ? F64 : F32;
    if (dt == F64) t->rtol = t->atol = 1e-12;
    else t->rtol = 1e-4, t->atol = 1e-5;
    int r = rng_int(5);
    int64_t out[4];
    for (int d = 0; d < r; d++) out[d] = dims[rng_int(6)];
    int vals[TG_MAX], nvals = 0;
    int nin = 1 + rng_int(3);
    for (int k = 0; k < nin; k++) {
      int ri = r ? rng_int(r + 1) : 0;
      int64_t s[4], st[4];
      for (int d = 0; d < ri; d++) s[d] = rng_int(3) ? out[r - ri + d] : 1;
      /* a random dim order, optionally padded */
      int perm[4];
      for (int d = 0; d < ri; d++) perm[d] = d;
      for (int d = ri - 1; d > 0; d--) {
        int j = rng_int(d + 1), tmp = perm[d];
        perm[d] = perm[j];
        perm[j] = tmp;
      }
      int64_t m = 1 + rng_int(2);
      for (int d = ri - 1; d >= 0; d--) {
        st[perm[d]] = m;
        m *= s[perm[d]] + rng_int(2);
      }
      vals[nvals++] = tg_input(t, dt, ri, s, st, rng_int(4), -2, 2);
    }
    int nops = 1 + rng_int(8);
    int last = vals[0];
    for (int k = 0; k < nops; k++) {
      int a = vals[rng_int(nvals)], b = vals[rng_int(nvals)];
      switch (rng_int(6)) {
      case 0: last = tg_unary(t, unary[rng_int(7)], a); break;
      case 1: {   /* add/sub take alpha, mul does not */
        int which = rng_int(3);
        last = tg_binary(t, binary[which], a, b, which < 2 && rng_int(2) ? 0.5 : NAN);
        break;
      }
      case 2: last = tg_scalar(t, scalar[rng_int(3)], a, tt_uniform(-2, 2), 0, NAN); break;
      case 3: {   /* a / (|b| + 1) */
        int d = tg_scalar(t, "aten.add.Scalar", tg_unary(t, "aten.abs.default", b), 1, 1, NAN);
        last = tg_binary(t, "aten.div.Tensor", a, d, NAN);
        break;
      }
      case 4: {   /* log(|a| + 1), sqrt(|a|) */
        int p = tg_unary(t, "aten.abs.default", a);
        last = rng_int(2) ? tg_unary(t, "aten.sqrt.default", p)
                          : tg_unary(t, "aten.log.default",
                                     tg_scalar(t, "aten.add.Scalar", p, 1, 1, NAN));
        break;
      }
      default:    /* exp(tanh(a)) */
        last = tg_unary(t, "aten.exp.default", tg_unary(t, "aten.tanh.default", a));
        break;
      }
      vals[nvals++] = last;
    }
    /* output: the last value, in a random dim order */
    tv *L = &t->v[last];
    int64_t st[16], m = 1;
    int perm[16];
    for (int d = 0; d < L->rank; d++) perm[d] = d;
    for (int d = L->rank - 1; d > 0; d--) {
      int j = rng_int(d + 1), tmp = perm[d];
      perm[d] = perm[j];
      perm[j] = tmp;
    }
    for (int d = L->rank - 1; d >= 0; d--) {
      st[perm[d]] = m;
      m *= L->sizes[perm[d]];
    }
    tg_output(t, last, st, rng_int(3));
    if (rng_int(2)) tg_output(t, vals[rng_int(nvals)], NULL, 0);
    check_graph(t);
    tg_free(t);
  }
}
END_TEST

/* -------------------------------------------------- failure handling */

static tcc_prepared *prepare_sin(void) {
  tg *t = tg_new();
  int x = tg_input(t, F32, 1, (int64_t[]){8}, NULL, 0, -1, 1);
  tg_output(t, tg_unary(t, "aten.sin.default", x), NULL, 0);
  tcc_prepared *p;
  tcc_error err;
  ck_assert_int_eq(tcc_prepare(reqb_req(t->b), identity, &p, &err), 0);
  tg_free(t);
  return p;
}

static void write_script(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\n%s\n", body);
  fclose(f);
  chmod(path, 0755);
}

static double wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The object cache (cpu/build.c): a second build of a program takes
 * every kernel body from the object the first one stored, and computes
 * the same; a damaged object is a miss (and removed); an object that
 * will not link costs a rebuild without the cache, not a failure; past
 * object_max_bytes the objects go. */
static int count_objects(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strlen(e->d_name) == 66 && strcmp(e->d_name + 64, ".o") == 0) n++;
  if (d) closedir(d);
  return n;
}

static void first_object(const char *dir, char *path, size_t size) {
  DIR *d = opendir(dir);
  struct dirent *e;
  path[0] = '\0';
  while (d && (e = readdir(d)))
    if (strlen(e->d_name) == 66 && strcmp(e->d_name + 64, ".o") == 0) snprintf(path, size, "%s/%s", dir, e->d_name);
  if (d) closedir(d);
  ck_assert_msg(path[0], "no object in %s", dir);
}

START_TEST(object_cache) {
  char objects[300];
  snprintf(objects, sizeof objects, "%s", make_tmpdir());
  strcat(objects, "/objects");
  int64_t rows = 64 * tt_rand_range(2, 8);
  tg *t = sin_cos_graph(rows, 512); /* parallel: OpenMP must come with the object */
  built a, b;
  build_in(t, &a, objects, 0);
  ck_assert_int_ge(a.art.bodies, 1);
  ck_assert_int_eq(a.art.bodies_reused, 0);
  ck_assert_ptr_nonnull(strstr(a.art.source, "#ifndef TCC_HAVE_B"));
  ck_assert_int_eq(count_objects(objects), 1);
  run_and_check(t, &a, 2);
  build_in(t, &b, objects, 0);
  ck_assert_int_eq(b.art.bodies_reused, a.art.bodies);
  ck_assert_str_eq(b.art.source, a.art.source);  /* the source does not depend on the cache */
  ck_assert_int_eq(count_objects(objects), 1);   /* nothing new to store */
  run_and_check(t, &b, 2);
  unbuild(&b);

  /* damaged: a miss, removed, stored again */
  char path[600];
  first_object(objects, path, sizeof path);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 100, SEEK_SET);
  fputc(0x5a ^ fgetc(f), f);
  fclose(f);
  build_in(t, &b, objects, 0);
  ck_assert_int_eq(b.art.bodies_reused, 0);
  ck_assert_int_eq(count_objects(objects), 1);
  run_and_check(t, &b, 1);
  unbuild(&b);

  /* an object that passes its digest but will not link: built without */
  first_object(objects, path, sizeof path);
  uint8_t junk[512];
  tt_rand_bytes(junk, sizeof junk);
  uint8_t d[TCC_SHA256_BYTES];
  char hex[TCC_SHA256_HEX], junk_path[700], index_dir[400], cmd[1400];
  tcc_sha256(junk, sizeof junk, d);
  tcc_hex_encode(d, sizeof d, hex);
  snprintf(junk_path, sizeof junk_path, "%s/%s.o", objects, hex);
  f = fopen(junk_path, "wb");
  fwrite(junk, 1, sizeof junk, f);
  fclose(f);
  snprintf(index_dir, sizeof index_dir, "%s/index", objects);
  snprintf(cmd, sizeof cmd, "for i in %s/*; do echo 'tccd-object/1 %s 0' > $i; done", index_dir, hex);
  ck_assert_int_eq(system(cmd), 0);
  build_in(t, &b, objects, 0);
  ck_assert_int_eq(b.art.bodies_reused, 0);
  ck_assert_int_eq(access(junk_path, F_OK), -1);  /* the suspect is gone */
  ck_assert_int_eq(count_objects(objects), 1);    /* the bodies stored again */
  run_and_check(t, &b, 1);
  unbuild(&b);

  /* over the budget, the next store prunes: every object goes */
  tg *t2 = sin_cos_graph(rows + 64, 512); /* other bounds: another body */
  build_in(t2, &b, objects, 1);
  ck_assert_int_eq(b.art.bodies_reused, 0);
  ck_assert_int_eq(count_objects(objects), 0);
  run_and_check(t2, &b, 1);
  unbuild(&b);
  tg_free(t2);
  unbuild(&a);
  tg_free(t);
}
END_TEST

START_TEST(compiler_timeout) {
  char *dir = make_tmpdir(), script[300], work[300];
  snprintf(script, sizeof script, "%s/slowcc", dir);
  snprintf(work, sizeof work, "%s/work", dir);
  mkdir(work, 0700);
  write_script(script, "sleep 30");
  tcc_prepared *p = prepare_sin();
  tcc_build_options o = {.cc = script, .work_dir = work, .timeout_ms = 300};
  tcc_artifact art;
  tcc_error err;
  double t0 = wall_ms();
  ck_assert_int_eq(tcc_compile(p, &o, &art, &err), TCC_E_DEADLINE_EXCEEDED);
  double took = wall_ms() - t0;
  ck_assert_msg(took < 5000, "timeout took %.0f ms", took);
  ck_assert_ptr_nonnull(strstr(err.msg, "did not finish within 300 ms"));
  ck_assert_ptr_null(art.data);
  ck_assert_int_eq(tt_dir_entries(work), 0);
  tcc_prepared_free(p);
  tt_remove_tree(dir);
}
END_TEST

START_TEST(compiler_failure) {
  char *dir = make_tmpdir(), script[300];
  tcc_prepared *p = prepare_sin();
  tcc_artifact art;
  tcc_error err;
  tcc_build_options o = {.cc = "/bin/false", .work_dir = dir};
  ck_assert_int_eq(tcc_compile(p, &o, &art, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "building the kernel"));
  ck_assert_ptr_nonnull(strstr(err.msg, "'/bin/false' exited with status 1"));

  snprintf(script, sizeof script, "%s/badcc", dir);
  write_script(script, "echo 'kernel.c:3:1: error: boom' >&2; exit 2");
  o.cc = script;
  ck_assert_int_eq(tcc_compile(p, &o, &art, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "exited with status 2"));
  ck_assert_ptr_nonnull(strstr(err.msg, "error: boom"));

  /* transient failures (common/tcc_spawn.c's table): each its own class */
  static const struct {
    const char *body;
    int code;
    const char *words;
  } transient[] = {
      {"kill -9 $$", TCC_E_UNAVAILABLE, "killed by signal 9"},
      {"echo 'gcc: fatal error: Killed signal terminated program cc1' >&2; exit 1", TCC_E_UNAVAILABLE,
       "Killed signal terminated program"},
      {"echo 'cc1: out of memory allocating 4072 bytes' >&2; exit 1", TCC_E_RESOURCE_EXHAUSTED, "out of memory"},
      {"echo '/tmp/ccA.s: No space left on device' >&2; exit 1", TCC_E_RESOURCE_EXHAUSTED, "No space left"},
      {"exec /nonexistent/bin/cc1", TCC_E_UNAVAILABLE, "missing or not executable"},
  };
  for (size_t i = 0; i < sizeof transient / sizeof transient[0]; i++) {
    unlink(script);
    write_script(script, transient[i].body);
    ck_assert_int_eq(tcc_compile(p, &o, &art, &err), transient[i].code);
    ck_assert_msg(strstr(err.msg, transient[i].words), "%s: %s", transient[i].body, err.msg);
  }

  o.cc = "/nonexistent/cc";
  ck_assert_int_eq(tcc_compile(p, &o, &art, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "cannot run"));
  ck_assert_int_eq(tt_dir_entries(dir), 1);   /* only the script */

  char missing[4200];
  snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
  tcc_build_options nodir = {.work_dir = missing};
  ck_assert_int_eq(tcc_compile(p, &nodir, &art, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "build directory"));
  tcc_prepared_free(p);
  tt_remove_tree(dir);
}
END_TEST

START_TEST(unsupported_dtype) {
  tg *t = tg_new();
  int a = tg_input(t, I32, 2, (int64_t[]){4, 4}, NULL, 0, -3, 3);
  int o = tg_value(t, I32, 2, (int64_t[]){4, 4}, NULL, 0);
  Tcc__V1__Node *n = reqb_node(t->b, "aten.mm.default", t->v[o].name);
  reqb_arg_tensor(t->b, n, "self", t->v[a].name);
  reqb_arg_tensor(t->b, n, "mat2", t->v[a].name);
  reqb_output(t->b, t->v[o].name);
  tcc_prepared *p;
  tcc_error err;
  ck_assert_int_eq(tcc_prepare(reqb_req(t->b), identity, &p, &err), 0);
  tcc_artifact art;
  ck_assert_int_eq(tcc_compile(p, NULL, &art, &err), TCC_E_UNIMPLEMENTED);
  ck_assert_str_eq(err.msg,
                   "node 0 (aten.mm.default): int32 matmul is not supported by the CPU backend");
  tcc_prepared_free(p);
  tg_free(t);
}
END_TEST

START_TEST(dumps_and_kept_sources) {
  char *dir = make_tmpdir();
  tcc_prepared *p = prepare_sin();
  setenv("TCC_DUMP", "1", 1);
  tcc_build_options o = {.work_dir = dir, .keep_sources = 1};
  tcc_artifact art;
  tcc_error err;
  ck_assert_msg(tcc_compile(p, &o, &art, &err) == 0, "%s", err.msg);
  unsetenv("TCC_DUMP");
  static const char *const files[] = {"00-graph.txt", "01-lower.txt", "02-fuse.txt",
                                      "03-split.txt", "04-place.txt", "05-schedule.txt",
                                      "06-kernel.c"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/%s", dir, p->hash_hex, files[i]);
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0 && st.st_size > 0, "missing %s", path);
  }
  ck_assert_int_eq(tt_dir_entries(dir), 2);   /* the dump dir and the kept build dir */
  tcc_artifact_free(&art);
  tcc_prepared_free(p);
  tt_remove_tree(dir);
}
END_TEST

/* Nothing the client wrote reaches the source but numbers. */
START_TEST(source_hygiene) {
  reqb *b = reqb_new("x86-64-v3");
  const char *evil = "x */ #include \"/etc/passwd\" /*";
  reqb_value(b, evil, F32, 1, (int64_t[]){4}, NULL, 0);
  reqb_value(b, "evil\nout", F32, 1, (int64_t[]){4}, NULL, 0);
  reqb_input(b, evil);
  reqb_unary(b, "aten.relu.default", evil, "evil\nout");
  reqb_output(b, "evil\nout");
  reqb_req(b)->client = reqb_str(b, "client */ evil");
  tcc_prepared *p;
  tcc_error err;
  ck_assert_int_eq(tcc_prepare(reqb_req(b), identity, &p, &err), 0);
  tcc_artifact art;
  ck_assert_msg(tcc_compile(p, NULL, &art, &err) == 0, "%s", err.msg);
  ck_assert_ptr_null(strstr(art.source, "passwd"));
  ck_assert_ptr_null(strstr(art.source, "evil"));
  ck_assert_ptr_nonnull(strstr(art.source, "cpu:x86-64-v3"));
  tcc_artifact_free(&art);
  tcc_prepared_free(p);
  reqb_free(b);
}
END_TEST

int main(void) {
  seed = (unsigned)tt_seed("test-compiler-compile");
  tcc_error err;
  if (tcc_toolchain_identity(NULL, identity, sizeof identity, &err)) {
    fprintf(stderr, "toolchain identity: %s\n", err.msg);
    return EXIT_FAILURE;
  }
  return tt_run_tests("compile", 240, 0, (const TTest *[]){
      sin_cos,
      thread_governor,
      thread_governor_choices,
      chain_f32,
      chain_f64,
      broadcast,
      strided,
      small_and_empty,
      mixed_dtypes,
      special_values,
      constants_and_copies,
      workspace_temporaries,
      random_graphs,
      object_cache,
      compiler_timeout,
      compiler_failure,
      unsupported_dtype,
      dumps_and_kept_sources,
      source_hygiene,
      NULL});
}
