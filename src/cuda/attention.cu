/* attention.cu: the layer's attention (spec 4.4 step 3, masks 4.5) over the
 * KV cache, three kernels:
 *   1. attention_kernel: one warp per (query, head), sequential over the
 *      keys, fp32 throughout (the first kernel; kept for head dims the
 *      tensor-core kernel does not take, and as the lab's version 1);
 *   2. flash_kernel: tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate)
 *      with an online softmax over key tiles staged in shared memory by
 *      cp.async, never a score matrix in device memory (Dao, "FlashAttention-2",
 *      2023, algorithm 1), and the keys split across blocks when the queries
 *      alone give too few blocks (flash-decoding: partial (O, m, l) per split,
 *      merged by flash_combine_kernel);
 *   3. flash_pair_kernel (the passes' default since session 13: lab version 6; 7, 8 and flash_kernel through
 *      DGEMMA_ATTN): flash_kernel's
 *      pieces with warp pairs splitting the head dim (header of its section).
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
#include <stdlib.h>
#include <string.h>

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
#define FA_L2E 1.4426950408889634f

struct fa_args {
  const float *q;
  const bf16 *kc, *vc;
  bf16 *out;
  float *part; /* n_split > 1: O partials [n_split, nq * NH, D] then (m, l) [n_split, nq * NH, 2] */
  int *cnt;    /* versions 9-11 with n_split > 1: arrival counters [row tiles * NKV] (dg_att_ws), else NULL */
  int S, nq, NH, NKV, causal, is_full, window, n_split;
  int32_t pos0, kv_hi; /* decoder: keys end at kv_hi */
};

template <int D, int DV, int BK, int WARPS> struct fa_cfg {
  static constexpr int NDV = D / DV, BM = 16 * WARPS;
  static constexpr int QB = BM * D * 2, KB = BK * D * 2, VB = BK * DV * 2;
  static constexpr int SMEM = QB + 2 * (KB + VB);
};

/* byte offset of 16-byte chunk ch of row r in a tile of rows W bf16 wide (W >= 64) */
template <int W> __device__ __forceinline__ int fa_swz(int r, int ch) { return r * (W * 2) + ((ch ^ (r & 7)) << 4); }

__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
  bf16 a = __float2bfloat16_rn(lo), b = __float2bfloat16_rn(hi);
  uint16_t ua, ub;
  memcpy(&ua, &a, 2);
  memcpy(&ub, &b, 2);
  return (uint32_t)ua | ((uint32_t)ub << 16);
}

/* The Q tile of rows [r0, r0 + BM) of KV group g in bf16 (rows past R zero), read from q fp32 [nq, NH, D] (row r of
 * the group: query r / G, head g G + r % G) by NTH threads; 16-byte chunk ch of row r goes to Qs + at(r, ch). */
template <int D, int BM, int NTH, typename AT>
__device__ __forceinline__ void fa_load_q(const fa_args &a, char *Qs, int r0, int R, int G, int g, int tid, AT at) {
  for (int i = tid; i < BM * (D / 8); i += NTH) {
    const int r = i / (D / 8), ch = i % (D / 8), gr = r0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (gr < R) {
      const float *src = a.q + ((size_t)(gr / G) * a.NH + g * G + gr % G) * D + ch * 8;
      const float4 x0 = *(const float4 *)src, x1 = *(const float4 *)(src + 4);
      v = make_uint4(fa_pack(x0.x, x0.y), fa_pack(x0.z, x0.w), fa_pack(x1.x, x1.y), fa_pack(x1.z, x1.w));
    }
    *(uint4 *)(Qs + at(r, ch)) = v;
  }
}

/* The block's key range [lo, hi) before splitting (every row's keys lie in it). */
__device__ __forceinline__ void fa_range(const fa_args &a, int r0, int G, int BM, int *lo, int *hi) {
  if (a.causal) {
    const int R = a.nq * G, tf = r0 / G, tl = (min(r0 + BM, R) - 1) / G;
    *hi = a.pos0 + tl + 1;
    *lo = a.is_full ? 0 : max(0, a.pos0 + tf + 1 - a.window);
  } else {
    *hi = a.kv_hi;
    *lo = a.is_full ? 0 : max(0, a.pos0 - (a.window - 1));
  }
}

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

/* fa_mask: keys at or past zhi (the split's end) and, causal, keys after a row's query position or (sliding
 * layers) before its window get -inf; kb the tile's first key, tq0 / tq1 the lane's rows' query indices,
 * R_first / R_last the block's first and last query. */
