/*
 * schema.c — PyTorch FunctionSchema parsing, and the lookups of a parsed
 * schema's parameters that the op handlers use (optable.c holds the table
 * of ops, whose schemas it parses here).
 *
 * Grammar accepted (the subset of torchgen's that native_functions.yaml
 * uses for the ops we lower):
 *
 *   schema  := [ns "::"] name ["." overload] "(" [param {"," param}] ")"
 *              "->" returns
 *   param   := "*" | type ident ["=" default]
 *   type    := base ["(" alias ")"] {"[" [N] "]" | "?"}
 *   base    := Tensor | Scalar | int | SymInt | float | bool | str |
 *              ScalarType | Layout | Device | MemoryFormat | Generator
 *   returns := type [ident] | "(" [type [ident] {"," type [ident]}] ")"
 *   default := None | True | False | integer | float | "[" ints "]" |
 *              'string' | "string" | ident   (ident: e.g. contiguous_format)
 *
 * "?" before "[]" makes the elements optional (Tensor?[]), after it the
 * whole list (int[]?). An alias containing "!" marks a mutated argument.
 */
#include "graph.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ parser */

typedef struct schema_parser {
  const char *text;
  size_t pos;
  tcc_error *err;
} schema_parser;

static int sp_fail(schema_parser *p, const char *what) {
  return tcc_error_set(p->err, TCC_E_INVALID_ARGUMENT,
                       "schema \"%.120s\": %s at offset %zu", p->text, what, p->pos);
}

static void sp_ws(schema_parser *p) {
  while (p->text[p->pos] == ' ' || p->text[p->pos] == '\t') p->pos++;
}

/* Consumes `tok` (after blanks) when it is next; returns 1 if it was. */
static int sp_eat(schema_parser *p, const char *tok) {
  sp_ws(p);
  size_t n = strlen(tok);
  if (strncmp(p->text + p->pos, tok, n) != 0) return 0;
  p->pos += n;
  return 1;
}

/* Reads an identifier into out (cap bytes). Returns 0 or an error. */
static int sp_ident(schema_parser *p, char *out, size_t cap) {
  sp_ws(p);
  size_t start = p->pos;
  const char *s = p->text;
  if (!(isalpha((unsigned char)s[p->pos]) || s[p->pos] == '_'))
    return sp_fail(p, "expected a name");
  while (isalnum((unsigned char)s[p->pos]) || s[p->pos] == '_') p->pos++;
  size_t n = p->pos - start;
  if (n >= cap) return sp_fail(p, "name too long");
  memcpy(out, s + start, n);
  out[n] = '\0';
  return 0;
}

static const struct {
  const char *name;
  tcc_ptype type;
} base_types[] = {
  {"Tensor", TCC_PT_TENSOR},   {"Scalar", TCC_PT_SCALAR},
  {"int", TCC_PT_INT},         {"SymInt", TCC_PT_INT},
  {"float", TCC_PT_FLOAT},     {"bool", TCC_PT_BOOL},
  {"str", TCC_PT_STR},         {"ScalarType", TCC_PT_SCALARTYPE},
  {"Layout", TCC_PT_LAYOUT},   {"Device", TCC_PT_DEVICE},
  {"MemoryFormat", TCC_PT_MEMFMT}, {"Generator", TCC_PT_GENERATOR},
};

