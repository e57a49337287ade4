/*
 * tcctl.c — the operator's command line for tccd, a thin layer over
 * libtccclient.
 *
 *   tcctl [--addr HOST:PORT] [--json] [--deadline-ms N]
 *         [--connect-timeout-ms N] COMMAND [ARGS]
 *
 * Global options may come before or after the command. Output: aligned
 * human tables by default; with --json, one JSON document on stdout with
 * snake_case keys, numbers as plain JSON numbers and every field present
 * (zeros included). Exit status: 0 success, 1 failure (the message
 * "tcctl: COMMAND: STATUS_NAME: message" on stderr), 2 usage error.
 *
 * A HASH argument (show, evict, fetch) may be a unique prefix of at least
 * 4 hex digits, as `ls` prints 12; it is resolved with two List calls
 * (the entries and the recorded failures).
 *
 * A usage error prints one line and a hint ("Try 'tcctl help'"), never
 * the whole text; `tcctl help COMMAND` and `tcctl COMMAND --help` print
 * that command's lines of usage_text (found by its name there: one copy).
 *
 * The address (--addr, else $TCCD_ADDR) is checked by libtccclient's
 * tcc_client_addr_check before any command runs: a bad one is a usage
 * error. With trusted keys (--trusted-keys, $TCCD_TRUSTED_KEYS), compile
 * and fetch write nothing whose signature does not verify (fetch --digest
 * goes through the cache entry that has the artifact, whose signature
 * covers it).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pbjson.h"
#include "tcc_config.h"
#include "tcc_target.h"
#include "tccclient.h"
#include "tcc_units.h"

#define JSON_FLAGS (TCC_PBJSON_ORIGINAL_NAMES | TCC_PBJSON_INT64_AS_NUMBER | TCC_PBJSON_EMIT_DEFAULTS)
#define LIST_ALL 100000 /* entries asked for when resolving a hash prefix */

static const char usage_text[] =
    "usage: tcctl [--addr HOST:PORT] [--json] [--deadline-ms N] [--connect-timeout-ms N]\n"
    "             COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  health [SERVICE]             is tccd serving? (exit 0 when SERVING);\n"
    "                               then the daemon's warnings, if any\n"
    "  stats [--zero]               cache and compile counters; --zero: print\n"
    "                               them, then restart them from 0 (admin)\n"
    "  ls [--limit N] [--order last_used|hits|size|created] [--failures]\n"
    "                               cache entries, most recent first;\n"
    "                               --failures: recorded compile failures\n"
    "  show HASH [--dot]            one cache entry, its manifest and kernels\n"
    "                               (or one recorded failure); --dot: the\n"
    "                               kernel grouping as Graphviz\n"
    "  evict HASH                   remove one cache entry or recorded failure\n"
    "                               (and its shared copy when tccd uses --redis)\n"
    "  gc [--max-bytes N]           evict down to N bytes (K/M/G suffixes;\n"
    "                               default: the daemon's --cache-max-bytes)\n"
    "  clear [--yes] [--tuning]     remove every cache entry and recorded\n"
    "                               failure (admin; asks first unless --yes);\n"
    "                               --tuning: the tuning records too; never\n"
    "                               the shared --redis tier\n"
    "  compile FILE [--target T]    compile a tcc.v1.CompileRequest in protobuf\n"
    "                               JSON form (FILE - = stdin); T = cpu,\n"
    "                               cpu:ISA[+FEATURE...] (x86-64-v3, ...) or\n"
    "                               cuda:sm_XX\n"
    "  fetch [--digest] HASH OUT    write the verified artifact of an entry\n"
    "                               (HASH = guard hash; --digest: artifact\n"
    "                               SHA-256) to OUT (- = stdout); with trusted\n"
    "                               keys, only if its signature verifies\n"
    "  explain HASH|FILE [--target T] [--max N]\n"
    "                               why a key missed: the nearest keys stored\n"
    "                               for the same graph and what differs (HASH:\n"
    "                               an entry, a recorded failure or a recent\n"
    "                               miss; FILE: a request, as compile takes)\n"
    "  keygen OUT                   make an Ed25519 signing key pair: OUT\n"
    "                               (secret, mode 0600) and OUT.pub\n"
    "  warm --target T [--from-target S] [--since DURATION] [--limit N]\n"
    "                               compile the cached graphs for another\n"
    "                               target (admin; T, S: cpu:ISA, cuda:sm_XX):\n"
    "                               those of S only, stored in the last\n"
    "                               DURATION (90m, 12h, 7d), the newest N;\n"
    "                               one at a time while a worker is idle;\n"
    "                               prints progress and waits for the end\n"
    "  warm --id ID                 follow warm run ID; with --no-wait (both\n"
    "                               forms): print where it is and return\n"
    "  jobs                         the compiles in flight\n"
    "  ops [--device cpu|cuda]      the ops and dtypes tccd compiles (default cpu)\n"
    "  help [COMMAND]               this text, or one command's\n"
    "\n"
    "options:\n"
    "  --addr HOST:PORT             tccd address (default $TCCD_ADDR, else " TCC_DEFAULT_ADDR ");\n"
    "                               also [IPV6]:PORT or unix:PATH\n"
    "  --json                       machine-readable JSON on stdout\n"
    "  --deadline-ms N              per-call deadline (default 60000)\n"
    "  --connect-timeout-ms N       how long to wait for tccd (default 5000)\n"
    "  --trusted-keys F1[,F2...]    verify artifact signatures with these .pub\n"
    "                               files (default $TCCD_TRUSTED_KEYS)\n"
    "  --token-file FILE            send the bearer token in FILE (default\n"
    "                               $TCCD_TOKEN)\n"
    "  --tls-ca FILE                use TLS, trusting this PEM CA ($TCCD_TLS_CA)\n"
    "  --tls-cert FILE --tls-key FILE\n"
    "                               client certificate for mTLS ($TCCD_TLS_CERT,\n"
    "                               $TCCD_TLS_KEY)\n"
    "  --version                    print the version\n"
    "\n"
    "HASH may be a unique prefix (at least 4 hex digits) of a guard hash.\n"
    "Exit status: 0 ok, 1 failure, 2 usage error.\n";

/* Everything a command needs: the parsed global options and its args. */
typedef struct tcctl {
  const char *addr;
  int json;
  int deadline_ms;
  int connect_timeout_ms;
  const char *trusted_keys;   /* NULL: $TCCD_TRUSTED_KEYS */
  const char *token_file;     /* NULL: $TCCD_TOKEN */
  const char *tls_ca, *tls_cert, *tls_key; /* NULL: $TCCD_TLS_* */
  const char *command;
  int argc;          /* the command's own arguments */
  char **argv;
  tcc_client *client;
  tcc_error err;
} tcctl;

/* ------------------------------------------------------------ exits */

/* The command being run, once main knows it (for the usage hint). */
static const char *usage_command;

/* Prints command's lines of usage_text ("  NAME ..." and the indented
 * lines under it) to f. Returns 0, or -1 when the text has none. */
static int print_command_usage(const char *command, FILE *f) {
  static const char head[] = "\ncommands:\n";
  size_t n = strlen(command);
  const char *line = strstr(usage_text, head);
  int found = 0, printing = 0;
  for (line = line ? line + strlen(head) : ""; *line && *line != '\n';) { /* to the blank line */
    size_t len = strcspn(line, "\n") + 1;
    if (line[2] != ' ') /* "  NAME ...": a command's first line; its others are indented further */
      printing = !strncmp(line + 2, command, n) && (line[2 + n] == ' ' || line[2 + n] == '\n');
    if (printing) {
      fwrite(line, 1, len, f);
      found = 1;
    }
    line += len;
  }
  return found ? 0 : -1;
}

__attribute__((format(printf, 1, 2), noreturn))
static void usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("tcctl: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (usage_command) fprintf(stderr, "\nTry 'tcctl help' (or 'tcctl help %s').\n", usage_command);
  else fputs("\nTry 'tcctl help'.\n", stderr);
  exit(2);
}

/* Prints "tcctl: COMMAND: STATUS: message" and returns exit status 1. */
static int fail(const tcctl *t, int code, const char *msg) {
  fprintf(stderr, "tcctl: %s: %s: %s\n", t->command, tcc_status_name(code), msg);
  return 1;
}

/* fail with t->err; a daemon's answer adds " (request id ID)", the key to
 * the daemon's log lines about the call. */
static int fail_err(const tcctl *t) {
  int code = t->err.code ? t->err.code : TCC_E_UNKNOWN;
  if (!t->err.request_id[0]) return fail(t, code, t->err.msg);
  char msg[TCC_ERROR_MSG_MAX + TCC_REQUEST_ID_MAX + 16];
  snprintf(msg, sizeof msg, "%s (request id %s)", t->err.msg, t->err.request_id);
  return fail(t, code, msg);
}

__attribute__((format(printf, 3, 4)))
static int failf(const tcctl *t, int code, const char *fmt, ...) {
  char msg[TCC_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fail(t, code, msg);
}

/* ------------------------------------------------------------ parsing */

/* Parses a non-negative decimal int; exits with a usage error if bad. */
static long long parse_count(const char *opt, const char *s, long long max) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < 0 || v > max) usage_error("%s needs a number from 0 to %lld, got '%s'", opt, max, s);
  return v;
}

/* Parses a byte count (tcc_units.h: 1073741824, 1G, 1GiB, 1.5G). */
static int64_t parse_bytes(const char *opt, const char *s) {
  int64_t v;
  if (tcc_parse_bytes(s, &v) != 0) usage_error("%s needs a byte count like 1073741824, 1G or 1GiB, got '%s'", opt, s);
  return v;
}

/* Takes the value of option `name` at argv[*i] ("--name V" or
 * "--name=V"); returns NULL when argv[*i] is not that option. */
static const char *option_value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != '\0') return NULL;
  if (*i + 1 >= argc) usage_error("%s needs a value", name);
  return argv[++*i];
}

/* Splits a command's arguments into options (handled by on_option, which
 * returns 0 when it does not know one) and positionals. */
typedef int (*option_fn)(tcctl *t, int argc, char **argv, int *i, void *ctx);

static int split_args(tcctl *t, option_fn on_option, void *ctx, char **pos, int max_pos) {
  int n = 0, options_done = 0;
  for (int i = 0; i < t->argc; i++) {
    char *a = t->argv[i];
    if (!options_done && !strcmp(a, "--")) {
      options_done = 1;
      continue;
    }
    if (!options_done && a[0] == '-' && a[1] != '\0') {
      if (!on_option || !on_option(t, t->argc, t->argv, &i, ctx))
        usage_error("%s: unknown option '%s'", t->command, a);
      continue;
    }
    if (n == max_pos) usage_error("%s: unexpected argument '%s'", t->command, a);
    pos[n++] = a;
  }
  return n;
}

