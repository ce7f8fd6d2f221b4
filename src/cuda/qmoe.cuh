/* qmoe.cuh: the shared-memory-staged kernel of qmoe.cu (one instantiation
 * file per bit width, qmoe_b*.cu, so that nvcc compiles them in parallel).
 * The backend runs the register-streamed qr_kernel of qmoe_r.cuh (same math)
 * wherever it applies and this one for f32 scales and for columns that are
 * not a multiple of qr_kc (backend.cu expert_lay).
 *
 * The gathered MoE products (spec 4.6 step 4) over MLX affine-
 * quantized expert stacks on tensor cores, the weights read from device
 * memory once per pass per expert.
 *
 *   k_qe_gate_up  h[row] = bf16(gelu_tanh(G_e x) * U_e x) for every grouped row
 *   k_qe_down     y[row] = D_e h[row] (fp32)
 *   k_group_sums  S[r, j] = sum of x[r, jG .. jG + G) (fp32), the per-group
 *                 activation sums the products need
 *
 * The math (exact decomposition). A weight of group j of a row is
 * w = q s + b with the integer code q < 2^bits, so for activations x
 *     sum_k x_k w_k = sum_j ( s_j (sum_{k in j} x_k q_k) + b_j S_j ).
 * Codes are integers below 256, exact in bf16, and x is bf16, so every
 * product x_k q_k is exact and the tensor core (mma.m16n8k16, bf16 in, fp32
 * accumulate) forms P_j = sum x_k q_k with fp32 additions only; each group's
 * P_j is then folded into the fp32 accumulator, acc += s_j P_j + b_j S_j
 * (two fmaf). The weights are never rounded. This is not the CPU's sequence
 * (it dequantizes w = fl(fl(q s) + b), then a dot product in fp32):
 * tests/test_cuda.c (check_qexperts) bounds the difference of the two.
 *
 * The codes enter the tensor core as 128 + q (0x4300 | q is that bf16, one
 * mask per pair of codes, no subtraction), so the fold uses the shifted
 * bias b' = b - 128 s: s (P'_j) + b' S_j with P'_j = sum x_k (q_k + 128), the
 * same value (8-bit codes are converted exactly through fp32, offset 0).
 *
 * Layout. Block = WARPS warps, 32 WARPS weight rows of one expert (gate/up:
 * 16 WARPS output features n, their gate and up rows; down: 32 WARPS output
 * rows), all the expert's grouped rows (tokens) in passes of 8 NT. Warp w
 * owns two m-tiles of 16 rows (gate/up: gate rows n..n+15 and the up rows of
 * the same n, so GeGLU is formed in registers). Weights as A (rows), tokens
 * as B (n8 tiles). The reduction is staged KC codes at a time through a
 * STAGES-deep cp.async ring in shared memory: the codes, the (scale, bias)
 * pairs (both in the tile layout the backend packs at upload, qe_tile_*: a
 * stage of a block is one contiguous run), the activation rows (bf16, zero-
 * filled past the expert's rows) and their group sums. Within each run of 32
 * codes, lane (g, t) takes codes 8t .. 8t+7 of rows g and g+8: 4 bf16 pairs
 * (c_i, c_{i+4}); the k order inside an mma does not matter as long as B
 * matches, so the activation fragment is permuted to (x_i, x_{i+4}) with prmt.
 *
 * Every format: bits 2, 3, 4, 6, 8 (3- and 6-bit runs straddle words and are
 * funnel-shifted; 8-bit codes go through fp32: 0x4b000000 | q), groups 32,
 * 64, 128, scales/biases bf16, f16 or f32 (as (s, b) pairs). */
#ifndef DG_CUDA_QMOE_CUH
#define DG_CUDA_QMOE_CUH
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define QE_WARPS 4                  /* warps per block (the backend's choice) */
#define QE_KC 128                   /* codes per pipeline stage (the backend's choice) */
#define QE_STAGES 3                 /* depth of the cp.async ring (the backend's choice: 3 beat 4 in the lab) */

/* Bytes per weight row of a stage of kc codes: the codes and a padding that
 * makes the row stride an odd multiple of 16 bytes (6 and 8 bits: of 32), so
 * that the 8 rows a warp reads at once fall on distinct banks; rows stay
 * 16-byte aligned for cp.async. */
