/*
 * explain.c — why a request missed: guard keys read back into named
 * components, and the graph digest that groups keys of one graph.
 *
 * A guard key (canon.c's table) is read into parts, in key order:
 *
 *   class     parts
 *   --------  ------------------------------------------------------------
 *   HEADER    key format, codegen version, compiler identity, target
 *             device, target arch, tf32 (CUDA), target features, mode,
 *             dynamic, symbols
 *   INPUT     input I dtype / sizes / strides / offset / alignment / device
 *   CONSTANT  constant I data (its length and a digest prefix)
 *   ARGUMENT  node K OP argument J (scalar arguments only: tensor
 *             arguments are the graph's wiring)
 *   VALUE     value V dtype / sizes (intermediates, derived from the
 *             above), output I strides / offset / alignment / device
 *
 * The graph digest is SHA-256 over what the parts leave out: the value
 * kinds, the ops, the argument kinds, the tensor wiring and the outputs.
 * Requests for one model that recompile -- another batch size, dtype,
 * compiler, target or mode -- share it, so the daemon finds an entry's
 * nearest neighbours by digest and names the parts that differ. Two keys
 * with one digest have the same sequence of part names (the digest covers
 * everything that decides the sequence), which tcc_key_parts_diff relies
 * on and checks.
 *
 * Keys come from the daemon's own cache, but they are read as untrusted
 * bytes all the same: every read is bounds-checked and a malformed key is
 * TCC_E_INVALID_ARGUMENT.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "graph.h"

typedef struct key_reader {
  const uint8_t *p;
  size_t len, off;
  int bad;
  tcc_sha256_ctx graph; /* the graph digest, fed as the parts are read */
} key_reader;

static const uint8_t *take(key_reader *r, size_t n) {
  if (r->bad || n > r->len - r->off) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *at = r->p + r->off;
  r->off += n;
  return at;
}

static uint64_t get_le(key_reader *r, size_t n) {
  const uint8_t *at = take(r, n);
  uint64_t v = 0;
  for (size_t i = 0; at && i < n; i++) v |= (uint64_t)at[i] << (8 * i);
  return v;
}

static unsigned get_u8(key_reader *r) { return (unsigned)get_le(r, 1); }
static uint32_t get_u32(key_reader *r) { return (uint32_t)get_le(r, 4); }
static int64_t get_i64(key_reader *r) { return (int64_t)get_le(r, 8); }

static double get_f64(key_reader *r) {
  uint64_t bits = get_le(r, 8);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* A str field: its bytes and length (not NUL-terminated). */
static const char *get_str(key_reader *r, size_t *n) {
  *n = get_u32(r);
  return (const char *)take(r, *n);
}

/* Feeds the graph digest with a structural field (little-endian u32). */
static void digest_u32(key_reader *r, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  tcc_sha256_update(&r->graph, b, sizeof b);
}

/* ------------------------------------------------------------ parts */

typedef struct parts_builder {
  tcc_key_parts *out;
  size_t cap;
  size_t (*offs)[2]; /* each part's name and value offsets in text */
  tcc_buf text;      /* names and values, NUL-terminated */
  int oom;
} parts_builder;

/* Appends a part named `name` whose value is printf'd. */
static void add_part(parts_builder *b, tcc_key_part_class cls, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_part(parts_builder *b, tcc_key_part_class cls, const char *name, const char *fmt, ...) {
  if (b->oom) return;
  tcc_key_parts *o = b->out;
  if (o->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    tcc_key_part *p = realloc(o->parts, cap * sizeof *p);
    if (p) o->parts = p;
    size_t(*offs)[2] = p ? realloc(b->offs, cap * sizeof *offs) : NULL;
    if (!offs) {
      b->oom = 1;
      return;
    }
    b->offs = offs;
    b->cap = cap;
  }
  b->offs[o->n][0] = b->text.len;
  tcc_buf_put(&b->text, name, strlen(name) + 1);
  b->offs[o->n][1] = b->text.len;
  va_list ap;
  va_start(ap, fmt);
  tcc_buf_vprintf(&b->text, fmt, ap);
  va_end(ap);
  tcc_buf_put(&b->text, "", 1);
  if (b->text.failed) {
    b->oom = 1;
    return;
  }
  o->parts[o->n++] = (tcc_key_part){.cls = cls};
}

/* "[8, 128]" with dynamic-shape markers: s<N> for symbol N, "derived"
 * for a number the graph derives from the symbols. */
static void format_dims(char *buf, size_t cap, const int64_t *v, int n) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && k < cap; i++) {
    const char *sep = i ? ", " : "";
    if (v[i] == TCC_KEY_DERIVED) k += (size_t)snprintf(buf + k, cap - k, "%sderived", sep);
    else if (v[i] < 0) k += (size_t)snprintf(buf + k, cap - k, "%ss%" PRId64, sep, -1 - v[i]);
    else k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, sep, v[i]);
  }
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

