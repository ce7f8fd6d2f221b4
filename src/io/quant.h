/* quant.h: MLX "affine" group quantization (spec 3.2), the format of the MLX
 * community DiffusionGemma conversions and of `dgemma quantize`.
 *
 * A quantized matrix W [rows, cols] (cols = input dimension) is three tensors:
 *   <name>.weight  U32   [..., rows, cols*bits/32]  packed codes q in [0, 2^bits - 1]
 *   <name>.scales  float [..., rows, cols/group_size]  (the model dtype, bf16 or f16)
 *   <name>.biases  float [..., rows, cols/group_size]
 * and w[r, k] = scale[r, k/G] * q[r, k] + bias[r, k/G].
 *
 * Packing (ml-explore/mlx, mlx/backend/cpu/quantized.cpp: get_pack_factor,
 * get_bytes_per_pack, extract_bits, and the `quantize` template;
 * mlx/backend/metal/kernels/quantized.h: affine_quantize / affine_dequantize):
 *  - bits 2, 4, 8: each uint32 word holds 32/bits consecutive codes, the
 *    first code in the lowest bits; words are little-endian.
 *  - bits 3, 6: each 3-byte "pack" holds 8 (3-bit) or 4 (6-bit) consecutive
 *    codes, the first in the lowest bits of the little-endian 24-bit value, so
 *    codes straddle the 32-bit words of the U32 tensor.
 * Both cases are the same rule, which is the one this code uses: code k of a
 * row occupies bits [k*bits, (k+1)*bits) of the row's little-endian bit
 * stream (bit j of the stream = bit j%8 of byte j/8). A row takes
 * cols*bits/8 bytes, a whole number of uint32 words because cols is a multiple
 * of the group size (32, 64 or 128).
 *
 * Choosing scale and bias for one group (MLX's affine_quantize; details in
 * dg_quant_group_params). Codes are rounded from the fp32 scale and bias; the
 * stored scale and bias are then rounded to the scales dtype, and every reader
 * dequantizes with the stored values, in fp32: w = (float)q * s + b (a
 * product, then a sum: two roundings, never a fused multiply-add).
 */
#ifndef DG_QUANT_H
#define DG_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"
#include "base/weight.h" /* dg_weight, dg_dtype and the conversions */

/* 1 if bits is 2, 3, 4, 6 or 8 (MLX affine, mlx/backend/cpu/quantized.cpp:
 * _qmm_dispatch_typed); 5-bit MLX packing is not supported here. */
static inline int dg_quant_bits_ok(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 6 || bits == 8;
}
/* 1 if g is 32, 64 or 128 (MLX _qmm_dispatch_group). */
static inline int dg_quant_group_ok(int g) { return g == 32 || g == 64 || g == 128; }

/* Bytes of one packed row of `cols` codes (cols a multiple of 32). */
static inline int64_t dg_quant_row_bytes(int64_t cols, int bits) { return cols * bits / 8; }

/* Row r of the quantized matrix w ([rows, cols] codes, scales and biases
 * [rows, cols / group_size] of w->sb_dtype): its packed codes, its scales
 * and its biases. */
static inline void dg_quant_row_ptrs(const dg_weight *w, int64_t r, const uint8_t **codes, const char **scales,
                                     const char **biases) {
  const size_t sb = (size_t)(w->cols / w->group_size) * dg_dtype_size(w->sb_dtype);
  *codes = (const uint8_t *)w->data + (size_t)r * (size_t)dg_quant_row_bytes(w->cols, w->bits);
  *scales = (const char *)w->scales + (size_t)r * sb;
  *biases = (const char *)w->biases + (size_t)r * sb;
}

/* Code k of a packed row (the bit-stream rule above). */
static inline uint32_t dg_quant_code(const uint8_t *row, int bits, int64_t k) {
  int64_t bit = k * bits;
  const uint8_t *p = row + (bit >> 3);
  unsigned sh = (unsigned)(bit & 7);
  uint32_t v = p[0];
  if (sh + (unsigned)bits > 8) v |= (uint32_t)p[1] << 8;
  return (v >> sh) & ((1u << bits) - 1u);
}

/* The byte-shuffle and shift tables that unpack n codes (n b / 8 bytes, the first code at a byte boundary) of
 * width b in SIMD registers (cpu/matmul_avx2.c: n 8, cpu/matmul_avx512.c: n 16): code i (the bit-stream rule
 * above) lies in bytes floor(i b / 8) and the next one, shifted right by (i b) % 8, so ctrl[4 i .. 4 i + 3] (a
 * dword's bytes) take those two bytes (the second only if it is in the run), then zeros (-128, as a shuffle
 * reads it), and shift[i] = (i b) % 8; the unpacker masks the dword to b bits. */
static inline void dg_quant_unpack_tables(int b, int n, int8_t *ctrl, int32_t *shift) {
  for (int i = 0; i < n; i++) {
    int byte = i * b / 8;
    ctrl[4 * i] = (int8_t)byte;
    ctrl[4 * i + 1] = byte + 1 < n * b / 8 ? (int8_t)(byte + 1) : (int8_t)-128; /* -128: zero */
    ctrl[4 * i + 2] = ctrl[4 * i + 3] = (int8_t)-128;
    shift[i] = (i * b) % 8;
  }
}

/* Write code q (< 2^bits) at position k of a packed row whose bytes were
 * zeroed beforehand. */
static inline void dg_quant_put(uint8_t *row, int bits, int64_t k, uint32_t q) {
  int64_t bit = k * bits;
  uint8_t *p = row + (bit >> 3);
  unsigned sh = (unsigned)(bit & 7);
  uint32_t v = q << sh;
  p[0] |= (uint8_t)(v & 0xffu);
  if (sh + (unsigned)bits > 8) p[1] |= (uint8_t)(v >> 8);
}

