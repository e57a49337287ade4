/*
 * fuzz_graph.c — libFuzzer target that reads its input as a recipe for a
 * *valid* graph (shapes, broadcasting, layouts, storage offsets, dtypes,
 * op chains, scalars including NaN/inf, positional and named binding,
 * several outputs) and runs it through tcc_prepare and the back end up to
 * C source. Where fuzz_prepare mostly exercises rejection paths, this one
 * keeps the verifier happy and digs into canonicalization, lowering,
 * fusion and emission. Every recipe must prepare (else abort: the
 * verifier rejected a valid graph), and the back end must not fail with
 * INTERNAL (an IR check).
 *
 * Recipe: bytes are consumed in order; past the end every byte reads 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "loop.h"
#include "tcctest.h"

#define F32 TCC__V1__DTYPE__FLOAT32
#define F64 TCC__V1__DTYPE__FLOAT64
#define MAXV 64

typedef struct recipe {
  const uint8_t *p;
  size_t n, at;
} recipe;

static unsigned take(recipe *r) { return r->at < r->n ? r->p[r->at++] : 0; }

typedef struct val {
  char name[8];
  int dtype, rank;
  int64_t sizes[4];
} val;

static const struct {
  const char *name;
  int kind;   /* 0 unary, 1 tensor-tensor, 2 tensor-scalar */
  int alpha;
} ops[] = {
  {"aten.add.Tensor", 1, 1}, {"aten.sub.Tensor", 1, 1}, {"aten.mul.Tensor", 1, 0},
  {"aten.div.Tensor", 1, 0}, {"aten.add.Scalar", 2, 1}, {"aten.sub.Scalar", 2, 1},
  {"aten.mul.Scalar", 2, 0}, {"aten.div.Scalar", 2, 0}, {"aten.neg.default", 0, 0},
  {"aten.abs.default", 0, 0}, {"aten.exp.default", 0, 0}, {"aten.log.default", 0, 0},
  {"aten.sqrt.default", 0, 0}, {"aten.sin.default", 0, 0}, {"aten.cos.default", 0, 0},
  {"aten.tanh.default", 0, 0}, {"aten.sigmoid.default", 0, 0}, {"aten.relu.default", 0, 0},
};

static double scalar(recipe *r) {
  static const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e300, -1e-300, INFINITY,
                                   -INFINITY, NAN, 0.1};
  unsigned c = take(r);
  if (c < 200) return special[c % 12];
  return (double)(int)(take(r) | take(r) << 8) / 256.0 - 128.0;
}

