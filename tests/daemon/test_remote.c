/*
 * test_remote.c — the remote tier's parts that no RPC reaches yet, against
 * a real redis-server started here on a free loopback port:
 *   - tccd_redis_slot: the Redis Cluster spec's CRC16 and hash-tag rules
 *     (values checked against CLUSTER KEYSLOT of redis-server 7);
 *   - the record hook (tccd_remote_record_put/get): a random blob (seed
 *     printed; TCC_TEST_SEED replays it) comes back byte for byte and
 *     signed; an absent record is 0; a blob altered in Redis, an unsigned
 *     record and a record signed by an untrusted key are refused (-1,
 *     remote_rejected); bad names are INVALID_ARGUMENT; a get pending at
 *     shutdown gets -1.
 * The daemon's remote.c, redis_cluster.c and log.c are compiled in.
 */
#include <check.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "tcctest.h"

extern char **environ;

/* ------------------------------------------------------------ slots */

START_TEST(test_slot_vectors) {
  /* CLUSTER KEYSLOT on redis-server 7.0 */
  ck_assert_int_eq(tccd_redis_slot("123456789", 9), 12739); /* CRC16-XMODEM check value 0x31C3 */
  ck_assert_int_eq(tccd_redis_slot("foo", 3), 12182);
  ck_assert_int_eq(tccd_redis_slot("{foo}bar", 8), 12182);
  ck_assert_int_eq(tccd_redis_slot("foo{bar}{zap}", 13), tccd_redis_slot("bar", 3));
  ck_assert_int_eq(tccd_redis_slot("foo{}{bar}", 10), 8363);         /* empty tag: the whole key */
  ck_assert_int_eq(tccd_redis_slot("foo{{bar}}zap", 13), tccd_redis_slot("{bar", 4));
  const char *tag = "tccd:{0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}:";
  char a[160], b[160];
  snprintf(a, sizeof a, "%sentry", tag);
  snprintf(b, sizeof b, "%sfailure", tag);
  ck_assert_int_eq(tccd_redis_slot(a, strlen(a)), tccd_redis_slot(b, strlen(b)));
  ck_assert_int_eq(tccd_redis_slot(a, strlen(a)),
                   tccd_redis_slot("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64));
}
END_TEST

/* ------------------------------------------------------------ a redis-server */

static pid_t redis_pid;
static int redis_port;
static char workdir[256];

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len))
    return -1;
  close(fd);
  return ntohs(sa.sin_port);
}

static redisContext *redis_sync(void) {
  struct timeval tv = {2, 0};
  return redisConnectWithTimeout("127.0.0.1", redis_port, tv);
}

