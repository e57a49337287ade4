/*
 * config.c — tccd's flags. Each flag --name also reads TCCD_NAME from the
 * environment (dashes become underscores, upper case); a flag on the
 * command line wins over the environment, which wins over the default.
 * The table below is the single list: parsing, env lookup and --help all
 * walk it.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "daemon.h"
#include "tcc_config.h"
#include "tcc_units.h"

typedef enum { OPT_STRING, OPT_INT, OPT_BYTES, OPT_LEVEL, OPT_FORMAT, OPT_BOOL, OPT_SECONDS } opt_kind;

typedef struct opt_def {
  const char *name;      /* flag without dashes */
  opt_kind kind;
  size_t offset;         /* into tccd_config */
  size_t cap;            /* for strings */
  const char *help;
} opt_def;

#define STR(field) OPT_STRING, offsetof(tccd_config, field), sizeof(((tccd_config *)0)->field)
#define NUM(kind, field) kind, offsetof(tccd_config, field), 0

static const opt_def options[] = {
  {"listen", STR(listen), "HOST:PORT to serve gRPC on (default " TCCD_DEFAULT_LISTEN "; port 0 picks one)"},
  {"cache-dir", STR(cache_dir), "kernel cache directory (default $XDG_CACHE_HOME/tccd or ~/.cache/tccd)"},
  {"workers", NUM(OPT_INT, workers), "compile worker threads (default: number of cores)"},
  {"queue-max", NUM(OPT_INT, queue_max), "compiles that may wait for a worker before RESOURCE_EXHAUSTED (default 64)"},
  {"cache-max-bytes", NUM(OPT_BYTES, cache_max_bytes), "artifact byte budget, e.g. 10G (default 10G; 0 = unlimited)"},
  {"log-level", NUM(OPT_LEVEL, log_level), "error, warn, info or debug (default info)"},
  {"log-format", NUM(OPT_FORMAT, log_format), "text, or json: one JSON object per line (default text)"},
  {"cc", STR(cc), "C compiler for CPU kernels (default " TCC_CC_DEFAULT ")"},
  {"compile-timeout-ms", NUM(OPT_INT, compile_timeout_ms), "per-compile time limit (default 120000)"},
  {"shutdown-grace-ms", NUM(OPT_INT, shutdown_grace_ms), "on SIGTERM, how long in-flight calls may finish (default 5000)"},
  {"port-file", STR(port_file), "write the bound port to this file once listening"},
  {"signing-key", STR(signing_key), "sign every artifact with this Ed25519 key (make one: tcctl keygen FILE)"},
  {"no-signing", NUM(OPT_BOOL, no_signing), "serve unsigned artifacts (default: sign with --signing-key, or with CACHE_DIR/signing.key, made on first start)"},
  {"trusted-keys", STR(trusted_keys), "comma-separated .pub files whose signatures are accepted from --redis (own key always)"},
  {"auth-tokens", STR(auth_tokens), "bearer tokens file, lines 'client TOKEN' / 'admin TOKEN' (default: no auth)"},
  {"tls-cert", STR(tls_cert), "serve TLS with this PEM certificate chain (needs --tls-key)"},
  {"tls-key", STR(tls_key), "PEM private key of --tls-cert"},
  {"tls-client-ca", STR(tls_client_ca), "require client certificates signed by this PEM CA (mTLS)"},
  {"redis", STR(redis), "shared remote cache tier: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"},
  {"redis-trust-unsigned", NUM(OPT_BOOL, redis_trust_unsigned), "with --no-signing and --redis: serve unsigned entries from Redis (anyone who can write to it can make clients run their code; refused without this flag)"},
  {"redis-ttl", NUM(OPT_SECONDS, redis_ttl_s), "remote entry lifetime, refreshed on remote hits (default 30d)"},
  {"redis-timeout-ms", NUM(OPT_INT, redis_timeout_ms), "a remote operation slower than this is skipped (default 1000)"},
  {"allow-root", NUM(OPT_BOOL, allow_root), "allow running as root (refused by default)"},
  {"autotune-timeout-ms", NUM(OPT_INT, autotune_timeout_ms), "max-autotune: wall-clock limit of one benchmark child (default 20000)"},
  {"autotune-reps", NUM(OPT_INT, autotune_reps), "max-autotune: timed runs per kernel and candidate, median taken (default 15)"},
  {"request-memory-max", NUM(OPT_BYTES, request_memory_max), "memory that requests being prepared and compiled may hold (estimated at 8x their encoded size) before RESOURCE_EXHAUSTED (default: a quarter of physical memory; 0 = no limit)"},
  {"metrics-listen", STR(metrics_listen), "HOST:PORT to serve Prometheus metrics on at /metrics (default: off; same auth and TLS as --listen)"},
  {"object-cache-max-bytes", NUM(OPT_BYTES, object_cache_max_bytes), "CPU kernel bodies' objects kept in CACHE_DIR/objects for other artifacts to link (default 256M; 0 = no object cache)"},
  {"plan-writers", STR(plan_writers), "who may hand the daemon plans (PutPlan): client (any client or admin token; anyone without --auth-tokens), admin (admin tokens only), or none (no new plans; kept ones are still served) (default client)"},
  {"failure-ttl", NUM(OPT_SECONDS, failure_ttl_s), "how long a deterministic compile failure is answered again without compiling, locally and through --redis (default 1d; 0 = never)"},
};

