/* testutil.c — shared helpers of the client tests (see testutil.h). */
#include "testutil.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcc_config.h"
#include "tcctest.h"

static const char kernel_src[] =
    "#include <math.h>\n"
    "#include <stdlib.h>\n"
    "__attribute__((constructor)) static void on_load(void) { setenv(MARKER, \"1\", 1); }\n"
    "int tcc_entry(const void *const *in, void *const *out, void *ws) {\n"
    "  (void)ws;\n"
    "  const float *x = in[0], *y = in[1];\n"
    "  float *o = out[0];\n"
    "  for (int i = 0; i < N; i++) {\n"
    "#ifdef DOUBLE_IT\n"
    "    o[i] = x[i] * 2.0f;\n"
    "#else\n"
    "    o[i] = sinf(x[i]) + cosf(y[i]);\n"
    "#endif\n"
    "  }\n"
    "  return 0;\n"
    "}\n"
    "int tcc_entry_fails(const void *const *in, void *const *out, void *ws) {\n"
    "  (void)in; (void)out; (void)ws; return 7;\n"
    "}\n";

const char *tu_tmpdir(void) {
  static char *dir;
  if (!dir && !(dir = tt_tmpdir("client-test"))) {
    perror("mkdtemp");
    abort();
  }
  return dir;
}

uint8_t *tu_build_kernel(const char *marker, const char *extra_define, size_t *len) {
  char src[512], so[512], mdef[128], ndef[32];
  snprintf(src, sizeof src, "%s/%s.c", tu_tmpdir(), marker);
  snprintf(so, sizeof so, "%s/%s.so", tu_tmpdir(), marker);
  snprintf(mdef, sizeof mdef, "-DMARKER=\"%s\"", marker);
  snprintf(ndef, sizeof ndef, "-DN=%d", TU_N);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fputs(kernel_src, f);
  fclose(f);
  char *argv[] = {(char *)TCC_CC_DEFAULT, "-shared", "-fPIC", "-O2", mdef, ndef,
                  (char *)(extra_define ? extra_define : "-DUNUSED_DEFINE"), "-o", so, src, "-lm", NULL};
  ck_assert_int_eq(tt_run(argv, NULL, NULL, NULL), 0);
  uint8_t *data = (uint8_t *)tt_read_file(so, len);
  ck_assert_ptr_nonnull(data);
  unlink(src);
  unlink(so);
  return data;
}

void tu_manifest_init(tu_manifest *t, const char *entry, unsigned abi) {
  tcc__v1__manifest__init(&t->m);
  t->sizes[0] = TU_N;
  t->strides[0] = 1;
  for (int i = 0; i < 3; i++) {
    tcc__v1__tensor_meta__init(&t->metas[i]);
    t->metas[i].dtype = TCC__V1__DTYPE__FLOAT32;
    t->metas[i].n_sizes = 1;
    t->metas[i].sizes = t->sizes;
    t->metas[i].n_strides = 1;
    t->metas[i].strides = t->strides;
  }
  t->inputs[0] = &t->metas[0];
  t->inputs[1] = &t->metas[1];
  t->outputs[0] = &t->metas[2];
  tcc__v1__kernel_info__init(&t->kernel);
  t->kernel.name = (char *)"k0_sin_cos_add";
  t->kernel.kind = (char *)"pointwise";
  t->kernel.numel = TU_N;
  t->kernels[0] = &t->kernel;
  t->m.abi_version = abi;
  t->m.entry = (char *)entry;
  t->m.n_inputs = 2;
  t->m.inputs = t->inputs;
  t->m.n_outputs = 1;
  t->m.outputs = t->outputs;
  t->m.n_kernels = 1;
  t->m.kernels = t->kernels;
  t->m.target = (char *)"cpu:x86-64-v2";
  t->m.compiler = (char *)"test-kernel";
}

void tu_run_and_check(tcc_module *k, int doubled) {
  float x[TU_N], y[TU_N], out[TU_N];
  for (int i = 0; i < TU_N; i++) {
    x[i] = (float)tt_uniform(-6.0, 6.0);
    y[i] = (float)tt_uniform(-6.0, 6.0);
    out[i] = NAN;
  }
  const void *ins[] = {x, y};
  void *outs[] = {out};
  tcc_error err = {0};
  ck_assert_msg(tcc_module_run(k, ins, outs, NULL, &err) == 0, "run: %s", err.msg);
  for (int i = 0; i < TU_N; i++) {
    double ref = doubled ? 2.0 * x[i] : sin((double)x[i]) + cos((double)y[i]);
    /* float32 sinf/cosf and one rounding of the sum: well under 1e-5 here. */
    ck_assert_msg(fabs(out[i] - ref) <= 1e-5 + 1e-6 * fabs(ref), "element %d: %.9g vs %.9g", i, (double)out[i],
                  ref);
  }
}
