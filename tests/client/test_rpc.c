/*
 * test_rpc.c — libtccclient's calls against the in-process fake tccd
 * (fake_tccd.h): compile + streamed fetch + verify + load + run, the
 * local artifact cache (a corrupt file is refetched), digest failures,
 * the daemon's status and message passed through, deadlines, a daemon
 * that goes away mid-call, signatures on compile and on fetch, and the
 * byte-level FFI functions.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "fake_tccd.h"
#include "tccclient.h"
#include "tcctest.h"
#include "testutil.h"

#define GUARD "5eed5eed00112233445566778899aabbccddeeff00112233445566778899aabb"
#define OTHER "0000000000112233445566778899aabbccddeeff00112233445566778899aabb"

static uint8_t *so;
static size_t so_len;
static tu_manifest tm;
static fake_tccd *fake;
static tcc_client *client;

/* The fake signs with key (NULL: unsigned); the client trusts the .pub
 * files in trusted ("" = none; never $TCCD_TRUSTED_KEYS). */
static void start_fake_signed(size_t chunk_bytes, const char *artifact_dir, const tcc_sign_key *key,
                              const char *trusted) {
  if (!so) so = tu_build_kernel("TCC_MARK_RPC", NULL, &so_len);
  tu_manifest_init(&tm, "tcc_entry", 1);
  fake_tccd_config cfg = {.artifact = so, .artifact_len = so_len, .manifest = &tm.m,
                          .guard_hash = GUARD, .chunk_bytes = chunk_bytes, .signing_key = key};
  fake = fake_tccd_start(&cfg);
  tcc_client_options opts = {.deadline_ms = 10000, .connect_timeout_ms = 5000, .artifact_dir = artifact_dir,
                             .trusted_keys = trusted};
  tcc_error err = {0};
  ck_assert_msg(tcc_client_connect(fake->addr, &opts, &client, &err) == 0, "connect: %s", err.msg);
  ck_assert_str_eq(tcc_client_addr(client), fake->addr);
}

static void start_fake(size_t chunk_bytes, const char *artifact_dir) {
  start_fake_signed(chunk_bytes, artifact_dir, NULL, "");
}

