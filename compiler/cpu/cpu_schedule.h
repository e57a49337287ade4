/*
 * cpu_schedule.h — the CPU target (tcc_target_cpu, target.h): its
 * schedule, which schedule.c decides and emit.c prints.
 *
 *   schedule.c   per kernel: the loop nest (dims of size 1 dropped, loop
 *                order, merged dims), where each value is computed (loop
 *                levels: loop-invariant code motion), the parallel loop,
 *                SIMD and unrolling of the element loop, border peeling,
 *                column sums, unrolled windows, merged reduction loops;
 *                per GEMM step: the library road and its threading, or
 *                a kernel of its own that streams few rows' weight; the
 *                schedule's checker and dump
 *   emit.c       C for the scheduled program (printing only)
 *   prelude.c    the helpers every translation unit starts with
 *   build.c      the system C compiler -> .so
 *   target.c     tcc_target_cpu and its tuning candidates
 */
#ifndef TCC_CPU_SCHEDULE_H
#define TCC_CPU_SCHEDULE_H

#include "target.h"

#define TCC_CPU_MAX_ACCESS 4096
#define TCC_CPU_MAX_PEEL 16
#define TCC_CPU_MAX_RANGES 64    /* most ranges of a range-split loop */
#define TCC_CPU_PAR_RANGES 8     /* ... of the parallel loop (a region each) */
/* Parallelize the outermost loop of size > 1 above this much work. */
#define TCC_PARALLEL_WORK 65536.0
/* A GEMM step (all of its batch) of at least this many flops runs on the
 * OpenMP threads: 64 x 64 x 64 and up gained 1.3-3.4x on 2 cores; 32 x
 * 32 x 64 did not. */
#define TCC_GEMM_PARALLEL_FLOPS 524288.0

/* One distinct access (buffer, index list) of a kernel, with its linear
 * storage index as an affine form over the kernel's vars when it is one. */
typedef struct tcc_cpu_access {
  int buf;
  const tcc_ix *const *idx;   /* per buffer dim */
  int64_t coef[TCC_MAX_DIMS];
  int64_t c;                  /* includes the storage offset */
} tcc_cpu_access;

/* The loop nest of a kernel. */
typedef struct tcc_cpu_nest {
  int affine;                 /* loops planned (merged), accesses affine */
  int permuted;               /* dim-order nest whose loops follow the first store's strides */
  int pos[TCC_MAX_DIMS];      /* dim-order nests: the loop of kernel dim d */
  int nloops;
  int64_t size[TCC_MAX_DIMS];
  int dims[TCC_MAX_DIMS][TCC_MAX_DIMS];  /* kernel dims merged into loop j, outer first */
  int ndims[TCC_MAX_DIMS];
} tcc_cpu_nest;

/* An extern GEMM step, C[b] = A[b] . B[b]. */
typedef struct tcc_cpu_gemm {
  int onednn;                 /* oneDNN's dnnl_sgemm; else cblas_?gemm (OpenBLAS) */
  int trans[2];               /* A, B stored transposed */
  int64_t ld[2];              /* their leading dimensions */
  int batch_par;              /* the batch on the OpenMP threads */
  int slab_par;               /* one GEMM cut into a slab per OpenMP thread */
  int by_rows;                /* slabs of C's rows (else columns) */
  int serial;                 /* oneDNN on one thread */
  int blas_threads;           /* OpenBLAS threads for the call (0: as set) */
  /* Few rows against a weight stored [N, K] (nn.Linear's): a generated
   * kernel reads stream_rows rows of the weight at a time, each once, and
   * dots them with every row of A (tcc_cpu_gemm_stream_rows); 0: the
   * library road above. */
  int stream_rows;
  int stream_width;           /* its (or split_k's) vector width in floats (8: AVX2, 16: AVX-512) */
  int stream_par;             /* its blocks of weight rows on the OpenMP threads */
  /* k in chunks of this many floats (a multiple of 64) where A's rows
   * would not stay in L1 (TCC_CPU_STREAM_L1): each group of
   * TCC_CPU_STREAM_GROUP blocks runs chunk by chunk, adding into C; 0:
   * one pass over k. */
  int64_t stream_kc;
  /* Up to 8 rows against a weight stored [K, N] (GPT-2's Conv1D): each
   * thread reads one contiguous run of the weight's rows, split_k rows a
   * pass, adding x[m, k] W[k, :] into partial rows of its own; the
   * partial rows are added. 0: not split. split_k_par: on the OpenMP
   * threads. */
  int split_k;
  int split_k_par;
  /* 9 to 32 rows against a weight stored [K, N] on AVX-512: K split as
   * above, each thread's run in passes of split_k_tiled rows through
   * register tiles of 8 rows x 48 columns into partial rows of its own
   * (from the heap); split_k_par threads it. 0: not. */
  int split_k_tiled;
  /* One side narrow (13 to 64 rows or columns; AVX-512,
   * tcc_cpu_gemm_narrow): the narrow operand is packed into vectors of
   * narrow_vecs x 16 floats a k, and the wide one's rows along k are
   * streamed narrow_rows a block, each element broadcast against those
   * vectors, so that each is read once: 13-64 rows against nn.Linear's
   * weight (narrow_b: B is the streamed one, stored [N, K], and C is
   * stored from the tiles transposed), or many rows against 13-64
   * columns. 0: not narrow. narrow_par: its blocks on the OpenMP
   * threads. */
  int narrow_rows;
  int narrow_vecs;
  int narrow_b;
  int narrow_par;
  /* oneDNN's GEMMs on a busy machine (share.c): blocks of share_rows x
   * share_cols of each batch entry's C are the chunks the helper thread
   * may take, each a one-thread dnnl_sgemm into a tile; 0: not shared. */
  int64_t share_rows, share_cols;
} tcc_cpu_gemm;

