/* turbo.cu: kernels of the turbo engine on the device (spec 7, after mlx-vlm
 * PR #1384; the host engine is src/sample/turbo.c, the CUDA host side turbo_host.cu):
 * row gather/scatter for the compacted decoder (7.4), the hierarchical exact
 * top-K (7.3) and the self-conditioning signals of the active rows (5, 7.3).
 *
 * The top-K order is total and the one of dg_topk_hier (src/sample/turbo.c): a
 * precedes b iff x[a] > x[b], or x[a] == x[b] and a < b. Every row must be
 * finite (the turbo chain's finite_only): a NaN or an infinity is reported
 * with its row and its first column, and the row's results are not written. */
#include <float.h>
#include <math.h>

#include "cuda/host.cuh"

#define TB_CHUNK 64 /* = DG_TOPK_CHUNK (src/sample/turbo.h): elements per chunk */
#ifdef DG_CUDA_EMU
#define TK_NT 64 /* two warps: the cross-warp reduction is exercised, the emulation stays fast */
#define TK_SORT 256 /* below the test models' candidate counts at K >= 5: both of topk_row's ways run there */
#define TK_CW 4     /* chunks a warp loads at once (topk_row) */
#else
#define TK_NT 256
#define TK_SORT 4096 /* the 26B's 4,096 chunks and, at K = 64, its 4,096 candidates: 32 KB of shared memory */
#define TK_CW 8      /* chunks a warp loads at once (topk_row): 16 loads in flight */
#endif

/* ---- row gather / scatter -------------------------------------------------- */

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int H) {
  DG_PDL_ENTRY();
  const int r = blockIdx.x;
  const float *s = src + (size_t)rows[r] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) dst[(size_t)r * H + j] = s[j];
}

cudaError_t k_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int H) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(gather_rows_kernel, n, 256, 0, s)(dst, src, rows, H);
  return cudaGetLastError();
}

__global__ void scatter_rows_kernel(float *dst, const float *src, const int32_t *rows, int H) {
  DG_PDL_ENTRY();
  const int r = blockIdx.x;
  float *d = dst + (size_t)rows[r] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) d[j] = src[(size_t)r * H + j];
}

cudaError_t k_scatter_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int H) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(scatter_rows_kernel, n, 256, 0, s)(dst, src, rows, H);
  return cudaGetLastError();
}

/* ---- hierarchical exact top-K (spec 7.3) ----------------------------------- */

static __device__ __forceinline__ bool tk_before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

/* The best (v, i) of the block under tk_before; every thread gets it. The
 * empty element is (-inf, INT32_MAX): any finite element precedes it. */
