/* mkrandom.h: the random draws behind dg_mkrandom (dgemma mkrandom), exposed
 * so that tests can recompute any weight of a written checkpoint.
 *
 * Every weight of tensor NAME is addressed by its flat element index e in the
 * tensor's row-major [.., rows, cols] layout (the Hugging Face float shape,
 * before any quantization). Its value is drawn from Philox4x32-10 (src/base/rng.c)
 * with key = seed and counter {e/4, h_lo, h_hi, DG_RNG_INIT}, where
 * h = dg_mkrandom_name_hash(NAME) (the HF name: experts.gate_up_proj, never
 * the MLX ".weight" spelling, so the values do not depend on the recipe).
 * One Philox block gives four 32-bit words r0..r3 and four normals by the
 * Box-Muller transform (Box & Muller, Ann. Math. Statist. 29(2), 1958):
 *   u1 = (r0 + 0.5) / 2^32,  u2 = r1 / 2^32 (same for r2, r3)
 *   z[4k+0] = sqrt(-2 ln u1) cos(2 pi u2),  z[4k+1] = sqrt(-2 ln u1) sin(2 pi u2)
 * in double precision, then w = (float)(std * z), rounded to bf16 for
 * storage (and the bf16 value is what a quantized tensor quantizes).
 */
#ifndef DG_MKRANDOM_H
#define DG_MKRANDOM_H

#include <stddef.h>
#include <stdint.h>

/* 64-bit FNV-1a of a tensor name (the draw's address, see above). */
uint64_t dg_mkrandom_name_hash(const char *name);

/* out[i] = std * z[first + i] for i in [0, n): the fp32 draws of the tensor
 * with name hash `h` (before bf16 rounding). first + n must not exceed
 * 2^34 (the 32-bit block counter). */
void dg_mkrandom_normals(uint64_t seed, uint64_t h, uint64_t first, size_t n, float std, float *out);

#endif
