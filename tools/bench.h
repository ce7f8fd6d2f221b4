/* bench.h: `dgemma bench` (tools/bench.c): throughput protocols measured
 * against this machine's ceilings (copy bandwidth, FMA rate) measured in the
 * same command. The cost model and the statistics helpers are exposed for
 * tests. */
#ifndef DG_CLI_BENCH_H
#define DG_CLI_BENCH_H

#include <stdint.h>

#include "dgemma.h"

typedef struct bench_opts {
  const char *model_dir;  /* for the output rows */
  const char *protocol;   /* "vllm", "p512" or "all" (NULL = all) */
  int reps;               /* timed runs per row (<= 0: 3) */
  int warmup;             /* untimed runs before them (< 0: 1) */
  int prompt_tokens;      /* vllm: prompt length (<= 0: 4 canvases, = 1024 at canvas 256) */
  int gen_tokens;         /* generated tokens (<= 0: vllm 4 canvases, p512 512) */
  const char *out;        /* JSON lines, or NULL */
  uint64_t seed;
  int tty;
} bench_opts;

/* Bytes moved and floating-point operations of one forward pass. */
typedef struct bench_cost {
  double weight_bytes, kv_bytes, other_bytes; /* weights read, K/V read+written, logits written */
  double flops;                               /* matrix products (2 per multiply-add) + attention */
} bench_cost;

/* One decoder pass over the canvas (C tokens) after ctx_len cached tokens:
 * every layer, the tied LM head, and self-conditioning (its MLP and the
 * probabilities x embedding product, which re-reads the embedding). Experts
 * are counted by the expected number hit by C tokens routed uniformly to
 * top_k of E (E (1 - (1 - k/E)^C) experts' bytes; all of them when C k >> E).
 * K/V read once per pass (a sliding layer at most window + C - 1 keys). */
bench_cost bench_decoder_cost(const dg_model *m, int32_t ctx_len);

/* One encoder (causal) pass over T tokens after ctx_len cached tokens (prefill
 * when ctx_len = 0, the commit of a block otherwise): layers only, no LM head. */
bench_cost bench_encoder_cost(const dg_model *m, int32_t T, int32_t ctx_len);

/* Floor of a pass in seconds: max(bytes / bw, flops / rate). bw in bytes/s,
 * rate in FLOP/s. *memory_bound (may be NULL) = 1 if the bytes term wins. */
double bench_floor_s(const bench_cost *c, double bw, double rate, int *memory_bound);

/* Median of v[n] (sorted in place); 0 for n = 0. */
double bench_median(double *v, int n);

/* Measured ceilings. Copy: memcpy of two `bytes` buffers by n_threads threads,
 * bytes read + written per second, best of reps. FMA: register-resident
 * fused multiply-adds on every thread (AVX-512, else AVX2, else scalar),
 * FLOP/s, best of reps; *isa gets the instruction set used. */
double bench_copy_bandwidth(size_t bytes, int n_threads, int reps);
double bench_fma_rate(int n_threads, int reps, const char **isa);

/* Run the protocols; prints the ceilings and a markdown table to stdout.
 * Returns the exit status (0, or 1 after printing an error). */
int dg_cli_bench(dg_model *m, const bench_opts *o);

#endif
