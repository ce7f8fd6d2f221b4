/* attention_wqc.cuh: att_wqc_kernel, version 15's block (att_wq_kernel<D, BK, VS, 2, 1, 0, 1>, attention_wq.cuh)
 * with its key splits merged inside a thread block cluster (version 16) and over several canvases in one launch
 * (versions 17 and 18), and its launch wqc_launch. Included by attention.cu (k_attention_any's versions 16 and 18,
 * k_attention_batch), the attention lab (dev/cuda/attention_lab.cuh) and the test support; device code for nvcc
 * (sm_90a: wgmma; clusters: sm_90) or the CPU emulation (dev/cuda_emu: emulated clusters, run_cluster). */
#ifndef DG_CUDA_ATTENTION_WQC_CUH
#define DG_CUDA_ATTENTION_WQC_CUH

#include "cuda/attention_wq.cuh"

/* ---- versions 16-18 (session 29, helper at12; issues 12 and 14): the key splits merged inside a cluster, and
 * one launch over a batch's canvases ----------------------------------------------------------------------------
 * (Built in the attention lab, dev/cuda/attention_lab.cuh, whose versions 16-18 these are; in src/cuda since session
 * 29 behind DGEMMA_ATTN=16 and 18 only, not yet measured on a GPU: k_attention_any's versions 16 and 18 and
 * k_attention_batch, attention.cu. The default stays 15.)
 *
 * Why (docs/cuda.md "Session 29 (helper at12)"): at the 26B's decoder rows version 15 spends, per sliding layer on an
 * H100 (session 25's --prof), 22.9 us in a block of which 5.4 us are the store of its split's fp32 partial (O 128 rows
 * x 256 fp32: 16.8 MB over the 4 splits of 128 blocks) and 7.1 us in fp_combine_kernel reading them back (the lab's
 * median 32.2 us = span 24.3 + combine 7.1 + ~1 launch): a third of the layer moves partials through L2 and a second
 * launch. At B = 4 stacked canvases the passes launch it B times (docs/cuda.md "Attention as one launch over the
 * stack's canvases"), each grid sized for one canvas and split 4 ways, where one grid over the B canvases fills the
 * 132 SMs with no split at all.
 *
 * Version 16: version 15's block (att_wq_kernel<D, BK, VS, 2, PRO 1, PROF 0, PVW 1>: the same tiles, products,
 * softmax and rounding, copied here as att_wqc_kernel) launched in thread block clusters of the n_split blocks of a
 * (row tile, KV head) (cluster shape (1, 1, n_split), sm_90; at most 8, the portable size): after its last tile each
 * block stages its rows' unnormalised O (fp32, rows D + 8 floats apart: conflict-free float2 stores) and (m, l) in its
 * own shared memory (the Q and K/V buffers, no longer read), barrier.cluster, then block z merges rows z, z + n_split,
 * ... of the tile reading the n_split blocks' staged rows through distributed shared memory (mapa, generic loads)
 * with fp_combine_kernel's arithmetic (fp_merge_row: the same operations in the same order on the same values), and
 * writes the bf16 output; a second barrier.cluster keeps every block's shared memory alive until the others have read
 * it. No partials in device memory, no combine launch. With the same split count as version 15 (the rule below gives
 * it at the 26B's decoder rows when the GPU fits the clusters in one wave) its output is version 15's word for word.
 * Version 17: version 16 over NB <= 8 canvases in one launch (grid (row tiles of the largest canvas, KV heads, canvases
 * x n_split); each canvas its own q, K/V cache, output, positions and rows: fa_args per canvas in one
 * __grid_constant__ parameter; blocks past a canvas's rows leave at once, their whole cluster with them). The split
 * count is one for the launch (cluster shape), chosen over all the canvases' blocks: at B = 4 canvases of 256 rows the
 * sliding layer's 128 blocks fill one wave unsplit (20 tiles each), so no merge at all. A canvas's words then depend
 * on the batch (its split count does), which issue 14's batch tests do not allow by default (a canvas in a stack =
 * its single run, word for word).
 * Version 18: version 17 with each canvas its own split count, the one wqc_splits gives that canvas alone (the
 * cluster the largest count; a canvas's blocks past its count get no key and stage (m -inf, l 0, O 0), which add exact
 * zeros to fp_merge_row's sums and leave its maximum; an unsplit canvas's block 0 stores directly, as 16 does): each
 * canvas's words are its single launch's (version 16's, so 15's where their splits agree) whatever the batch, at the
 * price of the merge per canvas (B = 4 at the sliding layer: 512 blocks in clusters of 4, four waves of 5 tiles).
 * Split rule (wqc_splits): fa_splits' estimate with slots per split count from the cluster occupancy
 * (cudaOccupancyMaxActiveClusters: a cluster's blocks share a GPC, so 4-block clusters at one block per SM may fit
 * fewer than 132 / 4) and a merge cost of WQC_MERGE_COST tiles for any split (staging + DSMEM reads: ~BM D 4 bytes per
 * block whatever the count). */
