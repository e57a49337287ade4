/*
 * test_prepare.c — tcc_prepare / tcc_prepare_bytes: every rejected input
 * gets its status and a message naming the node or value and the problem;
 * the guard hash ignores what must not matter and sees what must.
 *
 * Requests are built with reqb (protobuf-c structs) and go through both
 * entry points (struct and encoded bytes) unless the defect cannot be
 * encoded (NULL pointers, counts beyond the arrays).
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "pbjson.h"
#include "tcctest.h"

#define F32 TCC__V1__DTYPE__FLOAT32
#define F64 TCC__V1__DTYPE__FLOAT64
#define ID "tccd-codegen/1 cc=test"

static const int64_t S10x10[] = {10, 10};

/* foo(x, y) = sin(x) + cos(y) on 10x10 float32, as tests/graphs/sin_cos.json. */
static reqb *sin_cos(void) { return reqb_sin_cos("x86-64-v2"); }

/* Prepares b through the struct entry point and (unless struct_only)
 * through the bytes entry point; both must agree. Returns the code and
 * fills err; *out gets the struct result (caller frees). */
static int prep2(reqb *b, int struct_only, tcc_prepared **out, tcc_error *err) {
  tcc_prepared *p1 = NULL, *p2 = NULL;
  tcc_error e2;
  int rc1 = tcc_prepare(reqb_req(b), ID, &p1, err);
  if (!struct_only) {
    size_t len;
    uint8_t *buf = reqb_pack(b, &len);
    int rc2 = tcc_prepare_bytes(buf, len, ID, &p2, &e2);
    free(buf);
    ck_assert_int_eq(rc1, rc2);
    if (rc1) ck_assert_str_eq(err->msg, e2.msg);
    else ck_assert_str_eq(p1->hash_hex, p2->hash_hex);
    tcc_prepared_free(p2);
  }
  if (rc1) ck_assert_ptr_null(p1);
  else ck_assert_ptr_nonnull(p1);
  if (out) *out = p1;
  else tcc_prepared_free(p1);
  return rc1;
}

/* Asserts that b is rejected with `code` and a message containing each
 * of the NULL-terminated substrings. */
static void expect_err_(reqb *b, int struct_only, int code, const char *const *want,
                        const char *file, int line) {
  tcc_error err;
  int rc = prep2(b, struct_only, NULL, &err);
  ck_assert_msg(rc == code, "%s:%d: want %s, got %s (%s)", file, line, tcc_status_name(code),
                tcc_status_name(rc), rc ? err.msg : "ok");
  for (; *want; want++)
    ck_assert_msg(strstr(err.msg, *want) != NULL, "%s:%d: message '%s' lacks '%s'", file, line,
                  err.msg, *want);
  reqb_free(b);
}
#define EXPECT_ERR(b, code, ...) \
  expect_err_((b), 0, (code), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)
#define EXPECT_ERR_STRUCT(b, code, ...) \
  expect_err_((b), 1, (code), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)

static Tcc__V1__TensorMeta *meta_of(reqb *b, size_t i) { return reqb_req(b)->graph->values[i]->meta; }

/* ------------------------------------------------------------- good */

START_TEST(sin_cos_prepares) {
  reqb *b = sin_cos();
  tcc_prepared *p;
  tcc_error err;
  ck_assert_int_eq(prep2(b, 0, &p, &err), 0);
  ck_assert_str_eq(p->target, "cpu:x86-64-v2");
  ck_assert_int_eq(p->device, TCC__V1__DEVICE_TYPE__CPU);
  ck_assert_int_eq(p->nodes, 3);
  ck_assert_uint_gt(p->key_len, 4);
  ck_assert(memcmp(p->key, "TCCK", 4) == 0);
  uint8_t h[TCC_SHA256_BYTES];
  char hex[TCC_SHA256_HEX];
  tcc_sha256(p->key, p->key_len, h);
  ck_assert(memcmp(h, p->hash, sizeof h) == 0);
  tcc_hex_encode(h, sizeof h, hex);
  ck_assert_str_eq(hex, p->hash_hex);
  ck_assert_ptr_nonnull(memmem(p->key, p->key_len, ID, strlen(ID)));
  ck_assert_ptr_nonnull(memmem(p->key, p->key_len, "aten.sin.default", 16));
  /* no value name in the key */
  ck_assert_ptr_null(memmem(p->key, p->key_len, "cos\0", 4));
  tcc_prepared_free(p);
  reqb_free(b);
}
END_TEST

/* The checked-in example graphs decode (pbjson) and prepare; sin_cos.json
 * hashes like the hand-built one (names and client label differ). */
