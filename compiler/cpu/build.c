/*
 * build.c — the CPU target's build: C source -> shared object bytes,
 * with the system compiler.
 *
 * Requires: C source from emit.c.
 * Produces: the bytes of a .so built as
 *
 *   <cc> -std=c11 -O3 -march=<isa> [-m<feature>...] -fPIC -shared
 *        -ffp-contract=off -fno-math-errno -fno-trapping-math
 *        -o kernel.so kernel.c -lm
 *        [-fopenmp] [-pthread -ldnnl]
 *        [-L<openblas libdir> -Wl,-rpath,<libdir> -lopenblas]
 *
 * -fopenmp when the source has OpenMP pragmas (parallel loops, simd
 * reductions); oneDNN when it has convolution steps (conv.c) or float32
 * GEMM steps (emit.c's emit_dnnl_gemm); OpenBLAS when it has other GEMM
 * steps (float64, or oneDNN off).
 *
 * in a private directory made with mkdtemp under work_dir (or $TMPDIR, or
 * /tmp), removed afterwards unless keep_sources is set. -ffp-contract=off
 * keeps a*b+c two roundings, as PyTorch's scalar kernels round;
 * -fno-math-errno only drops errno writes, which nothing reads;
 * -fno-trapping-math (as PyTorch builds its own kernels) lets gcc compute
 * both sides of a select and blend them, since nothing reads the FP
 * exception flags: without it a ReLU backward's mask became a branch
 * that random signs mispredict half the time (194 -> 13 us for 32K
 * elements). Neither changes a result.
 * -march comes from the verified target (one of four ISA names) and the
 * features from a fixed list (verify.c), so no request string reaches the
 * command line unchecked.
 */
#include "cpu_schedule.h"
#include "tcc_config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A build directory that cannot be made, written or read says nothing
 * about the graph: a full disk (or quota) is RESOURCE_EXHAUSTED, anything
 * else UNAVAILABLE; both are transient, never cached. */
static int io_failure_class(int e) {
  return e == ENOSPC || e == EDQUOT || e == ENOMEM || e == EFBIG ? TCC_E_RESOURCE_EXHAUSTED : TCC_E_UNAVAILABLE;
}

static int write_file(const char *path, const char *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  while (len) {
    ssize_t w = write(fd, data, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      return -1;
    }
    data += w;
    len -= (size_t)w;
  }
  return close(fd);
}

/* Reads a whole file into *out (malloc'ed). Returns 0 or -1 (errno). */
static int read_file(const char *path, uint8_t **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) || st.st_size < 0) {
    close(fd);
    return -1;
  }
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) {
    free(buf);
    errno = EIO;
    return -1;
  }
  *out = buf;
  *len = n;
  return 0;
}

int tcc_cpu_build(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
                  tcc_built *out, tcc_error *err) {
  const tcc_graph *g = p->graph;
  memset(out, 0, sizeof *out);
  const char *cc = opts && opts->cc && opts->cc[0] ? opts->cc : TCC_CC_DEFAULT;
  const char *base = opts && opts->work_dir && opts->work_dir[0] ? opts->work_dir : getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  int timeout = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 120000;
  int keep = opts && opts->keep_sources;

  char dir[4096], cfile[4200], sofile[4200], march[64];
  if ((size_t)snprintf(dir, sizeof dir, "%s/tccd-build-XXXXXX", base) >= sizeof dir)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "work_dir path too long");
  if (!mkdtemp(dir))
    return tcc_error_set(err, io_failure_class(errno), "cannot create a build directory under '%s': %s",
                         base, strerror(errno));
  snprintf(cfile, sizeof cfile, "%s/kernel.c", dir);
  snprintf(sofile, sizeof sofile, "%s/kernel.so", dir);
  snprintf(march, sizeof march, "-march=%s", g->target.isa);

  int rc;
  if (write_file(cfile, src, len)) {
    rc = tcc_error_set(err, io_failure_class(errno), "cannot write %s: %s", cfile, strerror(errno));
    goto done;
  }
  const char *argv[32 + 64];
  char feat[64][40];
  int a = 0;
  argv[a++] = cc;
  argv[a++] = "-std=c11";
  argv[a++] = "-O3";
  argv[a++] = march;
  for (int i = 0; i < g->target.nfeatures && i < 64; i++) {
    snprintf(feat[i], sizeof feat[i], "-m%s", g->target.features[i]);
    argv[a++] = feat[i];
  }
  argv[a++] = "-fPIC";
  argv[a++] = "-shared";
  argv[a++] = "-ffp-contract=off";
  argv[a++] = "-fno-math-errno";
  argv[a++] = "-fno-trapping-math";
  argv[a++] = "-o";
  argv[a++] = sofile;
  argv[a++] = cfile;
  argv[a++] = "-lm";
  if (strstr(src, "#pragma omp") || strstr(src, "omp_set_num_threads")) argv[a++] = "-fopenmp";
  int blas = 0, dnnl = 0;
  for (int k = 0; k < p->nkernels; k++)
    if (!p->kernels[k].dead && p->kernels[k].kind == TCC_OPK_EXTERN) {
      const tcc_vx *call = p->kernels[k].stores[0].value;
      if (call->i == TCC_EXT_GEMM && (call->dtype != TCC__V1__DTYPE__FLOAT32 || !tcc_onednn_enabled())) blas = 1;
      else dnnl = 1;
    }
  if (dnnl) {
    argv[a++] = "-pthread";
    argv[a++] = "-ldnnl";
  }
  if (blas) {
#ifdef TCC_OPENBLAS_LIBDIR
    argv[a++] = "-L" TCC_OPENBLAS_LIBDIR;
    argv[a++] = "-Wl,-rpath," TCC_OPENBLAS_LIBDIR;
#endif
    argv[a++] = "-lopenblas";
  }
  argv[a] = NULL;
  char *output = NULL;
  rc = tcc_run_tool(argv, timeout, &output, err);
  free(output);
  if (rc) {
    tcc_error_prefix(err, "building the kernel");
    goto done;
  }
  if (read_file(sofile, &out->data, &out->size)) {
    rc = tcc_error_set(err, io_failure_class(errno), "cannot read the built %s: %s", sofile, strerror(errno));
    goto done;
  }
done:
  if (!keep) {
    unlink(sofile);
    unlink(cfile);
    rmdir(dir);
  }
  return rc;
}
