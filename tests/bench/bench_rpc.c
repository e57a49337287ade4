/*
 * bench_rpc.c — cache-hit Compile latency and throughput against a running
 * tccd, with N concurrent clients on loopback (gRPC C core, async).
 *
 *   bench-rpc ADDR REQUEST CLIENTS SECONDS [RATE]
 *
 * REQUEST is a tcc.v1.CompileRequest already in the cache, in protobuf JSON
 * form (a file under tests/graphs/) or encoded.
 * Each client has its own channel (its own HTTP/2 connection) and at most
 * one call in flight. Without RATE the clients are closed-loop: each sends
 * its next request as soon as the last reply arrives (peak throughput;
 * latency is then concurrency / throughput by Little's law). With RATE
 * (requests/s over all clients) the clients are open-loop: client i sends
 * at fixed times, and latency is measured from the scheduled send time, so
 * a slow reply cannot hide the requests it delayed (no coordinated
 * omission).
 *
 * Prints one JSON object: {"clients", "mode", "requests", "errors",
 * "not_hits", "seconds", "rps", "p50_us", "p90_us", "p99_us", "max_us"}.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pbjson.h"
#include "tcc/v1/tcc.pb-c.h"

typedef struct bench_client {
  grpc_channel *channel;
  grpc_call *call;
  grpc_byte_buffer *recv;
  grpc_metadata_array md_initial, md_trailing;
  grpc_status_code status;
  grpc_slice details;
  double sent_at;      /* scheduled (open loop) or actual (closed loop) send time */
  double next_at;      /* open loop: when to send next */
  int busy;
} bench_client;

typedef struct bench_thread {
  pthread_t tid;
  grpc_completion_queue *cq;
  bench_client *clients;
  int nclients;
  double *lat;         /* microseconds */
  size_t nlat, cap;
  long errors, not_hits;
} bench_thread;

static const char *g_addr;
static grpc_slice g_method;
static uint8_t *g_req;
static size_t g_req_len;
static double g_start, g_end, g_interval; /* g_interval 0 = closed loop */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void start_call(bench_thread *t, bench_client *c, double at) {
  c->sent_at = at;
  c->busy = 1;
  gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(10, GPR_TIMESPAN));
  c->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, t->cq, g_method, NULL,
                                     deadline, NULL);
  grpc_slice s = grpc_slice_from_static_buffer(g_req, g_req_len);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
  grpc_metadata_array_init(&c->md_initial);
  grpc_metadata_array_init(&c->md_trailing);
  c->recv = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &c->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &c->md_trailing;
  ops[5].data.recv_status_on_client.status = &c->status;
  ops[5].data.recv_status_on_client.status_details = &c->details;
  if (grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) abort();
  grpc_byte_buffer_destroy(send);
}

/* Records a finished call; returns whether the reply was an OK cache hit. */
static void finish_call(bench_thread *t, bench_client *c) {
  double done = now_s();
  int hit = 0;
  if (c->status == GRPC_STATUS_OK && c->recv) {
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, c->recv);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    Tcc__V1__CompileResponse *resp =
        tcc__v1__compile_response__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    hit = resp && resp->cache == TCC__V1__CACHE_STATUS__HIT;
    if (resp) tcc__v1__compile_response__free_unpacked(resp, NULL);
    grpc_slice_unref(s);
  }
  if (c->status != GRPC_STATUS_OK) t->errors++;
  else if (!hit) t->not_hits++;
  if (c->sent_at >= g_start && done <= g_end) {
    if (t->nlat == t->cap) {
      t->cap = t->cap ? t->cap * 2 : 1 << 16;
      t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
    }
    t->lat[t->nlat++] = (done - c->sent_at) * 1e6;
  }
  if (c->recv) grpc_byte_buffer_destroy(c->recv);
  grpc_metadata_array_destroy(&c->md_initial);
  grpc_metadata_array_destroy(&c->md_trailing);
  grpc_slice_unref(c->details);
  grpc_call_unref(c->call);
  c->busy = 0;
}