START_TEST(json_graphs) {
  static const char *const files[] = {"sin_cos.json", "pointwise_chain_f64.json"};
  char first_hash[TCC_SHA256_HEX] = "";
  for (size_t i = 0; i < 2; i++) {
    size_t len;
    char *json = tt_graph_read(files[i], &len);
    ck_assert_msg(json != NULL, "cannot read %s", tt_graph_path(files[i]));
    ProtobufCMessage *m;
    tcc_error err;
    ck_assert_msg(tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, json, len, &m, &err) == 0,
                  "%s: %s", files[i], err.msg);
    tcc_prepared *p;
    int rc = tcc_prepare((Tcc__V1__CompileRequest *)m, ID, &p, &err);
    ck_assert_msg(rc == 0, "%s: %s", files[i], err.msg);
    if (i == 0) strcpy(first_hash, p->hash_hex);
    tcc_prepared_free(p);
    protobuf_c_message_free_unpacked(m, NULL);
    free(json);
  }
  reqb *b = sin_cos();
  tcc_prepared *p;
  tcc_error err;
  ck_assert_int_eq(prep2(b, 0, &p, &err), 0);
  ck_assert_str_eq(p->hash_hex, first_hash);
  tcc_prepared_free(p);
  reqb_free(b);
}
END_TEST

/* ---------------------------------------------------- decode errors */

START_TEST(garbage_and_truncated) {
  tcc_prepared *p = (tcc_prepared *)1;
  tcc_error err;
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
  ck_assert_int_eq(tcc_prepare_bytes(garbage, sizeof garbage, ID, &p, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
  ck_assert_ptr_nonnull(strstr(err.msg, "malformed CompileRequest: "));

  reqb *b = sin_cos();
  size_t len;
  uint8_t *buf = reqb_pack(b, &len);
  /* every cut that ends before the target field is complete must fail
   * (a cut after it may leave a valid request: options are optional) */
  size_t graph_end = len - tcc__v1__target__get_packed_size(reqb_req(b)->target) -
                     tcc__v1__options__get_packed_size(reqb_req(b)->options) -
                     strlen(reqb_req(b)->client) - 6;
  for (size_t cut = 1; cut < graph_end; cut += 3) {
    int rc = tcc_prepare_bytes(buf, cut, ID, &p, &err);
    ck_assert_msg(rc == TCC_E_INVALID_ARGUMENT, "cut %zu: %s", cut, rc ? err.msg : "ok");
    ck_assert_msg(strstr(err.msg, "malformed CompileRequest") || strstr(err.msg, "graph") ||
                      strstr(err.msg, "target") || strstr(err.msg, "value"),
                  "cut %zu: %s", cut, err.msg);
  }
  /* a cut inside the graph message names where */
  ck_assert_int_eq(tcc_prepare_bytes(buf, len / 2, ID, &p, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "malformed CompileRequest: "));
  ck_assert_ptr_nonnull(strstr(err.msg, "field 'graph' (1) at byte 0 claims"));
  /* damage deep inside: the path names the message. graph { values {
   * name: "x", meta { dtype: <truncated varint> } } } */
  static const uint8_t deep[] = {0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, 'x', 0x12, 0x02, 0x08, 0x80};
  ck_assert_int_eq(tcc_prepare_bytes(deep, sizeof deep, ID, &p, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_str_eq(err.msg, "malformed CompileRequest: graph.values[0].meta: truncated varint at byte 10");
  free(buf);
  reqb_free(b);

  /* wrong wire type for a message field */
  static const uint8_t wt[] = {0x08, 0x01};   /* field 1 (graph) as varint */
  ck_assert_int_eq(tcc_prepare_bytes(wt, sizeof wt, ID, &p, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "wire type"));
  ck_assert_int_eq(tcc_prepare_bytes(NULL, 0, ID, &p, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.msg, "no graph"));
}
END_TEST

START_TEST(too_big) {
  static const uint8_t small[8];
  tcc_prepared *p;
  tcc_error err;
  /* the length is checked before a byte is read */
  ck_assert_int_eq(tcc_prepare_bytes(small, (size_t)TCC_MAX_REQUEST_BYTES + 1, ID, &p, &err),
                   TCC_E_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(err.msg, "limit"));

  reqb *b = sin_cos();
  reqb_req(b)->graph->n_nodes = TCC_MAX_NODES + 1;
  EXPECT_ERR_STRUCT(b, TCC_E_RESOURCE_EXHAUSTED, "nodes", "limit 65536");
  b = sin_cos();
  reqb_req(b)->graph->n_values = TCC_MAX_VALUES + 1;
  EXPECT_ERR_STRUCT(b, TCC_E_RESOURCE_EXHAUSTED, "values", "limit 131072");
}
END_TEST

/* ------------------------------------------------- structure errors */

START_TEST(missing_parts) {
  reqb *b = sin_cos();
  reqb_req(b)->graph = NULL;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "request has no graph");
  b = sin_cos();
  reqb_req(b)->target = NULL;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "request has no target");
  b = sin_cos();
  reqb_req(b)->graph->n_outputs = 0;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "graph has no outputs");
}
END_TEST

START_TEST(names_and_definitions) {
  reqb *b = sin_cos();
  reqb_value(b, "x", F32, 2, S10x10, NULL, 0);
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "duplicate value name 'x'", "values 0 and 5");

  b = sin_cos();   /* node input names an unknown value */
  reqb_req(b)->graph->nodes[2]->inputs[1]->arg->as_tensor->name = reqb_str(b, "nope");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)", "argument 'other'",
             "unknown value 'nope'");

  b = sin_cos();   /* declared, never defined, used */
  reqb_value(b, "ghost", F32, 2, S10x10, NULL, 0);
  reqb_req(b)->graph->nodes[2]->inputs[1]->arg->as_tensor->name = reqb_str(b, "ghost");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)", "'ghost'", "nothing defines");

  b = sin_cos();   /* graph output dangling */
  reqb_output(b, "nowhere");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "graph output 1", "unknown value 'nowhere'");

  b = sin_cos();   /* graph output declared but undefined */
  reqb_value(b, "ghost", F32, 2, S10x10, NULL, 0);
  reqb_output(b, "ghost");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "graph output 1", "'ghost'", "nothing defines");

  b = sin_cos();   /* a node redefines an input */
  reqb_req(b)->graph->nodes[0]->outputs[0] = reqb_str(b, "x");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x' is defined twice",
             "graph input 0", "node 0 (aten.sin.default)");

  b = sin_cos();   /* two nodes define one value */
  reqb_req(b)->graph->nodes[1]->outputs[0] = reqb_str(b, "sin");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'sin' is defined twice", "node 0", "node 1");

  b = sin_cos();   /* an input listed twice */
  reqb_input(b, "x");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x' is defined twice", "graph input 2");

  b = sin_cos();
  reqb_input(b, "undeclared");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "graph input 2 'undeclared' has no TensorValue");

  b = sin_cos();
  reqb_req(b)->graph->nodes[0]->outputs[0] = reqb_str(b, "undeclared");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.sin.default)", "output 'undeclared' has no TensorValue");

  b = sin_cos();   /* hostile names are quoted safely */
  reqb_req(b)->graph->nodes[2]->inputs[0]->arg->as_tensor->name = reqb_str(b, "a\n'b\x01");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "unknown value 'a??b?'");
}
END_TEST