static __device__ void tk_block_best(float &v, int &i, float *shv, int *shi) {
  for (int o = 16; o; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (tk_before(ov, oi, v, i)) { v = ov; i = oi; }
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads(); /* shv/shi may still be read by the previous call */
  if (l == 0) { shv[w] = v; shi[w] = i; }
  __syncthreads();
  if (w == 0) {
    v = l < nw ? shv[l] : -INFINITY;
    i = l < nw ? shi[l] : INT32_MAX;
    for (int o = 16; o; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, v, o);
      int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (tk_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if (l == 0) { shv[0] = v; shi[0] = i; }
  }
  __syncthreads();
  v = shv[0];
  i = shi[0];
}

/* Sort the n2 pairs (sv, si) in shared memory (n2 a power of two) so that each precedes the next under tk_before:
 * a bitonic network, every thread of the block taking part (pads (-inf, INT32_MAX) go last). */
static __device__ void tk_sort(float *sv, int *si, int n2) {
  for (int k = 2; k <= n2; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const int p = i ^ j;
        if (p <= i) continue;
        const float a = sv[i], b = sv[p];
        const int ia = si[i], ib = si[p];
        if ((i & k) == 0 ? tk_before(b, ib, a, ia) : tk_before(a, ia, b, ib)) {
          sv[i] = b;
          sv[p] = a;
          si[i] = ib;
          si[p] = ia;
        }
      }
      __syncthreads();
    }
}

/* Row r of raw [n, V] (x = its row; cvr/cir [nC], cdv/cdi [min(K, nC) * 64], valr/idxr [K] its rows of the
 * buffers), one block:
 *   1. chunk maxima over chunks of 64 (the first maximal element represents
 *      its chunk) into cv/ci [nC], checking that the row is finite;
 *   2. the nsel = min(K, nC) best chunks (all chunk maxima sorted in shared memory,
 *      tk_sort, where they fit TK_SORT; else one block-wide selection per rank),
 *      their elements copied to the candidates candv/candi [nsel * 64]
 *      (a short last chunk padded with empty elements);
 *   3. the K best candidates (sorted likewise, else one selection per rank), into val/idx [K].
 * Equal to the first K of a full sort under the order (the K best elements
 * lie in the K best chunks); the order is total, so every way of finding them gives
 * the same words. bad[0]: the first non-finite row (atomicMin, INT32_MAX if none),
 * bad[1 + r]: its first non-finite column. ssv/ssi: TK_SORT pairs of shared memory. */
static __device__ void topk_row(const float *x, int V, int K, float *cvr, int32_t *cir, float *cdv, int32_t *cdi,
                                float *valr, int32_t *idxr, int32_t *bad, int r, float *shv, int *shi, int *shbad,
                                float *ssv, int *ssi) {
  const int tid = threadIdx.x;
  const int nC = (V + TB_CHUNK - 1) / TB_CHUNK, nsel = min(K, nC), ncand = nsel * TB_CHUNK;
  if (tid == 0) *shbad = INT32_MAX;
  __syncthreads();
  /* 1. one warp a chunk, TK_CW chunks a warp at a time (their 2 TK_CW loads issued first: one block a row, so the
   * loads in flight decide the pace): lane l holds columns lo + l and lo + 32 + l, the warp's best under tk_before
   * is the chunk's first maximal element (ties to the lower id); a non-finite column anywhere in the row reaches
   * shbad's minimum as the sequential scan's first one did */
  const int lane = tid & 31, nw = blockDim.x >> 5;
  for (int c0 = (tid >> 5) * TK_CW; c0 < nC; c0 += nw * TK_CW) {
    float f[2 * TK_CW];
#pragma unroll
    for (int u = 0; u < TK_CW; u++) {
      const int v0 = (c0 + u) * TB_CHUNK + lane, v1 = v0 + 32;
      f[2 * u] = v0 < V ? x[v0] : -INFINITY;
      f[2 * u + 1] = v1 < V ? x[v1] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < TK_CW; u++) {
      const int c = c0 + u, v0 = c * TB_CHUNK + lane, v1 = v0 + 32;
      if (c >= nC) break; /* (uniform over the warp) */
      if (v0 < V && !isfinite(f[2 * u])) atomicMin(shbad, v0);
      if (v1 < V && !isfinite(f[2 * u + 1])) atomicMin(shbad, v1);
      float bv = f[2 * u];
      int bi = v0 < V ? v0 : INT32_MAX;
      if (v1 < V && f[2 * u + 1] > bv) { bv = f[2 * u + 1]; bi = v1; }
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (tk_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
      }
      if (lane == 0) {
        cvr[c] = bv;
        cir[c] = bi;
      }
    }
  }
  __syncthreads();
  if (*shbad != INT32_MAX) {
    if (tid == 0) {
      bad[1 + r] = *shbad;
      atomicMin(bad, r);
    }
    return;
  }
  int n2 = 1, m2 = 1;
  while (n2 < nC) n2 <<= 1;
  while (m2 < ncand) m2 <<= 1;
  if (n2 <= TK_SORT) { /* 2. sorted: the first nsel are the best chunks */
    for (int i = tid; i < n2; i += blockDim.x) {
      ssv[i] = i < nC ? cvr[i] : -INFINITY;
      ssi[i] = i < nC ? cir[i] : INT32_MAX;
    }
    __syncthreads();
    tk_sort(ssv, ssi, n2);
    for (int e = tid; e < ncand; e += blockDim.x) {
      const int v = ssi[e / TB_CHUNK] / TB_CHUNK * TB_CHUNK + e % TB_CHUNK;
      cdv[e] = v < V ? x[v] : -INFINITY;
      cdi[e] = v < V ? v : INT32_MAX;
    }
    __syncthreads();
  }
  for (int s = 0; n2 > TK_SORT && s < nsel; s++) {
    float bv = -INFINITY;
    int bi = INT32_MAX;
    for (int c = tid; c < nC; c += blockDim.x)
      if (tk_before(cvr[c], cir[c], bv, bi)) { bv = cvr[c]; bi = cir[c]; }
    tk_block_best(bv, bi, shv, shi);
    const int ch = bi / TB_CHUNK;
    for (int j = tid; j < TB_CHUNK; j += blockDim.x) {
      const int v = ch * TB_CHUNK + j;
      cdv[s * TB_CHUNK + j] = v < V ? x[v] : -INFINITY;
      cdi[s * TB_CHUNK + j] = v < V ? v : INT32_MAX;
    }
    if (tid == 0) { cvr[ch] = -INFINITY; cir[ch] = INT32_MAX; } /* taken */
    __syncthreads();
  }
  if (m2 <= TK_SORT) { /* 3. sorted: the first K */
    for (int i = tid; i < m2; i += blockDim.x) {
      ssv[i] = i < ncand ? cdv[i] : -INFINITY;
      ssi[i] = i < ncand ? cdi[i] : INT32_MAX;
    }
    __syncthreads();
    tk_sort(ssv, ssi, m2);
    for (int k = tid; k < K; k += blockDim.x) {
      valr[k] = ssv[k];
      idxr[k] = ssi[k];
    }
    return;
  }
  for (int k = 0; k < K; k++) {
    float bv = -INFINITY;
    int bi = INT32_MAX, bp = -1;
    for (int j = tid; j < ncand; j += blockDim.x)
      if (tk_before(cdv[j], cdi[j], bv, bi)) { bv = cdv[j]; bi = cdi[j]; bp = j; }
    const int mine = bi;
    tk_block_best(bv, bi, shv, shi);
    if (bp >= 0 && mine == bi) { cdv[bp] = -INFINITY; cdi[bp] = INT32_MAX; } /* ids are unique: one owner */
    if (tid == 0) {
      valr[k] = bv;
      idxr[k] = bi;
    }
    __syncthreads();
  }
}

/* One block per row r of raw [n, V] (topk_row). */
__global__ void __launch_bounds__(TK_NT) topk_hier_kernel(const float *raw, int V, int K, float *cv, int32_t *ci,
                                                          float *candv, int32_t *candi, float *val, int32_t *idx,
                                                          int32_t *bad) {
  DG_PDL_ENTRY();
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ int shbad;
  __shared__ float ssv[TK_SORT];
  __shared__ int ssi[TK_SORT];
  const int r = blockIdx.x;
  const int nC = (V + TB_CHUNK - 1) / TB_CHUNK, ncand = min(K, nC) * TB_CHUNK;
  topk_row(raw + (size_t)r * V, V, K, cv + (size_t)r * nC, ci + (size_t)r * nC, candv + (size_t)r * ncand,
           candi + (size_t)r * ncand, val + (size_t)r * K, idx + (size_t)r * K, bad, r, shv, shi, &shbad, ssv, ssi);
}

/* Row g of a table's rows (the canvases' rows one after another): its canvas b and row r within it. The loop over
 * the table's fixed size keeps every index a constant (no copy of the parameters to local memory). */
static __device__ __forceinline__ int tab_canvas(const int32_t *row0, int B, int g, int *r) {
  int b = 0;
#pragma unroll
  for (int i = 1; i < DG_TB_TAB; i++)
    if (i < B && g >= row0[i]) b = i;
  int base = 0;
#pragma unroll
  for (int i = 0; i < DG_TB_TAB; i++)
    if (i == b) base = row0[i];
  *r = g - base;
  return b;
}

template <typename S> static __device__ __forceinline__ S tab_pick(const S *s, int b) {
  S o = s[0];
#pragma unroll
  for (int i = 1; i < DG_TB_TAB; i++)
    if (i == b) o = s[i];
  return o;
}

/* One block per row of the table's canvases: topk_row with each canvas's own buffers and K. */
__global__ void __launch_bounds__(TK_NT) topk_tab_kernel(const dg_tk_tab t, int V) {
  DG_PDL_ENTRY();
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ int shbad;
  __shared__ float ssv[TK_SORT];
  __shared__ int ssi[TK_SORT];
  int r;
  const int b = tab_canvas(t.row0, t.B, blockIdx.x, &r);
  const dg_tk_seg s = tab_pick(t.s, b);
  const int nC = (V + TB_CHUNK - 1) / TB_CHUNK, ncand = min(s.K, nC) * TB_CHUNK;
  topk_row(s.raw + (size_t)r * V, V, s.K, s.cv + (size_t)r * nC, s.ci + (size_t)r * nC, s.candv + (size_t)r * ncand,
           s.candi + (size_t)r * ncand, s.val + (size_t)r * s.K, s.idx + (size_t)r * s.K, s.bad, r, shv, shi, &shbad,
           ssv, ssi);
}

cudaError_t k_topk_tab(cudaStream_t s, const dg_tk_tab *t, int V) {
  if (t->B < 1 || t->B > DG_TB_TAB) return cudaErrorInvalidValue;
  const int R = t->row0[t->B];
  if (R <= 0) return cudaSuccess;
  DG_LAUNCH(topk_tab_kernel, R, TK_NT, 0, s)(*t, V);
  return cudaGetLastError();
}

cudaError_t k_topk_hier(cudaStream_t s, const float *raw, int n, int V, int K, float *cv, int32_t *ci, float *candv,
                        int32_t *candi, float *val, int32_t *idx, int32_t *bad) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(topk_hier_kernel, n, TK_NT, 0, s)(raw, V, K, cv, ci, candv, candi, val, idx, bad);
  return cudaGetLastError();
}

