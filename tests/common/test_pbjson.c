/*
 * test_pbjson.c — the proto3 JSON mapping (common/pbjson.h).
 *
 * Round trips compare the protobuf wire encoding of the message before
 * and after (protobuf-c packs fields in a fixed order, so equal messages
 * pack to equal bytes). Random values come from a seed drawn from the
 * clock (printed; set TCC_TEST_SEED to replay a failure).
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"
#include "pbjson_test.pb-c.h"
#include "tcc/v1/tcc.pb-c.h"
#include "tcctest.h"

/* ---------------------------------------------------------- helpers */

static uint64_t rnd(void) { return tt_rand(); }

static void seed_once(void) { tt_seed("test_pbjson"); }

/* Packs m into a malloc'd buffer. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len ? *len : 1);
  protobuf_c_message_pack(m, buf);
  return buf;
}

static void assert_same_message(const ProtobufCMessage *a, const ProtobufCMessage *b) {
  size_t la, lb;
  uint8_t *pa = pack(a, &la), *pb = pack(b, &lb);
  ck_assert_uint_eq(la, lb);
  ck_assert_msg(memcmp(pa, pb, la) == 0, "messages differ after a round trip");
  free(pa);
  free(pb);
}

/* Parses json as type d, expecting success. */
static ProtobufCMessage *parse_ok(const ProtobufCMessageDescriptor *d, const char *json) {
  ProtobufCMessage *m = (ProtobufCMessage *)0x1;
  tcc_error err = {0};
  int rc = tcc_pbjson_parse(d, json, strlen(json), &m, &err);
  ck_assert_msg(rc == 0, "parse of %s failed: %s", json, err.msg);
  ck_assert_ptr_nonnull(m);
  return m;
}

/* Parses json as type d, expecting INVALID_ARGUMENT with a message that
 * starts with want_prefix and contains want_sub. */
