/* serve.c: `dgemma serve`: the HTTP endpoints on libmicrohttpd (one thread per
 * connection), a scheduler thread that owns every model pass, Prometheus
 * metrics, the live canvas page, and the CLI command. See serve.h.
 *
 * Scheduling. Connection threads parse and tokenize a request, then queue a
 * job. The scheduler admits queued turbo jobs into a dg_batch (continuous
 * batching: at most --max-batch live canvases; a job joins between denoising
 * steps, its prompt prefilled on joining, and leaves when it finishes) and
 * runs dg_batch_step: one stacked decoder pass over every live canvas per
 * denoising step. Jobs with the reference sampler (no batched engine) run
 * one at a time through dg_generate when the batch is empty. The engine's
 * block callback turns each committed canvas into text (SSE chunk or the
 * final message); its step callback writes the opt-in draft-canvas event and
 * tells the engine when the client has gone (its canvas is cancelled at the
 * next step).
 *
 * Prompt cache (--cache-slots N, llama-server's cache_prompt, vLLM's prefix
 * caching). A finished request's context (its prompt and the canvases it
 * committed, all but the last) is kept with its token sequence, at most N of
 * them, the least recently used evicted. A new request's context starts as a
 * copy of the cached one sharing the longest token prefix with its prompt
 * (dg_context_copy_prefix) and only the rest of the prompt is prefilled, so a
 * conversation's follow-up turn does not prefill the turns before it again.
 * The copy holds the same K/V bits a prefill would, so the answer is the same
 * (test_serve; on CUDA the bits of a prefill split where the copy ends:
 * dgemma.h). The cache belongs to the scheduler thread. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cliarg.h"
#include "serve.h"

dg_serve_opts dg_serve_default_opts(void) {
  dg_serve_opts o;
  memset(&o, 0, sizeof o);
  o.host = "127.0.0.1";
  o.port = 8080;
  o.max_batch = 4;
  o.max_queue = 256;
  o.timeout_s = 30;
  o.cache_slots = 4;
  o.lim.max_body = 1 << 20;
  o.lim.max_messages = 256;
  o.lim.max_tokens = 8192;
  o.lim.max_context = 16384;
  return o;
}

#include <arpa/inet.h> /* inet_pton: --host is checked with or without libmicrohttpd */

#ifdef DG_HAVE_MHD

#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

extern const char dg_serve_page_html[]; /* tools/serve_page.html, embedded by the Makefile */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- growable byte buffer ---- */
typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static int sbuf_put(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->n + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

/* ---- jobs ---- */
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

typedef struct dg_server dg_server;

typedef struct job {
  dg_server *srv;
  struct job *next;       /* queue link */
  int refs;               /* the connection and the scheduler (under srv->mu) */
  dg_srv_request req;
  dg_gen_params gp;
  int32_t *prompt;
  size_t n_prompt;
  int turbo;
  char id[48];
  long created;
  int state;
  volatile int cancelled; /* the client went away */
  int stop_early;         /* a stop string ended it: the engine was told to stop */
  dg_status status;       /* engine failure (DG_OK otherwise) */
  char errmsg[512];
  dg_context *ctx;
  int32_t cap;            /* ctx's positions */
  int32_t n_cached;       /* prompt tokens copied from the prompt cache, not prefilled */
  int32_t *blk, n_blk;    /* every canvas's tokens as the engine made them (the committed ones are the cache's key) */
  int blk_lost;           /* out of memory for blk: the context is not cached */
  dg_gen_result res;
  int32_t slot;
  /* output, written by the scheduler (callbacks), read by the connection; under srv->mu */
  int32_t *toks;          /* generated tokens kept (<= max_tokens, up to and including a stop id) */
  int32_t n_toks, cap_toks, max_tokens, cut; /* cut: max_tokens dropped tokens */
  int32_t completion_tokens;
  sbuf text;              /* the text emitted so far */
  sbuf out;               /* SSE bytes not yet sent (streams) */
  int closed;             /* no more output will come */
  const char *finish;     /* "stop", "length", "repetition" */
  double t0, t_end;
  double prefill_s;       /* the context (prompt cache copy included) and the prompt's prefill, s; < 0: not measured */
  int32_t n_steps, n_blocks;
  pthread_cond_t cv;
} job;

struct dg_server {
  dg_model *m;
  dg_model_info info;
  dg_serve_opts o;
  char model_id[256];
  dg_gen_params defaults;
  struct MHD_Daemon *d;
  int port;
  pthread_t sched;
  int sched_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* the scheduler's: a job was queued, or stop */
  int stopping;
  job *qhead, *qtail;
  int32_t n_queued, n_running;
  dg_batch *batch;
  job **slots;            /* [max_batch] the job in each batch slot */
  unsigned long long next_id;
  /* metrics (under mu) */
  unsigned long long prompt_tokens, completion_tokens, steps_total, ref_forwards, canvases_total, requests_ok, requests_err,
      requests_cancelled;
  double step_seconds;
  double last_step_ms;
  unsigned long long http_2xx, http_4xx, http_5xx;
  int32_t n_generating;   /* generation requests whose response is not yet sent (under mu) */
  /* the prompt cache (scheduler thread; the counters under mu) */
  struct cache_entry *cache; /* [o.cache_slots] */
  int32_t n_cache;
  int cache_off;          /* a copy failed with DG_ERR_BACKEND: the backend cannot copy a context, or the device failed */
  unsigned long long cache_tick, prompt_tokens_cached, cache_hits;
  long long cache_positions;
};

/* A finished context and the tokens its KV cache holds. */
typedef struct cache_entry {
  dg_context *ctx;
  int32_t *toks, n;
  unsigned long long used; /* cache_tick of its last use */
} cache_entry;

static void logf_(dg_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(dg_server *s, const char *fmt, ...) {
  if (!s->o.log) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(s->o.log, fmt, ap);
  va_end(ap);
  fputc('\n', s->o.log);
  fflush(s->o.log);
}

/* Drop a reference (under srv->mu); the last one frees the job. */
static void job_unref(job *j) {
  if (--j->refs > 0) return;
  dg_srv_request_free(&j->req);
  free(j->prompt);
  free(j->toks);
  free(j->blk);
  free(j->text.p);
  free(j->out.p);
  dg_gen_result_free(&j->res);
  dg_context_free(j->ctx);
  pthread_cond_destroy(&j->cv);
  free(j);
}

/* ---- response pieces ---- */

static const char *finish_name(dg_finish_reason r) {
  return r == DG_FINISH_STOP ? "stop" : r == DG_FINISH_REPETITION ? "repetition" : "length";
}

/* A streaming chunk: content text (NULL = none), finish reason (NULL = null), role on the first. */
static char *chunk_json(job *j, const char *text, const char *finish, int role) {
  dg_server *s = j->srv;
  cJSON *r = cJSON_CreateObject();
  const int chat = j->req.kind == DG_SRV_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", s->model_id);
  cJSON *ch = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
  cJSON_AddItemToArray(ch, c);
  cJSON_AddNumberToObject(c, "index", 0);
  if (chat) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (text) cJSON_AddStringToObject(d, "content", text);
  } else {
    cJSON_AddStringToObject(c, "text", text ? text : "");
  }
  cJSON_AddNullToObject(c, "logprobs");
  if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
  else cJSON_AddNullToObject(c, "finish_reason");
  char *out = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  return out;
}

static cJSON *usage_json(job *j) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", j->completion_tokens);
  cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_prompt + j->completion_tokens);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", j->n_cached);
  return u;
}

