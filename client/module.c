/*
 * module.c — loading and running what tccd returns (CPU: a shared object).
 *
 * tcc_module_load checks, in this order, before any byte of the artifact
 * is mapped as code:
 *   1. SHA-256(data) == the digest the caller names   (DATA_LOSS)
 *   2. manifest.abi_version == 1, or 2 (dynamic shapes: CPU only, its
 *      symbolic layouts well-formed; see the end of this file)
 *                                                       (FAILED_PRECONDITION)
 *   3. it is a CPU artifact: an ELF that is not a cubin (UNIMPLEMENTED /
 *      FAILED_PRECONDITION)
 * then copies the bytes into a memfd, seals it (no shrink, grow or write:
 * nothing can change the code after the check), dlopens
 * "/proc/self/fd/N" with RTLD_NOW | RTLD_LOCAL and resolves the manifest's
 * entry symbol (NOT_FOUND when absent). No file is ever written.
 *
 * The memfd stays open while the module is loaded. glibc recognises an
 * already loaded object by its path name, and "/proc/self/fd/N" names a
 * different file once N is reused; holding N open keeps the name unique,
 * and before each dlopen the path is probed with RTLD_NOLOAD (an object
 * that was never unloaded, e.g. one marked NODELETE, still owns its old
 * name): a taken name moves the memfd to another descriptor number.
 *
 * CUDA artifacts (manifest target "cuda:ARCH" and a cubin: ELF machine
 * 190) go to the runtime's Driver API loader (runtime/tcc_runtime.h)
 * after checks 1-2: loaded into the calling thread's current context,
 * else device 0's primary context; tcc_module_run launches the plan on
 * the legacy default stream, and
 * tcc_module_cuda() hands out the CUDA kernel for streams and graphs. A
 * cubin whose manifest does not say cuda (or the reverse) is refused.
 *
 * Entry ABI (tcc.proto, Manifest):
 *   int entry(const void *const *inputs, void *const *outputs, void *workspace)
 * returning 0 on success. A tcc_module is immutable once loaded, so it can
 * be run from several threads at once (the generated code is reentrant).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_internal.h"
#include "tcc_runtime.h"
#include "tccclient.h"

#define TCC_KERNEL_ABI_VERSION 1
#define DEFAULT_ENTRY "tcc_entry"
#define EM_CUDA_MACHINE 190 /* ELF e_machine of a cubin */

typedef int (*tcc_entry_fn)(const void *const *inputs, void *const *outputs, void *workspace);
/* ABI 2 (dynamic shapes): the symbols' values come with the call. */
typedef int (*tcc_entry2_fn)(const void *const *inputs, void *const *outputs, void *workspace,
                             const int64_t *syms);
#define TCC_KERNEL_ABI_DYNAMIC 2

struct tcc_module {
  void *handle;                  /* dlopen handle */
  tcc_entry_fn entry;
  tcc_entry2_fn entry2;          /* ABI 2 instead of entry */
  int fd;                        /* the sealed memfd, open while loaded */
  Tcc__V1__Manifest *manifest;   /* our own copy */
  char sha256[TCC_SHA256_HEX];
  tcc_rt_cuda_kernel *cuda;      /* a CUDA artifact's loader state, else NULL */
};

/* A deep copy of a manifest (pack + unpack); NULL when out of memory. */
static Tcc__V1__Manifest *manifest_copy(const Tcc__V1__Manifest *m) {
  size_t n = tcc__v1__manifest__get_packed_size(m);
  uint8_t *buf = malloc(n + 1);
  if (!buf) return NULL;
  tcc__v1__manifest__pack(m, buf);
  Tcc__V1__Manifest *copy = tcc__v1__manifest__unpack(NULL, n, buf);
  free(buf);
  return copy;
}

/* Writes the artifact into a new sealed memfd (*fd). Returns 0 or
 * TCC_E_INTERNAL. */
static int sealed_memfd(const uint8_t *data, size_t len, const char *sha, int *fd_out, tcc_error *err) {
  char name[64];
  snprintf(name, sizeof name, "tcc-module-%.12s", sha);
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return tcc_error_set(err, TCC_E_INTERNAL, "memfd_create: %s", strerror(errno));
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      return tcc_error_set(err, TCC_E_INTERNAL, "writing the artifact to a memfd: %s", strerror(e));
    }
    off += (size_t)w;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(fd);
    return tcc_error_set(err, TCC_E_INTERNAL, "sealing the artifact memfd: %s", strerror(e));
  }
  *fd_out = fd;
  return 0;
}