static void parse_fails(const ProtobufCMessageDescriptor *d, const char *json,
                        const char *want_prefix, const char *want_sub) {
  ProtobufCMessage *m = (ProtobufCMessage *)0x1;
  tcc_error err = {0};
  int rc = tcc_pbjson_parse(d, json, strlen(json), &m, &err);
  ck_assert_msg(rc == TCC_E_INVALID_ARGUMENT, "%s: expected INVALID_ARGUMENT, got %d (%s)", json, rc, err.msg);
  ck_assert_int_eq(err.code, TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(m);
  ck_assert_msg(strncmp(err.msg, want_prefix, strlen(want_prefix)) == 0,
                "%s: message \"%s\" does not start with \"%s\"", json, err.msg, want_prefix);
  if (want_sub)
    ck_assert_msg(strstr(err.msg, want_sub) != NULL, "%s: message \"%s\" lacks \"%s\"", json, err.msg, want_sub);
}

static char *rand_string(void) {
  static const char alphabet[] = "abcXYZ019 _-\"\\/\t\n\x01\xc3\xa9";
  size_t n = rnd() % 12;
  char *s = malloc(n + 1);
  for (size_t i = 0; i < n; i++) {
    char c = alphabet[rnd() % (sizeof alphabet - 1)];
    if ((unsigned char)c >= 0x80) c = 'e'; /* keep it valid UTF-8 */
    s[i] = c;
  }
  s[n] = '\0';
  return s;
}

static ProtobufCBinaryData rand_bytes(void) {
  ProtobufCBinaryData b = {0, NULL};
  b.len = rnd() % 40;
  if (b.len) {
    b.data = malloc(b.len);
    for (size_t i = 0; i < b.len; i++) b.data[i] = (uint8_t)rnd();
  }
  return b;
}

static double rand_double(void) {
  double d;
  do {
    uint64_t bits = rnd();
    memcpy(&d, &bits, sizeof d);
  } while (!isfinite(d));
  return d;
}

static float rand_float(void) {
  float f;
  do {
    uint32_t bits = (uint32_t)rnd();
    memcpy(&f, &bits, sizeof f);
  } while (!isfinite(f));
  return f;
}

static Tcctest__Inner *rand_inner(void) {
  Tcctest__Inner *in = malloc(sizeof *in);
  tcctest__inner__init(in);
  if (rnd() % 2) in->label = rand_string();
  in->n = (int32_t)rnd();
  return in;
}

#define RAND_ARRAY(m, field, gen)                                 \
  do {                                                            \
    (m)->n_##field = rnd() % 5;                                   \
    (m)->field = (m)->n_##field ? calloc((m)->n_##field, sizeof *(m)->field) : NULL; \
    for (size_t i_ = 0; i_ < (m)->n_##field; i_++) (m)->field[i_] = gen; \
  } while (0)

/* A message with every field filled with random values (some left at
 * their defaults), allocated the way unpack allocates. */
static Tcctest__AllKinds *rand_all_kinds(void) {
  Tcctest__AllKinds *m = malloc(sizeof *m);
  tcctest__all_kinds__init(m);
  m->f_int32 = (int32_t)rnd();
  m->f_int64 = (int64_t)rnd();
  m->f_uint32 = (uint32_t)rnd();
  m->f_uint64 = rnd();
  m->f_sint32 = (int32_t)rnd();
  m->f_sint64 = (int64_t)rnd();
  m->f_fixed32 = (uint32_t)rnd();
  m->f_fixed64 = rnd();
  m->f_sfixed32 = (int32_t)rnd();
  m->f_sfixed64 = (int64_t)rnd();
  m->f_float = rand_float();
  m->f_double = rand_double();
  m->f_bool = rnd() % 2;
  m->f_string = rand_string();
  m->f_bytes = rand_bytes();
  m->f_enum = (Tcctest__Color)(rnd() % 3);
  if (rnd() % 2) m->f_inner = rand_inner();
  RAND_ARRAY(m, r_int32, (int32_t)rnd());
  RAND_ARRAY(m, r_int64, (int64_t)rnd());
  RAND_ARRAY(m, r_uint32, (uint32_t)rnd());
  RAND_ARRAY(m, r_uint64, rnd());
  RAND_ARRAY(m, r_float, rand_float());
  RAND_ARRAY(m, r_double, rand_double());
  RAND_ARRAY(m, r_bool, (protobuf_c_boolean)(rnd() % 2));
  RAND_ARRAY(m, r_string, rand_string());
  RAND_ARRAY(m, r_bytes, rand_bytes());
  RAND_ARRAY(m, r_enum, (Tcctest__Color)(rnd() % 3));
  RAND_ARRAY(m, r_inner, rand_inner());
  RAND_ARRAY(m, r_sint64, (int64_t)rnd());
  RAND_ARRAY(m, r_fixed64, rnd());
  switch (rnd() % 6) {
  case 0: break;
  case 1: m->choice_case = TCCTEST__ALL_KINDS__CHOICE_C_STRING; m->c_string = rand_string(); break;
  case 2: m->choice_case = TCCTEST__ALL_KINDS__CHOICE_C_INNER; m->c_inner = rand_inner(); break;
  case 3: m->choice_case = TCCTEST__ALL_KINDS__CHOICE_C_INT64; m->c_int64 = (int64_t)(rnd() % 3); break;
  case 4: m->choice_case = TCCTEST__ALL_KINDS__CHOICE_C_BYTES; m->c_bytes = rand_bytes(); break;
  case 5: m->choice_case = TCCTEST__ALL_KINDS__CHOICE_C_BOOL; m->c_bool = rnd() % 2; break;
  }
  return m;
}

/* ---------------------------------------------------------- tests */

START_TEST(sin_cos_round_trip) {
  size_t len;
  char *json = tt_graph_read("sin_cos.json", &len);
  ck_assert_msg(json != NULL, "cannot open %s", tt_graph_path("sin_cos.json"));
  ProtobufCMessage *m = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, json, len, &m, &err), 0);
  Tcc__V1__CompileRequest *req = (Tcc__V1__CompileRequest *)m;

  ck_assert_ptr_nonnull(req->graph);
  Tcc__V1__Graph *g = req->graph;
  ck_assert_uint_eq(g->n_values, 5);
  const char *names[] = {"x", "y", "sin", "cos", "add"};
  for (size_t i = 0; i < 5; i++) {
    ck_assert_str_eq(g->values[i]->name, names[i]);
    Tcc__V1__TensorMeta *meta = g->values[i]->meta;
    ck_assert_ptr_nonnull(meta);
    ck_assert_int_eq(meta->dtype, TCC__V1__DTYPE__FLOAT32);
    ck_assert_uint_eq(meta->n_sizes, 2);
    ck_assert_int_eq(meta->sizes[0], 10);
    ck_assert_int_eq(meta->sizes[1], 10);
    ck_assert_uint_eq(meta->n_strides, 2);
    ck_assert_int_eq(meta->strides[0], 10);
    ck_assert_int_eq(meta->strides[1], 1);
    ck_assert_int_eq(meta->storage_offset, 0);
    ck_assert_ptr_nonnull(meta->device);
    ck_assert_int_eq(meta->device->type, TCC__V1__DEVICE_TYPE__CPU);
  }
  ck_assert_uint_eq(g->n_inputs, 2);
  ck_assert_str_eq(g->inputs[0], "x");
  ck_assert_str_eq(g->inputs[1], "y");
  ck_assert_uint_eq(g->n_outputs, 1);
  ck_assert_str_eq(g->outputs[0], "add");
  ck_assert_uint_eq(g->n_nodes, 3);
  ck_assert_str_eq(g->nodes[0]->target, "aten.sin.default");
  ck_assert_str_eq(g->nodes[2]->target, "aten.add.Tensor");
  ck_assert_uint_eq(g->nodes[2]->n_inputs, 2);
  Tcc__V1__NamedArgument *other = g->nodes[2]->inputs[1];
  ck_assert_str_eq(other->name, "other");
  ck_assert_int_eq(other->arg->kind_case, TCC__V1__ARGUMENT__KIND_AS_TENSOR);
  ck_assert_str_eq(other->arg->as_tensor->name, "cos");
  ck_assert_uint_eq(g->nodes[2]->n_outputs, 1);
  ck_assert_str_eq(g->nodes[2]->outputs[0], "add");
  ck_assert_uint_eq(g->n_constants, 0);
  ck_assert_ptr_nonnull(req->target);
  ck_assert_int_eq(req->target->device, TCC__V1__DEVICE_TYPE__CPU);
  ck_assert_str_eq(req->target->cpu_isa, "x86-64-v2");
  ck_assert_ptr_nonnull(req->options);
  ck_assert_int_eq(req->options->mode, TCC__V1__MODE__DEFAULT);
  ck_assert_msg(strstr(req->client, "sin(x) + cos(y)") != NULL, "client: %s", req->client);

  /* Print: jsonName keys, int64 as strings, defaults omitted. */
  char *out = tcc_pbjson_print(m, 0);
  ck_assert_ptr_nonnull(out);
  ck_assert_ptr_nonnull(strstr(out, "\"cpuIsa\":\"x86-64-v2\""));
  ck_assert_ptr_null(strstr(out, "cpu_isa"));
  ck_assert_ptr_nonnull(strstr(out, "\"sizes\":[\"10\",\"10\"]"));
  ck_assert_ptr_nonnull(strstr(out, "\"asTensor\":{\"name\":\"x\"}"));
  ck_assert_ptr_null(strstr(out, "storageOffset")); /* 0: omitted */
  ck_assert_ptr_null(strstr(out, "mode"));          /* DEFAULT = 0: omitted */

  /* ... and back: the same message. */
  ProtobufCMessage *m2 = NULL;
  ck_assert_int_eq(tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, out, strlen(out), &m2, &err), 0);
  assert_same_message(m, m2);

  /* Pretty output parses to the same message too. */
  char *pretty = tcc_pbjson_print(m, 1);
  ck_assert_ptr_nonnull(strchr(pretty, '\n'));
  ck_assert_ptr_null(strchr(pretty, '\t'));
  ProtobufCMessage *m3 = parse_ok(&tcc__v1__compile_request__descriptor, pretty);
  assert_same_message(m, m3);

  free(pretty);
  free(out);
  free(json);
  protobuf_c_message_free_unpacked(m, NULL);
  protobuf_c_message_free_unpacked(m2, NULL);
  protobuf_c_message_free_unpacked(m3, NULL);
}
END_TEST