static void stop_fake(void) {
  tcc_client_close(client);
  client = NULL;
  fake_tccd_stop(fake);
  fake = NULL;
  free(so);
  so = NULL;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A CompileRequest with a little content (the fake does not read it). */
static void sample_request(Tcc__V1__CompileRequest *req, Tcc__V1__Target *tg) {
  tcc__v1__compile_request__init(req);
  tcc__v1__target__init(tg);
  tg->device = TCC__V1__DEVICE_TYPE__CPU;
  tg->cpu_isa = (char *)"x86-64-v2";
  req->target = tg;
  req->client = (char *)"test_rpc";
}

/* ------------------------------------------------------------------ */

START_TEST(get_kernel_end_to_end) {
  start_fake(1000, NULL); /* ~16 KiB artifact: many chunks */
  ck_assert_uint_gt(so_len, 3000);
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  tcc_module *k = NULL;
  Tcc__V1__CompileResponse *resp = NULL;
  tcc_error err = {0};
  unsetenv("TCC_MARK_RPC");
  ck_assert_msg(tcc_client_get_module(client, &req, &k, &resp, &err) == 0, "get_kernel: %s", err.msg);
  ck_assert_ptr_nonnull(getenv("TCC_MARK_RPC"));
  ck_assert_str_eq(resp->guard_hash, GUARD);
  ck_assert_int_eq(resp->cache, TCC__V1__CACHE_STATUS__MISS);
  ck_assert_str_eq(resp->artifact->sha256, fake_tccd_artifact_sha(fake));
  ck_assert_int_eq(tcc_module_manifest(k)->n_kernels, 1);
  tu_run_and_check(k, 0);
  tcc_module_unload(k);
  tcc__v1__compile_response__free_unpacked(resp, NULL);
  ck_assert_int_eq(fake->compile_calls, 1);
  ck_assert_int_eq(fake->fetch_calls, 1);

  /* Second time: the daemon says HIT; without an artifact dir it refetches. */
  ck_assert_int_eq(tcc_client_get_module(client, &req, &k, NULL, &err), 0);
  tu_run_and_check(k, 0);
  tcc_module_unload(k);
  ck_assert_int_eq(fake->fetch_calls, 2);
  stop_fake();
}
END_TEST

START_TEST(fetch_by_digest_and_by_guard_hash) {
  start_fake(777, NULL); /* a chunk size that does not divide the size */
  uint8_t *data;
  size_t len;
  tcc_error err = {0};
  const char *sha = fake_tccd_artifact_sha(fake);
  ck_assert_msg(tcc_client_fetch(client, sha, &data, &len, &err) == 0, "%s", err.msg);
  ck_assert_uint_eq(len, so_len);
  ck_assert(memcmp(data, so, len) == 0);
  free(data);

  /* Upper-case hex is the same digest. */
  char upper[TCC_SHA256_HEX];
  for (int i = 0; i < 65; i++) upper[i] = (char)(sha[i] >= 'a' && sha[i] <= 'f' ? sha[i] - 32 : sha[i]);
  ck_assert_int_eq(tcc_client_fetch(client, upper, &data, &len, &err), 0);
  free(data);

  char got_sha[TCC_SHA256_HEX];
  ck_assert_msg(tcc_client_fetch_entry(client, GUARD, &data, &len, got_sha, &err) == 0, "%s", err.msg);
  ck_assert_str_eq(got_sha, sha);
  ck_assert(len == so_len && memcmp(data, so, len) == 0);
  free(data);

  /* Unknown entry: the daemon's NOT_FOUND and message, as they are. */
  ck_assert_int_eq(tcc_client_fetch_entry(client, OTHER, &data, &len, NULL, &err), TCC_E_NOT_FOUND);
  ck_assert_str_eq(err.msg, "no such artifact");
  ck_assert_ptr_null(data);
  /* Not a digest: refused locally. */
  ck_assert_int_eq(tcc_client_fetch(client, "xyz", &data, &len, &err), TCC_E_INVALID_ARGUMENT);
  stop_fake();
}
END_TEST

START_TEST(fetch_detects_corruption) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/artifacts-corrupt", tu_tmpdir());
  start_fake(1000, dir);
  fake->corrupt_fetch = 1;
  uint8_t *data = (uint8_t *)0x1;
  size_t len;
  tcc_error err = {0};
  const char *sha = fake_tccd_artifact_sha(fake);
  ck_assert_int_eq(tcc_client_fetch(client, sha, &data, &len, &err), TCC_E_DATA_LOSS);
  ck_assert_ptr_null(data);
  char want[200];
  snprintf(want, sizeof want, "artifact digest mismatch: expected %s got ", sha);
  ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "%s", err.msg);
  /* Nothing bad was stored locally. */
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, sha);
  ck_assert_int_ne(access(path, F_OK), 0);

  /* get_kernel refuses too (and loads nothing). */
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  tcc_module *k = (tcc_module *)0x1;
  unsetenv("TCC_MARK_RPC");
  ck_assert_int_eq(tcc_client_get_module(client, &req, &k, NULL, &err), TCC_E_DATA_LOSS);
  ck_assert_ptr_null(k);
  ck_assert_ptr_null(getenv("TCC_MARK_RPC"));
  stop_fake();
  rmdir(dir);
}
END_TEST

START_TEST(artifact_dir_serves_and_repairs) {
  char dir[512], path[1024];
  snprintf(dir, sizeof dir, "%s/artifacts", tu_tmpdir());
  start_fake(4096, dir);
  const char *sha = fake_tccd_artifact_sha(fake);
  snprintf(path, sizeof path, "%s/%s", dir, sha);
  uint8_t *data;
  size_t len;
  tcc_error err = {0};

  ck_assert_int_eq(tcc_client_fetch(client, sha, &data, &len, &err), 0);
  free(data);
  ck_assert_int_eq(fake->fetch_calls, 1);
  size_t flen;
  char *file = tt_read_file(path, &flen); /* stored under its digest */
  ck_assert_ptr_nonnull(file);
  ck_assert(flen == so_len && memcmp(file, so, flen) == 0);
  free(file);

  /* Warm: no round trip. */
  ck_assert_int_eq(tcc_client_fetch(client, sha, &data, &len, &err), 0);
  ck_assert(len == so_len && memcmp(data, so, len) == 0);
  free(data);
  ck_assert_int_eq(fake->fetch_calls, 1);

  /* A corrupt file is deleted, refetched and rewritten. */
  FILE *f = fopen(path, "r+b");
  fseek(f, (long)(so_len / 3), SEEK_SET);
  fputc('!', f);
  fclose(f);
  ck_assert_int_eq(tcc_client_fetch(client, sha, &data, &len, &err), 0);
  ck_assert(len == so_len && memcmp(data, so, len) == 0);
  free(data);
  ck_assert_int_eq(fake->fetch_calls, 2);
  file = tt_read_file(path, &flen);
  ck_assert(flen == so_len && memcmp(file, so, flen) == 0);
  free(file);

  /* A truncated file likewise. */
  ck_assert_int_eq(truncate(path, 10), 0);
  ck_assert_int_eq(tcc_client_fetch(client, sha, &data, &len, &err), 0);
  free(data);
  ck_assert_int_eq(fake->fetch_calls, 3);

  /* Fetch by guard hash fills the cache too; get_kernel then needs no fetch. */
  unlink(path);
  ck_assert_int_eq(tcc_client_fetch_entry(client, GUARD, &data, &len, NULL, &err), 0);
  free(data);
  ck_assert_int_eq(fake->fetch_calls, 4);
  ck_assert_int_eq(access(path, R_OK), 0);
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  tcc_module *k;
  ck_assert_int_eq(tcc_client_get_module(client, &req, &k, NULL, &err), 0);
  tu_run_and_check(k, 0);
  tcc_module_unload(k);
  ck_assert_int_eq(fake->fetch_calls, 4);
  stop_fake();
  unlink(path);
  rmdir(dir);
}
END_TEST

