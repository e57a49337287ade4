/*
 * dynamic.c — dynamic shapes: symbolic sizes, the graph at given sizes,
 * and fitting generated code over the symbols.
 *
 * Requires: a verified graph with `dynamic` set (tcc_dyn_verify), or a
 * canonical one (the rest).
 *
 * Symbols
 * -------
 * A client marks graph input dims symbolic (TensorMeta.sym_sizes: "s0"
 * per dim, "" static). Symbols are numbered by first appearance (inputs
 * in call order, dims in order); dims that share a name share a size.
 * As in Dynamo, a symbol whose example is 0 or 1 is specialised (the dim
 * is static), and an input with a symbolic dim must be contiguous (its
 * strides are then the contiguous strides of whatever sizes it has).
 *
 * How a dynamic graph is compiled (probe and fit)
 * -----------------------------------------------
 * The passes (infer, lower, fuse, place, emit) work on concrete sizes.
 * A dynamic compile runs them at several assignments of the symbols
 * ("probes") and reads the generated C of all probes side by side:
 *
 *   probes 0 .. 2^k-1   the corners of a box: symbol j is base[j] or
 *                       alt[j] (primes that no static size of the graph
 *                       equals, so no value coincides with a symbol)
 *   probe 2^k           large primes (about 1000)
 *   probe 2^k+1         small primes (3, 5, 7, 11, ...)
 *
 * (every probe avoiding the graph's static sizes where it can)
 * The texts must agree token for token except for numbers. A number that
 * differs is a size that depends on the symbols: its values at the
 * corners determine a unique multilinear polynomial (sum of coef x
 * product of distinct symbols: sizes, contiguous strides, byte offsets,
 * loop bounds, a mean's divisor), which must reproduce the two other
 * probes exactly; the number becomes that expression of the runtime
 * symbols (tcc_S[j]) in the C. A number that is the same everywhere is
 * a constant. Anything else (a floating literal that is not a whole
 * number, a number that is not polynomial in the symbols, code whose
 * shape changes with the sizes) is TCC_E_UNIMPLEMENTED naming what
 * differed: kernels are correct for every size the guards admit, never
 * only for the probes. The emitter helps by making no size-dependent
 * choices for dynamic programs (cpu/emit.c: the parallel loop is chosen
 * with an OpenMP if() clause at run time; place.c: no workspace reuse,
 * 8-byte granules) and by passing tcc_S to every kernel.
 *
 * The manifest's layouts and workspace size are fitted the same way
 * (tcc_dyn_fit), from the probes' graphs and programs.
 */
#include "loop.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ verify */

static int valid_sym_name(const char *s) {
  if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
  size_t n = strlen(s);
  if (n > 32) return 0;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return 0;
  return 1;
}

