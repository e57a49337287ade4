/*
 * test_tcctl.c — the tcctl binary (path in $TCC_TCCTL) against the in-process
 * fake tccd: every command's human and --json output, exit statuses,
 * error lines ("tcctl: CMD: STATUS: message"), usage errors (exit 2, a
 * bad --addr or $TCCD_ADDR among them), hash prefixes, --target
 * overrides, signatures checked by compile and by fetch, and an
 * unreachable daemon (refused: at once).
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_tccd.h"
#include "tcctest.h"
#include "testutil.h"

#define GUARD "5eed5eed00112233445566778899aabbccddeeff00112233445566778899aabb"
#define SIN_COS tt_graph_path("sin_cos.json")

static uint8_t *so;
static size_t so_len;
static tu_manifest tm;
static fake_tccd *fake;

/* What one tcctl run produced. */
typedef struct run_result {
  int status;
  char *out, *err;
} run_result;

static void start_fake_signed(const tcc_sign_key *key) {
  so = tu_build_kernel("TCC_MARK_TCCTL", NULL, &so_len);
  tu_manifest_init(&tm, "tcc_entry", 1);
  fake_tccd_config cfg = {.artifact = so, .artifact_len = so_len, .manifest = &tm.m, .guard_hash = GUARD,
                          .signing_key = key};
  fake = fake_tccd_start(&cfg);
}

static void start_fake(void) { start_fake_signed(NULL); }

static void stop_fake(void) {
  fake_tccd_stop(fake);
  free(so);
}

/* Runs tcctl with args (NULL-terminated), --addr first unless addr is
 * NULL; stdin from stdin_path when given. */
static run_result tcctl_at(const char *addr, const char *stdin_path, ...) {
  const char *exe = getenv("TCC_TCCTL");
  ck_assert_msg(exe != NULL, "TCC_TCCTL is not set");
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)exe;
  if (addr) {
    argv[n++] = (char *)"--addr";
    argv[n++] = (char *)addr;
  }
  va_list ap;
  va_start(ap, stdin_path);
  for (char *a; (a = va_arg(ap, char *)) && n < 31;) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  char out[512], err[512];
  snprintf(out, sizeof out, "%s/tcctl.out", tu_tmpdir());
  snprintf(err, sizeof err, "%s/tcctl.err", tu_tmpdir());
  run_result r;
  r.status = tt_run(argv, stdin_path, out, err);
  r.out = tt_read_file(out, NULL);
  r.err = tt_read_file(err, NULL);
  ck_assert(r.out && r.err);
  unlink(out);
  unlink(err);
  return r;
}

#define TCCTL(...) tcctl_at(fake->addr, NULL, __VA_ARGS__, (char *)NULL)

static void result_free(run_result *r) {
  free(r->out);
  free(r->err);
}

static void expect_ok(const run_result *r) {
  ck_assert_msg(r->status == 0, "exit %d, stderr: %s", r->status, r->err);
  ck_assert_msg(r->err[0] == '\0', "unexpected stderr: %s", r->err);
}

static cJSON *parse_json(const run_result *r) {
  cJSON *j = cJSON_Parse(r->out);
  ck_assert_msg(j != NULL, "not JSON: %s", r->out);
  return j;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  ck_assert_msg(cJSON_IsNumber(v), "\"%s\" is not a number", key);
  return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  ck_assert_msg(cJSON_IsString(v), "\"%s\" is not a string", key);
  return v->valuestring;
}

/* Does some line of text start with prefix? */
static int has_line(const char *text, const char *prefix) {
  size_t n = strlen(prefix);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, prefix, n)) return 1;
  return 0;
}

/* ------------------------------------------------------------------ */

