/*
 * tcc_digest.h — SHA-256 (libsodium) and lowercase hex, the two ways the
 * project names content: guard hashes and artifact digests.
 */
#ifndef TCC_DIGEST_H
#define TCC_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define TCC_SHA256_BYTES 32
#define TCC_SHA256_HEX 65   /* 64 hex digits + NUL */

/* One-shot SHA-256 of len bytes. Thread-safe. */
void tcc_sha256(const void *data, size_t len, uint8_t out[TCC_SHA256_BYTES]);

/* Incremental form, for hashing a key as it is built. */
typedef struct tcc_sha256_ctx { unsigned char state[128] __attribute__((aligned(16))); } tcc_sha256_ctx;
void tcc_sha256_init(tcc_sha256_ctx *ctx);
void tcc_sha256_update(tcc_sha256_ctx *ctx, const void *data, size_t len);
void tcc_sha256_final(tcc_sha256_ctx *ctx, uint8_t out[TCC_SHA256_BYTES]);

/* Writes 2*len lowercase hex digits and a NUL into out. */
void tcc_hex_encode(const uint8_t *bytes, size_t len, char *out);

/* Parses exactly 2*len hex digits (either case) into bytes.
 * Returns 0, or -1 when hex is not exactly that long or not hex. */
int tcc_hex_decode(const char *hex, uint8_t *bytes, size_t len);

/* 0 when a and b are equal, in time independent of where they differ. */
int tcc_memcmp_const(const void *a, const void *b, size_t len);

#endif
