/* qr_lm_lab.cuh: kernel lab versions 130-132 of the 4-bit g64 expert products at 32-128 rows per expert (session 28,
 * helper lm14; issues 12 and 14; docs/cuda.md "Session 28 (helper lm14)").
 *
 * qr_kernel (src/cuda/qmoe_r.cuh) takes one tile count per launch (qe_nt: by the average rows per expert) and runs an
 * expert's rows in passes of 8 NT tokens, one block per (expert, slab) looping over them; only an expert of at most
 * 8 NTS rows takes the smaller body. At 8 n-tiles (more than 32 rows per expert on average: a stacked batch pass, a
 * 1,024-token prefill) an expert of 65 rows runs two 64-token passes, the second with 1 real token of 64 columns, and
 * an expert of 32 rows at 5 n-tiles (uniform M 32) computes 40 columns. Both versions here run the same products and
 * folds on every real token column as version 50 (qr_diet_pass, the DIET loop: word for word the loop of qr_body,
 * test_quant_experts_diet), so every output word is version 50's; what changes is how many columns are computed and
 * how often a block streams its weights:
 *
 *   131 (FIT): version 50's grid and block order, each pass's body chosen by its own rows: passes of 64 tokens, the
 *       last one (or the only one) at the smallest tile count of {1, 2, 3, 4, 5, 6, 8} that holds its rows;
 *   130 (FIT + SPLIT): as 131, but one block per (expert, pass, slab) instead of a block looping over the expert's
 *       passes: the items in version 50's order (experts by descending count, each expert's passes, each pass's
 *       slabs one after another), so the blocks of an expert's passes run at the same time and read its weight
 *       stages from DRAM about once (the second reader finds them in L2) instead of once per pass, and no block runs
 *       more than one 64-token pass (the longest blocks of a gathered canvas are shorter). The grid is a bound on the
 *       items, (T K + 63 E) / 64 times the slabs (qr_lm_pairs = T K set by the caller); a block past the last item
 *       exits at once. Each block finds its item by a warp scan of the experts' pass counts in order.
 *
 * Registers and shared memory are those of the 8-tile body (one kernel holds the 7 bodies); launch bounds 1 block
 * per SM (the compiler's choice, as qr_kernel at 8 n-tiles: 2 blocks fit).
 *
 *   132: 130's items with 8 warps per block, two per weight warp, one per token half (qr_lm8_kernel, below), registers
 *       for 2 blocks per SM (16 warps); 133: the same kernel with registers for 1 block per SM (8 warps per SM, as
 *       version 50 at 8 n-tiles): 132 against 133 is the occupancy alone, the same source and words.
 *
 *   134-137 (session 29, helper wp11): version 50 with registers (and at 8 n-tiles a ring of 2 stages) for more warps
 *       per SM at 4-8 n-tiles (qr_occ_launch, at the end).
 *
 * Checked against version 50 word for word on the emulation by dev/cuda/qr_lm_emu.cpp, on the GPU by the lab. */
#ifndef DG_QR_LM_LAB_CUH
#define DG_QR_LM_LAB_CUH

#include "cuda/qmoe_r.cuh"

#define QR_LM_NTOK 64 /* tokens of a full pass: 8 n-tiles */

/* T K of the next qr_lm_launch (the split grid's bound on the items): set by the caller (the lab's run_lm, the
 * emulation check). */
static int qr_lm_pairs;

/* The smallest body of {1, 2, 3, 4, 5, 6, 8} n-tiles that holds mp tokens (1 <= mp <= 64). */
__host__ __device__ constexpr int qr_lm_tiles(int mp) { return mp > 48 ? 8 : (mp + 7) / 8; }

/* One pass of mp tokens (row0 their first grouped row) at NT n-tiles: qr_diet_pass with the backend's 8-tile launch
 * choices (D, STAGES, SUB, line prefetches QR_PF ahead, compact records). */