START_TEST(every_kind_random_round_trip) {
  seed_once();
  for (int iter = 0; iter < 300; iter++) {
    Tcctest__AllKinds *m = rand_all_kinds();
    unsigned flags = (unsigned)(rnd() % 2) * TCC_PBJSON_PRETTY |
                     (unsigned)(rnd() % 2) * TCC_PBJSON_EMIT_DEFAULTS |
                     (unsigned)(rnd() % 2) * TCC_PBJSON_ORIGINAL_NAMES;
    char *json = tcc_pbjson_print_flags(&m->base, flags);
    ck_assert_ptr_nonnull(json);
    ProtobufCMessage *back = NULL;
    tcc_error err = {0};
    int rc = tcc_pbjson_parse(&tcctest__all_kinds__descriptor, json, strlen(json), &back, &err);
    ck_assert_msg(rc == 0, "iteration %d: %s\n%s", iter, err.msg, json);
    Tcctest__AllKinds *b = (Tcctest__AllKinds *)back;
    /* Spot checks on top of the byte comparison. */
    ck_assert_int_eq(b->f_int64, m->f_int64);
    ck_assert_uint_eq(b->f_uint64, m->f_uint64);
    ck_assert(b->f_float == m->f_float);
    ck_assert(b->f_double == m->f_double);
    ck_assert_str_eq(b->f_string, m->f_string);
    ck_assert_int_eq(b->choice_case, m->choice_case);
    assert_same_message(&m->base, back);
    free(json);
    tcctest__all_kinds__free_unpacked(m, NULL);
    protobuf_c_message_free_unpacked(back, NULL);
  }
}
END_TEST

