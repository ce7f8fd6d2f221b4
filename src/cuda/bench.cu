/* bench.cu: the grouped expert product timed alone on the GPU
 * (dg_cuda_bench_experts, backend.h), for `dgemma bench --protocol ceiling
 * --device cuda` (tools/ceiling.c): a stack of E experts in one format, the
 * caller's routing grouped once on the device (k_group), then calls of
 * dg_cuda_experts, the backend's real expert path (bf16 tensor cores or the
 * quantized kernels), each timed with cudaEvents after a write of
 * flush_bytes to a scratch buffer so that the weights come from HBM, not
 * from the L2 cache. Only dg_cuda_experts and k_group are called: whatever
 * kernels sit behind them are what is measured (with DGEMMA_EXPERTS_FG=1 the
 * one fused launch where it applies: the buffers carry its counters). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/qmoe_r.cuh"

#define BT 256

/* A 64-bit mix of (seed, i) (splitmix64 finaliser). */
__device__ __forceinline__ uint64_t bmix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* n random uint32 words (packed codes). */
__global__ void __launch_bounds__(BT) bfill_u32(uint32_t *p, size_t n, uint64_t seed) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = (uint32_t)bmix(seed, i);
}

/* n bf16 values of random sign and mantissa with the exponent bits `ex` (e.g.
 * 0x3f00: [0.5, 1), 0x3c00: [2^-7, 2^-6)). */
__global__ void __launch_bounds__(BT) bfill_bf16(uint16_t *p, size_t n, uint64_t seed, uint32_t ex) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = (uint16_t)(((uint32_t)bmix(seed, i) & 0x807fu) | ex);
}

/* The (scale, bias) words of n words of lane records (qmoe_r.cuh, compact
 * layout: warp stages of ws bytes, the codes of 32 lanes first (32 cb bytes),
 * then the pairs) set to bf16 pairs of random sign and mantissa with exponent
 * bits ex: random bits there would be NaN and infinity. */
__global__ void __launch_bounds__(BT) bfix_pairs(uint32_t *p, size_t n, int cb, int ws, uint64_t seed, uint32_t ex) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (i * 4 % (size_t)ws < 32 * (size_t)cb) continue;
    const uint32_t r = (uint32_t)bmix(seed, i);
    p[i] = (r & 0x807f807fu) | ex | (ex << 16);
  }
}

/* Overwrite n uint4 of the scratch buffer with v (evicts the L2). */
__global__ void __launch_bounds__(BT) bflush(uint4 *p, size_t n, uint32_t v) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = make_uint4(v, v + 1, v + 2, v + 3);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define BT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define BC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(e_ == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", \
                   __FILE__, __LINE__, #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); goto done; } } while (0)

/* cudaMalloc recorded in ptrs[*n] (freed together at the end). */
static dg_status balloc(void **ptrs, int *n, void **out, size_t bytes, const char *what) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
  if (e != cudaSuccess)
    return dg_seterr(e == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND,
                     "dg_cuda_bench_experts: cudaMalloc(%zu bytes) for %s failed: %s", bytes, what, cudaGetErrorString(e));
  ptrs[(*n)++] = p;
  *out = p;
  return DG_OK;
}

