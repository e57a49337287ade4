/*
 * tcc_sign.c — Ed25519 artifact signatures and key files (see tcc_sign.h
 * for the signed bytes and the file formats). libsodium does the
 * cryptography (crypto_sign_*), the base64 and the wiping; this file only
 * frames messages and parses files.
 */
#include "tcc_sign.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(crypto_sign_PUBLICKEYBYTES == TCC_SIGN_PUBLIC_BYTES, "Ed25519 public key size");
_Static_assert(crypto_sign_SECRETKEYBYTES == TCC_SIGN_SECRET_BYTES, "Ed25519 secret key size");
_Static_assert(crypto_sign_BYTES == TCC_SIGNATURE_BYTES, "Ed25519 signature size");

#define KEY_LINE_MAX 512

/* libsodium must be initialised once; it is idempotent and thread-safe. */
static int sign_init(tcc_error *err) {
  if (sodium_init() < 0) return tcc_error_set(err, TCC_E_INTERNAL, "libsodium failed to initialise");
  return 0;
}

void tcc_sign_key_id(const uint8_t pk[TCC_SIGN_PUBLIC_BYTES], char out[TCC_SIGN_KEY_ID_HEX]) {
  uint8_t d[TCC_SHA256_BYTES];
  tcc_sha256(pk, TCC_SIGN_PUBLIC_BYTES, d);
  tcc_hex_encode(d, 8, out);
}

/* The 113 signed bytes of tcc_sign.h. */
static void signed_message(const uint8_t guard[TCC_SHA256_BYTES], const uint8_t sha[TCC_SHA256_BYTES],
                           const uint8_t *manifest, size_t manifest_len, uint8_t *msg, size_t *len) {
  size_t n = 0;
  memcpy(msg, TCC_SIGN_DOMAIN, sizeof TCC_SIGN_DOMAIN); /* with its NUL */
  n += sizeof TCC_SIGN_DOMAIN;
  memcpy(msg + n, guard, TCC_SHA256_BYTES);
  n += TCC_SHA256_BYTES;
  memcpy(msg + n, sha, TCC_SHA256_BYTES);
  n += TCC_SHA256_BYTES;
  tcc_sha256(manifest ? (const void *)manifest : "", manifest_len, msg + n);
  n += TCC_SHA256_BYTES;
  *len = n;
}

#define SIGNED_MAX (sizeof TCC_SIGN_DOMAIN + 3 * TCC_SHA256_BYTES)

void tcc_artifact_sign(const tcc_sign_key *k, const uint8_t guard[TCC_SHA256_BYTES],
                       const uint8_t sha256[TCC_SHA256_BYTES], const uint8_t *manifest,
                       size_t manifest_len, uint8_t sig[TCC_SIGNATURE_BYTES]) {
  uint8_t msg[SIGNED_MAX];
  size_t n;
  signed_message(guard, sha256, manifest, manifest_len, msg, &n);
  crypto_sign_detached(sig, NULL, msg, n, k->sk);
}

int tcc_artifact_verify(const tcc_trusted_keys *keys, const char *key_id,
                        const uint8_t guard[TCC_SHA256_BYTES], const uint8_t sha256[TCC_SHA256_BYTES],
                        const uint8_t *manifest, size_t manifest_len, const uint8_t *sig,
                        size_t sig_len, tcc_error *err) {
  if (sig_len == 0) return tcc_error_set(err, TCC_E_PERMISSION_DENIED, "artifact is unsigned");
  if (sig_len != TCC_SIGNATURE_BYTES || !sig)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "artifact signature invalid: %zu bytes, an Ed25519 signature has %d", sig_len,
                         TCC_SIGNATURE_BYTES);
  const tcc_trusted_key *key = NULL;
  for (size_t i = 0; keys && i < keys->n && !key; i++)
    if (key_id && strcmp(keys->keys[i].key_id, key_id) == 0) key = &keys->keys[i];
  if (!key)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "artifact signature invalid: signed by key '%.40s', which is not trusted "
                         "(%zu trusted key%s)",
                         key_id ? key_id : "", keys ? keys->n : 0, keys && keys->n == 1 ? "" : "s");
  int rc = sign_init(err);
  if (rc) return rc;
  uint8_t msg[SIGNED_MAX];
  size_t n;
  signed_message(guard, sha256, manifest, manifest_len, msg, &n);
  if (crypto_sign_verify_detached(sig, msg, n, key->pk) != 0)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "artifact signature invalid: it does not verify with key %s (the artifact, "
                         "its manifest or its guard hash was altered)",
                         key->key_id);
  return 0;
}

/* ------------------------------------------------------------ plans */

