/* dense_lab.cu (lab, issue 12 item 5): the dense bf16 products of a 26B-A4B decoder pass (q/k/v, o-proj, dense MLP
 * gate|up and down) at 128-512 canvas rows, on a Hopper wgmma kernel of this file (dn_kernel) beside the backend's
 * call (cublasGemmEx, OP_T OP_N, bf16 in, fp32 accumulate and out: src/cuda/passes.cu gemm), in the same run, each
 * checked against a double-precision CPU reference on sampled outputs, then timed with cudaEvents (median and spread
 * of --reps, L2 flushed by a 256 MiB write before each rep) against the floor of this GPU measured in the same
 * command (a streaming read of 2 GiB and cublasGemmEx 8192^3, best of 5).
 *
 * The product: y[T, N] fp32 = x[T, K] bf16 W[N, K]^T (W row-major, the checkpoint's [out, in]).
 *
 * dn_kernel<WG, ST, NT, PF, EPI> (BN = 8 NT weight rows a block, BM = 64 WG canvas rows a pass; PF: version 4's L2
 * prefetch distance in stages, 0 none; EPI 1: version 5's GeGLU epilogue, 2: version 6's q/k/v one, 0 the plain fp32
 * product):
 *   grid        (ceil(N / BN), KS): block (i, j) owns the slab of BN weight rows n0 = i BN.. and the j-th of KS
 *               equal runs of the K / 64 stages (split-K: enough blocks for the SMs when N / BN alone is too few);
 *               each weight byte is read from HBM by exactly one block, once per pass over the rows (one pass for
 *               T <= BM: the rows are small, every row of the canvas uses the slab while it is in shared memory)
 *   warpgroups  WG, warpgroup w the canvas rows 64 w.. of the pass: wgmma m64nBNk16, A = the activations, B = the
 *               weight slab, both from shared memory (dg_wgmma_bf16_ss), fp32 accumulators (NT x 4 per thread)
 *   stage       64 k: the A tile (BM rows x 128 bytes) and the B tile (BN rows x 128 bytes), both K-major with the
 *               128-byte swizzle (row r's 16-byte chunk c at (c ^ (r % 8)) 16; 1024-byte aligned; the layout
 *               dev/cuda/qmoe_wl.cuh uses), copied by cp.async straight from x and W (no conversion), in a ring of
 *               ST slots, L = ST - 2 stages in flight ahead of the products
 *   iteration s wait for stage s's copies (this thread's), fence.proxy.async, barrier; copies of stage s + L into
 *               slot (s + L) % ST (last read by stage s - 2's wgmmas, retired by every warpgroup's wait_group 1 of
 *               iteration s - 1, before this barrier); 4 wgmmas (k16 steps at 32-byte offsets), commit, wait_group 1
 *   rows past T cp.async with 0 source bytes: zeros, never stored
 *   epilogue    KS = 1: the fp32 results stored (float2 per lane); KS > 1: added (atomicAdd, red.global.add.f32)
 *               into y, which the launcher zeroes first (cudaMemsetAsync, inside the timed region); EPI 1: version 5
 *               below. The launcher turns a KS that would leave a split empty into fewer runs of the same length
 * Requirements: K % 64 == 0, ldx % 8 == 0, x and W 16-byte aligned (cp.async of 16 bytes), T >= 1.
 *
 * Versions (--versions):
 *   0  cublasGemmEx, CUBLAS_GEMM_DEFAULT (the backend's call; gemm_pin.cu's pins are not applied here)
 *   1  dn_kernel BN 128, ST 4 (~193 KiB of ring: one block per SM), KS by auto_ks (the fewest waves x stages per SM)
 *   2  dn_kernel BN 64, ST 5 (~201 KiB at T > 128), KS the same rule
 *   3  dn_kernel BN 128, ST 4, KS 1 (no memset, no atomics: the slab count alone fills the SMs or not)
 *   4  version 1 with the weight rows of stage s + L + 4 prefetched into L2 (prefetch.global.L2) at iteration s, and
 *      stages L..L+3 at the start: the ring holds only L = 2 stages of 16 KiB of weights (the activations take the
 *      other 32 KiB of a slot), ~32 KiB of HBM reads in flight per SM against the ~35 KiB that ~23 GB/s per SM over a
 *      ~1.5 us loaded latency needs; with the prefetch ~6 stages (~96 KiB) are asked for
 *   5  (gate|up only: mlp_gu, and small_a with --small) version 4 with the GeGLU in the epilogue, h = bf16(gelu_tanh(g) u)
 *      [T, I]: the weights interleaved per slab (64 gate rows, then the 64 up rows of the same features), so a block
 *      holds gate and up of its 64 features; KS 1: h from the registers; KS > 1: every block adds its partial sums into
 *      an fp32 workspace (atomics), and the last block of the slab to arrive (a counter per slab and row pass, after
 *      __threadfence) reads the sums back from L2, writes h and leaves the workspace and the counter zero: no memset,
 *      no fp32 gu in HBM (its write + read, 8.65 MB at T 256), one launch instead of the backend's two. Timed against
 *      "0g", the backend's pair: cublasGemmEx into gu fp32, then a geglu4 kernel (lab_geglu4_kernel, the backend's
 *      geglu4_kernel's arithmetic). h is checked against bf16(gelu(g) u) of the exact sums within the bound derived
 *      beside its check (main), and version 5 against the pair within twice that; after version 5 the workspace and
 *      counters must be all zero.
 *   6  (q/k/v of a sliding layer only: qkv_s, and small_q with --small) version 4 with the q/k/v post-processing in
 *      the epilogue (the backend's k_qkv_post: q/k rmsnorm with their weights, v rms, rotate-half rope at position
 *      pos0 + row, q fp32 [T, NH, D], K and V bf16 into their cache slots pos % S): every block puts its partial (or,
 *      KS 1, its result) into an fp32 workspace; the last of the head's D / 128 slabs x KS blocks to arrive (a
 *      counter per head and row pass) finishes the head, a warp per row (the sum of squares by a xor tree), and
 *      leaves the workspace and counter zero: no fp32 qkv in HBM (16.8 MB write + read at T 256), one launch
 *      instead of two. Timed against "0q": cublasGemmEx into qkv fp32, then lab_qkv_post_kernel (qkv_post_kernel's
 *      expressions, a warp per (row, head)). Each output is checked against the exact sums' post-processing at the
 *      device's fp32 angle within the bound derived beside its check (main); version 6 against the pair within
 *      twice that. Full layers are not done: D 512 fits the finish (8 pairs a lane), but K = V there (no v heads:
 *      the k head's finish would also write v = rms(k raw)), and their N is (NH + NKV) D.
 *
 * Accuracy (the check's bound, derived): every product x_k w_k of two bf16 values is exact in fp32 (8 + 8
 * significant bits <= 24); the sum over K products (in any order: the tensor cores' internal order and rounding of
 * fp32 additions are unspecified, truncation allowed, so 2u per addition, u = 2^-24), plus at most KS - 1 additions
 * of split partials (atomics, any order) and the add to the zeroed output, has at most K + KS additions on any
 * path, so |y - exact| <= g(2 (K + KS)) sum_k |x_k w_k|, g(n) = n u / (1 - n u) (Higham, Accuracy and Stability,
 * 2nd ed., Lemma 3.1 and section 4.2: recursive summation in any order). cuBLAS (fp32 accumulate) is checked
 * against g(2 (K + 64)) sum |x w|: its order and split-K are unknown, and 64 more additions cover any split-K of up
 * to 64 parts (its heuristic's algorithms for these shapes on the H200 split at most 4 ways:
 * docs/results/h200-s14/call2_gemm_lab.md);
 * the lab's result against cuBLAS's within the sum of the two bounds (the summation orders
 * differ: no bitwise comparison is meaningful). Checked on sampled outputs (--samples; every output with --small),
 * each version's output first filled with NaN bytes (a missed store is NaN, fails).
 *
 * Build and run (GPU machine; sm_90a: the wgmma wrappers trap on any other target):
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xptxas -v dev/cuda/dense_lab.cu \
 *        -lcublas -lcudart -o build-a/dense_lab
 *   build-a/dense_lab [--reps 30] [--rows 128,256,512] [--shapes qkv_s,o_s] [--versions 0,1,2,3,4,5,6] [--samples 4096]
 * On the CPU emulation (dev/cuda_emu; checks only, emulation-sized shapes, every output checked):
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc \
 *       -c dev/cuda_emu/emu.cpp -o build-emu/emu_lab.o
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc \
 *       dev/cuda/dense_lab.cu -x none build-emu/emu_lab.o -lm -lstdc++ -o build-emu/dense_lab
 *   build-emu/dense_lab --small */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/wgmma.cuh"

