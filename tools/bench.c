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
 * *   batch B = 1, 2, 4, 8 canvases of different prompts generated together by
 *         dg_generate_batch with the turbo engine's recommended setting
 *         (issue 6 item 6); the floor counts the weights once per batched
 *         decoder pass, reconstructed from the step callbacks.
 *   ceiling  the kernels alone at the MoE's shapes (tools/ceiling.c).
 *
 * Every row: median wall time of `reps` runs after `warmup` untimed ones,
 * min-max spread, tok/s, decoder forwards, and the floor: the sum over the
 * passes of max(bytes / copy bandwidth, FLOPs / FMA rate) (cost model in
 * bench.h). A fresh process per configuration is the caller's choice
 * (scripts/eval_configs.sh does it for eval; bench rows share one process and
 * the warm-up run absorbs the first-touch costs). */
#include "bench.h"
#include "outfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dg_error.h"
#include "cpu/kernels.h"
#include "cuda/backend.h"
#include "model/model.h"

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
static double expert_hit(int32_t E, int32_t k, double T) {
  if (E <= 0) return 0;
  return 1.0 - pow(1.0 - (double)k / E, (double)T);
}

/* Layer weights read once by a pass over T rows (experts: the expected number hit) and their matrix FLOPs. */
static void layers_weights(const dg_model *m, double T, bench_cost *c) {
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
  }
}

/* Attention of T queries over keys [0, ctx_len + span) (span = T for an encoder pass, C for a decoder
 * pass): K/V read once (and the T new rows written by an encoder pass), Q K^T and P V FLOPs. */
static void layers_attention(const dg_model *m, int32_t T, int32_t ctx_len, int32_t span, int causal, bench_cost *c) {
  const dg_config *cf = &m->cfg;
  for (int l = 0; l < cf->n_layers; l++) {
    const dg_layer *L = &m->layers[l];
    double keys_total = (double)ctx_len + span, avg_keys = causal ? ctx_len + (T + 1) / 2.0 : (double)ctx_len + span;
    if (!L->is_full) {
      keys_total = fmin(keys_total, (double)cf->sliding_window + span - 1);
      avg_keys = fmin(avg_keys, (double)cf->sliding_window);
    }
    const double kvw = (double)L->n_kv * L->head_dim * (L->v.data ? 2 : 1) * sizeof(float);
    c->kv_bytes += keys_total * kvw + (causal ? (double)T * kvw : 0); /* read, and written by an encoder pass */
    c->flops += 4.0 * T * avg_keys * cf->n_heads * L->head_dim;      /* Q K^T and P V */
  }
}

bench_cost bench_decoder_batch_cost(const dg_model *m, const bench_pass_seq *seqs, int n) {
  bench_cost c = {0, 0, 0, 0, 0};
  const dg_config *cf = &m->cfg;
  const int32_t C = cf->canvas_length, V = cf->vocab_size, H = cf->hidden_size;
  double rows = 0, head = 0;
  for (int i = 0; i < n; i++) {
    rows += seqs[i].rows;
    head += seqs[i].head_rows;
    layers_attention(m, seqs[i].rows, seqs[i].ctx_len, C, 0, &c);
  }
  if (rows <= 0) return c;
  layers_weights(m, rows, &c);
  /* tied LM head, and self-conditioning: probs [rows, V] x E [V, H] re-reads the embedding, then its MLP */
  c.weight_bytes += 2 * wbytes(&m->embed) + wbytes(&m->sc_gate) + wbytes(&m->sc_up) + wbytes(&m->sc_down);
  c.flops += 2.0 * rows * (wparams(&m->sc_gate) + wparams(&m->sc_up) + wparams(&m->sc_down)) + 2.0 * head * 2.0 * V * H;
  c.other_bytes += head * V * sizeof(float); /* logits written */
  return c;
}

bench_cost bench_decoder_cost(const dg_model *m, int32_t ctx_len) {
  const int32_t C = m->cfg.canvas_length;
  bench_pass_seq s = {C, C, ctx_len};
  return bench_decoder_batch_cost(m, &s, 1);
}

/* The cost model above split by the stages of dg_context_profile (DG_PROFILE_STAGES entries of st, added
 * to): a pass over T rows after ctx_len cached positions, causal = encoder (no LM head, no
 * self-conditioning; the last layer stops after its K/V, counted whole here as in
 * bench_encoder_cost). Stages with no weight or attention traffic get none of those; norms, combine and sampler
 * statistics get their activations' bytes (act_bytes, stage_acts below), grouping and host nothing. */
/* The layers' products of a pass over T rows (stages q/k/v, o-proj, dense MLP, router, experts) into st. */
static void stage_weights(const dg_model *m, double T, bench_cost *st) {
  const dg_config *cf = &m->cfg;
  const double hit = expert_hit(cf->n_experts, cf->top_k_experts, T);
  for (int l = 0; l < cf->n_layers; l++) {
    const dg_layer *L = &m->layers[l];
    const struct { int stage; const dg_weight *w[3]; } parts[] = {
        {1, {&L->q, &L->k, &L->v}}, {3, {&L->o, NULL, NULL}}, {4, {&L->mlp_gate, &L->mlp_up, &L->mlp_down}},
        {5, {&L->router, NULL, NULL}}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
      for (int j = 0; j < 3; j++)
        if (parts[i].w[j]) {
          st[parts[i].stage].weight_bytes += wbytes(parts[i].w[j]);
          st[parts[i].stage].flops += 2.0 * T * wparams(parts[i].w[j]);
        }
    st[7].weight_bytes += hit * (wbytes(&L->experts_gate_up) + wbytes(&L->experts_down));
    st[7].flops += 2.0 * T * cf->top_k_experts * (wparams(&L->experts_gate_up) + wparams(&L->experts_down)) /
                   (cf->n_experts ? cf->n_experts : 1);
  }
}

/* The stages without weights (session 26, issue 12 item 5), as act_bytes: each input read once and each output
 * written once, at the dtype the CUDA passes store it in (src/cuda/passes.cu; docs/cuda.md "Session 26 (helper
 * vs12)"), over a pass of T rows of which `head` go through the LM head:
 *   embedding and norms (0): the T embedding rows read and x [T, H] fp32 written; a decoder pass's norm of the
 *     embedding in place (x read and written); layer 0's input norm (x read, bf16 a written); per layer the attention
 *     residual k_attn_residual (x and the o-projection read, x and the router input written in fp32, the dense and
 *     the experts' inputs in bf16: 20 bytes per element);
 *   combine (8): per layer x, the dense output and the K expert rows read and x written in fp32, the K slots,
 *     expert ids and weights read (12 bytes a pair), and but after the last layer the next layer's normed input
 *     written in bf16;
 *   sampler statistics (11): the [head, V] fp32 logits read once.
 * The encoder's last layer stops after its K/V (no residual, no combine). Norm weights (H floats each) are left
 * out. Not part of a pass's cost (bench_decoder_cost: the weights, K/V and the logits written), whose floor these
 * do not change; activations of a 256-row pass (2.9 MB a row block) may sit in the L2, so these floors are the
 * device-memory bound of the kernels as they are, not of the operation. */
static void stage_acts(const dg_model *m, double T, double head, int causal, bench_cost *st) {
  const dg_config *cf = &m->cfg;
  const double H = cf->hidden_size, V = cf->vocab_size, K = cf->top_k_experts, L = cf->n_layers;
  const double Lr = causal ? L - 1 : L, erow = wbytes(&m->embed) / V;
  st[0].act_bytes += T * (erow + 4 * H) + (causal ? 0 : 8 * T * H) + 6 * T * H + Lr * 20 * T * H;
  st[8].act_bytes += Lr * (T * H * (12 + 4 * K) + 12 * T * K) + (L > 1 ? (L - 1) * 2 * T * H : 0);
  st[11].act_bytes += head * V * 4;
}

/* The LM head (9) over `head` rows and self-conditioning (10: its embedding product over `head` rows, its MLP over
 * `rows`) of a decoder pass into st. */
static void stage_vocab(const dg_model *m, double head, double rows, bench_cost *st) {
  const double V = m->cfg.vocab_size, H = m->cfg.hidden_size;
  st[9].weight_bytes += wbytes(&m->embed); /* LM head */
  st[9].flops += 2.0 * head * V * H;
  st[9].other_bytes += head * V * sizeof(float);
  st[10].weight_bytes += wbytes(&m->embed) + wbytes(&m->sc_gate) + wbytes(&m->sc_up) + wbytes(&m->sc_down);
  st[10].flops += 2.0 * head * V * H + 2.0 * rows * (wparams(&m->sc_gate) + wparams(&m->sc_up) + wparams(&m->sc_down));
}

void bench_stage_cost(const dg_model *m, int32_t T, int32_t ctx_len, int causal, bench_cost *st) {
  const int32_t C = m->cfg.canvas_length;
  stage_weights(m, T, st);
  layers_attention(m, T, ctx_len, causal ? T : C, causal, &st[2]);
  stage_acts(m, T, causal ? 0 : T, causal, st);
  if (!causal) stage_vocab(m, T, T, st);
}

void bench_stage_cost_batch(const dg_model *m, const bench_pass_seq *seqs, int n, bench_cost *st) {
  const int32_t C = m->cfg.canvas_length;
  double rows = 0, head = 0;
  for (int i = 0; i < n; i++) {
    rows += seqs[i].rows;
    head += seqs[i].head_rows;
    layers_attention(m, seqs[i].rows, seqs[i].ctx_len, C, 0, &st[2]);
  }
  if (rows <= 0) return;
  stage_weights(m, rows, st);
  stage_acts(m, rows, head, 0, st);
  stage_vocab(m, head, rows, st);
}

int32_t bench_encoder_chunks_cost(const dg_model *m, int32_t P, int32_t chunk, bench_cost *st) {
  if (P < 1 || chunk < 1) return 0;
  int32_t n = 0;
  for (int32_t i = 0; i < P; i += chunk, n++) bench_stage_cost(m, P - i < chunk ? P - i : chunk, i, 1, st);
  return n;
}

bench_cost bench_encoder_cost(const dg_model *m, int32_t T, int32_t ctx_len) {
  bench_cost c = {0, 0, 0, 0, 0};
  layers_weights(m, T, &c);
  layers_attention(m, T, ctx_len, T, 1, &c);
  return c;
}

double bench_floor_s(const bench_cost *c, double bw, double rate, int *memory_bound) {
  double tb = (c->weight_bytes + c->kv_bytes + c->other_bytes + c->act_bytes) / bw, tf = c->flops / rate;
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

bench_cost bench_matmul_cost(int64_t N, int64_t K, int bits, int group_size, int64_t M) {
  bench_cost c = {0, 0, 0, 0, 0};
  if (bits >= 16) c.weight_bytes = 2.0 * (double)N * (double)K;
  else c.weight_bytes = (double)N * (double)K * bits / 8.0 + 2.0 * (double)N * (double)(K / group_size) * 2.0;
  c.flops = 2.0 * (double)M * (double)N * (double)K;
  return c;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int bench_route_ids(int32_t T, int E, int top_k, uint64_t seed, int32_t *ids) {
  int *perm = malloc((size_t)E * sizeof *perm);
  if (!perm || top_k > E) { free(perm); return -1; }
  uint64_t st = seed;
  for (int32_t t = 0; t < T; t++) { /* top_k distinct experts: the first top_k of a partial shuffle */
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int j = 0; j < top_k; j++) {
      int r = j + (int)(splitmix64(&st) % (uint64_t)(E - j)), x = perm[j];
      perm[j] = perm[r];
      perm[r] = x;
      ids[(size_t)t * top_k + j] = perm[j];
    }
  }
  free(perm);
  return 0;
}

int bench_route(int32_t T, int E, int top_k, uint64_t seed, int32_t *start, int32_t *token_of) {
  int *perm = malloc((size_t)E * sizeof *perm);
  int32_t *pick = malloc((size_t)T * top_k * sizeof *pick);
  if (!perm || !pick || bench_route_ids(T, E, top_k, seed, pick)) { free(perm); free(pick); return -1; }
  for (int e = 0; e <= E; e++) start[e] = 0;
  for (size_t i = 0; i < (size_t)T * top_k; i++) start[pick[i] + 1]++;
  int hit = 0;
  for (int e = 0; e < E; e++) { hit += start[e + 1] > 0; start[e + 1] += start[e]; }
  if (token_of) { /* rows grouped by expert, tokens in increasing order within an expert */
    for (int e = 0; e < E; e++) perm[e] = start[e];
    for (size_t i = 0; i < (size_t)T * top_k; i++) token_of[perm[pick[i]]++] = (int32_t)(i / (size_t)top_k);
  }
  free(perm);
  free(pick);
  return hit;
}

int32_t bench_route_even(int M, int E, int top_k, int32_t *ids) {
  if (M <= 0 || E <= 0 || top_k <= 0 || E % top_k || ((int64_t)E * M) % top_k) return -1;
  const int32_t T = (int32_t)((int64_t)E * M / top_k);
  for (int64_t i = 0; i < (int64_t)T * top_k; i++) ids[i] = (int32_t)(i % E);
  return T;
}

bench_cost bench_experts_cost(int bits, int group_size, int64_t H, int64_t IE, int64_t experts, int64_t rows) {
  bench_cost gu = bench_matmul_cost(2 * IE, H, bits, group_size, rows), dn = bench_matmul_cost(H, IE, bits, group_size, rows);
  bench_cost c = {0, 0, 0, 0, 0};
  c.weight_bytes = (double)experts * (gu.weight_bytes + dn.weight_bytes);
  c.flops = gu.flops + dn.flops;
  return c;
}

const char *bench_gpu_rates(const dg_cuda_ceilings *a, const dg_cuda_ceilings *b, double *bw, double *rate) {
  *bw = a->read_bps;
  *rate = a->bf16_flops;
  if (b) {
    *bw = fmax(*bw, b->read_bps);
    *rate = fmax(*rate, b->bf16_flops);
  }
  return a->name;
}

/* ---- options ------------------------------------------------------------------ */

int bench_parse_list(const char *s, const char *name, int lo, int hi, int *v, int cap, char *err, size_t n_err) {
  int n = 0;
  const char *p = s ? s : "";
  for (;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char item[32];
    if (len == 0 || len >= sizeof item) {
      snprintf(err, n_err, "%s: \"%s\": %s", name, s ? s : "", len ? "item too long" : "empty item (expected e.g. 1,2,4,8)");
      return -1;
    }
    memcpy(item, p, len);
    item[len] = 0;
    char *end;
    errno = 0;
    long x = strtol(item, &end, 10);
    if (*end || errno) { snprintf(err, n_err, "%s: \"%s\" is not an integer", name, item); return -1; }
    if (x < lo || x > hi) { snprintf(err, n_err, "%s: %ld is not in [%d, %d]", name, x, lo, hi); return -1; }
    if (n == cap) { snprintf(err, n_err, "%s: more than %d values", name, cap); return -1; }
    v[n++] = (int)x;
    if (!e) break;
    p = e + 1;
  }
  return n;
}

int bench_parse_formats(const char *s, int *bits, int cap, char *err, size_t n_err) {
  int n = 0;
  const char *p = s ? s : "";
  for (;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    int b = -1;
    if (len == 4 && !strncmp(p, "bf16", 4)) b = 16;
    else if (len == 1 && strchr("23468", *p)) b = *p - '0';
    if (b < 0) {
      snprintf(err, n_err, "--formats: \"%.*s\" is not a format (bf16, 8, 6, 4, 3, 2: bits of MLX affine group 64)",
               (int)len, p);
      return -1;
    }
    if (n == cap) { snprintf(err, n_err, "--formats: more than %d values", cap); return -1; }
    bits[n++] = b;
    if (!e) break;
    p = e + 1;
  }
  return n;
}

static const char *kProtocols = "vllm, p512, batch, step, ceiling, all";

int bench_check_opts(const bench_opts *o, char *err, size_t n_err) {
  const char *p = o->protocol ? o->protocol : "all";
  if (strcmp(p, "vllm") && strcmp(p, "p512") && strcmp(p, "batch") && strcmp(p, "step") && strcmp(p, "ceiling") &&
      strcmp(p, "all")) {
    snprintf(err, n_err, "unknown --protocol \"%s\" (%s)", p, kProtocols);
    return -1;
  }
  int v[BENCH_MAX_LIST];
  if (o->canvases && bench_parse_list(o->canvases, "--canvases", 1, BENCH_MAX_B, v, BENCH_MAX_LIST, err, n_err) < 0)
    return -1;
  if (o->rows && bench_parse_list(o->rows, "--rows", 1, 4096, v, BENCH_MAX_LIST, err, n_err) < 0) return -1;
  if (o->moe_tokens && bench_parse_list(o->moe_tokens, "--moe-tokens", 0, 4096, v, BENCH_MAX_LIST, err, n_err) < 0)
    return -1;
  if (o->formats && bench_parse_formats(o->formats, v, BENCH_MAX_LIST, err, n_err) < 0) return -1;
  if (o->contexts && bench_parse_list(o->contexts, "--contexts", 1, 1 << 20, v, BENCH_MAX_LIST, err, n_err) < 0)
    return -1;
  if (o->contexts && strcmp(p, "step")) {
    snprintf(err, n_err, "--contexts sets the prompts of --protocol step, not of --protocol %s", p);
    return -1;
  }
  /* first whether --profile applies to the protocol at all, then where it can run */
  if (o->profile && !strcmp(p, "ceiling")) {
    snprintf(err, n_err, "--profile splits the vllm, p512, batch and step rows into stages, not --protocol %s", p);
    return -1;
  }
  if (o->profile && o->device != DG_DEVICE_CUDA) {
    snprintf(err, n_err, "--profile times the CUDA backend's stages: add --device cuda");
    return -1;
  }
  if (o->prompt_tokens > 0 && strcmp(p, "vllm") && strcmp(p, "all")) {
    snprintf(err, n_err, "--prompt-tokens sets the prompt of --protocol vllm (and of the vllm row of all), not of "
             "--protocol %s", p);
    return -1;
  }
  return 0;
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

/* The dot-product loops run a quarter of the FMA loop's iterations (each
 * instruction does 2-4x the work; ~0.03 s per run on cpu2). */
#define DP_ITERS (FMA_ITERS / 4)

/* vdpbf16ps: 12 independent accumulators, 32 bf16 multiply-adds per instruction
 * (FLOPs = iters * 12 * 32 * 2). */
__attribute__((target("avx512f,avx512bf16"))) static double dp_bf16(void) {
  __m512 acc[12];
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f));
  for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < DP_ITERS; it++)
    for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, x);
  float s = 0, buf[16];
  for (int i = 0; i < 12; i++) { _mm512_storeu_ps(buf, acc[i]); s += buf[0]; }
  return DP_ITERS * 12.0 * 32 * 2 + 0 * s;
}

