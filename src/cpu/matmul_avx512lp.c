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
 * activations are stored in that order. Two layouts (qx_buf): by step, dword
 * lane i of a 64-byte step covers 4 (8/B) consecutive codes, all in one group
 * (G >= 32), so each step's int32 sums are scaled by a per-lane s_g d_g vector;
 * transposed (a group of at most 8 dwords, and at least 14 groups a row), each
 * block of 16 groups is transposed in registers so that each lane sees one group
 * only: its int32 sum is the group's whole integer dot product, scaled once (calls of fewer
 * than 4 rows at 8 dwords a group skip the weights' transpose: per-step sums, then a
 * reduction tree to the same lanes; the same integers, so the same bits).
 * Either way there is no horizontal sum per group, one per output.
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
#include "backend/switches.h"

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

/* The activations of one call, quantized for one weight format (B bits, group G),
 * in one of two layouts matching the kernels below:
 *  - transposed (n = G B / 32 dwords of packed weights per group is 2, 4 or 8, and the
 *    row's last block of 16 groups at most 1/8 empty: tr_n = n): per row t and block of 16
 *    groups (16 G codes, n 64-byte vectors of packed weights), q[t][blk][m][u][64]: sub-step
 *    m < n, plane u < nsub = 8/B; dword lane l holds the 4 codes that meet byte u of packed
 *    dword m of group TR_GROUP[n][l] (tr_dwords), and dp the d of that group per lane;
 *  - natural (nat: a transposed format with n = 8, in a call of fewer than 4 activation rows,
 *    so that only the one-row tiles run: NTILE below): as transposed but each block's n 64-byte
 *    steps in the weights' stream order, q[t][blk][m][u][64] = the nsub planes of step m
 *    (qx_unpack_order), not transposed; dp as transposed;
 *  - by step (otherwise: 4-bit g128, 8-bit g64/g128, fewer than 14 groups; tr_n = 0): per row t and 64-byte
 *    step of the packed weights (cps = 512/B codes), nsub vectors of 64 s8 codes in the
 *    weights' unpacking order, and dl, the per-lane scale d of the lane's group.
 * Both: per group d (dg) and c = d * sum qx. The buffers are the calling thread's scratch
 * (scratch.h, DG_KSCRATCH_LPX: kept for the thread's life, so a product allocates nothing
 * once one of its size has run). */
typedef struct qx_buf {
  int B, G, nsub, cps, tr_n;
  int nat;     /* transposed formats with n = 8, calls of < 4 rows: the codes in natural order (below) */
  int64_t K, steps, ng, nblk;
  int8_t *q;   /* transposed and natural: [T][nblk][n][nsub][64]; by step: [T][steps][nsub][64] */
  float *dl;   /* by step only: [T][steps][16] */
  float *c;    /* [T][ng + 15] (zero padded to a multiple of 16) */
  float *dg;   /* [T][ng + 15]: d of each group, zero padded like c */
  float *dp;   /* transposed only: [T][ng + 15], dg in each block's lane order (TR_GROUP) */
  int64_t cstride;
  const float *x; /* the call's activations (stride ldx), for the exact fallback of vnni_rows */
  int64_t ldx;
  /* The AMX path's copy (amx_tiles below; NULL when the call does not take it), in the calling thread's scratch
   * (DG_KSCRATCH_AMXX): qa [ng][16][tpad][4], row t's codes of group g in TDPBUSD's B layout (dword kk of row t at
   * qa + ((g * 16 + kk) * tpad + t) * 4: the group's codes in the order of the weights' A rows, amx_prep_w), so that
   * any 16 consecutive rows are one B tile (stride 4 tpad bytes); dpT, xcT [nblk][16][tpad]: dp and c of row t in
   * lane l of block blk at (blk * 16 + l) * tpad + t; tpad >= T + 16, the rows past T zero. */
  int8_t *qa;
  float *dpT, *xcT;
  int64_t tpad;
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

/* Transposes n (2, 4 or 8) vectors of dwords in place so that each lane sees one group:
 * in v[k] lane l is dword D[16 k + l] of a block whose group g holds dwords D[n g .. n g + n);
 * after, v[m] lane l = D[n TR_GROUP[n][l] + m]. In-lane unpacks (the 4 x 4 dword transpose
 * of each 128-bit chunk: vpunpck{l,h}dq then vpunpck{l,h}qdq, n of each) and, for n = 8,
 * n vpermt2q that pair the 128-bit chunks (an 8 x 8 transpose in each 256-bit half: the low
 * halves hold the even groups, the high halves the odd ones); n = 2: 2 vshufps. */
static const int32_t TR_GROUP[3][16] = {{0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15}, /* n = 2 */
                                        {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15}, /* n = 4 */
                                        {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15}}; /* n = 8 */
static inline __attribute__((always_inline)) void tr_dwords(__m512i *v, int n) {
  if (n == 2) {
    const __m512 a = _mm512_castsi512_ps(v[0]), b = _mm512_castsi512_ps(v[1]);
    v[0] = _mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    v[1] = _mm512_castps_si512(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    return;
  }
  __m512i t[8], u[8];
  _Pragma("GCC unroll 8") for (int p = 0; p < n / 2; p++) {
    t[2 * p] = _mm512_unpacklo_epi32(v[2 * p], v[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(v[2 * p], v[2 * p + 1]);
  }
  _Pragma("GCC unroll 8") for (int q = 0; q < n / 4; q++) {
    u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  if (n == 4) {
    _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) v[m] = u[m];
    return;
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
    v[m] = _mm512_permutex2var_epi64(u[m], lo, u[m + 4]);
    v[m + 4] = _mm512_permutex2var_epi64(u[m], hi, u[m + 4]);
  }
}
static inline int tr_index(int n) { return n == 2 ? 0 : n == 4 ? 1 : 2; }

/* The transposed layout of one row's codes qn (natural order, zero past the last group):
 * each block's packed-order planes (qx_unpack_order, per 64-byte weight vector) transposed
 * as the weights will be (tr_dwords: it moves whole dwords, and the unpacking works per
 * byte, so codes and weights stay paired). */
static void qx_store_transposed(int8_t *q, const int8_t *qn, const qx_buf *b) {
  const int n = b->tr_n, nsub = b->nsub;
  int8_t tmp[8 * 4 * 64] __attribute__((aligned(64))); /* [k < n][u < nsub][64] */
  for (int64_t blk = 0; blk < b->nblk; blk++) {
    const int8_t *src = qn + blk * 16 * b->G;
    int8_t *dst = q + blk * 16 * b->G;
    for (int k = 0; k < n; k++) qx_unpack_order(tmp + k * nsub * 64, src + k * nsub * 64, nsub);
    for (int u = 0; u < nsub; u++) {
      __m512i v[8];
      for (int k = 0; k < n; k++) v[k] = _mm512_load_si512(tmp + (k * nsub + u) * 64);
      if (n == 2) tr_dwords(v, 2); /* n a constant in each call: the rounds unrolled */
      else if (n == 4) tr_dwords(v, 4);
      else tr_dwords(v, 8);
      for (int m = 0; m < n; m++) _mm512_store_si512(dst + (m * nsub + u) * 64, v[m]);
    }
  }
}

/* The 64 bytes of v even first, then odd (vpmovwb of the words and of the words shifted right by 8). */
static inline __m512i amx_deinterleave(__m512i v) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(v)), _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 8)), 1);
}

/* Quantizes x [T, K] (stride ldx) per row and group of G into b (layouts above; natural where
 * the format allows it and T_max, the most rows any tile meets, is below 4), with the calling
 * thread's scratch. Returns 0, or -1 when out of memory. */
static int qx_quantize(qx_buf *b, const float *x, int64_t ldx, int64_t T, int64_t T_max, int64_t K, int B, int G,
                       int n_threads, int amx) {
  b->qa = NULL; b->dpT = b->xcT = NULL; b->tpad = 0;
  b->B = B; b->G = G; b->nsub = 8 / B; b->cps = 512 / B; b->K = K; b->x = x; b->ldx = ldx;
  b->steps = (K + b->cps - 1) / b->cps;
  b->ng = K / G;
  b->nblk = (b->ng + 15) / 16;
  /* transposed when a group is at most 8 dwords and the last block's unused lanes are at
   * most 1/8 of all (they cost the same as used ones: 11 groups, as the 26B's down product
   * at g64, would waste 5 of 16): dg_lp_tr_n, which the default pack's choice shares (kernels.h) */
  b->tr_n = dg_lp_tr_n(K, B, G);
  b->nat = b->tr_n == 8 && T_max < 4;
  b->cstride = (b->ng + 15) / 16 * 16;
  void *part[5]; /* the calling thread's scratch, kept (scratch.h) */
  const size_t rowq = b->tr_n ? (size_t)b->nblk * 16 * (size_t)G : (size_t)b->steps * (size_t)b->nsub * 64;
  const size_t nq = (size_t)T * rowq, ndl = b->tr_n ? 0 : (size_t)T * (size_t)b->steps * 16 * sizeof(float);
  const size_t nc = (size_t)T * (size_t)b->cstride * sizeof(float);
  if (dg_kscratch_parts(DG_KSCRATCH_LPX, 5, (const size_t[5]){nq, ndl, nc, nc, b->tr_n ? nc : 0}, part)) return -1;
  b->q = part[0], b->dl = part[1], b->c = part[2], b->dg = part[3], b->dp = part[4];
  if (amx) { /* the AMX copy: B = 4, G = 64, transposed (amx_wanted) */
    b->tpad = (T + 31) / 16 * 16;
    const size_t nqa = (size_t)b->ng * 64 * (size_t)b->tpad, nf = (size_t)b->nblk * 16 * (size_t)b->tpad * sizeof(float);
    void *pa[3];
    if (dg_kscratch_parts(DG_KSCRATCH_AMXX, 3, (const size_t[3]){nqa, nf, nf}, pa)) return -1;
    b->qa = pa[0], b->dpT = pa[1], b->xcT = pa[2];
    memset(b->qa, 0, nqa); /* the rows past T (and their dp, c) zero */
    memset(b->dpT, 0, nf);
    memset(b->xcT, 0, nf);
  }
  const int nsub = b->nsub, cps = b->cps, lane = cps / 16;
  int fail = 0;
  /* 16 lanes at a time (G is a multiple of 32: a vector never spans two groups), the same
   * operations as one element at a time: the group maximum of |x| (vmaxps with x first:
   * a NaN x leaves the maximum as fmaxf does; a group holding a NaN gets d = NaN instead,
   * so that the NaN reaches y as in the exact kernels), d = max / 127, qx = round(x / d) (a true
   * division, vrndscaleps to nearest even as nearbyintf) clamped to [-127, 127], the
   * group's sum of qx exact in int32; then the codes in the kernels' layout. */
#pragma omp parallel num_threads(T < n_threads ? (int)T : n_threads) reduction(| : fail)
  {
    /* this thread's: the row's codes in natural order, zero past the last group */
    int8_t *qn = dg_kscratch(DG_KSCRATCH_LPROW, rowq);
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
        __mmask16 nan = 0;
        for (int k = 0; k < G; k += 16) {
          const __m512 v = _mm512_loadu_ps(xt + g * G + k);
          nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          m = _mm512_max_ps(_mm512_and_ps(v, absm), m);
        }
        /* a NaN in the group: d = NaN (codes 0), so every output of the row is NaN, as in the exact path */
        const float d = nan ? NAN : _mm512_reduce_max_ps(m) / 127.0f;
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
      memset(qn + b->ng * G, 0, rowq - (size_t)(b->ng * G));
      if (b->qa) { /* the AMX copy: each group's 64 codes even k first, then odd (the A rows' order), dword kk of them
                    * to row kk of the group's B rows, column t */
        const __m512i kk = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int)b->tpad));
        for (int64_t g = 0; g < b->ng; g++)
          _mm512_i32scatter_epi32(b->qa + (size_t)g * 64 * (size_t)b->tpad + (size_t)t * 4, kk,
                                  amx_deinterleave(_mm512_loadu_si512(qn + g * 64)), 4);
        const int32_t *pg = TR_GROUP[tr_index(b->tr_n)];
        for (int64_t g = 0; g < b->nblk * 16; g++) {
          b->dpT[g * b->tpad + t] = dt[g - g % 16 + pg[g % 16]];
          b->xcT[g * b->tpad + t] = ct[g];
        }
      }
      if (b->tr_n) {
        if (b->nat) /* a block's n steps are n consecutive 64-byte steps of the row (16 G = n cps) */
          for (int64_t st = 0; st < b->nblk * b->tr_n; st++) qx_unpack_order(b->q + (size_t)t * rowq + st * nsub * 64, qn + st * cps, nsub);
        else qx_store_transposed(b->q + (size_t)t * rowq, qn, b);
        const int32_t *pg = TR_GROUP[tr_index(b->tr_n)];
        for (int64_t g = 0; g < b->cstride; g++) b->dp[t * b->cstride + g] = dt[g - g % 16 + pg[g % 16]];
        continue;
      }
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

/* The weight rows a tile reads (up to 4), in the MLX layout or in the weight's pack (cpu/pack.c):
 * byte o (a multiple of 64 below rbf, the row's bytes in whole 64-byte steps) of row i's codes is
 * at row[i] + (o << ls), ls = 0 in the MLX layout, 2 in the pack (4 rows interleaved 64 bytes at a
 * time); a partial last step's bytes (o = rbf) at tail[i] (row[i] + rbf in the MLX layout, after
 * the 4 rows' whole steps in the pack); sc[i], bi[i]: the row's scales and biases (contiguous in
 * both). Either way the tiles load the same codes, scales and biases, so they give the same bits.
 * pf, pf1: bytes from a code address to the one its tile prefetches (0 = none), the same row of a
 * later 4-row block: PF_ROWS rows on for the tiles of 4 activation rows, PF1_ROWS (MLX) or
 * PK1_BLOCKS / PK1S_BLOCKS blocks (pack) for the one-row tiles; pfs1: the same for the one-row
 * tiles' scales and biases. */
