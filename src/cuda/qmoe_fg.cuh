/* qmoe_fg.cuh: the quantized experts' gate/up and down products in one launch (qr_fg_kernel), work tickets in order
 * and a wait per down block on its expert's gate/up blocks (issue 11, lab version 114 of dev/cuda/moe_quant.cu, which
 * includes this file: the lab and the backend run the same kernel). The backend's with DGEMMA_EXPERTS_FG=1 (off by
 * default until a GPU has timed it: qmoe.cu k_qe_experts_fg); instantiated in qmoe_fg.cu (4-bit, group 64, 2 and 3
 * n-tiles). The bodies are qmoe_r.cuh's qr_body, so every output word is qr_kernel's with DGEMMA_DN_FUSE=1. */
#ifndef DG_CUDA_QMOE_FG_CUH
#define DG_CUDA_QMOE_FG_CUH

#include "cuda/qmoe_r.cuh"

/* Gate/up and down in one launch (qr_fg_kernel; lab version 114, session 26, helper fg11; the backend's with
 * DGEMMA_EXPERTS_FG=1, qmoe.cu k_qe_experts_fg), each down block starting as
 * soon as its expert's gate/up blocks are done, instead of version 50's two launches (the backend with
 * DGEMMA_DN_FUSE=1: gate/up's epilogue qr_store_hp writes h in the down product's fragment order and its group
 * sums, the words k_group_sums_perm would make; then down over them), where the down grid's first blocks wait at
 * griddepcontrol.wait for the whole gate/up grid, so gate/up's last round (2.67 rounds of 528 resident blocks at
 * the 26B's shapes: 27-29 % of its span with half the slots busy, session 25's timeline) leaves half the slots empty.
 *
 * Work tickets: a 1-D grid of E ngu + E ndn blocks (ngu, ndn: the slabs per expert of each product); thread 0 of a
 * block takes the next ticket from a global counter (atomicAdd) and shares it through shared memory. Tickets
 * 0 .. E ngu - 1 are the gate/up blocks in version 50's order (qr_block with a.order: the experts by descending row
 * count, each expert's slabs one after another), tickets E ngu .. the down blocks in the same expert order. A gate/up
 * block runs version 50's gate/up body with the HP epilogue (qr_body QR_GATEUP_HP, the 2-tile body for the small
 * experts at 3 n-tiles as qr_kernel), then every thread fences (__threadfence), the block meets at a barrier and
 * thread 0 counts the block on its expert's counter (done[e], atomicAdd): a release of the block's h and sums. A down
 * block of an expert with rows first waits (thread 0 spins on an acquire load of done[e] with __nanosleep until it
 * reaches ngu, then a barrier: the acquire and the barrier order every thread's later reads after the gate/up blocks'
 * writes), then runs version 50's down body (qr_body GATEUP 0) over h and the sums. The bodies are qr_body itself
 * (DIET 0, as version 50 at 2 and 3 n-tiles), the slab index formed from the ticket's slab count (qr_fg_tl::slabs)
 * instead of the grid's, so every product, fold and store is version 50's: h, the sums and y word for word.
 *
 * No deadlock, whatever order the hardware places blocks in: tickets are taken in order, so when a block holds down
 * ticket t every ticket below t, among them all E ngu gate/up tickets, is held by a block that is running or has
 * finished (a ticket is taken by a running block, which keeps its slot until it exits). A gate/up block never waits
 * on anything, so each finishes and counts itself; hence every done[e] reaches ngu and every wait ends. (The blocks'
 * own launch order is not used: blockIdx plays no part.) Experts without rows: their gate/up blocks return at once
 * and do not count (qr_body returns before its row table), their down blocks return without waiting.
 *
 * How the down body reads what gate/up wrote in the same launch: h by 16-byte cp.async.cg (dg_cp_async16_*: L2,
 * never an L1 line), the sums by 4-byte cp.async.ca (there is no 16-byte-aligned form for 11 sums a row at the 26B's
 * 704 / 64): ordered by thread 0's ld.acquire.gpu and the barrier after it (PTX memory model: causality order through
 * the release's fence + atomic, the acquire and bar.sync), which the hardware implements by invalidating the SM's L1 at
 * the acquire, so an L1 line of the sums fetched by an earlier block on that SM (another expert's rows in the same
 * 128-byte line) cannot be read stale afterwards. The row tables (a.pairs, count, start, order) were written before
 * the launch.
 *
 * Counters (ctr, 3 + E ints: the lab's qr_fg_ctr, the backend's dg_moe_fg): [0] the next ticket, [1] the
 * blocks finished, [2] an error flag (a wait that ran past ~1 s on the GPU, which then also traps: the launch fails
 * with cudaErrorLaunchFailure at the stream's next synchronization, so the outputs are never silently wrong; or on
 * the emulation a wait that found its expert's gate/up blocks not all counted: the host reads and clears it, the
 * lab's qr_fg_error, the backend's k_qe_experts_fg), [3 ..] done[e]. The last block to finish (its count of
 * finished blocks reads all but one) sets [0], [1] and every done[e] back to 0, after a fence: every other block has
 * then finished, so nothing reads them again in this launch, and the next launch (a CUDA graph's replay too) finds
 * them zero without a host memset. Zeroed once by the host when first allocated. */
