/* matmul_avx512lp.c: the opt-in low-precision products (DGEMMA_KERNELS=avx512lp;
 * compiled with -mavx512bf16 -mavx512vnni on top of AVX-512 F/BW/VL/DQ, selected
 * only when the CPU has both). They are not the oracle's bits, so they are
 * never the default: the golden and token-identical tests run the fp32 path.
 *
 * bf16 weights: vdpbf16ps. The activations are rounded to bf16 once per call
 * (vcvtne2ps2bf16: round to nearest even, inputs below 2^-126 read as zero),
 * then every 32 weights x 32 activations are 16 lanes of pair products summed
 * into fp32 accumulators. What it rounds (tests/test_kernels.c checks both):
 *  - x -> xh = bf16(x): |xh - x| <= 2^-8 |x| + 2^-126 (8 significant bits: unit roundoff 2^-8);
 *  - xh * w is exact in fp32 (8 x 8 significant bits), and vdpbf16ps adds the
 *    two products of a pair one after the other with round to nearest
 *    (Intel SDM, VDPBF16PS; DAZ/FTZ: results below 2^-126 flush to zero), so
 *    the sum over k is an fp32 sum of exact products in another order than the
 *    oracle's: within gamma_K sum |xh w| of sum xh w (Higham eq. 3.5).
 *  So |y - oracle| <= (2^-8 + 2 gamma_K (1 + 2^-8)) sum|x w| + 2^-126 (sum|w| + 2K);
 *  and against the oracle run on xh itself, 2 gamma_K sum |xh w| (+ the FTZ term).
 *
 * MLX affine 2/4/8-bit weights: vpdpbusd (u8 codes x s8 activations). The
 * activations are quantized once per call per row and per weight group of G:
 * d = max|x| / 127, qx = round(x / d) in [-127, 127], x ~ d qx. With
 * w = q s + b (quant.h) the product splits per group g:
 *   sum_{k in g} x_k w_k ~ d_g (s_g sum_k q_k qx_k + b_g sum_k qx_k)
 * where both sums are exact integers (vpdpbusd: four u8 x s8 products per
 * dword lane, no saturation; |lane| <= 16 * 255 * 127 < 2^24, so its fp32
 * conversion is exact too) and the scale/bias part is fp32. The weights are
 * unpacked in registers: 64 packed bytes hold 8/B codes per byte, code
 * (8/B) j + s in bits [B s, B s + B) of byte j (the MLX stream order for
 * B = 2, 4, 8), so (bytes >> B s) & (2^B - 1) gives 64 codes and the
 * activations are stored in that order. Dword lane i of a 64-byte step covers
 * 4 (8/B) consecutive codes, all in one group (G >= 32), so the group's
 * s_g d_g is a per-lane vector: no horizontal sum per group, one per output.
 * What it rounds: x -> d qx, |d qx - x| <= d/2 (1 + 2^-20) per element; the
 * fp32 scale/bias arithmetic and the sums over groups, a few roundings per
 * term (the test's bound: (d_g/2)(1 + 2^-20) sum_{k in g} |w_k| plus
 * 2 gamma_{K+8} sum (|x| + |d qx|)(|q s| + |b|)). 3- and 6-bit codes straddle
 * bytes and take the exact fp32 path, as do f32 and f16 weights. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/scratch.h"
#include "io/quant.h"

const dg_kernels *dg_kernels_avx512_impl(void);

/* ---- bf16 weights ---------------------------------------------------------- */