typedef struct lp_rows {
  const uint8_t *row[4], *tail[4];
  const char *sc[4], *bi[4];
  dg_dtype sbt;
  int ls;
  int64_t rbf, pf, pf1, pfs1;
} lp_rows;
/* The tiles' view of an lp_rows: the scales' and biases' fields (LP_SB_LOCALS) or all of them
 * (LP_ROWS_LOCALS) as locals; WADDR(i, o): byte o of row i, o < rbf (a whole step); WADDRP(i, o):
 * any step's, the partial last one's too. */
#define LP_SB_LOCALS                                                                                         \
  const char *const *sc = wr->sc, *const *bi = wr->bi;                                                       \
  const dg_dtype sbt = wr->sbt;
#define LP_ROWS_LOCALS                                                                                       \
  LP_SB_LOCALS                                                                                               \
  const uint8_t *const *rows = wr->row, *const *tails = wr->tail;                                            \
  const int ls = wr->ls;                                                                                     \
  const int64_t rbf = wr->rbf;
#define WADDR(i, o) (rows[i] + ((int64_t)(o) << ls))
#define WADDRP(i, o) ((o) < rbf ? WADDR(i, o) : tails[i])

/* The one-activation-row tiles also prefetch the scales and biases of their rows (wr->pfs1
 * bytes on, sbrow bytes a row), once per tile. */
static inline void pf_sb(const lp_rows *wr, int rt, int64_t sbrow) {
  if (!wr->pfs1) return;
  for (int i = 0; i < rt; i++)
    for (int64_t off = 0; off < sbrow + 63; off += 64) {
      const int64_t o = wr->pfs1 + (off < sbrow ? off : sbrow - 1);
      _mm_prefetch(wr->sc[i] + o, PF1_HINT);
      _mm_prefetch(wr->bi[i] + o, PF1_HINT);
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
/* LS: the code addresses' shift (lp_rows.ls) as a constant, 0 (MLX layout) or 2 (pack), so that
 * the step addresses are pointer increments (these tiles are compute bound: a shift by a
 * variable, an add and a compare per load and row cost ~10 % at M = 8 on the down product). */
#define VTILE(B, RT, TT, LS, NAME)                                                                           \
  static void NAME(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, const int8_t *pw) { \
    LP_SB_LOCALS                                                                                             \
    const uint8_t *const *rows = wr->row, *const *tails = wr->tail;                                          \
    const int64_t rbf = wr->rbf;                                                                             \
    enum { ls = LS };                                                                                        \
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
        const uint8_t *wp = WADDRP(i, byte0);                                                                \
        const __m512i raw = _mm512_maskz_loadu_epi8(lm, wp);                                                 \
        if (wr->pf) _mm_prefetch((const char *)wp + wr->pf, PF_HINT); /* the next block's row */             \
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
  static void vtile_##B##_##RT##x1(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr,   \
                                   const int8_t *pw) {                                                       \
    enum { TT = 1 };                                                                                         \
    LP_ROWS_LOCALS                                                                                           \
    VTILE_PROLOGUE(B)                                                                                        \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)steps * (size_t)nsub * 64;                               \
    const float *xg = xb->dg + t0 * xb->cstride, *xc[1] = {xb->c + t0 * xb->cstride};                        \
    __m512 acc[RT][1];                                                                                       \
    UNROLL for (int i = 0; i < RT; i++) acc[i][0] = _mm512_setzero_ps();                                     \
    pf_sb(wr, RT, ng * (sbt == DG_F32 ? 4 : 2));                                                             \
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
          const uint8_t *wp = WADDRP(i, byte0);                                                              \
          const __m512i raw = _mm512_maskz_loadu_epi8(lm, wp);                                               \
          if (wr->pf1) _mm_prefetch((const char *)wp + wr->pf1, PF1_HINT);                                   \
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
#define VTILES(B)                                                                                            \
  VTILE(B, 4, 4, 0, vtile_##B##_4x4) VTILE1(B, 4) VTILE(B, 1, 4, 0, vtile_##B##_1x4) VTILE1(B, 1)               \
  VTILE(B, 4, 4, 2, vtilepk_##B##_4x4) VTILE(B, 1, 4, 2, vtilepk_##B##_1x4)
VTILES(2)
VTILES(4)
VTILES(8)

/* The transposed layout (qx_buf: n = G B / 32 = N dwords per group, 2, 4 or 8): per block
 * of 16 groups each row's N packed vectors are transposed (tr_dwords) so that dword lane l
 * holds group g = TR_GROUP[N][l] only. The int32 sum of lane l over the block's N sub-steps
 * and nsub planes is then group g's exact sum_k q_k qx_k (|sum| <= G 255 127 < 2^24: its
 * fp32 conversion is exact too), and each lane takes one scaled term per block, (s_g d_g)
 * (sum), in block order: fp32 s_g d_g (one rounding; s permuted to the lanes, d from dp),
 * then an FMA. Every tile shape does these same
 * operations per lane, so a row's bits do not depend on the tile (or the batch) it ran in.
 * Lanes past the last group load zero codes, s = d = 0. The loads of a partial last block
 * are masked (never past the row).
 * t_load: row's block blk, transposed, into v[0 .. N); t_unpack: plane u of one of them. */
static inline __attribute__((always_inline)) void t_load(__m512i *v, int N, const lp_rows *wr, int i, int ls, int64_t blk,
                                                         int64_t rb, int64_t pf) {
  const uint8_t *row = wr->row[i]; /* ls: wr->ls, a constant in each tile (LS) */
  const int64_t byte0 = blk * N * 64;
  const int full = byte0 + 64 * N <= rb; /* all blocks but a partial last one */
  _Pragma("GCC unroll 8") for (int k = 0; k < N; k++) {
    const int64_t r = rb - byte0 - 64 * k;
    const __mmask64 lm = r >= 64 ? ~(__mmask64)0 : r <= 0 ? 0 : (((__mmask64)1 << r) - 1);
    const uint8_t *a = full || r >= 64 ? row + ((byte0 + 64 * k) << ls) : wr->tail[i]; /* lp_rows */
    v[k] = full ? _mm512_loadu_si512(a) : _mm512_maskz_loadu_epi8(lm, a);
    if (pf) _mm_prefetch((const char *)a + pf, PF_HINT); /* a later block's row */
  }
  tr_dwords(v, N);
}
static inline __attribute__((always_inline)) __m512i t_unpack(__m512i v, int B, int u) {
  return B == 8 ? v : _mm512_and_si512(_mm512_srli_epi16(v, B * u), _mm512_set1_epi8((char)((1 << B) - 1)));
}
/* TPREP_PLANES (compile time, default 0): the prepared rows pw (TPREP, il_prep) hold each packed vector's NSUB
 * planes unpacked (one 64-byte vector a plane: 8 / B times the bytes) instead of the packed vector, so that the tiles
 * on prepared rows load their codes instead of unpacking them (4-bit: the high plane's shift and both planes' AND
 * leave the 4x4 tile's inner loop). The same integers, so the same bits (test_kernels: 23 rows in one call = 23
 * one-row calls, the interleaved pack; both pass at 1, and fail with the plane index mutated in either tile). Session
 * 31, Intel Xeon VM (AMX; 2 cores), side by side, -t 2, five alternations, gate/up [1408, 2816] 4-bit g64 GFLOP/s
 * medians 0 / 1: M = 16 391 / 409, 64 507 / 531, 256 531 / 571, per-round ratios' medians 1.03x, 1.06x, 1.08x (one
 * round disturbed: 0.69-0.82x; docs/results/cpu-s31/planes_t2); an earlier text of the same change 1.04x, 1.12x, 1.05x
 * (planes_t2_prelim); M = 1, 8 and the down product, which take other tiles, 0.98-1.02x. Against ggml's AMX q4_K in
 * the same runs 1.14-1.19x / 1.18-1.19x / 1.11-1.12x (0: 1.13-1.22x, 1.04-1.12x, 1.06-1.07x): not issue 17's 1.2x. Off by
 * default: session 16 measured unpacked codes in pw slower on the Zen 4 EPYC (with the per-row tile then; comment at
 * TPREP_MIN_T), and no AMD CPU was at hand to measure this tile. With 0 the code is the code before the option. */
#ifndef TPREP_PLANES
#define TPREP_PLANES 0
#endif
#define PL(B) (TPREP_PLANES ? 8 / (B) : 1) /* 64-byte vectors in pw per packed vector */
#if TPREP_PLANES
#define TP_V_LOAD(B, N, v, i, blk) (void)0
#define TP_HI16(B, PREP, m) (B == 4 && (m) % NSUB == 1 && !(PREP))
#define TP_WC(B, N, PREP, hi16, v, i, blk, m)                                                                \
  ((PREP) ? _mm512_load_si512(pw + ((((size_t)(i) * (size_t)nblk + (size_t)(blk)) * N) * NSUB + (m)) * 64)    \
   : hi16 ? _mm512_and_si512(v[(m) / NSUB], _mm512_set1_epi8((char)0xF0)) : t_unpack(v[(m) / NSUB], B, (m) % NSUB))
#define TP44_VK(B, N, vk, blk, k) (void)vk
#define TP44_WC(B, N, vk, i, blk, k, u) _mm512_load_si512(pw + ((((size_t)(i) * (size_t)nblk + (size_t)(blk)) * N + (k)) * NSUB + (u)) * 64)
#define TP_STORE(B, N, pw, i, blk, k, v)                                                                     \
  UNROLL for (int u = 0; u < 8 / B; u++)                                                                     \
    _mm512_store_si512((pw) + ((((i) * xb->nblk + (blk)) * N + (k)) * (8 / B) + u) * 64, t_unpack((v)[k], B, u))
#else
#define TP_V_LOAD(B, N, v, i, blk) UNROLL for (int k = 0; k < N; k++) v[k] = _mm512_load_si512(pw + (((size_t)i * (size_t)nblk + (size_t)blk) * N + k) * 64)
#define TP_HI16(B, PREP, m) (B == 4 && m % NSUB == 1)
#define TP_WC(B, N, PREP, hi16, v, i, blk, m) (hi16 ? _mm512_and_si512(v[m / NSUB], _mm512_set1_epi8((char)0xF0)) : t_unpack(v[m / NSUB], B, m % NSUB))
#define TP44_VK(B, N, vk, blk, k) UNROLL for (int i = 0; i < RT; i++) vk[i] = _mm512_load_si512(pw + (((size_t)i * (size_t)nblk + (size_t)blk) * N + k) * 64)
#define TP44_WC(B, N, vk, i, blk, k, u) t_unpack(vk[i], B, u)
#define TP_STORE(B, N, pw, i, blk, k, v) _mm512_store_si512(pw + ((i * xb->nblk + blk) * N + k) * 64, v[k])
#endif
/* The start of the transposed tiles: the lane -> group map, the TT activation rows' codes,
 * d per lane and c, and the accumulators. */
#define TTILE_PROLOGUE(N, RT, TT)                                                                            \
    const __m512i pg = _mm512_loadu_si512(TR_GROUP[tr_index(N)]); /* lane -> group */                      \
    const int8_t *xq[TT];                                                                                    \
    const float *xg[TT], *xc[TT];                                                                            \
    UNROLL for (int j = 0; j < TT; j++) {                                                                    \
      xq[j] = xb->q + (size_t)(t0 + j) * (size_t)nblk * NSUB * BLK;                                          \
      xg[j] = xb->dp + (t0 + j) * xb->cstride;                                                               \
      xc[j] = xb->c + (t0 + j) * xb->cstride;                                                                \
    }                                                                                                        \
    __m512 acc[RT][TT];                                                                                      \
    UNROLL for (int i = 0; i < RT; i++) UNROLL for (int j = 0; j < TT; j++) acc[i][j] = _mm512_setzero_ps();
/* PREP 0: each tile transposes its rows' blocks itself (t_load); PREP 1: it reads them from
 * pw, the 4 rows' blocks transposed once by tprep (vnni_rows, T >= TPREP_MIN_T): the same
 * codes, so the same bits. Either way the tile unpacks them (4-bit: one AND a plane). */
#define TTILE(B, N, RT, TT, PREP, LS, NAME)                                                                  \
  static void NAME(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, const int8_t *pw) { \
    enum { NSUB = 8 / B, BLK = N * 64 /* packed bytes of a block */ };                                      \
    LP_SB_LOCALS                                                                                             \
    const int64_t ng = xb->ng, nblk = xb->nblk, rb = xb->K * B / 8, pf = TT == 1 ? wr->pf1 : wr->pf;        \
    TTILE_PROLOGUE(N, RT, TT)                                                                                \
    if (TT == 1) pf_sb(wr, RT, ng * (sbt == DG_F32 ? 4 : 2));                                                \
    for (int64_t blk = 0; blk < nblk; blk++) {                                                               \
      const int64_t g16 = blk * 16;                                                                          \
      const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);                                                    \
      UNROLL for (int i = 0; i < RT; i++) {                                                                  \
        __m512i v[N];                                                                                        \
        if (!PREP) t_load(v, N, wr, i, LS, blk, rb, pf);                                                     \
        else TP_V_LOAD(B, N, v, i, blk);                                                                         \
        __m512i isum[TT], ihi[TT];                                                                           \
        const int8_t *xr[TT]; /* opaque per row: the codes are read from the L1 as operands, not kept */     \
        UNROLL for (int j = 0; j < TT; j++) {                                                                \
          isum[j] = ihi[j] = _mm512_setzero_si512();                                                         \
          xr[j] = xq[j] + blk * N * NSUB * 64;                                                               \
          __asm__("" : "+r"(xr[j]));                                                                         \
        }                                                                                                    \
        UNROLL for (int m = 0; m < N * NSUB; m++) {                                                          \
          /* 4-bit, unpacked here: the high codes as 16 q (one AND, no shift) into their own sum */          \
          const int hi16 = TP_HI16(B, PREP, m);                                                                     \
          const __m512i wc = TP_WC(B, N, PREP, hi16, v, i, blk, m);                                                    \
          UNROLL for (int j = 0; j < TT; j++) {                                                              \
            if (hi16) ihi[j] = _mm512_dpbusd_epi32(ihi[j], wc, _mm512_load_si512(xr[j] + m * 64));           \
            else isum[j] = _mm512_dpbusd_epi32(isum[j], wc, _mm512_load_si512(xr[j] + m * 64));              \
          }                                                                                                  \
        }                                                                                                    \
        /* sum 16 q x is a multiple of 16 (|.| < 2^24): the shift is exact, so isum is the same integer */   \
        if (B == 4) UNROLL for (int j = 0; j < TT; j++) isum[j] = _mm512_add_epi32(isum[j], _mm512_srai_epi32(ihi[j], 4)); \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(sbt, sc[i], g16, n));                             \
        UNROLL for (int j = 0; j < TT; j++)                                                                  \
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(s, _mm512_load_ps(xg[j] + g16)), acc[i][j]); \
      }                                                                                                      \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
/* The 4 rows' blocks of a tile row, transposed (still packed: half the bytes of the unpacked
 * codes at 4 bits, and the tiles' AND is cheaper than a load): pw[i][blk][k][64], k < N
 * (prefetching as the 4x4 tile). */
#define TPREP(B, N, LS, NAME)                                                                                \
  static void NAME(int8_t *pw, const qx_buf *xb, const lp_rows *wr) {                                        \
    const int64_t rb = xb->K * B / 8;                                                                        \
    for (int i = 0; i < 4; i++)                                                                              \
      for (int64_t blk = 0; blk < xb->nblk; blk++) {                                                         \
        __m512i v[N];                                                                                        \
        t_load(v, N, wr, i, LS, blk, rb, wr->pf);                                                            \
        UNROLL for (int k = 0; k < N; k++) TP_STORE(B, N, pw, i, blk, k, v);                                     \
      }                                                                                                      \
  }
/* The 4x4 tile on prepared rows, step by step: for each of a block's N packed vectors the 4
 * rows' vectors (pw) and, per plane, the 4 activation rows' codes are loaded once and meet in
 * 16 int32 sums (isum[i][j]); TTILE loads the codes once per weight row (a vector load per
 * vpdpbusd: 4 rows x 4 x 16 of them a block against 8 x 12 here), which bounds it by the
 * loads. The 16 fp32 accumulators stay in memory between blocks (no registers left for them:
 * read and written once a block). The high codes unpacked by shift and AND, into the same
 * sums: the integers of TTILE, then the same fp32 operations in the same order, so the
 * same bits. */
#define TTILEP44(B, N)                                                                                       \
  static void ttilep_##B##_##N##_4x4(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, \
                                     const int8_t *pw) {                                                    \
    enum { RT = 4, TT = 4, NSUB = 8 / B, BLK = N * 64 };                                                     \
    LP_SB_LOCALS                                                                                             \
    const int64_t ng = xb->ng, nblk = xb->nblk;                                                              \
    TTILE_PROLOGUE(N, RT, TT)                                                                                \
    for (int64_t blk = 0; blk < nblk; blk++) {                                                               \
      const int64_t g16 = blk * 16;                                                                          \
      const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);                                                    \
      __m512i isum[RT][TT];                                                                                  \
      UNROLL for (int i = 0; i < RT; i++) UNROLL for (int j = 0; j < TT; j++) isum[i][j] = _mm512_setzero_si512(); \
      UNROLL for (int k = 0; k < N; k++) {                                                                   \
        __m512i vk[RT];                                                                                      \
        TP44_VK(B, N, vk, blk, k);                                                                               \
        UNROLL for (int u = 0; u < NSUB; u++) {                                                              \
          __m512i xv[TT];                                                                                    \
          UNROLL for (int j = 0; j < TT; j++) xv[j] = _mm512_load_si512(xq[j] + (blk * N * NSUB + k * NSUB + u) * 64); \
          UNROLL for (int i = 0; i < RT; i++) {                                                              \
            const __m512i wc = TP44_WC(B, N, vk, i, blk, k, u);                                                  \
            UNROLL for (int j = 0; j < TT; j++) isum[i][j] = _mm512_dpbusd_epi32(isum[i][j], wc, xv[j]);     \
          }                                                                                                  \
        }                                                                                                    \
      }                                                                                                      \
      __asm__("" : : "r"(acc) : "memory"); /* acc in memory: the registers are the sums' */                 \
      UNROLL for (int i = 0; i < RT; i++) {                                                                  \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(sbt, sc[i], g16, n));                             \
        UNROLL for (int j = 0; j < TT; j++)                                                                  \
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i][j]), _mm512_mul_ps(s, _mm512_load_ps(xg[j] + g16)), acc[i][j]); \
      }                                                                                                      \
      __asm__("" : : "r"(acc) : "memory");                                                                   \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
