/*
 * conv.c — convolution (forward and backward) as extern GEMM steps, and
 * training-mode dropout with a counter-based RNG (the `conv*` and
 * `native_dropout` rows of ops.h).
 *
 * Requires: a canonical graph (lower.c's driver calls these through the
 * op table) and verified tensor arguments.
 *
 * Convolution (N-d, S = 1..3 spatial dims; groups G; Cig = Cin/G input and
 * Cog = Cout/G output channels per group; KK = prod(kernel), O =
 * prod(output spatial), J = N*O, Kd = Cig*KK):
 *
 *   xp[n, c, q..]           = x[n, c, q - p ..] (0 outside: the zero
 *                              padding made real)     a pointwise kernel
 *                                                     into a TEMP (only
 *                                                     with padding)
 *   col[g, ci, k.., n, o..] = xp[n, g*Cig+ci, o*s + k*d ..]
 *                                                     im2col, plain copies
 *                                                     into a TEMP
 *   C[g, m, j]   = sum_kk W[g*Cog+m, kk] col[g, kk, j]   GEMM (extern),
 *                                                     batch G, M=Cog, N=J
 *   y[n, c, o..] = C[c/Cog, c%Cog, n*O+o] (+ bias[c])  epilogue: pointwise,
 *                                                     fuse.c merges the
 *                                                     batch norm / relu /
 *                                                     residual add after it
 *
 * Backward (convolution_backward, per output_mask):
 *   grad_weight = gy^T . col^T per group (GEMM over J = N*O; gy packed once
 *                 into [G, Cog, N, o..]),
 *   grad_input  = for stride 1, a convolution of gy with W's taps
 *                 mirrored: gcol[g, co, k.., n, h..] = gy[n, g*Cog+co,
 *                 h + p - k*d] (0 outside; packed from gy's zero-padded
 *                 copy when p <= (K-1)d, so plain copies, the inner dim
 *                 contiguous), then GEMM gx[g, ci, (n, h..)] =
 *                 sum_(co, k..) W[g*Cog+co, ci, k..] gcol, then the
 *                 epilogue. Other strides: col2im(W^T . gy): dcol[g, kk,
 *                 j] by GEMM, then a gather kernel: gx[n, c, h..] = sum
 *                 over the kernel taps k of dcol[.., (h + p - k*d)/s]
 *                 where that divides and is in range (no scatter, no
 *                 atomics; its index arithmetic does not vectorize, which
 *                 made it most of a ResNet step),
 *   grad_bias   = a reduction of gy over n and o.
 *
 * CPU float32 convolutions with static shapes take another road when
 * tccd is built with oneDNN (and TCC_NO_ONEDNN is unset): each of
 * forward, grad_input and grad_weight is one EXTERN step
 * (TCC_EXT_CONV_*) that reads x, W and gy where they are, through their
 * layouts (a value that is not a buffer yet is packed first), and writes
 * a contiguous TEMP; the bias and the epilogue stay tccd's (fused as
 * above), grad_bias its reduction. Transposed convolutions, which the
 * GEMM road refuses, are oneDNN's deconvolutions there. The step's code
 * is oneDNN's blocked JIT convolution with reorders in and out
 * (runtime/onednn_conv.c):
 * about 2.5-5x faster than the GEMM road on ResNet's small convolutions.
 *
 * Pointwise convolutions on the CPU (1x1 taps, stride 1, no padding, one
 * group; any dtype the GEMM takes) take neither road: per image y[n] =
 * W[Cout, Cin] . x[n][Cin, O], one GEMM step batched over the images,
 * reading x where it is and writing C in y's own order, so no im2col,
 * no reorders and an epilogue that reads C straight (MobileNetV3's step
 * spent half its time in the oneDNN road's reorders; conv_pointwise_gemm).
 *
 * Layouts on the oneDNN road (tcc_conv_plan_layouts): a 2-D convolution's
 * input that the graph computes and keeps to itself is realized channels
 * last (NHWC), as Inductor lays out convolution networks; a forward step
 * whose input is channels last writes its result so too, and oneDNN's
 * brgemm kernels read and write both as they are, unless the result only
 * ends in an NCHW graph output; the first step of a chain writes its
 * result channels last when it reaches the next one. A pointwise
 * convolution on such an input is one transposed GEMM over every
 * image's pixels, x^T . W^T into [N*O, Cout]. Graph inputs and outputs keep their layouts (the
 * first convolution of a network reorders its input as before); the
 * client declares the activations a training forward saves for its
 * backward channels last, and a backward step on a channels-last input
 * takes and gives its gradients so (design.md, "Convolution layouts").
 *
 * The temporaries (col, packed gy, GEMM results) are ordinary TEMP
 * buffers: place.c places them in the workspace (Manifest.workspace_bytes);
 * kernels allocate nothing. Every operand is read through its layout, so
 * channels_last and other strided inputs need no copy first. float32 and
 * float64 only (sgemm/dgemm); other dtypes and transposed convolution
 * are TCC_E_UNIMPLEMENTED naming the node. On CUDA the same program runs:
 * the packing and epilogue kernels are CUDA kernels and each GEMM is a
 * cuBLAS step the client makes (cuda/emit.c).
 *
 * Dropout (native_dropout with train=True): the client passes a `seed`
 * (an int64 tensor of one element, fresh per call; see tcc.proto). The
 * kernel draws u = hash(seed, flat element index) with a murmur3-style
 * 32-bit finalizer applied twice (only integer add/mul/xor/and/floordiv,
 * so every backend computes the same bits), keeps an element when its top
 * 24 bits are >= round(p * 2^24), and writes mask (bool) and
 * x * mask * (1 / (1 - p)). Same seed: same mask; the element index is
 * the row-major index in the output's shape, whatever the layouts.
 */
#include "loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BAD(...) tcc_error_set(err, TCC_E_INVALID_ARGUMENT, __VA_ARGS__)
#define OOM() tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering")
#define ARG(name) tcc_node_arg(n, name)
#define BIN(op, x, y) tcc_vx_binary(p, TCC_PRIM_##op, x, y)
#define I64 TCC__V1__DTYPE__INT64

/* ---------------------------------------------------------- geometry */

#define CONV_MAX_SPATIAL 3

/* The shape of one convolution (forward or backward node). */
typedef struct conv_geom {
  int S;                              /* spatial dims */
  int64_t N, Cin, Cout, G, Cig, Cog;
  int64_t in[CONV_MAX_SPATIAL], k[CONV_MAX_SPATIAL], o[CONV_MAX_SPATIAL];
  int64_t s[CONV_MAX_SPATIAL], p[CONV_MAX_SPATIAL], d[CONV_MAX_SPATIAL];
  int transposed;
  int64_t KK, O, J, Kd;               /* prod(k), prod(o), N*O, Cig*KK */
} conv_geom;

static const tcc_meta *tmeta(const tcc_graph *g, const tcc_arg *a) {
  return a && a->kind == TCC_ARG_TENSOR ? &g->values[a->v].meta : NULL;
}

/* One of stride/padding/dilation: 1 or S values. Returns 0 or -1. */
static int spatial_list(const tcc_arg *a, int S, int64_t *out, int64_t min) {
  if (!a || a->kind != TCC_ARG_INTS || (a->n != 1 && a->n != S)) return -1;
  for (int d = 0; d < S; d++) {
    out[d] = a->ints[a->n == 1 ? 0 : d];
    if (out[d] < min) return -1;
  }
  return 0;
}

/* Fills cg from a convolution or convolution_backward node (x: the
 * `input` argument, w: `weight`). Returns 0 or TCC_E_INVALID_ARGUMENT
 * (message without the node prefix). */
