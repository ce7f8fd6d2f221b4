/* quant.cu: matrix products over MLX affine-quantized weights on the GPU,
 * dequantized inside the kernels (the weights stay packed in device memory).
 *
 *   k_qmatmul           y = x W^T for every quantized linear layer and the
 *                       LM head over a quantized tied embedding
 *   k_qexperts_gate_up  the first gathered MoE products (spec 4.6 step 4) over
 *   k_qexperts_down     the expert work list of moe.cu; the backend now runs
 *                       the tensor-core kernels of qmoe.cu, and these stay as
 *                       version 1 of the kernel lab (dev/cuda/moe_quant.cu),
 *                       over stacks in the MLX layout (s and b set)
 *   k_qsoft             soft = alpha P E, the exact self-conditioning soft
 *                       embedding (spec 5) through a quantized E
 *   k_qembed            embedding rows of a quantized E
 *
 * Format (src/io/quant.h; ml-explore/mlx mlx/backend/cpu/quantized.cpp:
 * get_pack_factor, get_bytes_per_pack, extract_bits; mlx/backend/metal/
 * kernels/quantized.h: affine_dequantize): code k of a row occupies bits
 * [k*bits, (k+1)*bits) of the row's little-endian bit stream, which is bit
 * k*bits % 32 of uint32 word k*bits / 32 of the row (words are little-endian
 * on the GPU as in the file). For 2, 4 and 8 bits no code crosses a word; 3-
 * and 6-bit codes straddle words (MLX's 3-byte packs). 32 consecutive codes
 * take exactly `bits` words, so a run of 32 codes starting at a multiple of
 * 32 is self-contained; every group (32, 64, 128) is a whole number of such
 * runs, and every run lies inside one group (one scale, one bias).
 *
 * Dequantization is w = (float)q * s + b in fp32 with the stored s, b (bf16,
 * f16 or f32) widened, a product then a sum, both rounded (__fmul_rn,
 * __fadd_rn: the compiler may not fuse them), so every weight equals the
 * CPU's dg_quant_dequant_row bit for bit. Products accumulate in fp32 (fmaf).
 * The activations arrive as bf16 (the buffers the bf16 path feeds cuBLAS
 * with; tests/test_cuda.c derives the tolerance for that rounding).
 *
 * One tile kernel serves all four products: a block of 128 threads computes
 * 32 activation rows x 64 weight rows (gate/up: 32 gate + the 32 matching up
 * rows), stepping the reduction by 64: each thread unpacks one run of 32
 * codes (4- and 8-bit runs are 1 or 2 aligned 16-byte loads, 2- and 6-bit
 * 8-byte loads, 3-bit three 4-byte loads) into an fp32 shared tile, then a
 * 4 x 4 register tile of fp32 FMAs. CUDA cores, no tensor cores: a bf16 MMA
 * would round the dequantized weights. Untuned: no double buffering, and the
 * weights are re-read for every 32 activation rows. */
#include <string.h>

#include "cuda/common.cuh"

#define QBT 32 /* activation rows per tile (= DG_MOE_TM) */
#define QBN 64 /* weight rows per tile */
#define QKC 64 /* reduction step: two runs of 32 codes per weight row */
#define QNT 128

enum { QM_DENSE = 0, QM_GATEUP = 1, QM_DOWN = 2, QM_SOFT = 3 };

static_assert(QBT == DG_MOE_TM, "the quantized expert tiles are the work list's tiles");

/* Arguments of the tile kernel (by value). */
struct qtile_args {
  const bf16 *A; /* DENSE: x [T, lda]; SOFT: P [T, lda = V]; GATEUP: xe [T, H]; DOWN: h [T*K, IE] */
  int lda, T;
  dg_cuda_w W;
  int64_t row0;  /* DENSE: first weight row */
  int N;         /* DENSE: output columns; SOFT: H */
  float *y;      /* DENSE, SOFT: [T, ldy]; DOWN: [T*K, H] grouped rows */
  int ldy;
  float alpha;   /* SOFT: scale of the sum */
  const int32_t *tiles, *n_tiles, *count, *start, *pairs; /* GATEUP, DOWN: the work list (moe.cu) */
  int K, IE, H;
  bf16 *h;       /* GATEUP: [T*K, IE] grouped rows */
};

