/* serve_req.c: the OpenAI request fields of `dgemma serve` on plain strings
 * (no sockets): parsing and limits, the mapping onto dg_gen_params, stop
 * strings, error JSON. See serve.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

int dg_srv_fail(dg_srv_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
  e->status = status;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  snprintf(e->code, sizeof e->code, "%s", code ? code : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return status;
}

static const char *error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

char *dg_srv_error_json(const dg_srv_error *e) {
  cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
  cJSON_AddStringToObject(o, "message", e->message);
  cJSON_AddStringToObject(o, "type", error_type(e->status));
  if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
  else cJSON_AddNullToObject(o, "param");
  if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
  else cJSON_AddNullToObject(o, "code");
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

void dg_srv_request_free(dg_srv_request *r) {
  if (!r) return;
  free(r->model);
  for (int32_t i = 0; i < r->n_msgs; i++) {
    free((char *)r->msgs[i].role);
    free((char *)r->msgs[i].content);
  }
  free(r->msgs);
  free(r->prompt);
  for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->gen_kwargs);
  memset(r, 0, sizeof *r);
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Fields a request may carry. Accepted and ignored: "user", "stream_options"
 * other than include_usage. */
static const char *const CHAT_KEYS[] = {"model", "messages", "max_tokens", "max_completion_tokens", "seed", "stop",
                                        "stream", "stream_options", "temperature", "top_p", "n", "presence_penalty",
                                        "frequency_penalty", "logprobs", "top_logprobs", "user", "dgemma", NULL};
static const char *const COMPL_KEYS[] = {"model", "prompt", "max_tokens", "seed", "stop", "stream", "stream_options",
                                         "temperature", "top_p", "n", "presence_penalty", "frequency_penalty",
                                         "logprobs", "echo", "user", "dgemma", NULL};

static int known(const char *const *keys, const char *k) {
  for (int i = 0; keys[i]; i++)
    if (!strcmp(keys[i], k)) return 1;
  return 0;
}

/* A number field that must equal `want` when present (an OpenAI option the sampler does not have). */
static int must_equal(const cJSON *root, const char *key, double want, const char *why, dg_srv_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsNumber(v)) return dg_srv_fail(err, 400, key, "invalid_type", "'%s' must be a number", key);
  if (v->valuedouble != want)
    return dg_srv_fail(err, 400, key, "unsupported_value", "'%s' = %g is not supported: %s (only %g is accepted)", key,
                       v->valuedouble, why, want);
  return 0;
}

/* An integer in [lo, hi] (JSON numbers that are whole); *out unchanged when absent or null. */
static int get_int(const cJSON *root, const char *key, double lo, double hi, double *out, int *present,
                   dg_srv_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (present) *present = 0;
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
    return dg_srv_fail(err, 400, key, "invalid_type", "'%s' must be an integer", key);
  if (v->valuedouble < lo || v->valuedouble > hi)
    return dg_srv_fail(err, 400, key, "invalid_value", "'%s' = %.0f is outside [%.0f, %.0f]", key, v->valuedouble, lo, hi);
  *out = v->valuedouble;
  if (present) *present = 1;
  return 0;
}

