/* bench.c: `dgemma bench`, the throughput protocols of the design notes on
 * the CPU, each row measured against floors computed from ceilings measured
 * in the same command:
 *
 *   vllm  vLLM's protocol: P prompt tokens in, G out, 16 fixed denoising
 *         steps per block (early stop disabled as in the reference:
 *         stability_threshold = 17 > N) plus the commit pass, batch 1,
 *         prefill included, stop ids off so every canvas is generated.
 *         P = G = 1024 on the real model (canvas 256) = 4 canvases each; on a
 *         model with another canvas the default keeps 4 canvases (the bundled
 *         model: canvas 64, so 256 in, 256 out) and says so.
 *   p512  512 generated tokens (stop ids off) for each of three fixed chat
 *         prompts (short Q&A, technical, creative) with the model's
 *         generation config (reference sampler, adaptive stop).
 *
 * Every row: median wall time of `reps` runs after `warmup` untimed ones,
 * min-max spread, tok/s, decoder forwards, and the floor: the sum over the
 * passes of max(bytes / copy bandwidth, FLOPs / FMA rate) (cost model in
 * bench.h). A fresh process per configuration is the caller's choice
 * (scripts/eval_configs.sh does it for eval; bench rows share one process and
 * the warm-up run absorbs the first-touch costs). */
#include "bench.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "model.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- cost model ------------------------------------------------------------ */

static double wbytes(const dg_weight *w) {
  if (!w->data) return 0;
  double n = (double)w->rows * (double)w->cols;
  if (!w->bits) return n * (double)dg_dtype_size(w->dtype);
  double groups = (double)w->rows * (double)(w->cols / w->group_size);
  return n * w->bits / 8.0 + 2.0 * groups * (double)dg_dtype_size(w->sb_dtype);
}

static double wparams(const dg_weight *w) { return w->data ? (double)w->rows * (double)w->cols : 0; }

/* Expected fraction of E experts hit when T tokens each pick k of them uniformly. */
static double expert_hit(int32_t E, int32_t k, int32_t T) {
  if (E <= 0) return 0;
  return 1.0 - pow(1.0 - (double)k / E, (double)T);
}

/* Layers over T tokens whose keys span [0, ctx_len + T); avg_keys = keys a query sees on average. */
static void layers_cost(const dg_model *m, int32_t T, int32_t ctx_len, int causal, bench_cost *c) {
  const dg_config *cf = &m->cfg;
  const double hit = expert_hit(cf->n_experts, cf->top_k_experts, T);
  for (int l = 0; l < cf->n_layers; l++) {
    const dg_layer *L = &m->layers[l];
    double dense = wparams(&L->q) + wparams(&L->k) + wparams(&L->v) + wparams(&L->o) + wparams(&L->mlp_gate) +
                   wparams(&L->mlp_up) + wparams(&L->mlp_down) + wparams(&L->router);
    c->weight_bytes += wbytes(&L->q) + wbytes(&L->k) + wbytes(&L->v) + wbytes(&L->o) + wbytes(&L->mlp_gate) +
                       wbytes(&L->mlp_up) + wbytes(&L->mlp_down) + wbytes(&L->router);
    c->weight_bytes += hit * (wbytes(&L->experts_gate_up) + wbytes(&L->experts_down));
    /* per token: top_k experts of (2 IE x H) + (H x IE) */
    double per_expert = (wparams(&L->experts_gate_up) + wparams(&L->experts_down)) / (cf->n_experts ? cf->n_experts : 1);
    c->flops += 2.0 * T * (dense + cf->top_k_experts * per_expert);
    /* attention: keys in the cache plus the new ones */
    double keys_total = (double)ctx_len + T, avg_keys = causal ? ctx_len + (T + 1) / 2.0 : ctx_len + T;
    if (!L->is_full) {
      keys_total = fmin(keys_total, (double)cf->sliding_window + T - 1);
      avg_keys = fmin(avg_keys, (double)cf->sliding_window);
    }
    const double kvw = (double)L->n_kv * L->head_dim * (L->v.data ? 2 : 1) * sizeof(float);
    c->kv_bytes += keys_total * kvw + (causal ? (double)T * kvw : 0); /* read, and written by an encoder pass */
    c->flops += 4.0 * T * avg_keys * cf->n_heads * L->head_dim;      /* Q K^T and P V */
  }
}

