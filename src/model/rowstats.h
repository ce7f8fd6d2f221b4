/* rowstats.h: the statistics of one row of processed logits that both the
 * samplers and the backends compute (rowstats.c): the reference's
 * per-position argmax, entropy, top probability and proposal draw (spec 6.1)
 * and the hierarchical exact top-K of the turbo engine (spec 7.3). Plain host
 * arrays, no model, context or sampler: it sits below the backends (a
 * backend's step statistics call it), and the samplers (sampler.h,
 * turbo_parts.h, which include this header) build on it
 * (docs/architecture.md). */
#ifndef DG_ROWSTATS_H
#define DG_ROWSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

/* ---- per-position math (spec 6.1) --------------------------------------- */

typedef struct dg_pos_stats {
  int32_t argmax;   /* first index of the maximum of z */
  int32_t proposal; /* argmax, or the inverse-CDF draw for uniform u */
  float entropy;    /* -sum p log p of softmax(z), nats */
  float max_prob;   /* max_v softmax(z)_v */
} dg_pos_stats;

/* Statistics of one canvas position from its processed logits z [V]
 * (z = softcapped logits / T). mode: a dg_proposal; for SAMPLE and
 * REPLAY_UNIFORM the proposal is #{v : cdf_v <= u * cdf_{V-1}} (clamped to
 * V-1), cdf accumulated in double over the fp32 probabilities, which is the
 * definition tools/make_goldens.py patches into torch.multinomial.
 * Returns DG_ERR_NUMERIC (without a message) if z holds a NaN or Inf. */
dg_status dg_position_stats(const float *z, int32_t V, float u, int mode, dg_pos_stats *out);

/* ---- hierarchical exact top-K (spec 7.3) -------------------------------- */

#define DG_TOPK_CHUNK 64 /* elements per chunk of the hierarchical top-K (spec 7.3) */

/* A value and its element id; dg_val_idx_sort's and dg_topk_hier's total order. */
typedef struct dg_val_idx { float v; int32_t i; } dg_val_idx;

/* Sort a[0..n) in place, allocating nothing (glibc's qsort mallocs a merge buffer
 * for arrays over 1 KiB): a precedes b iff a.v > b.v, or a.v == b.v and a.i < b.i.
 * With distinct ids and no NaN the order is total, so the result equals any
 * correct sort's, qsort's included. */
void dg_val_idx_sort(dg_val_idx *a, int32_t n);

/* Bytes of scratch dg_topk_hier needs for a row of V values and a given K. */
size_t dg_topk_scratch_size(int32_t V, int32_t K);

/* Hierarchical exact top-K (spec 7.3): chunk maxima over chunks of 64, the
 * K best chunks, the K best elements inside them. The order is total: a
 * precedes b iff x[a] > x[b], or x[a] == x[b] and a < b (ties to the lower
 * id); the result equals the first K of a full sort under that order.
 * x [V], 1 <= K <= V; val/idx [K] come out in that order. -inf and +inf are
 * ordered like any value unless finite_only is set, in which case they are an
 * error like NaN. Returns DG_ERR_NUMERIC (no message; *bad = the first
 * offending index) for NaN (or an infinity with finite_only), DG_OK otherwise. */
dg_status dg_topk_hier(const float *x, int32_t V, int32_t K, int finite_only, float *val, int32_t *idx,
                       void *scratch, int32_t *bad);

#endif
