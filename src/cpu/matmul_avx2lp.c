/* matmul_avx2lp.c: the opt-in low-precision products on AVX2 (DGEMMA_KERNELS=avx2lp;
 * compiled with -mavx2 -mfma -mf16c, selected only on request, on CPUs with AVX2 and
 * FMA). The AVX2 counterpart of matmul_avx512lp.c's VNNI path, for CPUs without
 * AVX-512 or AVX-VNNI: it rounds the activations, so it is never the default and the
 * golden and token-identical tests run the exact path.
 *
 * MLX affine 2/3/4/6/8-bit weights (w = q s + b, quant.h): the activations are quantized
 * once per call, per row and per weight group g of G: d_g = max_{k in g} |x_k| / Q_B,
 * qx_k = round(x_k / d_g) in [-Q_B, Q_B], x_k ~ d_g qx_k. The product splits per group:
 *   sum_{k in g} x_k w_k ~ d_g (s_g sum_k q_k qx_k + b_g sum_k qx_k)
 * with both sums exact integers and the scale/bias part in fp32.
 *
 * The integer dot products: vpmaddubsw multiplies 32 u8 codes by 32 s8 activations
 * and adds adjacent pairs into 16 s16 lanes WITH SATURATION, so a pair must stay in
 * [-32768, 32767]: 2 (2^B - 1) Q_B <= 32767. With Q = 127 that holds for B <= 7
 * (2 * 127 * 127 = 32258 for B = 7) but not for B = 8 (2 * 255 * 127 = 64770), so
 *   Q_B = 127 for B = 2, 4 and Q_8 = 64 (2 * 255 * 64 = 32640 <= 32767)
 * (8-bit weights get activations of 7 significant bits plus sign instead of 8: the
 * error term below doubles for them). The 8/B pair sums of one 32-byte step (its 8/B
 * sub-vectors, below) are added in s16 before widening: |sum| <= (8/B) 2 (2^B - 1) Q_B
 * = 3048 (B = 2), 7620 (B = 4), 32640 (B = 8), so no lane overflows. vpmaddwd with
 * ones then adds adjacent s16 pairs into 8 s32 lanes, exact, and those are summed in
 * s32 over the steps of a unit of U = max(G, 256/B) codes (one group, or the groups of
 * one step): a lane holds U/8 codes' products, |lane| <= (U/8)(2^B - 1) Q_B
 * <= 16 * 255 * 64 < 2^24, so its conversion to fp32 is exact too.
 *
 * Weight layout in registers: 32 packed bytes hold 256/B codes, code (8/B) j + s in
 * bits [B s, B s + B) of byte j (MLX's little-endian u32 stream, B = 2, 4, 8), so
 * (bytes >> B s) & (2^B - 1) gives 32 codes (sub-vector s) and the activations are
 * stored in that order. Dword lane i of a step covers 4 (8/B) consecutive codes, all in
 * one group (G >= 32), so the per-group scale s_g d_g is a per-lane fp32 vector.
 *
 * What it rounds (tests/test_kernels.c checks it against the fp32 oracle):
 *  - x -> d qx: qx = round(fl(x fl(1/d))) (a multiply: no division per element), and
 *    fl(x fl(1/d)) is within (2u + u^2) Q_B of x / d (u = 2^-24), so
 *    |d qx - x| <= d (1/2 + 2^-16) per element;
 *  - the integer sums are exact (above); the fp32 scale/bias arithmetic (s d, the
 *    products, c_g = d_g sum qx, the sums over groups, the final horizontal sum) is a
 *    few roundings per term;
 *  so |y - oracle| <= sum_g d_g (1/2 + 2^-10) sum_{k in g} |w_k|
 *                     + 2 gamma_{K+8} sum_k (2|x_k| + d_g)(|q_k s_g| + |b_g|)
 *  (the second term also covers the oracle's own dequantization and summation; the
 *  same bound as matmul_avx512lp.c's with Q_B for 127).
 * 3- and 6-bit codes straddle bytes: a step there is 32 codes in 4B bytes, unpacked to
 * bytes by vpshufb, a vpmullw per-lane shift and vpsrlw (codes36 below; pair sums at
 * most 2 * 63 * 127, so Q = 127), the activations stored in that unpacking's order,
 * and a step lies in one group. f32, f16 and bf16 weights take the exact AVX2 path
 * (bf16 products on AVX2 are the exact fp32 FMA path: AVX2 has no bf16 dot product),
 * as does matmul_rows (the soft embedding). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/scratch.h"
#include "io/quant.h"

const dg_kernels *dg_kernels_avx2_impl(void);

/* The largest activation code for B-bit weights (the saturation bound above). */
static inline int qmax_for(int B) { return B == 8 ? 64 : 127; }

