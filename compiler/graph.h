/*
 * graph.h — the compiler's internal front end: op table, graph IR, and
 * the passes that turn a CompileRequest into a canonical graph and key.
 *
 * Reads as a table of contents, grouped by the file that defines each
 * part (after chibicc.h). The back end (loop IR, fusion, codegen) is in
 * loop.h.
 *
 * The graph IR
 * ------------
 * A tcc_graph is a list of tensor values and a list of nodes. Values are
 * numbered 0..nvalues-1 and carry their metadata (tcc_meta); a value is a
 * graph input, a constant, or the output of exactly one node. A node names
 * an op of the table (ops.h) and holds one bound argument per schema
 * parameter, in schema order, defaults filled in: whichever way the client
 * bound them (by name, by position, defaults spelled out or not), equal
 * calls give equal nodes.
 *
 *   verify.c   request (names, any node order)  -> verified graph
 *              (every check that can fail, request node order)
 *   canon.c    verified graph -> canonical graph (topological order from
 *              the outputs, values renumbered) -> canonical key bytes
 *
 * The canonical graph is what tcc_prepared holds and tcc_compile reads;
 * it is immutable after tcc_prepare returns.
 */
#ifndef TCC_GRAPH_H
#define TCC_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "compiler.h"
#include "ops.h"
#include "tcc_dtype.h"

/* ------------------------------------------------------------ dtype.c */

/* Dtypes are the wire enum's numbers (Tcc__V1__DType); 0 is "none". */
typedef int tcc_dtype;

/* 1 when d names a dtype this build knows (FLOAT32..BOOL). */
int tcc_dtype_valid(tcc_dtype d);
/* Element size in bytes (0 for an invalid dtype): tcc_dtype_size, from
 * common/tcc_dtype.h (included above). */
/* "float32", "int64", ...; "dtype(<n>)" style text is never returned:
 * invalid dtypes give "invalid". */
const char *tcc_dtype_name(tcc_dtype d);
int tcc_dtype_is_float(tcc_dtype d);   /* float16/bfloat16/32/64 */
int tcc_dtype_is_int(tcc_dtype d);     /* signed/unsigned integers, not bool */
/* torch.promote_types(a, b). */
tcc_dtype tcc_dtype_promote(tcc_dtype a, tcc_dtype b);
/* The default float dtype (torch.get_default_dtype()): float32. */
#define TCC_DEFAULT_FLOAT TCC__V1__DTYPE__FLOAT32

/* -------------------------------------------- schema.c (the op table) */

#define TCC_SCHEMA_MAX_PARAMS 24
#define TCC_SCHEMA_MAX_RETURNS 8
#define TCC_NAME_MAX 64   /* "_scaled_dot_product_flash_attention_for_cpu_backward" is 52 */
#define TCC_DEFAULT_MAX_INTS 8

/* Base type of a schema parameter or return. */
typedef enum tcc_ptype {
  TCC_PT_TENSOR,
  TCC_PT_SCALAR,
  TCC_PT_INT,        /* int, SymInt */
  TCC_PT_FLOAT,
  TCC_PT_BOOL,
  TCC_PT_STR,
  TCC_PT_SCALARTYPE, /* a dtype */
  TCC_PT_LAYOUT,
  TCC_PT_DEVICE,
  TCC_PT_MEMFMT,
  TCC_PT_GENERATOR,
} tcc_ptype;

/* A bound argument (and a parsed default value). */
typedef enum tcc_arg_kind {
  TCC_ARG_NONE,
  TCC_ARG_TENSOR,   /* v: value id */
  TCC_ARG_INT,      /* i */
  TCC_ARG_FLOAT,    /* f */
  TCC_ARG_BOOL,     /* i (0/1) */
  TCC_ARG_INTS,     /* n, ints */
  TCC_ARG_FLOATS,   /* n, floats */
  TCC_ARG_BOOLS,    /* n, bools */
  TCC_ARG_TENSORS,  /* n, vals (-1 = None element) */
  TCC_ARG_DTYPE,    /* i: tcc_dtype */
  TCC_ARG_STRING,   /* s */
  TCC_ARG_DEVICE,   /* i: Tcc__V1__DeviceType (the index is dropped) */
} tcc_arg_kind;

