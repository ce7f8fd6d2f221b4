/* upload.cu: the CUDA backend's device checks (dg_cuda_info) and the upload
 * of a model's weights (dg_cuda_model_new): float matrices as bf16,
 * MLX affine-quantized ones packed as stored (expert stacks in the tile or
 * lane-record layouts of qmoe.cuh / qmoe_r.cuh), vectors fp32, all resident
 * (interface: backend.h; the host description is the loader's dg_layer /
 * dg_weight, src/base/layer.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"
#include "cuda/qmoe_r.cuh"
#include "base/dtype.h"
extern "C" {
#include "io/quant.h" /* dg_weight_row_f32 */
}

#ifndef DG_CUDA_ARCHS
#define DG_CUDA_ARCHS "unknown"
#endif

cudaError_t k_probe(void);

/* ---- device ----------------------------------------------------------------- */

/* Free and total device memory; DGEMMA_CUDA_MEM_LIMIT=BYTES in the environment
 * caps what dgemma considers free (to share a GPU, and to test the refusal).
 * Returns DG_ERR_BACKEND if cudaMemGetInfo fails, DG_ERR_INVALID_ARG (naming the
 * variable and its value) if the variable is set to anything but a decimal byte
 * count (digits only, below 2^64). */
dg_status mem_info(size_t *fr, size_t *tot) {
  CK(cudaMemGetInfo(fr, tot));
  const char *lim = getenv("DGEMMA_CUDA_MEM_LIMIT");
  if (lim && *lim) {
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(lim, &end, 10);
    if (*lim < '0' || *lim > '9' || errno || !end || *end)
      return dg_seterr(DG_ERR_INVALID_ARG,
                       "DGEMMA_CUDA_MEM_LIMIT=\"%.64s\" is not a byte count (digits only, e.g. 17179869184 for "
                       "16 GiB; unset: no cap)",
                       lim);
    if ((size_t)v < *fr) *fr = (size_t)v;
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_mem_used(int device, size_t *used, size_t *total) {
  size_t fr = 0, tot = 0;
  CK(cudaSetDevice(device));
  CK(cudaMemGetInfo(&fr, &tot)); /* not mem_info: DGEMMA_CUDA_MEM_LIMIT caps free memory, not what is used */
  *used = tot - fr;
  *total = tot;
  return DG_OK;
}

extern "C" dg_status dg_cuda_info(int device, char *buf, size_t n) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "no usable CUDA GPU: cudaGetDeviceCount failed: %s (%s)", cudaGetErrorName(e),
                     cudaGetErrorString(e));
  if (count == 0) return dg_seterr(DG_ERR_BACKEND, "no CUDA GPU is visible (cudaGetDeviceCount = 0)");
  if (device < 0 || device >= count)
    return dg_seterr(DG_ERR_BACKEND, "CUDA device %d does not exist (%d visible)", device, count);
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, device));
  if (p.major < 8)
    return dg_seterr(DG_ERR_BACKEND,
                     "GPU %d (%s) has compute capability %d.%d; dgemma's CUDA backend needs 8.0 or newer (bf16 "
                     "tensor cores); this build targets %s",
                     device, p.name, p.major, p.minor, DG_CUDA_ARCHS);
  CK(cudaSetDevice(device));
  e = k_probe();
  if (e != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "GPU %d (%s, sm_%d%d) cannot run this build's kernels (built for %s): %s", device,
                     p.name, p.major, p.minor, DG_CUDA_ARCHS, cudaGetErrorString(e));
  size_t fr = 0, tot = 0;
  DG_TRY(mem_info(&fr, &tot));
  int drv = 0, rt = 0;
  CK(cudaDriverGetVersion(&drv));
  CK(cudaRuntimeGetVersion(&rt));
  if (buf && n)
    snprintf(buf, n, "%s, sm_%d%d, %d SMs, %.1f GiB free of %.1f GiB, driver %d.%d, runtime %d.%d (build: %s)", p.name,
             p.major, p.minor, p.multiProcessorCount, fr / GiB, tot / GiB, drv / 1000, (drv % 1000) / 10, rt / 1000,
             (rt % 1000) / 10, DG_CUDA_ARCHS);
  return DG_OK;
}

/* ---- upload ----------------------------------------------------------------- */

/* Element i of a float matrix as fp32: the ground floor's reading (src/base/dtype.h), as the CPU path's */
static float mat_elem(const dg_weight *m, size_t i) { return dg_load_elem(m->dtype, m->data, (int64_t)i); }

