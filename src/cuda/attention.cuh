/* attention.cuh: the device pieces of the tensor-core attention kernels (attention.cu) that the attention lab
 * (dev/cuda/attention.cu, its versions 9-11 in dev/cuda/attention_lab.cuh) builds its own kernels from: the
 * launch arguments, the Q tile, the key range, mask, online softmax and store of one warp's rows, version 6's
 * block (fp_pair_block, flash_pair_kernel's body), the merge of key splits, and the split rule. Shapes, masks and
 * rounding: attention.cu's header. Included by attention.cu and the lab only; device code for nvcc or the CPU
 * emulation (dev/cuda_emu). */
#ifndef DG_CUDA_ATTENTION_CUH
#define DG_CUDA_ATTENTION_CUH

#include <math.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define FA_L2E 1.4426950408889634f

/* A tensor-core kernel's arguments (k_attention_any's, attention.cu; n_split set by the launch). */
struct fa_args {
  const float *q;
  const bf16 *kc, *vc;
  bf16 *out;
  float *part; /* n_split > 1: O partials [n_split, nq * NH, D] then (m, l) [n_split, nq * NH, 2] */
  int S, nq, NH, NKV, causal, is_full, window, n_split;
  int32_t pos0, kv_hi; /* decoder: keys end at kv_hi */
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
 * x 2 splits (v6) or 32 x 4 (v7), decoder full 64 x 2. */
template <int D, int BK, int MT, int ST> struct fp_cfg {
  static constexpr int H = D / 2, BM = 64 * MT, WARPS = 8;
  static constexpr int QH = BM * H * 2, KH = BK * H * 2; /* bytes of one half tile */
  static constexpr int QB = 2 * QH, KB = 2 * KH, XB = WARPS * 16 * MT * BK * 4;
  static constexpr int SMEM = QB + 2 * ST * KB + XB; /* Q, ST stages of K and V, the exchange */
};

/* fp_scores: a warp's partial Q K^T over one half of the dims for its MT m-tiles (rows 16 (MT rg + mt) of the
 * half tile Qs), each K fragment loaded once for the MT tiles (as fa_scores at MT = 1); UN: the unroll of the dims
 * loop (the Q fragments the compiler may load ahead; the lab's version 11, under 128 registers, takes 1: 2 or 4
 * spilled 24-28 bytes at D 256). */
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

/* fp_pair_block: the work of one block of flash_pair_kernel (grid (row tiles, NKV, n_split), 256 threads,
 * fp_cfg<D, BK, MT, ST>::SMEM bytes of dynamic shared memory): its Q tile, the online softmax over its split of the
 * keys, then its rows' output, or the split's partial (O, m, l) (fa_store). xsync(rg), called by every warp (rg =
 * warp & 3): the barrier between a warp's store of its partial scores to shared memory and its read of its partner's
 * (warp ^ 4); flash_pair_kernel passes __syncthreads (the lab's versions 10 and 11 a barrier of the pair's 64 threads,
 * dev/cuda/attention_lab.cuh). UN: fp_scores' unroll (4 / MT in the backend). Returns the exchange area of shared
 * memory (XB bytes, not read again once every warp is past its last tile). */
template <int D, int BK, int MT, int ST, int UN, typename XSync>
__device__ __forceinline__ float *fp_pair_block(const fa_args &a, XSync xsync) {
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
    fp_scores<H, BK, MT, UN>(s, Qs + hf * C::QH, Ks + buf * C::KB + hf * C::KH, rg, lane);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) xw[((mt * (BK / 8) + nt) * 4 + e) * 32 + lane] = s[mt][nt][e];
    xsync(rg); /* the pair's partial scores */
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
  return X;
}

/* fp_merge_row: the merge of output row `row`'s n_split partials, columns [c, c + 8): O = sum_z 2^((m_z - M) log2 e)
 * O_z / sum_z 2^(...) l_z, M = max m_z, z in order (flash_combine_kernel's arithmetic); CG: the loads go to L2
 * (ld.global.cg: partials another block stored in the same launch, the lab's in-kernel merge of versions 9-11). */
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

/* fp_combine_kernel (versions 6-8, and the lab's 12-13): flash_combine_kernel's merge (fp_merge_row), the same
 * operations in the same order, with D / 8 threads per row (8 columns each, two float4 per split) and 256 threads per block, the split loop
 * unrolled by 4 so that a thread's loads of four splits are in flight together (flash_combine_kernel's loop waits for
 * each split's load before issuing the next). */
template <int D> __global__ void __launch_bounds__(256) fp_combine_kernel(const float *part, bf16 *out, int n_split, size_t NR) {
  DG_PDL_ENTRY();
  constexpr int TPR = D / 8;
  const size_t row = (size_t)blockIdx.x * (256 / TPR) + threadIdx.x / TPR;
  if (row >= NR) return;
  fp_merge_row<D, false>(part, out, n_split, NR, row, 8 * (threadIdx.x % TPR));
}

static inline int sm_count(void) {
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
static inline int fa_splits(int blocks, int tiles, int slots, int old) {
  if (old) return min(min((2 * sm_count() + blocks - 1) / blocks, max(1, tiles / 2)), 16);
  int best = 1;
  double tbest = (double)((blocks + slots - 1) / slots) * tiles;
  for (int ns = 2; ns <= 16 && ns <= tiles / 2; ns++) {
    const double t = (double)((blocks * ns + slots - 1) / slots) * ((tiles + ns - 1) / ns) + FA_SPLIT_COST * ns;
    if (t < tbest) { tbest = t; best = ns; }
  }
  return best;
}

/* The key splits of a launch (fa_splits over the kernel's occupancy, capped by the workspace). Causal passes
 * (the encoder) split too: each block splits its own key range (fa_range), a split with no key tile writes
 * m = -inf, l = 0, which the merge weighs 0. (flash_launch keeps causal passes unsplit.) */
static inline int fa_choose_splits(const dg_att_ws *ws, const fa_args &a, int blocks, int BK, int per_sm, int D) {
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

#endif