START_TEST(stats) {
  start_fake();
  run_result r = TCCTL("--json", "stats");
  expect_ok(&r);
  cJSON *j = parse_json(&r);
  const char *keys[] = {"entries", "bytes", "max_bytes", "hits", "misses", "coalesced", "compiles",
                        "compile_failures", "evictions", "corrupt_blobs", "compile_seconds",
                        "compile_seconds_saved", "requests", "invalid_requests", "uptime_seconds",
                        "queue_depth", "running_jobs", "workers", "remote_hits", "negative_hits"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) num(j, keys[i]);
  ck_assert(num(j, "hits") == 30 && num(j, "misses") == 8 && num(j, "coalesced") == 2);
  ck_assert(num(j, "compile_failures") == 1 && num(j, "remote_hits") == 0);
  ck_assert(num(j, "compile_seconds_saved") == 12.25);
  ck_assert_str_eq(str(j, "version"), "0.1.0-fake");
  ck_assert(fabs(num(j, "hit_rate") - 32.0 / 40.0) < 1e-12);
  cJSON_Delete(j);
  result_free(&r);

  r = TCCTL("stats");
  expect_ok(&r);
  ck_assert_msg(has_line(r.out, "hits                 30\n"), "%s", r.out);
  ck_assert(has_line(r.out, "entries              1\n"));
  ck_assert(has_line(r.out, "hit rate             80.0 %\n"));
  ck_assert(has_line(r.out, "uptime               1h02m05s\n"));
  ck_assert(has_line(r.out, "max bytes            1.0 GiB (1073741824 bytes, "));
  ck_assert(has_line(r.out, "compile time saved   12.250 s\n"));
  result_free(&r);

  /* Global options after the command work too. */
  r = tcctl_at(NULL, NULL, "stats", "--json", "--addr", fake->addr, (char *)NULL);
  expect_ok(&r);
  j = parse_json(&r);
  ck_assert(num(j, "entries") == 1);
  cJSON_Delete(j);
  result_free(&r);
  stop_fake();
}
END_TEST

START_TEST(compile) {
  start_fake();
  run_result r = TCCTL("--json", "compile", SIN_COS);
  expect_ok(&r);
  cJSON *j = parse_json(&r);
  ck_assert_str_eq(str(j, "guard_hash"), GUARD);
  ck_assert_str_eq(str(j, "cache"), "miss");
  ck_assert_str_eq(str(j, "artifact_sha256"), fake_tccd_artifact_sha(fake));
  ck_assert(num(j, "artifact_size") == (double)so_len);
  ck_assert(num(j, "kernels") == 1);
  ck_assert_str_eq(str(j, "artifact_kind"), "shared_object");
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "timings");
  ck_assert(num(t, "compile_ms") == 42.5 && num(t, "total_ms") == 43 && num(t, "hash_ms") == 0);
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "manifest");
  ck_assert_str_eq(str(m, "entry"), "tcc_entry");
  cJSON_Delete(j);
  result_free(&r);
  char target[128];
  fake_tccd_last_target(fake, target, sizeof target);
  ck_assert_str_eq(target, "cpu:x86-64-v2"); /* from the file */

  /* Human form, from stdin, with the target overridden. */
  r = tcctl_at(fake->addr, SIN_COS, "compile", "-", "--target", "cpu:x86-64-v3", (char *)NULL);
  expect_ok(&r);
  ck_assert(has_line(r.out, "guard hash           " GUARD "\n"));
  ck_assert(has_line(r.out, "cache                hit\n"));
  ck_assert(has_line(r.out, "kernels              1\n"));
  ck_assert(has_line(r.out, "timings              decode 0.250 ms, hash 0.000 ms, lookup 0.000 ms, "
                            "compile 0.000 ms, total 43.000 ms\n"));
  result_free(&r);
  fake_tccd_last_target(fake, target, sizeof target);
  ck_assert_str_eq(target, "cpu:x86-64-v3");
  r = TCCTL("--json", "compile", "--target=cuda:sm_90", SIN_COS);
  expect_ok(&r);
  result_free(&r);
  fake_tccd_last_target(fake, target, sizeof target);
  ck_assert_str_eq(target, "cuda:sm_90");

  /* A bad file: the JSON path in the message, exit 1. */
  char bad[512];
  snprintf(bad, sizeof bad, "%s/bad.json", tu_tmpdir());
  FILE *f = fopen(bad, "w");
  fputs("{\"graph\": {\"values\": [{}, {}, {\"meta\": {\"sizes\": [2.5]}}]}}", f);
  fclose(f);
  r = TCCTL("compile", bad);
  ck_assert_int_eq(r.status, 1);
  char want[1024];
  snprintf(want, sizeof want,
           "tcctl: compile: INVALID_ARGUMENT: %s: graph.values[2].meta.sizes[0]: not an integer: 2.5\n", bad);
  ck_assert_str_eq(r.err, want);
  result_free(&r);
  unlink(bad);
  r = TCCTL("compile", "/nonexistent/req.json");
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "tcctl: compile: NOT_FOUND: cannot read /nonexistent/req.json: No such file or directory\n");
  result_free(&r);
  r = TCCTL("compile", SIN_COS, "--target", "tpu");
  ck_assert_int_eq(r.status, 2);
  result_free(&r);
  ck_assert_int_eq(fake->compile_calls, 3);
  stop_fake();
}
END_TEST

