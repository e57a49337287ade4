/*
 * loop.h — the compiler's back end: loop IR, its passes, and the targets.
 *
 * Reads as a table of contents grouped by defining file; the front end
 * (op table, graph IR) is in graph.h.
 *
 * The loop IR (after TorchInductor)
 * ---------------------------------
 * A program is a list of buffers and a list of kernels. A kernel is a loop
 * nest over an iteration space (sizes[0..rank)) whose body is a list of
 * stores; a store writes, at each point of the iteration space, an
 * expression of the loop variables into a buffer element:
 *
 *     kernel k0 over [4, 3, 5]:
 *       store buf2[i0, i1, i2] = add(sin(load buf0[i1, i2]), load buf1[i0, i1, i2])
 *
 * A buffer element is addressed by one index expression per buffer dim
 * (tcc_ix); the buffer's layout (strides, storage offset) turns them into
 * a storage offset only when code is emitted. So a view is nothing but a
 * rewrite of index expressions, and a broadcast reads index 0.
 *
 * Expressions (tcc_vx for values, tcc_ix for indices) are immutable and
 * hash-consed: building an expression equal to an existing one returns
 * the existing pointer. Equal means same pointer, sharing is automatic,
 * and substitution (tcc_vx_subst) preserves it.
 *
 * While lowering, every graph value is a "lowered value" (tcc_lval): its
 * shape, dtype and `body`, an expression over the loop variables
 * i0..i{rank-1} of its own shape that yields element [i0, ...]. Reading a
 * value at another index is substitution of its body.
 *
 * Passes (pipeline.c runs them in order, tcc_check_program between):
 *   lower.c   graph -> program: each node's outputs become a buffer written
 *             by a kernel of its own (nothing fused yet)
 *   fuse.c    inline pointwise producers into their consumers, drop
 *             buffers nothing reads, merge kernels with equal iteration
 *             spaces into one loop nest
 *   split.c   a dim read through i / c and i % c becomes two loops, so
 *             those accesses are affine again
 *   place.c   place the remaining temporary buffers in the workspace
 *   then each target's schedule pass, emitter and build (target.h:
 *   cpu/ and cuda/)
 */
#ifndef TCC_LOOP_H
#define TCC_LOOP_H

#include "graph.h"

/* ----------------------------------- expr.c (expressions, the program) */

typedef enum tcc_ix_kind {
  TCC_IX_CONST,   /* c */
  TCC_IX_VAR,     /* loop variable i<var> */
  TCC_IX_ADD,     /* a + b */
  TCC_IX_MUL,     /* a * c */
  TCC_IX_DIV,     /* floor(a / c), c > 0; a >= 0 wherever it is built */
  TCC_IX_MOD,     /* a mod c, c > 0; a >= 0 wherever it is built */
  TCC_IX_MIN,     /* min(a, c) */
  TCC_IX_MAX,     /* max(a, c) */
  TCC_IX_VALUE,   /* the int64 value of expression v, checked to lie in
                     [0, c): an index read from a tensor (gather,
                     index_select, embedding). Out of range sets the
                     kernel's error flag and reads index 0. */
} tcc_ix_kind;

typedef struct tcc_ix tcc_ix;
typedef struct tcc_vx tcc_vx;
struct tcc_ix {
  tcc_ix_kind kind;
  int var;
  int64_t c;
  const tcc_ix *a, *b;
  const tcc_vx *v;           /* VALUE */
  uint32_t hash;
};

/* What a REDUCE folds with (tcc_vx.i). ANY/ALL are MAX/MIN over bool. */
typedef enum tcc_reduce_kind {
  TCC_RED_SUM,
  TCC_RED_PROD,
  TCC_RED_MAX,      /* NaN wins */
  TCC_RED_MIN,      /* NaN wins */
  TCC_RED_ARGMAX,   /* int64 flat index over the bound vars, first max; NaN wins */
  TCC_RED_ARGMIN,
} tcc_reduce_kind;