/* A random stack [rows, cols] in the format of a (bits 0: bf16) into *w. */
static dg_status bstack(void **ptrs, int *np, dg_cuda_w *w, int64_t rows, int64_t cols, int bits, int group,
                        int gateup, int64_t E, uint64_t seed, int grid, size_t *bytes) {
  memset(w, 0, sizeof *w);
  w->rows = rows;
  w->cols = cols;
  const size_t n = (size_t)rows * (size_t)cols;
  if (!bits && cols % qr_kc(QR_BF16_GROUP, 16) == 0) { /* the backend's lane records of bf16 weights (BITS 16) */
    w->lay = DG_CUDA_LAY_LANES;
    const qe_tiling tl = qe_tiling_of(QR_WARPS, qr_kc(QR_BF16_GROUP, 16), gateup, 16, QR_BF16_GROUP, 4, E, rows, cols);
    const size_t qbytes = qr_tile_bytes(tl);
    DG_TRY(balloc(ptrs, np, (void **)&w->q, qbytes, "bf16 expert lane records"));
    DG_LAUNCH(bfill_bf16, grid, BT, 0, 0)((uint16_t *)w->q, qbytes / 2, seed, 0x3c00u);
    CK(cudaGetLastError());
    *bytes += n * 2;
    return DG_OK;
  }
  if (!bits) {
    DG_TRY(balloc(ptrs, np, (void **)&w->w, n * 2, "bf16 expert stack"));
    DG_LAUNCH(bfill_bf16, grid, BT, 0, 0)((uint16_t *)w->w, n, seed, 0x3c00u);
    CK(cudaGetLastError());
    *bytes += n * 2;
    return DG_OK;
  }
  w->bits = bits;
  w->group = group;
  w->sb = DG_CUDA_BF16;
  const size_t words = n * (size_t)bits / 32, ng = n / (size_t)group;
  if (cols % qr_kc(group) == 0) { /* the backend's lane records (qmoe_r.cuh): random codes and pairs */
    w->lay = DG_CUDA_LAY_LANES;
    const qe_tiling tl = qe_tiling_of(QR_WARPS, qr_kc(group), gateup, bits, group, 4, E, rows, cols);
    const size_t qbytes = qr_tile_bytes(tl);
    DG_TRY(balloc(ptrs, np, (void **)&w->q, qbytes, "expert lane records"));
    DG_LAUNCH(bfill_u32, grid, BT, 0, 0)(w->q, qbytes / 4, seed);
    CK(cudaGetLastError());
    DG_LAUNCH(bfix_pairs, grid, BT, 0, 0)(w->q, qbytes / 4, qr_cb(bits, group), qr_wstage(bits, group, tl.cp), seed + 1,
                                          0x3a80u); /* +-[2^-10, 2^-9) */
    CK(cudaGetLastError());
    *bytes += words * 4 + 2 * ng * 2;
    return DG_OK;
  }
  /* expert stacks: codes and (scale, bias) pairs in the tile layout of qmoe.cuh (random bytes: any layout) */
  const qe_tiling tl = qe_tiling_of(QE_WARPS, QE_KC, gateup, bits, group, 4, E, rows, cols);
  size_t pbytes;
  const size_t qbytes = qe_tile_bytes(tl, &pbytes);
  DG_TRY(balloc(ptrs, np, (void **)&w->q, qbytes, "packed expert codes"));
  DG_TRY(balloc(ptrs, np, &w->sbp, pbytes, "expert scale/bias pairs"));
  DG_LAUNCH(bfill_u32, grid, BT, 0, 0)(w->q, qbytes / 4, seed);
  CK(cudaGetLastError());
  DG_LAUNCH(bfill_bf16, grid, BT, 0, 0)((uint16_t *)w->sbp, pbytes / 2, seed + 1, 0x3a80u); /* +-[2^-10, 2^-9) */
  CK(cudaGetLastError());
  *bytes += words * 4 + 2 * ng * 2;
  return DG_OK;
}

