/* cuda_bf16.h (dev/cuda_emu): bf16 and f16 storage types with round-to-nearest-even conversions. */
#ifndef DG_EMU_CUDA_BF16_H
#define DG_EMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 { uint16_t x; };
struct __half { uint16_t x; };

static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) { r.x = (uint16_t)((u >> 16) | 0x40); return r; }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.x = (uint16_t)(u >> 16);
  return r;
}
/* f16 via the host's _Float16 (IEEE binary16, round to nearest even) */
static inline __half __float2half_rn(float f) {
  _Float16 h = (_Float16)f;
  __half r;
  memcpy(&r.x, &h, 2);
  return r;
}
static inline float __half2float(__half h) {
  _Float16 v;
  memcpy(&v, &h.x, 2);
  return (float)v;
}
#endif
