/* attn_avx512.c: one attention block with AVX-512 (compiled with -mavx512f/...,
 * reached through dg_kernels.attn_block of the avx512 and avx512lp sets).
 *
 * Bit-identical to forward.c's scalar loop (the oracle): every score, max,
 * exponential, sum and output element is computed with the same operations in
 * the same order, only several of them at once:
 *   scores  16 queries in the lanes (q transposed to [D][16]), 4 keys at a time;
 *           per lane s = +0, then s = fl(s + fl(q[d] * k[d])) for d in increasing
 *           order: a product rounded to fp32, then a sum, never a fused
 *           multiply-add (the file is C11, so -ffp-contract is off);
 *   softmax per query, scalar, over its own keys in the oracle's order (libm
 *           expf, sequential sum);
 *   output  per query, 16 head dimensions in the lanes: o = +0, then
 *           o = fl(o + fl(p_j * v_j)) over its own keys in the oracle's order.
 * Lanes of a partial block compute scores that are never read. */
#include <immintrin.h>
#include <math.h>
#include <float.h>

#include "cpu/kernels.h"

/* o[0, 64) = sum over the rows j of the cache part (vb, stride vs, probabilities s1[16 j] * inv, m1
 * rows) and then of the chunk part (cb, stride cs, s2, n2 rows) of p_j * v_j: four 16-lane
 * accumulators, +0 then a product and a sum per row, in row order. */
static inline void pv_64(float *o, const float *vb, int64_t vs, const float *s1, int m1, const float *cb, int64_t cs,
                         const float *s2, int n2, float inv) {
  __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
  for (int part = 0; part < 2; part++) {
    const float *b = part ? cb : vb, *sp = part ? s2 : s1;
    const int64_t st = part ? cs : vs;
    const int n = part ? n2 : m1;
    for (int j = 0; j < n; j++) {
      const __m512 p = _mm512_set1_ps(sp[(size_t)j * 16] * inv);
      const float *v = b + (size_t)j * st;
      o0 = _mm512_add_ps(o0, _mm512_mul_ps(p, _mm512_loadu_ps(v)));
      o1 = _mm512_add_ps(o1, _mm512_mul_ps(p, _mm512_loadu_ps(v + 16)));
      o2 = _mm512_add_ps(o2, _mm512_mul_ps(p, _mm512_loadu_ps(v + 32)));
      o3 = _mm512_add_ps(o3, _mm512_mul_ps(p, _mm512_loadu_ps(v + 48)));
    }
  }
  _mm512_storeu_ps(o, o0);
  _mm512_storeu_ps(o + 16, o1);
  _mm512_storeu_ps(o + 32, o2);
  _mm512_storeu_ps(o + 48, o3);
}

/* The same for o[0, 16). */
static inline void pv_16(float *o, const float *vb, int64_t vs, const float *s1, int m1, const float *cb, int64_t cs,
                         const float *s2, int n2, float inv) {
  __m512 o0 = _mm512_setzero_ps();
  for (int j = 0; j < m1; j++) o0 = _mm512_add_ps(o0, _mm512_mul_ps(_mm512_set1_ps(s1[(size_t)j * 16] * inv), _mm512_loadu_ps(vb + (size_t)j * vs)));
  for (int j = 0; j < n2; j++) o0 = _mm512_add_ps(o0, _mm512_mul_ps(_mm512_set1_ps(s2[(size_t)j * 16] * inv), _mm512_loadu_ps(cb + (size_t)j * cs)));
  _mm512_storeu_ps(o, o0);
}

void dg_attn_block_avx512(int nq, const float *const *qv, float *const *ov, const int32_t *lo, const int32_t *n1,
                          const float *kc, const float *vc, const float *ck, const float *cv, int64_t cks, int n2,
                          int D, float *scratch) {
  /* scratch: qT [D][16], then scores [keys][16] over the union of the cache ranges and the chunk */
  float *qT = scratch;
  int32_t ulo = lo[0], uhi = lo[0] + n1[0];
  for (int i = 1; i < nq; i++) {
    if (lo[i] < ulo) ulo = lo[i];
    if (lo[i] + n1[i] > uhi) uhi = lo[i] + n1[i];
  }
  const int nu = uhi > ulo ? uhi - ulo : 0;
  float *sT = qT + (size_t)D * 16;
  for (int d = 0; d < D; d++)
    for (int i = 0; i < 16; i++) qT[d * 16 + i] = i < nq ? qv[i][d] : 0.0f;
  /* scores of keys [ulo, uhi) of the cache, then the n2 chunk keys */
  for (int part = 0; part < 2; part++) {
    const int n = part ? n2 : nu;
    const float *kb = part ? ck : kc + (size_t)ulo * D;
    const int64_t ks = part ? cks : D;
    float *sb = sT + (size_t)(part ? nu : 0) * 16;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      const float *k0 = kb + (size_t)j * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int d = 0; d < D; d++) {
        __m512 q = _mm512_loadu_ps(qT + d * 16);
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(q, _mm512_set1_ps(k0[d])));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(q, _mm512_set1_ps(k1[d])));
        a2 = _mm512_add_ps(a2, _mm512_mul_ps(q, _mm512_set1_ps(k2[d])));
        a3 = _mm512_add_ps(a3, _mm512_mul_ps(q, _mm512_set1_ps(k3[d])));
      }
      _mm512_storeu_ps(sb + (size_t)j * 16, a0);
      _mm512_storeu_ps(sb + (size_t)(j + 1) * 16, a1);
      _mm512_storeu_ps(sb + (size_t)(j + 2) * 16, a2);
      _mm512_storeu_ps(sb + (size_t)(j + 3) * 16, a3);
    }
    for (; j < n; j++) {
      const float *k0 = kb + (size_t)j * ks;
      __m512 a0 = _mm512_setzero_ps();
      for (int d = 0; d < D; d++) a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(qT + d * 16), _mm512_set1_ps(k0[d])));
      _mm512_storeu_ps(sb + (size_t)j * 16, a0);
    }
  }
  for (int i = 0; i < nq; i++) {
    /* the lane's own keys: cache [lo, lo + n1) at union offsets c0.., then the chunk */
    float *s1 = sT + (size_t)(lo[i] - ulo) * 16 + i, *s2 = sT + (size_t)nu * 16 + i;
    const int m1 = n1[i];
    float mx = -FLT_MAX;
    for (int j = 0; j < m1; j++)
      if (s1[j * 16] > mx) mx = s1[j * 16];
    for (int j = 0; j < n2; j++)
      if (s2[j * 16] > mx) mx = s2[j * 16];
    float sum = 0.0f;
    for (int j = 0; j < m1; j++) {
      s1[j * 16] = expf(s1[j * 16] - mx);
      sum += s1[j * 16];
    }
    for (int j = 0; j < n2; j++) {
      s2[j * 16] = expf(s2[j * 16] - mx);
      sum += s2[j * 16];
    }
    const float inv = 1.0f / sum;
    float *o = ov[i];
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) pv_64(o + d0, vc + (size_t)lo[i] * D + d0, D, s1, m1, cv ? cv + d0 : NULL, cks, s2, n2, inv);
    for (; d0 < D; d0 += 16) pv_16(o + d0, vc + (size_t)lo[i] * D + d0, D, s1, m1, cv ? cv + d0 : NULL, cks, s2, n2, inv);
  }
}