/* Scale and bias of one group of n fp32 values for `bits`-bit codes, as MLX's
 * GPU kernel chooses them (ml-explore/mlx, mlx/backend/metal/kernels/
 * quantized.h: affine_quantize), in IEEE fp32:
 *   w_min = min(w), w_max = max(0, max(w))        (the kernel seeds w_max with 0)
 *   scale = max((w_max - w_min) / (2^bits - 1), 1e-7)
 *   side  = |w_min| > |w_max|;  scale = side ? scale : -scale
 *   edge  = side ? w_min : w_max                  (the larger-magnitude end)
 *   q0    = round(edge / scale)                   (half away from zero)
 *   if q0 != 0: scale = edge / q0, bias = edge;  else bias = 0
 * so the larger-magnitude end is code 0 and is exact, and the scale is usually
 * negative (when the maximum dominates). MLX's CPU `quantize` template
 * (mlx/backend/cpu/quantized.cpp) differs in two details: it rounds half to
 * even (rint) and seeds w_max with -inf; both only matter on exact ties and on
 * all-negative groups. */
void dg_quant_group_params(const float *w, int n, int bits, float *scale, float *bias);

/* Code of value w for an (fp32) scale and bias: clamp(round((w - bias) / scale),
 * 0, 2^bits - 1), round half away from zero (Metal's round). */
uint32_t dg_quant_code_of(float w, float scale, float bias, int bits);

/* Quantize one row of `cols` fp32 values (cols a multiple of group_size):
 * packed[cols*bits/8] (zeroed here), scales/biases[cols/group_size] stored in
 * sb_dtype (DG_BF16, DG_F16 or DG_F32). The row is always written; returns
 * the index of the first non-finite input value (the caller reports it), or
 * -1 if every value is finite. */
int64_t dg_quant_row(const float *w, int64_t cols, int bits, int group_size, dg_dtype sb_dtype, uint8_t *packed,
                     void *scales, void *biases);

/* Dequantize row r of a quantized weight into out[w->cols] (fp32), each value
 * (float)q * s + b with the stored s, b widened to fp32. */
void dg_quant_dequant_row(const dg_weight *w, int64_t r, float *out);

/* y[k] += a * w[r, k] for k in [0, cols), with w[r, k] dequantized exactly as
 * dg_quant_dequant_row does (used by the self-conditioning soft embedding,
 * spec 5, over a quantized tied embedding). Works for float weights too. */
void dg_weight_axpy_row(float *y, float a, const dg_weight *w, int64_t r);

/* Row r of any weight (float or quantized) widened to fp32: out[w->cols]. */
void dg_weight_row_f32(const dg_weight *w, int64_t r, float *out);

/* ---- the `quantization` block of config.json ---------------------------- */

typedef struct dg_quant_override {
  char *path;     /* module path, e.g. "model.decoder.embed_tokens" */
  int quantized;  /* 0: the block says `false` for this module */
  int bits, group_size;
} dg_quant_override;

typedef struct dg_quant_config {
  int present;               /* config.json has a quantization block */
  int bits, group_size;      /* defaults of the block */
  dg_quant_override *ov;     /* [n_ov] per-module entries */
  int n_ov;
} dg_quant_config;

/* Read the top-level "quantization" object of config.json at `path` (or, when
 * absent, "quantization_config", then text_config's): "bits", "group_size",
 * "mode" (must be "affine" when given) and per-module entries keyed by module
 * path whose value is an object {"bits", "group_size"} or false (mlx-lm
 * mlx_lm/utils.py: quantize_model writes them, load_model's class_predicate
 * reads them). Unknown non-object keys are ignored. No block: *qc zeroed,
 * present = 0. Errors: DG_ERR_NOT_FOUND, DG_ERR_IO, DG_ERR_JSON,
 * DG_ERR_CONFIG (naming the key and the value: unsupported bits, group size or
 * mode, a wrong type). Free with dg_quant_config_free. */
dg_status dg_quant_config_load(const char *path, dg_quant_config *qc);
/* The same from the text of a config.json (len bytes, need not be
 * NUL-terminated); `path` stands for the file in messages. Errors: as
 * dg_quant_config_load without DG_ERR_NOT_FOUND and DG_ERR_IO. */
dg_status dg_quant_config_parse(const char *path, const char *text, size_t len, dg_quant_config *qc);
void dg_quant_config_free(dg_quant_config *qc);

/* Bits and group size for module `path`: the override if there is one, else
 * the defaults. Returns 0 if the block marks the module `false`, 1 otherwise. */
int dg_quant_config_lookup(const dg_quant_config *qc, const char *path, int *bits, int *group_size);

/* The MLX "quantization" block of config.json (spec 3.2; mlx-lm's
 * `quantization` / `quantization_config`): {"group_size": G, "bits": B,
 * "mode": "affine"} plus, for every quantized module whose format differs
 * from (B, G), "module.path": {"group_size", "bits"}. item(items, i, &bits,
 * &group_size) returns module i's path and format (bits 0: a float module,
 * not listed), for i < n. Added to cfg under both keys, as mlx-lm writes
 * them. Returns 0, or -1 when out of memory. Used by dg_quantize and
 * dg_mkrandom so that both write the same block. */
struct cJSON;
typedef const char *(*dg_quant_module_fn)(const void *items, size_t i, int *bits, int *group_size);
int dg_quant_config_block(struct cJSON *cfg, int bits, int group_size, const void *items, size_t n,
                          dg_quant_module_fn item);

#endif