#define CKL(x)                                                                                                   \
  do {                                                                                                           \
    cudaError_t e_ = (x);                                                                                        \
    if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
  } while (0)
#define CBL(x)                                                                                                   \
  do {                                                                                                           \
    cublasStatus_t s_ = (x);                                                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } \
  } while (0)

/* y[T, N] (ld ldy) = x[T, K] (ld ldx) W[N, K]^T; ks: the split of the K / 64 stages over gridDim.y. */
struct dn_args {
  const bf16 *X;
  const bf16 *W;
  float *Y;
  int T, N, K, ldx, ldy, ks;
  /* EPI 1 (GeGLU, version 5): h [T, I] bf16 = bf16(gelu_tanh(gate) up); W's rows interleaved per slab of 128 (64
   * gate rows of features f.., then the 64 up rows of the same f: geglu_pack); Y the fp32 workspace [T, 2 I] of the
   * split sums (zero before the launch, left zero after it), cnt the arrival counters [slabs x 16] (same) */
  bf16 *H;
  int *cnt;
  int I;
  /* EPI 2: the q/k/v post-processing's arguments, in device memory (read by the finishing block only; by value
   * here they cost the plain kernels registers: ptxas spilled versions 1 and 4 with them in dn_args) */
  const struct dn_qkv *qp;
};
/* EPI 2 (q/k/v post, version 6; sliding layers: has_v, no scattered positions): the raw [q | k | v] heads of D
 * columns in the workspace Y [T, (NH + 2 NKV) D] (zero before, left zero), finished per head as the backend's
 * qkv_post_kernel: q = rope(rms(q) q_norm) fp32 [T, NH, D]; k = rope(rms(k) k_norm) bf16 into kc[g][pos % S];
 * v = rms(v) bf16 into vc[g][pos % S]; pos = pos0 + row; cnt (dn_args) [heads x 16] */
struct dn_qkv {
  float *q;
  bf16 *kc, *vc;
  const float *qn, *kn, *invf;
  int NH, NKV, D, S, pos0;
  float eps;
};

/* gelu_tanh as the backend's (src/cuda/kernels.cu gelu_tanh: spec 4.1), the same operations in the same order */
__device__ __forceinline__ float dn_gelu(float a) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

#ifdef DG_CUDA_EMU
static inline void dn_red(float *p, float v) { *p += v; } /* blocks run one after another here */
static inline void dn_prefetch_l2(const void *) {}      /* a hint: nothing to emulate */
#else
__device__ __forceinline__ void dn_red(float *p, float v) { atomicAdd(p, v); }
/* prefetch.global.L2 (PTX ISA: a hint, no result): the line holding p brought into L2 */
__device__ __forceinline__ void dn_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
#endif

