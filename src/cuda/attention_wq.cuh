/* attention_wq.cuh: att_wq_kernel, the attention on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a):
 * Q K^T on wgmma with whole rows per warp (versions 12 and 13, session 23), the prologue reordered (14, session 24),
 * P V on wgmma too (15, session 24), and the phase stamps of the attention lab's --prof (timing only). Version 15
 * (att_wq_launch<D, BK, VS, 2, 1, 0, 1>) is the backend's default where the build has sm_90a code and the device
 * runs it (attention.cu k_attention_any, attn_choose; session 25); the lab (dev/cuda/attention_lab.cuh, its versions
 * 12-15) and the tests (tests/support/cuda_entry.cu) include this header as it is, so each version's kernel is the
 * same template in both. Moved here from the lab's header in session 25 without a change of code (the lab's 12-14
 * and 15 bit-identical to before). Built for an architecture without wgmma (the compute_90 PTX, sm_90 SASS,
 * sm_80) the kernels trap at their first wgmma (wgmma.cuh DG_WG_TRAP): callers select them only where
 * cuda_wg_available() (qmoe_wl.cu) says the device runs this build's sm_90a code. Included by attention.cu, the
 * lab and the test support; device code for nvcc or the CPU emulation (dev/cuda_emu). */
#ifndef DG_CUDA_ATTENTION_WQ_CUH
#define DG_CUDA_ATTENTION_WQ_CUH

#include "cuda/attention.cuh"
#include "cuda/wgmma.cuh" /* Q K^T and P V on wgmma.mma_async (sm_90a; emulated on the CPU) */

/* ---- version 12 (session 23, issue 12): Q K^T on wgmma, whole rows per warp ------------------------------------
 *
 * Why (docs/cuda.md "Attention at the 26B's decoder shapes"): version 6's flash_pair_kernel runs at 15-16 % of the
 * H100's bf16 rate on the 26B's decoder rows (sliding 42.6 us for a 6.6 us floor, full 80.1 for 13.3), about 3.5x
 * its own tensor-core time per key tile. Per tile and warp it spends, besides its 128 mma.sync: 40 ldmatrix for
 * the Q and K fragments of its half of Q K^T, the partial scores through shared memory (32 floats stored and 32
 * loaded per lane) behind a second block-wide barrier, and the whole online softmax of its 16 rows twice (warps w
 * and w ^ 4 compute the same exponentials, bit-identical), with all eight warps in lock step between the two
 * barriers, so the tensor cores idle during the exponentials and the MUFU during the products.
 *
 * Version 12: a block is two warpgroups (256 threads); wgmma.mma_async m64nNk16 (src/cuda/wgmma.cuh) computes a
 * warpgroup's 64 x BK scores over the whole head dim with Q and K read by the tensor cores from shared memory
 * (128-byte-swizzled K-major panels of 64 dims: exactly fa_swz<64>'s layout, so cp.async fills them as before and
 * ldmatrix.trans reads V from the same kind of panel); the scores land in the mma.sync C layout per warp (16 rows,
 * lane rows g and g + 8), so fa_mask and fa_softmax run on them unchanged and each warp owns whole rows: no score
 * exchange, no second barrier, no duplicated softmax. P V stays on mma.sync (P is in registers in the A layout;
 * wgmma's B from shared memory would need V transposed, which the wrappers and the emulation do not take).
 *   D 128, 256  (VS 1) warpgroup wg takes rows 64 wg .. 64 wg + 63 of a 128-row tile, all D output columns (O: 16
 *               rows x D fp32 per warp, 128 registers at D 256); both warpgroups share each K/V tile, so the block
 *               reads half the K/V bytes per multiply-add of version 6's 64 rows; 64 keys per tile.
 *               Shared memory: Q 128 x D + 2 x (K + V) 64 x D (bf16) + 1 KiB of alignment: 193 KiB at D 256.
 *   D 512       (VS 2) both warpgroups take the same 64 rows, warpgroup wg the output columns [256 wg, + 256)
 *               (O 128 registers); each computes the whole Q K^T of its rows (the tensor-core work of Q K^T
 *               twice: 1.5x the needed products, as version 2's value slices, but K and V read once per block
 *               and no exchange); 32 keys per tile (wgmma m64n32k16): Q 64 KiB + 2 x (32 + 32) KiB + 1 KiB.
 *   D 64        version 6 (as 9-11).
 * Version 13: version 12 with one warpgroup per block (128 threads, 64 rows) and 32-key tiles at D 128 and 256, so
 * that two blocks fit an SM (D 256: Q 32 + 2 x (K 16 + V 16) + 1 = 97 KiB; __launch_bounds__(128, 2): up to 255
 * registers still): two independent blocks per SM whose barriers, softmaxes and products interleave (one block's
 * exponentials beside the other's tensor-core work), at the price of version 6's L2 -> shared bytes per multiply-add
 * (no sharing of K/V tiles between warpgroups) and a barrier per 32 keys. Splits at the sliding layer after 1,024:
 * 64 blocks x 4 of 10 tiles (264 slots). D 512 as 12, D 64 version 6.
 * Key splits: fa_choose_splits over the occupancy (one block per SM): at the 26B's decoder rows after 1,024
 * positions, sliding 32 blocks a split x 4 splits of 5 tiles (version 6: 64 x 2 of 10), full 64 x 2 of 20 (as 6);
 * merged by fp_combine_kernel (attention.cuh), as version 6's are.
 * Per tile: wait for the tile's copies, fence.proxy.async (this thread's cp.async and Q stores visible to the
 * tensor cores), one __syncthreads, the next tile's copies issued, then per warpgroup D / 16 wgmmas in one commit
 * group, wait_group 0, mask, softmax, P V.
 * Rounding: as version 6 (q and P rounded to bf16, products exact, fp32 sums; wgmma sums the D products of a score
 * in its own order, which the test's bound allows: fp32 accumulation of D terms), so tests/test_cuda.c's bound
 * holds unchanged. Needs sm_90a (the lab's build); built for another architecture the kernel traps. */