/* vpdpbusd: 64 u8 x s8 multiply-adds per instruction (ops = iters * 12 * 64 * 2). */
__attribute__((target("avx512f,avx512vnni"))) static double dp_int8(void) {
  __m512i acc[12];
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
  for (long it = 0; it < DP_ITERS; it++)
    for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  int32_t buf[16];
  uint32_t s = 0; /* the lanes wrap (vpdpbusd does not saturate): sum them modulo 2^32 */
  for (int i = 0; i < 12; i++) { _mm512_storeu_si512(buf, acc[i]); s += (uint32_t)buf[0]; }
  volatile uint32_t sink = s; /* keeps the loop: 0 * s would be folded for an int */
  (void)sink;
  return DP_ITERS * 12.0 * 64 * 2;
}

/* vpmaddubsw (AVX2): 32 u8 x s8 multiply-adds per instruction, the pair sums added
 * into 12 independent s16 accumulators (wrapping adds); each accumulator's bytes are
 * the signed operand of its next product, so the products cannot be hoisted out of
 * the loop, and 12 chains of latency ~5 keep the multipliers busy
 * (ops = iters * 12 * 32 * 2). */
__attribute__((target("avx2"))) static double dp_maddubs(void) {
  __m256i acc[12];
  const __m256i a = _mm256_set1_epi8(3);
  for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_epi16((short)i);
  for (long it = 0; it < DP_ITERS; it++)
    for (int i = 0; i < 12; i++) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(a, acc[i]));
  int16_t buf[16];
  uint32_t s = 0;
  for (int i = 0; i < 12; i++) { _mm256_storeu_si256((__m256i *)buf, acc[i]); s += (uint16_t)buf[0]; }
  volatile uint32_t sink = s; /* keeps the loop (an integer 0 * s would be folded) */
  (void)sink;
  return DP_ITERS * 12.0 * 32 * 2;
}

double bench_dp_rate(int n_threads, int reps, int kind) {
  __builtin_cpu_init();
  if (kind == 3 ? !__builtin_cpu_supports("avx2")
                : !__builtin_cpu_supports("avx512f") ||
                      (kind == 1 ? !__builtin_cpu_supports("avx512bf16") : !__builtin_cpu_supports("avx512vnni")))
    return 0;
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double ops = 0, t0 = now_s();
#pragma omp parallel num_threads(n_threads) reduction(+ : ops)
    ops += kind == 1 ? dp_bf16() : kind == 2 ? dp_int8() : dp_maddubs();
    double rate = ops / (now_s() - t0);
    if (rate > best) best = rate;
  }
  return best;
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
double bench_matmul_rate(int n_threads, const char **name) {
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

/* p512 uses the first three; the batch rows give canvas b prompt b % 8 (our own words). */
static const char *kPrompts[8][2] = {
    {"qa", "What is the capital of France, and on which river does it lie?"},
    {"technical", "Explain how a hash table resolves collisions, and compare chaining with open addressing."},
    {"creative", "Write a short story about a lighthouse keeper who finds a message in a bottle."},
    {"math", "A train leaves at 9:40 and arrives at 13:05. How long is the journey, in minutes?"},
    {"code", "Write a C function that reverses a singly linked list, and explain each step."},
    {"summary", "Summarize the main causes of the French Revolution in a few sentences."},
    {"advice", "Give me three practical tips for learning to play the piano as an adult."},
    {"translate", "Translate into German: The weather is nice today, so let us walk along the river."},
};

/* The vllm and step protocols' prompt: <bos> + kFiller's tokens repeated and cut to P - 1, malloc'd; NULL after
 * saying why on stderr. */
static int32_t *filler_prompt(const dg_model *m, int32_t P) {
  int32_t *ids = malloc((size_t)P * sizeof *ids), *t = NULL, *bos = NULL;
  size_t nt_ = 0, nb = 0, have = 1;
  if (!ids || dg_tokenize(m, "<bos>", 5, 1, &bos, &nb) || nb != 1 || dg_tokenize(m, kFiller, strlen(kFiller), 0, &t, &nt_) || !nt_) {
    fprintf(stderr, "dgemma bench: cannot build the prompt (tokenizer): %s\n", dg_last_error());
    free(ids); dg_free(t); dg_free(bos);
    return NULL;
  }
  ids[0] = bos[0];
  while (have < (size_t)P) { ids[have] = t[(have - 1) % nt_]; have++; }
  dg_free(t); dg_free(bos);
  return ids;
}

/* vLLM's protocol's generation settings: G tokens, 16 fixed denoising steps per canvas, stop ids off. */
static dg_gen_params vllm_params(const dg_model *m, int32_t G, uint64_t seed) {
  dg_gen_params gp = dg_gen_default_params(m);
  gp.max_new_tokens = G;
  gp.max_denoising_steps = 16;
  gp.stability_threshold = 17; /* > N: never stable, so exactly 16 steps (the reference's way) */
  gp.n_stop_ids = 0;           /* every canvas generated */
  gp.seed = seed;
  return gp;
}

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

/* ---- batch protocol ------------------------------------------------------------- */

void bench_trace_free(bench_trace *t) {
  free(t->steps);
  free(t->blocks);
  memset(t, 0, sizeof *t);
}

/* The write-up's recommended interactive setting, stop ids and the repeat guard off. */
static const char *kBatchDefaults =
    "{\"diffusion_turbo\": true, \"turbo_accept\": \"confidence\", \"turbo_threshold\": [0.95, 0.80, 8], "
    "\"turbo_repair\": true, \"turbo_compact\": true, \"turbo_repeat_guard\": 0, \"eos_token_id\": []}";

dg_status bench_batch_params(const dg_model *m, const char *gen_kwargs, int gen_tokens, uint64_t seed,
                             dg_gen_params *out) {
  dg_gen_params gp = dg_gen_default_params(m);
  dg_status st = dg_gen_params_apply_json(&gp, kBatchDefaults);
  if (st) return st;
  gp.max_new_tokens = 4 * m->cfg.canvas_length;
  gp.seed = seed;
  if (gen_kwargs && (st = dg_gen_params_apply_json(&gp, gen_kwargs))) return st;
  if (gen_tokens > 0) gp.max_new_tokens = gen_tokens;
  if (!gp.turbo.enabled)
    return dg_seterr(DG_ERR_INVALID_ARG, "the batch protocol needs diffusion_turbo (dg_generate_batch is a turbo "
                                         "technique); --gen-kwargs set it false");
  if ((st = dg_gen_params_check(m, &gp))) return st; /* a stop id outside the vocabulary: now, not after a row */
  *out = gp;
  return DG_OK;
}

dg_status bench_batch_prompt(const dg_model *m, int b, int32_t **ids, size_t *n, const char **label) {
  const int k = b % 8;
  dg_chat_message msg = {"user", kPrompts[k][1]};
  if (label) *label = kPrompts[k][0];
  return dg_chat_apply(m, &msg, 1, 0, ids, n);
}

int bench_check_model(const dg_model *m, const bench_opts *o, char *err, size_t n_err) {
  const char *p = o->protocol ? o->protocol : "all";
  const int all = !strcmp(p, "all");
  const int32_t C = m->cfg.canvas_length, max_pos = m->cfg.max_position_embeddings;
  /* positions of a row: its prompt + its generation rounded up to whole canvases */
  if (all || !strcmp(p, "vllm")) {
    const long long P = o->prompt_tokens > 0 ? o->prompt_tokens : 4LL * C, G = o->gen_tokens > 0 ? o->gen_tokens : 4LL * C;
    const long long need = P + (G + C - 1) / C * C;
    if (need > max_pos) {
      snprintf(err, n_err, "the vllm row needs %lld positions (prompt %lld%s + %lld generated, in canvases of %d), "
               "past the model's max_position_embeddings %d: lower %s", need, P, o->prompt_tokens > 0 ? " (--prompt-tokens)" : "",
               (G + C - 1) / C * C, C, max_pos, o->prompt_tokens > 0 ? "--prompt-tokens or -n" : "-n");
      return -1;
    }
  }
  if (!strcmp(p, "step")) { /* each prompt and its one canvas */
    int Ps[BENCH_MAX_LIST];
    const int nP = bench_parse_list(o->contexts ? o->contexts : "1024", "--contexts", 1, 1 << 20, Ps, BENCH_MAX_LIST,
                                    err, n_err);
    if (nP < 0) return -1;
    for (int i = 0; i < nP; i++)
      if ((long long)Ps[i] + C > max_pos) {
        snprintf(err, n_err, "--contexts %d: the step row needs %lld positions (the prompt and a canvas of %d), past "
                 "the model's max_position_embeddings %d", Ps[i], (long long)Ps[i] + C, C, max_pos);
        return -1;
      }
    return 0;
  }
  const int do_512 = all || !strcmp(p, "p512"), do_batch = all || !strcmp(p, "batch");
  for (int k = 0; (do_512 || do_batch) && k < 8; k++) { /* the chat prompts of the p512 (k < 3) and batch rows */
    if (!do_batch && k >= 3) break;
    int32_t *ids = NULL;
    size_t n = 0;
    dg_chat_message msg = {"user", kPrompts[k][1]};
    if (dg_chat_apply(m, &msg, 1, 0, &ids, &n)) {
      snprintf(err, n_err, "chat template: %s", dg_last_error());
      return -1;
    }
    dg_free(ids);
    if (o->gen_tokens <= 0 && !(do_512 && k < 3) && o->gen_kwargs) continue; /* batch: its --gen-kwargs decide */
    const long long G = o->gen_tokens > 0 ? o->gen_tokens : (do_512 && k < 3) ? 512 : 4LL * C;
    const long long need = (long long)n + (G + C - 1) / C * C;
    if (need > max_pos) {
      snprintf(err, n_err, "-n %lld: the %s rows need %lld positions (a prompt of %zu tokens + %lld generated, in "
               "canvases of %d), past the model's max_position_embeddings %d", G, do_512 && k < 3 ? "p512" : "batch",
               need, n, (G + C - 1) / C * C, C, max_pos);
      return -1;
    }
  }
  return 0;
}

typedef struct batch_cb { bench_trace *tr; int32_t canvas; } batch_cb;

static int rec_step(const dg_step_info *si, void *ud) {
  batch_cb *cb = ud;
  bench_trace *t = cb->tr;
  if (t->n_steps == t->cap_steps) {
    int32_t cap = t->cap_steps ? 2 * t->cap_steps : 1024;
    bench_step_rec *p = realloc(t->steps, (size_t)cap * sizeof *p);
    if (!p) { t->oom = 1; return 0; }
    t->steps = p;
    t->cap_steps = cap;
  }
  t->steps[t->n_steps++] = (bench_step_rec){cb->canvas, si->block, si->forward_shape, si->head_shape};
  return 0;
}

static int rec_block(const dg_block_info *bi, void *ud) {
  batch_cb *cb = ud;
  bench_trace *t = cb->tr;
  if (t->n_blocks == t->cap_blocks) {
    int32_t cap = t->cap_blocks ? 2 * t->cap_blocks : 64;
    bench_block_rec *p = realloc(t->blocks, (size_t)cap * sizeof *p);
    if (!p) { t->oom = 1; return 0; }
    t->blocks = p;
    t->cap_blocks = cap;
  }
  t->blocks[t->n_blocks++] = (bench_block_rec){cb->canvas, bi->block, bi->n_steps};
  return 0;
}

dg_status bench_batch_run(dg_context *const *ctxs, int B, int32_t *const *prompts, const size_t *n_prompts,
                          const dg_gen_params *gp, dg_gen_result *results, double *seconds, bench_trace *tr) {
  dg_gen_params *ps = malloc((size_t)B * sizeof *ps);
  batch_cb *cbs = malloc((size_t)B * sizeof *cbs);
  if (!ps || !cbs) { free(ps); free(cbs); return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); }
  for (int b = 0; b < B; b++) {
    ps[b] = *gp;
    ps[b].seed = gp->seed + (uint64_t)b;
    if (tr) {
      cbs[b] = (batch_cb){tr, b};
      ps[b].on_step = rec_step;
      ps[b].on_block = rec_block;
      ps[b].user_data = &cbs[b];
    }
    dg_context_reset(ctxs[b]);
  }
  double t0 = now_s();
  dg_status st = dg_generate_batch(ctxs, B, (const int32_t *const *)prompts, n_prompts, ps, results);
  if (seconds) *seconds = now_s() - t0;
  free(ps);
  free(cbs);
  return st;
}

