/* attention_lab.cuh: the attention lab's versions 9-14 (dev/cuda/attention.cu; issue 12, session 18's candidates 9-11,
 * session 23's versions 12-13: Q K^T on wgmma, session 24's 14: 12 with its prologue reordered, 15: 14 with P V on
 * wgmma, and the phase stamps of the lab's --prof; each its own comment below).
 * Versions 12-15's kernel (att_wq_kernel, its launch and its --prof stamps) moved to src/cuda/attention_wq.cuh in
 * session 25, where 15 became the backend's default on Hopper (k_attention_any's version 15: the same template
 * instances as att_lab_version(15) below); 12-14 are still the lab's only.
 * 9-11 lab only: on an H100 (session 18) each was slower than version 6, the backend's default, on every row of the lab
 * (docs/cuda.md "Measured on an H100 in session 18"), so none is the backend's; they stay here, checked against the
 * lab's CPU reference and timed beside 6, for a later session to build on. Each is version 6's block
 * (fp_pair_block, src/cuda/attention.cuh: the same tiles, products, softmax and rounding) with only these changes:
 *   version 9  the key splits merged inside the kernel (lab_merge_last): the last split block of a row tile to arrive
 *              (an arrival counter per tile) merges the tile's rows with fp_combine_kernel's arithmetic (fp_merge_row),
 *              so no combine launch (fp_combine_kernel: 6.4 us of the sliding layer's 44, 9.2 of the full layer's 82
 *              in session 14's Nsight Compute run)
 *   version 10 version 9 with the pair's own barrier (bar.sync 1 + pair, 64 threads; lab_bar_sync4) for the score
 *              exchange: one block-wide barrier per key tile instead of two
 *   version 11 version 10 at D 128 and 256 with 32-key tiles in 112 KiB of shared memory under
 *              __launch_bounds__(256, 2) (at most 128 registers): 2 blocks per SM; D 512 as 10
 * At D 64 all three are version 6 (version 2's kernel there).
 *
 * Why each was tried: the sliding layer's 44 us in session 14's Nsight Compute run were 37.7 in flash_pair_kernel ("SM
 * %" 35: neither the tensor cores nor shared memory busy) and 6.4 in fp_combine_kernel (the full layer's 82: 72.9 and
 * 9.2). Version 9 removes the combine launch and its tail. Version 10 lets a pair go on to its softmax and P V without
 * waiting for the other three pairs' Q K^T: with every warp of the block released together at each barrier, the eight
 * warps reach the exponentials (MUFU) and the tensor-core phases at the same time, one phase idling the other's units.
 * Version 11 fits two blocks per SM: shared memory Q 32 + K/V 2 x 32 + exchange 16 = 112 KiB (+ 1 KiB reserved per
 * block: 226 of the SM's 228 KiB), at most 128 registers per thread (2 x 256 x 128 = the 64 K register file); so 16
 * warps per SM, 4 per scheduler, from two blocks whose barriers are independent, against version 6's 8 warps of one
 * block (186 registers, 192 KiB). Its costs: shared-memory bytes per multiply-add (loads + the cp.async fill, per block
 * and tile) 224 KiB / 2^20 = 0.219 against version 6's 416 KiB / 2^21 = 0.203, a barrier per 32 keys instead of 64,
 * and 4 splits instead of 2 at the sliding layer (64 blocks a split on 264 slots; partials 16.8 MB instead of 8.4,
 * merged in the kernel). D 512 keeps version 10's tiles in 11: Q alone is 64 KiB and O's half 128 registers.
 * ptxas (nvcc 13.0, sm_90, session 18): version 9 as 6 (153 registers at D 128, 186 at D 256, 243 at D 512); 10 the
 * same, barriers 0-4 (lab_bar_sync4's immediate ids; an id in a register made ptxas reserve all 16); 11 106 (D 128)
 * and 128 (D 256), fp_scores' dims loop not unrolled (2 or 4 spilled 24-28 bytes at D 256); no spills.
 *
 * The arrival counters are the lab's: att_lab_version takes ncnt ints at cnt, zero before the first launch; every
 * merging block zeroes its own again, so they are zero between launches (the lab checks a second launch). */