START_TEST(admin_calls_and_statuses) {
  start_fake(0, NULL);
  tcc_error err = {0};
  int serving = -1;
  ck_assert_int_eq(tcc_client_health(client, "", &serving, &err), 0);
  ck_assert_int_eq(serving, 1);

  Tcc__V1__StatsResponse *st;
  ck_assert_int_eq(tcc_client_stats(client, &st, &err), 0);
  ck_assert_int_eq(st->hits, 30);
  ck_assert_str_eq(st->version, "0.1.0-fake");
  tcc__v1__stats_response__free_unpacked(st, NULL);

  Tcc__V1__ListResponse *ls;
  ck_assert_int_eq(tcc_client_list(client, 7, "hits", &ls, &err), 0);
  ck_assert_int_eq(fake->last_list_limit, 7);
  ck_assert_uint_eq(ls->n_entries, 1);
  ck_assert_str_eq(ls->entries[0]->guard_hash, GUARD);
  tcc__v1__list_response__free_unpacked(ls, NULL);

  Tcc__V1__ShowResponse *sh;
  ck_assert_int_eq(tcc_client_show(client, GUARD, &sh, &err), 0);
  ck_assert_str_eq(sh->manifest->entry, "tcc_entry");
  ck_assert_uint_eq(sh->canonical_key.len, 9);
  tcc__v1__show_response__free_unpacked(sh, NULL);

  /* The daemon's status and message come through unchanged. */
  char other[] = "0123456789012345678901234567890123456789012345678901234567890123";
  ck_assert_int_eq(tcc_client_show(client, other, &sh, &err), TCC_E_NOT_FOUND);
  ck_assert_int_eq(err.code, TCC_E_NOT_FOUND);
  char want[128];
  snprintf(want, sizeof want, "no cache entry %s", other);
  ck_assert_str_eq(err.msg, want);
  ck_assert_int_eq(tcc_client_show(client, "abc", &sh, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_str_eq(err.msg, "guard_hash must be 64 hex digits");

  Tcc__V1__GcResponse *gc;
  ck_assert_int_eq(tcc_client_gc(client, 123456789, &gc, &err), 0);
  ck_assert_int_eq(fake->last_gc_max_bytes, 123456789);
  ck_assert_int_eq(gc->evicted, 2);
  tcc__v1__gc_response__free_unpacked(gc, NULL);

  int evicted = 0;
  ck_assert_int_eq(tcc_client_evict(client, GUARD, &evicted, &err), 0);
  ck_assert_int_eq(evicted, 1);
  ck_assert_int_eq(tcc_client_evict(client, GUARD, &evicted, &err), TCC_E_NOT_FOUND);

  /* A method the daemon does not have. */
  uint8_t *resp;
  size_t resp_len;
  ck_assert_int_eq(tcc_client_call(client, "/tcc.v1.Nope/Nope", (const uint8_t *)"", 0, &resp, &resp_len, 0, &err),
                   TCC_E_UNIMPLEMENTED);
  ck_assert_ptr_null(resp);
  stop_fake();
}
END_TEST

START_TEST(deadline_is_enforced) {
  start_fake(0, NULL);
  fake->stall_stats = 1;
  uint8_t *resp;
  size_t len;
  tcc_error err = {0};
  double t0 = now_s();
  ck_assert_int_eq(tcc_client_call(client, TCC_METHOD_STATS, (const uint8_t *)"", 0, &resp, &len, 300, &err),
                   TCC_E_DEADLINE_EXCEEDED);
  double dt = now_s() - t0;
  ck_assert_msg(dt >= 0.25 && dt < 3.0, "took %.2f s for a 0.3 s deadline", dt);
  fake->stall_stats = 0;
  ck_assert_int_eq(tcc_client_call(client, TCC_METHOD_STATS, (const uint8_t *)"", 0, &resp, &len, 0, &err), 0);
  free(resp);
  stop_fake();
}
END_TEST

START_TEST(byte_level_api) {
  start_fake(2048, NULL);
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  size_t n = tcc__v1__compile_request__get_packed_size(&req);
  uint8_t *reqb = malloc(n);
  tcc__v1__compile_request__pack(&req, reqb);
  tcc_error *err = tcc_error_new();

  uint8_t *resp;
  size_t resp_len;
  ck_assert_int_eq(tcc_client_compile_bytes(client, reqb, n, &resp, &resp_len, err), 0);
  Tcc__V1__CompileResponse *cr = tcc__v1__compile_response__unpack(NULL, resp_len, resp);
  ck_assert_ptr_nonnull(cr);
  ck_assert_str_eq(cr->guard_hash, GUARD);
  tcc__v1__compile_response__free_unpacked(cr, NULL);
  tcc_free(resp);

  tcc_module *k;
  ck_assert_int_eq(tcc_client_get_module_bytes(client, reqb, n, &k, &resp, &resp_len, err), 0);
  cr = tcc__v1__compile_response__unpack(NULL, resp_len, resp);
  ck_assert_int_eq(cr->cache, TCC__V1__CACHE_STATUS__HIT);
  tcc__v1__compile_response__free_unpacked(cr, NULL);
  tcc_free(resp);
  tu_run_and_check(k, 0);
  tcc_module_unload(k);

  ck_assert_int_eq(tcc_client_get_module_bytes(client, (const uint8_t *)"\xff\xff\xff", 3, &k, NULL, NULL, err),
                   TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tcc_error_code(err), TCC_E_INVALID_ARGUMENT);
  tcc_error_free(err);
  free(reqb);
  stop_fake();
}
END_TEST

/* A fresh key pair under the test's temporary directory: *pub gets the
 * .pub path (static buffer), key the loaded secret key. */
static void make_key(const char *name, tcc_sign_key *key, char pub[512]) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s-%d-%ld", tu_tmpdir(), name, (int)getpid(), (long)random());
  tcc_error err = {0};
  ck_assert_msg(tcc_sign_keygen(path, NULL, &err) == 0, "keygen: %s", err.msg);
  ck_assert_msg(tcc_sign_key_load(path, key, &err) == 0, "load: %s", err.msg);
  snprintf(pub, 512, "%s.pub", path);
}

/* get_kernel with the marker kernel: returns the status; asserts that a
 * refused artifact was never dlopen'ed (its constructor sets the marker). */
static int get_kernel_checked(tcc_error *err) {
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  tcc_module *k = NULL;
  unsetenv("TCC_MARK_RPC");
  int rc = tcc_client_get_module(client, &req, &k, NULL, err);
  if (rc) {
    ck_assert_ptr_null(k);
    ck_assert_msg(getenv("TCC_MARK_RPC") == NULL, "a refused artifact was loaded");
    return rc;
  }
  ck_assert_ptr_nonnull(getenv("TCC_MARK_RPC"));
  tu_run_and_check(k, 0);
  tcc_module_unload(k);
  return 0;
}

START_TEST(signatures_are_checked_before_loading) {
  tcc_sign_key key, other;
  char pub[512], other_pub[512], both[1100];
  make_key("sign", &key, pub);
  make_key("other", &other, other_pub);
  snprintf(both, sizeof both, "%s,%s", other_pub, pub);
  tcc_error err = {0};

  /* signed and trusted: verified, loaded, correct */
  start_fake_signed(1000, NULL, &key, pub);
  ck_assert_uint_eq(tcc_client_trusted_keys(client), 1);
  ck_assert_msg(get_kernel_checked(&err) == 0, "%s", err.msg);
  Tcc__V1__CompileRequest req;
  Tcc__V1__Target tg;
  sample_request(&req, &tg);
  Tcc__V1__CompileResponse *resp = NULL;
  ck_assert_int_eq(tcc_client_compile(client, &req, &resp, &err), 0);
  ck_assert_str_eq(resp->artifact->key_id, key.key_id);
  ck_assert_uint_eq(resp->artifact->signature.len, TCC_SIGNATURE_BYTES);
  tcc__v1__compile_response__free_unpacked(resp, NULL);

  /* a flipped signature bit */
  fake->tamper_signature = 1;
  ck_assert_int_eq(get_kernel_checked(&err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "artifact signature invalid"), "%s", err.msg);
  fake->tamper_signature = 0;
  /* a manifest other than the one signed (same artifact, same digest) */
  fake->tamper_manifest = 1;
  ck_assert_int_eq(get_kernel_checked(&err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "does not verify"), "%s", err.msg);
  ck_assert_int_eq(tcc_client_compile(client, &req, &resp, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_ptr_null(resp);
  fake->tamper_manifest = 0;
  /* the artifact's bytes altered on the way: the digest check refuses it */
  fake->corrupt_fetch = 1;
  ck_assert_int_eq(get_kernel_checked(&err), TCC_E_DATA_LOSS);
  fake->corrupt_fetch = 0;
  ck_assert_int_eq(get_kernel_checked(&err), 0);
  stop_fake();

  /* signed by a key the client does not trust; then trusted among two */
  start_fake_signed(1000, NULL, &key, other_pub);
  ck_assert_int_eq(get_kernel_checked(&err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "not trusted") && strstr(err.msg, key.key_id), "%s", err.msg);
  stop_fake();
  start_fake_signed(1000, NULL, &key, both);
  ck_assert_uint_eq(tcc_client_trusted_keys(client), 2);
  ck_assert_int_eq(get_kernel_checked(&err), 0);
  stop_fake();

  /* unsigned: refused with trusted keys, loaded without (digest checked) */
  start_fake_signed(1000, NULL, NULL, pub);
  ck_assert_int_eq(get_kernel_checked(&err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "artifact is unsigned and TCCD_TRUSTED_KEYS is set"), "%s", err.msg);
  /* the byte-level API refuses it the same way */
  size_t n = tcc__v1__compile_request__get_packed_size(&req);
  uint8_t *reqb = malloc(n), *rb = NULL;
  size_t rn = 0;
  tcc__v1__compile_request__pack(&req, reqb);
  ck_assert_int_eq(tcc_client_compile_bytes(client, reqb, n, &rb, &rn, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_ptr_null(rb);
  free(reqb);
  stop_fake();
  start_fake_signed(1000, NULL, NULL, "");
  ck_assert_uint_eq(tcc_client_trusted_keys(client), 0);
  ck_assert_int_eq(get_kernel_checked(&err), 0);
  stop_fake();

  /* TCCD_TRUSTED_KEYS is read when the option is NULL; a bad file fails
   * the connect, naming it */
  start_fake_signed(1000, NULL, &key, "");
  tcc_client *c2 = NULL;
  setenv("TCCD_TRUSTED_KEYS", other_pub, 1);
  ck_assert_int_eq(tcc_client_connect(fake->addr, NULL, &c2, &err), 0);
  ck_assert_uint_eq(tcc_client_trusted_keys(c2), 1);
  tcc_client_close(c2);
  setenv("TCCD_TRUSTED_KEYS", "/nonexistent/k.pub", 1);
  ck_assert_int_eq(tcc_client_connect(fake->addr, NULL, &c2, &err), TCC_E_NOT_FOUND);
  ck_assert_msg(strstr(err.msg, "TCCD_TRUSTED_KEYS") && strstr(err.msg, "/nonexistent/k.pub"), "%s", err.msg);
  unsetenv("TCCD_TRUSTED_KEYS");
  stop_fake();
  tcc_sign_key_wipe(&key);
  tcc_sign_key_wipe(&other);
}
END_TEST

/* The signing primitives themselves: each signed field matters, key
 * files round-trip, and bad files are refused with their name. */
START_TEST(sign_and_verify_primitives) {
  tcc_sign_key key;
  char pub[512];
  make_key("prim", &key, pub);
  tcc_error err = {0};
  tcc_trusted_keys keys;
  ck_assert_int_eq(tcc_trusted_keys_load(pub, &keys, &err), 0);
  ck_assert_uint_eq(keys.n, 1);
  ck_assert_str_eq(keys.keys[0].key_id, key.key_id);
  ck_assert_uint_eq(strlen(key.key_id), 16);

  uint8_t guard[32], sha[32], manifest[300], sig[64];
  for (size_t i = 0; i < 32; i++) guard[i] = (uint8_t)tt_rand(), sha[i] = (uint8_t)tt_rand();
  for (size_t i = 0; i < sizeof manifest; i++) manifest[i] = (uint8_t)tt_rand();
  tcc_artifact_sign(&key, guard, sha, manifest, sizeof manifest, sig);
  ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, sha, manifest, sizeof manifest, sig, 64, &err), 0);
  uint8_t *fields[] = {guard, sha, manifest, sig};
  size_t lens[] = {32, 32, sizeof manifest, 64};
  for (int f = 0; f < 4; f++) { /* any one bit anywhere breaks it */
    size_t at = (size_t)tt_rand() % lens[f];
    fields[f][at] ^= (uint8_t)(1u << (tt_rand() % 8));
    ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, sha, manifest, sizeof manifest, sig, 64, &err),
                     TCC_E_PERMISSION_DENIED);
    ck_assert_msg(strstr(err.msg, "artifact signature invalid"), "%s", err.msg);
    tcc_artifact_sign(&key, guard, sha, manifest, sizeof manifest, sig); /* re-sign the new content */
  }
  ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, sha, manifest, sizeof manifest, sig, 64, &err), 0);
  ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, sha, manifest, sizeof manifest, sig, 0, &err),
                   TCC_E_PERMISSION_DENIED);
  ck_assert_str_eq(err.msg, "artifact is unsigned");
  ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, sha, manifest, sizeof manifest, sig, 63, &err),
                   TCC_E_PERMISSION_DENIED);
  ck_assert_int_eq(tcc_artifact_verify(&keys, "0123456789abcdef", guard, sha, manifest, sizeof manifest, sig, 64,
                                       &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "not trusted"), "%s", err.msg);

  /* keygen never overwrites; a loose secret key file is refused */
  char secret[512];
  snprintf(secret, sizeof secret, "%.*s", (int)(strlen(pub) - 4), pub);
  ck_assert_int_eq(tcc_sign_keygen(secret, NULL, &err), TCC_E_ALREADY_EXISTS);
  struct stat st;
  ck_assert_int_eq(stat(secret, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  chmod(secret, 0640);
  tcc_sign_key k2;
  ck_assert_int_eq(tcc_sign_key_load(secret, &k2, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, secret) && strstr(err.msg, "chmod 600"), "%s", err.msg);
  chmod(secret, 0600);
  ck_assert_int_eq(tcc_sign_key_load(secret, &k2, &err), 0);
  ck_assert_mem_eq(k2.pk, key.pk, 32);
  /* a public key file is not a secret key, and vice versa */
  ck_assert_int_eq(tcc_sign_key_load(pub, &k2, &err), TCC_E_PERMISSION_DENIED); /* 0644 */
  tcc_trusted_key tk;
  ck_assert_int_eq(tcc_trusted_key_load(secret, &tk, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "not a tccd public key"), "%s", err.msg);
  tcc_trusted_keys none;
  ck_assert_int_eq(tcc_trusted_keys_load("", &none, &err), 0);
  ck_assert_uint_eq(none.n, 0);
  ck_assert_int_eq(tcc_trusted_keys_load(",,", &none, &err), 0);
  ck_assert_uint_eq(none.n, 0);
  tcc_trusted_keys_free(&keys);
  tcc_sign_key_wipe(&key);
  tcc_sign_key_wipe(&k2);
}
END_TEST

/* Plan signatures: the tcc_sign.h layout exactly (guard hash =
 * SHA-256("tccd-plan-v1\0" key), artifact digest = SHA-256(plan),
 * manifest "tccd-plan-v1"), so another implementation can check them;
 * another key or another plan byte fails. */
START_TEST(plan_signatures) {
  tcc_sign_key key;
  char pub[512];
  make_key("plan", &key, pub);
  tcc_error err = {0};
  tcc_trusted_keys keys;
  ck_assert_int_eq(tcc_trusted_keys_load(pub, &keys, &err), 0);
  uint8_t plan[500], sig[64];
  for (size_t i = 0; i < sizeof plan; i++) plan[i] = (uint8_t)tt_rand();
  tcc_plan_sign(&key, "tccd.k1", plan, sizeof plan, sig);
  ck_assert_int_eq(tcc_plan_verify(&keys, key.key_id, "tccd.k1", plan, sizeof plan, sig, 64, &err), 0);
  static const char framed[] = "tccd-plan-v1\0tccd.k1"; /* 13 + 7 bytes */
  uint8_t guard[32], digest[32], g2[32], d2[32];
  tcc_sha256(framed, sizeof framed - 1, guard);
  tcc_sha256(plan, sizeof plan, digest);
  tcc_plan_sign_digests("tccd.k1", plan, sizeof plan, g2, d2);
  ck_assert_mem_eq(g2, guard, 32);
  ck_assert_mem_eq(d2, digest, 32);
  ck_assert_int_eq(tcc_artifact_verify(&keys, key.key_id, guard, digest, (const uint8_t *)"tccd-plan-v1", 12, sig,
                                       64, &err), 0);
  ck_assert_int_eq(tcc_plan_verify(&keys, key.key_id, "tccd.k2", plan, sizeof plan, sig, 64, &err),
                   TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "plan signature invalid"), "%s", err.msg);
  plan[tt_rand() % sizeof plan] ^= 1;
  ck_assert_int_eq(tcc_plan_verify(&keys, key.key_id, "tccd.k1", plan, sizeof plan, sig, 64, &err),
                   TCC_E_PERMISSION_DENIED);
  ck_assert_int_eq(tcc_plan_verify(&keys, key.key_id, "tccd.k1", plan, sizeof plan, sig, 0, &err),
                   TCC_E_PERMISSION_DENIED);
  ck_assert_str_eq(err.msg, "plan is unsigned");
  tcc_trusted_keys_free(&keys);
  tcc_sign_key_wipe(&key);
}
END_TEST

