/* turbo_parts.h: the array-level parts of the turbo engine (spec 7, after
 * mlx-vlm PR #1384), defined in turbo_parts.c and exposed for tests and for
 * other backends: host code on plain arrays, no context, sequence or
 * backend. A GPU backend can replace the forward pass and the per-row chain
 * and keep the schedule (accept, EOS tail-drop, repeat guard) as it is.
 * turbo.h (the engine) includes this header. */
#ifndef DG_TURBO_PARTS_H
#define DG_TURBO_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"
#include "model/rowstats.h" /* dg_topk_hier, shared with the backends */

struct dg_model;

/* Per-position statistics of the K-way distribution (spec 7.3). */
typedef struct dg_turbo_pos {
  int32_t argmax;   /* idx[0]: the argmax of the full row under the raw order */
  int32_t proposal; /* argmax, or the inverse-CDF draw over the K probabilities */
  float entropy;    /* -sum_k p_k log p_k over the K (truncated: the tail is dropped), nats */
  float top1;       /* p_0, the largest of the K probabilities */
} dg_turbo_pos;

/* Post-processing on the K raw values val [K] (sorted by dg_topk_hier) with
 * ids idx [K]: softcap cap*tanh(v/cap) (cap <= 0: none), divide by T, softmax
 * over the K (in double), entropy. mode: DG_PROPOSAL_ARGMAX, or SAMPLE with
 * u in [0, 1): proposal = idx of the first k with cdf_k > u * cdf_{K-1}.
 * p [K] receives the probabilities (fp32). */
void dg_turbo_dist(const float *val, const int32_t *idx, int32_t K, float cap, float T, float u, int mode, float *p,
                   dg_turbo_pos *out);

/* The turbo temperature (spec 7.3): T = t_min + (t_max - t_min) * (1 - step / (N - 1))
 * for step = 0..N-1, in fp32; N = 1 gives t_max. */
float dg_turbo_temperature(const dg_gen_params *p, int32_t step, int32_t n_steps);

/* Acceptance over the n_active positions active[] (spec 7.5) at 0-based
 * denoising step `step`: flush accepts all; otherwise entropy-bound (the
 * spec 6.1 rule on ent[], indexed by canvas position, with `bound`) or
 * confidence (top1[pos] >= hi for step < k0, else >= lo). When nothing is
 * accepted, the active position with the largest top1 (ties: lowest
 * position) is forced. acc[pos] is set to 0/1 for the active positions only.
 * scratch: 16 * n_active + 16 bytes. Returns the number accepted (>= 1 if n_active >= 1). */
int32_t dg_turbo_accept_step(const dg_turbo_params *t, float bound, int32_t step, int flush, const int32_t *active,
                        int32_t n_active, const float *ent, const float *top1, uint8_t *acc, void *scratch);

/* EOS tail-drop (spec 7.5), on a canvas of C positions with committed[]
 * tokens and frozen[] flags: find the first frozen position e holding a stop
 * id of p. If every position <= e is frozen, return e + 1 (the canvas ends,
 * emitting e + 1 tokens). Otherwise freeze every unfrozen position after e
 * (dropped[i] = 1: never denoised or emitted again) and return 0; also 0 if
 * no frozen stop id exists. */
int32_t dg_turbo_eos_tail(const dg_gen_params *p, int32_t C, const int32_t *committed, uint8_t *frozen,
                          uint8_t *dropped);

/* Repeat guard (spec 7.2, 7.5): feed n emitted tokens; *last / *run carry the
 * current run across calls (start with *last = -1, *run = 0). Returns the
 * number of tokens to keep: n, or the index + 1 of the token whose run
 * reached `limit` (limit <= 0 disables the guard). */
int32_t dg_repeat_guard_feed(int32_t *last, int32_t *run, const int32_t *tok, int32_t n, int32_t limit);

/* One row of the approximate self-conditioning signal (spec 5.5, 7.3):
 * DG_TURBO_SC_TOPK: soft = scale * sum_k p_k E[idx_k] (p from dg_turbo_dist);
 * DG_TURBO_SC_ADAPTIVE: z = softcap(raw)/T over the whole row, exact
 *   probabilities of the top K' tokens (K' = K, 2K, ... until the tail mass
 *   m <= tail_bound or K' = V), tail spread evenly:
 *   soft = scale * (sum_k (q_k - c) E[idx_k] + c * colsum), c = m / (V - K').
 *   Guarantee: |soft_j - exact_j| <= 2 m scale max_v |E[v, j]| (fp32 models).
 * raw [V] raw logits; colsum [H] column sums of E (adaptive only);
 * work: at least dg_turbo_sc_work_size(V, K) bytes. soft [H]. *k_used and
 * *tail (may be NULL) report K' and m. */
size_t dg_turbo_sc_work_size(int32_t V, int32_t K);
void dg_turbo_sc_row(const struct dg_model *m, dg_turbo_sc mode, const float *raw, float T, const int32_t *idx,
                     const float *p, int32_t K, float tail_bound, const float *colsum, void *work, float *soft,
                     int32_t *k_used, float *tail);

/* Shape bucket (spec 7.4): the first of {16, 32, 48, 64, 96, 128, 160, 192,
 * 224, 256} that is >= n, clipped to the canvas length C (and C when n > 256),
 * so at most 10 distinct sizes for canvases up to 256; n itself without
 * bucketing. */
int32_t dg_turbo_bucket(int32_t n, int32_t C);

/* Column sums of the embedding, colsum [H] (sum in double). */
void dg_embed_colsum(const struct dg_model *m, float *colsum);

#endif
