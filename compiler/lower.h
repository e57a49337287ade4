/*
 * lower.h — what the lowering files share (lower.c: the helpers, pointwise
 * ops, factories, views, indexing and the driver; lower_reduce.c:
 * reductions, softmax, norms; lower_matmul.c: matmuls and GEMM steps).
 * The op table (optable.c) points at their tcc_lower_* entry points
 * (ops.h); conv.c, pool.c and attention.c use loop.h's tcc_lower_realize,
 * tcc_lower_pack and tcc_lower_gemm.
 */
#ifndef TCC_LOWER_H
#define TCC_LOWER_H

#include "loop.h"

/* In a lowering function with `err`, node `n` and program `p` in scope. */
#define OOM() tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory lowering")
#define ARG(name) tcc_node_arg(n, name)
#define BIN(op, x, y) tcc_vx_binary(p, TCC_PRIM_##op, x, y)
#define UN(op, x) tcc_vx_unary(p, TCC_PRIM_##op, x)

/* Loop variables i0..i{rank-1}, the identity index of a shape. */
int tcc_lower_identity_index(tcc_program *p, int rank, const tcc_ix **idx);
/* The dtype arithmetic on values of dtype d runs in. */
tcc_dtype tcc_lower_compute_dt(tcc_dtype d);
/* The meta of node n's output o (NULL: the output is unused) / of a
 * tensor argument (NULL: not a tensor). */
const tcc_meta *tcc_lower_out_meta(tcc_lower_ctx *lc, const tcc_node *n, int o);
const tcc_meta *tcc_lower_arg_meta(tcc_lower_ctx *lc, const tcc_arg *a);
/* The constant f in dtype dt. */
const tcc_vx *tcc_lower_cst(tcc_program *p, tcc_dtype dt, double f);
/* Value v's body read at idx (one index per dim of v). */
const tcc_vx *tcc_lower_body_at(tcc_lower_ctx *lc, int v, const tcc_ix *const *idx);
/* Result: cast to the output dtype and realized. */
int tcc_lower_result(tcc_lower_ctx *lc, const tcc_node *n, int o, const tcc_vx *body, tcc_error *err);
/* Operand `a` broadcast to the output of node n, in dtype dt. */
const tcc_vx *tcc_lower_opnd(tcc_lower_ctx *lc, const tcc_node *n, const tcc_arg *a, tcc_dtype dt);
/* Realizes body (over `rank` vars of `sizes`) into a contiguous
 * temporary and returns the identity load of it. */
const tcc_vx *tcc_lower_materialize(tcc_lower_ctx *lc, const tcc_vx *body, int rank, const int64_t *sizes,
                                    tcc_dtype dt);
/* Index of a tensor of sizes `in` (rank ri) for the element of the
 * reshaped tensor of sizes `out` (rank ro) at index oidx: dims are
 * matched in groups of equal element count; a group's row-major offset
 * is split back with floor-div/mod (tcc_linear_affine sees through
 * them). */
int tcc_lower_reshape_index(tcc_program *p, const int64_t *in, int ri, const int64_t *out, int ro,
                            const tcc_ix *const *oidx, const tcc_ix **iidx);

#endif
