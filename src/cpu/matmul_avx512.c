/* matmul_avx512.c: y = x · Wᵀ with AVX-512 (compiled with -mavx512f/bw/vl/dq,
 * selected at run time by dispatch.c).
 *
 * Register tile: 4 weight rows x 4 activation rows = 16 zmm accumulators of
 * 16 lanes; each weight vector is widened once (bf16: shift, f16: vcvtph2ps)
 * and used for 4 activation rows. K tails use masked loads. The lane sums are
 * reduced at the end, so the summation order differs from the oracle; the
 * tolerance in tests/test_kernels.c is derived for that.
 *
 * MLX affine-quantized weights (quant.h): 16 codes are unpacked to fp32
 * lanes and dequantized with a separate multiply and add (w = q*s + b,
 * bit-identical to dg_quant_dequant_row), then used like widened bf16
 * weights. K is a multiple of the group size (>= 32): no masks needed. */
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

/* Unpacking 16 codes (k % 16 == 0) of a packed row, any width b: the codes
 * are 2b bytes at byte k*b/8 and code i sits at bit i*b of that
 * little-endian stream (quant.h), so it lies in bytes floor(i*b/8) and the
 * next one, shifted right by (i*b) % 8. One byte-masked load of the 2b bytes,
 * broadcast to the four 128-bit lanes, one in-lane byte shuffle putting code
 * i's two bytes into dword i, one variable shift, one mask. */
typedef struct qunpack { __m512i ctrl, shift, mask; __mmask16 load; } qunpack;

static inline qunpack qunpack_for(int b) {
  int8_t ctrl[64];
  int32_t shift[16];
  for (int i = 0; i < 16; i++) {
    int byte = i * b / 8;
    ctrl[4 * i] = (int8_t)byte;
    ctrl[4 * i + 1] = byte + 1 < 2 * b ? (int8_t)(byte + 1) : (int8_t)-128; /* -128: zero */
    ctrl[4 * i + 2] = ctrl[4 * i + 3] = (int8_t)-128;
    shift[i] = (i * b) % 8;
  }
  qunpack u;
  u.ctrl = _mm512_loadu_si512(ctrl);
  u.shift = _mm512_loadu_si512(shift);
  u.mask = _mm512_set1_epi32((1 << b) - 1);
  u.load = (__mmask16)((1u << (2 * b)) - 1u);
  return u;
}

static inline __attribute__((always_inline)) __m512 codes16(const uint8_t *p, const int bits, const qunpack *u) {
  if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
  __m512i v = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(u->load, p));
  v = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(v, u->ctrl), u->shift), u->mask);
  return _mm512_cvtepi32_ps(v);
}

#define QTILE(B, RT, TT)                                                                                 \
  static void qtile_##B##_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,              \
                                      const uint8_t *const *rows, const char *const *sc,               \
                                      const char *const *bi, dg_dtype sbt, int G, int64_t K) {         \
    __m512 acc[RT][TT];                                                                                  \
    const qunpack un = qunpack_for(B);                                                                   \
    for (int i = 0; i < RT; i++)                                                                         \
      for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();                                      \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      __m512 s[RT], b[RT];                                                                               \
      for (int i = 0; i < RT; i++) {                                                                     \
        s[i] = _mm512_set1_ps(dg_load_elem(sbt, sc[i], g0 / G));                                         \
        b[i] = _mm512_set1_ps(dg_load_elem(sbt, bi[i], g0 / G));                                         \
      }                                                                                                  \
      for (int64_t k = g0; k < g0 + G; k += 16) {                                                        \
        __m512 xv[TT];                                                                                   \
        for (int j = 0; j < TT; j++) xv[j] = _mm512_loadu_ps(x + j * ldx + k);                           \
        for (int i = 0; i < RT; i++) {                                                                   \
          __m512 wv = _mm512_add_ps(_mm512_mul_ps(codes16(rows[i] + k * B / 8, B, &un), s[i]), b[i]);         \
          for (int j = 0; j < TT; j++) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);                \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
    for (int i = 0; i < RT; i++)                                                                         \
      for (int j = 0; j < TT; j++) y[j * ldy + i] = _mm512_reduce_add_ps(acc[i][j]);                     \
  }
/* Dequantize one packed row into out[K] (fp32), the same multiply then add. */
#define QDEQ(B)                                                                                          \
  static void qdeq_##B(const uint8_t *row, const char *sc, const char *bi, dg_dtype sbt, int G, int64_t K, \
                       float *out) {                                                                     \
    const qunpack un = qunpack_for(B);                                                                   \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      const __m512 s = _mm512_set1_ps(dg_load_elem(sbt, sc, g0 / G));                                    \
      const __m512 b = _mm512_set1_ps(dg_load_elem(sbt, bi, g0 / G));                                    \
      for (int64_t k = g0; k < g0 + G; k += 16)                                                          \
        _mm512_storeu_ps(out + k, _mm512_add_ps(_mm512_mul_ps(codes16(row + k * B / 8, B, &un), s), b)); \
    }                                                                                                    \
  }
