/* kernels.cu: the CUDA kernels of the forward pass and the sampler, except
 * the MoE (moe.cu) and attention (attention.cu). One block per token row for
 * the fused norm kernels, the row held in registers as float4s (the row
 * kernels' comment); one warp per (token, head) for q/k/v post-processing;
 * blocks of 8192 logits for the per-position passes over the vocabulary
 * (sampler statistics, self-conditioning probabilities), their partials
 * combined in a fixed order. fp32 arithmetic everywhere; bf16 only where a
 * value feeds a matrix product or the KV cache (as the bf16 reference does).
 * dev/cuda/step_kernels.cu times the earlier versions against these.
 *
 * Math: spec sections 4.1 (RMSNorm, GeGLU, softcap), 4.3 (rope), 4.4-4.5
 * (layer, masks), 4.6 (router is in moe.cu), 5 and 4.9 (self-conditioning
 * casts), 6.1 (sampler statistics), src/base/rng.c (Philox4x32-10). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>

#include "backend/switches.h"
#include "cuda/kernels.cuh"

#define NT 256 /* threads of the row kernels */

/* Every kernel launched with programmatic dependent launch (common.cuh, DG_LAUNCH) unless DGEMMA_PDL=0; read once
 * when the library loads. On by default since session 8's H200 run: test_cuda passed with and without, and the vllm
 * protocol went 1,110.4 -> 1,160.8 tok/s (docs/measurements.md). */
static int pdl_from_env(void) { return dg_sw_get(DG_SW_PDL) != 0; } /* backend/switches.c */
int dg_cuda_pdl = pdl_from_env();

/* DGEMMA_INITCHECK=1 (read once when the library loads; unset or 0: off): every cuBLAS product's output
 * is cleared (cudaMemset2DAsync) before the product writes it. For compute-sanitizer's initcheck only, which does not
 * see the stores of cuBLAS's nvjet kernels (session 19, dev/cuda/initcheck_gemm.cu: every element of a correct product
 * reported unwritten) and so reports every later read of a product as uninitialized. With the clear, a read initcheck
 * reports is one of memory nothing wrote; an element cuBLAS failed to write would read 0, which the tests' comparisons
 * with the CPU catch. No effect on any output. */
static int initcheck_from_env(void) { return dg_sw_get(DG_SW_INITCHECK) == 1; }
int dg_cuda_initcheck = initcheck_from_env();

/* ---- reductions ---------------------------------------------------------- */

/* Sum of squares of x[0..n) over the block. */
__device__ float block_sumsq(const float *x, int n, float *sh) {
  float s = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += x[j] * x[j];
  return block_sum(s, sh);
}

/* (mean(x^2) + eps)^-1/2 from a sum of squares (spec 4.1). */
__device__ __forceinline__ float rms_scale(float ss, int n, float eps) { return rsqrtf(ss / (float)n + eps); }

__device__ __forceinline__ float gelu_tanh(float a) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* ---- embedding, norms, elementwise --------------------------------------- */

__global__ void embed_kernel(float *x, const bf16 *E, const int32_t *ids, int H, float scale) {
  DG_PDL_ENTRY();
  const int t = blockIdx.x;
  const bf16 *row = E + (size_t)ids[t] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) x[(size_t)t * H + j] = __bfloat162float(row[j]) * scale;
}

cudaError_t k_embed(cudaStream_t s, float *x, const dg_cuda_w *E, const int32_t *ids, int T, int H, float scale) {
  if (E->bits) return k_qembed(s, x, E, ids, T, scale);
  DG_LAUNCH(embed_kernel, T, NT, 0, s)(x, E->w, ids, H, scale);
  return cudaGetLastError();
}

__global__ void rmsnorm_kernel(const float *x, const float *w, float *yf, bf16 *yb, int H, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[32];
  const size_t t = blockIdx.x;
  const float *xr = x + t * H;
  const float r = rms_scale(block_sumsq(xr, H, sh), H, eps);
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float y = xr[j] * r;
    if (w) y *= w[j];
    if (yb) yb[t * H + j] = __float2bfloat16_rn(y);
    if (yf) yf[t * H + j] = y;
  }
}

/* ---- the row kernels in registers (issue 12) --------------------------------
 * One block of RNT threads per token row of H fp32 (H % 4 == 0): thread i
 * holds the float4s i, i + RNT, ... of the row (F4 of them), every load of the
 * row and of its weight vectors issued before the first reduction; each
 * reduction is a warp xor tree plus one barrier (each call site its own shared
 * slots, so no barrier guards their reuse), every thread folding the warp
 * results in warp order. The per-element arithmetic is the loop kernels'
 * expression for expression; the sums of squares are in another order than
 * theirs (fp32, last bits of the RMS scale), which the tests' bounds against
 * the CPU (tests/test_cuda.c: normwise logits within max(e_formula, 3 e_sim))
 * cover, as they cover the CPU's own order. The loop kernels above remain for
 * H % 4 != 0 or rows longer than 8 float4s per thread, and as version 1 of
 * the launchers (dev/cuda/step_kernels.cu). */
#define RNT 256

template <int NTR> __device__ __forceinline__ float rsum(float v, float *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
#pragma unroll
  for (int w = 1; w < NTR / 32; w++) v += sh[w];
  return v;
}

/* Two sums at one barrier (sh: 2 * NTR / 32 slots). */
template <int NTR> __device__ __forceinline__ void rsum2(float &a, float &b, float *sh) {
  for (int o = 16; o; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if ((threadIdx.x & 31) == 0) { sh[threadIdx.x >> 5] = a; sh[NTR / 32 + (threadIdx.x >> 5)] = b; }
  __syncthreads();
  a = sh[0]; b = sh[NTR / 32];
#pragma unroll
  for (int w = 1; w < NTR / 32; w++) { a += sh[w]; b += sh[NTR / 32 + w]; }
}

__device__ __forceinline__ float4 ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ void st4(float *p, float4 v) { *(float4 *)p = v; }
__device__ __forceinline__ float4 zero4() { float4 z; z.x = z.y = z.z = z.w = 0.0f; return z; }
__device__ __forceinline__ float sq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
/* A register row (the row kernels): v[k] = float4 number threadIdx.x + NTR * k of the row at p, zeros past its
 * H4 float4s. */
template <int NTR, int F4>
__device__ __forceinline__ void ld_row4(float4 (&v)[F4], const float *p, int H4) {
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    v[k] = f < H4 ? ld4(p + 4 * f) : zero4();
  }
}
/* 4 bf16 in one 8-byte store (p 8-byte aligned) */
__device__ __forceinline__ void stb4(bf16 *p, float a, float b, float c, float d) {
  union { bf16 h[4]; uint2 u; } o;
  o.h[0] = __float2bfloat16_rn(a); o.h[1] = __float2bfloat16_rn(b);
  o.h[2] = __float2bfloat16_rn(c); o.h[3] = __float2bfloat16_rn(d);
  *(uint2 *)p = o.u;
}

/* The RMS-normed register row xv (float4 threadIdx.x + NTR k of the row, zeros past H4 = H / 4) into the row yf
 * (fp32) and / or yb (bf16), either NULL: r from the sum of squares of the thread's float4s in k order and rsum
 * (sh: NTR / 32 floats), then (x r) w per element, wv the weight's float4s (has_w 0: x r). rmsnorm_row_kernel's
 * arithmetic, also the next layer's norm of ffn_combine_row_kernel, so that both write the same bits. */
template <int NTR, int F4>
__device__ __forceinline__ void rms_row_out(const float4 (&xv)[F4], const float4 (&wv)[F4], int has_w, float *yf,
                                            bf16 *yb, int H, float eps, float *sh) {
  const int H4 = H >> 2;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < F4; k++) ss += sq4(xv[k]);
  const float r = rms_scale(rsum<NTR>(ss, sh), H, eps);
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    if (f < H4) {
      float4 y;
      y.x = xv[k].x * r; y.y = xv[k].y * r; y.z = xv[k].z * r; y.w = xv[k].w * r;
      if (has_w) { y.x *= wv[k].x; y.y *= wv[k].y; y.z *= wv[k].z; y.w *= wv[k].w; }
      if (yb) stb4(yb + 4 * f, y.x, y.y, y.z, y.w);
      if (yf) st4(yf + 4 * f, y);
    }
  }
}

template <int NTR, int F4>
__global__ void __launch_bounds__(NTR) rmsnorm_row_kernel(const float *x, const float *w, float *yf, bf16 *yb, int H,
                                                          float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[NTR / 32];
  const size_t t = blockIdx.x;
  const int H4 = H >> 2;
  float4 xv[F4], wv[F4];
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    xv[k] = f < H4 ? ld4(x + t * H + 4 * f) : zero4();
    wv[k] = w && f < H4 ? ld4(w + 4 * f) : zero4();
  }
  rms_row_out<NTR>(xv, wv, w != NULL, yf ? yf + t * H : NULL, yb ? yb + t * H : NULL, H, eps, sh);
}

/* Whether every pointer is a multiple of a bytes (NULL passes): the float4 / 4 x bf16 accesses need it. */
static bool al(size_t a, std::initializer_list<const void *> ps) {
  for (const void *p : ps)
    if ((uintptr_t)p % a) return false;
  return true;
}

/* F4 = float4s per thread of a row of H at NTR threads; 0 where the row kernels do not apply. */
static int row_f4(int H, int ntr) {
  if (H % 4) return 0;
  const int f = (H / 4 + ntr - 1) / ntr;
  return f <= 1 ? 1 : f <= 2 ? 2 : f <= 3 ? 3 : f <= 4 ? 4 : f <= 6 ? 6 : f <= 8 ? 8 : 0;
}

/* Launch KERN<RNT_, F4> (F4 from row_f4) over T rows (a function pointer: no comma inside DG_LAUNCH). */
#define ROW_DISPATCH(F4, KERN, ...)                                                                      \
  do {                                                                                                  \
    decltype(&KERN<RNT_, 1>) kern_ = F4 == 1 ? KERN<RNT_, 1> : F4 == 2 ? KERN<RNT_, 2> : F4 == 3 ? KERN<RNT_, 3> \
                                     : F4 == 4 ? KERN<RNT_, 4> : F4 == 6 ? KERN<RNT_, 6> : KERN<RNT_, 8>;  \
    DG_LAUNCH(kern_, T, RNT_, 0, s)(__VA_ARGS__);                                                       \
  } while (0);

