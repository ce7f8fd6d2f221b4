/* moe.cu: the mixture-of-experts block on the GPU (spec 4.6).
 *
 *   k_route          router softmax, top-k, renormalisation, per-expert scale;
 *                    grouping of the (token, slot) pairs by expert and the
 *                    work list of the grouped product, all on the device
 *                    (no host sync: the launch grid is the worst case and
 *                    surplus blocks exit at once)
 *   dg_cuda_experts  the grouped expert product over only the chosen experts:
 *                    y = down_e(gelu_tanh(G_e x) * U_e x), bf16 tensor cores
 *                    (WMMA 16x16x16) with fp32 accumulation; MLX affine-
 *                    quantized stacks go to the tensor-core kernels of qmoe.cu
 *
 * dg_cuda_experts is the one function a quantized expert format replaces. */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <mma.h>

#include "backend/switches.h"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

using namespace nvcuda;

#define TM DG_MOE_TM /* grouped rows per tile (32; the quantized kernels take the same tiles) */
#define TN 64  /* output columns per tile */
#define TK 32  /* reduction step */
#define PADB 8 /* bf16 row padding of the shared tiles (keeps 16-byte rows, fewer bank conflicts) */
#define PADF 4 /* fp32 row padding of the output staging */

/* One thread per token: p = softmax(logits) over E (in place), top-K by p
 * with ties to the lower expert id, w = p / sum(top-K p) * per_expert_scale
 * (the CPU's exact sequence of fp32 operations, src/model/forward.c). */
/* One warp per token: the router's softmax, top-K, renormalisation and
 * per-expert scale (spec 4.6 step 2), the same operations in the same order
 * as the CPU (src/model/forward.c) and as the first, thread-per-token kernel, so the
 * results are those of that kernel bit for bit: lane l holds experts l,
 * l + 32, ...; the maximum is exact in any order; the sum of the
 * exponentials is formed by lane 0 in expert order; each of the K choices is a
 * warp arg-max with ties to the lower expert id (what a scan in id order with
 * a strict > picks). E <= 32 TOPK_PER. */
#define TOPK_PER 8
/* A warp's token, the first half of the router softmax: v[j] (the logit of expert lane + 32 j, -FLT_MAX past E)
 * becomes exp(v[j] - max) for the experts below E, also written to buf[e]; returns their sum, added by lane 0 in
 * expert order and given to every lane (the CPU's order, so topk_token and route_tk_kernel agree bit for bit). */
template <int JP> __device__ __forceinline__ float route_exp_sum(float (&v)[JP], float *buf, int E, int lane) {
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < JP; j++) mx = v[j] > mx ? v[j] : mx;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, mx, o);
    mx = m2 > mx ? m2 : mx;
  }
#pragma unroll
  for (int j = 0; j < JP; j++) {
    const int e = lane + 32 * j;
    if (e < E) buf[e] = v[j] = expf(v[j] - mx);
  }
  __syncwarp();
  float sum = 0.0f;
  if (lane == 0)
    for (int e = 0; e < E; e++) sum += buf[e];
  return __shfl_sync(0xffffffffu, sum, 0);
}

/* topk_token: one warp's token. v[j] holds the router logit of expert lane + 32 j (-FLT_MAX past E); s is the
 * token's row of rlog [E] (overwritten by the probabilities); id, w the token's K choices and weights. */
__device__ __forceinline__ void topk_token(float (&v)[TOPK_PER], float *s, const float *pes, int32_t *id, float *w,
                                           int E, int K, int lane) {
  bool used[TOPK_PER];
#pragma unroll
  for (int j = 0; j < TOPK_PER; j++) used[j] = lane + 32 * j >= E;
  const float sum = route_exp_sum(v, s, E, lane);
  __syncwarp(); /* lane 0's reads before the stores below */
#pragma unroll
  for (int j = 0; j < TOPK_PER; j++) {
    const int e = lane + 32 * j;
    if (e < E) s[e] = v[j] = v[j] / sum;
  }
  float wsum = 0.0f;
  for (int k = 0; k < K; k++) {
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (int j = 0; j < TOPK_PER; j++)
      if (!used[j] && (bi < 0 || v[j] > bv)) { bv = v[j]; bi = lane + 32 * j; }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
#pragma unroll
    for (int j = 0; j < TOPK_PER; j++)
      if (bi == lane + 32 * j) used[j] = true;
    if (lane == 0) { id[k] = bi; w[k] = bv; }
    wsum += bv;
  }
  __syncwarp(); /* lane 0's stores before the other lanes read them */
  if (lane < K) w[lane] = (w[lane] / wsum) * pes[id[lane]];
}

__global__ void topk_kernel(float *rlog, const float *pes, int32_t *idx, float *wout, int T, int E, int K) {
  DG_PDL_ENTRY();
  const int t = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (t >= T) return; /* whole warps */
  float *s = rlog + (size_t)t * E;
  float v[TOPK_PER];
#pragma unroll
  for (int j = 0; j < TOPK_PER; j++) {
    const int e = lane + 32 * j;
    v[j] = e < E ? s[e] : -FLT_MAX;
  }
  topk_token(v, s, pes, idx + (size_t)t * K, wout + (size_t)t * K, E, K, lane);
}

/* The grouping by expert in three launches (was one block of 256 threads,
 * each scanning every pair twice):
 *   group_count_kernel  block e counts the pairs of expert e (a block sum);
 *   group_scan_kernel   one block: the exclusive scan over the experts and
 *                       the tile work list (expert, first row);
 *   group_place_kernel  block e places its pairs in ascending (token, slot)
 *                       order: the pairs in chunks of the block's threads, a
 *                       ballot per warp and the warps' counts give each match
 *                       its rank. */
#define GROUP_THREADS 256
__global__ void __launch_bounds__(GROUP_THREADS) group_count_kernel(const int32_t *idx, int n, int32_t *count) {
  DG_PDL_ENTRY();
  __shared__ int ws[GROUP_THREADS / 32];
  const int e = blockIdx.x;
  int c = 0;
  for (int i = threadIdx.x; i < n; i += GROUP_THREADS) c += idx[i] == e;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (int w = 0; w < GROUP_THREADS / 32; w++) t += ws[w];
    count[e] = t;
  }
}

/* One block of GROUP_THREADS >= E threads: thread e holds expert e's count and
 * tile count; two exclusive scans in shared memory (Hillis-Steele) give its
 * first row and first tile, then it writes its own tiles. (One thread walking
 * the experts took 26 us on the H200: a chain of dependent loads.) order (if
 * not NULL): order[r] = the expert of rank r by descending count, ties by
 * index (thread e counts the experts ahead of it): the longest blocks of the
 * lane-record products start first (largest processing time first). */
__global__ void __launch_bounds__(GROUP_THREADS) group_scan_kernel(int E, const int32_t *count, int32_t *start,
                                                                   int32_t *tiles, int32_t *n_tiles, int32_t *order) {
  DG_PDL_ENTRY();
  __shared__ int sc[2][GROUP_THREADS], st[2][GROUP_THREADS];
  const int e = threadIdx.x;
  const int c = e < E ? count[e] : 0, nt = (c + TM - 1) / TM;
  int b = 0;
  sc[0][e] = c;
  st[0][e] = nt;
  __syncthreads();
  if (order && e < E) {
    int rank = 0;
    for (int j = 0; j < E; j++) rank += sc[0][j] > c || (sc[0][j] == c && j < e);
    order[rank] = e;
  }
  __syncthreads(); /* sc[0] is rewritten by the scan */
  for (int o = 1; o < GROUP_THREADS; o <<= 1) { /* inclusive scans */
    const int vc = sc[b][e] + (e >= o ? sc[b][e - o] : 0), vt = st[b][e] + (e >= o ? st[b][e - o] : 0);
    sc[b ^ 1][e] = vc;
    st[b ^ 1][e] = vt;
    b ^= 1;
    __syncthreads();
  }
  const int row0 = sc[b][e] - c, tile0 = st[b][e] - nt;
  if (e < E) {
    start[e] = row0;
    for (int i = 0; i < nt; i++) {
      tiles[2 * (tile0 + i)] = e;
      tiles[2 * (tile0 + i) + 1] = i * TM;
    }
  }
  if (e == E - 1) {
    start[E] = sc[b][e];
    *n_tiles = st[b][e];
  }
}

__global__ void __launch_bounds__(GROUP_THREADS) group_place_kernel(const int32_t *idx, int n, const int32_t *start,
                                                                    int32_t *pairs, int32_t *slot_row) {
  DG_PDL_ENTRY();
  __shared__ int ws[GROUP_THREADS / 32];
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int base = start[e];
  for (int i0 = 0; i0 < n; i0 += GROUP_THREADS) {
    const int i = i0 + threadIdx.x;
    const bool hit = i < n && idx[i] == e;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) ws[warp] = __popc(m);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < GROUP_THREADS / 32; w++) {
      before += w < warp ? ws[w] : 0;
      total += ws[w];
    }
    if (hit) {
      const int j = base + before + __popc(m & ((1u << lane) - 1u));
      pairs[j] = i;
      slot_row[i] = j;
    }
    base += total;
    __syncthreads(); /* ws is rewritten by the next chunk */
  }
}

/* ---- the router's split sums, softmax, top-K and grouping in one launch ----
 * route_kernel: block b serves tokens [W b, W b + W) (W = ROUTE_THREADS / 32, a warp per token): the router
 * logit of (t, e) is part[0][t][e] + part[1][t][e] + ... in split order (router_reduce_kernel's sum, so the
 * logits are that kernel's bit for bit), then topk_token (topk_kernel's operations). The last block to finish
 * (a device-wide counter b->done, the threadfence-reduction pattern of the CUDA programming guide, "Memory
 * Fence Functions") groups every pair by expert in one block (route_group_block): the outputs of
 * group_count/scan/place_kernel exactly (integers, one order), and sets the counter back to 0 for the next
 * launch. One launch instead of four (reduce, top-K, count + scan + place), each of which paid a drain and a
 * ramp of its own in the dependent chain of a layer (issue 12: router + top-k 0.73 ms and grouping 0.36 ms per
 * 26B pass against floors of microseconds). */
#define ROUTE_THREADS 512
#define ROUTE_WARPS (ROUTE_THREADS / 32)
#define ROUTE_EMAX 256 /* 32 TOPK_PER */
/* Above this many pairs the one grouping block would walk too many chunks (2 barriers each) where the
 * separate grouping kernels spread the placing over E blocks: the stacked passes of a batch. */
#define ROUTE_FUSED_MAX_PAIRS 4096

/* The grouping of the n = T K pairs of idx by expert, by the whole block (ROUTE_THREADS >= E threads): counts
 * (shared-memory atomics), the exclusive scan and the tile work list and block order of group_scan_kernel,
 * then the pairs placed in ascending order within each expert, a chunk of ROUTE_THREADS pairs at a time: the
 * lanes of a warp holding the same expert (__match_any_sync) rank themselves by lane, the warps' counts per
 * expert are scanned over the warps by one thread per expert. idx is read through L2 (__ldcg): other blocks
 * wrote it in this launch. */