/* Library calls an EXTERN expression makes (tcc_vx.i). */
typedef enum tcc_extern_kind {
  TCC_EXT_GEMM,            /* C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] */
  /* oneDNN convolutions (CPU, float32; conv.c): a and b are whole
   * buffers (identity loads, read through their layouts), the result a
   * contiguous TEMP; idx holds the TCC_CONV_* parameters */
  TCC_EXT_CONV_FWD,        /* y[N, Cout, o..] from a = x, b = w */
  TCC_EXT_CONV_BWD_DATA,   /* gx[N, Cin, in..] from a = gy, b = w */
  TCC_EXT_CONV_BWD_WEIGHTS, /* gw[Cout, Cin/G, k..] from a = x, b = gy */
  /* Row index-add (CPU, float32/float64; lower_reduce.c): the embedding
   * backward's scatter-add out[ix[t], :] += a[t, :] over t, rows equal
   * to pad (and out of range) skipped; a = [T, D] and b = ix, int64 [T],
   * contiguous loads; the result a contiguous TEMP [V, D]; idx holds
   * V, D, T, pad */
  TCC_EXT_INDEX_ADD_ROWS
} tcc_extern_kind;

static inline int tcc_ext_is_conv(int i) {
  return i == TCC_EXT_CONV_FWD || i == TCC_EXT_CONV_BWD_DATA || i == TCC_EXT_CONV_BWD_WEIGHTS;
}

/* The constant parameters of a convolution EXTERN (its idx), in order:
 * spatial dims S (1..3), N, Cin, Cout, groups, then 3 slots each (the
 * first S used, the rest 0) of input size, kernel size, output size,
 * stride, padding, dilation; last, 1 for a transposed convolution
 * (oneDNN's deconvolution; W is then [Cin, Cout/G, k..]). */
enum {
  TCC_CONV_S, TCC_CONV_N, TCC_CONV_CIN, TCC_CONV_COUT, TCC_CONV_G,
  TCC_CONV_IN = 5, TCC_CONV_K = 8, TCC_CONV_O = 11, TCC_CONV_STRIDE = 14,
  TCC_CONV_PAD = 17, TCC_CONV_DIL = 20, TCC_CONV_TRANSPOSED = 23, TCC_CONV_NPARAM = 24
};

/* Loop variables i0..i15 are a kernel's (or a lowered value's) own dims;
 * REDUCE binds fresh variables numbered from TCC_FIRST_BOUND_VAR up. */
#define TCC_FIRST_BOUND_VAR TCC_MAX_DIMS

struct tcc_vx {
  tcc_prim op;
  tcc_dtype dtype;           /* dtype of the result */
  const tcc_vx *a, *b, *c;   /* operands (arity from TCC_PRIMS) */
  int buf;                   /* LOAD: buffer id; REDUCE: first bound var */
  int nidx;                  /* LOAD: one index per buffer dim; INDEX: 1;
                                REDUCE: bound vars; EXTERN: parameters */
  const tcc_ix *const *idx;  /* LOAD/INDEX: indices; REDUCE: constant
                                extent of each bound var; EXTERN: constant
                                parameters (GEMM: [batch, M, N, K];
                                convolutions: TCC_CONV_*) */
  double f;                  /* CONST of a float dtype */
  int64_t i;                 /* CONST of an integer/bool dtype; REDUCE:
                                tcc_reduce_kind; EXTERN: tcc_extern_kind */
  uint32_t hash;
  int depth;                 /* 1 + deepest operand (fuse.c bounds it) */
  int ops;                   /* size as a tree (shared operands counted
                                each time), saturating: recompute cost */
};

/* A hash-consing table (one for index, one for value expressions per
 * program) and the pointer map substitution memoizes with. */
typedef struct tcc_intern {
  void **slots;
  size_t cap, count;
} tcc_intern;

typedef struct tcc_ptrmap {
  const void **keys;
  const void **vals;
  size_t cap, count;
} tcc_ptrmap;

typedef struct tcc_program tcc_program;

/* Constructors. Each returns the unique expression with these fields, or
 * NULL when out of memory (NULL operands propagate NULL). Index
 * constructors fold constants and drop +0, *1. */
