/* qmoe_wl.cuh: the 4-bit g64 gathered expert products for experts of MANY rows (64-256 and
 * more per expert: the batch of issue 14, the prefill of issue 12) on Hopper's wgmma with both operands in shared
 * memory: the kernel lab's versions 120-124 (dev/cuda/moe_quant.cu) and, behind DGEMMA_WL=1 (qmoe_wl.cu), the
 * backend's gate/up product of the experts of >= WL_MIN_ROWS rows (version 122's instantiation).
 *
 * Why another wgmma kernel: qw_kernel (qmoe_w.cuh, versions 20-27, 75) kept qr_kernel's shape (a block of 128
 * weight rows streams its lane records once, the tokens are the small N of m64nNk16, N = 8 NT <= 64) and lost to
 * qr_kernel at M ~16 (12 %: a wait per group, the codes unpacked into A registers per warp, no more reuse than
 * mma.sync). At M >= 64 the product is compute-bound (4-bit g64: 2 M flops per 0.5625 weight bytes; the H100's
 * ridge, ~990 TFLOP/s over ~3.0 TB/s, is ~330 flops per byte, i.e. M ~93 rows per expert; see STATUS notes in
 * docs/cuda.md) and the weights can be dequantized once per tile into the layout wgmma reads, as mixed-input GEMMs
 * do (CUTLASS's and vLLM's "machete", Marlin: read for the idea, nothing copied):
 *
 *   block       WG consumer warpgroups (128 WG threads; all of them also copy and dequantize: no producer warp),
 *               the tile BM = 64 WG gathered rows (tokens) x BN = 128 or 256 output columns of one expert; the
 *               block walks its expert's rows in passes of BM (a.order: the experts by descending count, qr_block)
 *   columns     gate/up: BN / 2 gate features and the same BN / 2 up features (the tile's first and second half),
 *               so that a lane holds gate and up of the same (row, feature) for the GeGLU epilogue; down: BN rows
 *   k stage     64 k = one group: per stage the A tile (BM rows x 64 bf16, 128 bytes a row) and the packed weights
 *               of the stage (wl layout below) arrive by cp.async in a ring of ST slots, L = ST - 2 stages ahead
 *   B operand   the stage's BN x 64 weights dequantized (w = fl_bf16(q s + b) by fma.rn.bf16x2, as qr_dq_rows)
 *               into a bf16 tile, K-major, 128-byte swizzle (row n: its 64 k in 128 bytes, 16-byte chunk c at
 *               (c ^ (n % 8)) 16), three such tiles in rotation: tile s % 3 is written during stage s - 1's
 *               products and read by stage s's
 *   A operand   the gathered rows of xp (k_group_sums_perm's copy: each run of 8 stored as x0 x4 x1 x5 x2 x6 x3 x7)
 *               in the same swizzled layout; the weights are dequantized into the same order (k position 2 p + e of
 *               a run holds w of k p + 4 e: the pair (q_p, q_p+4) is one shift and mask of the MLX word), so that
 *               the dot products are those of the plain order, summed in another order
 *   products    per stage and warpgroup: 4 wgmma.m64nBNk16 (A and B from shared memory, fp32 accumulators in
 *               BN / 2 registers per thread), one commit group; the next stage's dequantization runs while they are
 *               in flight; wait_group 1 retires the stage before
 *
 * One barrier per stage. Iteration s: wait for this thread's copies of stage s + 1, fence.proxy.async (its copies
 * and its dequantized stores of tile s % 3 visible to the tensor cores), barrier; then the copies of stage s + L
 * into slot (s + L) % ST (last read by stage s - 2's wgmmas, retired by every warpgroup's wait_group 1 of iteration
 * s - 1, before this barrier); the wgmmas of stage s; the dequantization of stage s + 1 into tile (s + 1) % 3 (last
 * read by stage s - 2's wgmmas: the same); wait_group 1.
 *
 * wl layout (wl_pack): per (expert, slab of BN columns, group) one contiguous chunk of 36 BN bytes (4,608 at BN 128):
 * the BN columns' 32 code bytes (the MLX row's bytes of the group as they are, little-endian nibbles), then their
 * BN (scale, bias) pairs (bf16, scale in the low half); columns past the product's N are zero (stores skip them).
 *
 * Accuracy: that of the DQ body (qr_run_products_dq; the lab's g_dq bound, tests/test_cuda.c qdq_bound): each w
 * rounded once to bf16 from the exact q s + b, exact products, fp32 sums in any order at up to 2u each:
 * |y - exact| <= 1.01 (u (Aq + Aw) + 2^-8 A' + g(2K) (1 + 2^-8) A'), A' = Aw + u (Aq + Aw), Aw = sum |x w|,
 * Aq = sum |x q s| (the reference's own w_k = fl(fl(q s) + b) is within u (|q s| + |w|) of q s + b).
 *
 * The wrappers are src/cuda/wgmma.cuh's, so the kernel also runs on the CPU emulation (dev/cuda_emu): tests/test_cuda.c
 * test_quant_experts_wgmma runs versions 120-122 there through dg_cuda_test_experts_qw. */
