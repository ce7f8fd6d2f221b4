/* sc_prod.cuh: the self-conditioning product out[M, H] = alpha P[M, V] E[V, H] with a per-output accumulation order
 * that does not depend on M (issues 12 and 14, session 27 helper sk12; docs/cuda.md "Session 27 (helper sk12)").
 * Used by dev/cuda/sc_prod.cu (the lab) only: the backend ran it under DGEMMA_STACK_DENSE=1 or inv in session 27 and
 * stopped in session 28 (it lost to cublasLt's split-K-1 entry at 566 rows, 3.913 vs 1.917 ms on the H100; docs/cuda.md
 * "Session 27 (helper sk12)"), so the header moved here from src/cuda/.
 *
 * P bf16 row-major [M, V] (ld ldp: the softmax rows k_sc_probs / k_turbo_sc_probs write), E bf16 row-major [V, H]
 * (the tied embedding as stored), out fp32 row-major [M, H] (ld ldo). Requirements (sc_prod_fits): H % 128 == 0,
 * V % 8 == 0, ldp % 8 == 0, P and E 16-byte aligned (16-byte cp.async); M >= 1.
 *
 * The order (the invariant): the V / 64 stages of 64 vocabulary rows (the last zero-filled past V) are cut into
 * S = sc_prod_splits(V) runs, run s the stages [s n / S, (s + 1) n / S) (n = ceil(V / 64)): a function of V only.
 * Output (r, h)'s partial sum of run s is one fp32 accumulator of one lane, C += A B by mma.sync m16n8k16 (bf16 in,
 * fp32 accumulate: PTX ISA "mma.m16n8k16"), stage after stage in order and within a stage its 4 k16 steps in order,
 * starting from 0; then out(r, h) = alpha (((p_0 + p_1) + p_2) ... + p_{S-1}) by sc_reduce_kernel. Row r sits at
 * column r % 8 of its n8 tile and h at row h % 16 of its m16 tile in every tiling below, so even the tensor core's
 * internal order per element is the same at every M; the token tile BM (16..128 rows a block) and the chunking of M
 * (the workspace's rows) change only which block computes row r, not the arithmetic. So row r's words are the same
 * for every M >= r + 1 and every BM (the lab's "rows differing" and "all words equal to version 1's"; session 27's
 * test_sc_prod, removed with the backend's use in session 28, checked the same on the GPU and the emulation).
 *
 * sc_prod_kernel<BM>: grid (ceil(M / BM), H / 128, S), 256 threads (8 warps); block (i, j, s) the tokens i BM..,
 * the 128 columns 128 j.. of E and run s of the stages. Each block streams its [run x 128] slab of E once for all
 * its BM tokens; blocks of the same (j, s) for other token tiles are adjacent in launch order (x fastest), so at
 * M > BM they share the slab through L2 and E is read from HBM about once per call. Stage = E's 64 x 128 (16 KiB,
 * rows of 256 bytes, 16-byte chunk c of row v at c ^ (v % 8)) and P's BM x 64 (rows of 128 bytes, chunk c of row t at
 * c ^ (t % 8)): conflict-free ldmatrix. A ring of ST slots by cp.async (ST - 1 stages in flight: ST 4, and 3 for BM 128
 * so that two blocks fit an SM; ST changes the timing only, never the order); tokens past M and
 * vocabulary rows past V are zero-filled (cp.async with 0 source bytes), never stored. Warps: WM = 1 (BM 16) or 2
 * token groups x WH = 8 / WM column groups; a warp's tile 128 / WH columns (MA m16 tiles: A = E^T by
 * ldmatrix.x4.trans) x BM / WM tokens (NT n8 tiles: B = P^T by ldmatrix.x4). Partial sums go to ws [S, mc, H]
 * (fp32, run-major; mc the workspace's rows), then sc_reduce_kernel. */
#ifndef DG_CUDA_SC_PROD_CUH
#define DG_CUDA_SC_PROD_CUH

#include "cuda/mma.cuh"

enum { SC_BH = 128, SC_BK = 64, SC_THREADS = 256 };

/* The run count S: a function of V only (never of M). 12 runs x 22 column slabs of the 26B (H 2816) = 264 blocks,
 * two per SM of an H100/H200 (132 SMs) at BM <= 64; at least 1 stage a run for small vocabularies. */
static inline int sc_prod_splits(int V) {
  const int n = (V + SC_BK - 1) / SC_BK;
  return n < 12 ? n : 12;
}
/* Shared memory of a block: st slots of E's 64 x 128 and P's bm x 64 bf16 (st 4: 72, 80, 96, 128 KiB for bm 16, 32,
 * 64, 128; st 3 at bm 128: 96 KiB). */
static inline size_t sc_prod_smem(int bm, int st) { return (size_t)st * (SC_BK * SC_BH + bm * SC_BK) * 2; }
static inline bool sc_prod_fits(int V, int H, int ldp, const void *P, const void *E) {
  return V >= 8 && H >= SC_BH && H % SC_BH == 0 && V % 8 == 0 && ldp % 8 == 0 && ((uintptr_t)P & 15) == 0 &&
         ((uintptr_t)E & 15) == 0;
}

