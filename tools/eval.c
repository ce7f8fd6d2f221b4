/* eval.c: `dgemma eval` for the small-model evaluation (issue 3), the same
 * inputs as tools/smallmodel/eval_hf.py so that dgemma and Transformers are
 * compared on identical problems and windows.
 *
 *   dgemma eval problems -m DIR --file prompts.jsonl [--limit N] [--seed S] [-o items.jsonl] [--gen-kwargs J]
 *     One generation per problem with the model's generation config (the
 *     reference sampler, or the turbo engine through --gen-kwargs); seed S +
 *     problem id. Answer = the integer after the last "####" (else the last
 *     integer) of the text up to the first stop id. Prints accuracy per step
 *     count with Wilson 95% intervals, tok/s and forwards per block. -o
 *     writes one line per problem (with its tokens, forwards, blocks,
 *     positions forwarded and seconds) and resumes: a rerun of the same
 *     configuration skips the ids already in the file; Ctrl-C (SIGINT),
 *     SIGTERM, SIGHUP or SIGPIPE stops at the next denoising step with status
 *     130, 143, 129 or 141. The
 *     file is a journal: one whole line appended and flushed per finished
 *     problem, so an interruption leaves the earlier lines and the finished
 *     problems (and a torn last line, after a crash, is dropped on resume). --limit N takes the file's first N
 *     records.
 *   dgemma eval text -m DIR --file shakespeare_windows.jsonl [--limit N]
 *     Sequential canvas code length in nats/token: target token i is scored
 *     from one decoder pass whose canvas holds the clean target[:i] and the
 *     window's fixed noise at positions >= i (no self-conditioning).
 *
 *   dgemma eval gsm8k [-m DIR] [--data DIR] [--chat] [--shots K] [--limit N] [-o items.jsonl] [--summary s.json]
 *     GSM8K with vLLM's harness conventions (tools/gsm8k.c says which and
 *     where from): k-shot "Question:/Answer:" completion prompts (k = 5) or
 *     the zero-shot chat variant (thinking off); answer = last integer;
 *     per-item JSONL, resumable; docs/eval.md.
 *
 * Input lines are JSON objects (cJSON); a malformed line is an error naming
 * the file and the line number. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dgemma.h"
#include "eval.h"
#include "outfile.h"

static volatile sig_atomic_t g_interrupted = 0; /* the SIGINT/SIGTERM/SIGHUP/SIGPIPE received (0: none) */
static volatile sig_atomic_t g_hold_signals = 0; /* 1 while --summary is written: signals only recorded */

static void on_signal(int sig) {
  g_interrupted = sig; /* exit status 128 + sig: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE */
  /* a second Ctrl-C ends the process at once; not a second SIGPIPE: every write to the gone reader raises
   * one (the progress line, the messages), so it stays caught and those writes fail with EPIPE instead */
  if (!g_hold_signals && sig != SIGPIPE) signal(sig, SIG_DFL);
}

/* SIGINT, SIGTERM, SIGHUP (a closed terminal, a dropped ssh session) and
 * SIGPIPE (the reader of a pipe eval writes to has gone: `2>&1 | head -1`)
 * stop a run at the next denoising step (g_interrupted): the -o lines
 * written so far stay whole and a rerun resumes. Before, SIGHUP's and
 * SIGPIPE's default actions killed eval without its message or partial
 * summary, and could leave --summary's temporary file (review aud16). A
 * signal the process was started with ignored (a background job, nohup)
 * stays ignored. stop_signals_restore puts the earlier dispositions back. */
static struct sigaction g_old_sa[OUT_N_STOP_SIGS];

static void stop_signals_catch(void) { out_catch_stop_sigs(on_signal, g_old_sa); }

static void stop_signals_restore(void) {
  for (int k = 0; k < OUT_N_STOP_SIGS; k++) sigaction(out_stop_sigs[k], &g_old_sa[k], NULL);
}

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Wilson score interval for k successes out of n (z = 1.96). */
static void wilson(int k, int n, double *lo, double *hi) {
  if (n == 0) { *lo = 0; *hi = 1; return; }
  const double z = 1.959963984540054, p = (double)k / n, z2 = z * z;
  double c = (p + z2 / (2 * n)) / (1 + z2 / n);
  double h = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / (1 + z2 / n);
  *lo = c - h;
  *hi = c + h;
}

/* integer after the last "####", else the last integer in s; returns 0 if none */
static int parse_answer(const char *s, long long *out) {
  const char *h = NULL, *p = s;
  while ((p = strstr(p, "####"))) { h = p + 4; p += 4; }
  const char *scan = h ? h : s;
  int found = 0;
  for (const char *q = scan; *q; q++) {
    if (isdigit((unsigned char)*q) || (*q == '-' && isdigit((unsigned char)q[1]))) {
      char *end;
      long long v = strtoll(q, &end, 10);
      /* thousands separators: 1,000 */
      while (*end == ',' && isdigit((unsigned char)end[1]) && isdigit((unsigned char)end[2]) &&
             isdigit((unsigned char)end[3]) && !isdigit((unsigned char)end[4])) {
        v = v * 1000 + strtoll(end + 1, &end, 10);
      }
      *out = v;
      found = 1;
      if (h) return 1; /* first integer after the last #### */
      q = end - 1;
    }
  }
  return found;
}