/* dlopens the memfd under a path name no loaded object owns (*handle).
 * May move *fd to another descriptor number. Returns 0,
 * FAILED_PRECONDITION (dlopen refused it) or INTERNAL. */
static int dlopen_memfd(int *fd, void **handle, tcc_error *err) {
  int stale[8];
  int n_stale = 0;
  int rc = 0;
  char path[64];
  for (;;) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", *fd);
    void *old = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (!old) break;
    dlclose(old);
    if (n_stale == (int)(sizeof stale / sizeof stale[0])) {
      rc = tcc_error_set(err, TCC_E_INTERNAL, "no free descriptor name to dlopen the artifact under");
      goto out;
    }
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, *fd + 1);
    if (moved < 0) {
      rc = tcc_error_set(err, TCC_E_INTERNAL, "dup: %s", strerror(errno));
      goto out;
    }
    stale[n_stale++] = *fd; /* keep it open until the new name is taken */
    *fd = moved;
  }
  *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!*handle) {
    const char *e = dlerror();
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "dlopen of the artifact failed: %s", e ? e : "?");
  } else {
    /* A kernel with parallel loops (OpenMP), GEMMs (OpenBLAS) or
     * convolutions (oneDNN: JIT code, its primitive cache) leaves worker
     * threads parked inside those libraries; unloading the kernel
     * would unmap them under the threads (a crash at exit, ~1 run in 4).
     * Pin whichever of them the kernel pulled in (NOLOAD: nothing new is
     * loaded) for the life of the process. */
    static const char *const pinned[] = {"libgomp.so.1", "libopenblas.so.0", "libdnnl.so.2"};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
      void *lib = dlopen(pinned[i], RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
      if (lib) dlclose(lib); /* drops our reference; NODELETE stays */
    }
  }
out:
  for (int i = 0; i < n_stale; i++) close(stale[i]);
  return rc;
}

/* A module holding its digest and a copy of manifest, nothing loaded
 * yet (*out); tcc_module_unload frees it. */
static int module_new(const char *sha256_hex, const Tcc__V1__Manifest *manifest, tcc_module **out, tcc_error *err) {
  tcc_module *k = calloc(1, sizeof *k);
  if (!k) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  k->fd = -1;
  tcc_hex_lower_copy(sha256_hex, k->sha256);
  k->manifest = manifest_copy(manifest);
  if (!k->manifest) {
    tcc_module_unload(k);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  *out = k;
  return 0;
}

/* A CUDA artifact: the Driver API loader (cuda.c) does the rest. */
static int load_cuda(const uint8_t *data, size_t len, const char *sha256_hex, const Tcc__V1__Manifest *manifest,
                     tcc_module **out, tcc_error *err) {
  tcc_module *k;
  int rc = module_new(sha256_hex, manifest, &k, err);
  if (rc) return rc;
  tcc_rt_cuda_options opts = {.context = TCC_RT_CUDA_CURRENT_OR_PRIMARY};
  rc = tcc_rt_cuda_kernel_load_manifest(data, len, k->sha256, manifest, &opts, &k->cuda, err);
  if (rc) {
    tcc_error_prefix(err, "CUDA artifact %.12s (%.64s)", k->sha256, manifest->target);
    tcc_module_unload(k);
    return rc;
  }
  *out = k;
  return 0;
}

int tcc_module_load(const uint8_t *data, size_t len, const char *sha256_hex, const Tcc__V1__Manifest *manifest,
                    tcc_module **out, tcc_error *err) {
  *out = NULL;
  if (!data && len) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no artifact data");
  if (!manifest) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no manifest");
  int rc = tcc_digest_check(data, len, sha256_hex, err);
  if (rc) return rc;
  int dynamic = manifest->abi_version == TCC_KERNEL_ABI_DYNAMIC;
  if (manifest->abi_version != TCC_KERNEL_ABI_VERSION && !dynamic)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "kernel ABI version %u is not supported (this client runs version %d)",
                         manifest->abi_version, TCC_KERNEL_ABI_VERSION);
  if (len < 20 || memcmp(data, "\x7f" "ELF", 4) != 0)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "artifact is not an ELF shared object");
  int machine = data[18] | data[19] << 8; /* e_machine, little-endian */
  int cuda_target = manifest->target && !strncmp(manifest->target, "cuda:", 5);
  if (dynamic && (machine == EM_CUDA_MACHINE || cuda_target))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "dynamic shapes (ABI 2) on CUDA are not supported");
  if (dynamic && (rc = tcc_module_check_sym_manifest(manifest, err))) return rc;
  if (machine == EM_CUDA_MACHINE && cuda_target) return load_cuda(data, len, sha256_hex, manifest, out, err);
  if (machine == EM_CUDA_MACHINE || cuda_target)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                         machine == EM_CUDA_MACHINE
                             ? "artifact is a CUDA cubin but the manifest's target '%.64s' is not cuda:ARCH"
                             : "the manifest's target is %.64s but the artifact is not a cubin",
                         manifest->target ? manifest->target : "");

  tcc_module *k;
  if ((rc = module_new(sha256_hex, manifest, &k, err))) return rc;
  if ((rc = sealed_memfd(data, len, k->sha256, &k->fd, err))) goto fail;
  if ((rc = dlopen_memfd(&k->fd, &k->handle, err))) goto fail;
  const char *entry = manifest->entry && *manifest->entry ? manifest->entry : DEFAULT_ENTRY;
  dlerror();
  void *sym = dlsym(k->handle, entry);
  if (!sym) {
    rc = tcc_error_set(err, TCC_E_NOT_FOUND, "the artifact has no entry symbol '%.200s'", entry);
    goto fail;
  }
  /* POSIX guarantees a data pointer from dlsym converts to a function. */
  if (dynamic) memcpy(&k->entry2, &sym, sizeof sym);
  else memcpy(&k->entry, &sym, sizeof sym);
  *out = k;
  return 0;
