/* qmoe.cu: the gathered MoE products over MLX affine-quantized expert stacks
 * on tensor cores (spec 4.6 step 4): host launchers and the group sums. The
 * kernel, its math and layout: qmoe.cuh; its instantiations: qmoe_b*.cu. */
#include "backend/switches.h"
#include "cuda/qmoe_fg.cuh"

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
extern template cudaError_t qr_launch_bits<2, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<2, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<2, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<3, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<3, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<3, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<4, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<4, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<4, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<6, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<6, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<6, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<8, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<8, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<8, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<16, 0>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<16, 1>(cudaStream_t, dim3, int, const qe_args &);
extern template cudaError_t qr_launch_bits<16, QR_GATEUP_HP>(cudaStream_t, dim3, int, const qe_args &);

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
static int qr_dq_override = -1;
void qr_dq_set(int n) { qr_dq_override = n; }
int qr_dq_from(void) {
  if (qr_dq_override >= 0) return qr_dq_override;
  static int v = -1; /* read once (a data race on first use writes the same value) */
  if (v < 0) v = (int)dg_sw_get(DG_SW_QR_DQ); /* 4..8, 0 when unset (backend/switches.c) */
  return v;
}

static int qr_form_override = -1;
void qr_launch_form_set(int f) { qr_form_override = f; }
int qr_launch_form(void) {
  if (qr_form_override >= 0) return qr_form_override;
  static int v = -1; /* read once (a data race on first use writes the same value) */
  if (v < 0) v = (int)dg_sw_get(DG_SW_QR_LAUNCH); /* QR_FORM_*, QR_FORM_LEAN when unset (backend/switches.c) */
  return v;
}

static qr_launcher qr_test_launcher = NULL;
void qr_launcher_set(qr_launcher f) { qr_test_launcher = f; }

template <int GATEUP> static cudaError_t qr_launch(cudaStream_t s, dim3 grid, int nt, qe_args &a, int bits) {
  if (GATEUP != QR_GATEUP_HP && qr_test_launcher) return qr_test_launcher(s, grid, nt, a, bits, GATEUP);
  switch (bits) {
  case 2: return qr_launch_bits<2, GATEUP>(s, grid, nt, a);
  case 3: return qr_launch_bits<3, GATEUP>(s, grid, nt, a);
  case 4: return qr_launch_bits<4, GATEUP>(s, grid, nt, a);
  case 6: return qr_launch_bits<6, GATEUP>(s, grid, nt, a);
  case 8: return qr_launch_bits<8, GATEUP>(s, grid, nt, a);
  case 16: return qr_launch_bits<16, GATEUP>(s, grid, nt, a);
  default: return cudaErrorInvalidValue;
  }
}

/* DGEMMA_DN_FUSE=1: the down product's input copy made by the gate/up kernel (k_qe_dn_fuse_group); read once, or
 * set by qr_dn_fuse_set (the tests). */
static int dn_fuse_override = -1;
void qr_dn_fuse_set(int on) { dn_fuse_override = on; }
static int dn_fuse_on(void) {
  if (dn_fuse_override >= 0) return dn_fuse_override;
  static int v = -1; /* read once (a data race on first use writes the same value) */
  if (v < 0) v = dg_sw_get(DG_SW_DN_FUSE) == 1;
  return v;
}

/* DGEMMA_EXPERTS_FG=1: gate/up and down in one launch (k_qe_experts_fg); read once, or set by qr_experts_fg_set. */
static int experts_fg_override = -1;
void qr_experts_fg_set(int on) { experts_fg_override = on; }
static int experts_fg_on(void) {
  if (experts_fg_override >= 0) return experts_fg_override;
  static int v = -1; /* read once (a data race on first use writes the same value) */
  if (v < 0) v = dg_sw_get(DG_SW_EXPERTS_FG) == 1;
  return v;
}

