/*
 * toolchain.c — who builds kernels, for the key: the C compiler's
 * identity (`cc --version`, run through common/tcc_spawn.c's tcc_run_tool,
 * plus the codegen version, the fusion switch and the convolution road)
 * and NVRTC's, for CUDA targets.
 */
#include "loop.h"
#include "tcc_nvrtc.h"
#include "tcc_config.h"

#ifdef TCC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl_version.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tcc_toolchain_identity(const char *cc, char *out, size_t cap, tcc_error *err) {
  if (!cc || !cc[0]) cc = TCC_CC_DEFAULT;
  if (cap) out[0] = '\0';
  const char *argv[] = {cc, "--version", NULL};
  char *text = NULL;
  int rc = tcc_run_tool(argv, 30000, &text, err);
  if (rc) {
    free(text);
    return rc;
  }
  const char *line = text ? text : "";
  size_t n = strcspn(line, "\r\n");
  while (n && (line[n - 1] == ' ' || line[n - 1] == '\t')) n--;
  if (n == 0) {
    free(text);
    return tcc_error_set(err, TCC_E_INTERNAL, "'%s --version' printed nothing", cc);
  }
  /* TCC_NO_FUSION (fuse.c) changes the code generated: it is part of the
   * identity, so such kernels never share cache entries with fused ones. */
  const char *nf = getenv("TCC_NO_FUSION");
  int no_fusion = nf && nf[0] && strcmp(nf, "0") != 0;
  /* and TCC_NO_SHARED_BODIES (cpu/emit.c): every kernel's body its own */
  const char *ns = getenv("TCC_NO_SHARED_BODIES");
  int no_shared = ns && ns[0] && strcmp(ns, "0") != 0;
  /* so is the convolution road (conv.c): oneDNN's version, or none */
  char conv[32] = "";
#ifdef TCC_HAVE_ONEDNN
  if (tcc_onednn_enabled())
    snprintf(conv, sizeof conv, " onednn/%d.%d", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
#endif
  int w = snprintf(out, cap, "tccd-codegen/%d%s%s%s cc=%.*s", TCC_CODEGEN_VERSION,
                   no_fusion ? " no-fusion" : "", no_shared ? " no-shared-bodies" : "", conv, (int)n, line);
  free(text);
  if (w < 0 || (size_t)w >= cap)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "identity buffer too small (%zu bytes, need %d)", cap, w + 1);
  return 0;
}

int tcc_toolchain_cuda_identity(char *out, size_t cap, tcc_error *err) {
  int rc = tcc_nvrtc_identity(out, cap, err);
  if (rc || tcc_cudnn_enabled()) return rc;
  /* the convolution road (conv.c): cuDNN steps unless turned off */
  size_t n = strlen(out);
  if (n + sizeof " no-cudnn" > cap)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "identity buffer too small (%zu bytes)", cap);
  memcpy(out + n, " no-cudnn", sizeof " no-cudnn");
  return 0;
}
