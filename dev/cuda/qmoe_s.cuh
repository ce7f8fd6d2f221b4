/* qmoe_s.cuh (lab, issue 11; measured slower, not in the backend): the quantized expert products with the expert's activations resident in shared
 * memory for the whole pass ("qs_kernel"), one block per expert, each warp streaming its weight stages
 * without a block barrier.
 *
 * Why: qr_kernel (src/cuda/qmoe_r.cuh) streams the weights straight into registers, but its blocks are small
 * (4 warps, one 128-row slab of an expert) and walk K through a 3-slot activation ring: every 128 codes a
 * block barrier, the next ring stage's cp.async copies (issued per thread), their waits and the slot
 * arithmetic. At the 256-token canvas (16 rows per expert on average) that overhead and the re-reads of the
 * activations (each of an expert's 11 gate/up slabs copies the same rows again: 1.4x the weight bytes through
 * L2 and shared memory) hold the products at 57 % (gate/up) and 47 % (down) of the roofline (H200 session 12:
 * 111.3 and 67.6 us), and the issue slots are the limit (session 4: ~495 instructions per two weight stages at 3
 * n-tiles, of which ~200 neither decode, fold nor multiply).
 *
 * What: a block of W warps serves one whole expert (grid = E blocks, in a.order: the largest experts first).
 * At the start of a pass it copies the pass's activation rows (all K columns, the permuted copy of
 * k_group_sums_perm, 8 NT rows, zero past the expert's rows) and their group sums ([group][token]) into shared
 * memory once: one commit, one wait, one barrier per pass. The expert's weight rows come in "tasks" of 32 rows:
 * task tau = slab tau / 4, warp-in-slab tau % 4 of the lane-record layout the backend already uploads
 * (qr_tile_pack with QR_WARPS = 4, the compact records), so no new layout; warp w takes the tasks w, w + W,
 * w + 2 W, ... and streams their weight stages as one flat sequence (D register stages deep, per-lane L2 line
 * prefetches |PF| stages ahead, both running on across task boundaries), storing each task's outputs
 * (qe_store: GeGLU for gate/up) when its last stage is folded. No barrier, no copy and no ring arithmetic in
 * the loop: per weight stage only the loads, the decode (qr_codes), the products (mma.m16n8k16 into the group's
 * partial sums), the B fragments (one 16-byte shared load per run and n-tile) and the exact per-group fold
 * (qr_fold: acc += s P' + (b - 128 s) S).
 *
 * Arithmetic: per output element the same products in the same order and the same fold as qr_kernel's body at
 * any tile count, so the outputs are bit-identical to qr_kernel's (the lab checks that against version 50, and
 * the CPU bound as for every version).
 *
 * Measured (H200, session 13, docs/results/h200-s13/call1_lab.md; every output bit-identical to version 50's):
 * no gain where qr_kernel's ring was supposed to cost (uniform M = 16 gate/up 104.6 us vs 103.1, down 58.3 vs
 * 62.7: 7 % faster; Nsight Compute: 59.3 M issued instructions for the gathered 256-token gate/up vs 55.2 M, the same 1.3-1.4
 * eligible warps per scheduler), and much slower on gathered canvases (T 256: gate/up 149-200 us vs 111.7, down
 * 79-109 vs 67.6), where one block per expert makes the expert with the most rows the whole kernel's time. The
 * ring and the activation re-reads were not what holds qr_kernel back: its decode, fold and product instructions
 * are. Faster only at uniform M = 32 (gate/up 151 vs 172 us, down 86 vs 106: 4 n-tiles in one pass), which the
 * gathered 512-token canvases lose again to the imbalance. Kept in the lab as the record (versions 80-87).
 *
 * Limits: group 64 (one group per 64-code stage), the compact layout; shared memory 8 NTM (2 K + 64) + 32 NTM
 * K / 64 bytes (NTM = the most n-tiles of a pass: 4 at K = 2816 is 187 KB), so the launcher takes it only while
 * that fits (the 256-token canvas: up to 32 rows per expert per pass; an expert with more takes more passes). */
#ifndef DG_CUDA_QMOE_S_CUH
#define DG_CUDA_QMOE_S_CUH

#include "cuda/qmoe_r.cuh"

/* Bytes per token row of the resident activations: 2 K + 64 (a row stride of 64 modulo 128: the 8 rows of a
 * B-fragment load land in distinct bank groups, as qr_xs). */
__host__ __device__ constexpr int qs_xs(int K) { return 2 * K + 64; }
/* Shared memory of a pass of ntok tokens over K columns (group 64): the activation rows, then the group sums. */
__host__ __device__ constexpr size_t qs_smem(int K, int ntok) {
  return (size_t)ntok * qs_xs(K) + (size_t)4 * ntok * (K / 64);
}

/* A warp's cursor over its flat sequence of weight stages (the stages of its tasks warp, warp + W, ...): p the
 * lane's piece of the current stage, s the stage within the task, i the task's index in the warp's list. */