START_TEST(cycles) {
  reqb *b = sin_cos();   /* sin reads its own output */
  reqb_req(b)->graph->nodes[0]->inputs[0]->arg->as_tensor->name = reqb_str(b, "sin");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.sin.default)", "cycle", "own output 'sin'");

  b = sin_cos();   /* sin(cos), cos(sin) */
  reqb_req(b)->graph->nodes[0]->inputs[0]->arg->as_tensor->name = reqb_str(b, "cos");
  reqb_req(b)->graph->nodes[1]->inputs[0]->arg->as_tensor->name = reqb_str(b, "sin");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "cycle", "defined by node");

  /* Nodes out of order are fine: they are sorted. */
  b = sin_cos();
  Tcc__V1__Graph *g = reqb_req(b)->graph;
  Tcc__V1__Node *t = g->nodes[0];
  g->nodes[0] = g->nodes[2];
  g->nodes[2] = t;
  tcc_error err;
  ck_assert_msg(prep2(b, 0, NULL, &err) == 0, "%s", err.msg);
  reqb_free(b);
}
END_TEST

START_TEST(arity_and_types) {
  reqb *b = sin_cos();
  reqb_arg_tensor(b, reqb_req(b)->graph->nodes[0], "", "y");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.sin.default)",
             "too many arguments: 2 given, aten.sin.default takes 1");

  b = sin_cos();
  reqb_req(b)->graph->nodes[2]->n_inputs = 1;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)", "missing required argument 'other'");

  b = sin_cos();
  reqb_arg_int(b, reqb_req(b)->graph->nodes[2], "beta", 2);
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)", "unknown parameter 'beta'");

  b = sin_cos();
  reqb_arg_tensor(b, reqb_req(b)->graph->nodes[2], "self", "x");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2", "parameter 'self' given twice");

  b = sin_cos();   /* tensor where an int is expected, and the reverse */
  Tcc__V1__Argument *a = reqb_req(b)->graph->nodes[2]->inputs[1]->arg;
  a->kind_case = TCC__V1__ARGUMENT__KIND_AS_INT;
  a->as_int = 3;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)",
             "argument 'other' must be Tensor, got int");

  b = sin_cos();
  reqb_arg_tensor(b, reqb_req(b)->graph->nodes[2], "alpha", "x");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "argument 'alpha' must be Scalar, got Tensor");

  b = sin_cos();
  reqb_arg_int(b, reqb_req(b)->graph->nodes[2], "", 2);   /* alpha is keyword-only */
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2", "keyword-only", "'alpha'");

  b = sin_cos();
  reqb_req(b)->graph->nodes[0]->inputs[0]->arg->kind_case = TCC__V1__ARGUMENT__KIND__NOT_SET;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0", "argument 'self' has no value");

  b = sin_cos();
  reqb_node_output(b, reqb_req(b)->graph->nodes[0], "extra");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.sin.default): 2 outputs given, the op returns 1");

  b = sin_cos();
  reqb_req(b)->graph->nodes[1]->target = reqb_str(b, "aten.foo.bar");
  EXPECT_ERR(b, TCC_E_UNIMPLEMENTED, "unsupported op 'aten.foo.bar' (node 1)");
}
END_TEST