__device__ __forceinline__ void route_group_block(const dg_cuda_moe_buf &b, int n, int E) {
  __shared__ int cnt[ROUTE_EMAX], base[ROUTE_EMAX];
  __shared__ int sc[2][ROUTE_THREADS], st[2][ROUTE_THREADS];
  __shared__ int wcnt[ROUTE_WARPS][ROUTE_EMAX], wpre[ROUTE_WARPS][ROUTE_EMAX];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < ROUTE_EMAX; i += ROUTE_THREADS) cnt[i] = 0;
  for (int i = tid; i < ROUTE_WARPS * ROUTE_EMAX; i += ROUTE_THREADS) wcnt[i / ROUTE_EMAX][i % ROUTE_EMAX] = 0;
  __syncthreads();
  for (int i = tid; i < n; i += ROUTE_THREADS) atomicAdd(&cnt[__ldcg(b.topk_idx + i)], 1);
  __syncthreads();
  /* group_scan_kernel's scan, tile list and order, over this block's threads */
  const int e = tid;
  const int c = e < E ? cnt[e] : 0, nt = (c + TM - 1) / TM;
  int pb = 0;
  sc[0][e] = c;
  st[0][e] = nt;
  __syncthreads();
  if (e < E) {
    b.count[e] = c;
    if (b.order) {
      int rank = 0;
      for (int j = 0; j < E; j++) rank += sc[0][j] > c || (sc[0][j] == c && j < e);
      b.order[rank] = e;
    }
  }
  __syncthreads(); /* sc[0] is rewritten by the scan */
  for (int o = 1; o < ROUTE_THREADS; o <<= 1) { /* inclusive scans */
    const int vc = sc[pb][e] + (e >= o ? sc[pb][e - o] : 0), vt = st[pb][e] + (e >= o ? st[pb][e - o] : 0);
    sc[pb ^ 1][e] = vc;
    st[pb ^ 1][e] = vt;
    pb ^= 1;
    __syncthreads();
  }
  const int row0 = sc[pb][e] - c, tile0 = st[pb][e] - nt;
  if (e < E) {
    b.start[e] = row0;
    base[e] = row0;
    for (int i = 0; i < nt; i++) {
      b.tiles[2 * (tile0 + i)] = e;
      b.tiles[2 * (tile0 + i) + 1] = i * TM;
    }
  }
  if (e == E - 1) {
    b.start[E] = sc[pb][e];
    *b.n_tiles = st[pb][e];
  }
  __syncthreads(); /* base[] */
  for (int i0 = 0; i0 < n; i0 += ROUTE_THREADS) {
    const int i = i0 + tid, ei = i < n ? __ldcg(b.topk_idx + i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, ei);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (ei >= 0 && rank == 0) wcnt[warp][ei] = __popc(peers);
    __syncthreads();
    if (tid < E) { /* this chunk's first row of expert tid in each warp; the counts zeroed for the next chunk */
      int run = base[tid];
      for (int w = 0; w < ROUTE_WARPS; w++) {
        const int cw = wcnt[w][tid];
        wpre[w][tid] = run;
        wcnt[w][tid] = 0;
        run += cw;
      }
      base[tid] = run;
    }
    __syncthreads(); /* wpre; the next chunk's wcnt stores come after it, its wpre stores after its first barrier */
    if (ei >= 0) {
      const int j = wpre[warp][ei] + rank;
      b.pairs[j] = i;
      b.slot_row[i] = j;
    }
  }
}

__global__ void __launch_bounds__(ROUTE_THREADS) route_kernel(const float *part, int S, float *rlog, const float *pes,
                                                              dg_cuda_moe_buf b, int T, int E, int K) {
  DG_PDL_ENTRY();
  __shared__ int last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.x * ROUTE_WARPS + warp;
  if (t < T) {
    const size_t n = (size_t)T * E;
    float v[TOPK_PER];
#pragma unroll
    for (int j = 0; j < TOPK_PER; j++) {
      const int e = lane + 32 * j;
      if (e < E) {
        const size_t i = (size_t)t * E + e;
        float x = part[i];
        for (int sp = 1; sp < S; sp++) x += part[(size_t)sp * n + i];
        v[j] = x;
      } else {
        v[j] = -FLT_MAX;
      }
    }
    topk_token(v, rlog + (size_t)t * E, pes, b.topk_idx + (size_t)t * K, b.topk_w + (size_t)t * K, E, K, lane);
  }
  __threadfence(); /* this block's choices visible device-wide before it counts itself done */
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(b.done, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  route_group_block(b, T * K, E);
  if (threadIdx.x == 0) *b.done = 0;
}

/* The default of k_route / k_router_route's `mode` = -1: since H200 session 14 mode 3, router_tile_kernel +
 * route_gr_kernel (DGEMMA_ROUTE=grid, below; lab stage 26.5 -> 24.0 us with the gate/up input copy inside it;
 * shapes it does not cover take mode 2, then the chain); DGEMMA_ROUTE=tiles: mode 2, router_tile_kernel +
 * route_tk_kernel, the default of session 13 (router + top-k 0.987 -> 0.880 ms per 26B pass in --profile, within
 * noise end to end; lab stage 29.8 -> 26.5 us; every output word the chain's; docs/measurements.md); DGEMMA_ROUTE=chain: the chain
 * of launches (router_reduce, topk, group count / scan / place; mode 0, the default before); DGEMMA_ROUTE=fused:
 * route_kernel (mode 1, 0.2 ms per pass slower than the chain in session 11); DGEMMA_ROUTE=one: router_one_kernel (mode
 * 5, session 29: the stage in one launch, not yet measured on a GPU); DGEMMA_ROUTE=gridp: mode 3 with route_gr_kernel's
 * two serial tails made short (mode 6, session 29: the copy's loads first as mode 4, the placement's table loads all in
 * flight at once, ro_place, and the last block's copy after its placement; not yet measured on a GPU). Read once when
 * the library loads. */
/* The words and their modes: backend/switches.c's route_w, route_v: fused 1, chain and split 0 (split: session 11's
 * name for the chain), tiles 2, deep 4 (session 22: router_tile_deep_kernel + route_gr_kernel<JP, 1>), one 5
 * (session 29: router_one_kernel, below; mode 3 where it does not cover), gridp 6 (session 29: mode 3 with
 * route_gr_kernel<JP, 1, 1>, below), grid or unset 3. */
static int route_mode_from_env(void) { return (int)dg_sw_get(DG_SW_ROUTE); }
static const int route_mode_default = route_mode_from_env();
static int route_mode(int mode) { return mode < 0 ? route_mode_default : mode; }
static int route_use_fused(int mode, int T, int K) { return route_mode(mode) == 1 && T * K <= ROUTE_FUSED_MAX_PAIRS; }

static cudaError_t route_fused(cudaStream_t s, const float *part, int S, float *rlog, const float *pes,
                               dg_cuda_moe_buf *b, int T, int E, int K) {
  if (E > ROUTE_EMAX || K > 32 || !b->done) return cudaErrorInvalidValue;
  DG_LAUNCH(route_kernel, (T + ROUTE_WARPS - 1) / ROUTE_WARPS, ROUTE_THREADS, 0, s)(part, S, rlog, pes, *b, T, E, K);
  return cudaGetLastError();
}

/* ---- router logits (spec 4.6 step 2): rlog [T, E] = u [T, H] . W [E, H]^T in fp32 ----
 * SIMT fp32 (the CPU's dtype: no TF32), split over the reduction so that a
 * 256-token canvas with 128 experts (8 output tiles) still fills the GPU:
 * grid (T / 64, E / 64, S); block of 256 threads, a 4 x 4 micro-tile each;
 * k tiles of 16 staged in shared memory (transposed: float4 reads). Each
 * output is the sum over its split's k in ascending order (one fp32 chain),
 * then the S split sums added in split order by router_reduce_kernel: a fixed
 * order (deterministic run to run), another order than cuBLAS's or the
 * CPU's, within the same fp32 bound (the tests compare the logits normwise
 * against the CPU). Replaces cublasSgemm, which ran a SIMT sgemm plus a
 * split-K reduction at ~17 + 6 us per layer on the H200 (issue 12). */
#define RG_T 64
#define RG_E 64
#define RG_K 16

__global__ void __launch_bounds__(256) router_part_kernel(const float *u, const float *W, float *part, int T, int E,
                                                          int H, int KS) {
  DG_PDL_ENTRY();
  __shared__ __align__(16) float As[RG_K][RG_T + 4];
  __shared__ __align__(16) float Bs[RG_K][RG_E + 4];
  const int t0 = blockIdx.x * RG_T, e0 = blockIdx.y * RG_E, sp = blockIdx.z;
  const int kb = sp * KS, ke = min(H, kb + KS);
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15, lr = tid >> 2, lk = (tid & 3) * 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  const bool ta = t0 + lr < T, tb = e0 + lr < E;
  const float *ua = u + (size_t)(ta ? t0 + lr : 0) * H, *wb = W + (size_t)(tb ? e0 + lr : 0) * H;
  float na[4], nb[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int k = kb + lk + j;
    na[j] = ta && k < ke ? ua[k] : 0.0f;
    nb[j] = tb && k < ke ? wb[k] : 0.0f;
  }
  for (int k0 = kb; k0 < ke; k0 += RG_K) {
#pragma unroll
    for (int j = 0; j < 4; j++) { As[lk + j][lr] = na[j]; Bs[lk + j][lr] = nb[j]; }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; j++) { /* the next tile's loads in flight during this tile's products */
      const int k = k0 + RG_K + lk + j;
      na[j] = ta && k < ke ? ua[k] : 0.0f;
      nb[j] = tb && k < ke ? wb[k] : 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < RG_K; kk++) {
      const float4 a = *(const float4 *)&As[kk][ty * 4], b = *(const float4 *)&Bs[kk][tx * 4];
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = t0 + ty * 4 + i;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int e = e0 + tx * 4 + j;
      if (e < E) part[((size_t)sp * T + t) * E + e] = acc[i][j];
    }
  }
}

__global__ void router_reduce_kernel(const float *part, float *rlog, int n, int S) {
  DG_PDL_ENTRY();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = part[i];
  for (int sp = 1; sp < S; sp++) v += part[(size_t)sp * n + i];
  rlog[i] = v;
}

/* Splits of the reduction over H: DG_ROUTER_MAX_SPLITS, at least 64 k each, whatever T and E, so that a token's
 * logits do not depend on how many other tokens share the pass (a stacked batch's canvases get the logits of
 * their own passes). At 256 tokens and 128 experts: 8 output tiles x 16 splits, the count the earlier rule
 * (about two blocks per SM of an H200) also chose for every T up to ~500. */
static int router_splits(int T, int E, int H) {
  (void)T;
  (void)E;
  int S = DG_ROUTER_MAX_SPLITS;
  const int smax = (H + 63) / 64;
  if (S > smax) S = smax;
  return S < 1 ? 1 : S;
}

/* The split partial sums of the router logits: into rlog when there is one split, else ws. Returns the split count. */
static int router_parts(cudaStream_t s, const float *u, const float *W, float *rlog, int T, int E, int H, float *ws,
                        float **part) {
  const int S = router_splits(T, E, H);
  const int KS = ((H + S - 1) / S + RG_K - 1) / RG_K * RG_K;
  *part = S > 1 ? ws : rlog;
  DG_LAUNCH(router_part_kernel, dim3((T + RG_T - 1) / RG_T, (E + RG_E - 1) / RG_E, S), 256, 0, s)(u, W, *part, T, E,
                                                                                                   H, KS);
  return S;
}

