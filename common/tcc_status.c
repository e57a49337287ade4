/* tcc_status.c — code names and the error buffer (see tcc_status.h). */
#include "tcc_status.h"

#include <stdio.h>
#include <string.h>

const char *tcc_strerror(int code) {
  switch (code) {
  case TCC_OK: return "ok";
#define TCC_STATUS_TEXT(name, grpc, text) case TCC_E_##name: return text;
  TCC_STATUS_MAP(TCC_STATUS_TEXT)
#undef TCC_STATUS_TEXT
  }
  return "unknown error code";
}

const char *tcc_status_name(int code) {
  switch (code) {
  case TCC_OK: return "OK";
#define TCC_STATUS_NAME(name, grpc, text) case TCC_E_##name: return #name;
  TCC_STATUS_MAP(TCC_STATUS_NAME)
#undef TCC_STATUS_NAME
  }
  return "UNKNOWN";
}

int tcc_error_setv(tcc_error *err, int code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    err->request_id[0] = '\0';
  }
  return code;
}

int tcc_error_set(tcc_error *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tcc_error_setv(err, code, fmt, ap);
  va_end(ap);
  return code;
}

void tcc_error_prefix(tcc_error *err, const char *fmt, ...) {
  if (!err) return;
  char prefix[256], old[TCC_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof old);
  size_t n = strlen(prefix);
  if (n + 2 >= sizeof err->msg) n = sizeof err->msg - 3;
  memcpy(err->msg, prefix, n);
  memcpy(err->msg + n, ": ", 2);
  size_t room = sizeof err->msg - n - 3;
  size_t m = strnlen(old, room);
  memcpy(err->msg + n + 2, old, m);
  err->msg[n + 2 + m] = '\0';
}

void tcc_error_clear(tcc_error *err) {
  if (err) {
    err->code = TCC_OK;
    err->msg[0] = '\0';
    err->request_id[0] = '\0';
  }
}

int tcc_request_id_valid(const char *s, size_t len) {
  if (len == 0 || len > TCC_REQUEST_ID_MAX) return 0;
  for (size_t i = 0; i < len; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
          ch == '_' || ch == '-'))
      return 0;
  }
  return 1;
}