const tcc_ix *tcc_ix_const(tcc_program *p, int64_t c);
const tcc_ix *tcc_ix_var(tcc_program *p, int var);
const tcc_ix *tcc_ix_add(tcc_program *p, const tcc_ix *a, const tcc_ix *b);
const tcc_ix *tcc_ix_mul(tcc_program *p, const tcc_ix *a, int64_t c);
const tcc_ix *tcc_ix_div(tcc_program *p, const tcc_ix *a, int64_t c);   /* c > 0 */
const tcc_ix *tcc_ix_mod(tcc_program *p, const tcc_ix *a, int64_t c);   /* c > 0 */
const tcc_ix *tcc_ix_min(tcc_program *p, const tcc_ix *a, int64_t c);
const tcc_ix *tcc_ix_max(tcc_program *p, const tcc_ix *a, int64_t c);
/* a clamped into [0, n-1] (n >= 1): a read that a select discards. */
const tcc_ix *tcc_ix_clamp(tcc_program *p, const tcc_ix *a, int64_t n);
/* The int64 value of v as an index into a dim of size n (checked). */
const tcc_ix *tcc_ix_value(tcc_program *p, const tcc_vx *v, int64_t n);

const tcc_vx *tcc_vx_load(tcc_program *p, int buf, int nidx, const tcc_ix *const *idx);
const tcc_vx *tcc_vx_const(tcc_program *p, tcc_dtype dt, double f, int64_t i);
const tcc_vx *tcc_vx_cast(tcc_program *p, const tcc_vx *a, tcc_dtype dt);
const tcc_vx *tcc_vx_unary(tcc_program *p, tcc_prim op, const tcc_vx *a);
const tcc_vx *tcc_vx_binary(tcc_program *p, tcc_prim op, const tcc_vx *a, const tcc_vx *b);
/* Comparisons / ISNAN / ISINF / logical ops: a bool result. */
const tcc_vx *tcc_vx_pred(tcc_program *p, tcc_prim op, const tcc_vx *a, const tcc_vx *b);
/* cond ? a : b (cond bool, a and b of one dtype). */
const tcc_vx *tcc_vx_where(tcc_program *p, const tcc_vx *cond, const tcc_vx *a, const tcc_vx *b);
/* The value of index expression e (int64). */
const tcc_vx *tcc_vx_index(tcc_program *p, const tcc_ix *e);
/* Folds body over nred bound variables first_var.. with extents sizes;
 * result dtype dt (int64 for ARGMAX/ARGMIN). */
const tcc_vx *tcc_vx_reduce(tcc_program *p, tcc_reduce_kind kind, tcc_dtype dt,
                            const tcc_vx *body, int first_var, int nred, const int64_t *sizes);
/* EXTERN call with nparams constant parameters. GEMM: a over (b, m, k),
 * b over (b, k, n), params [batch, M, N, K]; convolutions: see
 * tcc_extern_kind. */
const tcc_vx *tcc_vx_extern(tcc_program *p, tcc_extern_kind kind, tcc_dtype dt,
                            const tcc_vx *a, const tcc_vx *b, int nparams, const int64_t *params);
/* n fresh bound variables; returns the first. */
int tcc_program_fresh_vars(tcc_program *p, int n);
/* Bit d set when e reads kernel variable i<d> (d < TCC_MAX_DIMS) free. */
uint32_t tcc_vx_kernel_vars(const tcc_vx *e);
uint32_t tcc_ix_kernel_vars(const tcc_ix *e);
/* The VALUE nodes of index x (not those inside their expressions), at
 * most cap of them into out; returns how many. */
int tcc_ix_values(const tcc_ix *x, const tcc_ix **out, int cap);
/* Does e contain a REDUCE (outside index values)? */
int tcc_vx_has_reduce(const tcc_vx *e);
/* Is op itself costly: a division, square root or transcendental
 * function? */
int tcc_prim_costly(tcc_prim op);
/* Does e compute something costly (tcc_prim_costly; not looking past
 * loads)? memo: a map the caller owns, shared across calls. */
