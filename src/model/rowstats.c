/* rowstats.c: the statistics of a row of processed logits shared by the
 * samplers and the backends (rowstats.h): the per-position math of spec 6.1
 * (reductions in double, the fp32 probabilities of the reference) and the
 * hierarchical exact top-K of spec 7.3 (a total order, no allocation). */
#include "model/rowstats.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/dg_error.h"

/* ---- per-position math (spec 6.1) ------------------------------------------ */

dg_status dg_position_stats(const float *z, int32_t V, float u, int mode, dg_pos_stats *out) {
  float mx = -FLT_MAX;
  int32_t amax = 0;
  for (int32_t v = 0; v < V; v++) {
    if (!isfinite(z[v])) return DG_ERR_NUMERIC;
    if (z[v] > mx) { mx = z[v]; amax = v; }
  }
  double sum = 0.0;
  for (int32_t v = 0; v < V; v++) sum += exp((double)z[v] - (double)mx);
  double lse = (double)mx + log(sum);
  /* entropy = -sum p (z - lse), p = exp(z - lse) */
  double ent = 0.0;
  for (int32_t v = 0; v < V; v++) {
    double lp = (double)z[v] - lse;
    ent -= exp(lp) * lp;
  }
  out->argmax = amax;
  out->entropy = (float)(ent > 0.0 ? ent : 0.0);
  out->max_prob = (float)exp((double)mx - lse);
  if (mode == DG_PROPOSAL_ARGMAX) {
    out->proposal = amax;
  } else {
    /* inverse CDF: index = #{v : cdf_v <= u * total}, cdf in double over fp32
     * probabilities p_v = softmax(z) (as torch.softmax computes them). */
    float fs = (float)sum;
    double cdf = 0.0, target;
    double total = 0.0;
    for (int32_t v = 0; v < V; v++) total += (double)(expf(z[v] - mx) / fs);
    target = (double)u * total;
    int32_t idx = V - 1;
    for (int32_t v = 0; v < V; v++) {
      cdf += (double)(expf(z[v] - mx) / fs);
      if (cdf > target) { idx = v; break; }
    }
    out->proposal = idx;
  }
  return DG_OK;
}

/* ------------------------------------------------------------------------ */
/* Hierarchical exact top-K (spec 7.3)                                       */
/* ------------------------------------------------------------------------ */

