/*
 * decode.c — wire bytes to a CompileRequest, with useful errors.
 *
 * protobuf-c says only "failed" when unpacking fails. When it does, we walk
 * the bytes once more against the message descriptors to say where and
 * why ("malformed CompileRequest: graph.nodes[2].inputs[0]: truncated
 * varint at byte 181"). The walk never allocates and is bounded by the
 * input length and the (non-recursive) message nesting.
 */
#include "graph.h"

#include <stdio.h>
#include <string.h>

typedef struct wire_pos {
  const uint8_t *base;   /* start of the whole buffer, for offsets */
  char path[256];        /* "graph.nodes[2]" */
  char why[160];
} wire_pos;

/* Reads a varint at *p (< end). Returns 0, or -1 truncated, -2 too long. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*p >= end) return -1;
    uint8_t c = *(*p)++;
    if (shift == 63 && c > 1) return -2;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -2;
}

static int expected_wire_type(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_FIXED32:
  case PROTOBUF_C_TYPE_FLOAT: return 5;
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE: return 1;
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_BYTES:
  case PROTOBUF_C_TYPE_MESSAGE: return 2;
  default: return 0;
  }
}

/* Checks the bytes [p, end) of message d. Returns 0 when no problem was
 * found, else -1 with w->path / w->why set. */
static int wire_check(wire_pos *w, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                      const uint8_t *end, int depth) {
  if (depth > 32) {
    snprintf(w->why, sizeof w->why, "nesting too deep");
    return -1;
  }
  unsigned counts[64] = {0};   /* per field number, for "[i]" in paths */
  while (p < end) {
    size_t at = (size_t)(p - w->base);
    uint64_t tag;
    int rc = read_varint(&p, end, &tag);
    if (rc) {
      snprintf(w->why, sizeof w->why, "%s tag at byte %zu", rc == -1 ? "truncated" : "overlong", at);
      return -1;
    }
    uint32_t num = (uint32_t)(tag >> 3);
    int wt = (int)(tag & 7);
    if (num == 0 || tag >> 3 > 0x1fffffff) {
      snprintf(w->why, sizeof w->why, "invalid field number at byte %zu", at);
      return -1;
    }
    const ProtobufCFieldDescriptor *f = d ? protobuf_c_message_descriptor_get_field(d, num) : NULL;
    if (f) {
      int want = expected_wire_type(f->type);
      int packed_ok = f->label == PROTOBUF_C_LABEL_REPEATED && want != 2 && wt == 2;
      if (wt != want && !packed_ok) {
        snprintf(w->why, sizeof w->why, "field '%s' (%u) at byte %zu has wire type %d, expected %d",
                 f->name, num, at, wt, want);
        return -1;
      }
    }
    uint64_t len;
    const uint8_t *start = p;
    switch (wt) {
    case 0:
      rc = read_varint(&p, end, &len);
      if (rc) {
        snprintf(w->why, sizeof w->why, "%s varint at byte %zu", rc == -1 ? "truncated" : "overlong",
                 (size_t)(start - w->base));
        return -1;
      }
      break;
    case 1:
    case 5: {
      size_t n = wt == 1 ? 8 : 4;
      if ((size_t)(end - p) < n) {
        snprintf(w->why, sizeof w->why, "truncated fixed%zu at byte %zu", n * 8,
                 (size_t)(p - w->base));
        return -1;
      }
      p += n;
      break;
    }
    case 2:
      rc = read_varint(&p, end, &len);
      if (rc) {
        snprintf(w->why, sizeof w->why, "%s length of field %u at byte %zu",
                 rc == -1 ? "truncated" : "overlong", num, at);
        return -1;
      }
      if (len > (uint64_t)(end - p)) {
        snprintf(w->why, sizeof w->why,
                 "field '%s' (%u) at byte %zu claims %llu bytes, only %zu left (truncated?)",
                 f ? f->name : "?", num, at, (unsigned long long)len, (size_t)(end - p));
        return -1;
      }
      if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
        size_t o = strlen(w->path);
        unsigned idx = num < 64 ? counts[num]++ : 0;
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
          snprintf(w->path + o, sizeof w->path - o, "%s%s[%u]", o ? "." : "", f->name, idx);
        else
          snprintf(w->path + o, sizeof w->path - o, "%s%s", o ? "." : "", f->name);
        if (wire_check(w, f->descriptor, p, p + len, depth + 1)) return -1;
        w->path[o] = '\0';
      } else if (f && expected_wire_type(f->type) == 0 && f->label == PROTOBUF_C_LABEL_REPEATED) {
        const uint8_t *q = p, *qe = p + len;   /* packed varints */
        while (q < qe) {
          uint64_t ignored;
          if (read_varint(&q, qe, &ignored)) {
            snprintf(w->why, sizeof w->why, "bad packed varint in field '%s' at byte %zu",
                     f->name, (size_t)(q - w->base));
            return -1;
          }
        }
      } else if (f && f->label == PROTOBUF_C_LABEL_REPEATED && expected_wire_type(f->type) != 2) {
        size_t unit = expected_wire_type(f->type) == 1 ? 8 : 4;
        if (len % unit) {
          snprintf(w->why, sizeof w->why, "packed field '%s' at byte %zu is not a multiple of %zu bytes",
                   f->name, at, unit);
          return -1;
        }
      }
      p += len;
      break;
    default:
      snprintf(w->why, sizeof w->why, "unsupported wire type %d at byte %zu", wt, at);
      return -1;
    }
  }
  return 0;
}

int tcc_decode_request(const uint8_t *buf, size_t len, Tcc__V1__CompileRequest **out,
                       tcc_error *err) {
  *out = NULL;
  if (len > TCC_MAX_REQUEST_BYTES)
    return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED,
                         "CompileRequest is %zu bytes (limit %u)", len, TCC_MAX_REQUEST_BYTES);
  if (!buf && len) return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed CompileRequest: no data");
  static const uint8_t empty[1];
  Tcc__V1__CompileRequest *req = tcc__v1__compile_request__unpack(NULL, len, buf ? buf : empty);
  if (req) {
    *out = req;
    return 0;
  }
  wire_pos w;
  memset(&w, 0, sizeof w);
  w.base = buf;
  if (wire_check(&w, &tcc__v1__compile_request__descriptor, buf, buf + len, 0) == 0)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "malformed CompileRequest: protobuf decoding failed (%zu bytes)", len);
  if (w.path[0])
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed CompileRequest: %s: %s", w.path,
                         w.why);
  return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed CompileRequest: %s", w.why);
}