/* x [T, K] (stride ldx) -> xb [T, Kp] bf16, Kp = K rounded up to 32, zero tail. */
static void x_to_bf16(const float *x, int64_t ldx, int64_t T, int64_t K, int64_t Kp, uint16_t *xb, int n_threads) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t k = 0; k < Kp; k += 32) {
      const int64_t r = K - k;
      const __mmask16 m0 = r >= 16 ? (__mmask16)0xffff : r <= 0 ? 0 : (__mmask16)((1u << r) - 1u);
      const __mmask16 m1 = r >= 32 ? (__mmask16)0xffff : r <= 16 ? 0 : (__mmask16)((1u << (r - 16)) - 1u);
      const __m512 lo = _mm512_maskz_loadu_ps(m0, x + t * ldx + k), hi = _mm512_maskz_loadu_ps(m1, x + t * ldx + k + 16);
      _mm512_storeu_si512(xb + t * Kp + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* Every tile prefetches, per weight row and 64-byte step, the same offset PF_ROWS rows
 * on: the row of the 4-row block this thread takes next (a matrix's rows are
 * contiguous), as avx2lp does, into the L2 (prefetcht1). On the 2-core AVX-512 EPYC
 * (loaded, 1 thread, 4-bit [1408, 2816] from DRAM): M = 1 0.56-0.73 ms without,
 * 0.49-0.54 with prefetcht0 into the L1, 0.29-0.45 with prefetcht1 (4, 8 or 16 rows
 * on: equal within the noise); M = 8 1.40-1.78 -> 0.90-1.24 ms. */
#ifndef PF_ROWS
#define PF_ROWS 4
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
/* The same for the one-activation-row tiles (VTILE1: the matvec), which stream the weights
 * fastest and want the prefetch further ahead (0 = none). Idle 2-core Zen 4 EPYC, 4-bit, -t 2,
 * active wait, medians of 15 (docs/results/cpu-s15/mv_sweep_window1.txt): gate/up [1408, 2816]
 * 4 rows on 63-67 us, 8: 64-72, 16: 64-68, 32: 65-68, none: 140-143; down [2816, 704]
 * 4: 59-61 us, 8: 44-46, 16: 37, 32: 37-38, none: 55-56; -t 1 gate/up 4: 107-108, 16: 96-100. */
#ifndef PF1_ROWS
#define PF1_ROWS 16
#endif
#ifndef PF1_HINT
#define PF1_HINT _MM_HINT_T1
#endif

#define BTILE(RT, TT)                                                                                       \
  static void btile_##RT##x##TT(float *y, int64_t ldy, const uint16_t *xb, int64_t Kp,                    \
                                const uint16_t *const *rows, int64_t K) {                                 \
    __m512 acc[RT][TT];                                                                                     \
    for (int i = 0; i < RT; i++)                                                                            \
      for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();                                         \
    for (int64_t k = 0; k < Kp; k += 32) {                                                                  \
      const __mmask32 m = K - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (K - k)) - 1u);        \
      __m512i xv[TT];                                                                                       \
      _Pragma("GCC unroll 16") for (int j = 0; j < TT; j++) xv[j] = _mm512_loadu_si512(xb + j * Kp + k);    \
      _Pragma("GCC unroll 16") for (int i = 0; i < RT; i++) {                                               \
        const __m512i wv = _mm512_maskz_loadu_epi16(m, rows[i] + k);                                        \
        _mm_prefetch((const char *)(rows[i] + k + PF_ROWS * K), PF_HINT);                                   \
        _Pragma("GCC unroll 16") for (int j = 0; j < TT; j++)                                               \
          acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv[j], (__m512bh)wv);                           \
      }                                                                                                     \
    }                                                                                                       \
    for (int i = 0; i < RT; i++)                                                                            \
      for (int j = 0; j < TT; j++) y[j * ldy + i] = _mm512_reduce_add_ps(acc[i][j]);                       \
  }
BTILE(4, 4)
BTILE(4, 1)
BTILE(1, 4)
BTILE(1, 1)

/* Rows [r0, r0+rt) (rt <= 4) of a bf16 W times T converted activation rows. */
static void bf16_rows(float *y, int64_t ldy, const uint16_t *xb, int64_t Kp, int64_t T, const dg_weight *w, int64_t r0,
                      int64_t rt) {
  const int64_t K = w->cols;
  const uint16_t *rows[4];
  for (int i = 0; i < rt; i++) rows[i] = (const uint16_t *)w->data + (size_t)(r0 + i) * (size_t)K;
  int64_t t = 0;
  if (rt == 4) {
    for (; t + 4 <= T; t += 4) btile_4x4(y + t * ldy, ldy, xb + t * Kp, Kp, rows, K);
    for (; t < T; t++) btile_4x1(y + t * ldy, ldy, xb + t * Kp, Kp, rows, K);
    return;
  }
  for (int i = 0; i < rt; i++) {
    const uint16_t *r1[1] = {rows[i]};
    int64_t tt = 0;
    for (; tt + 4 <= T; tt += 4) btile_1x4(y + tt * ldy + i, ldy, xb + tt * Kp, Kp, r1, K);
    for (; tt < T; tt++) btile_1x1(y + tt * ldy + i, ldy, xb + tt * Kp, Kp, r1, K);
  }
}