__host__ __device__ constexpr int qe_ws(int bits, int kc) {
  return kc * bits / 8 + (bits >= 6 ? ((kc * bits / 8) % 64 == 32 ? 0 : (96 - (kc * bits / 8) % 64) % 64)
                                    : ((kc * bits / 8) % 32 == 16 ? 0 : (48 - (kc * bits / 8) % 32) % 32));
}
/* Bytes per token row of an activation stage (64 modulo 128: conflict-free 16-byte reads). */
__host__ __device__ constexpr int qe_xs(int kc) { return kc * 2 + 64; }

struct qe_args {
  const uint32_t *q; /* [E * rows_per_expert, Kdim * BITS / 32] */
  const void *sbp;   /* (s, b) pairs, tile layout (qe_tiling) */
  int sb, group, pb; /* pair dtype, group size, bytes per pair */
  int hg;            /* qr_kernel's GATEUP QR_GATEUP_HP only (DGEMMA_DN_FUSE=1): the down product's group G, 32 or 64
                        (dividing the block's 16 WARPS features); in the 4 bytes of padding before rowbytes */
  int64_t rowbytes;  /* bytes per weight row */
  const bf16 *X;     /* gate/up: xe [T, Kdim]; down: h [T * topk, Kdim] */
  const float *xs;   /* group sums of X's rows [., Kdim / group] */
  const int32_t *count, *start, *pairs;
  const int32_t *order; /* NULL, or the experts by descending count (group_scan_kernel): qr_body's block order */
  int topk, Kdim, N; /* N: gate/up IE (features), down H (rows) */
  bf16 *h;           /* gate/up output [T * topk, IE]: as it is; qr_kernel's GATEUP QR_GATEUP_HP in the down
                        product's fragment order (k_group_sums_perm's xp), with its group sums into hs */
  union {            /* (a gate/up product writes no y: hs shares its place, so qe_args keeps its size and offsets) */
    float *y;        /* down output [T * topk, H] */
    float *hs;       /* qr_kernel's GATEUP QR_GATEUP_HP: the group sums of h's rows [T * topk, IE / hg]
                        (k_group_sums_perm's out) */
  };
  int stage_bytes, w_bytes, x_bytes, sb_bytes, xsr;
};
/* The backend's hybrid gate/up (DGEMMA_WL=1, qmoe_wl.cu; wl_kernel in qmoe_wl.cuh): experts of at least this many
 * rows to wl_kernel (version 122's instantiation), the others to qr_kernel (session 24: 122 beat the backend's kernel
 * by 1.3-1.6x on an H100 at 128 and 256 rows per expert, lost at 64). */
#define WL_MIN_ROWS 128
/* DGEMMA_WL=1 (qmoe_wl.cu): k_wl_split writes count split at WL_MIN_ROWS into wl_count [2 E] (first E: the experts
 * under it, 0 for the others; then those at or over it, 0 for the others), so that qr_kernel (count = wl_count) and
 * wl_kernel (count = wl_count + E) each skip the other's experts with their own kernels unchanged; k_wl_gate_up
 * launches wl_kernel over E experts with a0 as qr_kernel's gate/up arguments (X = xp) and W->wl, the wl layout. */
cudaError_t k_wl_split(cudaStream_t s, const int32_t *count, int32_t *wl_count, int E);
cudaError_t k_wl_gate_up(cudaStream_t s, const dg_cuda_w *W, const qe_args &a0, int E);

/* The tile layout of an expert stack for blocks of `warps` warps and stages
 * of kc codes (what the backend uploads, backend.cu up_experts): the stack is
 * cut into slabs of 32 warps rows (gate/up: 16 warps features of one expert,
 * their gate rows and up rows interleaved as the block's warps take them;
 * down: 32 warps consecutive rows), slab after slab (expert-major), padded
 * with unused rows past the last feature; inside a slab stage after stage,
 * inside a stage row after row, each row's codes of that stage (and, in the
 * pair array, each row's (scale, bias) pairs of that stage), so that a
 * block's stage is one contiguous run. */
struct qe_tiling {
  int warps, kc, gateup, bits, group, pb; /* pb: bytes per (scale, bias) pair */
  int cp;                                 /* lane records (qmoe_r.cuh): the compact layout (qr_wstage) */
  int64_t E, N, K;                        /* experts; features (gate/up) or rows (down) per expert; columns */
};
/* The tiling of a stack [E * rows_per_expert, K] of `rows` rows (gate/up: E * 2 N, down: E * N). */
__host__ inline qe_tiling qe_tiling_of(int warps, int kc, int gateup, int bits, int group, int pb, int64_t E,
                                       int64_t rows, int64_t K) {
  qe_tiling t;
  t.warps = warps; t.kc = kc; t.gateup = gateup; t.bits = bits; t.group = group; t.pb = pb;
  t.cp = 1;
  t.E = E; t.N = gateup ? rows / E / 2 : rows / E; t.K = K;
  return t;
}