/* Copy elements [off, off + n) of a host matrix to dst as bf16, staged in chunks. */
static dg_status upload_bf16(bf16 *dst, const dg_weight *m, size_t off, size_t n, uint16_t *stage) {
  if (m->dtype == DG_BF16) {
    CK(cudaMemcpy(dst, (const char *)m->data + 2 * off, 2 * n, cudaMemcpyHostToDevice));
    return DG_OK;
  }
  for (size_t i = 0; i < n; i += STAGE_ELEMS) {
    size_t k = n - i < STAGE_ELEMS ? n - i : STAGE_ELEMS;
    for (size_t j = 0; j < k; j++) stage[j] = dg_f32_to_bf16(mat_elem(m, off + i + j));
    CK(cudaMemcpy(dst + i, stage, 2 * k, cudaMemcpyHostToDevice));
  }
  return DG_OK;
}

/* All device allocations of a model or context, freed together. */
dg_status dalloc(alloc_list *al, void **out, size_t bytes, const char *what) {
  const size_t nb = (bytes + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN + (bytes == 0) * CARVE_ALIGN;
  if (al->arena && nb <= al->arena_cap - al->arena_off) {
    *out = al->arena + al->arena_off;
    al->arena_off += nb;
    return DG_OK;
  }
  if (al->n == al->cap) {
    int nc = al->cap ? 2 * al->cap : 64;
    void **np = (void **)realloc(al->p, (size_t)nc * sizeof *np);
    if (!np) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
    al->p = np;
    al->cap = nc;
  }
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
  if (e != cudaSuccess)
    return dg_seterr(e == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND,
                     "cudaMalloc(%zu bytes) for %s failed: %s", bytes, what, cudaGetErrorString(e));
  al->p[al->n++] = p;
  *out = p;
  return DG_OK;
}

void dfree_all(alloc_list *al) {
  for (int i = 0; i < al->n; i++) cudaFree(al->p[i]);
  free(al->p);
  al->p = NULL;
  al->n = al->cap = 0;
  al->arena = NULL;
  al->arena_off = al->arena_cap = 0;
}

/* One cudaMalloc of bytes as al's arena (recorded in al, freed by dfree_all); 0 when DGEMMA_WEIGHT_BLOCK=0 (one
 * cudaMalloc per matrix, as before session 28) or the allocation fails (dalloc then allocates each on its own). */
static int arena_new(alloc_list *al, size_t bytes) {
  if (dg_sw_get(DG_SW_WEIGHT_BLOCK) == 0) return 0; /* backend/switches.c */
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (al->n == al->cap) {
    const int nc = al->cap ? 2 * al->cap : 64;
    void **np = (void **)realloc(al->p, (size_t)nc * sizeof *np);
    if (!np) {
      cudaFree(p);
      return 0;
    }
    al->p = np;
    al->cap = nc;
  }
  al->p[al->n++] = p; /* freed by dfree_all with the rest */
  al->arena = (unsigned char *)p;
  al->arena_off = 0;
  al->arena_cap = bytes;
  return 1;
}

static int memlog_on(void) {
  static const int on = dg_sw_get(DG_SW_CUDA_MEMLOG) == 1;
  return on;
}

void mem_log(const char *where) {
  if (!memlog_on()) return;
  size_t fr = 0, tot = 0, stack = 0, fifo = 0, heap = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
    fprintf(stderr, "dgemma cuda mem: %s: cudaMemGetInfo failed: %s\n", where, cudaGetErrorString(cudaGetLastError()));
    return;
  }
#ifndef DG_CUDA_EMU
  (void)cudaDeviceGetLimit(&stack, cudaLimitStackSize);
  (void)cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize);
  (void)cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize);
  (void)cudaGetLastError();
#endif
  fprintf(stderr, "dgemma cuda mem: %s: used %.1f MiB (%.3f GiB), free %.1f MiB; limits: stack %zu B, printf fifo %zu B, "
          "malloc heap %zu B\n", where, (tot - fr) / 1048576.0, (tot - fr) / GiB, fr / 1048576.0, stack, fifo, heap);
}

/* The context's device-side limits (DGEMMA_CUDA_LIMITS=0 keeps the driver's defaults): the per-thread stack limit
 * to 0 bytes, and the printf FIFO and the device malloc heap (no kernel of ours calls printf or malloc) to 0. The
 * driver reserves local memory for the stack limit times the threads the GPU holds at once (default 1 KiB: 132 SMs
 * x 2,048 threads x 1 KiB = 264 MiB on an H100) and grows it itself for a launch whose kernel needs more ("The
 * driver automatically increases the per-thread stack size for each kernel launch as needed", cuCtxSetLimit,
 * CUDA driver API), so no kernel runs differently; DGEMMA_CUDA_MEMLOG=1 prints the limit the passes leave. A
 * refusal (a FIFO or heap set after a kernel that uses it ran) is ignored: the limit stays as it was. */
