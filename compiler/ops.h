/*
 * ops.h — every operator the compiler knows, declared once (X-macros).
 *
 * Two tables, after QBE's ops.h:
 *
 *  TCC_OPS      ATen overloads a request may name. One row per overload:
 *
 *    X(ID, "aten.<name>.<overload>", "<schema as PyTorch writes it>",
 *      KIND, infer, lower, PRIM)
 *
 *    ID      suffix of the enum constant TCC_OP_<ID>
 *    name    the overload a Node.target names (".default" for ops that
 *            have no overload name in their schema)
 *    schema  the FunctionSchema string from native_functions.yaml; it is
 *            parsed once (schema.c) and drives argument binding by name or
 *            position, arity and type checks and defaults. The schema's
 *            name and overload must agree with the row's name.
 *    KIND    TCC_OPK_<KIND>: POINTWISE (an expression of same-index
 *            elements), REDUCTION, VIEW (only index arithmetic), EXTERN
 *            (a library call)
 *    infer   shape + dtype rule: tcc_infer_<infer> (infer.c)
 *    lower   lowering to the loop IR: tcc_lower_<lower> (lower.c)
 *    PRIM    TCC_PRIM_<PRIM>, the loop-IR primitive a generic lowering
 *            applies (NONE for ops with their own lowering)
 *
 *  TCC_PRIMS    scalar primitives of the loop IR (what a kernel body is
 *               made of), after TorchInductor's `ops.*`:
 *
 *    X(ID, arity, "name")
 *
 * Adding an op: add a row; if its infer/lower function is new, write it in
 * infer.c / lower.c. The test suite walks this table, so a new row is
 * parsed and checked by `test_schema` automatically.
 */
#ifndef TCC_OPS_H
#define TCC_OPS_H

