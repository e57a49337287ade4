/*
 * remote.c — the cluster tier: one Redis (or one Redis Cluster) shared by
 * every tccd, behind each daemon's local SQLite cache (--redis URL[,URL]).
 * Commands go through redis_cluster.c (hiredis's async API on the daemon's
 * own libuv loop; routing by hash slot on a cluster): nothing here ever
 * blocks the loop thread, and a Redis that is down, slow or full only
 * costs the cluster-wide sharing, never an answer.
 *
 * DESIGN
 *
 * Keys (Redis Cluster hash tags: the keys of one guard hash live in one
 * slot, so MGET and the scripts below work on a cluster too; the routing
 * key passed to remote_send is one of them):
 *
 *   tccd:{<guard hash hex>}:entry     tcc.v1.RemoteEntry (tcc.proto): key
 *                                     bytes, manifest, digest, signature...
 *   tccd:{<guard hash hex>}:artifact  the artifact bytes
 *   tccd:{<guard hash hex>}:lock      "<random token>" while one daemon
 *                                     compiles it (SET NX PX)
 *   tccd:{<guard hash hex>}:failure   tcc.v1.RemoteFailure: a failure that
 *                                     would repeat (the negative cache),
 *                                     signed; written by job_fail's
 *                                     tccd_remote_publish_failure
 *   tccd:{<tag>}:rec:<kind>           "TCR1" envelope (signed?, key id,
 *                                     signature) + an opaque blob: records
 *                                     (tccd_remote_record_put/get)
 *
 * Entry, artifact, failure and records carry a TTL (--redis-ttl, default 30 days), set when
 * written and refreshed (PEXPIRE) whenever a daemon takes the entry from
 * Redis. Size policy is Redis's own: run it with a maxmemory and an
 * eviction policy (volatile-lru or allkeys-lru); every key tccd writes
 * has a TTL. A write refused for memory (OOM) is a remote error.
 *
 * One cluster-wide compile per guard hash. A local miss that no local job
 * is compiling starts a flight (compile.c holds its job in state REMOTE
 * meanwhile; later identical requests on this daemon wait on that job).
 * A flight's life is one state machine (flight_set_state asserts every
 * move):
 *
 *              MGET entry artifact lock failure
 *   PROBE ─────────────────────────────┬─ entry + artifact ── verify ─► HIT
 *     ▲                                │   (digest, key,       │ bad: COMPILE
 *     │                                │    signature)         ▼ (rejected)
 *     │                                ├─ no entry, a failure record
 *     │                                │  that verifies ──────────────► FAILURE
 *     │                                ├─ no entry, no lock ─► LOCK
 *     │ next poll                      └─ no entry, locked ──► WAIT
 *     │ (20 ms, doubling to 500)
 *   WAIT ◄── SET lock NX PX fails ── LOCK ── OK ─► COMPILE (locked: the
 *     │                                            daemon compiles, then
 *     │ waited longer than the compile             publishes entry +
 *     │ timeout + 10 s                             artifact and drops its
 *     └──────────────────────────────────────────► lock in one script)
 *                                                  COMPILE (not locked)
 *
 *   PROBE      an MGET is in flight (the first probe, or WAIT's next poll)
 *   LOCK       SET NX PX of the lock is in flight
 *   WAIT       another daemon holds the lock: nothing in flight; the tick
 *              probes again at next_poll_ns, or gives up at give_up_ns
 *   HIT        ends: a verified entry and its artifact for compile.c
 *   FAILURE    ends: another daemon's verified failure record
 *   COMPILE    ends: compile here, holding the lock (res.locked) or not
 *   CANCELLED  ends: compile.c forgot the flight (tccd_remote_cancel), or
 *              its first probe could not be sent; done never runs
 *
 *   Every arrow that talks to Redis may instead fail — no connection, an
 *   error reply, or no reply within --redis-timeout-ms — and then the
 *   flight ends in COMPILE (not locked): the daemon compiles locally; so
 *   does every flight still live at shutdown (tccd_remote_close).
 *   The lock expires after the compile timeout + 5 s, so a daemon that
 *   dies holding it delays the others by at most that.
 *
 *   A probe that finds no entry but a failure record that verifies (guard
 *   hash, canonical key, one of the recordable codes, the signature when
 *   the daemon has trusted keys) ends the flight in FAILURE:
 *   compile.c records it locally and answers its error. A record that
 *   does not verify counts in remote_rejected and is ignored.
 *
 * Connections (per node: reconnects with backoff, connect timeouts, hung
 * connections, the slot map, MOVED/ASK/TRYAGAIN) are redis_cluster.c's;
 * it reports failures here, and the first failure of an outage is logged
 * as a warning, the rest at debug, and recovery once at info; every
 * failure counts in remote_errors.
 *
 * One timer (`tick`, every 10 ms while a flight, a record get or an
 * evict waits) runs the command timeouts and the WAIT polls.
 *
 * Evict (tcctl evict, tccd_remote_evict): one script deletes a hash's
 * entry, artifact and failure keys and answers which existed; its reply
 * (or an error, or --redis-timeout-ms passing, or shutdown) goes to the
 * Evict call waiting on the loop. The lock and records stay.
 *
 * Trust: an entry from Redis is used only when its artifact hashes to the
 * entry's digest, its canonical key equals the requester's (no hash
 * collisions across daemons) and, whenever the daemon has trusted keys
 * (its own signing key and --trusted-keys), its signature verifies.
 * Otherwise it counts in remote_rejected and the daemon compiles the
 * graph itself (and its write-through replaces the bad entry).
 */
#include <assert.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "tcc/v1/tcc.pb-c.h"

#define REMOTE_TICK_MS 10
#define REMOTE_POLL_FIRST_MS 20
#define REMOTE_POLL_MAX_MS 500
#define REMOTE_RECONNECT_FIRST_MS 100
#define REMOTE_RECONNECT_MAX_MS 5000
#define REMOTE_LOCK_MARGIN_MS 5000
#define REMOTE_WAIT_MARGIN_MS 10000
#define REMOTE_STUCK_MIN_MS 5000
#define REMOTE_KEY_MAX 320
#define REMOTE_NAME_MAX 128             /* a record's kind or tag */
#define FAILURE_DOMAIN "tccd-failure-v2" /* the "manifest" a failure signature covers */
#define RECORD_DOMAIN "tccd-record-v1"   /* the "manifest" a record signature covers */
#define RECORD_MAGIC "TCR1"
#define RECORD_HEAD (4 + 1 + 16 + TCC_SIGNATURE_BYTES) /* magic, signed?, key id, signature */

/* Publish: artifact and entry with a TTL, then the lock dropped if it is
 * still ours. KEYS entry, artifact, lock; ARGV entry, artifact, ttl ms,
 * token ("" = none). */
static const char PUBLISH_SCRIPT[] =
    "redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) "
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3]) "
    "if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end "
    "return 1";