typedef struct tcc_arg {
  tcc_arg_kind kind;
  int n;
  int v;
  int64_t i;
  double f;
  const char *s;
  const int64_t *ints;
  const double *floats;
  const uint8_t *bools;
  const int *vals;
} tcc_arg;

/* A default value as written in a schema ("=1", "=[0, 1]", "=None"). */
typedef struct tcc_default {
  tcc_arg_kind kind;
  int64_t i;
  double f;
  int n;
  int64_t ints[TCC_DEFAULT_MAX_INTS];
  char s[TCC_NAME_MAX];
} tcc_default;

typedef struct tcc_param {
  char name[TCC_NAME_MAX];
  tcc_ptype type;
  int is_list;        /* T[] or T[N] */
  int list_len;       /* N of T[N]; 0 = any length */
  int optional;       /* T? or T[]? : None accepted */
  int elem_optional;  /* Tensor?[] : None elements accepted */
  int kwarg_only;     /* after '*' */
  int mutates;        /* alias annotation with '!' ("Tensor(a!)") */
  int has_default;
  tcc_default def;
} tcc_param;

typedef struct tcc_schema {
  char name[TCC_NAME_MAX];       /* "add" */
  char overload[TCC_NAME_MAX];   /* "Tensor", "" */
  int nparams;
  tcc_param params[TCC_SCHEMA_MAX_PARAMS];
  int nreturns;                  /* -1: one Tensor[] (any count) */
  tcc_ptype returns[TCC_SCHEMA_MAX_RETURNS];
} tcc_schema;

typedef struct tcc_graph tcc_graph;
typedef struct tcc_node tcc_node;
typedef struct tcc_meta tcc_meta;
typedef struct tcc_lower_ctx tcc_lower_ctx;

/* Shape + dtype rule: fills out[0..n->nout) from the inputs' metas.
 * Returns 0 or TCC_E_INVALID_ARGUMENT with a message naming the problem
 * (the caller prefixes the node). */
typedef int tcc_infer_fn(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                         tcc_error *err);
/* Lowering to the loop IR (lower.c). Returns 0 or a TCC_E_* code. */
typedef int tcc_lower_fn(tcc_lower_ctx *lc, const tcc_node *n, tcc_error *err);

/* One row of the op table, with its schema parsed. */
typedef struct tcc_op {
  tcc_op_id id;
  const char *name;              /* "aten.add.Tensor" */
  const char *schema_text;
  tcc_op_kind kind;
  tcc_infer_fn *infer;
  tcc_lower_fn *lower;
  tcc_prim prim;
  tcc_schema schema;
} tcc_op;

/* Parses the table once (pthread_once; thread-safe). Returns 0, or
 * TCC_E_INTERNAL when a row's schema does not parse (a bug in ops.h). */
int tcc_ops_init(tcc_error *err);
/* The op with this overload name, or NULL. tcc_ops_init first. */
const tcc_op *tcc_op_find(const char *name);
/* Does op write into its first argument (a "Tensor(a!)" self, index_put_)?
 * Such a node is never dropped as unused (canon.c). */
static inline int tcc_op_writes_input(const tcc_op *op) {
  return op->schema.nparams > 0 && op->schema.params[0].mutates;
}
/* Row `id` (0..TCC_OP_COUNT-1). tcc_ops_init first. */
const tcc_op *tcc_op_get(int id);
/* 1 when extern op `id` runs on the CUDA target (cuBLAS GEMMs), else 0. */
int tcc_cuda_extern_op(int id);
/* Index of the parameter called `name`, or -1. */
int tcc_schema_param(const tcc_schema *s, const char *name);
/* Parses one schema string (exposed for tests). Returns 0 or
 * TCC_E_INVALID_ARGUMENT with the position of the problem. */
int tcc_schema_parse(const char *text, tcc_schema *out, tcc_error *err);
/* "Tensor", "Scalar", "int[2]", "Tensor?" ...: a parameter's type as
 * text, for messages. Writes into buf, returns buf. */
const char *tcc_param_type_str(const tcc_param *p, char *buf, size_t cap);
/* "Tensor", "int", "float list" ...: an argument kind, for messages. */
const char *tcc_arg_kind_name(tcc_arg_kind k);

