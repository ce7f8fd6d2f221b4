/* gsm8k.c: GSM8K evaluation with vLLM's harness conventions, independent of
 * the model (the CLI plugs the model in through a generator function; the
 * tests plug in canned outputs).
 *
 * What we follow, from vLLM's tests/evals/gsm8k/gsm8k_eval.py
 * (vllm-project/vllm @03e0960, read through the search tool):
 *   - _build_gsm8k_prompts: the few-shot prefix is, for train items 0..k-1,
 *     f"Question: {q}\nAnswer: {a}\n\n" (gen_prefix ""), and the prompt is
 *     prefix + f"Question: {q}\nAnswer:"; all 1,319 test items by default;
 *   - get_answer_value: answer.replace(",", ""), re.findall(r"\d+"), the last
 *     one through ast.literal_eval, else INVALID; the gold label is the same
 *     function applied to the gold answer text;
 *   - SamplingParams(temperature=0, max_tokens=256, stop=["Question",
 *     "Assistant:", "<|separator|>"]); stop strings are cut out of the text;
 *   - the chat variant (--use-chat-completions) sends the same prompt text as
 *     one user message; with --num-shots 0 that is "Question: {q}\nAnswer:".
 * The other common definition, lm-evaluation-harness's
 * lm_eval/tasks/gsm8k/gsm8k.yaml (EleutherAI/lm-evaluation-harness @0391928),
 * uses the same "Question: {{question}}\nAnswer:" text with 5 examples drawn
 * from the train split by its few-shot sampler (not items 0-4), stops at
 * "\n\n" and "Question:", and takes the first "#### (-?[0-9.,]+)" match
 * (later versions add a last-number "flexible-extract" filter). Its scores
 * are not comparable with vLLM's; we implement vLLM's only. */
#include "gsm8k.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const gsm8k_stop_strings[] = {"Question", "Assistant:", "<|separator|>"};
const int gsm8k_n_stop_strings = 3;

static int seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int blank(const char *s) {
  for (; *s; s++)
    if (!isspace((unsigned char)*s)) return 0;
  return 1;
}

/* ---- answers, stops, prompts, intervals ----------------------------------- */

int gsm8k_answer_value(const char *s, char *out, size_t outlen) {
  /* answer_str.replace(",", "") then the last maximal run of digits */
  const char *last = NULL; /* start of the last run, in s (commas skipped while reading) */
  int in_run = 0;
  for (const char *p = s; *p; p++) {
    if (*p == ',') continue; /* deleted: "1,000" is one run, as is "1,2" */
    if (isdigit((unsigned char)*p)) {
      if (!in_run) last = p;
      in_run = 1;
    } else {
      in_run = 0;
    }
  }
  if (!last) return 0;
  size_t k = 0;
  for (const char *p = last; *p && (*p == ',' || isdigit((unsigned char)*p)); p++) {
    if (*p == ',') continue;
    if (k + 1 >= outlen) return 0; /* longer than any answer we hold: treated as INVALID */
    out[k++] = *p;
  }
  out[k] = 0;
  if (out[0] == '0' && k > 1) {
    /* Python 3 literal_eval: "00" is 0, "007" is a SyntaxError (INVALID) */
    for (size_t i = 1; i < k; i++)
      if (out[i] != '0') return 0;
    out[1] = 0;
  }
  return 1;
}

size_t gsm8k_stop_cut(const char *text, const char *const *stops, int n_stops, int *which) {
  size_t len = strlen(text), cut = len;
  if (which) *which = -1;
  for (int i = 0; i < n_stops; i++) {
    if (!stops[i][0]) continue;
    const char *p = strstr(text, stops[i]);
    if (p && (size_t)(p - text) < cut) {
      cut = (size_t)(p - text);
      if (which) *which = i;
    }
  }
  return cut;
}

