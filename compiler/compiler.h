/*
 * compiler.h — the public face of the compiler library (libtcccompiler).
 *
 * A pure library: no sockets, no SQLite, no logging. The daemon (and the
 * fuzzer, and the tests) use exactly these entry points:
 *
 *   tcc_toolchain_identity()   once at start-up: "who compiles" for the key
 *   tcc_prepare()              decode + verify + canonicalize + guard hash
 *   tcc_compile()              lower -> fuse -> emit -> build, on a worker
 *
 * tcc_prepare is cheap and runs on the daemon's loop thread for every
 * request; tcc_compile is expensive and runs on a worker thread. A
 * tcc_prepared is immutable once returned, so a worker may read it while
 * the loop thread reads it too.
 *
 * Conventions callers rely on:
 *   - Errors: functions return 0 or a TCC_E_* code (= -gRPC status) and
 *     fill err->msg, which says where and what: "node 3 (aten.add.Tensor):
 *     argument 'other' must be Tensor, got int", "value 'x': negative size
 *     -2 in dim 0", "graph output 1 ...", "target: ...", "options: ...",
 *     "malformed CompileRequest: graph.values[0].meta: truncated varint at
 *     byte 10". An op outside the table is TCC_E_UNIMPLEMENTED
 *     "unsupported op 'aten.foo.bar' (node 3)". Node numbers are indices
 *     in the request's Graph.nodes. Client-supplied names are quoted as
 *     printable ASCII, cut at 64 bytes.
 *   - Nodes may be listed in any order; they are sorted topologically and
 *     a cycle is an error naming a node on it.
 *   - The guard key's byte format is documented (as a table) at the top of
 *     canon.c; it covers the canonical graph, input/output layouts,
 *     constants, target, mode, dynamic, the identity string and
 *     TCC_CODEGEN_VERSION; not names, client, requires_grad, device index
 *     or fullgraph.
 *   - Thread-safety: every function is reentrant. The op table is parsed
 *     once, on first use, under pthread_once.
 *   - tcc_compile runs the C compiler with posix_spawnp (argv list, no
 *     shell) in its own process group, collecting its status with
 *     waitpid(pid): the process must not set SIGCHLD to SIG_IGN.
 *   - Artifacts (.so) follow the ABI of docs/abi.md (tcc.proto's Manifest); output
 *     buffers must not overlap inputs, each other or the workspace, and
 *     the workspace (Manifest.workspace_bytes; may be 0) must be 64-byte
 *     aligned. tcc_entry returns 0, or 1 when an index read from a
 *     tensor (gather, index_select, embedding) was out of range or an
 *     integer division by zero happened: PyTorch raises there, so a
 *     caller should too. Kernels may run OpenMP threads (libgomp),
 *     call OpenBLAS and oneDNN (linked into the .so);
 *     Manifest.kernels[].kind is "pointwise", "reduction" or "extern" (a
 *     GEMM step, or a float32 convolution step through oneDNN when
 *     tcc_onednn_enabled(), below).
 *   - CUDA targets ("cuda:sm_80", "sm_90a", ...; cuda/emit.c) build with
 *     NVRTC (compiler/cuda/tcc_nvrtc.h, dlopen'ed: no GPU needed) into a
 *     CUBIN artifact for exactly that arch. Its Manifest has entry "",
 *     one kernel k<j> per fused kernel (an extern "C" __global__ taking
 *     ABI 1's (inputs..., outputs..., workspace) device pointers) with a
 *     grid and block and no dynamic shared memory, launched in order
 *     (runtime/tcc_runtime.h); a split reduction adds k<j>_split (kind
 *     "split-reduction", 2-D grid) before k<j>; a matmul is an "extern"
 *     step k<j> with KernelInfo.gemm (a cuBLAS call the client makes);
 *     Manifest.ptx is the PTX of the same compile. tcc_prepare appends
 *     tcc_nvrtc_identity() ("nvrtc 13.0 (sm_75 ...)", or "nvrtc
 *     unavailable") to the identity of CUDA requests, so the key changes
 *     with the NVRTC version; the arch is in the target. Extern steps
 *     other than matmuls (convolution) are TCC_E_UNIMPLEMENTED naming the
 *     op; without NVRTC tcc_compile is TCC_E_FAILED_PRECONDITION; NVRTC
 *     past opts->timeout_ms is TCC_E_DEADLINE_EXCEEDED (the compile is
 *     abandoned, tcc_nvrtc.h). Gathers with an index out of range read
 *     index 0 and integer division by zero gives 0 on CUDA (ABI 1 has no
 *     error flag).
 *   - Dynamic shapes (dynamic.c): with options.dynamic and graph-input
 *     dims marked symbolic (TensorMeta.sym_sizes), the key hashes symbols
 *     instead of their example sizes (format 2, canon.c) and tcc_compile
 *     builds one ABI 2 artifact (tcc_entry2 taking the symbols' values;
 *     Manifest.symbols/sym_* give layouts and workspace as polynomials
 *     over them). Graphs it cannot make size-generic are
 *     TCC_E_UNIMPLEMENTED "dynamic shapes: ..."; CUDA targets too.
 *     Without symbols nothing changes (ABI 1, key format 1).
 *   - With TCC_NO_FUSION set, tcc_compile fuses nothing (one kernel per
 *     op, for benchmarks); it is not in the guard key.
 *   - With the environment variable TCC_DUMP set, tcc_compile writes each
 *     pass's IR to <work_dir>/<guard hash>/NN-<pass>.txt.
 *
 * Limits (docs/tccd.md#limits; over them: TCC_E_RESOURCE_EXHAUSTED):
 */
