/*
 * test_connect.c — tcc_client_connect when nothing listens: UNAVAILABLE
 * at once for a refused connection, whatever the connect timeout, with the
 * address in the message; the full timeout only for a peer that accepts
 * the connection but never answers; $TCCD_ADDR is the default address;
 * addresses are checked (tcc_client_addr_check) before anything dials.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tccclient.h"
#include "tcctest.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* A loopback port nothing listens on: bound, read back, closed. */
static int dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t n = sizeof a;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

START_TEST(nothing_listening_is_unavailable_within_timeout) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", dead_port());
  tcc_client_options opts = {.connect_timeout_ms = 400};
  tcc_client *c = (tcc_client *)0x1;
  tcc_error err = {0};
  double t0 = now_s();
  int rc = tcc_client_connect(addr, &opts, &c, &err);
  double dt = now_s() - t0;
  ck_assert_int_eq(rc, TCC_E_UNAVAILABLE);
  ck_assert_int_eq(err.code, TCC_E_UNAVAILABLE);
  ck_assert_ptr_null(c);
  char want[128];
  snprintf(want, sizeof want, "cannot reach tccd at %s: ", addr);
  ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "message: %s", err.msg);
  /* generous: under valgrind on a loaded machine gRPC start-up alone takes
   * seconds; what this catches is a connect that ignores its timeout */
  ck_assert_msg(dt < 10.0, "connect took %.2f s with a 0.4 s timeout", dt);
  tcc_client_library_shutdown();
}
END_TEST

/* A refused connection (nothing listens) fails fast: not after the
 * connect timeout (10 s here), in well under a second. */
START_TEST(refused_is_unavailable_at_once) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", dead_port());
  tcc_client_options opts = {.connect_timeout_ms = 10000};
  tcc_client *c = NULL;
  tcc_error err = {0};
  /* gRPC's own start-up (threads, resolver) is not what is measured */
  ck_assert_int_eq(tcc_client_connect(addr, &opts, &c, &err), TCC_E_UNAVAILABLE);
  for (int i = 0; i < 3; i++) {
    double t0 = now_s();
    int rc = tcc_client_connect(addr, &opts, &c, &err);
    double dt = now_s() - t0;
    ck_assert_int_eq(rc, TCC_E_UNAVAILABLE);
    ck_assert_ptr_null(c);
    char want[128];
    snprintf(want, sizeof want, "cannot reach tccd at %s: ", addr);
    ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "message: %s", err.msg);
    ck_assert_msg(strstr(err.msg, "Connection refused"), "message: %s", err.msg);
    double limit = RUNNING_ON_VALGRIND ? 5.0 : 1.0; /* valgrind runs gRPC ~30x slower */
    ck_assert_msg(dt < limit, "a refused connect took %.3f s (connect timeout 10 s)", dt);
  }
  tcc_client_library_shutdown();
}
END_TEST

/* Something accepts the connection but never speaks HTTP/2 (a daemon too
 * busy to answer, a wrong service): that is waited for, up to the
 * connect timeout, and then named as such. */
START_TEST(silent_peer_waits_for_the_connect_timeout) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t n = sizeof a;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(fd, 16), 0); /* the kernel completes handshakes; nobody accepts */
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  tcc_client_options opts = {.connect_timeout_ms = 700};
  tcc_client *c = NULL;
  tcc_error err = {0};
  double t0 = now_s();
  int rc = tcc_client_connect(addr, &opts, &c, &err);
  double dt = now_s() - t0;
  close(fd);
  ck_assert_int_eq(rc, TCC_E_UNAVAILABLE);
  ck_assert_msg(strstr(err.msg, addr) && strstr(err.msg, "not ready after 700 ms"), "message: %s", err.msg);
  ck_assert_msg(dt >= 0.65, "gave up after %.3f s, before the 0.7 s connect timeout", dt);
  ck_assert_msg(dt < 10.0, "connect took %.2f s with a 0.7 s timeout", dt);
  tcc_client_library_shutdown();
}
END_TEST