void tcc_plan_sign_digests(const char *key, const uint8_t *plan, size_t len, uint8_t guard[TCC_SHA256_BYTES],
                           uint8_t artifact[TCC_SHA256_BYTES]) {
  tcc_sha256_ctx ctx;
  tcc_sha256_init(&ctx);
  tcc_sha256_update(&ctx, TCC_PLAN_SIGN_DOMAIN, sizeof TCC_PLAN_SIGN_DOMAIN); /* with its NUL */
  tcc_sha256_update(&ctx, key ? key : "", key ? strlen(key) : 0);
  tcc_sha256_final(&ctx, guard);
  tcc_sha256(plan ? plan : (const uint8_t *)"", len, artifact);
}

void tcc_plan_sign(const tcc_sign_key *k, const char *key, const uint8_t *plan, size_t len,
                   uint8_t sig[TCC_SIGNATURE_BYTES]) {
  uint8_t guard[TCC_SHA256_BYTES], digest[TCC_SHA256_BYTES];
  tcc_plan_sign_digests(key, plan, len, guard, digest);
  tcc_artifact_sign(k, guard, digest, (const uint8_t *)TCC_PLAN_SIGN_DOMAIN, strlen(TCC_PLAN_SIGN_DOMAIN), sig);
}

int tcc_plan_verify(const tcc_trusted_keys *keys, const char *key_id, const char *key, const uint8_t *plan,
                    size_t len, const uint8_t *sig, size_t sig_len, tcc_error *err) {
  uint8_t guard[TCC_SHA256_BYTES], digest[TCC_SHA256_BYTES];
  tcc_plan_sign_digests(key, plan, len, guard, digest);
  tcc_error e;
  int rc = tcc_artifact_verify(keys, key_id, guard, digest, (const uint8_t *)TCC_PLAN_SIGN_DOMAIN,
                               strlen(TCC_PLAN_SIGN_DOMAIN), sig, sig_len, &e);
  if (rc == 0) return 0;
  /* tcc_artifact_verify's words, about a plan: "artifact ..." -> "plan ..." */
  const char *rest = strncmp(e.msg, "artifact ", 9) == 0 ? e.msg + 9 : e.msg;
  return tcc_error_set(err, rc, "plan %s", rest);
}

/* ------------------------------------------------------------ key files */

/* Reads the first line of a small file into buf (NUL-terminated, newline
 * stripped). With secret set, refuses files group/others may read.
 * Returns 0 or a TCC_E_* code naming path. */
static int read_key_line(const char *path, int secret, char *buf, size_t cap, tcc_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return tcc_error_set(err, e == ENOENT ? TCC_E_NOT_FOUND : TCC_E_PERMISSION_DENIED,
                         "cannot read key file %s: %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "key file %s is not a regular file", path);
  }
  if (secret && (st.st_mode & 077)) {
    close(fd);
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "secret key file %s may be read by others (mode %03o); chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
  }
  ssize_t n = read(fd, buf, cap - 1);
  close(fd);
  if (n < 0) return tcc_error_set(err, TCC_E_PERMISSION_DENIED, "cannot read key file %s", path);
  buf[n] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  return 0;
}

/* Parses "<tag> <base64 of len bytes>[ comment]" into out. Returns 0 or -1. */
static int parse_key_line(char *line, const char *tag, uint8_t *out, size_t len) {
  size_t tl = strlen(tag);
  if (strncmp(line, tag, tl) != 0 || line[tl] != ' ') return -1;
  char *b64 = line + tl + 1;
  b64[strcspn(b64, " \t")] = '\0';
  size_t got = 0;
  if (sodium_base642bin(out, len, b64, strlen(b64), NULL, &got, NULL,
                        sodium_base64_VARIANT_ORIGINAL) != 0 || got != len)
    return -1;
  return 0;
}

int tcc_sign_key_load(const char *path, tcc_sign_key *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  int rc = sign_init(err);
  if (rc) return rc;
  char line[KEY_LINE_MAX];
  if ((rc = read_key_line(path, 1, line, sizeof line, err))) return rc;
  uint8_t seed[crypto_sign_SEEDBYTES];
  if (parse_key_line(line, TCC_SIGN_SECRET_TAG, seed, sizeof seed) != 0) {
    sodium_memzero(line, sizeof line);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "%s is not a tccd secret key (expected one line '" TCC_SIGN_SECRET_TAG
                         " <base64>'; make one with `tcctl keygen FILE`)",
                         path);
  }
  crypto_sign_seed_keypair(out->pk, out->sk, seed);
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(line, sizeof line);
  tcc_sign_key_id(out->pk, out->key_id);
  return 0;
}

void tcc_sign_key_wipe(tcc_sign_key *k) {
  if (k) sodium_memzero(k, sizeof *k);
}

