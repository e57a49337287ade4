/*
 * expr.c — loop-IR expressions (hash-consed) and the program container.
 *
 * Hash-consing: every constructor builds a candidate on the stack, looks
 * it up in the program's table and returns the stored copy, adding one
 * when absent. Hashes are structural (children contribute their hash,
 * not their address), so they, and anything ordered by them, are the
 * same on every run.
 *
 * Memory: expressions live in the program's arena; the tables' slot
 * arrays are malloc'ed (they are rehashed as they grow) and released by
 * tcc_program_free. A failed allocation makes constructors return NULL
 * and sets p->oom; NULL operands give NULL results, so a pass checks once.
 */
#include "loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ hashing */

static uint32_t mix(uint32_t h, uint64_t v) {
  h ^= (uint32_t)v + 0x9e3779b9u + (h << 6) + (h >> 2);
  h ^= (uint32_t)(v >> 32) + 0x9e3779b9u + (h << 6) + (h >> 2);
  return h;
}

static uint32_t ix_hash(const tcc_ix *e) {
  uint32_t h = mix(0x1234567u, (uint64_t)e->kind);
  h = mix(h, (uint64_t)(int64_t)e->var);
  h = mix(h, (uint64_t)e->c);
  h = mix(h, e->a ? e->a->hash : 0);
  h = mix(h, e->b ? e->b->hash : 0);
  h = mix(h, e->v ? e->v->hash : 0);
  return h;
}

static int ix_equal(const tcc_ix *x, const tcc_ix *y) {
  return x->kind == y->kind && x->var == y->var && x->c == y->c && x->a == y->a && x->b == y->b &&
         x->v == y->v;
}

static uint32_t vx_hash(const tcc_vx *e) {
  uint32_t h = mix(0x7654321u, (uint64_t)e->op);
  h = mix(h, (uint64_t)e->dtype);
  h = mix(h, e->a ? e->a->hash : 0);
  h = mix(h, e->b ? e->b->hash : 0);
  h = mix(h, e->c ? e->c->hash : 0);
  h = mix(h, (uint64_t)(int64_t)e->buf);
  h = mix(h, (uint64_t)(int64_t)e->nidx);
  for (int k = 0; k < e->nidx; k++) h = mix(h, e->idx[k]->hash);
  uint64_t fb;
  memcpy(&fb, &e->f, sizeof fb);
  h = mix(h, fb);
  h = mix(h, (uint64_t)e->i);
  return h;
}

static int vx_equal(const tcc_vx *x, const tcc_vx *y) {
  if (x->op != y->op || x->dtype != y->dtype || x->a != y->a || x->b != y->b || x->c != y->c ||
      x->buf != y->buf || x->nidx != y->nidx || x->i != y->i)
    return 0;
  if (memcmp(&x->f, &y->f, sizeof x->f) != 0) return 0;   /* NaN-safe, -0 != 0 */
  for (int k = 0; k < x->nidx; k++)
    if (x->idx[k] != y->idx[k]) return 0;
  return 1;
}

/* Finds the slot for (hash, candidate) in t; NULL slot means absent. */
static void **intern_slot(tcc_intern *t, uint32_t h, const void *cand, int is_vx) {
  size_t mask = t->cap - 1, i = h & mask;
  for (;;) {
    void **s = &t->slots[i];
    if (!*s) return s;
    if (is_vx ? (((tcc_vx *)*s)->hash == h && vx_equal(*s, cand))
              : (((tcc_ix *)*s)->hash == h && ix_equal(*s, cand)))
      return s;
    i = (i + 1) & mask;
  }
}

static int intern_grow(tcc_intern *t, int is_vx) {
  size_t cap = t->cap ? t->cap * 2 : 256;
  void **old = t->slots;
  size_t oldcap = t->cap;
  t->slots = calloc(cap, sizeof *t->slots);
  if (!t->slots) {
    t->slots = old;
    return -1;
  }
  t->cap = cap;
  for (size_t i = 0; i < oldcap; i++) {
    if (!old[i]) continue;
    uint32_t h = is_vx ? ((tcc_vx *)old[i])->hash : ((tcc_ix *)old[i])->hash;
    size_t j = h & (cap - 1);
    while (t->slots[j]) j = (j + 1) & (cap - 1);
    t->slots[j] = old[i];
  }
  free(old);
  return 0;
}

static const tcc_ix *ix_intern(tcc_program *p, tcc_ix *cand) {
  tcc_intern *t = &p->ix_intern;
  if ((t->count + 1) * 2 > t->cap && intern_grow(t, 0)) {
    p->oom = 1;
    return NULL;
  }
  cand->hash = ix_hash(cand);
  void **s = intern_slot(t, cand->hash, cand, 0);
  if (*s) return *s;
  tcc_ix *e = tcc_arena_alloc(p->arena, sizeof *e);
  if (!e) {
    p->oom = 1;
    return NULL;
  }
  *e = *cand;
  *s = e;
  t->count++;
  return e;
}

