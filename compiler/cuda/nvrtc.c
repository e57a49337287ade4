/*
 * nvrtc.c — NVRTC loaded at run time; CUDA C -> cubin + PTX; cubin ELF
 * inspection. See tcc_nvrtc.h for the contract.
 *
 * Why dlopen and not -lnvrtc: the PyPI wheel ships only libnvrtc.so.13
 * (no unversioned libnvrtc.so for the linker), the daemon must start on
 * hosts that never compile for CUDA, and an absolute path recorded at
 * configure time means nobody sets LD_LIBRARY_PATH. NVRTC itself dlopens
 * "libnvrtc-builtins.so.M.m" by soname; preloading that file from the
 * folder libnvrtc came from (dlinfo RTLD_DI_ORIGIN) satisfies the lookup
 * because glibc matches an already loaded object by its DT_SONAME.
 *
 * One build:
 *   check arch -> nvrtcCreateProgram -> nvrtcAddNameExpression (each
 *   kernel) -> nvrtcCompileProgram(--gpu-architecture=sm_XX ...) ->
 *   nvrtcGetCUBIN + nvrtcGetPTX (NVRTC writes both for a real arch) ->
 *   nvrtcGetLoweredName (each kernel) -> check each is a cubin entry ->
 *   nvrtcDestroyProgram.
 * Both libraries stay loaded for the life of the process.
 */
#include "tcc_nvrtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tcc_config.h"

/* ------------------------------------------------------------------ cubin ELF */

#define EM_CUDA 190
#define SHT_SYMTAB 2
#define STT_FUNC 2
#define STO_CUDA_ENTRY 0x10

static uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* 1 when b holds a little-endian 64-bit ELF for the CUDA machine. */
static int is_cuda_elf(const uint8_t *b, size_t n) {
  return b && n >= 64 && !memcmp(b, "\x7f" "ELF", 4) && b[4] == 2 /* ELFCLASS64 */ &&
         b[5] == 1 /* little-endian */ && rd(b + 18, 2) == EM_CUDA;
}

