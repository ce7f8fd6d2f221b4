/* passes.cu: the encoder and decoder passes of spec section 4 on the device
 * (dg_cuda_encode, dg_cuda_decode), the sampler's per-position statistics
 * (dg_cuda_step_stats) and the self-conditioning soft embedding
 * (dg_cuda_soft_from_z), as a sequence of cuBLAS products and kernels
 * (kernels.cu, moe.cu, attention.cu), mirroring src/model/forward.c step by step
 * (by default, DGEMMA_BRANCH, each layer's dense MLP on a second stream, concurrent
 * with its router and experts: ffn_branches).
 * MLX affine-quantized matrices go through the dequantizing kernels of
 * quant.cu / qmoe*.cu instead of cuBLAS and the bf16 expert kernel. Not
 * here: the generation loop (src/sample/generate.c and src/sample/turbo.c drive every
 * backend through src/backend/backend.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

/* ---- products ----------------------------------------------------------------- */

/* y[t, n] (ld ldy, fp32) = alpha * sum_k x[t, k] * W[n, k] + beta * y: x bf16 [T, K] (ld ldx),
 * W bf16 [N, K] row-major; fp32 accumulation. */
static dg_status gemm(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const bf16 *W, int N, int K, float *y, int ldy,
                      float alpha, float beta) {
  dg_status st;
  if (beta == 0.0f) CK(dg_initcheck_clear(c->stream, y, (size_t)ldy, (size_t)N, (size_t)T));
  /* DGEMMA_STACK_DENSE=inv: the shape's batch-invariant algorithm (gemm_inv.cu), before any pin */
  if (beta == 0.0f && gemm_inv(c, 1, N, T, K, alpha, W, x, ldx, y, ldy, &st)) return st;
  if (alpha == 1.0f && beta == 0.0f && gemm_pinned(c, x, ldx, T, W, N, K, y, ldy, &st)) return st; /* gemm_pin.cu */
  CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, ldx, &beta,
                   y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return DG_OK;
}

/* y[t, n] (ld ldy, fp32) = sum_k x[t, k] * W[n, k] for every row n of W:
 * cuBLAS for bf16, the dequantizing kernel (quant.cu) for quantized W. */
