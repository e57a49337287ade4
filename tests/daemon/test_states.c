/*
 * test_states.c — the daemon's state machines against their drawings:
 * the call (call.c), the remote flight (remote.c) and the Redis node
 * (redis_cluster.c). Each machine's allowed moves are written out here
 * again, from the drawing at the top of its file; the test walks a legal
 * path through them and checks the file's table (the
 * *_transition_allowed function its *_set_state asserts with) allows
 * exactly those moves and refuses every other, so an illegal move is
 * caught without tripping the assert. The daemon's object files are
 * linked in; nothing is started.
 */
#include <check.h>
#include <stdio.h>

#include "daemon.h"

typedef struct move {
  int from, to;
} move;

typedef int (*allowed_fn)(int from, int to);

/* Every (from, to) of n states: allowed exactly when listed in moves. */
static void check_table(const char *machine, allowed_fn allowed, int n, const char *const *names,
                        const move *moves, size_t nmoves) {
  for (int from = 0; from < n; from++)
    for (int to = 0; to < n; to++) {
      int want = 0;
      for (size_t i = 0; i < nmoves; i++) want |= moves[i].from == from && moves[i].to == to;
      ck_assert_msg(allowed(from, to) == want, "%s: %s -> %s is %s by the table, %s by the drawing", machine,
                    names[from], names[to], allowed(from, to) ? "allowed" : "refused",
                    want ? "allowed" : "refused");
    }
}

/* Walks path (states) through the table: each step must be allowed. */
static void walk(const char *machine, allowed_fn allowed, const char *const *names, const int *path, size_t n) {
  for (size_t i = 1; i < n; i++)
    ck_assert_msg(allowed(path[i - 1], path[i]), "%s: %s -> %s refused", machine, names[path[i - 1]],
                  names[path[i]]);
}

/* ------------------------------------------------------------ the call */

static const char *const call_names[] = {
#define NAME(s) #s,
    TCCD_CALL_STATES(NAME)
#undef NAME
};

static int call_allowed(int from, int to) {
  return tccd_call_transition_allowed((tccd_call_state)from, (tccd_call_state)to);
}

START_TEST(test_call_machine) {
  enum { R = TCCD_CALL_REQUESTED, A = TCCD_CALL_ACTIVE, S = TCCD_CALL_STREAMING, C = TCCD_CALL_CANCELLED,
         F = TCCD_CALL_FINISHING };
  static const move moves[] = {{R, A}, {A, S}, {A, C}, {A, F}, {S, C}, {S, F}, {C, F}};
  check_table("call", call_allowed, F + 1, call_names, moves, sizeof moves / sizeof *moves);
  static const int streamed[] = {R, A, S, F}, gone[] = {R, A, S, C, F}, waiter_gone[] = {R, A, C, F};
  walk("call", call_allowed, call_names, streamed, 4);
  walk("call", call_allowed, call_names, gone, 5);
  walk("call", call_allowed, call_names, waiter_gone, 4);
  ck_assert(!call_allowed(F, A));  /* a finished call never comes back */
  ck_assert(!call_allowed(R, F));  /* nothing to finish before it arrived */
  ck_assert(!call_allowed(C, S));  /* a stream to a client that left stays CANCELLED */
}
END_TEST

/* ------------------------------------------------------------ the remote flight */

static const char *const flight_names[] = {
#define NAME(s) #s,
    TCCD_FLIGHT_STATES(NAME)
#undef NAME
};

static int flight_allowed(int from, int to) {
  return tccd_flight_transition_allowed((tccd_flight_state)from, (tccd_flight_state)to);
}

START_TEST(test_flight_machine) {
  enum { P = TCCD_FLIGHT_PROBE, L = TCCD_FLIGHT_LOCK, W = TCCD_FLIGHT_WAIT, H = TCCD_FLIGHT_HIT,
         F = TCCD_FLIGHT_FAILURE, C = TCCD_FLIGHT_COMPILE, X = TCCD_FLIGHT_CANCELLED };
  static const move moves[] = {{P, H}, {P, F}, {P, L}, {P, W}, {P, C}, {P, X}, {L, C},
                               {L, W}, {L, X}, {W, P}, {W, C}, {W, X}};
  check_table("flight", flight_allowed, X + 1, flight_names, moves, sizeof moves / sizeof *moves);
  static const int waited_hit[] = {P, L, W, P, W, P, H}, locked[] = {P, L, C}, gave_up[] = {P, W, C};
  walk("flight", flight_allowed, flight_names, waited_hit, 7);
  walk("flight", flight_allowed, flight_names, locked, 3);
  walk("flight", flight_allowed, flight_names, gave_up, 3);
  ck_assert(!flight_allowed(W, L));  /* a poll probes first */
  ck_assert(!flight_allowed(L, H));  /* the lock's answer is no entry */
  ck_assert(!flight_allowed(H, C));  /* an ended flight never moves */
}
END_TEST

/* ------------------------------------------------------------ the Redis node */

static const char *const node_names[] = {
#define NAME(s) #s,
    TCCD_REDIS_NODE_STATES(NAME)
#undef NAME
};

static int node_allowed(int from, int to) {
  return tccd_redis_node_transition_allowed((tccd_redis_node_state)from, (tccd_redis_node_state)to);
}

START_TEST(test_node_machine) {
  enum { D = TCCD_REDIS_NODE_DOWN, I = TCCD_REDIS_NODE_CONNECTING, C = TCCD_REDIS_NODE_CONNECTED,
         X = TCCD_REDIS_NODE_CLOSED };
  static const move moves[] = {{D, I}, {D, X}, {I, C}, {I, D}, {I, X}, {C, D}, {C, X}};
  check_table("node", node_allowed, X + 1, node_names, moves, sizeof moves / sizeof *moves);
  static const int lost_and_back[] = {D, I, C, D, I, C, X}, refused[] = {D, I, D, I, X};
  walk("node", node_allowed, node_names, lost_and_back, 7);
  walk("node", node_allowed, node_names, refused, 5);
  ck_assert(!node_allowed(D, C));  /* connected only through a connect */
  ck_assert(!node_allowed(X, I));  /* a closed layer never reconnects */
}
END_TEST

int main(void) {
  Suite *s = suite_create("states");
  TCase *tc = tcase_create("tables");
  tcase_add_test(tc, test_call_machine);
  tcase_add_test(tc, test_flight_machine);
  tcase_add_test(tc, test_node_machine);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