START_TEST(ls_show_evict) {
  start_fake();
  run_result r = TCCTL("--json", "ls", "--limit", "5", "--order", "hits");
  expect_ok(&r);
  ck_assert_int_eq(fake->last_list_limit, 5);
  cJSON *j = parse_json(&r);
  const cJSON *entries = cJSON_GetObjectItemCaseSensitive(j, "entries");
  ck_assert_int_eq(cJSON_GetArraySize(entries), 1);
  const cJSON *e = cJSON_GetArrayItem(entries, 0);
  ck_assert_str_eq(str(e, "guard_hash"), GUARD);
  ck_assert_str_eq(str(e, "kind"), "SHARED_OBJECT");
  ck_assert(num(e, "hits") == 3 && num(e, "size") == (double)so_len && num(e, "last_used_unix") == 1700000600);
  cJSON_Delete(j);
  result_free(&r);

  r = TCCTL("ls");
  expect_ok(&r);
  /* Header and one row, columns aligned (numbers to the right). */
  char size[32], head[256], line[256];
  snprintf(size, sizeof size, "%.1f KiB", so_len / 1024.0);
  int w = strlen(size) > 4 ? (int)strlen(size) : 4;
  snprintf(head, sizeof head, "HASH          TARGET         %*s  HITS  COMPILE_MS  LAST_USED\n", w, "SIZE");
  snprintf(line, sizeof line, "5eed5eed0011  cpu:x86-64-v2  %*s     3       123.5  ", w, size);
  ck_assert_msg(has_line(r.out, head), "%s", r.out);
  ck_assert_msg(has_line(r.out, line), "%s", r.out);
  const char *row = strchr(r.out, '\n') + 1;
  ck_assert_int_eq(strstr(row, "  20") + 2 - row, strstr(r.out, "LAST_USED") - r.out);
  ck_assert(!strchr(strchr(row, '\n') + 1, '\n')); /* exactly one entry */
  result_free(&r);
  r = TCCTL("ls", "--order", "size_desc");
  ck_assert_int_eq(r.status, 2);
  ck_assert_msg(strstr(r.err, "--order must be") && strstr(r.err, "\nTry 'tcctl help' (or 'tcctl help ls').\n") &&
                    !strstr(r.err, "usage: tcctl"), "%s", r.err); /* one line and a hint, not the whole text */
  result_free(&r);

  /* show by a prefix, human and JSON. */
  r = TCCTL("show", "5eed5eed0011");
  expect_ok(&r);
  ck_assert(has_line(r.out, "guard hash           " GUARD "\n"));
  ck_assert(has_line(r.out, "entry                tcc_entry (abi 1)\n"));
  ck_assert(has_line(r.out, "inputs               float32 [257] strides [1]\n"));
  ck_assert(has_line(r.out, "  k0_sin_cos_add  pointwise"));
  result_free(&r);
  r = TCCTL("--json", "show", GUARD);
  expect_ok(&r);
  j = parse_json(&r);
  ck_assert_str_eq(str(cJSON_GetObjectItemCaseSensitive(j, "entry"), "guard_hash"), GUARD);
  ck_assert_str_eq(str(cJSON_GetObjectItemCaseSensitive(j, "manifest"), "entry"), "tcc_entry");
  ck_assert_str_eq(str(j, "canonical_key"), "Y2Fub25pY2Fs"); /* base64("canonical") */
  cJSON_Delete(j);
  result_free(&r);
  r = TCCTL("show", "beef");
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "tcctl: show: NOT_FOUND: no cache entry or recorded failure matches 'beef'\n");
  result_free(&r);
  r = TCCTL("show", "0000000000112233445566778899aabbccddeeff00112233445566778899aabb");
  ck_assert_int_eq(r.status, 1);
  ck_assert_str_eq(r.err, "tcctl: show: NOT_FOUND: no cache entry "
                          "0000000000112233445566778899aabbccddeeff00112233445566778899aabb\n");
  result_free(&r);
  r = TCCTL("show", "xyz!");
  ck_assert_int_eq(r.status, 1);
  ck_assert(strstr(r.err, "tcctl: show: INVALID_ARGUMENT: ") == r.err);
  result_free(&r);
  r = TCCTL("show");
  ck_assert_int_eq(r.status, 2);
  result_free(&r);

  r = TCCTL("evict", "5eed");
  expect_ok(&r);
  ck_assert_str_eq(r.out, "evicted " GUARD "\n");
  result_free(&r);
  r = TCCTL("evict", GUARD);
  ck_assert_int_eq(r.status, 1);
  ck_assert(strstr(r.err, "tcctl: evict: NOT_FOUND: ") == r.err);
  result_free(&r);
  stop_fake();
}
END_TEST