int tcc_vx_costly(const tcc_vx *e, tcc_ptrmap *memo);

/* e with its operands replaced (same op, dtype, load indices, literal). */
const tcc_vx *tcc_vx_with_operands(tcc_program *p, const tcc_vx *e, const tcc_vx *a,
                                   const tcc_vx *b, const tcc_vx *c);

/* e with loop variable i<k> replaced by idx[k] (k < n). NULL when out of
 * memory. Shared subexpressions stay shared. */
const tcc_vx *tcc_vx_subst(tcc_program *p, const tcc_vx *e, int n, const tcc_ix *const *idx);
const tcc_ix *tcc_ix_subst(tcc_program *p, const tcc_ix *e, int n, const tcc_ix *const *idx);

/* Pointer -> pointer map (memo tables). init returns 0 or -1 (OOM); put
 * returns 0 or -1; get returns NULL when absent. cap: a power of two. */
int tcc_ptrmap_init(tcc_ptrmap *m, size_t cap);
const void *tcc_ptrmap_get(const tcc_ptrmap *m, const void *k);
int tcc_ptrmap_put(tcc_ptrmap *m, const void *k, const void *v);
void tcc_ptrmap_free(tcc_ptrmap *m);

/* Affine form of e over variables 0..nvars-1: e == c + sum coef[v]*i<v>.
 * Returns 1 when e is affine (coef/c filled), 0 when not. */
int tcc_ix_affine(const tcc_ix *e, int nvars, int64_t *coef, int64_t *c);

/* Affine form of the storage offset sum_d strides[d] * idx[d] over
 * variables 0..nvars-1, seeing through the floor-div/mod pairs a reshape
 * makes (s*(e/c) + t*(e mod c) with s == c*t is t*e). Returns 1 when
 * affine (coef, c filled), 0 when not. */
int tcc_linear_affine(int n, const tcc_ix *const *idx, const int64_t *strides, int nvars,
                      int64_t *coef, int64_t *c);
/* The storage offset of a GEMM operand e (a load over (b, row, col)) as
 * an affine form over those vars (tcc_linear_affine), leaving out the
 * dims that read the batch var b. Returns 1 when affine, else 0. */
int tcc_gemm_operand_affine(const tcc_program *p, const tcc_vx *e, int64_t *coef, int64_t *c);

/* ----------------------------------------------------- the program */

typedef enum tcc_bufkind {
  TCC_BUF_INPUT,    /* inputs[pos] of tcc_entry */
  TCC_BUF_OUTPUT,   /* outputs[pos] */
  TCC_BUF_CONST,    /* constant data, emitted into the artifact */
  TCC_BUF_TEMP,     /* intermediate, in the workspace */
} tcc_bufkind;

typedef struct tcc_buffer {
  tcc_bufkind kind;
  int pos;                  /* INPUT/OUTPUT: position; CONST: constant number */
  tcc_meta layout;          /* dtype, sizes, strides, storage offset */
  const uint8_t *data;      /* CONST: row-major elements */
  size_t data_len;
  int value;                /* graph value held (for dumps), -1 none */
  int64_t ws_offset;        /* TEMP: byte offset in the workspace (place.c) */
  int written_in_place;     /* INPUT: index_put_ stores into it (the
                               caller's tensor, written where it lies) */
  int dead;                 /* removed by a pass */
} tcc_buffer;

typedef struct tcc_store {
  int buf;
  const tcc_ix *const *idx; /* one per buffer dim */
  const tcc_vx *value;
} tcc_store;

typedef struct tcc_kernel {
  tcc_op_kind kind;         /* POINTWISE (which may hold REDUCEs) or EXTERN
                               (one store of an EXTERN expression) */
  int rank;
  int64_t sizes[TCC_MAX_DIMS];  /* iteration space */
  int nstores, capstores;
  tcc_store *stores;
  int dead;                 /* removed by a pass */
  int nnodes, capnodes;     /* provenance: the graph nodes (canonical */
  int *nodes;               /* indices) this kernel computes, for the
                               manifest and `tcctl show --dot`; a node
                               inlined into several kernels is in each */
} tcc_kernel;