/* ------------------------------------------------------------ formatting */

/* "0 B", "512 B", "1.5 KiB", "12.3 MiB", ... */
static const char *human_bytes(int64_t n, char *buf, size_t size) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)n;
  int u = 0;
  while (fabs(v) >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  if (u == 0) snprintf(buf, size, "%" PRId64 " B", n);
  else snprintf(buf, size, "%.1f %s", v, units[u]);
  return buf;
}

/* Local time "YYYY-MM-DD HH:MM:SS", or "-" for 0. */
static const char *human_time(int64_t unix_s, char *buf, size_t size) {
  if (unix_s <= 0) {
    snprintf(buf, size, "-");
    return buf;
  }
  time_t tt = (time_t)unix_s;
  struct tm tm;
  localtime_r(&tt, &tm);
  strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

/* "3d04h05m06s" / "1h02m05s" / "5m03s" / "42s". */
static const char *human_duration(int64_t s, char *buf, size_t size) {
  int64_t d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60, sec = s % 60;
  if (d) snprintf(buf, size, "%" PRId64 "d%02" PRId64 "h%02" PRId64 "m%02" PRId64 "s", d, h, m, sec);
  else if (h) snprintf(buf, size, "%" PRId64 "h%02" PRId64 "m%02" PRId64 "s", h, m, sec);
  else if (m) snprintf(buf, size, "%" PRId64 "m%02" PRId64 "s", m, sec);
  else snprintf(buf, size, "%" PRId64 "s", sec);
  return buf;
}

/* An enum value's name from its descriptor ("SHARED_OBJECT"), or its number. */
static const char *enum_name(const ProtobufCEnumDescriptor *d, int v, char *buf, size_t size) {
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);
  if (ev) return ev->name;
  snprintf(buf, size, "%d", v);
  return buf;
}

static const char *cache_status_word(Tcc__V1__CacheStatus s) {
  switch (s) {
  case TCC__V1__CACHE_STATUS__MISS: return "miss";
  case TCC__V1__CACHE_STATUS__HIT: return "hit";
  case TCC__V1__CACHE_STATUS__COALESCED: return "coalesced";
  case TCC__V1__CACHE_STATUS__REMOTE_HIT: return "remote_hit";
  default: return "unspecified";
  }
}

static void lowercase(char *s) {
  for (; *s; s++)
    if (*s >= 'A' && *s <= 'Z') *s = (char)(*s - 'A' + 'a');
}

/* "float32 [10, 10] strides [10, 1]" (+ " offset N"). */
static void format_meta(const Tcc__V1__TensorMeta *m, char *buf, size_t size) {
  char dt[32], num[16];
  snprintf(dt, sizeof dt, "%s", enum_name(&tcc__v1__dtype__descriptor, m->dtype, num, sizeof num));
  lowercase(dt);
  size_t n = (size_t)snprintf(buf, size, "%s [", dt);
  for (size_t i = 0; i < m->n_sizes && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, i ? ", " : "", m->sizes[i]);
  if (n < size) n += (size_t)snprintf(buf + n, size - n, "] strides [");
  for (size_t i = 0; i < m->n_strides && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, i ? ", " : "", m->strides[i]);
  if (n < size) n += (size_t)snprintf(buf + n, size - n, "]");
  if (m->storage_offset && n < size) snprintf(buf + n, size - n, " offset %" PRId64, m->storage_offset);
}

/* One "label  value" line of a key-value listing. */
__attribute__((format(printf, 2, 3)))
static void kv(const char *label, const char *fmt, ...) {
  va_list ap;
  printf("%-20s ", label);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
}

/* A table of strings printed with aligned columns (right-aligned where
 * right[c] is set). */
#define TABLE_MAX_COLS 8
typedef struct table {
  int cols;
  int right[TABLE_MAX_COLS];
  char **cells; /* rows * cols, malloc'd strings */
  int rows, cap;
} table;

static void table_add(table *tb, const char *const *row) {
  if (tb->rows == tb->cap) {
    tb->cap = tb->cap ? tb->cap * 2 : 16;
    tb->cells = realloc(tb->cells, sizeof(char *) * (size_t)tb->cap * (size_t)tb->cols);
    if (!tb->cells) {
      perror("tcctl");
      exit(1);
    }
  }
  for (int c = 0; c < tb->cols; c++) tb->cells[tb->rows * tb->cols + c] = strdup(row[c]);
  tb->rows++;
}

static void table_print(table *tb, const char *indent) {
  size_t w[TABLE_MAX_COLS] = {0};
  for (int r = 0; r < tb->rows; r++)
    for (int c = 0; c < tb->cols; c++) {
      size_t n = strlen(tb->cells[r * tb->cols + c]);
      if (n > w[c]) w[c] = n;
    }
  for (int r = 0; r < tb->rows; r++) {
    fputs(indent, stdout);
    for (int c = 0; c < tb->cols; c++) {
      const char *cell = tb->cells[r * tb->cols + c];
      int last = c == tb->cols - 1;
      if (tb->right[c]) printf("%*s", (int)w[c], cell);
      else if (last) fputs(cell, stdout);
      else printf("%-*s", (int)w[c], cell);
      if (!last) fputs("  ", stdout);
    }
    putchar('\n');
  }
  for (int i = 0; i < tb->rows * tb->cols; i++) free(tb->cells[i]);
  free(tb->cells);
}

/* Prints a cJSON document (pretty) and frees it. Returns 0 or 1. */
static int print_json(const tcctl *t, cJSON *doc) {
  char *s = doc ? tcc_pbjson_print_cjson(doc, 1) : NULL;
  cJSON_Delete(doc);
  if (!s) return fail(t, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  puts(s);
  free(s);
  return 0;
}

/* A message as the --json form (snake_case, numbers, defaults). */
static cJSON *message_json(const void *m) { return tcc_pbjson_to_cjson(m, JSON_FLAGS); }

/* ------------------------------------------------------------ connection */

/* Reads the token of --token-file (its first line, surrounding blanks
 * removed) into buf. Returns 0 or a TCC_E_* code in t->err. */
static int read_token_file(tcctl *t, char *buf, size_t size) {
  FILE *f = fopen(t->token_file, "r");
  if (!f)
    return tcc_error_set(&t->err, errno == ENOENT ? TCC_E_NOT_FOUND : TCC_E_PERMISSION_DENIED,
                         "--token-file %s: %s", t->token_file, strerror(errno));
  char *line = fgets(buf, (int)size, f);
  fclose(f);
  if (!line) buf[0] = '\0';
  size_t start = strspn(buf, " \t");
  memmove(buf, buf + start, strlen(buf + start) + 1);
  size_t n = strcspn(buf, " \t\r\n");
  buf[n] = '\0';
  if (n == 0) return tcc_error_set(&t->err, TCC_E_INVALID_ARGUMENT, "--token-file %s is empty", t->token_file);
  return 0;
}

static int connect_client_to(tcctl *t, tcc_client **out, tcc_error *err) {
  tcc_client_options opts = {.deadline_ms = t->deadline_ms,
                             .connect_timeout_ms = t->connect_timeout_ms,
                             .trusted_keys = t->trusted_keys,
                             .tls_ca = t->tls_ca,
                             .tls_cert = t->tls_cert,
                             .tls_key = t->tls_key};
  char token[1024];
  if (t->token_file) {
    int rc = read_token_file(t, token, sizeof token);
    if (rc) return rc;
    opts.token = token;
  }
  int rc = tcc_client_connect(t->addr, &opts, out, err);
  memset(token, 0, sizeof token);
  return rc;
}

static int connect_client(tcctl *t) { return connect_client_to(t, &t->client, &t->err); }

/* 1 when hash starts with prefix (n digits, lowercase), else 0; a match
 * is copied to out when out is still empty. */
static int count_prefix(const char *hash, const char *prefix, size_t n, char out[TCC_SHA256_HEX]) {
  if (!hash || strncmp(hash, prefix, n) != 0) return 0;
  if (!out[0]) tcc_hex_lower_copy(hash, out);
  return 1;
}

/* "1 cache entry", "2 recorded failures" */
static const char *plural(int n, const char *one, const char *many, char *buf, size_t size) {
  snprintf(buf, size, "%d %s", n, n == 1 ? one : many);
  return buf;
}

/* Resolves a guard hash argument (full, or a unique prefix of >= 4 hex
 * digits, over the entries and the recorded failures) into out. Returns
 * 0, or the exit status after printing why. */
static int resolve_hash(tcctl *t, const char *arg, char out[TCC_SHA256_HEX]) {
  size_t n = strlen(arg);
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)arg[i]))
      return failf(t, TCC_E_INVALID_ARGUMENT, "'%s' is not a hex guard hash", arg);
  if (n == 2 * TCC_SHA256_BYTES) {
    tcc_hex_lower_copy(arg, out);
    return 0;
  }
  if (n < 4 || n > 2 * TCC_SHA256_BYTES)
    return failf(t, TCC_E_INVALID_ARGUMENT, "'%s': give the 64-digit guard hash or a prefix of at least 4 digits",
                 arg);
  char prefix[TCC_SHA256_HEX];
  snprintf(prefix, sizeof prefix, "%s", arg);
  lowercase(prefix);
  Tcc__V1__ListResponse *ls, *lf;
  if (tcc_client_list(t->client, LIST_ALL, "last_used", &ls, &t->err)) return fail_err(t);
  if (tcc_client_list_failures(t->client, LIST_ALL, &lf, &t->err)) {
    tcc__v1__list_response__free_unpacked(ls, NULL);
    return fail_err(t);
  }
  int entries = 0, failures = 0;
  out[0] = '\0';
  for (size_t i = 0; i < ls->n_entries; i++) entries += count_prefix(ls->entries[i]->guard_hash, prefix, n, out);
  for (size_t i = 0; i < lf->n_failures; i++) failures += count_prefix(lf->failures[i]->guard_hash, prefix, n, out);
  tcc__v1__list_response__free_unpacked(ls, NULL);
  tcc__v1__list_response__free_unpacked(lf, NULL);
  if (entries + failures == 0) return failf(t, TCC_E_NOT_FOUND, "no cache entry or recorded failure matches '%s'", arg);
  if (entries + failures > 1) {
    char a[48], b[48];
    return failf(t, TCC_E_INVALID_ARGUMENT, "'%s' matches %s%s%s; give more digits", arg,
                 entries ? plural(entries, "cache entry", "cache entries", a, sizeof a) : "",
                 entries && failures ? " and " : "",
                 failures ? plural(failures, "recorded failure", "recorded failures", b, sizeof b) : "");
  }
  return 0;
}

