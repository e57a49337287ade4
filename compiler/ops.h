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

#define TCC_OPS(X)                                                                     \
  /* pointwise binary: tensor (x) tensor, with PyTorch broadcasting */                 \
  X(ADD_TENSOR, "aten.add.Tensor",                                                     \
    "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",              \
    POINTWISE, promote, binary, ADD)                                                   \
  X(SUB_TENSOR, "aten.sub.Tensor",                                                     \
    "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",              \
    POINTWISE, promote, binary, SUB)                                                   \
  X(MUL_TENSOR, "aten.mul.Tensor",                                                     \
    "mul.Tensor(Tensor self, Tensor other) -> Tensor",                                 \
    POINTWISE, promote, binary, MUL)                                                   \
  X(DIV_TENSOR, "aten.div.Tensor",                                                     \
    "div.Tensor(Tensor self, Tensor other) -> Tensor",                                 \
    POINTWISE, promote_float, binary, DIV)                                             \
  /* pointwise binary: tensor (x) scalar */                                            \
  X(ADD_SCALAR, "aten.add.Scalar",                                                     \
    "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",                 \
    POINTWISE, promote, binary, ADD)                                                   \
  X(SUB_SCALAR, "aten.sub.Scalar",                                                     \
    "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",                 \
    POINTWISE, promote, binary, SUB)                                                   \
  X(MUL_SCALAR, "aten.mul.Scalar",                                                     \
    "mul.Scalar(Tensor self, Scalar other) -> Tensor",                                 \
    POINTWISE, promote, binary, MUL)                                                   \
  X(DIV_SCALAR, "aten.div.Scalar",                                                     \
    "div.Scalar(Tensor self, Scalar other) -> Tensor",                                 \
    POINTWISE, promote_float, binary, DIV)                                             \
  /* pointwise unary */                                                                \
  X(NEG, "aten.neg.default", "neg(Tensor self) -> Tensor",                             \
    POINTWISE, promote, unary, NEG)                                                    \
  X(ABS, "aten.abs.default", "abs(Tensor self) -> Tensor",                             \
    POINTWISE, promote, unary, ABS)                                                    \
  X(EXP, "aten.exp.default", "exp(Tensor self) -> Tensor",                             \
    POINTWISE, promote_float, unary, EXP)                                              \
  X(LOG, "aten.log.default", "log(Tensor self) -> Tensor",                             \
    POINTWISE, promote_float, unary, LOG)                                              \
  X(SQRT, "aten.sqrt.default", "sqrt(Tensor self) -> Tensor",                          \
    POINTWISE, promote_float, unary, SQRT)                                             \
  X(SIN, "aten.sin.default", "sin(Tensor self) -> Tensor",                             \
    POINTWISE, promote_float, unary, SIN)                                              \
  X(COS, "aten.cos.default", "cos(Tensor self) -> Tensor",                             \
    POINTWISE, promote_float, unary, COS)                                              \
  X(TANH, "aten.tanh.default", "tanh(Tensor self) -> Tensor",                          \
    POINTWISE, promote_float, unary, TANH)                                             \
  X(SIGMOID, "aten.sigmoid.default", "sigmoid(Tensor self) -> Tensor",                 \
    POINTWISE, promote_float, unary, SIGMOID)                                          \
  X(RELU, "aten.relu.default", "relu(Tensor self) -> Tensor",                          \
    POINTWISE, promote, unary, RELU)

/* X(ID, arity, "name") — loop-IR scalar primitives. LOAD reads a buffer
 * element, CONST is a literal, CAST converts between dtypes. */
#define TCC_PRIMS(X)                                                                   \
  X(NONE, 0, "none")                                                                   \
  X(LOAD, 0, "load")                                                                   \
  X(CONST, 0, "const")                                                                 \
  X(CAST, 1, "cast")                                                                   \
  X(NEG, 1, "neg")                                                                     \
  X(ABS, 1, "abs")                                                                     \
  X(EXP, 1, "exp")                                                                     \
  X(LOG, 1, "log")                                                                     \
  X(SQRT, 1, "sqrt")                                                                   \
  X(SIN, 1, "sin")                                                                     \
  X(COS, 1, "cos")                                                                     \
  X(TANH, 1, "tanh")                                                                   \
  X(SIGMOID, 1, "sigmoid")                                                             \
  X(RELU, 1, "relu")                                                                   \
  X(ADD, 2, "add")                                                                     \
  X(SUB, 2, "sub")                                                                     \
  X(MUL, 2, "mul")                                                                     \
  X(DIV, 2, "div")

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
