/*
 * onednn_conv.c — the runtime of a CPU convolution step, copied into
 * every generated kernel source that has one (emit_c.c; this file is
 * embedded into the compiler as text by compiler/embed.py).
 *
 * A convolution EXTERN kernel (TCC_EXT_CONV_*, conv.c) becomes one call
 * of tcc_dnnl_conv_run with a static tcc_dnnl_conv that holds the step's
 * geometry. On its first call the step asks oneDNN for the primitive with
 * the layouts oneDNN prefers (format "any": blocked, e.g. nChw8c on
 * AVX2) and for the reorders from the operands' own layouts (any
 * strides) into those and from the result's into the TEMP the epilogue
 * reads; every later call only executes them. A forward step whose
 * input is stored channels last (NHWC: the compiler keeps activations
 * between convolutions so, conv.c) asks for a primitive on that layout
 * instead, and on its result's when that is channels last too, which
 * oneDNN's brgemm kernels read and write as they are, with no reorder
 * (format "any" is the fallback when oneDNN has none, and when the one
 * it offers there is a direct JIT kernel, as on AVX2). The blocked
 * copies and oneDNN's scratchpad live in a block the kernel keeps
 * between calls (user scratchpad mode; a call on another thread at the
 * same time allocates its own), so one step may run on several threads
 * at once. On a busy machine a forward or backward-data step shares its
 * images with the helper thread (below, "THE HELPER'S SHARE").
 *
 * Roles of the operands a and b and the result c, per kind:
 *   0 forward           a = src (x),      b = weights,   c = dst (y)
 *   1 backward data     a = diff_dst (gy), b = weights,  c = diff_src (gx)
 *   2 backward weights  a = src (x),      b = diff_dst,  c = diff_weights
 * Weights of a grouped convolution are [G, Cout/G, Cin/G, k..] to oneDNN:
 * the same bytes as [Cout, Cin/G, k..]. A transposed convolution (prm[23])
 * is oneDNN's deconvolution, whose weights are [Cout, Cin, k..] (grouped
 * [G, Cout/G, Cin/G, k..]) over PyTorch's [Cin, Cout/G, k..]: the same
 * bytes with the first two strides swapped.
 *
 * Returns 0, or 1 when oneDNN refused (the kernel's tcc_entry then
 * reports a failure; nothing is written).
 */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A primitive for the step over a minibatch of some images: the whole
 * call's, or one image's (the helper's share, below) */
typedef struct tcc_dnnl_prim {
  dnnl_primitive_t prim;
  dnnl_primitive_t reorder[3];       /* a, b in; c out; NULL: used as it is */
  int differs[3];                    /* the operand's layout is not the primitive's */
  dnnl_memory_desc_t user[3], mine[3];
  size_t scratch_bytes;
} tcc_dnnl_prim;

typedef struct tcc_dnnl_conv {
  int kind;                          /* 0, 1, 2 as above */
  int64_t prm[24];                   /* TCC_CONV_* (compiler/loop.h) */
  int64_t sa[5], sb[5], sc[5];       /* element strides of a, b and the result c */
  pthread_mutex_t lock;
  int state, one_state;              /* all, one: 0 not made yet, 1 ready, -1 refused */
  tcc_dnnl_prim all, one;            /* the whole minibatch; one image */
} tcc_dnnl_conv;

static dnnl_engine_t tcc_dnnl_engine;
static pthread_once_t tcc_dnnl_engine_once = PTHREAD_ONCE_INIT;

static void tcc_dnnl_engine_make(void) {
  if (dnnl_engine_create(&tcc_dnnl_engine, dnnl_cpu, 0) != dnnl_success) tcc_dnnl_engine = NULL;
}

/* dims of x ([N, Cin, in..]), w ([G, Cog, Cig, k..] or [Cout, Cig, k..])
 * and y ([N, Cout, o..]) for a minibatch of N images; returns the rank
 * of w. */
static int tcc_dnnl_dims(const int64_t *p, int64_t N, dnnl_dims_t x, dnnl_dims_t w, dnnl_dims_t y) {
  int S = (int)p[0], g = p[4] > 1, r = 0;
  x[0] = y[0] = N;
  x[1] = p[2];
  y[1] = p[3];
  if (g) w[r++] = p[4];
  w[r++] = p[3] / p[4];
  w[r++] = p[2] / p[4];
  for (int d = 0; d < S; d++) {
    x[2 + d] = p[5 + d];
    w[r++] = p[8 + d];
    y[2 + d] = p[11 + d];
  }
  return r;
}

/* The user layout of an operand: its strides st (PyTorch's dims), made
 * oneDNN's for weights (grouped; first two swapped when transposed). */
static int tcc_dnnl_user_md(dnnl_memory_desc_t *md, int nd, const dnnl_dims_t dims, const int64_t *st,
                            int weights, const int64_t *p) {
  dnnl_dims_t s;
  int64_t groups = p[4];
  for (int d = 0; d < nd; d++) s[d] = st[d];
  if (weights) {
    int64_t o = st[0], i = st[1];               /* PyTorch's dims 0 and 1 */
    if (p[23]) o = st[1], i = st[0];
    int g = groups > 1;
    /* a group moves Cout/G rows (Cin/G when transposed) of dim 0 */
    if (g) s[0] = st[0] * (p[23] ? p[2] / groups : dims[1]);
    s[g] = o;
    s[g + 1] = i;
    for (int d = 2; d + g < nd; d++) s[d + g] = st[d];
  }
  return dnnl_memory_desc_init_by_strides(md, nd, dims, dnnl_f32, s) != dnnl_success;
}

static void tcc_dnnl_contiguous(int nd, const dnnl_dims_t dims, int64_t *st) {
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = acc;
    acc *= dims[d];
  }
}

