/*
 * crash_writer.c — stores random entries into a cache in a loop and
 * acknowledges each one on stdout, for the crash-consistency test.
 *
 *   crash_writer DIR [COUNT]    store COUNT entries (0 or absent: until killed)
 *   crash_writer --tmp COUNT    the same in a scratch dir, removed at exit
 *                               (the valgrind run: a clean exit, no leaks)
 *
 * After each tcc_cache_store that returned 0 it prints, and flushes,
 *   ACK <guard hash hex> <artifact sha256 hex>
 * so every line the parent reads names an entry the cache acknowledged.
 * test_crash kills it with SIGKILL at random moments and checks that every
 * acknowledged entry survived. Between stores it also exercises the other
 * write paths: hits and counters (flushed every 25 stores), shared blobs
 * (every 7th entry reuses the previous artifact) and verified reads.
 * Exits 0 after COUNT stores, 1 (with the error on stderr) on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_testutil.h"
#include "tcctest.h"

static int failed(const char *what, const tcc_error *err) {
  fprintf(stderr, "crash_writer: %s: %s (%s)\n", what, err->msg, tcc_status_name(err->code));
  return 1;
}

/* Stores count entries (0: forever). Returns 0 or 1. */
static int write_entries(tcc_cache *c, long count) {
  tcc_error err = {0};
  uint8_t *prev = NULL;
  size_t prev_len = 0;
  int rc = 0;
  for (long i = 0; count == 0 || i < count; i++) {
    size_t len;
    uint8_t *art;
    if (prev && i % 7 == 0) { /* a second entry for the same artifact */
      len = prev_len;
      art = prev;
      prev = NULL;
    } else {
      len = (size_t)tt_rand_range(64, 16384);
      art = tu_random_artifact(len);
    }
    tcc_cache_entry e;
    if (!art || tu_random_entry(&e, art, len, (double)tt_rand_range(1, 100000) / 10.0)) {
      fprintf(stderr, "crash_writer: out of memory\n");
      free(art);
      rc = 1;
      break;
    }
    if (tcc_cache_store(c, &e, art, len, &err)) {
      rc = failed("store", &err);
      tcc_cache_entry_clear(&e);
      free(art);
      break;
    }
    char hash[TCC_SHA256_HEX], sha[TCC_SHA256_HEX];
    tcc_hex_encode(e.hash, TCC_SHA256_BYTES, hash);
    tcc_hex_encode(e.artifact_sha256, TCC_SHA256_BYTES, sha);
    printf("ACK %s %s\n", hash, sha);
    fflush(stdout);

    if (i % 3 == 0) {
      tcc_cache_entry got;
      if (tcc_cache_lookup(c, e.hash, e.key, e.key_len, &got, &err)) rc = failed("lookup", &err);
      tcc_cache_entry_clear(&got);
      tcc_cache_count(c, TCC_COUNTER_hits, 1);
    }
    tcc_cache_count(c, TCC_COUNTER_compiles, 1);
    if (!rc && i % 25 == 24 && tcc_cache_flush(c, &err)) rc = failed("flush", &err);
    if (!rc && i % 10 == 5) {
      uint8_t *data = NULL;
      size_t n = 0;
      if (tcc_cache_read_artifact(c, e.artifact_sha256, &data, &n, &err))
        rc = failed("read_artifact", &err);
      else if (n != len || memcmp(data, art, n) != 0)
        rc = 1, fprintf(stderr, "crash_writer: artifact read back differs\n");
      free(data);
    }
    tcc_cache_entry_clear(&e);
    free(prev);
    prev = art;
    prev_len = len;
    if (rc) break;
  }
  free(prev);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: crash_writer DIR|--tmp [COUNT]\n");
    return 2;
  }
  tt_seed("crash_writer");
  long count = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
  bool scratch = strcmp(argv[1], "--tmp") == 0;
  char *dir = scratch ? tt_tmpdir("cache-test") : strdup(argv[1]);
  if (!dir) {
    perror("crash_writer: directory");
    return 1;
  }
  tcc_cache_options o = {.dir = dir};
  tcc_cache *c = NULL;
  tcc_error err = {0};
  int rc = tcc_cache_open(&o, &c, &err) ? failed("open", &err) : write_entries(c, count);
  if (c && !rc && tcc_cache_integrity_check(c, &err)) rc = failed("integrity_check", &err);
  tcc_cache_close(c);
  if (scratch) tt_remove_tree(dir);
  free(dir);
  return rc;
}