START_TEST(every_kind_json_forms) {
  /* The printed form of each kind, from a hand-made message. */
  Tcctest__AllKinds *m = (Tcctest__AllKinds *)parse_ok(&tcctest__all_kinds__descriptor,
      "{\"fInt32\": -5, \"fInt64\": \"-6\", \"fUint32\": 7, \"fUint64\": 8,"
      " \"fSint32\": -9, \"fSint64\": \"-10\", \"fFixed32\": 11, \"fFixed64\": \"12\","
      " \"fSfixed32\": -13, \"fSfixed64\": -14, \"fFloat\": 0.1, \"fDouble\": 0.1,"
      " \"fBool\": true, \"fString\": \"h\\u00e9\\n\", \"fBytes\": \"AAEC\","
      " \"fEnum\": \"GREEN\", \"fInner\": {\"label\": \"in\"},"
      " \"rEnum\": [\"RED\", 2, 7], \"rBool\": [true, false], \"rFloat\": [1.5, \"2.5\", \"1e3\"]}");
  ck_assert_int_eq(m->f_int32, -5);
  ck_assert_int_eq(m->f_int64, -6);
  ck_assert_uint_eq(m->f_uint32, 7);
  ck_assert_uint_eq(m->f_uint64, 8);
  ck_assert_int_eq(m->f_sint32, -9);
  ck_assert_int_eq(m->f_sint64, -10);
  ck_assert_uint_eq(m->f_fixed32, 11);
  ck_assert_uint_eq(m->f_fixed64, 12);
  ck_assert_int_eq(m->f_sfixed32, -13);
  ck_assert_int_eq(m->f_sfixed64, -14);
  ck_assert(m->f_float == 0.1f);
  ck_assert(m->f_double == 0.1);
  ck_assert_int_eq(m->f_bool, 1);
  ck_assert_str_eq(m->f_string, "h\xc3\xa9\n");
  ck_assert_uint_eq(m->f_bytes.len, 3);
  ck_assert_int_eq(m->f_bytes.data[2], 2);
  ck_assert_int_eq(m->f_enum, TCCTEST__COLOR__GREEN);
  ck_assert_str_eq(m->f_inner->label, "in");
  ck_assert_uint_eq(m->n_r_enum, 3);
  ck_assert_int_eq(m->r_enum[0], TCCTEST__COLOR__RED);
  ck_assert_int_eq(m->r_enum[1], TCCTEST__COLOR__GREEN);
  ck_assert_int_eq(m->r_enum[2], 7); /* open enum: unknown numbers kept */
  ck_assert_uint_eq(m->n_r_float, 3);
  ck_assert(m->r_float[1] == 2.5f);
  ck_assert(m->r_float[2] == 1000.0f);

  char *json = tcc_pbjson_print(&m->base, 0);
  const char *want =
      "{\"fInt32\":-5,\"fInt64\":\"-6\",\"fUint32\":7,\"fUint64\":\"8\",\"fSint32\":-9,"
      "\"fSint64\":\"-10\",\"fFixed32\":11,\"fFixed64\":\"12\",\"fSfixed32\":-13,"
      "\"fSfixed64\":\"-14\",\"fFloat\":0.1,\"fDouble\":0.1,\"fBool\":true,"
      "\"fString\":\"h\xc3\xa9\\n\",\"fBytes\":\"AAEC\",\"fEnum\":\"GREEN\","
      "\"fInner\":{\"label\":\"in\"},\"rFloat\":[1.5,2.5,1000],\"rBool\":[true,false],"
      "\"rEnum\":[\"RED\",\"GREEN\",7]}";
  ck_assert_str_eq(json, want);
  free(json);

  /* Original names, int64 as numbers, every default printed. */
  json = tcc_pbjson_print_flags(&m->base, TCC_PBJSON_ORIGINAL_NAMES | TCC_PBJSON_INT64_AS_NUMBER |
                                              TCC_PBJSON_EMIT_DEFAULTS | TCC_PBJSON_ENUMS_AS_INTS);
  ck_assert_ptr_nonnull(strstr(json, "\"f_int64\":-6,"));
  ck_assert_ptr_nonnull(strstr(json, "\"f_enum\":2,"));
  ck_assert_ptr_nonnull(strstr(json, "\"r_int32\":[]"));
  ck_assert_ptr_nonnull(strstr(json, "\"r_inner\":[]"));
  ck_assert_ptr_null(strstr(json, "c_string")); /* unset oneof members never print */
  free(json);
  tcctest__all_kinds__free_unpacked(m, NULL);

  /* The empty message prints as {} and reads back. */
  Tcc__V1__CompileRequest empty = TCC__V1__COMPILE_REQUEST__INIT;
  json = tcc_pbjson_print(&empty.base, 0);
  ck_assert_str_eq(json, "{}");
  free(json);
  Tcc__V1__StatsResponse stats = TCC__V1__STATS_RESPONSE__INIT;
  stats.hits = 3;
  json = tcc_pbjson_print_flags(&stats.base, TCC_PBJSON_ORIGINAL_NAMES | TCC_PBJSON_INT64_AS_NUMBER |
                                                 TCC_PBJSON_EMIT_DEFAULTS);
  ck_assert_ptr_nonnull(strstr(json, "\"hits\":3,"));
  ck_assert_ptr_nonnull(strstr(json, "\"compile_failures\":0,"));
  ck_assert_ptr_nonnull(strstr(json, "\"version\":\"\""));
  free(json);
}
END_TEST