/* Dense channels-last strides (N, spatial.., C) of an activation of dims d. */
static void tcc_dnnl_nhwc(int nd, const dnnl_dims_t d, dnnl_dims_t st) {
  int64_t acc = d[1];
  st[1] = 1;
  for (int i = nd - 1; i >= 2; i--) {
    st[i] = acc;
    acc *= d[i];
  }
  st[0] = acc;
}

/* Are strides st (PyTorch's dims) of an activation of dims d dense
 * channels last (N, spatial.., C)? */
static int tcc_dnnl_channels_last(int nd, const dnnl_dims_t d, const int64_t *st) {
  if (nd < 4) return 0;
  int64_t want = 1;
  int order[5] = {1, 0, 0, 0, 0}, n = 1;
  for (int i = nd - 1; i >= 2; i--) order[n++] = i;
  order[n++] = 0;
  for (int i = 0; i < n; i++) {
    int k = order[i];
    if (d[k] > 1 && st[k] != want) return 0;
    want *= d[k];
  }
  return d[1] > 1;
}

/* Makes s, the step's primitive over N images (the operands' first
 * N), and its reorders. prefer_user: a forward step asks first for a
 * primitive on the channels-last layouts of its activations
 * (tcc_dnnl_make_step makes it again without when oneDNN has none);
 * commit: a reorder of the result even where its layout is the
 * primitive's (a copy: the helper's commit). */