static int conv_geom_of(const tcc_graph *g, const tcc_node *n, conv_geom *cg, tcc_error *err) {
  const tcc_meta *x = tmeta(g, ARG("input")), *w = tmeta(g, ARG("weight"));
  memset(cg, 0, sizeof *cg);
  if (!x || !w) return BAD("convolution needs input and weight tensors");
  if (x->rank < 3 || x->rank > 2 + CONV_MAX_SPATIAL)
    return BAD("convolution input must be 3-D, 4-D or 5-D (batched), got %d-D", x->rank);
  if (w->rank != x->rank)
    return BAD("weight of rank %d for an input of rank %d", w->rank, x->rank);
  int S = cg->S = x->rank - 2;
  if (spatial_list(ARG("stride"), S, cg->s, 1))
    return BAD("stride must hold 1 or %d positive ints", S);
  if (spatial_list(ARG("padding"), S, cg->p, 0))
    return BAD("padding must hold 1 or %d non-negative ints", S);
  if (spatial_list(ARG("dilation"), S, cg->d, 1))
    return BAD("dilation must hold 1 or %d positive ints", S);
  cg->transposed = ARG("transposed")->i != 0;
  cg->G = ARG("groups")->i;
  if (cg->G < 1) return BAD("groups must be positive, got %lld", (long long)cg->G);
  cg->N = x->sizes[0];
  cg->Cin = x->sizes[1];
  if (cg->transposed) {
    int64_t op[CONV_MAX_SPATIAL];
    if (spatial_list(ARG("output_padding"), S, op, 0))
      return BAD("output_padding must hold 1 or %d non-negative ints", S);
    if (w->sizes[0] != cg->Cin) return BAD("transposed convolution: weight.size(0) must be the input channels");
    cg->Cout = w->sizes[1] * cg->G;
    for (int d = 0; d < S; d++) {
      cg->in[d] = x->sizes[2 + d];
      cg->k[d] = w->sizes[2 + d];
      cg->o[d] = (cg->in[d] - 1) * cg->s[d] - 2 * cg->p[d] + cg->d[d] * (cg->k[d] - 1) + op[d] + 1;
      if (cg->o[d] < 0) return BAD("transposed convolution: negative output size");
    }
  } else {
    cg->Cout = w->sizes[0];
    if (w->sizes[1] * cg->G != cg->Cin)
      return BAD("expected input with %lld channels (weight [%lld, %lld, ...] x groups %lld), got %lld",
                 (long long)(w->sizes[1] * cg->G), (long long)w->sizes[0], (long long)w->sizes[1],
                 (long long)cg->G, (long long)cg->Cin);
    if (cg->Cout % cg->G) return BAD("output channels %lld not divisible by groups %lld",
                                     (long long)cg->Cout, (long long)cg->G);
    for (int d = 0; d < S; d++) {
      cg->in[d] = x->sizes[2 + d];
      cg->k[d] = w->sizes[2 + d];
      int64_t span = cg->d[d] * (cg->k[d] - 1) + 1;
      if (cg->in[d] + 2 * cg->p[d] < span)
        return BAD("kernel size %lld (dilated %lld) is larger than the padded input %lld in spatial dim %d",
                   (long long)cg->k[d], (long long)span, (long long)(cg->in[d] + 2 * cg->p[d]), d);
      cg->o[d] = (cg->in[d] + 2 * cg->p[d] - span) / cg->s[d] + 1;
    }
  }
  cg->Cig = cg->Cin / cg->G;
  cg->Cog = cg->Cout / cg->G;
  cg->KK = cg->O = 1;
  for (int d = 0; d < S; d++) {
    cg->KK *= cg->k[d];
    cg->O *= cg->o[d];
  }
  cg->J = cg->N * cg->O;
  cg->Kd = cg->Cig * cg->KK;
  return 0;
}

/* Contiguous output meta of `rank` sizes in x's dtype. */
static int finish_meta(const tcc_graph *g, tcc_meta *out, tcc_dtype dt, int rank,
                       const int64_t *sizes, tcc_error *err) {
  int64_t numel = 1;
  out->dtype = dt;
  out->device = g->target.device;
  out->rank = rank;
  for (int d = 0; d < rank; d++) {
    out->sizes[d] = sizes[d];
    if (sizes[d] < 0 || __builtin_mul_overflow(numel, sizes[d], &numel) || numel > (INT64_MAX >> 4))
      return BAD("convolution result is too large");
  }
  tcc_meta_contiguous(out);
  return 0;
}

int tcc_infer_conv(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  conv_geom cg;
  int rc = conv_geom_of(g, n, &cg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("input")), *w = tmeta(g, ARG("weight"));
  if (x->dtype != w->dtype)
    return BAD("input (%s) and weight (%s) must have the same dtype", tcc_dtype_name(x->dtype),
               tcc_dtype_name(w->dtype));
  const tcc_meta *b = tmeta(g, ARG("bias"));
  if (b && (b->rank != 1 || b->sizes[0] != cg.Cout || b->dtype != x->dtype))
    return BAD("bias must be a 1-D %s tensor of %lld elements", tcc_dtype_name(x->dtype),
               (long long)cg.Cout);
  int64_t sizes[TCC_MAX_DIMS] = {cg.N, cg.Cout};
  for (int d = 0; d < cg.S; d++) sizes[2 + d] = cg.o[d];
  return finish_meta(g, &out[0], x->dtype, x->rank, sizes, err);
}

int tcc_infer_conv_backward(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  conv_geom cg;
  int rc = conv_geom_of(g, n, &cg, err);
  if (rc) return rc;
  const tcc_meta *x = tmeta(g, ARG("input")), *w = tmeta(g, ARG("weight")),
                 *gy = tmeta(g, ARG("grad_output"));
  if (x->dtype != w->dtype || gy->dtype != x->dtype)
    return BAD("grad_output, input and weight must have one dtype");
  if (gy->rank != x->rank || gy->sizes[0] != cg.N || gy->sizes[1] != cg.Cout)
    return BAD("grad_output has the wrong shape");
  for (int d = 0; d < cg.S; d++)
    if (gy->sizes[2 + d] != cg.o[d]) return BAD("grad_output has the wrong shape");
  if ((rc = finish_meta(g, &out[0], x->dtype, x->rank, x->sizes, err))) return rc;
  if ((rc = finish_meta(g, &out[1], x->dtype, w->rank, w->sizes, err))) return rc;
  int64_t c = cg.Cout;
  return finish_meta(g, &out[2], x->dtype, 1, &c, err);
}

/* ---------------------------------------------------------- lowering */

/* Splits flat index `lin` over sizes[0..n) (row-major) into out[0..n). */
static void unflatten(tcc_program *p, const tcc_ix *lin, const int64_t *sizes, int n,
                      const tcc_ix **out) {
  int outer = 0;   /* the outermost dim of size > 1 takes the rest whole */
  while (outer < n - 1 && sizes[outer] == 1) outer++;
  for (int d = n - 1; d >= 0; d--) {
    if (sizes[d] == 1) {
      out[d] = tcc_ix_const(p, 0);
      continue;
    }
    out[d] = d == outer ? lin : tcc_ix_mod(p, lin, sizes[d]);
    lin = tcc_ix_div(p, lin, sizes[d]);
  }
}

/* Flat row-major index of idx[0..n) over sizes. */
static const tcc_ix *flatten(tcc_program *p, const tcc_ix *const *idx, const int64_t *sizes, int n) {
  const tcc_ix *lin = tcc_ix_const(p, 0);
  for (int d = 0; d < n; d++) lin = tcc_ix_add(p, tcc_ix_mul(p, lin, sizes[d]), idx[d]);
  return lin;
}

/* Value v's body read at idx, cast to dt. */
static const tcc_vx *read(tcc_lower_ctx *lc, int v, const tcc_ix *const *idx, tcc_dtype dt) {
  const tcc_lval *lv = &lc->vals[v];
  return tcc_vx_cast(lc->prog, tcc_vx_subst(lc->prog, lv->body, lv->rank, idx), dt);
}

static const tcc_vx *cst(tcc_program *p, tcc_dtype dt, double f) {
  return tcc_vx_cast(p, tcc_vx_const(p, TCC__V1__DTYPE__FLOAT64, f, 0), dt);
}

static const tcc_vx *icst(tcc_program *p, int64_t i) {
  return tcc_vx_const(p, I64, (double)i, i);
}

/* Channel g*C + c of a grouped dim (just c when there is one group). */
static const tcc_ix *grouped(tcc_program *p, const conv_geom *cg, const tcc_ix *g, const tcc_ix *c,
                             int64_t C) {
  return cg->G == 1 ? c : tcc_ix_add(p, tcc_ix_mul(p, g, C), c);
}

/* A zero-bordered copy of value v [N, C, src..]: a TEMP [N, C, size..]
 * holding v[n, c, q - lo] where that is inside src, 0 elsewhere
 * (pointwise, its border masked), or -1. Convolutions gather their
 * taps from it with affine in-range reads (im2col, grad_input). */