/* An integer JSON number in [lo, hi] (no fraction), or 0 if it is not one. */
static int json_int(const cJSON *v, double lo, double hi, long long *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return 0;
  *out = (long long)v->valuedouble;
  return 1;
}

/* An array of token ids in [0, V); NULL if absent, not an array, or any entry is not such an id. */
static int32_t *json_ids(const cJSON *a, int32_t V, size_t *n) {
  if (!cJSON_IsArray(a)) return NULL;
  int k = cJSON_GetArraySize(a);
  int32_t *ids = malloc((size_t)(k > 0 ? k : 1) * sizeof *ids);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) {
    long long v;
    if (!json_int(e, 0, (double)V - 1, &v)) { free(ids); return NULL; }
    ids[i++] = (int32_t)v;
  }
  *n = (size_t)k;
  return ids;
}

static int blank(const char *line) {
  for (; *line; line++)
    if (!isspace((unsigned char)*line)) return 0;
  return 1;
}

static FILE *open_or_die(const char *path, const char *mode) {
  FILE *f = fopen(path, mode);
  if (!f) { fprintf(stderr, "dgemma eval: cannot open %s: %s\n", path, strerror(errno)); exit(1); }
  struct stat sb; /* a directory opens for reading, then reads as an empty file */
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fprintf(stderr, "dgemma eval: cannot read %s: it is a directory\n", path);
    exit(1);
  }
  return f;
}

static void die_st(const char *what, dg_status st) {
  fprintf(stderr, "dgemma eval: %s: %s\n  %s\n", what, dg_status_str(st), dg_last_error());
  exit(1);
}

/* One finished problem, as counted in the summary. */
typedef struct problem_tally {
  int n[9], k[9], total, correct;
  long long forwards, blocks, tokens, positions;
  double seconds;
} problem_tally;

static void tally_add(problem_tally *t, long long steps, int ok, long long tokens, long long forwards, long long blocks,
                      long long positions, double seconds) {
  if (steps >= 1 && steps <= 8) { t->n[steps]++; t->k[steps] += ok; }
  t->total++;
  t->correct += ok;
  t->tokens += tokens;
  t->forwards += forwards;
  t->blocks += blocks;
  t->positions += positions;
  t->seconds += seconds;
}

/* A result line of an earlier run (resume). */
typedef struct problem_done {
  long long id, steps, tokens, forwards, blocks, positions;
  uint64_t hash; /* of the prompt ids: the same id must be the same problem */
  int ok;
  double seconds;
} problem_done;

static int cmp_done(const void *a, const void *b) {
  long long x = ((const problem_done *)a)->id, y = ((const problem_done *)b)->id;
  return (x > y) - (x < y);
}

/* FNV-1a over the prompt's token ids (little-endian int32). */
static uint64_t prompt_hash(const int32_t *ids, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 4; b++) {
      h ^= (uint8_t)((uint32_t)ids[i] >> (8 * b));
      h *= 1099511628211ull;
    }
  return h;
}

/* Resume: read the result lines of an earlier run of the same configuration
 * from `path` (absent file: nothing done); returns them sorted by id in
 * *n_out records. They are counted only when the problems file holds their id
 * (within --limit) with the same prompt. A line of another configuration, a
 * line that is not a result line, or an id seen twice is an error (message on
 * stderr, exit 1); a torn last line (no newline) is dropped from the file if it is the start of a result line
 * ('{"id":' or a prefix of it), refused like any other line if not. */