/* Publish a failure: the record with a TTL, then the lock dropped if it
 * is still ours. KEYS failure, lock; ARGV record, ttl ms, token. */
static const char FAILURE_SCRIPT[] =
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) "
    "if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end "
    "return 1";

/* Drops the lock only if it is still ours. KEYS lock; ARGV token. */
static const char RELEASE_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/* Evict: deletes each key, answering which existed (1) or not (0).
 * KEYS entry, artifact, failure. */
static const char EVICT_SCRIPT[] =
    "local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('DEL', k) end return r";

static const char *const flight_state_names[] = {
#define FLIGHT_STATE_NAME(name) #name,
    TCCD_FLIGHT_STATES(FLIGHT_STATE_NAME)
#undef FLIGHT_STATE_NAME
};

struct tccd_remote_flight {
  tccd_remote *r;
  tccd_flight_state state;        /* see the drawing above */
  uint8_t hash[TCC_SHA256_BYTES];
  char hex[TCC_SHA256_HEX];
  uint8_t *key;                   /* the requester's canonical key (copy) */
  size_t key_len;
  tccd_remote_done done;
  void *arg;
  struct remote_op *op;           /* the command in flight, or NULL */
  uint64_t op_deadline_ns;
  uint64_t next_poll_ns;          /* WAIT: when to probe again */
  uint64_t give_up_ns;            /* WAIT: when to stop waiting */
  unsigned poll_ms;
  int waited;                     /* it has been in WAIT (told to compile.c) */
  char token[33];
  struct tccd_remote_flight *prev, *next;
};

/* One command sent to Redis; freed by its reply callback (hiredis calls it
 * with a NULL reply when the connection goes away). */
typedef struct remote_op {
  tccd_remote *r;
  tccd_remote_flight *flight;     /* NULL: fire-and-forget, or abandoned */
  tcc_cache_counter ok_counter;   /* counted on success (fire-and-forget) */
  const char *what;
  struct remote_record_get *rec;  /* a record get waiting on it, or NULL */
  struct remote_evict *evict;     /* an evict waiting on it, or NULL */
} remote_op;

/* A tccd_remote_record_get in progress. */
typedef struct remote_record_get {
  tccd_remote *r;
  char kind[REMOTE_NAME_MAX + 1], tag[REMOTE_NAME_MAX + 1];
  tccd_remote_record_done done;
  void *arg;
  uint64_t deadline_ns;
  remote_op *op;
  struct remote_record_get *prev, *next;
} remote_record_get;

struct tccd_remote {
  tccd_state *st;
  tccd_redis *rc;                 /* the connections (redis_cluster.c) */
  const char *display;            /* host:port/db, never the password */
  uv_timer_t tick;
  int warned;                     /* the current trouble was logged */
  tccd_remote_flight *flights;
  remote_record_get *records;     /* record gets waiting for a reply */
  struct remote_evict *evicts;    /* evicts waiting for a reply */
  remote_op *last_op;             /* the op remote_send made last */
  int closing;
};

static uint64_t now_ns(void) { return uv_hrtime(); }

/* ------------------------------------------------------------ trouble */

/* Logs a failure: at warn for the first of an outage, then at debug. */
static void remote_trouble(tccd_remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void remote_trouble(tccd_remote *r, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!r->warned)
    log_warn("redis %s: %s; serving from the local cache and compiling locally meanwhile", r->display, msg);
  else
    log_debug("redis %s: %s", r->display, msg);
  r->warned = 1;
}

static void remote_healthy(tccd_remote *r) {
  if (r->warned) log_info("redis %s: working again", r->display);
  r->warned = 0;
}

static void count(tccd_remote *r, tcc_cache_counter c) { tcc_cache_count(r->st->cache, c, 1); }

/* ------------------------------------------------------------ connections */

/* The connection layer (redis_cluster.c) reports here. */
static void on_layer_trouble(void *arg, const char *msg) {
  tccd_remote *r = arg;
  count(r, TCC_COUNTER_remote_errors);
  remote_trouble(r, "%s", msg);
}

static void on_layer_healthy(void *arg) { remote_healthy(arg); }

static void on_tick(uv_timer_t *t);
static void evicts_abort(tccd_remote *r);

static void arm_tick(tccd_remote *r) {
  if (!r->closing && !uv_is_active((uv_handle_t *)&r->tick))
    uv_timer_start(&r->tick, on_tick, REMOTE_TICK_MS, REMOTE_TICK_MS);
}

static void on_reply(void *privdata, redisReply *rep);

/* Sends argv (binary-safe) to the node that owns `key` (its hash tag
 * names the slot; every key of a multi-key command shares it); with
 * flight set, the reply goes to it. Returns 0, or -1 when there is no
 * connection (nothing was sent). */
static int remote_send(tccd_remote *r, tccd_remote_flight *flight, tcc_cache_counter ok_counter,
                       const char *what, const char *key, int argc, const char **argv, const size_t *lens) {
  if (!r->rc || r->closing) return -1;
  remote_op *op = calloc(1, sizeof *op);
  if (!op) return -1;
  op->r = r;
  op->flight = flight;
  op->ok_counter = ok_counter;
  op->what = what;
  if (tccd_redis_command(r->rc, key, strlen(key), argc, argv, lens, on_reply, op) != 0) {
    free(op);
    return -1;
  }
  r->last_op = op;
  if (flight) {
    flight->op = op;
    flight->op_deadline_ns = now_ns() + (uint64_t)r->st->cfg->redis_timeout_ms * 1000000ull;
    arm_tick(r);
  }
  return 0;
}

/* ------------------------------------------------------------ entries */

static void key_name(char out[REMOTE_KEY_MAX], const char *hex, const char *part) {
  snprintf(out, REMOTE_KEY_MAX, "tccd:{%s}:%s", hex, part);
}

/* Encodes e as a tcc.v1.RemoteEntry (malloc'd). NULL when out of memory. */
static uint8_t *entry_encode(const tcc_cache_entry *e, size_t *len) {
  Tcc__V1__RemoteEntry m = TCC__V1__REMOTE_ENTRY__INIT;
  m.format = 1;
  m.guard_hash.data = (uint8_t *)e->hash;
  m.guard_hash.len = TCC_SHA256_BYTES;
  m.canonical_key.data = e->key;
  m.canonical_key.len = e->key_len;
  m.target = (char *)e->target;
  m.kind = (Tcc__V1__ArtifactKind)e->kind;
  m.manifest.data = e->manifest;
  m.manifest.len = e->manifest_len;
  m.request_meta.data = e->request_meta;
  m.request_meta.len = e->request_meta_len;
  m.artifact_sha256.data = (uint8_t *)e->artifact_sha256;
  m.artifact_sha256.len = TCC_SHA256_BYTES;
  m.size = e->size;
  m.kernels = e->kernels;
  m.compile_ms = e->compile_ms;
  m.signature.data = (uint8_t *)e->signature;
  m.signature.len = e->signature_len;
  m.key_id = (char *)e->key_id;
  m.created_unix = (int64_t)time(NULL);
  *len = tcc__v1__remote_entry__get_packed_size(&m);
  uint8_t *buf = malloc(*len ? *len : 1);
  if (buf) tcc__v1__remote_entry__pack(&m, buf);
  return buf;
}

