/*
 * pbjson.c — proto3 JSON <-> protobuf-c messages (see pbjson.h).
 *
 * Parsing walks the cJSON tree and the message descriptor side by side.
 * Memory ownership follows protobuf-c's unpack exactly, because the result
 * is freed by protobuf_c_message_free_unpacked():
 *
 *   field kind             storage                   allocation
 *   ---------------------  ------------------------  ----------------------
 *   string                 char *                    malloc'd copy (the
 *                                                    default "" is static)
 *   bytes                  ProtobufCBinaryData       data malloc'd, NULL
 *                                                    when empty
 *   message                ProtobufCMessage *        malloc + message_init
 *   repeated T             n_x + T *x                calloc'd array, NULL
 *                                                    when empty
 *   oneof member           <oneof>_case + union      as its type; the case
 *                                                    is set once the value
 *                                                    is in place
 *
 * Invariant: the message being built is freeable by free_unpacked at every
 * step, so any error can simply free the root. Arrays are calloc'd and
 * counted before their elements are filled (NULL elements free as no-ops);
 * a submessage is linked into its parent before it is filled.
 *
 * Printing builds a cJSON tree; numbers are raw items with their exact
 * text (64-bit integers keep every digit; floats print the shortest text
 * that reads back to the same value).
 */
#include "pbjson.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEMBER_PTR(msg, off) ((void *)((char *)(msg) + (off)))
#define CMEMBER_PTR(msg, off) ((const void *)((const char *)(msg) + (off)))

/* Bare JSON numbers for 64-bit fields must be below 2^53 in magnitude:
 * from 2^53 on, distinct integers read as the same double. */
#define EXACT_DOUBLE_INT 9007199254740992.0 /* 2^53 */

char *tcc_pbjson_json_name(const char *proto_name, char *out, size_t size) {
  size_t n = 0;
  int upper = 0;
  if (size == 0) return out;
  for (const char *s = proto_name; *s && n + 1 < size; s++) {
    if (*s == '_') {
      upper = 1;
    } else {
      out[n++] = upper && *s >= 'a' && *s <= 'z' ? (char)(*s - 'a' + 'A') : *s;
      upper = 0;
    }
  }
  out[n] = '\0';
  return out;
}

/* Bytes one element of a repeated field of this type occupies. */
static size_t repeated_elt_size(ProtobufCType type) {
  switch (type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_FLOAT:
  case PROTOBUF_C_TYPE_ENUM:
    return 4;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
    return 8;
  case PROTOBUF_C_TYPE_BOOL:
    return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_STRING:
    return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(ProtobufCMessage *);
  }
  return 0;
}