/* A's rows in a streamed GEMM are read once for each block of weight
 * rows: when they exceed TCC_CPU_STREAM_L1 bytes they come from L2 on
 * every block, so k runs in chunks whose slice of A takes about
 * TCC_CPU_STREAM_A_BYTES; a group of TCC_CPU_STREAM_GROUP blocks reads
 * each chunk of A into L1 once. */
#define TCC_CPU_STREAM_L1 32768
#define TCC_CPU_STREAM_A_BYTES 18432
#define TCC_CPU_STREAM_GROUP 8
/* A split-K GEMM's chunk for the helper thread (share.c): about this
 * many bytes of the weight's rows (at least one pass). */
#define TCC_CPU_SPLIT_K_CHUNK 131072
/* A split-K-tiled GEMM's chunk for the helper thread: up to this many
 * runs of 48 of C's columns over all of K, fewer where that leaves C
 * fewer than 4 chunks (with one run, 192 bytes of each weight row a
 * pass, GPT-2's 32-row GEMMs shared no faster than the calling thread
 * alone ran them: design.md). */
#define TCC_CPU_SPLIT_K_TILED_RUNS 8
/* The largest tile of a chunk shared with the helper thread, in floats
 * (share.c's TCC_SHARE_TILE). */
#define TCC_CPU_SHARE_TILE 131072
#define TCC_CPU_SHARE_MAX 8192   /* the most chunks of a job */
/* A oneDNN GEMM step of at least this many flops shares blocks of C with
 * the helper, each of about TCC_CPU_SHARE_BLOCK_FLOPS (at most
 * TCC_CPU_SHARE_COLS columns, TCC_CPU_SHARE_TILE floats): design.md; a
 * convolution step (forward, backward data) its images
 * (runtime/onednn_conv.c). */
#define TCC_CPU_SHARE_FLOPS 4194304.0
#define TCC_CPU_SHARE_BLOCK_FLOPS 201326592.0
#define TCC_CPU_SHARE_COLS 512

/* The most rows of A for which a CPU float32 GEMM A[M, K] . W^T, W stored
 * [N, K], streams W's rows rather than calling a library on the ISA
 * ("x86-64-v3", "x86-64-v4"); 0 where it never does. From 2 rows to this
 * many, oneDNN's dnnl_sgemm reads the weight at about half the memory's
 * speed whichever way it is transposed (design.md, "Few rows"). */
int tcc_cpu_gemm_stream_rows(const char *isa);

/* Does a float32 GEMM of one batch with `narrow` rows (or columns)
 * against `wide` columns (or rows) over k run the narrow road on the ISA
 * (plan_narrow: AVX-512, 13-64 narrow, at least 64 and 4 x narrow wide,
 * k at least 32), given the wide operand's rows run along k? */
int tcc_cpu_gemm_narrow(const char *isa, int64_t narrow, int64_t wide, int64_t K);

