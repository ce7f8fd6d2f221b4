/* qr_diet_lab.cuh: the kernel lab's candidates of the SASS diet's launch choices (issue 11; lab versions 95-104 of
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
 * the diet at every tile count).
 *
 * The arithmetic that chose them (ptxas -v of nvcc 13 -O2 sm_90a, 4-bit g64, docs/cuda.md "The next GPU calls"):
 * an H100 / H200 SM has 65,536 registers, 228 KB of shared memory and 4 schedulers; a block is 4 warps (128
 * threads) with a ring of 3 activation stages, 3 x (24 x 320 + 192) = 23,616 bytes at 3 n-tiles, SUB 2 (+384 of
 * row tables), so registers, not shared memory, bound the blocks per SM up to 8: 128 registers per thread for 4
 * blocks (4 warps per scheduler), 96 for 5, 80 for 6 (the allocation is per warp in units of 256 registers). */
#ifndef DG_DEV_QR_DIET_LAB_CUH
#define DG_DEV_QR_DIET_LAB_CUH

#include "cuda/qmoe_r.cuh"

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

/* The lab version ver (95-104) of the products over a lane-record stack of BITS bits (16: bf16), gate/up (GATEUP 1)
 * or down (0), nt n-tiles (qe_nt): version 95 the backend's launch choices with the other stage loop (FLIP 1), 96-104
 * qr_diet_launch's candidates, for 4 bits only (the 26B's experts; each candidate is 4 more kernels in the lab's
 * build, paid on the GPU machine's clock); cudaErrorInvalidValue for any other version or width. */
template <int BITS, int GATEUP>
cudaError_t qr_diet_version(int ver, cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (ver == 95) return qr_launch_bits<BITS, GATEUP, 1>(s, grid, nt, a);
  if constexpr (BITS == 4) {
    switch (ver) {
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
    default: break;
    }
  }
  return cudaErrorInvalidValue;
}

#endif