/* Tokens per pass of the launchers, / 8: 8 nt covers the expected rows per
 * expert (T top_k / E) with room for the spread of random routing; more rows
 * take extra passes. */
__host__ inline int qe_nt(int T, int K, int E) {
  const double m = (double)T * K / E;
  if (m <= 4) return 1;  /* P(an expert has more than 8 rows) is small below 4 on average */
  if (m <= 9) return 2;
  if (m <= 16) return 3; /* the 256-token canvas: 16 on average, more than 24 for ~2.5 % of the experts */
  if (m <= 24) return 4;
  if (m <= 32) return 5; /* the 512-token batch: 32 on average (qr_kernel; qe_kernel takes 8 for it) */
  return 8;
}

/* Slabs per expert and rows per slab. */
__host__ __device__ inline int64_t qe_slabs(const qe_tiling &t) {
  const int64_t per = t.gateup ? 16 * t.warps : 32 * t.warps;
  return (t.N + per - 1) / per;
}
/* Global row (in the stack's [E * rows_per_expert, K] order) of row r of slab sl of expert e, or -1 (padding). */
__host__ __device__ inline int64_t qe_tile_row(const qe_tiling &t, int64_t e, int64_t sl, int r) {
  if (t.gateup) {
    const int64_t n = sl * 16 * t.warps + (r >> 5) * 16 + (r & 15), part = (r >> 4) & 1;
    return n < t.N ? e * 2 * t.N + part * t.N + n : -1;
  }
  const int64_t n = sl * 32 * t.warps + r;
  return n < t.N ? e * t.N + n : -1;
}
/* Byte offsets of row r's codes / pairs of stage s in slab index si (= e * slabs + sl). */
__host__ __device__ inline int64_t qe_tile_code_off(const qe_tiling &t, int64_t si, int s, int r) {
  const int64_t rows = 32 * t.warps, kc = t.K - (int64_t)s * t.kc < t.kc ? t.K - (int64_t)s * t.kc : t.kc;
  return si * rows * (t.K * t.bits / 8) + (int64_t)s * rows * (t.kc * t.bits / 8) + r * (kc * t.bits / 8);
}
__host__ __device__ inline int64_t qe_tile_pair_off(const qe_tiling &t, int64_t si, int s, int r) {
  const int64_t rows = 32 * t.warps, kc = t.K - (int64_t)s * t.kc < t.kc ? t.K - (int64_t)s * t.kc : t.kc;
  return (si * rows * (t.K / t.group) + (int64_t)s * rows * (t.kc / t.group) + r * (kc / t.group)) * t.pb;
}

/* The decoding shared by qe_codes and qr_codes (qmoe_r.cuh): the bits of a lane's 8 codes c0..c7, packed as
 * stored, to the 4 bf16 pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) of 128 + c (8 bits: c): 4 bits from one word
 * v, 2 bits from v with codes 0-3 in bits 0-7 and 4-7 in bits 16-23, 3 bits from the 24 bits r, 6 bits from the
 * 48 bits (lo, hi), 8 bits from the bytes (x, y) (through fp32: 2^23 + q exactly, then a bf16 pair, exact as
 * q < 256 has 8 significant bits). */
