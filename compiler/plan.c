/*
 * plan.c — where temporaries live.
 *
 * Requires: a fused program (dead buffers marked).
 * Produces: a workspace byte offset for each live TEMP buffer (64-byte
 * aligned, laid out one after another in buffer order) and the total in
 * p->workspace_bytes, which the manifest tells the caller to allocate.
 * Reusing the space of temporaries whose last reader has run is the
 * obvious next step; pointwise graphs fuse away every temporary, so
 * there is nothing to reuse yet.
 */
#include "loop.h"

int tcc_plan_buffers(tcc_program *p, tcc_error *err) {
  int64_t off = 0;
  for (int b = 0; b < p->nbufs; b++) {
    tcc_buffer *B = &p->bufs[b];
    if (B->kind != TCC_BUF_TEMP || B->dead) continue;
    int64_t bytes, end;
    if (__builtin_mul_overflow(B->layout.span, (int64_t)tcc_dtype_size(B->layout.dtype), &bytes) ||
        __builtin_add_overflow(bytes, 63, &bytes) ||
        __builtin_add_overflow(off, bytes & ~(int64_t)63, &end))
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "workspace size overflows int64");
    B->ws_offset = off;
    off = end;
  }
  p->workspace_bytes = off;
  p->planned = 1;
  return 0;
}
