/*
 * test_explain.c — guard keys read back into components (compiler.h,
 * tcc_key_parts_read) and compared (tcc_key_parts_diff): the parts name
 * what the key encodes, keys of one graph share a digest and differ in
 * exactly the parts that changed, and a malformed key (any truncation,
 * any flipped byte) is refused or read, never overrun.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"
#include "tcctest.h"

#define ID "tccd-codegen/1 cc=test"

/* The key tcc_prepare makes for b (b freed). */
static uint8_t *key_of(reqb *b, size_t *len) {
  tcc_prepared *p = NULL;
  tcc_error err;
  ck_assert_msg(tcc_prepare(reqb_req(b), ID, &p, &err) == 0, "%s", err.msg);
  uint8_t *key = malloc(p->key_len);
  memcpy(key, p->key, p->key_len);
  *len = p->key_len;
  tcc_prepared_free(p);
  reqb_free(b);
  return key;
}

static const char *part(const tcc_key_parts *kp, const char *name) {
  for (size_t i = 0; i < kp->n; i++)
    if (!strcmp(kp->parts[i].name, name)) return kp->parts[i].value;
  return NULL;
}

typedef struct diffs {
  int n;
  char names[16][128];
} diffs;

static void note(void *arg, const tcc_key_part *a, const tcc_key_part *b) {
  diffs *d = arg;
  ck_assert_str_ne(a->value, b->value);
  if (d->n < 16 && a->cls != TCC_KEY_VALUE) snprintf(d->names[d->n++], sizeof d->names[0], "%s", a->name);
}

START_TEST(parts_name_the_key) {
  size_t len;
  uint8_t *key = key_of(reqb_sin_cos_rows(12, 7), &len);
  tcc_key_parts kp;
  tcc_error err;
  ck_assert_int_eq(tcc_key_parts_read(key, len, &kp, &err), 0);
  ck_assert_str_eq(part(&kp, "compiler identity"), ID);
  ck_assert_str_eq(part(&kp, "target arch"), "x86-64-v2");
  ck_assert_str_eq(part(&kp, "input 0 sizes"), "[12, 7]");
  ck_assert_str_eq(part(&kp, "input 0 strides"), "[7, 1]");
  ck_assert_str_eq(part(&kp, "input 0 dtype"), "float32");
  ck_assert_str_eq(part(&kp, "input 1 sizes"), "[7]");
  ck_assert_ptr_nonnull(part(&kp, "output 0 sizes"));
  ck_assert_int_eq(kp.ninputs, 2);
  uint8_t digest[TCC_SHA256_BYTES];
  ck_assert_int_eq(tcc_key_graph_digest(key, len, digest), 0);
  ck_assert_mem_eq(digest, kp.graph, sizeof digest);
  tcc_key_parts_free(&kp);
  free(key);
}
END_TEST

START_TEST(one_graph_differs_in_the_parts_that_changed) {
  int64_t rows = (int64_t)tt_rand_range(2, 64), cols = (int64_t)tt_rand_range(2, 64);
  size_t la, lb, lc;
  uint8_t *a = key_of(reqb_sin_cos_rows(rows, cols), &la);
  uint8_t *b = key_of(reqb_sin_cos_rows(rows + 1, cols), &lb);
  uint8_t *c = key_of(reqb_softmax("aten._softmax.default", TCC__V1__DTYPE__FLOAT32, rows, cols), &lc);
  tcc_key_parts pa, pb, pc;
  tcc_error err;
  ck_assert_int_eq(tcc_key_parts_read(a, la, &pa, &err), 0);
  ck_assert_int_eq(tcc_key_parts_read(b, lb, &pb, &err), 0);
  ck_assert_int_eq(tcc_key_parts_read(c, lc, &pc, &err), 0);
  ck_assert_mem_eq(pa.graph, pb.graph, TCC_SHA256_BYTES);     /* sizes are not the graph */
  ck_assert_mem_ne(pa.graph, pc.graph, TCC_SHA256_BYTES);     /* other ops are */
  diffs d = {0};
  ck_assert_int_ge(tcc_key_parts_diff(&pa, &pb, note, &d), 1);
  ck_assert_int_eq(d.n, 1);
  ck_assert_str_eq(d.names[0], "input 0 sizes");
  ck_assert_int_eq(tcc_key_parts_diff(&pa, &pa, NULL, NULL), 0);
  ck_assert_int_eq(tcc_key_parts_diff(&pa, &pc, NULL, NULL), -1);
  tcc_key_parts_free(&pa);
  tcc_key_parts_free(&pb);
  tcc_key_parts_free(&pc);
  free(a), free(b), free(c);
}
END_TEST

START_TEST(malformed_keys_are_refused) {
  size_t len;
  uint8_t *key = key_of(reqb_layer_norm(TCC__V1__DTYPE__FLOAT32, 8, 16, 1), &len);
  tcc_key_parts kp;
  tcc_error err;
  for (size_t n = 0; n < len; n++) { /* every truncation, in a buffer of exactly n bytes */
    uint8_t *cut = malloc(n ? n : 1);
    memcpy(cut, key, n);
    ck_assert_int_eq(tcc_key_parts_read(cut, n, &kp, &err), TCC_E_INVALID_ARGUMENT);
    free(cut);
  }
  ck_assert_int_eq(tcc_key_parts_read(NULL, 0, &kp, &err), TCC_E_INVALID_ARGUMENT);
  for (int i = 0; i < 2000; i++) { /* flipped bytes: read or refused, never overrun (ASan, valgrind) */
    uint8_t *bad = malloc(len);
    memcpy(bad, key, len);
    bad[tt_rand_range(0, len - 1)] ^= (uint8_t)tt_rand_range(1, 255);
    int rc = tcc_key_parts_read(bad, len, &kp, &err);
    ck_assert(rc == 0 || rc == TCC_E_INVALID_ARGUMENT);
    if (rc == 0) tcc_key_parts_free(&kp);
    free(bad);
  }
  free(key);
}
END_TEST

int main(void) {
  tt_seed("test_explain");
  return tt_run_tests("explain", 60, 0, (const TTest *[]){
      parts_name_the_key,
      one_graph_differs_in_the_parts_that_changed,
      malformed_keys_are_refused,
      NULL});
}