/* version 0: the register kernel at RNT threads where it applies (else the loop kernel); 1: the loop kernel;
 * 2: the register kernel at 128 threads (dev/cuda/step_kernels.cu compares them). */
cudaError_t k_rmsnorm_v(cudaStream_t s, int version, const float *x, const float *w, float *yf, bf16 *yb, int T, int H,
                        float eps) {
  const int ntr = version == 2 ? 128 : RNT;
  const int f4 = version == 1 || !al(16, {x, w, yf}) || !al(8, {yb}) ? 0 : row_f4(H, ntr);
  if (!f4) {
    DG_LAUNCH(rmsnorm_kernel, T, NT, 0, s)(x, w, yf, yb, H, eps);
  } else if (ntr == 128) {
#define RNT_ 128
    ROW_DISPATCH(f4, rmsnorm_row_kernel, x, w, yf, yb, H, eps)
#undef RNT_
  } else {
#define RNT_ RNT
    ROW_DISPATCH(f4, rmsnorm_row_kernel, x, w, yf, yb, H, eps)
#undef RNT_
  }
  return cudaGetLastError();
}

cudaError_t k_rmsnorm(cudaStream_t s, const float *x, const float *w, float *yf, bf16 *yb, int T, int H, float eps) {
  return k_rmsnorm_v(s, 0, x, w, yf, yb, T, H, eps);
}

/* Spec 4.4 steps 4-6 inputs: r = x + post_attn_norm(o); dense input
 * pre_ff(r), expert input pre_ff2(r), router input rms(r) * scale * H^-1/2. */
__global__ void attn_residual_kernel(float *x, const float *o, const float *w_post, const float *w_ff,
                                     const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe, float *u,
                                     int H, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[32];
  const size_t t = blockIdx.x;
  const float *orow = o + t * H;
  float *xr = x + t * H;
  const float ro = rms_scale(block_sumsq(orow, H, sh), H, eps);
  float ss = 0.0f;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v = xr[j] + (orow[j] * ro) * w_post[j];
    xr[j] = v;
    ss += v * v;
  }
  const float r = rms_scale(block_sum(ss, sh), H, eps);
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float n = xr[j] * r;
    a[t * H + j] = __float2bfloat16_rn(n * w_ff[j]);
    xe[t * H + j] = __float2bfloat16_rn(n * w_ff2[j]);
    u[t * H + j] = (n * rscale[j]) * root;
  }
}

/* The same with the row in registers (RPT = elements per thread >= H / NT):
 * every load of o and x is issued before the first reduction instead of
 * after it, and x is not re-read. Thread i holds elements i + NT k, summed in
 * the same order, so the results are the loop version's bit for bit (the
 * loop version took 25 us per 256-token canvas on the H200, latency-bound). */
template <int RPT>
__global__ void __launch_bounds__(NT) attn_residual_reg_kernel(float *x, const float *o, const float *w_post,
                                                                 const float *w_ff, const float *w_ff2,
                                                                 const float *rscale, float root, bf16 *a, bf16 *xe,
                                                                 float *u, int H, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[32];
  const size_t t = blockIdx.x;
  float ov[RPT], xv[RPT];
  float so = 0.0f;
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    ov[k] = j < H ? o[t * H + j] : 0.0f;
    xv[k] = j < H ? x[t * H + j] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < RPT; k++) so += ov[k] * ov[k];
  const float ro = rms_scale(block_sum(so, sh), H, eps);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    if (j < H) {
      xv[k] = xv[k] + (ov[k] * ro) * w_post[j];
      x[t * H + j] = xv[k];
      ss += xv[k] * xv[k];
    }
  }
  const float r = rms_scale(block_sum(ss, sh), H, eps);
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    if (j < H) {
      const float n = xv[k] * r;
      a[t * H + j] = __float2bfloat16_rn(n * w_ff[j]);
      xe[t * H + j] = __float2bfloat16_rn(n * w_ff2[j]);
      u[t * H + j] = (n * rscale[j]) * root;
    }
  }
}

/* The register-row version (the row kernels' comment above): o, x and all four weight vectors loaded first. */
template <int NTR, int F4>
__global__ void __launch_bounds__(NTR) attn_residual_row_kernel(float *x, const float *o, const float *w_post,
                                                                const float *w_ff, const float *w_ff2,
                                                                const float *rscale, float root, bf16 *a, bf16 *xe,
                                                                float *u, int H, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh0[NTR / 32], sh1[NTR / 32];
  const size_t t = blockIdx.x;
  const int H4 = H >> 2;
  float4 ov[F4], xv[F4], wp[F4], wa[F4], we[F4], wr[F4];
  ld_row4<NTR>(ov, o + t * H, H4);
  ld_row4<NTR>(xv, x + t * H, H4);
  ld_row4<NTR>(wp, w_post, H4);
  ld_row4<NTR>(wa, w_ff, H4);
  ld_row4<NTR>(we, w_ff2, H4);
  ld_row4<NTR>(wr, rscale, H4);
  float so = 0.0f;
#pragma unroll
  for (int k = 0; k < F4; k++) so += sq4(ov[k]);
  const float ro = rms_scale(rsum<NTR>(so, sh0), H, eps);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    if (f < H4) {
      xv[k].x = xv[k].x + (ov[k].x * ro) * wp[k].x;
      xv[k].y = xv[k].y + (ov[k].y * ro) * wp[k].y;
      xv[k].z = xv[k].z + (ov[k].z * ro) * wp[k].z;
      xv[k].w = xv[k].w + (ov[k].w * ro) * wp[k].w;
      st4(x + t * H + 4 * f, xv[k]);
      ss += sq4(xv[k]);
    }
  }
  const float r = rms_scale(rsum<NTR>(ss, sh1), H, eps);
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    if (f < H4) {
      const float n0 = xv[k].x * r, n1 = xv[k].y * r, n2 = xv[k].z * r, n3 = xv[k].w * r;
      stb4(a + t * H + 4 * f, n0 * wa[k].x, n1 * wa[k].y, n2 * wa[k].z, n3 * wa[k].w);
      stb4(xe + t * H + 4 * f, n0 * we[k].x, n1 * we[k].y, n2 * we[k].z, n3 * we[k].w);
      float4 uv;
      uv.x = (n0 * wr[k].x) * root; uv.y = (n1 * wr[k].y) * root;
      uv.z = (n2 * wr[k].z) * root; uv.w = (n3 * wr[k].w) * root;
      st4(u + t * H + 4 * f, uv);
    }
  }
}

/* version 0: the register-row kernel where it applies, else the per-thread-strided register kernel, else the
 * loop kernel; 1: the earlier choice (strided register kernel, else the loop kernel). */
cudaError_t k_attn_residual_v(cudaStream_t s, int version, float *x, const float *o, const float *w_post,
                              const float *w_ff, const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe,
                              float *u, int T, int H, float eps) {
  const int f4 = version == 1 || !al(16, {x, o, w_post, w_ff, w_ff2, rscale, u}) || !al(8, {a, xe}) ? 0 : row_f4(H, RNT);
  if (f4) {
#define RNT_ RNT
    ROW_DISPATCH(f4, attn_residual_row_kernel, x, o, w_post, w_ff, w_ff2, rscale, root, a, xe, u, H, eps)
#undef RNT_
    return cudaGetLastError();
  }
  const int rpt = (H + NT - 1) / NT;
#define AR(n) DG_LAUNCH(attn_residual_reg_kernel<n>, T, NT, 0, s)(x, o, w_post, w_ff, w_ff2, rscale, root, a, xe, u, H, eps)
  if (rpt <= 4) AR(4);
  else if (rpt <= 8) AR(8);
  else if (rpt <= 12) AR(12);
  else if (rpt <= 16) AR(16);
  else DG_LAUNCH(attn_residual_kernel, T, NT, 0, s)(x, o, w_post, w_ff, w_ff2, rscale, root, a, xe, u, H, eps);
#undef AR
  return cudaGetLastError();
}

cudaError_t k_attn_residual(cudaStream_t s, float *x, const float *o, const float *w_post, const float *w_ff,
                            const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe, float *u, int T,
                            int H, float eps) {
  return k_attn_residual_v(s, 0, x, o, w_post, w_ff, w_ff2, rscale, root, a, xe, u, T, H, eps);
}

/* h = gelu_tanh(gate) * up from gu [T, 2I] (gate columns first). */
__global__ void geglu_kernel(const float *gu, bf16 *h, int I, size_t n) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / I, j = i % I;
    h[i] = __float2bfloat16_rn(gelu_tanh(gu[t * 2 * I + j]) * gu[t * 2 * I + I + j]);
  }
}

static int grid_for(size_t n) {
  size_t b = (n + NT - 1) / NT;
  return (int)(b < 65535 ? (b ? b : 1) : 65535);
}

/* The same per element, grid (ceil(I / 4 / NT), T) with I % 4 == 0: a float4 of gate and one of up per thread,
 * 4 bf16 in one 8-byte store, no 64-bit division per element. */
__global__ void geglu4_kernel(const float *gu, bf16 *h, int I) {
  DG_PDL_ENTRY();
  const int f = blockIdx.x * blockDim.x + threadIdx.x;
  const size_t t = blockIdx.y;
  if (4 * f >= I) return;
  const float4 g = ld4(gu + t * 2 * I + 4 * f), u = ld4(gu + t * 2 * I + I + 4 * f);
  stb4(h + t * I + 4 * f, gelu_tanh(g.x) * u.x, gelu_tanh(g.y) * u.y, gelu_tanh(g.z) * u.z, gelu_tanh(g.w) * u.w);
}