template <int WG, int ST, int NT, int PF = 0, int EPI = 0>
__global__ void __launch_bounds__(128 * WG, 1) dn_kernel(dn_args a) {
  DG_PDL_ENTRY();
  static_assert(ST >= 3, "dn_kernel: ST >= 3 (one stage of copies ahead at least)");
  static_assert(NT == 8 || NT == 16, "dn_kernel: BN 64 or 128");
  static_assert(EPI == 0 || NT == 16, "dn_kernel: the GeGLU and q/k/v epilogues' slabs are 128 columns");
  constexpr int THREADS = 128 * WG, BM = 64 * WG, BN = 8 * NT, L = ST - 2;
  constexpr int ABYTES = BM * 128, BBYTES = BN * 128, SLOT = ABYTES + BBYTES;
  constexpr int ACH = BM * 8 / THREADS; /* 16-byte copies of the A tile per thread and stage (4) */
  static_assert((BN * 8) % THREADS == 0, "dn_kernel: the B tile's 16-byte pieces a whole number per thread");
  constexpr int BCH = BN * 8 / THREADS;
  DG_DYN_SMEM16(smem_raw);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * BN;
  const int nk = a.K / 64, per = (nk + a.ks - 1) / a.ks, k0 = blockIdx.y * per, k1 = min(nk, k0 + per);
  if (k0 >= k1) return; /* an empty split (uniform per block) */
  const int ns = k1 - k0;
  /* 1024-byte aligned slots (the 128-byte swizzle's pattern) */
  const uint32_t s0 = dg_smem_addr(smem_raw), pad = (1024u - s0 % 1024u) % 1024u, sm = s0 + pad;
  const dg_sptr sbase = dg_sp(smem_raw + pad);
  /* this thread's B copies: piece q = tid + THREADS k, weight row n = q / 8, 16-byte piece r = q % 8 of the stage */
  const bf16 *bsrc[BCH];
  int bdst[BCH], bbytes[BCH];
#pragma unroll
  for (int k = 0; k < BCH; k++) {
    const int q = tid + THREADS * k, n = q >> 3, r = q & 7;
    const int ok = n0 + n < a.N;
    bsrc[k] = ok ? a.W + (size_t)(n0 + n) * a.K + 8 * r : a.W;
    bbytes[k] = ok ? 16 : 0;
    bdst[k] = ABYTES + n * 128 + ((r ^ (n & 7)) << 4);
  }
  for (int p0 = 0; p0 < a.T; p0 += BM) {
    const bf16 *asrc[ACH];
    int adst[ACH], abytes[ACH];
#pragma unroll
    for (int k = 0; k < ACH; k++) {
      const int q = tid + THREADS * k, m = q >> 3, r = q & 7;
      const int ok = p0 + m < a.T;
      asrc[k] = ok ? a.X + (size_t)(p0 + m) * a.ldx + 8 * r : a.X;
      abytes[k] = ok ? 16 : 0; /* rows past T: zeros (never stored) */
      adst[k] = m * 128 + ((r ^ (m & 7)) << 4);
    }
    auto issue = [&](int s) {
      if (s < ns) {
        const dg_sptr slot = sbase + (s % ST) * SLOT;
        const int kofs = 64 * (k0 + s);
#pragma unroll
        for (int k = 0; k < ACH; k++) dg_cp_async16_sp(slot + adst[k], asrc[k] + (abytes[k] ? kofs : 0), abytes[k]);
#pragma unroll
        for (int k = 0; k < BCH; k++) dg_cp_async16_sp(slot + bdst[k], bsrc[k] + (bbytes[k] ? kofs : 0), bbytes[k]);
      }
      dg_cp_commit(); /* an empty group past the run keeps the wait counts uniform */
    };
    /* PF > 0: the weight rows of stage s (BN lines of 128 bytes) asked into L2 ahead of their cp.async (thread n one
     * row; the activations are L2-resident already): more HBM bytes in flight per SM than the ring's L stages */
    auto prefetch = [&](int s) {
      if (PF > 0 && s < ns && tid < BN && n0 + tid < a.N) dn_prefetch_l2(a.W + (size_t)(n0 + tid) * a.K + 64 * (k0 + s));
    };
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < L; s++) issue(s);
    if (PF > 0 && p0 == 0)
      for (int s = L; s < L + PF; s++) prefetch(s);
    for (int s = 0; s < ns; s++) {
      dg_cp_wait<L - 1>(); /* stage s (this thread's copies): s + L groups committed, L - 1 may be pending */
      dg_fence_proxy_async();
      __syncthreads();
      issue(s + L);
      if (p0 == 0) prefetch(s + L + PF);
      const uint32_t at = sm + (uint32_t)((s % ST) * SLOT + wg * 64 * 128), bt = sm + (uint32_t)((s % ST) * SLOT + ABYTES);
      dg_wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        dg_wgmma_bf16_ss<NT>(acc, dg_wg_desc_sw128(at + 32 * kk, 1024), dg_wg_desc_sw128(bt + 32 * kk, 1024),
                             s > 0 || kk > 0);
      dg_wg_commit();
      dg_wg_wait1();
    }
    dg_wg_wait0();
    dg_wg_pin<NT>(acc);
    /* lane (g, t) of warp w: rows 16 w + g + 8 hf of its warpgroup's 64, columns 8 j + 2 t + (0, 1) of the slab */
    if (EPI == 1 && a.ks == 1) { /* GeGLU from the registers: column c < 64 gate of feature f, c + 64 its up */
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int row = p0 + wg * 64 + 16 * warp + g + 8 * hf;
        if (row >= a.T) continue;
#pragma unroll
        for (int j = 0; j < NT / 2; j++) {
          const int f = blockIdx.x * (BN / 2) + 8 * j + 2 * t;
#pragma unroll
          for (int q = 0; q < 2; q++)
            if (f + q < a.I)
              a.H[(size_t)row * a.I + f + q] = __float2bfloat16_rn(dn_gelu(acc[j][2 * hf + q]) * acc[j + NT / 2][2 * hf + q]);
        }
      }
    } else {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int row = p0 + wg * 64 + 16 * warp + g + 8 * hf;
        if (row >= a.T) continue;
        float *yr = a.Y + (size_t)row * a.ldy;
#pragma unroll
        for (int j = 0; j < NT; j++) {
          const int n = n0 + 8 * j + 2 * t;
          if (a.ks == 1 && n + 1 < a.N) {
            *(float2 *)(yr + n) = make_float2(acc[j][2 * hf], acc[j][2 * hf + 1]);
          } else {
#pragma unroll
            for (int q = 0; q < 2; q++)
              if (n + q < a.N) {
                if (a.ks == 1) yr[n + q] = acc[j][2 * hf + q];
                else dn_red(yr + n + q, acc[j][2 * hf + q]);
              }
          }
        }
      }
    }
    if (EPI == 2) {
      /* the last of the (D / BN) KS blocks of this head and pass to arrive finishes the head: a warp per row, lane
       * holding the pairs (i, i + D / 2), i = lane + 32 e; sum of squares by a xor tree; the backend's expressions */
      __shared__ int last2;
      const dn_qkv &b = *a.qp;
      __threadfence();
      __syncthreads();
      const int hd = n0 / b.D;
      int *cnt = a.cnt + hd * 16 + p0 / BM;
      if (tid == 0) last2 = atomicAdd(cnt, 1) == (b.D / BN) * a.ks - 1;
      __syncthreads();
      if (last2) {
        __threadfence();
        const int h = b.D / 2, kind = hd < b.NH ? 0 : hd < b.NH + b.NKV ? 1 : 2;
        const int gk = kind == 1 ? hd - b.NH : hd - b.NH - b.NKV;
        for (int m = tid >> 5; m < BM; m += THREADS / 32) {
          const int row = p0 + m;
          if (row >= a.T) continue; /* uniform per warp */
          float *w = a.Y + (size_t)row * a.ldy + (size_t)hd * b.D;
          float va[8], vb[8]; /* D <= 512: h / 32 <= 8 pairs per lane */
          float ss = 0.0f;
          for (int e = 0; e < h / 32; e++) {
            const int i = lane + 32 * e;
            va[e] = __ldcg(w + i);
            vb[e] = __ldcg(w + i + h);
            ss += va[e] * va[e] + vb[e] * vb[e];
            w[i] = 0.0f;
            w[i + h] = 0.0f;
          }
          for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          const float r = rsqrtf(ss / (float)b.D + b.eps);
          const int pos = b.pos0 + row, cs = pos % b.S;
          const float p = (float)pos;
          for (int e = 0; e < h / 32; e++) {
            const int i = lane + 32 * e;
            if (kind == 2) {
              bf16 *dst = b.vc + ((size_t)gk * b.S + cs) * b.D;
              dst[i] = __float2bfloat16_rn(va[e] * r);
              dst[i + h] = __float2bfloat16_rn(vb[e] * r);
              continue;
            }
            const float *nw = kind == 0 ? b.qn : b.kn;
            const float x0 = (va[e] * r) * nw[i], x1 = (vb[e] * r) * nw[i + h];
            const float ang = b.invf[i] * p, c = cosf(ang), sn = sinf(ang);
            const float y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
            if (kind == 0) {
              float *qd = b.q + ((size_t)row * b.NH + hd) * b.D;
              qd[i] = y0;
              qd[i + h] = y1;
            } else {
              bf16 *kd = b.kc + ((size_t)gk * b.S + cs) * b.D;
              kd[i] = __float2bfloat16_rn(y0);
              kd[i + h] = __float2bfloat16_rn(y1);
            }
          }
        }
        if (tid == 0) *cnt = 0;
      }
    }
    if (EPI == 1 && a.ks > 1) {
      /* the last of the KS blocks of this slab and pass to arrive (a counter per slab and pass) reads the sums back
       * from L2 (__ldcg: past L1), writes h and leaves the workspace tile and the counter zero for the next launch
       * (the threadFenceReduction pattern: every block's adds fenced before its arrival, the last one's reads after) */
      __shared__ int last;
      __threadfence();
      __syncthreads();
      int *cnt = a.cnt + blockIdx.x * 16 + p0 / BM;
      if (tid == 0) last = atomicAdd(cnt, 1) == a.ks - 1;
      __syncthreads();
      if (last) {
        __threadfence();
        constexpr int HB = BN / 2;
        for (int i = tid; i < BM * HB; i += THREADS) {
          const int m = i / HB, c = i % HB, row = p0 + m, f = blockIdx.x * HB + c;
          if (row >= a.T || f >= a.I) continue;
          float *w = a.Y + (size_t)row * a.ldy + n0 + c;
          const float gv = __ldcg(w), uv = __ldcg(w + HB);
          a.H[(size_t)row * a.I + f] = __float2bfloat16_rn(dn_gelu(gv) * uv);
          w[0] = 0.0f;
          w[HB] = 0.0f;
        }
        if (tid == 0) *cnt = 0;
      }
    }
    __syncthreads(); /* every slot read (wait_group 0 above) by every warpgroup before the next pass's copies */
  }
}

/* Dynamic shared memory of a dn_kernel: ST slots of (BM + BN) rows of 128 bytes, + 1024 for the alignment. */
static size_t dn_smem(int WG, int ST, int NT) { return (size_t)ST * (64 * WG + 8 * NT) * 128 + 1024; }

