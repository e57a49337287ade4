/*
 * tcc_run.c — drives libtccclient end to end for the integration tests:
 * compile a request (protobuf JSON), fetch + verify + load the artifact,
 * run it on raw input files, write raw output files.
 *
 *   tcc-run ADDR REQUEST.json IN... -- OUT...
 *
 * Each IN file holds the input's whole storage as the manifest describes it
 * (storage_offset + the strided extent, raw little-endian elements); each
 * OUT file receives the output's storage. Prints one JSON line:
 *   {"guard_hash": "...", "cache": "miss", "kernels": 1}
 * The Python tests make random inputs and check the outputs against NumPy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"
#include "tcc_dtype.h"
#include "tccclient.h"
#include "tcctest.h"

/* Bytes of storage a tensor reaches: (offset + 1 + sum((size-1)*stride)) * elem. */
static size_t storage_bytes(const Tcc__V1__TensorMeta *m) {
  return (size_t)tcc_storage_elems(m->sizes, m->n_sizes, m->strides, m->n_strides, m->storage_offset) *
         (size_t)tcc_dtype_size(m->dtype);
}

static const char *cache_name(Tcc__V1__CacheStatus s) {
  switch (s) {
  case TCC__V1__CACHE_STATUS__MISS: return "miss";
  case TCC__V1__CACHE_STATUS__HIT: return "hit";
  case TCC__V1__CACHE_STATUS__COALESCED: return "coalesced";
  case TCC__V1__CACHE_STATUS__REMOTE_HIT: return "remote_hit";
  default: return "unknown";
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: tcc-run ADDR REQUEST.json IN... -- OUT...\n");
    return 2;
  }
  int sep = 3;
  while (sep < argc && strcmp(argv[sep], "--") != 0) sep++;
  if (sep == argc) {
    fprintf(stderr, "tcc-run: missing -- before the output files\n");
    return 2;
  }
  int nin = sep - 3, nout = argc - sep - 1;

  tcc_error err;
  size_t json_len;
  char *json = tt_read_file(argv[2], &json_len);
  if (!json) {
    fprintf(stderr, "tcc-run: cannot read %s\n", argv[2]);
    return 1;
  }
  ProtobufCMessage *msg = NULL;
  if (tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, json, json_len, &msg, &err) != 0) {
    fprintf(stderr, "tcc-run: %s: %s\n", argv[2], err.msg);
    return 1;
  }
  free(json);
  Tcc__V1__CompileRequest *req = (Tcc__V1__CompileRequest *)msg;

  tcc_client *client = NULL;
  tcc_module *kernel = NULL;
  Tcc__V1__CompileResponse *resp = NULL;
  int rc = 1;
  void **inputs = calloc((size_t)nin + 1, sizeof *inputs);
  void **outputs = calloc((size_t)nout + 1, sizeof *outputs);
  size_t *out_bytes = calloc((size_t)nout + 1, sizeof *out_bytes);

  if (tcc_client_connect(argv[1], NULL, &client, &err) != 0 ||
      tcc_client_get_module(client, req, &kernel, &resp, &err) != 0) {
    fprintf(stderr, "tcc-run: %s: %s\n", tcc_status_name(err.code), err.msg);
    goto out;
  }
  const Tcc__V1__Manifest *m = tcc_module_manifest(kernel);
  if ((int)m->n_inputs != nin || (int)m->n_outputs != nout) {
    fprintf(stderr, "tcc-run: the kernel takes %zu inputs and %zu outputs; got %d and %d files\n",
            m->n_inputs, m->n_outputs, nin, nout);
    goto out;
  }
  for (int i = 0; i < nin; i++) {
    size_t len, want = storage_bytes(m->inputs[i]);
    inputs[i] = tt_read_file(argv[3 + i], &len);
    if (!inputs[i] || len != want) {
      fprintf(stderr, "tcc-run: input %d (%s): %zu bytes, the manifest needs %zu\n", i, argv[3 + i],
              inputs[i] ? len : 0, want);
      goto out;
    }
  }
  for (int i = 0; i < nout; i++) {
    out_bytes[i] = storage_bytes(m->outputs[i]);
    outputs[i] = calloc(1, out_bytes[i] + 1);
  }
  void *workspace = m->workspace_bytes > 0 ? calloc(1, (size_t)m->workspace_bytes) : NULL;
  int run = tcc_module_run(kernel, (const void *const *)inputs, outputs, workspace, &err);
  free(workspace);
  if (run != 0) {
    fprintf(stderr, "tcc-run: run: %s\n", err.msg);
    goto out;
  }
  for (int i = 0; i < nout; i++) {
    FILE *f = fopen(argv[sep + 1 + i], "wb");
    if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) {
      fprintf(stderr, "tcc-run: cannot write %s\n", argv[sep + 1 + i]);
      if (f) fclose(f);
      goto out;
    }
    fclose(f);
  }
  printf("{\"guard_hash\": \"%s\", \"cache\": \"%s\", \"kernels\": %zu}\n", resp->guard_hash,
         cache_name(resp->cache), resp->manifest ? resp->manifest->n_kernels : 0);
  rc = 0;
out:
  for (int i = 0; i < nin; i++) free(inputs[i]);
  for (int i = 0; i < nout; i++) free(outputs[i]);
  free(inputs);
  free(outputs);
  free(out_bytes);
  if (resp) tcc__v1__compile_response__free_unpacked(resp, NULL);
  tcc_module_unload(kernel);
  tcc_client_close(client);
  protobuf_c_message_free_unpacked(msg, NULL);
  return rc;
}