START_TEST(daemon_gone_is_unavailable_not_a_hang) {
  start_fake(0, NULL);
  tcc_client_close(client);
  tcc_client_options opts = {.deadline_ms = 20000, .connect_timeout_ms = 300};
  tcc_error err = {0};
  ck_assert_int_eq(tcc_client_connect(fake->addr, &opts, &client, &err), 0);
  fake_tccd_stop(fake); /* the daemon goes away under a connected client */
  fake = NULL;
  Tcc__V1__StatsResponse *st = (Tcc__V1__StatsResponse *)0x1;
  double t0 = now_s();
  ck_assert_int_eq(tcc_client_stats(client, &st, &err), TCC_E_UNAVAILABLE);
  double dt = now_s() - t0;
  ck_assert_ptr_null(st);
  ck_assert_msg(dt < 3.0, "took %.2f s; the retry waits at most the 0.3 s connect timeout", dt);
  tcc_client_close(client);
  client = NULL;
  free(so);
  so = NULL;
}
END_TEST

/* The daemon goes away while a call waits on it (the fake's shutdown
 * cancels it, as tccd's does after its grace period; a killed daemon
 * closes the socket): UNAVAILABLE naming the daemon, never CANCELLED, and
 * at once -- the retry finds the port refused and does not wait out the
 * 10 s connect timeout. */
