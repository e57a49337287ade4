/*
 * dlkernel.h — how the tests dlopen a CPU kernel .so themselves: like
 * libtccclient (client/kernel.c), they pin the runtimes a kernel pulls in
 * (libgomp for parallel loops, OpenBLAS for GEMMs) for the life of the
 * process, so a dlclose never unmaps them under their parked worker
 * threads (a crash in libgomp seen on a 16-core GPU machine).
 */
#ifndef TCC_TESTS_DLKERNEL_H
#define TCC_TESTS_DLKERNEL_H

#include <dlfcn.h>
#include <stddef.h>

static inline void *dlopen_kernel(const char *so) {
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return NULL;
  static const char *const pinned[] = {"libgomp.so.1", "libopenblas.so.0", "libdnnl.so.2"};
  for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
    void *rt = dlopen(pinned[i], RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    if (rt) dlclose(rt); /* NODELETE stays */
  }
  return lib;
}

#endif
