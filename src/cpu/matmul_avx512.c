/* matmul_avx512.c: y = x · Wᵀ with AVX-512 (compiled with -mavx512f/bw/vl/dq,
 * selected at run time by dispatch.c).
 *
 * Register tile: 4 weight rows x 4 activation rows = 16 zmm accumulators of
 * 16 lanes; each weight vector is widened once (bf16: shift, f16: vcvtph2ps)
 * and used for 4 activation rows. K tails use masked loads. The lane sums are
 * reduced at the end, so the summation order differs from the oracle; the
 * tolerance in tests/test_kernels.c is derived for that. */
#include <immintrin.h>

#include "kernels.h"

static inline __m512 load_w(dg_dtype dt, const char *row, int64_t k, __mmask16 m) {
  switch (dt) {
  case DG_BF16: {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  case DG_F16: {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    return _mm512_cvtph_ps(h);
  }
  default:
    return _mm512_maskz_loadu_ps(m, (const float *)row + k);
  }
}

#define TILE(RT, TT)                                                                           \
  static void tile_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,            \
                               const char *const *rows, dg_dtype dt, int64_t K) {             \
    __m512 acc[RT][TT];                                                                        \
    for (int i = 0; i < RT; i++)                                                               \
      for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();                            \
    for (int64_t k = 0; k < K; k += 16) {                                                      \
      __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);       \
      __m512 xv[TT];                                                                           \
      for (int j = 0; j < TT; j++) xv[j] = _mm512_maskz_loadu_ps(m, x + j * ldx + k);          \
      for (int i = 0; i < RT; i++) {                                                           \
        __m512 wv = load_w(dt, rows[i], k, m);                                                 \
        for (int j = 0; j < TT; j++) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);        \
      }                                                                                        \
    }                                                                                          \
    for (int i = 0; i < RT; i++)                                                               \
      for (int j = 0; j < TT; j++) y[j * ldy + i] = _mm512_reduce_add_ps(acc[i][j]);           \
  }
TILE(4, 4)
TILE(4, 1)
TILE(1, 4)
TILE(1, 1)

#include "matmul_driver.h"

static const dg_kernels AVX512 = {"avx512", matmul_driver};
const dg_kernels *dg_kernels_avx512_impl(void) { return &AVX512; }
