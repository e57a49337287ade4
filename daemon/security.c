/*
 * security.c — who may run tccd, what it signs with, whom it answers.
 *
 *   - Root: tccd compiles and links what clients send with the system C
 *     compiler; as root a compiler or codegen bug becomes root for every
 *     user who can reach the port (loopback included: any local user).
 *     So it refuses uid 0 unless --allow-root (env TCCD_ALLOW_ROOT=1).
 *   - Signing: every artifact the daemon stores is signed (tcc_sign.h):
 *     with --signing-key FILE, or else with the daemon's own key
 *     CACHE_DIR/signing.key, generated on first start (like an SSH host
 *     key; clients trust CACHE_DIR/signing.key.pub). Serving unsigned
 *     artifacts must be asked for with --no-signing. The trusted set
 *     (own public key + --trusted-keys) decides which signed entries the
 *     daemon serves from its cache and accepts from the remote tier.
 *   - Tokens: --auth-tokens FILE holds lines "client TOKEN" / "admin
 *     TOKEN" ('#' comments, blank lines). Calls carry
 *     `authorization: Bearer TOKEN`; the role each method needs is in
 *     daemon.h's TCCD_METHODS (Health/Check stays open, for probes). Only
 *     SHA-256(token) is kept; a presented token is hashed and compared
 *     with every stored hash by sodium_memcmp (constant time, no early
 *     exit), so timing says nothing about how much of a token matched.
 *     Tokens are never logged. The file must not be readable by group or
 *     others, like a secret key.
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "daemon.h"

#define TOKEN_MIN_LEN 16
#define TOKEN_MAX_LEN 512

typedef struct tccd_token {
  uint8_t hash[TCC_SHA256_BYTES];  /* SHA-256 of the token */
  tccd_role role;
} tccd_token;

struct tccd_auth {
  tccd_token *tokens;
  size_t n;
};

static void auth_free(struct tccd_auth *a) {
  if (!a) return;
  if (a->tokens) sodium_memzero(a->tokens, a->n * sizeof *a->tokens);
  free(a->tokens);
  free(a);
}

/* Is every byte of a token a visible ASCII character (what gRPC metadata
 * values may carry)? */
static int token_chars_ok(const char *t) {
  for (; *t; t++)
    if (*t < 0x21 || *t > 0x7e) return 0;
  return 1;
}

/* Parses the tokens file. Returns 0 or a TCC_E_* code naming the line. */
static int auth_load(const char *path, struct tccd_auth **out, tcc_error *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tcc_error_set(err, errno == ENOENT ? TCC_E_NOT_FOUND : TCC_E_PERMISSION_DENIED,
                         "cannot read %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s is not a regular file", path);
  }
  if (st.st_mode & 077) {
    close(fd);
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "%s may be read by others (mode %03o); chmod 600 it", path,
                         (unsigned)(st.st_mode & 0777));
  }
  FILE *f = fdopen(fd, "r");
  struct tccd_auth *a = calloc(1, sizeof *a);
  if (!f || !a) {
    if (f) fclose(f);
    else close(fd);
    free(a);
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  }
  char line[TOKEN_MAX_LEN + 64];
  int lineno = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    if (!strchr(line, '\n') && !feof(f)) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s:%d: line too long", path, lineno);
      break;
    }
    char *save = NULL, *role = strtok_r(line, " \t\r\n", &save);
    if (!role || role[0] == '#') continue;
    char *token = strtok_r(NULL, " \t\r\n", &save), *extra = strtok_r(NULL, " \t\r\n", &save);
    tccd_role r;
    if (strcmp(role, "client") == 0) r = TCCD_ROLE_CLIENT;
    else if (strcmp(role, "admin") == 0) r = TCCD_ROLE_ADMIN;
    else {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s:%d: role must be 'client' or 'admin', got '%.20s'",
                         path, lineno, role);
      break;
    }
    if (!token || extra) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s:%d: expected 'ROLE TOKEN'", path, lineno);
      break;
    }
    size_t len = strlen(token);
    if (len < TOKEN_MIN_LEN || len > TOKEN_MAX_LEN || !token_chars_ok(token)) {
      rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "%s:%d: a token must be %d to %d visible ASCII characters (e.g. `openssl rand "
                         "-hex 32`)",
                         path, lineno, TOKEN_MIN_LEN, TOKEN_MAX_LEN);
      break;
    }
    uint8_t h[TCC_SHA256_BYTES];
    tcc_sha256(token, len, h);
    sodium_memzero(line, sizeof line);
    for (size_t i = 0; i < a->n && !rc; i++)
      if (sodium_memcmp(a->tokens[i].hash, h, sizeof h) == 0)
        rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s:%d: the same token appears twice", path, lineno);
    if (rc) break;
    tccd_token *grown = realloc(a->tokens, (a->n + 1) * sizeof *grown);
    if (!grown) {
      rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    a->tokens = grown;
    memcpy(a->tokens[a->n].hash, h, sizeof h);
    a->tokens[a->n++].role = r;
  }
  sodium_memzero(line, sizeof line);
  fclose(f);
  if (!rc && a->n == 0) rc = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "%s holds no tokens", path);
  if (rc) {
    auth_free(a);
    return rc;
  }
  *out = a;
  return 0;
}