START_TEST(bad_metas) {
  reqb *b = sin_cos();
  meta_of(b, 0)->dtype = TCC__V1__DTYPE__DTYPE_UNSPECIFIED;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "dtype is unspecified");

  b = sin_cos();
  meta_of(b, 1)->dtype = (Tcc__V1__DType)42;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'y'", "unknown dtype 42");

  b = sin_cos();
  meta_of(b, 0)->sizes[1] = -3;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "negative size -3 in dim 1");

  b = sin_cos();
  static const int64_t big[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  reqb_value(b, "r17", F32, 16, big, NULL, 0);
  Tcc__V1__TensorMeta *m = meta_of(b, 5);
  m->n_sizes = m->n_strides = 17;   /* arrays hold 16: never read past the check */
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'r17'", "rank 17 exceeds TCC_MAX_DIMS (16)");

  b = sin_cos();
  meta_of(b, 0)->sizes[0] = (int64_t)1 << 32;
  meta_of(b, 0)->sizes[1] = (int64_t)1 << 32;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "element count", "overflows int64");

  b = sin_cos();
  meta_of(b, 0)->sizes[0] = (int64_t)1 << 62;
  meta_of(b, 0)->sizes[1] = 1;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "byte size", "overflows int64");

  b = sin_cos();
  meta_of(b, 0)->n_strides = 1;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "1 strides for 2 sizes");

  b = sin_cos();
  meta_of(b, 1)->strides[0] = -10;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'y'", "negative stride -10 in dim 0");

  b = sin_cos();
  meta_of(b, 0)->strides[0] = (int64_t)1 << 62;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "reach past int64");

  b = sin_cos();
  meta_of(b, 0)->storage_offset = INT64_MAX;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "reach past int64");

  b = sin_cos();
  meta_of(b, 0)->storage_offset = ((int64_t)1 << 62) - 1000;   /* index fits, bytes do not */
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "byte span");

  b = sin_cos();
  meta_of(b, 0)->storage_offset = -1;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "negative storage_offset");

  b = sin_cos();
  meta_of(b, 0)->device->type = TCC__V1__DEVICE_TYPE__CUDA;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x' is on cuda but the target is cpu");

  b = sin_cos();
  meta_of(b, 0)->device->type = (Tcc__V1__DeviceType)9;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'x'", "unknown device type 9");

  b = sin_cos();
  meta_of(b, 0)->device = NULL;   /* no device: the target's */
  tcc_error err;
  ck_assert_msg(prep2(b, 0, NULL, &err) == 0, "%s", err.msg);
  reqb_free(b);

  b = sin_cos();
  reqb_req(b)->graph->values[2]->meta = NULL;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'sin'", "has no meta");
}
END_TEST

