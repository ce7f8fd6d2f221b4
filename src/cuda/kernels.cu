/* kernels.cu: the CUDA kernels of the forward pass and the sampler, except
 * the MoE (moe.cu). Correctness first, with a sane structure: one block per
 * token row for the fused norm kernels, one warp per (query, head) for
 * attention with an online softmax, one block per canvas position for the
 * sampler statistics. fp32 arithmetic everywhere; bf16 only where a value
 * feeds a matrix product or the KV cache (as the bf16 reference does).
 *
 * Math: spec sections 4.1 (RMSNorm, GeGLU, softcap), 4.3 (rope), 4.4-4.5
 * (layer, masks), 4.6 (router is in moe.cu), 5 and 4.9 (self-conditioning
 * casts), 6.1 (sampler statistics), src/rng.c (Philox4x32-10). */
#include <float.h>
#include <math.h>

#include "cuda/common.cuh"

#define NT 256 /* threads of the row kernels */

/* ---- reductions ---------------------------------------------------------- */

/* Sum over the block (blockDim.x a multiple of 32, at most 1024). sh: 32 slots. */
template <typename T> __device__ T block_sum(T v, T *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads(); /* sh may still be read by a previous call */
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < nw ? sh[l] : T(0);
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

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

cudaError_t k_rmsnorm(cudaStream_t s, const float *x, const float *w, float *yf, bf16 *yb, int T, int H, float eps) {
  DG_LAUNCH(rmsnorm_kernel, T, NT, 0, s)(x, w, yf, yb, H, eps);
  return cudaGetLastError();
}

/* Spec 4.4 steps 4-6 inputs: r = x + post_attn_norm(o); dense input
 * pre_ff(r), expert input pre_ff2(r), router input rms(r) * scale * H^-1/2. */
__global__ void attn_residual_kernel(float *x, const float *o, const float *w_post, const float *w_ff,
                                     const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe, float *u,
                                     int H, float eps) {
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

cudaError_t k_attn_residual(cudaStream_t s, float *x, const float *o, const float *w_post, const float *w_ff,
                            const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe, float *u, int T,
                            int H, float eps) {
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

/* h = gelu_tanh(gate) * up from gu [T, 2I] (gate columns first). */
__global__ void geglu_kernel(const float *gu, bf16 *h, int I, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / I, j = i % I;
    h[i] = __float2bfloat16_rn(gelu_tanh(gu[t * 2 * I + j]) * gu[t * 2 * I + I + j]);
  }
}

static int grid_for(size_t n) {
  size_t b = (n + NT - 1) / NT;
  return (int)(b < 65535 ? (b ? b : 1) : 65535);
}

cudaError_t k_geglu(cudaStream_t s, const float *gu, bf16 *h, int T, int I) {
  size_t n = (size_t)T * I;
  DG_LAUNCH(geglu_kernel, grid_for(n), NT, 0, s)(gu, h, I, n);
  return cudaGetLastError();
}

__global__ void add_kernel(float *x, const float *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] += y[i];
}

cudaError_t k_add(cudaStream_t s, float *x, const float *y, size_t n) {
  DG_LAUNCH(add_kernel, grid_for(n), NT, 0, s)(x, y, n);
  return cudaGetLastError();
}

__global__ void softcap_kernel(float *x, size_t n, float cap) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = tanhf(x[i] / cap) * cap;
}

cudaError_t k_softcap(cudaStream_t s, float *x, size_t n, float cap) {
  DG_LAUNCH(softcap_kernel, grid_for(n), NT, 0, s)(x, n, cap);
  return cudaGetLastError();
}

/* ---- q/k/v post-processing (spec 4.4 step 2, rope 4.3) -------------------- */

/* One block per (token t, head slot): slots [0, NH) are query heads, [NH,
 * NH+NKV) key heads, [NH+NKV, NH+2NKV) value heads. The raw projections sit
 * in qkv[t] as [q heads | k heads | v heads]; without v (K=V full layers) v
 * reads the raw k. q: rmsnorm(q_norm) then rope -> q [T, NH, D] fp32; k:
 * rmsnorm(k_norm) then rope -> kc; v: rmsnorm without weight -> vc. Rope is
 * rotate-half (pair i with i + D/2), angle inv_freq[i] * position in fp32. */