#define TCC_CPU_MAX_GROUP 64   /* reductions sharing one loop */
#define TCC_CPU_COL_BLOCK 128  /* most columns per block of column sums */
#define TCC_CPU_COL_SUMS 8     /* at most this many sums per block */
#define TCC_CPU_WINDOW 16      /* reductions of at most this many steps unroll */
#define TCC_CPU_MERGE_BELOW 64 /* innermost reduction loops shorter than this merge */
#define TCC_CPU_EXP_MASKED 1   /* inline_exp: why a kernel's exps print tcc_expf */
#define TCC_CPU_EXP_ALL 2
#define TCC_CPU_EXP_LE0 8      /* exps known <= 0 a kernel notes (exp_le0) */
#define TCC_CPU_COL_VALUES 16  /* column values per kernel (tcc_cpu_kernel_schedule) */
#define TCC_CPU_COL_BYTES 65536  /* ... their arrays (on the caller's stack, 8 bytes
                                    an element counted) at most this big */

#define TCC_CPU_PREFETCH 2      /* next-row prefetch streams per kernel */
#define TCC_CPU_LINE 64         /* bytes per cache line (prefetch steps) */
#define TCC_CPU_PREFETCH_AHEAD 4096 /* the next-row prefetch reads the first
                                 row at least this many bytes on */

/* A stream the next-row prefetch touches (tcc_cpu_kernel_schedule):
 * buffer buf's elements c + sum coef[t] * i<var[t]> + i<v>q for the
 * prefetching loop's var v, step elements apart (one cache line). The
 * form is a load of the first reduction's at the row after the current
 * one (the row var's loop is guarded so that this row exists), or a
 * store of the element loop's at the current row. */
typedef struct tcc_cpu_prefetch {
  int buf;
  int64_t c;
  int nterm;
  int var[TCC_MAX_DIMS];
  int64_t coef[TCC_MAX_DIMS];
  int64_t step;
} tcc_cpu_prefetch;