static problem_done *problems_resume(const char *path, const char *config, size_t *n_out) {
  *n_out = 0;
  /* only a regular file can be resumed: a device (/dev/full, /dev/zero) reads as one endless line */
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    fprintf(stderr, "dgemma eval: -o %s is not a regular file: -o keeps the per-item results that a rerun resumes\n",
            path);
    exit(1);
  }
  FILE *f = fopen(path, "r+");
  if (!f) {
    if (errno == ENOENT) return NULL;
    fprintf(stderr, "dgemma eval: cannot open %s for resuming: %s\n", path, strerror(errno));
    exit(1);
  }
  problem_done *d = NULL;
  size_t n = 0, cap_d = 0;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long good_end = 0;
  int lineno = 0;
  const char *why = NULL;
  while ((len = getline(&line, &cap, f)) > 0) {
    lineno++;
    if (line[len - 1] != '\n') { /* torn last write: dropped below, if it is one (review aud16) */
      /* a line this command wrote starts {"id": (cJSON_PrintUnformatted, "id" added first); anything else without
       * a newline is not ours (-o naming some other file): truncating it away lost the file's last line */
      const size_t k = (size_t)len < 6 ? (size_t)len : 6;
      if (memcmp(line, "{\"id\":", k))
        why = "has no newline and is not the start of a problems result line; remove the file or pass another -o";
      break;
    }
    good_end += (long)len;
    if (blank(line)) continue;
    cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "correct");
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(j, "seconds");
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "prompt_hash");
    problem_done r;
    memset(&r, 0, sizeof r);
    char *hend = NULL;
    if (cJSON_IsString(ph)) r.hash = strtoull(ph->valuestring, &hend, 16);
    if (!cJSON_IsObject(j) || !cJSON_IsString(cfg) || !cJSON_IsBool(ok) || !cJSON_IsNumber(sec) || !hend ||
        *hend || hend == ph->valuestring ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "id"), 0, INT32_MAX, &r.id) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "steps"), 0, 1000, &r.steps) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "tokens"), 0, 9e15, &r.tokens) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "forwards"), 0, 9e15, &r.forwards) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "blocks"), 0, 9e15, &r.blocks) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "positions"), 0, 9e15, &r.positions)) {
      why = "is not a problems result line (id, config, prompt_hash, steps, correct, tokens, forwards, blocks, "
            "positions, seconds); remove the file or pass another -o";
    } else if (strcmp(cfg->valuestring, config)) {
      fprintf(stderr,
              "dgemma eval: %s line %d was written by another configuration:\n    file: %s\n    now:  %s\n  "
              "pass another -o (or delete the file) to start over\n", path, lineno, cfg->valuestring, config);
      cJSON_Delete(j);
      free(line);
      free(d);
      fclose(f);
      exit(1);
    } else {
      r.ok = cJSON_IsTrue(ok);
      r.seconds = sec->valuedouble;
    }
    cJSON_Delete(j);
    if (why) break;
    if (n == cap_d) {
      cap_d = cap_d ? 2 * cap_d : 256;
      problem_done *nd = realloc(d, cap_d * sizeof *d);
      if (!nd) { why = "could not be read: out of memory"; break; }
      d = nd;
    }
    d[n++] = r;
  }
  if (!why && n) {
    qsort(d, n, sizeof *d, cmp_done);
    for (size_t i = 1; i < n; i++)
      if (d[i].id == d[i - 1].id) {
        fprintf(stderr, "dgemma eval: %s: id %lld appears twice; remove the file or pass another -o\n", path, d[i].id);
        free(line);
        free(d);
        fclose(f);
        exit(1);
      }
  }
  free(line);
  if (why) {
    fprintf(stderr, "dgemma eval: %s line %d %s\n", path, lineno, why);
    free(d);
    fclose(f);
    exit(1);
  }
  if (len > 0 && ftruncate(fileno(f), good_end) != 0) {
    fprintf(stderr, "dgemma eval: cannot drop the torn last line of %s: %s\n", path, strerror(errno));
    exit(1);
  }
  fclose(f);
  *n_out = n;
  return d;
}

static int problems_on_step(const dg_step_info *si, void *ud) {
  (void)si; (void)ud;
  return g_interrupted ? 1 : 0;
}