static void dev_limits(void) {
#ifndef DG_CUDA_EMU
  if (dg_sw_get(DG_SW_CUDA_LIMITS) == 0) return; /* backend/switches.c */
  (void)cudaDeviceSetLimit(cudaLimitStackSize, 0);
  (void)cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 0);
  (void)cudaDeviceSetLimit(cudaLimitMallocHeapSize, 0);
  (void)cudaGetLastError();
#endif
}

/* Model-side bookkeeping kept next to the public struct. */
struct model_priv {
  dg_cuda_model m;
  alloc_list al;
};

dg_status up_vec(alloc_list *al, float **dst, const float *src, size_t n, const char *what) {
  DG_TRY(dalloc(al, (void **)dst, n * sizeof(float), what));
  CK(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
  return DG_OK;
}

static size_t sb_size(int sb) { return sb == DG_F32 ? 4 : 2; }

/* Device bytes of one matrix: bf16, or packed words + scales + biases. */
static size_t mat_bytes(const dg_weight *m) {
  if (!m->data) return 0;
  const size_t n = (size_t)m->rows * (size_t)m->cols;
  if (!m->bits) return n * 2;
  return n * (size_t)m->bits / 8 + 2 * (n / (size_t)m->group_size) * sb_size(m->sb_dtype);
}

/* Same format: both float (any float dtype becomes bf16), or both quantized
 * alike (so that their rows concatenate into one quantized matrix). */
static int same_format(const dg_weight *a, const dg_weight *b) {
  if (!a->bits || !b->bits) return !a->bits && !b->bits;
  return a->bits == b->bits && a->group_size == b->group_size && a->sb_dtype == b->sb_dtype && a->cols == b->cols;
}

/* Upload the row blocks parts[0..nparts) (one format, same cols) as one
 * device matrix: bf16, or packed words, scales and biases as stored. */
dg_status up_w(alloc_list *al, dg_cuda_w *dst, const dg_weight *const *parts, int nparts, const char *what,
                      uint16_t *stage) {
  memset(dst, 0, sizeof *dst);
  dst->cols = parts[0]->cols;
  for (int i = 0; i < nparts; i++) dst->rows += parts[i]->rows;
  const size_t tot = (size_t)dst->rows * (size_t)dst->cols;
  if (!parts[0]->bits) {
    DG_TRY(dalloc(al, (void **)&dst->w, tot * 2, what));
    size_t off = 0;
    for (int i = 0; i < nparts; i++) {
      size_t n = (size_t)(parts[i]->rows * parts[i]->cols);
      DG_TRY(upload_bf16(dst->w + off, parts[i], 0, n, stage));
      off += n;
    }
    return DG_OK;
  }
  const int bits = parts[0]->bits, G = parts[0]->group_size;
  const size_t ss = sb_size(parts[0]->sb_dtype);
  dst->bits = bits;
  dst->group = G;
  dst->sb = parts[0]->sb_dtype;
  DG_TRY(dalloc(al, (void **)&dst->q, tot * (size_t)bits / 8, what));
  DG_TRY(dalloc(al, &dst->s, tot / (size_t)G * ss, what));
  DG_TRY(dalloc(al, &dst->b, tot / (size_t)G * ss, what));
  size_t off = 0; /* elements */
  for (int i = 0; i < nparts; i++) {
    const size_t n = (size_t)(parts[i]->rows * parts[i]->cols);
    CK(cudaMemcpy((char *)dst->q + off * bits / 8, parts[i]->data, n * bits / 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy((char *)dst->s + off / G * ss, parts[i]->scales, n / G * ss, cudaMemcpyHostToDevice));
    CK(cudaMemcpy((char *)dst->b + off / G * ss, parts[i]->biases, n / G * ss, cudaMemcpyHostToDevice));
    off += n;
  }
  return DG_OK;
}

/* The layout of an expert stack: the lane records of qr_kernel (qmoe_r.cuh)
 * where it applies (quantized: bf16 scales and biases; columns a multiple of
 * its stage), else the tile layout of qe_kernel (qmoe.cuh: f16 and f32 pairs)
 * or, for bf16 stacks, the plain [rows, cols] of grouped_kernel (moe.cu). */
static int expert_lay(const dg_weight *m) {
  if (!m->bits) return m->cols % qr_kc(QR_BF16_GROUP, 16) == 0 ? DG_CUDA_LAY_LANES : DG_CUDA_LAY_TILES;
  return m->sb_dtype == DG_BF16 && m->cols % qr_kc(m->group_size) == 0 ? DG_CUDA_LAY_LANES : DG_CUDA_LAY_TILES;
}

/* Its tiling (qe_tiling) for E experts: gate/up [E * 2 IE, H] (gateup = 1) or down [E * H, IE]. */
static qe_tiling expert_tiling(const dg_weight *m, int gateup, int64_t E) {
  if (!m->bits) return qe_tiling_of(QR_WARPS, qr_kc(QR_BF16_GROUP, 16), gateup, 16, QR_BF16_GROUP, 4, E, m->rows, m->cols);
  if (expert_lay(m) == DG_CUDA_LAY_LANES)
    return qe_tiling_of(QR_WARPS, qr_kc(m->group_size), gateup, m->bits, m->group_size, 4, E, m->rows, m->cols);
  return qe_tiling_of(QE_WARPS, QE_KC, gateup, m->bits, m->group_size, 2 * (int)sb_size(m->sb_dtype), E, m->rows,
                      m->cols);
}

/* Device bytes of an expert stack: bf16, or the packed codes and (scale, bias) pairs. */
static size_t expert_bytes(const dg_weight *m, int gateup, int64_t E) {
  if (!m->data || (!m->bits && expert_lay(m) != DG_CUDA_LAY_LANES)) return mat_bytes(m);
  size_t pb;
  const qe_tiling t = expert_tiling(m, gateup, E);
  if (expert_lay(m) == DG_CUDA_LAY_LANES) return qr_tile_bytes(t);
  const size_t qb = qe_tile_bytes(t, &pb);
  return qb + pb;
}

/* Upload an expert stack: bf16 as up_w; quantized: the codes and the
 * (scale, bias) pairs in the tile layout of the tensor-core kernels
 * (qmoe.cuh: each block's pipeline stage one contiguous run), packed on the
 * host; the MLX arrays themselves are not uploaded. */
dg_status up_experts(alloc_list *al, dg_cuda_w *dst, const dg_weight *m, int gateup, int64_t E,
                            const char *what, uint16_t *stage) {
  if (!m->bits && expert_lay(m) != DG_CUDA_LAY_LANES) {
    const dg_weight *p1[1] = {m};
    return up_w(al, dst, p1, 1, what, stage);
  }
  if (E <= 0 || m->rows % (gateup ? 2 * E : E))
    return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "CUDA backend: %s has %lld rows, not a multiple of %lld experts", what,
                     (long long)m->rows, (long long)E);
  memset(dst, 0, sizeof *dst);
  dst->rows = m->rows;
  dst->cols = m->cols;
  dst->bits = m->bits;
  dst->group = m->group_size;
  dst->sb = m->sb_dtype;
  dst->lay = expert_lay(m);
  const qe_tiling t = expert_tiling(m, gateup, E);
  if (dst->lay == DG_CUDA_LAY_LANES) {
    const size_t qb = qr_tile_bytes(t);
    uint8_t *hq = (uint8_t *)malloc(qb);
    if (!hq) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory packing %s (%zu bytes)", what, qb);
    const void *codes = m->data;
    uint16_t *wb = NULL; /* a bf16 stack of another float dtype: its bf16 copy, as upload_bf16 rounds it */
    if (!m->bits && m->dtype != DG_BF16) {
      const size_t n = (size_t)m->rows * (size_t)m->cols;
      if (!(wb = (uint16_t *)malloc(2 * n))) {
        free(hq);
        return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory converting %s to bf16 (%zu bytes)", what, 2 * n);
      }
      for (size_t i = 0; i < n; i++) wb[i] = dg_f32_to_bf16(mat_elem(m, i));
      codes = wb;
    }
    qr_tile_pack(t, (const uint8_t *)codes, m->scales, m->biases, hq);
    free(wb);
    dg_status st = dalloc(al, (void **)&dst->q, qb, what);
    cudaError_t e = cudaSuccess;
    if (st == DG_OK && (e = cudaMemcpy(dst->q, hq, qb, cudaMemcpyHostToDevice)) != cudaSuccess)
      st = dg_seterr(DG_ERR_BACKEND, "%s:%d: cudaMemcpy of %s failed: %s", __FILE__, __LINE__, what, cudaGetErrorString(e));
    free(hq);
    if (st == DG_OK && qr_wl_usable(m, gateup)) st = up_experts_wl(al, dst, m, E, what); /* DGEMMA_WL=1 */
    return st;
  }
  size_t pb;
  const size_t qb = qe_tile_bytes(t, &pb);
  uint8_t *hq = (uint8_t *)malloc(qb), *hp = (uint8_t *)malloc(pb);
  if (!hq || !hp) {
    free(hq);
    free(hp);
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory packing %s (%zu bytes)", what, qb + pb);
  }
  qe_tile_pack(t, (const uint8_t *)m->data, m->scales, m->biases, hq, hp);
  dg_status st = dalloc(al, (void **)&dst->q, qb, what);
  if (st == DG_OK) st = dalloc(al, &dst->sbp, pb, what);
  cudaError_t e = cudaSuccess;
  if (st == DG_OK && (e = cudaMemcpy(dst->q, hq, qb, cudaMemcpyHostToDevice)) == cudaSuccess)
    e = cudaMemcpy(dst->sbp, hp, pb, cudaMemcpyHostToDevice);
  if (st == DG_OK && e != cudaSuccess)
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: cudaMemcpy of %s failed: %s", __FILE__, __LINE__, what, cudaGetErrorString(e));
  free(hq);
  free(hp);
  return st;
}

/* Upload the row blocks of a fused product: runs of consecutive blocks of one
 * format become one matrix each (dg_cuda_wset). */
static dg_status up_wset(alloc_list *al, dg_cuda_wset *dst, const dg_weight *const *parts, int nparts,
                         const char *what, uint16_t *stage) {
  dst->n = 0;
  for (int i = 0; i < nparts;) {
    int j = i + 1;
    while (j < nparts && same_format(parts[i], parts[j])) j++;
    DG_TRY(up_w(al, &dst->p[dst->n++], parts + i, j - i, what, stage));
    i = j;
  }
  return DG_OK;
}

/* Device bytes of the weights described by d (what dg_cuda_model_new allocates). */
static size_t weight_bytes(const dg_cuda_model_desc *d) {
  const size_t H = d->hidden, E = d->n_experts;
  size_t b = mat_bytes(&d->embed) + 2 * H * 4 + mat_bytes(&d->sc_gate) + mat_bytes(&d->sc_up) + mat_bytes(&d->sc_down);
  for (int i = 0; i < d->n_layers; i++) {
    const dg_layer *l = &d->layers[i];
    const size_t D = l->head_dim;
    b += mat_bytes(&l->q) + mat_bytes(&l->k) + mat_bytes(&l->v) + mat_bytes(&l->o) + 2 * D * 4 + 7 * H * 4;
    b += mat_bytes(&l->mlp_gate) + mat_bytes(&l->mlp_up) + mat_bytes(&l->mlp_down) + E * H * 4 + H * 4 + E * 4;
    b += expert_bytes(&l->experts_gate_up, 1, (int64_t)E) + expert_bytes(&l->experts_down, 0, (int64_t)E);
  }
  b += 2 * 512 * 4;
  return b;
}

/* A quantized matrix the kernels take: bits 2/3/4/6/8, group 32/64/128
 * dividing cols, scales of a float dtype; else DG_ERR_UNSUPPORTED_MODEL. */
dg_status check_mat(const dg_weight *m, const char *what, int layer) {
  if (!m->data) return DG_OK;
  char where[32] = "";
  if (layer >= 0) snprintf(where, sizeof where, " of layer %d", layer);
  const int b = m->bits, g = m->group_size;
  if (!b) {
    if (m->dtype == DG_BF16 || m->dtype == DG_F16 || m->dtype == DG_F32) return DG_OK;
    return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "CUDA backend: %s%s has dtype %s (supported: bf16, f16, f32)", what,
                     where, dg_dtype_name(m->dtype));
  }
  if ((b != 2 && b != 3 && b != 4 && b != 6 && b != 8) || (g != 32 && g != 64 && g != 128) || m->cols % g ||
      (m->sb_dtype != DG_BF16 && m->sb_dtype != DG_F16 && m->sb_dtype != DG_F32) || !m->scales || !m->biases)
    return dg_seterr(DG_ERR_UNSUPPORTED_MODEL,
                     "CUDA backend: %s%s is quantized with %d bits, group size %d, %lld columns, scales dtype %s "
                     "(supported: bits 2/3/4/6/8, group 32/64/128 dividing the columns, bf16/f16/f32 scales and "
                     "biases)",
                     what, where, b, g, (long long)m->cols, dg_dtype_name(m->sb_dtype));
  return DG_OK;
}

