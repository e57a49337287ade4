/*
 * optable.c — the op table (ops.h's X-macro): each ATen overload's name,
 * schema, kind, shape rule (infer) and lowering, and the lookups by name
 * and id.
 *
 * The table's schema strings are parsed once (schema.c), under
 * pthread_once, into static storage: the only global state of the
 * library. After tcc_ops_init returns 0 the table is read-only and safe to
 * share between threads. The table sits above the files its rows point
 * into (infer.c, lower.c, conv.c, pool.c, attention.c); they call only
 * schema.c's parameter lookups, never back into it.
 */
#include "graph.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the table */

static tcc_op op_table[TCC_OP_COUNT] = {
#define TCC_OP_ROW(id_, name_, schema_, kind_, infer_, lower_, prim_)  \
  [TCC_OP_##id_] = {.id = TCC_OP_##id_,                                \
                    .name = name_,                                     \
                    .schema_text = schema_,                            \
                    .kind = TCC_OPK_##kind_,                           \
                    .infer = tcc_infer_##infer_,                       \
                    .lower = tcc_lower_##lower_,                       \
                    .prim = TCC_PRIM_##prim_},
    TCC_OPS(TCC_OP_ROW)
#undef TCC_OP_ROW
};

static const tcc_op *op_sorted[TCC_OP_COUNT];   /* by name, for lookup */
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
static tcc_error ops_init_err;                  /* code 0 when the table is good */

static int op_name_cmp(const void *a, const void *b) {
  return strcmp((*(const tcc_op *const *)a)->name, (*(const tcc_op *const *)b)->name);
}

static void ops_parse_all(void) {
  tcc_error_clear(&ops_init_err);
  for (int i = 0; i < TCC_OP_COUNT; i++) {
    tcc_op *op = &op_table[i];
    tcc_error e;
    if (tcc_schema_parse(op->schema_text, &op->schema, &e)) {
      tcc_error_set(&ops_init_err, TCC_E_INTERNAL, "op table: %s: %s", op->name, e.msg);
      return;
    }
    char expect[2 * TCC_NAME_MAX + 16];
    snprintf(expect, sizeof expect, "aten.%s.%s", op->schema.name,
             op->schema.overload[0] ? op->schema.overload : "default");
    if (strcmp(expect, op->name) != 0) {
      tcc_error_set(&ops_init_err, TCC_E_INTERNAL,
                    "op table: row %s has the schema of %s", op->name, expect);
      return;
    }
    op_sorted[i] = op;
  }
  qsort(op_sorted, TCC_OP_COUNT, sizeof op_sorted[0], op_name_cmp);
  for (int i = 1; i < TCC_OP_COUNT; i++)
    if (strcmp(op_sorted[i - 1]->name, op_sorted[i]->name) == 0) {
      tcc_error_set(&ops_init_err, TCC_E_INTERNAL, "op table: %s listed twice",
                    op_sorted[i]->name);
      return;
    }
}

int tcc_ops_init(tcc_error *err) {
  pthread_once(&ops_once, ops_parse_all);
  if (ops_init_err.code)
    return tcc_error_set(err, ops_init_err.code, "%s", ops_init_err.msg);
  return 0;
}

const tcc_op *tcc_op_find(const char *name) {
  size_t lo = 0, hi = TCC_OP_COUNT;
  if (!name) return NULL;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(name, op_sorted[mid]->name);
    if (c == 0) return op_sorted[mid];
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

const tcc_op *tcc_op_get(int id) {
  return id >= 0 && id < TCC_OP_COUNT ? &op_table[id] : NULL;
}

/* ------------------------------------------------ the table, published */

/* Extern ops the CUDA target runs: the matmul family and convolution
 * (im2col packing kernels around cuBLAS GEMM steps on the client). */
int tcc_cuda_extern_op(int id) {
  return id == TCC_OP_MM || id == TCC_OP_BMM || id == TCC_OP_ADDMM || id == TCC_OP_MATMUL || id == TCC_OP_LINEAR ||
         id == TCC_OP_CONVOLUTION || id == TCC_OP_CONVOLUTION_BACKWARD;
}

size_t tcc_compiler_ops(int device, tcc_op_info *out, size_t cap) {
  static const char *const kinds[] = {
    [TCC_OPK_POINTWISE] = "pointwise", [TCC_OPK_REDUCTION] = "reduction",
    [TCC_OPK_VIEW] = "view", [TCC_OPK_EXTERN] = "extern"};
  int cuda = device == TCC__V1__DEVICE_TYPE__CUDA;
  if (!cuda && device != TCC__V1__DEVICE_TYPE__DEVICE_TYPE_UNSPECIFIED && device != TCC__V1__DEVICE_TYPE__CPU)
    return 0;
  if (tcc_ops_init(NULL)) return 0;
  size_t n = 0;
  for (size_t i = 0; i < TCC_OP_COUNT; i++) {
    /* CUDA: of the extern steps, the matmul family (cuBLAS on the client) */
    if (cuda && op_table[i].kind == TCC_OPK_EXTERN && !tcc_cuda_extern_op((int)i)) continue;
    /* CUDA: the CPU attention op has no CUDA lowering */
    if (cuda && (op_table[i].id == TCC_OP_ATTENTION_CPU || op_table[i].id == TCC_OP_ATTENTION_CPU_BACKWARD))
      continue;
    if (n < cap) out[n] = (tcc_op_info){op_table[i].name, op_table[i].schema_text, kinds[op_table[i].kind]};
    n++;
  }
  return n;
}