bench_cost bench_decoder_cost(const dg_model *m, int32_t ctx_len) {
  bench_cost c = {0, 0, 0, 0};
  const dg_config *cf = &m->cfg;
  const int32_t C = cf->canvas_length, V = cf->vocab_size, H = cf->hidden_size;
  layers_cost(m, C, ctx_len, 0, &c);
  /* tied LM head, and self-conditioning: probs [C, V] x E [V, H] re-reads the embedding, then its MLP */
  c.weight_bytes += 2 * wbytes(&m->embed) + wbytes(&m->sc_gate) + wbytes(&m->sc_up) + wbytes(&m->sc_down);
  c.flops += 2.0 * C * (2.0 * V * H + wparams(&m->sc_gate) + wparams(&m->sc_up) + wparams(&m->sc_down));
  c.other_bytes += (double)C * V * sizeof(float); /* logits written */
  return c;
}

bench_cost bench_encoder_cost(const dg_model *m, int32_t T, int32_t ctx_len) {
  bench_cost c = {0, 0, 0, 0};
  layers_cost(m, T, ctx_len, 1, &c);
  return c;
}

double bench_floor_s(const bench_cost *c, double bw, double rate, int *memory_bound) {
  double tb = (c->weight_bytes + c->kv_bytes + c->other_bytes) / bw, tf = c->flops / rate;
  if (memory_bound) *memory_bound = tb >= tf;
  return tb > tf ? tb : tf;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- ceilings --------------------------------------------------------------- */

double bench_copy_bandwidth(size_t bytes, int n_threads, int reps) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) { free(a); free(b); return 0; }
  memset(a, 1, bytes); /* first touch outside the timing */
  memset(b, 2, bytes);
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
#pragma omp parallel num_threads(n_threads)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t chunk = (bytes / (size_t)nt) & ~(size_t)63, off = (size_t)t * chunk;
      size_t len = t == nt - 1 ? bytes - off : chunk;
      memcpy(b + off, a + off, len);
    }
    double dt = now_s() - t0, bw = 2.0 * (double)bytes / dt;
    if (bw > best) best = bw;
    char *x = a; a = b; b = x;
  }
  free(a);
  free(b);
  return best;
}

#include <immintrin.h>

#define FMA_ITERS 20000000L

/* 12 independent accumulators hide the FMA latency; FLOPs = iters * 12 * lanes * 2. */
__attribute__((target("avx512f"))) static double fma_avx512(void) {
  __m512 acc[12], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < FMA_ITERS; it++)
    for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  float s = 0, buf[16];
  for (int i = 0; i < 12; i++) { _mm512_storeu_ps(buf, acc[i]); s += buf[0]; }
  return FMA_ITERS * 12.0 * 16 * 2 + 0 * s;
}

__attribute__((target("avx2,fma"))) static double fma_avx2(void) {
  __m256 acc[12], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long it = 0; it < FMA_ITERS; it++)
    for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float s = 0, buf[8];
  for (int i = 0; i < 12; i++) { _mm256_storeu_ps(buf, acc[i]); s += buf[0]; }
  return FMA_ITERS * 12.0 * 8 * 2 + 0 * s;
}

static double fma_scalar(void) {
  volatile float sink;
  float acc[12];
  for (int i = 0; i < 12; i++) acc[i] = (float)i;
  for (long it = 0; it < FMA_ITERS / 16; it++)
    for (int i = 0; i < 12; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
  sink = acc[0];
  (void)sink;
  return FMA_ITERS / 16 * 12.0 * 2;
}

double bench_fma_rate(int n_threads, int reps, const char **isa) {
  __builtin_cpu_init();
  int kind = __builtin_cpu_supports("avx512f") ? 2 : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
  if (isa) *isa = kind == 2 ? "AVX-512 fp32 FMA" : kind == 1 ? "AVX2 fp32 FMA" : "scalar fp32";
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double flops = 0, t0 = now_s();
#pragma omp parallel num_threads(n_threads) reduction(+ : flops)
    flops += kind == 2 ? fma_avx512() : kind == 1 ? fma_avx2() : fma_scalar();
    double rate = flops / (now_s() - t0);
    if (rate > best) best = rate;
  }
  return best;
}

