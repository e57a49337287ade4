/* tcc_digest.c — SHA-256 via libsodium, hex helpers (see tcc_digest.h). */
#include "tcc_digest.h"

#include <sodium.h>
#include <string.h>

_Static_assert(sizeof(tcc_sha256_ctx) >= sizeof(crypto_hash_sha256_state),
               "tcc_sha256_ctx too small for libsodium's state");

void tcc_sha256(const void *data, size_t len, uint8_t out[TCC_SHA256_BYTES]) {
  crypto_hash_sha256(out, data, len);
}

void tcc_sha256_init(tcc_sha256_ctx *ctx) {
  crypto_hash_sha256_init((crypto_hash_sha256_state *)ctx->state);
}

void tcc_sha256_update(tcc_sha256_ctx *ctx, const void *data, size_t len) {
  crypto_hash_sha256_update((crypto_hash_sha256_state *)ctx->state, data, len);
}

void tcc_sha256_final(tcc_sha256_ctx *ctx, uint8_t out[TCC_SHA256_BYTES]) {
  crypto_hash_sha256_final((crypto_hash_sha256_state *)ctx->state, out);
}

void tcc_hex_encode(const uint8_t *bytes, size_t len, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * len] = '\0';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int tcc_hex_decode(const char *hex, uint8_t *bytes, size_t len) {
  if (!hex || strlen(hex) != 2 * len) return -1;
  for (size_t i = 0; i < len; i++) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int tcc_memcmp_const(const void *a, const void *b, size_t len) {
  return sodium_memcmp(a, b, len);
}
