/*
 * bench.c — tccd-bench, the benchmark child of autotuning (part of the
 * runtime: it runs kernels; the daemon only spawns it and reads its
 * report, daemon/tune_child.c).
 *
 *   tccd-bench SO MANIFEST OUTFILE SEED REPS SETS CANDIDATE
 *   tccd-bench CUBIN MANIFEST OUTFILE SEED REPS SETS CANDIDATE DEVICE
 *   tccd-bench --probe
 *
 * tccd never runs generated code in its own process: for each candidate
 * it runs this program (daemon/tune_child.c's tccd_bench_run, through
 * the compiler's one spawning helper tcc_run_tool_limits: own process
 * group, prlimit address-space (4 GiB) / CPU-time (timeout/1000 + 5 s) /
 * no-core limits, killed at a wall-clock deadline and by
 * tcc_tools_cancel at shutdown). It loads the candidate .so (built with
 * benchmark hooks), allocates the inputs, outputs and workspace the
 * manifest describes, fills SETS input sets with random values drawn from
 * SEED (floats uniform in [-1, 1), integers in [0, 4), bools 0/1: the
 * same values for every candidate), runs every kernel once per set to
 * warm up, then times REPS rounds of every kernel, each round on the next
 * input set (rotating, so no candidate wins by finding its inputs in
 * cache), and reports the median per kernel on stdout, with OpenBLAS on
 * one thread (as the client loads it) unless the environment sets
 * OPENBLAS_NUM_THREADS, and libgomp at its default wait policy. Last, it
 * zero-fills the outputs, runs tcc_entry on input set 0 and writes every
 * output's storage, in order, to OUTFILE for the output check.
 *
 * The report (stdout; the daemon refuses anything else as malformed):
 *
 *   tccd-bench 1
 *   kernels N
 *   bad 0|1                  (tcc_entry returned 1 on input set 0)
 *   k <j> <median ns>        (N lines, j = 0 .. N-1)
 *   end
 *
 * CUDA (the manifest's target is "cuda:..."): the artifact is a cubin
 * (the daemon writes it as candidate.cubin) and DEVICE the GPU to run
 * on; the daemon runs it without the address-space limit (the driver
 * maps far more virtual memory). The same, through the runtime's CUDA
 * loader (tcc_runtime.h; libcuda dlopen'ed, never linked): the whole
 * plan for the warm-up and the outputs, one plan per live kernel (its
 * steps of the manifest, from the same module) for the timings, which
 * are CUDA events around each launch on one stream (cuda_bench); the
 * same report, with "bad 0". Any CUDA error exits 2 with the message
 * (the daemon discards the candidate as crashed). --probe lists the
 * devices (cuda_probe) so the daemon never loads libcuda itself:
 *
 *   tccd-bench-probe 1
 *   device <i> <sm_XY> <name>     (one per device), or: none <why>
 *
 * Fault injection (TEST ONLY): TCC_BENCH_FAULT="crash=I,hang=J,wrong=K"
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
#include "tcc_dtype.h"
#include "tcc_runtime.h" /* the CUDA loader */

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

/* Elements of a tensor's storage span (common/tcc_dtype.h). */
static int64_t storage_elems(const Tcc__V1__TensorMeta *m) {
  return tcc_storage_elems(m->sizes, m->n_sizes, m->strides, m->n_strides, m->storage_offset);
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
      memcpy(p + i * tcc_dtype_size(dt), &v, (size_t)tcc_dtype_size(dt)); /* little-endian */
    }
    }
  }
}

/* The candidate this fault names in TCC_BENCH_FAULT, or -1. */
static int fault_for(const char *kind) {
  const char *f = getenv("TCC_BENCH_FAULT");
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

/* Test-only fault injection (TCC_BENCH_FAULT wrong=I): corrupts every
 * output so the output check must catch it. */
static void corrupt_outputs(const Tcc__V1__Manifest *m, void **out, const size_t *out_bytes) {
  for (size_t o = 0; o < m->n_outputs; o++) {
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
}

/* Every output's storage, in order, to path. Returns 0 or -1 (said on stderr). */
static int write_outputs(const char *path, void *const *out, const size_t *out_bytes, size_t nout) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "tccd-bench: cannot write %s\n", path);
    return -1;
  }
  for (size_t o = 0; o < nout; o++) fwrite(out[o], 1, out_bytes[o], f);
  return fclose(f) != 0 ? -1 : 0;
}