static int zero_padded(tcc_lower_ctx *lc, int S, int64_t N, int64_t C, int v, const int64_t *src,
                       const int64_t *lo, const int64_t *size, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  int64_t sizes[TCC_MAX_DIMS];
  const tcc_ix *xi[TCC_MAX_DIMS];
  const tcc_vx *ok = NULL;
  sizes[0] = N;
  sizes[1] = C;
  xi[0] = tcc_ix_var(p, 0);
  xi[1] = tcc_ix_var(p, 1);
  for (int d = 0; d < S; d++) {
    sizes[2 + d] = size[d];
    const tcc_ix *e = tcc_ix_add(p, tcc_ix_var(p, 2 + d), tcc_ix_const(p, -lo[d]));
    if (lo[d] > 0 || size[d] - lo[d] > src[d]) {
      const tcc_vx *ev = tcc_vx_index(p, e);
      const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_GE, ev, icst(p, 0)),
                                    tcc_vx_pred(p, TCC_PRIM_LT, ev, icst(p, src[d])));
      ok = ok ? tcc_vx_pred(p, TCC_PRIM_AND, ok, c) : c;
      e = tcc_ix_clamp(p, e, src[d]);
    }
    xi[2 + d] = e;
  }
  const tcc_vx *x = read(lc, v, xi, dt);
  if (ok) x = tcc_vx_where(p, ok, x, cst(p, dt, 0));
  return tcc_lower_pack(lc, x, 2 + S, sizes, dt);
}

/* The im2col buffer [G, Cig, k.., N, o..] of input x, or -1. With
 * padding, the columns are gathered from the zero-padded copy
 * (zero_padded): every read is then affine and in range, so the packing
 * loop is plain contiguous copies. Gathering from x itself clamped each
 * index and masked the border, which split every short output row into
 * three loops (border peeling) and made the pack as slow as the GEMM
 * after it (360 us of ResNet's 16-channel 16x16 convolution, 2.9 ms per
 * forward). */
static int im2col(tcc_lower_ctx *lc, const conv_geom *cg, int xv, tcc_dtype dt) {
  tcc_program *p = lc->prog;
  int S = cg->S;
  int64_t sizes[TCC_MAX_DIMS];
  sizes[0] = cg->G;
  sizes[1] = cg->Cig;
  for (int d = 0; d < S; d++) {
    sizes[2 + d] = cg->k[d];
    sizes[3 + S + d] = cg->o[d];
  }
  sizes[2 + S] = cg->N;
  /* the tap of output o at kernel offset k: o*s + k*d, in the padded
   * input (x itself when there is no padding) */
  const tcc_ix *xi[TCC_MAX_DIMS];
  xi[0] = tcc_ix_var(p, 2 + S);
  xi[1] = grouped(p, cg, tcc_ix_var(p, 0), tcc_ix_var(p, 1), cg->Cig);
  int padded = 0;
  for (int d = 0; d < S; d++) {
    xi[2 + d] = tcc_ix_add(p, tcc_ix_mul(p, tcc_ix_var(p, 3 + S + d), cg->s[d]),
                           tcc_ix_mul(p, tcc_ix_var(p, 2 + d), cg->d[d]));
    padded |= cg->p[d] > 0;
  }
  if (!padded) return tcc_lower_pack(lc, read(lc, xv, xi, dt), 3 + 2 * S, sizes, dt);
  int64_t size[CONV_MAX_SPATIAL];
  for (int d = 0; d < S; d++) size[d] = cg->in[d] + 2 * cg->p[d];
  int xp = zero_padded(lc, S, cg->N, cg->Cin, xv, cg->in, cg->p, size, dt);
  if (xp < 0) return -1;
  return tcc_lower_pack(lc, tcc_vx_load(p, xp, 2 + S, xi), 3 + 2 * S, sizes, dt);
}

/* A load of buffer `buf` [G, A.., B..] (sizes as given) at (g, flat a,
 * flat b): a over na dims, b over nb dims. */
static const tcc_vx *load3(tcc_program *p, int buf, const tcc_ix *g, const tcc_ix *a,
                           const int64_t *asz, int na, const tcc_ix *b, const int64_t *bsz, int nb) {
  const tcc_ix *idx[TCC_MAX_DIMS];
  idx[0] = g;
  unflatten(p, a, asz, na, idx + 1);
  unflatten(p, b, bsz, nb, idx + 1 + na);
  return tcc_vx_load(p, buf, 1 + na + nb, idx);
}

/* Sizes (Cig, k..) and (N, o..) of the flattened kk and j indices. */
static void kk_j_sizes(const conv_geom *cg, int64_t *kk, int64_t *j) {
  kk[0] = cg->Cig;
  j[0] = cg->N;
  for (int d = 0; d < cg->S; d++) {
    kk[1 + d] = cg->k[d];
    j[1 + d] = cg->o[d];
  }
}

/* The GEMM dtype of node n (float32/float64), or 0 with err set. */
static tcc_dtype gemm_dtype(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg, tcc_error *err) {
  tcc_dtype dt = tmeta(lc->g, ARG("input"))->dtype;
  if (cg->transposed) {
    tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): transposed convolution is not supported "
                  "yet", n->src_index, n->op->name);
    return 0;
  }
  if (dt != TCC__V1__DTYPE__FLOAT32 && dt != TCC__V1__DTYPE__FLOAT64) {
    tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %s convolution is not supported yet "
                  "(float32 and float64 only)", n->src_index, n->op->name,
                  tcc_dtype_name(dt));
    return 0;
  }
  return dt;
}

/* Casts body to output o's dtype and realizes it (nothing when the
 * output is discarded). */
static int put(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body, tcc_error *err) {
  if (o >= n->nout || n->outs[o] < 0) return 0;
  if (!body) return OOM();
  const tcc_meta *m = &lc->g->values[n->outs[o]].meta;
  return tcc_lower_realize(lc, n, o, tcc_vx_cast(lc->prog, body, m->dtype), err);
}

/* ------------------------------------------------ library steps (oneDNN, cuDNN) */

int tcc_onednn_enabled(void) {
#ifdef TCC_HAVE_ONEDNN
  const char *off = getenv("TCC_NO_ONEDNN");
  return !(off && off[0] && strcmp(off, "0") != 0);
#else
  return 0;
#endif
}

int tcc_cudnn_enabled(void) {
  const char *off = getenv("TCC_NO_CUDNN");
  return !(off && off[0] && strcmp(off, "0") != 0);
}

/* Does node n's convolution (geometry cg, dtype dt) become library steps:
 * oneDNN on the CPU (float32), cuDNN on CUDA (float32, float64, float16,
 * bfloat16; not transposed; every size an int, as cuDNN takes them)? */
static int use_library(const tcc_lower_ctx *lc, const conv_geom *cg, tcc_dtype dt) {
  int cuda = lc->g->target.device == TCC__V1__DEVICE_TYPE__CUDA;
  if (lc->g->nsyms) return 0;
  if (cuda) {
    if (!tcc_cudnn_enabled() || cg->transposed ||
        (dt != TCC__V1__DTYPE__FLOAT32 && dt != TCC__V1__DTYPE__FLOAT64 && dt != TCC__V1__DTYPE__FLOAT16 &&
         dt != TCC__V1__DTYPE__BFLOAT16))
      return 0;
    int64_t x = cg->N * cg->Cin, y = cg->N * cg->Cout, w = cg->Cout * cg->Cig;
    for (int d = 0; d < cg->S; d++) x *= cg->in[d], y *= cg->o[d], w *= cg->k[d];
    if (x > INT32_MAX || y > INT32_MAX || w > INT32_MAX) return 0;
  } else if (lc->g->target.device != TCC__V1__DEVICE_TYPE__CPU || dt != TCC__V1__DTYPE__FLOAT32 ||
             !tcc_onednn_enabled()) {
    return 0;
  }
  if (cg->N < 1 || cg->Cig < 1 || cg->Cog < 1 || cg->Cin % cg->G) return 0;
  for (int d = 0; d < cg->S; d++)
    if (cg->in[d] < 1 || cg->o[d] < 1) return 0;
  return 1;
}

/* Is L a rank-4 or rank-5 layout stored channels last? */
static int layout_channels_last(const tcc_meta *L) {
  if (L->rank != 4 && L->rank != 5) return 0;
  tcc_meta m = *L;
  tcc_meta_channels_last(&m);
  for (int d = 0; d < L->rank; d++)
    if (L->sizes[d] > 1 && L->strides[d] != m.strides[d]) return 0;
  return 1;
}

