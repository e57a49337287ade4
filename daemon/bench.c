/*
 * bench.c — tccd-bench, the benchmark child of autotuning.
 *
 *   tccd-bench SO MANIFEST OUTFILE SEED REPS SETS CANDIDATE
 *
 * tccd never runs generated code in its own process: for each candidate
 * it runs this program (compiler/tune.c's tcc_bench_run: own process
 * group, prlimit address-space / CPU-time / no-core limits, killed at a
 * wall-clock deadline). It loads the candidate .so (built with benchmark
 * hooks), allocates the inputs, outputs and workspace the manifest
 * describes, fills SETS input sets with random values drawn from SEED
 * (floats uniform in [-1, 1), integers in [0, 4), bools 0/1: the same
 * values for every candidate), runs every kernel once per set to warm
 * up, then times REPS rounds of every kernel, each round on the next
 * input set (rotating, so no candidate wins by finding its inputs in
 * cache), and reports the median per kernel on stdout (the format is in
 * tune.c), with OMP_WAIT_POLICY=PASSIVE unless the environment sets it.
 * Last, it zero-fills the outputs, runs tcc_entry on input set
 * 0 and writes every output's storage to OUTFILE for the output check.
 *
 * Fault injection (TEST ONLY): TCCD_BENCH_FAULT="crash=I,hang=J,wrong=K"
 * (any subset) makes the child crash (SIGSEGV), hang (sleep until
 * killed) or corrupt its outputs when it benchmarks candidate I, J or K.
 * The integration tests use it to prove such candidates are discarded.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tcc/v1/tcc.pb-c.h"

typedef int (*kernel_fn)(int, const void *const *, void *const *, void *);
typedef int (*entry_fn)(const void *const *, void *const *, void *);

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(void) { return (double)(rng_next() >> 11) / 9007199254740992.0 * 2 - 1; }

static int dtype_size(int dt) {
  switch (dt) {
  case TCC__V1__DTYPE__FLOAT64: case TCC__V1__DTYPE__INT64: return 8;
  case TCC__V1__DTYPE__FLOAT32: case TCC__V1__DTYPE__INT32: return 4;
  case TCC__V1__DTYPE__FLOAT16: case TCC__V1__DTYPE__BFLOAT16: case TCC__V1__DTYPE__INT16: return 2;
  default: return 1;
  }
}

static int64_t storage_elems(const Tcc__V1__TensorMeta *m) {
  int64_t last = 0;
  for (size_t d = 0; d < m->n_sizes; d++) {
    if (m->sizes[d] == 0) return 0;
    last += (m->sizes[d] - 1) * (d < m->n_strides ? m->strides[d] : 0);
  }
  return m->storage_offset + last + 1;
}

static void fill(uint8_t *p, int64_t n, int dt) {
  for (int64_t i = 0; i < n; i++) {
    double u = uniform();
    switch (dt) {
    case TCC__V1__DTYPE__FLOAT32: { float f = (float)u; memcpy(p + i * 4, &f, 4); break; }
    case TCC__V1__DTYPE__FLOAT64: memcpy(p + i * 8, &u, 8); break;
    case TCC__V1__DTYPE__FLOAT16: { /* u in [-1, 1): a normal half, or a signed zero */
      double a = fabs(u);
      int e = a == 0 ? 0 : ilogb(a);
      uint16_t h = 0;
      if (a >= 0x1p-14) h = (uint16_t)(((e + 15) << 10) | ((int)(ldexp(a, -e) * 1024) & 0x3ff));
      if (u < 0) h |= 0x8000;
      memcpy(p + i * 2, &h, 2);
      break;
    }
    case TCC__V1__DTYPE__BFLOAT16: {
      float f = (float)u;
      uint32_t w;
      memcpy(&w, &f, 4);
      uint16_t h = (uint16_t)(w >> 16);
      memcpy(p + i * 2, &h, 2);
      break;
    }
    case TCC__V1__DTYPE__BOOL: p[i] = (uint8_t)(rng_next() & 1); break;
    default: {
      int64_t v = (int64_t)(rng_next() & 3);
      memcpy(p + i * dtype_size(dt), &v, (size_t)dtype_size(dt)); /* little-endian */
    }
    }
  }
}