#ifndef TCC_COMPILER_H
#define TCC_COMPILER_H

#include <stddef.h>
#include <stdint.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_digest.h"
#include "tcc_spawn.h"
#include "tcc_status.h"

#define TCC_MAX_NODES        65536      /* nodes per graph */
#define TCC_MAX_VALUES       131072     /* tensor values per graph */
#define TCC_MAX_DIMS         16         /* rank of a tensor */
#define TCC_INDEX_PUT_MAX    8          /* positions an index_put/scatter
                                           select compiles (infer.c) */
#define TCC_MAX_REQUEST_BYTES (256u << 20) /* encoded CompileRequest */

/* Bump whenever generated code or the key encoding changes: every cache
 * entry made by an older codegen then misses. */
#define TCC_CODEGEN_VERSION 81

typedef struct tcc_graph tcc_graph;  /* the canonical IR (graph.h) */

/* What the front end produced for one request. Owned by the caller;
 * free with tcc_prepared_free. Immutable after tcc_prepare returns. */
typedef struct tcc_prepared {
  tcc_graph *graph;                       /* canonical graph */
  uint8_t *key;                           /* canonical key bytes (hashed) */
  size_t key_len;
  uint8_t hash[TCC_SHA256_BYTES];         /* SHA-256(key) = guard hash */
  char hash_hex[TCC_SHA256_HEX];
  char target[64];                        /* "cpu:x86-64-v2", "cuda:sm_90" */
  Tcc__V1__DeviceType device;             /* CPU or CUDA */
  Tcc__V1__Mode mode;
  int dynamic;
  size_t nodes;                           /* node count, for logs */
} tcc_prepared;

/* Running external programs (the C compiler, benchmark children) and
 * the kill switch for all of them: common/tcc_spawn.h. */


/* Checks a target alone, as tcc_prepare checks a request's (the daemon
 * checks a warm run's target before it compiles anything for it). Fills
 * label with the entry label ("cpu:x86-64-v3+avx512bf16", "cuda:sm_90").
 * Returns 0 or TCC_E_INVALID_ARGUMENT naming what is wrong. */
int tcc_target_check(const Tcc__V1__Target *t, char label[64], tcc_error *err);

/* Describes the toolchain that builds kernels for the key ("tccd-codegen/1
 * cc=gcc (Debian 12.2.0-14) 12.2.0"), by running `cc --version` once.
 * Writes at most cap bytes into out. Returns 0 or a TCC_E* code. */
