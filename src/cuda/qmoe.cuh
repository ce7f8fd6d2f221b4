/* qmoe.cuh: the kernel of qmoe.cu (one instantiation file per bit width,
 * qmoe_b*.cu, so that nvcc compiles them in parallel).
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
 * Layout. Block = 4 warps, 128 weight rows of one expert (gate/up: 64 output
 * features n, their 64 gate and 64 up rows; down: 128 output rows), all the
 * expert's grouped rows (tokens) in passes of 8 NT. Warp w owns two m-tiles
 * of 16 rows (gate/up: gate rows n..n+15 and the up rows of the same n, so
 * GeGLU is formed in registers). Weights as A (rows), tokens as B (n8 tiles):
 * at M = 16 tokens per expert the tensor cores do 2 n8 tiles per 16 rows.
 * The reduction is staged 128 codes at a time through a 4-deep cp.async ring
 * in shared memory: the packed words as stored (MLX layout), the activation
 * rows (bf16, zero-filled past the expert's rows), the (scale, bias) pairs and
 * the group sums. Within each run of 32 codes, lane (g, t) takes codes
 * 8t .. 8t+7 of rows g and g+8; its 8 codes make 4 bf16 pairs (c_i, c_{i+4})
 * by one mask (0x4300 | q is the bf16 128 + q), minus 128 exactly; the k order
 * inside an mma does not matter as long as B matches, so the activation
 * fragment is permuted to (x_i, x_{i+4}) with prmt instead of the codes.
 *
 * Every format: bits 2, 3, 4, 6, 8 (3- and 6-bit runs straddle words and are
 * funnel-shifted; 8-bit codes go through fp32: 0x4b000000 | q), groups 32,
 * 64, 128, scales/biases bf16, f16 or f32 (as the (s, b) pairs the backend
 * packs at upload, dg_cuda_w.sbp). */
#ifndef DG_CUDA_QMOE_CUH
#define DG_CUDA_QMOE_CUH
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define QE_WARPS 4
#define QE_THREADS (32 * QE_WARPS)
#define QE_ROWS 128                 /* weight rows per block */
#define QE_KC 128                   /* codes per pipeline stage (the backend's choice) */
#define QE_STAGES 4                 /* depth of the cp.async ring (the backend's choice) */

/* Bytes per weight row of a stage of KC codes: the codes and a padding that
 * puts the row at 16 (32 for 6 and 8 bits) modulo 128 bytes, so that the 8
 * rows a warp reads at once fall on distinct banks; rows stay 16-byte aligned
 * for cp.async. */
__host__ __device__ constexpr int qe_ws(int bits, int kc) {
  return kc * bits / 8 + ((bits >= 6 ? 32 : 16) - (kc * bits / 8) % 128 + 128) % 128;
}
/* Bytes per token row of an activation stage (64 modulo 128: conflict-free 16-byte reads). */
__host__ __device__ constexpr int qe_xs(int kc) { return kc * 2 + 64; }

struct qe_args {
  const uint32_t *q; /* [E * rows_per_expert, Kdim * BITS / 32] */
  const void *sbp;   /* (s, b) pairs [E * rows_per_expert, sbld] */
  int sb, sbld, group, pb; /* pair dtype, pairs per row, group size, bytes per pair */
  int64_t rowbytes;  /* bytes per weight row */
  const bf16 *X;     /* gate/up: xe [T, Kdim]; down: h [T * topk, Kdim] */
  const float *xs;   /* group sums of X's rows [., Kdim / group] */
  const int32_t *count, *start, *pairs;
  int topk, Kdim, N; /* N: gate/up IE (features), down H (rows) */
  bf16 *h;           /* gate/up output [T * topk, IE] */
  float *y;          /* down output [T * topk, H] */
  int stage_bytes, w_bytes, x_bytes, sb_bytes, sbr, xsr;
  int tiled;         /* q in the tile layout (qe_tile_offset) instead of MLX's row-major layout */
};

/* Byte offset of (block row r, stage s) in the tile layout of a stack:
 * each block's row slab (128 rows x Kdim codes) is contiguous, stage after
 * stage, and inside a stage the 128 rows' kc codes follow each other, so a
 * stage's copy reads one contiguous run of 128 kc BITS / 8 bytes. */