/* Finds the cache entry whose artifact has digest sha (64 lowercase hex)
 * and copies its guard hash to out. Returns 0, or the exit status after
 * printing why. */
static int entry_of_artifact(tcctl *t, const char *sha, char out[TCC_SHA256_HEX]) {
  Tcc__V1__ListResponse *ls;
  if (tcc_client_list(t->client, LIST_ALL, "last_used", &ls, &t->err)) return fail_err(t);
  int found = 0;
  for (size_t i = 0; i < ls->n_entries && !found; i++) {
    const Tcc__V1__EntrySummary *e = ls->entries[i];
    if (e->artifact_sha256 && !strcasecmp(e->artifact_sha256, sha) && tcc_hex_is_sha256(e->guard_hash)) {
      tcc_hex_lower_copy(e->guard_hash, out);
      found = 1;
    }
  }
  tcc__v1__list_response__free_unpacked(ls, NULL);
  if (!found)
    return failf(t, TCC_E_NOT_FOUND,
                 "no cache entry has artifact %s: with trusted keys, fetch --digest verifies the signature of "
                 "the entry that has it",
                 sha);
  return 0;
}

/* ------------------------------------------------------------ health */

/* After the health check, the daemon's warnings (StatsResponse.warnings:
 * no auth beyond loopback, storing blocked, Redis disconnected) from a
 * Stats call; a Stats call that fails (a daemon with --auth-tokens and no
 * token given: Health is open, Stats is not) shows none. */
static int cmd_health(tcctl *t) {
  char *pos[1];
  int n = split_args(t, NULL, NULL, pos, 1);
  const char *service = n ? pos[0] : "";
  int status = 0;
  if (connect_client(t) || tcc_client_health(t->client, service, &status, &t->err)) return fail_err(t);
  char buf[32];
  const char *name = enum_name(&grpc__health__v1__health_check_response__serving_status__descriptor, status,
                               buf, sizeof buf);
  Tcc__V1__StatsResponse *s = NULL;
  tcc_error serr;
  if (tcc_client_stats(t->client, &s, &serr) != 0) s = NULL;
  size_t nwarn = s ? s->n_warnings : 0;
  int rc = status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : 1;
  if (t->json) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "status", name);
    cJSON_AddStringToObject(doc, "addr", tcc_client_addr(t->client));
    cJSON *arr = cJSON_AddArrayToObject(doc, "warnings");
    for (size_t i = 0; i < nwarn; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(s->warnings[i]));
    if (print_json(t, doc)) rc = 1;
  } else {
    printf("%s\n", name);
    for (size_t i = 0; i < nwarn; i++) printf("warning: %s\n", s->warnings[i]);
  }
  if (s) tcc__v1__stats_response__free_unpacked(s, NULL);
  return rc;
}

/* ------------------------------------------------------------ stats */

/* (hits + coalesced + remote hits) / all lookups that found or made a
 * kernel; negative (cached-failure) hits are not counted. <0 = none. */
static double hit_rate(const Tcc__V1__StatsResponse *s) {
  double served = (double)(s->hits + s->coalesced + s->remote_hits);
  double all = served + (double)s->misses;
  return all > 0 ? served / all : -1;
}

static int stats_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t, (void)argc;
  if (strcmp(argv[*i], "--zero")) return 0;
  *(int *)ctx = 1;
  return 1;
}

/* `stats --zero` (ZeroStats, admin) prints the statistics as they were
 * just before the counters restarted from 0, then "statistics zeroed"
 * (--json: "zeroed": true). */
static int cmd_stats(tcctl *t) {
  int zero = 0;
  split_args(t, stats_option, &zero, NULL, 0);
  Tcc__V1__StatsResponse *s;
  if (connect_client(t) ||
      (zero ? tcc_client_zero_stats(t->client, &s, &t->err) : tcc_client_stats(t->client, &s, &t->err)))
    return fail_err(t);
  double rate = hit_rate(s);
  int rc = 0;
  if (t->json) {
    cJSON *doc = message_json(s);
    if (doc) {
      if (rate >= 0) cJSON_AddNumberToObject(doc, "hit_rate", rate);
      else cJSON_AddNullToObject(doc, "hit_rate");
      if (zero) cJSON_AddBoolToObject(doc, "zeroed", 1);
    }
    rc = print_json(t, doc);
  } else {
    char a[64], b[64];
    kv("version", "%s", s->version && *s->version ? s->version : "-");
    kv("uptime", "%s", human_duration(s->uptime_seconds, a, sizeof a));
    kv("entries", "%" PRId64, s->entries);
    kv("bytes", "%s (%" PRId64 " bytes)", human_bytes(s->bytes, a, sizeof a), s->bytes);
    if (s->max_bytes > 0)
      kv("max bytes", "%s (%" PRId64 " bytes, %.1f %% used)", human_bytes(s->max_bytes, b, sizeof b), s->max_bytes,
         100.0 * (double)s->bytes / (double)s->max_bytes);
    else
      kv("max bytes", "unlimited");
    kv("requests", "%" PRId64, s->requests);
    kv("invalid requests", "%" PRId64, s->invalid_requests);
    kv("hits", "%" PRId64, s->hits);
    kv("misses", "%" PRId64, s->misses);
    kv("coalesced", "%" PRId64, s->coalesced);
    kv("remote hits", "%" PRId64, s->remote_hits);
    kv("negative hits", "%" PRId64, s->negative_hits);
    if (rate >= 0) kv("hit rate", "%.1f %%", 100.0 * rate);
    else kv("hit rate", "-");
    kv("compiles", "%" PRId64, s->compiles);
    kv("compile failures", "%" PRId64, s->compile_failures);
    kv("compile time", "%.3f s", s->compile_seconds);
    kv("compile time saved", "%.3f s", s->compile_seconds_saved);
    kv("evictions", "%" PRId64, s->evictions);
    kv("corrupt blobs", "%" PRId64, s->corrupt_blobs);
    kv("workers", "%" PRId64, s->workers);
    kv("running jobs", "%" PRId64, s->running_jobs);
    kv("queue depth", "%" PRId64, s->queue_depth);
    /* the remote (cluster) tier, then security */
    if (s->remote_enabled)
      kv("remote tier", "redis %s (%s)", s->remote_address && *s->remote_address ? s->remote_address : "?",
         s->remote_connected ? "connected" : "DISCONNECTED");
    else
      kv("remote tier", "off");
    kv("remote stores", "%" PRId64, s->remote_stores);
    kv("remote lock waits", "%" PRId64, s->remote_lock_waits);
    kv("remote rejected", "%" PRId64, s->remote_rejected);
    kv("remote errors", "%" PRId64, s->remote_errors);
    kv("signing key", "%s", s->signing_key_id && *s->signing_key_id ? s->signing_key_id : "none (--no-signing)");
    kv("auth failures", "%" PRId64, s->auth_failures);
    /* max-autotune */
    kv("autotune runs", "%" PRId64 " (%" PRId64 " tuning now)", s->autotune_runs, s->autotuning_jobs);
    kv("autotune time", "%.3f s", s->autotune_seconds);
    kv("tune candidates", "%" PRId64 " benchmarked", s->autotune_candidates);
    kv("tune discarded", "%" PRId64 " (%" PRId64 " crashed, %" PRId64 " timed out, %" PRId64 " wrong)",
       s->autotune_discarded, s->autotune_crashed, s->autotune_timeouts, s->autotune_wrong);
    kv("tuning records", "%" PRId64 " (%" PRId64 " kernel(s) reused one)", s->tuning_records,
       s->autotune_record_hits);
    kv("untuned (no usable GPU)", "%" PRId64, s->autotune_untuned);
    /* the object cache of CPU kernel bodies */
    int64_t bodies = s->object_hits + s->object_misses;
    kv("object cache", "%" PRId64 " of %" PRId64 " kernel bodies linked from it (%.1f%%)", s->object_hits, bodies,
       bodies ? 100.0 * (double)s->object_hits / (double)bodies : 0.0);
    /* plans (PutPlan/GetPlan) */
    kv("plans", "%" PRId64 " (%s), %" PRId64 " stored since the counters started", s->plans,
       human_bytes(s->plan_bytes, a, sizeof a), s->plans_stored);
    int64_t plan_gets = s->plan_hits + s->plan_misses;
    kv("plan gets", "%" PRId64 " hits, %" PRId64 " misses (%.1f%% hit)", s->plan_hits, s->plan_misses,
       plan_gets ? 100.0 * (double)s->plan_hits / (double)plan_gets : 0.0);
    /* failures (docs/failure-model.md) */
    kv("storing", "%s%s", s->store_blocked ? "BLOCKED: " : "ok",
       s->store_blocked ? (s->store_blocked_reason ? s->store_blocked_reason : "") : "");
    kv("refused for memory", "%" PRId64 " (--request-memory-max)", s->rejected_memory);
    kv("corrupt entries", "%" PRId64 " (recompiled)", s->corrupt_entries);
    for (size_t i = 0; i < s->n_warnings; i++) kv(i ? "" : "warnings", "%s", s->warnings[i]);
    if (zero) printf("statistics zeroed\n");
  }
  tcc__v1__stats_response__free_unpacked(s, NULL);
  return rc;
}

/* ------------------------------------------------------------ ls */

typedef struct ls_opts {
  int limit;
  const char *order;
  int failures;
} ls_opts;

static int ls_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  ls_opts *o = ctx;
  const char *v;
  if ((v = option_value(argc, argv, i, "--limit"))) {
    o->limit = (int)parse_count("--limit", v, 1 << 30);
    return 1;
  }
  if ((v = option_value(argc, argv, i, "--order"))) {
    if (strcmp(v, "last_used") && strcmp(v, "hits") && strcmp(v, "size") && strcmp(v, "created"))
      usage_error("ls: --order must be last_used, hits, size or created, got '%s'", v);
    o->order = v;
    return 1;
  }
  if (!strcmp(argv[*i], "--failures")) {
    o->failures = 1;
    return 1;
  }
  return 0;
}

/* "compile failed: x\ny" as one table cell: newlines and tabs become
 * spaces, and a long message ends in "..." (--json has it whole). */