/* dgemma's own numbers of a finished job (extension "dgemma" of the response). */
static cJSON *stats_json(job *j) {
  cJSON *x = cJSON_CreateObject();
  double sec = j->t_end - j->t0;
  cJSON_AddNumberToObject(x, "canvases", j->n_blocks);
  cJSON_AddNumberToObject(x, "denoising_steps", j->n_steps);
  cJSON_AddNumberToObject(x, "seconds", sec);
  if (j->prefill_s >= 0) cJSON_AddNumberToObject(x, "prefill_seconds", j->prefill_s);
  else cJSON_AddNullToObject(x, "prefill_seconds");
  cJSON_AddNumberToObject(x, "tokens_per_second", sec > 0 ? j->completion_tokens / sec : 0.0);
  cJSON_AddStringToObject(x, "sampler", j->turbo ? "turbo" : "reference");
  return x;
}

static void sse_data(job *j, const char *event, const char *data) {
  if (event) {
    sbuf_put(&j->out, "event: ", 7);
    sbuf_put(&j->out, event, strlen(event));
    sbuf_put(&j->out, "\n", 1);
  }
  sbuf_put(&j->out, "data: ", 6);
  sbuf_put(&j->out, data, strlen(data));
  sbuf_put(&j->out, "\n\n", 2);
}

/* Mark j finished (under mu): the stream's last chunks, or wake the waiting connection. */
static void job_close(job *j) {
  if (j->closed) return;
  j->closed = 1;
  j->state = JOB_DONE;
  j->t_end = now_s();
  if (j->t0 == 0) j->t0 = j->t_end; /* cancelled in the queue: it never ran (0 s, not the time since boot) */
  if (j->req.stream) {
    if ((j->status && !j->stop_early) || (j->cancelled && !j->finish)) {
      dg_srv_error e;
      if (j->status) dg_srv_fail(&e, 500, NULL, "generation_failed", "%s", j->errmsg);
      else dg_srv_fail(&e, 503, NULL, "cancelled", "the request was cancelled (the server is stopping)");
      char *ej = dg_srv_error_json(&e);
      if (ej) sse_data(j, NULL, ej);
      free(ej);
      sse_data(j, NULL, "[DONE]"); /* the stream's end, as after an answer (clients wait for it) */
    } else {
      char *c = chunk_json(j, j->req.kind == DG_SRV_CHAT ? NULL : "", j->finish, 0);
      if (c) sse_data(j, NULL, c);
      free(c);
      if (j->req.include_usage) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "id", j->id);
        cJSON_AddStringToObject(r, "object", j->req.kind == DG_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddNumberToObject(r, "created", (double)j->created);
        cJSON_AddStringToObject(r, "model", j->srv->model_id);
        cJSON_AddArrayToObject(r, "choices");
        cJSON_AddItemToObject(r, "usage", usage_json(j));
        cJSON_AddItemToObject(r, "dgemma", stats_json(j));
        char *u = cJSON_PrintUnformatted(r);
        cJSON_Delete(r);
        if (u) sse_data(j, NULL, u);
        free(u);
      }
      sse_data(j, NULL, "[DONE]");
    }
  }
  pthread_cond_broadcast(&j->cv);
}

/* ---- engine callbacks (scheduler thread) ---- */

/* Of ids[n], the tokens the text shows (the detokenizer drops pad and special tokens): what usage counts
 * as completion tokens, as dg_gen_result.n_visible does (the <eos> canvases after an answer without stop
 * ids are not generated text). */
static int32_t shown_tokens(const dg_model *m, const int32_t *ids, int32_t n) {
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++) {
    char *t = NULL;
    if (dg_detokenize(m, ids + i, 1, 0, &t) == DG_OK && t && *t) k++;
    dg_free(t);
  }
  return k;
}

/* Emit the text of j->toks that is settled (stop strings, incomplete characters); final = no more tokens. */
static void emit_text(job *j, int final) {
  dg_server *s = j->srv;
  char *t = NULL;
  if (dg_detokenize(s->m, j->toks, (size_t)j->n_toks, 0, &t) != DG_OK) return;
  size_t n = strlen(t);
  if (!final) n = dg_srv_stable_len(t, n);
  int hit = 0;
  size_t safe = dg_srv_stop_scan(t, n, j->req.stop, j->req.n_stop, final, &hit);
  if (hit) {
    j->stop_early = 1;
    j->finish = "stop";
    /* completion tokens: the fewest tokens whose text reaches the stop string */
    int32_t k = 0;
    for (k = 1; k <= j->n_toks; k++) {
      char *p = NULL;
      if (dg_detokenize(s->m, j->toks, (size_t)k, 0, &p) != DG_OK) break;
      size_t l = strlen(p);
      dg_free(p);
      if (l > safe) break;
    }
    j->completion_tokens = shown_tokens(s->m, j->toks, k <= j->n_toks ? k : j->n_toks);
  }
  if (safe > j->text.n && !memcmp(t, j->text.p ? j->text.p : "", j->text.n)) {
    size_t old = j->text.n;
    sbuf_put(&j->text, t + old, safe - old);
    if (j->req.stream) {
      char *c = chunk_json(j, j->text.p + old, NULL, 0);
      if (c) sse_data(j, NULL, c);
      free(c);
    }
  }
  dg_free(t);
}

static int on_block(const dg_block_info *bi, void *ud) {
  job *j = ud;
  dg_server *s = j->srv;
  pthread_mutex_lock(&s->mu);
  int32_t *bp = realloc(j->blk, (size_t)(j->n_blk + bi->n_tokens) * sizeof *bp); /* the prompt cache's key */
  if (bp) {
    memcpy(bp + j->n_blk, bi->tokens, (size_t)bi->n_tokens * sizeof *bp);
    j->blk = bp;
    j->n_blk += bi->n_tokens;
  } else {
    j->blk_lost = 1;
  }
  int32_t take = bi->n_valid;
  if (j->n_toks + take > j->max_tokens) {
    j->cut = 1;
    take = j->max_tokens - j->n_toks;
  }
  if (take > 0 && j->n_toks + take > j->cap_toks) {
    int32_t cap = (j->n_toks + take) * 2;
    int32_t *p = realloc(j->toks, (size_t)cap * sizeof *p);
    if (p) { j->toks = p; j->cap_toks = cap; }
    else take = 0;
  }
  if (take > 0) {
    memcpy(j->toks + j->n_toks, bi->tokens, (size_t)take * sizeof(int32_t));
    j->n_toks += take;
    /* the visible tokens (issue 16: not the hidden <eos> canvases); the engine counted the whole block's */
    j->completion_tokens += take == bi->n_valid ? bi->n_visible : shown_tokens(s->m, bi->tokens, take);
  }
  j->n_blocks++;
  j->n_steps += bi->n_steps;
  emit_text(j, 0);
  int stop = j->stop_early || j->cancelled || j->cut;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&s->mu);
  return stop;
}

/* One canvas as an array of token pieces (special tokens by name). */
static cJSON *pieces_json(const dg_model *m, const int32_t *ids, int32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (int32_t i = 0; i < n; i++) {
    char *t = NULL;
    if (dg_detokenize(m, ids + i, 1, 1, &t) == DG_OK) {
      cJSON_AddItemToArray(a, cJSON_CreateString(t));
      dg_free(t);
    } else {
      cJSON_AddItemToArray(a, cJSON_CreateString("?"));
    }
  }
  return a;
}

static int on_step(const dg_step_info *si, void *ud) {
  job *j = ud;
  dg_server *s = j->srv;
  if (j->req.draft && j->req.stream) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddNumberToObject(r, "block", si->block);
    cJSON_AddNumberToObject(r, "step", si->step);
    cJSON_AddNumberToObject(r, "accepted", si->n_accepted);
    cJSON_AddNumberToObject(r, "active", si->n_active);
    cJSON_AddNumberToObject(r, "mean_entropy", si->mean_entropy);
    cJSON_AddItemToObject(r, "draft", pieces_json(s->m, si->argmax, si->canvas_length));
    cJSON *settled = cJSON_AddArrayToObject(r, "settled");
    for (int32_t i = 0; i < si->canvas_length; i++)
      cJSON_AddItemToArray(settled, cJSON_CreateBool(si->canvas[i] == si->argmax[i]));
    char *d = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    pthread_mutex_lock(&s->mu);
    if (d) sse_data(j, "dgemma.canvas", d);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
    free(d);
  }
  return j->cancelled;
}

