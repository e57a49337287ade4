/*
 * arena.c — chunked bump allocator and growable buffer (see arena.h).
 *
 * Chunks grow geometrically from 16 KiB; a request bigger than half a
 * chunk gets a chunk of its own so large constants do not waste space.
 */
#include "arena.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tcc_arena_chunk {
  tcc_arena_chunk *next;
  size_t size;                         /* usable bytes in mem */
  _Alignas(16) unsigned char mem[];
};

#define ARENA_MIN_CHUNK ((size_t)16 << 10)
#define ARENA_MAX_CHUNK ((size_t)1 << 20)

void tcc_arena_init(tcc_arena *a) { memset(a, 0, sizeof *a); }

void tcc_arena_free(tcc_arena *a) {
  tcc_arena_chunk *c = a->head;
  while (c) {
    tcc_arena_chunk *next = c->next;
    free(c);
    c = next;
  }
  memset(a, 0, sizeof *a);
}

static tcc_arena_chunk *arena_new_chunk(size_t size) {
  if (size > SIZE_MAX - sizeof(tcc_arena_chunk)) return NULL;
  tcc_arena_chunk *c = malloc(sizeof *c + size);
  if (!c) return NULL;
  c->size = size;
  c->next = NULL;
  return c;
}

void *tcc_arena_alloc(tcc_arena *a, size_t n) {
  if (n == 0) n = 1;
  if (n > SIZE_MAX - 15) return NULL;
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->size - a->used < n) {
    size_t want = a->total < ARENA_MIN_CHUNK ? ARENA_MIN_CHUNK : a->total;
    if (want > ARENA_MAX_CHUNK) want = ARENA_MAX_CHUNK;
    if (n > want / 2) {
      /* Big object: its own chunk, linked behind head so the current
       * chunk keeps serving small requests. */
      tcc_arena_chunk *c = arena_new_chunk(n);
      if (!c) return NULL;
      a->total += n;
      memset(c->mem, 0, n);
      if (a->head) {
        c->next = a->head->next;
        a->head->next = c;
      } else {
        a->head = c;
        a->used = n;
      }
      return c->mem;
    }
    tcc_arena_chunk *c = arena_new_chunk(want);
    if (!c) return NULL;
    a->total += want;
    c->next = a->head;
    a->head = c;
    a->used = 0;
  }
  void *p = a->head->mem + a->used;
  a->used += n;
  memset(p, 0, n);
  return p;
}

void *tcc_arena_array(tcc_arena *a, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) return NULL;
  return tcc_arena_alloc(a, n);
}

char *tcc_arena_strndup(tcc_arena *a, const char *s, size_t n) {
  if (n == SIZE_MAX) return NULL;
  char *p = tcc_arena_alloc(a, n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *tcc_arena_strdup(tcc_arena *a, const char *s) {
  if (!s) s = "";
  return tcc_arena_strndup(a, s, strlen(s));
}

char *tcc_arena_printf(tcc_arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n < 0 ? NULL : tcc_arena_alloc(a, (size_t)n + 1);
  if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

/* ------------------------------------------------------------ tcc_buf */

static int buf_reserve(tcc_buf *b, size_t extra) {
  if (b->failed) return 0;
  if (extra > SIZE_MAX - b->len - 1) {
    b->failed = 1;
    return 0;
  }
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->failed = 1;
    return 0;
  }
  b->data = p;
  b->cap = cap;
  return 1;
}

void tcc_buf_put(tcc_buf *b, const void *p, size_t n) {
  if (!buf_reserve(b, n)) return;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void tcc_buf_puts(tcc_buf *b, const char *s) { tcc_buf_put(b, s, strlen(s)); }

void tcc_buf_vprintf(tcc_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  if (n >= 0 && buf_reserve(b, (size_t)n)) {
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    b->len += (size_t)n;
  } else if (n < 0) {
    b->failed = 1;
  }
  va_end(ap2);
}

void tcc_buf_printf(tcc_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tcc_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void tcc_buf_free(tcc_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

char *tcc_buf_take(tcc_buf *b, size_t *len) {
  if (b->failed || !buf_reserve(b, 0)) {
    tcc_buf_free(b);
    return NULL;
  }
  b->data[b->len] = '\0';
  char *p = b->data;
  if (len) *len = b->len;
  memset(b, 0, sizeof *b);
  return p;
}