static void *thread_main(void *arg) {
  bench_thread *t = arg;
  for (int i = 0; i < t->nclients; i++) {
    bench_client *c = &t->clients[i];
    c->next_at = g_start - 0.5 + (g_interval > 0 ? g_interval * i / t->nclients : 0);
    if (g_interval == 0) start_call(t, c, now_s());
  }
  for (;;) {
    double now = now_s();
    int busy = 0;
    double wake = now + 0.05;
    for (int i = 0; i < t->nclients; i++) {
      bench_client *c = &t->clients[i];
      if (g_interval > 0 && !c->busy && now < g_end) {
        if (c->next_at <= now) {
          double at = c->next_at;
          c->next_at += g_interval;
          start_call(t, c, at);
        } else if (c->next_at < wake) {
          wake = c->next_at;
        }
      }
      busy |= c->busy;
    }
    if (now >= g_end && !busy) break;
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_micros((int64_t)((wake - now) * 1e6), GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(t->cq, dl, NULL);
    if (ev.type != GRPC_OP_COMPLETE) continue;
    bench_client *c = ev.tag;
    finish_call(t, c);
    if (g_interval == 0 && now_s() < g_end) start_call(t, c, now_s());
  }
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: bench-rpc ADDR REQUEST CLIENTS SECONDS [RATE]\n");
    return 2;
  }
  g_addr = argv[1];
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  g_req_len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  g_req = malloc(g_req_len);
  if (fread(g_req, 1, g_req_len, f) != g_req_len) return 1;
  fclose(f);
  if (g_req_len > 0 && g_req[0] == '{') { /* JSON: encode it */
    ProtobufCMessage *m = NULL;
    tcc_error err;
    if (tcc_pbjson_parse(&tcc__v1__compile_request__descriptor, (const char *)g_req, g_req_len, &m, &err)) {
      fprintf(stderr, "bench-rpc: %s: %s\n", argv[2], err.msg);
      return 1;
    }
    free(g_req);
    g_req_len = protobuf_c_message_get_packed_size(m);
    g_req = malloc(g_req_len);
    protobuf_c_message_pack(m, g_req);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  int nclients = atoi(argv[3]);
  double seconds = atof(argv[4]);
  double rate = argc > 5 ? atof(argv[5]) : 0;
  if (nclients < 1 || seconds <= 0) return 2;
  g_interval = rate > 0 ? nclients / rate : 0;

  grpc_init();
  g_method = grpc_slice_from_static_string("/tcc.v1.Compiler/Compile");
  int nthreads = nclients < 2 ? 1 : 2;
  bench_thread *threads = calloc((size_t)nthreads, sizeof *threads);
  bench_client *clients = calloc((size_t)nclients, sizeof *clients);
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  for (int i = 0; i < nclients; i++) {
    /* a distinct channel arg keeps gRPC from sharing one subchannel */
    grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = (char *)"tccd.bench.client", .value.integer = i};
    grpc_channel_args args = {1, &arg};
    clients[i].channel = grpc_channel_create(g_addr, creds, &args);
  }
  grpc_channel_credentials_release(creds);
  for (int t = 0, next = 0; t < nthreads; t++) {
    int n = nclients / nthreads + (t < nclients % nthreads);
    threads[t].cq = grpc_completion_queue_create_for_next(NULL);
    threads[t].clients = &clients[next];
    threads[t].nclients = n;
    next += n;
  }
  /* half a second of warm-up (connections, caches), then the measurement */
  g_start = now_s() + 0.5;
  g_end = g_start + seconds;
  for (int t = 0; t < nthreads; t++) pthread_create(&threads[t].tid, NULL, thread_main, &threads[t]);
  size_t total = 0;
  long errors = 0, not_hits = 0;
  for (int t = 0; t < nthreads; t++) {
    pthread_join(threads[t].tid, NULL);
    total += threads[t].nlat;
    errors += threads[t].errors;
    not_hits += threads[t].not_hits;
  }
  double *lat = malloc((total ? total : 1) * sizeof *lat);
  size_t k = 0;
  for (int t = 0; t < nthreads; t++) {
    memcpy(lat + k, threads[t].lat, threads[t].nlat * sizeof *lat);
    k += threads[t].nlat;
    free(threads[t].lat);
  }
  qsort(lat, total, sizeof *lat, cmp_double);
#define PCT(p) (total ? lat[(size_t)((double)(total - 1) * (p))] : 0.0)
  printf("{\"clients\": %d, \"mode\": \"%s\", \"target_rps\": %.0f, \"requests\": %zu, \"errors\": %ld, "
         "\"not_hits\": %ld, \"seconds\": %.3f, \"rps\": %.1f, \"p50_us\": %.1f, \"p90_us\": %.1f, "
         "\"p99_us\": %.1f, \"max_us\": %.1f}\n",
         nclients, rate > 0 ? "open" : "closed", rate, total, errors, not_hits, seconds,
         (double)total / seconds, PCT(0.50), PCT(0.90), PCT(0.99), total ? lat[total - 1] : 0.0);
  for (int i = 0; i < nclients; i++) grpc_channel_destroy(clients[i].channel);
  for (int t = 0; t < nthreads; t++) {
    grpc_completion_queue_shutdown(threads[t].cq);
    while (grpc_completion_queue_next(threads[t].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(threads[t].cq);
  }
  grpc_slice_unref(g_method);
  free(lat);
  free(clients);
  free(threads);
  free(g_req);
  grpc_shutdown();
  return errors ? 1 : 0;
}