template <int BITS, int GATEUP, int NT, int GS>
__device__ __forceinline__ void qr_lm_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                           const bool (&mvalid)[2], int row0, int mp, int slab,
                                           const unsigned char *wstage0, const unsigned char *wq, int nst, int nsa,
                                           int tid, unsigned char *smem) {
  qr_diet_pass<BITS, GATEUP, NT, GS, QR_WARPS, QR_D, QR_STAGES, QR_SUB, -QR_PF, 1>(
      a, xrow, srow, mvalid, row0, mp, slab, wstage0, wq, nst, nsa, tid, smem);
}

/* The item of a split block (SPLIT): item number `item` in the order (experts by a.order, or 0..E - 1; each expert
 * ceil(count / 64) passes) as (*e, *p), or *e = -1 past the last item. Warp 0 scans the pass counts 32 experts at a
 * time (shuffles), lane 0 writes the result to sh; the caller synchronises. */
__device__ __forceinline__ void qr_lm_find(const qe_args &a, int E, int item, int *sh) {
  const int lane = threadIdx.x & 31;
  int before = 0, fe = -1, fp = 0;
  for (int c0 = 0; c0 < E; c0 += 32) {
    const int i = c0 + lane;
    const int ex = i < E ? (a.order ? a.order[i] : i) : 0;
    const int n = i < E ? (a.count[ex] + QR_LM_NTOK - 1) / QR_LM_NTOK : 0;
    int incl = n; /* inclusive prefix of the chunk's pass counts */
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_sync(0xffffffffu, incl, lane >= d ? lane - d : lane);
      if (lane >= d) incl += v;
    }
    const unsigned m = __ballot_sync(0xffffffffu, before + incl > item);
    if (m) { /* the first lane whose prefix passes item: its expert */
      const int l = __popc((m & (0u - m)) - 1u);
      fe = __shfl_sync(0xffffffffu, ex, l);
      fp = item - before - __shfl_sync(0xffffffffu, incl - n, l);
      break;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) {
    sh[0] = fe;
    sh[1] = fp;
  }
}

/* Versions 130 (SPLIT 1) and 131 (SPLIT 0): a 1-D grid, block lin = item * slabs + slab (item: an expert in version
 * 50's order for 131, an (expert, pass) for 130). */
template <int BITS, int GATEUP, int GS, int SPLIT>
__global__ void __launch_bounds__(32 * QR_WARPS, 1) qr_lm_kernel(qe_args a, int E, int slabs) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  constexpr int WARPS = QR_WARPS, THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, GU = GATEUP != 0;
  constexpr int KC = qr_kc(GS, BITS), WSTAGE = qr_wstage(BITS, GS, 1), PSC = qr_cb(BITS, GS) % 16 == 0 ? 16 : 8;
  __shared__ int64_t xrow[QR_LM_NTOK], srow[QR_LM_NTOK];
  __shared__ int sh[2];
  const int lin = blockIdx.x, slab = lin % slabs, item = lin / slabs;
  int e, pfirst, plast;
  if constexpr (SPLIT) {
    if (threadIdx.x < 32) qr_lm_find(a, E, item, sh);
    __syncthreads();
    e = sh[0];
    if (e < 0) return;
    pfirst = plast = sh[1];
  } else {
    if (item >= E) return;
    e = a.order ? a.order[item] : item;
    pfirst = 0;
    plast = 1 << 30;
  }
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + QR_SUB - 1) / QR_SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * slabs + slab, sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  for (int p = pfirst; p <= plast && p * QR_LM_NTOK < cnt; p++) {
    const int p0 = p * QR_LM_NTOK, mp = min(QR_LM_NTOK, cnt - p0);
    if (p > pfirst) __syncthreads(); /* (qr_diet_pass ends with a barrier before its epilogue: no warp reads the row
                                      * table after it, so this one only orders the epilogue's shared tile, if any) */
    qe_pass_rows<GU, QR_LM_NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    const int r0 = base + p0;
#define QR_LM_PASS(NT) \
  qr_lm_pass<BITS, GATEUP, NT, GS>(a, xrow, srow, mvalid, r0, mp, slab, wstage0, wq, nst, nsa, tid, smem)
    switch (qr_lm_tiles(mp)) {
    case 1: QR_LM_PASS(1); break;
    case 2: QR_LM_PASS(2); break;
    case 3: QR_LM_PASS(3); break;
    case 4: QR_LM_PASS(4); break;
    case 5: QR_LM_PASS(5); break;
    case 6: QR_LM_PASS(6); break;
    default: QR_LM_PASS(8); break;
    }
#undef QR_LM_PASS
  }
}