static void one_line(const char *msg, char *buf, size_t size) {
  snprintf(buf, size, "%s", msg ? msg : "");
  for (char *p = buf; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
  if (msg && strlen(msg) >= size && size > 4) strcpy(buf + size - 4, "...");
}

/* The recorded failures: HASH TARGET CODE CREATED MESSAGE. */
static void print_failures(const Tcc__V1__ListResponse *ls) {
  table tb = {.cols = 5};
  const char *head[] = {"HASH", "TARGET", "CODE", "CREATED", "MESSAGE"};
  table_add(&tb, head);
  for (size_t i = 0; i < ls->n_failures; i++) {
    const Tcc__V1__FailureSummary *f = ls->failures[i];
    char hash[16], created[32], msg[64];
    snprintf(hash, sizeof hash, "%.12s", f->guard_hash);
    human_time(f->created_unix, created, sizeof created);
    one_line(f->message, msg, sizeof msg);
    const char *row[] = {hash, f->target && *f->target ? f->target : "-", f->code, created, msg};
    table_add(&tb, row);
  }
  table_print(&tb, "");
}

/* Cut at the limit (ListResponse.total says how many there are), ls
 * says so on stderr; --json gets "total" and "truncated". */
static int cmd_ls(tcctl *t) {
  ls_opts o = {0, "last_used", 0};
  split_args(t, ls_option, &o, NULL, 0);
  Tcc__V1__ListResponse *ls;
  if (connect_client(t) || (o.failures ? tcc_client_list_failures(t->client, o.limit, &ls, &t->err)
                                       : tcc_client_list(t->client, o.limit, o.order, &ls, &t->err)))
    return fail_err(t);
  size_t shown = o.failures ? ls->n_failures : ls->n_entries;
  int truncated = ls->total > (int64_t)shown;
  int rc = 0;
  if (t->json) {
    cJSON *doc = message_json(ls);
    if (doc) cJSON_AddBoolToObject(doc, "truncated", truncated);
    rc = print_json(t, doc);
  } else if (o.failures) {
    print_failures(ls);
  } else {
    table tb = {.cols = 6, .right = {0, 0, 1, 1, 1, 0}};
    const char *head[] = {"HASH", "TARGET", "SIZE", "HITS", "COMPILE_MS", "LAST_USED"};
    table_add(&tb, head);
    for (size_t i = 0; i < ls->n_entries; i++) {
      const Tcc__V1__EntrySummary *e = ls->entries[i];
      char hash[16], size[32], hits[32], ms[32], used[32];
      snprintf(hash, sizeof hash, "%.12s", e->guard_hash);
      human_bytes(e->size, size, sizeof size);
      snprintf(hits, sizeof hits, "%" PRId64, e->hits);
      snprintf(ms, sizeof ms, "%.1f", e->compile_ms);
      human_time(e->last_used_unix, used, sizeof used);
      const char *row[] = {hash, e->target && *e->target ? e->target : "-", size, hits, ms, used};
      table_add(&tb, row);
    }
    table_print(&tb, "");
  }
  if (truncated && !t->json)
    fprintf(stderr, "showing %zu of %" PRId64 " %s (--limit N for more)\n", shown, ls->total,
            o.failures ? "recorded failures" : "entries");
  tcc__v1__list_response__free_unpacked(ls, NULL);
  return rc;
}

/* ------------------------------------------------------------ show */

/* "input 1 + 16", "workspace + 256", "const b3_data" */
static void format_ref(const Tcc__V1__BufferRef *r, char *buf, size_t cap) {
  char base[96] = "?";
  if (r) switch (r->base_case) {
    case TCC__V1__BUFFER_REF__BASE_INPUT: snprintf(base, sizeof base, "input %u", r->input); break;
    case TCC__V1__BUFFER_REF__BASE_OUTPUT: snprintf(base, sizeof base, "output %u", r->output); break;
    case TCC__V1__BUFFER_REF__BASE_WORKSPACE: snprintf(base, sizeof base, "workspace"); break;
    case TCC__V1__BUFFER_REF__BASE_CONSTANT: snprintf(base, sizeof base, "const %.64s", r->constant); break;
    default: break;
    }
  if (r && r->offset_bytes) snprintf(buf, cap, "%s + %" PRId64, base, r->offset_bytes);
  else snprintf(buf, cap, "%s", base);
}

/* The extern (cuBLAS) steps of a CUDA plan, one line each. */
static void print_gemm_steps(const Tcc__V1__Manifest *m) {
  for (size_t i = 0; i < m->n_kernels; i++) {
    const Tcc__V1__GemmStep *g = m->kernels[i]->gemm;
    if (!g) continue;
    char a[128], b[128], c[128], dt[2][32];
    format_ref(g->a, a, sizeof a);
    format_ref(g->b, b, sizeof b);
    format_ref(g->c, c, sizeof c);
    const char *ad = enum_name(&tcc__v1__dtype__descriptor, g->a_dtype, dt[0], sizeof dt[0]);
    const char *cd = enum_name(&tcc__v1__dtype__descriptor, g->c_dtype, dt[1], sizeof dt[1]);
    printf("  %s: cuBLAS gemm %c%c m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " lda=%" PRId64 " ldb=%" PRId64
           " ldc=%" PRId64 " batch=%" PRId64 " (strides %" PRId64 "/%" PRId64 "/%" PRId64 ") %s -> %s, compute %s\n"
           "      A = %s, B = %s, C = %s\n",
           m->kernels[i]->name, g->trans_a ? 'T' : 'N', g->trans_b ? 'T' : 'N', g->m, g->n, g->k, g->lda, g->ldb,
           g->ldc, g->batch_count, g->stride_a, g->stride_b, g->stride_c, ad, cd,
           g->compute_type && *g->compute_type ? g->compute_type : "-", a, b, c);
  }
}

static void print_kernels(const Tcc__V1__Manifest *m) {
  table tb = {.cols = 6, .right = {0, 0, 1, 0, 0, 1}};
  const char *head[] = {"NAME", "KIND", "NUMEL", "GRID", "BLOCK", "SHARED_BYTES"};
  table_add(&tb, head);
  for (size_t i = 0; i < m->n_kernels; i++) {
    const Tcc__V1__KernelInfo *k = m->kernels[i];
    char numel[32], grid[64] = "-", block[64] = "-", shared[32];
    snprintf(numel, sizeof numel, "%" PRId64, k->numel);
    for (size_t j = 0, n = 0; j < k->n_grid && n < sizeof grid; j++)
      n += (size_t)snprintf(grid + n, sizeof grid - n, "%s%" PRId64, j ? "x" : "", k->grid[j]);
    for (size_t j = 0, n = 0; j < k->n_block && n < sizeof block; j++)
      n += (size_t)snprintf(block + n, sizeof block - n, "%s%" PRId64, j ? "x" : "", k->block[j]);
    snprintf(shared, sizeof shared, "%" PRId64, k->shared_bytes);
    const char *row[] = {k->name, k->kind && *k->kind ? k->kind : "-", numel, grid, block, shared};
    table_add(&tb, row);
  }
  table_print(&tb, "  ");
  print_gemm_steps(m);
}

static void print_metas(const char *label, Tcc__V1__TensorMeta **metas, size_t n) {
  if (n == 0) kv(label, "-");
  for (size_t i = 0; i < n; i++) {
    char buf[512];
    format_meta(metas[i], buf, sizeof buf);
    kv(i == 0 ? label : "", "%s", buf);
  }
}

/* Graphviz of the kernel grouping: one cluster per kernel holding the
 * graph nodes it computes, views (no kernel) dashed, inputs and outputs
 * as ellipses. A node recomputed in several kernels is drawn in the first
 * and its label names the others. Returns 0, or 1 when the entry has no
 * provenance (made by an older daemon). */
static int print_dot(const Tcc__V1__ShowResponse *s) {
  const Tcc__V1__Manifest *m = s->manifest;
  if (!m || (m->n_graph_nodes == 0 && m->n_output_nodes == 0)) {
    fprintf(stderr, "tcctl: show --dot: the entry has no graph provenance (compiled by an older "
                    "tccd; evict it and compile again)\n");
    return 1;
  }
  size_t nn = m->n_graph_nodes;
  int *home = calloc(nn + 1, sizeof *home);  /* first kernel + 1, 0 = none */
  if (!home) {
    fprintf(stderr, "tcctl: out of memory\n");
    return 1;
  }
  for (size_t k = 0; k < m->n_kernels; k++)
    for (size_t j = 0; j < m->kernels[k]->n_nodes; j++) {
      int32_t n = m->kernels[k]->nodes[j];
      if (n >= 0 && (size_t)n < nn && !home[n]) home[n] = (int)k + 1;
    }
  const char *hash = s->entry && s->entry->guard_hash ? s->entry->guard_hash : "";
  printf("digraph \"tccd_%.12s\" {\n", hash);
  printf("  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (size_t i = 0; i < m->n_inputs; i++) {
    char meta[512];
    format_meta(m->inputs[i], meta, sizeof meta);
    printf("  in%zu [shape=ellipse, label=\"input %zu\\n%s\"];\n", i, i, meta);
  }
  for (size_t k = 0; k < m->n_kernels; k++) {
    const Tcc__V1__KernelInfo *ki = m->kernels[k];
    printf("  subgraph cluster_%zu {\n    label=\"%s: %s, numel %" PRId64 "\";\n", k, ki->name,
           ki->kind, ki->numel);
    printf("    style=rounded; color=%s;\n", !strcmp(ki->kind, "extern") ? "red" : "blue");
    for (size_t n = 0; n < nn; n++) {
      if (home[n] != (int)k + 1) continue;
      printf("    n%zu [label=\"%zu: %s", n, n, m->graph_nodes[n]->target);
      int first = 1;  /* the other kernels recomputing it */
      for (size_t o = k + 1; o < m->n_kernels; o++)
        for (size_t j = 0; j < m->kernels[o]->n_nodes; j++)
          if ((size_t)m->kernels[o]->nodes[j] == n) {
            printf("%s%s", first ? "\\nalso in " : ", ", m->kernels[o]->name);
            first = 0;
          }
      printf("\"];\n");
    }
    printf("  }\n");
  }
  for (size_t n = 0; n < nn; n++)
    if (!home[n])
      printf("  n%zu [style=dashed, label=\"%zu: %s\"];\n", n, n, m->graph_nodes[n]->target);
  for (size_t n = 0; n < nn; n++)
    for (size_t a = 0; a < m->graph_nodes[n]->n_args; a++) {
      int32_t src = m->graph_nodes[n]->args[a];
      if (src >= 0) printf("  n%d -> n%zu;\n", src, n);
      else if (src != INT32_MIN) printf("  in%d -> n%zu;\n", -1 - src, n);
    }
  for (size_t i = 0; i < m->n_output_nodes; i++) {
    int32_t src = m->output_nodes[i];
    printf("  out%zu [shape=ellipse, label=\"output %zu\"];\n", i, i);
    if (src >= 0) printf("  n%d -> out%zu;\n", src, i);
    else if (src != INT32_MIN) printf("  in%d -> out%zu;\n", -1 - src, i);
  }
  printf("}\n");
  free(home);
  return 0;
}

static int show_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t, (void)argc;
  if (strcmp(argv[*i], "--dot")) return 0;
  *(int *)ctx = 1;
  return 1;
}