/* Is e the identity load of a whole buffer of rank `rank`? */
static int identity_load(const tcc_program *p, const tcc_vx *e, int rank) {
  if (!e || e->op != TCC_PRIM_LOAD || e->nidx != rank || p->bufs[e->buf].layout.rank != rank) return 0;
  for (int d = 0; d < rank; d++)
    if (e->idx[d]->kind != TCC_IX_VAR || e->idx[d]->var != d) return 0;
  return 1;
}

/* Does value v reach a convolution channels last: a buffer stored so,
 * or a body still to be packed that the layout plan marked
 * (tcc_conv_plan_layouts)? */
static int reads_channels_last(const tcc_lower_ctx *lc, int v) {
  const tcc_vx *e = lc->vals[v].body;
  if (identity_load(lc->prog, e, lc->vals[v].rank)) return layout_channels_last(&lc->prog->bufs[e->buf].layout);
  return lc->channels_last[v];
}

/* Value v (dtype dt) as a whole buffer a library step reads through its
 * layout: its body when that is a load of a dt buffer at the identity
 * index with no zero stride (on a dim longer than 1; on CUDA, where
 * cuDNN's steps take dense NCHW tensors, a contiguous buffer), else a
 * TEMP packed from the body, contiguous or (channels_last) channels
 * last. NULL when out of memory. */
static const tcc_vx *whole(tcc_lower_ctx *lc, int v, tcc_dtype dt, int channels_last) {
  tcc_program *p = lc->prog;
  const tcc_lval *lv = &lc->vals[v];
  const tcc_vx *e = lv->body;
  int ok = identity_load(p, e, lv->rank) && e->dtype == dt;
  if (ok) {
    const tcc_meta *L = &p->bufs[e->buf].layout;
    ok = L->dtype == dt;
    for (int d = 0; ok && d < lv->rank; d++)
      ok = L->sizes[d] == lv->sizes[d] && (L->strides[d] > 0 || L->sizes[d] == 1);
    if (ok && lc->g->target.device == TCC__V1__DEVICE_TYPE__CUDA) ok = tcc_meta_is_contiguous(L);
  }
  if (ok) return e;
  const tcc_ix *idx[TCC_MAX_DIMS];
  for (int d = 0; d < lv->rank; d++) idx[d] = tcc_ix_var(p, d);
  const tcc_vx *body = read(lc, v, idx, dt);
  int buf = channels_last ? tcc_lower_pack_channels_last(lc, body, lv->rank, lv->sizes, dt)
                          : tcc_lower_pack(lc, body, lv->rank, lv->sizes, dt);
  return buf < 0 ? NULL : tcc_vx_load(p, buf, lv->rank, idx);
}

/* The oneDNN step `kind` over operands a and b (whole()) as an EXTERN
 * kernel into a TEMP of `sizes`: channels last when cl (a forward step
 * whose result the layout plan realizes so, tcc_conv_plan_layouts), else
 * contiguous. Returns a load of it at the identity index, or NULL when
 * out of memory. */
static const tcc_vx *library_step(tcc_lower_ctx *lc, tcc_extern_kind kind, const conv_geom *cg, tcc_dtype dt,
                                  const tcc_vx *a, const tcc_vx *b, int rank, const int64_t *sizes, int cl) {
  tcc_program *p = lc->prog;
  if (!a || !b) return NULL;
  int64_t prm[TCC_CONV_NPARAM] = {0};
  prm[TCC_CONV_S] = cg->S;
  prm[TCC_CONV_N] = cg->N;
  prm[TCC_CONV_CIN] = cg->Cin;
  prm[TCC_CONV_COUT] = cg->Cout;
  prm[TCC_CONV_G] = cg->G;
  for (int d = 0; d < cg->S; d++) {
    prm[TCC_CONV_IN + d] = cg->in[d];
    prm[TCC_CONV_K + d] = cg->k[d];
    prm[TCC_CONV_O + d] = cg->o[d];
    prm[TCC_CONV_STRIDE + d] = cg->s[d];
    prm[TCC_CONV_PAD + d] = cg->p[d];
    prm[TCC_CONV_DIL + d] = cg->d[d];
  }
  prm[TCC_CONV_TRANSPOSED] = cg->transposed;
  /* packed by a kernel whose one store is the call: made EXTERN */
  const tcc_vx *call = tcc_vx_extern(p, kind, dt, a, b, TCC_CONV_NPARAM, prm);
  int id = !call ? -1 : cl ? tcc_lower_pack_channels_last(lc, call, rank, sizes, dt)
                           : tcc_lower_pack(lc, call, rank, sizes, dt);
  if (id < 0) return NULL;
  p->kernels[p->nkernels - 1].kind = TCC_OPK_EXTERN;
  const tcc_ix *idx[TCC_MAX_DIMS];
  for (int d = 0; d < rank; d++) idx[d] = tcc_ix_var(p, d);
  return tcc_vx_load(p, id, rank, idx);
}

static int graph_output(const tcc_graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return 1;
  return 0;
}

/* Is a CPU convolution step's result v realized channels last: planned
 * so (tcc_conv_plan_layouts), or a graph output laid out so (an
 * activation a training graph saves for its backward, which the client
 * lays out channels last as Inductor does)? */
static int result_channels_last(const tcc_lower_ctx *lc, int v) {
  if (v < 0 || lc->g->target.device != TCC__V1__DEVICE_TYPE__CPU) return 0;
  if (graph_output(lc->g, v)) return layout_channels_last(&lc->g->values[v].meta);
  return lc->channels_last[v];
}

/* Sizes [N, C, spatial..] of a convolution's activation. */
static void activation_sizes(const conv_geom *cg, int64_t C, const int64_t *spatial, int64_t *out) {
  out[0] = cg->N;
  out[1] = C;
  for (int d = 0; d < cg->S; d++) out[2 + d] = spatial[d];
}

/* The forward convolution as a oneDNN step, plus bias, into output 0. */
static int conv_library(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg, tcc_error *err) {
  tcc_program *p = lc->prog;
  tcc_dtype dt = tmeta(lc->g, ARG("input"))->dtype;
  int64_t ys[TCC_MAX_DIMS];
  activation_sizes(cg, cg->Cout, cg->o, ys);
  int xv = ARG("input")->v;
  const tcc_vx *y = library_step(lc, TCC_EXT_CONV_FWD, cg, dt, whole(lc, xv, dt, lc->channels_last[xv]),
                                whole(lc, ARG("weight")->v, dt, 0), 2 + cg->S, ys,
                                result_channels_last(lc, n->outs[0]));
  if (!y) return OOM();
  const tcc_arg *bias = ARG("bias");
  if (bias->kind == TCC_ARG_TENSOR) {   /* float16/bfloat16: added in float32, as eager's add */
    tcc_dtype ct = dt == TCC__V1__DTYPE__FLOAT16 || dt == TCC__V1__DTYPE__BFLOAT16 ? TCC__V1__DTYPE__FLOAT32 : dt;
    const tcc_ix *c = tcc_ix_var(p, 1);
    y = BIN(ADD, tcc_vx_cast(p, y, ct), read(lc, bias->v, &c, ct));
  }
  return put(lc, n, 0, y, err);
}

/* Is cg a pointwise convolution (1x1 taps, stride 1, no padding, one
 * group) on the CPU? */
static int cpu_pointwise_conv(const tcc_lower_ctx *lc, const conv_geom *cg) {
  if (lc->g->target.device != TCC__V1__DEVICE_TYPE__CPU || cg->G != 1 || cg->transposed) return 0;
  for (int d = 0; d < cg->S; d++)
    if (cg->k[d] != 1 || cg->s[d] != 1 || cg->p[d] != 0) return 0;
  return 1;
}

/* A pointwise convolution on the CPU (cpu_pointwise_conv) as one GEMM
 * step batched over the images, in the layout x comes in:
 *   NCHW  y[n] = W[Cout, Cin] . x[n][Cin, O], C in y's [N, Cout, O] order;
 *   NHWC  (x stored channels last, reads_channels_last) one GEMM over
 *         every image's pixels, y^T = x^T[N*O, Cin] . W^T, C in
 *         [N*O, Cout] order (per image, 7x7 maps made GEMMs of 49 rows),
 * reading x where it is (when it is a buffer), so the epilogue reads C
 * straight and writes y in its own layout. oneDNN's blocked 1x1 kernels
 * need x reordered into nChw16c (nChw8c) and the result back on every
 * call: half of MobileNetV3's step went to those reorders. */