#ifdef DG_CUDA_EMU
static inline int qr_fg_ld_acquire(const int *p) { return *p; }
static inline void qr_fg_nap(unsigned) {}
#else
__device__ __forceinline__ int qr_fg_ld_acquire(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void qr_fg_nap(unsigned ns) { __nanosleep(ns); }
#endif

/* qr_body's hooks for version 114: none but the slab count per expert (the grid is 1-D). */
struct qr_fg_tl : qr_tl_none {
  unsigned ns;
  __device__ __forceinline__ explicit qr_fg_tl(unsigned n) : ns(n) {}
  __device__ __forceinline__ unsigned slabs() const { return ns; }
};

/* One item of version 114: expert e's slab `slab` of a product of nslab slabs per expert, by qr_body as qr_kernel runs
 * it (DIET 0, no bias products, NZ 0; the NTS-tile body for an expert of at most 8 NTS rows). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF, int NTS>
__device__ __forceinline__ void qr_fg_item(const qe_args &a, unsigned char *smem, int e, int slab, int nslab) {
  const qr_fg_tl tl((unsigned)nslab);
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, qr_fg_tl>(a, smem, e, slab, tl);
      return;
    }
  }
  qr_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, 1, 0, 0, 0, 0, qr_fg_tl>(a, smem, e, slab, tl);
}

/* Thread 0 of a down block: wait until *c (its expert's gate/up blocks counted) reaches n. On the GPU an acquire
 * load per try, __nanosleep between tries (32 ns doubling to 256); past 2^22 tries (~1 s: a bug, never a legitimate
 * wait of a few us) it raises the error flag and traps (the launch fails: cudaErrorLaunchFailure at the next
 * synchronization, the outputs never used silently) rather than hang. On the emulation blocks run one after another
 * in ticket order, so every gate/up block of the expert has finished: a count short of n is the error at once. */
__device__ __forceinline__ void qr_fg_wait(const int *c, int n, int *err) {
#ifdef DG_CUDA_EMU
  if (qr_fg_ld_acquire(c) < n) *err = 1;
#else
  unsigned ns = 32;
  for (long tries = 0; qr_fg_ld_acquire(c) < n; tries++) {
    if (tries >= (1L << 22)) {
      atomicExch(err, 1);
      __trap();
    }
    qr_fg_nap(ns);
    if (ns < 256) ns *= 2;
  }
#endif
}

template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_fg_kernel(qe_args gu, qe_args dn, int E, int ngu, int ndn,
                                                                  int *ctr) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  __shared__ int ticket_s;
  const int tid = threadIdx.x, G = E * ngu;
  int *done = ctr + 3;
  if (tid == 0) ticket_s = atomicAdd(ctr, 1);
  __syncthreads();
  const int tk = ticket_s;
  if (tk < G) { /* gate/up: expert gu.order[tk / ngu]'s slab tk % ngu, h and its sums by the HP epilogue */
    const int e = gu.order[tk / ngu];
    qr_fg_item<BITS, QR_GATEUP_HP, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(gu, smem, e, tk % ngu, ngu);
    if (gu.count[e] > 0) {
      __threadfence(); /* this thread's h and sums visible device-wide before the count (the release) */
      __syncthreads();
      if (tid == 0) atomicAdd(done + e, 1);
    }
  } else { /* down: expert dn.order[d / ndn]'s slab d % ndn once its gate/up blocks are all counted */
    const int d = tk - G, e = dn.order[d / ndn];
    if (dn.count[e] > 0) {
      if (tid == 0) qr_fg_wait(done + e, ngu, ctr + 2);
      __syncthreads();
      qr_fg_item<BITS, 0, NT, GS, WARPS, D, STAGES, SUB, PF, NTS>(dn, smem, e, d % ndn, ndn);
    }
  }
  if (tid == 0) { /* the last block to finish sets the counters back to 0 for the next launch */
    __threadfence();
    if (atomicAdd(ctr + 1, 1) == G + E * ndn - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      for (int i = 0; i < E; i++) done[i] = 0;
    }
  }
}

