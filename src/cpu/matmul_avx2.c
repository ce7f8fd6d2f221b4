/* matmul_avx2.c: y = x · Wᵀ with AVX2 + FMA + F16C (compiled with -mavx2
 * -mfma -mf16c, selected at run time). The 4x4 register tiles of
 * matmul_tiles.h (shared with the AVX-512 kernel) on 8 lanes; K tails, and
 * the last partial block of columns of the product over W's rows, fall back
 * to scalar loops (AVX2 has no masked 16-bit loads, so VMASKED is 0 and the
 * mask arguments below are ignored).
 *
 * MLX affine-quantized weights (quant.h) use the same tiles: 8 codes are
 * unpacked to fp32 lanes and dequantized with a separate multiply and add
 * (w = q*s + b, two roundings, bit-identical to dg_quant_dequant_row), then
 * multiplied into the accumulators. K is a multiple of the group size (>= 32),
 * so quantized rows have no K tail. */
#include <immintrin.h>

#include "cpu/kernels.h"
#include "io/quant.h"

/* ---- the instruction set, as matmul_tiles.h asks for it -------------------- */
#define VF __m256
#define VL 8
#define VMASK int
#define VMASKED 0
static inline VMASK vmask(int64_t n) { return 0; }
#define VZERO() _mm256_setzero_ps()
#define VSET1(f) _mm256_set1_ps(f)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VLOADM(m, p) ((void)(m), _mm256_loadu_ps(p))
#define VSTOREM(p, m, v) ((void)(m), _mm256_storeu_ps(p, v))
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VFMADD(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VHSUM(v) hsum8(v)

static inline __m256 load_w(dg_dtype dt, const char *row, int64_t k, VMASK m) {
  switch (dt) {
  case DG_BF16: {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  case DG_F16:
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
  default:
    return _mm256_loadu_ps((const float *)row + k);
  }
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

/* Unpacking 8 codes (k % 8 == 0) of a packed row, any width b: the codes
 * are b bytes at byte k*b/8 and code i sits at bit i*b of that little-endian
 * stream (quant.h), in bytes floor(i*b/8) and the next one, shifted right by
 * (i*b) % 8. Load the b bytes, broadcast them to both 128-bit lanes, one
 * in-lane byte shuffle putting code i's two bytes into dword i, one variable
 * shift, one mask. */
typedef struct qunpack { __m256i ctrl, shift, mask; } qunpack;

static inline qunpack qunpack_for(int b) {
  int8_t ctrl[32];
  int32_t shift[8];
  dg_quant_unpack_tables(b, 8, ctrl, shift);
  qunpack u;
  u.ctrl = _mm256_loadu_si256((const __m256i *)ctrl);
  u.shift = _mm256_loadu_si256((const __m256i *)shift);
  u.mask = _mm256_set1_epi32((1 << b) - 1);
  return u;
}

static inline __attribute__((always_inline)) __m256 qcodes(const uint8_t *p, const int bits, const qunpack *u) {
  if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
  /* the b bytes as one integer, built from whole-register loads (a memcpy of
   * 3 or 6 bytes into a stack word stalls on store forwarding) */
  uint64_t w;
  uint16_t h;
  uint32_t d;
  if (bits == 2) { memcpy(&h, p, 2); w = h; }
  else if (bits == 3) { memcpy(&h, p, 2); w = h | (uint64_t)p[2] << 16; }
  else if (bits == 4) { memcpy(&d, p, 4); w = d; }
  else { memcpy(&d, p, 4); memcpy(&h, p + 4, 2); w = d | (uint64_t)h << 32; } /* 6 */
  __m256i v = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)w));
  v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, u->ctrl), u->shift), u->mask);
  return _mm256_cvtepi32_ps(v);
}

#include "matmul_tiles.h"

#include "matmul_driver.h"

static const dg_kernels AVX2 = {"avx2", matmul_driver, matmul_grouped_driver, matmul_rows_driver, NULL};
const dg_kernels *dg_kernels_avx2_impl(void) { return &AVX2; }