START_TEST(snake_case_and_null_accepted) {
  Tcc__V1__CompileRequest *req = (Tcc__V1__CompileRequest *)parse_ok(&tcc__v1__compile_request__descriptor,
      "{\"target\": {\"cpu_isa\": \"x86-64-v3\", \"cuda_arch\": null, \"cpu_features\": [\"avx2\"]},"
      " \"graph\": null, \"options\": {\"mode\": \"MAX_AUTOTUNE\", \"dynamic\": true}}");
  ck_assert_str_eq(req->target->cpu_isa, "x86-64-v3");
  ck_assert_str_eq(req->target->cuda_arch, "");
  ck_assert_uint_eq(req->target->n_cpu_features, 1);
  ck_assert_str_eq(req->target->cpu_features[0], "avx2");
  ck_assert_ptr_null(req->graph);
  ck_assert_int_eq(req->options->mode, TCC__V1__MODE__MAX_AUTOTUNE);
  ck_assert_int_eq(req->options->dynamic, 1);
  tcc__v1__compile_request__free_unpacked(req, NULL);
}
END_TEST

START_TEST(oneof_members) {
  /* The set member prints even at its default value. */
  Tcc__V1__Argument a = TCC__V1__ARGUMENT__INIT;
  a.kind_case = TCC__V1__ARGUMENT__KIND_AS_NONE;
  a.as_none = 0;
  char *json = tcc_pbjson_print(&a.base, 0);
  ck_assert_str_eq(json, "{\"asNone\":false}");
  free(json);
  a.kind_case = TCC__V1__ARGUMENT__KIND_AS_INT;
  a.as_int = 0;
  json = tcc_pbjson_print(&a.base, 0);
  ck_assert_str_eq(json, "{\"asInt\":\"0\"}");
  free(json);

  Tcc__V1__Argument *p = (Tcc__V1__Argument *)parse_ok(&tcc__v1__argument__descriptor, "{\"asInt\": 0}");
  ck_assert_int_eq(p->kind_case, TCC__V1__ARGUMENT__KIND_AS_INT);
  ck_assert_int_eq(p->as_int, 0);
  tcc__v1__argument__free_unpacked(p, NULL);
  p = (Tcc__V1__Argument *)parse_ok(&tcc__v1__argument__descriptor, "{\"as_string\": \"\"}");
  ck_assert_int_eq(p->kind_case, TCC__V1__ARGUMENT__KIND_AS_STRING);
  ck_assert_str_eq(p->as_string, "");
  tcc__v1__argument__free_unpacked(p, NULL);
  p = (Tcc__V1__Argument *)parse_ok(&tcc__v1__argument__descriptor,
                                    "{\"asInts\": {\"values\": [1, \"-2\", 3]}}");
  ck_assert_int_eq(p->kind_case, TCC__V1__ARGUMENT__KIND_AS_INTS);
  ck_assert_uint_eq(p->as_ints->n_values, 3);
  ck_assert_int_eq(p->as_ints->values[1], -2);
  tcc__v1__argument__free_unpacked(p, NULL);

  parse_fails(&tcc__v1__argument__descriptor, "{\"asInt\": 1, \"asBool\": true}",
              "asBool: only one member of a oneof", "as_int");
  /* A failing submessage inside a oneof is freed (valgrind checks). */
  parse_fails(&tcc__v1__argument__descriptor, "{\"asTensors\": {\"values\": [{\"name\": 1}]}}",
              "asTensors.values[0].name: expected a string", NULL);
}
END_TEST

