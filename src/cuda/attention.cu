/* attention.cu: the layer's attention (spec 4.4 step 3, masks 4.5) over the
 * KV cache, four kernels:
 *   1. attention_kernel: one warp per (query, head), sequential over the
 *      keys, fp32 throughout (the first kernel; kept for head dims the
 *      tensor-core kernel does not take, and as the lab's version 1);
 *   2. flash_kernel: tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate)
 *      with an online softmax over key tiles staged in shared memory by
 *      cp.async, never a score matrix in device memory (Dao, "FlashAttention-2",
 *      2023, algorithm 1), and the keys split across blocks when the queries
 *      alone give too few blocks (flash-decoding: partial (O, m, l) per split,
 *      merged by flash_combine_kernel);
 *   3. flash_pair_kernel (lab version 6: the passes' default since session 13, and since session 25 where the
 *      device runs no sm_90a code; 7, 8 and flash_kernel through DGEMMA_ATTN): flash_kernel's pieces with warp
 *      pairs splitting the head dim (attention.cuh, above fp_cfg);
 *   4. att_wq_kernel (version 15, attention_wq.cuh; the passes' default since session 25 where the device runs this
 *      build's sm_90a code, k_attention_choose below): Q K^T and P V on Hopper's wgmma, whole rows per warp.
 * The pieces the kernels share with the attention lab (dev/cuda/attention.cu) are in attention.cuh.
 * All: scale 1.0, no softcap (spec 4.4); keys are the cache slots [lo, hi):
 *   encoder (causal): hi = pos + 1, lo = 0 on full layers, hi - window on
 *     sliding ones;
 *   decoder: hi = pos0 + C (the canvas K/V sit in slots pos0.., never
 *     committed), lo = 0 on full layers, pos0 - (window - 1) on sliding ones.
 * q fp32 [nq, NH, D]; kc, vc bf16 [NKV, S, D], key (position) j in slot j % S (full layers: S past every
 * position; sliding layers: a ring of at least window - 1 + max(canvas, encoder chunk) slots, so the keys
 * one pass reads never share a slot); out bf16 [nq, NH, D].
 *
 * What flash_kernel (and flash_pair_kernel) rounds (the bound tests/test_cuda.c checks, derived in
 * its header): q to bf16 before QK (relative 2^-9 per element), the
 * probabilities p = exp(s - m) to bf16 before PV (relative 2^-9); the row sums
 * l and the output accumulate in fp32 from the unrounded p. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/attention.cuh"
#include "cuda/attention_wq.cuh"
#include "cuda/attention_wqc.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

/* ---- version 1: one warp per (query, head) -------------------------------- */

/* Block (t, y): W warps, warp w serving query head h = y*W + w; W divides
 * G = NH/NKV, so the warps of a block share one KV group g = h / G and read
 * the same K/V rows (at most 8 warps: 256 threads). Lane l holds dims l + 32 i,
 * i < NPL = ceil(D/32). Keys are the cache slots [lo, hi) of the layer:
 *   encoder (causal): hi = pos + 1 (the chunk's K/V are already in the
 *     cache), lo = 0 on full layers, hi - window on sliding layers;
 *   decoder: hi = pos0 + T (the canvas K/V sit in slots pos0.., never
 *     committed), lo = 0 on full layers, pos0 - (window - 1) on sliding ones.
 * Scale 1.0, no softcap; online softmax in fp32. out: bf16 [T, NH*D]. */