#ifndef DG_CUDA_EMU
__device__ __forceinline__ void dg_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* the generic address of p's shared-memory location in block `rank` of the cluster (PTX mapa, generic form) */
template <typename T> __device__ __forceinline__ const T *dg_cluster_map(const T *p, unsigned rank) {
  uint64_t r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"((uint64_t)p), "r"(rank));
  return (const T *)r;
}
#define DG_GRID_CONSTANT __grid_constant__
#else
static inline void dg_cluster_sync() { emu::cluster_sync(); }
template <typename T> static inline const T *dg_cluster_map(const T *p, unsigned rank) {
  return (const T *)emu::cluster_map(p, rank);
}
#define DG_GRID_CONSTANT
#endif

#define WQC_MAXB 8         /* canvases per launch (version 17) */
#define WQC_MAXS 8         /* splits: a portable cluster */
#define WQC_MERGE_COST 0.7 /* key tiles' time of the in-cluster merge, any split count > 1 */
template <int NB> struct wqc_args {
  fa_args a[NB]; /* per canvas; n_split: the canvas's own split count (<= ns) */
  int nb, ns;    /* canvases; the launch's split count (the cluster's size: blocks z = canvas ns + split) */
};

/* fp_merge_row's merge of row `row` (columns [c, c + 8)) from per-split staged rows: O of split z at o_z(z) (8
 * floats), (m, l) at ml_z(z); the same operations in the same order as fp_merge_row. */
template <typename FO, typename FM>
__device__ __forceinline__ void wqc_merge_row(FO o_z, FM ml_z, int n_split, bf16 *dst) {
  float M = -INFINITY;
  for (int z = 0; z < n_split; z++) M = fmaxf(M, ml_z(z)[0]);
  const float mu = M == -INFINITY ? 0.0f : M * FA_L2E;
  float L = 0.0f, acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int z = 0; z < n_split; z++) {
    const float2 mz = *(const float2 *)ml_z(z);
    const float *src = o_z(z);
    const float4 v0 = *(const float4 *)src, v1 = *(const float4 *)(src + 4);
    const float wz = exp2f(mz.x * FA_L2E - mu);
    L += wz * mz.y;
    acc[0] += wz * v0.x; acc[1] += wz * v0.y; acc[2] += wz * v0.z; acc[3] += wz * v0.w;
    acc[4] += wz * v1.x; acc[5] += wz * v1.y; acc[6] += wz * v1.z; acc[7] += wz * v1.w;
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  *(uint4 *)dst = make_uint4(fa_pack(acc[0] * inv, acc[1] * inv), fa_pack(acc[2] * inv, acc[3] * inv),
                             fa_pack(acc[4] * inv, acc[5] * inv), fa_pack(acc[6] * inv, acc[7] * inv));
}

/* Versions 16 (NB 1) and 17: att_wq_kernel<D, BK, VS, 2, 1, 0, 1>'s block, then the cluster merge (n_split > 1) or
 * fa_store (1). Grid (row tiles, NKV, canvases x n_split), cluster (1, 1, n_split). */
