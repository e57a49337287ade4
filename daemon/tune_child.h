/*
 * tune_child.h — the daemon's side of the benchmark child (tccd-bench,
 * runtime/bench.c): spawning it on one candidate and reading its report,
 * and the GPU probe (tune_child.c).
 *
 * Apart from daemon.h so that a test can compile tune_child.c with the
 * compiler library alone (no libuv, no gRPC). The child's command line
 * and report are specified at the top of runtime/bench.c.
 */
#ifndef TCCD_TUNE_CHILD_H
#define TCCD_TUNE_CHILD_H

#include <stdint.h>

#include "compiler.h"

/* How the benchmark child runs. */
typedef struct tccd_bench_options {
  const char *bench_exe;   /* the tccd-bench executable */
  const char *work_dir;    /* scratch; NULL = $TMPDIR */
  int timeout_ms;          /* wall clock; CPU seconds limit = timeout/1000+5 */
  int reps;                /* timed runs per kernel (median); 0 = 9 */
  int input_sets;          /* rotated input sets; 0 = 3 */
  uint64_t seed;           /* inputs are a function of the seed */
  int candidate;           /* passed on, for the fault-injection switch */
  int cuda_device;         /* CUDA artifacts: the device index to run on */
} tccd_bench_options;

/* Benchmarks a hooked artifact (tcc_compile_tuned with bench_hooks) in a
 * child process (tcc_run_tool_limits: own process group, address space
 * 4 GiB, CPU time and wall-clock limits, no core; killed by
 * tcc_tools_cancel). A cubin (CUDA target) runs on device
 * o->cuda_device with the same limits but the address-space one (the
 * CUDA driver maps far more virtual memory than that). Fills *out
 * (tcc_bench_result_free). Returns 0, or TCC_E_DEADLINE_EXCEEDED (killed
 * after timeout_ms), TCC_E_INTERNAL (the child crashed or failed: the
 * message says how), TCC_E_CANCELLED (shutdown) or TCC_E_DATA_LOSS (its
 * report is malformed). */
int tccd_bench_run(const tccd_bench_options *o, const tcc_artifact *a, tcc_bench_result *out,
                   tcc_error *err);

/* What `tccd-bench --probe` saw: the CUDA devices of this machine. */
typedef struct tccd_gpu_probe_result {
  int ndevices;
  struct {
    char arch[16];         /* "sm_90" */
    char name[96];
  } device[8];
  char why[256];           /* no device: the driver's reason */
} tccd_gpu_probe_result;

/* Runs bench_exe --probe (a child: libcuda is never loaded by the
 * caller) and fills out. Returns 0 (ndevices may be 0, with why), or
 * TCC_E_INTERNAL / TCC_E_DEADLINE_EXCEEDED when the child failed. */
int tccd_gpu_probe(const char *bench_exe, int timeout_ms, tccd_gpu_probe_result *out,
                   tcc_error *err);

/* The first probed device a cubin for arch ("sm_80", "sm_90a") runs on
 * natively: same major compute capability and a minor at least the
 * arch's ("a" archs: exactly that one). Returns its index, or -1. */
int tccd_gpu_pick(const tccd_gpu_probe_result *probe, const char *arch);

#endif