static int conv_pointwise_gemm(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg,
                               tcc_dtype dt, tcc_error *err) {
  tcc_program *p = lc->prog;
  int S = cg->S, xv = ARG("input")->v, nhwc = reads_channels_last(lc, xv);
  const tcc_ix *v0 = tcc_ix_var(p, 0), *v1 = tcc_ix_var(p, 1), *v2 = tcc_ix_var(p, 2);
  const tcc_ix *wi[TCC_MAX_DIMS], *xi[TCC_MAX_DIMS];
  for (int d = 0; d < S; d++) wi[2 + d] = tcc_ix_const(p, 0);
  xi[0] = v0;
  const tcc_vx *c;
  if (nhwc) {
    int64_t no[1 + CONV_MAX_SPATIAL];           /* A(0, m, k) = x[n(m), k, o(m)..] */
    const tcc_ix *mi[1 + CONV_MAX_SPATIAL];
    no[0] = cg->N;
    memcpy(no + 1, cg->o, sizeof(int64_t) * (size_t)S);
    unflatten(p, v1, no, 1 + S, mi);
    xi[0] = mi[0];
    xi[1] = v2;
    for (int d = 0; d < S; d++) xi[2 + d] = mi[1 + d];
    wi[0] = v2;                                 /* B(0, k, j) = W[j, k, 0..] */
    wi[1] = v1;
    c = tcc_lower_gemm(lc, read(lc, xv, xi, dt), read(lc, ARG("weight")->v, wi, dt), 1, cg->J,
                       cg->Cout, cg->Cin, dt);
  } else {
    wi[0] = v1;                                 /* A(b, m, k) = W[m, k, 0..] */
    wi[1] = v2;
    xi[1] = v1;                                 /* B(b, k, j) = x[b, k, o(j)..] */
    unflatten(p, v2, cg->o, S, xi + 2);
    c = tcc_lower_gemm(lc, read(lc, ARG("weight")->v, wi, dt), read(lc, xv, xi, dt), cg->N, cg->Cout,
                       cg->O, cg->Cin, dt);
  }
  if (!c) return OOM();
  const tcc_ix *o[TCC_MAX_DIMS], *ci[3];
  for (int d = 0; d < 2 + S; d++) o[d] = tcc_ix_var(p, d);
  if (nhwc) {
    ci[0] = tcc_ix_const(p, 0);
    ci[1] = tcc_ix_add(p, tcc_ix_mul(p, o[0], cg->O), flatten(p, o + 2, cg->o, S));
    ci[2] = o[1];
  } else {
    ci[0] = o[0];
    ci[1] = o[1];
    ci[2] = flatten(p, o + 2, cg->o, S);
  }
  const tcc_vx *y = tcc_vx_subst(p, c, 3, ci);
  const tcc_arg *bias = ARG("bias");
  if (bias->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, read(lc, bias->v, o + 1, dt));
  return put(lc, n, 0, y, err);
}

int tcc_lower_conv(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err);

int tcc_lower_conv_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err);

/* Is node n a 2-D convolution, forward or backward, that the CPU's
 * library roads run: 1 when oneDNN steps, 2 when a pointwise GEMM (a
 * forward cpu_pointwise_conv), else 0? */
static int cpu_library_conv_2d(tcc_lower_ctx *lc, const tcc_node *n) {
  const tcc_graph *g = lc->g;
  int forward = n->op->lower == tcc_lower_conv;
  if (!forward && n->op->lower != tcc_lower_conv_backward) return 0;
  conv_geom cg;
  tcc_error e = {0};
  const tcc_meta *x = tmeta(g, ARG("input"));
  if (conv_geom_of(g, n, &cg, &e) || !x || cg.S != 2 || cg.transposed ||
      g->target.device != TCC__V1__DEVICE_TYPE__CPU || !use_library(lc, &cg, x->dtype))
    return 0;
  return forward && cpu_pointwise_conv(lc, &cg) ? 2 : 1;
}

/* Does value v (a convolution's input) reach it channels last, as far as
 * the plan knows before lowering (a view of such a buffer may too)? */
static int planned_channels_last(const tcc_lower_ctx *lc, int v) {
  const tcc_value *val = &lc->g->values[v];
  if (val->kind == TCC_VAL_NODE && !graph_output(lc->g, v)) return lc->channels_last[v];
  return layout_channels_last(&val->meta);
}