int tccd_auth_check(const tccd_state *st, const grpc_metadata_array *md, tccd_role need, tcc_error *err) {
  const struct tccd_auth *a = st->auth;
  if (!a || need == TCCD_ROLE_OPEN) return 0;
  const grpc_slice *value = NULL;
  for (size_t i = 0; i < md->count; i++)
    if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") == 0) value = &md->metadata[i].value;
  if (!value)
    return tcc_error_set(err, TCC_E_UNAUTHENTICATED,
                         "this tccd requires a bearer token (metadata 'authorization: Bearer TOKEN'; "
                         "tcctl --token-file, TCCD_TOKEN)");
  return tccd_auth_check_value(st, (const char *)GRPC_SLICE_START_PTR(*value), GRPC_SLICE_LENGTH(*value), need,
                               err);
}

int tccd_auth_check_value(const tccd_state *st, const char *v, size_t len, tccd_role need, tcc_error *err) {
  const struct tccd_auth *a = st->auth;
  if (!a || need == TCCD_ROLE_OPEN) return 0;
  if (len <= 7 || strncasecmp(v, "Bearer ", 7) != 0)
    return tcc_error_set(err, TCC_E_UNAUTHENTICATED, "the authorization is not 'Bearer TOKEN'");
  uint8_t h[TCC_SHA256_BYTES];
  tcc_sha256(v + 7, len - 7, h);
  tccd_role role = TCCD_ROLE_OPEN;
  for (size_t i = 0; i < a->n; i++) { /* every stored hash, no early exit */
    int match = sodium_memcmp(a->tokens[i].hash, h, sizeof h) == 0;
    tccd_role r = a->tokens[i].role;
    role = match && r > role ? r : role;
  }
  sodium_memzero(h, sizeof h);
  if (role == TCCD_ROLE_OPEN) return tcc_error_set(err, TCC_E_UNAUTHENTICATED, "unknown bearer token");
  if (role < need)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED, "this call needs an admin token; a client token was given");
  return 0;
}

/* ------------------------------------------------------------ TLS files */

const char *tccd_ssl_error_text(char *buf, size_t cap) {
  unsigned long e = ERR_get_error();
  buf[0] = '\0';
  if (e) ERR_error_string_n(e, buf, cap);
  ERR_clear_error();
  return buf;
}

/* Reads the first PEM object of a TLS file: a certificate (want_key 0) or
 * a private key (1), which must not be readable by others. Returns it
 * (X509 * or EVP_PKEY *) or NULL with a message naming flag and file. */
static void *tls_read(const char *flag, const char *path, int want_key, tcc_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s: %s", flag, path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s is not a regular file", flag, path);
    return NULL;
  }
  if (want_key && (st.st_mode & 077)) {
    close(fd);
    tcc_error_set(err, TCC_E_PERMISSION_DENIED, "%s %s may be read by others (mode %03o); chmod 600 it", flag, path,
                  (unsigned)(st.st_mode & 0777));
    return NULL;
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  char why[256];
  ERR_clear_error();
  void *obj = want_key ? (void *)PEM_read_PrivateKey(f, NULL, NULL, NULL) : (void *)PEM_read_X509(f, NULL, NULL, NULL);
  fclose(f);
  if (!obj)
    tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "%s %s: not a PEM %s (%s)", flag, path,
                  want_key ? "private key" : "certificate", tccd_ssl_error_text(why, sizeof why));
  return obj;
}

/* --tls-cert, --tls-key and --tls-client-ca parse, the key is private to
 * its owner, and it is the certificate's key. Returns 0 or a code. */
