/*
 * tcc_nvrtc.h — CUDA C -> cubin + PTX with NVRTC (libtccnvrtc).
 *
 * The CUDA half of the compiler's "build" step: the code generator emits
 * CUDA C for a set of __global__ kernels, tcc_nvrtc_build turns it into
 *
 *   - a cubin for exactly the requested arch (what the client loads with
 *     cuModuleLoadData and what tccd stores as the CUBIN artifact), and
 *   - the PTX of the same compile (virtual arch compute_XX of the target):
 *     the forward-compatible form. A client whose device cannot run the
 *     cubin (another major arch, e.g. an sm_80 artifact on an sm_90 card)
 *     hands the PTX to the driver's JIT instead (runtime/tcc_runtime.h).
 *     NVRTC cannot write a fatbinary, so the two travel separately.
 *
 * This works on machines with no GPU and no driver: NVRTC is a pure
 * compiler. It is a pure library too: no printing, no exiting; errors are
 * TCC_E_* codes with NVRTC's log in the message.
 *
 * Finding NVRTC (decided at configure time, see the top-level
 * meson.build): libnvrtc is never linked. On first use it is dlopen'ed
 * from, in order,
 *   1. $TCC_NVRTC_LIBRARY (a path, or a soname),
 *   2. the absolute path meson found (-Dcudahome, else the project-local
 *      .deps/cuda/nvidia/cu13 that scripts/setup-cuda installs from PyPI),
 *   3. "libnvrtc.so.13" on the ordinary library search path,
 * and its libnvrtc-builtins.so.M.m is preloaded from the same folder
 * (NVRTC opens it by soname, which would otherwise need LD_LIBRARY_PATH).
 * A build configured without NVRTC (have_cuda false) compiles a stub whose
 * every call returns TCC_E_FAILED_PRECONDITION saying so.
 *
 * Kernel names: the generator should declare kernels extern "C" (their
 * symbol is their name). For C++ names (templates, namespaces) pass the
 * name expression ("k<float>"): tcc_nvrtc_build registers every name with
 * nvrtcAddNameExpression and returns the lowered (mangled) symbol, which
 * is what goes into Manifest.kernels[i].name and cuModuleGetFunction. Each
 * lowered name is checked to be an entry (__global__) of the cubin.
 *
 * Thread-safety: every function may be called from many threads at once;
 * each build uses its own nvrtcProgram. NVRTC is loaded once, under
 * pthread_once.
 */
#ifndef TCC_NVRTC_H
#define TCC_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "tcc_status.h"

/* What one build produced. Free with tcc_nvrtc_result_free. */
typedef struct tcc_nvrtc_result {
  uint8_t *cubin;            /* ELF for arch (machine EM_CUDA = 190) */
  size_t cubin_size;
  char *ptx;                 /* NUL-terminated PTX text (.target compute arch) */
  size_t ptx_size;           /* strlen(ptx) */
  char **lowered_names;      /* [n_kernels], in kernel_names order */
  size_t n_kernels;
  char *log;                 /* NVRTC's log (warnings); "" when none */
  char arch[16];             /* "sm_90a", as built */
  double compile_ms;         /* wall time of nvrtcCompileProgram */
} tcc_nvrtc_result;

/* Knobs beyond the defaults; a zeroed struct (or NULL) = defaults. */
typedef struct tcc_nvrtc_options {
  const char *program_name;     /* shown in NVRTC's messages; NULL = "tcc_kernels.cu" */
  int fast_math;                /* --use_fast_math */
  int line_info;                /* -lineinfo (for profilers) */
  int max_registers;            /* --maxrregcount=N; 0 = NVRTC's choice */
  const char *const *extra;     /* more NVRTC options, NULL-terminated; may be NULL */
  int timeout_ms;               /* > 0: stop waiting after this long (below) */
} tcc_nvrtc_options;

/* Loads NVRTC if it is not loaded yet. Returns 0, or
 * TCC_E_FAILED_PRECONDITION "NVRTC not available: ..." naming what was
 * tried (and how to provide it). */
int tcc_nvrtc_available(tcc_error *err);

/* The NVRTC version (13, 0). Returns 0 or tcc_nvrtc_available's error. */
int tcc_nvrtc_version(int *major, int *minor, tcc_error *err);