/* ---- MLX affine 2/4/8-bit weights ------------------------------------------ */

/* The activations of one call, quantized for one weight format (B bits, group G):
 * per row t and 64-byte step of the packed weights (cps = 512/B codes), nsub =
 * 8/B vectors of 64 s8 codes in the weights' unpacking order, the per-lane
 * scale d of the lane's group (16 floats), and per group d and c = d * sum qx.
 * The buffers are the calling thread's scratch (scratch.h, DG_KSCRATCH_LPX: kept for
 * the thread's life, so a product allocates nothing once one of its size has run). */
typedef struct qx_buf {
  int B, G, nsub, cps;
  int64_t K, steps, ng;
  int8_t *q;   /* [T][steps][nsub][64] */
  float *dl;   /* [T][steps][16] */
  float *c;    /* [T][ng + 15] (zero padded to a multiple of 16) */
  float *dg;   /* [T][ng + 15]: d of each group, zero padded like c */
  int64_t cstride;
} qx_buf;

/* One 64-byte step's activation codes src[0 .. 64 nsub) in the weights' unpacking order:
 * qs[s * 64 + j] = src[nsub j + s] (nsub = 8/B = 1, 2 or 4), by truncating 16- or 32-bit
 * lanes (vpmovwb / vpmovdb) of the source shifted right by 8 s bits. */
static inline void qx_unpack_order(int8_t *qs, const int8_t *src, int nsub) {
  if (nsub == 1) {
    memcpy(qs, src, 64);
    return;
  }
  for (int i = 0; i < nsub; i++) {
    const __m512i v = _mm512_loadu_si512(src + 64 * i);
    for (int s = 0; s < nsub; s++) {
      if (nsub == 2) _mm256_storeu_si256((__m256i *)(qs + s * 64 + 32 * i), _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 8 * s)));
      else _mm_storeu_si128((__m128i *)(qs + s * 64 + 16 * i), _mm512_cvtepi32_epi8(_mm512_srli_epi32(v, 8 * s)));
    }
  }
}