/* Random strides for sizes: a dim order, padding, returned in st. */
static void layout(recipe *r, int rank, const int64_t *sizes, int64_t *st) {
  int perm[4];
  for (int d = 0; d < rank; d++) perm[d] = d;
  for (int d = rank - 1; d > 0; d--) {
    int j = (int)(take(r) % (unsigned)(d + 1)), t = perm[d];
    perm[d] = perm[j];
    perm[j] = t;
  }
  int64_t m = 1 + take(r) % 2;
  for (int d = rank - 1; d >= 0; d--) {
    st[perm[d]] = m;
    m *= (sizes[perm[d]] ? sizes[perm[d]] : 1) + take(r) % 2;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const isas[] = {"", "x86-64", "x86-64-v3", "x86-64-v4"};
  static const int64_t dims[] = {1, 2, 3, 5, 0, 7};
  recipe r = {data, size, 0};
  reqb *b = reqb_new(isas[take(&r) % 4]);
  val v[MAXV];
  int nv = 0;

  int orank = (int)(take(&r) % 5);
  int64_t osz[4];
  for (int d = 0; d < orank; d++) osz[d] = dims[take(&r) % (take(&r) % 8 ? 4 : 6)];

  int nin = 1 + (int)(take(&r) % 3);
  for (int k = 0; k < nin; k++) {
    val *x = &v[nv];
    snprintf(x->name, sizeof x->name, "i%d", k);
    x->dtype = take(&r) % 2 ? F64 : F32;
    x->rank = orank ? (int)(take(&r) % (unsigned)(orank + 1)) : 0;
    for (int d = 0; d < x->rank; d++) x->sizes[d] = take(&r) % 3 ? osz[orank - x->rank + d] : 1;
    int64_t st[4];
    layout(&r, x->rank, x->sizes, st);
    reqb_value(b, x->name, x->dtype, x->rank, x->sizes, st, take(&r) % 5);
    reqb_input(b, x->name);
    nv++;
  }

  int nnodes = 1 + (int)(take(&r) % 24);
  for (int k = 0; k < nnodes && nv < MAXV; k++) {
    unsigned which = take(&r) % (sizeof ops / sizeof ops[0]);
    const val *a = &v[take(&r) % (unsigned)nv], *c = &v[take(&r) % (unsigned)nv];
    val *o = &v[nv];
    snprintf(o->name, sizeof o->name, "n%d", k);
    int named = take(&r) % 2;
    if (ops[which].kind == 1) {          /* broadcast shape, result dtype */
      o->rank = a->rank > c->rank ? a->rank : c->rank;
      for (int i = 0; i < o->rank; i++) {
        int64_t p = i < a->rank ? a->sizes[a->rank - 1 - i] : 1;
        int64_t q = i < c->rank ? c->sizes[c->rank - 1 - i] : 1;
        o->sizes[o->rank - 1 - i] = p == 1 ? q : p;
      }
      int adim = a->rank > 0, cdim = c->rank > 0;
      if (adim != cdim) o->dtype = adim ? a->dtype : c->dtype;
      else o->dtype = a->dtype == F64 || c->dtype == F64 ? F64 : F32;
    } else {
      o->rank = a->rank;
      memcpy(o->sizes, a->sizes, sizeof o->sizes);
      o->dtype = a->dtype;
    }
    int64_t st[4];
    layout(&r, o->rank, o->sizes, st);   /* intermediate layouts are free */
    reqb_value(b, o->name, o->dtype, o->rank, o->sizes, st, take(&r) % 3);
    Tcc__V1__Node *n = reqb_node(b, ops[which].name, o->name);
    reqb_arg_tensor(b, n, named ? "self" : "", a->name);
    if (ops[which].kind == 1) reqb_arg_tensor(b, n, named ? "other" : "", c->name);
    if (ops[which].kind == 2) {
      if (take(&r) % 2) reqb_arg_int(b, n, named ? "other" : "", (int8_t)take(&r));
      else reqb_arg_float(b, n, named ? "other" : "", scalar(&r));
    }
    if (ops[which].alpha && take(&r) % 3 == 0) reqb_arg_float(b, n, "alpha", scalar(&r));
    nv++;
  }

  int nout = 1 + (int)(take(&r) % 3);
  for (int k = 0; k < nout; k++) {
    const val *x = &v[nv - 1 - (int)(take(&r) % (unsigned)nv)];
    /* an output's layout: non-overlapping (a permutation, maybe padded) */
    Tcc__V1__Graph *g = reqb_req(b)->graph;
    for (size_t i = 0; i < g->n_values; i++)
      if (!strcmp(g->values[i]->name, x->name) && i >= (size_t)nin)
        layout(&r, x->rank, x->sizes, g->values[i]->meta->strides);
    reqb_output(b, x->name);
  }

  tcc_prepared *p;
  tcc_error err;
  int rc = tcc_prepare(reqb_req(b), "tccd-codegen/1 cc=fuzz", &p, &err);
  if (rc) {
    fprintf(stderr, "valid recipe rejected: %s\n", err.msg);
    abort();
  }
  char *src;
  size_t len;
  rc = tcc_generate_source(p, &src, &len, NULL, &err);
  if (rc == TCC_E_INTERNAL) {
    fprintf(stderr, "back end: %s\n", err.msg);
    abort();
  }
  free(src);
  tcc_prepared_free(p);
  reqb_free(b);
  return 0;
}
