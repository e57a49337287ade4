/*
 * tune.c — autotuning support: kernel configs and candidates, kernel
 * signatures, benchmark hooks, the output check and tuning records
 * (compiler.h, "tune.c").
 *
 * DESIGN
 *
 *   A candidate is one tcc_kernel_config applied to every kernel of a
 *   graph: one .so per candidate (built with tcc_compile_tuned and
 *   bench_hooks), so N candidates cost N builds however many kernels the
 *   graph has, and each benchmark run times every kernel separately
 *   through the hook
 *
 *     int tcc_tune_kernel(int k, const void *const *in, void *const *out,
 *                         void *workspace);     (runs kernel k alone)
 *
 *   The caller (the daemon) then picks each kernel's best config on its
 *   own and builds the final .so with one config per kernel.
 *
 *   Candidates (CPU; index 0 is the default, the code tcc_compile makes):
 *     0  default     parallel outer loop above TCC_PARALLEL_WORK, else serial
 *     1  par         outer loop always parallel (GEMM: batch in parallel,
 *                    one BLAS thread each when batched)
 *     2  serial      never parallel; GEMM with one OpenBLAS thread
 *     3  par+unroll  parallel outer loop, innermost plain loop unrolled 4x
 *     4  ser+unroll  serial, innermost plain loop unrolled 4x
 *     5  par chunk   parallel outer loop, schedule(static, 8) (interleaved
 *                    rows: better balance for few, long rows)
 *
 *   Candidates (CUDA; cuda/schedule.c reads block/ipt/wrow/split/persist, the
 *   launch geometry in the manifest follows; index 0 is the default):
 *     0  default     the emitter's heuristic (256-thread pointwise blocks,
 *                    reductions: the extent rounded up to 32..256)
 *     1-3 block      128, 512, 1024 threads per block (everything)
 *     4  ipt=4       pointwise: a grid of numel / (256 * 4) blocks, so each
 *                    thread of the grid-stride loop takes 4 elements
 *     5  512 x 8     512 threads, 8 elements each
 *     6  wrow=1      reductions: a warp per row (block/32 rows per block)
 *     7  wrow=-1     reductions: a block per row, rows <= 32 too
 *     8  split=1     long reductions into few rows: not split
 *     9, 10 split    128 and 1024 partial groups per row
 *     11 persist     block-per-row reductions: inputs read more than once
 *                    per row copied to shared memory once ("persistent")
 *   A config field that does not apply to a kernel leaves it as the
 *   default makes it, so such candidates time the same and lose to the
 *   default's TUNE_MIN_GAIN margin.
 *
 *   Kernel signature: SHA-256("tccd-tune-sig/1", target, identity, the
 *   kernel's default C source with its identifiers renumbered: k<j> ->
 *   k, buffers b<n> numbered by first use, in[i]/out[i]/ws offsets
 *   erased; CUDA: its CUDA source, with the parameter list, the
 *   "(void)in3;" lines and the in<i>/out<i> numbers erased too). The
 *   same computation over the same shapes and strides in
 *   another graph therefore has the same signature, and a tuning record
 *   found for it needs no benchmark.
 *
 *   The benchmark child (tccd-bench, runtime/bench.c) that measures a
 *   candidate is spawned by the daemon (daemon/tune_child.c), which
 *   fills a tcc_bench_result from its report; tcc_bench_compare below
 *   checks a candidate's outputs against the default's. This library
 *   spawns no benchmark.
 */
#include "target.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ candidates */

int tcc_tune_candidates(int device, tcc_kernel_config *out) {
  const tcc_target *t = tcc_target_for(device);
  return t ? t->candidates(out) : 0;
}

/* ------------------------------------------------------------ signatures */

/* Appends kernel text [s, e) to b with its identifiers renumbered (see
 * the header). */
