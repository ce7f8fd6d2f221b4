/* qr_diet_lab.cuh: the kernel lab's candidates of the SASS diet's launch choices (issue 11; lab versions 95-112 of
 * dev/cuda/moe_quant.cu), in one table for the lab and for the emulation test that compares each with the
 * backend's kernels word for word (tests/support/cuda_entry.cu dg_cuda_test_experts_lab, tests/test_cuda.c
 * test_quant_experts_lab). Lab only: nothing here is the backend's until a GPU has timed it.
 *
 * Every version is qr_kernel with the diet's stage loop (DIET 1, qr_diet_pass in src/cuda/qmoe_r.cuh) and the
 * backend's block order, so the same products, folds and fp32 operations in the same order as the backend's
 * (version 50): only launch and pipeline choices differ, which change no output bit. Version 95 is the backend's
 * launch choices with the other stage loop at every tile count (qr_launch_bits' FLIP 1); 96-104 (4-bit) change, for group 64 at 3 n-tiles (the 256-token
 * canvas of the 26B: 16 rows per expert on average; experts of at most 8 NTS rows take the NTS-tile body) and at 2
 * n-tiles, the choices below; other tile counts and groups run the diet with the backend's choices (qr_launch_bits with
 * the diet at every tile count). Versions 105-106 (4-bit) run, for group 64 at 3 n-tiles, the diet's loop over a weight
 * ring in shared memory instead of register stages (qr_dring_kernel below: the same record words, so the same
 * arithmetic), and 96-104's fallback elsewhere. Versions 107-108 (4-bit) run, for group 64 at 2 and 3 n-tiles, the
 * diet with the backend's choices in a persistent grid (qr_pers_kernel below: the same items, the same arithmetic
 * per item), and 96-104's fallback elsewhere. Version 112 (session 25) runs, for group 64 at 2 and 3 n-tiles, the items
 * past the last whole round of resident blocks in 3 pieces along K (qr_sk_kernel below: not word for word, within the
 * derived bound; tests/test_cuda.c test_quant_experts_sk through dg_cuda_test_experts_qw). Version 114 (session 26) runs
 * gate/up and down in one launch, work tickets in order and a wait per down block on its expert's gate/up blocks
 * (src/cuda/qmoe_fg.cuh qr_fg_kernel: version 50's bodies, word for word; tests/test_cuda.c test_quant_experts_fg through
 * dg_cuda_test_experts_qw; the lab's "gate_up+down" rows).
 *
 * The arithmetic that chose them (ptxas -v of nvcc 13 -O2 sm_90a, 4-bit g64, docs/cuda.md "The next GPU calls"):
 * an H100 / H200 SM has 65,536 registers, 228 KB of shared memory and 4 schedulers; a block is 4 warps (128
 * threads) with a ring of 3 activation stages, 3 x (24 x 320 + 192) = 23,616 bytes at 3 n-tiles, SUB 2 (+384 of
 * row tables), so registers, not shared memory, bound the blocks per SM up to 8: 128 registers per thread for 4
 * blocks (4 warps per scheduler), 96 for 5, 80 for 6 (the allocation is per warp in units of 256 registers). */
#ifndef DG_DEV_QR_DIET_LAB_CUH
#define DG_DEV_QR_DIET_LAB_CUH

#include <vector>

#include "cuda/qmoe_r.cuh"
#include "cuda/qmoe_fg.cuh" /* version 114: the backend's qr_fg_kernel */

/* qr_kernel with the diet's loop (DIET 1) and, for quantized stacks of group 64, at 3 n-tiles MB3 blocks per SM the
 * registers are capped for, D3 register stages of weights, line prefetches PF3 weight stages ahead, SUB3 weight
 * stages per activation stage, the NTS3-tile body for experts of at most 8 NTS3 rows; at 2 n-tiles MB2 blocks per
 * SM and D2 register stages (the backend's: 4, 2, 2, 2, 2; 4, 2). Anything else: qr_launch_bits with the diet at every tile count. */
template <int BITS, int GATEUP, int MB3, int D3, int PF3, int SUB3, int NTS3, int MB2, int D2>
cudaError_t qr_diet_launch(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  static_assert(BITS != 16, "quantized stacks only (bf16 stacks have no group)");
  if (a.group == 64 && nt == 3) /* (qr_launch_bits takes the DQ body from 4 n-tiles only: never here) */
    return qr_launch_g<BITS, GATEUP, 3, 64, QR_WARPS, D3, QR_STAGES, MB3, SUB3, -PF3, 1, NTS3, 0, 0, 0, 1>(s, grid, a);
  if (a.group == 64 && nt == 2)
    return qr_launch_g<BITS, GATEUP, 2, 64, QR_WARPS, D2, QR_STAGES, MB2, QR_SUB, 0, 1, 0, 0, 0, 0, 1>(s, grid, a);
  return qr_launch_bits<BITS, GATEUP, 0, 0x1fe>(s, grid, nt, a); /* the diet at every tile count */
}

/* Versions 105-106 (session 21): the diet's loop over a weight ring in shared memory (qr_dring_kernel). At 3 n-tiles
 * the diet's warps wait on their weight loads (long scoreboard 19.1 % of the stall samples at T 256, docs/cuda.md
 * session 21 item 2): 2 register stages keep 1 stage (1,152 bytes) in flight per warp and D 4 at 4 blocks per SM
 * spills (98). Here each warp's stages go by cp.async into a ring of WR slots in shared memory WR - 1 stages ahead
 * ((WR - 1) x 1,152 bytes in flight per warp, no registers held for them) and are read back with LDS right before
 * their products, under the diet's steady state (FAST iterations without tests).
 *
 * A ring slot is a warp's stage exactly as in device memory (the compact layout, qr_wstage: 32 lanes' code pieces,
 * piece-major, then 16 GPS pair bytes per row group), so lane l copies its own code pieces and lanes 0 .. 8 GPS - 1
 * one pair piece each, and a lane reads its code pieces and its row group's pairs from the addresses qr_load_stage
 * reads in device memory: the record R is the same words, so the products and folds (qr_stage_diet) are the same fp32
 * operations in the same order as the backend's, and the outputs equal word for word. The pairs are read by lanes
 * (g, 0..3) but copied by lane g GPS + i: the __syncwarp after each stage's wait orders them (the __syncthreads at an
 * activation stage's first weight stage does the same), and also orders every lane's reads of slot s - 1 before the
 * copy into it at stage s. (The weight ring of qr_body's D < 0, lab versions 61-65, duplicates the pairs per lane,
 * 1,536 bytes per warp stage instead of 1,152, and needs no warp barrier.)
 *
 * Commit groups: the STAGES - 1 activation stages, the WR - 1 weight stages, then one group per weight stage s
 * carrying stage s + WR - 1's copies and, when s begins an activation stage sa, stage sa + STAGES - 1's. At stage s,
 * weight stage s's group has WR - 2 groups after it, and at s = SUB sa activation stage sa's has SUB (STAGES - 1) - 1,
 * so the wait is WR - 2 at a stage that begins no activation stage and min(WR - 2, SUB (STAGES - 1) - 1) at one that
 * does (WR 6 at SUB 2, STAGES 3: 3, i.e. weight stage s + 1 is waited for there too).
 *
 * Shared memory per block (4-bit g64, 3 n-tiles, WARPS 4, STAGES 3, SUB 2): the activation ring 3 x (24 x 320 +
 * 192) = 23,616 bytes, the weight rings WR x 4 x 1,152 = 18,432 (WR 4) or 27,648 (WR 6), the row tables of the 3- and
 * 2-tile bodies 640 (ptxas: static smem): 42,688 and 51,904 bytes, so 4 blocks per SM take 170,752 / 207,616 bytes
 * (174,848 / 211,712 with the 1 KB reserved per block) of the SM's 233,472 (228 KB); the diet's register stages
 * take 24,256. Bytes in flight per warp: (WR - 1) x 1,152 = 3,456 / 5,760 (D 2 register stages: 1,152). */

/* Least common multiple of two positive ints (compile time). */
__host__ __device__ constexpr int qr_lcm(int x, int y) {
  int p = x, q = y;
  while (q) { const int r = p % q; p = q; q = r; }
  return x / p * y;
}
/* Dynamic shared memory of qr_dring_kernel: the activation ring (as qr_body's) then WARPS rings of WR warp stages. */
template <int BITS, int NT, int GS, int WARPS, int WR, int STAGES, int SUB>
__host__ __device__ constexpr size_t qr_dring_smem() {
  return (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0)) +
         (size_t)WARPS * WR * qr_wstage(BITS, GS, 1);
}

/* One pass of qr_dring_kernel (as qr_diet_pass, with the weight ring above instead of register stages): the
 * activation ring's first STAGES - 1 stages and the ring's first WR - 1 weight stages, then FAST iterations of U =
 * lcm(WR, SUB) weight stages (slot and sub-stage known at compile time) while every stage they copy is one of the
 * nst and every activation stage they issue is whole, then the last ones with tests; the pass's outputs stored
 * (qr_epilogue). xrow, srow: the pass's row table (qe_pass_rows); mvalid, row0, mp, slab: qe_store's; wstage0: the
 * warp's stage 0 in device memory, stages sstride bytes apart; nst weight and nsa activation stages; smem: the
 * activation ring (STAGES slots of STB bytes), then the warps' weight rings (WR slots of WSTAGE bytes each). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int WR, int STAGES, int SUB>
__device__ __forceinline__ void qr_dring_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                              const bool (&mvalid)[2], int row0, int mp, int slab,
                                              const unsigned char *wstage0, int nst, int nsa, int tid,
                                              unsigned char *smem) {
  constexpr int KC = qr_kc(GS, BITS), RW = qr_rec(BITS, GS) / 4, NTOK = 8 * NT, KA = SUB * KC;
  constexpr int GPS = KC / GS, CB = 4 * (KC / 32) * BITS, THREADS = 32 * WARPS;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, STB = XB + qr_sbb(GS, SUB, NT, 0);
  constexpr int WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int64_t sstride = (int64_t)WARPS * WSTAGE; /* bytes of a stage of the slab */
  constexpr int U = qr_lcm(WR, SUB); /* weight stages per FAST iteration */
  constexpr int FAST = U + (WR - 1 > SUB * (STAGES - 1) ? WR - 1 : SUB * (STAGES - 1));
  constexpr int WA = WR - 2 < SUB * (STAGES - 1) - 1 ? WR - 2 : SUB * (STAGES - 1) - 1; /* the wait at s = SUB sa */
  static_assert(BITS != 16 && CB % 16 == 0 && 8 * GPS <= 32, "quantized codes in 16-byte pieces, a pair piece per lane");
  static_assert(WR >= 2 && STAGES >= 2, "a ring of 2 stages at least");
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, Kdim = a.Kdim;
  const dg_sptr sbase = dg_sp(smem);
  float acc[2][NT][4], part[2][NT][4];
  qe_zero(acc);
  qe_zero(part);
  qr_xdiet<GS, NTOK, THREADS, KA, XS, XB, GPS, SUB> xc;
  xc.init(a, xrow, srow, tid);
  int islot = 0, icol = 0, cslot = STAGES - 1; /* cslot: advanced to 0 at stage 0 */
  auto issue = [&](auto full) {
    xc.template issue<decltype(full)::value>(sbase + islot * STB, icol, Kdim, tid);
    islot = islot == STAGES - 1 ? 0 : islot + 1;
    icol += KA;
  };
#pragma unroll
  for (int sa = 0; sa < STAGES - 1; sa++) {
    if (sa < nsa) issue(std::false_type());
    dg_cp_commit();
  }
  /* the lane's copies of a weight stage: its code pieces (k 512 + 16 lane) and, lanes < 8 GPS, pair piece lane (32 CB
   * + 16 lane), from wnext (the lane's piece of the next stage to copy) into ring slot `slot` */
  const dg_sptr wl = sbase + STAGES * STB + warp * WR * WSTAGE + 16 * lane;
  const bool pl = lane < 8 * GPS;
  const unsigned char *wnext = wstage0 + 16 * lane;
  auto wissue = [&](int slot) {
    const dg_sptr d = wl + slot * WSTAGE;
#pragma unroll
    for (int k = 0; k < CB / 16; k++) dg_cp_async16_nz(d + 512 * k, wnext + 512 * k);
    if (pl) dg_cp_async16_nz(d + 32 * CB, wnext + 32 * CB);
    wnext += sstride;
  };
#pragma unroll
  for (int j = 0; j < WR - 1; j++) {
    if (j < nst) wissue(j);
    dg_cp_commit();
  }
  const dg_sptr xl0 = sbase + g * XS + 16 * t, sl0 = sbase + XB + 8 * t;
  const dg_sptr rc = wl, rp = sbase + STAGES * STB + warp * WR * WSTAGE + 32 * CB + 16 * GPS * g; /* slot 0's */
  /* weight stage s in ring slot `slot`, sub-stage sub of its activation stage; FULL: everything it copies and
   * issues exists and is whole */
  auto step = [&](int s, int slot, int sub, auto full) {
    constexpr bool FULL = decltype(full)::value;
    if (sub == 0) { /* activation stage s / SUB begins: its slot, its copies landed for every warp, the next issued */
      cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
      dg_cp_wait<WA>();
      __syncthreads();
      if (FULL || s / SUB + STAGES - 1 < nsa) issue(full);
    } else {
      dg_cp_wait<WR - 2>();
      __syncwarp(); /* the warp's copies of stage s landed; its reads of slot s - 1 done */
    }
    if (FULL || s + WR - 1 < nst) wissue(slot == 0 ? WR - 1 : slot - 1); /* stage s + WR - 1 into slot s - 1's */
    dg_cp_commit();
    uint32_t R[RW];
#pragma unroll
    for (int k = 0; k < CB / 16; k++) {
      const uint4 v = dg_lds16(rc + slot * WSTAGE + 512 * k);
      R[4 * k] = v.x; R[4 * k + 1] = v.y; R[4 * k + 2] = v.z; R[4 * k + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < GPS; i++) {
      const uint4 v = dg_lds16(rp + slot * WSTAGE + 16 * i);
      R[CB / 4 + 4 * i] = v.x; R[CB / 4 + 4 * i + 1] = v.y; R[CB / 4 + 4 * i + 2] = v.z; R[CB / 4 + 4 * i + 3] = v.w;
    }
    qr_stage_diet<BITS, NT, GS, SUB>(acc, part, R, xl0 + cslot * STB, sl0 + cslot * STB, sub);
  };
  int s = 0;
  for (; s + FAST <= nst; s += U) { /* s a multiple of U: slot d mod WR, sub-stage d mod SUB */
#pragma unroll
    for (int d = 0; d < U; d++) step(s + d, d % WR, d % SUB, std::true_type());
  }
  for (; s < nst; s += U) { /* the last stages, with tests (slot and sub-stage still known at compile time) */
#pragma unroll
    for (int d = 0; d < U; d++)
      if (s + d < nst) step(s + d, d % WR, d % SUB, std::false_type());
  }
  dg_cp_wait<0>();
  __syncthreads(); /* every warp is done with the rings before the next pass refills them */
  qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, row0, mp, slab, warp, g, t, smem);
}