#define QE_MAG 0x43004300u /* bf16 128 in both halves */
__device__ __forceinline__ void qe_dec4(uint32_t v, uint32_t P[4]) {
#pragma unroll
  for (int i = 0; i < 4; i++) P[i] = dg_and_or(v >> (4 * i), 0x000f000fu, QE_MAG);
}
__device__ __forceinline__ void qe_dec2(uint32_t v, uint32_t P[4]) {
#pragma unroll
  for (int i = 0; i < 4; i++) P[i] = dg_and_or(v >> (2 * i), 0x00030003u, QE_MAG);
}
__device__ __forceinline__ void qe_dec3(uint32_t r, uint32_t P[4]) {
  const uint32_t v = (r & 0xfffu) | ((r << 4) & 0x0fff0000u);
#pragma unroll
  for (int i = 0; i < 4; i++) P[i] = dg_and_or(v >> (3 * i), 0x00070007u, QE_MAG);
}
__device__ __forceinline__ void qe_dec6(uint32_t lo, uint32_t hi, uint32_t P[4]) {
  const uint32_t c03 = lo & 0xffffffu, c47 = (lo >> 24) | ((hi & 0xffffu) << 8);
  const uint32_t v01 = (c03 & 0xfffu) | ((c47 & 0xfffu) << 16), v23 = (c03 >> 12) | ((c47 >> 12) << 16);
  P[0] = dg_and_or(v01, 0x003f003fu, QE_MAG);
  P[1] = dg_and_or(v01 >> 6, 0x003f003fu, QE_MAG);
  P[2] = dg_and_or(v23, 0x003f003fu, QE_MAG);
  P[3] = dg_and_or(v23 >> 6, 0x003f003fu, QE_MAG);
}
__device__ __forceinline__ void qe_dec8(uint32_t x, uint32_t y, uint32_t P[4]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t sel = 0x7540u | (uint32_t)i;
    const float lo = __uint_as_float(dg_prmt(x, 0x4b000000u, sel)) - 8388608.0f;
    const float hi = __uint_as_float(dg_prmt(y, 0x4b000000u, sel)) - 8388608.0f;
    P[i] = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
  }
}

/* This lane's 8 codes of one row's run of 32 (at p: the run's first byte
 * plus t * BITS) as the 4 bf16 pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7)
 * of 128 + c (8 bits: c). */
template <int BITS> __device__ __forceinline__ void qe_codes(const unsigned char *p, uint32_t P[4]) {
  if constexpr (BITS == 4) {
    qe_dec4(*(const uint32_t *)p, P);
  } else if constexpr (BITS == 2) {
    qe_dec2(dg_prmt(*(const uint16_t *)p, 0u, 0x4140u), P); /* codes 0-3 in bits 0-7, 4-7 in 16-23 */
  } else if constexpr (BITS == 3) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    qe_dec3(dg_funnel_r(w[0], w[1], (uint32_t)(a & 3) * 8), P); /* 24 bits */
  } else if constexpr (BITS == 6) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8;
    qe_dec6(dg_funnel_r(w[0], w[1], sh), dg_funnel_r(w[1], w[2], sh), P); /* 48 bits */
  } else { /* 8 */
    const uint2 v = *(const uint2 *)p;
    qe_dec8(v.x, v.y, P);
  }
}

/* A (scale, bias) pair of 2-byte halves (low: scale; bf16 or f16) as fp32. */
__device__ __forceinline__ void qe_pair_u32(uint32_t v, int sb, float *s, float *b) {
  if (sb == DG_CUDA_BF16) {
    *s = __uint_as_float(v << 16);
    *b = __uint_as_float(v & 0xffff0000u);
  } else {
    __half hs, hb;
    const uint16_t lo = (uint16_t)v, hi = (uint16_t)(v >> 16);
    memcpy(&hs, &lo, 2);
    memcpy(&hb, &hi, 2);
    *s = __half2float(hs);
    *b = __half2float(hb);
  }
}

__device__ __forceinline__ void qe_pair(const unsigned char *p, int sb, float *s, float *b) {
  if (sb == DG_CUDA_F32) {
    const float2 v = *(const float2 *)p;
    *s = v.x;
    *b = v.y;
  } else {
    qe_pair_u32(*(const uint32_t *)p, sb, s, b);
  }
}

__device__ __forceinline__ float qe_gelu(float a) { /* gelu_pytorch_tanh, as moe.cu and kernels.cu */
  const float k = 0.7978845608028654f;
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* The epilogue of both expert kernels (qe_kernel, qr_kernel of qmoe_r.cuh):
 * lane (g, t) holds rows g, g + 8 of its warp's two m-tiles x tokens 2t, 2t + 1
 * of each n8 tile; tokens at or past mp (this pass's rows) are not stored.
 * Gate/up: h[row0 + tk, n] = bf16(gelu(gate) up) for the warp's 16 features;
 * down: y[row0 + tk, n] for its 32 rows. */
template <int GATEUP, int NT, int WARPS>
__device__ __forceinline__ void qe_store(const qe_args &a, const float (&acc)[2][NT][4], const bool (&mvalid)[2],
                                         int row0, int mp, int slab, int warp, int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; j++) {
#pragma unroll
    for (int qq = 0; qq < 2; qq++) {
      const int tk = 8 * j + 2 * t + qq;
      if (tk >= mp) continue;
      const size_t row = (size_t)(row0 + tk);
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        if (GATEUP) {
          if (!mvalid[0]) continue;
          const int n = slab * 16 * WARPS + warp * 16 + g + 8 * hf;
          if (n >= a.N) continue; /* a last 16-feature tile past N (N not a multiple of 16) */
          a.h[row * a.N + n] = __float2bfloat16_rn(qe_gelu(acc[0][j][2 * hf + qq]) * acc[1][j][2 * hf + qq]);
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            if (!mvalid[mt]) continue;
            const int n = slab * 32 * WARPS + warp * 32 + mt * 16 + g + 8 * hf;
            if (n >= a.N) continue; /* a last 16-row tile past N (N not a multiple of 16) */
            a.y[row * a.N + n] = acc[mt][j][2 * hf + qq];
          }
        }
      }
    }
  }
}

