/* pack.c: a copy of an MLX affine weight laid out for avx512lp's tiles (cpu/matmul_avx512lp.c),
 * so that a thread reads one stream per 4 rows instead of the MLX layout's six (4 rows of
 * codes, the scales, the biases). Built by the CPU backend for avx512lp (backend_cpu.c:
 * DGEMMA_CPU_PACK=1 every matrix it applies to, "nat" those dg_cpu_pack_nat takes; unset none),
 * which then lets the MLX bytes leave the process's memory.
 *
 * Which weights: 2-, 4- and 8-bit, any group size (the formats of avx512lp's VNNI tiles);
 * "nat" takes only those whose activations avx512lp quantizes in the transposed layout at 8
 * dwords a group (dg_cpu_pack_nat, kernels.h: their one-row products run NTILE), the ones the
 * pack was never slower on in session 19 (not the default: slower on Zen 5, session 20;
 * docs/measurements.md).
 * Rows are taken 4 at a time: 4-row block b holds rows 4 b .. 4 b + 3 (a last block of
 * fewer rows is zero past the matrix's last row) at b P (P: dg_cpu_pack_geom). With rb
 * the row's packed bytes, S = floor(rb / 64) whole 64-byte steps and a tail of t = rb - 64 S
 * bytes (0 .. 63), a block holds
 *   step s of row i at (4 s + i) 64 (s < S): the row's bytes [64 s, 64 s + 64);
 *   row i's tail at 256 S + i t: its last t bytes (which the tiles read with a masked load);
 *   the 4 rows' ng scales (row i at 256 S + 4 t + i ng esz, the weight's sb dtype);
 *   the 4 rows' ng biases (row i at 256 S + 4 t + (4 + i) ng esz);
 *   zeros up to a multiple of 64 bytes (each block starts on a cache line).
 * So byte o < 64 S of row i's codes is at (row i's start) + 4 o, its tail, scales and biases
 * are contiguous as in the MLX layout (dg_cpu_pack_row, kernels.h): the tiles read the same codes,
 * scales and biases, compute the same integers and the same fp32 operations from them, so the
 * bits do not change (tests/test_kernels.c).
 *
 * Cost: the bytes of the codes, scales and biases plus under 64 a block (the 26B's 4-bit g64
 * experts: none for gate/up, rows of 1408 bytes and 44 bf16 scales; 16 bytes on 1584, 1%, for
 * down, rows of 352 and 11), in anonymous memory.
 *
 * The interleaved layout (DGEMMA_CPU_PACK=il, dg_cpu_pack_build_il; only the matrices dg_cpu_pack_nat takes: 32
 * bytes of codes a group, so a block of 16 groups is 8 64-byte steps of a row, the unit of NTILE, the one-row tile
 * of cpu/matmul_avx512lp.c): rows are taken R (4 or 8) at a time, unit u holding rows R u .. R u + R - 1 (zero past
 * the matrix's last row) at u U, so that a thread's matrix-vector product over its units reads one forward stream,
 * in the order the tile uses the bytes (the 4-row pack above reads the 4 rows' codes forward but their scales and
 * biases from the block's end; the MLX layout is 4 code rows, the scales and the biases: 6 streams a tile). A unit
 * is its nblk blocks of 16 groups, block blk at blk BF (dg_cpu_il_block), then the biases:
 *   the codes of the block's ns steps (ns = 8 but in a partial last block: ceil(n_last / 2)), R / 4 sub-passes of 4
 *   rows, sub-pass p's step m of row 4 p + i at (p ns + m) 256 + 64 i: the row's bytes [512 blk + 64 m, + 64),
 *   zero past the row's end (a last step of 32 bytes);
 *   the R rows' scales of the block's n groups (16, or n_last), row r at 64 R ns + r n esz;
 *   after the last block (at boff) the R rows' ng biases, row r at boff + r ng esz, then zeros to a multiple of 64.
 * BF = 512 R + 16 R esz is a multiple of 64: every block and every step starts on a cache line. The tile reads the
 * same codes (zero where the MLX layout's masked loads give zero), scales and biases and does the same integer and
 * fp32 operations, so the bits do not change (tests/test_kernels.c); calls of 4 or more activation rows prepare each
 * unit's rows once for the tiles on prepared rows (il_prep there; a unit a call takes only in part is copied out to
 * the MLX layout, dg_cpu_il_unit_rows). Cost: the codes, scales and biases plus the zeros of a
 * partial last step and the unit's padding (the 26B's gate/up, R = 8: none, 12672 bytes a unit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dg_mem.h"
#include "cpu/kernels.h"
#include "io/quant.h"

int dg_cpu_pack_wanted(char *why, size_t n) {
  const char *v = getenv("DGEMMA_CPU_PACK");
  if (why && n) why[0] = '\0';
  if (!v) return DG_CPU_PACK_DEFAULT;
  if (!strcmp(v, "0")) return DG_CPU_PACK_NONE;
  if (!strcmp(v, "1")) return DG_CPU_PACK_ALL;
  if (!strcmp(v, "nat")) return DG_CPU_PACK_NAT;
  if (!strcmp(v, "il")) return DG_CPU_PACK_IL;
  if (!strcmp(v, "seq1")) return DG_CPU_PACK_SEQ1;
  if (why && n) {
    char q[64];
    const int cut = dg_env_quote(v, q, sizeof q);
    snprintf(why, n,
             "DGEMMA_CPU_PACK=\"%s%s\" is none of 0 (no pack), 1 (every matrix), nat (gate/up-shaped ones), il "
             "(those interleaved) and seq1 (no pack, 4-row tiles)",
             q, cut ? "..." : "");
  }
  return -1;
}

int dg_cpu_pack_applies(const dg_weight *w) {
  return w->bits && (w->bits == 2 || w->bits == 4 || w->bits == 8) && w->group_size > 0 &&
         w->cols % w->group_size == 0 && w->rows >= 1 && w->cols >= 1;
}

int dg_cpu_pack_nat(const dg_weight *w) {
  return dg_cpu_pack_applies(w) && dg_lp_tr_n(w->cols, w->bits, w->group_size) == 8;
}

int dg_cpu_pack_takes(const dg_weight *w, int mode) {
  return mode == DG_CPU_PACK_ALL ? dg_cpu_pack_applies(w)
         : mode == DG_CPU_PACK_NAT || mode == DG_CPU_PACK_IL ? dg_cpu_pack_nat(w)
                                                            : 0;
}

dg_cpu_pack_geom dg_cpu_pack_geom_of(const dg_weight *w) {
  dg_cpu_pack_geom g = {.pack = (const char *)w->cpu_pack, .rb = dg_quant_row_bytes(w->cols, w->bits),
                        .sbrow = w->cols / w->group_size * (int64_t)dg_dtype_size(w->sb_dtype)};
  g.tl = g.rb % 64;
  g.P = (4 * g.rb + 8 * g.sbrow + 63) / 64 * 64; /* 256 S + 4 t = 4 rb, the scales, the biases, padding */
  if (w->cpu_pack_il && w->bits && w->group_size > 0) { /* the interleaved layout: 32 code bytes a group */
    const int R = w->cpu_pack_il;
    const int64_t ng = w->cols / w->group_size, nblk = (ng + 15) / 16;
    g.il = g.pack, g.pack = NULL;
    g.R = R, g.ng = ng, g.esz = (int64_t)dg_dtype_size(w->sb_dtype);
    g.n_last = (int)(ng - 16 * (nblk - 1)), g.ns_last = (g.n_last + 1) / 2;
    g.BF = 512 * R + 16 * R * g.esz;
    g.boff = (nblk - 1) * g.BF + 64 * R * g.ns_last + R * g.n_last * g.esz;
    g.U = (g.boff + R * ng * g.esz + 63) / 64 * 64;
  }
  return g;
}