START_TEST(shape_and_dtype_rules) {
  reqb *b = sin_cos();
  meta_of(b, 4)->sizes[1] = 9;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)",
             "output 'add' is declared with shape [10, 9] but the op produces [10, 10]");

  b = sin_cos();
  meta_of(b, 4)->dtype = F64;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 2 (aten.add.Tensor)",
             "output 'add' is declared float64 but the op produces float32");

  b = sin_cos();   /* sin of a [10, 10] declared as [10] */
  meta_of(b, 2)->n_sizes = meta_of(b, 2)->n_strides = 1;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.sin.default)", "[10] but the op produces [10, 10]");

  b = reqb_new("");   /* [3] + [4] */
  reqb_value(b, "a", F32, 1, (int64_t[]){3}, NULL, 0);
  reqb_value(b, "b", F32, 1, (int64_t[]){4}, NULL, 0);
  reqb_value(b, "c", F32, 1, (int64_t[]){4}, NULL, 0);
  reqb_input(b, "a");
  reqb_input(b, "b");
  reqb_binary(b, "aten.mul.Tensor", "a", "b", "c");
  reqb_output(b, "c");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.mul.Tensor)", "shapes [3] and [4] cannot broadcast");

  b = reqb_new("");   /* each operand fits, the broadcast does not */
  reqb_value(b, "a", F32, 1, (int64_t[]){(int64_t)1 << 40}, NULL, 0);
  reqb_value(b, "b", F32, 2, (int64_t[]){(int64_t)1 << 40, 1}, NULL, 0);
  reqb_value(b, "c", F32, 1, (int64_t[]){1}, NULL, 0);   /* never reached */
  reqb_input(b, "a");
  reqb_input(b, "b");
  reqb_binary(b, "aten.add.Tensor", "a", "b", "c");
  reqb_output(b, "a");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "node 0 (aten.add.Tensor)", "broadcast element count overflows");

  /* promotion: float32 [2,3] + float64 [] -> float32; float32 + float64 [3] -> float64 */
  b = reqb_new("");
  reqb_value(b, "a", F32, 2, (int64_t[]){2, 3}, NULL, 0);
  reqb_value(b, "s", F64, 0, NULL, NULL, 0);
  reqb_value(b, "v", F64, 1, (int64_t[]){3}, NULL, 0);
  reqb_value(b, "as", F32, 2, (int64_t[]){2, 3}, NULL, 0);
  reqb_value(b, "av", F64, 2, (int64_t[]){2, 3}, NULL, 0);
  reqb_value(b, "ai", F32, 2, (int64_t[]){2, 3}, NULL, 0);
  reqb_input(b, "a");
  reqb_input(b, "s");
  reqb_input(b, "v");
  reqb_binary(b, "aten.add.Tensor", "a", "s", "as");
  reqb_binary(b, "aten.add.Tensor", "a", "v", "av");
  Tcc__V1__Node *n = reqb_node(b, "aten.mul.Scalar", "ai");
  reqb_arg_tensor(b, n, "self", "a");
  reqb_arg_int(b, n, "other", 3);
  reqb_output(b, "as");
  reqb_output(b, "av");
  reqb_output(b, "ai");
  tcc_error err;
  ck_assert_msg(prep2(b, 0, NULL, &err) == 0, "%s", err.msg);
  reqb_free(b);
}
END_TEST

START_TEST(constants) {
  reqb *b = sin_cos();
  reqb_value(b, "w", F32, 1, (int64_t[]){4}, NULL, 0);
  float w[3] = {1, 2, 3};
  reqb_constant(b, "w", w, sizeof w);
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "constant 'w': data has 12 bytes but float32 [4] needs 16");

  b = sin_cos();
  reqb_constant(b, "nameless", w, sizeof w);
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "constant 0 'nameless' has no TensorValue");

  b = sin_cos();
  reqb_value(b, "w", F32, 1, (int64_t[]){3}, NULL, 0);
  reqb_constant(b, "w", w, sizeof w);
  reqb_constant(b, "w", w, sizeof w);
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "value 'w' is defined twice", "constant 0", "constant 1");
}
END_TEST