/* Declarations of every infer/lower function the table names. */
#define TCC_OP_PROTOS(id, name, schema, kind, infer, lower, prim) \
  tcc_infer_fn tcc_infer_##infer;                                 \
  tcc_lower_fn tcc_lower_##lower;
TCC_OPS(TCC_OP_PROTOS)
#undef TCC_OP_PROTOS

/* ------------------------------------------------------- the graph IR */

/* Metadata of a tensor value (TensorMeta, checked). */
struct tcc_meta {
  tcc_dtype dtype;
  int device;                      /* Tcc__V1__DeviceType */
  int rank;
  int64_t sizes[TCC_MAX_DIMS];
  int64_t strides[TCC_MAX_DIMS];   /* elements, all >= 0 */
  int64_t offset;                  /* storage_offset, elements */
  int64_t numel;                   /* product of sizes */
  int64_t span;                    /* elements the storage must hold:
                                      offset + max reachable index + 1,
                                      0 when numel == 0 */
};

typedef enum tcc_value_kind {
  TCC_VAL_UNDEFINED,      /* declared but never defined (verified graphs only) */
  TCC_VAL_INPUT,
  TCC_VAL_CONST,
  TCC_VAL_NODE,
} tcc_value_kind;

typedef struct tcc_value {
  tcc_value_kind kind;
  tcc_meta meta;
  int def;                /* INPUT: position in inputs; NODE: node index */
  int def_out;            /* NODE: which output of the node */
  const uint8_t *data;    /* CONST: numel * dtype size bytes, row-major */
  size_t data_len;
  const char *name;       /* the client's name: messages and dumps only,
                             never hashed, never emitted */
} tcc_value;

struct tcc_node {
  const tcc_op *op;
  int nargs;              /* == op->schema.nparams */
  tcc_arg *args;          /* schema order, defaults filled */
  int nout;
  int *outs;              /* value ids; -1: output discarded ("") */
  int src_index;          /* index in the request, for messages */
};

/* Runs the statements with `id` bound to every tensor a node reads. */
#define FOR_EACH_TENSOR_ARG(node_, id, ...)                                \
  for (int ai_ = 0; ai_ < (node_)->nargs; ai_++) {                         \
    const tcc_arg *a_ = &(node_)->args[ai_];                               \
    if (a_->kind == TCC_ARG_TENSOR) {                                  \
      int id = a_->v;                                                  \
      __VA_ARGS__                                                      \
    } else if (a_->kind == TCC_ARG_TENSORS) {                          \
      for (int li_ = 0; li_ < a_->n; li_++) {                          \
        int id = a_->vals[li_];                                        \
        if (id < 0) continue;                                          \
        __VA_ARGS__                                                    \
      }                                                                \
    }                                                                  \
  }

/* The target a graph is compiled for (Target, checked and normalized). */
typedef struct tcc_target_spec {
  int device;             /* Tcc__V1__DeviceType: CPU or CUDA */
  const char *isa;        /* CPU: "x86-64".."x86-64-v4" ("" -> v2) */
  int nfeatures;
  const char **features;  /* CPU: sorted, unique */
  const char *cuda_arch;  /* CUDA: "sm_90" */
  int conv_tf32;          /* CUDA: float32 convolution GEMMs may use TF32 */
  int matmul_tf32;        /* CUDA: float32 matmuls may use TF32 */
} tcc_target_spec;

struct tcc_graph {
  tcc_arena arena;        /* owns everything below */
  int nvalues, nnodes, ninputs, noutputs;
  tcc_value *values;
  tcc_node *nodes;
  int *inputs;            /* value ids, call order */
  int *outputs;           /* value ids, return order */
  tcc_target_spec target;
  int mode;               /* Tcc__V1__Mode */
  int dynamic;
  const char *identity;   /* compiler identity (toolchain.c) */
  char target_label[64];  /* "cpu:x86-64-v2", "cuda:sm_90" */
  /* Dynamic shapes (dynamic.c): nsyms > 0 only with `dynamic` set and
   * some graph input dim marked symbolic (TensorMeta.sym_sizes). */
  int nsyms;
  const char **sym_names;   /* per symbol: the client's name (never hashed) */
  int64_t *sym_example;     /* per symbol: its example size (>= 2) */
  int *sym_of;              /* [ninputs * TCC_MAX_DIMS]: symbol of input i's
                               dim d, -1 static; NULL when nsyms == 0 */
};

