/* qmoe_r.cuh: the register-streamed kernel of the quantized MoE products
 * (qmoe.cu; instantiated per bit width in qmoe_r*.cu). Same products, same
 * exact math as qe_kernel (qmoe.cuh: codes enter the tensor core as 128 + q,
 * P'_j = sum x_k (q_k + 128) per group in fp32 by mma.m16n8k16, folded as
 * acc += s_j P'_j + (b_j - 128 s_j) S_j), a different data path:
 *
 *   - the weights do not pass through shared memory: every lane loads its own
 *     codes and (scale, bias) pairs from device memory straight into
 *     registers (ld.global.nc, 16- or 8-byte pieces, a warp's load one
 *     contiguous 512- or 256-byte run), D stages deep, so D - 1 stages are in
 *     flight while one is computed; no shared-memory traffic, no address
 *     arithmetic and no barrier for them;
 *   - the activations go through a STAGES-deep cp.async ring shared by the
 *     block's warps, in the fragment order: the permuted copy xp of
 *     k_group_sums_perm, each run of 8 values stored as (x0, x4, x1, x5, x2,
 *     x6, x3, x7), so that one 16-byte shared load is a lane's B fragments
 *     (no prmt); the group sums beside them, transposed ([group][token]) so
 *     that a lane's two tokens are one 8-byte load.
 *
 * Layout of an expert stack ("lane records", qr_tile_pack): slabs as in
 * qe_tiling (32 WARPS rows of one expert; gate/up: 16 WARPS features, warp w
 * the gate rows of 16 features then their up rows), each cut into stages of
 * KC = max(64, group) codes; in a slab stage after stage, in a stage warp
 * after warp. Lane (g, t) of warp w computes with, for its four rows g, g + 8,
 * g + 16, g + 24 of the warp's 32 (r = 0..3), a record of REC = CB + 16 KC / group
 * bytes in registers:
 * bytes [0, CB):  for each r, each run c of 32 codes: the BITS bytes of codes
 *                 32 c + 8 t .. 32 c + 8 t + 7 of row r's stage (CB = 4 (KC / 32) BITS);
 * bytes [CB, REC): for each r, each group j of the stage: its (scale, bias)
 *                 pair, 2 + 2 bytes, bf16 (f16 and f32 pairs use qe_kernel).
 * In device memory a warp's stage (qr_wstage, the compact layout) is the code
 * bytes of the 32 lanes in pieces of 16 bytes (8 when CB is not a multiple of
 * 16: 3 bits), piece p of all 32 lanes contiguous, then the pair bytes of
 * row group g = 0..7 once (the 4 lanes (g, t) load the same 16 KC / group bytes,
 * one read): exactly the MLX bytes. (The first layout stored each lane's whole
 * record, the pairs 4 times: 48 bytes per lane and 4-bit g64 stage instead of
 * 36; the lab keeps it as version 17, cp = 0.) A stack whose columns are not a
 * multiple of KC, or without bf16 pairs, keeps the tile layout of qe_kernel
 * (the backend chooses at upload: dg_cuda_w.lay). */
#ifndef DG_CUDA_QMOE_R_CUH
#define DG_CUDA_QMOE_R_CUH

#include <type_traits>

#include "cuda/qmoe.cuh"

/* The backend's choices below can be set at compile time (-DQR_DIET_TILES=0x1fe in XCFLAGS for every object alike, as
 * scripts/qw_lab_gpu.sh BENCH_DEFS does to time one end to end); a build mixing values across objects is not allowed. */
#ifndef QR_WARPS
#define QR_WARPS 4  /* warps per block (the backend's choice) */
#endif
#ifndef QR_D
#define QR_D 2      /* register stages of weights (the backend's choice) */
#endif
#ifndef QR_STAGES
#define QR_STAGES 3 /* activation ring depth (the backend's choice) */
#endif
#ifndef QR_SUB
#define QR_SUB 2    /* weight stages per activation stage (the backend's choice) */
#endif
#ifndef QR_MINB
#define QR_MINB 4   /* blocks per SM the registers are capped for, up to 3 n-tiles (the backend's choice) */
#endif
#ifndef QR_MINB1
#define QR_MINB1 6  /* at 1 n-tile (experts of at most 8 rows), group 64, <= 4 bits: 6 blocks per SM (the backend's choice) */
#endif
#ifndef QR_PF
#define QR_PF 2     /* L2 prefetch distance in weight stages from 3 n-tiles (the backend's choice) */
#endif
#ifndef QR_NTS
#define QR_NTS 2    /* at 3 n-tiles, the n-tiles of the body for experts of at most 8 QR_NTS rows (the backend's choice) */
#endif
#ifdef QR_DIET
#error "QR_DIET became QR_DIET_TILES (session 21): -DQR_DIET_TILES=0x1fe runs the DIET loop at every tile count, 0 at none"
#endif
#ifndef QR_DIET_TILES
#define QR_DIET_TILES 0x30 /* the n-tile counts (bit n: n n-tiles, 1..8) at which qr_kernel runs the DIET loop (qr_diet_pass:
                            * the same bits, ~29 % fewer static instructions in the stage loop, session 17): 4 and 5.
                            * Lab versions 50 and 95 on an H100 (sessions 18 and 21, docs/cuda.md): at 5 n-tiles (T 512,
                            * two stacked canvases) gate/up -10 % (194.0 -> 174.6 us), down the same within the spread;
                            * at the 26B canvas's 2-3 n-tiles no gain (gate/up +0.5 %, down +3 %); at 8 n-tiles slower
                            * (T 1024: gate/up +3 %, down +5 %). 4 n-tiles not timed (between 3 and 5). The tests and the
                            * lab run the other loop at every tile count beside it (qr_launch_bits' FLIP) */
#endif
#if QR_DIET_TILES < 0 || QR_DIET_TILES > 0x1fe || (QR_DIET_TILES & 1)
#error "QR_DIET_TILES (-DQR_DIET_TILES=...) is a mask of n-tile counts 1..8 (bit n), 0 to 0x1fe"
#endif
#ifndef QR_PREWAIT
#define QR_PREWAIT 0 /* the down product's weight stages asked of L2 before griddepcontrol.wait (qr_prewait): 0 none;
                      * timed on an H100 in session 20 (64 and 4 stages): no faster end to end, so not the backend's */
#endif
#if QR_PREWAIT < 0 || QR_PREWAIT > 1024
#error "QR_PREWAIT (-DQR_PREWAIT=...) is 0 (off) or the weight stages per block to prefetch, 1..1024 (a large N: all)"
#endif
#define QR_BF16_GROUP 64 /* bf16 stacks (BITS 16): the "group", i.e. stages of 64 weights (qr_kc) */
#define QR_MINB16 2 /* bf16 stacks: blocks per SM the registers are capped for, up to 3 n-tiles (the backend's choice) */
/* qr_kernel's GATEUP: 0 the down product, 1 the gate/up product (h stored plainly, qe_store), QR_GATEUP_HP the gate/up
 * product whose epilogue also makes the down product's input copy and group sums (qr_store_hp; DGEMMA_DN_FUSE=1).
 * A template value of its own, so that the kernels of 0 and 1 carry no trace of that epilogue (the same PTX as
 * before it existed: docs/cuda.md, session 16); instantiated for gate/up groups 32 and 64 and the exact
 * fold only (no DQ body), the cases k_qe_dn_fuse_group (qmoe.cu) chooses it for. */
#define QR_GATEUP_HP 2

/* Codes per stage of a group size: max(64, group); bf16 stacks (bits 16) have no groups: their "group" is the
 * stage itself (32 or 64 weights). */
__host__ __device__ constexpr int qr_kc(int group, int bits = 0) { return bits == 16 ? group : group > 64 ? group : 64; }
/* Bytes of the (scale, bias) pairs of a lane's record of a stage: 16 per group (4 rows x 4 bytes); none for bf16
 * weights (bits 16). */
__host__ __device__ constexpr int qr_pb(int bits, int group) { return bits == 16 ? 0 : 16 * (qr_kc(group) / group); }
/* Bytes of one lane's record of a stage. */
__host__ __device__ constexpr int qr_rec(int bits, int group) { return 4 * (qr_kc(group, bits) / 32) * bits + qr_pb(bits, group); }
/* Bytes of the codes of a lane's record of a stage. */
__host__ __device__ constexpr int qr_cb(int bits, int group) { return 4 * (qr_kc(group, bits) / 32) * bits; }
/* Bytes of a warp's weight stage in device memory: cp (the compact layout) 32 lanes' codes, then the pairs of
 * the 8 row groups once (16 bytes per group of the stage each); else 32 whole lane records (the pairs of a
 * row group once per lane: 4 times). */
__host__ __device__ constexpr int qr_wstage(int bits, int group, int cp) {
  return cp ? 32 * qr_cb(bits, group) + 8 * qr_pb(bits, group) : 32 * qr_rec(bits, group);
}
/* Bytes of an activation stage's group sums: 4 per (group, token), BM: 16 (the split records). */
__host__ __device__ constexpr int qr_sbb(int group, int sub, int nt, int bm) {
  return (sub * (qr_kc(group) / group) * 8 * nt * (bm ? 16 : 4) + 15) / 16 * 16;
}
/* Bytes per token row of an activation stage of sub weight stages (64 modulo 128: conflict-free 16-byte reads). */
__host__ __device__ constexpr int qr_xs(int group, int sub, int bits = 0) { return 2 * sub * qr_kc(group, bits) + 64; }

#ifndef DG_CUDA_EMU
__device__ __forceinline__ uint4 dg_ld_stream16(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 dg_ld_stream8(const void *p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
/* The bulk (TMA) copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared
 * memory, completing on the mbarrier bar (PTX ISA: cp.async.bulk, mbarrier); one thread issues it. */
__device__ __forceinline__ void dg_mbar_init(uint64_t *bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(dg_smem_addr(bar)));
}
__device__ __forceinline__ void dg_mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }
__device__ __forceinline__ void dg_bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(dg_smem_addr(bar)), "r"(bytes));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dg_smem_addr(dst)), "l"(src), "r"(bytes), "r"(dg_smem_addr(bar))
               : "memory");
}
/* Ask for `bytes` (a multiple of 16, 16-byte aligned) at src to be brought into L2 (PTX ISA:
 * cp.async.bulk.prefetch.L2); no registers, no shared memory, nothing to wait for. */
__device__ __forceinline__ void dg_prefetch_l2(const void *src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
/* Wait until the phase of parity `phase` of bar has completed. */
__device__ __forceinline__ void dg_mbar_wait(uint64_t *bar, uint32_t phase) {
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(dg_smem_addr(bar)), "r"(phase)
                 : "memory");
  } while (!done);
}
#else
static inline uint4 dg_ld_stream16(const void *p) { uint4 v; memcpy(&v, p, 16); return v; }
static inline uint2 dg_ld_stream8(const void *p) { uint2 v; memcpy(&v, p, 8); return v; }
/* the emulation's mbarrier and bulk copy (dev/cuda_emu/emu.h: the copy performed when a thread waits on its phase) */
static inline void dg_mbar_init(uint64_t *bar) { emu::mbar_init(bar, 1); }
static inline void dg_mbar_fence_init() {}
static inline void dg_bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  emu::mbar_arrive_expect_tx(bar, bytes);
  emu::bulk_g2s(dst, src, bytes, bar);
}
static inline void dg_mbar_wait(uint64_t *bar, uint32_t phase) { emu::mbar_wait_parity(bar, phase); }
static inline void dg_prefetch_l2(const void *, uint32_t) {}
#endif

/* Ask L2 for a warp's weight stage whose lane `lane` piece starts at p (code pieces of PSC bytes, piece-major over
 * the 32 lanes; then 16 GPS bytes of pairs per row group, the compact layout): the lanes at 128-byte line starts of
 * each code piece and lane 0 for the pair lines issue one prefetch.global.L2 each (no uniform registers, so no
 * waterfall loop around the bulk prefetch of a lane-dependent address). */