/* ---- prompt cache (scheduler thread) ---- */

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
  int32_t k = 0;
  while (k < na && k < nb && a[k] == b[k]) k++;
  return k;
}

static void cache_drop(dg_server *s, int32_t i) {
  cache_entry *e = &s->cache[i];
  s->cache_positions -= e->n;
  dg_context_free(e->ctx);
  free(e->toks);
  *e = s->cache[--s->n_cache];
}

/* The fewest shared prompt tokens the cache reuses. Every chat prompt begins with the same template
 * tokens and every completion with <bos>: a few shared tokens say nothing of a conversation, copying
 * them saves nothing, and taking them as a hit would refresh an unrelated entry's place in the LRU
 * order (a newer conversation was then evicted first: session 15's review). */
#define CACHE_MIN_REUSE 8

/* Start j's new context from the cached context that shares the longest token prefix with its prompt
 * (at least CACHE_MIN_REUSE tokens; on a tie the most recently used)
 * (one prompt token at least is left to prefill: the engine starts from the prompt's end): its K/V of
 * that prefix copied, j->n_cached = its length. Nothing on a miss or a failed copy (then the whole
 * prompt is prefilled as without a cache). */
static void cache_lookup(dg_server *s, job *j) {
  int32_t best = -1, bp = 0;
  for (int32_t i = 0; i < s->n_cache; i++) {
    int32_t p = common_prefix(s->cache[i].toks, s->cache[i].n, j->prompt, (int32_t)j->n_prompt);
    if (p > (int32_t)j->n_prompt - 1) p = (int32_t)j->n_prompt - 1;
    if (p > bp || (p == bp && best >= 0 && s->cache[i].used > s->cache[best].used)) { bp = p; best = i; }
  }
  if (best < 0 || bp < CACHE_MIN_REUSE) return;
  dg_status st = dg_context_copy_prefix(j->ctx, s->cache[best].ctx, bp);
  if (st) {
    logf_(s, "dgemma serve: prompt cache: %s: %s%s", dg_status_str(st), dg_last_error(),
          st == DG_ERR_BACKEND ? "; the cache is off" : "");
    if (st == DG_ERR_BACKEND) s->cache_off = 1;
    return;
  }
  j->n_cached = bp;
  s->cache[best].used = ++s->cache_tick;
}

/* Keep j's finished context (under mu): its tokens are the prompt and the canvases it committed.
 * Entries whose tokens begin this one's go (it holds them); beyond o.cache_slots the least recently
 * used goes. A context with much unused room (max_tokens above what was generated) is first copied
 * into one of its length, and a kept context's working buffers are released (dg_context_release_buffers:
 * on the CPU its pass activations (and the separate canvas K/V rows of a canvas past its capacity: the
 * canvas K/V live in the cache's own slots otherwise), ~5x the KV of a short conversation on the bundled
 * model), so an entry holds the KV cache of its tokens (on CUDA also the context's device work buffers). */
static void cache_store(dg_server *s, job *j) {
  if (!s->o.cache_slots || s->cache_off || !j->ctx || j->blk_lost) return;
  const int32_t len = dg_context_length(j->ctx), gen = len - (int32_t)j->n_prompt, C = s->info.canvas_length;
  if (gen < 0 || gen > j->n_blk) return;
  int32_t *toks = malloc((size_t)(len > 0 ? len : 1) * sizeof *toks);
  if (!toks) return;
  memcpy(toks, j->prompt, j->n_prompt * sizeof *toks);
  if (gen) memcpy(toks + j->n_prompt, j->blk, (size_t)gen * sizeof *toks);
  dg_context *ctx = j->ctx;
  if (j->cap - len > C) {
    dg_context_params cp = dg_context_default_params();
    cp.max_context = len;
    dg_context *fit = NULL;
    if (dg_context_new(s->m, &cp, &fit) == DG_OK && dg_context_copy_prefix(fit, ctx, len) == DG_OK) ctx = fit;
    else dg_context_free(fit);
  }
  for (int32_t i = s->n_cache - 1; i >= 0; i--)
    if (s->cache[i].n <= len && common_prefix(s->cache[i].toks, s->cache[i].n, toks, len) == s->cache[i].n)
      cache_drop(s, i);
  if (s->n_cache == s->o.cache_slots) {
    int32_t lru = 0;
    for (int32_t i = 1; i < s->n_cache; i++)
      if (s->cache[i].used < s->cache[lru].used) lru = i;
    cache_drop(s, lru);
  }
  dg_context_release_buffers(ctx); /* only its KV cache is read again (never fails on a context) */
  s->cache[s->n_cache++] = (cache_entry){ctx, toks, len, ++s->cache_tick};
  s->cache_positions += len;
  if (ctx == j->ctx) j->ctx = NULL; /* the cache's now */
}

/* ---- scheduler ---- */

/* A job has left the engine (under mu): its finish reason and metrics; the scheduler's reference goes. */
static void job_finish(dg_server *s, job *j, dg_status st) {
  const int started = j->t0 != 0;
  if (j->cancelled) {
    s->requests_cancelled++;
  } else if (st && !(st == DG_ERR_ABORTED && (j->stop_early || j->cut))) {
    j->status = st;
    snprintf(j->errmsg, sizeof j->errmsg, "%s: %s", dg_status_str(st), dg_last_error());
    s->requests_err++;
  } else {
    if (!j->stop_early) {
      emit_text(j, 1);
      if (!j->finish) j->finish = j->cut ? "length" : finish_name(j->res.finish_reason);
    }
    s->requests_ok++;
    s->completion_tokens += (unsigned long long)j->completion_tokens;
    cache_store(s, j);
  }
  dg_context_free(j->ctx);
  j->ctx = NULL;
  job_close(j);
  s->n_running--;
  logf_(s, "dgemma serve: %s %s: %d prompt (%d cached) + %d completion tokens, %d canvases, %d steps, %.2f s%s%s%s",
        j->id, j->finish ? j->finish : j->cancelled ? "cancelled" : "failed", (int)j->n_prompt, j->n_cached,
        j->completion_tokens, j->n_blocks, j->n_steps, j->t_end - j->t0, started ? "" : " (before it started)", j->status ? ": " : "",
        j->status ? j->errmsg : "");
  job_unref(j);
}

/* The prompt counters of an admitted job (under mu). */
static void cache_count(dg_server *s, job *j) {
  s->prompt_tokens += j->n_prompt;
  s->prompt_tokens_cached += (unsigned long long)j->n_cached;
  s->cache_hits += j->n_cached > 0;
}

/* j's context: its prompt and canvases' positions, started from the prompt cache where it can. */
static dg_status job_context(dg_server *s, job *j) {
  const int32_t C = s->info.canvas_length;
  dg_context_params cp = dg_context_default_params();
  int64_t canv = ((int64_t)j->gp.max_new_tokens + C - 1) / C;
  cp.max_context = j->cap = (int32_t)((int64_t)j->n_prompt + canv * C);
  dg_status st = dg_context_new(s->m, &cp, &j->ctx);
  if (!st && s->o.cache_slots && !s->cache_off) cache_lookup(s, j);
  return st;
}

