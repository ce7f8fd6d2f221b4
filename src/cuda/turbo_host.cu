/* turbo_host.cu: the host side of the turbo engine's passes on the device
 * (spec 7; the engine is src/sample/turbo.c, the kernels turbo.cu): decoder passes
 * with the LM head on chosen rows (dg_cuda_decode_rows), the compacted pass
 * (dg_cuda_compact), the device top-K and self-conditioning rows, and their
 * buffers (interface: backend.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

/* ---- turbo engine (spec 7; host engine src/sample/turbo.c, kernels turbo.cu) -------------- */

/* DGEMMA_SC_PROBS (host.cuh sc_probs_now): "row" the one-block-per-row kernel, else the table kernels. */
static int sc_probs_override = -1;
static const int sc_probs_env = (int)dg_sw_get(DG_SW_SC_PROBS); /* "row" 0, unset 1 (backend/switches.c) */
int sc_probs_now(void) { return sc_probs_override >= 0 ? sc_probs_override : sc_probs_env; }
void dg_cuda_sc_probs_set(int mode) { sc_probs_override = mode < 0 ? -1 : mode != 0; }

static void turbo_topk_free(dg_cuda_turbo *t) {
  cudaFree(t->kblk);
  t->kblk = NULL;
  t->cv = t->candv = t->val = t->p = NULL;
  t->ci = t->candi = t->idx = t->bad = NULL;
  t->K = t->klast = 0;
}

void turbo_free(dg_cuda_ctx *c) {
  dg_cuda_turbo *t = c->tb;
  if (!t) return;
  turbo_topk_free(t);
  cudaFree(t->iblk);
  cudaFree(t->sblk);
  cudaFree(t->pblk);
  if (t->sc_ev) cudaEventDestroy(t->sc_ev);
  if (t->tk_ev) cudaEventDestroy(t->tk_ev);
  free(t->h_pos);
  free(t);
  c->tb = NULL;
}

dg_status turbo_bufs(dg_cuda_ctx *c, int32_t K) {
  const size_t C = c->m->d.canvas, V = c->m->d.vocab, T = c->tmax;
  if (!c->tb) {
    dg_cuda_turbo *t = (dg_cuda_turbo *)calloc(1, sizeof *t);
    if (!t) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
    c->tb = t;
    dg_status st = (t->h_pos = (int32_t *)malloc(T * 4)) ? DG_OK : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st == DG_OK)
      st = carve_block(&t->iblk, "the turbo positions and rows", [&](carver *cv) {
        carve_to(cv, t->pos, T * 4);
        carve_to(cv, t->cpos, T * 4);
        carve_to(cv, t->rows, C * 4);
        carve_to(cv, t->pmax, C * dg_scp_chunks((int)V) * 4);
        carve_to(cv, t->psum, C * 16 * 8);
      });
    if (st == DG_OK && c->sc_group) /* P of its own: c->P runs into the logits (common.cuh) */
      st = carve_block(&t->pblk, "the turbo self-conditioning probabilities",
                       [&](carver *cv) { carve_to(cv, t->P, C * V * 2); });
    else
      t->P = c->P;
    if (st) {
      turbo_free(c);
      return st;
    }
  }
  dg_cuda_turbo *t = c->tb;
  if (K > t->K) {
    turbo_topk_free(t);
    const size_t nC = (V + 63) / 64, nsel = (size_t)K < nC ? (size_t)K : nC;
    DG_TRY(carve_block(&t->kblk, "the turbo top-K buffers", [&](carver *cv) {
      carve_to(cv, t->cv, C * nC * 4); /* chunk maxima */
      carve_to(cv, t->ci, C * nC * 4);
      carve_to(cv, t->candv, C * nsel * 64 * 4); /* top-K candidates */
      carve_to(cv, t->candi, C * nsel * 64 * 4);
      carve_to(cv, t->val, C * (size_t)K * 4);
      carve_to(cv, t->idx, C * (size_t)K * 4);
      carve_to(cv, t->p, C * (size_t)K * 4);
      carve_to(cv, t->bad, (C + 1) * 4); /* flags */
    }));
    t->K = K; /* only when it succeeded: a later call retries */
  }
  return DG_OK;
}

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

/* The device work of the LM head without softcap on the n rows t->rows[] (device, indices into c->x, uploaded by
 * head_upload): gather, final norm, tied embedding -> c->logits [n, V]. Launches only (a graph body's part). */
static dg_status head_body(dg_cuda_ctx *c, int32_t n) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  cudaStream_t s = c->stream;
  if (n <= 0) return DG_OK;
  CKK(c, k_gather_rows(s, c->u, c->x, c->tb->rows, n, d->hidden));
  CKK(c, k_rmsnorm(s, c->u, m->final_norm, NULL, c->a, n, d->hidden, d->eps));
  DG_TRY(wmatmul(c, c->a, d->hidden, n, &m->embed, c->logits, d->vocab));
  return DG_OK;
}

/* The LM head's host side before its device work: rows[n] (host) into t->rows, and the count of raw rows the
 * pass leaves. */
static dg_status head_upload(dg_cuda_ctx *c, const int32_t *rows, int32_t n) {
  dg_cuda_turbo *t = c->tb;
  t->nraw = n;
  if (n > 0) CK(cudaMemcpyAsync(t->rows, rows, (size_t)n * 4, cudaMemcpyHostToDevice, c->stream));
  return DG_OK;
}

