/*
 * tcc_status.h — error codes and the error buffer every library fills.
 *
 * Convention (after libuv and git): library functions never print or exit.
 * They return 0 on success or a negative TCC_E* code, and fill a caller's
 * tcc_error with a message that names the problem. The codes are the
 * negated gRPC status codes, so the daemon turns an error into a gRPC
 * status without a table: grpc_status = -code.
 */
#ifndef TCC_STATUS_H
#define TCC_STATUS_H

#include <stdarg.h>
#include <stddef.h>

/* X(NAME, grpc status code, short description) */
#define TCC_STATUS_MAP(X)                                              \
  X(CANCELLED, 1, "cancelled")                                         \
  X(UNKNOWN, 2, "unknown error")                                       \
  X(INVALID_ARGUMENT, 3, "invalid argument")                           \
  X(DEADLINE_EXCEEDED, 4, "deadline exceeded")                         \
  X(NOT_FOUND, 5, "not found")                                         \
  X(ALREADY_EXISTS, 6, "already exists")                               \
  X(PERMISSION_DENIED, 7, "permission denied")                         \
  X(RESOURCE_EXHAUSTED, 8, "resource exhausted")                       \
  X(FAILED_PRECONDITION, 9, "failed precondition")                     \
  X(ABORTED, 10, "aborted")                                            \
  X(OUT_OF_RANGE, 11, "out of range")                                  \
  X(UNIMPLEMENTED, 12, "unimplemented")                                \
  X(INTERNAL, 13, "internal error")                                    \
  X(UNAVAILABLE, 14, "unavailable")                                    \
  X(DATA_LOSS, 15, "data loss")                                        \
  X(UNAUTHENTICATED, 16, "unauthenticated")

typedef enum tcc_status {
  TCC_OK = 0,
#define TCC_STATUS_ENUM(name, grpc, text) TCC_E_##name = -(grpc),
  TCC_STATUS_MAP(TCC_STATUS_ENUM)
#undef TCC_STATUS_ENUM
} tcc_status;

#define TCC_ERROR_MSG_MAX 1024
/* A request id (tccd names every call; x-request-id on the wire): 1 to 64
 * characters of [A-Za-z0-9._-]. */
#define TCC_REQUEST_ID_MAX 64

typedef struct tcc_error {
  int code;                      /* 0 or a TCC_E* code */
  char msg[TCC_ERROR_MSG_MAX];   /* human-readable, no trailing newline */
  /* The daemon's id of the call that failed ("" when the error did not
   * come from a daemon's answer): the key to its log lines. Cleared by
   * tcc_error_set and tcc_error_clear, kept by tcc_error_prefix. */
  char request_id[TCC_REQUEST_ID_MAX + 1];
} tcc_error;

/* Short description of a code ("invalid argument"). Never NULL. */
const char *tcc_strerror(int code);

/* Name of a code as gRPC spells it ("INVALID_ARGUMENT"). Never NULL. */
const char *tcc_status_name(int code);

/* Fills err (when non-NULL) and returns code, so callers can write
 *   return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "node %d: ...", i);
 * The message is truncated to fit; it is never left unterminated. */
int tcc_error_set(tcc_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tcc_error_setv(tcc_error *err, int code, const char *fmt, va_list ap);

/* Prefixes err->msg with "<prefix>: " (for adding context on the way up). */
void tcc_error_prefix(tcc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void tcc_error_clear(tcc_error *err);

/* 1 when the len bytes at s form a request id (see TCC_REQUEST_ID_MAX). */
int tcc_request_id_valid(const char *s, size_t len);

#endif