fail:
  tcc_module_unload(k);
  return rc;
}

/* The error for an entry point's nonzero return: 1 means the inputs made
 * an index read from a tensor go out of range, or an integer division by
 * zero (PyTorch raises there too); anything else is the kernel's fault. */
static int entry_failed(const tcc_module *k, int rc, tcc_error *err) {
  if (rc == 1)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "kernel %.12s: index out of range (an index read from a tensor: gather, "
                         "index, index_select, embedding), or an integer division by zero",
                         k->sha256);
  return tcc_error_set(err, TCC_E_INTERNAL, "kernel %.12s: entry returned %d", k->sha256, rc);
}

int tcc_module_run(tcc_module *k, const void *const *inputs, void *const *outputs, void *workspace,
                   tcc_error *err) {
  if (k && k->cuda) return tcc_rt_cuda_kernel_launch(k->cuda, NULL, inputs, outputs, workspace, err);
  if (k && k->entry2)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "kernel %.12s has dynamic shapes (ABI 2): bind its symbols with "
                         "tcc_module_bind and call tcc_module_run_sym", k->sha256);
  if (!k || !k->entry) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no kernel loaded");
  if (k->manifest->workspace_bytes > 0 && !workspace)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel needs a workspace of %lld bytes",
                         (long long)k->manifest->workspace_bytes);
  if ((k->manifest->n_inputs && !inputs) || (k->manifest->n_outputs && !outputs))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel takes %zu inputs and %zu outputs",
                         k->manifest->n_inputs, k->manifest->n_outputs);
  int rc = k->entry(inputs, outputs, workspace);
  return rc ? entry_failed(k, rc, err) : 0;
}

const Tcc__V1__Manifest *tcc_module_manifest(const tcc_module *k) { return k ? k->manifest : NULL; }

tcc_rt_cuda_kernel *tcc_module_cuda(tcc_module *k) { return k ? k->cuda : NULL; }

void tcc_module_unload(tcc_module *k) {
  if (!k) return;
  tcc_rt_cuda_kernel_unload(k->cuda);
  if (k->handle) dlclose(k->handle);
  if (k->fd >= 0) close(k->fd); /* after dlclose: the name stays ours while loaded */
  if (k->manifest) tcc__v1__manifest__free_unpacked(k->manifest, NULL);
  free(k);
}