/* The shapes and formats the kernels take: head_dim, KV heads, top_k, every
 * matrix (check_mat); else
 * DG_ERR_UNSUPPORTED_MODEL naming the layer and the field. */
static dg_status check_desc(const dg_cuda_model_desc *d) {
  for (int i = 0; i < d->n_layers; i++) {
    const dg_layer *l = &d->layers[i];
    if (l->head_dim > 512 || l->head_dim % 2 || l->head_dim <= 0)
      return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "CUDA backend: layer %d head_dim %d (supported: even, <= 512)", i,
                       l->head_dim);
    if (l->n_kv <= 0 || d->n_heads % l->n_kv)
      return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "CUDA backend: layer %d has %d KV heads for %d query heads", i,
                       l->n_kv, d->n_heads);
  }
  if (d->top_k > 64 || d->top_k <= 0)
    return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "CUDA backend: top_k_experts %d (supported: 1..64)", d->top_k);
  DG_TRY(check_mat(&d->embed, "embed_tokens", -1));
  DG_TRY(check_mat(&d->sc_gate, "self_conditioning.gate_proj", -1));
  DG_TRY(check_mat(&d->sc_up, "self_conditioning.up_proj", -1));
  DG_TRY(check_mat(&d->sc_down, "self_conditioning.down_proj", -1));
  for (int i = 0; i < d->n_layers; i++) {
    const dg_layer *l = &d->layers[i];
    const dg_weight *ms[] = {&l->q, &l->k, &l->v, &l->o, &l->mlp_gate, &l->mlp_up, &l->mlp_down,
                               &l->experts_gate_up, &l->experts_down};
    const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                           "experts.gate_up_proj", "experts.down_proj"};
    for (int j = 0; j < 9; j++) DG_TRY(check_mat(ms[j], names[j], i));
    if (!l->router.bits) DG_TRY(check_mat(&l->router, "router.proj", i)); /* quantized: dequantized on the host */
  }
  return DG_OK;
}