/* Each format's tiles that read the weights twice: LS = 0 for the MLX layout (ttile_, tprep_), 2
 * for the pack (ttilek_, tprepk_; lp_rows: the shift a constant, as VTILE's); the tiles on
 * prepared rows read pw only. */
#define TTILES(B, N)                                                                                         \
  TTILE(B, N, 4, 4, 0, 0, ttile_##B##_##N##_4x4) TTILE(B, N, 4, 1, 0, 0, ttile_##B##_##N##_4x1)              \
  TTILE(B, N, 1, 4, 0, 0, ttile_##B##_##N##_1x4) TTILE(B, N, 1, 1, 0, 0, ttile_##B##_##N##_1x1)              \
  TTILE(B, N, 4, 4, 0, 2, ttilek_##B##_##N##_4x4) TTILE(B, N, 4, 1, 0, 2, ttilek_##B##_##N##_4x1)            \
  TTILE(B, N, 1, 4, 0, 2, ttilek_##B##_##N##_1x4) TTILE(B, N, 1, 1, 0, 2, ttilek_##B##_##N##_1x1)            \
  TTILEP44(B, N) TTILE(B, N, 4, 1, 1, 0, ttilep_##B##_##N##_4x1)                                             \
  TPREP(B, N, 0, tprep_##B##_##N) TPREP(B, N, 2, tprepk_##B##_##N)
TTILES(2, 2) /* g32 */
TTILES(2, 4) /* g64 */
TTILES(2, 8) /* g128 */
TTILES(4, 4) /* g32 */
TTILES(4, 8) /* g64 */
TTILES(8, 8) /* g32 */

/* The natural layout (qx_buf.nat: n = 8, a call's tiles all one activation row wide): each of
 * a block's 8 steps (64 packed bytes: groups 2 m and 2 m + 1 of the block in lanes 0-7 and
 * 8-15) gets its own int32 dot product per lane (vpdpbusd over the nsub planes), then a
 * reduction tree adds each step's 8 lanes of a group and gathers the 16 sums into the lanes
 * of TR_GROUP[8] (lane l < 8: group 2 l, l >= 8: group 2 (l - 8) + 1), as tr_dwords puts
 * them: in-lane unpacks and adds of pairs of steps' dwords (w), then of pairs of pairs'
 * qwords (x2: each 128-bit chunk's 4 dwords of one step summed), then 2 vpermt2q + 1 add
 * joining a group's two chunks: 21 instructions against tr_dwords' 24 and no unpack of
 * moved dwords. The tile goes step by step over all its rows, so each step's activation
 * codes are loaded once for the RT rows (TTILE loads them per row: 24 vector loads per
 * row and block against 12 here), and the tree's rounds run as their inputs arrive. The
 * integer sums are exact, so isum is the same integer as TTILE's and the same fp32
 * operations follow: the bits of TTILE, for every row. On a pack (lp_rows, ls = 2) the
 * 4 rows of a block are one stream, which the hardware prefetcher follows. */
/* NTILE's prefetch on a pack: PK1_BLOCKS 4-row blocks on (0 = none). 2-core Zen 4
 * EPYC, 4-bit [1408, 2816] over a 64-expert stack, -t 2, active wait, loaded (load 5.4-5.8),
 * per-call p50 of 2688 calls, two alternations (docs/results/cpu-s17/rb17_pack.txt, session 17's
 * layout: the scales inside each block of 16 groups): none 0.047 / 0.072 ms, 1024 bytes on 4.5
 * (preempted) / 0.073, 4096: 0.096 / 0.102, 16384: 0.096 / 0.097. */
/* Session 18's layout (d2f3587, idle, side-by-side, 3 alternations, avx512lp GFLOP/s medians: no prefetch /
 * 4 blocks on for both families): gate/up M = 1 132 / 77, down 110 / 63 (docs/results/cpu-s18/pk18_w2_*).
 * On the Zen 5 EPYC of session 20 the opposite (idle side-by-side, 5 alternations, DGEMMA_CPU_PACK=1 with 4 blocks on
 * for both vs no pack): gate/up M = 1 1.12x, down 1.33x, while the pack without the prefetch was 0.46x (gate/up) and
 * 0.27x (down) of no pack (docs/results/cpu-s20/pk20_w2_*, pk20_diagnosis_*): the right distance depends on the CPU. */
#ifndef PK1_BLOCKS
#define PK1_BLOCKS 0
#endif
/* The same for the other one-row tiles on a pack (VTILE1 by step, TTILE 4x1 / 1x1 transposed at n = 2 or 4). */
#ifndef PK1S_BLOCKS
#define PK1S_BLOCKS 0
#endif
#define NTILE(B, RT, NAME)                                                                                   \
  static void NAME(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, const int8_t *pw) { \
    enum { TT = 1, N = 8, NSUB = 8 / B };                                                                    \
    LP_ROWS_LOCALS                                                                                           \
    const int64_t esz = sbt == DG_F32 ? 4 : 2;                                                               \
    const int64_t ng = xb->ng, nblk = xb->nblk, rb = xb->K * B / 8, pf = wr->pf1;                            \
    const __m512i pg = _mm512_loadu_si512(TR_GROUP[2]); /* lane -> group */                                 \
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)nblk * N * NSUB * 64;                                    \
    const float *xg = xb->dp + t0 * xb->cstride, *xc[1] = {xb->c + t0 * xb->cstride};                        \
    __m512 acc[RT][1];                                                                                       \
    UNROLL for (int i = 0; i < RT; i++) acc[i][0] = _mm512_setzero_ps();                                     \
    pf_sb(wr, RT, ng * esz);                                                                                 \
    for (int64_t blk = 0; blk < nblk; blk++) {                                                               \
      const int64_t g16 = blk * 16, byte0 = blk * N * 64;                                                    \
      const int n = (int)(ng - g16 < 16 ? ng - g16 : 16), full = byte0 + 64 * N <= rb;                       \
      const int8_t *xr = xq + blk * N * NSUB * 64;                                                           \
      /* step by step, all RT rows: each step's codes loaded once; the tree's rounds as soon as their \
       * inputs are there (w: pairs of steps, x2: quads), so that few sums are live */                      \
      __m512i w[RT][4], x2[RT][2];                                                                           \
      UNROLL for (int p = 0; p < 4; p++) {                                                                   \
        __m512i ps[RT][2];                                                                                   \
        UNROLL for (int h = 0; h < 2; h++) {                                                                 \
          const int m = 2 * p + h;                                                                           \
          const int64_t r = rb - byte0 - 64 * m;                                                             \
          const __mmask64 lm = r >= 64 ? ~(__mmask64)0 : r <= 0 ? 0 : (((__mmask64)1 << r) - 1);            \
          __m512i xv[NSUB];                                                                                  \
          UNROLL for (int u = 0; u < NSUB; u++) xv[u] = _mm512_load_si512(xr + (m * NSUB + u) * 64);         \
          UNROLL for (int i = 0; i < RT; i++) {                                                              \
            const uint8_t *wp = full ? WADDR(i, byte0 + 64 * m) : WADDRP(i, byte0 + 64 * m);                 \
            const __m512i v = full ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8(lm, wp);              \
            if (pf) _mm_prefetch((const char *)wp + pf, PF1_HINT);                                           \
            ps[i][h] = _mm512_setzero_si512();                                                               \
            UNROLL for (int u = 0; u < NSUB; u++) ps[i][h] = _mm512_dpbusd_epi32(ps[i][h], t_unpack(v, B, u), xv[u]); \
          }                                                                                                  \
        }                                                                                                    \
        UNROLL for (int i = 0; i < RT; i++) {                                                                \
          w[i][p] = _mm512_add_epi32(_mm512_unpacklo_epi32(ps[i][0], ps[i][1]), _mm512_unpackhi_epi32(ps[i][0], ps[i][1])); \
          if (p % 2)                                                                                         \
            x2[i][p / 2] = _mm512_add_epi32(_mm512_unpacklo_epi64(w[i][p - 1], w[i][p]), _mm512_unpackhi_epi64(w[i][p - 1], w[i][p])); \
        }                                                                                                    \
      }                                                                                                      \
      UNROLL for (int i = 0; i < RT; i++) {                                                                  \
        /* x2[i][q] chunk c, lane j: chunk c's sum of step 4 q + j; a group = chunks (0, 1) or (2, 3) */     \
        const __m512i isum = _mm512_add_epi32(_mm512_permutex2var_epi64(x2[i][0], lo, x2[i][1]),            \
                                              _mm512_permutex2var_epi64(x2[i][0], hi, x2[i][1]));           \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(sbt, sc[i], g16, n));                             \
        acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_load_ps(xg + g16)), acc[i][0]); \
      }                                                                                                      \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
/* NTILE's operations with the rows taken one after another (SEQ1 below): row i's blocks all, then row i + 1's, so
 * that the RT rows' codes are read as one forward stream; each row's loads, integer sums, reduction tree and fp32
 * steps are NTILE's (its activation codes loaded again per row, from the L1), so each output has NTILE's bits. */
#define NTILE_SEQ(B, RT, NAME)                                                                               \
  static void NAME(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, const int8_t *pw) { \
    enum { TT = 1, N = 8, NSUB = 8 / B };                                                                    \
    LP_ROWS_LOCALS                                                                                           \
    const int64_t esz = sbt == DG_F32 ? 4 : 2;                                                               \
    const int64_t ng = xb->ng, nblk = xb->nblk, rb = xb->K * B / 8, pf = wr->pf1;                            \
    const __m512i pg = _mm512_loadu_si512(TR_GROUP[2]); /* lane -> group */                                 \
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)nblk * N * NSUB * 64;                                    \
    const float *xg = xb->dp + t0 * xb->cstride, *xc[1] = {xb->c + t0 * xb->cstride};                        \
    __m512 acc[RT][1];                                                                                       \
    pf_sb(wr, RT, ng * esz);                                                                                 \
    for (int i = 0; i < RT; i++) {                                                                           \
      acc[i][0] = _mm512_setzero_ps();                                                                       \
      for (int64_t blk = 0; blk < nblk; blk++) {                                                             \
        const int64_t g16 = blk * 16, byte0 = blk * N * 64;                                                  \
        const int n = (int)(ng - g16 < 16 ? ng - g16 : 16), full = byte0 + 64 * N <= rb;                     \
        const int8_t *xr = xq + blk * N * NSUB * 64;                                                         \
        __m512i w[4], x2[2];                                                                                 \
        UNROLL for (int p = 0; p < 4; p++) {                                                                 \
          __m512i ps[2];                                                                                     \
          UNROLL for (int h = 0; h < 2; h++) {                                                               \
            const int m = 2 * p + h;                                                                         \
            const int64_t r = rb - byte0 - 64 * m;                                                           \
            const __mmask64 lm = r >= 64 ? ~(__mmask64)0 : r <= 0 ? 0 : (((__mmask64)1 << r) - 1);          \
            const uint8_t *wp = full ? WADDR(i, byte0 + 64 * m) : WADDRP(i, byte0 + 64 * m);                 \
            const __m512i v = full ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8(lm, wp);              \
            if (pf) _mm_prefetch((const char *)wp + pf, PF1_HINT);                                           \
            ps[h] = _mm512_setzero_si512();                                                                  \
            UNROLL for (int u = 0; u < NSUB; u++)                                                            \
              ps[h] = _mm512_dpbusd_epi32(ps[h], t_unpack(v, B, u), _mm512_load_si512(xr + (m * NSUB + u) * 64)); \
          }                                                                                                  \
          w[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(ps[0], ps[1]), _mm512_unpackhi_epi32(ps[0], ps[1])); \
          if (p % 2)                                                                                         \
            x2[p / 2] = _mm512_add_epi32(_mm512_unpacklo_epi64(w[p - 1], w[p]), _mm512_unpackhi_epi64(w[p - 1], w[p])); \
        }                                                                                                    \
        const __m512i isum = _mm512_add_epi32(_mm512_permutex2var_epi64(x2[0], lo, x2[1]),                   \
                                              _mm512_permutex2var_epi64(x2[0], hi, x2[1]));                  \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(sbt, sc[i], g16, n));                             \
        acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_load_ps(xg + g16)), acc[i][0]); \
      }                                                                                                      \
    }                                                                                                        \
    VTILE_BIAS_STORE(RT, TT)                                                                                 \
  }