static int tcc_dnnl_make(const tcc_dnnl_conv *c, tcc_dnnl_prim *s, int64_t N, int prefer_user, int commit) {
  const int64_t *p = c->prm;
  int S = (int)p[0], nx = 2 + S;
  dnnl_dims_t xd, wd, yd, strides, dil, pl, pr;
  int nw = tcc_dnnl_dims(p, N, xd, wd, yd);
  for (int d = 0; d < S; d++) {
    strides[d] = p[14 + d];
    pl[d] = p[17 + d];
    dil[d] = p[20 + d] - 1;
    /* the padding on the far side: of the input (convolution), of the
     * output (deconvolution; output_padding makes it smaller) */
    int64_t big = p[23] ? p[11 + d] : p[5 + d], small = p[23] ? p[5 + d] : p[11 + d];
    pr[d] = (small - 1) * p[14 + d] + (p[8 + d] - 1) * p[20 + d] + 1 - big - p[17 + d];
  }
  dnnl_alg_kind_t alg = p[23] ? dnnl_deconvolution_direct : dnnl_convolution_direct;
  pthread_once(&tcc_dnnl_engine_once, tcc_dnnl_engine_make);
  if (!tcc_dnnl_engine) return -1;
  dnnl_memory_desc_t xa, wa, ya;
  if (dnnl_memory_desc_init_by_tag(&xa, nx, xd, dnnl_f32, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&wa, nw, wd, dnnl_f32, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&ya, nx, yd, dnnl_f32, dnnl_format_tag_any))
    return -1;
  /* activations stored channels last (the forward's input, the
   * backward's incoming gradient): a primitive on that layout, as it is,
   * for x and y alike (the result reordered into the TEMP when that is
   * not channels last); else format "any". A channels-last result of an
   * input that is not comes out of the blocked layout by a reorder (a
   * primitive on NCHW in, NHWC out is one of oneDNN's slow ones) */
  int cl = c->kind == 0   ? tcc_dnnl_channels_last(nx, xd, c->sa)
           : c->kind == 1 ? tcc_dnnl_channels_last(nx, yd, c->sa)
                          : tcc_dnnl_channels_last(nx, xd, c->sa) && tcc_dnnl_channels_last(nx, yd, c->sb);
  if (prefer_user && !p[23] && cl) {
    dnnl_dims_t xs, ys;
    tcc_dnnl_nhwc(nx, xd, xs);
    tcc_dnnl_nhwc(nx, yd, ys);
    if (dnnl_memory_desc_init_by_strides(&xa, nx, xd, dnnl_f32, xs) ||
        dnnl_memory_desc_init_by_strides(&ya, nx, yd, dnnl_f32, ys))
      return -1;
  }
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  dnnl_convolution_desc_t fd, bd;
  int rc = -1;
  if (dnnl_primitive_attr_create(&attr) ||
      dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ||
      (p[23] ? dnnl_dilated_deconvolution_forward_desc_init
             : dnnl_dilated_convolution_forward_desc_init)(&fd, dnnl_forward_training, alg, &xa, &wa, NULL, &ya,
                                                           strides, dil, pl, pr) ||
      dnnl_primitive_desc_create(&fwd, &fd, attr, tcc_dnnl_engine, NULL))
    goto done;
  /* the roles' queries and dims, in the a, b, c order of c->kind */
  dnnl_query_t q[3];
  const int64_t *dims[3];
  int nds[3];
  if (c->kind == 0) {
    pd = fwd;
    fwd = NULL;
    q[0] = dnnl_query_src_md, q[1] = dnnl_query_weights_md, q[2] = dnnl_query_dst_md;
    dims[0] = xd, dims[1] = wd, dims[2] = yd;
  } else if (c->kind == 1) {
    if ((p[23] ? dnnl_dilated_deconvolution_backward_data_desc_init
               : dnnl_dilated_convolution_backward_data_desc_init)(&bd, alg, &xa, &wa, &ya, strides, dil, pl, pr) ||
        dnnl_primitive_desc_create(&pd, &bd, attr, tcc_dnnl_engine, fwd))
      goto done;
    q[0] = dnnl_query_diff_dst_md, q[1] = dnnl_query_weights_md, q[2] = dnnl_query_diff_src_md;
    dims[0] = yd, dims[1] = wd, dims[2] = xd;
  } else {
    if ((p[23] ? dnnl_dilated_deconvolution_backward_weights_desc_init
               : dnnl_dilated_convolution_backward_weights_desc_init)(&bd, alg, &xa, &wa, NULL, &ya, strides, dil,
                                                                      pl, pr) ||
        dnnl_primitive_desc_create(&pd, &bd, attr, tcc_dnnl_engine, fwd))
      goto done;
    q[0] = dnnl_query_src_md, q[1] = dnnl_query_diff_dst_md, q[2] = dnnl_query_diff_weights_md;
    dims[0] = xd, dims[1] = yd, dims[2] = wd;
  }
  /* channels-last activations as they are, but not into oneDNN's direct
   * JIT kernels ("jit:avx2"; AVX-512 gets brgemm ones, and 1x1
   * convolutions "jit_1x1"): on NHWC those ran ResNet-50's 3x3
   * convolutions 1.1-1.9x slower (forward) and 1.1-1.5x (backward) than
   * on nChw8c, more than the reorders in and out cost */
  const char *impl = NULL;
  if (prefer_user && !p[23] && cl &&
      (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) || !impl || strncmp(impl, "jit:", 4) == 0))
    goto done;
  for (int r = 0; r < 3; r++) nds[r] = dims[r] == wd ? nw : nx;
  /* the result's strides: the TEMP's (sc), which for weights is
   * contiguous in PyTorch's dims ([Cin, Cout/G, k..] for the weights of
   * a transposed convolution) */
  dnnl_dims_t cs, pt;
  if (dims[2] == wd) {
    pt[0] = p[23] ? p[2] : p[3];
    pt[1] = (p[23] ? p[3] : p[2]) / p[4];
    for (int d = 0; d < S; d++) pt[2 + d] = p[8 + d];
    tcc_dnnl_contiguous(2 + S, pt, cs);
  } else {
    for (int d = 0; d < nds[2]; d++) cs[d] = c->sc[d];
  }
  const int64_t *ust[3] = {c->sa, c->sb, cs};
  for (int r = 0; r < 3; r++) {
    if (tcc_dnnl_user_md(&s->user[r], nds[r], dims[r], ust[r], dims[r] == wd, p)) goto done;
    s->mine[r] = *dnnl_primitive_desc_query_md(pd, q[r], 0);
    s->differs[r] = !dnnl_memory_desc_equal(&s->user[r], &s->mine[r]);
    if (!s->differs[r] && !(commit && r == 2)) continue;
    dnnl_primitive_desc_t rpd;
    const dnnl_memory_desc_t *from = r < 2 ? &s->user[r] : &s->mine[r], *to = r < 2 ? &s->mine[r] : &s->user[r];
    if (dnnl_reorder_primitive_desc_create(&rpd, from, tcc_dnnl_engine, to, tcc_dnnl_engine, NULL)) goto done;
    dnnl_status_t st = dnnl_primitive_create(&s->reorder[r], rpd);
    dnnl_primitive_desc_destroy(rpd);
    if (st) goto done;
  }
  s->scratch_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
  if (dnnl_primitive_create(&s->prim, pd)) goto done;
  rc = 0;