/* Version 132: 130's items (one block per (expert, pass, slab)) with 8 warps per block instead of 4: warp w computes
 * the rows of weight warp rw = w mod 4 (its lane records, loaded by both warps of a pair: the second read finds the
 * bytes in L1 or L2) against token half th = w / 4 of the 64-token pass (tokens 32 th .. 32 th + 31), n-tiles
 * 4 th .. 4 th + 3 of the ring slot, at the smallest of 1-4 n-tiles that holds its tokens (none: the warp only copies
 * and waits at the barriers). Why (docs/cuda.md, session 28 lm14): at 8 n-tiles qr_kernel's ~240 registers leave 2
 * blocks of 4 warps per SM, and at uniform M 64 the SM then issues ~0.3 instructions per clock per scheduler with the
 * tensor pipe under half busy: latency-bound. Here each thread holds 4 n-tiles' sums (registers for 2 blocks of 8
 * warps: 16 warps per SM) for the same 64 tokens per weight pass. The same qr_run_mma and qr_fold_group calls in the
 * same order on every (row, token) as version 50: every output word is v50's. The loop is qr_body's tested one (no
 * FAST iterations). */
template <int BITS, int NT, int GS, int SUB, int NTR>
__device__ __forceinline__ void qr_lm_stage(float (&acc)[2][NT][4], float (&part)[2][NT][4], const uint32_t *R,
                                            dg_sptr xl, dg_sptr sl, int sub) {
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, CPG = GS / 32;
  constexpr int XS = qr_xs(GS, SUB, BITS);
  const dg_sptr xs = xl + 2 * KC * sub, ss = sl + 4 * NTR * GPS * sub; /* (the ring's rows: NTR tokens) */
#pragma unroll
  for (int c = 0; c < RUNS; c++) {
    uint32_t bf[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const uint4 u = dg_lds16(xs + 8 * j * XS + 64 * c);
      bf[j][0] = u.x; bf[j][1] = u.y; bf[j][2] = u.z; bf[j][3] = u.w;
    }
    qr_run_mma<BITS, NT, RUNS>(part, R, bf, c);
    if ((c + 1) % CPG == 0) {
      const int lg = c / CPG;
      float2 xsum[NT];
#pragma unroll
      for (int j = 0; j < NT; j++) xsum[j] = dg_lds8f(ss + 4 * (lg * NTR + 8 * j));
      qr_fold_group<BITS, NT, GS>(acc, part, R, lg, xsum);
    }
  }
}

/* Versions 138, 139 (session 29, helper wp11): the lean stage order, qr_lean_stage, moved into the backend in session
 * 31 (src/cuda/qmoe_r.cuh, with qr_lean_pass and qr_lean_kernel; lab version 139 is the backend's down product at 8
 * n-tiles since then, DGEMMA_QR_LAUNCH=lean). */

/* One 64-token pass of version 132 for a warp of NT n-tiles (0: copies and barriers only): the ring of 64 tokens
 * filled by the block's 256 threads (qr_xdiet), the warp's weight stages (rw's records, D register stages, line
 * prefetches QR_PF ahead), its products on its token half, its outputs stored (qe_store: rows row0 + 32 th). */