template <int D, int BK, int VS, int NWG> struct wq_cfg {
  static_assert(VS == 1 || NWG == 2, "att_wq_kernel: the value split takes two warpgroups");
  static constexpr int NTH = 128 * NWG, BM = VS == 1 ? 64 * NWG : 64, DV = D / VS; /* threads; rows per block;
                                                                                     output columns per warpgroup */
  static constexpr int QB = BM * D * 2, KB = BK * D * 2;    /* bytes of the Q tile, of one K (or V) tile */
  static constexpr int SMEM = QB + 4 * KB + 1024;           /* Q, 2 stages of K and V, the 1024-byte alignment */
};

/* byte offset of 16-byte chunk ch of row r in a tile of ROWS rows stored as 128-byte panels of 64 dims (panel
 * ch / 8 at (ch / 8) ROWS 128; inside it fa_swz<64>, the 128-byte swizzle of wgmma's K-major layout) */
template <int ROWS> __device__ __forceinline__ int wq_at(int r, int ch) { return (ch >> 3) * (ROWS * 128) + fa_swz<64>(r, ch & 7); }

/* ---- version 14 (session 24, issue 12 item 2): version 12 with its prologue's latency chain cut ----------------
 *
 * Why (docs/cuda.md "Attention at the 26B's decoder shapes", session 24): the lab's rows of this morning give the
 * full layer a fixed part: version 6 0.0809 / 0.1245 / 0.2120 ms at 1,280 / 2,304 / 4,352 keys (version 12 0.0801 /
 * 0.1235 / 0.2101) is 26 us + 0.0427 us per key (12: 25.8 + 0.0424), so 2.7 us per 32-key tile and block (2 splits)
 * and 26 us that do not grow with the keys; Nsight's 9.2 us of fp_combine_kernel leave ~17 us in the flash kernel's
 * own fixed part at D 512, and the sliding layer's 37.7 us flash at 10 tiles of the same work per tile leave ~10
 * us at D 256: about proportional to D, as the Q tile (fa_load_q, fp32 from a flushed L2) and the partials' stores
 * are. fa_load_q's loop is unrolled by 2 in the PTX, each pair of float4 loads behind its own "row < R" branch and
 * followed by its shared-memory store: 16 chunks per thread at D 512 (and at D 256 with version 12's 128 rows) are
 * 8 dependent round trips to device memory before the block issues its first K/V copy (the copies come after the
 * Q tile in the program).
 * Version 14: the first K/V tile's copies issued first, then the Q tile with every load of a batch of 8 chunks (16
 * float4, 64 registers, none of O live yet) in flight before any conversion: rows past R read row R - 1 (no
 * branch) and store zeros. Everything else is version 12's (the same products, rounding and order: its output is
 * bit-identical to 12's).
 *
 * PROF (the lab's --prof, timing only, never the backend's): each warp's lane 0 sums clock64() differences over the
 * phases of its tiles, block thread 0 stamps %globaltimer and clock64() at the block's start and end (wq_prof_*).
 * A stamp after an asynchronous instruction (cp.async, mma.sync) does not wait for it: a phase holds the time to
 * issue its instructions and the stalls on operands of earlier ones, so P V's tensor time may show in the next
 * tile's softmax (its corr scaling reads O). */