static double add_pass(const bench_cost *c, double bw, double rate, double *mem_t, double *terms) {
  int mb;
  double f = bench_floor_s(c, bw, rate, &mb);
  terms[0] += (c->weight_bytes + c->kv_bytes + c->other_bytes) / bw;
  terms[1] += c->flops / rate;
  if (mb) *mem_t += f;
  return f;
}

double bench_batch_floor(const dg_model *m, int B, const size_t *n_prompts, const bench_trace *tr, double bw,
                         double rate, int *memory_bound, int32_t *n_passes, double *bytes_s, double *flops_s) {
  const int32_t C = m->cfg.canvas_length;
  double all = 0, mem_t = 0, terms[2] = {0, 0};
  int32_t nblk = 1, passes = 0;
  for (int32_t i = 0; i < tr->n_blocks; i++) nblk = tr->blocks[i].block + 1 > nblk ? tr->blocks[i].block + 1 : nblk;
  for (int32_t i = 0; i < tr->n_steps; i++) nblk = tr->steps[i].block + 1 > nblk ? tr->steps[i].block + 1 : nblk;
  int32_t *cnt = calloc((size_t)B * nblk, sizeof *cnt);
  bench_pass_seq *ps = malloc((size_t)B * sizeof *ps);
  if (!cnt || !ps) { free(cnt); free(ps); return 0; }
  for (int b = 0; b < B; b++) { /* prefill */
    bench_cost c = bench_encoder_cost(m, (int32_t)n_prompts[b], 0);
    all += add_pass(&c, bw, rate, &mem_t, terms);
  }
  /* batched decoder passes */
  int n = 0, last = -1;
  for (int32_t i = 0; i <= tr->n_steps; i++) {
    const bench_step_rec *r = i < tr->n_steps ? &tr->steps[i] : NULL;
    if (n > 0 && (!r || r->canvas <= last)) {
      bench_cost c = bench_decoder_batch_cost(m, ps, n);
      all += add_pass(&c, bw, rate, &mem_t, terms);
      passes++;
      n = 0;
    }
    if (!r) break;
    if (r->canvas < 0 || r->canvas >= B) continue;
    ps[n++] = (bench_pass_seq){r->rows, r->head_rows, (int32_t)n_prompts[r->canvas] + r->block * C};
    last = r->canvas;
    cnt[(size_t)r->canvas * nblk + r->block]++;
  }
  /* commits and repair forwards, per canvas */
  for (int32_t i = 0; i < tr->n_blocks; i++) {
    const bench_block_rec *r = &tr->blocks[i];
    if (r->canvas < 0 || r->canvas >= B) continue;
    const int32_t L = (int32_t)n_prompts[r->canvas] + r->block * C;
    if (r->block > 0) {
      bench_cost c = bench_encoder_cost(m, C, L - C);
      all += add_pass(&c, bw, rate, &mem_t, terms);
    }
    for (int32_t k = cnt[(size_t)r->canvas * nblk + r->block]; k < r->n_steps; k++) {
      bench_pass_seq one = {C, C, L};
      bench_cost c = bench_decoder_batch_cost(m, &one, 1);
      all += add_pass(&c, bw, rate, &mem_t, terms);
    }
  }
  free(cnt);
  free(ps);
  if (memory_bound) *memory_bound = mem_t >= all / 2;
  if (n_passes) *n_passes = passes;
  if (bytes_s) *bytes_s = terms[0];
  if (flops_s) *flops_s = terms[1];
  return all;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int32_t bench_batch_passes(const bench_trace *tr, int B, int32_t *rows, int32_t *canvases, int32_t cap) {
  int32_t np = 0, r_sum = 0, n = 0, last = -1;
  for (int32_t i = 0; i <= tr->n_steps; i++) {
    const bench_step_rec *r = i < tr->n_steps ? &tr->steps[i] : NULL;
    if (n > 0 && (!r || r->canvas <= last)) { /* the same rule as bench_batch_floor's */
      if (np < cap && rows) rows[np] = r_sum;
      if (np < cap && canvases) canvases[np] = n;
      np++;
      n = r_sum = 0;
    }
    if (!r) break;
    if (r->canvas < 0 || r->canvas >= B) continue;
    r_sum += r->rows;
    n++;
    last = r->canvas;
  }
  return np;
}

typedef struct batch_row {
  int B;
  int32_t P, G, blocks, forwards, passes;
  double med, lo, hi, floor_s, bytes_s, flops_s;
  double bw, rate; /* the ceilings of this row: measured just before and after it, the best of both */
  int memory_bound;
  int checked, equal; /* canvases compared with a smaller B's row, and how many had the same tokens */
  int32_t rows_min, rows_max; /* rows per batched pass of the last run (forward sets summed, bucket-padded) */
  double rows_med;
} batch_row;

/* min / median / max of the rows per batched pass of a recorded batch (0 when there is none). */
static void batch_rows_stats(const bench_trace *tr, int B, int32_t *lo, double *med, int32_t *hi) {
  *lo = *hi = 0;
  *med = 0;
  const int32_t cap = tr->n_steps + 1;
  int32_t *rows = malloc((size_t)cap * sizeof *rows);
  if (!rows) return;
  const int32_t np = bench_batch_passes(tr, B, rows, NULL, cap);
  if (np > 0) {
    qsort(rows, (size_t)np, sizeof *rows, cmp_i32);
    *lo = rows[0];
    *hi = rows[np - 1];
    *med = np % 2 ? rows[np / 2] : 0.5 * (rows[np / 2 - 1] + rows[np / 2]);
  }
  free(rows);
}

/* The batch protocol's canvases 0..Bmax-1 (Bmax = the largest of Bs): canvas b's prompt (bench_batch_prompt: chat
 * prompt b % 8) and its context of prompt + the canvases gp's tokens need, and room for Bmax results. Shared by the
 * timed rows and --profile. Returns 0, or 1 after saying on stderr which canvas failed (what: the message's prefix). */
typedef struct batch_set {
  int Bmax;
  int32_t **ids;
  size_t *n;
  dg_context **ctx;
  dg_gen_result *res;
} batch_set;

static void batch_set_close(batch_set *s) {
  for (int b = 0; b < s->Bmax; b++) {
    if (s->ids) dg_free(s->ids[b]);
    if (s->ctx) dg_context_free(s->ctx[b]);
  }
  free(s->ids); free(s->n); free(s->ctx); free(s->res);
  memset(s, 0, sizeof *s);
}

static int batch_set_open(dg_model *m, const dg_gen_params *gp, const int *Bs, int nB, const char *what, batch_set *s) {
  const int32_t C = m->cfg.canvas_length, n_canv = (gp->max_new_tokens + C - 1) / C;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < nB; i++) s->Bmax = Bs[i] > s->Bmax ? Bs[i] : s->Bmax;
  s->ids = calloc((size_t)s->Bmax, sizeof *s->ids);
  s->n = calloc((size_t)s->Bmax, sizeof *s->n);
  s->ctx = calloc((size_t)s->Bmax, sizeof *s->ctx);
  s->res = calloc((size_t)s->Bmax, sizeof *s->res);
  if (!s->ids || !s->n || !s->ctx || !s->res) {
    fprintf(stderr, "dgemma bench: out of memory\n");
    return 1;
  }
  for (int b = 0; b < s->Bmax; b++) {
    dg_context_params cp = dg_context_default_params();
    dg_status st = bench_batch_prompt(m, b, &s->ids[b], &s->n[b], NULL);
    if (!st) {
      cp.max_context = (int32_t)s->n[b] + n_canv * C;
      st = dg_context_new(m, &cp, &s->ctx[b]);
    }
    if (st) {
      fprintf(stderr, "dgemma bench: %s canvas %d: %s: %s\n", what, b, dg_status_str(st), dg_last_error());
      return 1;
    }
  }
  return 0;
}

