/*
 * cuda.c — the runtime's CUDA loader: libcuda dlopen'ed, modules cached
 * per (context, digest), launch plans run directly or as CUDA graphs.
 * The contract (contexts, cubin vs PTX, argument binding, graphs) is at
 * the top of tcc_runtime.h.
 *
 * State, all behind one mutex (drv_mu) unless noted:
 *   drv            the driver: handle, functions, cuInit's outcome
 *                  (written once under pthread_once, then read-only)
 *   primary[]      primary contexts retained so far, by device index
 *                  (retained once, kept for the life of the process)
 *   modules        the module cache: (context, digest) -> CUmodule + refs
 * and per kernel, behind its own mutex: the captured graphs.
 *
 * Loading a kernel:
 *   driver -> context (primary or current) -> push it -> device arch ->
 *   module from cache, or cuModuleLoadData(cubin) when the arch allows,
 *   else cuModuleLoadDataEx(PTX) (JIT) -> cuModuleGetFunction for each
 *   launch + checks (params, block size, dynamic shared) -> pop.
 *
 * Library steps: a cuBLAS handle (cuda_blas.c) and a cuDNN handle
 * (cuda_dnn.c) per kernel, made at load when its plan has such steps;
 * each cuDNN step's descriptors and algorithm are chosen at load too,
 * and its workspace follows the plan's in the caller's workspace.
 *
 * A launch:
 *   args -> push context -> [graphs on, capturable stream]
 *        -> lookup pointer set -> replay | capture + instantiate + replay
 *   or  -> cuLaunchKernel for each launch -> pop.
 */
#include "tcc_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_blas.h"
#include "cuda_dnn.h"
#include "cuda_driver.h"
#include "tcc_digest.h"

#define EM_CUDA 190
#define MAX_DEVICES 64
#define DEFAULT_GRAPH_CACHE 16
#define ARGS_ON_STACK 64

/* ------------------------------------------------------------------ driver */

