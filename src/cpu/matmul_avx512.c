/* matmul_avx512.c: y = x · Wᵀ with AVX-512 (compiled with -mavx512f/bw/vl/dq,
 * selected at run time by dispatch.c).
 *
 * Register tile (matmul_tiles.h, shared with the AVX2 kernel): 4 weight rows x
 * 4 activation rows = 16 zmm accumulators of 16 lanes; each weight vector is
 * widened once (bf16: shift, f16: vcvtph2ps) and used for 4 activation rows.
 * K tails, and the last partial block of columns of the product over W's
 * rows, use masked loads (VMASKED 1). The lane sums are reduced at the end,
 * so the summation order differs from the oracle; the tolerance in
 * tests/test_kernels.c is derived for that.
 *
 * MLX affine-quantized weights (quant.h): 16 codes are unpacked to fp32
 * lanes and dequantized with a separate multiply and add (w = q*s + b,
 * bit-identical to dg_quant_dequant_row), then used like widened bf16
 * weights. K is a multiple of the group size (>= 32): no masks needed. */
#include <immintrin.h>

#include "cpu/kernels.h"
#include "io/quant.h"

/* ---- the instruction set, as matmul_tiles.h asks for it -------------------- */
#define VF __m512
#define VL 16
#define VMASK __mmask16
#define VMASKED 1
static inline VMASK vmask(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}
#define VZERO() _mm512_setzero_ps()
#define VSET1(f) _mm512_set1_ps(f)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VLOADM(m, p) _mm512_maskz_loadu_ps(m, p)
#define VSTOREM(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VFMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VHSUM(v) _mm512_reduce_add_ps(v)

static inline __m512 load_w(dg_dtype dt, const char *row, int64_t k, VMASK m) {
  switch (dt) {
  case DG_BF16: {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  case DG_F16: {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    return _mm512_cvtph_ps(h);
  }
  default:
    return _mm512_maskz_loadu_ps(m, (const float *)row + k);
  }
}

/* Unpacking 16 codes (k % 16 == 0) of a packed row, any width b: the codes
 * are 2b bytes at byte k*b/8 and code i sits at bit i*b of that
 * little-endian stream (quant.h), so it lies in bytes floor(i*b/8) and the
 * next one, shifted right by (i*b) % 8. One byte-masked load of the 2b bytes,
 * broadcast to the four 128-bit lanes, one in-lane byte shuffle putting code
 * i's two bytes into dword i, one variable shift, one mask. */
typedef struct qunpack { __m512i ctrl, shift, mask; __mmask16 load; } qunpack;

static inline qunpack qunpack_for(int b) {
  int8_t ctrl[64];
  int32_t shift[16];
  dg_quant_unpack_tables(b, 16, ctrl, shift);
  qunpack u;
  u.ctrl = _mm512_loadu_si512(ctrl);
  u.shift = _mm512_loadu_si512(shift);
  u.mask = _mm512_set1_epi32((1 << b) - 1);
  u.load = (__mmask16)((1u << (2 * b)) - 1u);
  return u;
}

static inline __attribute__((always_inline)) __m512 qcodes(const uint8_t *p, const int bits, const qunpack *u) {
  if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
  __m512i v = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(u->load, p));
  v = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(v, u->ctrl), u->shift), u->mask);
  return _mm512_cvtepi32_ps(v);
}

#include "matmul_tiles.h"

#include "matmul_driver.h"

static const dg_kernels AVX512 = {"avx512", matmul_driver, matmul_grouped_driver, matmul_rows_driver, dg_attn_block_avx512};
const dg_kernels *dg_kernels_avx512_impl(void) { return &AVX512; }
