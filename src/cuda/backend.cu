/* backend.cu: host side of the CUDA backend (interface: backend.h): device
 * checks, weight upload (bf16, resident), contexts (KV cache, work buffers,
 * one stream, one cuBLAS handle) and the encoder/decoder passes of spec
 * section 4 as a sequence of cuBLAS products and kernels (kernels.cu,
 * moe.cu), mirroring src/forward.c step by step.
 *
 * MLX affine-quantized matrices stay packed on the device and go through
 * the dequantizing kernels of quant.cu instead of cuBLAS / the bf16 expert
 * kernel. Not here: the generation loop (src/generate.c drives both
 * backends). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/qmoe_r.cuh"
#include "dtype.h"
extern "C" {
#include "quant.h" /* dg_weight_row_f32 */
}

#ifndef DG_CUDA_ARCHS
#define DG_CUDA_ARCHS "unknown"
#endif

cudaError_t k_probe(void);

#define GiB (1024.0 * 1024.0 * 1024.0)
#define ENC_CHUNK 256 /* as src/forward.c */
#define RESERVE ((size_t)512 << 20) /* CUDA context, cuBLAS workspace and fragmentation */

/* ---- device ----------------------------------------------------------------- */

/* Free and total device memory; DGEMMA_CUDA_MEM_LIMIT=BYTES in the environment
 * caps what dgemma considers free (to share a GPU, and to test the refusal). */
