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
  };
  return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
