/*
 * log.c — leveled logs on stderr, one line each:
 *
 *   2026-11-21T06:50:01.123Z INFO  compile 3f2a… miss 41.2 ms (cpu:x86-64-v2)
 *
 * Only the daemon logs; the libraries it uses return errors instead.
 * One fprintf per line, so lines from different threads never interleave.
 * Messages often quote what a client sent (value names, op names, error
 * text): control characters are escaped (\n, \t, \xNN), so a request
 * can never forge a log line or a terminal escape sequence.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "daemon.h"

static tccd_log_level current_level = TCCD_LOG_INFO;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int tccd_log_parse_level(const char *s, tccd_log_level *out) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, names[i]) == 0) {
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

void tccd_log_set_level(tccd_log_level level) { current_level = level; }

/* Copies s into out (cap bytes, NUL-terminated), escaping control
 * characters and DEL; UTF-8 and other bytes >= 0x80 pass unchanged. */
static void log_escape(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p && n + 5 < cap; p++) {
    unsigned char c = *p;
    if (c == '\n') out[n++] = '\\', out[n++] = 'n';
    else if (c == '\t') out[n++] = '\\', out[n++] = 't';
    else if (c == '\r') out[n++] = '\\', out[n++] = 'r';
    else if (c < 0x20 || c == 0x7f) n += (size_t)snprintf(out + n, cap - n, "\\x%02x", c);
    else out[n++] = (char)c;
  }
  out[n] = '\0';
}

int tccd_log_enabled(tccd_log_level level) { return level <= current_level; }

void tccd_log(tccd_log_level level, const char *fmt, ...) {
  if (!tccd_log_enabled(level)) return;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char when[32], msg[2048];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char safe[sizeof msg * 4];
  log_escape(msg, safe, sizeof safe);
  fprintf(stderr, "%s.%03dZ %-5s %s\n", when, (int)(tv.tv_usec / 1000),
          level_names[level], safe);
}