#ifndef DG_CUDA_QMOE_WL_CUH
#define DG_CUDA_QMOE_WL_CUH

#include <string.h>

#include "cuda/qmoe_r.cuh"
#include "cuda/wgmma.cuh"


/* A chunk of bn columns: its codes, the whole chunk, the bf16 tile of a stage (bn rows of 128 bytes). */
__host__ __device__ constexpr int wl_codes(int bn) { return bn * 32; }
__host__ __device__ constexpr int wl_chunk(int bn) { return bn * 36; }
__host__ __device__ constexpr int wl_btile(int bn) { return bn * 128; }
/* Slabs of bn columns of a product with N features (gate/up: bn / 2 features a slab) or rows (down). */
__host__ __device__ inline int wl_slabs(int gateup, int N, int bn) {
  return gateup ? (N + bn / 2 - 1) / (bn / 2) : (N + bn - 1) / bn;
}
/* Bytes of a stack in the wl layout of bn-column slabs: E experts, N features (gate/up) or rows (down) each, K
 * columns. */
__host__ inline size_t wl_bytes(int gateup, int64_t E, int N, int K, int bn) {
  return (size_t)E * wl_slabs(gateup, N, bn) * (K / 64) * wl_chunk(bn);
}
/* The wl layout (bn-column slabs) of a 4-bit g64 MLX stack [E rows_per_expert, K] (codes: rows of K / 2 bytes; sc, bi:
 * bf16 [rows, K / 64]); gate/up: expert e's gate rows e 2N + f, up rows e 2N + N + f (slab sl: columns c < bn / 2 gate
 * f = sl bn / 2 + c, the others up of the same f); down: rows e N + f. dst: wl_bytes. */
__host__ inline void wl_pack(int gateup, int64_t E, int N, int K, int bn, const uint8_t *codes, const uint16_t *sc,
                             const uint16_t *bi, uint8_t *dst) {
  const int ns = wl_slabs(gateup, N, bn), ng = K / 64, hb = bn / 2;
  for (int64_t e = 0; e < E; e++)
    for (int sl = 0; sl < ns; sl++)
      for (int j = 0; j < ng; j++) {
        uint8_t *ch = dst + (((size_t)e * ns + sl) * ng + j) * wl_chunk(bn);
        memset(ch, 0, (size_t)wl_chunk(bn));
        for (int c = 0; c < bn; c++) {
          int64_t row = -1;
          if (gateup) {
            const int f = sl * hb + c % hb;
            if (f < N) row = e * 2 * N + (c >= hb ? N : 0) + f;
          } else {
            const int f = sl * bn + c;
            if (f < N) row = e * N + f;
          }
          if (row < 0) continue;
          memcpy(ch + 32 * c, codes + row * (K / 2) + 32 * j, 32);
          const uint32_t p = (uint32_t)sc[row * ng + j] | (uint32_t)bi[row * ng + j] << 16;
          memcpy(ch + wl_codes(bn) + 4 * c, &p, 4);
        }
      }
}

/* qe_args as for qr_kernel but for q (the wl layout of BN-column slabs) and X (xp; no group sums): gate/up h =
 * bf16(gelu(gate) up) [rows, N], down y [rows, N] fp32, rows in grouped order. WG warpgroups (BM = 64 WG rows per
 * pass), ST ring slots (ST >= 4: L = ST - 2 stages of copies in flight), MINB blocks per SM, BN 128 or 256 columns
 * (wgmma m64nBNk16; BN / 2 gate and as many up features). */
