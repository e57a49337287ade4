/*
 * tune_child.c — the daemon's side of the benchmark child: tccd-bench
 * (runtime/bench.c, which specifies its command line and report) run on
 * one candidate, its report parsed, its outputs read back; and the GPU
 * probe (tune_child.h).
 *
 * DESIGN
 *
 *   Generated code never runs in the daemon. For each candidate the
 *   artifact and its manifest go into a fresh directory under work_dir
 *   ($TMPDIR): candidate.so (candidate.cubin for CUDA), manifest.pb; the
 *   child writes outputs.bin there. It runs through the compiler's one
 *   spawning helper, tcc_run_tool_limits (own process group; prlimit:
 *   address space 4 GiB except for cubins, CPU seconds timeout/1000 + 5,
 *   no core; killed at the wall-clock timeout, and by tcc_tools_cancel
 *   at shutdown), as
 *
 *     tccd-bench SO MANIFEST OUTFILE SEED REPS SETS CANDIDATE [DEVICE]
 *
 *   and its stdout must be the report ("tccd-bench 1" ... "end", one
 *   median per kernel) or the run is DATA_LOSS. The directory is removed
 *   whatever happened. autotune.c runs the candidates one at a time on a
 *   pool thread.
 *
 *   The GPU probe (tccd-bench --probe) runs the same way, once per
 *   process (autotune.c's pick_gpu), so the daemon never loads libcuda;
 *   tccd_gpu_pick then chooses a device that runs the target's cubin
 *   natively.
 */
#include "tune_child.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ one candidate */

static int write_all(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  const uint8_t *p = data;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return close(fd);
}

/* The whole file at path into *out (malloc'd; an empty file gives a
 * 1-byte buffer and *len 0). Returns 0 or -1 (errno says why). */
static int read_all(const char *path, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rbe");
  if (!f) return -1;
  uint8_t *data = NULL;
  size_t n = 0, cap = 0, r;
  char chunk[65536];
  while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (n + r > cap) {
      size_t ncap = cap ? cap * 2 : sizeof chunk;
      while (ncap < n + r) ncap *= 2;
      uint8_t *grown = realloc(data, ncap);
      if (!grown) {
        free(data);
        fclose(f);
        return -1;
      }
      data = grown;
      cap = ncap;
    }
    memcpy(data + n, chunk, r);
    n += r;
  }
  fclose(f);
  if (!data && !(data = malloc(1))) return -1;
  *out = data;
  *len = n;
  return 0;
}

/* Parses the child's report into r. Returns 0 or -1. */
static int parse_report(const char *text, tcc_bench_result *r) {
  const char *p = strstr(text, "tccd-bench 1\n");
  if (!p) return -1;
  p += 13;
  int nk, bad;
  if (sscanf(p, "kernels %d\nbad %d\n", &nk, &bad) != 2 || nk < 0 || nk > 1 << 20) return -1;
  r->nkernels = nk;
  r->entry_bad = bad != 0;
  r->kernel_ns = calloc((size_t)nk + 1, sizeof *r->kernel_ns);
  if (!r->kernel_ns) return -1;
  p = strstr(p, "\nbad ");
  p = p ? strchr(p + 1, '\n') : NULL;
  for (int k = 0; k < nk; k++) {
    int j;
    double ns;
    if (!p || sscanf(p + 1, "k %d %lf", &j, &ns) != 2 || j != k || !(ns >= 0) || !isfinite(ns))
      return -1;
    r->kernel_ns[k] = ns;
    p = strchr(p + 1, '\n');
  }
  return p && strncmp(p + 1, "end", 3) == 0 ? 0 : -1;
}