static int get_bool(const cJSON *root, const char *key, int *out, dg_srv_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsBool(v)) return dg_srv_fail(err, 400, key, "invalid_type", "'%s' must be a boolean", key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int message_content(const cJSON *c, int32_t i, char **out, dg_srv_error *err) {
  char param[64];
  snprintf(param, sizeof param, "messages[%d].content", i);
  if (cJSON_IsString(c)) {
    *out = dupstr(c->valuestring);
    return *out ? 0 : dg_srv_fail(err, 500, NULL, NULL, "out of memory");
  }
  if (!cJSON_IsArray(c)) return dg_srv_fail(err, 400, param, "invalid_type", "'%s' must be a string or an array of text parts", param);
  size_t n = 0;
  const cJSON *part;
  cJSON_ArrayForEach(part, c) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type"), *x = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
      return dg_srv_fail(err, 400, param, "unsupported_content",
                         "'%s': only parts {\"type\": \"text\", \"text\": ...} are supported (this model reads text only)", param);
    n += strlen(x->valuestring);
  }
  char *s = malloc(n + 1);
  if (!s) return dg_srv_fail(err, 500, NULL, NULL, "out of memory");
  s[0] = 0;
  cJSON_ArrayForEach(part, c) strcat(s, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
  *out = s;
  return 0;
}

static int parse_messages(const cJSON *root, const dg_srv_limits *lim, dg_srv_request *r, dg_srv_error *err) {
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!ms) return dg_srv_fail(err, 400, "messages", "missing_required_parameter", "'messages' is required");
  if (!cJSON_IsArray(ms)) return dg_srv_fail(err, 400, "messages", "invalid_type", "'messages' must be an array");
  int n = cJSON_GetArraySize(ms);
  if (n == 0) return dg_srv_fail(err, 400, "messages", "invalid_value", "'messages' is empty");
  if (n > lim->max_messages)
    return dg_srv_fail(err, 400, "messages", "too_many_messages", "%d messages; this server accepts at most %d", n,
                       lim->max_messages);
  r->msgs = calloc((size_t)n, sizeof *r->msgs);
  if (!r->msgs) return dg_srv_fail(err, 500, NULL, NULL, "out of memory");
  const cJSON *m;
  int32_t i = 0;
  cJSON_ArrayForEach(m, ms) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!cJSON_IsObject(m)) return dg_srv_fail(err, 400, param, "invalid_type", "'%s' must be an object", param);
    const cJSON *f;
    cJSON_ArrayForEach(f, m)
      if (strcmp(f->string, "role") && strcmp(f->string, "content") && strcmp(f->string, "name"))
        return dg_srv_fail(err, 400, param, "unknown_parameter", "'%s' has an unknown field '%s' (known: role, content, name)",
                           param, f->string);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role))
      return dg_srv_fail(err, 400, param, "invalid_type", "'%s.role' must be a string", param);
    const char *rs = role->valuestring;
    if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && strcmp(rs, "assistant"))
      return dg_srv_fail(err, 400, param, "invalid_value",
                         "'%s.role' = \"%s\": expected system, developer, user or assistant", param, rs);
    if (!c || cJSON_IsNull(c)) return dg_srv_fail(err, 400, param, "missing_required_parameter", "'%s.content' is required", param);
    r->n_msgs = i + 1;
    r->msgs[i].role = dupstr(rs);
    if (!r->msgs[i].role) return dg_srv_fail(err, 500, NULL, NULL, "out of memory");
    char *content = NULL;
    if (message_content(c, i, &content, err)) return err->status;
    r->msgs[i].content = content;
    i++;
  }
  return 0;
}

static int parse_stop(const cJSON *root, dg_srv_request *r, dg_srv_error *err) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
  if (!s || cJSON_IsNull(s)) return 0;
  if (cJSON_IsString(s)) {
    if (!s->valuestring[0]) return dg_srv_fail(err, 400, "stop", "invalid_value", "'stop' is an empty string");
    r->stop[r->n_stop++] = dupstr(s->valuestring);
    return 0;
  }
  if (!cJSON_IsArray(s)) return dg_srv_fail(err, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
  if (cJSON_GetArraySize(s) > DG_SRV_MAX_STOP)
    return dg_srv_fail(err, 400, "stop", "invalid_value", "'stop' has %d strings; at most %d are accepted",
                       cJSON_GetArraySize(s), DG_SRV_MAX_STOP);
  const cJSON *x;
  cJSON_ArrayForEach(x, s) {
    if (!cJSON_IsString(x) || !x->valuestring[0])
      return dg_srv_fail(err, 400, "stop", "invalid_type", "'stop' must hold non-empty strings");
    r->stop[r->n_stop++] = dupstr(x->valuestring);
  }
  return 0;
}