/* Launches dn_kernel (y zeroed first when a.ks > 1). */
template <int WG, int ST, int NT, int PF = 0, int EPI = 0> static cudaError_t dn_launch(cudaStream_t s, const dn_args &a) {
  if (a.K % 64 || a.ldx % 8 || a.T < 1 || a.ks < 1) return cudaErrorInvalidValue;
  if (EPI == 1 && (a.I % 64 || a.N != 2 * a.I || a.T > 16 * 64 * WG)) return cudaErrorInvalidValue;
  if (EPI == 2 && (!a.qp || a.T > 16 * 64 * WG)) return cudaErrorInvalidValue; /* (shapes: lab_qkv_check) */
  void (*kern)(dn_args) = dn_kernel<WG, ST, NT, PF, EPI>;
  /* no empty split: KS reduced to the number of runs of ceil(nk / KS) stages (the same runs), so that every block
   * of a slab arrives at the GeGLU epilogue's counter */
  const int nk = a.K / 64, per = (nk + a.ks - 1) / a.ks;
  dn_args b = a;
  b.ks = (nk + per - 1) / per;
  const size_t smem = dn_smem(WG, ST, NT);
  static int set = 0;
  if (!set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
  if (b.ks > 1 && EPI == 0) { /* (EPI 1, 2: the workspace is kept zero by the kernel) */
#ifdef DG_CUDA_EMU
    cudaError_t e = cudaMemset(b.Y, 0, (size_t)b.T * b.ldy * 4);
#else
    cudaError_t e = cudaMemsetAsync(b.Y, 0, (size_t)b.T * b.ldy * 4, s);
#endif
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((b.N + 8 * NT - 1) / (8 * NT), b.ks);
#ifdef DG_CUDA_EMU
  DG_LAUNCH(kern, grid, 128 * WG, smem, s)(b);
#else
  kern<<<grid, 128 * WG, smem, s>>>(b); /* a plain launch: the lab links no library (DG_LAUNCH's PDL switch is its) */
#endif
  return cudaGetLastError();
}

/* The backend's second launch of the gate|up pair (k_geglu's geglu4_kernel: a float4 of gate and of up per thread,
 * grid (ceil(I / 4 / 256), T)), written here for the lab (it links no library): h = bf16(gelu_tanh(gate) up) from
 * gu [T, 2 I] (gate columns first). I % 4 == 0. */
__global__ void lab_geglu4_kernel(const float *gu, bf16 *h, int I) {
  DG_PDL_ENTRY();
  const int f = blockIdx.x * blockDim.x + threadIdx.x;
  const size_t t = blockIdx.y;
  if (4 * f >= I) return;
  const float4 g = *(const float4 *)(gu + t * 2 * I + 4 * f), u = *(const float4 *)(gu + t * 2 * I + I + 4 * f);
  bf16 *o = h + t * I + 4 * f;
  o[0] = __float2bfloat16_rn(dn_gelu(g.x) * u.x);
  o[1] = __float2bfloat16_rn(dn_gelu(g.y) * u.y);
  o[2] = __float2bfloat16_rn(dn_gelu(g.z) * u.z);
  o[3] = __float2bfloat16_rn(dn_gelu(g.w) * u.w);
}
static void lab_geglu(const float *gu, bf16 *h, int T, int I) {
  const dim3 grid((I / 4 + 255) / 256, T);
#ifdef DG_CUDA_EMU
  DG_LAUNCH(lab_geglu4_kernel, grid, 256, 0, 0)(gu, h, I);
#else
  lab_geglu4_kernel<<<grid, 256>>>(gu, h, I);
#endif
  CKL(cudaGetLastError());
}

/* The backend's second launch of the q/k/v pair for the lab (qkv_post_kernel's arithmetic, has_v, positions pos0 +
 * t; the sum of squares in a warp's xor order as qkv_post_warp_kernel): one warp per (row t, head slot), grid (T,
 * NH + 2 NKV), from qkv [T, ld] fp32. */
__global__ void lab_qkv_post_kernel(const float *qkv, int ld, float *q, bf16 *kc, bf16 *vc, int S, const float *qn,
                                    const float *kn, const float *invf, int NH, int NKV, int D, int pos0, float eps) {
  DG_PDL_ENTRY();
  const int t = blockIdx.x, hd = blockIdx.y, lane = threadIdx.x, h = D / 2;
  const int kind = hd < NH ? 0 : hd < NH + NKV ? 1 : 2, gk = kind == 1 ? hd - NH : hd - NH - NKV;
  const float *w = qkv + (size_t)t * ld + (size_t)hd * D;
  float va[8], vb[8], ss = 0.0f;
  for (int e = 0; e < h / 32; e++) {
    va[e] = w[lane + 32 * e];
    vb[e] = w[lane + 32 * e + h];
    ss += va[e] * va[e] + vb[e] * vb[e];
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / (float)D + eps);
  const int pos = pos0 + t, cs = pos % S;
  const float p = (float)pos;
  for (int e = 0; e < h / 32; e++) {
    const int i = lane + 32 * e;
    if (kind == 2) {
      bf16 *dst = vc + ((size_t)gk * S + cs) * D;
      dst[i] = __float2bfloat16_rn(va[e] * r);
      dst[i + h] = __float2bfloat16_rn(vb[e] * r);
      continue;
    }
    const float *nw = kind == 0 ? qn : kn;
    const float x0 = (va[e] * r) * nw[i], x1 = (vb[e] * r) * nw[i + h];
    const float ang = invf[i] * p, c = cosf(ang), sn = sinf(ang);
    const float y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
    if (kind == 0) {
      float *qd = q + ((size_t)t * NH + hd) * D;
      qd[i] = y0;
      qd[i + h] = y1;
    } else {
      bf16 *kd = kc + ((size_t)gk * S + cs) * D;
      kd[i] = __float2bfloat16_rn(y0);
      kd[i + h] = __float2bfloat16_rn(y1);
    }
  }
}
static void lab_qkv_post(const float *qkv, int ld, int T, const dn_qkv &a) {
  const dim3 grid(T, a.NH + 2 * a.NKV);
#ifdef DG_CUDA_EMU
  DG_LAUNCH(lab_qkv_post_kernel, grid, 32, 0, 0)(qkv, ld, a.q, a.kc, a.vc, a.S, a.qn, a.kn, a.invf, a.NH, a.NKV, a.D, a.pos0, a.eps);
#else
  lab_qkv_post_kernel<<<grid, 32>>>(qkv, ld, a.q, a.kc, a.vc, a.S, a.qn, a.kn, a.invf, a.NH, a.NKV, a.D, a.pos0, a.eps);
#endif
  CKL(cudaGetLastError());
}

/* ---- host side ------------------------------------------------------------------------------------------------ */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545f4914f6cdd1dull; }
static float frand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static uint16_t f2b(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

struct shape {
  const char *name;
  int N, K;
  int per_pass; /* products of this shape per decoder pass of the 26B (30 layers: 25 sliding, 5 full) */
};
/* the gemm_lab's x W^T rows (dev/cuda/gemm_lab.cu) */
static const shape BIG[] = {
    {"qkv_s", 8192, 2816, 25}, /* q 16 x 256, k and v 8 x 256 */
    {"qkv_f", 9216, 2816, 5},  /* q 16 x 512, k 2 x 512 (v = k) */
    {"o_s", 2816, 4096, 25},   {"o_f", 2816, 8192, 5},
    {"mlp_gu", 4224, 2816, 31}, /* dense MLP gate|up (30 layers + the self-conditioning MLP) */
    {"mlp_d", 2816, 2112, 31},
};
/* emulation-sized: partial slabs, uneven splits, partial row passes */
static const shape SMALL[] = {{"small_a", 256, 512, 0}, {"small_b", 192, 640, 0}, {"small_c", 136, 384, 0},
                               {"small_q", 1024, 256, 0}}; /* small_q: q/k/v of 2 q heads, 1 KV head, D 256 */

#ifndef DG_CUDA_EMU
__global__ void flush_kernel(float4 *p, size_t n) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_float4((float)i, 0.f, 0.f, 0.f);
}
__global__ void read_kernel(const float4 *p, size_t n, float *out) {
  DG_PDL_ENTRY();
  float s = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = __ldcs(p + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 12345.678f) *out = s; /* keeps the loads */
}
static float4 *g_flush;
static size_t g_flush_n;
/* Median / min / max of R timed runs of op (ms), L2 flushed before each. */
/* How many words of a split-K version's fp32 workspace (nws floats) and per-slab arrival counters (ncnt ints) are not
 * zero after a launch: versions 5 and 6 leave both zero for the next launch (the last block of a slab clears them). */
static long left_nonzero(const float *dws, size_t nws, const int *dcnt, size_t ncnt) {
  std::vector<float> ws(nws);
  std::vector<int> cn(ncnt);
  CKL(cudaMemcpy(ws.data(), dws, nws * 4, cudaMemcpyDeviceToHost));
  CKL(cudaMemcpy(cn.data(), dcnt, ncnt * 4, cudaMemcpyDeviceToHost));
  long nz = 0;
  for (float e : ws) nz += e != 0.0f;
  for (int e : cn) nz += e != 0;
  return nz;
}
template <class Op> static void timeit(int R, Op op, float *med, float *lo, float *hi) {
  cudaEvent_t e0, e1;
  CKL(cudaEventCreate(&e0)); CKL(cudaEventCreate(&e1));
  std::vector<float> t(R);
  op(); CKL(cudaDeviceSynchronize()); /* warm-up */
  for (int r = 0; r < R; r++) {
    flush_kernel<<<1056, 256>>>(g_flush, g_flush_n);
    CKL(cudaEventRecord(e0, 0));
    op();
    CKL(cudaEventRecord(e1, 0));
    CKL(cudaEventSynchronize(e1));
    CKL(cudaEventElapsedTime(&t[r], e0, e1));
  }
  std::sort(t.begin(), t.end());
  *med = t[R / 2]; *lo = t[0]; *hi = t[R - 1];
  cudaEventDestroy(e0); cudaEventDestroy(e1);
}
#endif

/* The split for versions 1 and 2: the KS (1..8, at least 2 stages a split) that
 * minimises the critical path of one SM, waves x stages a block = ceil(slabs KS / SMs) ceil(nk / KS) (one block per
 * SM: the ring takes ~160-193 KiB of shared memory), the smaller KS on a tie (fewer atomics, a smaller memset share). */
static int auto_ks(int N, int K, int BN, int sms) {
  const int slabs = (N + BN - 1) / BN, nk = K / 64;
  int best = 1;
  long best_cost = -1;
  for (int ks = 1; ks <= 8 && ks <= (nk > 1 ? nk / 2 : 1); ks++) {
    const long cost = (long)((slabs * ks + sms - 1) / sms) * ((nk + ks - 1) / ks);
    if (best_cost < 0 || cost < best_cost) { best_cost = cost; best = ks; }
  }
  return best;
}

static cudaError_t run_version(int v, const dn_args &a0, int ks_override) {
  dn_args a = a0;
  const int WG4 = a.T > 128;
  switch (v) {
    case 1: case 3:
      if (v == 3) a.ks = 1; else if (ks_override > 0) a.ks = ks_override;
      return WG4 ? dn_launch<4, 4, 16>(0, a) : dn_launch<2, 4, 16>(0, a);
    case 2:
      if (ks_override > 0) a.ks = ks_override;
      return WG4 ? dn_launch<4, 5, 8>(0, a) : dn_launch<2, 5, 8>(0, a);
    case 4:
      if (ks_override > 0) a.ks = ks_override;
      return WG4 ? dn_launch<4, 4, 16, 4>(0, a) : dn_launch<2, 4, 16, 4>(0, a);
    case 5:
      if (ks_override > 0) a.ks = ks_override;
      return WG4 ? dn_launch<4, 4, 16, 4, 1>(0, a) : dn_launch<2, 4, 16, 4, 1>(0, a);
    case 6:
      if (ks_override > 0) a.ks = ks_override;
      return WG4 ? dn_launch<4, 4, 16, 4, 2>(0, a) : dn_launch<2, 4, 16, 4, 2>(0, a);
  }
  return cudaErrorInvalidValue;
}

int main(int argc, char **argv) {
  int R = 30, small = 0, nsamp = 4096, ks_override = 0;
  const char *only = NULL, *rows_s = "128,256,512", *vers = "0,1,2,3,4,5,6";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) R = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows_s = argv[++i];
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--versions") && i + 1 < argc) vers = argv[++i];
    else if (!strcmp(argv[i], "--samples") && i + 1 < argc) nsamp = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ks") && i + 1 < argc) ks_override = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--small")) small = 1;
    else {
      fprintf(stderr, "usage: dense_lab [--reps R] [--rows 128,256,512] [--shapes a,b] [--versions 0,1,2,3,4,5,6] [--samples S] "
                      "[--ks KS] [--small]\n");
      return 2;
    }
  }
  if (R < 1 || nsamp < 1) { fprintf(stderr, "dense_lab: --reps and --samples >= 1\n"); return 2; }
  std::vector<int> rows, vs;
  for (const char *p = rows_s; *p;) { rows.push_back(atoi(p)); const char *c = strchr(p, ','); if (!c) break; p = c + 1; }
  for (const char *p = vers; *p;) { vs.push_back(atoi(p)); const char *c = strchr(p, ','); if (!c) break; p = c + 1; }
  if (small) rows = {40, 96, 200, 300}; /* 300: two passes of 256 rows */
  for (int T : rows)
    if (T < 1 || T > 4096) { fprintf(stderr, "dense_lab: rows 1..4096\n"); return 2; }
  for (int v : vs)
    if (v < 0 || v > 6) { fprintf(stderr, "dense_lab: versions 0..6\n"); return 2; }
  cudaDeviceProp prop;
  CKL(cudaGetDeviceProperties(&prop, 0));
  const int sms = small ? 6 : prop.multiProcessorCount;
  cublasHandle_t h;
  CBL(cublasCreate(&h));
  float bw = 0.f, rate = 0.f;