START_TEST(fetch_gc_health) {
  start_fake();
  char out[512];
  snprintf(out, sizeof out, "%s/kernel.so", tu_tmpdir());
  run_result r = TCCTL("fetch", "5eed5eed", out);
  expect_ok(&r);
  size_t len;
  char *data = tt_read_file(out, &len);
  ck_assert(data && len == so_len && memcmp(data, so, len) == 0);
  free(data);
  char want[1024];
  snprintf(want, sizeof want, "wrote %s: ", out);
  ck_assert(!strncmp(r.out, want, strlen(want)));
  ck_assert(strstr(r.out, fake_tccd_artifact_sha(fake)) != NULL);
  result_free(&r);
  unlink(out);

  r = TCCTL("--json", "fetch", "--digest", fake_tccd_artifact_sha(fake), out);
  expect_ok(&r);
  cJSON *j = parse_json(&r);
  ck_assert(num(j, "size") == (double)so_len);
  ck_assert_str_eq(str(j, "path"), out);
  cJSON_Delete(j);
  result_free(&r);
  ck_assert_int_eq(access(out, R_OK), 0);
  unlink(out);

  /* fetch to stdout: the bytes on stdout, the report on stderr. */
  r = TCCTL("fetch", GUARD, "-");
  ck_assert_int_eq(r.status, 0);
  ck_assert(!memcmp(r.out, so, 64)); /* the ELF header at least (the file is binary) */
  ck_assert(!strncmp(r.err, "wrote -: ", 9));
  result_free(&r);

  r = TCCTL("gc", "--max-bytes", "1G");
  expect_ok(&r);
  ck_assert_int_eq(fake->last_gc_max_bytes, 1073741824);
  ck_assert_str_eq(r.out, "evicted 2 entries, freed 2.0 KiB (2048 bytes), removed 0 corrupt blobs\n");
  result_free(&r);
  r = TCCTL("--json", "gc");
  expect_ok(&r);
  ck_assert_int_eq(fake->last_gc_max_bytes, 0);
  j = parse_json(&r);
  ck_assert(num(j, "evicted") == 2 && num(j, "freed_bytes") == 2048 && num(j, "corrupt_removed") == 0);
  cJSON_Delete(j);
  result_free(&r);
  r = TCCTL("gc", "--max-bytes", "2GiB"); /* the grammar tccd's flags take (tcc_units.h) */
  expect_ok(&r);
  ck_assert_int_eq(fake->last_gc_max_bytes, 2147483648LL);
  result_free(&r);
  r = TCCTL("gc", "--max-bytes", "lots");
  ck_assert_int_eq(r.status, 2);
  result_free(&r);

  r = TCCTL("health");
  expect_ok(&r);
  ck_assert_str_eq(r.out, "SERVING\n");
  result_free(&r);
  r = TCCTL("--json", "health");
  expect_ok(&r);
  j = parse_json(&r);
  ck_assert_str_eq(str(j, "status"), "SERVING");
  cJSON_Delete(j);
  result_free(&r);
  stop_fake();
}
END_TEST