/* Copies n bytes into a fresh allocation (NULL for n == 0). Returns 0 or -1. */
static int dup_bytes(const uint8_t *p, size_t n, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (!n) return 0;
  if (!(*out = malloc(n))) return -1;
  memcpy(*out, p, n);
  *len = n;
  return 0;
}

/* Decodes a RemoteEntry into e (owned buffers). Returns 0 or -1 (malformed). */
static int entry_decode(const uint8_t *bytes, size_t len, tcc_cache_entry *e) {
  memset(e, 0, sizeof *e);
  Tcc__V1__RemoteEntry *m = tcc__v1__remote_entry__unpack(NULL, len, bytes);
  if (!m) return -1;
  int rc = -1;
  if (m->format != 1 || m->guard_hash.len != TCC_SHA256_BYTES || m->artifact_sha256.len != TCC_SHA256_BYTES ||
      m->signature.len > sizeof e->signature || strlen(m->key_id) >= sizeof e->key_id ||
      strlen(m->target) >= sizeof e->target || m->size < 0)
    goto out;
  memcpy(e->hash, m->guard_hash.data, TCC_SHA256_BYTES);
  memcpy(e->artifact_sha256, m->artifact_sha256.data, TCC_SHA256_BYTES);
  snprintf(e->target, sizeof e->target, "%s", m->target);
  snprintf(e->key_id, sizeof e->key_id, "%s", m->key_id);
  memcpy(e->signature, m->signature.data, m->signature.len);
  e->signature_len = m->signature.len;
  e->kind = m->kind;
  e->size = m->size;
  e->kernels = m->kernels;
  e->compile_ms = m->compile_ms;
  if (dup_bytes(m->canonical_key.data, m->canonical_key.len, &e->key, &e->key_len) ||
      dup_bytes(m->manifest.data, m->manifest.len, &e->manifest, &e->manifest_len) ||
      dup_bytes(m->request_meta.data, m->request_meta.len, &e->request_meta, &e->request_meta_len)) {
    tcc_cache_entry_clear(e);
    goto out;
  }
  rc = 0;
out:
  tcc__v1__remote_entry__free_unpacked(m, NULL);
  return rc;
}

/* Is a remote entry safe to use for this flight? Returns 0 or a code with
 * the reason in err. */
static int entry_verify(const tccd_remote_flight *f, const tcc_cache_entry *e, const uint8_t *art,
                        size_t len, tcc_error *err) {
  const tccd_state *st = f->r->st;
  if (memcmp(e->hash, f->hash, TCC_SHA256_BYTES) != 0)
    return tcc_error_set(err, TCC_E_DATA_LOSS, "the entry names another guard hash");
  if (e->key_len != f->key_len || (f->key_len && memcmp(e->key, f->key, f->key_len) != 0))
    return tcc_error_set(err, TCC_E_DATA_LOSS, "guard hash collision: the entry's canonical key differs");
  uint8_t got[TCC_SHA256_BYTES];
  tcc_sha256(art, len, got);
  if ((int64_t)len != e->size || memcmp(got, e->artifact_sha256, TCC_SHA256_BYTES) != 0)
    return tcc_error_set(err, TCC_E_DATA_LOSS, "the artifact (%zu bytes) does not match the entry's digest", len);
  if (st->trusted.n > 0) {
    if (e->signature_len == 0)
      return tcc_error_set(err, TCC_E_PERMISSION_DENIED, "the entry is unsigned and this daemon verifies");
    return tcc_artifact_verify(&st->trusted, e->key_id, e->hash, e->artifact_sha256, e->manifest,
                               e->manifest_len, e->signature, e->signature_len, err);
  }
  return 0;
}

/* ------------------------------------------------------------ failures */

/* The digest a failure record's signature covers (see RemoteFailure in
 * tcc.proto). */
static void failure_digest(const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key, size_t key_len, int code,
                           const char *target, const char *identity, int64_t created, int64_t ttl_s,
                           const char *message, uint8_t out[TCC_SHA256_BYTES]) {
  uint8_t kd[TCC_SHA256_BYTES];
  tcc_sha256(key ? key : (const uint8_t *)"", key_len, kd);
  uint32_t c = (uint32_t)code;
  uint8_t be[4] = {(uint8_t)(c >> 24), (uint8_t)(c >> 16), (uint8_t)(c >> 8), (uint8_t)c};
  uint8_t times[16];
  for (int i = 0; i < 8; i++) {
    times[i] = (uint8_t)((uint64_t)created >> (56 - 8 * i));
    times[8 + i] = (uint8_t)((uint64_t)ttl_s >> (56 - 8 * i));
  }
  tcc_sha256_ctx ctx;
  tcc_sha256_init(&ctx);
  tcc_sha256_update(&ctx, FAILURE_DOMAIN, sizeof FAILURE_DOMAIN); /* with its NUL */
  tcc_sha256_update(&ctx, hash, TCC_SHA256_BYTES);
  tcc_sha256_update(&ctx, kd, sizeof kd);
  tcc_sha256_update(&ctx, be, sizeof be);
  tcc_sha256_update(&ctx, target, strlen(target) + 1);
  tcc_sha256_update(&ctx, identity, strlen(identity) + 1);
  tcc_sha256_update(&ctx, times, sizeof times);
  tcc_sha256_update(&ctx, message, strlen(message));
  tcc_sha256_final(&ctx, out);
}

/* The failures a record may claim: the deterministic ones compile.c
 * records (a poisoned record cannot make a daemon answer, say,
 * PERMISSION_DENIED, and a transient failure is never shared). */
static int failure_code_allowed(int code) {
  return code == TCC_E_UNIMPLEMENTED || code == TCC_E_INTERNAL || code == TCC_E_INVALID_ARGUMENT ||
         code == TCC_E_OUT_OF_RANGE;
}

/* Decodes and checks a failure record for this flight (format, guard
 * hash, canonical key, code, the writer's compiler identity = ours, its
 * lifetime, and the signature whenever the daemon has trusted keys).
 * Returns 0 with code and message in res, or a code with the reason in
 * err. */