done:
  if (fwd) dnnl_primitive_desc_destroy(fwd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return rc;
}

static void tcc_dnnl_release_prim(tcc_dnnl_prim *s) {
  for (int r = 0; r < 3; r++)
    if (s->reorder[r]) dnnl_primitive_destroy(s->reorder[r]);
  if (s->prim) dnnl_primitive_destroy(s->prim);
  s->prim = s->reorder[0] = s->reorder[1] = s->reorder[2] = NULL;
}

static void tcc_dnnl_release(tcc_dnnl_conv *c) {
  tcc_dnnl_release_prim(&c->all);
  tcc_dnnl_release_prim(&c->one);
}

/* s made once (*state: 0 not yet, 1 ready, -1 refused), on the
 * channels-last layouts first; returns whether it is ready */
static int tcc_dnnl_make_step(tcc_dnnl_conv *c, tcc_dnnl_prim *s, int *state, int64_t N, int commit) {
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) == 0) {
    pthread_mutex_lock(&c->lock);
    if (*state == 0) {
      int ok = tcc_dnnl_make(c, s, N, 1, commit) == 0;
      if (!ok) {
        tcc_dnnl_release_prim(s);
        ok = tcc_dnnl_make(c, s, N, 0, commit) == 0;
        if (!ok) tcc_dnnl_release_prim(s);
      }
      __atomic_store_n(state, ok ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->lock);
  }
  return __atomic_load_n(state, __ATOMIC_ACQUIRE) > 0;
}

static size_t tcc_dnnl_round(size_t n) { return (n + 63) & ~(size_t)63; }

/* One block for the blocked copies and scratchpads of this kernel's
 * steps, kept between calls and grown to the largest: a block of tens
 * of MB allocated per call came fresh from mmap (14-170 thousand page
 * faults a ResNet-50 training step). A step that finds it taken (a call
 * on another thread) allocates its own. */