/* 1 if an earlier member of f's object has f's name: JSON leaves duplicate names to the reader (RFC 8259 4), and a
 * request that names a field twice is refused rather than read by whichever copy a lookup finds first. */
static int repeated(const cJSON *f) {
  for (const cJSON *g = f->prev; g && g->next; g = g->prev) /* cJSON: the first member's prev is the last member */
    if (g->string && !strcmp(g->string, f->string)) return 1;
  return 0;
}

static int parse_ext(const cJSON *root, dg_srv_request *r, dg_srv_error *err) {
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "dgemma");
  if (!e || cJSON_IsNull(e)) return 0;
  if (!cJSON_IsObject(e)) return dg_srv_fail(err, 400, "dgemma", "invalid_type", "'dgemma' must be an object");
  const cJSON *f;
  cJSON_ArrayForEach(f, e) {
    if (repeated(f))
      return dg_srv_fail(err, 400, "dgemma", "invalid_value", "field 'dgemma.%s' appears more than once", f->string);
    if (!strcmp(f->string, "gen_kwargs")) {
      if (!cJSON_IsObject(f))
        return dg_srv_fail(err, 400, "dgemma.gen_kwargs", "invalid_type", "'dgemma.gen_kwargs' must be an object");
      r->gen_kwargs = cJSON_PrintUnformatted(f);
    } else if (!strcmp(f->string, "draft") || !strcmp(f->string, "think")) {
      if (!cJSON_IsBool(f)) return dg_srv_fail(err, 400, "dgemma", "invalid_type", "'dgemma.%s' must be a boolean", f->string);
      *(f->string[0] == 'd' ? &r->draft : &r->think) = cJSON_IsTrue(f);
    } else {
      return dg_srv_fail(err, 400, "dgemma", "unknown_parameter",
                         "unknown field 'dgemma.%s' (known: gen_kwargs, draft, think)", f->string);
    }
  }
  return 0;
}