static int eval_problems(dg_model *m, const eval_opts *o) {
  FILE *f = open_or_die(o->file, "r");
  dg_model_info info;
  dg_model_get_info(m, &info);
  dg_gen_params gp = o->gen;
  char config[2048];
  snprintf(config, sizeof config, "problems max_new_tokens=%d steps=%d proposal=%s seed=%lld%s%s%s model=%s",
           gp.max_new_tokens, gp.max_denoising_steps, gp.proposal == DG_PROPOSAL_ARGMAX ? "argmax" : "sample",
           o->seed, o->reference_kernels ? " kernels=ref" : "", o->gen_kwargs ? " gen_kwargs=" : "",
           o->gen_kwargs ? o->gen_kwargs : "", o->model_dir ? o->model_dir : "?");
  problem_tally t;
  memset(&t, 0, sizeof t);
  size_t n_done = 0;
  problem_done *done = o->out ? problems_resume(o->out, config, &n_done) : NULL;
  int resumed = 0;
  long long *seen = NULL; /* ids of this file so far: an id twice is an error */
  size_t n_seen = 0, cap_seen = 0;
  FILE *out = o->out ? open_or_die(o->out, "a") : NULL;
  dg_context_params cp = dg_context_default_params();
  int32_t ncanv = (gp.max_new_tokens + info.canvas_length - 1) / info.canvas_length;
  cp.max_context = 1024 + ncanv * info.canvas_length; /* grown for a longer prompt (below) */
  if (cp.max_context > info.max_position_embeddings) cp.max_context = info.max_position_embeddings;
  dg_context *ctx;
  dg_status st = dg_context_new(m, &cp, &ctx);
  if (st) die_st("context", st);
  stop_signals_catch();
  gp.on_step = problems_on_step;
  gp.user_data = NULL;
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0, interrupted = 0, limit_reached = 0;
  long long record_no = 0;
  double t0 = wall();
  while (!interrupted && getline(&line, &cap, f) > 0) {
    lineno++;
    if (blank(line)) continue;
    if (o->limit > 0 && record_no >= o->limit) { limit_reached = 1; break; }
    const long long record = record_no++;
    cJSON *j = cJSON_Parse(line);
    long long id, steps, final;
    size_t np = 0;
    int32_t *prompt = NULL;
    const cJSON *jq = cJSON_GetObjectItemCaseSensitive(j, "question");
    if (j && cJSON_GetObjectItemCaseSensitive(j, "prompt_ids")) {
      prompt = json_ids(cJSON_GetObjectItemCaseSensitive(j, "prompt_ids"), info.vocab_size, &np);
    } else if (cJSON_IsString(jq)) { /* render the question with the chat template (thinking off) */
      dg_chat_message msg = {"user", jq->valuestring};
      if ((st = dg_chat_apply(m, &msg, 1, 0, &prompt, &np))) die_st("chat template", st);
    }
    /* "id" (eval_hf.py's prompts.jsonl) or, when absent, the record's index among
     * the file's non-blank lines from 0 (the held-out file's order, the id
     * eval_hf.py gives it) */
    const cJSON *jid = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
    id = record;
    if (!j || (jid && !json_int(jid, 0, INT32_MAX, &id)) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "steps"), 0, 1000, &steps) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(j, "final"), -9e15, 9e15, &final) || !prompt || !np) {
      fprintf(stderr,
              "dgemma eval: %s line %d: expected {\"id\": int (optional), \"steps\": int, \"final\": int, and \"prompt_ids\": "
              "[ids in [0, %d)] or \"question\": text}\n",
              o->file, lineno, info.vocab_size);
      cJSON_Delete(j);
      free(prompt);
      exit(1);
    }
    for (size_t i = 0; i < n_seen; i++)
      if (seen[i] == id) {
        fprintf(stderr, "dgemma eval: %s line %d: problem id %lld appears twice in the file\n", o->file, lineno, id);
        exit(1);
      }
    if (n_seen == cap_seen) {
      cap_seen = cap_seen ? 2 * cap_seen : 256;
      if (!(seen = realloc(seen, cap_seen * sizeof *seen))) { fprintf(stderr, "dgemma eval: out of memory\n"); exit(1); }
    }
    seen[n_seen++] = id;
    const uint64_t hash = prompt_hash(prompt, np);
    problem_done key = {.id = id};
    const problem_done *dn = n_done ? bsearch(&key, done, n_done, sizeof *done, cmp_done) : NULL;
    if (dn) { /* resumed: the same problem answered by the same configuration */
      if (dn->hash != hash) {
        fprintf(stderr,
                "dgemma eval: %s line %d: problem id %lld is not the problem %s answered under that id (another "
                "problems file?); pass another -o\n", o->file, lineno, id, o->out);
        exit(1);
      }
      tally_add(&t, dn->steps, dn->ok, dn->tokens, dn->forwards, dn->blocks, dn->positions, dn->seconds);
      resumed++;
      free(prompt);
      cJSON_Delete(j);
      continue;
    }
    /* a prompt longer than the context so far gets a larger one (the context had been fixed at 1024 + the
     * canvases: a longer prompt ended the whole run with "context length exceeded", naming no line); one past
     * the model's positions is an error naming the line */
    const int64_t need = (int64_t)np + (int64_t)ncanv * info.canvas_length;
    if (need > info.max_position_embeddings) {
      fprintf(stderr,
              "dgemma eval: %s line %d: problem id %lld: a prompt of %zu tokens + %d canvas(es) of %d needs %lld "
              "positions, past the model's max_position_embeddings %d\n",
              o->file, lineno, id, np, ncanv, info.canvas_length, (long long)need, info.max_position_embeddings);
      exit(1);
    }
    if (need > cp.max_context) {
      dg_context_free(ctx);
      cp.max_context = (int32_t)(need + need / 4 < info.max_position_embeddings ? need + need / 4 : need);
      if ((st = dg_context_new(m, &cp, &ctx))) die_st("context", st);
    }
    gp.seed = (uint64_t)(o->seed + id);
    dg_context_reset(ctx);
    dg_gen_result r;
    st = dg_generate(ctx, prompt, np, &gp, &r);
    if (st == DG_ERR_ABORTED && g_interrupted) {
      interrupted = 1;
      free(prompt);
      cJSON_Delete(j);
      break;
    }
    if (st) die_st("generate", st);
    char *text = NULL;
    if ((st = dg_detokenize(m, r.tokens, (size_t)r.n_valid, 0, &text))) die_st("detokenize", st);
    long long pred = 0;
    int has = parse_answer(text, &pred);
    int ok = has && pred == final;
    /* n_visible: hidden <eos>/pad canvases ({"eos_token_id": []}) are not generated tokens */
    tally_add(&t, steps, ok, r.n_visible, r.n_steps, r.n_blocks, r.n_forwarded, r.seconds);
    if (out) {
      cJSON *o2 = cJSON_CreateObject();
      cJSON_AddNumberToObject(o2, "id", id);
      cJSON_AddStringToObject(o2, "config", config);
      char hx[17];
      snprintf(hx, sizeof hx, "%016llx", (unsigned long long)hash);
      cJSON_AddStringToObject(o2, "prompt_hash", hx);
      cJSON_AddNumberToObject(o2, "steps", steps);
      cJSON_AddNumberToObject(o2, "final", (double)final);
      if (has) cJSON_AddNumberToObject(o2, "pred", (double)pred);
      else cJSON_AddNullToObject(o2, "pred");
      cJSON_AddBoolToObject(o2, "correct", ok);
      cJSON_AddStringToObject(o2, "generated", text);
      cJSON_AddNumberToObject(o2, "tokens", r.n_visible);
      cJSON_AddNumberToObject(o2, "forwards", r.n_steps);
      cJSON_AddNumberToObject(o2, "blocks", r.n_blocks);
      cJSON_AddNumberToObject(o2, "positions", (double)r.n_forwarded);
      cJSON_AddNumberToObject(o2, "seconds", r.seconds);
      cJSON_AddStringToObject(o2, "finish", r.finish_reason == DG_FINISH_STOP ? "stop"
                                            : r.finish_reason == DG_FINISH_REPETITION ? "repetition" : "length");
      char *s = cJSON_PrintUnformatted(o2);
      /* one whole line per problem, flushed: an interruption keeps the finished ones (resume) */
      if (!s || fprintf(out, "%s\n", s) < 0 || fflush(out) != 0) {
        fprintf(stderr, "dgemma eval: cannot write %s: %s\n", o->out, s ? strerror(errno) : "out of memory");
        exit(1);
      }
      free(s);
      cJSON_Delete(o2);
    }
    if (o->progress && t.total % 25 == 0)
      fprintf(stderr, "\r[%d problems, %d correct, %.1f s]", t.total, t.correct, wall() - t0);
    dg_free(text);
    dg_gen_result_free(&r);
    free(prompt);
    cJSON_Delete(j);
  }
  (void)limit_reached;
  stop_signals_restore();
  if (o->progress) fprintf(stderr, "\n");
  free(line);
  free(done);
  free(seen);
  fclose(f);
  if (out && fclose(out) != 0) {
    fprintf(stderr, "dgemma eval: cannot write %s: %s\n", o->out, strerror(errno));
    exit(1);
  }
  if (resumed) fprintf(stderr, "dgemma eval: %d problems resumed from %s\n", resumed, o->out);
  if (t.total == 0) {
    fprintf(stderr, "dgemma eval: %s\n", interrupted ? "interrupted before the first problem finished"
                                                     : "no problems to evaluate (empty file)");
    dg_context_free(ctx);
    return interrupted ? 128 + g_interrupted : 1;
  }
  double lo, hi;
  printf("| steps | n | correct | accuracy | Wilson 95%% |\n|---|---|---|---|---|\n");
  for (int s = 1; s <= 8; s++) {
    if (!t.n[s]) continue;
    wilson(t.k[s], t.n[s], &lo, &hi);
    printf("| %d | %d | %d | %.1f%% | %.1f%% – %.1f%% |\n", s, t.n[s], t.k[s], 100.0 * t.k[s] / t.n[s], 100 * lo,
           100 * hi);
  }
  wilson(t.k[1] + t.k[2], t.n[1] + t.n[2], &lo, &hi);
  if (t.n[1] + t.n[2])
    printf("| 1–2 | %d | %d | %.1f%% | %.1f%% – %.1f%% |\n", t.n[1] + t.n[2], t.k[1] + t.k[2],
           100.0 * (t.k[1] + t.k[2]) / (t.n[1] + t.n[2]), 100 * lo, 100 * hi);
  wilson(t.correct, t.total, &lo, &hi);
  printf("| all | %d | %d | %.1f%% | %.1f%% – %.1f%% |\n", t.total, t.correct, 100.0 * t.correct / t.total, 100 * lo,
         100 * hi);
  printf("\n%d problems (%d resumed from the output file); %lld tokens in %.1f s of generation (prefill included): "
         "%.2f tok/s; %.2f forwards per block; %.2f tokens per forward; %.1f positions per forward; seed %lld + id%s\n",
         t.total, resumed, t.tokens, t.seconds, t.seconds > 0 ? t.tokens / t.seconds : 0.0,
         t.blocks ? (double)t.forwards / t.blocks : 0.0, t.forwards ? (double)t.tokens / t.forwards : 0.0,
         t.forwards ? (double)t.positions / t.forwards : 0.0, o->seed,
         interrupted ? "; INTERRUPTED: rerun the same command to resume" : "");
  dg_context_free(ctx);
  if (interrupted) {
    fprintf(stderr, "dgemma eval: interrupted after %d problems; %s\n", t.total,
            o->out ? "rerun the same command to resume" : "no -o file was given, nothing to resume from");
    return 128 + g_interrupted;
  }
  return 0;
}