/* A step's geometry: B = 2, 4, 8: 32 packed bytes, 256/B codes in 8/B sub-vectors; B =
 * 3, 6 (codes straddle bytes): 4B packed bytes, 32 codes in one sub-vector. */
static inline int odd_bits(int B) { return B == 3 || B == 6; }
static inline int nsub_for(int B) { return odd_bits(B) ? 1 : 8 / B; }
static inline int cps_for(int B) { return odd_bits(B) ? 32 : 256 / B; }

/* The byte position p of a 3/6-bit step holds code perm36(p) of the step: the order
 * vpackuswb leaves the two 16-code halves in (below). */
static inline int perm36(int p) { return p < 8 ? p : p < 16 ? p + 8 : p < 24 ? p - 8 : p; }

/* Unpacking 32 B-bit codes (B = 3, 6) of a step to bytes: code c sits at bit B c of the
 * step's little-endian bytes, in bytes j = (B c) >> 3 and j + 1, from bit s = (B c) & 7.
 * Codes 0-15 come from the 16 bytes at the step's start, codes 16-31 from the 16 bytes
 * at byte 2B (both hold every byte their codes touch: (B 15) >> 3 + 1 <= 12). Each
 * 16-byte load is broadcast to both lane halves; vpshufb puts code c's two bytes in a
 * 16-bit lane, vpmullw by 2^(16 - B - s) shifts its bits to the top (the bits above
 * fall off), vpsrlw by 16 - B brings them down: the code. vpackuswb of the two halves
 * gives 32 bytes in the order perm36. */
typedef struct unpack36 { __m256i ctrl[2], mul[2]; } unpack36;

static inline unpack36 unpack36_for(int B) {
  int8_t ctrl[2][32];
  int16_t mul[2][16];
  for (int v = 0; v < 2; v++)
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 8; l++) {
        const int c = 16 * v + 8 * h + l, j = ((B * c) >> 3) - 2 * B * v, sh = (B * c) & 7;
        ctrl[v][16 * h + 2 * l] = (int8_t)j;
        ctrl[v][16 * h + 2 * l + 1] = (int8_t)(j + 1);
        mul[v][8 * h + l] = (int16_t)(1 << (16 - B - sh));
      }
  unpack36 u;
  for (int v = 0; v < 2; v++) {
    u.ctrl[v] = _mm256_loadu_si256((const __m256i *)ctrl[v]);
    u.mul[v] = _mm256_loadu_si256((const __m256i *)mul[v]);
  }
  return u;
}

static inline __m256i codes36(const uint8_t *p, const int B, const unpack36 *u) {
  __m256i h[2];
  for (int v = 0; v < 2; v++) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * B * v)));
    h[v] = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(x, u->ctrl[v]), u->mul[v]), 16 - B);
  }
  return _mm256_packus_epi16(h[0], h[1]);
}