/* One launch of qr_fg_kernel over E experts: ngu gate/up and ndn down slabs per expert, ctr its counters (3 + E ints,
 * zero before the first launch; every launch leaves them zero). */
template <int BITS, int NT, int GS, int WARPS, int D, int STAGES, int MINB, int SUB, int PF, int NTS>
cudaError_t qr_fg_launch(cudaStream_t s, int E, int ngu, int ndn, const qe_args &gu, const qe_args &dn, int *ctr) {
  void (*kern)(qe_args, qe_args, int, int, int, int *) = qr_fg_kernel<BITS, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, NTS>;
  constexpr size_t smem = (size_t)STAGES * (8 * NT * qr_xs(GS, SUB, BITS) + qr_sbb(GS, SUB, NT, 0));
#ifndef DG_CUDA_EMU
  static int set = 0; /* one attribute call per instantiation */
  if (!set && smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = 1;
  }
#endif
  DG_LAUNCH(kern, E * (ngu + ndn), 32 * WARPS, smem, s)(gu, dn, E, ngu, ndn, ctr);
  return cudaGetLastError();
}

/* Whether qr_fg_bits takes gate/up gu and down dn (the arguments k_qe_gate_up with QR_GATEUP_HP and k_qe_down over
 * h and its sums pass) at nt n-tiles: the HP epilogue's conditions (gu.hs set, gu.N whole slabs of 16 QR_WARPS
 * features, down's input h and its sums, one group for both), group 64 (the 26B's), 2 or 3 n-tiles (where qr_kernel
 * runs DIET 0: QR_DIET_TILES), and the ctr the caller passes. */
inline int qr_fg_takes(int nt, const qe_args &gu, const qe_args &dn) {
  return gu.hs && gu.N > 0 && gu.N % (16 * QR_WARPS) == 0 && gu.hg == 64 && gu.group == 64 && dn.group == 64 &&
         dn.X == gu.h && dn.xs == gu.hs && dn.Kdim == gu.N && (nt == 2 || nt == 3) && !qr_diet_at(nt, QR_DIET_TILES, 0);
}

/* Gate/up gu (QR_GATEUP_HP: h in the down product's fragment order and its group sums into gu.h, gu.hs) and down dn
 * (X = gu.h, xs = gu.hs) over E experts at nt n-tiles in one launch (qr_fg_kernel) with the backend's choices of
 * qr_launch_bits at that tile count (3: 4 blocks per SM, line prefetches QR_PF stages ahead, the QR_NTS-tile body for
 * experts of at most 8 QR_NTS rows; 2: 4 blocks per SM, no prefetch): h, its sums and y word for word those of the
 * two launches. ctr: 3 + E ints (qr_fg_launch). cudaErrorInvalidValue where qr_fg_takes says no. Instantiated for
 * BITS 4 only (qmoe_fg.cu: the 26B's experts; each width is two more kernels of four bodies in the build). */
template <int BITS>
cudaError_t qr_fg_bits(cudaStream_t s, int E, int nt, const qe_args &gu, const qe_args &dn, int *ctr) {
  if (!ctr || E <= 0 || !qr_fg_takes(nt, gu, dn)) return cudaErrorInvalidValue;
  const int ngu = gu.N / (16 * QR_WARPS), ndn = (dn.N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  if (nt == 3)
    return qr_fg_launch<BITS, 3, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, -QR_PF, QR_NTS>(s, E, ngu, ndn, gu, dn,
                                                                                               ctr);
  return qr_fg_launch<BITS, 2, 64, QR_WARPS, QR_D, QR_STAGES, QR_MINB, QR_SUB, 0, 0>(s, E, ngu, ndn, gu, dn, ctr);
}
extern template cudaError_t qr_fg_bits<4>(cudaStream_t, int, int, const qe_args &, const qe_args &, int *);
/* The fused launches the backend made (k_qe_experts_fg, DGEMMA_EXPERTS_FG=1; qmoe.cu): the tests' proof it ran. */
extern long qr_fg_launches;

#endif
