/*
 * tcc_spawn.c — running an external program, bounded and cancellable
 * (tcc_spawn.h).
 *
 * Every external program of the process runs through tcc_run_tool (or
 * tcc_run_tool_limits: the daemon spawns its benchmark children,
 * tccd-bench, through it, so that the kill switch below reaches them too): posix_spawnp with an argv list (never a
 * shell), stdin from /dev/null, stdout and stderr into one pipe, in a
 * process group of its own so that a timeout kills the compiler driver
 * and everything it started (cc1, as, ld, a script's sleep). Descriptors are close-on-exec, so a compile on another thread
 * never inherits this one's pipe. Signals the daemon may ignore or block
 * are reset to their defaults in the child.
 *
 * Resource limits: the tool runs under util-linux's prlimit(1)
 * (/usr/bin/prlimit, part of Debian's essential set), which sets them on
 * itself and then execs the tool, so the compiler driver and every cc1,
 * as and ld it starts are limited from their first instruction: address
 * space TCC_TOOL_MAX_MEMORY (except under tcc_run_tool_limits with
 * limit_as 0: GPU benchmark children), CPU seconds timeout + 5, files it
 * writes at most TCC_TOOL_MAX_FILE bytes, no core dumps. (Setting them with
 * prlimit(2) after posix_spawnp returns races the driver's own forks.) A
 * compiler that runs away is stopped by the kernel instead of taking the
 * node's memory or disk; the failure is reported like any other.
 *
 * The exit status is collected with waitpid(pid): the caller's process
 * must not set SIGCHLD to SIG_IGN (then the status is lost and the run
 * reports INTERNAL).
 *
 * Failure classes (the daemon caches only deterministic failures):
 *
 *   what happened                                   code
 *   ----------------------------------------------  -------------------
 *   exited non-zero with a diagnostic               INTERNAL (would repeat)
 *   ... saying out of memory, no space left on      RESOURCE_EXHAUSTED
 *       device, disk quota exceeded                 (transient)
 *   ... saying a program it ran was killed by a     UNAVAILABLE (transient)
 *       signal ("Killed signal terminated program")
 *   killed by a signal (the OOM killer's SIGKILL)   UNAVAILABLE (transient)
 *   past its CPU-time limit (SIGXCPU)               DEADLINE_EXCEEDED
 *   past its file-size limit (SIGXFSZ)              RESOURCE_EXHAUSTED
 *   not found, not executable, could not be started UNAVAILABLE (transient)
 *   exited 126 or 127 (a shell's "not executable",
 *   "not found": a program it runs is missing)      UNAVAILABLE (transient)
 *   ran past timeout_ms                             DEADLINE_EXCEEDED
 *   tcc_tools_cancel() was called (shutdown)        CANCELLED
 *
 * tcc_tools_cancel is the process's one kill switch: every tool running
 * is killed (its process group) within TOOL_POLL_MS and every later one
 * refused, so a daemon shutting down does not wait for its compilers.
 */
#include "tcc_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define TOOL_OUTPUT_MAX (64 << 10)
#define TCC_TOOL_MAX_MEMORY (4LL << 30) /* address space of each tool process */
#define TCC_TOOL_MAX_FILE (1LL << 30)   /* largest file a tool may write */

#define TCC_PRLIMIT "/usr/bin/prlimit"
#define TOOL_POLL_MS 100 /* how often a running tool is checked for a cancel */

static atomic_int tools_cancelled;

void tcc_tools_cancel(void) { atomic_store(&tools_cancelled, 1); }

/* Finds an executable as execvp would (a name with a slash as is, else
 * along $PATH). Returns 0 or an errno (ENOENT, EACCES). */