/* How one kernel runs. */
typedef struct tcc_cpu_kernel_schedule {
  int live;                   /* 0 for dead kernels (nothing else set) */
  int kno;                    /* live-kernel number (the j of k<j>) */
  tcc_cpu_nest nest;
  tcc_cpu_access *acc;        /* distinct accesses, stores first */
  int nacc;
  /* kernel-level nodes (not inside reductions) in emission order, the
   * loop level each is computed at (0: before the loops, l: inside loop
   * l - 1), and each store's level */
  const tcc_vx **nodes;
  int *levels;
  int nnodes;
  int *store_levels;
  /* sibling reductions: for each kernel-level REDUCE node, the index (in
   * nodes) of the one that leads its group, itself when it leads; -1 for
   * other nodes. A group's reductions share one reduction loop. */
  int *red_lead;
  /* per node: 1 for the REDUCE nodes whose two innermost reduction loops
   * run as one (their accesses read them as one contiguous run: a batch
   * norm's H and W), 0 otherwise */
  int *red_merged;
  int *used;                  /* buffers the kernel touches, sorted */
  int nused;
  int par;                    /* the loop run `omp parallel for`, -1: none */
  int par_at_run_time;        /* dynamic programs: if() over the work */
  int tuned;                  /* a tuning config shapes the pragmas */
  int threads, chunk;         /* its num_threads / schedule chunk (0: none) */
  int inner_red;              /* a reduction loop sits in the element loop */
  int window_unrolled;        /* ... each of at most TCC_CPU_WINDOW steps (a
                                 pooling window): its loops unrolled, so the
                                 element loop may run `omp simd` */
  int simd;                   /* the element loop runs `omp simd` */
  int simdlen;                /* its simdlen (0: the compiler's) */
  int unroll;                 /* else `GCC unroll` of the element loop (0: none) */
  /* next-row prefetch: in a row kernel whose first reduction reads each
   * row from memory and whose second one (prefetch_red, the same
   * extent) reads it again from cache, the second's loop touches the
   * next row's lines of the first's loads, a block at a time, so that
   * memory works while the later passes compute (plan_row_prefetch);
   * row_var's loop (size row_n) is the innermost around them; "next" is
   * row_ahead rows on, the first at least TCC_CPU_PREFETCH_AHEAD bytes
   * away (a short row's next one is too near for its lines to come in
   * time); NULL: none */
  const tcc_vx *prefetch_red;
  int prefetch_elem;          /* ... or, with no second reduction, the
                                 element loop in blocks, each touching the
                                 next row's block first (rms norm) */
  int row_var;
  int64_t row_n, row_ahead;
  int nprefetch;
  tcc_cpu_prefetch prefetch[TCC_CPU_PREFETCH];
  /* ... and the current row's lines of the element loop's stores, for
   * writing, touched a block at a time by the loop of the pass before it
   * (store_prefetch_red: prefetch_red, or the first reduction when the
   * element loop is the second pass), so that the stores' reads for
   * ownership do not stall a final pass that computes little (log
   * softmax, layer norm); not the stores a reduction's loop writes first
   * (kept_red) */
  const tcc_vx *store_prefetch_red;
  int nstore_prefetch;
  tcc_cpu_prefetch store_prefetch[TCC_CPU_PREFETCH];
  int inline_exp;             /* its float32 exps print tcc_expf (prelude.c):
                                 TCC_CPU_EXP_MASKED, an argument holds a
                                 constant below -87 (a mask's -inf,
                                 finfo.min); TCC_CPU_EXP_ALL, x86-64-v4 */
  /* ... and those of them whose argument is x - max(x) (a softmax's: <= 0
   * or NaN) print tcc_expf_le0 / tcc_expf_ftz_le0, without the clamp and
   * the select for an argument above 88.7 */
  int nexp_le0;
  const tcc_vx *exp_le0[TCC_CPU_EXP_LE0];
  /* a sum whose summand the store's value holds as well (softmax: exp(x -
   * max) / sum(exp(x - max))): its loop stores each summand into the
   * store's buffer (kept_idx: the store's index at the reduction's bound
   * variable), and the element loop loads kept_node from there instead of
   * computing it again; NULL: none */
  const tcc_vx *kept_red, *kept_node;
  const tcc_ix *const *kept_idx;
  /* a row staged in the output (plan_staged_row: masked scores read by a
   * max's loop and a sum's): before staged_red's loop, a loop stores its
   * argument staged_red_node into the store's buffer (staged_idx: the
   * store's index at its bound variable); staged_red's loop loads it back,
   * so does the next reduction's loop (staged_next_node, at
   * staged_next_idx), and the element loop (staged_node, at the store's
   * index; NULL where a kept summand overwrote it); NULL: none */
  const tcc_vx *staged_red, *staged_red_node, *staged_next_node, *staged_node;
  const tcc_ix *const *staged_idx, *const *staged_next_idx;
  /* column sums (a bias's gradient: a matrix summed over its rows):
   * the element loop runs in blocks of this many columns, each block's
   * sums in arrays, the reduction loops outside a SIMD loop over the
   * block's columns; 0: none */
  int col_block;
  /* column values (a batch norm's 1 / sqrt(var + eps) when the channel
   * is the element loop's dim, in channels-last epilogues): values of the
   * element loop of a planned nest that depend on that loop's dims alone
   * and compute something costly (col_costly), each computed once per
   * call into an array over the element loop before the loops, and
   * loaded from it there; at most TCC_CPU_COL_VALUES of them */
  const tcc_vx *col_vals[TCC_CPU_COL_VALUES];
  int ncol_vals;
  /* range split (plan_range_split): a loop of a dim-order nest whose
   * var the kernel compares with constants (a concatenation's "which
   * input": i1 < 128 ? x : i1 < 160 ? y : ...) runs as consecutive loops
   * over the ranges between them, range r over [range_at[r],
   * range_at[r + 1]); inside each the comparisons are constants, a select
   * on one is its chosen operand alone, and a clamp that range keeps in
   * bounds is dropped (cpu/emit.c), so an element loads one input
   * instead of every input */
  int range_loop;             /* -1: none */
  int nranges;
  int64_t range_at[TCC_CPU_MAX_RANGES + 1];
  int peel_loop;              /* loop run in three ranges (-1: none) */
  int npeel;
  const tcc_ix *peel[TCC_CPU_MAX_PEEL];  /* clamps its middle range drops */
  tcc_cpu_gemm gemm;          /* extern GEMM kernels */
} tcc_cpu_kernel_schedule;

typedef struct tcc_cpu_schedule {
  tcc_cpu_kernel_schedule *kernels;   /* per p->kernels index */
  int has_conv, has_dnnl_gemm, has_cblas;  /* what the source must declare */
  int threaded;               /* some kernel runs on OpenMP threads (a parallel
                                 loop, a oneDNN step, a GEMM batch or slabs):
                                 tcc_entry runs the thread governor */
} tcc_cpu_schedule;