/* qr_body's passes for qr_dring_pass: the expert's rows in passes of 8 NT tokens, each pass's row table then the
 * pass (the same prelude as qr_body's). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int WR, int STAGES, int SUB>
__device__ __forceinline__ void qr_dring_body(const qe_args &a, unsigned char *smem, const int e, const int slab) {
  constexpr int KC = qr_kc(GS, BITS), WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT;
  constexpr int GU = GATEUP != 0;
  static_assert(GATEUP != QR_GATEUP_HP, "the plain epilogues only");
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * gridDim.y + slab;
  const int64_t sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    qr_dring_pass<BITS, GATEUP, NT, GS, WARPS, WR, STAGES, SUB>(a, xrow, srow, mvalid, base + p0, mp, slab, wstage0,
                                                                nst, nsa, tid, smem);
  }
}

/* The kernel of versions 105-106: qr_kernel's (block order, NTS body for experts of at most 8 NTS rows, MINB blocks
 * per SM the registers are capped for) with qr_dring_body. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int WR, int STAGES, int MINB, int SUB, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_dring_kernel(qe_args a) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  int e, slab;
  qr_block(a, &e, &slab);
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_dring_body<BITS, GATEUP, NTS, GS, WARPS, WR, STAGES, SUB>(a, smem, e, slab);
      return;
    }
  }
  qr_dring_body<BITS, GATEUP, NT, GS, WARPS, WR, STAGES, SUB>(a, smem, e, slab);
}

/* qr_dring_kernel on stream s over grid (experts, slabs) as qr_launch_g, qr_dring_smem bytes of dynamic shared memory
 * (the attribute set once per instantiation above 48 KB); the attribute's or the launch's error, else cudaSuccess. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int WR, int STAGES, int MINB, int SUB, int NTS>
cudaError_t qr_dring_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args) = qr_dring_kernel<BITS, GATEUP, NT, GS, WARPS, WR, STAGES, MINB, SUB, NTS>;
  constexpr size_t smem = qr_dring_smem<BITS, NT, GS, WARPS, WR, STAGES, SUB>();
#ifndef DG_CUDA_EMU
  static int set = 0; /* one attribute call per instantiation */
  if (!set && smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, grid, 32 * WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* Versions 105 (WR 4) and 106 (WR 6): for group 64 at 3 n-tiles qr_dring_kernel with the backend's other choices
 * (4 warps, 3 activation stages, SUB 2, registers for 4 blocks per SM, the 2-tile body for experts of at most 16
 * rows; no L2 prefetch: the ring's copies are the bytes in flight); elsewhere as 96-104 (qr_diet_launch with the
 * backend's choices). */
template <int BITS, int GATEUP, int WR>
cudaError_t qr_dring_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (a.group == 64 && nt == 3)
    return qr_dring_launch<BITS, GATEUP, 3, 64, QR_WARPS, WR, QR_STAGES, QR_MINB, QR_SUB, QR_NTS>(s, grid, a);
  return qr_diet_launch<BITS, GATEUP, 4, 2, 2, 2, 2, 4, 2>(s, grid, nt, a);
}

/* Versions 107-108 (session 22): a persistent form of the backend's kernel. At the 26B canvas (T 256) the down
 * product's grid is 128 experts x 22 slabs = 2,816 blocks, 528 resident on an H100 (4 per SM): 5.33 waves of blocks
 * that each stream one 50.7 KB slab (11 weight stages) and stop, so every block pays its first stage's DRAM round
 * trip, the activation ring's fill and the epilogue (docs/cuda.md, "Measured on an H100 in session 22"). Here the
 * grid is the resident blocks only (SMs x cudaOccupancyMaxActiveBlocksPerMultiprocessor, at most the items), and
 * block b takes the work items (expert, slab) b, b + gridDim.x, b + 2 gridDim.x, ... of the backend's block order
 * (qr_item: item i is the block that qr_block names i in launch order, so the experts by descending count), and
 * before each item's body asks L2 for the first NPF weight stages of its next item's slab (lane 0 of warp w the
 * block's stages w, w + WARPS, ...: a block's stage is sstride contiguous bytes), so that those stages are in L2
 * while the current item's are computed and the next item's first loads do not wait on DRAM.
 *
 * Each item is qr_body's work for that (expert, slab) with the diet's loop (qr_diet_pass: register stages, the
 * backend's D, STAGES, SUB, line prefetches and NTS body), so the same products, folds and fp32 operations in the
 * same order as version 50's block for that item; an item's outputs are its expert's rows of its slab only, written
 * by the one block that takes it, so no output depends on which block computes an item or in what order: every
 * word equals version 50's. Between items the block does what qr_body does between two passes of one expert (the
 * row table rewritten after the pass's closing __syncthreads, every read of it and of the activation ring done
 * before that barrier; the last activation stage's copies waited for in the pass), so chaining items is chaining
 * passes. A prefetch never changes a result. */

/* The expert e and slab of work item i (0 .. nexp nslab - 1): the block that qr_block names i in launch order of a
 * grid (nexp, nslab), i.e. lin = i. */
__device__ __forceinline__ void qr_item(const qe_args &a, int i, int nexp, int nslab, int *e, int *slab) {
  if (a.order) {
    *e = a.order[i / nslab];
    *slab = i % nslab;
  } else {
    *e = i % nexp;
    *slab = i / nexp;
  }
}

/* qr_body's work (DIET loop, compact records) for expert e's slab of nslab per expert: the expert's rows in passes
 * of 8 NT tokens, each pass's row table then qr_diet_pass (qr_body's prelude with nslab for gridDim.y). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF>
__device__ __forceinline__ void qr_pers_body(const qe_args &a, unsigned char *smem, const int e, const int slab,
                                             const int nslab) {
  constexpr int KC = qr_kc(GS, BITS), CB = 4 * (KC / 32) * BITS, PSC = CB % 16 == 0 ? 16 : 8;
  constexpr int WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT;
  constexpr int GU = GATEUP != 0;
  static_assert(BITS != 16 && GATEUP != QR_GATEUP_HP && D > 0, "quantized stacks, the plain epilogues, register stages");
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * nslab + slab;
  const int64_t sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    qr_diet_pass<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, 1>(a, xrow, srow, mvalid, base + p0, mp, slab, wstage0,
                                                                      wq, nst, nsa, tid, smem);
  }
}

/* The kernel of versions 107-108: gridDim.x resident blocks over the nexp x nslab items (qr_item), block b items b,
 * b + gridDim.x, ...; before each item, the next one's first NPF weight stages asked of L2 (an expert without rows:
 * none); an expert of at most 8 NTS rows takes the NTS-tile body; registers capped for MINB blocks per SM. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS,
          int NPF>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_pers_kernel(qe_args a, int nexp, int nslab) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, 1); /* bytes of a block's weight stage */
  const int items = nexp * nslab, nst = a.Kdim / qr_kc(GS, BITS), warp = threadIdx.x >> 5;
  int i = blockIdx.x, e, slab;
  if (i >= items) return;
  qr_item(a, i, nexp, nslab, &e, &slab);
  for (;;) {
    const int in = i + gridDim.x;
    int en = -1, sn = 0;
    if (in < items) qr_item(a, in, nexp, nslab, &en, &sn);
    if constexpr (NPF > 0) {
      if (en >= 0 && (threadIdx.x & 31) == 0 && a.count[en] > 0) {
        const unsigned char *p = (const unsigned char *)a.q + ((int64_t)en * nslab + sn) * nst * sstride;
        for (int k = warp; k < NPF && k < nst; k += WARPS) dg_prefetch_l2(p + k * sstride, (uint32_t)sstride);
      }
    }
    if (NTS > 0 && NTS < NT && a.count[e] <= 8 * NTS)
      qr_pers_body<BITS, GATEUP, (NTS > 0 && NTS < NT ? NTS : NT), GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, nslab);
    else
      qr_pers_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, nslab);
    if (en < 0) break;
    i = in;
    e = en;
    slab = sn;
  }
}

/* Test hook: > 0 caps the persistent grid at that many blocks (so that on the emulation, whose occupancy query
 * answers 132 SMs x 1 block, each block takes several items; tests/support/cuda_entry.cu); 0: resident blocks. */
static int qr_pers_grid_cap = 0;

/* qr_pers_kernel for the products of grid (experts, slabs) as qr_launch_g would launch them: min(items, SMs x
 * resident blocks per SM, qr_pers_grid_cap if set) blocks, qr_diet_pass's ring of dynamic shared memory (the
 * attribute set once per instantiation above 48 KB); the attribute's, query's or launch's error, else cudaSuccess. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS,
          int NPF>
cudaError_t qr_pers_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args, int, int) = qr_pers_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS, NPF>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
  static int resident = 0; /* SMs x blocks per SM, queried once per instantiation */
  if (!resident) {
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  const int items = (int)(grid.x * grid.y);
  int blocks = items < resident ? items : resident;
  if (qr_pers_grid_cap > 0 && blocks > qr_pers_grid_cap) blocks = qr_pers_grid_cap;
  if (blocks < 1) return cudaSuccess; /* no items */
  DG_LAUNCH(kern, blocks, 32 * WARPS, smem, s)(a, (int)grid.x, (int)grid.y);
  return cudaGetLastError();
}

/* Versions 107 (NPF 2) and 108 (NPF 6): for group 64 at 3 n-tiles (the backend's choices: registers for 4 blocks per
 * SM, line prefetches 2 stages ahead, the 2-tile body for experts of at most 16 rows) and at 2 n-tiles (4 blocks per
 * SM, no prefetch) qr_pers_kernel with the diet's loop; elsewhere as 96-104 (qr_diet_launch with the backend's
 * choices). */
template <int BITS, int GATEUP, int NPF>
cudaError_t qr_pers_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (a.group == 64 && nt == 3)
    return qr_pers_launch<BITS, GATEUP, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS, NPF>(s, grid, a);
  if (a.group == 64 && nt == 2)
    return qr_pers_launch<BITS, GATEUP, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0, NPF>(s, grid, a);
  return qr_diet_launch<BITS, GATEUP, 4, 2, 2, 2, 2, 4, 2>(s, grid, nt, a);
}

/* Version 109 (session 23): the backend's choices with the diet's loop, each block's first weight stage copied early.
 * Why (docs/cuda.md, "Session 23 (helper moe11)"): at the 26B canvas on the H100 the uniform M 16 timings fit blocks
 * that each take a fixed F ~ 2.85 us besides c ~ 0.885 us per 4,608-byte block stage (gate/up 44 stages, 3 rounds of
 * the 528 resident blocks: 125.5 us; down 11 stages, 6 rounds: 75.5 us), and in the stages themselves the SMs' DRAM
 * stream runs at ~89 % of the read ceiling: F costs down 23 % and gate/up 7 %. F is mostly latency: qr_block's order
 * load, then count and start, then qe_pass_rows' index loads and a barrier, and only then (qr_diet_pass) the first
 * weight load, whose DRAM round trip is the longest link. Here each lane copies its record of the slab's first D - 1
 * weight stages by cp.async into its own 4 RW (D - 1) bytes of shared memory (48 at 4-bit g64, D 2; after the
 * activation ring; no register holds them, so nothing waits for them: a first draft loaded them into registers, and
 * ptxas at the 128-register cap spilled those registers at once, the spill stores waiting on the loads) and issues the pass's
 * first L2 prefetches as soon as the expert is known, before count, start and the row table; qr_diet_pass (PRE 1)
 * reads the records back into its register stages. An expert without rows copies one stage per warp for nothing (in
 * bounds: its slab exists). Later passes of an expert (more than 8 NT rows) copy their first stages the same way
 * before their row table. The same record words in the same registers, so the same products, folds and fp32
 * operations in the same order as version 50's: every output word equal. */

/* Bytes of shared memory of qr_early_kernel's early records: WARPS x 32 lanes x (D - 1) records of RW words. */
template <int BITS, int GS, int WARPS, int D> __host__ __device__ constexpr int qr_early_bytes() {
  return WARPS * 32 * (D - 1) * qr_rec(BITS, GS);
}

/* The lane's records of the slab's first D - 1 weight stages by cp.async into W0s (its (D - 1) RW words of shared
 * memory), one commit group, and the pass's first L2 prefetches, as qr_diet_pass (PRE 0) issues its loads and
 * prefetches: wstage0 / wq the warp's stage 0 and the lane's code piece of it, nst stages sstride bytes apart. */
template <int BITS, int GS, int D, int PF>
__device__ __forceinline__ void qr_early_copies(dg_sptr W0s, const unsigned char *wstage0, const unsigned char *wq,
                                                int lane, int g, int nst, int64_t sstride) {
  constexpr int KC = qr_kc(GS, BITS), GPS = KC / GS, CB = 4 * (KC / 32) * BITS, RW = qr_rec(BITS, GS) / 4;
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, APF = PF < 0 ? -PF : PF;
  static_assert(BITS != 16 && PSC == 16 && PF <= 0, "compact 16-byte code pieces, line prefetches");
  qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, nst, sstride);
  const unsigned char *wnext = wq;
#pragma unroll
  for (int d = 0; d < D - 1; d++)
    if (d < nst) {
      if (APF > 0 && d + APF < nst) qr_prefetch_lines<CB, GPS, PSC>(wnext + (int64_t)APF * sstride, lane);
      const dg_sptr dst = W0s + 4 * RW * d;
#pragma unroll
      for (int k = 0; k < CB / 16; k++) dg_cp_async16_nz(dst + 16 * k, wnext + k * 32 * 16); /* qr_ld_pieces' */
      const unsigned char *pp = wnext - lane * 16 + 32 * CB + g * 16 * GPS;                /* qr_load_stage's */
#pragma unroll
      for (int i = 0; i < GPS; i++) dg_cp_async16_nz(dst + CB + 16 * i, pp + 16 * i);
      wnext += sstride;
    }
  dg_cp_commit();
}

/* The warp's stage 0 of expert e's slab in device memory (*wstage0) and the lane's piece of it (*wq), stages
 * WARPS qr_wstage bytes apart (qr_body's addresses). */
template <int BITS, int GS, int WARPS>
__device__ __forceinline__ void qr_early_addr(const qe_args &a, int e, int slab, int warp, int lane,
                                              const unsigned char **wstage0, const unsigned char **wq) {
  constexpr int KC = qr_kc(GS, BITS), CB = 4 * (KC / 32) * BITS, PSC = CB % 16 == 0 ? 16 : 8;
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, 1);
  const int nst = a.Kdim / KC;
  *wstage0 = (const unsigned char *)a.q + ((int64_t)e * gridDim.y + slab) * nst * sstride +
             (int64_t)warp * qr_wstage(BITS, GS, 1);
  *wq = *wstage0 + lane * PSC;
}

