/* context.cu: the CUDA backend's contexts (dg_cuda_ctx_new: KV cache, work
 * buffers, a stream and a cuBLAS handle; by default (DGEMMA_BRANCH) a second of
 * each for the dense MLP, passes.cu) and the stage timing of
 * `dgemma bench --profile` (dg_cuda_profile; interface: backend.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

/* ---- context ---------------------------------------------------------------- */

/* A context and what it owns: one device block (every device buffer, carved by ctx_layout) and one pinned host
 * block (h_stats, h_bad); the per-layer cache pointers kc[L], vc[L] follow the struct in its host allocation. */
struct ctx_priv {
  dg_cuda_ctx c;
  void *dev;         /* the device block, dev_bytes */
  size_t dev_bytes;
  void *host;        /* the pinned host block */
  int32_t rows;      /* what the context was made for (ctx_carves lays it out again) */
  int full_window;
  size_t side_ws;     /* c->side.ws's bytes (side_ws_bytes when the context was made; 0 without the branches) */
  size_t rows_off;    /* the union's first byte in the block: both views' work buffers begin there (ctx_layout) */
  size_t enc_end;     /* the encoder's view's end in the block (ctx_layout; where enc_rows > tmax) */
};

/* DGEMMA_SC_INPLACE=0: the self-conditioning probabilities P [C, V] bf16 in a buffer of their own (as before
 * session 29); unset or 1: in place (common.cuh's sc_group; read once; backend/switches.c). */
static const int sc_inplace = dg_sw_get(DG_SW_SC_INPLACE) != 0;
/* The launch group of P written in place for a canvas of C rows (0: not in place): C / 8 rows, at least 1, so that
 * the head buffer is an eighth of P (16 MiB at the 26B's C 256, V 262,144); C < 2 has no room for it. */
static int sc_group_for(int32_t C) { return !sc_inplace || C < 2 ? 0 : C >= 8 ? C / 8 : 1; }

/* Bytes of the cuBLAS workspace of a context on GPU `device`: cuBLAS's default pool size, 32 MiB from compute
 * capability 9.0 (Hopper) on, 4 MiB before (cuBLAS documentation, cublasSetWorkspace). */
static size_t blas_ws_bytes(int device) {
  int major = 9;
#ifndef DG_CUDA_EMU
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    major = 9;
  }
#else
  (void)device;
#endif
  return major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
}

/* Bytes of the concurrent branches' second cuBLAS workspace (DGEMMA_BRANCH): DGEMMA_BRANCH_WS_KIB=N (1..32768,
 * read once) sets N KiB; unset, SIDE_WS_DEFAULT (4 MiB) unless the context's products are pinned
 * (DGEMMA_GEMM_PIN=1) or batch-invariant (stack_dense_now() 2, DGEMMA_STACK_DENSE=inv), which run on the side's
 * handle with the whole blas_ws_bytes (their cublasLt algorithms were chosen for it), so they get blas_ws_bytes.
 * Why 4 MiB: the H100 call of session 28 ran test_branch with DGEMMA_BRANCH_WS_KIB=4096 and the dense MLP's
 * products on the side handle gave the one-stream order's words (the same algorithms as with 32 MiB at the 26B's
 * and the synth models' shapes; docs/cuda.md, session 28, helpers mem12 and m3b12). 28 MiB less per context.
 * DGEMMA_BRANCH_WS_KIB=32768 gives the earlier default (the A/B of the speed). */
#define SIDE_WS_DEFAULT ((size_t)4 << 20)
static long side_ws_kib_env(void) {
  static const long kib = dg_sw_get(DG_SW_BRANCH_WS_KIB); /* 0 when unset (backend/switches.c) */
  return kib;
}
/* DGEMMA_BRANCH_HANDLE=one (read once): the dense branch's products on c's own cuBLAS handle, moved onto the side's
 * stream and workspace for the branch and back (passes.cu, ffn_branches), instead of a second handle: the memory
 * of one cublasCreate less per context (its share: the DGEMMA_CUDA_MEMLOG lines of ctx_stream and ctx_side). Off by
 * default until a GPU run of test_branch shows the one-stream order's words with it (docs/cuda.md, session 29). */
static const int side_one_handle = dg_sw_get(DG_SW_BRANCH_HANDLE) == 1;

/* The bytes of c's cuBLAS workspace and of the side's (passes.cu's one-handle branch sets them on c->blas). */
size_t ctx_blas_ws_bytes(const dg_cuda_ctx *c) { return blas_ws_bytes(c->m->device); }
size_t ctx_side_ws_bytes(const dg_cuda_ctx *c);

static size_t side_ws_bytes(int device) {
  const long kib = side_ws_kib_env();
  if (kib) return (size_t)kib << 10;
  if (dg_sw_get(DG_SW_GEMM_PIN) == 1 || stack_dense_now() == 2) return blas_ws_bytes(device);
  const size_t full = blas_ws_bytes(device);
  return SIDE_WS_DEFAULT < full ? SIDE_WS_DEFAULT : full;
}

size_t ctx_side_ws_bytes(const dg_cuda_ctx *c) { return ((const ctx_priv *)c)->side_ws; }

