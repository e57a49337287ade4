/*
 * tcc_sign.h — Ed25519 signatures over artifacts (libsodium): the daemon
 * signs what it serves, clients and other daemons verify before they
 * trust it.
 *
 * What is signed (version 1), 113 bytes:
 *
 *   "tccd-artifact-v1\0"  (17 bytes, domain separation)
 *   guard hash            (32 bytes)
 *   SHA-256(artifact)     (32 bytes)
 *   SHA-256(manifest)     (32 bytes, of the encoded tcc.v1.Manifest exactly
 *                          as the daemon stores and sends it)
 *
 * so a signature binds the kernel bytes to the graph they were compiled
 * for and to the launch plan the client follows.
 *
 * Plans (tcc.v1.Plan, kept by the daemon: PutPlan/GetPlan) are signed in
 * the same layout, each slot filled so that a plan signature can never
 * pass for an artifact's, nor one key's plan for another's:
 *
 *   guard hash            SHA-256("tccd-plan-v1\0" || key)  (the 13 bytes of
 *                          the domain with its NUL, then the key's bytes)
 *   SHA-256(artifact)     SHA-256(the encoded Plan, exactly as stored)
 *   SHA-256(manifest)     SHA-256("tccd-plan-v1")  (its 12 bytes, no NUL)
 *
 * tcc_plan_sign_digests computes the first two; tcc_plan_sign and
 * tcc_plan_verify are what the daemon and the client library call.
 *
 * Key files (text, one line each; `tcctl keygen OUT` writes both):
 *
 *   OUT      (mode 0600)  tccd-ed25519-secret <base64 of the 32-byte seed>
 *   OUT.pub  (mode 0644)  tccd-ed25519-public <base64 of the 32-byte key> <key id>
 *
 * The key id is the first 8 bytes of SHA-256(public key) in hex (16
 * digits); it travels with every signature so a verifier holding several
 * trusted keys (a rotation) knows which one to use. Anything after the
 * base64 field of a .pub line is a comment. A secret key file that group
 * or others may read is refused.
 *
 * Functions return 0 or a negative TCC_E_* code and fill err.
 */
#ifndef TCC_SIGN_H
#define TCC_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include "tcc_digest.h"
#include "tcc_status.h"

#define TCC_SIGN_PUBLIC_BYTES 32
#define TCC_SIGN_SECRET_BYTES 64
#define TCC_SIGNATURE_BYTES 64
#define TCC_SIGN_KEY_ID_HEX 17 /* 16 hex digits + NUL */
#define TCC_SIGN_DOMAIN "tccd-artifact-v1" /* + its NUL: 17 bytes */
#define TCC_PLAN_SIGN_DOMAIN "tccd-plan-v1"  /* plans: see above */
#define TCC_SIGN_SECRET_TAG "tccd-ed25519-secret"
#define TCC_SIGN_PUBLIC_TAG "tccd-ed25519-public"

/* A signing (secret) key with its public half. Wipe with tcc_sign_key_wipe. */
typedef struct tcc_sign_key {
  uint8_t sk[TCC_SIGN_SECRET_BYTES];
  uint8_t pk[TCC_SIGN_PUBLIC_BYTES];
  char key_id[TCC_SIGN_KEY_ID_HEX];
} tcc_sign_key;

/* One public key a verifier trusts. */
typedef struct tcc_trusted_key {
  uint8_t pk[TCC_SIGN_PUBLIC_BYTES];
  char key_id[TCC_SIGN_KEY_ID_HEX];
} tcc_trusted_key;

/* A set of trusted keys (n == 0: none configured). */
typedef struct tcc_trusted_keys {
  tcc_trusted_key *keys;
  size_t n;
} tcc_trusted_keys;

/* Generates a key pair and writes path (mode 0600, never overwriting an
 * existing file) and path.pub. key_id (optional) receives the id.
 * Returns 0, TCC_E_ALREADY_EXISTS, or TCC_E_FAILED_PRECONDITION naming
 * the file that could not be written. */