/* qr_body's work for expert e's slab (DIET loop, compact records) whose first pass's first D - 1 weight stages are
 * already on their way into W0 (the lane's early records in shared memory, qr_early_copies); a later pass (an
 * expert of more than 8 NT rows) copies its own the same way before its row table; qr_diet_pass PRE 1. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF>
__device__ __forceinline__ void qr_early_body(const qe_args &a, unsigned char *smem, const int e, const int slab,
                                              const uint32_t *W0, const unsigned char *wstage0,
                                              const unsigned char *wq) {
  constexpr int KC = qr_kc(GS, BITS);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT;
  constexpr int GU = GATEUP != 0;
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, 1);
  static_assert(BITS != 16 && GATEUP != QR_GATEUP_HP && D > 1, "quantized stacks, the plain epilogues, register stages");
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  const int cnt = a.count[e];
  if (cnt == 0) {
    dg_cp_wait<0>(); /* the early copies land before the block exits */
    return;
  }
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    if (p0 > 0) qr_early_copies<BITS, GS, D, PF>(dg_sp(W0), wstage0, wq, lane, g, nst, sstride); /* this pass's */
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    qr_diet_pass<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, 1, 1>(a, xrow, srow, mvalid, base + p0, mp, slab,
                                                                         wstage0, wq, nst, nsa, tid, smem, W0);
  }
}

/* The kernel of version 109: qr_kernel's (block order, the NTS-tile body for experts of at most 8 NTS rows, MINB
 * blocks per SM the registers are capped for) with qr_early_body; the first weight stages' copies (the same for both
 * bodies, into shared memory after the NT-tile body's activation ring) go out as soon as qr_block has named the
 * expert, before its count is read. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_early_kernel(qe_args a) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  constexpr int RW = qr_rec(BITS, GS) / 4;
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, 1);
  constexpr int RING = STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0)); /* the larger body's ring */
  int e, slab;
  qr_block(a, &e, &slab);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned char *wstage0, *wq;
  qr_early_addr<BITS, GS, WARPS>(a, e, slab, warp, lane, &wstage0, &wq);
  const uint32_t *W0 = (const uint32_t *)(smem + RING + 4 * RW * (D - 1) * tid); /* this lane's early records */
  qr_early_copies<BITS, GS, D, PF>(dg_sp(W0), wstage0, wq, lane, lane >> 2, a.Kdim / qr_kc(GS, BITS), sstride);
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_early_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, W0, wstage0, wq);
      return;
    }
  }
  qr_early_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, W0, wstage0, wq);
}

/* qr_early_kernel over grid (experts, slabs) as qr_launch_g launches qr_kernel (the diet's ring of dynamic shared
 * memory and the early records after it, qr_early_bytes; the attribute set once per instantiation above 48 KB); the
 * attribute's or the launch's error. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
cudaError_t qr_early_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args) = qr_early_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0)) +
                          qr_early_bytes<BITS, GS, WARPS, D>(); /* the ring, then the early records */
#ifndef DG_CUDA_EMU
  static int set = 0; /* one attribute call per instantiation */
  if (!set && smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, grid, 32 * WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* Version 109: for group 64 at 3 n-tiles (the backend's choices: registers for 4 blocks per SM, line prefetches 2
 * stages ahead, the 2-tile body for experts of at most 16 rows) and at 2 n-tiles (4 blocks per SM, no prefetch)
 * qr_early_kernel; elsewhere as 96-104 (qr_diet_launch with the backend's choices). */
template <int BITS, int GATEUP>
cudaError_t qr_early_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (a.group == 64 && nt == 3)
    return qr_early_launch<BITS, GATEUP, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS>(s, grid, a);
  if (a.group == 64 && nt == 2)
    return qr_early_launch<BITS, GATEUP, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0>(s, grid, a);
  return qr_diet_launch<BITS, GATEUP, 4, 2, 2, 2, 2, 4, 2>(s, grid, nt, a);
}

/* Version 110 (session 24, helper mo11): version 50's kernel (qr_kernel with the backend's choices at 2 and 3 n-tiles,
 * its stage loop DIET 0 there) with a per-block timeline: thread 0 of each block writes QR_TL_WORDS 64-bit words to
 * qr_tl_buf at word QR_TL_WORDS x (blockIdx.y gridDim.x + blockIdx.x) (the launch order): 0 %globaltimer (ns) at entry
 * (after griddepcontrol.wait), 1 %globaltimer at the end (the last pass's epilogue issued, or an expert without rows
 * found), 2-7 %clock64 (SM cycles) at entry, the row table ready (the first pass; after its barrier), the first
 * activation stage landed (after that stage's barrier), the first weight stage landed in thread 0's registers (read
 * after a comparison of the record's first word with 0x9e3779b9: in-order issue makes the read wait for that load, the
 * SASS checked; 0 in the one case in 2^32 where the word is that value), the stage loop's end (the last pass, after
 * its barrier) and the epilogue's end (the last pass), 8 %smid, 9 the expert << 32 | its row count. An expert without
 * rows: words 3-7 all at its end. The stamps are the hooks of qr_body's TL parameter (qr_tl_none in the backend):
 * stores to this buffer only, so every output word is version 50's (test_quant_experts_lab, the lab's "= v50"). Where
 * the phases' lengths come from %clock64 (the SM's cycles, converted by the ratio of clock64 to globaltimer over all
 * blocks), the start times against the launch from %globaltimer (one clock for every SM). */
#define QR_TL_WORDS 10
#ifdef DG_CUDA_EMU /* no clocks: one counter, so each block's stamps increase in program order */
static inline uint64_t qr_tl_tick() {
  static uint64_t n;
  return ++n;
}
static inline uint64_t qr_tl_clock() { return qr_tl_tick(); }
static inline uint64_t qr_tl_gtime() { return qr_tl_tick(); }
static inline uint64_t qr_tl_clock_after(uint32_t) { return qr_tl_tick(); }
static inline unsigned qr_tl_smid() { return 0; }
#else
__device__ __forceinline__ uint64_t qr_tl_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint64_t qr_tl_gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
  return t;
}
/* %clock64 read once v is in its register (0 if v is 0x9e3779b9): the read's result is selected by a comparison of
 * v, which ptxas emits as ISETP, CS2R, SEL; a warp issues in order, so the clock is read only once the ISETP has had
 * v, i.e. once v's load landed (the lab's SASS was checked for the ISETP before the CS2R: docs/cuda.md, session 24). */
__device__ __forceinline__ uint64_t qr_tl_clock_after(uint32_t v) {
  uint64_t t;
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0x9e3779b9;\n mov.u64 %0, 0;\n @p mov.u64 %0, %%clock64;\n}\n"
               : "=l"(t)
               : "r"(v)
               : "memory");
  return t;
}
__device__ __forceinline__ unsigned qr_tl_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(r));
  return r;
}
#endif

/* qr_body's TL hooks for version 110: thread 0 writes its block's words (above) at b. */
struct qr_tl_stamps {
  static constexpr bool on = true; /* act0 and w0 in a copy of qr_body's first iteration, outside the stage loop */
  uint64_t *b;
  __device__ __forceinline__ void rows(int tid, int p0) const {
    if (tid == 0 && p0 == 0) b[3] = qr_tl_clock();
  }
  __device__ __forceinline__ void act0(int tid, int p0) const {
    if (tid == 0 && p0 == 0) b[4] = qr_tl_clock();
  }
  __device__ __forceinline__ void w0(int tid, int p0, uint32_t v) const {
    if (tid == 0 && p0 == 0) b[5] = qr_tl_clock_after(v);
  }
  __device__ __forceinline__ void loop(int tid) const {
    if (tid == 0) b[6] = qr_tl_clock();
  }
  __device__ __forceinline__ void epi(int tid) const {
    if (tid == 0) {
      b[7] = qr_tl_clock();
      b[1] = qr_tl_gtime();
    }
  }
  __device__ __forceinline__ void empty(int tid) const {
    if (tid == 0) {
      const uint64_t c = qr_tl_clock();
      for (int k = 3; k < 8; k++) b[k] = c;
      b[1] = qr_tl_gtime();
    }
  }
  __device__ __forceinline__ unsigned slabs() const { return gridDim.y; } /* the grid (experts, slabs), as qr_tl_none */
};

/* The kernel of version 110: qr_kernel (DIET 0, no bias products, NZ 0) with the stamps (qr_tl_stamps) into tl. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_tl_kernel(qe_args a, uint64_t *tl) {
  DG_PDL_LAUNCH();
  qr_prewait<BITS, GATEUP, GS, WARPS, 1>(a);
  DG_PDL_WAIT();
  uint64_t g0 = 0, c0 = 0; /* entry: after the wait for the grid before (under PDL a block may be placed earlier) */
  if (threadIdx.x == 0) {
    g0 = qr_tl_gtime();
    c0 = qr_tl_clock();
  }
  DG_DYN_SMEM16(smem);
  int e, slab;
  qr_block(a, &e, &slab);
  const qr_tl_stamps st{tl + (int64_t)QR_TL_WORDS * (blockIdx.y * gridDim.x + blockIdx.x)};
  if (threadIdx.x == 0) {
    st.b[0] = g0;
    st.b[2] = c0;
    st.b[8] = qr_tl_smid();
    st.b[9] = (uint64_t)e << 32 | (uint32_t)a.count[e];
  }
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, qr_tl_stamps>(a, smem, e, slab, st);
      return;
    }
  }
  qr_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, qr_tl_stamps>(a, smem, e, slab, st);
}

/* The timeline buffer of version 110's last launch (host side): its words, the blocks it holds (0: the last launch of
 * version 110 ran version 50's kernel without stamps, i.e. not 4-bit g64 at 2 or 3 n-tiles). */
static uint64_t *qr_tl_buf;
static size_t qr_tl_cap, qr_tl_blocks;

/* qr_tl_kernel over grid (experts, slabs) as qr_launch_g launches qr_kernel; the buffer grown (zeroed) to the grid. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
cudaError_t qr_tl_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args, uint64_t *) = qr_tl_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
  const size_t blocks = (size_t)grid.x * grid.y;
  if (blocks > qr_tl_cap) {
    if (qr_tl_buf) cudaFree(qr_tl_buf);
    qr_tl_buf = NULL;
    qr_tl_cap = 0;
    cudaError_t e = cudaMalloc((void **)&qr_tl_buf, blocks * QR_TL_WORDS * 8);
    if (e != cudaSuccess) return e;
    e = cudaMemset(qr_tl_buf, 0, blocks * QR_TL_WORDS * 8);
    if (e != cudaSuccess) return e;
    qr_tl_cap = blocks;
  }
  qr_tl_blocks = blocks;
#ifndef DG_CUDA_EMU
  static int set = 0; /* one attribute call per instantiation */
  if (!set && smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, grid, 32 * WARPS, smem, s)(a, qr_tl_buf);
  return cudaGetLastError();
}

/* Version 110: for group 64 at 3 n-tiles and 2 n-tiles version 50's launch (qr_launch_bits' choices there, DIET 0)
 * with the timeline (qr_tl_kernel); elsewhere version 50 itself, no timeline (qr_tl_blocks 0). */
template <int BITS, int GATEUP>
cudaError_t qr_tl_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  static_assert(!((QR_DIET_TILES >> 2) & 1) && !((QR_DIET_TILES >> 3) & 1), "version 50 runs DIET 0 at 2 and 3 n-tiles");
  if (a.group == 64 && nt == 3)
    return qr_tl_launch<BITS, GATEUP, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS>(s, grid, a);
  if (a.group == 64 && nt == 2)
    return qr_tl_launch<BITS, GATEUP, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0>(s, grid, a);
  qr_tl_blocks = 0;
  return qr_launch_bits<BITS, GATEUP>(s, grid, nt, a);
}

/* Version 111 (session 24, helper mo11): the down product's blocks each take two consecutive n-slabs of one expert
 * (grid (experts, ceil(slabs / 2)): the 26B's 2,816 blocks of 11 weight stages become 1,408 of 22, 2.67 rounds of
 * the 528 resident blocks instead of 5.33), with one weight and activation pipeline across both: the slabs' weight
 * stages are contiguous in the lane-record layout (slab y of expert e at stage (e slabs + y) nst), so the register
 * stages, the L2 line prefetches and the activation ring simply run on over 2 nst stages (the activation columns
 * starting again at 0 for the second slab; its first stages issued during the first slab's last ones), and only the
 * accumulators are stored (the epilogue) and zeroed between the slabs. The model (docs/cuda.md, session 23: a block
 * costs F + n c, F = 2.85 us, c = 0.885 us) gives the uniform M 16 down product 3 (22 c + F) = 67 us against
 * 6 (11 c + F) = 75.5 us if the second slab pays none of F, 70 us if it pays its epilogue and ~1 us more. Per slab the
 * same products and folds in the same order as qr_body's (version 50's), so every output word is version 50's.
 * Gate/up keeps version 50 (11 slabs per expert: 704 blocks of 88 stages would be 1.33 rounds, i.e. 2 rounds of twice
 * the time: 161 us against 125.5 by the same model). Non-diet loop (DIET 0) as version 50 at 2 and 3 n-tiles, D 2. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF>
__device__ __forceinline__ void qr_pair_body(const qe_args &a, unsigned char *smem, const int e, const int pair,
                                             const int nslab) {
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, CB = 4 * RUNS * BITS, RW = qr_rec(BITS, GS) / 4;
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT, KA = SUB * KC;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, STB = XB + qr_sbb(GS, SUB, NT, 0);
  constexpr int GU = GATEUP != 0;
  static_assert(BITS != 16 && GATEUP != QR_GATEUP_HP && D == 2,
                "quantized stacks, the plain epilogues, 2 register stages");
  __shared__ int64_t xrow[NTOK];
  __shared__ int64_t srow[NTOK];
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int slab0 = 2 * pair, ns = min(2, nslab - slab0), vst = ns * nst, vsa = ns * nsa; /* the block's stages */
  constexpr int64_t sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + ((int64_t)e * nslab + slab0) * nst * sstride +
                                 (int64_t)warp * WSTAGE; /* the warp's stage 0 of the first slab; the second's follow */
  const unsigned char *wq = wstage0 + lane * PSC;
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    qr_xcopy<GS, NTOK, THREADS, KA, XS, XB, GPS, SUB, 0, 0> xc;
    xc.init(a, xrow, srow, tid);
    const dg_sptr sbase = dg_sp(smem);
    int islot = 0, icol = 0;
    auto issue = [&]() { /* the activation stages of both slabs in turn: the columns start again at the second */
      xc.issue(sbase + islot * STB, icol, a.Kdim);
      islot = islot == STAGES - 1 ? 0 : islot + 1;
      icol += KA;
      if (icol >= nsa * KA) icol = 0;
    };
    const unsigned char *wnext = wq;
    int wst = 0;
    auto wload = [&](uint32_t *R) { /* the weight stages of both slabs in turn (contiguous), prefetches across */
      qr_load_stage<BITS, GS, 1, PF>(R, wnext, lane, g, wst, vst, sstride);
      wnext += sstride;
      if constexpr (PF != 0) wst++;
    };
    float acc[2][NT][4], part[2][NT][4];
    qe_zero(acc);
    qe_zero(part);
    uint32_t af[2][4] = {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}};
    const uint32_t asel = qr_bias_sel<BITS>(t);
    int cslot = 0;
    auto compute = [&](const uint32_t *R, int s, int sub) {
      qr_stage_products<BITS, NT, GS, SUB, 0, 0>(acc, part, af, R, smem, cslot * STB, s, sub, ng, g, t, asel);
    };
    auto astage = [&](int va) { /* va: the activation stage over both slabs */
      if (va > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
      dg_cp_wait<STAGES - 2>();
      __syncthreads();
      if (va + STAGES - 1 < vsa) issue();
      dg_cp_commit();
    };
    uint32_t W[D][RW];
#pragma unroll
    for (int sa = 0; sa < STAGES - 1; sa++) {
      if (sa < vsa) issue();
      dg_cp_commit();
    }
    qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, vst, sstride);
    if (vst > 0) wload(W[0]);
    /* slab k's stages s = 0 .. nst - 1, block stage k nst + s in register slot (k nst + s) mod 2: OFF = k nst mod 2 */
    auto run = [&](int k, auto off) {
      constexpr int OFF = decltype(off)::value;
      for (int it = 0; it < nst; it += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
          const int s = it + d;
          if (s < nst) {
            if (k * nst + s + 1 < vst) wload(W[(d + OFF + 1) % D]); /* the slot of the stage before, computed */
            const int sub = D % SUB == 0 ? d % SUB : s % SUB; /* (it is a multiple of D) */
            if (sub == 0) astage(k * nsa + s / SUB);
            compute(W[(d + OFF) % D], s, sub);
          }
        }
      }
    };
    for (int k = 0; k < ns; k++) {
      if ((k * nst) % D == 0) run(k, std::integral_constant<int, 0>());
      else run(k, std::integral_constant<int, 1>());
      const int slab = slab0 + k;
      const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
      bool mvalid[2];
#pragma unroll
      for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
      if (k + 1 == ns) __syncthreads(); /* every warp is done with the ring before the next pass refills it */
      qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t, smem);
      qe_zero(acc);
      qe_zero(part);
    }
  }
}