/* `show` of a recorded failure. */
static void print_failure(const Tcc__V1__FailureSummary *f) {
  char a[64];
  kv("guard hash", "%s", f->guard_hash);
  kv("recorded failure", "%s", f->code);
  kv("target", "%s", f->target && *f->target ? f->target : "-");
  kv("created", "%s", human_time(f->created_unix, a, sizeof a));
  kv("canonical key", "%" PRId64 " bytes", f->key_size);
  kv("message", "%s", f->message);
}

static int cmd_show(tcctl *t) {
  char *pos[1];
  int dot = 0;
  if (split_args(t, show_option, &dot, pos, 1) != 1) usage_error("show needs a HASH");
  char hash[TCC_SHA256_HEX];
  if (connect_client(t)) return fail_err(t);
  if (resolve_hash(t, pos[0], hash)) return 1;
  Tcc__V1__ShowResponse *s;
  if (tcc_client_show(t->client, hash, &s, &t->err)) return fail_err(t);
  int rc = 0;
  if (dot && s->failure) {
    rc = failf(t, TCC_E_FAILED_PRECONDITION, "%s is a recorded failure: it has no kernels to draw", hash);
  } else if (dot) {
    rc = print_dot(s);
  } else if (t->json) {
    rc = print_json(t, message_json(s));
  } else if (s->failure) {
    print_failure(s->failure);
  } else {
    char a[64], b[64];
    const Tcc__V1__EntrySummary *e = s->entry;
    if (e) {
      kv("guard hash", "%s", e->guard_hash);
      kv("artifact sha256", "%s", e->artifact_sha256);
      kv("kind", "%s", enum_name(&tcc__v1__artifact_kind__descriptor, e->kind, a, sizeof a));
      kv("target", "%s", e->target && *e->target ? e->target : "-");
      kv("size", "%s (%" PRId64 " bytes)", human_bytes(e->size, a, sizeof a), e->size);
      kv("hits", "%" PRId64, e->hits);
      kv("compile time", "%.1f ms", e->compile_ms);
      kv("created", "%s", human_time(e->created_unix, a, sizeof a));
      kv("last used", "%s", human_time(e->last_used_unix, a, sizeof a));
    }
    if (s->options)
      kv("options", "mode=%s dynamic=%s fullgraph=%s",
         enum_name(&tcc__v1__mode__descriptor, s->options->mode, a, sizeof a),
         s->options->dynamic ? "true" : "false", s->options->fullgraph ? "true" : "false");
    if (s->target_spec) {
      const Tcc__V1__Target *ts = s->target_spec;
      char feats[256] = "";
      for (size_t i = 0, n = 0; i < ts->n_cpu_features && n < sizeof feats; i++)
        n += (size_t)snprintf(feats + n, sizeof feats - n, "%s%s", i ? "," : "", ts->cpu_features[i]);
      kv("target spec", "device=%s cpu_isa=%s cpu_features=%s cuda_arch=%s",
         enum_name(&tcc__v1__device_type__descriptor, ts->device, b, sizeof b),
         *ts->cpu_isa ? ts->cpu_isa : "-", *feats ? feats : "-", *ts->cuda_arch ? ts->cuda_arch : "-");
    }
    kv("canonical key", "%zu bytes", s->canonical_key.len);
    const Tcc__V1__Manifest *m = s->manifest;
    if (m) {
      kv("compiler", "%s", m->compiler && *m->compiler ? m->compiler : "-");
      kv("entry", "%s (abi %u)", m->entry && *m->entry ? m->entry : "-", m->abi_version);
      kv("workspace", "%s", human_bytes(m->workspace_bytes, a, sizeof a));
      print_metas("inputs", m->inputs, m->n_inputs);
      print_metas("outputs", m->outputs, m->n_outputs);
      if (m->ptx.len) kv("ptx", "%s (JIT fallback for other archs)", human_bytes((int64_t)m->ptx.len, a, sizeof a));
      kv("kernels", "%zu", m->n_kernels);
      if (m->n_kernels) print_kernels(m);
    }
  }
  tcc__v1__show_response__free_unpacked(s, NULL);
  return rc;
}

/* ------------------------------------------------------------ evict */

/* With a remote tier the daemon deletes the hash's shared keys too; a
 * Redis that could not delete them makes the exit status 1 (after the
 * result), the local eviction having happened all the same. */
static int cmd_evict(tcctl *t) {
  char *pos[1];
  if (split_args(t, NULL, NULL, pos, 1) != 1) usage_error("evict needs a HASH");
  char hash[TCC_SHA256_HEX];
  if (connect_client(t)) return fail_err(t);
  if (resolve_hash(t, pos[0], hash)) return 1;
  Tcc__V1__EvictRequest req = TCC__V1__EVICT_REQUEST__INIT;
  req.guard_hash = hash;
  Tcc__V1__EvictResponse *r;
  if (tcc_client_call_message(t->client, TCC_METHOD_EVICT, &req.base, &tcc__v1__evict_response__descriptor,
                              (ProtobufCMessage **)&r, 0, &t->err))
    return fail_err(t);
  if (!r->evicted && !r->n_remote_removed && !r->remote_error[0]) {
    tcc__v1__evict_response__free_unpacked(r, NULL);
    return failf(t, TCC_E_NOT_FOUND, "no cache entry %s", hash);
  }
  char removed[64] = "";
  for (size_t i = 0; i < r->n_remote_removed; i++)
    snprintf(removed + strlen(removed), sizeof removed - strlen(removed), "%s%s", i ? ", " : "", r->remote_removed[i]);
  int rc = 0;
  if (t->json) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "guard_hash", hash);
    cJSON_AddBoolToObject(doc, "evicted", r->evicted);
    cJSON_AddBoolToObject(doc, "remote_enabled", r->remote_enabled);
    cJSON *arr = cJSON_AddArrayToObject(doc, "remote_removed");
    for (size_t i = 0; i < r->n_remote_removed; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(r->remote_removed[i]));
    cJSON_AddStringToObject(doc, "remote_error", r->remote_error);
    rc = print_json(t, doc);
  } else {
    printf(r->evicted ? "evicted %s\n" : "no local entry for %s\n", hash);
    if (r->remote_enabled && !r->remote_error[0])
      printf(r->n_remote_removed ? "redis: removed %s\n" : "redis: nothing stored for it\n", removed);
  }
  if (r->remote_error[0])
    rc = failf(t, TCC_E_UNAVAILABLE, "%s; the shared copy in redis was not removed", r->remote_error);
  tcc__v1__evict_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ gc */

static int gc_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  const char *v = option_value(argc, argv, i, "--max-bytes");
  if (!v) return 0;
  *(int64_t *)ctx = parse_bytes("--max-bytes", v);
  return 1;
}

static int cmd_gc(tcctl *t) {
  int64_t max_bytes = 0;
  split_args(t, gc_option, &max_bytes, NULL, 0);
  Tcc__V1__GcResponse *g;
  if (connect_client(t) || tcc_client_gc(t->client, max_bytes, &g, &t->err)) return fail_err(t);
  int rc = 0;
  if (t->json) {
    rc = print_json(t, message_json(g));
  } else {
    char a[64];
    printf("evicted %" PRId64 " %s, freed %s (%" PRId64 " bytes), removed %" PRId64 " corrupt blob%s\n",
           g->evicted, g->evicted == 1 ? "entry" : "entries", human_bytes(g->freed_bytes, a, sizeof a),
           g->freed_bytes, g->corrupt_removed, g->corrupt_removed == 1 ? "" : "s");
  }
  tcc__v1__gc_response__free_unpacked(g, NULL);
  return rc;
}

/* ------------------------------------------------------------ compile */

/* Reads a whole file ("-" = stdin) into a malloc'd buffer. Returns 0 or
 * the exit status after printing why. */
static int read_input(tcctl *t, const char *path, char **out, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) {
    int e = errno;
    return failf(t, e == ENOENT ? TCC_E_NOT_FOUND : e == EACCES ? TCC_E_PERMISSION_DENIED : TCC_E_UNKNOWN,
                 "cannot read %s: %s", path, strerror(e));
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    char *bigger = realloc(buf, cap *= 2);
    if (!bigger) {
      free(buf);
      buf = NULL;
    }
    buf = bigger;
  }
  int bad = ferror(f);
  if (f != stdin) fclose(f);
  if (!buf) return fail(t, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  if (bad) {
    free(buf);
    return failf(t, TCC_E_UNKNOWN, "cannot read %s", path);
  }
  *out = buf;
  *len = n;
  return 0;
}

static int compile_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  const char *v = option_value(argc, argv, i, "--target");
  if (!v) return 0;
  *(const char **)ctx = v;
  return 1;
}

/* The timings as {"decode_ms", "hash_ms", "lookup_ms", "compile_ms",
 * "total_ms", "original_compile_ms"}, all present (zeros when the daemon
 * sent none). */
static cJSON *timings_json(const Tcc__V1__Timings *tm) {
  Tcc__V1__Timings zero = TCC__V1__TIMINGS__INIT;
  return message_json(tm ? tm : &zero);
}

/* The progress line of `tcctl compile` on a terminal: a thread with its
 * own connection polls tcc.v1.Compiler/Jobs while the Compile call is
 * pending and rewrites one stderr line ("\r") with the newest job that
 * started after the request was sent (its state, autotuning candidates
 * benchmarked, elapsed time); the line is erased when the call returns.
 * Never with --json, never when stderr is not a terminal. */
typedef struct compile_progress {
  tcctl *t;
  pthread_t thread;
  _Atomic int stop;
  struct timespec started;
  int shown;
} compile_progress;

static double seconds_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