int tcc_toolchain_identity(const char *cc, char *out, size_t cap, tcc_error *err);

/* Describes the NVRTC that builds CUDA targets ("nvrtc 13.0 (sm_75 ...
 * sm_121)"), the text tcc_prepare appends to the identity of CUDA
 * requests. Loads NVRTC on the first call (dlopen'ed, ~30 ms: a daemon
 * calls it at start-up). Writes at most cap bytes into out. Returns 0
 * or TCC_E_FAILED_PRECONDITION with the reason (no NVRTC). */
int tcc_toolchain_cuda_identity(char *out, size_t cap, tcc_error *err);

/* Do CPU float32 convolutions become oneDNN steps (conv.c): tccd built
 * with oneDNN (-Donednn) and TCC_NO_ONEDNN unset in the environment? The
 * identity above names the road. */
int tcc_onednn_enabled(void);

/* Do CUDA convolutions become cuDNN steps (conv.c, tcc.v1.ConvStep) with
 * TCC_NO_CUDNN unset in the environment? Else they take the im2col +
 * cuBLAS road. tcc_toolchain_cuda_identity names the road. */
int tcc_cudnn_enabled(void);

/* Decodes an already-unpacked request, verifies it, canonicalizes the
 * graph and computes the guard key and hash. `identity` (from
 * tcc_toolchain_identity) goes into the key.
 * Returns 0, or TCC_E_INVALID_ARGUMENT / TCC_E_UNIMPLEMENTED /
 * TCC_E_RESOURCE_EXHAUSTED with a message naming the node and problem. */
int tcc_prepare(const Tcc__V1__CompileRequest *req, const char *identity,
                tcc_prepared **out, tcc_error *err);

/* Unpacks wire bytes (decode.c). Returns 0 (free *out with
 * tcc__v1__compile_request__free_unpacked(*out, NULL)), or
 * TCC_E_RESOURCE_EXHAUSTED (over TCC_MAX_REQUEST_BYTES) /
 * TCC_E_INVALID_ARGUMENT ("malformed CompileRequest: graph.nodes[2]:
 * truncated varint at byte 181"). */
int tcc_decode_request(const uint8_t *buf, size_t len, Tcc__V1__CompileRequest **out, tcc_error *err);

/* The same from encoded bytes (what arrives on the wire). Garbage or
 * truncated protobuf is TCC_E_INVALID_ARGUMENT. */
int tcc_prepare_bytes(const uint8_t *buf, size_t len, const char *identity,
                      tcc_prepared **out, tcc_error *err);

void tcc_prepared_free(tcc_prepared *p);

/* How to build. Zeroed fields take defaults. */
typedef struct tcc_build_options {
  const char *cc;          /* C compiler to run; NULL = "cc" */
  const char *work_dir;    /* scratch dir for sources/objects; NULL = $TMPDIR */
  int timeout_ms;          /* kill the compiler after this; 0 = 120000 */
  int keep_sources;        /* leave generated sources in work_dir */
  /* The object cache of CPU kernel bodies (cpu/build.c): objects
   * compiled for one artifact lend their bodies to the next that has
   * them. NULL: none. Kept under object_max_bytes (0: 256 MiB), oldest
   * use first. */
  const char *object_dir;
  int64_t object_max_bytes;
  const char *identity;    /* tcc_toolchain_identity: in the object cache's keys */
} tcc_build_options;

/* What a compile produced. Free with tcc_artifact_free. */
typedef struct tcc_artifact {
  Tcc__V1__ArtifactKind kind;            /* SHARED_OBJECT or CUBIN */
  uint8_t *data;                         /* the .so / cubin bytes */
  size_t size;
  uint8_t sha256[TCC_SHA256_BYTES];
  uint8_t *manifest;                     /* encoded tcc.v1.Manifest */
  size_t manifest_len;
  int kernels;                           /* number of generated kernels */
  char *source;                          /* generated source, NUL-terminated */
  double compile_ms;                     /* wall time of tcc_compile */
  int bodies;                            /* CPU: distinct kernel bodies */
  int bodies_reused;                     /* of those, taken from the object cache */
} tcc_artifact;