/* ------------------------------------------------------------------
 * Dynamic shapes (ABI 2; tcc.proto Manifest fields 30-33).
 *
 * A SymExpr is a polynomial over the symbols: sum of coef x product of
 * syms[i]. tcc_module_bind reads each symbol from the first input dim
 * whose size expression is exactly that symbol, then checks the guards:
 * every symbol >= 2, every input's sizes, strides and storage offset
 * equal to its SymLayout at those values. Output layouts and the
 * workspace size are their expressions at the bound values.
 * ------------------------------------------------------------------ */

/* Is e exactly symbol s (one term, coefficient 1, that symbol alone)? */
static int expr_is_symbol(const Tcc__V1__SymExpr *e, int *s) {
  if (!e || e->n_terms != 1 || e->terms[0]->coef != 1 || e->terms[0]->n_syms != 1) return 0;
  *s = e->terms[0]->syms[0];
  return 1;
}

/* The value of e at syms; 0 for a missing expression. Sets *overflow
 * when int64 overflows. */
static int64_t expr_eval(const Tcc__V1__SymExpr *e, const int64_t *syms, int *overflow) {
  int64_t sum = 0;
  for (size_t t = 0; e && t < e->n_terms; t++) {
    int64_t v = e->terms[t]->coef;
    for (size_t j = 0; j < e->terms[t]->n_syms; j++)
      if (__builtin_mul_overflow(v, syms[e->terms[t]->syms[j]], &v)) *overflow = 1;
    if (__builtin_add_overflow(sum, v, &sum)) *overflow = 1;
  }
  return sum;
}

static int expr_check(const Tcc__V1__SymExpr *e, size_t nsyms) {
  for (size_t t = 0; e && t < e->n_terms; t++)
    for (size_t j = 0; j < e->terms[t]->n_syms; j++)
      if (e->terms[t]->syms[j] < 0 || (size_t)e->terms[t]->syms[j] >= nsyms) return -1;
  return 0;
}

static int layout_check(const Tcc__V1__SymLayout *L, const Tcc__V1__TensorMeta *m, size_t nsyms) {
  if (!L || !m || L->n_sizes != m->n_sizes || L->n_strides != m->n_sizes) return -1;
  for (size_t d = 0; d < L->n_sizes; d++)
    if (expr_check(L->sizes[d], nsyms) || expr_check(L->strides[d], nsyms)) return -1;
  return expr_check(L->storage_offset, nsyms);
}

int tcc_module_check_sym_manifest(const Tcc__V1__Manifest *m, tcc_error *err) {
  int ok = m->n_symbols > 0 && m->n_symbols <= TCC_MODULE_MAX_SYMS &&
           m->n_sym_inputs == m->n_inputs && m->n_sym_outputs == m->n_outputs &&
           !expr_check(m->sym_workspace_bytes, m->n_symbols);
  for (size_t i = 0; ok && i < m->n_inputs; i++)
    ok = !layout_check(m->sym_inputs[i], m->inputs[i], m->n_symbols);
  for (size_t i = 0; ok && i < m->n_outputs; i++)
    ok = !layout_check(m->sym_outputs[i], m->outputs[i], m->n_symbols);
  /* every symbol must be bindable from some input dim */
  for (size_t s = 0; ok && s < m->n_symbols; s++) {
    int found = 0;
    for (size_t i = 0; !found && i < m->n_inputs; i++)
      for (size_t d = 0; !found && d < m->sym_inputs[i]->n_sizes; d++) {
        int sym;
        found = expr_is_symbol(m->sym_inputs[i]->sizes[d], &sym) && (size_t)sym == s;
      }
    ok = found;
  }
  if (!ok)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "kernel ABI version 2 (dynamic shapes): malformed manifest "
                         "(symbols, symbolic layouts)");
  return 0;
}

int tcc_module_symbols(const tcc_module *k) {
  return k && k->entry2 ? (int)k->manifest->n_symbols : 0;
}