__device__ __forceinline__ float ld_sb(const void *p, int sb, int64_t i) {
  if (sb == DG_CUDA_BF16) return __bfloat162float(((const bf16 *)p)[i]);
  if (sb == DG_CUDA_F16) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

/* The `BITS` words of one run of 32 codes; vector loads where the run's
 * alignment allows (a row is cols*BITS/32 words with cols a multiple of 32,
 * so runs of 8- and 4-bit codes start on 16 bytes, 6- and 2-bit on 8). */
template <int BITS> __device__ __forceinline__ void load_run(const uint32_t *p, uint32_t *w) {
  if constexpr (BITS % 4 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 4; i++) {
      DG_ASSERT_ALIGNED(p + 4 * i, 16);
      const uint4 v = *(const uint4 *)(p + 4 * i);
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else if constexpr (BITS % 2 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 2; i++) {
      DG_ASSERT_ALIGNED(p + 2 * i, 8);
      const uint2 v = *(const uint2 *)(p + 2 * i);
      w[2 * i] = v.x; w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < BITS; i++) w[i] = p[i];
  }
}

/* Dequantize the run of 32 codes of weight row `row` starting at column k (a
 * multiple of 32) into dst[j * stride], j < 32. */
template <int BITS>
__device__ __forceinline__ void unpack_run(const dg_cuda_w &W, int64_t row, int64_t k, float *dst, int stride) {
  uint32_t w[BITS];
  load_run<BITS>(W.q + row * (W.cols / 32 * BITS) + k / 32 * BITS, w);
  const int64_t gi = row * (W.cols / W.group) + k / W.group;
  const float s = ld_sb(W.s, W.sb, gi), b = ld_sb(W.b, W.sb, gi);
#pragma unroll
  for (int j = 0; j < 32; j++) {
    const int bit = j * BITS, wi = bit >> 5, sh = bit & 31;
    uint32_t v = w[wi] >> sh;
    if (sh + BITS > 32) v |= (wi + 1 < BITS ? w[wi + 1] : 0u) << (32 - sh); /* a 3- or 6-bit code straddling words */
    v &= (1u << BITS) - 1u;
    dst[j * stride] = __fadd_rn(__fmul_rn((float)v, s), b);
  }
}

__device__ __forceinline__ float gelu_tanh_q(float a) { /* as kernels.cu and moe.cu */
  const float k = 0.7978845608028654f;
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* The tile kernel. Thread (tt = tid / 16, tr = tid % 16) owns activation rows
 * tt + 8j and weight rows tr + 16i (i, j < 4) of the tile. Reduction
 * dimension: DENSE W.cols, GATEUP H, DOWN IE, SOFT V = W.rows (there the
 * tile's "weight rows" are the columns h of E and the unpacked runs are
 * written transposed). */
template <int BITS, int MODE> __global__ void __launch_bounds__(QNT) qtile_kernel(qtile_args a) {
  DG_PDL_ENTRY();
  __shared__ float Xs[QBT][QKC + 1];
  __shared__ float Ws[QBN][QKC + 1];
  __shared__ const bf16 *arow[QBT];
  __shared__ int64_t wrow[QBN];
  int e = 0, r0 = 0, cnt = 0, base = 0, n0, t0 = 0, Kdim;
  if (MODE == QM_GATEUP || MODE == QM_DOWN) {
    const int tile = blockIdx.x;
    if (tile >= *a.n_tiles) return; /* the whole block: surplus tile of the worst-case grid */
    e = a.tiles[2 * tile];
    r0 = a.tiles[2 * tile + 1];
    cnt = a.count[e];
    base = a.start[e];
    n0 = blockIdx.y * (MODE == QM_GATEUP ? QBN / 2 : QBN);
    Kdim = MODE == QM_GATEUP ? a.H : a.IE;
  } else {
    n0 = blockIdx.x * QBN;
    t0 = blockIdx.y * QBT;
    Kdim = (int)(MODE == QM_SOFT ? a.W.rows : a.W.cols);
  }
  for (int r = threadIdx.x; r < QBT; r += blockDim.x) {
    const bf16 *p = NULL;
    if (MODE == QM_GATEUP) {
      if (r0 + r < cnt) p = a.A + (size_t)(a.pairs[base + r0 + r] / a.K) * a.lda;
    } else if (MODE == QM_DOWN) {
      if (r0 + r < cnt) p = a.A + (size_t)(base + r0 + r) * a.lda;
    } else if (t0 + r < a.T) {
      p = a.A + (size_t)(t0 + r) * a.lda;
    }
    arow[r] = p;
  }
  for (int c = threadIdx.x; c < QBN; c += blockDim.x) {
    int64_t wr = -1;
    if (MODE == QM_GATEUP) { /* c < 32: gate row n0 + c; c >= 32: up row n0 + c - 32 */
      const int n = n0 + (c & 31);
      if (n < a.IE) wr = (int64_t)e * 2 * a.IE + (c < 32 ? 0 : a.IE) + n;
    } else if (MODE == QM_DOWN) {
      if (n0 + c < a.H) wr = (int64_t)e * a.H + n0 + c;
    } else if (MODE == QM_DENSE) {
      if (n0 + c < a.N) wr = a.row0 + n0 + c;
    } else { /* SOFT: column h = n0 + c of E */
      if (n0 + c < a.N) wr = n0 + c;
    }
    wrow[c] = wr;
  }
  __syncthreads();
  const int tr = threadIdx.x & 15, tt = threadIdx.x >> 4;
  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
  for (int k0 = 0; k0 < Kdim; k0 += QKC) {
    for (int i = threadIdx.x; i < QBT * QKC; i += blockDim.x) {
      const int r = i / QKC, kk = i % QKC;
      Xs[r][kk] = arow[r] && k0 + kk < Kdim ? __bfloat162float(arow[r][k0 + kk]) : 0.0f;
    }
    { /* one run of 32 codes per thread */
      const int c = threadIdx.x >> 1, sub = threadIdx.x & 1;
      if (MODE != QM_SOFT) {
        const int64_t k = k0 + 32 * sub;
        if (wrow[c] >= 0 && k < Kdim) {
          unpack_run<BITS>(a.W, wrow[c], k, &Ws[c][32 * sub], 1);
        } else {
          for (int j = 0; j < 32; j++) Ws[c][32 * sub + j] = 0.0f;
        }
      } else { /* row v = k0 + c of E, columns n0 + 32 sub .. + 31, stored as Ws[column][v - k0] */
        const int64_t v = k0 + c;
        if (v < Kdim && wrow[32 * sub] >= 0) {
          unpack_run<BITS>(a.W, v, wrow[32 * sub], &Ws[32 * sub][c], QKC + 1);
        } else {
          for (int j = 0; j < 32; j++) Ws[32 * sub + j][c] = 0.0f;
        }
      }
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < QKC; kk++) {
      float xa[4], wb[4];
#pragma unroll
      for (int j = 0; j < 4; j++) xa[j] = Xs[tt + 8 * j][kk];
#pragma unroll
      for (int i = 0; i < 4; i++) wb[i] = Ws[tr + 16 * i][kk];
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = fmaf(xa[j], wb[i], acc[j][i]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int r = tt + 8 * j;
    if (MODE == QM_GATEUP || MODE == QM_DOWN) {
      if (r0 + r >= cnt) continue;
      const size_t row = (size_t)(base + r0 + r);
      if (MODE == QM_GATEUP) {
        for (int i = 0; i < 2; i++) {
          const int n = n0 + tr + 16 * i;
          if (n < a.IE) a.h[row * a.IE + n] = __float2bfloat16_rn(gelu_tanh_q(acc[j][i]) * acc[j][i + 2]);
        }
      } else {
        for (int i = 0; i < 4; i++) {
          const int n = n0 + tr + 16 * i;
          if (n < a.H) a.y[row * a.H + n] = acc[j][i];
        }
      }
    } else {
      if (t0 + r >= a.T) continue;
      for (int i = 0; i < 4; i++) {
        const int n = n0 + tr + 16 * i;
        if (n < a.N) a.y[(size_t)(t0 + r) * a.ldy + n] = MODE == QM_SOFT ? a.alpha * acc[j][i] : acc[j][i];
      }
    }
  }
}

template <int BITS, int MODE> static cudaError_t launch_bits(cudaStream_t s, dim3 grid, const qtile_args &a) {
  void (*kern)(qtile_args) = qtile_kernel<BITS, MODE>; /* a name without a comma for the launch macro */
  DG_LAUNCH(kern, grid, QNT, 0, s)(a);
  return cudaGetLastError();
}

template <int MODE> static cudaError_t launch_q(cudaStream_t s, dim3 grid, const qtile_args &a) {
  switch (a.W.bits) {
  case 2: return launch_bits<2, MODE>(s, grid, a);
  case 3: return launch_bits<3, MODE>(s, grid, a);
  case 4: return launch_bits<4, MODE>(s, grid, a);
  case 6: return launch_bits<6, MODE>(s, grid, a);
  case 8: return launch_bits<8, MODE>(s, grid, a);
  default: return cudaErrorInvalidValue; /* dg_cuda_model_new validates bits */
  }
}

cudaError_t k_qmatmul(cudaStream_t s, const bf16 *x, int ldx, int T, const dg_cuda_w *W, int64_t row0, int N, float *y,
                      int ldy) {
  if (T <= 0 || N <= 0) return cudaSuccess;
  qtile_args a;
  memset(&a, 0, sizeof a);
  a.A = x; a.lda = ldx; a.T = T; a.W = *W; a.row0 = row0; a.N = N; a.y = y; a.ldy = ldy;
  return launch_q<QM_DENSE>(s, dim3((N + QBN - 1) / QBN, (T + QBT - 1) / QBT), a);
}

cudaError_t k_qsoft(cudaStream_t s, const bf16 *P, int C, const dg_cuda_w *E, float alpha, float *soft) {
  qtile_args a;
  memset(&a, 0, sizeof a);
  a.A = P; a.lda = (int)E->rows; a.T = C; a.W = *E; a.N = (int)E->cols; a.y = soft; a.ldy = (int)E->cols;
  a.alpha = alpha;
  return launch_q<QM_SOFT>(s, dim3((a.N + QBN - 1) / QBN, (C + QBT - 1) / QBT), a);
}

cudaError_t k_qexperts_gate_up(cudaStream_t s, const dg_cuda_w *W, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H,
                               int IE, int E, int K) {
  qtile_args a;
  memset(&a, 0, sizeof a);
  a.A = xe; a.lda = H; a.W = *W; a.tiles = b->tiles; a.n_tiles = b->n_tiles; a.count = b->count; a.start = b->start;
  a.pairs = b->pairs; a.K = K; a.IE = IE; a.H = H; a.h = b->h;
  const int max_tiles = (T * K + QBT - 1) / QBT + E; /* as dg_cuda_experts */
  return launch_q<QM_GATEUP>(s, dim3(max_tiles, (IE + QBN / 2 - 1) / (QBN / 2)), a);
}

cudaError_t k_qexperts_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K) {
  qtile_args a;
  memset(&a, 0, sizeof a);
  a.A = b->h; a.lda = IE; a.W = *W; a.tiles = b->tiles; a.n_tiles = b->n_tiles; a.count = b->count; a.start = b->start;
  a.pairs = b->pairs; a.K = K; a.IE = IE; a.H = H; a.y = b->y;
  const int max_tiles = (T * K + QBT - 1) / QBT + E;
  return launch_q<QM_DOWN>(s, dim3(max_tiles, (H + QBN - 1) / QBN), a);
}

/* One block per token: x[t, j] = dequant(E[ids[t], j]) * scale, codes read
 * one at a time by the bit-stream rule (any width). */
__global__ void qembed_kernel(float *x, dg_cuda_w E, const int32_t *ids, float scale) {
  DG_PDL_ENTRY();
  const int t = blockIdx.x;
  const int64_t r = ids[t], H = E.cols, ng = H / E.group;
  const uint32_t *row = E.q + r * (H / 32 * E.bits);
  const uint32_t mask = (1u << E.bits) - 1u;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    const int64_t bit = j * E.bits, wi = bit >> 5;
    const int sh = (int)(bit & 31);
    uint32_t v = row[wi] >> sh;
    if (sh + E.bits > 32) v |= row[wi + 1] << (32 - sh);
    v &= mask;
    const float s = ld_sb(E.s, E.sb, r * ng + j / E.group), b = ld_sb(E.b, E.sb, r * ng + j / E.group);
    x[(size_t)t * H + j] = __fmul_rn(__fadd_rn(__fmul_rn((float)v, s), b), scale);
  }
}

cudaError_t k_qembed(cudaStream_t s, float *x, const dg_cuda_w *E, const int32_t *ids, int T, float scale) {
  DG_LAUNCH(qembed_kernel, T, 256, 0, s)(x, *E, ids, scale);
  return cudaGetLastError();
}