/* version 0: geglu4_kernel where I % 4 == 0, else geglu_kernel; 1: geglu_kernel. Bit-identical results. */
cudaError_t k_geglu_v(cudaStream_t s, int version, const float *gu, bf16 *h, int T, int I) {
  if (version != 1 && I % 4 == 0 && T <= 65535 && al(16, {gu}) && al(8, {h})) {
    DG_LAUNCH(geglu4_kernel, dim3((I / 4 + NT - 1) / NT, T), NT, 0, s)(gu, h, I);
    return cudaGetLastError();
  }
  size_t n = (size_t)T * I;
  DG_LAUNCH(geglu_kernel, grid_for(n), NT, 0, s)(gu, h, I, n);
  return cudaGetLastError();
}

cudaError_t k_geglu(cudaStream_t s, const float *gu, bf16 *h, int T, int I) { return k_geglu_v(s, 0, gu, h, T, I); }

__global__ void add_kernel(float *x, const float *y, size_t n) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] += y[i];
}

cudaError_t k_add(cudaStream_t s, float *x, const float *y, size_t n) {
  DG_LAUNCH(add_kernel, grid_for(n), NT, 0, s)(x, y, n);
  return cudaGetLastError();
}

__global__ void softcap_kernel(float *x, size_t n, float cap) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = tanhf(x[i] / cap) * cap;
}

cudaError_t k_softcap(cudaStream_t s, float *x, size_t n, float cap) {
  DG_LAUNCH(softcap_kernel, grid_for(n), NT, 0, s)(x, n, cap);
  return cudaGetLastError();
}

/* ---- q/k/v post-processing (spec 4.4 step 2, rope 4.3) -------------------- */

/* Head slot `slot` of a q/k/v row (layout below): *kind 0 a query head, 1 a key head, 2 a value head (*g its KV
 * head); returns its D raw values. */
__device__ __forceinline__ const float *qkv_slot(const float *row, int slot, int NH, int NKV, int D, int has_v,
                                                 int *kind, int *g) {
  *g = 0;
  if (slot < NH) { *kind = 0; return row + (size_t)slot * D; }
  if (slot < NH + NKV) { *kind = 1; *g = slot - NH; return row + (size_t)NH * D + (size_t)*g * D; }
  *kind = 2;
  *g = slot - NH - NKV;
  return row + (size_t)NH * D + (size_t)(has_v ? NKV * D : 0) + (size_t)*g * D;
}

/* Rotate the normalised pair (a, b) = elements (i, i + h) of a head by angle ang (rotate-half rope) and store it:
 * a query head (kind 0) in fp32 at qd, a key head in bf16 at kd. */
__device__ __forceinline__ void rope_store(float a, float b, float ang, int kind, int i, int h, float *qd, bf16 *kd) {
  float cs = cosf(ang), sn = sinf(ang);
  float y0 = a * cs - b * sn, y1 = b * cs + a * sn;
  if (kind == 0) {
    qd[i] = y0;
    qd[i + h] = y1;
  } else {
    kd[i] = __float2bfloat16_rn(y0);
    kd[i + h] = __float2bfloat16_rn(y1);
  }
}

/* One block per (token t, head slot): slots [0, NH) are query heads, [NH,
 * NH+NKV) key heads, [NH+NKV, NH+2NKV) value heads. The raw projections sit
 * in qkv[t] as [q heads | k heads | v heads]; without v (K=V full layers) v
 * reads the raw k. q: rmsnorm(q_norm) then rope -> q [T, NH, D] fp32; k:
 * rmsnorm(k_norm) then rope -> kc; v: rmsnorm without weight -> vc. Rope is
 * rotate-half (pair i with i + D/2), angle inv_freq[i] * position in fp32. */
__global__ void qkv_post_kernel(const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S, const float *q_norm,
                                const float *k_norm, const float *inv_freq, int NH, int NKV, int D, int has_v,
                                int32_t pos0, const int32_t *tpos, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[32];
  const int t = blockIdx.x, slot = blockIdx.y;
  const int32_t pos = tpos ? tpos[t] : pos0 + t; /* scattered positions: the compacted decoder (spec 7.4) */
  const int32_t cs = pos % S;                     /* its cache slot (a ring of S slots on sliding layers) */
  const float *row = qkv + (size_t)t * ld;
  int kind, g; /* kind 0 q, 1 k, 2 v */
  const float *src = qkv_slot(row, slot, NH, NKV, D, has_v, &kind, &g);
  const float r = rms_scale(block_sumsq(src, D, sh), D, eps);
  if (kind == 2) {
    bf16 *dst = vc + ((size_t)g * S + cs) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = __float2bfloat16_rn(src[i] * r);
    return;
  }
  const float *w = kind == 0 ? q_norm : k_norm;
  const int h = D / 2;
  const float p = (float)pos;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    rope_store((src[i] * r) * w[i], (src[i + h] * r) * w[i + h], inv_freq[i] * p, kind, i, h,
               q + ((size_t)t * NH + slot) * D, kc + ((size_t)g * S + cs) * D);
  }
}

/* The same with one warp per (token, head slot), four slots per block of 128 threads, HPL = ceil(D / 64)
 * elements of each half per lane: the row, the norm weights and inv_freq loaded first, the sum of squares
 * a warp xor tree (no barrier). Per element the same expressions as qkv_post_kernel (rope: cosf/sinf of the
 * same fp32 angle); the sum of squares in another order (fp32, last bits of the RMS scale: within the tests'
 * bounds against the CPU, as the row kernels above). */
template <int HPL>
__global__ void __launch_bounds__(128) qkv_post_warp_kernel(const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc,
                                                           int S, const float *q_norm, const float *k_norm,
                                                           const float *inv_freq, int NH, int NKV, int D, int has_v,
                                                           int32_t pos0, const int32_t *tpos, float eps) {
  DG_PDL_ENTRY();
  const int t = blockIdx.x, slot = blockIdx.y * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (slot >= NH + 2 * NKV) return; /* the whole warp */
  const int32_t pos = tpos ? tpos[t] : pos0 + t, cs = pos % S;
  const float *row = qkv + (size_t)t * ld;
  int kind, g;
  const float *src = qkv_slot(row, slot, NH, NKV, D, has_v, &kind, &g);
  const int h = D / 2;
  const float *w = kind == 0 ? q_norm : k_norm;
  float av[HPL], bv[HPL], wa[HPL], wb[HPL], fr[HPL];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < HPL; k++) {
    const int i = lane + 32 * k;
    const bool in = i < h;
    av[k] = in ? src[i] : 0.0f;
    bv[k] = in ? src[i + h] : 0.0f;
    wa[k] = in && kind != 2 ? w[i] : 0.0f;
    wb[k] = in && kind != 2 ? w[i + h] : 0.0f;
    fr[k] = in && kind != 2 ? inv_freq[i] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < HPL; k++) ss += av[k] * av[k] + bv[k] * bv[k];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rms_scale(ss, D, eps);
  const float p = (float)pos;
#pragma unroll
  for (int k = 0; k < HPL; k++) {
    const int i = lane + 32 * k;
    if (i >= h) continue;
    if (kind == 2) {
      bf16 *dst = vc + ((size_t)g * S + cs) * D;
      dst[i] = __float2bfloat16_rn(av[k] * r);
      dst[i + h] = __float2bfloat16_rn(bv[k] * r);
      continue;
    }
    rope_store((av[k] * r) * wa[k], (bv[k] * r) * wb[k], fr[k] * p, kind, i, h, q + ((size_t)t * NH + slot) * D,
               kc + ((size_t)g * S + cs) * D);
  }
}

/* version 0: the warp kernel where D is even and D / 2 <= 256, else the block kernel; 1: the block kernel. */
cudaError_t k_qkv_post_v(cudaStream_t s, int version, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc,
                         int S, const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV,
                         int D, int has_v, int32_t pos0, const int32_t *tpos, float eps) {
  const int h = D / 2, hpl = (h + 31) / 32, ns = NH + 2 * NKV;
  if (version != 1 && D % 2 == 0 && hpl <= 8 && (ns + 3) / 4 <= 65535) {
    decltype(&qkv_post_warp_kernel<1>) kern = hpl <= 1 ? qkv_post_warp_kernel<1> : hpl <= 2 ? qkv_post_warp_kernel<2>
                                              : hpl <= 4 ? qkv_post_warp_kernel<4> : qkv_post_warp_kernel<8>;
    DG_LAUNCH(kern, dim3(T, (ns + 3) / 4), 128, 0, s)(qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, NH, NKV, D, has_v,
                                                     pos0, tpos, eps);
    return cudaGetLastError();
  }
  dim3 grid(T, ns);
  int nt = D >= 256 ? 128 : D >= 64 ? 64 : 32;
  DG_LAUNCH(qkv_post_kernel, grid, nt, 0, s)(qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, NH, NKV, D, has_v, pos0,
                                             tpos, eps);
  return cudaGetLastError();
}

cudaError_t k_qkv_post(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                       const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV, int D,
                       int has_v, int32_t pos0, float eps) {
  return k_qkv_post_v(s, 0, qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, T, NH, NKV, D, has_v, pos0,
                      (const int32_t *)NULL, eps);
}

cudaError_t k_qkv_post_at(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                          const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV,
                          int D, int has_v, const int32_t *tpos, float eps) {
  return k_qkv_post_v(s, 0, qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, T, NH, NKV, D, has_v, 0, tpos, eps);
}

/* ---- end of the layer: dense + MoE combination (spec 4.4 step 7) ---------- */

/* Token t's K slots in ascending expert order (equal ids by slot: a stable
 * sort), thread k < K placing slot k at its rank: srow / sw [K] the grouped
 * rows and weights in that order (the caller synchronises before reading). */
__device__ __forceinline__ void combine_slot_order(size_t t, int K, const int32_t *topk_idx, const int32_t *slot_row,
                                                   const float *topk_w, int *srow, float *sw) {
  if ((int)threadIdx.x >= K) return;
  const int k = threadIdx.x, ek = topk_idx[t * K + k];
  int rank = 0;
  for (int i = 0; i < K; i++) {
    const int ei = topk_idx[t * K + i];
    rank += ei < ek || (ei == ek && i < k);
  }
  srow[rank] = slot_row[t * K + k];
  sw[rank] = topk_w[t * K + k];
}