static int failure_check(const tccd_remote_flight *f, const uint8_t *bytes, size_t len, tccd_remote_result *res,
                         tcc_error *err) {
  const tccd_state *st = f->r->st;
  Tcc__V1__RemoteFailure *m = tcc__v1__remote_failure__unpack(NULL, len, bytes);
  if (!m) return tcc_error_set(err, TCC_E_DATA_LOSS, "the failure record does not decode");
  int rc = 0;
  int64_t now = (int64_t)time(NULL);
  if (m->format != 2)
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "the failure record has format %u (this daemon reads 2)",
                       m->format);
  else if (m->guard_hash.len != TCC_SHA256_BYTES || memcmp(m->guard_hash.data, f->hash, TCC_SHA256_BYTES))
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "the failure record names another guard hash");
  else if (m->canonical_key.len != f->key_len || (f->key_len && memcmp(m->canonical_key.data, f->key, f->key_len)))
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "guard hash collision: the failure record's canonical key differs");
  else if (!failure_code_allowed(m->code) || strlen(m->message) >= sizeof res->fail_message - 200)
    rc = tcc_error_set(err, TCC_E_DATA_LOSS, "the failure record claims code %d", m->code);
  else if (strcmp(m->compiler_identity, st->identity) != 0)
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "the failure record comes from another compiler ('%.200s')",
                       m->compiler_identity);
  else if (m->ttl_s <= 0 || m->created_unix > now + 300 || now - m->created_unix > m->ttl_s)
    rc = tcc_error_set(err, TCC_E_FAILED_PRECONDITION, "the failure record has expired");
  else if (st->trusted.n > 0) {
    if (m->signature.len == 0) {
      rc = tcc_error_set(err, TCC_E_PERMISSION_DENIED, "the failure record is unsigned and this daemon verifies");
    } else {
      uint8_t d[TCC_SHA256_BYTES];
      failure_digest(f->hash, f->key, f->key_len, m->code, m->target, m->compiler_identity, m->created_unix,
                     m->ttl_s, m->message, d);
      rc = tcc_artifact_verify(&st->trusted, m->key_id, f->hash, d, (const uint8_t *)FAILURE_DOMAIN,
                               strlen(FAILURE_DOMAIN), m->signature.data, m->signature.len, err);
    }
  }
  if (rc == 0) {
    res->failed = 1;
    res->fail_code = m->code;
    snprintf(res->fail_message, sizeof res->fail_message, "%s", m->message);
  }
  tcc__v1__remote_failure__free_unpacked(m, NULL);
  return rc;
}

/* ------------------------------------------------------------ flights */

/* The allowed moves of the drawing; anything else is a bug. */
int tccd_flight_transition_allowed(tccd_flight_state from, tccd_flight_state to) {
  switch (from) {
  case TCCD_FLIGHT_PROBE:
    return to == TCCD_FLIGHT_HIT || to == TCCD_FLIGHT_FAILURE || to == TCCD_FLIGHT_LOCK || to == TCCD_FLIGHT_WAIT ||
           to == TCCD_FLIGHT_COMPILE || to == TCCD_FLIGHT_CANCELLED;
  case TCCD_FLIGHT_LOCK: return to == TCCD_FLIGHT_COMPILE || to == TCCD_FLIGHT_WAIT || to == TCCD_FLIGHT_CANCELLED;
  case TCCD_FLIGHT_WAIT: return to == TCCD_FLIGHT_PROBE || to == TCCD_FLIGHT_COMPILE || to == TCCD_FLIGHT_CANCELLED;
  case TCCD_FLIGHT_HIT: case TCCD_FLIGHT_FAILURE: case TCCD_FLIGHT_COMPILE: case TCCD_FLIGHT_CANCELLED: return 0;
  }
  return 0;
}

static void flight_set_state(tccd_remote_flight *f, tccd_flight_state to) {
  if (!tccd_flight_transition_allowed(f->state, to)) {
    log_error("remote flight %.12s: illegal state change %s -> %s", f->hex, flight_state_names[f->state],
              flight_state_names[to]);
    assert(!"illegal remote flight state change");
  }
  f->state = to;
}

static void flight_unlink(tccd_remote_flight *f) {
  tccd_remote *r = f->r;
  if (f->prev) f->prev->next = f->next;
  else r->flights = f->next;
  if (f->next) f->next->prev = f->prev;
  f->prev = f->next = NULL;
  if (f->op) f->op->flight = NULL; /* its reply will be dropped */
  f->op = NULL;
}

static void flight_free(tccd_remote_flight *f) {
  free(f->key);
  free(f);
}

/* Forgets a flight that never reports (CANCELLED): its done never runs. */
static void flight_cancel(tccd_remote_flight *f) {
  flight_set_state(f, TCCD_FLIGHT_CANCELLED);
  flight_unlink(f);
  flight_free(f);
}

/* Ends a flight in `end` (HIT, FAILURE or COMPILE): the receiver gets res
 * (and owns what it holds). */
static void flight_finish(tccd_remote_flight *f, tccd_flight_state end, tccd_remote_result *res) {
  flight_set_state(f, end);
  flight_unlink(f);
  res->waited = f->waited;
  if (res->locked) memcpy(res->token, f->token, sizeof res->token);
  tccd_remote_done done = f->done;
  void *arg = f->arg;
  flight_free(f);
  done(arg, res);
}

static void flight_compile_here(tccd_remote_flight *f, int locked) {
  tccd_remote_result res;
  memset(&res, 0, sizeof res);
  res.locked = locked;
  flight_finish(f, TCCD_FLIGHT_COMPILE, &res);
}

/* Sends the probe. Returns 0 or -1 (not sent). */
static int flight_send_probe(tccd_remote_flight *f) {
  char k1[REMOTE_KEY_MAX], k2[REMOTE_KEY_MAX], k3[REMOTE_KEY_MAX], k4[REMOTE_KEY_MAX];
  key_name(k1, f->hex, "entry");
  key_name(k2, f->hex, "artifact");
  key_name(k3, f->hex, "lock");
  key_name(k4, f->hex, "failure");
  const char *argv[5] = {"MGET", k1, k2, k3, k4};
  if (f->state != TCCD_FLIGHT_PROBE) flight_set_state(f, TCCD_FLIGHT_PROBE); /* WAIT: the next poll */
  return remote_send(f->r, f, TCC_COUNTER__COUNT, "MGET", k1, 5, argv, NULL);
}

static void flight_probe(tccd_remote_flight *f) {
  if (flight_send_probe(f) != 0) {
    count(f->r, TCC_COUNTER_remote_errors);
    remote_trouble(f->r, "not connected");
    flight_compile_here(f, 0);
  }
}

static void flight_lock(tccd_remote_flight *f) {
  char k[REMOTE_KEY_MAX], px[32];
  key_name(k, f->hex, "lock");
  snprintf(px, sizeof px, "%d", f->r->st->cfg->compile_timeout_ms + REMOTE_LOCK_MARGIN_MS);
  const char *argv[6] = {"SET", k, f->token, "NX", "PX", px};
  flight_set_state(f, TCCD_FLIGHT_LOCK);
  if (remote_send(f->r, f, TCC_COUNTER__COUNT, "SET NX", k, 6, argv, NULL) != 0) {
    count(f->r, TCC_COUNTER_remote_errors);
    flight_compile_here(f, 0);
  }
}