/* -------------------------------------------------------- decode.c */

/* tcc_decode_request: compiler.h */

/* -------------------------------------------------------- verify.c */

/* Checks a request and builds the verified graph in `arena` (request node
 * order; values are only those defined). Returns 0, or
 * TCC_E_INVALID_ARGUMENT / TCC_E_UNIMPLEMENTED / TCC_E_RESOURCE_EXHAUSTED
 * with a message naming the node or value and the problem. */
int tcc_verify(const Tcc__V1__CompileRequest *req, tcc_arena *arena,
               tcc_graph *out, tcc_error *err);

/* Checks one TensorMeta and fills m (a missing device reads as
 * UNSPECIFIED). Returns 0 or TCC_E_INVALID_ARGUMENT with a message that
 * the caller prefixes with the value's name. */
int tcc_meta_from_proto(const Tcc__V1__TensorMeta *pm, tcc_meta *m,
                        tcc_error *err);


/* A client-supplied name made safe to quote in a message: printable
 * ASCII, at most 64 bytes then "...". Writes into buf, returns buf. */
const char *tcc_quote_name(const char *name, char *buf, size_t cap);

/* --------------------------------------------------------- infer.c */

/* Fills out[] (n->nout entries) for a node whose inputs are verified.
 * Returns 0 or TCC_E_INVALID_ARGUMENT (message without node prefix). */
int tcc_infer_node(const tcc_graph *g, const tcc_node *n, tcc_meta *out,
                   tcc_error *err);
/* Contiguous (row-major) strides for sizes; fills numel/span. */
void tcc_meta_contiguous(tcc_meta *m);
/* The same, channels last: a rank-4 or rank-5 [N, C, spatial..] tensor
 * stored N, spatial.., C (PyTorch's channels_last / channels_last_3d);
 * contiguous for other ranks. */
void tcc_meta_channels_last(tcc_meta *m);
/* Is m dense in row-major order (strides of dims of size 1 aside)? */
int tcc_meta_is_contiguous(const tcc_meta *m);
/* PyTorch broadcasting of two shapes into out (rank = max). Returns 0 or
 * TCC_E_INVALID_ARGUMENT naming the clashing dim. */
int tcc_broadcast(const int64_t *a, int ra, const int64_t *b, int rb,
                  int64_t *out, int *rout, tcc_error *err);

/* Helpers the infer and lower rules share (infer.c). */
/* "[2, 3]" into buf (truncated to fit); returns buf. */
const char *tcc_shape_str(const int64_t *sizes, int rank, char *buf, size_t cap);

const tcc_arg *tcc_node_arg(const tcc_node *n, const char *name);  /* NULL: no such param */
/* Normalizes dim d (negative counts from the end) for a tensor of rank
 * `rank` (a 0-dim tensor accepts 0 and -1). Returns 0 or INVALID_ARGUMENT. */
int tcc_norm_dim(int64_t d, int rank, int *out, tcc_error *err);
/* torch.result_type of a pointwise node's operands (not condition, not alpha). */
tcc_dtype tcc_operands_result_type(const tcc_graph *g, const tcc_node *n);
int tcc_reshape_sizes(const tcc_meta *m, const int64_t *shape, int n, int64_t *out,
                      tcc_error *err);
int tcc_transpose_dims(const tcc_graph *g, const tcc_node *n, int *d0, int *d1, tcc_error *err);
uint32_t tcc_squeeze_mask(const tcc_graph *g, const tcc_node *n);
int tcc_slice_params(const tcc_graph *g, const tcc_node *n, int *dim, int64_t *start,
                     int64_t *len, int64_t *step, tcc_error *err);
int tcc_select_params(const tcc_graph *g, const tcc_node *n, int *dim, int64_t *index,
                      tcc_error *err);
/* Reduced dims of a reduction node as a bit mask, and keepdim. */
int tcc_reduce_dims(const tcc_graph *g, const tcc_node *n, uint32_t *mask, int *keepdim,
                    tcc_error *err);
/* Advanced indexing (index.Tensor): the index tensors (int) sit in the
 * adjacent dims [first, first + count) of self; they broadcast to
 * sizes[0..rank), which replace those dims in the result. */