#define TCC_OPS(X)                                                                      \
  X(ADD_TENSOR, "aten.add.Tensor",                                                      \
    "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",               \
    POINTWISE, promote, binary, ADD)                                                    \
  X(SUB_TENSOR, "aten.sub.Tensor",                                                      \
    "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",               \
    POINTWISE, promote, binary, SUB)                                                    \
  X(MUL_TENSOR, "aten.mul.Tensor",                                                      \
    "mul.Tensor(Tensor self, Tensor other) -> Tensor",                                  \
    POINTWISE, promote, binary, MUL)                                                    \
  X(DIV_TENSOR, "aten.div.Tensor",                                                      \
    "div.Tensor(Tensor self, Tensor other) -> Tensor",                                  \
    POINTWISE, promote_float, binary, DIV)                                              \
  X(ADD_SCALAR, "aten.add.Scalar",                                                      \
    "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",                  \
    POINTWISE, promote, binary, ADD)                                                    \
  X(SUB_SCALAR, "aten.sub.Scalar",                                                      \
    "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",                  \
    POINTWISE, promote, binary, SUB)                                                    \
  X(MUL_SCALAR, "aten.mul.Scalar",                                                      \
    "mul.Scalar(Tensor self, Scalar other) -> Tensor",                                  \
    POINTWISE, promote, binary, MUL)                                                    \
  X(DIV_SCALAR, "aten.div.Scalar",                                                      \
    "div.Scalar(Tensor self, Scalar other) -> Tensor",                                  \
    POINTWISE, promote_float, binary, DIV)                                              \
  X(DIV_TENSOR_MODE, "aten.div.Tensor_mode",                                            \
    "div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",      \
    POINTWISE, div_mode, div_mode, NONE)                                                \
  X(DIV_SCALAR_MODE, "aten.div.Scalar_mode",                                            \
    "div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",      \
    POINTWISE, div_mode, div_mode, NONE)                                                \
  X(POW_TT, "aten.pow.Tensor_Tensor",                                                   \
    "pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",                        \
    POINTWISE, promote, binary, POW)                                                    \
  X(POW_TS, "aten.pow.Tensor_Scalar",                                                   \
    "pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",                        \
    POINTWISE, promote, binary, POW)                                                    \
  X(POW_ST, "aten.pow.Scalar",                                                          \
    "pow.Scalar(Scalar self, Tensor exponent) -> Tensor",                               \
    POINTWISE, promote, binary, POW)                                                    \
  X(MAXIMUM, "aten.maximum.default",                                                    \
    "maximum(Tensor self, Tensor other) -> Tensor",                                     \
    POINTWISE, promote, binary, MAX)                                                    \
  X(MINIMUM, "aten.minimum.default",                                                    \
    "minimum(Tensor self, Tensor other) -> Tensor",                                     \
    POINTWISE, promote, binary, MIN)                                                    \
  X(FMOD_TENSOR, "aten.fmod.Tensor",                                                    \
    "fmod.Tensor(Tensor self, Tensor other) -> Tensor",                                 \
    POINTWISE, promote, binary, FMOD)                                                   \
  X(FMOD_SCALAR, "aten.fmod.Scalar",                                                    \
    "fmod.Scalar(Tensor self, Scalar other) -> Tensor",                                 \
    POINTWISE, promote, binary, FMOD)                                                   \
  X(REMAINDER_TENSOR, "aten.remainder.Tensor",                                          \
    "remainder.Tensor(Tensor self, Tensor other) -> Tensor",                            \
    POINTWISE, promote, binary, REM)                                                    \
  X(REMAINDER_SCALAR, "aten.remainder.Scalar",                                          \
    "remainder.Scalar(Tensor self, Scalar other) -> Tensor",                            \
    POINTWISE, promote, binary, REM)                                                    \
  X(ATAN2, "aten.atan2.default",                                                        \
    "atan2(Tensor self, Tensor other) -> Tensor",                                       \
    POINTWISE, promote_float, binary, ATAN2)                                            \
  X(EQ_TENSOR, "aten.eq.Tensor",                                                        \
    "eq.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, EQ)                                                    \
  X(EQ_SCALAR, "aten.eq.Scalar",                                                        \
    "eq.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, EQ)                                                    \
  X(NE_TENSOR, "aten.ne.Tensor",                                                        \
    "ne.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, NE)                                                    \
  X(NE_SCALAR, "aten.ne.Scalar",                                                        \
    "ne.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, NE)                                                    \
  X(LT_TENSOR, "aten.lt.Tensor",                                                        \
    "lt.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, LT)                                                    \
  X(LT_SCALAR, "aten.lt.Scalar",                                                        \
    "lt.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, LT)                                                    \
  X(LE_TENSOR, "aten.le.Tensor",                                                        \
    "le.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, LE)                                                    \
  X(LE_SCALAR, "aten.le.Scalar",                                                        \
    "le.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, LE)                                                    \
  X(GT_TENSOR, "aten.gt.Tensor",                                                        \
    "gt.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, GT)                                                    \
  X(GT_SCALAR, "aten.gt.Scalar",                                                        \
    "gt.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, GT)                                                    \
  X(GE_TENSOR, "aten.ge.Tensor",                                                        \
    "ge.Tensor(Tensor self, Tensor other) -> Tensor",                                   \
    POINTWISE, compare, compare, GE)                                                    \
  X(GE_SCALAR, "aten.ge.Scalar",                                                        \
    "ge.Scalar(Tensor self, Scalar other) -> Tensor",                                   \
    POINTWISE, compare, compare, GE)                                                    \
  X(LOGICAL_AND, "aten.logical_and.default",                                            \
    "logical_and(Tensor self, Tensor other) -> Tensor",                                 \
    POINTWISE, logical, logical, AND)                                                   \
  X(LOGICAL_OR, "aten.logical_or.default",                                              \
    "logical_or(Tensor self, Tensor other) -> Tensor",                                  \
    POINTWISE, logical, logical, OR)                                                    \
  X(LOGICAL_XOR, "aten.logical_xor.default",                                            \
    "logical_xor(Tensor self, Tensor other) -> Tensor",                                 \
    POINTWISE, logical, logical, XOR)                                                   \
  X(BITWISE_AND_TENSOR, "aten.bitwise_and.Tensor",                                      \
    "bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor",                          \
    POINTWISE, bitwise, binary, BITAND)                                                 \
  X(BITWISE_AND_SCALAR, "aten.bitwise_and.Scalar",                                      \
    "bitwise_and.Scalar(Tensor self, Scalar other) -> Tensor",                          \
    POINTWISE, bitwise, binary, BITAND)                                                 \
  X(BITWISE_OR_TENSOR, "aten.bitwise_or.Tensor",                                        \
    "bitwise_or.Tensor(Tensor self, Tensor other) -> Tensor",                           \
    POINTWISE, bitwise, binary, BITOR)                                                  \
  X(BITWISE_OR_SCALAR, "aten.bitwise_or.Scalar",                                        \
    "bitwise_or.Scalar(Tensor self, Scalar other) -> Tensor",                           \
    POINTWISE, bitwise, binary, BITOR)                                                  \
  X(BITWISE_XOR_TENSOR, "aten.bitwise_xor.Tensor",                                      \
    "bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor",                          \
    POINTWISE, bitwise, binary, BITXOR)                                                 \
  X(BITWISE_XOR_SCALAR, "aten.bitwise_xor.Scalar",                                      \
    "bitwise_xor.Scalar(Tensor self, Scalar other) -> Tensor",                          \
    POINTWISE, bitwise, binary, BITXOR)                                                 \
  X(WHERE_SELF, "aten.where.self",                                                      \
    "where.self(Tensor condition, Tensor self, Tensor other) -> Tensor",                \
    POINTWISE, where, where, NONE)                                                      \
  X(WHERE_SCALARSELF, "aten.where.ScalarSelf",                                          \
    "where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",          \
    POINTWISE, where, where, NONE)                                                      \
  X(WHERE_SCALAROTHER, "aten.where.ScalarOther",                                        \
    "where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor",         \
    POINTWISE, where, where, NONE)                                                      \
  X(WHERE_SCALAR, "aten.where.Scalar",                                                  \
    "where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor",              \
    POINTWISE, where, where, NONE)                                                      \
  X(CLAMP, "aten.clamp.default",                                                        \
    "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",                 \
    POINTWISE, promote, clamp, NONE)                                                    \
  X(CLAMP_TENSOR, "aten.clamp.Tensor",                                                  \
    "clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor",          \
    POINTWISE, promote, clamp, NONE)                                                    \
  X(CLAMP_MIN, "aten.clamp_min.default",                                                \
    "clamp_min(Tensor self, Scalar min) -> Tensor",                                     \
    POINTWISE, promote, binary, MAX)                                                    \
  X(CLAMP_MAX, "aten.clamp_max.default",                                                \
    "clamp_max(Tensor self, Scalar max) -> Tensor",                                     \
    POINTWISE, promote, binary, MIN)                                                    \
  X(CLAMP_MIN_TENSOR, "aten.clamp_min.Tensor",                                          \
    "clamp_min.Tensor(Tensor self, Tensor min) -> Tensor",                              \
    POINTWISE, promote, binary, MAX)                                                    \
  X(CLAMP_MAX_TENSOR, "aten.clamp_max.Tensor",                                          \
    "clamp_max.Tensor(Tensor self, Tensor max) -> Tensor",                              \
    POINTWISE, promote, binary, MIN)                                                    \
  X(NEG, "aten.neg.default",                                                            \
    "neg(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote, unary, NEG)                                                     \
  X(ABS, "aten.abs.default",                                                            \
    "abs(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote, unary, ABS)                                                     \
  X(EXP, "aten.exp.default",                                                            \
    "exp(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, EXP)                                               \
  X(EXP2, "aten.exp2.default",                                                          \
    "exp2(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote_float, unary, EXP2)                                              \
  X(EXPM1, "aten.expm1.default",                                                        \
    "expm1(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote_float, unary, EXPM1)                                             \
  X(LOG, "aten.log.default",                                                            \
    "log(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, LOG)                                               \
  X(LOG1P, "aten.log1p.default",                                                        \
    "log1p(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote_float, unary, LOG1P)                                             \
  X(LOG2, "aten.log2.default",                                                          \
    "log2(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote_float, unary, LOG2)                                              \
  X(SQRT, "aten.sqrt.default",                                                          \
    "sqrt(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote_float, unary, SQRT)                                              \
  X(RSQRT, "aten.rsqrt.default",                                                        \
    "rsqrt(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote_float, unary, RSQRT)                                             \
  X(RECIPROCAL, "aten.reciprocal.default",                                              \
    "reciprocal(Tensor self) -> Tensor",                                                \
    POINTWISE, promote_float, unary, RECIP)                                             \
  X(SIN, "aten.sin.default",                                                            \
    "sin(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, SIN)                                               \
  X(COS, "aten.cos.default",                                                            \
    "cos(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, COS)                                               \
  X(TAN, "aten.tan.default",                                                            \
    "tan(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, TAN)                                               \
  X(TANH, "aten.tanh.default",                                                          \
    "tanh(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote_float, unary, TANH)                                              \
  X(SIGMOID, "aten.sigmoid.default",                                                    \
    "sigmoid(Tensor self) -> Tensor",                                                   \
    POINTWISE, promote_float, unary, SIGMOID)                                           \
  X(ERF, "aten.erf.default",                                                            \
    "erf(Tensor self) -> Tensor",                                                       \
    POINTWISE, promote_float, unary, ERF)                                               \
  X(RELU, "aten.relu.default",                                                          \
    "relu(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote, unary, RELU)                                                    \
  X(GELU, "aten.gelu.default",                                                          \
    "gelu(Tensor self, *, str approximate=\"none\") -> Tensor",                         \
    POINTWISE, promote_float, gelu, NONE)                                               \
  X(SILU, "aten.silu.default",                                                          \
    "silu(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote_float, silu, NONE)                                               \
  X(FLOOR, "aten.floor.default",                                                        \
    "floor(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote, rounding, FLOOR)                                                \
  X(CEIL, "aten.ceil.default",                                                          \
    "ceil(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote, rounding, CEIL)                                                 \
  X(ROUND, "aten.round.default",                                                        \
    "round(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote, rounding, ROUND)                                                \
  X(TRUNC, "aten.trunc.default",                                                        \
    "trunc(Tensor self) -> Tensor",                                                     \
    POINTWISE, promote, rounding, TRUNC)                                                \
  X(SIGN, "aten.sign.default",                                                          \
    "sign(Tensor self) -> Tensor",                                                      \
    POINTWISE, promote, unary, SIGN)                                                    \
  X(SQUARE, "aten.square.default",                                                      \
    "square(Tensor self) -> Tensor",                                                    \
    POINTWISE, promote, square, NONE)                                                   \
  X(LOGICAL_NOT, "aten.logical_not.default",                                            \
    "logical_not(Tensor self) -> Tensor",                                               \
    POINTWISE, predicate, logical, NOT)                                                 \
  X(BITWISE_NOT, "aten.bitwise_not.default",                                            \
    "bitwise_not(Tensor self) -> Tensor",                                               \
    POINTWISE, bitwise, unary, BITNOT)                                                  \
  X(ISNAN, "aten.isnan.default",                                                        \
    "isnan(Tensor self) -> Tensor",                                                     \
    POINTWISE, predicate, predicate, ISNAN)                                             \
  X(ISINF, "aten.isinf.default",                                                        \
    "isinf(Tensor self) -> Tensor",                                                     \
    POINTWISE, predicate, predicate, ISINF)                                             \
  X(TO_COPY, "aten._to_copy.default",                                                   \
    "_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor", \
    POINTWISE, to_copy, to_copy, NONE)                                                  \
  X(CLONE, "aten.clone.default",                                                        \
    "clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor",                \
    POINTWISE, same, copy, NONE)                                                        \
  X(LIFT_FRESH_COPY, "aten.lift_fresh_copy.default",                                    \
    "lift_fresh_copy(Tensor self) -> Tensor",                                           \
    POINTWISE, same, copy, NONE)                                                        \
  X(COPY, "aten.copy.default",                                                          \
    "copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor",                 \
    POINTWISE, copy_into, copy_into, NONE)                                              \
  X(THRESHOLD_BACKWARD, "aten.threshold_backward.default",                              \
    "threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",  \
    POINTWISE, promote, threshold_backward, NONE)                                       \
  X(GELU_BACKWARD, "aten.gelu_backward.default",                                        \
    "gelu_backward(Tensor grad_output, Tensor self, *, str approximate=\"none\") -> Tensor", \
    POINTWISE, promote, gelu_backward, NONE)                                            \
  X(SIGMOID_BACKWARD, "aten.sigmoid_backward.default",                                  \
    "sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor",                    \
    POINTWISE, promote, sigmoid_backward, NONE)                                         \
  X(TANH_BACKWARD, "aten.tanh_backward.default",                                        \
    "tanh_backward(Tensor grad_output, Tensor output) -> Tensor",                       \
    POINTWISE, promote, tanh_backward, NONE)                                            \
  X(VIEW, "aten.view.default",                                                          \
    "view(Tensor(a) self, SymInt[] size) -> Tensor(a)",                                 \
    VIEW, view, reshape, NONE)                                                          \
  X(UNSAFE_VIEW, "aten._unsafe_view.default",                                           \
    "_unsafe_view(Tensor self, SymInt[] size) -> Tensor",                               \
    VIEW, view, reshape, NONE)                                                          \
  X(RESHAPE, "aten.reshape.default",                                                    \
    "reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)",                             \
    VIEW, view, reshape, NONE)                                                          \
  X(PERMUTE, "aten.permute.default",                                                    \
    "permute(Tensor(a) self, int[] dims) -> Tensor(a)",                                 \
    VIEW, permute, permute, NONE)                                                       \
  X(TRANSPOSE, "aten.transpose.int",                                                    \
    "transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)",                   \
    VIEW, transpose, permute, NONE)                                                     \
  X(T, "aten.t.default",                                                                \
    "t(Tensor(a) self) -> Tensor(a)",                                                   \
    VIEW, transpose, permute, NONE)                                                     \
  X(EXPAND, "aten.expand.default",                                                      \
    "expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)",       \
    VIEW, expand, expand, NONE)                                                         \
  X(SQUEEZE, "aten.squeeze.default",                                                    \
    "squeeze(Tensor(a) self) -> Tensor(a)",                                             \
    VIEW, squeeze, reshape, NONE)                                                       \
  X(SQUEEZE_DIM, "aten.squeeze.dim",                                                    \
    "squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)",                                \
    VIEW, squeeze, reshape, NONE)                                                       \
  X(SQUEEZE_DIMS, "aten.squeeze.dims",                                                  \
    "squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)",                             \
    VIEW, squeeze, reshape, NONE)                                                       \
  X(UNSQUEEZE, "aten.unsqueeze.default",                                                \
    "unsqueeze(Tensor(a) self, int dim) -> Tensor(a)",                                  \
    VIEW, unsqueeze, reshape, NONE)                                                     \
  X(SLICE, "aten.slice.Tensor",                                                         \
    "slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)", \
    VIEW, slice, slice, NONE)                                                           \
  X(SELECT, "aten.select.int",                                                          \
    "select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)",                   \
    VIEW, select, select, NONE)                                                         \
  X(AS_STRIDED, "aten.as_strided.default",                                              \
    "as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)", \
    VIEW, as_strided, as_strided, NONE)                                                 \
  X(AS_STRIDED_SCATTER, "aten.as_strided_scatter.default",                              \
    "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor", \
    POINTWISE, as_strided_scatter, as_strided_scatter, NONE)                            \
  X(ALIAS, "aten.alias.default",                                                        \
    "alias(Tensor(a) self) -> Tensor(a)",                                               \
    VIEW, same, alias, NONE)                                                            \
  X(CAT, "aten.cat.default",                                                            \
    "cat(Tensor[] tensors, int dim=0) -> Tensor",                                       \
    POINTWISE, cat, cat, NONE)                                                          \
  X(CONSTANT_PAD_ND, "aten.constant_pad_nd.default",                                    \
    "constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",             \
    POINTWISE, pad, pad, NONE)                                                          \
  X(INDEX_SELECT, "aten.index_select.default",                                          \
    "index_select(Tensor self, int dim, Tensor index) -> Tensor",                       \
    POINTWISE, index_select, index_select, NONE)                                        \
  X(GATHER, "aten.gather.default",                                                      \
    "gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor",  \
    POINTWISE, gather, gather, NONE)                                                    \
  X(INDEX_TENSOR, "aten.index.Tensor",                                                  \
    "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",                           \
    POINTWISE, index, index, NONE)                                                      \
  X(INDEX_PUT, "aten.index_put.default",                                                \
    "index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor", \
    POINTWISE, index_put, index_put, NONE)                                              \
  X(INDEX_PUT_, "aten.index_put_.default",                                              \
    "index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor(a!)", \
    POINTWISE, index_put_input, index_put_input, NONE)                                  \
  X(SCATTER_VALUE, "aten.scatter.value",                                                \
    "scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor",        \
    POINTWISE, scatter, scatter, NONE)                                                  \
  X(EMBEDDING, "aten.embedding.default",                                                \
    "embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor", \
    POINTWISE, embedding, embedding, NONE)                                              \
  X(FULL, "aten.full.default",                                                          \
    "full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, full, full, NONE)                                                        \
  X(FULL_LIKE, "aten.full_like.default",                                                \
    "full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor", \
    POINTWISE, full_like, full, NONE)                                                   \
  X(ZEROS, "aten.zeros.default",                                                        \
    "zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, full, full, NONE)                                                        \
  X(ONES, "aten.ones.default",                                                          \
    "ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, full, full, NONE)                                                        \
  X(ZEROS_LIKE, "aten.zeros_like.default",                                              \
    "zeros_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor", \
    POINTWISE, full_like, full, NONE)                                                   \
  X(ONES_LIKE, "aten.ones_like.default",                                                \
    "ones_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor", \
    POINTWISE, full_like, full, NONE)                                                   \
  X(SCALAR_TENSOR, "aten.scalar_tensor.default",                                        \
    "scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, full, full, NONE)                                                        \
  X(ARANGE, "aten.arange.default",                                                      \
    "arange(Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, arange, arange, NONE)                                                    \
  X(ARANGE_START, "aten.arange.start",                                                  \
    "arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, arange, arange, NONE)                                                    \
  X(ARANGE_START_STEP, "aten.arange.start_step",                                        \
    "arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", \
    POINTWISE, arange, arange, NONE)                                                    \
  X(SUM, "aten.sum.default",                                                            \
    "sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",                            \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(SUM_DIM, "aten.sum.dim_IntList",                                                    \
    "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MEAN, "aten.mean.default",                                                          \
    "mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",                           \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MEAN_DIM, "aten.mean.dim",                                                          \
    "mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(PROD, "aten.prod.default",                                                          \
    "prod(Tensor self, *, ScalarType? dtype=None) -> Tensor",                           \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(PROD_DIM, "aten.prod.dim_int",                                                      \
    "prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(AMAX, "aten.amax.default",                                                          \
    "amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",                   \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(AMIN, "aten.amin.default",                                                          \
    "amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",                   \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MAX, "aten.max.default",                                                            \
    "max(Tensor self) -> Tensor",                                                       \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MIN, "aten.min.default",                                                            \
    "min(Tensor self) -> Tensor",                                                       \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MAX_DIM, "aten.max.dim",                                                            \
    "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(MIN_DIM, "aten.min.dim",                                                            \
    "min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ARGMAX, "aten.argmax.default",                                                      \
    "argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",                 \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ARGMIN, "aten.argmin.default",                                                      \
    "argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",                 \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ANY, "aten.any.default",                                                            \
    "any(Tensor self) -> Tensor",                                                       \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ANY_DIM, "aten.any.dim",                                                            \
    "any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor",                      \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ANY_DIMS, "aten.any.dims",                                                          \
    "any.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor",             \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ALL, "aten.all.default",                                                            \
    "all(Tensor self) -> Tensor",                                                       \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ALL_DIM, "aten.all.dim",                                                            \
    "all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor",                      \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(ALL_DIMS, "aten.all.dims",                                                          \
    "all.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor",             \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(VAR, "aten.var.correction",                                                         \
    "var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(STD, "aten.std.correction",                                                         \
    "std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(VAR_MEAN, "aten.var_mean.correction",                                               \
    "var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)", \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(CUMSUM, "aten.cumsum.default",                                                      \
    "cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",                \
    REDUCTION, cumsum, cumsum, NONE)                                                    \
  X(LOGSUMEXP, "aten.logsumexp.default",                                                \
    "logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor",                 \
    REDUCTION, reduce, reduce, NONE)                                                    \
  X(SOFTMAX, "aten._softmax.default",                                                   \
    "_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",                     \
    REDUCTION, softmax, softmax, NONE)                                                  \
  X(LOG_SOFTMAX, "aten._log_softmax.default",                                           \
    "_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",                 \
    REDUCTION, softmax, softmax, NONE)                                                  \
  X(SOFTMAX_INT, "aten.softmax.int",                                                    \
    "softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",              \
    REDUCTION, softmax, softmax, NONE)                                                  \
  X(LOG_SOFTMAX_INT, "aten.log_softmax.int",                                            \
    "log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",          \
    REDUCTION, softmax, softmax, NONE)                                                  \
  X(SOFTMAX_BACKWARD, "aten._softmax_backward_data.default",                            \
    "_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor", \
    REDUCTION, softmax_backward, softmax_backward, NONE)                                \
  X(LOG_SOFTMAX_BACKWARD, "aten._log_softmax_backward_data.default",                    \
    "_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor", \
    REDUCTION, softmax_backward, softmax_backward, NONE)                                \
  X(NATIVE_LAYER_NORM, "aten.native_layer_norm.default",                                \
    "native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)", \
    REDUCTION, layer_norm, layer_norm, NONE)                                            \
  X(LAYER_NORM, "aten.layer_norm.default",                                              \
    "layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1.0000000000000001e-05, bool cudnn_enable=True) -> Tensor", \
    REDUCTION, layer_norm, layer_norm, NONE)                                            \
  X(RMS_NORM, "aten.rms_norm.default",                                                  \
    "rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor", \
    REDUCTION, layer_norm, rms_norm, NONE)                                              \
  X(NATIVE_LAYER_NORM_BACKWARD, "aten.native_layer_norm_backward.default",              \
    "native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)", \
    REDUCTION, layer_norm_backward, layer_norm_backward, NONE)                          \
  X(BATCH_NORM_NO_TRAINING, "aten._native_batch_norm_legit_no_training.default",        \
    "_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)", \
    POINTWISE, batch_norm, batch_norm, NONE)                                            \
  X(BATCH_NORM_FUNCTIONAL, "aten._native_batch_norm_legit_functional.default",               \
    "_native_batch_norm_legit_functional(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)",\
    REDUCTION, batch_norm_train, batch_norm_train, NONE)                                \
  X(DROPOUT, "aten.dropout.default",                                                    \
    "dropout(Tensor input, float p, bool train) -> Tensor",                             \
    POINTWISE, same, dropout, NONE)                                                     \
  X(EMBEDDING_DENSE_BACKWARD, "aten.embedding_dense_backward.default",                  \
    "embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor", \
    REDUCTION, embedding_backward, embedding_backward, NONE)                            \
  X(MM, "aten.mm.default",                                                              \
    "mm(Tensor self, Tensor mat2) -> Tensor",                                           \
    EXTERN, matmul, matmul, NONE)                                                       \
  X(BMM, "aten.bmm.default",                                                            \
    "bmm(Tensor self, Tensor mat2) -> Tensor",                                          \
    EXTERN, matmul, matmul, NONE)                                                       \
  X(ADDMM, "aten.addmm.default",                                                        \
    "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", \
    EXTERN, matmul, matmul, NONE)                                                       \
  X(MATMUL, "aten.matmul.default",                                                      \
    "matmul(Tensor self, Tensor other) -> Tensor",                                      \
    EXTERN, matmul, matmul, NONE)                                                       \
  X(LINEAR, "aten.linear.default",                                                      \
    "linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",                 \
    EXTERN, matmul, matmul, NONE)                                                       \
  X(CONVOLUTION, "aten.convolution.default",                                            \
    "convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor", \
    EXTERN, conv, conv, NONE)                                                           \
  X(CONVOLUTION_BACKWARD, "aten.convolution_backward.default",                          \
    "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)", \
    EXTERN, conv_backward, conv_backward, NONE)                                         \
  X(MAX_POOL2D, "aten.max_pool2d_with_indices.default",                                 \
    "max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)", \
    REDUCTION, max_pool2d, max_pool2d, NONE)                                            \
  X(MAX_POOL2D_BACKWARD, "aten.max_pool2d_with_indices_backward.default",               \
    "max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor", \
    REDUCTION, max_pool2d_backward, max_pool2d_backward, NONE)                          \
  X(AVG_POOL2D, "aten.avg_pool2d.default",                                              \
    "avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor", \
    REDUCTION, avg_pool2d, avg_pool2d, NONE)                                            \
  X(AVG_POOL2D_BACKWARD, "aten.avg_pool2d_backward.default",                            \
    "avg_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor", \
    REDUCTION, avg_pool2d_backward, avg_pool2d_backward, NONE)                          \
  X(ADAPTIVE_AVG_POOL2D, "aten._adaptive_avg_pool2d.default",                           \
    "_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor",               \
    REDUCTION, adaptive_avg_pool2d, adaptive_avg_pool2d, NONE)                          \
  X(ADAPTIVE_AVG_POOL2D_BACKWARD, "aten._adaptive_avg_pool2d_backward.default",         \
    "_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor",         \
    REDUCTION, adaptive_avg_pool2d_backward, adaptive_avg_pool2d_backward, NONE)        \
  X(NATIVE_DROPOUT, "aten.native_dropout.default",                                      \
    "native_dropout(Tensor input, float p, bool? train, *, Tensor? seed=None) -> (Tensor, Tensor)", \
    POINTWISE, native_dropout, native_dropout, NONE)                                    \
  X(ATTENTION_CPU, "aten._scaled_dot_product_flash_attention_for_cpu.default",          \
    "_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp)", \
    EXTERN, attention, attention, NONE)                                                 \
  X(ATTENTION_CPU_BACKWARD, "aten._scaled_dot_product_flash_attention_for_cpu_backward.default", \
    "_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)", \
    EXTERN, attention_backward, attention_backward, NONE)

/* X(ID, arity, "name") — loop-IR scalar primitives. LOAD reads a buffer
 * element, CONST is a literal, CAST converts between dtypes, INDEX is the
 * value of an index expression (idx[0]) as int64. REDUCE folds its body
 * (a) over bound loop variables (see loop.h); EXTERN is a library call
 * (matmul) whose operands a, b are loads. Comparisons, ISNAN/ISINF and the
 * logical ops yield bool; WHERE(a, b, c) is a ? b : c. */
#define TCC_PRIMS(X)                                                                   \
  X(NONE, 0, "none")                                                                   \
  X(LOAD, 0, "load")                                                                   \
  X(CONST, 0, "const")                                                                 \
  X(INDEX, 0, "index")                                                                 \
  X(CAST, 1, "cast")                                                                   \
  X(REDUCE, 1, "reduce")                                                               \
  X(EXTERN, 2, "extern")                                                               \
  X(NEG, 1, "neg")                                                                     \
  X(ABS, 1, "abs")                                                                     \
  X(EXP, 1, "exp")                                                                     \
  X(EXP2, 1, "exp2")                                                                   \
  X(EXPM1, 1, "expm1")                                                                 \
  X(LOG, 1, "log")                                                                     \
  X(LOG1P, 1, "log1p")                                                                 \
  X(LOG2, 1, "log2")                                                                   \
  X(SQRT, 1, "sqrt")                                                                   \
  X(RSQRT, 1, "rsqrt")                                                                 \
  X(RECIP, 1, "reciprocal")                                                            \
  X(SIN, 1, "sin")                                                                     \
  X(COS, 1, "cos")                                                                     \
  X(TAN, 1, "tan")                                                                     \
  X(TANH, 1, "tanh")                                                                   \
  X(SIGMOID, 1, "sigmoid")                                                             \
  X(ERF, 1, "erf")                                                                     \
  X(NDTR, 1, "ndtr")        /* the standard normal CDF: (1 + erf(x / sqrt 2)) / 2 */  \
  X(RELU, 1, "relu")                                                                   \
  X(FLOOR, 1, "floor")                                                                 \
  X(CEIL, 1, "ceil")                                                                   \
  X(ROUND, 1, "round")                                                                 \
  X(TRUNC, 1, "trunc")                                                                 \
  X(SIGN, 1, "sign")                                                                   \
  X(NOT, 1, "not")                                                                     \
  X(BITNOT, 1, "bitnot")                                                               \
  X(ISNAN, 1, "isnan")                                                                 \
  X(ISINF, 1, "isinf")                                                                 \
  X(ADD, 2, "add")                                                                     \
  X(SUB, 2, "sub")                                                                     \
  X(MUL, 2, "mul")                                                                     \
  X(DIV, 2, "div")                                                                     \
  X(FLOORDIV, 2, "floordiv")                                                           \
  X(TRUNCDIV, 2, "truncdiv")                                                           \
  X(POW, 2, "pow")                                                                     \
  X(MAX, 2, "maximum")                                                                 \
  X(MIN, 2, "minimum")                                                                 \
  X(FMOD, 2, "fmod")                                                                   \
  X(REM, 2, "remainder")                                                               \
  X(ATAN2, 2, "atan2")                                                                 \
  X(EQ, 2, "eq")                                                                       \
  X(NE, 2, "ne")                                                                       \
  X(LT, 2, "lt")                                                                       \
  X(LE, 2, "le")                                                                       \
  X(GT, 2, "gt")                                                                       \
  X(GE, 2, "ge")                                                                       \
  X(AND, 2, "and")                                                                     \
  X(OR, 2, "or")                                                                       \
  X(XOR, 2, "xor")                                                                     \
  X(BITAND, 2, "bitand")                                                               \
  X(BITOR, 2, "bitor")                                                                 \
  X(BITXOR, 2, "bitxor")                                                               \
  X(WHERE, 3, "where")

typedef enum tcc_op_id {
#define TCC_OP_ENUM(id, name, schema, kind, infer, lower, prim) TCC_OP_##id,
  TCC_OPS(TCC_OP_ENUM)
#undef TCC_OP_ENUM
  TCC_OP_COUNT
} tcc_op_id;

typedef enum tcc_prim {
#define TCC_PRIM_ENUM(id, arity, name) TCC_PRIM_##id,
  TCC_PRIMS(TCC_PRIM_ENUM)
#undef TCC_PRIM_ENUM
  TCC_PRIM_COUNT
} tcc_prim;

typedef enum tcc_op_kind {
  TCC_OPK_POINTWISE,
  TCC_OPK_REDUCTION,
  TCC_OPK_VIEW,
  TCC_OPK_EXTERN,
} tcc_op_kind;

#endif
