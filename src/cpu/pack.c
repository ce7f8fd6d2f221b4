/* pack.c: an opt-in copy of an MLX affine weight laid out for avx512lp's one-row tiles
 * (the matvec, M < 4: ntile in cpu/matmul_avx512lp.c), so that each thread reads one
 * stream instead of the MLX layout's six (4 rows of codes, the scales, the biases).
 *
 * Which weights: 2-bit g128, 4-bit g64, 8-bit g32 (8 packed dwords a group, the tiles'
 * n = 8), at least 4 rows. Rows are taken 4 at a time (4-row block b: rows 4 b .. 4 b + 3;
 * a last block of fewer rows is not packed and is read from the MLX layout). Block b's
 * bytes start at b * dg_cpu_pack_block_bytes(w) and hold, per block of 16 groups blk
 * (16 G codes = 512 packed bytes a row; n = min(16, ng - 16 blk) groups):
 *   ns = min(8, ceil((row bytes - 512 blk) / 64)) steps, each 4 rows x 64 packed bytes
 *   (step m of row i at (4 m + i) 64; a partial last step zero padded, as the tile's
 *   masked load reads it),
 *   then the 4 rows' n scales (row i at i n, the weight's sb dtype);
 * and after the last blk the 4 rows' ng biases (row i at i ng). The same codes, scales and
 * biases as the MLX layout, only moved: the tiles compute the same integers and the same
 * fp32 operations from them, so the bits do not change (tests/test_kernels.c).
 *
 * Cost: a second copy of the packed matrices (as many bytes as their codes, scales and
 * biases, plus the zero padding of partial steps: none at the 26B's shapes) in anonymous
 * memory; the MLX copy stays for every other reader (writers, quantize, the CUDA upload,
 * the other tiles). */
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "io/quant.h"

int dg_cpu_pack_applies(const dg_weight *w) {
  return w->bits && (w->bits == 2 || w->bits == 4 || w->bits == 8) && w->group_size * w->bits == 256 &&
         w->cols % w->group_size == 0 && w->rows >= 4;
}

int64_t dg_cpu_pack_block_bytes(const dg_weight *w) {
  const int64_t rb = dg_quant_row_bytes(w->cols, w->bits), ng = w->cols / w->group_size;
  const int64_t esz = (int64_t)dg_dtype_size(w->sb_dtype);
  int64_t p = 4 * ng * esz;
  for (int64_t blk = 0; blk * 16 < ng; blk++) {
    const int64_t left = rb - blk * 512, ns = left >= 512 ? 8 : (left + 63) / 64;
    p += ns * 256;
  }
  return p + 4 * ng * esz; /* scales and biases */
}

void *dg_cpu_pack_build(const dg_weight *w) {
  if (!dg_cpu_pack_applies(w)) return NULL;
  const int64_t rb = dg_quant_row_bytes(w->cols, w->bits), ng = w->cols / w->group_size, nb4 = w->rows / 4;
  const size_t esz = dg_dtype_size(w->sb_dtype), P = (size_t)dg_cpu_pack_block_bytes(w);
  char *pack = malloc((size_t)nb4 * P);
  if (!pack) return NULL;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb4; b++) {
    const uint8_t *rows[4];
    const char *sc[4], *bi[4];
    for (int i = 0; i < 4; i++) dg_quant_row_ptrs(w, 4 * b + i, &rows[i], &sc[i], &bi[i]);
    char *p = pack + (size_t)b * P;
    for (int64_t blk = 0; blk * 16 < ng; blk++) {
      const int64_t left = rb - blk * 512, ns = left >= 512 ? 8 : (left + 63) / 64;
      const int64_t n = ng - 16 * blk < 16 ? ng - 16 * blk : 16;
      for (int64_t m = 0; m < ns; m++)
        for (int i = 0; i < 4; i++, p += 64) {
          const int64_t o = blk * 512 + 64 * m, have = rb - o < 64 ? rb - o : 64;
          memcpy(p, rows[i] + o, (size_t)have);
          memset(p + have, 0, (size_t)(64 - have));
        }
      for (int i = 0; i < 4; i++, p += n * esz) memcpy(p, sc[i] + 16 * blk * esz, (size_t)n * esz);
    }
    for (int i = 0; i < 4; i++, p += ng * esz) memcpy(p, bi[i], (size_t)ng * esz);
  }
  return pack;
}