static int is_oneof(const ProtobufCFieldDescriptor *f) {
  return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

/* ------------------------------------------------------------ parsing */

/* The parse state: where we are (for messages) and the error buffer. */
typedef struct pbj_parser {
  char path[512];
  size_t len;
  tcc_error *err;
} pbj_parser;

/* Appends ".name" (or "name" at the root) or "[i]" to the path; returns
 * the old length for path_pop. */
static size_t path_push_name(pbj_parser *p, const char *name) {
  size_t old = p->len;
  int n = snprintf(p->path + p->len, sizeof p->path - p->len, "%s%s",
                   p->len ? "." : "", name);
  if (n > 0) p->len += (size_t)n < sizeof p->path - p->len ? (size_t)n : sizeof p->path - p->len - 1;
  return old;
}

static size_t path_push_index(pbj_parser *p, int i) {
  size_t old = p->len;
  int n = snprintf(p->path + p->len, sizeof p->path - p->len, "[%d]", i);
  if (n > 0) p->len += (size_t)n < sizeof p->path - p->len ? (size_t)n : sizeof p->path - p->len - 1;
  return old;
}

static void path_pop(pbj_parser *p, size_t old) {
  p->len = old;
  p->path[old] = '\0';
}

/* Fills the error as "<path>: <message>"; returns TCC_E_INVALID_ARGUMENT. */
__attribute__((format(printf, 2, 3)))
static int parse_fail(pbj_parser *p, const char *fmt, ...) {
  char msg[TCC_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->len)
    return tcc_error_set(p->err, TCC_E_INVALID_ARGUMENT, "%s: %s", p->path, msg);
  return tcc_error_set(p->err, TCC_E_INVALID_ARGUMENT, "%s", msg);
}

static int parse_oom(pbj_parser *p) {
  return tcc_error_set(p->err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
}

/* "a string", "an object", ... for messages about wrong JSON types. */
static const char *json_type_name(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "an invalid value";
}

/* Is s an integer literal: optional '-', then digits only? */
static int is_integer_text(const char *s) {
  if (*s == '-') s++;
  if (!*s) return 0;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

/* Does s look like a JSON number (so strtod will not take "inf"/"0x1")? */
static int is_number_text(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!strchr("0123456789+-.eE", *s)) return 0;
  return 1;
}

/* Reads an integer field value: a JSON number or a decimal string.
 * is_signed/bits give the field's range. Sets *sv (signed) or *uv
 * (unsigned). Returns 0 or fails with the path. */
static int parse_integer(pbj_parser *p, const cJSON *v, int is_signed, int bits,
                         int64_t *sv, uint64_t *uv) {
  const char *tname = bits == 32 ? (is_signed ? "int32" : "uint32")
                                 : (is_signed ? "int64" : "uint64");
  double d;
  if (cJSON_IsString(v)) {
    const char *s = v->valuestring;
    if (is_integer_text(s)) {
      errno = 0;
      if (is_signed) {
        long long x = strtoll(s, NULL, 10);
        if (errno == ERANGE) return parse_fail(p, "%s out of range for %s", s, tname);
        if (bits == 32 && (x < INT32_MIN || x > INT32_MAX))
          return parse_fail(p, "%s out of range for %s", s, tname);
        *sv = x;
      } else {
        if (*s == '-') {
          if (strspn(s + 1, "0") == strlen(s + 1)) { *uv = 0; return 0; } /* "-0" */
          return parse_fail(p, "%s out of range for %s", s, tname);
        }
        unsigned long long x = strtoull(s, NULL, 10);
        if (errno == ERANGE) return parse_fail(p, "%s out of range for %s", s, tname);
        if (bits == 32 && x > UINT32_MAX)
          return parse_fail(p, "%s out of range for %s", s, tname);
        *uv = x;
      }
      return 0;
    }
    /* "1e3", "2.0": allowed when integral, with the number rules below. */
    char *end;
    if (!is_number_text(s)) return parse_fail(p, "not an integer: \"%s\"", s);
    d = strtod(s, &end);
    if (*end) return parse_fail(p, "not an integer: \"%s\"", s);
  } else if (cJSON_IsNumber(v)) {
    d = v->valuedouble;
  } else {
    return parse_fail(p, "not an integer (got %s)", json_type_name(v));
  }
  if (!isfinite(d) || d != trunc(d)) return parse_fail(p, "not an integer: %.17g", d);
  if (bits == 32) {
    double lo = is_signed ? (double)INT32_MIN : 0.0;
    double hi = is_signed ? (double)INT32_MAX : (double)UINT32_MAX;
    if (d < lo || d > hi) return parse_fail(p, "%.17g out of range for %s", d, tname);
  } else {
    if (fabs(d) >= EXACT_DOUBLE_INT)
      return parse_fail(p, "%.17g is too large to be exact as a JSON number; "
                           "write 64-bit integers as strings", d);
    if (!is_signed && d < 0) return parse_fail(p, "%.17g out of range for %s", d, tname);
  }
  if (is_signed) *sv = (int64_t)d;
  else *uv = (uint64_t)d;
  return 0;
}

/* Reads a float/double: a number, "NaN", "Infinity", "-Infinity" or a
 * numeric string. */
static int parse_real(pbj_parser *p, const cJSON *v, int is_float, double *out) {
  double d;
  if (cJSON_IsNumber(v)) {
    d = v->valuedouble;
  } else if (cJSON_IsString(v)) {
    const char *s = v->valuestring;
    char *end;
    if (!strcmp(s, "NaN")) { *out = NAN; return 0; }
    if (!strcmp(s, "Infinity")) { *out = INFINITY; return 0; }
    if (!strcmp(s, "-Infinity")) { *out = -INFINITY; return 0; }
    if (!is_number_text(s)) return parse_fail(p, "not a number: \"%s\"", s);
    d = strtod(s, &end);
    if (*end) return parse_fail(p, "not a number: \"%s\"", s);
  } else {
    return parse_fail(p, "not a number (got %s)", json_type_name(v));
  }
  if (!isfinite(d)) return parse_fail(p, "number out of range for %s", is_float ? "float" : "double");
  if (is_float && fabs(d) > FLT_MAX) return parse_fail(p, "%.17g out of range for float", d);
  *out = d;
  return 0;
}

/* Decodes base64 in any of the four alphabets/paddings the spec allows
 * (standard or URL-safe, with or without padding). */
static int parse_bytes(pbj_parser *p, const cJSON *v, ProtobufCBinaryData *out) {
  static const int variants[] = {
    sodium_base64_VARIANT_ORIGINAL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING,
    sodium_base64_VARIANT_URLSAFE, sodium_base64_VARIANT_URLSAFE_NO_PADDING,
  };
  if (!cJSON_IsString(v)) return parse_fail(p, "expected base64 bytes in a string (got %s)", json_type_name(v));
  const char *s = v->valuestring;
  size_t slen = strlen(s);
  if (slen == 0) {
    out->data = NULL;
    out->len = 0;
    return 0;
  }
  size_t cap = slen / 4 * 3 + 3;
  uint8_t *buf = malloc(cap);
  if (!buf) return parse_oom(p);
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    size_t n = 0;
    const char *end = NULL;
    if (sodium_base642bin(buf, cap, s, slen, NULL, &n, &end, variants[i]) == 0 &&
        end == s + slen) {
      if (n == 0) {
        free(buf);
        buf = NULL;
      }
      out->data = buf;
      out->len = n;
      return 0;
    }
  }
  free(buf);
  return parse_fail(p, "invalid base64");
}

static int parse_message_into(pbj_parser *p, const ProtobufCMessageDescriptor *d,
                              const cJSON *obj, ProtobufCMessage **slot);

/* Parses one (non-null) value of field f into dst, which points at the
 * field's storage (or at one element of a repeated field's array). */
static int parse_value(pbj_parser *p, const ProtobufCFieldDescriptor *f,
                       const cJSON *v, void *dst) {
  int64_t sv = 0;
  uint64_t uv = 0;
  double dv = 0;
  int rc;
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    if ((rc = parse_integer(p, v, 1, 32, &sv, &uv))) return rc;
    *(int32_t *)dst = (int32_t)sv;
    return 0;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    if ((rc = parse_integer(p, v, 0, 32, &sv, &uv))) return rc;
    *(uint32_t *)dst = (uint32_t)uv;
    return 0;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    if ((rc = parse_integer(p, v, 1, 64, &sv, &uv))) return rc;
    *(int64_t *)dst = sv;
    return 0;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    if ((rc = parse_integer(p, v, 0, 64, &sv, &uv))) return rc;
    *(uint64_t *)dst = uv;
    return 0;
  case PROTOBUF_C_TYPE_FLOAT:
    if ((rc = parse_real(p, v, 1, &dv))) return rc;
    *(float *)dst = (float)dv;
    return 0;
  case PROTOBUF_C_TYPE_DOUBLE:
    if ((rc = parse_real(p, v, 0, &dv))) return rc;
    *(double *)dst = dv;
    return 0;
  case PROTOBUF_C_TYPE_BOOL:
    if (!cJSON_IsBool(v)) return parse_fail(p, "expected true or false (got %s)", json_type_name(v));
    *(protobuf_c_boolean *)dst = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
  case PROTOBUF_C_TYPE_ENUM: {
    const ProtobufCEnumDescriptor *ed = f->descriptor;
    if (cJSON_IsString(v)) {
      const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(ed, v->valuestring);
      if (!ev) return parse_fail(p, "unknown value \"%s\" of enum %s", v->valuestring, ed->name);
      *(int32_t *)dst = ev->value;
      return 0;
    }
    if (!cJSON_IsNumber(v))
      return parse_fail(p, "expected a name of enum %s (got %s)", ed->name, json_type_name(v));
    if ((rc = parse_integer(p, v, 1, 32, &sv, &uv))) return rc;
    *(int32_t *)dst = (int32_t)sv; /* proto3 enums are open */
    return 0;
  }
  case PROTOBUF_C_TYPE_STRING: {
    if (!cJSON_IsString(v)) return parse_fail(p, "expected a string (got %s)", json_type_name(v));
    char *s = strdup(v->valuestring);
    if (!s) return parse_oom(p);
    *(char **)dst = s;
    return 0;
  }
  case PROTOBUF_C_TYPE_BYTES:
    return parse_bytes(p, v, dst);
  case PROTOBUF_C_TYPE_MESSAGE:
    return parse_message_into(p, f->descriptor, v, dst);
  }
  return parse_fail(p, "unsupported field type %d", (int)f->type);
}

