/*
 * tcc_units.h — byte sizes as people write them, one grammar for every
 * program (tccd's flags, tcctl's options).
 *
 *   size   = number [unit]          number: decimal, may have a fraction
 *   unit   = ("K"|"M"|"G"|"T") ["i"] ["B"]  |  "B"      (case-insensitive
 *                                             K/M/G/T; powers of 1024)
 *
 * "4096", "512M", "1.5G", "10Gi", "10GiB", "10GB" and "7B" are sizes;
 * "1Q", "G", "-1", "1e30" are not.
 *
 * And durations in whole seconds:
 *
 *   duration = integer ["s"|"m"|"h"|"d"]       (seconds, minutes, hours, days)
 *
 * "3600", "90m", "12h" and "30d" are durations; "1.5h", "-1", "1w" are not.
 */
#ifndef TCC_UNITS_H
#define TCC_UNITS_H

#include <stdint.h>

/* Parses s. Returns 0 with *out set, or -1 (nothing written) when s is
 * not a size or exceeds INT64_MAX bytes. */
int tcc_parse_bytes(const char *s, int64_t *out);

/* Parses a duration into seconds. Returns 0 with *out set, or -1 (nothing
 * written) when s is not one or its milliseconds exceed INT64_MAX. */
int tcc_parse_seconds(const char *s, int64_t *out);

#endif