template <int NPL>
__global__ void __launch_bounds__(256) attention_kernel(const float *q, const bf16 *kc, const bf16 *vc, bf16 *out, int S, int T, int NH,
                                 int NKV, int D, int32_t pos0, int causal, int is_full, int window) {
  DG_PDL_ENTRY();
  const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, W = blockDim.x >> 5;
  const int G = NH / NKV, h = blockIdx.y * W + w, g = h / G;
  const int32_t pos = pos0 + t;
  int32_t lo, hi;
  if (causal) {
    hi = pos + 1;
    lo = is_full ? 0 : max(0, hi - window);
  } else {
    hi = pos0 + T;
    lo = is_full ? 0 : max(0, pos0 - (window - 1));
  }
  float qr[NPL], acc[NPL];
  const float *qv = q + ((size_t)t * NH + h) * D;
#pragma unroll
  for (int i = 0; i < NPL; i++) {
    int d = lane + 32 * i;
    qr[i] = d < D ? qv[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const bf16 *kb = kc + (size_t)g * S * D, *vb = vc + (size_t)g * S * D;
  for (int32_t j = lo; j < hi; j++) {
    const bf16 *kr = kb + (size_t)(j % S) * D; /* slot of key j: a ring of S slots on sliding layers */
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
      int d = lane + 32 * i;
      if (d < D) s += qr[i] * __bfloat162float(kr[d]);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float mn = fmaxf(m, s);
    float corr = expf(m - mn); /* m = -inf on the first key: corr = 0 */
    float p = expf(s - mn);
    l = l * corr + p;
    const bf16 *vr = vb + (size_t)(j % S) * D;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
      int d = lane + 32 * i;
      float v = d < D ? __bfloat162float(vr[d]) : 0.0f;
      acc[i] = acc[i] * corr + p * v;
    }
    m = mn;
  }
  const float inv = 1.0f / l;
  bf16 *o = out + ((size_t)t * NH + h) * D;
#pragma unroll
  for (int i = 0; i < NPL; i++) {
    int d = lane + 32 * i;
    if (d < D) o[d] = __float2bfloat16_rn(acc[i] * inv);
  }
}

/* nq query rows (grid x); T is the kernel's T (decoder: keys end at pos0 + T). */
static cudaError_t attention_launch(cudaStream_t s, const float *q, const bf16 *kc, const bf16 *vc, bf16 *out, int S,
                                    int nq, int T, int NH, int NKV, int D, int32_t pos0, int causal, int is_full,
                                    int window) {
  const int G = NH / NKV;
  int W = 8; /* warps per block: the largest of 8, 4, 2, 1 that divides G */
  while (G % W) W /= 2;
  dim3 grid(nq, NH / W);
  int threads = 32 * W;
#define ATT(n) DG_LAUNCH(attention_kernel<n>, grid, threads, 0, s)(q, kc, vc, out, S, T, NH, NKV, D, pos0, causal, is_full, window)
  if (D <= 32) ATT(1);
  else if (D <= 64) ATT(2);
  else if (D <= 128) ATT(4);
  else if (D <= 256) ATT(8);
  else ATT(16);
#undef ATT
  return cudaGetLastError();
}

/* ---- tensor-core attention ---------------------------------------------- */

/* Block tile: BM = 16 WARPS rows of (query t, head h of the KV group g) pairs, row
 * r = t * G + (h - g G), 16 per warp; grid (row tiles, NKV * D / DV value
 * slices, key splits). D the QK head dim, DV the width of the output slice a
 * block owns (its O accumulator: 16 x DV fp32 per warp, so DV <= 256 keeps it
 * in registers; a 512-wide head is two slices that both compute QK), BK keys
 * per tile. Shared memory: Q [BM, D], K [2][BK, D], V [2][BK, DV] bf16, rows
 * of 16-byte chunks XOR-swizzled by (row % 8) so ldmatrix is conflict-free. */
template <int D, int DV, int BK, int WARPS> struct fa_cfg {
  static constexpr int NDV = D / DV, BM = 16 * WARPS;
  static constexpr int QB = BM * D * 2, KB = BK * D * 2, VB = BK * DV * 2;
  static constexpr int SMEM = QB + 2 * (KB + VB);
};

/* flash_kernel's pieces (one key tile, one warp's 16 rows; each lane holds rows lane / 4 and lane / 4 + 8):
 * fa_scores: s = Q K^T of the tile (Q in Qs, K tile in kt, swizzled; D / 16 steps of m16n8k16). */
template <int D, int BK>
__device__ __forceinline__ void fa_scores(float (&s)[BK / 8][4], const char *Qs, const char *kt, int w, int lane) {
#pragma unroll
  for (int i = 0; i < BK / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 4
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t qa[4];
    dg_ldsm_x4(qa, Qs + fa_swz<D>(16 * w + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < BK / 16; np++) {
      uint32_t kf[4];
      dg_ldsm_x4(kf, kt + fa_swz<D>(16 * np + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
      dg_mma_bf16(s[2 * np], qa, kf);
      dg_mma_bf16(s[2 * np + 1], qa, kf + 2);
    }
  }
}

/* fa_online_pv: fa_softmax, then o += P V over the V tile vt. */
template <int DV, int BK>
__device__ __forceinline__ void fa_online_pv(const float (&s)[BK / 8][4], float (&m)[2], float (&l)[2],
                                             float (&o)[DV / 8][4], const char *vt, int lane) {
  uint32_t pa[BK / 16][4];
  fa_softmax<DV, BK>(s, m, l, o, pa);
#pragma unroll
  for (int j = 0; j < BK / 16; j++) {
#pragma unroll
    for (int dp = 0; dp < DV / 16; dp++) {
      uint32_t vf[4];
      dg_ldsm_x4_t(vf, vt + fa_swz<DV>(16 * j + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)));
      dg_mma_bf16(o[2 * dp], pa[j], vf);
      dg_mma_bf16(o[2 * dp + 1], pa[j], vf + 2);
    }
  }
}

template <int D, int DV, int BK, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, 1) flash_kernel(fa_args a) {
  DG_PDL_ENTRY();
  typedef fa_cfg<D, DV, BK, WARPS> C;
  constexpr int BM = C::BM, NTH = 32 * WARPS;
  DG_DYN_SMEM(uint4, fa_smem);
  char *sm = (char *)fa_smem;
  char *Qs = sm, *Ks = sm + C::QB, *Vs = sm + C::QB + 2 * C::KB;
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int G = a.NH / a.NKV, R = a.nq * G, r0 = blockIdx.x * BM;
  const int g = blockIdx.y / C::NDV, dv0 = (blockIdx.y % C::NDV) * DV, z = blockIdx.z;
  int blo, bhi;
  fa_range(a, r0, G, BM, &blo, &bhi);
  const int nt_all = (bhi - blo + BK - 1) / BK, per = (nt_all + a.n_split - 1) / a.n_split;
  const int zlo = blo + z * per * BK, zhi = min(bhi, zlo + per * BK);
  const int ntile = zhi > zlo ? (zhi - zlo + BK - 1) / BK : 0;
  const bf16 *kg = a.kc + (size_t)g * a.S * D, *vg = a.vc + (size_t)g * a.S * D + dv0;

  /* Q tile: fp32 -> bf16, rows past R zero */
  fa_load_q<D, BM, NTH>(a, Qs, r0, R, G, g, tid, [](int r, int ch) { return fa_swz<D>(r, ch); });
  auto load_kv = [&](int it, int buf) {
    const int kb = zlo + it * BK, sb = kb % a.S; /* the tile's first slot: one modulo per tile, then wraps */
    char *kd = Ks + buf * C::KB, *vd = Vs + buf * C::VB;
    for (int i = tid; i < BK * (D / 8); i += NTH) {
      const int r = i / (D / 8), ch = i % (D / 8), ok = kb + r < zhi;
      int sl = sb + r; /* sb < S, and r < S for every key read (a pass's keys never share a slot): one wrap at most */
      sl -= sl >= a.S ? a.S : 0;
      dg_cp_async16(kd + fa_swz<D>(r, ch), kg + (size_t)(ok ? sl : sb) * D + ch * 8, ok ? 16 : 0);
    }
    for (int i = tid; i < BK * (DV / 8); i += NTH) {
      const int r = i / (DV / 8), ch = i % (DV / 8), ok = kb + r < zhi;
      int sl = sb + r; /* sb < S, and r < S for every key read (a pass's keys never share a slot): one wrap at most */
      sl -= sl >= a.S ? a.S : 0;
      dg_cp_async16(vd + fa_swz<DV>(r, ch), vg + (size_t)(ok ? sl : sb) * D + ch * 8, ok ? 16 : 0);
    }
    dg_cp_commit();
  };

  float o[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  /* this lane's rows (r0 + 16 w + lane / 4, + 8) as query indices, for the causal mask */
  const int rl = 16 * w + (lane >> 2);
  const int tq0 = (r0 + rl) / G, tq1 = (r0 + rl + 8) / G;
  const int R_first = r0 / G, R_last = (min(r0 + BM, R) - 1) / G;

  if (ntile > 0) load_kv(0, 0);
  for (int it = 0; it < ntile; it++) {
    const int buf = it & 1, kb = zlo + it * BK;
    if (it + 1 < ntile) {
      load_kv(it + 1, buf ^ 1);
      dg_cp_wait<1>();
    } else {
      dg_cp_wait<0>();
    }
    __syncthreads();
    const char *kt = Ks + buf * C::KB, *vt = Vs + buf * C::VB;
    float s[BK / 8][4];
    fa_scores<D, BK>(s, Qs, kt, w, lane);
    fa_mask<BK>(a, s, kb, zhi, tq0, tq1, R_first, R_last, lane);
    fa_online_pv<DV, BK>(s, m, l, o, vt, lane);
    __syncthreads(); /* the next iteration's copy overwrites this buffer */
  }
  fa_store<D, DV>(a, o, m, l, r0, rl, R, G, g, dv0, z, lane);
}

/* ---- version 6: warp pairs split the head dim (flash_pair_kernel) --------------------------------------------
 * The design, MT (version 7), ST (version 8) and the key splits: attention.cuh, above fp_cfg; the block's work is
 * fp_pair_block there (so that the lab builds its versions 9-11 from the same body). */
template <int D, int BK, int MT, int ST>
__global__ void __launch_bounds__(256, 1) flash_pair_kernel(fa_args a) {
  DG_PDL_ENTRY();
  fp_pair_block<D, BK, MT, ST, 4 / MT>(a, [](int) { __syncthreads(); });
}

/* Merge the key splits of one output row per block (D / 4 threads, 4 columns
 * each): O = sum_z 2^((m_z - M) log2 e) O_z / sum_z 2^(...) l_z, M = max m_z. */
__global__ void flash_combine_kernel(const float *part, bf16 *out, int n_split, size_t NR, int D) {
  DG_PDL_ENTRY();
  const size_t row = blockIdx.x;
  const float *ml = part + (size_t)n_split * NR * D;
  float M = -INFINITY;
  for (int z = 0; z < n_split; z++) M = fmaxf(M, ml[((size_t)z * NR + row) * 2]);
  const float mu = M == -INFINITY ? 0.0f : M * FA_L2E;
  float L = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int c = 4 * threadIdx.x;
  for (int z = 0; z < n_split; z++) {
    const float wz = exp2f(ml[((size_t)z * NR + row) * 2] * FA_L2E - mu);
    L += wz * ml[((size_t)z * NR + row) * 2 + 1];
    const float4 v = *(const float4 *)(part + ((size_t)z * NR + row) * D + c);
    acc[0] += wz * v.x; acc[1] += wz * v.y; acc[2] += wz * v.z; acc[3] += wz * v.w;
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  uint32_t *dst = (uint32_t *)(out + row * D + c);
  dst[0] = fa_pack(acc[0] * inv, acc[1] * inv);
  dst[1] = fa_pack(acc[2] * inv, acc[3] * inv);
}

template <int D, int DV, int BK, int WARPS>
static cudaError_t flash_launch(cudaStream_t s, const dg_att_ws *ws, fa_args a, int old_splits = 0) {
  typedef fa_cfg<D, DV, BK, WARPS> C;
  const int G = a.NH / a.NKV, R = a.nq * G;
  const int bx = (R + C::BM - 1) / C::BM, by = a.NKV * C::NDV;
  void (*kern)(fa_args) = flash_kernel<D, DV, BK, WARPS>;
  static int per_sm = 0; /* one attribute call and occupancy query per instantiation */
  if (!per_sm) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 32 * WARPS, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
  }
  /* keys of the widest block before splitting */
  int lo, hi;
  if (a.causal) { hi = a.pos0 + a.nq; lo = a.is_full ? 0 : max(0, a.pos0 + 1 - a.window); }
  else { hi = a.kv_hi; lo = a.is_full ? 0 : max(0, a.pos0 - (a.window - 1)); }
  const int tiles = (hi - lo + BK - 1) / BK;
  int ns = 1;
  if (!a.causal && ws && ws->part) {
    ns = fa_splits(bx * by, tiles, per_sm * sm_count(), old_splits);
    const size_t NR = (size_t)a.nq * a.NH;
    while (ns > 1 && (size_t)ns * NR * (D + 2) > ws->n) ns--;
  }
  a.n_split = ns;
  const dim3 grid(bx, by, ns);
  DG_LAUNCH(kern, grid, 32 * WARPS, C::SMEM, s)(a);
  if (ns > 1) DG_LAUNCH(flash_combine_kernel, (unsigned)((size_t)a.nq * a.NH), D / 4, 0, s)(a.part, a.out, ns, (size_t)a.nq * a.NH, D);
  return cudaGetLastError();
}

template <int D, int BK, int MT, int ST = 2>
static cudaError_t flash_pair_launch(cudaStream_t s, const dg_att_ws *ws, fa_args a) {
  typedef fp_cfg<D, BK, MT, ST> C;
  const int G = a.NH / a.NKV, R = a.nq * G, bx = (R + C::BM - 1) / C::BM;
  void (*kern)(fa_args) = flash_pair_kernel<D, BK, MT, ST>;
  static int per_sm = 0;
  if (!per_sm) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
  }
  const int ns = fa_choose_splits(ws, a, bx * a.NKV, BK, per_sm, D);
  a.n_split = ns;
  DG_LAUNCH(kern, dim3(bx, a.NKV, ns), 256, C::SMEM, s)(a);
  if (ns > 1) {
    const size_t NR = (size_t)a.nq * a.NH;
    constexpr int RPB = 256 / (D / 8); /* rows per combine block */
    DG_LAUNCH(fp_combine_kernel<D>, (unsigned)((NR + RPB - 1) / RPB), 256, 0, s)(a.part, a.out, ns, NR);
  }
  return cudaGetLastError();
}

int k_attention_flash_ok(int D, int NH, int NKV) {
  return (D == 64 || D == 128 || D == 256 || D == 512) && NKV > 0 && NH % NKV == 0;
}

cudaError_t k_attention_any(cudaStream_t s, const dg_att_ws *ws, int version, const float *q, const bf16 *kc,
                            const bf16 *vc, bf16 *out, int S, int nq, int NH, int NKV, int D, int32_t pos0, int kv_hi,
                            int causal, int is_full, int window) {
  if (nq <= 0) return cudaSuccess;
  if (version == 1 || (version == 0 && !k_attention_flash_ok(D, NH, NKV)))
    return attention_launch(s, q, kc, vc, out, S, nq, causal ? nq : kv_hi - pos0, NH, NKV, D, pos0, causal, is_full,
                            window);
  if (!k_attention_flash_ok(D, NH, NKV) || version < 0 ||
      (version > DG_ATT_VERSIONS && version != DG_ATT_WQ && version != DG_ATT_WQC && version != DG_ATT_WQB))
    return cudaErrorInvalidValue;
  fa_args a;
  a.q = q; a.kc = kc; a.vc = vc; a.out = out; a.part = ws ? ws->part : NULL;
  a.S = S; a.nq = nq; a.NH = NH; a.NKV = NKV; a.causal = causal; a.is_full = is_full; a.window = window;
  a.n_split = 1; a.pos0 = pos0; a.kv_hi = kv_hi;
  if (version == DG_ATT_WQ) { /* version 15 (attention_wq.cuh): the lab's tiles; D 64 as version 6 (below) */
    switch (D) {
    case 128: return att_wq_launch<128, 64, 1, 2, 1, 0, 1>(s, ws, a);
    case 256: return att_wq_launch<256, 64, 1, 2, 1, 0, 1>(s, ws, a);
    case 512: return att_wq_launch<512, 32, 2, 2, 1, 0, 1>(s, ws, a);
    default: version = 6;
    }
  }
  if (version == DG_ATT_WQC || version == DG_ATT_WQB) { /* versions 16 and 18 (attention_wqc.cuh): 15's tiles, the
                                                           splits merged in a cluster; 18 through the batch
                                                           instance (k_attention_batch's); D 64 as version 6 */
    const int b = version == DG_ATT_WQB;
    switch (D) {
    case 128: return b ? wqc_launch<128, 64, 1, WQC_MAXB>(s, &a, 1, NULL, 1) : wqc_launch<128, 64, 1, 1>(s, &a, 1);
    case 256: return b ? wqc_launch<256, 64, 1, WQC_MAXB>(s, &a, 1, NULL, 1) : wqc_launch<256, 64, 1, 1>(s, &a, 1);
    case 512: return b ? wqc_launch<512, 32, 2, WQC_MAXB>(s, &a, 1, NULL, 1) : wqc_launch<512, 32, 2, 1>(s, &a, 1);
    default: version = 6;
    }
  }
  /* version 2 (and 0): the backend's configuration; 3, 4: the lab's alternatives (dev/cuda/attention.cu); 5: version 2
   * with the earlier split rule (fa_splits) */
  if (version == 5) {
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 4>(s, ws, a, 1);
    case 128: return flash_launch<128, 128, 64, 4>(s, ws, a, 1);
    case 256: return flash_launch<256, 256, 64, 4>(s, ws, a, 1);
    default: return flash_launch<512, 256, 32, 4>(s, ws, a, 1);
    }
  }
  if (version == 6) { /* flash_pair_kernel; D 64 (halves of 32) as version 2 */
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 4>(s, ws, a);
    case 128: return flash_pair_launch<128, 64, 1>(s, ws, a);
    case 256: return flash_pair_launch<256, 64, 1>(s, ws, a);
    default: return flash_pair_launch<512, 32, 1>(s, ws, a);
    }
  }
  if (version == 7) { /* flash_pair_kernel with 32 rows per warp (128 per block) at D 128, 256; D 512 as version 6 */
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 4>(s, ws, a);
    case 128: return flash_pair_launch<128, 32, 2>(s, ws, a);
    case 256: return flash_pair_launch<256, 32, 2>(s, ws, a);
    default: return flash_pair_launch<512, 32, 1>(s, ws, a);
    }
  }
  if (version == 8) { /* version 7 with a 3-deep K/V ring at D 128, 256; D 512 as version 6 */
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 4>(s, ws, a);
    case 128: return flash_pair_launch<128, 32, 2, 3>(s, ws, a);
    case 256: return flash_pair_launch<256, 32, 2, 3>(s, ws, a);
    default: return flash_pair_launch<512, 32, 1>(s, ws, a);
    }
  }
  if (version == 3) {
    switch (D) {
    case 64: return flash_launch<64, 64, 32, 4>(s, ws, a);
    case 128: return flash_launch<128, 128, 32, 4>(s, ws, a);
    case 256: return flash_launch<256, 256, 32, 4>(s, ws, a);
    default: return flash_launch<512, 256, 16, 4>(s, ws, a);
    }
  }
  if (version == 4) {
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 8>(s, ws, a);
    case 128: return flash_launch<128, 128, 32, 8>(s, ws, a);
    case 256: return flash_launch<256, 256, 32, 8>(s, ws, a);
    default: return flash_launch<512, 256, 16, 8>(s, ws, a);
    }
  }
  switch (D) {
  case 64: return flash_launch<64, 64, 64, 4>(s, ws, a);
  case 128: return flash_launch<128, 128, 64, 4>(s, ws, a);
  case 256: return flash_launch<256, 256, 64, 4>(s, ws, a);
  default: return flash_launch<512, 256, 32, 4>(s, ws, a);
  }
}

