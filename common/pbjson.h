/*
 * pbjson.h — the proto3 JSON mapping for protobuf-c messages.
 *
 * Generic over ProtobufCMessageDescriptor: one walker serves every message
 * type, with no per-message code. The mapping follows the proto3 JSON spec
 * (https://protobuf.dev/programming-guides/json/):
 *
 *   proto                 JSON (printed)            also accepted on input
 *   --------------------  ------------------------  -------------------------
 *   field name            lowerCamelCase (jsonName) the original snake_case
 *   int32/uint32/...      number                    decimal string, 1e3
 *   int64/uint64/...      decimal string            number (|v| <= 2^53)
 *   float/double          number; "NaN",            numeric string
 *                         "Infinity", "-Infinity"
 *   bool                  true / false
 *   enum                  value name                the number
 *   string                string
 *   bytes                 base64 (standard, padded) URL-safe, unpadded
 *   message               object                    null = unset
 *   repeated              array                     null = empty
 *   oneof                 the set member only
 *
 * Defaults (0, "", false, empty) are omitted on print, except the chosen
 * member of a oneof, which is always printed (its presence is the value).
 * Unknown field names, a field given twice (by either name), two members of
 * one oneof, wrong JSON types, non-integral or out-of-range integers and
 * unknown enum names are errors whose message starts with the field path
 * as written in the input: "graph.values[2].meta.sizes[0]: not an integer".
 *
 * JSON numbers pass through cJSON as doubles, so a 64-bit integer beyond
 * 2^53 must be written as a string (as the spec's printers do); a larger
 * bare number is refused rather than silently rounded.
 *
 * Parsed messages are allocated exactly as protobuf_c_message_unpack would
 * with the default allocator, so protobuf_c_message_free_unpacked(m, NULL)
 * (or the generated *__free_unpacked) frees them.
 */
#ifndef TCC_PBJSON_H
#define TCC_PBJSON_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "tcc_status.h"

struct cJSON;

/* Flags for tcc_pbjson_print_flags / tcc_pbjson_to_cjson. */
enum {
  TCC_PBJSON_PRETTY = 1 << 0,          /* indented, one field per line */
  TCC_PBJSON_EMIT_DEFAULTS = 1 << 1,   /* print fields holding defaults too
                                          (unset messages print as null) */
  TCC_PBJSON_ORIGINAL_NAMES = 1 << 2,  /* snake_case names from the .proto */
  TCC_PBJSON_INT64_AS_NUMBER = 1 << 3, /* 64-bit integers as bare numbers
                                          (exact digits, not JSON-spec) */
  TCC_PBJSON_ENUMS_AS_INTS = 1 << 4,   /* enums as numbers */
};

/* Parses len bytes of JSON (need not be NUL-terminated) into a new message
 * of type d. Returns 0 and sets *out (free with
 * protobuf_c_message_free_unpacked(*out, NULL)), or TCC_E_INVALID_ARGUMENT
 * with *out = NULL and err naming the field path and the problem. */
int tcc_pbjson_parse(const ProtobufCMessageDescriptor *d, const char *json,
                     size_t len, ProtobufCMessage **out, tcc_error *err);

/* Same, from an already parsed cJSON value (for callers that embed a
 * message in a larger JSON document). */
int tcc_pbjson_from_cjson(const ProtobufCMessageDescriptor *d,
                          const struct cJSON *json, ProtobufCMessage **out,
                          tcc_error *err);

/* Prints m in the canonical proto3 JSON form; pretty = indented. Returns a
 * malloc'd NUL-terminated string (free()), or NULL when out of memory. */
char *tcc_pbjson_print(const ProtobufCMessage *m, int pretty);

/* Same, with TCC_PBJSON_* flags. */
char *tcc_pbjson_print_flags(const ProtobufCMessage *m, unsigned flags);

/* m as a cJSON object tree (caller cJSON_Delete()s it), for composing
 * larger documents. Numbers are cJSON raw items holding their exact JSON
 * text (so 64-bit integers and floats keep every digit); use
 * cJSON_IsRaw()/valuestring to read them. NULL when out of memory. */
struct cJSON *tcc_pbjson_to_cjson(const ProtobufCMessage *m, unsigned flags);

/* Prints any cJSON tree as pbjson prints messages (pretty: two-space
 * indent). Returns a malloc'd string (free()), or NULL. */
char *tcc_pbjson_print_cjson(const struct cJSON *json, int pretty);

/* The proto3 JSON name of a field: snake_case -> lowerCamelCase
 * ("cpu_isa" -> "cpuIsa"). Writes at most size bytes (NUL included) into
 * out; returns out. */
char *tcc_pbjson_json_name(const char *proto_name, char *out, size_t size);

#endif