/* One block per token. g = sum over the token's K slots in ascending expert
 * order of w * y (the CPU's and the reference's index_add order); then
 * x = (x + post_ff(post_ff1(dense) + post_ff2(g))) * scalar. Dynamic shared
 * memory: 2 * H floats. */
__global__ void ffn_combine_kernel(float *x, const float *dense, const float *y, const int32_t *slot_row,
                                   const int32_t *topk_idx, const float *topk_w, const float *w_ff1,
                                   const float *w_ff2, const float *w_ff, float scalar, int H, int K, float eps) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM(float, dyn);
  __shared__ float sh[32];
  __shared__ int srow[64];
  __shared__ float sw[64];
  float *sg = dyn, *sd = dyn + H;
  const size_t t = blockIdx.x;
  combine_slot_order(t, K, topk_idx, slot_row, topk_w, srow, sw);
  __syncthreads();
  float ssg = 0.0f;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float a = 0.0f;
    for (int k = 0; k < K; k++) a += y[(size_t)srow[k] * H + j] * sw[k];
    sg[j] = a;
    ssg += a * a;
  }
  const float rg = rms_scale(block_sum(ssg, sh), H, eps);
  const float rd = rms_scale(block_sumsq(dense + t * H, H, sh), H, eps);
  float sss = 0.0f;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v = (dense[t * H + j] * rd) * w_ff1[j] + (sg[j] * rg) * w_ff2[j];
    sd[j] = v;
    sss += v * v;
  }
  const float rs = rms_scale(block_sum(sss, sh), H, eps);
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v = (sd[j] * rs) * w_ff[j];
    x[t * H + j] = (x[t * H + j] + v) * scalar;
  }
}

/* The same with the row in registers (RPT >= H / NT, K <= KMAX): the K rows of
 * y and the dense row loaded before the first reduction; same per-thread
 * elements and summation order, so bit for bit the loop version's. */
template <int RPT, int KMAX>
__global__ void __launch_bounds__(NT) ffn_combine_reg_kernel(float *x, const float *dense, const float *y,
                                                               const int32_t *slot_row, const int32_t *topk_idx,
                                                               const float *topk_w, const float *w_ff1,
                                                               const float *w_ff2, const float *w_ff, float scalar,
                                                               int H, int K, float eps) {
  DG_PDL_ENTRY();
  __shared__ float sh[32];
  __shared__ int srow[KMAX];
  __shared__ float sw[KMAX];
  const size_t t = blockIdx.x;
  combine_slot_order(t, K, topk_idx, slot_row, topk_w, srow, sw);
  float gv[RPT], dv[RPT];
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    dv[k] = j < H ? dense[t * H + j] : 0.0f;
  }
  __syncthreads();
  float ssg = 0.0f, ssd = 0.0f;
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    float acc = 0.0f;
    if (j < H) {
#pragma unroll
      for (int i = 0; i < KMAX; i++)
        if (i < K) acc += y[(size_t)srow[i] * H + j] * sw[i];
    }
    gv[k] = acc;
    ssg += acc * acc;
    ssd += dv[k] * dv[k];
  }
  const float rg = rms_scale(block_sum(ssg, sh), H, eps);
  const float rd = rms_scale(block_sum(ssd, sh), H, eps);
  float sss = 0.0f;
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    if (j < H) {
      gv[k] = (dv[k] * rd) * w_ff1[j] + (gv[k] * rg) * w_ff2[j];
      sss += gv[k] * gv[k];
    }
  }
  const float rs = rms_scale(block_sum(sss, sh), H, eps);
#pragma unroll
  for (int k = 0; k < RPT; k++) {
    const int j = threadIdx.x + NT * k;
    if (j < H) {
      const float v = (gv[k] * rs) * w_ff[j];
      x[t * H + j] = (x[t * H + j] + v) * scalar;
    }
  }
}

/* The register-row version (the row kernels' comment above), K <= KMAX: the dense and x rows and the three
 * weight vectors loaded before the slot order's barrier, the K expert rows right after it (per element in the
 * same ascending-expert order from 0 as the loop kernel); the two first sums of squares at one barrier.
 * PRE (DGEMMA_COMBINE=pre, session 22; not the default): the next layer's norm weight w_next loaded with the other
 * weights at the start instead of after the stores of x, so that its load latency (a weight of the next layer: from
 * DRAM, ~0.6-1 us, while the reduction it would overlap is a few hundred cycles) is off the end of every block (the
 * grid is one wave of 256 blocks in lockstep at the 26B shape: each block's tail is the kernel's); 12 registers more
 * per thread at F4 3. The same values and operations: every output word the default's. */
template <int NTR, int F4, int KMAX = 8, int PRE = 0>
__global__ void __launch_bounds__(NTR) ffn_combine_row_kernel(float *x, const float *dense, const float *y,
                                                              const int32_t *slot_row, const int32_t *topk_idx,
                                                              const float *topk_w, const float *w_ff1,
                                                              const float *w_ff2, const float *w_ff, float scalar,
                                                              int H, int K, float eps, const float *w_next,
                                                              bf16 *a_next) {
  DG_PDL_ENTRY();
  __shared__ float sh2[2 * (NTR / 32)], sh1[NTR / 32], shn[NTR / 32];
  __shared__ int srow[KMAX];
  __shared__ float sw[KMAX];
  const size_t t = blockIdx.x;
  const int H4 = H >> 2;
  combine_slot_order(t, K, topk_idx, slot_row, topk_w, srow, sw);
  float4 dv[F4], xv[F4], w1[F4], w2[F4], wf[F4], gv[F4], wn[PRE ? F4 : 1];
  ld_row4<NTR>(dv, dense + t * H, H4);
  ld_row4<NTR>(xv, x + t * H, H4);
  ld_row4<NTR>(w1, w_ff1, H4);
  ld_row4<NTR>(w2, w_ff2, H4);
  ld_row4<NTR>(wf, w_ff, H4);
  if constexpr (PRE) {
    if (a_next) ld_row4<NTR>(wn, w_next, H4);
  }
#pragma unroll
  for (int k = 0; k < F4; k++) gv[k] = zero4();
  __syncthreads();
#pragma unroll
  for (int i = 0; i < KMAX; i++) {
    if (i < K) {
      const float *yr = y + (size_t)srow[i] * H;
      const float wi = sw[i];
#pragma unroll
      for (int k = 0; k < F4; k++) {
        const int f = threadIdx.x + NTR * k;
        if (f < H4) {
          const float4 yv = ld4(yr + 4 * f);
          gv[k].x += yv.x * wi; gv[k].y += yv.y * wi; gv[k].z += yv.z * wi; gv[k].w += yv.w * wi;
        }
      }
    }
  }
  float ssg = 0.0f, ssd = 0.0f;
#pragma unroll
  for (int k = 0; k < F4; k++) { ssg += sq4(gv[k]); ssd += sq4(dv[k]); }
  rsum2<NTR>(ssg, ssd, sh2);
  const float rg = rms_scale(ssg, H, eps), rd = rms_scale(ssd, H, eps);
  float sss = 0.0f;
#pragma unroll
  for (int k = 0; k < F4; k++) {
    gv[k].x = (dv[k].x * rd) * w1[k].x + (gv[k].x * rg) * w2[k].x;
    gv[k].y = (dv[k].y * rd) * w1[k].y + (gv[k].y * rg) * w2[k].y;
    gv[k].z = (dv[k].z * rd) * w1[k].z + (gv[k].z * rg) * w2[k].z;
    gv[k].w = (dv[k].w * rd) * w1[k].w + (gv[k].w * rg) * w2[k].w;
    sss += sq4(gv[k]);
  }
  const float rs = rms_scale(rsum<NTR>(sss, sh1), H, eps);
#pragma unroll
  for (int k = 0; k < F4; k++) {
    const int f = threadIdx.x + NTR * k;
    if (f < H4) {
      float4 o;
      o.x = (xv[k].x + (gv[k].x * rs) * wf[k].x) * scalar;
      o.y = (xv[k].y + (gv[k].y * rs) * wf[k].y) * scalar;
      o.z = (xv[k].z + (gv[k].z * rs) * wf[k].z) * scalar;
      o.w = (xv[k].w + (gv[k].w * rs) * wf[k].w) * scalar;
      st4(x + t * H + 4 * f, o);
      xv[k] = o;
    }
  }
  if (!a_next) return;
  /* the next layer's input norm of the row just stored (xv: zeros past H4, as ld_row4 left them), with
   * rmsnorm_row_kernel's own code: a_next holds the bits k_rmsnorm(x, w_next) would write */
  if constexpr (PRE) {
    rms_row_out<NTR>(xv, wn, 1, (float *)NULL, a_next + t * H, H, eps, shn);
  } else {
    ld_row4<NTR>(w1, w_next, H4); /* w1: w_ff1's registers, no longer needed */
    rms_row_out<NTR>(xv, w1, 1, (float *)NULL, a_next + t * H, H, eps, shn);
  }
}

/* version 0: the register-row kernel where it applies (K <= 8), else the earlier choice; 1: the earlier choice
 * (the per-thread-strided register kernel, else the loop kernel). */
