/*
 * tcc_spawn.h — the process's one way to run an external program
 * (tcc_spawn.c): the compiler runs the C compiler through it, the daemon
 * its benchmark children (tccd-bench), so that one kill switch reaches
 * them all.
 */
#ifndef TCC_SPAWN_H
#define TCC_SPAWN_H

#include "tcc_status.h"

/* Runs argv (argv[0] looked up in PATH; no shell) in its own process
 * group under prlimit(1) (address space 4 GiB unless limit_as is 0: a
 * process that loads the CUDA driver maps far more virtual memory; CPU
 * seconds timeout_ms/1000 + 5; files up to 1 GiB; no core), stdin from
 * /dev/null, stdout+stderr (first 64 KiB) into *output (malloc'ed,
 * NUL-terminated, may be NULL on OOM). Kills the group after timeout_ms
 * (0: 120000). Returns 0 when it exited 0, else the failure's class
 * (tcc_spawn.c's table): TCC_E_INTERNAL for a diagnostic that would
 * repeat; TCC_E_UNAVAILABLE (could not start, killed by a signal),
 * TCC_E_RESOURCE_EXHAUSTED (out of memory or disk),
 * TCC_E_DEADLINE_EXCEEDED (timeout, CPU limit) or TCC_E_CANCELLED
 * (tcc_tools_cancel). */
int tcc_run_tool_limits(const char *const *argv, int timeout_ms, int limit_as, char **output,
                        tcc_error *err);
/* tcc_run_tool_limits with the address-space limit. */
int tcc_run_tool(const char *const *argv, int timeout_ms, char **output, tcc_error *err);

/* Kills every external tool this process runs (C compilers, benchmark
 * children) within 100 ms, and refuses to start more: they fail with
 * TCC_E_CANCELLED. For shutdown; there is no way back. */
void tcc_tools_cancel(void);

#endif
