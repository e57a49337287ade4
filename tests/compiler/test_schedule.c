/*
 * test_schedule.c — the targets' schedule passes (compiler/cpu/schedule.c,
 * compiler/cuda/schedule.c): what they decide for a few shapes, that
 * their checkers accept what they make and refuse a schedule that breaks
 * an invariant (INTERNAL naming it), and that the dump says what was
 * decided.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_schedule.h"
#include "cuda_schedule.h"
#include "tcctest.h"

/* A program run through the passes up to (and with) the schedule. */
typedef struct scheduled {
  tcc_prepared *prep;
  tcc_arena arena;
  tcc_program prog;
  const tcc_target *t;
} scheduled;

/* s = sin(x) and r = s.sum(1) over x [rows, cols]: a pointwise kernel
 * and a row reduction. */
static reqb *rows_request(int64_t rows, int64_t cols) {
  reqb *b = reqb_new("x86-64-v3");
  reqb_value(b, "x", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "s", TCC__V1__DTYPE__FLOAT32, 2, (int64_t[]){rows, cols}, NULL, 0);
  reqb_value(b, "r", TCC__V1__DTYPE__FLOAT32, 1, (int64_t[]){rows}, NULL, 0);
  reqb_input(b, "x");
  reqb_unary(b, "aten.sin.default", "x", "s");
  Tcc__V1__Node *n = reqb_node(b, "aten.sum.dim_IntList", "r");
  reqb_arg_tensor(b, n, "self", "s");
  reqb_arg_ints(b, n, "dim", 1, (int64_t[]){1});
  reqb_output(b, "s");
  reqb_output(b, "r");
  return b;
}

/* Runs the passes; cuda: retargets the request to sm_90 first (reqb frees
 * nothing field by field, so a borrowed string and Device are fine). */
static void schedule(scheduled *s, reqb *b, int cuda) {
  Tcc__V1__CompileRequest *req = reqb_req(b);
  static Tcc__V1__Device cuda_device = TCC__V1__DEVICE__INIT;
  cuda_device.type = TCC__V1__DEVICE_TYPE__CUDA;
  if (cuda) {
    req->target->device = TCC__V1__DEVICE_TYPE__CUDA;
    req->target->cuda_arch = "sm_90";
    for (size_t i = 0; i < req->graph->n_values; i++)
      if (!req->graph->values[i]->meta->device) req->graph->values[i]->meta->device = &cuda_device;
      else req->graph->values[i]->meta->device->type = TCC__V1__DEVICE_TYPE__CUDA;
  }
  tcc_error err = {0};
  ck_assert_msg(tcc_prepare(req, "test", &s->prep, &err) == 0, "%s", err.msg);
  tcc_arena_init(&s->arena);
  tcc_program_init(&s->prog, &s->arena, s->prep->graph);
  s->t = tcc_target_for(s->prep->graph->target.device);
  ck_assert_ptr_nonnull(s->t);
  ck_assert_int_eq(tcc_lower(&s->prog, &err), 0);
  ck_assert_int_eq(tcc_fuse(&s->prog, &err), 0);
  ck_assert_int_eq(tcc_split_dims(&s->prog, &err), 0);
  ck_assert_int_eq(tcc_place_buffers(&s->prog, &err), 0);
  ck_assert_msg(s->t->schedule(&s->prog, &err) == 0, "%s", err.msg);
  ck_assert_msg(s->t->check(&s->prog, &err) == 0, "%s", err.msg);
}

static void unschedule(scheduled *s) {
  tcc_program_free(&s->prog);
  tcc_arena_free(&s->arena);
  tcc_prepared_free(s->prep);
}

static char *dump(const scheduled *s) {
  tcc_buf b = {0};
  s->t->dump(&s->prog, &b);
  return tcc_buf_take(&b, NULL);
}

/* The live kernel that computes a reduction (CPU). */
static tcc_cpu_kernel_schedule *cpu_reduction(scheduled *s) {
  for (int k = 0; k < s->prog.nkernels; k++) {
    tcc_cpu_kernel_schedule *ks = &s->prog.sched.cpu->kernels[k];
    for (int i = 0; ks->live && i < ks->nnodes; i++)
      if (ks->nodes[i]->op == TCC_PRIM_REDUCE) return ks;
  }
  return NULL;
}

START_TEST(cpu_small_is_serial_and_simd) {
  scheduled s;
  reqb *b = rows_request(4, 8);
  schedule(&s, b, 0);
  int live = 0;
  for (int k = 0; k < s.prog.nkernels; k++) {
    const tcc_cpu_kernel_schedule *ks = &s.prog.sched.cpu->kernels[k];
    if (!ks->live) continue;
    live++;
    ck_assert_int_eq(ks->par, -1);           /* 32 elements: below TCC_PARALLEL_WORK */
    ck_assert_int_eq(ks->peel_loop, -1);
  }
  ck_assert_int_ge(live, 1);
  tcc_cpu_kernel_schedule *ks = cpu_reduction(&s);
  ck_assert_ptr_nonnull(ks);
  /* the row sum sits inside the row loop, above the element loop */
  int red_level = -1;
  for (int i = 0; i < ks->nnodes; i++)
    if (ks->nodes[i]->op == TCC_PRIM_REDUCE) red_level = ks->levels[i];
  ck_assert_int_ge(red_level, 1);
  char *text = dump(&s);
  ck_assert_ptr_nonnull(strstr(text, "cpu schedule"));
  ck_assert_ptr_nonnull(strstr(text, "reductions"));
  free(text);
  unschedule(&s);
  reqb_free(b);
}
END_TEST

