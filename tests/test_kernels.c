/* test_kernels.c: every SIMD matmul implementation against the scalar fp32
 * oracle (cpu/ref.c), for f32/bf16/f16 weights and odd shapes; and the
 * bf16/f16 conversions against hand-worked values.
 *
 * Tolerance (derived): both kernels compute an fp32 dot product of length K
 * in different orders. Each result is within gamma_K * sum_k |x_k w_k| of the
 * exact value, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and
 * Stability of Numerical Algorithms, eq. 3.5), so two of them differ by at
 * most 2 gamma_K sum |x_k w_k|. Weights are widened exactly (bf16/f16 -> f32
 * is exact), so the same bound holds for every dtype. */
#include <float.h>
#include <math.h>

#include <sys/mman.h>

#include "base/dg_mem.h"
#include "model/context.h"
#include "cpu/kernels.h"
#include "io/quant.h"
#include "testutil.h"

static uint64_t rs = 88172645463325252ull;
static float frand(void) { /* xorshift, uniform in [-1, 1) */
  rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
  return (float)((double)(rs >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void check_impl(const dg_kernels *impl, dg_dtype dt, int T, int N, int K, int row0, double *worst) {
  const dg_kernels *ref = dg_kernels_ref();
  int rows = N + row0;
  size_t es = dg_dtype_size(dt);
  void *w = malloc((size_t)rows * K * es + 1);
  float *wf = malloc((size_t)rows * K * sizeof(float));
  float *x = malloc((size_t)T * (K + 3) * sizeof(float));
  int ldx = K + 3, ldy = N + 5;
  float *y0 = malloc((size_t)T * ldy * sizeof(float)), *y1 = malloc((size_t)T * ldy * sizeof(float));
  for (int i = 0; i < rows * K; i++) {
    float v = frand() * 2.0f;
    if (dt == DG_BF16) { uint16_t h = dg_f32_to_bf16(v); memcpy((char *)w + 2 * i, &h, 2); wf[i] = dg_bf16_to_f32(h); }
    else if (dt == DG_F16) { uint16_t h = dg_f32_to_f16(v); memcpy((char *)w + 2 * i, &h, 2); wf[i] = dg_f16_to_f32(h); }
    else { memcpy((char *)w + 4 * i, &v, 4); wf[i] = v; }
  }
  for (int i = 0; i < T * ldx; i++) x[i] = frand();
  for (int i = 0; i < T * ldy; i++) y0[i] = y1[i] = 12345.0f; /* guard values outside [0, N) must survive */
  dg_weight W = {.dtype = dt, .data = w, .rows = rows, .cols = K};
  ref->matmul(y0, ldy, x, ldx, T, &W, row0, N, 2);
  impl->matmul(y1, ldy, x, ldx, T, &W, row0, N, 2);
  const double u = ldexp(1.0, -24), gam = K * u / (1.0 - K * u);
  for (int t = 0; t < T; t++) {
    for (int n = 0; n < ldy; n++) {
      if (n >= N) { assert_true(y1[t * ldy + n] == 12345.0f); continue; }
      double mag = 0.0;
      for (int k = 0; k < K; k++) mag += fabs((double)x[t * ldx + k] * wf[(size_t)(row0 + n) * K + k]);
      double bound = 2.0 * gam * mag + 1e-30, err = fabs((double)y0[t * ldy + n] - y1[t * ldy + n]);
      if (err / bound > *worst) *worst = err / bound;
      if (err > bound)
        fail_msg("%s %s T=%d N=%d K=%d: y[%d,%d] = %.9g, oracle %.9g, |diff| %.3g > bound %.3g", impl->name,
                 dg_dtype_name(dt), T, N, K, t, n, y1[t * ldy + n], y0[t * ldy + n], err, bound);
    }
  }
  free(w); free(wf); free(x); free(y0); free(y1);
}

static void run_impl(const dg_kernels *impl) {
  static const int shapes[][4] = {{1, 1, 1, 0}, {3, 5, 7, 0}, {4, 4, 16, 1}, {5, 9, 17, 2}, {7, 13, 33, 0},
                                  {8, 8, 64, 3}, {17, 6, 100, 1}, {2, 31, 255, 0}, {64, 12, 256, 5}, {9, 3, 1000, 2}};
  dg_dtype dts[3] = {DG_F32, DG_BF16, DG_F16};
  double worst = 0.0;
  for (int d = 0; d < 3; d++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check_impl(impl, dts[d], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], &worst);
  printf("# %s vs oracle: largest |diff| / (2 gamma_K sum|x w|) = %.4f (must be <= 1)\n", impl->name, worst);
}

static void test_avx512(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512();
  if (!k) dg_test_skip("test_kernels avx512: this CPU (or build) has no AVX-512 kernels");
  run_impl(k);
}

static void test_avx2(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx2();
  if (!k) dg_test_skip("test_kernels avx2: this CPU (or build) has no AVX2 kernels");
  run_impl(k);
}

/* matmul_rows (the soft embedding's product over W's rows) of `impl` against
 * the oracle, bit for bit: kernels.h fixes the order over v and the rounding
 * of each term, so no tolerance is needed. bits 0: dtype dt; else MLX affine
 * with group G and bf16 scales/biases. x has exact zeros (skipped or added,
 * the same bits), guard columns past H must survive. */
static void check_rows(const dg_kernels *impl, dg_dtype dt, int bits, int G, int T, int V, int H, int nthr) {
  const dg_kernels *ref = dg_kernels_ref();
  dg_weight W = {.dtype = dt, .rows = V, .cols = H};
  float *wf = malloc((size_t)V * H * sizeof(float));
  void *data = NULL, *sc = NULL, *bi = NULL;
  for (int i = 0; i < V * H; i++) wf[i] = frand() * 0.1f;
  if (bits) {
    data = calloc((size_t)V, (size_t)dg_quant_row_bytes(H, bits));
    sc = malloc((size_t)V * (H / G) * 2);
    bi = malloc((size_t)V * (H / G) * 2);
    for (int v = 0; v < V; v++)
      dg_quant_row(wf + (size_t)v * H, H, bits, G, DG_BF16, (uint8_t *)data + (size_t)v * dg_quant_row_bytes(H, bits),
                   (uint16_t *)sc + (size_t)v * (H / G), (uint16_t *)bi + (size_t)v * (H / G));
    W = (dg_weight){.dtype = DG_U32, .data = data, .rows = V, .cols = H, .bits = bits, .group_size = G,
                    .sb_dtype = DG_BF16, .scales = sc, .biases = bi};
  } else {
    size_t es = dg_dtype_size(dt);
    data = malloc((size_t)V * H * es);
    for (int i = 0; i < V * H; i++) {
      if (dt == DG_BF16) { uint16_t h = dg_f32_to_bf16(wf[i]); memcpy((char *)data + 2 * i, &h, 2); }
      else if (dt == DG_F16) { uint16_t h = dg_f32_to_f16(wf[i]); memcpy((char *)data + 2 * i, &h, 2); }
      else memcpy((char *)data + 4 * i, &wf[i], 4);
    }
    W.data = data;
  }
  const int ldx = V + 2, ldy = H + 3;
  float *x = malloc((size_t)T * ldx * sizeof(float));
  float *y0 = malloc((size_t)T * ldy * sizeof(float)), *y1 = malloc((size_t)T * ldy * sizeof(float));
  for (int i = 0; i < T * ldx; i++) x[i] = (i % 5 == 1 || ((i / ldx) % 3 == 2 && i % 2)) ? 0.0f : fabsf(frand());
  for (int i = 0; i < T * ldy; i++) y0[i] = y1[i] = 777.0f;
  ref->matmul_rows(y0, ldy, x, ldx, T, &W, 1);
  impl->matmul_rows(y1, ldy, x, ldx, T, &W, nthr);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < ldy; j++)
      if (memcmp(&y0[t * ldy + j], &y1[t * ldy + j], 4))
        fail_msg("%s matmul_rows %s bits %d G %d T=%d V=%d H=%d threads %d: y[%d,%d] = %.9g, oracle %.9g (not the same "
                 "bits)", impl->name, dg_dtype_name(dt), bits, G, T, V, H, nthr, t, j, y1[t * ldy + j], y0[t * ldy + j]);
  /* the oracle itself is the soft embedding's former loop: s = 0; s += x[v] * W[v] for x[v] != 0 */
  float *s = calloc((size_t)H, sizeof(float));
  for (int v = 0; v < V; v++)
    if (x[(T - 1) * ldx + v] != 0.0f) dg_weight_axpy_row(s, x[(T - 1) * ldx + v], &W, v);
  assert_memory_equal(s, y0 + (size_t)(T - 1) * ldy, (size_t)H * sizeof(float));
  free(s); free(wf); free(data); free(sc); free(bi); free(x); free(y0); free(y1);
}

static void run_rows(const dg_kernels *impl) {
  static const int shapes[][4] = {{1, 7, 5, 1}, {4, 33, 17, 2}, {5, 300, 64, 1}, {9, 70, 200, 2}, {16, 257, 129, 2},
                                  {3, 1000, 31, 1}, {6, 50, 300, 3}};
  dg_dtype dts[3] = {DG_F32, DG_BF16, DG_F16};
  int n = 0;
  for (int d = 0; d < 3; d++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++, n++)
      check_rows(impl, dts[d], 0, 0, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
  static const int q[][6] = {{4, 64, 5, 90, 256, 2}, {2, 32, 1, 40, 96, 1}, {3, 128, 4, 33, 384, 2},
                             {6, 64, 7, 20, 128, 1}, {8, 32, 17, 65, 160, 2}};
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++, n++)
    check_rows(impl, DG_U32, q[i][0], q[i][1], q[i][2], q[i][3], q[i][4], q[i][5]);
  printf("# %s matmul_rows: %d shapes bit-identical to the oracle\n", impl->name, n);
}

static void test_rows_avx512(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512();
  if (!k) dg_test_skip("test_kernels rows avx512: this CPU (or build) has no AVX-512 kernels");
  run_rows(k);
}

static void test_rows_avx2(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx2();
  if (!k) dg_test_skip("test_kernels rows avx2: this CPU (or build) has no AVX2 kernels");
  run_rows(k);
}

/* ---- the opt-in low-precision kernels (cpu/matmul_avx512lp.c) -------------
 * bf16 weights: the activations are rounded to bf16, so against the oracle
 *   |y - y_ref| <= (2^-8 + 2 gamma_K (1 + 2^-8)) sum|x w| + 2^-126 (sum|w| + 2K)
 * (the last term: inputs and results below 2^-126 flushed to zero), and
 * against the oracle run on the rounded activations xh, 2 gamma_K sum|xh w|
 * plus the same flush term: what it rounds is exactly x -> bf16(x). */
static void check_lp_bf16(const dg_kernels *lp, int T, int N, int K, double *worst, double *worst_h, double *rel) {
  const dg_kernels *ref = dg_kernels_ref();
  uint16_t *w = malloc((size_t)N * K * 2);
  float *x = malloc((size_t)T * K * sizeof(float)), *xh = malloc((size_t)T * K * sizeof(float));
  float *y0 = malloc((size_t)T * N * sizeof(float)), *y1 = malloc((size_t)T * N * sizeof(float));
  float *y2 = malloc((size_t)T * N * sizeof(float));
  for (int i = 0; i < N * K; i++) w[i] = dg_f32_to_bf16(frand());
  for (int i = 0; i < T * K; i++) { x[i] = frand() * 3.0f; xh[i] = dg_bf16_to_f32(dg_f32_to_bf16(x[i])); }
  dg_weight W = {.dtype = DG_BF16, .data = w, .rows = N, .cols = K};
  ref->matmul(y0, N, x, K, T, &W, 0, N, 2);
  ref->matmul(y2, N, xh, K, T, &W, 0, N, 2);
  lp->matmul(y1, N, x, K, T, &W, 0, N, 2);
  const double u = ldexp(1.0, -24), gam = K * u / (1.0 - K * u), ub = ldexp(1.0, -8), tiny = ldexp(1.0, -126);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double mag = 0, magh = 0, sw = 0;
      for (int k = 0; k < K; k++) {
        double wk = dg_bf16_to_f32(w[(size_t)n * K + k]);
        mag += fabs(x[t * K + k] * wk);
        magh += fabs(xh[t * K + k] * wk);
        sw += fabs(wk);
      }
      const double flush = tiny * (sw + 2.0 * K);
      const double b = (ub + 2 * gam * (1 + ub)) * mag + flush, bh = 2 * gam * magh + flush;
      const double e = fabs((double)y1[t * N + n] - y0[t * N + n]), eh = fabs((double)y1[t * N + n] - y2[t * N + n]);
      if (e / b > *worst) *worst = e / b;
      if (eh / bh > *worst_h) *worst_h = eh / bh;
      if (e / mag > *rel) *rel = e / mag;
      if (e > b || eh > bh)
        fail_msg("avx512lp bf16 T=%d N=%d K=%d: y[%d,%d] = %.9g, oracle %.9g (bound %.3g), oracle on bf16(x) %.9g "
                 "(bound %.3g)", T, N, K, t, n, y1[t * N + n], y0[t * N + n], b, y2[t * N + n], bh);
    }
  free(w); free(x); free(xh); free(y0); free(y1); free(y2);
}

/* MLX affine B-bit weights through VNNI (avx512lp) or vpmaddubsw (avx2lp): the
 * activations quantized per row and group, x ~ d qx with d = max|x_g| / Q (Q = 127;
 * avx2lp: Q = 64 for 8-bit weights, the bound that keeps vpmaddubsw's s16 pair sums
 * 2 * 255 * Q from saturating) and |d qx - x| <= d (1/2 + 2^-17) (avx2lp multiplies by
 * fl(1/d) instead of dividing: 1/2 + 2^-16)
 * (the rounding of x / d), then exact integer sums and fp32 scale/bias
 * arithmetic of a few roundings per term:
 *   |y - y_ref| <= sum_g d_g (1/2 + 2^-10) sum_{k in g} |w_k|
 *                  + 2 gamma_{K+8} sum_k (2|x_k| + d_g) (|q_k s_g| + |b_g|)
 * (w_k = q_k s_g + b_g; the second term covers the oracle's own dequantization
 * and summation and the kernel's). The grouped entry must equal one plain
 * call per expert bit for bit. sat: every code 2^B - 1 and every activation +-1
 * (so every qx = +-Q): the largest integer sums the kernel can meet. */
static void check_lp_quant(const dg_kernels *lp, int Q, int B, int G, int T, int N, int K, int sat, double *worst,
                           double *rel) {
  const dg_kernels *ref = dg_kernels_ref();
  const int ng = K / G;
  float *wf = malloc((size_t)N * K * sizeof(float));
  uint8_t *data = calloc((size_t)N, (size_t)dg_quant_row_bytes(K, B));
  uint16_t *sc = malloc((size_t)N * ng * 2), *bi = malloc((size_t)N * ng * 2);
  for (int i = 0; i < N * K; i++) wf[i] = frand() * 0.05f;
  for (int n = 0; n < N; n++)
    dg_quant_row(wf + (size_t)n * K, K, B, G, DG_BF16, data + (size_t)n * dg_quant_row_bytes(K, B), sc + (size_t)n * ng,
                 bi + (size_t)n * ng);
  dg_weight W = {.dtype = DG_U32, .data = data, .rows = N, .cols = K, .bits = B, .group_size = G,
                 .sb_dtype = DG_BF16, .scales = sc, .biases = bi};
  float *x = malloc((size_t)T * K * sizeof(float)), *y0 = malloc((size_t)T * N * sizeof(float));
  float *y1 = malloc((size_t)T * N * sizeof(float)), *y2 = malloc((size_t)T * N * sizeof(float));
  for (int i = 0; i < T * K; i++) x[i] = sat ? (i / K % 2 ? -1.0f : 1.0f) : frand() * (i % 7 == 0 ? 4.0f : 1.0f);
  if (sat) memset(data, 0xff, (size_t)N * (size_t)dg_quant_row_bytes(K, B));
  ref->matmul(y0, N, x, K, T, &W, 0, N, 2);
  lp->matmul(y1, N, x, K, T, &W, 0, N, 2);
  const double u = ldexp(1.0, -24), gam = (K + 8) * u / (1.0 - (K + 8) * u);
  for (int t = 0; t < T; t++) {
    double d[256];
    assert_true(ng <= 256);
    for (int g = 0; g < ng; g++) {
      double mx = 0;
      for (int k = g * G; k < (g + 1) * G; k++) mx = fmax(mx, fabs(x[t * K + k]));
      d[g] = mx / Q;
    }
    for (int n = 0; n < N; n++) {
      double bq = 0, bf = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const int g = k / G;
        const double s = dg_bf16_to_f32(sc[n * ng + g]), b = dg_bf16_to_f32(bi[n * ng + g]);
        const double q = dg_quant_code(data + (size_t)n * dg_quant_row_bytes(K, B), B, k);
        bq += d[g] * (0.5 + ldexp(1.0, -10)) * fabs(q * s + b);
        bf += (2 * fabs(x[t * K + k]) + d[g]) * (fabs(q * s) + fabs(b));
        mag += fabs(x[t * K + k] * (q * s + b));
      }
      const double bound = bq + 2 * gam * bf + 1e-30, e = fabs((double)y1[t * N + n] - y0[t * N + n]);
      if (e / bound > *worst) *worst = e / bound;
      if (mag > 0 && e / mag > *rel) *rel = e / mag;
      if (e > bound)
        fail_msg("%s %d-bit G=%d T=%d N=%d K=%d: y[%d,%d] = %.9g, oracle %.9g, |diff| %.3g > bound %.3g", lp->name, B, G,
                 T, N, K, t, n, y1[t * N + n], y0[t * N + n], e, bound);
    }
  }
  /* the grouped entry: experts of N/2 rows (rows_per_expert), uneven row counts, one empty expert */
  const int E = 2, half = N / 2;
  int32_t start[3] = {0, T / 3, T};
  lp->matmul_grouped(y2, half, x, K, start, E, &W, half, 0, half, 2);
  for (int e = 0; e < E; e++)
    if (start[e + 1] > start[e]) {
      lp->matmul(y1, half, x + (size_t)start[e] * K, K, start[e + 1] - start[e], &W, (int64_t)e * half, half, 1);
      assert_memory_equal(y1, y2 + (size_t)start[e] * half, (size_t)(start[e + 1] - start[e]) * half * sizeof(float));
    }
  free(wf); free(data); free(sc); free(bi); free(x); free(y0); free(y1); free(y2);
}