NTILE_SEQ(2, 4, ntiles_2_4x1) NTILE_SEQ(4, 4, ntiles_4_4x1) NTILE_SEQ(8, 4, ntiles_8_4x1)

/* MV1: the matrix-vector product (one activation row in the natural layout, the MLX layout, no pack) of a thread's
 * rows in one call, one row after another (NTILE_SEQ's order) instead of vnni_tiles' 4-row tiles: no per-4-row set-up
 * (lp_rows, tile calls), the full blocks' loads unmasked, the partial last block's steps past the row zero without
 * loads, the accumulator and the reduction tree in registers, each step's codes loaded once (not once per plane). The
 * rows are taken from MV1_NS forward streams a thread (rows 0, q, 1, q + 1, ... for MV1_NS = 2, q = half the thread's
 * rows), every code line prefetched MV1_PF bytes on in its stream into the L2 and MV1_PFL1 bytes on into the L1, the
 * scales' and biases' lines MV1_PFS bytes on.
 * Each row's operations are NTILE's: the same exact integer sums isum (the same tree: the same lanes), the same scale
 * permute, fp32 product and FMA per block in block order, the same bias terms, the same horizontal sum, so every output
 * has NTILE's bits (tests/test_kernels.c, test_mv1: against NTILE_SEQ by DGEMMA_CPU_PACK=seq1, which keeps the 4-row
 * tiles for the A/B). Why (session 30, an Intel Xeon VM with AVX-512 VNNI, 2 cores, 4 KiB pages; gate/up [1408, 2816]
 * 4-bit g64; docs/measurements.md): with the weights in the L2, NTILE_SEQ ran at 21-22 GB/s a core and MV1 at
 * 28-31 GB/s, against the ~14 GB/s one core reads from memory; the side by side (dev/s27_sbs17.sh, 2 threads, ten
 * alternations with DGEMMA_CPU_PACK=seq1) gave MV1 1.03-1.15x NTILE_SEQ's GB/s at one row (two streams: ~3 % of it),
 * 23.9-24.7 GB/s median against ggml's AMX q4_0 25-26 and q4_K ~15. Without the software prefetch either reads at
 * ~9.5 GB/s a core, every other line prefetched 10.3, every line 12.8: here the hardware prefetchers do not keep up
 * with a stream consumed at this rate. 2048 bytes on 11.4, 4096 12.8, 8192-12288 12.3-12.9 (T0 hint 12.1). On top of
 * that, every line also prefetched into the L1 (prefetcht0) MV1_PFL1 = 768 bytes on (12 lines, from the L2 where the
 * first prefetch put it): gate/up 2 threads 86.3-89.3 -> 82.1-85.7 us a call, 1 thread 175-177 -> 166-169 (256-2048
 * bytes on all within ~2 % of each other); down (MV1S) 2 threads 37.0-40.0 -> 34.8-37.9 us (384 the same); baseline
 * run last in each alternation (docs/results/cpu-s30/cpu17_runs.txt). */
#ifndef MV1
#define MV1 1
#endif
#ifndef MV1_PF
#define MV1_PF 4096
#endif
#ifndef MV1_PFS
#define MV1_PFS 1024
#endif
#ifndef MV1_NS
#define MV1_NS 2
#endif
#ifndef MV1_PFL1
#define MV1_PFL1 768 /* and every code line into the L1 that many bytes on (see MV1 above) */
#endif
#ifndef MV1_BYSTEP
#define MV1_BYSTEP 1
#endif
#ifndef MV1_HINT
#define MV1_HINT _MM_HINT_T1
#endif
/* One 64-byte step of codes v against its 8 / B activation planes at xr: the step's int32 lane sums. */
static inline __attribute__((always_inline)) __m512i mv1_dot(__m512i v, const int8_t *xr, int B) {
  __asm__("" : "+v"(v)); /* v in a register: one load of the step, not one folded into each plane's operation */
  __m512i ps = _mm512_setzero_si512();
  /* the planes u = 0 .. 8 / B - 1 in order, written out (a "GCC unroll" over 8 / B is refused at -O1, where B is not
   * yet a constant: CI's sanitizer build); B is 2, 4 or 8 here (the transposed tiles' widths) */
#define MV1_PLANE(u) ps = _mm512_dpbusd_epi32(ps, t_unpack(v, B, u), _mm512_load_si512(xr + (u) * 64))
  MV1_PLANE(0);
  if (8 / B > 1) MV1_PLANE(1);
  if (8 / B > 2) MV1_PLANE(2);
  if (8 / B > 3) MV1_PLANE(3);
#undef MV1_PLANE
  return ps;
}
/* NTILE's reduction tree: 8 steps' lane sums -> the 16 groups' sums in TR_GROUP[8]'s lanes. */
static inline __attribute__((always_inline)) __m512i mv1_tree(const __m512i *ps, __m512i lo, __m512i hi) {
  __m512i w[4], x2[2];
  _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
    w[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(ps[2 * p], ps[2 * p + 1]), _mm512_unpackhi_epi32(ps[2 * p], ps[2 * p + 1]));
    if (p % 2) x2[p / 2] = _mm512_add_epi32(_mm512_unpacklo_epi64(w[p - 1], w[p]), _mm512_unpackhi_epi64(w[p - 1], w[p]));
  }
  return _mm512_add_epi32(_mm512_permutex2var_epi64(x2[0], lo, x2[1]), _mm512_permutex2var_epi64(x2[0], hi, x2[1]));
}
/* Rows [0, nrows) of codes w (rb bytes a row), scales sc and biases bi (sbrow bytes a row, type SBT) times activation
 * row t0 of xb (nat) into y[0 .. nrows). */
#define MV1K(B, SBT, NAME)                                                                                   \
  static void NAME(float *y, const qx_buf *xb, int64_t t0, const uint8_t *w0, const char *sc0, const char *bi0, \
                   int64_t nrows, int64_t rb, int64_t sbrow) {                                                \
    enum { N = 8, NSUB = 8 / B };                                                                            \
    const int64_t ng = xb->ng, nblk = xb->nblk, nfull = rb / (64 * N), tb = rb - nfull * 64 * N;             \
    const int ns = (int)((tb + 63) / 64); /* the partial last block's steps (if tb > 0), the last one tb % 64 */ \
    const __mmask64 tm = tb % 64 ? (((__mmask64)1 << (tb % 64)) - 1) : ~(__mmask64)0;                        \
    const __m512i pg = _mm512_loadu_si512(TR_GROUP[2]);                                                      \
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)nblk * N * NSUB * 64;                                    \
    const float *xg = xb->dp + t0 * xb->cstride, *xc = xb->c + t0 * xb->cstride;                             \
    const int64_t qs = (nrows + MV1_NS - 1) / MV1_NS; /* rows a stream */                                   \
    for (int64_t i = 0; i < qs * MV1_NS; i++) {                                                              \
      const int64_t r = (i % MV1_NS) * qs + i / MV1_NS; /* stream i % MV1_NS's next row */                   \
      if (r >= nrows) continue;                                                                              \
      const uint8_t *w = w0 + r * rb;                                                                        \
      const char *sc = sc0 + r * sbrow, *bi = bi0 + r * sbrow;                                               \
      if (MV1_PFS)                                                                                           \
        for (int64_t o = 0; o < sbrow + 63; o += 64) {                                                       \
          const int64_t oo = MV1_PFS + (o < sbrow ? o : sbrow - 1);                                          \
          _mm_prefetch(sc + oo, MV1_HINT);                                                                   \
          _mm_prefetch(bi + oo, MV1_HINT);                                                                   \
        }                                                                                                    \
      __m512 acc = _mm512_setzero_ps();                                                                      \
      int64_t blk = 0;                                                                                       \
      for (; blk < nfull; blk++) { /* whole blocks: 8 full steps, 16 groups */                              \
        const uint8_t *wb = w + blk * 64 * N;                                                                \
        const int8_t *xr = xq + blk * N * NSUB * 64;                                                         \
        __m512i ps[N];                                                                                       \
        _Pragma("GCC unroll 8") for (int m = 0; m < N; m++) {                                                \
          if (MV1_PF) _mm_prefetch((const char *)wb + 64 * m + MV1_PF, MV1_HINT);                            \
          if (MV1_PFL1) _mm_prefetch((const char *)wb + 64 * m + MV1_PFL1, _MM_HINT_T0);                     \
          ps[m] = mv1_dot(_mm512_loadu_si512(wb + 64 * m), xr + m * NSUB * 64, B);                           \
        }                                                                                                    \
        const __m512i isum = mv1_tree(ps, lo, hi);                                                           \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(SBT, sc, blk * 16, 16));                          \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_load_ps(xg + blk * 16)), acc); \
      }                                                                                                      \
      if (blk < nblk) { /* a partial last block (nblk = nfull + 1): NTILE's masked loads give these bytes */  \
        const int64_t g16 = blk * 16, byte0 = blk * 64 * N;                                                  \
        const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);                                                  \
        const int8_t *xr = xq + blk * N * NSUB * 64;                                                         \
        __m512i ps[N];                                                                                       \
        _Pragma("GCC unroll 8") for (int m = 0; m < N; m++)                                                  \
          ps[m] = m < ns - 1 ? mv1_dot(_mm512_loadu_si512(w + byte0 + 64 * m), xr + m * NSUB * 64, B)        \
                  : m == ns - 1 ? mv1_dot(_mm512_maskz_loadu_epi8(tm, w + byte0 + 64 * m), xr + m * NSUB * 64, B) \
                                : _mm512_setzero_si512();                                                    \
        const __m512i isum = mv1_tree(ps, lo, hi);                                                           \
        const __m512 s = _mm512_permutexvar_ps(pg, load_sb(SBT, sc, g16, n));                                \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_load_ps(xg + g16)), acc);    \
      }                                                                                                      \
      for (int64_t g = 0; g < ng; g += 16) { /* VTILE_BIAS_STORE's bias terms */                             \
        const int n = (int)(ng - g < 16 ? ng - g : 16);                                                      \
        acc = _mm512_fmadd_ps(load_sb(SBT, bi, g, n), _mm512_load_ps(xc + g), acc);                          \
      }                                                                                                      \
      y[r] = _mm512_reduce_add_ps(acc);                                                                      \
    }                                                                                                        \
  }
MV1K(2, DG_BF16, mv1_2_bf16) MV1K(4, DG_BF16, mv1_4_bf16) MV1K(8, DG_BF16, mv1_8_bf16)
MV1K(2, DG_F16, mv1_2_f16) MV1K(4, DG_F16, mv1_4_f16) MV1K(8, DG_F16, mv1_8_f16)
MV1K(2, DG_F32, mv1_2_f32) MV1K(4, DG_F32, mv1_4_f32) MV1K(8, DG_F32, mv1_8_f32)
/* MV1S: MV1 for the by-step layout (qx_buf.tr_n = 0: fewer than 14 groups a row, as the 26B's down product [2816, 704]
 * at 4-bit g64 with 11, or 4-bit g128, 8-bit g64 / g128): a thread's rows one after another in one run, each row's
 * operations VTILE1's (the same s_g d_g products once per 16 groups, the same lanes' factors by one permute a step,
 * the same exact integer sums, FMAs in step order, bias terms and horizontal sum), so every output has VTILE1's bits;
 * whole steps loaded unmasked (the same bytes as VTILE1's all-ones masks). Rows in MV1_NS streams, prefetched as
 * MV1K's. The 26B's down product [2816, 704] on session 30's Intel VM (128-expert stack, chrt, docs/results/cpu-s30/
 * cpu17_runs.txt): 1 thread 95.2 -> 85.7 us a call against vnni_tiles' VTILE1 4x1, 2 threads 42.2 -> 40.7 and
 * 41.6 -> 39.1 us. */