static struct {
  int ok;
  char why[600];                   /* when !ok */
  void *lib;
  int version;
  int n_devices;
#define TCU_FIELD(name, ret, params) ret(*name) params;
  TCU_DRIVER_FUNCTIONS(TCU_FIELD)
  TCU_DRIVER_OPTIONAL(TCU_FIELD)
#undef TCU_FIELD
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t drv_mu = PTHREAD_MUTEX_INITIALIZER;
static tcu_context primary[MAX_DEVICES];

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" */
static void cu_describe(tcu_result r, char *buf, size_t cap) {
  const char *name = NULL, *text = NULL;
  if (drv.cuGetErrorName && drv.cuGetErrorName(r, &name) != TCU_SUCCESS) name = NULL;
  if (drv.cuGetErrorString && drv.cuGetErrorString(r, &text) != TCU_SUCCESS) text = NULL;
  if (name)
    snprintf(buf, cap, "%s (%s)", name, text ? text : "?");
  else
    snprintf(buf, cap, "CUresult %d", r);
}

/* Fills err with "<what>: <CUDA error>" and returns code. */
static int cu_fail(tcc_error *err, int code, tcu_result r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int cu_fail(tcc_error *err, int code, tcu_result r, const char *fmt, ...) {
  char what[600], desc[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  cu_describe(r, desc, sizeof desc);
  return tcc_error_set(err, code, "%s: %s", what, desc);
}

static void driver_load(void) {
  const char *path = getenv("TCC_CUDA_LIBRARY");
  if (!path || !*path) path = "libcuda.so.1";
  drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    const char *e = dlerror();
    snprintf(drv.why, sizeof drv.why, "%s not found: no NVIDIA driver on this machine (%s)", path,
             e ? e : "dlopen failed");
    return;
  }
  void *sym;
#define TCU_RESOLVE(name, ret, params)                                                   \
  if (!(sym = dlsym(drv.lib, #name))) {                                                  \
    snprintf(drv.why, sizeof drv.why, "%s has no symbol %s: the NVIDIA driver is too old", path, #name); \
    return;                                                                              \
  }                                                                                      \
  memcpy(&drv.name, &sym, sizeof sym);
  TCU_DRIVER_FUNCTIONS(TCU_RESOLVE)
#undef TCU_RESOLVE
#define TCU_RESOLVE_OPTIONAL(name, ret, params) \
  if ((sym = dlsym(drv.lib, #name))) memcpy(&drv.name, &sym, sizeof sym);
  TCU_DRIVER_OPTIONAL(TCU_RESOLVE_OPTIONAL)
#undef TCU_RESOLVE_OPTIONAL
  tcu_result r = drv.cuInit(0);
  if (r != TCU_SUCCESS) {
    char desc[300];
    cu_describe(r, desc, sizeof desc);
    snprintf(drv.why, sizeof drv.why, "cuInit failed: %s", desc);
    return;
  }
  if (drv.cuDriverGetVersion(&drv.version) != TCU_SUCCESS) drv.version = 0;
  r = drv.cuDeviceGetCount(&drv.n_devices);
  if (r != TCU_SUCCESS || drv.n_devices <= 0) {
    char desc[300];
    cu_describe(r != TCU_SUCCESS ? r : TCU_ERROR_NO_DEVICE, desc, sizeof desc);
    snprintf(drv.why, sizeof drv.why, "no CUDA device: %s", desc);
    return;
  }
  if (drv.n_devices > MAX_DEVICES) drv.n_devices = MAX_DEVICES;
  drv.ok = 1;
}

int tcc_rt_cuda_available(tcc_error *err) {
  pthread_once(&drv_once, driver_load);
  if (drv.ok) return 0;
  return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s", drv.why);
}

int tcc_rt_cuda_driver_version(int *version, tcc_error *err) {
  int rc = tcc_rt_cuda_available(err);
  *version = rc ? 0 : drv.version;
  return rc;
}

int tcc_rt_cuda_device_count(int *count, tcc_error *err) {
  int rc = tcc_rt_cuda_available(err);
  *count = rc ? 0 : drv.n_devices;
  return rc;
}

/* The primary context of device index `device`, retained on first use.
 * Returns 0, INVALID_ARGUMENT or INTERNAL. */
static int primary_context(int device, tcu_context *ctx, tcc_error *err) {
  int rc = tcc_rt_cuda_available(err);
  if (rc) return rc;
  if (device < 0 || device >= drv.n_devices)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no CUDA device %d (this machine has %d)", device,
                         drv.n_devices);
  pthread_mutex_lock(&drv_mu);
  if (!primary[device]) {
    tcu_device dev;
    tcu_result r = drv.cuDeviceGet(&dev, device);
    if (r == TCU_SUCCESS) r = drv.cuDevicePrimaryCtxRetain(&primary[device], dev);
    if (r != TCU_SUCCESS) {
      primary[device] = NULL;
      pthread_mutex_unlock(&drv_mu);
      return cu_fail(err, TCC_E_INTERNAL, r, "retaining the primary context of device %d", device);
    }
  }
  *ctx = primary[device];
  pthread_mutex_unlock(&drv_mu);
  return 0;
}

/* Makes ctx current unless it is; *pushed says whether to pop. */
static tcu_result ctx_enter(tcu_context ctx, int *pushed) {
  tcu_context cur = NULL;
  *pushed = 0;
  if (drv.cuCtxGetCurrent(&cur) == TCU_SUCCESS && cur == ctx) return TCU_SUCCESS;
  tcu_result r = drv.cuCtxPushCurrent_v2(ctx);
  *pushed = r == TCU_SUCCESS;
  return r;
}

static void ctx_leave(int pushed) {
  tcu_context popped;
  if (pushed) drv.cuCtxPopCurrent_v2(&popped);
}

/* Compute capability of a device handle. */
static tcu_result device_cc(tcu_device dev, int *major, int *minor) {
  tcu_result r = drv.cuDeviceGetAttribute(major, TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == TCU_SUCCESS) r = drv.cuDeviceGetAttribute(minor, TCU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  return r;
}

int tcc_rt_cuda_device_arch(int device, char arch[16], char *name, size_t name_cap, tcc_error *err) {
  int rc = tcc_rt_cuda_available(err);
  if (rc) return rc;
  if (device < 0 || device >= drv.n_devices)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no CUDA device %d (this machine has %d)", device,
                         drv.n_devices);
  tcu_device dev;
  int major = 0, minor = 0;
  tcu_result r = drv.cuDeviceGet(&dev, device);
  if (r == TCU_SUCCESS) r = device_cc(dev, &major, &minor);
  if (r == TCU_SUCCESS && name && name_cap) r = drv.cuDeviceGetName(name, (int)(name_cap > 4096 ? 4096 : name_cap), dev);
  if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r, "querying device %d", device);
  snprintf(arch, 16, "sm_%d%d", major, minor);
  return 0;
}

/* ------------------------------------------------------------------ arch */

/* An arch: sm_<major><minor>[suffix]. */
typedef struct arch_id {
  int major, minor;
  char suffix;                 /* '\0', 'a' or 'f' */
} arch_id;

/* Parses "sm_90a" (or "cuda:sm_90a"). Returns 0 or -1. */
static int arch_parse(const char *s, arch_id *a) {
  if (!s) return -1;
  if (!strncmp(s, "cuda:", 5)) s += 5;
  if (strncmp(s, "sm_", 3) != 0) return -1;
  s += 3;
  int v = 0, digits = 0;
  while (*s >= '0' && *s <= '9' && digits < 4) v = v * 10 + (*s++ - '0'), digits++;
  if (digits < 2) return -1;
  a->suffix = '\0';
  if (*s == 'a' || *s == 'f') a->suffix = *s++;
  if (*s) return -1;
  a->major = v / 10;
  a->minor = v % 10;
  return 0;
}

static void arch_format(const arch_id *a, char *buf, size_t cap) {
  if (a->suffix)
    snprintf(buf, cap, "sm_%d%d%c", a->major, a->minor, a->suffix);
  else
    snprintf(buf, cap, "sm_%d%d", a->major, a->minor);
}

/* The cubin's SM from its ELF header (ABI 8, CUDA 13: bits 8-15 of
 * e_flags; before: bits 0-7); -1 when it is not a 64-bit CUDA ELF. */
static int cubin_sm(const uint8_t *b, size_t n) {
  if (!b || n < 64 || memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2 || b[5] != 1 || (b[18] | b[19] << 8) != EM_CUDA)
    return -1;
  uint32_t flags = (uint32_t)b[0x30] | (uint32_t)b[0x31] << 8 | (uint32_t)b[0x32] << 16 | (uint32_t)b[0x33] << 24;
  return b[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
}

/* Whether a cubin of arch a runs on a device of capability major.minor. */
static int cubin_runs_on(const arch_id *a, int major, int minor) {
  if (a->major != major) return 0;
  return a->suffix == 'a' ? a->minor == minor : a->minor <= minor;
}

/* Whether the PTX of arch a JIT-compiles for a device of capability
 * major.minor. */
static int ptx_runs_on(const arch_id *a, int major, int minor) {
  if (a->suffix == 'a') return a->major == major && a->minor == minor;
  if (a->suffix == 'f') return a->major == major && a->minor <= minor;
  return major > a->major || (major == a->major && minor >= a->minor);
}

/* ------------------------------------------------------------------ modules */

typedef struct module_entry {
  struct module_entry *next;
  tcu_context ctx;
  char digest[TCC_SHA256_HEX];
  size_t len;
  tcu_module mod;
  int refs;
  int from_ptx;
} module_entry;

static module_entry *modules;   /* behind drv_mu */

/* JIT-compiles PTX in the current context. Returns 0 or INTERNAL with
 * the driver's log. */
static int load_ptx(const char *ptx, tcu_module *mod, const char *why, tcc_error *err) {
  char elog[2048] = "", ilog[512] = "";
  int opts[4] = {TCU_JIT_ERROR_LOG_BUFFER, TCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, TCU_JIT_INFO_LOG_BUFFER,
                 TCU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void *vals[4] = {elog, (void *)(uintptr_t)sizeof elog, ilog, (void *)(uintptr_t)sizeof ilog};
  tcu_result r = drv.cuModuleLoadDataEx(mod, ptx, 4, opts, vals);
  if (r == TCU_SUCCESS) return 0;
  elog[sizeof elog - 1] = '\0';
  return cu_fail(err, TCC_E_INTERNAL, r, "JIT-compiling the PTX (%s) failed%s%s", why, *elog ? ": " : "", elog);
}

/* Finds or loads the module for (ctx, digest) in the current context
 * (ctx). Returns 0 with *out referenced, or an error. */
static int module_get(tcu_context ctx, const uint8_t *cubin, size_t len, const char *digest, const arch_id *art,
                      int dev_major, int dev_minor, const char *ptx, module_entry **out, tcc_error *err) {
  pthread_mutex_lock(&drv_mu);
  if (digest) {
    for (module_entry *m = modules; m; m = m->next) {
      if (m->ctx == ctx && m->len == len && !strcmp(m->digest, digest)) {
        m->refs++;
        *out = m;
        pthread_mutex_unlock(&drv_mu);
        return 0;
      }
    }
  }
  int rc = 0;
  module_entry *m = calloc(1, sizeof *m);
  if (!m) {
    pthread_mutex_unlock(&drv_mu);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  char art_s[16], dev_s[16];
  arch_format(art, art_s, sizeof art_s);
  snprintf(dev_s, sizeof dev_s, "sm_%d%d", dev_major, dev_minor);
  if (cubin_runs_on(art, dev_major, dev_minor)) {
    tcu_result r = drv.cuModuleLoadData(&m->mod, cubin);
    if (r != TCU_SUCCESS) {
      if (ptx && (r == TCU_ERROR_NO_BINARY_FOR_GPU || r == TCU_ERROR_INVALID_IMAGE) &&
          ptx_runs_on(art, dev_major, dev_minor)) {
        rc = load_ptx(ptx, &m->mod, "the driver refused the cubin", err);
        m->from_ptx = 1;
      } else {
        rc = cu_fail(err, r == TCU_ERROR_INVALID_IMAGE ? TCC_E_INVALID_ARGUMENT : TCC_E_INTERNAL, r,
                     "cuModuleLoadData of the %s cubin on a %s device", art_s, dev_s);
      }
    }
  } else if (ptx && ptx_runs_on(art, dev_major, dev_minor)) {
    char why[64];
    snprintf(why, sizeof why, "cubin %s, device %s", art_s, dev_s);
    rc = load_ptx(ptx, &m->mod, why, err);
    m->from_ptx = 1;
  } else {
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "arch mismatch: artifact %s, device %s (%s)", art_s, dev_s,
                       !ptx ? "no PTX to JIT-compile; compile for the device's arch"
                            : "the PTX cannot run there either; compile for the device's arch");
  }
  if (rc) {
    free(m);
    pthread_mutex_unlock(&drv_mu);
    return rc;
  }
  m->ctx = ctx;
  m->len = len;
  m->refs = 1;
  if (digest) {
    snprintf(m->digest, sizeof m->digest, "%s", digest);
    m->next = modules;
    modules = m;
  }
  *out = m;
  pthread_mutex_unlock(&drv_mu);
  return 0;
}

/* Drops a reference; the last one unloads (in the module's context). */
static void module_put(module_entry *m) {
  if (!m) return;
  pthread_mutex_lock(&drv_mu);
  if (--m->refs > 0) {
    pthread_mutex_unlock(&drv_mu);
    return;
  }
  for (module_entry **p = &modules; *p; p = &(*p)->next) {
    if (*p == m) {
      *p = m->next;
      break;
    }
  }
  pthread_mutex_unlock(&drv_mu);
  int pushed;
  if (ctx_enter(m->ctx, &pushed) == TCU_SUCCESS) {
    drv.cuModuleUnload(m->mod);
    ctx_leave(pushed);
  }
  free(m);
}

/* ------------------------------------------------------------------ kernels */

typedef struct launch {
  char *name;
  tcu_function fn;
  unsigned grid[3], block[3], shared;
  int is_gemm;                  /* a cuBLAS step: gemm, not fn */
  tcc_rt_cuda_gemm_step gemm;      /* (constant names not kept: resolved below) */
  uint64_t const_a, const_b;    /* module addresses of constant operands */
  int is_conv;                  /* a cuDNN step: conv, not fn */
  tcc_rt_cuda_conv_step conv;      /* (constant names: our copies) */
  tcc_rt_cudnn_conv *dnn;       /* its descriptors and algorithm */
  uint64_t const_x, const_w, const_y;
} launch;

typedef struct graph_entry {
  uint64_t *ptrs;               /* n_params pointer values */
  tcu_graph_exec exec;
  uint64_t last_used;
} graph_entry;

struct tcc_rt_cuda_kernel {
  tcu_context ctx;
  int device;                   /* the context's device (handle = ordinal) */
  char device_arch[16];
  module_entry *module;
  launch *launches;
  size_t n_launches;
  size_t n_inputs, n_outputs, n_params;
  uint64_t workspace_bytes;     /* the plan's */
  uint64_t dnn_workspace;       /* cuDNN's, after the plan's (256-aligned) */

  pthread_mutex_t mu;           /* the graph cache */
  int graphs;                   /* atomic */
  size_t graph_max;
  graph_entry *graph_cache;
  size_t n_graphs;
  uint64_t tick;

  uint64_t direct, captures, replays; /* atomic */
  tcc_rt_cublas *blas;             /* when the plan has cuBLAS steps */
  tcc_rt_cudnn *dnn;               /* when the plan has cuDNN steps */
};

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

/* Resolves a constant operand of a cuBLAS or cuDNN step to its module
 * address. */
static int library_constant(tcc_rt_cuda_kernel *k, const launch *L, const tcc_rt_cuda_buffer *b, uint64_t *out,
                            tcc_error *err) {
  *out = 0;
  if (b->base != TCC_RT_CUDA_BUF_CONSTANT) return 0;
  tcu_deviceptr p = 0;
  size_t bytes = 0;
  tcu_result r = drv.cuModuleGetGlobal_v2(&p, &bytes, k->module->mod, b->constant ? b->constant : "");
  if (r != TCU_SUCCESS)
    return cu_fail(err, TCC_E_NOT_FOUND, r, "step '%.100s': constant '%.64s' is not in the module", L->name,
                   b->constant ? b->constant : "");
  *out = (uint64_t)p;
  return 0;
}

/* Resolves and checks launch i's function. */
static int launch_prepare(tcc_rt_cuda_kernel *k, launch *L, size_t i, int optin_shared, tcc_error *err) {
  if (L->is_conv) {
    int rc = 0;
    if (!k->dnn) rc = tcc_rt_cudnn_create(&k->dnn, err);
    if (rc) {
      tcc_error_prefix(err, "step '%.100s' (launch %zu of %zu)", L->name, i + 1, k->n_launches);
      return rc;
    }
    if ((rc = library_constant(k, L, &L->conv.x, &L->const_x, err)) ||
        (rc = library_constant(k, L, &L->conv.w, &L->const_w, err)) ||
        (rc = library_constant(k, L, &L->conv.y, &L->const_y, err)))
      return rc;
    uint64_t ws = 0;
    if ((rc = tcc_rt_cudnn_conv_prepare(k->dnn, &L->conv, L->name, &L->dnn, &ws, err))) return rc;
    if (ws > k->dnn_workspace) k->dnn_workspace = ws;
    return 0;
  }
  if (L->is_gemm) {
    int rc = 0;
    if (!k->blas) rc = tcc_rt_cublas_create(&k->blas, err);
    if (rc) {
      tcc_error_prefix(err, "step '%.100s' (launch %zu of %zu)", L->name, i + 1, k->n_launches);
      return rc;
    }
    if ((rc = library_constant(k, L, &L->gemm.a, &L->const_a, err))) return rc;
    return library_constant(k, L, &L->gemm.b, &L->const_b, err);
  }
  tcu_result r = drv.cuModuleGetFunction(&L->fn, k->module->mod, L->name);
  if (r != TCU_SUCCESS)
    return cu_fail(err, TCC_E_NOT_FOUND, r, "kernel '%.100s' (launch %zu of %zu) is not in the module", L->name,
                   i + 1, k->n_launches);
  if (drv.cuFuncGetParamInfo) {
    size_t count = 0, off, size;
    while (drv.cuFuncGetParamInfo(L->fn, count, &off, &size) == TCU_SUCCESS) {
      if (size != 8)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "kernel '%.100s': parameter %zu is %zu bytes; the tccd ABI passes 8-byte pointers",
                             L->name, count, size);
      count++;
    }
    if (count != k->n_params)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "kernel '%.100s' takes %zu parameters; the tccd ABI passes %zu (%zu inputs, %zu "
                           "outputs, workspace)",
                           L->name, count, k->n_params, k->n_inputs, k->n_outputs);
  }
  int max_threads = 0, static_shared = 0;
  r = drv.cuFuncGetAttribute(&max_threads, TCU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, L->fn);
  if (r == TCU_SUCCESS) r = drv.cuFuncGetAttribute(&static_shared, TCU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, L->fn);
  if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r, "kernel '%.100s': cuFuncGetAttribute", L->name);
  uint64_t threads = (uint64_t)L->block[0] * L->block[1] * L->block[2];
  if (threads > (uint64_t)max_threads)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "kernel '%.100s': block %ux%ux%u = %llu threads; this kernel can run at most %d per block",
                         L->name, L->block[0], L->block[1], L->block[2], (unsigned long long)threads, max_threads);
  if (L->shared > 48 * 1024) {
    if ((int64_t)L->shared + static_shared > optin_shared)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "kernel '%.100s': %u bytes of dynamic + %d of static shared memory; the device "
                           "allows %d per block",
                           L->name, L->shared, static_shared, optin_shared);
    r = drv.cuFuncSetAttribute(L->fn, TCU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)L->shared);
    if (r != TCU_SUCCESS)
      return cu_fail(err, TCC_E_INVALID_ARGUMENT, r, "kernel '%.100s': %u bytes of dynamic shared memory",
                     L->name, L->shared);
  }
  return 0;
}

int tcc_rt_cuda_kernel_load(const uint8_t *cubin, size_t len, const char *digest_hex, const tcc_rt_cuda_plan *plan,
                            const tcc_rt_cuda_options *opts, tcc_rt_cuda_kernel **out, tcc_error *err) {
  *out = NULL;
  static const tcc_rt_cuda_options defaults;
  if (!opts) opts = &defaults;
  if (!plan) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no launch plan");
  int sm = cubin_sm(cubin, len);
  if (sm < 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "artifact is not a cubin (a 64-bit CUDA ELF)");
  arch_id art;
  if (plan->arch) {
    if (arch_parse(plan->arch, &art) != 0)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "bad CUDA arch '%.32s' (expected e.g. sm_90a)", plan->arch);
    if (art.major * 10 + art.minor != sm)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the manifest says %.32s but the cubin is for sm_%d",
                           plan->arch, sm);
  } else {
    art.major = sm / 10, art.minor = sm % 10, art.suffix = '\0';
  }
  if (plan->n_launches == 0 || !plan->launches)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the launch plan has no kernels");
  for (size_t i = 0; i < plan->n_launches; i++) {
    const tcc_rt_cuda_launch *l = &plan->launches[i];
    if (!l->name || !*l->name)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "launch %zu of %zu has no kernel name", i + 1,
                           plan->n_launches);
  }
  int rc = tcc_rt_cuda_available(err);
  if (rc) return rc;

  /* The context. */
  tcu_context ctx = NULL;
  if (opts->context == TCC_RT_CUDA_CURRENT || opts->context == TCC_RT_CUDA_CURRENT_OR_PRIMARY) {
    tcu_result r = drv.cuCtxGetCurrent(&ctx);
    if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r, "cuCtxGetCurrent");
    if (!ctx && opts->context == TCC_RT_CUDA_CURRENT)
      return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "no current CUDA context on this thread");
  }
  if (!ctx && (rc = primary_context(opts->device, &ctx, err))) return rc;

  tcc_rt_cuda_kernel *k = calloc(1, sizeof *k);
  if (!k) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  pthread_mutex_init(&k->mu, NULL);
  k->ctx = ctx;
  k->n_inputs = plan->n_inputs;
  k->n_outputs = plan->n_outputs;
  k->n_params = plan->n_inputs + plan->n_outputs + 1;
  k->workspace_bytes = plan->workspace_bytes;
  k->graphs = opts->graphs != 0;
  k->graph_max = opts->graph_cache_max ? opts->graph_cache_max : DEFAULT_GRAPH_CACHE;
  k->launches = calloc(plan->n_launches, sizeof *k->launches);
  if (!k->launches) {
    tcc_rt_cuda_kernel_unload(k);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  k->n_launches = plan->n_launches;
  for (size_t i = 0; i < plan->n_launches; i++) {
    const tcc_rt_cuda_launch *l = &plan->launches[i];
    launch *L = &k->launches[i];
    if (!(L->name = strdup(l->name))) {
      tcc_rt_cuda_kernel_unload(k);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int d = 0; d < 3; d++) {
      L->grid[d] = l->grid[d] ? l->grid[d] : 1;
      L->block[d] = l->block[d] ? l->block[d] : 1;
    }
    L->shared = l->shared_bytes;
    if (l->gemm) {
      L->is_gemm = 1;
      L->gemm = *l->gemm;
      L->gemm.a.constant = L->gemm.b.constant = L->gemm.c.constant = NULL;   /* ours: below */
      const tcc_rt_cuda_buffer *bs[3] = {&l->gemm->a, &l->gemm->b, &l->gemm->c};
      for (int j = 0; j < 3; j++) {
        const tcc_rt_cuda_buffer *b = bs[j];
        int bad = b->base == TCC_RT_CUDA_BUF_INPUT    ? b->index >= plan->n_inputs
                  : b->base == TCC_RT_CUDA_BUF_OUTPUT ? b->index >= plan->n_outputs
                  : b->base == TCC_RT_CUDA_BUF_WORKSPACE ? b->offset_bytes >= plan->workspace_bytes
                  : b->base == TCC_RT_CUDA_BUF_CONSTANT  ? j == 2 || !b->constant
                                                      : 1;
        if (bad) {
          tcc_rt_cuda_kernel_unload(k);
          return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s' (launch %zu of %zu): operand %c names "
                               "no buffer of the plan", l->name, i + 1, plan->n_launches, "abc"[j]);
        }
      }
      /* our own copies of constant names (resolved at prepare, freed at unload) */
      if (l->gemm->a.constant) L->gemm.a.constant = strdup(l->gemm->a.constant);
      if (l->gemm->b.constant) L->gemm.b.constant = strdup(l->gemm->b.constant);
      if ((l->gemm->a.constant && !L->gemm.a.constant) || (l->gemm->b.constant && !L->gemm.b.constant)) {
        tcc_rt_cuda_kernel_unload(k);
        return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      }
    } else if (l->conv) {
      L->is_conv = 1;
      L->conv = *l->conv;
      L->conv.x.constant = L->conv.w.constant = L->conv.y.constant = NULL;   /* ours: below */
      const tcc_rt_cuda_buffer *bs[3] = {&l->conv->x, &l->conv->w, &l->conv->y};
      int written = l->conv->kind == TCC_RT_CUDA_CONV_BACKWARD_DATA     ? 0
                    : l->conv->kind == TCC_RT_CUDA_CONV_BACKWARD_FILTER ? 1
                                                                        : 2;
      for (int j = 0; j < 3; j++) {
        const tcc_rt_cuda_buffer *b = bs[j];
        int bad = b->base == TCC_RT_CUDA_BUF_INPUT       ? j == written || b->index >= plan->n_inputs
                  : b->base == TCC_RT_CUDA_BUF_OUTPUT    ? b->index >= plan->n_outputs
                  : b->base == TCC_RT_CUDA_BUF_WORKSPACE ? b->offset_bytes >= plan->workspace_bytes
                  : b->base == TCC_RT_CUDA_BUF_CONSTANT  ? j == written || !b->constant
                                                         : 1;
        if (bad) {
          tcc_rt_cuda_kernel_unload(k);
          return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "step '%.100s' (launch %zu of %zu): operand %c names "
                               "no buffer of the plan it may %s", l->name, i + 1, plan->n_launches, "xwy"[j],
                               j == written ? "write" : "read");
        }
      }
      char **names[3] = {(char **)&L->conv.x.constant, (char **)&L->conv.w.constant, (char **)&L->conv.y.constant};
      for (int j = 0; j < 3; j++)
        if (bs[j]->constant && bs[j]->base == TCC_RT_CUDA_BUF_CONSTANT && !(*names[j] = strdup(bs[j]->constant))) {
          tcc_rt_cuda_kernel_unload(k);
          return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
  }

  int pushed;
  tcu_result r = ctx_enter(ctx, &pushed);
  if (r != TCU_SUCCESS) {
    tcc_rt_cuda_kernel_unload(k);
    return cu_fail(err, TCC_E_INTERNAL, r, "making the CUDA context current");
  }
  tcu_device dev;
  int major = 0, minor = 0, optin = 48 * 1024;
  r = drv.cuCtxGetDevice(&dev);
  if (r == TCU_SUCCESS) r = device_cc(dev, &major, &minor);
  if (r == TCU_SUCCESS) r = drv.cuDeviceGetAttribute(&optin, TCU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  if (r != TCU_SUCCESS) {
    rc = cu_fail(err, TCC_E_INTERNAL, r, "querying the context's device");
    goto out;
  }
  k->device = dev;
  snprintf(k->device_arch, sizeof k->device_arch, "sm_%d%d", major, minor);
  if ((rc = module_get(ctx, cubin, len, digest_hex, &art, major, minor, opts->ptx, &k->module, err))) goto out;
  for (size_t i = 0; i < k->n_launches && !rc; i++) rc = launch_prepare(k, &k->launches[i], i, optin, err);
out:
  ctx_leave(pushed);
  if (rc) {
    tcc_rt_cuda_kernel_unload(k);
    return rc;
  }
  *out = k;
  return 0;
}

/* The device address of a cuBLAS or cuDNN operand for this launch's
 * pointers. */
static const void *library_operand(const tcc_rt_cuda_kernel *k, const tcc_rt_cuda_buffer *b, uint64_t constant,
                                   void **args) {
  uint64_t base = 0;
  switch (b->base) {
  case TCC_RT_CUDA_BUF_INPUT: base = *(const uint64_t *)args[b->index]; break;
  case TCC_RT_CUDA_BUF_OUTPUT: base = *(const uint64_t *)args[k->n_inputs + b->index]; break;
  case TCC_RT_CUDA_BUF_WORKSPACE: base = *(const uint64_t *)args[k->n_inputs + k->n_outputs]; break;
  case TCC_RT_CUDA_BUF_CONSTANT: base = constant; break;
  }
  return (const void *)(uintptr_t)(base + b->offset_bytes);
}

/* Each launch in order on stream. Returns 0 or INTERNAL naming the kernel. */
static int launch_direct(tcc_rt_cuda_kernel *k, tcu_stream stream, void **args, tcc_error *err) {
  for (size_t i = 0; i < k->n_launches; i++) {
    const launch *L = &k->launches[i];
    if (L->is_conv) {
      uint64_t ws = *(const uint64_t *)args[k->n_inputs + k->n_outputs];
      int rc = tcc_rt_cudnn_conv_run(k->dnn, stream, L->dnn, library_operand(k, &L->conv.x, L->const_x, args),
                                     library_operand(k, &L->conv.w, L->const_w, args),
                                     library_operand(k, &L->conv.y, L->const_y, args),
                                     k->dnn_workspace ? (void *)(uintptr_t)(ws + align256(k->workspace_bytes)) : NULL,
                                     L->name, i, k->n_launches, err);
      if (rc) return rc;
      continue;
    }
    if (L->is_gemm) {
      int rc = tcc_rt_cublas_gemm(k->blas, stream, &L->gemm, library_operand(k, &L->gemm.a, L->const_a, args),
                                  library_operand(k, &L->gemm.b, L->const_b, args),
                                  (void *)library_operand(k, &L->gemm.c, 0, args), L->name, i, k->n_launches, err);
      if (rc) return rc;
      continue;
    }
    tcu_result r = drv.cuLaunchKernel(L->fn, L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1],
                                      L->block[2], L->shared, stream, args, NULL);
    if (r != TCU_SUCCESS)
      return cu_fail(err, TCC_E_INTERNAL, r, "kernel '%.100s' (launch %zu of %zu): cuLaunchKernel", L->name, i + 1,
                     k->n_launches);
  }
  return 0;
}

