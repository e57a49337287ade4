/* fake_cuda.c — the recording fake libcuda, tests/cuda/fake_libcuda.c,
 * and cubins for it (see tcctest.h). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "tcctest.h"

void *tt_fake_cuda_open(void) {
  const char *path = getenv("TCC_CUDA_LIBRARY");
  if (!path || !strstr(path, "fake")) tt_skip("TCC_CUDA_LIBRARY must name fake_libcuda.so");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) tt_skip("cannot load %s: %s", path, dlerror());
  return h;
}

/* The line after line (its end when it is the last). */
static const char *next_line(const char *line) {
  const char *nl = strchr(line, '\n');
  return nl ? nl + 1 : line + strlen(line);
}

static int starts(const char *line, const char *prefix) { return !strncmp(line, prefix, strlen(prefix)); }

int tt_fake_event_at(const char *log, const char *prefix) {
  int i = 0;
  for (const char *line = log; *line; line = next_line(line), i++)
    if (starts(line, prefix)) return i;
  return -1;
}

int tt_fake_event_count(const char *log, const char *prefix) {
  int n = 0;
  for (const char *line = log; *line; line = next_line(line)) n += starts(line, prefix);
  return n;
}

int tt_fake_events_in_order(const char *log, const char *const *want, size_t n) {
  const char *line = log;
  for (size_t i = 0; i < n; i++) {
    while (*line && !starts(line, want[i])) line = next_line(line);
    if (!*line) return 0;
    line = next_line(line);
  }
  return 1;
}

void tt_fake_cubin(uint8_t b[256], int sm) {
  tt_rand_bytes(b, 256);
  memcpy(b, "\x7f" "ELF\x02\x01\x01\x41\x08", 9);
  b[18] = 190, b[19] = 0;                                             /* EM_CUDA */
  b[0x30] = 0x04, b[0x31] = (uint8_t)sm, b[0x32] = 0x00, b[0x33] = 0x06; /* e_flags 0x0600NN04: sm_NN */
}

void tt_fake_cuda_sym(void *h, const char *name, void *fn) {
  void *sym = dlsym(h, name);
  if (!sym) tt_skip("fake driver lacks %s", name);
  memcpy(fn, &sym, sizeof sym);
}