#define MV1S(B, SBT, NAME)                                                                                   \
  static void NAME(float *y, const qx_buf *xb, int64_t t0, const uint8_t *w0, const char *sc0, const char *bi0, \
                   int64_t nrows, int64_t rbytes, int64_t sbrow) {                                            \
    VTILE_PROLOGUE(B)                                                                                        \
    (void)rbytes; /* = rb */                                                                                 \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)steps * (size_t)nsub * 64;                               \
    const float *xg = xb->dg + t0 * xb->cstride, *xc = xb->c + t0 * xb->cstride;                             \
    const int64_t qs = (nrows + MV1_NS - 1) / MV1_NS;                                                        \
    for (int64_t i = 0; i < qs * MV1_NS; i++) {                                                              \
      const int64_t r = (i % MV1_NS) * qs + i / MV1_NS;                                                      \
      if (r >= nrows) continue;                                                                              \
      const uint8_t *row = w0 + r * rb;                                                                      \
      const char *sc = sc0 + r * sbrow, *bi = bi0 + r * sbrow;                                               \
      if (MV1_PFS)                                                                                           \
        for (int64_t o = 0; o < sbrow + 63; o += 64) {                                                       \
          const int64_t oo = MV1_PFS + (o < sbrow ? o : sbrow - 1);                                          \
          _mm_prefetch(sc + oo, MV1_HINT);                                                                   \
          _mm_prefetch(bi + oo, MV1_HINT);                                                                   \
        }                                                                                                    \
      __m512 acc = _mm512_setzero_ps();                                                                      \
      for (int64_t g16 = 0; g16 < ng; g16 += 16) {                                                           \
        const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);                                                  \
        const __m512 sd = _mm512_mul_ps(load_sb(SBT, sc, g16, n), _mm512_load_ps(xg + g16));                 \
        const int64_t s1 = ((g16 + 16) << lg) / cps;                                                         \
        for (int64_t st = (g16 << lg) / cps; st < steps && st < s1; st++) {                                  \
          const int64_t byte0 = st * 64;                                                                     \
          const __m512i li = _mm512_add_epi32(gi, _mm512_set1_epi32((int)(((st * cps) >> lg) - g16)));       \
          __m512i raw = rb - byte0 >= 64 ? _mm512_loadu_si512(row + byte0)                                   \
                                         : _mm512_maskz_loadu_epi8(((__mmask64)1 << (rb - byte0)) - 1, row + byte0); \
          if (MV1_PF) _mm_prefetch((const char *)row + byte0 + MV1_PF, MV1_HINT);                            \
          if (MV1_PFL1) _mm_prefetch((const char *)row + byte0 + MV1_PFL1, _MM_HINT_T0);                     \
          __asm__("" : "+v"(raw));                                                                           \
          __m512i isum = _mm512_setzero_si512();                                                             \
          UNROLL for (int u = 0; u < nsub; u++)                                                              \
            isum = _mm512_dpbusd_epi32(isum, B == 8 ? raw : _mm512_and_si512(_mm512_srli_epi16(raw, B * u), bm), \
                                       _mm512_load_si512(xq + (st * nsub + u) * 64));                        \
          acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(li, sd), acc);               \
        }                                                                                                    \
      }                                                                                                      \
      for (int64_t g = 0; g < ng; g += 16) { /* VTILE_BIAS_STORE's bias terms */                             \
        const int n = (int)(ng - g < 16 ? ng - g : 16);                                                      \
        acc = _mm512_fmadd_ps(load_sb(SBT, bi, g, n), _mm512_load_ps(xc + g), acc);                          \
      }                                                                                                      \
      y[r] = _mm512_reduce_add_ps(acc);                                                                      \
    }                                                                                                        \
  }
MV1S(2, DG_BF16, mv1s_2_bf16) MV1S(4, DG_BF16, mv1s_4_bf16) MV1S(8, DG_BF16, mv1s_8_bf16)
MV1S(2, DG_F16, mv1s_2_f16) MV1S(4, DG_F16, mv1s_4_f16) MV1S(8, DG_F16, mv1s_8_f16)
MV1S(2, DG_F32, mv1s_2_f32) MV1S(4, DG_F32, mv1s_4_f32) MV1S(8, DG_F32, mv1s_8_f32)
typedef void (*mv1_fn)(float *y, const qx_buf *xb, int64_t t0, const uint8_t *w, const char *sc, const char *bi,
                       int64_t nrows, int64_t rb, int64_t sbrow);
/* MV1's kernel for B-bit codes, sbt scales and biases, the natural (tr_n = 8: MV1K) or by-step (tr_n = 0: MV1S)
 * layout. */
static mv1_fn mv1_of(int B, dg_dtype sbt, int tr_n) {
  static const mv1_fn f[2][3][3] = {
      {{mv1_2_bf16, mv1_4_bf16, mv1_8_bf16}, {mv1_2_f16, mv1_4_f16, mv1_8_f16}, {mv1_2_f32, mv1_4_f32, mv1_8_f32}},
      {{mv1s_2_bf16, mv1s_4_bf16, mv1s_8_bf16}, {mv1s_2_f16, mv1s_4_f16, mv1s_8_f16}, {mv1s_2_f32, mv1s_4_f32, mv1s_8_f32}}};
  const int b = B == 2 ? 0 : B == 4 ? 1 : 2;
  return f[tr_n == 0][sbt == DG_BF16 ? 0 : sbt == DG_F16 ? 1 : 2][b];
}
/* Rows [r0, r0 + nrows) of w (MLX layout, no pack; xb natural or by step) times activation row t0 into y[0 .. nrows). */
static void mv1_rows(float *y, const qx_buf *xb, int64_t t0, const dg_weight *w, const dg_cpu_pack_geom *g, int64_t r0,
                     int64_t nrows) {
  mv1_of(w->bits, w->sb_dtype, xb->tr_n)(y, xb, t0, (const uint8_t *)w->data + (size_t)r0 * (size_t)g->rb,
                               (const char *)w->scales + (size_t)r0 * (size_t)g->sbrow,
                               (const char *)w->biases + (size_t)r0 * (size_t)g->sbrow, nrows, g->rb, g->sbrow);
}
NTILE(2, 4, ntile_2_4x1) NTILE(2, 1, ntile_2_1x1) /* g128 */
NTILE(4, 4, ntile_4_4x1) NTILE(4, 1, ntile_4_1x1) /* g64 */
NTILE(8, 4, ntile_8_4x1) NTILE(8, 1, ntile_8_1x1) /* g32 */

/* NTILE on the interleaved layout (cpu/pack.c, DGEMMA_CPU_PACK=il): all R rows of unit u (R = 4 or 8) times one
 * activation row t0, block by block, each block's R / 4 sub-passes of 4 rows as NTILE's 4x1 runs its block (the
 * same loads of the same codes: full loads where NTILE's masked ones give the same bytes, the steps past a row's end
 * zero as NTILE's all-masked loads; the same vpdpbusd, reduction tree, scale and fp32 operations per row, then the
 * same bias terms in the same order), so each output has NTILE's bits; the R outputs go to out[0 .. R) (rows past the
 * matrix's last are the pack's zero rows: computed, not stored by the caller). The bytes are read in the order they
 * lie: one forward stream per unit, and per thread over its consecutive units. IL1_BYTES: every line of the stream
 * (codes, scales, biases) prefetched that many bytes on (0 = none). The layout alone did not do it: 2-core Zen 5
 * EPYC, 26B gate/up [1408, 2816] 4-bit g64, -t 2, M = 1, ceiling bench medians (docs/results/cpu-s21/il21_sweep*):
 * no prefetch 0.084-0.092 ms (R = 8; R = 4 0.092-0.100) against the MLX layout's 0.065-0.074 (one 0.105) in the same
 * windows; one line in four, 2-8 KiB on, 0.080-0.104; every line 4 KiB on 0.049-0.052 (16 KiB 0.050, 24 KiB
 * 0.051-0.055; R = 4 8 KiB 0.055-0.056). The side-by-side with ggml: docs/measurements.md, session 21. */
#ifndef IL1_BYTES
#define IL1_BYTES 4096
#endif

#ifndef IL1_HINT
#define IL1_HINT _MM_HINT_T1
#endif
#define ILTILE(B, R, NAME)                                                                                   \
  static void NAME(float *out, const qx_buf *xb, int64_t t0, const dg_cpu_pack_geom *g, dg_dtype sbt, int64_t u) { \
    enum { N = 8, NSUB = 8 / B, NP = R / 4 };                                                                \
    const int64_t esz = g->esz, ng = xb->ng, nblk = xb->nblk;                                                \
    const __m512i pg = _mm512_loadu_si512(TR_GROUP[2]); /* lane -> group */                                 \
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); \
    const int8_t *xq = xb->q + (size_t)t0 * (size_t)nblk * N * NSUB * 64;                                    \
    const float *xg = xb->dp + t0 * xb->cstride, *xc = xb->c + t0 * xb->cstride;                             \
    __m512 acc[R];                                                                                           \
    UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                         \
    for (int64_t blk = 0; blk < nblk; blk++) {                                                               \
      const int64_t g16 = blk * 16;                                                                          \
      const int last = blk == nblk - 1, ns = last ? g->ns_last : 8, n = last ? g->n_last : 16;              \
      const char *bb = dg_cpu_il_block(g, u, blk), *sb = bb + 64 * R * ns;                                   \
      const int8_t *xr = xq + blk * N * NSUB * 64;                                                           \
      if (IL1_BYTES) /* the block's scales' lines, as the codes' below: every line of the stream IL1_BYTES on */ \
        for (int64_t o = 0; o < R * n * esz; o += 64) _mm_prefetch(sb + o + IL1_BYTES, IL1_HINT);            \
      UNROLL for (int p = 0; p < NP; p++) {                                                                  \
        const char *cb = bb + p * ns * 256;                                                                  \
        __m512i w[4][4], x2[4][2];                                                                           \
        UNROLL for (int pp = 0; pp < 4; pp++) {                                                              \
          __m512i ps[4][2];                                                                                  \
          UNROLL for (int h = 0; h < 2; h++) {                                                               \
            const int m = 2 * pp + h;                                                                        \
            __m512i xv[NSUB];                                                                                \
            UNROLL for (int k = 0; k < NSUB; k++) xv[k] = _mm512_load_si512(xr + (m * NSUB + k) * 64);       \
            UNROLL for (int i = 0; i < 4; i++) {                                                             \
              const char *wp = cb + (m * 4 + i) * 64;                                                        \
              const __m512i v = !last || m < ns ? _mm512_loadu_si512(wp) : _mm512_setzero_si512();          \
              if (IL1_BYTES && (!last || m < ns)) _mm_prefetch(wp + IL1_BYTES, IL1_HINT);                    \
              ps[i][h] = _mm512_setzero_si512();                                                             \
              UNROLL for (int k = 0; k < NSUB; k++) ps[i][h] = _mm512_dpbusd_epi32(ps[i][h], t_unpack(v, B, k), xv[k]); \
            }                                                                                                \
          }                                                                                                  \
          UNROLL for (int i = 0; i < 4; i++) {                                                               \
            w[i][pp] = _mm512_add_epi32(_mm512_unpacklo_epi32(ps[i][0], ps[i][1]), _mm512_unpackhi_epi32(ps[i][0], ps[i][1])); \
            if (pp % 2)                                                                                      \
              x2[i][pp / 2] = _mm512_add_epi32(_mm512_unpacklo_epi64(w[i][pp - 1], w[i][pp]), _mm512_unpackhi_epi64(w[i][pp - 1], w[i][pp])); \
          }                                                                                                  \
        }                                                                                                    \
        UNROLL for (int i = 0; i < 4; i++) {                                                                 \
          const __m512i isum = _mm512_add_epi32(_mm512_permutex2var_epi64(x2[i][0], lo, x2[i][1]),          \
                                                _mm512_permutex2var_epi64(x2[i][0], hi, x2[i][1]));         \
          const __m512 s = _mm512_permutexvar_ps(pg, load_sb(sbt, sb + (4 * p + i) * n * esz, 0, n));        \
          acc[4 * p + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_load_ps(xg + g16)), acc[4 * p + i]); \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
    const char *bi = g->il + (size_t)u * (size_t)g->U + g->boff; /* as VTILE_BIAS_STORE */                   \
    if (IL1_BYTES)                                                                                           \
      for (int64_t o = 0; o < g->U - g->boff; o += 64) _mm_prefetch(bi + o + IL1_BYTES, IL1_HINT);          \
    for (int64_t gg = 0; gg < ng; gg += 16) {                                                                \
      const int n = (int)(ng - gg < 16 ? ng - gg : 16);                                                      \
      UNROLL for (int r = 0; r < R; r++)                                                                     \
        acc[r] = _mm512_fmadd_ps(load_sb(sbt, bi + r * ng * esz, gg, n), _mm512_load_ps(xc + gg), acc[r]);   \
    }                                                                                                        \
    UNROLL for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]);                                \
  }
ILTILE(2, 4, iltile_2_4) ILTILE(2, 8, iltile_2_8) /* g128 */
ILTILE(4, 4, iltile_4_4) ILTILE(4, 8, iltile_4_8) /* g64 */
ILTILE(8, 4, iltile_8_4) ILTILE(8, 8, iltile_8_8) /* g32 */
typedef void (*iltile_fn)(float *out, const qx_buf *xb, int64_t t0, const dg_cpu_pack_geom *g, dg_dtype sbt, int64_t u);
static iltile_fn iltile_of(int B, int R) {
  static const iltile_fn f[3][2] = {{iltile_2_4, iltile_2_8}, {iltile_4_4, iltile_4_8}, {iltile_8_4, iltile_8_8}};
  return f[B == 2 ? 0 : B == 4 ? 1 : 2][R == 8];
}

typedef void (*vtile_fn)(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, const lp_rows *wr, const int8_t *pw);
typedef void (*tprep_fn)(int8_t *pw, const qx_buf *xb, const lp_rows *wr);
/* The tiles of a format: [shape 4x4, 4x1, 1x4, 1x1, then 4x4 and 4x1 on prepared rows
 * (NULL: none)], the preparation of 4 rows, and 4x1, 1x1 on the natural layout (NULL: none). */
