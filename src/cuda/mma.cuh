/* mma.cuh: the warp-level tensor-core product and the asynchronous copies of
 * the quantized MoE kernels (qmoe.cu), with CPU-emulation equivalents so that
 * dev/cuda_emu runs the same kernels with the same fragment layouts.
 *
 *   dg_mma_bf16      D += A B, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *                    (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
 *                    point type"): lane l, g = l / 4, t = l % 4 holds
 *                      A: a[0] = (A[g][2t], A[g][2t+1]), a[1] = rows g+8,
 *                         a[2] = (A[g][2t+8], A[g][2t+9]), a[3] = rows g+8;
 *                      B: b[0] = (B[2t][g], B[2t+1][g]), b[1] = (B[2t+8][g], B[2t+9][g]);
 *                      C, D: d[0], d[1] = (C[g][2t], C[g][2t+1]), d[2], d[3] = rows g+8;
 *                    bf16 pairs with the lower column (row for B) in the low half.
 *   dg_cp_async{4,8,16}  cp.async.{ca,cg}.shared.global of 4/8/16 bytes; the 16-byte
 *                    one with a source size (0: the destination is zero-filled)
 *   dg_cp_commit, dg_cp_wait<N>  cp.async.commit_group / wait_group N
 *   dg_lds16, dg_lds8f  ld.shared of 16 bytes (4 words) / 8 bytes (2 floats) at a dg_sptr address
 *   dg_ldsm_x4, dg_ldsm_x4_t  ldmatrix.sync.aligned.m8n8.x4.shared.b16 (and .trans):
 *                    lane 8m + i gives the address of row i of 8x8 matrix m (16
 *                    contiguous bytes); register m of lane l receives matrix m's
 *                    (row l / 4, columns 2 (l % 4), +1), or with .trans its
 *                    (rows 2 (l % 4), +1, column l / 4), lower index in the low half
 *   dg_prmt          __byte_perm
 *   dg_and_or        (a & b) | c, one lop3
 *   dg_bf16x2_fma    a b + c per bf16 half, rounded once to bf16 (fma.rn.bf16x2) */
#ifndef DG_CUDA_MMA_CUH
#define DG_CUDA_MMA_CUH

#include <stdint.h>
#include "cuda/common.cuh" /* bf16 (group_sum_perm) */

#ifndef DG_CUDA_EMU

__device__ __forceinline__ void dg_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t dg_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void dg_cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dg_smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void dg_cp_async8(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dg_smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void dg_cp_async4(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dg_smem_addr(dst)), "l"(src));
}
/* The same with the destination as a shared-memory address (dg_sptr, computed once: no generic-to-shared
 * conversion per copy); src_bytes 0 zero-fills the destination without reading src. */