int tcc_dyn_verify(const Tcc__V1__CompileRequest *req, tcc_arena *A, tcc_graph *g,
                   tcc_error *err) {
  const Tcc__V1__Graph *pg = req->graph;
  g->nsyms = 0;
  g->sym_of = NULL;
  const char *names[TCC_MAX_SYMS];
  int64_t example[TCC_MAX_SYMS];
  int *sym_of = tcc_arena_array(A, (size_t)g->ninputs * TCC_MAX_DIMS + 1, sizeof *sym_of);
  if (!sym_of) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  int nsyms = 0;
  for (int i = 0; i < g->ninputs; i++) {
    int id = g->inputs[i];
    /* the request's TensorValue of this input: values keep request order */
    const Tcc__V1__TensorMeta *pm = pg->values[id]->meta;
    tcc_meta *m = &g->values[id].meta;
    for (int d = 0; d < TCC_MAX_DIMS; d++) sym_of[i * TCC_MAX_DIMS + d] = -1;
    if (!pm || pm->n_sym_sizes == 0) continue;
    if ((int)pm->n_sym_sizes != m->rank)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "graph input %d: %zu sym_sizes for a tensor of rank %d", i,
                           pm->n_sym_sizes, m->rank);
    int any = 0;
    for (int d = 0; d < m->rank; d++) {
      const char *s = pm->sym_sizes[d];
      if (!s || !s[0]) continue;
      if (!valid_sym_name(s))
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "graph input %d dim %d: symbol name must be an identifier of at "
                             "most 32 characters", i, d);
      if (m->sizes[d] < 2) continue;   /* 0/1 specialise, as in Dynamo */
      int s_id = -1;
      for (int j = 0; j < nsyms; j++)
        if (!strcmp(names[j], s)) s_id = j;
      if (s_id < 0) {
        if (nsyms == TCC_MAX_SYMS)
          return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                               "dynamic shapes: more than %d symbols in one graph",
                               TCC_MAX_SYMS);
        s_id = nsyms++;
        names[s_id] = s;
        example[s_id] = m->sizes[d];
      } else if (example[s_id] != m->sizes[d]) {
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                             "symbol '%s' has example sizes %lld and %lld", s,
                             (long long)example[s_id], (long long)m->sizes[d]);
      }
      sym_of[i * TCC_MAX_DIMS + d] = s_id;
      any = 1;
    }
    if (any) {
      tcc_meta c = *m;
      tcc_meta_contiguous(&c);
      for (int d = 0; d < m->rank; d++)
        if (c.strides[d] != m->strides[d] && m->sizes[d] > 1)
          return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                               "dynamic shapes: graph input %d has symbolic sizes but is not "
                               "contiguous", i);
    }
  }
  if (!nsyms) return 0;
  g->nsyms = nsyms;
  g->sym_of = sym_of;
  g->sym_names = tcc_arena_array(A, (size_t)nsyms, sizeof *g->sym_names);
  g->sym_example = tcc_arena_array(A, (size_t)nsyms, sizeof *g->sym_example);
  if (!g->sym_names || !g->sym_example)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  for (int j = 0; j < nsyms; j++) {
    g->sym_names[j] = tcc_arena_strdup(A, names[j]);
    if (!g->sym_names[j]) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    g->sym_example[j] = example[j];
  }
  return 0;
}

int tcc_dyn_copy(const tcc_graph *in, tcc_graph *out, tcc_arena *A) {
  out->nsyms = in->nsyms;
  out->sym_names = NULL;
  out->sym_example = NULL;
  out->sym_of = NULL;
  if (!in->nsyms) return 0;
  out->sym_names = tcc_arena_array(A, (size_t)in->nsyms, sizeof *out->sym_names);
  out->sym_example = tcc_arena_array(A, (size_t)in->nsyms, sizeof *out->sym_example);
  out->sym_of = tcc_arena_array(A, (size_t)in->ninputs * TCC_MAX_DIMS + 1, sizeof *out->sym_of);
  if (!out->sym_names || !out->sym_example || !out->sym_of) return -1;
  for (int j = 0; j < in->nsyms; j++) {
    out->sym_names[j] = tcc_arena_strdup(A, in->sym_names[j]);
    if (!out->sym_names[j]) return -1;
    out->sym_example[j] = in->sym_example[j];
  }
  memcpy(out->sym_of, in->sym_of, sizeof *out->sym_of * (size_t)in->ninputs * TCC_MAX_DIMS);
  return 0;
}

/* ---------------------------------------------------- graph at sizes */

static int meta_is_contiguous(const tcc_meta *m) {
  tcc_meta c = *m;
  tcc_meta_contiguous(&c);
  for (int d = 0; d < m->rank; d++)
    if (m->sizes[d] > 1 && c.strides[d] != m->strides[d]) return 0;
  return m->offset == 0;
}

static const char *syms_str(const tcc_graph *g, const int64_t *syms, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int j = 0; j < g->nsyms && n < cap; j++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s=%lld", j ? ", " : "", g->sym_names[j],
                          (long long)syms[j]);
  return buf;
}

/* The most elements a tensor may hold at a probe: sizes, strides and
 * byte counts (8 per element, place.c) stay far from int64 overflow. */
#define PROBE_MAX_NUMEL ((int64_t)1 << 52)