/* Lowers, fuses, emits and builds the prepared graph for its target (a
 * .so for CPU, a cubin for CUDA). Thread-safe: many compiles may run at
 * once on different preparations.
 * Returns 0, or TCC_E_UNIMPLEMENTED (op/dtype the target cannot do yet,
 * CPU attention on CUDA), TCC_E_FAILED_PRECONDITION (CUDA without NVRTC),
 * TCC_E_INTERNAL (the compiler failed: its output is in the message),
 * TCC_E_DEADLINE_EXCEEDED (timeout). */
int tcc_compile(const tcc_prepared *p, const tcc_build_options *opts,
                tcc_artifact *out, tcc_error *err);

void tcc_artifact_free(tcc_artifact *a);

/* One op tcc_compile lowers (for tcc.v1.Compiler.Ops: clients send only
 * these and run the rest eagerly). Strings are static. */
typedef struct tcc_op_info {
  const char *target;   /* "aten.add.Tensor" */
  const char *schema;   /* "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor" */
  const char *kind;     /* "pointwise", "reduction", "view", "extern" */
} tcc_op_info;

/* The ops device (Tcc__V1__DeviceType; UNSPECIFIED = CPU) compiles, in op
 * table order: fills out[0..min(count, cap)) and returns the count (call
 * with cap 0 to size the array). CUDA lists every op except extern steps
 * other than the matmul family (mm, bmm, addmm, matmul, linear: cuBLAS
 * on the client). Thread-safe. */
size_t tcc_compiler_ops(int device, tcc_op_info *out, size_t cap);

/* The tensor dtypes device computes in (on CPU: float32, float64,
 * float16 and bfloat16 (computed in float32), int8/16/32/64, uint8,
 * bool), same calling convention. */
size_t tcc_compiler_dtypes(int device, Tcc__V1__DType *out, size_t cap);

/* ------------------------------------------------------------ tune.c
 *
 * Autotuning (max-autotune, max-autotune-no-cudagraphs). A CPU kernel can
 * be generated under a tcc_kernel_config; the all-zero config is
 * "default" and generates exactly what tcc_compile generates. The daemon:
 *
 *   tcc_tune_signatures_make()
 *                            each live kernel's signature (SHA-256 of its
 *                            default source with identifiers renumbered,
 *                            + target + compiler identity): the same
 *                            kernel in another graph has the same one
 *   tcc_tune_candidates()    the candidate configs (index 0 = default)
 *   tcc_compile_tuned()      a .so with one config per kernel, optionally
 *                            with timing hooks (tcc_tune_kernel)
 *   tcc_bench_compare()      a candidate's outputs against the default's
 *                            (a tcc_bench_result each)
 *   tcc_tune_record_*()      (de)serializes a tuning record
 *
 * Running the benchmark child (tccd-bench, runtime/bench.c) on each
 * candidate, and the GPU probe, are the daemon's (daemon/tune_child.c):
 * this library spawns no benchmark.
 */

/* How one CPU kernel is generated. All zero = the default code. */
typedef struct tcc_kernel_config {
  int parallel;      /* 0 default heuristic; 1 outer loop always parallel;
                      * -1 never parallel (and extern GEMMs: one BLAS thread) */
  int threads;       /* num_threads(N) on the parallel loop; 0 = all */
  int chunk;         /* schedule(static, chunk); 0 = even split */
  int unroll;        /* #pragma GCC unroll N on the innermost plain loop; 0 = none */
  int blas_threads;  /* OpenBLAS threads for extern GEMMs; 0 = OpenBLAS's own */
  int vec;           /* simdlen(N) on the SIMD loops (vector width in
                      * elements); 0 = the C compiler's choice */
  int order;         /* loop order of pointwise kernels: 0 = by the first
                      * store's strides (writes contiguous innermost);
                      * 1 = by the first load's (reads contiguous) */
  /* CUDA kernels (cuda/schedule.c; the CPU schedule ignores these; all zero =
   * the emitter's launch heuristic, byte for byte) */
  int block;         /* threads per block (32..1024, a power of two); 0 = heuristic */
  int ipt;           /* pointwise: elements per thread of the grid-stride
                      * loop (grid = numel / (block * ipt)); 0 = 1 */
  int wrow;          /* reductions: 1 = one warp per row (block / 32 rows per
                      * block) for any row length; -1 = one block per row
                      * even for rows <= 32; 0 = heuristic */
  int split;         /* split reductions: partial groups per row; 1 = never
                      * split; 0 = heuristic */
  int persist;       /* block-per-row reductions: 1 = each input the row
                      * reads more than once is copied into shared memory
                      * once per row ("persistent"); 0 = every pass reads
                      * global memory ("looped") */
} tcc_kernel_config;

