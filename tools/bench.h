/* bench.h: `dgemma bench` (tools/bench.c): throughput protocols measured
 * against this machine's ceilings (copy bandwidth, FMA rate) measured in the
 * same command. The cost model and the statistics helpers are exposed for
 * tests. */
#ifndef DG_CLI_BENCH_H
#define DG_CLI_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dgemma.h"

typedef struct bench_opts {
  const char *model_dir;  /* for the output rows */
  const char *protocol;   /* "vllm", "p512", "batch", "step", "ceiling" or "all" (vllm + p512 + batch; NULL = all) */
  int reps;               /* timed runs per row (<= 0: 3) */
  int warmup;             /* untimed runs before them (< 0: 1) */
  int prompt_tokens;      /* vllm: prompt length (<= 0: 4 canvases, = 1024 at canvas 256); refused by the others */
  const char *contexts;   /* step protocol: prompt lengths P, comma-separated ("1024" when NULL), each in [1, 2^20];
                           * refused by the others */
  int gen_tokens;         /* generated tokens (<= 0: vllm 4 canvases, p512 512) */
  const char *out;        /* JSON lines, or NULL */
  uint64_t seed;
  int tty;
  /* batch protocol */
  const char *canvases;   /* B values, comma-separated ("1,2,4,8" when NULL), each in [1, BENCH_MAX_B] */
  const char *gen_kwargs; /* JSON applied over the recommended turbo setting (NULL: none) */
  /* ceiling protocol (needs no model) */
  const char *rows;       /* M values, activation rows per weight (NULL: 1,2,4,...,256; --quick 1,16,256) */
  const char *formats;    /* weight formats: bf16 and bit widths 2, 3, 4, 6, 8 (NULL: "bf16,8,4,3,2"; --quick "bf16,4") */
  const char *moe_tokens; /* canvas tokens of the gathered-MoE rows (NULL: "256"; "0": none) */
  int quick;              /* shorter ceiling sweep (M 1, 16, 256; bf16 and 4-bit) */
  int n_threads;          /* ceiling without a model: threads (<= 0: all cores) */
  /* where the rows run: DG_DEVICE_CPU, or DG_DEVICE_CUDA (the model's device for the generation
   * protocols; the ceiling protocol's kernels and ceilings, on GPU cuda_device) */
  int device;
  int cuda_device;
  int profile;            /* vllm, p512, batch (not step, ceiling) on CUDA: one more run (batch: of each B) with stage timing
                           * (dg_context_profile), printed */
} bench_opts;

#define BENCH_MAX_B 64   /* canvases in one batch row */
#define BENCH_MAX_LIST 32 /* values in one list option */

/* Parse a comma-separated list of integers, each in [lo, hi], into v[cap];
 * returns the count (>= 1), or -1 with a message naming the option `name`
 * and the bad item written to err[n_err] (empty item, not an integer, out of
 * range, more than cap values). */
int bench_parse_list(const char *s, const char *name, int lo, int hi, int *v, int cap, char *err, size_t n_err);

/* Ceiling formats: "bf16" -> 16, a bit width 2, 3, 4, 6 or 8 -> itself; -1 with a message otherwise. */
int bench_parse_formats(const char *s, int *bits, int cap, char *err, size_t n_err);

/* Check the options that need no model (protocol name, lists); 0, or -1 with
 * the message in err[n_err]. The CLI calls it before loading the model. */
int bench_check_opts(const bench_opts *o, char *err, size_t n_err);

/* Check the options against the loaded model before anything is measured:
 * every row's prompt and generation (rounded up to whole canvases) must fit
 * in max_position_embeddings. 0, or -1 with a one-line message naming the
 * option (--prompt-tokens, -n) and the positions in err[n_err]. */
int bench_check_model(const dg_model *m, const bench_opts *o, char *err, size_t n_err);