/* Parses a JSON array into repeated field f of message m. */
static int parse_repeated(pbj_parser *p, const ProtobufCFieldDescriptor *f,
                          const cJSON *v, ProtobufCMessage *m) {
  if (!cJSON_IsArray(v)) return parse_fail(p, "expected an array (got %s)", json_type_name(v));
  int n = cJSON_GetArraySize(v);
  if (n == 0) return 0;
  size_t esz = repeated_elt_size(f->type);
  char *arr = calloc((size_t)n, esz);
  if (!arr) return parse_oom(p);
  *(void **)MEMBER_PTR(m, f->offset) = arr;
  *(size_t *)MEMBER_PTR(m, f->quantifier_offset) = (size_t)n;
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    size_t old = path_push_index(p, i);
    int rc = cJSON_IsNull(e) ? parse_fail(p, "null is not allowed in a repeated field")
                             : parse_value(p, f, e, arr + (size_t)i * esz);
    if (rc) return rc;
    path_pop(p, old);
    i++;
  }
  return 0;
}

/* Finds the field a JSON key names: its jsonName or its proto name. */
static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *d,
                                                  const char *key) {
  char jname[256];
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (!strcmp(f->name, key)) return f;
    if (!strcmp(tcc_pbjson_json_name(f->name, jname, sizeof jname), key)) return f;
  }
  return NULL;
}