#define TCC_TUNE_MAX_CANDIDATES 12
#define TCC_TUNE_CONFIG_TEXT 160

/* One live kernel: its signature (the key of its tuning record) and kind. */
typedef struct tcc_tune_kernel {
  uint8_t signature[TCC_SHA256_BYTES];
  char signature_hex[TCC_SHA256_HEX];
  char kind[16];                          /* "pointwise", "reduction", "extern" */
} tcc_tune_kernel;

typedef struct tcc_tune_signatures {
  int nkernels;
  tcc_tune_kernel *kernels;               /* malloc'd; tcc_tune_signatures_free */
} tcc_tune_signatures;

/* Signatures of p's live kernels (generates the default source; no
 * build). CPU and CUDA targets, static shapes: TCC_E_UNIMPLEMENTED
 * otherwise. Returns 0 or
 * a TCC_E_* code. */
int tcc_tune_signatures_make(const tcc_prepared *p, tcc_tune_signatures *out, tcc_error *err);
void tcc_tune_signatures_free(tcc_tune_signatures *sigs);

/* Fills out[0..n) with the candidate configs for device (CPU or CUDA)
 * and returns n (<= TCC_TUNE_MAX_CANDIDATES); out[0] is always the
 * default. */
int tcc_tune_candidates(int device, tcc_kernel_config *out);

/* "par=1 thr=0 chunk=0 unroll=4 blas=0 vec=0 order=0" into buf (cap
 * bytes), then " block=B ipt=I wrow=W split=S persist=P" when any CUDA field is
 * set (so CPU configs read as they always did); returns buf. */
const char *tcc_kernel_config_format(const tcc_kernel_config *c, char *buf, size_t cap);
/* The inverse. Returns 0 or TCC_E_INVALID_ARGUMENT. */
int tcc_kernel_config_parse(const char *s, tcc_kernel_config *out);
/* 1 when c is the default (all zero). */
int tcc_kernel_config_is_default(const tcc_kernel_config *c);

/* tcc_compile with configs[k] for live kernel k (configs NULL, or every
 * config default: the same source as tcc_compile) and, with
 * bench_hooks, the exported tcc_tune_kernel(k, inputs, outputs,
 * workspace) that runs kernel k alone (benchmark builds only; never
 * stored). CPU and CUDA targets, static shapes (else
 * TCC_E_UNIMPLEMENTED); a CUDA build needs no hooks (bench_hooks is
 * ignored: the benchmark child launches each kernel's steps of the
 * manifest alone). Returns as tcc_compile. */
int tcc_compile_tuned(const tcc_prepared *p, const tcc_build_options *opts,
                      const tcc_kernel_config *configs, int nconfigs, int bench_hooks,
                      tcc_artifact *out, tcc_error *err);

/* What one benchmark child reported for a candidate (daemon/tune_child.c
 * fills it; tcc_bench_compare reads it). */
typedef struct tcc_bench_result {
  int nkernels;
  double *kernel_ns;       /* median ns per kernel (malloc'd) */
  uint8_t *outputs;        /* every output's bytes, in order, on input set 0 */
  size_t outputs_len;
  int entry_bad;           /* tcc_entry reported 1 on input set 0 */
} tcc_bench_result;

/* Frees what a result holds and zeroes it. NULL is fine. */
void tcc_bench_result_free(tcc_bench_result *r);