template <int GATEUP, int WG, int ST, int MINB = 1, int BN = 128, int NS = 1>
__global__ void __launch_bounds__(128 * WG, MINB) wl_kernel(qe_args a) {
  DG_PDL_ENTRY();
  static_assert(ST >= 4, "wl_kernel: ST >= 4 (two stages of copies ahead at least)");
  static_assert(BN == 128 || BN == 256, "wl_kernel: BN 128 or 256");
  constexpr int THREADS = 128 * WG, BM = 64 * WG, L = ST - 2, NT = BN / 8, HB = BN / 2;
  constexpr int WL_CODES = wl_codes(BN), WL_CHUNK = wl_chunk(BN), WL_BTILE = wl_btile(BN);
  constexpr int ABYTES = BM * 128;                       /* one slot's A tile */
  constexpr int OFF_B = ST * ABYTES, OFF_W = OFF_B + 3 * WL_BTILE;
  constexpr int ACH = BM * 8 / THREADS;                  /* 16-byte A copies per thread and stage (4) */
  constexpr int WCH = WL_CHUNK / 16, WCT = (WCH + THREADS - 1) / THREADS;
  constexpr uint32_t ONE = 0x3F803F80u, M128 = 0xC300C300u; /* bf16 1 and -128 in both halves */
  DG_DYN_SMEM16(smem_raw);
  __shared__ int64_t xrow[BM];
  int e, sgrp;
  qr_block(a, &e, &sgrp);
  const int cnt = a.count[e];
  if (cnt == 0) return;
  /* NS > 1 (versions 123-): this block's slabs slab0 .. slab0 + nsl - 1 of the expert, one stream of nsl nk stages
   * per pass (their chunks are contiguous in the wl layout), so the copy ring's fill and drain are paid once per pass;
   * the wgmma pipeline drains (wait_group 0) at each slab's end for its store */
  const int ns = wl_slabs(GATEUP, a.N, BN), slab0 = sgrp * NS, nsl = min(NS, ns - slab0);
  const int base = a.start[e];
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int nk = a.Kdim / 64, U = NS == 1 ? nk : nsl * nk; /* U: the stages of a pass (nk per slab; NS 1: 183
                                                                  * registers at 122, against 210 with nsl nk) */
  /* 1024-byte aligned operand tiles (the 128-byte swizzle's pattern) */
  const uint32_t s0 = dg_smem_addr(smem_raw), pad = (1024u - s0 % 1024u) % 1024u, sm = s0 + pad;
  unsigned char *smem = smem_raw + pad;
  const dg_sptr sbase = dg_sp(smem);
  const unsigned char *wsrc = (const unsigned char *)a.q + ((size_t)e * ns + slab0) * nk * WL_CHUNK;

  for (int p0 = 0; p0 < cnt; p0 += BM) {
    const int mp = min(BM, cnt - p0);
    for (int i = tid; i < BM; i += THREADS)
      xrow[i] = i < mp ? (int64_t)(GATEUP ? a.pairs[base + p0 + i] / a.topk : base + p0 + i) * a.Kdim : -1;
    __syncthreads();
    /* this thread's A copies: chunk q = tid + THREADS k, row m = q / 8, 16-byte piece r = q % 8 of the stage */
    const bf16 *asrc[ACH];
    int adst[ACH], abytes[ACH];
#pragma unroll
    for (int k = 0; k < ACH; k++) {
      const int q = tid + THREADS * k, m = q >> 3, r = q & 7;
      const int64_t xr = xrow[m];
      asrc[k] = xr >= 0 ? a.X + xr + 8 * r : a.X;
      abytes[k] = xr >= 0 ? 16 : 0; /* rows past the pass: zeros (never stored) */
      adst[k] = m * 128 + ((r ^ (m & 7)) << 4);
    }
    auto issue = [&](int s) { /* stage s of the pass: k stage s % nk of slab slab0 + s / nk */
      if (s < U) {
        const int slot = s % ST, ks = NS == 1 ? s : s % nk;
#pragma unroll
        for (int k = 0; k < ACH; k++) dg_cp_async16_sp(sbase + slot * ABYTES + adst[k], asrc[k] + 64 * ks, abytes[k]);
        const unsigned char *w = wsrc + (size_t)s * WL_CHUNK;
#pragma unroll
        for (int k = 0; k < WCT; k++) {
          const int c = tid + THREADS * k;
          if (WCH % THREADS == 0 || c < WCH) dg_cp_async16_sp(sbase + OFF_W + slot * WL_CHUNK + 16 * c, w + 16 * c, 16);
        }
      }
      dg_cp_commit();
    };
    /* stage s's packed weights (slot s % ST) into bf16 tile s % 3: item (column c, half h) = 4 MLX words (32 codes)
     * of column c, runs 4 h .. 4 h + 3 of the group */
    auto dequant = [&](int s) {
      const unsigned char *w = smem + OFF_W + (s % ST) * WL_CHUNK;
      unsigned char *bt = smem + OFF_B + (s % 3) * WL_BTILE;
#pragma unroll
      for (int it = tid; it < 2 * BN; it += THREADS) {
        const int c = it >> 1, h = it & 1;
        const uint4 v = *(const uint4 *)(w + 32 * c + 16 * h);
        const uint32_t sb = *(const uint32_t *)(w + WL_CODES + 4 * c);
        const uint32_t ss = dg_prmt(sb, 0u, 0x1010u), bb = dg_prmt(sb, 0u, 0x3232u); /* (s, s), (b, b) */
        const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
          uint32_t o[4];
#pragma unroll
          for (int p = 0; p < 4; p++) { /* (q_p, q_p+4) of the run: bf16 (128 + q) each, then q, then q s + b */
            const uint32_t x = dg_and_or(wd[i] >> (4 * p), 0x000F000Fu, 0x43004300u);
            o[p] = dg_bf16x2_fma(dg_bf16x2_fma(x, ONE, M128), ss, bb);
          }
          const int r = 4 * h + i;
          *(uint4 *)(bt + 128 * c + ((r ^ (c & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    };

    /* lane (g, t) of warp w: rows 16 w + g + 8 hf of its warpgroup's 64, columns 8 j + 2 t + (0, 1) of slab sl */
    auto store = [&](const float (&acc)[NT][4], int slab) {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int m = wg * 64 + 16 * warp + g + 8 * hf;
        if (m >= mp) continue;
        const size_t row = (size_t)(base + p0 + m);
#pragma unroll
        for (int j = 0; j < NT / 2; j++) {
          if (GATEUP) {
            const int f = slab * HB + 8 * j + 2 * t;
#pragma unroll
            for (int q = 0; q < 2; q++)
              if (f + q < a.N)
                a.h[row * a.N + f + q] = __float2bfloat16_rn(qe_gelu(acc[j][2 * hf + q]) * acc[j + NT / 2][2 * hf + q]);
          } else {
#pragma unroll
            for (int j2 = 0; j2 < 2; j2++) {
              const int n = slab * BN + HB * j2 + 8 * j + 2 * t;
#pragma unroll
              for (int q = 0; q < 2; q++)
                if (n + q < a.N) a.y[row * a.N + n + q] = acc[NT / 2 * j2 + j][2 * hf + q];
            }
          }
        }
      }
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[j][i] = 0.0f; /* (the first wgmma has scale-d 0: only defined registers) */
#pragma unroll
    for (int s = 0; s < L; s++) issue(s);
    dg_cp_wait<L - 1>(); /* stage 0 */
    __syncthreads();
    dequant(0);
    /* stage s (global to the pass: slots, copies and tiles run on across slab boundaries): the wgmmas of k stage ks
     * (scale-d 0 at ks 0: a fresh accumulation), the dequantization of stage s + 1, wait_group 1 */
    auto step = [&](int s, int ks) {
      dg_cp_wait<L - 2>(); /* stage s + 1 (this thread's copies) */
      dg_fence_proxy_async();
      __syncthreads();
      issue(s + L);
      const uint32_t at = sm + (uint32_t)((s % ST) * ABYTES + wg * 64 * 128);
      const uint32_t bt = sm + (uint32_t)(OFF_B + (s % 3) * WL_BTILE);
      dg_wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        dg_wgmma_bf16_ss<NT>(acc, dg_wg_desc_sw128(at + 32 * kk, 1024), dg_wg_desc_sw128(bt + 32 * kk, 1024),
                             ks > 0 || kk > 0);
      dg_wg_commit();
      if (s + 1 < U) dequant(s + 1);
      dg_wg_wait1();
    };
    if constexpr (NS == 1) {
      for (int s = 0; s < U; s++) step(s, s);
      dg_wg_wait0();
      dg_wg_pin<NT>(acc);
      store(acc, slab0);
    } else {
      /* each slab's wgmma pipeline drains in its own loop (wait_group 0, then the accumulators are pinned and stored),
       * as the passes follow one another: no non-wgmma definition of the accumulators while a group is in flight
       * (ptxas C7515 serialized every wgmma when the store sat inside the one loop over the pass's stages) */
      for (int i = 0, s = 0; i < nsl; i++) {
        for (int ks = 0; ks < nk; ks++, s++) step(s, ks);
        dg_wg_wait0();
        dg_wg_pin<NT>(acc);
        store(acc, slab0 + i);
      }
    }
    __syncthreads(); /* xrow and the slots of this pass read by every thread before the next pass */
  }
}

/* Launches wl_kernel over E experts (grid (E, wl_slabs)); a.q the wl layout of BN-column slabs, a.X xp. */
template <int GATEUP, int WG, int ST, int MINB = 1, int BN = 128, int NS = 1>
static cudaError_t wl_launch(cudaStream_t s, int E, const qe_args &a) {
  if (a.Kdim % 64 || a.group != 64) return cudaErrorInvalidValue;
  void (*kern)(qe_args) = wl_kernel<GATEUP, WG, ST, MINB, BN, NS>;
  const size_t smem = (size_t)ST * (64 * WG * 128 + wl_chunk(BN)) + 3 * wl_btile(BN) + 1024; /* + 1024-byte alignment */
  static int set = 0;
  if (!set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
  DG_LAUNCH(kern, dim3(E, (wl_slabs(GATEUP, a.N, BN) + NS - 1) / NS), 128 * WG, smem, s)(a);
  return cudaGetLastError();
}
#endif