/* Allocates a message of type d, links it at *slot, fills it from obj. */
static int parse_message_into(pbj_parser *p, const ProtobufCMessageDescriptor *d,
                              const cJSON *obj, ProtobufCMessage **slot) {
  if (!cJSON_IsObject(obj))
    return parse_fail(p, "expected an object for %s (got %s)", d->name, json_type_name(obj));
  ProtobufCMessage *m = malloc(d->sizeof_message);
  if (!m) return parse_oom(p);
  d->message_init(m);
  *slot = m;

  unsigned char *seen = calloc(d->n_fields + 1, 1); /* which fields were given */
  if (!seen) return parse_oom(p);

  int rc = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    const ProtobufCFieldDescriptor *f = find_field(d, item->string);
    if (!f) {
      rc = parse_fail(p, "unknown field \"%s\" in %s", item->string, d->name);
      break;
    }
    size_t old = path_push_name(p, item->string);
    unsigned fi = (unsigned)(f - d->fields);
    if (seen[fi]) {
      rc = parse_fail(p, "field \"%s\" given twice", f->name);
      break;
    }
    seen[fi] = 1;
    if (cJSON_IsNull(item)) { /* null = the default */
      path_pop(p, old);
      continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      rc = parse_repeated(p, f, item, m);
    } else if (is_oneof(f)) {
      uint32_t *which = MEMBER_PTR(m, f->quantifier_offset);
      if (*which != 0) {
        const ProtobufCFieldDescriptor *other = protobuf_c_message_descriptor_get_field(d, *which);
        rc = parse_fail(p, "only one member of a oneof may be set (\"%s\" is set already)",
                        other ? other->name : "?");
      } else {
        rc = parse_value(p, f, item, MEMBER_PTR(m, f->offset));
        /* Set the case even on failure: a half-parsed submessage is then
         * still freed with the message. */
        if (rc == 0 || f->type == PROTOBUF_C_TYPE_MESSAGE) *which = f->id;
      }
    } else {
      rc = parse_value(p, f, item, MEMBER_PTR(m, f->offset));
      if (rc == 0 && f->label == PROTOBUF_C_LABEL_OPTIONAL &&
          f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING)
        *(protobuf_c_boolean *)MEMBER_PTR(m, f->quantifier_offset) = 1;
    }
    if (rc) break;
    path_pop(p, old);
  }
  free(seen);
  return rc;
}