START_TEST(targets_and_options) {
  reqb *b = sin_cos();
  reqb_target(b)->device = TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "target: device is unspecified");

  b = sin_cos();
  reqb_target(b)->device = (Tcc__V1__DeviceType)7;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "target: unknown device type 7");

  b = sin_cos();
  reqb_target(b)->device = TCC__V1__DEVICE_TYPE__CUDA;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "CUDA target without cuda_arch");

  b = sin_cos();
  reqb_target(b)->device = TCC__V1__DEVICE_TYPE__CUDA;
  reqb_target(b)->cuda_arch = reqb_str(b, "sm_9x; rm -rf");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "bad cuda_arch");

  b = sin_cos();
  reqb_target(b)->cpu_isa = reqb_str(b, "armv8-a");
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "unknown cpu_isa 'armv8-a'");

  b = sin_cos();
  char *feats[] = {reqb_str(b, "avx2"), reqb_str(b, "-fplugin=evil.so")};
  reqb_target(b)->cpu_features = feats;
  reqb_target(b)->n_cpu_features = 2;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "unknown cpu feature '-fplugin=evil.so'");

  b = sin_cos();
  reqb_options(b)->mode = (Tcc__V1__Mode)9;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "options: unknown mode 9");

  b = sin_cos();   /* an output may not overlap itself */
  meta_of(b, 4)->strides[0] = 0;
  EXPECT_ERR(b, TCC_E_INVALID_ARGUMENT, "graph output 0 'add'", "overlap");

  /* CUDA with an arch prepares (compiling it is another matter) */
  b = sin_cos();
  reqb_target(b)->device = TCC__V1__DEVICE_TYPE__CUDA;
  reqb_target(b)->cuda_arch = reqb_str(b, "sm_90a");
  for (int i = 0; i < 5; i++) meta_of(b, (size_t)i)->device->type = TCC__V1__DEVICE_TYPE__CUDA;
  tcc_prepared *p;
  tcc_error err;
  ck_assert_msg(prep2(b, 0, &p, &err) == 0, "%s", err.msg);
  ck_assert_str_eq(p->target, "cuda:sm_90a");
  /* and compiles to a cubin when NVRTC is there (tests/cuda covers the
   * kernels), or says clearly why not */
  tcc_artifact art;
  memset(&art, 0, sizeof art);
  int rc = tcc_compile(p, NULL, &art, &err);
  if (rc == 0) {
    ck_assert_int_eq(art.kind, TCC__V1__ARTIFACT_KIND__CUBIN);
    ck_assert_int_ge(art.kernels, 1);
    tcc_artifact_free(&art);
  } else {
    ck_assert_msg(rc == TCC_E_FAILED_PRECONDITION || rc == TCC_E_UNIMPLEMENTED, "%d: %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, "NVRTC") || strstr(err.msg, "nvrtc"), "%s", err.msg);
  }
  tcc_prepared_free(p);
  reqb_free(b);
}
END_TEST

/* ------------------------------------------------------------- hash */

static void hash_of(reqb *b, char out[TCC_SHA256_HEX]) {
  tcc_prepared *p;
  tcc_error err;
  int rc = prep2(b, 0, &p, &err);
  ck_assert_msg(rc == 0, "%s", err.msg);
  strcpy(out, p->hash_hex);
  tcc_prepared_free(p);
  reqb_free(b);
}

/* A variant of sin_cos with other names, node order, binding style. */
static reqb *sin_cos_variant(int rename, int reorder, int positional, int explicit_alpha) {
  reqb *b = reqb_new("x86-64-v2");
  const char *x = rename ? "input_a" : "x", *y = rename ? "input_b" : "y";
  const char *s = rename ? "t0" : "sin", *c = rename ? "t1" : "cos", *z = rename ? "result" : "add";
  reqb_value(b, z, F32, 2, S10x10, NULL, 0);
  reqb_value(b, c, F32, 2, S10x10, NULL, 0);
  reqb_value(b, y, F32, 2, S10x10, NULL, 0);
  reqb_value(b, s, F32, 2, S10x10, NULL, 0);
  reqb_value(b, x, F32, 2, S10x10, NULL, 0);
  reqb_input(b, x);
  reqb_input(b, y);
  const char *p0 = positional ? "" : "self", *p1 = positional ? "" : "other";
  for (int k = 0; k < 3; k++) {
    int which = reorder ? 2 - k : k;
    Tcc__V1__Node *n;
    if (which == 0) {
      n = reqb_node(b, "aten.sin.default", s);
      reqb_arg_tensor(b, n, p0, x);
    } else if (which == 1) {
      n = reqb_node(b, "aten.cos.default", c);
      reqb_arg_tensor(b, n, p0, y);
    } else {
      n = reqb_node(b, "aten.add.Tensor", z);
      if (explicit_alpha) reqb_arg_int(b, n, "alpha", 1);   /* named first: fine */
      reqb_arg_tensor(b, n, positional && !explicit_alpha ? "" : "self", s);
      reqb_arg_tensor(b, n, positional && !explicit_alpha ? "" : "other", c);
      (void)p1;
    }
  }
  reqb_output(b, z);
  return b;
}