/* tcc_client_addr_check: the forms tccd listens on, and clear refusals. */
START_TEST(addresses_are_checked) {
  static const char *good[] = {
      "127.0.0.1:7311", "localhost:1", "tccd.example.com:65535", "node-7.cluster_a.local:80",
      "[::1]:7311", "[fe80::1%eth0]:7311", "[2001:db8::42]:1", "dns:///tccd.svc:7311", "dns:tccd:7311",
      "dns://8.8.8.8/tccd.svc:7311", "unix:/run/tccd.sock", "unix:///run/tccd.sock", "unix:rel.sock",
      "host.:7311",
  };
  static const struct {
    const char *addr, *why;
  } bad[] = {
      {"127.0.0.1:99999", "port 99999 is out of range (1-65535)"},
      {"127.0.0.1:0", "port 0 is out of range"},
      {"127.0.0.1:65536", "port 65536 is out of range"},
      {"127.0.0.1:123456789012345678901234567890", "is out of range"},
      {"garbage", "the port is missing"},
      {"host:", "the port is missing"},
      {"host:http", "port 'http' is not a number"},
      {"host:-1", "port '-1' is not a number"},
      {":7311", "the host is missing"},
      {"1.2.3:80", "'1.2.3' is not an IPv4 address"},
      {"256.0.0.1:80", "'256.0.0.1' is not an IPv4 address"},
      {"::1:7311", "an IPv6 address goes in brackets"},
      {"[::1]", "the port is missing"},
      {"[::1:7311", "'[' without its ']'"},
      {"[zz::1]:7311", "'zz::1' is not an IPv6 address"},
      {"[127.0.0.1]:7311", "is not an IPv6 address"},
      {"bad_host!:7311", "is not a host name or IP address"},
      {"-lead.example:7311", "is not a host name or IP address"},
      {"a..b:7311", "is not a host name or IP address"},
      {"two words:7311", "spaces, control or non-ASCII characters"},
      {"", "the tccd address is empty"},
      {"unix:", "unix: needs a socket path"},
      {"dns://8.8.8.8", "expected dns:///HOST:PORT"},
  };
  tcc_error err = {0};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(tcc_client_addr_check(good[i], &err) == 0, "%s refused: %s", good[i], err.msg);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    ck_assert_msg(tcc_client_addr_check(bad[i].addr, &err) == TCC_E_INVALID_ARGUMENT, "%s accepted", bad[i].addr);
    ck_assert_int_eq(err.code, TCC_E_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, bad[i].why), "%s: %s", bad[i].addr, err.msg);
    if (*bad[i].addr)
      ck_assert_msg(strstr(err.msg, bad[i].addr), "%s: message does not name it: %s", bad[i].addr, err.msg);
  }
  char longlabel[128];
  memset(longlabel, 'a', 64);
  snprintf(longlabel + 64, sizeof longlabel - 64, ".example:80");
  ck_assert_int_eq(tcc_client_addr_check(longlabel, &err), TCC_E_INVALID_ARGUMENT); /* a 64-byte label */
  char longpath[200];
  memset(longpath, 'p', sizeof longpath);
  memcpy(longpath, "unix:/", 6);
  longpath[sizeof longpath - 1] = '\0';
  ck_assert_int_eq(tcc_client_addr_check(longpath, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.msg, "longer than 107 bytes"), "%s", err.msg);
  ck_assert_int_eq(tcc_client_addr_check(NULL, &err), TCC_E_INVALID_ARGUMENT);

  /* connect refuses them before dialing; from $TCCD_ADDR, naming it */
  tcc_client *c = (tcc_client *)0x1;
  ck_assert_int_eq(tcc_client_connect("127.0.0.1:99999", NULL, &c, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err.msg, "port 99999 is out of range"), "%s", err.msg);
  setenv("TCCD_ADDR", "garbage", 1);
  ck_assert_int_eq(tcc_client_connect(NULL, NULL, &c, &err), TCC_E_INVALID_ARGUMENT);
  ck_assert_msg(!strncmp(err.msg, "TCCD_ADDR: tccd address 'garbage': ", 35), "%s", err.msg);
  ck_assert_int_eq(tcc_client_open("", 0, 0, NULL, &c, &err), TCC_E_INVALID_ARGUMENT);
  unsetenv("TCCD_ADDR");
  tcc_client_library_shutdown();
}
END_TEST

START_TEST(default_address_from_environment) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", dead_port());
  setenv("TCCD_ADDR", addr, 1);
  tcc_client_options opts = {.connect_timeout_ms = 200};
  tcc_client *c = NULL;
  tcc_error err = {0};
  ck_assert_int_eq(tcc_client_connect(NULL, &opts, &c, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, addr));
  /* tcc_client_open (the FFI form) with an empty address does the same. */
  ck_assert_int_eq(tcc_client_open("", 0, 200, NULL, &c, &err), TCC_E_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(err.msg, addr));
  unsetenv("TCCD_ADDR");
  tcc_client_library_shutdown();
}
END_TEST

START_TEST(unresolvable_host_is_unavailable) {
  tcc_client_options opts = {.connect_timeout_ms = 300};
  tcc_client *c = NULL;
  tcc_error err = {0};
  double t0 = now_s();
  ck_assert_int_eq(tcc_client_connect("no-such-host.invalid:7311", &opts, &c, &err), TCC_E_UNAVAILABLE);
  ck_assert_msg(now_s() - t0 < 5.0, "took too long");
  ck_assert_ptr_nonnull(strstr(err.msg, "no-such-host.invalid:7311"));
  tcc_client_library_shutdown();
}
END_TEST

int main(void) {
  return tt_run_tests("connect", 30, 0, (const TTest *[]){
      nothing_listening_is_unavailable_within_timeout,
      default_address_from_environment,
      unresolvable_host_is_unavailable,
      refused_is_unavailable_at_once,
      silent_peer_waits_for_the_connect_timeout,
      addresses_are_checked,
      NULL});
}