/* The activations of one call, quantized for one weight format (B bits, group G):
 * per row t and step of the packed weights (cps codes: 256/B, or 32 for B = 3, 6),
 * nsub vectors of 32 s8 codes in the weights' unpacking order; per row and unit of
 * U = max(G, cps) codes the 8 per-lane scales d of the lanes' groups; per row and
 * group c = d * sum qx (zero padded to a multiple of 8).
 * The buffers are the calling thread's scratch (scratch.h, DG_KSCRATCH_LPX: kept for
 * the thread's life, so a product allocates nothing once one of its size has run). */
typedef struct qx_buf {
  int B, G, nsub, cps;
  int64_t K, steps, units, ng, cstride;
  int8_t *q;  /* [T][steps][nsub][32] */
  float *dl;  /* [T][units][8] */
  float *c;   /* [T][cstride] */
} qx_buf;

static int qx_quantize(qx_buf *b, const float *x, int64_t ldx, int64_t T, int64_t K, int B, int G, int n_threads) {
  memset(b, 0, sizeof *b);
  b->B = B; b->G = G; b->nsub = nsub_for(B); b->cps = cps_for(B); b->K = K;
  const int U = G > b->cps ? G : b->cps;
  b->steps = (K + b->cps - 1) / b->cps;
  b->units = (K + U - 1) / U;
  b->ng = K / G;
  b->cstride = (b->ng + 7) / 8 * 8;
  void *part[3]; /* the calling thread's scratch, kept (scratch.h) */
  const size_t nq = (size_t)T * (size_t)b->steps * (size_t)b->nsub * 32, ndl = (size_t)T * (size_t)b->units * 8 * sizeof(float);
  if (dg_kscratch_parts(DG_KSCRATCH_LPX, 3, (const size_t[3]){nq, ndl, (size_t)T * (size_t)b->cstride * sizeof(float)}, part))
    return -1;
  b->q = part[0], b->dl = part[1], b->c = part[2];
  const int nsub = b->nsub, cps = b->cps, lane = cps / 8, Q = qmax_for(B);
  int fail = 0;
  /* parallel over rows; a call of fewer rows than threads (M = 1) stays on this thread (no wake-up) */
#pragma omp parallel num_threads(T < n_threads ? (int)T : n_threads) reduction(| : fail)
  {
    /* this thread's (scratch.h): d of each group of the row, then 1 / d */
    float *dh = dg_kscratch(DG_KSCRATCH_LPROW, (size_t)(2 * b->ng + 1) * sizeof(float));
    fail |= !dh;
    const int lg = __builtin_ctz((unsigned)G); /* G is a power of 2: k / G = k >> lg (no division per element) */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++) {
      if (!dh) continue;
      const float *xt = x + t * ldx;
      float *ct = b->c + t * b->cstride;
      /* group maxima, 8 lanes at a time (G is a multiple of 8) */
      const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      for (int64_t g = 0; g < b->ng; g++) {
        __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int k = 0; k < G; k += 8) {
          const __m256 v = _mm256_loadu_ps(xt + g * G + k);
          nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
          m = _mm256_max_ps(m, _mm256_and_ps(v, absm));
        }
        float mv[8];
        _mm256_storeu_ps(mv, m);
        float mx = 0.0f;
        for (int i = 0; i < 8; i++) mx = fmaxf(mx, mv[i]);
        /* a NaN in the group: d = NaN (1/d and the codes 0), so every output of the row is NaN, as in
         * the exact path (vmaxps would drop it) */
        dh[g] = _mm256_movemask_ps(nan) ? NAN : mx / (float)Q;
        dh[b->ng + g] = dh[g] > 0.0f ? 1.0f / dh[g] : 0.0f;
      }
      const float *inv = dh + b->ng;
      memset(ct, 0, (size_t)b->cstride * sizeof(float));
      const __m256 qhi = _mm256_set1_ps((float)Q), qlo = _mm256_set1_ps((float)-Q);
      for (int64_t st = 0; st < b->steps; st++) {
        int8_t *qs = b->q + ((size_t)t * (size_t)b->steps + (size_t)st) * (size_t)nsub * 32;
        const int64_t k0 = st * cps, n = K - k0 < cps ? K - k0 : cps; /* n: a multiple of 32 */
        /* the step's codes in natural order: round(x * (1/d)) clamped to [-Q, Q] (vroundps: to
         * nearest even, as nearbyintf; 8 codes share a group), zero past K */
        int32_t qn[256];
        for (int64_t kk = 0; kk < cps; kk += 8) {
          __m256i v = _mm256_setzero_si256();
          if (kk < n) {
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xt + k0 + kk),
                                                           _mm256_set1_ps(inv[(k0 + kk) >> lg])),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, qhi), qlo));
          }
          _mm256_storeu_si256((__m256i *)(qn + kk), v);
        }
        /* into the weights' unpacking order, summing each group's codes (exact integers) */
        int32_t gs[8] = {0}; /* the step's groups: at most cps / 32 = 4 */
        for (int j = 0; j < 32; j++)
          for (int sub = 0; sub < nsub; sub++) {
            const int kk = odd_bits(B) ? perm36(j) : nsub * j + sub;
            qs[sub * 32 + j] = (int8_t)qn[kk];
            gs[kk >> 5] += qn[kk];
          }
        for (int64_t kk = 0; kk < n; kk += 32) ct[(k0 + kk) >> lg] += (float)gs[kk >> 5]; /* exact: |sum| <= 127 G < 2^24 */
      }
      for (int64_t un = 0; un < b->units; un++) {
        float *dl = b->dl + ((size_t)t * (size_t)b->units + (size_t)un) * 8;
        const int64_t k0 = un * U;
        for (int i = 0; i < 8; i++) {
          const int64_t k = U == G ? k0 : k0 + (int64_t)i * lane; /* G >= cps: one group per unit */
          dl[i] = k < K ? dh[k / G] : 0.0f;
        }
      }
      for (int64_t g = 0; g < b->ng; g++) ct[g] *= dh[g];
    }
  }
  return fail ? -1 : 0;
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

