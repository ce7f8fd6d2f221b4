/* ref.c: the scalar fp32 oracle kernels (style anchor: llama2.c's matmul).
 * Deliberately no intrinsics; every other kernel is checked against these. */
#include "cpu/kernels.h"
#include "io/quant.h"

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

static const dg_kernels REF = {"ref", matmul_ref, matmul_grouped_ref, matmul_rows_ref, NULL};
const dg_kernels *dg_kernels_ref(void) { return &REF; }