static void *progress_main(void *arg) {
  compile_progress *p = arg;
  tcc_client *c = NULL;
  tcc_error err;
  int ticks = 0;
  while (!atomic_load(&p->stop)) {
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    if (++ticks % 5 != 0 || atomic_load(&p->stop)) continue; /* every 0.5 s */
    if (!c && connect_client_to(p->t, &c, &err) != 0) break;
    Tcc__V1__JobsResponse *r = NULL;
    if (tcc_client_jobs(c, &r, &err) != 0) continue; /* an older daemon: no line */
    double mine = seconds_since(&p->started) * 1e3 + 200;
    const Tcc__V1__JobInfo *job = NULL;
    for (size_t i = 0; i < r->n_jobs; i++)
      if (r->jobs[i]->elapsed_ms <= mine) {
        job = r->jobs[i];
        break; /* oldest first: the first one started after us */
      }
    char line[160];
    if (job && job->candidates_total > 0)
      snprintf(line, sizeof line, "tccd: %.12s %s, candidates %d/%d benchmarked, %.1f s", job->guard_hash,
               job->state, job->candidates_done, job->candidates_total, seconds_since(&p->started));
    else if (job)
      snprintf(line, sizeof line, "tccd: %.12s %s, %.1f s", job->guard_hash, job->state,
               seconds_since(&p->started));
    else
      snprintf(line, sizeof line, "tccd: waiting, %.1f s", seconds_since(&p->started));
    tcc__v1__jobs_response__free_unpacked(r, NULL);
    if (!atomic_load(&p->stop)) {
      fprintf(stderr, "\r\033[K%s", line);
      fflush(stderr);
      p->shown = 1;
    }
  }
  if (c) tcc_client_close(c);
  return NULL;
}

static int progress_start(compile_progress *p, tcctl *t) {
  memset(p, 0, sizeof *p);
  if (t->json || !isatty(STDERR_FILENO)) return 0;
  p->t = t;
  clock_gettime(CLOCK_MONOTONIC, &p->started);
  return pthread_create(&p->thread, NULL, progress_main, p) == 0;
}

static void progress_stop(compile_progress *p, int running) {
  if (!running) return;
  atomic_store(&p->stop, 1);
  pthread_join(p->thread, NULL);
  if (p->shown) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
}

static int cmd_compile(tcctl *t) {
  const char *target = NULL;
  char *pos[1];
  if (split_args(t, compile_option, &target, pos, 1) != 1) usage_error("compile needs a FILE (- = stdin)");
  char *json = NULL;
  size_t len = 0;
  if (read_input(t, pos[0], &json, &len)) return 1;
  ProtobufCMessage *msg = NULL;
  int rc = tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, json, len, &msg, &t->err);
  free(json);
  if (rc) {
    tcc_error_prefix(&t->err, "%s", strcmp(pos[0], "-") ? pos[0] : "<stdin>");
    return fail_err(t);
  }
  Tcc__V1__CompileRequest *req = (Tcc__V1__CompileRequest *)msg;
  if (target && tcc_request_retarget(req, target)) {
    tcc__v1__compile_request__free_unpacked(req, NULL);
    usage_error("compile: --target must be cpu, cpu:ISA or cuda:sm_XX, got '%s'", target);
  }
  Tcc__V1__CompileResponse *resp = NULL;
  compile_progress progress;
  if (connect_client(t)) {
    tcc__v1__compile_request__free_unpacked(req, NULL);
    return fail_err(t);
  }
  int progress_on = progress_start(&progress, t);
  rc = tcc_client_compile(t->client, req, &resp, &t->err);
  progress_stop(&progress, progress_on);
  if (rc) {
    tcc__v1__compile_request__free_unpacked(req, NULL);
    return fail_err(t);
  }
  tcc__v1__compile_request__free_unpacked(req, NULL);

  const Tcc__V1__Artifact *art = resp->artifact;
  const Tcc__V1__Manifest *man = resp->manifest;
  /* tcc_client_compile refused it unless it verified (when keys are set) */
  int verified = art && art->signature.len && tcc_client_trusted_keys(t->client) > 0;
  char kind[32] = "-", num[16];
  if (art) {
    snprintf(kind, sizeof kind, "%s", enum_name(&tcc__v1__artifact_kind__descriptor, art->kind, num, sizeof num));
    lowercase(kind);
  }
  rc = 0;
  if (t->json) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "guard_hash", resp->guard_hash);
    cJSON_AddStringToObject(doc, "cache", cache_status_word(resp->cache));
    cJSON_AddStringToObject(doc, "artifact_sha256", art ? art->sha256 : "");
    cJSON_AddNumberToObject(doc, "artifact_size", art ? (double)art->size : 0);
    cJSON_AddStringToObject(doc, "artifact_kind", kind);
    cJSON_AddStringToObject(doc, "target", man && man->target ? man->target : "");
    cJSON_AddNumberToObject(doc, "kernels", man ? (double)man->n_kernels : 0);
    cJSON_AddItemToObject(doc, "timings", timings_json(resp->timings));
    cJSON_AddStringToObject(doc, "key_id", art && art->key_id ? art->key_id : "");
    cJSON_AddBoolToObject(doc, "signature_verified", verified);
    if (man) cJSON_AddItemToObject(doc, "manifest", message_json(man));
    rc = print_json(t, doc);
  } else {
    char a[64];
    const Tcc__V1__Timings *tm = resp->timings;
    kv("guard hash", "%s", resp->guard_hash);
    kv("cache", "%s", cache_status_word(resp->cache));
    kv("artifact sha256", "%s", art ? art->sha256 : "-");
    kv("artifact size", "%s (%" PRId64 " bytes)", human_bytes(art ? art->size : 0, a, sizeof a),
       art ? art->size : 0);
    kv("artifact kind", "%s", kind);
    if (art && art->signature.len)
      kv("signature", "key %s, %s", art->key_id, verified ? "verified" : "not verified (no trusted keys)");
    else
      kv("signature", "unsigned");
    kv("target", "%s", man && man->target && *man->target ? man->target : "-");
    kv("kernels", "%zu", man ? man->n_kernels : 0);
    /* a hit compiled nothing in this call: the original compile's time is
     * shown as such (Timings.original_compile_ms) */
    if (tm && resp->cache != TCC__V1__CACHE_STATUS__MISS && tm->original_compile_ms > 0)
      kv("timings", "decode %.3f ms, hash %.3f ms, lookup %.3f ms, compile %.3f ms (this call), total %.3f ms; "
         "compiled originally in %.1f ms", tm->decode_ms, tm->hash_ms, tm->lookup_ms, tm->compile_ms,
         tm->total_ms, tm->original_compile_ms);
    else if (tm)
      kv("timings", "decode %.3f ms, hash %.3f ms, lookup %.3f ms, compile %.3f ms, total %.3f ms", tm->decode_ms,
         tm->hash_ms, tm->lookup_ms, tm->compile_ms, tm->total_ms);
  }
  tcc__v1__compile_response__free_unpacked(resp, NULL);
  return rc;
}

/* ------------------------------------------------------------ explain */

typedef struct explain_opts {
  const char *target;
  int max;
} explain_opts;

static int explain_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  explain_opts *o = ctx;
  const char *v;
  if ((v = option_value(argc, argv, i, "--target"))) {
    o->target = v;
    return 1;
  }
  if ((v = option_value(argc, argv, i, "--max"))) {
    o->max = (int)parse_count("--max", v, 64);
    return 1;
  }
  return 0;
}

/* Reads a request file (protobuf JSON, "-" = stdin) as compile does, with
 * --target applied. Returns 0 or the exit status after printing why. */
static int read_request(tcctl *t, const char *path, const char *target, Tcc__V1__CompileRequest **out) {
  char *json = NULL;
  size_t len = 0;
  if (read_input(t, path, &json, &len)) return 1;
  ProtobufCMessage *msg = NULL;
  int rc = tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, json, len, &msg, &t->err);
  free(json);
  if (rc) {
    tcc_error_prefix(&t->err, "%s", strcmp(path, "-") ? path : "<stdin>");
    return fail_err(t);
  }
  *out = (Tcc__V1__CompileRequest *)msg;
  if (target && tcc_request_retarget(*out, target)) {
    tcc__v1__compile_request__free_unpacked(*out, NULL);
    usage_error("--target must be cpu, cpu:ISA or cuda:sm_XX, got '%s'", target);
  }
  return 0;
}

/* HASH (full, a stored prefix) or FILE (a request: its key is computed by
 * the daemon, nothing is compiled). An argument naming a readable file,
 * or "-", is a FILE. */
static int cmd_explain(tcctl *t) {
  explain_opts o = {NULL, 0};
  char *pos[1];
  if (split_args(t, explain_option, &o, pos, 1) != 1) usage_error("explain needs a HASH or a request FILE");
  if (connect_client(t)) return fail_err(t);
  Tcc__V1__CompileRequest *req = NULL;
  char hash[TCC_SHA256_HEX] = "";
  if (!strcmp(pos[0], "-") || access(pos[0], R_OK) == 0) {
    if (read_request(t, pos[0], o.target, &req)) return 1;
  } else if (o.target) {
    usage_error("explain: --target applies to a request FILE, not a HASH");
  } else if (tcc_hex_is_sha256(pos[0])) {
    tcc_hex_lower_copy(pos[0], hash); /* a recent miss has no entry to resolve a prefix with */
  } else if (resolve_hash(t, pos[0], hash)) {
    return 1;
  }
  Tcc__V1__ExplainResponse *r;
  int rc = tcc_client_explain(t->client, req ? NULL : hash, req, o.max, &r, &t->err);
  if (req) tcc__v1__compile_request__free_unpacked(req, NULL);
  if (rc) return fail_err(t);
  if (t->json) {
    rc = print_json(t, message_json(r));
  } else {
    kv("guard hash", "%s", r->guard_hash);
    kv("stored", "%s", !strcmp(r->stored, "entry")     ? "an entry (a hit for this key)"
                       : !strcmp(r->stored, "failure") ? "a recorded failure"
                                                        : "nothing (a miss)");
    kv("graph", "%.12s (%d other key(s) stored for it)", r->graph_digest, r->same_graph);
    kv("why", "%s", r->summary);
    for (size_t i = 0; i < r->n_nearest; i++) {
      const Tcc__V1__ExplainCandidate *cd = r->nearest[i];
      char when[32];
      printf("\n");
      kv(i == 0 ? "nearest" : "then", "%s %.12s (%s, created %s): %d cause(s), %d derived layout(s)", cd->kind,
         cd->guard_hash, cd->target, human_time(cd->created_unix, when, sizeof when), cd->causes, cd->derived);
      if (cd->n_differences) {
        table tb = {.cols = 4};
        const char *head[] = {"COMPONENT", "THIS", "", "STORED"};
        table_add(&tb, head);
        for (size_t j = 0; j < cd->n_differences; j++) {
          const Tcc__V1__KeyDifference *d = cd->differences[j];
          const char *row[] = {d->component, d->value, "vs", d->other};
          table_add(&tb, row);
        }
        table_print(&tb, "  ");
      }
      if (cd->causes > (int)cd->n_differences) printf("  ... and %d more\n", cd->causes - (int)cd->n_differences);
    }
    printf("\n");
    kv("explained in", "%.2f ms", r->elapsed_ms);
  }
  tcc__v1__explain_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ fetch */

/* Writes data to path atomically (temporary file in the same directory,
 * then rename), or to stdout for "-". Returns 0 or the exit status. */
static int write_output(tcctl *t, const char *path, const uint8_t *data, size_t len) {
  if (!strcmp(path, "-")) {
    if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0)
      return failf(t, TCC_E_UNKNOWN, "cannot write to stdout: %s", strerror(errno));
    return 0;
  }
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (!tmp) return fail(t, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int e = 0;
  if (fd < 0) {
    e = errno;
  } else {
    size_t off = 0;
    while (off < len) {
      ssize_t w = write(fd, data + off, len - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        e = errno ? errno : EIO;
        break;
      }
      off += (size_t)w;
    }
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) unlink(tmp);
  }
  free(tmp);
  if (e)
    return failf(t, e == EACCES ? TCC_E_PERMISSION_DENIED : e == ENOENT ? TCC_E_NOT_FOUND : TCC_E_UNKNOWN,
                 "cannot write %s: %s", path, strerror(e));
  return 0;
}

