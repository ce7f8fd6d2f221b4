/* matmul_driver.h: the loops shared by the SIMD matmuls (matmul_avx2.c,
 * matmul_avx512.c). matmul_tiles.h, included before it, defines for the
 * including file's instruction set the register tiles (weight rows x
 * activation rows)
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

#include <omp.h>
#include <stdlib.h>

#include "cpu/kernels.h"
#include "cpu/scratch.h"
#include "io/quant.h"

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
    for (int i = 0; i < rt; i++) {
      const uint8_t *codes;
      const char *sc, *bi;
      dg_quant_row_ptrs(w, r0 + i, &codes, &sc, &bi);
      QDEQ_TABLE[qbits_index(w->bits)](codes, sc, bi, w->sb_dtype, w->group_size, K, buf + (size_t)i * K);
    }
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
  const uint8_t *rows[4];
  const char *sc[4], *bi[4];
  for (int i = 0; i < rt; i++) dg_quant_row_ptrs(w, r0 + i, &rows[i], &sc[i], &bi[i]);
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

/* The thread's scratch for the dequantize-once path (scratch.h; NULL when not
 * needed or out of memory: the quantized tiles are used then). */
static float *qbuf_get(const dg_weight *w, int64_t T) {
  return w->bits && T >= QDEQ_MIN_T ? dg_kscratch(DG_KSCRATCH_QDEQ, (size_t)4 * (size_t)w->cols * sizeof(float)) : NULL;
}

static void matmul_driver(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                          int64_t row0, int64_t N, int n_threads) {
  const int64_t nblk = (N + 3) / 4;
#pragma omp parallel num_threads(n_threads)
  {
    float *buf = qbuf_get(w, T);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
      int64_t n = b * 4;
      block_rows(y + n, ldy, x, ldx, T, w, row0 + n, N - n < 4 ? N - n : 4, buf);
    }
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
    float *buf = qbuf_get(w, tmax);
#pragma omp for schedule(dynamic, 8)
    for (int64_t task = 0; task < ntask; task++) {
      int e = (int)(task / nblk);
      int64_t n = (task % nblk) * 4, T = start[e + 1] - start[e];
      if (T <= 0) continue;
      block_rows(y + (int64_t)start[e] * ldy + n, ldy, x + (int64_t)start[e] * ldx, ldx, T, w,
                 (int64_t)e * rows_per_expert + row_off + n, N - n < 4 ? N - n : 4, buf);
    }
  }
}

/* ---- the product over W's rows (kernels.h: matmul_rows) -------------------
 * matmul_tiles.h defines RCOLS and the register tiles
 *   rtile_4, rtile_1   y[t, j .. j+nc) += sum_v x[t, v] * W[v, j .. j+nc) for
 *                      4 or 1 activation rows and nc <= RCOLS columns, v in
 *                      [0, nv) increasing; the accumulators are loaded from
 *                      y and stored back, each term a product then a sum.
 * Each thread owns a range of columns (a multiple of 128, so of every group
 * size, except at the end) and walks the rows of W in blocks of about
 * RBLOCK_BYTES, which stay in the L2 while every tile of activation rows
 * uses them; a quantized block is first dequantized into a per-thread fp32
 * buffer (the same values as dg_quant_dequant_row). Storing y between blocks
 * and reloading it is exact, so the order over v is the oracle's. */
#define RBLOCK_BYTES (256 << 10)

/* Rows [v0, v0+nv) and columns [j0, j1) of a quantized W added into y element
 * by element (the fallback when the block buffer cannot be allocated). */