/* A growing string. */
typedef struct sbuf { char *s; size_t n, cap; int oom; } sbuf;
static void sb_add(sbuf *b, const char *t) {
  size_t k = strlen(t);
  if (b->oom) return;
  if (b->n + k + 1 > b->cap) {
    size_t cap = (b->n + k + 1) * 2;
    char *ns = realloc(b->s, cap);
    if (!ns) { b->oom = 1; return; }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, t, k + 1);
  b->n += k;
}
static char *sb_take(sbuf *b) {
  if (b->oom) { free(b->s); return NULL; }
  if (!b->s) return calloc(1, 1);
  return b->s;
}

char *gsm8k_fewshot_prefix(const gsm8k_set *train, int k) {
  if (k < 0 || (k > 0 && (!train || train->n < k))) return NULL;
  sbuf b = {0};
  for (int i = 0; i < k; i++) {
    sb_add(&b, "Question: ");
    sb_add(&b, train->items[i].question);
    sb_add(&b, "\nAnswer: ");
    sb_add(&b, train->items[i].answer);
    sb_add(&b, "\n\n");
  }
  return sb_take(&b);
}

char *gsm8k_prompt(const char *prefix, const char *question) {
  sbuf b = {0};
  sb_add(&b, prefix ? prefix : "");
  sb_add(&b, "Question: ");
  sb_add(&b, question);
  sb_add(&b, "\nAnswer:");
  return sb_take(&b);
}

void gsm8k_wilson(int k, int n, double *lo, double *hi) {
  if (n <= 0) { *lo = 0; *hi = 1; return; }
  const double z = 1.959963984540054, p = (double)k / n, z2 = z * z;
  const double c = (p + z2 / (2.0 * n)) / (1 + z2 / n);
  const double h = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / (1 + z2 / n);
  *lo = fmax(0.0, c - h);
  *hi = fmin(1.0, c + h);
}

/* ---- data ----------------------------------------------------------------- */

void gsm8k_set_free(gsm8k_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) { free(s->items[i].question); free(s->items[i].answer); }
  free(s->items);
  s->items = NULL;
  s->n = 0;
}

int gsm8k_load(const char *path, int max_items, gsm8k_set *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "r");
  if (!f) return seterr(err, errlen, "cannot open %s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0, icap = 0;
  int lineno = 0, rc = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    lineno++;
    if (blank(line)) continue;
    if (max_items > 0 && out->n >= max_items) break;
    cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "question");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
    if (!j || !cJSON_IsObject(j)) {
      rc = seterr(err, errlen, "%s line %d: not a JSON object (expected {\"question\": ..., \"answer\": ...})", path,
                  lineno);
    } else if (!cJSON_IsString(q) || !cJSON_IsString(a)) {
      rc = seterr(err, errlen, "%s line %d: \"question\" and \"answer\" must both be strings", path, lineno);
    }
    if (rc) { cJSON_Delete(j); break; }
    if ((size_t)out->n == icap) {
      icap = icap ? icap * 2 : 256;
      gsm8k_item *ni = realloc(out->items, icap * sizeof *ni);
      if (!ni) { rc = seterr(err, errlen, "out of memory reading %s", path); cJSON_Delete(j); break; }
      out->items = ni;
    }
    gsm8k_item *it = &out->items[out->n];
    memset(it, 0, sizeof *it);
    it->question = strdup(q->valuestring);
    it->answer = strdup(a->valuestring);
    out->n++;
    cJSON_Delete(j);
    if (!it->question || !it->answer) { rc = seterr(err, errlen, "out of memory reading %s", path); break; }
    if (!gsm8k_answer_value(it->answer, it->label, sizeof it->label)) {
      rc = seterr(err, errlen, "%s line %d: the gold answer holds no valid number", path, lineno);
      break;
    }
  }
  if (!rc && ferror(f)) rc = seterr(err, errlen, "cannot read %s: %s", path, strerror(errno));
  if (!rc && out->n == 0) rc = seterr(err, errlen, "%s holds no records", path);
  free(line);
  fclose(f);
  if (rc) gsm8k_set_free(out);
  return rc;
}

