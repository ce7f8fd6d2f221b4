/* matmul_driver.h: the loops shared by the SIMD matmuls (matmul_avx2.c,
 * matmul_avx512.c). The including file defines, for its instruction set, the
 * register tiles (weight rows x activation rows)
 *   tile_4x4, tile_4x1, tile_1x4, tile_1x1        float weights (f32/bf16/f16)
 *   QTILES(B) = qtile_B_4x4 ... qtile_B_1x1        MLX affine B-bit weights
 *   qdeq_B                                          one B-bit row dequantized to fp32
 * This driver walks blocks of 4 weight rows in parallel (OpenMP) and tiles the
 * activation rows by 4, with 1-wide tails. With many activation rows
 * (T >= QDEQ_MIN_T) a block of quantized rows is first dequantized into a
 * per-thread fp32 buffer and then run through the f32 tiles, so the unpacking
 * is paid once per block instead of once per 4 activation rows; the f32 tiles
 * and the quantized tiles sum the same (bit-identical) values in the same
 * order, so this changes no result. Each output element's summation
 * order depends only on K (and, when quantized, on the group size), not on the
 * tile used, so results do not depend on T, on how a pass is chunked, or on
 * whether the grouped (MoE) entry or plain calls computed them. */
#ifndef DG_MATMUL_DRIVER_H
#define DG_MATMUL_DRIVER_H

#include "kernels.h"
#include "quant.h"

/* One quantized tile: rows[i] packed rows, sc[i]/bi[i] their scale/bias rows. */
typedef void (*qtile_fn)(float *y, int64_t ldy, const float *x, int64_t ldx, const uint8_t *const *rows,
                         const char *const *sc, const char *const *bi, dg_dtype sbt, int G, int64_t K);

/* [bits index][shape: 4x4, 4x1, 1x4, 1x1]; bits index of 2,3,4,6,8 = 0..4 */
static const qtile_fn QTILE_TABLE[5][4] = {
    {qtile_2_4x4, qtile_2_4x1, qtile_2_1x4, qtile_2_1x1}, {qtile_3_4x4, qtile_3_4x1, qtile_3_1x4, qtile_3_1x1},
    {qtile_4_4x4, qtile_4_4x1, qtile_4_1x4, qtile_4_1x1}, {qtile_6_4x4, qtile_6_4x1, qtile_6_1x4, qtile_6_1x1},
    {qtile_8_4x4, qtile_8_4x1, qtile_8_1x4, qtile_8_1x1}};

static inline int qbits_index(int bits) { return bits == 2 ? 0 : bits == 3 ? 1 : bits == 4 ? 2 : bits == 6 ? 3 : 4; }

typedef void (*qdeq_fn)(const uint8_t *row, const char *sc, const char *bi, dg_dtype sbt, int G, int64_t K, float *out);
static const qdeq_fn QDEQ_TABLE[5] = {qdeq_2, qdeq_3, qdeq_4, qdeq_6, qdeq_8};

#define QDEQ_MIN_T 8 /* activation rows from which a block is dequantized once */

/* Rows [n, n+rt) (rt <= 4) of W, starting at absolute row r0 = row0 + n, times
 * T activation rows: y[t*ldy + n + i]. */