void *dg_cpu_pack_build(const dg_weight *w) {
  if (!dg_cpu_pack_applies(w)) return NULL;
  dg_cpu_pack_geom g = dg_cpu_pack_geom_of(w);
  const int64_t S = g.rb / 64, nb4 = (w->rows + 3) / 4;
  char *pack = dg_big_alloc((size_t)nb4 * (size_t)g.P, NULL); /* base/dg_mem.h: 2 MiB pages with DGEMMA_THP=1 */
  if (!pack) return NULL;
  g.pack = pack;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb4; b++) {
    memset(pack + (size_t)b * (size_t)g.P, 0, (size_t)g.P);
    for (int64_t r = 4 * b; r < 4 * b + 4 && r < w->rows; r++) {
      const uint8_t *row, *pc, *pt;
      const char *sc, *bi, *ps, *pb;
      dg_quant_row_ptrs(w, r, &row, &sc, &bi);
      dg_cpu_pack_row(&g, r, &pc, &pt, &ps, &pb); /* the pack's own memory: written through */
      for (int64_t s = 0; s < S; s++) memcpy((uint8_t *)pc + 256 * s, row + 64 * s, 64);
      memcpy((uint8_t *)pt, row + 64 * S, (size_t)g.tl);
      memcpy((char *)ps, sc, (size_t)g.sbrow);
      memcpy((char *)pb, bi, (size_t)g.sbrow);
    }
  }
  return pack;
}