#ifndef DG_CUDA_EMU
  if (!small) {
    g_flush_n = ((size_t)256 << 20) / 16;
    CKL(cudaMalloc(&g_flush, g_flush_n * 16));
    const size_t n = ((size_t)2 << 30) / 16;
    float4 *p; float *o;
    CKL(cudaMalloc(&p, n * 16)); CKL(cudaMalloc(&o, 4));
    CKL(cudaMemset(p, 0, n * 16));
    float med, lo, hi;
    timeit(5, [&] { read_kernel<<<prop.multiProcessorCount * 8, 512>>>(p, n, o); }, &med, &lo, &hi);
    bw = (float)(n * 16) / (lo * 1e-3f) / 1e9f;
    CKL(cudaFree(p)); CKL(cudaFree(o));
    const int G = 8192;
    bf16 *ga, *gb; float *gc;
    CKL(cudaMalloc(&ga, (size_t)G * G * 2)); CKL(cudaMalloc(&gb, (size_t)G * G * 2)); CKL(cudaMalloc(&gc, (size_t)G * G * 4));
    CKL(cudaMemset(ga, 0, (size_t)G * G * 2)); CKL(cudaMemset(gb, 0, (size_t)G * G * 2));
    const float one = 1.f, zero = 0.f;
    timeit(5, [&] { CBL(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, G, G, G, &one, ga, CUDA_R_16BF, G, gb, CUDA_R_16BF, G,
                                      &zero, gc, CUDA_R_32F, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); }, &med, &lo, &hi);
    rate = 2.0f * G * (float)G * G / (lo * 1e-3f) / 1e12f;
    CKL(cudaFree(ga)); CKL(cudaFree(gb)); CKL(cudaFree(gc));
  }