START_TEST(hash_invariances) {
  char base[TCC_SHA256_HEX], h[TCC_SHA256_HEX];
  hash_of(sin_cos(), base);

  hash_of(sin_cos_variant(1, 0, 0, 0), h);
  ck_assert_str_eq(h, base);                        /* names */
  hash_of(sin_cos_variant(0, 1, 0, 0), h);
  ck_assert_str_eq(h, base);                        /* node order */
  hash_of(sin_cos_variant(0, 0, 1, 0), h);
  ck_assert_str_eq(h, base);                        /* positional binding */
  hash_of(sin_cos_variant(0, 0, 0, 1), h);
  ck_assert_str_eq(h, base);                        /* explicit default */
  hash_of(sin_cos_variant(1, 1, 1, 1), h);
  ck_assert_str_eq(h, base);

  reqb *b = sin_cos();
  for (size_t i = 0; i < 5; i++) {
    meta_of(b, i)->requires_grad = 1;
    meta_of(b, i)->device->index = 3;
  }
  reqb_req(b)->client = reqb_str(b, "job 17 rank 3");
  reqb_options(b)->fullgraph = 1;
  hash_of(b, h);
  ck_assert_str_eq(h, base);                        /* grad, device index, client, fullgraph */

  b = sin_cos();
  reqb_target(b)->cpu_isa = reqb_str(b, "");
  hash_of(b, h);
  ck_assert_str_eq(h, base);                        /* "" is x86-64-v2 */

  b = sin_cos();   /* a node nothing depends on */
  reqb_value(b, "dead", F32, 2, S10x10, NULL, 0);
  reqb_unary(b, "aten.exp.default", "x", "dead");
  hash_of(b, h);
  ck_assert_str_eq(h, base);

  b = sin_cos();   /* intermediate strides are the compiler's business */
  meta_of(b, 2)->strides[0] = 1;
  meta_of(b, 2)->strides[1] = 10;
  hash_of(b, h);
  ck_assert_str_eq(h, base);

  /* features: order and duplicates do not matter */
  char f1[TCC_SHA256_HEX];
  b = sin_cos();
  char *fa[] = {reqb_str(b, "fma"), reqb_str(b, "avx2")};
  reqb_target(b)->cpu_features = fa;
  reqb_target(b)->n_cpu_features = 2;
  hash_of(b, f1);
  b = sin_cos();
  char *fb[] = {reqb_str(b, "avx2"), reqb_str(b, "fma"), reqb_str(b, "avx2")};
  reqb_target(b)->cpu_features = fb;
  reqb_target(b)->n_cpu_features = 3;
  hash_of(b, h);
  ck_assert_str_eq(h, f1);
  ck_assert_str_ne(h, base);
}
END_TEST

START_TEST(hash_differences) {
  char base[TCC_SHA256_HEX], h[TCC_SHA256_HEX];
  hash_of(sin_cos(), base);
  reqb *b;

#define DIFFERS(setup)                      \
  do {                                      \
    b = sin_cos();                          \
    setup;                                  \
    hash_of(b, h);                          \
    ck_assert_str_ne(h, base);              \
  } while (0)

  DIFFERS(for (size_t i = 0; i < 5; i++) meta_of(b, i)->sizes[1] = 11;
          for (size_t i = 0; i < 5; i++) meta_of(b, i)->strides[0] = 11);   /* shape */
  DIFFERS(for (size_t i = 0; i < 5; i++) meta_of(b, i)->dtype = F64);      /* dtype */
  DIFFERS(meta_of(b, 0)->strides[0] = 1; meta_of(b, 0)->strides[1] = 10);  /* input stride */
  DIFFERS(meta_of(b, 0)->strides[0] = 20);                                  /* padded rows */
  DIFFERS(meta_of(b, 1)->storage_offset = 4);                               /* offset, same class */
  DIFFERS(meta_of(b, 1)->storage_offset = 1);                               /* offset + class */
  DIFFERS(meta_of(b, 4)->strides[0] = 1; meta_of(b, 4)->strides[1] = 10);  /* output layout */
  DIFFERS(reqb_target(b)->cpu_isa = reqb_str(b, "x86-64-v3"));             /* ISA */
  DIFFERS(reqb_options(b)->mode = TCC__V1__MODE__MAX_AUTOTUNE);            /* mode */
  DIFFERS(reqb_options(b)->dynamic = 1);                                    /* dynamic */
  DIFFERS(reqb_req(b)->graph->nodes[0]->target = reqb_str(b, "aten.cos.default"));
  DIFFERS(reqb_arg_float(b, reqb_req(b)->graph->nodes[2], "alpha", 2.0));  /* argument */
  DIFFERS(reqb_arg_float(b, reqb_req(b)->graph->nodes[2], "alpha", 1.0));  /* 1.0 is not int 1 */
  DIFFERS(Tcc__V1__Graph *g = reqb_req(b)->graph; char *t = g->inputs[0];   /* call order */
          g->inputs[0] = g->inputs[1]; g->inputs[1] = t);
#undef DIFFERS

  /* the compiler identity */
  tcc_prepared *p;
  tcc_error err;
  b = sin_cos();
  ck_assert_int_eq(tcc_prepare(reqb_req(b), "tccd-codegen/1 cc=other 1.0", &p, &err), 0);
  ck_assert_str_ne(p->hash_hex, base);
  tcc_prepared_free(p);
  reqb_free(b);

  /* constant bytes */
  char c1[TCC_SHA256_HEX];
  for (int k = 0; k < 2; k++) {
    b = sin_cos();
    float w[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, (float)k};
    reqb_value(b, "w", F32, 1, (int64_t[]){10}, NULL, 0);
    reqb_constant(b, "w", w, sizeof w);
    reqb_value(b, "zw", F32, 2, S10x10, NULL, 0);
    reqb_binary(b, "aten.add.Tensor", "add", "w", "zw");
    reqb_req(b)->graph->outputs[0] = reqb_str(b, "zw");
    hash_of(b, k ? h : c1);
  }
  ck_assert_str_ne(h, c1);
}
END_TEST