/* The row table of a pass of mp tokens from grouped row r0: xrow[i] the element offset of token i's X row (gate/up:
 * the token of pair pairs[r0 + i]; down: grouped row r0 + i), srow[i] its row of ng group sums, -1 for i >= mp. */
template <int GATEUP, int NTOK, int THREADS>
__device__ __forceinline__ void qe_pass_rows(const qe_args &a, int64_t *xrow, int64_t *srow, int r0, int mp, int ng,
                                             int tid) {
  for (int i = tid; i < NTOK; i += THREADS) {
    int64_t xr = -1, sr = -1;
    if (i < mp) {
      const int64_t row = GATEUP ? a.pairs[r0 + i] / a.topk : r0 + i;
      xr = row * a.Kdim;
      sr = row * ng;
    }
    xrow[i] = xr;
    srow[i] = sr;
  }
}

/* acc = 0 over a lane's fragments of 2 x NT tiles. */
template <int NT> __device__ __forceinline__ void qe_zero(float (&acc)[2][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[mt][j][i] = 0.0f;
}

/* The copies of stage s of a qe_kernel pass into its ring slot (cp.async): the codes of the slab's valid rows (one
 * contiguous run for a full stage, rows of kcb bytes for the last, shorter one), the activations of the pass's tokens
 * (kc bf16 per token row, zero past the expert's rows), the (scale, bias) pairs of the valid rows and the group sums
 * (gs floats per token row). qt, pt: the slab's codes and pairs; xrow, srow: the pass's row table (qe_pass_rows). */
template <int BITS, int NT, int GS, int KC, int STAGES, int WARPS>
__device__ __forceinline__ void qe_issue(const qe_args &a, unsigned char *smem, const unsigned char *qt,
                                         const unsigned char *pt, const int64_t *xrow, const int64_t *srow, int s,
                                         int valid, int tid) {
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, WS = qe_ws(BITS, KC), XS = qe_xs(KC), NTOK = 8 * NT,
                KCB = KC * BITS / 8, PER = KCB / 16;
  unsigned char *st = smem + (size_t)(s % STAGES) * a.stage_bytes;
  unsigned char *Ws = st, *Xs = st + a.w_bytes, *Ss = Xs + a.x_bytes, *XSs = Ss + a.sb_bytes;
  const int k0 = s * KC, kc = min(KC, a.Kdim - k0), kcb = kc * BITS / 8, gs = kc / GS;
  const unsigned char *src = qt + (int64_t)s * ROWS * KCB;
  if (kc == KC) { /* a full stage: valid * KCB contiguous bytes */
    for (int i = tid; i < valid * PER; i += THREADS) {
      const int r = i / PER, c = i - r * PER;
      dg_cp_async16(Ws + r * WS + 16 * c, src + 16 * i, 16);
    }
  } else { /* the last, shorter stage: rows of kcb bytes */
    const int vec = kcb % 16 == 0 ? 16 : kcb % 8 == 0 ? 8 : 4, per = kcb / vec;
    for (int i = tid; i < valid * per; i += THREADS) {
      const int r = i / per, c = i - r * per;
      unsigned char *d = Ws + r * WS + vec * c;
      const unsigned char *q = src + (int64_t)r * kcb + vec * c;
      if (vec == 16) dg_cp_async16(d, q, 16);
      else if (vec == 8) dg_cp_async8(d, q);
      else dg_cp_async4(d, q);
    }
  }
  { /* activations: kc bf16 per token row, 16-byte pieces, zero past the expert's rows */
    const int per = kc / 8;
    for (int i = tid; i < NTOK * per; i += THREADS) {
      const int r = i / per, c = i - r * per;
      const int64_t xr = xrow[r];
      dg_cp_async16(Xs + r * XS + 16 * c, xr >= 0 ? (const void *)(a.X + xr + k0 + 8 * c) : (const void *)a.X,
                    xr >= 0 ? 16 : 0);
    }
  }
  { /* (scale, bias) pairs of the stage: valid rows x gs pairs, contiguous (a multiple of 64 bytes) */
    const unsigned char *ps = pt + (int64_t)s * ROWS * (KC / GS) * a.pb;
    const int n16 = valid * gs * a.pb / 16;
    for (int i = tid; i < n16; i += THREADS) dg_cp_async16(Ss + 16 * i, ps + 16 * i, 16);
  }
  { /* group sums: gs floats per token row */
    for (int i = tid; i < NTOK * gs; i += THREADS) {
      const int r = i / gs, c = i - r * gs;
      if (srow[r] >= 0) dg_cp_async4(XSs + a.xsr * r + 4 * c, a.xs + srow[r] + k0 / GS + c);
      else *(float *)(XSs + a.xsr * r + 4 * c) = 0.0f;
    }
  }
}

/* One run c of 32 codes of a qe_kernel stage: the warp's rows' codes (Ws, rows WS bytes apart) against the tokens'
 * activations (Xs, rows XS bytes apart) into part, mma.m16n8k16 per tile. No branches on the tokens or rows in use:
 * tokens past the expert's rows are zero in Xs (their products are zero), rows past the matrix hold stale shared
 * memory whose outputs are never stored; a branch here made the compiler repeat the unpacking inside each tile's
 * branch. */
template <int BITS, int NT, int WS, int XS>
__device__ __forceinline__ void qe_run(float (&part)[2][NT][4], const unsigned char *Ws, const unsigned char *Xs,
                                       int c, int warp, int g, int t) {
  uint32_t bf[NT][2][2];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const uint4 u = *(const uint4 *)(Xs + (8 * j + g) * XS + 64 * c + 16 * t);
    bf[j][0][0] = dg_prmt(u.x, u.z, 0x5410u); /* (x0, x4) */
    bf[j][0][1] = dg_prmt(u.x, u.z, 0x7632u); /* (x1, x5) */
    bf[j][1][0] = dg_prmt(u.y, u.w, 0x5410u); /* (x2, x6) */
    bf[j][1][1] = dg_prmt(u.y, u.w, 0x7632u); /* (x3, x7) */
  }
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    const unsigned char *p = Ws + (warp * 32 + mt * 16 + g) * WS + c * 4 * BITS + t * BITS;
    uint32_t pg[4], p8[4];
    qe_codes<BITS>(p, pg);
    qe_codes<BITS>(p + 8 * WS, p8);
    const uint32_t a0[4] = {pg[0], p8[0], pg[1], p8[1]}, a1[4] = {pg[2], p8[2], pg[3], p8[3]};
#pragma unroll
    for (int j = 0; j < NT; j++) {
      dg_mma_bf16(part[mt][j], a0, bf[j][0]);
      dg_mma_bf16(part[mt][j], a1, bf[j][1]);
    }
  }
}