/* the total order: a precedes b */
static inline int before(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

typedef dg_val_idx vi;
static inline int vi_before(const vi *a, const vi *b) { return before(a->v, a->i, b->v, b->i); }

/* Sift a[r] down the heap a[0..n) whose root is the LAST element in the order. */
static void vi_sift(vi *a, int32_t r, int32_t n) {
  vi x = a[r];
  for (;;) {
    int32_t c = 2 * r + 1;
    if (c >= n) break;
    if (c + 1 < n && vi_before(&a[c], &a[c + 1])) c++; /* the later child */
    if (!vi_before(&x, &a[c])) break;
    a[r] = a[c];
    r = c;
  }
  a[r] = x;
}

/* Move the k first elements of a[0..n) in the order `before` to a[0..k), sorted;
 * a[k..n) is left in some order. In place, allocating nothing (glibc's qsort
 * mallocs a merge buffer for large arrays). `before` is a total order (ties in
 * value broken by the distinct element ids), so the result equals any correct
 * sort's, qsort's included. A heap of the k best so far (its root the worst of
 * them), then a heap sort of those k: O(n log k). */
static void vi_topk_sort(vi *a, int32_t n, int32_t k) {
  if (k > n) k = n;
  if (k <= 0) return;
  for (int32_t r = k / 2 - 1; r >= 0; r--) vi_sift(a, r, k);
  for (int32_t j = k; j < n; j++)
    if (vi_before(&a[j], &a[0])) {
      vi t = a[0];
      a[0] = a[j];
      a[j] = t;
      vi_sift(a, 0, k);
    }
  for (int32_t m = k - 1; m > 0; m--) { /* the worst of a[0..m] to a[m] */
    vi t = a[0];
    a[0] = a[m];
    a[m] = t;
    vi_sift(a, 0, m);
  }
}

void dg_val_idx_sort(dg_val_idx *a, int32_t n) { vi_topk_sort(a, n, n); }

/* Insert (v, i) into the sorted list val/idx of length *n (capacity K). */
static inline void ins(float *val, int32_t *idx, int32_t *n, int32_t K, float v, int32_t i) {
  if (*n == K && !before(v, i, val[K - 1], idx[K - 1])) return;
  int32_t j = *n < K ? (*n)++ : K - 1;
  while (j > 0 && before(v, i, val[j - 1], idx[j - 1])) {
    val[j] = val[j - 1];
    idx[j] = idx[j - 1];
    j--;
  }
  val[j] = v;
  idx[j] = i;
}

/* Insertion is O(n K); above this K the candidates are sorted instead. */
#define TOPK_INSERT_MAX 128

size_t dg_topk_scratch_size(int32_t V, int32_t K) {
  size_t nC = ((size_t)V + DG_TOPK_CHUNK - 1) / DG_TOPK_CHUNK;
  size_t cand = K > TOPK_INSERT_MAX ? (size_t)V : 0;
  return (nC + (size_t)K + cand) * sizeof(vi) + 64;
}

dg_status dg_topk_hier(const float *x, int32_t V, int32_t K, int finite_only, float *val, int32_t *idx,
                       void *scratch, int32_t *bad) {
  const int32_t nC = (V + DG_TOPK_CHUNK - 1) / DG_TOPK_CHUNK;
  vi *chunk = scratch;             /* [nC] chunk maxima (value, element id) */
  vi *sel = chunk + nC;            /* [min(K, nC)] the best chunks */
  vi *cand = sel + K;              /* [V] candidates when K is large */
  /* stage 1: chunk maxima; the first maximal element represents the chunk */
  for (int32_t c = 0; c < nC; c++) {
    int32_t lo = c * DG_TOPK_CHUNK, hi = lo + DG_TOPK_CHUNK < V ? lo + DG_TOPK_CHUNK : V, b = lo;
    for (int32_t v = lo; v < hi; v++) {
      float f = x[v];
      if (isnan(f) || (finite_only && isinf(f))) {
        if (bad) *bad = v;
        return DG_ERR_NUMERIC;
      }
      if (f > x[b]) b = v;
    }
    chunk[c].v = x[b];
    chunk[c].i = b;
  }
  /* stage 2: the K best chunks under the same order */
  int32_t nsel = K < nC ? K : nC;
  if (K > TOPK_INSERT_MAX) {
    vi_topk_sort(chunk, nC, nsel);
    memcpy(sel, chunk, (size_t)nsel * sizeof *sel);
  } else {
    int32_t n = 0;
    float *sv = val;   /* val/idx double as the insertion lists (K >= nsel) */
    int32_t *si = idx;
    for (int32_t c = 0; c < nC; c++) ins(sv, si, &n, nsel, chunk[c].v, chunk[c].i);
    for (int32_t c = 0; c < nsel; c++) { sel[c].v = sv[c]; sel[c].i = si[c]; }
  }
  /* stage 3: the K best elements among the selected chunks' elements */
  if (K > TOPK_INSERT_MAX) {
    int32_t n = 0;
    for (int32_t s = 0; s < nsel; s++) {
      int32_t lo = sel[s].i / DG_TOPK_CHUNK * DG_TOPK_CHUNK, hi = lo + DG_TOPK_CHUNK < V ? lo + DG_TOPK_CHUNK : V;
      for (int32_t v = lo; v < hi; v++) { cand[n].v = x[v]; cand[n].i = v; n++; }
    }
    vi_topk_sort(cand, n, K);
    for (int32_t k = 0; k < K; k++) { val[k] = cand[k].v; idx[k] = cand[k].i; }
  } else {
    int32_t n = 0;
    for (int32_t s = 0; s < nsel; s++) {
      int32_t lo = sel[s].i / DG_TOPK_CHUNK * DG_TOPK_CHUNK, hi = lo + DG_TOPK_CHUNK < V ? lo + DG_TOPK_CHUNK : V;
      for (int32_t v = lo; v < hi; v++) ins(val, idx, &n, K, x[v], v);
    }
  }
  return DG_OK;
}