/* The rows of the batch protocol: for each B, canvases 0..B-1 (prompt b % 8, seed + b) generated together. */
static int run_batch(dg_model *m, const bench_opts *o, const dg_gen_params *gp, const int *Bs, int nB,
                     const dg_cuda_ceilings *gc, batch_row *rows) {
  batch_set bs;
  int rc = batch_set_open(m, gp, Bs, nB, "batch", &bs);
  int32_t **ids = bs.ids, **seen = calloc((size_t)bs.Bmax, sizeof *seen);
  size_t *n = bs.n;
  dg_context **ctx = bs.ctx;
  dg_gen_result *res = bs.res;
  if (!rc && !seen) { fprintf(stderr, "dgemma bench: out of memory\n"); rc = 1; }
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  for (int r = 0; !rc && r < nB; r++) {
    const int B = Bs[r];
    batch_row *row = &rows[r];
    memset(row, 0, sizeof *row);
    row->B = B;
    double t[1000];
    bench_trace tr = {0};
    /* a row lasts minutes at large B: on a shared machine the load moves, so each row gets its own ceilings */
    if (gc) { /* a GPU: its ceilings of the command's start (no other load moves them) */
      bench_gpu_rates(gc, NULL, &row->bw, &row->rate);
    } else {
      row->bw = bench_copy_bandwidth((size_t)256 << 20, m->n_threads, 5);
      row->rate = bench_fma_rate(m->n_threads, 5, NULL);
    }
    for (int i = 0; !rc && i < warm + reps; i++) {
      const int last = i == warm + reps - 1;
      if (last) bench_trace_free(&tr);
      double sec = 0;
      dg_status st = bench_batch_run(ctx, B, ids, n, gp, res, &sec, last ? &tr : NULL);
      if (st) {
        fprintf(stderr, "dgemma bench: batch B = %d: %s: %s\n", B, dg_status_str(st), dg_last_error());
        rc = 1;
        break;
      }
      if (i >= warm) t[i - warm] = sec;
      if (last) {
        row->P = row->G = row->blocks = row->forwards = 0;
        for (int b = 0; b < B; b++) {
          row->P += (int32_t)n[b];
          row->G += res[b].n_valid;
          row->blocks += res[b].n_blocks;
          row->forwards += res[b].n_steps;
          if (seen[b]) { /* outputs do not depend on B: compare with the first row that had canvas b */
            row->checked++;
            row->equal += !memcmp(seen[b], res[b].tokens, (size_t)res[b].n_tokens * sizeof(int32_t));
          } else if ((seen[b] = malloc((size_t)res[b].n_tokens * sizeof(int32_t) + 1))) {
            memcpy(seen[b], res[b].tokens, (size_t)res[b].n_tokens * sizeof(int32_t));
          }
        }
      }
      for (int b = 0; b < B; b++) dg_gen_result_free(&res[b]);
      if (o->tty) fprintf(stderr, "\rbatch B=%d: run %d/%d%s", B, i + 1, warm + reps, i < warm ? " (warm-up)" : "          ");
    }
    if (o->tty) fprintf(stderr, "\r%60s\r", "");
    if (!rc && tr.oom) { fprintf(stderr, "dgemma bench: out of memory recording the batch trace\n"); rc = 1; }
    if (!rc) {
      row->lo = row->hi = t[0];
      for (int i = 1; i < reps; i++) { row->lo = fmin(row->lo, t[i]); row->hi = fmax(row->hi, t[i]); }
      row->med = bench_median(t, reps);
      if (!gc) {
        row->bw = fmax(row->bw, bench_copy_bandwidth((size_t)256 << 20, m->n_threads, 5));
        row->rate = fmax(row->rate, bench_fma_rate(m->n_threads, 5, NULL));
      }
      row->floor_s = bench_batch_floor(m, B, n, &tr, row->bw, row->rate, &row->memory_bound, &row->passes,
                                       &row->bytes_s, &row->flops_s);
      batch_rows_stats(&tr, B, &row->rows_min, &row->rows_med, &row->rows_max);
    }
    bench_trace_free(&tr);
  }
  for (int b = 0; seen && b < bs.Bmax; b++) free(seen[b]);
  free(seen);
  batch_set_close(&bs);
  return rc;
}

static void json_line(FILE *out, cJSON *j);

/* bench --profile --protocol batch: for each B one more dg_generate_batch with the stage timing of every canvas's
 * context on (outside the timed rows). The stacked passes run on the batch's work context: each canvas's
 * dg_profile.stack_ms holds those it led, so the sum over the B contexts is every stacked pass once; ms[] holds
 * the canvases' own device work (prefill, commits, repair forwards, top-K, self-conditioning rows; B = 1: also its
 * compacted passes, which run on its own context). Printed per batched pass with the cost model's floor per stage
 * at each pass's recorded rows (bench_stage_cost_batch) and, per canvas, of its prefill, commits and repairs. */
static int profile_batch(dg_model *m, const bench_opts *o, const dg_gen_params *gp, const int *Bs, int nB, double bw,
                         double rate, FILE *out) {
  const int32_t C = m->cfg.canvas_length, E = m->cfg.n_experts, K = m->cfg.top_k_experts;
  const int32_t n_canv = (gp->max_new_tokens + C - 1) / C; /* blocks per canvas */
  batch_set bs;
  int rc = batch_set_open(m, gp, Bs, nB, "--profile:", &bs);
  int32_t **ids = bs.ids;
  size_t *n = bs.n;
  dg_context **ctx = bs.ctx;
  dg_gen_result *res = bs.res;
  for (int r = 0; !rc && r < nB; r++) {
    const int B = Bs[r];
    bench_trace tr = {0};
    double sec = 0, cv[DG_PROFILE_STAGES] = {0}, sk[DG_PROFILE_STAGES] = {0};
    int64_t sk_passes = 0, sk_canv = 0, sk_rows = 0, marks = 0, emax = 0;
    int sk_e50 = 0, sk_e90 = 0;
    double sk_hit = 0;
    static int64_t eh[DG_PROFILE_EXPERT_BINS]; /* rows per expert over the B records */
    memset(eh, 0, sizeof eh);
    dg_status st = DG_OK;
    for (int b = 0; b < B && !st; b++) st = dg_context_profile(ctx[b], 1);
    if (!st) st = bench_batch_run(ctx, B, ids, n, gp, res, &sec, &tr);
    const char *names[DG_PROFILE_STAGES] = {0};
    for (int b = 0; b < B && !st; b++) {
      dg_profile p;
      if ((st = dg_context_profile_read(ctx[b], &p))) break;
      for (int i = 0; i < DG_PROFILE_STAGES; i++) { cv[i] += p.ms[i]; sk[i] += p.stack_ms[i]; names[i] = p.name[i]; }
      sk_passes += p.stack_passes; sk_canv += p.stack_canvases; sk_rows += p.stack_rows;
      for (int i = 0; i < DG_PROFILE_EXPERT_BINS; i++) eh[i] += p.stack_expert_rows[i];
      emax = p.stack_expert_rows_max > emax ? p.stack_expert_rows_max : emax;
      marks += p.marks + p.stack_marks;
    }
    for (int b = 0; b < B; b++) dg_context_profile(ctx[b], 0);
    if (!st && tr.oom) st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory recording the batch trace");
    if (st) {
      fprintf(stderr, "dgemma bench: --profile: batch B = %d: %s: %s\n", B, dg_status_str(st), dg_last_error());
      for (int b = 0; b < B; b++) dg_gen_result_free(&res[b]);
      bench_trace_free(&tr);
      rc = 1;
      break;
    }
    int32_t forwards = 0, blocks = 0, toks = 0;
    for (int b = 0; b < B; b++) {
      forwards += res[b].n_steps;
      blocks += res[b].n_blocks;
      toks += res[b].n_valid;
      dg_gen_result_free(&res[b]);
    }
    /* the batched passes from the step records: rows and canvases of each, and each stage's floor at its rows */
    const int32_t cap = tr.n_steps + 1;
    int32_t *rows = malloc((size_t)cap * sizeof *rows), *canv = malloc((size_t)cap * sizeof *canv);
    bench_pass_seq *ps = malloc((size_t)B * sizeof *ps);
    int32_t *per = calloc((size_t)B * (n_canv + 1), sizeof *per); /* step records per (canvas, block) */
    if (!rows || !canv || !ps || !per) {
      fprintf(stderr, "dgemma bench: out of memory\n");
      free(rows); free(canv); free(ps); free(per);
      bench_trace_free(&tr);
      rc = 1;
      break;
    }
    const int32_t np = bench_batch_passes(&tr, B, rows, canv, cap);
    double fs[DG_PROFILE_STAGES] = {0}, fc[DG_PROFILE_STAGES] = {0};
    int32_t nps = 0, last = -1;
    for (int32_t i = 0; i <= tr.n_steps; i++) {
      const bench_step_rec *q = i < tr.n_steps ? &tr.steps[i] : NULL;
      if (nps > 0 && (!q || q->canvas <= last)) {
        bench_cost c[DG_PROFILE_STAGES];
        memset(c, 0, sizeof c);
        bench_stage_cost_batch(m, ps, nps, c);
        for (int k = 0; k < DG_PROFILE_STAGES; k++) fs[k] += bench_floor_s(&c[k], bw, rate, NULL);
        nps = 0;
      }
      if (!q) break;
      if (q->canvas < 0 || q->canvas >= B) continue;
      ps[nps++] = (bench_pass_seq){q->rows, q->head_rows, (int32_t)n[q->canvas] + q->block * C};
      last = q->canvas;
      if (q->block >= 0 && q->block <= n_canv) per[(size_t)q->canvas * (n_canv + 1) + q->block]++;
    }
    int32_t repairs = 0, commits = 0;
    for (int b = 0; b < B; b++) { /* prefills */
      bench_cost c[DG_PROFILE_STAGES];
      memset(c, 0, sizeof c);
      bench_stage_cost(m, (int32_t)n[b], 0, 1, c);
      for (int k = 0; k < DG_PROFILE_STAGES; k++) fc[k] += bench_floor_s(&c[k], bw, rate, NULL);
    }
    for (int32_t i = 0; i < tr.n_blocks; i++) { /* commits and repair forwards */
      const bench_block_rec *q = &tr.blocks[i];
      if (q->canvas < 0 || q->canvas >= B || q->block < 0 || q->block > n_canv) continue;
      const int32_t L = (int32_t)n[q->canvas] + q->block * C;
      bench_cost c[DG_PROFILE_STAGES];
      if (q->block > 0) {
        memset(c, 0, sizeof c);
        bench_stage_cost(m, C, L - C, 1, c);
        for (int k = 0; k < DG_PROFILE_STAGES; k++) fc[k] += bench_floor_s(&c[k], bw, rate, NULL);
        commits++;
      }
      for (int32_t k2 = per[(size_t)q->canvas * (n_canv + 1) + q->block]; k2 < q->n_steps; k2++) {
        memset(c, 0, sizeof c);
        bench_stage_cost(m, C, L, 0, c);
        for (int k = 0; k < DG_PROFILE_STAGES; k++) fc[k] += bench_floor_s(&c[k], bw, rate, NULL);
        repairs++;
      }
    }
    const int own = sk_passes == 0; /* B = 1: the compacted passes ran on the canvas's own context */
    if (own)
      for (int k = 0; k < DG_PROFILE_STAGES; k++) { fc[k] += fs[k]; fs[k] = 0; }
    /* rows per pass, canvases per pass */
    int32_t hist[BENCH_MAX_B + 1] = {0};
    for (int32_t i = 0; i < np && i < cap; i++) hist[canv[i] <= BENCH_MAX_B ? canv[i] : 0]++;
    qsort(rows, (size_t)(np < cap ? np : cap), sizeof *rows, cmp_i32);
    const int32_t rmin = np ? rows[0] : 0, rmax = np ? rows[np - 1] : 0;
    const double rmed = np ? (np % 2 ? rows[np / 2] : 0.5 * (rows[np / 2 - 1] + rows[np / 2])) : 0;
    char hs[1024] = ""; /* "k: passes" for k = B..1: at most 64 entries of at most 14 characters */
    for (int k = B, used = 0; k >= 1 && used < (int)sizeof hs; k--)
      if (hist[k]) used += snprintf(hs + used, sizeof hs - (size_t)used, "%s%d: %d", used ? ", " : "", k, hist[k]);
    const double pp = np > 0 ? np : 1, mean_e = rmed * K / (E ? E : 1);
    const double hit_e = E ? E * (1.0 - pow(1.0 - (double)K / E, rmed)) : 0;
    double ts = 0, tc = 0, fts = 0, ftc = 0;
    for (int k = 0; k < DG_PROFILE_STAGES; k++) {
      if (k != DG_PROFILE_STAGES - 1) { ts += sk[k]; tc += cv[k]; }
      fts += fs[k]; ftc += fc[k];
    }
    printf("\nbatch --profile B = %d: one more run (not in the rows above), %.1f ms wall, %d tokens, %lld stage marks; "
           "%d batched passes (canvases in the pass: %s), %s; rows per batched pass (forward-set positions summed over "
           "its canvases, bucket-padded) min / median / max %d / %.0f / %d; per canvas on its own context: %d prefills, "
           "%d commits, %d repair forwards (%d decoder forwards in all); rows per expert in the stacked MoE at the "
           "median pass (uniform routing, the cost model's, not measured): %.1f on average, %.1f of %d experts hit\n",
           B, sec * 1e3, toks, (long long)marks, np, hs,
           own ? "all on the canvas's own context (B = 1: no work context, no stacks)"
               : "each a stack on the batch's work context", rmin, rmed, rmax, B, commits, repairs, forwards, mean_e,
           hit_e, E);
    if (!own) {
      /* rows per expert of the hit (stack, layer, expert) triples: median, p90 from the histogram */
      int64_t hit = 0, acc = 0;
      for (int i = 1; i < DG_PROFILE_EXPERT_BINS; i++) hit += eh[i];
      int e50 = 0, e90 = 0;
      for (int i = 1; i < DG_PROFILE_EXPERT_BINS && hit > 0; i++) {
        acc += eh[i];
        if (!e50 && 2 * acc >= hit) e50 = i;
        if (!e90 && 10 * acc >= 9 * hit) { e90 = i; break; }
      }
      const int32_t L = m->cfg.n_layers;
      printf("backend's record of the stacks: %lld stacks, %lld canvases, %lld rows (%.1f rows per stack); rows per "
             "expert in the stacked MoE (measured: the routing's counts after every layer), over the (stack, layer, "
             "expert) triples with rows: median %d, p90 %d, max %lld%s; experts hit per layer %.1f of %d\n",
             (long long)sk_passes, (long long)sk_canv, (long long)sk_rows, sk_passes ? (double)sk_rows / sk_passes : 0,
             e50, e90, (long long)emax, emax >= DG_PROFILE_EXPERT_BINS - 1 ? " (or more)" : "",
             sk_passes && L ? (double)hit / ((double)sk_passes * L) : 0, E);
      if (out) { /* kept for the JSON line below */
        sk_e50 = e50;
        sk_e90 = e90;
        sk_hit = sk_passes && L ? (double)hit / ((double)sk_passes * L) : 0;
      }
    }
    printf("| stage | stacked ms per pass | %% | floor ms per pass | floor / ms | per-canvas ms per pass | %% | per-canvas "
           "floor ms per pass |\n|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < DG_PROFILE_STAGES; k++) {
      const int host = k == DG_PROFILE_STAGES - 1;
      char a[64], b2[64], c2[64], d2[64];
      if (fs[k] > 0) {
        snprintf(a, sizeof a, "%.3f", fs[k] * 1e3 / pp);
        snprintf(b2, sizeof b2, "%.1f%%", sk[k] > 0 ? 100.0 * fs[k] * 1e3 / sk[k] : 0);
      } else {
        snprintf(a, sizeof a, "-");
        snprintf(b2, sizeof b2, "-");
      }
      if (host) snprintf(c2, sizeof c2, "(%.3f)", cv[k] / pp);
      else snprintf(c2, sizeof c2, "%.3f", cv[k] / pp);
      if (fc[k] > 0) snprintf(d2, sizeof d2, "%.3f", fc[k] * 1e3 / pp);
      else snprintf(d2, sizeof d2, "-");
      char e2[32], s2[32];
      if (host) { snprintf(e2, sizeof e2, "-"); snprintf(s2, sizeof s2, "-"); }
      else {
        snprintf(e2, sizeof e2, "%.1f%%", tc > 0 ? 100.0 * cv[k] / tc : 0);
        snprintf(s2, sizeof s2, "%.1f%%", ts > 0 ? 100.0 * sk[k] / ts : 0);
      }
      printf("| %s | %s%.3f%s | %s | %s | %s | %s | %s | %s |\n", names[k] ? names[k] : "?", host ? "(" : "",
             sk[k] / pp, host ? ")" : "", s2, a, b2, c2, e2, d2);
    }
    /* the share column of the per-canvas part */
    printf("| all but host | %.3f | 100%% | %.3f | %.1f%% | %.3f | 100%% | %.3f |\n", ts / pp, fts * 1e3 / pp,
           ts > 0 ? 100.0 * fts * 1e3 / ts : 0, tc / pp, ftc * 1e3 / pp);
    printf("per batched pass (%d): stacked-pass GPU %.3f ms + per-canvas GPU %.3f ms + the rest %.3f ms (host work and "
           "the GPU idle: wall %.3f ms - both)\n",
           np, ts / pp, tc / pp, (sec * 1e3 - ts - tc) / pp, sec * 1e3 / pp);
    if (out) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "protocol", "batch_profile");
      cJSON_AddStringToObject(j, "model", o->model_dir);
      cJSON_AddNumberToObject(j, "B", B);
      cJSON_AddNumberToObject(j, "wall_ms", sec * 1e3);
      cJSON_AddNumberToObject(j, "generated_tokens", toks);
      cJSON_AddNumberToObject(j, "passes", np);
      cJSON_AddNumberToObject(j, "stacks", (double)sk_passes);
      cJSON_AddNumberToObject(j, "stack_rows", (double)sk_rows);
      cJSON_AddNumberToObject(j, "forwards", forwards);
      cJSON_AddNumberToObject(j, "repairs", repairs);
      cJSON_AddNumberToObject(j, "commits", commits);
      cJSON_AddNumberToObject(j, "rows_min", rmin);
      cJSON_AddNumberToObject(j, "rows_median", rmed);
      cJSON_AddNumberToObject(j, "rows_max", rmax);
      cJSON_AddNumberToObject(j, "expert_rows_median", sk_e50);
      cJSON_AddNumberToObject(j, "expert_rows_p90", sk_e90);
      cJSON_AddNumberToObject(j, "expert_rows_max", (double)emax);
      cJSON_AddNumberToObject(j, "experts_hit_per_layer", sk_hit);
      cJSON *h = cJSON_AddArrayToObject(j, "passes_by_canvases");
      for (int k = 1; k <= B; k++) cJSON_AddItemToArray(h, cJSON_CreateNumber(hist[k]));
      cJSON *a = cJSON_AddObjectToObject(j, "stacked_ms"), *b2 = cJSON_AddObjectToObject(j, "per_canvas_ms");
      cJSON *f1 = cJSON_AddObjectToObject(j, "stacked_floor_ms"), *f2 = cJSON_AddObjectToObject(j, "per_canvas_floor_ms");
      for (int k = 0; k < DG_PROFILE_STAGES; k++) {
        const char *nm = names[k] ? names[k] : "?";
        cJSON_AddNumberToObject(a, nm, sk[k]);
        cJSON_AddNumberToObject(b2, nm, cv[k]);
        cJSON_AddNumberToObject(f1, nm, fs[k] * 1e3);
        cJSON_AddNumberToObject(f2, nm, fc[k] * 1e3);
      }
      cJSON_AddNumberToObject(j, "gpu_read_gb_s", bw / 1e9);
      cJSON_AddNumberToObject(j, "gpu_bf16_tflop_s", rate / 1e12);
      json_line(out, j);
    }
    free(rows); free(canv); free(ps); free(per);
    bench_trace_free(&tr);
  }
  batch_set_close(&bs);
  return rc;
}