/* The raw logits of the last pass's n head rows to raw_out (host) if not NULL (synchronous). */
static dg_status head_out(dg_cuda_ctx *c, int32_t n, float *raw_out) {
  if (!raw_out || n <= 0) return DG_OK;
  CK(cudaMemcpyAsync(raw_out, c->logits, (size_t)n * c->m->d.vocab * 4, cudaMemcpyDeviceToHost, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

/* The device work of dg_cuda_decode_rows (a graph body). */
typedef struct rows_arg {
  int32_t pos0, n;
  dg_sc_source sc; /* DG_SC_NONE or DG_SC_KEPT */
} rows_arg;

static dg_status rows_body(dg_cuda_ctx *c, const void *arg) {
  const rows_arg *a = (const rows_arg *)arg;
  DG_TRY(decoder_body(c, a->pos0, a->sc));
  DG_TRY(head_body(c, a->n));
  return mark(c, DG_CUDA_ST_HEAD);
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
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  DG_TRY(turbo_bufs(c, 0));
  DG_TRY(turbo_soft_in(c, &sc, soft));
  DG_TRY(decoder_upload(c, canvas, pos0));
  DG_TRY(head_upload(c, rows, n));
  const rows_arg a = {pos0, n, sc};
  const dg_graph_key key = {DG_GRAPH_ROWS, (int32_t)sc, T, n};
  DG_TRY(graph_run(c, &key, pos0, rows_body, &a));
  logits_written(c, 0.0f); /* raw rows, no z of the reference sampler's */
  return head_out(c, n, raw_out);
}

/* The device work of dg_cuda_compact (a graph body): the forward set's ids in c->ids, absolute positions in
 * t->pos, canvas positions in t->cpos (with DG_SC_KEPT), LM-head rows in t->rows. */
typedef struct compact_arg {
  int32_t pos0, n, nh;
  dg_sc_source sc; /* DG_SC_NONE or DG_SC_KEPT */
} compact_arg;

static dg_status compact_body(dg_cuda_ctx *c, const void *arg) {
  const compact_arg *a = (const compact_arg *)arg;
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int H = d->hidden, n = a->n;
  cudaStream_t s = c->stream;
  dg_cuda_turbo *t = c->tb;
  CKK(c, k_embed(s, c->x, &m->embed, c->ids, n, H, d->embed_scale));
  DG_TRY(mark(c, DG_CUDA_ST_EMBED_NORM));
  if (a->sc == DG_SC_KEPT) { /* SC rows of the forward set's canvas positions (spec 4.8, 5) */
    CKK(c, k_gather_rows(s, c->u, c->soft, t->cpos, n, H));
    CKK(c, k_rmsnorm(s, c->u, m->sc_pre_norm, NULL, c->a, n, H, d->eps));
    DG_TRY(geglu_mlp(c, c->a, n, &m->sc_gate_up, &m->sc_down, c->f1));
    CKK(c, k_add(s, c->x, c->f1, (size_t)n * H));
    DG_TRY(mark(c, DG_CUDA_ST_SC));
  }
  CKK(c, k_rmsnorm(s, c->x, NULL, c->x, NULL, n, H, d->eps));
  for (int li = 0; li < d->n_layers; li++) DG_TRY(layer_at(c, li, n, a->pos0, 0, t->pos));
  DG_TRY(head_body(c, a->nh));
  return mark(c, DG_CUDA_ST_HEAD);
}

extern "C" dg_status dg_cuda_compact(dg_cuda_ctx *c, const int32_t *tok, const int32_t *pos, int32_t n, int32_t pos0,
                                     dg_sc_source sc, const float *soft, const int32_t *head, int32_t nh, float *raw_out) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  const int C = d->canvas;
  cudaStream_t s = c->stream;
  if (pos0 < 0 || pos0 > c->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "CUDA compacted pass: canvas at position %d is past the context capacity %d",
                     pos0, c->cap);
  if (n < 1 || n > C || n > c->tmax || nh < 0 || nh > C)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA compacted pass: forward set %d / head rows %d outside [1, %d]", n, nh, C);
  CK(cudaSetDevice(m->device));
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  DG_TRY(turbo_bufs(c, 0));
  dg_cuda_turbo *t = c->tb;
  DG_TRY(turbo_soft_in(c, &sc, soft));
  /* the forward set at absolute positions pos0 + pos[t]; its K/V land in those cache slots,
   * which are the canvas K/V buffer of spec 7.4 (slots of rows not forwarded keep their last K/V) */
  note_written(c, pos0, pos0 + C);
  for (int32_t i = 0; i < n; i++) t->h_pos[i] = pos0 + pos[i];
  CK(cudaMemcpyAsync(t->pos, t->h_pos, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(c->ids, tok, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  if (sc == DG_SC_KEPT) CK(cudaMemcpyAsync(t->cpos, pos, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  DG_TRY(head_upload(c, head, nh));
  /* a turbo shape bucket (turbo_bucket: n and nh padded) is one key; its graph is replayed at every step of the
   * block after the first two */
  const compact_arg a = {pos0, n, nh, sc};
  const dg_graph_key key = {DG_GRAPH_COMPACT, (int32_t)sc, n, nh};
  DG_TRY(graph_run(c, &key, pos0, compact_body, &a));
  logits_written(c, 0.0f);
  return head_out(c, nh, raw_out);
}

size_t ctx_blas_ws_bytes(const dg_cuda_ctx *c); /* context.cu */

/* Step `step` (0..4) of a canvas's SC rows of a stack on w->stream: 0 its n kept soft rows (c_soft at the canvas
 * positions cpos[n], device) gathered into w->u + r0 and pre-normed into w->a + r0; 1-3 the SC MLP's launches
 * (geglu_step 0-2; intermediates gu, h) into w->f1 + r0; 4 that added to w->x + r0 (r0 in elements: the canvas's first
 * row x H). Steps 0..4 in a row are the operations of compact_stack's per-canvas loop. */
static dg_status sc_rows_step(dg_cuda_ctx *w, int step, const float *c_soft, const int32_t *cpos, int32_t n, size_t r0,
                              float *gu, bf16 *h) {
  const dg_cuda_model *m = w->m;
  const int H = m->d.hidden;
  if (step == 0) {
    CKK(w, k_gather_rows(w->stream, w->u + r0, c_soft, cpos, n, H));
    CKK(w, k_rmsnorm(w->stream, w->u + r0, m->sc_pre_norm, NULL, w->a + r0, n, H, m->d.eps));
  }
  if (step >= 1 && step <= 3)
    DG_TRY(geglu_step(w, step - 1, w->a + r0, n, &m->sc_gate_up, &m->sc_down, w->f1 + r0, gu, h));
  if (step == 4) CKK(w, k_add(w->stream, w->x + r0, w->f1 + r0, (size_t)n * H));
  return DG_OK;
}

/* Step `step` (0, 1) of a canvas's LM head of a stack on w->stream: 0 its n rows of w->x (rows[n]: device indices)
 * gathered into u [n, H] and final-normed into a [n, H]; 1 a times the tied embedding into logits [n, V]
 * (compact_stack's per-canvas loop). */
static dg_status head_rows_step(dg_cuda_ctx *w, int step, const int32_t *rows, int32_t n, float *u, bf16 *a,
                                float *logits) {
  const dg_cuda_model *m = w->m;
  const int H = m->d.hidden;
  if (step == 0) {
    CKK(w, k_gather_rows(w->stream, u, w->x, rows, n, H));
    CKK(w, k_rmsnorm(w->stream, u, m->final_norm, NULL, a, n, H, m->d.eps));
  }
  if (step == 1) DG_TRY(wmatmul(w, a, H, n, &m->embed, logits, m->d.vocab));
  return DG_OK;
}

/* One stack of a compacted batch: canvases q[0..B) whose forward sets (N rows in all) fit work's tmax rows.
 * Rows of canvas b: [off_b, off_b + n_b) of the stack, in the order of its forward set. */
static dg_status compact_stack(dg_cuda_ctx *w, const dg_cuda_cseq *q, int32_t B, int32_t N) {
  const dg_cuda_model *m = w->m;
  const dg_cuda_model_desc *d = &m->d;
  const int H = d->hidden;
  cudaStream_t s = w->stream;
  dg_cuda_turbo *t = w->tb;
  dg_cuda_seg seg[DG_CUDA_MAX_STACK];
  DG_TRY(seg_ready(w)); /* DGEMMA_SEG_STREAMS: the per-canvas streams, made with the context's first stack */
  DG_TRY(mark(w, DG_CUDA_ST_HOST)); /* (w->prof: the lead canvas's record of stacked passes, prof_stack_begin) */
  for (int32_t b = 0, off = 0; b < B; off += q[b].n, b++) {
    for (int32_t i = 0; i < q[b].n; i++) t->h_pos[off + i] = q[b].pos0 + q[b].pos[i];
    CK(cudaMemcpyAsync(w->ids + off, q[b].tok, (size_t)q[b].n * 4, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(t->cpos + off, q[b].pos, (size_t)q[b].n * 4, cudaMemcpyHostToDevice, s));
    seg[b] = (dg_cuda_seg){off, q[b].n, q[b].c->kc, q[b].c->vc, q[b].c->S, q[b].c->S_ring, q[b].pos0, t->pos + off};
    note_written(q[b].c, q[b].pos0, q[b].pos0 + d->canvas);
  }
  CK(cudaMemcpyAsync(t->pos, t->h_pos, (size_t)N * 4, cudaMemcpyHostToDevice, s));
  CKK(w, k_embed(s, w->x, &m->embed, w->ids, N, H, d->embed_scale));
  DG_TRY(mark(w, DG_CUDA_ST_EMBED_NORM));
  /* SC rows per canvas, from its own kept rows (as dg_cuda_compact: the MLP over that canvas's rows); with
   * DGEMMA_STACK_DENSE (1 or inv) the MLP once over each run of consecutive canvases with kept rows */
  const int stacked = stack_dense_now() != 0;
  /* DGEMMA_SEG_STREAMS: each canvas's SC rows (gather, norm, MLP, add: its rows only) on its stream, its MLP's
   * intermediates at its own offsets (passes.cu seg_pack), joined before the embeddings' norm over all rows */
  const size_t I = (size_t)d->inter;
  size_t go[DG_CUDA_MAX_STACK], ho[DG_CUDA_MAX_STACK];
  int nn[DG_CUDA_MAX_STACK], nsc = 0;
  for (int32_t b = 0; b < B; b++) {
    nn[b] = q[b].sc == DG_SC_KEPT ? q[b].n : 0;
    nsc += q[b].sc == DG_SC_KEPT;
  }
  const int seg_sc = !stacked && nsc > 1 && seg_on(w, B) && seg_pack(nn, B, 2 * I, 64, (size_t)w->tmax * 2 * I, go) &&
                     seg_pack(nn, B, I, 128, (size_t)w->tmax * I, ho);
  if (seg_sc) {
    DG_TRY(seg_fork(w, B, ctx_blas_ws_bytes(w)));
    dg_status st = DG_OK;
    for (int step = 0; step < 5 && !st; step++) /* step by step (passes.cu) */
      for (int32_t b = 0; b < B && !st; b++) {
        if (q[b].sc != DG_SC_KEPT) continue;
        st = seg_to(w, b);
        if (!st)
          st = sc_rows_step(w, step, q[b].c->soft, t->cpos + seg[b].r0, q[b].n, (size_t)seg[b].r0 * H, w->gu + go[b],
                            w->h + ho[b]);
      }
    const dg_status sj = seg_join(w);
    DG_TRY(st);
    DG_TRY(sj);
    for (int32_t b = 0; b < B; b++)
      if (q[b].sc == DG_SC_KEPT) DG_TRY(mark(w, DG_CUDA_ST_SC)); /* one mark per canvas, as unstacked */
  }
  for (int32_t b = 0; !seg_sc && b < B; b++) {
    if (q[b].sc != DG_SC_KEPT) continue;
    const size_t r0 = (size_t)seg[b].r0 * H;
    CKK(w, k_gather_rows(s, w->u + r0, q[b].c->soft, t->cpos + seg[b].r0, q[b].n, H));
    CKK(w, k_rmsnorm(s, w->u + r0, m->sc_pre_norm, NULL, w->a + r0, q[b].n, H, d->eps));
    int32_t e = b + 1; /* the run [b, e) whose MLP runs here */
    if (stacked)
      while (e < B && q[e].sc == DG_SC_KEPT) {
        const size_t e0 = (size_t)seg[e].r0 * H;
        CKK(w, k_gather_rows(s, w->u + e0, q[e].c->soft, t->cpos + seg[e].r0, q[e].n, H));
        CKK(w, k_rmsnorm(s, w->u + e0, m->sc_pre_norm, NULL, w->a + e0, q[e].n, H, d->eps));
        e++;
      }
    const int32_t rows = seg[e - 1].r0 + q[e - 1].n - seg[b].r0;
    DG_TRY(geglu_mlp(w, w->a + r0, rows, &m->sc_gate_up, &m->sc_down, w->f1 + r0));
    CKK(w, k_add(s, w->x + r0, w->f1 + r0, (size_t)rows * H));
    for (int32_t i = b; i < e; i++) DG_TRY(mark(w, DG_CUDA_ST_SC)); /* one mark per canvas, as unstacked */
    b = e - 1;
  }
  CKK(w, k_rmsnorm(s, w->x, NULL, w->x, NULL, N, H, d->eps));
  for (int li = 0; li < d->n_layers; li++) {
    DG_TRY(layer_segs(w, li, N, seg, B, 0));
    DG_TRY(prof_stack_layer(w, li)); /* profiling: this layer's rows per expert */
  }
  /* the LM head of each canvas's head rows, into its own logits (head_upload and head_body's operations); with
   * DGEMMA_STACK_DENSE (1 or inv) once over the stack's head rows (all canvases', in canvas order), in chunks of up
   * to C rows (w's logits), each chunk's rows then copied into their canvases' logits (a chunk may end inside a
   * canvas: the products' rows do not depend on the chunk) */
  if (stacked) {
    int32_t NH = 0;
    for (int32_t b = 0; b < B; b++) {
      for (int32_t i = 0; i < q[b].nh; i++) t->h_pos[NH + i] = seg[b].r0 + q[b].head[i];
      NH += q[b].nh;
      q[b].c->tb->nraw = q[b].nh;
    }
    for (int32_t a = 0; a < NH; a += d->canvas) {
      const int32_t L = NH - a < d->canvas ? NH - a : d->canvas;
      /* from pageable memory: staged before the call returns (each chunk its own slice of h_pos anyway) */
      CK(cudaMemcpyAsync(t->rows, t->h_pos + a, (size_t)L * 4, cudaMemcpyHostToDevice, s));
      CKK(w, k_gather_rows(s, w->u, w->x, t->rows, L, H));
      CKK(w, k_rmsnorm(s, w->u, m->final_norm, NULL, w->a, L, H, d->eps));
      DG_TRY(wmatmul(w, w->a, H, L, &m->embed, w->logits, d->vocab));
      for (int32_t b = 0, s0 = 0; b < B; s0 += q[b].nh, b++) { /* canvas b's head rows are [s0, s0 + nh) */
        const int32_t lo = s0 > a ? s0 : a, hi = s0 + q[b].nh < a + L ? s0 + q[b].nh : a + L;
        if (lo < hi)
          CK(cudaMemcpyAsync(q[b].c->logits + (size_t)(lo - s0) * d->vocab, w->logits + (size_t)(lo - a) * d->vocab,
                             (size_t)(hi - lo) * d->vocab * 4, cudaMemcpyDeviceToDevice, s));
      }
    }
    for (int32_t b = 0; b < B; b++)
      if (q[b].raw_out && q[b].nh > 0)
        CK(cudaMemcpyAsync(q[b].raw_out, q[b].c->logits, (size_t)q[b].nh * d->vocab * 4, cudaMemcpyDeviceToHost, s));
  }
  /* DGEMMA_SEG_STREAMS: each canvas's head (gather, final norm, LM head into its own logits) on its stream, its rows
   * at its own offsets of w->segs.rows, w->u and w->a, joined before the raw rows go to the host */
  int nh[DG_CUDA_MAX_STACK], nhead = 0;
  size_t ro[DG_CUDA_MAX_STACK], uo[DG_CUDA_MAX_STACK], ao[DG_CUDA_MAX_STACK];
  for (int32_t b = 0; b < B; b++) {
    nh[b] = q[b].nh;
    nhead += q[b].nh > 0;
  }
  const int seg_head = !stacked && nhead > 1 && seg_on(w, B) && seg_pack(nh, B, 1, 1, (size_t)w->tmax, ro) &&
                       seg_pack(nh, B, (size_t)H, 64, (size_t)w->tmax * H, uo) &&
                       seg_pack(nh, B, (size_t)H, 128, (size_t)w->tmax * H, ao);
  if (seg_head) {
    int32_t NH = 0;
    for (int32_t b = 0; b < B; b++) {
      for (int32_t i = 0; i < q[b].nh; i++) t->h_pos[ro[b] + i] = seg[b].r0 + q[b].head[i];
      NH = (int32_t)ro[b] + (q[b].nh > 0 ? q[b].nh : 0);
      q[b].c->tb->nraw = q[b].nh;
    }
    /* from pageable memory: staged before the call returns */
    CK(cudaMemcpyAsync(w->segs.rows, t->h_pos, (size_t)NH * 4, cudaMemcpyHostToDevice, s));
    DG_TRY(seg_fork(w, B, ctx_blas_ws_bytes(w)));
    dg_status st = DG_OK;
    for (int step = 0; step < 2 && !st; step++) /* step by step (passes.cu) */
      for (int32_t b = 0; b < B && !st; b++) {
        if (q[b].nh <= 0) continue;
        st = seg_to(w, b);
        if (!st)
          st = head_rows_step(w, step, w->segs.rows + ro[b], q[b].nh, w->u + uo[b], w->a + ao[b], q[b].c->logits);
      }
    const dg_status sj = seg_join(w);
    DG_TRY(st);
    DG_TRY(sj);
    for (int32_t b = 0; b < B; b++)
      if (q[b].raw_out && q[b].nh > 0)
        CK(cudaMemcpyAsync(q[b].raw_out, q[b].c->logits, (size_t)q[b].nh * d->vocab * 4, cudaMemcpyDeviceToHost, s));
  }
  for (int32_t b = 0; !stacked && !seg_head && b < B; b++) {
    dg_cuda_ctx *c = q[b].c;
    c->tb->nraw = q[b].nh;
    if (q[b].nh <= 0) continue;
    for (int32_t i = 0; i < q[b].nh; i++) t->h_pos[i] = seg[b].r0 + q[b].head[i];
    /* from pageable memory: staged before the call returns, so h_pos may be rewritten for the next canvas */
    CK(cudaMemcpyAsync(t->rows, t->h_pos, (size_t)q[b].nh * 4, cudaMemcpyHostToDevice, s));
    CKK(w, k_gather_rows(s, w->u, w->x, t->rows, q[b].nh, H));
    CKK(w, k_rmsnorm(s, w->u, m->final_norm, NULL, w->a, q[b].nh, H, d->eps));
    DG_TRY(wmatmul(w, w->a, H, q[b].nh, &m->embed, c->logits, d->vocab));
    if (q[b].raw_out)
      CK(cudaMemcpyAsync(q[b].raw_out, c->logits, (size_t)q[b].nh * d->vocab * 4, cudaMemcpyDeviceToHost, s));
  }
  DG_TRY(mark(w, DG_CUDA_ST_HEAD));
  CK(cudaStreamSynchronize(s));
  prof_stack_end(w);
  return DG_OK;
}

extern "C" dg_status dg_cuda_compact_batch(dg_cuda_ctx *w, const dg_cuda_cseq *q, int32_t B) {
  const dg_cuda_model_desc *d = &w->m->d;
  const int C = d->canvas;
  if (B < 1) return DG_OK;
  CK(cudaSetDevice(w->m->device));
  DG_TRY(turbo_bufs(w, 0));
  for (int32_t b = 0; b < B; b++) {
    dg_cuda_ctx *c = q[b].c;
    if (c->m != w->m)
      return dg_seterr(DG_ERR_INVALID_ARG, "CUDA compacted batch: canvas %d belongs to another model", b);
    if (q[b].pos0 < 0 || q[b].pos0 > c->cap)
      return dg_seterr(DG_ERR_CONTEXT_FULL,
                       "CUDA compacted batch: canvas %d at position %d is past its context capacity %d", b, q[b].pos0,
                       c->cap);
    if (q[b].n < 1 || q[b].n > C || q[b].n > w->tmax || q[b].nh < 0 || q[b].nh > C)
      return dg_seterr(DG_ERR_INVALID_ARG,
                       "CUDA compacted batch: canvas %d forward set %d / head rows %d outside [1, %d] (work rows %d)", b,
                       q[b].n, q[b].nh, C, w->tmax);
    DG_TRY(turbo_bufs(c, 0));
    logits_written(c, 0.0f); /* the stack writes its raw rows */
    dg_sc_source sc = q[b].sc;
    DG_TRY(turbo_soft_in(c, &sc, q[b].soft));
    /* the canvas's own stream (its kept SC rows, the upload above, its last top-K) done before the work stream
     * reads or writes its buffers */
    CK(cudaStreamSynchronize(c->stream));
  }
  dg_cuda_cseq *qq = (dg_cuda_cseq *)malloc((size_t)B * sizeof *qq);
  if (!qq) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  dg_status st = DG_OK;
  for (int32_t b = 0; b < B; b++) {
    qq[b] = q[b];
    if (qq[b].sc == DG_SC_HOST) qq[b].sc = DG_SC_KEPT; /* uploaded into its c->soft above */
  }
  for (int32_t b0 = 0; b0 < B && !st;) {
    int32_t b1 = b0, N = 0;
    while (b1 < B && b1 - b0 < DG_CUDA_MAX_STACK && N + qq[b1].n <= w->tmax) N += qq[b1++].n;
    /* stage timing: the stack's marks go to the record of its first canvas with profiling on, if any */
    dg_cuda_ctx *lead = NULL;
    for (int32_t b = b0; b < b1 && !lead; b++) lead = qq[b].c->prof ? qq[b].c : NULL;
    st = lead ? prof_stack_begin(w, lead, b1 - b0, N) : DG_OK;
    if (!st) st = compact_stack(w, qq + b0, b1 - b0, N);
    w->prof = NULL; /* never w's own: the lead's record stays the lead's */
    b0 = b1;
  }
  free(qq);
  /* a stack that failed may have kernels queued that write the canvases' caches and logits: let them finish before
   * the caller frees or reuses those contexts */
  if (st) (void)cudaStreamSynchronize(w->stream);
  return st;
}

extern "C" dg_status dg_cuda_raw_rows(dg_cuda_ctx *c, int32_t n, float *raw_out) {
  if (!c->tb || n < 0 || n > c->tb->nraw)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA: %d raw logit rows asked, %d on the device", n, c->tb ? c->tb->nraw : 0);
  DG_TRY(logits_alive(c, "dg_cuda_raw_rows"));
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
  DG_TRY(logits_alive(c, "dg_cuda_topk"));
  CK(cudaSetDevice(c->m->device));
  DG_TRY(turbo_bufs(c, K));
  dg_cuda_turbo *t = c->tb;
  cudaStream_t s = c->stream;
  if (n == 0) return DG_OK;
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  t->klast = K;
  *c->h_bad = INT32_MAX;
  CK(cudaMemcpyAsync(t->bad, c->h_bad, 4, cudaMemcpyHostToDevice, s));
  CKK(c, k_topk_hier(s, c->logits, n, d->vocab, K, t->cv, t->ci, t->candv, t->candi, t->val, t->idx, t->bad));
  CK(cudaMemcpyAsync(c->h_bad, t->bad, 4, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(val, t->val, (size_t)n * K * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(idx, t->idx, (size_t)n * K * 4, cudaMemcpyDeviceToHost, s));
  DG_TRY(mark(c, DG_CUDA_ST_STATS)); /* the turbo engine's top-K: its sampler statistics */
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

/* P [n, V] (bf16) = the exact self-conditioning probabilities of canvas c's first n raw rows at temperature T, on
 * x's stream (x: c, or a batch's work context): the table kernels, or with DGEMMA_SC_PROBS=row the row kernel (the
 * same words). */
static dg_status sc_probs_one(dg_cuda_ctx *x, dg_cuda_ctx *c, bf16 *P, int32_t n, float cap, float T) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (!sc_probs_now()) {
    CKK(x, k_turbo_sc_probs(x->stream, c->logits, P, n, d->vocab, cap, T, d->act_dtype));
    return DG_OK;
  }
  dg_tb_tab tab = {};
  tab.B = 1;
  tab.row0[1] = n;
  tab.s[0] = (dg_tb_seg){c->logits, P, c->tb->pmax, c->tb->psum, T};
  CKK(x, k_turbo_sc_probs_tab(x->stream, &tab, d->vocab, cap, d->act_dtype));
  return DG_OK;
}

/* out [n, H] (fp32) = embed_scale * P . E for P [n, V] (bf16), on x's stream, cuBLAS handle and workspace: the
 * dequantizing kernel for a quantized embedding, else DGEMMA_STACK_DENSE=inv's algorithm for the shape, else
 * cuBLAS's default. */
static dg_status sc_product(dg_cuda_ctx *x, const bf16 *P, int32_t n, float *out) {
  const dg_cuda_model *m = x->m;
  const dg_cuda_model_desc *d = &m->d;
  const float alpha = d->embed_scale, beta = 0.0f;
  if (m->embed.bits) { /* quantized tied embedding: P . E with E dequantized in the kernel (as soft_from) */
    CKK(x, k_qsoft(x->stream, P, n, &m->embed, alpha, out));
    return DG_OK;
  }
  CK(dg_initcheck_clear(x->stream, out, (size_t)d->hidden, (size_t)d->hidden, (size_t)n));
  dg_status st;
  if (gemm_inv(x, 0, d->hidden, n, d->vocab, alpha, (const bf16 *)m->embed.w, P, d->vocab, out, d->hidden,
               &st)) /* DGEMMA_STACK_DENSE=inv: the shape's invariant algorithm */
    return st;
  CKB(cublasGemmEx(x->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->hidden, n, d->vocab, &alpha, m->embed.w, CUDA_R_16BF,
                   d->hidden, P, CUDA_R_16BF, d->vocab, &beta, out, CUDA_R_32F, d->hidden, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT));
  return DG_OK;
}

/* The top-K mode's rows of canvas c on x's stream: its host probabilities p [n, K] up, then the kernel (its rows
 * already in c->tb->rows). */
static dg_status sc_topk_rows(dg_cuda_ctx *x, dg_cuda_ctx *c, int32_t n, const float *p) {
  const dg_cuda_model *m = c->m;
  const dg_cuda_model_desc *d = &m->d;
  dg_cuda_turbo *t = c->tb;
  if (!t->klast) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning (topk) before dg_cuda_topk");
  if (m->embed.bits) /* k_turbo_sc_topk reads bf16 rows of E */
    return dg_seterr(DG_ERR_UNSUPPORTED_MODEL, "turbo_sc \"topk\" on CUDA needs a bf16 embedding; this model's is "
                                               "quantized (%d bits): use turbo_sc \"exact\" or \"adaptive\"",
                     m->embed.bits);
  CK(cudaMemcpyAsync(t->p, p, (size_t)n * t->klast * 4, cudaMemcpyHostToDevice, x->stream));
  CKK(x, k_turbo_sc_topk(x->stream, t->p, t->idx, t->rows, (const bf16 *)m->embed.w, c->soft, n, t->klast, d->hidden,
                         d->embed_scale));
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
  if (mode != DG_TURBO_SC_EXACT && mode != DG_TURBO_SC_TOPK)
    return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning: unknown mode %d", (int)mode);
  DG_TRY(logits_alive(c, "dg_cuda_turbo_sc"));
  CK(cudaSetDevice(m->device));
  if (n == 0) return DG_OK;
  DG_TRY(mark(c, DG_CUDA_ST_HOST));
  CK(cudaMemcpyAsync(t->rows, rows, (size_t)n * 4, cudaMemcpyHostToDevice, s));
  if (mode == DG_TURBO_SC_EXACT) { /* exact: P of the full rows, soft = scale P . E, scattered to the canvas rows */
    DG_TRY(sc_probs_one(c, c, c->tb->P, n, cap, T));
    DG_TRY(sc_product(c, c->tb->P, n, c->f1));
    CKK(c, k_scatter_rows(s, c->soft, c->f1, t->rows, n, d->hidden));
  } else { /* top-K: the K probabilities of the host chain times the K rows of E */
    DG_TRY(sc_topk_rows(c, c, n, p));
  }
  c->have_soft = 1;
  return mark(c, DG_CUDA_ST_SC);
}

static dg_status sc_exact_make(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, const dg_cuda_screq *q, const int32_t *L,
                               int32_t nl, float cap, int32_t *made);

/* The record a batch's vocabulary work on w's stream marks into: the first profiled canvas's own (NULL: none). */
static dg_cuda_prof *batch_prof(dg_cuda_ctx *const *cs, int32_t B) {
  for (int32_t b = 0; b < B; b++)
    if (cs[b]->prof) return cs[b]->prof;
  return NULL;
}

extern "C" dg_status dg_cuda_topk_batch(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, int32_t B, const int32_t *n,
                                        const int32_t *K, float *const *val, int32_t *const *idx, int32_t *bad_row,
                                        int32_t *bad_col, dg_status *st, const dg_cuda_screq *pre, float cap) {
  const dg_cuda_model_desc *d = &w->m->d;
  CK(cudaSetDevice(w->m->device));
  for (int32_t b = 0; b < B; b++) {
    dg_cuda_ctx *c = cs[b];
    if (c->m != w->m) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA top-K batch: canvas %d belongs to another model", b);
    if (!c->tb || n[b] < 0 || n[b] > c->tb->nraw)
      return dg_seterr(DG_ERR_INVALID_ARG, "CUDA top-K batch: canvas %d: %d rows asked, %d raw logit rows on the device",
                       b, n[b], c->tb ? c->tb->nraw : 0);
    if (K[b] < 1 || K[b] > d->vocab)
      return dg_seterr(DG_ERR_INVALID_ARG, "CUDA top-K batch: canvas %d: K = %d outside [1, %d]", b, K[b], d->vocab);
    DG_TRY(logits_alive(c, "dg_cuda_topk_batch"));
    DG_TRY(turbo_bufs(c, K[b]));
    st[b] = DG_OK;
  }
  DG_TRY(turbo_bufs(w, 0));
  cudaStream_t s = w->stream;
  w->prof = batch_prof(cs, B);
  DG_TRY(mark(w, DG_CUDA_ST_HOST));
  for (int32_t b0 = 0; b0 < B;) { /* DG_TB_TAB canvases (with rows) a launch */
    dg_tk_tab tab = {};
    int32_t b = b0;
    for (; b < B && tab.B < DG_TB_TAB; b++) {
      dg_cuda_ctx *c = cs[b];
      dg_cuda_turbo *t = c->tb;
      if (n[b] == 0) continue;
      t->klast = K[b];
      *c->h_bad = INT32_MAX;
      CK(cudaMemcpyAsync(t->bad, c->h_bad, 4, cudaMemcpyHostToDevice, s));
      tab.s[tab.B] = (dg_tk_seg){c->logits, t->cv, t->candv, t->val, t->ci, t->candi, t->idx, t->bad, K[b]};
      tab.row0[tab.B + 1] = tab.row0[tab.B] + n[b];
      tab.B++;
    }
    if (tab.B) CKK(w, k_topk_tab(s, &tab, d->vocab));
    b0 = b;
  }
  for (int32_t b = 0; b < B; b++) {
    if (n[b] == 0) continue;
    dg_cuda_turbo *t = cs[b]->tb;
    CK(cudaMemcpyAsync(cs[b]->h_bad, t->bad, 4, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(val[b], t->val, (size_t)n[b] * K[b] * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(idx[b], t->idx, (size_t)n[b] * K[b] * 4, cudaMemcpyDeviceToHost, s));
  }
  DG_TRY(mark(w, DG_CUDA_ST_STATS)); /* the turbo engine's top-K: its sampler statistics */
  dg_cuda_turbo *wt = w->tb;
  if (!wt->tk_ev) CK(cudaEventCreateWithFlags(&wt->tk_ev, cudaEventDisableTiming));
  CK(cudaEventRecord(wt->tk_ev, s));
  /* ahead: the exact SC products the steps may want, made while the host runs the steps (not scattered: a step
   * that ends its canvas keeps the rows of the step before; dg_cuda_turbo_sc_batch scatters them) */
  int32_t nl = 0, made = 0;
  int32_t *L = pre ? (int32_t *)malloc((size_t)B * sizeof *L) : NULL;
  if (pre && !L) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  for (int32_t b = 0; pre && b < B; b++)
    if (pre[b].mode == DG_TURBO_SC_EXACT && pre[b].n > 0 && pre[b].n <= n[b]) L[nl++] = b;
  dg_status sst = nl > 0 ? sc_exact_make(w, cs, pre, L, nl, cap, &made) : DG_OK;
  if (!sst && nl > 0) sst = mark(w, DG_CUDA_ST_SC);
  if (!sst && nl > 0) { /* a canvas's own stream (a repair forward or commit where its step wants no SC rows:
                         * no dg_cuda_turbo_sc_batch) after the work that reads its logits and writes its f1 / P */
    cudaError_t e = wt->sc_ev ? cudaSuccess : cudaEventCreateWithFlags(&wt->sc_ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(wt->sc_ev, s);
    for (int32_t i = 0; i < nl && e == cudaSuccess; i++) e = cudaStreamWaitEvent(cs[L[i]]->stream, wt->sc_ev, 0);
    if (e != cudaSuccess) sst = dg_seterr(DG_ERR_BACKEND, "CUDA top-K batch: event after the SC rows made ahead: %s", cudaGetErrorString(e));
  }
  free(L);
  w->prof = NULL;
  CK(cudaEventSynchronize(wt->tk_ev));
  if (sst) {
    (void)cudaStreamSynchronize(s);
    return sst;
  }
  for (int32_t b = 0; b < B; b++) {
    if (n[b] == 0 || *cs[b]->h_bad == INT32_MAX) continue;
    int32_t r = *cs[b]->h_bad, col = -1;
    CK(cudaMemcpy(&col, cs[b]->tb->bad + 1 + r, 4, cudaMemcpyDeviceToHost));
    bad_row[b] = r;
    bad_col[b] = col;
    st[b] = DG_ERR_NUMERIC;
  }
  return DG_OK;
}

/* A work context's stacked P rows for `rows` rows (made on first use under DGEMMA_STACK_DENSE 1 / inv). */
static dg_status sc_stack_bufs(dg_cuda_ctx *w, int32_t rows) {
  dg_cuda_turbo *t = w->tb;
  if (rows <= t->pst_rows) return DG_OK;
  cudaFree(t->sblk);
  t->sblk = NULL;
  t->pst_rows = 0;
  const size_t V = w->m->d.vocab;
  DG_TRY(carve_block(&t->sblk, "the stacked self-conditioning probabilities",
                     [&](carver *cv) { carve_to(cv, t->Pst, (size_t)rows * V * 2); }));
  t->pst_rows = rows;
  return DG_OK;
}

/* Whether canvas c's exact SC product for n rows at temperature T was made ahead (sc_exact_make) from its current
 * raw rows (a pass writing its logits forgets it: logits_written). */
static int sc_made(const dg_cuda_ctx *c, int32_t n, float T) {
  const dg_cuda_turbo *t = c->tb;
  return t->sc_pre_n > 0 && t->sc_pre_n == n && !memcmp(&t->sc_pre_T, &T, sizeof T);
}

/* The exact SC products (not scattered) of canvases cs[L[0..nl)] (q[L[i]]: exact mode, n > 0) on w's stream: the
 * probabilities by the table launches (DG_TB_TAB canvases a set) or the row kernel (DGEMMA_SC_PROBS=row), the
 * products per canvas into its own f1 (cuBLAS's choice at its rows), or with DGEMMA_STACK_DENSE 1 / inv over the
 * canvases' rows side by side (w's Pst and f1, up to w->tmax rows in all: a canvas that would not fit is left
 * for a later call). Each canvas made gets tb->sc_pre_* (its rows' place). *made: how many of L, from the front. */
static dg_status sc_exact_make(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, const dg_cuda_screq *q, const int32_t *L,
                               int32_t nl, float cap, int32_t *made) {
  const dg_cuda_model *m = w->m;
  const dg_cuda_model_desc *d = &m->d;
  cudaStream_t s = w->stream;
  dg_cuda_turbo *wt = w->tb;
  const int stacked = stack_dense_now() != 0 && sc_probs_now() && !m->embed.bits;
  *made = 0;
  if (stacked) DG_TRY(sc_stack_bufs(w, w->tmax));
  for (int32_t off = 0; *made < nl;) { /* off: the stacked rows used so far */
    dg_tb_tab tab = {};
    while (*made + tab.B < nl && tab.B < DG_TB_TAB) {
      const int32_t b = L[*made + tab.B];
      if (stacked && off + tab.row0[tab.B] + q[b].n > w->tmax) break;
      dg_cuda_ctx *c = cs[b];
      bf16 *P = stacked ? wt->Pst + (size_t)(off + tab.row0[tab.B]) * d->vocab : c->tb->P;
      tab.s[tab.B] = (dg_tb_seg){c->logits, P, c->tb->pmax, c->tb->psum, q[b].T};
      tab.row0[tab.B + 1] = tab.row0[tab.B] + q[b].n;
      tab.B++;
    }
    if (!tab.B) break; /* stacked and full: the rest later */
    const int32_t R = tab.row0[tab.B];
    if (sc_probs_now()) CKK(w, k_turbo_sc_probs_tab(s, &tab, d->vocab, cap, d->act_dtype));
    for (int32_t i = 0; i < tab.B; i++) {
      const int32_t b = L[*made + i];
      dg_cuda_ctx *c = cs[b];
      dg_cuda_turbo *t = c->tb;
      if (!sc_probs_now()) DG_TRY(sc_probs_one(w, c, c->tb->P, q[b].n, cap, q[b].T));
      if (!stacked) {
        DG_TRY(sc_product(w, c->tb->P, q[b].n, c->f1));
      }
      t->sc_pre_n = q[b].n;
      t->sc_pre_T = q[b].T;
      t->sc_pre_f1 = stacked ? w->f1 + (size_t)(off + tab.row0[i]) * d->hidden : c->f1;
    }
    if (stacked) DG_TRY(sc_product(w, wt->Pst + (size_t)off * d->vocab, R, w->f1 + (size_t)off * d->hidden));
    *made += tab.B;
    off += R;
  }
  return DG_OK;
}

extern "C" dg_status dg_cuda_turbo_sc_batch(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, const dg_cuda_screq *q, int32_t B,
                                            float cap) {
  const dg_cuda_model *m = w->m;
  const dg_cuda_model_desc *d = &m->d;
  CK(cudaSetDevice(m->device));
  DG_TRY(turbo_bufs(w, 0));
  for (int32_t b = 0; b < B; b++) {
    dg_cuda_ctx *c = cs[b];
    dg_cuda_turbo *t = c->tb;
    if (c->m != m) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning batch: canvas %d belongs to another model", b);
    if (!t || q[b].n < 0 || q[b].n > t->nraw || q[b].n > d->canvas)
      return dg_seterr(DG_ERR_INVALID_ARG,
                       "CUDA self-conditioning batch: canvas %d: %d rows asked, %d raw logit rows on the device", b,
                       q[b].n, t ? t->nraw : 0);
    if (q[b].mode != DG_TURBO_SC_EXACT && q[b].mode != DG_TURBO_SC_TOPK)
      return dg_seterr(DG_ERR_INVALID_ARG, "CUDA self-conditioning batch: canvas %d: unknown mode %d", b, (int)q[b].mode);
    DG_TRY(logits_alive(c, "dg_cuda_turbo_sc_batch"));
  }
  cudaStream_t s = w->stream;
  dg_cuda_turbo *wt = w->tb;
  if (!wt->sc_ev) CK(cudaEventCreateWithFlags(&wt->sc_ev, cudaEventDisableTiming));
  int32_t *L = (int32_t *)malloc((size_t)B * 2 * sizeof *L), *U = L + B, nl = 0;
  if (!L) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  w->prof = batch_prof(cs, B);
  dg_status st = mark(w, DG_CUDA_ST_HOST);
  for (int32_t b = 0; b < B && !st; b++) {
    if (q[b].n == 0) continue;
    const cudaError_t e = cudaMemcpyAsync(cs[b]->tb->rows, q[b].rows, (size_t)q[b].n * 4, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) st = dg_seterr(DG_ERR_BACKEND, "CUDA self-conditioning batch: row upload failed: %s", cudaGetErrorString(e));
    else if (q[b].mode == DG_TURBO_SC_TOPK) st = sc_topk_rows(w, cs[b], q[b].n, q[b].p);
    else L[nl++] = b;
  }
  /* the exact rows: those made ahead (dg_cuda_topk_batch) scattered first, then the rest made (the stacked ones
   * from w's row 0 again, after the scatters above them on the stream) and scattered, until none is left */
  while (!st && nl > 0) {
    int32_t nu = 0;
    for (int32_t i = 0; i < nl && !st; i++) {
      dg_cuda_ctx *c = cs[L[i]];
      if (!sc_made(c, q[L[i]].n, q[L[i]].T)) { U[nu++] = L[i]; continue; }
      const cudaError_t e = k_scatter_rows(s, c->soft, c->tb->sc_pre_f1, c->tb->rows, q[L[i]].n, d->hidden);
      if (e != cudaSuccess) st = dg_seterr(DG_ERR_BACKEND, "k_scatter_rows: %s", cudaGetErrorString(e));
      c->tb->sc_pre_n = 0; /* used */
    }
    int32_t made = 0;
    if (!st && nu > 0) st = sc_exact_make(w, cs, q, U, nu, cap, &made);
    if (!st && nu > 0 && made == 0) st = dg_seterr(DG_ERR_BACKEND, "CUDA self-conditioning batch: no room for %d rows", q[U[0]].n);
    memcpy(L, U, (size_t)nu * sizeof *L);
    nl = nu;
  }
  free(L);
  for (int32_t b = 0; b < B; b++)
    if (q[b].n > 0) cs[b]->have_soft = 1;
  if (!st) st = mark(w, DG_CUDA_ST_SC);
  w->prof = NULL;
  /* the canvases' own streams (their repair forwards, commits) after the rows are written */
  cudaError_t e = cudaEventRecord(wt->sc_ev, s);
  for (int32_t b = 0; b < B && e == cudaSuccess; b++) e = cudaStreamWaitEvent(cs[b]->stream, wt->sc_ev, 0);
  if (e != cudaSuccess && !st) st = dg_seterr(DG_ERR_BACKEND, "CUDA self-conditioning batch: cudaEventRecord / cudaStreamWaitEvent failed: %s", cudaGetErrorString(e));
  if (st) (void)cudaStreamSynchronize(s);
  return st;
}