/* Bytes moved and floating-point operations of one forward pass. */
typedef struct bench_cost {
  double weight_bytes, kv_bytes, other_bytes; /* weights read, K/V read+written, logits written */
  double flops;                               /* matrix products (2 per multiply-add) + attention */
  double act_bytes; /* the per-stage model only (bench_stage_cost; 0 in a pass's cost): activations read and written
                       by the stages without weights (norms, combine) and the sampler statistics' read of the logits */
} bench_cost;

/* One decoder pass over the canvas (C tokens) after ctx_len cached tokens:
 * every layer, the tied LM head, and self-conditioning (its MLP and the
 * probabilities x embedding product, which re-reads the embedding). Experts
 * are counted by the expected number hit by C tokens routed uniformly to
 * top_k of E (E (1 - (1 - k/E)^C) experts' bytes; all of them when C k >> E).
 * K/V read once per pass (a sliding layer at most window + C - 1 keys). */
bench_cost bench_decoder_cost(const dg_model *m, int32_t ctx_len);

/* One canvas's share of a (batched) decoder pass: `rows` canvas positions
 * run through the layers (C without turbo_compact, the live + just
 * committed ones with it), `head_rows` of them through the LM head and the
 * self-conditioning product, after ctx_len cached tokens; every position
 * attends to ctx_len + C keys (canvas K/V of frozen positions come from the
 * per-layer buffers). */
typedef struct bench_pass_seq {
  int32_t rows, head_rows, ctx_len;
} bench_pass_seq;

/* One decoder pass over n canvases (dg_forward_compact_batch): the weights
 * are read once per pass (experts: the expected number hit by the sum of
 * the rows, routed uniformly), the tied embedding twice (LM head and
 * self-conditioning); per canvas its K/V (ctx_len + C keys, a sliding layer
 * at most window + C - 1) and its logits [head_rows, V] fp32 written.
 * FLOPs: 2 per multiply-add: rows x (layer matrices, top_k experts, SC MLP),
 * head_rows x 2 V H (LM head, probabilities x embedding), attention
 * 4 rows (ctx_len + C) heads D per layer (a sliding layer: at most window keys).
 * bench_decoder_cost(m, L) = this with n = 1, rows = head_rows = C. */
bench_cost bench_decoder_batch_cost(const dg_model *m, const bench_pass_seq *seqs, int n);

/* One encoder (causal) pass over T tokens after ctx_len cached tokens (prefill
 * when ctx_len = 0, the commit of a block otherwise): layers only, no LM head. */
bench_cost bench_encoder_cost(const dg_model *m, int32_t T, int32_t ctx_len);

/* The same cost model split by the stages of dg_context_profile (st: DG_PROFILE_STAGES entries, added
 * to) for one pass over T rows after ctx_len cached positions; causal = 1: an encoder pass. The stages
 * sum to bench_encoder_cost / bench_decoder_cost but for the LM head's and self-conditioning's share
 * (bench_decoder_cost counts those weights twice per pass: head and soft embedding, as here). */
void bench_stage_cost(const dg_model *m, int32_t T, int32_t ctx_len, int causal, bench_cost *st);

/* The prefill of P tokens as the CUDA encoder runs it (src/cuda/passes.cu dg_cuda_encode): chunks of `chunk` tokens
 * (the last one shorter), each an encoder pass after the chunks before it (bench_stage_cost(m, T_i, i * chunk, 1)),
 * added to st (DG_PROFILE_STAGES entries). Every chunk reads the weights again (the experts: the fraction its T_i
 * rows hit), while the FLOPs of the products and of the causal attention are those of one pass of P rows (no sliding
 * window cut). Returns the number of chunks; 0 (st untouched) for P < 1 or chunk < 1. */
int32_t bench_encoder_chunks_cost(const dg_model *m, int32_t P, int32_t chunk, bench_cost *st);

/* Floor of a pass in seconds: max(bytes / bw, flops / rate). bw in bytes/s,
 * rate in FLOP/s. *memory_bound (may be NULL) = 1 if the bytes term wins. */
double bench_floor_s(const bench_cost *c, double bw, double rate, int *memory_bound);