#endif
  printf("# dense_lab on %s (%d SMs)%s: read %.0f GB/s (streaming read of 2 GiB, best of 5), bf16 %.0f TFLOP/s "
         "(cublasGemmEx 8192^3, best of 5); medians of %d reps, L2 flushed before each; floor = max(bytes / read, "
         "FLOPs / bf16), bytes = W + x (bf16) + y (fp32)\n",
         prop.name, prop.multiProcessorCount, small ? " [--small: checks only]" : "", bw, rate, R);
  printf("| shape | T | N | K | version | KS | grid | ms | spread | floor ms | floor %% | TFLOP/s | GB/s | err/bound "
         "(ref) | diff/bound (cuBLAS) | check |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const double u = ldexp(1.0, -24);
  auto gam = [&](double n) { return n * u / (1 - n * u); };
  int bad_total = 0;
  std::vector<double> pass_ms(7, 0.0);
  std::vector<int> pass_have(7, 1);
  double pass_floor = 0;
  const shape *shapes = small ? SMALL : BIG;
  const int nshapes = small ? (int)(sizeof SMALL / sizeof SMALL[0]) : (int)(sizeof BIG / sizeof BIG[0]);
  for (int T : rows) {
    for (int si = 0; si < nshapes; si++) {
      const shape &sh = shapes[si];
      if (only && !strstr(only, sh.name)) continue;
      const int N = sh.N, K = sh.K;
      std::vector<uint16_t> hx((size_t)T * K), hw((size_t)N * K);
      for (auto &e : hx) e = f2b(frand());
      for (auto &e : hw) e = f2b(frand() * 0.0625f);
      bf16 *dx, *dw; float *dy0, *dy;
      CKL(cudaMalloc((void **)&dx, hx.size() * 2)); CKL(cudaMalloc((void **)&dw, hw.size() * 2));
      CKL(cudaMalloc((void **)&dy0, (size_t)T * N * 4)); CKL(cudaMalloc((void **)&dy, (size_t)T * N * 4));
      CKL(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      CKL(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
      const float one = 1.f, zero = 0.f;
      auto cublas = [&] { CBL(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, dw, CUDA_R_16BF, K, dx, CUDA_R_16BF, K,
                                           &zero, dy0, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); };
      CKL(cudaMemset(dy0, 0xff, (size_t)T * N * 4));
      cublas();
      CKL(cudaDeviceSynchronize());
      std::vector<float> ycb((size_t)T * N), ylab((size_t)T * N);
      CKL(cudaMemcpy(ycb.data(), dy0, ycb.size() * 4, cudaMemcpyDeviceToHost));
      /* the sampled outputs (all with --small) and their exact values and sum |x w| */
      std::vector<int> sr, sc;
      if (small) { for (int r = 0; r < T; r++) for (int c = 0; c < N; c++) { sr.push_back(r); sc.push_back(c); } }
      else { for (int i = 0; i < nsamp; i++) { sr.push_back((int)(rnd() % T)); sc.push_back((int)(rnd() % N)); } }
      const size_t ns = sr.size();
      std::vector<double> ex(ns), ab(ns);
#pragma omp parallel for
      for (long i = 0; i < (long)ns; i++) {
        double e = 0, aa = 0;
        const uint16_t *xr = &hx[(size_t)sr[i] * K], *wr = &hw[(size_t)sc[i] * K];
        for (int k = 0; k < K; k++) { const double p = (double)b2f(xr[k]) * b2f(wr[k]); e += p; aa += fabs(p); }
        ex[i] = e; ab[i] = aa;
      }
      const double flops = 2.0 * T * N * K, bytes = 2.0 * ((double)N * K + (double)T * K) + 4.0 * T * N;
      const double floor_ms = small ? 0 : fmax(bytes / (bw * 1e9), flops / (rate * 1e12)) * 1e3;
      if (T == 256) pass_floor += sh.per_pass * floor_ms;
      for (int v : vs) {
        if (v >= 5) continue; /* the GeGLU and q/k/v rows, below */
        const int BN = v == 2 ? 64 : 128;
        const int ks = v == 0 ? 0 : v == 3 ? 1 : ks_override > 0 ? ks_override : auto_ks(N, K, BN, sms);
        dn_args a = {dx, dw, dy, T, N, K, K, N, ks};
        auto op = [&] { if (v == 0) cublas(); else CKL(run_version(v, a, 0)); };
        float *dout = v == 0 ? dy0 : dy;
        /* twice, the second into NaN bytes, which is the one checked */
        op();
        CKL(cudaDeviceSynchronize());
        CKL(cudaMemset(dout, 0xff, (size_t)T * N * 4));
        op();
        CKL(cudaDeviceSynchronize());
        CKL(cudaMemcpy(ylab.data(), dout, ylab.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0, worst_cb = 0;
        long nbad = 0;
        const double gv = v == 0 ? gam(2.0 * (K + 64)) : gam(2.0 * (K + ks)), gcb = gam(2.0 * (K + 64));
        for (size_t i = 0; i < ns; i++) {
          const size_t o = (size_t)sr[i] * N + sc[i];
          const double b = gv * ab[i] + 1e-30, q = fabs(ylab[o] - ex[i]) / b;
          const double qc = fabs((double)ylab[o] - ycb[o]) / (b + gcb * ab[i]);
          if (!(q <= 1) || !(qc <= 1)) nbad++;
          if (!(q <= worst)) worst = q == q ? q : INFINITY;
          if (!(qc <= worst_cb)) worst_cb = qc == qc ? qc : INFINITY;
        }
        bad_total += nbad > 0;
        float med = 0, lo = 0, hi = 0;
#ifndef DG_CUDA_EMU
        if (!small) timeit(R, op, &med, &lo, &hi);
#endif
        char grid[48];
        if (v == 0) snprintf(grid, sizeof grid, "cuBLAS");
        else snprintf(grid, sizeof grid, "%dx%d, %d thr", (N + BN - 1) / BN, ks, T > 128 ? 512 : 256);
        if (T == 256) { if (med > 0) pass_ms[v] += sh.per_pass * med; else pass_have[v] = 0; }
        printf("| %s | %d | %d | %d | %d | %d | %s | %.4f | %.4f-%.4f | %.4f | %.1f | %.0f | %.0f | %.3f | %.3f | %s |\n",
               sh.name, T, N, K, v, ks, grid, med, lo, hi, floor_ms, med > 0 ? 100.0 * floor_ms / med : 0.0,
               med > 0 ? flops / (med * 1e9) : 0.0, med > 0 ? bytes / (med * 1e6) : 0.0, worst, worst_cb,
               nbad ? "FAIL" : "ok");
        if (nbad) printf("#   %s T %d version %d: %ld of %zu outputs past the bound\n", sh.name, T, v, nbad, ns);
      }
      const int I = N / 2;
      if (std::find(vs.begin(), vs.end(), 5) != vs.end() && (!strcmp(sh.name, "mlp_gu") || (small && I % 64 == 0))) {
        /* the gate|up product with its GeGLU: the backend's pair (cuBLAS into gu fp32, then geglu4) against version 5
         * (dn_kernel with the GeGLU epilogue over the slab-interleaved weights); h [T, I] bf16 */
        std::vector<uint16_t> hwp((size_t)N * K);
        for (int sl = 0; sl < I / 64; sl++)
          for (int c = 0; c < 128; c++)
            memcpy(&hwp[((size_t)sl * 128 + c) * K], &hw[(size_t)(c < 64 ? sl * 64 + c : I + sl * 64 + c - 64) * K], (size_t)K * 2);
        bf16 *dwp, *dh; float *dws; int *dcnt;
        const int slabs = N / 128;
        CKL(cudaMalloc((void **)&dwp, hwp.size() * 2)); CKL(cudaMalloc((void **)&dh, (size_t)T * I * 2));
        CKL(cudaMalloc((void **)&dws, (size_t)T * N * 4)); CKL(cudaMalloc((void **)&dcnt, (size_t)slabs * 16 * 4));
        CKL(cudaMemcpy(dwp, hwp.data(), hwp.size() * 2, cudaMemcpyHostToDevice));
        CKL(cudaMemset(dws, 0, (size_t)T * N * 4)); CKL(cudaMemset(dcnt, 0, (size_t)slabs * 16 * 4));
        /* samples (row, feature): exact gate and up, sum |x w| of each */
        std::vector<int> gr, gf;
        if (small) { for (int r = 0; r < T; r++) for (int f = 0; f < I; f++) { gr.push_back(r); gf.push_back(f); } }
        else { for (int i = 0; i < nsamp; i++) { gr.push_back((int)(rnd() % T)); gf.push_back((int)(rnd() % I)); } }
        const size_t gn = gr.size();
        std::vector<double> eg(gn), eu(gn), ag(gn), au(gn);
#pragma omp parallel for
        for (long i = 0; i < (long)gn; i++) {
          double e1 = 0, a1 = 0, e2 = 0, a2 = 0;
          const uint16_t *xr = &hx[(size_t)gr[i] * K], *w1 = &hw[(size_t)gf[i] * K], *w2 = &hw[(size_t)(I + gf[i]) * K];
          for (int k = 0; k < K; k++) {
            const double xv = b2f(xr[k]), p1 = xv * b2f(w1[k]), p2 = xv * b2f(w2[k]);
            e1 += p1; a1 += fabs(p1); e2 += p2; a2 += fabs(p2);
          }
          eg[i] = e1; ag[i] = a1; eu[i] = e2; au[i] = a2;
        }
        /* The bound of h against bf16(gelu(g) u) in exact arithmetic (g, u the exact sums): g~ = g + dg with |dg| <=
         * Bg = g(2 (K + 64)) sum |x w_g| (either path: KS <= 8), the same for u; gelu_tanh in fp32 at a~ within
         * Ef(a) = u32 |a| (8 + 2 k |a| + 2 k c |a|^3) of its exact value (the tanh argument's 4 roundings at up to
         * u32 each, tanhf within 2 ulp, the last 3 operations; k = sqrt(2/pi), c = 0.044715); gelu's slope is at most
         * 1.13 in magnitude, so |gelu(g~) - gelu(g)| <= 1.13 Bg; the product's rounding u32; then bf16's rounding,
         * 2^-8 relative: B = 2^-8 (|gelu(g) u| + E1) + E1, E1 = (1.13 Bg + Ef) (|u| + Bu) + |gelu(g)| Bu +
         * u32 (|gelu(g)| + 1.13 Bg + Ef) (|u| + Bu). */
        const double u32 = ldexp(1.0, -24), gk = 0.7978845608028654, gc = 0.044715, gb = gam(2.0 * (K + 64));
        auto gelu_d = [&](double x) { return 0.5 * x * (1.0 + tanh(gk * (x + gc * x * x * x))); };
        std::vector<double> hb(gn), hx_(gn);
        for (size_t i = 0; i < gn; i++) {
          const double Bg = gb * ag[i], Bu = gb * au[i], aa = fabs(eg[i]) + Bg;
          const double Ef = u32 * aa * (8 + 2 * gk * aa + 2 * gk * gc * aa * aa * aa), fg = gelu_d(eg[i]);
          const double E1 = (1.13 * Bg + Ef) * (fabs(eu[i]) + Bu) + fabs(fg) * Bu + u32 * (fabs(fg) + 1.13 * Bg + Ef) * (fabs(eu[i]) + Bu);
          hx_[i] = fg * eu[i];
          hb[i] = ldexp(1.0, -8) * (fabs(hx_[i]) + E1) + E1 + 1e-30;
        }
        std::vector<uint16_t> hpair((size_t)T * I), hfused((size_t)T * I);
        const int ks5 = ks_override > 0 ? ks_override : auto_ks(N, K, 128, sms);
        dn_args a5 = {dx, dwp, dws, T, N, K, K, N, ks5, dh, dcnt, I};
        auto pair = [&] { cublas(); lab_geglu(dy0, dh, T, I); };
        auto fused = [&] { CKL(run_version(5, a5, 0)); };
        const double gflops = flops, gbytes = 2.0 * ((double)N * K + (double)T * K + (double)T * I);
        const double gfloor = small ? 0 : fmax(gbytes / (bw * 1e9), gflops / (rate * 1e12)) * 1e3;
        for (int w = 0; w < 2; w++) {
          auto op = [&] { if (w == 0) pair(); else fused(); };
          op();
          CKL(cudaDeviceSynchronize());
          CKL(cudaMemset(dh, 0xff, (size_t)T * I * 2));
          op();
          CKL(cudaDeviceSynchronize());
          std::vector<uint16_t> &hh = w == 0 ? hpair : hfused;
          CKL(cudaMemcpy(hh.data(), dh, hh.size() * 2, cudaMemcpyDeviceToHost));
          double worst = 0, worst_p = 0;
          long nbad = 0;
          for (size_t i = 0; i < gn; i++) {
            const size_t o = (size_t)gr[i] * I + gf[i];
            const double q = fabs((double)b2f(hh[o]) - hx_[i]) / hb[i];
            const double qp = w == 0 ? 0 : fabs((double)b2f(hh[o]) - b2f(hpair[o])) / (2 * hb[i]);
            if (!(q <= 1) || !(qp <= 1)) nbad++;
            if (!(q <= worst)) worst = q == q ? q : INFINITY;
            if (!(qp <= worst_p)) worst_p = qp == qp ? qp : INFINITY;
          }
          const long nz = w == 1 ? left_nonzero(dws, (size_t)T * N, dcnt, (size_t)slabs * 16) : 0;
          if (nz) nbad++;
          bad_total += nbad > 0;
          float med = 0, lo = 0, hi = 0;
#ifndef DG_CUDA_EMU
          if (!small) timeit(R, op, &med, &lo, &hi);
#endif
          char grid[48];
          if (w == 0) snprintf(grid, sizeof grid, "cuBLAS + geglu4");
          else snprintf(grid, sizeof grid, "%dx%d, %d thr", slabs, ks5, T > 128 ? 512 : 256);
          printf("| %s+geglu | %d | %d | %d | %s | %d | %s | %.4f | %.4f-%.4f | %.4f | %.1f | %.0f | %.0f | %.3f | %.3f | %s |\n",
                 sh.name, T, N, K, w == 0 ? "0g" : "5", w == 0 ? 0 : ks5, grid, med, lo, hi, gfloor,
                 med > 0 ? 100.0 * gfloor / med : 0.0, med > 0 ? gflops / (med * 1e9) : 0.0,
                 med > 0 ? gbytes / (med * 1e6) : 0.0, worst, worst_p, nbad ? "FAIL" : "ok");
          if (nbad) printf("#   %s+geglu T %d %s: %ld of %zu outputs past the bound; %ld workspace words or counters not zero\n",
                           sh.name, T, w == 0 ? "pair" : "version 5", nbad, gn, nz);
        }
        CKL(cudaFree(dwp)); CKL(cudaFree(dh)); CKL(cudaFree(dws)); CKL(cudaFree(dcnt));
      }
      const int qNH = !strcmp(sh.name, "qkv_s") ? 16 : !strcmp(sh.name, "small_q") ? 2 : 0;
      if (std::find(vs.begin(), vs.end(), 6) != vs.end() && qNH) {
        /* the q/k/v product with its post-processing (sliding layer: q, k, v heads): the backend's pair (cuBLAS into
         * qkv fp32, then lab_qkv_post_kernel) against version 6 (the heads finished in the product's epilogue) */
        const int NH = qNH, NKV = NH / 2, NHD = NH + 2 * NKV, D = N / NHD, h = D / 2;
        const int S = small ? T + 16 : T + 1024, pos0 = small ? S - T / 2 : 1024; /* small: the ring wraps */
        std::vector<float> hqn(D), hkn(D), hinv(h);
        for (auto &e : hqn) e = 1.0f + 0.5f * frand();
        for (auto &e : hkn) e = 1.0f + 0.5f * frand();
        for (int i = 0; i < h; i++) hinv[i] = (float)pow(10000.0, -2.0 * i / D);
        float *dq, *dqn, *dkn, *dinv, *dws2; bf16 *dkc, *dvc; int *dcnt2;
        const size_t nq = (size_t)T * NH * D, nkv = (size_t)NKV * S * D;
        CKL(cudaMalloc((void **)&dq, nq * 4)); CKL(cudaMalloc((void **)&dkc, nkv * 2)); CKL(cudaMalloc((void **)&dvc, nkv * 2));
        CKL(cudaMalloc((void **)&dqn, D * 4)); CKL(cudaMalloc((void **)&dkn, D * 4)); CKL(cudaMalloc((void **)&dinv, h * 4));
        CKL(cudaMalloc((void **)&dws2, (size_t)T * N * 4)); CKL(cudaMalloc((void **)&dcnt2, (size_t)NHD * 16 * 4));
        CKL(cudaMemcpy(dqn, hqn.data(), D * 4, cudaMemcpyHostToDevice));
        CKL(cudaMemcpy(dkn, hkn.data(), D * 4, cudaMemcpyHostToDevice));
        CKL(cudaMemcpy(dinv, hinv.data(), h * 4, cudaMemcpyHostToDevice));
        CKL(cudaMemset(dws2, 0, (size_t)T * N * 4)); CKL(cudaMemset(dcnt2, 0, (size_t)NHD * 16 * 4));
        const int ks6 = ks_override > 0 ? ks_override : auto_ks(N, K, 128, sms);
        /* the shapes version 6 takes: D a multiple of 128 (whole slabs a head), 64 <= D / 2 <= 256 (1-8 pairs a lane) */
        if (D % 128 || D > 512 || N != NHD * D) { fprintf(stderr, "dense_lab: q/k/v shape N %d D %d not supported\n", N, D); return 1; }
        const dn_qkv hq = {dq, dkc, dvc, dqn, dkn, dinv, NH, NKV, D, S, pos0, 1e-6f};
        dn_qkv *dqp;
        CKL(cudaMalloc((void **)&dqp, sizeof hq));
        CKL(cudaMemcpy(dqp, &hq, sizeof hq, cudaMemcpyHostToDevice));
        dn_args a6 = {dx, dw, dws2, T, N, K, K, N, ks6, NULL, dcnt2, 0, dqp};
        /* samples (row, head): the exact raw sums of the head's D columns and their sum |x w| */
        std::vector<int> qr, qh;
        if (small) { for (int r = 0; r < T; r++) for (int c = 0; c < NHD; c++) { qr.push_back(r); qh.push_back(c); } }
        else { for (int i = 0; i < 192; i++) { qr.push_back((int)(rnd() % T)); qh.push_back((int)(rnd() % NHD)); } }
        const size_t qn_ = qr.size();
        std::vector<double> qs(qn_ * D), qa(qn_ * D);
#pragma omp parallel for
        for (long i = 0; i < (long)qn_; i++)
          for (int j = 0; j < D; j++) {
            double e = 0, aa = 0;
            const uint16_t *xr = &hx[(size_t)qr[i] * K], *wr = &hw[(size_t)(qh[i] * D + j) * K];
            for (int k = 0; k < K; k++) { const double pr = (double)b2f(xr[k]) * b2f(wr[k]); e += pr; aa += fabs(pr); }
            qs[i * D + j] = e; qa[i * D + j] = aa;
          }
        /* The reference and bound of each output (derived): raw s_j within B_j = g(2 (K + 64)) sum |x w| (either
         * path); the fp32 sum of squares within Ess = sum (2 |s| B + B^2) + g(2 D + 2) sum (|s| + B)^2; m = ss / D +
         * eps within Em = Ess / D + 2u (m + Ess / D); rsqrtf within 2 ulp (4u relative) and the slope of m^-1/2, so r
         * within Er = 0.5 (m - Em)^-1.5 Em + 4u (r + 0.5 (m - Em)^-1.5 Em); a normed, weighted element x = s r w
         * within Ex = |w| (B (r + Er) + |s| Er) + 2u |w| (|s| + B) (r + Er); the rope of the pair at the same fp32 angle
         * (cosf, sinf within 2 ulp: 4u absolute each; 3 roundings): E0 = Ex0 + Ex1 + 7u (|x0| + Ex0 + |x1| + Ex1);
         * q fp32: E0; k bf16: E0 + 2^-8 (|y| + E0); v = bf16(s r): B (r + Er) + |s| Er + u (|s| + B) (r + Er), then
         * the same 2^-8. u = 2^-24. */
        const double uu = ldexp(1.0, -24), gb = gam(2.0 * (K + 64)), gd = gam(2.0 * D + 2), b8 = ldexp(1.0, -8);
        std::vector<double> yref(qn_ * D), ybnd(qn_ * D);
        for (size_t i = 0; i < qn_; i++) {
          const double *sv = &qs[i * D], *av = &qa[i * D];
          double sq = 0, Ess = 0, sqb = 0;
          for (int j = 0; j < D; j++) {
            const double B = gb * av[j];
            sq += sv[j] * sv[j]; Ess += 2 * fabs(sv[j]) * B + B * B; sqb += (fabs(sv[j]) + B) * (fabs(sv[j]) + B);
          }
          Ess += gd * sqb;
          const double m = sq / D + 1e-6, Em = Ess / D + 2 * uu * (m + Ess / D), r = 1 / sqrt(m);
          const double dr = m > Em ? 0.5 * pow(m - Em, -1.5) * Em : INFINITY, Er = dr + 4 * uu * (r + dr);
          const int hd = qh[i], kind = hd < NH ? 0 : hd < NH + NKV ? 1 : 2, pos = pos0 + qr[i];
          for (int j = 0; j < h; j++) {
            const int jj[2] = {j, j + h};
            if (kind == 2) {
              for (int z = 0; z < 2; z++) {
                const double sj = sv[jj[z]], B = gb * av[jj[z]];
                const double E = B * (r + Er) + fabs(sj) * Er + uu * (fabs(sj) + B) * (r + Er), y = sj * r;
                yref[i * D + jj[z]] = y; ybnd[i * D + jj[z]] = E + b8 * (fabs(y) + E) + 1e-30;
              }
              continue;
            }
            const float *nw = kind == 0 ? hqn.data() : hkn.data();
            double x[2], Ex[2];
            for (int z = 0; z < 2; z++) {
              const double sj = sv[jj[z]], B = gb * av[jj[z]], wv = fabs((double)nw[jj[z]]);
              x[z] = sj * r * nw[jj[z]];
              Ex[z] = wv * (B * (r + Er) + fabs(sj) * Er) + 2 * uu * wv * (fabs(sj) + B) * (r + Er);
            }
            const float ang = hinv[j] * (float)pos; /* the device's fp32 angle */
            const double c = cos((double)ang), sn = sin((double)ang);
            const double E0 = Ex[0] + Ex[1] + 7 * uu * (fabs(x[0]) + Ex[0] + fabs(x[1]) + Ex[1]);
            const double y0 = x[0] * c - x[1] * sn, y1 = x[1] * c + x[0] * sn;
            yref[i * D + j] = y0; yref[i * D + j + h] = y1;
            ybnd[i * D + j] = (kind == 1 ? E0 + b8 * (fabs(y0) + E0) : E0) + 1e-30;
            ybnd[i * D + j + h] = (kind == 1 ? E0 + b8 * (fabs(y1) + E0) : E0) + 1e-30;
          }
        }
        auto pair = [&] { cublas(); lab_qkv_post(dy0, N, T, hq); };
        auto fused = [&] { CKL(run_version(6, a6, 0)); };
        const double qbytes = 2.0 * ((double)N * K + (double)T * K) + 4.0 * nq + 2.0 * 2 * T * NKV * D;
        const double qfloor = small ? 0 : fmax(qbytes / (bw * 1e9), flops / (rate * 1e12)) * 1e3;
        std::vector<float> gq0(nq), gq(nq);
        std::vector<uint16_t> gk0(nkv), gv0(nkv), gk(nkv), gv(nkv);
        for (int w = 0; w < 2; w++) {
          auto op = [&] { if (w == 0) pair(); else fused(); };
          op();
          CKL(cudaDeviceSynchronize());
          CKL(cudaMemset(dq, 0xff, nq * 4)); CKL(cudaMemset(dkc, 0xff, nkv * 2)); CKL(cudaMemset(dvc, 0xff, nkv * 2));
          op();
          CKL(cudaDeviceSynchronize());
          std::vector<float> &oq = w == 0 ? gq0 : gq;
          std::vector<uint16_t> &ok = w == 0 ? gk0 : gk, &ov = w == 0 ? gv0 : gv;
          CKL(cudaMemcpy(oq.data(), dq, nq * 4, cudaMemcpyDeviceToHost));
          CKL(cudaMemcpy(ok.data(), dkc, nkv * 2, cudaMemcpyDeviceToHost));
          CKL(cudaMemcpy(ov.data(), dvc, nkv * 2, cudaMemcpyDeviceToHost));
          double worst = 0, worst_p = 0;
          long nbad = 0;
          for (size_t i = 0; i < qn_; i++) {
            const int hd = qh[i], kind = hd < NH ? 0 : hd < NH + NKV ? 1 : 2, row = qr[i], cs = (pos0 + row) % S;
            const int gk_ = kind == 1 ? hd - NH : hd - NH - NKV;
            for (int j = 0; j < D; j++) {
              double got, other;
              if (kind == 0) { const size_t o = ((size_t)row * NH + hd) * D + j; got = oq[o]; other = gq0[o]; }
              else {
                const size_t o = ((size_t)gk_ * S + cs) * D + j;
                got = b2f(kind == 1 ? ok[o] : ov[o]); other = b2f(kind == 1 ? gk0[o] : gv0[o]);
              }
              const double q = fabs(got - yref[i * D + j]) / ybnd[i * D + j];
              const double qp = w == 0 ? 0 : fabs(got - other) / (2 * ybnd[i * D + j]);
              if (!(q <= 1) || !(qp <= 1)) nbad++;
              if (!(q <= worst)) worst = q == q ? q : INFINITY;
              if (!(qp <= worst_p)) worst_p = qp == qp ? qp : INFINITY;
            }
          }
          const long nz = w == 1 ? left_nonzero(dws2, (size_t)T * N, dcnt2, (size_t)NHD * 16) : 0;
          if (nz) nbad++;
          bad_total += nbad > 0;
          float med = 0, lo = 0, hi = 0;
#ifndef DG_CUDA_EMU
          if (!small) timeit(R, op, &med, &lo, &hi);
#endif
          char grid[48];
          if (w == 0) snprintf(grid, sizeof grid, "cuBLAS + qkv_post");
          else snprintf(grid, sizeof grid, "%dx%d, %d thr", N / 128, ks6, T > 128 ? 512 : 256);
          printf("| %s+post | %d | %d | %d | %s | %d | %s | %.4f | %.4f-%.4f | %.4f | %.1f | %.0f | %.0f | %.3f | %.3f | %s |\n",
                 sh.name, T, N, K, w == 0 ? "0q" : "6", w == 0 ? 0 : ks6, grid, med, lo, hi, qfloor,
                 med > 0 ? 100.0 * qfloor / med : 0.0, med > 0 ? flops / (med * 1e9) : 0.0,
                 med > 0 ? qbytes / (med * 1e6) : 0.0, worst, worst_p, nbad ? "FAIL" : "ok");
          if (nbad) printf("#   %s+post T %d %s: %ld outputs past the bound; %ld workspace words or counters not zero\n",
                           sh.name, T, w == 0 ? "pair" : "version 6", nbad, nz);
        }
        CKL(cudaFree(dq)); CKL(cudaFree(dkc)); CKL(cudaFree(dvc)); CKL(cudaFree(dqn)); CKL(cudaFree(dkn));
        CKL(cudaFree(dinv)); CKL(cudaFree(dws2)); CKL(cudaFree(dcnt2)); CKL(cudaFree(dqp));
      }
      CKL(cudaFree(dx)); CKL(cudaFree(dw)); CKL(cudaFree(dy0)); CKL(cudaFree(dy));
    }
  }
  if (!small) {
    printf("\nper decoder pass of the 26B at T 256 (the six shapes x their count per pass): floor %.3f ms", pass_floor);
    for (int v : vs)
      if (v < 5 && pass_have[v]) printf("; version %d %.3f ms", v, pass_ms[v]); /* (5: gate|up only) */
    printf("\n");
  }
  printf("# %s\n", bad_total ? "SOME CHECKS FAILED" : "all checks within their bounds");
  cublasDestroy(h);
  return bad_total ? 1 : 0;
}