cudaError_t k_ffn_combine_v(cudaStream_t s, int version, float *x, const float *dense, const float *y,
                            const int32_t *slot_row, const int32_t *topk_idx, const float *topk_w, const float *w_ff1,
                            const float *w_ff2, const float *w_ff, float scalar, int T, int H, int K, float eps) {
  const int f4 = version == 1 || K > 8 || !al(16, {x, dense, y, w_ff1, w_ff2, w_ff}) ? 0 : row_f4(H, RNT);
  if (f4) {
#define RNT_ RNT
    ROW_DISPATCH(f4, ffn_combine_row_kernel, x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, H, K, eps,
                 (const float *)NULL, (bf16 *)NULL)
#undef RNT_
    return cudaGetLastError();
  }
  const int rpt = (H + NT - 1) / NT;
  if (K <= 8 && rpt <= 16) {
    void (*kern)(float *, const float *, const float *, const int32_t *, const int32_t *, const float *, const float *,
                 const float *, const float *, float, int, int, float) =
        rpt <= 4 ? ffn_combine_reg_kernel<4, 8> : rpt <= 8 ? ffn_combine_reg_kernel<8, 8>
        : rpt <= 12 ? ffn_combine_reg_kernel<12, 8> : ffn_combine_reg_kernel<16, 8>;
    DG_LAUNCH(kern, T, NT, 0, s)(x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, H, K, eps);
    return cudaGetLastError();
  }
  size_t smem = 2 * (size_t)H * sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(ffn_combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  DG_LAUNCH(ffn_combine_kernel, T, NT, smem, s)(x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, H, K,
                                         eps);
  return cudaGetLastError();
}

cudaError_t k_ffn_combine(cudaStream_t s, float *x, const float *dense, const float *y, const int32_t *slot_row,
                          const int32_t *topk_idx, const float *topk_w, const float *w_ff1, const float *w_ff2,
                          const float *w_ff, float scalar, int T, int H, int K, float eps) {
  return k_ffn_combine_v(s, 0, x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, T, H, K, eps);
}

/* DGEMMA_COMBINE=pre: k_ffn_combine_norm takes version 2 (ffn_combine_row_kernel's PRE); read once when the library
 * loads; not the default until timed on a GPU (dev/cuda/step_kernels.cu's "ffn_combine + next norm" rows). */
static int combine_from_env(void) { return (int)dg_sw_get(DG_SW_COMBINE); } /* "pre" 2, unset 0 */
static const int combine_default = combine_from_env();

cudaError_t k_ffn_combine_norm(cudaStream_t s, float *x, const float *dense, const float *y, const int32_t *slot_row,
                               const int32_t *topk_idx, const float *topk_w, const float *w_ff1, const float *w_ff2,
                               const float *w_ff, float scalar, int T, int H, int K, float eps, const float *w_next,
                               bf16 *a_next, int *fused) {
  return k_ffn_combine_norm_v(s, combine_default, x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar,
                              T, H, K, eps, w_next, a_next, fused);
}

cudaError_t k_ffn_combine_norm_v(cudaStream_t s, int version, float *x, const float *dense, const float *y,
                                 const int32_t *slot_row, const int32_t *topk_idx, const float *topk_w,
                                 const float *w_ff1, const float *w_ff2, const float *w_ff, float scalar, int T, int H,
                                 int K, float eps, const float *w_next, bf16 *a_next, int *fused) {
  /* fused only where both kernels take their register-row forms at RNT threads (the same F4): k_ffn_combine_v's
   * version 0 and k_rmsnorm_v's version 0 conditions */
  const int f4 = K > 8 || !al(16, {x, dense, y, w_ff1, w_ff2, w_ff, w_next}) || !al(8, {a_next}) || !w_next || !a_next
                     ? 0 : row_f4(H, RNT);
  *fused = f4 != 0;
  if (!f4) return k_ffn_combine_v(s, 0, x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, T, H, K, eps);
  if (version == 2) {
    decltype(&ffn_combine_row_kernel<RNT, 1>) kern =
        f4 == 1 ? ffn_combine_row_kernel<RNT, 1, 8, 1> : f4 == 2 ? ffn_combine_row_kernel<RNT, 2, 8, 1>
        : f4 == 3 ? ffn_combine_row_kernel<RNT, 3, 8, 1> : f4 == 4 ? ffn_combine_row_kernel<RNT, 4, 8, 1>
        : f4 == 6 ? ffn_combine_row_kernel<RNT, 6, 8, 1> : ffn_combine_row_kernel<RNT, 8, 8, 1>;
    DG_LAUNCH(kern, T, RNT, 0, s)(x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, H, K, eps, w_next,
                                  a_next);
    return cudaGetLastError();
  }
#define RNT_ RNT
  ROW_DISPATCH(f4, ffn_combine_row_kernel, x, dense, y, slot_row, topk_idx, topk_w, w_ff1, w_ff2, w_ff, scalar, H, K, eps,
               w_next, a_next)
#undef RNT_
  return cudaGetLastError();
}

/* ---- sampler statistics (spec 6.1 steps 2-4) ------------------------------ */


/* ---- per-position passes over the vocabulary: sampler statistics and
 * self-conditioning probabilities (spec 6.1 steps 2-4; spec 5, 4.9) --------
 *
 * A row of V logits (1 MB at V = 262,144) is cut into chunks of VCH = 8192
 * elements, one block of VNT = 256 threads per (chunk, position): 8,192
 * blocks over a 256-token canvas instead of 256. Thread i of a block loads
 * the float4s i, i + 256, ... of its chunk (every load coalesced, all eight
 * issued before any arithmetic) and keeps them in registers. Reductions are
 * warp shuffles plus one barrier, in a fixed order, so every run gives the
 * same bits. Partial results per (position, chunk) go to the workspace
 * (k_vocab_ws_bytes); a later pass or kernel combines them in a fixed order.
 * (The earlier kernels, one block of 512 threads per position with strided
 * scalar loads and a cdf scan over contiguous per-thread chunks, are kept in
 * dev/cuda/step_kernels.cu for comparison.) */

#define VNT 256                 /* threads of a vocabulary-chunk block */
#define VPT 32                  /* elements per thread */
#define VCH (VNT * VPT)         /* elements per chunk */
#define VPAD 33                 /* shared row of a thread's 32 elements, padded: no bank conflicts */
#ifndef DG_VOCAB_GROUP
#define DG_VOCAB_GROUP 0        /* positions per launch group of the chunk passes (k_step_stats_g); 0: all */
#endif

/* One (position, chunk) partial. */
struct vpart {
  float m;      /* chunk max of z (sc probs: of cast(z)) */
  int32_t amax; /* first index of m in the chunk */
  int32_t bad;  /* a non-finite z in the chunk */
  float scm;    /* fused chain: the chunk max of cast(z) (the sc probabilities'; vsc_max_kernel's m) */
  double s0;    /* sum of exp(z - m) (sc probs: of the fp32 exps about the row max) */
  double s1;    /* sum of exp(z - m) (z - m) */
  double t;     /* the chunk's mass of the fp32 probabilities (cdf, vstats_cdf_kernel) */
  double scs;   /* fused chain: the chunk sum of the sc exponentials about the row max (vsc_sum_kernel's s0) */
};

extern "C" size_t k_vocab_ws_bytes(int C, int V) { return (size_t)C * ((V + VCH - 1) / VCH) * sizeof(vpart); }

/* The self-conditioning partials in a host copy of the workspace, per (position, chunk): the chunk max and sum of
 * the chain (m, s0 after k_sc_probs) or of the fused chain (scm, scs). For the tests' word-for-word comparison. */
extern "C" void k_vocab_sc_parts(const void *ws, int C, int V, int fused, float *m, double *sum) {
  const vpart *p = (const vpart *)ws;
  const size_t n = (size_t)C * ((V + VCH - 1) / VCH);
  for (size_t i = 0; i < n; i++) {
    m[i] = fused ? p[i].scm : p[i].m;
    sum[i] = fused ? p[i].scs : p[i].s0;
  }
}

/* Element index (in the chunk) of thread tid's slot (j, q): float4 j of the thread, lane q of it. */
__device__ __forceinline__ int vslot(int tid, int j, int q) { return 4 * (tid + VNT * j) + q; }

/* Load chunk elements base + vslot(..) of row into v (absent ones: fill). vec: row 16-byte aligned, V % 4 == 0. */
__device__ __forceinline__ void vload(const float *row, int V, int base, int vec, float fill, float (&v)[VPT]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < VPT / 4; j++) {
    const int e = base + vslot(tid, j, 0);
    if (vec && e + 3 < V) {
      const float4 f = *(const float4 *)(row + e);
      v[4 * j] = f.x; v[4 * j + 1] = f.y; v[4 * j + 2] = f.z; v[4 * j + 3] = f.w;
    } else {
#pragma unroll
      for (int q = 0; q < 4; q++) v[4 * j + q] = e + q < V ? row[e + q] : fill;
    }
  }
}

__device__ __forceinline__ void vstore(float *row, int V, int base, int vec, const float (&v)[VPT]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < VPT / 4; j++) {
    const int e = base + vslot(tid, j, 0);
    if (vec && e + 3 < V) {
      float4 f;
      f.x = v[4 * j]; f.y = v[4 * j + 1]; f.z = v[4 * j + 2]; f.w = v[4 * j + 3];
      *(float4 *)(row + e) = f;
    } else {
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (e + q < V) row[e + q] = v[4 * j + q];
    }
  }
}

/* (max, first index) pair order: a wins over b if greater, or equal at a lower index. Exact, so any tree gives
 * the same pair. */
__device__ __forceinline__ void argmax_merge(float &m, int &i, float m2, int i2) {
  if (m2 > m || (m2 == m && i2 < i)) { m = m2; i = i2; }
}

/* Block reductions of the chunk kernels (VNT threads): a warp xor tree, then each thread folds the VNT / 32
 * warp results in warp order. One barrier; sh is the caller's (distinct per call site). */
__device__ __forceinline__ void vblock_argmax(float &m, int &i, float *shm, int *shi) {
  for (int o = 16; o; o >>= 1) argmax_merge(m, i, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, i, o));
  if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = m; shi[threadIdx.x >> 5] = i; }
  __syncthreads();
  m = shm[0]; i = shi[0];
  for (int w = 1; w < VNT / 32; w++) argmax_merge(m, i, shm[w], shi[w]);
}

__device__ __forceinline__ float vblock_max(float m, float *sh) {
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
  __syncthreads();
  m = sh[0];
  for (int w = 1; w < VNT / 32; w++) m = fmaxf(m, sh[w]);
  return m;
}

__device__ __forceinline__ double vblock_sum(double v, double *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int w = 1; w < VNT / 32; w++) v += sh[w];
  return v;
}