static int qx_quantize(qx_buf *b, const float *x, int64_t ldx, int64_t T, int64_t K, int B, int G, int n_threads) {
  b->B = B; b->G = G; b->nsub = 8 / B; b->cps = 512 / B; b->K = K;
  b->steps = (K + b->cps - 1) / b->cps;
  b->ng = K / G;
  b->cstride = (b->ng + 15) / 16 * 16;
  void *part[4]; /* the calling thread's scratch, kept (scratch.h) */
  const size_t nq = (size_t)T * (size_t)b->steps * (size_t)b->nsub * 64, ndl = (size_t)T * (size_t)b->steps * 16 * sizeof(float);
  const size_t nc = (size_t)T * (size_t)b->cstride * sizeof(float);
  if (dg_kscratch_parts(DG_KSCRATCH_LPX, 4, (const size_t[4]){nq, ndl, nc, nc}, part)) return -1;
  b->q = part[0], b->dl = part[1], b->c = part[2], b->dg = part[3];
  const int nsub = b->nsub, cps = b->cps, lane = cps / 16;
  int fail = 0;
  /* 16 lanes at a time (G is a multiple of 32: a vector never spans two groups), the same
   * operations as one element at a time: the group maximum of |x| (vmaxps with x first:
   * a NaN x leaves the maximum as fmaxf does), d = max / 127, qx = round(x / d) (a true
   * division, vrndscaleps to nearest even as nearbyintf) clamped to [-127, 127], the
   * group's sum of qx exact in int32; then the codes in the weights' unpacking order. */
#pragma omp parallel num_threads(T < n_threads ? (int)T : n_threads) reduction(| : fail)
  {
    /* this thread's: the row's codes in natural order, zero past K */
    int8_t *qn = dg_kscratch(DG_KSCRATCH_LPROW, (size_t)b->steps * (size_t)cps);
    fail |= !qn;
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 qhi = _mm512_set1_ps(127.0f), qlo = _mm512_set1_ps(-127.0f);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++) {
      if (!qn) continue;
      const float *xt = x + t * ldx;
      float *ct = b->c + t * b->cstride, *dt = b->dg + t * b->cstride;
      memset(ct, 0, (size_t)b->cstride * sizeof(float));
      memset(dt, 0, (size_t)b->cstride * sizeof(float));
      for (int64_t g = 0; g < b->ng; g++) {
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < G; k += 16) m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xt + g * G + k), absm), m);
        const float d = _mm512_reduce_max_ps(m) / 127.0f;
        dt[g] = d;
        __m512i qsum = _mm512_setzero_si512();
        for (int k = 0; k < G; k += 16) {
          __m512i q = _mm512_setzero_si512();
          if (d > 0.0f) {
            const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(xt + g * G + k), _mm512_set1_ps(d)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(r, qhi), qlo));
          }
          qsum = _mm512_add_epi32(qsum, q);
          _mm_storeu_si128((__m128i *)(qn + g * G + k), _mm512_cvtepi32_epi8(q));
        }
        ct[g] = (float)_mm512_reduce_add_epi32(qsum) * d; /* exact sum: |sum| <= 127 G < 2^24 */
      }
      memset(qn + b->ng * G, 0, (size_t)(b->steps * cps - b->ng * G));
      for (int64_t st = 0; st < b->steps; st++) {
        int8_t *qs = b->q + ((size_t)t * (size_t)b->steps + (size_t)st) * (size_t)nsub * 64;
        float *dl = b->dl + ((size_t)t * (size_t)b->steps + (size_t)st) * 16;
        const int64_t k0 = st * cps;
        qx_unpack_order(qs, qn + k0, nsub);
        for (int i = 0; i < 16; i++) {
          const int64_t k = k0 + (int64_t)i * lane;
          dl[i] = k < K ? dt[k / G] : 0.0f;
        }
      }
    }
  }
  return fail ? -1 : 0;
}

/* Up to 16 scales/biases from p[g0 ...] (n of them) widened to fp32 lanes. */
static inline __m512 load_sb(dg_dtype t, const char *p, int64_t g0, int n) {
  const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
  switch (t) {
  case DG_BF16:
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + g0)), 16));
  case DG_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + g0));
  default: return _mm512_maskz_loadu_ps(m, (const float *)p + g0);
  }
}

/* RT weight rows x TT activation rows; x points at the call's qx_buf rows. Every tile
 * prefetches (PF_ROWS, PF_HINT: above the bf16 tiles) the next block's row. */
#define UNROLL _Pragma("GCC unroll 16")
/* The end of every tile: the bias part sum_g b_g d_g sum_k qx_k (16 groups at a time) added
 * to the accumulators after all steps, then one horizontal sum per output. */
#define VTILE_BIAS_STORE(RT, TT)                                                                             \
  for (int64_t g = 0; g < ng; g += 16) {                                                                     \
    const int n = (int)(ng - g < 16 ? ng - g : 16);                                                          \
    UNROLL for (int i = 0; i < RT; i++) {                                                                    \
      const __m512 b = load_sb(sbt, bi[i], g, n);                                                            \
      UNROLL for (int j = 0; j < TT; j++) acc[i][j] = _mm512_fmadd_ps(b, _mm512_load_ps(xc[j] + g), acc[i][j]); \
    }                                                                                                        \
  }                                                                                                          \
  UNROLL for (int i = 0; i < RT; i++)                                                                        \
    UNROLL for (int j = 0; j < TT; j++) y[j * ldy + i] = _mm512_reduce_add_ps(acc[i][j]);
/* The start of every tile: the step geometry of B-bit codes in groups of G (cps codes per
 * 64-byte step, lg = log2 G), the code mask, and gi: each dword lane's group within its step. */