typedef struct vtiles { vtile_fn f[6]; tprep_fn prep; vtile_fn nat[2]; } vtiles;
#define TTROW(B, N, NAT4, NAT1, T, P)                                                                        \
  {{T##_##B##_##N##_4x4, T##_##B##_##N##_4x1, T##_##B##_##N##_1x4, T##_##B##_##N##_1x1,                      \
    ttilep_##B##_##N##_4x4, ttilep_##B##_##N##_4x1}, P##_##B##_##N, {NAT4, NAT1}}
#define SROW(B, V) {{V##_##B##_4x4, vtile_##B##_4x1, V##_##B##_1x4, vtile_##B##_1x1, NULL, NULL}, NULL, {NULL, NULL}}
/* The tiles of B-bit codes in the layout of xb (transposed with n = xb->tr_n, or by step; pk: on
 * the weight's pack). */
static const vtiles *vtile_table(int B, int tr_n, int pk) {
  static const vtiles T2[2][4] = {{SROW(2, vtile), TTROW(2, 2, NULL, NULL, ttile, tprep), TTROW(2, 4, NULL, NULL, ttile, tprep),
                                   TTROW(2, 8, ntile_2_4x1, ntile_2_1x1, ttile, tprep)},
                                  {SROW(2, vtilepk), TTROW(2, 2, NULL, NULL, ttilek, tprepk), TTROW(2, 4, NULL, NULL, ttilek, tprepk),
                                   TTROW(2, 8, ntile_2_4x1, ntile_2_1x1, ttilek, tprepk)}},
                      T4[2][3] = {{SROW(4, vtile), TTROW(4, 4, NULL, NULL, ttile, tprep), TTROW(4, 8, ntile_4_4x1, ntile_4_1x1, ttile, tprep)},
                                  {SROW(4, vtilepk), TTROW(4, 4, NULL, NULL, ttilek, tprepk),
                                   TTROW(4, 8, ntile_4_4x1, ntile_4_1x1, ttilek, tprepk)}},
                      T8[2][2] = {{SROW(8, vtile), TTROW(8, 8, ntile_8_4x1, ntile_8_1x1, ttile, tprep)},
                                  {SROW(8, vtilepk), TTROW(8, 8, ntile_8_4x1, ntile_8_1x1, ttilek, tprepk)}};
  pk = pk != 0;
  if (B == 2) return &T2[pk][tr_n == 2 ? 1 : tr_n == 4 ? 2 : tr_n == 8 ? 3 : 0];
  if (B == 4) return &T4[pk][tr_n == 4 ? 1 : tr_n == 8 ? 2 : 0];
  return &T8[pk][tr_n ? 1 : 0];
}

/* Rows [r0, r0 + rt) of w as the tiles read them (lp_rows), g its geometry (dg_cpu_pack_geom_of,
 * once per call): from g->pack, w's pack, where it has one, else from the MLX layout; nat: the
 * call's one-row tiles are NTILE (for the pack's prefetch distance). */
static inline void lp_rows_of(lp_rows *s, const dg_weight *w, const dg_cpu_pack_geom *g, int nat, int64_t r0, int64_t rt) {
  for (int i = 0; i < rt; i++) {
    const int64_t r = r0 + i;
    if (g->pack) {
      dg_cpu_pack_row(g, r, &s->row[i], &s->tail[i], &s->sc[i], &s->bi[i]);
      continue;
    }
    s->row[i] = (const uint8_t *)w->data + (size_t)r * (size_t)g->rb;
    s->tail[i] = s->row[i] + g->rb - g->tl;
    s->sc[i] = (const char *)w->scales + (size_t)r * (size_t)g->sbrow;
    s->bi[i] = (const char *)w->biases + (size_t)r * (size_t)g->sbrow;
  }
  s->sbt = w->sb_dtype;
  s->rbf = g->rb - g->tl;
  s->ls = g->pack ? 2 : 0;
  if (g->pack) { /* the same row of a later 4-row block: P bytes a block */
    s->pf = PF_ROWS / 4 * g->P;
    s->pf1 = s->pfs1 = (nat ? PK1_BLOCKS : PK1S_BLOCKS) * g->P; /* NTILE or the other one-row tiles */
  } else {
    s->pf = PF_ROWS * g->rb;
    s->pf1 = PF1_ROWS * g->rb;
    s->pfs1 = PF1_ROWS * g->sbrow;
  }
}
_Static_assert(PF_ROWS % 4 == 0, "PF_ROWS: whole 4-row blocks (the pack's prefetch is PF_ROWS / 4 blocks on)");

/* Activation rows from which a 4-row block's transposed weights are written once (per
 * thread, DG_KSCRATCH_LPW) and read by every tile instead of each tile redoing them.
 * Idle 2-core Zen 4 EPYC, -t 2, 4-bit gate/up [1408, 2816] g64, active wait, medians of 11,
 * three alternations (docs/results/cpu-s16/lp17_prep_ab.txt; unpacked codes in pw then), ms
 * without / with: M = 8 0.195-0.198 / 0.215-0.229, 12: 0.282-0.287 / 0.289-0.294, 16:
 * 0.364-0.366 / 0.360-0.362, 24: 0.524 / 0.498-0.507, 32: 0.689-0.691 / 0.645-0.658, 64:
 * 1.337-1.351 / 1.219-1.247. With packed codes in pw (1 thread, weights in the L2, the
 * fastest of 31 calls, 3 alternations on a loaded machine): M = 8 0.320-0.333 with /
 * 0.313-0.322 without, 12 0.454-0.462 / 0.482-0.486, 16 0.587-0.593 against the unpacked
 * pw's 0.614-0.629: from 12. With the step-by-step 4x4 tile on prepared rows (TTILEP44; same
 * harness, 3 alternations, load ~1.8, medians of 31 with / without): M = 4 0.171-0.183 /
 * 0.159-0.161 (fastest), 5 0.224-0.226 / 0.237-0.238, 6 0.273-0.282 / 0.307-0.341, 8
 * 0.291-0.292 / 0.316-0.321: from 5. */
#ifndef TPREP_MIN_T
#define TPREP_MIN_T 5
#endif

/* On a pack the tiles of 4 activation rows (and the preparation) prefetch the next 4-row block's codes (wr->pf bytes
 * on, one prefetch per code line they load) but not its scales and biases, which follow its codes (cpu/pack.c; in the
 * MLX layout they are two arrays of their own, which the hardware prefetcher streams). Without this, those loads
 * missed: perf record, -t 1, down [2816, 704] M = 8, 16 % of vtilepk_4_4x4's samples on the widening after the scales'
 * load, the call 0.289 ms on the pack against 0.248 without (medians of 40). So vnni_rows prefetches them, 8 sbrow
 * bytes, the same distance on, once per block: 0.223-0.225 ms (docs/results/cpu-s19/pk19_diagnosis.txt; -t 2, idle:
 * no M = 8-256 row slower on the pack, docs/measurements.md, session 19). */
static inline void pf_pack_sb(const lp_rows *wr, int64_t sbrow) {
  const uintptr_t a = (uintptr_t)(wr->sc[0] + wr->pf), end = a + (uintptr_t)(8 * sbrow); /* the 4 rows' scales, biases */
  for (uintptr_t l = a & ~(uintptr_t)63; l < end; l += 64) _mm_prefetch((const char *)l, PF_HINT);
}

/* SEQ1: a call in the natural layout (qx_buf.nat: fewer than 4 activation rows, n = 8) on the MLX layout runs each
 * 4-row block's rows one after another (NTILE_SEQ; a tail block's rows by NTILE 1x1) instead of side by side (NTILE
 * 4x1): a thread's codes are then one forward stream (a matrix's rows are contiguous), every line prefetched SEQ1_PF
 * bytes on, as the interleaved pack's ILTILE reads its units (IL1_BYTES), instead of 4 streams 1408 bytes apart
 * prefetched PF1_ROWS rows on. Each row's operations are NTILE's (tests/test_kernels.c, check_lp_rows_equal), so the
 * bits are the same. 2-core Zen 5 EPYC, 26B gate/up [1408, 2816] 4-bit g64, M = 1, ceiling bench medians of 15,
 * alternated in the same windows (docs/results/cpu-s27/m17_ab1_*.txt), ms, 4 rows side by side / rows one after
 * another by NTILE 1x1 calls / NTILE_SEQ / ggml q4_K_8x8: -t 1, active wait, 0.188-0.207 / 0.104-0.109 /
 * 0.098-0.101 / 0.077-0.079; -t 2 (unloaded rounds, active) 0.096-0.098 / 0.054-0.058 / - / 0.051; SEQ1_PF 2048,
 * 8192 or 16384 and prefetcht0 within the spread. The down product [2816, 704] (by step, 352-byte rows) was slower
 * with its rows one after another (0.052 against 0.037 ms): not nat, it keeps the 4-row tile. */
#ifndef SEQ1
#define SEQ1 1
#endif
#ifndef SEQ1_PF
#define SEQ1_PF 4096
#endif
/* The tiles of rt (<= 4) weight rows wr (pk: on the 4-row pack) times activation rows t0 .. t0 + T - 1. */
static void vnni_tiles(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, int B, int pk,
                       const lp_rows *wrp, int64_t rt) {
  const lp_rows wr = *wrp;
  const vtiles *vt = vtile_table(B, xb->tr_n, pk);
  const vtile_fn *tf = vt->f;
  const vtile_fn f41 = xb->nat ? vt->nat[0] : tf[1], f11 = xb->nat ? vt->nat[1] : tf[3]; /* T < 4 if nat */
  int64_t t = 0;
  const int seq = SEQ1 && xb->nat && !pk; /* rows one after another: one forward stream (SEQ1 above) */
  if (rt == 4 && seq) {
    lp_rows ws = wr;
    ws.pf1 = SEQ1_PF;
    const vtile_fn fs = B == 2 ? ntiles_2_4x1 : B == 4 ? ntiles_4_4x1 : ntiles_8_4x1; /* nat: B = 2, 4 or 8 */
    for (; t < T; t++) fs(y + t * ldy, ldy, xb, t0 + t, &ws, NULL);
    return;
  }
  if (rt == 4) {
    int8_t *pw = vt->prep && T >= TPREP_MIN_T ? dg_kscratch(DG_KSCRATCH_LPW, (size_t)4 * (size_t)xb->nblk * xb->tr_n * 64 * PL(B)) : NULL;
    if (pw) { /* 4 rows x nblk blocks of n 64-byte vectors (NULL when out of memory: the tiles that transpose) */
      vt->prep(pw, xb, &wr);
      tf += 4;
    }
    for (; t + 4 <= T; t += 4) tf[0](y + t * ldy, ldy, xb, t0 + t, &wr, pw);
    for (; t < T; t++) (pw ? tf[1] : f41)(y + t * ldy, ldy, xb, t0 + t, &wr, pw);
    return;
  }
  for (int i = 0; i < rt; i++) {
    lp_rows w1 = wr; /* row i alone */
    w1.row[0] = wr.row[i], w1.tail[0] = wr.tail[i], w1.sc[0] = wr.sc[i], w1.bi[0] = wr.bi[i];
    if (seq) w1.pf1 = SEQ1_PF;
    int64_t tt = 0;
    for (; tt + 4 <= T; tt += 4) tf[2](y + tt * ldy + i, ldy, xb, t0 + tt, &w1, NULL);
    for (; tt < T; tt++) f11(y + tt * ldy + i, ldy, xb, t0 + tt, &w1, NULL);
  }
}

static void vnni_rows(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, const dg_weight *w,
                      const dg_cpu_pack_geom *g, int64_t r0, int64_t rt) {
  lp_rows wr;
  lp_rows_of(&wr, w, g, xb->nat, r0, rt);
  if (g->pack && rt == 4 && T >= 4 && wr.pf) pf_pack_sb(&wr, g->sbrow); /* the tiles with wr.pf run */
  vnni_tiles(y, ldy, xb, t0, T, w->bits, g->pack != NULL, &wr, rt);
}

/* The R rows of unit u of an interleaved pack as TPREP writes a 4-row block from the MLX layout, sub-pass after
 * sub-pass: row j's blocks of 8 steps transposed (tr_dwords) into pw[j][blk][k][64] (so sub-pass p's 4 rows start at
 * pw + 4 p nblk 512, as the tiles on prepared rows read them), the steps past a row's end zero (the pack's zeros, or
 * not loaded: t_load's masked loads give the same); and the R rows' scales and biases copied to sb (row j's ng
 * scales at sb + 2 j sbrow, its biases at + sbrow) for the tiles' lp_rows. Reads the unit forward, once, and
 * prefetches every line ILP_BYTES on. */
/* ILP_BYTES (same bench, M = 8 / 16 / 64, three alternations): 0: 0.196-0.200 / 0.240-0.248 / 0.561-0.585 ms, 4 KiB
 * 0.126-0.133 / 0.166-0.171 / 0.487-0.494, 8 KiB 0.116-0.117 / 0.160-0.164 / 0.482-0.502; the MLX layout 0.132-0.149 /
 * 0.166-0.172 / 0.482-0.613 (docs/results/cpu-s21/il21_sweep5.txt). */
#ifndef ILP_BYTES
#define ILP_BYTES 8192
#endif
#if TPREP_PLANES
#define IL_PREP_B(x) , x /* the planes to unpack */
#else
#define IL_PREP_B(x)
#endif
static void il_prep(int8_t *pw, char *sb, const dg_cpu_pack_geom *g, int64_t u, int64_t nblk IL_PREP_B(int B)) {
  const int R = g->R;
  const int64_t esz = g->esz, sbrow = g->sbrow;
  for (int64_t blk = 0; blk < nblk; blk++) {
    const char *bb = dg_cpu_il_block(g, u, blk);
    const int last = blk == nblk - 1, ns = last ? g->ns_last : 8, n = last ? g->n_last : 16;
    const char *sc = bb + 64 * R * ns;
    for (int j = 0; j < R; j++) {
      const char *cb = bb + (j / 4) * ns * 256 + (j % 4) * 64;
      __m512i v[8];
      for (int k = 0; k < 8; k++) {
        v[k] = k < ns ? _mm512_loadu_si512(cb + k * 256) : _mm512_setzero_si512();
        if (ILP_BYTES && k < ns) _mm_prefetch(cb + k * 256 + ILP_BYTES, IL1_HINT);
      }
      tr_dwords(v, 8);
#if TPREP_PLANES
      for (int k = 0; k < 8; k++)
        for (int q = 0; q < 8 / B; q++) _mm512_store_si512(pw + (((j * nblk + blk) * 8 + k) * (8 / B) + q) * 64, t_unpack(v[k], B, q));
#else
      for (int k = 0; k < 8; k++) _mm512_store_si512(pw + ((j * nblk + blk) * 8 + k) * 64, v[k]);
#endif
      memcpy(sb + 2 * j * sbrow + 16 * blk * esz, sc + j * n * esz, (size_t)(n * esz));
    }
    if (ILP_BYTES)
      for (int64_t o = 0; o < R * n * esz; o += 64) _mm_prefetch(sc + o + ILP_BYTES, IL1_HINT);
  }
  const char *bi = g->il + (size_t)u * (size_t)g->U + g->boff;
  for (int j = 0; j < R; j++) memcpy(sb + (2 * j + 1) * sbrow, bi + j * g->ng * esz, (size_t)(g->ng * esz));
  if (ILP_BYTES)
    for (int64_t o = 0; o < g->U - g->boff; o += 64) _mm_prefetch(bi + o + ILP_BYTES, IL1_HINT);
}

/* Weight rows [lo, hi) of unit u of an interleaved pack (g->il) times activation rows t0 .. t0 + T - 1, into
 * y[t ldy + r - lo] for the unit's rows r in [lo, hi). A call in the natural layout (T < 4) runs ILTILE on the unit;
 * others run the tiles on prepared rows (ttilep_: vnni_tiles takes them from TPREP_MIN_T rows, here for any T) on
 * each whole 4-row sub-pass the call takes (the unit prepared once, il_prep), and on the rows of a sub-pass taken in
 * part (a call's first or last rows) the tiles of the MLX layout on the unit copied out (dg_cpu_il_unit_rows) into
 * the thread's scratch. Either way the bits of the unpacked weight: each row's operations do not depend on the tile
 * it runs in (tests/test_kernels.c, check_lp_rows_equal). Out of scratch memory: the exact product of the rows. */
static void il_unit(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, const dg_weight *w,
                    const dg_cpu_pack_geom *g, int64_t u, int64_t lo, int64_t hi) {
  const int64_t R = g->R, a = u * R > lo ? u * R : lo, b = u * R + R < hi ? u * R + R : hi;
  if (xb->nat) {
    const iltile_fn f = iltile_of(w->bits, (int)R);
    float out[8];
    for (int64_t t = 0; t < T; t++) {
      f(out, xb, t0 + t, g, w->sb_dtype, u);
      for (int64_t r = a; r < b; r++) y[t * ldy + r - lo] = out[r - u * R];
    }
    return;
  }
  const int64_t rs = (g->rb + 63) / 64 * 64, ss = (g->sbrow + 63) / 64 * 64, st = rs + 2 * ss;
  void *part[2];
  int8_t *pw = dg_kscratch(DG_KSCRATCH_LPW, (size_t)R * (size_t)xb->nblk * 8 * 64 * PL(w->bits));
  const size_t need[2] = {(size_t)(R * st), (size_t)(2 * R * g->sbrow)}; /* a unit copied out; R rows' scales, biases */
  if (!pw || dg_kscratch_parts(DG_KSCRATCH_LPIL, 2, need, part)) {
    dg_kernels_avx512_impl()->matmul(y + a - lo, ldy, xb->x + t0 * xb->ldx, xb->ldx, T, w, a, b - a, 1);
    return;
  }
  char *buf = part[0], *sb = part[1];
  int copied = 0, prepped = 0;
  const vtile_fn *tp = vtile_table(w->bits, 8, 0)->f + 4; /* the 4x4 and 4x1 tiles on prepared rows */
  for (int p = 0; p < R / 4; p++) {
    const int64_t q0 = u * R + 4 * p, qa = q0 > a ? q0 : a, qb = q0 + 4 < b ? q0 + 4 : b;
    if (qa >= qb) continue;
    lp_rows wr;
    memset(&wr, 0, sizeof wr);
    wr.sbt = w->sb_dtype;
    wr.rbf = g->rb - g->tl;
    if (qa == q0 && qb == q0 + 4) {
      if (!prepped) il_prep(pw, sb, g, u, xb->nblk IL_PREP_B(w->bits)), prepped = 1;
      const int8_t *pp = pw + (size_t)4 * p * (size_t)xb->nblk * 8 * 64 * PL(w->bits);
      for (int i = 0; i < 4; i++) {
        wr.sc[i] = sb + 2 * (4 * p + i) * g->sbrow;
        wr.bi[i] = wr.sc[i] + g->sbrow;
      }
      int64_t t = 0;
      for (; t + 4 <= T; t += 4) tp[0](y + t * ldy + q0 - lo, ldy, xb, t0 + t, &wr, pp);
      for (; t < T; t++) tp[1](y + t * ldy + q0 - lo, ldy, xb, t0 + t, &wr, pp);
      continue;
    }
    if (!copied) dg_cpu_il_unit_rows(g, u, buf, st), copied = 1;
    for (int64_t r = qa; r < qb; r++) {
      const uint8_t *c = (const uint8_t *)buf + (r - u * R) * st;
      const int i = (int)(r - qa);
      wr.row[i] = c, wr.tail[i] = c + g->rb - g->tl;
      wr.sc[i] = (const char *)c + rs, wr.bi[i] = (const char *)c + rs + ss;
    }
    vnni_tiles(y + qa - lo, ldy, xb, t0, T, w->bits, 0, &wr, qb - qa);
  }
}

/* ---- AMX int8 (issue 17): 4-bit g64 products of 16 or more activation rows ------------------------------------
 *
 * The same integers and the same fp32 operations as the transposed tiles on prepared rows (TTILEP44, TTILE 4x1), so
 * the same bits: for each weight row i, activation row j and group g the integer sum_{k in g} q_k qx_k is exact in
 * int32 however it is summed (|.| <= 64 * 15 * 127 < 2^24, so its fp32 conversion is exact too); TDPBUSD (Intel SDM:
 * u8 A x s8 B, four products a dword, no saturation) sums a 16 x 16 tile of them per instruction, A = 16 weight rows x
 * one group's 64 codes (amx_prep_w: even codes, then odd), B = the group's activation codes of 16 rows in the same
 * order (qx_buf.qa). The fold is TTILEP44's, element for element: the accumulator lane l of (i, j) takes, block after
 * block, fma(float(isum), s * dp, acc) with isum and s of group 16 blk + TR_GROUP[8][l] (the lane order of the
 * transposed layout) and dp = qx_buf.dp's lane l, then the bias part fma(b, c, acc) block after block with group
 * 16 blk + l, then _mm512_reduce_add_ps's tree over the 16 lanes (gcc 12: the high 8 lanes plus the low 8, then 4,
 * then lanes 0 + 2 and 1 + 3, then their sum). Here a vector holds (i, l) for 16 activation rows j instead of (i, j)
 * for 16 lanes l: the same scalar operations on the same operands (mul and fma are commutative in their factors
 * bit for bit, and each operand order is kept), only in other vector lanes.
 * The tile instructions are inline asm (the toolchain's assembler knows them; no -mamx flags, and no
 * _tile_loadconfig: gcc 12 drops stores to the 64-byte configuration because that intrinsic claims to read 8 bytes;
 * here ldtilecfg takes the whole struct as its "m" operand). */
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef AMX_MIN_T
/* Activation rows (an expert's, in the grouped product) from which the AMX tiles run. Session 31, Intel Xeon VM (2 cores,
 * loaded 4-6, not under the bench lock), -t 2, gate/up [1408, 2816], `bench --protocol ceiling --rows ...`, ms VNNI /
 * AMX (4 groups in flight): M = 16 0.35-0.40 / 0.42-0.49, 24 0.48 / 0.49-0.53, 32 0.58-0.64 / 0.50-0.52, 48 0.76-0.90 /
 * 0.75: from 32. At 16 a 16-row block's fixed cost (the weights' unpacking into A tiles, one B tile's fold) is not
 * yet understood (no PMU on that VM). */
#define AMX_MIN_T 32
#endif
/* 4-row blocks ahead (wr->pf units) that amx_prep_w prefetches the weights: 4 = the next 16-row block. Same VM, M = 16 /
 * 32 / 64 with AMX_MIN_T = 16, two rounds, ms: 4 0.39-0.41 / 0.45-0.46 / 0.78-0.81, 8 0.37-0.39 / 0.46-0.48 /
 * 0.80-0.81, 16 0.37-0.39 / 0.47 / 0.77-0.86: no difference. A diagnostic build (timing only, wrong bits) at M = 16 /
 * 32 / 256: whole 0.37-0.40 / 0.45-0.50 / 2.81-2.87 ms; without the fold 0.34 / 0.36 / 1.76; without the tile products
 * 0.28 / 0.30 / 1.37; without amx_prep_w 0.23 / 0.31 / 2.43; the activations' quantization and amx_prep_w alone 0.20 /
 * 0.16 / 0.54: at 16 rows the weights' unpacking (and reading) is half the time. */
#ifndef AMX_PFB
#define AMX_PFB 4
#endif
/* AMX_PFS 1: those prefetches spread over the first activation tile's tile products (two code lines of each of the
 * 16 rows per 4 groups) instead of issued all at once in amx_prep_w (0). Same VM, under the bench lock, load 5.8-6.8,
 * AMX_MIN_T 16, two rounds, ms 0 / 1: M = 16 0.38-0.41 / 0.33-0.34, 32 0.47-0.49 / 0.44-0.45, 64 0.79-0.81 /
 * 0.76-0.79, 256 2.76-2.78 / 2.65-2.76. Then VNNI / AMX, three rounds (load 6.7-7.7): M = 16 0.33-0.40 / 0.33-0.41, 24
 * 0.44-0.49 / 0.40-0.49, 32 0.56-0.61 / 0.42-0.48: at 16 and 24 the same within the noise, so AMX_MIN_T stays 32. */
#ifndef AMX_PFS
#define AMX_PFS 1
#endif

/* Whether the CPU has AMX-TILE and AMX-INT8 (cpuid leaf 7: EDX bits 24, 25) and Linux let this process use the tile
 * data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18: without it the first tile instruction is SIGILL);
 * asked once, process-wide. */
static int amx_usable(void) {
  static int ok = -1;
  int v = __atomic_load_n(&ok, __ATOMIC_ACQUIRE);
  if (v >= 0) return v;
  unsigned a = 0, b = 0, c = 0, d = 0;
  v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1) &&
      syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  __atomic_store_n(&ok, v, __ATOMIC_RELEASE);
  return v;
}

int dg_cpu_amx_usable(void) { return amx_usable(); }

typedef struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) amx_cfg;
_Static_assert(sizeof(amx_cfg) == 64, "the tile configuration is 64 bytes");
/* tmm0-7 all 16 rows of 64 bytes (palette 1), in the calling thread. */
static void amx_config(void) {
  amx_cfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
}
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AMX_LOAD(t, p, st) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(p), "r"((int64_t)(st)) : "memory")
#define AMX_DP(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define AMX_STORE(t, p, st) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(p), "r"((int64_t)(st)) : "memory")
#define AMX_RELEASE() __asm__ volatile("tilerelease" ::)

