/* cuda.c — NVRTC and cuobjdump for the CUDA tests (see tcctest.h). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tcc_nvrtc.h"
#include "tcctest.h"

void tt_need_nvrtc(void) {
  tcc_error err = {0};
  if (tcc_nvrtc_available(&err)) tt_skip("%s", err.msg); /* "NVRTC not available: why" */
}

const char *tt_cuobjdump(void) {
  const char *exe = getenv("TCC_CUOBJDUMP");
  return exe && *exe && access(exe, X_OK) == 0 ? exe : NULL;
}

char *tt_cuobjdump_run(const char *flag, const char *file) {
  const char *exe = tt_cuobjdump();
  ck_assert_msg(exe != NULL, "no cuobjdump (TCC_CUOBJDUMP)");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s '%s' 2>&1", exe, flag, file);
  int status;
  char *out = tt_popen(cmd, &status);
  ck_assert_msg(out != NULL, "cannot run %s", cmd);
  ck_assert_msg(status == 0, "%s failed (%d): %s", cmd, status, out);
  return out;
}
