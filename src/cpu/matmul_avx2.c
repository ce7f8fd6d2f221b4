/* matmul_avx2.c: y = x · Wᵀ with AVX2 + FMA + F16C (compiled with -mavx2
 * -mfma -mf16c, selected at run time). Same 4x4 register tiling as the
 * AVX-512 kernel with 8 lanes; K tails fall back to scalar loads.
 *
 * MLX affine-quantized weights (quant.h) use the same tiles: 8 codes are
 * unpacked to fp32 lanes and dequantized with a separate multiply and add
 * (w = q*s + b, two roundings, bit-identical to dg_quant_dequant_row), then
 * multiplied into the accumulators. K is a multiple of the group size (>= 32),
 * so quantized rows have no K tail. */
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

/* Unpacking 8 codes (k % 8 == 0) of a packed row, any width b: the codes
 * are b bytes at byte k*b/8 and code i sits at bit i*b of that little-endian
 * stream (quant.h), in bytes floor(i*b/8) and the next one, shifted right by
 * (i*b) % 8. Load the b bytes, broadcast them to both 128-bit lanes, one
 * in-lane byte shuffle putting code i's two bytes into dword i, one variable
 * shift, one mask. */
typedef struct qunpack { __m256i ctrl, shift, mask; } qunpack;

static inline qunpack qunpack_for(int b) {
  int8_t ctrl[32];
  int32_t shift[8];
  for (int i = 0; i < 8; i++) {
    int byte = i * b / 8;
    ctrl[4 * i] = (int8_t)byte;
    ctrl[4 * i + 1] = byte + 1 < b ? (int8_t)(byte + 1) : (int8_t)-128; /* -128: zero */
    ctrl[4 * i + 2] = ctrl[4 * i + 3] = (int8_t)-128;
    shift[i] = (i * b) % 8;
  }
  qunpack u;
  u.ctrl = _mm256_loadu_si256((const __m256i *)ctrl);
  u.shift = _mm256_loadu_si256((const __m256i *)shift);
  u.mask = _mm256_set1_epi32((1 << b) - 1);
  return u;
}

static inline __attribute__((always_inline)) __m256 codes8(const uint8_t *p, const int bits, const qunpack *u) {
  if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
  /* the b bytes as one integer, built from whole-register loads (a memcpy of
   * 3 or 6 bytes into a stack word stalls on store forwarding) */
  uint64_t w;
  uint16_t h;
  uint32_t d;
  if (bits == 2) { memcpy(&h, p, 2); w = h; }
  else if (bits == 3) { memcpy(&h, p, 2); w = h | (uint64_t)p[2] << 16; }
  else if (bits == 4) { memcpy(&d, p, 4); w = d; }
  else { memcpy(&d, p, 4); memcpy(&h, p + 4, 2); w = d | (uint64_t)h << 32; } /* 6 */
  __m256i v = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)w));
  v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, u->ctrl), u->shift), u->mask);
  return _mm256_cvtepi32_ps(v);
}

#define QTILE(B, RT, TT)                                                                                 \
  static void qtile_##B##_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,              \
                                      const uint8_t *const *rows, const char *const *sc,               \
                                      const char *const *bi, dg_dtype sbt, int G, int64_t K) {         \
    __m256 acc[RT][TT];                                                                                  \
    const qunpack un = qunpack_for(B);                                                                   \
    for (int i = 0; i < RT; i++)                                                                         \
      for (int j = 0; j < TT; j++) acc[i][j] = _mm256_setzero_ps();                                      \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      __m256 s[RT], b[RT];                                                                               \
      for (int i = 0; i < RT; i++) {                                                                     \
        s[i] = _mm256_set1_ps(dg_load_elem(sbt, sc[i], g0 / G));                                         \
        b[i] = _mm256_set1_ps(dg_load_elem(sbt, bi[i], g0 / G));                                         \
      }                                                                                                  \
      for (int64_t k = g0; k < g0 + G; k += 8) {                                                         \
        __m256 xv[TT];                                                                                   \
        for (int j = 0; j < TT; j++) xv[j] = _mm256_loadu_ps(x + j * ldx + k);                           \
        for (int i = 0; i < RT; i++) {                                                                   \
          __m256 wv = _mm256_add_ps(_mm256_mul_ps(codes8(rows[i] + k * B / 8, B, &un), s[i]), b[i]);          \
          for (int j = 0; j < TT; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);                \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
    for (int i = 0; i < RT; i++)                                                                         \
      for (int j = 0; j < TT; j++) y[j * ldy + i] = hsum8(acc[i][j]);                                    \
  }
/* Dequantize one packed row into out[K] (fp32), the same multiply then add. */
#define QDEQ(B)                                                                                          \
  static void qdeq_##B(const uint8_t *row, const char *sc, const char *bi, dg_dtype sbt, int G, int64_t K, \
                       float *out) {                                                                     \
    const qunpack un = qunpack_for(B);                                                                   \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      const __m256 s = _mm256_set1_ps(dg_load_elem(sbt, sc, g0 / G));                                    \
      const __m256 b = _mm256_set1_ps(dg_load_elem(sbt, bi, g0 / G));                                    \
      for (int64_t k = g0; k < g0 + G; k += 8)                                                           \
        _mm256_storeu_ps(out + k, _mm256_add_ps(_mm256_mul_ps(codes8(row + k * B / 8, B, &un), s), b));  \
    }                                                                                                    \
  }