static void rows_scalar(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w, int64_t v0,
                        int64_t nv, int64_t j0, int64_t j1) {
  const int G = w->group_size;
  const int64_t ng = w->cols / G;
  for (int64_t v = v0; v < v0 + nv; v++) {
    const uint8_t *row = (const uint8_t *)w->data + v * dg_quant_row_bytes(w->cols, w->bits);
    for (int64_t j = j0; j < j1; j++) {
      const float wj = (float)dg_quant_code(row, w->bits, j) * dg_load_elem(w->sb_dtype, w->scales, v * ng + j / G) +
                       dg_load_elem(w->sb_dtype, w->biases, v * ng + j / G);
      for (int64_t t = 0; t < T; t++) y[t * ldy + j] += x[t * ldx + v] * wj;
    }
  }
}

static void matmul_rows_driver(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                               int n_threads) {
  const int64_t H = w->cols, V = w->rows, units = (H + 127) / 128;
  const size_t es = w->bits ? sizeof(float) : dg_dtype_size(w->dtype);
  const int nt = n_threads < 1 ? 1 : (int64_t)n_threads > units ? (int)units : n_threads;
#pragma omp parallel num_threads(nt)
  {
    const int th = omp_get_thread_num(), nth = omp_get_num_threads();
    const int64_t j0 = units * th / nth * 128, j1e = units * (th + 1) / nth * 128, j1 = j1e < H ? j1e : H;
    const int64_t W = j1 - j0;
    int64_t vb = W > 0 ? (int64_t)(RBLOCK_BYTES / ((size_t)W * es)) : 1;
    vb = vb < 4 ? 4 : vb > V ? (V > 0 ? V : 1) : vb;
    float *buf = W > 0 && w->bits ? dg_kscratch(DG_KSCRATCH_ROWS, (size_t)vb * (size_t)W * sizeof(float)) : NULL;
    for (int64_t t = 0; t < T && W > 0; t++) memset(y + t * ldy + j0, 0, (size_t)W * sizeof(float));
    for (int64_t v0 = 0; v0 < V && W > 0; v0 += vb) {
      const int64_t nv = V - v0 < vb ? V - v0 : vb;
      const char *wb;
      size_t rs;
      dg_dtype dt = w->dtype;
      if (w->bits) {
        const int G = w->group_size;
        const size_t rb = (size_t)dg_quant_row_bytes(H, w->bits), ss = dg_dtype_size(w->sb_dtype), sb = (size_t)(H / G) * ss;
        if (!buf) { /* out of memory for the block buffer: the same sums, one element at a time */
          rows_scalar(y, ldy, x, ldx, T, w, v0, nv, j0, j1);
          continue;
        }
        for (int64_t v = 0; v < nv; v++)
          QDEQ_TABLE[qbits_index(w->bits)]((const uint8_t *)w->data + (size_t)(v0 + v) * rb + (size_t)j0 * w->bits / 8,
                                           (const char *)w->scales + (size_t)(v0 + v) * sb + (size_t)(j0 / G) * ss,
                                           (const char *)w->biases + (size_t)(v0 + v) * sb + (size_t)(j0 / G) * ss,
                                           w->sb_dtype, G, W, buf + (size_t)v * W);
        wb = (const char *)buf;
        rs = (size_t)W * sizeof(float);
        dt = DG_F32;
      } else {
        rs = (size_t)H * es;
        wb = (const char *)w->data + (size_t)v0 * rs + (size_t)j0 * es;
      }
      int64_t t = 0;
      for (; t + 4 <= T; t += 4)
        for (int64_t j = j0; j < j1; j += RCOLS)
          rtile_4(y + t * ldy + j, ldy, x + t * ldx + v0, ldx, wb + (size_t)(j - j0) * dg_dtype_size(dt), rs, dt, nv,
                  j1 - j < RCOLS ? j1 - j : RCOLS);
      for (; t < T; t++)
        for (int64_t j = j0; j < j1; j += RCOLS)
          rtile_1(y + t * ldy + j, ldy, x + t * ldx + v0, ldx, wb + (size_t)(j - j0) * dg_dtype_size(dt), rs, dt, nv,
                  j1 - j < RCOLS ? j1 - j : RCOLS);
    }
  }
}

#endif