/* Another daemon holds the lock: probe again later (backing off). */
static void flight_wait(tccd_remote_flight *f) {
  uint64_t now = now_ns();
  if (!f->waited) {
    f->waited = 1;
    count(f->r, TCC_COUNTER_remote_lock_waits);
    f->give_up_ns =
        now + (uint64_t)(f->r->st->cfg->compile_timeout_ms + REMOTE_WAIT_MARGIN_MS) * 1000000ull;
    f->poll_ms = REMOTE_POLL_FIRST_MS;
    log_debug("compile %.12s: another daemon is compiling it; waiting", f->hex);
  } else {
    f->poll_ms = f->poll_ms * 2 > REMOTE_POLL_MAX_MS ? REMOTE_POLL_MAX_MS : f->poll_ms * 2;
  }
  flight_set_state(f, TCCD_FLIGHT_WAIT);
  f->next_poll_ns = now + (uint64_t)f->poll_ms * 1000000ull;
  arm_tick(f->r);
}

/* The MGET answer: [entry, artifact, lock, failure]. */
static void flight_on_probe(tccd_remote_flight *f, redisReply *rep) {
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 4) {
    count(f->r, TCC_COUNTER_remote_errors);
    remote_trouble(f->r, "unexpected MGET reply");
    flight_compile_here(f, 0);
    return;
  }
  redisReply *entry = rep->element[0], *art = rep->element[1], *lock = rep->element[2], *fail = rep->element[3];
  if (entry->type == REDIS_REPLY_STRING && art->type == REDIS_REPLY_STRING) {
    tccd_remote_result res;
    memset(&res, 0, sizeof res);
    tcc_error err;
    int rc = entry_decode((const uint8_t *)entry->str, entry->len, &res.entry)
                 ? tcc_error_set(&err, TCC_E_DATA_LOSS, "the entry does not decode")
                 : entry_verify(f, &res.entry, (const uint8_t *)art->str, art->len, &err);
    if (rc == 0 && dup_bytes((const uint8_t *)art->str, art->len, &res.artifact, &res.artifact_len) != 0)
      rc = tcc_error_set(&err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == 0) {
      res.hit = 1;
      flight_finish(f, TCCD_FLIGHT_HIT, &res);
      return;
    }
    tcc_cache_entry_clear(&res.entry);
    count(f->r, TCC_COUNTER_remote_rejected);
    log_warn("redis %s: refused the remote entry for %.12s: %s; compiling it here", f->r->display, f->hex,
             err.msg);
    flight_compile_here(f, 0);
    return;
  }
  if (fail->type == REDIS_REPLY_STRING) { /* the negative cache, cluster-wide */
    tccd_remote_result res;
    memset(&res, 0, sizeof res);
    tcc_error err;
    if (failure_check(f, (const uint8_t *)fail->str, fail->len, &res, &err) == 0) {
      flight_finish(f, TCCD_FLIGHT_FAILURE, &res);
      return;
    }
    count(f->r, TCC_COUNTER_remote_rejected);
    log_warn("redis %s: refused the remote failure record for %.12s: %s; ignoring it", f->r->display, f->hex,
             err.msg);
  }
  if (lock->type == REDIS_REPLY_STRING) flight_wait(f);
  else flight_lock(f);
}

static void flight_on_lock(tccd_remote_flight *f, redisReply *rep) {
  if (rep->type == REDIS_REPLY_STATUS) flight_compile_here(f, 1); /* OK: ours */
  else flight_wait(f);                                              /* nil: taken */
}

static void record_finish(remote_record_get *g, int found, const uint8_t *data, size_t len);
static void record_on_reply(remote_record_get *g, redisReply *rep);
static void evict_on_reply(struct remote_evict *v, redisReply *rep);

static void on_reply(void *privdata, redisReply *rep) {
  remote_op *op = privdata;
  tccd_remote *r = op->r;
  tccd_remote_flight *f = op->flight;
  remote_record_get *g = op->rec;
  struct remote_evict *v = op->evict;
  if (f) f->op = NULL;
  if (g) g->op = NULL;
  if (v) { /* reports its own errors (the operator sees them) */
    free(op);
    evict_on_reply(v, rep);
    return;
  }
  if (!rep || rep->type == REDIS_REPLY_ERROR) {
    if (!r->closing) {
      count(r, TCC_COUNTER_remote_errors);
      remote_trouble(r, "%s failed: %s", op->what, rep ? rep->str : "connection closed");
    }
    free(op);
    if (f) flight_compile_here(f, 0);
    if (g) record_finish(g, -1, NULL, 0);
    return;
  }
  remote_healthy(r);
  if (op->ok_counter != TCC_COUNTER__COUNT) count(r, op->ok_counter);
  free(op);
  if (g) record_on_reply(g, rep);
  if (!f) return;
  if (f->state == TCCD_FLIGHT_LOCK) flight_on_lock(f, rep);
  else flight_on_probe(f, rep); /* PROBE: the only other state with a command in flight */
}

static void evicts_check_timeouts(tccd_remote *r, uint64_t now);

/* Every 10 ms while a flight is waiting: command timeouts and WAIT polls
 * (reconnects and hung connections are the connection layer's). */
static void on_tick(uv_timer_t *t) {
  tccd_remote *r = t->data;
  uint64_t now = now_ns();
  for (tccd_remote_flight *f = r->flights, *next; f; f = next) {
    next = f->next;
    if (f->op && now >= f->op_deadline_ns) {
      count(r, TCC_COUNTER_remote_errors);
      remote_trouble(r, "%s for %.12s timed out after %d ms", f->op->what, f->hex, r->st->cfg->redis_timeout_ms);
      flight_compile_here(f, 0);
    } else if (f->state == TCCD_FLIGHT_WAIT) { /* no command in flight */
      if (now >= f->give_up_ns) {
        log_warn("compile %.12s: waited %d ms for another daemon's compile; compiling it here", f->hex,
                 r->st->cfg->compile_timeout_ms + REMOTE_WAIT_MARGIN_MS);
        flight_compile_here(f, 0);
      } else if (now >= f->next_poll_ns) {
        flight_probe(f);
      }
    }
  }
  for (remote_record_get *g = r->records, *next; g; g = next) {
    next = g->next;
    if (now >= g->deadline_ns) {
      count(r, TCC_COUNTER_remote_errors);
      remote_trouble(r, "record get %s/%s timed out after %d ms", g->kind, g->tag, r->st->cfg->redis_timeout_ms);
      record_finish(g, -1, NULL, 0);
    }
  }
  evicts_check_timeouts(r, now);
  if (!r->flights && !r->records && !r->evicts) uv_timer_stop(t);
}