/* keygen writes a key pair once; compile reports the signature, verified
 * with --trusted-keys, refused with a key that did not sign it. */
START_TEST(keygen_and_signatures) {
  char key[512], pub[520], other[512], other_pub[520];
  snprintf(key, sizeof key, "%s/k-%d", tu_tmpdir(), (int)getpid());
  snprintf(pub, sizeof pub, "%s.pub", key);
  snprintf(other, sizeof other, "%s/o-%d", tu_tmpdir(), (int)getpid());
  snprintf(other_pub, sizeof other_pub, "%s.pub", other);
  run_result r = tcctl_at(NULL, NULL, "keygen", key, (char *)NULL);
  expect_ok(&r);
  ck_assert_msg(strstr(r.out, "key id ") && strstr(r.out, "--signing-key"), "%s", r.out);
  result_free(&r);
  r = tcctl_at(NULL, NULL, "--json", "keygen", other, (char *)NULL);
  expect_ok(&r);
  cJSON *j = parse_json(&r);
  ck_assert_str_eq(str(j, "public_key"), other_pub);
  ck_assert_uint_eq(strlen(str(j, "key_id")), 16);
  cJSON_Delete(j);
  result_free(&r);
  r = tcctl_at(NULL, NULL, "keygen", key, (char *)NULL); /* never overwrites */
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "tcctl: keygen: ALREADY_EXISTS: "), "%s", r.err);
  result_free(&r);

  tcc_sign_key k;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_sign_key_load(key, &k, &err), 0);
  start_fake_signed(&k);
  r = TCCTL("--json", "compile", SIN_COS, "--trusted-keys", pub);
  expect_ok(&r);
  j = parse_json(&r);
  ck_assert_str_eq(str(j, "key_id"), k.key_id);
  ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "signature_verified")));
  cJSON_Delete(j);
  result_free(&r);
  r = TCCTL("compile", SIN_COS);
  expect_ok(&r);
  char want[128];
  snprintf(want, sizeof want, "signature            key %s, not verified (no trusted keys)\n", k.key_id);
  ck_assert_msg(has_line(r.out, want), "%s", r.out);
  result_free(&r);
  r = TCCTL("compile", SIN_COS, "--trusted-keys", other_pub);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "tcctl: compile: PERMISSION_DENIED: artifact signature invalid: "), "%s", r.err);
  ck_assert_str_eq(r.out, "");
  result_free(&r);
  stop_fake();
  tcc_sign_key_wipe(&k);
}
END_TEST

/* fetch writes nothing whose signature does not verify against the
 * trusted keys (--trusted-keys or $TCCD_TRUSTED_KEYS), by guard hash or
 * by digest, to a file or to stdout. */
static void expect_refused(run_result *r, const char *out_path, const char *what) {
  ck_assert_msg(r->status == 1, "exit %d: %s", r->status, r->err);
  ck_assert_msg(strstr(r->err, "tcctl: fetch: PERMISSION_DENIED: ") == r->err && strstr(r->err, what), "%s",
                r->err);
  ck_assert_str_eq(r->out, "");
  if (out_path) ck_assert_msg(access(out_path, F_OK) != 0, "%s was written", out_path);
  result_free(r);
}