/* ---- self-conditioning of the active rows (spec 5, 4.9, 7.3) --------------- */

static __device__ __forceinline__ float tb_round_act(float x, int act) {
  if (act == DG_CUDA_BF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (act == DG_CUDA_F16) return __half2float(__float2half_rn(x));
  return x;
}

static __device__ __forceinline__ float tb_z(float raw, float cap, float T) {
  return (cap > 0.0f ? tanhf(raw / cap) * cap : raw) / T;
}

/* One block per row: z = softcap(raw)/T as src/sample/turbo.c's exact mode, then
 * P = cast(softmax(cast(z))) as dg_soft_row (max and sum over the row,
 * the sum of the fp32 exponentials in double), stored as bf16 for the product. */
__global__ void turbo_sc_probs_kernel(const float *raw, bf16 *P, int V, float cap, float T, int act, double *sum_out) {
  DG_PDL_ENTRY();
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int r = blockIdx.x, tid = threadIdx.x, w = tid >> 5, l = tid & 31, nw = blockDim.x >> 5;
  const float *x = raw + (size_t)r * V;
  float mx = -FLT_MAX;
  for (int v = tid; v < V; v += blockDim.x) mx = fmaxf(mx, tb_round_act(tb_z(x[v], cap, T), act));
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (l == 0) shf[w] = mx;
  __syncthreads();
  if (w == 0) {
    float mm = l < nw ? shf[l] : -FLT_MAX;
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (l == 0) shf[0] = mm;
  }
  __syncthreads();
  mx = shf[0];
  double sum = 0.0;
  for (int v = tid; v < V; v += blockDim.x) sum += (double)expf(tb_round_act(tb_z(x[v], cap, T), act) - mx);
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (l == 0) shd[w] = sum;
  __syncthreads();
  if (w == 0) {
    double ss = l < nw ? shd[l] : 0.0;
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (l == 0) shd[0] = ss;
  }
  __syncthreads();
  if (sum_out && tid == 0) sum_out[r] = shd[0];
  const float inv = (float)(1.0 / shd[0]);
  for (int v = tid; v < V; v += blockDim.x)
    P[(size_t)r * V + v] =
        __float2bfloat16_rn(tb_round_act(expf(tb_round_act(tb_z(x[v], cap, T), act) - mx) * inv, act));
}

cudaError_t k_turbo_sc_probs(cudaStream_t s, const float *raw, bf16 *P, int n, int V, float cap, float T, int act) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(turbo_sc_probs_kernel, n, 512, 0, s)(raw, P, V, cap, T, act, (double *)NULL);
  return cudaGetLastError();
}

