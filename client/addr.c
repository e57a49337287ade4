/*
 * addr.c — the one check of a tccd address, before anything dials it.
 *
 * gRPC takes almost any string as a channel target and fails late and
 * obscurely: "127.0.0.1:99999" dials port 34463 (the port wraps at 16
 * bits), "garbage" is looked up as a host name on port 443. tcctl, the
 * Python package (through tcc_client_addr_check) and tcc_client_connect
 * all run this check first, so a typo is a usage error naming the address.
 *
 * Accepted forms (what tccd's --listen accepts, plus gRPC's dns: URI):
 *
 *   HOST:PORT             HOST a host name (letters, digits, '-', '_',
 *                         labels of 1-63 separated by dots, 253 at most)
 *                         or a dotted-quad IPv4 address
 *   [IPV6]:PORT           an IPv6 address in brackets, with an optional
 *                         zone (%eth0)
 *   dns:HOST:PORT         the same, as gRPC URIs (dns:///HOST:PORT, or
 *   dns:///HOST:PORT      dns://AUTHORITY/HOST:PORT)
 *   unix:PATH             a Unix socket (unix:///abs/path too); the path
 *                         must fit in sockaddr_un (107 bytes)
 *
 * PORT is decimal, 1 to 65535. Nothing else (no ipv4:/ipv6: lists, no
 * default port): tccd has no standard port a reader would know.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "tccclient.h"

#define HOST_MAX 253
#define LABEL_MAX 63
#define FORMS "HOST:PORT, [IPV6]:PORT or unix:PATH"

/* ASCII classes, whatever the locale (a Python process sets LC_CTYPE). */
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_alnum(char ch) { return is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }
static int is_visible(char ch) { return ch > ' ' && ch < 0x7f; }

/* Is s[0..n) only digits and dots (so it must be an IPv4 address)? */
static int looks_numeric(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!is_digit(s[i]) && s[i] != '.') return 0;
  return 1;
}

/* Is s[0..n) a host name: dot-separated labels of letters, digits, '-'
 * and '_', none empty, none longer than 63, none starting or ending with
 * '-'? (A trailing dot, the DNS root, is allowed.) */
static int is_hostname(const char *s, size_t n) {
  if (n == 0 || n > HOST_MAX + 1 || (n == HOST_MAX + 1 && s[n - 1] != '.')) return 0;
  if (s[n - 1] == '.') n--;
  size_t label = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || s[i] == '.') {
      if (label == 0 || label > LABEL_MAX || s[i - label] == '-' || s[i - 1] == '-') return 0;
      label = 0;
    } else if (is_alnum(s[i]) || s[i] == '-' || s[i] == '_') {
      label++;
    } else {
      return 0;
    }
  }
  return 1;
}

/* Checks PORT (the text after the host's ':'). Returns 0 or the error. */
static int check_port(const char *addr, const char *port, tcc_error *err) {
  if (!*port) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': the port is missing", addr);
  long v = 0;
  for (const char *p = port; *p; p++) {
    if (!is_digit(*p))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': port '%s' is not a number", addr, port);
    if (v <= 65535) v = v * 10 + (*p - '0');
  }
  if (v < 1 || v > 65535)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': port %s is out of range (1-65535)", addr,
                         port);
  return 0;
}

/* Checks "HOST:PORT" or "[IPV6]:PORT" (hp, a suffix of addr). */
static int check_host_port(const char *addr, const char *hp, tcc_error *err) {
  if (hp[0] == '[') {
    const char *close = strchr(hp, ']');
    if (!close)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': '[' without its ']'", addr);
    char ip[INET6_ADDRSTRLEN + 64];
    size_t n = (size_t)(close - hp - 1);
    const char *zone = memchr(hp + 1, '%', n);
    size_t ipn = zone ? (size_t)(zone - hp - 1) : n;
    struct in6_addr a6;
    int zone_ok = !zone || (zone + 1 < close && is_hostname(zone + 1, (size_t)(close - zone - 1)));
    if (ipn >= sizeof ip || (memcpy(ip, hp + 1, ipn), ip[ipn] = '\0', inet_pton(AF_INET6, ip, &a6) != 1) ||
        !zone_ok)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': '%.*s' is not an IPv6 address", addr,
                           (int)n, hp + 1);
    if (close[1] != ':')
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': the port is missing (%s)", addr,
                           "[IPV6]:PORT");
    return check_port(addr, close + 2, err);
  }
  const char *colon = strrchr(hp, ':');
  if (!colon)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': the port is missing (expected %s)", addr,
                         FORMS);
  if (memchr(hp, ':', (size_t)(colon - hp)))
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "tccd address '%s': an IPv6 address goes in brackets, as [IPV6]:PORT", addr);
  size_t n = (size_t)(colon - hp);
  if (n == 0) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': the host is missing", addr);
  if (looks_numeric(hp, n)) {
    char ip[INET_ADDRSTRLEN];
    struct in_addr a4;
    if (n >= sizeof ip || (memcpy(ip, hp, n), ip[n] = '\0', inet_pton(AF_INET, ip, &a4) != 1))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': '%.*s' is not an IPv4 address", addr,
                           (int)n, hp);
  } else if (!is_hostname(hp, n)) {
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "tccd address '%s': '%.*s' is not a host name or IP address (expected %s)", addr,
                         (int)(n > 80 ? 80 : n), hp, FORMS);
  }
  return check_port(addr, colon + 1, err);
}

int tcc_client_addr_check(const char *addr, tcc_error *err) {
  if (!addr || !*addr)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "the tccd address is empty (expected %s)", FORMS);
  if (strlen(addr) > 512)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%.40s...' is too long", addr);
  for (const char *p = addr; *p; p++)
    if (!is_visible(*p))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                           "tccd address '%s': spaces, control or non-ASCII characters are not allowed", addr);
  if (!strncmp(addr, "unix:", 5)) {
    const char *path = addr + 5;
    if (!strncmp(path, "//", 2)) path += 2; /* unix:///abs/path: the path is /abs/path */
    if (!*path)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': unix: needs a socket path", addr);
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': the socket path is longer than %zu bytes",
                           addr, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    return 0;
  }
  const char *hp = addr;
  if (!strncmp(addr, "dns:", 4)) {
    hp = addr + 4;
    if (!strncmp(hp, "//", 2)) { /* dns://[AUTHORITY]/HOST:PORT */
      const char *slash = strchr(hp + 2, '/');
      if (!slash)
        return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "tccd address '%s': expected dns:///HOST:PORT", addr);
      hp = slash + 1;
    }
  }
  return check_host_port(addr, hp, err);
}