static void *scheduler(void *arg) {
  dg_server *s = arg;
  const int32_t B = s->o.max_batch;
  int32_t *done = calloc((size_t)B, sizeof *done);
  dg_status *done_st = calloc((size_t)B, sizeof *done_st);
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    /* cancelled canvases leave */
    for (int32_t i = 0; i < B; i++) {
      job *j = s->slots[i];
      if (j && j->cancelled) {
        dg_batch_cancel(s->batch, i);
        s->slots[i] = NULL;
        job_finish(s, j, DG_ERR_ABORTED);
      }
    }
    /* admit turbo jobs at the head of the queue while slots are free */
    while (s->qhead && s->qhead->turbo && dg_batch_live(s->batch) < B) {
      job *j = s->qhead;
      s->qhead = j->next;
      if (!s->qhead) s->qtail = NULL;
      s->n_queued--;
      s->n_running++;
      j->state = JOB_RUNNING;
      if (j->cancelled) { job_finish(s, j, DG_ERR_ABORTED); continue; }
      pthread_mutex_unlock(&s->mu);
      j->t0 = now_s();
      dg_status st = job_context(s, j);
      int32_t slot = -1;
      if (!st)
        st = dg_batch_add(s->batch, j->ctx, j->prompt + j->n_cached, j->n_prompt - (size_t)j->n_cached, &j->gp, &j->res,
                          &slot);
      j->prefill_s = now_s() - j->t0;
      pthread_mutex_lock(&s->mu);
      cache_count(s, j);
      if (st) job_finish(s, j, st);
      else { s->slots[slot] = j; j->slot = slot; s->canvases_total++; }
    }
    int32_t live = dg_batch_live(s->batch);
    if (live == 0 && s->qhead) { /* the reference sampler: alone, through dg_generate */
      job *j = s->qhead;
      s->qhead = j->next;
      if (!s->qhead) s->qtail = NULL;
      s->n_queued--;
      s->n_running++;
      j->state = JOB_RUNNING;
      if (j->cancelled) { job_finish(s, j, DG_ERR_ABORTED); continue; }
      pthread_mutex_unlock(&s->mu);
      j->t0 = now_s();
      j->prefill_s = -1; /* inside dg_generate */
      dg_status st = job_context(s, j);
      if (!st) st = dg_generate(j->ctx, j->prompt + j->n_cached, j->n_prompt - (size_t)j->n_cached, &j->gp, &j->res);
      pthread_mutex_lock(&s->mu);
      cache_count(s, j);
      s->ref_forwards += (unsigned long long)j->res.n_steps;
      s->canvases_total++;
      job_finish(s, j, st);
      continue;
    }
    if (live == 0) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    int32_t n_done = 0;
    double t0 = now_s();
    dg_batch_step(s->batch, done, done_st, &n_done);
    double dt = now_s() - t0;
    pthread_mutex_lock(&s->mu);
    s->steps_total++;
    s->step_seconds += dt;
    s->last_step_ms = dt * 1e3;
    for (int32_t k = 0; k < n_done; k++) {
      job *j = s->slots[done[k]];
      s->slots[done[k]] = NULL;
      if (j) job_finish(s, j, done_st[k]);
    }
  }
  /* stopping: everything still here ends */
  for (int32_t i = 0; i < B; i++)
    if (s->slots[i]) {
      job *j = s->slots[i];
      dg_batch_cancel(s->batch, i);
      s->slots[i] = NULL;
      j->cancelled = 1;
      job_finish(s, j, DG_ERR_ABORTED);
    }
  while (s->qhead) {
    job *j = s->qhead;
    s->qhead = j->next;
    s->n_queued--;
    s->n_running++;
    j->cancelled = 1;
    job_finish(s, j, DG_ERR_ABORTED);
  }
  pthread_mutex_unlock(&s->mu);
  free(done);
  free(done_st);
  return NULL;
}

/* ---- HTTP ---- */

typedef struct conn_state {
  sbuf body;
  int too_large;
  int answered; /* a response was queued on the first call */
  int generating; /* counted in srv->n_generating until the request completes */
} conn_state;

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *ctype, const char *body) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", ctype);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static void count_status(dg_server *s, int status) {
  pthread_mutex_lock(&s->mu);
  if (status < 400) s->http_2xx++;
  else if (status < 500) s->http_4xx++;
  else s->http_5xx++;
  pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_json(dg_server *s, struct MHD_Connection *c, int status, const char *json) {
  count_status(s, status);
  return send_text(c, status, "application/json", json ? json : "{}");
}

static enum MHD_Result send_error(dg_server *s, struct MHD_Connection *c, const dg_srv_error *e) {
  char *j = dg_srv_error_json(e);
  enum MHD_Result r = send_json(s, c, e->status, j);
  free(j);
  if (e->status == 401) {} /* WWW-Authenticate is optional for bearer APIs */
  return r;
}

static int check_auth(dg_server *s, struct MHD_Connection *c, dg_srv_error *e) {
  if (!s->o.api_key) return 0;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *key = s->o.api_key;
  if (h && !strncmp(h, "Bearer ", 7)) {
    const char *g = h + 7;
    size_t a = strlen(g), b = strlen(key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(g[i] ^ key[i]);
    if (!diff) return 0;
  }
  return dg_srv_fail(e, 401, NULL, "invalid_api_key",
                     h ? "incorrect API key provided" : "missing API key: send the header 'Authorization: Bearer KEY'");
}

static char *models_json(dg_server *s) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(r, "data"), *m = cJSON_CreateObject();
  cJSON_AddItemToArray(d, m);
  cJSON_AddStringToObject(m, "id", s->model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "dgemma");
  cJSON_AddNumberToObject(m, "max_model_len", s->o.lim.max_context);
  cJSON_AddNumberToObject(m, "canvas_length", s->info.canvas_length);
  char *out = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  return out;
}

static char *metrics_text(dg_server *s) {
  sbuf b = {0};
  char line[512];
  pthread_mutex_lock(&s->mu);
#define M(...) do { snprintf(line, sizeof line, __VA_ARGS__); sbuf_put(&b, line, strlen(line)); } while (0)
  M("# HELP dgemma_http_responses_total HTTP responses by status class.\n# TYPE dgemma_http_responses_total counter\n");
  M("dgemma_http_responses_total{class=\"2xx\"} %llu\n", s->http_2xx);
  M("dgemma_http_responses_total{class=\"4xx\"} %llu\n", s->http_4xx);
  M("dgemma_http_responses_total{class=\"5xx\"} %llu\n", s->http_5xx);
  M("# HELP dgemma_requests_total Generation requests that left the engine, by outcome.\n"
    "# TYPE dgemma_requests_total counter\n");
  M("dgemma_requests_total{outcome=\"ok\"} %llu\n", s->requests_ok);
  M("dgemma_requests_total{outcome=\"error\"} %llu\n", s->requests_err);
  M("dgemma_requests_total{outcome=\"cancelled\"} %llu\n", s->requests_cancelled);
  M("# HELP dgemma_prompt_tokens_total Prompt tokens of the requests admitted (those from the prompt cache included).\n"
    "# TYPE dgemma_prompt_tokens_total counter\ndgemma_prompt_tokens_total %llu\n", s->prompt_tokens);
  M("# HELP dgemma_prompt_tokens_cached_total Prompt tokens whose K/V came from the prompt cache (not prefilled).\n"
    "# TYPE dgemma_prompt_tokens_cached_total counter\ndgemma_prompt_tokens_cached_total %llu\n", s->prompt_tokens_cached);
  M("# HELP dgemma_prompt_cache_hits_total Requests started from a cached context.\n"
    "# TYPE dgemma_prompt_cache_hits_total counter\ndgemma_prompt_cache_hits_total %llu\n", s->cache_hits);
  M("# HELP dgemma_prompt_cache_contexts Finished contexts kept for reuse (at most --cache-slots).\n"
    "# TYPE dgemma_prompt_cache_contexts gauge\ndgemma_prompt_cache_contexts %d\n", s->n_cache);
  M("# HELP dgemma_prompt_cache_positions Token positions whose K/V the cached contexts hold.\n"
    "# TYPE dgemma_prompt_cache_positions gauge\ndgemma_prompt_cache_positions %lld\n", s->cache_positions);
  M("# HELP dgemma_generation_tokens_total Completion tokens returned.\n# TYPE dgemma_generation_tokens_total counter\n"
    "dgemma_generation_tokens_total %llu\n", s->completion_tokens);
  M("# HELP dgemma_queue_depth Requests waiting for a canvas slot.\n# TYPE dgemma_queue_depth gauge\n"
    "dgemma_queue_depth %d\n", s->n_queued);
  M("# HELP dgemma_active_canvases Canvases being denoised now.\n# TYPE dgemma_active_canvases gauge\n"
    "dgemma_active_canvases %d\n", s->n_running);
  M("# HELP dgemma_max_batch Canvases the scheduler denoises together at most.\n# TYPE dgemma_max_batch gauge\n"
    "dgemma_max_batch %d\n", s->o.max_batch);
  M("# HELP dgemma_canvas_sequences_total Requests admitted to the engine.\n# TYPE dgemma_canvas_sequences_total counter\n"
    "dgemma_canvas_sequences_total %llu\n", s->canvases_total);
  M("# HELP dgemma_step_seconds Batched denoising steps (one stacked decoder pass each) and their wall time.\n"
    "# TYPE dgemma_step_seconds summary\ndgemma_step_seconds_sum %.6f\ndgemma_step_seconds_count %llu\n",
    s->step_seconds, s->steps_total);
  M("# HELP dgemma_reference_forwards_total Decoder forwards of requests run alone with the reference sampler.\n"
    "# TYPE dgemma_reference_forwards_total counter\ndgemma_reference_forwards_total %llu\n", s->ref_forwards);
  M("# HELP dgemma_last_step_ms Wall time of the last batched denoising step, ms.\n# TYPE dgemma_last_step_ms gauge\n"
    "dgemma_last_step_ms %.3f\n", s->last_step_ms);
#undef M
  pthread_mutex_unlock(&s->mu);
  return b.p;
}