typedef struct stats_call {
  int rc;
  tcc_error err;
  double done;
} stats_call;

static void *call_stats(void *arg) {
  stats_call *sc = arg;
  Tcc__V1__StatsResponse *st = NULL;
  sc->rc = tcc_client_stats(client, &st, &sc->err);
  sc->done = now_s();
  if (st) tcc__v1__stats_response__free_unpacked(st, NULL);
  return NULL;
}

START_TEST(daemon_gone_mid_call_is_unavailable) {
  start_fake(0, NULL);
  tcc_client_close(client);
  tcc_client_options opts = {.deadline_ms = 30000, .connect_timeout_ms = 10000};
  tcc_error err = {0};
  ck_assert_int_eq(tcc_client_connect(fake->addr, &opts, &client, &err), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "%s", fake->addr);
  /* a call the daemon cancels is UNAVAILABLE (and, the daemon being up,
   * tried once more), not CANCELLED */
  fake->cancel_stats = 1;
  Tcc__V1__StatsResponse *st = NULL;
  ck_assert_int_eq(tcc_client_stats(client, &st, &err), TCC_E_UNAVAILABLE);
  ck_assert_msg(!strncmp(err.msg, "cancelled by tccd or the connection: ", 37), "%s", err.msg);
  fake->cancel_stats = 0;
  fake->stall_stats = 1;
  stats_call sc = {0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, call_stats, &sc), 0);
  for (int i = 0; i < 2000 && !fake->stalled; i++) usleep(5000); /* until the call waits on the fake */
  ck_assert_int_eq(fake->stalled, 1);
  double t0 = now_s();
  fake_tccd_stop(fake);
  fake = NULL;
  pthread_join(th, NULL);
  ck_assert_msg(sc.rc == TCC_E_UNAVAILABLE, "rc %d: %s", sc.rc, sc.err.msg);
  char want[128];
  snprintf(want, sizeof want, "tccd at %s went away during the call: ", addr);
  ck_assert_msg(!strncmp(sc.err.msg, want, strlen(want)), "%s", sc.err.msg);
  ck_assert_msg(strstr(sc.err.msg, "Connection refused"), "%s", sc.err.msg);
  ck_assert_msg(sc.done - t0 < 1.0, "took %.2f s after the daemon went away (connect timeout 10 s)", sc.done - t0);
  /* the next call: refused at once, said as such */
  t0 = now_s();
  ck_assert_int_eq(tcc_client_stats(client, &st, &err), TCC_E_UNAVAILABLE);
  ck_assert_msg(now_s() - t0 < 1.0, "took %.2f s", now_s() - t0);
  snprintf(want, sizeof want, "cannot reach tccd at %s: ", addr);
  ck_assert_msg(!strncmp(err.msg, want, strlen(want)), "%s", err.msg);
  tcc_client_close(client);
  client = NULL;
  free(so);
  so = NULL;
}
END_TEST