/* The passes' attention kernel versions, chosen once per context (k_attention_choose, from dg_cuda_ctx_new) into
 * ws->ver[0] (head dims up to 256: the 26B's sliding layers) and ws->ver[1] (wider: its full layers):
 *   - DGEMMA_ATTN unset (or not one of the values below): version 15 (att_wq_kernel, attention_wq.cuh: Q K^T and P V
 *     on wgmma) where cuda_wg_available() says the device runs this build's sm_90a code (a Hopper GPU and a build
 *     with -gencode=arch=compute_90a,code=sm_90a, the Makefile's default since session 25), else version 6
 *     (flash_pair_kernel, the default since H200 session 13: lab, 26B shapes after 1,024 positions, decoder sliding
 *     0.0490 -> 0.0421 ms, full 0.1225 -> 0.0795 against flash_kernel; docs/measurements.md). Version 15 on an H100
 *     (session 25, lab, two runs, decoder after 1,024 positions): sliding 0.0322 / 0.0322 ms against 6's 0.0433 /
 *     0.0431, full 0.0647 / 0.0650 against 0.0807 / 0.0812; test_attention within its bound (docs/cuda.md).
 *   - DGEMMA_ATTN=N or N,M: another of k_attention_any's versions (0..DG_ATT_VERSIONS, or 15, 16, 18) for the head dims that
 *     version takes, version 0 for the others (the warp-per-row kernel where no tensor-core kernel applies); N,M: N
 *     for head dims up to 256, M for wider ones; "N," is N for both. 15 asked for where the device does not run
 *     sm_90a code is 6 (the log says so: the kernel would trap there); so are 16 and 18 (session 29, behind the
 *     switch only, not yet measured on a GPU: 16 is 15 with the key splits merged in a thread block cluster, 18 the
 *     same kernel run over a stacked pass's canvases in one launch, k_attention_batch, each canvas its own split
 *     count so that its words are those of its own pass). The lab's versions 9-14 and 17 are not the backend's
 *     (dev/cuda/attention_lab.cuh).
 * Per call, where 15 cannot run a shape, it is 6: head dim 64 (k_attention_any: halves of 32 are too narrow for
 * its panels; version 6 there is version 2's kernel), and head dims the tensor-core kernels do not take
 * (k_attention_flash_ok: then the warp-per-row kernel, as for every version >= 2). Every other shape the passes
 * pass runs as it is: GQA of any group (rows are (query, head) pairs of one KV head), ring caches (a tile's slots
 * wrap once, as in version 6), the encoder's causal chunks and the decoder's canvas (fa_range / fa_mask, version
 * 6's), compacted turbo rows and stacked batches (each a call of nq rows), key splits in ws->part (fa_choose_splits,
 * version 6's rule), CUDA graphs (the launch's attribute call comes at a shape's first, plain, pass). */