/* One call of T = 23 activation rows (N = 9 weight rows: a 1-row tail block) equals 23
 * one-row calls bit for bit: no output element depends on the tile that computed it
 * (B-bit weights, group G, K columns; random codes, scales and biases). */
static void check_lp_rows_equal(const dg_kernels *k, int B, int G, int K) {
  const int T = 23, N = 9, ng = K / G;
  uint8_t *data = malloc((size_t)N * (size_t)dg_quant_row_bytes(K, B));
  uint16_t *sc = malloc((size_t)N * ng * 2), *bi = malloc((size_t)N * ng * 2);
  float *x = malloc((size_t)T * K * sizeof(float)), *y1 = malloc((size_t)T * N * sizeof(float));
  float *y2 = malloc((size_t)T * N * sizeof(float));
  for (int i = 0; i < N * (int)dg_quant_row_bytes(K, B); i++) data[i] = (uint8_t)(rand() & 0xff);
  for (int i = 0; i < N * ng; i++) { sc[i] = dg_f32_to_bf16(frand() * 0.01f); bi[i] = dg_f32_to_bf16(frand() * 0.1f); }
  for (int i = 0; i < T * K; i++) x[i] = frand();
  dg_weight W = {.dtype = DG_U32, .data = data, .rows = N, .cols = K, .bits = B, .group_size = G,
                 .sb_dtype = DG_BF16, .scales = sc, .biases = bi};
  k->matmul(y1, N, x, K, T, &W, 0, N, 2);
  for (int t = 0; t < T; t++) k->matmul(y2 + (size_t)t * N, N, x + (size_t)t * K, K, 1, &W, 0, N, 1);
  if (memcmp(y1, y2, (size_t)T * N * sizeof(float)))
    fail_msg("%s %d-bit G=%d K=%d: 23 rows in one call differ from 23 one-row calls", k->name, B, G, K);
  free(data); free(sc); free(bi); free(x); free(y1); free(y2);
}