#ifndef DG_DEV_ATTENTION_LAB_CUH
#define DG_DEV_ATTENTION_LAB_CUH

#include "cuda/attention.cuh"
#include "cuda/attention_wq.cuh" /* versions 12-15's kernel, att_wq_kernel (wgmma, sm_90a; in src/cuda since
                                     session 25, where version 15 is the backend's default on Hopper) */
#include "cuda/attention_wqc.cuh" /* versions 16-18's kernel, att_wqc_kernel (session 29; in src/cuda behind
                                      DGEMMA_ATTN=16 and 18) */

static int wqc_last_ns = 0; /* the lab's report: the split count of the last launch of versions 16-18 */

#define ATT_LAB_FIRST 9 /* the lab's own versions: ATT_LAB_FIRST..ATT_LAB_LAST (k_attention_any takes the others) */
#define ATT_LAB_LAST 18

/* lab_bar_sync4<N>(k): bar.sync 1 + k, N for k in 0..3 (the same k for the whole warp): named barrier 1 + k (0 is
 * __syncthreads') of N threads (a multiple of 32), ordering shared and global memory among them as __syncthreads
 * does (PTX ISA, "bar.sync"); four predicated bar.sync with immediate ids, so ptxas reserves barriers 0-4 only (an
 * id in a register reserves all 16) without branches. The emulation's named barriers: dev/cuda_emu emu::bar_sync. */
#ifndef DG_CUDA_EMU
template <int N> __device__ __forceinline__ void lab_bar_sync4(int k) {
  static_assert(N % 32 == 0, "bar.sync: a multiple of 32 threads");
  asm volatile("{\n .reg .pred p0, p1, p2, p3;\n setp.eq.s32 p0, %0, 0;\n setp.eq.s32 p1, %0, 1;\n"
               " setp.eq.s32 p2, %0, 2;\n setp.eq.s32 p3, %0, 3;\n @p0 bar.sync 1, %1;\n @p1 bar.sync 2, %1;\n"
               " @p2 bar.sync 3, %1;\n @p3 bar.sync 4, %1;\n}\n" ::"r"(k), "n"(N) : "memory");
}
#else
template <int N> static inline void lab_bar_sync4(int k) { emu::bar_sync(1 + k, N); }
#endif

/* lab_merge_last (versions 9-11): the key splits merged inside the kernel, without fp_combine_kernel's launch. Every
 * split block of row tile (blockIdx.x, KV head g) has stored its partial (O, m, l) (fa_store); the last of the
 * n_split to arrive (an arrival counter per tile at cnt[g gridDim.x + blockIdx.x]: the "last block" pattern of the
 * CUDA samples' threadFenceReduction: each block's stores fenced before its arrival, the last block fenced after it
 * and reading the others' partials from L2, ld.global.cg) merges the tile's BM rows with fp_combine_kernel's
 * arithmetic (fp_merge_row: the same operations in the same order on the same partials as version 6's) and zeroes
 * the counter for the next launch. flag: one int of shared memory the block no longer reads. */