int tcc_cubin_sm(const uint8_t *b, size_t n) {
  if (!is_cuda_elf(b, n)) return -1;
  uint32_t flags = (uint32_t)rd(b + 0x30, 4);
  /* ELF ABI version 8 (CUDA 13) moved EF_CUDA_SM from bits 0-7 to 8-15. */
  return b[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
}

int tcc_cubin_has_entry(const uint8_t *b, size_t n, const char *symbol) {
  if (!is_cuda_elf(b, n) || !symbol) return -1;
  uint64_t shoff = rd(b + 0x28, 8), shentsize = rd(b + 0x3a, 2), shnum = rd(b + 0x3c, 2);
  if (shentsize < 64 || shoff > n || shnum > (n - shoff) / shentsize) return -1;
  size_t want = strlen(symbol);
  for (uint64_t s = 0; s < shnum; s++) {
    const uint8_t *sh = b + shoff + s * shentsize;
    if (rd(sh + 4, 4) != SHT_SYMTAB) continue;
    uint64_t off = rd(sh + 24, 8), size = rd(sh + 32, 8), ent = rd(sh + 56, 8), link = rd(sh + 40, 4);
    if (ent < 24 || off > n || size > n - off || link >= shnum) return -1;
    const uint8_t *str_sh = b + shoff + link * shentsize;
    uint64_t str_off = rd(str_sh + 24, 8), str_size = rd(str_sh + 32, 8);
    if (str_off > n || str_size > n - str_off) return -1;
    for (uint64_t e = 0; e + ent <= size; e += ent) {
      const uint8_t *sym = b + off + e;
      uint64_t name = rd(sym, 4);
      if ((sym[4] & 0xf) != STT_FUNC || !(sym[5] & STO_CUDA_ENTRY)) continue;
      if (name >= str_size || str_size - name <= want) continue;
      const char *nm = (const char *)b + str_off + name;
      if (!memcmp(nm, symbol, want) && nm[want] == '\0') return 1;
    }
  }
  return 0;
}

void tcc_nvrtc_result_free(tcc_nvrtc_result *r) {
  if (!r) return;
  free(r->cubin);
  free(r->ptx);
  free(r->log);
  for (size_t i = 0; i < r->n_kernels && r->lowered_names; i++) free(r->lowered_names[i]);
  free(r->lowered_names);
  memset(r, 0, sizeof *r);
}

/* Parses "sm_<NN>[a|f]" into *num and *suffix ('\0', 'a' or 'f').
 * Returns 0 when it has that shape, -1 otherwise. */
static int parse_arch(const char *arch, int *num, char *suffix) {
  if (!arch || strncmp(arch, "sm_", 3) != 0) return -1;
  const char *p = arch + 3;
  int v = 0, digits = 0;
  while (*p >= '0' && *p <= '9' && digits < 4) v = v * 10 + (*p++ - '0'), digits++;
  if (digits < 2) return -1;
  *suffix = '\0';
  if (*p == 'a' || *p == 'f') *suffix = *p++;
  if (*p) return -1;
  *num = v;
  return 0;
}

#if TCC_HAVE_CUDA

#include <nvrtc.h> /* NVIDIA's (include path of the NVRTC meson found) */

#ifndef TCC_NVRTC_LIBRARY
#define TCC_NVRTC_LIBRARY "libnvrtc.so.13"
#endif
#define NVRTC_SONAME "libnvrtc.so.13"

/* NVRTC, loaded once. Immutable after load_once. */
static struct {
  int ok;
  char why[600];                     /* when !ok: what was tried */
  void *lib, *builtins;
  int major, minor;
  int archs[64];
  int n_archs;
  char arch_list[512];               /* "sm_75 sm_80 ..." */
#define NVRTC_FN(name) __typeof__(&name) name;
  struct {
    NVRTC_FN(nvrtcVersion)
    NVRTC_FN(nvrtcGetNumSupportedArchs)
    NVRTC_FN(nvrtcGetSupportedArchs)
    NVRTC_FN(nvrtcGetErrorString)
    NVRTC_FN(nvrtcCreateProgram)
    NVRTC_FN(nvrtcDestroyProgram)
    NVRTC_FN(nvrtcAddNameExpression)
    NVRTC_FN(nvrtcCompileProgram)
    NVRTC_FN(nvrtcGetProgramLogSize)
    NVRTC_FN(nvrtcGetProgramLog)
    NVRTC_FN(nvrtcGetPTXSize)
    NVRTC_FN(nvrtcGetPTX)
    NVRTC_FN(nvrtcGetCUBINSize)
    NVRTC_FN(nvrtcGetCUBIN)
    NVRTC_FN(nvrtcGetLoweredName)
  } fn;
#undef NVRTC_FN
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
  const char *env = getenv("TCC_NVRTC_LIBRARY");
  const char *cands[2];
  int n = 0;
  if (env && *env) {
    cands[n++] = env;             /* an explicit choice: nothing else */
  } else {
    cands[n++] = TCC_NVRTC_LIBRARY;
    if (strcmp(TCC_NVRTC_LIBRARY, NVRTC_SONAME) != 0) cands[n++] = NVRTC_SONAME;
  }
  size_t used = 0;
  for (int i = 0; i < n && !nv.lib; i++) {
    nv.lib = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
    if (!nv.lib) {
      const char *e = dlerror();
      used += (size_t)snprintf(nv.why + used, used < sizeof nv.why ? sizeof nv.why - used : 0, "%s%s",
                               i ? "; " : "", e ? e : cands[i]);
      if (used >= sizeof nv.why) used = sizeof nv.why - 1;
    }
  }
  if (!nv.lib) return;
#define NVRTC_SYM(name)                                                      \
  do {                                                                       \
    void *s = dlsym(nv.lib, #name);                                          \
    if (!s) {                                                                \
      snprintf(nv.why, sizeof nv.why, "%s has no symbol %s", cands[0], #name); \
      return;                                                                \
    }                                                                        \
    memcpy(&nv.fn.name, &s, sizeof s);                                       \
  } while (0)
  NVRTC_SYM(nvrtcVersion);
  NVRTC_SYM(nvrtcGetNumSupportedArchs);
  NVRTC_SYM(nvrtcGetSupportedArchs);
  NVRTC_SYM(nvrtcGetErrorString);
  NVRTC_SYM(nvrtcCreateProgram);
  NVRTC_SYM(nvrtcDestroyProgram);
  NVRTC_SYM(nvrtcAddNameExpression);
  NVRTC_SYM(nvrtcCompileProgram);
  NVRTC_SYM(nvrtcGetProgramLogSize);
  NVRTC_SYM(nvrtcGetProgramLog);
  NVRTC_SYM(nvrtcGetPTXSize);
  NVRTC_SYM(nvrtcGetPTX);
  NVRTC_SYM(nvrtcGetCUBINSize);
  NVRTC_SYM(nvrtcGetCUBIN);
  NVRTC_SYM(nvrtcGetLoweredName);
#undef NVRTC_SYM
  if (nv.fn.nvrtcVersion(&nv.major, &nv.minor) != NVRTC_SUCCESS) {
    snprintf(nv.why, sizeof nv.why, "nvrtcVersion failed");
    return;
  }
  int count = 0;
  if (nv.fn.nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0 ||
      count > (int)(sizeof nv.archs / sizeof nv.archs[0]) ||
      nv.fn.nvrtcGetSupportedArchs(nv.archs) != NVRTC_SUCCESS) {
    snprintf(nv.why, sizeof nv.why, "nvrtcGetSupportedArchs failed (%d archs)", count);
    return;
  }
  nv.n_archs = count;
  size_t len = 0;
  for (int i = 0; i < count && len < sizeof nv.arch_list; i++)
    len += (size_t)snprintf(nv.arch_list + len, sizeof nv.arch_list - len, "%ssm_%d", i ? " " : "", nv.archs[i]);

  /* libnvrtc-builtins.so.M.m from libnvrtc's own folder. When it is not
   * there, NVRTC's own soname lookup may still find it (or say so). */
  char origin[4096];
  if (dlinfo(nv.lib, RTLD_DI_ORIGIN, origin) == 0) {
    char path[4200];
    snprintf(path, sizeof path, "%s/libnvrtc-builtins.so.%d.%d", origin, nv.major, nv.minor);
    if (access(path, R_OK) == 0) nv.builtins = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  nv.ok = 1;
}

int tcc_nvrtc_available(tcc_error *err) {
  pthread_once(&nv_once, load_once);
  if (nv.ok) return 0;
  return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                       "NVRTC not available: %s (run scripts/setup-cuda, or set TCC_NVRTC_LIBRARY "
                       "to libnvrtc.so.13)",
                       nv.why[0] ? nv.why : "not loaded");
}

int tcc_nvrtc_version(int *major, int *minor, tcc_error *err) {
  int rc = tcc_nvrtc_available(err);
  if (rc) return rc;
  *major = nv.major;
  *minor = nv.minor;
  return 0;
}

int tcc_nvrtc_archs(char *out, size_t cap, tcc_error *err) {
  int rc = tcc_nvrtc_available(err);
  if (rc) return rc;
  if (cap <= strlen(nv.arch_list)) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "arch list buffer too small");
  memcpy(out, nv.arch_list, strlen(nv.arch_list) + 1);
  return 0;
}

int tcc_nvrtc_identity(char *out, size_t cap, tcc_error *err) {
  int rc = tcc_nvrtc_available(err);
  if (rc) return rc;
  int n = snprintf(out, cap, "nvrtc %d.%d (%s)", nv.major, nv.minor, nv.arch_list);
  if (n < 0 || (size_t)n >= cap) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "identity buffer too small");
  return 0;
}

int tcc_nvrtc_check_arch(const char *arch, tcc_error *err) {
  int rc = tcc_nvrtc_available(err);
  if (rc) return rc;
  int num;
  char suffix;
  int known = 0;
  if (parse_arch(arch, &num, &suffix) == 0) {
    for (int i = 0; i < nv.n_archs; i++) known |= nv.archs[i] == num;
    if ((suffix == 'a' && num < 90) || (suffix == 'f' && num < 100)) known = 0;
  }
  if (known) return 0;
  return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                       "unknown CUDA arch '%.32s' (NVRTC %d.%d builds %s; 'a' suffix from sm_90, 'f' from sm_100)",
                       arch ? arch : "(null)", nv.major, nv.minor, nv.arch_list);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The program's log, malloc'd and without trailing whitespace ("" when
 * empty); NULL when out of memory. */
static char *program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nv.fn.nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS) n = 0;
  char *log = malloc(n + 1);
  if (!log) return NULL;
  log[0] = '\0';
  if (n && nv.fn.nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
  log[n] = '\0';
  size_t len = strlen(log);
  while (len && (log[len - 1] == '\n' || log[len - 1] == ' ' || log[len - 1] == '\r')) log[--len] = '\0';
  return log;
}