/* Group lg of a qe_kernel stage is complete: acc += s P' + (b - OFF s) S, part = 0 (OFF 128, or 0 for 8-bit codes:
 * qe_codes' 128 + q); Ss the stage's (scale, bias) pairs (gs per row), XSs its group sums (a.xsr bytes per token). */
template <int BITS, int NT>
__device__ __forceinline__ void qe_fold(float (&acc)[2][NT][4], float (&part)[2][NT][4], const qe_args &a,
                                        const unsigned char *Ss, const unsigned char *XSs, int lg, int gs, int warp,
                                        int g, int t) {
  constexpr float OFF = BITS == 8 ? 0.0f : 128.0f;
#pragma unroll
  for (int mt = 0; mt < 2; mt++) {
    float s0, b0, s8, b8;
    const int r = warp * 32 + mt * 16 + g;
    qe_pair(Ss + (r * gs + lg) * a.pb, a.sb, &s0, &b0);
    qe_pair(Ss + ((r + 8) * gs + lg) * a.pb, a.sb, &s8, &b8);
    b0 = fmaf(-OFF, s0, b0);
    b8 = fmaf(-OFF, s8, b8);
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const float x0 = *(const float *)(XSs + a.xsr * (8 * j + 2 * t) + 4 * lg);
      const float x1 = *(const float *)(XSs + a.xsr * (8 * j + 2 * t + 1) + 4 * lg);
      float *A = acc[mt][j], *P = part[mt][j];
      A[0] = fmaf(b0, x0, fmaf(s0, P[0], A[0]));
      A[1] = fmaf(b0, x1, fmaf(s0, P[1], A[1]));
      A[2] = fmaf(b8, x0, fmaf(s8, P[2], A[2]));
      A[3] = fmaf(b8, x1, fmaf(s8, P[3], A[3]));
      P[0] = P[1] = P[2] = P[3] = 0.0f;
    }
  }
}