/* Whether a product of w over T_max activation rows (the most of one expert) takes the AMX tiles: the switch
 * DGEMMA_CPU_AMX (read at each call), this CPU and process, 4-bit codes in groups of 64 in the transposed layout of 8
 * dwords a group (the fold above is that layout's), not the interleaved pack, at least AMX_MIN_T rows. */
static int amx_wanted(const dg_weight *w, const dg_cpu_pack_geom *g, int64_t T_max) {
  return T_max >= AMX_MIN_T && w->bits == 4 && w->group_size == 64 && !g->il &&
         dg_lp_tr_n(w->cols, w->bits, w->group_size) == 8 && dg_sw_get(DG_SW_CPU_AMX) && amx_usable();
}

/* The bytes of a 16-row block's int32 tile sums (amx_tile16's C). */
static size_t amx_c_bytes(int64_t nblk) { return (size_t)nblk * 16 * 1024; }

/* 16 weight rows (wr[k]: rows 4 k .. 4 k + 3; each code line prefetches the same line 16 rows on, 4 wr->pf) as TDPBUSD A tiles, A [ng][16][64]: row r's group g, its 32 bytes' low
 * nibbles (codes 2 m) then high nibbles (codes 2 m + 1); sP, bF [16][nblk * 16]: the scales in each block's lane order
 * (TTILEP44's permuted load_sb) and the biases in natural order (VTILE_BIAS_STORE's), fp32, zero past ng. */
static void amx_prep_w(int8_t *A, float *sP, float *bF, const lp_rows *wr, int64_t ng, int64_t nblk) {
  const __m256i lo = _mm256_set1_epi8(0x0f);
  const __m512i pg = _mm512_loadu_si512(TR_GROUP[2]);
  for (int r = 0; r < 16; r++) {
    const lp_rows *s = &wr[r / 4];
    const int i = r % 4;
    for (int64_t g = 0; g < ng; g++) {
      const int64_t o = g * 32; /* whole groups: o + 32 <= rbf below it */
      const uint8_t *a = o < s->rbf ? s->row[i] + ((o & ~(int64_t)63) << s->ls) + (o & 63) : s->tail[i] + (o - s->rbf);
      if (!AMX_PFS && !(o & 63) && s->pf) _mm_prefetch((const char *)a + AMX_PFB * s->pf, PF_HINT); /* the next 16-row block's line */
      const __m256i v = _mm256_loadu_si256((const __m256i *)a);
      _mm256_store_si256((__m256i *)(A + (g * 16 + r) * 64), _mm256_and_si256(v, lo));
      _mm256_store_si256((__m256i *)(A + (g * 16 + r) * 64 + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), lo));
    }
    for (int64_t blk = 0; blk < nblk; blk++) {
      const int64_t g16 = blk * 16;
      const int n = (int)(ng - g16 < 16 ? ng - g16 : 16);
      _mm512_store_ps(sP + (r * nblk + blk) * 16, _mm512_permutexvar_ps(pg, load_sb(s->sbt, s->sc[i], g16, n)));
      _mm512_store_ps(bF + (r * nblk + blk) * 16, load_sb(s->sbt, s->bi[i], g16, n));
    }
  }
}