/* Bytes of the KV cache of a context of cap positions (dg_context_params.max_context) as the backend lays it out
 * (src/cuda/context.cu ctx_dims_of / ctx_layout): per layer K and V, each n_kv_heads x S x head_dim bf16 (2 bytes),
 * S = cap + canvas_length on full-attention layers; on sliding layers with cuda_ring set (CUDA without
 * full_window_cache) the ring of round_up(sliding_window - 1 + max(canvas_length, enc_chunk), 64) slots (at most S),
 * else S. On the 26B (30 layers, 5 full: 2 KV heads x 512; 25 sliding: 8 x 256, window 1024, canvas 256, enc_chunk
 * 256): 20,480 bytes per position on the full layers + 262,144,000 bytes of rings. The CPU backend keeps every
 * position on every layer (cuda_ring 0). */
double bench_kv_cache_bytes(const dg_model *m, int32_t cap, int cuda_ring, int32_t enc_chunk);

/* Median of v[n] (sorted in place); 0 for n = 0. */
double bench_median(double *v, int n);

/* Measured ceilings. Copy: memcpy of two `bytes` buffers by n_threads threads,
 * bytes read + written per second, best of reps. FMA: register-resident
 * fused multiply-adds on every thread (AVX-512, else AVX2, else scalar),
 * FLOP/s, best of reps; *isa gets the instruction set used. */
double bench_copy_bandwidth(size_t bytes, int n_threads, int reps);
double bench_fma_rate(int n_threads, int reps, const char **isa);
/* The CPU's dot-product ceilings, register-resident on every thread, best of
 * reps: kind 1 = AVX-512 BF16 vdpbf16ps (FLOP/s, 2 per bf16 multiply-add),
 * kind 2 = AVX-512 VNNI vpdpbusd (int8 OP/s, 2 per u8 x s8 multiply-add),
 * kind 3 = AVX2 vpmaddubsw (int8 OP/s, 2 per u8 x s8 multiply-add: 32 per
 * instruction, its s16 pair sums added into s16 accumulators, the instruction
 * DGEMMA_KERNELS=avx2lp builds its dot products on).
 * 0 if the CPU lacks the instruction. */
double bench_dp_rate(int n_threads, int reps, int kind);
/* FLOP/s of this build's matmul kernel on 64 x 2048 x 2048 f32 (context, not a
 * ceiling), best of 3 after one untimed call; *name = the kernel set. */
double bench_matmul_rate(int n_threads, const char **name);

/* Bytes and FLOPs of one product y[M, N] = x[M, K] W^T with W [N, K] in
 * `bits` (16 = bf16; else MLX affine with group_size and bf16 scales and
 * biases, quant.h): bytes = N K 2, or N K bits / 8 + 2 N (K / G) 2; flops
 * = 2 M N K. Activations and outputs are not counted (the ceiling sweep
 * reports GB/s of weights read). */
bench_cost bench_matmul_cost(int64_t N, int64_t K, int bits, int group_size, int64_t M);

/* Route T tokens to top_k distinct experts of E each, uniformly at random
 * from seed (splitmix64 + partial Fisher-Yates): start[E + 1] gets the row
 * offsets of each expert's gathered rows (start[E] = T top_k), token_of[T
 * top_k] (may be NULL) the token of each gathered row. Returns the number of
 * experts hit (with at least one row). */
int bench_route(int32_t T, int E, int top_k, uint64_t seed, int32_t *start, int32_t *token_of);

/* bench_route's draws alone: ids[T, top_k] (token t's top_k distinct experts
 * in draw order), the same sequence as bench_route with the same seed.
 * Returns 0, or -1 (top_k > E, or out of memory). */
int bench_route_ids(int32_t T, int E, int top_k, uint64_t seed, int32_t *ids);

/* A routing that gives every one of E experts exactly M rows: T = E M /
 * top_k tokens, token t slot k -> expert (t top_k + k) mod E (K distinct
 * experts per token when top_k divides E). ids [T, top_k]. Returns T, or -1
 * when top_k does not divide E or E M. */
int32_t bench_route_even(int M, int E, int top_k, int32_t *ids);