__host__ __device__ __forceinline__ int64_t qe_tile_offset(int64_t slab_index, int64_t rowbytes, int s, int kc_full,
                                                           int kc, int bits, int r) {
  return slab_index * QE_ROWS * rowbytes + (int64_t)s * QE_ROWS * (kc_full * bits / 8) + (int64_t)r * (kc * bits / 8);
}

/* This lane's 8 codes of one row's run of 32 (at p: the run's first byte
 * plus t * BITS) as the 4 bf16 pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7). */
template <int BITS> __device__ __forceinline__ void qe_codes(const unsigned char *p, uint32_t P[4]) {
  const uint32_t mag = 0x43004300u; /* bf16 128 in both halves */
  if constexpr (BITS == 4) {
    const uint32_t v = *(const uint32_t *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) P[i] = dg_bf16x2_sub128(((v >> (4 * i)) & 0x000f000fu) | mag);
  } else if constexpr (BITS == 2) {
    const uint32_t v = dg_prmt(*(const uint16_t *)p, 0u, 0x4140u); /* codes 0-3 in bits 0-7, 4-7 in 16-23 */
#pragma unroll
    for (int i = 0; i < 4; i++) P[i] = dg_bf16x2_sub128(((v >> (2 * i)) & 0x00030003u) | mag);
  } else if constexpr (BITS == 3) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t r = dg_funnel_r(w[0], w[1], (uint32_t)(a & 3) * 8); /* 24 bits */
    const uint32_t v = (r & 0xfffu) | ((r << 4) & 0x0fff0000u);
#pragma unroll
    for (int i = 0; i < 4; i++) P[i] = dg_bf16x2_sub128(((v >> (3 * i)) & 0x00070007u) | mag);
  } else if constexpr (BITS == 6) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8;
    const uint32_t lo = dg_funnel_r(w[0], w[1], sh), hi = dg_funnel_r(w[1], w[2], sh); /* 48 bits */
    const uint32_t c03 = lo & 0xffffffu, c47 = (lo >> 24) | ((hi & 0xffffu) << 8);
    const uint32_t v01 = (c03 & 0xfffu) | ((c47 & 0xfffu) << 16), v23 = (c03 >> 12) | ((c47 >> 12) << 16);
    P[0] = dg_bf16x2_sub128((v01 & 0x003f003fu) | mag);
    P[1] = dg_bf16x2_sub128(((v01 >> 6) & 0x003f003fu) | mag);
    P[2] = dg_bf16x2_sub128((v23 & 0x003f003fu) | mag);
    P[3] = dg_bf16x2_sub128(((v23 >> 6) & 0x003f003fu) | mag);
  } else { /* 8: through fp32, 2^23 + q exactly, then a bf16 pair (exact: q < 256 has 8 significant bits) */
    const uint2 v = *(const uint2 *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t sel = 0x7540u | (uint32_t)i;
      const float lo = __uint_as_float(dg_prmt(v.x, 0x4b000000u, sel)) - 8388608.0f;
      const float hi = __uint_as_float(dg_prmt(v.y, 0x4b000000u, sel)) - 8388608.0f;
      P[i] = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
    }
  }
}

__device__ __forceinline__ void qe_pair(const unsigned char *p, int sb, float *s, float *b) {
  if (sb == DG_CUDA_F32) {
    const float2 v = *(const float2 *)p;
    *s = v.x;
    *b = v.y;
  } else {
    const uint32_t v = *(const uint32_t *)p;
    if (sb == DG_CUDA_BF16) {
      *s = __uint_as_float(v << 16);
      *b = __uint_as_float(v & 0xffff0000u);
    } else {
      __half hs, hb;
      memcpy(&hs, &v, 2);
      const uint16_t hi = (uint16_t)(v >> 16);
      memcpy(&hb, &hi, 2);
      *s = __half2float(hs);
      *b = __half2float(hb);
    }
  }
}

