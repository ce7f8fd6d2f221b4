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
#include <math.h>

#include "kernels.h"
#include "quant.h"
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conversions),
      cmocka_unit_test(test_avx512),
      cmocka_unit_test(test_avx2),
      cmocka_unit_test(test_rows_avx512),
      cmocka_unit_test(test_rows_avx2),
  };
  return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