struct qs_cursor {
  const unsigned char *p;
  int s, i;
};

/* One pass of the products of expert e over grouped rows [r0, r0 + mp) (mp <= 8 NT) with NT n-tiles. */
template <int BITS, int GATEUP, int NT, int W, int D, int PF>
__device__ __forceinline__ void qs_pass(const qe_args &a, unsigned char *smem, int e, int r0, int mp) {
  constexpr int GS = 64, KC = 64, RUNS = KC / 32, CB = 4 * RUNS * BITS, PSC = CB % 16 == 0 ? 16 : 8;
  constexpr int WSTAGE = qr_wstage(BITS, GS, 1), RW = qr_rec(BITS, GS) / 4, NTOK = 8 * NT, THREADS = 32 * W;
  __shared__ int64_t xrow[NTOK], srow[NTOK];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int K = a.Kdim, ng = K / GS, nst = K / KC, XS = qs_xs(K);
  const int nslab = GATEUP ? (a.N + 16 * QR_WARPS - 1) / (16 * QR_WARPS) : (a.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  const int ntask = (QR_WARPS * nslab - warp + W - 1) / W; /* this warp's tasks: warp + W i, i < ntask */
  const int64_t sstride = (int64_t)QR_WARPS * WSTAGE, slabbytes = (int64_t)nst * sstride;
  const unsigned char *qbase = (const unsigned char *)a.q + (int64_t)e * nslab * slabbytes + lane * PSC;
  auto task_ptr = [&](int i) {
    const int tau = warp + W * i;
    return qbase + (int64_t)(tau / QR_WARPS) * slabbytes + (int64_t)(tau % QR_WARPS) * WSTAGE;
  };
  auto advance = [&](qs_cursor &c) {
    c.p += sstride;
    if (++c.s == nst) {
      c.s = 0;
      c.i++;
      c.p = task_ptr(c.i);
    }
  };
  const int F = ntask > 0 ? ntask * nst : 0; /* the warp's weight stages */

  /* the first weight stages in flight before the activations are waited for (they do not depend on them) */
  uint32_t Wr[D][RW];
  qs_cursor lc = {task_ptr(0), 0, 0}, pc = lc;
  if constexpr (PF < 0) {
#pragma unroll
    for (int k = 0; k < -PF; k++)
      if (k < F) {
        qr_prefetch_lines<CB, 1, PSC>(pc.p, lane);
        advance(pc);
      }
  }
  auto wload = [&](uint32_t *R) {
    qr_ld_pieces<CB / PSC, PSC>(R, lc.p);
    const unsigned char *pp = lc.p - lane * PSC + 32 * CB + g * 16;
    const uint4 v = dg_ld_stream16(pp);
    R[CB / 4] = v.x; R[CB / 4 + 1] = v.y; R[CB / 4 + 2] = v.z; R[CB / 4 + 3] = v.w;
    advance(lc);
  };
#pragma unroll
  for (int d = 0; d < D - 1; d++)
    if (d < F) wload(Wr[d]);

  /* the pass's activations and group sums, resident for the whole pass */
  qe_pass_rows<GATEUP, NTOK, THREADS>(a, xrow, srow, r0, mp, ng, tid);
  __syncthreads();
  {
    const dg_sptr sb = dg_sp(smem);
    const int per = K / 8;
    for (int i = tid; i < NTOK * per; i += THREADS) {
      const int r = i / per, c = i - r * per;
      const int64_t xr = xrow[r];
      dg_cp_async16_sp(sb + r * XS + 16 * c, xr >= 0 ? a.X + xr + 8 * c : a.X, xr >= 0 ? 16 : 0);
    }
    const dg_sptr ss = sb + NTOK * XS;
    for (int i = tid; i < NTOK * ng; i += THREADS) { /* [group j][token r] */
      const int j = i / NTOK, r = i - j * NTOK;
      const int64_t sr = srow[r];
      dg_cp_async4_sp(ss + 4 * i, sr >= 0 ? a.xs + sr + j : a.xs, sr >= 0 ? 4 : 0);
    }
    dg_cp_commit();
    dg_cp_wait<0>();
  }
  __syncthreads();

  const unsigned char *xb = smem + g * XS + 16 * t;           /* the lane's B fragments, stage 0, n-tile 0 */
  const unsigned char *sums = smem + NTOK * XS; /* the group sums, [group][token] */
  float acc[2][NT][4], part[2][NT][4];
  uint32_t af[2][4] = {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}}; /* qr_fold's bias-product fragments: unused without BM */
  qe_zero(acc);
  qe_zero(part);
  int cs = 0, ci = 0; /* the computed stage and its task */

  auto compute = [&](const uint32_t *R) {
    const unsigned char *Xs = xb + cs * (2 * KC);
#pragma unroll
    for (int c = 0; c < RUNS; c++) {
      uint32_t bf[NT][4];
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const uint4 u = *(const uint4 *)(Xs + 8 * j * XS + 64 * c);
        bf[j][0] = u.x; bf[j][1] = u.y; bf[j][2] = u.z; bf[j][3] = u.w;
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++) {
        uint32_t pg[4], p8[4];
        qr_codes<BITS>(R, ((2 * mt) * RUNS + c) * BITS, pg);
        qr_codes<BITS>(R, ((2 * mt + 1) * RUNS + c) * BITS, p8);
        const uint32_t a0[4] = {pg[0], p8[0], pg[1], p8[1]}, a1[4] = {pg[2], p8[2], pg[3], p8[3]};
#pragma unroll
        for (int j = 0; j < NT; j++) {
          dg_mma_bf16(part[mt][j], a0, &bf[j][0]);
          dg_mma_bf16(part[mt][j], a1, &bf[j][2]);
        }
      }
    }
    /* the stage's group complete (one group per 64-code stage, its sums at [group][token]): qr_fold's non-BM fold,
     * acc += s P' + (b - OFF s) S, part = 0 */
    qr_fold<BITS, NT, GS, 1, 0, NTOK>(acc, part, af, R, nullptr, sums + 4 * NTOK * cs, RUNS - 1, cs, 0, ng, g, t, 0u);
    if (++cs == nst) { /* the task's last stage: its outputs, then the next task from zero */
      const int tau = warp + W * ci, slab = tau / QR_WARPS, wis = tau % QR_WARPS;
      const int valid = GATEUP ? 32 * min(QR_WARPS, (a.N - slab * 16 * QR_WARPS + 15) / 16)
                               : min(32 * QR_WARPS, a.N - slab * 32 * QR_WARPS);
      const bool mvalid[2] = {wis * 32 < valid, wis * 32 + 16 < valid};
      qe_store<GATEUP, NT, QR_WARPS>(a, acc, mvalid, r0, mp, slab, wis, g, t);
      qe_zero(acc);
      cs = 0;
      ci++;
    }
  };

  for (int f0 = 0; f0 < F; f0 += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int f = f0 + d;
      if (f < F) {
        if constexpr (PF < 0) {
          if (f - PF < F) {
            qr_prefetch_lines<CB, 1, PSC>(pc.p, lane);
            advance(pc);
          }
        }
        if (f + D - 1 < F) wload(Wr[(d + D - 1) % D]); /* the slot of stage f - 1, computed */
        compute(Wr[d]);
      }
    }
  }
}