static int fetch_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  (void)argc;
  if (strcmp(argv[*i], "--digest")) return 0;
  *(int *)ctx = 1;
  return 1;
}

static int cmd_fetch(tcctl *t) {
  int by_digest = 0;
  char *pos[2];
  if (split_args(t, fetch_option, &by_digest, pos, 2) != 2) usage_error("fetch needs a HASH and an OUTFILE");
  if (connect_client(t)) return fail_err(t);
  char hash[TCC_SHA256_HEX] = "", sha[TCC_SHA256_HEX];
  uint8_t *data = NULL;
  size_t len = 0;
  int rc;
  if (by_digest) {
    if (!tcc_hex_is_sha256(pos[0]))
      return failf(t, TCC_E_INVALID_ARGUMENT, "--digest needs the 64-digit artifact SHA-256, got '%s'", pos[0]);
    tcc_hex_lower_copy(pos[0], sha);
    if (tcc_client_trusted_keys(t->client) == 0) {
      rc = tcc_client_fetch(t->client, sha, &data, &len, &t->err);
    } else { /* a digest names no signature: verify through its entry's */
      if (entry_of_artifact(t, sha, hash)) return 1;
      char got[TCC_SHA256_HEX];
      rc = tcc_client_fetch_entry(t->client, hash, &data, &len, got, &t->err);
      if (rc == 0 && strcmp(got, sha) != 0) {
        free(data);
        return failf(t, TCC_E_ABORTED, "entry %.12s changed while fetching: its artifact is now %s, not %s", hash,
                     got, sha);
      }
    }
  } else {
    if (resolve_hash(t, pos[0], hash)) return 1;
    rc = tcc_client_fetch_entry(t->client, hash, &data, &len, sha, &t->err);
  }
  if (rc) return fail_err(t);
  rc = write_output(t, pos[1], data, len);
  free(data);
  if (rc) return rc;
  if (t->json) {
    cJSON *doc = cJSON_CreateObject();
    if (*hash) cJSON_AddStringToObject(doc, "guard_hash", hash);
    cJSON_AddStringToObject(doc, "artifact_sha256", sha);
    cJSON_AddNumberToObject(doc, "size", (double)len);
    cJSON_AddStringToObject(doc, "path", pos[1]);
    if (!strcmp(pos[1], "-")) { /* stdout carries the artifact: report on stderr */
      char *s = tcc_pbjson_print_cjson(doc, 0);
      if (s) fprintf(stderr, "%s\n", s);
      free(s);
      cJSON_Delete(doc);
      return 0;
    }
    return print_json(t, doc);
  }
  char a[64];
  fprintf(strcmp(pos[1], "-") ? stdout : stderr, "wrote %s: %s (%zu bytes), sha256 %s\n", pos[1],
          human_bytes((int64_t)len, a, sizeof a), len, sha);
  return 0;
}

/* ------------------------------------------------------------ keygen */

static int cmd_keygen(tcctl *t) {
  char *pos[1];
  if (split_args(t, NULL, NULL, pos, 1) != 1) usage_error("keygen needs an output file");
  char id[TCC_SIGN_KEY_ID_HEX];
  if (tcc_sign_keygen(pos[0], id, &t->err)) return fail_err(t);
  if (t->json) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "secret_key", pos[0]);
    char pub[4200];
    snprintf(pub, sizeof pub, "%s.pub", pos[0]);
    cJSON_AddStringToObject(doc, "public_key", pub);
    cJSON_AddStringToObject(doc, "key_id", id);
    return print_json(t, doc);
  }
  printf("wrote %s (secret, mode 0600) and %s.pub; key id %s\n", pos[0], pos[0], id);
  printf("daemon: tccd --signing-key %s    clients: TCCD_TRUSTED_KEYS=%s.pub\n", pos[0], pos[0]);
  return 0;
}

/* ------------------------------------------------------------ clear */

typedef struct clear_opts {
  int yes, tuning;
} clear_opts;

static int clear_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t, (void)argc;
  clear_opts *o = ctx;
  if (!strcmp(argv[*i], "--yes")) o->yes = 1;
  else if (!strcmp(argv[*i], "--tuning")) o->tuning = 1;
  else return 0;
  return 1;
}

/* Asks on the terminal whether to clear what Stats counts. Returns 1 for
 * y/yes, 0 otherwise, or -1 (printed) when Stats fails. */
static int clear_confirm(tcctl *t, const clear_opts *o) {
  Tcc__V1__StatsResponse *s;
  if (tcc_client_stats(t->client, &s, &t->err)) return -1;
  char a[64], tuning[64] = "";
  if (o->tuning) snprintf(tuning, sizeof tuning, ", %" PRId64 " tuning records", s->tuning_records);
  fprintf(stderr, "remove %" PRId64 " entries (%s)%s, %" PRId64 " recorded failures and %" PRId64 " plans from %s? "
                  "[y/N] ",
          s->entries, human_bytes(s->bytes, a, sizeof a), tuning, s->negative_entries, s->plans,
          tcc_client_addr(t->client));
  fflush(stderr);
  tcc__v1__stats_response__free_unpacked(s, NULL);
  char line[32] = "";
  if (!fgets(line, sizeof line, stdin)) return 0;
  line[strcspn(line, " \t\r\n")] = '\0';
  return !strcasecmp(line, "y") || !strcasecmp(line, "yes");
}

/* Clear (admin): every entry and recorded failure of the daemon's local
 * cache; tuning records with --tuning. Asks first on a terminal; not on
 * one, --yes is required (a usage error without it). A Redis tier is
 * never cleared: the note says so. */