int tcc_module_bind(const tcc_module *k, const int64_t *sizes, const int64_t *strides,
                    const int64_t *offsets, int64_t *syms, tcc_error *err) {
  if (!k || !k->entry2)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "not a kernel with dynamic shapes");
  const Tcc__V1__Manifest *m = k->manifest;
  int bound[TCC_MODULE_MAX_SYMS] = {0};
  size_t at = 0;
  for (size_t i = 0; i < m->n_inputs; i++)
    for (size_t d = 0; d < m->sym_inputs[i]->n_sizes; d++, at++) {
      int s;
      if (expr_is_symbol(m->sym_inputs[i]->sizes[d], &s) && !bound[s]) {
        syms[s] = sizes[at];
        bound[s] = 1;
      }
    }
  for (size_t s = 0; s < m->n_symbols; s++)
    if (syms[s] < 2)
      return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                           "guard failed: symbol %.32s is %lld, the kernel needs >= 2 "
                           "(sizes 0 and 1 are specialised: compile for them)",
                           m->symbols[s], (long long)syms[s]);
  at = 0;
  for (size_t i = 0; i < m->n_inputs; i++) {
    const Tcc__V1__SymLayout *L = m->sym_inputs[i];
    int ovf = 0;
    for (size_t d = 0; d < L->n_sizes; d++, at++) {
      int64_t want = expr_eval(L->sizes[d], syms, &ovf);
      int64_t want_st = expr_eval(L->strides[d], syms, &ovf);
      if (ovf)
        return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "guard failed: input %zu's layout "
                             "overflows int64", i);
      if (sizes[at] != want)
        return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                             "guard failed: input %zu dim %zu is %lld, the kernel needs %lld", i,
                             d, (long long)sizes[at], (long long)want);
      if (strides && strides[at] != want_st && want > 1)
        return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                             "guard failed: input %zu dim %zu has stride %lld, the kernel needs "
                             "%lld", i, d, (long long)strides[at], (long long)want_st);
    }
    int64_t off = expr_eval(L->storage_offset, syms, &ovf);
    if (offsets && offsets[i] != off)
      return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                           "guard failed: input %zu has storage offset %lld, the kernel needs "
                           "%lld", i, (long long)offsets[i], (long long)off);
  }
  return 0;
}

int tcc_module_output_layout(const tcc_module *k, const int64_t *syms, int output,
                             int64_t *sizes, int64_t *strides, tcc_error *err) {
  if (!k || !k->manifest || output < 0 || (size_t)output >= k->manifest->n_outputs)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no output %d", output);
  const Tcc__V1__Manifest *m = k->manifest;
  if (!k->entry2) {
    const Tcc__V1__TensorMeta *t = m->outputs[output];
    for (size_t d = 0; d < t->n_sizes; d++) {
      sizes[d] = t->sizes[d];
      strides[d] = t->strides[d];
    }
    return 0;
  }
  const Tcc__V1__SymLayout *L = m->sym_outputs[output];
  int ovf = 0;
  for (size_t d = 0; d < L->n_sizes; d++) {
    sizes[d] = expr_eval(L->sizes[d], syms, &ovf);
    strides[d] = expr_eval(L->strides[d], syms, &ovf);
  }
  if (ovf) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "output %d's layout overflows int64", output);
  return 0;
}

int64_t tcc_module_workspace_bytes(const tcc_module *k, const int64_t *syms) {
  if (!k || !k->manifest) return -1;
  if (k->cuda) return (int64_t)tcc_rt_cuda_kernel_workspace_bytes(k->cuda);   /* + cuDNN's */
  if (!k->entry2) return k->manifest->workspace_bytes;
  int ovf = 0;
  int64_t n = expr_eval(k->manifest->sym_workspace_bytes, syms, &ovf);
  return ovf ? -1 : n;
}

int tcc_module_run_sym(tcc_module *k, const void *const *inputs, void *const *outputs,
                       void *workspace, const int64_t *syms, tcc_error *err) {
  if (!k || !k->entry2) return tcc_module_run(k, inputs, outputs, workspace, err);
  if (!syms) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no symbol values");
  int64_t ws = tcc_module_workspace_bytes(k, syms);
  if (ws < 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "workspace size overflows int64");
  if (ws > 0 && !workspace)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel needs a workspace of %lld bytes",
                         (long long)ws);
  if ((k->manifest->n_inputs && !inputs) || (k->manifest->n_outputs && !outputs))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the kernel takes %zu inputs and %zu outputs",
                         k->manifest->n_inputs, k->manifest->n_outputs);
  int rc = k->entry2(inputs, outputs, workspace, syms);
  return rc ? entry_failed(k, rc, err) : 0;
}