static cudaError_t mem_info(size_t *fr, size_t *tot) {
  cudaError_t e = cudaMemGetInfo(fr, tot);
  const char *lim = getenv("DGEMMA_CUDA_MEM_LIMIT");
  if (e == cudaSuccess && lim && *lim) {
    unsigned long long v = strtoull(lim, NULL, 10);
    if ((size_t)v < *fr) *fr = (size_t)v;
  }
  return e;
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
  CK(mem_info(&fr, &tot));
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

/* Element i of a float matrix as fp32: the ground floor's reading (src/dtype.h), as the CPU path's */
static float mat_elem(const dg_weight *m, size_t i) { return dg_load_elem(m->dtype, m->data, (int64_t)i); }

#define STAGE_ELEMS ((size_t)8 << 20)

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

typedef struct alloc_list {
  void **p;
  int n, cap;
} alloc_list;

/* All device allocations of a model or context, freed together. */
static dg_status dalloc(alloc_list *al, void **out, size_t bytes, const char *what) {
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

static void dfree_all(alloc_list *al) {
  for (int i = 0; i < al->n; i++) cudaFree(al->p[i]);
  free(al->p);
  al->p = NULL;
  al->n = al->cap = 0;
}

/* Model-side bookkeeping kept next to the public struct. */
struct model_priv {
  dg_cuda_model m;
  alloc_list al;
};

static dg_status up_vec(alloc_list *al, float **dst, const float *src, size_t n, const char *what) {
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
static dg_status up_w(alloc_list *al, dg_cuda_w *dst, const dg_weight *const *parts, int nparts, const char *what,
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
static dg_status up_experts(alloc_list *al, dg_cuda_w *dst, const dg_weight *m, int gateup, int64_t E,
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
static dg_status check_mat(const dg_weight *m, const char *what, int layer) {
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
  CK(mem_info(&fr, &tot));
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
 * (dg_weight_row_f32, src/quant.h): [E, H] fp32 is 1.4 MB per layer at E = 128, H = 2816, against 0.4 MB
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

extern "C" dg_status dg_cuda_model_new(const dg_cuda_model_desc *d, dg_cuda_model **out) {
  *out = NULL;
  char info[512];
  DG_TRY(dg_cuda_info(d->device, info, sizeof info));
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
  dg_status st = upload_all(&pv->al, m, d, stage);
  free(stage);
  if (st != DG_OK) {
    dfree_all(&pv->al);
    free(layers);
    free(pv);
    return st;
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

/* ---- context ---------------------------------------------------------------- */

static void turbo_free(dg_cuda_ctx *c); /* the turbo buffers (end of this file) */

struct ctx_priv {
  dg_cuda_ctx c;
  alloc_list al;
};

extern "C" dg_status dg_cuda_ctx_new(dg_cuda_model *m, int32_t cap, dg_cuda_ctx **out) {
  *out = NULL;
  const dg_cuda_model_desc *d = &m->d;
  CK(cudaSetDevice(m->device));
  const size_t C = d->canvas, H = d->hidden, V = d->vocab, I = d->inter, IE = d->moe_inter, E = d->n_experts,
               K = d->top_k, NH = d->n_heads;
  const size_t T = C > ENC_CHUNK ? C : ENC_CHUNK, S = (size_t)cap + C;
  size_t kv = 0;
  for (int i = 0; i < d->n_layers; i++) kv += 2 * (size_t)m->layers[i].n_kv * S * (size_t)m->layers[i].head_dim * 2;
  const size_t TK = T * K, W = H > 2 * I ? H : 2 * I;
  const size_t scratch = T * 4 + T * H * 4 * 4 + T * W * 4 + T * H * 2 * 2 + T * (size_t)m->qkvmax * 4 +
                         T * NH * m->dmax * (4 + 2) + T * 2 * I * 4 + T * I * 2 + T * E * 4 + TK * (4 * 4 + 8) +
                         (E + 1) * 8 + TK * IE * 2 + TK * H * 4 + (TK * IE > T * H ? TK * IE : T * H) / 8 + C * V * (4 + 2) + C * H * 4 + C * 24 + 64 +
                         8 * C * NH * (m->dmax + 2) * 4 /* attention key splits */ + DG_ROUTER_MAX_SPLITS * T * E * 4 +
                         k_vocab_ws_bytes((int)C, (int)V);
  size_t fr = 0, tot = 0;
  CK(mem_info(&fr, &tot));
  if (kv + scratch + (RESERVE / 2) > fr)
    return dg_seterr(DG_ERR_OUT_OF_MEMORY,
                     "a context of %d positions needs %zu bytes (%.2f GiB) of device memory (KV cache %zu, work "
                     "buffers %zu) plus a %.2f GiB reserve; GPU %d has %zu bytes (%.2f GiB) free of %.2f GiB",
                     cap, kv + scratch, (kv + scratch) / GiB, kv, scratch, RESERVE / 2 / GiB, m->device, fr, fr / GiB,
                     tot / GiB);
  ctx_priv *pv = (ctx_priv *)calloc(1, sizeof *pv);
  if (!pv) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  dg_cuda_ctx *c = &pv->c;
  alloc_list *al = &pv->al;
  c->m = m;
  c->cap = cap;
  c->S = (int32_t)S;
  c->tmax = (int32_t)T;
  {
    const char *dbg = getenv("DGEMMA_CUDA_SYNC");
    c->debug_sync = dbg && *dbg == '1';
  }
  dg_status st = DG_OK;
  c->kc = (bf16 **)calloc((size_t)d->n_layers, sizeof(bf16 *));
  c->vc = (bf16 **)calloc((size_t)d->n_layers, sizeof(bf16 *));
  if (!c->kc || !c->vc) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto fail; }
#define A_(ptr, bytes) do { if ((st = dalloc(al, (void **)&(ptr), (bytes), #ptr)) != DG_OK) goto fail; } while (0)
  for (int i = 0; i < d->n_layers; i++) {
    size_t n = (size_t)m->layers[i].n_kv * S * (size_t)m->layers[i].head_dim * 2;
    A_(c->kc[i], n);
    A_(c->vc[i], n);
    if (cudaMemset(c->kc[i], 0, n) != cudaSuccess || cudaMemset(c->vc[i], 0, n) != cudaSuccess) {
      st = dg_seterr(DG_ERR_BACKEND, "cudaMemset of the KV cache failed");
      goto fail;
    }
  }
  A_(c->ids, T * 4);
  A_(c->x, T * H * 4);
  A_(c->f1, T * W * 4);
  A_(c->dense, T * H * 4);
  A_(c->a, T * H * 2);
  A_(c->xe, T * H * 2);
  A_(c->u, T * H * 4);
  A_(c->qkv, T * (size_t)m->qkvmax * 4);
  A_(c->q, T * NH * (size_t)m->dmax * 4);
  A_(c->att, T * NH * (size_t)m->dmax * 2);
  /* up to 8 key splits of a canvas's attention (attention.cu lowers the count for more rows) */
  c->att_ws.n = 8 * C * NH * ((size_t)m->dmax + 2);
  A_(c->att_ws.part, c->att_ws.n * 4);
  A_(c->gu, T * 2 * I * 4);
  A_(c->h, T * (I > IE ? I : IE) * 2);
  A_(c->rlog, T * E * 4);
  A_(c->rws, DG_ROUTER_MAX_SPLITS * T * E * 4);
  A_(c->moe.topk_idx, TK * 4);
  A_(c->moe.topk_w, TK * 4);
  A_(c->moe.count, E * 4);
  A_(c->moe.start, (E + 1) * 4);
  A_(c->moe.pairs, TK * 4);
  A_(c->moe.slot_row, TK * 4);
  A_(c->moe.tiles, (TK + E) * 2 * 4);
  A_(c->moe.n_tiles, 4);
  A_(c->moe.order, E * 4);
  A_(c->moe.h, TK * IE * 2);
  A_(c->moe.y, TK * H * 4);
  A_(c->moe.xs, (TK * IE > T * H ? TK * IE : T * H) / 32 * 4);
  A_(c->moe.xp, (TK * IE > T * H ? TK * IE : T * H) * 2);
  A_(c->logits, C * V * 4);
  A_(c->P, C * V * 2);
  A_(c->soft, C * H * 4);
  A_(c->uni, C * 4);
  A_(c->stats, C * sizeof(dg_cuda_pos_stats));
  A_(c->bad, 4);
  A_(c->vws, k_vocab_ws_bytes((int)C, (int)V));
#undef A_
  if (cudaMallocHost((void **)&c->h_stats, C * sizeof(dg_cuda_pos_stats)) != cudaSuccess ||
      cudaMallocHost((void **)&c->h_bad, 4) != cudaSuccess) {
    st = dg_seterr(DG_ERR_BACKEND, "cudaMallocHost of %zu bytes failed", C * sizeof(dg_cuda_pos_stats) + 4);
    goto fail;
  }
  {
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) { st = dg_seterr(DG_ERR_BACKEND, "cudaStreamCreateWithFlags failed: %s", cudaGetErrorString(e)); goto fail; }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) { c->blas = NULL; st = dg_seterr(DG_ERR_BACKEND, "cublasCreate failed: %s", cublasGetStatusString(bs)); goto fail; }
    bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 for fp32 products */
    if (bs != CUBLAS_STATUS_SUCCESS) { st = dg_seterr(DG_ERR_BACKEND, "cublasSetStream/SetMathMode failed: %s", cublasGetStatusString(bs)); goto fail; }
    /* the cache memsets ran on the legacy stream, which our non-blocking stream does not wait for */
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { st = dg_seterr(DG_ERR_BACKEND, "cudaDeviceSynchronize failed: %s", cudaGetErrorString(e)); goto fail; }
  }
  *out = c;
  return DG_OK;
fail:
  dg_cuda_ctx_free(c);
  return st;
}

extern "C" void dg_cuda_ctx_free(dg_cuda_ctx *c) {
  if (!c) return;
  ctx_priv *pv = (ctx_priv *)c;
  cudaSetDevice(c->m->device);
  if (c->stream) cudaStreamSynchronize(c->stream);
  if (c->prof) dg_cuda_profile(c, 0);
  if (c->blas) cublasDestroy(c->blas);
  if (c->stream) cudaStreamDestroy(c->stream);
  if (c->h_stats) cudaFreeHost(c->h_stats);
  if (c->h_bad) cudaFreeHost(c->h_bad);
  turbo_free(c);
  dfree_all(&pv->al);
  free(c->kc);
  free(c->vc);
  free(pv);
}

/* ---- stage timing ------------------------------------------------------------ */

#define PROF_EV 2048 /* events per batch; a full batch is synchronised and summed */
struct dg_cuda_prof {
  cudaEvent_t ev[PROF_EV];
  int st[PROF_EV]; /* stage of the interval ending at ev[i] */
  int n;           /* events recorded in this batch (ev[0] may be the previous batch's last) */
  double ms[DG_CUDA_NSTAGES];
  int64_t marks;
};

static const char *const kStageNames[DG_CUDA_NSTAGES] = {
    "embedding and norms", "q/k/v + rope", "attention", "o-proj", "dense MLP", "router + top-k", "grouping",
    "experts", "combine", "LM head", "self-conditioning", "sampler statistics", "host and launch gaps"};

extern "C" const char *dg_cuda_stage_name(int i) { return i >= 0 && i < DG_CUDA_NSTAGES ? kStageNames[i] : "?"; }

/* Sum the intervals of the recorded batch, keep its last event as the next batch's start. */
static dg_status prof_flush(dg_cuda_ctx *c) {
  dg_cuda_prof *p = c->prof;
  if (p->n == 0) return DG_OK;
  CK(cudaEventSynchronize(p->ev[p->n - 1]));
  for (int i = 1; i < p->n; i++) {
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
    p->ms[p->st[i]] += ms;
  }
  cudaEvent_t last = p->ev[p->n - 1];
  p->ev[p->n - 1] = p->ev[0];
  p->ev[0] = last;
  p->n = 1;
  return DG_OK;
}

/* The interval that ends now belongs to stage st (no-op when profiling is off). */
static dg_status mark(dg_cuda_ctx *c, int st) {
  dg_cuda_prof *p = c->prof;
  if (!p) return DG_OK;
  if (p->n == PROF_EV) DG_TRY(prof_flush(c));
  CK(cudaEventRecord(p->ev[p->n], c->stream));
  p->st[p->n++] = st;
  p->marks++;
  return DG_OK;
}

extern "C" dg_status dg_cuda_profile(dg_cuda_ctx *c, int on) {
  CK(cudaSetDevice(c->m->device));
  if (c->prof) {
    CK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < PROF_EV; i++) cudaEventDestroy(c->prof->ev[i]);
    free(c->prof);
    c->prof = NULL;
  }
  if (!on) return DG_OK;
  dg_cuda_prof *p = (dg_cuda_prof *)calloc(1, sizeof *p);
  if (!p) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory for %d profiling events", PROF_EV);
  for (int i = 0; i < PROF_EV; i++) {
    cudaError_t e = cudaEventCreate(&p->ev[i]);
    if (e != cudaSuccess) {
      for (int j = 0; j < i; j++) cudaEventDestroy(p->ev[j]);
      free(p);
      return dg_seterr(DG_ERR_BACKEND, "cudaEventCreate failed: %s", cudaGetErrorString(e));
    }
  }
  c->prof = p;
  return DG_OK;
}

extern "C" dg_status dg_cuda_profile_read(dg_cuda_ctx *c, double *ms, int64_t *n_marks) {
  if (!c->prof) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_profile_read: profiling is off (dg_cuda_profile(c, 1) first)");
  CK(cudaSetDevice(c->m->device));
  DG_TRY(prof_flush(c));
  for (int i = 0; i < DG_CUDA_NSTAGES; i++) ms[i] = c->prof->ms[i];
  if (n_marks) *n_marks = c->prof->marks;
  return DG_OK;
}

/* ---- products ----------------------------------------------------------------- */

/* y[t, n] (ld ldy, fp32) = alpha * sum_k x[t, k] * W[n, k] + beta * y: x bf16 [T, K] (ld ldx),
 * W bf16 [N, K] row-major; fp32 accumulation. */
static dg_status gemm(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const bf16 *W, int N, int K, float *y, int ldy,
                      float alpha, float beta) {
  CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, ldx, &beta,
                   y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DG_OK;
}

/* y[t, n] (ld ldy, fp32) = sum_k x[t, k] * W[n, k] for every row n of W:
 * cuBLAS for bf16, the dequantizing kernel (quant.cu) for quantized W. */
static dg_status wmatmul(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const dg_cuda_w *W, float *y, int ldy) {
  if (!W->bits) return gemm(c, x, ldx, T, W->w, (int)W->rows, (int)W->cols, y, ldy, 1.0f, 0.0f);
  CKK(c, k_qmatmul(c->stream, x, ldx, T, W, 0, (int)W->rows, y, ldy));
  return DG_OK;
}

/* The same over the row blocks of a fused product: block i writes columns
 * [sum of the rows before it, + its rows) of y. */
static dg_status wsetmatmul(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const dg_cuda_wset *S, float *y, int ldy) {
  int64_t off = 0;
  for (int i = 0; i < S->n; i++) {
    DG_TRY(wmatmul(c, x, ldx, T, &S->p[i], y + off, ldy));
    off += S->p[i].rows;
  }
  return DG_OK;
}

/* GeGLU MLP (spec 4.1): out[T, H] = down(gelu(gate a) * up a), a bf16 [T, H]. */
static dg_status geglu_mlp(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up,
                           const dg_cuda_w *w_down, float *out) {
  const int H = c->m->d.hidden, I = c->m->d.inter;
  DG_TRY(wsetmatmul(c, a, H, T, w_gate_up, c->gu, 2 * I));
  CKK(c, k_geglu(c->stream, c->gu, c->h, T, I));
  DG_TRY(wmatmul(c, c->h, I, T, w_down, out, H));
  return DG_OK;
}

/* One layer (spec 4.4) over c->x [T, H] at positions pos0..; causal = encoder.
 * dpos != NULL (decoder only): the compacted pass (spec 7.4), the T rows sit at
 * the absolute positions dpos[T] (device), their K/V go to those cache slots,
 * and they attend over the prefix and the whole canvas [pos0, pos0 + C). */
static dg_status layer_at(dg_cuda_ctx *c, int li, int T, int32_t pos0, int causal, const int32_t *dpos) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const dg_cuda_layer *l = &m->layers[li];
  const int H = d->hidden, NH = d->n_heads, NKV = l->n_kv, D = l->head_dim;
  const float eps = d->eps;
  cudaStream_t s = c->stream;
  CKK(c, k_rmsnorm(s, c->x, l->input_norm, NULL, c->a, T, H, eps));
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
  DG_TRY(wsetmatmul(c, c->a, H, T, &l->wqkv, c->qkv, (int)l->n_qkv));
  if (dpos)
    CKK(c, k_qkv_post_at(s, c->qkv, l->n_qkv, c->q, c->kc[li], c->vc[li], c->S, l->q_norm, l->k_norm,
                         l->is_full ? m->inv_freq_full : m->inv_freq_sliding, T, NH, NKV, D, l->has_v, dpos, eps));
  else
  CKK(c, k_qkv_post(s, c->qkv, l->n_qkv, c->q, c->kc[li], c->vc[li], c->S, l->q_norm, l->k_norm,
                l->is_full ? m->inv_freq_full : m->inv_freq_sliding, T, NH, NKV, D, l->has_v, pos0, eps));
  DG_TRY(mark(c, DG_CUDA_ST_QKV));
  /* encoder: after the last layer's K/V nothing is needed (spec 4.4, last paragraph) */
  if (causal && li == d->n_layers - 1) return DG_OK;
  if (dpos)
    CKK(c, k_attention_canvas(s, &c->att_ws, c->q, c->kc[li], c->vc[li], c->att, c->S, T, NH, NKV, D, pos0, d->canvas, l->is_full,
                              d->window));
  else
  CKK(c, k_attention(s, &c->att_ws, c->q, c->kc[li], c->vc[li], c->att, c->S, T, NH, NKV, D, pos0, causal, l->is_full, d->window));
  DG_TRY(mark(c, DG_CUDA_ST_ATTN));
  DG_TRY(wmatmul(c, c->att, NH * D, T, &l->wo, c->f1, H));
  DG_TRY(mark(c, DG_CUDA_ST_OPROJ));
  const float root = (float)pow((double)H, -0.5);
  CKK(c, k_attn_residual(s, c->x, c->f1, l->post_attn_norm, l->pre_ff_norm, l->pre_ff2_norm, l->router_scale, root, c->a,
                     c->xe, c->u, T, H, eps));
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
  DG_TRY(geglu_mlp(c, c->a, T, &l->w_gate_up, &l->w_down, c->dense));
  DG_TRY(mark(c, DG_CUDA_ST_DENSE));
  /* router logits in fp32 (spec 4.6 step 2) */
  CKK(c, k_router_logits(s, c->u, l->router, c->rlog, T, d->n_experts, H, c->rws));
  CKK(c, k_route_topk(s, c->rlog, l->per_expert_scale, &c->moe, T, d->n_experts, d->top_k));
  DG_TRY(mark(c, DG_CUDA_ST_ROUTER));
  CKK(c, k_group(s, &c->moe, T, d->n_experts, d->top_k));
  DG_TRY(mark(c, DG_CUDA_ST_GROUP));
  CKK(c, dg_cuda_experts(s, l, c->xe, &c->moe, T, H, d->moe_inter, d->n_experts, d->top_k));
  DG_TRY(mark(c, DG_CUDA_ST_EXPERTS));
  CKK(c, k_ffn_combine(s, c->x, c->dense, c->moe.y, c->moe.slot_row, c->moe.topk_idx, c->moe.topk_w, l->post_ff1_norm,
                   l->post_ff2_norm, l->post_ff_norm, causal ? l->layer_scalar_enc : l->layer_scalar_dec, T, H,
                   d->top_k, eps));
  DG_TRY(mark(c, DG_CUDA_ST_COMBINE));
  return DG_OK;
}

static dg_status layer(dg_cuda_ctx *c, int li, int T, int32_t pos0, int causal) {
  return layer_at(c, li, T, pos0, causal, NULL);
}

extern "C" dg_status dg_cuda_encode(dg_cuda_ctx *c, const int32_t *ids, int32_t n, int32_t pos0) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (n < 0 || pos0 < 0 || (int64_t)pos0 + n > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA encode: positions %d..%d exceed the context capacity %d", pos0,
                     pos0 + n - 1, c->cap);
  CK(cudaSetDevice(c->m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  for (int32_t i = 0; i < n; i += ENC_CHUNK) {
    const int T = n - i < ENC_CHUNK ? n - i : ENC_CHUNK;
    CK(cudaMemcpyAsync(c->ids, ids + i, (size_t)T * 4, cudaMemcpyHostToDevice, c->stream));
    CKK(c, k_embed(c->stream, c->x, &c->m->embed, c->ids, T, d->hidden, d->embed_scale));
    DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
    for (int li = 0; li < d->n_layers; li++) DG_TRY(layer(c, li, T, pos0 + i, 1));
  }
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

/* soft [C, H] = embed_scale * P . E with P = cast(softmax(cast(z))) (spec 5, 4.9). */
static dg_status soft_from(dg_cuda_ctx *c, const float *z) {
  const dg_cuda_model_desc *d = &c->m->d;
  CKK(c, k_sc_probs(c->stream, z, c->P, d->canvas, d->vocab, d->act_dtype, c->vws));
  const float alpha = d->embed_scale, beta = 0.0f;
  if (c->m->embed.bits) { /* quantized tied embedding: P . E with E dequantized in the kernel */
    CKK(c, k_qsoft(c->stream, c->P, d->canvas, &c->m->embed, alpha, c->soft));
    c->have_soft = 1;
    return DG_OK;
  }
  /* column-major view: soft^T [H, C] = E^T [H, V] . P^T [V, C] */
  CKB(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->hidden, d->canvas, d->vocab, &alpha, c->m->embed.w,
                   CUDA_R_16BF, d->hidden, c->P, CUDA_R_16BF, d->vocab, &beta, c->soft, CUDA_R_32F, d->hidden,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  c->have_soft = 1;
  return DG_OK;
}

extern "C" dg_status dg_cuda_soft_from_z(dg_cuda_ctx *c) {
  CK(cudaSetDevice(c->m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  DG_TRY(soft_from(c, c->logits));
  return mark(c, DG_CUDA_ST_SC);
}

/* The decoder over the whole canvas up to the last layer (spec 4.8, 4.4):
 * c->x [C, H] = layers(post_norm(embed(canvas) + SC_MLP(pre_norm(soft)))),
 * the SC term only with DG_SC_KEPT (c->soft on the device; a zero signal adds
 * exactly zero, so DG_SC_NONE skips it). Shared by dg_cuda_decode and
 * dg_cuda_decode_rows, which differ only in the LM head. */
static dg_status decoder_layers(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int T = d->canvas, H = d->hidden;
  cudaStream_t s = c->stream;
  CK(cudaMemcpyAsync(c->ids, canvas, (size_t)T * 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_embed(s, c->x, &m->embed, c->ids, T, H, d->embed_scale));
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
  /* h0 = post_norm(e + SC_MLP(pre_norm(soft))) (spec 4.8, 5); a zero signal adds exactly zero */
  if (sc == DG_SC_KEPT) {
    CKK(c, k_rmsnorm(s, c->soft, m->sc_pre_norm, NULL, c->a, T, H, d->eps));
    DG_TRY(geglu_mlp(c, c->a, T, &m->sc_gate_up, &m->sc_down, c->f1));
    CKK(c, k_add(s, c->x, c->f1, (size_t)T * H));
    DG_TRY(mark(c, DG_CUDA_ST_SC));
  }
  CKK(c, k_rmsnorm(s, c->x, NULL, c->x, NULL, T, H, d->eps));
  for (int li = 0; li < d->n_layers; li++) DG_TRY(layer(c, li, T, pos0, 0));
  return DG_OK;
}

extern "C" dg_status dg_cuda_decode(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc,
                                    const float *sc_logits, float *logits_out) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int T = d->canvas, H = d->hidden;
  cudaStream_t s = c->stream;
  if (pos0 < 0 || pos0 > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA decode: canvas at position %d is past the context capacity %d", pos0,
                     c->cap);
  CK(cudaSetDevice(m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  if (sc == DG_SC_HOST) {
    CK(cudaMemcpyAsync(c->logits, sc_logits, (size_t)T * d->vocab * 4, cudaMemcpyHostToDevice, s));
    DG_TRY(soft_from(c, c->logits));
    DG_TRY(mark(c, DG_CUDA_ST_SC));
    sc = DG_SC_KEPT;
  }
  if (sc == DG_SC_KEPT && !c->have_soft) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA decode: no soft embedding on the device");
  DG_TRY(decoder_layers(c, canvas, pos0, sc));
  /* final norm, tied LM head, softcap (spec 4.7) */
  CKK(c, k_rmsnorm(s, c->x, m->final_norm, NULL, c->a, T, H, d->eps));
  DG_TRY(wmatmul(c, c->a, H, T, &m->embed, c->logits, d->vocab));
  if (d->softcap > 0.0f) CKK(c, k_softcap(s, c->logits, (size_t)T * d->vocab, d->softcap));
  DG_TRY(mark(c, DG_CUDA_ST_HEAD));
  if (logits_out) {
    CK(cudaMemcpyAsync(logits_out, c->logits, (size_t)T * d->vocab * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_step_stats(dg_cuda_ctx *c, float temperature, dg_proposal mode, uint64_t seed, int32_t block,
                                        int32_t step, const float *uni, void *out, int32_t *bad_pos) {
  const dg_cuda_model_desc *d = &c->m->d;
  const int C = d->canvas;
  cudaStream_t s = c->stream;
  CK(cudaSetDevice(c->m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  if (mode == DG_PROPOSAL_REPLAY_UNIFORM) CK(cudaMemcpyAsync(c->uni, uni, (size_t)C * 4, cudaMemcpyHostToDevice, s));
  *c->h_bad = INT32_MAX;
  CK(cudaMemcpyAsync(c->bad, c->h_bad, 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_step_stats(s, c->logits, C, d->vocab, temperature, mode, seed, (uint32_t)block, (uint32_t)step, c->uni,
                  c->stats, c->bad, c->vws));
  CK(cudaMemcpyAsync(c->h_stats, c->stats, (size_t)C * sizeof(dg_cuda_pos_stats), cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(c->h_bad, c->bad, 4, cudaMemcpyDeviceToHost, s));
  DG_TRY(mark(c, DG_CUDA_ST_STATS));
  CK(cudaStreamSynchronize(s));
  if (*c->h_bad != INT32_MAX) {
    *bad_pos = *c->h_bad;
    return DG_ERR_NUMERIC;
  }
  memcpy(out, c->h_stats, (size_t)C * sizeof(dg_cuda_pos_stats));
  return DG_OK;
}

/* ---- turbo engine (spec 7; host engine src/turbo.c, kernels turbo.cu) -------------- */

/* Device buffers of the turbo entry points, allocated on first use. */
struct dg_cuda_turbo {
  int32_t *pos;      /* [tmax] absolute positions of a compacted pass's rows */
  int32_t *cpos;     /* [tmax] their canvas positions (self-conditioning rows) */
  int32_t *rows;     /* [C] LM-head rows, then canvas rows of the self-conditioning signal */
  int32_t *h_pos;    /* host [tmax] */
  int32_t nraw;      /* rows of raw logits in c->logits (0: none) */
  int32_t K;         /* largest K the top-K buffers hold (0: not allocated) */
  int32_t klast;     /* K of the last dg_cuda_topk: the layout of idx [n, klast] */
  float *cv, *candv, *val, *p; /* [C, nC], [C, min(K, nC) * 64], [C, K], [C, K] */
  int32_t *ci, *candi, *idx;   /* as cv, candv, val */
  int32_t *bad;      /* [1 + C] */
};

static void turbo_topk_free(dg_cuda_turbo *t) {
  cudaFree(t->cv); cudaFree(t->candv); cudaFree(t->val); cudaFree(t->p);
  cudaFree(t->ci); cudaFree(t->candi); cudaFree(t->idx); cudaFree(t->bad);
  t->cv = t->candv = t->val = t->p = NULL;
  t->ci = t->candi = t->idx = t->bad = NULL;
  t->K = t->klast = 0;
}

static void turbo_free(dg_cuda_ctx *c) {
  dg_cuda_turbo *t = c->tb;
  if (!t) return;
  turbo_topk_free(t);
  cudaFree(t->pos); cudaFree(t->cpos); cudaFree(t->rows);
  free(t->h_pos);
  free(t);
  c->tb = NULL;
}

#define TB_MALLOC(ptr, bytes, what)                                                                          \
  do {                                                                                                       \
    const size_t tb_n_ = (size_t)(bytes);                                                                    \
    cudaError_t tb_e_ = cudaMalloc((void **)&(ptr), tb_n_ > 0 ? tb_n_ : 16);                                 \
    if (tb_e_ != cudaSuccess)                                                                                \
      return dg_seterr(tb_e_ == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND,           \
                       "cudaMalloc(%zu bytes) for the turbo %s failed: %s", tb_n_, what,                    \
                       cudaGetErrorString(tb_e_));                                                           \
  } while (0)

static dg_status turbo_index_bufs(dg_cuda_turbo *t, size_t C, size_t T) {
  t->h_pos = (int32_t *)malloc(T * 4);
  if (!t->h_pos) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  TB_MALLOC(t->pos, T * 4, "positions");
  TB_MALLOC(t->cpos, T * 4, "positions");
  TB_MALLOC(t->rows, C * 4, "rows");
  return DG_OK;
}

/* c->tb with its index buffers; with K > 0 also the top-K buffers for K
 * (kept across calls for the largest K asked; a failed allocation leaves
 * nothing half-made behind). */
static dg_status turbo_bufs(dg_cuda_ctx *c, int32_t K) {
  const size_t C = c->m->d.canvas, V = c->m->d.vocab, T = c->tmax;
  if (!c->tb) {
    dg_cuda_turbo *t = (dg_cuda_turbo *)calloc(1, sizeof *t);
    if (!t) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
    c->tb = t;
    dg_status st = turbo_index_bufs(t, C, T);
    if (st) {
      turbo_free(c);
      return st;
    }
  }
  dg_cuda_turbo *t = c->tb;
  if (K > t->K) {
    turbo_topk_free(t);
    const size_t nC = (V + 63) / 64, nsel = (size_t)K < nC ? (size_t)K : nC;
    TB_MALLOC(t->cv, C * nC * 4, "chunk maxima");
    TB_MALLOC(t->ci, C * nC * 4, "chunk maxima");
    TB_MALLOC(t->candv, C * nsel * 64 * 4, "top-K candidates");
    TB_MALLOC(t->candi, C * nsel * 64 * 4, "top-K candidates");
    TB_MALLOC(t->val, C * (size_t)K * 4, "top-K values");
    TB_MALLOC(t->idx, C * (size_t)K * 4, "top-K ids");
    TB_MALLOC(t->p, C * (size_t)K * 4, "top-K probabilities");
    TB_MALLOC(t->bad, (C + 1) * 4, "flags");
    t->K = K; /* only when all succeeded: a later call retries after freeing the partial set */
  }
  return DG_OK;
}
#undef TB_MALLOC

/* Self-conditioning input of a decoder pass: DG_SC_HOST uploads host rows soft [C, H] into c->soft. */
static dg_status turbo_soft_in(dg_cuda_ctx *c, dg_sc_source *sc, const float *soft) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (*sc == DG_SC_HOST) {
    if (!soft) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA turbo pass: DG_SC_HOST without host soft rows");
    CK(cudaMemcpyAsync(c->soft, soft, (size_t)d->canvas * d->hidden * 4, cudaMemcpyHostToDevice, c->stream));
    c->have_soft = 1;
    *sc = DG_SC_KEPT;
  }
  if (*sc == DG_SC_KEPT && !c->have_soft) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA turbo pass: no soft embedding on the device");
  return DG_OK;
}

/* LM head without softcap on the n rows rows[] (host, indices into c->x):
 * gather, final norm, tied embedding -> c->logits [n, V]; copied to raw_out if not NULL. */
static dg_status turbo_head(dg_cuda_ctx *c, const int32_t *rows, int32_t n, float *raw_out) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  dg_cuda_turbo *t = c->tb;
  cudaStream_t s = c->stream;
  t->nraw = n;
  if (n <= 0) return DG_OK;
  CK(cudaMemcpyAsync(t->rows, rows, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_gather_rows(s, c->u, c->x, t->rows, n, d->hidden));
  CKK(c, k_rmsnorm(s, c->u, m->final_norm, NULL, c->a, n, d->hidden, d->eps));
  DG_TRY(wmatmul(c, c->a, d->hidden, n, &m->embed, c->logits, d->vocab));
  if (raw_out) {
    CK(cudaMemcpyAsync(raw_out, c->logits, (size_t)n * d->vocab * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_decode_rows(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc,
                                         const float *soft, const int32_t *rows, int32_t n, float *raw_out) {
  const dg_cuda_model *m = c->m;
  const int T = m->d.canvas;
  if (pos0 < 0 || pos0 > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA decode: canvas at position %d is past the context capacity %d", pos0,
                     c->cap);
  if (n < 0 || n > T) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA decode: %d head rows for a canvas of %d", n, T);
  CK(cudaSetDevice(m->device));
  DG_TRY(turbo_bufs(c, 0));
  DG_TRY(turbo_soft_in(c, &sc, soft));
  DG_TRY(decoder_layers(c, canvas, pos0, sc));
  return turbo_head(c, rows, n, raw_out);
}

extern "C" dg_status dg_cuda_compact(dg_cuda_ctx *c, const int32_t *tok, const int32_t *pos, int32_t n, int32_t pos0,
                                     dg_sc_source sc, const float *soft, const int32_t *head, int32_t nh, float *raw_out) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int C = d->canvas, H = d->hidden;
  cudaStream_t s = c->stream;
  if (pos0 < 0 || pos0 > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA compacted pass: canvas at position %d is past the context capacity %d",
                     pos0, c->cap);
  if (n < 1 || n > C || n > c->tmax || nh < 0 || nh > C)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA compacted pass: forward set %d / head rows %d outside [1, %d]", n, nh, C);
  CK(cudaSetDevice(m->device));
  DG_TRY(turbo_bufs(c, 0));
  dg_cuda_turbo *t = c->tb;
  DG_TRY(turbo_soft_in(c, &sc, soft));
  /* the forward set at absolute positions pos0 + pos[t]; its K/V land in those cache slots,
   * which are the canvas K/V buffer of spec 7.4 (slots of rows not forwarded keep their last K/V) */
  for (int32_t i = 0; i < n; i++) t->h_pos[i] = pos0 + pos[i];
  CK(cudaMemcpyAsync(t->pos, t->h_pos, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(c->ids, tok, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_embed(s, c->x, &m->embed, c->ids, n, H, d->embed_scale));
  if (sc == DG_SC_KEPT) { /* SC rows of the forward set's canvas positions (spec 4.8, 5) */
    CK(cudaMemcpyAsync(t->cpos, pos, (size_t)n * 4, cudaMemcpyHostToDevice, s));
    CKK(c, k_gather_rows(s, c->u, c->soft, t->cpos, n, H));
    CKK(c, k_rmsnorm(s, c->u, m->sc_pre_norm, NULL, c->a, n, H, d->eps));
    DG_TRY(geglu_mlp(c, c->a, n, &m->sc_gate_up, &m->sc_down, c->f1));
    CKK(c, k_add(s, c->x, c->f1, (size_t)n * H));
  }
  CKK(c, k_rmsnorm(s, c->x, NULL, c->x, NULL, n, H, d->eps));
  for (int li = 0; li < d->n_layers; li++) DG_TRY(layer_at(c, li, n, pos0, 0, t->pos));
  return turbo_head(c, head, nh, raw_out);
}

extern "C" dg_status dg_cuda_raw_rows(dg_cuda_ctx *c, int32_t n, float *raw_out) {
  if (!c->tb || n < 0 || n > c->tb->nraw)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA: %d raw logit rows asked, %d on the device", n, c->tb ? c->tb->nraw : 0);
  CK(cudaSetDevice(c->m->device));
  CK(cudaMemcpyAsync(raw_out, c->logits, (size_t)n * c->m->d.vocab * 4, cudaMemcpyDeviceToHost, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

extern "C" dg_status dg_cuda_topk(dg_cuda_ctx *c, int32_t n, int32_t K, float *val, int32_t *idx, int32_t *bad_row,
                                  int32_t *bad_col) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (!c->tb || n < 0 || n > c->tb->nraw)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA top-K: %d rows asked, %d raw logit rows on the device", n,
                     c->tb ? c->tb->nraw : 0);
  if (K < 1 || K > d->vocab) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA top-K: K = %d outside [1, %d]", K, d->vocab);
  CK(cudaSetDevice(c->m->device));
  DG_TRY(turbo_bufs(c, K));
  dg_cuda_turbo *t = c->tb;
  cudaStream_t s = c->stream;
  if (n == 0) return DG_OK;
  t->klast = K;
  *c->h_bad = INT32_MAX;
  CK(cudaMemcpyAsync(t->bad, c->h_bad, 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_topk_hier(s, c->logits, n, d->vocab, K, t->cv, t->ci, t->candv, t->candi, t->val, t->idx, t->bad));
  CK(cudaMemcpyAsync(c->h_bad, t->bad, 4, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(val, t->val, (size_t)n * K * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(idx, t->idx, (size_t)n * K * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  if (*c->h_bad != INT32_MAX) {
    int32_t r = *c->h_bad, col = -1;
    CK(cudaMemcpy(&col, t->bad + 1 + r, 4, cudaMemcpyDeviceToHost));
    *bad_row = r;
    *bad_col = col;
    return DG_ERR_NUMERIC;
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_turbo_sc(dg_cuda_ctx *c, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                                      const float *p) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  dg_cuda_turbo *t = c->tb;
  cudaStream_t s = c->stream;
  if (!t || n < 0 || n > t->nraw || n > d->canvas)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning: %d rows asked, %d raw logit rows on the device", n,
                     t ? t->nraw : 0);
  CK(cudaSetDevice(m->device));
  if (n == 0) return DG_OK;
  CK(cudaMemcpyAsync(t->rows, rows, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  if (mode == DG_TURBO_SC_EXACT) { /* exact: P of the full rows, soft = scale P . E, scattered to the canvas rows */
    CKK(c, k_turbo_sc_probs(s, c->logits, c->P, n, d->vocab, cap, T, d->act_dtype));
    const float alpha = d->embed_scale, beta = 0.0f;
    if (m->embed.bits) { /* quantized tied embedding: P . E with E dequantized in the kernel (as soft_from) */
      CKK(c, k_qsoft(s, c->P, n, &m->embed, alpha, c->f1));
    } else
    CKB(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->hidden, n, d->vocab, &alpha, m->embed.w, CUDA_R_16BF,
                     d->hidden, c->P, CUDA_R_16BF, d->vocab, &beta, c->f1, CUDA_R_32F, d->hidden, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
    CKK(c, k_scatter_rows(s, c->soft, c->f1, t->rows, n, d->hidden));
  } else if (mode == DG_TURBO_SC_TOPK) { /* top-K: the K probabilities of the host chain times the K rows of E */
    if (!t->klast) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning (topk) before dg_cuda_topk");
    if (m->embed.bits) /* k_turbo_sc_topk reads bf16 rows of E */
      return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "turbo_sc \"topk\" on CUDA needs a bf16 embedding; this model's is "
                                                 "quantized (%d bits): use turbo_sc \"exact\" or \"adaptive\"",
                       m->embed.bits);
    CK(cudaMemcpyAsync(t->p, p, (size_t)n * t->klast * 4, cudaMemcpyHostToDevice, s));
    CKK(c, k_turbo_sc_topk(s, t->p, t->idx, t->rows, (const bf16 *)m->embed.w, c->soft, n, t->klast, d->hidden, d->embed_scale));
  } else {
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning: unknown mode %d", (int)mode);
  }
  c->have_soft = 1;
  return DG_OK;
}

extern "C" dg_status dg_cuda_put_raw_rows(dg_cuda_ctx *c, int32_t n, const float *raw) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (n < 0 || n > d->canvas) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA: %d raw rows for a canvas of %d", n, d->canvas);
  CK(cudaSetDevice(c->m->device));
  DG_TRY(turbo_bufs(c, 0));
  CK(cudaMemcpyAsync(c->logits, raw, (size_t)n * d->vocab * 4, cudaMemcpyHostToDevice, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  c->tb->nraw = n;
  return DG_OK;
}

extern "C" dg_status dg_cuda_get_soft(dg_cuda_ctx *c, float *soft) {
  const dg_cuda_model_desc *d = &c->m->d;
  CK(cudaSetDevice(c->m->device));
  CK(cudaMemcpyAsync(soft, c->soft, (size_t)d->canvas * d->hidden * 4, cudaMemcpyDeviceToHost, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

/* ---- test entry points (backend.h) --------------------------------------------- */

/* Upload one matrix for a test (float or quantized) into al. */
static dg_status test_up(alloc_list *al, dg_cuda_w *w, const dg_weight *m) {
  DG_TRY(check_mat(m, "test matrix", -1));
  uint16_t *stage = NULL;
  if (!m->bits && m->dtype != DG_BF16 && !(stage = (uint16_t *)malloc(STAGE_ELEMS * 2)))
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  const dg_weight *p1[1] = {m};
  dg_status st = up_w(al, w, p1, 1, "test matrix", stage);
  free(stage);
  return st;
}

/* Device copy of n host bytes. */
static dg_status test_in(alloc_list *al, void **dst, const void *src, size_t n, const char *what) {
  DG_TRY(dalloc(al, dst, n, what));
  CK(cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice));
  return DG_OK;
}

/* A test's start: its device, then matrix m uploaded as W into al. */
static dg_status test_begin(int device, alloc_list *al, dg_cuda_w *W, const dg_weight *m) {
  CK(cudaSetDevice(device));
  return test_up(al, W, m);
}

/* Wait for a test's kernels, then copy n result bytes from the device to the host. */
static dg_status test_out(void *dst, const void *src, size_t n) {
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  return DG_OK;
}

/* The grouping buffers of b for TK = T * K routed pairs over E experts (k_group's outputs). */
static dg_status test_group_bufs(alloc_list *al, dg_cuda_moe_buf *b, size_t TK, int E) {
  DG_TRY(dalloc(al, (void **)&b->count, (size_t)E * 4, "count"));
  DG_TRY(dalloc(al, (void **)&b->start, (size_t)(E + 1) * 4, "start"));
  DG_TRY(dalloc(al, (void **)&b->pairs, TK * 4, "pairs"));
  DG_TRY(dalloc(al, (void **)&b->slot_row, TK * 4, "slot_row"));
  DG_TRY(dalloc(al, (void **)&b->tiles, (TK + E) * 2 * 4, "tiles"));
  DG_TRY(dalloc(al, (void **)&b->order, (size_t)E * 4, "order"));
  return dalloc(al, (void **)&b->n_tiles, 4, "n_tiles");
}

#define TT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define TC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    goto done; } } while (0)

extern "C" dg_status dg_cuda_test_matmul(int device, const dg_weight *w, int64_t row0, int N, const uint16_t *x,
                                         int ldx, int T, float *y, int ldy) {
  if (!w->bits || row0 < 0 || row0 + N > w->rows || ldx < w->cols || ldy < N || T <= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_matmul: needs a quantized matrix and row0 + N <= rows, "
                                         "ldx >= cols, ldy >= N, T > 0");
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dx = NULL, *dy = NULL;
  dg_status st = test_begin(device, &al, &W, w);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dx, x, (size_t)T * ldx * 2, "x"));
  TT_(test_in(&al, &dy, y, (size_t)T * ldy * 4, "y"));
  TC_(k_qmatmul(0, (const bf16 *)dx, ldx, T, &W, row0, N, (float *)dy, ldy));
  TT_(test_out(y, dy, (size_t)T * ldy * 4));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_embed(int device, const dg_weight *e, const int32_t *ids, int T, float scale,
                                        float *x) {
  for (int t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= e->rows) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_embed: id %d", ids[t]);
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dids = NULL, *dx = NULL;
  dg_status st = test_begin(device, &al, &W, e);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dids, ids, (size_t)T * 4, "ids"));
  TT_(dalloc(&al, &dx, (size_t)T * e->cols * 4, "x"));
  TC_(k_embed(0, (float *)dx, &W, (const int32_t *)dids, T, (int)e->cols, scale));
  TT_(test_out(x, dx, (size_t)T * e->cols * 4));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_soft(int device, const dg_weight *e, const uint16_t *P, int C, float alpha,
                                       float *soft) {
  if (!e->bits || C <= 0) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_soft: needs a quantized matrix, C > 0");
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dp = NULL, *ds = NULL;
  dg_status st = test_begin(device, &al, &W, e);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dp, P, (size_t)C * e->rows * 2, "P"));
  TT_(dalloc(&al, &ds, (size_t)C * e->cols * 4, "soft"));
  TC_(k_qsoft(0, (const bf16 *)dp, C, &W, alpha, (float *)ds));
  TT_(test_out(soft, ds, (size_t)C * e->cols * 4));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_experts(int device, const dg_weight *gate_up, const dg_weight *down,
                                          const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K,
                                          uint16_t *h, float *y) {
  if (gate_up->rows != (int64_t)E * 2 * IE || gate_up->cols != H || down->rows != (int64_t)E * H || down->cols != IE ||
      T <= 0 || K <= 0 || K > E)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts: shapes [%lld, %lld] and [%lld, %lld] do not match "
                                         "E %d, H %d, IE %d", (long long)gate_up->rows, (long long)gate_up->cols,
                     (long long)down->rows, (long long)down->cols, E, H, IE);
  for (int i = 0; i < T * K; i++)
    if (idx[i] < 0 || idx[i] >= E) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts: expert id %d", idx[i]);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  dg_cuda_layer l;
  memset(&l, 0, sizeof l);
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  void *dxe = NULL;
  const size_t TK = (size_t)T * K;
  int32_t *slot_row = (int32_t *)malloc(TK * 4);
  uint16_t *hd = (uint16_t *)malloc(TK * IE * 2);
  float *yd = (float *)malloc(TK * H * 4);
  if (!slot_row || !hd || !yd) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TT_(check_mat(gate_up, "test gate_up", -1));
  TT_(check_mat(down, "test down", -1));
  TT_(up_experts(&al, &l.experts_gate_up, gate_up, 1, E, "test gate_up", NULL));
  TT_(up_experts(&al, &l.experts_down, down, 0, E, "test down", NULL));
  TT_(test_in(&al, &dxe, xe, (size_t)T * H * 2, "xe"));
  TT_(test_in(&al, (void **)&b.topk_idx, idx, TK * 4, "topk_idx"));
  TT_(test_group_bufs(&al, &b, TK, E));
  TT_(dalloc(&al, (void **)&b.h, TK * IE * 2, "h"));
  TT_(dalloc(&al, (void **)&b.y, TK * H * 4, "y"));
  TT_(dalloc(&al, (void **)&b.xs, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) / 32 * 4, "xs"));
  TT_(dalloc(&al, (void **)&b.xp, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) * 2, "xp"));
  TC_(k_group(0, &b, T, E, K));
  TC_(dg_cuda_experts(0, &l, (const bf16 *)dxe, &b, T, H, IE, E, K));
  TT_(test_out(slot_row, b.slot_row, TK * 4));
  TC_(cudaMemcpy(hd, b.h, TK * IE * 2, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(yd, b.y, TK * H * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < TK; i++) { /* grouped order -> (token, slot) order */
    memcpy(h + i * IE, hd + (size_t)slot_row[i] * IE, (size_t)IE * 2);
    memcpy(y + i * H, yd + (size_t)slot_row[i] * H, (size_t)H * 4);
  }
done:
  free(slot_row);
  free(hd);
  free(yd);
  dfree_all(&al);
  return st;
}
extern "C" dg_status dg_cuda_test_route(int device, float *rlog, const float *pes, int T, int E, int K, int32_t *idx,
                                        float *w, int32_t *start, int32_t *pairs, int32_t *order) {
  if (T <= 0 || E <= 0 || E > 256 || K <= 0 || K > E || K > 32)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_route: T %d, E %d (1..256), K %d (1..min(E, 32))", T, E, K);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *drl = NULL, *dpes = NULL;
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  const size_t TK = (size_t)T * K;
  TT_(test_in(&al, &drl, rlog, (size_t)T * E * 4, "router logits"));
  TT_(test_in(&al, &dpes, pes, (size_t)E * 4, "per-expert scales"));
  TT_(dalloc(&al, (void **)&b.topk_idx, TK * 4, "topk_idx"));
  TT_(dalloc(&al, (void **)&b.topk_w, TK * 4, "topk_w"));
  TT_(test_group_bufs(&al, &b, TK, E));
  TC_(k_route(0, (float *)drl, (const float *)dpes, &b, T, E, K));
  TT_(test_out(rlog, drl, (size_t)T * E * 4));
  TC_(cudaMemcpy(idx, b.topk_idx, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(w, b.topk_w, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(start, b.start, (size_t)(E + 1) * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(pairs, b.pairs, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(order, b.order, (size_t)E * 4, cudaMemcpyDeviceToHost));
done:
  dfree_all(&al);
  return st;
}
extern "C" dg_status dg_cuda_test_attention(int device, int version, const float *q, const uint16_t *kc,
                                            const uint16_t *vc, int S, int nq, int NH, int NKV, int D, int32_t pos0,
                                            int32_t kv_hi, int causal, int is_full, int window, uint16_t *out) {
  if (nq <= 0 || NH <= 0 || NKV <= 0 || NH % NKV || D <= 0 || D % 8 || S <= 0 || pos0 < 0 || window <= 0 ||
      version < 0 || version > 5 || (causal ? pos0 + nq > S : kv_hi > S || kv_hi <= pos0))
    return dg_seterr(DG_ERR_INVALID_ARG,
                     "dg_cuda_test_attention: version %d, nq %d, NH %d, NKV %d, D %d, S %d, pos0 %d, kv_hi %d, "
                     "causal %d, window %d",
                     version, nq, NH, NKV, D, S, pos0, kv_hi, causal, window);
  if (version >= 2 && !k_attention_flash_ok(D, NH, NKV))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_attention: the tensor-core kernel takes D 64/128/256/512, not %d",
                     D);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  dg_att_ws ws = {NULL, 8 * (size_t)nq * NH * ((size_t)D + 2)};
  const size_t kvn = (size_t)NKV * S * D * 2, on = (size_t)nq * NH * D;
  TT_(test_in(&al, &dq, q, on * 4, "q"));
  TT_(test_in(&al, &dk, kc, kvn, "k cache"));
  TT_(test_in(&al, &dv, vc, kvn, "v cache"));
  TT_(dalloc(&al, &dout, on * 2, "out"));
  TT_(dalloc(&al, (void **)&ws.part, ws.n * 4, "key-split partials"));
  TC_(k_attention_any(0, &ws, version, (const float *)dq, (const bf16 *)dk, (const bf16 *)dv, (bf16 *)dout, S, nq, NH,
                      NKV, D, pos0, kv_hi, causal, is_full, window));
  TT_(test_out(out, dout, on * 2));
done:
  dfree_all(&al);
  return st;
}
#undef TT_
#undef TC_
