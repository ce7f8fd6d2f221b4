/* matmul_avx2.c: y = x · Wᵀ with AVX2 + FMA + F16C (compiled with -mavx2
 * -mfma -mf16c, selected at run time). Same 4x4 register tiling as the
 * AVX-512 kernel with 8 lanes; K tails fall back to scalar loads. */
#include <immintrin.h>

#include "kernels.h"

static inline __m256 load_w8(dg_dtype dt, const char *row, int64_t k) {
  switch (dt) {
  case DG_BF16: {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  case DG_F16:
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
  default:
    return _mm256_loadu_ps((const float *)row + k);
  }
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

#define TILE(RT, TT)                                                                           \
  static void tile_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,            \
                               const char *const *rows, dg_dtype dt, int64_t K) {             \
    __m256 acc[RT][TT];                                                                        \
    for (int i = 0; i < RT; i++)                                                               \
      for (int j = 0; j < TT; j++) acc[i][j] = _mm256_setzero_ps();                            \
    int64_t k = 0;                                                                             \
    for (; k + 8 <= K; k += 8) {                                                               \
      __m256 xv[TT];                                                                           \
      for (int j = 0; j < TT; j++) xv[j] = _mm256_loadu_ps(x + j * ldx + k);                   \
      for (int i = 0; i < RT; i++) {                                                           \
        __m256 wv = load_w8(dt, rows[i], k);                                                   \
        for (int j = 0; j < TT; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);        \
      }                                                                                        \
    }                                                                                          \
    for (int i = 0; i < RT; i++)                                                               \
      for (int j = 0; j < TT; j++) {                                                           \
        float s = hsum8(acc[i][j]);                                                            \
        for (int64_t kk = k; kk < K; kk++) s += x[j * ldx + kk] * dg_load_elem(dt, rows[i], kk); \
        y[j * ldy + i] = s;                                                                    \
      }                                                                                        \
  }
TILE(4, 4)
TILE(4, 1)
TILE(1, 4)
TILE(1, 1)

#include "matmul_driver.h"

static const dg_kernels AVX2 = {"avx2", matmul_driver};
const dg_kernels *dg_kernels_avx2_impl(void) { return &AVX2; }