static char *tcc_dnnl_kept;
static size_t tcc_dnnl_kept_bytes;
static int tcc_dnnl_kept_busy;
#ifdef TCC_SHARE
static char *tcc_dnnl_helper_kept;   /* the helper's (below) */
static size_t tcc_dnnl_helper_kept_bytes;
#endif

static char *tcc_dnnl_block(size_t n, int *kept) {
  char *p = NULL;
  *kept = 0;
  if (!__atomic_exchange_n(&tcc_dnnl_kept_busy, 1, __ATOMIC_ACQUIRE)) {
    if (tcc_dnnl_kept_bytes < n) {
      free(tcc_dnnl_kept);
      tcc_dnnl_kept = NULL;
      tcc_dnnl_kept_bytes = 0;
      if (posix_memalign((void **)&tcc_dnnl_kept, 64, n) == 0) tcc_dnnl_kept_bytes = n;
    }
    if (tcc_dnnl_kept) {
      *kept = 1;
      return tcc_dnnl_kept;
    }
    __atomic_store_n(&tcc_dnnl_kept_busy, 0, __ATOMIC_RELEASE);
  }
  return posix_memalign((void **)&p, 64, n) ? NULL : p;
}

static void tcc_dnnl_unblock(char *p, int kept) {
  if (kept) __atomic_store_n(&tcc_dnnl_kept_busy, 0, __ATOMIC_RELEASE);
  else free(p);
}

/* at unload (the kernel's destructor) */
static void tcc_dnnl_engine_release(void) {
  if (tcc_dnnl_engine) dnnl_engine_destroy(tcc_dnnl_engine);
  tcc_dnnl_engine = NULL;
  free(tcc_dnnl_kept);
  tcc_dnnl_kept = NULL;
  tcc_dnnl_kept_bytes = 0;
#ifdef TCC_SHARE
  free(tcc_dnnl_helper_kept);
  tcc_dnnl_helper_kept = NULL;
  tcc_dnnl_helper_kept_bytes = 0;
#endif
}

/* Runs s on the operands at user[0..2] (the step's a, b and c):
 * where copy[r] is set, an operand is (r < 2) reordered into copy[r]
 * first, or (r = 2) computed there and reordered into user[2] after
 * unless keep; without one it is in s's layout already (where that is
 * not its own: the weights reordered before). scratch: s's scratchpad. */
static int tcc_dnnl_exec(const tcc_dnnl_prim *s, int kind, void *const user[3], char *const copy[3], char *scratch,
                         int keep) {
  dnnl_memory_t um[3] = {NULL, NULL, NULL}, mm[3] = {NULL, NULL, NULL}, sm = NULL;
  dnnl_stream_t stream = NULL;
  int rc = 1;
  if (dnnl_stream_create(&stream, tcc_dnnl_engine, dnnl_stream_default_flags)) goto done;
  for (int r = 0; r < 3; r++) {
    if (!copy[r]) {
      if (dnnl_memory_create(&mm[r], &s->mine[r], tcc_dnnl_engine, user[r])) goto done;
      continue;
    }
    if (dnnl_memory_create(&um[r], &s->user[r], tcc_dnnl_engine, user[r]) ||
        dnnl_memory_create(&mm[r], &s->mine[r], tcc_dnnl_engine, copy[r]))
      goto done;
    if (r == 2) continue;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, um[r]}, {DNNL_ARG_TO, mm[r]}};
    if (dnnl_primitive_execute(s->reorder[r], stream, 2, args)) goto done;
  }
  {
    static const int roles[3][3] = {{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                                    {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
                                    {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS}};
    dnnl_exec_arg_t args[4];
    int n = 0;
    for (int r = 0; r < 3; r++) args[n++] = (dnnl_exec_arg_t){roles[kind][r], mm[r]};
    dnnl_memory_desc_t smd;
    dnnl_dims_t sdims = {(int64_t)s->scratch_bytes};
    if (s->scratch_bytes) {
      if (dnnl_memory_desc_init_by_tag(&smd, 1, sdims, dnnl_u8, dnnl_a) ||
          dnnl_memory_create(&sm, &smd, tcc_dnnl_engine, scratch))
        goto done;
      args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sm};
    }
    if (dnnl_primitive_execute(s->prim, stream, n, args)) goto done;
  }
  if (copy[2] && !keep) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mm[2]}, {DNNL_ARG_TO, um[2]}};
    if (dnnl_primitive_execute(s->reorder[2], stream, 2, args)) goto done;
  }
  rc = dnnl_stream_wait(stream) != dnnl_success;