enum { ATT_WHY_ENV = 1, ATT_WHY_WG = 2, ATT_WHY_NO_WG = 3, ATT_WHY_ENV_NO_WG = 4 };

/* a version DGEMMA_ATTN may name: k_attention_any's 0..DG_ATT_VERSIONS, 15, 16 and 18 */
static int attn_known(long n) {
  return (n >= 0 && n <= DG_ATT_VERSIONS) || n == DG_ATT_WQ || n == DG_ATT_WQC || n == DG_ATT_WQB;
}
/* the versions that run wgmma (sm_90a code only) */
static int attn_wgmma(int v) { return v == DG_ATT_WQ || v == DG_ATT_WQC || v == DG_ATT_WQB; }

/* DGEMMA_ATTN's N or N,M into v[0], v[1] (backend/switches.c: the versions attn_known takes); 0 when unset or
 * not one of the accepted values (v untouched: dg_switches_check refused such a value before the context) */
static int attn_env(int v[2]) {
  long e[2];
  dg_sw_get2(DG_SW_ATTN, e);
  if (e[0] < 0 || !attn_known(e[0]) || !attn_known(e[1])) return 0;
  v[0] = (int)e[0];
  v[1] = (int)e[1];
  return 1;
}

void k_attention_choose(dg_att_ws *ws) {
  int v[2] = {6, 6};
  const int env = attn_env(v);
  const int wg = cuda_wg_available();
  if (!env) {
    if (wg) v[0] = v[1] = DG_ATT_WQ;
    ws->wq_why = wg ? ATT_WHY_WG : ATT_WHY_NO_WG;
  } else {
    ws->wq_why = ATT_WHY_ENV;
    for (int i = 0; i < 2; i++)
      if (attn_wgmma(v[i]) && !wg) {
        v[i] = 6;
        ws->wq_why = ATT_WHY_ENV_NO_WG;
      }
  }
  ws->ver[0] = v[0];
  ws->ver[1] = v[1];
}