/* ---- DGEMMA_ROUTE=tiles: the router stage in two launches at the width of the GPU (issue 12 item 3) ----
 * The same arithmetic as the chain (router_part_kernel's split chains, router_reduce_kernel's sum in split order,
 * topk_kernel's softmax / top-K / weights, group_count/scan/place's integers), so every output word is the chain's;
 * fewer launches in the dependent chain (2 instead of 6) and the product on blocks that each read their inputs once:
 *
 *   router_tile_kernel  split sums part[s][t][e] (s < S, the chain's splits of KS k): block (token tile of RT_T = 64,
 *                       expert tile of RT_E = 64, split s), router_part_kernel's tiles; a 4 x 4 micro-tile per
 *                       thread, each output one fp32 chain over the split's k in ascending order in stages of
 *                       RT_K = 16 (the chain's stages, zeros past the split as it pads), but the stages loaded by
 *                       cp.async RT_STAGES deep (the chain: one stage ahead in registers, two barriers a stage)
 *                       into XOR-swizzled rows (float4 reads of 4 or 8 consecutive rows at one 16-byte chunk hit
 *                       distinct banks; no transposing stores). At 256 x 128 x 2816: 4 x 2 x 16 = 128 blocks of
 *                       256 threads, 11.5 MB through L2 (W read by the 4 token tiles, u by the 2 expert tiles),
 *                       92 M FMAs: 2.8 us at the H200's fp32 rate (132 SMs x 128 lanes x 1.98 GHz).
 *   route_tk_kernel     a warp per token (RTK_W = 4 or 8 warps per block): the token's S split sums loaded at once
 *                       and added in split order, topk_kernel's softmax with the exponentials in shared memory (lane
 *                       0 sums them in expert order), the K choices by two warp reductions each (__reduce_max_sync
 *                       of the probabilities' bits, which order as the values do for p >= 0, then
 *                       __reduce_min_sync of the ids at the maximum: the highest probability, ties to the lower id,
 *                       topk_token's rule), each pair's rank among the block's pairs of its expert (slot_row holds
 *                       it until the grouping); the last block to finish (b->done, route_kernel's pattern) groups:
 *                       the pairs' experts and ranks into shared memory, counts per (block, expert) by shared
 *                       atomics (integers: any order), their prefix over the blocks, the scan over the experts in
 *                       one warp, the order and tile list of group_scan_kernel, and every pair placed at once at
 *                       start[e] + (pairs of e in earlier blocks) + rank. Up to RTK_PMAX pairs and RTK_CMAX
 *                       (block, expert) counts (T <= 256 at 128 experts with 4 warps, 512 with 8); larger passes
 *                       (stacked batches) and H % 4 != 0 take the chain. */
#define RT_T 64 /* tokens per block */
#define RT_E 64 /* experts per block */
#define RT_K 16
#define RT_STAGES 4
#define RT_THREADS 256
#define RT_WC (RT_E / 32) /* warp columns: a warp covers 4 x 8 (token, expert) micro-tiles */

/* float index of 16-byte chunk q (0..3) of row r of a stage's [rows][RT_K] tile, the chunks XOR-swizzled by
 * (r / 2) % 4: rows r and r + 1 differ by 64 bytes, so 8 consecutive rows at one q fill the 32 banks once. */
__device__ __forceinline__ int rt_sw(int r, int q) { return r * RT_K + ((q ^ ((r >> 1) & 3)) << 2); }

/* router_tile_kernel's body with STG stage buffers at sm (the stages in flight: STG - 1). */
template <int STG>
__device__ __forceinline__ void router_tile_body(float (*sm)[(RT_T + RT_E) * RT_K], const float *u, const float *W,
                                                 float *part, int T, int E, int H, int KS) {
  const int t0 = blockIdx.x * RT_T, e0 = blockIdx.y * RT_E, sp = blockIdx.z;
  const int kb = sp * KS, ke = min(H, kb + KS), ns = ke > kb ? (ke - kb + RT_K - 1) / RT_K : 0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  /* this thread's outputs: tokens tr + (RT_T / 4) i, experts ec + (RT_E / 4) j; a warp's lanes cover 4
   * consecutive tr and 8 consecutive ec, so its float4 reads of A touch 4 rows and of B 8 rows at one chunk */
  const int tr = (warp / RT_WC) * 4 + (lane >> 3), ec = (warp % RT_WC) * 8 + (lane & 7);
  /* stage st of the split into buffer bf: u rows t0 .. t0 + RT_T, W rows e0 .. e0 + RT_E, one 16-byte chunk
   * per thread each; zeros past T, E or the split's end (H % 4 == 0: a chunk is wholly inside or outside) */
  auto load = [&](int st, int bf) {
    const int k0 = kb + st * RT_K;
    float *dst = sm[bf];
    static_assert(RT_T * 4 == RT_THREADS && RT_E * 4 == RT_THREADS, "one chunk of u and one of W per thread");
    const int r = tid >> 2, q = tid & 3, t = t0 + r, e = e0 + r, k = k0 + 4 * q;
    const bool oku = t < T && k < ke, okw = e < E && k < ke;
    dg_cp_async16(dst + rt_sw(r, q), oku ? u + (size_t)t * H + k : u, oku ? 16 : 0);
    dg_cp_async16(dst + rt_sw(RT_T + r, q), okw ? W + (size_t)e * H + k : W, okw ? 16 : 0);
  };
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll
  for (int st = 0; st < STG - 1; st++) {
    if (st < ns) load(st, st);
    dg_cp_commit();
  }
  for (int st = 0; st < ns; st++) {
    dg_cp_wait<STG - 2>(); /* this thread's copies of stage st have landed */
    __syncthreads();             /* everyone's; and every read of the buffer refilled below is done */
    if (st + STG - 1 < ns) load(st + STG - 1, (st + STG - 1) % STG);
    dg_cp_commit();
    const float *As = sm[st % STG], *Bs = As + RT_T * RT_K;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float4 a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = *(const float4 *)&As[rt_sw(tr + (RT_T / 4) * i, q)];
#pragma unroll
      for (int j = 0; j < 4; j++) b[j] = *(const float4 *)&Bs[rt_sw(ec + (RT_E / 4) * j, q)];
      /* k = 4 q, 4 q + 1, ... in order: router_part_kernel's chain */
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i].x * b[j].x;
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i].y * b[j].y;
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i].z * b[j].z;
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i].w * b[j].w;
    }
  }
  dg_cp_wait<0>(); /* no copy left in flight at exit (the empty groups of the last stages) */
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = t0 + tr + (RT_T / 4) * i;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int e = e0 + ec + (RT_E / 4) * j;
      if (e < E) part[((size_t)sp * T + t) * E + e] = acc[i][j];
    }
  }
}

__global__ void __launch_bounds__(RT_THREADS) router_tile_kernel(const float *u, const float *W, float *part, int T,
                                                                 int E, int H, int KS) {
  DG_PDL_ENTRY();
  __shared__ __align__(16) float sm[RT_STAGES][(RT_T + RT_E) * RT_K];
  router_tile_body<RT_STAGES>(sm, u, W, part, T, E, H, KS);
}

/* Version 4 of the product (DGEMMA_ROUTE=deep, session 22): router_tile_kernel with RT_DEEP stage buffers in
 * dynamic shared memory (96 KB: one block per SM, as the 128 blocks of the 26B shape are anyway), so that a 26B
 * split's 11 stages of 16 k are all asked for at once, before the first product. router_tile_kernel keeps 3 stages
 * in flight: each stage's ~0.26 us of products (2 warps x 256 FFMA per SM sub-partition) covers about a third of a
 * load's round trip under load (~0.8-1 us, W from DRAM), so the products stall whenever they catch up with the
 * loads, and the first stage's whole round trip comes first. The same tiles, micro-tiles and per-output chains (k
 * ascending in the split): every split sum the same word. */
#define RT_DEEP 12
__global__ void __launch_bounds__(RT_THREADS) router_tile_deep_kernel(const float *u, const float *W, float *part,
                                                                      int T, int E, int H, int KS) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM(float, dyn);
  router_tile_body<RT_DEEP>((float (*)[(RT_T + RT_E) * RT_K])dyn, u, W, part, T, E, H, KS);
}

#define RTK_PMAX 4096 /* pairs T K of one route_tk_kernel launch */
#define RTK_CMAX 8192 /* (block, expert) counts of its grouping */
#define RTK_WMAX 8    /* warps (tokens) per block */

/* Phase one's per-warp rows and phase two's (the last block's grouping) tables, one after the other. */
struct rtk_rows {
  float prob[RTK_WMAX][ROUTE_EMAX]; /* a token's exponentials, summed in expert order by lane 0 */
  float pes[ROUTE_EMAX];
  int sid[RTK_WMAX * 32]; /* the block's pairs' experts (-1 past T) */
};
union rtk_smem {
  rtk_rows a;
  struct {
    int cnt[RTK_CMAX];                   /* [block][expert] pairs, then their exclusive prefix over the blocks */
    unsigned char gidx[RTK_PMAX], grank[RTK_PMAX]; /* each pair's expert and rank in its block */
    int ecnt[ROUTE_EMAX], estart[ROUTE_EMAX + 1], etile[ROUTE_EMAX];
    int ntiles;
  } g;
};

/* From the per-expert totals ecnt [E] (shared, after a barrier), by the whole block: the exclusive scans of the counts
 * and tile counts over the experts (one warp: lane l has experts per l .. per l + per - 1), group_scan_kernel's order,
 * and count, start, the tile list and n_tiles written; estart [E + 1] and etile [E] stay in shared memory (after the
 * barrier inside). */
__device__ __forceinline__ void rtk_write_groups(const int *ecnt, int *estart, int *etile, int *ntiles_,
                                                 const dg_cuda_moe_buf &b, int E) {
  const int tid = threadIdx.x, bd = blockDim.x, warp = tid >> 5, lane = tid & 31;
  int &ntiles = *ntiles_;
  if (warp == 0) { /* exclusive scans of the counts and tile counts over the experts: lane l has experts per l .. */
    const int per = (E + 31) >> 5, f0 = lane * per;
    int sc = 0, st = 0;
    for (int m = 0; m < per; m++)
      if (f0 + m < E) {
        const int c = ecnt[f0 + m];
        sc += c;
        st += (c + TM - 1) / TM;
      }
    int ic = sc, it = st;
    for (int o = 1; o < 32; o <<= 1) {
      const int xc = __shfl_sync(0xffffffffu, ic, lane >= o ? lane - o : lane);
      const int xt = __shfl_sync(0xffffffffu, it, lane >= o ? lane - o : lane);
      if (lane >= o) { ic += xc; it += xt; }
    }
    int rc = ic - sc, rt = it - st;
    for (int m = 0; m < per; m++)
      if (f0 + m < E) {
        const int c = ecnt[f0 + m];
        estart[f0 + m] = rc;
        etile[f0 + m] = rt;
        rc += c;
        rt += (c + TM - 1) / TM;
      }
    if (lane == 31) {
      estart[E] = ic;
      ntiles = it;
    }
  }
  if (b.order) /* group_scan_kernel's order: rank by descending count, ties by id */
    for (int e = tid; e < E; e += bd) {
      const int c = ecnt[e];
      int rank = 0;
      for (int j = 0; j < E; j++) {
        const int cj = ecnt[j];
        rank += cj > c || (cj == c && j < e);
      }
      b.order[rank] = e;
    }
  __syncthreads();
  for (int e = tid; e < E; e += bd) {
    const int c = ecnt[e], nt = (c + TM - 1) / TM, tile0 = etile[e];
    b.count[e] = c;
    b.start[e] = estart[e];
    for (int i = 0; i < nt; i++) {
      b.tiles[2 * (tile0 + i)] = e;
      b.tiles[2 * (tile0 + i) + 1] = i * TM;
    }
  }
  if (tid == 0) {
    b.start[E] = estart[E];
    *b.n_tiles = ntiles;
  }
}

/* The last block's grouping of the n pairs (PB per block of the launch) by expert: group_count/scan/place's
 * outputs exactly (see above). */