/* Returns 0 when redis-server answers PING, -1 when it cannot start. */
static int redis_start(void) {
  redis_port = free_port();
  char port[16];
  snprintf(port, sizeof port, "%d", redis_port);
  char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                  "--dir", workdir, "--logfile", "", "--loglevel", "warning", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
  int rc = posix_spawnp(&redis_pid, "redis-server", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  for (int i = 0; i < 200; i++) {
    redisContext *c = redis_sync();
    if (c && !c->err) {
      redisReply *r = redisCommand(c, "PING");
      int ok = r && r->type == REDIS_REPLY_STATUS;
      freeReplyObject(r);
      redisFree(c);
      if (ok) return 0;
    } else if (c) {
      redisFree(c);
    }
    usleep(25000);
  }
  return -1;
}

static void redis_stop(void) {
  if (redis_pid > 0) {
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
    redis_pid = 0;
  }
}

/* ------------------------------------------------------------ a minimal daemon state */

typedef struct fixture {
  tccd_config cfg;
  tccd_state st;
  uv_loop_t loop;
  tcc_sign_key key;
} fixture;

static void fixture_open(fixture *fx, int sign, const tcc_sign_key *trust_extra) {
  memset(fx, 0, sizeof *fx);
  ck_assert_int_eq(uv_loop_init(&fx->loop), 0);
  snprintf(fx->cfg.redis, sizeof fx->cfg.redis, "redis://127.0.0.1:%d", redis_port);
  fx->cfg.redis_ttl_s = 3600;
  fx->cfg.redis_timeout_ms = 2000;
  fx->cfg.compile_timeout_ms = 10000;
  fx->st.cfg = &fx->cfg;
  fx->st.loop = &fx->loop;
  char dir[300];
  snprintf(dir, sizeof dir, "%s/cache-%d", workdir, rand());
  tcc_cache_options o = {.dir = dir};
  tcc_error err;
  ck_assert_msg(tcc_cache_open(&o, &fx->st.cache, &err) == 0, "%s", err.msg);
  if (sign) {
    char path[320];
    snprintf(path, sizeof path, "%s/key-%d", workdir, rand());
    ck_assert_msg(tcc_sign_keygen(path, NULL, &err) == 0, "%s", err.msg);
    ck_assert_msg(tcc_sign_key_load(path, &fx->key, &err) == 0, "%s", err.msg);
    fx->st.signing_key = &fx->key;
    ck_assert_int_eq(tcc_trusted_keys_add(&fx->st.trusted, fx->key.pk), 0);
  }
  if (trust_extra) ck_assert_int_eq(tcc_trusted_keys_add(&fx->st.trusted, trust_extra->pk), 0);
  ck_assert_msg(tccd_remote_init(&fx->st, &err) == 0, "%s", err.msg);
  /* wait for the connection (and the mode: one server) */
  for (int i = 0; i < 400; i++) {
    int on, connected;
    const char *addr;
    tccd_remote_info(&fx->st, &on, &connected, &addr);
    if (connected) break;
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    usleep(5000);
  }
}

static void fixture_close(fixture *fx) {
  tccd_remote_close(&fx->st);
  while (uv_run(&fx->loop, UV_RUN_NOWAIT)) usleep(1000);
  ck_assert_int_eq(uv_loop_close(&fx->loop), 0);
  tcc_cache_close(fx->st.cache);
  tcc_trusted_keys_free(&fx->st.trusted);
  tcc_sign_key_wipe(&fx->key);
}

typedef struct got {
  int calls, found;
  uint8_t *data;
  size_t len;
} got;

static void on_record(void *arg, int found, const uint8_t *data, size_t len) {
  got *g = arg;
  g->calls++;
  g->found = found;
  free(g->data);
  g->data = NULL;
  g->len = len;
  if (found == 1) {
    g->data = malloc(len ? len : 1);
    memcpy(g->data, data, len);
  }
}

/* Gets kind/tag and runs the loop until the answer. */
static got get_record(fixture *fx, const char *kind, const char *tag) {
  got g = {0};
  ck_assert_int_eq(tccd_remote_record_get(&fx->st, kind, tag, on_record, &g), 0);
  for (int i = 0; i < 2000 && !g.calls; i++) {
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  ck_assert_int_eq(g.calls, 1);
  return g;
}

/* Runs the loop until Redis holds key (a put is fire-and-forget). */
static void wait_key(fixture *fx, const char *key) {
  redisContext *c = redis_sync();
  ck_assert_ptr_nonnull(c);
  int exists = 0;
  for (int i = 0; i < 2000 && !exists; i++) {
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    exists = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!exists) usleep(1000);
  }
  redisFree(c);
  ck_assert_msg(exists, "%s never written", key);
}

static int64_t counter(fixture *fx, tcc_cache_counter which) {
  tcc_cache_stats s;
  tcc_error err;
  ck_assert_int_eq(tcc_cache_stats_get(fx->st.cache, &s, &err), 0);
  return s.counters[which];
}

START_TEST(test_records) {
  if (redis_start() != 0) {
    redis_stop();
    fprintf(stderr, "redis-server not available: record tests skipped\n");
    return;
  }
  size_t n = 1000 + (size_t)(rand() % 5000);
  uint8_t *blob = malloc(n);
  for (size_t i = 0; i < n; i++) blob[i] = (uint8_t)rand();

  fixture a;
  fixture_open(&a, 1, NULL);
  ck_assert_int_eq(tccd_remote_record_put(&a.st, "tune", "k1{x", blob, n, 0), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tccd_remote_record_get(&a.st, "", "k1", on_record, NULL), TCC_E_INVALID_ARGUMENT);
  ck_assert_int_eq(tccd_remote_record_put(&a.st, "tune", "shape-0a1b.cpu", blob, n, 0), 0);
  wait_key(&a, "tccd:{shape-0a1b.cpu}:rec:tune");
  got g = get_record(&a, "tune", "shape-0a1b.cpu");
  ck_assert_int_eq(g.found, 1);
  ck_assert_uint_eq(g.len, n);
  ck_assert_int_eq(memcmp(g.data, blob, n), 0);
  free(g.data);
  /* keep_existing: the first record stays (SET NX); without it the last wins */
  ck_assert_int_eq(tccd_remote_record_put(&a.st, "tune", "shape-0a1b.cpu", blob, n / 2, 1), 0);
  g = get_record(&a, "tune", "shape-0a1b.cpu");   /* (the put went first on the one connection) */
  ck_assert_int_eq(g.found, 1);
  ck_assert_uint_eq(g.len, n);
  free(g.data);
  ck_assert_int_eq(tccd_remote_record_put(&a.st, "tune", "shape-0a1b.cpu", blob, n / 2, 0), 0);
  g = get_record(&a, "tune", "shape-0a1b.cpu");
  ck_assert_int_eq(g.found, 1);
  ck_assert_uint_eq(g.len, n / 2);
  free(g.data);
  ck_assert_int_eq(tccd_remote_record_put(&a.st, "tune", "shape-0a1b.cpu", blob, n, 0), 0);
  g = get_record(&a, "tune", "shape-0a1b.cpu");
  ck_assert_uint_eq(g.len, n);
  free(g.data);
  g = get_record(&a, "tune", "never-written");
  ck_assert_int_eq(g.found, 0);
  /* the TTL is set */
  redisContext *c = redis_sync();
  redisReply *r = redisCommand(c, "PTTL %s", "tccd:{shape-0a1b.cpu}:rec:tune");
  ck_assert(r->integer > 3500 * 1000 && r->integer <= 3600 * 1000);
  freeReplyObject(r);
  /* one byte of the blob altered in Redis: refused */
  r = redisCommand(c, "GET %s", "tccd:{shape-0a1b.cpu}:rec:tune");
  size_t off = r->len - 1 - (size_t)rand() % n;
  r->str[off] ^= 0x04;
  redisReply *w = redisCommand(c, "SET %s %b KEEPTTL", "tccd:{shape-0a1b.cpu}:rec:tune", r->str, r->len);
  freeReplyObject(w);
  freeReplyObject(r);
  int64_t rejected = counter(&a, TCC_COUNTER_remote_rejected);
  g = get_record(&a, "tune", "shape-0a1b.cpu");
  ck_assert_int_eq(g.found, -1);
  ck_assert_int_eq(counter(&a, TCC_COUNTER_remote_rejected), rejected + 1);

  /* an unsigned writer: readable by a daemon without keys, refused by one that verifies */
  fixture u;
  fixture_open(&u, 0, NULL);
  ck_assert_int_eq(tccd_remote_record_put(&u.st, "tune", "unsigned", blob, n, 0), 0);
  wait_key(&u, "tccd:{unsigned}:rec:tune");
  g = get_record(&u, "tune", "unsigned");
  ck_assert_int_eq(g.found, 1);
  free(g.data);
  g = get_record(&a, "tune", "unsigned");
  ck_assert_int_eq(g.found, -1);

  /* another key: refused unless trusted */
  fixture b;
  fixture_open(&b, 1, NULL);
  ck_assert_int_eq(tccd_remote_record_put(&b.st, "tune", "from-b", blob, n, 0), 0);
  wait_key(&b, "tccd:{from-b}:rec:tune");
  g = get_record(&a, "tune", "from-b");
  ck_assert_int_eq(g.found, -1);
  fixture a2;
  fixture_open(&a2, 1, &b.key);
  g = get_record(&a2, "tune", "from-b");
  ck_assert_int_eq(g.found, 1);
  ck_assert_int_eq(memcmp(g.data, blob, n), 0);
  free(g.data);

  /* a get pending at shutdown is answered -1 */
  got pending = {0};
  ck_assert_int_eq(tccd_remote_record_get(&a2.st, "tune", "from-b", on_record, &pending), 0);
  fixture_close(&a2);
  ck_assert_int_eq(pending.calls, 1);
  ck_assert_int_eq(pending.found, -1);

  redisFree(c);
  fixture_close(&b);
  fixture_close(&u);
  fixture_close(&a);
  free(blob);
  redis_stop();
}
END_TEST

/* ------------------------------------------------------------ evict */

typedef struct evicted {
  int calls;
  tccd_remote_evict_result res;
} evicted;

static void on_evict(void *arg, const tccd_remote_evict_result *res) {
  evicted *e = arg;
  e->calls++;
  e->res = *res;
}

/* Evicts hash and runs the loop until the answer. */
static evicted evict_hash(fixture *fx, const uint8_t hash[TCC_SHA256_BYTES]) {
  evicted e = {0};
  tcc_error err;
  ck_assert_msg(tccd_remote_evict(&fx->st, hash, on_evict, &e, &err) == 0, "%s", err.msg);
  for (int i = 0; i < 5000 && !e.calls; i++) {
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  ck_assert_int_eq(e.calls, 1);
  return e;
}

static int64_t redis_exists(redisContext *c, const char *key) {
  redisReply *r = redisCommand(c, "EXISTS %s", key);
  int64_t n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  freeReplyObject(r);
  return n;
}

#define REMOTE_TEST_KEY 120

START_TEST(test_evict) {
  if (redis_start() != 0) {
    redis_stop();
    fprintf(stderr, "redis-server not available: evict tests skipped\n");
    return;
  }
  uint8_t hash[TCC_SHA256_BYTES];
  for (size_t i = 0; i < sizeof hash; i++) hash[i] = (uint8_t)rand();
  char hex[TCC_SHA256_HEX], k[4][REMOTE_TEST_KEY];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  static const char *const parts[4] = {"entry", "artifact", "failure", "lock"};
  redisContext *c = redis_sync();
  ck_assert_ptr_nonnull(c);
  for (int i = 0; i < 4; i++) {
    snprintf(k[i], sizeof k[i], "tccd:{%s}:%s", hex, parts[i]);
    freeReplyObject(redisCommand(c, "SET %s x%d", k[i], rand()));
  }

  fixture a;
  fixture_open(&a, 0, NULL);
  /* entry, artifact and failure go; the lock (a compile in progress) stays */
  evicted e = evict_hash(&a, hash);
  ck_assert_int_eq(e.res.error, 0);
  ck_assert(e.res.entry && e.res.artifact && e.res.failure);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(redis_exists(c, k[i]), 0);
  ck_assert_int_eq(redis_exists(c, k[3]), 1);
  /* only the failure left (the negative cache): only it is reported */
  freeReplyObject(redisCommand(c, "SET %s y", k[2]));
  e = evict_hash(&a, hash);
  ck_assert(!e.res.error && !e.res.entry && !e.res.artifact && e.res.failure);
  e = evict_hash(&a, hash);
  ck_assert(!e.res.error && !e.res.entry && !e.res.artifact && !e.res.failure);

  /* a Redis that does not answer: the timeout, as an error */
  a.cfg.redis_timeout_ms = 200;
  freeReplyObject(redisCommand(c, "SET %s z", k[0]));
  kill(redis_pid, SIGSTOP);
  int64_t errors = counter(&a, TCC_COUNTER_remote_errors);
  e = evict_hash(&a, hash);
  kill(redis_pid, SIGCONT);
  ck_assert_int_eq(e.res.error, TCC_E_DEADLINE_EXCEEDED);
  ck_assert_msg(strstr(e.res.message, "no answer within 200 ms"), "%s", e.res.message);
  ck_assert_int_eq(counter(&a, TCC_COUNTER_remote_errors), errors + 1);

  /* one pending at shutdown is answered with an error */
  evicted pending = {0};
  tcc_error err;
  ck_assert_int_eq(tccd_remote_evict(&a.st, hash, on_evict, &pending, &err), 0);
  fixture_close(&a);
  ck_assert_int_eq(pending.calls, 1);
  ck_assert_int_eq(pending.res.error, TCC_E_UNAVAILABLE);

  /* Redis gone: refused at once, or answered with an error once the loss is seen */
  fixture b;
  fixture_open(&b, 0, NULL);
  redisFree(c);
  redis_stop();
  evicted gone = {0};
  int rc = tccd_remote_evict(&b.st, hash, on_evict, &gone, &err);
  for (int i = 0; i < 5000 && rc == 0 && !gone.calls; i++) {
    uv_run(&b.loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  if (rc == 0) ck_assert(gone.calls == 1 && gone.res.error != 0);
  else ck_assert_msg(rc == TCC_E_UNAVAILABLE && strstr(err.msg, "not connected"), "%d %s", rc, err.msg);
  ck_assert_int_eq(tccd_remote_evict(&b.st, hash, on_evict, &gone, &err), TCC_E_UNAVAILABLE);
  fixture_close(&b);
  /* no remote tier: -1, done never runs */
  tccd_state none = {0};
  ck_assert_int_eq(tccd_remote_evict(&none, hash, on_evict, &gone, &err), -1);
}
END_TEST

int main(void) {
  srand((unsigned)tt_seed("test_remote"));
  char *dir = tt_tmpdir("test-remote");
  if (!dir) return 1;
  snprintf(workdir, sizeof workdir, "%s", dir);
  free(dir);
  int rc = tt_run_tests("remote", 120, 1, (const TTest *[]){test_slot_vectors, test_records, test_evict, NULL});
  redis_stop();
  if (tt_remove_tree(workdir) != 0) fprintf(stderr, "could not remove %s\n", workdir);
  return rc;
}