static int same_sizes(const tcc_meta *a, const tcc_meta *b) {
  if (a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

/* Does value v, of rank 4 (with more than one channel and one pixel:
 * not a depthwise weight, not a pooled [N, C, 1, 1], which are NCHW as
 * well), arrive or leave channels last: a graph input or output laid
 * out so, or a value planned so? */
static int is_channels_last(const tcc_lower_ctx *lc, int v) {
  const tcc_value *val = &lc->g->values[v];
  const int64_t *s = val->meta.sizes;
  if (val->meta.rank != 4 || s[1] == 1 || s[2] * s[3] == 1) return 0;   /* NCHW as well */
  if (val->kind != TCC_VAL_NODE || graph_output(lc->g, v)) return layout_channels_last(&val->meta);
  return lc->channels_last[v];
}

/* In a graph that takes or gives channels-last activations (a training
 * step's backward, whose saved activations are; a forward that saves
 * them), every rank-4 value a node computes from a channels-last operand
 * is realized channels last too, as the other operands are read: a
 * max-pool's or a batch norm's backward on NHWC activations writes its
 * gradient NHWC, not a transposed copy that every later kernel gathers
 * from. */
static void follow_channels_last(tcc_lower_ctx *lc) {
  const tcc_graph *g = lc->g;
  int any = 0;
  for (int v = 0; v < g->nvalues && !any; v++)
    any = g->values[v].kind != TCC_VAL_NODE && is_channels_last(lc, v);
  for (int i = 0; i < g->noutputs && !any; i++) any = is_channels_last(lc, g->outputs[i]);
  if (!any || g->target.device != TCC__V1__DEVICE_TYPE__CPU) return;
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    int cl = 0;
    FOR_EACH_TENSOR_ARG(n, a, { cl |= is_channels_last(lc, a); });
    for (int o = 0; cl && o < n->nout; o++) {
      int w = n->outs[o];
      if (w >= 0 && g->values[w].meta.rank == 4 && g->values[w].meta.sizes[1] > 1 && !graph_output(g, w))
        lc->channels_last[w] = 1;
    }
  }
}

/* The layouts of the CPU's 2-D library convolutions (see the file
 * header): inputs the graph computes and keeps to itself channels last;
 * then, walking the nodes backwards, each oneDNN step's result:
 *   - channels last when it reaches a channels-last input through other
 *     nodes (the first convolution of a network: oneDNN's reorder out of
 *     its blocked layout writes NHWC as fast as NCHW, and the epilogue
 *     between, the stem's batch norm, relu and max pool, then reads along
 *     C as it writes instead of gathering at the stride of a whole map);
 *   - else NCHW when it ends, through nodes of its own sizes, in a graph
 *     output that is not channels last (a block compiled alone: oneDNN
 *     reorders its NHWC result, and the epilogue that adds the block's
 *     NCHW input reads both as it writes);
 *   - else channels last when its input is, as oneDNN's brgemm kernels
 *     write it. */
void tcc_conv_plan_layouts(tcc_lower_ctx *lc) {
  const tcc_graph *g = lc->g;
  for (int k = 0; k < g->nnodes; k++) {
    const tcc_node *n = &g->nodes[k];
    if (!cpu_library_conv_2d(lc, n)) continue;
    int v = ARG("input")->v;
    if (g->values[v].kind == TCC_VAL_NODE) lc->channels_last[v] = 1;
  }
  unsigned char *reaches = calloc((size_t)g->nvalues + 1, 1), *ends = calloc((size_t)g->nvalues + 1, 1);
  if (!reaches || !ends) {   /* only a layout choice: the results stay as oneDNN writes them */
    free(reaches);
    free(ends);
    return;
  }
  for (int v = 0; v < g->nvalues; v++) {
    int out = graph_output(g, v);
    reaches[v] = lc->channels_last[v] && !out;
    ends[v] = out && !layout_channels_last(&g->values[v].meta);
  }
  for (int k = g->nnodes - 1; k >= 0; k--) {
    const tcc_node *n = &g->nodes[k];
    int road = cpu_library_conv_2d(lc, n);
    if (road && n->op->lower == tcc_lower_conv_backward) {
      /* the backward of a convolution whose input is channels last (a
       * training graph's saved activation): its incoming gradient and
       * the input's gradient so too, and oneDNN's backward steps run on
       * them as they are */
      int gy = ARG("grad_output")->v, gx = n->outs[0];
      if (planned_channels_last(lc, ARG("input")->v)) {
        if (g->values[gy].kind == TCC_VAL_NODE && !graph_output(g, gy)) lc->channels_last[gy] = 1;
        if (gx >= 0 && !graph_output(g, gx)) lc->channels_last[gx] = 1;
      }
      continue;
    }
    if (road) {   /* the chains start again at a convolution */
      int y = n->outs[0];
      if (road == 1 && y >= 0 && !graph_output(g, y))
        lc->channels_last[y] = reaches[y] || (planned_channels_last(lc, ARG("input")->v) && !ends[y]);
      continue;
    }
    for (int o = 0; o < n->nout; o++) {
      int w = n->outs[o];
      if (w < 0) continue;
      FOR_EACH_TENSOR_ARG(n, a, {
        reaches[a] |= reaches[w];
        ends[a] |= ends[w] && same_sizes(&g->values[a].meta, &g->values[w].meta);
      });
    }
  }
  free(reaches);
  free(ends);
  follow_channels_last(lc);
}

int tcc_lower_conv(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  if (n->outs[0] < 0) return 0;
  tcc_program *p = lc->prog;
  conv_geom cg;
  int rc = conv_geom_of(lc->g, n, &cg, err);
  if (rc) return rc;
  if (cpu_pointwise_conv(lc, &cg)) {
    tcc_dtype dt = gemm_dtype(lc, n, &cg, err);
    return dt ? conv_pointwise_gemm(lc, n, &cg, dt, err) : err->code;
  }
  if (use_library(lc, &cg, tmeta(lc->g, ARG("input"))->dtype)) return conv_library(lc, n, &cg, err);
  tcc_dtype dt = gemm_dtype(lc, n, &cg, err);
  if (!dt) return err->code;
  int S = cg.S, xv = ARG("input")->v, wv = ARG("weight")->v;
  int64_t kks[TCC_MAX_DIMS], js[TCC_MAX_DIMS];
  kk_j_sizes(&cg, kks, js);
  const tcc_ix *vb = tcc_ix_var(p, 0), *vr = tcc_ix_var(p, 1), *vc = tcc_ix_var(p, 2);
  /* A(b, m, kk) = W[b*Cog + m, kk..] */
  const tcc_ix *wi[TCC_MAX_DIMS];
  wi[0] = grouped(p, &cg, vb, vr, cg.Cog);
  unflatten(p, vc, kks, 1 + S, wi + 1);
  const tcc_vx *a = read(lc, wv, wi, dt);
  /* B(b, kk, j): the input itself for a 1x1, stride-1, unpadded kernel
   * (gemm() packs it when BLAS cannot read it as it is), else im2col */
  int direct = 1;
  for (int d = 0; d < S; d++)
    if (cg.k[d] != 1 || cg.s[d] != 1 || cg.p[d] != 0) direct = 0;
  const tcc_vx *b;
  if (direct) {
    const tcc_ix *xi[TCC_MAX_DIMS], *jj[TCC_MAX_DIMS];
    unflatten(p, vc, js, 1 + S, jj);
    xi[0] = jj[0];
    xi[1] = grouped(p, &cg, vb, vr, cg.Cig);
    for (int d = 0; d < S; d++) xi[2 + d] = jj[1 + d];
    b = read(lc, xv, xi, dt);
  } else {
    int col = im2col(lc, &cg, xv, dt);
    if (col < 0) return OOM();
    b = load3(p, col, vb, vr, kks, 1 + S, vc, js, 1 + S);
  }
  const tcc_vx *c = tcc_lower_gemm(lc, a, b, cg.G, cg.Cog, cg.J, cg.Kd, dt);
  if (!c) return OOM();
  /* epilogue over the output (n, c, o..) */
  const tcc_ix *o[TCC_MAX_DIMS], *ci[3];
  for (int d = 0; d < 2 + S; d++) o[d] = tcc_ix_var(p, d);
  ci[0] = cg.G == 1 ? tcc_ix_const(p, 0) : tcc_ix_div(p, o[1], cg.Cog);
  ci[1] = cg.G == 1 ? o[1] : tcc_ix_mod(p, o[1], cg.Cog);
  ci[2] = tcc_ix_add(p, tcc_ix_mul(p, o[0], cg.O), flatten(p, o + 2, cg.o, S));
  const tcc_vx *y = tcc_vx_subst(p, c, 3, ci);
  const tcc_arg *bias = ARG("bias");
  if (bias->kind == TCC_ARG_TENSOR) y = BIN(ADD, y, read(lc, bias->v, o + 1, dt));
  return put(lc, n, 0, y, err);
}

static int grad_input_gemm(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg, int wv,
                           int gcol, const int64_t *kks, const int64_t *hs, int64_t H,
                           tcc_dtype dt, tcc_error *err);

/* grad_input of a stride-1 convolution as a convolution of gy (file
 * header): the packed gy taps, one GEMM, the epilogue into output 0. */
static int grad_input_unit_stride(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg,
                                  int wv, int gv, tcc_dtype dt, tcc_error *err) {
  tcc_program *p = lc->prog;
  int S = cg->S;
  /* gcol [G, Cog, k.., N, h..] */
  int64_t sizes[TCC_MAX_DIMS], kks[TCC_MAX_DIMS], hs[TCC_MAX_DIMS];
  sizes[0] = cg->G;
  sizes[1] = cg->Cog;
  sizes[2 + S] = cg->N;
  kks[0] = cg->Cog;
  hs[0] = cg->N;
  int64_t H = 1;
  for (int d = 0; d < S; d++) {
    sizes[2 + d] = kks[1 + d] = cg->k[d];
    sizes[3 + S + d] = hs[1 + d] = cg->in[d];
    H *= cg->in[d];
  }
  const tcc_ix *gi[TCC_MAX_DIMS];
  const tcc_vx *ok = NULL;
  gi[0] = tcc_ix_var(p, 2 + S);
  gi[1] = grouped(p, cg, tcc_ix_var(p, 0), tcc_ix_var(p, 1), cg->Cog);
  /* o = h + p - k*d ranges over [p - (K-1)d, H-1+p]: with gy zero-padded
   * by lo = (K-1)d - p in front (when that is >= 0), gcol's reads
   * gyp[h - k*d + (K-1)d] are affine and in range */
  int64_t lo[CONV_MAX_SPATIAL] = {0}, psize[CONV_MAX_SPATIAL] = {0};
  int affine = 1;
  for (int d = 0; d < S; d++) {
    lo[d] = (cg->k[d] - 1) * cg->d[d] - cg->p[d];
    psize[d] = cg->in[d] + cg->p[d] + lo[d];
    affine &= lo[d] >= 0;
  }
  if (affine) {
    int gyp = zero_padded(lc, S, cg->N, cg->Cout, gv, cg->o, lo, psize, dt);
    if (gyp < 0) return OOM();
    const tcc_ix *pi[TCC_MAX_DIMS];
    pi[0] = gi[0];
    pi[1] = gi[1];
    for (int d = 0; d < S; d++)
      pi[2 + d] = tcc_ix_add(p, tcc_ix_add(p, tcc_ix_var(p, 3 + S + d),
                                           tcc_ix_mul(p, tcc_ix_var(p, 2 + d), -cg->d[d])),
                             tcc_ix_const(p, (cg->k[d] - 1) * cg->d[d]));
    int cols = tcc_lower_pack(lc, tcc_vx_load(p, gyp, 2 + S, pi), 3 + 2 * S, sizes, dt);
    return grad_input_gemm(lc, n, cg, wv, cols, kks, hs, H, dt, err);
  }
  for (int d = 0; d < S; d++) {
    /* o = h + p - k*d, in [0, o_size) */
    const tcc_ix *e = tcc_ix_add(p, tcc_ix_add(p, tcc_ix_var(p, 3 + S + d),
                                               tcc_ix_mul(p, tcc_ix_var(p, 2 + d), -cg->d[d])),
                                 tcc_ix_const(p, cg->p[d]));
    const tcc_vx *ev = tcc_vx_index(p, e);
    const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_GE, ev, icst(p, 0)),
                                  tcc_vx_pred(p, TCC_PRIM_LT, ev, icst(p, cg->o[d])));
    ok = ok ? tcc_vx_pred(p, TCC_PRIM_AND, ok, c) : c;
    gi[2 + d] = tcc_ix_clamp(p, e, cg->o[d]);
  }
  const tcc_vx *v = tcc_vx_where(p, ok, read(lc, gv, gi, dt), cst(p, dt, 0));
  int cols = tcc_lower_pack(lc, v, 3 + 2 * S, sizes, dt);
  return grad_input_gemm(lc, n, cg, wv, cols, kks, hs, H, dt, err);
}