/* Streaming body: SSE bytes as the scheduler writes them; a comment line every second keeps the
 * connection alive and shows a client that went away (the write fails, MHD frees the response). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  job *j = cls;
  dg_server *s = j->srv;
  pthread_mutex_lock(&s->mu);
  if (!j->out.n && !j->closed) {
    /* the heartbeat comes well within the idle timeout: at most 1 s, a third of a shorter timeout */
    const long wait_ms = s->o.timeout_s > 0 && s->o.timeout_s < 3 ? s->o.timeout_s * 1000L / 3 : 1000L;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += wait_ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&j->cv, &s->mu, &ts);
  }
  ssize_t n;
  if (j->out.n) {
    n = (ssize_t)(j->out.n < max ? j->out.n : max);
    memcpy(buf, j->out.p, (size_t)n);
    memmove(j->out.p, j->out.p + n, j->out.n - (size_t)n);
    j->out.n -= (size_t)n;
  } else if (j->closed) {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  } else {
    static const char ka[] = ": keep-alive\n\n";
    n = (ssize_t)(sizeof ka - 1 < max ? sizeof ka - 1 : max);
    memcpy(buf, ka, (size_t)n);
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void stream_free(void *cls) {
  job *j = cls;
  dg_server *s = j->srv;
  pthread_mutex_lock(&s->mu);
  if (!j->closed) {
    j->cancelled = 1;
    pthread_cond_signal(&s->cv);
  }
  job_unref(j);
  pthread_mutex_unlock(&s->mu);
}

/* Did the client close its side? (non-streaming requests wait for their answer) */
static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static char *final_json(job *j) {
  dg_server *s = j->srv;
  cJSON *r = cJSON_CreateObject();
  const int chat = j->req.kind == DG_SRV_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", s->model_id);
  cJSON *ch = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
  cJSON_AddItemToArray(ch, c);
  cJSON_AddNumberToObject(c, "index", 0);
  if (chat) {
    cJSON *msg = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", j->text.p ? j->text.p : "");
  } else {
    cJSON_AddStringToObject(c, "text", j->text.p ? j->text.p : "");
  }
  cJSON_AddNullToObject(c, "logprobs");
  cJSON_AddStringToObject(c, "finish_reason", j->finish ? j->finish : "length");
  cJSON_AddItemToObject(r, "usage", usage_json(j));
  cJSON_AddItemToObject(r, "dgemma", stats_json(j));
  char *out = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  return out;
}

/* dg_gen_params_check of a request's parameters gp: 0, or a 400 in *e naming the field that made them invalid:
 * temperature if they pass without it, else dgemma.gen_kwargs (the server's own defaults were checked at start). */
static int params_refused(const dg_server *s, const dg_srv_request *r, const dg_gen_params *gp, dg_srv_error *e) {
  if (!dg_gen_params_check(s->m, gp)) return 0;
  char msg[sizeof e->message];
  snprintf(msg, sizeof msg, "%s", dg_last_error());
  int temp = 0;
  if (r->has_temperature) { /* the same request without its temperature */
    dg_srv_request t = *r;
    dg_srv_error e2;
    dg_gen_params g2;
    t.has_temperature = 0;
    temp = !dg_srv_gen_params(&t, &s->defaults, &s->o.lim, &g2, &e2) && !dg_gen_params_check(s->m, &g2);
  }
  const char *field = temp ? "temperature" : r->gen_kwargs ? "dgemma.gen_kwargs" : NULL;
  return dg_srv_fail(e, 400, field, "invalid_value", "%s%s%s%s", field ? "'" : "", field ? field : "", field ? "': " : "", msg);
}

static enum MHD_Result handle_generate(dg_server *s, struct MHD_Connection *c, dg_srv_kind kind, conn_state *cs) {
  dg_srv_error e;
  job *j = calloc(1, sizeof *j);
  if (!j) return send_error(s, c, (dg_srv_fail(&e, 500, NULL, NULL, "out of memory"), &e));
  j->srv = s;
  pthread_cond_init(&j->cv, NULL);
  j->refs = 1;
  if (dg_srv_parse(kind, cs->body.p ? cs->body.p : "", cs->body.n, &s->o.lim, &j->req, &e) ||
      (j->req.model && strcmp(j->req.model, s->model_id) &&
       dg_srv_fail(&e, 404, "model", "model_not_found", "the model '%s' does not exist; this server serves '%s'",
                   j->req.model, s->model_id)) ||
      dg_srv_gen_params(&j->req, &s->defaults, &s->o.lim, &j->gp, &e) ||
      /* what the model refuses (a temperature so small that logits / T overflow, a stop id outside the
       * vocabulary) is a 400 naming the field now, not an error after the prefill (or a stream's error event) */
      params_refused(s, &j->req, &j->gp, &e)) {
    pthread_mutex_lock(&s->mu);
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
    return send_error(s, c, &e);
  }
  /* the prompt's ids */
  dg_status st;
  if (kind == DG_SRV_CHAT) {
    st = dg_chat_apply(s->m, j->req.msgs, (size_t)j->req.n_msgs, j->req.think, &j->prompt, &j->n_prompt);
  } else {
    int32_t *ids = NULL;
    size_t n = 0;
    st = dg_tokenize(s->m, j->req.prompt, strlen(j->req.prompt), 1, &ids, &n);
    if (!st) { /* <bos> first, as the tokenizer's post-processor adds it (unless the text spells it) */
      const int32_t bos = 2;
      int has = n > 0 && ids[0] == bos;
      j->prompt = malloc((n + 1) * sizeof(int32_t));
      if (j->prompt) {
        j->prompt[0] = bos;
        memcpy(j->prompt + !has, ids, n * sizeof(int32_t));
        j->n_prompt = n + !has;
      } else st = DG_ERR_OUT_OF_MEMORY;
      dg_free(ids);
    }
  }
  const int32_t C = s->info.canvas_length;
  const int64_t canv = ((int64_t)j->gp.max_new_tokens + C - 1) / C;
  int rc = 0;
  if (st) rc = dg_srv_fail(&e, 400, kind == DG_SRV_CHAT ? "messages" : "prompt", "invalid_value", "cannot tokenize: %s", dg_last_error());
  else if ((int64_t)j->n_prompt + canv * C > s->o.lim.max_context)
    rc = dg_srv_fail(&e, 400, kind == DG_SRV_CHAT ? "messages" : "prompt", "context_length_exceeded",
                     "prompt of %zu tokens + %lld canvases of %d tokens (max_tokens %d rounded up) = %lld positions; this "
                     "server's limit is %d",
                     j->n_prompt, (long long)canv, C, j->gp.max_new_tokens, (long long)(j->n_prompt + canv * C),
                     s->o.lim.max_context);
  if (rc) {
    pthread_mutex_lock(&s->mu);
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
    return send_error(s, c, &e);
  }
  j->turbo = j->gp.turbo.enabled;
  j->max_tokens = j->req.max_tokens > 0 ? j->req.max_tokens : j->gp.max_new_tokens;
  j->gp.on_block = on_block;
  j->gp.on_step = on_step;
  j->gp.user_data = j;
  j->created = (long)time(NULL);
  pthread_mutex_lock(&s->mu);
  if (s->n_queued >= s->o.max_queue || s->stopping) {
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
    return send_error(s, c, (dg_srv_fail(&e, 503, NULL, "server_busy", "%d requests are waiting; try again later",
                                         s->o.max_queue), &e));
  }
  snprintf(j->id, sizeof j->id, "%s-%llu", kind == DG_SRV_CHAT ? "chatcmpl" : "cmpl", ++s->next_id);
  j->refs = 2; /* this connection + the scheduler */
  if (j->req.stream) {
    char *first = chunk_json(j, kind == DG_SRV_CHAT ? "" : NULL, NULL, kind == DG_SRV_CHAT);
    if (first && kind == DG_SRV_CHAT) sse_data(j, NULL, first);
    free(first);
  }
  if (s->qtail) s->qtail->next = j;
  else s->qhead = j;
  s->qtail = j;
  s->n_queued++;
  pthread_cond_signal(&s->cv);
  if (j->req.stream) {
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_free);
    if (!r) {
      stream_free(j);
      return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    count_status(s, 200);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  int gone = 0; /* the client closed its side: it gets no answer */
  while (!j->closed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &s->mu, &ts);
    if (!j->closed && !j->cancelled && client_gone(c)) {
      j->cancelled = 1;
      gone = 1;
      pthread_cond_signal(&s->cv);
    }
  }
  if (gone) { /* no response to count as a 5xx (dgemma_requests_total{outcome="cancelled"} has it): close */
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
    return MHD_NO;
  }
  char *body = NULL;
  int status = 200;
  if (j->cancelled && !j->finish) {
    status = 503;
    dg_srv_fail(&e, 503, NULL, "cancelled", "the request was cancelled (the server is stopping)");
    body = dg_srv_error_json(&e);
  } else if (j->status) {
    status = j->status == DG_ERR_CONTEXT_FULL || j->status == DG_ERR_INVALID_ARG ? 400 : 500;
    dg_srv_fail(&e, status, NULL, "generation_failed", "%s", j->errmsg);
    body = dg_srv_error_json(&e);
  } else {
    body = final_json(j);
  }
  job_unref(j);
  pthread_mutex_unlock(&s->mu);
  enum MHD_Result ret = send_json(s, c, status, body);
  free(body);
  return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  dg_server *s = cls;
  dg_srv_error e;
  conn_state *cs = *con_cls;
  const int post = !strcmp(method, "POST");
  if (!cs) {
    cs = calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
    if (post) {
      const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
      if (cl && strtoull(cl, NULL, 10) > s->o.lim.max_body) {
        cs->answered = 1;
        return send_error(s, c, (dg_srv_fail(&e, 413, NULL, "request_too_large",
                                             "request body of %s bytes; the limit is %zu", cl, s->o.lim.max_body), &e));
      }
      return MHD_YES;
    }
  }
  if (cs->answered) { *upload_size = 0; return MHD_YES; }
  if (*upload_size) {
    if (cs->body.n + *upload_size > s->o.lim.max_body) cs->too_large = 1;
    else if (sbuf_put(&cs->body, upload, *upload_size)) return MHD_NO;
    *upload_size = 0;
    return MHD_YES;
  }
  const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
  const int chat = !strcmp(url, "/v1/chat/completions"), compl = !strcmp(url, "/v1/completions");
  if (chat || compl) {
    if (!post) return send_error(s, c, (dg_srv_fail(&e, 405, NULL, "method_not_allowed", "%s needs POST", url), &e));
    if (check_auth(s, c, &e)) return send_error(s, c, &e);
    if (cs->too_large)
      return send_error(s, c, (dg_srv_fail(&e, 413, NULL, "request_too_large", "request body above the limit of %zu bytes",
                                           s->o.lim.max_body), &e));
    if (!cs->generating) {
      cs->generating = 1;
      pthread_mutex_lock(&s->mu);
      s->n_generating++;
      pthread_mutex_unlock(&s->mu);
    }
    return handle_generate(s, c, chat ? DG_SRV_CHAT : DG_SRV_COMPLETION, cs);
  }
  const int models = !strcmp(url, "/v1/models"), health = !strcmp(url, "/health"), metrics = !strcmp(url, "/metrics"),
            page = !strcmp(url, "/") || !strcmp(url, "/index.html");
  if (!models && !health && !metrics && !page && strncmp(url, "/v1/models/", 11))
    return send_error(s, c, (dg_srv_fail(&e, 404, NULL, "not_found", "no route %s %s", method, url), &e));
  if (!get) return send_error(s, c, (dg_srv_fail(&e, 405, NULL, "method_not_allowed", "%s needs GET", url), &e));
  if (health) return send_json(s, c, 200, "{\"status\":\"ok\"}");
  if (page) { count_status(s, 200); return send_text(c, 200, "text/html; charset=utf-8", dg_serve_page_html); }
  if (check_auth(s, c, &e)) return send_error(s, c, &e);
  if (metrics) {
    char *t = metrics_text(s);
    count_status(s, 200);
    enum MHD_Result r = send_text(c, 200, "text/plain; version=0.0.4", t ? t : "");
    free(t);
    return r;
  }
  if (!models) { /* /v1/models/ID */
    if (strcmp(url + 11, s->model_id))
      return send_error(s, c, (dg_srv_fail(&e, 404, "model", "model_not_found", "the model '%s' does not exist", url + 11), &e));
    char *l = models_json(s);
    cJSON *r = cJSON_Parse(l);
    free(l);
    char *one = cJSON_PrintUnformatted(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "data"), 0));
    cJSON_Delete(r);
    enum MHD_Result ret = send_json(s, c, 200, one);
    free(one);
    return ret;
  }
  char *l = models_json(s);
  enum MHD_Result r = send_json(s, c, 200, l);
  free(l);
  return r;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  conn_state *cs = *con_cls;
  dg_server *s = cls;
  if (cs) {
    if (cs->generating) {
      pthread_mutex_lock(&s->mu);
      s->n_generating--;
      pthread_mutex_unlock(&s->mu);
    }
    free(cs->body.p);
    free(cs);
    *con_cls = NULL;
  }
}