/* Rate of this build's matmul kernel on a compute-heavy f32 shape (context, not a ceiling). */
static double matmul_rate(int n_threads, const char **name) {
  const int64_t T = 64, K = 2048, N = 2048;
  float *w = malloc((size_t)(K * N) * sizeof(float)), *x = malloc((size_t)(T * K) * sizeof(float));
  float *y = malloc((size_t)(T * N) * sizeof(float));
  *name = "?";
  if (!w || !x || !y) { free(w); free(x); free(y); return 0; }
  for (int64_t i = 0; i < K * N; i++) w[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (int64_t i = 0; i < T * K; i++) x[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
  dg_weight W;
  memset(&W, 0, sizeof W);
  W.dtype = DG_F32; W.data = w; W.rows = N; W.cols = K;
  const dg_kernels *k = dg_kernels_best();
  *name = k->name;
  double best = 0;
  for (int r = 0; r < 4; r++) {
    double t0 = now_s();
    k->matmul(y, N, x, K, T, &W, 0, N, n_threads);
    double rate = 2.0 * T * K * N / (now_s() - t0);
    if (r > 0 && rate > best) best = rate;
  }
  free(w); free(x); free(y);
  return best;
}

/* ---- protocols ------------------------------------------------------------------ */

/* Fixed text for the vLLM protocol's prompt, repeated and cut to P tokens (our own words). */
static const char *kFiller =
    "The harbour town woke slowly. Fishing boats came back with the tide, gulls argued over the nets, and the "
    "baker opened his shutters to the smell of bread. On the hill the old lighthouse keeper counted ships, wrote "
    "the weather in his book, and wondered how many more winters the lamp would turn. Children ran to school "
    "along the sea wall while the market filled with apples, cheese, rope and paint. ";

static const char *kPrompts[3][2] = {
    {"qa", "What is the capital of France, and on which river does it lie?"},
    {"technical", "Explain how a hash table resolves collisions, and compare chaining with open addressing."},
    {"creative", "Write a short story about a lighthouse keeper who finds a message in a bottle."},
};

typedef struct run_trace {
  int32_t steps[4096]; /* decoder forwards per block */
  int32_t n_blocks;
} run_trace;

static int trace_block(const dg_block_info *bi, void *ud) {
  run_trace *t = ud;
  if (t->n_blocks < 4096) t->steps[t->n_blocks] = bi->n_steps;
  t->n_blocks++;
  return 0;
}

typedef struct row {
  const char *protocol, *prompt;
  int32_t P, G, C, blocks, forwards;
  double med, lo, hi, floor_s;
  int memory_bound;
} row;

/* Floor of one generation: prefill, then per block its decoder forwards at the block's context and the commit. */
static double gen_floor(const dg_model *m, int32_t P, const run_trace *tr, double bw, double rate, int *mem_bound) {
  const int32_t C = m->cfg.canvas_length;
  int mb;
  double mem_t = 0, all = 0;
  bench_cost c = bench_encoder_cost(m, P, 0);
  double f = bench_floor_s(&c, bw, rate, &mb);
  all += f; mem_t += mb ? f : 0;
  for (int32_t b = 0; b < tr->n_blocks && b < 4096; b++) {
    int32_t L = P + b * C;
    if (b > 0) {
      c = bench_encoder_cost(m, C, L - C);
      f = bench_floor_s(&c, bw, rate, &mb);
      all += f; mem_t += mb ? f : 0;
    }
    c = bench_decoder_cost(m, L);
    f = tr->steps[b] * bench_floor_s(&c, bw, rate, &mb);
    all += f; mem_t += mb ? f : 0;
  }
  *mem_bound = mem_t >= all / 2;
  return all;
}

static int run_row(dg_model *m, const bench_opts *o, const int32_t *ids, size_t n, const dg_gen_params *gp0,
                   double bw, double rate, row *r) {
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int32_t C = info.canvas_length;
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)n + ((gp0->max_new_tokens + C - 1) / C) * C;
  dg_context *ctx = NULL;
  dg_status st = dg_context_new(m, &cp, &ctx);
  if (st) { fprintf(stderr, "dgemma bench: context: %s: %s\n", dg_status_str(st), dg_last_error()); return 1; }
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  double t[1000];
  run_trace tr;
  for (int i = 0; i < warm + reps; i++) {
    dg_gen_params gp = *gp0;
    memset(&tr, 0, sizeof tr);
    gp.on_block = trace_block;
    gp.user_data = &tr;
    dg_context_reset(ctx);
    dg_gen_result res;
    if ((st = dg_generate(ctx, ids, n, &gp, &res))) {
      fprintf(stderr, "dgemma bench: generate: %s: %s\n", dg_status_str(st), dg_last_error());
      dg_context_free(ctx);
      return 1;
    }
    if (i >= warm) t[i - warm] = res.seconds;
    r->G = res.n_valid;
    r->forwards = res.n_steps;
    r->blocks = res.n_blocks;
    dg_gen_result_free(&res);
    if (o->tty) fprintf(stderr, "\r%s %s: run %d/%d%s", r->protocol, r->prompt, i + 1, warm + reps, i < warm ? " (warm-up)" : "          ");
  }
  if (o->tty) fprintf(stderr, "\r%60s\r", "");
  dg_context_free(ctx);
  r->P = (int32_t)n;
  r->C = C;
  r->lo = t[0]; r->hi = t[0];
  for (int i = 1; i < reps; i++) { r->lo = fmin(r->lo, t[i]); r->hi = fmax(r->hi, t[i]); }
  r->med = bench_median(t, reps);
  r->floor_s = gen_floor(m, r->P, &tr, bw, rate, &r->memory_bound);
  return 0;
}

int dg_cli_bench(dg_model *m, const bench_opts *o) {
  const char *proto = o->protocol ? o->protocol : "all";
  int do_vllm = !strcmp(proto, "vllm") || !strcmp(proto, "all"), do_512 = !strcmp(proto, "p512") || !strcmp(proto, "all");
  if (!do_vllm && !do_512) { fprintf(stderr, "dgemma bench: unknown --protocol \"%s\" (vllm, p512, all)\n", proto); return 2; }
  FILE *out = NULL;
  if (o->out && !(out = fopen(o->out, "w"))) {
    fprintf(stderr, "dgemma bench: cannot write %s: %s\n", o->out, strerror(errno));
    return 1;
  }
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int32_t C = info.canvas_length;
  const int nt = m->n_threads;
  /* ceilings, measured now */
  const char *isa = "", *kname = "";
  double bw = bench_copy_bandwidth((size_t)256 << 20, nt, 5);
  double rate = bench_fma_rate(nt, 5, &isa);
  double mm = matmul_rate(nt, &kname);
  if (!(bw > 0) || !(rate > 0)) { fprintf(stderr, "dgemma bench: could not measure the ceilings\n"); return 1; }
  printf("ceilings (%d threads, measured now): copy %.1f GB/s (bytes read + written, memcpy 256 MiB, best of 5); "
         "%s %.1f GFLOP/s (best of 5); this build's %s matmul 64x2048x2048 f32: %.1f GFLOP/s\n",
         nt, bw / 1e9, isa, rate / 1e9, kname, mm / 1e9);
  bench_cost dc = bench_decoder_cost(m, 0);
  printf("one decoder step (canvas %d, empty context): %.1f MB (weights %.1f, logits %.1f), %.3f GFLOP -> floor %.2f ms\n\n",
         C, (dc.weight_bytes + dc.kv_bytes + dc.other_bytes) / 1e6, dc.weight_bytes / 1e6, dc.other_bytes / 1e6,
         dc.flops / 1e9, 1e3 * bench_floor_s(&dc, bw, rate, NULL));
  row rows[8];
  int nr = 0, rc = 0;
  if (do_vllm) {
    int32_t P = o->prompt_tokens > 0 ? o->prompt_tokens : 4 * C, G = o->gen_tokens > 0 ? o->gen_tokens : 4 * C;
    if (C != 256 && o->prompt_tokens <= 0)
      printf("vllm protocol: this model's canvas is %d, not 256: prompt %d and %d generated tokens keep vLLM's 4 "
             "canvases in, 4 out (1024/1024 at canvas 256)\n", C, P, G);
    /* the prompt: <bos> + filler text cut to P - 1 tokens */
    int32_t *ids = malloc((size_t)P * sizeof *ids), *t = NULL, *bos = NULL;
    size_t nt_ = 0, nb = 0, have = 1;
    if (!ids || dg_tokenize(m, "<bos>", 5, 1, &bos, &nb) || nb != 1 || dg_tokenize(m, kFiller, strlen(kFiller), 0, &t, &nt_) || !nt_) {
      fprintf(stderr, "dgemma bench: cannot build the prompt (tokenizer): %s\n", dg_last_error());
      free(ids); dg_free(t); dg_free(bos);
      return 1;
    }
    ids[0] = bos[0];
    while (have < (size_t)P) { ids[have] = t[(have - 1) % nt_]; have++; }
    dg_free(t); dg_free(bos);
    dg_gen_params gp = dg_gen_default_params(m);
    gp.max_new_tokens = G;
    gp.max_denoising_steps = 16;
    gp.stability_threshold = 17; /* > N: never stable, so exactly 16 steps (the reference's way) */
    gp.n_stop_ids = 0;           /* every canvas generated */
    gp.seed = o->seed;
    row *r = &rows[nr++];
    memset(r, 0, sizeof *r);
    r->protocol = "vllm";
    r->prompt = "filler";
    rc = run_row(m, o, ids, (size_t)P, &gp, bw, rate, r);
    free(ids);
  }
  for (int k = 0; do_512 && !rc && k < 3; k++) {
    int32_t *ids = NULL;
    size_t n = 0;
    dg_chat_message msg = {"user", kPrompts[k][1]};
    if (dg_chat_apply(m, &msg, 1, 0, &ids, &n)) {
      fprintf(stderr, "dgemma bench: chat template: %s\n", dg_last_error());
      return 1;
    }
    dg_gen_params gp = dg_gen_default_params(m);
    gp.max_new_tokens = o->gen_tokens > 0 ? o->gen_tokens : 512;
    gp.n_stop_ids = 0;
    gp.seed = o->seed;
    row *r = &rows[nr++];
    memset(r, 0, sizeof *r);
    r->protocol = "p512";
    r->prompt = kPrompts[k][0];
    rc = run_row(m, o, ids, n, &gp, bw, rate, r);
    dg_free(ids);
  }
  if (rc) { if (out) fclose(out); return 1; }
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  printf("| protocol | prompt | in | out | blocks | forwards | median s | spread s | tok/s | ms/forward | floor s | "
         "floor/median | bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nr; i++) {
    row *r = &rows[i];
    printf("| %s | %s | %d | %d | %d | %d | %.3f | %.3f–%.3f | %.1f | %.1f | %.3f | %.1f%% | %s |\n", r->protocol,
           r->prompt, r->P, r->G, r->blocks, r->forwards, r->med, r->lo, r->hi, r->G / r->med,
           1e3 * r->med / (r->forwards + r->blocks), r->floor_s, 100 * r->floor_s / r->med,
           r->memory_bound ? "memory" : "compute");
    if (out) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "protocol", r->protocol);
      cJSON_AddStringToObject(j, "prompt", r->prompt);
      cJSON_AddStringToObject(j, "model", o->model_dir);
      cJSON_AddNumberToObject(j, "canvas", r->C);
      cJSON_AddNumberToObject(j, "prompt_tokens", r->P);
      cJSON_AddNumberToObject(j, "generated_tokens", r->G);
      cJSON_AddNumberToObject(j, "blocks", r->blocks);
      cJSON_AddNumberToObject(j, "forwards", r->forwards);
      cJSON_AddNumberToObject(j, "warmup", warm);
      cJSON_AddNumberToObject(j, "reps", reps);
      cJSON_AddNumberToObject(j, "median_s", r->med);
      cJSON_AddNumberToObject(j, "min_s", r->lo);
      cJSON_AddNumberToObject(j, "max_s", r->hi);
      cJSON_AddNumberToObject(j, "tok_per_s", r->G / r->med);
      cJSON_AddNumberToObject(j, "floor_s", r->floor_s);
      cJSON_AddStringToObject(j, "bound", r->memory_bound ? "memory" : "compute");
      cJSON_AddNumberToObject(j, "copy_gb_s", bw / 1e9);
      cJSON_AddNumberToObject(j, "fma_gflop_s", rate / 1e9);
      cJSON_AddNumberToObject(j, "matmul_gflop_s", mm / 1e9);
      cJSON_AddNumberToObject(j, "threads", nt);
      char *s = cJSON_PrintUnformatted(j);
      fprintf(out, "%s\n", s);
      free(s);
      cJSON_Delete(j);
    }
  }
  printf("\nmedian of %d runs after %d warm-up; wall time from the request's start (prefill included) to its last "
         "token; ms/forward = median / (decoder forwards + encoder passes); floor = sum over passes of max(bytes / "
         "copy, FLOPs / FMA rate).\n", reps, warm);
  if (out && fclose(out) != 0) { fprintf(stderr, "dgemma bench: cannot write %s\n", o->out); return 1; }
  return 0;
}
