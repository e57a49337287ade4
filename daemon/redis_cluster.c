/*
 * redis_cluster.c — the Redis connection layer under remote.c: one Redis
 * server, or a Redis Cluster, behind one call (tccd_redis_command) that
 * routes a command by its key. Debian's hiredis (0.14) has no cluster
 * support, and no C cluster client is packaged, so the routing is here:
 * one hiredis async context per node, all on the daemon's libuv loop.
 *
 * DESIGN
 *
 * Nodes: the seeds of --redis (comma-separated URLs; credentials and DB
 * from the first that names them) and every master the slot map names.
 * Each node's connection is one state machine (node_set_state asserts
 * every move):
 *
 *                  new node, or reconnect due (100 ms doubling to 5 s)
 *   DOWN ─────────────────────────────────────────────────► CONNECTING
 *     ▲  ▲                (node_connect)                     │  │
 *     │  │ connect failed, or no connect within              │  │ connect OK
 *     │  └──── --redis-timeout-ms (on_connect, on_tick) ─────┘  │ (on_connect)
 *     │                                                         ▼
 *     └── error, EOF, or commands unanswered for ────────── CONNECTED
 *         max(5 s, 5 × timeout) (on_disconnect, on_tick)
 *
 *   DOWN, CONNECTING, CONNECTED ── tccd_redis_close ──► CLOSED
 *
 *   DOWN        no context; the timer reconnects at reconnect_at_ns (a
 *               connect that fails at once stays DOWN). A command for it
 *               fails at once (an error reply, never a wait)
 *   CONNECTING  a hiredis context exists, the connect is not confirmed;
 *               commands are queued on it (AUTH, SELECT and CLUSTER SLOTS
 *               first) and sent once connected
 *   CONNECTED   the connect succeeded: commands go out
 *   CLOSED      the layer is closing; never reconnected
 *
 * Mode, found by asking: the first connection sends CLUSTER SLOTS before
 * anything else. "cluster support disabled" makes the layer SINGLE (every
 * command to the first seed, exactly the old one-node behaviour); a slot
 * table makes it CLUSTER. Until the answer comes (UNKNOWN) commands go to
 * the first seed, and a MOVED answer is followed anyway.
 *
 * Routing (CLUSTER): slot = CRC16-XMODEM(hash tag of the key) mod 16384,
 * as the Redis Cluster spec; the slot map (16384 node indexes, from
 * CLUSTER SLOTS) names the master. Replies are handled here before the
 * caller sees them:
 *
 *   MOVED slot host:port  the map is updated for that slot, the command
 *                         resent there, and a full map refresh scheduled
 *   ASK slot host:port    ASKING + the command on that node, once; the map
 *                         is not changed (a slot being migrated)
 *   TRYAGAIN              (a multi-key command during a migration, some
 *                         keys moved): an MGET is split into single GETs
 *                         (each follows its own ASK) and their answers
 *                         put together as one array; anything else is
 *                         resent after 20 ms, 40 ms, ... (5 tries)
 *   CLUSTERDOWN, others   handed to the caller (it compiles locally)
 *
 * At most 5 redirections per command. The map is refreshed (CLUSTER SLOTS
 * on a connected node) after a MOVED, a lost connection or a failed
 * refresh, with backoff (100 ms doubling to 5 s, reset by a good map).
 *
 * Multi-key commands (MGET, the publish and release scripts of remote.c)
 * must name keys of one slot; remote.c's keys share the hash tag
 * {<guard hash>}, so they do. The routing key is passed explicitly.
 *
 * The caller's callback runs exactly once for every command accepted
 * (tccd_redis_command returned 0): with the reply, with an error reply
 * made here ("tccd: ..."), or with NULL when the layer is closed.
 */
#include <assert.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

#define RC_SLOTS 16384
#define RC_MAX_NODES 128
#define RC_TICK_MS 10
#define RC_RECONNECT_FIRST_MS 100
#define RC_RECONNECT_MAX_MS 5000
#define RC_REFRESH_FIRST_MS 100
#define RC_REFRESH_MAX_MS 5000
#define RC_STALE_REFRESH_MS 1000        /* the map names a master that is down */
#define RC_STUCK_MIN_MS 5000
#define RC_MAX_REDIRECTS 5
#define RC_TRYAGAIN_TRIES 5
#define RC_TRYAGAIN_FIRST_MS 20

typedef enum rc_mode { RC_UNKNOWN, RC_SINGLE, RC_CLUSTER } rc_mode;

typedef struct rc_node {
  tccd_redis *rc;
  char host[256];
  int port;
  char addr[300];                 /* host:port, for logs */
  tccd_redis_node_state state;    /* see the drawing above */
  redisAsyncContext *ac;          /* CONNECTING and CONNECTED only, else NULL */
  uint64_t connect_started_ns;
  uint64_t reconnect_at_ns;
  unsigned reconnect_ms;
  int64_t pending;                /* commands without a reply yet */
  uint64_t waiting_since_ns;
} rc_node;

/* One command; lives until the caller's callback has run. */
typedef struct rc_req {
  tccd_redis *rc;
  int argc;
  char **argv;                    /* copies (binary-safe), one allocation each */
  size_t *lens;
  int slot;                       /* -1: no key */
  int redirects, tries;
  rc_node *ask;                   /* ASK: send ASKING + it here, once */
  redisAsyncContext *sent_on;
  uint64_t retry_at_ns;           /* TRYAGAIN: in the delayed list */
  struct rc_req *next_delayed;
  tccd_redis_reply_fn fn;
  void *arg;
  int internal;                   /* CLUSTER SLOTS, AUTH ...: no caller */
} rc_req;