__device__ __forceinline__ void route_tk_group(rtk_smem &sm, const dg_cuda_moe_buf &b, int n, int E, int PB) {
  const int tid = threadIdx.x, bd = blockDim.x, nb = gridDim.x;
  for (int i = tid; i < nb * E; i += bd) sm.g.cnt[i] = 0;
  /* the pairs' experts and ranks (written by the other blocks in this launch: through L2), 16 bytes at a time
   * (the buffers' own allocations: 16-byte aligned; else one word at a time) */
  const int n4 = ((uintptr_t)b.topk_idx | (uintptr_t)b.slot_row) & 15 ? 0 : n >> 2;
#pragma unroll 4
  for (int q = tid; q < n4; q += bd) {
    const uint4 x = __ldcg((const uint4 *)b.topk_idx + q), r = __ldcg((const uint4 *)b.slot_row + q);
    sm.g.gidx[4 * q] = (unsigned char)x.x;
    sm.g.gidx[4 * q + 1] = (unsigned char)x.y;
    sm.g.gidx[4 * q + 2] = (unsigned char)x.z;
    sm.g.gidx[4 * q + 3] = (unsigned char)x.w;
    sm.g.grank[4 * q] = (unsigned char)r.x;
    sm.g.grank[4 * q + 1] = (unsigned char)r.y;
    sm.g.grank[4 * q + 2] = (unsigned char)r.z;
    sm.g.grank[4 * q + 3] = (unsigned char)r.w;
  }
  for (int i = 4 * n4 + tid; i < n; i += bd) {
    sm.g.gidx[i] = (unsigned char)__ldcg(b.topk_idx + i);
    sm.g.grank[i] = (unsigned char)__ldcg(b.slot_row + i);
  }
  __syncthreads();
  for (int i = tid; i < n; i += bd) atomicAdd(&sm.g.cnt[(i / PB) * E + sm.g.gidx[i]], 1);
  __syncthreads();
  /* per expert: the exclusive prefix over the blocks (in place), the total */
  for (int e = tid; e < E; e += bd) {
    int run = 0;
    for (int b0 = 0; b0 < nb; b0 += 8) {
      int c[8];
#pragma unroll
      for (int m = 0; m < 8; m++) c[m] = b0 + m < nb ? sm.g.cnt[(b0 + m) * E + e] : 0;
#pragma unroll
      for (int m = 0; m < 8; m++)
        if (b0 + m < nb) {
          sm.g.cnt[(b0 + m) * E + e] = run;
          run += c[m];
        }
    }
    sm.g.ecnt[e] = run;
  }
  __syncthreads();
  rtk_write_groups(sm.g.ecnt, sm.g.estart, sm.g.etile, &sm.g.ntiles, b, E);
  for (int i = tid; i < n; i += bd) {
    const int e = sm.g.gidx[i], j = sm.g.estart[e] + sm.g.cnt[(i / PB) * E + e] + sm.g.grank[i];
    b.pairs[j] = i;
    b.slot_row[i] = j;
  }
}

/* Phase one of route_tk_kernel and route_gr_kernel, by the whole block (W = blockDim.x / 32 warps, a warp per token
 * t = blockIdx.x W + warp): the token's S split sums loaded at once and added in split order (router_reduce_kernel's
 * sum), topk_token's softmax, choices and weights (rlog, topk_idx, topk_w written), the block's pairs' experts in
 * sm.sid (-1 past T; after the barrier inside). Returns for thread tid < W K with a pair the pair's rank among the
 * block's pairs of its expert, else -1. SLOT 1 (router_one_kernel): the tokens are a route slot's, the first t0 and
 * their count W (<= the block's warps; warps from W on have no token), and the split sums, written by other blocks of
 * the same grid, are loaded from L2 (ld.global.cg); SLOT 0 ignores t0 and W (route_tk_kernel, route_gr_kernel: the
 * code as before the slots). */
template <int JP, int SLOT = 0>
__device__ __forceinline__ int rtk_choose(rtk_rows &sm, const float *part, int S, float *rlog, const float *pes,
                                          const dg_cuda_moe_buf &b, int T, int E, int K, int t0 = 0, int W = 0) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (!SLOT) W = blockDim.x >> 5;
  const int t = SLOT ? (warp < W ? t0 + warp : T) : blockIdx.x * W + warp, PB = W * K;
  for (int e = tid; e < E; e += blockDim.x) sm.pes[e] = pes[e];
  float v[JP];
  if (t < T) {
    const size_t n = (size_t)T * E;
    constexpr int JB = JP < 4 ? JP : 4; /* experts per batch of loads: JB x 16 registers in flight */
#pragma unroll
    for (int h = 0; h < JP; h += JB) {
      float x[JB][DG_ROUTER_MAX_SPLITS];
#pragma unroll
      for (int jj = 0; jj < JB; jj++) { /* unconditional loads (clamped to a valid split and expert): no branches */
        const float *p = part + (size_t)t * E + min(lane + 32 * (h + jj), E - 1);
#pragma unroll
        for (int s2 = 0; s2 < DG_ROUTER_MAX_SPLITS; s2++)
          x[jj][s2] = SLOT ? __ldcg(p + (size_t)min(s2, S - 1) * n) : p[(size_t)min(s2, S - 1) * n];
      }
#pragma unroll
      for (int jj = 0; jj < JB; jj++) { /* router_reduce_kernel's sum */
        float a = x[jj][0];
#pragma unroll
        for (int s2 = 1; s2 < DG_ROUTER_MAX_SPLITS; s2++)
          if (s2 < S) a += x[jj][s2];
        v[h + jj] = lane + 32 * (h + jj) < E ? a : -FLT_MAX;
      }
    }
  }
  __syncthreads(); /* pes */
  int myid = -1;
  if (t < T) {
    /* topk_token's operations */
    const float sum = route_exp_sum(v, sm.prob[warp], E, lane);
    unsigned used = 0;
#pragma unroll
    for (int j = 0; j < JP; j++) {
      const int e = lane + 32 * j;
      if (e < E) {
        v[j] = v[j] / sum;
        rlog[(size_t)t * E + e] = v[j];
      } else {
        used |= 1u << j;
      }
    }
    float wsum = 0.0f, myp = 0.0f;
    for (int k = 0; k < K; k++) {
      unsigned key = 0; /* bits + 1 of this lane's largest unused p (0: none); p >= 0 orders as its bits */
      int bj = 0;
#pragma unroll
      for (int j = 0; j < JP; j++) {
        const unsigned kj = __float_as_uint(v[j]) + 1u;
        if (!((used >> j) & 1u) && kj > key) { key = kj; bj = j; }
      }
      const unsigned mk = __reduce_max_sync(0xffffffffu, key);
      const int bi = __reduce_min_sync(0xffffffffu, key == mk ? lane + 32 * bj : INT32_MAX);
      const float bv = __uint_as_float(mk - 1u);
      if (bi == lane + 32 * bj) used |= 1u << bj;
      if (lane == k) { myid = bi; myp = bv; }
      wsum += bv;
    }
    if (lane < K) {
      b.topk_idx[(size_t)t * K + lane] = myid;
      b.topk_w[(size_t)t * K + lane] = (myp / wsum) * sm.pes[myid];
    }
  }
  if (lane < K && (!SLOT || warp < W)) sm.sid[warp * K + lane] = myid;
  __syncthreads();
  int r = -1; /* the pair's rank among the block's pairs of its expert */
  if (tid < PB && sm.sid[tid] >= 0) {
    const int e = sm.sid[tid];
    r = 0;
    for (int q = 0; q < tid; q++) r += sm.sid[q] == e;
  }
  return r;
}