cudaError_t k_turbo_sc_probs_sum(cudaStream_t s, const float *raw, bf16 *P, int n, int V, float cap, float T, int act,
                                 double *sum) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(turbo_sc_probs_kernel, n, 512, 0, s)(raw, P, V, cap, T, act, sum);
  return cudaGetLastError();
}

/* The same words from three launches over a table of canvases (k_turbo_sc_probs_tab), without the one block per
 * row: turbo_sc_probs_kernel's sum fixes the order of its additions (thread t of SCP_NT sums columns t, t + SCP_NT,
 * ... in double in that order; the warps' butterflies; warp 0's butterfly over the SCP_NW warp sums), which
 * scp_sum_kernel repeats with one 32-thread block per (row, warp) and scp_write_kernel's butterfly over the warp
 * sums; the maximum (fmaxf) and the probabilities do not depend on the order. ST: z = cast(softcap(raw) / T) is
 * computed once and kept in P as its act dtype (1 bf16, 2 f16: exact, cast already rounded it there), or computed
 * again from raw in each launch (0: act f32). */
#define SCP_NT 512 /* = turbo_sc_probs_kernel's block: the order of its sum */
#define SCP_NW (SCP_NT / 32)
#define SCP_BT 256 /* threads of scp_max_kernel and scp_write_kernel */