/* *need = the weights' device bytes (weight_bytes); DG_ERR_OUT_OF_MEMORY
 * when they and RESERVE do not fit in the GPU's free memory. */
static dg_status check_fits(const dg_cuda_model_desc *d, size_t *need_out) {
  const size_t need = weight_bytes(d);
  size_t fr = 0, tot = 0;
  DG_TRY(mem_info(&fr, &tot));
  if (need + RESERVE > fr)
    return dg_seterr(DG_ERR_OUT_OF_MEMORY,
                     "the model does not fit on the GPU: its weights need %zu bytes (%.2f GiB) of device memory "
                     "(float matrices as bf16, quantized ones packed), plus a %.1f GiB reserve; GPU %d has %zu bytes (%.2f GiB) free of %.2f GiB",
                     need, need / GiB, RESERVE / GiB, d->device, fr, fr / GiB, tot / GiB);
  *need_out = need;
  return DG_OK;
}

/* Upload the weights outside the layers: embedding, final norm, the
 * self-conditioning MLP, the RoPE inverse frequencies (zeros for a kind of
 * layer the model lacks). */
static dg_status upload_globals(alloc_list *al, dg_cuda_model *m, const dg_cuda_model_desc *d, uint16_t *stage) {
  const size_t H = d->hidden;
  const dg_weight *p2[2];
  p2[0] = &d->embed;
  DG_TRY(up_w(al, &m->embed, p2, 1, "embed_tokens", stage));
  DG_TRY(up_vec(al, &m->final_norm, d->final_norm, H, "norm"));
  DG_TRY(up_vec(al, &m->sc_pre_norm, d->sc_pre_norm, H, "self_conditioning.pre_norm"));
  p2[0] = &d->sc_gate; p2[1] = &d->sc_up;
  DG_TRY(up_wset(al, &m->sc_gate_up, p2, 2, "self_conditioning gate/up", stage));
  p2[0] = &d->sc_down;
  DG_TRY(up_w(al, &m->sc_down, p2, 1, "self_conditioning.down_proj", stage));
  float zeros[256] = {0};
  int ds = 0, df = 0;
  for (int i = 0; i < d->n_layers; i++) {
    if (d->layers[i].is_full) df = d->layers[i].head_dim; else ds = d->layers[i].head_dim;
  }
  DG_TRY(up_vec(al, &m->inv_freq_sliding, ds ? d->inv_freq_sliding : zeros, ds ? (size_t)ds / 2 : 1, "rope sliding"));
  return up_vec(al, &m->inv_freq_full, df ? d->inv_freq_full : zeros, df ? (size_t)df / 2 : 1, "rope full");
}