template <int BK>
__device__ __forceinline__ void fa_mask(const fa_args &a, float (&s)[BK / 8][4], int kb, int zhi, int tq0, int tq1,
                                        int R_first, int R_last, int lane) {
  const bool edge = kb + BK > zhi ||
                    (a.causal && (kb + BK - 1 > a.pos0 + R_first || (!a.is_full && kb <= a.pos0 + R_last - a.window)));
  if (edge) {
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = kb + 8 * nt + 2 * (lane & 3) + (e & 1), tq = e < 2 ? tq0 : tq1;
        const int pos = a.pos0 + tq;
        bool ok = key < zhi;
        if (a.causal) ok = ok && key <= pos && (a.is_full || key > pos - a.window);
        if (!ok) s[nt][e] = -INFINITY;
      }
  }
}

/* fa_softmax: the online softmax of the tile's scores into the running max m, sum l and output o (rescaled by
 * 2^((m_old - m_new) log2 e)); pa the probabilities rounded to bf16 as the A fragments of P V. */
template <int DV, int BK>
__device__ __forceinline__ void fa_softmax(const float (&s)[BK / 8][4], float (&m)[2], float (&l)[2],
                                           float (&o)[DV / 8][4], uint32_t (&pa)[BK / 16][4]) {
  /* online softmax: rows lane / 4 (elements 0, 1) and lane / 4 + 8 (2, 3), each over a quad */
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
  }
  float mu[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    mu[i] = mx[i] == -INFINITY ? 0.0f : mx[i] * FA_L2E; /* no key yet: every p is 0 */
    const float corr = exp2f(m[i] * FA_L2E - mu[i]);  /* m = -inf: 0 */
    m[i] = mx[i];
    l[i] *= corr;
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
      o[j][2 * i] *= corr;
      o[j][2 * i + 1] *= corr;
    }
  }
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++) {
    const float p0 = exp2f(fmaf(s[nt][0], FA_L2E, -mu[0])), p1 = exp2f(fmaf(s[nt][1], FA_L2E, -mu[0]));
    const float p2 = exp2f(fmaf(s[nt][2], FA_L2E, -mu[1])), p3 = exp2f(fmaf(s[nt][3], FA_L2E, -mu[1]));
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    pa[nt >> 1][(nt & 1) * 2] = fa_pack(p0, p1);
    pa[nt >> 1][(nt & 1) * 2 + 1] = fa_pack(p2, p3);
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

/* fa_store: the lane's two rows (r0 + rl, + 8; rows past R skipped) of the block's output: o / l in bf16 (one
 * split), or the split's partial (O, m, l) for flash_combine_kernel. */
template <int D, int DV>
__device__ __forceinline__ void fa_store(const fa_args &a, const float (&o)[DV / 8][4], const float (&m)[2],
                                         float (&l)[2], int r0, int rl, int R, int G, int g, int dv0, int z, int lane) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  const size_t NR = (size_t)a.nq * a.NH;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int gr = r0 + rl + 8 * i;
    if (gr >= R) continue;
    const size_t orow = (size_t)(gr / G) * a.NH + g * G + gr % G;
    if (a.n_split == 1) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      bf16 *dst = a.out + orow * D + dv0 + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < DV / 8; j++) *(uint32_t *)(dst + 8 * j) = fa_pack(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    } else {
      float *dst = a.part + ((size_t)z * NR + orow) * D + dv0 + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < DV / 8; j++) *(float2 *)(dst + 8 * j) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
      if (dv0 == 0 && (lane & 3) == 0)
        *(float2 *)(a.part + (size_t)a.n_split * NR * D + ((size_t)z * NR + orow) * 2) = make_float2(m[i], l[i]);
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
 *
 * What version 2 spends, per block of 4 warps (64 rows) and key tile, at the 26B's shapes: one warp per SM
 * sub-partition (nothing hides an ldmatrix's or an exp2's latency; 244-254 registers at D 256 / 512); each
 * warp's O accumulator holds 16 rows x DV fp32 in registers, so a 512-wide head is two value slices of 256
 * in two blocks that both compute the whole Q K^T (full layers: 1.5x the needed tensor-core work, K read from
 * L2 and shared memory twice, K + V / 2 = 1.5x the needed L2 traffic per row block).
 *
 * flash_pair_kernel (version 6): 8 warps, 64 rows (16 per warp as before); warps w and w ^ 4 serve the same 16 rows, warp
 * w < 4 the first half of the head dim (H = D / 2), w >= 4 the second, for both products:
 *   Q K^T: each warp the partial scores over its half of the dims (Q and K tiles stored as two [rows, H]
 *     half tiles, swizzled as version 2's); the pair adds them through shared memory (fp32, in fragment
 *     order: lane l of both warps holds the same (row, key) elements, so no bank conflicts, and a + b = b + a
 *     gives both warps bit-identical scores, maxima, probabilities and sums);
 *   P V: each warp its half of the output columns (O: 16 x H fp32, 64 registers at D 256, 128 at D 512) over
 *     the whole tile, V as two [keys, H] half tiles.
 * So: no value slices (one block per 64 rows reads each K and V element of its keys once, computes Q K^T
 * once), two warps per sub-partition, half the O registers per warp. The K/V tile of step it + 1 is issued
 * right after the barrier that opens step it (every warp has left step it - 1, whose buffer it reuses): two
 * barriers per tile (that one and the score exchange's). Rounding: as version 2 (the partial sums are fp32 sums
 * of the same exact products, added once more), so tests/test_cuda.c's bound holds unchanged.
 * Shared memory: Q [64, D] + 2 x (K [BK, D] + V [BK, D]) + the exchange 8 x 16 x BK fp32: D 256, BK 64: 192 KiB;
 * D 512, BK 32: 208 KiB; D 128, BK 64: 112 KiB. Head dims 128, 256, 512 (H >= 64 for the swizzle).
 *
 * MT m-tiles per warp (version 7: MT = 2 at D 128 and 256, 32 keys per tile): a warp serves 16 MT rows (BM = 64
 * MT), each K fragment (Q K^T) and V fragment (P V) loaded from shared memory once for its MT tiles. Shared
 * memory bytes per multiply-add, per warp and tile (Q K^T half + exchange + P V half): MT = 1, BK 64 at D 256:
 * (4 + 16 + 8 + 16) KiB / 2^18 = 0.17 (version 2: (8 + 32 + 32) KiB / 2^19 = 0.14); MT = 2, BK 32: (8 + 8 + 8 +
 * 8) KiB / 2^18 = 0.12. Registers (ptxas, sm_90a): MT 1: 148 (D 128), 186 (D 256), 243 (D 512); MT 2: 175 (D 128),
 * 252 (D 256; the query indices of the mask computed per tile, not kept, to stay out of spills); no spills.
 * Shared memory at MT = 2, BK 32: D 256 160 KiB, D 128 96 KiB.
 *
 * ST stages of K/V (version 8: ST = 3 with version 7's tiles, D 256 192 KiB): tile it + ST - 1 is issued at step
 * it, so a tile has ST - 1 steps to arrive from L2 (at ST = 2, one step: ~1 us of tensor-core work per block
 * at the targets, about the latency of a loaded L2).
 *
 * Key splits (fa_choose_splits): as version 2's rule, but causal passes (the encoder) split too, which version 2
 * never does (a 256-token chunk's sliding layer is 64 blocks of 64 rows: half the H200's SMs idle without
 * splits); the partials are merged by fp_combine_kernel (flash_combine_kernel's arithmetic, more loads in
 * flight). At the 26B's shapes after 1,024 positions (H200, 132 SMs, 1 block per SM): decoder sliding 64 blocks
 * x 2 splits (v6) or 32 x 4 (v7), decoder full 64 x 2.
 *
 * Versions 9-11 (session 18's candidates, not yet timed): the sliding layer's 44 us in session 14's Nsight
 * Compute run were 37.7 in this kernel ("SM %" 35: neither the tensor cores nor shared memory busy) and 6.4 in
 * fp_combine_kernel (the full layer's 82: 72.9 and 9.2). Version 9 (FP_FUSE) merges the splits in the kernel
 * (fp_merge_last: the last split block of a row tile, found by an arrival counter, reads the partials back from L2
 * and writes the output): no combine launch and its tail, fp_combine_kernel's arithmetic. Version 10 (FP_PAIRBAR) adds
 * the pair's own barrier for the score exchange, so a pair's softmax and P V need not wait for the slowest pair's
 * Q K^T: with every warp of the block released together at each barrier, the eight warps reach the exponentials
 * (MUFU) and the tensor-core phases at the same time, one phase idling the other's units. Version 11 (MINB = 2, D
 * 128 and 256, 32-key tiles) fits two blocks per SM: shared memory Q 32 + K/V 2 x 32 + exchange 16 = 112 KiB
 * (+ 1 KiB reserved per block: 226 of the SM's 228 KiB), at most 128 registers per thread (2 x 256 x 128 = the
 * 64 K register file); so 16 warps per SM, 4 per scheduler, from two blocks whose barriers are independent (one's
 * barrier waits and softmax overlap the other's products), against version 6's 8 warps of one block (186
 * registers, 192 KiB). Its costs: shared-memory bytes per multiply-add (loads + the cp.async fill, per block and
 * tile) 224 KiB / 2^20 = 0.219 against version 6's 416 KiB / 2^21 = 0.203, a barrier per 32 keys instead of 64,
 * and 4 splits instead of 2 at the sliding layer (64 blocks a split on 264 slots; partials 16.8 MB instead of 8.4,
 * merged in the kernel). D 512 keeps version 10's tiles in 11: Q alone is 64 KiB and O's half 128 registers.
 * ptxas (nvcc 13.0, sm_90): version 9 as 6 (153 registers at D 128, 186 at D 256, 243 at D 512); 10 the same,
 * barriers 0-4 (dg_bar_sync4's immediate ids; an id in a register made ptxas reserve all 16); 11 106 (D 128) and 128
 * (D 256); no spills. */
template <int D, int BK, int MT, int ST> struct fp_cfg {
  static constexpr int H = D / 2, BM = 64 * MT, WARPS = 8;
  static constexpr int QH = BM * H * 2, KH = BK * H * 2; /* bytes of one half tile */
  static constexpr int QB = 2 * QH, KB = 2 * KH, XB = WARPS * 16 * MT * BK * 4;
  static constexpr int SMEM = QB + 2 * ST * KB + XB; /* Q, ST stages of K and V, the exchange */
};

/* fp_scores: a warp's partial Q K^T over one half of the dims for its MT m-tiles (rows 16 (MT rg + mt) of the
 * half tile Qs), each K fragment loaded once for the MT tiles (as fa_scores at MT = 1); UN: the unroll of the dims
 * loop (the Q fragments the compiler may load ahead; 1 under 128 registers, version 11, which spilled 24-28 bytes at
 * D 256 with 2 or 4). */
template <int H, int BK, int MT, int UN = 4 / MT>
__device__ __forceinline__ void fp_scores(float (&s)[MT][BK / 8][4], const char *Qs, const char *kt, int rg,
                                          int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int i = 0; i < BK / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll(UN)
  for (int kk = 0; kk < H / 16; kk++) {
    uint32_t qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
      dg_ldsm_x4(qa[mt], Qs + fa_swz<H>(16 * (MT * rg + mt) + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < BK / 16; np++) {
      uint32_t kf[4];
      dg_ldsm_x4(kf, kt + fa_swz<H>(16 * np + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        dg_mma_bf16(s[mt][2 * np], qa[mt], kf);
        dg_mma_bf16(s[mt][2 * np + 1], qa[mt], kf + 2);
      }
    }
  }
}

/* flash_pair_kernel's options (FL): FP_FUSE, the key splits merged inside the kernel (fp_merge_last) where the
 * launch gives arrival counters (a.cnt), else by fp_combine_kernel; FP_PAIRBAR, the partial scores exchanged behind a
 * barrier of the pair's 64 threads (bar.sync 1 + rg, dg_bar_sync4) instead of the block's, so that a pair goes on to
 * its softmax and P V without waiting for the other three pairs' Q K^T (one block-wide barrier per key tile instead
 * of two). */
enum { FP_FUSE = 1, FP_PAIRBAR = 2 };

/* fp_merge_row: the merge of output row `row`'s n_split partials, columns [c, c + 8): O = sum_z 2^((m_z - M) log2 e)
 * O_z / sum_z 2^(...) l_z, M = max m_z, z in order (flash_combine_kernel's arithmetic); CG: the loads go to L2
 * (ld.global.cg: partials another block stored in this launch). */
template <bool CG, typename T> __device__ __forceinline__ T fp_ld(const T *p) {
  if constexpr (CG) return __ldcg(p);
  else return *p;
}
template <int D, bool CG>
__device__ __forceinline__ void fp_merge_row(const float *part, bf16 *out, int n_split, size_t NR, size_t row, int c) {
  const float *ml = part + (size_t)n_split * NR * D;
  float M = -INFINITY;
  for (int z = 0; z < n_split; z++) M = fmaxf(M, fp_ld<CG>(ml + ((size_t)z * NR + row) * 2));
  const float mu = M == -INFINITY ? 0.0f : M * FA_L2E;
  float L = 0.0f, acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int z = 0; z < n_split; z++) {
    const float2 mz = fp_ld<CG>((const float2 *)(ml + ((size_t)z * NR + row) * 2));
    const float *src = part + ((size_t)z * NR + row) * D + c;
    const float4 v0 = fp_ld<CG>((const float4 *)src), v1 = fp_ld<CG>((const float4 *)(src + 4));
    const float wz = exp2f(mz.x * FA_L2E - mu);
    L += wz * mz.y;
    acc[0] += wz * v0.x; acc[1] += wz * v0.y; acc[2] += wz * v0.z; acc[3] += wz * v0.w;
    acc[4] += wz * v1.x; acc[5] += wz * v1.y; acc[6] += wz * v1.z; acc[7] += wz * v1.w;
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  *(uint4 *)(out + row * D + c) = make_uint4(fa_pack(acc[0] * inv, acc[1] * inv), fa_pack(acc[2] * inv, acc[3] * inv),
                                             fa_pack(acc[4] * inv, acc[5] * inv), fa_pack(acc[6] * inv, acc[7] * inv));
}

/* fp_merge_last (FP_FUSE, versions 9-11): the key splits merged inside flash_pair_kernel, without
 * fp_combine_kernel's launch. Every split block of row tile (blockIdx.x, KV head g) has stored its partial (O, m, l)
 * (fa_store); the last of the n_split to arrive (an arrival counter per tile: the "last block" pattern of the CUDA
 * samples' threadFenceReduction: each block's stores fenced before its arrival, the last block fenced after it and
 * reading the others' partials from L2, ld.global.cg) merges the tile's rows with fp_combine_kernel's arithmetic
 * (fp_merge_row, the same operations in the same order on the same partials as version 6's) and zeroes the counter
 * for the next launch. flag: one int of shared memory the loop no longer uses. */
template <int D, int BM>
__device__ __forceinline__ void fp_merge_last(const fa_args &a, int *flag, int r0, int R, int G, int g, int tid) {
  __threadfence();
  __syncthreads(); /* every thread's partial stored and fenced; every warp out of the loop (flag reuses X) */
  int *cnt = a.cnt + (size_t)g * gridDim.x + blockIdx.x;
  if (tid == 0) *flag = atomicAdd(cnt, 1) == a.n_split - 1;
  __syncthreads();
  if (!*flag) return;
  __threadfence();
  constexpr int TPR = D / 8;
  const size_t NR = (size_t)a.nq * a.NH;
  for (int r = tid / TPR; r < BM && r0 + r < R; r += 256 / TPR) {
    const int gr = r0 + r;
    fp_merge_row<D, true>(a.part, a.out, a.n_split, NR, (size_t)(gr / G) * a.NH + g * G + gr % G, 8 * (tid % TPR));
  }
  if (tid == 0) *cnt = 0;
}

template <int D, int BK, int MT, int ST, int FL, int MINB>
__global__ void __launch_bounds__(256, MINB) flash_pair_kernel(fa_args a) {
  DG_PDL_ENTRY();
  typedef fp_cfg<D, BK, MT, ST> C;
  constexpr int H = C::H, BM = C::BM, NTH = 256, HC = H / 8, XW = 16 * MT * BK; /* HC: 16-byte chunks per half row */
  DG_DYN_SMEM(uint4, fp_smem);
  char *sm = (char *)fp_smem;
  char *Qs = sm, *Ks = sm + C::QB, *Vs = Ks + ST * C::KB;
  float *X = (float *)(Vs + ST * C::KB);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, rg = w & 3, hf = w >> 2;
  const int G = a.NH / a.NKV, R = a.nq * G, r0 = blockIdx.x * BM, g = blockIdx.y, z = blockIdx.z;
  int blo, bhi;
  fa_range(a, r0, G, BM, &blo, &bhi);
  const int nt_all = (bhi - blo + BK - 1) / BK, per = (nt_all + a.n_split - 1) / a.n_split;
  const int zlo = blo + z * per * BK, zhi = min(bhi, zlo + per * BK);
  const int ntile = zhi > zlo ? (zhi - zlo + BK - 1) / BK : 0;
  const bf16 *kg = a.kc + (size_t)g * a.S * D, *vg = a.vc + (size_t)g * a.S * D;

  /* Q tile: fp32 -> bf16, rows past R zero; chunk ch of a row to half ch / HC */
  fa_load_q<D, BM, NTH>(a, Qs, r0, R, G, g, tid, [](int r, int ch) { return (ch / HC) * C::QH + fa_swz<H>(r, ch % HC); });
  auto load_kv = [&](int it, int buf) {
    const int kb = zlo + it * BK, sb = kb % a.S;
    char *kd = Ks + buf * C::KB, *vd = Vs + buf * C::KB;
    for (int i = tid; i < BK * (D / 8); i += NTH) {
      const int r = i / (D / 8), ch = i % (D / 8), ok = kb + r < zhi;
      int sl = sb + r; /* one wrap at most (a pass's keys never share a slot) */
      sl -= sl >= a.S ? a.S : 0;
      const size_t src = (size_t)(ok ? sl : sb) * D + ch * 8;
      const int dst = (ch / HC) * C::KH + fa_swz<H>(r, ch % HC);
      dg_cp_async16(kd + dst, kg + src, ok ? 16 : 0);
      dg_cp_async16(vd + dst, vg + src, ok ? 16 : 0);
    }
  };

  float o[MT][H / 8][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int i = 0; i < H / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const int R_first = r0 / G, R_last = (min(r0 + BM, R) - 1) / G;
  float *xw = X + w * XW, *xp = X + (w ^ 4) * XW;

  /* a ring of ST buffers: tiles 0 .. ST - 2 ahead, then tile it + ST - 1 issued at step it into the buffer of
   * step it - 1; one commit group per tile slot, empty past the last tile, so that wait_group ST - 2 at step it
   * always means "tile it landed" */
#pragma unroll
  for (int t = 0; t < ST - 1; t++) {
    if (t < ntile) load_kv(t, t);
    dg_cp_commit();
  }
  for (int it = 0; it < ntile; it++) {
    const int buf = it % ST, kb = zlo + it * BK;
    dg_cp_wait<ST - 2>();
    __syncthreads(); /* tile it landed for every thread; every warp has left step it - 1 (its buffer, X) */
    if (it + ST - 1 < ntile) load_kv(it + ST - 1, (it + ST - 1) % ST);
    dg_cp_commit();
    float s[MT][BK / 8][4];
    fp_scores<H, BK, MT, (MINB > 1 ? 1 : 4 / MT)>(s, Qs + hf * C::QH, Ks + buf * C::KB + hf * C::KH, rg, lane);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) xw[((mt * (BK / 8) + nt) * 4 + e) * 32 + lane] = s[mt][nt][e];
    if (FL & FP_PAIRBAR) dg_bar_sync4<64>(rg); /* the pair's partial scores: warps rg and rg + 4 only */
    else __syncthreads();                       /* the pair's partial scores */
    uint32_t pa[MT][BK / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[mt][nt][e] += xp[((mt * (BK / 8) + nt) * 4 + e) * 32 + lane];
      const int rl = 16 * (MT * rg + mt) + (lane >> 2); /* the lane's rows r0 + rl, + 8 (query indices on the fly:
                                                            fewer live registers) */
      fa_mask<BK>(a, s[mt], kb, zhi, (r0 + rl) / G, (r0 + rl + 8) / G, R_first, R_last, lane);
      fa_softmax<H, BK>(s[mt], m[mt], l[mt], o[mt], pa[mt]);
    }
    /* o += P V over this warp's half of the columns, each V fragment for the MT tiles */
    const char *vt = Vs + buf * C::KB + hf * C::KH;
#pragma unroll
    for (int j = 0; j < BK / 16; j++) {
#pragma unroll
      for (int dp = 0; dp < H / 16; dp++) {
        uint32_t vf[4];
        dg_ldsm_x4_t(vf, vt + fa_swz<H>(16 * j + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          dg_mma_bf16(o[mt][2 * dp], pa[mt][j], vf);
          dg_mma_bf16(o[mt][2 * dp + 1], pa[mt][j], vf + 2);
        }
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
    fa_store<D, H>(a, o[mt], m[mt], l[mt], r0, 16 * (MT * rg + mt) + (lane >> 2), R, G, g, hf * H, z, lane);
  if constexpr ((FL & FP_FUSE) != 0)
    if (a.cnt) fp_merge_last<D, BM>(a, (int *)X, r0, R, G, g, tid);
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

/* fp_combine_kernel (versions 6-8; 9-11 where the launch has no counters): flash_combine_kernel's merge
 * (fp_merge_row), the same operations in the same order, with D / 8 threads per row (8 columns each, two float4 per
 * split) and 256 threads per block, the split loop unrolled by 4 so that a thread's loads of four splits are in
 * flight together (flash_combine_kernel's loop waits for each split's load before issuing the next). */
template <int D> __global__ void __launch_bounds__(256) fp_combine_kernel(const float *part, bf16 *out, int n_split, size_t NR) {
  DG_PDL_ENTRY();
  constexpr int TPR = D / 8;
  const size_t row = (size_t)blockIdx.x * (256 / TPR) + threadIdx.x / TPR;
  if (row >= NR) return;
  fp_merge_row<D, false>(part, out, n_split, NR, row, 8 * (threadIdx.x % TPR));
}

static int sm_count(void) {
  static int n = 0;
  if (!n) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      n = 132;
  }
  return n;
}

/* The key splits of a launch of `blocks` blocks per split over `tiles` key tiles, `slots` blocks resident at once:
 * the count (1..16, at least 2 tiles per split) with the least estimated time, waves x tiles per split plus SPLIT_COST
 * tiles per split for writing and merging the partials ([nq NH, D] fp32 each, flash_combine_kernel). The earlier
 * rule (old = 1: enough blocks for two waves) gave the sliding layers of a 256-token canvas 5 splits: 320 blocks of
 * 4 tiles in 3 waves at 1 block per SM (12 tile times + 5 partials) where 2 splits take 1 wave of 10. */
#define FA_SPLIT_COST 0.5
static int fa_splits(int blocks, int tiles, int slots, int old) {
  if (old) return min(min((2 * sm_count() + blocks - 1) / blocks, max(1, tiles / 2)), 16);
  int best = 1;
  double tbest = (double)((blocks + slots - 1) / slots) * tiles;
  for (int ns = 2; ns <= 16 && ns <= tiles / 2; ns++) {
    const double t = (double)((blocks * ns + slots - 1) / slots) * ((tiles + ns - 1) / ns) + FA_SPLIT_COST * ns;
    if (t < tbest) { tbest = t; best = ns; }
  }
  return best;
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

/* The key splits of a launch (fa_splits over the kernel's occupancy, capped by the workspace). Causal passes
 * (the encoder) split too: each block splits its own key range (fa_range), a split with no key tile writes
 * m = -inf, l = 0, which the merge weighs 0. (flash_launch keeps causal passes unsplit.) */
static int fa_choose_splits(const dg_att_ws *ws, const fa_args &a, int blocks, int BK, int per_sm, int D) {
  int lo, hi; /* keys of the widest block before splitting */
  if (a.causal) { hi = a.pos0 + a.nq; lo = a.is_full ? 0 : max(0, a.pos0 + 1 - a.window); }
  else { hi = a.kv_hi; lo = a.is_full ? 0 : max(0, a.pos0 - (a.window - 1)); }
  const int tiles = (hi - lo + BK - 1) / BK;
  int ns = 1;
  if (ws && ws->part) {
    ns = fa_splits(blocks, tiles, per_sm * sm_count(), 0);
    const size_t NR = (size_t)a.nq * a.NH;
    while (ns > 1 && (size_t)ns * NR * (D + 2) > ws->n) ns--;
  }
  return ns;
}

/* MINB > 1: the largest shared-memory carveout asked for, so that MINB blocks' tiles fit an SM (the carveout is a
 * hint the driver may otherwise set for one block); the split count follows the occupancy the runtime reports. */
template <int D, int BK, int MT, int ST = 2, int FL = 0, int MINB = 1>
static cudaError_t flash_pair_launch(cudaStream_t s, const dg_att_ws *ws, fa_args a) {
  typedef fp_cfg<D, BK, MT, ST> C;
  const int G = a.NH / a.NKV, R = a.nq * G, bx = (R + C::BM - 1) / C::BM;
  void (*kern)(fa_args) = flash_pair_kernel<D, BK, MT, ST, FL, MINB>;
  static int per_sm = 0;
  if (!per_sm) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e == cudaSuccess && MINB > 1)
      e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (e != cudaSuccess) return e;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
  }
  const int ns = fa_choose_splits(ws, a, bx * a.NKV, BK, per_sm, D);
  a.n_split = ns;
  a.cnt = (FL & FP_FUSE) && ns > 1 && ws->cnt && bx * a.NKV <= ws->ncnt ? ws->cnt : NULL; /* ns > 1: ws given */
  DG_LAUNCH(kern, dim3(bx, a.NKV, ns), 256, C::SMEM, s)(a);
  if (ns > 1 && !a.cnt) {
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
  if (!k_attention_flash_ok(D, NH, NKV) || version < 0 || version > DG_ATT_VERSIONS) return cudaErrorInvalidValue;
  fa_args a;
  a.q = q; a.kc = kc; a.vc = vc; a.out = out; a.part = ws ? ws->part : NULL;
  a.S = S; a.nq = nq; a.NH = NH; a.NKV = NKV; a.causal = causal; a.is_full = is_full; a.window = window;
  a.n_split = 1; a.pos0 = pos0; a.kv_hi = kv_hi; a.cnt = NULL;
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
  if (version >= 9) { /* 9: version 6 with the splits merged in the kernel (FP_FUSE); 10: 9 with the pair's own
                         barrier for the score exchange (FP_PAIRBAR); 11: 10 at D 128 and 256 with 32-key tiles in 112
                         KiB of shared memory and at most 128 registers, 2 blocks per SM; D 512 as 10 (D 64: as 6) */
    constexpr int F9 = FP_FUSE, F10 = FP_FUSE | FP_PAIRBAR;
    switch (D) {
    case 64: return flash_launch<64, 64, 64, 4>(s, ws, a);
    case 128:
      return version == 9 ? flash_pair_launch<128, 64, 1, 2, F9>(s, ws, a)
             : version == 10 ? flash_pair_launch<128, 64, 1, 2, F10>(s, ws, a)
                             : flash_pair_launch<128, 32, 1, 2, F10, 2>(s, ws, a);
    case 256:
      return version == 9 ? flash_pair_launch<256, 64, 1, 2, F9>(s, ws, a)
             : version == 10 ? flash_pair_launch<256, 64, 1, 2, F10>(s, ws, a)
                             : flash_pair_launch<256, 32, 1, 2, F10, 2>(s, ws, a);
    default:
      return version == 9 ? flash_pair_launch<512, 32, 1, 2, F9>(s, ws, a)
                          : flash_pair_launch<512, 32, 1, 2, F10>(s, ws, a);
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

/* The passes' attention kernel version (read once): unset, version 6 (flash_pair_kernel), the default since H200
 * session 13 (lab, 26B shapes after 1,024 positions: decoder sliding 0.0490 -> 0.0421 ms, full 0.1225 -> 0.0795,
 * encoder sliding 0.0650 -> 0.0403, full 0.1228 -> 0.0779; vllm --profile attention 1.970 -> 1.553 ms per pass;
 * test_cuda passes with it; docs/measurements.md); DGEMMA_ATTN=N or N,M another of k_attention_any's versions
 * (0: version 2's configuration, flash_kernel, the default before; 7, 8: flash_pair_kernel's other tiles; 9-11:
 * its candidates of session 18, unmeasured: splits merged in the kernel, the pair's own exchange barrier, 2 blocks
 * per SM) for the head dims that version takes, version 0 for the others (the warp-per-row kernel where no
 * tensor-core kernel applies); N,M: N for head dims up to 256 (the 26B's sliding layers), M for wider ones (its full
 * layers); "N," is N for both; values outside 0..DG_ATT_VERSIONS or not numbers keep the default. */
static int attn_version(int D, int NH, int NKV) {
  static int v[2] = {-1, -1};
  if (v[0] < 0 || v[1] < 0) {
    const char *e = getenv("DGEMMA_ATTN");
    int a = 6, b = 6;
    if (e && *e) { /* N or N,M of 0..DG_ATT_VERSIONS; anything else keeps the default, as DGEMMA_ROUTE and
                      DGEMMA_GRAPHS do */
      char *end = NULL;
      const long n = strtol(e, &end, 10);
      if (end != e && n >= 0 && n <= DG_ATT_VERSIONS && (*end == '\0' || *end == ',')) {
        a = b = (int)n;
        if (*end == ',' && end[1]) {
          char *end2 = NULL;
          const long m = strtol(end + 1, &end2, 10);
          b = end2 != end + 1 && !*end2 && m >= 0 && m <= DG_ATT_VERSIONS ? (int)m : 6;
        }
      }
    }
    v[1] = b; /* a race on first use writes the same values */
    v[0] = a;
  }
  const int u = v[D > 256];
  return u >= 2 && !k_attention_flash_ok(D, NH, NKV) ? 0 : u;
}

cudaError_t k_attention(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc, bf16 *out,
                        int S, int T, int NH, int NKV, int D, int32_t pos0, int causal, int is_full, int window) {
  return k_attention_any(s, ws, attn_version(D, NH, NKV), q, kc, vc, out, S, T, NH, NKV, D, pos0, pos0 + T, causal,
                         is_full, window);
}

cudaError_t k_attention_canvas(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc,
                               bf16 *out, int S, int nq, int NH, int NKV, int D, int32_t pos0, int C, int is_full,
                               int window) {
  return k_attention_any(s, ws, attn_version(D, NH, NKV), q, kc, vc, out, S, nq, NH, NKV, D, pos0, pos0 + C, 0, is_full,
                         window);
}