/* ---- resume --------------------------------------------------------------- */

static void add_item(gsm8k_summary *s, int correct, int invalid, double tokens, double forwards, double blocks,
                     double seconds) {
  s->n++;
  s->correct += correct;
  s->invalid += invalid;
  s->tokens += (int64_t)tokens;
  s->forwards += (int64_t)forwards;
  s->blocks += (int64_t)blocks;
  s->seconds += seconds;
}

static int num_field(const cJSON *j, const char *k, double *v) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, k);
  /* at most 2^53 (exact in a double; far above any real count): a larger one cast to int64_t
   * would be undefined (fuzz_gsm8k found 4.4e32 in a "tokens" field) */
  if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0 || x->valuedouble > 9007199254740992.0)
    return 0;
  *v = x->valuedouble;
  return 1;
}

int gsm8k_resume_read(const char *path, const char *config, uint8_t *done, int n_done, gsm8k_summary *s, char *err,
                      size_t errlen) {
  /* only a regular file can be resumed (and truncated): a device such as /dev/full or /dev/zero
   * reads as one endless line (getline grew until the process was killed), a terminal blocks */
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return seterr(err, errlen, "-o %s is not a regular file: -o keeps the per-item results that a rerun resumes", path);
  FILE *f = fopen(path, "r+");
  if (!f) {
    if (errno == ENOENT) return 0;
    return seterr(err, errlen, "cannot open %s for resuming: %s", path, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long good_end = 0; /* byte offset after the last complete line */
  int lineno = 0, rc = 0;
  while ((len = getline(&line, &cap, f)) > 0) {
    lineno++;
    if (line[len - 1] != '\n') { /* torn last write: dropped below, if it is one (review aud16) */
      /* a line this loop wrote starts {"idx": (cJSON_PrintUnformatted, "idx" added first); anything else without a
       * newline is not ours (-o naming some other file): truncating it away lost the file's last line */
      const size_t k = (size_t)len < 7 ? (size_t)len : 7;
      if (memcmp(line, "{\"idx\":", k))
        rc = seterr(err, errlen,
                    "%s line %d has no newline and is not the start of a gsm8k result line; remove the file or pass "
                    "another -o", path, lineno);
      break;
    }
    good_end += (long)len;
    if (blank(line)) continue;
    cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "correct");
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(j, "pred");
    double idx, tok, fw, bl, sec;
    if (!cJSON_IsObject(j) || !cJSON_IsString(cfg) || !cJSON_IsBool(ok) || !pred || !num_field(j, "idx", &idx) ||
        idx != floor(idx) || !num_field(j, "tokens", &tok) || !num_field(j, "forwards", &fw) ||
        !num_field(j, "blocks", &bl) || !num_field(j, "seconds", &sec)) {
      rc = seterr(err, errlen,
                  "%s line %d is not a gsm8k result line (idx, config, pred, correct, tokens, forwards, blocks, "
                  "seconds); remove the file or pass another -o",
                  path, lineno);
    } else if (strcmp(cfg->valuestring, config)) {
      rc = seterr(err, errlen,
                  "%s line %d was written by another configuration:\n    file: %s\n    now:  %s\n  "
                  "pass another -o (or delete the file) to start over",
                  path, lineno, cfg->valuestring, config);
    } else if (idx >= n_done) {
      /* beyond this run's --limit: kept in the file, not counted */
    } else if (done[(int)idx]) {
      rc = seterr(err, errlen, "%s line %d: idx %.0f appears twice", path, lineno, idx);
    } else {
      done[(int)idx] = 1;
      add_item(s, cJSON_IsTrue(ok), cJSON_IsNull(pred), tok, fw, bl, sec);
      s->resumed++;
    }
    cJSON_Delete(j);
    if (rc) break;
  }
  free(line);
  if (!rc && len > 0 && ftruncate(fileno(f), good_end) != 0)
    rc = seterr(err, errlen, "cannot drop the torn last line of %s: %s", path, strerror(errno));
  fclose(f);
  return rc;
}

/* ---- the loop ------------------------------------------------------------- */

static void fmt_time(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 359999) s = 0;
  int t = (int)(s + 0.5);
  snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
}

