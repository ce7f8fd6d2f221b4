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
 * down, rows of 352 and 11), in anonymous memory. */
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
  if (why && n) {
    char q[64];
    const int cut = dg_env_quote(v, q, sizeof q);
    snprintf(why, n, "DGEMMA_CPU_PACK=\"%s%s\" is none of 0 (no pack), 1 (every matrix) and nat (gate/up-shaped ones)",
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
  return mode == DG_CPU_PACK_ALL ? dg_cpu_pack_applies(w) : mode == DG_CPU_PACK_NAT ? dg_cpu_pack_nat(w) : 0;
}

dg_cpu_pack_geom dg_cpu_pack_geom_of(const dg_weight *w) {
  dg_cpu_pack_geom g = {(const char *)w->cpu_pack, dg_quant_row_bytes(w->cols, w->bits), 0,
                        w->cols / w->group_size * (int64_t)dg_dtype_size(w->sb_dtype), 0};
  g.tl = g.rb % 64;
  g.P = (4 * g.rb + 8 * g.sbrow + 63) / 64 * 64; /* 256 S + 4 t = 4 rb, the scales, the biases, padding */
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