int tcc_trusted_key_load(const char *path, tcc_trusted_key *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  int rc = sign_init(err);
  if (rc) return rc;
  char line[KEY_LINE_MAX];
  if ((rc = read_key_line(path, 0, line, sizeof line, err))) return rc;
  if (parse_key_line(line, TCC_SIGN_PUBLIC_TAG, out->pk, sizeof out->pk) != 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "%s is not a tccd public key (expected one line '" TCC_SIGN_PUBLIC_TAG
                         " <base64> [comment]', as `tcctl keygen` writes to FILE.pub)",
                         path);
  tcc_sign_key_id(out->pk, out->key_id);
  return 0;
}

int tcc_trusted_keys_add(tcc_trusted_keys *keys, const uint8_t pk[TCC_SIGN_PUBLIC_BYTES]) {
  for (size_t i = 0; i < keys->n; i++)
    if (memcmp(keys->keys[i].pk, pk, TCC_SIGN_PUBLIC_BYTES) == 0) return 0;
  tcc_trusted_key *grown = realloc(keys->keys, (keys->n + 1) * sizeof *grown);
  if (!grown) return TCC_E_RESOURCE_EXHAUSTED;
  keys->keys = grown;
  memcpy(grown[keys->n].pk, pk, TCC_SIGN_PUBLIC_BYTES);
  tcc_sign_key_id(pk, grown[keys->n].key_id);
  keys->n++;
  return 0;
}

void tcc_trusted_keys_free(tcc_trusted_keys *keys) {
  if (!keys) return;
  free(keys->keys);
  keys->keys = NULL;
  keys->n = 0;
}

int tcc_trusted_keys_load(const char *paths, tcc_trusted_keys *out, tcc_error *err) {
  out->keys = NULL;
  out->n = 0;
  if (!paths) return 0;
  const char *p = paths;
  while (*p) {
    size_t n = strcspn(p, ",");
    if (n > 0) {
      char path[4096];
      if (n >= sizeof path) {
        tcc_trusted_keys_free(out);
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "trusted key path too long");
      }
      memcpy(path, p, n);
      path[n] = '\0';
      tcc_trusted_key k;
      int rc = tcc_trusted_key_load(path, &k, err);
      if (!rc && tcc_trusted_keys_add(out, k.pk) != 0)
        rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      if (rc) {
        tcc_trusted_keys_free(out);
        return rc;
      }
    }
    p += n;
    if (*p == ',') p++;
  }
  return 0;
}

/* Writes data to path with mode, failing if it exists. Returns 0 or -errno. */
static int write_new_file(const char *path, const char *data, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  size_t len = strlen(data), off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno ? errno : EIO;
      close(fd);
      unlink(path);
      return -e;
    }
    off += (size_t)w;
  }
  if (fchmod(fd, mode) != 0 || fsync(fd) != 0 || close(fd) != 0) {
    int e = errno;
    unlink(path);
    return -e;
  }
  return 0;
}

int tcc_sign_keygen(const char *path, char key_id[TCC_SIGN_KEY_ID_HEX], tcc_error *err) {
  int rc = sign_init(err);
  if (rc) return rc;
  char pub_path[4096];
  if (!path || !*path || snprintf(pub_path, sizeof pub_path, "%s.pub", path) >= (int)sizeof pub_path)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "keygen: bad output path");
  uint8_t seed[crypto_sign_SEEDBYTES], pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
  randombytes_buf(seed, sizeof seed);
  crypto_sign_seed_keypair(pk, sk, seed);
  char b64[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_ORIGINAL)];
  char line[KEY_LINE_MAX], id[TCC_SIGN_KEY_ID_HEX];
  tcc_sign_key_id(pk, id);

  sodium_bin2base64(b64, sizeof b64, seed, sizeof seed, sodium_base64_VARIANT_ORIGINAL);
  snprintf(line, sizeof line, TCC_SIGN_SECRET_TAG " %s\n", b64);
  int e = write_new_file(path, line, 0600);
  sodium_memzero(line, sizeof line);
  sodium_memzero(b64, sizeof b64);
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(sk, sizeof sk);
  if (e)
    return tcc_error_set(err, e == -EEXIST ? TCC_E_ALREADY_EXISTS : TCC_E_FAILED_PRECONDITION,
                         "cannot write %s: %s", path, strerror(-e));

  sodium_bin2base64(b64, sizeof b64, pk, sizeof pk, sodium_base64_VARIANT_ORIGINAL);
  snprintf(line, sizeof line, TCC_SIGN_PUBLIC_TAG " %s %s\n", b64, id);
  unlink(pub_path); /* a stale .pub of another key must not survive */
  if ((e = write_new_file(pub_path, line, 0644))) {
    unlink(path);
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "cannot write %s: %s", pub_path, strerror(-e));
  }
  if (key_id) memcpy(key_id, id, sizeof id);
  return 0;
}