void k_attention_describe(const dg_att_ws *ws, char *buf, size_t n) {
  static const char *why[] = {
      "not chosen", "DGEMMA_ATTN",
      "default: the device runs this build's sm_90a (wgmma) code",
      "default: no sm_90a (wgmma) code that the device runs, so not version 15",
      "DGEMMA_ATTN, its 15, 16 or 18 replaced by 6: no sm_90a (wgmma) code that the device runs"};
  const int w = ws->wq_why >= 0 && ws->wq_why <= ATT_WHY_ENV_NO_WG ? ws->wq_why : 0;
  snprintf(buf, n, "attention version %d at head dims <= 256, %d above (%s; head dim 64 takes 6 under 15-18)",
           ws->ver[0], ws->ver[1], why[w]);
}

/* the context's version for head dim D (version 0 where no tensor-core kernel takes the shape) */
static int attn_version(const dg_att_ws *ws, int D, int NH, int NKV) {
  const int u = ws->ver[D > 256];
  return u >= 2 && !k_attention_flash_ok(D, NH, NKV) ? 0 : u;
}

cudaError_t k_attention(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc, bf16 *out,
                        int S, int T, int NH, int NKV, int D, int32_t pos0, int causal, int is_full, int window) {
  return k_attention_any(s, ws, attn_version(ws, D, NH, NKV), q, kc, vc, out, S, T, NH, NKV, D, pos0, pos0 + T, causal,
                         is_full, window);
}