template <int ST> static __device__ __forceinline__ float scp_z(const dg_tb_seg &s, size_t o, float cap, int act) {
  if (ST == 1) return __bfloat162float(s.P[o]);
  if (ST == 2) return __half2float(reinterpret_cast<const __half *>(s.P)[o]);
  return tb_round_act(tb_z(s.raw[o], cap, s.T), act);
}

static __device__ __forceinline__ float scp_row_max(const float *pm, int nch) {
  float mx = -FLT_MAX;
  for (int c = 0; c < nch; c++) mx = fmaxf(mx, pm[c]);
  return mx;
}

/* Block (c, g): row g of the table, columns [c SCP_CW, (c + 1) SCP_CW): z's maximum into pmax[r, c] (and z into P
 * for ST 1, 2). */
template <int ST> __global__ void __launch_bounds__(SCP_BT) scp_max_kernel(const dg_tb_tab t, int V, float cap, int act) {
  DG_PDL_ENTRY();
  __shared__ float shf[32];
  int r;
  const dg_tb_seg s = tab_pick(t.s, tab_canvas(t.row0, t.B, blockIdx.y, &r));
  const size_t o = (size_t)r * V;
  const int lo = blockIdx.x * DG_SCP_CW, hi = min(V, lo + DG_SCP_CW), l = threadIdx.x & 31, w = threadIdx.x >> 5;
  float mx = -FLT_MAX;
#pragma unroll 4
  for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
    const float z = tb_round_act(tb_z(s.raw[o + v], cap, s.T), act);
    mx = fmaxf(mx, z);
    if (ST == 1) s.P[o + v] = __float2bfloat16_rn(z);
    if (ST == 2) reinterpret_cast<__half *>(s.P)[o + v] = __float2half_rn(z);
  }
  for (int k = 16; k; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  if (l == 0) shf[w] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) mx = fmaxf(mx, shf[i]);
    s.pmax[(size_t)r * gridDim.x + blockIdx.x] = mx;
  }
}

/* Block (w, g), 32 threads: warp w of turbo_sc_probs_kernel for row g: its threads' sums of exp(z - max) in double
 * (thread t = 32 w + lane: columns t, t + SCP_NT, ...), the warp's butterfly, into psum[r, w]. */
