/*
 * reqb.h — build tcc.v1.CompileRequest messages by hand in tests.
 *
 * A reqb owns every part of the message it builds (fixed-size tables, no
 * per-field frees); reqb_req() gives the message, which a test may also
 * poke at directly to make it invalid. Free everything with reqb_free.
 *
 *   reqb *b = reqb_new("x86-64-v2");
 *   reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){10, 10}, NULL, 0);
 *   ...
 *   reqb_input(b, "x");
 *   Tcc__V1__Node *n = reqb_node(b, "aten.sin.default", "s");
 *   reqb_arg_tensor(b, n, "self", "x");
 *   reqb_output(b, "s");
 */
#ifndef TCC_TEST_REQB_H
#define TCC_TEST_REQB_H

#include <stddef.h>
#include <stdint.h>

#include "tcc/v1/tcc.pb-c.h"

typedef struct reqb reqb;

/* A CPU request for ISA isa ("" = default). */
reqb *reqb_new(const char *isa);
void reqb_free(reqb *b);

/* Declares a value. strides NULL = contiguous. Returns its meta. */
Tcc__V1__TensorMeta *reqb_value(reqb *b, const char *name, Tcc__V1__DType dt, int rank,
                                const int64_t *sizes, const int64_t *strides, int64_t offset);
void reqb_input(reqb *b, const char *name);
void reqb_output(reqb *b, const char *name);
void reqb_constant(reqb *b, const char *name, const void *data, size_t len);

/* A node with one output (out may be NULL for none). */
Tcc__V1__Node *reqb_node(reqb *b, const char *target, const char *out);
/* Adds another output name to n. */
void reqb_node_output(reqb *b, Tcc__V1__Node *n, const char *out);

/* Arguments; param "" binds positionally. Each returns the Argument. */
Tcc__V1__Argument *reqb_arg_tensor(reqb *b, Tcc__V1__Node *n, const char *param, const char *value);
Tcc__V1__Argument *reqb_arg_int(reqb *b, Tcc__V1__Node *n, const char *param, int64_t v);
Tcc__V1__Argument *reqb_arg_float(reqb *b, Tcc__V1__Node *n, const char *param, double v);
Tcc__V1__Argument *reqb_arg_bool(reqb *b, Tcc__V1__Node *n, const char *param, int v);
Tcc__V1__Argument *reqb_arg_none(reqb *b, Tcc__V1__Node *n, const char *param);
Tcc__V1__Argument *reqb_arg_ints(reqb *b, Tcc__V1__Node *n, const char *param, int count,
                                 const int64_t *v);

/* Convenience: out = target(self=x) / target(self=x, other=y). The values
 * must be declared separately. */
Tcc__V1__Node *reqb_unary(reqb *b, const char *target, const char *x, const char *out);
Tcc__V1__Node *reqb_binary(reqb *b, const char *target, const char *x, const char *y,
                           const char *out);

Tcc__V1__CompileRequest *reqb_req(reqb *b);
Tcc__V1__Target *reqb_target(reqb *b);
Tcc__V1__Options *reqb_options(reqb *b);
/* The encoded request (malloc'ed). */
uint8_t *reqb_pack(reqb *b, size_t *len);
/* A string owned by the builder (for poking names into the message). */
char *reqb_str(reqb *b, const char *s);

#endif