static void graph_drop_all(tcc_rt_cuda_kernel *k) {
  for (size_t i = 0; i < k->n_graphs; i++) {
    drv.cuGraphExecDestroy(k->graph_cache[i].exec);
    free(k->graph_cache[i].ptrs);
  }
  k->n_graphs = 0;
}

/* Replays the graph captured for this pointer set, capturing it first
 * when there is none. Called with k->mu held. */
static int launch_graph(tcc_rt_cuda_kernel *k, tcu_stream stream, const uint64_t *vals, void **args, tcc_error *err) {
  size_t bytes = k->n_params * sizeof *vals;
  for (size_t i = 0; i < k->n_graphs; i++) {
    graph_entry *g = &k->graph_cache[i];
    if (!memcmp(g->ptrs, vals, bytes)) {
      g->last_used = ++k->tick;
      tcu_result r = drv.cuGraphLaunch(g->exec, stream);
      if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r, "cuGraphLaunch (replay)");
      __atomic_add_fetch(&k->replays, 1, __ATOMIC_RELAXED);
      return 0;
    }
  }
  if (!k->graph_cache && !(k->graph_cache = calloc(k->graph_max, sizeof *k->graph_cache)))
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  uint64_t *ptrs = malloc(bytes);
  if (!ptrs) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(ptrs, vals, bytes);

  tcu_result r = drv.cuStreamBeginCapture_v2(stream, TCU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != TCU_SUCCESS) {
    free(ptrs);
    return cu_fail(err, TCC_E_INTERNAL, r, "cuStreamBeginCapture");
  }
  int rc = launch_direct(k, stream, args, err);
  tcu_graph graph = NULL;
  r = drv.cuStreamEndCapture(stream, &graph); /* always ends the capture */
  if (!rc && r != TCU_SUCCESS) rc = cu_fail(err, TCC_E_INTERNAL, r, "cuStreamEndCapture");
  tcu_graph_exec exec = NULL;
  if (!rc) {
    r = drv.cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (r != TCU_SUCCESS) rc = cu_fail(err, TCC_E_INTERNAL, r, "cuGraphInstantiate");
  }
  if (graph) drv.cuGraphDestroy(graph);
  if (rc) {
    free(ptrs);
    return rc;
  }
  size_t slot = k->n_graphs;
  if (slot == k->graph_max) { /* drop the least recently used */
    slot = 0;
    for (size_t i = 1; i < k->n_graphs; i++)
      if (k->graph_cache[i].last_used < k->graph_cache[slot].last_used) slot = i;
    drv.cuGraphExecDestroy(k->graph_cache[slot].exec);
    free(k->graph_cache[slot].ptrs);
  } else {
    k->n_graphs++;
  }
  k->graph_cache[slot] = (graph_entry){.ptrs = ptrs, .exec = exec, .last_used = ++k->tick};
  __atomic_add_fetch(&k->captures, 1, __ATOMIC_RELAXED);
  r = drv.cuGraphLaunch(exec, stream);
  if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r, "cuGraphLaunch (first replay)");
  __atomic_add_fetch(&k->replays, 1, __ATOMIC_RELAXED);
  return 0;
}

