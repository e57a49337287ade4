/*
 * client_internal.h — what client.c, module.c, ffi.c and tcctl share but
 * the public header does not promise: the wire method names and the
 * digest checks every artifact goes through.
 */
#ifndef TCC_CLIENT_INTERNAL_H
#define TCC_CLIENT_INTERNAL_H

#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_digest.h"
#include "tcc_sign.h"
#include "tcc_status.h"

struct tcc_client;

/* client.c (not exported): decodes an encoded CompileResponse and, when the client has
 * trusted keys, verifies its artifact signature (see client.c). *resp is
 * NULL on failure. Returns 0 or a TCC_E_* code. */
int client_compile_response_decode(const struct tcc_client *c, const uint8_t *bytes, size_t len,
                                       Tcc__V1__CompileResponse **resp, tcc_error *err);

/* Full gRPC method names (service paths from tcc.proto and health.proto). */
#define TCC_METHOD_COMPILE "/tcc.v1.Compiler/Compile"
#define TCC_METHOD_FETCH "/tcc.v1.Compiler/Fetch"
#define TCC_METHOD_STATS "/tcc.v1.Cache/Stats"
#define TCC_METHOD_JOBS "/tcc.v1.Compiler/Jobs"
#define TCC_METHOD_LIST "/tcc.v1.Cache/List"
#define TCC_METHOD_SHOW "/tcc.v1.Cache/Show"
#define TCC_METHOD_EXPLAIN "/tcc.v1.Cache/Explain"
#define TCC_METHOD_EVICT "/tcc.v1.Cache/Evict"
#define TCC_METHOD_GC "/tcc.v1.Cache/Gc"
#define TCC_METHOD_ZERO_STATS "/tcc.v1.Cache/ZeroStats"
#define TCC_METHOD_CLEAR "/tcc.v1.Cache/Clear"
#define TCC_METHOD_WARM "/tcc.v1.Cache/Warm"
#define TCC_METHOD_PUT_PLAN "/tcc.v1.Cache/PutPlan"
#define TCC_METHOD_GET_PLAN "/tcc.v1.Cache/GetPlan"
#define TCC_METHOD_OPS "/tcc.v1.Compiler/Ops"
#define TCC_METHOD_HEALTH_CHECK "/grpc.health.v1.Health/Check"

/* Is s exactly 64 hex digits (either case)? */
static inline int tcc_hex_is_sha256(const char *s) {
  if (!s) return 0;
  size_t n = 0;
  for (; s[n]; n++)
    if (!isxdigit((unsigned char)s[n])) return 0;
  return n == 2 * TCC_SHA256_BYTES;
}

/* Copies a 64-digit hex string in lowercase (out: TCC_SHA256_HEX bytes). */
static inline void tcc_hex_lower_copy(const char *hex, char *out) {
  size_t i = 0;
  for (; hex[i] && i < 2 * TCC_SHA256_BYTES; i++) out[i] = (char)tolower((unsigned char)hex[i]);
  out[i] = '\0';
}

/* Returns 1 when SHA-256(data) is the digest hex names, else 0. */
static inline int tcc_digest_matches_hex(const uint8_t *data, size_t len, const char *hex) {
  uint8_t want[TCC_SHA256_BYTES], got[TCC_SHA256_BYTES];
  if (tcc_hex_decode(hex, want, sizeof want) != 0) return 0;
  tcc_sha256(data, len, got);
  return tcc_memcmp_const(want, got, sizeof got) == 0;
}

/* Returns 0 when SHA-256(data) is expected_hex, else TCC_E_DATA_LOSS with
 * "artifact digest mismatch: expected X got Y" (or INVALID_ARGUMENT when
 * expected_hex is not a digest). */
static inline int tcc_digest_check(const uint8_t *data, size_t len, const char *expected_hex,
                                   tcc_error *err) {
  uint8_t want[TCC_SHA256_BYTES], got[TCC_SHA256_BYTES];
  if (!tcc_hex_is_sha256(expected_hex) || tcc_hex_decode(expected_hex, want, sizeof want) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "artifact digest must be 64 hex digits, got '%.80s'",
                         expected_hex ? expected_hex : "");
  tcc_sha256(data, len, got);
  if (tcc_memcmp_const(want, got, sizeof got) != 0) {
    char want_hex[TCC_SHA256_HEX], got_hex[TCC_SHA256_HEX];
    tcc_hex_encode(want, sizeof want, want_hex);
    tcc_hex_encode(got, sizeof got, got_hex);
    return tcc_error_set(err, TCC_E_DATA_LOSS, "artifact digest mismatch: expected %s got %s", want_hex,
                         got_hex);
  }
  return 0;
}

#endif