void note_written(dg_cuda_ctx *c, int32_t pos0, int32_t end) {
  if (pos0 == 0) c->hi = c->lo = 0;
  if (end > c->hi) c->hi = end;
}

extern "C" dg_status dg_cuda_truncate_check(const dg_cuda_ctx *c, int32_t len) {
  const int32_t W = c->m->d.window, need = len - (W - 1) > 0 ? len - (W - 1) : 0;
  if (len == 0 || ((c->S_ring >= c->S || c->hi <= need + c->S_ring) && need >= c->lo)) return DG_OK;
  if (need < c->lo)
    return dg_seterr(DG_ERR_CONTEXT_FULL,
                     "CUDA context: position %d needs the keys of positions %d..%d in the sliding-window layers, but "
                     "this context's K/V there begin at position %d (dg_context_copy_prefix brought no older ones)",
                     len, need, len - 1, c->lo);
  return dg_seterr(DG_ERR_CONTEXT_FULL,
                   "CUDA context: rolling back to position %d needs the keys of positions %d..%d in the sliding-window "
                   "layers, but their ring cache of %d slots has since held positions up to %d; a context made with "
                   "dg_context_params.full_window_cache = 1 keeps every position",
                   len, need, len - 1, c->S_ring, c->hi - 1);
}

/* ---- copying a KV cache (dg_context_copy_prefix) ------------------------------ */

/* The first position whose sliding-layer K/V c still holds: its copied start (lo), or what its ring has not
 * overwritten since (a position p sits in slot p % S_ring; positions up to hi - 1 have been written). */
static int32_t ring_first(const dg_cuda_ctx *c) {
  const int32_t kept = c->S_ring >= c->S ? 0 : c->hi - c->S_ring;
  return kept > c->lo ? kept : c->lo;
}

/* One layer's K and V, [NKV, S, D] bf16 viewed as pairs (D even, checked at upload): for every head h and position p
 * in [lo, n), dst's slot p % Sd gets src's slot p % Ss (a full layer: S slots > n, so slot p on both sides). */
__global__ void kv_copy_kernel(uint32_t *dk, uint32_t *dv, const uint32_t *sk, const uint32_t *sv, int NKV, int D2,
                               int Sd, int Ss, int lo, int n) {
  DG_PDL_ENTRY();
  const size_t np = (size_t)(n - lo), tot = (size_t)NKV * np * (size_t)D2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x) {
    const size_t d = i % (size_t)D2, r = i / (size_t)D2, h = r / np;
    const int p = lo + (int)(r % np);
    const size_t so = (h * (size_t)Ss + (size_t)(p % Ss)) * D2 + d, dof = (h * (size_t)Sd + (size_t)(p % Sd)) * D2 + d;
    dk[dof] = sk[so];
    dv[dof] = sv[so];
  }
}

extern "C" dg_status dg_cuda_ctx_copy(dg_cuda_ctx *dst, const dg_cuda_ctx *src, int32_t n) {
  const dg_cuda_model *m = dst->m;
  CK(cudaSetDevice(m->device));
  /* src's passes have all synchronised before returning; this only orders a copy after any work still queued */
  CK(cudaStreamSynchronize(src->stream));
  /* the sliding layers: the positions src still holds, at most the last S_ring of dst's ring */
  int32_t lo_s = ring_first(src);
  if (dst->S_ring < dst->S && n - dst->S_ring > lo_s) lo_s = n - dst->S_ring;
  if (lo_s > n) lo_s = n; /* (the caller's truncate_check makes lo_s <= n - (window - 1)) */
  for (int i = 0; i < m->d.n_layers; i++) {
    const dg_cuda_layer *l = &m->layers[i];
    const int lo = l->is_full ? 0 : lo_s;
    if (n - lo <= 0) continue;
    const int Sd = l->is_full ? dst->S : dst->S_ring, Ss = l->is_full ? src->S : src->S_ring, D2 = l->head_dim / 2;
    const size_t tot = (size_t)l->n_kv * (size_t)(n - lo) * (size_t)D2, nb = (tot + 255) / 256;
    DG_LAUNCH(kv_copy_kernel, (unsigned)(nb < 65535 ? nb : 65535), 256, 0, dst->stream)(
        (uint32_t *)dst->kc[i], (uint32_t *)dst->vc[i], (const uint32_t *)src->kc[i], (const uint32_t *)src->vc[i],
        l->n_kv, D2, Sd, Ss, lo, (int)n);
    CK(cudaGetLastError());
  }
  CK(cudaStreamSynchronize(dst->stream));
  /* dst holds positions [0, n) on the full layers and [lo_s, n) on the sliding ones (dg_cuda_truncate_check) */
  dst->hi = n;
  dst->lo = lo_s;
  return DG_OK;
}

/* The shape of a context: its decoder pass rows T (max(canvas, rows, the chunk up to DG_RING_CHUNK)), its encoder
 * pass rows Te (max(T, encoder chunk)), the rows of one sliding-layer attention call Tr (max(canvas, the chunk up to
 * DG_RING_CHUNK)), cache length S (cap + canvas) and ring length of the sliding layers (the buffers themselves:
 * ctx_layout). */
typedef struct ctx_dims {
  size_t C, H, V, I, IE, E, K, NH, T, Te, Tr, S, S_ring, TK, W;
} ctx_dims;