#define WQ_NPH 7 /* prologue (Q tile, first copies), wait + barrier, next tile's copies issued, Q K^T (wgmma issue and
                    wait), mask + softmax, P V (ldmatrix + mma.sync issue), store (fa_store) */
#define WQ_PROF_BLOCK 8 /* u64 per block before its warps': globaltimer start, end; clock64 start, end; SM id; tiles */
#ifndef DG_CUDA_EMU
__device__ __forceinline__ long long wq_clock() { return clock64(); }
__device__ __forceinline__ unsigned long long wq_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned wq_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
#else
static inline long long wq_clock() { return 0; }
static inline unsigned long long wq_gtime() { return 0; }
static inline unsigned wq_smid() { return 0; }
#endif

/* wq_load_q (version 14): fa_load_q's Q tile (rows [r0, r0 + BM) of KV group g in bf16, rows past R zero) into
 * wq_at's panels, with every load of a batch of up to 8 chunks per thread issued before the batch's conversions and
 * stores (no branch: rows past R read row R - 1, R >= 1, and store zeros). */
template <int D, int BM, int NTH>
__device__ __forceinline__ void wq_load_q(const fa_args &a, char *Qs, int r0, int R, int G, int g, int tid) {
  constexpr int CH = D / 8, NI = BM * CH / NTH, NB = NI < 8 ? NI : 8;
  static_assert(BM * CH % NTH == 0 && NI % NB == 0, "wq_load_q: whole batches of chunks per thread");
#pragma unroll
  for (int b = 0; b < NI; b += NB) {
    float4 x[NB][2];
#pragma unroll
    for (int j = 0; j < NB; j++) {
      const int i = tid + (b + j) * NTH, r = i / CH, ch = i % CH, gr = min(r0 + r, R - 1);
      const float *src = a.q + ((size_t)(gr / G) * a.NH + g * G + gr % G) * D + ch * 8;
      x[j][0] = *(const float4 *)src;
      x[j][1] = *(const float4 *)(src + 4);
    }
#pragma unroll
    for (int j = 0; j < NB; j++) {
      const int i = tid + (b + j) * NTH, r = i / CH, ch = i % CH;
      uint4 v = make_uint4(fa_pack(x[j][0].x, x[j][0].y), fa_pack(x[j][0].z, x[j][0].w), fa_pack(x[j][1].x, x[j][1].y),
                           fa_pack(x[j][1].z, x[j][1].w));
      if (r0 + r >= R) v = make_uint4(0, 0, 0, 0);
      *(uint4 *)(Qs + wq_at<BM>(r, ch)) = v;
    }
  }
}

/* att_wq_kernel's arguments: the backend's, and the lab's --prof stamps (NULL unless PROF) */
struct wq_args {
  fa_args a;
  unsigned long long *prof;
};