/* avx512lp's matrix-vector products (MV1, matmul_avx512lp.c: a thread's rows in one run, two streams; fewer than 4
 * activation rows, no pack; MV1K for the natural layout: 2-bit g128, 4-bit g64, 8-bit g32 at >= 14 groups a row;
 * MV1S for the by-step one: fewer groups, 4-bit g128, 8-bit g64 / g128) against the 4-row tiles they replace
 * (NTILE_SEQ and VTILE1, kept as DGEMMA_CPU_PACK=seq1) on the same weights and activations: every output bit for bit
 * (both run the same operations per row), for bf16, f16 and f32 scales and biases, full and partial last blocks
 * (K = 2816: 44 groups, 480: 15 at 8-bit g32, 3840: 30 at 2-bit g128, 1920: 30 at 4-bit g64) and steps (704 at 4 bits:
 * 5.5 steps, the 26B's down product; 96 at 2 bits, 416 at 8), row counts that split unevenly over 1-3 threads (1, 2,
 * 3, 5, 7, 9, 37 and the 26B's gate/up 1408 and down 2816), a row offset (row0 > 0), T = 1, 2, 3 and a NaN
 * activation (every output of its row NaN, as in the exact kernels). */
static void test_mv1(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512lp();
  if (!k) dg_test_skip("test_kernels mv1: this CPU (or build) has no AVX-512 BF16 + VNNI");
  const char *ps = getenv("DGEMMA_CPU_PACK");
  char *psv = ps ? strdup(ps) : NULL;
  static const int sh[][4] = {{4, 64, 2816, 1408}, {4, 64, 2816, 37}, {4, 64, 1920, 9},  {8, 32, 480, 5},
                              {2, 128, 3840, 3},   {4, 64, 2816, 2},  {8, 32, 1408, 1},  /* natural (MV1K) */
                              {4, 64, 704, 2816},  {4, 64, 704, 9},   {4, 128, 256, 5},  {8, 64, 1024, 3},
                              {8, 128, 384, 2},    {2, 32, 96, 7},    {8, 32, 416, 1}};  /* by step (MV1S) */
  static const dg_dtype sbts[] = {DG_BF16, DG_F16, DG_F32};
  int calls = 0;
  for (size_t c = 0; c < sizeof sh / sizeof sh[0]; c++)
    for (size_t d = 0; d < 3; d++) {
      const int B = sh[c][0], G = sh[c][1], K = sh[c][2], N = sh[c][3], ng = K / G, off = 3, R = N + off, T = 3;
      const size_t rb = (size_t)dg_quant_row_bytes(K, B), esz = sbts[d] == DG_F32 ? 4 : 2;
      uint8_t *data = malloc((size_t)R * rb);
      char *sc = malloc((size_t)R * ng * esz), *bi = malloc((size_t)R * ng * esz);
      float *x = malloc((size_t)T * K * sizeof(float)), *y1 = malloc((size_t)T * N * sizeof(float));
      float *y2 = malloc((size_t)T * N * sizeof(float));
      for (size_t i = 0; i < (size_t)R * rb; i++) data[i] = (uint8_t)(rand() & 0xff);
      for (int i = 0; i < R * ng; i++) {
        const float s = frand() * 0.01f, b = frand() * 0.1f;
        if (sbts[d] == DG_F32) { memcpy(sc + 4 * (size_t)i, &s, 4); memcpy(bi + 4 * (size_t)i, &b, 4); continue; }
        const uint16_t hs = sbts[d] == DG_BF16 ? dg_f32_to_bf16(s) : dg_f32_to_f16(s);
        const uint16_t hb = sbts[d] == DG_BF16 ? dg_f32_to_bf16(b) : dg_f32_to_f16(b);
        memcpy(sc + 2 * (size_t)i, &hs, 2);
        memcpy(bi + 2 * (size_t)i, &hb, 2);
      }
      for (int i = 0; i < T * K; i++) x[i] = frand();
      const dg_weight W = {.dtype = DG_U32, .data = data, .rows = R, .cols = K, .bits = B, .group_size = G,
                           .sb_dtype = sbts[d], .scales = sc, .biases = bi};
      for (int t = 1; t <= T; t++)
        for (int nt = 1; nt <= 3; nt++) {
          unsetenv("DGEMMA_CPU_PACK"); /* MV1 */
          k->matmul(y1, N, x, K, t, &W, off, N, nt);
          setenv("DGEMMA_CPU_PACK", "seq1", 1); /* NTILE_SEQ */
          k->matmul(y2, N, x, K, t, &W, off, N, nt);
          calls += 2;
          if (memcmp(y1, y2, (size_t)t * N * sizeof(float)))
            fail_msg("mv1 %d-bit G=%d K=%d N=%d sb %s T=%d threads %d: differs from the 4-row tiles", B, G, K, N,
                     sbts[d] == DG_BF16 ? "bf16" : sbts[d] == DG_F16 ? "f16" : "f32", t, nt);
        }
      unsetenv("DGEMMA_CPU_PACK");
      x[K / 2 + 1] = NAN; /* row 0: NaN, every output; row 1 as before */
      k->matmul(y1, N, x, K, 2, &W, off, N, 2);
      for (int n = 0; n < N; n++)
        if (!isnan(y1[n]) || y1[N + n] != y2[N + n]) fail_msg("mv1 %d-bit K=%d: a NaN activation row gave %g (row 1 %g vs %g)", B, K, y1[n], y1[N + n], y2[N + n]);
      free(data); free(sc); free(bi); free(x); free(y1); free(y2);
    }
  if (psv) setenv("DGEMMA_CPU_PACK", psv, 1); else unsetenv("DGEMMA_CPU_PACK");
  free(psv);
  printf("# avx512lp mv1 = NTILE_SEQ / VTILE1 (DGEMMA_CPU_PACK=seq1) bit for bit: %zu shapes x bf16/f16/f32 scales, T 1-3, "
         "1-3 threads (%d calls); a NaN row NaN\n", sizeof sh / sizeof sh[0], calls);
}