/* The router of a layer, kept in fp32 (spec 4.6: fp32 router logits; cublasSgemm). A quantized router
 * (`router.proj`, recipe class `router`) is dequantized here on the host, exactly as the CPU reads it
 * (dg_weight_row_f32, src/io/quant.h): [E, H] fp32 is 1.4 MB per layer at E = 128, H = 2816, against 0.4 MB
 * packed at 8 bits. */
static dg_status upload_router(alloc_list *al, float **dst, const dg_weight *router, size_t n, const char *what) {
  float *tmp = (float *)malloc(n * sizeof(float));
  if (!tmp) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  if (router->bits)
    for (int64_t r = 0; r < router->rows; r++) dg_weight_row_f32(router, r, tmp + r * router->cols);
  else
    for (size_t j = 0; j < n; j++) tmp[j] = mat_elem(router, j);
  dg_status st = up_vec(al, dst, tmp, n, what);
  free(tmp);
  return st;
}

/* Upload layer i (ld) into l: fused q/k/v and gate/up, the norms, router,
 * experts, scalars; widens the model's dmax / kvmax / qkvmax. */
static dg_status upload_layer(alloc_list *al, dg_cuda_model *m, dg_cuda_layer *l, const dg_cuda_model_desc *d, int i,
                              uint16_t *stage) {
  const dg_layer *ld = &d->layers[i];
  const size_t H = d->hidden, E = d->n_experts, D = ld->head_dim;
  const dg_weight *p2[3];
  char what[96];
  snprintf(what, sizeof what, "layer %d", i);
  l->is_full = ld->is_full;
  l->n_kv = ld->n_kv;
  l->head_dim = ld->head_dim;
  l->has_v = ld->v.data != NULL;
  l->n_qkv = (int64_t)(d->n_heads * D + ld->n_kv * D * (l->has_v ? 2 : 1));
  p2[0] = &ld->q; p2[1] = &ld->k; p2[2] = &ld->v;
  DG_TRY(up_wset(al, &l->wqkv, p2, l->has_v ? 3 : 2, what, stage));
  p2[0] = &ld->o;
  DG_TRY(up_w(al, &l->wo, p2, 1, what, stage));
  DG_TRY(up_vec(al, &l->q_norm, ld->q_norm, D, what));
  DG_TRY(up_vec(al, &l->k_norm, ld->k_norm, D, what));
  DG_TRY(up_vec(al, &l->input_norm, ld->input_norm, H, what));
  DG_TRY(up_vec(al, &l->post_attn_norm, ld->post_attn_norm, H, what));
  DG_TRY(up_vec(al, &l->pre_ff_norm, ld->pre_ff_norm, H, what));
  DG_TRY(up_vec(al, &l->post_ff1_norm, ld->post_ff1_norm, H, what));
  DG_TRY(up_vec(al, &l->pre_ff2_norm, ld->pre_ff2_norm, H, what));
  DG_TRY(up_vec(al, &l->post_ff2_norm, ld->post_ff2_norm, H, what));
  DG_TRY(up_vec(al, &l->post_ff_norm, ld->post_ff_norm, H, what));
  p2[0] = &ld->mlp_gate; p2[1] = &ld->mlp_up;
  DG_TRY(up_wset(al, &l->w_gate_up, p2, 2, what, stage));
  p2[0] = &ld->mlp_down;
  DG_TRY(up_w(al, &l->w_down, p2, 1, what, stage));
  DG_TRY(upload_router(al, &l->router, &ld->router, E * H, what));
  DG_TRY(up_vec(al, &l->router_scale, ld->router_scale, H, what));
  DG_TRY(up_vec(al, &l->per_expert_scale, ld->per_expert_scale, E, what));
  DG_TRY(up_experts(al, &l->experts_gate_up, &ld->experts_gate_up, 1, d->n_experts, what, stage));
  DG_TRY(up_experts(al, &l->experts_down, &ld->experts_down, 0, d->n_experts, what, stage));
  l->layer_scalar_dec = ld->layer_scalar_dec;
  l->layer_scalar_enc = ld->layer_scalar_enc;
  if ((int)D > m->dmax) m->dmax = (int)D;
  if (ld->n_kv * (int)D > m->kvmax) m->kvmax = ld->n_kv * (int)D;
  if ((int)l->n_qkv > m->qkvmax) m->qkvmax = (int)l->n_qkv;
  return DG_OK;
}