static int parse_fields(dg_srv_kind kind, const cJSON *root, const dg_srv_limits *lim, dg_srv_request *r,
                        dg_srv_error *err) {
  const char *const *keys = kind == DG_SRV_CHAT ? CHAT_KEYS : COMPL_KEYS;
  const cJSON *f;
  cJSON_ArrayForEach(f, root) {
    if (!known(keys, f->string))
      return dg_srv_fail(err, 400, f->string, "unknown_parameter", "unknown field '%s'", f->string);
    if (repeated(f)) return dg_srv_fail(err, 400, f->string, "invalid_value", "field '%s' appears more than once", f->string);
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (model && !cJSON_IsNull(model)) {
    if (!cJSON_IsString(model)) return dg_srv_fail(err, 400, "model", "invalid_type", "'model' must be a string");
    r->model = dupstr(model->valuestring);
  }
  if (kind == DG_SRV_CHAT) {
    if (parse_messages(root, lim, r, err)) return err->status;
  } else {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return dg_srv_fail(err, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
      p = cJSON_GetArrayItem(p, 0); /* ["text"]: one prompt */
    if (!cJSON_IsString(p))
      return dg_srv_fail(err, 400, "prompt", "invalid_type", "'prompt' must be a string (or an array of one string)");
    if (!p->valuestring[0]) return dg_srv_fail(err, 400, "prompt", "invalid_value", "'prompt' is empty");
    r->prompt = dupstr(p->valuestring);
    int echo = 0;
    if (get_bool(root, "echo", &echo, err)) return err->status;
    if (echo) return dg_srv_fail(err, 400, "echo", "unsupported_value", "'echo' = true is not supported");
  }
  double v = 0;
  int has = 0;
  const char *mt = kind == DG_SRV_CHAT && cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                       ? "max_completion_tokens" : "max_tokens";
  if (get_int(root, mt, 1, lim->max_tokens, &v, &has, err)) return err->status;
  if (has) r->max_tokens = (int32_t)v;
  if (get_int(root, "seed", 0, 9007199254740992.0, &v, &r->has_seed, err)) return err->status;
  if (r->has_seed) r->seed = (uint64_t)v;
  if (parse_stop(root, r, err)) return err->status;
  if (get_bool(root, "stream", &r->stream, err)) return err->status;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
  if (so && !cJSON_IsNull(so)) {
    if (!cJSON_IsObject(so)) return dg_srv_fail(err, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
    if (!r->stream)
      return dg_srv_fail(err, 400, "stream_options", "invalid_value", "'stream_options' is only allowed with 'stream': true");
    if (get_bool(so, "include_usage", &r->include_usage, err)) return err->status;
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
  if (t && !cJSON_IsNull(t)) {
    if (!cJSON_IsNumber(t)) return dg_srv_fail(err, 400, "temperature", "invalid_type", "'temperature' must be a number");
    if (!(t->valuedouble >= 0.0 && t->valuedouble <= 2.0))
      return dg_srv_fail(err, 400, "temperature", "invalid_value", "'temperature' = %g is outside [0, 2]", t->valuedouble);
    r->has_temperature = 1;
    r->temperature = t->valuedouble;
  }
  if (get_int(root, "n", 1, 1, &v, NULL, err)) {
    snprintf(err->message, sizeof err->message, "'n' must be 1: one choice per request");
    return err->status;
  }
  if (must_equal(root, "top_p", 1.0, "the diffusion sampler has no nucleus truncation", err) ||
      must_equal(root, "presence_penalty", 0.0, "the diffusion sampler has no penalties", err) ||
      must_equal(root, "frequency_penalty", 0.0, "the diffusion sampler has no penalties", err))
    return err->status;
  const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
  if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp))
    return dg_srv_fail(err, 400, "logprobs", "unsupported_value", "'logprobs' is not supported");
  const cJSON *tlp = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
  if (tlp && !cJSON_IsNull(tlp))
    return dg_srv_fail(err, 400, "top_logprobs", "unsupported_value", "'top_logprobs' is not supported");
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "user");
  if (u && !cJSON_IsNull(u) && !cJSON_IsString(u))
    return dg_srv_fail(err, 400, "user", "invalid_type", "'user' must be a string");
  return parse_ext(root, r, err);
}

/* The index (in document order, keys included) of the first JSON string of body[0, len) that
 * holds the escape \u0000, or -1. body is valid JSON (cJSON parsed it), so a string starts at an
 * unescaped '"' outside a string and an escape is a backslash and the character after it. */
static long nul_escape_string(const char *body, size_t len) {
  long k = -1;
  int in = 0;
  for (size_t i = 0; i < len; i++) {
    if (!in) {
      if (body[i] == '"') { in = 1; k++; }
    } else if (body[i] == '"') {
      in = 0;
    } else if (body[i] == '\\' && i + 1 < len) {
      if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4)) return k;
      i++;
    }
  }
  return -1;
}

/* The path ("messages[0].content", "stop[1]", "dgemma.gen_kwargs") of the k-th string of item's
 * subtree in document order (an object's key, then its value), into path; *k counts down. 1 if found. */
static int string_path(const cJSON *item, const char *at, long *k, char *path, size_t n) {
  if (cJSON_IsString(item) && (*k)-- == 0) return snprintf(path, n, "%s", at), 1;
  const cJSON *c;
  int i = 0;
  cJSON_ArrayForEach(c, item) {
    char sub[256];
    if (cJSON_IsObject(item)) {
      snprintf(sub, sizeof sub, "%s%s%s", at, at[0] ? "." : "", c->string);
      if ((*k)-- == 0) return snprintf(path, n, "%s", sub), 1; /* the key itself */
    } else {
      snprintf(sub, sizeof sub, "%s[%d]", at, i);
    }
    if (string_path(c, sub, k, path, n)) return 1;
    i++;
  }
  return 0;
}

