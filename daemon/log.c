/*
 * log.c — leveled logs on stderr, one line each, as text (the default)
 * or as one JSON object per line (--log-format json):
 *
 *   2026-11-21T06:50:01.123Z INFO  compile 3f2a… miss 41.2 ms (cpu:x86-64-v2) request_id=5c1e…
 *   {"time":"2026-11-21T06:50:01.123Z","level":"info","msg":"compile 3f2a…","request_id":"5c1e…",…}
 *
 * Only the daemon logs; the libraries it uses return errors instead.
 * One fprintf per line, so lines from different threads never interleave.
 * A line about a call passes a tccd_log_ctx (tccd_log_fields): its request
 * id, method, client label, guard hash, status and durations become JSON
 * fields (docs/operations.md lists them); the text format appends only
 * request_id=.
 *
 * Messages often quote what a client sent (value names, op names, error
 * text, the client label). Text: control characters are escaped (\n, \t,
 * \xNN), so a request can never forge a log line or a terminal escape
 * sequence. JSON: strings are escaped per RFC 8259 (\", \\, \n, \u00XX)
 * and bytes that are not valid UTF-8 become U+FFFD, so every line parses.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "daemon.h"

static tccd_log_level current_level = TCCD_LOG_INFO;
static tccd_log_format current_format = TCCD_LOG_TEXT;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const char *const level_json_names[] = {"error", "warn", "info", "debug"};

int tccd_log_parse_level(const char *s, tccd_log_level *out) {
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, level_json_names[i]) == 0) {
      *out = (tccd_log_level)i;
      return 0;
    }
  }
  if (strcasecmp(s, "warning") == 0) {
    *out = TCCD_LOG_WARN;
    return 0;
  }
  return -1;
}

int tccd_log_parse_format(const char *s, tccd_log_format *out) {
  if (strcasecmp(s, "text") == 0) *out = TCCD_LOG_TEXT;
  else if (strcasecmp(s, "json") == 0) *out = TCCD_LOG_JSON;
  else return -1;
  return 0;
}

void tccd_log_set_level(tccd_log_level level) { current_level = level; }
void tccd_log_set_format(tccd_log_format format) { current_format = format; }

/* ------------------------------------------------------------ one line */

/* A line being built, always NUL-terminated: what does not fit is cut,
 * never overrun (tccd_log_fieldsv sizes it so nothing is cut). */
typedef struct line_buf {
  char *s;
  size_t n, cap;
} line_buf;

static void put(line_buf *b, const char *s, size_t len) {
  if (b->n + len >= b->cap) len = b->n < b->cap - 1 ? b->cap - 1 - b->n : 0;
  memcpy(b->s + b->n, s, len);
  b->n += len;
  b->s[b->n] = '\0';
}

static void puts_(line_buf *b, const char *s) { put(b, s, strlen(s)); }

static void putf(line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(line_buf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k > 0) put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* Text: s with control characters and DEL escaped; UTF-8 and other bytes
 * >= 0x80 pass unchanged. */
static void put_text_escaped(line_buf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned char c = *p;
    if (c == '\n') puts_(b, "\\n");
    else if (c == '\t') puts_(b, "\\t");
    else if (c == '\r') puts_(b, "\\r");
    else if (c < 0x20 || c == 0x7f) putf(b, "\\x%02x", c);
    else put(b, (const char *)p, 1);
  }
}

/* The length of the valid UTF-8 sequence at p (1-4), or 0 when p does not
 * start one (a stray continuation byte, an overlong form, a surrogate,
 * past U+10FFFF, or cut short). */
static size_t utf8_seq_len(const unsigned char *p) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;      /* overlong */
    if (c == 0xed) hi = 0x9f;      /* surrogates */
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;      /* overlong */
    if (c == 0xf4) hi = 0x8f;      /* past U+10FFFF */
  } else return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  return n;
}

/* JSON: s as a quoted string (RFC 8259), invalid UTF-8 as U+FFFD. */
static void put_json_string(line_buf *b, const char *s) {
  puts_(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned char c = *p;
    if (c == '"') puts_(b, "\\\"");
    else if (c == '\\') puts_(b, "\\\\");
    else if (c == '\n') puts_(b, "\\n");
    else if (c == '\t') puts_(b, "\\t");
    else if (c == '\r') puts_(b, "\\r");
    else if (c < 0x20 || c == 0x7f) putf(b, "\\u%04x", c);
    else {
      size_t n = utf8_seq_len(p);
      if (n == 0) {
        puts_(b, "\\ufffd");
        n = 1;
      } else {
        put(b, (const char *)p, n);
      }
      p += n;
      continue;
    }
    p++;
  }
  puts_(b, "\"");
}

static void put_json_field(line_buf *b, const char *key, const char *value) {
  if (!value || !*value) return;
  putf(b, ",\"%s\":", key);
  put_json_string(b, value);
}

static void put_json_ms(line_buf *b, const char *key, double ms) {
  if (ms >= 0) putf(b, ",\"%s\":%.3f", key, ms);
}

int tccd_log_enabled(tccd_log_level level) { return level <= current_level; }

void tccd_log_fieldsv(tccd_log_level level, const tccd_log_ctx *ctx, const char *fmt, va_list ap) {
  if (!tccd_log_enabled(level)) return;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char when[40], msg[2048];
  size_t k = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(when + k, sizeof when - k, ".%03dZ", (int)(tv.tv_usec / 1000));
  vsnprintf(msg, sizeof msg, fmt, ap);
  /* Room for the message escaped at worst (6 bytes a byte) and the
   * fields (the client label is cut at TCCD_CLIENT_LABEL_MAX bytes). */
  char out[sizeof msg * 6 + 2048];
  line_buf b = {out, 0, sizeof out};
  out[0] = '\0';
  if (current_format == TCCD_LOG_JSON) {
    putf(&b, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":", when, level_json_names[level]);
    put_json_string(&b, msg);
    if (ctx) {
      put_json_field(&b, "request_id", ctx->request_id);
      put_json_field(&b, "method", ctx->method);
      put_json_field(&b, "client", ctx->client);
      put_json_field(&b, "guard_hash", ctx->guard_hash);
      if (ctx->has_status) put_json_field(&b, "status", ctx->status ? tcc_status_name(ctx->status) : "OK");
      put_json_ms(&b, "duration_ms", ctx->duration_ms);
      put_json_ms(&b, "queue_ms", ctx->queue_ms);
      put_json_ms(&b, "compile_ms", ctx->compile_ms);
    }
    puts_(&b, "}");
  } else {
    putf(&b, "%s %-5s ", when, level_names[level]);
    put_text_escaped(&b, msg);
    if (ctx && ctx->request_id && *ctx->request_id) {
      puts_(&b, " request_id=");
      put_text_escaped(&b, ctx->request_id);
    }
  }
  fprintf(stderr, "%s\n", out);
}

void tccd_log_fields(tccd_log_level level, const tccd_log_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tccd_log_fieldsv(level, ctx, fmt, ap);
  va_end(ap);
}

void tccd_log(tccd_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tccd_log_fieldsv(level, NULL, fmt, ap);
  va_end(ap);
}