template <int CB, int GPS, int PSC> __device__ __forceinline__ void qr_prefetch_lines(const unsigned char *p, int lane) {
#ifndef DG_CUDA_EMU
  if ((lane * PSC) % 128 == 0) {
#pragma unroll
    for (int k = 0; k < CB / PSC; k++) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + k * 32 * PSC));
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < GPS; i++) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + 32 * CB + 128 * i));
  }
#else
  (void)p; (void)lane;
#endif
}

/* The group sums of an activation stage into the ring: fp32 (4 bytes), or BM the 16-byte split records. */
template <int BM> __device__ __forceinline__ void qr_cp_sums(dg_sptr dst, const float *src, int bytes) {
  if constexpr (BM) dg_cp_async16_sp(dst, src, bytes);
  else dg_cp_async4_sp(dst, src, bytes);
}

/* BM: the bias term sum_j (b_j - OFF s_j) S_j of a pair of groups (u = 0, 1) as one mma.m16n8k16: column pair t
 * (k = 2 t, 2 t + 1) of group u's half of k holds, against the split records' words t of S = hi + mid + lo
 * (k_group_sums_perm_split): t = 0: (b, b) x (hi, mid); t = 1: (b, s) x (lo, -128 hi); t = 2: (s, s) x
 * (-128 mid, -128 lo); t = 3: 0. Products of bf16 values are exact in fp32, so the term is b S - 128 s S with
 * the tensor core's fp32 accumulation, |S - hi - mid - lo| <= 2^-24 |S|, and no rounding of b - 128 s. Lane t's
 * selector of its (s, b) pair (s the low half) into its A register; 8-bit codes (OFF 0): no s columns. */
template <int BITS> __device__ __forceinline__ uint32_t qr_bias_sel(int t) {
  if constexpr (BITS == 8) return t == 0 ? 0x3232u : t == 1 ? 0x4432u : 0x4444u;
  else return t == 0 ? 0x3232u : t == 1 ? 0x1032u : t == 2 ? 0x1010u : 0x4444u;
}

/* The 4 bf16 pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) of 128 + c (8 bits:
 * c; 16 bits: the bf16 weights c themselves) of the 8 codes at byte o of a
 * lane's record R (o known after unrolling; the same decoding as qe_codes,
 * from registers). */
template <int BITS> __device__ __forceinline__ void qr_codes(const uint32_t *R, const int o, uint32_t P[4]) {
  const int w = o >> 2, sh = (o & 3) * 8;
  if constexpr (BITS == 16) { /* bf16 weights, stored in pair order by qr_tile_pack: no decoding */
#pragma unroll
    for (int i = 0; i < 4; i++) P[i] = R[w + i];
  } else if constexpr (BITS == 4) {
    qe_dec4(R[w], P);
  } else if constexpr (BITS == 2) {
    /* bytes o, o + 1 (one word: o is even) -> codes 0-3 in bits 0-7, 4-7 in bits 16-23 */
    qe_dec2(dg_prmt(R[w], 0u, (uint32_t)(0x4040 | ((sh / 8 + 1) << 8) | (sh / 8))), P);
  } else if constexpr (BITS == 3) {
    qe_dec3(sh == 0 ? R[w] : sh == 8 ? R[w] >> 8 : dg_funnel_r(R[w], R[w + 1], (uint32_t)sh), P);
  } else if constexpr (BITS == 6) { /* o is even: sh is 0 or 16 */
    qe_dec6(sh == 0 ? R[w] : dg_funnel_r(R[w], R[w + 1], 16u), sh == 0 ? R[w + 1] : R[w + 1] >> 16, P);
  } else { /* 8: o is a multiple of 8 */
    qe_dec8(R[w], R[w + 1], P);
  }
}

/* A thread's copies of an activation stage of qr_body, fixed for a pass: CH 16-byte pieces of activation rows
 * (source at stage 0, shared-memory offset; zero-filled past the expert's rows) and CHS group sums (GPW groups
 * with sums per weight stage; BM: 16-byte split records). xrow / srow: each pass token's X row and row of group
 * sums (-1 past the expert's rows); XS bytes per token row of a ring slot, its sums at XB. */
template <int GS, int NTOK, int THREADS, int KA, int XS, int XB, int GPW, int SUB, int BM, int NZ> struct qr_xcopy {
  static constexpr int PER = KA / 8, CH = (NTOK * PER + THREADS - 1) / THREADS;
  static constexpr int NS = NTOK * SUB * GPW, CHS = (NS + THREADS - 1) / THREADS, CHA = CHS > 0 ? CHS : 1;
  static constexpr bool XEVEN = NTOK * PER % THREADS == 0, SEVEN = NS % THREADS == 0;
  const bf16 *xsrc[CH];
  int xdst[CH], xcol[CH], xbytes[CH];
  const float *ssrc[CHA];
  int sdst[CHA], sgrp[CHA], sbytes[CHA];

  __device__ __forceinline__ void init(const qe_args &a, const int64_t *xrow, const int64_t *srow, int tid) {
#pragma unroll
    for (int k = 0; k < CH; k++) {
      const int i = tid + k * THREADS, r = min(i / PER, NTOK - 1), c = i % PER;
      const int64_t xr = xrow[r];
      xsrc[k] = xr >= 0 ? a.X + xr + 8 * c : a.X;
      xbytes[k] = xr >= 0 ? 16 : 0;
      xdst[k] = i < NTOK * PER ? r * XS + 16 * c : -1;
      xcol[k] = 8 * c;
    }
#pragma unroll
    for (int k = 0; k < CHS; k++) {
      const int i = tid + k * THREADS, j = i / NTOK, r = i % NTOK;
      const int64_t sr = i < NS ? srow[r] : -1;
      ssrc[k] = sr >= 0 ? a.xs + (BM ? 4 : 1) * (sr + j) : a.xs; /* BM: 16-byte split records */
      sbytes[k] = sr >= 0 ? (BM ? 16 : 4) : 0;
      sdst[k] = i < NS ? XB + (BM ? 16 : 4) * i : -1;
      sgrp[k] = j;
    }
  }
  /* The activations and group sums of the activation stage starting at column icol into the ring slot at slot;
   * columns past the matrix (a last stage of fewer than SUB weight stages) are not loaded and never read.
   * Rows past the expert's are zero-filled (src-size 0; NZ: not copied). Every stage but such a last one takes
   * the path without column tests, and with no test at all where the pieces divide evenly among the threads. */
  __device__ __forceinline__ void issue(dg_sptr slot, int icol, int Kdim) const {
    if (SUB == 1 || icol + KA <= Kdim) { /* uniform */
#pragma unroll
      for (int k = 0; k < CH; k++)
        if (NZ) {
          if ((XEVEN || xdst[k] >= 0) && xbytes[k]) dg_cp_async16_nz(slot + xdst[k], xsrc[k] + icol);
        } else if (XEVEN || xdst[k] >= 0) dg_cp_async16_sp(slot + xdst[k], xsrc[k] + icol, xbytes[k]);
#pragma unroll
      for (int k = 0; k < CHS; k++)
        if (NZ) {
          if ((SEVEN || sdst[k] >= 0) && sbytes[k]) dg_cp_async4_nz(slot + sdst[k], ssrc[k] + icol / GS);
        } else if (SEVEN || sdst[k] >= 0) qr_cp_sums<BM>(slot + sdst[k], ssrc[k] + (BM ? 4 : 1) * (icol / GS), sbytes[k]);
    } else {
      const int cols = Kdim - icol;
#pragma unroll
      for (int k = 0; k < CH; k++)
        if (xdst[k] >= 0 && xcol[k] < cols) dg_cp_async16_sp(slot + xdst[k], xsrc[k] + icol, xbytes[k]);
#pragma unroll
      for (int k = 0; k < CHS; k++)
        if (sdst[k] >= 0 && sgrp[k] * GS < cols) qr_cp_sums<BM>(slot + sdst[k], ssrc[k] + (BM ? 4 : 1) * (icol / GS), sbytes[k]);
    }
  }
};

/* N pieces of PSZ (16 or 8) bytes of a lane's record into R from p, the pieces 32 lanes (32 PSZ bytes) apart. */
template <int N, int PSZ> __device__ __forceinline__ void qr_ld_pieces(uint32_t *R, const unsigned char *p) {
#pragma unroll
  for (int k = 0; k < N; k++) {
    if constexpr (PSZ == 16) {
      const uint4 v = dg_ld_stream16(p + k * 32 * PSZ);
      R[4 * k] = v.x; R[4 * k + 1] = v.y; R[4 * k + 2] = v.z; R[4 * k + 3] = v.w;
    } else {
      const uint2 v = dg_ld_stream8(p + k * 32 * PSZ);
      R[2 * k] = v.x; R[2 * k + 1] = v.y;
    }
  }
}

/* One weight stage of a lane's record into R (RW words) from p, the lane's piece of its warp's stage in device
 * memory (CP: the compact layout, codes then the pairs of row group g; else whole lane records in PS-byte
 * pieces); PF > 0: lane 0 asks L2 for the warp's stage PF stages ahead, PF < 0: per-lane line prefetches -PF
 * ahead (wst: this stage's index of nst, stages sstride bytes apart; FULL: the prefetched stage is known to be
 * one of the nst, no test). */
template <int BITS, int GS, int CP, int PF, bool FULL = false>
__device__ __forceinline__ void qr_load_stage(uint32_t *R, const unsigned char *p, int lane, int g, int wst, int nst,
                                              int64_t sstride) {
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, GPW = RAW ? 0 : GPS, CB = 4 * RUNS * BITS;
  constexpr int REC = qr_rec(BITS, GS), PS = REC % 16 == 0 ? 16 : 8, NP = REC / PS;
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, NPC = CB / PSC, WSTAGE = qr_wstage(BITS, GS, CP);
  if constexpr (PF > 0) {
    if (lane == 0 && (FULL || wst + PF < nst)) dg_prefetch_l2(p + (int64_t)PF * sstride, WSTAGE); /* lane 0: p is the warp's stage */
  } else if constexpr (PF < 0) {
    if (FULL || wst - PF < nst) qr_prefetch_lines<CB, GPW, CP ? PSC : PS>(p + (int64_t)(-PF) * sstride, lane);
  }
  if constexpr (CP) {
    qr_ld_pieces<NPC, PSC>(R, p);
    const unsigned char *pp = p - lane * PSC + 32 * CB + g * 16 * GPS;
#pragma unroll
    for (int i = 0; i < GPW; i++) {
      const uint4 v = dg_ld_stream16(pp + 16 * i);
      R[CB / 4 + 4 * i] = v.x; R[CB / 4 + 4 * i + 1] = v.y; R[CB / 4 + 4 * i + 2] = v.z; R[CB / 4 + 4 * i + 3] = v.w;
    }
  } else {
    qr_ld_pieces<NP, PS>(R, p);
  }
}

/* The exact fold of group lg of a weight stage (record R, bf16 pairs): acc += s_j P'_j + (b_j - OFF s_j) S_j with
 * xsum[j] the lane's two tokens' group sums of n-tile j, then part = 0 (qr_fold; qr_stage_diet). */
template <int BITS, int NT, int GS>
__device__ __forceinline__ void qr_fold_group(float (&acc)[2][NT][4], float (&part)[2][NT][4], const uint32_t *R,
                                              int lg, const float2 (&xsum)[NT]) {
  constexpr int KC = qr_kc(GS, BITS), GPS = KC / GS, CB = 4 * (KC / 32) * BITS;
  constexpr float OFF = BITS == 8 ? 0.0f : 128.0f;
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    float s0, b0, s8, b8;
    qe_pair_u32(R[CB / 4 + (2 * mt) * GPS + lg], DG_CUDA_BF16, &s0, &b0); /* bf16 pairs only */
    qe_pair_u32(R[CB / 4 + (2 * mt + 1) * GPS + lg], DG_CUDA_BF16, &s8, &b8);
    b0 = fmaf(-OFF, s0, b0);
    b8 = fmaf(-OFF, s8, b8);
#pragma unroll
    for (int j = 0; j < NT; j++) {
      float *A = acc[mt][j], *P = part[mt][j];
      A[0] = fmaf(b0, xsum[j].x, fmaf(s0, P[0], A[0]));
      A[1] = fmaf(b0, xsum[j].y, fmaf(s0, P[1], A[1]));
      A[2] = fmaf(b8, xsum[j].x, fmaf(s8, P[2], A[2]));
      A[3] = fmaf(b8, xsum[j].y, fmaf(s8, P[3], A[3]));
      P[0] = P[1] = P[2] = P[3] = 0.0f;
    }
  }
}