int tcc_rt_cuda_kernel_launch(tcc_rt_cuda_kernel *k, void *stream, const void *const *inputs, void *const *outputs,
                              void *workspace, tcc_error *err) {
  if (!k) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no CUDA kernel loaded");
  if ((k->n_inputs && !inputs) || (k->n_outputs && !outputs))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel takes %zu inputs and %zu outputs", k->n_inputs,
                         k->n_outputs);
  if (tcc_rt_cuda_kernel_workspace_bytes(k) && !workspace)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel needs a workspace of %llu bytes",
                         (unsigned long long)tcc_rt_cuda_kernel_workspace_bytes(k));
  uint64_t vals_stack[ARGS_ON_STACK];
  void *args_stack[ARGS_ON_STACK];
  uint64_t *vals = vals_stack;
  void **args = args_stack;
  if (k->n_params > ARGS_ON_STACK) {
    vals = malloc(k->n_params * sizeof *vals);
    args = malloc(k->n_params * sizeof *args);
    if (!vals || !args) {
      free(vals), free(args);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
  }
  size_t p = 0;
  for (size_t i = 0; i < k->n_inputs; i++) vals[p++] = (uint64_t)(uintptr_t)inputs[i];
  for (size_t i = 0; i < k->n_outputs; i++) vals[p++] = (uint64_t)(uintptr_t)outputs[i];
  vals[p++] = (uint64_t)(uintptr_t)workspace;
  for (size_t i = 0; i < k->n_params; i++) args[i] = &vals[i];

  int rc = 0, pushed;
  tcu_result r = ctx_enter(k->ctx, &pushed);
  if (r != TCU_SUCCESS) {
    rc = cu_fail(err, TCC_E_INTERNAL, r, "making the kernel's CUDA context current");
    goto out;
  }
  int graphs = __atomic_load_n(&k->graphs, __ATOMIC_RELAXED);
  int capturing = 0;
  if (graphs && (uintptr_t)stream > 1 /* NULL and CU_STREAM_LEGACY cannot be captured */) {
    int status = TCU_STREAM_CAPTURE_STATUS_NONE;
    capturing = drv.cuStreamIsCapturing(stream, &status) != TCU_SUCCESS || status != TCU_STREAM_CAPTURE_STATUS_NONE;
  }
  if (graphs && (uintptr_t)stream > 1 && !capturing) {
    pthread_mutex_lock(&k->mu);
    rc = launch_graph(k, stream, vals, args, err);
    pthread_mutex_unlock(&k->mu);
  } else {
    rc = launch_direct(k, stream, args, err);
    if (!rc) __atomic_add_fetch(&k->direct, 1, __ATOMIC_RELAXED);
  }
  ctx_leave(pushed);
out:
  if (vals != vals_stack) free(vals), free(args);
  return rc;
}