/* The kernel of version 111: qr_kernel's block order over (experts, pairs of slabs) (nslab: the product's slabs per
 * expert), the NTS-tile body for experts of at most 8 NTS rows, with qr_pair_body. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_pair_kernel(qe_args a, int nslab) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  int e, pair;
  qr_block(a, &e, &pair);
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_pair_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, pair, nslab);
      return;
    }
  }
  qr_pair_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, pair, nslab);
}

/* qr_pair_kernel over (experts, ceil(slabs / 2)) for the grid (experts, slabs) of qr_launch_g. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
cudaError_t qr_pair_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args, int) = qr_pair_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
#ifndef DG_CUDA_EMU
  static int set = 0;
  if (!set && smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, dim3(grid.x, (grid.y + 1) / 2), 32 * WARPS, smem, s)(a, (int)grid.y);
  return cudaGetLastError();
}

/* Version 111: the down product at 3 and 2 n-tiles (group 64, version 50's choices there) by qr_pair_kernel;
 * gate/up and everything else version 50's kernel. */
template <int BITS, int GATEUP>
cudaError_t qr_pair_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if constexpr (GATEUP == 0) {
    if (a.group == 64 && nt == 3)
      return qr_pair_launch<BITS, 0, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS>(s, grid, a);
    if (a.group == 64 && nt == 2)
      return qr_pair_launch<BITS, 0, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0>(s, grid, a);
  }
  return qr_launch_bits<BITS, GATEUP>(s, grid, nt, a);
}

/* Version 112 (session 25, helper sk11): the last partial round of blocks split along K (a static tail split).
 * Why (docs/cuda.md, "Session 25 (helper sk11)"): the per-block timelines of version 110 on an H100 (session 24's call)
 * show the 26B canvas's gate/up product as 1,408 blocks over 528 resident slots (4 per SM), 2.67 rounds, whose last
 * round leaves its slots 50-60 % busy for 28 % of the span, and a block in that round no faster than one in a full round
 * (its stream is latency-bound, ~0.78 us per weight stage either way); the down product's 2,816 blocks are 5.33 rounds.
 * Here the first whole = floor(items / slots) x slots items (in the backend's order: experts by descending row count,
 * each expert's slabs in turn, qr_item) run whole as version 50's blocks do, and each of the remaining items is split
 * into QR_SK_P pieces of consecutive weight stages (piece k: stages [nst k / P, nst (k + 1) / P)), one block each,
 * launched after the whole items. At the 26B's shapes P 3 makes the pieces whole rounds: gate/up 352 tail items x 3 =
 * 1,056 pieces = 2 rounds of 14-15 stages, down 176 x 3 = 528 = 1 round of 3-4 stages.
 *
 * A piece runs the diet's loop (qr_sk_pass: qr_diet_pass with its epilogue left to the caller) over its stages with
 * the activation columns and group sums offset to its first stage (a qe_args copy: X, xs and Kdim), so its fp32 sums
 * are the same products and folds as version 50's over those groups, in the same order; it stores them (acc, fp32) to
 * a workspace at (piece, slab, grouped row, weight row of the block), then adds one to the item's counter (after a
 * __threadfence). The piece that finds the counter at P - 1 (the last to finish) resets it, reads the P partial sums
 * of every row through L2 (__ldcg) and adds them in piece order, ((s_0 + s_1) + s_2), whichever piece arrives last, so
 * the output is deterministic, then runs version 50's epilogue (GeGLU and the bf16 store, or the fp32 y store).
 * Rounding: the sum over the stages is now P chains of 2 ng_k fmaf roundings joined by P - 1 additions instead of one
 * chain of 2 ng, so a split item's output words may differ from version 50's; every output stays within the bound the
 * lab and tests/test_cuda.c derive (qdot_bound counts 2 ng + 1 roundings of the running sum, and a split's longest
 * chain is at most 2 (ng - P + 1) + P - 1 <= 2 ng + 1). Whole items are version 50's words exactly.
 * Workspace: QR_SK_P x slabs x qr_sk_rows (the routed rows, T x top-k, set by the caller) x 32 WARPS floats, and a
 * counter per item, zeroed once (each last piece leaves its counter 0 for the next launch). */
#define QR_SK_P 3
static int qr_sk_rows = 0;      /* the routed rows T x top-k of the products to come (the caller's) */
static int qr_sk_slots_cap = 0; /* test hook: > 0 takes the resident slots as this many (a tail on the emulation) */
static float *qr_sk_ws;
static int *qr_sk_ctr;
static size_t qr_sk_ws_cap, qr_sk_ctr_cap;

/* qr_diet_pass (src/cuda/qmoe_r.cuh, CP 1, PRE 0) with the pass's fp32 sums left in acc instead of stored: the same
 * loads, copies, products and folds in the same order (the same code, the epilogue cut off). */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF>
__device__ __forceinline__ void qr_sk_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                           const unsigned char *wstage0, const unsigned char *wq, int nst, int nsa,
                                           int tid, unsigned char *smem, float (&acc)[2][NT][4]) {
  constexpr int KC = qr_kc(GS, BITS), RW = qr_rec(BITS, GS) / 4, NTOK = 8 * NT, KA = SUB * KC;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, STB = XB + qr_sbb(GS, SUB, NT, 0);
  constexpr int APF = PF < 0 ? -PF : PF, GPW = BITS == 16 ? 0 : KC / GS, THREADS = 32 * WARPS;
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, 1);
  const int lane = tid & 31, g = lane >> 2, t = lane & 3, Kdim = a.Kdim;
  const dg_sptr sbase = dg_sp(smem);
  float part[2][NT][4];
  qe_zero(acc);
  qe_zero(part);
  qr_xdiet<GS, NTOK, THREADS, KA, XS, XB, GPW, SUB> xc;
  xc.init(a, xrow, srow, tid);
  constexpr int FAST = 2 * D - 1 + APF > D + (STAGES - 1) * SUB ? 2 * D - 1 + APF : D + (STAGES - 1) * SUB;
  int islot = 0, icol = 0, cslot = 0;
  auto issue = [&](auto full) {
    xc.template issue<decltype(full)::value>(sbase + islot * STB, icol, Kdim, tid);
    islot = islot == STAGES - 1 ? 0 : islot + 1;
    icol += KA;
  };
#pragma unroll
  for (int sa = 0; sa < STAGES - 1; sa++) {
    if (sa < nsa) issue(std::false_type());
    dg_cp_commit();
  }
  uint32_t W[D][RW];
  const unsigned char *wnext = wq;
  qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, nst, sstride);
#pragma unroll
  for (int d = 0; d < D - 1; d++)
    if (d < nst) {
      qr_load_stage<BITS, GS, 1, PF>(W[d], wnext, lane, g, d, nst, sstride);
      wnext += sstride;
    }
  const dg_sptr xl0 = sbase + g * XS + 16 * t, sl0 = sbase + XB + 8 * t;
  auto astage = [&](int s, auto full) {
    if (s > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
    dg_cp_wait<STAGES - 2>();
    __syncthreads();
    if (decltype(full)::value || s / SUB + STAGES - 1 < nsa) issue(full);
    dg_cp_commit();
  };
  int it = 0;
  if constexpr (D % SUB == 0) {
    for (; it + FAST <= nst; it += D) {
#pragma unroll
      for (int d = 0; d < D; d++) {
        const int s = it + d;
        qr_load_stage<BITS, GS, 1, PF, true>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
        wnext += sstride;
        if (d % SUB == 0) astage(s, std::true_type());
        qr_stage_diet<BITS, NT, GS, SUB>(acc, part, W[d], xl0 + cslot * STB, sl0 + cslot * STB, d % SUB);
      }
    }
  }
  for (; it < nst; it += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int s = it + d;
      if (s < nst) {
        if (s + D - 1 < nst) {
          qr_load_stage<BITS, GS, 1, PF>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
          wnext += sstride;
        }
        const int sub = D % SUB == 0 ? d % SUB : s % SUB;
        if (sub == 0) astage(s, std::false_type());
        qr_stage_diet<BITS, NT, GS, SUB>(acc, part, W[d], xl0 + cslot * STB, sl0 + cslot * STB, sub);
      }
    }
  }
  __syncthreads(); /* every warp is done with the ring before the next pass refills it */
}

/* The workspace word of weight row col (0 .. 32 WARPS - 1) of slab slab, grouped row row, piece k. */
__device__ __forceinline__ int64_t qr_sk_at(int k, int slab, int nslab, int rows, int row, int col, int rpb) {
  return (((int64_t)k * nslab + slab) * rows + row) * rpb + col;
}

/* Item (e, slab)'s work: whole (piece < 0: version 50's block with the diet's loop, qr_pers_body's) or piece `piece` of
 * QR_SK_P (its stages, its partial sums to ws, the last piece's sum in piece order and the epilogue); ctr: the item's
 * counter. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF>
__device__ __forceinline__ void qr_sk_body(const qe_args &a, unsigned char *smem, const int e, const int slab,
                                           const int nslab, const int piece, float *ws, int *ctr, const int rows) {
  constexpr int KC = qr_kc(GS, BITS), CB = 4 * (KC / 32) * BITS, PSC = CB % 16 == 0 ? 16 : 8;
  constexpr int WSTAGE = qr_wstage(BITS, GS, 1), P = QR_SK_P;
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT;
  constexpr int GU = GATEUP != 0;
  static_assert(BITS != 16 && GATEUP != QR_GATEUP_HP && D > 0, "quantized stacks, the plain epilogues, register stages");
  __shared__ int64_t xrow[NTOK];
  __shared__ int64_t srow[NTOK];
  __shared__ int last;
  const int cnt = a.count[e];
  if (cnt == 0) return; /* every piece of an expert without rows returns here: its counter stays 0 */
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC;
  const int s0 = piece < 0 ? 0 : nst * piece / P, s1 = piece < 0 ? nst : nst * (piece + 1) / P;
  const int nstp = s1 - s0, nsap = (nstp + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * nslab + slab;
  const int64_t sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 =
      (const unsigned char *)a.q + (si * nst + s0) * sstride + (int64_t)warp * WSTAGE; /* the piece's first stage */
  const unsigned char *wq = wstage0 + lane * PSC;
  qe_args ap = a; /* the piece's columns: its activations and group sums from its first stage on */
  ap.X = a.X + (int64_t)s0 * KC;
  ap.xs = a.xs + (int64_t)s0 * (KC / GS);
  ap.Kdim = nstp * KC;
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid); /* offsets by the full Kdim */
    __syncthreads();
    float acc[2][NT][4];
    qr_sk_pass<BITS, NT, GS, WARPS, D, STAGES, SUB, PF>(ap, xrow, srow, wstage0, wq, nstp, nsap, tid, smem, acc);
    if (piece < 0) {
      qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t, smem);
      continue;
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int tk = 8 * j + 2 * t + (i & 1);
          if (tk < mp)
            ws[qr_sk_at(piece, slab, nslab, rows, base + p0 + tk, warp * 32 + mt * 16 + g + 8 * (i >> 1), ROWS)] =
                acc[mt][j][i];
        }
  }
  if (piece < 0) return;
  __threadfence(); /* this thread's partial sums visible device-wide before the count below */
  __syncthreads();
  if (tid == 0) {
    const int old = atomicAdd(ctr + si, 1);
    last = old == P - 1;
    if (last) ctr[si] = 0; /* for the next launch (no other piece of this item is left to count) */
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int tk = 8 * j + 2 * t + (i & 1), col = warp * 32 + mt * 16 + g + 8 * (i >> 1);
          float v = 0.0f;
          if (tk < mp) {
            v = __ldcg(ws + qr_sk_at(0, slab, nslab, rows, base + p0 + tk, col, ROWS));
#pragma unroll
            for (int k = 1; k < P; k++) v = v + __ldcg(ws + qr_sk_at(k, slab, nslab, rows, base + p0 + tk, col, ROWS));
          }
          acc[mt][j][i] = v;
        }
    qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t, smem);
  }
}

/* The kernel of version 112: block b < whole takes item b whole, block whole + P u + k piece k of item whole + u
 * (qr_item's order); an expert of at most 8 NTS rows takes the NTS-tile body. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_sk_kernel(qe_args a, int nexp, int nslab, int whole, float *ws,
                                                                 int *ctr, int rows) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  const int b = blockIdx.x;
  const int i = b < whole ? b : whole + (b - whole) / QR_SK_P, piece = b < whole ? -1 : (b - whole) % QR_SK_P;
  int e, slab;
  qr_item(a, i, nexp, nslab, &e, &slab);
  if (NTS > 0 && NTS < NT && a.count[e] <= 8 * NTS)
    qr_sk_body<BITS, GATEUP, (NTS > 0 && NTS < NT ? NTS : NT), GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, nslab,
                                                                                             piece, ws, ctr, rows);
  else
    qr_sk_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF>(a, smem, e, slab, nslab, piece, ws, ctr, rows);
}

/* Grow a device buffer to n elements of sz bytes, zeroed. */
template <class T> static cudaError_t qr_sk_grow(T **p, size_t *cap, size_t n) {
  if (n <= *cap) return cudaSuccess;
  if (*p) cudaFree(*p);
  *p = NULL;
  *cap = 0;
  cudaError_t e = cudaMalloc((void **)p, n * sizeof(T));
  if (e == cudaSuccess) e = cudaMemset(*p, 0, n * sizeof(T));
  if (e == cudaSuccess) *cap = n;
  return e;
}