template <int BM, int SC_ST>
__global__ void __launch_bounds__(SC_THREADS) sc_prod_kernel(const bf16 *__restrict__ P, int ldp,
                                                              const bf16 *__restrict__ E, int V, int H, int M, int S,
                                                              float *__restrict__ ws, int mc) {
  DG_PDL_ENTRY();
  constexpr int WM = BM >= 32 ? 2 : 1, WH = 8 / WM, HW = SC_BH / WH, MA = HW / 16, TW = BM / WM, NT = TW / 8,
                NB = TW / 16;
  static_assert(TW % 16 == 0 && HW % 16 == 0, "sc_prod_kernel: tile");
  DG_DYN_SMEM16(smem);
  bf16 *sE = (bf16 *)smem;                               /* [SC_ST][64][128] */
  bf16 *sP = (bf16 *)(smem + SC_ST * SC_BK * SC_BH * 2); /* [SC_ST][BM][64] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wh = warp % WH, wm = warp / WH;
  const int t0 = blockIdx.x * BM, h0 = blockIdx.y * SC_BH, s = blockIdx.z;
  const int nst = (V + SC_BK - 1) / SC_BK;
  const int k0 = (int)((long long)s * nst / S), k1 = (int)((long long)(s + 1) * nst / S), ns = k1 - k0;

  auto load = [&](int st, int slot) {
    const int v0 = (k0 + st) * SC_BK;
    bf16 *e = sE + slot * SC_BK * SC_BH;
    for (int i = tid; i < SC_BK * 16; i += SC_THREADS) { /* E: 64 rows x 16 chunks */
      const int r = i >> 4, c = i & 15, v = v0 + r;
      const bf16 *src = v < V ? E + (size_t)v * H + h0 + c * 8 : E;
      dg_cp_async16(e + r * SC_BH + ((c ^ (r & 7)) * 8), src, v < V ? 16 : 0);
    }
    bf16 *p = sP + slot * BM * SC_BK;
    for (int i = tid; i < BM * 8; i += SC_THREADS) { /* P: BM rows x 8 chunks */
      const int r = i >> 3, c = i & 7, t = t0 + r, v = v0 + c * 8;
      const bool ok = t < M && v < V;
      dg_cp_async16(p + r * SC_BK + ((c ^ (r & 7)) * 8), ok ? P + (size_t)t * ldp + v : P, ok ? 16 : 0);
    }
  };

  float acc[MA][NT][4];
#pragma unroll
  for (int a = 0; a < MA; a++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[a][n][i] = 0.0f;

#pragma unroll
  for (int i = 0; i < SC_ST - 1; i++) {
    if (i < ns) load(i, i);
    dg_cp_commit();
  }
  const int lm = lane >> 3, li = lane & 7; /* ldmatrix: lane 8 m + i gives row i of matrix m */
  for (int st = 0; st < ns; st++) {
    dg_cp_wait<SC_ST - 2>();
    __syncthreads(); /* stage st landed for all; slot (st - 1) % SC_ST read by everyone */
    if (st + SC_ST - 1 < ns) load(st + SC_ST - 1, (st + SC_ST - 1) % SC_ST);
    dg_cp_commit();
    const bf16 *e = sE + (st % SC_ST) * SC_BK * SC_BH, *p = sP + (st % SC_ST) * BM * SC_BK;
#pragma unroll
    for (int kk = 0; kk < SC_BK / 16; kk++) {
      uint32_t a[MA][4], b[NB][4];
#pragma unroll
      for (int ma = 0; ma < MA; ma++) { /* A = E^T [16 h x 16 v]: matrices (h +0, v +0), (+8, +0), (+0, +8), (+8, +8) */
        const int r = kk * 16 + (lm >> 1) * 8 + li, c = (wh * HW + ma * 16 + (lm & 1) * 8) >> 3;
        dg_ldsm_x4_t(a[ma], e + r * SC_BH + ((c ^ (r & 7)) * 8));
      }
#pragma unroll
      for (int nb = 0; nb < NB; nb++) { /* B = P^T [16 v x 16 t]: (t +0, v +0), (+0, +8), (+8, +0), (+8, +8) */
        const int r = wm * TW + nb * 16 + (lm >> 1) * 8 + li, c = kk * 2 + (lm & 1);
        dg_ldsm_x4(b[nb], p + r * SC_BK + ((c ^ (r & 7)) * 8));
      }
#pragma unroll
      for (int ma = 0; ma < MA; ma++)
#pragma unroll
        for (int n = 0; n < NT; n++) {
          const uint32_t bb[2] = {b[n >> 1][2 * (n & 1)], b[n >> 1][2 * (n & 1) + 1]};
          dg_mma_bf16(acc[ma][n], a[ma], bb);
        }
    }
  }
  dg_cp_wait<0>();
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int ma = 0; ma < MA; ma++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int h = h0 + wh * HW + ma * 16 + g + 8 * (i >> 1), t = t0 + wm * TW + n * 8 + 2 * tq + (i & 1);
        if (t < M) ws[((size_t)s * mc + t) * H + h] = acc[ma][n][i];
      }
}