/* 0 when m is small enough to probe, else UNIMPLEMENTED. */
static int probe_bounded(const tcc_graph *g, const tcc_meta *m, const int64_t *syms,
                         tcc_error *err);

int tcc_dyn_graph_at(const tcc_graph *g, const int64_t *syms, tcc_arena *A, tcc_graph *out,
                     tcc_error *err) {
  *out = *g;
  memset(&out->arena, 0, sizeof out->arena);   /* never freed through out */
  out->values = tcc_arena_array(A, (size_t)g->nvalues + 1, sizeof *out->values);
  char *isout = tcc_arena_alloc(A, (size_t)g->nvalues + 1);
  if (!out->values || !isout) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(out->values, g->values, sizeof *g->values * (size_t)g->nvalues);
  for (int i = 0; i < g->noutputs; i++) isout[g->outputs[i]] = 1;
  char sb[160];
  for (int i = 0; i < g->ninputs; i++) {
    tcc_meta *m = &out->values[g->inputs[i]].meta;
    int any = 0;
    for (int d = 0; d < m->rank; d++) {
      int s = g->sym_of[i * TCC_MAX_DIMS + d];
      if (s >= 0) {
        m->sizes[d] = syms[s];
        any = 1;
      }
    }
    if (any) {
      int64_t off = m->offset;
      tcc_meta_contiguous(m);
      m->offset = off;
      int rc = probe_bounded(g, m, syms, err);
      if (rc) return rc;
      if (m->numel && __builtin_add_overflow(off, m->numel, &m->span))
        return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                             "dynamic shapes: graph input %d's storage offset is too large", i);
      if (!m->numel) m->span = 0;
    }
  }
  tcc_meta inferred[TCC_SCHEMA_MAX_RETURNS];
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    tcc_meta *res = inferred;
    if (n->nout > TCC_SCHEMA_MAX_RETURNS) {
      res = tcc_arena_array(A, (size_t)n->nout, sizeof *res);
      if (!res) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    }
    int rc = tcc_infer_node(out, n, res, err);
    if (rc)
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "dynamic shapes: node %d (%s) fails at sizes %s: %s (a size "
                           "argument fixed to the example size?)", n->src_index, n->op->name,
                           syms_str(g, syms, sb, sizeof sb), err->msg);
    for (int o = 0; o < n->nout; o++) {
      int v = n->outs[o];
      if (v < 0) continue;
      const tcc_meta *dm = &g->values[v].meta;
      int same = dm->rank == res[o].rank;
      for (int d = 0; same && d < dm->rank; d++) same = dm->sizes[d] == res[o].sizes[d];
      if (same) continue;                       /* keeps its declared layout */
      if (isout[v] && !meta_is_contiguous(dm))
        return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                             "dynamic shapes: graph output '%.64s' has a dynamic size but "
                             "is not contiguous", g->values[v].name ? g->values[v].name : "");
      if ((rc = probe_bounded(g, &res[o], syms, err))) return rc;
      out->values[v].meta = res[o];
      out->values[v].meta.device = dm->device;
    }
  }
  return 0;
}

static int probe_bounded(const tcc_graph *g, const tcc_meta *m, const int64_t *syms,
                         tcc_error *err) {
  int64_t n = 1;
  for (int d = 0; d < m->rank; d++)
    if (__builtin_mul_overflow(n, m->sizes[d], &n) || n > PROBE_MAX_NUMEL) {
      char sb[160];
      return tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "dynamic shapes: a tensor would hold more than 2^52 elements at "
                           "the probe sizes %s", syms_str(g, syms, sb, sizeof sb));
    }
  return 0;
}

/* Primes for the probes. */
static const int64_t small_primes[] = {3, 5, 7, 11, 13, 2, 17, 19, 23};
static const int64_t mid_primes[] = {17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71,
                                     73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131};
static const int64_t large_primes[] = {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049};

