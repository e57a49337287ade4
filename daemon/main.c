/*
 * main.c — tccd: start-up, the housekeeping cron, signals, shutdown.
 *
 *   load config ─► grpc_init ─► toolchain identity ─► NVRTC preload ─► open cache
 *   ─► start server (bind, gRPC thread) ─► uv_run ... SIGINT/SIGTERM:
 *   drain (refuse new compiles, cancel queued ones, let in-flight calls
 *   finish for --shutdown-grace-ms, then cancel them and kill running
 *   compilers: tcc_tools_cancel) ─► server gone
 *   ─► close handles ─► uv_run returns once running compiles have ended
 *   ─► close cache (flushes counters) ─► grpc_shutdown ─► exit 0.
 *
 * Request preparation and gc's blob verification run on the offload
 * threads (offload.c), started before the server and stopped once it is
 * gone. The metrics port (metrics.c, --metrics-listen) opens before the
 * server and closes once it is gone.
 *
 * Housekeeping (one timer, every second, Redis serverCron-style):
 *   - write pending hit bookkeeping and counters to the cache (and make
 *     its reserve again after a full disk);
 *   - unblock storing once a full disk has room again;
 *   - after a burst of large requests, trim the heaps (twice more).
 * (The remote tier has its own 10 ms timer for command timeouts, polls
 * and reconnects: remote.c.)
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "tcc_config.h"

static uv_signal_t sigint_handle, sigterm_handle;
static uv_timer_t housekeeping_timer;
static uv_timer_t cancel_timer; /* shutdown: kills running compiles after the grace */

static void on_cancel_timer(uv_timer_t *t) {
  tccd_state *st = t->data;
  log_info("shutdown: the grace period is over; killing running compiles");
  tccd_jobs_cancel_running(st);
}

static void housekeeping(uv_timer_t *t) {
  tccd_state *st = t->data;
  tcc_error err;
  if (tcc_cache_flush(st->cache, &err) != 0 && !st->store_blocked) log_warn("cache flush failed: %s", err.msg);
  tccd_store_check(st);
  tccd_jobs_trim(st);
  tccd_warm_pump(st);
}