cudaError_t k_attention_canvas(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc,
                               bf16 *out, int S, int nq, int NH, int NKV, int D, int32_t pos0, int C, int is_full,
                               int window) {
  return k_attention_any(s, ws, attn_version(ws, D, NH, NKV), q, kc, vc, out, S, nq, NH, NKV, D, pos0, pos0 + C, 0,
                         is_full, window);
}

int k_attention_batched(const dg_att_ws *ws, int D, int NH, int NKV) {
  return ws->ver[D > 256] == DG_ATT_WQB && (D == 128 || D == 256 || D == 512) && k_attention_flash_ok(D, NH, NKV);
}

cudaError_t k_attention_batch(cudaStream_t s, int nb, const float *const *q, const bf16 *const *kc,
                              const bf16 *const *vc, bf16 *const *out, const int32_t *S, const int32_t *nq,
                              const int32_t *pos0, const int32_t *kv_hi, int NH, int NKV, int D, int is_full,
                              int window) {
  if (nb < 0 || (D != 128 && D != 256 && D != 512) || !k_attention_flash_ok(D, NH, NKV)) return cudaErrorInvalidValue;
  for (int i0 = 0; i0 < nb; i0 += WQC_MAXB) { /* WQC_MAXB canvases a launch */
    fa_args a[WQC_MAXB];
    int n = 0;
    for (int i = i0; i < nb && i < i0 + WQC_MAXB; i++) {
      if (nq[i] <= 0) continue; /* nothing to do (k_attention_any returns at once too) */
      fa_args &x = a[n++];
      x.q = q[i]; x.kc = kc[i]; x.vc = vc[i]; x.out = out[i]; x.part = NULL;
      x.S = S[i]; x.nq = nq[i]; x.NH = NH; x.NKV = NKV; x.causal = 0; x.is_full = is_full; x.window = window;
      x.n_split = 1; x.pos0 = pos0[i]; x.kv_hi = kv_hi[i];
    }
    if (!n) continue;
    const cudaError_t e = D == 128   ? wqc_launch<128, 64, 1, WQC_MAXB>(s, a, n, NULL, 1)
                          : D == 256 ? wqc_launch<256, 64, 1, WQC_MAXB>(s, a, n, NULL, 1)
                                     : wqc_launch<512, 32, 2, WQC_MAXB>(s, a, n, NULL, 1);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