static void normalize_kernel(tcc_buf *b, const char *s, const char *e) {
  int64_t map[512];
  int nmap = 0;
  const char *q = s;
  while (q < e) {
    int word_start = q == s || !(isalnum((unsigned char)q[-1]) || q[-1] == '_');
    if (word_start && (*q == 'b' || *q == 'k') && q + 1 < e && isdigit((unsigned char)q[1])) {
      const char *d = q + 1;
      int64_t n = 0;
      while (d < e && isdigit((unsigned char)*d)) n = n * 10 + (*d++ - '0');
      if (*q == 'k' && (d >= e || !(isalnum((unsigned char)*d) || *d == '_'))) {
        tcc_buf_puts(b, "k");
        q = d;
        continue;
      }
      if (*q == 'b') {
        int idx = -1;
        for (int i = 0; i < nmap; i++)
          if (map[i] == n) idx = i;
        if (idx < 0 && nmap < 512) map[idx = nmap++] = n;
        tcc_buf_printf(b, "b%d", idx);
        q = d;
        continue;
      }
    }
    if (word_start && (strncmp(q, "in[", 3) == 0 || strncmp(q, "out[", 4) == 0)) {
      const char *d = q + (*q == 'i' ? 3 : 4);
      const char *f = d;
      while (f < e && isdigit((unsigned char)*f)) f++;
      if (f > d && f < e && *f == ']') {
        tcc_buf_put(b, q, (size_t)(d - q));
        q = f;
        continue;
      }
    }
    if (strncmp(q, "(ws + ", 6) == 0) {
      const char *f = q + 6;
      while (f < e && isdigit((unsigned char)*f)) f++;
      tcc_buf_puts(b, "(ws + _");
      q = f;
      continue;
    }
    tcc_buf_put(b, q, 1);
    q++;
  }
}

/* CUDA kernel text [s, e) without what depends on the graph's argument
 * count rather than on the kernel: the parameter lists ("k0(const void
 * *__restrict__ in0, ..., char *__restrict__ ws)"), the "(void)in3;"
 * lines, and the argument numbers of in<i> / out<i>. Appended to b. */
static void cuda_strip_arguments(tcc_buf *b, const char *s, const char *e) {
  const char *q = s;
  while (q < e) {
    const char *eol = memchr(q, '\n', (size_t)(e - q));
    const char *end = eol ? eol + 1 : e;
    if (strncmp(q, "  (void)in", 10) == 0 || strncmp(q, "  (void)out", 11) == 0 || strncmp(q, "  (void)ws;", 11) == 0) {
      q = end;
      continue;
    }
    const char *g = strstr(q, "__global__ void ");
    if (g && g < end) {   /* "... k0(<params>) {": keep up to '(' */
      const char *paren = memchr(g, '(', (size_t)(end - g));
      const char *close = paren ? strstr(paren, ") {") : NULL;
      if (paren && close && close < end) {
        tcc_buf_put(b, q, (size_t)(paren - q) + 1);
        tcc_buf_put(b, close, (size_t)(end - close));
        q = end;
        continue;
      }
    }
    for (const char *c = q; c < end; c++) {
      int word_start = c == s || !(isalnum((unsigned char)c[-1]) || c[-1] == '_');
      size_t w = word_start && strncmp(c, "in", 2) == 0 ? 2 : word_start && strncmp(c, "out", 3) == 0 ? 3 : 0;
      if (w && c + w < end && isdigit((unsigned char)c[w])) {
        const char *d = c + w;
        while (d < end && isdigit((unsigned char)*d)) d++;
        if (d >= end || !(isalnum((unsigned char)*d) || *d == '_')) {
          tcc_buf_put(b, c, w);
          c = d - 1;
          continue;
        }
      }
      tcc_buf_put(b, c, 1);
    }
    q = end;
  }
}

/* The kind named in a kernel's header comment ("/\* k3: reduction over"). */
static void kernel_kind(const char *s, const char *e, char *out, size_t cap) {
  const char *c = memchr(s, ':', (size_t)(e - s));
  snprintf(out, cap, "pointwise");
  if (!c) return;
  c += 2;
  if (strncmp(c, "extern", 6) == 0) snprintf(out, cap, "extern");
  else if (strncmp(c, "reduction", 9) == 0) snprintf(out, cap, "reduction");
}