extern "C" dg_status dg_cuda_bench_experts(int device, const dg_cuda_bench_experts_args *a, dg_cuda_bench_result *out) {
  if (!a || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: NULL argument");
  memset(out, 0, sizeof *out);
  const int H = a->H, IE = a->IE, E = a->E, K = a->K, T = a->T;
  const int q = a->bits != 0;
  if (q && !(a->bits == 2 || a->bits == 3 || a->bits == 4 || a->bits == 6 || a->bits == 8))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: bits %d (0 = bf16, 2, 3, 4, 6, 8)", a->bits);
  if (q && !(a->group == 32 || a->group == 64 || a->group == 128))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: group %d (32, 64, 128)", a->group);
  if (H <= 0 || IE <= 0 || H % 64 || IE % 64 || (q && (H % a->group || IE % a->group)) || E <= 0 || K <= 0 || K > E ||
      T <= 0 || (int64_t)T * K > (1 << 26) || !a->idx)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: shapes H %d, IE %d (multiples of 64 and of the "
                     "group), E %d, K %d (1 <= K <= E), T %d (T K <= 2^26), idx %s", H, IE, E, K, T,
                     a->idx ? "given" : "NULL");
  if (a->reps < 1 || a->reps > 10000 || a->warmup < 0 || a->warmup > 10000 || a->flush_bytes < 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: reps %d (1..10000), warmup %d (0..10000), "
                     "flush_bytes %lld (>= 0)", a->reps, a->warmup, (long long)a->flush_bytes);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      const int32_t e = a->idx[(size_t)t * K + k];
      if (e < 0 || e >= E) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: expert id %d (token %d)", e, t);
      for (int j = 0; j < k; j++)
        if (a->idx[(size_t)t * K + j] == e)
          return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_bench_experts: token %d chose expert %d twice", t, e);
    }
  DG_TRY(dg_cuda_info(device, NULL, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  const int grid = 8 * (prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1);
  const size_t TK = (size_t)T * K, flush = a->flush_bytes ? ((size_t)a->flush_bytes + 15) / 16 : ((size_t)256 << 20) / 16;
  dg_status st = DG_OK;
  void *ptrs[40];
  int np = 0;
  cudaEvent_t e0 = NULL, e1 = NULL;
  double *t = (double *)malloc((size_t)a->reps * sizeof *t);
  float *yh = (float *)malloc(TK * H * sizeof(float));
  dg_cuda_layer l;
  memset(&l, 0, sizeof l);
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  void *xe = NULL, *fl = NULL;
  size_t wbytes = 0;
  if (!t || !yh) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  BC_(cudaEventCreate(&e0));
  BC_(cudaEventCreate(&e1));
  BT_(bstack(ptrs, &np, &l.experts_gate_up, (int64_t)E * 2 * IE, H, a->bits, a->group, 1, E, a->seed * 16 + 1, grid,
             &wbytes));
  BT_(bstack(ptrs, &np, &l.experts_down, (int64_t)E * H, IE, a->bits, a->group, 0, E, a->seed * 16 + 5, grid, &wbytes));
  BT_(balloc(ptrs, &np, &xe, (size_t)T * H * 2, "xe"));
  DG_LAUNCH(bfill_bf16, grid, BT, 0, 0)((uint16_t *)xe, (size_t)T * H, a->seed * 16 + 9, 0x3f00u);
  BC_(cudaGetLastError());
  BT_(balloc(ptrs, &np, &fl, flush * 16, "L2 flush buffer"));
  BT_(balloc(ptrs, &np, (void **)&b.topk_idx, TK * 4, "topk_idx"));
  BC_(cudaMemcpy(b.topk_idx, a->idx, TK * 4, cudaMemcpyHostToDevice));
  BT_(balloc(ptrs, &np, (void **)&b.count, (size_t)E * 4, "count"));
  BT_(balloc(ptrs, &np, (void **)&b.start, (size_t)(E + 1) * 4, "start"));
  BT_(balloc(ptrs, &np, (void **)&b.pairs, TK * 4, "pairs"));
  BT_(balloc(ptrs, &np, (void **)&b.slot_row, TK * 4, "slot_row"));
  BT_(balloc(ptrs, &np, (void **)&b.tiles, (TK + E) * 2 * 4, "tiles"));
  BT_(balloc(ptrs, &np, (void **)&b.n_tiles, 4, "n_tiles"));
  BT_(balloc(ptrs, &np, (void **)&b.order, (size_t)E * 4, "order"));
  BT_(balloc(ptrs, &np, (void **)&b.h, TK * IE * 2, "h"));
  BT_(balloc(ptrs, &np, (void **)&b.y, TK * H * 4, "y"));
  BT_(balloc(ptrs, &np, (void **)&b.xs, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) / 32 * 4, "group sums"));
  BT_(balloc(ptrs, &np, (void **)&b.xp, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) * 2, "permuted inputs"));
  BT_(balloc(ptrs, &np, (void **)&b.hs, TK * IE / 32 * 4, "down input group sums"));
  /* DGEMMA_EXPERTS_FG=1's counters (dg_moe_fg, common.cuh: at done + 1, zeroed once; every launch leaves them 0) */
  BT_(balloc(ptrs, &np, (void **)&b.done, (4 + (size_t)E) * 4, "the fused launch's block counters"));
  BC_(cudaMemset(b.done, 0, (4 + (size_t)E) * 4));
  b.fg_off = 1;
  BC_(k_group(0, &b, T, E, K));
  BC_(cudaDeviceSynchronize());
  for (int r = 0; r < a->warmup + a->reps; r++) {
    DG_LAUNCH(bflush, grid, BT, 0, 0)((uint4 *)fl, flush, (uint32_t)r);
    BC_(cudaGetLastError());
    BC_(cudaEventRecord(e0, 0));
    BC_(dg_cuda_experts(0, &l, (const bf16 *)xe, &b, T, H, IE, E, K));
    BC_(cudaEventRecord(e1, 0));
    BC_(cudaEventSynchronize(e1));
    float ms = 0;
    BC_(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= a->warmup) t[r - a->warmup] = ms;
  }
  BC_(cudaMemcpy(yh, b.y, TK * H * sizeof(float), cudaMemcpyDeviceToHost));
  {
    double s = 0;
    for (size_t i = 0; i < TK * H; i++) s += yh[i];
    out->out_sum = s;
    qsort(t, (size_t)a->reps, sizeof *t, cmp_d);
    const int R = a->reps;
    out->reps = R;
    out->min_ms = t[0];
    out->max_ms = t[R - 1];
    out->med_ms = R % 2 ? t[R / 2] : 0.5 * (t[R / 2 - 1] + t[R / 2]);
    out->weight_bytes = wbytes;
  }
done:
  for (int i = 0; i < np; i++) cudaFree(ptrs[i]);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  free(t);
  free(yh);
  return st;
}