/* ---- version 15 (session 24): version 14 with P V on wgmma -------------------------------------------------------
 * P V of a warpgroup's 64 rows and DV columns per 16 keys as DV / 128 wgmma m64n128k16 with A = P from registers
 * (fa_softmax's pa: the mma.sync A layout per warp, which is wgmma's register A layout) and B = V read by the tensor
 * cores MN-major (imm-trans-b 1: dg_wgmma_bf16_tb16, src/cuda/wgmma.cuh): the V panel [keys][64 dims] in 128-byte
 * rows with fa_swz<64>'s swizzle is the MN-major 128-byte-swizzle pattern (64 consecutive dims of one key per row,
 * 8 keys a 1024-byte pattern: SBO 1024, 16 keys = 2048 bytes per k16 step; the next 64 dims are the next panel, BK 128
 * bytes on: LBO). Per warp and tile this replaces DV / 16 ldmatrix.trans and DV / 8 mma.sync per 16 keys by a
 * warpgroup's DV / 128 wgmmas; the wait for them ends the tile (the V buffer is refilled after the next barrier). The
 * sums: products exact, fp32 accumulation in wgmma's order (the test's bound, as for Q K^T). */

/* wq_qk: one key tile's scores on wgmma, s = Q K^T for this warpgroup's 64 rows (Q at shared address qa, the tile's
 * K in buffer buf of the K panels at ka; both in 128-byte swizzled panels of 64 dims, KB bytes a buffer); waits for
 * the products and pins s. Versions 15-18 (att_wq_kernel, att_wqc_kernel). */
template <int D, int BM, int BK, int KB>
__device__ __forceinline__ void wq_qk(float (&s)[BK / 8][4], uint32_t qa, uint32_t ka, int buf) {
  constexpr int NT = BK / 8;
#pragma unroll
  for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
  dg_wg_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint64_t ad = dg_wg_desc_sw128(qa + (uint32_t)((kk >> 2) * (BM * 128) + (kk & 3) * 32), 1024);
    const uint64_t bd = dg_wg_desc_sw128(ka + (uint32_t)(buf * KB + (kk >> 2) * (BK * 128) + (kk & 3) * 32), 1024);
    dg_wgmma_bf16_ss<NT>(s, ad, bd, kk > 0);
  }
  dg_wg_commit();
  dg_wg_wait0();
  dg_wg_pin<NT>(s);
}

/* wq_pv: version 15's P V on wgmma (the comment above): o += P V for this warpgroup's rows and its DV columns from
 * dv0, P from registers (pa), V the tile's MN-major panels at vt; waits for the products and pins o. */
template <int DV, int BK>
__device__ __forceinline__ void wq_pv(float (&o)[DV / 8][4], const uint32_t (&pa)[BK / 16][4], const char *vt,
                                      int dv0) {
  static_assert(DV % 128 == 0, "wq_pv: P V on wgmma takes 128 columns per product");
  const uint32_t va = dg_smem_addr(vt) + (uint32_t)(dv0 / 64) * (BK * 128);
  dg_wg_fence(); /* o (rescaled) and pa (written) by ordinary instructions before the wgmmas read them */
#pragma unroll
  for (int j = 0; j < BK / 16; j++)
#pragma unroll
    for (int h = 0; h < DV / 128; h++)
      dg_wgmma_bf16_tb16(*(float(*)[16][4]) & o[16 * h][0], pa[j],
                         dg_wg_desc_sw128_mn(va + (uint32_t)(2 * h * (BK * 128) + j * 2048), BK * 128, 1024), 1);
  dg_wg_commit();
  dg_wg_wait0();
  dg_wg_pin<DV / 8>(o);
}

/* PRO 0: version 12's prologue (fa_load_q, then the first copies), 1: version 14's (wq_load_q after the first
 * copies); PROF 1: the phase stamps (above) into p.prof: per block WQ_PROF_BLOCK + NWG 4 x 8 u64; PVW 1: P V on
 * wgmma (version 15) */