#define VTILE_PROLOGUE(B)                                                                                    \
  const int G = xb->G, nsub = 8 / B, cps = 512 / B, lg = __builtin_ctz((unsigned)G);                         \
  const int64_t steps = xb->steps, rb = xb->K * B / 8, ng = xb->ng;                                          \
  const __m512i bm = _mm512_set1_epi8((char)((1 << B) - 1));                                                \
  int32_t idx[16];                                                                                           \
  for (int i = 0; i < 16; i++) idx[i] = cps >= G ? (i * (cps / 16)) >> lg : 0;                               \
  const __m512i gi = _mm512_loadu_si512(idx);
#define VTILE(B, RT, TT)                                                                                     \
  static void vtile_##B##_##RT##x##TT(float *y, int64_t ldy, const qx_buf *xb, int64_t t0,                  \
                                      const uint8_t *const *rows, const char *const *sc, const char *const *bi, \
                                      dg_dtype sbt) {                                                        \
    VTILE_PROLOGUE(B)                                                                                        \
    const int gps = cps >= G ? cps >> lg : 1; /* groups per step */                                          \
    const int8_t *xq[TT];                                                                                    \
    const float *xd[TT], *xc[TT];                                                                            \
    UNROLL for (int j = 0; j < TT; j++) {                                                                    \
      xq[j] = xb->q + (size_t)(t0 + j) * (size_t)steps * (size_t)nsub * 64;                                  \
      xd[j] = xb->dl + (size_t)(t0 + j) * (size_t)steps * 16;                                                \
      xc[j] = xb->c + (t0 + j) * xb->cstride;                                                                \
    }                                                                                                        \
    __m512 acc[RT][TT];                                                                                      \
    UNROLL for (int i = 0; i < RT; i++) UNROLL for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps(); \
    for (int64_t st = 0; st < steps; st++) {                                                                 \
      const int64_t byte0 = st * 64, g0 = (st * cps) >> lg;                                                  \
      const __mmask64 lm = rb - byte0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (rb - byte0)) - 1);         \
      const int ngs = (int)(ng - g0 < gps ? ng - g0 : gps);                                                  \
      UNROLL for (int i = 0; i < RT; i++) {                                                                  \
        const __m512i raw = _mm512_maskz_loadu_epi8(lm, rows[i] + byte0);                                   \
        _mm_prefetch((const char *)rows[i] + byte0 + PF_ROWS * rb, PF_HINT); /* the next block's row */  \
        const __m512 s = _mm512_permutexvar_ps(gi, load_sb(sbt, sc[i], g0, ngs));                            \
        __m512i wc[8 / B];                                                                                   \
        UNROLL for (int u = 0; u < nsub; u++) wc[u] = B == 8 ? raw : _mm512_and_si512(_mm512_srli_epi16(raw, B * u), bm); \
        UNROLL for (int j = 0; j < TT; j++) {                                                                \
          __m512i isum = _mm512_setzero_si512();                                                             \
          UNROLL for (int u = 0; u < nsub; u++)                                                              \
            isum = _mm512_dpbusd_epi32(isum, wc[u], _mm512_load_si512(xq[j] + (st * nsub + u) * 64));        \
          const __m512 d = _mm512_load_ps(xd[j] + st * 16);                                                  \
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, d), acc[i][j]);             \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
/* RT weight rows x one activation row (the matvec, and the rows past the last 4 of a call):
 * the same sums in the same order as VTILE, bit for bit, with less work per step. VTILE
 * forms each step's per-lane factor s_g d_g from a scale load, a widening, a permute, a
 * load of d and a product; here the products s_g d_g of 16 groups are formed once (one
 * vector product per row: the same fp32 product, so the same bits) and each step takes
 * its lanes' factors with one permute of that register. Lanes past K: s = d = 0 in both. */