static int eval_text(dg_model *m, const eval_opts *o) {
  FILE *f = open_or_die(o->file, "r");
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int C = info.canvas_length, V = info.vocab_size;
  dg_context_params cp = dg_context_default_params();
  cp.max_context = 4096 < info.max_position_embeddings ? 4096 : info.max_position_embeddings; /* grown below */
  dg_context *ctx;
  dg_status st = dg_context_new(m, &cp, &ctx);
  if (st) die_st("context", st);
  float *lg = malloc((size_t)C * V * sizeof(float));
  int32_t *canvas = malloc((size_t)C * sizeof(int32_t));
  double tot = 0;
  long long ntok = 0;
  int nwin = 0, lineno = 0;
  char *line = NULL;
  size_t cap = 0;
  double t0 = wall();
  while (getline(&line, &cap, f) > 0) {
    lineno++;
    if (blank(line)) continue;
    if (o->limit > 0 && nwin >= o->limit) break;
    cJSON *j = cJSON_Parse(line);
    size_t nc = 0, nt = 0, nn = 0;
    int32_t *c = j ? json_ids(cJSON_GetObjectItemCaseSensitive(j, "context"), V, &nc) : NULL;
    int32_t *t = j ? json_ids(cJSON_GetObjectItemCaseSensitive(j, "target"), V, &nt) : NULL;
    int32_t *z = j ? json_ids(cJSON_GetObjectItemCaseSensitive(j, "noise"), V, &nn) : NULL;
    if (!c || !t || !z || !nc || nt != (size_t)C || nn != (size_t)C) {
      fprintf(stderr,
              "dgemma eval: %s line %d: expected {\"context\": [ids], \"target\": [%d ids], \"noise\": [%d ids]}, ids in "
              "[0, %d)\n",
              o->file, lineno, C, C, V);
      exit(1);
    }
    /* the context grows for a longer one (it had been fixed at 4096 positions: a longer context ended the run
     * with "context length exceeded", naming no line); one past the model's positions is an error naming the line */
    if ((int64_t)nc + C > info.max_position_embeddings) {
      fprintf(stderr,
              "dgemma eval: %s line %d: a context of %zu ids + the canvas of %d needs %lld positions, past the model's "
              "max_position_embeddings %d\n",
              o->file, lineno, nc, C, (long long)nc + C, info.max_position_embeddings);
      exit(1);
    }
    if ((int64_t)nc > cp.max_context) {
      dg_context_free(ctx);
      cp.max_context = (int32_t)nc;
      if ((st = dg_context_new(m, &cp, &ctx))) die_st("context", st);
    }
    dg_context_reset(ctx);
    if ((st = dg_encode(ctx, c, nc))) die_st("encode", st);
    for (int i = 0; i < C; i++) {
      for (int q = 0; q < C; q++) canvas[q] = q < i ? t[q] : z[q];
      if ((st = dg_decode(ctx, canvas, NULL, lg))) die_st("decode", st);
      const float *row = lg + (size_t)i * V;
      double mx = -INFINITY, s = 0;
      for (int v = 0; v < V; v++) mx = fmax(mx, row[v]);
      for (int v = 0; v < V; v++) s += exp(row[v] - mx);
      tot += -(row[t[i]] - mx - log(s));
      ntok++;
    }
    nwin++;
    if (o->progress) fprintf(stderr, "\r[%d windows, %.4f nats/token, %.1f s]", nwin, tot / ntok, wall() - t0);
    free(c); free(t); free(z);
    cJSON_Delete(j);
  }
  if (o->progress) fprintf(stderr, "\n");
  if (nwin == 0) {
    fprintf(stderr, "dgemma eval: %s holds no windows\n", o->file);
    exit(1);
  }
  printf("sequential canvas code length: %.4f nats/token over %lld tokens (%d windows, canvas %d), %.1f s\n",
         ntok ? tot / ntok : 0.0, ntok, nwin, C, wall() - t0);
  free(line);
  free(lg);
  free(canvas);
  fclose(f);
  dg_context_free(ctx);
  return 0;
}

