/*
 * security.c — who may run tccd, what it signs with, whom it answers.
 *
 *   - Root: tccd compiles and links what clients send with the system C
 *     compiler; as root a compiler or codegen bug becomes root for every
 *     user who can reach the port (loopback included: any local user).
 *     So it refuses uid 0 unless --allow-root (env TCCD_ALLOW_ROOT=1).
 *   - Signing: --signing-key FILE (tcc_sign.h) signs every artifact the
 *     daemon stores; --no-signing must be said explicitly. The trusted set
 *     (own public key + --trusted-keys) decides which signed entries the
 *     daemon serves from its cache and accepts from the remote tier.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

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
  return 0;
}

void tccd_security_free(tccd_state *st) {
  if (st->signing_key) {
    tcc_sign_key_wipe(st->signing_key);
    free(st->signing_key);
    st->signing_key = NULL;
  }
  tcc_trusted_keys_free(&st->trusted);
}