/* Is x a static size somewhere in g (an input's or a constant's dim)? */
static int is_static_size(const tcc_graph *g, int64_t x) {
  for (int v = 0; v < g->nvalues; v++) {
    const tcc_value *val = &g->values[v];
    if (val->kind == TCC_VAL_NODE) continue;
    for (int d = 0; d < val->meta.rank; d++) {
      if (val->kind == TCC_VAL_INPUT && g->sym_of[val->def * TCC_MAX_DIMS + d] >= 0) continue;
      if (val->meta.sizes[d] == x) return 1;
    }
  }
  return 0;
}

/* Fills out[0..n) with distinct values of list (in order) that no static
 * size of g equals (repeating the list's last ones when it runs out). */
static void pick_primes(const tcc_graph *g, const int64_t *list, size_t len, int n,
                        int64_t *out) {
  size_t next = 0;
  for (int j = 0; j < n; j++) {
    while (next + 1 < len && is_static_size(g, list[next])) next++;
    out[j] = list[next < len ? next : len - 1];
    if (next + 1 < len) next++;
  }
}

/* The box's corners: symbol j is base[j] or alt[j]. */
static void choose_corners(const tcc_graph *g, int64_t *base, int64_t *alt) {
  int64_t v[2 * TCC_MAX_SYMS];
  pick_primes(g, mid_primes, sizeof mid_primes / sizeof mid_primes[0], 2 * g->nsyms, v);
  for (int j = 0; j < g->nsyms; j++) {
    base[j] = v[2 * j];
    alt[j] = v[2 * j + 1];
  }
}

int tcc_dyn_probe_pair(const tcc_graph *g, tcc_arena *A, tcc_graph *at_example,
                       tcc_graph *at_other, tcc_error *err) {
  int64_t base[TCC_MAX_SYMS], alt[TCC_MAX_SYMS];
  choose_corners(g, base, alt);
  for (int j = 0; j < g->nsyms; j++)
    if (base[j] == g->sym_example[j]) base[j] = alt[j];
  int rc = tcc_dyn_graph_at(g, g->sym_example, A, at_example, err);
  if (!rc) rc = tcc_dyn_graph_at(g, base, A, at_other, err);
  return rc;
}

/* ------------------------------------------------------------ probes */

int tcc_dyn_probes(const tcc_graph *g, int64_t (*assign)[TCC_MAX_SYMS]) {
  int k = g->nsyms, corners = 1 << k;
  int64_t base[TCC_MAX_SYMS], alt[TCC_MAX_SYMS];
  choose_corners(g, base, alt);
  for (int c = 0; c < corners; c++)
    for (int j = 0; j < k; j++) assign[c][j] = (c >> j) & 1 ? alt[j] : base[j];
  pick_primes(g, large_primes, sizeof large_primes / sizeof large_primes[0], k, assign[corners]);
  pick_primes(g, small_primes, sizeof small_primes / sizeof small_primes[0], k,
              assign[corners + 1]);
  return corners + 2;
}

/* ------------------------------------------------------------- fitting */

/* Fits the multilinear polynomial through vals[0..2^k) at the corners of
 * assign (tcc_dyn_probes) and checks it at the other probes. coef[mask]
 * is the coefficient of the product of the symbols in mask. Returns 0,
 * or -1 when no such polynomial with int64 coefficients reproduces
 * every probe. */
int tcc_dyn_fit(int k, int nprobes, const int64_t (*assign)[TCC_MAX_SYMS], const int64_t *vals,
                int64_t *coef) {
  int corners = 1 << k;
  __int128 c[1 << TCC_MAX_SYMS];
  for (int v = 0; v < corners; v++) c[v] = vals[v];
  for (int j = 0; j < k; j++) {
    __int128 lo_x = assign[0][j], hi_x = assign[1 << j][j], dx = hi_x - lo_x;
    for (int v = 0; v < corners; v++) {
      if ((v >> j) & 1) continue;
      __int128 lo = c[v], hi = c[v | (1 << j)], dy = hi - lo;
      if (dy % dx) return -1;
      __int128 slope = dy / dx;
      c[v] = lo - slope * lo_x;
      c[v | (1 << j)] = slope;
    }
  }
  for (int v = 0; v < corners; v++) {
    if (c[v] > INT64_MAX || c[v] < INT64_MIN) return -1;
    coef[v] = (int64_t)c[v];
  }
  for (int p = 0; p < nprobes; p++) {
    __int128 sum = 0;
    for (int v = 0; v < corners; v++) {
      __int128 t = coef[v];
      for (int j = 0; j < k; j++)
        if ((v >> j) & 1) t *= assign[p][j];
      sum += t;
    }
    if (sum != vals[p]) return -1;
  }
  return 0;
}