/* type := base [alias] {"[" [N] "]" | "?"} — fills the type fields of q. */
static int sp_type(schema_parser *p, tcc_param *q) {
  char base[TCC_NAME_MAX];
  int rc = sp_ident(p, base, sizeof base);
  if (rc) return rc;
  size_t i, nb = sizeof base_types / sizeof base_types[0];
  for (i = 0; i < nb; i++)
    if (strcmp(base, base_types[i].name) == 0) break;
  if (i == nb) return sp_fail(p, "unknown type");
  q->type = base_types[i].type;
  if (p->text[p->pos] == '(') {                  /* alias annotation */
    const char *close = strchr(p->text + p->pos, ')');
    if (!close) return sp_fail(p, "unterminated alias annotation");
    for (const char *c = p->text + p->pos; c < close; c++)
      if (*c == '!') q->mutates = 1;
    p->pos = (size_t)(close - p->text) + 1;
  }
  int q_pending = 0;
  for (;;) {
    char c = p->text[p->pos];
    if (c == '?') {
      p->pos++;
      if (q->is_list) q->optional = 1;
      else q_pending = 1;
    } else if (c == '[') {
      if (q->is_list) return sp_fail(p, "nested list type");
      p->pos++;
      char *end;
      errno = 0;
      long n = strtol(p->text + p->pos, &end, 10);
      if (end != p->text + p->pos) {
        if (errno || n <= 0 || n > TCC_DEFAULT_MAX_INTS)
          return sp_fail(p, "bad list length");
        q->list_len = (int)n;
        p->pos = (size_t)(end - p->text);
      }
      if (p->text[p->pos] != ']') return sp_fail(p, "expected ']'");
      p->pos++;
      q->is_list = 1;
      if (q_pending) {
        q->elem_optional = 1;
        q_pending = 0;
      }
    } else {
      break;
    }
  }
  if (q_pending) q->optional = 1;
  return 0;
}

/* Parses "[1, 2]" (or a single integer) into d->ints. */
static int sp_int_list(schema_parser *p, const char *tok, tcc_default *d, int is_bool) {
  const char *s = tok;
  if (*s != '[') return sp_fail(p, "expected a list default");
  s++;
  d->n = 0;
  for (;;) {
    while (*s == ' ') s++;
    if (*s == ']') break;
    if (d->n == TCC_DEFAULT_MAX_INTS) return sp_fail(p, "default list too long");
    char *end;
    if (is_bool) {
      if (strncmp(s, "True", 4) == 0) { d->ints[d->n++] = 1; end = (char *)s + 4; }
      else if (strncmp(s, "False", 5) == 0) { d->ints[d->n++] = 0; end = (char *)s + 5; }
      else return sp_fail(p, "bad bool in default list");
    } else {
      errno = 0;
      long long v = strtoll(s, &end, 10);
      if (end == s || errno) return sp_fail(p, "bad integer in default list");
      d->ints[d->n++] = v;
    }
    s = end;
    while (*s == ' ') s++;
    if (*s == ',') s++;
    else if (*s != ']') return sp_fail(p, "expected ',' or ']' in default list");
  }
  return 0;
}

static int is_integer_token(const char *t) {
  if (*t == '-') t++;
  if (!*t) return 0;
  for (; *t; t++)
    if (!isdigit((unsigned char)*t)) return 0;
  return 1;
}

