/* mma.h (dev/cuda_emu): nvcuda::wmma for 16x16x16 tiles; every lane holds the whole tile. */
#ifndef DG_EMU_MMA_H
#define DG_EMU_MMA_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  float v[16][16];
};

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float x) {
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) f.v[i][j] = x;
}
/* the CUDA requirements: 256-bit aligned pointer; ldm a multiple of 16 bytes */
inline void check(const void *p, unsigned ldm, unsigned esize) {
  if ((uintptr_t)p % 32 || (ldm * esize) % 16) {
    fprintf(stderr, "emu: wmma pointer %p / ldm %u violates the 32-byte / 16-byte rules\n", p, ldm);
    abort();
  }
}
inline float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
inline float ld(const float *p) { return *p; }

/* a: element (r, k); row_major: p[r*ldm + k], col_major: p[k*ldm + r] */
template <int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<matrix_a, M, N, K, T, L> &f, const P *p, unsigned ldm) {
  check(p, ldm, sizeof(P));
  for (int r = 0; r < 16; r++)
    for (int k = 0; k < 16; k++) f.v[r][k] = std::is_same<L, row_major>::value ? ld(p + r * ldm + k) : ld(p + k * ldm + r);
}
/* b: element (k, n); row_major: p[k*ldm + n], col_major: p[n*ldm + k] */
template <int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<matrix_b, M, N, K, T, L> &f, const P *p, unsigned ldm) {
  check(p, ldm, sizeof(P));
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) f.v[k][n] = std::is_same<L, row_major>::value ? ld(p + k * ldm + n) : ld(p + n * ldm + k);
}
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c) {
  float t[16][16];
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) {
      float s = c.v[r][n];
      for (int k = 0; k < 16; k++) s += a.v[r][k] * b.v[k][n];
      t[r][n] = s;
    }
  memcpy(d.v, t, sizeof t);
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t l) {
  check(p, ldm, 4);
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) (l == mem_row_major ? p[r * ldm + n] : p[n * ldm + r]) = f.v[r][n];
}
}  // namespace wmma
}  // namespace nvcuda
#endif