/* Every weight of d to the device (the host staging buffer: stage), then a
 * synchronize so that an upload error shows here. */
static dg_status upload_all(alloc_list *al, dg_cuda_model *m, const dg_cuda_model_desc *d, uint16_t *stage) {
  DG_TRY(upload_globals(al, m, d, stage));
  for (int i = 0; i < d->n_layers; i++) DG_TRY(upload_layer(al, m, &m->layers[i], d, i, stage));
  if (cudaDeviceSynchronize() != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "cudaDeviceSynchronize after the upload failed: %s",
                     cudaGetErrorString(cudaGetLastError()));
  return DG_OK;
}

/* DGEMMA_CUBLAS_POOL: cuBLAS's default workspace pool per handle, which each cublasCreate allocates (on the H100 of
 * session 29 every cublasCreate of a context added 64-66 MiB of device memory, DGEMMA_CUDA_MEMLOG) although every
 * product of the passes runs on a workspace of the context's own (cublasSetWorkspace, set again after every
 * cublasSetStream, which resets it to that pool: context.cu ctx_stream / ctx_side, passes.cu blas_onto). The pool's
 * size is CUBLAS_WORKSPACE_CONFIG=:SIZE_KIB:COUNT[:SIZE:COUNT...] (cuBLAS documentation, "Results reproducibility"
 * and cublasSetWorkspace), read by cuBLAS from the environment. Unset or "default": nothing set (cuBLAS's own pool,
 * as before); "small": CUBLAS_WORKSPACE_CONFIG=:16:8 (8 buffers of 16 KiB, a size that section names); "zero":
 * ":0:0" (whether cuBLAS accepts an empty pool is the GPU's to show). Set in this process's environment when the
 * first model is made, before the library's first cublasCreate, and only where CUBLAS_WORKSPACE_CONFIG is unset (the
 * user's own is kept). Off by default until a GPU call shows the words and the speed unchanged with it (docs/cuda.md,
 * session 29 helper mm12); bench's ceiling GEMM (ceil.cu), the one handle without a workspace of ours, then runs on
 * the small pool. Anything else: DG_ERR_INVALID_ARG naming the variable and the value. */