int tcc_pbjson_from_cjson(const ProtobufCMessageDescriptor *d, const cJSON *json,
                          ProtobufCMessage **out, tcc_error *err) {
  pbj_parser p = {.len = 0, .err = err};
  p.path[0] = '\0';
  ProtobufCMessage *m = NULL;
  *out = NULL;
  int rc = parse_message_into(&p, d, json, &m);
  if (rc) {
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
  }
  *out = m;
  return 0;
}

/* 1-based line and column of pos in text. */
static void line_col(const char *text, const char *pos, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (const char *s = text; s < pos && *s; s++) {
    if (*s == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

int tcc_pbjson_parse(const ProtobufCMessageDescriptor *d, const char *json, size_t len,
                     ProtobufCMessage **out, tcc_error *err) {
  *out = NULL;
  if (!json) {
    json = "";
    len = 0;
  }
  char *text = malloc(len + 1);
  if (!text) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(text, json, len);
  text[len] = '\0';
  const char *end = NULL;
  int line, col;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
  if (!root) {
    line_col(text, end ? end : text, &line, &col);
    free(text);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "invalid JSON at line %d, column %d", line, col);
  }
  while (end < text + len && strchr(" \t\r\n", *end) && *end) end++;
  if (end != text + len) {
    line_col(text, end, &line, &col);
    cJSON_Delete(root);
    free(text);
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT,
                         "invalid JSON: unexpected data after the value at line %d, column %d", line, col);
  }
  int rc = tcc_pbjson_from_cjson(d, root, out, err);
  cJSON_Delete(root);
  free(text);
  return rc;
}

/* ------------------------------------------------------------ printing */

/* Shortest %g text that reads back as the same double / float. */
static void format_double(double v, char *buf, size_t size) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, size, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

static void format_float(float v, char *buf, size_t size) {
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, size, "%.*g", prec, (double)v);
    if (strtof(buf, NULL) == v) return;
  }
}

static cJSON *real_to_cjson(double v, int is_float) {
  char buf[40];
  if (isnan(v)) return cJSON_CreateString("NaN");
  if (isinf(v)) return cJSON_CreateString(v > 0 ? "Infinity" : "-Infinity");
  if (v == trunc(v) && fabs(v) < 1e16) snprintf(buf, sizeof buf, "%.0f", v); /* 1000, not 1e+03 */
  else if (is_float) format_float((float)v, buf, sizeof buf);
  else format_double(v, buf, sizeof buf);
  return cJSON_CreateRaw(buf);
}