/* Row statistics from the NB chunk partials of one position, by one warp (every lane returns the same bits):
 * the row max g and its first index, S0 = sum exp(z - g) = sum_b s0_b exp(m_b - g) and
 * S1 = sum exp(z - g)(z - g) = sum_b exp(m_b - g) (s1_b + (m_b - g) s0_b), in double; any chunk's bad flag.
 * Every term of S1 is <= 0, so the entropy log S0 - S1 / S0 adds two non-negative numbers (no cancellation). */
__device__ void vcombine(const vpart *p, int NB, float &g, int &gi, double &S0, double &S1, int &bad) {
  const int l = threadIdx.x & 31;
  float m = -FLT_MAX;
  int mi = INT32_MAX, bd = 0;
  for (int b = l; b < NB; b += 32) {
    argmax_merge(m, mi, p[b].m, p[b].amax);
    bd |= p[b].bad;
  }
  for (int o = 16; o; o >>= 1) argmax_merge(m, mi, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, mi, o));
  bd = __ballot_sync(0xffffffffu, bd) != 0;
  double s0 = 0.0, s1 = 0.0;
  if (!bd)
    for (int b = l; b < NB; b += 32) {
      const double d = (double)p[b].m - (double)m, e = exp(d);
      s0 += p[b].s0 * e;
      s1 += e * (p[b].s1 + d * p[b].s0);
    }
  for (int o = 16; o; o >>= 1) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
    s1 += __shfl_xor_sync(0xffffffffu, s1, o);
  }
  g = m; gi = mi; S0 = s0; S1 = s1; bad = bd;
}

/* ---- the two chains over the logits (issue 14) ----
 * "chain" (DGEMMA_VOCAB=chain; the default until H200 session 17; DGEMMA_VOCAB=fused selects the second, not faster on the H200, session 14): softcap_kernel writes softcap(logits) in place after
 * the LM head; vstats_part_kernel stores z = logits / T in place, vstats_cdf_kernel (sampled proposals) and
 * vstats_finish_kernel read it; vsc_max_kernel, vsc_sum_kernel and vsc_write_kernel read it again for the
 * self-conditioning probabilities. "fused" (DGEMMA_VOCAB=fused): the LM head's logits stay as it left them (raw: the
 * softcap is not applied in place) and every kernel recomputes z = vz(x, cap, T) in registers, with the chain's
 * fp32 operations in the chain's order (softcap_kernel's tanhf(x / cap) * cap, then the division by T), so it
 * holds the chain's z bit for bit and stores nothing. Pass 1 (vfuse_part_kernel) also takes vsc_max_kernel's chunk
 * max, pass 2 (vfuse_cdf_kernel; sampled proposals) also vsc_sum_kernel's chunk sum (both need only the row max),
 * and the probabilities then need one pass (vfuse_write_kernel; after argmax proposals two, the sums first). The
 * partials are the chain's, reduced in the chain's order: every output word is the chain's (test_vocab_chain).
 * "zstore" (the default since H200 session 17, DGEMMA_VOCAB=zstore; the lab's "v3 z stored", argmax chain 0.602 ms against the chain's 0.678 on the H200,
 * session 14): the fused chain whose pass 1 also stores z in place (one write more), so that the passes after it
 * read z as it is (vz's DG_VZ_STORED) instead of recomputing tanhf and the divisions; every output word and the
 * stored z the chain's (test_vocab_chain).
 * Passes over the C x V fp32 logits (26B: C = 256, V = 262,144, 268 MB a pass), a sampled step with
 * self-conditioning: chain 2 writes + 7 reads (softcap r+w, pass 1 r+w, pass 2, sc max, sc sum, sc write) + P;
 * fused 3 reads (pass 1, pass 2, sc write) + P (134 MB of bf16); zstore 3 reads + 1 write + P. The templates' F = 0
 * is the chain's kernel, F = 1 the fused one (zstore's too). */

/* The fused chain's z of a logit x: softcap_kernel's tanhf(x / cap) * cap where cap > 0, then vstats_part_kernel's
 * division by T (separate fp32 operations, nothing to contract: the chain's bits); cap DG_VZ_STORED (< 0): x already
 * is z, stored by a pass 1 with store (DGEMMA_VOCAB=zstore), taken as it is (the chain's later passes read z the same
 * way; no division by 1, which would cost a division's instructions per element for the same value). A uniform
 * branch: every thread of a launch takes the same side. */
__device__ __forceinline__ float vz(float x, float cap, float T) {
  if (cap < 0.0f) return x;
  return (cap > 0.0f ? tanhf(x / cap) * cap : x) / T;
}

/* vload, then z = vz(x) of every element (absent ones: vz(0) = 0, as the chain's 0 / T). */
__device__ __forceinline__ void vzload(const float *row, int V, int base, int vec, float cap, float T,
                                       float (&v)[VPT]) {
  vload(row, V, base, vec, 0.0f, v);
#pragma unroll
  for (int k = 0; k < VPT; k++) v[k] = vz(v[k], cap, T);
}

__device__ __forceinline__ float round_act(float x, int act) {
  if (act == DG_CUDA_BF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (act == DG_CUDA_F16) return __half2float(__float2half_rn(x));
  return x;
}

/* The row max of the chunk maxima (F = 0: m, vsc_max_kernel's; F = 1: scm, the fused pass 1's), by one warp
 * (every lane the same). */
template <int F> __device__ __forceinline__ float vrow_max(const vpart *p, int NB) {
  float m = -FLT_MAX;
  for (int b = threadIdx.x & 31; b < NB; b += 32) m = fmaxf(m, F ? p[b].scm : p[b].m);
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

/* Pass 1 of the statistics, grid (NB, C): z = logits / T (the CPU's fp32 division; F = 0: stored in place), the
 * chunk's max and its first index, a non-finite flag, s0 and s1 about the chunk max (the values stay in
 * registers); F = 1: z = vz(logits) not stored, and the chunk max scm of cast(z) (vsc_max_kernel's: its absent
 * elements, -FLT_MAX, change no max). */
template <int F>
__device__ __forceinline__ void vstats_part_body(float *logits, int V, int vec, float cap, float temperature, int act,
                                                 int store, vpart *part, int c0) {
  __shared__ float shm[VNT / 32], shs[VNT / 32];
  __shared__ int shi[VNT / 32], shb[VNT / 32];
  __shared__ double sh0[VNT / 32], sh1[VNT / 32];
  const int b = blockIdx.x, c = c0 + blockIdx.y, NB = gridDim.x, tid = threadIdx.x, base = b * VCH;
  float *row = logits + (size_t)c * V;
  float v[VPT];
  if (F) vzload(row, V, base, vec, cap, temperature, v);
  else vload(row, V, base, vec, 0.0f, v);
  float mx = -FLT_MAX;
  int amax = INT32_MAX, nonfinite = 0;
#pragma unroll
  for (int k = 0; k < VPT; k++) {
    const int e = base + vslot(tid, k >> 2, k & 3);
    if (!F) v[k] = v[k] / temperature;
    if (e < V) {
      if (!isfinite(v[k])) nonfinite = 1;
      if (v[k] > mx) { mx = v[k]; amax = e; } /* the thread's elements ascend with k */
    }
  }
  if (!F || store) vstore(row, V, base, vec, v);
  float scm = -FLT_MAX;
  if (F) {
#pragma unroll
    for (int k = 0; k < VPT; k++)
      if (base + vslot(tid, k >> 2, k & 3) < V) scm = fmaxf(scm, round_act(v[k], act));
  }
  nonfinite = __ballot_sync(0xffffffffu, nonfinite) != 0;
  if ((tid & 31) == 0) shb[tid >> 5] = nonfinite;
  vblock_argmax(mx, amax, shm, shi); /* its barrier publishes shb too */
  int bad = 0;
  for (int w = 0; w < VNT / 32; w++) bad |= shb[w];
  double s0 = 0.0, s1 = 0.0;
  if (!bad) {
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      const int e = base + vslot(tid, k >> 2, k & 3);
      if (e < V) {
        const double d = (double)v[k] - (double)mx, ex = exp(d);
        s0 += ex;
        s1 += ex * d;
      }
    }
  }
  s0 = vblock_sum(s0, sh0);
  s1 = vblock_sum(s1, sh1);
  if (F) scm = vblock_max(scm, shs);
  if (tid == 0) {
    vpart *p = part + (size_t)c * NB + b;
    p->m = mx; p->amax = amax; p->bad = bad; p->scm = F ? scm : 0.0f;
    p->s0 = s0; p->s1 = s1; p->t = 0.0; p->scs = 0.0;
  }
}

__global__ void __launch_bounds__(VNT) vstats_part_kernel(float *logits, int V, int vec, float temperature, vpart *part,
                                                          int c0) {
  DG_PDL_ENTRY();
  vstats_part_body<0>(logits, V, vec, 0.0f, temperature, 0, 1, part, c0);
}

__global__ void __launch_bounds__(VNT, 3) vfuse_part_kernel(float *logits, int V, int vec, float cap, float T, int act,
                                                            int store, vpart *part, int c0) {
  DG_PDL_ENTRY();
  vstats_part_body<1>(logits, V, vec, cap, T, act, store, part, c0); /* store 0: logits untouched */
}

/* The fp32 probabilities p = expf(z - g) / fs of chunk base (loaded by vload into v) into sp (thread t's 32 consecutive elements at
 * sp[t * VPAD ..], absent ones 0), then each thread's run of 32 summed in order in double: the cdf's innermost
 * level (the CPU's probabilities, spec 6.1: torch.softmax's fp32 values). Ends with a barrier. */
__device__ __forceinline__ void vchunk_probs(const float (&v)[VPT], int V, int base, float g, float fs, float *sp) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int k = 0; k < VPT; k++) {
    const int o = vslot(tid, k >> 2, k & 3);
    sp[(o >> 5) * VPAD + (o & 31)] = base + o < V ? expf(v[k] - g) / fs : 0.0f;
  }
  __syncthreads();
}