/* qr_sk_kernel for the products of grid (experts, slabs) as qr_launch_g would launch them: slots = SMs x resident
 * blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor; qr_sk_slots_cap if set), whole = floor(items / slots)
 * x slots items whole and the rest in QR_SK_P pieces (none split if the stage count is under P or items divide
 * evenly); the workspace and counters grown to qr_sk_rows (cudaErrorInvalidValue if unset). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
cudaError_t qr_sk_launch(cudaStream_t s, dim3 grid, const qe_args &a) {
  void (*kern)(qe_args, int, int, int, float *, int *, int) =
      qr_sk_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
  static int resident = 0;
  if (!resident) {
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  if (qr_sk_rows < 1) return cudaErrorInvalidValue;
  const int slots = qr_sk_slots_cap > 0 ? qr_sk_slots_cap : resident;
  const int items = (int)(grid.x * grid.y), nst = a.Kdim / qr_kc(GS, BITS);
  const int whole = nst < QR_SK_P ? items : items / slots * slots, blocks = whole + (items - whole) * QR_SK_P;
  if (blocks < 1) return cudaSuccess;
  cudaError_t e = qr_sk_grow(&qr_sk_ws, &qr_sk_ws_cap, (size_t)QR_SK_P * grid.y * qr_sk_rows * 32 * WARPS);
  if (e == cudaSuccess) e = qr_sk_grow(&qr_sk_ctr, &qr_sk_ctr_cap, (size_t)items);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, blocks, 32 * WARPS, smem, s)(a, (int)grid.x, (int)grid.y, whole, qr_sk_ws, qr_sk_ctr, qr_sk_rows);
  return cudaGetLastError();
}

/* Version 112: for group 64 at 3 n-tiles (the backend's choices: 4 blocks per SM, line prefetches 2 stages ahead, the
 * 2-tile body for experts of at most 16 rows) and at 2 n-tiles (4 blocks per SM, no prefetch) qr_sk_kernel; elsewhere
 * as 96-104 (qr_diet_launch with the backend's choices). */
template <int BITS, int GATEUP>
cudaError_t qr_sk_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (a.group == 64 && nt == 3)
    return qr_sk_launch<BITS, GATEUP, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS>(s, grid, a);
  if (a.group == 64 && nt == 2)
    return qr_sk_launch<BITS, GATEUP, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0>(s, grid, a);
  return qr_diet_launch<BITS, GATEUP, 4, 2, 2, 2, 2, 4, 2>(s, grid, nt, a);
}

/* Version 113 (session 25): what the lab's timing holds besides the blocks' own time (session 24's timelines: the
 * median minus the span of the blocks is 7-9 us in every row): an empty kernel (DG_PDL_ENTRY, then return) over the
 * same grid (experts, slabs), with qr_kernel's block of 32 QR_WARPS threads and its dynamic shared memory at the tile
 * count nt (2 or 3; other counts: 3's), launched and timed as every version is (after the L2 flush, between two
 * events). No output (the lab prints it as a probe). Its blocks are not capped at 4 per SM (no registers to speak of),
 * so it takes the launch, the block scheduling of the grid and the events' own cost, not the slots' rounds. */
__global__ void __launch_bounds__(32 * QR_WARPS) qr_empty_kernel(qe_args a) {
  DG_PDL_ENTRY();
  (void)a;
}
template <int BITS>
cudaError_t qr_empty_version(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  const int n = nt == 2 ? 2 : 3;
  const size_t smem = (size_t)QR_STAGES * (8 * n * qr_xs(64, QR_SUB, BITS) + qr_sbb(64, QR_SUB, n, 0));
  DG_LAUNCH(qr_empty_kernel, grid, 32 * QR_WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* Version 114 (session 26, helper fg11): gate/up and down in one launch, each down block starting as soon as its
 * expert's gate/up blocks are done: the backend's qr_fg_kernel (src/cuda/qmoe_fg.cuh, its design and the argument
 * that it cannot deadlock; the backend's with DGEMMA_EXPERTS_FG=1 since session 26's helper fgb), launched through the
 * library's qr_fg_bits<4> with the lab's own counters below. */
/* The lab's counters of qr_fg_kernel: 3 + experts ints, zeroed when allocated; the kernels leave them zeroed. */
static int *qr_fg_ctr;
static int qr_fg_ctr_cap;
static cudaError_t qr_fg_ctr_grow(int E) {
  if (E <= qr_fg_ctr_cap) return cudaSuccess;
  if (qr_fg_ctr) cudaFree(qr_fg_ctr);
  qr_fg_ctr = NULL;
  qr_fg_ctr_cap = 0;
  cudaError_t e = cudaMalloc((void **)&qr_fg_ctr, (size_t)(3 + E) * 4);
  if (e == cudaSuccess) e = cudaMemset(qr_fg_ctr, 0, (size_t)(3 + E) * 4);
  if (e == cudaSuccess) qr_fg_ctr_cap = E;
  return e;
}
/* After version 114's launches (synchronized): 1 if a wait raised the error flag (cleared here), 2 if a counter was
 * not back at 0 (the reset), else 0; -1 if the counters could not be read. */
static int qr_fg_error(int E) {
  if (!qr_fg_ctr || E > qr_fg_ctr_cap) return 0;
  std::vector<int> c((size_t)(3 + E));
  if (cudaMemcpy(c.data(), qr_fg_ctr, c.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
  int r = 0;
  for (size_t i = 0; i < c.size(); i++)
    if (i != 2 && c[i] != 0) r = 2;
  if (c[2]) {
    r = 1;
    const int z = 0;
    if (cudaMemcpy(qr_fg_ctr + 2, &z, 4, cudaMemcpyHostToDevice) != cudaSuccess) return -1;
  }
  return r;
}

/* Version 50's gate/up + down as the backend runs them with DGEMMA_DN_FUSE=1: gate/up (QR_GATEUP_HP: h in the down
 * product's fragment order and its sums into gu.h, gu.hs) over the grid (E, ngu), then down over them (E, ndn);
 * dn.X = gu.h and dn.xs = gu.hs are the caller's. */
extern template cudaError_t qr_launch_bits<4, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &); /* the library's */
template <int BITS> cudaError_t qr_fg_v50(cudaStream_t s, int E, int nt, const qe_args &gu, const qe_args &dn) {
  const int ngu = (gu.N + 16 * QR_WARPS - 1) / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  cudaError_t e = qr_launch_bits<BITS, QR_GATEUP_HP>(s, dim3(E, ngu), nt, gu);
  return e != cudaSuccess ? e : qr_launch_bits<BITS, 0>(s, dim3(E, ndn), nt, dn);
}

/* Version 114: gate/up (gu, with the HP epilogue's hg and hs) and down (dn: X = gu.h, xs = gu.hs) over E experts at
 * nt n-tiles (qe_nt) in one launch (the library's qr_fg_bits<4>: qr_fg_kernel with the backend's choices) for group
 * 64 at 2 and 3 n-tiles; elsewhere version 50's two launches (qr_fg_v50). The HP epilogue needs whole slabs of
 * features (gu.N a multiple of 16 QR_WARPS) and gu.hg 32 or 64 (k_qe_dn_fuse_group's conditions);
 * cudaErrorInvalidValue otherwise. */
template <int BITS> cudaError_t qr_fg_version(cudaStream_t s, int E, int nt, const qe_args &gu, const qe_args &dn) {
  if (!gu.hs || gu.N % (16 * QR_WARPS) || (gu.hg != 32 && gu.hg != 64) || gu.group != gu.hg || dn.group != gu.hg ||
      dn.X != gu.h || dn.xs != gu.hs || dn.Kdim != gu.N)
    return cudaErrorInvalidValue;
  if (qr_fg_takes(nt, gu, dn)) {
    const cudaError_t e = qr_fg_ctr_grow(E);
    return e != cudaSuccess ? e : qr_fg_bits<BITS>(s, E, nt, gu, dn, qr_fg_ctr);
  }
  return qr_fg_v50<BITS>(s, E, nt, gu, dn);
}

/* Versions 116-118 (session 27, helper tl11; 119 below): version 114's kernel (qr_fg_kernel: gate/up and down in one
 * launch, work tickets, a wait per down block) as a lab copy, qr_fgx_kernel, with two additions, each a choice of the
 * launch:
 * - STAMP 1 (116): version 110's per-block timeline (qr_tl_stamps' hooks in qr_body) into qr_fgx_buf at word
 *   QR_FGX_WORDS x ticket (the ticket order, not the launch order): 0 %globaltimer at entry (before the ticket), 1
 *   %globaltimer at the end (the last pass's epilogue, or an expert without rows found), 2-7 %clock64 at entry, the
 *   row table ready, the first activation stage, the first weight stage in thread 0's registers, the stage loop's end
 *   and the epilogue's end (as 110), 8 %smid, 9 the expert << 32 | its row count, 10 %clock64 once the ticket is
 *   shared (after the barrier), 11 %globaltimer then, 12 %globaltimer after the block's count on done[e] (gate/up)
 *   or when its wait ended (down; 0 for an expert without rows), 13 the product (0 gate/up, 1 down) << 32 | the slab.
 *   Stores to that buffer only: every output word is 114's (= version 50's).
 * - the ticket order (ia, ik; qr_fgx_map): tickets 0 .. ia - 1 the first ia gate/up items in 114's order, then the
 *   remaining G - ia gate/up items each followed by ik down items (the down items in 114's order: the experts by
 *   descending row count), then the rest of the down items. ia = G (or ik = 0): 114's order exactly (116). The down
 *   items placed among the last gate/up items belong to experts whose gate/up items all come before ticket ia (the
 *   host's condition: ik (G - ia) <= (ia / ngu) ndn), so a down block still waits only on lower tickets: 114's
 *   no-deadlock argument holds unchanged (tickets in order, gate/up blocks never wait).
 * Why (docs/cuda.md "Session 27 (helper tl11)"): session 27's H100 call found 114 no faster than version 50's two
 * launches (uniform M 16 188.0 against 187.2 us); the timeline says where its slots go, the order whether the last
 * gate/up round's long blocks (~40 us) started earlier, beside down blocks, shorten the launch's end. */
#define QR_FGX_WORDS 14
static uint64_t *qr_fgx_buf;   /* the timeline of the last STAMP launch (host side), QR_FGX_WORDS words per ticket */
static size_t qr_fgx_cap, qr_fgx_blocks; /* its capacity and blocks (0: the last launch had no stamps) */
static int qr_fgx_slots_cap = 0; /* test hook: > 0 takes the resident slots as this many (ia on the emulation) */
static int qr_fgx_ia, qr_fgx_ik; /* the last launch's order (for the lab's print) */

/* The ticket tk's item: *gi the gate/up item (expert order index gi / ngu, slab gi % ngu) or *di the down item (d /
 * ndn, d % ndn), the other -1; G gate/up items; (ia, ik) the order above. */
__host__ __device__ __forceinline__ void qr_fgx_map(int tk, int G, int ia, int ik, int *gi, int *di) {
  if (tk < ia) {
    *gi = tk;
    *di = -1;
    return;
  }
  const int rg = G - ia, u = tk - ia;
  if (u < rg * (ik + 1)) {
    const int q = u / (ik + 1), r = u % (ik + 1);
    *gi = r == 0 ? ia + q : -1;
    *di = r == 0 ? -1 : q * ik + r - 1;
    return;
  }
  *gi = -1;
  *di = rg * ik + (u - rg * (ik + 1));
}

/* qr_body's hooks for 116: 110's stamps with the ticket's slab count */
struct qr_fgx_stamps : qr_tl_stamps {
  unsigned ns;
  __device__ __forceinline__ unsigned slabs() const { return ns; }
};

template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF, int NTS, class TL>
__device__ __forceinline__ void qr_fgx_item(const qe_args &a, unsigned char *smem, int e, int slab, const TL &tl) {
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, TL>(a, smem, e, slab, tl);
      return;
    }
  }
  qr_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, TL>(a, smem, e, slab, tl);
}

/* qr_fg_kernel (src/cuda/qmoe_fg.cuh: its design, waits, counters and reset) with the ticket order (ia, ik) and, STAMP
 * 1, the timeline into tlb. */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS, int STAMP>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_fgx_kernel(qe_args gu, qe_args dn, int E, int ngu, int ndn,
                                                                   int *ctr, int ia, int ik, uint64_t *tlb) {
  DG_PDL_ENTRY();
  uint64_t g0 = 0, c0 = 0;
  if (STAMP && threadIdx.x == 0) {
    g0 = qr_tl_gtime();
    c0 = qr_tl_clock();
  }
  DG_DYN_SMEM16(smem);
  __shared__ int ticket_s;
  const int tid = threadIdx.x, G = E * ngu;
  int *done = ctr + 3;
  if (tid == 0) ticket_s = atomicAdd(ctr, 1);
  __syncthreads();
  const int tk = ticket_s;
  int gi, di;
  qr_fgx_map(tk, G, ia, ik, &gi, &di);
  qr_fgx_stamps st;
  st.b = tlb + (int64_t)QR_FGX_WORDS * tk;
  if (STAMP && tid == 0) {
    st.b[0] = g0;
    st.b[2] = c0;
    st.b[10] = qr_tl_clock();
    st.b[11] = qr_tl_gtime();
    st.b[8] = qr_tl_smid();
    st.b[12] = 0;
  }
  if (gi >= 0) { /* gate/up: expert gu.order[gi / ngu]'s slab gi % ngu */
    const int e = gu.order[gi / ngu];
    if (STAMP && tid == 0) {
      st.b[9] = (uint64_t)e << 32 | (uint32_t)gu.count[e];
      st.b[13] = (uint32_t)(gi % ngu);
    }
    st.ns = (unsigned)ngu;
    if constexpr (STAMP)
      qr_fgx_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, gi % ngu, st);
    else
      qr_fgx_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, gi % ngu, qr_fg_tl(ngu));
    if (gu.count[e] > 0) {
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        atomicAdd(done + e, 1);
        if (STAMP) st.b[12] = qr_tl_gtime();
      }
    }
  } else { /* down: expert dn.order[di / ndn]'s slab di % ndn once its gate/up blocks are all counted */
    const int e = dn.order[di / ndn];
    if (STAMP && tid == 0) {
      st.b[9] = (uint64_t)e << 32 | (uint32_t)dn.count[e];
      st.b[13] = (uint64_t)1 << 32 | (uint32_t)(di % ndn);
    }
    st.ns = (unsigned)ndn;
    if (dn.count[e] > 0) {
      if (tid == 0) {
        qr_fg_wait(done + e, ngu, ctr + 2);
        if (STAMP) st.b[12] = qr_tl_gtime();
      }
      __syncthreads();
      if constexpr (STAMP)
        qr_fgx_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, di % ndn, st);
      else
        qr_fgx_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, di % ndn, qr_fg_tl(ndn));
    } else if (STAMP) {
      st.empty(tid);
    }
  }
  if (tid == 0) { /* the last block to finish sets the counters back to 0 for the next launch */
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == G + E * ndn - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      for (int i = 0; i < E; i++) done[i] = 0;
    }
  }
}