template <int D, int BK, int VS, int NB>
__global__ void __launch_bounds__(256, 1) att_wqc_kernel(const DG_GRID_CONSTANT wqc_args<NB> p) {
  DG_PDL_ENTRY();
  typedef wq_cfg<D, BK, VS, 2> C;
  constexpr int BM = C::BM, DV = C::DV, NT = BK / 8, OS = D + 8; /* OS: the staged O's row stride in floats */
  static_assert(BM * OS * 4 + BM * 8 <= C::SMEM - 1024, "att_wqc_kernel: the staged O fits the Q and K/V buffers");
  const int ns = p.ns, c = NB == 1 ? 0 : (int)blockIdx.z / ns, z = (int)blockIdx.z % ns;
  const fa_args &a = p.a[c];
  const int G = a.NH / a.NKV, R = a.nq * G, r0 = blockIdx.x * BM, g = blockIdx.y, nsc = a.n_split;
  if (r0 >= R) return; /* a canvas with fewer rows than the largest: the cluster (same x, y, canvas) leaves whole */
  if (nsc == 1 && z > 0) return; /* the canvas unsplit (version 18, beside split canvases): block 0 stores, no merge */
  DG_DYN_SMEM16(wq_raw);
  char *sm = (char *)wq_raw + ((1024u - (dg_smem_addr(wq_raw) & 1023u)) & 1023u);
  char *Qs = sm, *Ks = sm + C::QB, *Vs = Ks + 2 * C::KB;
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, wg = w >> 2, wq = w & 3;
  const int mrow = VS == 1 ? 64 * wg : 0, dv0 = VS == 1 ? 0 : wg * DV;
  int blo, bhi;
  fa_range(a, r0, G, BM, &blo, &bhi);
  const int nt_all = (bhi - blo + BK - 1) / BK, per = (nt_all + nsc - 1) / nsc; /* the canvas's own splits: blocks
                                                                                   z >= nsc get no key (m -inf, l 0) */
  const int zlo = blo + z * per * BK, zhi = min(bhi, zlo + per * BK);
  const int ntile = zhi > zlo ? (zhi - zlo + BK - 1) / BK : 0;
  const bf16 *kg = a.kc + (size_t)g * a.S * D, *vg = a.vc + (size_t)g * a.S * D;

  auto load_kv = [&](int it, int buf) {
    const int kb = zlo + it * BK, sb = kb % a.S;
    char *kd = Ks + buf * C::KB, *vd = Vs + buf * C::KB;
    for (int i = tid; i < BK * (D / 8); i += C::NTH) {
      const int r = i / (D / 8), ch = i % (D / 8), ok = kb + r < zhi;
      int sl = sb + r;
      sl -= sl >= a.S ? a.S : 0;
      const size_t src = (size_t)(ok ? sl : sb) * D + ch * 8;
      const int dst = wq_at<BK>(r, ch);
      dg_cp_async16(kd + dst, kg + src, ok ? 16 : 0);
      dg_cp_async16(vd + dst, vg + src, ok ? 16 : 0);
    }
  };

  float o[DV / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < DV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  const int R_first = r0 / G, R_last = (min(r0 + BM, R) - 1) / G;
  const int rl = mrow + 16 * wq + (lane >> 2);
  const uint32_t qa = dg_smem_addr(Qs) + (uint32_t)mrow * 128u, ka = dg_smem_addr(Ks);

  if (ntile > 0) load_kv(0, 0);
  dg_cp_commit();
  wq_load_q<D, BM, C::NTH>(a, Qs, r0, R, G, g, tid);
  for (int it = 0; it < ntile; it++) {
    const int buf = it & 1, kb = zlo + it * BK;
    dg_cp_wait<0>();
    dg_fence_proxy_async();
    __syncthreads();
    if (it + 1 < ntile) load_kv(it + 1, buf ^ 1);
    dg_cp_commit();
    float s[NT][4];
    wq_qk<D, BM, BK, C::KB>(s, qa, ka, buf);
    fa_mask<BK>(a, s, kb, zhi, (r0 + rl) / G, (r0 + rl + 8) / G, R_first, R_last, lane);
    uint32_t pa[BK / 16][4];
    fa_softmax<DV, BK>(s, m, l, o, pa);
    const char *vt = Vs + buf * C::KB;
    wq_pv<DV, BK>(o, pa, vt, dv0);
  }
  if (nsc == 1) { /* no split: the rows' output (n_split 1: fa_store normalises and stores bf16) */
    fa_store<D, DV>(a, o, m, l, r0, rl, R, G, g, dv0, 0, lane);
    return;
  }
  /* the split's partial, staged in this block's shared memory as fa_store would store it in device memory */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  float *Os = (float *)sm, *ML = Os + BM * OS;
  __syncthreads(); /* every warpgroup's last wgmmas (reading Q, K, V) retired: the buffers are free */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = rl + 8 * i;
    float *dst = Os + r * OS + dv0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < DV / 8; j++) *(float2 *)(dst + 8 * j) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
    if (dv0 == 0 && (lane & 3) == 0) *(float2 *)(ML + 2 * r) = make_float2(m[i], l[i]);
  }
  dg_cluster_sync(); /* every split's rows staged, visible to the cluster */
  constexpr int TPR = D / 8; /* threads per row, 8 columns each */
  for (int r = z + ns * (tid / TPR); r < BM; r += ns * (C::NTH / TPR)) {
    const int gr = r0 + r, col = 8 * (tid % TPR);
    if (gr >= R) break;
    const size_t orow = (size_t)(gr / G) * a.NH + g * G + gr % G;
    const float *orow_s = Os + r * OS + col, *ml_s = ML + 2 * r;
    wqc_merge_row([&](int zz) { return dg_cluster_map(orow_s, (unsigned)zz); },
                  [&](int zz) { return dg_cluster_map(ml_s, (unsigned)zz); }, ns, a.out + orow * D + col);
  }
  dg_cluster_sync(); /* no block leaves while another may still read its shared memory */
}

