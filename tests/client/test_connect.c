/*
 * test_connect.c — tcc_client_connect when nothing listens: UNAVAILABLE
 * within the connect timeout (never a hang), with the address in the
 * message; $TCCD_ADDR is the default address.
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
  Suite *s = suite_create("connect");
  TCase *tc = tcase_create("unavailable");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, nothing_listening_is_unavailable_within_timeout);
  tcase_add_test(tc, default_address_from_environment);
  tcase_add_test(tc, unresolvable_host_is_unavailable);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