/* Non-finite activations stay non-finite, as in the exact kernels (IEEE: x_k = NaN or +-Inf
 * makes sum_k x_k w_k NaN or +-Inf): a NaN must not be quantized into a finite code, or the
 * forward pass's check of the logits (DG_ERR_NUMERIC) never sees it. Row 0 holds a NaN, row 1
 * +Inf, row 2 -Inf, row 3 is finite; every output of rows 0-2 must be non-finite (NaN for row
 * 0), row 3's must equal a call on row 3 alone. B = 0: bf16 weights. */
static void check_lp_nonfinite(const dg_kernels *k, int B, int G, int K) {
  const int T = 4, N = 5, ng = B ? K / G : 0;
  const size_t rb = B ? (size_t)dg_quant_row_bytes(K, B) : (size_t)K * 2;
  uint8_t *data = malloc((size_t)N * rb);
  uint16_t *sc = malloc((size_t)N * (ng + 1) * 2), *bi = malloc((size_t)N * (ng + 1) * 2);
  float *wf = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)T * K * sizeof(float));
  float *y = malloc((size_t)T * N * sizeof(float)), *y1 = malloc((size_t)N * sizeof(float));
  for (int i = 0; i < N * K; i++) wf[i] = frand() * 0.05f;
  dg_weight W = {.dtype = DG_BF16, .data = data, .rows = N, .cols = K};
  if (B) {
    for (int n = 0; n < N; n++)
      dg_quant_row(wf + (size_t)n * K, K, B, G, DG_BF16, data + n * rb, sc + (size_t)n * ng, bi + (size_t)n * ng);
    W = (dg_weight){.dtype = DG_U32, .data = data, .rows = N, .cols = K, .bits = B, .group_size = G,
                    .sb_dtype = DG_BF16, .scales = sc, .biases = bi};
  } else {
    for (int i = 0; i < N * K; i++) { uint16_t h = dg_f32_to_bf16(wf[i]); memcpy(data + 2 * (size_t)i, &h, 2); }
  }
  for (int i = 0; i < T * K; i++) x[i] = frand();
  x[0 * K + K / 2 + 1] = NAN;
  x[1 * K + 3] = INFINITY;
  x[2 * K + K - 1] = -INFINITY;
  k->matmul(y, N, x, K, T, &W, 0, N, 2);
  k->matmul(y1, N, x + 3 * K, K, 1, &W, 0, N, 1);
  for (int n = 0; n < N; n++) {
    if (!isnan(y[n]) || isfinite(y[N + n]) || isfinite(y[2 * N + n]))
      fail_msg("%s %d-bit G=%d K=%d: output %d of rows with NaN / +Inf / -Inf activations = %g / %g / %g (must be NaN "
               "/ non-finite / non-finite)", k->name, B, G, K, n, y[n], y[N + n], y[2 * N + n]);
    assert_memory_equal(&y[3 * N + n], &y1[n], sizeof(float));
  }
  /* each of rows 0-2 alone (a call of fewer than 4 rows: avx512lp's natural layout and one-row tiles at 8 dwords a
   * group), and rows 0-2 in one call of 3 */
  for (int t = 0; t < 3; t++) {
    k->matmul(y1, N, x + (size_t)t * K, K, 1, &W, 0, N, 1);
    for (int n = 0; n < N; n++)
      if (t == 0 ? !isnan(y1[n]) : isfinite(y1[n]))
        fail_msg("%s %d-bit G=%d K=%d: output %d of row %d alone = %g (must be %s)", k->name, B, G, K, n, t, y1[n],
                 t == 0 ? "NaN" : "non-finite");
  }
  k->matmul(y, N, x, K, 3, &W, 0, N, 2);
  for (int n = 0; n < N; n++)
    if (!isnan(y[n]) || isfinite(y[N + n]) || isfinite(y[2 * N + n]))
      fail_msg("%s %d-bit G=%d K=%d: output %d of 3 rows with NaN / +Inf / -Inf activations = %g / %g / %g", k->name, B,
               G, K, n, y[n], y[N + n], y[2 * N + n]);
  free(data); free(sc); free(bi); free(wf); free(x); free(y); free(y1);
}

/* Every avx512lp tile on a weight's pack (cpu/pack.c, w->cpu_pack) gives the bits it gives on the MLX
 * layout: T = 1, 2, 3 activation rows (the one-row tiles, natural or not), 4 (the 4x4 tile that
 * transposes), 5, 7 and 9 (the 4-row block prepared once: 4x4 tiles on it and the 4x1 tile for the
 * odd rows), every format's layout (the caller's K and G: transposed or by step), N rows (N % 4: a
 * partial last 4-row block, zero padded in the pack; rows past the last 4 of a call run the 1x4 and
 * 1x1 tiles), a call from row0 = 1 (every 4-row block of the call straddles two of the pack's) and
 * the grouped entry (2 experts of N / 2 rows, products of rows from row_off 2 and 4). Random codes,
 * bf16 scales and biases (f32 ones when sb32). The same integers and fp32 operations either way:
 * compared with memcmp, no tolerance. */
static void check_lp_pack(const dg_kernels *k, int B, int G, int N, int K, int sb32, int il) {
  enum { TM = 9 };
  const int ng = K / G, esz = sb32 ? 4 : 2;
  const size_t rb = (size_t)dg_quant_row_bytes(K, B);
  uint8_t *data = malloc((size_t)N * rb);
  char *sc = malloc((size_t)N * ng * esz), *bi = malloc((size_t)N * ng * esz);
  float *x = malloc((size_t)TM * K * sizeof(float)), *y1 = malloc((size_t)TM * N * sizeof(float));
  float *y2 = malloc((size_t)TM * N * sizeof(float));
  for (size_t i = 0; i < (size_t)N * rb; i++) data[i] = (uint8_t)(rand() & 0xff);
  for (int i = 0; i < N * ng; i++) {
    const float s = frand() * 0.01f, b = frand() * 0.1f;
    if (sb32) { memcpy(sc + 4 * (size_t)i, &s, 4); memcpy(bi + 4 * (size_t)i, &b, 4); }
    else { uint16_t h = dg_f32_to_bf16(s), g = dg_f32_to_bf16(b); memcpy(sc + 2 * (size_t)i, &h, 2); memcpy(bi + 2 * (size_t)i, &g, 2); }
  }
  for (int i = 0; i < TM * K; i++) x[i] = frand();
  dg_weight W = {.dtype = DG_U32, .data = data, .rows = N, .cols = K, .bits = B, .group_size = G,
                 .sb_dtype = sb32 ? DG_F32 : DG_BF16, .scales = sc, .biases = bi};
  assert_true(dg_cpu_pack_applies(&W));
  dg_weight P = W;
  P.cpu_pack = il ? dg_cpu_pack_build_il(&W, il) : dg_cpu_pack_build(&W);
  P.cpu_pack_il = il;
  assert_non_null(P.cpu_pack);
  P.data = P.scales = P.biases = NULL; /* with a pack the tiles read nothing else (a read here would crash) */
  static const int Ts[] = {1, 2, 3, 4, 5, 7, 9};
  for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
    for (int r0 = 0; r0 <= 1; r0++) {
      const int T = Ts[ti], n = N - r0;
      memset(y1, 0, (size_t)TM * N * sizeof(float));
      memset(y2, 0xff, (size_t)TM * N * sizeof(float));
      k->matmul(y1, n, x, K, T, &W, r0, n, 2);
      k->matmul(y2, n, x, K, T, &P, r0, n, 2);
      if (memcmp(y1, y2, (size_t)T * n * sizeof(float)))
        fail_msg("%s %d-bit G=%d N=%d K=%d T=%d row0=%d sb %s il %d: the pack's bits differ from the MLX layout's", k->name,
                 B, G, N, K, T, r0, sb32 ? "f32" : "bf16", il);
    }
  const int half = N / 2; /* grouped (N >= 12): 2 experts of `half` rows, products of rows [off, half) */
  if (half >= 6)
    for (int off = 2; off <= 4; off += 2)
      for (int e1 = 1; e1 <= 6; e1 += 5) { /* expert 0: 1 row then 6 (tiles of 4 and the prepared block) */
        const int32_t start[3] = {0, e1, e1 + 3};
        k->matmul_grouped(y1, half - off, x, K, start, 2, &W, half, off, half - off, 2);
        k->matmul_grouped(y2, half - off, x, K, start, 2, &P, half, off, half - off, 2);
        if (memcmp(y1, y2, (size_t)(e1 + 3) * (half - off) * sizeof(float)))
          fail_msg("%s %d-bit G=%d N=%d K=%d il %d grouped row_off %d, %d + 3 rows: the pack's bits differ", k->name, B, G,
                   N, K, il, off, e1);
      }
  /* and the tiles read the pack: a code changed in it changes the product */
  ((uint8_t *)P.cpu_pack)[0] ^= 0x11;
  for (int T = 1; T <= 4; T += 3) {
    k->matmul(y1, N, x, K, T, &W, 0, N, 1);
    k->matmul(y2, N, x, K, T, &P, 0, N, 1);
    assert_true(memcmp(y1, y2, sizeof(float)) != 0);
  }
  free((void *)P.cpu_pack); free(data); free(sc); free(bi); free(x); free(y1); free(y2);
}

