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
  const cudaError_t e = k_group_sums(s, xe, T, H, W->group, b->xs);
  if (e != cudaSuccess) return e;
  return qe_launch<1>(s, dim3(E, (IE + 16 * QE_WARPS - 1) / (16 * QE_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
}

cudaError_t k_qe_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K,
                      int nt) {
  qe_args a;
  qe_common(&a, W, b, K);
  a.X = b->h;
  a.Kdim = IE;
  a.N = H;
  a.y = b->y;
  const cudaError_t e = k_group_sums(s, b->h, T * K, IE, W->group, b->xs);
  if (e != cudaSuccess) return e;
  return qe_launch<0>(s, dim3(E, (H + 32 * QE_WARPS - 1) / (32 * QE_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
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

size_t qe_tile_bytes(const qe_tiling &t, size_t *pair_bytes) {
  const size_t rows = (size_t)(t.E * qe_slabs(t) * 32 * t.warps);
  if (pair_bytes) *pair_bytes = rows * (size_t)(t.K / t.group) * (size_t)t.pb;
  return rows * (size_t)(t.K * t.bits / 8);
}

void qe_tile_pack(const qe_tiling &t, const uint8_t *codes, const void *scales, const void *biases, uint8_t *tq,
                  uint8_t *tp) {
  size_t pbytes;
  const size_t qbytes = qe_tile_bytes(t, &pbytes);
  memset(tq, 0, qbytes);
  memset(tp, 0, pbytes);
  const int64_t slabs = qe_slabs(t), rowbytes = t.K * t.bits / 8, ng = t.K / t.group, ss = t.pb / 2;
  const int nst = (int)((t.K + t.kc - 1) / t.kc);
  for (int64_t e = 0; e < t.E; e++)
    for (int64_t sl = 0; sl < slabs; sl++)
      for (int r = 0; r < 32 * t.warps; r++) {
        const int64_t gr = qe_tile_row(t, e, sl, r), si = e * slabs + sl;
        if (gr < 0) continue;
        for (int s = 0; s < nst; s++) {
          const int64_t k0 = (int64_t)s * t.kc, kc = t.K - k0 < t.kc ? t.K - k0 : t.kc;
          memcpy(tq + qe_tile_code_off(t, si, s, r), codes + gr * rowbytes + k0 * t.bits / 8, (size_t)(kc * t.bits / 8));
          uint8_t *d = tp + qe_tile_pair_off(t, si, s, r);
          for (int64_t j = 0; j < kc / t.group; j++) {
            const size_t src = (size_t)(gr * ng + k0 / t.group + j) * (size_t)ss;
            memcpy(d + j * t.pb, (const uint8_t *)scales + src, (size_t)ss);
            memcpy(d + j * t.pb + ss, (const uint8_t *)biases + src, (size_t)ss);
          }
        }
      }
}
