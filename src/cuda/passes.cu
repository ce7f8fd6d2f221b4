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

/* GeGLU MLP (spec 4.1): out[T, H] = down(gelu(gate a) * up a), a bf16 [T, H]. */
dg_status geglu_mlp(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up,
                           const dg_cuda_w *w_down, float *out) {
  const int H = c->m->d.hidden, I = c->m->d.inter;
  DG_TRY(wsetmatmul(c, a, H, T, w_gate_up, c->gu, 2 * I));
  CKK(c, k_geglu(c->stream, c->gu, c->h, T, I));
  DG_TRY(wmatmul(c, c->h, I, T, w_down, out, H));
  return DG_OK;
}

/* The two branches of a layer concurrent (ffn_branches, below): the default since H200 session 17 (vllm protocol on
 * the 26B, 1,211.3 -> 1,219.7 tok/s alone, 1,221.8 -> 1,234.6 with the zstore chain); DGEMMA_BRANCH=0 runs them one
 * after another. Read once when the library loads; dg_cuda_branch_set overrides it. */
static int branch_from_env(void) { return dg_sw_get(DG_SW_BRANCH) != 0; } /* backend/switches.c */
static const int branch_env = branch_from_env();
static int branch_override = -1;
void dg_cuda_branch_set(int on) { branch_override = on == 0 || on == 1 ? on : -1; }
int dg_cuda_branch_now(void) { return branch_override >= 0 ? branch_override : branch_env; }

/* The dense MLP of layer l (spec 4.4 step 5; its post norm comes with the combine) over the normed rows c->a [T, H]
 * into c->dense [T, H], on c->stream: per canvas sg[g] for ng > 1 (layer_segs), over all T rows for ng = 1. */
static dg_status dense_mlp(dg_cuda_ctx *c, const dg_cuda_layer *l, int T, const dg_cuda_seg *sg, int ng) {
  const size_t H = (size_t)c->m->d.hidden;
  for (int g = 0; g < ng; g++) {
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
size_t ctx_blas_ws_bytes(const dg_cuda_ctx *c); /* context.cu */
size_t ctx_side_ws_bytes(const dg_cuda_ctx *c);

/* c->blas onto stream s and workspace ws of ws_bytes (cublasSetStream resets the workspace to cuBLAS's pool, so
 * the workspace is set again after it): the one-handle branches (DGEMMA_BRANCH_HANDLE=one, c->side.blas NULL). */
static dg_status blas_onto(dg_cuda_ctx *c, cudaStream_t s, void *ws, size_t ws_bytes) {
  cublasStatus_t bs = cublasSetStream(c->blas, s);
#ifndef DG_CUDA_EMU
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(c->blas, ws, ws_bytes);
#else
  (void)ws; (void)ws_bytes;
#endif
  if (bs != CUBLAS_STATUS_SUCCESS)
    return dg_seterr(DG_ERR_BACKEND, "the dense branch's cuBLAS handle onto its stream: %s", cublasGetStatusString(bs));
  return DG_OK;
}

static dg_status ffn_branches(dg_cuda_ctx *c, const dg_cuda_layer *l, int T, const dg_cuda_seg *sg, int ng) {
  if (!c->side.on || c->prof || c->debug_sync) {
    DG_TRY(dense_mlp(c, l, T, sg, ng));
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
  dg_status st = dense_mlp(c, l, T, sg, ng);
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
  for (int g = 0; g < ng; g++)
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
    for (int g = 0; g < nseg; g++) {
      const dg_cuda_seg *q = &sg[g];
      const float *qkv = c->qkv + (size_t)q->r0 * l->n_qkv;
      const float *inv_freq = l->is_full ? m->inv_freq_full : m->inv_freq_sliding;
      const int32_t S = l->is_full ? q->S : q->S_ring;
      if (q->dpos)
        CKK(c, k_qkv_post_at(s, qkv, l->n_qkv, c->q + q->r0 * qrow, q->kc[li], q->vc[li], S, l->q_norm, l->k_norm,
                             inv_freq, q->n, NH, NKV, D, l->has_v, q->dpos, eps));
      else
        CKK(c, k_qkv_post(s, qkv, l->n_qkv, c->q + q->r0 * qrow, q->kc[li], q->vc[li], S, l->q_norm, l->k_norm,
                          inv_freq, q->n, NH, NKV, D, l->has_v, q->pos0, eps));
    }
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
  for (int g = 0; g < ng; g++)
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