static void test_avx512lp(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512lp();
  if (!k) dg_test_skip("test_kernels avx512lp: this CPU (or build) has no AVX-512 BF16 + VNNI");
  double w = 0, wh = 0, rel = 0;
  static const int bs[][3] = {{1, 1, 1}, {3, 5, 31}, {4, 8, 64}, {5, 9, 100}, {8, 13, 257}, {17, 6, 1000}};
  for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) check_lp_bf16(k, bs[i][0], bs[i][1], bs[i][2], &w, &wh, &rel);
  printf("# avx512lp bf16 vs oracle: largest |diff| / bound = %.4f, vs oracle on bf16(x): %.4f (must be <= 1); "
         "largest |diff| / sum|x w| = %.2e\n", w, wh, rel);
  /* by-step layout (fewer than 14 groups, or 4-bit g128 / 8-bit g64+), then the transposed one (a partial
   * last block: 44 groups of 48 lanes, 30 of 32, 15 of 16), with T < 5 (every tile transposes its rows)
   * and T >= 5 (a 4-row block transposed once, TPREP_MIN_T) */
  static const int qs[][5] = {{4, 64, 5, 9, 192},    {4, 32, 1, 4, 704},    {4, 128, 8, 5, 256},  {2, 32, 3, 8, 96},
                              {2, 64, 6, 4, 512},    {8, 32, 7, 5, 160},    {8, 128, 2, 8, 384},  {8, 64, 9, 5, 1024},
                              {4, 64, 16, 8, 2816},  {4, 64, 3, 5, 2816},   {4, 32, 17, 6, 1408}, {2, 32, 9, 8, 1408},
                              {2, 64, 5, 4, 2816},   {2, 128, 18, 5, 3840}, {8, 32, 16, 5, 480},  {8, 32, 2, 4, 480}};
  for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
    double wq = 0, rq = 0;
    check_lp_quant(k, 127, qs[i][0], qs[i][1], qs[i][2], qs[i][3], qs[i][4], 0, &wq, &rq);
    printf("# avx512lp %d-bit G=%d T=%d N=%d K=%d vs oracle: largest |diff| / bound = %.4f (<= 1), / sum|x w| = %.2e\n",
           qs[i][0], qs[i][1], qs[i][2], qs[i][3], qs[i][4], wq, rq);
  }  /* one activation row runs the 4x1 / 1x1 tiles (by step: each step's s_g d_g from products
   * formed once per 16 groups; transposed: each tile unpacks its rows), several run the 4x4 / 1x4
   * ones (transposed, 23 rows: on rows unpacked once per 4-row block): the same bits. By step: K
   * with a partial last step (704 at 4 bits, 96 and 160 at 2 and 8), a step of two groups (4-bit
   * g64), of four (2-bit g64), half a group (8-bit g128); transposed: every format, 44 groups
   * (48 lanes), 30 (32), 15 (16: 8-bit g32 K = 480, a half-filled last vector) */
  static const int bg[][3] = {{4, 64, 2816}, {4, 64, 704}, {4, 32, 160},  {4, 128, 256},  {2, 32, 96},
                              {2, 64, 512},  {8, 32, 160}, {8, 128, 384}, {2, 32, 1120},  {4, 32, 1408},
                              {2, 32, 1408}, {2, 64, 2816}, {2, 128, 3840}, {8, 32, 480}, {8, 64, 1024}};
  for (size_t c = 0; c < sizeof bg / sizeof bg[0]; c++) check_lp_rows_equal(k, bg[c][0], bg[c][1], bg[c][2]);
  printf("# avx512lp: 23 rows in one call = 23 one-row calls bit for bit (4-bit g64/g32/g128, 2-bit g32/g64/g128, "
         "8-bit g32/g64/g128; both layouts; K with partial last steps and blocks)\n");
  /* non-finite activations: bf16, by step (4-bit g64 K = 256, 8-bit g128), transposed (4-bit g64 K = 1024,
   * 2-bit g32, 8-bit g32; in calls of 1 and 3 rows 4-bit g64 and 8-bit g32 take the natural layout) */
  static const int nf[][3] = {{0, 0, 96}, {4, 64, 256}, {8, 128, 384}, {4, 64, 1024}, {2, 32, 1408}, {8, 32, 480}};
  for (size_t c = 0; c < sizeof nf / sizeof nf[0]; c++) check_lp_nonfinite(k, nf[c][0], nf[c][1], nf[c][2]);
  /* the pack, every format and layout of the VNNI tiles: transposed at 8 dwords a group (44 groups: a last block
   * of 12 and 6 steps; 30: 14 and 7; 8-bit g32 K = 480: one block, a half-filled last step; 2-bit g128), at 4 and
   * 2 (4-bit g32, 2-bit g64, 2-bit g32), by step (4-bit g64 K = 704, the 26B's down product: 11 groups;
   * 4-bit g128; 8-bit g64 and g128; 2-bit g32 K = 96, a partial last step); N = 4 .. 22 (last 4-row blocks
   * of 1-4 rows), f32 scales and biases */
  static const int pk[][5] = {{4, 64, 2816, 22, 0}, {4, 64, 1920, 16, 0}, {4, 64, 1024, 4, 0}, {8, 32, 480, 21, 0},
                              {2, 128, 3840, 13, 0}, {4, 64, 2816, 12, 1}, {8, 32, 1408, 12, 0}, {4, 64, 704, 14, 0},
                              {4, 64, 704, 13, 1}, {4, 32, 1408, 15, 0}, {4, 128, 256, 12, 0}, {2, 64, 2816, 13, 0},
                              {2, 32, 1408, 12, 0}, {2, 32, 96, 17, 0}, {8, 64, 1024, 13, 0}, {8, 128, 384, 12, 1}};
  for (size_t c = 0; c < sizeof pk / sizeof pk[0]; c++)
    check_lp_pack(k, pk[c][0], pk[c][1], pk[c][3], pk[c][2], pk[c][4], 0);
  /* the interleaved pack (DGEMMA_CPU_PACK=il), R = 4 and 8 rows, the formats it takes (8 dwords a group): 44 groups (a
   * last block of 12: 6 steps), 30 (14: 7), 8-bit g32 K = 480 (15 groups: a last step of 32 bytes), 2-bit g128, one
   * block exactly (4-bit g64 K = 1024), f32 scales; N of 4 .. 22 (units of 1 .. 8 rows, zero rows past the last) */
  static const int il[][5] = {{4, 64, 2816, 22, 0}, {4, 64, 1920, 13, 0}, {4, 64, 1024, 4, 0}, {8, 32, 480, 21, 0},
                              {2, 128, 3840, 13, 0}, {4, 64, 2816, 12, 1}, {8, 32, 1408, 17, 1}};
  for (int R = 4; R <= 8; R += 4)
    for (size_t c = 0; c < sizeof il / sizeof il[0]; c++)
      check_lp_pack(k, il[c][0], il[c][1], il[c][3], il[c][2], il[c][4], R);
  printf("# avx512lp: every tile on a weight's pack (cpu/pack.c) = on the MLX layout, bit for bit (T = 1-5, 7, 9; "
         "2/4/8-bit, transposed and by step, bf16 and f32 scales, last blocks of 1-4 rows, row0 = 1, grouped); "
         "the interleaved pack of 4 and 8 rows too\n");
}

/* avx512lp's AMX tiles (DGEMMA_CPU_AMX=1, matmul_avx512lp.c) against its VNNI tiles (DGEMMA_CPU_AMX=0), word for word:
 * 4-bit g64 weights of N rows (N % 16 != 0: a tail of 4-row blocks by VNNI) and K columns in the transposed layout (44
 * groups: a last block of 12; 16: one whole block; 30: a last block of 14), T activation rows (AMX_MIN_T = 32 and up:
 * 32 two whole tiles, 33, 45, 47, 100 a partial last tile, 64, 256; 31 below it: the VNNI tiles both ways), bf16, f16 or f32 scales and biases, 1 and 2 threads, the MLX layout or the 4-row pack
 * (pk), a call from row0 = 16 (the blocks start mid-matrix), and the grouped entry (3 experts of N / 3 rows, 5 activation
 * rows: VNNI; 33 and 42: AMX at N / 3 >= 16, tiles straddling the experts' boundaries). The same integers and the same fp32 operations in the same order:
 * compared with memcmp, no tolerance. */
