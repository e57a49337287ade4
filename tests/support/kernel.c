/* kernel.c — artifacts the tests load themselves (see tcctest.h): digests,
 * and CPU kernel .so files they dlopen. Like libtccclient (client/module.c), they pin the runtimes
 * a kernel pulls in (libgomp for parallel loops, OpenBLAS for GEMMs,
 * oneDNN for convolutions) for the life of the process, so a dlclose
 * never unmaps them under their parked worker threads (a crash in libgomp
 * seen on a 16-core GPU machine). */
#include <dlfcn.h>
#include <stdio.h>

#include "tcc_digest.h"
#include "tcctest.h"

void tt_sha256_hex(const void *data, size_t len, char hex[65]) {
  uint8_t d[TCC_SHA256_BYTES];
  tcc_sha256(data, len, d);
  tcc_hex_encode(d, sizeof d, hex);
}

void *tt_dlopen_kernel(const char *so) {
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return NULL;
  static const char *const pinned[] = {"libgomp.so.1", "libopenblas.so.0", "libdnnl.so.2"};
  for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
    void *rt = dlopen(pinned[i], RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    if (rt) dlclose(rt); /* NODELETE stays */
  }
  return lib;
}

void *tt_load_kernel(const char *dir, const char *name, const void *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return tt_write_file(path, data, len) ? NULL : tt_dlopen_kernel(path);
}