/* JP: experts per lane (E <= 32 JP). part [S][T][E] split sums (may be rlog itself when S = 1). */
template <int JP>
__global__ void __launch_bounds__(RTK_WMAX * 32) route_tk_kernel(const float *part, int S, float *rlog,
                                                                 const float *pes, dg_cuda_moe_buf b, int T, int E,
                                                                 int K) {
  DG_PDL_ENTRY();
  __shared__ rtk_smem sm;
  __shared__ int last;
  const int tid = threadIdx.x, PB = (blockDim.x >> 5) * K;
  const int r = rtk_choose<JP>(sm.a, part, S, rlog, pes, b, T, E, K);
  if (r >= 0) b.slot_row[(size_t)blockIdx.x * PB + tid] = r; /* kept in slot_row until the grouping */
  __threadfence(); /* this block's choices and ranks visible device-wide before it counts itself done */
  __syncthreads();
  if (tid == 0) last = atomicAdd(b.done, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  route_tk_group(sm, b, T * K, E, PB);
  if (tid == 0) *b.done = 0;
}

/* Warps per block of route_tk_kernel for T tokens (0: the shape is not covered, take the chain). */
static int route_tk_warps(int T, int E, int K) {
  if (T <= 0 || E <= 0 || E > ROUTE_EMAX || K <= 0 || K > 32 || K > E || (long)T * K > RTK_PMAX) return 0;
  for (int W = 4; W <= RTK_WMAX; W *= 2)
    if ((long)((T + W - 1) / W) * E <= RTK_CMAX) return W;
  return 0;
}

cudaError_t k_route_tiles(cudaStream_t s, const float *part, int S, float *rlog, const float *pes, dg_cuda_moe_buf *b,
                          int T, int E, int K) {
  const int W = route_tk_warps(T, E, K);
  if (!W || S < 1 || S > DG_ROUTER_MAX_SPLITS || !b->done) return cudaErrorInvalidValue;
  const dim3 g((T + W - 1) / W), bl(32 * W);
  if (E <= 32) DG_LAUNCH(route_tk_kernel<1>, g, bl, 0, s)(part, S, rlog, pes, *b, T, E, K);
  else if (E <= 64) DG_LAUNCH(route_tk_kernel<2>, g, bl, 0, s)(part, S, rlog, pes, *b, T, E, K);
  else if (E <= 128) DG_LAUNCH(route_tk_kernel<4>, g, bl, 0, s)(part, S, rlog, pes, *b, T, E, K);
  else DG_LAUNCH(route_tk_kernel<8>, g, bl, 0, s)(part, S, rlog, pes, *b, T, E, K);
  return cudaGetLastError();
}

int k_router_tiles_ok(int T, int E, int H, int K) { return H > 0 && H % 4 == 0 && route_tk_warps(T, E, K) > 0; }

/* ---- DGEMMA_ROUTE=grid (the default since session 14): route_tk_kernel's phase one, the grouping spread over every
 * block (issue 12 item 3) ----
 * route_tk_kernel's last block did the whole grouping alone (the pairs into shared memory, the (block, expert) counts
 * and their prefix over the blocks, the scan, the placement of every pair: 16.2 us of a 26B layer's router on the H200
 * against ~3 us for the rest). route_gr_kernel, on the same blocks (a warp per token, W warps):
 *   1. every block: rtk_choose (route_tk_kernel's softmax, choices, weights, and each pair's rank among the block's
 *      pairs of its expert), then its count of each expert into its row of a table in global memory
 *      (gsc: tab[block][expert]) and the nonzero ones added to the experts' totals (tot[e], global atomics:
 *      integers, any order); it counts itself done (b->done, route_tk_kernel's pattern);
 *   2. the last block to finish only: the totals (read and zeroed for the next launch), rtk_write_groups (the scan
 *      over the experts, order, count, start, tile list), then a generation counter gsc[0] raised (release);
 *   2b. every block (the last after step 2): where the caller set b.gu_x / gu_group and passed H, the permuted copy
 *      xp and group sums xs of its tokens' rows of the gate/up input (k_group_sums_perm's outputs, its function
 *      group_sum_perm), in the time the other blocks wait for step 2: one launch less per layer;
 *   3. every block, once the generation has moved (the last block at once): its own pairs placed, pair i of expert e
 *      at start[e] + (pairs of e in earlier blocks: their table rows summed, shared by the block's threads) + rank,
 *      pairs[j] = i, slot_row[i] = j. group_count/scan/place's integers exactly.
 * The wait of step 3 is a grid-wide one. Limit (session 14 review): the residency check below is per grid, so
 * several route_gr_kernel grids spinning at once on one GPU (contexts on different streams driven from threads, MPS
 * clients) could together exceed it and wait forever; dgemma's CLI and server run one pass at a time per GPU, and
 * such callers should set DGEMMA_ROUTE=tiles, or DGEMMA_ROUTE_COOP=1: the grid goes through a cooperative launch
 * (DG_LAUNCH_COOP, common.cuh: the driver places all its blocks at once or refuses it, whatever else runs; with the
 * PDL attribute in the same list, and captured into graphs as a cooperative kernel node), so no grid waits on blocks
 * that are not placed; the residency check stays, so that a launch the driver would refuse is never made and the
 * tiles' kernel runs instead (not the default until it has run on a GPU: the emulation cannot model it, its
 * DG_LAUNCH_COOP is the plain launch). For one grid at a time it is safe by construction: k_route_grid launches only grids that fit on the
 * device at once (grid <= SMs x cudaOccupancyMaxActiveBlocksPerMultiprocessor for the block size; else the tiles'
 * kernel), so every block is resident while any waits, and no block waits on anything but blocks of its own grid
 * (under PDL the next kernel's blocks are placed only once every block of this grid has run its DG_PDL_ENTRY, i.e.
 * is resident; the kernel before is never waited on). The emulation (DG_CUDA_EMU) runs blocks one after another,
 * where a wait would never end: there the last block runs step 3 for every block in turn, with each block's experts
 * and ranks read back from topk_idx and slot_row (same function, same arithmetic). */
#define GR_TAB 16384               /* (block, expert) counts of route_gr_kernel's table */
#define GR_TOT 32                  /* gsc: [0] the generation, [GR_TOT, GR_TOT + ROUTE_EMAX) the totals, then the table */
#define GR_GSC_INTS (GR_TOT + ROUTE_EMAX + GR_TAB)
static_assert(GR_GSC_INTS == DG_ROUTE_GSC_INTS, "common.cuh's size of dg_cuda_moe_buf.gsc");

/* Step 3 for block bb of the launch: its pairs i = bb PB + p (p < PB) of expert pe[p] (-1: none) and rank pr[p]
 * (shared, set by the caller before a barrier) placed; pre [PB] shared scratch. Every thread of the block calls it. */
__device__ __forceinline__ void rgr_place(const dg_cuda_moe_buf &b, const int *tab, const int *pe, const int *pr,
                                          int *pre, int bb, int E, int PB) {
  const int tid = threadIdx.x, nh = blockDim.x / PB; /* nh threads per pair share the earlier blocks' rows */
  if (tid < PB) pre[tid] = 0;
  __syncthreads();
  if (tid < nh * PB) {
    const int p = tid % PB, h = tid / PB, e = pe[p];
    if (e >= 0) {
      int s0 = 0, s1 = 0;
      int b2 = h;
      for (; b2 + nh < bb; b2 += 2 * nh) { /* two loads in flight per step */
        s0 += __ldcg(tab + (size_t)b2 * E + e);
        s1 += __ldcg(tab + (size_t)(b2 + nh) * E + e);
      }
      if (b2 < bb) s0 += __ldcg(tab + (size_t)b2 * E + e);
      if (s0 + s1) atomicAdd(pre + p, s0 + s1);
    }
  }
  __syncthreads();
  if (tid < PB && pe[tid] >= 0) {
    const int i = bb * PB + tid, j = __ldcg(b.start + pe[tid]) + pre[tid] + pr[tid];
    b.pairs[j] = i;
    b.slot_row[i] = j;
  }
}

/* The placement of slot q's PB pairs t0 K + p (expert pe[p], -1: none; rank pr[p]; shared) once start is final:
 * j = start[e] + (pairs of e in slots 0 .. q - 1: their table rows summed by nh threads per pair, 8 loads in flight
 * each) + rank; pairs[j] = i, slot_row[i] = j. pre [PB] shared scratch. Every thread of the block calls it. */
__device__ __forceinline__ void ro_place(const dg_cuda_moe_buf &b, const int *tab, const int *pe, const int *pr,
                                         int *pre, int q, int t0, int PB, int E, int K) {
  const int tid = threadIdx.x;
  if (PB <= 0) return; /* the same for every thread of the block */
  const int nh = blockDim.x / PB, e0 = tid < PB ? pe[tid] : -1;
  const int st = e0 >= 0 ? __ldcg(b.start + e0) : 0; /* in flight with the rows' loads */
  if (tid < PB) pre[tid] = 0;
  __syncthreads();
  if (tid < nh * PB) {
    const int p = tid % PB, h = tid / PB, e = pe[p];
    if (e >= 0) {
      int s = 0;
      for (int b0 = h; b0 < q; b0 += 8 * nh) {
        int c[8];
#pragma unroll
        for (int m = 0; m < 8; m++) c[m] = b0 + m * nh < q ? __ldcg(tab + (size_t)(b0 + m * nh) * E + e) : 0;
#pragma unroll
        for (int m = 0; m < 8; m++) s += c[m];
      }
      if (s) atomicAdd(pre + p, s);
    }
  }
  __syncthreads();
  if (e0 >= 0) {
    const int i = t0 * K + tid, j = st + pre[tid] + pr[tid];
    b.pairs[j] = i;
    b.slot_row[i] = j;
  }
  __syncthreads(); /* pre, pe and pr are written again by the next slot */
}

/* Step 2b: the permuted copy xp and group sums xs of the gate/up input rows of this block's tokens (b.gu_x [T, H],
 * group b.gu_group: k_group_sums_perm's outputs for those rows, group_sum_perm's arithmetic), while it waits. */
template <int LF> __device__ __forceinline__ void rgr_prep_rows(const dg_cuda_moe_buf &b, int t0, int nt, int H) {
  const int G = b.gu_group, ng = H / G;
  for (int j = threadIdx.x; j < nt * ng; j += blockDim.x) {
    const size_t r = (size_t)t0 + j / ng, g = j % ng;
    /* LF (DGEMMA_ROUTE=deep): each group's loads before its stores (group_sum_perm_any): the same words */
    b.xs[r * ng + g] = LF ? group_sum_perm_any(b.gu_x + r * H + g * G, b.xp + r * H + g * G, G)
                          : group_sum_perm(b.gu_x + r * H + g * G, b.xp + r * H + g * G, G);
  }
}

/* PL (DGEMMA_ROUTE=gridp, mode 6, session 29; with LF 1): step 3 by ro_place (every table load in flight at once and
 * start[e] in the same trip, instead of rgr_place's two loads in flight per step: 8 dependent trips for block 63 of
 * the 26B's 64), and the last block's copy (step 2b) after its placement instead of before it. The same words. */
template <int JP, int LF = 0, int PL = 0>
__global__ void __launch_bounds__(RTK_WMAX * 32) route_gr_kernel(const float *part, int S, float *rlog,
                                                                 const float *pes, dg_cuda_moe_buf b, int T, int E,
                                                                 int K, int H) {
  DG_PDL_ENTRY();
  __shared__ rtk_rows sm;
  __shared__ int ecnt[ROUTE_EMAX], estart[ROUTE_EMAX + 1], etile[ROUTE_EMAX], pr[RTK_WMAX * 32], pre[RTK_WMAX * 32];
  __shared__ int last, ntiles;
  const int tid = threadIdx.x, bd = blockDim.x, PB = (bd >> 5) * K, blk = blockIdx.x, nb = gridDim.x;
  int *gen = b.gsc, *tot = b.gsc + GR_TOT, *tab = b.gsc + GR_TOT + ROUTE_EMAX;
#ifndef DG_CUDA_EMU
  /* the generation before this block counts itself done: the last block raises it only after that */
  const int g0 = tid == 0 ? *(volatile int *)gen : 0;
#endif
  const int r = rtk_choose<JP>(sm, part, S, rlog, pes, b, T, E, K);
  if (tid < PB) pr[tid] = r;
  if (r >= 0) b.slot_row[(size_t)blk * PB + tid] = r; /* the rank, for the emulation's placement (overwritten) */
  for (int e = tid; e < E; e += bd) { /* this block's count of each expert */
    int c = 0;
    for (int q = 0; q < PB; q++) c += sm.sid[q] == e;
    tab[(size_t)blk * E + e] = c;
    if (c) atomicAdd(tot + e, c);
  }
  __threadfence(); /* the block's choices, ranks, counts and totals visible device-wide before it counts itself done */
  __syncthreads();
  if (tid == 0) last = atomicAdd(b.done, 1) == nb - 1;
  __syncthreads();
  if (last) {
    __threadfence();
    for (int e = tid; e < E; e += bd) { /* the totals (every block's atomics came before its count), zeroed */
      ecnt[e] = __ldcg(tot + e);
      tot[e] = 0;
    }
    __syncthreads();
    rtk_write_groups(ecnt, estart, etile, &ntiles, b, E);
    __threadfence(); /* start (and the rest) visible device-wide before the generation moves */
    __syncthreads();
    if (tid == 0) {
      *b.done = 0;
      atomicAdd(gen, 1); /* wraps on the device: only compared for a change */
    }
  }
  /* 2b (H 0: none); PL: the last block makes its copy after its placement */
  if (H > 0 && !(PL && last)) rgr_prep_rows<LF>(b, blk * (bd >> 5), min(bd >> 5, T - blk * (bd >> 5)), H);
#ifdef DG_CUDA_EMU
  if (!last) return;
  for (int bb = 0; bb < nb; bb++) { /* step 3 for every block in turn, its experts and ranks read back */
    __syncthreads(); /* the previous block's reads of pr, sid */
    if (tid < PB) {
      const int i = bb * PB + tid, ok = i < T * K;
      sm.sid[tid] = ok ? __ldcg(b.topk_idx + i) : -1;
      pr[tid] = ok ? __ldcg(b.slot_row + i) : -1;
    }
    __syncthreads();
    if (PL) ro_place(b, tab, sm.sid, pr, pre, bb, bb * (bd >> 5), PB, E, K);
    else rgr_place(b, tab, sm.sid, pr, pre, bb, E, PB);
  }
  if (PL && H > 0) rgr_prep_rows<LF>(b, blk * (bd >> 5), min(bd >> 5, T - blk * (bd >> 5)), H);
#else
  if (!last && tid == 0) {
    while (*(volatile int *)gen == g0) __nanosleep(100);
    __threadfence();
  }
  __syncthreads();
  if (PL) {
    ro_place(b, tab, sm.sid, pr, pre, blk, blk * (bd >> 5), PB, E, K);
    if (last && H > 0) rgr_prep_rows<LF>(b, blk * (bd >> 5), min(bd >> 5, T - blk * (bd >> 5)), H);
  } else {
    rgr_place(b, tab, sm.sid, pr, pre, blk, E, PB);
  }
#endif
}

/* Warps per block of route_gr_kernel (0: not covered): 4, or 8 where the table would overflow. */
static int route_gr_warps(int T, int E, int K) {
  if (T <= 0 || E <= 0 || E > ROUTE_EMAX || K <= 0 || K > 32 || K > E) return 0;
  for (int W = 4; W <= RTK_WMAX; W *= 2)
    if ((long)((T + W - 1) / W) * E <= GR_TAB) return W;
  return 0;
}

/* DGEMMA_ROUTE_COOP=1: route_gr_kernel through a cooperative launch (above); read once when the library loads. */
static int route_coop_from_env(void) { return dg_sw_get(DG_SW_ROUTE_COOP) == 1; }
static const int route_coop = route_coop_from_env();

/* Whether nb blocks of route_gr_kernel<JP> of W warps are resident at once on the current device (the grid-wide
 * wait's condition; cached per device, JP and W); with DGEMMA_ROUTE_COOP=1 also whether the device takes cooperative
 * launches (cudaDevAttrCooperativeLaunch). */
template <int JP, int LF = 0, int PL = 0> static int route_gr_resident(int nb, int W) {
#ifdef DG_CUDA_EMU
  (void)nb;
  (void)W;
  return 1;
#else
  static int cap[16][RTK_WMAX + 1]; /* blocks resident at once; 0: not yet asked */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16 || W < 1 || W > RTK_WMAX) return 0;
  int c = __atomic_load_n(&cap[dev][W], __ATOMIC_RELAXED);
  if (!c) {
    int per = 0, sms = 0, coop = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, route_gr_kernel<JP, LF, PL>, 32 * W, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        (route_coop && cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess))
      return 0;
    c = per * sms > 0 && coop ? per * sms : -1;
    __atomic_store_n(&cap[dev][W], c, __ATOMIC_RELAXED);
  }
  return nb <= c;
#endif
}