/* One launch of qr_fgx_kernel (qr_fg_launch's form) with the order (ia, ik); STAMP: the timeline buffer grown to the
 * grid (zeroed when allocated). */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS, int STAMP>
cudaError_t qr_fgx_launch(cudaStream_t s, int E, int ngu, int ndn, const qe_args &gu, const qe_args &dn, int *ctr,
                          int ia, int ik) {
  void (*kern)(qe_args, qe_args, int, int, int, int *, int, int, uint64_t *) =
      qr_fgx_kernel<BITS, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS, STAMP>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
  const size_t blocks = (size_t)E * (ngu + ndn);
  qr_fgx_blocks = 0;
  if (STAMP) {
    if (blocks > qr_fgx_cap) {
      if (qr_fgx_buf) cudaFree(qr_fgx_buf);
      qr_fgx_buf = NULL;
      qr_fgx_cap = 0;
      cudaError_t e = cudaMalloc((void **)&qr_fgx_buf, blocks * QR_FGX_WORDS * 8);
      if (e != cudaSuccess) return e;
      e = cudaMemset(qr_fgx_buf, 0, blocks * QR_FGX_WORDS * 8);
      if (e != cudaSuccess) return e;
      qr_fgx_cap = blocks;
    }
    qr_fgx_blocks = blocks;
  }
#ifndef DG_CUDA_EMU
  static int set = 0; /* one attribute call per instantiation */
  if (!set && smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, blocks, 32 * WARPS, smem, s)(gu, dn, E, ngu, ndn, ctr, ia, ik, qr_fgx_buf);
  return cudaGetLastError();
}

/* The order of version ver for G = E ngu gate/up items over `slots` resident blocks: 116 114's (ia = G, ik 0); 117 the
 * last partial round of gate/up items interleaved 1 : 2 with down items (ia = the whole experts' items below
 * (ceil(G / slots) - 1) slots, ik 2), 118 the last two rounds' 1 : 1 (ia below (ceil(G / slots) - 2) slots, ik 1);
 * ik lowered to what the experts before ia have in down items ((ia / ngu) ndn / (G - ia)), 114's order where that
 * is 0. */
static void qr_fgx_order(int ver, int E, int ngu, int ndn, int slots, int *ia, int *ik) {
  const int G = E * ngu, rb = ver == 118 ? 2 : 1, want = ver == 116 ? 0 : ver == 118 ? 1 : 2;
  const int rounds = slots > 0 ? (G + slots - 1) / slots : 0;
  int a = rounds > rb ? (rounds - rb) * slots : 0;
  a = a / ngu * ngu;
  if (a > G) a = G;
  const int rg = G - a;
  int k = want;
  if (rg > 0 && (a / ngu) * ndn / rg < k) k = (a / ngu) * ndn / rg;
  if (want == 0 || rg == 0 || k <= 0) {
    a = G;
    k = 0;
  }
  *ia = a;
  *ik = k;
}

/* Versions 116-118 at 2 and 3 n-tiles (qr_fg_bits' choices): the slots from the occupancy query of the launch's kernel
 * (qr_fgx_slots_cap if set); elsewhere version 50's two launches. 116 with the timeline. */
template <int BITS, int STAMP, int NT, int PF, int NTS>
cudaError_t qr_fgx_at(int ver, cudaStream_t s, int E, const qe_args &gu, const qe_args &dn) {
  const int ngu = gu.N / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  static int resident = 0;
  if (!resident) {
    void (*kern)(qe_args, qe_args, int, int, int, int *, int, int, uint64_t *) =
        qr_fgx_kernel<BITS, NT, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, PF, NTS, STAMP>;
    constexpr size_t smem = (size_t)QR_STAGES * (8 * NT * qr_xs(64, QR_SUB, BITS) + qr_sbb(64, QR_SUB, NT, 0));
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * QR_WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  qr_fgx_order(ver, E, ngu, ndn, qr_fgx_slots_cap > 0 ? qr_fgx_slots_cap : resident, &qr_fgx_ia, &qr_fgx_ik);
  const cudaError_t e = qr_fg_ctr_grow(E);
  if (e != cudaSuccess) return e;
  return qr_fgx_launch<BITS, NT, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, PF, NTS, STAMP>(
      s, E, ngu, ndn, gu, dn, qr_fg_ctr, qr_fgx_ia, qr_fgx_ik);
}

/* Version 119 (session 27, helper tl11): version 114 with persistent blocks, each block's next ticket taken while it
 * runs its current item (qr_fgp_kernel). Why: the slot model of the one launch (dev/cuda/fg_sim.cpp, docs/cuda.md
 * "Session 27 (helper tl11)") reproduces 114's measured time only with ~0.7 us per block on the ticket's round trip
 * (an L2 atomic on one word before the block knows its expert: 4,224 blocks x 0.7 us / 528 slots = ~5.6 us, plus
 * the blocks' own launch), and puts 114 ~7 us lower without it. Here the grid is the resident slots (SMs x blocks
 * per SM, at most the items); thread 0 takes the first ticket, then at the start of each item the next one
 * (atomicAdd, its result kept in a register and shared only after the item, so thread 0 does not wait for it), and
 * the block loops until its ticket is past the items. Items, bodies, release and wait are 114's (qr_fgx_map with
 * 114's order: ia = G), so every word is 114's = version 50's. No deadlock: a block that waits holds a down ticket;
 * every lower ticket is a block's current item (running or done: a block takes its next ticket only after its
 * current one is taken, and runs it next) or already finished; the next tickets that blocks hold are all higher
 * than their current items, and a gate/up ticket held as a next item belongs to a block whose current item is a
 * gate/up item (tickets increase, and every gate/up ticket is below every down ticket), which never waits; so
 * every gate/up item is run and counted. Counters as 114's, [1] counting finished blocks (the grid's), the last
 * resetting them. */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_fgp_kernel(qe_args gu, qe_args dn, int E, int ngu, int ndn,
                                                                   int *ctr) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  __shared__ int ticket_s;
  const int tid = threadIdx.x, G = E * ngu, N = G + E * ndn;
  int *done = ctr + 3;
  if (tid == 0) ticket_s = atomicAdd(ctr, 1);
  __syncthreads();
  int tk = ticket_s;
  while (tk < N) {
    int nxt = 0;
    if (tid == 0) nxt = atomicAdd(ctr, 1); /* in flight during the item */
    if (tk < G) {
      const int e = gu.order[tk / ngu];
      qr_fgx_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, tk % ngu, qr_fg_tl(ngu));
      if (gu.count[e] > 0) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(done + e, 1);
      }
    } else {
      const int d = tk - G, e = dn.order[d / ndn];
      if (dn.count[e] > 0) {
        if (tid == 0) qr_fg_wait(done + e, ngu, ctr + 2);
        __syncthreads();
        qr_fgx_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, d % ndn, qr_fg_tl(ndn));
      }
    }
    __syncthreads(); /* every thread done with the item (its shared row tables, the ring) and with ticket_s */
    if (tid == 0) ticket_s = nxt;
    __syncthreads();
    tk = ticket_s;
  }
  if (tid == 0) { /* the last block to finish sets the counters back to 0 for the next launch */
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      for (int i = 0; i < E; i++) done[i] = 0;
    }
  }
}

static int qr_fgp_grid; /* the last launch's blocks (the lab's print) */

/* Version 119 at nt n-tiles (2 or 3, qr_fg_bits' choices): grid = min(items, resident slots) (qr_fgx_slots_cap if
 * set: fewer blocks, each taking more items, on the emulation). */
template <int BITS, int NT, int PF, int NTS>
cudaError_t qr_fgp_at(cudaStream_t s, int E, const qe_args &gu, const qe_args &dn) {
  const int ngu = gu.N / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  void (*kern)(qe_args, qe_args, int, int, int, int *) =
      qr_fgp_kernel<BITS, NT, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, PF, NTS>;
  constexpr size_t smem = (size_t)QR_STAGES * (8 * NT * qr_xs(64, QR_SUB, BITS) + qr_sbb(64, QR_SUB, NT, 0));
  static int resident = 0;
  if (!resident) {
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * QR_WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  const int items = E * (ngu + ndn), slots = qr_fgx_slots_cap > 0 ? qr_fgx_slots_cap : resident;
  qr_fgp_grid = items < slots ? items : slots;
  qr_fgx_ia = E * ngu;
  qr_fgx_ik = 0;
  const cudaError_t e = qr_fg_ctr_grow(E);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, qr_fgp_grid, 32 * QR_WARPS, smem, s)(gu, dn, E, ngu, ndn, qr_fg_ctr);
  return cudaGetLastError();
}

/* Versions 125-126 (session 28, helper pf11): version 119 (persistent blocks, the next ticket taken at the start of
 * the current item) with the next item's head made cheap during the current item (qr_fgn_kernel). Why
 * (docs/cuda.md "Session 28 (helper pf11)"): 116's timeline puts a gate/up block's rows phase at 1.8 us and a down
 * block's at 0.9 (+ the order read before it): a chain of dependent L2 round trips (order[ticket] -> count[e],
 * start[e] -> gate/up's pairs[start ..] -> the row table, a barrier), paid at every item boundary. 119 knows the
 * next ticket from the start of the item, so thread 0 walks that chain while the current item streams, through
 * qr_body's own hooks (qr_fgn_tl: the kernel's bodies, and so every word, are 119's = 114's = version 50's):
 * - rows (the current item's row table ready, its first pass): a prefetch.global.L1 of the next item's order entry;
 * - loop (the current pass's stage loop done; every pass): the order entry read (an L1 hit by then), then L1
 *   prefetches of count[e'] and start[e'] and, WPF > 0 (126), a bulk L2 prefetch of the next item's first WPF
 *   weight stages (its slab's stages are contiguous: qr_body's wstage0 of warp 0, WPF stages of WARPS records);
 * - epi (after the pass's epilogue), next item a gate/up item only: count[e'] and start[e'] read (L1), then L1
 *   prefetches of the lines of pairs[start' .. start' + min(count', 8 NT) - 1] (its first pass's row indices).
 * The next item's own reads of order, count, start and pairs (the kernel's and qr_body's, unchanged) then hit L1
 * (the weights bypass L1, dg_ld_stream16, and the activations' 16-byte copies are cp.async.cg; only the group
 * sums' 4-byte copies allocate there), instead of L2 (or DRAM, for 126's first
 * weight stages). Prefetches only: nothing is loaded into the block's registers or shared memory ahead, so no
 * state crosses the item boundary but the L1 / L2 lines. On the emulation a prefetch reads its first and last byte
 * (qr_fgn_touch), so an address outside its array fails there as a plain read would. No deadlock: 119's argument
 * (the hooks wait on nothing: plain loads of the read-only route tables). */
struct qr_fgn_ptrs { /* what the hooks read, per product (0 gate/up, 1 down): set by thread 0 at the kernel's start */
  const int32_t *order[2], *count[2], *start[2], *pairs;
  const unsigned char *q[2];
  int64_t sstride[2]; /* bytes of a weight stage of a slab (WARPS lane records) */
  int nst[2], ns[2];  /* weight stages per slab, slabs per expert */
  int G, N;           /* gate/up items, all items */
  const int *done;    /* the gate/up counts per expert (qr_fg_kernel's ctr + 3): 127's early check */
  int pre;            /* 127, thread 0: the next item's expert's gate/up count as the loop hook read it, else 0 */
};

__device__ __forceinline__ void qr_fgn_touch(const void *p, int64_t bytes, int l2) {
#ifdef DG_CUDA_EMU
  const volatile unsigned char *c = (const volatile unsigned char *)p;
  (void)c[0];
  (void)c[bytes - 1];
  (void)l2;
#else
  if (l2) dg_prefetch_l2(p, (uint32_t)bytes);
  else asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
#endif
}

/* qr_body's hooks for 125-127: the slab count of the current item (ns) and, in thread 0, the next ticket (nxt); EW
 * (127): P->pre, the next item's expert's gate/up count as the loop hook read it (acquire), if the next item is a
 * down item (in shared memory, not a register held across the stage loops: in a register it cost ptxas 72 / 48
 * bytes of spills at 3 n-tiles instead of 28 / 28). */
template <int WPF, int NTOK, int EW = 0> struct qr_fgn_tl : qr_tl_none {
  unsigned ns;
  int nxt;
  qr_fgn_ptrs *P;
  __device__ __forceinline__ unsigned slabs() const { return ns; }
  __device__ __forceinline__ int prod() const { return nxt >= P->G; }
  __device__ __forceinline__ int oi() const { return prod() ? (nxt - P->G) / P->ns[1] : nxt / P->ns[0]; }
  __device__ __forceinline__ void rows(int tid, int p0) const {
    if (tid == 0 && p0 == 0 && nxt < P->N) qr_fgn_touch(P->order[prod()] + oi(), 4, 0);
  }
  __device__ __forceinline__ void loop(int tid) const {
    if (tid == 0 && nxt < P->N) {
      const int b = prod(), e = P->order[b][oi()];
      /* 127: the acquire first (on the GPU an acquire at gpu scope invalidates the SM's L1, as the boundary's wait
       * does in 125-126, where it drops the count / start lines prefetched for a down item before qr_body reads
       * them), its value used only at the boundary */
      if constexpr (EW)
        if (b) P->pre = qr_fg_ld_acquire(P->done + e);
      qr_fgn_touch(P->count[b] + e, 4, 0);
      qr_fgn_touch(P->start[b] + e, 4, 0);
      if constexpr (WPF > 0) {
        const int slab = b ? (nxt - P->G) % P->ns[1] : nxt % P->ns[0], n = min(WPF, P->nst[b]);
        const int64_t si = (int64_t)e * P->ns[b] + slab;
        if (n > 0) qr_fgn_touch(P->q[b] + si * P->nst[b] * P->sstride[b], n * P->sstride[b], 1);
      }
    }
  }
  __device__ __forceinline__ void epi(int tid) const {
    if (tid == 0 && nxt < P->G) {
      const int e = P->order[0][oi()], c = P->count[0][e];
      if (c > 0) {
        const int32_t *r = P->pairs + P->start[0][e];
        qr_fgn_touch(r, 4, 0);
        qr_fgn_touch(r + min(c, NTOK) - 1, 4, 0);
      }
    }
  }
};