done:
  for (int r = 0; r < 3; r++) {
    if (um[r]) dnnl_memory_destroy(um[r]);
    if (mm[r]) dnnl_memory_destroy(mm[r]);
  }
  if (sm) dnnl_memory_destroy(sm);
  if (stream) dnnl_stream_destroy(stream);
  return rc;
}

/* One reorder of s (r: 1 the weights in, from user; 2 the result out,
 * from) from `from` into `to` */
static int tcc_dnnl_reorder(const tcc_dnnl_prim *s, int r, const void *from, void *to) {
  dnnl_memory_t m[2] = {NULL, NULL};
  dnnl_stream_t stream = NULL;
  const dnnl_memory_desc_t *md[2] = {r < 2 ? &s->user[r] : &s->mine[r], r < 2 ? &s->mine[r] : &s->user[r]};
  int rc = 1;
  if (dnnl_stream_create(&stream, tcc_dnnl_engine, dnnl_stream_default_flags) ||
      dnnl_memory_create(&m[0], md[0], tcc_dnnl_engine, (void *)from) ||
      dnnl_memory_create(&m[1], md[1], tcc_dnnl_engine, to))
    goto done;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, m[0]}, {DNNL_ARG_TO, m[1]}};
  if (dnnl_primitive_execute(s->reorder[r], stream, 2, args)) goto done;
  rc = dnnl_stream_wait(stream) != dnnl_success;
done:
  if (m[0]) dnnl_memory_destroy(m[0]);
  if (m[1]) dnnl_memory_destroy(m[1]);
  if (stream) dnnl_stream_destroy(stream);
  return rc;
}

#ifdef TCC_SHARE
/* THE HELPER'S SHARE (a busy machine; cpu/share.c). A forward or
 * backward-data step on the calling thread alone, with the helper held,
 * runs each image of the minibatch as a chunk: a primitive made for one
 * image (c->one, its weights reordered once by the caller before the
 * job), the caller's chunks straight into c, the helper's into a result
 * copy of its own, reordered into c when it wins the chunk (a copy where
 * the layouts are the same). Each thread's image copies and scratchpad
 * come after the weights in the caller's kept block, in the helper's
 * own block (tcc_dnnl_helper_kept, kept between calls; only the helper
 * thread touches it). */
/* where one image's copies of a and c and the scratchpad lie in a
 * thread's block, and its size (off[3]) */
static void tcc_dnnl_image_offsets(const tcc_dnnl_prim *s, size_t off[4]) {
  off[0] = 0;
  off[1] = s->differs[0] ? tcc_dnnl_round(dnnl_memory_desc_get_size(&s->mine[0])) : 0;
  off[2] = off[1] + tcc_dnnl_round(dnnl_memory_desc_get_size(&s->mine[2]));
  off[3] = off[2] + tcc_dnnl_round(s->scratch_bytes);
}

/* chunk rq->c of a job: image c. P: the step, a, b in c->one's layout,
 * c, the caller's block for its image copies */