dg_status dg_server_start(dg_model *m, const dg_serve_opts *o, dg_server **out) {
  *out = NULL;
  if (!m || !o || o->max_batch < 1 || o->max_batch > 4096 || o->port < 0 || o->port > 65535 || o->max_queue < 1 ||
      o->cache_slots < 0 || o->cache_slots > 4096 || o->lim.max_messages < 1 || o->lim.max_tokens < 1 || o->lim.max_context < 2 || o->lim.max_body < 16)
    return DG_ERR_INVALID_ARG;
  dg_server *s = calloc(1, sizeof *s);
  if (!s) return DG_ERR_OUT_OF_MEMORY;
  s->m = m;
  s->o = *o;
  dg_model_get_info(m, &s->info);
  snprintf(s->model_id, sizeof s->model_id, "%s", o->model_id ? o->model_id : "dgemma");
  s->defaults = dg_gen_default_params(m);
  dg_status st = DG_OK;
  if (o->gen_kwargs && (st = dg_gen_params_apply_json(&s->defaults, o->gen_kwargs))) { free(s); return st; }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->slots = calloc((size_t)o->max_batch, sizeof *s->slots);
  s->cache = calloc((size_t)(o->cache_slots > 0 ? o->cache_slots : 1), sizeof *s->cache);
  if (!s->slots || !s->cache) st = DG_ERR_OUT_OF_MEMORY;
  if (!st) st = dg_batch_new(m, o->max_batch, &s->batch);
  if (!st) {
    if (pthread_create(&s->sched, NULL, scheduler, s)) st = DG_ERR_OUT_OF_MEMORY;
    else s->sched_started = 1;
  }
  if (!st) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &sa.sin_addr) != 1) st = DG_ERR_INVALID_ARG;
    else {
      s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL,
                              (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->timeout_s > 0 ? o->timeout_s : 0),
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
      if (!s->d) st = DG_ERR_IO;
    }
  }
  if (!st) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
  }
  if (st) { dg_server_stop(s); return st; }
  *out = s;
  return DG_OK;
}