int tcc_tune_signatures_make(const tcc_prepared *p, tcc_tune_signatures *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  if (!p || !p->graph || (p->graph->target.device != TCC__V1__DEVICE_TYPE__CPU &&
                          p->graph->target.device != TCC__V1__DEVICE_TYPE__CUDA))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "kernel signatures are for CPU and CUDA targets");
  if (p->graph->nsyms)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "autotuning dynamic-shape graphs is not supported yet");
  char *src;
  size_t len;
  int nk = 0;
  int rc = tcc_generate_source_whole(p, &src, &len, &nk, err);
  if (rc) return rc;
  out->kernels = calloc((size_t)nk + 1, sizeof *out->kernels);
  if (!out->kernels) {
    free(src);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  out->nkernels = nk;
  const char *end = strstr(src, "\n__attribute__((visibility(\"default\")))\nint tcc_entry");
  if (!end) end = src + len;
  for (int k = 0; k < nk; k++) {
    /* kernel k's text: from its header comment (CUDA: its split stage's,
     * when it has one, which comes first) to the next kernel's */
    char mark[32];
    snprintf(mark, sizeof mark, "\n/* k%d: ", k);
    const char *head = strstr(src, mark);
    snprintf(mark, sizeof mark, "\n/* k%d_split: ", k);
    const char *s = strstr(src, mark);
    if (!s || (head && s > head)) s = head;
    snprintf(mark, sizeof mark, "\n/* k%d: ", k + 1);
    const char *e = s ? strstr(s + 1, mark) : NULL;
    snprintf(mark, sizeof mark, "\n/* k%d_split: ", k + 1);
    const char *e2 = s ? strstr(s + 1, mark) : NULL;
    if (e2 && (!e || e2 < e)) e = e2;
    if (!e || e > end) e = end;
    if (!s || !head) {
      tcc_tune_signatures_free(out);
      free(src);
      return tcc_error_set(err, TCC_E_INTERNAL, "kernel k%d not found in the generated source", k);
    }
    tcc_buf b = {0};
    tcc_buf_printf(&b, "tccd-tune-sig/1%c%s%c%s%c", 0, p->graph->target_label, 0,
                   p->graph->identity ? p->graph->identity : "", 0);
    if (p->graph->target.device == TCC__V1__DEVICE_TYPE__CUDA) {
      tcc_buf c = {0};
      cuda_strip_arguments(&c, s, e);
      if (!c.failed) normalize_kernel(&b, c.data, c.data + c.len);
      b.failed |= c.failed;
      tcc_buf_free(&c);
    } else {
      normalize_kernel(&b, s, e);
    }
    if (b.failed) {
      tcc_buf_free(&b);
      tcc_tune_signatures_free(out);
      free(src);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
    tcc_tune_kernel *K = &out->kernels[k];
    tcc_sha256(b.data, b.len, K->signature);
    tcc_hex_encode(K->signature, TCC_SHA256_BYTES, K->signature_hex);
    kernel_kind(head, e > head ? e : end, K->kind, sizeof K->kind);
    tcc_buf_free(&b);
  }
  free(src);
  return 0;
}

void tcc_tune_signatures_free(tcc_tune_signatures *sigs) {
  if (!sigs) return;
  free(sigs->kernels);
  memset(sigs, 0, sizeof *sigs);
}

/* ------------------------------------------------------------ results */

void tcc_bench_result_free(tcc_bench_result *r) {
  if (!r) return;
  free(r->kernel_ns);
  free(r->outputs);
  memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ output check */

static double load_float(const uint8_t *p, int dt) {
  switch (dt) {
  case TCC__V1__DTYPE__FLOAT32: { float f; memcpy(&f, p, 4); return f; }
  case TCC__V1__DTYPE__FLOAT64: { double f; memcpy(&f, p, 8); return f; }
  case TCC__V1__DTYPE__FLOAT16: { /* exact: every half is a double */
    uint16_t h;
    memcpy(&h, p, 2);
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
  }
  case TCC__V1__DTYPE__BFLOAT16: {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  default: return 0;
  }
}

int tcc_bench_compare(const uint8_t *manifest, size_t manifest_len, const tcc_bench_result *ref,
                      const tcc_bench_result *cand, tcc_error *err) {
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, manifest_len, manifest);
  if (!m) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "undecodable manifest");
  int rc = 0;
  if (ref->outputs_len != cand->outputs_len) {
    rc = tcc_error_set(err, TCC_E_OUT_OF_RANGE, "outputs are %zu bytes, the default's %zu",
                       cand->outputs_len, ref->outputs_len);
    goto done;
  }
  size_t off = 0;
  for (size_t o = 0; o < m->n_outputs && !rc; o++) {
    const Tcc__V1__TensorMeta *t = m->outputs[o];
    int dt = t->dtype;
    int es = tcc_dtype_size(dt);
    int64_t n = tcc_storage_elems(t->sizes, t->n_sizes, t->strides, t->n_strides, t->storage_offset);
    size_t bytes = (size_t)n * (size_t)es;
    if (off + bytes > ref->outputs_len) {
      rc = tcc_error_set(err, TCC_E_OUT_OF_RANGE, "output %zu is past the reported bytes", o);
      break;
    }
    const uint8_t *a = cand->outputs + off, *b = ref->outputs + off;
    if (tcc_dtype_is_float(dt)) {
      double maxabs = 0;
      for (int64_t i = 0; i < n; i++) {
        double v = fabs(load_float(b + i * es, dt));
        if (isfinite(v) && v > maxabs) maxabs = v;
      }
      int f64 = dt == TCC__V1__DTYPE__FLOAT64;
      double rtol = f64 ? 1e-9 : 1e-3, atol = (f64 ? 1e-12 : 1e-4) * (maxabs > 1 ? maxabs : 1);
      for (int64_t i = 0; i < n; i++) {
        double x = load_float(a + i * es, dt), y = load_float(b + i * es, dt);
        if (isnan(x) && isnan(y)) continue;
        if (x == y) continue; /* equal infinities */
        if (!(fabs(x - y) <= atol + rtol * fabs(y))) {
          rc = tcc_error_set(err, TCC_E_OUT_OF_RANGE,
                             "output %zu element %" PRId64 " is %.9g, the default config gives %.9g",
                             o, i, x, y);
          break;
        }
      }
    } else if (memcmp(a, b, bytes) != 0) {
      size_t i = 0;
      while (a[i] == b[i]) i++;
      rc = tcc_error_set(err, TCC_E_OUT_OF_RANGE,
                         "output %zu differs from the default config's at element %zu", o,
                         i / (size_t)es);
    }
    off += bytes;
  }
done:
  tcc__v1__manifest__free_unpacked(m, NULL);
  return rc;
}

/* ------------------------------------------------------------ records */

int tcc_tune_record_encode(const tcc_tune_record *r, uint8_t **out, size_t *len, tcc_error *err) {
  char cfg[TCC_TUNE_CONFIG_TEXT];
  tcc_kernel_config_format(&r->config, cfg, sizeof cfg);
  char *s = NULL;
  int n = asprintf(&s, "tccd-tune/1 %s;best_ns=%.17g;default_ns=%.17g;tried=%d;discarded=%d", cfg,
                   r->best_ns, r->default_ns, r->tried, r->discarded);
  if (n < 0) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  *out = (uint8_t *)s;
  *len = (size_t)n;
  return 0;
}

int tcc_tune_record_decode(const uint8_t *data, size_t len, tcc_tune_record *out, tcc_error *err) {
  char s[512];
  if (len < 12 || len >= sizeof s || memcmp(data, "tccd-tune/1 ", 12) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "not a tccd-tune/1 record");
  memcpy(s, data, len);
  s[len] = '\0';
  tcc_tune_record r;
  memset(&r, 0, sizeof r);
  char *semi = strchr(s + 12, ';');
  if (!semi) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tuning record without fields");
  *semi = '\0';
  if (tcc_kernel_config_parse(s + 12, &r.config) != 0 ||
      sscanf(semi + 1, "best_ns=%lf;default_ns=%lf;tried=%d;discarded=%d", &r.best_ns,
             &r.default_ns, &r.tried, &r.discarded) != 4)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed tuning record");
  *out = r;
  return 0;
}