typedef struct tcc_index_layout {
  int first, count;
  int rank;
  int64_t sizes[TCC_MAX_DIMS];
} tcc_index_layout;
/* Fills *l for an index.Tensor node. Returns 0, INVALID_ARGUMENT (sizes
 * that do not broadcast, too many indices) or UNIMPLEMENTED (boolean
 * masks, index tensors in dims that are not adjacent). */
int tcc_index_layout_of(const tcc_graph *g, const tcc_node *n, tcc_index_layout *l,
                        tcc_error *err);
/* First normalized dim of a layer norm, or -1 with err set. */
int tcc_norm_axis(const tcc_meta *m, const tcc_arg *shape, tcc_error *err);

/* --------------------------------------------------------- canon.c */

/* Builds the canonical graph of a verified one into `out` (which owns a
 * fresh arena): nodes in depth-first post-order from the outputs (each
 * node's tensor arguments visited in schema order), nodes no output
 * depends on dropped, values renumbered inputs first, then in order of
 * definition. Returns 0 or TCC_E_RESOURCE_EXHAUSTED (out of memory). */
int tcc_canonicalize(const tcc_graph *in, tcc_graph *out, tcc_error *err);

/* Encodes the guard key of a canonical graph (format: canon.c header).
 * *key is malloc'ed. Returns 0 or TCC_E_RESOURCE_EXHAUSTED. */
int tcc_guard_key(const tcc_graph *g, uint8_t **key, size_t *len,
                  tcc_error *err);

/* Alignment class of a storage offset: the largest power of two <= 64
 * dividing offset * elemsize (64 when it is 0). */
int tcc_align_class(int64_t offset, int elemsize);

/* ------------------------------------------------------- dynamic.c */

/* Symbols per graph (each doubles the probes a dynamic compile makes). */
#define TCC_MAX_SYMS 4
/* Key marker of a size/stride/offset that is a function of the symbols
 * (canon.c's table). */
#define TCC_KEY_DERIVED INT64_MIN

/* With options.dynamic: reads the graph inputs' TensorMeta.sym_sizes into
 * g->nsyms/sym_names/sym_example/sym_of (symbols numbered by first
 * appearance, inputs in call order, dims in order). Returns 0,
 * TCC_E_INVALID_ARGUMENT (a bad name, a count that is not the rank, one
 * symbol with two example sizes) or TCC_E_UNIMPLEMENTED (a symbolic
 * input that is not contiguous; more than TCC_MAX_SYMS symbols). */
int tcc_dyn_verify(const Tcc__V1__CompileRequest *req, tcc_arena *A, tcc_graph *g,
                   tcc_error *err);

/* Copies the symbol tables of `in` into `out` (canonicalize). Returns 0 or
 * -1 (out of memory). */
int tcc_dyn_copy(const tcc_graph *in, tcc_graph *out, tcc_arena *A);

/* The graph g with every symbol s set to syms[s]: symbolic input dims get
 * those sizes (contiguous strides), node outputs are inferred again
 * (values whose sizes do not change keep their declared layout). `out`
 * shares g's nodes and constants and lives in A. Returns 0, or
 * TCC_E_UNIMPLEMENTED when a node does not accept the new sizes (a size
 * argument fixed to the example, say) or a graph output with a dynamic
 * size is not contiguous. */
int tcc_dyn_graph_at(const tcc_graph *g, const int64_t *syms, tcc_arena *A, tcc_graph *out,
                     tcc_error *err);

/* The graph at the example sizes and at other sizes, for the key: a
 * number that differs between the two depends on the symbols. */
int tcc_dyn_probe_pair(const tcc_graph *g, tcc_arena *A, tcc_graph *at_example,
                       tcc_graph *at_other, tcc_error *err);

/* --------------------------------------------------------- check.c */

/* IR checker for graphs: ids in range, every value defined once, nodes
 * in topological order, args match the schema. Returns 0 or
 * TCC_E_INTERNAL naming the broken invariant. */
int tcc_check_graph(const tcc_graph *g, tcc_error *err);

/* ---------------------------------------------------------- dump.c */

/* Appends a readable listing of the graph to b. */
void tcc_dump_graph(const tcc_graph *g, tcc_buf *b);

#endif
