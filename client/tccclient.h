/*
 * tccclient.h — libtccclient: talk to tccd and run what it returns.
 *
 * One implementation of the RPC, deadline, digest and loading logic; tcctl
 * and the Python package are thin layers over it.
 *
 *   tcc_client_connect -> tcc_client_compile -> tcc_client_fetch
 *                      -> tcc_kernel_load -> tcc_kernel_run
 *
 * or all of it at once with tcc_client_get_kernel. Every call has a
 * deadline (the client's default, or the one given). Functions return 0 or
 * a negative TCC_E* code (the gRPC status of the call, negated) and fill
 * err with the daemon's message. A tcc_client may be used from several
 * threads at once; a tcc_kernel may be run from several threads at once.
 */
#ifndef TCC_CLIENT_H
#define TCC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_digest.h"
#include "tcc_status.h"

#define TCC_DEFAULT_ADDR "127.0.0.1:7311"

typedef struct tcc_client tcc_client;
typedef struct tcc_kernel tcc_kernel;

typedef struct tcc_client_options {
  int deadline_ms;            /* per call; 0 = 60000 */
  int connect_timeout_ms;     /* wait for the channel to be ready; 0 = 5000 */
  const char *artifact_dir;   /* local artifact cache (by digest); NULL = none */
} tcc_client_options;

/* addr NULL: $TCCD_ADDR, else TCC_DEFAULT_ADDR. opts may be NULL.
 * Fails with TCC_E_UNAVAILABLE when nothing answers within the timeout. */
int tcc_client_connect(const char *addr, const tcc_client_options *opts,
                       tcc_client **out, tcc_error *err);
void tcc_client_close(tcc_client *c);

/* Generic unary call on a full method name ("/tcc.v1.Cache/Stats") with
 * encoded request bytes; *resp is malloc'd (caller frees). deadline_ms 0 =
 * the client's default. */
int tcc_client_call(tcc_client *c, const char *method,
                    const uint8_t *req, size_t req_len,
                    uint8_t **resp, size_t *resp_len,
                    int deadline_ms, tcc_error *err);

/* Compile. *resp is a protobuf-c message: free with
 * tcc__v1__compile_response__free_unpacked(*resp, NULL). */
int tcc_client_compile(tcc_client *c, const Tcc__V1__CompileRequest *req,
                       Tcc__V1__CompileResponse **resp, tcc_error *err);

/* Fetches an artifact by digest (hex) over the streaming Fetch call and
 * verifies its SHA-256. Uses/updates the local artifact cache when set.
 * *data is malloc'd (caller frees). */
int tcc_client_fetch(tcc_client *c, const char *sha256_hex,
                     uint8_t **data, size_t *len, tcc_error *err);

/* Loads an artifact after checking its digest against sha256_hex.
 * CPU: a shared object, dlopen'ed from a sealed memfd; the manifest's
 * entry symbol is resolved. */
int tcc_kernel_load(const uint8_t *data, size_t len, const char *sha256_hex,
                    const Tcc__V1__Manifest *manifest,
                    tcc_kernel **out, tcc_error *err);

/* Runs the loaded graph: inputs/outputs as the manifest describes them
 * (pointers to element 0 of each storage), workspace of at least
 * manifest->workspace_bytes (NULL when 0). */
int tcc_kernel_run(tcc_kernel *k, const void *const *inputs,
                   void *const *outputs, void *workspace, tcc_error *err);

/* The manifest the kernel was loaded with (owned by the kernel). */
const Tcc__V1__Manifest *tcc_kernel_manifest(const tcc_kernel *k);

void tcc_kernel_unload(tcc_kernel *k);

/* Compile + fetch + verify + load. *resp (optional) receives the compile
 * response. */
int tcc_client_get_kernel(tcc_client *c, const Tcc__V1__CompileRequest *req,
                          tcc_kernel **out, Tcc__V1__CompileResponse **resp,
                          tcc_error *err);

#endif