static void check_lp_amx(const dg_kernels *k, int N, int K, int T, dg_dtype sbt, int nth, int pk) {
  const int ng = K / 64, esz = sbt == DG_F32 ? 4 : 2;
  const size_t rb = (size_t)dg_quant_row_bytes(K, 4);
  uint8_t *data = malloc((size_t)N * rb);
  char *sc = malloc((size_t)N * ng * esz), *bi = malloc((size_t)N * ng * esz);
  const int TM = T > 80 ? T : 80;
  float *x = malloc((size_t)TM * K * sizeof(float)), *y1 = malloc((size_t)TM * N * sizeof(float));
  float *y2 = malloc((size_t)TM * N * sizeof(float));
  for (size_t i = 0; i < (size_t)N * rb; i++) data[i] = (uint8_t)(rand() & 0xff);
  for (int i = 0; i < N * ng; i++) {
    const float s = frand() * 0.01f, b = frand() * 0.1f;
    if (sbt == DG_F32) { memcpy(sc + 4 * (size_t)i, &s, 4); memcpy(bi + 4 * (size_t)i, &b, 4); }
    else {
      const uint16_t h = sbt == DG_F16 ? dg_f32_to_f16(s) : dg_f32_to_bf16(s), g = sbt == DG_F16 ? dg_f32_to_f16(b) : dg_f32_to_bf16(b);
      memcpy(sc + 2 * (size_t)i, &h, 2); memcpy(bi + 2 * (size_t)i, &g, 2);
    }
  }
  for (int i = 0; i < TM * K; i++) x[i] = frand() * (i % 13 == 0 ? 8.0f : 1.0f);
  dg_weight W = {.dtype = DG_U32, .data = data, .rows = N, .cols = K, .bits = 4, .group_size = 64,
                 .sb_dtype = sbt, .scales = sc, .biases = bi};
  if (pk) {
    W.cpu_pack = dg_cpu_pack_build(&W);
    assert_non_null(W.cpu_pack);
  }
  for (int r0 = 0; r0 <= 16; r0 += 16) {
    const int n = N - r0;
    memset(y1, 0, (size_t)TM * N * sizeof(float));
    memset(y2, 0xff, (size_t)TM * N * sizeof(float));
    setenv("DGEMMA_CPU_AMX", "0", 1);
    k->matmul(y1, n, x, K, T, &W, r0, n, nth);
    setenv("DGEMMA_CPU_AMX", "1", 1);
    k->matmul(y2, n, x, K, T, &W, r0, n, nth);
    if (memcmp(y1, y2, (size_t)T * n * sizeof(float)))
      fail_msg("%s AMX N=%d K=%d T=%d sb %d threads %d pack %d row0 %d: the AMX tiles' bits differ from the VNNI tiles'",
               k->name, N, K, T, (int)sbt, nth, pk, r0);
  }
  /* 3 experts of N / 3 rows (16 or 17 at N = 48-53: one 16-row block, and a tail row), 5, 33 and 42 activation rows */
  const int32_t start[4] = {0, 5, 38, 80};
  const int ne = N / 3;
  for (int a = 0; a <= 1; a++) {
    setenv("DGEMMA_CPU_AMX", a ? "1" : "0", 1);
    k->matmul_grouped(a ? y2 : y1, ne, x, K, start, 3, &W, ne, 0, ne, nth);
  }
  if (memcmp(y1, y2, (size_t)80 * ne * sizeof(float)))
    fail_msg("%s AMX grouped N=%d K=%d sb %d threads %d pack %d: the AMX tiles' bits differ", k->name, N, K, (int)sbt, nth, pk);
  unsetenv("DGEMMA_CPU_AMX");
  free((void *)W.cpu_pack); free(data); free(sc); free(bi); free(x); free(y1); free(y2);
}

static void test_avx512lp_amx(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512lp();
  if (!k) dg_test_skip("test_kernels avx512lp_amx: this CPU (or build) has no AVX-512 BF16 + VNNI");
  if (!dg_cpu_amx_usable()) dg_test_skip("test_kernels avx512lp_amx: this CPU (or kernel) has no AMX-INT8 tiles");
  static const int cs[][6] = {/* N, K, T, scales (0 bf16, 1 f16, 2 f32), threads, pack */
                              {50, 2816, 32, 0, 2, 0}, {40, 2816, 33, 1, 1, 0}, {52, 2816, 64, 2, 2, 0},
                              {48, 1024, 47, 0, 1, 0}, {36, 1920, 100, 1, 2, 0}, {48, 2816, 32, 0, 2, 1},
                              {53, 2816, 45, 2, 1, 1}, {36, 1024, 256, 0, 2, 0}, {50, 2816, 31, 0, 2, 0}};
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
    check_lp_amx(k, cs[c][0], cs[c][1], cs[c][2], cs[c][3] == 0 ? DG_BF16 : cs[c][3] == 1 ? DG_F16 : DG_F32, cs[c][4],
                 cs[c][5]);
  printf("# avx512lp AMX tiles = VNNI tiles bit for bit (4-bit g64, K 1024/1920/2816, T 31-256, bf16/f16/f32 scales, "
         "1-2 threads, MLX layout and pack, row0 0 and 16, grouped)\n");
}

/* Which matrices each DGEMMA_CPU_PACK mode packs (cpu/pack.c, kernels.h): the layout avx512lp quantizes the
 * activations in (dg_lp_tr_n: n = G B / 32 dwords a group when n <= 8 and the last block of 16 groups is at most 1/8
 * empty, else 0, by step), and DGEMMA_CPU_PACK=nat's choice (dg_cpu_pack_nat: 2/4/8-bit with n = 8), against
 * values worked out by hand from that rule: the 26B's experts' gate/up (4-bit g64, K = 2816: 44 groups, 4 of 48
 * lanes empty) is taken, its down (K = 704: 11 groups, 5 of 16 empty) is not; 8-bit g32 at 14 groups (2 of 16
 * empty, exactly 1/8) is, at 13 not; n = 2 and 4 (transposed, not natural) and n = 16 (by step) are not; 3-bit
 * never (no pack). Then the variable's values: unset the default (DG_CPU_PACK_DEFAULT), 0, 1, nat; anything else
 * -1 with the reason. */
static void test_pack_choice(void **state) {
  (void)state;
  static const struct { int B, G, K, tr_n, nat; } c[] = {
      {4, 64, 2816, 8, 1}, {4, 64, 1920, 8, 1}, {4, 64, 1024, 8, 1}, {8, 32, 480, 8, 1},  {2, 128, 3840, 8, 1},
      {8, 32, 1408, 8, 1}, {8, 32, 448, 8, 1},  {8, 32, 416, 0, 0},  {4, 64, 704, 0, 0},  {4, 32, 1408, 4, 0},
      {4, 128, 256, 0, 0}, {2, 64, 2816, 4, 0}, {2, 32, 1408, 2, 0}, {2, 32, 96, 0, 0},   {8, 64, 1024, 0, 0},
      {8, 128, 384, 0, 0}, {3, 64, 2816, 6, 0}, {4, 64, 64, 0, 0}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    const dg_weight w = {.dtype = DG_U32, .rows = 13, .cols = c[i].K, .bits = c[i].B, .group_size = c[i].G,
                         .sb_dtype = DG_BF16};
    const int tr = dg_lp_tr_n(c[i].K, c[i].B, c[i].G), nat = dg_cpu_pack_nat(&w);
    if (tr != c[i].tr_n || nat != c[i].nat)
      fail_msg("%d-bit g%d K = %d: dg_lp_tr_n %d (want %d), dg_cpu_pack_nat %d (want %d)", c[i].B, c[i].G, c[i].K, tr,
               c[i].tr_n, nat, c[i].nat);
    assert_int_equal(dg_cpu_pack_takes(&w, DG_CPU_PACK_NONE), 0);
    assert_int_equal(dg_cpu_pack_takes(&w, DG_CPU_PACK_ALL), c[i].B != 3);
    assert_int_equal(dg_cpu_pack_takes(&w, DG_CPU_PACK_NAT), c[i].nat);
    assert_int_equal(dg_cpu_pack_takes(&w, DG_CPU_PACK_IL), c[i].nat);
    assert_int_equal(dg_cpu_pack_takes(&w, DG_CPU_PACK_SEQ1), 0);
  }
  /* the interleaved pack: refused (NULL) where "nat" does not take the matrix, and for R other than 4 and 8 */
  {
    uint8_t data[4 * 1408] = {0};
    uint16_t sb[4 * 44] = {0};
    dg_weight w = {.dtype = DG_U32, .data = data, .rows = 4, .cols = 2816, .bits = 4, .group_size = 64,
                   .sb_dtype = DG_BF16, .scales = sb, .biases = sb};
    for (int R = 3; R <= 9; R++) {
      void *p = dg_cpu_pack_build_il(&w, R);
      assert_int_equal(p != NULL, R == 4 || R == 8);
      free(p);
    }
    w.cols = 704; /* 11 groups: by step */
    assert_null(dg_cpu_pack_build_il(&w, 4));
    w.cols = 2816, w.group_size = 32; /* 4-bit g32: transposed at 4 dwords */
    assert_null(dg_cpu_pack_build_il(&w, 8));
  }
  const char *ps = getenv("DGEMMA_CPU_PACK");
  char *psv = ps ? strdup(ps) : NULL, why[160];
  unsetenv("DGEMMA_CPU_PACK");
  assert_int_equal(dg_cpu_pack_wanted(why, sizeof why), DG_CPU_PACK_DEFAULT);
  assert_string_equal(why, "");
  static const struct { const char *v; int want; } e[] = {{"0", DG_CPU_PACK_NONE}, {"1", DG_CPU_PACK_ALL},
                                                           {"nat", DG_CPU_PACK_NAT}, {"il", DG_CPU_PACK_IL},
                                                           {"seq1", DG_CPU_PACK_SEQ1}, {"SEQ1", -1},
                                                           {"NAT", -1}, {"", -1}, {"2", -1}, {"il8", -1}};
  for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
    setenv("DGEMMA_CPU_PACK", e[i].v, 1);
    const int got = dg_cpu_pack_wanted(why, sizeof why);
    char want_why[160] = "";
    if (e[i].want < 0)
      snprintf(want_why, sizeof want_why, "DGEMMA_CPU_PACK=\"%s\" is none of 0 (no pack), 1 (every matrix), nat "
               "(gate/up-shaped ones), il (those interleaved) and seq1 (no pack, 4-row tiles)", e[i].v);
    if (got != e[i].want || strcmp(why, want_why))
      fail_msg("DGEMMA_CPU_PACK=\"%s\": %d \"%s\", want %d \"%s\"", e[i].v, got, why, e[i].want, want_why);
  }
  if (psv) setenv("DGEMMA_CPU_PACK", psv, 1); else unsetenv("DGEMMA_CPU_PACK");
  free(psv);
  printf("# pack choice: dg_lp_tr_n and dg_cpu_pack_nat as worked out by hand in %zu formats and lengths; "
         "DGEMMA_CPU_PACK unset / 0 / 1 / nat / il / seq1 taken, other values refused\n", sizeof c / sizeof c[0]);
}