#define QTILES(B) QTILE(B, 4, 4) QTILE(B, 4, 1) QTILE(B, 1, 4) QTILE(B, 1, 1) QDEQ(B)
QTILES(2)
QTILES(3)
QTILES(4)
QTILES(6)
QTILES(8)

/* The product over W's rows (kernels.h: matmul_rows): TT activation rows x
 * 32 columns = 4*TT ymm accumulators; per row v one load (widened) of 32
 * weights and one broadcast per activation row, then a multiply and an add
 * (not an FMA: the oracle rounds the product). Columns past nc (the tail of
 * the last block) go through a scalar loop with the same operations. */
#define RCOLS 32
#define RTILE(TT)                                                                                           \
  static void rtile_##TT(float *y, int64_t ldy, const float *x, int64_t ldx, const char *w, size_t rs,     \
                         dg_dtype dt, int64_t nv, int64_t nc) {                                            \
    if (nc < RCOLS) { /* the last, partial block of columns */                                            \
      for (int64_t v = 0; v < nv; v++)                                                                      \
        for (int t = 0; t < TT; t++) {                                                                      \
          const float p = x[t * ldx + v];                                                                   \
          if (p == 0.0f) continue;                                                                          \
          for (int64_t j = 0; j < nc; j++) y[t * ldy + j] += p * dg_load_elem(dt, w + (size_t)v * rs, j);  \
        }                                                                                                   \
      return;                                                                                               \
    }                                                                                                       \
    __m256 acc[TT][4];                                                                                      \
    for (int t = 0; t < TT; t++)                                                                            \
      for (int c = 0; c < 4; c++) acc[t][c] = _mm256_loadu_ps(y + t * ldy + 8 * c);                        \
    for (int64_t v = 0; v < nv; v++) {                                                                      \
      int nz = 0;                                                                                           \
      for (int t = 0; t < TT; t++) nz |= x[t * ldx + v] != 0.0f;                                            \
      if (!nz) continue;                                                                                    \
      const char *row = w + (size_t)v * rs;                                                                 \
      __m256 e[4];                                                                                          \
      for (int c = 0; c < 4; c++) e[c] = load_w8(dt, row, 8 * c);                                          \
      for (int t = 0; t < TT; t++) {                                                                        \
        const __m256 p = _mm256_set1_ps(x[t * ldx + v]);                                                    \
        for (int c = 0; c < 4; c++) acc[t][c] = _mm256_add_ps(acc[t][c], _mm256_mul_ps(p, e[c]));          \
      }                                                                                                     \
    }                                                                                                       \
    for (int t = 0; t < TT; t++)                                                                            \
      for (int c = 0; c < 4; c++) _mm256_storeu_ps(y + t * ldy + 8 * c, acc[t][c]);                        \
  }
RTILE(4)
RTILE(1)

#include "matmul_driver.h"

static const dg_kernels AVX2 = {"avx2", matmul_driver, matmul_grouped_driver, matmul_rows_driver};
const dg_kernels *dg_kernels_avx2_impl(void) { return &AVX2; }