int dg_cli_eval(dg_model *m, const eval_opts *o) {
  if (!strcmp(o->what, "problems")) return eval_problems(m, o);
  if (!strcmp(o->what, "text")) return eval_text(m, o);
  fprintf(stderr, "dgemma eval: unknown evaluation \"%s\" (problems, text)\n", o->what);
  return 2;
}

/* ---- gsm8k (tools/gsm8k.c holds the harness; this is the model side) ------ */

/* test.jsonl and train.jsonl in dir? */
static int gsm8k_dir_ok(const char *dir) {
  char *a = NULL, *b = NULL;
  int ok = asprintf(&a, "%s/test.jsonl", dir) > 0 && asprintf(&b, "%s/train.jsonl", dir) > 0 &&
           access(a, R_OK) == 0 && access(b, R_OK) == 0;
  free(a);
  free(b);
  return ok;
}

int dg_cli_gsm8k_load(const eval_opts *o, gsm8k_inputs *in) {
  memset(in, 0, sizeof *in);
  if (o->data) {
    snprintf(in->dir, sizeof in->dir, "%s", o->data);
  } else {
    /* the repository is the executable's ../ (build/dgemma); the data lives next to it in ../shared */
    char exe[PATH_MAX], *cand[2] = {NULL, NULL};
    int nc = 0;
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
      exe[k] = 0;
      char *slash = strrchr(exe, '/');
      if (slash) { *slash = 0; if (asprintf(&cand[nc], "%s/../../shared/data/gsm8k", exe) > 0) nc++; }
    }
    if ((cand[nc] = strdup("../shared/data/gsm8k"))) nc++;
    for (int i = 0; i < nc && !in->dir[0]; i++)
      if (gsm8k_dir_ok(cand[i])) snprintf(in->dir, sizeof in->dir, "%s", cand[i]);
    if (!in->dir[0])
      fprintf(stderr, "dgemma eval: GSM8K data not found (looked for test.jsonl and train.jsonl in %s%s%s); "
                      "pass --data DIR\n", nc ? cand[0] : "", nc > 1 ? " and " : "", nc > 1 ? cand[1] : "");
    for (int i = 0; i < nc; i++) free(cand[i]);
    if (!in->dir[0]) return 1;
  }
  char path[sizeof in->dir + 16], err[sizeof in->dir + 256];
  snprintf(path, sizeof path, "%s/test.jsonl", in->dir);
  if (gsm8k_load(path, o->limit, &in->test, err, sizeof err)) {
    fprintf(stderr, "dgemma eval: %s\n", err);
    return 1;
  }
  int shots = o->shots >= 0 ? o->shots : (o->chat ? 0 : 5);
  snprintf(path, sizeof path, "%s/train.jsonl", in->dir);
  if (gsm8k_load(path, shots > 0 ? shots : 1, &in->train, err, sizeof err)) {
    fprintf(stderr, "dgemma eval: %s\n", err);
    gsm8k_set_free(&in->test);
    return 1;
  }
  if (in->train.n < shots) {
    fprintf(stderr, "dgemma eval: %s holds %d records; %d-shot prompts need %d\n", path, in->train.n, shots, shots);
    gsm8k_set_free(&in->test);
    gsm8k_set_free(&in->train);
    return 1;
  }
  return 0;
}