/* The AVX2 int8 products (cpu/matmul_avx2lp.c): the same bound with Q = 127, or 64
 * for 8-bit weights. The cases cover every bit width (2/3/4/6/8) and group size the kernel
 * takes, K not a multiple of a 32-byte step's 256/B codes (a partial last step),
 * odd T and N (the 1-wide tiles), the real expert shapes, and saturation (sat). */
static void test_avx2lp(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx2lp();
  if (!k) dg_test_skip("test_kernels avx2lp: this CPU (or build) has no AVX2 + FMA");
  static const int qs[][6] = {{4, 64, 5, 9, 192, 0},  {4, 32, 1, 4, 704, 0},   {4, 32, 3, 5, 160, 0},
                              {4, 128, 8, 5, 256, 0}, {2, 32, 3, 8, 96, 0},    {2, 64, 6, 4, 192, 0},
                              {2, 128, 4, 6, 384, 0}, {8, 32, 7, 5, 160, 0},   {8, 64, 3, 7, 320, 0},
                              {8, 128, 2, 8, 384, 0}, {4, 64, 16, 8, 2816, 0}, {4, 64, 9, 12, 704, 0},   {4, 64, 15, 9, 256, 0},
                              {8, 64, 4, 5, 256, 1},  {4, 32, 4, 5, 160, 1},   {2, 32, 4, 5, 96, 1},
                              {3, 32, 3, 5, 96, 0},   {3, 64, 9, 6, 192, 0},   {3, 128, 5, 9, 384, 0},
                              {3, 64, 16, 8, 2816, 0}, {3, 64, 9, 12, 704, 0}, {6, 32, 7, 5, 160, 0},
                              {6, 64, 3, 7, 320, 0},  {6, 128, 2, 8, 384, 0},  {6, 64, 8, 4, 704, 0},
                              {3, 32, 4, 5, 96, 1},   {6, 32, 4, 5, 160, 1}};
  for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
    double wq = 0, rq = 0;
    check_lp_quant(k, qs[i][0] == 8 ? 64 : 127, qs[i][0], qs[i][1], qs[i][2], qs[i][3], qs[i][4], qs[i][5], &wq, &rq);
    printf("# avx2lp %d-bit G=%d T=%d N=%d K=%d%s vs oracle: largest |diff| / bound = %.4f (<= 1), / sum|x w| = %.2e\n",
           qs[i][0], qs[i][1], qs[i][2], qs[i][3], qs[i][4], qs[i][5] ? " (saturating codes)" : "", wq, rq);
  }
  /* no element depends on the tile: T = 23 rows (8 + 8 + 4 + 2 + 1 tiles, N = 9: a 1-row tail block) in one
   * call equal 23 one-row calls bit for bit, for each bit width */
  static const int bg[][3] = {{2, 32, 256}, {2, 128, 256}, {3, 32, 256}, {4, 64, 256}, {6, 64, 256}, {8, 32, 256}};
  for (size_t c = 0; c < sizeof bg / sizeof bg[0]; c++) check_lp_rows_equal(k, bg[c][0], bg[c][1], bg[c][2]);
  printf("# avx2lp: 23 rows in one call = 23 one-row calls bit for bit (2-bit g32/g128, 3-bit g32, 4-bit g64, 6-bit "
         "g64, 8-bit g32)\n");
  static const int nf[][3] = {{2, 32, 256}, {3, 64, 192}, {4, 64, 256}, {6, 128, 384}, {8, 32, 160}};
  for (size_t c = 0; c < sizeof nf / sizeof nf[0]; c++) check_lp_nonfinite(k, nf[c][0], nf[c][1], nf[c][2]);
}