static const char *enum_text(const ProtobufCEnumDescriptor *d, int v, char *buf, size_t cap) {
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);
  if (ev) return ev->name;
  snprintf(buf, cap, "%d", v);
  return buf;
}

static void read_header(key_reader *r, parts_builder *b, uint32_t *format) {
  char buf[64];
  size_t n;
  const uint8_t *magic = take(r, 4);
  if (!magic || memcmp(magic, "TCCK", 4) != 0) {
    r->bad = 1;
    return;
  }
  tcc_sha256_update(&r->graph, "tccd-graph-v1", 14);
  *format = get_u32(r);
  add_part(b, TCC_KEY_HEADER, "key format", "%" PRIu32, *format);
  add_part(b, TCC_KEY_HEADER, "codegen version", "%" PRIu32, get_u32(r));
  const char *s = get_str(r, &n);
  add_part(b, TCC_KEY_HEADER, "compiler identity", "%.*s", s ? (int)n : 0, s ? s : "");
  unsigned dev = get_u8(r);
  add_part(b, TCC_KEY_HEADER, "target device", "%s",
           enum_text(&tcc__v1__device_type__descriptor, (int)dev, buf, sizeof buf));
  s = get_str(r, &n);
  add_part(b, TCC_KEY_HEADER, "target arch", "%.*s", s ? (int)n : 0, s ? s : "");
  if (dev == TCC__V1__DEVICE_TYPE__CUDA) {
    unsigned tf32 = get_u8(r);
    add_part(b, TCC_KEY_HEADER, "tf32", "convolutions %s, matmuls %s", tf32 & 1 ? "yes" : "no",
             tf32 & 2 ? "yes" : "no");
  }
  uint32_t nfeat = get_u32(r);
  tcc_buf feats = {0};
  for (uint32_t i = 0; i < nfeat && !r->bad; i++) {
    s = get_str(r, &n);
    if (s) tcc_buf_printf(&feats, "%s%.*s", i ? "," : "", (int)n, s);
  }
  add_part(b, TCC_KEY_HEADER, "target features", "%s", feats.data && feats.len ? feats.data : "-");
  tcc_buf_free(&feats);
  add_part(b, TCC_KEY_HEADER, "mode", "%s", enum_text(&tcc__v1__mode__descriptor, (int)get_u8(r), buf, sizeof buf));
  add_part(b, TCC_KEY_HEADER, "dynamic", "%s", get_u8(r) ? "true" : "false");
  add_part(b, TCC_KEY_HEADER, "symbols", "%" PRIu32, *format == 2 ? get_u32(r) : 0);
}

/* One value of the key: kind, dtype, rank, sizes, ABI layout, constant
 * data. Inputs, constants and outputs are named by their position among
 * their kind; intermediates by value id. */
static void read_value(key_reader *r, parts_builder *b, uint32_t v, int *input_no, int *const_no,
                       const int *output_no) {
  unsigned kind = get_u8(r), dtype = get_u8(r), rank = get_u8(r);
  digest_u32(r, kind);
  if (rank > TCC_MAX_DIMS) r->bad = 1;
  if (r->bad) return;
  int64_t sizes[TCC_MAX_DIMS], strides[TCC_MAX_DIMS];
  for (unsigned d = 0; d < rank; d++) sizes[d] = get_i64(r);
  char who[64], name[96], dims[TCC_MAX_DIMS * 24 + 8];
  tcc_key_part_class cls = kind == 0 ? TCC_KEY_INPUT : TCC_KEY_VALUE;
  if (kind == 0) snprintf(who, sizeof who, "input %d", (*input_no)++);
  else if (kind == 1) snprintf(who, sizeof who, "constant %d", *const_no);
  else if (output_no[v] >= 0) snprintf(who, sizeof who, "output %d", output_no[v]);
  else snprintf(who, sizeof who, "value %" PRIu32, v);
  snprintf(name, sizeof name, "%s dtype", who);
  add_part(b, cls, name, "%s", tcc_dtype_name((tcc_dtype)dtype));
  format_dims(dims, sizeof dims, sizes, (int)rank);
  snprintf(name, sizeof name, "%s sizes", who);
  add_part(b, cls, name, "%s", dims);
  unsigned abi = get_u8(r);
  digest_u32(r, abi);
  if (abi) {
    for (unsigned d = 0; d < rank; d++) strides[d] = get_i64(r);
    int64_t offset = get_i64(r);
    unsigned align = get_u8(r), device = get_u8(r);
    char buf[32];
    format_dims(dims, sizeof dims, strides, (int)rank);
    snprintf(name, sizeof name, "%s strides", who);
    add_part(b, cls, name, "%s", dims);
    snprintf(name, sizeof name, "%s offset", who);
    format_dims(dims, sizeof dims, &offset, 1);
    add_part(b, cls, name, "%.*s", (int)strlen(dims) - 2, dims + 1);
    snprintf(name, sizeof name, "%s alignment", who);
    add_part(b, cls, name, "%u bytes", align);
    snprintf(name, sizeof name, "%s device", who);
    add_part(b, cls, name, "%s", enum_text(&tcc__v1__device_type__descriptor, (int)device, buf, sizeof buf));
  }
  if (kind == 1) {
    uint64_t n = (uint64_t)get_i64(r);
    const uint8_t *data = n <= r->len ? take(r, (size_t)n) : NULL;
    if (!data) {
      r->bad = 1;
      return;
    }
    uint8_t sha[TCC_SHA256_BYTES];
    tcc_sha256(data, (size_t)n, sha);
    snprintf(name, sizeof name, "constant %d data", (*const_no)++);
    add_part(b, TCC_KEY_CONSTANT, name, "%" PRIu64 " bytes, sha256 %02x%02x%02x%02x%02x%02x", n, sha[0], sha[1],
             sha[2], sha[3], sha[4], sha[5]);
  }
}