typedef uint32_t dg_sptr;
__device__ __forceinline__ dg_sptr dg_sp(const void *p) { return dg_smem_addr(p); }
__device__ __forceinline__ void dg_cp_async16_sp(dg_sptr dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void dg_cp_async4_sp(dg_sptr dst, const void *src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
/* The same copies of whole pieces (no source size: no zero-fill, fewer instructions per copy). */
__device__ __forceinline__ void dg_cp_async16_nz(dg_sptr dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void dg_cp_async4_nz(dg_sptr dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
/* Shared-memory loads from a dg_sptr address: 16 bytes, and 8 bytes as two floats (volatile: never moved across
 * a barrier or a cp.async wait). */
__device__ __forceinline__ uint4 dg_lds16(dg_sptr a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ float2 dg_lds8f(dg_sptr a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ void dg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void dg_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void dg_ldsm_x4(uint32_t r[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(dg_smem_addr(row)));
}
__device__ __forceinline__ void dg_ldsm_x4_t(uint32_t r[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(dg_smem_addr(row)));
}

__device__ __forceinline__ uint32_t dg_prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
__device__ __forceinline__ uint32_t dg_funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
  return __funnelshift_r(lo, hi, sh);
}

/* (a & b) | c in one LOP3 (b and c in registers: the compiler's own LOP3 takes
 * one immediate, so a mask and a magic constant cost two instructions). */
__device__ __forceinline__ uint32_t dg_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
/* a b + c of each bf16 half (low with low, high with high), computed exactly and rounded once to the nearest
 * bf16, ties to even (PTX ISA: fma.rn.bf16x2). */
__device__ __forceinline__ uint32_t dg_bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}


#else /* the CPU emulation (dev/cuda_emu): same semantics, one lane at a time */

#include <cmath>
#include <cstring>

static inline float dg_emu_bf16_lo(uint32_t v) { uint32_t u = v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float dg_emu_bf16_hi(uint32_t v) { uint32_t u = v & 0xffff0000u; float f; memcpy(&f, &u, 4); return f; }

/* Every lane publishes its fragments to the warp (32 exchanges), then computes its own D elements. */
static inline void dg_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  struct frag { uint32_t a[4], b[2]; } mine = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  emu::warp_gather(&mine, all, (int)sizeof mine);
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l >> 2, t = l & 3;
    const frag &f = all[l];
    A[g][2 * t] = dg_emu_bf16_lo(f.a[0]); A[g][2 * t + 1] = dg_emu_bf16_hi(f.a[0]);
    A[g + 8][2 * t] = dg_emu_bf16_lo(f.a[1]); A[g + 8][2 * t + 1] = dg_emu_bf16_hi(f.a[1]);
    A[g][2 * t + 8] = dg_emu_bf16_lo(f.a[2]); A[g][2 * t + 9] = dg_emu_bf16_hi(f.a[2]);
    A[g + 8][2 * t + 8] = dg_emu_bf16_lo(f.a[3]); A[g + 8][2 * t + 9] = dg_emu_bf16_hi(f.a[3]);
    B[2 * t][g] = dg_emu_bf16_lo(f.b[0]); B[2 * t + 1][g] = dg_emu_bf16_hi(f.b[0]);
    B[2 * t + 8][g] = dg_emu_bf16_lo(f.b[1]); B[2 * t + 9][g] = dg_emu_bf16_hi(f.b[1]);
  }
  const int l = emu::lane(), g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; i++) {
    const int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
    float s = d[i];
    for (int k = 0; k < 16; k++) s += A[r][k] * B[k][c];
    d[i] = s;
  }
}

static inline void dg_cp_async16(void *dst, const void *src, int src_bytes) {
  if (src_bytes) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
static inline void dg_cp_async8(void *dst, const void *src) { memcpy(dst, src, 8); }
static inline void dg_cp_async4(void *dst, const void *src) { memcpy(dst, src, 4); }
typedef unsigned char *dg_sptr;
static inline dg_sptr dg_sp(const void *p) { return (dg_sptr)p; }
static inline void dg_cp_async16_sp(dg_sptr dst, const void *src, int src_bytes) {
  if (src_bytes) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
static inline void dg_cp_async4_sp(dg_sptr dst, const void *src, int src_bytes) {
  if (src_bytes) memcpy(dst, src, 4); else memset(dst, 0, 4);
}
static inline void dg_cp_async16_nz(dg_sptr dst, const void *src) { memcpy((void *)dst, src, 16); }
static inline void dg_cp_async4_nz(dg_sptr dst, const void *src) { memcpy((void *)dst, src, 4); }
static inline uint4 dg_lds16(dg_sptr a) { uint4 v; memcpy(&v, a, 16); return v; }
static inline float2 dg_lds8f(dg_sptr a) { float2 v; memcpy(&v, a, 8); return v; }
static inline void dg_cp_commit() {}
template <int N> static inline void dg_cp_wait() {}

/* Every lane publishes its row address; each then reads its own elements. */
static inline void dg_emu_ldsm(uint32_t r[4], const void *row, int trans) {
  const uint16_t *mine = (const uint16_t *)row, *all[32];
  emu::warp_gather(&mine, all, (int)sizeof mine);
  const int l = emu::lane();
  for (int m = 0; m < 4; m++) {
    uint16_t lo, hi;
    if (trans) {
      lo = all[8 * m + 2 * (l & 3)][l >> 2];
      hi = all[8 * m + 2 * (l & 3) + 1][l >> 2];
    } else {
      lo = all[8 * m + (l >> 2)][2 * (l & 3)];
      hi = all[8 * m + (l >> 2)][2 * (l & 3) + 1];
    }
    r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
}
static inline void dg_ldsm_x4(uint32_t r[4], const void *row) { dg_emu_ldsm(r, row, 0); }
static inline void dg_ldsm_x4_t(uint32_t r[4], const void *row) { dg_emu_ldsm(r, row, 1); }

static inline uint32_t dg_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t v = (uint64_t)a | ((uint64_t)b << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
static inline uint32_t dg_funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
  return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline uint32_t dg_and_or(uint32_t a, uint32_t b, uint32_t c) { return (a & b) | c; }
/* One half of fma.rn.bf16x2: a b is exact in double (8-bit significands), a b + c too for the operands the
 * kernels pass (exponents within 29 of each other: codes, scales and biases); rounded once to bf16, nearest even. */
static inline uint16_t dg_emu_bf16_fma1(uint16_t a, uint16_t b, uint16_t c) {
  const double r = (double)dg_emu_bf16_lo(a) * dg_emu_bf16_lo(b) + dg_emu_bf16_lo(c);
  if (r == 0.0 || !std::isfinite(r)) { float f = (float)r; uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }
  int ex;
  (void)frexp(r, &ex);                          /* r = m 2^ex, 0.5 <= |m| < 1 */
  const double q = nearbyint(ldexp(r, 8 - ex)); /* 8 significant bits, nearest even (the default mode) */
  const float f = (float)ldexp(q, ex - 8);      /* exact in float (normal range) */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static inline uint32_t dg_bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  return (uint32_t)dg_emu_bf16_fma1((uint16_t)a, (uint16_t)b, (uint16_t)c) |
         ((uint32_t)dg_emu_bf16_fma1((uint16_t)(a >> 16), (uint16_t)(b >> 16), (uint16_t)(c >> 16)) << 16);
}
#endif

/* One group of G values at p (bf16, 16-byte aligned, G % 8 == 0): their fp32 sum in column order, and the group
 * copied to q with each run of 8 permuted to (x0, x4, x1, x5, x2, x6, x3, x7) (qr_kernel's fragment order): the
 * group sums and permuted copy of k_group_sums_perm (qmoe.cu) and of route_gr_kernel's gate/up input (moe.cu). */
__device__ __forceinline__ float group_sum_perm(const bf16 *p, bf16 *q, int G) {
  float s = 0.0f;
  for (int k = 0; k < G; k += 8) {
    const uint4 v = *(const uint4 *)(p + k);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 8; i++) s += __uint_as_float((i & 1 ? w[i >> 1] & 0xffff0000u : w[i >> 1] << 16));
    uint4 o;
    o.x = dg_prmt(v.x, v.z, 0x5410u); /* (x0, x4) */
    o.y = dg_prmt(v.x, v.z, 0x7632u); /* (x1, x5) */
    o.z = dg_prmt(v.y, v.w, 0x5410u); /* (x2, x6) */
    o.w = dg_prmt(v.y, v.w, 0x7632u); /* (x3, x7) */
    *(uint4 *)(q + k) = o;
  }
  return s;
}

/* group_sum_perm for G = 8 NV (a compile-time group), every load of the group issued before the first store
 * (session 22, issue 12): group_sum_perm's loop stores run k before loading run k + 8, and as q may alias p the
 * compiler keeps that order, so a group costs G / 8 global-load latencies one after another (8 at G 64: most of
 * k_group_sums_perm's 5-7 us per 26B layer on the H200). The same additions in the same order (the sum over the
 * runs in column order, one fp32 chain), the same permutation: every output word equal to group_sum_perm's. */
template <int NV> __device__ __forceinline__ float group_sum_perm_lf(const bf16 *p, bf16 *q) {
  uint4 v[NV];
#pragma unroll
  for (int k = 0; k < NV; k++) v[k] = *(const uint4 *)(p + 8 * k);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
    for (int i = 0; i < 8; i++) s += __uint_as_float((i & 1 ? w[i >> 1] & 0xffff0000u : w[i >> 1] << 16));
  }
#pragma unroll
  for (int k = 0; k < NV; k++) {
    uint4 o;
    o.x = dg_prmt(v[k].x, v[k].z, 0x5410u);
    o.y = dg_prmt(v[k].x, v[k].z, 0x7632u);
    o.z = dg_prmt(v[k].y, v[k].w, 0x5410u);
    o.w = dg_prmt(v[k].y, v[k].w, 0x7632u);
    *(uint4 *)(q + 8 * k) = o;
  }
  return s;
}

/* group_sum_perm_lf where G is 32, 64 or 128 (the lane records' groups), else group_sum_perm: the same words. */
__device__ __forceinline__ float group_sum_perm_any(const bf16 *p, bf16 *q, int G) {
  return G == 64 ? group_sum_perm_lf<8>(p, q) : G == 32 ? group_sum_perm_lf<4>(p, q)
         : G == 128 ? group_sum_perm_lf<16>(p, q) : group_sum_perm(p, q, G);
}

#endif