START_TEST(fetch_verifies_signatures) {
  char key[512], pub[520], other[512], other_pub[520], out[512];
  snprintf(key, sizeof key, "%s/fk-%d", tu_tmpdir(), (int)getpid());
  snprintf(pub, sizeof pub, "%s.pub", key);
  snprintf(other, sizeof other, "%s/fo-%d", tu_tmpdir(), (int)getpid());
  snprintf(other_pub, sizeof other_pub, "%s.pub", other);
  snprintf(out, sizeof out, "%s/fetched.so", tu_tmpdir());
  tcc_error err = {0};
  ck_assert_int_eq(tcc_sign_keygen(key, NULL, &err), 0);
  ck_assert_int_eq(tcc_sign_keygen(other, NULL, &err), 0);
  tcc_sign_key k;
  ck_assert_int_eq(tcc_sign_key_load(key, &k, &err), 0);
  start_fake_signed(&k);
  const char *sha = fake_tccd_artifact_sha(fake);

  /* a key that did not sign it: refused, nothing written */
  run_result r = TCCTL("fetch", GUARD, out, "--trusted-keys", other_pub);
  expect_refused(&r, out, "not trusted");
  setenv("TCCD_TRUSTED_KEYS", other_pub, 1);
  r = TCCTL("fetch", "5eed5eed", out);
  expect_refused(&r, out, "not trusted");
  r = TCCTL("fetch", "--digest", sha, out);
  expect_refused(&r, out, "not trusted");
  r = TCCTL("fetch", GUARD, "-");
  expect_refused(&r, NULL, "not trusted");
  unsetenv("TCCD_TRUSTED_KEYS");
  /* the signer's key: written */
  r = TCCTL("fetch", GUARD, out, "--trusted-keys", pub);
  expect_ok(&r);
  result_free(&r);
  ck_assert_int_eq(unlink(out), 0);
  r = TCCTL("--json", "fetch", "--digest", sha, out, "--trusted-keys", pub);
  expect_ok(&r);
  cJSON *j = parse_json(&r);
  ck_assert_str_eq(str(j, "artifact_sha256"), sha);
  cJSON_Delete(j);
  result_free(&r);
  ck_assert_int_eq(unlink(out), 0);
  /* altered on the way, or sent without its signature: refused */
  fake->tamper_fetch_signature = 1;
  r = TCCTL("fetch", GUARD, out, "--trusted-keys", pub);
  expect_refused(&r, out, "does not verify");
  fake->tamper_fetch_signature = 0;
  fake->fetch_unsigned = 1;
  r = TCCTL("fetch", GUARD, out, "--trusted-keys", pub);
  expect_refused(&r, out, "sent no signature");
  fake->fetch_unsigned = 0;
  /* --digest of an artifact no entry has: nothing to verify it with */
  r = TCCTL("fetch", "--digest", "00000000000000000000000000000000000000000000000000000000000000aa", out,
            "--trusted-keys", pub);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "tcctl: fetch: NOT_FOUND: no cache entry has artifact"), "%s", r.err);
  result_free(&r);
  stop_fake();

  /* an unsigned entry with trusted keys */
  start_fake();
  r = TCCTL("fetch", GUARD, out, "--trusted-keys", pub);
  expect_refused(&r, out, "artifact is unsigned and TCCD_TRUSTED_KEYS is set");
  stop_fake();
  tcc_sign_key_wipe(&k);
}
END_TEST

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A bad address is a usage error (exit 2) naming it, from --addr or
 * $TCCD_ADDR, before anything is dialed; keygen needs none. */
START_TEST(bad_addresses_are_usage_errors) {
  static const struct {
    const char *addr, *msg;
  } bad[] = {
      {"127.0.0.1:99999", "tcctl: --addr: tccd address '127.0.0.1:99999': port 99999 is out of range (1-65535)\n"},
      {"garbage", "tcctl: --addr: tccd address 'garbage': the port is missing"},
      {"::1:7311", "tcctl: --addr: tccd address '::1:7311': an IPv6 address goes in brackets"},
      {"bad host:1", "tcctl: --addr: tccd address 'bad host:1': spaces, control or non-ASCII"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    run_result r = tcctl_at(bad[i].addr, NULL, "stats", (char *)NULL);
    ck_assert_msg(r.status == 2, "%s: exit %d", bad[i].addr, r.status);
    ck_assert_msg(!strncmp(r.err, bad[i].msg, strlen(bad[i].msg)), "%s: %s", bad[i].addr, r.err);
    ck_assert(strstr(r.err, "\nTry 'tcctl help'."));
    ck_assert_str_eq(r.out, "");
    result_free(&r);
  }
  setenv("TCCD_ADDR", "127.0.0.1:70000", 1);
  run_result r = tcctl_at(NULL, NULL, "health", (char *)NULL);
  ck_assert_int_eq(r.status, 2);
  const char *want = "tcctl: TCCD_ADDR: tccd address '127.0.0.1:70000': port 70000 is out of range";
  ck_assert_msg(!strncmp(r.err, want, strlen(want)), "%s", r.err);
  result_free(&r);
  char key[512];
  snprintf(key, sizeof key, "%s/addr-k-%d", tu_tmpdir(), (int)getpid());
  r = tcctl_at(NULL, NULL, "keygen", key, (char *)NULL);
  expect_ok(&r);
  result_free(&r);
  unsetenv("TCCD_ADDR");
  /* --addr wins over a bad $TCCD_ADDR; good forms pass the check */
  setenv("TCCD_ADDR", "garbage", 1);
  r = tcctl_at("[::1]:1", NULL, "--connect-timeout-ms", "10000", "health", (char *)NULL);
  unsetenv("TCCD_ADDR");
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "tcctl: health: UNAVAILABLE: cannot reach tccd at [::1]:1: ") == r.err, "%s", r.err);
  result_free(&r);
}
END_TEST