/* Pass 2, grid (NB, C): with cdf (sampled proposals) the chunk's mass t of the fp32 probabilities, summed as the
 * cdf of vstats_finish_kernel walks it (run of 32 per thread, runs of a warp in lane order, warps in order), so
 * that the cdf at the chunk's last element plus the chunks before it is exactly the running sum of the t.
 * F = 1: z = vz(logits), and first the sc chunk sum scs (vsc_sum_kernel's: expf(cast(z) - the row max of the
 * scm), summed in double in its order); F = 0 always has cdf. */
template <int F>
__device__ __forceinline__ void vstats_cdf_body(const float *z, int V, int vec, float cap, float T, int act, int cdf,
                                                vpart *part, int c0) {
  __shared__ float sp[VNT * VPAD];
  __shared__ double sr[VNT], sw[VNT / 32], shd[VNT / 32];
  __shared__ float shg, shfs, shsm;
  __shared__ int shbad;
  const int b = blockIdx.x, c = c0 + blockIdx.y, NB = gridDim.x, tid = threadIdx.x;
  vpart *p = part + (size_t)c * NB;
  float v[VPT];
  if (F) vzload(z + (size_t)c * V, V, b * VCH, vec, cap, T, v); /* in flight during the combine */
  else vload(z + (size_t)c * V, V, b * VCH, vec, 0.0f, v);
  if (tid < 32) {
    if (cdf) {
      float g; int gi, bad; double S0, S1;
      vcombine(p, NB, g, gi, S0, S1, bad);
      if (tid == 0) { shg = g; shfs = (float)S0; shbad = bad; }
    }
    if (F) {
      const float m = vrow_max<1>(p, NB);
      if (tid == 0) shsm = m;
    }
  }
  __syncthreads();
  if (F) {
    const float mx = shsm;
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < VPT; k++)
      if (b * VCH + vslot(tid, k >> 2, k & 3) < V) s += (double)expf(round_act(v[k], act) - mx);
    s = vblock_sum(s, shd);
    if (tid == 0) p[b].scs = s;
  }
  if (!cdf || shbad) return;
  vchunk_probs(v, V, b * VCH, shg, shfs, sp);
  double run = 0.0;
  for (int k = 0; k < VPT; k++) run += (double)sp[tid * VPAD + k];
  sr[tid] = run;
  __syncthreads();
  if ((tid & 31) == 0) {
    double w = 0.0;
    for (int l = 0; l < 32; l++) w += sr[tid + l];
    sw[tid >> 5] = w;
  }
  __syncthreads();
  if (tid == 0) {
    double t = 0.0;
    for (int w = 0; w < VNT / 32; w++) t += sw[w];
    p[b].t = t;
  }
}

__global__ void __launch_bounds__(VNT) vstats_cdf_kernel(const float *z, int V, int vec, vpart *part, int c0) {
  DG_PDL_ENTRY();
  vstats_cdf_body<0>(z, V, vec, 0.0f, 1.0f, 0, 1, part, c0);
}

__global__ void __launch_bounds__(VNT) vfuse_cdf_kernel(const float *logits, int V, int vec, float cap, float T,
                                                        int act, int cdf, vpart *part, int c0) {
  DG_PDL_ENTRY();
  vstats_cdf_body<1>(logits, V, vec, cap, T, act, cdf, part, c0);
}

/* Pass 3, one block per position: the statistics from the partials (argmax = first index of the maximum; lse
 * and entropy in double, max prob = exp(g - lse)); a non-finite z reports the position in *bad (atomicMin).
 * Sampled proposal: the first v whose cdf exceeds u * total, with cdf(v) = (running sum of the chunk masses
 * t before v's chunk) + (within the chunk: warps before, then runs of the warp before, then v's run up to v,
 * each level a running sum in order). Each level ends exactly where the next begins, so the cdf is monotone
 * and reaches total at V - 1: the crossing exists and is unique. It is the CPU's sequential cdf up to the
 * order of the double sums (last bits), as was the one-block kernel's. F = 1: the chunk's z = vz(logits). */
template <int F>
__device__ __forceinline__ void vstats_finish_body(const float *z, int V, int vec, int NB, const vpart *part, float cap,
                                                   float T, int mode, uint64_t seed, uint32_t block, uint32_t step,
                                                   const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  __shared__ float sp[VNT * VPAD];
  __shared__ double sr[VNT], sw[VNT / 32];
  __shared__ float shg, shfs;
  __shared__ int shgi, shbad, shb, found;
  __shared__ double shS0, shS1, shpre, shtarget;
  const int c = blockIdx.x, tid = threadIdx.x;
  const vpart *p = part + (size_t)c * NB;
  if (tid < 32) {
    float g; int gi, bd; double S0, S1;
    vcombine(p, NB, g, gi, S0, S1, bd);
    if (tid == 0) { shg = g; shgi = gi; shS0 = S0; shS1 = S1; shfs = (float)S0; shbad = bd; }
  }
  __syncthreads();
  if (shbad) {
    if (tid == 0) atomicMin(bad, c);
    return;
  }
  int prop = shgi;
  if (mode != DG_PROPOSAL_ARGMAX) {
    if (tid == 0) {
      const float u = mode == DG_PROPOSAL_REPLAY_UNIFORM ? uni[c] : proposal_uniform(seed, block, step, (uint32_t)c);
      double total = 0.0;
      for (int b = 0; b < NB; b++) total += p[b].t;
      const double target = (double)u * total;
      double pre = 0.0;
      int bs = NB - 1;
      for (int b = 0; b < NB; b++) {
        if (target < pre + p[b].t) { bs = b; break; }
        pre += p[b].t;
      }
      shb = bs; shpre = pre; shtarget = target;
      found = INT32_MAX;
    }
    __syncthreads();
    const int base = shb * VCH;
    float v[VPT];
    if (F) vzload(z + (size_t)c * V, V, base, vec, cap, T, v);
    else vload(z + (size_t)c * V, V, base, vec, 0.0f, v);
    vchunk_probs(v, V, base, shg, shfs, sp);
    double run = 0.0;
    for (int k = 0; k < VPT; k++) run += (double)sp[tid * VPAD + k];
    sr[tid] = run;
    __syncthreads();
    if ((tid & 31) == 0) { /* the runs of the warp: exclusive running sums in lane order; the warp's total */
      double w = 0.0;
      for (int l = 0; l < 32; l++) { const double x = sr[tid + l]; sr[tid + l] = w; w += x; }
      sw[tid >> 5] = w;
    }
    __syncthreads();
    if (tid == 0) { /* the warps: exclusive running sums in order */
      double w = 0.0;
      for (int i = 0; i < VNT / 32; i++) { const double x = sw[i]; sw[i] = w; w += x; }
    }
    __syncthreads();
    const double pre = shpre, target = shtarget, wp = sw[tid >> 5], lp = sr[tid];
    double r = 0.0;
    for (int k = 0; k < VPT; k++) {
      r += (double)sp[tid * VPAD + k];
      const int v = base + tid * VPT + k;
      if (v < V && pre + (wp + (lp + r)) > target) { atomicMin(&found, v); break; }
    }
    __syncthreads();
    prop = found != INT32_MAX ? found : min(V, base + VCH) - 1; /* (unreachable: the crossing exists) */
  }
  if (tid == 0) {
    const double S0 = shS0, lse = (double)shg + log(S0), ent = log(S0) - shS1 / S0;
    dg_cuda_pos_stats st;
    st.argmax = shgi;
    st.proposal = prop;
    st.entropy = (float)(ent > 0.0 ? ent : 0.0);
    st.max_prob = (float)exp((double)shg - lse);
    out[c] = st;
  }
}

__global__ void __launch_bounds__(VNT) vstats_finish_kernel(const float *z, int V, int vec, int NB, const vpart *part,
                                                            int mode, uint64_t seed, uint32_t block, uint32_t step,
                                                            const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  DG_PDL_ENTRY();
  vstats_finish_body<0>(z, V, vec, NB, part, 0.0f, 1.0f, mode, seed, block, step, uni, out, bad);
}

__global__ void __launch_bounds__(VNT) vfuse_finish_kernel(const float *logits, int V, int vec, int NB,
                                                           const vpart *part, float cap, float T, int mode,
                                                           uint64_t seed, uint32_t block, uint32_t step,
                                                           const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  DG_PDL_ENTRY();
  vstats_finish_body<1>(logits, V, vec, NB, part, cap, T, mode, seed, block, step, uni, out, bad);
}

static int vec_ok(const float *z, int V) { return V % 4 == 0 && ((uintptr_t)z & 15) == 0; }

/* group: positions per launch of the chunk passes (0: all C at once). With a group of a few tens of rows
 * (a few tens of MB), pass 2 finds the z that pass 1 just wrote in the L2 instead of device memory, at the
 * cost of more launches (dev/cuda/step_kernels.cu measures both; DG_VOCAB_GROUP is the backend's choice). */
cudaError_t k_step_stats_g(cudaStream_t s, float *logits, int C, int V, float temperature, int mode, uint64_t seed,
                           uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad,
                           void *ws, int group) {
  const int NB = (V + VCH - 1) / VCH, vec = vec_ok(logits, V), G = group > 0 && group < C ? group : C;
  vpart *part = (vpart *)ws;
  for (int c0 = 0; c0 < C; c0 += G) {
    const int n = C - c0 < G ? C - c0 : G;
    DG_LAUNCH(vstats_part_kernel, dim3(NB, n), VNT, 0, s)(logits, V, vec, temperature, part, c0);
    if (mode != DG_PROPOSAL_ARGMAX) DG_LAUNCH(vstats_cdf_kernel, dim3(NB, n), VNT, 0, s)(logits, V, vec, part, c0);
  }
  DG_LAUNCH(vstats_finish_kernel, C, VNT, 0, s)(logits, V, vec, NB, part, mode, seed, block, step, uni, out, bad);
  return cudaGetLastError();
}

cudaError_t k_step_stats(cudaStream_t s, float *logits, int C, int V, float temperature, int mode, uint64_t seed,
                         uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad,
                         void *ws) {
  return k_step_stats_g(s, logits, C, V, temperature, mode, seed, block, step, uni, out, bad, ws, DG_VOCAB_GROUP);
}