typedef struct row {
  const char *protocol, *prompt;
  int32_t P, G, C, blocks, forwards;
  double med, lo, hi, floor_s;
  double bytes, flops; /* over all passes of one run (the floor's cost model) */
  int memory_bound;
  double dev_used, dev_total; /* CUDA: device bytes in use after the runs, the context still held (0: CPU) */
} row;

double bench_gen_floor(const dg_model *m, int32_t P, const int32_t *steps, int32_t n_blocks, double bw, double rate,
                       int *memory_bound, double *bytes, double *flops) {
  const int32_t C = m->cfg.canvas_length;
  int mb;
  double mem_t = 0, all = 0, by = 0, fl = 0;
  bench_cost c = bench_encoder_cost(m, P, 0);
  double f = bench_floor_s(&c, bw, rate, &mb);
  all += f; mem_t += mb ? f : 0;
  by += c.weight_bytes + c.kv_bytes + c.other_bytes; fl += c.flops;
  for (int32_t b = 0; b < n_blocks; b++) {
    int32_t L = P + b * C;
    if (b > 0) {
      c = bench_encoder_cost(m, C, L - C);
      f = bench_floor_s(&c, bw, rate, &mb);
      all += f; mem_t += mb ? f : 0;
      by += c.weight_bytes + c.kv_bytes + c.other_bytes; fl += c.flops;
    }
    c = bench_decoder_cost(m, L);
    f = steps[b] * bench_floor_s(&c, bw, rate, &mb);
    all += f; mem_t += mb ? f : 0;
    by += steps[b] * (c.weight_bytes + c.kv_bytes + c.other_bytes); fl += steps[b] * c.flops;
  }
  if (memory_bound) *memory_bound = mem_t >= all / 2;
  if (bytes) *bytes = by;
  if (flops) *flops = fl;
  return all;
}

/* bench --profile: one more generation with the context's stage timing on; prints the stages (GPU ms per
 * pass and share of the profiled time). Passes = decoder forwards + encoder passes, as the rows' ms/forward. */
static int profile_run(dg_context *ctx, const int32_t *ids, size_t n, const dg_gen_params *gp0, const char *proto,
                       const dg_model *m, const run_trace *tr, double bw, double rate) {
  dg_status st = dg_context_profile(ctx, 1);
  dg_profile p;
  dg_gen_result res;
  memset(&res, 0, sizeof res);
  if (!st) {
    dg_gen_params gp = *gp0;
    dg_context_reset(ctx);
    st = dg_generate(ctx, ids, n, &gp, &res);
  }
  if (!st) st = dg_context_profile_read(ctx, &p);
  if (st) {
    fprintf(stderr, "dgemma bench: --profile: %s: %s\n", dg_status_str(st), dg_last_error());
    dg_context_profile(ctx, 0);
    return 1;
  }
  dg_context_profile(ctx, 0);
  const double passes = (double)res.n_steps + (double)res.n_blocks; /* decoder forwards + encoder passes */
  double tot = 0;
  for (int i = 0; i < DG_PROFILE_STAGES; i++) tot += p.ms[i];
  /* each stage's floor over the passes of the timed runs' trace (the prompt's prefill, then per block an
   * encoder pass of the previous block and its decoder forwards), as bench_gen_floor */
  double fl[DG_PROFILE_STAGES] = {0};
  {
    const int32_t C = m->cfg.canvas_length, P = (int32_t)n;
    for (int32_t b = -1; b < tr->n_blocks && b < 4096; b++) {
      bench_cost st[DG_PROFILE_STAGES];
      memset(st, 0, sizeof st);
      double mult = 1;
      if (b < 0) bench_stage_cost(m, P, 0, 1, st);
      else if (b > 0) bench_stage_cost(m, C, P + (b - 1) * C, 1, st);
      if (b >= 0) {
        bench_cost sd[DG_PROFILE_STAGES];
        memset(sd, 0, sizeof sd);
        bench_stage_cost(m, C, P + b * C, 0, sd);
        for (int i = 0; i < DG_PROFILE_STAGES; i++) fl[i] += tr->steps[b] * bench_floor_s(&sd[i], bw, rate, NULL);
      }
      for (int i = 0; i < DG_PROFILE_STAGES; i++) fl[i] += mult * bench_floor_s(&st[i], bw, rate, NULL);
    }
  }
  double ftot = 0;
  for (int i = 0; i < DG_PROFILE_STAGES; i++) ftot += fl[i];
  printf("\n%s --profile: one more run, %.0f passes (%d forwards + %d encoder passes), %.1f ms wall, %.1f ms "
         "profiled (%lld stage marks); floor per stage = max(bytes / %.0f GB/s, FLOPs / %.0f TFLOP/s) of the cost "
         "model over the same passes\n| stage | ms per pass | %% | floor ms per pass | floor / ms |\n|---|---|---|---|---|\n",
         proto, passes, res.n_steps, res.n_blocks, res.seconds * 1e3, tot, (long long)p.marks, bw / 1e9, rate / 1e12);
  for (int i = 0; i < DG_PROFILE_STAGES; i++) {
    if (fl[i] > 0)
      printf("| %s | %.3f | %.1f%% | %.3f | %.1f%% |\n", p.name[i], p.ms[i] / passes,
             100.0 * p.ms[i] / (tot > 0 ? tot : 1), fl[i] * 1e3 / passes, p.ms[i] > 0 ? 100.0 * fl[i] * 1e3 / p.ms[i] : 0);
    else
      printf("| %s | %.3f | %.1f%% | - | - |\n", p.name[i], p.ms[i] / passes, 100.0 * p.ms[i] / (tot > 0 ? tot : 1));
  }
  printf("| all | %.3f | 100%% | %.3f | %.1f%% |\n", tot / passes, ftot * 1e3 / passes, tot > 0 ? 100.0 * ftot * 1e3 / tot : 0);
  dg_gen_result_free(&res);
  return 0;
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
  r->dev_used = r->dev_total = 0;
  if (info.device == DG_DEVICE_CUDA) { /* what the runs left allocated: weights, CUDA context, this context */
    const dg_cuda_api *cu = NULL;
    size_t used = 0, total = 0;
    if (!dg_cuda_api_get(&cu) && !cu->mem_used(o->cuda_device, &used, &total)) {
      r->dev_used = (double)used;
      r->dev_total = (double)total;
    }
    /* the context's CUDA graphs (on unless DGEMMA_GRAPHS=0, src/cuda/graph.cu): what they did over the runs, and why they
     * stopped if they did */
    char ch[256];
    if (cu && ctx->dev && !cu->choices(ctx->dev, ch, sizeof ch)) /* the context's kernel choices (attention version) */
      fprintf(stderr, "%s %s: %s\n", r->protocol, r->prompt, ch);
    dg_cuda_graph_stats gs;
    if (cu && ctx->dev && !cu->graph_stats(ctx->dev, &gs) && gs.asked)
      fprintf(stderr, "%s %s: CUDA graphs %s: %lld captures (%lld instantiated, %lld updated in place), %lld replays, "
              "%lld plain passes, %lld evicted (cap %d)%s%s\n", r->protocol, r->prompt, gs.on ? "on" : "off",
              (long long)gs.captures, (long long)gs.instantiations, (long long)gs.updates, (long long)gs.replays,
              (long long)gs.plain, (long long)gs.evictions, gs.cap, gs.why[0] ? "; fell back to plain launches: " : "",
              gs.why);
  }
  if (o->profile && profile_run(ctx, ids, n, gp0, r->protocol, m, &tr, bw, rate)) {
    dg_context_free(ctx);
    return 1;
  }
  dg_context_free(ctx);
  r->P = (int32_t)n;
  r->C = C;
  r->lo = t[0]; r->hi = t[0];
  for (int i = 1; i < reps; i++) { r->lo = fmin(r->lo, t[i]); r->hi = fmax(r->hi, t[i]); }
  r->med = bench_median(t, reps);
  r->floor_s = bench_gen_floor(m, r->P, tr.steps, tr.n_blocks < 4096 ? tr.n_blocks : 4096, bw, rate, &r->memory_bound,
                               &r->bytes, &r->flops);
  return 0;
}