/* default := ... ; interprets the token by the parameter's type. */
static int sp_default(schema_parser *p, tcc_param *q) {
  sp_ws(p);
  size_t start = p->pos;
  int depth = 0;
  char quote = 0;
  for (;; p->pos++) {
    char c = p->text[p->pos];
    if (!c) return sp_fail(p, "unterminated default");
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') quote = c;
    else if (c == '[') depth++;
    else if (c == ']') depth--;
    else if ((c == ',' || c == ')') && depth == 0) break;
  }
  size_t n = p->pos;
  while (n > start && p->text[n - 1] == ' ') n--;
  char tok[128];
  if (n - start >= sizeof tok || n == start) return sp_fail(p, "bad default");
  memcpy(tok, p->text + start, n - start);
  tok[n - start] = '\0';

  tcc_default *d = &q->def;
  q->has_default = 1;
  if (strcmp(tok, "None") == 0) {
    if (!q->optional) return sp_fail(p, "None default on a non-optional parameter");
    d->kind = TCC_ARG_NONE;
    return 0;
  }
  if (q->is_list) {
    tcc_arg_kind k = q->type == TCC_PT_INT ? TCC_ARG_INTS
                   : q->type == TCC_PT_BOOL ? TCC_ARG_BOOLS : TCC_ARG_NONE;
    if (k == TCC_ARG_NONE) return sp_fail(p, "unsupported list default");
    d->kind = k;
    if (tok[0] != '[' && k == TCC_ARG_INTS && is_integer_token(tok)) {
      /* "int[2] stride=1": one value for every element */
      int len = q->list_len ? q->list_len : 1;
      d->n = len;
      for (int i = 0; i < len; i++) d->ints[i] = strtoll(tok, NULL, 10);
      return 0;
    }
    return sp_int_list(p, tok, d, k == TCC_ARG_BOOLS);
  }
  switch (q->type) {
  case TCC_PT_BOOL:
    if (strcmp(tok, "True") && strcmp(tok, "False")) return sp_fail(p, "bad bool default");
    d->kind = TCC_ARG_BOOL;
    d->i = tok[0] == 'T';
    return 0;
  case TCC_PT_INT:
    if (!is_integer_token(tok)) return sp_fail(p, "bad int default");
    errno = 0;
    d->i = strtoll(tok, NULL, 10);
    if (errno) return sp_fail(p, "int default out of range");
    d->kind = TCC_ARG_INT;
    return 0;
  case TCC_PT_FLOAT:
  case TCC_PT_SCALAR: {
    if (q->type == TCC_PT_SCALAR && (!strcmp(tok, "True") || !strcmp(tok, "False"))) {
      d->kind = TCC_ARG_BOOL;
      d->i = tok[0] == 'T';
      return 0;
    }
    if (q->type == TCC_PT_SCALAR && is_integer_token(tok)) {
      errno = 0;
      d->i = strtoll(tok, NULL, 10);
      if (errno) return sp_fail(p, "int default out of range");
      d->kind = TCC_ARG_INT;
      return 0;
    }
    char *end;
    d->f = strtod(tok, &end);
    if (*end) return sp_fail(p, "bad float default");
    d->kind = TCC_ARG_FLOAT;
    return 0;
  }
  case TCC_PT_STR:
    if ((tok[0] == '\'' || tok[0] == '"') && n - start >= 2 && tok[n - start - 1] == tok[0]) {
      size_t len = n - start - 2;
      if (len >= sizeof d->s) return sp_fail(p, "string default too long");
      memcpy(d->s, tok + 1, len);
      d->s[len] = '\0';
      d->kind = TCC_ARG_STRING;
      return 0;
    }
    return sp_fail(p, "bad string default");
  case TCC_PT_SCALARTYPE:
  case TCC_PT_LAYOUT:
  case TCC_PT_DEVICE:
  case TCC_PT_MEMFMT:
    /* "long", "strided", "contiguous_format": kept as text */
    if (strlen(tok) >= sizeof d->s) return sp_fail(p, "default too long");
    strcpy(d->s, tok);
    d->kind = TCC_ARG_STRING;
    return 0;
  default:
    return sp_fail(p, "unsupported default");
  }
}