/* The per-group fold of qr_body after run c of weight stage s (sub-stage sub of its activation stage): when run c
 * completes a group lg, acc += s_j P'_j + (b_j - OFF s_j) S_j and part = 0 (BM: acc += s P', the bias term by the
 * tensor cores over the split group sums at E0, the slot's sums; af the bias products' A fragments, asel lane t's
 * selector); Ss the sums of this sub-stage; nothing for bf16 weights (RAW). */
template <int BITS, int NT, int GS, int SUB, int BM, int NTOK>
__device__ __forceinline__ void qr_fold(float (&acc)[2][NT][4], float (&part)[2][NT][4], uint32_t (&af)[2][4],
                                        const uint32_t *R, const unsigned char *E0, const unsigned char *Ss, int c,
                                        int s, int sub, int ng, int g, int t, uint32_t asel) {
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, CB = 4 * RUNS * BITS, CPG = GS / 32;
  if constexpr (RAW) {
  } else if (BM && (c + 1) % CPG == 0) { /* group lg complete: acc += s P', part = 0; (b - OFF s) S by the tensor cores */
    const int lg = c / CPG, ga = sub * GPS + lg, gb = ga & 1;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
      const uint32_t p0 = R[CB / 4 + (2 * mt) * GPS + lg], p8 = R[CB / 4 + (2 * mt + 1) * GPS + lg];
      const float s0 = __uint_as_float(p0 << 16), s8 = __uint_as_float(p8 << 16);
#pragma unroll
      for (int j = 0; j < NT; j++) {
        float *A = acc[mt][j], *P = part[mt][j];
        A[0] = fmaf(s0, P[0], A[0]);
        A[1] = fmaf(s0, P[1], A[1]);
        A[2] = fmaf(s8, P[2], A[2]);
        A[3] = fmaf(s8, P[3], A[3]);
        P[0] = P[1] = P[2] = P[3] = 0.0f;
      }
      af[mt][2 * gb] = dg_prmt(p0, 0u, asel);
      af[mt][2 * gb + 1] = dg_prmt(p8, 0u, asel);
      if (gb == 0) af[mt][2] = af[mt][3] = 0u;
    }
    if (gb == 1 || s * GPS + lg == ng - 1) { /* the pair (or the matrix's last, single group) is complete */
      const unsigned char *E = E0 + 16 * (ga - gb) * NTOK + 4 * t;
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const uint32_t bb[2] = {*(const uint32_t *)(E + 16 * (8 * j + g)),
                                gb == 1 ? *(const uint32_t *)(E + 16 * (NTOK + 8 * j + g)) : 0u};
#pragma unroll
        for (int mt = 0; mt < 2; mt++) dg_mma_bf16(acc[mt][j], af[mt], bb);
      }
    }
  } else if ((c + 1) % CPG == 0) { /* group lg of the stage is complete: acc += s P' + (b - OFF s) S, part = 0 */
    const int lg = c / CPG;
    float2 xsum[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xsum[j] = *(const float2 *)(Ss + 4 * (lg * NTOK + 8 * j + 2 * t));
    qr_fold_group<BITS, NT, GS>(acc, part, R, lg, xsum);
  }
}

/* DQ: the decoded code pairs pg (row g) and p8 (row g + 8) of m-tile mt, run c (qr_codes: 128 + q; 8 bits q)
 * dequantized in place to bf16 weights before the tensor core (the larger experts' body: no per-group fold, no
 * group sums, no partial sums): minus 128 (exact: small integers), then w = fl_bf16(q s + b) by one
 * fma.rn.bf16x2 per pair with the row's (scale, bias) of the run's group lg = c / (GS / 32) (R's pair words: s
 * the low half). What it rounds: each weight once to bf16 (|w' - w| <= 2^-8 |w|, w = q s + b exactly), the
 * products and sums as the bf16 path (qr_kernel's BITS 16): |y' - y| <= (2^-8 + g(2K) (1 + 2^-8)) sum |x w|
 * (tests/test_cuda.c qdq_bound, dev/cuda/moe_quant.cu dot_ref). MLX's own quantized matrix product dequantizes
 * into the activation type the same way. */
template <int BITS, int RUNS, int GS>
__device__ __forceinline__ void qr_dq_rows(const uint32_t *R, int c, int mt, uint32_t pg[4], uint32_t p8[4]) {
  constexpr int GPS = qr_kc(GS) / GS, CB = 4 * RUNS * BITS, CPG = GS / 32;
  constexpr uint32_t ONE = 0x3F803F80u, M128 = 0xC300C300u; /* bf16 1 and -128 in both halves */
  const int lg = c / CPG;
  const uint32_t rg = R[CB / 4 + (2 * mt) * GPS + lg], r8 = R[CB / 4 + (2 * mt + 1) * GPS + lg];
  const uint32_t sg = dg_prmt(rg, 0u, 0x1010u), bg = dg_prmt(rg, 0u, 0x3232u); /* (s, s), (b, b) */
  const uint32_t s8 = dg_prmt(r8, 0u, 0x1010u), b8 = dg_prmt(r8, 0u, 0x3232u);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t qg = BITS == 8 ? pg[i] : dg_bf16x2_fma(pg[i], ONE, M128); /* 1 (128 + q) - 128 */
    const uint32_t q8 = BITS == 8 ? p8[i] : dg_bf16x2_fma(p8[i], ONE, M128);
    pg[i] = dg_bf16x2_fma(qg, sg, bg);
    p8[i] = dg_bf16x2_fma(q8, s8, b8);
  }
}

/* The tensor-core products of run c of a weight stage with the lane's B fragments bf of the NT token tiles (qr_run_products,
 * qr_stage_diet): A decoded from the record R (qr_codes; DQ: dequantized, qr_dq_rows), P[mt][j] += A B. */
template <int BITS, int NT, int RUNS, int DQ = 0, int GS = 64>
__device__ __forceinline__ void qr_run_mma(float (&P)[2][NT][4], const uint32_t *R, const uint32_t (&bf)[NT][4], int c) {
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    uint32_t pg[4], p8[4];
    qr_codes<BITS>(R, ((2 * mt) * RUNS + c) * BITS, pg);
    qr_codes<BITS>(R, ((2 * mt + 1) * RUNS + c) * BITS, p8);
    if constexpr (DQ) qr_dq_rows<BITS, RUNS, GS>(R, c, mt, pg, p8);
    const uint32_t a0[4] = {pg[0], p8[0], pg[1], p8[1]}, a1[4] = {pg[2], p8[2], pg[3], p8[3]};
#pragma unroll
    for (int j = 0; j < NT; j++) {
      dg_mma_bf16(P[mt][j], a0, &bf[j][0]);
      dg_mma_bf16(P[mt][j], a1, &bf[j][2]);
    }
  }
}

/* The products of run c (32 codes of each of the lane's 4 rows) of a weight stage: the lane's B fragments of the NT
 * token tiles from the activation stage Xs (XS bytes per token row), its A fragments decoded from the record R
 * (qr_codes; DQ: dequantized to bf16 weights by qr_dq_rows, group size GS), P[mt][j] += A B by mma.m16n8k16 (P:
 * the group's partial sums, or acc itself for bf16 weights and DQ). */
template <int BITS, int NT, int RUNS, int XS, int DQ = 0, int GS = 64>
__device__ __forceinline__ void qr_run_products(float (&P)[2][NT][4], const uint32_t *R, const unsigned char *Xs, int c,
                                                int g, int t) {
  uint32_t bf[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const uint4 u = *(const uint4 *)(Xs + (8 * j + g) * XS + 64 * c + 16 * t);
    bf[j][0] = u.x; bf[j][1] = u.y; bf[j][2] = u.z; bf[j][3] = u.w;
  }
  qr_run_mma<BITS, NT, RUNS, DQ, GS>(P, R, bf, c);
}

/* A pass's first L2 prefetches of the warp's weight stages 1 .. |PF| - 1 (qr_load_stage's own prefetch covers the
 * stages from |PF| on; stage 0 is loaded at once): PF > 0 lane 0's bulk prefetch of each stage from wstage0 (the
 * warp's stage 0), PF < 0 the per-lane line prefetches from wq (the lane's piece of it); nst stages sstride bytes
 * apart. */
template <int BITS, int GS, int CP, int PF>
__device__ __forceinline__ void qr_prefetch_first(const unsigned char *wstage0, const unsigned char *wq, int lane,
                                                  int nst, int64_t sstride) {
  constexpr int KC = qr_kc(GS, BITS), CB = 4 * (KC / 32) * BITS, GPW = BITS == 16 ? 0 : KC / GS;
  constexpr int REC = qr_rec(BITS, GS), PS = REC % 16 == 0 ? 16 : 8, PSC = CB % 16 == 0 ? 16 : 8;
  if constexpr (PF > 0) {
    if (lane == 0)
      for (int i = 1; i < PF && i < nst; i++) dg_prefetch_l2(wstage0 + (int64_t)i * sstride, qr_wstage(BITS, GS, CP));
  } else if constexpr (PF < 0) {
    for (int i = 1; i < -PF && i < nst; i++) qr_prefetch_lines<CB, GPW, CP ? PSC : PS>(wq + (int64_t)i * sstride, lane);
  }
}

/* The expert e and slab of this block: block (x, y) is expert x's slab y; with a.order, the blocks in launch order
 * (x fastest) take the experts by descending count, each expert's slabs one after another (largest processing time
 * first: no long block is left for the last wave; the slabs of an expert read its activation rows close in time). */
template <bool CG = false> __device__ __forceinline__ void qr_block(const qe_args &a, int *e, int *slab) {
  if (a.order) {
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    *e = CG ? __ldcg(a.order + lin / gridDim.y) : a.order[lin / gridDim.y]; /* CG: from L2, no L1 line (qr_prewait) */
    *slab = lin % gridDim.y;
  } else {
    *e = blockIdx.x;
    *slab = blockIdx.y;
  }
}

/* QR_PREWAIT = N > 0: before griddepcontrol.wait, the down product's block (GATEUP 0) asks L2 for the first
 * min(N, nst) weight stages of its slab (lane 0 of warp w the block's stages w, w + WARPS, ...; a block's stage is
 * the WARPS warps' stages, sstride contiguous bytes, so this is each warp's first N stages), so that with programmatic
 * dependent launch the blocks of down's first wave, placed during the tail of the grid before it and waiting there,
 * have those bytes loaded while HBM is partly idle (session 9: a launch's ramp and tail cost ~13 us; the 26B down
 * product is 2,816 blocks of ~50 KB, 11 stages of 4.6 KB, ~65-80 us per layer). Expected gain: up to the ramp of
 * the down launch, a few us per layer; risk: L2 thrash, the 528 resident blocks' whole slabs (N >= 11) are 26 MB of
 * the 50 MB L2, beside gate/up's output h (2.9 MB at T 256) and the tail's own streams. A prefetch never changes a
 * result, and with PDL off (DGEMMA_PDL=0) it is merely early.
 * Why the expert may be read here: order and count are written by the router's grid, at least two launches earlier
 * (gate/up in between, and k_group_sums_perm unless DGEMMA_DN_FUSE=1). A block is placed only once every block of
 * the grid just before it has begun (launch_dependents), so a down block only once every block of each grid since
 * the router's has begun; where one of those grids has more than one wave (the 26B gate/up: 1,408 blocks, 528
 * resident), its last blocks began only after earlier ones had exited, i.e. had passed their own wait, which
 * returns once the grid before it has completed, and that grid had passed its own wait: the router's grid has
 * completed and its writes are in L2, where these reads go (ld.global.cg). Where every grid between fits in one
 * wave, they may return the previous layer's routing (or any bytes):
 * the block then prefetches another slab (wasted bandwidth, never a wrong result: qr_kernel reads order again after
 * the wait, a load the compiler cannot merge with this one across the wait's memory clobber, and that cannot hit
 * an L1 line of this one since .cg does not allocate in L1); the expert is range-checked, so the addresses stay in
 * the stack. Gate/up does not do it: its order is written by the grid right before it (route_gr_kernel) or one grid
 * earlier whose blocks may all be waiting at once. */