int dg_server_port(const dg_server *s) { return s ? s->port : 0; }

void dg_server_stop(dg_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->sched_started) pthread_join(s->sched, NULL);
  if (s->d) {
    /* every job is closed now: let their last bytes (a stream's error event and data: [DONE], a
     * 503) reach the clients before the connections are closed, for at most 5 s (a request that
     * comes meanwhile is answered 503 at once) */
    for (int k = 0; k < 500; k++) {
      pthread_mutex_lock(&s->mu);
      const int32_t n = s->n_generating;
      pthread_mutex_unlock(&s->mu);
      if (n <= 0) break;
      usleep(10000);
    }
    MHD_stop_daemon(s->d); /* waits for the connection threads */
  }
  dg_batch_free(s->batch);
  while (s->n_cache > 0) cache_drop(s, s->n_cache - 1);
  free(s->cache);
  free(s->slots);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

#else /* no libmicrohttpd */

dg_status dg_server_start(dg_model *m, const dg_serve_opts *o, dg_server **out) {
  *out = NULL;
  return DG_ERR_BACKEND;
}
int dg_server_port(const dg_server *s) { return 0; }
void dg_server_stop(dg_server *s) {}

#endif

/* ---- the CLI command ---- */

static volatile sig_atomic_t g_serve_sig = 0;
static void serve_on_signal(int sig) { g_serve_sig = sig; }

/* A usage error: one line naming the problem and where the help is, exit 2 (as every command). */
static void serve_usage_exit(const char *what, const char *value) {
  char q[448];
  if (value) fprintf(stderr, "dgemma serve: %s \"%s\"; see `dgemma serve --help`\n", what, cli_quote(value, 100, q, sizeof q));
  else fprintf(stderr, "dgemma serve: %s; see `dgemma serve --help`\n", what);
  exit(2);
}

/* v, or a usage error "OPT needs WHY, got an empty string" when it is empty. */
static const char *serve_nonempty(const char *opt, const char *v, const char *why, char *what, size_t n) {
  if (!*v) {
    snprintf(what, n, "%s needs %s, got an empty string", opt, why);
    serve_usage_exit(what, NULL);
  }
  return v;
}

static long long serve_int(const char *opt, const char *v, long long lo, long long hi) {
  long long x;
  if (cli_parse_ll(v, lo, hi, &x)) { /* decimal only: no "0x10", no white space, nothing after */
    char what[160];
    snprintf(what, sizeof what, "%s expects an integer in [%lld, %lld], got", opt, lo, hi);
    serve_usage_exit(what, v);
  }
  return x;
}

/* `dgemma serve --help` (and `dgemma help serve`): on stdout, as every command's help. */
static void serve_usage(FILE *f) {
  const dg_serve_opts d = dg_serve_default_opts();
  fprintf(f,
          "usage: dgemma serve [-m DIR] [options]\n"
          "\n"
          "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
          "GET /health, GET /metrics, GET / (the live canvas page). Continuous batching needs the turbo\n"
          "engine: --gen-kwargs '{\"diffusion_turbo\": true, ...}' (README, \"Serving\"); with the reference\n"
          "sampler requests run one at a time.\n"
          "\n"
          "options:\n"
          "  -m, --model DIR          the model (default: $DGEMMA_MODEL, else the bundled models/dgemma-small)\n"
          "      --device cpu|cuda[:N] where the forward passes run (default cpu)\n"
          "  -t, --threads N          CPU threads (default, and 0: all cores)\n"
          "      --host ADDR          IPv4 address to listen on (default %s; 0.0.0.0: every interface)\n"
          "      --port P             TCP port (default %d; 0: any free port, printed at the start)\n"
          "      --max-batch N        canvases denoised together (default %d)\n"
          "      --max-queue N        requests waiting beyond the batch before 503 (default %d)\n"
          "      --api-key KEY        require \"Authorization: Bearer KEY\" (default: $DGEMMA_API_KEY, else none)\n"
          "      --gen-kwargs JSON    the server's generation defaults over the checkpoint's (as for run)\n"
          "      --model-id NAME      the name /v1/models lists (default: the model directory's name)\n"
          "      --max-tokens N       largest max_tokens a request may ask (default %d)\n"
          "      --max-context N      prompt + generated canvases per request, in positions (default %d)\n"
          "      --max-body BYTES     request body size (default %zu)\n"
          "      --max-messages N     chat messages per request (default %d)\n"
          "      --timeout S          idle connection timeout in seconds (default %d; 0: none)\n"
          "      --cache-slots N      prompt cache: finished contexts kept, a request that begins with one's tokens\n"
          "                           prefills only the rest (default %d; 0: off; each holds one request's KV\n"
          "                           cache, its pass buffers released; on CUDA also its device work buffers)\n"
          "      --quiet              no log line per request on stderr\n"
          "  -h, --help               this help\n"
          "      --version            the version\n",
          d.host, d.port, d.max_batch, d.max_queue, (int)d.lim.max_tokens, (int)d.lim.max_context, d.lim.max_body,
          (int)d.lim.max_messages, d.timeout_s, d.cache_slots);
}

int dg_cli_serve(int argc, char **argv, const char *default_model) {
  dg_serve_opts o = dg_serve_default_opts();
  dg_model_params mp = dg_model_default_params();
  const char *dir = NULL;
  int quiet = 0, max_context_given = 0;
  char what[448];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    /* --name=value is --name value (as in the other commands); eq is the value, taken by VAL() */
    char name[64];
    const char *eq = NULL, *e = a[0] == '-' && a[1] == '-' ? strchr(a, '=') : NULL;
    int eq_used = 0;
    if (e && (size_t)(e - a) < sizeof name) {
      memcpy(name, a, (size_t)(e - a));
      name[e - a] = 0;
      eq = e + 1;
      a = name;
    }
#define VAL() (eq ? (eq_used = 1, eq) : i + 1 < argc ? argv[++i] : (snprintf(what, sizeof what, "%s needs a value", a), \
                                           serve_usage_exit(what, NULL), ""))
/* a value that must not be empty (a shell variable that was not set): `--api-key "$KEY"` had started a server
 * without authentication, -m '' looked for "/config.json" (as in the other commands, a usage error) */