/* Compares a candidate's outputs with the reference's, output by output
 * from the manifest: integers and bools exactly, floats within
 * |a - b| <= atol + rtol * |b| (float32/16/bf16: rtol 1e-3, atol 1e-4 *
 * max(1, max|ref|); float64: rtol 1e-9, atol 1e-12 * max(1, max|ref|)),
 * NaN matching NaN. Returns 0 when they agree, else TCC_E_OUT_OF_RANGE
 * with the first disagreement in err. */
int tcc_bench_compare(const uint8_t *manifest, size_t manifest_len, const tcc_bench_result *ref,
                      const tcc_bench_result *cand, tcc_error *err);

/* A tuning record: the best config for one kernel signature + target. */
typedef struct tcc_tune_record {
  tcc_kernel_config config;
  double best_ns;          /* the chosen config's median */
  double default_ns;       /* the default config's median */
  int tried;               /* candidates benchmarked (valid + discarded) */
  int discarded;
} tcc_tune_record;

/* Serializes r as a short text ("tccd-tune/1 par=...;best_ns=...") into
 * *out (malloc'd). Returns 0 or TCC_E_RESOURCE_EXHAUSTED. */
int tcc_tune_record_encode(const tcc_tune_record *r, uint8_t **out, size_t *len, tcc_error *err);
/* Returns 0 or TCC_E_INVALID_ARGUMENT (not a record of this version). */
int tcc_tune_record_decode(const uint8_t *data, size_t len, tcc_tune_record *out, tcc_error *err);

/* Explaining misses (explain.c): a guard key read back into named parts
 * ("input 0 sizes" = "[8, 128]", "compiler identity" = "cc 12.2 ..."),
 * and the graph digest: SHA-256 of the key's structure (ops, wiring,
 * value kinds) without sizes, dtypes, scalars, constants, target,
 * compiler or mode, shared by the keys of one graph that recompiled. */
typedef enum tcc_key_part_class {
  TCC_KEY_HEADER,    /* key format, codegen, compiler identity, target, mode, dynamic */
  TCC_KEY_INPUT,     /* an input's dtype, sizes, strides, offset, alignment, device */
  TCC_KEY_CONSTANT,  /* a constant's data (length and digest prefix) */
  TCC_KEY_ARGUMENT,  /* a node's scalar argument */
  TCC_KEY_VALUE      /* an intermediate's or output's dtype, sizes, layout */
} tcc_key_part_class;

typedef struct tcc_key_part {
  tcc_key_part_class cls;
  const char *name;   /* "input 0 sizes", "node 3 aten.sum.dim_IntList argument 1" */
  const char *value;  /* "[8, 128]" (symbols as s0, derived numbers as "derived") */
} tcc_key_part;

typedef struct tcc_key_parts {
  tcc_key_part *parts;  /* in key order */
  size_t n;
  int ninputs;
  uint8_t graph[TCC_SHA256_BYTES];  /* the graph digest */
  char *text;           /* owns the names and values */
} tcc_key_parts;

/* Reads a key (untrusted bytes: bounds-checked). Returns 0 (free with
 * tcc_key_parts_free), TCC_E_INVALID_ARGUMENT for a malformed key or
 * TCC_E_RESOURCE_EXHAUSTED. */
int tcc_key_parts_read(const uint8_t *key, size_t len, tcc_key_parts *out, tcc_error *err);
void tcc_key_parts_free(tcc_key_parts *p);
/* The graph digest alone. Returns 0, or -1 for a malformed key. */
int tcc_key_graph_digest(const uint8_t *key, size_t len, uint8_t out[TCC_SHA256_BYTES]);

/* Calls fn for each part whose value differs between a and b, in key
 * order. Returns the number of differing parts, or -1 when a and b are
 * not keys of one graph (another digest: nothing to compare part by
 * part). */
typedef void (*tcc_key_diff_fn)(void *arg, const tcc_key_part *a, const tcc_key_part *b);
int tcc_key_parts_diff(const tcc_key_parts *a, const tcc_key_parts *b, tcc_key_diff_fn fn, void *arg);

#endif