/* An NVRTC result as a failure class: a compilation error in the source
 * would repeat (INTERNAL, cached by the daemon); running out of memory
 * and NVRTC's own internal errors may not (transient, never cached). */
static int nvrtc_error_code(nvrtcResult r) {
  switch (r) {
  case NVRTC_ERROR_OUT_OF_MEMORY: return TCC_E_RESOURCE_EXHAUSTED;
  case NVRTC_ERROR_INVALID_OPTION: return TCC_E_INVALID_ARGUMENT;
  case NVRTC_ERROR_INTERNAL_ERROR:
  case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE:
  case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return TCC_E_UNAVAILABLE;
  default: return TCC_E_INTERNAL;
  }
}

int tcc_nvrtc_build(const char *cuda_source, const char *arch, const char *const *kernel_names,
                    tcc_nvrtc_result *out, tcc_error *err) {
  return tcc_nvrtc_build_ex(cuda_source, arch, kernel_names, NULL, out, err);
}

/* The compile itself, on the calling thread. */
static int build_now(const char *cuda_source, const char *arch, const char *const *kernel_names,
                     const tcc_nvrtc_options *opts, tcc_nvrtc_result *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  if (!cuda_source) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "nvrtc: no source");
  int rc = tcc_nvrtc_check_arch(arch, err);
  if (rc) return rc;
  static const tcc_nvrtc_options defaults;
  if (!opts) opts = &defaults;

  size_t n_names = 0, n_extra = 0;
  while (kernel_names && kernel_names[n_names]) n_names++;
  while (opts->extra && opts->extra[n_extra]) n_extra++;

  char arch_opt[48], reg_opt[48];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  const char **argv = calloc(4 + n_extra, sizeof *argv);
  if (!argv) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  int argc = 0;
  argv[argc++] = arch_opt;
  if (opts->fast_math) argv[argc++] = "--use_fast_math";
  if (opts->line_info) argv[argc++] = "-lineinfo";
  if (opts->max_registers > 0) {
    snprintf(reg_opt, sizeof reg_opt, "--maxrregcount=%d", opts->max_registers);
    argv[argc++] = reg_opt;
  }
  for (size_t i = 0; i < n_extra; i++) argv[argc++] = opts->extra[i];

  nvrtcProgram prog = NULL;
  char *log = NULL;
  nvrtcResult r = nv.fn.nvrtcCreateProgram(&prog, cuda_source,
                                           opts->program_name ? opts->program_name : "tcc_kernels.cu", 0,
                                           NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    prog = NULL;
    rc = tcc_error_set(err, nvrtc_error_code(r), "nvrtc: nvrtcCreateProgram: %s", nv.fn.nvrtcGetErrorString(r));
    goto done;
  }
  for (size_t i = 0; i < n_names; i++) {
    r = nv.fn.nvrtcAddNameExpression(prog, kernel_names[i]);
    if (r != NVRTC_SUCCESS) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "nvrtc: kernel name '%.100s': %s", kernel_names[i],
                         nv.fn.nvrtcGetErrorString(r));
      goto done;
    }
  }

  double t0 = now_ms();
  r = nv.fn.nvrtcCompileProgram(prog, argc, argv);
  out->compile_ms = now_ms() - t0;
  log = program_log(prog);
  if (!log) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  if (r != NVRTC_SUCCESS) {
    rc = tcc_error_set(err, nvrtc_error_code(r), "nvrtc: compiling for %s failed (%s): %s", arch,
                       nv.fn.nvrtcGetErrorString(r), *log ? log : "(no log)");
    goto done;
  }

  size_t cubin_size = 0, ptx_size = 0;
  if (nv.fn.nvrtcGetCUBINSize(prog, &cubin_size) != NVRTC_SUCCESS || cubin_size == 0 ||
      nv.fn.nvrtcGetPTXSize(prog, &ptx_size) != NVRTC_SUCCESS || ptx_size == 0) {
    rc = tcc_error_set(err, TCC_E_INTERNAL, "nvrtc: no cubin or PTX for %s (cubin %zu bytes, PTX %zu bytes)", arch,
                       cubin_size, ptx_size);
    goto done;
  }
  out->cubin = malloc(cubin_size);
  out->ptx = malloc(ptx_size + 1);
  out->lowered_names = calloc(n_names ? n_names : 1, sizeof *out->lowered_names);
  if (!out->cubin || !out->ptx || !out->lowered_names) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  if (nv.fn.nvrtcGetCUBIN(prog, (char *)out->cubin) != NVRTC_SUCCESS ||
      nv.fn.nvrtcGetPTX(prog, out->ptx) != NVRTC_SUCCESS) {
    rc = tcc_error_set(err, TCC_E_UNAVAILABLE, "nvrtc: reading the cubin or PTX failed");
    goto done;
  }
  out->cubin_size = cubin_size;
  out->ptx[ptx_size] = '\0';
  out->ptx_size = strlen(out->ptx);
  for (size_t i = 0; i < n_names; i++) {
    const char *lowered = NULL;
    r = nv.fn.nvrtcGetLoweredName(prog, kernel_names[i], &lowered);
    if (r != NVRTC_SUCCESS || !lowered) {
      rc = tcc_error_set(err, TCC_E_INTERNAL, "nvrtc: no lowered name for kernel '%.100s': %s", kernel_names[i],
                         nv.fn.nvrtcGetErrorString(r));
      goto done;
    }
    out->lowered_names[i] = strdup(lowered);
    out->n_kernels = i + 1;
    if (!out->lowered_names[i]) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      goto done;
    }
    if (tcc_cubin_has_entry(out->cubin, out->cubin_size, lowered) != 1) {
      rc = tcc_error_set(err, TCC_E_INTERNAL, "nvrtc: '%.100s' (symbol %.100s) is not a __global__ kernel of the cubin",
                         kernel_names[i], lowered);
      goto done;
    }
  }
  snprintf(out->arch, sizeof out->arch, "%s", arch);
  out->log = log;
  log = NULL;
  rc = 0;
