/* qmoe.cu: the gathered MoE products over MLX affine-quantized expert stacks
 * on tensor cores (spec 4.6 step 4): host launchers and the group sums. The
 * kernel, its math and layout: qmoe.cuh; its instantiations: qmoe_b*.cu. */
#include "cuda/qmoe.cuh"

extern template cudaError_t qe_launch_bits<2, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<2, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<3, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<3, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<4, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<4, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<6, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<6, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<8, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qe_launch_bits<8, 1>(cudaStream_t, dim3, int, const qe_args &);

/* Tokens per pass: 8 NT covers the expected rows per expert (T top_k / E)
 * with room for the spread of random routing; more rows take extra passes. */
static int qe_nt(int T, int K, int E) {
  const double m = (double)T * K / E;
  if (m <= 6) return 1;
  if (m <= 12) return 2;
  if (m <= 24) return 4;
  return 8;
}

template <int GATEUP> static cudaError_t qe_launch(cudaStream_t s, dim3 grid, int nt, qe_args &a, int bits) {
  switch (bits) {
  case 2: return qe_launch_bits<2, GATEUP>(s, grid, nt, a);
  case 3: return qe_launch_bits<3, GATEUP>(s, grid, nt, a);
  case 4: return qe_launch_bits<4, GATEUP>(s, grid, nt, a);
  case 6: return qe_launch_bits<6, GATEUP>(s, grid, nt, a);
  case 8: return qe_launch_bits<8, GATEUP>(s, grid, nt, a);
  default: return cudaErrorInvalidValue;
  }
}

static void qe_common(qe_args *a, const dg_cuda_w *W, dg_cuda_moe_buf *b, int K) {
  memset(a, 0, sizeof *a);
  a->q = W->q;
  a->sbp = W->sbp;
  a->sb = W->sb;
  a->sbld = W->sbld;
  a->group = W->group;
  a->xs = b->xs;
  a->count = b->count;
  a->start = b->start;
  a->pairs = b->pairs;
  a->topk = K;
}

cudaError_t k_qe_gate_up(cudaStream_t s, const dg_cuda_w *W, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H, int IE,
                         int E, int K, int nt) {
  qe_args a;
  qe_common(&a, W, b, K);
  a.X = xe;
  a.Kdim = H;
  a.N = IE;
  a.h = b->h;
  return qe_launch<1>(s, dim3(E, (IE + 63) / 64), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
}

cudaError_t k_qe_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K,
                      int nt) {
  qe_args a;
  qe_common(&a, W, b, K);
  a.X = b->h;
  a.Kdim = IE;
  a.N = H;
  a.y = b->y;
  return qe_launch<0>(s, dim3(E, (H + QE_ROWS - 1) / QE_ROWS), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
}

/* One block per row, a thread per group: sums in fp32, in column order. */
__global__ void group_sums_kernel(const bf16 *x, int cols, int G, float *out) {
  const int r = blockIdx.x, ng = cols / G;
  const bf16 *p = x + (size_t)r * cols;
  for (int j = threadIdx.x; j < ng; j += blockDim.x) {
    float s = 0.0f;
    for (int k = 0; k < G; k++) s += __bfloat162float(p[j * G + k]);
    out[(size_t)r * ng + j] = s;
  }
}

cudaError_t k_group_sums(cudaStream_t s, const bf16 *x, int rows, int cols, int G, float *out) {
  if (rows <= 0) return cudaSuccess;
  DG_LAUNCH(group_sums_kernel, rows, 64, 0, s)(x, cols, G, out);
  return cudaGetLastError();
}