void tcc_rt_cuda_kernel_set_graphs(tcc_rt_cuda_kernel *k, int on) {
  if (!k) return;
  pthread_mutex_lock(&k->mu);
  __atomic_store_n(&k->graphs, on != 0, __ATOMIC_RELAXED);
  if (!on && k->n_graphs) {
    int pushed;
    if (ctx_enter(k->ctx, &pushed) == TCU_SUCCESS) {
      graph_drop_all(k);
      ctx_leave(pushed);
    }
  }
  pthread_mutex_unlock(&k->mu);
}

void tcc_rt_cuda_kernel_stats(tcc_rt_cuda_kernel *k, tcc_rt_cuda_stats *out) {
  memset(out, 0, sizeof *out);
  if (!k) return;
  out->direct_launches = __atomic_load_n(&k->direct, __ATOMIC_RELAXED);
  out->graph_captures = __atomic_load_n(&k->captures, __ATOMIC_RELAXED);
  out->graph_replays = __atomic_load_n(&k->replays, __ATOMIC_RELAXED);
  out->from_ptx = k->module ? k->module->from_ptx : 0;
  out->device = k->device;
  snprintf(out->device_arch, sizeof out->device_arch, "%s", k->device_arch);
}

uint64_t tcc_rt_cuda_kernel_workspace_bytes(const tcc_rt_cuda_kernel *k) {
  if (!k) return 0;
  return k->dnn_workspace ? align256(k->workspace_bytes) + k->dnn_workspace : k->workspace_bytes;
}