int dg_srv_parse(dg_srv_kind kind, const char *body, size_t len, const dg_srv_limits *lim, dg_srv_request *out,
                 dg_srv_error *err) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  if (len > lim->max_body)
    return dg_srv_fail(err, 413, NULL, "request_too_large", "request body of %zu bytes; the limit is %zu", len, lim->max_body);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  if (!root) {
    size_t at = end && end >= body ? (size_t)(end - body) : 0;
    return dg_srv_fail(err, 400, NULL, "invalid_json", "the body is not valid JSON (error near byte %zu)", at);
  }
  int rc = 0;
  /* cJSON ends a string at a \u0000 (its strings are NUL-terminated): the text after it would be
   * dropped silently, so such a string is refused, by its field */
  long nul = nul_escape_string(body, len);
  if (!cJSON_IsObject(root)) rc = dg_srv_fail(err, 400, NULL, "invalid_json", "the body must be a JSON object");
  else if (nul >= 0) {
    char path[256] = "";
    string_path(root, "", &nul, path, sizeof path);
    rc = dg_srv_fail(err, 400, path, "invalid_value",
                     "'%s' holds the escape \\u0000 (a NUL character), which this server does not accept in text", path);
  } else rc = parse_fields(kind, root, lim, out, err);
  cJSON_Delete(root);
  if (rc) dg_srv_request_free(out);
  return rc;
}

int dg_srv_gen_params(const dg_srv_request *r, const dg_gen_params *defaults, const dg_srv_limits *lim,
                      dg_gen_params *out, dg_srv_error *err) {
  dg_gen_params p = *defaults;
  if (r->gen_kwargs && dg_gen_params_apply_json(&p, r->gen_kwargs))
    return dg_srv_fail(err, 400, "dgemma.gen_kwargs", "invalid_value", "'dgemma.gen_kwargs': %s", dg_last_error());
  if (r->max_tokens > 0) p.max_new_tokens = r->max_tokens;
  if (p.max_new_tokens > lim->max_tokens)
    return dg_srv_fail(err, 400, "max_tokens", "invalid_value", "max_new_tokens = %d is above this server's limit %d",
                       p.max_new_tokens, lim->max_tokens);
  if (r->has_seed) p.seed = r->seed;
  if (r->has_temperature) {
    if (r->temperature == 0.0) p.proposal = DG_PROPOSAL_ARGMAX;
    else {
      p.t_min = (float)(p.t_min * r->temperature);
      p.t_max = (float)(p.t_max * r->temperature);
    }
  }
  *out = p;
  return 0;
}

size_t dg_srv_stop_scan(const char *t, size_t n, char *const *stop, int32_t ns, int final, int *hit) {
  *hit = 0;
  size_t best = n;
  for (int32_t k = 0; k < ns; k++) {
    size_t l = strlen(stop[k]);
    if (!l || l > n) continue;
    for (size_t i = 0; i + l <= n && i < best; i++)
      if (!memcmp(t + i, stop[k], l)) { best = i; *hit = 1; break; }
  }
  if (*hit || final) return best;
  size_t hold = 0; /* longest suffix of t that is a proper prefix of a stop string */
  for (int32_t k = 0; k < ns; k++) {
    size_t l = strlen(stop[k]);
    if (!l) continue; /* an empty string never matches (and l - 1 would wrap around) */
    for (size_t s = l - 1; s > hold; s--)
      if (s <= n && !memcmp(t + n - s, stop[k], s)) { hold = s; break; }
  }
  return n - hold;
}

size_t dg_srv_stable_len(const char *t, size_t n) {
  while (n >= 3 && !memcmp(t + n - 3, "\xEF\xBF\xBD", 3)) n -= 3;
  return n;
}