static void config_defaults(tccd_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->listen, sizeof cfg->listen, "%s", TCCD_DEFAULT_LISTEN);
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  if (xdg && *xdg)
    snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s/tccd", xdg);
  else
    snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s/.cache/tccd", home && *home ? home : ".");
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  cfg->workers = n > 0 ? (int)n : 1;
  cfg->queue_max = 64;
  cfg->cache_max_bytes = 10LL << 30;
  cfg->log_level = TCCD_LOG_INFO;
  snprintf(cfg->cc, sizeof cfg->cc, "%s", TCC_CC_DEFAULT);
  cfg->compile_timeout_ms = 120000;
  cfg->autotune_timeout_ms = 20000;
  cfg->autotune_reps = 15;
  cfg->shutdown_grace_ms = 5000;
  cfg->redis_ttl_s = 30 * 86400;
  cfg->redis_timeout_ms = 1000;
  cfg->failure_ttl_s = 86400;
  cfg->object_cache_max_bytes = 256LL << 20;
  snprintf(cfg->plan_writers, sizeof cfg->plan_writers, "client");
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  cfg->request_memory_max = pages > 0 && page > 0 ? (int64_t)pages * page / 4 : 4LL << 30;
}

/* "1", "true", "yes", "on" -> 1; "0", "false", "no", "off", "" -> 0. */
static int parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off", ""};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, 0;
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    if (strcasecmp(s, no[i]) == 0) return *out = 0, 0;
  return -1;
}

static int set_option(tccd_config *cfg, const opt_def *o, const char *value,
                      const char *source, tcc_error *err) {
  char *field = (char *)cfg + o->offset;
  switch (o->kind) {
  case OPT_STRING:
    if (strlen(value) >= o->cap)
      return tcc_error_set(err, -1, "%s: --%s value too long", source, o->name);
    memcpy(field, value, strlen(value) + 1);
    return 0;
  case OPT_INT: {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (*value == '\0' || *end || errno || v < 0 || v > INT_MAX)
      return tcc_error_set(err, -1, "%s: --%s expects a non-negative integer, got '%s'",
                           source, o->name, value);
    *(int *)field = (int)v;
    return 0;
  }
  case OPT_BYTES:
    if (tcc_parse_bytes(value, (int64_t *)field) != 0)
      return tcc_error_set(err, -1, "%s: --%s expects a byte count like 4096, 512M, 10G or 10GiB, got '%s'",
                           source, o->name, value);
    return 0;
  case OPT_LEVEL:
    if (tccd_log_parse_level(value, (tccd_log_level *)field) != 0)
      return tcc_error_set(err, -1, "%s: --%s expects error, warn, info or debug, got '%s'",
                           source, o->name, value);
    return 0;
  case OPT_FORMAT:
    if (tccd_log_parse_format(value, (tccd_log_format *)field) != 0)
      return tcc_error_set(err, -1, "%s: --%s expects text or json, got '%s'", source, o->name, value);
    return 0;
  case OPT_BOOL:
    if (parse_bool(value, (int *)field) != 0)
      return tcc_error_set(err, -1, "%s: --%s expects 1/0 (true/false, yes/no), got '%s'", source,
                           o->name, value);
    return 0;
  case OPT_SECONDS:
    if (tcc_parse_seconds(value, (int64_t *)field) != 0)
      return tcc_error_set(err, -1, "%s: --%s expects a duration like 3600, 90m, 12h or 30d, got '%s'",
                           source, o->name, value);
    return 0;
  }
  return -1;
}

void tccd_config_usage(FILE *out) {
  fprintf(out, "usage: tccd [OPTIONS]\n\n"
               "tccd compiles tensor graphs into kernels and caches them.\n\n"
               "Options (each also read from the environment as TCCD_<NAME>):\n");
  for (size_t i = 0; i < sizeof options / sizeof *options; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s%s", options[i].name, options[i].kind == OPT_BOOL ? "" : " V");
    fprintf(out, "  --%-22s %s\n", name, options[i].help);
  }
  fprintf(out, "  --%-22s %s\n  --%-22s %s\n", "help", "show this help", "version",
          "print the version");
}