/* ------------------------------------------------------------ API */

int tccd_remote_init(tccd_state *st, tcc_error *err) {
  if (!st->cfg->redis[0]) return 0;
  tccd_remote *r = calloc(1, sizeof *r);
  if (!r) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  r->st = st;
  tccd_redis_events ev = {.arg = r, .trouble = on_layer_trouble, .healthy = on_layer_healthy};
  r->display = "";
  int rc = tccd_redis_open(st->loop, st->cfg->redis, st->cfg->redis_timeout_ms, &ev, &r->rc, err);
  if (rc) {
    free(r);
    return rc;
  }
  r->display = tccd_redis_display(r->rc);
  uv_timer_init(st->loop, &r->tick);
  r->tick.data = r;
  st->remote = r;
  return 0;
}

static void on_tick_closed(uv_handle_t *h) { free(h->data); }

void tccd_remote_close(tccd_state *st) {
  tccd_remote *r = st->remote;
  if (!r) return;
  st->remote = NULL;
  while (r->flights) flight_compile_here(r->flights, 0); /* compile.c cancelled them already */
  while (r->records) record_finish(r->records, -1, NULL, 0);
  evicts_abort(r);
  r->closing = 1;
  tccd_redis_stats rs;
  tccd_redis_info(r->rc, &rs);
  if (rs.cluster)
    log_info("redis %s: a cluster of %d known node(s), %d connected; %lld MOVED and %lld ASK redirection(s) followed",
             r->display, rs.nodes, rs.connected_nodes, (long long)rs.moved, (long long)rs.ask);
  tccd_redis_close(r->rc); /* never waits on a hung Redis; pending replies come back NULL */
  r->rc = NULL;
  r->display = "";
  uv_timer_stop(&r->tick);
  uv_close((uv_handle_t *)&r->tick, on_tick_closed);
}

tccd_remote_flight *tccd_remote_begin(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES],
                                      const uint8_t *key, size_t key_len, tccd_remote_done done, void *arg) {
  tccd_remote *r = st->remote;
  if (!r || r->closing || !tccd_redis_usable(r->rc)) {
    if (r && !r->closing) count(r, TCC_COUNTER_remote_errors);
    return NULL;
  }
  tccd_remote_flight *f = calloc(1, sizeof *f);
  if (!f || (key_len && !(f->key = malloc(key_len)))) {
    free(f);
    return NULL;
  }
  f->r = r;
  f->state = TCCD_FLIGHT_PROBE; /* a new flight's first state */
  memcpy(f->hash, hash, TCC_SHA256_BYTES);
  tcc_hex_encode(hash, TCC_SHA256_BYTES, f->hex);
  if (key_len) memcpy(f->key, key, key_len);
  f->key_len = key_len;
  f->done = done;
  f->arg = arg;
  uint8_t tok[16];
  randombytes_buf(tok, sizeof tok);
  tcc_hex_encode(tok, sizeof tok, f->token);
  f->next = r->flights;
  if (r->flights) r->flights->prev = f;
  r->flights = f;
  if (flight_send_probe(f) != 0) { /* done is never called from here */
    count(r, TCC_COUNTER_remote_errors);
    flight_cancel(f);
    return NULL;
  }
  return f;
}

void tccd_remote_cancel(tccd_remote_flight *f) {
  if (f) flight_cancel(f);
}

void tccd_remote_publish(tccd_state *st, const tcc_cache_entry *e, const uint8_t *artifact, size_t len,
                         const char *token) {
  tccd_remote *r = st->remote;
  if (!r) return;
  size_t elen;
  uint8_t *enc = entry_encode(e, &elen);
  if (!enc) return;
  char hex[TCC_SHA256_HEX], k1[REMOTE_KEY_MAX], k2[REMOTE_KEY_MAX], k3[REMOTE_KEY_MAX], ttl[32];
  tcc_hex_encode(e->hash, TCC_SHA256_BYTES, hex);
  key_name(k1, hex, "entry");
  key_name(k2, hex, "artifact");
  key_name(k3, hex, "lock");
  snprintf(ttl, sizeof ttl, "%lld", (long long)st->cfg->redis_ttl_s * 1000);
  const char *tok = token ? token : "";
  const char *argv[10] = {"EVAL", PUBLISH_SCRIPT, "3", k1, k2, k3, (const char *)enc,
                          (const char *)(artifact ? artifact : (const uint8_t *)""), ttl, tok};
  size_t lens[10] = {4, strlen(PUBLISH_SCRIPT), 1, strlen(k1), strlen(k2), strlen(k3), elen, len,
                     strlen(ttl), strlen(tok)};
  if (remote_send(r, NULL, TCC_COUNTER_remote_stores, "publish", k1, 10, argv, lens) != 0) {
    count(r, TCC_COUNTER_remote_errors);
    remote_trouble(r, "not connected; %.12s not written through", hex);
  }
  free(enc);
}

void tccd_remote_release(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const char *token) {
  tccd_remote *r = st->remote;
  if (!r || !token || !*token) return;
  char hex[TCC_SHA256_HEX], k[REMOTE_KEY_MAX];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  key_name(k, hex, "lock");
  const char *argv[5] = {"EVAL", RELEASE_SCRIPT, "1", k, token};
  if (remote_send(r, NULL, TCC_COUNTER__COUNT, "release", k, 5, argv, NULL) != 0)
    count(r, TCC_COUNTER_remote_errors); /* the lock expires by itself */
}

void tccd_remote_touch(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES]) {
  tccd_remote *r = st->remote;
  if (!r) return;
  char hex[TCC_SHA256_HEX], k[REMOTE_KEY_MAX], ttl[32];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  snprintf(ttl, sizeof ttl, "%lld", (long long)st->cfg->redis_ttl_s * 1000);
  static const char *const parts[] = {"entry", "artifact"};
  for (int i = 0; i < 2; i++) {
    key_name(k, hex, parts[i]);
    const char *argv[3] = {"PEXPIRE", k, ttl};
    if (remote_send(r, NULL, TCC_COUNTER__COUNT, "PEXPIRE", k, 3, argv, NULL) != 0) return;
  }
}

void tccd_remote_info(const tccd_state *st, int *enabled, int *connected, const char **address) {
  const tccd_remote *r = st->remote;
  *enabled = r != NULL;
  *connected = r && tccd_redis_connected(r->rc);
  *address = r ? r->display : "";
}