static void on_server_done(tccd_state *st) {
  log_info("server stopped; waiting for running compiles to be stored");
  tccd_offload_stop(st); /* no call is left to prepare for */
  tccd_metrics_stop(st);  /* scrapes went on through the grace period */
  tccd_remote_close(st); /* compiles that finish from here on are stored locally only */
  uv_timer_stop(&housekeeping_timer);
  uv_close((uv_handle_t *)&housekeeping_timer, NULL);
  uv_close((uv_handle_t *)&sigint_handle, NULL);
  uv_close((uv_handle_t *)&sigterm_handle, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  tccd_state *st = h->data;
  if (st->draining) {
    log_warn("%s again: still shutting down", strsignal(signum));
    return;
  }
  log_info("%s: shutting down (grace %d ms)", strsignal(signum), st->cfg->shutdown_grace_ms);
  st->draining = 1;
  tccd_jobs_cancel_queued(st);
  /* unref'd: it kills what still runs at the end of the grace, but does
   * not keep the loop alive once nothing does */
  uv_timer_start(&cancel_timer, on_cancel_timer, (uint64_t)(st->cfg->shutdown_grace_ms > 0 ? st->cfg->shutdown_grace_ms : 0), 0);
  uv_unref((uv_handle_t *)&cancel_timer);
  tccd_server_shutdown(st->server, st->cfg->shutdown_grace_ms, on_server_done);
}

/* Writes the bound port atomically (tmp + rename) for scripts and tests. */
static int write_port_file(const char *path, int port) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fprintf(f, "%d\n", port);
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* Is the HOST of HOST:PORT a loopback address (127.0.0.0/8, ::1,
 * localhost)? Unix sockets count as local too. */
static int listen_is_loopback(const char *listen) {
  if (!strncmp(listen, "unix:", 5)) return 1;
  if (!strncmp(listen, "127.", 4) || !strncmp(listen, "[::1]", 5) || !strncmp(listen, "localhost:", 10))
    return 1;
  return 0;
}

int main(int argc, char **argv) {
  tccd_config cfg;
  tcc_error err;
  tcc_error_clear(&err);
  int rc = tccd_config_load(&cfg, argc, argv, &err);
  if (rc == 1) return 0;
  if (rc != 0) {
    fprintf(stderr, "tccd: %s\n", err.msg);
    return 2;
  }
  tccd_log_set_level(cfg.log_level);
  tccd_log_set_format(cfg.log_format);
  signal(SIGPIPE, SIG_IGN);
  /* A fixed mmap threshold: blocks of 256 KiB and more (request
   * messages, decoded graphs' arenas) are mapped and go back to the
   * system when freed, instead of glibc's dynamic threshold moving them
   * into the heaps, where a burst of large requests left RSS 40% above
   * its baseline (compile.c trims the heaps after such bursts too). */
  mallopt(M_MMAP_THRESHOLD, 256 << 10);

  /* The compile pool is libuv's thread pool: size it before first use. */
  char pool[16];
  snprintf(pool, sizeof pool, "%d", cfg.workers);
  setenv("UV_THREADPOOL_SIZE", pool, 1);

  tccd_state st;
  memset(&st, 0, sizeof st);
  st.cfg = &cfg;
  st.loop = uv_default_loop();
  st.started_ns = uv_hrtime();

  if (tccd_security_init(&st, &err) != 0) {
    log_error("%s", err.msg);
    tccd_security_free(&st);
    return 2;
  }
  if (tcc_toolchain_identity(cfg.cc, st.identity, sizeof st.identity, &err) != 0) {
    log_error("cannot use the C compiler '%s' (--cc): %s", cfg.cc, err.msg);
    tccd_security_free(&st);
    return 1;
  }
  /* NVRTC (CUDA targets) is dlopen'ed on first use, ~30 ms: load it now,
   * not on the loop thread under the first CUDA request. */
  tcc_error nverr = {0};
  char nvrtc_id[256] = "";
  if (tcc_toolchain_cuda_identity(nvrtc_id, sizeof nvrtc_id, &nverr) != 0)
    snprintf(nvrtc_id, sizeof nvrtc_id, "unavailable (%.200s)", nverr.msg);
  tcc_cache_options copts = {
      .dir = cfg.cache_dir, .max_bytes = cfg.cache_max_bytes, .graph_digest = tcc_key_graph_digest};
  if (tcc_cache_open(&copts, &st.cache, &err) != 0) {
    log_error("cannot use the cache directory %s (--cache-dir): %s", cfg.cache_dir, err.msg);
    tccd_security_free(&st);
    return 1;
  }
  if (tccd_security_default_key(&st, &err) != 0) {
    log_error("%s", err.msg);
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    return 1;
  }
  if (tccd_jobs_init(&st) != 0) {
    log_error("out of memory");
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    return 1;
  }

  if (tccd_offload_start(&st) != 0) {
    log_error("cannot start the offload threads");
    tccd_jobs_free(&st);
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    return 1;
  }

  if (tccd_remote_init(&st, &err) != 0) {
    log_error("%s", err.msg);
    tccd_offload_stop(&st);
    uv_run(st.loop, UV_RUN_NOWAIT);
    tccd_jobs_free(&st);
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    return 2;
  }

  /* before the server: every call counts its status into st.metrics */
  if ((rc = tccd_metrics_start(&st, &err)) != 0) {
    log_error("%s", err.msg);
    tccd_metrics_stop(&st);
    tccd_remote_close(&st);
    tccd_offload_stop(&st);
    uv_run(st.loop, UV_RUN_NOWAIT);
    tccd_metrics_free(&st);
    tccd_jobs_free(&st);
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    return rc == TCC_E_UNAVAILABLE ? 1 : 2; /* as --listen: a taken port is 1, a bad flag 2 */
  }

  grpc_init();
  if (tccd_server_start(&st, &err) != 0) {
    log_error("%s", err.msg);
    tccd_metrics_stop(&st);
    tccd_remote_close(&st);
    tccd_offload_stop(&st);
    uv_run(st.loop, UV_RUN_NOWAIT); /* let the metrics', remote tier's and offload's handles close */
    tccd_metrics_free(&st);
    tccd_jobs_free(&st);
    tcc_cache_close(st.cache);
    tccd_security_free(&st);
    grpc_shutdown();
    return 1;
  }
  int port = tccd_server_port(st.server);

  uv_signal_init(st.loop, &sigint_handle);
  uv_signal_init(st.loop, &sigterm_handle);
  sigint_handle.data = sigterm_handle.data = &st;
  uv_signal_start(&sigint_handle, on_signal, SIGINT);
  uv_signal_start(&sigterm_handle, on_signal, SIGTERM);
  uv_timer_init(st.loop, &housekeeping_timer);
  housekeeping_timer.data = &st;
  uv_timer_start(&housekeeping_timer, housekeeping, 1000, 1000);

  const char *colon = strrchr(cfg.listen, ':');
  log_info("tccd %s listening on %.*s:%d (cache %s, %d workers, budget %lld bytes)", TCC_VERSION,
           colon ? (int)(colon - cfg.listen) : 0, cfg.listen, port, cfg.cache_dir, cfg.workers,
           (long long)cfg.cache_max_bytes);
  log_info("compiler: %s", st.identity);
  log_info("CUDA targets: %s", nvrtc_id);
  if (st.remote) {
    int on, connected;
    const char *where;
    tccd_remote_info(&st, &on, &connected, &where);
    log_info("remote tier: redis %s (ttl %llds, timeout %d ms)", where, (long long)cfg.redis_ttl_s,
             cfg.redis_timeout_ms);
  }
  if (st.auth) log_info("bearer-token auth on (--auth-tokens %s); Health/Check stays open", cfg.auth_tokens);
  if (cfg.tls_cert[0])
    log_info("TLS on (%s)", cfg.tls_client_ca[0] ? "client certificates required and verified" : "server certificate only");
  else if (!listen_is_loopback(cfg.listen))
    log_warn("listening on %s without TLS: %s travel in clear text (see --tls-cert)", cfg.listen,
             st.auth ? "bearer tokens and artifacts" : "artifacts");
  st.open_without_auth = !st.auth && !listen_is_loopback(cfg.listen);
  if (st.open_without_auth)
    log_warn("listening on %s WITHOUT AUTH: anyone who can reach this port can compile (run the C "
             "compiler on what they send), evict entries, gc and read the cache; give --auth-tokens FILE, "
             "or listen on 127.0.0.1", cfg.listen);
  if (cfg.metrics_listen[0]) {
    const char *mcolon = strrchr(cfg.metrics_listen, ':');
    log_info("metrics on %s://%.*s:%d/metrics%s", cfg.tls_cert[0] ? "https" : "http", (int)(mcolon - cfg.metrics_listen),
             cfg.metrics_listen, tccd_metrics_port(&st), st.auth ? " (bearer token required)" : "");
    if (!listen_is_loopback(cfg.metrics_listen) && !st.auth)
      log_warn("metrics on %s WITHOUT AUTH: anyone who can reach this port can read the daemon's counters; "
               "give --auth-tokens FILE, or listen on 127.0.0.1", cfg.metrics_listen);
    else if (!listen_is_loopback(cfg.metrics_listen) && !cfg.tls_cert[0])
      log_warn("metrics on %s without TLS: bearer tokens travel in clear text (see --tls-cert)", cfg.metrics_listen);
  }
  if (st.signing_key)
    log_info("signing artifacts with key %s (%zu trusted key%s)", st.signing_key->key_id, st.trusted.n,
             st.trusted.n == 1 ? "" : "s");
  else
    log_warn("--no-signing: artifacts are served unsigned; clients with TCCD_TRUSTED_KEYS will refuse them");

  /* the port file says "ready": written after the start-up lines, so a
   * reader of it finds them in the log */
  if (cfg.port_file[0] && write_port_file(cfg.port_file, port) != 0)
    log_warn("cannot write --port-file %s: %s", cfg.port_file, strerror(errno));
  uv_timer_init(st.loop, &cancel_timer);
  cancel_timer.data = &st;

  uv_run(st.loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&cancel_timer, NULL);
  uv_run(st.loop, UV_RUN_NOWAIT);

  tccd_server_free(st.server);
  tccd_metrics_free(&st);
  tccd_jobs_free(&st);
  tccd_warm_free(&st);
  tccd_explain_free(&st);
  tcc_cache_close(st.cache); /* flushes counters */
  tccd_security_free(&st);
  grpc_shutdown();
  if (uv_loop_close(st.loop) != 0) log_warn("libuv loop closed with handles still open");
  log_info("stopped");
  return 0;
}