/* 119's kernel (qr_fgp_kernel: items, order, waits, counters, reset) with qr_fgn_tl's hooks in its bodies; EW 1
 * (127): a down item whose expert's gate/up count the previous item's loop hook already read complete (an acquire
 * load by thread 0, followed by the item boundary's barriers before any read of h: the order qr_fg_wait gives) skips
 * qr_fg_wait's acquire round trip at the boundary. A count read short waits as 119 does: no new wait, so 119's
 * no-deadlock argument holds. */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS, int WPF,
          int EW = 0>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_fgn_kernel(qe_args gu, qe_args dn, int E, int ngu, int ndn,
                                                                   int *ctr) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  __shared__ int ticket_s;
  __shared__ qr_fgn_ptrs P;
  const int tid = threadIdx.x, G = E * ngu, N = G + E * ndn;
  int *done = ctr + 3;
  if (tid == 0) {
    ticket_s = atomicAdd(ctr, 1);
    P.order[0] = gu.order;
    P.order[1] = dn.order;
    P.count[0] = gu.count;
    P.count[1] = dn.count;
    P.start[0] = gu.start;
    P.start[1] = dn.start;
    P.pairs = gu.pairs;
    P.q[0] = (const unsigned char *)gu.q;
    P.q[1] = (const unsigned char *)dn.q;
    P.sstride[0] = P.sstride[1] = (int64_t)WARPS * qr_wstage(BITS, GS, 1);
    P.nst[0] = gu.Kdim / qr_kc(GS, BITS);
    P.nst[1] = dn.Kdim / qr_kc(GS, BITS);
    P.ns[0] = ngu;
    P.ns[1] = ndn;
    P.G = G;
    P.N = N;
    P.done = done;
    P.pre = 0;
  }
  __syncthreads();
  int tk = ticket_s;
  while (tk < N) {
    int pre = 0; /* 127, thread 0: what the previous item's loop hook read of this item's count (P.pre), then 0 */
    if (EW && tid == 0) {
      pre = P.pre;
      P.pre = 0;
    }
    qr_fgn_tl<WPF, 8 * NT, EW> tl;
    tl.P = &P;
    tl.nxt = N; /* threads other than 0: no next item (their hooks do nothing) */
    if (tid == 0) tl.nxt = atomicAdd(ctr, 1); /* in flight during the item */
    if (tk < G) {
      const int e = gu.order[tk / ngu];
      tl.ns = (unsigned)ngu;
      qr_fgx_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, tk % ngu, tl);
      if (gu.count[e] > 0) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(done + e, 1);
      }
    } else {
      const int d = tk - G, e = dn.order[d / ndn];
      tl.ns = (unsigned)ndn;
      if (dn.count[e] > 0) {
        if (tid == 0 && !(EW && pre >= ngu)) qr_fg_wait(done + e, ngu, ctr + 2);
        __syncthreads();
        qr_fgx_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, d % ndn, tl);
      }
    }
    __syncthreads(); /* every thread done with the item (its shared row tables, the ring) and with ticket_s */
    if (tid == 0) ticket_s = tl.nxt;
    __syncthreads();
    tk = ticket_s;
  }
  if (tid == 0) { /* the last block to finish sets the counters back to 0 for the next launch */
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      for (int i = 0; i < E; i++) done[i] = 0;
    }
  }
}

/* Versions 125 (WPF 0), 126 (WPF QR_FGN_WPF) and 127 (125 with EW 1) at nt n-tiles (2 or 3): qr_fgp_at's grid and
 * slots. */
#define QR_FGN_WPF 2 /* 126: the next item's first weight stages asked of L2 (107's distance) */
template <int BITS, int NT, int PF, int NTS, int WPF, int EW = 0>
cudaError_t qr_fgn_at(cudaStream_t s, int E, const qe_args &gu, const qe_args &dn) {
  const int ngu = gu.N / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  void (*kern)(qe_args, qe_args, int, int, int, int *) =
      qr_fgn_kernel<BITS, NT, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, PF, NTS, WPF, EW>;
  constexpr size_t smem = (size_t)QR_STAGES * (8 * NT * qr_xs(64, QR_SUB, BITS) + qr_sbb(64, QR_SUB, NT, 0));
  static int resident = 0;
  if (!resident) {
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * QR_WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  const int items = E * (ngu + ndn), slots = qr_fgx_slots_cap > 0 ? qr_fgx_slots_cap : resident;
  qr_fgp_grid = items < slots ? items : slots;
  qr_fgx_ia = E * ngu;
  qr_fgx_ik = 0;
  const cudaError_t e = qr_fg_ctr_grow(E);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, qr_fgp_grid, 32 * QR_WARPS, smem, s)(gu, dn, E, ngu, ndn, qr_fg_ctr);
  return cudaGetLastError();
}

/* Versions 128-129 (session 28, helper rg11): version 119 (persistent blocks, the next ticket taken at the start of the
 * current item) with the activation ring carried across the item boundary (qr_fgr_kernel). Why (docs/cuda.md
 * "Session 28 (helper rg11)"): 116's timeline puts F, a block's time outside its stage loop (rows, act0, w0,
 * epilogue), at ~5.1 us of a gate/up block and ~4.8 of a down block (~40 % of it), and the slot model (fg_sim) says
 * 85 % of the roofline needs about half of F hidden; 125-127 only make the row table's L2 chain cheaper. Here the
 * next item's head runs inside the current item's last activation stages, as if the two items' activation stages
 * were one stream through the same STAGES-slot cp.async ring:
 * - at activation stage nsa - STAGES of the current item's last pass (its last own copy issued), thread 0 reads the
 *   next ticket's item (qr_fgr_peek: order, count, start; a down item also its expert's gate/up count, one acquire
 *   load, no wait) into a shared descriptor; the item is carried (ok) if it has rows, takes this NT-tile body (not
 *   the NTS body) and, for down, its count was already complete;
 * - at stage nsa - STAGES + 1 (after its barrier, the descriptor visible) every thread writes the next item's first
 *   pass row table (qe_pass_rows), a barrier, the activation copies re-initialized for it (qr_xcopy::init; the
 *   current item issues no more copies; the next item initializes them again from the same table, so that they are
 *   not held in registers across the boundary), and its stage 0 issued into the ring slot the current item just
 *   freed; at the following stages its stages 1 .. STAGES - 2: the commit groups run on exactly as within an item,
 *   so the next item's first barrier waits for its stage 0 with wait_group STAGES - 2 as its later ones do;
 * - the gate/up HP epilogue's tile (qr_store_hp) goes into the slot of the current item's last stage (cslot), which
 *   the next item's first STAGES - 1 stages do not take (they are the two slots after it);
 * - the next item then starts at its stage loop (its weight stages 0 .. D - 2 loaded there in 128; version 129, CW 1:
 *   its stage 0, with its first L2 prefetches, loaded by the current item's last pass right after its last compute,
 *   before the epilogue, into registers Wn held across the boundary, so that its DRAM trip runs under the
 *   epilogue and the boundary too), a carried down item without qr_fg_wait (its count was read complete by thread
 *   0's acquire, ordered before every thread's copies of h by the barriers in between: the order qr_fg_wait gives).
 * Items not carried (the first, one without rows, the NTS body, a down item whose count was short, an item after a
 * pass of fewer than STAGES activation stages) run as 119's. The mma sequence, K order and fold per row are qr_body's
 * (the loop below is a copy of its non-DIET register-stage loop), so every word is 119's = version 50's. No deadlock:
 * 119's argument (tickets, order, waits, counters, reset unchanged); the carry only reads a count and never waits,
 * and a down item whose count it read short waits at its boundary as in 119. */
struct qr_fgr_nx { /* the next item as thread 0 read it (qr_fgr_peek); ok 1: its first pass is carried */
  int tk, e, slab, cnt, base, ok;
};

template <int BITS, int NT, int GS, int WARPS, int SUB>
using qr_fgr_xc = qr_xcopy<GS, 8 * NT, 32 * WARPS, SUB * qr_kc(GS, BITS), qr_xs(GS, SUB, BITS),
                           8 * NT * qr_xs(GS, SUB, BITS), qr_kc(GS, BITS) / GS, SUB, 0, 0>;

/* Thread 0: ticket tk's item into *nx (tk >= N: none, ok 0). */
template <int NT, int NTS>
__device__ __forceinline__ void qr_fgr_peek(qr_fgr_nx *nx, int tk, const qe_args &gu, const qe_args &dn, int G, int N,
                                            int ngu, int ndn, const int *done) {
  nx->tk = tk;
  nx->ok = 0;
  if (tk >= N) return;
  const bool isgu = tk < G;
  const qe_args &a = isgu ? gu : dn;
  const int e = a.order[isgu ? tk / ngu : (tk - G) / ndn], c = a.count[e];
  nx->e = e;
  nx->slab = isgu ? tk % ngu : (tk - G) % ndn;
  nx->cnt = c;
  if (c == 0 || (NTS > 0 && NTS < NT && c <= 8 * NTS)) return;
  nx->base = a.start[e];
  if (!isgu && qr_fg_ld_acquire(done + e) < ngu) return;
  nx->ok = 1;
}

/* One item (expert e's slab of nslab, cnt rows from base) of the NT-tile body: qr_body's non-DIET register-stage
 * passes (CP 1, no BM / NZ / DQ), the first pass's row table and first STAGES - 1 activation stages already issued if
 * carried; islot / cslot the ring's issue and compute slots (carried across items); returns whether the next item
 * (thread 0's nxt, described in *nx) was carried in. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF, int NTS, int CW, int RWN>
__device__ __forceinline__ bool qr_fgr_item(const qe_args &a, const qe_args &gu, const qe_args &dn, unsigned char *smem,
                                            int e, int slab, int nslab, int cnt, int base, bool carried, int &islot,
                                            int &cslot, uint32_t (&Wn)[RWN], int64_t *xrow, int64_t *srow,
                                            qr_fgr_nx *nx, int nxt, int G, int N, int ngu, int ndn, const int *done) {
  constexpr int KC = qr_kc(GS, BITS), CB = 4 * (KC / 32) * BITS, RW = qr_rec(BITS, GS) / 4;
  static_assert(!CW || RWN == RW, "Wn is one weight stage of a lane's record");
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, WSTAGE = qr_wstage(BITS, GS, 1);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT, KA = SUB * KC;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, SBB = qr_sbb(GS, SUB, NT, 0), STB = XB + SBB;
  static_assert(BITS != 16 && D > 0 && STAGES >= 2, "quantized stacks, register stages");
  static_assert(NTOK * (FEAT + 8) * 2 <= STB, "qr_store_hp's tile fits in one ring slot");
  constexpr int GU = GATEUP != 0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * nslab + slab, sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  const dg_sptr sbase = dg_sp(smem);
  bool cry = false; /* the next item carried in (its last pass: peek and the descriptor's ok) */
  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    const bool last = p0 + NTOK >= cnt, peek = last && nsa >= STAGES;
    int icol = 0;
    qr_fgr_xc<BITS, NT, GS, WARPS, SUB> xc; /* this pass's copies (qr_xcopy; re-initialized for a carried item) */
    if (!(carried && p0 == 0)) {
      qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
      __syncthreads();
      xc.init(a, xrow, srow, tid);
      islot = 0;
      cslot = 0;
#pragma unroll
      for (int sa = 0; sa < STAGES - 1; sa++) {
        if (sa < nsa) {
          xc.issue(sbase + islot * STB, icol, a.Kdim);
          islot = islot == STAGES - 1 ? 0 : islot + 1;
          icol += KA;
        }
        dg_cp_commit();
      }
    } else { /* the row table the previous item wrote (unchanged since) */
      xc.init(a, xrow, srow, tid);
      icol = min(STAGES - 1, nsa) * KA; /* the stages the previous item issued */
      cslot = cslot == STAGES - 1 ? 0 : cslot + 1; /* its stage 0's slot: the one after the previous item's last */
    }
    const unsigned char *wnext = wq;
    int wst = 0;
    auto wload = [&](uint32_t *R) {
      qr_load_stage<BITS, GS, 1, PF>(R, wnext, lane, g, wst, nst, sstride);
      wnext += sstride;
      if constexpr (PF != 0) wst++;
    };
    float acc[2][NT][4], part[2][NT][4];
    qe_zero(acc);
    qe_zero(part);
    uint32_t af[2][4] = {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}};
    const uint32_t asel = qr_bias_sel<BITS>(t);
    auto compute = [&](const uint32_t *R, int s, int sub) {
      qr_stage_products<BITS, NT, GS, SUB, 0, 0>(acc, part, af, R, smem, cslot * STB, s, sub, ng, g, t, asel);
    };
    auto astage = [&](int sa) {
      if (sa > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
      dg_cp_wait<STAGES - 2>();
      __syncthreads();
      const int j = sa - (nsa - STAGES + 1); /* >= 0: the next item's stage j goes into the slot freed here */
      if (j < 0) {
        xc.issue(sbase + islot * STB, icol, a.Kdim);
        islot = islot == STAGES - 1 ? 0 : islot + 1;
        icol += KA;
        if (peek && j == -1 && tid == 0) qr_fgr_peek<NT, NTS>(nx, nxt, gu, dn, G, N, ngu, ndn, done);
      } else if (peek && nx->ok) { /* the descriptor is visible since stage nsa - STAGES + 1's barrier (j = 0) */
        const bool ngu_ = nx->tk < G;
        const qe_args &an = ngu_ ? gu : dn;
        if (j == 0) {
          const int nb = nx->base, nm = min(NTOK, nx->cnt);
          if (ngu_) qe_pass_rows<1, NTOK, THREADS>(gu, xrow, srow, nb, nm, gu.Kdim / GS, tid);
          else qe_pass_rows<0, NTOK, THREADS>(dn, xrow, srow, nb, nm, dn.Kdim / GS, tid);
          __syncthreads();
          xc.init(an, xrow, srow, tid);
        }
        if (j < (an.Kdim / KC + SUB - 1) / SUB) { /* its stage j: columns from j KA */
          xc.issue(sbase + islot * STB, j * KA, an.Kdim);
          islot = islot == STAGES - 1 ? 0 : islot + 1;
        }
      }
      dg_cp_commit();
    };
    uint32_t W[D][RW];
    bool wc = false; /* 129: stage 0 loaded by the previous item after its last compute (Wn) */
    if constexpr (CW) {
      if (carried && p0 == 0) {
#pragma unroll
        for (int i = 0; i < RW; i++) W[0][i] = Wn[i];
        wnext += sstride;
        if constexpr (PF != 0) wst++;
        wc = true;
      }
    }
    if (!wc) {
      qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, nst, sstride);
      if (nst > 0) wload(W[0]);
    }
