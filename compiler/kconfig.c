/*
 * kconfig.c — tcc_kernel_config, how autotuning asks for one kernel's code
 * (compiler.h): the config of a live kernel (what the targets' schedule
 * passes read), the default test, and its one-line text form
 * ("par=1 thr=0 chunk=0 unroll=4 blas=0 vec=0 order=0[ block=... ipt=...
 * wrow=... split=... persist=...]") with the range check of each field.
 */
#include "loop.h"

#include <stdio.h>
#include <string.h>

const tcc_kernel_config *tcc_kernel_config_of(const tcc_program *p, int kno) {
  if (!p->kcfg || kno < 0 || kno >= p->nkcfg) return NULL;
  const tcc_kernel_config *c = &p->kcfg[kno];
  return tcc_kernel_config_is_default(c) ? NULL : c;
}

int tcc_kernel_config_is_default(const tcc_kernel_config *c) {
  return !c->parallel && !c->threads && !c->chunk && !c->unroll && !c->blas_threads && !c->vec &&
         !c->order && !c->block && !c->ipt && !c->wrow && !c->split && !c->persist;
}

const char *tcc_kernel_config_format(const tcc_kernel_config *c, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "par=%d thr=%d chunk=%d unroll=%d blas=%d vec=%d order=%d", c->parallel,
                   c->threads, c->chunk, c->unroll, c->blas_threads, c->vec, c->order);
  if ((c->block || c->ipt || c->wrow || c->split || c->persist) && n >= 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, " block=%d ipt=%d wrow=%d split=%d persist=%d", c->block, c->ipt,
             c->wrow, c->split, c->persist);
  return buf;
}

/* 1 when v is 0 or a power of two in [lo, hi]. */
static int pow2_or_zero(int v, int lo, int hi) {
  return v == 0 || (v >= lo && v <= hi && (v & (v - 1)) == 0);
}

int tcc_kernel_config_parse(const char *s, tcc_kernel_config *out) {
  tcc_kernel_config c;
  memset(&c, 0, sizeof c);
  int n = 0;
  if (sscanf(s, "par=%d thr=%d chunk=%d unroll=%d blas=%d vec=%d order=%d%n", &c.parallel,
             &c.threads, &c.chunk, &c.unroll, &c.blas_threads, &c.vec, &c.order, &n) != 7)
    return TCC_E_INVALID_ARGUMENT;
  if (s[n]) { /* the CUDA fields, all five, and nothing after them */
    int m = 0;
    if (sscanf(s + n, " block=%d ipt=%d wrow=%d split=%d persist=%d%n", &c.block, &c.ipt, &c.wrow, &c.split,
               &c.persist, &m) != 5 ||
        s[n + m])
      return TCC_E_INVALID_ARGUMENT;
  }
  if (!pow2_or_zero(c.block, 32, 1024) || !pow2_or_zero(c.ipt, 1, 64) || c.wrow < -1 || c.wrow > 1 ||
      c.split < 0 || c.split > 4096 || c.persist < 0 || c.persist > 1)
    return TCC_E_INVALID_ARGUMENT;
  if (c.order != 0 && c.order != 1) return TCC_E_INVALID_ARGUMENT;
  if (c.vec != 0 && c.vec != 2 && c.vec != 4 && c.vec != 8 && c.vec != 16 && c.vec != 32)
    return TCC_E_INVALID_ARGUMENT;
  if (c.parallel < -1 || c.parallel > 1 || c.threads < 0 || c.threads > 1024 || c.chunk < 0 ||
      c.chunk > 1 << 20 || c.unroll < 0 || c.unroll > 64 || c.blas_threads < 0 ||
      c.blas_threads > 1024)
    return TCC_E_INVALID_ARGUMENT;
  *out = c;
  return 0;
}