/* An MGET split into GETs after TRYAGAIN. */
typedef struct rc_split rc_split;
typedef struct rc_part {
  rc_split *s;
  size_t i;                       /* which key */
} rc_part;
struct rc_split {
  rc_req *parent;
  size_t n, got;
  redisReply **parts;             /* copies of the GET answers */
  rc_part *pa;
  int failed;
  char why[256];
};

struct tccd_redis {
  uv_loop_t *loop;
  tccd_redis_events ev;
  int timeout_ms;
  char user[128], password[256];
  int db;
  char display[1024];             /* seeds as host:port,.../db */
  rc_mode mode;
  rc_node *nodes[RC_MAX_NODES];
  int nnodes;
  int nseeds;
  int16_t slots[RC_SLOTS];        /* node index, -1 unknown */
  int refresh_wanted, refresh_inflight;
  int refresh_recheck;            /* the one wanted is a stale map's recheck */
  uint64_t refresh_at_ns;
  unsigned refresh_ms;
  rc_req *delayed;
  uv_timer_t tick;
  int closing;
  int64_t redirects_moved, redirects_ask; /* for logs and tests */
};

static uint64_t now_ns(void) { return uv_hrtime(); }

/* ------------------------------------------------------------ slots */

/* CRC16-CCITT (XMODEM): poly 0x1021, init 0, as in the cluster spec. */
static uint16_t crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((uint8_t)buf[i] << 8);
    for (int b = 0; b < 8; b++) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

int tccd_redis_slot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len);
  if (open) {
    size_t rest = len - (size_t)(open - key) - 1;
    const char *close = memchr(open + 1, '}', rest);
    if (close && close > open + 1) return crc16(open + 1, (size_t)(close - open - 1)) & (RC_SLOTS - 1);
  }
  return crc16(key, len) & (RC_SLOTS - 1);
}

/* ------------------------------------------------------------ events */