static int find_executable(const char *name, char *out, size_t cap) {
  if (strchr(name, '/')) {
    if (access(name, X_OK) != 0) return errno;
    snprintf(out, cap, "%s", name);
    return 0;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  int why = ENOENT;
  for (const char *p = path; *p;) {
    size_t n = strcspn(p, ":");
    if (n > 0 && (int)snprintf(out, cap, "%.*s/%s", (int)n, p, name) < (int)cap) {
      if (access(out, X_OK) == 0) return 0;
      if (errno == EACCES) why = EACCES;
    }
    p += n + (p[n] == ':');
  }
  return why;
}

/* argv with the prlimit(1) prefix that applies the limits above, in
 * storage the caller provides (prefix: 8 slots). Returns the argv to
 * spawn: limited when prlimit exists, else argv unchanged. */
static const char *const *limited_argv(const char *const *argv, int timeout_ms, int limit_as,
                                       char bufs[4][48], const char **out, size_t cap) {
  size_t n = 0;
  while (argv[n]) n++;
  if (access(TCC_PRLIMIT, X_OK) != 0 || n + 8 > cap) return argv;
  snprintf(bufs[0], 48, "--as=%lld", TCC_TOOL_MAX_MEMORY);
  snprintf(bufs[1], 48, "--fsize=%lld", TCC_TOOL_MAX_FILE);
  snprintf(bufs[2], 48, "--cpu=%d:%d", timeout_ms / 1000 + 5, timeout_ms / 1000 + 6);
  snprintf(bufs[3], 48, "--core=0");
  size_t k = 0;
  out[k++] = TCC_PRLIMIT;
  for (int i = limit_as ? 0 : 1; i < 4; i++) out[k++] = bufs[i];
  out[k++] = "--";
  for (size_t i = 0; i <= n; i++) out[k++] = argv[i]; /* the NULL too */
  return out;
}

/* The class of a tool that exited non-zero, from what it printed: a
 * shortage of memory or disk, or a program it ran killed by a signal,
 * would not repeat (RESOURCE_EXHAUSTED, UNAVAILABLE); anything else is a
 * diagnostic about its input that would (INTERNAL). */
static int tool_failure_class(const char *text) {
  static const char *const short_of[] = {
      "out of memory", "virtual memory exhausted", "memory exhausted", "Cannot allocate memory",
      "No space left on device", "Disk quota exceeded", "File too large",
  };
  static const char *const killed[] = {
      "Killed signal terminated program", "terminated signal", "internal compiler error: Killed",
      "terminated by signal", "Segmentation fault signal terminated program",
  };
  for (size_t i = 0; i < sizeof short_of / sizeof short_of[0]; i++)
    if (strstr(text, short_of[i])) return TCC_E_RESOURCE_EXHAUSTED;
  for (size_t i = 0; i < sizeof killed / sizeof killed[0]; i++)
    if (strstr(text, killed[i])) return TCC_E_UNAVAILABLE;
  return TCC_E_INTERNAL;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* Kills the child's process group (and the child, should the group not
 * exist), then reaps it. */
static void kill_and_reap(pid_t pid, int *status) {
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
}

int tcc_run_tool(const char *const *argv, int timeout_ms, char **output, tcc_error *err) {
  return tcc_run_tool_limits(argv, timeout_ms, 1, output, err);
}

int tcc_run_tool_limits(const char *const *argv, int timeout_ms, int limit_as, char **output,
                        tcc_error *err) {
  *output = NULL;
  if (timeout_ms <= 0) timeout_ms = 120000;
  if (atomic_load(&tools_cancelled))
    return tcc_error_set(err, TCC_E_CANCELLED, "'%s' was not started: the process is shutting down", argv[0]);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC))
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot run '%s': pipe: %s", argv[0], strerror(errno));

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGHUP);
  sigaddset(&defaults, SIGCHLD);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  char exe[4096];
  int found = find_executable(argv[0], exe, sizeof exe);
  if (found) {
    close(fds[0]);
    close(fds[1]);
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot run '%s': %s", argv[0], strerror(found));
  }
  char limit_bufs[4][48];
  const char *limited[256];
  const char *const *run = limited_argv(argv, timeout_ms, limit_as, limit_bufs, limited, 256);
  pid_t pid;
  int rc = posix_spawnp(&pid, run[0], &fa, &attr, (char *const *)run, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc) {
    close(fds[0]);
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "cannot run '%s': %s", argv[0], strerror(rc));
  }

  char *out = malloc(TOOL_OUTPUT_MAX + 1);   /* NULL: the output is dropped */
  size_t outlen = 0;
  int64_t deadline = now_ms() + timeout_ms;
  int timed_out = 0, cancelled = 0, status = 0;
  for (;;) {                                   /* read until EOF, deadline or cancel */
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    if (atomic_load(&tools_cancelled)) {
      cancelled = 1;
      break;
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int n = poll(&pfd, 1, left > TOOL_POLL_MS ? TOOL_POLL_MS : (int)left);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    char chunk[4096];
    ssize_t r = read(fds[0], chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;                         /* EOF: every writer closed */
    size_t take = (size_t)r < TOOL_OUTPUT_MAX - outlen ? (size_t)r : TOOL_OUTPUT_MAX - outlen;
    if (out && take) memcpy(out + outlen, chunk, take), outlen += take;
  }
  close(fds[0]);
  if (!timed_out) {                            /* wait for exit, still bounded */
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        free(out);
        kill(-pid, SIGKILL);
        return tcc_error_set(err, TCC_E_INTERNAL,
                             "lost the exit status of '%s' (%s; is SIGCHLD ignored?)", argv[0],
                             strerror(errno));
      }
      if (now_ms() >= deadline) {
        timed_out = 1;
        break;
      }
      if (atomic_load(&tools_cancelled)) {
        cancelled = 1;
        break;
      }
      sleep_ms(2);
    }
  }
  if (cancelled) {
    kill_and_reap(pid, &status);
    free(out);
    return tcc_error_set(err, TCC_E_CANCELLED, "'%s' was killed: the process is shutting down", argv[0]);
  }
  if (timed_out) {
    kill_and_reap(pid, &status);
    free(out);
    return tcc_error_set(err, TCC_E_DEADLINE_EXCEEDED,
                         "'%s' did not finish within %d ms and was killed", argv[0], timeout_ms);
  }
  if (out) out[outlen] = '\0';
  *output = out;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  const char *text = *output ? *output : "";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && !text[0])
    /* exec failed after the fork (posix_spawn reports it this way under
     * some emulators, e.g. valgrind) */
    return tcc_error_set(err, TCC_E_UNAVAILABLE,
                         "cannot run '%s' (exit status 127: not found or not executable)", argv[0]);
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 126 || WEXITSTATUS(status) == 127))
    /* the shell's "not executable" / "not found": a wrapper script whose
     * compiler is missing for the moment */
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "'%s' exited with status %d (a program it runs is missing or not "
                         "executable): %s", argv[0], WEXITSTATUS(status), text);
  if (WIFEXITED(status))
    return tcc_error_set(err, tool_failure_class(text), "'%s' exited with status %d%s%s", argv[0],
                         WEXITSTATUS(status), text[0] ? ": " : " (no output)", text);
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  int code = sig == SIGXCPU ? TCC_E_DEADLINE_EXCEEDED : sig == SIGXFSZ ? TCC_E_RESOURCE_EXHAUSTED : TCC_E_UNAVAILABLE;
  return tcc_error_set(err, code, "'%s' was killed by signal %d (%s)%s%s", argv[0], sig, strsignal(sig),
                       text[0] ? ": " : "", text);
}