int tcc_schema_parse(const char *text, tcc_schema *out, tcc_error *err) {
  schema_parser p = {.text = text ? text : "", .pos = 0, .err = err};
  memset(out, 0, sizeof *out);
  int rc = sp_ident(&p, out->name, sizeof out->name);
  if (rc) return rc;
  if (sp_eat(&p, "::")) {                       /* "aten::add" */
    rc = sp_ident(&p, out->name, sizeof out->name);
    if (rc) return rc;
  }
  if (p.text[p.pos] == '.') {
    p.pos++;
    rc = sp_ident(&p, out->overload, sizeof out->overload);
    if (rc) return rc;
  }
  if (!sp_eat(&p, "(")) return sp_fail(&p, "expected '('");
  int kwarg_only = 0;
  if (!sp_eat(&p, ")")) {
    for (;;) {
      if (sp_eat(&p, "*")) {
        if (kwarg_only) return sp_fail(&p, "second '*'");
        kwarg_only = 1;
      } else {
        if (out->nparams == TCC_SCHEMA_MAX_PARAMS) return sp_fail(&p, "too many parameters");
        tcc_param *q = &out->params[out->nparams];
        rc = sp_type(&p, q);
        if (rc) return rc;
        rc = sp_ident(&p, q->name, sizeof q->name);
        if (rc) return rc;
        for (int j = 0; j < out->nparams; j++)
          if (strcmp(out->params[j].name, q->name) == 0)
            return sp_fail(&p, "duplicate parameter name");
        q->kwarg_only = kwarg_only;
        if (sp_eat(&p, "=")) {
          rc = sp_default(&p, q);
          if (rc) return rc;
        }
        out->nparams++;
      }
      if (sp_eat(&p, ")")) break;
      if (!sp_eat(&p, ",")) return sp_fail(&p, "expected ',' or ')'");
    }
  }
  if (!sp_eat(&p, "->")) return sp_fail(&p, "expected '->'");
  sp_ws(&p);
  int paren = sp_eat(&p, "(");
  if (paren && sp_eat(&p, ")")) {
    out->nreturns = 0;
  } else {
    for (;;) {
      tcc_param r;
      memset(&r, 0, sizeof r);
      rc = sp_type(&p, &r);
      if (rc) return rc;
      sp_ws(&p);
      if (isalpha((unsigned char)p.text[p.pos]) || p.text[p.pos] == '_') {
        char ignored[TCC_NAME_MAX];
        rc = sp_ident(&p, ignored, sizeof ignored);   /* named return */
        if (rc) return rc;
      }
      if (r.is_list) {
        if (r.type != TCC_PT_TENSOR || paren) return sp_fail(&p, "unsupported list return");
        out->nreturns = -1;
      } else {
        if (out->nreturns == TCC_SCHEMA_MAX_RETURNS) return sp_fail(&p, "too many returns");
        out->returns[out->nreturns++] = r.type;
      }
      if (!paren) break;
      if (sp_eat(&p, ")")) break;
      if (!sp_eat(&p, ",")) return sp_fail(&p, "expected ',' or ')' in returns");
    }
  }
  sp_ws(&p);
  if (p.text[p.pos]) return sp_fail(&p, "trailing text");
  return 0;
}

int tcc_schema_param(const tcc_schema *s, const char *name) {
  for (int i = 0; i < s->nparams; i++)
    if (strcmp(s->params[i].name, name) == 0) return i;
  return -1;
}

const char *tcc_param_type_str(const tcc_param *p, char *buf, size_t cap) {
  const char *base = "?";
  for (size_t i = 0; i < sizeof base_types / sizeof base_types[0]; i++)
    if (base_types[i].type == p->type) {
      base = base_types[i].name;
      break;
    }
  char list[16] = "";
  if (p->is_list) {
    if (p->list_len) snprintf(list, sizeof list, "[%d]", p->list_len);
    else strcpy(list, "[]");
  }
  snprintf(buf, cap, "%s%s%s%s", base, p->elem_optional ? "?" : "", list,
           p->optional ? "?" : "");
  return buf;
}

const char *tcc_arg_kind_name(tcc_arg_kind k) {
  switch (k) {
  case TCC_ARG_NONE: return "None";
  case TCC_ARG_TENSOR: return "Tensor";
  case TCC_ARG_INT: return "int";
  case TCC_ARG_FLOAT: return "float";
  case TCC_ARG_BOOL: return "bool";
  case TCC_ARG_INTS: return "int list";
  case TCC_ARG_FLOATS: return "float list";
  case TCC_ARG_BOOLS: return "bool list";
  case TCC_ARG_TENSORS: return "Tensor list";
  case TCC_ARG_DTYPE: return "dtype";
  case TCC_ARG_STRING: return "string";
  case TCC_ARG_DEVICE: return "Device";
  }
  return "?";
}