/* The timing fields every throughput row writes: tokens in and out, passes,
 * the repetitions and the median / min / max wall time in seconds. */
static void json_timing(cJSON *j, int P, int G, int blocks, int forwards, int warm, int reps, double med, double lo,
                        double hi) {
  cJSON_AddNumberToObject(j, "prompt_tokens", P);
  cJSON_AddNumberToObject(j, "generated_tokens", G);
  cJSON_AddNumberToObject(j, "blocks", blocks);
  cJSON_AddNumberToObject(j, "forwards", forwards);
  cJSON_AddNumberToObject(j, "warmup", warm);
  cJSON_AddNumberToObject(j, "reps", reps);
  cJSON_AddNumberToObject(j, "median_s", med);
  cJSON_AddNumberToObject(j, "min_s", lo);
  cJSON_AddNumberToObject(j, "max_s", hi);
  cJSON_AddNumberToObject(j, "tok_per_s", G / med);
}

/* The ceilings of a row's floor: the host's (copy, FMA, matmul) on the CPU,
 * the GPU's (bench_json_gpu) on CUDA. */
static void json_ceilings(cJSON *j, const char *device, const dg_cuda_ceilings *gc, double bw, double rate, double mm,
                          int nt) {
  cJSON_AddStringToObject(j, "device", device);
  if (gc) {
    bench_json_gpu(j, gc);
  } else {
    cJSON_AddNumberToObject(j, "copy_gb_s", bw / 1e9);
    cJSON_AddNumberToObject(j, "fma_gflop_s", rate / 1e9);
    cJSON_AddNumberToObject(j, "matmul_gflop_s", mm / 1e9);
  }
  cJSON_AddNumberToObject(j, "threads", nt);
}

void bench_json_gpu(cJSON *j, const dg_cuda_ceilings *g) {
  cJSON_AddStringToObject(j, "gpu", g->name);
  cJSON_AddNumberToObject(j, "gpu_read_gb_s", g->read_bps / 1e9);
  cJSON_AddNumberToObject(j, "gpu_read_median_gb_s", g->read_med_bps / 1e9);
  cJSON_AddNumberToObject(j, "gpu_read_bytes", (double)g->read_bytes);
  cJSON_AddNumberToObject(j, "gpu_copy_gb_s", g->copy_bps / 1e9);
  cJSON_AddNumberToObject(j, "gpu_copy_median_gb_s", g->copy_med_bps / 1e9);
  cJSON_AddNumberToObject(j, "gpu_copy_bytes", (double)g->copy_bytes);
  cJSON_AddNumberToObject(j, "gpu_bf16_tflop_s", g->bf16_flops / 1e12);
  cJSON_AddNumberToObject(j, "gpu_bf16_median_tflop_s", g->bf16_med_flops / 1e12);
  cJSON_AddNumberToObject(j, "gpu_gemm_n", g->gemm_n);
  cJSON_AddNumberToObject(j, "gpu_ceiling_reps", g->reps);
}

void bench_print_gpu(const dg_cuda_ceilings *g, const char *when) {
  printf("GPU ceilings (%s, %d SMs, %s; best / median of %d, cudaEvents): read %.1f / %.1f GB/s (streaming-read "
         "kernel over %.2f GiB, bytes read); copy %.1f / %.1f GB/s (cudaMemcpyAsync device-to-device of %.2f GiB, "
         "bytes read + written); bf16 %.1f / %.1f TFLOP/s (cuBLAS GEMM %d^3, fp32 accumulate)\n",
         g->name, g->sms, when, g->reps, g->read_bps / 1e9, g->read_med_bps / 1e9, g->read_bytes / 1073741824.0,
         g->copy_bps / 1e9, g->copy_med_bps / 1e9, g->copy_bytes / 1073741824.0, g->bf16_flops / 1e12,
         g->bf16_med_flops / 1e12, g->gemm_n);
}

static void json_line(FILE *out, cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  if (s) fprintf(out, "%s\n", s);
  free(s);
  cJSON_Delete(j);
  fflush(out);
}

/* ---- step protocol ------------------------------------------------------------------ */

double bench_kv_cache_bytes(const dg_model *m, int32_t cap, int cuda_ring, int32_t enc_chunk) {
  const dg_config *c = &m->cfg;
  const double S = (double)cap + c->canvas_length;
  /* the rings hold the window and max(canvas, the chunk up to 256) rows (src/cuda/common.cuh DG_RING_CHUNK: a
   * longer chunk's sliding layers attend in calls of that many rows, since session 29) */
  const int32_t cr = enc_chunk < 256 ? enc_chunk : 256, T0 = c->canvas_length > cr ? c->canvas_length : cr;
  const double ring = c->sliding_window >= 1 ? (double)(((int64_t)c->sliding_window - 1 + T0 + 63) / 64 * 64) : S;
  double b = 0;
  for (int i = 0; i < c->n_layers; i++) {
    const double Sl = c->is_full[i] || !cuda_ring ? S : fmin(ring, S);
    b += 2.0 * c->n_kv_heads[i] * Sl * c->head_dim[i] * 2.0; /* K and V, bf16 */
  }
  return b;
}

/* Host times of the step callbacks of one generation (the step protocol). */
typedef struct step_marks {
  double t[64];
  int n;
} step_marks;

static int step_mark(const dg_step_info *si, void *ud) {
  (void)si;
  step_marks *s = ud;
  if (s->n < 64) s->t[s->n] = now_s();
  s->n++;
  return 0;
}

/* Device memory in use (total - free of cudaMemGetInfo) on a CUDA model's GPU; 0 on the CPU or if unknown. */
static double dev_used_bytes(const dg_model_info *info, int cuda_device, double *total) {
  const dg_cuda_api *cu = NULL;
  size_t used = 0, tot = 0;
  if (info->device != DG_DEVICE_CUDA || dg_cuda_api_get(&cu) || cu->mem_used(cuda_device, &used, &tot)) return 0;
  if (total) *total = (double)tot;
  return (double)used;
}

/* One row of the step protocol (run_step): prompt P, runs, steps timed, prefill and step times (s), their floors,
 * the step over the first P's, the KV cache's bytes and device memory (bytes; 0 on the CPU). */
typedef struct step_row {
  int32_t P;
  int warm, reps, ns;
  double pmed, plo, phi, pf, smed, slo, shi, sf, ratio, kv, used, before, tot;
} step_row;

static void step_json(FILE *out, const step_row *r, const bench_opts *o, int32_t C, const char *device,
                      const dg_cuda_ceilings *gc, double bw, double rate, double mm, int nt) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "protocol", "step");
  cJSON_AddStringToObject(j, "model", o->model_dir);
  cJSON_AddNumberToObject(j, "canvas", C);
  cJSON_AddNumberToObject(j, "prompt_tokens", r->P);
  cJSON_AddNumberToObject(j, "warmup", r->warm);
  cJSON_AddNumberToObject(j, "reps", r->reps);
  cJSON_AddNumberToObject(j, "prefill_median_s", r->pmed);
  cJSON_AddNumberToObject(j, "prefill_min_s", r->plo);
  cJSON_AddNumberToObject(j, "prefill_max_s", r->phi);
  cJSON_AddNumberToObject(j, "prefill_floor_s", r->pf);
  cJSON_AddNumberToObject(j, "steps_timed", r->ns);
  cJSON_AddNumberToObject(j, "step_median_s", r->smed);
  cJSON_AddNumberToObject(j, "step_min_s", r->slo);
  cJSON_AddNumberToObject(j, "step_max_s", r->shi);
  cJSON_AddNumberToObject(j, "step_floor_s", r->sf);
  cJSON_AddNumberToObject(j, "step_over_first", r->ratio);
  if (r->used > 0) {
    cJSON_AddNumberToObject(j, "kv_cache_bytes", r->kv);
    cJSON_AddNumberToObject(j, "device_used_bytes", r->used);
    cJSON_AddNumberToObject(j, "device_used_before_context_bytes", r->before);
    cJSON_AddNumberToObject(j, "device_total_bytes", r->tot);
  }
  json_ceilings(j, device, gc, bw, rate, mm, nt);
  json_line(out, j);
}

/* bench --protocol step --profile (session 28, helper pp12): one more prefill of the first P's prompt on ctx (reset
 * first) with the context's stage timing on, split into the stages of dg_context_profile, beside each stage's floor
 * as the encoder runs it (bench_encoder_chunks_cost: chunks of enc_chunk tokens, the weights read per chunk) and
 * as one pass of P rows would (bench_stage_cost(m, P, 0, 1): the prefill floor of the table). wall = the host's
 * time of the dg_encode call (it synchronises before it returns), as the rows' prefill; the stages sum to the GPU
 * time from the encoder's first mark (after the entry's cudaSetDevice) to the last chunk's last K/V, so they
 * cannot exceed it. Also printed: the chunks, the rows per expert a chunk gives on average (T top_k / E) and the
 * expected fraction of experts it hits. Returns 0, or 1 after saying why on stderr. */