/* The launch of route_gr_kernel, or cudaErrorInvalidValue (nothing launched) where it does not cover the shape or
 * the grid would not be resident at once: the caller takes another mode. */
template <int JP, int LF = 0, int PL = 0>
static cudaError_t route_gr_launch(cudaStream_t s, const float *part, int S, float *rlog, const float *pes,
                                   const dg_cuda_moe_buf *b, int T, int E, int K, int W, int H) {
  const int nb = (T + W - 1) / W;
  if (!route_gr_resident<JP, LF, PL>(nb, W)) return cudaErrorInvalidValue;
  if (route_coop) DG_LAUNCH_COOP((route_gr_kernel<JP, LF, PL>), nb, 32 * W, 0, s)(part, S, rlog, pes, *b, T, E, K, H);
  else DG_LAUNCH((route_gr_kernel<JP, LF, PL>), nb, 32 * W, 0, s)(part, S, rlog, pes, *b, T, E, K, H);
  return cudaGetLastError();
}

/* H > 0 with b->gu_x and b->gu_group set: the gate/up input's copy and sums made too (b->gu_ready = b->gu_x);
 * lf: with route_gr_kernel<JP, 1> (its loads before its stores: DGEMMA_ROUTE=deep). */
static cudaError_t route_grid_h(cudaStream_t s, const float *part, int S, float *rlog, const float *pes,
                                dg_cuda_moe_buf *b, int T, int E, int K, int H, int lf = 0, int pl = 0) {
  const int W = route_gr_warps(T, E, K);
  if (!W || S < 1 || S > DG_ROUTER_MAX_SPLITS || !b->done || !b->gsc) return cudaErrorInvalidValue;
  const int G = b->gu_group;
  if (!b->gu_x || !b->xs || !b->xp || G <= 0 || G % 8 || H <= 0 || H % G ||
      ((uintptr_t)b->gu_x | (uintptr_t)b->xp) & 15)
    H = 0;
  cudaError_t e;
  if (pl) { /* DGEMMA_ROUTE=gridp: the copy's loads first, the placement in one trip, the last block's copy after it */
    if (E <= 32) e = route_gr_launch<1, 1, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 64) e = route_gr_launch<2, 1, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 128) e = route_gr_launch<4, 1, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else e = route_gr_launch<8, 1, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
  } else if (lf) {
    if (E <= 32) e = route_gr_launch<1, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 64) e = route_gr_launch<2, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 128) e = route_gr_launch<4, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else e = route_gr_launch<8, 1>(s, part, S, rlog, pes, b, T, E, K, W, H);
  } else {
    if (E <= 32) e = route_gr_launch<1>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 64) e = route_gr_launch<2>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else if (E <= 128) e = route_gr_launch<4>(s, part, S, rlog, pes, b, T, E, K, W, H);
    else e = route_gr_launch<8>(s, part, S, rlog, pes, b, T, E, K, W, H);
  }
  b->gu_ready = e == cudaSuccess && H > 0 ? b->gu_x : NULL;
  return e;
}

cudaError_t k_route_grid(cudaStream_t s, const float *part, int S, float *rlog, const float *pes, dg_cuda_moe_buf *b,
                         int T, int E, int K) {
  return route_grid_h(s, part, S, rlog, pes, b, T, E, K, 0);
}

/* Whether k_router_route's mode 3 covers the shape (and, on a GPU, the grid is resident at once). */
int k_router_grid_ok(int T, int E, int H, int K) {
  const int W = route_gr_warps(T, E, K);
  if (H <= 0 || H % 4 || !W) return 0;
  const int nb = (T + W - 1) / W;
  return E <= 32 ? route_gr_resident<1>(nb, W) : E <= 64 ? route_gr_resident<2>(nb, W)
         : E <= 128 ? route_gr_resident<4>(nb, W) : route_gr_resident<8>(nb, W);
}

/* ---- DGEMMA_ROUTE=one (mode 5, session 29): the whole router stage in one launch (issue 12 item 3) ----
 * router_one_kernel, on router_tile_kernel's grid (token tile tt of RT_T = 64 tokens, expert tile, split: 4 x 2 x 16
 * = 128 blocks of 256 threads at the 26B's shape), in four steps:
 *   1. every block: router_tile_body, the same tiles, micro-tiles and per-output chains (every split sum the same
 *      word as router_tile_kernel's), into ws; it counts itself into its token tile (gsc[RO_TCNT + tt]);
 *   2. every block, once the tile's nblk = (expert tiles x splits) blocks are counted (a wait on the blocks of its own
 *      tile only): the routing of its slot, P = ceil(64 / nblk) tokens of the tile (2 at the 26B's shape; at most
 *      RTK_WMAX, a warp per token, a block taking several slots where nblk < 8): rtk_choose (route_gr_kernel's split
 *      sums in split order, softmax, choices, weights; the split sums loaded from L2), its count of each expert into
 *      row q of the (slot, expert) table and the experts' totals; it counts itself done (b->done);
 *   3. the last block to finish only: route_gr_kernel's step 2 (totals, rtk_write_groups, the generation raised);
 *   4. every block: while it waits for the generation, the gate/up input's permuted copy and group sums of its
 *      slot's rows (rgr_prep_rows with the loads first, DGEMMA_ROUTE=deep's form: the same words); then its pairs
 *      placed (ro_place: start[e] + the pairs of e in earlier slots, every table load in flight at once, + rank);
 *      the last block places first and makes its copy after.
 * So every output word is mode 3's (and the chain's): the product's chains, the split order of the sums and
 * rtk_choose are the same functions; the grouping's integers are exact in any order. What changes is the stage's
 * shape: one launch instead of two (no drain of the product's grid and ramp of the routing's), the routing on 128
 * blocks of 2 tokens instead of 64 of 4, and two serial parts of route_gr_kernel's critical path made short: the
 * last block's copy (4 rows, G / 8 dependent load/store steps per group, before its placement) and the placement's
 * sum over the earlier blocks' rows (up to 16 rows per thread, two loads in flight: 8 dependent L2 trips).
 * The wait in step 2 (and 4) needs every block of the grid resident at once: launched only where the grid fits the
 * device (k_router_one_ok: grid <= SMs x occupancy, as route_gr_kernel; DGEMMA_ROUTE_COOP=1 a cooperative launch),
 * else mode 3. Limits: T <= 64 RO_TILES, (slots x E) <= GR_TAB (T <= 256 at 128 experts), H % 4 == 0, u and W 16-byte
 * aligned. The emulation runs blocks one after another: there the tile's last block routes (and copies) every slot
 * of its tile, and the last block places every slot in turn, with each slot's experts and ranks read back. */
#define RO_TCNT 1                   /* gsc[RO_TCNT + tt]: token tile tt's product blocks counted (0 between launches) */
#define RO_TILES (GR_TOT - RO_TCNT) /* token tiles per launch */

/* The route slots of a token tile of nblk product blocks: P tokens each, nslot of them. */
__host__ __device__ __forceinline__ void ro_slots(int nblk, int &P, int &nslot) {
  P = (RT_T + nblk - 1) / nblk;
  if (P > RTK_WMAX) P = RTK_WMAX;
  nslot = (RT_T + P - 1) / P;
}

/* Slot q (tokens t0 .. t0 + nt - 1): rtk_choose, each pair's rank into pr (shared) and slot_row (global, until the
 * placement), its count of each expert into tab row q and the totals. Every thread of the block calls it. */
template <int JP>
__device__ __forceinline__ void ro_route_slot(rtk_rows &sm, int *pr, const float *part, int S, float *rlog,
                                               const float *pes, const dg_cuda_moe_buf &b, int *tab, int *tot, int T,
                                               int E, int K, int q, int t0, int nt) {
  const int tid = threadIdx.x, bd = blockDim.x, PB = nt * K;
  const int r = rtk_choose<JP, 1>(sm, part, S, rlog, pes, b, T, E, K, t0, nt);
  if (tid < PB) pr[tid] = r;
  if (r >= 0) b.slot_row[(size_t)t0 * K + tid] = r;
  for (int e = tid; e < E; e += bd) {
    int c = 0;
    for (int p = 0; p < PB; p++) c += sm.sid[p] == e;
    tab[(size_t)q * E + e] = c;
    if (c) atomicAdd(tot + e, c);
  }
  __syncthreads(); /* sm.sid and pr are written again by the next slot */
}

/* The first token and the token count of route slot r of token tile tt (P tokens a slot, T tokens in all). */
__device__ __forceinline__ int ro_t0(int tt, int r, int P) { return tt * RT_T + r * P; }
__device__ __forceinline__ int ro_nt(int tt, int r, int P, int T) {
  return max(0, min(P, min(T, (tt + 1) * RT_T) - ro_t0(tt, r, P)));
}