struct tcc_program {
  tcc_arena *arena;         /* owns everything (the compile's arena) */
  const tcc_graph *graph;
  int nbufs, capbufs;
  tcc_buffer *bufs;
  int nkernels, capkernels;
  tcc_kernel *kernels;
  int64_t workspace_bytes;
  int planned;              /* place.c has placed the temporaries */
  tcc_intern ix_intern, vx_intern;
  int next_var;             /* next fresh bound variable (REDUCE) */
  int cur_node;             /* node being lowered (provenance of new
                               kernels), -1 outside node lowering */
  int oom;                  /* an allocation failed (sticky) */
  /* split.c, while it rewrites a kernel: the extent of each kernel
   * variable, so tcc_ix_div/tcc_ix_mod can split c*i_hi + i_lo; NULL
   * otherwise */
  const int64_t *ix_extent;
  int ix_nextent;
  /* tune.c: how each live kernel is generated (kcfg[k] for live kernel k;
   * NULL or a default config = the default code); read by the targets'
   * schedule passes. */
  const tcc_kernel_config *kcfg;
  int nkcfg;
  /* tune.c's signatures: each CPU kernel printed whole, no shared bodies
   * (cpu/emit.c), so a kernel's text runs from its head to the next's */
  int whole_kernels;
  /* the schedule pass (target.h): the target's decisions, in the arena;
   * NULL before it runs */
  union {
    struct tcc_cpu_schedule *cpu;
    struct tcc_cuda_schedule *cuda;
  } sched;
};

/* Initializes an empty program over graph g in arena a. */
void tcc_program_init(tcc_program *p, tcc_arena *a, const tcc_graph *g);
/* Frees what the program allocated outside its arena. */
void tcc_program_free(tcc_program *p);
/* Appends a buffer / kernel; returns its id, or -1 when out of memory. */
int tcc_program_add_buffer(tcc_program *p, const tcc_buffer *b);
int tcc_program_add_kernel(tcc_program *p, int rank, const int64_t *sizes);
/* Adds the nodes of kernel `from` to kernel `to`'s provenance (a set).
 * Returns 0 or -1 (out of memory). */
int tcc_kernel_add_nodes(tcc_program *p, int to, int from);
/* Appends a store to kernel k. Returns 0 or -1 (out of memory). */
int tcc_kernel_add_store(tcc_program *p, int k, int buf, const tcc_ix *const *idx,
                         const tcc_vx *value);
/* Live kernels (not dead). */
int tcc_program_live_kernels(const tcc_program *p);

/* ----------------------------------------------------------- lower.c */

/* A graph value during lowering (see the header comment). */
typedef struct tcc_lval {
  int rank;
  int64_t sizes[TCC_MAX_DIMS];
  tcc_dtype dtype;
  const tcc_vx *body;       /* over i0..i{rank-1}; NULL: not lowered */
} tcc_lval;

struct tcc_lower_ctx {
  tcc_program *prog;
  const tcc_graph *g;
  tcc_lval *vals;           /* per graph value */
  int *out_buf;             /* per graph output position: its buffer */
  unsigned char *channels_last;  /* per graph value: realized channels last (conv.c) */
  /* GEMM operands packed so far (lower_matmul.c), so that a body packed
   * for one GEMM is read by every other that needs the same array: BERT's
   * backward packs an attention gradient for dX and, transposed, for dW */
  struct tcc_gemm_pack {
    const tcc_vx *body;     /* interned: equal bodies are one pointer */
    int64_t sizes[3];
    tcc_dtype dt;
    const tcc_vx *packed;   /* its load over (b, r, c) */
  } gemm_packs[16];       /* the last 16: slot ngemm_packs % 16 is next */
  int ngemm_packs;        /* packs made */
  /* Means lowered so far (lower_reduce.c), so that a graph's mean and the
   * mean inside its var or std of the same value over the same dims are
   * one REDUCE (bound variables and all): computed once, and the column
   * sums' stages see the variance's mean among their sums */
  struct tcc_mean_memo {
    int v;                  /* the graph value averaged */
    uint32_t mask;          /* over these dims */
    int keepdim;
    tcc_dtype dt;           /* in this dtype */
    const tcc_vx *mean;
  } means[16];            /* the last 16: slot nmeans % 16 is next */
  int nmeans;             /* means made */
};

