/* dtype.c: element types and the f16 conversions (dtype.h). */
#include "base/dtype.h"

#include <math.h>

static const struct { const char *name; size_t size; } dtype_info[DG_DTYPE_COUNT] = {
  [DG_F32] = {"F32", 4},  [DG_F16] = {"F16", 2},  [DG_BF16] = {"BF16", 2},
  [DG_F64] = {"F64", 8},  [DG_I64] = {"I64", 8},  [DG_I32] = {"I32", 4},
  [DG_I16] = {"I16", 2},  [DG_I8] = {"I8", 1},    [DG_U8] = {"U8", 1},
  [DG_U16] = {"U16", 2},  [DG_U32] = {"U32", 4},  [DG_U64] = {"U64", 8},
  [DG_BOOL] = {"BOOL", 1},
};

size_t dg_dtype_size(dg_dtype t) {
  return ((unsigned)t < DG_DTYPE_COUNT) ? dtype_info[t].size : 0;
}

const char *dg_dtype_name(dg_dtype t) {
  return ((unsigned)t < DG_DTYPE_COUNT) ? dtype_info[t].name : "?";
}

int dg_dtype_parse(const char *s, dg_dtype *out) {
  if (!s) return 0;
  for (int i = 0; i < DG_DTYPE_COUNT; i++) {
    if (strcmp(s, dtype_info[i].name) == 0) {
      *out = (dg_dtype)i;
      return 1;
    }
  }
  return 0;
}

/* ---- f16 <-> f32 ------------------------------------------------------------ */

float dg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal: renormalize */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dg_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* overflow -> Inf (rounds past 65504) */
  if (a < 0x38800000u) {                                       /* f16 subnormal or zero */
    float af;
    memcpy(&af, &a, 4);
    /* scale to units of 2^-24 and round to nearest even */
    float s = af * 16777216.0f;
    uint32_t m = (uint32_t)nearbyintf(s);
    return (uint16_t)(sign | m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - ((uint32_t)(127 - 15) << 23);
  return (uint16_t)(sign | (r >> 13));
}