int tccd_bench_run(const tccd_bench_options *o, const tcc_artifact *a, tcc_bench_result *out,
                   tcc_error *err) {
  memset(out, 0, sizeof *out);
  const char *base = o->work_dir && o->work_dir[0] ? o->work_dir : getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  char dir[4096], so[4200], man[4200], outf[4200];
  if ((size_t)snprintf(dir, sizeof dir, "%s/tccd-bench-XXXXXX", base) >= sizeof dir)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "work_dir path too long");
  if (!mkdtemp(dir))
    return tcc_error_set(err, TCC_E_INTERNAL, "cannot create a benchmark directory under '%s': %s",
                         base, strerror(errno));
  int cubin = a->kind == TCC__V1__ARTIFACT_KIND__CUBIN;
  snprintf(so, sizeof so, "%s/candidate.%s", dir, cubin ? "cubin" : "so");
  snprintf(man, sizeof man, "%s/manifest.pb", dir);
  snprintf(outf, sizeof outf, "%s/outputs.bin", dir);
  int rc = 0;
  char *report = NULL;
  if (write_all(so, a->data, a->size) || write_all(man, a->manifest, a->manifest_len)) {
    rc = tcc_error_set(err, TCC_E_INTERNAL, "cannot write the candidate to %s: %s", dir,
                       strerror(errno));
    goto done;
  }
  char seed[32], reps[16], sets[16], cand[16], dev[16];
  snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
  snprintf(reps, sizeof reps, "%d", o->reps > 0 ? o->reps : 9);
  snprintf(sets, sizeof sets, "%d", o->input_sets > 0 ? o->input_sets : 3);
  snprintf(cand, sizeof cand, "%d", o->candidate);
  snprintf(dev, sizeof dev, "%d", o->cuda_device);
  const char *argv[] = {o->bench_exe, so, man, outf, seed, reps, sets, cand, cubin ? dev : NULL, NULL};
  rc = tcc_run_tool_limits(argv, o->timeout_ms > 0 ? o->timeout_ms : 20000, !cubin, &report, err);
  if (rc) {
    tcc_error_prefix(err, "benchmark child");
    goto done;
  }
  if (parse_report(report ? report : "", out) != 0) {
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "benchmark child: malformed report: %.200s",
                       report ? report : "");
    goto done;
  }
  if (read_all(outf, &out->outputs, &out->outputs_len) != 0)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "benchmark child wrote no outputs (%s)", strerror(errno));
done:
  free(report);
  unlink(so);
  unlink(man);
  unlink(outf);
  rmdir(dir);
  if (rc) tcc_bench_result_free(out);
  return rc;
}

/* ------------------------------------------------------------ the GPU probe */

int tccd_gpu_probe(const char *bench_exe, int timeout_ms, tccd_gpu_probe_result *out,
                   tcc_error *err) {
  memset(out, 0, sizeof *out);
  const char *argv[] = {bench_exe, "--probe", NULL};
  char *text = NULL;
  int rc = tcc_run_tool_limits(argv, timeout_ms > 0 ? timeout_ms : 30000, 0, &text, err);
  if (rc) {
    free(text);
    tcc_error_prefix(err, "GPU probe");
    return rc;
  }
  const char *p = text ? strstr(text, "tccd-bench-probe 1\n") : NULL;
  if (!p) {
    rc = tcc_error_set(err, TCC_E_INTERNAL, "GPU probe: malformed report: %.200s", text ? text : "");
    free(text);
    return rc;
  }
  for (p = strchr(p, '\n'); p && p[1]; p = strchr(p + 1, '\n')) {
    int idx, len = 0;
    char arch[16];
    if (sscanf(p + 1, "device %d %15s %n", &idx, arch, &len) == 2 && idx == out->ndevices &&
        out->ndevices < (int)(sizeof out->device / sizeof out->device[0])) {
      snprintf(out->device[idx].arch, sizeof out->device[idx].arch, "%s", arch);
      size_t n = strcspn(p + 1 + len, "\n");
      snprintf(out->device[idx].name, sizeof out->device[idx].name, "%.*s", (int)n, p + 1 + len);
      out->ndevices++;
    } else if (strncmp(p + 1, "none ", 5) == 0) {
      size_t n = strcspn(p + 6, "\n");
      snprintf(out->why, sizeof out->why, "%.*s", (int)n, p + 6);
    }
  }
  free(text);
  return 0;
}

/* "sm_90a" -> 9, 0, 1. Returns 0 or -1. */
static int parse_arch(const char *arch, int *major, int *minor, int *exact) {
  int cc = 0, n = 0;
  if (!arch || sscanf(arch, "sm_%d%n", &cc, &n) != 1 || cc < 10) return -1;
  *major = cc / 10;
  *minor = cc % 10;
  *exact = arch[n] == 'a' || arch[n] == 'f';
  return 0;
}

int tccd_gpu_pick(const tccd_gpu_probe_result *probe, const char *arch) {
  int tM, tm, te;
  if (parse_arch(arch, &tM, &tm, &te)) return -1;
  for (int i = 0; i < probe->ndevices; i++) {
    int dM, dm, de;
    if (parse_arch(probe->device[i].arch, &dM, &dm, &de)) continue;
    if (dM == tM && (te ? dm == tm : dm >= tm)) return i;
  }
  return -1;
}