static cJSON *bytes_to_cjson(const ProtobufCBinaryData *bd) {
  size_t cap = sodium_base64_ENCODED_LEN(bd->len, sodium_base64_VARIANT_ORIGINAL);
  char *buf = malloc(cap);
  if (!buf) return NULL;
  if (bd->len) sodium_bin2base64(buf, cap, bd->data, bd->len, sodium_base64_VARIANT_ORIGINAL);
  else buf[0] = '\0';
  cJSON *s = cJSON_CreateString(buf);
  free(buf);
  return s;
}

/* One value of field f, read from src (the field's storage or one element
 * of its array), as a new cJSON item; NULL when out of memory. */
static cJSON *value_to_cjson(const ProtobufCFieldDescriptor *f, const void *src, unsigned flags) {
  char buf[40];
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    snprintf(buf, sizeof buf, "%" PRId32, *(const int32_t *)src);
    return cJSON_CreateRaw(buf);
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    snprintf(buf, sizeof buf, "%" PRIu32, *(const uint32_t *)src);
    return cJSON_CreateRaw(buf);
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    snprintf(buf, sizeof buf, "%" PRId64, *(const int64_t *)src);
    return flags & TCC_PBJSON_INT64_AS_NUMBER ? cJSON_CreateRaw(buf) : cJSON_CreateString(buf);
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)src);
    return flags & TCC_PBJSON_INT64_AS_NUMBER ? cJSON_CreateRaw(buf) : cJSON_CreateString(buf);
  case PROTOBUF_C_TYPE_FLOAT:
    return real_to_cjson(*(const float *)src, 1);
  case PROTOBUF_C_TYPE_DOUBLE:
    return real_to_cjson(*(const double *)src, 0);
  case PROTOBUF_C_TYPE_BOOL:
    return cJSON_CreateBool(*(const protobuf_c_boolean *)src ? 1 : 0);
  case PROTOBUF_C_TYPE_ENUM: {
    int32_t v = *(const int32_t *)src;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
    if (ev && !(flags & TCC_PBJSON_ENUMS_AS_INTS)) return cJSON_CreateString(ev->name);
    snprintf(buf, sizeof buf, "%" PRId32, v);
    return cJSON_CreateRaw(buf);
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)src;
    return cJSON_CreateString(s ? s : "");
  }
  case PROTOBUF_C_TYPE_BYTES:
    return bytes_to_cjson(src);
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *sub = *(ProtobufCMessage *const *)src;
    if (!sub) return cJSON_CreateObject();
    return tcc_pbjson_to_cjson(sub, flags);
  }
  }
  return cJSON_CreateNull();
}

/* Does a singular field hold its proto3 default (and so stay unprinted)? */
static int is_default(const ProtobufCFieldDescriptor *f, const void *src) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
    return *(const uint32_t *)src == 0;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    return *(const uint64_t *)src == 0;
  case PROTOBUF_C_TYPE_FLOAT: {
    float v = *(const float *)src;
    return v == 0 && !signbit(v);
  }
  case PROTOBUF_C_TYPE_DOUBLE: {
    double v = *(const double *)src;
    return v == 0 && !signbit(v);
  }
  case PROTOBUF_C_TYPE_BOOL:
    return !*(const protobuf_c_boolean *)src;
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)src;
    return !s || !*s;
  }
  case PROTOBUF_C_TYPE_BYTES:
    return ((const ProtobufCBinaryData *)src)->len == 0;
  case PROTOBUF_C_TYPE_MESSAGE:
    return *(ProtobufCMessage *const *)src == NULL;
  }
  return 1;
}

/* Adds field f of m to obj (or nothing when it is not to be printed).
 * Returns 0, or -1 when out of memory. */
