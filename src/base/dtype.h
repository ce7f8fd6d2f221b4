/* dtype.h: the ground floor. Element types (spelled as in safetensors
 * headers) and the bf16 / f16 <-> f32 conversions, used by every other part
 * of the engine (loader, kernels, quantization, CUDA upload). It includes
 * only the C library and can be included from C and C++ (nvcc) alike; the
 * functions are defined in dtype.c.
 *
 * Conversions round to nearest even and keep NaN a (quiet) NaN, as PyTorch's
 * .to(torch.bfloat16) / .to(torch.float16) do. */
#ifndef DG_DTYPE_H
#define DG_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, spelled as in safetensors headers by dg_dtype_name. */
typedef enum dg_dtype {
  DG_F32, DG_F16, DG_BF16, DG_F64,
  DG_I64, DG_I32, DG_I16, DG_I8,
  DG_U8, DG_U16, DG_U32, DG_U64,
  DG_BOOL,
  DG_DTYPE_COUNT
} dg_dtype;

/* Bytes per element (BOOL is 1 byte); 0 for a value outside [0, DG_DTYPE_COUNT). */
size_t dg_dtype_size(dg_dtype t);
/* The safetensors spelling ("F32", "BF16", "BOOL", ...); "?" for a value
 * outside [0, DG_DTYPE_COUNT). Never NULL. */
const char *dg_dtype_name(dg_dtype t);
/* Parse a safetensors dtype string (case-sensitive, exactly as written by the
 * reference library). Returns 1 and sets *out if known, 0 otherwise (*out
 * untouched; no error is recorded). */
int dg_dtype_parse(const char *s, dg_dtype *out);

/* bf16 and f16 <-> f32 (round to nearest even; NaN preserved). f16
 * overflow rounds to +-Inf past 65504; f16 subnormals are exact. */
static inline float dg_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t dg_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float dg_f16_to_f32(uint16_t h);
uint16_t dg_f32_to_f16(float f);

/* Element i of a row-major typed vector as fp32 (slow path helper): BF16, F16,
 * else read as F32. */
static inline float dg_load_elem(dg_dtype t, const void *p, int64_t i) {
  switch (t) {
  case DG_BF16: { uint16_t h; memcpy(&h, (const char *)p + 2 * i, 2); return dg_bf16_to_f32(h); }
  case DG_F16: { uint16_t h; memcpy(&h, (const char *)p + 2 * i, 2); return dg_f16_to_f32(h); }
  default: { float f; memcpy(&f, (const char *)p + 4 * i, 4); return f; }
  }
}

#ifdef __cplusplus
}
#endif

#endif