template <int BITS, int GATEUP, int NT, int GS, int THREADS = 256>
__device__ __forceinline__ void qr_lm_half_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                                const bool (&mvalid)[2], int row0, int mph, int slab,
                                                const unsigned char *wstage0, const unsigned char *wq, int nst, int nsa,
                                                int tid, int rw, int th, unsigned char *smem) {
  constexpr int D = QR_D, STAGES = QR_STAGES, SUB = QR_SUB, PF = -QR_PF, NTR = QR_LM_NTOK;
  constexpr int KC = qr_kc(GS, BITS), RW = qr_rec(BITS, GS) / 4, KA = SUB * KC, GPW = KC / GS;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTR * XS, STB = XB + qr_sbb(GS, SUB, NTR / 8, 0);
  constexpr int64_t sstride = (int64_t)QR_WARPS * qr_wstage(BITS, GS, 1);
  constexpr int NTA = NT > 0 ? NT : 1;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3, Kdim = a.Kdim;
  const dg_sptr sbase = dg_sp(smem);
  float acc[2][NTA][4], part[2][NTA][4];
  qe_zero(acc);
  qe_zero(part);
  qr_xdiet<GS, NTR, THREADS, KA, XS, XB, GPW, SUB> xc;
  xc.init(a, xrow, srow, tid);
  int islot = 0, icol = 0, cslot = 0;
  auto issue = [&]() {
    xc.template issue<false>(sbase + islot * STB, icol, Kdim, tid);
    islot = islot == STAGES - 1 ? 0 : islot + 1;
    icol += KA;
  };
#pragma unroll
  for (int sa = 0; sa < STAGES - 1; sa++) {
    if (sa < nsa) issue();
    dg_cp_commit();
  }
  uint32_t W[D][RW];
  const unsigned char *wnext = wq;
  if constexpr (NT > 0) {
    qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, nst, sstride);
#pragma unroll
    for (int d = 0; d < D - 1; d++)
      if (d < nst) {
        qr_load_stage<BITS, GS, 1, PF>(W[d], wnext, lane, g, d, nst, sstride);
        wnext += sstride;
      }
  }
  const dg_sptr xl0 = sbase + (32 * th + g) * XS + 16 * t, sl0 = sbase + XB + 4 * 32 * th + 8 * t;
  for (int it = 0; it < nst; it += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int s = it + d;
      if (s < nst) {
        if constexpr (NT > 0) {
          if (s + D - 1 < nst) {
            qr_load_stage<BITS, GS, 1, PF>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
            wnext += sstride;
          }
        }
        const int sub = D % SUB == 0 ? d % SUB : s % SUB;
        if (sub == 0) { /* activation stage s / SUB begins: its slot, its copies complete, the next issued */
          if (s > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
          dg_cp_wait<STAGES - 2>();
          __syncthreads();
          if (s / SUB + STAGES - 1 < nsa) issue();
          dg_cp_commit();
        }
        if constexpr (NT > 0)
          qr_lm_stage<BITS, NT, GS, SUB, NTR>(acc, part, W[d], xl0 + cslot * STB, sl0 + cslot * STB, sub);
      }
    }
  }
  dg_cp_wait<0>();
  __syncthreads(); /* every warp is done with the ring before the next pass refills it */
  if constexpr (NT > 0) qe_store<GATEUP, NTA, QR_WARPS>(a, acc, mvalid, row0, mph, slab, rw, g, t);
}

template <int BITS, int GATEUP, int GS, int MINB>
__global__ void __launch_bounds__(256, MINB) qr_lm8_kernel(qe_args a, int E, int slabs) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  constexpr int WARPS = QR_WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, GU = GATEUP != 0;
  constexpr int KC = qr_kc(GS, BITS), WSTAGE = qr_wstage(BITS, GS, 1), PSC = qr_cb(BITS, GS) % 16 == 0 ? 16 : 8;
  __shared__ int64_t xrow[QR_LM_NTOK], srow[QR_LM_NTOK];
  __shared__ int sh[2];
  const int lin = blockIdx.x, slab = lin % slabs, item = lin / slabs;
  if (threadIdx.x < 32) qr_lm_find(a, E, item, sh);
  __syncthreads();
  const int e = sh[0], p = sh[1];
  if (e < 0) return;
  const int cnt = a.count[e], base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, rw = warp & 3, th = warp >> 2, lane = tid & 31;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + QR_SUB - 1) / QR_SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = rw * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * slabs + slab, sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)rw * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  const int p0 = p * QR_LM_NTOK, mp = min(QR_LM_NTOK, cnt - p0), mph = min(32, max(0, mp - 32 * th));
  qe_pass_rows<GU, QR_LM_NTOK, 256>(a, xrow, srow, base + p0, mp, ng, tid);
  __syncthreads();
  const int row0 = base + p0 + 32 * th;