__global__ void qkv_post_kernel(const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S, const float *q_norm,
                                const float *k_norm, const float *inv_freq, int NH, int NKV, int D, int has_v,
                                int32_t pos0, const int32_t *tpos, float eps) {
  __shared__ float sh[32];
  const int t = blockIdx.x, slot = blockIdx.y;
  const int32_t pos = tpos ? tpos[t] : pos0 + t; /* scattered positions: the compacted decoder (spec 7.4) */
  const float *row = qkv + (size_t)t * ld;
  const float *src;
  int kind; /* 0 q, 1 k, 2 v */
  int g = 0;
  if (slot < NH) { kind = 0; src = row + (size_t)slot * D; }
  else if (slot < NH + NKV) { kind = 1; g = slot - NH; src = row + (size_t)NH * D + (size_t)g * D; }
  else {
    kind = 2;
    g = slot - NH - NKV;
    src = row + (size_t)NH * D + (size_t)(has_v ? NKV * D : 0) + (size_t)g * D;
  }
  const float r = rms_scale(block_sumsq(src, D, sh), D, eps);
  if (kind == 2) {
    bf16 *dst = vc + ((size_t)g * S + pos) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = __float2bfloat16_rn(src[i] * r);
    return;
  }
  const float *w = kind == 0 ? q_norm : k_norm;
  const int h = D / 2;
  const float p = (float)pos;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    float a = (src[i] * r) * w[i], b = (src[i + h] * r) * w[i + h];
    float ang = inv_freq[i] * p, cs = cosf(ang), sn = sinf(ang);
    float y0 = a * cs - b * sn, y1 = b * cs + a * sn;
    if (kind == 0) {
      float *dst = q + ((size_t)t * NH + slot) * D;
      dst[i] = y0;
      dst[i + h] = y1;
    } else {
      bf16 *dst = kc + ((size_t)g * S + pos) * D;
      dst[i] = __float2bfloat16_rn(y0);
      dst[i + h] = __float2bfloat16_rn(y1);
    }
  }
}

cudaError_t k_qkv_post(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                       const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV, int D,
                       int has_v, int32_t pos0, float eps) {
  dim3 grid(T, NH + 2 * NKV);
  int nt = D >= 256 ? 128 : D >= 64 ? 64 : 32;
  DG_LAUNCH(qkv_post_kernel, grid, nt, 0, s)(qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, NH, NKV, D, has_v, pos0, (const int32_t *)NULL, eps);
  return cudaGetLastError();
}