static int step_profile(dg_context *ctx, const dg_model *m, const int32_t *ids, int32_t P, int32_t enc_chunk,
                        double bw, double rate, FILE *out) {
  dg_context_reset(ctx);
  dg_profile p;
  double t0 = 0, t1 = 0;
  dg_status st = dg_context_profile(ctx, 1);
  if (!st) {
    t0 = now_s();
    st = dg_encode(ctx, ids, (size_t)P);
    t1 = now_s();
  }
  if (!st) st = dg_context_profile_read(ctx, &p);
  dg_context_profile(ctx, 0);
  if (st) {
    fprintf(stderr, "dgemma bench: step --profile: %s: %s\n", dg_status_str(st), dg_last_error());
    return 1;
  }
  const dg_config *cf = &m->cfg;
  bench_cost ch[DG_PROFILE_STAGES], one[DG_PROFILE_STAGES];
  memset(ch, 0, sizeof ch);
  memset(one, 0, sizeof one);
  const int32_t nch = bench_encoder_chunks_cost(m, P, enc_chunk, ch);
  bench_stage_cost(m, P, 0, 1, one);
  const int32_t T0 = P < enc_chunk ? P : enc_chunk;
  const double E = cf->n_experts > 0 ? cf->n_experts : 1, rpe = (double)T0 * cf->top_k_experts / E,
               hit = cf->n_experts > 0 ? 1.0 - pow(1.0 - (double)cf->top_k_experts / E, (double)T0) : 0;
  double tot = 0, fch = 0, fone = 0;
  for (int i = 0; i < DG_PROFILE_STAGES; i++) {
    tot += p.ms[i];
    fch += bench_floor_s(&ch[i], bw, rate, NULL);
    fone += bench_floor_s(&one[i], bw, rate, NULL);
  }
  const double wall = (t1 - t0) * 1e3;
  printf("\nstep --profile: one more prefill of P = %d tokens (not in the rows above) in %d chunk%s of %d tokens "
         "(DGEMMA_ENC_CHUNK; the last %d); a chunk of %d rows gives %.1f rows per expert on average "
         "(%d tokens x top-%d "
         "/ %d experts) and hits %.1f%% of the experts; %.3f ms wall (dg_encode, host), %.3f ms profiled (%lld stage "
         "marks, %.1f%% of the wall); floors = max(bytes / %.0f GB/s, FLOPs / %.0f TFLOP/s) of the cost model per "
         "stage, "
         "as run (each chunk an encoder pass after the ones before: the weights read per chunk) and as one pass of P rows "
         "(the prefill floor above)\n",
         P, nch, nch == 1 ? "" : "s", enc_chunk, P - (nch - 1) * enc_chunk, T0, rpe, T0, cf->top_k_experts,
         cf->n_experts, 100 * hit, wall, tot, (long long)p.marks, wall > 0 ? 100 * tot / wall : 0, bw / 1e9, rate / 1e12);
  printf("| stage | ms | %% | floor ms (chunks as run) | floor / ms | floor ms (one pass of P) |\n|---|---|---|---|---|---|\n");
  for (int i = 0; i < DG_PROFILE_STAGES; i++) {
    const double a = bench_floor_s(&ch[i], bw, rate, NULL) * 1e3, b = bench_floor_s(&one[i], bw, rate, NULL) * 1e3;
    if (a > 0)
      printf("| %s | %.3f | %.1f%% | %.3f | %.1f%% | %.3f |\n", p.name[i], p.ms[i], 100 * p.ms[i] / (tot > 0 ? tot : 1), a,
             p.ms[i] > 0 ? 100 * a / p.ms[i] : 0, b);
    else
      printf("| %s | %.3f | %.1f%% | - | - | - |\n", p.name[i], p.ms[i], 100 * p.ms[i] / (tot > 0 ? tot : 1));
  }
  printf("| all | %.3f | 100%% | %.3f | %.1f%% | %.3f |\n", tot, fch * 1e3, tot > 0 ? 100 * fch * 1e3 / tot : 0,
         fone * 1e3);
  fflush(stdout);
  if (out) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "protocol", "step_profile");
    cJSON_AddNumberToObject(j, "prompt_tokens", P);
    cJSON_AddNumberToObject(j, "enc_chunk", enc_chunk);
    cJSON_AddNumberToObject(j, "chunks", nch);
    cJSON_AddNumberToObject(j, "rows_per_expert", rpe);
    cJSON_AddNumberToObject(j, "wall_ms", wall);
    cJSON_AddNumberToObject(j, "profiled_ms", tot);
    cJSON_AddNumberToObject(j, "floor_chunks_ms", fch * 1e3);
    cJSON_AddNumberToObject(j, "floor_one_pass_ms", fone * 1e3);
    cJSON *sj = cJSON_AddObjectToObject(j, "stage_ms");
    for (int i = 0; i < DG_PROFILE_STAGES; i++) cJSON_AddNumberToObject(sj, p.name[i], p.ms[i]);
    json_line(out, j);
  }
  return 0;
}

/* The step protocol (issue 12's prefill and step-after-P lines): for each prompt length P of --contexts, a context
 * of P + C positions; each run (warm-up runs first, untimed): reset, dg_encode of the P-token vllm prompt timed on
 * the host (the prefill; the CUDA encoder synchronises before it returns), dg_context_truncate to P - 1 and
 * dg_generate of one canvas from the last prompt token with vLLM's settings (16 fixed steps), the host time of each
 * step callback recorded: the decoder step = the interval between consecutive callbacks (each holds the previous
 * step's self-conditioning, the decoder pass, the sampler statistics and the host's sampler), 15 per run. Prints
 * per P the medians and min-max of both, their floors (cost model, the command's ceilings), the step against the
 * first P's, and on CUDA the device memory in use with the context held (total - free: the CUDA context, the
 * weights and every buffer; before the context too) beside the KV cache's bytes (bench_kv_cache_bytes). */
