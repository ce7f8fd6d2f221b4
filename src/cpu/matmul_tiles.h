/* matmul_tiles.h: the register tiles of the SIMD matmuls, written once for
 * matmul_avx2.c (8 lanes) and matmul_avx512.c (16 lanes). Each of those files
 * is compiled with its own -m flags (Makefile: ISA_avx2, ISA_avx512) and
 * includes this header after defining, for its instruction set:
 *   VF, VL          the fp32 vector type and its lane count
 *   VMASK, VMASKED  a lane mask type; VMASKED 1: K and column tails are masked
 *                   vector loads (AVX-512), 0: they are scalar loops and every
 *                   mask argument is ignored (AVX2: no masked 16-bit loads)
 *   vmask(n)        the mask of lanes [0, n) (n clamped to [0, VL])
 *   VZERO() VSET1(f) VLOAD(p) VSTORE(p, v) VLOADM(m, p) VSTOREM(p, m, v)
 *   VADD(a, b) VMUL(a, b) VFMADD(a, b, c) VHSUM(v)
 *                   the intrinsics (VLOADM zeroes the lanes off m)
 *   load_w(dt, row, k, m)   VL weights of a float row (f32/bf16/f16) from
 *                   element k, widened to fp32
 *   qunpack, qunpack_for(b), qcodes(p, b, &u)   VL codes of a b-bit packed
 *                   row at p (k % VL == 0) as fp32
 * and then matmul_driver.h, which walks these tiles. What it defines:
 *   tile_4x4, tile_4x1, tile_1x4, tile_1x1   float weights, y = x . W^T
 *   qtile_B_4x4 ... qtile_B_1x1, qdeq_B      MLX affine B-bit weights (B = 2,3,4,6,8)
 *   rtile_4, rtile_1, RCOLS                  the product over W's rows
 *
 * The numerics, the same for both instruction sets: a float tile sums each
 * lane with FMAs and the lanes at the end (then, unmasked, the K tail in
 * scalar: the summation order tests/test_kernels.c derives its tolerance
 * for); a quantized weight is w = q*s + b with a separate multiply and add
 * (two roundings, bit-identical to dg_quant_dequant_row; K is a multiple of
 * the group size >= 32, so quantized rows have no K tail); the row product
 * is a multiply then an add, never an FMA (the oracle rounds the product). */
#ifndef DG_MATMUL_TILES_H
#define DG_MATMUL_TILES_H

#include "cpu/kernels.h"

/* RT weight rows x TT activation rows = RT*TT accumulators of VL lanes; each
 * weight vector is widened once and used for TT activation rows. */
#define TILE(RT, TT)                                                                           \
  static void tile_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,            \
                               const char *const *rows, dg_dtype dt, int64_t K) {             \
    VF acc[RT][TT];                                                                            \
    _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                                                               \
      _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) acc[i][j] = VZERO();                                        \
    int64_t k = 0;                                                                             \
    for (; VMASKED ? k < K : k + VL <= K; k += VL) {                                           \
      const VMASK m = vmask(K - k);                                                            \
      VF xv[TT];                                                                               \
      _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) xv[j] = VLOADM(m, x + j * ldx + k);                         \
      _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++) {                                                           \
        VF wv = load_w(dt, rows[i], k, m);                                                     \
        _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) acc[i][j] = VFMADD(wv, xv[j], acc[i][j]);                 \
      }                                                                                        \
    }                                                                                          \
    _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                                                               \
      _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) {                                                           \
        float s = VHSUM(acc[i][j]);                                                            \
        if (!VMASKED) /* the K tail */                                                         \
          for (int64_t kk = k; kk < K; kk++) s += x[j * ldx + kk] * dg_load_elem(dt, rows[i], kk); \
        y[j * ldy + i] = s;                                                                    \
      }                                                                                        \
  }
TILE(4, 4)
TILE(4, 1)
TILE(1, 4)
TILE(1, 1)

/* The same tiles on B-bit codes: per group of G the rows' scale and bias are
 * broadcast once, then VL codes at a time are dequantized and multiplied in. */