START_TEST(cpu_large_is_parallel) {
  scheduled s;
  reqb *b = rows_request(1024, 512);
  schedule(&s, b, 0);
  tcc_cpu_kernel_schedule *ks = cpu_reduction(&s);
  ck_assert_ptr_nonnull(ks);
  ck_assert_int_eq(ks->par, 0);              /* the row loop, 512K elements of work */
  ck_assert_int_eq(ks->nest.size[0], 1024);
  char *text = dump(&s);
  ck_assert_ptr_nonnull(strstr(text, "parallel loop 0"));
  free(text);
  unschedule(&s);
  reqb_free(b);
}
END_TEST

/* The parallel loop (-1: none) of the row reduction of rows_request. */
static int reduction_par(int64_t rows, int64_t cols) {
  scheduled s;
  reqb *b = rows_request(rows, cols);
  schedule(&s, b, 0);
  tcc_cpu_kernel_schedule *ks = cpu_reduction(&s);
  ck_assert_ptr_nonnull(ks);
  int par = ks->par;
  unschedule(&s);
  reqb_free(b);
  return par;
}

/* A few long rows (BERT's layer norm on a 9-token sentence): the row
 * statistics run once a row, so the work is 9 x 768 elements plus 9 x 768
 * reduction steps, below TCC_PARALLEL_WORK, and the kernel runs serial
 * rather than paying for a parallel region per call. */
START_TEST(cpu_few_rows_is_serial) {
  ck_assert_int_eq(reduction_par(9, 768), -1);
  ck_assert_int_eq(reduction_par(128, 768), 0);   /* 14 x the work: parallel */
}
END_TEST

START_TEST(cpu_checker_refuses) {
  scheduled s;
  reqb *b = rows_request(1024, 512);
  schedule(&s, b, 0);
  tcc_cpu_kernel_schedule *ks = cpu_reduction(&s);
  tcc_error err = {0};
  int par = ks->par;
  ks->par = ks->nest.nloops;                 /* a loop that does not exist */
  ck_assert_int_eq(s.t->check(&s.prog, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "parallel loop"));
  ks->par = par;
  ks->simd = 1;
  ks->inner_red = 1;                         /* simd around a reduction loop */
  ck_assert_int_eq(s.t->check(&s.prog, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "simd"));
  ks->simd = ks->inner_red = 0;
  ks->nest.size[0]++;                        /* a loop that runs the wrong count */
  ck_assert_int_eq(s.t->check(&s.prog, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "iterations"));
  unschedule(&s);
  reqb_free(b);
}
END_TEST

START_TEST(cuda_geometry_and_checker) {
  scheduled s;
  reqb *b = rows_request(64, 1000);
  schedule(&s, b, 1);
  const tcc_cuda_schedule *cs = s.prog.sched.cuda;
  ck_assert_int_ge(cs->n, 1);
  const tcc_cuda_step *red = NULL;
  for (int i = 0; i < cs->n; i++)
    if (cs->steps[i].plan && cs->steps[i].plan->reduction) red = &cs->steps[i];
  ck_assert_ptr_nonnull(red);
  ck_assert_int_eq(red->grid[0], 64);        /* a block per row */
  ck_assert_int_eq(red->block, 256);         /* 1000 rounded up to a power of two, at most 256 */
  char *text = dump(&s);
  ck_assert_ptr_nonnull(strstr(text, "block 256"));
  free(text);
  tcc_error err = {0};
  tcc_cuda_step *st = (tcc_cuda_step *)red;
  st->block = 48;                            /* not whole warps */
  ck_assert_int_eq(s.t->check(&s.prog, &err), TCC_E_INTERNAL);
  ck_assert_ptr_nonnull(strstr(err.msg, "block 48"));
  st->block = 256;
  ((tcc_cuda_schedule *)cs)->n_global++;     /* a miscounted launch plan */
  ck_assert_int_eq(s.t->check(&s.prog, &err), TCC_E_INTERNAL);
  unschedule(&s);
  reqb_free(b);
}
END_TEST

int main(void) {
  return tt_run_tests("schedule", 0, 0, (const TTest *[]){
      cpu_small_is_serial_and_simd,
      cpu_large_is_parallel,
      cpu_few_rows_is_serial,
      cpu_checker_refuses,
      cuda_geometry_and_checker,
      NULL});
}