/* buf: NULL, or 4*K floats of per-thread scratch for the dequantize-once path. */
static void block_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int64_t r0,
                       int64_t rt, float *buf) {
  const int64_t K = w->cols;
  if (w->bits && buf && T >= QDEQ_MIN_T) {
    const int G = w->group_size;
    const size_t rb = (size_t)dg_quant_row_bytes(K, w->bits), sb = (size_t)(K / G) * dg_dtype_size(w->sb_dtype);
    for (int i = 0; i < rt; i++)
      QDEQ_TABLE[qbits_index(w->bits)]((const uint8_t *)w->data + (size_t)(r0 + i) * rb,
                                       (const char *)w->scales + (size_t)(r0 + i) * sb,
                                       (const char *)w->biases + (size_t)(r0 + i) * sb, w->sb_dtype, G, K,
                                       buf + (size_t)i * K);
    const dg_weight f = {.dtype = DG_F32, .data = buf, .rows = rt, .cols = K};
    block_rows(y, ldy, x, ldx, T, &f, 0, rt, NULL);
    return;
  }
  if (!w->bits) {
    const size_t rb = (size_t)K * dg_dtype_size(w->dtype);
    const char *rows[4];
    for (int i = 0; i < rt; i++) rows[i] = (const char *)w->data + (size_t)(r0 + i) * rb;
    int64_t t = 0;
    if (rt == 4) {
      for (; t + 4 <= T; t += 4) tile_4x4(y + t * ldy, ldy, x + t * ldx, ldx, rows, w->dtype, K);
      for (; t < T; t++) tile_4x1(y + t * ldy, ldy, x + t * ldx, ldx, rows, w->dtype, K);
    } else {
      for (int i = 0; i < rt; i++) {
        const char *r1[1] = {rows[i]};
        int64_t tt = 0;
        for (; tt + 4 <= T; tt += 4) tile_1x4(y + tt * ldy + i, ldy, x + tt * ldx, ldx, r1, w->dtype, K);
        for (; tt < T; tt++) tile_1x1(y + tt * ldy + i, ldy, x + tt * ldx, ldx, r1, w->dtype, K);
      }
    }
    return;
  }
  const qtile_fn *tf = QTILE_TABLE[qbits_index(w->bits)];
  const int G = w->group_size;
  const size_t rb = (size_t)dg_quant_row_bytes(K, w->bits), sb = (size_t)(K / G) * dg_dtype_size(w->sb_dtype);
  const uint8_t *rows[4];
  const char *sc[4], *bi[4];
  for (int i = 0; i < rt; i++) {
    rows[i] = (const uint8_t *)w->data + (size_t)(r0 + i) * rb;
    sc[i] = (const char *)w->scales + (size_t)(r0 + i) * sb;
    bi[i] = (const char *)w->biases + (size_t)(r0 + i) * sb;
  }
  int64_t t = 0;
  if (rt == 4) {
    for (; t + 4 <= T; t += 4) tf[0](y + t * ldy, ldy, x + t * ldx, ldx, rows, sc, bi, w->sb_dtype, G, K);
    for (; t < T; t++) tf[1](y + t * ldy, ldy, x + t * ldx, ldx, rows, sc, bi, w->sb_dtype, G, K);
  } else {
    for (int i = 0; i < rt; i++) {
      const uint8_t *r1[1] = {rows[i]};
      const char *s1[1] = {sc[i]}, *b1[1] = {bi[i]};
      int64_t tt = 0;
      for (; tt + 4 <= T; tt += 4) tf[2](y + tt * ldy + i, ldy, x + tt * ldx, ldx, r1, s1, b1, w->sb_dtype, G, K);
      for (; tt < T; tt++) tf[3](y + tt * ldy + i, ldy, x + tt * ldx, ldx, r1, s1, b1, w->sb_dtype, G, K);
    }
  }
}

/* Per-thread scratch for the dequantize-once path (NULL when not needed or
 * out of memory: the quantized tiles are used then). */
static float *qbuf_new(const dg_weight *w, int64_t T) {
  return w->bits && T >= QDEQ_MIN_T ? aligned_alloc(64, ((size_t)4 * (size_t)w->cols * sizeof(float) + 63) / 64 * 64)
                                    : NULL;
}

static void matmul_driver(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                          int64_t row0, int64_t N, int n_threads) {
  const int64_t nblk = (N + 3) / 4;
#pragma omp parallel num_threads(n_threads)
  {
    float *buf = qbuf_new(w, T);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
      int64_t n = b * 4;
      block_rows(y + n, ldy, x, ldx, T, w, row0 + n, N - n < 4 ? N - n : 4, buf);
    }
    free(buf);
  }
}

static void matmul_grouped_driver(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *start, int E,
                                  const dg_weight *w, int64_t rows_per_expert, int64_t row_off, int64_t N,
                                  int n_threads) {
  const int64_t nblk = (N + 3) / 4, ntask = (int64_t)E * nblk;
  int64_t tmax = 0;
  for (int e = 0; e < E; e++) tmax = start[e + 1] - start[e] > tmax ? start[e + 1] - start[e] : tmax;
  /* dynamic: experts carry different numbers of rows, and empty ones cost nothing */
#pragma omp parallel num_threads(n_threads)
  {
    float *buf = qbuf_new(w, tmax);
#pragma omp for schedule(dynamic, 8)
    for (int64_t task = 0; task < ntask; task++) {
      int e = (int)(task / nblk);
      int64_t n = (task % nblk) * 4, T = start[e + 1] - start[e];
      if (T <= 0) continue;
      block_rows(y + (int64_t)start[e] * ldy + n, ldy, x + (int64_t)start[e] * ldx, ldx, T, w,
                 (int64_t)e * rows_per_expert + row_off + n, N - n < 4 ? N - n : 4, buf);
    }
    free(buf);
  }
}

#endif
