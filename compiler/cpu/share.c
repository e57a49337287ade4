/*
 * share.c — the helper thread of a busy machine, as text that emit.c
 * copies into CPU sources: while another process holds one of the
 * cores, the thread governor (prelude.c) runs a call on the calling
 * thread alone, and a GEMM (emit.c's stream, split-K and split-K-tiled
 * GEMMs of few rows; oneDNN's, in blocks of C) or a oneDNN convolution
 * (its images; runtime/onednn_conv.c) then shares its chunks with one
 * helper thread of the artifact's own, which takes whatever time slices
 * the scheduler gives it.
 *
 * Nothing ever waits for the helper inside a call: an OpenMP region
 * ends in a barrier, so a team with one thread on the taken core waits
 * out that core's time slices at every region (4-100 ms); here the
 * caller takes back any chunk the helper has claimed and not finished.
 * A chunk is therefore computed into a tile of the thread's own and
 * stored into C only by whoever wins the chunk's state word:
 *
 *   FREE --(helper: compare-and-swap)--> COMMITTING --(stored)--> DONE
 *   FREE --(caller, at the job's end: compare-and-swap)--> STOLEN
 *   FREE --(caller's own chunk, stored)--> DONE
 *
 * Each state word carries the job's generation, so a helper that wakes
 * from a time slice with a chunk of an older job fails its swap and
 * stores nothing; it reads the job's fields (the body, its pointers)
 * after claiming, then checks the state, so what it read is either the
 * job it claimed from or a job that is over (fence-ordered as a
 * seqlock). A helper can still be reading a stolen chunk's operands
 * when the caller moves on: those stay allocated until tcc_entry
 * returns, and the caller waits for the helper to leave the job before
 * returning only in calls where it stole (tcc_share_leave).
 *
 * The job: the body (a shared kernel body, emit.c, calls itself through
 * TCC_SELF), its pointer table P copied into static storage, the chunk
 * count and the tile's floats. Its chunks are claimed as two halves: the
 * caller takes the first half's from the front, the helper the second's,
 * and each, once its half is gone, the other's from the back. So each
 * thread reads the weights in order, and a chunk's last pass prefetches
 * the rows of the thread's own next chunk: claimed in turn from one
 * counter, a thread's next chunk was mostly the one after the other's,
 * its first pass unprefetched (GPT-2's split-K 1 x 3072 x 768 with the
 * helper, weights from memory: 0.555 ms quiet and 0.578 busy, by halves
 * 0.392 and 0.49-0.52). tcc_share_rq_now, a thread-local, tells
 * the body which chunk to compute into which tile, or to store a tile.
 * One caller at a time holds the helper (tcc_share_enter: the first of
 * concurrent calls; the others run alone). The helper is started at
 * the first job of each process (a fork's child starts its own), waits
 * for the next job spinning for up to TCC_SHARE_SPIN_NS (a layer's
 * GEMMs come microseconds apart, and each wake-up had cost the caller a
 * futex call and the helper the scheduler's latency), then sleeping on
 * a futex, blocks every signal, and is stopped and
 * joined when the artifact is unloaded. At each job it leaves the
 * caller's CPU out of its affinity (once per CPU the caller moves to):
 * with a neighbour spinning on one of two cores, the scheduler woke the
 * helper on the caller's core about half the time, where it only took
 * the caller's time slices (GPT-2's busy decode step 27-37 ms, bimodal;
 * 28-29 pinned off). It spins no longer: spinning until the next job
 * on the caller's core had slowed the caller's other kernels (BERT-base's
 * busy step 30-35 ms against 24-29), and pinned off it, it gained
 * nothing (design.md has the 20 µs spin's figures).
 *
 * tcc_share_counts (exported, for tests and benchmarks): jobs shared,
 * chunks the helper stored, chunks taken back.
 */
#include "cpu_schedule.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* In the preamble, before the governor: what kernel bodies and the
 * governor call. A shared body compiled for one artifact is linked into
 * later ones from the object cache (build.c), an object whose symbols
 * but the bodies and these are made local: every object defines them
 * weak, the link keeps one of each, and every body, cached or not,
 * calls the one runtime of the .so and its state. The static functions
 * are copies of the same code over that state; the destructor of each
 * copy runs, and the first stops the helper. */
