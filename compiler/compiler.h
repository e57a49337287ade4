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
 *   - Artifacts (.so) follow the ABI of tcc.proto's Manifest; output
 *     buffers must not overlap inputs, each other or the workspace, and
 *     the workspace (Manifest.workspace_bytes; may be 0) must be 64-byte
 *     aligned. tcc_entry returns 0, or 1 when an index read from a
 *     tensor (gather, index_select, embedding) was out of range or an
 *     integer division by zero happened: PyTorch raises there, so a
 *     caller should too. Kernels may run OpenMP threads (libgomp) and
 *     call OpenBLAS (linked into the .so); Manifest.kernels[].kind is
 *     "pointwise", "reduction" or "extern" (a GEMM step).
 *   - CUDA targets ("cuda:sm_80", "sm_90a", ...; emit_cuda.c) build with
 *     NVRTC (compiler/cuda/nvrtc.h, dlopen'ed: no GPU needed) into a
 *     CUBIN artifact for exactly that arch. Its Manifest has entry "",
 *     one kernel k<j> per fused kernel (an extern "C" __global__ taking
 *     ABI 1's (inputs..., outputs..., workspace) device pointers) with a
 *     1-D grid and block and no dynamic shared memory, launched in order
 *     (client/cuda.h). tcc_prepare appends tcc_nvrtc_identity() ("nvrtc
 *     13.0 (sm_75 ...)", or "nvrtc unavailable") to the identity of CUDA
 *     requests, so the key changes with the NVRTC version; the arch is in
 *     the target. Graphs with a GEMM (extern) step are
 *     TCC_E_UNIMPLEMENTED "matmul on CUDA needs cuBLAS (not built yet)";
 *     without NVRTC tcc_compile is TCC_E_FAILED_PRECONDITION. Gathers with
 *     an index out of range read index 0 and integer division by zero
 *     gives 0 on CUDA (ABI 1 has no error flag).
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
 * Limits (documented in the README; over them: TCC_E_RESOURCE_EXHAUSTED):
 */
#ifndef TCC_COMPILER_H
#define TCC_COMPILER_H

#include <stddef.h>
#include <stdint.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_digest.h"
#include "tcc_status.h"

#define TCC_MAX_NODES        65536      /* nodes per graph */
#define TCC_MAX_VALUES       131072     /* tensor values per graph */
#define TCC_MAX_DIMS         16         /* rank of a tensor */
#define TCC_MAX_REQUEST_BYTES (256u << 20) /* encoded CompileRequest */

/* Bump whenever generated code or the key encoding changes: every cache
 * entry made by an older codegen then misses. */
#define TCC_CODEGEN_VERSION 2

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

/* Describes the toolchain that builds kernels for the key ("tccd-codegen/1
 * cc=gcc (Debian 12.2.0-14) 12.2.0"), by running `cc --version` once.
 * Writes at most cap bytes into out. Returns 0 or a TCC_E* code. */
int tcc_toolchain_identity(const char *cc, char *out, size_t cap, tcc_error *err);

/* Decodes an already-unpacked request, verifies it, canonicalizes the
 * graph and computes the guard key and hash. `identity` (from
 * tcc_toolchain_identity) goes into the key.
 * Returns 0, or TCC_E_INVALID_ARGUMENT / TCC_E_UNIMPLEMENTED /
 * TCC_E_RESOURCE_EXHAUSTED with a message naming the node and problem. */
int tcc_prepare(const Tcc__V1__CompileRequest *req, const char *identity,
                tcc_prepared **out, tcc_error *err);

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
} tcc_artifact;

/* Lowers, fuses, emits and builds the prepared graph for its target (a
 * .so for CPU, a cubin for CUDA). Thread-safe: many compiles may run at
 * once on different preparations.
 * Returns 0, or TCC_E_UNIMPLEMENTED (op/dtype the target cannot do yet,
 * GEMM on CUDA), TCC_E_FAILED_PRECONDITION (CUDA without NVRTC),
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
 * with cap 0 to size the array). CUDA lists every op except the extern
 * (GEMM) steps, which need cuBLAS on the client (not built yet).
 * Thread-safe. */
size_t tcc_compiler_ops(int device, tcc_op_info *out, size_t cap);

/* The tensor dtypes device computes in (on CPU: float32, float64,
 * float16 and bfloat16 (computed in float32), int8/16/32/64, uint8,
 * bool), same calling convention. */
size_t tcc_compiler_dtypes(int device, Tcc__V1__DType *out, size_t cap);

#endif