/* The fused chain's statistics (see the top of this part): logits unchanged; store (DGEMMA_VOCAB=zstore, the lab's
 * "v3 z stored"): pass 1 stores z in place (the chain's z: the same vz in registers, the chain's division), the
 * passes after it read the stored z as it is (cap DG_VZ_STORED; callers of k_vocab_sc pass it too, with T 1). */
cudaError_t k_vocab_stats_g(cudaStream_t s, float *logits, int C, int V, float cap, float T, int act, int mode,
                            uint64_t seed, uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out,
                            int32_t *bad, void *ws, int group, int store) {
  const int NB = (V + VCH - 1) / VCH, vec = vec_ok(logits, V), G = group > 0 && group < C ? group : C;
  vpart *part = (vpart *)ws;
  for (int c0 = 0; c0 < C; c0 += G) {
    const int n = C - c0 < G ? C - c0 : G;
    DG_LAUNCH(vfuse_part_kernel, dim3(NB, n), VNT, 0, s)(logits, V, vec, cap, T, act, store, part, c0);
    if (mode != DG_PROPOSAL_ARGMAX) /* after store: z as stored */
      DG_LAUNCH(vfuse_cdf_kernel, dim3(NB, n), VNT, 0, s)(logits, V, vec, store ? DG_VZ_STORED : cap, store ? 1.0f : T,
                                                        act, 1, part, c0);
  }
  DG_LAUNCH(vfuse_finish_kernel, C, VNT, 0, s)(logits, V, vec, NB, part, store ? DG_VZ_STORED : cap,
                                              store ? 1.0f : T, mode, seed, block, step, uni, out, bad);
  return cudaGetLastError();
}

cudaError_t k_vocab_stats(cudaStream_t s, const float *logits, int C, int V, float cap, float T, int act, int mode,
                          uint64_t seed, uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out,
                          int32_t *bad, void *ws, int store) {
  return k_vocab_stats_g(s, const_cast<float *>(logits), C, V, cap, T, act, mode, seed, block, step, uni, out, bad, ws,
                         DG_VOCAB_GROUP, store);
}

__global__ void vz_inplace_kernel(float *x, size_t n, float cap, float T) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = vz(x[i], cap, T);
}

cudaError_t k_vocab_z(cudaStream_t s, float *x, size_t n, float cap, float T) {
  DG_LAUNCH(vz_inplace_kernel, grid_for(n), NT, 0, s)(x, n, cap, T);
  return cudaGetLastError();
}

/* ---- self-conditioning probabilities (spec 5, 4.9) ------------------------ */

/* P[c] = cast(softmax(cast(z[c]))) with the casts to the activation dtype, stored as bf16 for the product with
 * the embedding, in three passes of grid (NB, C): the chunk max of cast(z); the chunk sum in double of
 * expf(cast(z) - mx) about the row max mx (exact: the max of the chunk maxima); P with inv = 1 / (sum of the
 * chunk sums, in a fixed order). The same fp32 values as the one-block kernel; the double sum's order differs
 * (last bits). */
__global__ void __launch_bounds__(VNT) vsc_max_kernel(const float *z, int V, int vec, int act, vpart *part, int c0) {
  DG_PDL_ENTRY();
  __shared__ float sh[VNT / 32];
  const int b = blockIdx.x, c = c0 + blockIdx.y, base = b * VCH;
  float v[VPT];
  vload(z + (size_t)c * V, V, base, vec, -FLT_MAX, v);
  float mx = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < VPT; k++) mx = fmaxf(mx, round_act(v[k], act));
  mx = vblock_max(mx, sh);
  if (threadIdx.x == 0) part[(size_t)c * gridDim.x + b].m = mx;
}

__global__ void __launch_bounds__(VNT) vsc_sum_kernel(const float *z, int V, int vec, int act, vpart *part, int c0) {
  DG_PDL_ENTRY();
  __shared__ double sh[VNT / 32];
  __shared__ float shm;
  const int b = blockIdx.x, c = c0 + blockIdx.y, NB = gridDim.x, base = b * VCH;
  vpart *p = part + (size_t)c * NB;
  float v[VPT];
  vload(z + (size_t)c * V, V, base, vec, 0.0f, v);
  if (threadIdx.x < 32) {
    const float m = vrow_max<0>(p, NB);
    if (threadIdx.x == 0) shm = m;
  }
  __syncthreads();
  const float mx = shm;
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < VPT; k++)
    if (base + vslot(threadIdx.x, k >> 2, k & 3) < V) s += (double)expf(round_act(v[k], act) - mx);
  s = vblock_sum(s, sh);
  if (threadIdx.x == 0) p[b].s0 = s;
}

/* The write pass: F = 0 from z and the chain's partials (m, s0); F = 1 from z = vz(logits) and the fused
 * partials (scm, scs). */
template <int F>
__device__ __forceinline__ void vsc_write_body(const float *z, bf16 *P, int V, int vec, float cap, float T, int act,
                                               const vpart *part, int c0) {
  __shared__ float shm, shinv;
  const int b = blockIdx.x, c = c0 + blockIdx.y, NB = gridDim.x, base = b * VCH, tid = threadIdx.x;
  const vpart *p = part + (size_t)c * NB;
  float v[VPT];
  if (F) vzload(z + (size_t)c * V, V, base, vec, cap, T, v);
  else vload(z + (size_t)c * V, V, base, vec, 0.0f, v);
  if (tid < 32) {
    const float m = vrow_max<F>(p, NB);
    double s = 0.0;
    for (int i = tid; i < NB; i += 32) s += F ? p[i].scs : p[i].s0;
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (tid == 0) { shm = m; shinv = (float)(1.0 / s); }
  }
  __syncthreads();
  const float mx = shm, inv = shinv;
  bf16 *prow = P + (size_t)c * V;
#pragma unroll
  for (int j = 0; j < VPT / 4; j++) {
    const int e = base + vslot(tid, j, 0);
    float o[4];
#pragma unroll
    for (int q = 0; q < 4; q++) o[q] = round_act(expf(round_act(v[4 * j + q], act) - mx) * inv, act);
    if (vec && e + 3 < V) {
      stb4(prow + e, o[0], o[1], o[2], o[3]);
    } else {
      for (int q = 0; q < 4; q++)
        if (e + q < V) prow[e + q] = __float2bfloat16_rn(o[q]);
    }
  }
}

__global__ void __launch_bounds__(VNT) vsc_write_kernel(const float *z, bf16 *P, int V, int vec, int act,
                                                        const vpart *part, int c0) {
  DG_PDL_ENTRY();
  vsc_write_body<0>(z, P, V, vec, 0.0f, 1.0f, act, part, c0);
}

__global__ void __launch_bounds__(VNT) vfuse_write_kernel(const float *logits, bf16 *P, int V, int vec, float cap,
                                                          float T, int act, const vpart *part, int c0) {
  DG_PDL_ENTRY();
  vsc_write_body<1>(logits, P, V, vec, cap, T, act, part, c0);
}

cudaError_t k_sc_probs_g(cudaStream_t s, const float *z, bf16 *P, int C, int V, int act_dtype, void *ws, int group) {
  const int NB = (V + VCH - 1) / VCH, vec = vec_ok(z, V) && ((uintptr_t)P & 7) == 0;
  const int G = group > 0 && group < C ? group : C;
  vpart *part = (vpart *)ws;
  for (int c0 = 0; c0 < C; c0 += G) { /* a group's three passes: the second and third read z from the L2 */
    const int n = C - c0 < G ? C - c0 : G;
    DG_LAUNCH(vsc_max_kernel, dim3(NB, n), VNT, 0, s)(z, V, vec, act_dtype, part, c0);
    DG_LAUNCH(vsc_sum_kernel, dim3(NB, n), VNT, 0, s)(z, V, vec, act_dtype, part, c0);
    DG_LAUNCH(vsc_write_kernel, dim3(NB, n), VNT, 0, s)(z, P, V, vec, act_dtype, part, c0);
  }
  return cudaGetLastError();
}

cudaError_t k_sc_probs(cudaStream_t s, const float *z, bf16 *P, int C, int V, int act_dtype, void *ws) {
  return k_sc_probs_g(s, z, P, C, V, act_dtype, ws, DG_VOCAB_GROUP);
}

/* The fused chain's probabilities from z = vz(logits, cap, T); have: what k_vocab_stats left in ws for the same
 * logits, cap, T and act (0 nothing, 1 the sc chunk maxima: argmax proposals, 2 the sums too: sampled); the
 * passes it did not do run first. */
cudaError_t k_vocab_sc_g(cudaStream_t s, const float *logits, bf16 *P, int C, int V, float cap, float T, int act,
                         void *ws, int have, int group) {
  const int NB = (V + VCH - 1) / VCH, vec = vec_ok(logits, V) && ((uintptr_t)P & 7) == 0;
  const int vl = vec_ok(logits, V), G = group > 0 && group < C ? group : C;
  vpart *part = (vpart *)ws;
  for (int c0 = 0; c0 < C; c0 += G) {
    const int n = C - c0 < G ? C - c0 : G;
    if (have < 1)
      DG_LAUNCH(vfuse_part_kernel, dim3(NB, n), VNT, 0, s)(const_cast<float *>(logits), V, vl, cap, T, act, 0, part, c0);
    if (have < 2) DG_LAUNCH(vfuse_cdf_kernel, dim3(NB, n), VNT, 0, s)(logits, V, vl, cap, T, act, 0, part, c0);
    DG_LAUNCH(vfuse_write_kernel, dim3(NB, n), VNT, 0, s)(logits, P, V, vec, cap, T, act, part, c0);
  }
  return cudaGetLastError();
}

cudaError_t k_vocab_sc(cudaStream_t s, const float *logits, bf16 *P, int C, int V, float cap, float T, int act,
                       void *ws, int have) {
  return k_vocab_sc_g(s, logits, P, C, V, cap, T, act, ws, have, DG_VOCAB_GROUP);
}

/* Used by dg_cuda_info to ask whether this build has code for the GPU. */
cudaError_t k_probe(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, softcap_kernel);
}