static const tcc_vx *vx_intern(tcc_program *p, tcc_vx *cand) {
  tcc_intern *t = &p->vx_intern;
  if ((t->count + 1) * 2 > t->cap && intern_grow(t, 1)) {
    p->oom = 1;
    return NULL;
  }
  cand->hash = vx_hash(cand);
  void **s = intern_slot(t, cand->hash, cand, 1);
  if (*s) return *s;
  tcc_vx *e = tcc_arena_alloc(p->arena, sizeof *e);
  if (!e) {
    p->oom = 1;
    return NULL;
  }
  *e = *cand;
  if (cand->nidx) {
    const tcc_ix **idx = tcc_arena_array(p->arena, (size_t)cand->nidx, sizeof *idx);
    if (!idx) {
      p->oom = 1;
      return NULL;
    }
    memcpy(idx, cand->idx, sizeof *idx * (size_t)cand->nidx);
    e->idx = idx;
  }
  int d = 0;
  if (e->a && e->a->depth > d) d = e->a->depth;
  if (e->b && e->b->depth > d) d = e->b->depth;
  if (e->c && e->c->depth > d) d = e->c->depth;
  e->depth = d + 1;
  long ops = 1L + (e->a ? e->a->ops : 0) + (e->b ? e->b->ops : 0) + (e->c ? e->c->ops : 0);
  e->ops = ops > (1L << 30) ? 1 << 30 : (int)ops;
  *s = e;
  t->count++;
  return e;
}

/* -------------------------------------------------------- index exprs */