START_TEST(errors_name_the_field_path) {
  const ProtobufCMessageDescriptor *d = &tcc__v1__compile_request__descriptor;
  parse_fails(d, "{\"graph\": {\"values\": [{}, {\"name\": \"b\"}, {\"meta\": {\"sizes\": [1.5]}}]}}",
              "graph.values[2].meta.sizes[0]: not an integer", NULL);
  parse_fails(d, "{\"graph\": {\"values\": [{}, {}, {\"meta\": {\"sizes\": [4, \"x\"]}}]}}",
              "graph.values[2].meta.sizes[1]: not an integer", NULL);
  parse_fails(d, "{\"graph\": {\"values\": [{\"meta\": {\"sizes\": [true]}}]}}",
              "graph.values[0].meta.sizes[0]: not an integer", "boolean");
  parse_fails(d, "{\"graph\": {\"bogus\": 1}}", "graph: unknown field \"bogus\"", "tcc.v1.Graph");
  parse_fails(d, "{\"nope\": 1}", "unknown field \"nope\" in tcc.v1.CompileRequest", NULL);
  parse_fails(d, "{\"client\": 3}", "client: expected a string", "number");
  parse_fails(d, "{\"target\": {\"device\": \"TPU\"}}", "target.device: unknown value \"TPU\"", "tcc.v1.DeviceType");
  parse_fails(d, "{\"target\": {\"device\": 1.5}}", "target.device: not an integer", NULL);
  parse_fails(d, "{\"target\": {\"cpuIsa\": \"a\", \"cpu_isa\": \"b\"}}", "target.cpu_isa: field \"cpu_isa\" given twice", NULL);
  parse_fails(d, "{\"options\": {\"dynamic\": 1}}", "options.dynamic: expected true or false", NULL);
  parse_fails(d, "{\"graph\": {\"inputs\": \"x\"}}", "graph.inputs: expected an array", NULL);
  parse_fails(d, "{\"graph\": {\"inputs\": [\"x\", null]}}", "graph.inputs[1]: null is not allowed", NULL);
  parse_fails(d, "{\"graph\": []}", "graph: expected an object for tcc.v1.Graph", "an array");
  parse_fails(d, "[]", "expected an object for tcc.v1.CompileRequest", NULL);
  parse_fails(d, "{\"graph\": {\"constants\": [{\"data\": \"not base64!\"}]}}",
              "graph.constants[0].data: invalid base64", NULL);
  parse_fails(d, "{\"graph\":\n  {\"values\": [}", "invalid JSON at line 2", NULL);
  parse_fails(d, "{} x", "invalid JSON: unexpected data after the value at line 1, column 4", NULL);
  parse_fails(d, "", "invalid JSON at line 1", NULL);

  const ProtobufCMessageDescriptor *a = &tcctest__all_kinds__descriptor;
  parse_fails(a, "{\"fInt32\": 3000000000}", "fInt32: 3000000000 out of range for int32", NULL);
  parse_fails(a, "{\"fInt32\": \"-2147483649\"}", "fInt32: -2147483649 out of range for int32", NULL);
  parse_fails(a, "{\"fUint32\": -1}", "fUint32: -1 out of range for uint32", NULL);
  parse_fails(a, "{\"fUint64\": \"-1\"}", "fUint64: -1 out of range for uint64", NULL);
  parse_fails(a, "{\"fInt64\": \"9223372036854775808\"}", "fInt64: 9223372036854775808 out of range for int64", NULL);
  parse_fails(a, "{\"fUint64\": \"18446744073709551616\"}", "fUint64: 18446744073709551616 out of range", NULL);
  parse_fails(a, "{\"fInt64\": 9007199254740993}", "fInt64: ", "as strings");
  parse_fails(a, "{\"fInt64\": \"1.5\"}", "fInt64: not an integer", NULL);
  parse_fails(a, "{\"fInt64\": \"0x10\"}", "fInt64: not an integer", NULL);
  parse_fails(a, "{\"fFloat\": 1e39}", "fFloat: ", "out of range for float");
  parse_fails(a, "{\"fDouble\": \"nan\"}", "fDouble: not a number", NULL);
  parse_fails(a, "{\"fDouble\": {}}", "fDouble: not a number", "object");
  parse_fails(a, "{\"rInner\": [{\"label\": \"a\"}, {\"n\": \"q\"}]}", "rInner[1].n: not an integer", NULL);
  parse_fails(a, "{\"rBytes\": [\"AA==\", 5]}", "rBytes[1]: expected base64", NULL);
  parse_fails(a, "{\"fEnum\": true}", "fEnum: expected a name of enum tcctest.Color", NULL);
}
END_TEST

