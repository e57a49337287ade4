/*
 * tcc-gen-sources — the generated sources of a set of requests, for
 * checking that a refactoring of the compiler changes no byte of what it
 * emits (issue 20's check: diff two runs' output directories).
 *
 *   tcc-gen-sources [--cuda ARCH] OUT_DIR REQUEST.pb...
 *
 * For each request writes OUT_DIR/<request file name>.<cpu|ARCH>.txt: the
 * default source, then the source with each tuning candidate
 * (tcc_tune_candidates) applied to every kernel, each section headed by
 * its config; a request the compiler refuses gets its error code and
 * message instead (they must match too). --cuda retargets every request
 * to that CUDA arch first. Exits 0 unless a file cannot be written.
 */
#include "loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KERNEL_CONFIGS 1024

static uint8_t *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      uint8_t *nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  *len = n;
  return buf;
}

static void put_section(FILE *out, const char *head, int rc, const char *src, size_t len,
                        const tcc_error *err) {
  fprintf(out, "==== %s\n", head);
  if (rc) fprintf(out, "error %d: %s\n", rc, err->msg);
  else if (src) fwrite(src, 1, len, out);
}

static int one_request(const char *path, const char *arch, const char *outdir) {
  size_t len = 0;
  uint8_t *bytes = read_all(path, &len);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  char outpath[4096];
  snprintf(outpath, sizeof outpath, "%s/%s.%s.txt", outdir, base, arch ? arch : "cpu");
  FILE *out = fopen(outpath, "w");
  if (!out) {
    free(bytes);
    return 1;
  }
  tcc_error err = {0};
  Tcc__V1__CompileRequest *req = NULL;
  tcc_prepared *p = NULL;
  int rc = bytes ? tcc_decode_request(bytes, len, &req, &err) : tcc_error_set(&err, TCC_E_NOT_FOUND, "unreadable");
  /* --cuda: the target and every value's device (a borrowed Device
   * where a value has none, taken back before the request is freed) */
  static Tcc__V1__Device cuda_device;
  tcc__v1__device__init(&cuda_device);
  cuda_device.type = TCC__V1__DEVICE_TYPE__CUDA;
  if (!rc && arch && req->target && req->graph) {
    req->target->device = TCC__V1__DEVICE_TYPE__CUDA;
    req->target->cuda_arch = (char *)arch;  /* not freed: reset below */
    for (size_t i = 0; i < req->graph->n_values; i++) {
      Tcc__V1__TensorMeta *m = req->graph->values[i]->meta;
      if (m && m->device) m->device->type = TCC__V1__DEVICE_TYPE__CUDA;
      else if (m) m->device = &cuda_device;
    }
  }
  if (!rc) rc = tcc_prepare(req, "tcc-gen-sources", &p, &err);
  if (req && arch && req->target && req->graph) {
    req->target->cuda_arch = NULL;
    for (size_t i = 0; i < req->graph->n_values; i++) {
      Tcc__V1__TensorMeta *m = req->graph->values[i]->meta;
      if (m && m->device == &cuda_device) m->device = NULL;
    }
  }
  if (rc) {
    put_section(out, "prepare", rc, NULL, 0, &err);
  } else {
    char *src = NULL;
    size_t sl = 0;
    rc = tcc_generate_source(p, &src, &sl, NULL, &err);
    put_section(out, "default", rc, src, sl, &err);
    free(src);
    tcc_kernel_config cand[64];
    int nc = tcc_tune_candidates(p->device, cand);
    static tcc_kernel_config all[MAX_KERNEL_CONFIGS];
    for (int c = 0; c < nc && !p->dynamic; c++) {
      for (int k = 0; k < MAX_KERNEL_CONFIGS; k++) all[k] = cand[c];
      char head[256];
      tcc_kernel_config_format(&cand[c], head, sizeof head);
      src = NULL;
      tcc_error_clear(&err);
      rc = tcc_generate_source_tuned(p, all, MAX_KERNEL_CONFIGS, &src, &sl, &err);
      put_section(out, head, rc, src, sl, &err);
      free(src);
    }
  }
  tcc_prepared_free(p);
  if (req) tcc__v1__compile_request__free_unpacked(req, NULL);
  free(bytes);
  return fclose(out) != 0;
}

int main(int argc, char **argv) {
  const char *arch = NULL;
  int i = 1;
  if (i + 1 < argc && !strcmp(argv[i], "--cuda")) {
    arch = argv[i + 1];
    i += 2;
  }
  if (i >= argc) {
    fprintf(stderr, "usage: tcc-gen-sources [--cuda ARCH] OUT_DIR REQUEST.pb...\n");
    return 2;
  }
  const char *outdir = argv[i++];
  int bad = 0;
  for (; i < argc; i++) bad |= one_request(argv[i], arch, outdir);
  return bad;
}