/* k_qe_dn_fuse_group's conditions on the stacks, whatever the switch */
static int dn_fuse_group_of(const dg_cuda_w *gu, const dg_cuda_w *dn, int IE, const dg_cuda_moe_buf *b) {
  constexpr int FEAT = 16 * QR_WARPS; /* the gate/up block's features */
  static_assert(FEAT % 64 == 0, "groups of 32 and 64 are whole in a gate/up block's features");
  const int G = dn->bits ? dn->group : QR_BF16_GROUP, Ggu = gu->bits ? gu->group : QR_BF16_GROUP;
  if (!b->hs || gu->lay != DG_CUDA_LAY_LANES || dn->lay != DG_CUDA_LAY_LANES) return 0;
  if (gu->wl) return 0; /* DGEMMA_WL=1: wl_kernel stores h plainly */
  if (IE <= 0 || IE % FEAT) return 0; /* every slab of features full */
  /* G 32 or 64: whole groups in a block's features, and b->hs holds IE / 32 sums per row; G 128 spans two blocks */
  if (G != 32 && G != 64) return 0;
  /* the QR_GATEUP_HP kernels exist for the gate/up group of the down stack (one group for both stacks: what
   * `dgemma quantize` and MLX write) and the exact fold: no DQ body (qr_launch_bits) */
  if (Ggu != G || qr_dq_from() > 0) return 0;
  return G;
}

int k_qe_dn_fuse_group(const dg_cuda_w *gu, const dg_cuda_w *dn, int IE, const dg_cuda_moe_buf *b) {
  return dn_fuse_on() ? dn_fuse_group_of(gu, dn, IE, b) : 0;
}

/* The launchers' bit width of a stack: bf16 stacks (bits 0) in lane records run qr_kernel's BITS 16. */
static int qr_bits(const dg_cuda_w *W) { return W->bits ? W->bits : 16; }