void tcc_rt_cuda_kernel_unload(tcc_rt_cuda_kernel *k) {
  if (!k) return;
  if (k->n_graphs) {
    int pushed;
    if (ctx_enter(k->ctx, &pushed) == TCU_SUCCESS) {
      graph_drop_all(k);
      ctx_leave(pushed);
    }
  }
  free(k->graph_cache);
  if (k->blas || k->dnn) {
    int pushed;
    if (ctx_enter(k->ctx, &pushed) == TCU_SUCCESS) {
      tcc_rt_cublas_destroy(k->blas);
      for (size_t i = 0; i < k->n_launches && k->launches; i++) tcc_rt_cudnn_conv_free(k->launches[i].dnn);
      tcc_rt_cudnn_destroy(k->dnn);
      ctx_leave(pushed);
    }
  }
  module_put(k->module);
  for (size_t i = 0; i < k->n_launches && k->launches; i++) {
    free(k->launches[i].name);
    free((char *)k->launches[i].gemm.a.constant);
    free((char *)k->launches[i].gemm.b.constant);
    free((char *)k->launches[i].conv.x.constant);
    free((char *)k->launches[i].conv.w.constant);
    free((char *)k->launches[i].conv.y.constant);
  }
  free(k->launches);
  pthread_mutex_destroy(&k->mu);
  free(k);
}

