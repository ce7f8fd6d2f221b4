/* chat.c: the Gemma 4 large-model chat template (the chat_template.jinja that
 * DiffusionGemma ships, copied from google/gemma-4-26B-A4B-it), text-only
 * subset, rendered straight to token ids. Spec section 2.
 *
 * The template, as far as text messages go (add_generation_prompt = true):
 *
 *   {{ bos_token }}
 *   if enable_thinking or messages[0].role in [system, developer]:
 *       '<|turn>system\n'
 *       if enable_thinking: '<|think|>\n'
 *       if messages[0].role in [system, developer]:
 *           messages[0].content | trim ; loop_messages = messages[1:]
 *       '<turn|>\n'
 *   for message in loop_messages:
 *       role = 'model' if message.role == 'assistant' else message.role
 *       unless (role == 'model' and the previous loop message's role == 'assistant'):
 *           '<|turn>' + role + '\n'
 *       role == 'model' ? strip_thinking(content) : content | trim
 *       '<turn|>\n'
 *   '<|turn>model\n'
 *   if not enable_thinking: '<|channel>thought\n<channel|>'
 *
 * strip_thinking(text) drops every '<|channel>' ... '<channel|>' span (split on
 * '<channel|>', keep each part up to its first '<|channel>') and trims.
 * `trim` is Python's str.strip(): Unicode whitespace at both ends.
 *
 * Control tokens are emitted by id. The text between two control tokens is
 * collected and encoded in one piece with parse_special = 0, so user text that
 * spells a control token stays text; otherwise the ids equal tokenizing the
 * rendered string with special parsing (text pieces end where the string
 * has a special token, which is where the library splits as well).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dg_error.h"
#include "io/tokenizer.h"

/* Python str.isspace() code points (what Jinja's trim strips). */
static int py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decode the code point starting at s[i] (valid UTF-8); *l = its length. */
static uint32_t cp_at(const char *s, size_t i, size_t *l) {
  const unsigned char *u = (const unsigned char *)s + i;
  if (u[0] < 0x80) { *l = 1; return u[0]; }
  if (u[0] < 0xE0) { *l = 2; return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); }
  if (u[0] < 0xF0) { *l = 3; return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F); }
  *l = 4;
  return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

/* Trim s[*a..*b) in place (valid UTF-8). */
static void py_strip(const char *s, size_t *a, size_t *b) {
  size_t l;
  while (*a < *b && py_isspace(cp_at(s, *a, &l))) *a += l;
  while (*b > *a) {
    size_t p = *b - 1;
    while (p > *a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    if (!py_isspace(cp_at(s, p, &l))) break;
    *b = p;
  }
}

/* The ids being built plus the text collected since the last control token. */
typedef struct {
  const dg_tokenizer *t;
  int32_t *ids;
  size_t n, cap;
  char *text;
  size_t tn, tcap;
} chat_out;

static dg_status put_text(chat_out *o, const char *s, size_t n) {
  if (o->tn + n + 1 > o->tcap) {
    size_t c = o->tcap ? o->tcap : 256;
    while (c < o->tn + n + 1) c *= 2;
    char *p = realloc(o->text, c);
    if (!p) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    o->text = p;
    o->tcap = c;
  }
  memcpy(o->text + o->tn, s, n);
  o->tn += n;
  return DG_OK;
}

static dg_status put_id(chat_out *o, int32_t id) {
  if (o->n == o->cap) {
    size_t c = o->cap ? 2 * o->cap : 64;
    int32_t *p = realloc(o->ids, c * sizeof *p);
    if (!p) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    o->ids = p;
    o->cap = c;
  }
  o->ids[o->n++] = id;
  return DG_OK;
}

/* Encode the pending text (plain text: parse_special = 0) and append it. */
static dg_status flush_text(chat_out *o) {
  if (!o->tn) return DG_OK;
  int32_t *ids = NULL;
  size_t n = 0;
  DG_TRY(dg_tokenizer_encode(o->t, o->text, o->tn, 0, &ids, &n));
  o->tn = 0;
  dg_status st = DG_OK;
  for (size_t i = 0; i < n && !st; i++) st = put_id(o, ids[i]);
  free(ids);
  return st;
}

/* Emit a control token: flush the text before it, then its id. */
static dg_status put_ctl(chat_out *o, int32_t id) {
  DG_TRY(flush_text(o));
  return put_id(o, id);
}

static dg_status put_str(chat_out *o, const char *s) { return put_text(o, s, strlen(s)); }

/* Content of a model turn: drop <|channel>...<channel|> spans, then trim. */
static dg_status put_model_content(chat_out *o, const char *s, size_t n) {
  static const char open[] = "<|channel>", close[] = "<channel|>";
  const size_t lo = sizeof open - 1, lc = sizeof close - 1;
  char *kept = malloc(n + 1);
  if (!kept) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "chat template: out of memory");
  size_t kn = 0, i = 0;
  for (;;) { /* for part in text.split('<channel|>') */
    const char *q = memmem(s + i, n - i, close, lc);
    size_t end = q ? (size_t)(q - s) : n;
    const char *c = memmem(s + i, end - i, open, lo);
    size_t keep = c ? (size_t)(c - s) : end;
    memcpy(kept + kn, s + i, keep - i);
    kn += keep - i;
    if (!q) break;
    i = end + lc;
  }
  size_t a = 0, b = kn;
  py_strip(kept, &a, &b);
  dg_status st = put_text(o, kept + a, b - a);
  free(kept);
  return st;
}

