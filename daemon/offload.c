/*
 * offload.c — work that must not run on the loop thread.
 *
 * DESIGN
 *
 * The loop thread answers every call, health checks and cache hits
 * included, so nothing on it may take time that grows with a request or
 * with the cache. What does (reading, decoding, verifying,
 * canonicalizing and hashing a large CompileRequest; verifying every
 * blob for `tcctl gc`) runs on a few threads of its own. Not on libuv's
 * pool: its threads are the compile workers and may all be busy for
 * minutes.
 *
 *   loop thread                              offload thread (OFFLOAD_THREADS)
 *   -----------                              --------------
 *   tccd_offload_submit(work, done, arg)
 *     lock; queue += item; signal  ───────►  lock; item = pop; unlock
 *                                            work(arg)
 *                                            lock; finished += item; unlock
 *   on_finished(): done(arg, 0) each ◄─────  uv_async_send
 *
 * uv_async_send coalesces wake-ups, hence the finished list. An item
 * still queued when tccd_offload_stop runs gets done(arg, 1) without its
 * work; the threads finish their current item and exit. The queue is
 * unbounded: callers bound what they submit (compile.c admits requests
 * by bytes).
 */
#include <assert.h>
#include <stdlib.h>

#include "daemon.h"

#define OFFLOAD_THREADS 2

typedef struct offload_item {
  void (*work)(void *arg);
  void (*done)(void *arg, int cancelled);
  void *arg;
  struct offload_item *next;
} offload_item;

struct tccd_offload {
  uv_async_t finished_async;
  uv_mutex_t lock;
  uv_cond_t cond;
  uv_thread_t threads[OFFLOAD_THREADS];
  int nthreads;
  int stopping;
  offload_item *queue, **queue_tail;       /* waiting for a thread */
  offload_item *finished, **finished_tail; /* work ran, done not yet */
};

static void offload_thread(void *arg) {
  tccd_offload *o = arg;
  uv_mutex_lock(&o->lock);
  for (;;) {
    while (!o->queue && !o->stopping) uv_cond_wait(&o->cond, &o->lock);
    if (!o->queue) break; /* stopping and nothing left to take */
    offload_item *it = o->queue;
    o->queue = it->next;
    if (!o->queue) o->queue_tail = &o->queue;
    uv_mutex_unlock(&o->lock);
    it->work(it->arg);
    uv_mutex_lock(&o->lock);
    it->next = NULL;
    *o->finished_tail = it;
    o->finished_tail = &it->next;
    uv_async_send(&o->finished_async);
  }
  uv_mutex_unlock(&o->lock);
}

/* On the loop: run done for every item whose work finished. */
static void on_finished(uv_async_t *h) {
  tccd_offload *o = h->data;
  uv_mutex_lock(&o->lock);
  offload_item *it = o->finished;
  o->finished = NULL;
  o->finished_tail = &o->finished;
  uv_mutex_unlock(&o->lock);
  while (it) {
    offload_item *next = it->next;
    it->done(it->arg, 0);
    free(it);
    it = next;
  }
}

int tccd_offload_start(tccd_state *st) {
  tccd_offload *o = calloc(1, sizeof *o);
  if (!o) return -1;
  o->queue_tail = &o->queue;
  o->finished_tail = &o->finished;
  if (uv_mutex_init(&o->lock) != 0) {
    free(o);
    return -1;
  }
  if (uv_cond_init(&o->cond) != 0) {
    uv_mutex_destroy(&o->lock);
    free(o);
    return -1;
  }
  uv_async_init(st->loop, &o->finished_async, on_finished);
  o->finished_async.data = o;
  for (int i = 0; i < OFFLOAD_THREADS; i++) {
    if (uv_thread_create(&o->threads[i], offload_thread, o) != 0) break;
    o->nthreads++;
  }
  st->offload = o;
  if (o->nthreads == 0) {
    tccd_offload_stop(st);
    return -1;
  }
  return 0;
}

int tccd_offload_submit(tccd_state *st, void (*work)(void *arg), void (*done)(void *arg, int cancelled),
                        void *arg) {
  tccd_offload *o = st->offload;
  offload_item *it = o ? calloc(1, sizeof *it) : NULL;
  if (!it) return -1;
  it->work = work;
  it->done = done;
  it->arg = arg;
  uv_mutex_lock(&o->lock);
  assert(!o->stopping);
  *o->queue_tail = it;
  o->queue_tail = &it->next;
  uv_cond_signal(&o->cond);
  uv_mutex_unlock(&o->lock);
  return 0;
}

static void offload_closed(uv_handle_t *h) {
  tccd_offload *o = h->data;
  uv_cond_destroy(&o->cond);
  uv_mutex_destroy(&o->lock);
  free(o);
}

void tccd_offload_stop(tccd_state *st) {
  tccd_offload *o = st->offload;
  if (!o) return;
  st->offload = NULL;
  uv_mutex_lock(&o->lock);
  offload_item *queued = o->queue;
  o->queue = NULL;
  o->queue_tail = &o->queue;
  o->stopping = 1;
  uv_cond_broadcast(&o->cond);
  uv_mutex_unlock(&o->lock);
  for (int i = 0; i < o->nthreads; i++) uv_thread_join(&o->threads[i]);
  on_finished(&o->finished_async); /* what the threads finished last */
  while (queued) {
    offload_item *next = queued->next;
    queued->done(queued->arg, 1);
    free(queued);
    queued = next;
  }
  uv_close((uv_handle_t *)&o->finished_async, offload_closed);
}