/* The scale lanes of a unit starting at group g0: one group (broadcast) or gpu groups
 * of 8/gpu lanes each (groups past ng clamped: their activations are zero). */
static inline __m256 unit_scales(dg_dtype sbt, const char *sc, int64_t g0, int gpu, int64_t ng) {
  if (gpu == 1) return _mm256_set1_ps(dg_load_elem(sbt, sc, g0));
  float v[8];
  for (int i = 0; i < 8; i++) {
    int64_t g = g0 + i / (8 / gpu);
    v[i] = dg_load_elem(sbt, sc, g < ng ? g : ng - 1);
  }
  return _mm256_loadu_ps(v);
}

/* The register tiles: RT_MAX = 4 weight rows x TT = 8, 4, 2 or 1 activation rows; the 4
 * x 8 accumulators do not fit the 16 ymm registers and live in L1, but the unpacked
 * codes of a row are reused 8 times (measured on the 2-core EPYC: 4 x 8 beat 4 x 2 by
 * 1.2-1.3x at M = 8..64). Each weight row's stream is prefetched one block ahead (the
 * same offset of the row RT_MAX rows on: the block this thread takes next), which
 * took M = 1 from 3.0 to 4.6 GB/s and M = 8 from ~1.9 to ~1.4 ms on one core. */
#define RT_MAX 4
#define TT_MAX 8

/* RT (<= RT_MAX) weight rows x TT (<= TT_MAX) activation rows of B-bit, group-G weights:
 * y[j ldy + i] for the rows' packed codes rows[i], scales sc[i], biases bi[i] and the
 * activations t0 + j of xb. Every output element goes through the same operations in
 * the same order whatever the tile, so results do not depend on T or on the entry. */