template <int ST> __global__ void __launch_bounds__(32) scp_sum_kernel(const dg_tb_tab t, int V, int nch, float cap, int act) {
  DG_PDL_ENTRY();
  int r;
  const dg_tb_seg s = tab_pick(t.s, tab_canvas(t.row0, t.B, blockIdx.y, &r));
  const size_t o = (size_t)r * V;
  const float mx = scp_row_max(s.pmax + (size_t)r * nch, nch);
  double sum = 0.0;
#pragma unroll 8 /* the loads ahead of the sum's chain */
  for (int v = blockIdx.x * 32 + threadIdx.x; v < V; v += SCP_NT) sum += (double)expf(scp_z<ST>(s, o + v, cap, act) - mx);
  for (int k = 16; k; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
  if (threadIdx.x == 0) s.psum[(size_t)r * SCP_NW + blockIdx.x] = sum;
}

/* Block (c, g): the row's sum as turbo_sc_probs_kernel's warp 0 forms it from the warp sums (every warp here forms
 * it alike), then P of columns [c SCP_CW, (c + 1) SCP_CW). */
template <int ST> __global__ void __launch_bounds__(SCP_BT) scp_write_kernel(const dg_tb_tab t, int V, int nch, float cap, int act) {
  DG_PDL_ENTRY();
  int r;
  const dg_tb_seg s = tab_pick(t.s, tab_canvas(t.row0, t.B, blockIdx.y, &r));
  const size_t o = (size_t)r * V;
  const float mx = scp_row_max(s.pmax + (size_t)r * nch, nch);
  const int l = threadIdx.x & 31;
  double ss = l < SCP_NW ? s.psum[(size_t)r * SCP_NW + l] : 0.0;
  for (int k = 16; k; k >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, k);
  const float inv = (float)(1.0 / ss);
  const int lo = blockIdx.x * DG_SCP_CW, hi = min(V, lo + DG_SCP_CW);
#pragma unroll 4
  for (int v = lo + threadIdx.x; v < hi; v += blockDim.x)
    s.P[o + v] = __float2bfloat16_rn(tb_round_act(expf(scp_z<ST>(s, o + v, cap, act) - mx) * inv, act));
}

template <int ST> static cudaError_t scp_launch(cudaStream_t s, const dg_tb_tab *t, int R, int V, float cap, int act) {
  const int nch = dg_scp_chunks(V);
  DG_LAUNCH(scp_max_kernel<ST>, dim3(nch, R), SCP_BT, 0, s)(*t, V, cap, act);
  DG_LAUNCH(scp_sum_kernel<ST>, dim3(SCP_NW, R), 32, 0, s)(*t, V, nch, cap, act);
  DG_LAUNCH(scp_write_kernel<ST>, dim3(nch, R), SCP_BT, 0, s)(*t, V, nch, cap, act);
  return cudaGetLastError();
}

cudaError_t k_turbo_sc_probs_tab(cudaStream_t s, const dg_tb_tab *t, int V, float cap, int act) {
  if (t->B < 1 || t->B > DG_TB_TAB) return cudaErrorInvalidValue;
  const int R = t->row0[t->B];
  if (R <= 0) return cudaSuccess;
  if (act == DG_CUDA_BF16) return scp_launch<1>(s, t, R, V, cap, act);
  if (act == DG_CUDA_F16) return scp_launch<2>(s, t, R, V, cap, act);
  return scp_launch<0>(s, t, R, V, cap, act);
}

/* One block per row r: soft[rows[r], j] = scale * sum_k p[r, k] E[idx[r, k], j],
 * summed in the order k = 0..K-1 (as dg_turbo_sc_row). */
__global__ void turbo_sc_topk_kernel(const float *p, const int32_t *idx, const int32_t *rows, const bf16 *E,
                                     float *soft, int K, int H, float scale) {
  DG_PDL_ENTRY();
  const int r = blockIdx.x;
  const float *pr = p + (size_t)r * K;
  const int32_t *ir = idx + (size_t)r * K;
  float *d = soft + (size_t)rows[r] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc += pr[k] * __bfloat162float(E[(size_t)ir[k] * H + j]);
    d[j] = acc * scale;
  }
}

cudaError_t k_turbo_sc_topk(cudaStream_t s, const float *p, const int32_t *idx, const int32_t *rows, const bf16 *E,
                            float *soft, int n, int K, int H, float scale) {
  if (n <= 0) return cudaSuccess;
  DG_LAUNCH(turbo_sc_topk_kernel, n, 256, 0, s)(p, idx, rows, E, soft, K, H, scale);
  return cudaGetLastError();
}