static int add_field(cJSON *obj, const ProtobufCMessage *m,
                     const ProtobufCFieldDescriptor *f, unsigned flags) {
  char jname[256];
  const char *name = flags & TCC_PBJSON_ORIGINAL_NAMES
                         ? f->name : tcc_pbjson_json_name(f->name, jname, sizeof jname);
  int emit_defaults = (flags & TCC_PBJSON_EMIT_DEFAULTS) != 0;
  const void *src = CMEMBER_PTR(m, f->offset);
  cJSON *v = NULL;

  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    size_t n = *(const size_t *)CMEMBER_PTR(m, f->quantifier_offset);
    if (n == 0 && !emit_defaults) return 0;
    v = cJSON_CreateArray();
    if (!v) return -1;
    const char *arr = *(const char *const *)src;
    size_t esz = repeated_elt_size(f->type);
    for (size_t i = 0; i < n; i++) {
      cJSON *e = value_to_cjson(f, arr + i * esz, flags);
      if (!e) {
        cJSON_Delete(v);
        return -1;
      }
      cJSON_AddItemToArray(v, e);
    }
  } else if (is_oneof(f)) {
    if (*(const uint32_t *)CMEMBER_PTR(m, f->quantifier_offset) != f->id) return 0;
    v = value_to_cjson(f, src, flags);
  } else {
    int present;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
        f->type != PROTOBUF_C_TYPE_STRING && f->quantifier_offset)
      present = *(const protobuf_c_boolean *)CMEMBER_PTR(m, f->quantifier_offset);
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
      present = *(const void *const *)src != NULL;
    else
      present = !is_default(f, src);
    if (!present && !emit_defaults) return 0;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && *(ProtobufCMessage *const *)src == NULL)
      v = cJSON_CreateNull();
    else
      v = value_to_cjson(f, src, flags);
  }
  if (!v) return -1;
  cJSON_AddItemToObject(obj, name, v);
  return 0;
}

cJSON *tcc_pbjson_to_cjson(const ProtobufCMessage *m, unsigned flags) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  cJSON *obj = cJSON_CreateObject();
  if (!obj) return NULL;
  for (unsigned i = 0; i < d->n_fields; i++) {
    if (add_field(obj, m, &d->fields[i], flags)) {
      cJSON_Delete(obj);
      return NULL;
    }
  }
  return obj;
}

/* cJSON indents with tabs and puts a tab after ':'; make it two spaces per
 * level and one space. Tabs inside strings are escaped, so every raw tab
 * is layout. */
static char *retab(char *s) {
  size_t n = 0, extra = 0;
  for (char *c = s; *c; c++) extra += *c == '\t';
  char *out = malloc(strlen(s) + extra + 1);
  if (!out) return s;
  int line_start = 1;
  for (char *c = s; *c; c++) {
    if (*c == '\t') {
      if (line_start) {
        out[n++] = ' ';
        out[n++] = ' ';
      } else {
        out[n++] = ' ';
      }
    } else {
      line_start = *c == '\n';
      out[n++] = *c;
    }
  }
  out[n] = '\0';
  free(s);
  return out;
}

char *tcc_pbjson_print_cjson(const cJSON *json, int pretty) {
  char *s = pretty ? cJSON_Print(json) : cJSON_PrintUnformatted(json);
  if (s && pretty) s = retab(s);
  return s;
}

char *tcc_pbjson_print_flags(const ProtobufCMessage *m, unsigned flags) {
  cJSON *tree = tcc_pbjson_to_cjson(m, flags);
  if (!tree) return NULL;
  char *s = tcc_pbjson_print_cjson(tree, (flags & TCC_PBJSON_PRETTY) != 0);
  cJSON_Delete(tree);
  return s;
}

char *tcc_pbjson_print(const ProtobufCMessage *m, int pretty) {
  return tcc_pbjson_print_flags(m, pretty ? TCC_PBJSON_PRETTY : 0);
}