template <int BITS, int GATEUP, int GS, int WARPS, int CP>
__device__ __forceinline__ void qr_prewait(const qe_args &a) {
  if constexpr (QR_PREWAIT > 0 && GATEUP == 0) {
    if ((threadIdx.x & 31) != 0) return;
    int e, slab;
    qr_block<true>(a, &e, &slab);
    if (e < 0 || e >= (int)gridDim.x || __ldcg(a.count + e) == 0) return; /* a stale order, or an expert without rows */
    const int nst = a.Kdim / qr_kc(GS, BITS), n = min(QR_PREWAIT, nst);
    const int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, CP); /* bytes of a block's stage */
    const unsigned char *p = (const unsigned char *)a.q + ((int64_t)e * gridDim.y + slab) * nst * sstride;
    for (int i = threadIdx.x >> 5; i < n; i += WARPS) dg_prefetch_l2(p + i * sstride, (uint32_t)sstride);
  } else {
    (void)a;
  }
}

/* One weight stage s of qr_body: the lane's record R against its part (sub-stage sub) of the activation ring slot at
 * byte off of smem (the activations, then the group sums at XB): the products of each run c (qr_run_products) into
 * the partial sums part, folded into acc as each group completes (qr_fold); bf16 weights (RAW) and DQ: the products
 * straight into acc. ng groups in the matrix's columns; lane (g, t); asel: qr_bias_sel. (The slot is passed as smem
 * and off, not as one pointer, so that the addresses are formed as qr_body formed them: the same PTX.) */
template <int BITS, int NT, int GS, int SUB, int BM, int DQ, int PM>
__device__ __forceinline__ void qr_stage_products(float (&acc)[2][NT][4], float (&part)[PM][PM == 1 ? 1 : NT][4],
                                                  uint32_t (&af)[2][4], const uint32_t *R, const unsigned char *smem,
                                                  int off, int s, int sub, int ng, int g, int t, uint32_t asel) {
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, NTOK = 8 * NT;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS;
  const unsigned char *Xs = smem + off + 2 * KC * sub, *Ss = smem + off + XB + 4 * NTOK * GPS * sub;
#pragma unroll
  for (int c = 0; c < RUNS; c++) {
    if constexpr (DQ) {
      qr_run_products<BITS, NT, RUNS, XS, 1, GS>(acc, R, Xs, c, g, t);
    } else {
      qr_run_products<BITS, NT, RUNS, XS>(RAW ? acc : part, R, Xs, c, g, t);
      qr_fold<BITS, NT, GS, SUB, BM, NTOK>(acc, part, af, R, smem + off + XB, Ss, c, s, sub, ng, g, t, asel);
    }
  }
}

/* qr_body's stage loop with the weight ring in shared memory (D = -WR, lab only so far): each lane copies its own
 * record of stage s (its NPW 16-byte pieces) into ring slot s mod WR by cp.async, WR - 1 stages ahead, and reads it
 * back into registers just before its products; a lane reads only what it copied, so its own cp.async.wait_group
 * orders it (no barrier). One commit group per weight stage carries the activation copies issued at that stage too:
 * at stage s, wait_group WR - 2 leaves pending only the groups of stages s - WR + 2 .. s - 1, so weight stage s
 * (issued at s - WR + 1) has landed, and so has the activation stage (issued (STAGES - 1) SUB stages earlier) when
 * WR <= (STAGES - 1) SUB + 1. Slot (s - 1) mod WR, refilled at stage s, was read into registers at stage s - 1.
 * The ring follows the STAGES activation slots of STB bytes in smem (sbase its shared address); wq the lane's piece
 * of the warp's stage 0, stages sstride bytes apart, nst weight and nsa activation stages; cslot the ring slot of
 * the activation stage being computed (advanced here); issue and compute qr_body's. */
template <int BITS, int GS, int WARPS, int WR, int STAGES, int SUB, int STB, int PF, int CP, class Issue, class Compute>
__device__ __forceinline__ void qr_ring_stages(const unsigned char *smem, dg_sptr sbase, const unsigned char *wq,
                                               int64_t sstride, int nst, int nsa, int warp, int lane, int g, int &cslot,
                                               Issue &issue, Compute &compute) {
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), GPS = KC / GS, GPW = RAW ? 0 : GPS, CB = 4 * (KC / 32) * BITS;
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, RW = qr_rec(BITS, GS) / 4;
  constexpr int NPW = CB / 16 + GPW, SLOT = WARPS * NPW * 32 * 16;
  static_assert(CP && PSC == 16 && !RAW && PF == 0, "the weight ring: compact 16-byte pieces, no prefetch");
  static_assert(WR >= 2 && WR <= (STAGES - 1) * SUB + 1, "the weight ring's wait count covers the activations");
  const int64_t lane_off = (int64_t)STAGES * STB + ((int64_t)warp * NPW * 32 + lane) * 16;
  const dg_sptr rbase = sbase + lane_off;
  auto wissue = [&](int st) {
    const dg_sptr d = rbase + (st % WR) * SLOT;
    const unsigned char *p = wq + (int64_t)st * sstride;
#pragma unroll
    for (int k = 0; k < CB / 16; k++) dg_cp_async16_nz(d + k * 512, p + k * 512);
    const unsigned char *pp = p - lane * 16 + 32 * CB + g * 16 * GPS;
#pragma unroll
    for (int i = 0; i < GPW; i++) dg_cp_async16_nz(d + (CB / 16 + i) * 512, pp + 16 * i);
  };
#pragma unroll
  for (int sa = 0; sa < STAGES - 1; sa++) {
    if (sa < nsa) issue();
    dg_cp_commit();
  }
#pragma unroll
  for (int j = 0; j < WR - 1; j++) {
    if (j < nst) wissue(j);
    dg_cp_commit();
  }
  for (int s = 0; s < nst; s++) {
    const int sub = s % SUB;
    dg_cp_wait<WR - 2>();
    if (sub == 0) {
      if (s > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
      __syncthreads(); /* every warp's activation copies of this stage landed; the slot refilled next is free */
      if (s / SUB + STAGES - 1 < nsa) issue();
    }
    if (s + WR - 1 < nst) wissue(s + WR - 1);
    dg_cp_commit();
    uint32_t R[RW];
    const unsigned char *rs = smem + lane_off + (s % WR) * SLOT;
#pragma unroll
    for (int k = 0; k < NPW; k++) {
      const uint4 v = *(const uint4 *)(rs + k * 512);
      R[4 * k] = v.x; R[4 * k + 1] = v.y; R[4 * k + 2] = v.z; R[4 * k + 3] = v.w;
    }
    compute(R, s, sub);
  }
  dg_cp_wait<0>();
}

/* The gate/up epilogue with the down product's input copy (qr_kernel's GATEUP QR_GATEUP_HP; DGEMMA_DN_FUSE=1,
 * qmoe.cu): the pass's h values, bf16(gelu(gate) up) as qe_store makes them, go into a shared tile
 * [8 NT][16 WARPS + 8] (the ring's memory, free after the loop's last barrier; rows 16-byte aligned), and after a
 * barrier one thread per (token, group of a.hg features) writes that group of the block's 16 WARPS features into a.h
 * in the down product's fragment order and its sum into a.hs, by group_sum_perm (mma.cuh) itself: the same bits as
 * k_group_sums_perm over a plainly stored h, so the down product's inputs are word for word those of the separate copy
 * (test_experts_dn_fuse), which is then not launched. Needs the block's features to be whole groups (a.hg divides
 * 16 WARPS) and every slab full (IE a multiple of 16 WARPS: the host's condition, k_qe_dn_fuse_group). The next pass
 * reuses the tile's memory only after the barrier that follows its row table. */
template <int NT, int WARPS>
__device__ __forceinline__ void qr_store_hp(const qe_args &a, const float (&acc)[2][NT][4], int row0, int mp, int slab,
                                            int warp, int g, int t, unsigned char *smem) {
  constexpr int FEAT = 16 * WARPS, HR = FEAT + 8; /* a token's tile row: FEAT bf16, then 16 bytes apart */
  bf16 *tile = (bf16 *)smem;
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int qq = 0; qq < 2; qq++) {
      const int tk = 8 * j + 2 * t + qq;
      if (tk >= mp) continue;
#pragma unroll
      for (int hf = 0; hf < 2; hf++)
        tile[tk * HR + warp * 16 + g + 8 * hf] =
            __float2bfloat16_rn(qe_gelu(acc[0][j][2 * hf + qq]) * acc[1][j][2 * hf + qq]);
    }
  __syncthreads();
  const int G = a.hg, gpb = FEAT / G, ng = a.N / G, n0 = slab * FEAT;
  for (int i = threadIdx.x; i < mp * gpb; i += 32 * WARPS) {
    const int tk = i / gpb, jj = i % gpb;
    const size_t row = (size_t)(row0 + tk);
    a.hs[row * ng + n0 / G + jj] = group_sum_perm(tile + tk * HR + jj * G, a.h + row * a.N + n0 + jj * G, G);
  }
}

/* A pass's outputs (qr_body): the gate/up product's h (qe_store; QR_GATEUP_HP also the down product's input copy,
 * qr_store_hp) or the down product's y. */
template <int GATEUP, int NT, int WARPS>
__device__ __forceinline__ void qr_epilogue(const qe_args &a, const float (&acc)[2][NT][4], const bool (&mvalid)[2],
                                            int row0, int mp, int slab, int warp, int g, int t, unsigned char *smem) {
  if constexpr (GATEUP == QR_GATEUP_HP) qr_store_hp<NT, WARPS>(a, acc, row0, mp, slab, warp, g, t, smem);
  else qe_store<GATEUP != 0, NT, WARPS>(a, acc, mvalid, row0, mp, slab, warp, g, t);
}

/* DIET (qr_kernel's template value, issue 11's "SASS diet", session 17; the backend's at the tile counts of QR_DIET_TILES): the same products,
 * folds and fp32 operations in the same order as the loop of qr_body, so the same output bits, with fewer
 * instructions per weight stage:
 *   - the stage loop in two parts: the steady state (qr_diet_pass's FAST iterations), where every weight stage
 *     loaded, every L2 prefetch and every activation stage issued is known to exist and to be whole, so no test,
 *     no branch and no column checks (the last stage's shorter copy) are in it; then the last iterations with
 *     qr_body's tests;
 *   - activation copies without source sizes: a pass token past the expert's rows copies token 0's row and sums
 *     instead of zeros (its column of the products reaches only outputs that are never stored: qe_store and
 *     qr_store_hp skip tokens from mp on, and the tensor core's columns are independent), and each copy's source
 *     advances by one stage instead of being formed from the column;
 *   - the activation fragments and group sums read by 32-bit shared addresses (dg_lds16, dg_lds8f) from a lane
 *     base fixed for the pass, instead of generic pointers rebuilt at every stage.
 * BM and DQ keep qr_body's loop. */

/* A thread's copies of an activation stage (DIET): as qr_xcopy, every source a real row (token 0's past the
 * expert's rows), advanced by one activation stage per issue. */
