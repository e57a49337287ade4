/* request.c — requests and tensor metas (see tcctest.h). */
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"
#include "tcc/v1/tcc.pb-c.h"
#include "tcc_dtype.h"
#include "tcctest.h"

static void set_devices(Tcc__V1__CompileRequest *req, Tcc__V1__DeviceType type) {
  req->target->device = type;
  Tcc__V1__Graph *g = req->graph;
  for (size_t i = 0; i < g->n_values; i++)
    if (g->values[i]->meta && g->values[i]->meta->device) g->values[i]->meta->device->type = type;
}

void tt_request_to_cuda(Tcc__V1__CompileRequest *req, char *arch) {
  req->target->cuda_arch = arch;
  set_devices(req, TCC__V1__DEVICE_TYPE__CUDA);
}

void tt_request_to_cpu(Tcc__V1__CompileRequest *req) { set_devices(req, TCC__V1__DEVICE_TYPE__CPU); }

Tcc__V1__CompileRequest *tt_graph_request(const tt_graph *g, const char *cuda_arch) {
  ProtobufCMessage *msg;
  tcc_error err;
  ck_assert_msg(tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, g->json, g->len, &msg, &err) == 0,
                "%s: %s", g->name, err.msg);
  Tcc__V1__CompileRequest *req = (Tcc__V1__CompileRequest *)msg;
  ck_assert_msg(req->target != NULL, "%s has no target", g->name);
  if (cuda_arch) { /* the message owns its strings: swap in a copy of arch */
    if (req->target->cuda_arch && req->target->cuda_arch != protobuf_c_empty_string) free(req->target->cuda_arch);
    tt_request_to_cuda(req, strdup(cuda_arch));
  }
  return req;
}

size_t tt_meta_bytes(const Tcc__V1__TensorMeta *m) {
  return (size_t)tcc_storage_elems(m->sizes, m->n_sizes, m->strides, m->n_strides, m->storage_offset) *
         (size_t)tcc_dtype_size(m->dtype);
}