typedef struct gsm8k_gen_state {
  dg_model *m;
  dg_context *ctx;
  int32_t ctx_cap, C;
  dg_gen_params gp;
  long long seed;
  int chat;
  int32_t bos;
  /* per generation */
  int32_t *ids;
  size_t n, cap;
  int32_t visible; /* of the n tokens, the generated text (dg_block_info.n_visible): what "tokens" counts */
  int32_t forwards, blocks, eos, stopped, oom;
} gsm8k_gen_state;

static int gsm8k_on_step(const dg_step_info *si, void *ud) {
  (void)si; (void)ud;
  return g_interrupted ? 1 : 0;
}

/* Collect the block; stop early once a stop string has appeared (vLLM stops
 * at the token that completes it; a block-diffusion model can only stop at a
 * block boundary, and the text is cut at the string either way). */
static int gsm8k_on_block(const dg_block_info *bi, void *ud) {
  gsm8k_gen_state *g = ud;
  if (g->n + (size_t)bi->n_valid > g->cap) {
    size_t cap = (g->n + (size_t)bi->n_valid) * 2;
    int32_t *ni = realloc(g->ids, cap * sizeof *ni);
    if (!ni) { g->oom = 1; return 1; }
    g->ids = ni;
    g->cap = cap;
  }
  memcpy(g->ids + g->n, bi->tokens, (size_t)bi->n_valid * sizeof(int32_t));
  g->n += (size_t)bi->n_valid;
  g->visible += bi->n_visible;
  g->forwards += bi->n_steps;
  g->blocks++;
  g->eos = bi->finished;
  if (g_interrupted) return 1;
  if (bi->finished) return 0;
  char *text = NULL;
  if (dg_detokenize(g->m, g->ids, g->n, 0, &text) != DG_OK) return 0;
  size_t cut = gsm8k_stop_cut(text, gsm8k_stop_strings, gsm8k_n_stop_strings, NULL);
  g->stopped = cut < strlen(text);
  dg_free(text);
  return g->stopped;
}

static int gsm8k_generate(void *ud, const char *prompt, int idx, gsm8k_gen_out *out, char *err, size_t errlen) {
  gsm8k_gen_state *g = ud;
  int32_t *ids = NULL, *pids = NULL;
  size_t n = 0, np = 0;
  dg_status st;
  if (g->chat) {
    dg_chat_message msg = {"user", prompt};
    st = dg_chat_apply(g->m, &msg, 1, 0, &ids, &n);
  } else {
    /* completion prompt: <bos> + the text (Gemma tokenizers do not add it; the chat template does) */
    st = dg_tokenize(g->m, prompt, strlen(prompt), 0, &pids, &np);
    if (!st) {
      ids = malloc((np + 1) * sizeof *ids);
      if (!ids) st = DG_ERR_OUT_OF_MEMORY;
      else { ids[0] = g->bos; memcpy(ids + 1, pids, np * sizeof *ids); n = np + 1; }
    }
    dg_free(pids);
  }
  if (st) { snprintf(err, errlen, "item %d: prompt: %s: %s", idx, dg_status_str(st), dg_last_error()); goto fail; }
  int32_t ncanv = (g->gp.max_new_tokens + g->C - 1) / g->C;
  int64_t need = (int64_t)n + (int64_t)ncanv * g->C;
  if (need > INT32_MAX) { snprintf(err, errlen, "item %d: prompt of %zu tokens is too long", idx, n); goto fail; }
  if (!g->ctx || need > g->ctx_cap) {
    dg_context_free(g->ctx);
    g->ctx = NULL;
    dg_context_params cp = dg_context_default_params();
    cp.max_context = (int32_t)(need + need / 4 < INT32_MAX ? need + need / 4 : need);
    if ((st = dg_context_new(g->m, &cp, &g->ctx))) {
      snprintf(err, errlen, "item %d: context of %d tokens: %s: %s", idx, cp.max_context, dg_status_str(st),
               dg_last_error());
      goto fail;
    }
    g->ctx_cap = cp.max_context;
  }
  dg_context_reset(g->ctx);
  g->n = 0; g->visible = 0; g->forwards = 0; g->blocks = 0; g->eos = 0; g->stopped = 0; g->oom = 0;
  dg_gen_params gp = g->gp;
  gp.seed = (uint64_t)(g->seed + idx);
  gp.on_block = gsm8k_on_block;
  gp.on_step = gsm8k_on_step;
  gp.user_data = g;
  dg_gen_result r;
  double t0 = wall();
  st = dg_generate(g->ctx, ids, n, &gp, &r);
  double secs = wall() - t0;
  free(ids);
  ids = NULL;
  if (st == DG_OK) dg_gen_result_free(&r);
  if (g_interrupted) return 1;
  if (g->oom) { snprintf(err, errlen, "item %d: out of memory", idx); return -1; }
  if (st && !(st == DG_ERR_ABORTED && g->stopped)) {
    snprintf(err, errlen, "item %d: generate: %s: %s", idx, dg_status_str(st), dg_last_error());
    return -1;
  }
  char *text = NULL;
  if ((st = dg_detokenize(g->m, g->ids, g->n, 0, &text))) {
    snprintf(err, errlen, "item %d: detokenize: %s: %s", idx, dg_status_str(st), dg_last_error());
    return -1;
  }
  out->text = strdup(text);
  dg_free(text);
  if (!out->text) { snprintf(err, errlen, "out of memory"); return -1; }
  /* generated text only: with {"eos_token_id": []} the hidden <eos> canvases after the answer are
   * not tokens (they would inflate tok/s), as in `dgemma run` */
  out->tokens = g->visible;
  out->forwards = g->forwards;
  out->blocks = g->blocks;
  out->eos = g->eos;
  out->seconds = secs;
  return 0;
fail:
  free(ids);
  return -1;
}