template <int GS, int NTOK, int THREADS, int KA, int XS, int XB, int GPW, int SUB> struct qr_xdiet {
  static constexpr int PER = KA / 8, CH = (NTOK * PER + THREADS - 1) / THREADS;
  static constexpr int NS = NTOK * SUB * GPW, CHS = (NS + THREADS - 1) / THREADS, CHA = CHS > 0 ? CHS : 1;
  static constexpr bool XEVEN = NTOK * PER % THREADS == 0, SEVEN = NS % THREADS == 0;
  const bf16 *xsrc[CH];
  int xdst[CH];
  const float *ssrc[CHA];
  int sdst[CHA];

  __device__ __forceinline__ void init(const qe_args &a, const int64_t *xrow, const int64_t *srow, int tid) {
#pragma unroll
    for (int k = 0; k < CH; k++) {
      const int i = tid + k * THREADS, r = min(i / PER, NTOK - 1), c = i % PER;
      const int64_t xr = xrow[r] >= 0 ? xrow[r] : xrow[0];
      xsrc[k] = a.X + xr + 8 * c;
      xdst[k] = i < NTOK * PER ? r * XS + 16 * c : -1;
    }
#pragma unroll
    for (int k = 0; k < CHS; k++) {
      const int i = tid + k * THREADS, j = i / NTOK, r = i % NTOK;
      const int64_t sr = srow[r] >= 0 ? srow[r] : srow[0];
      ssrc[k] = a.xs + sr + j;
      sdst[k] = i < NS ? XB + 4 * i : -1;
    }
  }
  /* The next activation stage (its first column icol) into the ring slot at slot; FULL: known to be whole, else
   * columns past Kdim (a last stage of fewer than SUB weight stages) are not loaded (and never read). */
  template <bool FULL> __device__ __forceinline__ void issue(dg_sptr slot, int icol, int Kdim, int tid) {
    if (FULL || SUB == 1 || icol + KA <= Kdim) {
#pragma unroll
      for (int k = 0; k < CH; k++)
        if (XEVEN || xdst[k] >= 0) dg_cp_async16_nz(slot + xdst[k], xsrc[k]);
#pragma unroll
      for (int k = 0; k < CHS; k++)
        if (SEVEN || sdst[k] >= 0) dg_cp_async4_nz(slot + sdst[k], ssrc[k]);
    } else {
      const int cols = Kdim - icol;
#pragma unroll
      for (int k = 0; k < CH; k++)
        if (xdst[k] >= 0 && 8 * ((tid + k * THREADS) % PER) < cols) dg_cp_async16_nz(slot + xdst[k], xsrc[k]);
#pragma unroll
      for (int k = 0; k < CHS; k++)
        if (sdst[k] >= 0 && (tid + k * THREADS) / NTOK * GS < cols) dg_cp_async4_nz(slot + sdst[k], ssrc[k]);
    }
#pragma unroll
    for (int k = 0; k < CH; k++) xsrc[k] += KA;
#pragma unroll
    for (int k = 0; k < CHS; k++) ssrc[k] += KA / GS;
  }
};

/* One weight stage of the DIET loop: qr_stage_products' products and folds (not BM, not DQ) with the activation
 * fragments at xl (the lane's address in its ring slot: (8 j + g) XS + 16 t from the slot, j = 0) and the group
 * sums at sl (the slot's sums + 8 t), sub-stage sub of the slot. */
template <int BITS, int NT, int GS, int SUB>
__device__ __forceinline__ void qr_stage_diet(float (&acc)[2][NT][4], float (&part)[2][NT][4], const uint32_t *R,
                                              dg_sptr xl, dg_sptr sl, int sub) {
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, NTOK = 8 * NT, CPG = GS / 32;
  constexpr int XS = qr_xs(GS, SUB, BITS);
  const dg_sptr xs = xl + 2 * KC * sub, ss = sl + 4 * NTOK * GPS * sub;
#pragma unroll
  for (int c = 0; c < RUNS; c++) {
    uint32_t bf[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const uint4 u = dg_lds16(xs + 8 * j * XS + 64 * c);
      bf[j][0] = u.x; bf[j][1] = u.y; bf[j][2] = u.z; bf[j][3] = u.w;
    }
    qr_run_mma<BITS, NT, RUNS>(RAW ? acc : part, R, bf, c);
    if constexpr (!RAW) {
      if ((c + 1) % CPG == 0) {
        const int lg = c / CPG;
        float2 xsum[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) xsum[j] = dg_lds8f(ss + 4 * (lg * NTOK + 8 * j));
        qr_fold_group<BITS, NT, GS>(acc, part, R, lg, xsum);
      }
    }
  }
}

/* One pass of qr_body for DIET (register stages, D > 0; see above), its outputs stored (qr_epilogue): the ring's
 * first STAGES - 1 activation stages, the first D - 1 weight stages, then FAST iterations (D weight stages each)
 * while everything they load, prefetch and issue exists and is whole, then qr_body's tested iterations. xrow, srow:
 * the pass's row table (qe_pass_rows); mvalid, row0, mp, slab: qe_store's; wstage0 / wq: the warp's stage 0 and the
 * lane's piece of it; nst weight and nsa activation stages; smem: the ring (STAGES slots of STB bytes). PRE 1 (lab
 * version 109, dev/cuda/qr_diet_lab.cuh qr_early_kernel): the caller has already copied the lane's records of weight
 * stages 0 .. D - 2 by cp.async into shared memory at W0 (D - 1 records of RW words, one commit group before the
 * pass, so older than the ring's first STAGES - 1) and issued the pass's first L2 prefetches, as this function
 * would; they are read into the same registers, so the same arithmetic. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF, int CP, int PRE = 0>
__device__ __forceinline__ void qr_diet_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                             const bool (&mvalid)[2], int row0, int mp, int slab,
                                             const unsigned char *wstage0, const unsigned char *wq, int nst, int nsa,
                                             int tid, unsigned char *smem, const uint32_t *W0 = nullptr) {
  constexpr int KC = qr_kc(GS, BITS), RW = qr_rec(BITS, GS) / 4, NTOK = 8 * NT, KA = SUB * KC;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, STB = XB + qr_sbb(GS, SUB, NT, 0);
  constexpr int APF = PF < 0 ? -PF : PF, GPW = BITS == 16 ? 0 : KC / GS, THREADS = 32 * WARPS;
  constexpr int64_t sstride = (int64_t)WARPS * qr_wstage(BITS, GS, CP); /* bytes of a stage of the slab */
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, Kdim = a.Kdim;
  const dg_sptr sbase = dg_sp(smem);
  float acc[2][NT][4], part[2][NT][4];
  qe_zero(acc);
  qe_zero(part);
  qr_xdiet<GS, NTOK, THREADS, KA, XS, XB, GPW, SUB> xc;
  xc.init(a, xrow, srow, tid);
  /* FAST iterations it .. it + D - 1 load weight stages up to it + 2 D - 2 and prefetch APF past them, and
   * issue activation stages up to (it + D - SUB) / SUB + STAGES - 1, all whole when it + FAST <= nst */
  constexpr int FAST = 2 * D - 1 + APF > D + (STAGES - 1) * SUB ? 2 * D - 1 + APF : D + (STAGES - 1) * SUB;
  int islot = 0, icol = 0, cslot = 0;
  auto issue = [&](auto full) {
    xc.template issue<decltype(full)::value>(sbase + islot * STB, icol, Kdim, tid);
    islot = islot == STAGES - 1 ? 0 : islot + 1;
    icol += KA;
  };
#pragma unroll
  for (int sa = 0; sa < STAGES - 1; sa++) {
    if (sa < nsa) issue(std::false_type());
    dg_cp_commit();
  }
  uint32_t W[D][RW];
  const unsigned char *wnext = wq;
  if constexpr (PRE) { /* the first D - 1 weight stages (and the first L2 prefetches) were issued by the caller into
                        * shared memory at W0 (lab version 109): their group is older than the ring's STAGES - 1 */
    static_assert(RW % 4 == 0, "records of whole 16-byte pieces");
    dg_cp_wait<STAGES - 1>();
    const dg_sptr w0 = dg_sp(W0);
#pragma unroll
    for (int d = 0; d < D - 1; d++)
      if (d < nst) {
#pragma unroll
        for (int k = 0; k < RW / 4; k++) { /* asm volatile loads: never moved above the wait (a plain load was: its
                                            * asm has no memory clobber, and nvcc hoisted the reads above the copies) */
          const uint4 v = dg_lds16(w0 + 16 * (d * RW / 4 + k));
          W[d][4 * k] = v.x; W[d][4 * k + 1] = v.y; W[d][4 * k + 2] = v.z; W[d][4 * k + 3] = v.w;
        }
        wnext += sstride;
      }
  } else {
    qr_prefetch_first<BITS, GS, CP, PF>(wstage0, wq, lane, nst, sstride);
#pragma unroll
    for (int d = 0; d < D - 1; d++)
      if (d < nst) {
        qr_load_stage<BITS, GS, CP, PF>(W[d], wnext, lane, g, d, nst, sstride);
        wnext += sstride;
      }
  }
  const dg_sptr xl0 = sbase + g * XS + 16 * t, sl0 = sbase + XB + 8 * t;
  /* activation stage sa begins at weight stage s: its slot, its copies complete for every warp, the next issued */
  auto astage = [&](int s, auto full) {
    if (s > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
    dg_cp_wait<STAGES - 2>();
    __syncthreads();
    if (decltype(full)::value || s / SUB + STAGES - 1 < nsa) issue(full);
    dg_cp_commit();
  };
  int it = 0;
  if constexpr (D % SUB == 0) {
    for (; it + FAST <= nst; it += D) {
#pragma unroll
      for (int d = 0; d < D; d++) {
        const int s = it + d;
        qr_load_stage<BITS, GS, CP, PF, true>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
        wnext += sstride;
        if (d % SUB == 0) astage(s, std::true_type());
        qr_stage_diet<BITS, NT, GS, SUB>(acc, part, W[d], xl0 + cslot * STB, sl0 + cslot * STB, d % SUB);
      }
    }
  }
  for (; it < nst; it += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int s = it + d;
      if (s < nst) {
        if (s + D - 1 < nst) {
          qr_load_stage<BITS, GS, CP, PF>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
          wnext += sstride;
        }
        const int sub = D % SUB == 0 ? d % SUB : s % SUB;
        if (sub == 0) astage(s, std::false_type());
        qr_stage_diet<BITS, NT, GS, SUB>(acc, part, W[d], xl0 + cslot * STB, sl0 + cslot * STB, sub);
      }
    }
  }
  __syncthreads(); /* every warp is done with the ring before the next pass refills it (or qr_store_hp uses it) */
  qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, row0, mp, slab, warp, g, t, smem);
}

/* qr_body's hooks (TL): the slab count per expert of the weight stack (slabs(): the grid's y here, the lab's version
 * 114 a ticket's; session 26, the PTX of qmoe_r*.cu unchanged by it: docs/cuda.md "Session 26 (helper fg11)") and the
 * timeline's (below): none in the backend (every call inlines to nothing: the PTX unchanged but for the
 * mangled names of qr_body's static shared arrays, which carry the parameter); the kernel lab's version 110
 * (dev/cuda/qr_diet_lab.cuh qr_tl_stamps) records, by thread 0 of each block, the block's times at these points: its
 * row table ready (rows, the first pass), its first activation stage landed (act0, after that stage's barrier), its
 * first weight stage landed (w0: v, the word of thread 0's record that must be in its register, makes the stamp wait
 * for that load), the stage loop's end and the epilogue's end (loop, epi: the last pass), and an expert without rows
 * (empty). */
struct qr_tl_none {
  static constexpr bool on = false; /* qr_body's first iteration of stages peeled for the stamps */
  __device__ __forceinline__ void rows(int, int) const {}
  __device__ __forceinline__ void act0(int, int) const {}
  __device__ __forceinline__ void w0(int, int, uint32_t) const {}
  __device__ __forceinline__ void loop(int) const {}
  __device__ __forceinline__ void epi(int) const {}
  __device__ __forceinline__ void empty(int) const {}
  /* the slabs per expert in the weight stack (its slab index e slabs + slab): the grid's y (experts, slabs); the lab's
   * one-launch version 114 (dev/cuda/qr_diet_lab.cuh qr_fg_kernel, a 1-D grid of tickets) gives it explicitly */
  __device__ __forceinline__ unsigned slabs() const { return gridDim.y; }
};

/* qe_args as for qe_kernel, with X the permuted copy (k_group_sums_perm) and q the lane records. */
/* (A WD-deep ring of weight stages per warp in shared memory, filled by bulk copies, instead of the D register
 * stages was measured slower in session 3, lab versions 10-12, and removed.)
 * PF > 0 (register stages only): lane 0 of each warp asks L2 for the warp's weight stage PF stages ahead of
 * the one it loads (one bulk prefetch instruction per stage), so that the register loads find it in L2;
 * PF < 0: the same -PF stages ahead by per-lane line prefetches (qr_prefetch_lines). e, slab: the block's expert and slab
 * (qr_block). */