/* The split count of a wqc launch of `blocks` blocks per split over `tiles` key tiles (fa_splits' estimate, waves x
 * tiles per split, with slots[ns] blocks resident at once for ns splits and WQC_MERGE_COST for any split). */
static inline int wqc_splits(int blocks, int tiles, const int *slots) {
  int best = 1;
  double tbest = (double)((blocks + slots[1] - 1) / slots[1]) * tiles;
  for (int ns = 2; ns <= WQC_MAXS && ns <= tiles / 2; ns++) {
    if (slots[ns] < ns) continue;
    const double t = (double)((blocks * ns + slots[ns] - 1) / slots[ns]) * ((tiles + ns - 1) / ns) + WQC_MERGE_COST;
    if (t < tbest) { tbest = t; best = ns; }
  }
  return best;
}

/* att_wqc_kernel<D, BK, VS, NB>'s blocks resident at once per split count ns (slots[ns], ns 1..WQC_MAXS; a cluster
 * count from cudaOccupancyMaxActiveClusters times ns, 0 where no such cluster fits), computed once per instantiation;
 * the kernel's shared-memory attribute set on the way. NULL if the attribute call fails. */
template <int D, int BK, int VS, int NB> static const int *wqc_slots() {
  typedef wq_cfg<D, BK, VS, 2> C;
  void (*kern)(wqc_args<NB>) = att_wqc_kernel<D, BK, VS, NB>;
  static int slots[WQC_MAXS + 1] = {0};
  if (!slots[1]) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM) != cudaSuccess) return NULL;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, C::NTH, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
    for (int ns = 2; ns <= WQC_MAXS; ns++) {
#ifndef DG_CUDA_EMU
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = (unsigned)ns;
      cfg.gridDim = dim3(1, 1, (unsigned)ns);
      cfg.blockDim = dim3(C::NTH);
      cfg.dynamicSmemBytes = C::SMEM;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int ncl = 0;
      if (cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg) != cudaSuccess) { (void)cudaGetLastError(); ncl = 0; }
      slots[ns] = ncl * ns;