static void progress(const gsm8k_run_opts *o, const gsm8k_summary *s, int done_now, int todo, double secs_now) {
  double per = done_now ? secs_now / done_now : 0;
  char eta[32];
  fmt_time(eta, sizeof eta, per * (todo - done_now));
  int total = s->n_target;
  if (o->tty) {
    char bar[31];
    int fill = total ? s->n * 30 / total : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r[%s] %d/%d  acc %.1f%%  %.1f s/item  ETA %s ", bar, s->n, total,
            s->n ? 100.0 * s->correct / s->n : 0.0, per, eta);
  } else {
    fprintf(stderr, "gsm8k: %d/%d  acc %.1f%%  %.1f s/item  ETA %s\n", s->n, total,
            s->n ? 100.0 * s->correct / s->n : 0.0, per, eta);
  }
}

static void finish(gsm8k_summary *s) {
  s->acc = s->n ? (double)s->correct / s->n : 0.0;
  gsm8k_wilson(s->correct, s->n, &s->lo, &s->hi);
}

int gsm8k_run(const gsm8k_run_opts *o, gsm8k_gen_fn gen, void *ud, gsm8k_summary *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  const int N = o->test->n;
  s->n_target = N;
  uint8_t *done = calloc((size_t)N + 1, 1);
  char *prefix = gsm8k_fewshot_prefix(o->train, o->shots);
  FILE *out = NULL;
  int rc = 0;
  if (!done || !prefix) {
    rc = prefix ? seterr(err, errlen, "out of memory")
                : seterr(err, errlen, "%d-shot prompts need %d train items; %d given", o->shots, o->shots,
                         o->train ? o->train->n : 0);
    goto end;
  }
  if (o->out_path) {
    if ((rc = gsm8k_resume_read(o->out_path, o->config, done, N, s, err, errlen))) goto end;
    out = fopen(o->out_path, "a");
    if (!out) { rc = seterr(err, errlen, "cannot write %s: %s", o->out_path, strerror(errno)); goto end; }
  }
  int todo = N - s->resumed, done_now = 0;
  double secs_now = 0;
  if (o->progress && s->resumed)
    fprintf(stderr, "gsm8k: resuming: %d of %d items already in %s\n", s->resumed, N, o->out_path);
  for (int i = 0; i < N; i++) {
    if (done[i]) continue;
    char *prompt = gsm8k_prompt(prefix, o->test->items[i].question);
    if (!prompt) { rc = seterr(err, errlen, "out of memory"); goto end; }
    gsm8k_gen_out g;
    memset(&g, 0, sizeof g);
    int gr = gen(ud, prompt, i, &g, err, errlen);
    free(prompt);
    if (gr) {
      free(g.text);
      if (gr > 0) { s->interrupted = 1; rc = 1; } else rc = -1;
      goto end;
    }
    int which;
    size_t cut = gsm8k_stop_cut(g.text ? g.text : "", gsm8k_stop_strings, gsm8k_n_stop_strings, &which);
    if (g.text) g.text[cut] = 0;
    char pred[64];
    int valid = gsm8k_answer_value(g.text ? g.text : "", pred, sizeof pred);
    int correct = valid && !strcmp(pred, o->test->items[i].label);
    add_item(s, correct, !valid, g.tokens, g.forwards, g.blocks, g.seconds);
    done_now++;
    secs_now += g.seconds;
    if (out) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "idx", i);
      cJSON_AddStringToObject(j, "config", o->config);
      cJSON_AddStringToObject(j, "label", o->test->items[i].label);
      if (valid) cJSON_AddStringToObject(j, "pred", pred);
      else cJSON_AddNullToObject(j, "pred");
      cJSON_AddBoolToObject(j, "correct", correct);
      cJSON_AddStringToObject(j, "stop", which >= 0 ? gsm8k_stop_strings[which] : g.eos ? "eos" : "length");
      cJSON_AddStringToObject(j, "output", g.text ? g.text : "");
      cJSON_AddNumberToObject(j, "tokens", g.tokens);
      cJSON_AddNumberToObject(j, "forwards", g.forwards);
      cJSON_AddNumberToObject(j, "blocks", g.blocks);
      cJSON_AddNumberToObject(j, "seconds", round(g.seconds * 1e4) / 1e4);
      char *line = cJSON_PrintUnformatted(j);
      cJSON_Delete(j);
      int bad = !line || fprintf(out, "%s\n", line) < 0 || fflush(out) != 0;
      free(line);
      if (bad) { free(g.text); rc = seterr(err, errlen, "cannot write %s: %s", o->out_path, strerror(errno)); goto end; }
    }
    free(g.text);
    if (o->progress) progress(o, s, done_now, todo, secs_now);
  }