template <int BITS, int GATEUP, int NT, int GS, int WARPS, int D, int STAGES, int SUB, int PF, int CP, int BM, int NZ,
          int DQ = 0, int DIET = 0, class TL = qr_tl_none>
__device__ __forceinline__ void qr_body(const qe_args &a, unsigned char *smem, const int e, const int slab,
                                        const TL &tl = TL()) {
  /* RAW: bf16 weights (BITS 16): the records hold the weights, no pairs, no group sums, no fold: the products
   * accumulate straight into acc (GS is then only the stage's nominal group, 64) */
  constexpr bool RAW = BITS == 16;
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, GPW = RAW ? 0 : GPS, CB = 4 * RUNS * BITS,
                REC = qr_rec(BITS, GS);
  constexpr int PS = REC % 16 == 0 ? 16 : 8, RW = REC / 4;
  /* DQ (quantized stacks only): the weights dequantized to bf16 in registers (qr_dq_rows): no group sums
   * copied, no partial sums, no fold */
  static_assert(!DQ || (!RAW && !BM && D > 0), "DQ: quantized codes, register stages, no bias products");
  constexpr int GSX = DQ ? 0 : GPW; /* group sums per weight stage the activation copies carry */
  /* CP: codes in NPC pieces of PSC bytes (piece-major over the 32 lanes), then per row group g its GPS 16-byte
   * pieces of pairs, loaded by the 4 lanes (g, t) alike (one sector read, the pairs not stored 4 times) */
  constexpr int PSC = CB % 16 == 0 ? 16 : 8, WSTAGE = qr_wstage(BITS, GS, CP);
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, NTOK = 8 * NT;
  constexpr int KA = SUB * KC; /* codes per activation stage (one barrier each) */
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTOK * XS, SBB = qr_sbb(GS, SUB, NT, BM), STB = XB + SBB;
  static_assert(!BM || (SUB * GPS) % 2 == 0, "the bias products take the groups of an activation stage in pairs");
  static_assert(!(BM && NZ) && !(DIET && NZ), "NZ copies 4-byte sums; DIET copies real rows past the expert's");
  static_assert(REC % 8 == 0, "a lane record is whole 8-byte pieces");
  static_assert(GATEUP != QR_GATEUP_HP || STAGES * STB >= NTOK * (FEAT + 8) * 2, "qr_store_hp's tile fits in the ring");
  constexpr int GU = GATEUP != 0; /* a gate/up product (qe_pass_rows, qe_store) */
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  const int cnt = a.count[e];
  if (cnt == 0) {
    tl.empty(threadIdx.x);
    return;
  }
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + SUB - 1) / SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * tl.slabs() + slab;
  const int64_t sstride = (int64_t)WARPS * WSTAGE; /* bytes of a stage of the slab */
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE; /* the warp's stage 0 */
  const unsigned char *wq = wstage0 + lane * (CP ? PSC : PS);

  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GU, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    tl.rows(tid, p0);
    if constexpr (DIET && !BM && !DQ && D > 0) { /* the DIET loop (qr_diet_pass): same operations, fewer instructions */
      qr_diet_pass<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, CP>(a, xrow, srow, mvalid, base + p0, mp, slab,
                                                                         wstage0, wq, nst, nsa, tid, smem);
    } else {
      /* this thread's copies of an activation stage, fixed for the pass (qr_xcopy) */
      qr_xcopy<GS, NTOK, THREADS, KA, XS, XB, GSX, SUB, BM, NZ> xc;
      xc.init(a, xrow, srow, tid);
      /* issue() loads activation stages 0, 1, 2, ... in turn: its slot and source offsets advance by one stage */
      const dg_sptr sbase = dg_sp(smem);
      int islot = 0, icol = 0;
      auto issue = [&]() {
        xc.issue(sbase + islot * STB, icol, a.Kdim);
        islot = islot == STAGES - 1 ? 0 : islot + 1;
        icol += KA;
      };
      /* wload() loads the weight stages 0, 1, 2, ... in turn */
      const unsigned char *wnext = wq;
      int wst = 0; /* the stage wload loads next */
      auto wload = [&](uint32_t *R) {
        qr_load_stage<BITS, GS, CP, PF>(R, wnext, lane, g, wst, nst, sstride);
        wnext += sstride;
        if constexpr (PF != 0) wst++;
      };

      float acc[2][NT][4], part[DQ ? 1 : 2][DQ ? 1 : NT][4]; /* DQ: no partial sums (part unused) */
      qe_zero(acc);
      if constexpr (!DQ) qe_zero(part);
      /* BM: the A fragments of the bias products of a pair of groups (qr_bias_sel), 2 x 16 rows */
      uint32_t af[2][4] = {{0u, 0u, 0u, 0u}, {0u, 0u, 0u, 0u}};
      const uint32_t asel = qr_bias_sel<BITS>(t);

      /* one weight stage s: the lane's record R against its part (sub) of the ring slot of activation stage s / SUB */
      int cslot = 0; /* the ring slot of the activation stage being computed */
      auto compute = [&](const uint32_t *R, int s, int sub) {
        qr_stage_products<BITS, NT, GS, SUB, BM, DQ>(acc, part, af, R, smem, cslot * STB, s, sub, ng, g, t, asel);
      };

      /* activation stage sa begins: its ring slot, its copies complete for every warp, the next one issued */
      auto astage = [&](int sa) {
        if (sa > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
        dg_cp_wait<STAGES - 2>();
        __syncthreads();
        if (sa + STAGES - 1 < nsa) issue();
        dg_cp_commit();
      };
      if constexpr (D < 0) {
        qr_ring_stages<BITS, GS, WARPS, -D, STAGES, SUB, STB, PF, CP>(smem, sbase, wq, sstride, nst, nsa, warp, lane, g,
                                                                      cslot, issue, compute);
      } else {
        uint32_t W[D][RW];
#pragma unroll
        for (int sa = 0; sa < STAGES - 1; sa++) {
          if (sa < nsa) issue();
          dg_cp_commit();
        }
        qr_prefetch_first<BITS, GS, CP, PF>(wstage0, wq, lane, nst, sstride);
#pragma unroll
        for (int d = 0; d < D - 1; d++)
          if (d < nst) wload(W[d]);
        int it0 = 0;
        if constexpr (TL::on) { /* the timeline's stamps in a copy of the first iteration, not in the loop */
#pragma unroll
          for (int d = 0; d < D; d++)
            if (d < nst) {
              if (d + D - 1 < nst) wload(W[(d + D - 1) % D]);
              const int sub = d % SUB;
              if (sub == 0) astage(d / SUB);
              if (d == 0) {
                tl.act0(tid, p0);
                tl.w0(tid, p0, W[0][0]);
              }
              compute(W[d], d, sub);
            }
          it0 = D;
        }
        for (int it = it0; it < nst; it += D) {
#pragma unroll
          for (int d = 0; d < D; d++) {
            const int s = it + d;
            if (s < nst) {
              if (s + D - 1 < nst) wload(W[(d + D - 1) % D]); /* the slot of stage s - 1, computed */
              const int sub = D % SUB == 0 ? d % SUB : s % SUB;
              if (sub == 0) astage(s / SUB); /* s = SUB sa */
              compute(W[d], s, sub);
            }
          }
        }
      }
      __syncthreads(); /* every warp is done with the ring before the next pass refills it */
      tl.loop(tid);

      qr_epilogue<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t, smem);
      tl.epi(tid);
    }
  }
}

/* The kernel: qr_body with 8 NT tokens per pass; NTS > 0: an expert of at most 8 NTS rows takes the body of NTS
 * n-tiles instead (one pass, fewer products and folds on the tiles that would be empty; registers and shared
 * memory are those of the larger body). NZ: the activation copies of tokens past the expert's rows are skipped
 * instead of zero-filled (their ring rows keep stale values, which reach only the output columns of those tokens,
 * never stored), so a copy needs no source size. */
template <int BITS, int GATEUP, int NT, int GS, int WARPS = QR_WARPS, int D = QR_D, int STAGES = QR_STAGES,
          int MINB = 1, int SUB = QR_SUB, int PF = 0, int CP = 1, int NTS = 0, int BM = 0, int NZ = 0, int DQ = 0,
          int DIET = 0>
__global__ void __launch_bounds__(32 * WARPS, MINB) qr_kernel(qe_args a) {
  DG_PDL_LAUNCH();
  qr_prewait<BITS, GATEUP, GS, WARPS, CP>(a); /* QR_PREWAIT: L2 prefetches of the slab's first weight stages */
  DG_PDL_WAIT();
  DG_DYN_SMEM16(smem);
  int e, slab;
  qr_block(a, &e, &slab);
  if constexpr (NTS > 0 && NTS < NT) {
    if (a.count[e] <= 8 * NTS) {
      qr_body<BITS, GATEUP, NTS, GS, WARPS, D, STAGES, SUB, PF, CP, BM, NZ, DQ, DIET>(a, smem, e, slab);
      return;
    }
  }
  qr_body<BITS, GATEUP, NT, GS, WARPS, D, STAGES, SUB, PF, CP, BM, NZ, DQ, DIET>(a, smem, e, slab);
}

/* Lets kern take smem bytes of dynamic shared memory above the 48 KiB default: one cudaFuncSetAttribute per kernel
 * (*set, the caller's static flag per instantiation); a no-op on the CPU emulation. Returns its error. */
static inline cudaError_t qr_allow_smem(void (*kern)(qe_args), size_t smem, int *set) {
#ifndef DG_CUDA_EMU
  if (!*set && smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    *set = 1;
  }
#else
  (void)kern;
  (void)smem;
  (void)set;
#endif
  return cudaSuccess;
}

template <int BITS, int GATEUP, int NT, int GS, int WARPS = QR_WARPS, int D = QR_D, int STAGES = QR_STAGES,
          int MINB = 1, int SUB = QR_SUB, int PF = 0, int CP = 1, int NTS = 0, int BM = 0, int NZ = 0, int DQ = 0,
          int DIET = 0>
