/*
 * tccclient.h — libtccclient: talk to tccd and run what it returns.
 *
 * One implementation of the RPC, deadline, digest and loading logic; tcctl
 * and the Python package are thin layers over it.
 *
 *   tcc_client_connect -> tcc_client_compile -> tcc_client_fetch
 *                      -> tcc_module_load -> tcc_module_run
 *
 * or all of it at once with tcc_client_get_module. Every call has a
 * deadline (the client's default, or the one given). Functions return 0 or
 * a negative TCC_E* code (the gRPC status of the call, negated) and fill
 * err with the daemon's message. A tcc_client may be used from several
 * threads at once; a tcc_module may be run from several threads at once.
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
/* A loaded artifact: one compiled graph (a .so, or a cubin and its launch
 * steps) with its manifest, ready to run (module.c). Not the compiler's
 * tcc_kernel, which is one loop nest of the IR. */
typedef struct tcc_module tcc_module;

typedef struct tcc_client_options {
  int deadline_ms;            /* per call; 0 = 60000 */
  int connect_timeout_ms;     /* wait for the channel to be ready; 0 = 5000 */
  const char *artifact_dir;   /* local artifact cache (by digest); NULL = none */
  /* Comma-separated tccd .pub files (tcctl keygen). With any, every
   * compiled artifact must carry a valid signature by one of them before
   * it is loaded (tcc_client_compile refuses it otherwise). NULL =
   * $TCCD_TRUSTED_KEYS; "" = none (unsigned artifacts load, digests are
   * still checked). Production sets it. */
  const char *trusted_keys;
  /* Bearer token sent with every call (`authorization: Bearer TOKEN`),
   * for a tccd started with --auth-tokens. NULL = $TCCD_TOKEN; "" = none. */
  const char *token;
  /* TLS (a tccd started with --tls-cert). tls_ca: PEM file of the CA that
   * signed the daemon's certificate (NULL = $TCCD_TLS_CA). tls_cert and
   * tls_key: this client's certificate and key for a daemon that
   * requires them (--tls-client-ca) (NULL = $TCCD_TLS_CERT,
   * $TCCD_TLS_KEY). tls = 1 (or $TCCD_TLS=1) uses TLS with the system's
   * roots when no CA is named. Any of them set means TLS; none means a
   * plaintext channel. "" counts as unset. */
  const char *tls_ca;
  const char *tls_cert;
  const char *tls_key;
  int tls;
} tcc_client_options;

/* addr NULL: $TCCD_ADDR, else TCC_DEFAULT_ADDR. opts may be NULL.
 * TCC_E_INVALID_ARGUMENT for an address tcc_client_addr_check refuses.
 * TCC_E_UNAVAILABLE "cannot reach tccd at ADDR: ..." at once when the
 * connection is refused (or the name does not resolve), and after
 * connect_timeout_ms when a connection attempt is still in progress then
 * (a daemon slow to accept, a host that drops packets). */
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
 * tcc__v1__compile_response__free_unpacked(*resp, NULL).
 * With trusted keys configured, the artifact's signature is verified
 * against the response's guard hash, digest and manifest bytes first:
 * TCC_E_PERMISSION_DENIED "artifact is unsigned and TCCD_TRUSTED_KEYS is
 * set" or "artifact signature invalid: ..." (nothing is returned then). */
int tcc_client_compile(tcc_client *c, const Tcc__V1__CompileRequest *req,
                       Tcc__V1__CompileResponse **resp, tcc_error *err);

/* Fetches an artifact by digest (hex) over the streaming Fetch call and
 * verifies its SHA-256. Uses/updates the local artifact cache when set.
 * *data is malloc'd (caller frees). A digest names no signature: with
 * trusted keys, take the digest from a verified CompileResponse (as
 * tcc_client_get_module does) or fetch by guard hash
 * (tcc_client_fetch_entry, which verifies). */
int tcc_client_fetch(tcc_client *c, const char *sha256_hex,
                     uint8_t **data, size_t *len, tcc_error *err);

/* Loads an artifact after checking its digest against sha256_hex.
 * CPU: a shared object, dlopen'ed from a sealed memfd; the manifest's
 * entry symbol is resolved. */
int tcc_module_load(const uint8_t *data, size_t len, const char *sha256_hex,
                    const Tcc__V1__Manifest *manifest,
                    tcc_module **out, tcc_error *err);

/* Runs the loaded graph: inputs/outputs as the manifest describes them
 * (pointers to element 0 of each storage), workspace of at least
 * tcc_module_workspace_bytes (NULL when 0): manifest->workspace_bytes,
 * plus on CUDA what the cuDNN steps chose at load. */