/* Many threads preparing at once (the first call parses the op table). */
static void *prep_thread(void *arg) {
  char *out = arg;
  reqb *b = sin_cos_variant(1, 1, 0, 0);
  tcc_prepared *p;
  tcc_error err;
  if (tcc_prepare(reqb_req(b), ID, &p, &err) == 0) {
    strcpy(out, p->hash_hex);
    tcc_prepared_free(p);
  }
  reqb_free(b);
  return NULL;
}

START_TEST(threads) {
  enum { N = 8 };
  pthread_t t[N];
  char hashes[N][TCC_SHA256_HEX] = {{0}};
  for (int i = 0; i < N; i++) pthread_create(&t[i], NULL, prep_thread, hashes[i]);
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  char base[TCC_SHA256_HEX];
  hash_of(sin_cos(), base);
  for (int i = 0; i < N; i++) ck_assert_str_eq(hashes[i], base);
}
END_TEST

START_TEST(identity) {
  char id[256];
  tcc_error err;
  ck_assert_msg(tcc_toolchain_identity("cc", id, sizeof id, &err) == 0, "%s", err.msg);
  char want[32];
  snprintf(want, sizeof want, "tccd-codegen/%d ", TCC_CODEGEN_VERSION);
  ck_assert_msg(strncmp(id, want, strlen(want)) == 0, "%s", id);
  /* the convolution road: " onednn/X.Y " when tccd has oneDNN, else none;
   * TCC_NO_ONEDNN=1 takes it out */
  const char *rest = id + strlen(want);
  if (tcc_onednn_enabled()) {
    ck_assert_msg(strncmp(rest, "onednn/", 7) == 0, "%s", id);
    rest = strchr(rest, ' ') + 1;
    setenv("TCC_NO_ONEDNN", "1", 1);
    char plain[256];
    ck_assert_int_eq(tcc_onednn_enabled(), 0);
    ck_assert_int_eq(tcc_toolchain_identity("cc", plain, sizeof plain, &err), 0);
    ck_assert_msg(strstr(plain, "onednn") == NULL, "%s", plain);
    unsetenv("TCC_NO_ONEDNN");
  }
  ck_assert_msg(strncmp(rest, "cc=", 3) == 0, "%s", id);
  ck_assert_uint_gt(strlen(id), 19);
  ck_assert_ptr_null(strchr(id, '\n'));
  char again[256];
  ck_assert_int_eq(tcc_toolchain_identity(NULL, again, sizeof again, &err), 0);
  ck_assert_str_eq(id, again);
  ck_assert_int_eq(tcc_toolchain_identity("/nonexistent/cc", id, sizeof id, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, "cannot run '/nonexistent/cc'"));
  ck_assert_int_eq(tcc_toolchain_identity("/bin/false", id, sizeof id, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "exited with status 1"));
  ck_assert_int_eq(tcc_toolchain_identity("cc", id, 8, &err), TCC_E_INVALID_ARGUMENT);
}
END_TEST

int main(void) {
  return tt_run_tests("prepare", 60, 0, (const TTest *[]){
      sin_cos_prepares,
      json_graphs,
      garbage_and_truncated,
      too_big,
      missing_parts,
      names_and_definitions,
      cycles,
      arity_and_types,
      bad_metas,
      shape_and_dtype_rules,
      constants,
      targets_and_options,
      hash_invariances,
      hash_differences,
      threads,
      identity,
      NULL});
}