void tccd_remote_publish_failure(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], const uint8_t *key,
                                 size_t key_len, const char *target, int code, const char *message,
                                 const char *token) {
  tccd_remote *r = st->remote;
  if (!r || !failure_code_allowed(code)) return;
  Tcc__V1__RemoteFailure m = TCC__V1__REMOTE_FAILURE__INIT;
  uint8_t sig[TCC_SIGNATURE_BYTES];
  m.format = 2;
  m.guard_hash.data = (uint8_t *)hash;
  m.guard_hash.len = TCC_SHA256_BYTES;
  m.canonical_key.data = (uint8_t *)key;
  m.canonical_key.len = key_len;
  m.target = (char *)target;
  m.code = code;
  m.message = (char *)message;
  m.created_unix = (int64_t)time(NULL);
  m.compiler_identity = st->identity;
  m.ttl_s = st->cfg->failure_ttl_s < st->cfg->redis_ttl_s ? st->cfg->failure_ttl_s : st->cfg->redis_ttl_s;
  if (st->signing_key) {
    uint8_t d[TCC_SHA256_BYTES];
    failure_digest(hash, key, key_len, code, target, m.compiler_identity, m.created_unix, m.ttl_s, message, d);
    tcc_artifact_sign(st->signing_key, hash, d, (const uint8_t *)FAILURE_DOMAIN, strlen(FAILURE_DOMAIN), sig);
    m.signature.data = sig;
    m.signature.len = sizeof sig;
    m.key_id = st->signing_key->key_id;
  }
  size_t len = tcc__v1__remote_failure__get_packed_size(&m);
  uint8_t *enc = malloc(len ? len : 1);
  if (!enc) return;
  tcc__v1__remote_failure__pack(&m, enc);
  char hex[TCC_SHA256_HEX], k1[REMOTE_KEY_MAX], k2[REMOTE_KEY_MAX], ttl[32];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  key_name(k1, hex, "failure");
  key_name(k2, hex, "lock");
  snprintf(ttl, sizeof ttl, "%lld", (long long)m.ttl_s * 1000);
  const char *tok = token ? token : "";
  const char *argv[7] = {"EVAL", FAILURE_SCRIPT, "2", k1, k2, (const char *)enc, ttl};
  const char *argv_tok[8] = {argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], tok};
  size_t lens[8] = {4, strlen(FAILURE_SCRIPT), 1, strlen(k1), strlen(k2), len, strlen(ttl), strlen(tok)};
  if (remote_send(r, NULL, TCC_COUNTER__COUNT, "publish failure", k1, 8, argv_tok, lens) != 0) {
    count(r, TCC_COUNTER_remote_errors);
    remote_trouble(r, "not connected; the failure of %.12s not shared", hex);
  }
  free(enc);
}

/* ------------------------------------------------------------ records */

int tccd_name_ok(const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > max) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.' ||
          c == '-'))
      return 0;
  }
  return 1;
}

static void record_key(char out[REMOTE_KEY_MAX], const char *kind, const char *tag) {
  snprintf(out, REMOTE_KEY_MAX, "tccd:{%s}:rec:%s", tag, kind);
}

/* What a record's signature binds: the "guard hash" slot of tcc_sign's
 * layout is SHA-256("tccd-record-v1\0" kind "\0" tag), the digest that of
 * the blob, the manifest RECORD_DOMAIN. */
static void record_name_digest(const char *kind, const char *tag, uint8_t out[TCC_SHA256_BYTES]) {
  tcc_sha256_ctx ctx;
  tcc_sha256_init(&ctx);
  tcc_sha256_update(&ctx, RECORD_DOMAIN, sizeof RECORD_DOMAIN);
  tcc_sha256_update(&ctx, kind, strlen(kind) + 1);
  tcc_sha256_update(&ctx, tag, strlen(tag));
  tcc_sha256_final(&ctx, out);
}

int tccd_remote_record_put(tccd_state *st, const char *kind, const char *tag, const uint8_t *data, size_t len,
                           int keep_existing) {
  tccd_remote *r = st->remote;
  if (!tccd_name_ok(kind, REMOTE_NAME_MAX) || !tccd_name_ok(tag, REMOTE_NAME_MAX)) return TCC_E_INVALID_ARGUMENT;
  if (!r || r->closing) return -1;
  /* the envelope: "TCR1", signed (0/1), key id (16), signature (64), blob */
  uint8_t *env = calloc(1, RECORD_HEAD + len);
  if (!env) return -1;
  memcpy(env, RECORD_MAGIC, 4);
  if (st->signing_key) {
    uint8_t name[TCC_SHA256_BYTES], d[TCC_SHA256_BYTES];
    record_name_digest(kind, tag, name);
    tcc_sha256(data ? data : (const uint8_t *)"", len, d);
    env[4] = 1;
    memcpy(env + 5, st->signing_key->key_id, 16);
    tcc_artifact_sign(st->signing_key, name, d, (const uint8_t *)RECORD_DOMAIN, strlen(RECORD_DOMAIN), env + 21);
  }
  if (len) memcpy(env + RECORD_HEAD, data, len);
  char k[REMOTE_KEY_MAX], ttl[32];
  record_key(k, kind, tag);
  snprintf(ttl, sizeof ttl, "%lld", (long long)st->cfg->redis_ttl_s * 1000);
  const char *argv[6] = {"SET", k, (const char *)env, "PX", ttl, "NX"};
  size_t lens[6] = {3, strlen(k), RECORD_HEAD + len, 2, strlen(ttl), 2};
  int rc = remote_send(r, NULL, TCC_COUNTER__COUNT, "record put", k, keep_existing ? 6 : 5, argv, lens);
  free(env);
  if (rc != 0) count(r, TCC_COUNTER_remote_errors);
  return rc;
}

static void record_unlink(remote_record_get *g) {
  tccd_remote *r = g->r;
  if (g->prev) g->prev->next = g->next;
  else r->records = g->next;
  if (g->next) g->next->prev = g->prev;
  if (g->op) g->op->rec = NULL;
  g->op = NULL;
}

static void record_finish(remote_record_get *g, int found, const uint8_t *data, size_t len) {
  record_unlink(g);
  tccd_remote_record_done done = g->done;
  void *arg = g->arg;
  free(g);
  done(arg, found, data, len);
}

/* A GET's answer: nil (absent) or an envelope to check. */
static void record_on_reply(remote_record_get *g, redisReply *rep) {
  tccd_remote *r = g->r;
  if (rep->type == REDIS_REPLY_NIL) {
    record_finish(g, 0, NULL, 0);
    return;
  }
  const uint8_t *env = (const uint8_t *)rep->str;
  size_t n = rep->type == REDIS_REPLY_STRING ? rep->len : 0;
  const char *why = NULL;
  tcc_error err;
  if (n < RECORD_HEAD || memcmp(env, RECORD_MAGIC, 4) != 0 || env[4] > 1) {
    why = "not a tccd record";
  } else if (r->st->trusted.n > 0) {
    if (env[4] != 1) {
      why = "the record is unsigned and this daemon verifies";
    } else {
      char key_id[TCC_SIGN_KEY_ID_HEX];
      memcpy(key_id, env + 5, 16);
      key_id[16] = '\0';
      uint8_t name[TCC_SHA256_BYTES], d[TCC_SHA256_BYTES];
      record_name_digest(g->kind, g->tag, name);
      tcc_sha256(env + RECORD_HEAD, n - RECORD_HEAD, d);
      if (tcc_artifact_verify(&r->st->trusted, key_id, name, d, (const uint8_t *)RECORD_DOMAIN,
                              strlen(RECORD_DOMAIN), env + 21, TCC_SIGNATURE_BYTES, &err) != 0)
        why = err.msg;
    }
  }
  if (why) {
    count(r, TCC_COUNTER_remote_rejected);
    log_warn("redis %s: refused the record %s/%s: %s", r->display, g->kind, g->tag, why);
    record_finish(g, -1, NULL, 0);
    return;
  }
  record_finish(g, 1, env + RECORD_HEAD, n - RECORD_HEAD);
}