/* Lowers the canonical graph into p. Returns 0, TCC_E_UNIMPLEMENTED (a
 * dtype the backend cannot do yet, naming the node), or
 * TCC_E_RESOURCE_EXHAUSTED. */
int tcc_lower(tcc_program *p, tcc_error *err);
/* conv.c, before any node is lowered: marks in lc->channels_last the
 * values that feed a CPU convolution step and are realized inside the
 * graph, so that activations between convolutions are stored channels
 * last, the layout oneDNN's kernels read without a reorder. */
void tcc_conv_plan_layouts(tcc_lower_ctx *lc);

/* For lowering functions: the body of tensor argument `a` read at the
 * output index space (rank, sizes) with broadcasting, cast to dt. */
const tcc_vx *tcc_lower_operand(tcc_lower_ctx *lc, const tcc_arg *a, int rank,
                                const int64_t *sizes, tcc_dtype dt);
/* Realizes `body` as the value of node output o: a buffer and a kernel
 * that writes it (an output buffer when the value is a graph output). */
int tcc_lower_realize(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body,
                      tcc_error *err);

/* A contiguous TEMP buffer of `sizes` in dt on the graph's device.
 * Returns its id, or -1 (out of memory). */
int tcc_lower_temp(tcc_lower_ctx *lc, int rank, const int64_t *sizes, tcc_dtype dt);
/* A contiguous TEMP of `sizes` in dt that a kernel of its own writes with
 * body (over the identity vars i0..i{rank-1}), for a lowering that reads
 * a value in an order fusion would make slow (a GEMM operand, im2col
 * columns, attention's probabilities). Returns the buffer id, or -1 (out
 * of memory, or body NULL). */
int tcc_lower_pack(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                   tcc_dtype dt);
/* The same into a TEMP laid out channels last (tcc_meta_channels_last). */
int tcc_lower_pack_channels_last(tcc_lower_ctx *lc, const tcc_vx *body, int rank,
                                 const int64_t *sizes, tcc_dtype dt);

/* A GEMM step C[b, m, n] = sum_k A[b, m, k] B[b, k, n] (an EXTERN kernel
 * into a TEMP; an operand BLAS cannot read as it is gets packed first):
 * a over (b, m, k), b over (b, k, n), dt float32/float64. Returns a load
 * of C over (b, m, n), or NULL when out of memory. For conv.c. */
const tcc_vx *tcc_lower_gemm(tcc_lower_ctx *lc, const tcc_vx *a, const tcc_vx *b, int64_t batch,
                             int64_t M, int64_t N, int64_t K, tcc_dtype dt);

/* ------------------------------------------------------------ fuse.c */

/* Deepest value expression fusion builds; a producer whose inlining would
 * go deeper stays a buffer. Bounds every recursive walk over expressions. */
#define TCC_MAX_EXPR_DEPTH 256
/* A producer read by several kernels is inlined (recomputed in each) only
 * while its expression has at most this many operations; beyond, it is
 * computed once into a buffer (TorchInductor's realize heuristics). */
#define TCC_MAX_SHARED_INLINE_OPS 64
/* ... and, when it has at least TCC_STREAM_MIN_ELEMENTS elements, while it
 * streams at most TCC_MAX_SHARED_INLINE_STREAMS buffers of at least half
 * its own size (a select counts its larger branch): a pre-LN
 * transformer's residual stream, x + y1 + y2 + ..., was re-read whole by
 * every layer norm after it (fuse.c: streams). Smaller buffers (4 MB of
 * float32, twice a core's L2 on the Xeon VM) are re-read from cache,
 * where a kernel more costs more than the re-reading (a decode step's
 * rows: GPT-2's and the Llama decoder's steps 2-5% slower with the bound
 * at every size). */