#pragma unroll
    for (int d = 1; d < D - 1; d++)
      if (d < nst) wload(W[d]);
    for (int it = 0; it < nst; it += D) {
#pragma unroll
      for (int d = 0; d < D; d++) {
        const int s = it + d;
        if (s < nst) {
          if (s + D - 1 < nst) wload(W[(d + D - 1) % D]);
          const int sub = D % SUB == 0 ? d % SUB : s % SUB;
          if (sub == 0) astage(s / SUB);
          compute(W[d], s, sub);
        }
      }
    }
    if (last) cry = peek && nx->ok; /* (read from shared memory, not held across the loop) */
    /* 129: the carried item's weight stage 0 (and its first prefetches) before this epilogue */
    if constexpr (CW) if (cry) {
      const bool ngu_ = nx->tk < G;
      const qe_args &an = ngu_ ? gu : dn;
      const int nstn = an.Kdim / KC;
      const int64_t sin = (int64_t)nx->e * (ngu_ ? ngu : ndn) + nx->slab;
      const unsigned char *w0n = (const unsigned char *)an.q + sin * nstn * sstride + (int64_t)warp * WSTAGE;
      qr_prefetch_first<BITS, GS, 1, PF>(w0n, w0n + lane * PSC, lane, nstn, sstride);
      if (nstn > 0) qr_load_stage<BITS, GS, 1, PF>(Wn, w0n + lane * PSC, lane, g, 0, nstn, sstride);
    }
    __syncthreads(); /* every warp is done with the ring slot cslot (the HP tile's) */
    qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t, smem + cslot * STB);
  }
  return cry;
}

/* 119's kernel (qr_fgp_kernel) with qr_fgr_item for the items of the NT-tile body (the others, and the first, as
 * 119). */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS, int CW>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_fgr_kernel(qe_args gu, qe_args dn, int E, int ngu, int ndn,
                                                                   int *ctr) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  __shared__ int ticket_s;
  __shared__ qr_fgr_nx nx;
  __shared__ int64_t xrow[8 * NT], srow[8 * NT];
  const int tid = threadIdx.x, G = E * ngu, N = G + E * ndn;
  int *done = ctr + 3;
  if (tid == 0) ticket_s = atomicAdd(ctr, 1);
  __syncthreads();
  int tk = ticket_s, islot = 0, cslot = 0;
  bool carried = false;
  uint32_t Wn[CW ? qr_rec(BITS, GS) / 4 : 1]; /* 129: the carried item's weight stage 0 */
  while (tk < N) {
    int nxt = 0;
    if (tid == 0) nxt = atomicAdd(ctr, 1); /* in flight during the item */
    const bool isgu = tk < G;
    int e, slab, cnt, base = 0;
    if (carried) {
      e = nx.e;
      slab = nx.slab;
      cnt = nx.cnt;
      base = nx.base;
    } else {
      e = isgu ? gu.order[tk / ngu] : dn.order[(tk - G) / ndn];
      slab = isgu ? tk % ngu : (tk - G) % ndn;
      cnt = (isgu ? gu : dn).count[e];
    }
    const bool body = cnt > 0 && !(NTS > 0 && NTS < NT && cnt <= 8 * NTS);
    bool cry = false;
    if (isgu) {
      if (body) {
        if (!carried) base = gu.start[e];
        cry = qr_fgr_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS, CW>(
            gu, gu, dn, smem, e, slab, ngu, cnt, base, carried, islot, cslot, Wn, xrow, srow, &nx, nxt, G, N, ngu, ndn,
            done);
      } else {
        qr_fgx_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, slab, qr_fg_tl(ngu));
      }
      if (cnt > 0) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(done + e, 1);
      }
    } else if (cnt > 0) {
      if (!carried) {
        if (tid == 0) qr_fg_wait(done + e, ngu, ctr + 2);
        __syncthreads();
      }
      if (body) {
        if (!carried) base = dn.start[e];
        cry = qr_fgr_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS, CW>(
            dn, gu, dn, smem, e, slab, ndn, cnt, base, carried, islot, cslot, Wn, xrow, srow, &nx, nxt, G, N, ngu, ndn,
            done);
      } else {
        qr_fgx_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, slab, qr_fg_tl(ndn));
      }
    }
    carried = cry;
    __syncthreads(); /* every thread done with the item (the ring's HP tile, ticket_s and nx read) */
    if (tid == 0) ticket_s = nxt;
    __syncthreads();
    tk = ticket_s;
  }
  if (tid == 0) { /* the last block to finish sets the counters back to 0 for the next launch */
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      for (int i = 0; i < E; i++) done[i] = 0;
    }
  }
}

/* Versions 128 (CW 0) and 129 (CW 1) at nt n-tiles (2 or 3): qr_fgp_at's grid and slots. */
template <int BITS, int NT, int PF, int NTS, int CW>
cudaError_t qr_fgr_at(cudaStream_t s, int E, const qe_args &gu, const qe_args &dn) {
  const int ngu = gu.N / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  void (*kern)(qe_args, qe_args, int, int, int, int *) =
      qr_fgr_kernel<BITS, NT, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, PF, NTS, CW>;
  constexpr size_t smem = (size_t)QR_STAGES * (8 * NT * qr_xs(64, QR_SUB, BITS) + qr_sbb(64, QR_SUB, NT, 0));
  static int resident = 0;
  if (!resident) {
#ifndef DG_CUDA_EMU
    if (smem > 48 * 1024) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
    }
#endif
    int dev = 0, sms = 0, per = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 32 * QR_WARPS, smem);
    if (e != cudaSuccess) return e;
    if (sms < 1 || per < 1) return cudaErrorInvalidConfiguration;
    resident = sms * per;
  }
  const int items = E * (ngu + ndn), slots = qr_fgx_slots_cap > 0 ? qr_fgx_slots_cap : resident;
  qr_fgp_grid = items < slots ? items : slots;
  qr_fgx_ia = E * ngu;
  qr_fgx_ik = 0;
  const cudaError_t e = qr_fg_ctr_grow(E);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, qr_fgp_grid, 32 * QR_WARPS, smem, s)(gu, dn, E, ngu, ndn, qr_fg_ctr);
  return cudaGetLastError();
}

/* Version ver (116-119, 125-129) of gate/up gu and down dn (qr_fg_version's arguments and conditions) at nt n-tiles:
 * 116-118 qr_fgx_kernel (116 with the timeline), 119 qr_fgp_kernel (persistent blocks), 125-127 qr_fgn_kernel (119
 * with the next item's head prefetched; 127 also the down wait's early check), 128-129 qr_fgr_kernel (119 with
 * the activation ring carried across items; 129 also the next item's first weight stage); elsewhere version 50's two
 * launches. */
template <int BITS>
cudaError_t qr_fgx_version(int ver, cudaStream_t s, int E, int nt, const qe_args &gu, const qe_args &dn) {
  if ((ver < 116 || ver > 119) && (ver < 125 || ver > 129)) return cudaErrorInvalidValue;
  if (!gu.hs || gu.N % (16 * QR_WARPS) || (gu.hg != 32 && gu.hg != 64) || gu.group != gu.hg || dn.group != gu.hg ||
      dn.X != gu.h || dn.xs != gu.hs || dn.Kdim != gu.N)
    return cudaErrorInvalidValue;
  qr_fgx_blocks = 0;
  if (!qr_fg_takes(nt, gu, dn)) return qr_fg_v50<BITS>(s, E, nt, gu, dn);
  if (ver == 119)
    return nt == 3 ? qr_fgp_at<BITS, 3, -QR_PF, QR_NTS>(s, E, gu, dn) : qr_fgp_at<BITS, 2, 0, 0>(s, E, gu, dn);
  if (ver == 125)
    return nt == 3 ? qr_fgn_at<BITS, 3, -QR_PF, QR_NTS, 0>(s, E, gu, dn) : qr_fgn_at<BITS, 2, 0, 0, 0>(s, E, gu, dn);
  if (ver == 126)
    return nt == 3 ? qr_fgn_at<BITS, 3, -QR_PF, QR_NTS, QR_FGN_WPF>(s, E, gu, dn)
                   : qr_fgn_at<BITS, 2, 0, 0, QR_FGN_WPF>(s, E, gu, dn);
  if (ver == 127)
    return nt == 3 ? qr_fgn_at<BITS, 3, -QR_PF, QR_NTS, 0, 1>(s, E, gu, dn) : qr_fgn_at<BITS, 2, 0, 0, 0, 1>(s, E, gu, dn);
  if (ver == 128 || ver == 129) {
    const int cw = ver == 129;
    if (nt == 3)
      return cw ? qr_fgr_at<BITS, 3, -QR_PF, QR_NTS, 1>(s, E, gu, dn) : qr_fgr_at<BITS, 3, -QR_PF, QR_NTS, 0>(s, E, gu, dn);
    return cw ? qr_fgr_at<BITS, 2, 0, 0, 1>(s, E, gu, dn) : qr_fgr_at<BITS, 2, 0, 0, 0>(s, E, gu, dn);
  }
  const int stamp = ver == 116;
  if (nt == 3)
    return stamp ? qr_fgx_at<BITS, 1, 3, -QR_PF, QR_NTS>(ver, s, E, gu, dn)
                 : qr_fgx_at<BITS, 0, 3, -QR_PF, QR_NTS>(ver, s, E, gu, dn);
  return stamp ? qr_fgx_at<BITS, 1, 2, 0, 0>(ver, s, E, gu, dn) : qr_fgx_at<BITS, 0, 2, 0, 0>(ver, s, E, gu, dn);
}

/* The lab version ver (95-113) of the products over a lane-record stack of BITS bits (16: bf16), gate/up (GATEUP 1) or
 * down (0), nt n-tiles (qe_nt): version 95 the backend's launch choices with the other stage loop (FLIP 1), 96-104
 * qr_diet_launch's candidates, 105-106 qr_dring_version's (the weight ring, WR 4 and 6), 107-108 qr_pers_version's
 * (the persistent grid), 109 qr_early_version's (the first weight stage early), 110 qr_tl_version's (version 50 with
 * the per-block timeline), 111 qr_pair_version's (two slabs per down block), 112 qr_sk_version's (the last partial
 * round split along K; not word-equal to 50: within the derived bound), 113 an empty kernel over the same grid
 * (qr_empty_version: no output), for 4 bits only (the 26B's experts; each
 * candidate is 4 more kernels in the lab's build, paid on the GPU machine's clock); cudaErrorInvalidValue for any
 * other version or width. */
template <int BITS, int GATEUP>
cudaError_t qr_diet_version(int ver, cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
#ifndef LAB_ONLY_FG /* (dev/cuda/moe_quant.cu: the session-27 lab builds 110 only of these) */
  if (ver == 95) return qr_launch_bits<BITS, GATEUP, 1>(s, grid, nt, a);
#endif
  if constexpr (BITS == 4) {
    switch (ver) {
#ifndef LAB_ONLY_SK /* (dev/cuda/moe_quant.cu: the session-25 lab builds 110 and 112 only) */
    case 96: return qr_diet_launch<BITS, GATEUP, 4, 2, 3, 2, 2, 4, 2>(s, grid, nt, a);  /* 3 n-tiles: prefetch 3 ahead */
    case 97: return qr_diet_launch<BITS, GATEUP, 4, 2, 4, 2, 2, 4, 2>(s, grid, nt, a);  /* 3 n-tiles: prefetch 4 ahead */
    case 98: return qr_diet_launch<BITS, GATEUP, 4, 4, 2, 2, 2, 4, 2>(s, grid, nt, a);  /* 3 n-tiles: 4 register stages */
    case 99: return qr_diet_launch<BITS, GATEUP, 4, 3, 2, 3, 2, 4, 2>(s, grid, nt, a);  /* 3 n-tiles: D 3, SUB 3 */
    case 100: return qr_diet_launch<BITS, GATEUP, 4, 4, 4, 2, 2, 4, 4>(s, grid, nt, a); /* D 4 at 2 and 3, prefetch 4 */
    case 101: return qr_diet_launch<BITS, GATEUP, 4, 2, 2, 2, 2, 5, 2>(s, grid, nt, a); /* 2 n-tiles: 5 blocks per SM */
    /* 102-104 (session 21): at 3 n-tiles the diet's warps wait on their weight loads (Nsight Compute, T 256: long
     * scoreboard 19.1 % of the stall samples, at the codes' first decoding instruction, against 4.8 % before the
     * diet), and D 4 at 4 blocks per SM spills (98): more weight stages in flight per warp with registers for 3
     * blocks per SM (168 per thread) instead */
    case 102: return qr_diet_launch<BITS, GATEUP, 3, 4, 2, 2, 2, 4, 2>(s, grid, nt, a); /* 3 n-tiles: D 4, 3 blocks */
    case 103: return qr_diet_launch<BITS, GATEUP, 3, 4, 4, 2, 2, 4, 2>(s, grid, nt, a); /* 102, prefetch 4 ahead */
    case 104: return qr_diet_launch<BITS, GATEUP, 3, 3, 2, 3, 2, 4, 2>(s, grid, nt, a); /* 3 n-tiles: D 3 SUB 3, 3 blocks */
    /* 105-106 (session 21): the weight ring in shared memory under the diet's loop (qr_dring_kernel) */
    case 105: return qr_dring_version<BITS, GATEUP, 4>(s, grid, nt, a); /* 3 n-tiles: a ring of 4 weight stages */
    case 106: return qr_dring_version<BITS, GATEUP, 6>(s, grid, nt, a); /* 3 n-tiles: a ring of 6 weight stages */
    /* 107-108 (session 22): the persistent grid (qr_pers_kernel), the next item's first stages asked of L2 */
    case 107: return qr_pers_version<BITS, GATEUP, 2>(s, grid, nt, a); /* 2 and 3 n-tiles: 2 stages ahead */
    case 108: return qr_pers_version<BITS, GATEUP, 6>(s, grid, nt, a); /* 2 and 3 n-tiles: 6 stages ahead */
    /* 109 (session 23): the block's first weight stages loaded before its row table (qr_early_kernel) */
    case 109: return qr_early_version<BITS, GATEUP>(s, grid, nt, a); /* 2 and 3 n-tiles */
    /* 110 (session 24): version 50 with the per-block timeline (qr_tl_kernel) */
#endif
    case 110: return qr_tl_version<BITS, GATEUP>(s, grid, nt, a); /* 2 and 3 n-tiles */
    /* 111 (session 24): the down product's blocks two slabs each, one pipeline across them (qr_pair_kernel) */
#ifndef LAB_ONLY_SK
    case 111: return qr_pair_version<BITS, GATEUP>(s, grid, nt, a); /* down at 2 and 3 n-tiles */
#endif
    /* 112 (session 25): the last partial round's items split along K in QR_SK_P pieces (qr_sk_kernel) */
#ifndef LAB_ONLY_FG
    case 112: return qr_sk_version<BITS, GATEUP>(s, grid, nt, a); /* 2 and 3 n-tiles */
    /* 113 (session 25): an empty kernel over the same grid (qr_empty_kernel): the timing's overhead */
    case 113: return qr_empty_version<BITS>(s, grid, nt, a);
#endif
    default: break;
    }
  }
  return cudaErrorInvalidValue;
}

#endif