static int tcc_dnnl_conv_image(void *const *P) {
  const tcc_share_rq *rq = tcc_share_rq_now;
  const tcc_dnnl_conv *c = P[0];
  const tcc_dnnl_prim *s = &c->one;
  size_t off[4];
  tcc_dnnl_image_offsets(s, off);
  char *block = P[4];
  if (!rq->own) {
    if (tcc_dnnl_helper_kept_bytes < off[3]) {
      free(tcc_dnnl_helper_kept);
      tcc_dnnl_helper_kept_bytes = 0;
      if (posix_memalign((void **)&tcc_dnnl_helper_kept, 64, off[3])) tcc_dnnl_helper_kept = NULL;
      else tcc_dnnl_helper_kept_bytes = off[3];
    }
    if (!(block = tcc_dnnl_helper_kept)) return 1;
  }
  /* the image's a and c: an image is dim 0 of both */
  float *a = (float *)P[1] + rq->c * c->sa[0], *out = (float *)P[3] + rq->c * c->sc[0];
  if (rq->phase == 1) return rq->own ? 0 : tcc_dnnl_reorder(s, 2, block + off[1], out);
  int omp_get_max_threads(void);
  void omp_set_num_threads(int);
  if (omp_get_max_threads() != 1) omp_set_num_threads(1); /* the helper's own */
  void *user[3] = {a, P[2], out};
  char *copy[3] = {s->differs[0] ? block : NULL, NULL, rq->own && !s->differs[2] ? NULL : block + off[1]};
  return tcc_dnnl_exec(s, c->kind, user, copy, block + off[2], !rq->own);
}

/* Runs the step with the helper; -1: it cannot (run it whole) */
static int tcc_dnnl_conv_shared(tcc_dnnl_conv *c, const float *a, const float *b, float *out) {
  const int64_t *p = c->prm;
  double flops = 2.0 * (double)p[1] * (double)p[3] * (double)(p[2] / p[4]);
  for (int d = 0; d < p[0]; d++) flops *= (double)p[8 + d] * (double)p[11 + d];
  if (c->kind > 1 || p[23] || p[1] < 2 || p[1] > TCC_SHARE_MAX || flops < TCC_SHARE_MIN_FLOPS ||
      !tcc_dnnl_make_step(c, &c->one, &c->one_state, 1, 1))
    return -1;
  const tcc_dnnl_prim *s = &c->one;
  size_t off[4];
  tcc_dnnl_image_offsets(s, off);
  const size_t wbytes = s->differs[1] ? tcc_dnnl_round(dnnl_memory_desc_get_size(&s->mine[1])) : 0;
  int kept = 0;
  char *block = tcc_dnnl_block(wbytes + off[3], &kept);
  if (!block) return 1;
  int rc = s->differs[1] ? tcc_dnnl_reorder(s, 1, b, block) : 0;
  if (rc == 0) {
    void *const P[5] = {c, (void *)a, s->differs[1] ? (void *)block : (void *)b, out, block + wbytes};
    rc = tcc_share_run(tcc_dnnl_conv_image, P, 5, p[1], 0, 0);
    tcc_share_wait(); /* a chunk taken back may still be read by the helper */
  }
  tcc_dnnl_unblock(block, kept);
  return rc;
}
#endif

static int tcc_dnnl_conv_run(tcc_dnnl_conv *c, const float *a, const float *b, float *out) {
#ifdef TCC_SHARE
  if (tcc_share_mine && !tcc_share_rq_now) {
    const int rc = tcc_dnnl_conv_shared(c, a, b, out);
    if (rc >= 0) return rc;
  }
#endif
  if (!tcc_dnnl_make_step(c, &c->all, &c->state, c->prm[1], 0)) return 1;
  const tcc_dnnl_prim *s = &c->all;
  /* one allocation: the blocked copies, then the scratchpad */
  size_t off[4], total = 0;
  for (int r = 0; r < 3; r++) {
    off[r] = total;
    if (s->reorder[r]) total += tcc_dnnl_round(dnnl_memory_desc_get_size(&s->mine[r]));
  }
  off[3] = total;
  total += tcc_dnnl_round(s->scratch_bytes);
  char *block = NULL;
  int kept = 0;
  if (total && !(block = tcc_dnnl_block(total, &kept))) return 1;
  void *user[3] = {(void *)a, (void *)b, out};
  char *copy[3];
  for (int r = 0; r < 3; r++) copy[r] = s->reorder[r] ? block + off[r] : NULL;
  const int rc = tcc_dnnl_exec(s, c->kind, user, copy, block + off[3], 0);
  if (block) tcc_dnnl_unblock(block, kept);
  return rc;
}
