/* matmul_driver.h: the loop shared by the SIMD matmuls (matmul_avx2.c,
 * matmul_avx512.c). The including file defines the register tiles
 * tile_4x4, tile_4x1, tile_1x4 and tile_1x1 (weight rows x activation rows)
 * for its instruction set; this driver walks blocks of 4 weight rows in
 * parallel (OpenMP) and tiles the activation rows by 4, with 1-wide tails.
 * Each output element's summation order depends only on K, not on the tile
 * used, so results do not depend on T or on how a pass is chunked. */
#ifndef DG_MATMUL_DRIVER_H
#define DG_MATMUL_DRIVER_H

#include "kernels.h"

static void matmul_driver(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                          int64_t row0, int64_t N, int n_threads) {
  const int64_t K = w->cols;
  const size_t rb = (size_t)K * dg_dtype_size(w->dtype);
  const int64_t nblk = (N + 3) / 4;
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (int64_t b = 0; b < nblk; b++) {
    int64_t n = b * 4;
    int64_t rt = N - n < 4 ? N - n : 4;
    const char *rows[4];
    for (int i = 0; i < rt; i++) rows[i] = (const char *)w->data + (size_t)(row0 + n + i) * rb;
    int64_t t = 0;
    if (rt == 4) {
      for (; t + 4 <= T; t += 4) tile_4x4(y + t * ldy + n, ldy, x + t * ldx, ldx, rows, w->dtype, K);
      for (; t < T; t++) tile_4x1(y + t * ldy + n, ldy, x + t * ldx, ldx, rows, w->dtype, K);
    } else {
      for (int i = 0; i < rt; i++) {
        const char *r1[1] = {rows[i]};
        int64_t tt = 0;
        for (; tt + 4 <= T; tt += 4) tile_1x4(y + tt * ldy + n + i, ldy, x + tt * ldx, ldx, r1, w->dtype, K);
        for (; tt < T; tt++) tile_1x1(y + tt * ldy + n + i, ldy, x + tt * ldx, ldx, r1, w->dtype, K);
      }
    }
  }
}

#endif