#define QTILE(B, RT, TT)                                                                                 \
  static void qtile_##B##_##RT##x##TT(float *y, int64_t ldy, const float *x, int64_t ldx,              \
                                      const uint8_t *const *rows, const char *const *sc,               \
                                      const char *const *bi, dg_dtype sbt, int G, int64_t K) {         \
    VF acc[RT][TT];                                                                                      \
    const qunpack un = qunpack_for(B);                                                                   \
    _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                                                                         \
      _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) acc[i][j] = VZERO();                                                  \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      VF s[RT], b[RT];                                                                                   \
      _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++) {                                                                     \
        s[i] = VSET1(dg_load_elem(sbt, sc[i], g0 / G));                                                  \
        b[i] = VSET1(dg_load_elem(sbt, bi[i], g0 / G));                                                  \
      }                                                                                                  \
      for (int64_t k = g0; k < g0 + G; k += VL) {                                                        \
        VF xv[TT];                                                                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) xv[j] = VLOAD(x + j * ldx + k);                                     \
        _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++) {                                                                   \
          VF wv = VADD(VMUL(qcodes(rows[i] + k * B / 8, B, &un), s[i]), b[i]);                           \
          _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) acc[i][j] = VFMADD(wv, xv[j], acc[i][j]);                         \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
    _Pragma("GCC unroll 4") for (int i = 0; i < RT; i++)                                                                         \
      _Pragma("GCC unroll 4") for (int j = 0; j < TT; j++) y[j * ldy + i] = VHSUM(acc[i][j]);                                    \
  }
/* Dequantize one packed row into out[K] (fp32), the same multiply then add. */
#define QDEQ(B)                                                                                          \
  static void qdeq_##B(const uint8_t *row, const char *sc, const char *bi, dg_dtype sbt, int G, int64_t K, \
                       float *out) {                                                                     \
    const qunpack un = qunpack_for(B);                                                                   \
    for (int64_t g0 = 0; g0 < K; g0 += G) {                                                              \
      const VF s = VSET1(dg_load_elem(sbt, sc, g0 / G));                                                 \
      const VF b = VSET1(dg_load_elem(sbt, bi, g0 / G));                                                 \
      for (int64_t k = g0; k < g0 + G; k += VL)                                                          \
        VSTORE(out + k, VADD(VMUL(qcodes(row + k * B / 8, B, &un), s), b));                              \
    }                                                                                                    \
  }
#define QTILES(B) QTILE(B, 4, 4) QTILE(B, 4, 1) QTILE(B, 1, 4) QTILE(B, 1, 1) QDEQ(B)
QTILES(2)
QTILES(3)
QTILES(4)
QTILES(6)
QTILES(8)

/* The product over W's rows (kernels.h: matmul_rows): TT activation rows x
 * RCOLS = 4 VL columns = 4*TT accumulators held across the whole block of
 * rows; per row v one load (widened) of RCOLS weights and one broadcast of
 * x[t, v] per activation row, then a multiply and an add (not an FMA: the
 * oracle rounds the product). Rows whose TT activations are all zero are
 * skipped. Columns past nc (the tail of the last block) are masked off, or,
 * unmasked, the whole partial block goes through a scalar loop with the same
 * operations. */
#define RCOLS (4 * VL)
#define RTILE(TT)                                                                                           \
  static void rtile_##TT(float *y, int64_t ldy, const float *x, int64_t ldx, const char *w, size_t rs,     \
                         dg_dtype dt, int64_t nv, int64_t nc) {                                            \
    if (!VMASKED && nc < RCOLS) { /* the last, partial block of columns */                                \
      for (int64_t v = 0; v < nv; v++)                                                                      \
        _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) {                                                                      \
          const float p = x[t * ldx + v];                                                                   \
          if (p == 0.0f) continue;                                                                          \
          for (int64_t j = 0; j < nc; j++) y[t * ldy + j] += p * dg_load_elem(dt, w + (size_t)v * rs, j);  \
        }                                                                                                   \
      return;                                                                                               \
    }                                                                                                       \
    VMASK m[4];                                                                                             \
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) m[c] = vmask(nc - VL * c);                                                  \
    VF acc[TT][4];                                                                                          \
    _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++)                                                                            \
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) acc[t][c] = VLOADM(m[c], y + t * ldy + VL * c);                           \
    for (int64_t v = 0; v < nv; v++) {                                                                      \
      int nz = 0;                                                                                           \
      _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) nz |= x[t * ldx + v] != 0.0f;                                            \
      if (!nz) continue;                                                                                    \
      const char *row = w + (size_t)v * rs;                                                                 \
      VF e[4];                                                                                              \
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) e[c] = load_w(dt, row, VL * c, m[c]);                                     \
      _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++) {                                                                        \
        const VF p = VSET1(x[t * ldx + v]);                                                                 \
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) acc[t][c] = VADD(acc[t][c], VMUL(p, e[c]));                             \
      }                                                                                                     \
    }                                                                                                       \
    _Pragma("GCC unroll 4") for (int t = 0; t < TT; t++)                                                                            \
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) VSTOREM(y + t * ldy + VL * c, m[c], acc[t][c]);                           \
  }
RTILE(4)
RTILE(1)

#endif