const tcc_ix *tcc_ix_const(tcc_program *p, int64_t c) {
  tcc_ix e = {.kind = TCC_IX_CONST, .c = c};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_var(tcc_program *p, int var) {
  tcc_ix e = {.kind = TCC_IX_VAR, .var = var};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_add(tcc_program *p, const tcc_ix *a, const tcc_ix *b) {
  if (!a || !b) return NULL;
  if (a->kind == TCC_IX_CONST && b->kind == TCC_IX_CONST) {
    int64_t s;
    if (!__builtin_add_overflow(a->c, b->c, &s)) return tcc_ix_const(p, s);
  }
  if (a->kind == TCC_IX_CONST && a->c == 0) return b;
  if (b->kind == TCC_IX_CONST && b->c == 0) return a;
  /* constants last, otherwise a stable (hash) order */
  if (a->kind == TCC_IX_CONST || (b->kind != TCC_IX_CONST && a->hash > b->hash)) {
    const tcc_ix *t = a;
    a = b;
    b = t;
  }
  tcc_ix e = {.kind = TCC_IX_ADD, .a = a, .b = b};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_mul(tcc_program *p, const tcc_ix *a, int64_t c) {
  if (!a) return NULL;
  if (c == 0) return tcc_ix_const(p, 0);
  if (c == 1) return a;
  int64_t m;
  if (a->kind == TCC_IX_CONST && !__builtin_mul_overflow(a->c, c, &m)) return tcc_ix_const(p, m);
  if (a->kind == TCC_IX_MUL && !__builtin_mul_overflow(a->c, c, &m)) return tcc_ix_mul(p, a->a, m);
  tcc_ix e = {.kind = TCC_IX_MUL, .a = a, .c = c};
  return ix_intern(p, &e);
}

/* floor division of a constant (c > 0) */
static int64_t floordiv64(int64_t a, int64_t c) {
  int64_t q = a / c;
  return (a % c != 0 && a < 0) ? q - 1 : q;
}

static int split_by_extent(tcc_program *p, const tcc_ix *a, int64_t c, const tcc_ix **q,
                           const tcc_ix **r);

const tcc_ix *tcc_ix_div(tcc_program *p, const tcc_ix *a, int64_t c) {
  if (!a) return NULL;
  if (c == 1) return a;
  if (a->kind == TCC_IX_CONST) return tcc_ix_const(p, floordiv64(a->c, c));
  const tcc_ix *q, *r;
  if (split_by_extent(p, a, c, &q, &r)) return q;
  tcc_ix e = {.kind = TCC_IX_DIV, .a = a, .c = c};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_mod(tcc_program *p, const tcc_ix *a, int64_t c) {
  if (!a) return NULL;
  if (c == 1) return tcc_ix_const(p, 0);
  if (a->kind == TCC_IX_CONST) return tcc_ix_const(p, a->c - floordiv64(a->c, c) * c);
  const tcc_ix *q, *r;
  if (split_by_extent(p, a, c, &q, &r)) return r;
  tcc_ix e = {.kind = TCC_IX_MOD, .a = a, .c = c};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_min(tcc_program *p, const tcc_ix *a, int64_t c) {
  if (!a) return NULL;
  if (a->kind == TCC_IX_CONST) return tcc_ix_const(p, a->c < c ? a->c : c);
  tcc_ix e = {.kind = TCC_IX_MIN, .a = a, .c = c};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_max(tcc_program *p, const tcc_ix *a, int64_t c) {
  if (!a) return NULL;
  if (a->kind == TCC_IX_CONST) return tcc_ix_const(p, a->c > c ? a->c : c);
  tcc_ix e = {.kind = TCC_IX_MAX, .a = a, .c = c};
  return ix_intern(p, &e);
}

const tcc_ix *tcc_ix_clamp(tcc_program *p, const tcc_ix *a, int64_t n) {
  return tcc_ix_min(p, tcc_ix_max(p, a, 0), n - 1);
}

const tcc_ix *tcc_ix_value(tcc_program *p, const tcc_vx *v, int64_t n) {
  if (!v) return NULL;
  tcc_ix e = {.kind = TCC_IX_VALUE, .v = v, .c = n};
  return ix_intern(p, &e);
}

int tcc_ix_affine(const tcc_ix *e, int nvars, int64_t *coef, int64_t *c) {
  int64_t ca[TCC_MAX_DIMS], cb[TCC_MAX_DIMS], ka, kb;
  switch (e->kind) {
  case TCC_IX_CONST:
    for (int v = 0; v < nvars; v++) coef[v] = 0;
    *c = e->c;
    return 1;
  case TCC_IX_VAR:
    if (e->var < 0 || e->var >= nvars) return 0;
    for (int v = 0; v < nvars; v++) coef[v] = v == e->var;
    *c = 0;
    return 1;
  case TCC_IX_ADD:
    if (!tcc_ix_affine(e->a, nvars, ca, &ka) || !tcc_ix_affine(e->b, nvars, cb, &kb)) return 0;
    for (int v = 0; v < nvars; v++)
      if (__builtin_add_overflow(ca[v], cb[v], &coef[v])) return 0;
    return !__builtin_add_overflow(ka, kb, c);
  case TCC_IX_MUL:
    if (!tcc_ix_affine(e->a, nvars, ca, &ka)) return 0;
    for (int v = 0; v < nvars; v++)
      if (__builtin_mul_overflow(ca[v], e->c, &coef[v])) return 0;
    return !__builtin_mul_overflow(ka, e->c, c);
  default:
    return 0;
  }
}

const tcc_ix *tcc_ix_subst(tcc_program *p, const tcc_ix *e, int n, const tcc_ix *const *idx) {
  if (!e) return NULL;
  switch (e->kind) {
  case TCC_IX_CONST: return e;
  case TCC_IX_VAR: return e->var < n ? idx[e->var] : e;
  case TCC_IX_ADD:
    return tcc_ix_add(p, tcc_ix_subst(p, e->a, n, idx), tcc_ix_subst(p, e->b, n, idx));
  case TCC_IX_MUL: return tcc_ix_mul(p, tcc_ix_subst(p, e->a, n, idx), e->c);
  case TCC_IX_DIV: return tcc_ix_div(p, tcc_ix_subst(p, e->a, n, idx), e->c);
  case TCC_IX_MOD: return tcc_ix_mod(p, tcc_ix_subst(p, e->a, n, idx), e->c);
  case TCC_IX_MIN: return tcc_ix_min(p, tcc_ix_subst(p, e->a, n, idx), e->c);
  case TCC_IX_MAX: return tcc_ix_max(p, tcc_ix_subst(p, e->a, n, idx), e->c);
  case TCC_IX_VALUE: return tcc_ix_value(p, tcc_vx_subst(p, e->v, n, idx), e->c);
  default: {
    const tcc_ix *a = tcc_ix_subst(p, e->a, n, idx);
    if (!a) return NULL;
    tcc_ix c = *e;
    c.a = a;
    return ix_intern(p, &c);
  }
  }
}

/* -------------------------------------------------------- value exprs */

const tcc_vx *tcc_vx_load(tcc_program *p, int buf, int nidx, const tcc_ix *const *idx) {
  for (int k = 0; k < nidx; k++)
    if (!idx[k]) return NULL;
  tcc_vx e = {.op = TCC_PRIM_LOAD, .dtype = p->bufs[buf].layout.dtype, .buf = buf,
              .nidx = nidx, .idx = idx};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_const(tcc_program *p, tcc_dtype dt, double f, int64_t i) {
  tcc_vx e = {.op = TCC_PRIM_CONST, .dtype = dt, .buf = -1};
  if (tcc_dtype_is_float(dt)) e.f = dt == TCC__V1__DTYPE__FLOAT32 ? (double)(float)f : f;
  else e.i = i;
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_cast(tcc_program *p, const tcc_vx *a, tcc_dtype dt) {
  if (!a) return NULL;
  if (a->dtype == dt) return a;
  if (a->op == TCC_PRIM_CONST) {                  /* fold literals */
    double f = tcc_dtype_is_float(a->dtype) ? a->f : (double)a->i;
    if (dt == TCC__V1__DTYPE__FLOAT32 || dt == TCC__V1__DTYPE__FLOAT64) return tcc_vx_const(p, dt, f, 0);
    if (tcc_dtype_is_float(dt)) {   /* half literals: a conversion of a float one */
      if (a->dtype != TCC__V1__DTYPE__FLOAT32) a = tcc_vx_const(p, TCC__V1__DTYPE__FLOAT32, f, 0);
      tcc_vx e = {.op = TCC_PRIM_CAST, .dtype = dt, .a = a, .buf = -1};
      return vx_intern(p, &e);
    }
    if (dt == TCC__V1__DTYPE__BOOL)
      return tcc_vx_const(p, dt, 0, tcc_dtype_is_float(a->dtype) ? a->f != 0 : a->i != 0);
    if (!tcc_dtype_is_float(a->dtype) || (isfinite(f) && fabs(f) < 9.2e18)) {
      int64_t i = tcc_dtype_is_float(a->dtype) ? (int64_t)f : a->i;
      switch (dt) {   /* wrap to the width, as a C conversion does */
      case TCC__V1__DTYPE__INT8: i = (int8_t)i; break;
      case TCC__V1__DTYPE__INT16: i = (int16_t)i; break;
      case TCC__V1__DTYPE__INT32: i = (int32_t)i; break;
      case TCC__V1__DTYPE__UINT8: i = (uint8_t)i; break;
      default: break;
      }
      return tcc_vx_const(p, dt, (double)i, i);
    }
  }
  tcc_vx e = {.op = TCC_PRIM_CAST, .dtype = dt, .a = a, .buf = -1};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_unary(tcc_program *p, tcc_prim op, const tcc_vx *a) {
  if (!a) return NULL;
  tcc_vx e = {.op = op, .dtype = a->dtype, .a = a, .buf = -1};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_binary(tcc_program *p, tcc_prim op, const tcc_vx *a, const tcc_vx *b) {
  if (!a || !b) return NULL;
  tcc_vx e = {.op = op, .dtype = a->dtype, .a = a, .b = b, .buf = -1};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_pred(tcc_program *p, tcc_prim op, const tcc_vx *a, const tcc_vx *b) {
  if (!a || (!b && op != TCC_PRIM_ISNAN && op != TCC_PRIM_ISINF && op != TCC_PRIM_NOT)) return NULL;
  tcc_vx e = {.op = op, .dtype = TCC__V1__DTYPE__BOOL, .a = a, .b = b, .buf = -1};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_where(tcc_program *p, const tcc_vx *cond, const tcc_vx *a, const tcc_vx *b) {
  if (!cond || !a || !b) return NULL;
  if (cond->op == TCC_PRIM_CONST) return cond->i ? a : b;
  if (a == b) return a;
  tcc_vx e = {.op = TCC_PRIM_WHERE, .dtype = a->dtype, .a = cond, .b = a, .c = b, .buf = -1};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_index(tcc_program *p, const tcc_ix *ix) {
  if (!ix) return NULL;
  if (ix->kind == TCC_IX_CONST) return tcc_vx_const(p, TCC__V1__DTYPE__INT64, (double)ix->c, ix->c);
  const tcc_ix *one[1] = {ix};
  tcc_vx e = {.op = TCC_PRIM_INDEX, .dtype = TCC__V1__DTYPE__INT64, .buf = -1, .nidx = 1,
              .idx = one};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_reduce(tcc_program *p, tcc_reduce_kind kind, tcc_dtype dt,
                            const tcc_vx *body, int first_var, int nred, const int64_t *sizes) {
  if (!body || nred > TCC_MAX_DIMS) return NULL;
  const tcc_ix *ext[TCC_MAX_DIMS];
  for (int r = 0; r < nred; r++)
    if (!(ext[r] = tcc_ix_const(p, sizes[r]))) return NULL;
  tcc_vx e = {.op = TCC_PRIM_REDUCE, .dtype = dt, .a = body, .buf = first_var, .nidx = nred,
              .idx = ext, .i = kind};
  return vx_intern(p, &e);
}

const tcc_vx *tcc_vx_extern(tcc_program *p, tcc_extern_kind kind, tcc_dtype dt,
                            const tcc_vx *a, const tcc_vx *b, int nparams, const int64_t *params) {
  if (!a || !b || nparams > TCC_CONV_NPARAM) return NULL;
  const tcc_ix *d[TCC_CONV_NPARAM];
  for (int k = 0; k < nparams; k++)
    if (!(d[k] = tcc_ix_const(p, params[k]))) return NULL;
  tcc_vx e = {.op = TCC_PRIM_EXTERN, .dtype = dt, .a = a, .b = b, .buf = -1, .nidx = nparams,
              .idx = d, .i = kind};
  return vx_intern(p, &e);
}

int tcc_program_fresh_vars(tcc_program *p, int n) {
  if (p->next_var < TCC_FIRST_BOUND_VAR) p->next_var = TCC_FIRST_BOUND_VAR;
  int v = p->next_var;
  p->next_var += n;
  return v;
}

int tcc_ix_values(const tcc_ix *x, const tcc_ix **out, int cap) {
  if (!x || cap <= 0) return 0;
  if (x->kind == TCC_IX_VALUE) {
    out[0] = x;
    return 1;
  }
  int n = tcc_ix_values(x->a, out, cap);
  return n + tcc_ix_values(x->b, out + n, cap - n);
}

uint32_t tcc_ix_kernel_vars(const tcc_ix *e) {
  if (!e) return 0;
  switch (e->kind) {
  case TCC_IX_CONST: return 0;
  case TCC_IX_VAR: return e->var < TCC_MAX_DIMS ? 1u << e->var : 0;
  case TCC_IX_VALUE: return tcc_vx_kernel_vars(e->v);
  default: return tcc_ix_kernel_vars(e->a) | tcc_ix_kernel_vars(e->b);
  }
}

/* Kernel variables are never bound by a REDUCE, so a REDUCE's free
 * kernel variables are its body's. Expressions are DAGs of bounded depth
 * (TCC_MAX_EXPR_DEPTH) but may share heavily: memoize per call. */
static uint32_t kvars_rec(const tcc_vx *e, tcc_ptrmap *memo) {
  const void *hit = tcc_ptrmap_get(memo, e);
  if (hit) return (uint32_t)((uintptr_t)hit - 1);
  uint32_t m = 0;
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX)
    for (int k = 0; k < e->nidx; k++) m |= tcc_ix_kernel_vars(e->idx[k]);
  if (e->op != TCC_PRIM_EXTERN) {
    if (e->a) m |= kvars_rec(e->a, memo);
    if (e->b) m |= kvars_rec(e->b, memo);
    if (e->c) m |= kvars_rec(e->c, memo);
  }
  tcc_ptrmap_put(memo, e, (const void *)((uintptr_t)m + 1));
  return m;
}

uint32_t tcc_vx_kernel_vars(const tcc_vx *e) {
  if (!e) return 0;
  tcc_ptrmap memo;
  if (tcc_ptrmap_init(&memo, 64)) {
    tcc_ptrmap_free(&memo);
    return (1u << TCC_MAX_DIMS) - 1;   /* conservative: depends on all */
  }
  uint32_t m = kvars_rec(e, &memo);
  tcc_ptrmap_free(&memo);
  return m;
}

static int has_reduce_rec(const tcc_vx *e, tcc_ptrmap *seen) {
  if (e->op == TCC_PRIM_REDUCE) return 1;
  if (tcc_ptrmap_get(seen, e)) return 0;
  tcc_ptrmap_put(seen, e, e);
  return (e->a && has_reduce_rec(e->a, seen)) || (e->b && has_reduce_rec(e->b, seen)) ||
         (e->c && has_reduce_rec(e->c, seen));
}

int tcc_vx_has_reduce(const tcc_vx *e) {
  if (!e) return 0;
  tcc_ptrmap seen;
  if (tcc_ptrmap_init(&seen, 64)) {
    tcc_ptrmap_free(&seen);
    return 1;
  }
  int r = has_reduce_rec(e, &seen);
  tcc_ptrmap_free(&seen);
  return r;
}

static const char costly_yes, costly_no;

int tcc_prim_costly(tcc_prim op) {
  switch (op) {
  case TCC_PRIM_EXP: case TCC_PRIM_EXP2: case TCC_PRIM_EXPM1: case TCC_PRIM_LOG: case TCC_PRIM_LOG1P:
  case TCC_PRIM_LOG2: case TCC_PRIM_SQRT: case TCC_PRIM_RSQRT: case TCC_PRIM_RECIP: case TCC_PRIM_SIN:
  case TCC_PRIM_COS: case TCC_PRIM_TAN: case TCC_PRIM_TANH: case TCC_PRIM_SIGMOID: case TCC_PRIM_ERF:
  case TCC_PRIM_NDTR:
  case TCC_PRIM_DIV: case TCC_PRIM_POW: case TCC_PRIM_ATAN2: case TCC_PRIM_FMOD: case TCC_PRIM_REM:
  case TCC_PRIM_FLOORDIV: case TCC_PRIM_TRUNCDIV:
    return 1;
  default:
    return 0;
  }
}

int tcc_vx_costly(const tcc_vx *e, tcc_ptrmap *memo) {
  if (!e || e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_CONST) return 0;
  const void *known = tcc_ptrmap_get(memo, e);
  if (known) return known == &costly_yes;
  int costly = tcc_prim_costly(e->op) ||
               tcc_vx_costly(e->a, memo) || tcc_vx_costly(e->b, memo) || tcc_vx_costly(e->c, memo);
  tcc_ptrmap_put(memo, e, costly ? &costly_yes : &costly_no);   /* out of memory costs walks */
  return costly;
}

/* ------------------------------------------------ storage offsets */

typedef struct lin_term {
  const tcc_ix *atom;   /* VAR, DIV or MOD (or other non-affine kinds) */
  int64_t coef;
} lin_term;

#define MAX_LIN_TERMS 64

/* Adds coef * e to the term list (expanding sums, products, constants). */
static int lin_add(lin_term *t, int *n, int64_t *c, const tcc_ix *e, int64_t coef) {
  int64_t x;
  switch (e->kind) {
  case TCC_IX_CONST:
    if (__builtin_mul_overflow(e->c, coef, &x) || __builtin_add_overflow(*c, x, c)) return 0;
    return 1;
  case TCC_IX_ADD: return lin_add(t, n, c, e->a, coef) && lin_add(t, n, c, e->b, coef);
  case TCC_IX_MUL:
    if (__builtin_mul_overflow(e->c, coef, &x)) return 0;
    return lin_add(t, n, c, e->a, x);
  default:
    if (coef == 0) return 1;
    for (int i = 0; i < *n; i++)
      if (t[i].atom == e) return !__builtin_add_overflow(t[i].coef, coef, &t[i].coef);
    if (*n == MAX_LIN_TERMS) return 0;
    t[*n].atom = e;
    t[*n].coef = coef;
    (*n)++;
    return 1;
  }
}

/* With the kernel's extents published (p->ix_extent, split.c): when a is
 * a sum of non-negative multiples of kernel variables and a non-negative
 * constant, and the terms whose multiple c does not divide add up to less
 * than c at most, then a / c is the sum of the others divided by c (q)
 * and a % c is that remainder sum (r). Returns 1 with q and r, else 0. */
static int split_by_extent(tcc_program *p, const tcc_ix *a, int64_t c, const tcc_ix **q,
                           const tcc_ix **r) {
  if (!p->ix_extent || c <= 1) return 0;
  lin_term t[MAX_LIN_TERMS];
  int nt = 0;
  int64_t k0 = 0, rmax;
  if (!lin_add(t, &nt, &k0, a, 1) || k0 < 0) return 0;
  rmax = k0 % c;
  for (int i = 0; i < nt; i++) {
    const tcc_ix *v = t[i].atom;
    int64_t m;
    if (t[i].coef == 0) continue;
    if (t[i].coef < 0 || v->kind != TCC_IX_VAR || v->var < 0 || v->var >= p->ix_nextent) return 0;
    if (t[i].coef % c == 0) continue;
    if (__builtin_mul_overflow(t[i].coef, p->ix_extent[v->var] - 1, &m) ||
        __builtin_add_overflow(rmax, m, &rmax) || rmax >= c)
      return 0;
  }
  const tcc_ix *qs = tcc_ix_const(p, k0 / c), *rs = tcc_ix_const(p, k0 % c);
  for (int i = 0; i < nt && qs && rs; i++) {
    if (t[i].coef == 0) continue;
    if (t[i].coef % c == 0) qs = tcc_ix_add(p, qs, tcc_ix_mul(p, t[i].atom, t[i].coef / c));
    else rs = tcc_ix_add(p, rs, tcc_ix_mul(p, t[i].atom, t[i].coef));
  }
  if (!qs || !rs) return 0;
  *q = qs;
  *r = rs;
  return 1;
}

int tcc_linear_affine(int n, const tcc_ix *const *idx, const int64_t *strides, int nvars,
                      int64_t *coef, int64_t *c) {
  lin_term t[MAX_LIN_TERMS];
  int nt = 0;
  *c = 0;
  for (int d = 0; d < n; d++)
    if (!lin_add(t, &nt, c, idx[d], strides[d])) return 0;
  /* combine s*(e/q) + u*(e mod q) with s == q*u into u*e, repeatedly */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < nt && !changed; i++) {
      if (t[i].atom->kind != TCC_IX_DIV || t[i].coef == 0) continue;
      for (int j = 0; j < nt; j++) {
        const tcc_ix *m = t[j].atom;
        int64_t want;
        if (m->kind != TCC_IX_MOD || m->a != t[i].atom->a || m->c != t[i].atom->c ||
            __builtin_mul_overflow(t[j].coef, m->c, &want) || want != t[i].coef)
          continue;
        int64_t u = t[j].coef;
        const tcc_ix *e = m->a;
        t[i].coef = t[j].coef = 0;
        if (!lin_add(t, &nt, c, e, u)) return 0;
        changed = 1;
        break;
      }
    }
  }
  for (int v = 0; v < nvars; v++) coef[v] = 0;
  for (int i = 0; i < nt; i++) {
    if (t[i].coef == 0) continue;
    if (t[i].atom->kind != TCC_IX_VAR || t[i].atom->var < 0 || t[i].atom->var >= nvars) return 0;
    if (__builtin_add_overflow(coef[t[i].atom->var], t[i].coef, &coef[t[i].atom->var])) return 0;
  }
  return 1;
}

int tcc_gemm_operand_affine(const tcc_program *p, const tcc_vx *e, int64_t *coef, int64_t *c) {
  const tcc_meta *L = &p->bufs[e->buf].layout;
  const tcc_ix *idx[TCC_MAX_DIMS];
  int64_t st[TCC_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < e->nidx; d++) {
    if (tcc_ix_kernel_vars(e->idx[d]) & 1u) continue;
    idx[n] = e->idx[d];
    st[n++] = L->strides[d];
  }
  return tcc_linear_affine(n, idx, st, 3, coef, c);
}

const tcc_vx *tcc_vx_with_operands(tcc_program *p, const tcc_vx *e, const tcc_vx *a,
                                   const tcc_vx *b, const tcc_vx *c) {
  if ((e->a && !a) || (e->b && !b) || (e->c && !c)) return NULL;
  if (a == e->a && b == e->b && c == e->c) return e;
  tcc_vx n = *e;
  n.a = a;
  n.b = b;
  n.c = c;
  return vx_intern(p, &n);
}

/* ------------------------------------------------------- substitution */

int tcc_ptrmap_init(tcc_ptrmap *m, size_t cap) {
  m->cap = cap;
  m->count = 0;
  m->keys = calloc(cap, sizeof *m->keys);
  m->vals = calloc(cap, sizeof *m->vals);
  return m->keys && m->vals ? 0 : -1;
}

void tcc_ptrmap_free(tcc_ptrmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

static size_t ptr_hash(const void *k) {
  uintptr_t x = (uintptr_t)k;
  x ^= x >> 17;
  x *= (uintptr_t)0xed5ad4bbU;
  x ^= x >> 11;
  return (size_t)x;
}

const void *tcc_ptrmap_get(const tcc_ptrmap *m, const void *k) {
  size_t i = ptr_hash(k) & (m->cap - 1);
  while (m->keys[i]) {
    if (m->keys[i] == k) return m->vals[i];
    i = (i + 1) & (m->cap - 1);
  }
  return NULL;
}

int tcc_ptrmap_put(tcc_ptrmap *m, const void *k, const void *v) {
  if ((m->count + 1) * 2 > m->cap) {
    tcc_ptrmap n;
    if (tcc_ptrmap_init(&n, m->cap * 2)) {
      tcc_ptrmap_free(&n);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) tcc_ptrmap_put(&n, m->keys[i], m->vals[i]);
    tcc_ptrmap_free(m);
    *m = n;
  }
  size_t i = ptr_hash(k) & (m->cap - 1);
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->count++;
  m->keys[i] = k;
  m->vals[i] = v;
  return 0;
}

static const tcc_vx *subst_rec(tcc_program *p, tcc_ptrmap *memo, const tcc_vx *e, int n,
                               const tcc_ix *const *idx) {
  if (!e) return NULL;
  const tcc_vx *hit = tcc_ptrmap_get(memo, e);
  if (hit) return hit;
  tcc_vx c = *e;
  const tcc_ix *tmp[TCC_MAX_DIMS];
  if (e->op == TCC_PRIM_LOAD || e->op == TCC_PRIM_INDEX) {
    for (int k = 0; k < e->nidx; k++) {
      tmp[k] = tcc_ix_subst(p, e->idx[k], n, idx);
      if (!tmp[k]) return NULL;
    }
    c.idx = tmp;
  }
  if (e->op != TCC_PRIM_EXTERN) {  /* extern operands live in their own index space */
    if (e->a && !(c.a = subst_rec(p, memo, e->a, n, idx))) return NULL;
    if (e->b && !(c.b = subst_rec(p, memo, e->b, n, idx))) return NULL;
    if (e->c && !(c.c = subst_rec(p, memo, e->c, n, idx))) return NULL;
  }
  if (e->op == TCC_PRIM_INDEX && c.idx[0]->kind == TCC_IX_CONST)
    return tcc_vx_index(p, c.idx[0]);
  const tcc_vx *r = vx_intern(p, &c);
  if (r && tcc_ptrmap_put(memo, e, r)) {
    p->oom = 1;
    return NULL;
  }
  return r;
}

const tcc_vx *tcc_vx_subst(tcc_program *p, const tcc_vx *e, int n, const tcc_ix *const *idx) {
  int identity = 1;   /* i<k> -> i<k> for all k: nothing to do (the common case) */
  for (int k = 0; k < n && identity; k++)
    identity = idx[k] && idx[k]->kind == TCC_IX_VAR && idx[k]->var == k;
  if (identity) return e;
  tcc_ptrmap memo;
  if (tcc_ptrmap_init(&memo, 64)) {
    tcc_ptrmap_free(&memo);
    p->oom = 1;
    return NULL;
  }
  const tcc_vx *r = subst_rec(p, &memo, e, n, idx);
  tcc_ptrmap_free(&memo);
  return r;
}

/* ------------------------------------------------------------ program */

void tcc_program_init(tcc_program *p, tcc_arena *a, const tcc_graph *g) {
  memset(p, 0, sizeof *p);
  p->arena = a;
  p->graph = g;
  p->cur_node = -1;
}

void tcc_program_free(tcc_program *p) {
  free(p->ix_intern.slots);
  free(p->vx_intern.slots);
  p->ix_intern.slots = p->vx_intern.slots = NULL;
  p->ix_intern.cap = p->vx_intern.cap = 0;
}

/* Grows an arena array of n items of size sz to hold one more. */
static void *grow(tcc_arena *a, void *arr, int n, int *cap, size_t sz) {
  if (n < *cap) return arr;
  int nc = *cap ? *cap * 2 : 16;
  void *na = tcc_arena_array(a, (size_t)nc, sz);
  if (!na) return NULL;
  if (n) memcpy(na, arr, (size_t)n * sz);
  *cap = nc;
  return na;
}

int tcc_program_add_buffer(tcc_program *p, const tcc_buffer *b) {
  tcc_buffer *nb = grow(p->arena, p->bufs, p->nbufs, &p->capbufs, sizeof *nb);
  if (!nb) {
    p->oom = 1;
    return -1;
  }
  p->bufs = nb;
  p->bufs[p->nbufs] = *b;
  return p->nbufs++;
}

int tcc_program_add_kernel(tcc_program *p, int rank, const int64_t *sizes) {
  tcc_kernel *nk = grow(p->arena, p->kernels, p->nkernels, &p->capkernels, sizeof *nk);
  if (!nk) {
    p->oom = 1;
    return -1;
  }
  p->kernels = nk;
  tcc_kernel *k = &p->kernels[p->nkernels];
  memset(k, 0, sizeof *k);
  k->kind = TCC_OPK_POINTWISE;
  k->rank = rank;
  if (rank) memcpy(k->sizes, sizes, sizeof *sizes * (size_t)rank);
  if (p->cur_node >= 0) {
    int *nodes = grow(p->arena, NULL, 0, &k->capnodes, sizeof *nodes);
    if (!nodes) {
      p->oom = 1;
      return -1;
    }
    k->nodes = nodes;
    k->nodes[k->nnodes++] = p->cur_node;
  }
  return p->nkernels++;
}

int tcc_kernel_add_nodes(tcc_program *p, int to, int from) {
  tcc_kernel *T = &p->kernels[to];
  const tcc_kernel *F = &p->kernels[from];
  for (int i = 0; i < F->nnodes; i++) {
    int node = F->nodes[i], have = 0;
    for (int j = 0; j < T->nnodes && !have; j++) have = T->nodes[j] == node;
    if (have) continue;
    int *nodes = grow(p->arena, T->nodes, T->nnodes, &T->capnodes, sizeof *nodes);
    if (!nodes) {
      p->oom = 1;
      return -1;
    }
    T->nodes = nodes;
    T->nodes[T->nnodes++] = node;
  }
  return 0;
}

int tcc_kernel_add_store(tcc_program *p, int kid, int buf, const tcc_ix *const *idx,
                         const tcc_vx *value) {
  tcc_kernel *k = &p->kernels[kid];
  int rank = p->bufs[buf].layout.rank;
  if (!value) return -1;
  tcc_store *ns = grow(p->arena, k->stores, k->nstores, &k->capstores, sizeof *ns);
  const tcc_ix **ci = tcc_arena_array(p->arena, (size_t)rank + 1, sizeof *ci);
  if (!ns || !ci) {
    p->oom = 1;
    return -1;
  }
  for (int d = 0; d < rank; d++) {
    if (!idx[d]) return -1;
    ci[d] = idx[d];
  }
  k->stores = ns;
  k->stores[k->nstores++] = (tcc_store){.buf = buf, .idx = ci, .value = value};
  return 0;
}

int tcc_program_live_kernels(const tcc_program *p) {
  int n = 0;
  for (int k = 0; k < p->nkernels; k++) n += !p->kernels[k].dead;
  return n;
}