/* y[j, i] (stride ldy) for the 16 weight rows of A, sP, bF and activation rows t0 + j, j < nt (<= 16; the tile's
 * other rows are computed on qa's zero or other rows and dropped); C: nblk * 16 KiB of the thread's scratch. */
static void amx_tile16(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t nt, const int8_t *A, const float *sP,
                       const float *bF, int32_t *C, const lp_rows *wr) {
  const int64_t ng = xb->ng, nblk = xb->nblk, tp = xb->tpad;
  const int8_t *qb = xb->qa + t0 * 4;
  const int32_t *tr = TR_GROUP[2];
  /* C [blk][l][i][j]: the integer sums of group 16 blk + tr[l] (zero past ng), four groups in flight (tmm0-3 their
   * sums, tmm4-5 and tmm6-7 their A and B tiles, alternating): one tile's chain of zero, product and store is
   * serial, four are not */
  for (int64_t blk = 0; blk < nblk; blk++)
    for (int l = 0; l < 16; l += 4) {
      int64_t g[4];
      int all = 1;
      for (int q = 0; q < 4; q++) g[q] = blk * 16 + tr[l + q], all &= g[q] < ng;
      int32_t *c = C + (blk * 16 + l) * 256;
      if (AMX_PFS && wr) /* the next 16-row block's code lines of these 4 groups, spread over the tile products */
        for (int r = 0; r < 16; r++) {
          const lp_rows *s = &wr[r / 4];
          const int64_t o = (blk * 16 + l) * 32;
          if (!s->pf || o >= s->rbf) continue;
          _mm_prefetch((const char *)s->row[r % 4] + (o << s->ls) + AMX_PFB * s->pf, PF_HINT);
          _mm_prefetch((const char *)s->row[r % 4] + ((o + 64) << s->ls) + AMX_PFB * s->pf, PF_HINT);
        }
      if (!all) { /* a partial last block: one group at a time */
        for (int q = 0; q < 4; q++) {
          if (g[q] >= ng) {
            memset(c + q * 256, 0, 1024);
            continue;
          }
          AMX_ZERO(0);
          AMX_LOAD(4, A + g[q] * 1024, 64);
          AMX_LOAD(6, qb + g[q] * 64 * tp, 4 * tp);
          AMX_DP(0, 4, 6);
          AMX_STORE(0, c + q * 256, 64);
        }
        continue;
      }
      AMX_ZERO(0);
      AMX_ZERO(1);
      AMX_ZERO(2);
      AMX_ZERO(3);
      AMX_LOAD(4, A + g[0] * 1024, 64);
      AMX_LOAD(6, qb + g[0] * 64 * tp, 4 * tp);
      AMX_DP(0, 4, 6);
      AMX_LOAD(5, A + g[1] * 1024, 64);
      AMX_LOAD(7, qb + g[1] * 64 * tp, 4 * tp);
      AMX_DP(1, 5, 7);
      AMX_LOAD(4, A + g[2] * 1024, 64);
      AMX_LOAD(6, qb + g[2] * 64 * tp, 4 * tp);
      AMX_DP(2, 4, 6);
      AMX_LOAD(5, A + g[3] * 1024, 64);
      AMX_LOAD(7, qb + g[3] * 64 * tp, 4 * tp);
      AMX_DP(3, 5, 7);
      AMX_STORE(0, c, 64);
      AMX_STORE(1, c + 256, 64);
      AMX_STORE(2, c + 512, 64);
      AMX_STORE(3, c + 768, 64);
    }
  for (int i = 0; i < 16; i++) {
    __m512 acc[16];
    UNROLL for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nblk; blk++) {
      const float *s = sP + (i * nblk + blk) * 16;
      UNROLL for (int l = 0; l < 16; l++)
        acc[l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C + (blk * 16 + l) * 256 + i * 16)),
                                 _mm512_mul_ps(_mm512_set1_ps(s[l]), _mm512_loadu_ps(xb->dpT + (blk * 16 + l) * tp + t0)), acc[l]);
    }
    for (int64_t blk = 0; blk < nblk; blk++) {
      const float *b = bF + (i * nblk + blk) * 16;
      UNROLL for (int l = 0; l < 16; l++)
        acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(b[l]), _mm512_loadu_ps(xb->xcT + (blk * 16 + l) * tp + t0), acc[l]);
    }
    /* _mm512_reduce_add_ps's tree, lane l of it being acc[l] */
    UNROLL for (int l = 0; l < 8; l++) acc[l] = _mm512_add_ps(acc[l + 8], acc[l]);
    UNROLL for (int l = 0; l < 4; l++) acc[l] = _mm512_add_ps(acc[l + 4], acc[l]);
    const __m512 e0 = _mm512_add_ps(acc[0], acc[2]), e1 = _mm512_add_ps(acc[1], acc[3]);
    float out[16] __attribute__((aligned(64)));
    _mm512_store_ps(out, _mm512_add_ps(e0, e1));
    for (int64_t j = 0; j < nt; j++) y[j * ldy + i] = out[j];
  }
}

/* Weight rows r0 .. r0 + 15 of w times activation rows t0 .. t0 + T - 1 (qx_buf.qa) into y [T, 16] (stride ldy), in
 * a thread that ran amx_config; returns -1 (nothing written) when out of memory. */
static int amx_rows16(float *y, int64_t ldy, const qx_buf *xb, int64_t t0, int64_t T, const dg_weight *w,
                      const dg_cpu_pack_geom *g, int64_t r0) {
  const int64_t ng = xb->ng, nblk = xb->nblk;
  void *part[4];
  if (dg_kscratch_parts(DG_KSCRATCH_AMXW, 4,
                        (const size_t[4]){(size_t)ng * 1024, (size_t)nblk * 1024, (size_t)nblk * 1024, amx_c_bytes(nblk)},
                        part))
    return -1;
  lp_rows wr[4];
  for (int k = 0; k < 4; k++) lp_rows_of(&wr[k], w, g, 0, r0 + 4 * k, 4);
  amx_prep_w(part[0], part[1], part[2], wr, ng, nblk);
  for (int64_t t = 0; t < T; t += 16)
    amx_tile16(y + t * ldy, ldy, xb, t0 + t, T - t < 16 ? T - t : 16, part[0], part[1], part[2], part[3], t ? NULL : wr);
  return 0;
}

/* ---- entry points ---------------------------------------------------------- */

static int lp_kind(const dg_weight *w) {
  if (!w->bits) return w->dtype == DG_BF16 ? 1 : 0;
  return w->bits == 2 || w->bits == 4 || w->bits == 8 ? 2 : 0;
}

/* The activations of a call in the form its weight format wants, in the calling thread's
 * scratch (scratch.h: nothing to free; valid until its next low-precision product). */
typedef struct lp_x { uint16_t *xb; int64_t Kp; qx_buf q; dg_cpu_pack_geom g; } lp_x;

static int lp_prepare(lp_x *p, int kind, const float *x, int64_t ldx, int64_t T, int64_t T_max, const dg_weight *w,
                      int n_threads, int *amx) {
  memset(p, 0, sizeof *p);
  if (kind == 1) {
    p->Kp = (w->cols + 31) / 32 * 32;
    p->xb = dg_kscratch(DG_KSCRATCH_LPX, (size_t)T * (size_t)p->Kp * 2); /* the calling thread's, kept */
    if (!p->xb) return -1;
    x_to_bf16(x, ldx, T, w->cols, p->Kp, p->xb, n_threads);
    return 0;
  }
  p->g = dg_cpu_pack_geom_of(w); /* where the rows are (the pack or the MLX layout), once per call */
  *amx = amx_wanted(w, &p->g, T_max);
  return qx_quantize(&p->q, x, ldx, T, T_max, w->cols, w->bits, w->group_size, n_threads, *amx);
}

static void lp_block(float *y, int64_t ldy, const lp_x *p, int kind, int64_t t0, int64_t T, const dg_weight *w,
                     int64_t r0, int64_t rt) {
  if (kind == 1) bf16_rows(y, ldy, p->xb + t0 * p->Kp, p->Kp, T, w, r0, rt);
  else vnni_rows(y, ldy, &p->q, t0, T, w, &p->g, r0, rt);
}

static void matmul_lp(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int64_t row0,
                      int64_t N, int n_threads) {
  const int kind = lp_kind(w);
  const int tr = kind == 2 ? dg_lp_tr_n(w->cols, w->bits, w->group_size) : -1;
  if (MV1 && kind == 2 && T > 0 && T < 4 && (tr == 8 || (MV1_BYSTEP && tr == 0)) && !w->cpu_pack &&
      dg_cpu_pack_wanted(NULL, 0) != DG_CPU_PACK_SEQ1) {
    /* the matrix-vector product (MV1: T < 4, the natural layout n = 8 or by step), each thread's rows in one run; the
     * activations quantized by each thread into its own scratch (the same function on the same rows: the same codes),
     * in one parallel region (2 threads: 3.2 against 4.1 us a call of fixed cost, session 30; prefetching each
     * stream's first 4-16 KiB before the quantization: no change) */
    const dg_cpu_pack_geom g = dg_cpu_pack_geom_of(w);
    int fail = 0;
#pragma omp parallel num_threads(n_threads) reduction(| : fail)
    {
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t a = N * id / nt, b = N * (id + 1) / nt;
      qx_buf q;
      fail = qx_quantize(&q, x, ldx, T, T, w->cols, w->bits, w->group_size, 1, 0) != 0;
      for (int64_t t = 0; t < T && b > a && !fail; t++) mv1_rows(y + t * ldy + a, &q, t, w, &g, row0 + a, b - a);
    }
    if (fail) dg_kernels_avx512_impl()->matmul(y, ldy, x, ldx, T, w, row0, N, n_threads); /* out of memory: exact */
    return;
  }
  lp_x p;
  int amx = 0;
  if (!kind || T <= 0 || lp_prepare(&p, kind, x, ldx, T, T, w, n_threads, &amx)) { /* exact path (also when out of memory) */
    dg_kernels_avx512_impl()->matmul(y, ldy, x, ldx, T, w, row0, N, n_threads);
    return;
  }
  if (amx) { /* 16-row blocks by the AMX tiles (the same bits), the last N % 16 rows (and any block out of memory) by 4 */
    const int64_t n16 = N / 16, nb4 = (N - n16 * 16 + 3) / 4;
#pragma omp parallel num_threads(n_threads)
    {
      amx_config();
#pragma omp for schedule(static) nowait
      for (int64_t b = 0; b < n16; b++)
        if (amx_rows16(y + b * 16, ldy, &p.q, 0, T, w, &p.g, row0 + b * 16))
          for (int k = 0; k < 4; k++) lp_block(y + b * 16 + 4 * k, ldy, &p, kind, 0, T, w, row0 + b * 16 + 4 * k, 4);
      AMX_RELEASE();
#pragma omp for schedule(static)
      for (int64_t b = 0; b < nb4; b++) {
        const int64_t n = n16 * 16 + b * 4;
        lp_block(y + n, ldy, &p, kind, 0, T, w, row0 + n, N - n < 4 ? N - n : 4);
      }
    }
    return;
  }
  if (kind == 2 && p.g.il) { /* the interleaved pack's units, one forward stream per thread */
    const int64_t R = p.g.R, u0 = row0 / R, u1 = (row0 + N + R - 1) / R;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t u = u0; u < u1; u++) il_unit(y, ldy, &p.q, 0, T, w, &p.g, u, row0, row0 + N);
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
  int64_t T_max = 0; /* the most rows of one expert */
  for (int e = 0; e < E; e++) T_max = start[e + 1] - start[e] > T_max ? start[e + 1] - start[e] : T_max;
  lp_x p;
  int amx = 0;
  if (!kind || R <= 0 || lp_prepare(&p, kind, x, ldx, R, T_max, w, n_threads, &amx)) {
    dg_kernels_avx512_impl()->matmul_grouped(y, ldy, x, ldx, start, E, w, rows_per_expert, row_off, N, n_threads);
    return;
  }
  if (kind == 2 && p.g.il) { /* the interleaved pack: tasks of (expert, unit), up to nu units an expert */
    const int64_t R = p.g.R, nu = (N + R - 1) / R + 1, ntask = (int64_t)E * nu;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 8)
    for (int64_t task = 0; task < ntask; task++) {
      const int e = (int)(task / nu);
      const int64_t lo = (int64_t)e * rows_per_expert + row_off, u = lo / R + task % nu, T = start[e + 1] - start[e];
      if (T <= 0 || u * R >= lo + N) continue;
      il_unit(y + (int64_t)start[e] * ldy, ldy, &p.q, start[e], T, w, &p.g, u, lo, lo + N);
    }
    return;
  }
  if (amx) { /* an expert's 16-row blocks by the AMX tiles where it has AMX_MIN_T rows or more, else (and its last
              * N % 16 rows, and any block out of memory) 4-row blocks as below: the same bits */
    const int64_t n16 = N / 16, per = n16 + (N - n16 * 16 + 3) / 4, ntask = (int64_t)E * per;
#pragma omp parallel num_threads(n_threads)
    {
      amx_config();
#pragma omp for schedule(dynamic, 4)
      for (int64_t task = 0; task < ntask; task++) {
        const int e = (int)(task / per);
        const int64_t b = task % per, T = start[e + 1] - start[e], base = (int64_t)e * rows_per_expert + row_off;
        if (T <= 0) continue;
        float *ye = y + (int64_t)start[e] * ldy;
        if (b < n16) {
          if (T >= AMX_MIN_T && !amx_rows16(ye + b * 16, ldy, &p.q, start[e], T, w, &p.g, base + b * 16)) continue;
          for (int k = 0; k < 4; k++) lp_block(ye + b * 16 + 4 * k, ldy, &p, kind, start[e], T, w, base + b * 16 + 4 * k, 4);
          continue;
        }
        const int64_t n = n16 * 16 + (b - n16) * 4;
        lp_block(ye + n, ldy, &p, kind, start[e], T, w, base + n, N - n < 4 ? N - n : 4);
      }
      AMX_RELEASE();
    }
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
