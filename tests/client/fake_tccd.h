/*
 * fake_tccd.h — an in-process stand-in for tccd, for the client tests.
 *
 * A gRPC C-core server on 127.0.0.1:<free port> with one thread that
 * serves calls one at a time, answering every tccd method from a fixed
 * configuration: one cache entry (guard hash -> artifact + manifest).
 * Compile answers MISS the first time and HIT after; Fetch streams the
 * artifact in chunk_bytes pieces (the first chunk carries the metadata,
 * with the entry's signature and key id when fetched by guard hash);
 * the admin calls answer from the entry and a fixed StatsResponse.
 * Toggles make it misbehave (corrupt a streamed byte, never answer Stats).
 * It is not the daemon: it checks nothing the real tccd would check.
 */
#ifndef FAKE_TCCD_H
#define FAKE_TCCD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tcc/v1/tcc.pb-c.h"
#include "tcc_sign.h"

typedef struct fake_tccd_config {
  const uint8_t *artifact;            /* copied */
  size_t artifact_len;
  const Tcc__V1__Manifest *manifest;  /* packed and copied */
  const char *guard_hash;             /* 64 hex digits */
  size_t chunk_bytes;                 /* 0 = 1000 */
  const tcc_sign_key *signing_key;    /* sign Compile answers as tccd does; NULL = unsigned */
} fake_tccd_config;

typedef struct fake_tccd {
  char addr[64];
  /* toggles (set by tests at any time) */
  atomic_int corrupt_fetch;           /* flip one byte of the streamed data */
  atomic_int stall_stats;             /* Stats waits for the client to give up */
  atomic_int cancel_stats;            /* Stats is cancelled by the server */
  atomic_int tamper_signature;        /* flip a bit of Compile's signature */
  atomic_int tamper_manifest;         /* Compile sends another target than it signed */
  atomic_int fetch_unsigned;          /* Fetch by guard hash sends no signature */
  atomic_int tamper_fetch_signature;  /* flip a bit of Fetch's signature */
  /* what it saw */
  atomic_int compile_calls;
  atomic_int fetch_calls;
  atomic_int stalled;                 /* Stats calls that stall_stats holds (so far) */
  atomic_int entry_evicted;
  atomic_llong last_gc_max_bytes;
  atomic_int last_list_limit;
  struct fake_tccd_private *p;
} fake_tccd;

/* Starts serving; aborts the test process on failure. */
fake_tccd *fake_tccd_start(const fake_tccd_config *cfg);

/* Stops (cancelling any call in progress) and frees. */
void fake_tccd_stop(fake_tccd *f);

/* The target of the last CompileRequest, as "cpu:ISA" or "cuda:ARCH"
 * (copied into buf). */
void fake_tccd_last_target(fake_tccd *f, char *buf, size_t size);

/* Lowercase hex SHA-256 of the configured artifact. */
const char *fake_tccd_artifact_sha(const fake_tccd *f);

#endif