static int tls_check(const tccd_config *cfg, tcc_error *err) {
  if (!cfg->tls_cert[0]) return 0;
  X509 *cert = tls_read("--tls-cert", cfg->tls_cert, 0, err);
  EVP_PKEY *key = cert ? tls_read("--tls-key", cfg->tls_key, 1, err) : NULL;
  X509 *ca = key && cfg->tls_client_ca[0] ? tls_read("--tls-client-ca", cfg->tls_client_ca, 0, err) : NULL;
  int rc = err->code;
  if (cert && key && (ca || !cfg->tls_client_ca[0])) {
    rc = 0;
    char why[256];
    ERR_clear_error();
    if (X509_check_private_key(cert, key) != 1)
      rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "--tls-key %s is not the key of --tls-cert %s (%s)",
                         cfg->tls_key, cfg->tls_cert, tccd_ssl_error_text(why, sizeof why));
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  X509_free(ca);
  return rc;
}

int tccd_security_init(tccd_state *st, tcc_error *err) {
  const tccd_config *cfg = st->cfg;
  if (geteuid() == 0 && !cfg->allow_root)
    return tcc_error_set(err, TCC_E_PERMISSION_DENIED,
                         "refusing to run as root: tccd compiles and links what clients send; run it "
                         "as an unprivileged user, or pass --allow-root (env TCCD_ALLOW_ROOT=1) "
                         "in a container or CI where root is all there is");
  if (cfg->signing_key[0]) {
    st->signing_key = malloc(sizeof *st->signing_key);
    if (!st->signing_key) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    int rc = tcc_sign_key_load(cfg->signing_key, st->signing_key, err);
    if (rc) {
      tcc_error_prefix(err, "--signing-key");
      return rc;
    }
  }
  int rc = tcc_trusted_keys_load(cfg->trusted_keys, &st->trusted, err);
  if (rc) {
    tcc_error_prefix(err, "--trusted-keys");
    return rc;
  }
  if (st->signing_key && tcc_trusted_keys_add(&st->trusted, st->signing_key->pk) != 0)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if (sodium_init() < 0) return tcc_error_set(err, TCC_E_INTERNAL, "libsodium failed to initialise");
  if (cfg->auth_tokens[0] && (rc = auth_load(cfg->auth_tokens, &st->auth, err))) {
    tcc_error_prefix(err, "--auth-tokens");
    return rc;
  }
  tcc_error_clear(err);
  if ((rc = tls_check(cfg, err))) return rc;
  if (cfg->redis[0] && cfg->no_signing && !cfg->redis_trust_unsigned)
    return tcc_error_set(err, TCC_E_FAILED_PRECONDITION,
                         "--no-signing with --redis would serve whatever is written into Redis, unsigned, to every "
                         "client: sign (the default), or pass --redis-trust-unsigned to say that Redis is trusted");
  return 0;
}

int tccd_security_default_key(tccd_state *st, tcc_error *err) {
  const tccd_config *cfg = st->cfg;
  if (cfg->no_signing || st->signing_key) return 0;
  char path[sizeof cfg->cache_dir + 32];
  snprintf(path, sizeof path, "%s/signing.key", cfg->cache_dir);
  char key_id[TCC_SIGN_KEY_ID_HEX];
  int rc = tcc_sign_keygen(path, key_id, err);
  if (rc == 0)
    log_info("generated the signing key %s; clients verify with TCCD_TRUSTED_KEYS=%s.pub (key id %s)",
             path, path, key_id);
  else if (rc != TCC_E_ALREADY_EXISTS)
    return rc;
  st->signing_key = malloc(sizeof *st->signing_key);
  if (!st->signing_key) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if ((rc = tcc_sign_key_load(path, st->signing_key, err)) != 0) {
    free(st->signing_key);
    st->signing_key = NULL;
    tcc_error_prefix(err, "signing key %s", path);
    return rc;
  }
  if (tcc_trusted_keys_add(&st->trusted, st->signing_key->pk) != 0)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  return 0;
}

void tccd_security_free(tccd_state *st) {
  if (st->signing_key) {
    tcc_sign_key_wipe(st->signing_key);
    free(st->signing_key);
    st->signing_key = NULL;
  }
  tcc_trusted_keys_free(&st->trusted);
  auth_free(st->auth);
  st->auth = NULL;
}
