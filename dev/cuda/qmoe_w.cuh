/* qmoe_w.cuh (dev/cuda, lab only): the quantized MoE products of qr_kernel (src/cuda/qmoe_r.cuh) on Hopper's
 * warpgroup tensor-core instruction (wgmma, sm_90a): the kernel lab's
 * candidate (dev/cuda/moe_quant.cu, versions 20-), not yet the backend's.
 *
 * Same math as qr_kernel and qe_kernel: codes enter the tensor core as
 * 128 + q (exact in bf16), P'_j = sum_k x_k (q_k + 128) per group in fp32,
 * folded as acc += s_j P'_j + (b_j - 128 s_j) S_j. What differs:
 *
 *   - the block is one warpgroup (4 warps, 128 rows); per k16 step each warp
 *     issues one wgmma.m64nNk16 per 16-row half of its 32 rows (N = 8 NT
 *     tokens) instead of NT mma.sync m16n8k16: A (the codes) from the lane's
 *     registers, unpacked as qr_kernel does; B (the activations) read by the
 *     tensor cores from the shared ring, no ldmatrix or lds per lane;
 *   - the ring holds each activation stage as 16-byte pieces (8 values of a
 *     token) in the no-swizzle K-major canonical layout of wgmma: piece p of
 *     token n at p (8 NT 16) + n 16 bytes, so that 8 tokens' piece is one
 *     128-byte core matrix; a k16 step reads pieces 2 m and 2 m + 1 (LBO = the
 *     distance of consecutive pieces, SBO = 128, the next 8 tokens);
 *   - the activations are xp (k_group_sums_perm: each run of 8 values stored
 *     as x0 x4 x1 x5 x2 x6 x3 x7), so k position 2 t + e of a piece is value
 *     t + 4 e of its run of 8: lane t's A register of the half of 8-run u must
 *     hold the codes t and t + 4 of that run. The lane records are therefore
 *     those of qr_kernel (compact layout, the same bytes) with another choice
 *     of the 8 codes a lane holds per row and run of 32: its code j = 0..7 is
 *     code 8 (j % 4) + 4 (j / 4) + t of the run (qr_kernel: 8 t + j), so that
 *     qr_codes' pairs (j, j + 4) are (8 u + t, 8 u + t + 4), u = 0..3
 *     (qw_tile_pack);
 *   - per group: the lane unpacks all of the group's A registers, one
 *     wgmma.fence, the group's wgmmas (the first of each half with scale-d 0:
 *     no zeroing of the partial sums), commit, wait, fold.
 *
 * SWAP (a check of the descriptor's reading): LBO and SBO exchanged; only one
 * of the two orders can pass the lab's check.
 *
 * The wgmma wrappers are src/cuda/wgmma.cuh's, so the kernel also runs on the CPU emulation (dev/cuda_emu):
 * tests/test_cuda.c test_quant_experts_wgmma runs versions 20, 22 and 75 there (and 21, which must fail) through
 * the test library's dg_cuda_test_experts_qw. */
#ifndef DG_CUDA_QMOE_W_CUH
#define DG_CUDA_QMOE_W_CUH

#include "cuda/qmoe_r.cuh"

#include "cuda/wgmma.cuh" /* the wgmma wrappers (and their CPU emulation) */

/* qe_args as for qr_kernel (X = xp, q = the wgmma-order lane records of qw_tile_pack); 4 warps per block. */
template <int BITS, int GATEUP, int NT, int GS, int D = QR_D, int STAGES = QR_STAGES, int MINB = 1, int SUB = QR_SUB,
          int PF = 0, int SWAP = 0, int DQ = 0>