#define QR_LM_HALF(NT) \
  qr_lm_half_pass<BITS, GATEUP, NT, GS>(a, xrow, srow, mvalid, row0, mph, slab, wstage0, wq, nst, nsa, tid, rw, th, \
                                        smem)
  switch ((mph + 7) / 8) {
  case 0: QR_LM_HALF(0); break;
  case 1: QR_LM_HALF(1); break;
  case 2: QR_LM_HALF(2); break;
  case 3: QR_LM_HALF(3); break;
  default: QR_LM_HALF(4); break;
  }
#undef QR_LM_HALF
}

/* Launch version ver (130-133) of the 4-bit g64 products over E experts of `slabs` slabs (version 50's grid
 * (E, slabs)); qr_lm_pairs must hold the launch's T K. cudaErrorInvalidValue: not group 64, GATEUP HP or another
 * version. */
template <int BITS, int GATEUP>
static cudaError_t qr_lm_launch(int ver, cudaStream_t s, dim3 grid, const qe_args &a) {
  if (ver < 130 || ver > 133) return cudaErrorInvalidValue;
  const int split = ver != 131;
  constexpr int GS = 64, XB = QR_LM_NTOK * qr_xs(GS, QR_SUB, BITS), SBB = qr_sbb(GS, QR_SUB, 8, 0);
  if (a.group != GS || GATEUP == QR_GATEUP_HP) return cudaErrorInvalidValue;
  const int E = (int)grid.x, slabs = (int)grid.y;
  void (*kern)(qe_args, int, int) = ver == 132   ? qr_lm8_kernel<BITS, GATEUP, GS, 2>
                                    : ver == 133 ? qr_lm8_kernel<BITS, GATEUP, GS, 1>
                                    : split      ? qr_lm_kernel<BITS, GATEUP, GS, 1>
                                                 : qr_lm_kernel<BITS, GATEUP, GS, 0>;
  const size_t smem = (size_t)QR_STAGES * (XB + SBB);
  const int64_t items = split ? ((int64_t)qr_lm_pairs + (QR_LM_NTOK - 1) * (int64_t)E) / QR_LM_NTOK : E;
  if (items <= 0) return cudaSuccess;
#ifndef DG_CUDA_EMU
  if (smem > 48 * 1024) { /* (every call: three kernels share this launcher) */
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
#endif
  DG_LAUNCH(kern, dim3((unsigned)(items * slabs)), ver >= 132 ? 256 : 32 * QR_WARPS, smem, s)(a, E, slabs);
  return cudaGetLastError();
}

/* Versions 138, 139 (session 29, helper wp11): version 50 at 8 n-tiles with the lean stage order: the backend's
 * qr_lean_kernel since session 31 (src/cuda/qmoe_r.cuh: qr_kernel's grid (E, slabs) and block order, each expert's
 * rows in passes of 64 tokens, the 8-tile body or the 6-tile body for an expert of at most 48 rows, qr_lean_pass),
 * for gate/up and down. MINB: 3 (138: registers for 12 warps per SM; a ring of 3 stages, 62,976 bytes, lets 3
 * blocks) or 1 (139: version 50's occupancy, the lean order's own cost; the backend's down product at 8 n-tiles
 * under DGEMMA_QR_LAUNCH=lean, the default: then version 50's down rows at 8 n-tiles are 139's kernel too, and
 * DGEMMA_QR_LAUNCH=v50 gives version 50 its session-30 kernel back). Launch 138 or 139 over grid (E, slabs) at nt
 * n-tiles (qe_nt): the lean kernel in place of version 50's 8-tile kernel only (qr_launch_bits' default case);
 * below 8 n-tiles version 50's own kernels (qr_launch_bits), so those rows are a drift control. */
template <int BITS, int GATEUP>
static cudaError_t qr_lean_launch(int ver, cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if ((ver != 138 && ver != 139) || a.group != 64 || GATEUP == QR_GATEUP_HP) return cudaErrorInvalidValue;
  if (nt >= 1 && nt <= 5) return qr_launch_bits<BITS, GATEUP>(s, grid, nt, a);
  if constexpr (GATEUP == QR_GATEUP_HP) return cudaErrorInvalidValue;
  else return ver == 138 ? qr_launch_lean<BITS, GATEUP, 3>(s, grid, a) : qr_launch_lean<BITS, GATEUP, 1>(s, grid, a);
}

/* Versions 134-137 (session 29, helper wp11; docs/cuda.md "Session 29 (helper wp11)"): version 50 itself (qr_kernel,
 * the backend's launch choices, grid and block order, the same DIET loops) with more warps resident per SM at 4, 5 and
 * 8 n-tiles (more than 24 rows per expert on average), where version 50 caps nothing (MINB 1: 216-255 registers, 2
 * blocks of 4 warps per SM) and lm14's 132 against 133 measured the products latency-bound at 8 warps per SM. Only
 * the registers' cap (launch bounds) and, at 8 n-tiles, the activation ring's depth change: no arithmetic, so every
 * output word is version 50's. At 8 n-tiles the ring of 3 stages is 3 x (64 x 320 + 512) = 62,976 bytes of shared
 * memory per block, so 3 blocks fit in the H100's 227 KB and 4 do not; a 2-stage ring (41,984 bytes) lets 4 (or 5):
 *   134: registers for 3 blocks per SM (<= 168) at 4, 5, 8 n-tiles, ring 3: 12 warps per SM;
 *   135: registers for 4 blocks per SM (<= 128) at 4, 5, 8 n-tiles, ring 2 at 8 n-tiles: 16 warps per SM;
 *   136: 134 with ring 2 at 8 n-tiles (12 warps: 135 against 136 is 16 against 12 warps at the same ring);
 *   137: version 50's registers (MINB 1) with ring 2 at 8 n-tiles (8 warps: the ring's own cost, 136 against 137 is
 *        12 against 8 warps at the same ring, 134 against 50 the same at ring 3).
 * Up to 3 n-tiles every version is version 50 (qr_launch_bits). ptxas -v says the registers and spills of each
 * instance (the GPU call's ptxas.txt). */
template <int BITS, int GATEUP, int MB, int S8>
static cudaError_t qr_occ_nt(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  constexpr int L4 = qr_diet_at(4, QR_DIET_TILES, 0), L5 = qr_diet_at(5, QR_DIET_TILES, 0),
                L8 = qr_diet_at(8, QR_DIET_TILES, 0);
  switch (nt) { /* qr_launch_bits' cases 4, 5 and default with MINB MB (and ring S8 at 8 n-tiles) */
  case 1: case 2: case 3: return qr_launch_bits<BITS, GATEUP>(s, grid, nt, a);
  case 4: return qr_launch_nt<BITS, GATEUP, 4, QR_WARPS, QR_D, QR_STAGES, MB, -QR_PF, 3, MB, L4>(s, grid, a);
  case 5: return qr_launch_nt<BITS, GATEUP, 5, QR_WARPS, QR_D, QR_STAGES, MB, -QR_PF, 4, MB, L5>(s, grid, a);
  default: return qr_launch_nt<BITS, GATEUP, 8, QR_WARPS, QR_D, S8, MB, -QR_PF, 6, MB, L8>(s, grid, a);
  }
}

/* Launch version ver (134-137) at nt n-tiles (qe_nt, as version 50). cudaErrorInvalidValue: another version or
 * GATEUP HP (not instantiated here). */
template <int BITS, int GATEUP>
static cudaError_t qr_occ_launch(int ver, cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  if (GATEUP == QR_GATEUP_HP) return cudaErrorInvalidValue;
  switch (ver) {
  case 134: return qr_occ_nt<BITS, GATEUP, 3, QR_STAGES>(s, grid, nt, a);
  case 135: return qr_occ_nt<BITS, GATEUP, 4, 2>(s, grid, nt, a);
  case 136: return qr_occ_nt<BITS, GATEUP, 3, 2>(s, grid, nt, a);
  case 137: return qr_occ_nt<BITS, GATEUP, 1, 2>(s, grid, nt, a);
  default: return cudaErrorInvalidValue;
  }
}

#endif