cudaError_t k_qkv_post_at(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                          const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV,
                          int D, int has_v, const int32_t *tpos, float eps) {
  dim3 grid(T, NH + 2 * NKV);
  int nt = D >= 256 ? 128 : D >= 64 ? 64 : 32;
  DG_LAUNCH(qkv_post_kernel, grid, nt, 0, s)(qkv, ld, q, kc, vc, S, q_norm, k_norm, inv_freq, NH, NKV, D, has_v, 0, tpos, eps);
  return cudaGetLastError();
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

cudaError_t k_ffn_combine(cudaStream_t s, float *x, const float *dense, const float *y, const int32_t *slot_row,
                          const int32_t *topk_idx, const float *topk_w, const float *w_ff1, const float *w_ff2,
                          const float *w_ff, float scalar, int T, int H, int K, float eps) {
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

/* ---- sampler statistics (spec 6.1 steps 2-4) ------------------------------ */

/* Philox4x32-10 with Random123's constants, as src/rng.c. */
__device__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    uint32_t n0 = hi1 ^ c[1] ^ k0, n1 = lo1, n2 = hi0 ^ c[3] ^ k1, n3 = lo0;
    c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

/* Uniform in [0,1) of draw (seed, DG_RNG_PROPOSAL = 2, block, step, i): src/rng.h. */
__device__ float proposal_uniform(uint64_t seed, uint32_t block, uint32_t step, uint32_t i) {
  uint32_t c[4] = {i / 4, step, block, 2u};
  philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
  return (float)(c[i % 4] >> 8) * (1.0f / 16777216.0f);
}

#define SNT 512 /* threads of the per-position kernels */

/* One block per canvas position. In place z = logits / T; argmax (first
 * index of the maximum); lse and entropy in double as the CPU
 * (dg_position_stats); proposal = argmax, or #{v : cdf_v <= u * total} with
 * the cdf of the fp32 probabilities accumulated in double, each thread
 * owning a contiguous chunk (chunk sums scanned in order). */
__global__ void step_stats_kernel(float *logits, int V, float temperature, int mode, uint64_t seed, uint32_t block,
                                  uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  __shared__ float shf[32];
  __shared__ int shi[32];
  __shared__ double shd[32];
  __shared__ double chunk[SNT];
  __shared__ int found;
  const int c = blockIdx.x, tid = threadIdx.x;
  float *z = logits + (size_t)c * V;
  float mx = -FLT_MAX;
  int amax = INT32_MAX, nonfinite = 0;
  for (int v = tid; v < V; v += blockDim.x) {
    float zv = z[v] / temperature;
    z[v] = zv;
    if (!isfinite(zv)) nonfinite = 1;
    if (zv > mx) { mx = zv; amax = v; } /* strided ascending: first index per thread */
  }
  /* block argmax: max value, then the lowest index holding it */
  float m = mx;
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((tid & 31) == 0) shf[tid >> 5] = m;
  __syncthreads();
  if (tid < 32) {
    float mm = tid < (int)(blockDim.x >> 5) ? shf[tid] : -FLT_MAX;
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (tid == 0) shf[0] = mm;
  }
  __syncthreads();
  const float gmax = shf[0];
  int cand = mx == gmax ? amax : INT32_MAX;
  for (int o = 16; o; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
  __syncthreads();
  if ((tid & 31) == 0) shi[tid >> 5] = cand;
  __syncthreads();
  if (tid < 32) {
    int cc = tid < (int)(blockDim.x >> 5) ? shi[tid] : INT32_MAX;
    for (int o = 16; o; o >>= 1) cc = min(cc, __shfl_xor_sync(0xffffffffu, cc, o));
    if (tid == 0) shi[0] = cc;
  }
  __syncthreads();
  const int gamax = shi[0];
  int anybad = block_sum(nonfinite, shi);
  if (anybad) {
    if (tid == 0) atomicMin(bad, c);
    return;
  }
  double sum = 0.0;
  for (int v = tid; v < V; v += blockDim.x) sum += exp((double)z[v] - (double)gmax);
  sum = block_sum(sum, shd);
  const double lse = (double)gmax + log(sum);
  double ent = 0.0;
  for (int v = tid; v < V; v += blockDim.x) {
    double lp = (double)z[v] - lse;
    ent -= exp(lp) * lp;
  }
  ent = block_sum(ent, shd);
  int prop = gamax;
  if (mode != DG_PROPOSAL_ARGMAX) {
    const float u = mode == DG_PROPOSAL_REPLAY_UNIFORM ? uni[c] : proposal_uniform(seed, block, step, (uint32_t)c);
    const float fs = (float)sum;
    const int per = (V + blockDim.x - 1) / blockDim.x;
    const int v0 = tid * per, v1 = min(V, v0 + per);
    double cs = 0.0;
    for (int v = v0; v < v1; v++) cs += (double)(expf(z[v] - gmax) / fs);
    chunk[tid] = cs;
    if (tid == 0) found = V - 1;
    __syncthreads();
    if (tid == 0) { /* exclusive scan of the chunk sums, in order */
      double run = 0.0;
      for (int i = 0; i < (int)blockDim.x; i++) { double x = chunk[i]; chunk[i] = run; run += x; }
      shd[0] = run;
    }
    __syncthreads();
    const double target = (double)u * shd[0];
    const double pre = chunk[tid];
    if (v0 < v1 && pre <= target && pre + cs > target) {
      double run = 0.0;
      for (int v = v0; v < v1; v++) {
        run += (double)(expf(z[v] - gmax) / fs);
        if (pre + run > target) { found = v; break; }
      }
    }
    __syncthreads();
    prop = found;
  }
  if (tid == 0) {
    dg_cuda_pos_stats st;
    st.argmax = gamax;
    st.proposal = prop;
    st.entropy = (float)(ent > 0.0 ? ent : 0.0);
    st.max_prob = (float)exp((double)gmax - lse);
    out[c] = st;
  }
}

cudaError_t k_step_stats(cudaStream_t s, float *logits, int C, int V, float temperature, int mode, uint64_t seed,
                         uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  DG_LAUNCH(step_stats_kernel, C, SNT, 0, s)(logits, V, temperature, mode, seed, block, step, uni, out, bad);
  return cudaGetLastError();
}

/* ---- self-conditioning probabilities (spec 5, 4.9) ------------------------ */

__device__ __forceinline__ float round_act(float x, int act) {
  if (act == DG_CUDA_BF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (act == DG_CUDA_F16) return __half2float(__float2half_rn(x));
  return x;
}

/* P[c] = cast(softmax(cast(z[c]))) with the casts to the activation dtype,
 * stored as bf16 for the product with the embedding. */
__global__ void sc_probs_kernel(const float *z, bf16 *P, int V, int act) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int c = blockIdx.x;
  const float *zr = z + (size_t)c * V;
  float mx = -FLT_MAX;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, round_act(zr[v], act));
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) shf[threadIdx.x >> 5] = mx;
  __syncthreads();
  if (threadIdx.x < 32) {
    float mm = threadIdx.x < (blockDim.x >> 5) ? shf[threadIdx.x] : -FLT_MAX;
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (threadIdx.x == 0) shf[0] = mm;
  }
  __syncthreads();
  mx = shf[0];
  double sum = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += (double)expf(round_act(zr[v], act) - mx);
  sum = block_sum(sum, shd);
  const float inv = (float)(1.0 / sum);
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    P[(size_t)c * V + v] = __float2bfloat16_rn(round_act(expf(round_act(zr[v], act) - mx) * inv, act));
}

cudaError_t k_sc_probs(cudaStream_t s, const float *z, bf16 *P, int C, int V, int act_dtype) {
  DG_LAUNCH(sc_probs_kernel, C, SNT, 0, s)(z, P, V, act_dtype);
  return cudaGetLastError();
}

/* Used by dg_cuda_info to ask whether this build has code for the GPU. */
cudaError_t k_probe(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, softcap_kernel);
}