/* grad_input_unit_stride's GEMM over the packed taps gcol and its
 * epilogue into output 0. */
static int grad_input_gemm(tcc_lower_ctx *lc, const tcc_node *n, const conv_geom *cg, int wv,
                           int gcol, const int64_t *kks, const int64_t *hs, int64_t H,
                           tcc_dtype dt, tcc_error *err) {
  tcc_program *p = lc->prog;
  int S = cg->S;
  if (gcol < 0) return OOM();
  /* C[g, ci, (n, h..)] = sum_(co, k..) W[g*Cog + co, ci, k..] gcol[g, (co, k..), (n, h..)] */
  const tcc_ix *vb = tcc_ix_var(p, 0), *vr = tcc_ix_var(p, 1), *vc = tcc_ix_var(p, 2);
  const tcc_ix *wi[TCC_MAX_DIMS], *ck[TCC_MAX_DIMS];
  unflatten(p, vc, kks, 1 + S, ck);
  wi[0] = grouped(p, cg, vb, ck[0], cg->Cog);
  wi[1] = vr;
  for (int d = 0; d < S; d++) wi[2 + d] = ck[1 + d];
  const tcc_vx *a = read(lc, wv, wi, dt);
  const tcc_vx *b = load3(p, gcol, vb, vr, kks, 1 + S, vc, hs, 1 + S);
  const tcc_vx *c = tcc_lower_gemm(lc, a, b, cg->G, cg->Cig, cg->N * H, cg->Cog * cg->KK, dt);
  if (!c) return OOM();
  /* gx[n, c, h..] = C[c / Cig, c % Cig, n*H + flat(h..)] */
  const tcc_ix *o[TCC_MAX_DIMS], *ci[3];
  for (int d = 0; d < 2 + S; d++) o[d] = tcc_ix_var(p, d);
  ci[0] = cg->G == 1 ? tcc_ix_const(p, 0) : tcc_ix_div(p, o[1], cg->Cig);
  ci[1] = cg->G == 1 ? o[1] : tcc_ix_mod(p, o[1], cg->Cig);
  ci[2] = tcc_ix_add(p, tcc_ix_mul(p, o[0], H), flatten(p, o + 2, cg->in, S));
  return put(lc, n, 0, tcc_vx_subst(p, c, 3, ci), err);
}

int tcc_lower_conv_backward(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  conv_geom cg;
  int rc = conv_geom_of(lc->g, n, &cg, err);
  if (rc) return rc;
  tcc_dtype xdt = tmeta(lc->g, ARG("input"))->dtype;
  int library = use_library(lc, &cg, xdt);
  tcc_dtype dt = library ? xdt : gemm_dtype(lc, n, &cg, err);
  if (!dt) return err->code;
  const tcc_arg *mask = ARG("output_mask");
  int want[3];
  for (int o = 0; o < 3; o++)
    want[o] = o < n->nout && n->outs[o] >= 0 && (mask->kind != TCC_ARG_BOOLS || o >= mask->n || mask->bools[o]);
  int S = cg.S, xv = ARG("input")->v, wv = ARG("weight")->v, gv = ARG("grad_output")->v;
  int64_t kks[TCC_MAX_DIMS], js[TCC_MAX_DIMS];
  kk_j_sizes(&cg, kks, js);
  const tcc_ix *vb = tcc_ix_var(p, 0), *vr = tcc_ix_var(p, 1), *vc = tcc_ix_var(p, 2);

  /* grad_bias[c] = sum over n, o.. of gy[n, c, o..] */
  if (want[2]) {
    int first = tcc_program_fresh_vars(p, 1 + S);
    const tcc_ix *gi[TCC_MAX_DIMS];
    int64_t ext[TCC_MAX_DIMS];
    gi[0] = tcc_ix_var(p, first);
    gi[1] = tcc_ix_var(p, 0);
    ext[0] = cg.N;
    for (int d = 0; d < S; d++) {
      gi[2 + d] = tcc_ix_var(p, first + 1 + d);
      ext[1 + d] = cg.o[d];
    }
    const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, dt, read(lc, gv, gi, dt), first, 1 + S, ext);
    if ((rc = put(lc, n, 2, sum, err))) return rc;
  }
  if (!want[0] && !want[1]) return 0;
  if (library) {
    const tcc_vx *gy = whole(lc, gv, dt, lc->channels_last[gv]);
    if (!gy) return OOM();
    if (want[0]) {
      int64_t xs[TCC_MAX_DIMS];
      activation_sizes(&cg, cg.Cin, cg.in, xs);
      if ((rc = put(lc, n, 0,
                    library_step(lc, TCC_EXT_CONV_BWD_DATA, &cg, dt, gy, whole(lc, wv, dt, 0), 2 + S, xs,
                                 result_channels_last(lc, n->outs[0])),
                    err)))
        return rc;
    }
    if (want[1]) {
      int64_t ws[TCC_MAX_DIMS] = {cg.Cout, cg.Cig};
      if (cg.transposed) ws[0] = cg.Cin, ws[1] = cg.Cog;
      memcpy(ws + 2, cg.k, sizeof(int64_t) * (size_t)S);
      if ((rc = put(lc, n, 1, library_step(lc, TCC_EXT_CONV_BWD_WEIGHTS, &cg, dt, whole(lc, xv, dt, lc->channels_last[xv]),
                                             gy, 2 + S, ws, 0),
                    err)))
        return rc;
    }
    return 0;
  }
  int unit_stride = 1;
  for (int d = 0; d < S; d++) unit_stride &= cg.s[d] == 1;
  if (!want[1] && unit_stride) return grad_input_unit_stride(lc, n, &cg, wv, gv, dt, err);

  /* gy packed as [G, Cog, N, o..] (both GEMMs read it as [G, Cog, J]) */
  int64_t gsz[TCC_MAX_DIMS];
  const tcc_ix *gi[TCC_MAX_DIMS];
  gsz[0] = cg.G;
  gsz[1] = cg.Cog;
  gsz[2] = cg.N;
  gi[0] = tcc_ix_var(p, 2);
  gi[1] = grouped(p, &cg, tcc_ix_var(p, 0), tcc_ix_var(p, 1), cg.Cog);
  for (int d = 0; d < S; d++) {
    gsz[3 + d] = cg.o[d];
    gi[2 + d] = tcc_ix_var(p, 3 + d);
  }
  int gyt = tcc_lower_pack(lc, read(lc, gv, gi, dt), 3 + S, gsz, dt);
  if (gyt < 0) return OOM();
  int64_t cogs[1] = {cg.Cog};

  /* grad_weight: C[g, m, kk] = sum_j gyT[g, m, j] col[g, kk, j] */
  if (want[1]) {
    int col = im2col(lc, &cg, xv, dt);
    if (col < 0) return OOM();
    const tcc_vx *a = load3(p, gyt, vb, vr, cogs, 1, vc, js, 1 + S);
    const tcc_vx *b = load3(p, col, vb, vc, kks, 1 + S, vr, js, 1 + S);
    const tcc_vx *c = tcc_lower_gemm(lc, a, b, cg.G, cg.Cog, cg.Kd, cg.J, dt);
    if (!c) return OOM();
    const tcc_ix *o[TCC_MAX_DIMS], *ci[3];
    for (int d = 0; d < 2 + S; d++) o[d] = tcc_ix_var(p, d);
    ci[0] = cg.G == 1 ? tcc_ix_const(p, 0) : tcc_ix_div(p, o[0], cg.Cog);
    ci[1] = cg.G == 1 ? o[0] : tcc_ix_mod(p, o[0], cg.Cog);
    ci[2] = flatten(p, o + 1, kks, 1 + S);
    if ((rc = put(lc, n, 1, tcc_vx_subst(p, c, 3, ci), err))) return rc;
  }

  /* grad_input: dcol[g, kk, j] = sum_m W[g*Cog + m, kk] gyT[g, m, j], then
   * gx[n, c, h..] = sum over taps k.. of dcol[g, (ci, k..), (n, o..)] with
   * o = (h + p - k*d) / s where that divides and lies in [0, o_size) */
  if (want[0] && unit_stride) return grad_input_unit_stride(lc, n, &cg, wv, gv, dt, err);
  if (want[0]) {
    const tcc_ix *wi[TCC_MAX_DIMS];
    wi[0] = grouped(p, &cg, vb, vc, cg.Cog);
    unflatten(p, vr, kks, 1 + S, wi + 1);
    const tcc_vx *a = read(lc, wv, wi, dt);
    const tcc_vx *b = load3(p, gyt, vb, vr, cogs, 1, vc, js, 1 + S);
    const tcc_vx *dcol = tcc_lower_gemm(lc, a, b, cg.G, cg.Kd, cg.J, cg.Cog, dt);
    if (!dcol) return OOM();
    int first = tcc_program_fresh_vars(p, S);
    const tcc_ix *o[TCC_MAX_DIMS], *kv[TCC_MAX_DIMS], *oi[TCC_MAX_DIMS], *ci[3];
    for (int d = 0; d < 2 + S; d++) o[d] = tcc_ix_var(p, d);
    const tcc_vx *ok = NULL;
    for (int d = 0; d < S; d++) {
      kv[d] = tcc_ix_var(p, first + d);
      /* u = h + p - k*dil + s*q >= 0 for every tap (q: whole strides) */
      int64_t q = (cg.d[d] * (cg.k[d] - 1) + cg.s[d] - 1) / cg.s[d] + 1;
      const tcc_ix *u = tcc_ix_add(p, tcc_ix_add(p, o[2 + d], tcc_ix_mul(p, kv[d], -cg.d[d])),
                                   tcc_ix_const(p, cg.p[d] + cg.s[d] * q));
      const tcc_ix *t = tcc_ix_div(p, u, cg.s[d]);          /* o + q */
      const tcc_vx *tv = tcc_vx_index(p, t);
      const tcc_vx *c = tcc_vx_pred(p, TCC_PRIM_AND, tcc_vx_pred(p, TCC_PRIM_GE, tv, icst(p, q)),
                                    tcc_vx_pred(p, TCC_PRIM_LT, tv, icst(p, q + cg.o[d])));
      if (cg.s[d] > 1)
        c = tcc_vx_pred(p, TCC_PRIM_AND, c,
                        tcc_vx_pred(p, TCC_PRIM_EQ, tcc_vx_index(p, tcc_ix_mod(p, u, cg.s[d])), icst(p, 0)));
      ok = ok ? tcc_vx_pred(p, TCC_PRIM_AND, ok, c) : c;
      oi[d] = tcc_ix_clamp(p, tcc_ix_add(p, t, tcc_ix_const(p, -q)), cg.o[d]);
    }
    const tcc_ix *cig = cg.G == 1 ? o[1] : tcc_ix_mod(p, o[1], cg.Cig);
    ci[0] = cg.G == 1 ? tcc_ix_const(p, 0) : tcc_ix_div(p, o[1], cg.Cig);
    ci[1] = tcc_ix_add(p, tcc_ix_mul(p, cig, cg.KK), flatten(p, kv, cg.k, S));
    ci[2] = tcc_ix_add(p, tcc_ix_mul(p, o[0], cg.O), flatten(p, oi, cg.o, S));
    const tcc_vx *v = tcc_vx_where(p, ok, tcc_vx_subst(p, dcol, 3, ci), cst(p, dt, 0));
    const tcc_vx *sum = tcc_vx_reduce(p, TCC_RED_SUM, dt, v, first, S, cg.k);
    if ((rc = put(lc, n, 0, sum, err))) return rc;
  }
  return 0;
}