/* Bytes and FLOPs of the gathered expert MLP: `experts` experts' weights
 * read once (gate/up [2 IE, H] and down [H, IE] each, in `bits` as in
 * bench_matmul_cost) and `rows` gathered rows through gate/up and down:
 * flops = 2 rows (2 IE H + H IE). */
bench_cost bench_experts_cost(int bits, int group_size, int64_t H, int64_t IE, int64_t experts, int64_t rows);

/* The GPU ceilings of a CUDA row's floor (bench.c): bw = the streaming-read
 * bandwidth (bytes/s), rate = the cuBLAS bf16 GEMM rate (FLOP/s); *both* are
 * the best of two measurements a and b (b may be NULL). Returns the name of
 * the GPU. */
struct dg_cuda_ceilings;
const char *bench_gpu_rates(const struct dg_cuda_ceilings *a, const struct dg_cuda_ceilings *b, double *bw,
                            double *rate);

/* The GPU ceilings g as JSON fields of a row j (a cJSON object): gpu (name),
 * gpu_read_gb_s, gpu_copy_gb_s, gpu_bf16_tflop_s (best; _median_ too), the
 * sizes and the repetitions. */
struct cJSON;
void bench_json_gpu(struct cJSON *j, const struct dg_cuda_ceilings *g);
/* One line on stdout describing g; `when` says when and how they are used. */
void bench_print_gpu(const struct dg_cuda_ceilings *g, const char *when);

/* Floor of one generation (tools/bench.c's rows): the prefill of P tokens,
 * then per block b < n_blocks steps[b] decoder passes at context P + b C
 * and, after the first block, the commit (an encoder pass of C tokens), each
 * max(bytes / bw, flops / rate). *memory_bound (may be NULL) = 1 if memory-
 * bound passes take at least half of it; *bytes and *flops (may be NULL) =
 * totals over the passes (achieved GB/s = bytes / time). */
double bench_gen_floor(const dg_model *m, int32_t P, const int32_t *steps, int32_t n_blocks, double bw, double rate,
                       int *memory_bound, double *bytes, double *flops);

/* ---- batch protocol (turbo engine, dg_generate_batch) ---------------------- */

/* What the callbacks of one batched generation saw, in call order: a step
 * record per canvas per denoising forward, a block record per canvas block. */
typedef struct bench_step_rec { int32_t canvas, block, rows, head_rows; } bench_step_rec;
typedef struct bench_block_rec { int32_t canvas, block, n_steps; } bench_block_rec;
typedef struct bench_trace {
  bench_step_rec *steps;
  int32_t n_steps, cap_steps;
  bench_block_rec *blocks;
  int32_t n_blocks, cap_blocks;
  int oom; /* a record could not be stored */
} bench_trace;
void bench_trace_free(bench_trace *t);

/* Generation parameters of the batch rows: the model's generation config, the
 * recommended turbo setting (diffusion_turbo, turbo_accept "confidence",
 * turbo_threshold [0.95, 0.80, 8], turbo_repair), stop ids off and
 * turbo_repeat_guard 0 (every canvas is generated), max_new_tokens = gen_tokens
 * (<= 0: 4 canvases), seed; then gen_kwargs (may be NULL) on top.
 * Errors: those of dg_gen_params_apply_json; DG_ERR_INVALID_ARG when the
 * result does not enable the turbo engine (batching is a turbo technique). */
dg_status bench_batch_params(const dg_model *m, const char *gen_kwargs, int gen_tokens, uint64_t seed,
                             dg_gen_params *out);

/* The prompt of canvas b: the chat template over a fixed set of 8 different
 * user messages (short Q&A, technical, creative, ...), cycled; *label gets a
 * short name. ids freed with dg_free. */
dg_status bench_batch_prompt(const dg_model *m, int b, int32_t **ids, size_t *n, const char **label);

/* One batched generation: canvas b gets prompts[b] and *gp with seed
 * gp->seed + b (so canvas b of any B equals a B = 1 run of prompt b with that
 * seed); every context is reset first; *seconds = wall time of
 * dg_generate_batch; tr (may be NULL) records the callbacks. results[B] are
 * the caller's to free on DG_OK. Errors: those of dg_generate_batch. */