#define QTILES(B) QTILE(B, 4, 4) QTILE(B, 4, 1) QTILE(B, 1, 4) QTILE(B, 1, 1) QDEQ(B)
QTILES(2)
QTILES(3)
QTILES(4)
QTILES(6)
QTILES(8)

/* The product over W's rows (kernels.h: matmul_rows): TT activation rows x
 * 64 columns = 4*TT zmm accumulators held across the whole block of rows;
 * per row v one load (widened) of 64 weights and one broadcast of x[t, v]
 * per activation row, then a multiply and an add (not an FMA: the oracle
 * rounds the product). Rows whose TT activations are all zero are skipped. */
#define RCOLS 64
#define RTILE(TT)                                                                                           \
  static void rtile_##TT(float *y, int64_t ldy, const float *x, int64_t ldx, const char *w, size_t rs,     \
                         dg_dtype dt, int64_t nv, int64_t nc) {                                            \
    __mmask16 m[4];                                                                                         \
    for (int c = 0; c < 4; c++) {                                                                           \
      int64_t r = nc - 16 * c;                                                                              \
      m[c] = r >= 16 ? (__mmask16)0xffff : r <= 0 ? (__mmask16)0 : (__mmask16)((1u << r) - 1u);             \
    }                                                                                                       \
    __m512 acc[TT][4];                                                                                      \
    for (int t = 0; t < TT; t++)                                                                            \
      for (int c = 0; c < 4; c++) acc[t][c] = _mm512_maskz_loadu_ps(m[c], y + t * ldy + 16 * c);           \
    for (int64_t v = 0; v < nv; v++) {                                                                      \
      int nz = 0;                                                                                           \
      for (int t = 0; t < TT; t++) nz |= x[t * ldx + v] != 0.0f;                                            \
      if (!nz) continue;                                                                                    \
      const char *row = w + (size_t)v * rs;                                                                 \
      __m512 e[4];                                                                                          \
      for (int c = 0; c < 4; c++) e[c] = load_w(dt, row, 16 * c, m[c]);                                    \
      for (int t = 0; t < TT; t++) {                                                                        \
        const __m512 p = _mm512_set1_ps(x[t * ldx + v]);                                                    \
        for (int c = 0; c < 4; c++) acc[t][c] = _mm512_add_ps(acc[t][c], _mm512_mul_ps(p, e[c]));          \
      }                                                                                                     \
    }                                                                                                       \
    for (int t = 0; t < TT; t++)                                                                            \
      for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(y + t * ldy + 16 * c, m[c], acc[t][c]);            \
  }
RTILE(4)
RTILE(1)

#include "matmul_driver.h"

static const dg_kernels AVX512 = {"avx512", matmul_driver, matmul_grouped_driver, matmul_rows_driver};
const dg_kernels *dg_kernels_avx512_impl(void) { return &AVX512; }