static void trouble(tccd_redis *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trouble(tccd_redis *rc, const char *fmt, ...) {
  if (rc->closing) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rc->ev.trouble(rc->ev.arg, msg);
}

static void arm_tick(tccd_redis *rc);

static void want_refresh(tccd_redis *rc) {
  if (rc->mode == RC_SINGLE) return;
  if (rc->refresh_recheck) { /* news (a MOVED, a lost node): ask now, not at the recheck */
    rc->refresh_recheck = 0;
    rc->refresh_at_ns = now_ns();
  }
  if (rc->refresh_wanted) return;
  rc->refresh_wanted = 1;
  if (rc->refresh_at_ns < now_ns()) rc->refresh_at_ns = now_ns();
  arm_tick(rc);
}

static void refresh_failed(tccd_redis *rc) {
  rc->refresh_ms = rc->refresh_ms ? rc->refresh_ms * 2 : RC_REFRESH_FIRST_MS;
  if (rc->refresh_ms > RC_REFRESH_MAX_MS) rc->refresh_ms = RC_REFRESH_MAX_MS;
  rc->refresh_at_ns = now_ns() + (uint64_t)rc->refresh_ms * 1000000ull;
  rc->refresh_wanted = 0;
  want_refresh(rc);
}

/* ------------------------------------------------------------ replies made here */

static redisReply *reply_new(int type) {
  redisReply *r = calloc(1, sizeof *r);
  if (r) r->type = type;
  return r;
}

static void reply_free(redisReply *r) {
  if (!r) return;
  for (size_t i = 0; i < r->elements; i++) reply_free(r->element[i]);
  free(r->element);
  free(r->str);
  free(r);
}

/* A copy of a string/nil/error reply (enough for GET answers). */
static redisReply *reply_copy_simple(const redisReply *src) {
  redisReply *r = reply_new(src->type);
  if (!r) return NULL;
  r->integer = src->integer;
  if (src->str) {
    r->str = malloc(src->len + 1);
    if (!r->str) {
      free(r);
      return NULL;
    }
    memcpy(r->str, src->str, src->len);
    r->str[src->len] = '\0';
    r->len = src->len;
  }
  return r;
}

/* ------------------------------------------------------------ requests */

static void req_free(rc_req *q) {
  if (!q) return;
  for (int i = 0; i < q->argc; i++) free(q->argv[i]);
  free(q->argv);
  free(q->lens);
  free(q);
}

/* Hands the caller its answer and frees the request. */
static void req_finish(rc_req *q, redisReply *rep) {
  tccd_redis_reply_fn fn = q->fn;
  void *arg = q->arg;
  req_free(q);
  if (fn) fn(arg, rep);
}

static void req_fail(rc_req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void req_fail(rc_req *q, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  redisReply r;
  memset(&r, 0, sizeof r);
  r.type = REDIS_REPLY_ERROR;
  r.str = msg;
  r.len = n < 0 ? 0 : (size_t)n >= sizeof msg ? sizeof msg - 1 : (size_t)n;
  req_finish(q, &r);
}

static rc_req *req_new(tccd_redis *rc, int slot, int argc, const char **argv, const size_t *lens,
                       tccd_redis_reply_fn fn, void *arg) {
  rc_req *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->rc = rc;
  q->slot = slot;
  q->fn = fn;
  q->arg = arg;
  q->argv = calloc((size_t)argc, sizeof *q->argv);
  q->lens = calloc((size_t)argc, sizeof *q->lens);
  if (!q->argv || !q->lens) {
    req_free(q);
    return NULL;
  }
  for (int i = 0; i < argc; i++) {
    size_t n = lens ? lens[i] : strlen(argv[i]);
    q->argv[i] = malloc(n ? n : 1);
    if (!q->argv[i]) {
      req_free(q);
      return NULL;
    }
    q->argc = i + 1;
    memcpy(q->argv[i], argv[i], n);
    q->lens[i] = n;
  }
  return q;
}

/* ------------------------------------------------------------ nodes */

static const char *const node_state_names[] = {
#define NODE_STATE_NAME(name) #name,
    TCCD_REDIS_NODE_STATES(NODE_STATE_NAME)
#undef NODE_STATE_NAME
};

/* The allowed moves of the drawing; anything else is a bug. */
int tccd_redis_node_transition_allowed(tccd_redis_node_state from, tccd_redis_node_state to) {
  switch (from) {
  case TCCD_REDIS_NODE_DOWN: return to == TCCD_REDIS_NODE_CONNECTING || to == TCCD_REDIS_NODE_CLOSED;
  case TCCD_REDIS_NODE_CONNECTING:
    return to == TCCD_REDIS_NODE_CONNECTED || to == TCCD_REDIS_NODE_DOWN || to == TCCD_REDIS_NODE_CLOSED;
  case TCCD_REDIS_NODE_CONNECTED: return to == TCCD_REDIS_NODE_DOWN || to == TCCD_REDIS_NODE_CLOSED;
  case TCCD_REDIS_NODE_CLOSED: return 0;
  }
  return 0;
}

static void node_set_state(rc_node *n, tccd_redis_node_state to) {
  if (!tccd_redis_node_transition_allowed(n->state, to)) {
    log_error("redis %s: illegal node state change %s -> %s", n->addr, node_state_names[n->state],
              node_state_names[to]);
    assert(!"illegal redis node state change");
  }
  n->state = to;
}

/* 1 while the node has a connection, made or being made. */
static int node_open(const rc_node *n) {
  return n->state == TCCD_REDIS_NODE_CONNECTING || n->state == TCCD_REDIS_NODE_CONNECTED;
}

static void node_connect(rc_node *n);

static rc_node *node_find(tccd_redis *rc, const char *host, int port) {
  for (int i = 0; i < rc->nnodes; i++)
    if (rc->nodes[i]->port == port && strcmp(rc->nodes[i]->host, host) == 0) return rc->nodes[i];
  return NULL;
}

static int node_index(const tccd_redis *rc, const rc_node *n) {
  for (int i = 0; i < rc->nnodes; i++)
    if (rc->nodes[i] == n) return i;
  return -1;
}

/* Finds or adds a node; new ones start connecting. NULL when the table
 * is full or out of memory. */
static rc_node *node_get(tccd_redis *rc, const char *host, int port) {
  rc_node *n = node_find(rc, host, port);
  if (n || rc->nnodes >= RC_MAX_NODES || strlen(host) >= sizeof n->host) return n;
  n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->rc = rc;
  n->state = TCCD_REDIS_NODE_DOWN; /* a new node's first state */
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  snprintf(n->addr, sizeof n->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
  rc->nodes[rc->nnodes++] = n;
  if (!rc->closing) node_connect(n);
  return n;
}

static void node_schedule_reconnect(rc_node *n) {
  n->reconnect_ms = n->reconnect_ms ? n->reconnect_ms * 2 : RC_RECONNECT_FIRST_MS;
  if (n->reconnect_ms > RC_RECONNECT_MAX_MS) n->reconnect_ms = RC_RECONNECT_MAX_MS;
  n->reconnect_at_ns = now_ns() + (uint64_t)n->reconnect_ms * 1000000ull;
  arm_tick(n->rc);
}

/* Drops a node's connection now, leaving it in `to` (DOWN: reconnected
 * later; CLOSED: the layer is closing): pending commands get NULL
 * replies. */
static void node_drop(rc_node *n, tccd_redis_node_state to) {
  redisAsyncContext *ac = n->ac;
  n->ac = NULL;
  node_set_state(n, to);
  n->pending = 0;
  if (ac) redisAsyncFree(ac);
}

/* hiredis's own adapters/libuv.h, with one fix: libuv reports a socket
 * error (POLLERR: a reset, a refused connect) as a poll status < 0 and
 * stops the handle, and the shipped adapter ignores that status, so
 * hiredis never learns the connection is gone (a killed Redis then hangs
 * every command until its timeout, and a refused connect forever). Here
 * an error status is handed to hiredis as a read, which finds the error
 * and disconnects. */
typedef struct rc_events {
  redisAsyncContext *ac;
  uv_poll_t handle;
  int events;
} rc_events;

static void ev_poll(uv_poll_t *h, int status, int events) {
  rc_events *p = h->data;
  if (!p->ac) return;
  if (status < 0) {
    redisAsyncHandleRead(p->ac); /* reads the error, disconnects */
    return;
  }
  if (events & UV_READABLE) redisAsyncHandleRead(p->ac);
  if (p->ac && (events & UV_WRITABLE)) redisAsyncHandleWrite(p->ac);
}

static void ev_update(rc_events *p, int add, int ev) {
  p->events = add ? p->events | ev : p->events & ~ev;
  if (p->events) uv_poll_start(&p->handle, p->events, ev_poll);
  else uv_poll_stop(&p->handle);
}

static void ev_add_read(void *d) { ev_update(d, 1, UV_READABLE); }
static void ev_del_read(void *d) { ev_update(d, 0, UV_READABLE); }
static void ev_add_write(void *d) { ev_update(d, 1, UV_WRITABLE); }
static void ev_del_write(void *d) { ev_update(d, 0, UV_WRITABLE); }

static void ev_closed(uv_handle_t *h) { free(h->data); }

static void ev_cleanup(void *d) {
  rc_events *p = d;
  p->ac = NULL; /* the context is being freed */
  uv_close((uv_handle_t *)&p->handle, ev_closed);
}

/* Attaches a context to the loop. Returns 0 or -1. */
static int ev_attach(redisAsyncContext *ac, uv_loop_t *loop) {
  if (ac->ev.data) return -1;
  rc_events *p = calloc(1, sizeof *p);
  if (!p) return -1;
  if (uv_poll_init(loop, &p->handle, ac->c.fd) != 0) {
    free(p);
    return -1;
  }
  p->ac = ac;
  p->handle.data = p;
  ac->ev.data = p;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  return 0;
}

static void on_connect(const redisAsyncContext *ac, int status) {
  rc_node *n = ac->data;
  if (n->ac != ac) return;
  if (status != REDIS_OK) { /* hiredis frees the context after this */
    n->ac = NULL;
    node_set_state(n, TCCD_REDIS_NODE_DOWN);
    n->pending = 0;
    trouble(n->rc, "cannot connect to %s: %s", n->addr, ac->errstr[0] ? ac->errstr : "error");
    node_schedule_reconnect(n);
    want_refresh(n->rc);
    return;
  }
  node_set_state(n, TCCD_REDIS_NODE_CONNECTED);
  n->reconnect_ms = 0;
  log_info("redis %s: connected", n->addr);
  n->rc->ev.healthy(n->rc->ev.arg);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  rc_node *n = ac->data;
  if (n->ac != ac) return; /* an old context, dropped already */
  n->ac = NULL;
  node_set_state(n, TCCD_REDIS_NODE_DOWN);
  n->pending = 0;
  if (n->rc->closing) return;
  if (status != REDIS_OK) trouble(n->rc, "connection to %s lost: %s", n->addr, ac->errstr[0] ? ac->errstr : "closed");
  node_schedule_reconnect(n);
  want_refresh(n->rc);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);
static int send_on(rc_node *n, rc_req *q);

/* The answer to AUTH / SELECT: only errors matter. */
static void on_setup_reply(void *arg, redisReply *rep) {
  rc_node *n = arg;
  if (rep && rep->type == REDIS_REPLY_ERROR) trouble(n->rc, "%s: %s", n->addr, rep->str);
}

static void on_slots_reply(void *arg, redisReply *rep);

static void send_internal(rc_node *n, int argc, const char **argv, tccd_redis_reply_fn fn, void *arg) {
  rc_req *q = req_new(n->rc, -1, argc, argv, NULL, fn, arg);
  if (!q) return;
  q->internal = 1;
  if (send_on(n, q) != 0) req_free(q);
}

/* Asks n for the slot map (one refresh at a time). */
static void refresh_from(rc_node *n) {
  tccd_redis *rc = n->rc;
  rc->refresh_inflight = 1;
  rc->refresh_wanted = 0;
  rc->refresh_recheck = 0;
  const char *argv[2] = {"CLUSTER", "SLOTS"};
  rc_req *q = req_new(rc, -1, 2, argv, NULL, on_slots_reply, n);
  if (!q || send_on(n, q) != 0) {
    req_free(q);
    rc->refresh_inflight = 0;
    refresh_failed(rc);
    return;
  }
  q->internal = 1;
}

static void node_connect(rc_node *n) {
  tccd_redis *rc = n->rc;
  log_debug("redis %s: connecting", n->addr);
  redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);
  if (!ac || ac->err) {
    trouble(rc, "cannot connect to %s: %s", n->addr, ac ? ac->errstr : "out of memory");
    if (ac) redisAsyncFree(ac);
    node_schedule_reconnect(n);
    return;
  }
  ac->data = n;
  if (ev_attach(ac, rc->loop) != 0) {
    trouble(rc, "cannot attach %s to the event loop", n->addr);
    redisAsyncFree(ac);
    node_schedule_reconnect(n);
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  n->ac = ac;
  node_set_state(n, TCCD_REDIS_NODE_CONNECTING);
  n->connect_started_ns = now_ns();
  n->pending = 0;
  /* queued before anything else, sent once connected */
  if (rc->password[0]) {
    const char *argv[3] = {"AUTH", rc->user, rc->password};
    if (rc->user[0]) send_internal(n, 3, argv, on_setup_reply, n);
    else {
      argv[1] = rc->password;
      send_internal(n, 2, argv, on_setup_reply, n);
    }
  }
  if (rc->db) {
    char db[16];
    snprintf(db, sizeof db, "%d", rc->db);
    const char *argv[2] = {"SELECT", db};
    send_internal(n, 2, argv, on_setup_reply, n);
  }
  if (rc->mode == RC_UNKNOWN && !rc->refresh_inflight) refresh_from(n);
  arm_tick(rc);
}

/* ------------------------------------------------------------ the slot map */

/* A map that still names a master that is down (dead, and its replica
 * not promoted yet) is asked for again in RC_STALE_REFRESH_MS, so a
 * failover is followed within about a second of the promotion (its
 * reconnects alone, backing off to 5 s, would notice later). */
static void map_recheck_if_stale(tccd_redis *rc) {
  for (int i = 0; i < RC_SLOTS; i++) {
    int idx = rc->slots[i];
    if (idx >= 0 && !node_open(rc->nodes[idx])) {
      rc->refresh_wanted = 1;
      rc->refresh_recheck = 1;
      rc->refresh_at_ns = now_ns() + (uint64_t)RC_STALE_REFRESH_MS * 1000000ull;
      arm_tick(rc);
      return;
    }
  }
}

/* CLUSTER SLOTS: [[start, end, [host, port, id, ...], replicas...], ...] */
static void on_slots_reply(void *arg, redisReply *rep) {
  rc_node *from = arg;
  tccd_redis *rc = from->rc;
  rc->refresh_inflight = 0;
  if (!rep) { /* the connection went away (or the layer is closing) */
    if (!rc->closing) refresh_failed(rc);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    if (strstr(rep->str, "cluster support disabled")) {
      if (rc->mode != RC_SINGLE) log_info("redis %s: a single server (not a cluster)", from->addr);
      rc->mode = RC_SINGLE;
      rc->refresh_wanted = 0;
      return;
    }
    log_debug("redis %s: CLUSTER SLOTS failed: %s", from->addr, rep->str);
    refresh_failed(rc);
    return;
  }
  if (rep->type != REDIS_REPLY_ARRAY) {
    refresh_failed(rc);
    return;
  }
  int16_t *map = malloc(sizeof rc->slots);
  if (!map) {
    refresh_failed(rc);
    return;
  }
  rc_mode was = rc->mode;
  rc->mode = RC_CLUSTER; /* before node_get: new nodes need not ask again */
  for (int i = 0; i < RC_SLOTS; i++) map[i] = -1;
  int covered = 0;
  for (size_t i = 0; i < rep->elements; i++) {
    redisReply *e = rep->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
      continue;
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const char *host = e->element[2]->element[0]->str;
    int port = (int)e->element[2]->element[1]->integer;
    if (!host[0] || strcmp(host, "?") == 0) host = from->host; /* "the node you asked" */
    if (lo < 0 || hi >= RC_SLOTS || lo > hi || port < 1 || port > 65535) continue;
    rc_node *n = node_get(rc, host, port);
    if (!n) continue;
    int idx = node_index(rc, n);
    for (long long s = lo; s <= hi; s++) map[s] = (int16_t)idx;
    covered += (int)(hi - lo + 1);
  }
  memcpy(rc->slots, map, sizeof rc->slots);
  free(map);
  if (was != RC_CLUSTER) log_info("redis %s: a cluster; slot map loaded (%d of %d slots)", from->addr, covered, RC_SLOTS);
  else log_debug("redis: slot map refreshed from %s (%d slots covered)", from->addr, covered);
  rc->refresh_ms = 0;
  map_recheck_if_stale(rc);
}

/* ------------------------------------------------------------ routing */

/* Sends q on node n (ASKING first when q->ask is n). Returns 0 or -1
 * (the node is down: nothing sent, q untouched). */
static int send_on(rc_node *n, rc_req *q) {
  if (!n->ac || n->rc->closing) return -1;
  if (q->ask == n && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK) return -1;
  if (redisAsyncCommandArgv(n->ac, on_reply, q, q->argc, (const char **)q->argv, q->lens) != REDIS_OK)
    return -1;
  q->sent_on = n->ac;
  if (n->pending++ == 0) n->waiting_since_ns = now_ns();
  arm_tick(n->rc);
  return 0;
}

/* The node a command for `slot` goes to. */
static rc_node *route(tccd_redis *rc, int slot) {
  if (rc->mode == RC_CLUSTER && slot >= 0 && rc->slots[slot] >= 0) return rc->nodes[rc->slots[slot]];
  if (rc->mode != RC_SINGLE) { /* no owner known: any live node (a cluster redirects us) */
    for (int i = 0; i < rc->nnodes; i++)
      if (node_open(rc->nodes[i])) return rc->nodes[i];
  }
  return rc->nodes[0];
}

/* Sends (or resends) a request. Returns 0, or -1 when its node is down. */
static int dispatch(rc_req *q) {
  rc_node *n = q->ask ? q->ask : route(q->rc, q->slot);
  if (send_on(n, q) == 0) return 0;
  if (q->rc->mode == RC_CLUSTER && !q->rc->refresh_recheck) want_refresh(q->rc); /* a recheck is due anyway */
  return -1;
}

/* Resends after a redirection; on failure the caller gets an error. */
static void redispatch(rc_req *q, const char *why) {
  if (dispatch(q) != 0) req_fail(q, "tccd: %s, and that node is not connected", why);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the slot and the node. NULL
 * when it does not parse or the node table is full. */
static rc_node *redirect_target(tccd_redis *rc, const rc_node *from, const char *s, int *slot) {
  const char *sp = strchr(s, ' ');
  if (!sp) return NULL;
  char *end;
  long sl = strtol(sp + 1, &end, 10);
  if (end == sp + 1 || *end != ' ' || sl < 0 || sl >= RC_SLOTS) return NULL;
  const char *ep = end + 1, *colon = strrchr(ep, ':');
  if (!colon) return NULL;
  long port = strtol(colon + 1, &end, 10);
  if (end == colon + 1 || port < 1 || port > 65535) return NULL;
  char host[256];
  size_t hl = (size_t)(colon - ep);
  if (hl >= sizeof host) return NULL;
  memcpy(host, ep, hl);
  host[hl] = '\0';
  if (!host[0] && from) snprintf(host, sizeof host, "%s", from->host);
  *slot = (int)sl;
  return node_get(rc, host, (int)port);
}

static void split_part_done(rc_split *s, size_t i, redisReply *rep);

static void split_on_part(void *arg, redisReply *rep) {
  rc_part *p = arg;
  split_part_done(p->s, p->i, rep);
}

/* TRYAGAIN on an MGET: one GET per key (same slot, same ASK target),
 * answers put together in order. Returns 0 (q is answered by the split)
 * or -1 (not an MGET, or out of memory). */
static int split_mget(rc_req *q, rc_node *asked) {
  if (q->argc < 2 || q->lens[0] != 4 || strncasecmp(q->argv[0], "MGET", 4) != 0) return -1;
  rc_split *s = calloc(1, sizeof *s);
  if (!s || !(s->parts = calloc((size_t)q->argc - 1, sizeof *s->parts)) ||
      !(s->pa = calloc((size_t)q->argc - 1, sizeof *s->pa))) {
    if (s) free(s->parts);
    free(s);
    return -1;
  }
  s->parent = q;
  s->n = (size_t)q->argc - 1;
  log_debug("redis: MGET of slot %d answered TRYAGAIN (a migration); reading its keys one by one", q->slot);
  for (size_t i = 0; i < s->n; i++) {
    s->pa[i].s = s;
    s->pa[i].i = i;
  }
  size_t n = s->n;
  for (size_t i = 0; i < n; i++) {
    const char *argv[2] = {"GET", q->argv[i + 1]};
    size_t lens[2] = {3, q->lens[i + 1]};
    rc_req *g = req_new(q->rc, q->slot, 2, argv, lens, split_on_part, &s->pa[i]);
    if (g) {
      g->ask = asked;
      g->redirects = q->redirects;
      g->tries = RC_TRYAGAIN_TRIES; /* a single key never needs a retry */
    }
    if (!g || dispatch(g) != 0) {
      req_free(g);
      redisReply e;
      memset(&e, 0, sizeof e);
      e.type = REDIS_REPLY_ERROR;
      e.str = (char *)"tccd: a GET of a split MGET could not be sent";
      e.len = strlen(e.str);
      split_part_done(s, i, &e); /* frees s (and q) when it was the last */
    }
  }
  return 0;
}

/* One GET of a split MGET answered; the last one answers the MGET. */
static void split_part_done(rc_split *s, size_t i, redisReply *rep) {
  if (!rep || rep->type == REDIS_REPLY_ERROR) {
    s->failed = 1;
    snprintf(s->why, sizeof s->why, "%s", rep ? rep->str : "connection closed");
  } else if (!(s->parts[i] = reply_copy_simple(rep))) {
    s->failed = 1;
  }
  if (++s->got < s->n) return;
  rc_req *q = s->parent;
  if (s->failed) {
    req_fail(q, "%s", s->why[0] ? s->why : "tccd: out of memory");
  } else {
    redisReply arr;
    memset(&arr, 0, sizeof arr);
    arr.type = REDIS_REPLY_ARRAY;
    arr.elements = s->n;
    arr.element = s->parts;
    req_finish(q, &arr);
  }
  for (size_t k = 0; k < s->n; k++) reply_free(s->parts[k]);
  free(s->parts);
  free(s->pa);
  free(s);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata) {
  rc_req *q = privdata;
  tccd_redis *rc = q->rc;
  rc_node *n = ac->data;
  redisReply *rep = reply;
  if (n && n->ac == ac && q->sent_on == ac) {
    if (n->pending > 0) n->pending--;
    n->waiting_since_ns = now_ns();
  }
  rc_node *asked = q->ask;
  q->ask = NULL;
  if (!rep || rc->closing) {
    if (!rep && !rc->closing) want_refresh(rc);
    req_finish(q, rep);
    return;
  }
  if (rep->type == REDIS_REPLY_ERROR && !q->internal) {
    int moved = strncmp(rep->str, "MOVED ", 6) == 0, ask = strncmp(rep->str, "ASK ", 4) == 0;
    if (moved || ask) {
      int slot;
      rc_node *to = redirect_target(rc, n, rep->str, &slot);
      if (!to || ++q->redirects > RC_MAX_REDIRECTS) {
        req_finish(q, rep); /* the caller sees the MOVED/ASK error */
        return;
      }
      char why[300];
      snprintf(why, sizeof why, "%s", rep->str);
      if (moved) {
        rc->redirects_moved++;
        rc->slots[slot] = (int16_t)node_index(rc, to);
        if (rc->mode != RC_CLUSTER) { /* only a cluster redirects: route by slot from now on */
          log_info("redis %s: a cluster (it answered MOVED)", n ? n->addr : "?");
          rc->mode = RC_CLUSTER;
        }
        want_refresh(rc);
        log_debug("redis: %s; following it", why);
      } else {
        rc->redirects_ask++;
        q->ask = to;
        log_debug("redis: %s; asking there", why);
      }
      redispatch(q, why);
      return;
    }
    if (strncmp(rep->str, "TRYAGAIN", 8) == 0 && split_mget(q, asked) == 0) {
      /* q is answered by the split; hiredis frees rep */
      return;
    }
    if (strncmp(rep->str, "TRYAGAIN", 8) == 0 && q->tries < RC_TRYAGAIN_TRIES) {
      q->retry_at_ns = now_ns() + ((uint64_t)RC_TRYAGAIN_FIRST_MS << q->tries) * 1000000ull;
      q->tries++;
      q->next_delayed = rc->delayed;
      rc->delayed = q;
      arm_tick(rc);
      return;
    }
    if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0) want_refresh(rc);
  }
  req_finish(q, rep);
}

/* ------------------------------------------------------------ the timer */

static void on_tick(uv_timer_t *t);

static void arm_tick(tccd_redis *rc) {
  if (!rc->closing && !uv_is_active((uv_handle_t *)&rc->tick))
    uv_timer_start(&rc->tick, on_tick, RC_TICK_MS, RC_TICK_MS);
}

/* Every 10 ms while needed: reconnects, connect timeouts, a hung
 * connection's reset, delayed retries, map refreshes. */
static void on_tick(uv_timer_t *t) {
  tccd_redis *rc = t->data;
  uint64_t now = now_ns();
  uint64_t stuck_ms = (uint64_t)rc->timeout_ms * 5;
  if (stuck_ms < RC_STUCK_MIN_MS) stuck_ms = RC_STUCK_MIN_MS;
  int busy = 0;
  for (int i = 0; i < rc->nnodes; i++) {
    rc_node *n = rc->nodes[i];
    if (n->state == TCCD_REDIS_NODE_DOWN && now >= n->reconnect_at_ns) node_connect(n);
    /* hiredis's libuv adapter may never call on_connect for a hung
     * connect: give it --redis-timeout-ms */
    if (n->state == TCCD_REDIS_NODE_CONNECTING && now > n->connect_started_ns &&
        now - n->connect_started_ns > (uint64_t)rc->timeout_ms * 1000000ull) {
      trouble(rc, "cannot connect to %s: no answer within %d ms", n->addr, rc->timeout_ms);
      node_drop(n, TCCD_REDIS_NODE_DOWN); /* pending commands get NULL replies */
      node_schedule_reconnect(n);
      want_refresh(rc);
    }
    if (node_open(n) && n->pending > 0 && now > n->waiting_since_ns &&
        now - n->waiting_since_ns > stuck_ms * 1000000ull) {
      trouble(rc, "%s: no reply for %llu ms; reconnecting", n->addr, (unsigned long long)stuck_ms);
      node_drop(n, TCCD_REDIS_NODE_DOWN);
      if (n->reconnect_at_ns <= now) node_schedule_reconnect(n);
    }
    if (n->state != TCCD_REDIS_NODE_CONNECTED || n->pending > 0) busy = 1;
  }
  rc_req *due = NULL;
  for (rc_req **p = &rc->delayed; *p;) {
    if ((*p)->retry_at_ns <= now) {
      rc_req *q = *p;
      *p = q->next_delayed;
      q->next_delayed = due;
      due = q;
    } else {
      p = &(*p)->next_delayed;
    }
  }
  while (due) {
    rc_req *q = due;
    due = q->next_delayed;
    q->next_delayed = NULL;
    redispatch(q, "TRYAGAIN");
  }
  if (rc->refresh_wanted && !rc->refresh_inflight && now >= rc->refresh_at_ns) {
    int start = (int)(randombytes_uniform((uint32_t)rc->nnodes));
    for (int k = 0; k < rc->nnodes; k++) {
      rc_node *n = rc->nodes[(start + k) % rc->nnodes];
      if (n->state == TCCD_REDIS_NODE_CONNECTED) {
        refresh_from(n);
        break;
      }
    }
  }
  if (rc->delayed || rc->refresh_wanted || rc->refresh_inflight) busy = 1;
  if (!busy) uv_timer_stop(t);
}

/* ------------------------------------------------------------ URLs */

/* Decodes %XX escapes in place. Returns 0 or -1. */
static int percent_decode(char *s) {
  char *w = s;
  for (char *p = s; *p; p++) {
    if (*p == '%') {
      unsigned v;
      if (!p[1] || !p[2] || sscanf(p + 1, "%2x", &v) != 1) return -1;
      *w++ = (char)v;
      p += 2;
    } else {
      *w++ = *p;
    }
  }
  *w = '\0';
  return 0;
}

/* One redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (the scheme may be left
 * out after the first URL of a list). Credentials and DB go to rc when
 * the URL names them. Returns 0 or a message. */
static int parse_one(tccd_redis *rc, const char *url, int first, char *host, size_t host_size, int *port,
                     tcc_error *err) {
  const char *p = url;
  if (strncmp(p, "redis://", 8) == 0) p += 8;
  else if (first)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "--redis must look like redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][,HOST:PORT...]");
  *port = 6379;
  const char *at = strrchr(p, '@');
  if (at) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    char user[sizeof rc->user] = "", password[sizeof rc->password] = "";
    if (!colon || (size_t)(colon - p) >= sizeof user || (size_t)(at - colon - 1) >= sizeof password)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: credentials must be [USER]:PASSWORD@");
    memcpy(user, p, (size_t)(colon - p));
    memcpy(password, colon + 1, (size_t)(at - colon - 1));
    int bad = percent_decode(user) || percent_decode(password);
    if (!bad && !rc->password[0]) {
      memcpy(rc->user, user, sizeof user);
      memcpy(rc->password, password, sizeof password);
    }
    sodium_memzero(password, sizeof password);
    if (bad) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: bad %% escape in the credentials");
    p = at + 1;
  }
  const char *host_end;
  if (*p == '[') { /* [ipv6] */
    host_end = strchr(p, ']');
    if (!host_end) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: unterminated [");
    p++;
  } else {
    host_end = p + strcspn(p, ":/");
  }
  size_t hl = (size_t)(host_end - p);
  if (hl == 0 || hl >= host_size) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: no host");
  memcpy(host, p, hl);
  host[hl] = '\0';
  p = host_end + (*host_end == ']');
  if (*p == ':') {
    char *end;
    long port_l = strtol(p + 1, &end, 10);
    if (end == p + 1 || port_l < 1 || port_l > 65535)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: bad port");
    *port = (int)port_l;
    p = end;
  }
  if (*p == '/' && p[1]) {
    char *end;
    long db = strtol(p + 1, &end, 10);
    if (end == p + 1 || *end || db < 0 || db > 1000000)
      return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: bad database number");
    if (first) rc->db = (int)db;
  } else if (*p && strcmp(p, "/") != 0) {
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: unexpected '%.40s' after the host", p);
  }
  return 0;
}

/* ------------------------------------------------------------ API */

int tccd_redis_open(uv_loop_t *loop, const char *urls, int timeout_ms, const tccd_redis_events *ev,
                    tccd_redis **out, tcc_error *err) {
  *out = NULL;
  tccd_redis *rc = calloc(1, sizeof *rc);
  if (!rc) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  rc->loop = loop;
  rc->ev = *ev;
  rc->timeout_ms = timeout_ms;
  rc->closing = 1; /* no connects while parsing */
  for (int i = 0; i < RC_SLOTS; i++) rc->slots[i] = -1;
  char *list = strdup(urls);
  int rc_err = list ? 0 : tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  size_t dl = 0;
  char *save = NULL;
  for (char *u = list ? strtok_r(list, ",", &save) : NULL; u && !rc_err; u = strtok_r(NULL, ",", &save)) {
    while (*u == ' ') u++;
    if (!*u) continue;
    char host[256] = "";
    int port = 6379;
    rc_err = parse_one(rc, u, rc->nnodes == 0, host, sizeof host, &port, err);
    if (rc_err) break;
    if (node_find(rc, host, port)) continue;
    rc_node *n = node_get(rc, host, port);
    if (!n) {
      rc_err = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis: too many addresses");
      break;
    }
    rc->nseeds++;
    dl += (size_t)snprintf(rc->display + dl, dl < sizeof rc->display ? sizeof rc->display - dl : 0, "%s%s",
                           rc->nseeds > 1 ? "," : "", n->addr);
    if (dl >= sizeof rc->display) dl = sizeof rc->display - 1;
  }
  if (list) {
    sodium_memzero(list, strlen(list));
    free(list);
  }
  if (!rc_err && rc->nnodes == 0)
    rc_err = tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "--redis must look like redis://HOST[:PORT]");
  if (rc_err) {
    for (int i = 0; i < rc->nnodes; i++) free(rc->nodes[i]);
    sodium_memzero(rc->password, sizeof rc->password);
    free(rc);
    return rc_err;
  }
  snprintf(rc->display + dl, sizeof rc->display - dl, "/%d", rc->db);
  rc->closing = 0;
  uv_timer_init(loop, &rc->tick);
  rc->tick.data = rc;
  for (int i = 0; i < rc->nnodes; i++) node_connect(rc->nodes[i]);
  *out = rc;
  return 0;
}

int tccd_redis_command(tccd_redis *rc, const char *key, size_t key_len, int argc, const char **argv,
                       const size_t *lens, tccd_redis_reply_fn fn, void *arg) {
  if (!rc || rc->closing) return -1;
  rc_req *q = req_new(rc, key ? tccd_redis_slot(key, key_len) : -1, argc, argv, lens, fn, arg);
  if (!q) return -1;
  if (dispatch(q) != 0) {
    req_free(q);
    return -1;
  }
  return 0;
}

int tccd_redis_connected(const tccd_redis *rc) {
  if (!rc) return 0;
  if (rc->mode == RC_SINGLE) return rc->nodes[0]->state == TCCD_REDIS_NODE_CONNECTED;
  for (int i = 0; i < rc->nnodes; i++)
    if (rc->nodes[i]->state == TCCD_REDIS_NODE_CONNECTED) return 1;
  return 0;
}

int tccd_redis_usable(const tccd_redis *rc) {
  if (!rc || rc->closing) return 0;
  if (rc->mode == RC_SINGLE) return node_open(rc->nodes[0]);
  for (int i = 0; i < rc->nnodes; i++)
    if (node_open(rc->nodes[i])) return 1;
  return 0;
}

const char *tccd_redis_display(const tccd_redis *rc) { return rc ? rc->display : ""; }

void tccd_redis_info(const tccd_redis *rc, tccd_redis_stats *out) {
  memset(out, 0, sizeof *out);
  if (!rc) return;
  out->cluster = rc->mode == RC_CLUSTER;
  out->nodes = rc->nnodes;
  for (int i = 0; i < rc->nnodes; i++) out->connected_nodes += rc->nodes[i]->state == TCCD_REDIS_NODE_CONNECTED;
  out->moved = rc->redirects_moved;
  out->ask = rc->redirects_ask;
}

static void on_tick_closed(uv_handle_t *h) {
  tccd_redis *rc = h->data;
  for (int i = 0; i < rc->nnodes; i++) free(rc->nodes[i]);
  sodium_memzero(rc->password, sizeof rc->password);
  free(rc);
}

void tccd_redis_close(tccd_redis *rc) {
  if (!rc) return;
  rc->closing = 1;
  while (rc->delayed) {
    rc_req *q = rc->delayed;
    rc->delayed = q->next_delayed;
    req_finish(q, NULL);
  }
  for (int i = 0; i < rc->nnodes; i++)
    node_drop(rc->nodes[i], TCCD_REDIS_NODE_CLOSED); /* NULL replies to every pending command */
  uv_timer_stop(&rc->tick);
  uv_close((uv_handle_t *)&rc->tick, on_tick_closed);
}