static ctx_dims ctx_dims_of(const dg_cuda_model *m, int32_t cap, int32_t rows, int full_window, int32_t enc_chunk) {
  const dg_cuda_model_desc *d = &m->d;
  ctx_dims z;
  z.C = d->canvas; z.H = d->hidden; z.V = d->vocab; z.I = d->inter; z.IE = d->moe_inter; z.E = d->n_experts;
  z.K = d->top_k; z.NH = d->n_heads;
  const size_t C = z.C, H = z.H, I = z.I, K = z.K;
  /* a chunk beyond DG_RING_CHUNK rows grows neither the decoder's rows nor the rings: its encoder passes run in a
   * view of their own (ctx_rows_view) over the decoder-only buffers, and its sliding layers' K/V and attention in
   * calls of Tr rows (passes.cu layer_segs); up to DG_RING_CHUNK every size is session 28's */
  const size_t ch = (size_t)enc_chunk, cr = ch < DG_RING_CHUNK ? ch : DG_RING_CHUNK, Tr = C > cr ? C : cr,
               T = rows > 0 && (size_t)rows > Tr ? (size_t)rows : Tr, Te = T > ch ? T : ch, S = (size_t)cap + C;
  /* sliding layers: a ring of slots (position p in slot p % S_ring) long enough for the keys of one attention
   * call, the window before a canvas or Tr rows of an encoder chunk and those rows themselves (attention.cu), in
   * whole tiles of 64 */
  const size_t ring = d->window >= 1 && !full_window ? ((size_t)d->window - 1 + Tr + 63) / 64 * 64 : S,
               S_ring = ring < S ? ring : S;
  z.T = T; z.Te = Te; z.Tr = Tr; z.S = S; z.S_ring = S_ring; z.TK = T * K; z.W = H > 2 * I ? H : 2 * I;
  return z;
}

/* The work buffers of passes of T rows (a view: ctx_rows_view points them at the decoder's T or the encoder's Te),
 * from cv's offset on. */
static void ctx_layout_rows(dg_cuda_ctx *c, const ctx_dims *z, size_t T, carver *cv) {
  const dg_cuda_model *m = c->m;
  const size_t H = z->H, I = z->I, IE = z->IE, E = z->E, NH = z->NH, TK = T * z->K, W = z->W,
               XQ = TK * IE > T * H ? TK * IE : T * H /* the quantized products' inputs */;
#define B_(ptr, bytes) carve_to(cv, (ptr), (bytes))
  B_(c->ids, T * 4);
  B_(c->x, T * H * 4);
  B_(c->f1, T * W * 4);
  B_(c->dense, T * H * 4);
  B_(c->a, T * H * 2);
  B_(c->xe, T * H * 2);
  B_(c->u, T * H * 4);
  B_(c->qkv, T * (size_t)m->qkvmax * 4);
  B_(c->q, T * NH * (size_t)m->dmax * 4);
  B_(c->att, T * NH * (size_t)m->dmax * 2);
  B_(c->gu, T * 2 * I * 4);
  B_(c->h, T * (I > IE ? I : IE) * 2);
  B_(c->rlog, T * E * 4);
  B_(c->rws, DG_ROUTER_MAX_SPLITS * T * E * 4);
  B_(c->moe.topk_idx, TK * 4);
  B_(c->moe.topk_w, TK * 4);
  B_(c->moe.pairs, TK * 4);
  B_(c->moe.slot_row, TK * 4);
  B_(c->moe.tiles, (TK + E) * 2 * 4);
  B_(c->moe.h, TK * IE * 2);
  B_(c->moe.y, TK * H * 4);
  B_(c->moe.xs, XQ / 32 * 4);
  B_(c->moe.xp, XQ * 2);
  B_(c->moe.hs, TK * IE / 32 * 4); /* DGEMMA_DN_FUSE's group sums of h (groups of >= 32) */
#undef B_
}

/* The device buffers of c laid out by cv (carve): the KV cache first (its bytes into *kv_bytes, the block's
 * [0, *kv_bytes): one memset zeroes it), then the buffers every pass keeps or that outlive a pass of the other kind
 * (attention splits, the router's and experts' counters, P where not in place, soft, the statistics, the cuBLAS
 * workspaces), then the union (*rows_off on): the decoder's view, the work buffers of z.T rows, P's head and the
 * logits, and over the same bytes the encoder's view, the work buffers of z.Te rows (ctx_rows_view), the block
 * running on to the end of the longer of the two (the encoder's only where its rows do not fit: a small model's). At
 * the 26B's C 256, V 262,144 the logits alone (256 MiB) hold the 768 rows of a chunk of 1,024 beyond the canvas's
 * 256 (214 MiB; dev/ctx_bytes_26b.py). */