/* ----------------------------------------------------------- dropout */

int tcc_infer_native_dropout(const tcc_graph *g, const tcc_node *n, tcc_meta *out, tcc_error *err) {
  const tcc_meta *x = tmeta(g, ARG("input")), *seed = tmeta(g, ARG("seed"));
  double pr = ARG("p")->f;
  if (!(pr >= 0 && pr <= 1)) return BAD("dropout probability has to be between 0 and 1, but got %g", pr);
  if (seed && (seed->dtype != I64 || seed->numel != 1))
    return BAD("seed must be an int64 tensor of one element, got %s with %lld elements",
               tcc_dtype_name(seed->dtype), (long long)seed->numel);
  int rc = finish_meta(g, &out[0], x->dtype, x->rank, x->sizes, err);
  if (!rc) rc = finish_meta(g, &out[1], TCC__V1__DTYPE__BOOL, x->rank, x->sizes, err);
  return rc;
}

/* murmur3's 32-bit finalizer on h in [0, 2^32), in int64 arithmetic. */
static const tcc_vx *fmix32(tcc_program *p, const tcc_vx *h) {
  const tcc_vx *m32 = icst(p, 0xffffffffLL);
  h = BIN(BITXOR, h, BIN(FLOORDIV, h, icst(p, 1 << 16)));
  h = BIN(BITAND, BIN(MUL, h, icst(p, 0x85ebca6bLL)), m32);
  h = BIN(BITXOR, h, BIN(FLOORDIV, h, icst(p, 1 << 13)));
  h = BIN(BITAND, BIN(MUL, h, icst(p, 0xc2b2ae35LL)), m32);
  return BIN(BITXOR, h, BIN(FLOORDIV, h, icst(p, 1 << 16)));
}

int tcc_lower_native_dropout(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err) {
  tcc_program *p = lc->prog;
  const tcc_arg *xa = ARG("input"), *train = ARG("train"), *seed = ARG("seed");
  const tcc_meta *x = tmeta(lc->g, xa);
  tcc_dtype cd = x->dtype == TCC__V1__DTYPE__FLOAT16 || x->dtype == TCC__V1__DTYPE__BFLOAT16
                     ? TCC__V1__DTYPE__FLOAT32 : x->dtype;
  const tcc_ix *id[TCC_MAX_DIMS], *zero[TCC_MAX_DIMS];
  for (int d = 0; d < x->rank; d++) {
    id[d] = tcc_ix_var(p, d);
    zero[d] = tcc_ix_const(p, 0);
  }
  const tcc_vx *xv = read(lc, xa->v, id, cd);
  double pr = ARG("p")->f;
  int rc;
  if (train->kind == TCC_ARG_BOOL && !train->i) {   /* eval: identity, all kept */
    if ((rc = put(lc, n, 0, xv, err))) return rc;
    return put(lc, n, 1, tcc_vx_const(p, TCC__V1__DTYPE__BOOL, 1, 1), err);
  }
  if (!tcc_dtype_is_float(x->dtype))
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): %s dropout is not supported",
                         n->src_index, n->op->name, tcc_dtype_name(x->dtype));
  if (seed->kind != TCC_ARG_TENSOR)
    return tcc_error_set(err, TCC_E_UNIMPLEMENTED, "node %d (%s): dropout in training mode needs a "
                         "'seed' tensor argument (an int64 tensor of one element, fresh per call; "
                         "see tcc.proto)", n->src_index, n->op->name);
  const tcc_meta *sm = tmeta(lc->g, seed);
  const tcc_vx *s = read(lc, seed->v, zero, I64);
  (void)sm;
  const tcc_vx *m32 = icst(p, 0xffffffffLL), *two32 = icst(p, INT64_C(1) << 32);
  const tcc_vx *i = tcc_vx_index(p, flatten(p, id, x->sizes, x->rank));
  const tcc_vx *s_lo = BIN(BITAND, s, m32), *s_hi = BIN(BITAND, BIN(FLOORDIV, s, two32), m32);
  const tcc_vx *i_lo = BIN(BITAND, i, m32), *i_hi = BIN(FLOORDIV, i, two32);
  /* key from (seed, high index bits); two rounds over the low bits */
  const tcc_vx *key = fmix32(p, BIN(BITAND, BIN(ADD, s_lo, fmix32(p, BIN(BITXOR, s_hi, i_hi))), m32));
  const tcc_vx *h = fmix32(p, BIN(BITXOR, i_lo, key));
  h = fmix32(p, BIN(BITAND, BIN(ADD, h, key), m32));
  int64_t thr = (int64_t)llround(pr * (double)(1 << 24));
  const tcc_vx *keep = tcc_vx_pred(p, TCC_PRIM_GE, BIN(FLOORDIV, h, icst(p, 1 << 8)), icst(p, thr));
  double scale = pr < 1 ? 1.0 / (1.0 - pr) : 0.0;
  const tcc_vx *y = BIN(MUL, BIN(MUL, xv, tcc_vx_cast(p, keep, cd)), cst(p, cd, scale));
  if ((rc = put(lc, n, 0, y, err))) return rc;
  return put(lc, n, 1, keep, err);
}