static cudaError_t qr_launch_g(cudaStream_t s, dim3 grid, const qe_args &a) {
  constexpr int NTOK = 8 * NT, XB = NTOK * qr_xs(GS, SUB, BITS), SBB = qr_sbb(GS, SUB, NT, BM);
  void (*kern)(qe_args) = qr_kernel<BITS, GATEUP, NT, GS, WARPS, D, STAGES, MINB, SUB, PF, CP, NTS, BM, NZ, DQ, DIET>;
  /* D < 0: the weight ring of -D stages after the activation ring (qr_body) */
  constexpr size_t RING = D < 0 ? (size_t)(-D) * WARPS * (qr_cb(BITS, GS) / 16 + qr_kc(GS, BITS) / GS) * 32 * 16 : 0;
  const size_t smem = (size_t)STAGES * (XB + SBB) + RING;
  static int set = 0; /* one attribute call per instantiation */
  const cudaError_t e = qr_allow_smem(kern, smem, &set);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, grid, 32 * WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* MINB64: blocks per SM the registers are capped for at group 64 (MINB at the other groups). */
template <int BITS, int GATEUP, int NT, int WARPS = QR_WARPS, int D = QR_D, int STAGES = QR_STAGES, int MINB = 1,
          int PF = 0, int NTS = 0, int MINB64 = MINB, int DIET = 0>
static cudaError_t qr_launch_nt(cudaStream_t s, dim3 grid, const qe_args &a) {
  if constexpr (BITS == 16) { /* bf16: no groups, stages of 64 weights */
    if (a.group != QR_BF16_GROUP) return cudaErrorInvalidValue;
    return qr_launch_g<16, GATEUP, NT, QR_BF16_GROUP, WARPS, D, STAGES, MINB, QR_SUB, PF, 1, NTS, 0, 0, 0, DIET>(s, grid, a);
  } else { /* (bf16 never launches the group kernels: not instantiated for it, they were 24 of qmoe_r16.cu's 36) */
    switch (a.group) {
    case 32: return qr_launch_g<BITS, GATEUP, NT, 32, WARPS, D, STAGES, MINB, QR_SUB, PF, 1, NTS, 0, 0, 0, DIET>(s, grid, a);
    case 64: return qr_launch_g<BITS, GATEUP, NT, 64, WARPS, D, STAGES, MINB64, QR_SUB, PF, 1, NTS, 0, 0, 0, DIET>(s, grid, a);
    case 128: /* QR_GATEUP_HP: not instantiated (a down group of 128 spans two gate/up blocks: k_qe_dn_fuse_group) */
      if constexpr (GATEUP == QR_GATEUP_HP) return cudaErrorInvalidValue;
      else return qr_launch_g<BITS, GATEUP, NT, 128, WARPS, D, STAGES, MINB, QR_SUB, PF, 1, NTS, 0, 0, 0, DIET>(s, grid, a);
    default: return cudaErrorInvalidValue;
    }
  }
}

/* The lean 8-tile products (session 31: lab version 139 of session 29's helper wp11, measured on an H100 in session
 * 31; docs/cuda.md "Measured on an H100 in session 31"): the down product's launch at 8 n-tiles (more than 32 rows
 * per expert on average: at the 26B's top-8 of 128 experts a stacked batch pass of more than 512 rows, a prompt's
 * encoder pass of 1,024 tokens) with the 4-bit g64 stacks, unless DGEMMA_QR_LAUNCH=v50 (qr_launch_form). */
#define QR_LEAN_NTOK 64 /* tokens of a lean pass: 8 n-tiles */

/* One weight stage of the lean order: the same products and folds as qr_kernel's stage at NT n-tiles (qr_run_mma,
 * then qr_fold_group per group) in another order. Per group lg of the stage, the A fragments of its CPG runs decoded
 * once, then n-tile by n-tile the group's partial sums P (2 m-tiles x 4, from 0) by the runs' mma in their order (run
 * c: a0 then a1, c ascending: the order qr_run_mma gives every (m-tile, n-tile) element) and at once folded into acc
 * by qr_fold_group's fmaf chain. Every element sees the same operations in the same order, so every output word is
 * qr_kernel's (the GPU lab, session 31: every row "= v50"; the emulation: dev/cuda/qr_lm_emu.cpp, test_cuda's
 * test_quant_experts_diet). What changes is what is live: 8 partial sums instead of 16 NT (64 at 8 n-tiles): 386
 * instructions per weight stage against qr_kernel's 484.5 at the same 255 registers (SASS, session 29). R: the
 * lane's record of the stage (qr_load_stage); xl, sl: the lane's activation and group-sum rows of the ring slot
 * (NTR tokens); sub: the weight stage within the activation stage. QR_LEAN_MUTATE (dev/cuda/qr_lm_emu.cpp's mutation
 * check only): the runs in the other order, so the words must differ. */
template <int BITS, int NT, int GS, int SUB, int NTR>
__device__ __forceinline__ void qr_lean_stage(float (&acc)[2][NT][4], const uint32_t *R, dg_sptr xl, dg_sptr sl,
                                              int sub) {
  constexpr int KC = qr_kc(GS, BITS), RUNS = KC / 32, GPS = KC / GS, CPG = GS / 32, CB = 4 * RUNS * BITS;
  constexpr int XS = qr_xs(GS, SUB, BITS);
  constexpr float OFF = BITS == 8 ? 0.0f : 128.0f;
  static_assert(BITS != 16 && GS % 32 == 0 && RUNS % CPG == 0, "qr_lean_stage: quantized weights, whole groups");
  const dg_sptr xs = xl + 2 * KC * sub, ss = sl + 4 * NTR * GPS * sub;
#pragma unroll
  for (int lg = 0; lg < GPS; lg++) {
    uint32_t af[CPG][2][8]; /* run, m-tile: a0 (4 words), a1 (4 words), as qr_run_mma builds them */
#pragma unroll
    for (int cc = 0; cc < CPG; cc++) {
      const int c = lg * CPG + cc;
#pragma unroll
      for (int mt = 0; mt < 2; mt++) {
        uint32_t pg[4], p8[4];
        qr_codes<BITS>(R, ((2 * mt) * RUNS + c) * BITS, pg);
        qr_codes<BITS>(R, ((2 * mt + 1) * RUNS + c) * BITS, p8);
        af[cc][mt][0] = pg[0]; af[cc][mt][1] = p8[0]; af[cc][mt][2] = pg[1]; af[cc][mt][3] = p8[1];
        af[cc][mt][4] = pg[2]; af[cc][mt][5] = p8[2]; af[cc][mt][6] = pg[3]; af[cc][mt][7] = p8[3];
      }
    }
    float s0[2], b0[2], s8[2], b8[2]; /* qr_fold_group's pairs of group lg, bias shifted by -OFF s */
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
      qe_pair_u32(R[CB / 4 + (2 * mt) * GPS + lg], DG_CUDA_BF16, &s0[mt], &b0[mt]);
      qe_pair_u32(R[CB / 4 + (2 * mt + 1) * GPS + lg], DG_CUDA_BF16, &s8[mt], &b8[mt]);
      b0[mt] = fmaf(-OFF, s0[mt], b0[mt]);
      b8[mt] = fmaf(-OFF, s8[mt], b8[mt]);
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
      float P[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int c0 = 0; c0 < CPG; c0++) {
#ifdef QR_LEAN_MUTATE
        const int cc = CPG - 1 - c0;
#else
        const int cc = c0;
#endif
        const uint4 u = dg_lds16(xs + 8 * j * XS + 64 * (lg * CPG + cc));
        const uint32_t bf[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          dg_mma_bf16(P[mt], &af[cc][mt][0], &bf[0]);
          dg_mma_bf16(P[mt], &af[cc][mt][4], &bf[2]);
        }
      }
      const float2 xsum = dg_lds8f(ss + 4 * (lg * NTR + 8 * j));
#pragma unroll
      for (int mt = 0; mt < 2; mt++) {
        float *A = acc[mt][j];
        A[0] = fmaf(b0[mt], xsum.x, fmaf(s0[mt], P[mt][0], A[0]));
        A[1] = fmaf(b0[mt], xsum.y, fmaf(s0[mt], P[mt][1], A[1]));
        A[2] = fmaf(b8[mt], xsum.x, fmaf(s8[mt], P[mt][2], A[2]));
        A[3] = fmaf(b8[mt], xsum.y, fmaf(s8[mt], P[mt][3], A[3]));
      }
    }
  }
}

/* One lean pass of mp <= 64 tokens (row0 their first grouped row) at NT n-tiles for the block's QR_WARPS warps: the
 * activation ring of QR_STAGES slots of 64 tokens (qr_xdiet's copies, QR_SUB weight stages each), each warp's weight
 * stages (its slab rows' lane records, QR_D register stages, line prefetches QR_PF stages ahead: qr_kernel's choices
 * at 8 n-tiles), qr_lean_stage per weight stage, the outputs stored (qe_store). xrow, srow: the pass's row table
 * (qe_pass_rows); wstage0 / wq: the warp's stage 0 and the lane's piece of it; nst, nsa: weight and activation stages
 * of the K dimension. Ends with a block barrier after the ring's last use (the next pass refills it). */
template <int BITS, int GATEUP, int NT, int GS>
__device__ __forceinline__ void qr_lean_pass(const qe_args &a, const int64_t *xrow, const int64_t *srow,
                                             const bool (&mvalid)[2], int row0, int mp, int slab,
                                             const unsigned char *wstage0, const unsigned char *wq, int nst, int nsa,
                                             int tid, int warp, unsigned char *smem) {
  constexpr int THREADS = 32 * QR_WARPS, D = QR_D, STAGES = QR_STAGES, SUB = QR_SUB, PF = -QR_PF, NTR = QR_LEAN_NTOK;
  constexpr int KC = qr_kc(GS, BITS), RW = qr_rec(BITS, GS) / 4, KA = SUB * KC, GPW = KC / GS;
  constexpr int XS = qr_xs(GS, SUB, BITS), XB = NTR * XS, STB = XB + qr_sbb(GS, SUB, NTR / 8, 0);
  constexpr int64_t sstride = (int64_t)QR_WARPS * qr_wstage(BITS, GS, 1);
  const int lane = tid & 31, g = lane >> 2, t = lane & 3, Kdim = a.Kdim;
  const dg_sptr sbase = dg_sp(smem);
  float acc[2][NT][4];
  qe_zero(acc);
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
  qr_prefetch_first<BITS, GS, 1, PF>(wstage0, wq, lane, nst, sstride);
#pragma unroll
  for (int d = 0; d < D - 1; d++)
    if (d < nst) {
      qr_load_stage<BITS, GS, 1, PF>(W[d], wnext, lane, g, d, nst, sstride);
      wnext += sstride;
    }
  const dg_sptr xl0 = sbase + g * XS + 16 * t, sl0 = sbase + XB + 8 * t;
  for (int it = 0; it < nst; it += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int s = it + d;
      if (s < nst) {
        if (s + D - 1 < nst) {
          qr_load_stage<BITS, GS, 1, PF>(W[(d + D - 1) % D], wnext, lane, g, s + D - 1, nst, sstride);
          wnext += sstride;
        }
        const int sub = D % SUB == 0 ? d % SUB : s % SUB;
        if (sub == 0) { /* activation stage s / SUB begins: its slot, its copies complete, the next issued */
          if (s > 0) cslot = cslot == STAGES - 1 ? 0 : cslot + 1;
          dg_cp_wait<STAGES - 2>();
          __syncthreads();
          if (s / SUB + STAGES - 1 < nsa) issue();
          dg_cp_commit();
        }
        qr_lean_stage<BITS, NT, GS, SUB, NTR>(acc, W[d], xl0 + cslot * STB, sl0 + cslot * STB, sub);
      }
    }
  }
  dg_cp_wait<0>();
  __syncthreads(); /* every warp is done with the ring before the next pass refills it */
  qe_store<GATEUP, NT, QR_WARPS>(a, acc, mvalid, row0, mp, slab, warp, g, t);
}

/* The lean kernel: qr_kernel's grid and block order (qr_block: with a.order the experts by descending count, each
 * expert's slabs one after another), each expert's rows in passes of 64 tokens, the 8-tile body, or the 6-tile body
 * for an expert of at most 48 rows (qr_kernel's NTS 6 at 8 n-tiles), with qr_lean_pass. MINB: blocks per SM the
 * registers are capped for (1: qr_kernel's choice at 8 n-tiles, 255 registers and no spill for 4-bit g64; 3, lab
 * version 138: 168 and a spill, slower). Shared memory: QR_STAGES x (64 tokens' activations + group sums). */
template <int BITS, int GATEUP, int GS, int MINB>
__global__ void __launch_bounds__(32 * QR_WARPS, MINB) qr_lean_kernel(qe_args a) {
  DG_PDL_LAUNCH();
  qr_prewait<BITS, GATEUP, GS, QR_WARPS, 1>(a); /* QR_PREWAIT: L2 prefetches of the slab's first weight stages */
  DG_PDL_WAIT();
  DG_DYN_SMEM16(smem);
  constexpr int WARPS = QR_WARPS, THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS, GU = GATEUP != 0;
  constexpr int KC = qr_kc(GS, BITS), WSTAGE = qr_wstage(BITS, GS, 1), PSC = qr_cb(BITS, GS) % 16 == 0 ? 16 : 8;
  static_assert(GATEUP == 0 || GATEUP == 1, "qr_lean_kernel: no QR_GATEUP_HP epilogue");
  __shared__ int64_t xrow[QR_LEAN_NTOK], srow[QR_LEAN_NTOK];
  int e, slab;
  qr_block(a, &e, &slab);
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int slabs = (int)gridDim.y, base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ng = a.Kdim / GS, nst = a.Kdim / KC, nsa = (nst + QR_SUB - 1) / QR_SUB;
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int64_t si = (int64_t)e * slabs + slab, sstride = (int64_t)WARPS * WSTAGE;
  const unsigned char *wstage0 = (const unsigned char *)a.q + si * nst * sstride + (int64_t)warp * WSTAGE;
  const unsigned char *wq = wstage0 + lane * PSC;
  for (int p0 = 0; p0 < cnt; p0 += QR_LEAN_NTOK) {
    const int mp = min(QR_LEAN_NTOK, cnt - p0);
    if (p0 > 0) __syncthreads(); /* (the pass ends with a barrier before its stores; this one orders the row table) */
    qe_pass_rows<GU, QR_LEAN_NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();
    if (cnt <= 48)
      qr_lean_pass<BITS, GATEUP, 6, GS>(a, xrow, srow, mvalid, base + p0, mp, slab, wstage0, wq, nst, nsa, tid, warp,
                                        smem);
    else
      qr_lean_pass<BITS, GATEUP, 8, GS>(a, xrow, srow, mvalid, base + p0, mp, slab, wstage0, wq, nst, nsa, tid, warp,
                                        smem);
  }
}