#define NONEMPTY(v, why) serve_nonempty(a, (v), (why), what, sizeof what)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = NONEMPTY(VAL(), "a model directory");
    else if (!strcmp(a, "--device")) {
      const char *d = VAL();
      if (!strcmp(d, "cpu")) mp.device = DG_DEVICE_CPU;
      else if (!strcmp(d, "cuda")) mp.device = DG_DEVICE_CUDA;
      else if (!strncmp(d, "cuda:", 5)) { mp.device = DG_DEVICE_CUDA; mp.cuda_device = (int)serve_int(a, d + 5, 0, 1023); }
      else serve_usage_exit("--device expects cpu, cuda or cuda:N, got", d);
    }
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) mp.n_threads = (int)serve_int(a, VAL(), 0, DG_MAX_THREADS);
    else if (!strcmp(a, "--host")) {
      o.host = NONEMPTY(VAL(), "an address");
      struct in_addr ia; /* dg_server_start binds an AF_INET address: say so before the model loads */
      if (inet_pton(AF_INET, o.host, &ia) != 1)
        serve_usage_exit("--host expects an IPv4 address (127.0.0.1: this machine only, 0.0.0.0: every interface), got",
                         o.host);
    }
    else if (!strcmp(a, "--port")) o.port = (int)serve_int(a, VAL(), 0, 65535);
    else if (!strcmp(a, "--max-batch")) o.max_batch = (int)serve_int(a, VAL(), 1, 4096);
    else if (!strcmp(a, "--max-queue")) o.max_queue = (int)serve_int(a, VAL(), 1, 1 << 20);
    else if (!strcmp(a, "--api-key")) o.api_key = NONEMPTY(VAL(), "a key (leave --api-key out for none)");
    else if (!strcmp(a, "--gen-kwargs")) o.gen_kwargs = VAL();
    else if (!strcmp(a, "--model-id")) o.model_id = NONEMPTY(VAL(), "a name");
    else if (!strcmp(a, "--max-tokens")) o.lim.max_tokens = (int32_t)serve_int(a, VAL(), 1, 1 << 24);
    else if (!strcmp(a, "--max-context")) {
      o.lim.max_context = (int32_t)serve_int(a, VAL(), 2, INT32_MAX);
      max_context_given = 1;
    }
    else if (!strcmp(a, "--max-body")) o.lim.max_body = (size_t)serve_int(a, VAL(), 16, 1LL << 32);
    else if (!strcmp(a, "--max-messages")) o.lim.max_messages = (int32_t)serve_int(a, VAL(), 1, 1 << 20);
    else if (!strcmp(a, "--timeout")) o.timeout_s = (int)serve_int(a, VAL(), 0, 86400);
    else if (!strcmp(a, "--cache-slots")) o.cache_slots = (int)serve_int(a, VAL(), 0, 4096);
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { serve_usage(stdout); return 0; }
    else if (!strcmp(a, "--version")) { printf("dgemma %s\n", DGEMMA_VERSION); return 0; } /* as every command */
    else { /* a usage error: one line and where the help is, as the other commands */
      if (a[0] == '-') {
        snprintf(what, sizeof what, "unknown option %s", cli_quote(a, 100, what + 200, sizeof what - 200));
        serve_usage_exit(what, NULL);
      }
      serve_usage_exit("unexpected argument", a);
    }
    if (eq && !eq_used) { /* --quiet=1: a flag takes no value */
      snprintf(what, sizeof what, "%s takes no value, got", a);
      serve_usage_exit(what, argv[i]);
    }
#undef VAL
#undef NONEMPTY
  }
  char twarn[256]; /* -t (or OMP_NUM_THREADS) above the available cores is capped, as in the other commands */
  mp.n_threads = cli_threads(mp.n_threads, twarn, sizeof twarn);
  if (*twarn) fprintf(stderr, "dgemma serve: %s\n", twarn);
#ifndef DG_HAVE_MHD
  fprintf(stderr, "dgemma serve: unavailable: this dgemma was built without libmicrohttpd "
                  "(scripts/setup.sh installs libmicrohttpd-dev; then rebuild)\n");
  return 1;
#endif
  if (!dir) dir = default_model;
  if (!o.api_key) o.api_key = getenv("DGEMMA_API_KEY");
  if (o.api_key && !*o.api_key) o.api_key = NULL;
  const char *kern;
  if (dg_switches_check(DG_DEVICE_CPU) == DG_OK && dg_cpu_kernels(&kern)) /* a bad name: the load refuses it */
    fprintf(stderr, "dgemma serve: warning: %s\n", dg_last_error());
  if (mp.device == DG_DEVICE_CUDA) { /* no GPU or no CUDA in this build: say so, not "cannot load model" */
    char buf[512];
    if (dg_device_info(DG_DEVICE_CUDA, mp.cuda_device, buf, sizeof buf)) {
      fprintf(stderr, "dgemma serve: --device cuda:%d: %s\n", mp.cuda_device, dg_last_error());
      return 1;
    }
  }
  dg_model *m = NULL;
  dg_status st = dg_model_load(dir, &mp, &m);
  if (st) {
    fprintf(stderr, "dgemma serve: cannot load model %s: %s\n  %s\n", dir, dg_status_str(st), dg_last_error());
    return 1;
  }
  dg_model_info info;
  dg_model_get_info(m, &info);
  if (!info.has_tokenizer) {
    fprintf(stderr, "dgemma serve: %s has no tokenizer.json\n", dir);
    dg_model_free(m);
    return 1;
  }
  char warn[1024];
  if (cli_no_gen_config(m, dir, warn, sizeof warn)) fprintf(stderr, "dgemma serve: warning: %s\n", warn);
  char id[256];
  if (!o.model_id) {
    const char *b = dir + strlen(dir);
    while (b > dir && b[-1] == '/') b--;
    const char *e = b;
    while (b > dir && b[-1] != '/') b--;
    snprintf(id, sizeof id, "%.*s", (int)(e - b), b);
    o.model_id = id[0] ? id : "dgemma";
  }
  if ((int64_t)info.max_position_embeddings < o.lim.max_context) { /* the default 16384 quietly; a given one says so */
    if (max_context_given)
      fprintf(stderr, "dgemma serve: --max-context %d is more than the model's %d positions (max_position_embeddings); "
              "using %d\n", (int)o.lim.max_context, info.max_position_embeddings, info.max_position_embeddings);
    o.lim.max_context = info.max_position_embeddings;
  }
  o.log = quiet ? NULL : stderr;
  dg_gen_params gp = dg_gen_default_params(m);
  if (o.gen_kwargs && ((st = dg_gen_params_apply_json(&gp, o.gen_kwargs)) || (st = dg_gen_params_check(m, &gp)))) {
    fprintf(stderr, "dgemma serve: --gen-kwargs: %s: %s\n", dg_status_str(st), dg_last_error());
    dg_model_free(m);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = serve_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  dg_server *srv = NULL;
  st = dg_server_start(m, &o, &srv);
  if (st) {
    fprintf(stderr, "dgemma serve: cannot start on %s:%d: %s%s\n", o.host, o.port, dg_status_str(st),
            st == DG_ERR_IO ? " (address in use or not bindable?)" : "");
    dg_model_free(m);
    return 1;
  }
  fprintf(stderr, "dgemma serve: http://%s:%d/ model %s (%s, canvas %d), %s sampler, max batch %d%s%s\n", o.host,
          dg_server_port(srv), o.model_id, dir, info.canvas_length, gp.turbo.enabled ? "turbo" : "reference",
          o.max_batch, gp.turbo.enabled ? "" : " (the reference sampler runs one request at a time)",
          o.api_key ? ", API key required" : "");
  while (!g_serve_sig) usleep(100000);
  fprintf(stderr, "dgemma serve: %s, stopping\n", strsignal(g_serve_sig));
  dg_server_stop(srv);
  dg_model_free(m);
  return 128 + g_serve_sig;
}