/* A scalar argument's text ("[1, -1]", "0.125", "True"); tensor
 * arguments feed the digest instead and give no part (returns 0). */
static int read_arg(key_reader *r, tcc_buf *t) {
  unsigned kind = get_u8(r);
  digest_u32(r, kind);
  uint32_t n;
  switch (kind) {
  case TCC_ARG_NONE: tcc_buf_puts(t, "None"); return 1;
  case TCC_ARG_TENSOR: digest_u32(r, get_u32(r)); return 0;
  case TCC_ARG_TENSORS:
    n = get_u32(r);
    digest_u32(r, n);
    for (uint32_t i = 0; i < n && !r->bad; i++) digest_u32(r, get_u32(r));
    return 0;
  case TCC_ARG_INT:
  case TCC_ARG_DTYPE:
  case TCC_ARG_DEVICE: tcc_buf_printf(t, "%" PRId64, get_i64(r)); return 1;
  case TCC_ARG_BOOL: tcc_buf_puts(t, get_i64(r) ? "True" : "False"); return 1;
  case TCC_ARG_FLOAT: tcc_buf_printf(t, "%.17g", get_f64(r)); return 1;
  case TCC_ARG_INTS:
  case TCC_ARG_FLOATS:
  case TCC_ARG_BOOLS:
    n = get_u32(r);
    if (n > r->len) r->bad = 1;
    tcc_buf_puts(t, "[");
    for (uint32_t i = 0; i < n && !r->bad; i++) {
      if (i) tcc_buf_puts(t, ", ");
      if (kind == TCC_ARG_INTS) tcc_buf_printf(t, "%" PRId64, get_i64(r));
      else if (kind == TCC_ARG_FLOATS) tcc_buf_printf(t, "%.17g", get_f64(r));
      else tcc_buf_puts(t, get_u8(r) ? "True" : "False");
    }
    tcc_buf_puts(t, "]");
    return 1;
  case TCC_ARG_STRING: {
    size_t len;
    const char *s = get_str(r, &len);
    if (s) tcc_buf_printf(t, "'%.*s'", (int)len, s);
    return 1;
  }
  default: r->bad = 1; return 0;
  }
}

static void read_node(key_reader *r, parts_builder *b, uint32_t k) {
  size_t n;
  const char *op = get_str(r, &n);
  if (!op || n > 200) {
    r->bad = 1;
    return;
  }
  tcc_sha256_update(&r->graph, op, n);
  uint32_t nargs = get_u32(r);
  digest_u32(r, nargs);
  for (uint32_t a = 0; a < nargs && !r->bad; a++) {
    tcc_buf t = {0};
    if (read_arg(r, &t)) {
      char name[256];
      snprintf(name, sizeof name, "node %" PRIu32 " %.*s argument %" PRIu32, k, (int)n, op, a);
      add_part(b, TCC_KEY_ARGUMENT, name, "%s", t.data && !t.failed ? t.data : "?");
    }
    tcc_buf_free(&t);
  }
  uint32_t nout = get_u32(r);
  digest_u32(r, nout);
  for (uint32_t o = 0; o < nout && !r->bad; o++) digest_u32(r, get_u32(r));
}

/* The output position of each value (-1: not an output), from the key's
 * trailing output list; the first position wins. */