#define VTILE1(B, RT)                                                                                        \
  static void vtile_##B##_##RT##x1(float *y, int64_t ldy, const qx_buf *xb, int64_t t0,                     \
                                   const uint8_t *const *rows, const char *const *sc, const char *const *bi, \
                                   dg_dtype sbt) {                                                           \
    enum { TT = 1 };                                                                                         \
    VTILE_PROLOGUE(B)                                                                                        \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)steps * (size_t)nsub * 64;                               \
    const float *xg = xb->dg + t0 * xb->cstride, *xc[1] = {xb->c + t0 * xb->cstride};                        \
    __m512 acc[RT][1];                                                                                       \
    UNROLL for (int i = 0; i < RT; i++) acc[i][0] = _mm512_setzero_ps();                                     \
    for (int64_t g16 = 0; g16 < ng; g16 += 16) { /* 16 groups: whole steps, as 16 G is a multiple of cps */ \
      const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);                                                    \
      const __m512 dv = _mm512_load_ps(xg + g16);                                                            \
      __m512 sd[RT];                                                                                         \
      UNROLL for (int i = 0; i < RT; i++) sd[i] = _mm512_mul_ps(load_sb(sbt, sc[i], g16, n), dv);            \
      const int64_t s1 = ((g16 + 16) << lg) / cps;                                                           \
      for (int64_t st = (g16 << lg) / cps; st < steps && st < s1; st++) {                                    \
        const int64_t byte0 = st * 64;                                                                       \
        const __mmask64 lm = rb - byte0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (rb - byte0)) - 1);       \
        const __m512i li = _mm512_add_epi32(gi, _mm512_set1_epi32((int)(((st * cps) >> lg) - g16)));         \
        UNROLL for (int i = 0; i < RT; i++) {                                                                \
          const __m512i raw = _mm512_maskz_loadu_epi8(lm, rows[i] + byte0);                                 \
          if (PF1_ROWS) _mm_prefetch((const char *)rows[i] + byte0 + PF1_ROWS * rb, PF1_HINT);             \
          __m512i isum = _mm512_setzero_si512();                                                             \
          UNROLL for (int u = 0; u < nsub; u++)                                                              \
            isum = _mm512_dpbusd_epi32(isum, B == 8 ? raw : _mm512_and_si512(_mm512_srli_epi16(raw, B * u), bm), \
                                       _mm512_load_si512(xq + (st * nsub + u) * 64));                        \
          acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(li, sd[i]), acc[i][0]); \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
#define VTILES(B) VTILE(B, 4, 4) VTILE1(B, 4) VTILE(B, 1, 4) VTILE1(B, 1)
VTILES(2)
VTILES(4)
VTILES(8)

typedef void (*vtile_fn)(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const uint8_t *const *rows,
                         const char *const *sc, const char *const *bi, dg_dtype sbt);
/* [bits 2, 4, 8][shape 4x4, 4x1, 1x4, 1x1] */
static const vtile_fn VTILE_TABLE[3][4] = {{vtile_2_4x4, vtile_2_4x1, vtile_2_1x4, vtile_2_1x1},
                                           {vtile_4_4x4, vtile_4_4x1, vtile_4_1x4, vtile_4_1x1},
                                           {vtile_8_4x4, vtile_8_4x1, vtile_8_1x4, vtile_8_1x1}};

static void vnni_rows(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, const dg_weight *w, int64_t r0,
                      int64_t rt) {
  const uint8_t *rows[4];
  const char *sc[4], *bi[4];
  for (int i = 0; i < rt; i++) dg_quant_row_ptrs(w, r0 + i, &rows[i], &sc[i], &bi[i]);
  const vtile_fn *tf = VTILE_TABLE[w->bits == 2 ? 0 : w->bits == 4 ? 1 : 2];
  int64_t t = 0;
  if (rt == 4) {
    for (; t + 4 <= T; t += 4) tf[0](y + t * ldy, ldy, xb, t0 + t, rows, sc, bi, w->sb_dtype);
    for (; t < T; t++) tf[1](y + t * ldy, ldy, xb, t0 + t, rows, sc, bi, w->sb_dtype);
    return;
  }
  for (int i = 0; i < rt; i++) {
    const uint8_t *r1[1] = {rows[i]};
    const char *s1[1] = {sc[i]}, *b1[1] = {bi[i]};
    int64_t tt = 0;
    for (; tt + 4 <= T; tt += 4) tf[2](y + tt * ldy + i, ldy, xb, t0 + tt, r1, s1, b1, w->sb_dtype);
    for (; tt < T; tt++) tf[3](y + tt * ldy + i, ldy, xb, t0 + tt, r1, s1, b1, w->sb_dtype);
  }
}