/* The real archs NVRTC compiles for, as "sm_75 sm_80 ... sm_121", into
 * out (at most cap bytes, always terminated). Returns 0 or
 * tcc_nvrtc_available's error (TCC_E_RESOURCE_EXHAUSTED when cap is too
 * small). */
int tcc_nvrtc_archs(char *out, size_t cap, tcc_error *err);

/* The identity string that goes into the guard key of CUDA entries:
 * "nvrtc 13.0 (sm_75 sm_80 ... sm_121)". A different NVRTC (or one that
 * knows other archs) makes every CUDA key differ. Returns 0 or
 * tcc_nvrtc_available's error (RESOURCE_EXHAUSTED when cap is too small). */
int tcc_nvrtc_identity(char *out, size_t cap, tcc_error *err);

/* Checks an arch name: "sm_<NN>" with NN among tcc_nvrtc_archs, or with
 * the suffix "a" (arch-specific features: sm_90a, sm_100a, sm_120a...) or
 * "f" (family: sm_100f...) where NN >= 90 (a) or >= 100 (f). Returns 0,
 * TCC_E_INVALID_ARGUMENT "unknown CUDA arch 'sm_79' (NVRTC 13.0 builds
 * sm_75 ...)", or tcc_nvrtc_available's error. */
int tcc_nvrtc_check_arch(const char *arch, tcc_error *err);

/* Compiles cuda_source for arch ("sm_80" ... "sm_90a" ... "sm_120").
 * kernel_names: NULL-terminated list of the __global__ functions the
 * caller will launch (name expressions; may be NULL for none). Fills *out
 * (zeroed first; on failure it is left empty). Returns
 *   0
 *   TCC_E_INVALID_ARGUMENT  bad arch (see tcc_nvrtc_check_arch), or
 *                           NVRTC refused an option ("nvrtc: invalid
 *                           option ...: <log>")
 *   TCC_E_INTERNAL          the source did not compile, or a kernel name
 *                           is not a __global__ of it: "nvrtc: compiling
 *                           for sm_90 failed (NVRTC_ERROR_COMPILATION):
 *                           <NVRTC's log>" (generated code is the
 *                           compiler's own, so a failure is its bug)
 *   TCC_E_RESOURCE_EXHAUSTED out of memory
 *   TCC_E_FAILED_PRECONDITION NVRTC not available */
int tcc_nvrtc_build(const char *cuda_source, const char *arch,
                    const char *const *kernel_names, tcc_nvrtc_result *out,
                    tcc_error *err);

/* The same with options (opts may be NULL).
 *
 * Timeout (opts->timeout_ms > 0): NVRTC has no way to cancel a compile,
 * and running it in a forked child is unsafe in a multi-threaded daemon
 * (fork copies locks other threads hold, NVRTC's and the loader's). So
 * the compile runs on a thread of its own and the caller stops waiting at
 * the deadline: TCC_E_DEADLINE_EXCEEDED "nvrtc: compiling for sm_90 took
 * longer than N ms (abandoned)". The abandoned compile runs to its end in
 * the background (using one CPU) and frees what it made; nothing of it is
 * ever returned. tcc_nvrtc_abandoned() counts those still running. */
int tcc_nvrtc_build_ex(const char *cuda_source, const char *arch,
                       const char *const *kernel_names,
                       const tcc_nvrtc_options *opts, tcc_nvrtc_result *out,
                       tcc_error *err);

/* Abandoned (timed-out) compiles still running in the background. */
int tcc_nvrtc_abandoned(void);

/* Releases what a build returned and zeroes *r (safe on a zeroed or
 * already freed result). */
void tcc_nvrtc_result_free(tcc_nvrtc_result *r);

/* Whether the cubin's ELF symbol table has an entry function (a
 * __global__, st_other STO_CUDA_ENTRY) whose symbol is `symbol`.
 * Returns 1 when it has, 0 when not, -1 when the bytes are not a 64-bit
 * CUDA ELF. Pure ELF parsing: no NVRTC needed. */
int tcc_cubin_has_entry(const uint8_t *cubin, size_t size, const char *symbol);

/* The SM number the cubin was built for (90 for sm_90 and sm_90a), read
 * from its ELF header; -1 when the bytes are not a CUDA ELF. */
int tcc_cubin_sm(const uint8_t *cubin, size_t size);

#endif