static void test_conversions(void **state) {
  (void)state;
  /* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1.0); 1 + 3*2^-8 -> 1 + 2^-6 (even) */
  assert_int_equal(dg_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
  assert_int_equal(dg_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82);
  assert_int_equal(dg_f32_to_bf16(-2.0f), 0xc000);
  assert_true(dg_bf16_to_f32(0x4254) == 53.0f); /* sqrt(2816) = 53.066 rounds to 53.0 in bf16 (spec 4.9) */
  assert_int_equal(dg_f32_to_bf16(sqrtf(2816.0f)), 0x4254);
  assert_true(isnan(dg_bf16_to_f32(dg_f32_to_bf16(NAN))));
  /* f16 */
  assert_int_equal(dg_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(dg_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(dg_f32_to_f16(65520.0f), 0x7c00);          /* rounds up to Inf */
  assert_int_equal(dg_f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
  assert_int_equal(dg_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie to even (0) */
  assert_int_equal(dg_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie to even */
  assert_int_equal(dg_f32_to_f16(-0.5f), 0xb800);
  assert_true(dg_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  assert_true(dg_f16_to_f32(0x7bff) == 65504.0f);
  assert_true(isinf(dg_f16_to_f32(0x7c00)));
  assert_true(dg_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
  for (uint32_t h = 0; h < 0x10000; h++) { /* every finite f16 survives a round trip */
    if ((h & 0x7c00) == 0x7c00) continue;
    assert_int_equal(dg_f32_to_f16(dg_f16_to_f32((uint16_t)h)), h);
  }
}

/* The scalar attention of one query (forward.c's loop, the oracle of dg_kernels.attn_block). */
static void attn_oracle(const float *qv, float *o, int32_t lo, int n1, const float *kc, const float *vc, const float *ck,
                        const float *cv, int64_t cks, int n2, int D, float *sc) {
  float mx = -FLT_MAX;
  for (int j = 0; j < n1; j++) {
    const float *kv = kc + (size_t)(lo + j) * D;
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += qv[d] * kv[d];
    sc[j] = s;
    if (s > mx) mx = s;
  }
  for (int j = 0; j < n2; j++) {
    const float *kv = ck + (size_t)j * cks;
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += qv[d] * kv[d];
    sc[n1 + j] = s;
    if (s > mx) mx = s;
  }
  float sum = 0.0f;
  for (int j = 0; j < n1 + n2; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
  float inv = 1.0f / sum;
  for (int d = 0; d < D; d++) o[d] = 0.0f;
  for (int j = 0; j < n1; j++) {
    const float *vv = vc + (size_t)(lo + j) * D;
    float p = sc[j] * inv;
    for (int d = 0; d < D; d++) o[d] += p * vv[d];
  }
  for (int j = 0; j < n2; j++) {
    const float *vv = cv + (size_t)j * cks;
    float p = sc[n1 + j] * inv;
    for (int d = 0; d < D; d++) o[d] += p * vv[d];
  }
}

/* attn_block against the oracle, bit for bit: full and partial blocks, per-query (causal,
 * sliding) cache ranges, with and without chunk keys, head dimensions 16..128, scores large
 * enough that some exponentials underflow. */
static void test_attn_avx512(void **state) {
  (void)state;
  const dg_kernels *k = dg_kernels_avx512();
  if (!k) dg_test_skip("test_kernels attn: this CPU (or build) has no AVX-512 kernels");
  assert_non_null(k->attn_block);
  static const int cases[][5] = {/* D, nq, S (cache rows), n2, causal */
                                 {64, 16, 300, 64, 0}, {64, 5, 37, 0, 1}, {128, 16, 200, 3, 0}, {16, 1, 9, 0, 1},
                                 {80, 13, 70, 17, 1}, {128, 16, 0, 64, 0}, {64, 16, 512, 0, 1}, {32, 7, 5, 2, 0}};
  int checked = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int D = cases[c][0], nq = cases[c][1], S = cases[c][2], n2 = cases[c][3], causal = cases[c][4];
    const int64_t cks = 2 * (int64_t)D + 16; /* chunk rows interleaved with another head's */
    float *kc = malloc(((size_t)S + 1) * D * sizeof(float)), *vc = malloc(((size_t)S + 1) * D * sizeof(float));
    float *ck = malloc(((size_t)n2 + 1) * cks * sizeof(float)), *cv = malloc(((size_t)n2 + 1) * cks * sizeof(float));
    float *q = malloc((size_t)nq * D * sizeof(float)), *o0 = malloc((size_t)nq * D * sizeof(float));
    float *o1 = malloc((size_t)nq * D * sizeof(float)), *sc = malloc(((size_t)S + n2 + 1) * sizeof(float));
    float *scratch = malloc(DG_SCORE_FLOATS(S, n2) * sizeof(float));
    const float amp = c % 2 ? 3.0f : 0.5f; /* amp 3: scores up to ~9 D, exponentials underflow */
    for (size_t i = 0; i < ((size_t)S + 1) * D; i++) { kc[i] = frand() * amp; vc[i] = frand(); }
    for (size_t i = 0; i < ((size_t)n2 + 1) * cks; i++) { ck[i] = frand() * amp; cv[i] = frand(); }
    for (int i = 0; i < nq * D; i++) q[i] = frand() * amp;
    const float *qv[16];
    float *ov[16];
    int32_t lo[16], n1[16];
    for (int i = 0; i < nq; i++) {
      qv[i] = q + (size_t)i * D;
      ov[i] = o1 + (size_t)i * D;
      int32_t hi = causal ? S - nq + 1 + i : S, a = causal && i % 3 == 1 ? hi / 3 : 0;
      if (hi < 0) hi = 0;
      if (a > hi) a = hi;
      lo[i] = a;
      n1[i] = hi - a;
    }
    int skip = 0; /* a query without keys is not a case the passes make */
    for (int i = 0; i < nq; i++) skip |= n1[i] + n2 == 0;
    if (skip) goto next;
    k->attn_block(nq, qv, ov, lo, n1, kc, vc, n2 ? ck : NULL, n2 ? cv : NULL, cks, n2, D, scratch);
    for (int i = 0; i < nq; i++) {
      attn_oracle(qv[i], o0 + (size_t)i * D, lo[i], n1[i], kc, vc, ck, cv, cks, n2, D, sc);
      if (memcmp(o0 + (size_t)i * D, o1 + (size_t)i * D, (size_t)D * sizeof(float)))
        fail_msg("attn_block D=%d nq=%d S=%d n2=%d: query %d differs from the oracle", D, nq, S, n2, i);
      checked++;
    }
  next:
    free(kc); free(vc); free(ck); free(cv); free(q); free(o0); free(o1); free(sc); free(scratch);
  }
  printf("# avx512 attn_block: %d queries bit-identical to the scalar loop\n", checked);
}

/* dg_big_alloc (base/dg_mem.h): the buffers the matvecs stream. Checked: the address is
 * 2 MiB-aligned and the madvise call covers the size rounded up to 2 MiB (1 B, 2 MiB,
 * 2 MiB + 1 B -> 2, 2, 4 MiB) with MADV_HUGEPAGE; every byte of the buffer is writable
 * and reads back (a pattern over the rounded size); a failing madvise (as with a kernel
 * without THP) still returns the same usable memory with *huge = 0; without THP wanted
 * (DGEMMA_THP unset or not "1") it is 64-byte aligned and madvise is not called; 0 bytes and sizes that
 * overflow the rounding give NULL; the real madvise succeeds where the kernel has THP. */
static struct { void *addr; size_t len; int advice, calls, rc; } adv;
static int fake_advise(void *addr, size_t len, int advice) {
  adv.addr = addr; adv.len = len; adv.advice = advice; adv.calls++;
  return adv.rc;
}
static void fill_check(unsigned char *p, size_t n, unsigned char salt) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131u + salt);
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 131u + salt)) fail_msg("byte %zu of %zu reads %u", i, n, p[i]);
}
static void test_big_alloc(void **state) {
  (void)state;
  const size_t H = DG_HUGE_PAGE;
  assert_int_equal(H, (size_t)2 << 20);
  static const struct { size_t bytes, len; } c[] = {{1, 2 << 20}, {2 << 20, 2 << 20}, {(2 << 20) + 1, 4 << 20},
                                                    {5000000, 6 << 20}};
  for (int rc = 0; rc >= -1; rc--)
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
      adv.calls = 0; adv.rc = rc;
      int huge = -7;
      unsigned char *p = dg_big_alloc_with(c[i].bytes, 1, fake_advise, &huge);
      assert_non_null(p);
      assert_int_equal((uintptr_t)p % H, 0);
      assert_int_equal(adv.calls, 1);
      assert_ptr_equal(adv.addr, p);
      assert_int_equal(adv.len, c[i].len);
      assert_int_equal(adv.advice, MADV_HUGEPAGE);
      assert_int_equal(huge, rc == 0);
      fill_check(p, c[i].len, (unsigned char)i);
      free(p);
    }
  adv.calls = 0;
  int huge = -7;
  unsigned char *p = dg_big_alloc_with(100, 0, fake_advise, &huge);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 64, 0);
  assert_int_equal(adv.calls, 0);
  assert_int_equal(huge, 0);
  fill_check(p, 128, 3);
  free(p);
  assert_null(dg_big_alloc_with(0, 1, fake_advise, &huge));
  assert_null(dg_big_alloc_with(0, 0, fake_advise, NULL));
  assert_null(dg_big_alloc_with(SIZE_MAX - 5, 1, fake_advise, NULL));
  assert_null(dg_big_alloc_with(SIZE_MAX - 5, 0, fake_advise, NULL));
  assert_int_equal(adv.calls, 0);
  /* the real madvise: succeeds wherever the kernel was built with THP (sysfs has its switch), in any mode */
  const int thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
  p = dg_big_alloc_with(3 * H, 1, NULL, &huge);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % H, 0);
  assert_int_equal(huge, thp);
  fill_check(p, 3 * H, 5);
  free(p);
  /* DGEMMA_THP: "1" turns it on; unset, "0" or anything else (a value dg_switches_check refuses) leaves it off */
  const char *e = getenv("DGEMMA_THP");
  char *ev = e ? strdup(e) : NULL;
  unsetenv("DGEMMA_THP");
  assert_int_equal(dg_big_alloc_wants_huge(), 0);
  setenv("DGEMMA_THP", "0", 1);
  assert_int_equal(dg_big_alloc_wants_huge(), 0);
  p = dg_big_alloc(H + 1, &huge);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 64, 0);
  assert_int_equal(huge, 0);
  fill_check(p, H + 64, 9);
  free(p);
  setenv("DGEMMA_THP", "1", 1);
  assert_int_equal(dg_big_alloc_wants_huge(), 1);
  p = dg_big_alloc(H + 1, &huge);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % H, 0);
  assert_int_equal(huge, thp);
  fill_check(p, 2 * H, 11);
  free(p);
  if (ev) setenv("DGEMMA_THP", ev, 1); else unsetenv("DGEMMA_THP");
  free(ev);
  printf("# big alloc: 2 MiB-aligned, rounded up to 2 MiB, MADV_HUGEPAGE asked; usable with madvise failing; "
         "DGEMMA_THP=1 on, else plain; real madvise %s\n", thp ? "succeeded (THP in this kernel)" : "refused (no THP here)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conversions),
      cmocka_unit_test(test_avx512),
      cmocka_unit_test(test_avx2),
      cmocka_unit_test(test_rows_avx512),
      cmocka_unit_test(test_rows_avx2),
      cmocka_unit_test(test_avx512lp),
      cmocka_unit_test(test_avx512lp_amx),
      cmocka_unit_test(test_mv1),
      cmocka_unit_test(test_avx2lp),
      cmocka_unit_test(test_pack_choice),
      cmocka_unit_test(test_big_alloc),
      cmocka_unit_test(test_attn_avx512),
  };
  return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