static void qe_common(qe_args *a, const dg_cuda_w *W, dg_cuda_moe_buf *b, int K) {
  memset(a, 0, sizeof *a);
  a->q = W->q;
  a->sbp = W->sbp;
  a->sb = W->sb;
  a->group = W->bits ? W->group : QR_BF16_GROUP;
  a->xs = b->xs;
  a->count = b->count;
  a->start = b->start;
  a->pairs = b->pairs;
  a->order = b->order;
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
  if (W->lay == DG_CUDA_LAY_LANES) {
    a.X = b->xp;
    const int ready = b->gu_ready == xe && b->gu_group == a.group; /* made by route_gr_kernel (moe.cu) */
    b->gu_ready = NULL;
    if (!ready) {
      const cudaError_t e = k_group_sums_perm(s, xe, T, H, a.group, b->xs, b->xp);
      if (e != cudaSuccess) return e;
    }
    const int grid_y = (IE + 16 * QR_WARPS - 1) / (16 * QR_WARPS), ntr = nt > 0 ? nt : qe_nt(T, K, E);
    if (b->hp_group > 0) { /* the down product's input copy and sums in the epilogue (k_qe_dn_fuse_group) */
      a.hg = b->hp_group;
      a.hs = b->hs;
      return qr_launch<QR_GATEUP_HP>(s, dim3(E, grid_y), ntr, a, qr_bits(W));
    }
    if (W->wl && b->wl_count) { /* DGEMMA_WL=1 (qmoe_wl.cu): the experts of >= WL_MIN_ROWS rows to wl_kernel */
      cudaError_t e = k_wl_split(s, b->count, b->wl_count, E);
      qe_args lo = a, hi = a;
      lo.count = b->wl_count;
      hi.count = b->wl_count + E;
      if (e == cudaSuccess) e = qr_launch<1>(s, dim3(E, grid_y), ntr, lo, qr_bits(W));
      return e != cudaSuccess ? e : k_wl_gate_up(s, W, hi, E);
    }
    return qr_launch<1>(s, dim3(E, grid_y), ntr, a, qr_bits(W));
  }
  b->hp_group = 0; /* qe_kernel stores h plainly */
  const cudaError_t e = k_group_sums(s, xe, T, H, W->group, b->xs);
  if (e != cudaSuccess) return e;
  return qe_launch<1>(s, dim3(E, (IE + 16 * QE_WARPS - 1) / (16 * QE_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
}

int k_qe_gate_up_group(const dg_cuda_w *W) {
  return W->lay == DG_CUDA_LAY_LANES ? (W->bits ? W->group : QR_BF16_GROUP) : 0;
}

cudaError_t k_qe_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K,
                      int nt) {
  qe_args a;
  qe_common(&a, W, b, K);
  a.X = b->h;
  a.Kdim = IE;
  a.N = H;
  a.y = b->y;
  const int made = b->hp_group > 0 && b->hp_group == a.group; /* by the gate/up kernel (k_qe_dn_fuse_group) */
  b->hp_group = 0;
  if (made && W->lay != DG_CUDA_LAY_LANES) return cudaErrorInvalidValue; /* h is in qr_kernel's order */
  if (made) {
    a.X = b->h;
    a.xs = b->hs;
    return qr_launch<0>(s, dim3(E, (H + 32 * QR_WARPS - 1) / (32 * QR_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, qr_bits(W));
  }
  if (W->lay == DG_CUDA_LAY_LANES) {
    a.X = b->xp;
    const cudaError_t e = k_group_sums_perm(s, b->h, T * K, IE, a.group, b->xs, b->xp);
    if (e != cudaSuccess) return e;
    return qr_launch<0>(s, dim3(E, (H + 32 * QR_WARPS - 1) / (32 * QR_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, qr_bits(W));
  }
  const cudaError_t e = k_group_sums(s, b->h, T * K, IE, W->group, b->xs);
  if (e != cudaSuccess) return e;
  return qe_launch<0>(s, dim3(E, (H + 32 * QE_WARPS - 1) / (32 * QE_WARPS)), nt > 0 ? nt : qe_nt(T, K, E), a, W->bits);
}

long qr_fg_launches = 0;
cudaError_t k_qe_experts_fg(cudaStream_t s, const dg_cuda_w *gu, const dg_cuda_w *dn, const bf16 *xe,
                            dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K, int nt, int *ran) {
  *ran = 0;
  int32_t *ctr = dg_moe_fg(b);
  if (!experts_fg_on() || !ctr || qr_test_launcher || E <= 0) return cudaSuccess;
  if (gu->bits != 4 || dn->bits != 4 || dn_fuse_group_of(gu, dn, IE, b) != 64) return cudaSuccess;
  const int ntr = nt > 0 ? nt : qe_nt(T, K, E);
  qe_args a, d;
  qe_common(&a, gu, b, K); /* as k_qe_gate_up with hp_group 64 */
  a.X = b->xp;
  a.Kdim = H;
  a.N = IE;
  a.h = b->h;
  a.hg = 64;
  a.hs = b->hs;
  qe_common(&d, dn, b, K); /* as k_qe_down over the copy and sums made by gate/up's epilogue */
  d.X = b->h;
  d.xs = b->hs;
  d.Kdim = IE;
  d.N = H;
  d.y = b->y;
  if (!qr_fg_takes(ntr, a, d)) return cudaSuccess;
  *ran = 1;
  const int ready = b->gu_ready == xe && b->gu_group == a.group; /* made by route_gr_kernel (moe.cu) */
  b->gu_ready = NULL;
  b->hp_group = 0; /* nothing left for a k_qe_down */
  if (!ready) {
    const cudaError_t e = k_group_sums_perm(s, xe, T, H, a.group, b->xs, b->xp);
    if (e != cudaSuccess) return e;
  }
  const cudaError_t e = qr_fg_bits<4>(s, E, ntr, a, d, ctr);
  qr_fg_launches++;
#ifdef DG_CUDA_EMU /* launches run to completion on the emulation: a wait that found its count short raised the flag */
  if (e == cudaSuccess && ctr[2]) {
    ctr[2] = 0;
    return cudaErrorLaunchFailure;
  }
#endif
  return e;
}

/* One block per row, a thread per group: sums in fp32, in column order. */
__global__ void group_sums_kernel(const bf16 *x, int cols, int G, float *out) {
  DG_PDL_ENTRY();
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

/* As group_sums_kernel, and the row copied to xp with each run of 8 values
 * permuted to (x0, x4, x1, x5, x2, x6, x3, x7) (qr_kernel's fragment order; group_sum_perm, mma.cuh). */
__global__ void group_sums_perm_kernel(const bf16 *x, int cols, int G, float *out, bf16 *xp) {
  DG_PDL_ENTRY();
  const int r = blockIdx.x, ng = cols / G;
  const bf16 *p = x + (size_t)r * cols;
  bf16 *q = xp + (size_t)r * cols;
  for (int j = threadIdx.x; j < ng; j += blockDim.x) out[(size_t)r * ng + j] = group_sum_perm(p + j * G, q + j * G, G);
}

/* Version 2 (session 22): a thread per (row, group) over the whole [rows, cols / G] (blocks of GSP_THREADS, as
 * many as the groups need: 22,528 groups of a 26B down input in 352 blocks, against 2,048 blocks of 64 threads of
 * which 11 work), each group's loads all issued before its stores (group_sum_perm_any, mma.cuh): one load latency
 * per group instead of G / 8. The same additions in the same order: every output word version 0's. */
#define GSP_THREADS 64
__global__ void __launch_bounds__(GSP_THREADS) group_sums_perm_flat_kernel(const bf16 *x, int ng, int G, long n,
                                                                           float *out, bf16 *xp) {
  DG_PDL_ENTRY();
  const long i = (long)blockIdx.x * GSP_THREADS + threadIdx.x; /* group i: row i / ng, group i % ng */
  if (i >= n) return;
  out[i] = group_sum_perm_any(x + i * G, xp + i * G, G); /* row r's group j starts at r cols + j G = i G */
}

/* DGEMMA_GSP=flat: k_group_sums_perm takes version 2 (above); read once when the library loads; not the default
 * until timed on a GPU (dev/cuda/step_kernels.cu's "gate/up input copy" and "down input copy" rows). */
static int gsp_from_env(void) { return (int)dg_sw_get(DG_SW_GSP); } /* "flat" 2, unset 0 */
static const int gsp_default = gsp_from_env();

cudaError_t k_group_sums_perm_v(cudaStream_t s, int version, const bf16 *x, int rows, int cols, int G, float *out,
                                bf16 *xp) {
  if (rows <= 0) return cudaSuccess;
  if (version == 2) {
    const long n = (long)rows * (cols / G);
    if (n <= 0) return cudaSuccess;
    DG_LAUNCH(group_sums_perm_flat_kernel, (unsigned)((n + GSP_THREADS - 1) / GSP_THREADS), GSP_THREADS, 0, s)(
        x, cols / G, G, n, out, xp);
    return cudaGetLastError();
  }
  DG_LAUNCH(group_sums_perm_kernel, rows, 64, 0, s)(x, cols, G, out, xp);
  return cudaGetLastError();
}

cudaError_t k_group_sums_perm(cudaStream_t s, const bf16 *x, int rows, int cols, int G, float *out, bf16 *xp) {
  return k_group_sums_perm_v(s, gsp_default, x, rows, cols, G, out, xp);
}

/* bf16 bits of v (round to nearest even; the parts here are finite) and the value they stand for */
__device__ __forceinline__ uint32_t qs_bf16(float v, float *back) {
  const bf16 h = __float2bfloat16_rn(v);
  *back = __bfloat162float(h);
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

/* As group_sums_perm_kernel, the sums as the split records of k_group_sums_perm_split. */
__global__ void group_sums_perm_split_kernel(const bf16 *x, int cols, int G, uint4 *out4, bf16 *xp) {
  DG_PDL_ENTRY();
  const int r = blockIdx.x, ng = cols / G;
  const bf16 *p = x + (size_t)r * cols;
  bf16 *q = xp + (size_t)r * cols;
  for (int j = threadIdx.x; j < ng; j += blockDim.x) {
    const float s = group_sum_perm(p + j * G, q + j * G, G);
    float h, m, l, d;
    const uint32_t bh = qs_bf16(s, &h), bm = qs_bf16(s - h, &m), bl = qs_bf16(s - h - m, &l);
    const uint32_t nh = qs_bf16(-128.0f * h, &d), nm = qs_bf16(-128.0f * m, &d), nl = qs_bf16(-128.0f * l, &d);
    out4[(size_t)r * ng + j] = make_uint4(bh | bm << 16, bl | nh << 16, nm | nl << 16, 0u);
  }
}

cudaError_t k_group_sums_perm_split(cudaStream_t s, const bf16 *x, int rows, int cols, int G, uint4 *out4, bf16 *xp) {
  if (rows <= 0) return cudaSuccess;
  DG_LAUNCH(group_sums_perm_split_kernel, rows, 64, 0, s)(x, cols, G, out4, xp);
  return cudaGetLastError();
}

size_t qr_tile_bytes(const qe_tiling &t) {
  return (size_t)(t.E * qe_slabs(t)) * (size_t)(t.K / t.kc) * (size_t)t.warps * (size_t)qr_wstage(t.bits, t.group, t.cp);
}

void qr_tile_pack(const qe_tiling &t, const uint8_t *codes, const void *scales, const void *biases, uint8_t *dst) {
  memset(dst, 0, qr_tile_bytes(t));
  const int KC = t.kc, RUNS = KC / 32, GPS = KC / t.group, CB = 4 * RUNS * t.bits, REC = qr_rec(t.bits, t.group);
  const int PS = REC % 16 == 0 ? 16 : 8, NP = REC / PS, nst = (int)(t.K / KC);
  const int64_t slabs = qe_slabs(t), rowbytes = t.K * t.bits / 8, ng = t.K / t.group;
  uint8_t rec[512];
  for (int64_t e = 0; e < t.E; e++)
    for (int64_t sl = 0; sl < slabs; sl++)
      for (int s = 0; s < nst; s++)
        for (int w = 0; w < t.warps; w++)
          for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, t4 = lane & 3;
            memset(rec, 0, (size_t)REC);
            for (int r = 0; r < 4; r++) {
              const int64_t gr = qe_tile_row(t, e, sl, w * 32 + (r >> 1) * 16 + g + 8 * (r & 1));
              if (gr < 0) continue;
              for (int c = 0; c < RUNS; c++) {
                uint8_t *o = rec + (r * RUNS + c) * t.bits;
                memcpy(o, codes + gr * rowbytes + ((int64_t)s * KC + 32 * c + 8 * t4) * t.bits / 8, (size_t)t.bits);
                if (t.bits == 16) { /* bf16 weights w0..w7 stored as the pairs (w0, w4), (w1, w5), (w2, w6), (w3, w7) */
                  uint16_t v[8], pv[8];
                  memcpy(v, o, 16);
                  for (int i = 0; i < 4; i++) { pv[2 * i] = v[i]; pv[2 * i + 1] = v[i + 4]; }
                  memcpy(o, pv, 16);
                }
              }
              for (int j = 0; j < (t.bits == 16 ? 0 : GPS); j++) {
                const size_t src = (size_t)(gr * ng + (int64_t)s * GPS + j) * 2;
                memcpy(rec + CB + (r * GPS + j) * 4, (const uint8_t *)scales + src, 2);
                memcpy(rec + CB + (r * GPS + j) * 4 + 2, (const uint8_t *)biases + src, 2);
              }
            }
            const int64_t si = e * slabs + sl;
            if (t.cp) { /* codes piece-major over the lanes, then the pairs of row group g once */
              const int PSC = CB % 16 == 0 ? 16 : 8;
              uint8_t *ws = dst + ((si * nst + s) * t.warps + w) * (int64_t)qr_wstage(t.bits, t.group, 1);
              for (int p = 0; p < CB / PSC; p++) memcpy(ws + (p * 32 + lane) * PSC, rec + p * PSC, (size_t)PSC);
              if (t4 == 0 && t.bits != 16) memcpy(ws + 32 * CB + g * 16 * GPS, rec + CB, (size_t)(16 * GPS));
              continue;
            }
            for (int p = 0; p < NP; p++)
              memcpy(dst + ((((si * nst + s) * t.warps + w) * NP + p) * 32 + lane) * PS, rec + p * PS, (size_t)PS);
          }
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