static inline __attribute__((always_inline)) void vtile(const int B, const int G, const int RT, const int TT, float *y,
                                                        int64_t ldy, const qx_buf *xb, int64_t t0,
                                                        const uint8_t *const *rows, const char *const *sc,
                                                        const char *const *bi, dg_dtype sbt) {
  const int nsub = nsub_for(B), cps = cps_for(B), U = G > cps ? G : cps, spu = U / cps, gpu = U / G;
  const int sb = cps * B / 8;                     /* packed bytes per step */
  const int need = odd_bits(B) ? 2 * B + 16 : 32; /* bytes a step's loads touch */
  uint8_t tail[32]; /* a copy of a row's last bytes (zero past them) */
  unpack36 u36;
  if (odd_bits(B)) u36 = unpack36_for(B);
  else memset(&u36, 0, sizeof u36);
  const int64_t steps = xb->steps, units = xb->units, rb = xb->K * B / 8, ng = xb->ng;
  const __m256i bm = _mm256_set1_epi8((char)((1 << B) - 1)), ones = _mm256_set1_epi16(1);
  const int8_t *xq[TT_MAX];
  const float *xd[TT_MAX], *xc[TT_MAX];
#pragma GCC unroll 8
  for (int j = 0; j < TT; j++) {
    xq[j] = xb->q + (size_t)(t0 + j) * (size_t)steps * (size_t)nsub * 32;
    xd[j] = xb->dl + (size_t)(t0 + j) * (size_t)units * 8;
    xc[j] = xb->c + (t0 + j) * xb->cstride;
  }
  __m256 acc[RT_MAX][TT_MAX];
#pragma GCC unroll 4
  for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) acc[i][j] = _mm256_setzero_ps();
  for (int64_t un = 0; un < units; un++) {
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++) {
      __m256i isum[TT_MAX];
#pragma GCC unroll 8
      for (int j = 0; j < TT; j++) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int su = 0; su < spu; su++) {
        const int64_t st = un * spu + su, byte0 = st * sb;
        const uint8_t *src = rows[i] + byte0;
        if (rb - byte0 < need) { /* the row's last steps: no read past the row */
          memset(tail, 0, sizeof tail);
          memcpy(tail, src, (size_t)(rb - byte0 < 32 ? rb - byte0 : 32));
          src = tail;
        }
        _mm_prefetch((const char *)rows[i] + byte0 + RT_MAX * rb, _MM_HINT_T0);
        __m256i wc[8];
        if (odd_bits(B)) wc[0] = codes36(src, B, &u36);
        else {
          const __m256i raw = _mm256_loadu_si256((const __m256i *)src);
#pragma GCC unroll 8
          for (int u = 0; u < nsub; u++) wc[u] = B == 8 ? raw : _mm256_and_si256(_mm256_srli_epi16(raw, B * u), bm);
        }
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++) {
          const __m256i *xv = (const __m256i *)(xq[j] + (size_t)st * (size_t)nsub * 32);
          __m256i p = _mm256_maddubs_epi16(wc[0], _mm256_load_si256(xv));
#pragma GCC unroll 8
          for (int u = 1; u < nsub; u++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wc[u], _mm256_load_si256(xv + u)));
          isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, ones));
        }
      }
      const __m256 s = unit_scales(sbt, sc[i], un * U / G, gpu, ng);
#pragma GCC unroll 8
      for (int j = 0; j < TT; j++)
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(s, _mm256_load_ps(xd[j] + un * 8)),
                                    acc[i][j]);
    }
  }
  /* the bias part: sum_g b_g d_g sum_k qx_k, 8 groups at a time; the last, partial 8
   * from a zero-padded copy of the biases (c is zero past ng), so no scalar tail */
  for (int64_t g = 0; g < ng; g += 8) {
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++) {
      __m256 b;
      if (g + 8 > ng) {
        float v[8] = {0};
        for (int64_t h = g; h < ng; h++) v[h - g] = dg_load_elem(sbt, bi[i], h);
        b = _mm256_loadu_ps(v);
      } else if (sbt == DG_BF16)
        b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(bi[i] + 2 * g))), 16));
      else if (sbt == DG_F16) b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bi[i] + 2 * g)));
      else b = _mm256_loadu_ps((const float *)bi[i] + g);