START_TEST(usage_and_unreachable) {
  run_result r = tcctl_at(NULL, NULL, (char *)NULL);
  ck_assert_int_eq(r.status, 2);
  ck_assert_str_eq(r.err, "tcctl: no command given\nTry 'tcctl help'.\n");
  result_free(&r);
  r = tcctl_at(NULL, NULL, "frobnicate", (char *)NULL);
  ck_assert_int_eq(r.status, 2);
  ck_assert(!strncmp(r.err, "tcctl: unknown command 'frobnicate'\n", 36));
  result_free(&r);
  r = tcctl_at(NULL, NULL, "--help", (char *)NULL);
  ck_assert_int_eq(r.status, 0);
  ck_assert(strstr(r.out, "usage: tcctl") == r.out && strstr(r.out, "fetch [--digest] HASH OUT"));
  result_free(&r);
  r = tcctl_at(NULL, NULL, "help", (char *)NULL);
  ck_assert_int_eq(r.status, 0);
  result_free(&r);
  r = tcctl_at(NULL, NULL, "--deadline-ms", "soon", "stats", (char *)NULL);
  ck_assert_int_eq(r.status, 2);
  result_free(&r);

  /* Nothing listening: UNAVAILABLE, exit 1, at once (not after the
   * connect timeout: the connection is refused). The timeout is long and
   * the bound half of it, so that tcctl's own start-up under valgrind on
   * a loaded machine (6-10 s seen) cannot pass for waiting it out. */
  double t0 = now_s();
  r = tcctl_at("127.0.0.1:1", NULL, "--connect-timeout-ms", "60000", "stats", (char *)NULL);
  double dt = now_s() - t0;
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(dt < 30.0, "a refused connection took %.2f s (timeout 60 s)", dt);
  ck_assert_msg(!strncmp(r.err, "tcctl: stats: UNAVAILABLE: cannot reach tccd at 127.0.0.1:1: ", 61), "%s", r.err);
  ck_assert_str_eq(r.out, "");
  result_free(&r);
  /* $TCCD_ADDR is the default address. */
  setenv("TCCD_ADDR", "127.0.0.1:1", 1);
  r = tcctl_at(NULL, NULL, "--connect-timeout-ms", "200", "health", (char *)NULL);
  unsetenv("TCCD_ADDR");
  ck_assert_int_eq(r.status, 1);
  ck_assert(strstr(r.err, "tcctl: health: UNAVAILABLE: cannot reach tccd at 127.0.0.1:1") == r.err);
  result_free(&r);
}
END_TEST

int main(void) {
  tt_seed("test_tcctl");
  int rc = tt_run_tests("tcctl", 120, 0, (const TTest *[]){
      stats,
      compile,
      ls_show_evict,
      fetch_gc_health,
      usage_and_unreachable,
      keygen_and_signatures,
      fetch_verifies_signatures,
      bad_addresses_are_usage_errors,
      NULL});
  rmdir(tu_tmpdir());
  return rc;
}
