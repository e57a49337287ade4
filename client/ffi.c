/*
 * ffi.c — libtccclient for callers that cannot use protobuf-c structs:
 * the Python package binds these through ctypes. Requests and responses
 * travel as encoded protobuf bytes (the Python side encodes them with its
 * own generated classes); buffers handed out are malloc'd and released
 * with tcc_free; errors live in an opaque heap tcc_error.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "tcc_config.h"
#include "tccclient.h"

int tcc_client_open(const char *addr, int deadline_ms, int connect_timeout_ms, const char *artifact_dir,
                    tcc_client **out, tcc_error *err) {
  tcc_client_options opts = {
      .deadline_ms = deadline_ms,
      .connect_timeout_ms = connect_timeout_ms,
      .artifact_dir = artifact_dir,
  };
  return tcc_client_connect(addr, &opts, out, err);
}

int tcc_client_compile_bytes(tcc_client *c, const uint8_t *req, size_t req_len, uint8_t **resp,
                             size_t *resp_len, tcc_error *err) {
  int rc = tcc_client_call(c, TCC_METHOD_COMPILE, req, req_len, resp, resp_len, 0, err);
  if (rc) return rc;
  Tcc__V1__CompileResponse *r = NULL; /* the same signature check as tcc_client_compile */
  rc = client_compile_response_decode(c, *resp, *resp_len, &r, err);
  if (r) tcc__v1__compile_response__free_unpacked(r, NULL);
  if (rc) {
    free(*resp);
    *resp = NULL;
    *resp_len = 0;
  }
  return rc;
}

int tcc_client_put_plan_bytes(tcc_client *c, const uint8_t *req, size_t len, int *stored, tcc_error *err) {
  if (stored) *stored = 0;
  uint8_t *resp = NULL;
  size_t resp_len = 0;
  int rc = tcc_client_call(c, TCC_METHOD_PUT_PLAN, req, len, &resp, &resp_len, 0, err);
  if (rc) return rc;
  Tcc__V1__PutPlanResponse *r = tcc__v1__put_plan_response__unpack(NULL, resp_len, resp);
  free(resp);
  if (!r) return tcc_error_set(err, TCC_E_INTERNAL, "malformed tcc.v1.PutPlanResponse from the daemon");
  if (stored) *stored = r->stored ? 1 : 0;
  tcc__v1__put_plan_response__free_unpacked(r, NULL);
  return 0;
}

/* Packs m into a malloc'd buffer. */
static int pack(const ProtobufCMessage *m, uint8_t **out, size_t *len, tcc_error *err) {
  size_t n = protobuf_c_message_get_packed_size(m);
  *out = malloc(n + 1);
  if (!*out) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  protobuf_c_message_pack(m, *out);
  *len = n;
  return 0;
}

int tcc_client_get_module_bytes(tcc_client *c, const uint8_t *req, size_t req_len, tcc_module **out,
                                uint8_t **resp, size_t *resp_len, tcc_error *err) {
  *out = NULL;
  if (resp) *resp = NULL;
  if (resp_len) *resp_len = 0;
  Tcc__V1__CompileRequest *r = tcc__v1__compile_request__unpack(NULL, req_len, req);
  if (!r) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed tcc.v1.CompileRequest");
  Tcc__V1__CompileResponse *cr = NULL;
  int rc = tcc_client_get_module(c, r, out, &cr, err);
  tcc__v1__compile_request__free_unpacked(r, NULL);
  if (rc) return rc;
  if (resp && resp_len) rc = pack(&cr->base, resp, resp_len, err);
  tcc__v1__compile_response__free_unpacked(cr, NULL);
  if (rc) {
    tcc_module_unload(*out);
    *out = NULL;
  }
  return rc;
}

int tcc_module_load_bytes(const uint8_t *data, size_t len, const char *sha256_hex, const uint8_t *manifest,
                          size_t manifest_len, tcc_module **out, tcc_error *err) {
  *out = NULL;
  Tcc__V1__Manifest *m = tcc__v1__manifest__unpack(NULL, manifest_len, manifest);
  if (!m) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed tcc.v1.Manifest");
  int rc = tcc_module_load(data, len, sha256_hex, m, out, err);
  tcc__v1__manifest__free_unpacked(m, NULL);
  return rc;
}

int tcc_module_manifest_bytes(const tcc_module *k, uint8_t **out, size_t *len, tcc_error *err) {
  *out = NULL;
  *len = 0;
  const Tcc__V1__Manifest *m = tcc_module_manifest(k);
  if (!m) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "no kernel");
  return pack(&m->base, out, len, err);
}

void tcc_free(void *p) { free(p); }

tcc_error *tcc_error_new(void) { return calloc(1, sizeof(tcc_error)); }

int tcc_error_code(const tcc_error *err) { return err ? err->code : 0; }

const char *tcc_error_message(const tcc_error *err) { return err ? err->msg : ""; }

const char *tcc_error_request_id(const tcc_error *err) { return err ? err->request_id : ""; }

void tcc_error_free(tcc_error *err) { free(err); }

const char *tcc_client_version(void) { return TCC_VERSION; }