START_TEST(base64_bytes) {
  seed_once();
  for (int iter = 0; iter < 200; iter++) {
    Tcc__V1__Constant c = TCC__V1__CONSTANT__INIT;
    size_t n = rnd() % 70;
    uint8_t *data = malloc(n + 1);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)rnd();
    c.data.data = data;
    c.data.len = n;
    char *json = tcc_pbjson_print(&c.base, 0);
    if (n == 0) {
      ck_assert_str_eq(json, "{}");
    } else {
      char want[256], doc[300];
      sodium_bin2base64(want, sizeof want, data, n, sodium_base64_VARIANT_ORIGINAL);
      snprintf(doc, sizeof doc, "{\"data\":\"%s\"}", want);
      ck_assert_str_eq(json, doc);
      /* URL-safe and unpadded spellings decode to the same bytes. */
      char url[256];
      sodium_bin2base64(url, sizeof url, data, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
      snprintf(doc, sizeof doc, "{\"data\":\"%s\"}", url);
      Tcc__V1__Constant *u = (Tcc__V1__Constant *)parse_ok(&tcc__v1__constant__descriptor, doc);
      ck_assert_uint_eq(u->data.len, n);
      ck_assert(memcmp(u->data.data, data, n) == 0);
      tcc__v1__constant__free_unpacked(u, NULL);
    }
    Tcc__V1__Constant *back = (Tcc__V1__Constant *)parse_ok(&tcc__v1__constant__descriptor, json);
    ck_assert_uint_eq(back->data.len, n);
    if (n) ck_assert(memcmp(back->data.data, data, n) == 0);
    else ck_assert_ptr_null(back->data.data);
    tcc__v1__constant__free_unpacked(back, NULL);
    free(json);
    free(data);
  }
  /* Characters that differ between the alphabets. */
  Tcc__V1__Constant *c = (Tcc__V1__Constant *)parse_ok(&tcc__v1__constant__descriptor, "{\"data\": \"+/8=\"}");
  ck_assert_uint_eq(c->data.len, 2);
  ck_assert_int_eq(c->data.data[0], 0xfb);
  ck_assert_int_eq(c->data.data[1], 0xff);
  tcc__v1__constant__free_unpacked(c, NULL);
  c = (Tcc__V1__Constant *)parse_ok(&tcc__v1__constant__descriptor, "{\"data\": \"-_8\"}");
  ck_assert_uint_eq(c->data.len, 2);
  ck_assert_int_eq(c->data.data[0], 0xfb);
  ck_assert_int_eq(c->data.data[1], 0xff);
  tcc__v1__constant__free_unpacked(c, NULL);
}
END_TEST

START_TEST(int64_extremes) {
  Tcctest__AllKinds m = TCCTEST__ALL_KINDS__INIT;
  int64_t r_int64[] = {INT64_MIN, INT64_MAX, -1, 0};
  uint64_t r_uint64[] = {UINT64_MAX, 0, 1ULL << 63};
  m.f_int64 = INT64_MIN;
  m.f_uint64 = UINT64_MAX;
  m.f_sfixed64 = INT64_MAX;
  m.f_int32 = INT32_MIN;
  m.f_uint32 = UINT32_MAX;
  m.n_r_int64 = 4;
  m.r_int64 = r_int64;
  m.n_r_uint64 = 3;
  m.r_uint64 = r_uint64;
  char *json = tcc_pbjson_print(&m.base, 0);
  ck_assert_str_eq(json,
      "{\"fInt32\":-2147483648,\"fInt64\":\"-9223372036854775808\",\"fUint32\":4294967295,"
      "\"fUint64\":\"18446744073709551615\",\"fSfixed64\":\"9223372036854775807\","
      "\"rInt64\":[\"-9223372036854775808\",\"9223372036854775807\",\"-1\",\"0\"],"
      "\"rUint64\":[\"18446744073709551615\",\"0\",\"9223372036854775808\"]}");
  Tcctest__AllKinds *b = (Tcctest__AllKinds *)parse_ok(&tcctest__all_kinds__descriptor, json);
  ck_assert(b->f_int64 == INT64_MIN);
  ck_assert(b->f_uint64 == UINT64_MAX);
  ck_assert(b->f_sfixed64 == INT64_MAX);
  ck_assert(b->f_int32 == INT32_MIN);
  ck_assert(b->f_uint32 == UINT32_MAX);
  ck_assert(b->r_int64[0] == INT64_MIN && b->r_int64[1] == INT64_MAX);
  ck_assert(b->r_uint64[0] == UINT64_MAX && b->r_uint64[2] == 1ULL << 63);
  assert_same_message(&m.base, &b->base);
  tcctest__all_kinds__free_unpacked(b, NULL);
  free(json);

  /* As numbers: exact up to 2^53 - 1; as bare numbers with INT64_AS_NUMBER. */
  b = (Tcctest__AllKinds *)parse_ok(&tcctest__all_kinds__descriptor,
      "{\"fInt64\": -9007199254740991, \"fUint64\": 9007199254740991, \"fSint64\": \"1e3\"}");
  ck_assert(b->f_int64 == -9007199254740991LL);
  ck_assert(b->f_uint64 == 9007199254740991ULL);
  ck_assert(b->f_sint64 == 1000);
  tcctest__all_kinds__free_unpacked(b, NULL);
  m.n_r_int64 = m.n_r_uint64 = 0;
  json = tcc_pbjson_print_flags(&m.base, TCC_PBJSON_INT64_AS_NUMBER);
  ck_assert_ptr_nonnull(strstr(json, "\"fInt64\":-9223372036854775808,"));
  ck_assert_ptr_nonnull(strstr(json, "\"fUint64\":18446744073709551615,"));
  free(json);
}
END_TEST

