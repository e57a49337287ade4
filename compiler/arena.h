/*
 * arena.h — region allocation for the compiler's IRs (after nginx pools).
 *
 * Every IR object of one preparation (the canonical graph) or of one
 * compile (loop IR, emitted text) lives in one arena and dies with it:
 * passes never free individual objects, so a failing pass cannot leak.
 * Allocations are zeroed and 16-byte aligned. An arena is not
 * thread-safe; each compile owns its own.
 */
#ifndef TCC_ARENA_H
#define TCC_ARENA_H

#include <stdarg.h>
#include <stddef.h>

typedef struct tcc_arena_chunk tcc_arena_chunk;

typedef struct tcc_arena {
  tcc_arena_chunk *head;   /* newest chunk first */
  size_t used;             /* bytes handed out in head */
  size_t total;            /* bytes malloc'ed in all chunks */
} tcc_arena;

/* An empty arena; allocates nothing until first use. */
void tcc_arena_init(tcc_arena *a);

/* Frees every chunk; the arena may be reused afterwards. */
void tcc_arena_free(tcc_arena *a);

/* n zeroed bytes, or NULL when out of memory (or n overflows). */
void *tcc_arena_alloc(tcc_arena *a, size_t n);

/* count * size zeroed bytes; NULL on overflow or out of memory. */
void *tcc_arena_array(tcc_arena *a, size_t count, size_t size);

/* A copy of s[0..n) plus a NUL; NULL when out of memory. */
char *tcc_arena_strndup(tcc_arena *a, const char *s, size_t n);

/* A NUL-terminated copy of s (NULL s copies as ""). */
char *tcc_arena_strdup(tcc_arena *a, const char *s);

/* printf into the arena; NULL when out of memory. */
char *tcc_arena_printf(tcc_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A growable byte buffer allocated with malloc (emitted source, keys).
 * On out-of-memory it sets `failed` and ignores further appends, so
 * callers check once at the end. */
typedef struct tcc_buf {
  char *data;
  size_t len, cap;
  int failed;
} tcc_buf;

void tcc_buf_put(tcc_buf *b, const void *p, size_t n);
void tcc_buf_puts(tcc_buf *b, const char *s);
void tcc_buf_printf(tcc_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tcc_buf_vprintf(tcc_buf *b, const char *fmt, va_list ap);
/* Releases the buffer's memory and zeroes it. */
void tcc_buf_free(tcc_buf *b);
/* Hands the data (NUL-terminated) to the caller and zeroes the buffer;
 * NULL when an append failed. */
char *tcc_buf_take(tcc_buf *b, size_t *len);

#endif