static void ctx_layout(dg_cuda_ctx *c, const ctx_dims *z, carver *cv, size_t *kv_bytes, size_t *rows_off) {
  const dg_cuda_model *m = c->m;
  const size_t C = z->C, H = z->H, V = z->V, E = z->E, NH = z->NH;
#define B_(ptr, bytes) carve_to(cv, (ptr), (bytes))
  for (int i = 0; i < m->d.n_layers; i++) {
    size_t n = (size_t)m->layers[i].n_kv * (m->layers[i].is_full ? z->S : z->S_ring) * (size_t)m->layers[i].head_dim * 2;
    B_(c->kc[i], n);
    B_(c->vc[i], n);
  }
  *kv_bytes = cv->off;
  /* up to 8 key splits of a canvas's attention (attention.cu lowers the count for more rows) */
  c->att_ws.n = 8 * C * NH * ((size_t)m->dmax + 2);
  B_(c->att_ws.part, c->att_ws.n * 4);
  B_(c->moe.count, E * 4);
  B_(c->moe.start, (E + 1) * 4);
  B_(c->moe.n_tiles, 4);
  B_(c->moe.order, E * 4);
  B_(c->moe.wl_count, 2 * E * 4); /* DGEMMA_WL=1's split counts (qmoe_wl.cu) */
  B_(c->moe.done, 4);
  int32_t *fg = NULL;
  B_(fg, (3 + E) * 4); /* DGEMMA_EXPERTS_FG's counters (qmoe_fg.cuh; zeroed below): dg_moe_fg, at done + fg_off */
  c->moe.fg_off = cv->base ? (int)(fg - c->moe.done) : 0; /* (the sizing pass has no pointers) */
  B_(c->moe.gsc, DG_ROUTE_GSC_INTS * 4);
  if (!c->sc_group) B_(c->P, C * V * 2);
  B_(c->soft, C * H * 4);
  B_(c->uni, C * 4);
  B_(c->stats, C * sizeof(dg_cuda_pos_stats));
  B_(c->bad, 4);
  B_(c->vws, k_vocab_ws_bytes((int)C, (int)V));
  B_(c->blas_ws, blas_ws_bytes(m->device));
  if (c->side.on) B_(c->side.ws, ((ctx_priv *)c)->side_ws); /* the concurrent branches' second cuBLAS handle's (DGEMMA_BRANCH) */
  *rows_off = cv->off;
  if (z->Te > z->T) { /* the encoder's view, sized only (ctx_rows_view points the buffers into it) */
    carver ce = {};
    ce.off = cv->off;
    ctx_layout_rows(c, z, z->Te, &ce);
    ((ctx_priv *)c)->enc_end = ce.off;
  }
  ctx_layout_rows(c, z, z->T, cv);
  if (c->sc_group) { /* P's first sc_group rows end where the logits begin (common.cuh): P runs on into them */
    const size_t head = (size_t)c->sc_group * V * 2;
    unsigned char *hb = NULL;
    B_(hb, (head + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN);
    B_(c->logits, C * V * 4);
    c->P = (bf16 *)((unsigned char *)c->logits - head);
    (void)hb;
  } else {
    B_(c->logits, C * V * 4);
  }
  if (z->Te > z->T && ((ctx_priv *)c)->enc_end > cv->off) cv->off = ((ctx_priv *)c)->enc_end;
#undef B_
}

/* c's work buffers pointed at the encoder's view (enc 1: rows for c->enc_rows, over P's head and the logits; the
 * logits are dead from then on, lg_dead 2, until a pass writes them again) or back at the decoder's (enc 0). Where
 * the two views are one (enc_rows == tmax) it does nothing. Host pointers only: no device work. */
void ctx_rows_view(dg_cuda_ctx *c, int enc) {
  ctx_priv *pv = (ctx_priv *)c;
  if (c->enc_rows <= c->tmax || !pv->dev) return;
  const ctx_dims z = ctx_dims_of(c->m, c->cap, pv->rows, pv->full_window, c->enc_chunk);
  carver cv = {};
  cv.base = (unsigned char *)pv->dev;
  cv.off = pv->rows_off;
  ctx_layout_rows(c, &z, enc ? z.Te : z.T, &cv);
  c->norm_next = -1; /* no normed rows carried from one view into the other */
  if (enc) c->lg_dead = 2;
}

/* c's device block (one cudaMalloc, laid out by ctx_layout; the KV cache and the router's block counters zeroed)
 * and pinned host block (one cudaMallocHost: h_stats, h_bad); c->n_allocs counts them. Refuses a block that does
 * not fit in the free device memory with half of RESERVE to spare. */
static dg_status ctx_buffers(ctx_priv *pv, const ctx_dims *z) {
  dg_cuda_ctx *c = &pv->c;
  const dg_cuda_model *m = c->m;
  carver sz = {};
  size_t kv = 0, fr = 0, tot = 0, ro = 0;
  ctx_layout(c, z, &sz, &kv, &ro);
  DG_TRY(mem_info(&fr, &tot));
  if (sz.off + (RESERVE / 2) > fr)
    return dg_seterr(DG_ERR_OUT_OF_MEMORY,
                     "a context of %d positions needs %zu bytes (%.2f GiB) of device memory (KV cache %zu, work "
                     "buffers %zu) plus a %.2f GiB reserve; GPU %d has %zu bytes (%.2f GiB) free of %.2f GiB",
                     c->cap, sz.off, sz.off / GiB, kv, sz.off - kv, RESERVE / 2 / GiB, m->device, fr, fr / GiB,
                     tot / GiB);
  cudaError_t e = cudaMalloc(&pv->dev, sz.off);
  if (e != cudaSuccess) {
    pv->dev = NULL;
    return dg_seterr(e == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND,
                     "cudaMalloc(%zu bytes) for a context failed: %s", sz.off, cudaGetErrorString(e));
  }
  c->n_allocs[0]++;
  pv->dev_bytes = sz.off;
  carver cv = {};
  cv.base = (unsigned char *)pv->dev;
  ctx_layout(c, z, &cv, &kv, &pv->rows_off);
  if (cudaMemset(pv->dev, 0, kv) != cudaSuccess || cudaMemset(c->moe.done, 0, 4) != cudaSuccess ||
      cudaMemset(c->moe.gsc, 0, DG_ROUTE_GSC_INTS * 4) != cudaSuccess ||
      cudaMemset(dg_moe_fg(&c->moe), 0, (3 + (size_t)z->E) * 4) != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "cudaMemset of the KV cache or the router's or experts' block counters failed");
  const size_t hs = (z->C * sizeof(dg_cuda_pos_stats) + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN;
  if (cudaMallocHost(&pv->host, hs + 4) != cudaSuccess) {
    pv->host = NULL;
    return dg_seterr(DG_ERR_BACKEND, "cudaMallocHost of %zu bytes failed", hs + 4);
  }
  c->n_allocs[1]++;
  c->h_stats = (dg_cuda_pos_stats *)pv->host;
  c->h_bad = (int32_t *)((unsigned char *)pv->host + hs);
  return DG_OK;
}

int ctx_carves(dg_cuda_ctx *c, void **p, size_t *bytes, int cap, void **block, size_t *block_bytes) {
  ctx_priv *pv = (ctx_priv *)c;
  const ctx_dims z = ctx_dims_of(c->m, c->cap, pv->rows, pv->full_window, c->enc_chunk);
  carver cv = {};
  cv.base = (unsigned char *)pv->dev;
  cv.rec_p = p;
  cv.rec_b = bytes;
  cv.rec_cap = cap;
  size_t kv, ro;
  ctx_layout(c, &z, &cv, &kv, &ro);
  *block = pv->dev;
  *block_bytes = pv->dev_bytes;
  return cv.n;
}

/* ctx_carves for the encoder's view of the work buffers (its rows' buffers only, laid out from the union's first
 * byte; 0 buffers where the two views are one). The pointers stay the decoder's. */
int ctx_carves_enc(dg_cuda_ctx *c, void **p, size_t *bytes, int cap) {
  ctx_priv *pv = (ctx_priv *)c;
  if (c->enc_rows <= c->tmax) return 0;
  const ctx_dims z = ctx_dims_of(c->m, c->cap, pv->rows, pv->full_window, c->enc_chunk);
  dg_cuda_ctx e = *c; /* a copy's pointers take the view: c's stay */
  carver cv = {};
  cv.base = (unsigned char *)pv->dev;
  cv.off = pv->rows_off;
  cv.rec_p = p;
  cv.rec_b = bytes;
  cv.rec_cap = cap;
  ctx_layout_rows(&e, &z, z.Te, &cv);
  return cv.n;
}

/* The concurrent branches (c->side.on, DGEMMA_BRANCH): the second stream, its cuBLAS handle (workspace c->side.ws, set up as c->blas is)
 * and the fork and join events of passes.cu's layer_segs. */
static dg_status ctx_side(dg_cuda_ctx *c) {
  auto *sd = &c->side;
  if (((ctx_priv *)c)->side_ws < blas_ws_bytes(c->m->device) && (c->pins || c->inv))
    return dg_seterr(DG_ERR_INVALID_ARG, "DGEMMA_BRANCH_WS_KIB: the pinned (DGEMMA_GEMM_PIN) or batch-invariant "
                                         "(DGEMMA_STACK_DENSE=inv) products assume the whole workspace; unset one");
  cudaError_t e = cudaStreamCreateWithFlags(&sd->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sd->fork, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sd->join, cudaEventDisableTiming);
  if (e != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "the concurrent branches' second stream or its events (DGEMMA_BRANCH=0 runs without them): %s", cudaGetErrorString(e));
  mem_log("context: side: after its stream and two events");
  if (side_one_handle) { /* DGEMMA_BRANCH_HANDLE=one: c->blas serves both streams (sd->blas NULL) */
    sd->blas = NULL;
    return DG_OK;
  }
  cublasStatus_t bs = cublasCreate(&sd->blas);
  if (bs != CUBLAS_STATUS_SUCCESS) sd->blas = NULL;
  mem_log("context: side: after its cublasCreate");
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(sd->blas, sd->stream);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(sd->blas, CUBLAS_DEFAULT_MATH);
#ifndef DG_CUDA_EMU
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(sd->blas, sd->ws, ((ctx_priv *)c)->side_ws);
#endif
  mem_log("context: side: after cublasSetStream, SetMathMode, SetWorkspace");
  if (bs != CUBLAS_STATUS_SUCCESS)
    return dg_seterr(DG_ERR_BACKEND, "the concurrent branches' second cuBLAS handle (DGEMMA_BRANCH=0 runs without it): %s", cublasGetStatusString(bs));
  return DG_OK;
}

/* c->segs's streams, events and block released (after their work: the caller synchronised or nothing was issued);
 * want kept. */
static void seg_free(dg_cuda_ctx *c) {
  auto *sg = &c->segs;
  for (int k = 1; k < DG_SEG_STREAMS_MAX; k++) {
    if (sg->stream[k]) {
      cudaStreamSynchronize(sg->stream[k]); /* idle unless a pass failed between a fork and its join */
      cudaStreamDestroy(sg->stream[k]);
    }
    if (sg->join[k]) cudaEventDestroy(sg->join[k]);
    sg->stream[k] = NULL;
    sg->join[k] = NULL;
    sg->ws[k] = NULL;
  }
  if (sg->fork) cudaEventDestroy(sg->fork);
  sg->fork = NULL;
  if (sg->blk) cudaFree(sg->blk);
  sg->blk = NULL;
  sg->rows = NULL;
  sg->n = 0;
}

dg_status seg_ready(dg_cuda_ctx *c) {
  auto *sg = &c->segs;
  if (sg->want <= 1 || sg->n > 1) return DG_OK;
  const int n = sg->want;
  const size_t ws = blas_ws_bytes(c->m->device), rows_at = (size_t)(n - 1) * ws;
  dg_status st = DG_OK;
  cudaError_t e = cudaEventCreateWithFlags(&sg->fork, cudaEventDisableTiming);
  for (int k = 1; k < n && e == cudaSuccess; k++) {
    e = cudaStreamCreateWithFlags(&sg->stream[k], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&sg->join[k], cudaEventDisableTiming);
  }
  if (e != cudaSuccess)
    st = dg_seterr(DG_ERR_BACKEND, "the per-canvas streams or their events (DGEMMA_SEG_STREAMS=%d; unset runs without "
                   "them): %s", n, cudaGetErrorString(e));
  if (st == DG_OK) {
    e = cudaMalloc(&sg->blk, rows_at + (size_t)c->tmax * 4);
    if (e != cudaSuccess) {
      sg->blk = NULL;
      (void)cudaGetLastError();
      st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "the per-canvas streams' cuBLAS workspaces and LM-head rows "
                     "(DGEMMA_SEG_STREAMS=%d: %zu bytes; unset runs without them): %s", n,
                     rows_at + (size_t)c->tmax * 4, cudaGetErrorString(e));
    }
  }
  if (st != DG_OK) {
    seg_free(c);
    return st;
  }
  for (int k = 1; k < n; k++) sg->ws[k] = (char *)sg->blk + (size_t)(k - 1) * ws;
  sg->rows = (int32_t *)((char *)sg->blk + rows_at);
  sg->ws_bytes = ws;
  sg->n = n;
  mem_log("context: after the per-canvas streams (seg_ready, DGEMMA_SEG_STREAMS)");
  return DG_OK;
}

/* c's stream, cuBLAS handle (its workspace c->blas_ws), graphs, and with c->side.on the second stream's. */
static dg_status ctx_stream(dg_cuda_ctx *c) {
  cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return dg_seterr(DG_ERR_BACKEND, "cudaStreamCreateWithFlags failed: %s", cudaGetErrorString(e));
  mem_log("context: after its stream");
  cublasStatus_t bs = cublasCreate(&c->blas);
  if (bs != CUBLAS_STATUS_SUCCESS) { c->blas = NULL; return dg_seterr(DG_ERR_BACKEND, "cublasCreate failed: %s", cublasGetStatusString(bs)); }
  mem_log("context: after its cublasCreate");
  bs = cublasSetStream(c->blas, c->stream);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 for fp32 products */
  if (bs != CUBLAS_STATUS_SUCCESS) return dg_seterr(DG_ERR_BACKEND, "cublasSetStream/SetMathMode failed: %s", cublasGetStatusString(bs));
#ifndef DG_CUDA_EMU
  /* after cublasSetStream, which resets it: a workspace of our own, so that a captured product allocates
   * nothing (graph.cu); of the size of cuBLAS's default pool, in every context, so that the products choose the
   * same algorithms with graphs on and off */
  bs = cublasSetWorkspace(c->blas, c->blas_ws, blas_ws_bytes(c->m->device));
  if (bs != CUBLAS_STATUS_SUCCESS) return dg_seterr(DG_ERR_BACKEND, "cublasSetWorkspace failed: %s", cublasGetStatusString(bs));
#endif
  mem_log("context: after cublasSetStream, SetMathMode, SetWorkspace");
  gemm_pins_init(c, blas_ws_bytes(c->m->device), 0);
  DG_TRY(gemm_inv_init(c, blas_ws_bytes(c->m->device))); /* DGEMMA_STACK_DENSE=inv */
  if (c->pins || c->inv) mem_log("context: after the cublasLt handles (DGEMMA_GEMM_PIN / DGEMMA_STACK_DENSE=inv)");
  if (c->side.on) DG_TRY(ctx_side(c));
  dg_status st = graph_init(c);
  if (st != DG_OK) return st;
  mem_log("context: after graph_init");
  /* the cache memsets ran on the legacy stream, which our non-blocking stream does not wait for */
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return dg_seterr(DG_ERR_BACKEND, "cudaDeviceSynchronize failed: %s", cudaGetErrorString(e));
  return DG_OK;
}

extern "C" dg_status dg_cuda_ctx_new(dg_cuda_model *m, int32_t cap, int32_t rows, int full_window, dg_cuda_ctx **out) {
  *out = NULL;
  /* tokens per encoder pass (DGEMMA_ENC_CHUNK; a bad value is refused with the reason): a longer prefill pass reads
   * every weight once per enc_chunk prompt tokens instead of per 256 (issue 12's prefill of 1,024 tokens in one
   * pass), at the price of buffers for enc_chunk rows; kept in c->enc_chunk, which ctx_carves lays out again with */
  int32_t enc_chunk = 0;
  DG_TRY(dg_cuda_enc_chunk(&enc_chunk));
  int seg_n = 1; /* DGEMMA_SEG_STREAMS (passes.cu; a bad value is refused here, with the reason) */
  DG_TRY(dg_cuda_seg_streams(&seg_n));
  CK(cudaSetDevice(m->device));
  const ctx_dims z = ctx_dims_of(m, cap, rows, full_window, enc_chunk);
  ctx_priv *pv = (ctx_priv *)calloc(1, sizeof *pv + 2 * (size_t)m->d.n_layers * sizeof(bf16 *));
  if (!pv) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  dg_cuda_ctx *c = &pv->c;
  c->m = m;
  c->kc = (bf16 **)(pv + 1);
  c->vc = c->kc + m->d.n_layers;
  pv->rows = rows;
  pv->full_window = full_window;
  c->cap = cap;
  c->S = (int32_t)z.S;
  c->S_ring = (int32_t)z.S_ring;
  c->tmax = (int32_t)z.T;
  c->enc_rows = (int32_t)z.Te;
  c->ring_rows = (int32_t)z.Tr;
  c->enc_chunk = enc_chunk;
  c->norm_next = -1; /* no layer's input norm written ahead (passes.cu, k_ffn_combine_norm) */
  c->lg_T = 1.0f; /* c->logits: nothing pending (lg_virt 0) */
  c->segs.want = seg_n; /* the streams themselves come with the first stacked pass (seg_ready) */
  c->side.on = dg_cuda_branch_now(); /* before the layout: its workspace is carved only then */
  pv->side_ws = c->side.on ? side_ws_bytes(m->device) : 0;
  c->sc_group = sc_group_for((int32_t)z.C); /* before the layout */
  c->debug_sync = dg_sw_get(DG_SW_CUDA_SYNC) == 1;
  mem_log("context: before its block");
  dg_status st = ctx_buffers(pv, &z);
  if (st == DG_OK && pv->dev) {
    char w[128];
    snprintf(w, sizeof w, "context: after its block (%zu bytes = %.3f GiB, cap %d)", pv->dev_bytes, pv->dev_bytes / GiB,
             (int)cap);
    mem_log(w);
  }
  if (st == DG_OK) st = ctx_stream(c);
  if (st == DG_OK) mem_log("context: after its streams, cuBLAS handles and graph cache (ctx_stream)");
  if (st != DG_OK) {
    dg_cuda_ctx_free(c);
    return st;
  }
  k_attention_choose(&c->att_ws); /* the passes' attention versions, once per context (attention.cu) */
  *out = c;
  return DG_OK;
}

extern "C" dg_status dg_cuda_ctx_choices(const dg_cuda_ctx *c, char *buf, size_t n) {
  if (!c || !buf || !n) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_ctx_choices: NULL argument or no room");
  k_attention_describe(&c->att_ws, buf, n);
  return DG_OK;
}

extern "C" void dg_cuda_ctx_free(dg_cuda_ctx *c) {
  if (!c) return;
  ctx_priv *pv = (ctx_priv *)c;
  cudaSetDevice(c->m->device);
  if (c->stream) cudaStreamSynchronize(c->stream);
  if (c->side.stream) cudaStreamSynchronize(c->side.stream); /* idle unless a pass failed between fork and join */
  mem_log("context: at dg_cuda_ctx_free, after its passes (graphs, turbo buffers, loaded kernels)");
  if (c->prof || c->prof_stack) dg_cuda_profile(c, 0);
  graph_free(c);
  gemm_pins_free(c);
  gemm_inv_free(c);
  if (c->blas) cublasDestroy(c->blas);
  if (c->stream) cudaStreamDestroy(c->stream);
  if (c->side.blas) cublasDestroy(c->side.blas);
  if (c->side.fork) cudaEventDestroy(c->side.fork);
  if (c->side.join) cudaEventDestroy(c->side.join);
  if (c->side.stream) cudaStreamDestroy(c->side.stream);
  seg_free(c);
  if (pv->host) cudaFreeHost(pv->host);
  turbo_free(c);
  if (pv->dev) cudaFree(pv->dev);
  free(pv);
  mem_log("context: freed");
}

/* ---- stage timing ------------------------------------------------------------ */

#define PROF_EV 2048 /* events per batch; a full batch is synchronised and summed */
struct dg_cuda_prof {
  cudaEvent_t ev[PROF_EV];
  int st[PROF_EV]; /* stage of the interval ending at ev[i] */
  int n;           /* events recorded in this batch (ev[0] may be the previous batch's last) */
  double ms[DG_CUDA_NSTAGES];
  int64_t marks;
  int64_t passes, canvases, rows; /* a stacked passes' record (prof_stack): stacks, canvases and rows summed */
  int32_t *h_cnt;                  /* pinned [n_layers * E]: the last stack's expert counts per layer (prof_stack) */
  int64_t erows[DG_CUDA_EXPERT_BINS], erows_max;
};

static const char *const kStageNames[DG_CUDA_NSTAGES] = {
    "embedding and norms", "q/k/v + rope", "attention", "o-proj", "dense MLP", "router + top-k", "grouping",
    "experts", "combine", "LM head", "self-conditioning", "sampler statistics", "host and launch gaps"};

extern "C" const char *dg_cuda_stage_name(int i) { return i >= 0 && i < DG_CUDA_NSTAGES ? kStageNames[i] : "?"; }

/* Sum the intervals of the recorded batch, keep its last event as the next batch's start. */
static dg_status prof_flush(dg_cuda_prof *p) {
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
dg_status mark(dg_cuda_ctx *c, int st) {
  dg_cuda_prof *p = c->prof;
  if (!p) return DG_OK;
  if (p->n == PROF_EV) DG_TRY(prof_flush(p));
  CK(cudaEventRecord(p->ev[p->n], c->stream));
  p->st[p->n++] = st;
  p->marks++;
  return DG_OK;
}

static void prof_free(dg_cuda_prof *p) {
  if (!p) return;
  for (int i = 0; i < PROF_EV; i++) cudaEventDestroy(p->ev[i]);
  if (p->h_cnt) cudaFreeHost(p->h_cnt);
  free(p);
}

static dg_status prof_new(dg_cuda_prof **out) {
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
  *out = p;
  return DG_OK;
}

extern "C" dg_status dg_cuda_profile(dg_cuda_ctx *c, int on) {
  CK(cudaSetDevice(c->m->device));
  if (c->prof) {
    CK(cudaStreamSynchronize(c->stream));
    prof_free(c->prof);
    c->prof = NULL;
  }
  if (c->prof_stack) { /* its events were recorded on a work context's stream, which a stacked pass synchronised */
    prof_free(c->prof_stack);
    c->prof_stack = NULL;
  }
  if (!on) return DG_OK;
  return prof_new(&c->prof);
}

dg_status prof_stack_begin(dg_cuda_ctx *w, dg_cuda_ctx *lead, int32_t canvases, int32_t rows) {
  if (!lead->prof) return DG_OK;
  if (!lead->prof_stack) DG_TRY(prof_new(&lead->prof_stack));
  lead->prof_stack->passes++;
  lead->prof_stack->canvases += canvases;
  lead->prof_stack->rows += rows;
  const dg_cuda_model_desc *d = &w->m->d;
  if (!lead->prof_stack->h_cnt && d->n_experts > 0 &&
      cudaMallocHost((void **)&lead->prof_stack->h_cnt, (size_t)d->n_layers * d->n_experts * 4) != cudaSuccess) {
    lead->prof_stack->h_cnt = NULL;
    return dg_seterr(DG_ERR_BACKEND, "cudaMallocHost of %d expert counts failed", d->n_layers * d->n_experts);
  }
  w->prof = lead->prof_stack;
  return DG_OK;
}

dg_status prof_stack_layer(dg_cuda_ctx *w, int li) {
  dg_cuda_prof *p = w->prof;
  if (!p || !p->h_cnt) return DG_OK;
  const int E = w->m->d.n_experts;
  CK(cudaMemcpyAsync(p->h_cnt + (size_t)li * E, w->moe.count, (size_t)E * 4, cudaMemcpyDeviceToHost, w->stream));
  return DG_OK;
}

void prof_stack_end(dg_cuda_ctx *w) {
  dg_cuda_prof *p = w->prof;
  if (!p || !p->h_cnt) return;
  const int E = w->m->d.n_experts, L = w->m->d.n_layers;
  for (int i = 0; i < L * E; i++) {
    const int64_t r = p->h_cnt[i];
    p->erows[r < DG_CUDA_EXPERT_BINS - 1 ? r : DG_CUDA_EXPERT_BINS - 1]++;
    if (r > p->erows_max) p->erows_max = r;
  }
}

extern "C" dg_status dg_cuda_profile_read(dg_cuda_ctx *c, double *ms, int64_t *n_marks, dg_cuda_stack_prof *stack) {
  if (!c->prof) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_profile_read: profiling is off (dg_cuda_profile(c, 1) first)");
  CK(cudaSetDevice(c->m->device));
  DG_TRY(prof_flush(c->prof));
  for (int i = 0; i < DG_CUDA_NSTAGES; i++) ms[i] = c->prof->ms[i];
  if (n_marks) *n_marks = c->prof->marks;
  if (stack) {
    memset(stack, 0, sizeof *stack);
    dg_cuda_prof *p = c->prof_stack;
    if (p) {
      DG_TRY(prof_flush(p));
      for (int i = 0; i < DG_CUDA_NSTAGES; i++) stack->ms[i] = p->ms[i];
      stack->marks = p->marks;
      stack->passes = p->passes;
      stack->canvases = p->canvases;
      stack->rows = p->rows;
      for (int i = 0; i < DG_CUDA_EXPERT_BINS; i++) stack->expert_rows[i] = p->erows[i];
      stack->expert_rows_max = p->erows_max;
    }
  }
  return DG_OK;
}