end:
  if (o->progress && o->tty) fprintf(stderr, "\n");
  if (out && fclose(out) != 0 && !rc) rc = seterr(err, errlen, "cannot write %s: %s", o->out_path, strerror(errno));
  finish(s);
  free(done);
  free(prefix);
  return rc;
}

void gsm8k_summary_markdown(FILE *f, const char *title, const gsm8k_summary *s) {
  fprintf(f, "### %s\n\n", title);
  fprintf(f, "| items | correct | accuracy | Wilson 95%% | no answer | tokens | tok/s | forwards/block | tokens/forward |\n");
  fprintf(f, "|---|---|---|---|---|---|---|---|---|\n");
  fprintf(f, "| %d%s | %d | %.1f%% | %.1f–%.1f%% | %d | %lld | %.1f | %.2f | %.2f |\n", s->n,
          s->n < s->n_target ? " (partial)" : "", s->correct, 100 * s->acc, 100 * s->lo, 100 * s->hi, s->invalid,
          (long long)s->tokens, s->seconds > 0 ? s->tokens / s->seconds : 0.0,
          s->blocks ? (double)s->forwards / s->blocks : 0.0, s->forwards ? (double)s->tokens / s->forwards : 0.0);
  fprintf(f, "\n%d of %d items (%d resumed from the output file); %.1f s of generation (prefill included)%s\n", s->n,
          s->n_target, s->resumed, s->seconds, s->interrupted ? "; INTERRUPTED: rerun the same command to resume" : "");
}

char *gsm8k_summary_json(const char *title, const char *config, const gsm8k_summary *s) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "title", title);
  cJSON_AddStringToObject(j, "config", config);
  cJSON_AddNumberToObject(j, "items", s->n);
  cJSON_AddNumberToObject(j, "items_target", s->n_target);
  cJSON_AddNumberToObject(j, "correct", s->correct);
  cJSON_AddNumberToObject(j, "accuracy", s->acc);
  cJSON_AddNumberToObject(j, "wilson_lo", s->lo);
  cJSON_AddNumberToObject(j, "wilson_hi", s->hi);
  cJSON_AddNumberToObject(j, "no_answer", s->invalid);
  cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
  cJSON_AddNumberToObject(j, "forwards", (double)s->forwards);
  cJSON_AddNumberToObject(j, "blocks", (double)s->blocks);
  cJSON_AddNumberToObject(j, "seconds", s->seconds);
  cJSON_AddNumberToObject(j, "tok_per_s", s->seconds > 0 ? s->tokens / s->seconds : 0.0);
  cJSON_AddNumberToObject(j, "forwards_per_block", s->blocks ? (double)s->forwards / s->blocks : 0.0);
  cJSON_AddNumberToObject(j, "tokens_per_forward", s->forwards ? (double)s->tokens / s->forwards : 0.0);
  cJSON_AddBoolToObject(j, "complete", s->n == s->n_target);
  char *r = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return r;
}