#else
      slots[ns] = per_sm * sm_count() / ns * ns; /* the emulation: the GPU's 132 SMs, clusters anywhere */
#endif
    }
    slots[1] = per_sm * sm_count();
  }
  return slots;
}

/* One launch of att_wqc_kernel over nb canvases (a[0..nb), the same NH, NKV, D, causal, window in each); *ns_out: the
 * launch's split count (NULL: not asked). inv 0 (versions 16, 17): one split count for every canvas, chosen over all
 * the canvases' blocks; inv 1 (version 18): each canvas its own, the count wqc_splits gives that canvas alone (so its
 * words are those of its own single launch: a canvas's blocks past its count get no key, and their (m -inf, l 0, O 0)
 * add exact zeros to the merge; an unsplit canvas's block 0 stores directly), the launch's the largest. */
template <int D, int BK, int VS, int NB>
static cudaError_t wqc_launch(cudaStream_t s, const fa_args *a, int nb, int *ns_out = NULL, int inv = 0) {
  typedef wq_cfg<D, BK, VS, 2> C;
  if (nb < 1 || nb > NB) return cudaErrorInvalidValue;
  void (*kern)(wqc_args<NB>) = att_wqc_kernel<D, BK, VS, NB>;
  const int *slots = wqc_slots<D, BK, VS, NB>();
  if (!slots) return cudaErrorInvalidValue;
  wqc_args<NB> p;
  memset(&p, 0, sizeof p);
  int bx = 0, tiles = 0, nsi = 1;
  for (int i = 0; i < nb; i++) {
    const fa_args &x = a[i];
    if (x.NH != a[0].NH || x.NKV != a[0].NKV || x.causal != a[0].causal || x.window != a[0].window ||
        x.is_full != a[0].is_full)
      return cudaErrorInvalidValue;
    const int G = x.NH / x.NKV, R = x.nq * G;
    bx = max(bx, (R + C::BM - 1) / C::BM);
    int lo, hi; /* keys of the widest block before splitting (fa_choose_splits) */
    if (x.causal) { hi = x.pos0 + x.nq; lo = x.is_full ? 0 : max(0, x.pos0 + 1 - x.window); }
    else { hi = x.kv_hi; lo = x.is_full ? 0 : max(0, x.pos0 - (x.window - 1)); }
    const int ti = (hi - lo + BK - 1) / BK, bxi = (R + C::BM - 1) / C::BM;
    tiles = max(tiles, ti);
    p.a[i] = x;
    p.a[i].n_split = bxi > 0 ? wqc_splits(bxi * x.NKV, ti, slots) : 1; /* the canvas alone (inv) */
    nsi = max(nsi, p.a[i].n_split);
  }
  p.nb = nb;
  if (bx == 0) return cudaSuccess;
  const int ns = inv ? nsi : wqc_splits(bx * a[0].NKV * nb, tiles, slots);
  if (!inv)
    for (int i = 0; i < nb; i++) p.a[i].n_split = ns;
  p.ns = ns;
  if (ns_out) *ns_out = ns;
  const dim3 grid((unsigned)bx, (unsigned)a[0].NKV, (unsigned)(nb * ns));
#ifndef DG_CUDA_EMU
  cudaLaunchAttribute at[2];
  int na = 0;
  if (ns > 1) {
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = 1; at[na].val.clusterDim.y = 1; at[na].val.clusterDim.z = (unsigned)ns;
    na++;
  }
  if (dg_cuda_pdl) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(C::NTH);
  cfg.dynamicSmemBytes = C::SMEM;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = na;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, p);
  if (e != cudaSuccess) return e;
#else
  DG_LAUNCH_CLUSTER(kern, grid, C::NTH, C::SMEM, s, dim3(1, 1, (unsigned)ns))(p);
#endif
  return cudaGetLastError();
}

#endif