START_TEST(float_specials) {
  double vals[] = {NAN, INFINITY, -INFINITY, -0.0, 1e-300, 1.7976931348623157e308};
  Tcc__V1__FloatList fl = TCC__V1__FLOAT_LIST__INIT;
  fl.n_values = 6;
  fl.values = vals;
  char *json = tcc_pbjson_print(&fl.base, 0);
  ck_assert_str_eq(json, "{\"values\":[\"NaN\",\"Infinity\",\"-Infinity\",-0,1e-300,1.7976931348623157e+308]}");
  Tcc__V1__FloatList *b = (Tcc__V1__FloatList *)parse_ok(&tcc__v1__float_list__descriptor, json);
  ck_assert_uint_eq(b->n_values, 6);
  ck_assert(isnan(b->values[0]));
  ck_assert(isinf(b->values[1]) && b->values[1] > 0);
  ck_assert(isinf(b->values[2]) && b->values[2] < 0);
  ck_assert(b->values[3] == 0 && signbit(b->values[3]));
  ck_assert(b->values[4] == 1e-300);
  ck_assert(b->values[5] == 1.7976931348623157e308);
  tcc__v1__float_list__free_unpacked(b, NULL);
  free(json);

  /* Timings: a double field, printed as the shortest round-tripping text. */
  Tcc__V1__Timings t = TCC__V1__TIMINGS__INIT;
  t.compile_ms = 12.5;
  t.total_ms = 1.0 / 3.0;
  json = tcc_pbjson_print(&t.base, 0);
  ck_assert_str_eq(json, "{\"compileMs\":12.5,\"totalMs\":0.3333333333333333}");
  free(json);
}
END_TEST

START_TEST(json_names) {
  char buf[64];
  ck_assert_str_eq(tcc_pbjson_json_name("cpu_isa", buf, sizeof buf), "cpuIsa");
  ck_assert_str_eq(tcc_pbjson_json_name("compile_seconds_saved", buf, sizeof buf), "compileSecondsSaved");
  ck_assert_str_eq(tcc_pbjson_json_name("sha256", buf, sizeof buf), "sha256");
  ck_assert_str_eq(tcc_pbjson_json_name("f_int32", buf, sizeof buf), "fInt32");
  ck_assert_str_eq(tcc_pbjson_json_name("abc_def", buf, 4), "abc");
}
END_TEST

static Suite *pbjson_suite(void) {
  Suite *s = suite_create("pbjson");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, sin_cos_round_trip);
  tcase_add_test(tc, every_kind_random_round_trip);
  tcase_add_test(tc, every_kind_json_forms);
  tcase_add_test(tc, snake_case_and_null_accepted);
  tcase_add_test(tc, oneof_members);
  tcase_add_test(tc, errors_name_the_field_path);
  tcase_add_test(tc, base64_bytes);
  tcase_add_test(tc, int64_extremes);
  tcase_add_test(tc, float_specials);
  tcase_add_test(tc, json_names);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  seed_once();
  return tt_run_suite(pbjson_suite(), 0);
}