template <int D, int BM>
__device__ __forceinline__ void lab_merge_last(const fa_args &a, int *cnt_all, int *flag) {
  const int tid = threadIdx.x, G = a.NH / a.NKV, R = a.nq * G, r0 = blockIdx.x * BM, g = blockIdx.y;
  __threadfence();
  __syncthreads(); /* every thread's partial stored and fenced; every warp out of the loop (flag reuses X) */
  int *cnt = cnt_all + (size_t)g * gridDim.x + blockIdx.x;
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

/* att_lab_kernel's arguments: the backend's, and the arrival counters (NULL: one split, nothing to merge). One struct
 * (the counters a field, as they were in fa_args in session 18): with cnt as a second kernel parameter, ptxas spilled
 * 20 bytes in version 11 at D 256 (nvcc 13.0, sm_90, 128 registers), with the struct none. */
struct att_lab_args {
  fa_args a;
  int *cnt;
};

/* Versions 9-11's kernel: version 6's block (one m-tile per warp, 2 K/V stages) with BK keys per tile, the score
 * exchange behind the pair's barrier (PAIRBAR) or the block's, MINB blocks per SM (fp_scores not unrolled under
 * MINB > 1), and, with counters (a launch of n_split > 1), the splits merged by the last block of each tile. */
template <int D, int BK, int PAIRBAR, int MINB>
__global__ void __launch_bounds__(256, MINB) att_lab_kernel(att_lab_args p) {
  DG_PDL_ENTRY();
  constexpr int UN = MINB > 1 ? 1 : 4;
  float *X;
  if constexpr (PAIRBAR != 0) X = fp_pair_block<D, BK, 1, 2, UN>(p.a, [](int rg) { lab_bar_sync4<64>(rg); });
  else X = fp_pair_block<D, BK, 1, 2, UN>(p.a, [](int) { __syncthreads(); });
  if (p.cnt) lab_merge_last<D, 64>(p.a, p.cnt, (int *)X);
}

/* One launch of att_lab_kernel: the split count by version 6's rule (fa_choose_splits over the occupancy the runtime
 * reports; MINB > 1 also asks for the largest shared-memory carveout, a hint the driver may otherwise set for one
 * block); a launch of n_split > 1 needs a counter per (row tile, KV head): cudaErrorInvalidValue if ncnt is short. */
template <int D, int BK, int PAIRBAR, int MINB>
static cudaError_t att_lab_launch(cudaStream_t s, const dg_att_ws *ws, int *cnt, int ncnt, fa_args a) {
  typedef fp_cfg<D, BK, 1, 2> C;
  const int G = a.NH / a.NKV, R = a.nq * G, bx = (R + C::BM - 1) / C::BM;
  void (*kern)(att_lab_args) = att_lab_kernel<D, BK, PAIRBAR, MINB>;
  static int per_sm = 0; /* one attribute call and occupancy query per instantiation */
  if (!per_sm) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e == cudaSuccess && MINB > 1)
      e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (e != cudaSuccess) return e;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
  }
  att_lab_args p = {a, NULL};
  p.a.n_split = fa_choose_splits(ws, a, bx * a.NKV, BK, per_sm, D);
  if (p.a.n_split > 1) {
    if (!cnt || bx * a.NKV > ncnt) return cudaErrorInvalidValue;
    p.cnt = cnt;
  }
  DG_LAUNCH(kern, dim3(bx, a.NKV, p.a.n_split), 256, C::SMEM, s)(p);
  return cudaGetLastError();
}

/* Version 17 (the lab's B-canvas rows): nb canvases' attention in one launch, each with its own q, caches, output,
 * pos0 and kv_hi (the same S, nq, heads, head dim and layer kind); *ns_out the split count. cudaErrorInvalidValue for
 * nb outside 1..WQC_MAXB or a head dim other than 128, 256, 512. */
static inline cudaError_t att_lab_batch(cudaStream_t s, int nb, const float *const *q, const bf16 *const *kc,
                                        const bf16 *const *vc, bf16 *const *out, const int32_t *pos0,
                                        const int *kv_hi, int S, int nq, int NH, int NKV, int D, int causal,
                                        int is_full, int window, int *ns_out, int inv = 0) {
  if (nb < 1 || nb > WQC_MAXB || (D != 128 && D != 256 && D != 512) || !k_attention_flash_ok(D, NH, NKV))
    return cudaErrorInvalidValue;
  if (nq <= 0) return cudaSuccess;
  fa_args a[WQC_MAXB];
  for (int i = 0; i < nb; i++) {
    a[i].q = q[i]; a[i].kc = kc[i]; a[i].vc = vc[i]; a[i].out = out[i]; a[i].part = NULL;
    a[i].S = S; a[i].nq = nq; a[i].NH = NH; a[i].NKV = NKV; a[i].causal = causal; a[i].is_full = is_full;
    a[i].window = window; a[i].n_split = 1; a[i].pos0 = pos0[i]; a[i].kv_hi = kv_hi[i];
  }
  return D == 128   ? wqc_launch<128, 64, 1, WQC_MAXB>(s, a, nb, ns_out, inv)
         : D == 256 ? wqc_launch<256, 64, 1, WQC_MAXB>(s, a, nb, ns_out, inv)
                    : wqc_launch<512, 32, 2, WQC_MAXB>(s, a, nb, ns_out, inv);
}