static dg_status cublas_pool_env(void) {
  long pool[2];
  DG_TRY(dg_sw_read(dg_sw_of(DG_SW_CUBLAS_POOL), pool)); /* default 0, small 1, zero 2 (backend/switches.c) */
  if (pool[0] == 0) return DG_OK;
  const char *cfg = pool[0] == 1 ? ":16:8" : ":0:0";
  const char *u = getenv("CUBLAS_WORKSPACE_CONFIG");
  if (!u || !*u) setenv("CUBLAS_WORKSPACE_CONFIG", cfg, 1);
  return DG_OK;
}

extern "C" dg_status dg_cuda_model_new(const dg_cuda_model_desc *d, dg_cuda_model **out) {
  *out = NULL;
  char info[512];
  DG_TRY(cublas_pool_env());
  DG_TRY(dg_cuda_info(d->device, info, sizeof info));
  if (memlog_on()) {
    const char *ml = getenv("CUDA_MODULE_LOADING"), *bw = getenv("CUBLAS_WORKSPACE_CONFIG"),
               *pool = getenv("DGEMMA_CUBLAS_POOL");
    fprintf(stderr, "dgemma cuda mem: %s; CUDA_MODULE_LOADING=%s; CUBLAS_WORKSPACE_CONFIG=%s; DGEMMA_CUBLAS_POOL=%s\n",
            info, ml && *ml ? ml : "(unset: the runtime's default, LAZY from CUDA 12.2)",
            bw && *bw ? bw : "(unset: cuBLAS's default pool per handle)", pool && *pool ? pool : "(unset: default)");
  }
  mem_log("model: the CUDA context made (dg_cuda_info's probe kernel ran)");
  dev_limits();
  mem_log("model: after the context's limits (stack, printf FIFO, malloc heap)");
  DG_TRY(check_desc(d));
  size_t need = 0;
  DG_TRY(check_fits(d, &need));

  model_priv *pv = (model_priv *)calloc(1, sizeof *pv);
  uint16_t *stage = (uint16_t *)malloc(STAGE_ELEMS * 2);
  dg_cuda_layer *layers = (dg_cuda_layer *)calloc((size_t)d->n_layers, sizeof *layers);
  if (!pv || !stage || !layers) {
    free(pv); free(stage); free(layers);
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  }
  dg_cuda_model *m = &pv->m;
  m->d = *d;
  m->d.layers = NULL;
  m->device = d->device;
  m->layers = layers;
  m->bytes = need;
  /* the weights in one block: need (weight_bytes) plus CARVE_ALIGN for each allocation up_* makes (at most 3 x 3
   * for a fused q/k/v, 3 for o, 9 vectors, 2 x 3 + 3 for the dense MLP, 3 for the router and its scales, 2 x 2 for
   * the experts: 40 per layer; 32 for the globals) */
  arena_new(&pv->al, need + (size_t)CARVE_ALIGN * (32 + 40 * (size_t)d->n_layers));
  dg_status st = upload_all(&pv->al, m, d, stage);
  free(stage);
  if (st != DG_OK) {
    dfree_all(&pv->al);
    free(layers);
    free(pv);
    return st;
  }
  if (memlog_on()) {
    char w[160];
    snprintf(w, sizeof w, "model: after the weights (%zu bytes = %.3f GiB; %s, %d allocations outside it)", need,
             need / GiB, pv->al.arena ? "one block" : "one cudaMalloc each", pv->al.n - (pv->al.arena ? 1 : 0));
    mem_log(w);
  }
  *out = m;
  return DG_OK;
}

extern "C" void dg_cuda_model_free(dg_cuda_model *m) {
  if (!m) return;
  model_priv *pv = (model_priv *)m; /* m is the first member */
  cudaSetDevice(m->device);
  dfree_all(&pv->al);
  free(m->layers);
  free(pv);
}

extern "C" size_t dg_cuda_model_bytes(const dg_cuda_model *m) { return m ? m->bytes : 0; }

/* For tests/support/cuda_entry.cu (dg_cuda_test_weight_block): m's device allocations (*n: cudaMalloc calls
 * recorded, the arena one of them), and its arena's bytes carved (*used) of *cap (0 and 0: no arena). */
extern "C" void dg_cuda_model_allocs(const dg_cuda_model *m, int *n, size_t *used, size_t *cap) {
  const model_priv *pv = (const model_priv *)m;
  *n = pv->al.n;
  *used = pv->al.arena ? pv->al.arena_off : 0;
  *cap = pv->al.arena ? pv->al.arena_cap : 0;
}