int tccd_config_load(tccd_config *cfg, int argc, char **argv, tcc_error *err) {
  config_defaults(cfg);
  const size_t n = sizeof options / sizeof *options;
  int cli_signing = 0; /* bits: 1 --signing-key, 2 --no-signing on the command line */
  for (size_t i = 0; i < n; i++) {
    char env[64] = "TCCD_";
    for (const char *p = options[i].name; *p; p++) {
      size_t len = strlen(env);
      env[len] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
      env[len + 1] = '\0';
    }
    const char *v = getenv(env);
    if (v && *v && set_option(cfg, &options[i], v, env, err) != 0) return -1;
  }
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      tccd_config_usage(stdout);
      return 1;
    }
    if (strcmp(arg, "--version") == 0) {
      printf("tccd %s\n", TCC_VERSION);
      return 1;
    }
    if (strncmp(arg, "--", 2) != 0)
      return tcc_error_set(err, -1, "unexpected argument '%s' (see --help)", arg);
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_def *o = NULL;
    for (size_t i = 0; i < n; i++)
      if (strlen(options[i].name) == name_len && strncmp(options[i].name, name, name_len) == 0)
        o = &options[i];
    if (!o) return tcc_error_set(err, -1, "unknown option '%s' (see --help)", arg);
    const char *value = eq ? eq + 1 : NULL;
    if (!value && o->kind == OPT_BOOL) value = "1"; /* a bare flag */
    if (!value) {
      if (a + 1 >= argc) return tcc_error_set(err, -1, "option --%s needs a value", o->name);
      value = argv[++a];
    }
    if (set_option(cfg, o, value, "command line", err) != 0) return -1;
    if (strcmp(o->name, "signing-key") == 0) cli_signing |= 1;
    if (strcmp(o->name, "no-signing") == 0 && cfg->no_signing) cli_signing |= 2;
  }
  if (cfg->workers < 1) return tcc_error_set(err, -1, "--workers must be at least 1");
  /* The command line wins over the environment for the signing choice too. */
  if (cli_signing == 1) cfg->no_signing = 0;
  if (cli_signing == 2) cfg->signing_key[0] = '\0';
  if (cli_signing == 3) cfg->no_signing = 1; /* both given: reported below */
  if (cfg->signing_key[0] && cfg->no_signing)
    return tcc_error_set(err, -1, "--signing-key and --no-signing contradict each other; pick one");
  /* Neither: the daemon's own key in the cache dir (made on first start). */
  if (!cfg->tls_cert[0] != !cfg->tls_key[0])
    return tcc_error_set(err, -1, "--tls-cert and --tls-key go together");
  if (cfg->tls_client_ca[0] && !cfg->tls_cert[0])
    return tcc_error_set(err, -1, "--tls-client-ca needs --tls-cert and --tls-key");
  if (cfg->redis_ttl_s < 1) return tcc_error_set(err, -1, "--redis-ttl must be at least 1s");
  if (cfg->redis_timeout_ms < 1) return tcc_error_set(err, -1, "--redis-timeout-ms must be at least 1");
  if (strcmp(cfg->plan_writers, "client") != 0 && strcmp(cfg->plan_writers, "admin") != 0 &&
      strcmp(cfg->plan_writers, "none") != 0)
    return tcc_error_set(err, -1, "--plan-writers expects client, admin or none, got '%s'", cfg->plan_writers);
  return 0;
}

int tccd_listen_resolve(const char *listen, struct addrinfo **out, char *why, size_t cap) {
  *out = NULL;
  char host[256];
  const char *colon = strrchr(listen, ':');
  if (!colon || !colon[1] || (size_t)(colon - listen) >= sizeof host) {
    snprintf(why, cap, "expects HOST:PORT, got '%s'", listen);
    return -1;
  }
  memcpy(host, listen, (size_t)(colon - listen));
  host[colon - listen] = '\0';
  char *h = host;
  if (h[0] == '[') { /* [::1]:port */
    h++;
    char *end = strchr(h, ']');
    if (end) *end = '\0';
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  int rc = getaddrinfo(*h ? h : NULL, colon + 1, &hints, out);
  if (rc != 0) {
    snprintf(why, cap, "cannot resolve '%s': %s", host, gai_strerror(rc));
    *out = NULL;
    return -1;
  }
  return 0;
}