/* Hc: the gate/up input's row length where the copy is made (b.gu_x, b.gu_group set), else 0. */
template <int JP>
__global__ void __launch_bounds__(RT_THREADS) router_one_kernel(const float *u, const float *Wr, float *part, int S,
                                                                int KS, float *rlog, const float *pes,
                                                                dg_cuda_moe_buf b, int T, int E, int K, int H, int Hc) {
  DG_PDL_ENTRY();
  __shared__ __align__(16) union {
    float prod[RT_STAGES][(RT_T + RT_E) * RT_K]; /* step 1's stages */
    rtk_rows r;                                  /* steps 2 and 4 */
  } sm;
  __shared__ int ecnt[ROUTE_EMAX], estart[ROUTE_EMAX + 1], etile[ROUTE_EMAX], pr[RTK_WMAX * 32], pre[RTK_WMAX * 32];
  __shared__ int last, ntiles;
  const int tid = threadIdx.x, bd = blockDim.x, tt = blockIdx.x, nblk = gridDim.y * gridDim.z;
  const int rb = blockIdx.z * gridDim.y + blockIdx.y, nb = gridDim.x * nblk;
  int P, nslot;
  ro_slots(nblk, P, nslot);
  int *gen = b.gsc, *tcnt = b.gsc + RO_TCNT, *tot = b.gsc + GR_TOT, *tab = b.gsc + GR_TOT + ROUTE_EMAX;
#ifndef DG_CUDA_EMU
  /* the generation before this block counts itself done: the last block raises it only after that */
  const int g0 = tid == 0 ? *(volatile int *)gen : 0;
#endif
  router_tile_body<RT_STAGES>(sm.prod, u, Wr, part, T, E, H, KS); /* step 1 */
  __threadfence(); /* this block's split sums visible device-wide before it counts itself into its tile */
  __syncthreads(); /* and every read of sm.prod done before sm.r is written */
#ifdef DG_CUDA_EMU
  (void)rb;
  if (tid == 0) last = atomicAdd(tcnt + tt, 1) == nblk - 1;
  __syncthreads();
  if (last) /* the tile's last block: every slot of the tile (step 2), and their copies (step 4's) */
    for (int r = 0; r < nslot; r++) {
      const int t0 = ro_t0(tt, r, P), nt = ro_nt(tt, r, P, T);
      ro_route_slot<JP>(sm.r, pr, part, S, rlog, pes, b, tab, tot, T, E, K, tt * nslot + r, t0, nt);
      if (Hc > 0 && nt > 0) rgr_prep_rows<1>(b, t0, nt, Hc);
    }
  __syncthreads(); /* last is written again below */
#else
  if (tid == 0) {
    atomicAdd(tcnt + tt, 1);
    while (*(volatile int *)(tcnt + tt) < nblk) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  for (int r = rb; r < nslot; r += nblk) /* step 2 */
    ro_route_slot<JP>(sm.r, pr, part, S, rlog, pes, b, tab, tot, T, E, K, tt * nslot + r, ro_t0(tt, r, P),
                      ro_nt(tt, r, P, T));
#endif
  __threadfence(); /* the slots' choices, ranks, counts and totals visible device-wide before the block counts done */
  __syncthreads();
  if (tid == 0) last = atomicAdd(b.done, 1) == nb - 1;
  __syncthreads();
  if (last) { /* step 3 */
    __threadfence();
    for (int e = tid; e < E; e += bd) { /* the totals (every block's atomics came before its count), zeroed */
      ecnt[e] = __ldcg(tot + e);
      tot[e] = 0;
    }
    for (int i = tid; i < (int)gridDim.x; i += bd) tcnt[i] = 0; /* every block is past its tile's wait */
    __syncthreads();
    rtk_write_groups(ecnt, estart, etile, &ntiles, b, E);
    __threadfence(); /* start (and the rest) visible device-wide before the generation moves */
    __syncthreads();
    if (tid == 0) {
      *b.done = 0;
      atomicAdd(gen, 1); /* wraps on the device: only compared for a change */
    }
  }
#ifdef DG_CUDA_EMU
  if (!last) return;
  for (int q = 0; q < (int)gridDim.x * nslot; q++) { /* step 4's placement of every slot, its pairs read back */
    const int tq = q / nslot, t0 = ro_t0(tq, q % nslot, P), PB = ro_nt(tq, q % nslot, P, T) * K;
    if (tid < PB) {
      sm.r.sid[tid] = __ldcg(b.topk_idx + (size_t)t0 * K + tid);
      pr[tid] = __ldcg(b.slot_row + (size_t)t0 * K + tid);
    }
    __syncthreads();
    ro_place(b, tab, sm.r.sid, pr, pre, q, t0, PB, E, K);
    __syncthreads();
  }
#else
  if (!last) {
    if (Hc > 0)
      for (int r = rb; r < nslot; r += nblk)
        if (ro_nt(tt, r, P, T) > 0) rgr_prep_rows<1>(b, ro_t0(tt, r, P), ro_nt(tt, r, P, T), Hc);
    if (tid == 0) {
      while (*(volatile int *)gen == g0) __nanosleep(32);
      __threadfence();
    }
  }
  __syncthreads();
  const int one = rb + nblk >= nslot; /* at most one slot: its experts and ranks still in sm.r.sid and pr */
  for (int r = rb; r < nslot; r += nblk) {
    const int t0 = ro_t0(tt, r, P), PB = ro_nt(tt, r, P, T) * K;
    if (!one) {
      if (tid < PB) {
        sm.r.sid[tid] = __ldcg(b.topk_idx + (size_t)t0 * K + tid);
        pr[tid] = __ldcg(b.slot_row + (size_t)t0 * K + tid);
      }
      __syncthreads();
    }
    ro_place(b, tab, sm.r.sid, pr, pre, tt * nslot + r, t0, PB, E, K);
  }
  if (last && Hc > 0)
    for (int r = rb; r < nslot; r += nblk)
      if (ro_nt(tt, r, P, T) > 0) rgr_prep_rows<1>(b, ro_t0(tt, r, P), ro_nt(tt, r, P, T), Hc);
#endif
}

/* Whether nb blocks of router_one_kernel<JP> are resident at once on the current device (route_gr_resident's test;
 * cached per device and JP). */
template <int JP> static int ro_resident(int nb) {
#ifdef DG_CUDA_EMU
  (void)nb;
  return 1;
#else
  static int cap[16]; /* blocks resident at once; 0: not yet asked */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return 0;
  int c = __atomic_load_n(&cap[dev], __ATOMIC_RELAXED);
  if (!c) {
    int per = 0, sms = 0, coop = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, router_one_kernel<JP>, RT_THREADS, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        (route_coop && cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess))
      return 0;
    c = per * sms > 0 && coop ? per * sms : -1;
    __atomic_store_n(&cap[dev], c, __ATOMIC_RELAXED);
  }
  return nb <= c;
#endif
}

/* router_one_kernel's grid for the shape, or 0 where mode 5 does not cover it (before residency); S and KS the
 * product's splits (router_parts'). */
static int ro_grid(int T, int E, int H, int K, dim3 *grid, int *S, int *KS) {
  if (T <= 0 || E <= 0 || E > ROUTE_EMAX || K <= 0 || K > 32 || K > E || H <= 0 || H % 4) return 0;
  const int s = router_splits(T, E, H), ntile = (T + RT_T - 1) / RT_T, nblk = (E + RT_E - 1) / RT_E * s;
  int P, nslot;
  ro_slots(nblk, P, nslot);
  if (ntile > RO_TILES || (long)ntile * nslot * E > GR_TAB) return 0;
  *grid = dim3(ntile, (E + RT_E - 1) / RT_E, s);
  *S = s;
  *KS = ((H + s - 1) / s + RG_K - 1) / RG_K * RG_K;
  return 1;
}

static int ro_fits(int E, int nb) {
  return E <= 32 ? ro_resident<1>(nb) : E <= 64 ? ro_resident<2>(nb)
         : E <= 128 ? ro_resident<4>(nb) : ro_resident<8>(nb);
}

int k_router_one_ok(int T, int E, int H, int K) {
  dim3 g;
  int S, KS;
  return ro_grid(T, E, H, K, &g, &S, &KS) && ro_fits(E, (int)(g.x * g.y * g.z));
}

template <int JP>
static void ro_launch(cudaStream_t s, dim3 g, const float *u, const float *W, float *ws, int S, int KS, float *rlog,
                      const float *pes, const dg_cuda_moe_buf *b, int T, int E, int K, int H, int Hc) {
  if (route_coop)
    DG_LAUNCH_COOP((router_one_kernel<JP>), g, RT_THREADS, 0, s)(u, W, ws, S, KS, rlog, pes, *b, T, E, K, H, Hc);
  else
    DG_LAUNCH((router_one_kernel<JP>), g, RT_THREADS, 0, s)(u, W, ws, S, KS, rlog, pes, *b, T, E, K, H, Hc);
}

cudaError_t k_router_one(cudaStream_t s, const float *u, const float *W, float *ws, float *rlog, const float *pes,
                         dg_cuda_moe_buf *b, int T, int E, int H, int K) {
  dim3 g;
  int S = 0, KS = 0;
  b->gu_ready = NULL;
  if ((((uintptr_t)u | (uintptr_t)W) & 15) || !b->done || !b->gsc || !ro_grid(T, E, H, K, &g, &S, &KS) ||
      !ro_fits(E, (int)(g.x * g.y * g.z)))
    return cudaErrorInvalidValue;
  const int G = b->gu_group;
  int Hc = H; /* the gate/up input's copy: route_grid_h's conditions */
  if (!b->gu_x || !b->xs || !b->xp || G <= 0 || G % 8 || H % G || ((uintptr_t)b->gu_x | (uintptr_t)b->xp) & 15) Hc = 0;
  if (E <= 32) ro_launch<1>(s, g, u, W, ws, S, KS, rlog, pes, b, T, E, K, H, Hc);
  else if (E <= 64) ro_launch<2>(s, g, u, W, ws, S, KS, rlog, pes, b, T, E, K, H, Hc);
  else if (E <= 128) ro_launch<4>(s, g, u, W, ws, S, KS, rlog, pes, b, T, E, K, H, Hc);
  else ro_launch<8>(s, g, u, W, ws, S, KS, rlog, pes, b, T, E, K, H, Hc);
  const cudaError_t e = cudaGetLastError();
  b->gu_ready = e == cudaSuccess && Hc > 0 ? b->gu_x : NULL;
  return e;
}

/* router_tile_deep_kernel's dynamic shared memory allowed on the current device (once per device). */
static cudaError_t router_deep_attr(void) {
  static int done[16];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev >= 0 && dev < 16 && __atomic_load_n(&done[dev], __ATOMIC_RELAXED)) return cudaSuccess;
  e = cudaFuncSetAttribute(router_tile_deep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)(RT_DEEP * (RT_T + RT_E) * RT_K * sizeof(float)));
  if (e == cudaSuccess && dev >= 0 && dev < 16) __atomic_store_n(&done[dev], 1, __ATOMIC_RELAXED);
  return e;
}

cudaError_t k_router_tiles_product_v(cudaStream_t s, int version, const float *u, const float *W, float *ws, int T,
                                     int E, int H, int *S_out) {
  if (H <= 0 || H % 4 || (((uintptr_t)u | (uintptr_t)W) & 15)) return cudaErrorInvalidValue;
  const int S = router_splits(T, E, H);
  const int KS = ((H + S - 1) / S + RG_K - 1) / RG_K * RG_K; /* router_parts' splits */
  const dim3 grid((T + RT_T - 1) / RT_T, (E + RT_E - 1) / RT_E, S);
  if (version == 4) {
    const cudaError_t e = router_deep_attr();
    if (e != cudaSuccess) return e;
    DG_LAUNCH(router_tile_deep_kernel, grid, RT_THREADS, RT_DEEP * (RT_T + RT_E) * RT_K * sizeof(float), s)(u, W, ws, T,
                                                                                                          E, H, KS);
  } else {
    DG_LAUNCH(router_tile_kernel, grid, RT_THREADS, 0, s)(u, W, ws, T, E, H, KS);
  }
  *S_out = S;
  return cudaGetLastError();
}

cudaError_t k_router_tiles_product(cudaStream_t s, const float *u, const float *W, float *ws, int T, int E, int H,
                                   int *S_out) {
  return k_router_tiles_product_v(s, 0, u, W, ws, T, E, H, S_out);
}

cudaError_t k_router_logits(cudaStream_t s, const float *u, const float *W, float *rlog, int T, int E, int H,
                            float *ws) {
  float *part;
  const int S = router_parts(s, u, W, rlog, T, E, H, ws, &part);
  if (S > 1) {
    const int n = T * E;
    DG_LAUNCH(router_reduce_kernel, (n + 255) / 256, 256, 0, s)(part, rlog, n, S);
  }
  return cudaGetLastError();
}

cudaError_t k_router_route(cudaStream_t s, const float *u, const float *W, float *rlog, const float *per_expert_scale,
                           dg_cuda_moe_buf *b, int T, int E, int H, int K, float *ws, int mode) {
  const int rm = route_mode(mode), aligned = !(((uintptr_t)u | (uintptr_t)W) & 15);
  b->gu_ready = NULL;
  if (rm == 5 && aligned && b->gsc && b->done && k_router_one_ok(T, E, H, K)) /* one launch; else mode 3's path */
    return k_router_one(s, u, W, ws, rlog, per_expert_scale, b, T, E, H, K);
  if (rm >= 3 && aligned && b->gsc && k_router_grid_ok(T, E, H, K)) { /* 4: the deep product, the copy's loads first */
    int S = 0;
    cudaError_t e = k_router_tiles_product_v(s, rm == 4 ? 4 : 0, u, W, ws, T, E, H, &S);
    return e != cudaSuccess ? e : route_grid_h(s, ws, S, rlog, per_expert_scale, b, T, E, K, H, rm == 4, rm == 6);
  }
  if (rm >= 2 && k_router_tiles_ok(T, E, H, K) && aligned) { /* mode 3 where it does not cover the shape: 2 */
    int S = 0;
    cudaError_t e = k_router_tiles_product(s, u, W, ws, T, E, H, &S);
    return e != cudaSuccess ? e : k_route_tiles(s, ws, S, rlog, per_expert_scale, b, T, E, K);
  }
  if (!route_use_fused(mode, T, K)) {
    cudaError_t e = k_router_logits(s, u, W, rlog, T, E, H, ws);
    if (e == cudaSuccess) e = k_route_topk(s, rlog, per_expert_scale, b, T, E, K);
    if (e == cudaSuccess) e = k_group(s, b, T, E, K);
    return e;
  }
  float *part;
  const int S = router_parts(s, u, W, rlog, T, E, H, ws, &part);
  cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? e : route_fused(s, part, S, rlog, per_expert_scale, b, T, E, K);
}