/* The C type of a dtype (bfloat16 as its bits), or NULL: not supported. */
static inline const char *tcc_cpu_ctype(tcc_dtype d) {
  switch (d) {
  case TCC__V1__DTYPE__FLOAT32: return "float";
  case TCC__V1__DTYPE__FLOAT64: return "double";
  case TCC__V1__DTYPE__INT8: return "int8_t";
  case TCC__V1__DTYPE__INT16: return "int16_t";
  case TCC__V1__DTYPE__INT32: return "int32_t";
  case TCC__V1__DTYPE__INT64: return "int64_t";
  case TCC__V1__DTYPE__UINT8:
  case TCC__V1__DTYPE__BOOL: return "uint8_t";
  case TCC__V1__DTYPE__FLOAT16: return "_Float16";
  case TCC__V1__DTYPE__BFLOAT16: return "uint16_t";   /* bits; tcc_bf16_to_f32 */
  default: return NULL;
  }
}

/* schedule.c: the schedule pass, its checker and dump. */
int tcc_cpu_schedule_pass(tcc_program *p, tcc_error *err);
int tcc_cpu_schedule_check(const tcc_program *p, tcc_error *err);
void tcc_cpu_schedule_dump(const tcc_program *p, tcc_buf *b);

/* Free variables of expressions (sorted, unique), memoized per kernel in
 * the program's arena: for the schedule's levels and the emitter's "is
 * everything bound here". */
typedef struct tcc_varset {
  int n;
  int v[];
} tcc_varset;
typedef struct tcc_cpu_fv {
  tcc_arena *arena;
  tcc_ptrmap map;             /* vx -> tcc_varset* */
  int oom;
} tcc_cpu_fv;
int tcc_cpu_fv_init(tcc_cpu_fv *f, tcc_arena *arena);
void tcc_cpu_fv_free(tcc_cpu_fv *f);
const tcc_varset *tcc_cpu_fv_vx(tcc_cpu_fv *f, const tcc_vx *e);

/* Border peeling: the clamp's argument x and bounds for MIN(MAX(x, lo),
 * hi), MAX(x, lo) or MIN(x, hi) (lo = INT64_MIN / hi = INT64_MAX when
 * absent), or NULL when e is no clamp. */
const tcc_ix *tcc_cpu_clamp_parts(const tcc_ix *e, int64_t *lo, int64_t *hi);
/* x's coefficients when it is c + 1 * v plus outer loop vars (v the
 * element loop's var); 0 otherwise. */
int tcc_cpu_peelable(const tcc_ix *x, int v, int64_t *coef, int64_t *c);

/* Range split: is e a comparison (i_v + c) op C of a kernel var's index
 * with a constant, op one of < <= > >=? Then *var = v, and *at the
 * point where it changes: it holds for i_v < *at when *below, for
 * i_v >= *at otherwise. */
int tcc_cpu_range_pred(const tcc_vx *e, int *var, int64_t *at, int *below);

/* emit.c: C for the scheduled program (compiler.h's tcc_entry ABI). */
int tcc_cpu_emit(const tcc_program *p, tcc_buf *src, tcc_error *err);
/* emit.c: tcc_tune_kernel(k, inputs, outputs, workspace), which runs
 * kernel k alone, for tuned builds (tune.c's header). */
void tcc_cpu_emit_bench_hooks(tcc_buf *src, int nkernels);
/* prelude.c: what every translation unit starts with. */
/* emit.c: the line that ends the preamble (headers, helpers, runtimes)
 * of a CPU source; shared bodies depend on nothing after it but their
 * own text. A body's name is tcc_b + this many hex digits of its
 * digest. */
#define TCC_CPU_PREAMBLE_END "/* tccd: end of preamble */\n"
#define TCC_BODY_ID_HEX 16
extern const char tcc_cpu_prelude[];
extern const char tcc_cpu_governor[];   /* prelude.c: tcc_gov_begin/_end */
/* share.c: the helper thread of streamed GEMMs on a busy machine (weak
 * definitions), in the preamble before the governor. */
extern const char tcc_cpu_share[];
/* The runtime of oneDNN convolution steps (runtime/onednn_conv.c, as
 * text): emit.c copies it into sources that have such steps. */
extern const char tcc_onednn_conv_runtime[];

/* build.c: the C compiler -> .so. */
int tcc_cpu_build(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
                  tcc_built *out, tcc_error *err);

#endif
