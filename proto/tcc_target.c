/*
 * tcc_target.c — target specs to tcc.v1.Target, and retargeting a
 * request (tcc_target.h has the table). Used by tcctl (--target) and by
 * the daemon's warm runs, which recompile stored requests for another
 * target.
 */
#include <stdlib.h>
#include <string.h>

#include "tcc_target.h"

#define MAX_FEATURES 64

/* A malloc'd copy of s[0, n), or NULL. */
static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* The CPU half: "ISA[+FEATURE...]" into t. Returns 0 or -1. */
static int parse_cpu(const char *rest, Tcc__V1__Target *t) {
  const char *plus = strchr(rest, '+');
  size_t isa_len = plus ? (size_t)(plus - rest) : strlen(rest);
  if (isa_len == 0) return -1;
  if (!(t->cpu_isa = dup_n(rest, isa_len))) return -1;
  size_t n = 0;
  for (const char *p = plus; p; p = strchr(p + 1, '+')) n++;
  if (n == 0) return 0;
  if (n > MAX_FEATURES || !(t->cpu_features = calloc(n, sizeof *t->cpu_features))) return -1;
  for (const char *p = plus; p; p = strchr(p + 1, '+')) {
    const char *end = strchr(p + 1, '+');
    size_t len = end ? (size_t)(end - p - 1) : strlen(p + 1);
    if (len == 0) return -1;
    if (!(t->cpu_features[t->n_cpu_features] = dup_n(p + 1, len))) return -1;
    t->n_cpu_features++;
  }
  return 0;
}

Tcc__V1__Target *tcc_target_parse(const char *spec) {
  if (!spec) return NULL;
  const char *colon = strchr(spec, ':');
  size_t kind_len = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *rest = colon ? colon + 1 : NULL;
  Tcc__V1__Target *t = malloc(sizeof *t);
  if (!t) return NULL;
  tcc__v1__target__init(t);
  int ok;
  if (kind_len == 3 && !strncmp(spec, "cpu", 3)) {
    t->device = TCC__V1__DEVICE_TYPE__CPU;
    ok = !rest || parse_cpu(rest, t) == 0; /* bare "cpu": the daemon's default ISA */
  } else if (kind_len == 4 && !strncmp(spec, "cuda", 4) && rest && *rest && !strchr(rest, '+')) {
    t->device = TCC__V1__DEVICE_TYPE__CUDA;
    ok = (t->cuda_arch = strdup(rest)) != NULL;
  } else {
    ok = 0;
  }
  if (!ok) {
    tcc__v1__target__free_unpacked(t, NULL);
    return NULL;
  }
  return t;
}

int tcc_request_retarget(Tcc__V1__CompileRequest *req, const char *spec) {
  Tcc__V1__Target *t = tcc_target_parse(spec);
  if (!t) return -1;
  if (req->graph) {
    for (size_t i = 0; i < req->graph->n_values; i++) {
      Tcc__V1__TensorMeta *m = req->graph->values[i]->meta;
      if (!m) continue;
      if (!m->device) {
        if (!(m->device = malloc(sizeof *m->device))) {
          tcc__v1__target__free_unpacked(t, NULL);
          return -1;
        }
        tcc__v1__device__init(m->device);
      }
      m->device->type = t->device;
    }
  }
  if (req->target) tcc__v1__target__free_unpacked(req->target, NULL);
  req->target = t;
  return 0;
}