int tcc_sign_keygen(const char *path, char key_id[TCC_SIGN_KEY_ID_HEX], tcc_error *err);

/* Reads a secret key file. Returns 0, TCC_E_NOT_FOUND, TCC_E_PERMISSION_DENIED
 * (readable by group/others), or TCC_E_INVALID_ARGUMENT (not a key file). */
int tcc_sign_key_load(const char *path, tcc_sign_key *out, tcc_error *err);

/* Zeroes a secret key in memory. NULL is fine. */
void tcc_sign_key_wipe(tcc_sign_key *k);

/* Reads one .pub file. Returns 0, TCC_E_NOT_FOUND or TCC_E_INVALID_ARGUMENT. */
int tcc_trusted_key_load(const char *path, tcc_trusted_key *out, tcc_error *err);

/* Reads a comma-separated list of .pub files into *out (empty entries are
 * skipped; NULL or "" gives an empty set). Returns 0 or the first file's
 * error (prefixed with its path); *out is empty on failure. */
int tcc_trusted_keys_load(const char *paths, tcc_trusted_keys *out, tcc_error *err);

/* Adds a public key (no-op when already present). Returns 0 or
 * TCC_E_RESOURCE_EXHAUSTED. */
int tcc_trusted_keys_add(tcc_trusted_keys *keys, const uint8_t pk[TCC_SIGN_PUBLIC_BYTES]);

void tcc_trusted_keys_free(tcc_trusted_keys *keys);

/* The key id of a public key (16 hex digits). */
void tcc_sign_key_id(const uint8_t pk[TCC_SIGN_PUBLIC_BYTES], char out[TCC_SIGN_KEY_ID_HEX]);

/* Signs (guard hash, artifact digest, manifest) as described above. */
void tcc_artifact_sign(const tcc_sign_key *k, const uint8_t guard[TCC_SHA256_BYTES],
                       const uint8_t sha256[TCC_SHA256_BYTES], const uint8_t *manifest,
                       size_t manifest_len, uint8_t sig[TCC_SIGNATURE_BYTES]);

/* Verifies a signature against the trusted key named by key_id. Returns 0;
 * TCC_E_PERMISSION_DENIED with "artifact is unsigned" (sig_len 0) or
 * "artifact signature invalid: <why>" (unknown key id, wrong length, or a
 * signature that does not verify: the artifact, manifest or guard hash was
 * altered, or it was signed by another key). */
int tcc_artifact_verify(const tcc_trusted_keys *keys, const char *key_id,
                        const uint8_t guard[TCC_SHA256_BYTES],
                        const uint8_t sha256[TCC_SHA256_BYTES], const uint8_t *manifest,
                        size_t manifest_len, const uint8_t *sig, size_t sig_len,
                        tcc_error *err);

/* The guard hash and artifact digest of a plan's signature (see above):
 * key is the Plan's key (NUL-terminated), plan its encoded bytes. */
void tcc_plan_sign_digests(const char *key, const uint8_t *plan, size_t len, uint8_t guard[TCC_SHA256_BYTES],
                           uint8_t artifact[TCC_SHA256_BYTES]);

/* Signs a plan (the layout above). */
void tcc_plan_sign(const tcc_sign_key *k, const char *key, const uint8_t *plan, size_t len,
                   uint8_t sig[TCC_SIGNATURE_BYTES]);

/* Verifies a plan's signature as tcc_artifact_verify does an artifact's:
 * 0, or TCC_E_PERMISSION_DENIED with "plan is unsigned" or "plan
 * signature invalid: <why>" (an untrusted key, a wrong length, or the
 * plan or its key altered). */
int tcc_plan_verify(const tcc_trusted_keys *keys, const char *key_id, const char *key, const uint8_t *plan,
                    size_t len, const uint8_t *sig, size_t sig_len, tcc_error *err);

#endif