static int *output_positions(const uint8_t *key, size_t len, size_t outputs_at, uint32_t nvalues,
                             uint32_t noutputs) {
  int *pos = malloc(((size_t)nvalues + 1) * sizeof *pos);
  if (!pos) return NULL;
  for (uint32_t v = 0; v <= nvalues; v++) pos[v] = -1;
  for (uint32_t i = 0; i < noutputs; i++) {
    size_t at = outputs_at + 4 * (size_t)i;
    if (at + 4 > len) break;
    uint32_t v = (uint32_t)key[at] | (uint32_t)key[at + 1] << 8 | (uint32_t)key[at + 2] << 16 |
                 (uint32_t)key[at + 3] << 24;
    if (v < nvalues && pos[v] < 0) pos[v] = (int)i;
  }
  return pos;
}

int tcc_key_parts_read(const uint8_t *key, size_t len, tcc_key_parts *out, tcc_error *err) {
  memset(out, 0, sizeof *out);
  key_reader r = {.p = key, .len = key ? len : 0};
  parts_builder b = {.out = out};
  tcc_sha256_init(&r.graph);
  uint32_t format = 0;
  read_header(&r, &b, &format);
  uint32_t nvalues = get_u32(&r), ninputs = get_u32(&r), nnodes = get_u32(&r), noutputs = get_u32(&r);
  digest_u32(&r, nvalues);
  digest_u32(&r, ninputs);
  digest_u32(&r, nnodes);
  digest_u32(&r, noutputs);
  if (r.bad || (format != 1 && format != 2) || nvalues > len || nnodes > len || noutputs > len) r.bad = 1;
  int *outputs = NULL;
  if (!r.bad) {
    /* outputs come last, so they can name the values before we reach them */
    size_t outputs_at = noutputs * 4 <= len ? len - noutputs * 4 : 0;
    outputs = output_positions(key, len, outputs_at, nvalues, noutputs);
    if (!outputs) b.oom = 1;
  }
  int input_no = 0, const_no = 0;
  for (uint32_t v = 0; v < nvalues && !r.bad && !b.oom; v++) read_value(&r, &b, v, &input_no, &const_no, outputs);
  for (uint32_t k = 0; k < nnodes && !r.bad && !b.oom; k++) read_node(&r, &b, k);
  for (uint32_t i = 0; i < noutputs && !r.bad; i++) digest_u32(&r, get_u32(&r));
  free(outputs);
  if (!r.bad && r.off != r.len) r.bad = 1;
  if (b.oom || r.bad) {
    tcc_buf_free(&b.text);
    free(b.offs);
    free(out->parts);
    memset(out, 0, sizeof *out);
    if (b.oom) return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory reading a guard key");
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "malformed guard key (%zu bytes, stopped at byte %zu)", len,
                         r.off);
  }
  tcc_sha256_final(&r.graph, out->graph);
  size_t text_len;
  out->text = tcc_buf_take(&b.text, &text_len);
  if (!out->text) { /* an empty key has no parts and no text */
    out->text = calloc(1, 1);
    if (!out->text) {
      free(b.offs);
      free(out->parts);
      memset(out, 0, sizeof *out);
      return tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory reading a guard key");
    }
  }
  for (size_t i = 0; i < out->n; i++) { /* offsets become pointers now the text stays put */
    out->parts[i].name = out->text + b.offs[i][0];
    out->parts[i].value = out->text + b.offs[i][1];
  }
  free(b.offs);
  out->ninputs = (int)ninputs;
  return 0;
}

void tcc_key_parts_free(tcc_key_parts *p) {
  if (!p) return;
  free(p->parts);
  free(p->text);
  memset(p, 0, sizeof *p);
}

int tcc_key_graph_digest(const uint8_t *key, size_t len, uint8_t out[TCC_SHA256_BYTES]) {
  tcc_key_parts parts;
  tcc_error err;
  if (tcc_key_parts_read(key, len, &parts, &err) != 0) return -1;
  memcpy(out, parts.graph, TCC_SHA256_BYTES);
  tcc_key_parts_free(&parts);
  return 0;
}

int tcc_key_parts_diff(const tcc_key_parts *a, const tcc_key_parts *b, tcc_key_diff_fn fn, void *arg) {
  if (memcmp(a->graph, b->graph, TCC_SHA256_BYTES) != 0 || a->n != b->n) return -1;
  int differing = 0;
  for (size_t i = 0; i < a->n; i++) {
    const tcc_key_part *pa = &a->parts[i], *pb = &b->parts[i];
    if (pa->cls != pb->cls || strcmp(pa->name, pb->name) != 0) return -1;
    if (strcmp(pa->value, pb->value) == 0) continue;
    differing++;
    if (fn) fn(arg, pa, pb);
  }
  return differing;
}