int tcc_module_run(tcc_module *mod, const void *const *inputs,
                   void *const *outputs, void *workspace, tcc_error *err);

/* The manifest the module was loaded with (owned by the module). */
const Tcc__V1__Manifest *tcc_module_manifest(const tcc_module *mod);

/* The CUDA part of a module (tcc_module_load of a CUDA artifact), or NULL
 * for a CPU module. Owned by mod. Streams, CUDA graphs and stats go through
 * the runtime's loader (runtime/tcc_runtime.h). (module.c) */
typedef struct tcc_rt_cuda_kernel tcc_rt_cuda_kernel;
tcc_rt_cuda_kernel *tcc_module_cuda(tcc_module *mod);

void tcc_module_unload(tcc_module *mod);

/* Compile + fetch + verify + load. *resp (optional) receives the compile
 * response. */
int tcc_client_get_module(tcc_client *c, const Tcc__V1__CompileRequest *req,
                          tcc_module **out, Tcc__V1__CompileResponse **resp,
                          tcc_error *err);

/* ------------------------------------------------------------------
 * Additions beyond the first contract (client.c): the admin calls tcctl
 * makes, fetch by guard hash, and process-level teardown.
 * ------------------------------------------------------------------ */

/* Checks a tccd address: HOST:PORT (HOST a host name or dotted-quad
 * IPv4 address), [IPV6]:PORT, dns:///HOST:PORT or unix:PATH, with PORT
 * 1-65535 (addr.c). Returns 0 or TCC_E_INVALID_ARGUMENT with a message
 * that names the address and what is wrong with it. tcc_client_connect
 * runs it; tcctl and the Python package run it on their options first. */
int tcc_client_addr_check(const char *addr, tcc_error *err);

/* The address the client was connected to (owned by the client). */
const char *tcc_client_addr(const tcc_client *c);

/* How many trusted public keys the client verifies signatures with
 * (0: signatures are not checked). */
size_t tcc_client_trusted_keys(const tcc_client *c);

/* Unary call with protobuf-c messages: packs req, calls method, unpacks
 * the answer as resp_desc into *resp (free with
 * protobuf_c_message_free_unpacked(*resp, NULL)). A malformed answer is
 * TCC_E_INTERNAL. deadline_ms 0 = the client's default. */
int tcc_client_call_message(tcc_client *c, const char *method,
                            const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc,
                            ProtobufCMessage **resp, int deadline_ms,
                            tcc_error *err);

/* Fetches the artifact of the cache entry with this guard hash (hex)
 * (FetchRequest.guard_hash), verifying it against the digest the daemon
 * announces in the first chunk, which is copied to sha256_hex (optional).
 * With trusted keys, its signature is verified as tcc_client_compile
 * verifies one (the first chunk's Artifact.signature and key_id, over
 * the guard hash, the digest and the entry's manifest, which a Show call
 * fetches): TCC_E_PERMISSION_DENIED, and nothing returned or cached, for
 * an artifact unsigned, signed by an untrusted key, altered, or sent
 * without its signature. Stores it in the local artifact cache when one
 * is set. *data is malloc'd (caller frees). */
int tcc_client_fetch_entry(tcc_client *c, const char *guard_hash_hex,
                           uint8_t **data, size_t *len,
                           char sha256_hex[TCC_SHA256_HEX], tcc_error *err);

/* grpc.health.v1.Health/Check of service ("" = the whole daemon);
 * *serving_status receives the HealthCheckResponse.ServingStatus value
 * (1 = SERVING). Returns 0 when the call succeeded, whatever the status. */
int tcc_client_health(tcc_client *c, const char *service,
                      int *serving_status, tcc_error *err);

/* Cache admin calls. Each *out is a protobuf-c message: free it with its
 * *__free_unpacked(*out, NULL). */
int tcc_client_stats(tcc_client *c, Tcc__V1__StatsResponse **out,
                     tcc_error *err);
/* The daemon's compile jobs in flight (tcc.v1.Compiler/Jobs), oldest
 * first, with their state and autotuning progress. Returns 0 or a TCC_E_*
 * code. */
int tcc_client_jobs(tcc_client *c, Tcc__V1__JobsResponse **out, tcc_error *err);
/* limit 0 = the daemon's default (100); order_by NULL or "" = last_used. */
int tcc_client_list(tcc_client *c, int limit, const char *order_by,
                    Tcc__V1__ListResponse **out, tcc_error *err);
