/*
 * test_states.c — the daemon's state machines against their drawings:
 * the call (call.c), the remote flight (remote.c) and the Redis node
 * (redis_cluster.c). Each machine's allowed moves are written out here
 * again, from the drawing at the top of its file; the test walks legal
 * paths through them and checks the file's table (the
 * *_transition_allowed function its *_set_state asserts with) allows
 * exactly those moves and refuses every other, so an illegal move is
 * caught without tripping the assert. The daemon's object files are
 * linked in; nothing is started.
 */
#include <check.h>
#include <stdio.h>

#include "daemon.h"
#include "tcctest.h"

#define NAME(s) #s,
static const char *const call_names[] = {TCCD_CALL_STATES(NAME)};
static const char *const flight_names[] = {TCCD_FLIGHT_STATES(NAME)};
static const char *const node_names[] = {TCCD_REDIS_NODE_STATES(NAME)};
#undef NAME

/* NAME_allowed(from, to): PREFIX_transition_allowed, on ints */
#define ALLOWED(name, prefix)                                                \
  static int name##_allowed(int f, int t) {                                  \
    return prefix##_transition_allowed((prefix##_state)f, (prefix##_state)t); \
  }
ALLOWED(call, tccd_call)
ALLOWED(flight, tccd_flight)
ALLOWED(node, tccd_redis_node)
#undef ALLOWED

#define END -1
#define COUNT(a) (sizeof (a) / sizeof *(a))

typedef struct move {
  int from, to;
} move;

/* A machine as its drawing has it: every allowed move, and legal paths
 * (each ends with END) to walk. */
typedef struct machine {
  const char *name;
  int (*allowed)(int from, int to);
  const char *const *names;
  int nstates;
  const move *moves;
  size_t nmoves;
  const int (*paths)[8];
  size_t npaths;
} machine;

/* call.c */
enum { R = TCCD_CALL_REQUESTED, A = TCCD_CALL_ACTIVE, S = TCCD_CALL_STREAMING, CC = TCCD_CALL_CANCELLED,
       F = TCCD_CALL_FINISHING };
static const move call_moves[] = {{R, A}, {A, S}, {A, CC}, {A, F}, {S, CC}, {S, F}, {CC, F}};
static const int call_paths[][8] = {
    {R, A, F, END},          /* a reply */
    {R, A, S, F, END},       /* a streamed Fetch */
    {R, A, S, CC, F, END},   /* the client left mid-stream */
    {R, A, CC, F, END},      /* a compile waiter whose client left */
};

/* remote.c */
enum { P = TCCD_FLIGHT_PROBE, L = TCCD_FLIGHT_LOCK, W = TCCD_FLIGHT_WAIT, H = TCCD_FLIGHT_HIT,
       FF = TCCD_FLIGHT_FAILURE, CP = TCCD_FLIGHT_COMPILE, X = TCCD_FLIGHT_CANCELLED };
static const move flight_moves[] = {{P, H}, {P, FF}, {P, L}, {P, W}, {P, CP}, {P, X}, {L, CP},
                                    {L, W}, {L, X}, {W, P}, {W, CP}, {W, X}};
static const int flight_paths[][8] = {
    {P, L, W, P, W, P, H, END},  /* lost the lock race, then the winner's entry */
    {P, L, CP, END},             /* locked: compile here */
    {P, W, CP, END},             /* waited too long */
    {P, FF, END},                /* another daemon's failure record */
    {P, W, X, END},              /* shutdown while waiting */
};

/* redis_cluster.c */
enum { D = TCCD_REDIS_NODE_DOWN, I = TCCD_REDIS_NODE_CONNECTING, C = TCCD_REDIS_NODE_CONNECTED,
       Z = TCCD_REDIS_NODE_CLOSED };
static const move node_moves[] = {{D, I}, {D, Z}, {I, C}, {I, D}, {I, Z}, {C, D}, {C, Z}};
static const int node_paths[][8] = {
    {D, I, C, D, I, C, Z, END},  /* lost, reconnected, closed */
    {D, I, D, I, Z, END},        /* refused twice, closed while connecting */
};

static const machine machines[] = {
    {"call", call_allowed, call_names, F + 1, call_moves, COUNT(call_moves), call_paths, COUNT(call_paths)},
    {"flight", flight_allowed, flight_names, X + 1, flight_moves, COUNT(flight_moves), flight_paths,
     COUNT(flight_paths)},
    {"node", node_allowed, node_names, Z + 1, node_moves, COUNT(node_moves), node_paths, COUNT(node_paths)},
};

/* Every (from, to): allowed by the table exactly when the drawing has it. */
START_TEST(test_table_is_the_drawing) {
  const machine *m = &machines[_i];
  for (int from = 0; from < m->nstates; from++)
    for (int to = 0; to < m->nstates; to++) {
      int want = 0;
      for (size_t k = 0; k < m->nmoves; k++) want |= m->moves[k].from == from && m->moves[k].to == to;
      ck_assert_msg(m->allowed(from, to) == want, "%s: %s -> %s is %s by the table, %s by the drawing", m->name,
                    m->names[from], m->names[to], m->allowed(from, to) ? "allowed" : "refused",
                    want ? "allowed" : "refused");
    }
}
END_TEST

START_TEST(test_walk_legal_paths) {
  const machine *m = &machines[_i];
  for (size_t p = 0; p < m->npaths; p++)
    for (int k = 1; m->paths[p][k] != END; k++)
      ck_assert_msg(m->allowed(m->paths[p][k - 1], m->paths[p][k]), "%s: %s -> %s refused", m->name,
                    m->names[m->paths[p][k - 1]], m->names[m->paths[p][k]]);
}
END_TEST

/* A few moves each table must refuse, named. */
START_TEST(test_illegal_moves_refused) {
  ck_assert(!call_allowed(F, A));     /* a finished call never comes back */
  ck_assert(!call_allowed(R, F));     /* nothing to finish before it arrived */
  ck_assert(!call_allowed(CC, S));    /* no stream to a client that left */
  ck_assert(!flight_allowed(W, L));   /* a poll probes first */
  ck_assert(!flight_allowed(L, H));   /* the lock's answer carries no entry */
  ck_assert(!flight_allowed(H, CP));  /* an ended flight never moves */
  ck_assert(!node_allowed(D, C));     /* connected only through a connect */
  ck_assert(!node_allowed(Z, I));     /* a closed layer never reconnects */
}
END_TEST

int main(void) {
  TCase *tc = tcase_create("tables");
  tcase_add_loop_test(tc, test_table_is_the_drawing, 0, (int)COUNT(machines));
  tcase_add_loop_test(tc, test_walk_legal_paths, 0, (int)COUNT(machines));
  tcase_add_test(tc, test_illegal_moves_refused);
  Suite *s = suite_create("states");
  suite_add_tcase(s, tc);
  return tt_run_suite(s, 0);
}
