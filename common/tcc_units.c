/*
 * tcc_units.c — the one byte-size grammar (tcc_units.h). strtod reads
 * the number (so "1.5G" works); the unit is matched by hand.
 */
#include "tcc_units.h"

#include <errno.h>
#include <stdlib.h>

int tcc_parse_bytes(const char *s, int64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || v < 0 || v != v) return -1;
  double mult = 1;
  switch (*end) {
  case 'k': case 'K': mult = 1024.0; end++; break;
  case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
  case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
  case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
  }
  if (mult > 1 && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end || v * mult >= 9223372036854775807.0) return -1;
  *out = (int64_t)(v * mult);
  return 0;
}

int tcc_parse_seconds(const char *s, int64_t *out) {
  if (!s || *s < '0' || *s > '9') return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || errno || v < 0) return -1;
  int64_t mult = 1;
  switch (*end) {
  case 'd': mult = 86400; end++; break;
  case 'h': mult = 3600; end++; break;
  case 'm': mult = 60; end++; break;
  case 's': end++; break;
  }
  if (*end || v > INT64_MAX / mult / 1000) return -1;
  *out = (int64_t)v * mult;
  return 0;
}