/* The tile-layout kernel: block (e, slab) computes expert e's slab over its rows in passes of 8 NT tokens, the stages
 * of KC codes through a STAGES-deep cp.async ring in shared memory (qe_issue), the products per run of 32 codes
 * (qe_run), the fold per group (qe_fold), the epilogue qe_store. */
template <int BITS, int GATEUP, int NT, int GS, int KC = QE_KC, int STAGES = QE_STAGES, int WARPS = QE_WARPS,
          int MINB = 1>
__global__ void __launch_bounds__(32 * WARPS, MINB) qe_kernel(qe_args a) {
  DG_PDL_ENTRY();
  constexpr int THREADS = 32 * WARPS, ROWS = 32 * WARPS, FEAT = 16 * WARPS;
  constexpr int WS = qe_ws(BITS, KC), XS = qe_xs(KC), NTOK = 8 * NT, KCB = KC * BITS / 8;
  static_assert(KCB % 16 == 0, "a full stage of a row is whole 16-byte pieces");
  static_assert(KC % GS == 0, "a stage holds whole groups");
  DG_DYN_SMEM16(smem);
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  const int e = blockIdx.x, slab = blockIdx.y;
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / GS;
  /* rows of the slab that exist: whole warps (gate/up) or whole m-tiles (down), a prefix of the tile */
  const int valid = GATEUP ? 32 * min(WARPS, (a.N - slab * FEAT + 15) / 16) : min(ROWS, a.N - slab * ROWS);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++) mvalid[mt] = warp * 32 + mt * 16 < valid;
  const int nst = (a.Kdim + KC - 1) / KC;
  const int64_t si = (int64_t)e * gridDim.y + slab;
  const unsigned char *qt = (const unsigned char *)a.q + si * ROWS * a.rowbytes;
  const unsigned char *pt = (const unsigned char *)a.sbp + si * ROWS * ng * a.pb;

  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0);
    qe_pass_rows<GATEUP, NTOK, THREADS>(a, xrow, srow, base + p0, mp, ng, tid);
    __syncthreads();

    float acc[2][NT][4], part[2][NT][4];
    qe_zero(acc);
    qe_zero(part);

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < nst) qe_issue<BITS, NT, GS, KC, STAGES, WARPS>(a, smem, qt, pt, xrow, srow, s, valid, tid);
      dg_cp_commit();
    }
    for (int it = 0; it < nst; it++) {
      dg_cp_wait<STAGES - 2>();
      __syncthreads();
      if (it + STAGES - 1 < nst)
        qe_issue<BITS, NT, GS, KC, STAGES, WARPS>(a, smem, qt, pt, xrow, srow, it + STAGES - 1, valid, tid);
      dg_cp_commit();
      const unsigned char *st = smem + (size_t)(it % STAGES) * a.stage_bytes;
      const unsigned char *Ws = st, *Xs = st + a.w_bytes, *Ss = Xs + a.x_bytes, *XSs = Ss + a.sb_bytes;
      const int k0 = it * KC, kc = min(KC, a.Kdim - k0), gs = kc / GS;
      constexpr int CPG = GS / 32; /* runs per group; a stage holds whole groups */
      if (kc == KC) { /* a full stage, unrolled */
#pragma unroll
        for (int c = 0; c < KC / 32; c++) {
          qe_run<BITS, NT, WS, XS>(part, Ws, Xs, c, warp, g, t);
          if ((c + 1) % CPG == 0) qe_fold<BITS, NT>(acc, part, a, Ss, XSs, c / CPG, gs, warp, g, t);
        }
      } else {
        for (int c = 0; c < kc / 32; c++) {
          qe_run<BITS, NT, WS, XS>(part, Ws, Xs, c, warp, g, t);
          if ((c + 1) % CPG == 0) qe_fold<BITS, NT>(acc, part, a, Ss, XSs, c / CPG, gs, warp, g, t);
        }
      }
    }
    __syncthreads(); /* every warp is done with the ring before the next pass refills it */

    qe_store<GATEUP, NT, WARPS>(a, acc, mvalid, base + p0, mp, slab, warp, g, t);
  }
}