cudaError_t k_route_topk(cudaStream_t s, float *rlog, const float *per_expert_scale, dg_cuda_moe_buf *b, int T, int E,
                         int K) {
  if (E > 32 * TOPK_PER || K > 32) return cudaErrorInvalidValue;
  DG_LAUNCH(topk_kernel, (T + 3) / 4, 128, 0, s)(rlog, per_expert_scale, b->topk_idx, b->topk_w, T, E, K);
  return cudaGetLastError();
}

cudaError_t k_route(cudaStream_t s, float *rlog, const float *per_expert_scale, dg_cuda_moe_buf *b, int T, int E,
                    int K, int mode) {
  if (route_mode(mode) >= 3 && b->gsc && k_router_grid_ok(T, E, 4, K)) /* the logits as one split */
    return k_route_grid(s, rlog, 1, rlog, per_expert_scale, b, T, E, K);
  if (route_mode(mode) >= 2 && route_tk_warps(T, E, K) > 0)
    return k_route_tiles(s, rlog, 1, rlog, per_expert_scale, b, T, E, K);
  if (!route_use_fused(mode, T, K)) {
    cudaError_t e = k_route_topk(s, rlog, per_expert_scale, b, T, E, K);
    if (e != cudaSuccess) return e;
    return k_group(s, b, T, E, K);
  }
  return route_fused(s, rlog, 1, rlog, per_expert_scale, b, T, E, K);
}

cudaError_t k_group(cudaStream_t s, dg_cuda_moe_buf *b, int T, int E, int K) {
  const int n = T * K;
  DG_LAUNCH(group_count_kernel, E, GROUP_THREADS, 0, s)(b->topk_idx, n, b->count);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  DG_LAUNCH(group_scan_kernel, 1, GROUP_THREADS, 0, s)(E, b->count, b->start, b->tiles, b->n_tiles, b->order);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  DG_LAUNCH(group_place_kernel, E, GROUP_THREADS, 0, s)(b->topk_idx, n, b->start, b->pairs, b->slot_row);
  return cudaGetLastError();
}

/* Load a [rows, TK] bf16 tile into shared memory (row stride TK + PADB):
 * element (r, kk) = src(r)[k0 + kk], zero outside [0, nrows) x [0, Kdim).
 * src(r) is the row pointer for tile row r (NULL when r is out of range). */
__device__ __forceinline__ void load_tile(bf16 *dst, int rows, const bf16 *const *rowp, int k0, int Kdim, int vec) {
  const bf16 zero = __float2bfloat16_rn(0.0f);
  if (vec) { /* Kdim % 8 == 0: 16-byte loads, a chunk of 8 is wholly inside or outside */
    for (int i = threadIdx.x; i < rows * (TK / 8); i += blockDim.x) {
      int r = i / (TK / 8), kk = (i % (TK / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (rowp[r] && k0 + kk < Kdim) {
        DG_ASSERT_ALIGNED(rowp[r] + k0 + kk, 16);
        v = *(const uint4 *)(rowp[r] + k0 + kk);
      }
      DG_ASSERT_ALIGNED(dst + r * (TK + PADB) + kk, 16);
      *(uint4 *)(dst + r * (TK + PADB) + kk) = v;
    }
  } else {
    for (int i = threadIdx.x; i < rows * TK; i += blockDim.x) {
      int r = i / TK, kk = i % TK;
      dst[r * (TK + PADB) + kk] = rowp[r] && k0 + kk < Kdim ? rowp[r][k0 + kk] : zero;
    }
  }
}

/* Grouped product tile kernel. Block = 4 warps over a TM x TN output tile of
 * one expert (warp w: rows 16*(w/2), cols 32*(w%2): two 16x16 fragments).
 * GATEUP = 1: A rows are xe[token of pair], Kdim = H; two weight tiles (gate
 *   rows e*2IE + n, up rows e*2IE + IE + n); epilogue h = bf16(gelu(g) * u).
 * GATEUP = 0: A rows are h[grouped row], Kdim = IE; weight rows e*H + n;
 *   epilogue y = acc (fp32). */
template <int GATEUP>
__global__ void __launch_bounds__(128) grouped_kernel(const bf16 *A, const bf16 *W, const int32_t *tiles,
                                                      const int32_t *n_tiles, const int32_t *count,
                                                      const int32_t *start, const int32_t *pairs, int K, int Kdim,
                                                      int N, int IE, int H, bf16 *hout, float *yout) {
  DG_PDL_ENTRY();
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = tiles[2 * tile], r0 = tiles[2 * tile + 1], n0 = blockIdx.y * TN;
  const int cnt = count[e], base = start[e];
  __shared__ __align__(32) bf16 As[TM * (TK + PADB)];
  __shared__ __align__(32) bf16 Bg[TN * (TK + PADB)];
  __shared__ __align__(32) bf16 Bu[GATEUP ? TN * (TK + PADB) : 16];
  __shared__ __align__(32) float Cg[TM * (TN + PADF)];
  __shared__ __align__(32) float Cu[GATEUP ? TM * (TN + PADF) : 8];
  __shared__ const bf16 *arow[TM];
  __shared__ const bf16 *grow[TN];
  __shared__ const bf16 *urow[TN];
  for (int r = threadIdx.x; r < TM; r += blockDim.x) {
    int row = r0 + r;
    const bf16 *p = NULL;
    if (row < cnt) p = GATEUP ? A + (size_t)(pairs[base + row] / K) * Kdim : A + (size_t)(base + row) * Kdim;
    arow[r] = p;
  }
  for (int c = threadIdx.x; c < TN; c += blockDim.x) {
    int n = n0 + c;
    const bf16 *pg = NULL, *pu = NULL;
    if (n < N) {
      if (GATEUP) {
        pg = W + ((size_t)e * 2 * IE + n) * Kdim;
        pu = W + ((size_t)e * 2 * IE + IE + n) * Kdim;
      } else {
        pg = W + ((size_t)e * H + n) * Kdim;
      }
    }
    grow[c] = pg;
    urow[c] = pu;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, wr = (warp >> 1) * 16, wc = (warp & 1) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> accg[2], accu[2];
  for (int j = 0; j < 2; j++) {
    wmma::fill_fragment(accg[j], 0.0f);
    wmma::fill_fragment(accu[j], 0.0f);
  }
  const int vec = (Kdim % 8) == 0;
  for (int k0 = 0; k0 < Kdim; k0 += TK) {
    load_tile(As, TM, arow, k0, Kdim, vec);
    load_tile(Bg, TN, grow, k0, Kdim, vec);
    if (GATEUP) load_tile(Bu, TN, urow, k0, Kdim, vec);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
      wmma::load_matrix_sync(a, As + wr * (TK + PADB) + kk, TK + PADB);
#pragma unroll
      for (int j = 0; j < 2; j++) {
        /* B(k, n) = W[n][k]: the weight tile read column-major */
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(b, Bg + (wc + 16 * j) * (TK + PADB) + kk, TK + PADB);
        wmma::mma_sync(accg[j], a, b, accg[j]);
        if (GATEUP) {
          wmma::load_matrix_sync(b, Bu + (wc + 16 * j) * (TK + PADB) + kk, TK + PADB);
          wmma::mma_sync(accu[j], a, b, accu[j]);
        }
      }
    }
    __syncthreads();
  }
  for (int j = 0; j < 2; j++) {
    wmma::store_matrix_sync(Cg + wr * (TN + PADF) + wc + 16 * j, accg[j], TN + PADF, wmma::mem_row_major);
    if (GATEUP) wmma::store_matrix_sync(Cu + wr * (TN + PADF) + wc + 16 * j, accu[j], TN + PADF, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < TM * TN; i += blockDim.x) {
    int r = i / TN, c = i % TN, row = r0 + r, n = n0 + c;
    if (row >= cnt || n >= N) continue;
    float g = Cg[r * (TN + PADF) + c];
    if (GATEUP) {
      float a = g, u = Cu[r * (TN + PADF) + c];
      const float k = 0.7978845608028654f;
      float gl = 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
      hout[(size_t)(base + row) * IE + n] = __float2bfloat16_rn(gl * u);
    } else {
      yout[(size_t)(base + row) * H + n] = g;
    }
  }
}

/* Each of the two products runs the tensor-core kernels of qmoe.cu for an MLX
 * affine-quantized stack or a bf16 stack in lane records (qr_kernel, BITS 16),
 * else the bf16 WMMA kernel above (a bf16 stack whose columns are not a
 * multiple of 64); same grouped rows, same epilogues; the two stacks may
 * differ (e.g. 4-bit gate/up, 8-bit down). */
cudaError_t k_bexperts(cudaStream_t s, int gateup, const dg_cuda_w *W, const bf16 *x, dg_cuda_moe_buf *b, int T, int H,
                       int IE, int E, int K) {
  const int max_tiles = (T * K + TM - 1) / TM + E; /* sum over experts of ceil(count / TM) */
  if (gateup) {
    DG_LAUNCH(grouped_kernel<1>, dim3(max_tiles, (IE + TN - 1) / TN), 128, 0, s)(
        x, W->w, b->tiles, b->n_tiles, b->count, b->start, b->pairs, K, H, IE, IE, H, b->h, (float *)nullptr);
  } else {
    DG_LAUNCH(grouped_kernel<0>, dim3(max_tiles, (H + TN - 1) / TN), 128, 0, s)(
        x, W->w, b->tiles, b->n_tiles, b->count, b->start, b->pairs, K, IE, H, IE, H, (bf16 *)nullptr, b->y);
  }
  return cudaGetLastError();
}

/* DGEMMA_QE_NT=N (1, 2, 3, 4, 5 or 8): the quantized expert kernels' n-tiles (8 N tokens per pass over an
 * expert's weights) for every product instead of qe_nt's choice by the average rows per expert; read once. For
 * measuring the stacked batches' regime (an expert of more rows than 8 N streams its weights once per pass: more
 * passes at a smaller N, but more blocks per SM). */
static int qe_nt_from_env(void) { return (int)dg_sw_get(DG_SW_QE_NT); } /* 0 when unset (backend/switches.c) */
static const int qe_nt_env = qe_nt_from_env();

static cudaError_t experts_nt(cudaStream_t s, const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T,
                              int H, int IE, int E, int K, int nt) {
  const dg_cuda_w *gu = &l->experts_gate_up, *dn = &l->experts_down;
  int ran = 0; /* DGEMMA_EXPERTS_FG=1: gate/up and down in one launch where it applies (qmoe.cu) */
  cudaError_t e = k_qe_experts_fg(s, gu, dn, xe, b, T, H, IE, E, K, nt, &ran);
  if (e != cudaSuccess || ran) return e;
  b->hp_group = k_qe_dn_fuse_group(gu, dn, IE, b); /* DGEMMA_DN_FUSE=1: the down input's copy in gate/up's epilogue */
  e = gu->bits || gu->lay == DG_CUDA_LAY_LANES ? k_qe_gate_up(s, gu, xe, b, T, H, IE, E, K, nt)
                                              : k_bexperts(s, 1, gu, xe, b, T, H, IE, E, K);
  if (e != cudaSuccess) return e;
  return dn->bits || dn->lay == DG_CUDA_LAY_LANES ? k_qe_down(s, dn, b, T, H, IE, E, K, nt)
                                                  : k_bexperts(s, 0, dn, b->h, b, T, H, IE, E, K);
}

cudaError_t dg_cuda_experts(cudaStream_t s, const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H,
                            int IE, int E, int K) {
  return experts_nt(s, l, xe, b, T, H, IE, E, K, qe_nt_env);
}

cudaError_t dg_cuda_experts_nt(cudaStream_t s, const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T,
                               int H, int IE, int E, int K, int nt, int dq_from) {
  if (nt < 0 || nt > 8 || nt == 6 || nt == 7 || dq_from < -1 || dq_from > 8) return cudaErrorInvalidValue;
  qr_dq_set(dq_from);
  const cudaError_t e = experts_nt(s, l, xe, b, T, H, IE, E, K, nt);
  qr_dq_set(-1);
  return e;
}