int tccd_remote_record_get(tccd_state *st, const char *kind, const char *tag, tccd_remote_record_done done,
                           void *arg) {
  tccd_remote *r = st->remote;
  if (!tccd_name_ok(kind, REMOTE_NAME_MAX) || !tccd_name_ok(tag, REMOTE_NAME_MAX)) return TCC_E_INVALID_ARGUMENT;
  if (!r || r->closing) return -1;
  remote_record_get *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->r = r;
  snprintf(g->kind, sizeof g->kind, "%s", kind);
  snprintf(g->tag, sizeof g->tag, "%s", tag);
  g->done = done;
  g->arg = arg;
  char k[REMOTE_KEY_MAX];
  record_key(k, kind, tag);
  const char *argv[2] = {"GET", k};
  if (remote_send(r, NULL, TCC_COUNTER__COUNT, "record get", k, 2, argv, NULL) != 0) {
    count(r, TCC_COUNTER_remote_errors);
    free(g);
    return -1;
  }
  g->op = r->last_op; /* the op remote_send just made (its reply is async) */
  g->op->rec = g;
  g->deadline_ns = now_ns() + (uint64_t)st->cfg->redis_timeout_ms * 1000000ull;
  g->next = r->records;
  if (r->records) r->records->prev = g;
  r->records = g;
  arm_tick(r);
  return 0;
}

/* ------------------------------------------------------------ evict */

/* A tccd_remote_evict in progress. */
typedef struct remote_evict {
  tccd_remote *r;
  char hex[TCC_SHA256_HEX];
  tccd_remote_evict_done done;
  void *arg;
  uint64_t deadline_ns;
  remote_op *op;
  struct remote_evict *prev, *next;
} remote_evict;

/* Unlinks v, frees it and hands res to its owner. */
static void evict_finish(remote_evict *v, const tccd_remote_evict_result *res) {
  tccd_remote *r = v->r;
  if (v->prev) v->prev->next = v->next;
  else r->evicts = v->next;
  if (v->next) v->next->prev = v->prev;
  if (v->op) v->op->evict = NULL; /* its reply (if any) is dropped */
  tccd_remote_evict_done done = v->done;
  void *arg = v->arg;
  free(v);
  done(arg, res);
}

/* Ends v with an error (counted in remote_errors). */
static void evict_fail(remote_evict *v, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void evict_fail(remote_evict *v, int code, const char *fmt, ...) {
  tccd_remote_evict_result res;
  memset(&res, 0, sizeof res);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res.message, sizeof res.message, fmt, ap);
  va_end(ap);
  res.error = code;
  if (!v->r->closing) count(v->r, TCC_COUNTER_remote_errors);
  log_warn("evict %.12s: %s", v->hex, res.message);
  evict_finish(v, &res);
}

/* The script's answer: [entry, artifact, failure], 1 for each deleted. */
static void evict_on_reply(remote_evict *v, redisReply *rep) {
  v->op = NULL;
  tccd_remote *r = v->r;
  if (!rep) {
    evict_fail(v, TCC_E_UNAVAILABLE, "redis %s: the connection closed before it answered", r->display);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    evict_fail(v, TCC_E_UNAVAILABLE, "redis %s answered: %.300s", r->display, rep->str);
    return;
  }
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
    evict_fail(v, TCC_E_INTERNAL, "redis %s: unexpected answer to the delete (type %d)", r->display, rep->type);
    return;
  }
  remote_healthy(r);
  tccd_remote_evict_result res;
  memset(&res, 0, sizeof res);
  int *got[3] = {&res.entry, &res.artifact, &res.failure};
  for (int i = 0; i < 3; i++)
    *got[i] = rep->element[i]->type == REDIS_REPLY_INTEGER && rep->element[i]->integer > 0;
  evict_finish(v, &res);
}

static void evicts_check_timeouts(tccd_remote *r, uint64_t now) {
  for (remote_evict *v = r->evicts, *next; v; v = next) {
    next = v->next;
    if (now >= v->deadline_ns)
      evict_fail(v, TCC_E_DEADLINE_EXCEEDED, "redis %s: no answer within %d ms (--redis-timeout-ms)", r->display,
                 r->st->cfg->redis_timeout_ms);
  }
}

static void evicts_abort(tccd_remote *r) {
  while (r->evicts) evict_fail(r->evicts, TCC_E_UNAVAILABLE, "the daemon is shutting down");
}

int tccd_remote_evict(tccd_state *st, const uint8_t hash[TCC_SHA256_BYTES], tccd_remote_evict_done done, void *arg,
                      tcc_error *err) {
  tccd_remote *r = st->remote;
  if (!r || r->closing) return -1;
  char hex[TCC_SHA256_HEX], k1[REMOTE_KEY_MAX], k2[REMOTE_KEY_MAX], k3[REMOTE_KEY_MAX];
  tcc_hex_encode(hash, TCC_SHA256_BYTES, hex);
  key_name(k1, hex, "entry");
  key_name(k2, hex, "artifact");
  key_name(k3, hex, "failure");
  remote_evict *v = calloc(1, sizeof *v);
  if (!v) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  const char *argv[6] = {"EVAL", EVICT_SCRIPT, "3", k1, k2, k3};
  if (remote_send(r, NULL, TCC_COUNTER__COUNT, "evict", k1, 6, argv, NULL) != 0) {
    free(v);
    count(r, TCC_COUNTER_remote_errors);
    return tcc_error_set(err, TCC_E_UNAVAILABLE, "redis %s: not connected to the node holding this hash",
                         r->display);
  }
  v->r = r;
  memcpy(v->hex, hex, sizeof hex);
  v->done = done;
  v->arg = arg;
  v->op = r->last_op; /* the op remote_send just made (its reply is async) */
  v->op->evict = v;
  v->deadline_ns = now_ns() + (uint64_t)st->cfg->redis_timeout_ms * 1000000ull;
  v->next = r->evicts;
  if (r->evicts) r->evicts->prev = v;
  r->evicts = v;
  arm_tick(r);
  return 0;
}