int tcc_client_show(tcc_client *c, const char *guard_hash_hex,
                    Tcc__V1__ShowResponse **out, tcc_error *err);
/* Why a key missed (tcc.v1.Cache/Explain): by guard hash (a stored entry,
 * a recorded failure or a recent miss), or for request (its key is
 * computed; nothing is compiled) when guard_hash_hex is NULL; at most
 * max_nearest candidates (0: 3). The answer
 * lists the nearest keys stored for the same graph and the components
 * that differ. Returns 0 or a TCC_E_* code (NOT_FOUND: no such hash). */
int tcc_client_explain(tcc_client *c, const char *guard_hash_hex, const Tcc__V1__CompileRequest *request,
                       int max_nearest, Tcc__V1__ExplainResponse **out, tcc_error *err);
/* *evicted (optional) = whether an entry was removed. */
int tcc_client_evict(tcc_client *c, const char *guard_hash_hex,
                     int *evicted, tcc_error *err);
/* max_bytes 0 = the daemon's --cache-max-bytes. */
int tcc_client_gc(tcc_client *c, int64_t max_bytes, Tcc__V1__GcResponse **out,
                  tcc_error *err);
/* Recorded compile failures (ListRequest.failures), newest first, in
 * (*out)->failures; (*out)->total = how many are recorded. limit 0 = the
 * daemon's default (100). */
int tcc_client_list_failures(tcc_client *c, int limit,
                             Tcc__V1__ListResponse **out, tcc_error *err);
/* Restarts the daemon's counters from 0 (admin); *out = the statistics
 * as they were just before. */
int tcc_client_zero_stats(tcc_client *c, Tcc__V1__StatsResponse **out,
                          tcc_error *err);
/* Empties the daemon's local cache: entries, artifacts, recorded
 * failures, and tuning records when tuning is set (admin). A Redis tier
 * is left as it is ((*out)->remote_enabled says there is one). */
int tcc_client_clear(tcc_client *c, int tuning, Tcc__V1__ClearResponse **out,
                     tcc_error *err);
/* Starts a warm run (admin): the daemon compiles the graphs it holds
 * for req->target (filtered by from_target, since_seconds, limit), one at
 * a time while a worker is idle. With req->warm_id set, reports on that
 * run instead. *out: the run's progress (done once it has finished). */
int tcc_client_warm(tcc_client *c, const Tcc__V1__WarmRequest *req,
                    Tcc__V1__WarmResponse **out, tcc_error *err);
/* The ops and dtypes the daemon compiles for device (a
 * Tcc__V1__DeviceType; 0 = CPU), and its compiler identity. */
int tcc_client_ops(tcc_client *c, int device, Tcc__V1__OpsResponse **out,
                   tcc_error *err);

/* gRPC is initialised once per process, on the first connect, and stays
 * up (its threads are reused by later clients). A program that wants a
 * clean exit (valgrind) may call this after closing every client; a later
 * connect initialises gRPC again. Never call it while a client is open. */
void tcc_client_library_shutdown(void);

/* ------------------------------------------------------------------
 * Dynamic shapes (module.c): artifacts of ABI 2 (Manifest.abi_version 2,
 * entry tcc_entry2) serve every size their guards admit. The caller
 * binds the symbols from the actual inputs, allocates outputs and
 * workspace for them, and runs with the bound values. Layout arrays are
 * flattened over the inputs in order (input i has the rank of
 * manifest->inputs[i]). Every function also accepts ABI 1 modules (no
 * symbols: fixed layouts).
 * ------------------------------------------------------------------ */

#define TCC_MODULE_MAX_SYMS 16

/* The number of symbols (0 for an ABI 1 module). */
int tcc_module_symbols(const tcc_module *mod);

/* Binds the symbols (syms[0..tcc_module_symbols)) from the inputs' sizes
 * and checks the guards against sizes, strides (NULL: not checked) and
 * storage offsets (one per input; NULL: not checked). Returns 0, or
 * TCC_E_FAILED_PRECONDITION "guard failed: ..." naming the input and dim
 * (compile again for these sizes), or TCC_E_INVALID_ARGUMENT. */
int tcc_module_bind(const tcc_module *mod, const int64_t *sizes, const int64_t *strides,
                    const int64_t *offsets, int64_t *syms, tcc_error *err);

/* Output `output`'s sizes and strides (rank of manifest->outputs[output])
 * at the bound symbols. Returns 0 or TCC_E_INVALID_ARGUMENT. */