/* ------------------------------------------------------------------ memory */

/* Runs in device's primary context: enter, *r = the call, leave. */
#define IN_PRIMARY(device, err, what, call)                                  \
  do {                                                                       \
    tcu_context ctx_;                                                        \
    int rc_ = primary_context(device, &ctx_, err), pushed_;                  \
    if (rc_) return rc_;                                                     \
    tcu_result r_ = ctx_enter(ctx_, &pushed_);                               \
    if (r_ == TCU_SUCCESS) {                                                 \
      r_ = (call);                                                           \
      ctx_leave(pushed_);                                                    \
    }                                                                        \
    if (r_ != TCU_SUCCESS) return cu_fail(err, TCC_E_INTERNAL, r_, "%s", what); \
    return 0;                                                                \
  } while (0)

int tcc_rt_cuda_malloc(int device, size_t bytes, void **dptr, tcc_error *err) {
  tcu_deviceptr p = 0;
  *dptr = NULL;
  int rc;
  {
    tcu_context ctx;
    int pushed;
    if ((rc = primary_context(device, &ctx, err))) return rc;
    tcu_result r = ctx_enter(ctx, &pushed);
    if (r == TCU_SUCCESS) {
      r = drv.cuMemAlloc_v2(&p, bytes);
      ctx_leave(pushed);
    }
    if (r != TCU_SUCCESS) return cu_fail(err, TCC_E_RESOURCE_EXHAUSTED, r, "cuMemAlloc(%zu bytes)", bytes);
  }
  *dptr = (void *)(uintptr_t)p;
  return 0;
}