/* The candidate this fault names in TCCD_BENCH_FAULT, or -1. */
static int fault_for(const char *kind) {
  const char *f = getenv("TCCD_BENCH_FAULT");
  if (!f) return -1;
  size_t n = strlen(kind);
  for (const char *p = f; (p = strstr(p, kind)); p += n)
    if ((p == f || p[-1] == ',') && p[n] == '=') return atoi(p + n + 1);
  return -1;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void *xcalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) {
    fprintf(stderr, "tccd-bench: out of memory (%zu bytes)\n", n);
    exit(3);
  }
  return p;
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = xcalloc((size_t)(n > 0 ? n : 1));
  *len = fread(b, 1, (size_t)(n > 0 ? n : 0), f);
  fclose(f);
  return b;
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: tccd-bench SO MANIFEST OUTFILE SEED REPS SETS CANDIDATE\n");
    return 2;
  }
  uint64_t seed = strtoull(argv[4], NULL, 10);
  int reps = atoi(argv[5]), sets = atoi(argv[6]), candidate = atoi(argv[7]);
  if (reps < 1) reps = 1;
  if (sets < 1) sets = 1;
  size_t mlen;
  uint8_t *mbytes = read_file(argv[2], &mlen);
  Tcc__V1__Manifest *m = mbytes ? tcc__v1__manifest__unpack(NULL, mlen, mbytes) : NULL;
  free(mbytes);
  if (!m) {
    fprintf(stderr, "tccd-bench: cannot read the manifest %s\n", argv[2]);
    return 2;
  }
  /* idle OpenMP threads sleep instead of spinning (unless the daemon's
   * environment says otherwise): spinning workers of one kernel would
   * steal the cores of the next (OpenBLAS's threads, or libgomp's in
   * the next parallel loop) and the timings would measure that fight.
   * libgomp reads it when the candidate pulls it in, at the dlopen. */
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "tccd-bench: %s\n", dlerror());
    return 2;
  }
  kernel_fn kern = (kernel_fn)dlsym(so, "tcc_tune_kernel");
  entry_fn entry = (entry_fn)dlsym(so, "tcc_entry");
  if (!kern || !entry) {
    fprintf(stderr, "tccd-bench: %s has no benchmark hooks\n", argv[1]);
    return 2;
  }
  if (fault_for("crash") == candidate) raise(SIGSEGV); /* test-only fault injection */
  if (fault_for("hang") == candidate)
    for (;;) sleep(60);

  rng_state = seed;
  size_t nin = m->n_inputs, nout = m->n_outputs;
  const void **in = xcalloc(sizeof *in * (nin * (size_t)sets + 1));
  for (int s = 0; s < sets; s++)
    for (size_t i = 0; i < nin; i++) {
      int64_t n = storage_elems(m->inputs[i]);
      uint8_t *p = xcalloc((size_t)n * (size_t)dtype_size(m->inputs[i]->dtype) + 64);
      fill(p, n, m->inputs[i]->dtype);
      in[(size_t)s * nin + i] = p;
    }
  void **out = xcalloc(sizeof *out * (nout + 1));
  size_t *out_bytes = xcalloc(sizeof *out_bytes * (nout + 1));
  for (size_t o = 0; o < nout; o++) {
    out_bytes[o] = (size_t)storage_elems(m->outputs[o]) * (size_t)dtype_size(m->outputs[o]->dtype);
    out[o] = xcalloc(out_bytes[o] + 64);
  }
  void *ws = NULL;
  if (posix_memalign(&ws, 64, m->workspace_bytes > 0 ? (size_t)m->workspace_bytes : 64)) return 3;

  int nk = (int)m->n_kernels;
  double *times = xcalloc(sizeof *times * (size_t)(nk ? nk : 1) * (size_t)reps);
  for (int s = 0; s < sets; s++) /* warm up on every set */
    for (int k = 0; k < nk; k++) kern(k, &in[(size_t)s * nin], out, ws);
  for (int r = 0; r < reps; r++) {
    const void *const *cur = &in[(size_t)(r % sets) * nin];
    for (int k = 0; k < nk; k++) {
      double t0 = now_ns();
      kern(k, cur, out, ws);
      times[(size_t)k * (size_t)reps + (size_t)r] = now_ns() - t0;
    }
  }
  for (size_t o = 0; o < nout; o++) memset(out[o], 0, out_bytes[o]);
  int bad = entry(&in[0], out, ws);
  if (fault_for("wrong") == candidate) /* test-only: corrupt every output */
    for (size_t o = 0; o < nout; o++) {
      uint8_t *p = out[o];
      int dt = m->outputs[o]->dtype;
      for (size_t i = 0; i + 4 <= out_bytes[o] && dt == TCC__V1__DTYPE__FLOAT32; i += 4) {
        float f;
        memcpy(&f, p + i, 4);
        f = f * 1.5f + 1.0f;
        memcpy(p + i, &f, 4);
      }
      if (dt != TCC__V1__DTYPE__FLOAT32)
        for (size_t i = 0; i < out_bytes[o]; i++) p[i] ^= 0x5a;
    }
  FILE *f = fopen(argv[3], "wb");
  if (!f) {
    fprintf(stderr, "tccd-bench: cannot write %s\n", argv[3]);
    return 2;
  }
  for (size_t o = 0; o < nout; o++) fwrite(out[o], 1, out_bytes[o], f);
  if (fclose(f) != 0) return 2;

  printf("tccd-bench 1\nkernels %d\nbad %d\n", nk, bad ? 1 : 0);
  for (int k = 0; k < nk; k++) {
    double *t = &times[(size_t)k * (size_t)reps];
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("k %d %.1f\n", k, reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2);
  }
  printf("end\n");
  fflush(stdout);
  for (size_t i = 0; i < nin * (size_t)sets; i++) free((void *)in[i]);
  for (size_t o = 0; o < nout; o++) free(out[o]);
  free(in);
  free(out);
  free(out_bytes);
  free(ws);
  free(times);
  tcc__v1__manifest__free_unpacked(m, NULL);
  /* no dlclose: unloading a kernel whose OpenMP / OpenBLAS threads are
   * still parked can crash at exit; the process ends here anyway */
  (void)so;
  return 0;
}