#define TCC_MAX_SHARED_INLINE_STREAMS 2
#define TCC_STREAM_MIN_ELEMENTS (1 << 20)
/* ... and one stored anyway is recomputed in a consumer that cannot merge
 * with it only up to this many operations (fuse.c). */
#define TCC_MATERIALIZED_INLINE_OPS 8
/* ... and one a consumer would recompute at least TCC_AMPLIFIED_FACTOR
 * times per element (a window gather such as im2col reads each element
 * once per kernel tap, and the index arithmetic cannot be hoisted) is
 * computed once into a buffer when it has more than this many operations. */
#define TCC_AMPLIFIED_INLINE_OPS 2
#define TCC_AMPLIFIED_FACTOR 2
/* How far back (in live kernels) fusion looks for a kernel to merge into. */
#define TCC_FUSE_WINDOW 256

/* Inlines pointwise producers, removes unread temporaries, merges kernels
 * over equal iteration spaces. Returns 0 or TCC_E_RESOURCE_EXHAUSTED. */
int tcc_fuse(tcc_program *p, tcc_error *err);

/* ------------------------------------------------------------ split.c */

/* Splits each dim that a pointwise kernel without reductions reads as
 * i / c and i % c (c dividing its size) into two loops; nothing for a
 * program with symbols. Returns 0 or TCC_E_RESOURCE_EXHAUSTED. */
int tcc_split_dims(tcc_program *p, tcc_error *err);

/* ----------------------------------------------------------- place.c */

/* Gives live temporaries workspace offsets (64-byte aligned) and sets
 * workspace_bytes. Returns 0 or TCC_E_RESOURCE_EXHAUSTED (overflow). */
int tcc_place_buffers(tcc_program *p, tcc_error *err);

/* ----------------------------------------------------------- check.c */

/* IR checker for programs (what every pass must preserve): ids in range,
 * index counts match buffer ranks, indices stay in bounds, dtypes agree,
 * every output written exactly once and never read before, inputs and
 * constants never written. Returns 0 or TCC_E_INTERNAL. */
int tcc_check_program(const tcc_program *p, tcc_error *err);

/* ------------------------------------------------------------ dump.c */

void tcc_dump_program(const tcc_program *p, tcc_buf *b);
void tcc_dump_ix(const tcc_ix *e, tcc_buf *b);

/* --------------------------------------------------------- csource.c */

/* v (finite) as an exact C99 hexadecimal literal ("0x1.8p+1",
 * "-0x0p+0"), built from its bits. */
void tcc_put_hexfloat(tcc_buf *b, double v);
/* v as INT64_C(v) (INT64_MIN by name). */
void tcc_put_int64(tcc_buf *b, int64_t v);
/* How a C-family target spells what C99 and CUDA C differ in. */
typedef struct tcc_dialect {
  const char *(*ctype)(tcc_dtype d);   /* a dtype's C type */
  const char *constant_qualifiers;     /* "static const", "__device__ const" */
  int half_constants_as_values;        /* float16 constants as values (_Float16), else bits */
  int halves_in_float;                 /* float16/bfloat16 math and literals in float ("f") */
  const char *nan_f32, *nan_f64, *inf_f32, *inf_f64;  /* NaN and infinity */
  const char *round;                   /* round half to even: "nearbyint", "rint" */
  int isinf_by_fabs;                   /* isinf as fabs(x) == inf, else isinf(x) */
  const char *div_flag;                /* extra argument of integer division helpers
                                          (", &bad": division by zero flagged) */
  int typed_float_helpers;             /* tcc_floordiv_f32/_f64, else one template */
} tcc_dialect;

/* An exact literal of float v in dtype d. */
void tcc_c_put_float(const tcc_dialect *D, tcc_buf *b, double v, tcc_dtype d);
/* The literal of a CONST expression. */
void tcc_c_put_literal(const tcc_dialect *D, tcc_buf *b, const tcc_vx *e);
/* INT8_MAX, ... of an integer dtype (uint8 and bool: 255 / 0). */
const char *tcc_c_int_limit(tcc_dtype d, int high);
/* Constant buffer B as the array b<id>_data with its elements. */
void tcc_c_put_constant(const tcc_dialect *D, tcc_buf *b, const tcc_buffer *B, int id);
/* The guard of a store at indices idx[0..rank) read from tensors
 * (index_put_ into an input): "if (v0 < n0 && ...) " over the raw index
 * values, each printed by text(ctx, value, ...), or nothing when no
 * index reads one. The checked index falls back to 0 out of range, which
 * a load may read but a store must not write. */