#pragma GCC unroll 8
      for (int j = 0; j < TT; j++) acc[i][j] = _mm256_fmadd_ps(b, _mm256_load_ps(xc[j] + g), acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) y[j * ldy + i] = hsum8(acc[i][j]);
}

typedef void (*vtile_fn)(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const uint8_t *const *rows,
                         const char *const *sc, const char *const *bi, dg_dtype sbt);
#define VT(B, G, RT, TT) VT_(B, G, RT, TT)
#define VT_(B, G, RT, TT)                                                                                       \
  static void vt_##B##_##G##_##RT##x##TT(float *y, int64_t ldy, const qx_buf *xb, int64_t t0,                  \
                                         const uint8_t *const *rows, const char *const *sc,                     \
                                         const char *const *bi, dg_dtype sbt) {                                 \
    vtile(B, G, RT, TT, y, ldy, xb, t0, rows, sc, bi, sbt);                                                     \
  }
#define VTG(B, G) VT(B, G, 4, 8) VT(B, G, 4, 4) VT(B, G, 4, 2) VT(B, G, 4, 1) VT(B, G, 1, 8) VT(B, G, 1, 4) VT(B, G, 1, 2) VT(B, G, 1, 1)
#define VTB(B) VTG(B, 32) VTG(B, 64) VTG(B, 128)
VTB(2)
VTB(3)
VTB(4)
VTB(6)
VTB(8)
#define VROW(B, G)                                                                                        \
  {vt_##B##_##G##_4x8, vt_##B##_##G##_4x4, vt_##B##_##G##_4x2, vt_##B##_##G##_4x1,                          \
   vt_##B##_##G##_1x8, vt_##B##_##G##_1x4, vt_##B##_##G##_1x2, vt_##B##_##G##_1x1}
#define VROWS(B) {VROW(B, 32), VROW(B, 64), VROW(B, 128)}
/* [bits 2, 3, 4, 6, 8][group 32, 64, 128][shape 4x8, 4x4, 4x2, 4x1, 1x8, 1x4, 1x2, 1x1] */
static const vtile_fn VTILE_TABLE[5][3][8] = {VROWS(2), VROWS(3), VROWS(4), VROWS(6), VROWS(8)};

static void lp_rows(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, const dg_weight *w, int64_t r0,
                    int64_t rt) {
  const uint8_t *rows[RT_MAX];
  const char *sc[RT_MAX], *bi[RT_MAX];
  for (int i = 0; i < rt; i++) dg_quant_row_ptrs(w, r0 + i, &rows[i], &sc[i], &bi[i]);
  const vtile_fn *tf = VTILE_TABLE[w->bits == 2 ? 0 : w->bits == 3 ? 1 : w->bits == 4 ? 2 : w->bits == 6 ? 3 : 4]
                                  [w->group_size == 32 ? 0 : w->group_size == 64 ? 1 : 2];
  /* activation rows 8 at a time, the tail 4, 2, 1 at a time (at most 3 narrow tiles) */
  if (rt == RT_MAX) {
    for (int64_t t = 0; t < T;) {
      const int64_t n = T - t >= 8 ? 8 : T - t >= 4 ? 4 : T - t >= 2 ? 2 : 1;
      tf[n == 8 ? 0 : n == 4 ? 1 : n == 2 ? 2 : 3](y + t * ldy, ldy, xb, t0 + t, rows, sc, bi, w->sb_dtype);
      t += n;
    }
    return;
  }
  for (int i = 0; i < rt; i++) {
    const uint8_t *r1[1] = {rows[i]};
    const char *s1[1] = {sc[i]}, *b1[1] = {bi[i]};
    for (int64_t t = 0; t < T;) {
      const int64_t n = T - t >= 8 ? 8 : T - t >= 4 ? 4 : T - t >= 2 ? 2 : 1;
      tf[n == 8 ? 4 : n == 4 ? 5 : n == 2 ? 6 : 7](y + t * ldy + i, ldy, xb, t0 + t, r1, s1, b1, w->sb_dtype);
      t += n;
    }
  }
}

/* ---- entry points ---------------------------------------------------------- */

/* Whether the int8 path takes w: MLX affine 2/3/4/6/8 bits, group 32/64/128. */
static int lp_takes(const dg_weight *w) {
  return (w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 6 || w->bits == 8) &&
         (w->group_size == 32 || w->group_size == 64 || w->group_size == 128);
}

static void matmul_lp(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int64_t row0,
                      int64_t N, int n_threads) {
  qx_buf q;
  if (!lp_takes(w) || T <= 0 || qx_quantize(&q, x, ldx, T, w->cols, w->bits, w->group_size, n_threads)) {
    dg_kernels_avx2_impl()->matmul(y, ldy, x, ldx, T, w, row0, N, n_threads); /* exact (also out of memory) */
    return;
  }
  /* tasks of CHUNK blocks of RT_MAX weight rows (64 rows: 88 KB of 4-bit codes at K =
   * 2816, in the L2); inside a task, TT_MAX activation rows at a time (22 KB of int8 at
   * K = 2816, in the L1) go through every block, so neither is read again from farther
   * away. The tiles are those lp_rows would use (8-row slices, then its 8/4/2/1 split),
   * and no element's operations depend on the tile anyway. */
  const int64_t nblk = (N + RT_MAX - 1) / RT_MAX, CHUNK = 16, nch = (nblk + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t c = 0; c < nch; c++)
    for (int64_t t = 0; t < T; t += TT_MAX)
      for (int64_t b = c * CHUNK; b < nblk && b < (c + 1) * CHUNK; b++) {
        const int64_t n = b * RT_MAX;
        lp_rows(y + t * ldy + n, ldy, &q, t, T - t < TT_MAX ? T - t : TT_MAX, w, row0 + n, N - n < RT_MAX ? N - n : RT_MAX);
      }
}

static void matmul_grouped_lp(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *start, int E,
                              const dg_weight *w, int64_t rows_per_expert, int64_t row_off, int64_t N, int n_threads) {
  const int64_t R = start[E];
  qx_buf q;
  if (!lp_takes(w) || R <= 0 || qx_quantize(&q, x, ldx, R, w->cols, w->bits, w->group_size, n_threads)) {
    dg_kernels_avx2_impl()->matmul_grouped(y, ldy, x, ldx, start, E, w, rows_per_expert, row_off, N, n_threads);
    return;
  }
  /* tasks of (expert, CHUNK blocks), walked as in matmul_lp (dynamic: experts carry
   * different numbers of rows) */
  const int64_t nblk = (N + RT_MAX - 1) / RT_MAX, CHUNK = 16, nch = (nblk + CHUNK - 1) / CHUNK, ntask = (int64_t)E * nch;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < ntask; task++) {
    const int e = (int)(task / nch);
    const int64_t c = task % nch, T = start[e + 1] - start[e];
    for (int64_t t = 0; t < T; t += TT_MAX)
      for (int64_t b = c * CHUNK; b < nblk && b < (c + 1) * CHUNK; b++) {
        const int64_t n = b * RT_MAX;
        lp_rows(y + ((int64_t)start[e] + t) * ldy + n, ldy, &q, start[e] + t, T - t < TT_MAX ? T - t : TT_MAX, w,
                (int64_t)e * rows_per_expert + row_off + n, N - n < RT_MAX ? N - n : RT_MAX);
      }
  }
}

static void matmul_rows_lp(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                           int n_threads) {
  dg_kernels_avx2_impl()->matmul_rows(y, ldy, x, ldx, T, w, n_threads); /* exact (the soft embedding) */
}

static const dg_kernels AVX2LP = {"avx2lp", matmul_lp, matmul_grouped_lp, matmul_rows_lp, NULL};
const dg_kernels *dg_kernels_avx2lp_impl(void) { return &AVX2LP; }