__global__ void __launch_bounds__(128, MINB) qw_kernel(qe_args a) {
  DG_PDL_ENTRY();
  constexpr int WARPS = 4, THREADS = 128, ROWS = 128, FEAT = 64, NTOK = 8 * NT;
  constexpr int KC = qr_kc(GS), RUNS = KC / 32, GPS = KC / GS, CB = 4 * RUNS * BITS, RW = qr_rec(BITS, GS) / 4;
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int KA = SUB * KC;                 /* codes per activation stage (one barrier each) */
  constexpr int PB = NTOK * 16;                /* bytes of one piece of all the pass's tokens */
  constexpr int XB = (KA / 8) * PB, SBB = (SUB * GPS * NTOK * 4 + 15) / 16 * 16, STB = XB + SBB;
  constexpr int CPG = GS / 32;                 /* runs per group */
  constexpr float OFF = BITS == 8 ? 0.0f : 128.0f;
  constexpr uint32_t LBO = SWAP ? 128u : (uint32_t)PB, SBO = SWAP ? (uint32_t)PB : 128u;
  DG_DYN_SMEM16(smem);
  __shared__ int64_t xrow[NTOK];
  __shared__ int64_t srow[NTOK];
  int e, slab;
  qr_block(a, &e, &slab); /* (a.order NULL: block (x, y) is expert x's slab y) */
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * gridDim.y + slab;
  const int64_t sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  const uint32_t sm0 = dg_smem_addr(smem);

  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    for (int i = tid; i < NTOK; i += THREADS) {
      int64_t xr = -1, sr = -1;
      if (i < mp) {
        const int64_t row = GATEUP ? a.pairs[base + p0 + i] / a.topk : base + p0 + i;
        xr = row * a.Kdim;
        sr = row * ng;
      }
      xrow[i] = xr;
      srow[i] = sr;
    }
    __syncthreads();

    /* this thread's copies of an activation stage: piece c of token r to c PB + 16 r */
    constexpr int PER = KA / 8, CH = (NTOK * PER + THREADS - 1) / THREADS;
    constexpr int NS = DQ ? 0 : NTOK * SUB * GPS, CHS = (NS + THREADS - 1) / THREADS; /* DQ: no group sums */
    const bf16 *xsrc[CH];
    int xdst[CH], xcol[CH], xbytes[CH];
#pragma unroll
    for (int k = 0; k < CH; k++) {
      const int i = tid + k * THREADS, r = min(i / PER, NTOK - 1), c = i % PER;
      const int64_t xr = xrow[r];
      xsrc[k] = xr >= 0 ? a.X + xr + 8 * c : a.X;
      xbytes[k] = xr >= 0 ? 16 : 0;
      xdst[k] = i < NTOK * PER ? c * PB + 16 * r : -1;
      xcol[k] = 8 * c;
    }
    const float *ssrc[CHS > 0 ? CHS : 1];
    int sdst[CHS > 0 ? CHS : 1], sgrp[CHS > 0 ? CHS : 1], sbytes[CHS > 0 ? CHS : 1];
#pragma unroll
    for (int k = 0; k < CHS; k++) {
      const int i = tid + k * THREADS, j = i / NTOK, r = i % NTOK;
      const int64_t sr = i < NS ? srow[r] : -1;
      ssrc[k] = sr >= 0 ? a.xs + sr + j : a.xs;
      sbytes[k] = sr >= 0 ? 4 : 0;
      sdst[k] = i < NS ? XB + 4 * i : -1;
      sgrp[k] = j;
    }
    constexpr bool XEVEN = NTOK * PER % THREADS == 0, SEVEN = NS % THREADS == 0;
    const dg_sptr sbase = dg_sp(smem);
    int islot = 0, icol = 0;
    auto issue = [&]() {
      const dg_sptr slot = sbase + islot * STB;
      if (SUB == 1 || icol + KA <= a.Kdim) {
#pragma unroll
        for (int k = 0; k < CH; k++)
          if (XEVEN || xdst[k] >= 0) dg_cp_async16_sp(slot + xdst[k], xsrc[k] + icol, xbytes[k]);
#pragma unroll
        for (int k = 0; k < CHS; k++)
          if (SEVEN || sdst[k] >= 0) dg_cp_async4_sp(slot + sdst[k], ssrc[k] + icol / GS, sbytes[k]);
      } else {
        const int cols = a.Kdim - icol;
#pragma unroll
        for (int k = 0; k < CH; k++)
          if (xdst[k] >= 0 && xcol[k] < cols) dg_cp_async16_sp(slot + xdst[k], xsrc[k] + icol, xbytes[k]);
#pragma unroll
        for (int k = 0; k < CHS; k++)
          if (sdst[k] >= 0 && sgrp[k] * GS < cols) dg_cp_async4_sp(slot + sdst[k], ssrc[k] + icol / GS, sbytes[k]);
      }
      islot = islot == STAGES - 1 ? 0 : islot + 1;
      icol += KA;
    };
    const unsigned char *wnext = wq;
    int wst = 0;
    auto wload = [&](uint32_t *R) { /* qr_kernel's stage load (compact layout) */
      qr_load_stage<BITS, GS, 1, PF>(R, wnext, lane, g, wst, nst, sstride);
      wnext += sstride;
      if constexpr (PF != 0) wst++;
    };

    float acc[2][NT][4], part[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mt][j][i] = part[mt][j][i] = 0.0f;

    int cslot = 0;
    /* DQ: the A fragments of the two runs in flight (run c in buffer c % 2), kept until their wgmmas complete */
    uint32_t AQ[DQ ? 2 : 1][2][2][4];
    auto compute = [&](const uint32_t *R, int sub) {
      const uint32_t xa = sm0 + (uint32_t)(cslot * STB + (KC / 8) * PB * sub);
      const uint64_t desc0 = dg_wg_desc(xa, LBO, SBO);
      const unsigned char *Ss = smem + cslot * STB + XB + 4 * NTOK * GPS * sub;
      if constexpr (DQ) {
        /* each run: wait until at most one group (the previous run's) is in flight, so that this run's buffer
         * is free; decode and dequantize (qr_dq_rows); its 4 wgmmas accumulate into acc */
#pragma unroll
        for (int c = 0; c < RUNS; c++) {
          const int cb = c & 1;
          dg_wg_wait1();
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            uint32_t pg[4], p8[4];
            qr_codes<BITS>(R, ((2 * mt) * RUNS + c) * BITS, pg);
            qr_codes<BITS>(R, ((2 * mt + 1) * RUNS + c) * BITS, p8);
            qr_dq_rows<BITS, RUNS, GS>(R, c, mt, pg, p8);
            AQ[cb][mt][0][0] = pg[0]; AQ[cb][mt][0][1] = p8[0]; AQ[cb][mt][0][2] = pg[1]; AQ[cb][mt][0][3] = p8[1];
            AQ[cb][mt][1][0] = pg[2]; AQ[cb][mt][1][1] = p8[2]; AQ[cb][mt][1][2] = pg[3]; AQ[cb][mt][1][3] = p8[3];
          }
          dg_wg_fence();
#pragma unroll
          for (int m = 0; m < 2; m++) {
            const uint64_t desc = desc0 + (uint64_t)(((4 * c + 2 * m) * PB) >> 4);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) dg_wgmma_bf16<NT>(acc[mt], AQ[cb][mt][m], desc, 1);
          }
          dg_wg_commit();
        }
      } else { /* (else, not return: no unreachable loop in the DQ instantiations) */
#pragma unroll
        for (int lg = 0; lg < GPS; lg++) {
          uint32_t A[CPG][2][2][4];
#pragma unroll
          for (int cc = 0; cc < CPG; cc++) {
            const int c = lg * CPG + cc;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
              uint32_t pg[4], p8[4];
              qr_codes<BITS>(R, ((2 * mt) * RUNS + c) * BITS, pg);
              qr_codes<BITS>(R, ((2 * mt + 1) * RUNS + c) * BITS, p8);
              A[cc][mt][0][0] = pg[0]; A[cc][mt][0][1] = p8[0]; A[cc][mt][0][2] = pg[1]; A[cc][mt][0][3] = p8[1];
              A[cc][mt][1][0] = pg[2]; A[cc][mt][1][1] = p8[2]; A[cc][mt][1][2] = pg[3]; A[cc][mt][1][3] = p8[3];
            }
          }
          dg_wg_pin<NT>(part[0]);
          dg_wg_pin<NT>(part[1]);
          dg_wg_fence();
#pragma unroll
          for (int cc = 0; cc < CPG; cc++) {
            const int c = lg * CPG + cc;
#pragma unroll
            for (int m = 0; m < 2; m++) {
              /* pieces 4 c + 2 m (k 0..7) and 4 c + 2 m + 1 (k 8..15) of the stage */
              const uint64_t desc = desc0 + (uint64_t)(((4 * c + 2 * m) * PB) >> 4);
#pragma unroll
              for (int mt = 0; mt < 2; mt++) dg_wgmma_bf16<NT>(part[mt], A[cc][mt][m], desc, cc > 0 || m > 0);
            }
          }
          dg_wg_commit();
          dg_wg_wait0();
          dg_wg_pin<NT>(part[0]);
          dg_wg_pin<NT>(part[1]);
          float2 xsum[NT];
#pragma unroll
          for (int j = 0; j < NT; j++) xsum[j] = *(const float2 *)(Ss + 4 * (lg * NTOK + 8 * j + 2 * t));
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            float s0, b0, s8, b8;
            qe_pair_u32(R[CB / 4 + (2 * mt) * GPS + lg], DG_CUDA_BF16, &s0, &b0);
            qe_pair_u32(R[CB / 4 + (2 * mt + 1) * GPS + lg], DG_CUDA_BF16, &s8, &b8);
            b0 = fmaf(-OFF, s0, b0);
            b8 = fmaf(-OFF, s8, b8);
#pragma unroll
            for (int j = 0; j < NT; j++) {
              float *Ac = acc[mt][j], *P = part[mt][j];
              Ac[0] = fmaf(b0, xsum[j].x, fmaf(s0, P[0], Ac[0]));
              Ac[1] = fmaf(b0, xsum[j].y, fmaf(s0, P[1], Ac[1]));
              Ac[2] = fmaf(b8, xsum[j].x, fmaf(s8, P[2], Ac[2]));
              Ac[3] = fmaf(b8, xsum[j].y, fmaf(s8, P[3], Ac[3]));
            }
          }
        }
      }
    };

    auto astage = [&](int sa) {
      if (sa > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
      if constexpr (DQ) dg_wg_wait0(); /* the slot refilled below was read by the last run's wgmmas */
      dg_cp_wait<STAGES - 2>();
      dg_fence_proxy_async(); /* this thread's landed copies, visible to the tensor cores */
      __syncthreads();
      if (sa + STAGES - 1 < nsa) issue();
      dg_cp_commit();
    };
    uint32_t W[D][RW];
#pragma unroll
    for (int sa = 0; sa < STAGES - 1; sa++) {
      if (sa < nsa) issue();
      dg_cp_commit();
    }
    if constexpr (PF > 0) {
      if (lane == 0)
        for (int i = 1; i < PF && i < nst; i++) dg_prefetch_l2(wstage0 + (int64_t)i * sstride, WSTAGE);
    } else if constexpr (PF < 0) {
      for (int i = 1; i < -PF && i < nst; i++) qr_prefetch_lines<CB, GPS, PSC>(wq + (int64_t)i * sstride, lane);
    }
#pragma unroll
    for (int d = 0; d < D - 1; d++)
      if (d < nst) wload(W[d]);
    for (int it = 0; it < nst; it += D) {
#pragma unroll
      for (int d = 0; d < D; d++) {
        const int s = it + d;
        if (s < nst) {
          if (s + D - 1 < nst) wload(W[(d + D - 1) % D]);
          const int sub = D % SUB == 0 ? d % SUB : s % SUB;
          if (sub == 0) astage(s / SUB);
          compute(W[d], sub);
        }
      }
    }
    if constexpr (DQ) {
      dg_wg_wait0();
      dg_wg_pin<NT>(acc[0]);
      dg_wg_pin<NT>(acc[1]);
    }
    __syncthreads();

    qe_store<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t);
  }
}

template <int BITS, int GATEUP, int NT, int GS, int D = QR_D, int STAGES = QR_STAGES, int MINB = 1, int SUB = QR_SUB,
          int PF = 0, int SWAP = 0, int DQ = 0>
static cudaError_t qw_launch_g(cudaStream_t s, dim3 grid, const qe_args &a) {
  constexpr int KC = qr_kc(GS), NTOK = 8 * NT, XB = (SUB * KC / 8) * NTOK * 16, SBB = (SUB * (KC / GS) * NTOK * 4 + 15) / 16 * 16;
  void (*kern)(qe_args) = qw_kernel<BITS, GATEUP, NT, GS, D, STAGES, MINB, SUB, PF, SWAP, DQ>;
  const size_t smem = (size_t)STAGES * (XB + SBB);
  static int set = 0;
  if (!set && smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
  DG_LAUNCH(kern, grid, 128, smem, s)(a);
  return cudaGetLastError();
}
#endif