/* The stage layout of a launch (qe_args' byte counts) for kc codes per stage, 8 nt tokens, `warps` warps. */
static inline void qe_layout(qe_args &a, int bits, int nt, int kc, int warps) {
  a.pb = a.sb == DG_CUDA_F32 ? 8 : 4;
  a.xsr = 4 * (kc / 32);
  if (a.xsr % 16) a.xsr += 16 - a.xsr % 16;
  a.w_bytes = 32 * warps * qe_ws(bits, kc);
  a.x_bytes = 8 * nt * qe_xs(kc);
  a.sb_bytes = 32 * warps * (kc / a.group) * a.pb;
  a.stage_bytes = a.w_bytes + a.x_bytes + a.sb_bytes + 8 * nt * a.xsr;
  a.rowbytes = (int64_t)a.Kdim * bits / 8;
}

template <int BITS, int GATEUP, int NT, int GS, int KC = QE_KC, int STAGES = QE_STAGES, int WARPS = QE_WARPS,
          int MINB = 1>
static cudaError_t qe_launch_g(cudaStream_t s, dim3 grid, qe_args a) {
  qe_layout(a, BITS, NT, KC, WARPS);
  void (*kern)(qe_args) = qe_kernel<BITS, GATEUP, NT, GS, KC, STAGES, WARPS, MINB>;
  const size_t smem = (size_t)STAGES * a.stage_bytes;
#ifndef DG_CUDA_EMU
  static size_t set = 0; /* one attribute call per instantiation and size */
  if (smem > set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = smem;
  }
#endif
  DG_LAUNCH(kern, grid, 32 * WARPS, smem, s)(a);
  return cudaGetLastError();
}

/* The group size as a template parameter (the fold points are then known to the compiler). */
template <int BITS, int GATEUP, int NT, int KC = QE_KC, int STAGES = QE_STAGES, int WARPS = QE_WARPS, int MINB = 1>
static cudaError_t qe_launch_nt(cudaStream_t s, dim3 grid, const qe_args &a) {
  switch (a.group) {
  case 32: return qe_launch_g<BITS, GATEUP, NT, 32, KC, STAGES, WARPS, MINB>(s, grid, a);
  case 64: return qe_launch_g<BITS, GATEUP, NT, 64, KC, STAGES, WARPS, MINB>(s, grid, a);
  case 128: return qe_launch_g<BITS, GATEUP, NT, 128, KC, STAGES, WARPS, MINB>(s, grid, a);
  default: return cudaErrorInvalidValue;
  }
}

template <int BITS, int GATEUP> cudaError_t qe_launch_bits(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  switch (nt) {
  case 1: return qe_launch_nt<BITS, GATEUP, 1>(s, grid, a);
  case 2: return qe_launch_nt<BITS, GATEUP, 2>(s, grid, a);
  case 3: return qe_launch_nt<BITS, GATEUP, 3>(s, grid, a);
  case 4: return qe_launch_nt<BITS, GATEUP, 4>(s, grid, a);
  default: return qe_launch_nt<BITS, GATEUP, 8>(s, grid, a);
  }
}

/* Host side of the tile layout (qmoe.cu): bytes of the codes and of the
 * pairs of a stack, and the packing of an MLX stack [E * rows_per_expert, K]
 * (codes row-major, scales and biases [rows, K / group] of sbsize bytes each)
 * into them; padding rows are zero. */
size_t qe_tile_bytes(const qe_tiling &t, size_t *pair_bytes);
void qe_tile_pack(const qe_tiling &t, const uint8_t *codes, const void *scales, const void *biases, uint8_t *tq,
                  uint8_t *tp);

/* The launchers of one width (qmoe_b<BITS>.cu instantiates them). */
#define DG_QE_INSTANTIATE(BITS)                                                                         \
  template cudaError_t qe_launch_bits<BITS, 0>(cudaStream_t, dim3, int, const qe_args &);             \
  template cudaError_t qe_launch_bits<BITS, 1>(cudaStream_t, dim3, int, const qe_args &);
#endif