/* Appends the C expression of polynomial coef over tcc_S[]. */
static void put_poly_c(tcc_buf *b, int k, const int64_t *coef) {
  int corners = 1 << k, first = 1;
  tcc_buf_puts(b, "(");
  for (int v = 0; v < corners; v++) {
    if (!coef[v]) continue;
    tcc_buf_printf(b, "%s(int64_t)INT64_C(%" PRId64 ")", first ? "" : " + ", coef[v]);
    for (int j = 0; j < k; j++)
      if ((v >> j) & 1) tcc_buf_printf(b, " * tcc_S[%d]", j);
    first = 0;
  }
  if (first) tcc_buf_puts(b, "INT64_C(0)");
  tcc_buf_puts(b, ")");
}

/* A token of generated C. */
typedef struct tok {
  const char *s;
  size_t n;
  int number;        /* 1 integer literal, 2 floating literal, 0 other */
  size_t lead;       /* bytes of "INT64_C(" before the digits (number 1) */
} tok;

typedef struct toks {
  tok *t;
  size_t n, cap;
} toks;

static int tok_push(toks *ts, tok t) {
  if (ts->n == ts->cap) {
    size_t cap = ts->cap ? ts->cap * 2 : 4096;
    tok *nt = realloc(ts->t, cap * sizeof *nt);
    if (!nt) return -1;
    ts->t = nt;
    ts->cap = cap;
  }
  ts->t[ts->n++] = t;
  return 0;
}

/* Splits C text into tokens: identifiers, numbers (with INT64_C(...)
 * around an integer folded into one token), whitespace runs and single
 * other characters. Returns 0 or -1 (out of memory). */
static int tokenize(const char *s, toks *ts) {
  size_t i = 0, n = strlen(s);
  while (i < n) {
    tok t = {.s = s + i};
    size_t j = i;
    if (!strncmp(s + i, "INT64_C(", 8)) {
      size_t q = i + 8;
      if (s[q] == '-') q++;
      size_t d = q;
      while (isdigit((unsigned char)s[d])) d++;
      if (d > q && s[d] == ')') {
        t.number = 1;
        t.lead = 8;
        j = d + 1;
      }
    }
    if (j == i) {
      unsigned char c = (unsigned char)s[i];
      if (isalpha(c) || c == '_') {
        while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
      } else if (isdigit(c) || (c == '.' && isdigit((unsigned char)s[i + 1]))) {
        int hex = c == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X');
        int flt = 0;
        j = i + (hex ? 2 : 0);
        while (j < n) {
          char e = s[j];
          if (isalnum((unsigned char)e) || e == '.') {
            if (e == '.') flt = 1;
            if ((hex && (e == 'p' || e == 'P')) || (!hex && (e == 'e' || e == 'E'))) {
              flt = 1;
              if (s[j + 1] == '+' || s[j + 1] == '-') j++;
            }
            j++;
          } else {
            break;
          }
        }
        t.number = flt ? 2 : 1;
        if (t.number == 1)   /* plain decimal only; hex/suffixed ints stay text */
          for (size_t q = i; q < j; q++)
            if (!isdigit((unsigned char)s[q])) t.number = 0;
      } else if (isspace(c)) {
        while (j < n && isspace((unsigned char)s[j])) j++;
      } else {
        j = i + 1;
      }
    }
    t.n = j - i;
    if (tok_push(ts, t)) return -1;
    i = j;
  }
  return 0;
}

static int64_t tok_int(const tok *t) {
  return strtoll(t->s + t->lead, NULL, 10);
}

/* A floating literal's value when it is a whole number (|v| < 2^53):
 * 1 and *out, else 0. */