static int cmd_clear(tcctl *t) {
  clear_opts o = {0, 0};
  split_args(t, clear_option, &o, NULL, 0);
  if (!o.yes && !isatty(STDIN_FILENO))
    usage_error("clear: stdin is not a terminal to ask on: pass --yes to clear without asking");
  if (connect_client(t)) return fail_err(t);
  if (!o.yes) {
    int ok = clear_confirm(t, &o);
    if (ok < 0) return fail_err(t);
    if (!ok) return fail(t, TCC_E_CANCELLED, "not confirmed; nothing removed");
  }
  Tcc__V1__ClearResponse *r;
  if (tcc_client_clear(t->client, o.tuning, &r, &t->err)) return fail_err(t);
  static const char note[] = "the shared redis tier was not cleared: clear empties this daemon's local cache "
                             "only (the other daemons still share those entries)";
  int rc = 0;
  if (t->json) {
    cJSON *doc = message_json(r);
    if (doc) {
      cJSON_AddStringToObject(doc, "addr", tcc_client_addr(t->client));
      cJSON_AddStringToObject(doc, "note", r->remote_enabled ? note : "");
    }
    rc = print_json(t, doc);
  } else {
    char a[64], tuning[64] = "";
    if (o.tuning) snprintf(tuning, sizeof tuning, ", %" PRId64 " tuning records", r->tuning_records);
    printf("removed %" PRId64 " entries (%s)%s, %" PRId64 " recorded failures and %" PRId64 " plans from %s\n",
           r->entries, human_bytes(r->bytes, a, sizeof a), tuning, r->failures, r->plans, tcc_client_addr(t->client));
    if (r->remote_enabled) printf("note: %s\n", note);
  }
  tcc__v1__clear_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ jobs */

static int cmd_jobs(tcctl *t) {
  split_args(t, NULL, NULL, NULL, 0);
  Tcc__V1__JobsResponse *r;
  if (connect_client(t) || tcc_client_jobs(t->client, &r, &t->err)) return fail_err(t);
  int rc = 0;
  if (t->json) {
    rc = print_json(t, message_json(r));
  } else if (r->n_jobs == 0) {
    printf("no compiles in flight\n");
  } else {
    table tb = {.cols = 5, .right = {0, 0, 1, 1, 1}};
    const char *head[] = {"HASH", "STATE", "ELAPSED", "WAITERS", "CANDIDATES"};
    table_add(&tb, head);
    for (size_t i = 0; i < r->n_jobs; i++) {
      const Tcc__V1__JobInfo *j = r->jobs[i];
      char hash[16], elapsed[32], waiters[32], cands[32] = "-";
      snprintf(hash, sizeof hash, "%.12s", j->guard_hash);
      snprintf(elapsed, sizeof elapsed, "%.1f s", j->elapsed_ms / 1000.0);
      if (j->warm_id && !j->waiters) snprintf(waiters, sizeof waiters, "warm %" PRIu64, j->warm_id);
      else snprintf(waiters, sizeof waiters, "%d", j->waiters);
      if (j->candidates_total > 0) snprintf(cands, sizeof cands, "%d/%d", j->candidates_done, j->candidates_total);
      const char *row[] = {hash, j->state, elapsed, waiters, cands};
      table_add(&tb, row);
    }
    table_print(&tb, "");
  }
  tcc__v1__jobs_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ warm */

typedef struct warm_opts {
  Tcc__V1__WarmRequest req;
  int no_wait;
} warm_opts;

static int warm_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  warm_opts *o = ctx;
  const char *v;
  if ((v = option_value(argc, argv, i, "--target"))) {
    o->req.target = (char *)v;
  } else if ((v = option_value(argc, argv, i, "--from-target"))) {
    o->req.from_target = (char *)v;
  } else if ((v = option_value(argc, argv, i, "--since"))) {
    if (tcc_parse_seconds(v, &o->req.since_seconds) != 0 || o->req.since_seconds == 0)
      usage_error("warm: --since needs a duration like 3600, 90m, 12h or 7d, got '%s'", v);
  } else if ((v = option_value(argc, argv, i, "--limit"))) {
    o->req.limit = (uint32_t)parse_count("--limit", v, UINT32_MAX);
  } else if ((v = option_value(argc, argv, i, "--id"))) {
    o->req.warm_id = (uint64_t)parse_count("--id", v, INT64_MAX);
    if (!o->req.warm_id) usage_error("warm: --id needs a run id (1 or more)");
  } else if (!strcmp(argv[*i], "--no-wait")) {
    o->no_wait = 1;
  } else {
    return 0;
  }
  return 1;
}

/* "12/40: 9 compiled, 2 present, 1 failed" */
static void warm_line(const Tcc__V1__WarmResponse *r, char *buf, size_t size) {
  uint32_t seen = r->compiled + r->present + r->failed + r->gone;
  snprintf(buf, size, "warm run %" PRIu64 " for %s: %u/%u: %u compiled, %u already present, %u failed, %u gone, %.1f s",
           r->warm_id, r->target, seen, r->total, r->compiled, r->present, r->failed, r->gone,
           r->elapsed_ms / 1000.0);
}

/* Warm (admin): starts a run (or follows one by --id) and, unless
 * --no-wait, polls it to the end with a progress line on a terminal.
 * Exit 0 when nothing failed; 1 when something could not be compiled
 * for the target (the last failure is printed). Interrupting tcctl leaves
 * the run going in tccd. */
static int cmd_warm(tcctl *t) {
  warm_opts o = {TCC__V1__WARM_REQUEST__INIT, 0};
  split_args(t, warm_option, &o, NULL, 0);
  if (o.req.warm_id && (*o.req.target || *o.req.from_target || o.req.since_seconds || o.req.limit))
    usage_error("warm: --id follows a run; --target, --from-target, --since and --limit start one");
  if (!o.req.warm_id && !*o.req.target) usage_error("warm needs --target T (or --id ID)");
  if (*o.req.target) {
    Tcc__V1__Target *tg = tcc_target_parse(o.req.target);
    if (!tg) usage_error("warm: --target must be cpu, cpu:ISA[+FEATURE...] or cuda:sm_XX, got '%s'", o.req.target);
    tcc__v1__target__free_unpacked(tg, NULL);
  }
  if (connect_client(t)) return fail_err(t);
  Tcc__V1__WarmResponse *r;
  if (tcc_client_warm(t->client, &o.req, &r, &t->err)) return fail_err(t);
  if (!o.req.warm_id && !t->json)
    fprintf(stderr, "warm run %" PRIu64 ": %u entries of %s to compile for %s\n", r->warm_id, r->total,
            *r->from_target ? r->from_target : "other targets", r->target);
  if (!o.req.warm_id && r->without_request && !t->json)
    fprintf(stderr, "note: %u matching entries keep no request (stored before tccd kept requests, or copied "
                    "from the redis tier) and cannot be warmed\n", r->without_request);
  int tty = isatty(STDERR_FILENO), shown = 0;
  uint32_t last_seen = UINT32_MAX;
  while (!r->done && !o.no_wait) {
    char line[256];
    uint32_t seen = r->compiled + r->present + r->failed + r->gone;
    if (tty || seen != last_seen) {
      warm_line(r, line, sizeof line);
      fprintf(stderr, tty ? "\r\033[K%s" : "%s\n", line);
      fflush(stderr);
      shown = tty;
      last_seen = seen;
    }
    struct timespec ts = {0, 250 * 1000000L};
    nanosleep(&ts, NULL);
    Tcc__V1__WarmRequest poll = TCC__V1__WARM_REQUEST__INIT;
    poll.warm_id = r->warm_id;
    Tcc__V1__WarmResponse *next;
    if (tcc_client_warm(t->client, &poll, &next, &t->err)) {
      if (shown) fputc('\n', stderr);
      tcc__v1__warm_response__free_unpacked(r, NULL);
      return fail_err(t);
    }
    tcc__v1__warm_response__free_unpacked(r, NULL);
    r = next;
  }
  if (shown) fputs("\r\033[K", stderr);
  int rc = r->done && r->failed ? 1 : 0;
  if (t->json) {
    cJSON *doc = message_json(r);
    if (doc) cJSON_AddStringToObject(doc, "addr", tcc_client_addr(t->client));
    if (print_json(t, doc)) rc = 1;
  } else {
    char line[256];
    warm_line(r, line, sizeof line);
    if (r->done) printf("%s, done\n", line);
    else printf("%s (running; `tcctl warm --id %" PRIu64 "` follows it)\n", line, r->warm_id);
    if (*r->last_error) printf("last failure: %s\n", r->last_error);
  }
  tcc__v1__warm_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ ops */

static int ops_option(tcctl *t, int argc, char **argv, int *i, void *ctx) {
  (void)t;
  const char *v = option_value(argc, argv, i, "--device");
  if (!v) return 0;
  if (!strcmp(v, "cpu")) *(int *)ctx = TCC__V1__DEVICE_TYPE__CPU;
  else if (!strcmp(v, "cuda")) *(int *)ctx = TCC__V1__DEVICE_TYPE__CUDA;
  else usage_error("ops: --device must be cpu or cuda, got '%s'", v);
  return 1;
}

static int cmd_ops(tcctl *t) {
  int device = TCC__V1__DEVICE_TYPE__CPU;
  split_args(t, ops_option, &device, NULL, 0);
  Tcc__V1__OpsResponse *r;
  if (connect_client(t) || tcc_client_ops(t->client, device, &r, &t->err)) return fail_err(t);
  int rc = 0;
  if (t->json) {
    rc = print_json(t, message_json(r));
  } else {
    char dtypes[512] = "", num[16];
    for (size_t i = 0, n = 0; i < r->n_dtypes && n < sizeof dtypes; i++) {
      char dt[32];
      snprintf(dt, sizeof dt, "%s", enum_name(&tcc__v1__dtype__descriptor, r->dtypes[i], num, sizeof num));
      lowercase(dt);
      n += (size_t)snprintf(dtypes + n, sizeof dtypes - n, "%s%s", i ? ", " : "", dt);
    }
    kv("compiler", "%s", r->compiler && *r->compiler ? r->compiler : "-");
    kv("dtypes", "%s", *dtypes ? dtypes : "-");
    kv("ops", "%zu", r->n_ops);
    table tb = {.cols = 3};
    const char *head[] = {"TARGET", "KIND", "SCHEMA"};
    table_add(&tb, head);
    for (size_t i = 0; i < r->n_ops; i++) {
      const Tcc__V1__OpInfo *op = r->ops[i];
      const char *row[] = {op->target, op->kind && *op->kind ? op->kind : "-", op->schema ? op->schema : ""};
      table_add(&tb, row);
    }
    table_print(&tb, "");
  }
  tcc__v1__ops_response__free_unpacked(r, NULL);
  return rc;
}

/* ------------------------------------------------------------ main */

typedef struct command {
  const char *name;
  int (*run)(tcctl *t);
} command;

static const command commands[] = {
    {"health", cmd_health}, {"stats", cmd_stats}, {"ls", cmd_ls},           {"show", cmd_show},
    {"evict", cmd_evict},   {"gc", cmd_gc},       {"compile", cmd_compile}, {"fetch", cmd_fetch},
    {"keygen", cmd_keygen}, {"explain", cmd_explain}, {"clear", cmd_clear}, {"jobs", cmd_jobs}, {"ops", cmd_ops},
    {"warm", cmd_warm},
};

int main(int argc, char **argv) {
  tcctl t = {0};
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0, options_done = 0, want_help = 0;
  if (!rest) return 1;

  /* Global options, anywhere on the line; everything else is the command
   * and its arguments (after "--", nothing is an option). */
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (options_done) {
      rest[nrest++] = argv[i];
    } else if (!strcmp(argv[i], "--")) {
      options_done = 1;
      if (nrest) rest[nrest++] = argv[i]; /* the command's own "--" */
    } else if ((v = option_value(argc, argv, &i, "--addr"))) {
      t.addr = v;
    } else if (!strcmp(argv[i], "--json")) {
      t.json = 1;
    } else if ((v = option_value(argc, argv, &i, "--deadline-ms"))) {
      t.deadline_ms = (int)parse_count("--deadline-ms", v, 1 << 30);
    } else if ((v = option_value(argc, argv, &i, "--connect-timeout-ms"))) {
      t.connect_timeout_ms = (int)parse_count("--connect-timeout-ms", v, 1 << 30);
    } else if ((v = option_value(argc, argv, &i, "--trusted-keys"))) {
      t.trusted_keys = v;
    } else if ((v = option_value(argc, argv, &i, "--token-file"))) {
      t.token_file = v;
    } else if ((v = option_value(argc, argv, &i, "--tls-ca"))) {
      t.tls_ca = v;
    } else if ((v = option_value(argc, argv, &i, "--tls-cert"))) {
      t.tls_cert = v;
    } else if ((v = option_value(argc, argv, &i, "--tls-key"))) {
      t.tls_key = v;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      want_help = 1; /* the whole text, or the command's */
    } else if (!strcmp(argv[i], "--version")) {
      printf("tcctl %s\n", TCC_VERSION);
      free(rest);
      return 0;
    } else {
      rest[nrest++] = argv[i];
    }
  }
  if (nrest == 0 && !want_help) {
    free(rest);
    usage_error("no command given");
  }
  if (want_help || !strcmp(rest[0], "help")) {
    const char *name = nrest == 0 ? NULL : strcmp(rest[0], "help") ? rest[0] : nrest > 1 ? rest[1] : NULL;
    if (!name) fputs(usage_text, stdout);
    else if (print_command_usage(name, stdout) != 0) {
      char copy[64];
      snprintf(copy, sizeof copy, "%s", name);
      free(rest);
      usage_error("unknown command '%s'", copy);
    }
    free(rest);
    return 0;
  }
  const command *cmd = NULL;
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(rest[0], commands[i].name)) cmd = &commands[i];
  if (!cmd) {
    char name[64];
    snprintf(name, sizeof name, "%s", rest[0]);
    free(rest);
    usage_error("unknown command '%s'", name);
  }
  const char *env_addr = getenv("TCCD_ADDR");
  tcc_error aerr = {0};
  if (cmd->run != cmd_keygen && (t.addr || (env_addr && *env_addr)) &&
      tcc_client_addr_check(t.addr ? t.addr : env_addr, &aerr)) {
    free(rest);
    usage_error("%s: %s", t.addr ? "--addr" : "TCCD_ADDR", aerr.msg);
  }
  t.command = cmd->name;
  usage_command = cmd->name;
  t.argc = nrest - 1;
  t.argv = rest + 1;
  int rc = cmd->run(&t);
  tcc_client_close(t.client);
  tcc_client_library_shutdown();
  free(rest);
  fflush(stdout);
  return rc;
}