template <int D, int BK, int VS, int NWG, int PRO, int PROF, int PVW = 0>
__global__ void __launch_bounds__(128 * NWG, 3 - NWG) att_wq_kernel(wq_args p) {
  DG_PDL_ENTRY();
  const fa_args &a = p.a;
  long long ph[WQ_NPH] = {}, tk = 0, t0 = 0;
  unsigned long long gt0 = 0;
  if constexpr (PROF) { gt0 = wq_gtime(); t0 = tk = wq_clock(); }
  auto stamp = [&](int k) {
    if constexpr (PROF) {
      const long long t = wq_clock();
      ph[k] += t - tk;
      tk = t;
    }
  };
  typedef wq_cfg<D, BK, VS, NWG> C;
  constexpr int BM = C::BM, DV = C::DV, NT = BK / 8;
  DG_DYN_SMEM16(wq_raw);
  char *sm = (char *)wq_raw + ((1024u - (dg_smem_addr(wq_raw) & 1023u)) & 1023u); /* the swizzle's 1024-byte patterns */
  char *Qs = sm, *Ks = sm + C::QB, *Vs = Ks + 2 * C::KB;
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, wg = w >> 2, wq = w & 3;
  const int G = a.NH / a.NKV, R = a.nq * G, r0 = blockIdx.x * BM, g = blockIdx.y, z = blockIdx.z;
  const int mrow = VS == 1 ? 64 * wg : 0, dv0 = VS == 1 ? 0 : wg * DV; /* the warpgroup's rows and columns */
  int blo, bhi;
  fa_range(a, r0, G, BM, &blo, &bhi);
  const int nt_all = (bhi - blo + BK - 1) / BK, per = (nt_all + a.n_split - 1) / a.n_split;
  const int zlo = blo + z * per * BK, zhi = min(bhi, zlo + per * BK);
  const int ntile = zhi > zlo ? (zhi - zlo + BK - 1) / BK : 0;
  const bf16 *kg = a.kc + (size_t)g * a.S * D, *vg = a.vc + (size_t)g * a.S * D;

  auto load_kv = [&](int it, int buf) {
    const int kb = zlo + it * BK, sb = kb % a.S;
    char *kd = Ks + buf * C::KB, *vd = Vs + buf * C::KB;
    for (int i = tid; i < BK * (D / 8); i += C::NTH) {
      const int r = i / (D / 8), ch = i % (D / 8), ok = kb + r < zhi;
      int sl = sb + r; /* one wrap at most (a pass's keys never share a slot) */
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
  const int rl = mrow + 16 * wq + (lane >> 2); /* the lane's rows r0 + rl, + 8 (wgmma's D layout: warp wq of the
                                                  warpgroup holds its rows 16 wq ..) */
  const uint32_t qa = dg_smem_addr(Qs) + (uint32_t)mrow * 128u, ka = dg_smem_addr(Ks);

  if constexpr (PRO == 0) {
    fa_load_q<D, BM, C::NTH>(a, Qs, r0, R, G, g, tid, [](int r, int ch) { return wq_at<BM>(r, ch); });
    if (ntile > 0) load_kv(0, 0);
    dg_cp_commit();
  } else { /* version 14: the first tile's copies in flight while the Q tile's loads are */
    if (ntile > 0) load_kv(0, 0);
    dg_cp_commit();
    wq_load_q<D, BM, C::NTH>(a, Qs, r0, R, G, g, tid);
  }
  stamp(0);
  for (int it = 0; it < ntile; it++) {
    const int buf = it & 1, kb = zlo + it * BK;
    dg_cp_wait<0>();
    dg_fence_proxy_async(); /* this thread's copies (and, at it 0, its Q stores) visible to the tensor cores */
    __syncthreads();        /* tile it landed for every thread; every warp has left step it - 1 (its buffer's wgmmas
                               retired by their wait_group, its ldmatrix done) */
    stamp(1);
    if (it + 1 < ntile) load_kv(it + 1, buf ^ 1);
    dg_cp_commit();
    stamp(2);
    float s[NT][4];
    wq_qk<D, BM, BK, C::KB>(s, qa, ka, buf);
    stamp(3);
    fa_mask<BK>(a, s, kb, zhi, (r0 + rl) / G, (r0 + rl + 8) / G, R_first, R_last, lane);
    uint32_t pa[BK / 16][4];
    fa_softmax<DV, BK>(s, m, l, o, pa);
    stamp(4);
    const char *vt = Vs + buf * C::KB;
    if constexpr (PVW) { /* version 15: P V on wgmma, B = V MN-major */
      wq_pv<DV, BK>(o, pa, vt, dv0);
    } else {
#pragma unroll
      for (int j = 0; j < BK / 16; j++) {
#pragma unroll
        for (int dp = 0; dp < DV / 16; dp++) {
          uint32_t vf[4];
          const int ch = dv0 / 8 + 2 * dp + (lane >> 4);
          dg_ldsm_x4_t(vf, vt + wq_at<BK>(16 * j + (lane & 7) + 8 * ((lane >> 3) & 1), ch));
          dg_mma_bf16(o[2 * dp], pa[j], vf);
          dg_mma_bf16(o[2 * dp + 1], pa[j], vf + 2);
        }
      }
    }
    stamp(5);
  }
  fa_store<D, DV>(a, o, m, l, r0, rl, R, G, g, dv0, z, lane);
  if constexpr (PROF) {
    stamp(6);
    const size_t blk = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned long long *pb = p.prof + blk * (WQ_PROF_BLOCK + 4 * NWG * 8);
    if (lane == 0)
      for (int k = 0; k < WQ_NPH; k++) pb[WQ_PROF_BLOCK + w * 8 + k] = (unsigned long long)ph[k];
    __syncthreads(); /* the block's end: every warp's store issued */
    if (tid == 0) {
      pb[0] = gt0; pb[1] = wq_gtime(); pb[2] = (unsigned long long)t0; pb[3] = (unsigned long long)wq_clock();
      pb[4] = wq_smid(); pb[5] = (unsigned long long)ntile;
    }
  }
}

/* One launch of att_wq_kernel (and fp_combine_kernel if it splits). PROF: prof must hold *nblk blocks' stamps
 * (WQ_PROF_BLOCK + NWG 4 x 8 u64 each; nblk in: the capacity in blocks, out: the grid's blocks), else
 * cudaErrorInvalidValue; ev (PROF, optional): an event recorded between the two kernels. */
template <int D, int BK, int VS, int NWG, int PRO = 0, int PROF = 0, int PVW = 0>
static cudaError_t att_wq_launch(cudaStream_t s, const dg_att_ws *ws, fa_args a, unsigned long long *prof = NULL,
                                 int *nblk = NULL, cudaEvent_t ev = NULL) {
  typedef wq_cfg<D, BK, VS, NWG> C;
  const int G = a.NH / a.NKV, R = a.nq * G, bx = (R + C::BM - 1) / C::BM;
  void (*kern)(wq_args) = att_wq_kernel<D, BK, VS, NWG, PRO, PROF, PVW>;
  static int per_sm = 0; /* one attribute call and occupancy query per instantiation */
  if (!per_sm) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, C::NTH, C::SMEM) != cudaSuccess || per_sm < 1)
      per_sm = 1;
  }
  a.n_split = fa_choose_splits(ws, a, bx * a.NKV, BK, per_sm, D);
  if (PROF) {
    if (!prof || !nblk || *nblk < bx * a.NKV * a.n_split) return cudaErrorInvalidValue;
    *nblk = bx * a.NKV * a.n_split;
  }
  DG_LAUNCH(kern, dim3(bx, a.NKV, a.n_split), C::NTH, C::SMEM, s)(wq_args{a, prof});
  if (PROF && ev) {
    const cudaError_t e = cudaEventRecord(ev, s);
    if (e != cudaSuccess) return e;
  }
  if (a.n_split > 1) {
    const size_t NR = (size_t)a.nq * a.NH;
    constexpr int RPB = 256 / (D / 8);
    DG_LAUNCH(fp_combine_kernel<D>, (unsigned)((NR + RPB - 1) / RPB), 256, 0, s)(a.part, a.out, a.n_split, NR);
  }
  return cudaGetLastError();
}
#endif