static int run_step(dg_model *m, const bench_opts *o, double bw, double rate, const char *device,
                    const dg_cuda_ceilings *gc, double mm, FILE *out) {
  char err[256];
  int Ps[BENCH_MAX_LIST];
  const int nP = bench_parse_list(o->contexts ? o->contexts : "1024", "--contexts", 1, 1 << 20, Ps, BENCH_MAX_LIST,
                                  err, sizeof err);
  if (nP < 0) { fprintf(stderr, "dgemma bench: %s\n", err); return 2; }
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int32_t C = info.canvas_length;
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  const int cuda = info.device == DG_DEVICE_CUDA;
  /* the CUDA context's encoder chunk, which sizes the sliding layers' rings (and the prefill's passes); on CUDA
   * dg_cli_bench has refused a bad DGEMMA_ENC_CHUNK before the ceilings (the CPU backend does not read it) */
  int32_t enc_chunk = 0;
  (void)dg_cuda_enc_chunk(&enc_chunk);
  printf("step protocol: per prompt P (the vllm prompt's tokens) a context of P + %d positions; each run: the prefill "
         "(dg_encode of P tokens, host-timed) and one canvas of 16 fixed steps from the last prompt token (the cache "
         "truncated to P - 1), the decoder step = the interval between consecutive step callbacks (self-conditioning, "
         "decoder pass, sampler statistics and the host's sampler; 15 per run); %d runs after %d warm-up\n\n",
         C, reps, warm);
  printf("| P | prefill median ms | prefill spread ms | prefill tok/s | prefill floor ms | step median ms | step spread "
         "ms | steps timed | step floor ms | step floor/median | step / first P's | device GiB (context held) | "
         "before the context GiB | KV cache GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  fflush(stdout);
  double step0 = 0;
  for (int i = 0; i < nP; i++) {
    const int32_t P = Ps[i];
    int32_t *ids = filler_prompt(m, P);
    if (!ids) return 1;
    double tot = 0;
    const double before = dev_used_bytes(&info, o->cuda_device, &tot);
    dg_context_params cp = dg_context_default_params();
    cp.max_context = P + C;
    dg_context *ctx = NULL;
    dg_status st = dg_context_new(m, &cp, &ctx);
    if (st) {
      fprintf(stderr, "dgemma bench: step P = %d: context: %s: %s\n", P, dg_status_str(st), dg_last_error());
      free(ids);
      return 1;
    }
    double *pre = malloc((size_t)reps * sizeof *pre), *stp = malloc((size_t)reps * 15 * sizeof *stp);
    int ns = 0;
    for (int r = 0; !st && pre && stp && r < warm + reps; r++) {
      dg_context_reset(ctx);
      const double t0 = now_s();
      st = dg_encode(ctx, ids, (size_t)P);
      const double t1 = now_s();
      if (!st) st = dg_context_truncate(ctx, P - 1);
      step_marks sm;
      sm.n = 0;
      dg_gen_params gp = vllm_params(m, C, o->seed);
      gp.on_step = step_mark;
      gp.user_data = &sm;
      dg_gen_result res;
      memset(&res, 0, sizeof res);
      if (!st) st = dg_generate(ctx, ids + P - 1, 1, &gp, &res);
      if (!st) dg_gen_result_free(&res);
      if (!st && sm.n != 16) {
        fprintf(stderr, "dgemma bench: step P = %d: %d step callbacks, not 16\n", P, sm.n);
        st = DG_ERR_BACKEND;
      }
      if (!st && r >= warm) {
        pre[r - warm] = t1 - t0;
        for (int k = 1; k < 16; k++) stp[ns++] = sm.t[k] - sm.t[k - 1];
      }
      if (o->tty) fprintf(stderr, "\rstep P = %d: run %d/%d%s", P, r + 1, warm + reps, r < warm ? " (warm-up)" : "          ");
    }
    if (o->tty) fprintf(stderr, "\r%60s\r", "");
    if (!pre || !stp) st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for %d runs' times", reps);
    if (st) {
      fprintf(stderr, "dgemma bench: step P = %d: %s: %s\n", P, dg_status_str(st), dg_last_error());
      free(pre); free(stp); free(ids);
      dg_context_free(ctx);
      return 1;
    }
    const double used = dev_used_bytes(&info, o->cuda_device, NULL);
    /* --profile: the first P's prefill split into stages, printed after its row (below) */
    const int prof = o->profile && i == 0;
    if (!prof) {
      dg_context_free(ctx);
      free(ids);
      ctx = NULL;
      ids = NULL;
    }
    double plo = pre[0], phi = pre[0], slo = stp[0], shi = stp[0];
    for (int k = 1; k < reps; k++) { plo = fmin(plo, pre[k]); phi = fmax(phi, pre[k]); }
    for (int k = 1; k < ns; k++) { slo = fmin(slo, stp[k]); shi = fmax(shi, stp[k]); }
    const double pmed = bench_median(pre, reps), smed = bench_median(stp, ns);
    free(pre); free(stp);
    if (i == 0) step0 = smed;
    bench_cost ec = bench_encoder_cost(m, P, 0), dc = bench_decoder_cost(m, P);
    const double pf = bench_floor_s(&ec, bw, rate, NULL), sf = bench_floor_s(&dc, bw, rate, NULL);
    const double kv = cuda ? bench_kv_cache_bytes(m, P + C, 1, enc_chunk) : 0;
    char mem[128] = "- | - | -";
    if (used > 0)
      snprintf(mem, sizeof mem, "%.2f | %.2f | %.3f", used / 1073741824.0, before / 1073741824.0, kv / 1073741824.0);
    printf("| %d | %.3f | %.3f–%.3f | %.0f | %.3f | %.3f | %.3f–%.3f | %d | %.3f | %.1f%% | %.3f | %s |\n", P, pmed * 1e3,
           plo * 1e3, phi * 1e3, P / pmed, pf * 1e3, smed * 1e3, slo * 1e3, shi * 1e3, ns, sf * 1e3, 100 * sf / smed,
           smed / step0, mem);
    fflush(stdout);
    if (out) {
      const step_row sr = {P, warm, reps, ns, pmed, plo, phi, pf, smed, slo, shi, sf, smed / step0, kv, used, before, tot};
      step_json(out, &sr, o, C, device, gc, bw, rate, mm, m->n_threads);
    }
    if (prof) {
      const int rp = step_profile(ctx, m, ids, P, enc_chunk, bw, rate, out);
      dg_context_free(ctx);
      free(ids);
      if (rp) return 1;
      if (i + 1 < nP)
        printf("\n| P | prefill median ms | prefill spread ms | prefill tok/s | prefill floor ms | step median ms | "
               "step spread ms | steps timed | step floor ms | step floor/median | step / first P's | device GiB "
               "(context held) | before the context GiB | KV cache GiB |\n|---|---|---|---|---|---|---|---|---|---|---|"
               "---|---|---|\n");
    }
  }
  printf("\nprefill floor = max(bytes / %s) of one encoder pass of P tokens; step floor = the same of one decoder pass "
         "after P cached positions (the cost model); device GiB: total - free of cudaMemGetInfo after the runs with the "
         "context held, and before it was made (CUDA context, weights, cuBLAS); KV cache: its bytes by the backend's "
         "layout (%s)\n", gc ? "GPU read, FLOPs / GPU bf16 rate" : "copy, FLOPs / FMA rate",
         cuda ? "sliding layers in rings" : "the CPU's: not shown");
  return 0;
}

int dg_cli_bench(dg_model *m, const bench_opts *o) {
  char err[256];
  if (bench_check_opts(o, err, sizeof err)) { fprintf(stderr, "dgemma bench: %s\n", err); return 2; }
  const char *proto = o->protocol ? o->protocol : "all";
  const int all = !strcmp(proto, "all");
  const int do_vllm = all || !strcmp(proto, "vllm"), do_512 = all || !strcmp(proto, "p512");
  const int do_batch = all || !strcmp(proto, "batch"), do_ceil = !strcmp(proto, "ceiling"),
            do_step = !strcmp(proto, "step");
  if (m && !do_ceil && bench_check_model(m, o, err, sizeof err)) { /* before the ceilings are measured */
    fprintf(stderr, "dgemma bench: %s; see `dgemma bench --help`\n", err);
    return 2;
  }
  { /* a switch value that every context would refuse (DGEMMA_ENC_CHUNK on CUDA, ...): said before the ceilings too;
     * without a model the host's (DGEMMA_THP: the ceilings' weight stacks) */
    dg_model_info mi;
    const dg_device dev = m && dg_model_get_info(m, &mi) == DG_OK ? mi.device : DG_DEVICE_CPU;
    if (dg_switches_check(dev) != DG_OK) {
      fprintf(stderr, "dgemma bench: %s\n", dg_last_error());
      return 2;
    }
  }
  int Bs[BENCH_MAX_LIST], nB = bench_parse_list(o->canvases ? o->canvases : "1,2,4,8", "--canvases", 1, BENCH_MAX_B,
                                                Bs, BENCH_MAX_LIST, err, sizeof err);
  if (!m && !do_ceil) { fprintf(stderr, "dgemma bench: protocol %s needs a model\n", proto); return 1; }
  dg_gen_params bgp;
  if (do_batch) { /* bad --gen-kwargs are reported before anything is measured */
    dg_status st = bench_batch_params(m, o->gen_kwargs, o->gen_tokens, o->seed, &bgp);
    if (st) { fprintf(stderr, "dgemma bench: --gen-kwargs: %s: %s\n", dg_status_str(st), dg_last_error()); return 2; }
  }
  /* -o: rows go to a temporary file renamed to o->out only when the command
   * succeeds (tools/outfile.h), so an error or an interruption (no stop point
   * in a benchmark: the handler removes the file and exits 130/143) leaves the
   * previous file as it was. */
  FILE *out = NULL;
  if (o->out) {
    catch_stop_signals(1); /* first: no moment with the temporary file made and the default action */
    if (!(out = out_try_open(o->out, "dgemma bench"))) return 1;
  }
  if (do_ceil) {
    int nt = o->n_threads > 0 ? o->n_threads : m ? m->n_threads : omp_get_max_threads();
    int rc = bench_ceiling(o, nt, out);
    if (rc) out_discard(out);
    else if (out) rc = out_commit(out, o->out);
    return rc;
  }
  dg_model_info info;
  dg_model_get_info(m, &info);
  const char *device = info.device == DG_DEVICE_CUDA ? "cuda" : "cpu";
  const int32_t C = info.canvas_length;
  const int nt = m->n_threads;
  /* ceilings, measured now: the GPU's for a model on CUDA, else the host's */
  const char *isa = "", *kname = "";
  double bw = 0, rate = 0, mm = 0;
  dg_cuda_ceilings gceil, *gc = NULL;
  if (info.device == DG_DEVICE_CUDA) {
    const dg_cuda_api *cu = NULL;
    dg_status st = dg_cuda_api_get(&cu);
    if (!st) st = cu->ceilings_measure(o->cuda_device, 0, 0, 0, 0, &gceil);
    if (st) {
      fprintf(stderr, "dgemma bench: GPU ceilings: %s: %s\n", dg_status_str(st), dg_last_error());
      out_discard(out);
      return 1;
    }
    gc = &gceil;
    bench_gpu_rates(gc, NULL, &bw, &rate);
    bench_print_gpu(gc, "measured at the start of the command; every row's floor = max(bytes / read, FLOPs / bf16)");
  } else {
    bw = bench_copy_bandwidth((size_t)256 << 20, nt, 5);
    rate = bench_fma_rate(nt, 5, &isa);
    mm = bench_matmul_rate(nt, &kname);
  }
  if (!(bw > 0) || !(rate > 0)) { fprintf(stderr, "dgemma bench: could not measure the ceilings\n"); out_discard(out); return 1; }
  if (!gc)
    printf("ceilings (%d threads, measured at the start of the command; batch rows measure their own): copy %.1f GB/s (bytes read + written, memcpy 256 MiB, best of 5); "
           "%s %.1f GFLOP/s (best of 5); this build's %s matmul 64x2048x2048 f32: %.1f GFLOP/s\n",
           nt, bw / 1e9, isa, rate / 1e9, kname, mm / 1e9);
  bench_cost dc = bench_decoder_cost(m, 0);
  printf("one decoder step (canvas %d, empty context): %.1f MB (weights %.1f, logits %.1f), %.3f GFLOP -> floor %.2f ms\n\n",
         C, (dc.weight_bytes + dc.kv_bytes + dc.other_bytes) / 1e6, dc.weight_bytes / 1e6, dc.other_bytes / 1e6,
         dc.flops / 1e9, 1e3 * bench_floor_s(&dc, bw, rate, NULL));
  if (do_step) {
    const int rs = run_step(m, o, bw, rate, device, gc, mm, out);
    if (rs) { out_discard(out); return rs; }
    return out && out_commit(out, o->out) ? 1 : 0;
  }
  row rows[8];
  int nr = 0, rc = 0;
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  if (do_vllm) {
    int32_t P = o->prompt_tokens > 0 ? o->prompt_tokens : 4 * C, G = o->gen_tokens > 0 ? o->gen_tokens : 4 * C;
    if (C != 256 && o->prompt_tokens <= 0)
      printf("vllm protocol: this model's canvas is %d, not 256: prompt %d and %d generated tokens keep vLLM's 4 "
             "canvases in, 4 out (1024/1024 at canvas 256)\n", C, P, G);
    int32_t *ids = filler_prompt(m, P);
    if (!ids) { out_discard(out); return 1; }
    dg_gen_params gp = vllm_params(m, G, o->seed);
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
      out_discard(out);
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
  if (rc) { out_discard(out); return 1; }
  if (nr) printf("| protocol | prompt | in | out | blocks | forwards | median s | spread s | tok/s | ms/forward | floor s | "
         "floor/median | bound | GB/pass | GFLOP/pass | GB/s | TFLOP/s |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nr; i++) {
    row *r = &rows[i];
    const int passes = r->forwards + r->blocks;
    printf("| %s | %s | %d | %d | %d | %d | %.3f | %.3f–%.3f | %.1f | %.1f | %.3f | %.1f%% | %s | %.3f | %.1f | %.1f | %.3f |\n",
           r->protocol, r->prompt, r->P, r->G, r->blocks, r->forwards, r->med, r->lo, r->hi, r->G / r->med,
           1e3 * r->med / passes, r->floor_s, 100 * r->floor_s / r->med, r->memory_bound ? "memory" : "compute",
           r->bytes / passes / 1e9, r->flops / passes / 1e9, r->bytes / r->med / 1e9, r->flops / r->med / 1e12);
    if (out) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "protocol", r->protocol);
      cJSON_AddStringToObject(j, "prompt", r->prompt);
      cJSON_AddStringToObject(j, "model", o->model_dir);
      cJSON_AddNumberToObject(j, "canvas", r->C);
      json_timing(j, r->P, r->G, r->blocks, r->forwards, warm, reps, r->med, r->lo, r->hi);
      cJSON_AddNumberToObject(j, "floor_s", r->floor_s);
      cJSON_AddNumberToObject(j, "floor_fraction", r->floor_s / r->med);
      cJSON_AddStringToObject(j, "bound", r->memory_bound ? "memory" : "compute");
      cJSON_AddNumberToObject(j, "bytes", r->bytes);
      cJSON_AddNumberToObject(j, "flops", r->flops);
      cJSON_AddNumberToObject(j, "bytes_per_pass", r->bytes / passes);
      cJSON_AddNumberToObject(j, "flops_per_pass", r->flops / passes);
      cJSON_AddNumberToObject(j, "gb_s", r->bytes / r->med / 1e9);
      cJSON_AddNumberToObject(j, "tflop_s", r->flops / r->med / 1e12);
      if (r->dev_total > 0) {
        cJSON_AddNumberToObject(j, "device_used_bytes", r->dev_used);
        cJSON_AddNumberToObject(j, "device_total_bytes", r->dev_total);
      }
      json_ceilings(j, device, gc, bw, rate, mm, nt);
      json_line(out, j);
    }
  }
  for (int i = 0; i < nr; i++)
    if (rows[i].dev_total > 0)
      printf("%sdevice memory in use after the %s %s runs (prompt %d; their context still held; total - free of "
             "cudaMemGetInfo: the CUDA context, the weights of %.2f GiB and every buffer): %.2f GiB of %.2f GiB\n",
             i == 0 ? "\n" : "", rows[i].protocol, rows[i].prompt, rows[i].P, info.device_bytes / 1073741824.0,
             rows[i].dev_used / 1073741824.0, rows[i].dev_total / 1073741824.0);
  if (nr)
    printf("\nmedian of %d runs after %d warm-up; wall time from the request's start (prefill included) to its last "
           "token; ms/forward = median / (decoder forwards + encoder passes); floor = sum over passes of max(bytes / "
           "%s); GB/pass and GFLOP/pass = the cost model's bytes and FLOPs over all passes / passes; GB/s and TFLOP/s "
           "= those totals / median.\n", reps, warm, gc ? "GPU read, FLOPs / GPU bf16 rate" : "copy, FLOPs / FMA rate");
  if (do_batch) {
    batch_row br[BENCH_MAX_LIST];
    printf("%sbatch protocol: B canvases of different prompts (canvas b: chat prompt b %% 8, seed %llu + b) through "
           "dg_generate_batch, %d tokens each (stop ids and repeat guard off), turbo engine: %s%s%s\n\n",
           nr ? "\n" : "", (unsigned long long)o->seed, bgp.max_new_tokens, kBatchDefaults,
           o->gen_kwargs ? " then " : "", o->gen_kwargs ? o->gen_kwargs : "");
    fflush(stdout);
    if (run_batch(m, o, &bgp, Bs, nB, gc, br)) { out_discard(out); return 1; }
    printf("| B | in | out | passes | forwards | median s | spread s | tok/s | per-canvas tok/s | floor s | floor ms/token "
           "| bytes term ms/token | floor/median | bound | %s | same tokens as smaller B |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
           gc ? "GPU read GB/s, bf16 GFLOP/s" : "copy GB/s, FMA GFLOP/s");
    for (int i = 0; i < nB; i++) {
      batch_row *r = &br[i];
      char same[32] = "–";
      if (r->checked) snprintf(same, sizeof same, "%d/%d", r->equal, r->checked);
      printf("| %d | %d | %d | %d | %d | %.3f | %.3f–%.3f | %.1f | %.1f | %.3f | %.3f | %.3f | %.1f%% | %s | %.1f, %.1f | %s |\n",
             r->B, r->P, r->G, r->passes, r->forwards, r->med, r->lo, r->hi, r->G / r->med, r->G / r->med / r->B,
             r->floor_s, 1e3 * r->floor_s / r->G, 1e3 * r->bytes_s / r->G, 100 * r->floor_s / r->med,
             r->memory_bound ? "memory" : "compute", r->bw / 1e9, r->rate / 1e9, same);
      if (out) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "protocol", "batch");
        cJSON_AddStringToObject(j, "model", o->model_dir);
        cJSON_AddNumberToObject(j, "canvas", C);
        cJSON_AddNumberToObject(j, "B", r->B);
        cJSON_AddStringToObject(j, "gen_kwargs", o->gen_kwargs ? o->gen_kwargs : "");
        json_timing(j, r->P, r->G, r->blocks, r->forwards, warm, reps, r->med, r->lo, r->hi);
        cJSON_AddNumberToObject(j, "passes", r->passes);
        cJSON_AddNumberToObject(j, "per_canvas_tok_per_s", r->G / r->med / r->B);
        cJSON_AddNumberToObject(j, "floor_s", r->floor_s);
        cJSON_AddNumberToObject(j, "floor_tok_per_s", r->floor_s > 0 ? r->G / r->floor_s : 0);
        cJSON_AddNumberToObject(j, "floor_bytes_s", r->bytes_s);
        cJSON_AddNumberToObject(j, "floor_flops_s", r->flops_s);
        cJSON_AddStringToObject(j, "bound", r->memory_bound ? "memory" : "compute");
        cJSON_AddNumberToObject(j, "same_tokens_checked", r->checked);
        cJSON_AddNumberToObject(j, "same_tokens_equal", r->equal);
        cJSON_AddNumberToObject(j, "rows_per_pass_min", r->rows_min);
        cJSON_AddNumberToObject(j, "rows_per_pass_median", r->rows_med);
        cJSON_AddNumberToObject(j, "rows_per_pass_max", r->rows_max);
        json_ceilings(j, device, gc, r->bw, r->rate, mm, nt);
        json_line(out, j);
      }
    }
    printf("\nmedian of %d runs after %d warm-up, wall time of dg_generate_batch (prefills included); tok/s = all "
           "canvases' tokens / median, per-canvas = tok/s / B; passes = batched decoder passes (the repair forwards "
           "and commits run per canvas); floor = sum over passes of max(bytes / copy, FLOPs / FMA rate) with the "
           "weights read once per pass and the ceilings measured just before and after the row (the best of both; the "
           "load of a shared machine moves over minutes) (bytes term: the bytes / copy part alone); same tokens: canvases whose tokens equal those of the first (smaller-B) row "
           "that generated them.%s\n", reps, warm,
           gc ? " On CUDA: copy = the GPU's read bandwidth, FMA rate = its bf16 GEMM rate, both of the command's start." : "");
    printf("rows per batched pass of each row's last run (the canvases' forward sets summed, bucket-padded; %s), min / "
           "median / max:", bgp.turbo.compact ? "turbo_compact: live + just-committed positions"
                                              : "turbo_compact off: every canvas forwards all its positions");
    for (int i = 0; i < nB; i++)
      printf("%s B = %d: %d / %.0f / %d", i ? ";" : "", br[i].B, br[i].rows_min, br[i].rows_med, br[i].rows_max);
    printf("\n");
    if (o->profile) {
      printf("\nbatch --profile: per B one more dg_generate_batch with every canvas's stage timing on (cudaEvents; the "
             "concurrent branches off, so layers run their dense MLP and MoE one after the other). Stacked: the stacked "
             "passes on the batch's work context, GPU ms per batched pass; its host row (in parentheses) is the time "
             "between stacked passes (the canvases' own device work and the host's). Per canvas: the B contexts' own "
             "streams summed (prefill, commits, repair forwards, top-K, self-conditioning rows; B = 1 also its "
             "compacted passes), per batched pass; their host row counts the other streams' time too (not summed). "
             "Floor per stage = max(bytes / %.1f GB/s, FLOPs / %.1f TFLOP/s) of the cost model at each pass's "
             "recorded rows (weights once per stacked pass).\n", bw / 1e9, rate / 1e12);
      if (profile_batch(m, o, &bgp, Bs, nB, bw, rate, out)) { out_discard(out); return 1; }
    }
  }
  if (out && out_commit(out, o->out)) return 1;
  return 0;
}