const char tcc_cpu_share[] =
  "#define TCC_SHARE 1\n"
  "#define TCC_HIDDEN __attribute__((visibility(\"hidden\")))\n"
  "/* chunk c: phase 0 computes it into tile, 1 commits the tile (stores it,\n"
  " * or adds it into sum), 2 (sums) stores sum + sum2 into C; own: the\n"
  " * caller's call, whose phase 0 may store into C straight (its phase 1\n"
  " * then stores nothing) */\n"
  "typedef struct tcc_share_rq { int64_t c; float *tile; int phase; float *sum, *sum2; int own; } tcc_share_rq;\n"
  "#include <pthread.h>\n#include <signal.h>\n#include <time.h>\n#include <sys/syscall.h>\n#include <linux/futex.h>\n"
  "long syscall(long, ...); int getpid(void); int sched_getcpu(void);\n"
  "enum { TCC_SHARE_MAX = " STR(TCC_CPU_SHARE_MAX) ", TCC_SHARE_MAXP = 256, TCC_SHARE_TILE = " STR(TCC_CPU_SHARE_TILE)
  ", TCC_SHARE_SPIN_NS = 20000 };\n"
  "#define TCC_SHARE_MIN_FLOPS " STR(TCC_CPU_SHARE_FLOPS) "   /* the least work of a shared step */\n"
  "enum { TCC_FREE, TCC_COMMITTING, TCC_DONE, TCC_STOLEN };\n"
  "#define TCC_ONE __attribute__((weak)) TCC_HIDDEN   /* one in the .so (share.c) */\n"
  "TCC_ONE __thread const tcc_share_rq *tcc_share_rq_now;  /* a chunk's call */\n"
  "TCC_ONE __thread int tcc_share_mine;   /* this thread's call holds the helper */\n"
  "__attribute__((weak, visibility(\"default\"))) int64_t tcc_share_counts[3];  /* jobs, helper's chunks, taken back */\n"
  "typedef struct tcc_share_state {\n"
  "  uint32_t gen;       /* the job's generation (never 0); the helper sleeps on it */\n"
  "  uint32_t sleeping;  /* the helper waits on gen */\n"
  "  uint32_t busy;      /* the helper is in a job: 1; 2: and the caller waits */\n"
  "  int owner;          /* a call holds the helper */\n"
  "  int pid;            /* the process the helper runs in; 0: none */\n"
  "  int stop, stole;\n"
  "  int caller_cpu;     /* where the caller ran at the job's start; -1: unknown */\n"
  "  uint64_t half[2];   /* gen << 32 | first << 16 | end: chunks unclaimed */\n"
  "  int (*fn)(void *const *);\n"
  "  int np;\n"
  "  int64_t tile;\n"
  "  float tile_c[TCC_SHARE_TILE], tile_h[TCC_SHARE_TILE];   /* the caller's, the helper's */\n"
  "  float sum_c[TCC_SHARE_TILE], sum_h[TCC_SHARE_TILE];\n"
  "  void *P[TCC_SHARE_MAXP];\n"
  "  uint64_t state[TCC_SHARE_MAX];   /* gen << 2 | TCC_FREE ... */\n"
  "  pthread_t thread;\n"
  "} tcc_share_state;\n"
  "TCC_ONE tcc_share_state tcc_share;\n"
  "#define TCC_LD(x, o) __atomic_load_n(&(x), __ATOMIC_##o)\n"
  "#define TCC_ST(x, v, o) __atomic_store_n(&(x), (v), __ATOMIC_##o)\n"
  "static void tcc_futex(uint32_t *w, int op, uint32_t v) { syscall(SYS_futex, w, op, v, (void *)0, (void *)0, 0); }\n"
  /* the first (or, back, the last) unclaimed chunk of a half of job g's
   * chunks, claimed; -1: none (or the job is over) */
  "static int64_t tcc_share_claim(uint64_t *half, uint32_t g, int back) {\n"
  "  uint64_t v = TCC_LD(*half, ACQUIRE);\n"
  "  for (;;) {\n"
  "    const uint32_t first = (uint32_t)(v >> 16) & 0xffff, end = (uint32_t)v & 0xffff;\n"
  "    if ((uint32_t)(v >> 32) != g || first >= end) return -1;\n"
  "    if (__atomic_compare_exchange_n(half, &v, back ? v - 1 : v + (1u << 16), 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))\n"
  "      return back ? end - 1 : first;\n"
  "  }\n"
  "}\n"
  "static void *tcc_share_helper(void *arg) {\n"
  "  (void)arg;\n"
  "  void *P[TCC_SHARE_MAXP];\n"
  "  uint32_t seen = 0;\n"
  "  unsigned long allowed[16] = {0}, mask[16];   /* 1024 CPUs */\n"
  "  const int known = syscall(SYS_sched_getaffinity, 0, sizeof allowed, allowed) > 0;\n"
  "  int off = -1;   /* the CPU left out of this thread's affinity */\n"
  "  for (;;) {\n"
  "    const uint32_t g = TCC_LD(tcc_share.gen, ACQUIRE);\n"
  "    if (TCC_LD(tcc_share.stop, ACQUIRE)) return 0;\n"
  "    if (g == seen) {\n"
  "      struct timespec t0, t;\n"
  "      clock_gettime(CLOCK_MONOTONIC, &t0);\n"
  "      do {\n"
  "        __builtin_ia32_pause();\n"
  "        if (TCC_LD(tcc_share.gen, ACQUIRE) != seen || TCC_LD(tcc_share.stop, ACQUIRE)) break;\n"
  "        clock_gettime(CLOCK_MONOTONIC, &t);\n"
  "      } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < TCC_SHARE_SPIN_NS);\n"
  "      if (TCC_LD(tcc_share.gen, ACQUIRE) != seen || TCC_LD(tcc_share.stop, ACQUIRE)) continue;\n"
  "      TCC_ST(tcc_share.sleeping, 1, SEQ_CST);\n"
  "      if (TCC_LD(tcc_share.gen, SEQ_CST) == seen && !TCC_LD(tcc_share.stop, SEQ_CST))\n"
  "        tcc_futex(&tcc_share.gen, FUTEX_WAIT_PRIVATE, seen);\n"
  "      TCC_ST(tcc_share.sleeping, 0, SEQ_CST);\n"
  "      continue;\n"
  "    }\n"
  "    seen = g;\n"
  "    TCC_ST(tcc_share.busy, 1, SEQ_CST);\n"
  "    const int cc = TCC_LD(tcc_share.caller_cpu, RELAXED);\n"
  "    if (known && cc != off && cc >= 0 && cc < 1024) {   /* any CPU but the caller's */\n"
  "      int others = 0;\n"
  "      for (int i = 0; i < 16; i++) mask[i] = allowed[i], others |= i != cc / 64 && allowed[i];\n"
  "      mask[cc / 64] &= ~(1ul << cc % 64);\n"
  "      if (others || mask[cc / 64]) syscall(SYS_sched_setaffinity, 0, sizeof mask, mask);\n"
  "      off = cc;\n"
  "    }\n"
  "    for (;;) {\n"
  "      int64_t c = tcc_share_claim(&tcc_share.half[1], g, 0);\n"
  "      if (c < 0) c = tcc_share_claim(&tcc_share.half[0], g, 1);\n"
  "      if (c < 0 || c >= TCC_SHARE_MAX) break;\n"
  "      int (*fn)(void *const *) = TCC_LD(tcc_share.fn, RELAXED);\n"
  "      const int np = TCC_LD(tcc_share.np, RELAXED);\n"
  "      const int64_t tn = TCC_LD(tcc_share.tile, RELAXED);\n"
  "      for (int i = 0; i < np && i < TCC_SHARE_MAXP; i++) P[i] = TCC_LD(tcc_share.P[i], RELAXED);\n"
  "      __atomic_thread_fence(__ATOMIC_ACQUIRE);\n"
  "      const uint64_t free_ = (uint64_t)g << 2 | TCC_FREE;\n"
  "      if (TCC_LD(tcc_share.state[c], SEQ_CST) != free_ || !fn || np > TCC_SHARE_MAXP || tn > TCC_SHARE_TILE)\n"
  "        continue;   /* taken back, and the fields may be a later job's */\n"
  "      tcc_share_rq rq = {c, tcc_share.tile_h, 0, tcc_share.sum_h, 0, 0};\n"
  "      tcc_share_rq_now = &rq;\n"
  "      uint64_t s = free_;\n"
  "      if (fn(P) == 0 &&   /* a chunk that fails is left to the caller, who meets the error */\n"
  "          __atomic_compare_exchange_n(&tcc_share.state[c], &s, (uint64_t)g << 2 | TCC_COMMITTING, 0,\n"
  "                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {\n"
  "        rq.phase = 1;\n"
  "        fn(P);\n"
  "        TCC_ST(tcc_share.state[c], (uint64_t)g << 2 | TCC_DONE, RELEASE);\n"
  "        __atomic_fetch_add(&tcc_share_counts[1], 1, __ATOMIC_RELAXED);\n"
  "      }\n"
  "      tcc_share_rq_now = 0;\n"
  "    }\n"
  "    if (__atomic_exchange_n(&tcc_share.busy, 0, __ATOMIC_SEQ_CST) == 2)\n"
  "      tcc_futex(&tcc_share.busy, FUTEX_WAKE_PRIVATE, 1);\n"
  "  }\n"
  "}\n"
  /* the helper of this process, started if need be; 0: none (it cannot
   * be started now: tried again at the next job) */
  "static int tcc_share_ready(void) {\n"
  "  const int pid = getpid();\n"
  "  if (tcc_share.pid == pid) return 1;\n"
  "  tcc_share.stop = 0;\n"
  "  tcc_share.busy = tcc_share.sleeping = 0;\n"
  "  sigset_t all, old;\n"
  "  sigfillset(&all);\n"
  "  pthread_sigmask(SIG_SETMASK, &all, &old);\n"
  "  int rc = pthread_create(&tcc_share.thread, 0, tcc_share_helper, 0);\n"
  "  pthread_sigmask(SIG_SETMASK, &old, 0);\n"
  "  if (rc) return 0;\n"
  "  tcc_share.pid = pid;\n"
  "  return 1;\n"
  "}\n"
  "/* Runs body fn's `chunks` chunks (tiles of `tile` floats; sums: each thread\n"
  " * adds its tiles into sums of its own, stored at the end) with the helper:\n"
  " * fn's return values or'ed, or -1 when it cannot (run it alone). */\n"
  "TCC_ONE int tcc_share_run(int (*fn)(void *const *), void *const *P, int np, int64_t chunks, int64_t tile,\n"
  "                          int sums) {\n"
  "  if (chunks < 2 || chunks > TCC_SHARE_MAX || np > TCC_SHARE_MAXP || tile > TCC_SHARE_TILE ||\n"
  "      tcc_share_rq_now || !tcc_share_ready())\n"
  "    return -1;\n"
  "  uint32_t g = tcc_share.gen + 1;\n"
  "  if (g == 0) g = 1;\n"
  "  /* every state of the job before is past FREE: a helper that read\n"
  "   * these fields fails its state check (the release fence) */\n"
  "  __atomic_thread_fence(__ATOMIC_RELEASE);\n"
  "  for (int64_t c = 0; c < chunks; c++) TCC_ST(tcc_share.state[c], (uint64_t)g << 2 | TCC_FREE, RELAXED);\n"
  "  TCC_ST(tcc_share.fn, fn, RELAXED);\n"
  "  TCC_ST(tcc_share.np, np, RELAXED);\n"
  "  for (int i = 0; i < np; i++) TCC_ST(tcc_share.P[i], P[i], RELAXED);\n"
  "  TCC_ST(tcc_share.tile, tile, RELAXED);\n"
  "  TCC_ST(tcc_share.caller_cpu, sched_getcpu(), RELAXED);\n"
  "  if (sums)   /* no commit of the job before is in flight */\n"
  "    for (int64_t i = 0; i < tile; i++) tcc_share.sum_c[i] = tcc_share.sum_h[i] = 0;\n"
  "  const uint64_t mid = (uint64_t)chunks / 2;\n"
  "  TCC_ST(tcc_share.half[0], (uint64_t)g << 32 | mid, RELEASE);\n"
  "  TCC_ST(tcc_share.half[1], (uint64_t)g << 32 | mid << 16 | (uint64_t)chunks, RELEASE);\n"
  "  TCC_ST(tcc_share.gen, g, SEQ_CST);\n"
  "  if (TCC_LD(tcc_share.sleeping, SEQ_CST)) tcc_futex(&tcc_share.gen, FUTEX_WAKE_PRIVATE, 1);\n"
  "  __atomic_fetch_add(&tcc_share_counts[0], 1, __ATOMIC_RELAXED);\n"
  "  tcc_share_rq rq = {0, tcc_share.tile_c, 0, tcc_share.sum_c, 0, 1};\n"
  "  int bad = 0;\n"
  "  tcc_share_rq_now = &rq;\n"
  "  for (;;) {\n"
  "    int64_t c = tcc_share_claim(&tcc_share.half[0], g, 0);\n"
  "    if (c < 0) c = tcc_share_claim(&tcc_share.half[1], g, 1);\n"
  "    if (c < 0) break;\n"
  "    rq.c = c, rq.phase = 0;\n"
  "    bad |= fn(P);\n"
  "    rq.phase = 1;\n"
  "    bad |= fn(P);\n"
  "    TCC_ST(tcc_share.state[c], (uint64_t)g << 2 | TCC_DONE, RELAXED);\n"
  "  }\n"
  "  /* the helper's chunks: stored (DONE), being stored, or taken back */\n"
  "  for (int64_t c = 0; c < chunks; c++) {\n"
  "    uint64_t s = (uint64_t)g << 2 | TCC_FREE;\n"
  "    if (__atomic_compare_exchange_n(&tcc_share.state[c], &s, (uint64_t)g << 2 | TCC_STOLEN, 0,\n"
  "                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {\n"
  "      rq.c = c, rq.phase = 0;\n"
  "      bad |= fn(P);\n"
  "      rq.phase = 1;\n"
  "      bad |= fn(P);\n"
  "      tcc_share.stole = 1;\n"
  "      __atomic_fetch_add(&tcc_share_counts[2], 1, __ATOMIC_RELAXED);\n"
  "    } else\n"
  "      while ((s & 3) == TCC_COMMITTING) {   /* a store of a few KB */\n"
  "        __builtin_ia32_pause();\n"
  "        s = TCC_LD(tcc_share.state[c], ACQUIRE);\n"
  "      }\n"
  "  }\n"
  "  if (sums) {   /* every commit is in */\n"
  "    rq.phase = 2, rq.sum2 = tcc_share.sum_h;\n"
  "    bad |= fn(P);\n"
  "  }\n"
  "  tcc_share_rq_now = 0;\n"
  "  return bad;\n"
  "}\n"
  "TCC_ONE void tcc_share_enter(void) {\n"
  "  int free_ = 0;\n"
  "  tcc_share_mine = __atomic_compare_exchange_n(&tcc_share.owner, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);\n"
  "}\n"
  /* a call that took chunks back waits until the helper has left the
   * job: it may still read their operands */
  "TCC_ONE void tcc_share_wait(void) {\n"
  "  if (!tcc_share.stole) return;\n"
  "  uint32_t b = TCC_LD(tcc_share.busy, SEQ_CST);\n"
  "  for (int i = 0; b && i < 2000; i++) {\n"
  "    __builtin_ia32_pause();\n"
  "    b = TCC_LD(tcc_share.busy, SEQ_CST);\n"
  "  }\n"
  "  while (b) {\n"
  "    if (b == 1 && !__atomic_compare_exchange_n(&tcc_share.busy, &b, 2, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))\n"
  "      continue;\n"
  "    tcc_futex(&tcc_share.busy, FUTEX_WAIT_PRIVATE, 2);\n"
  "    b = TCC_LD(tcc_share.busy, SEQ_CST);\n"
  "  }\n"
  "  tcc_share.stole = 0;\n"
  "}\n"
  "TCC_ONE void tcc_share_leave(void) {\n"
  "  if (!tcc_share_mine) return;\n"
  "  tcc_share_wait();\n"
  "  tcc_share_mine = 0;\n"
  "  TCC_ST(tcc_share.owner, 0, RELEASE);\n"
  "}\n"
"__attribute__((destructor)) static void tcc_share_unload(void) {\n"
  "  if (tcc_share.pid != getpid()) return;\n"
  "  TCC_ST(tcc_share.stop, 1, SEQ_CST);\n"
  "  __atomic_fetch_add(&tcc_share.gen, 1, __ATOMIC_SEQ_CST);\n"
  "  tcc_futex(&tcc_share.gen, FUTEX_WAKE_PRIVATE, 1);\n"
  "  pthread_join(tcc_share.thread, 0);\n"
  "  tcc_share.pid = 0;\n"
  "}\n";