dg_status wmatmul(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const dg_cuda_w *W, float *y, int ldy) {
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

/* GeGLU MLP (spec 4.1): out[T, H] = down(gelu(gate a) * up a), a bf16 [T, H], its intermediates in gu [T, 2I] and
 * h [T, I]. */
dg_status geglu_step(dg_cuda_ctx *c, int step, const bf16 *a, int T, const dg_cuda_wset *w_gate_up,
                     const dg_cuda_w *w_down, float *out, float *gu, bf16 *h) {
  const int H = c->m->d.hidden, I = c->m->d.inter;
  if (step == 0) DG_TRY(wsetmatmul(c, a, H, T, w_gate_up, gu, 2 * I));
  if (step == 1) CKK(c, k_geglu(c->stream, gu, h, T, I));
  if (step == 2) DG_TRY(wmatmul(c, h, I, T, w_down, out, H));
  return DG_OK;
}

dg_status geglu_mlp_at(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up, const dg_cuda_w *w_down,
                       float *out, float *gu, bf16 *h) {
  for (int step = 0; step < 3; step++) DG_TRY(geglu_step(c, step, a, T, w_gate_up, w_down, out, gu, h));
  return DG_OK;
}

dg_status geglu_mlp(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up,
                           const dg_cuda_w *w_down, float *out) {
  return geglu_mlp_at(c, a, T, w_gate_up, w_down, out, c->gu, c->h);
}

/* ---- a stacked pass's per-canvas products on several streams (DGEMMA_SEG_STREAMS; issue 14) -------------------
 * A stacked pass (turbo_host.cu compact_stack: B canvases' forward sets as one T = sum n_b rows) runs its dense
 * products per canvas, each at its own row count, so that a canvas's words are those of its own pass (layer_segs).
 * One after another on one stream, each product of ~130-160 rows has too few tiles to fill the GPU and reads all its
 * weights alone. With DGEMMA_SEG_STREAMS=N the canvases' products go to N streams (canvas g on g % N; stream 0 the
 * issuing stream), forked from the issuing stream after the stage before them and joined into it before the stage
 * that reads all rows: the same kernels on the same inputs into disjoint outputs, so every word is the sequential
 * order's (test_seg_streams). What each canvas's products share otherwise gets a piece per canvas: cuBLAS's
 * workspace (one per stream, c->segs.ws, the issuing stream's bytes told to cuBLAS on every stream so that it
 * chooses the same algorithms: one handle, c->blas, moved between the streams with cublasSetStream and
 * cublasSetWorkspace as DGEMMA_BRANCH_HANDLE=one moves it, instead of a cublasCreate (~64 MiB) per stream), the
 * MLPs' intermediates gu and h (each canvas's at its own offset, 256-byte aligned as a pass's own are: seg_pack),
 * the LM heads' gathered rows (compact_stack). A stage of several launches per canvas is issued step by step over
 * the canvases (every canvas's first launch, then every canvas's second, ...): on the GPU each stream gets its
 * first product sooner; under the CPU emulation, which runs every launch when it is made, canvas g's later steps
 * then run after the other canvases' earlier ones, so an intermediate two canvases shared would change a canvas's
 * words there (test_seg_streams; on one stream each canvas's launches run back to back).
 * With stage timing on the forks stay (the marks are recorded on the issuing stream after each join, so a stage's
 * time is its concurrent products' span); off with DGEMMA_CUDA_SYNC=1. No stacked pass is captured in a graph (it
 * synchronises and copies from pageable memory), but the fork and join are events only, as ffn_branches's. */
static int seg_override = -1;
void dg_cuda_seg_streams_set(int n) { seg_override = n >= 1 && n <= DG_SEG_STREAMS_MAX ? n : -1; }

dg_status dg_cuda_seg_streams(int *n) {
  *n = 1;
  if (seg_override > 0) {
    *n = seg_override;
    return DG_OK;
  }
  /* the switch table (backend/switches.c: 1..8, DG_SEG_STREAMS_MAX); dg_context_new's dg_switches_check has refused
   * a bad value before any context is made */
  const long k = dg_sw_get(DG_SW_SEG_STREAMS);
  *n = k >= 1 && k <= DG_SEG_STREAMS_MAX ? (int)k : 1;
  return DG_OK;
}

int seg_on(const dg_cuda_ctx *c, int ng) { return ng > 1 && c->segs.n > 1 && !c->debug_sync; }

int seg_pack(const int *n, int ng, size_t per, size_t align, size_t cap, size_t *off) {
  size_t o = 0;
  for (int g = 0; g < ng; g++) {
    o = (o + align - 1) / align * align;
    off[g] = o;
    o += (size_t)(n[g] > 0 ? n[g] : 0) * per;
  }
  return o <= cap;
}

/* c->blas onto stream s and workspace ws of ws_bytes (cublasSetStream resets the workspace to cuBLAS's pool, so
 * the workspace is set again after it): the one-handle branches (DGEMMA_BRANCH_HANDLE=one, c->side.blas NULL) and
 * the per-canvas streams. */
static dg_status blas_onto(dg_cuda_ctx *c, cudaStream_t s, void *ws, size_t ws_bytes) {
  cublasStatus_t bs = cublasSetStream(c->blas, s);
#ifndef DG_CUDA_EMU
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(c->blas, ws, ws_bytes);
#else
  (void)ws; (void)ws_bytes;
#endif
  if (bs != CUBLAS_STATUS_SUCCESS)
    return dg_seterr(DG_ERR_BACKEND, "a cuBLAS handle onto another stream: %s", cublasGetStatusString(bs));
  return DG_OK;
}

int64_t seg_forks_total; /* forks issued by every context so far (host count; the tests) */

dg_status seg_fork(dg_cuda_ctx *c, int ng, size_t ws_bytes) {
  dg_cuda_ctx::dg_cuda_segs *sg = &c->segs;
  sg->base = c->stream;
  sg->base_ws = c->blas_ws;
  sg->base_ws_bytes = ws_bytes;
  sg->used = 1;
  CK(cudaEventRecord(sg->fork, c->stream));
  const int used = ng < sg->n ? ng : sg->n;
  for (int k = 1; k < used; k++) {
    CK(cudaStreamWaitEvent(sg->stream[k], sg->fork, 0));
    sg->used = k + 1;
  }
  sg->forks++;
  seg_forks_total++;
  return DG_OK;
}

dg_status seg_to(dg_cuda_ctx *c, int g) {
  dg_cuda_ctx::dg_cuda_segs *sg = &c->segs;
  const int k = g % sg->n;
  if (k >= sg->used) return dg_seterr(DG_ERR_BACKEND, "seg_to: canvas %d's stream %d was not forked", g, k);
  cudaStream_t s = k ? sg->stream[k] : sg->base;
  void *ws = k ? sg->ws[k] : sg->base_ws;
  if (c->stream == s) return DG_OK;
  DG_TRY(blas_onto(c, s, ws, sg->base_ws_bytes));
  c->stream = s;
  c->blas_ws = ws;
  return DG_OK;
}

dg_status seg_join(dg_cuda_ctx *c) {
  dg_cuda_ctx::dg_cuda_segs *sg = &c->segs;
  dg_status st = DG_OK;
  if (c->stream != sg->base) {
    st = blas_onto(c, sg->base, sg->base_ws, sg->base_ws_bytes);
    c->stream = sg->base;
    c->blas_ws = sg->base_ws;
  }
  for (int k = 1; k < sg->used; k++) {
    cudaError_t e = cudaEventRecord(sg->join[k], sg->stream[k]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(sg->base, sg->join[k], 0);
    if (e != cudaSuccess && st == DG_OK)
      st = dg_seterr(DG_ERR_BACKEND, "the per-canvas streams' join (DGEMMA_SEG_STREAMS): %s", cudaGetErrorString(e));
  }
  sg->used = 0;
  return st;
}

/* The two branches of a layer concurrent (ffn_branches, below): the default since H200 session 17 (vllm protocol on
 * the 26B, 1,211.3 -> 1,219.7 tok/s alone, 1,221.8 -> 1,234.6 with the zstore chain); DGEMMA_BRANCH=0 runs them one
 * after another. Read once when the library loads; dg_cuda_branch_set overrides it. */
static int branch_from_env(void) { return dg_sw_get(DG_SW_BRANCH) != 0; } /* backend/switches.c */
static const int branch_env = branch_from_env();
static int branch_override = -1;
void dg_cuda_branch_set(int on) { branch_override = on == 0 || on == 1 ? on : -1; }
int dg_cuda_branch_now(void) { return branch_override >= 0 ? branch_override : branch_env; }

size_t ctx_blas_ws_bytes(const dg_cuda_ctx *c); /* context.cu */
size_t ctx_side_ws_bytes(const dg_cuda_ctx *c);

/* The dense MLP of layer l (spec 4.4 step 5; its post norm comes with the combine) over the normed rows c->a [T, H]
 * into c->dense [T, H], on c->stream (its cuBLAS workspace of ws_bytes): per canvas sg[g] for ng > 1 (layer_segs),
 * over all T rows for ng = 1; with the per-canvas streams (seg_on) each canvas's on its stream, its intermediates
 * at its own offsets of c->gu and c->h (where they fit: else one after another at their start, as without). */
static dg_status dense_mlp(dg_cuda_ctx *c, const dg_cuda_layer *l, int T, const dg_cuda_seg *sg, int ng,
                           size_t ws_bytes) {
  const size_t H = (size_t)c->m->d.hidden, I = (size_t)c->m->d.inter;
  size_t go[DG_CUDA_MAX_STACK], ho[DG_CUDA_MAX_STACK];
  int nn[DG_CUDA_MAX_STACK];
  int on = seg_on(c, ng) && ng <= DG_CUDA_MAX_STACK;
  for (int g = 0; on && g < ng; g++) nn[g] = sg[g].n;
  on = on && seg_pack(nn, ng, 2 * I, 64, (size_t)c->tmax * 2 * I, go) &&
       seg_pack(nn, ng, I, 128, (size_t)c->tmax * I, ho);
  if (on) { /* step by step over the canvases (the section above) */
    DG_TRY(seg_fork(c, ng, ws_bytes));
    dg_status st = DG_OK;
    for (int step = 0; step < 3 && !st; step++)
      for (int g = 0; g < ng && !st; g++) {
        st = seg_to(c, g);
        if (!st)
          st = geglu_step(c, step, c->a + sg[g].r0 * H, sg[g].n, &l->w_gate_up, &l->w_down, c->dense + sg[g].r0 * H,
                          c->gu + go[g], c->h + ho[g]);
      }
    const dg_status sj = seg_join(c);
    DG_TRY(st);
    DG_TRY(sj);
  }
  for (int g = 0; !on && g < ng; g++) {
    const int r0 = ng == 1 ? 0 : sg[g].r0, n = ng == 1 ? T : sg[g].n;
    DG_TRY(geglu_mlp(c, c->a + r0 * H, n, &l->w_gate_up, &l->w_down, c->dense + r0 * H));
  }
  return mark(c, DG_CUDA_ST_DENSE);
}

/* The MoE branch of layer l (spec 4.6) on c->stream: router logits in fp32 (step 2) from c->u [T, H], softmax, top-K
 * and the grouping by expert (by default two launches, router_tile_kernel and route_gr_kernel; DGEMMA_ROUTE=tiles
 * route_tk_kernel for the second, DGEMMA_ROUTE=chain the chain of launches, DGEMMA_ROUTE=fused one launch after the
 * logits' split products; the profile's grouping stage is inside the router's), then the experts over c->xe [T, H]
 * into c->moe.y. */
static dg_status moe_branch(dg_cuda_ctx *c, const dg_cuda_layer *l, int T) {
  const dg_cuda_model_desc *d = &c->m->d;
  cudaStream_t s = c->stream;
  c->moe.gu_x = c->xe; /* DGEMMA_ROUTE=grid makes the gate/up input's permuted copy and group sums while it waits */
  c->moe.gu_group = k_qe_gate_up_group(&l->experts_gate_up);
  CKK(c, k_router_route(s, c->u, l->router, c->rlog, l->per_expert_scale, &c->moe, T, d->n_experts, d->hidden,
                        d->top_k, c->rws, -1));
  DG_TRY(mark(c, DG_CUDA_ST_ROUTER));
  DG_TRY(mark(c, DG_CUDA_ST_GROUP));
  CKK(c, dg_cuda_experts(s, l, c->xe, &c->moe, T, d->hidden, d->moe_inter, d->n_experts, d->top_k));
  return mark(c, DG_CUDA_ST_EXPERTS);
}

/* DGEMMA_BRANCH (on unless DGEMMA_BRANCH=0): each layer's dense MLP on a second stream (c->side), concurrent with its router, grouping and
 * experts (issue 12 item 5). The two branches are independent given the attention residual (spec 4.4 steps 5-7):
 * the dense one reads c->a and writes c->gu, c->h, c->dense (and cuBLAS's workspace: the side's own), the MoE one
 * reads c->u, c->xe and writes c->rlog, c->rws, c->moe; only the combine reads both. So the side stream waits for
 * an event recorded after k_attn_residual (fork) and the main one for an event recorded after the dense MLP (join),
 * before the combine; in a graph capture the two become parallel branches of the graph (the side stream joins the
 * capture through the fork's wait and leaves it through the join). The same kernels on the same inputs: the bits of
 * the sequential order (test_branch). Off (everything in order on c->stream) while profiling (the stage marks time
 * one stream) and with DGEMMA_CUDA_SYNC=1 (which synchronises c->stream only).
 * The router's grid-wide wait (route_gr_kernel, DGEMMA_ROUTE=grid) stays safe: it needs every block of its grid
 * resident at once, which k_route_grid checks for an idle GPU; the dense branch's kernels may hold SMs a while, but
 * they never wait on the router (their only dependencies are the fork and each other), so they finish and the
 * router's remaining blocks are placed; under PDL a kernel after route_gr_kernel is placed only once every block of
 * it has run its DG_PDL_ENTRY (is resident), and a dense kernel placed early by PDL waits on its own predecessor on
 * the side stream only. The host issues the MoE branch first, then the dense one: under the CPU emulation, which
 * runs every launch when it is made, the branches then run in the opposite order to the sequential pass, so a
 * buffer the two shared would change the results there. */

static dg_status ffn_branches(dg_cuda_ctx *c, const dg_cuda_layer *l, int T, const dg_cuda_seg *sg, int ng) {
  if (!c->side.on || c->prof || c->debug_sync) {
    DG_TRY(dense_mlp(c, l, T, sg, ng, ctx_blas_ws_bytes(c)));
    return moe_branch(c, l, T);
  }
  cudaStream_t main_s = c->stream;
  CK(cudaEventRecord(c->side.fork, main_s));
  CK(cudaStreamWaitEvent(c->side.stream, c->side.fork, 0));
  c->side.forks++;
  DG_TRY(moe_branch(c, l, T));
  /* the dense MLP issued with c's stream, cuBLAS handle and workspace the side's (every product of geglu_mlp, a
   * pinned one included, takes them from c), then c's own again */
  cublasHandle_t main_blas = c->blas;
  void *main_ws = c->blas_ws;
  const int one = !c->side.blas; /* DGEMMA_BRANCH_HANDLE=one: c's handle moved onto the side and back */
  if (one) DG_TRY(blas_onto(c, c->side.stream, c->side.ws, ctx_side_ws_bytes(c)));
  c->stream = c->side.stream;
  if (!one) c->blas = c->side.blas;
  c->blas_ws = c->side.ws;
  dg_status st = dense_mlp(c, l, T, sg, ng, ctx_side_ws_bytes(c));
  c->stream = main_s;
  c->blas = main_blas;
  c->blas_ws = main_ws;
  if (one) {
    const dg_status sb = blas_onto(c, main_s, main_ws, ctx_blas_ws_bytes(c));
    if (st == DG_OK) st = sb;
  }
  DG_TRY(st);
  CK(cudaEventRecord(c->side.join, c->side.stream));
  CK(cudaStreamWaitEvent(main_s, c->side.join, 0));
  return DG_OK;
}

/* Canvas q's rows of layer li's q/k/v (c->qkv) normed and roped into c->q and its K/V into q's cache (at q->dpos, or
 * from q->pos0), on c->stream. */
static dg_status qkv_post_seg(dg_cuda_ctx *c, const dg_cuda_layer *l, int li, const dg_cuda_seg *q) {
  const dg_cuda_model *m = c->m;
  const int NH = m->d.n_heads, NKV = l->n_kv, D = l->head_dim;
  const size_t qrow = (size_t)NH * D;
  const float *qkv = c->qkv + (size_t)q->r0 * l->n_qkv;
  const float *inv_freq = l->is_full ? m->inv_freq_full : m->inv_freq_sliding;
  const int32_t S = l->is_full ? q->S : q->S_ring;
  if (q->dpos)
    CKK(c, k_qkv_post_at(c->stream, qkv, l->n_qkv, c->q + q->r0 * qrow, q->kc[li], q->vc[li], S, l->q_norm, l->k_norm,
                         inv_freq, q->n, NH, NKV, D, l->has_v, q->dpos, m->d.eps));
  else
    CKK(c, k_qkv_post(c->stream, qkv, l->n_qkv, c->q + q->r0 * qrow, q->kc[li], q->vc[li], S, l->q_norm, l->k_norm,
                      inv_freq, q->n, NH, NKV, D, l->has_v, q->pos0, m->d.eps));
  return DG_OK;
}

/* One layer (spec 4.4) over c->x [T, H] whose rows are the canvases sg[0..nseg) (host array), each a run of
 * consecutive rows with its own KV cache and positions: causal = encoder (one segment); sg[g].dpos != NULL
 * (decoder only): the compacted pass (spec 7.4), the segment's rows sit at the absolute positions dpos[n]
 * (device), their K/V go to those slots of the segment's cache, and they attend over its prefix and its
 * whole canvas [pos0, pos0 + C). The norms, router and experts run over all T rows at once; the K/V scatter
 * and the attention per segment (rows do not interact outside attention), the dense products too (above). */
dg_status layer_segs(dg_cuda_ctx *c, int li, int T, const dg_cuda_seg *sg, int nseg, int causal) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const dg_cuda_layer *l = &m->layers[li];
  const int H = d->hidden, NH = d->n_heads, NKV = l->n_kv, D = l->head_dim;
  const float eps = d->eps;
  const size_t qrow = (size_t)NH * D; /* floats of q, bf16 of att per row */
  cudaStream_t s = c->stream;
  /* the dense products per canvas unless DGEMMA_STACK_DENSE (gemm_inv.cu stack_dense_now) is 1 or inv: cuBLAS may
   * pick another algorithm (another rounding) for another row count, so by default a canvas's rows go through the
   * row count of its own pass and its results are those of its own dg_cuda_compact bit for bit; with inv every
   * product runs one algorithm whatever the row count (the same bits, one weight read per stack); with 1 cuBLAS's
   * default over the stack (a canvas's bits may differ). The experts, whose weights dominate, run over every row at
   * once (their kernels' arithmetic per row does not depend on the other rows) */
  const int ng = nseg > 1 && !stack_dense_now() ? nseg : 1;
#define SEG_R0(g) (ng == 1 ? 0 : sg[g].r0)
#define SEG_N(g) (ng == 1 ? T : sg[g].n)
  /* the input norm, unless the previous layer's combine wrote it already (k_ffn_combine_norm, below) */
  if (c->norm_next != li || c->norm_rows != T) CKK(c, k_rmsnorm(s, c->x, l->input_norm, NULL, c->a, T, H, eps));
  c->norm_next = -1;
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
  /* DGEMMA_SEG_STREAMS: each canvas's q/k/v product and its rope and K/V scatter (which read only its rows and write
   * its rows of c->q and its own cache) on its stream, joined before attention */
  const int seg = seg_on(c, ng);
  if (seg) {
    DG_TRY(seg_fork(c, ng, ctx_blas_ws_bytes(c)));
    dg_status st = DG_OK;
    for (int step = 0; step < 2 && !st; step++) /* step by step (the section above) */
      for (int g = 0; g < ng && !st; g++) {
        st = seg_to(c, g);
        if (!st && step == 0)
          st = wsetmatmul(c, c->a + (size_t)sg[g].r0 * H, H, sg[g].n, &l->wqkv, c->qkv + (size_t)sg[g].r0 * l->n_qkv,
                          (int)l->n_qkv);
        if (!st && step == 1) st = qkv_post_seg(c, l, li, &sg[g]);
      }
    const dg_status sj = seg_join(c);
    DG_TRY(st);
    DG_TRY(sj);
  }
  for (int g = 0; !seg && g < ng; g++)
    DG_TRY(wsetmatmul(c, c->a + (size_t)SEG_R0(g) * H, H, SEG_N(g), &l->wqkv, c->qkv + (size_t)SEG_R0(g) * l->n_qkv,
                      (int)l->n_qkv));
  /* an encoder pass of more rows than the rings hold keys for (ring_rows: a chunk beyond DG_RING_CHUNK), on a
   * sliding layer: its K/V and attention in calls of ring_rows rows, each call's K/V written just before its
   * attention, so that no row's keys are overwritten before it has read them (position p + j of a call overwrites
   * position p + j - S_ring, which is before every key of that call's rows, S_ring >= window - 1 + ring_rows) */
  if (causal && nseg == 1 && !l->is_full && sg[0].S_ring < sg[0].S && T > c->ring_rows && !sg[0].dpos) {
    DG_TRY(mark(c, DG_CUDA_ST_QKV));
    const dg_cuda_seg *q = &sg[0];
    const int last = li == d->n_layers - 1;
    for (int r0 = 0; r0 < T; r0 += c->ring_rows) {
      const int n = T - r0 < c->ring_rows ? T - r0 : c->ring_rows;
      CKK(c, k_qkv_post(s, c->qkv + (size_t)r0 * l->n_qkv, l->n_qkv, c->q + r0 * qrow, q->kc[li], q->vc[li],
                        q->S_ring, l->q_norm, l->k_norm, m->inv_freq_sliding, n, NH, NKV, D, l->has_v, q->pos0 + r0,
                        eps));
      if (!last)
        CKK(c, k_attention(s, &c->att_ws, c->q + r0 * qrow, q->kc[li], q->vc[li], c->att + r0 * qrow, q->S_ring, n,
                           NH, NKV, D, q->pos0 + r0, causal, 0, d->window));
    }
    if (last) return DG_OK; /* encoder: after the last layer's K/V nothing is needed (spec 4.4) */
  } else {
    for (int g = 0; !seg && g < nseg; g++) DG_TRY(qkv_post_seg(c, l, li, &sg[g]));
    DG_TRY(mark(c, DG_CUDA_ST_QKV));
    /* encoder: after the last layer's K/V nothing is needed (spec 4.4, last paragraph) */
    if (causal && li == d->n_layers - 1) return DG_OK;
    /* DGEMMA_ATTN=18 (attention.cu k_attention_batched): a stack's canvases in one launch, each canvas's words those of
     * its own pass (k_attention_batch); else one call per canvas */
    const int batched = !causal && nseg > 1 && k_attention_batched(&c->att_ws, D, NH, NKV);
    for (int g0 = 0; batched && g0 < nseg; g0 += 16) {
      const float *bq[16];
      const bf16 *bk[16], *bv[16];
      bf16 *bo[16];
      int32_t bS[16], bn[16], bp[16], bh[16];
      int n = 0;
      for (int g = g0; g < nseg && g < g0 + 16; g++, n++) {
        const dg_cuda_seg *q = &sg[g];
        bq[n] = c->q + q->r0 * qrow;
        bo[n] = c->att + q->r0 * qrow;
        bk[n] = q->kc[li];
        bv[n] = q->vc[li];
        bS[n] = l->is_full ? q->S : q->S_ring;
        bn[n] = q->n;
        bp[n] = q->pos0;
        bh[n] = q->pos0 + (q->dpos ? d->canvas : q->n); /* k_attention_canvas's keys, or k_attention's */
      }
      CKK(c, k_attention_batch(s, n, bq, bk, bv, bo, bS, bn, bp, bh, NH, NKV, D, l->is_full, d->window));
    }
    for (int g = 0; !batched && g < nseg; g++) {
      const dg_cuda_seg *q = &sg[g];
      const float *qg = c->q + q->r0 * qrow;
      bf16 *ag = c->att + q->r0 * qrow;
      const int32_t S = l->is_full ? q->S : q->S_ring;
      if (q->dpos)
        CKK(c, k_attention_canvas(s, &c->att_ws, qg, q->kc[li], q->vc[li], ag, S, q->n, NH, NKV, D, q->pos0,
                                  d->canvas, l->is_full, d->window));
      else
        CKK(c, k_attention(s, &c->att_ws, qg, q->kc[li], q->vc[li], ag, S, q->n, NH, NKV, D, q->pos0, causal,
                           l->is_full, d->window));
    }
  }
  DG_TRY(mark(c, DG_CUDA_ST_ATTN));
  if (seg) { /* DGEMMA_SEG_STREAMS: each canvas's o-proj on its stream, joined before the residual */
    DG_TRY(seg_fork(c, ng, ctx_blas_ws_bytes(c)));
    dg_status st = DG_OK;
    for (int g = 0; g < ng && !st; g++) {
      st = seg_to(c, g);
      if (!st) st = wmatmul(c, c->att + sg[g].r0 * qrow, NH * D, sg[g].n, &l->wo, c->f1 + (size_t)sg[g].r0 * H, H);
    }
    const dg_status sj = seg_join(c);
    DG_TRY(st);
    DG_TRY(sj);
  }
  for (int g = 0; !seg && g < ng; g++)
    DG_TRY(wmatmul(c, c->att + SEG_R0(g) * qrow, NH * D, SEG_N(g), &l->wo, c->f1 + (size_t)SEG_R0(g) * H, H));
  DG_TRY(mark(c, DG_CUDA_ST_OPROJ));
  const float root = (float)pow((double)H, -0.5);
  CKK(c, k_attn_residual(s, c->x, c->f1, l->post_attn_norm, l->pre_ff_norm, l->pre_ff2_norm, l->router_scale, root, c->a,
                     c->xe, c->u, T, H, eps));
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
#undef SEG_R0
#undef SEG_N
  DG_TRY(ffn_branches(c, l, T, sg, ng));
  /* the combine, and with it the next layer's input norm into c->a when there is a next layer (one launch and one
   * read of x fewer; the same bits as the norm's own kernel); layer li + 1 of these T rows then skips its norm */
  int fused = 0;
  const float *w_next = li + 1 < d->n_layers ? m->layers[li + 1].input_norm : NULL;
  CKK(c, k_ffn_combine_norm(s, c->x, c->dense, c->moe.y, c->moe.slot_row, c->moe.topk_idx, c->moe.topk_w,
                            l->post_ff1_norm, l->post_ff2_norm, l->post_ff_norm,
                            causal ? l->layer_scalar_enc : l->layer_scalar_dec, T, H, d->top_k, eps, w_next,
                            w_next ? c->a : NULL, &fused));
  c->norm_next = fused ? li + 1 : -1;
  c->norm_rows = T;
  DG_TRY(mark(c, DG_CUDA_ST_COMBINE));
  return DG_OK;
}

/* One layer of one canvas (or encoder chunk) in c's own cache: layer_segs with one segment. */
dg_status layer_at(dg_cuda_ctx *c, int li, int T, int32_t pos0, int causal, const int32_t *dpos) {
  const dg_cuda_seg one = {0, T, c->kc, c->vc, c->S, c->S_ring, pos0, dpos};
  return layer_segs(c, li, T, &one, 1, causal);
}

static dg_status layer(dg_cuda_ctx *c, int li, int T, int32_t pos0, int causal) {
  return layer_at(c, li, T, pos0, causal, NULL);
}

/* The encoder passes of dg_cuda_encode over the chunks of ids [n], in whichever view c's work buffers are in. */
static dg_status encode_chunks(dg_cuda_ctx *c, const int32_t *ids, int32_t n, int32_t pos0) {
  const dg_cuda_model_desc *d = &c->m->d;
  for (int32_t i = 0; i < n; i += c->enc_chunk) {
    const int T = n - i < c->enc_chunk ? n - i : c->enc_chunk;
    CK(cudaMemcpyAsync(c->ids, ids + i, (size_t)T * 4, cudaMemcpyHostToDevice, c->stream));
    CKK(c, k_embed(c->stream, c->x, &c->m->embed, c->ids, T, d->hidden, d->embed_scale));
    DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
    for (int li = 0; li < d->n_layers; li++) DG_TRY(layer(c, li, T, pos0 + i, 1));
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_encode(dg_cuda_ctx *c, const int32_t *ids, int32_t n, int32_t pos0) {
  if (n < 0 || pos0 < 0 || (int64_t)pos0 + n > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA encode: positions %d..%d exceed the context capacity %d", pos0,
                     pos0 + n - 1, c->cap);
  CK(cudaSetDevice(c->m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  note_written(c, pos0, pos0 + n);
  /* a pass of more rows than the decoder's (n > tmax, enc_rows > tmax: a chunk beyond DG_RING_CHUNK): the passes
   * in the encoder's view of the work buffers, which lies over P's head and the logits (dead from here on, lg_dead
   * 2), and back to the decoder's view, after the stream has run them, whatever happened */
  const int view = n > c->tmax && c->enc_rows > c->tmax;
  if (view) ctx_rows_view(c, 1);
  dg_status st = encode_chunks(c, ids, n, pos0);
  const cudaError_t e = cudaStreamSynchronize(c->stream);
  if (view) ctx_rows_view(c, 0);
  DG_TRY(st);
  if (e != cudaSuccess)
    return dg_seterr(DG_ERR_BACKEND, "CUDA encode: cudaStreamSynchronize failed: %s", cudaGetErrorString(e));
  return DG_OK;
}

/* The chain over the logits after the LM head (kernels.cu, issue 14). DGEMMA_VOCAB=chain: the chain (softcap in place, z =
 * logits / T in place, the probabilities' three passes over z). DGEMMA_VOCAB=fused: the fused one, the decoder pass
 * of the reference sampler leaves the raw logits (no softcap_kernel), the statistics and the self-conditioning
 * probabilities recompute z = softcap(x) / T in registers and never store it (3 passes over the [C, V] fp32 logits
 * of a sampled step with self-conditioning instead of 9), every output word the chain's; on the H200 (session 14)
 * its passes are bound by that recomputation (tanhf and two divisions per element per pass) and it is not faster:
 * head + self-conditioning + statistics 1.850 ms per 26B pass against the chain's 1.797 in --profile, the lab's
 * argmax chain 0.719 against 0.678 ms. DGEMMA_VOCAB=zstore: the fused chain whose statistics' pass 1 also stores
 * z in place (k_vocab_stats's store), the passes after it reading z as stored (c->lg_cap DG_VZ_STORED): the lab's
 * "v3 z stored" (argmax chain 0.602 ms on the H200, session 14), every output word the chain's; **the default since H200
 * session 17** (vllm protocol on the 26B: 1,211.3 -> 1,221.8 tok/s; LM head + self-conditioning + statistics 1.785 ->
 * 1.662 ms per pass); DGEMMA_VOCAB=chain gives the chain back. Read once when the library loads: 0 the chain,
 * 1 fused, 2 zstore; dg_cuda_vocab_set overrides it (the tests). */
static int vocab_mode_from_env(void) { return (int)dg_sw_get(DG_SW_VOCAB); } /* chain 0, fused 1, zstore or unset 2 */
static const int vocab_mode_env = vocab_mode_from_env();
static int vocab_mode_override = -1;
void dg_cuda_vocab_set(int mode) { vocab_mode_override = mode >= 0 && mode <= 2 ? mode : -1; }
static int vocab_mode_now(void) { return vocab_mode_override >= 0 ? vocab_mode_override : vocab_mode_env; }

/* c->logits as a pass left them: softcapped (or without softcap: none) unless raw_cap > 0, the softcap that the
 * fused chain will apply in registers. */
void logits_written(dg_cuda_ctx *c, float raw_cap) {
  c->lg_virt = raw_cap > 0.0f;
  c->lg_cap = raw_cap > 0.0f ? raw_cap : 0.0f;
  c->lg_T = 1.0f;
  c->lg_parts = 0;
  c->lg_dead = 0;
  if (c->tb) c->tb->sc_pre_n = 0; /* an exact SC product made ahead (turbo_host.cu) was of the raw rows before */
}

/* DG_ERR_INVALID_ARG where c->logits were overwritten by the self-conditioning probabilities (lg_dead), naming
 * `who`; DG_OK otherwise. */
dg_status logits_alive(const dg_cuda_ctx *c, const char *who) {
  if (!c->lg_dead) return DG_OK;
  if (c->lg_dead == 2)
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: the context's logits were overwritten by an encoder pass's rows (a chunk "
                     "of more rows than a decoder pass's: DGEMMA_ENC_CHUNK=256 keeps them): run a decoder pass first",
                     who);
  return dg_seterr(DG_ERR_INVALID_ARG, "%s: the context's logits were overwritten by the self-conditioning "
                   "probabilities made in their place (dg_cuda_soft_from_z; DGEMMA_SC_INPLACE=0 keeps them): run a "
                   "decoder pass first", who);
}

/* A virtual z in c->logits made real in place (the chain's values bit for bit: vz is its operations); a stored one
 * (lg_cap DG_VZ_STORED) is real already. */
static dg_status logits_materialize(dg_cuda_ctx *c) {
  if (!c->lg_virt) return DG_OK;
  if (c->lg_cap < 0.0f) {
    logits_written(c, 0.0f);
    return DG_OK;
  }
  const dg_cuda_model_desc *d = &c->m->d;
  CKK(c, k_vocab_z(c->stream, c->logits, (size_t)d->canvas * d->vocab, c->lg_cap, c->lg_T));
  logits_written(c, 0.0f);
  return DG_OK;
}

/* soft [C, H] = embed_scale * P . E with P = cast(softmax(cast(z))) (spec 5, 4.9); virt (the fused chain; z =
 * c->logits): P of c->logits's virtual z, from the logits in registers after the passes k_vocab_stats left undone.
 * With c->sc_group > 0 and z = c->logits, P is written over the logits (common.cuh) in groups of sc_group rows
 * (each row's values those of one group: a row's passes read only its own z and partials), so z is dead after
 * it (the caller marks it: lg_dead). Launches only (a graph body's part where virt = 0). */
static dg_status soft_from_v(dg_cuda_ctx *c, const float *z, int virt) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (c->sc_group && z != c->logits)
    return dg_seterr(DG_ERR_BACKEND, "soft_from_v: P is written over c->logits, so z must be c->logits");
  if (virt && c->sc_group)
    CKK(c, k_vocab_sc_g(c->stream, z, c->P, d->canvas, d->vocab, c->lg_cap, c->lg_T, d->act_dtype, c->vws,
                        c->lg_parts, c->sc_group));
  else if (virt)
    CKK(c, k_vocab_sc(c->stream, z, c->P, d->canvas, d->vocab, c->lg_cap, c->lg_T, d->act_dtype, c->vws,
                      c->lg_parts));
  else if (c->sc_group)
    CKK(c, k_sc_probs_g(c->stream, z, c->P, d->canvas, d->vocab, d->act_dtype, c->vws, c->sc_group));
  else
    CKK(c, k_sc_probs(c->stream, z, c->P, d->canvas, d->vocab, d->act_dtype, c->vws));
  const float alpha = d->embed_scale, beta = 0.0f;
  if (c->m->embed.bits) { /* quantized tied embedding: P . E with E dequantized in the kernel */
    CKK(c, k_qsoft(c->stream, c->P, d->canvas, &c->m->embed, alpha, c->soft));
    c->have_soft = 1;
    return DG_OK;
  }
  /* column-major view: soft^T [H, C] = E^T [H, V] . P^T [V, C] */
  CK(dg_initcheck_clear(c->stream, c->soft, (size_t)d->hidden, (size_t)d->hidden, (size_t)d->canvas));
  dg_status st;
  if (gemm_inv(c, 0, d->hidden, d->canvas, d->vocab, alpha, (const bf16 *)c->m->embed.w, c->P, d->vocab, c->soft,
               d->hidden, &st)) { /* DGEMMA_STACK_DENSE=inv */
    DG_TRY(st);
    c->have_soft = 1;
    return DG_OK;
  }
  CKB(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->hidden, d->canvas, d->vocab, &alpha, c->m->embed.w,
                   CUDA_R_16BF, d->hidden, c->P, CUDA_R_16BF, d->vocab, &beta, c->soft, CUDA_R_32F, d->hidden,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  c->have_soft = 1;
  return DG_OK;
}

dg_status soft_from(dg_cuda_ctx *c, const float *z) { return soft_from_v(c, z, 0); }

extern "C" dg_status dg_cuda_soft_from_z(dg_cuda_ctx *c) {
  CK(cudaSetDevice(c->m->device));
  DG_TRY(logits_alive(c, "dg_cuda_soft_from_z"));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  DG_TRY(soft_from_v(c, c->logits, c->lg_virt));
  if (c->lg_virt) c->lg_parts = 2; /* the passes it ran left the maxima and sums */
  if (c->sc_group) c->lg_dead = 1;  /* P over the logits */
  return mark(c, DG_CUDA_ST_SC);
}

/* The decoder's device work over the whole canvas up to the last layer (spec 4.8, 4.4), from the ids in
 * c->ids: c->x [C, H] = layers(post_norm(embed(canvas) + SC_MLP(pre_norm(soft)))), the SC term only with
 * DG_SC_KEPT (c->soft on the device; a zero signal adds exactly zero, so DG_SC_NONE skips it). Launches only
 * (a graph body's part, graph.cu). */
dg_status decoder_body(dg_cuda_ctx *c, int32_t pos0, dg_sc_source sc) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int T = d->canvas, H = d->hidden;
  cudaStream_t s = c->stream;
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

/* What a decoder pass's host side does before its device work: the canvas's K/V slots noted, its ids uploaded
 * into c->ids. */
dg_status decoder_upload(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0) {
  const int T = c->m->d.canvas;
  note_written(c, pos0, pos0 + T); /* the canvas slots */
  CK(cudaMemcpyAsync(c->ids, canvas, (size_t)T * 4, cudaMemcpyHostToDevice, c->stream));
  return DG_OK;
}

/* The decoder over the whole canvas up to the last layer into c->x [C, H]: decoder_upload, decoder_body. */
dg_status decoder_layers(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc) {
  DG_TRY(decoder_upload(c, canvas, pos0));
  return decoder_body(c, pos0, sc);
}

/* The device work of dg_cuda_decode (a graph body): with DG_SC_HOST the soft embedding from the uploaded
 * logits in c->logits first, the decoder, the final norm, tied LM head and softcap (spec 4.7) into
 * c->logits [C, V]. */
typedef struct decode_arg {
  int32_t pos0;
  dg_sc_source sc; /* as dg_cuda_decode's */
  int raw;         /* no softcap: the fused chain applies it in registers */
} decode_arg;

static dg_status decode_body(dg_cuda_ctx *c, const void *arg) {
  const decode_arg *a = (const decode_arg *)arg;
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int T = d->canvas, H = d->hidden;
  cudaStream_t s = c->stream;
  dg_sc_source sc = a->sc;
  if (sc == DG_SC_HOST) {
    DG_TRY(soft_from(c, c->logits));
    DG_TRY(mark(c, DG_CUDA_ST_SC));
    sc = DG_SC_KEPT;
  }
  DG_TRY(decoder_body(c, a->pos0, sc));
  CKK(c, k_rmsnorm(s, c->x, m->final_norm, NULL, c->a, T, H, d->eps));
  DG_TRY(wmatmul(c, c->a, H, T, &m->embed, c->logits, d->vocab));
  if (d->softcap > 0.0f && !a->raw) CKK(c, k_softcap(s, c->logits, (size_t)T * d->vocab, d->softcap));
  return mark(c, DG_CUDA_ST_HEAD);
}

extern "C" dg_status dg_cuda_decode(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc,
                                    const float *sc_logits, float *logits_out) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int T = d->canvas;
  cudaStream_t s = c->stream;
  if (pos0 < 0 || pos0 > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA decode: canvas at position %d is past the context capacity %d", pos0,
                     c->cap);
  if (sc == DG_SC_KEPT && !c->have_soft) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA decode: no soft embedding on the device");
  CK(cudaSetDevice(m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  /* host side: the uploads (outside any graph: a graph replays no host memory), then the device work */
  if (sc == DG_SC_HOST) {
    CK(cudaMemcpyAsync(c->logits, sc_logits, (size_t)T * d->vocab * 4, cudaMemcpyHostToDevice, s));
    c->have_soft = 1; /* soft_from in the body */
  }
  DG_TRY(decoder_upload(c, canvas, pos0));
  /* the fused chain (and zstore): the softcap left to the sampler's kernels unless the logits go to the host */
  const int raw = vocab_mode_now() && !logits_out && d->softcap > 0.0f;
  const decode_arg a = {pos0, sc, raw};
  const dg_graph_key key = {raw ? DG_GRAPH_DECODE_RAW : DG_GRAPH_DECODE, (int32_t)sc, T, T};
  DG_TRY(graph_run(c, &key, pos0, decode_body, &a));
  logits_written(c, raw ? d->softcap : 0.0f);
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
  DG_TRY(logits_alive(c, "dg_cuda_step_stats"));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  if (mode == DG_PROPOSAL_REPLAY_UNIFORM) CK(cudaMemcpyAsync(c->uni, uni, (size_t)C * 4, cudaMemcpyHostToDevice, s));
  *c->h_bad = INT32_MAX;
  CK(cudaMemcpyAsync(c->bad, c->h_bad, 4, cudaMemcpyHostToDevice, s));
  const int vocab_mode = vocab_mode_now();
  if (vocab_mode) {
    /* z of the logits as they are: a z already virtual (statistics twice on one pass) is made real first, as the
     * chain's second division would divide it in place (a stored z is real: its cap counts as 0) */
    if (c->lg_virt && (c->lg_T != 1.0f || c->lg_cap < 0.0f)) DG_TRY(logits_materialize(c));
    const int store = vocab_mode == 2;
    CKK(c, k_vocab_stats(s, c->logits, C, d->vocab, c->lg_cap, temperature, d->act_dtype, mode, seed, (uint32_t)block,
                         (uint32_t)step, c->uni, c->stats, c->bad, c->vws, store));
    c->lg_virt = 1;
    c->lg_cap = store ? DG_VZ_STORED : c->lg_cap; /* zstore: c->logits holds z, the partials are of that z */
    c->lg_T = store ? 1.0f : temperature;
    c->lg_parts = mode == DG_PROPOSAL_ARGMAX ? 1 : 2;
  } else {
    DG_TRY(logits_materialize(c)); /* (never virtual without the fused chain) */
    CKK(c, k_step_stats(s, c->logits, C, d->vocab, temperature, mode, seed, (uint32_t)block, (uint32_t)step, c->uni,
                        c->stats, c->bad, c->vws));
  }
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