int tcc_module_output_layout(const tcc_module *mod, const int64_t *syms, int output,
                             int64_t *sizes, int64_t *strides, tcc_error *err);

/* Workspace bytes a run needs, at the bound symbols (-1 on overflow; a
 * CUDA module's includes its cuDNN steps' workspace). */
int64_t tcc_module_workspace_bytes(const tcc_module *mod, const int64_t *syms);

/* tcc_module_run with the bound symbols (ABI 2); ABI 1 modules ignore
 * syms. */
int tcc_module_run_sym(tcc_module *mod, const void *const *inputs, void *const *outputs,
                       void *workspace, const int64_t *syms, tcc_error *err);

/* Checks an ABI 2 manifest's symbolic parts (tcc_module_load does).
 * Returns 0 or TCC_E_FAILED_PRECONDITION. */
int tcc_module_check_sym_manifest(const Tcc__V1__Manifest *m, tcc_error *err);

/* ------------------------------------------------------------------
 * Byte-level API for FFI callers (ctypes) (ffi.c): no protobuf-c structs
 * and no struct layouts to mirror. Buffers returned through uint8_t **
 * are malloc'd: free them with tcc_free.
 * ------------------------------------------------------------------ */

/* tcc_client_connect with the options spelled out (0 / NULL = default). */
int tcc_client_open(const char *addr, int deadline_ms, int connect_timeout_ms,
                    const char *artifact_dir, tcc_client **out,
                    tcc_error *err);

/* Compile with an encoded tcc.v1.CompileRequest; *resp receives the
 * encoded tcc.v1.CompileResponse. */
int tcc_client_compile_bytes(tcc_client *c, const uint8_t *req, size_t req_len,
                             uint8_t **resp, size_t *resp_len, tcc_error *err);

/* tcc_client_get_module with encoded request/response (resp optional). */
int tcc_client_get_module_bytes(tcc_client *c, const uint8_t *req,
                                size_t req_len, tcc_module **out,
                                uint8_t **resp, size_t *resp_len,
                                tcc_error *err);

/* tcc_module_load with an encoded tcc.v1.Manifest. */
int tcc_module_load_bytes(const uint8_t *data, size_t len,
                          const char *sha256_hex, const uint8_t *manifest,
                          size_t manifest_len, tcc_module **out,
                          tcc_error *err);

/* The module's manifest, encoded (malloc'd into *out). */
int tcc_module_manifest_bytes(const tcc_module *mod, uint8_t **out,
                              size_t *len, tcc_error *err);

/* Plans (docs/design.md "Plans"): what a process needs to start a graph
 * without AOTAutograd's trace, kept and signed by the daemon.
 * tcc_client_get_plan_bytes: GetPlan for key; *plan receives the encoded
 * tcc.v1.Plan and *cache_status (may be NULL) its Tcc__V1__CacheStatus
 * (HIT or REMOTE_HIT). With trusted keys (TCCD_TRUSTED_KEYS), the plan's
 * signature is verified first (tcc_sign.h's plan layout): an unsigned
 * plan, an untrusted key or a bad signature is TCC_E_PERMISSION_DENIED
 * and nothing is returned. No plan: TCC_E_NOT_FOUND.
 * tcc_client_put_plan_bytes: PutPlan with an encoded tcc.v1.PutPlanRequest;
 * *stored (may be NULL) is 1 when the daemon kept it, 0 when it kept one
 * for that key already (the first writer wins). A kernel the daemon has
 * not compiled is TCC_E_FAILED_PRECONDITION, a malformed plan
 * TCC_E_INVALID_ARGUMENT. */
int tcc_client_get_plan_bytes(tcc_client *c, const char *key, uint8_t **plan,
                              size_t *plan_len, int *cache_status,
                              tcc_error *err);
int tcc_client_put_plan_bytes(tcc_client *c, const uint8_t *req, size_t len,
                              int *stored, tcc_error *err);

/* Frees a buffer this library returned. */
void tcc_free(void *p);

/* A zeroed tcc_error on the heap, its parts, and its release, so an FFI
 * caller needs no struct layout. */
tcc_error *tcc_error_new(void);
int tcc_error_code(const tcc_error *err);
const char *tcc_error_message(const tcc_error *err);
/* The daemon's request id of the call that failed (its x-request-id: the
 * key to the daemon's log lines about it), or "" when the error did not
 * come from a daemon's answer. C callers may read err->request_id. */
const char *tcc_error_request_id(const tcc_error *err);
void tcc_error_free(tcc_error *err);

/* The library's version (TCC_VERSION). */
const char *tcc_client_version(void);

#endif