done:
  if (prog) nv.fn.nvrtcDestroyProgram(&prog);
  free(argv);
  free(log);
  if (rc) {
    double ms = out->compile_ms;
    tcc_nvrtc_result_free(out);
    out->compile_ms = ms;
  }
  return rc;
}

/* A compile with a deadline: a detached thread runs build_now on its
 * own copies of the inputs; the caller waits on `done` until the
 * deadline. Whoever of the two finishes last frees the job (refs). */
typedef struct build_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs, done, abandoned;
  char *source, arch[32], *program_name;
  char **names, **extra;
  tcc_nvrtc_options opts;
  tcc_nvrtc_result result;
  tcc_error err;
  int rc;
} build_job;

static int n_abandoned;   /* atomic */

int tcc_nvrtc_abandoned(void) { return __atomic_load_n(&n_abandoned, __ATOMIC_SEQ_CST); }

static void strv_free(char **v) {
  for (size_t i = 0; v && v[i]; i++) free(v[i]);
  free(v);
}

static char **strv_copy(const char *const *v, int *oom) {
  size_t n = 0;
  while (v && v[n]) n++;
  char **c = calloc(n + 1, sizeof *c);
  if (!c) {
    *oom = 1;
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (!(c[i] = strdup(v[i]))) *oom = 1;
  return c;
}

static void job_put(build_job *j) {
  pthread_mutex_lock(&j->mu);
  int last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  tcc_nvrtc_result_free(&j->result);
  free(j->source);
  free(j->program_name);
  strv_free(j->names);
  strv_free(j->extra);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static void *job_run(void *arg) {
  build_job *j = arg;
  j->rc = build_now(j->source, j->arch, (const char *const *)j->names, &j->opts, &j->result, &j->err);
  pthread_mutex_lock(&j->mu);
  j->done = 1;
  int abandoned = j->abandoned;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (abandoned) __atomic_sub_fetch(&n_abandoned, 1, __ATOMIC_SEQ_CST);
  job_put(j);
  return NULL;
}

int tcc_nvrtc_build_ex(const char *cuda_source, const char *arch, const char *const *kernel_names,
                       const tcc_nvrtc_options *opts, tcc_nvrtc_result *out, tcc_error *err) {
  if (!opts || opts->timeout_ms <= 0) return build_now(cuda_source, arch, kernel_names, opts, out, err);
  memset(out, 0, sizeof *out);
  if (!cuda_source) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "nvrtc: no source");
  int rc = tcc_nvrtc_check_arch(arch, err);
  if (rc) return rc;
  build_job *j = calloc(1, sizeof *j);
  if (!j) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 1;
  int oom = 0;
  snprintf(j->arch, sizeof j->arch, "%s", arch);
  j->opts = *opts;
  j->opts.timeout_ms = 0;
  if (!(j->source = strdup(cuda_source))) oom = 1;
  if (opts->program_name && !(j->program_name = strdup(opts->program_name))) oom = 1;
  j->names = strv_copy(kernel_names, &oom);
  j->extra = strv_copy(opts->extra, &oom);
  j->opts.program_name = j->program_name;
  j->opts.extra = (const char *const *)j->extra;
  if (oom) {
    job_put(j);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  pthread_attr_t attr;
  pthread_t tid;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  j->refs = 2;
  int e = pthread_create(&tid, &attr, job_run, j);
  pthread_attr_destroy(&attr);
  if (e) {
    j->refs = 1;
    job_put(j);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "nvrtc: cannot start the compile thread: %s", strerror(e));
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += opts->timeout_ms / 1000;
  deadline.tv_nsec += (long)(opts->timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&j->mu);
  while (!j->done)
    if (pthread_cond_timedwait(&j->cv, &j->mu, &deadline) == ETIMEDOUT) break;
  if (!j->done) {
    j->abandoned = 1;
    __atomic_add_fetch(&n_abandoned, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&j->mu);
    job_put(j);
    return tcc_error_set(err, TCC_E_DEADLINE_EXCEEDED,
                         "nvrtc: compiling for %s took longer than %d ms (abandoned)", arch, opts->timeout_ms);
  }
  pthread_mutex_unlock(&j->mu);
  rc = j->rc;
  if (rc) {
    if (err) *err = j->err;
  } else {
    *out = j->result;
    memset(&j->result, 0, sizeof j->result);
  }
  out->compile_ms = j->result.compile_ms ? j->result.compile_ms : out->compile_ms;
  job_put(j);
  return rc;
}

#else /* !TCC_HAVE_CUDA: configured without NVRTC */

static int not_built(tcc_error *err) {
  return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                       "NVRTC not available: this build was configured without CUDA (no nvrtc.h + libnvrtc "
                       "in -Dcudahome or .deps/cuda: run scripts/setup-cuda, then meson setup --reconfigure)");
}

int tcc_nvrtc_available(tcc_error *err) { return not_built(err); }

int tcc_nvrtc_version(int *major, int *minor, tcc_error *err) {
  *major = *minor = 0;
  return not_built(err);
}

int tcc_nvrtc_archs(char *out, size_t cap, tcc_error *err) {
  if (cap) out[0] = '\0';
  return not_built(err);
}

int tcc_nvrtc_identity(char *out, size_t cap, tcc_error *err) {
  if (cap) out[0] = '\0';
  return not_built(err);
}

int tcc_nvrtc_check_arch(const char *arch, tcc_error *err) {
  int num;
  char suffix;
  if (parse_arch(arch, &num, &suffix) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "unknown CUDA arch '%.32s'", arch ? arch : "(null)");
  return not_built(err);
}

int tcc_nvrtc_build(const char *cuda_source, const char *arch, const char *const *kernel_names,
                    tcc_nvrtc_result *out, tcc_error *err) {
  return tcc_nvrtc_build_ex(cuda_source, arch, kernel_names, NULL, out, err);
}

int tcc_nvrtc_build_ex(const char *cuda_source, const char *arch, const char *const *kernel_names,
                       const tcc_nvrtc_options *opts, tcc_nvrtc_result *out, tcc_error *err) {
  (void)cuda_source, (void)kernel_names, (void)opts;
  memset(out, 0, sizeof *out);
  return tcc_nvrtc_check_arch(arch, err);
}

int tcc_nvrtc_abandoned(void) { return 0; }

#endif