/* Launch qr_lean_kernel over grid (E, slabs) (qr_kernel's grid); group GS only (cudaErrorInvalidValue otherwise). */
template <int BITS, int GATEUP, int MINB, int GS = 64>
static cudaError_t qr_launch_lean(cudaStream_t s, dim3 grid, const qe_args &a) {
  constexpr int XB = QR_LEAN_NTOK * qr_xs(GS, QR_SUB, BITS), SBB = qr_sbb(GS, QR_SUB, QR_LEAN_NTOK / 8, 0);
  if (a.group != GS) return cudaErrorInvalidValue;
  void (*kern)(qe_args) = qr_lean_kernel<BITS, GATEUP, GS, MINB>;
  const size_t smem = (size_t)QR_STAGES * (XB + SBB);
  static int set = 0; /* one attribute call per instantiation */
  const cudaError_t e = qr_allow_smem(kern, smem, &set);
  if (e != cudaSuccess) return e;
  DG_LAUNCH(kern, grid, 32 * QR_WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* Up to 3 n-tiles the registers are capped for 4 blocks per SM (QR_MINB; the lab measured it faster
 * despite a few spilled words at 3); more tiles keep the compiler's choice. From 3 n-tiles (the 256-token
 * canvas) each warp asks L2 for its weight stage QR_PF stages ahead (lab version 13: gathered 256 gate/up
 * 144.6 vs 149.7 us, down 78.4 vs 81.5; at 1 n-tile it cost 6 %, so not there), by per-lane line prefetches
 * (lab version 18: 141.3 vs 145.4 us with lane 0's bulk prefetch, whose lane-dependent address the compiler
 * wraps in a loop over uniform registers), and at 3 n-tiles an expert of at most 16 rows takes the 2-tile body
 * (QR_NTS; with the line prefetches lab version 28: gathered 256 gate/up 137.5 vs 145.4 us, down 72.8 vs 78.0,
 * uniform M = 16 gate/up 103.6 vs 123.7). bf16 stacks (BITS 16, 32 record registers per stage) take registers for
 * 2 blocks per SM (QR_MINB16; at 4 the 3-tile body spilled: lab version 43 vs 3, session 6: gathered 256 gate/up
 * 271.0 vs 296.4 us, down 147.9 vs 157.0; uniform M = 16 269.5 vs 275.3 and 147.8 vs 150.5). At 1 n-tile the
 * quantized stacks take 6 blocks per SM (QR_MINB1; lab version 51, session 9: uniform M = 1 gate/up 91.3 vs 98.2 us,
 * down 51.0 vs 53.2: the 1.78 waves of 1,408 gate/up blocks instead of 2.13), at group 64 and 2, 3, 4 bits only:
 * there 79-80 registers and no spill, while 6- and 8-bit g64 and every width at g32 / g128 spill at that cap
 * (`nvcc -Xptxas -v`, session 9). */
/* The tile count from which the quantized stacks of group 64 take the DQ body (the weights dequantized to bf16 in
 * registers, qr_dq_rows; lab versions 70-74), 0: never. DGEMMA_QR_DQ=N (4..8) chooses it; off by default
 * until it is measured faster (it rounds each weight to bf16: a looser bound than the exact fold). qmoe.cu. */
int qr_dq_from(void);
/* Override qr_dq_from: n >= 0 (0 never, 4..8) until qr_dq_set(-1) gives the environment's choice back (the tests,
 * through dg_cuda_experts_nt). */
void qr_dq_set(int n);
/* The launch choices of the 4-bit g64 products above 3 n-tiles (DGEMMA_QR_LAUNCH, read once; qmoe.cu):
 *   QR_FORM_V50 ("v50"): qr_kernel at every tile count, session 30's choices (lab version 50 before session 31);
 *   QR_FORM_LEAN ("lean", the default): the down product's launch at 8 n-tiles the lean kernel (qr_launch_lean,
 *     MINB 1; lab version 139: on an H100 in session 31 3-6 % faster than qr_kernel at 64-128 rows per expert in both
 *     runs, ranges apart; every word the same), the rest as v50 (the gate/up product lost 1-2.5 % there);
 *   QR_FORM_LEAN5 ("lean5"): lean, and at 5 n-tiles (25-32 rows per expert on average: two stacked canvases) both
 *     products' qr_kernel with registers for 3 blocks per SM (lab versions 134 / 136 there: at uniform M 32 gate/up
 *     8 %, down 11 % faster in both runs, the same kernel source and words; off until a step measures it).
 * The words are the same under every value (the same products and folds in the same order). */
enum { QR_FORM_V50 = 0, QR_FORM_LEAN = 1, QR_FORM_LEAN5 = 2 };
int qr_launch_form(void);
/* Override qr_launch_form: f >= 0 (a QR_FORM_*) until qr_launch_form_set(-1) gives the environment's choice back. */
void qr_launch_form_set(int f);
/* The tests' launcher of the lane-record products (qmoe.cu's qr_launch calls it instead of qr_launch_bits while it
 * is set, the down product's input copy in the epilogue excepted; NULL gives the backend's back):
 * tests/support/cuda_entry.cu swaps in the kernels of the other stage loop (FLIP 1) to compare the outputs word for word. */
typedef cudaError_t (*qr_launcher)(cudaStream_t s, dim3 grid, int nt, const qe_args &a, int bits, int gateup);
void qr_launcher_set(qr_launcher f);

/* The DQ body at NT n-tiles (experts of at most 8 NTS rows take NTS), registers for 3 blocks per SM (lab version 72, session 12: uniform M = 64 gate/up 228.0 us vs 262.6 at 2), group 64 only. */
template <int BITS, int GATEUP> cudaError_t qr_launch_dq(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  switch (nt) {
  case 4: return qr_launch_g<BITS, GATEUP, 4, 64, QR_WARPS, QR_D, QR_STAGES, 3, QR_SUB, -QR_PF, 1, 3, 0, 0, 1>(s, grid, a);
  case 5: return qr_launch_g<BITS, GATEUP, 5, 64, QR_WARPS, QR_D, QR_STAGES, 3, QR_SUB, -QR_PF, 1, 4, 0, 0, 1>(s, grid, a);
  default: return qr_launch_g<BITS, GATEUP, 8, 64, QR_WARPS, QR_D, QR_STAGES, 3, QR_SUB, -QR_PF, 1, 6, 0, 0, 1>(s, grid, a);
  }
}

/* qr_kernel's stage loop at nt n-tiles: DIET 1 where bit nt of tiles is set, else 0; flip 1: the other one. */
__host__ __device__ constexpr int qr_diet_at(int nt, int tiles, int flip) { return ((tiles >> nt) & 1) ^ flip; }
/* The backend's lane-record products at nt n-tiles (qe_nt): the launch choices per tile count, the DIET loop at
 * the tile counts of the mask TILES (the backend's: QR_DIET_TILES); FLIP 1: the other stage loop at every tile count
 * (the tests' and the lab's comparison); TILES 0x1fe, FLIP 0: the diet everywhere (lab versions 96-106 outside their
 * own choices). With FLIP 0 and the backend's TILES, the 4-bit g64 stacks take qr_launch_form's choices at 5 and 8
 * n-tiles (the lean kernel for the down product at 8 by default; the words are the same under every form). */
template <int BITS, int GATEUP, int FLIP = 0, int TILES = QR_DIET_TILES>
cudaError_t qr_launch_bits(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  constexpr int MB = BITS == 16 ? QR_MINB16 : QR_MINB;
  constexpr int L1 = qr_diet_at(1, TILES, FLIP), L2 = qr_diet_at(2, TILES, FLIP), L3 = qr_diet_at(3, TILES, FLIP),
                L4 = qr_diet_at(4, TILES, FLIP), L5 = qr_diet_at(5, TILES, FLIP), L8 = qr_diet_at(8, TILES, FLIP);
  if constexpr (BITS != 16 && BITS != 6 && GATEUP != QR_GATEUP_HP) { /* QR_GATEUP_HP: no DQ body */
    const int dq = qr_dq_from();
    if (dq > 0 && nt >= dq && nt >= 4 && a.group == 64) return qr_launch_dq<BITS, GATEUP>(s, grid, nt, a);
  }
  switch (nt) {
  case 1: return qr_launch_nt<BITS, GATEUP, 1, QR_WARPS, QR_D, QR_STAGES, MB, 0, 0, BITS <= 4 ? QR_MINB1 : MB, L1>(s, grid, a);
  case 2: return qr_launch_nt<BITS, GATEUP, 2, QR_WARPS, QR_D, QR_STAGES, MB, 0, 0, MB, L2>(s, grid, a);
  case 3: return qr_launch_nt<BITS, GATEUP, 3, QR_WARPS, QR_D, QR_STAGES, MB, -QR_PF, QR_NTS, MB, L3>(s, grid, a);
  case 4: return qr_launch_nt<BITS, GATEUP, 4, QR_WARPS, QR_D, QR_STAGES, 1, -QR_PF, 3, 1, L4>(s, grid, a);
  case 5:
    if constexpr (BITS == 4 && GATEUP != QR_GATEUP_HP && FLIP == 0 && TILES == QR_DIET_TILES) /* DGEMMA_QR_LAUNCH */
      if (a.group == 64 && qr_launch_form() == QR_FORM_LEAN5)
        return qr_launch_nt<BITS, GATEUP, 5, QR_WARPS, QR_D, QR_STAGES, 1, -QR_PF, 4, 3, L5>(s, grid, a);
    return qr_launch_nt<BITS, GATEUP, 5, QR_WARPS, QR_D, QR_STAGES, 1, -QR_PF, 4, 1, L5>(s, grid, a);
  default:
    if constexpr (BITS == 4 && GATEUP == 0 && FLIP == 0 && TILES == QR_DIET_TILES) /* DGEMMA_QR_LAUNCH */
      if (a.group == 64 && qr_launch_form() != QR_FORM_V50) return qr_launch_lean<BITS, GATEUP, 1>(s, grid, a);
    return qr_launch_nt<BITS, GATEUP, 8, QR_WARPS, QR_D, QR_STAGES, 1, -QR_PF, 6, 1, L8>(s, grid, a);
  }
}

/* Host side of the lane-record layout (qmoe.cu): its bytes, and the packing of
 * an MLX stack [E * rows_per_expert, K] (codes row-major; scales and biases
 * [rows, K / group], 2 bytes each) into it; padding rows are zero. t.kc must
 * be qr_kc(t.group), t.pb 4. A bf16 stack: t.bits 16, t.group QR_BF16_GROUP,
 * codes its [rows, K] bf16 weights, scales and biases unused (NULL). */
size_t qr_tile_bytes(const qe_tiling &t);
void qr_tile_pack(const qe_tiling &t, const uint8_t *codes, const void *scales, const void *biases, uint8_t *dst);

#define DG_QR_INSTANTIATE(BITS)                                                                         \
  template cudaError_t qr_launch_bits<BITS, 0>(cudaStream_t, dim3, int, const qe_args &);             \
  template cudaError_t qr_launch_bits<BITS, 1>(cudaStream_t, dim3, int, const qe_args &);             \
  template cudaError_t qr_launch_bits<BITS, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
#endif
