/*
 * tcc-compile-file — compiles one encoded tcc.v1.CompileRequest with the
 * compiler library, no daemon: the driver the Python op tests and
 * scripts/bench-kernels use.
 *
 *   tcc-compile-file REQUEST.pb OUT.so [SOURCE.c]
 *
 * Prints one JSON line on stdout: {"kernels": N, "kinds": [...],
 * "workspace": BYTES, "compile_ms": MS, "hash": "...", "bodies_reused":
 * N, "groups": [...], "identity": "..."} (identity:
 * tcc_toolchain_identity's, which names the convolution road;
 * bodies_reused: kernel bodies taken from the object cache in
 * $TCC_OBJECT_DIR, when set)
 * where groups lists each kernel after fusion as [kind, [names of the
 * graph values it stores ("" for temporaries)]] (the scheduler's golden
 * tests compare it). On failure
 * prints {"error": CODE, "message": "..."} and exits 1.
 */
#include "loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static int fail(int code, const char *msg) {
  printf("{\"error\": %d, \"message\": ", code);
  json_str(msg);
  printf("}\n");
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s REQUEST.pb OUT.so [SOURCE.c]\n", argv[0]);
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  if (!f) return fail(-5, "cannot open the request");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) return fail(-5, "cannot read the request");
  fclose(f);
  char identity[512];
  tcc_error err;
  if (tcc_toolchain_identity(NULL, identity, sizeof identity, &err)) return fail(err.code, err.msg);
  tcc_prepared *p;
  if (tcc_prepare_bytes(buf, (size_t)n, identity, &p, &err)) {
    free(buf);
    return fail(err.code, err.msg);
  }
  free(buf);
  tcc_artifact art;
  /* TCC_TUNE_CONFIG="par=1 thr=0 chunk=0 unroll=4 blas=0 vec=0 order=0": every kernel
   * built with that tuning config (compiler.h, tune.c) */
  const char *tune = getenv("TCC_TUNE_CONFIG");
  tcc_kernel_config cfgs[256];
  int ncfg = 0;
  if (tune && tune[0]) {
    if (tcc_kernel_config_parse(tune, &cfgs[0]) != 0) {
      printf("{\"error\": %d, \"message\": \"bad TCC_TUNE_CONFIG\"}\n", TCC_E_INVALID_ARGUMENT);
      return 1;
    }
    for (ncfg = 1; ncfg < 256; ncfg++) cfgs[ncfg] = cfgs[0];
  }
  /* TCC_OBJECT_DIR: the object cache of kernel bodies (cpu/build.c) */
  tcc_build_options opts = {.object_dir = getenv("TCC_OBJECT_DIR"), .identity = identity};
  if (ncfg ? tcc_compile_tuned(p, &opts, cfgs, ncfg, 0, &art, &err) : tcc_compile(p, &opts, &art, &err)) {
    tcc_prepared_free(p);
    return fail(err.code, err.msg);
  }
  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(art.data, 1, art.size, o) != art.size || fclose(o)) return fail(-13, "cannot write");
  if (argc > 3) {
    FILE *s = fopen(argv[3], "w");
    if (s) {
      fputs(art.source, s);
      fclose(s);
    }
  }
  /* the kernel grouping, from the passes themselves */
  tcc_arena arena;
  tcc_arena_init(&arena);
  tcc_program prog;
  tcc_program_init(&prog, &arena, p->graph);
  int grc = tcc_lower(&prog, &err);
  if (!grc) grc = tcc_fuse(&prog, &err);
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, art.manifest_len, art.manifest);
  printf("{\"kernels\": %d, \"kinds\": [", art.kernels);
  for (size_t k = 0; m && k < m->n_kernels; k++) {
    printf("%s", k ? ", " : "");
    json_str(m->kernels[k]->kind);
  }
  printf("], \"workspace\": %lld, \"compile_ms\": %.3f, \"hash\": \"%s\", \"bodies_reused\": %d, \"groups\": [",
         m ? (long long)m->workspace_bytes : -1LL, art.compile_ms, p->hash_hex, art.bodies_reused);
  int first = 1;
  for (int k = 0; !grc && k < prog.nkernels; k++) {
    const tcc_kernel *K = &prog.kernels[k];
    if (K->dead) continue;
    int red = 0;
    for (int st = 0; st < K->nstores; st++) red |= tcc_vx_has_reduce(K->stores[st].value);
    printf("%s[\"%s\", [", first ? "" : ", ",
           K->kind == TCC_OPK_EXTERN ? "extern" : red ? "reduction" : "pointwise");
    first = 0;
    for (int st = 0; st < K->nstores; st++) {
      int v = prog.bufs[K->stores[st].buf].value;
      printf("%s", st ? ", " : "");
      json_str(v >= 0 && p->graph->values[v].name ? p->graph->values[v].name : "");
    }
    printf("]]");
  }
  printf("], \"identity\": ");
  json_str(identity);
  printf("}\n");
  tcc_program_free(&prog);
  tcc_arena_free(&arena);
  if (m) tcc__v1__manifest__free_unpacked(m, NULL);
  tcc_artifact_free(&art);
  tcc_prepared_free(p);
  return 0;
}
