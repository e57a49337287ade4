/*
 * tcc_target.h — target specs: the short text form of a tcc.v1.Target,
 * as tcctl takes it (--target) and as the daemon labels entries.
 *
 *   spec                     Target
 *   -----------------------  --------------------------------------------
 *   cpu                      device CPU, cpu_isa "" (the daemon's default)
 *   cpu:ISA[+FEATURE...]     device CPU, cpu_isa ISA, cpu_features
 *   cuda:ARCH                device CUDA, cuda_arch ARCH ("sm_90a")
 *
 * An entry's label ("cpu:x86-64-v3+avx512bf16", "cuda:sm_90") is a spec.
 * Only the form is checked here; whether the ISA, features or arch exist
 * is the compiler's call (tcc_prepare), which names what it refuses.
 *
 * Retargeting a request also moves every tensor value of its graph to the
 * target's device type: a request's metas must agree with its target, so
 * one graph serves `cpu` and `cuda:...` alike.
 */
#ifndef TCC_TARGET_H
#define TCC_TARGET_H

#include "tcc/v1/tcc.pb-c.h"

/* Parses spec into a malloc'd Target (free with
 * tcc__v1__target__free_unpacked(t, NULL)). Returns NULL for a malformed
 * spec (or out of memory). */
Tcc__V1__Target *tcc_target_parse(const char *spec);

/* Replaces req->target with spec's and moves the graph's tensor values
 * to its device type. req must come from protobuf-c's default allocator
 * (an unpacked message). Returns 0, or -1 for a malformed spec or out of
 * memory (req then keeps its old target; a device half-moved is
 * harmless: the request is refused or thrown away). */
int tcc_request_retarget(Tcc__V1__CompileRequest *req, const char *spec);

#endif