void *dg_cpu_pack_build_il(const dg_weight *w, int R) {
  if (!dg_cpu_pack_nat(w) || (R != 4 && R != 8)) return NULL;
  dg_weight wi = *w;
  wi.cpu_pack_il = R;
  dg_cpu_pack_geom g = dg_cpu_pack_geom_of(&wi);
  const int64_t nu = (w->rows + R - 1) / R, nblk = (g.ng + 15) / 16;
  char *pack = dg_big_alloc((size_t)nu * (size_t)g.U, NULL); /* base/dg_mem.h: 2 MiB pages with DGEMMA_THP=1 */
  if (!pack) return NULL;
  g.il = pack;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < nu; u++) {
    memset(pack + (size_t)u * (size_t)g.U, 0, (size_t)g.U);
    for (int64_t r = R * u; r < R * u + R && r < w->rows; r++) {
      const uint8_t *row;
      const char *sc, *bi;
      dg_quant_row_ptrs(w, r, &row, &sc, &bi);
      const int64_t j = r - R * u, p = j / 4, i = j % 4; /* row j of the unit: sub-pass p, row i of it */
      for (int64_t blk = 0; blk < nblk; blk++) {
        char *b = (char *)dg_cpu_il_block(&g, u, blk); /* the pack's own memory: written through */
        const int last = blk == nblk - 1, ns = last ? g.ns_last : 8, n = last ? g.n_last : 16;
        for (int m = 0; m < ns; m++) {
          const int64_t o = 512 * blk + 64 * m;
          memcpy(b + (p * ns + m) * 256 + 64 * i, row + o, (size_t)(g.rb - o < 64 ? g.rb - o : 64));
        }
        memcpy(b + 64 * R * ns + j * n * g.esz, sc + 16 * blk * g.esz, (size_t)(n * g.esz));
      }
      memcpy(pack + (size_t)u * (size_t)g.U + g.boff + j * g.ng * g.esz, bi, (size_t)(g.ng * g.esz));
    }
  }
  return pack;
}

void dg_cpu_il_unit_rows(const dg_cpu_pack_geom *g, int64_t u, char *dst, int64_t stride) {
  const int R = g->R;
  const int64_t nblk = (g->ng + 15) / 16, rs = (g->rb + 63) / 64 * 64, ss = (g->ng * g->esz + 63) / 64 * 64;
  for (int64_t blk = 0; blk < nblk; blk++) {
    const char *b = dg_cpu_il_block(g, u, blk);
    const int last = blk == nblk - 1, ns = last ? g->ns_last : 8, n = last ? g->n_last : 16;
    for (int p = 0; p < R / 4; p++) /* in the unit's order: sub-pass, step, row */
      for (int m = 0; m < ns; m++)
        for (int i = 0; i < 4; i++) /* a whole 64 bytes: the pack's zeros past a row's end, inside rs */
          memcpy(dst + (4 * p + i) * stride + 512 * blk + 64 * m, b + (p * ns + m) * 256 + 64 * i, 64);
    for (int j = 0; j < R; j++)
      memcpy(dst + j * stride + rs + 16 * blk * g->esz, b + 64 * R * ns + j * n * g->esz, (size_t)(n * g->esz));
  }
  const char *bi = g->il + (size_t)u * (size_t)g->U + g->boff;
  for (int j = 0; j < R; j++) memcpy(dst + j * stride + rs + ss, bi + j * g->ng * g->esz, (size_t)(g->ng * g->esz));
}

int dg_cpu_pack_set(dg_weight *w, int mode) {
  if (!dg_cpu_pack_takes(w, mode)) return 1;
  const int R = mode == DG_CPU_PACK_IL ? DG_CPU_IL_ROWS : 0;
  void *p = R ? dg_cpu_pack_build_il(w, R) : dg_cpu_pack_build(w);
  if (!p) return -1;
  w->cpu_pack = p, w->cpu_pack_il = R;
  return 0;
}