/* out[t, h] = alpha (((ws[0, t, h] + ws[1, t, h]) + ...) + ws[S - 1, t, h]), runs in order; H % 4 == 0. */
__global__ void sc_reduce_kernel(const float *__restrict__ ws, int mc, int S, int M, int H, float alpha,
                                 float *__restrict__ out, int ldo) {
  DG_PDL_ENTRY();
  const int H4 = H >> 2;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)M * H4;
       i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / H4), h = (int)(i % H4) * 4;
    float4 a = *(const float4 *)(ws + (size_t)t * H + h);
    for (int s = 1; s < S; s++) {
      const float4 b = *(const float4 *)(ws + ((size_t)s * mc + t) * H + h);
      a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
    }
    float *o = out + (size_t)t * ldo + h;
    o[0] = alpha * a.x; o[1] = alpha * a.y; o[2] = alpha * a.z; o[3] = alpha * a.w;
  }
}

/* The token tile of M rows: 16, 32, 64 up to 64 rows; above, 64 or 128, the one with fewer padded rows (128 on a
 * tie). Any choice gives the same words (file comment); this one only saves tensor-core work. */
static inline int sc_prod_bm(int M) {
  if (M <= 16) return 16;
  if (M <= 32) return 32;
  if (M <= 64) return 64;
  return (M + 127) / 128 * 128 <= (M + 63) / 64 * 64 ? 128 : 64;
}

/* The product on stream st: out[M, H] (ld ldo) = alpha P[M, V] (ld ldp) E[V, H], in ceil(M / mc) equal chunks of at
 * most mc rows (each chunk reads E once more) through ws (fp32, at least sc_prod_splits(V) * mc * H words). bm 0:
 * sc_prod_bm per chunk; else 16, 32, 64 or 128 (the lab's forced tile). Returns the launch error
 * (cudaGetLastError), cudaErrorInvalidValue where the shape does not fit (sc_prod_fits) or bm is none of those. */
static inline cudaError_t sc_prod_run(cudaStream_t st, const bf16 *P, int ldp, const bf16 *E, int V, int H, int M,
                                      float alpha, float *out, int ldo, float *ws, int mc, int bm) {
  if (M <= 0) return cudaSuccess;
  if (!sc_prod_fits(V, H, ldp, P, E) || mc < 1 || ldo < H ||
      (bm && bm != 16 && bm != 32 && bm != 64 && bm != 128 && bm != -128))
    return cudaErrorInvalidValue;
  static int sm_set = 0; /* the shared-memory limits, raised once for every instantiation: a one-time call that must
                          * not happen during a capture (src/cuda/graph.cu), whichever tile a captured pass takes */
  if (!sm_set) {
#define SC_A(B_, ST_)                                                                                             \
  cudaFuncSetAttribute(sc_prod_kernel<B_, ST_>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sc_prod_smem(B_, ST_))
    const cudaError_t e[5] = {SC_A(16, 4), SC_A(32, 4), SC_A(64, 4), SC_A(128, 3), SC_A(128, 4)};
#undef SC_A
    for (int i = 0; i < 5; i++)
      if (e[i] != cudaSuccess) return e[i];
    sm_set = 1;
  }
  const int S = sc_prod_splits(V);
  const int nch = (M + mc - 1) / mc, ch = (M + nch - 1) / nch; /* equal chunks of at most mc rows */
  for (int r0 = 0; r0 < M; r0 += ch) {
    const int m = M - r0 < ch ? M - r0 : ch, b = bm < 0 ? -bm : bm ? bm : sc_prod_bm(m);
    const bf16 *p = P + (size_t)r0 * ldp;
    const dim3 grid((m + b - 1) / b, H / SC_BH, S);
    const size_t sm = sc_prod_smem(b, b == 128 && bm >= 0 ? 3 : 4);
#define SC_L(B_, ST_) DG_LAUNCH((sc_prod_kernel<B_, ST_>), grid, SC_THREADS, sm, st)(p, ldp, E, V, H, m, S, ws, mc)
    if (b == 16) SC_L(16, 4);
    else if (b == 32) SC_L(32, 4);
    else if (b == 64) SC_L(64, 4);
    else if (bm >= 0) SC_L(128, 3);
    else SC_L(128, 4);
#undef SC_L
    const long long n4 = (long long)m * (H / 4);
    const int nb = (int)((n4 + 255) / 256 < 2048 ? (n4 + 255) / 256 : 2048);
    DG_LAUNCH(sc_reduce_kernel, nb, 256, 0, st)(ws, mc, S, m, H, alpha, out + (size_t)r0 * ldo, ldo);
  }
  return cudaGetLastError();
}

#endif