__device__ __forceinline__ float qe_gelu(float a) { /* gelu_pytorch_tanh, as moe.cu and kernels.cu */
  const float k = 0.7978845608028654f;
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* Global weight row of block row r (< QE_ROWS), or -1 past the matrix. */
template <int GATEUP> __device__ __forceinline__ int64_t qe_row(const qe_args &a, int e, int slab, int r) {
  if (GATEUP) {
    const int n = slab * 64 + (r >> 5) * 16 + (r & 15), part = (r >> 4) & 1;
    return n < a.N ? (int64_t)e * 2 * a.N + (int64_t)part * a.N + n : -1;
  }
  const int n = slab * QE_ROWS + r;
  return n < a.N ? (int64_t)e * a.N + n : -1;
}

template <int BITS, int GATEUP, int NT, int KC = QE_KC, int STAGES = QE_STAGES>
__global__ void __launch_bounds__(QE_THREADS) qe_kernel(qe_args a) {
  constexpr int WS = qe_ws(BITS, KC), XS = qe_xs(KC), NTOK = 8 * NT;
#ifndef DG_CUDA_EMU
  extern __shared__ __align__(16) unsigned char smem[];
#else
  DG_DYN_SMEM(unsigned char, smem);
#endif
  __shared__ int64_t xrow[NTOK]; /* element offset of each pass token's X row, -1 past the expert's rows */
  __shared__ int64_t srow[NTOK]; /* its row of group sums */
  __shared__ int64_t wrow[QE_ROWS];
  const int e = blockIdx.x, slab = blockIdx.y;
  const int cnt = a.count[e];
  if (cnt == 0) return;
  const int base = a.start[e];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ng = a.Kdim / a.group, cpg = a.group / 32;
  for (int r = tid; r < QE_ROWS; r += QE_THREADS) wrow[r] = qe_row<GATEUP>(a, e, slab, r);
  bool mvalid[2];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
    mvalid[mt] = GATEUP ? slab * 64 + warp * 16 < a.N : slab * QE_ROWS + warp * 32 + mt * 16 < a.N;
  const int nst = (a.Kdim + KC - 1) / KC;
  const int64_t slab_index = (int64_t)e * gridDim.y + slab;

  for (int p0 = 0; p0 < cnt; p0 += NTOK) {
    const int mp = min(NTOK, cnt - p0), jn = (mp + 7) >> 3;
    for (int i = tid; i < NTOK; i += QE_THREADS) {
      int64_t xr = -1, sr = -1;
      if (i < mp) {
        const int64_t row = GATEUP ? a.pairs[base + p0 + i] / a.topk : base + p0 + i;
        xr = row * a.Kdim;
        sr = row * ng;
      }
      xrow[i] = xr;
      srow[i] = sr;
    }
    __syncthreads();

    /* issue the copies of stage s into its ring slot */
    auto issue = [&](int s) {
      unsigned char *st = smem + (size_t)(s % STAGES) * a.stage_bytes;
      unsigned char *Ws = st, *Xs = st + a.w_bytes, *Ss = Xs + a.x_bytes, *XSs = Ss + a.sb_bytes;
      const int k0 = s * KC, kc = min(KC, a.Kdim - k0);
      const int rb = kc * BITS / 8; /* bytes of a row in this stage */
      const int64_t wo = (int64_t)k0 * BITS / 8;
      const unsigned char *qb = (const unsigned char *)a.q;
      if (a.tiled && rb % 16 == 0) { /* one contiguous run: row r's kc codes at r * rb */
        const unsigned char *src = qb + qe_tile_offset(slab_index, a.rowbytes, s, KC, kc, BITS, 0);
        const int per = rb / 16;
        for (int i = tid; i < QE_ROWS * per; i += QE_THREADS) {
          const int r = i / per, c = i - r * per;
          if (wrow[r] >= 0) dg_cp_async16(Ws + r * WS + 16 * c, src + 16 * i, 16);
        }
      } else if (a.rowbytes % 16 == 0 && rb % 16 == 0) {
        const int per = rb / 16;
        for (int i = tid; i < QE_ROWS * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          if (wrow[r] >= 0) dg_cp_async16(Ws + r * WS + 16 * c, qb + wrow[r] * a.rowbytes + wo + 16 * c, 16);
        }
      } else if (a.rowbytes % 8 == 0 && rb % 8 == 0) {
        const int per = rb / 8;
        for (int i = tid; i < QE_ROWS * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          if (wrow[r] >= 0) dg_cp_async8(Ws + r * WS + 8 * c, qb + wrow[r] * a.rowbytes + wo + 8 * c);
        }
      } else {
        const int per = rb / 4;
        for (int i = tid; i < QE_ROWS * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          if (wrow[r] >= 0) dg_cp_async4(Ws + r * WS + 4 * c, qb + wrow[r] * a.rowbytes + wo + 4 * c);
        }
      }
      { /* activations: kc bf16 per token row, 16-byte pieces, zero past the expert's rows */
        const int per = kc / 8;
        for (int i = tid; i < NTOK * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          const int64_t xr = xrow[r];
          dg_cp_async16(Xs + r * XS + 16 * c, xr >= 0 ? (const void *)(a.X + xr + k0 + 8 * c) : (const void *)a.X,
                        xr >= 0 ? 16 : 0);
        }
      }
      { /* (scale, bias) pairs of the stage's groups */
        const int nb = kc / a.group * a.pb, piece = nb % 16 == 0 ? 16 : nb % 8 == 0 ? 8 : 4, per = nb / piece;
        const unsigned char *sbb = (const unsigned char *)a.sbp;
        for (int i = tid; i < QE_ROWS * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          if (wrow[r] < 0) continue;
          const unsigned char *src = sbb + (wrow[r] * a.sbld + k0 / a.group) * a.pb + piece * c;
          unsigned char *dst = Ss + r * a.sbr + piece * c;
          if (piece == 16) dg_cp_async16(dst, src, 16);
          else if (piece == 8) dg_cp_async8(dst, src);
          else dg_cp_async4(dst, src);
        }
      }
      { /* group sums: kc / group floats per token row */
        const int per = kc / a.group;
        for (int i = tid; i < NTOK * per; i += QE_THREADS) {
          const int r = i / per, c = i % per;
          if (srow[r] >= 0) dg_cp_async4(XSs + a.xsr * r + 4 * c, a.xs + srow[r] + k0 / a.group + c);
          else *(float *)(XSs + a.xsr * r + 4 * c) = 0.0f;
        }
      }
    };

    float acc[2][NT][4], part[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mt][j][i] = part[mt][j][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < nst) issue(s);
      dg_cp_commit();
    }
    for (int it = 0; it < nst; it++) {
      dg_cp_wait<STAGES - 2>();
      __syncthreads();
      if (it + STAGES - 1 < nst) issue(it + STAGES - 1);
      dg_cp_commit();
      const unsigned char *st = smem + (size_t)(it % STAGES) * a.stage_bytes;
      const unsigned char *Ws = st, *Xs = st + a.w_bytes, *Ss = Xs + a.x_bytes, *XSs = Ss + a.sb_bytes;
      const int k0 = it * KC, nch = min(KC, a.Kdim - k0) / 32;
      for (int c = 0; c < nch; c++) {
        uint32_t bf[NT][2][2];
#pragma unroll
        for (int j = 0; j < NT; j++) {
          if (j < jn) {
            const uint4 u = *(const uint4 *)(Xs + (8 * j + g) * XS + 64 * c + 16 * t);
            bf[j][0][0] = dg_prmt(u.x, u.z, 0x5410u); /* (x0, x4) */
            bf[j][0][1] = dg_prmt(u.x, u.z, 0x7632u); /* (x1, x5) */
            bf[j][1][0] = dg_prmt(u.y, u.w, 0x5410u); /* (x2, x6) */
            bf[j][1][1] = dg_prmt(u.y, u.w, 0x7632u); /* (x3, x7) */
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          if (!mvalid[mt]) continue;
          const unsigned char *p = Ws + (warp * 32 + mt * 16 + g) * WS + c * 4 * BITS + t * BITS;
          uint32_t pg[4], p8[4];
          qe_codes<BITS>(p, pg);
          qe_codes<BITS>(p + 8 * WS, p8);
          const uint32_t a0[4] = {pg[0], p8[0], pg[1], p8[1]}, a1[4] = {pg[2], p8[2], pg[3], p8[3]};
#pragma unroll
          for (int j = 0; j < NT; j++) {
            if (j < jn) {
              dg_mma_bf16(part[mt][j], a0, bf[j][0]);
              dg_mma_bf16(part[mt][j], a1, bf[j][1]);
            }
          }
        }
        if ((k0 / 32 + c + 1) % cpg == 0) { /* a group is complete: acc += s P + b S */
          const int lg = c / cpg;
#pragma unroll
          for (int mt = 0; mt < 2; mt++) {
            if (!mvalid[mt]) continue;
            float s0, b0, s8, b8;
            const int r = warp * 32 + mt * 16 + g;
            qe_pair(Ss + r * a.sbr + lg * a.pb, a.sb, &s0, &b0);
            qe_pair(Ss + (r + 8) * a.sbr + lg * a.pb, a.sb, &s8, &b8);
#pragma unroll
            for (int j = 0; j < NT; j++) {
              if (j < jn) {
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
        }
      }
    }
    __syncthreads(); /* every warp is done with the ring before the next pass refills it */

    /* epilogue: lane holds rows g, g+8 of its m-tiles x tokens 2t, 2t+1 of each n8 tile */
#pragma unroll
    for (int j = 0; j < NT; j++) {
      if (j >= jn) continue;
#pragma unroll
      for (int qq = 0; qq < 2; qq++) {
        const int tk = 8 * j + 2 * t + qq;
        if (tk >= mp) continue;
        const size_t row = (size_t)(base + p0 + tk);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
          if (GATEUP) {
            if (!mvalid[0]) continue;
            const int n = slab * 64 + warp * 16 + g + 8 * hf;
            const float gt = acc[0][j][2 * hf + qq], up = acc[1][j][2 * hf + qq];
            a.h[row * a.N + n] = __float2bfloat16_rn(qe_gelu(gt) * up);
          } else {
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
              if (!mvalid[mt]) continue;
              const int n = slab * QE_ROWS + warp * 32 + mt * 16 + g + 8 * hf;
              a.y[row * a.N + n] = acc[mt][j][2 * hf + qq];
            }
          }
        }
      }
    }
  }
}

/* The stage layout of a launch (qe_args' byte counts) for KC codes per stage and 8 nt tokens. */
static inline void qe_layout(qe_args &a, int bits, int nt, int kc) {
  a.pb = a.sb == DG_CUDA_F32 ? 8 : 4;
  a.sbr = kc / a.group * a.pb;
  if (a.sbr % 16) a.sbr += 16 - a.sbr % 16;
  a.xsr = 4 * (kc / 32);
  if (a.xsr % 16) a.xsr += 16 - a.xsr % 16;
  a.w_bytes = QE_ROWS * qe_ws(bits, kc);
  a.x_bytes = 8 * nt * qe_xs(kc);
  a.sb_bytes = QE_ROWS * a.sbr;
  a.stage_bytes = a.w_bytes + a.x_bytes + a.sb_bytes + 8 * nt * a.xsr;
  a.rowbytes = (int64_t)a.Kdim * bits / 8;
}

template <int BITS, int GATEUP, int NT, int KC = QE_KC, int STAGES = QE_STAGES>
static cudaError_t qe_launch_nt(cudaStream_t s, dim3 grid, qe_args a) {
  qe_layout(a, BITS, NT, KC);
  void (*kern)(qe_args) = qe_kernel<BITS, GATEUP, NT, KC, STAGES>;
  const size_t smem = (size_t)STAGES * a.stage_bytes;
#ifndef DG_CUDA_EMU
  static size_t set = 0; /* one attribute call per instantiation and size */
  if (smem > set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = smem;
  }
#endif
  DG_LAUNCH(kern, grid, QE_THREADS, smem, s)(a);
  return cudaGetLastError();
}

template <int BITS, int GATEUP> cudaError_t qe_launch_bits(cudaStream_t s, dim3 grid, int nt, const qe_args &a) {
  switch (nt) {
  case 1: return qe_launch_nt<BITS, GATEUP, 1>(s, grid, a);
  case 2: return qe_launch_nt<BITS, GATEUP, 2>(s, grid, a);
  case 4: return qe_launch_nt<BITS, GATEUP, 4>(s, grid, a);
  default: return qe_launch_nt<BITS, GATEUP, 8>(s, grid, a);
  }
}

/* The launchers of one width (qmoe_b<BITS>.cu instantiates them). */
#define DG_QE_INSTANTIATE(BITS)                                                                         \
  template cudaError_t qe_launch_bits<BITS, 0>(cudaStream_t, dim3, int, const qe_args &);             \
  template cudaError_t qe_launch_bits<BITS, 1>(cudaStream_t, dim3, int, const qe_args &);
#endif