/* The report (see the top): each kernel's median of times[k * reps ..]. */
static void report(int nk, int bad, double *times, int reps) {
  printf("tccd-bench 1\nkernels %d\nbad %d\n", nk, bad ? 1 : 0);
  for (int k = 0; k < nk; k++) {
    double *t = &times[(size_t)k * (size_t)reps];
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("k %d %.1f\n", k, reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2);
  }
  printf("end\n");
  fflush(stdout);
}

/* ------------------------------------------------------------ CUDA */

/* `tccd-bench --probe`: the CUDA devices this process sees (the format
 * is at the top). The daemon runs it once (tune_child.c's
 * tccd_gpu_probe) so that libcuda is never loaded into the daemon
 * itself. Returns the exit status (0). */
static int cuda_probe(void) {
  tcc_error err;
  int n = 0;
  printf("tccd-bench-probe 1\n");
  if (tcc_rt_cuda_device_count(&n, &err) != 0) {
    printf("none %s\n", err.msg);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    char arch[16], name[96];
    if (tcc_rt_cuda_device_arch(i, arch, name, sizeof name, &err) == 0) printf("device %d %s %s\n", i, arch, name);
  }
  if (n == 0) printf("none no CUDA device\n");
  return 0;
}

/* The live kernel a manifest step belongs to: "k3" and "k3_split" -> 3. */
static int step_kernel(const char *name) {
  int j = -1;
  return name && sscanf(name, "k%d", &j) == 1 ? j : -1;
}

/* A CUDA failure in the child: said on stderr, exit status 2 (the daemon
 * discards the candidate as crashed). */
static int cuda_fail(const char *what, const tcc_error *err) {
  fprintf(stderr, "tccd-bench: %s: %s\n", what, err->msg);
  fflush(stderr);
  return 2;
}

/* Benchmarks a cubin on `device`: the whole plan (the manifest) for the
 * warm-up and the outputs, and each live kernel's steps (k<j>_split,
 * k<j>: one kernel, or its cuBLAS call) loaded as a plan of their own
 * from the same module (the runtime's loader, one module per
 * artifact). Inputs as on CPU (same generator, SETS sets, copied to the
 * device); every timed launch sits between two events on one stream,
 * all of them queued before the first wait, so the GPU runs them back to
 * back; a kernel's time is the median over REPS rounds (rotating sets)
 * of end - start. Returns the exit status. */