/* ---- entry points ---------------------------------------------------------- */

static int lp_kind(const dg_weight *w) {
  if (!w->bits) return w->dtype == DG_BF16 ? 1 : 0;
  return w->bits == 2 || w->bits == 4 || w->bits == 8 ? 2 : 0;
}

/* The activations of a call in the form its weight format wants, in the calling thread's
 * scratch (scratch.h: nothing to free; valid until its next low-precision product). */
typedef struct lp_x { uint16_t *xb; int64_t Kp; qx_buf q; } lp_x;

static int lp_prepare(lp_x *p, int kind, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int n_threads) {
  memset(p, 0, sizeof *p);
  if (kind == 1) {
    p->Kp = (w->cols + 31) / 32 * 32;
    p->xb = dg_kscratch(DG_KSCRATCH_LPX, (size_t)T * (size_t)p->Kp * 2); /* the calling thread's, kept */
    if (!p->xb) return -1;
    x_to_bf16(x, ldx, T, w->cols, p->Kp, p->xb, n_threads);
    return 0;
  }
  return qx_quantize(&p->q, x, ldx, T, w->cols, w->bits, w->group_size, n_threads);
}

static void lp_block(float *y, int64_t ldy, const lp_x *p, int kind, int64_t t0, int64_t T, const dg_weight *w,
                     int64_t r0, int64_t rt) {
  if (kind == 1) bf16_rows(y, ldy, p->xb + t0 * p->Kp, p->Kp, T, w, r0, rt);
  else vnni_rows(y, ldy, &p->q, t0, T, w, r0, rt);
}

static void matmul_lp(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int64_t row0,
                      int64_t N, int n_threads) {
  const int kind = lp_kind(w);
  lp_x p;
  if (!kind || T <= 0 || lp_prepare(&p, kind, x, ldx, T, w, n_threads)) { /* exact path (also when out of memory) */
    dg_kernels_avx512_impl()->matmul(y, ldy, x, ldx, T, w, row0, N, n_threads);
    return;
  }
  const int64_t nblk = (N + 3) / 4;
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t b = 0; b < nblk; b++)
    lp_block(y + b * 4, ldy, &p, kind, 0, T, w, row0 + b * 4, N - b * 4 < 4 ? N - b * 4 : 4);
}

static void matmul_grouped_lp(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *start, int E,
                              const dg_weight *w, int64_t rows_per_expert, int64_t row_off, int64_t N, int n_threads) {
  const int kind = lp_kind(w);
  const int64_t R = start[E];
  lp_x p;
  if (!kind || R <= 0 || lp_prepare(&p, kind, x, ldx, R, w, n_threads)) {
    dg_kernels_avx512_impl()->matmul_grouped(y, ldy, x, ldx, start, E, w, rows_per_expert, row_off, N, n_threads);
    return;
  }
  const int64_t nblk = (N + 3) / 4, ntask = (int64_t)E * nblk;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 8)
  for (int64_t task = 0; task < ntask; task++) {
    const int e = (int)(task / nblk);
    const int64_t n = (task % nblk) * 4, T = start[e + 1] - start[e];
    if (T <= 0) continue;
    lp_block(y + (int64_t)start[e] * ldy + n, ldy, &p, kind, start[e], T, w, (int64_t)e * rows_per_expert + row_off + n,
             N - n < 4 ? N - n : 4);
  }
}

static void matmul_rows_lp(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                           int n_threads) {
  dg_kernels_avx512_impl()->matmul_rows(y, ldy, x, ldx, T, w, n_threads); /* exact (the soft embedding) */
}

static const dg_kernels AVX512LP = {"avx512lp", matmul_lp, matmul_grouped_lp, matmul_rows_lp, dg_attn_block_avx512};
const dg_kernels *dg_kernels_avx512lp_impl(void) { return &AVX512LP; }