/* Fetch by guard hash checks the signature as Compile does when the client
 * trusts keys: the first chunk's signature over the entry's manifest (from
 * Show); nothing is returned, or cached, unless it verifies. */
static int fetch_entry_checked(const char *artifact_dir, tcc_error *err) {
  uint8_t *data = (uint8_t *)0x1;
  size_t len = 1;
  char sha[TCC_SHA256_HEX] = "";
  int rc = tcc_client_fetch_entry(client, GUARD, &data, &len, sha, err);
  if (rc) {
    ck_assert_ptr_null(data);
    ck_assert_uint_eq(len, 0);
    if (artifact_dir) {
      char path[600];
      snprintf(path, sizeof path, "%s/%s", artifact_dir, fake_tccd_artifact_sha(fake));
      ck_assert_msg(access(path, F_OK) != 0, "a refused artifact was cached");
    }
    return rc;
  }
  ck_assert(len == so_len && memcmp(data, so, len) == 0);
  ck_assert_str_eq(sha, fake_tccd_artifact_sha(fake));
  free(data);
  return 0;
}

START_TEST(fetch_entry_verifies_signatures) {
  tcc_sign_key key, other;
  char pub[512], other_pub[512], dir[512];
  make_key("fsign", &key, pub);
  make_key("fother", &other, other_pub);
  snprintf(dir, sizeof dir, "%s/fetch-art-%d", tu_tmpdir(), (int)getpid());
  tcc_error err = {0};

  /* signed by a key the client does not trust: refused, not cached */
  start_fake_signed(1000, dir, &key, other_pub);
  ck_assert_int_eq(fetch_entry_checked(dir, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "artifact signature invalid") && strstr(err.msg, key.key_id), "%s", err.msg);
  stop_fake();

  /* trusted: verified and returned */
  start_fake_signed(1000, dir, &key, pub);
  ck_assert_msg(fetch_entry_checked(NULL, &err) == 0, "%s", err.msg);
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, fake_tccd_artifact_sha(fake));
  ck_assert_int_eq(unlink(path), 0); /* it was cached once verified */
  /* a signature altered on the way */
  fake->tamper_fetch_signature = 1;
  ck_assert_int_eq(fetch_entry_checked(dir, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "does not verify"), "%s", err.msg);
  fake->tamper_fetch_signature = 0;
  /* a daemon whose Fetch does not send the signature: cannot verify */
  fake->fetch_unsigned = 1;
  ck_assert_int_eq(fetch_entry_checked(dir, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "sent no signature") && strstr(err.msg, key.key_id), "%s", err.msg);
  fake->fetch_unsigned = 0;
  /* the artifact's bytes altered: its digest refuses it first */
  fake->corrupt_fetch = 1;
  ck_assert_int_eq(fetch_entry_checked(dir, &err), TCC_E_DATA_LOSS);
  fake->corrupt_fetch = 0;
  ck_assert_msg(fetch_entry_checked(NULL, &err) == 0, "%s", err.msg);
  stop_fake();

  /* unsigned entry: refused with trusted keys, fetched without */
  start_fake_signed(1000, NULL, NULL, pub);
  ck_assert_int_eq(fetch_entry_checked(NULL, &err), TCC_E_PERMISSION_DENIED);
  ck_assert_msg(strstr(err.msg, "artifact is unsigned and TCCD_TRUSTED_KEYS is set"), "%s", err.msg);
  stop_fake();
  start_fake_signed(1000, NULL, &key, "");
  fake->fetch_unsigned = 1;
  ck_assert_msg(fetch_entry_checked(NULL, &err) == 0, "%s", err.msg);
  stop_fake();
  unlink(path);
  rmdir(dir);
  tcc_sign_key_wipe(&key);
  tcc_sign_key_wipe(&other);
}
END_TEST