/* Lab version v (ATT_LAB_FIRST..ATT_LAB_LAST) of the attention, with k_attention_any's arguments (shapes and key
 * ranges: src/cuda/common.cuh) and the arrival counters (cnt, ncnt ints, zero); cudaErrorInvalidValue for another
 * version or a head dim the tensor-core kernels do not take (k_attention_flash_ok). */
static cudaError_t att_lab_version(int v, cudaStream_t s, const dg_att_ws *ws, int *cnt, int ncnt, const float *q,
                                   const bf16 *kc, const bf16 *vc, bf16 *out, int S, int nq, int NH, int NKV, int D,
                                   int32_t pos0, int kv_hi, int causal, int is_full, int window) {
  if (v < ATT_LAB_FIRST || v > ATT_LAB_LAST || !k_attention_flash_ok(D, NH, NKV)) return cudaErrorInvalidValue;
  if (nq <= 0) return cudaSuccess;
  if (D == 64) /* version 6 there (version 2's kernel: halves of 32 are too narrow for the pair's swizzle) */
    return k_attention_any(s, ws, 6, q, kc, vc, out, S, nq, NH, NKV, D, pos0, kv_hi, causal, is_full, window);
  fa_args a;
  a.q = q; a.kc = kc; a.vc = vc; a.out = out; a.part = ws ? ws->part : NULL;
  a.S = S; a.nq = nq; a.NH = NH; a.NKV = NKV; a.causal = causal; a.is_full = is_full; a.window = window;
  a.n_split = 1; a.pos0 = pos0; a.kv_hi = kv_hi;
  if (v == 12)
    return D == 128 ? att_wq_launch<128, 64, 1, 2>(s, ws, a) : D == 256 ? att_wq_launch<256, 64, 1, 2>(s, ws, a)
                                                                        : att_wq_launch<512, 32, 2, 2>(s, ws, a);
  if (v == 13)
    return D == 128 ? att_wq_launch<128, 32, 1, 1>(s, ws, a) : D == 256 ? att_wq_launch<256, 32, 1, 1>(s, ws, a)
                                                                        : att_wq_launch<512, 32, 2, 2>(s, ws, a);
  if (v == 14)
    return D == 128 ? att_wq_launch<128, 64, 1, 2, 1>(s, ws, a) : D == 256 ? att_wq_launch<256, 64, 1, 2, 1>(s, ws, a)
                                                                           : att_wq_launch<512, 32, 2, 2, 1>(s, ws, a);
  if (v >= 16 && v <= 18) /* one canvas: version 16's kernel (NB 1), or 17's and 18's (NB WQC_MAXB) with one canvas
                             (for one canvas the two split rules agree) */
    return v == 16 ? (D == 128   ? wqc_launch<128, 64, 1, 1>(s, &a, 1, &wqc_last_ns)
                      : D == 256 ? wqc_launch<256, 64, 1, 1>(s, &a, 1, &wqc_last_ns)
                                 : wqc_launch<512, 32, 2, 1>(s, &a, 1, &wqc_last_ns))
                   : (D == 128   ? wqc_launch<128, 64, 1, WQC_MAXB>(s, &a, 1, &wqc_last_ns, v == 18)
                      : D == 256 ? wqc_launch<256, 64, 1, WQC_MAXB>(s, &a, 1, &wqc_last_ns, v == 18)
                                 : wqc_launch<512, 32, 2, WQC_MAXB>(s, &a, 1, &wqc_last_ns, v == 18));
  if (v == 15) /* the backend's version 15 (src/cuda/attention.cu k_attention_any: the same template instances, here
                 compiled with the lab's architecture, so that the lab runs it whatever the library was built for) */
    return D == 128   ? att_wq_launch<128, 64, 1, 2, 1, 0, 1>(s, ws, a)
           : D == 256 ? att_wq_launch<256, 64, 1, 2, 1, 0, 1>(s, ws, a)
                      : att_wq_launch<512, 32, 2, 2, 1, 0, 1>(s, ws, a);
  switch (D) {
  case 128:
    return v == 9 ? att_lab_launch<128, 64, 0, 1>(s, ws, cnt, ncnt, a)
           : v == 10 ? att_lab_launch<128, 64, 1, 1>(s, ws, cnt, ncnt, a)
                     : att_lab_launch<128, 32, 1, 2>(s, ws, cnt, ncnt, a);
  case 256:
    return v == 9 ? att_lab_launch<256, 64, 0, 1>(s, ws, cnt, ncnt, a)
           : v == 10 ? att_lab_launch<256, 64, 1, 1>(s, ws, cnt, ncnt, a)
                     : att_lab_launch<256, 32, 1, 2>(s, ws, cnt, ncnt, a);
  default:
    return v == 9 ? att_lab_launch<512, 32, 0, 1>(s, ws, cnt, ncnt, a) : att_lab_launch<512, 32, 1, 1>(s, ws, cnt, ncnt, a);
  }
}