/* The kernel: block b serves expert a.order[b] (or b), in passes of at most 8 NTM rows, each with the n-tiles
 * its rows need. */
template <int BITS, int GATEUP, int NTM, int W, int D, int PF>
__global__ void __launch_bounds__(32 * W, 1) qs_kernel(qe_args a) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  const int e = a.order ? a.order[blockIdx.x] : (int)blockIdx.x;
  const int cnt = a.count[e], base = a.start[e];
  for (int p0 = 0; p0 < cnt; p0 += 8 * NTM) {
    if (p0 > 0) __syncthreads(); /* every warp is done with the previous pass's activations */
    const int mp = min(8 * NTM, cnt - p0), nt = (mp + 7) / 8;
    if (nt <= 1) qs_pass<BITS, GATEUP, 1, W, D, PF>(a, smem, e, base + p0, mp);
    else if (nt == 2 || NTM < 3) qs_pass<BITS, GATEUP, (NTM < 2 ? 1 : 2), W, D, PF>(a, smem, e, base + p0, mp);
    else if (nt == 3 || NTM < 4) qs_pass<BITS, GATEUP, (NTM < 3 ? 1 : 3), W, D, PF>(a, smem, e, base + p0, mp);
    else qs_pass<BITS, GATEUP, NTM, W, D, PF>(a, smem, e, base + p0, mp);
  }
}

/* Launch qs_kernel over the E experts (grid E blocks); cudaErrorInvalidValue when the stack is not group 64 or
 * the pass does not fit in shared memory (the caller then takes qr_kernel). */
template <int BITS, int GATEUP, int NTM, int W, int D, int PF>
static cudaError_t qs_launch(cudaStream_t s, int E, const qe_args &a) {
  if (a.group != 64 || a.Kdim % 64) return cudaErrorInvalidValue;
  void (*kern)(qe_args) = qs_kernel<BITS, GATEUP, NTM, W, D, PF>;
  const size_t smem = qs_smem(a.Kdim, 8 * NTM);
#ifndef DG_CUDA_EMU
  static int room = -1; /* once per instantiation: the dynamic shared memory a block may take, and the attribute set */
  if (room < 0) {
    int dev = 0, optin = 0;
    cudaFuncAttributes fa;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kern);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes);
    if (e != cudaSuccess) return e;
    room = optin - (int)fa.sharedSizeBytes;
  }
  if (smem > (size_t)room) return cudaErrorInvalidValue;
#endif
  DG_LAUNCH(kern, E, 32 * W, smem, s)(a);
  return cudaGetLastError();
}

#endif