/* Several threads share one client. */
static void *hammer(void *arg) {
  (void)arg;
  for (int i = 0; i < 10; i++) {
    uint8_t *data;
    size_t len;
    tcc_error err;
    if (tcc_client_fetch(client, fake_tccd_artifact_sha(fake), &data, &len, &err) != 0) return (void *)1;
    int bad = len != so_len || memcmp(data, so, len) != 0;
    free(data);
    Tcc__V1__StatsResponse *st;
    if (bad || tcc_client_stats(client, &st, &err) != 0) return (void *)1;
    tcc__v1__stats_response__free_unpacked(st, NULL);
  }
  return NULL;
}

START_TEST(one_client_many_threads) {
  start_fake(4096, NULL);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, NULL);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    ck_assert_ptr_null(r);
  }
  ck_assert_int_eq(fake->fetch_calls, 40);
  stop_fake();
}
END_TEST

int main(void) {
  tt_seed("test_rpc");
  int rc = tt_run_tests("rpc", 120, 0, (const TTest *[]){
      get_kernel_end_to_end,
      fetch_by_digest_and_by_guard_hash,
      fetch_detects_corruption,
      artifact_dir_serves_and_repairs,
      admin_calls_and_statuses,
      deadline_is_enforced,
      byte_level_api,
      one_client_many_threads,
      daemon_gone_is_unavailable_not_a_hang,
      daemon_gone_mid_call_is_unavailable,
      fetch_entry_verifies_signatures,
      signatures_are_checked_before_loading,
      sign_and_verify_primitives,
      plan_signatures,
      NULL});
  tcc_client_library_shutdown();
  rmdir(tu_tmpdir());
  return rc;
}