/* The lab's --prof (timing only): version 12, 14 or 15 with att_wq_kernel's phase stamps (PROF above) into prof, room
 * for *nblk blocks (out: the grid's blocks), WQ_PROF_BLOCK + 8 x 8 u64 each; ev recorded between the flash kernel
 * and fp_combine_kernel; the arguments as att_lab_version's. cudaErrorInvalidValue for another version, D 64, or
 * too few blocks' room. The output is the version's own (the stamps change no arithmetic). */
static inline cudaError_t att_lab_profile(int v, cudaStream_t s, const dg_att_ws *ws, unsigned long long *prof, int *nblk,
                                   cudaEvent_t ev, const float *q, const bf16 *kc, const bf16 *vc, bf16 *out, int S,
                                   int nq, int NH, int NKV, int D, int32_t pos0, int kv_hi, int causal, int is_full,
                                   int window) {
  if ((v != 12 && v != 14 && v != 15) || D == 64 || !k_attention_flash_ok(D, NH, NKV)) return cudaErrorInvalidValue;
  fa_args a;
  a.q = q; a.kc = kc; a.vc = vc; a.out = out; a.part = ws ? ws->part : NULL;
  a.S = S; a.nq = nq; a.NH = NH; a.NKV = NKV; a.causal = causal; a.is_full = is_full; a.window = window;
  a.n_split = 1; a.pos0 = pos0; a.kv_hi = kv_hi;
  if (v == 12)
    return D == 128 ? att_wq_launch<128, 64, 1, 2, 0, 1>(s, ws, a, prof, nblk, ev)
           : D == 256 ? att_wq_launch<256, 64, 1, 2, 0, 1>(s, ws, a, prof, nblk, ev)
                      : att_wq_launch<512, 32, 2, 2, 0, 1>(s, ws, a, prof, nblk, ev);
  if (v == 14)
    return D == 128 ? att_wq_launch<128, 64, 1, 2, 1, 1>(s, ws, a, prof, nblk, ev)
           : D == 256 ? att_wq_launch<256, 64, 1, 2, 1, 1>(s, ws, a, prof, nblk, ev)
                      : att_wq_launch<512, 32, 2, 2, 1, 1>(s, ws, a, prof, nblk, ev);
  return D == 128 ? att_wq_launch<128, 64, 1, 2, 1, 1, 1>(s, ws, a, prof, nblk, ev)
         : D == 256 ? att_wq_launch<256, 64, 1, 2, 1, 1, 1>(s, ws, a, prof, nblk, ev)
                    : att_wq_launch<512, 32, 2, 2, 1, 1, 1>(s, ws, a, prof, nblk, ev);
}

#endif
