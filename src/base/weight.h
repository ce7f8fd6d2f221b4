/* weight.h: dg_weight, the typed view of one weight matrix (float or MLX
 * affine-quantized) that the loader fills, the CPU kernels (kernels.h) read
 * and quantization (quant.h) reads and writes. Header-only, on the ground
 * floor next to dtype.h: it names memory, it computes nothing. */
#ifndef DG_WEIGHT_H
#define DG_WEIGHT_H

#include <stdint.h>

#include "base/dtype.h"

/* A row-major matrix view [rows, cols] into a checkpoint (or owned memory).
 * Float weights (bits == 0): row r starts at (char*)data + r*cols*dg_dtype_size(dtype).
 * MLX affine-quantized weights (bits != 0, dtype DG_U32; format in quant.h):
 * packed row r starts at (char*)data + r*cols*bits/8, its group g has scale
 * scales[r*cols/group_size + g] and bias biases[...] of type sb_dtype, and
 * w[r,k] = (float)q * scale + bias. rows/cols are the logical (dequantized)
 * shape; cols is a multiple of group_size. */
typedef struct dg_weight {
  dg_dtype dtype; /* DG_F32, DG_BF16 or DG_F16; DG_U32 when quantized */
  const void *data;
  int64_t rows, cols;
  int bits;                     /* 0 = float; 2, 3, 4, 6 or 8 */
  int group_size;               /* 32, 64 or 128 (quantized only) */
  dg_dtype sb_dtype;            /* scales/biases dtype: DG_BF16, DG_F16 or DG_F32 */
  const void *scales, *biases;  /* [rows, cols/group_size] (quantized only) */
  const void *cpu_pack;         /* NULL, or a copy of the same codes, scales and biases in the order
                                 * avx512lp's tiles read them (cpu/pack.c: DGEMMA_CPU_PACK=1, owned by
                                 * whoever built it); every other reader uses the fields above (whose
                                 * checkpoint pages the CPU backend may have dropped: they fault back in) */
  int cpu_pack_il;              /* 0: cpu_pack (if any) is the 4-row pack; R (4 or 8): it is the interleaved
                                 * layout of R rows (cpu/pack.c, DGEMMA_CPU_PACK=il) */
} dg_weight;

#endif