typedef void tcc_operand_text_fn(void *ctx, const tcc_vx *e, char *out, size_t cap);
void tcc_c_put_store_guard(tcc_buf *b, const tcc_ix *const *idx, int rank, tcc_operand_text_fn *text, void *ctx);
/* Primitive op of result dtype d over operand texts x, y, z whose
 * operand dtype is od. */
void tcc_c_put_prim(const tcc_dialect *D, tcc_buf *b, tcc_prim op, tcc_dtype d, tcc_dtype od, const char *x,
                    const char *y, const char *z);
/* The initializer of constant buffer B's elements, "{...};\n": floats
 * exact, integers as decimals, bfloat16 as its bits, float16 as its value
 * or its bits (the dialect's half_constants_as_values). */
void tcc_put_constant_elements(const tcc_dialect *D, tcc_buf *b, const tcc_buffer *B);
/* The unsigned type integer arithmetic of dtype d wraps in (uint64_t for
 * int64, uint32_t for the narrower ones). */
const char *tcc_utype(tcc_dtype d);

/* ---------------------------------------------------------- pipeline.c */

/* tcc_compile without the build: lower, fuse, plan, emit. *source is
 * malloc'ed; *kernels (may be NULL) gets the kernel count. For the fuzzer
 * and tests. Returns 0 or a TCC_E_* code. */
int tcc_generate_source(const tcc_prepared *p, char **source, size_t *len, int *kernels,
                        tcc_error *err);

/* tcc_generate_source with every kernel printed whole (no shared bodies):
 * tune.c's kernel signatures. */
int tcc_generate_source_whole(const tcc_prepared *p, char **source, size_t *len, int *kernels,
                              tcc_error *err);

/* tcc_generate_source with configs[0..nconfigs) applied to the live
 * kernels in order, as tcc_compile_tuned does (static shapes only). For
 * tcc-gen-sources, the refactoring check. */
int tcc_generate_source_tuned(const tcc_prepared *p, const tcc_kernel_config *configs,
                              int nconfigs, char **source, size_t *len, tcc_error *err);

/* ----------------------------------------------------------- dynamic.c */

/* The symbol assignments a dynamic compile probes (dynamic.c's header):
 * fills assign[0..n) and returns n (2^nsyms corners, then a large and a
 * small one). */
int tcc_dyn_probes(const tcc_graph *g, int64_t (*assign)[TCC_MAX_SYMS]);

/* The multilinear polynomial over k symbols through vals[p] at assign[p]
 * (fitted at the corners, checked at every probe): coef[mask] multiplies
 * the product of the symbols in mask. Returns 0, or -1 when there is none
 * with int64 coefficients. */
int tcc_dyn_fit(int k, int nprobes, const int64_t (*assign)[TCC_MAX_SYMS], const int64_t *vals,
                int64_t *coef);

/* Merges the C sources src[0..nprobes) generated at the probes into one
 * source over the runtime symbols tcc_S[] (*nsymbolic: how many numbers
 * became expressions). Returns 0, TCC_E_UNIMPLEMENTED naming where the
 * sources differ in a way no size expression explains, or
 * TCC_E_RESOURCE_EXHAUSTED. */
int tcc_dyn_fit_source(int k, int nprobes, const int64_t (*assign)[TCC_MAX_SYMS],
                       const char *const *src, tcc_buf *out, int *nsymbolic, tcc_error *err);


/* ----------------------------------------------------------- kconfig.c */

/* The config of live kernel kno (NULL when it is the default). */
const tcc_kernel_config *tcc_kernel_config_of(const tcc_program *p, int kno);

#endif