int dg_cli_gsm8k(dg_model *m, const eval_opts *o, gsm8k_inputs *in) {
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int shots = o->shots >= 0 ? o->shots : (o->chat ? 0 : 5);
  gsm8k_gen_state g = {0};
  g.m = m;
  g.C = info.canvas_length;
  g.gp = o->gen;
  g.seed = o->seed;
  g.chat = o->chat;
  int32_t *bos = NULL;
  size_t nb = 0;
  if (!o->chat) {
    if (dg_tokenize(m, "<bos>", 5, 1, &bos, &nb) != DG_OK || nb != 1) {
      fprintf(stderr, "dgemma eval: the tokenizer has no single <bos> token for the completion prompt\n");
      dg_free(bos);
      return 1;
    }
    g.bos = bos[0];
    dg_free(bos);
  }
  char config[2048], title[1024];
  snprintf(config, sizeof config,
           "gsm8k %s shots=%d max_new_tokens=%d steps=%d proposal=%s seed=%lld%s%s%s model=%s",
           o->chat ? "chat" : "completion", shots, g.gp.max_new_tokens, g.gp.max_denoising_steps,
           g.gp.proposal == DG_PROPOSAL_ARGMAX ? "argmax" : "sample", o->seed, o->reference_kernels ? " kernels=ref" : "",
           o->gen_kwargs ? " gen_kwargs=" : "", o->gen_kwargs ? o->gen_kwargs : "", o->model_dir);
  snprintf(title, sizeof title, "GSM8K %d-shot %s (vLLM harness conventions), %s", shots,
           o->chat ? "chat, thinking off" : "completion", o->model_dir);
  gsm8k_run_opts ro = {&in->test, &in->train, shots, o->chat, o->out, config, o->progress, o->tty};
  stop_signals_catch();
  if (o->progress)
    fprintf(stderr, "gsm8k: %d items from %s: %s\n", in->test.n, in->dir, title);
  char err[2048] = "";
  gsm8k_summary s;
  int rc = gsm8k_run(&ro, gsm8k_generate, &g, &s, err, sizeof err);
  /* From here to the exit a signal is only recorded (the handler stays installed): the --summary
   * file is replaced by a whole new one or left as it was, never by the summary of an interrupted
   * run; exit 128 + sig always means it was left (outfile.h). */
  g_hold_signals = 1;
  dg_context_free(g.ctx);
  free(g.ids);
  if (rc < 0) fprintf(stderr, "dgemma eval: %s\n", err);
  if (rc < 0 && s.n == 0) return g_interrupted ? 128 + g_interrupted : 1;
  gsm8k_summary_markdown(stdout, title, &s);
  fflush(stdout);
  int committed = 0, failed = 0;
  if (o->summary && g_interrupted) {
    fprintf(stderr, "dgemma eval: --summary %s not written (interrupted): a file there is kept as it was\n",
            o->summary);
  } else if (o->summary) {
    /* the whole file or the old one (outfile.h: a temporary file renamed; a device written in place) */
    char *js = gsm8k_summary_json(title, config, &s);
    FILE *f = js ? out_try_open(o->summary, "dgemma eval") : NULL;
    if (!js) fprintf(stderr, "dgemma eval: cannot write %s: out of memory\n", o->summary);
    if (f && fprintf(f, "%s\n", js) < 0) {
      fprintf(stderr, "dgemma eval: cannot write %s: %s\n", o->summary, strerror(errno));
      out_discard(f);
      f = NULL;
    } else if (f && g_interrupted) { /* a signal while it was written: the old file stays */
      fprintf(stderr, "dgemma eval: --summary %s not written (interrupted): a file there is kept as it was\n",
              o->summary);
      out_discard(f);
      f = NULL;
    } else if (f && out_commit(f, o->summary)) {
      f = NULL;
    } else if (f) {
      committed = 1; /* a signal from now on is only recorded: the new file is whole */
    }
    free(js);
    failed = !committed && !g_interrupted;
  }
  if (g_interrupted && !committed) {
    if (rc > 0)
      fprintf(stderr, "dgemma eval: interrupted after %d of %d items; %s\n", s.n, s.n_target,
              o->out ? "rerun the same command to resume" : "no -o file was given, nothing to resume from");
    else
      fprintf(stderr, "dgemma eval: interrupted after the last item; %s\n",
              o->out ? "rerun the same command to write the summary" : "no -o file was given, nothing to resume from");
    return 128 + g_interrupted;
  }
  return rc < 0 || failed ? 1 : 0;
}