static dg_status put_trimmed(chat_out *o, const char *s, size_t n) {
  size_t a = 0, b = n;
  py_strip(s, &a, &b);
  return put_text(o, s + a, b - a);
}

static int is_system_role(const char *r) { return !strcmp(r, "system") || !strcmp(r, "developer"); }

dg_status dg_chat_render(const dg_tokenizer *t, const dg_chat_message *msgs, size_t n_msgs, int enable_thinking,
                         int32_t **ids, size_t *n_ids) {
  if (ids) *ids = NULL;
  if (n_ids) *n_ids = 0;
  if (!t || !ids || !n_ids || (!msgs && n_msgs)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_chat_render: NULL argument");
  if (!n_msgs) return dg_seterr(DG_ERR_INVALID_ARG, "chat template: no messages");

  /* validate every message first, so errors name the caller's message */
  for (size_t i = 0; i < n_msgs; i++) {
    const char *r = msgs[i].role;
    if (!r || !msgs[i].content) return dg_seterr(DG_ERR_INVALID_ARG, "chat message %zu: NULL role or content", i);
    if (!is_system_role(r) && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "model"))
      return dg_seterr(DG_ERR_INVALID_ARG,
                       "chat message %zu: role \"%s\" is not supported (system, developer, user, assistant, model)", i, r);
    char what[48];
    snprintf(what, sizeof what, "chat message %zu content", i);
    DG_TRY(dg_utf8_validate(msgs[i].content, strlen(msgs[i].content), what));
  }

  /* control tokens, by their DiffusionGemma names */
  static const char *names[] = {"<bos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"};
  int32_t ctl[6];
  for (int k = 0; k < 6; k++) {
    ctl[k] = dg_tokenizer_piece_id(t, names[k]);
    int needed = k < 3 || (k == 3 && enable_thinking) || (k > 3 && !enable_thinking);
    if (ctl[k] < 0 && needed)
      return dg_seterr(DG_ERR_TOKENIZER, "chat template: control token \"%s\" is not in the tokenizer vocabulary", names[k]);
  }
  const int32_t BOS = ctl[0], TURN = ctl[1], END = ctl[2], THINK = ctl[3], CH_OPEN = ctl[4], CH_CLOSE = ctl[5];

  chat_out o = {.t = t};
  dg_status st = put_ctl(&o, BOS);
  size_t first = 0;
  int sys_first = is_system_role(msgs[0].role);
  if (!st && (enable_thinking || sys_first)) {
    st = put_ctl(&o, TURN);
    if (!st) st = put_str(&o, "system\n");
    if (!st && enable_thinking) st = put_ctl(&o, THINK);
    if (!st && enable_thinking) st = put_str(&o, "\n");
    if (!st && sys_first) { st = put_trimmed(&o, msgs[0].content, strlen(msgs[0].content)); first = 1; }
    if (!st) st = put_ctl(&o, END);
    if (!st) st = put_str(&o, "\n");
  }
  for (size_t i = first; i < n_msgs && !st; i++) {
    const char *r = msgs[i].role;
    int model = !strcmp(r, "assistant") || !strcmp(r, "model");
    const char *role = !strcmp(r, "assistant") ? "model" : r;
    int continues = model && i > first && !strcmp(msgs[i - 1].role, "assistant");
    if (!continues) {
      st = put_ctl(&o, TURN);
      if (!st) st = put_str(&o, role);
      if (!st) st = put_str(&o, "\n");
    }
    if (!st) st = model ? put_model_content(&o, msgs[i].content, strlen(msgs[i].content))
                        : put_trimmed(&o, msgs[i].content, strlen(msgs[i].content));
    if (!st) st = put_ctl(&o, END);
    if (!st) st = put_str(&o, "\n");
  }
  /* generation prompt */
  if (!st) st = put_ctl(&o, TURN);
  if (!st) st = put_str(&o, "model\n");
  if (!st && !enable_thinking) {
    st = put_ctl(&o, CH_OPEN);
    if (!st) st = put_str(&o, "thought\n");
    if (!st) st = put_ctl(&o, CH_CLOSE);
  }
  if (!st) st = flush_text(&o);
  free(o.text);
  if (st) { free(o.ids); return st; }
  *ids = o.ids;
  *n_ids = o.n;
  return DG_OK;
}
