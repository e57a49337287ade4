/*
 * target.h — what a compile target is (after QBE's Target): one struct of
 * function pointers per device type, so that pipeline.c runs the same
 * passes for every target and never tests the device.
 *
 *   pipeline.c          lower -> fuse -> split -> place buffers
 *                       -> t->schedule (dumped, checked by t->check)
 *                       -> t->emit -> t->build -> manifest + t->manifest
 *   cpu/  (tcc_target_cpu)   schedule.c: loop nests, parallel loop, SIMD,
 *                            peeling, GEMM roads; emit.c + extern.c: C;
 *                            build.c: the system C compiler -> .so
 *   cuda/ (tcc_target_cuda)  schedule.c: launch geometry, split
 *                            reductions, persistent rows, vector width,
 *                            the launch plan; emit.c: CUDA C; build.c:
 *                            NVRTC -> cubin, the manifest's launch plan
 *
 * A schedule is data in the program (tcc_program.sched): every decision
 * about how a kernel runs is made there once; the emitters print it, the
 * build and the manifest read it, so they cannot disagree.
 */
#ifndef TCC_TARGET_H
#define TCC_TARGET_H

#include "loop.h"

/* What a target's build made. */
typedef struct tcc_built {
  uint8_t *data;              /* the artifact (malloc'ed) */
  size_t size;
  char *ptx;                  /* CUDA: the PTX of the same compile (malloc'ed), else NULL */
  size_t ptx_len;
  int bodies, bodies_reused;  /* CPU: shared kernel bodies, and those the object cache had */
} tcc_built;

typedef struct tcc_target {
  const char *name;                       /* "cpu", "cuda" */
  const char *label;                      /* "CPU", "CUDA": in messages */
  Tcc__V1__DeviceType device;
  Tcc__V1__ArtifactKind artifact;         /* SHARED_OBJECT, CUBIN */
  int dynamic_shapes;                     /* compiles graphs with symbols (dynamic.c) */
  /* Appends the timing hooks a tuned build carries (tune.c's header:
   * tcc_tune_kernel runs one kernel), or NULL: the benchmark child
   * times the artifact's own steps. */
  void (*bench_hooks)(tcc_buf *src, int nkernels);

  /* The build tool's part of the key's identity (CUDA: NVRTC's version
   * and archs), or NULL: none beyond the C compiler's. */
  void (*identity)(char *out, size_t cap);
  /* The schedule pass: fills p->sched. Returns 0 or a TCC_E_* code. */
  int (*schedule)(tcc_program *p, tcc_error *err);
  /* The schedule's invariants (TCC_E_INTERNAL naming the broken one). */
  int (*check)(const tcc_program *p, tcc_error *err);
  /* The schedule as text, for TCC_DUMP. */
  void (*dump)(const tcc_program *p, tcc_buf *b);
  /* Source text for the scheduled program. */
  int (*emit)(const tcc_program *p, tcc_buf *src, tcc_error *err);
  /* Source -> artifact. */
  int (*build)(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
               tcc_built *out, tcc_error *err);
  /* The target's part of the manifest (ABI 1): entry, kernels' launch
   * data, workspace; allocating in A. NULL: none. */
  int (*manifest)(const tcc_program *p, const tcc_built *built, tcc_arena *A, Tcc__V1__Manifest *m,
                  tcc_error *err);
  /* Autotuning candidates (index 0 = the default); returns how many. */
  int (*candidates)(tcc_kernel_config *out);
} tcc_target;

extern const tcc_target tcc_target_cpu;
extern const tcc_target tcc_target_cuda;

/* The target for a device type, or NULL when none is built. */
const tcc_target *tcc_target_for(int device);

#endif
