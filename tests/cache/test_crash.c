/*
 * test_crash.c — crash consistency: every entry the cache acknowledged
 * survives a SIGKILL of the process that stored it.
 *
 * One scratch directory, TCC_CRASH_ROUNDS rounds (default 25). Each round
 * starts crash_writer (path in $TCC_CRASH_WRITER) on the directory,
 * collects its "ACK <hash> <sha256>" lines for a random 0-200 ms, kills it
 * with SIGKILL, reads what is left in the pipe, then reopens the cache
 * and asserts: PRAGMA integrity_check is ok, and every entry acknowledged
 * in this round (and a random sample of earlier ones) is found with its
 * artifact readable and digest-correct. The last round checks them all.
 * Kills land anywhere: during open and migration, mid-transaction,
 * between commit and ACK, mid-flush, mid-checkpoint.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_testutil.h"
#include "tcctest.h"

extern char **environ;

typedef struct ack {
  uint8_t hash[TCC_SHA256_BYTES];
  uint8_t sha[TCC_SHA256_BYTES];
} ack;

typedef struct ack_list {
  ack *v;
  size_t n, cap;
} ack_list;

/* Parses complete "ACK h s\n" lines from buf[0..*len), keeping a partial
 * last line in buf. */
static void parse_acks(char *buf, size_t *len, ack_list *acks) {
  size_t start = 0;
  for (size_t i = 0; i < *len; i++) {
    if (buf[i] != '\n') continue;
    buf[i] = '\0';
    char h[80], s[80];
    const char *line = buf + start;
    start = i + 1;
    ck_assert_msg(sscanf(line, "ACK %79s %79s", h, s) == 2, "bad line from writer: %s", line);
    if (acks->n == acks->cap) {
      acks->cap = acks->cap ? acks->cap * 2 : 1024;
      acks->v = realloc(acks->v, acks->cap * sizeof *acks->v);
      ck_assert_ptr_nonnull(acks->v);
    }
    ack *a = &acks->v[acks->n++];
    ck_assert_int_eq(tcc_hex_decode(h, a->hash, TCC_SHA256_BYTES), 0);
    ck_assert_int_eq(tcc_hex_decode(s, a->sha, TCC_SHA256_BYTES), 0);
  }
  memmove(buf, buf + start, *len - start);
  *len -= start;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads from fd into buf until EOF or the deadline (ms, -1: EOF only). */
static void read_until(int fd, char *buf, size_t *len, size_t cap, ack_list *acks,
                       int64_t deadline) {
  for (;;) {
    int wait = -1;
    if (deadline >= 0) {
      wait = (int)(deadline - now_ms());
      if (wait <= 0) return;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, wait);
    if (r == 0) return;
    if (r < 0 && errno == EINTR) continue;
    ck_assert_int_gt(r, 0);
    ssize_t got = read(fd, buf + *len, cap - *len);
    if (got < 0 && errno == EINTR) continue;
    ck_assert_int_ge(got, 0);
    if (got == 0) return; /* EOF */
    *len += (size_t)got;
    parse_acks(buf, len, acks);
    ck_assert_uint_lt(*len, cap); /* a line never fills the buffer */
  }
}

/* Asserts that the acknowledged entry is in the cache and intact. */
static void verify_ack(tcc_cache *c, const ack *a) {
  tcc_cache_entry e;
  tcc_error err = {0};
  char hex[TCC_SHA256_HEX];
  tcc_hex_encode(a->hash, TCC_SHA256_BYTES, hex);
  ck_assert_msg(tcc_cache_get(c, a->hash, &e, &err) == 0, "acked entry %s lost: %s", hex,
                err.msg);
  ck_assert_mem_eq(e.artifact_sha256, a->sha, TCC_SHA256_BYTES);
  int64_t size = e.size;
  tcc_cache_entry_clear(&e);
  uint8_t *data = NULL, d[TCC_SHA256_BYTES];
  size_t n = 0;
  ck_assert_msg(tcc_cache_read_artifact(c, a->sha, &data, &n, &err) == 0,
                "artifact of acked entry %s: %s", hex, err.msg);
  ck_assert_int_eq((int64_t)n, size);
  tcc_sha256(data, n, d);
  ck_assert_mem_eq(d, a->sha, TCC_SHA256_BYTES);
  free(data);
}

START_TEST(test_kill9_keeps_acked_entries) {
  tt_seed("test_crash");
  const char *writer = getenv("TCC_CRASH_WRITER");
  ck_assert_msg(writer && *writer, "set TCC_CRASH_WRITER to the crash_writer binary");
  const char *r_env = getenv("TCC_CRASH_ROUNDS");
  int rounds = r_env && *r_env ? atoi(r_env) : 25;
  ck_assert_int_ge(rounds, 1);
  char *dir = tt_tmpdir("cache-test");
  ck_assert_ptr_nonnull(dir);

  ack_list acks = {0};
  static char buf[1 << 16];
  int killed_mid_run = 0;
  for (int round = 0; round < rounds; round++) {
    size_t first_new = acks.n, len = 0;
    int64_t delay = (int64_t)tt_rand_range(0, 200);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {(char *)writer, dir, NULL};
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, writer, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);

    read_until(fds[0], buf, &len, sizeof buf, &acks, now_ms() + delay);
    kill(pid, SIGKILL);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "writer ended on its own (status 0x%x): see its stderr", status);
    read_until(fds[0], buf, &len, sizeof buf, &acks, -1);
    close(fds[0]);
    if (acks.n > first_new) killed_mid_run++;

    tcc_cache_options o = {.dir = dir};
    tcc_cache *c = NULL;
    tcc_error err = {0};
    ck_assert_msg(tcc_cache_open(&o, &c, &err) == 0, "round %d: reopen: %s", round, err.msg);
    ck_assert_msg(tcc_cache_integrity_check(c, &err) == 0, "round %d: %s", round, err.msg);
    bool last = round == rounds - 1;
    for (size_t i = last ? 0 : first_new; i < acks.n; i++) verify_ack(c, &acks.v[i]);
    for (int k = 0; !last && first_new > 0 && k < 50; k++)
      verify_ack(c, &acks.v[tt_rand_range(0, first_new - 1)]);
    tcc_cache_stats st;
    ck_assert_int_eq(tcc_cache_stats_get(c, &st, &err), 0);
    ck_assert_int_ge(st.entries, (int64_t)acks.n); /* unacked commits may exist too */
    tcc_cache_close(c);
    fprintf(stderr, "round %2d: killed after %3lld ms, %zu new acks, %zu total, %lld entries\n",
            round, (long long)delay, acks.n - first_new, acks.n, (long long)st.entries);
  }
  ck_assert_msg(killed_mid_run >= rounds / 2, "only %d of %d rounds stored anything",
                killed_mid_run, rounds);
  free(acks.v);
  tt_remove_tree(dir);
  free(dir);
}
END_TEST

int main(void) {
  return tt_run_tests("cache_crash", 600, 0, (const TTest *[]){test_kill9_keeps_acked_entries, NULL});
}
