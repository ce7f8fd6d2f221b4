/* ref.c: the scalar fp32 oracle kernels (style anchor: llama2.c's matmul).
 * Deliberately no intrinsics; every other kernel is checked against these. */
#include <math.h>

#include "kernels.h"
#include "quant.h"

float dg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal: renormalize */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dg_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* overflow -> Inf (rounds past 65504) */
  if (a < 0x38800000u) {                                       /* f16 subnormal or zero */
    float af;
    memcpy(&af, &a, 4);
    /* scale to units of 2^-24 and round to nearest even */
    float s = af * 16777216.0f;
    uint32_t m = (uint32_t)nearbyintf(s);
    return (uint16_t)(sign | m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - ((uint32_t)(127 - 15) << 23);
  return (uint16_t)(sign | (r >> 13));
}

/* Element k of row r of a quantized weight: (float)q * s + b (quant.h). */
static inline float qelem(const dg_weight *w, int64_t r, int64_t k) {
  const int64_t ng = w->cols / w->group_size, g = k / w->group_size;
  const uint8_t *row = (const uint8_t *)w->data + r * dg_quant_row_bytes(w->cols, w->bits);
  float s = dg_load_elem(w->sb_dtype, w->scales, r * ng + g), b = dg_load_elem(w->sb_dtype, w->biases, r * ng + g);
  return (float)dg_quant_code(row, w->bits, k) * s + b;
}

/* The oracle: every weight widened (or dequantized) to fp32 as it is read,
 * products summed in increasing k. */
static void matmul_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                       int64_t row0, int64_t N, int n_threads) {
  const int64_t K = w->cols;
  const size_t es = dg_dtype_size(w->dtype);
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const char *row = (const char *)w->data + (size_t)(row0 + n) * (size_t)K * es;
    for (int64_t t = 0; t < T; t++) {
      const float *xt = x + t * ldx;
      float acc = 0.0f;
      if (w->bits)
        for (int64_t k = 0; k < K; k++) acc += xt[k] * qelem(w, row0 + n, k);
      else
        for (int64_t k = 0; k < K; k++) acc += xt[k] * dg_load_elem(w->dtype, row, k);
      y[t * ldy + n] = acc;
    }
  }
}

static void matmul_grouped_ref(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *start, int E,
                               const dg_weight *w, int64_t rows_per_expert, int64_t row_off, int64_t N, int n_threads) {
  for (int e = 0; e < E; e++)
    if (start[e + 1] > start[e])
      matmul_ref(y + (int64_t)start[e] * ldy, ldy, x + (int64_t)start[e] * ldx, ldx, start[e + 1] - start[e], w,
                 (int64_t)e * rows_per_expert + row_off, N, n_threads);
}

/* The oracle of the product over W's rows: for each activation row, s = 0,
 * then s += x[v] * W[v] (a product, then a sum) for v in increasing order,
 * the zero terms skipped; the loop the soft embedding ran before it had
 * kernels (dg_weight_axpy_row, quant.c). */
static void matmul_rows_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                            int n_threads) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *yt = y + t * ldy;
    for (int64_t j = 0; j < w->cols; j++) yt[j] = 0.0f;
    for (int64_t v = 0; v < w->rows; v++)
      if (x[t * ldx + v] != 0.0f) dg_weight_axpy_row(yt, x[t * ldx + v], w, v);
  }
}

static const dg_kernels REF = {"ref", matmul_ref, matmul_grouped_ref, matmul_rows_ref};
const dg_kernels *dg_kernels_ref(void) { return &REF; }