int tcc_rt_cuda_free(int device, void *dptr, tcc_error *err) {
  if (!dptr) return 0;
  IN_PRIMARY(device, err, "cuMemFree", drv.cuMemFree_v2((tcu_deviceptr)(uintptr_t)dptr));
}

int tcc_rt_cuda_memcpy_htod(int device, void *dst, const void *src, size_t bytes, tcc_error *err) {
  IN_PRIMARY(device, err, "cuMemcpyHtoD", drv.cuMemcpyHtoD_v2((tcu_deviceptr)(uintptr_t)dst, src, bytes));
}

int tcc_rt_cuda_memcpy_dtoh(int device, void *dst, const void *src, size_t bytes, tcc_error *err) {
  IN_PRIMARY(device, err, "cuMemcpyDtoH", drv.cuMemcpyDtoH_v2(dst, (tcu_deviceptr)(uintptr_t)src, bytes));
}

int tcc_rt_cuda_memcpy_dtod(int device, void *dst, const void *src, size_t bytes, tcc_error *err) {
  IN_PRIMARY(device, err, "cuMemcpyDtoD",
             drv.cuMemcpyDtoD_v2((tcu_deviceptr)(uintptr_t)dst, (tcu_deviceptr)(uintptr_t)src, bytes));
}

int tcc_rt_cuda_stream_create(int device, void **stream, tcc_error *err) {
  *stream = NULL;
  IN_PRIMARY(device, err, "cuStreamCreate", drv.cuStreamCreate((tcu_stream *)stream, TCU_STREAM_NON_BLOCKING));
}

int tcc_rt_cuda_stream_destroy(int device, void *stream, tcc_error *err) {
  if (!stream) return 0;
  IN_PRIMARY(device, err, "cuStreamDestroy", drv.cuStreamDestroy_v2(stream));
}

int tcc_rt_cuda_synchronize(int device, void *stream, tcc_error *err) {
  IN_PRIMARY(device, err, stream ? "cuStreamSynchronize" : "cuCtxSynchronize",
             stream ? drv.cuStreamSynchronize(stream) : drv.cuCtxSynchronize());
}

/* ------------------------------------------------------------------ events */

/* FAILED_PRECONDITION unless the driver has every event call. */
static int events_present(tcc_error *err) {
  int rc = tcc_rt_cuda_available(err);
  if (rc) return rc;
  if (!drv.cuEventCreate || !drv.cuEventRecord || !drv.cuEventSynchronize || !drv.cuEventDestroy_v2 ||
      (!drv.cuEventElapsedTime && !drv.cuEventElapsedTime_v2))
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "the CUDA driver has no event calls (cuEvent*)");
  return 0;
}

int tcc_rt_cuda_event_create(int device, void **event, tcc_error *err) {
  *event = NULL;
  int rc = events_present(err);
  if (rc) return rc;
  IN_PRIMARY(device, err, "cuEventCreate", drv.cuEventCreate((tcu_event *)event, 0));
}

int tcc_rt_cuda_event_record(int device, void *event, void *stream, tcc_error *err) {
  int rc = events_present(err);
  if (rc) return rc;
  IN_PRIMARY(device, err, "cuEventRecord", drv.cuEventRecord(event, stream));
}

int tcc_rt_cuda_event_elapsed_ms(int device, void *start, void *end, float *ms, tcc_error *err) {
  *ms = 0;
  int rc = events_present(err);
  if (rc) return rc;
  tcu_context ctx;
  int pushed;
  if ((rc = primary_context(device, &ctx, err))) return rc;
  tcu_result r = ctx_enter(ctx, &pushed);
  const char *what = "cuEventSynchronize";
  if (r == TCU_SUCCESS) {
    r = drv.cuEventSynchronize(end);   /* a kernel's failure shows here */
    if (r == TCU_SUCCESS) {
      what = "cuEventElapsedTime";
      r = drv.cuEventElapsedTime_v2 ? drv.cuEventElapsedTime_v2(ms, start, end)
                                    : drv.cuEventElapsedTime(ms, start, end);
    }
    ctx_leave(pushed);
  }
  return r == TCU_SUCCESS ? 0 : cu_fail(err, TCC_E_INTERNAL, r, "%s", what);
}

int tcc_rt_cuda_event_destroy(int device, void *event, tcc_error *err) {
  if (!event) return 0;
  int rc = events_present(err);
  if (rc) return rc;
  IN_PRIMARY(device, err, "cuEventDestroy", drv.cuEventDestroy_v2(event));
}