static int tok_whole(const tok *t, int64_t *out, int *f32) {
  char buf[64];
  if (t->n >= sizeof buf) return 0;
  memcpy(buf, t->s, t->n);
  buf[t->n] = '\0';
  *f32 = t->n && (buf[t->n - 1] == 'f' || buf[t->n - 1] == 'F');
  double v = strtod(buf, NULL);
  if (!isfinite(v) || v != floor(v) || fabs(v) >= 9007199254740992.0) return 0;
  *out = (int64_t)v;
  return 1;
}

int tcc_dyn_fit_source(int k, int nprobes, const int64_t (*assign)[TCC_MAX_SYMS],
                       const char *const *src, tcc_buf *out, int *nsymbolic, tcc_error *err) {
  toks ts[3 + (1 << TCC_MAX_SYMS)];
  memset(ts, 0, sizeof ts);
  int rc = 0;
  *nsymbolic = 0;
  int64_t *vals = NULL;
  if (nprobes < 1 || nprobes > 2 + (1 << TCC_MAX_SYMS))
    return tcc_error_set(err, TCC_E_INTERNAL, "dynamic shapes: %d probes", nprobes);
  for (int p = 0; p < nprobes; p++)
    if (tokenize(src[p], &ts[p])) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      goto done;
    }
  vals = calloc((size_t)nprobes + 1, sizeof *vals);
  if (!vals) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (int p = 1; p < nprobes; p++)
    if (ts[p].n != ts[0].n) {
      rc = tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                         "dynamic shapes: the generated code changes shape with the sizes "
                         "(%zu vs %zu tokens); compile with static shapes", ts[0].n, ts[p].n);
      goto done;
    }
  for (size_t i = 0; i < ts[0].n; i++) {
    const tok *t0 = &ts[0].t[i];
    int same = 1;
    for (int p = 1; p < nprobes && same; p++) {
      const tok *tp = &ts[p].t[i];
      same = tp->n == t0->n && !memcmp(tp->s, t0->s, t0->n);
    }
    if (same) {
      tcc_buf_put(out, t0->s, t0->n);
      continue;
    }
    int f32 = 0;
    for (int p = 0; p < nprobes; p++) {
      const tok *tp = &ts[p].t[i];
      int ok = tp->number == t0->number && t0->number != 0;
      if (ok && t0->number == 1) vals[p] = tok_int(tp);
      if (ok && t0->number == 2) ok = tok_whole(tp, &vals[p], &f32);
      if (!ok) {
        size_t ctx = i > 12 ? i - 12 : 0;
        tcc_buf where = {0};
        for (size_t q = ctx; q <= i && q < ts[0].n; q++) tcc_buf_put(&where, ts[0].t[q].s, ts[0].t[q].n);
        rc = tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                           "dynamic shapes: the generated code differs with the sizes where "
                           "it cannot be a size expression (near \"%.120s\"); compile with "
                           "static shapes", where.data ? where.data : "");
        tcc_buf_free(&where);
        goto done;
      }
    }
    int64_t coef[1 << TCC_MAX_SYMS];
    if (tcc_dyn_fit(k, nprobes, assign, vals, coef)) {
      size_t ctx = i > 12 ? i - 12 : 0;
      tcc_buf where = {0};
      for (size_t q = ctx; q <= i; q++) tcc_buf_put(&where, ts[0].t[q].s, ts[0].t[q].n);
      rc = tcc_error_set(err, TCC_E_UNIMPLEMENTED,
                         "dynamic shapes: a number in the generated code is not a polynomial "
                         "in the symbols (near \"%.120s\"); compile with static shapes",
                         where.data ? where.data : "");
      tcc_buf_free(&where);
      goto done;
    }
    if (t0->number == 2) tcc_buf_puts(out, f32 ? "((float)" : "((double)");
    put_poly_c(out, k, coef);
    if (t0->number == 2) tcc_buf_puts(out, ")");
    (*nsymbolic)++;
  }
  if (out->failed) rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
done:
  for (int p = 0; p < nprobes; p++) free(ts[p].t);
  free(vals);
  return rc;
}