static int cuda_bench(const Tcc__V1__Manifest *m, const char *cubin_path, const char *outfile, uint64_t seed,
                      int reps, int sets, int candidate, int device) {
  if (fault_for("crash") == candidate) raise(SIGSEGV); /* test-only fault injection */
  if (fault_for("hang") == candidate)
    for (;;) sleep(60);
  tcc_error err;
  size_t clen = 0;
  uint8_t *cubin = read_file(cubin_path, &clen);
  if (!cubin) {
    fprintf(stderr, "tccd-bench: cannot read %s\n", cubin_path);
    return 2;
  }
  tcc_rt_cuda_options opts = {.device = device, .context = TCC_RT_CUDA_PRIMARY};
  tcc_rt_cuda_kernel *whole = NULL;
  if (tcc_rt_cuda_kernel_load_manifest(cubin, clen, "tccd-bench-candidate", m, &opts, &whole, &err))
    return cuda_fail("loading the cubin", &err);
  int nk = 0;
  for (size_t i = 0; i < m->n_kernels; i++) {
    int j = step_kernel(m->kernels[i]->name);
    if (j < 0) {
      fprintf(stderr, "tccd-bench: manifest step '%s' names no kernel\n", m->kernels[i]->name);
      return 2;
    }
    if (j + 1 > nk) nk = j + 1;
  }
  /* one plan per live kernel: its steps of the manifest, same module */
  tcc_rt_cuda_kernel **part = xcalloc(sizeof *part * (size_t)(nk + 1));
  Tcc__V1__KernelInfo **steps = xcalloc(sizeof *steps * (m->n_kernels + 1));
  for (int j = 0; j < nk; j++) {
    Tcc__V1__Manifest sub = *m;
    sub.kernels = steps;
    sub.n_kernels = 0;
    for (size_t i = 0; i < m->n_kernels; i++)
      if (step_kernel(m->kernels[i]->name) == j) steps[sub.n_kernels++] = m->kernels[i];
    if (sub.n_kernels && tcc_rt_cuda_kernel_load_manifest(cubin, clen, "tccd-bench-candidate", &sub, &opts, &part[j], &err))
      return cuda_fail("loading one kernel's plan", &err);
  }
  free(steps);

  rng_state = seed;
  size_t nin = m->n_inputs, nout = m->n_outputs;
  const void **in = xcalloc(sizeof *in * (nin * (size_t)sets + 1));
  for (int s = 0; s < sets; s++)
    for (size_t i = 0; i < nin; i++) {
      int64_t n = storage_elems(m->inputs[i]);
      size_t bytes = (size_t)n * (size_t)tcc_dtype_size(m->inputs[i]->dtype);
      uint8_t *host = xcalloc(bytes + 64);
      fill(host, n, m->inputs[i]->dtype);
      void *d = NULL;
      if (tcc_rt_cuda_malloc(device, bytes + 256, &d, &err) || tcc_rt_cuda_memcpy_htod(device, d, host, bytes, &err))
        return cuda_fail("input memory", &err);
      free(host);
      in[(size_t)s * nin + i] = d;
    }
  void **out = xcalloc(sizeof *out * (nout + 1)), **host_out = xcalloc(sizeof *host_out * (nout + 1));
  size_t *out_bytes = xcalloc(sizeof *out_bytes * (nout + 1));
  for (size_t o = 0; o < nout; o++) {
    out_bytes[o] = (size_t)storage_elems(m->outputs[o]) * (size_t)tcc_dtype_size(m->outputs[o]->dtype);
    host_out[o] = xcalloc(out_bytes[o] + 64);
    if (tcc_rt_cuda_malloc(device, out_bytes[o] + 256, &out[o], &err)) return cuda_fail("output memory", &err);
  }
  void *ws = NULL, *stream = NULL;
  uint64_t ws_bytes = tcc_rt_cuda_kernel_workspace_bytes(whole);   /* the plan's + cuDNN's */
  for (int j = 0; j < nk; j++)
    if (tcc_rt_cuda_kernel_workspace_bytes(part[j]) > ws_bytes) ws_bytes = tcc_rt_cuda_kernel_workspace_bytes(part[j]);
  if (ws_bytes > 0 && tcc_rt_cuda_malloc(device, (size_t)ws_bytes, &ws, &err))
    return cuda_fail("workspace memory", &err);
  if (tcc_rt_cuda_stream_create(device, &stream, &err)) return cuda_fail("stream", &err);

  for (int s = 0; s < sets; s++) /* warm up on every set */
    if (tcc_rt_cuda_kernel_launch(whole, stream, &in[(size_t)s * nin], out, ws, &err))
      return cuda_fail("warm-up launch", &err);
  if (tcc_rt_cuda_synchronize(device, stream, &err)) return cuda_fail("warm-up", &err);

  size_t nev = (size_t)(nk ? nk : 1) * (size_t)reps;
  void **ev0 = xcalloc(sizeof *ev0 * nev), **ev1 = xcalloc(sizeof *ev1 * nev);
  double *times = xcalloc(sizeof *times * nev);
  for (size_t e = 0; e < (size_t)nk * (size_t)reps; e++)
    if (tcc_rt_cuda_event_create(device, &ev0[e], &err) || tcc_rt_cuda_event_create(device, &ev1[e], &err))
      return cuda_fail("events", &err);
  for (int r = 0; r < reps; r++) {
    const void *const *cur = &in[(size_t)(r % sets) * nin];
    for (int k = 0; k < nk; k++) {
      size_t e = (size_t)k * (size_t)reps + (size_t)r;
      if (!part[k]) continue;
      if (tcc_rt_cuda_event_record(device, ev0[e], stream, &err) ||
          tcc_rt_cuda_kernel_launch(part[k], stream, cur, out, ws, &err) ||
          tcc_rt_cuda_event_record(device, ev1[e], stream, &err))
        return cuda_fail("timed launch", &err);
    }
  }
  for (int k = 0; k < nk; k++)
    for (int r = 0; r < reps && part[k]; r++) {
      size_t e = (size_t)k * (size_t)reps + (size_t)r;
      float ms = 0;
      if (tcc_rt_cuda_event_elapsed_ms(device, ev0[e], ev1[e], &ms, &err)) return cuda_fail("timing", &err);
      times[e] = (double)ms * 1e6;
    }

  /* the outputs of one run of the whole plan on set 0, zero-filled first */
  for (size_t o = 0; o < nout; o++)
    if (tcc_rt_cuda_memcpy_htod(device, out[o], host_out[o], out_bytes[o], &err)) return cuda_fail("zeroing", &err);
  if (tcc_rt_cuda_kernel_launch(whole, stream, &in[0], out, ws, &err) || tcc_rt_cuda_synchronize(device, stream, &err))
    return cuda_fail("the output run", &err);
  for (size_t o = 0; o < nout; o++)
    if (tcc_rt_cuda_memcpy_dtoh(device, host_out[o], out[o], out_bytes[o], &err)) return cuda_fail("outputs", &err);
  if (fault_for("wrong") == candidate) corrupt_outputs(m, host_out, out_bytes);
  if (write_outputs(outfile, host_out, out_bytes, nout)) return 2;
  report(nk, 0, times, reps);

  for (size_t e = 0; e < (size_t)nk * (size_t)reps; e++) {
    tcc_rt_cuda_event_destroy(device, ev0[e], &err);
    tcc_rt_cuda_event_destroy(device, ev1[e], &err);
  }
  tcc_rt_cuda_stream_destroy(device, stream, &err);
  for (size_t i = 0; i < nin * (size_t)sets; i++) tcc_rt_cuda_free(device, (void *)in[i], &err);
  for (size_t o = 0; o < nout; o++) {
    tcc_rt_cuda_free(device, out[o], &err);
    free(host_out[o]);
  }
  tcc_rt_cuda_free(device, ws, &err);
  for (int k = 0; k < nk; k++) tcc_rt_cuda_kernel_unload(part[k]);
  tcc_rt_cuda_kernel_unload(whole);
  free(part);
  free(in);
  free(out);
  free(host_out);
  free(out_bytes);
  free(ev0);
  free(ev1);
  free(times);
  free(cubin);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--probe") == 0) return cuda_probe();
  if (argc != 8 && argc != 9) {
    fprintf(stderr, "usage: tccd-bench SO|CUBIN MANIFEST OUTFILE SEED REPS SETS CANDIDATE [DEVICE]\n"
                    "       tccd-bench --probe\n");
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
  /* Kernels run as in the client's process: OpenBLAS on one thread (the
   * client loads it so; GEMM slabs run on the OpenMP threads), libgomp's
   * idle threads spinning a while before they sleep. Passive waits
   * would time the wake of sleeping threads at every parallel region,
   * 40-90 us a region on a VM, and favour serial candidates the client
   * then runs slower than the parallel ones (docs/autotuning.md). Both
   * libraries read these when the candidate pulls them in, at the
   * dlopen. */
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  if (m->target && strncmp(m->target, "cuda:", 5) == 0) {
    int rc = cuda_bench(m, argv[1], argv[3], seed, reps, sets, candidate, argc == 9 ? atoi(argv[8]) : 0);
    tcc__v1__manifest__free_unpacked(m, NULL);
    return rc;
  }
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
      uint8_t *p = xcalloc((size_t)n * (size_t)tcc_dtype_size(m->inputs[i]->dtype) + 64);
      fill(p, n, m->inputs[i]->dtype);
      in[(size_t)s * nin + i] = p;
    }
  void **out = xcalloc(sizeof *out * (nout + 1));
  size_t *out_bytes = xcalloc(sizeof *out_bytes * (nout + 1));
  for (size_t o = 0; o < nout; o++) {
    out_bytes[o] = (size_t)storage_elems(m->outputs[o]) * (size_t)tcc_dtype_size(m->outputs[o]->dtype);
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
  if (fault_for("wrong") == candidate) corrupt_outputs(m, out, out_bytes);
  if (write_outputs(argv[3], out, out_bytes, nout)) return 2;
  report(nk, bad, times, reps);
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