dg_status bench_batch_run(dg_context *const *ctxs, int B, int32_t *const *prompts, const size_t *n_prompts,
                          const dg_gen_params *gp, dg_gen_result *results, double *seconds, bench_trace *tr);

/* Floor of one recorded batched generation, in seconds: each canvas's
 * prefill (n_prompts[b] tokens) and commits (an encoder pass of C tokens per
 * block after the first), every batched decoder pass (the step records of the
 * live canvases, grouped into passes: dg_generate_batch reports the canvases
 * of one pass in increasing canvas order, so a record whose canvas is not
 * greater than the previous one starts a new pass) at each canvas's context,
 * and every repair forward (a block's n_steps minus its step records: a full
 * canvas pass of its own). Each pass costs max(bytes / bw, flops / rate).
 * *memory_bound (may be NULL) = 1 if memory-bound passes take at least half
 * of it; *n_passes (may be NULL) = the batched decoder passes; *bytes_s and
 * *flops_s (may be NULL) = the sums of the two terms alone (bytes / bw and
 * flops / rate over the same passes: the first shows the weights shared by a
 * batch even where the second dominates). */
double bench_batch_floor(const dg_model *m, int B, const size_t *n_prompts, const bench_trace *tr, double bw,
                         double rate, int *memory_bound, int32_t *n_passes, double *bytes_s, double *flops_s);

/* bench_decoder_batch_cost split by the stages of dg_context_profile (st: DG_PROFILE_STAGES entries, added
 * to): one stacked decoder pass over n canvases. The weights of the layers' products once at the rows' sum
 * (experts: the expected number hit), each canvas's attention at its context, the LM head's embedding read
 * and its logits for the head rows, the self-conditioning's embedding read (head rows x 2 V H) and its MLP
 * over every row. The stages sum to bench_decoder_batch_cost field by field. */
void bench_stage_cost_batch(const dg_model *m, const bench_pass_seq *seqs, int n, bench_cost *st);

/* The batched decoder passes of a recorded batch (grouped as bench_batch_floor does): for pass i (i < cap;
 * both arrays may be NULL) rows[i] = its forward-set rows summed over its canvases, canvases[i] = how many
 * canvases it carried. Returns the number of passes (also past cap). */
int32_t bench_batch_passes(const bench_trace *tr, int B, int32_t *rows, int32_t *canvases, int32_t cap);

/* The ceiling sweep (tools/ceiling.c). With o->device == DG_DEVICE_CUDA it
 * runs on GPU o->cuda_device instead: for each format, the expert MLP
 * (gate/up, GeGLU, down) over all 128 experts in one grouped call with M
 * rows each ("experts_all"), and the gathered MoE of T-token canvases
 * ("moe_gathered"), through the backend's dg_cuda_experts
 * (dg_cuda_bench_experts), median of reps (default 50) with the L2 flushed
 * before each, against max(weight bytes / GPU read bandwidth, FLOPs / GPU
 * bf16 rate) with the GPU ceilings (dg_cuda_ceilings_measure) measured
 * before and after the sweep; without a usable GPU it prints the backend's
 * error and returns 1. On the CPU: for each format and M, the expert
 * matrices of the real MoE (gate/up [2 x 704, 2816], down [2816, 704]) with M
 * activation rows, and the gathered MoE of a canvas (128 experts, top-8, the
 * grouped kernel), in GB/s of weights read and GFLOP/s against the roofline
 * max(weight bytes / copy bandwidth, FLOPs / FMA rate), the ceilings measured
 * before and after the sweep (the best of both), with n_threads threads.
 * Markdown on stdout, JSON lines to out (may be NULL). Returns the exit
 * status (0; 1 after printing an error; 2 for a bad list option). */
int bench_ceiling(const bench_opts *o, int n_threads, FILE *out);

/* Run the protocols; prints the ceilings and a markdown table to stdout.
 * Returns the exit status (0, or 1 after printing an error). */
int dg_cli_bench(dg_model *m, const bench_opts *o);

#endif
