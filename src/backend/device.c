/* device.c: the host side of the CUDA backend, in C (compiled only in builds
 * with CUDA or its emulation). Hands a loaded model's weights to the CUDA
 * upload in the loader's own description (dg_layer, dg_weight: src/base/layer.h,
 * plain C that the .cu files include too) with the dimensions of its config,
 * so that the .cu files never include the CPU-side model headers, and fills
 * the CUDA backend's table (src/backend/backend.h) with the dg_cuda_* entry points. */
#include <omp.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "cuda/backend.h"
#include "base/dg_error.h"
#include "model/model.h"

/* Upload a loaded model's weights to CUDA device `device` (m->dev): the
 * config's dimensions and the model's weights as the loader bound them.
 * Errors: those of dg_cuda_model_new (src/cuda/backend.h). */
static dg_status cu_model_init(dg_model *m, int device) {
  const dg_config *c = &m->cfg;
  dg_cuda_model_desc d = {
      .vocab = c->vocab_size,
      .hidden = c->hidden_size,
      .n_layers = c->n_layers,
      .n_heads = c->n_heads,
      .inter = c->intermediate_size,
      .moe_inter = c->moe_intermediate_size,
      .n_experts = c->n_experts,
      .top_k = c->top_k_experts,
      .window = c->sliding_window,
      .canvas = c->canvas_length,
      .eps = c->rms_norm_eps,
      .softcap = c->final_logit_softcapping,
      .embed_scale = m->embed_scale,
      .act_dtype = m->act_dtype,
      .embed = m->embed,
      .final_norm = m->final_norm,
      .sc_pre_norm = m->sc_pre_norm,
      .sc_gate = m->sc_gate,
      .sc_up = m->sc_up,
      .sc_down = m->sc_down,
      .inv_freq_sliding = m->inv_freq_sliding,
      .inv_freq_full = m->inv_freq_full,
      .layers = m->layers, /* the loader's own layers (src/base/layer.h), as they are */
      .device = device,
  };
  dg_cuda_model *dm = NULL;
  dg_status st = dg_cuda_model_new(&d, &dm);
  m->dev = dm;
  return st;
}

/* ---- the CUDA backend's table (backend.h) ---------------------------------- */

static void cu_model_free(dg_model *m) { dg_cuda_model_free(m->dev); }
static size_t cu_model_bytes(const dg_model *m) { return dg_cuda_model_bytes(m->dev); }

/* Everything lives on the device: no host buffers (rows: the device work
 * buffers hold max(canvas, 256) tokens, and no stacked pass uses more). */
static dg_status cu_ctx_init(dg_context *ctx, int32_t rows) {
  dg_cuda_ctx *c = NULL;
  dg_status st = dg_cuda_ctx_new(ctx->m->dev, ctx->cap, rows, ctx->full_window, &c);
  ctx->dev = c;
  return st;
}
static void cu_ctx_free(dg_context *ctx) { dg_cuda_ctx_free(ctx->dev); }
static dg_status cu_truncate_check(const dg_context *ctx, int32_t len) { return dg_cuda_truncate_check(ctx->dev, len); }
static dg_status cu_ctx_copy(dg_context *dst, const dg_context *src, int32_t n) {
  return dg_cuda_ctx_copy(dst->dev, src->dev, n);
}
static dg_status cu_compact_prepare(dg_context *ctx) {
  (void)ctx; /* the device cache's canvas slots are the canvas K/V buffers */
  return DG_OK;
}

static dg_status cu_encode(dg_context *ctx, const int32_t *ids, int32_t n) {
  DG_TRY(dg_cuda_encode(ctx->dev, ids, n, ctx->len));
  ctx->len += n;
  return DG_OK;
}

static dg_status canvas_fits(const dg_context *ctx) {
  const dg_config *c = &ctx->m->cfg;
  if ((int64_t)ctx->len + c->canvas_length > c->max_position_embeddings)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "canvas positions %d..%d exceed max_position_embeddings %d", ctx->len,
                     ctx->len + c->canvas_length - 1, c->max_position_embeddings);
  return DG_OK;
}

static dg_status cu_decode(dg_context *ctx, const int32_t *canvas, const float *sc_logits, float *logits_out) {
  DG_TRY(canvas_fits(ctx));
  return dg_cuda_decode(ctx->dev, canvas, ctx->len, sc_logits ? DG_SC_HOST : DG_SC_NONE, sc_logits, logits_out);
}

static dg_status cu_step_stats(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, float T, dg_proposal prop,
                               uint64_t seed, int32_t block, int32_t step, const float *uni, float *z,
                               struct dg_pos_stats *ps, int32_t *bad_pos) {
  (void)z; /* z stays on the device for sc_from_z */
  DG_TRY(dg_cuda_decode(ctx->dev, canvas, ctx->len, sc, NULL, NULL));
  return dg_cuda_step_stats(ctx->dev, T, prop, seed, block, step, uni, ps, bad_pos);
}
static size_t cu_step_z_floats(const dg_model *m) { (void)m; return 0; }
static dg_status cu_sc_from_z(dg_context *ctx, const float *z) {
  (void)z;
  return dg_cuda_soft_from_z(ctx->dev);
}

static dg_status cu_decode_rows(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, const float *soft,
                                const int32_t *rows, int32_t n, float *raw, float *hn) {
  (void)hn; /* the head rows stay on the device unless raw is given */
  const dg_config *c = &ctx->m->cfg;
  for (int32_t r = 0; r < n; r++)
    if (rows[r] < 0 || rows[r] >= c->canvas_length)
      return dg_seterr(DG_ERR_INVALID_ARG, "decoder head row %d is outside the canvas [0, %d)", rows[r],
                       c->canvas_length);
  DG_TRY(canvas_fits(ctx));
  for (int i = 0; i < c->canvas_length; i++)
    if (canvas[i] < 0 || canvas[i] >= c->vocab_size)
      return dg_seterr(DG_ERR_INVALID_ARG, "token id %d at position %d is outside the vocabulary [0, %d)", canvas[i], i,
                       c->vocab_size);
  return dg_cuda_decode_rows(ctx->dev, canvas, ctx->len, sc, soft, rows, n, raw);
}

static dg_status cu_compact(const dg_compact_seq *q, dg_sc_source sc) {
  return dg_cuda_compact(q->ctx->dev, q->tok, q->pos, q->n, q->ctx->len, sc, q->soft, q->head, q->nh, q->raw);
}

/* B canvases' compacted passes stacked in work's device buffers (dg_cuda_compact_batch), every canvas checked
 * first; its SC rows: host rows where soft is given, else the device's kept rows where seqs[q].sc says so. */
static dg_status cu_compact_batch(dg_context *work, const dg_compact_seq *seqs, int32_t B) {
  if (B < 1) return dg_seterr(DG_ERR_INVALID_ARG, "compacted batch: %d canvases", B);
  for (int32_t q = 0; q < B; q++) {
    dg_compact_seq s = seqs[q];
    s.hn = NULL; /* the head rows stay on the device unless raw is given (a hidden-state output is ignored) */
    DG_TRY(dg_compact_seq_check(work->m, &s, q, 0));
  }
  dg_cuda_cseq *cq = calloc((size_t)B, sizeof *cq);
  if (!cq) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  for (int32_t q = 0; q < B; q++) {
    const dg_compact_seq *s = &seqs[q];
    cq[q] = (dg_cuda_cseq){s->ctx->dev, s->tok, s->pos, s->n, s->ctx->len,
                           s->soft ? DG_SC_HOST : s->sc == DG_SC_KEPT ? DG_SC_KEPT : DG_SC_NONE,
                           s->soft, s->head, s->nh, s->raw};
  }
  dg_status st = dg_cuda_compact_batch(work->dev, cq, B);
  free(cq);
  return st;
}

/* The head rows' logits stay on the device: no host buffers. */
static void cu_head_plan(const dg_model *m, int32_t K, int32_t R, dg_head_plan *out) {
  (void)m; (void)K; (void)R;
  *out = (dg_head_plan){0, 0, 0, 0};
}

/* The device top-K; only [n, K] comes back, then the caller's per-row work. */
static dg_status cu_head_topk(dg_context *ctx, dg_head_args *a) {
  a->last0 = -1;
  dg_status st = dg_cuda_topk(ctx->dev, a->n, a->K, a->val, a->idx, &a->bad_row, &a->bad_col);
  if (st || !a->on_row) return st;
#pragma omp parallel for num_threads(a->nt) schedule(dynamic)
  for (int32_t r = 0; r < a->n; r++) a->on_row(a->user, r, NULL, 1, omp_get_thread_num());
  return DG_OK;
}

static dg_status cu_sc_rows(dg_context *ctx, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                            const float *p, int *kept) {
  *kept = mode == DG_TURBO_SC_EXACT || mode == DG_TURBO_SC_TOPK; /* adaptive: on the host */
  return *kept ? dg_cuda_turbo_sc(ctx->dev, mode, n, rows, cap, T, p) : DG_OK;
}

/* head_topk of a batched pass's canvases: one device launch (dg_cuda_topk_batch), then each canvas's per-row work. */
static dg_status cu_head_topk_batch(dg_context *work, dg_context *const *ctxs, dg_head_args *a, const dg_sc_req *pre,
                                    int32_t B, dg_status *st) {
  if (B < 1) return DG_OK;
  dg_cuda_ctx **cs = calloc((size_t)B, sizeof *cs);
  int32_t *iv = calloc((size_t)B * 4, sizeof *iv);
  float **val = calloc((size_t)B, sizeof *val);
  int32_t **idx = calloc((size_t)B, sizeof *idx);
  dg_cuda_screq *q = pre ? calloc((size_t)B, sizeof *q) : NULL;
  dg_status r = cs && iv && val && idx && (q || !pre) ? DG_OK : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  float cap = 0.0f;
  for (int32_t b = 0; b < B && q; b++) { /* the exact rows the device makes ahead; the others none */
    const int ex = pre[b].mode == DG_TURBO_SC_EXACT && pre[b].n > 0;
    q[b] = (dg_cuda_screq){pre[b].mode, ex ? pre[b].n : 0, pre[b].rows, pre[b].T, NULL};
    if (ex) cap = pre[b].cap;
  }
  int32_t *n = iv, *K = iv + B, *brow = iv + 2 * B, *bcol = iv + 3 * B;
  for (int32_t b = 0; b < B && !r; b++) {
    cs[b] = ctxs[b]->dev;
    n[b] = a[b].n;
    K[b] = a[b].K;
    val[b] = a[b].val;
    idx[b] = a[b].idx;
    a[b].last0 = -1;
  }
  if (!r) r = dg_cuda_topk_batch(work->dev, cs, B, n, K, val, idx, brow, bcol, st, q, cap);
  for (int32_t b = 0; b < B && !r; b++) {
    if (st[b] == DG_ERR_NUMERIC) {
      a[b].bad_row = brow[b];
      a[b].bad_col = bcol[b];
      continue;
    }
    if (st[b] || !a[b].on_row) continue;
    const dg_head_args *ab = &a[b];
#pragma omp parallel for num_threads(ab->nt) schedule(dynamic)
    for (int32_t row = 0; row < ab->n; row++) ab->on_row(ab->user, row, NULL, 1, omp_get_thread_num());
  }
  free(cs);
  free(iv);
  free(val);
  free(idx);
  free(q);
  return r;
}

/* sc_rows of a batched pass's canvases: the modes the device keeps in one call (dg_cuda_turbo_sc_batch). */
static dg_status cu_sc_rows_batch(dg_context *work, dg_context *const *ctxs, const dg_sc_req *r, int32_t B, int *kept) {
  dg_cuda_ctx **cs = calloc((size_t)B, sizeof *cs);
  dg_cuda_screq *q = calloc((size_t)B, sizeof *q);
  if (!cs || !q) {
    free(cs);
    free(q);
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  }
  int32_t m = 0;
  float cap = 0.0f;
  for (int32_t b = 0; b < B; b++) {
    kept[b] = r[b].mode == DG_TURBO_SC_EXACT || r[b].mode == DG_TURBO_SC_TOPK; /* adaptive: on the host */
    if (!kept[b]) continue;
    cs[m] = ctxs[b]->dev;
    q[m++] = (dg_cuda_screq){r[b].mode, r[b].n, r[b].rows, r[b].T, r[b].p};
    cap = r[b].cap;
  }
  dg_status st = m > 0 ? dg_cuda_turbo_sc_batch(work->dev, cs, q, m, cap) : DG_OK;
  free(cs);
  free(q);
  return st;
}

static dg_status cu_head_raw(dg_context *ctx, int32_t n, float *raw) { return dg_cuda_raw_rows(ctx->dev, n, raw); }

static dg_status cu_profile(dg_context *ctx, int on) { return dg_cuda_profile(ctx->dev, on); }

static dg_status cu_profile_read(dg_context *ctx, dg_profile *out) {
  _Static_assert(DG_PROFILE_STAGES == DG_CUDA_NSTAGES, "dgemma.h and backend.h count the same stages");
  for (int i = 0; i < DG_PROFILE_STAGES; i++) out->name[i] = dg_cuda_stage_name(i);
  dg_cuda_stack_prof sp;
  DG_TRY(dg_cuda_profile_read(ctx->dev, out->ms, &out->marks, &sp));
  for (int i = 0; i < DG_PROFILE_STAGES; i++) out->stack_ms[i] = sp.ms[i];
  out->stack_marks = sp.marks;
  out->stack_passes = sp.passes;
  out->stack_canvases = sp.canvases;
  out->stack_rows = sp.rows;
  _Static_assert(DG_PROFILE_EXPERT_BINS == DG_CUDA_EXPERT_BINS, "dgemma.h and backend.h bin the same rows");
  for (int i = 0; i < DG_PROFILE_EXPERT_BINS; i++) out->stack_expert_rows[i] = sp.expert_rows[i];
  out->stack_expert_rows_max = sp.expert_rows_max;
  return DG_OK;
}

/* A device context keeps its SC rows on the device: the sampler holds its host rows itself. */
static float *cu_sc_host(dg_context *ctx) {
  (void)ctx;
  return NULL;
}

static const dg_cuda_api cuda_api = {
    dg_cuda_step_stats, dg_cuda_compact, dg_cuda_topk, dg_cuda_turbo_sc, dg_cuda_ceilings_measure,
    dg_cuda_bench_experts, dg_cuda_mem_used, dg_cuda_graph_stats_get, dg_cuda_ctx_choices,
};

static const dg_backend cuda_backend = {
    .name = "cuda",
    .device = DG_DEVICE_CUDA,
    .stack_canvases = 8, /* stacks of up to 8 x 256 rows: the expert weights read once for all of them */
    .model_init = cu_model_init,
    .model_free = cu_model_free,
    .model_bytes = cu_model_bytes,
    .ctx_init = cu_ctx_init,
    .ctx_free = cu_ctx_free,
    .truncate_check = cu_truncate_check,
    .ctx_copy = cu_ctx_copy,
    .compact_prepare = cu_compact_prepare,
    .encode = cu_encode,
    .decode = cu_decode,
    .step_stats = cu_step_stats,
    .step_z_floats = cu_step_z_floats,
    .sc_from_z = cu_sc_from_z,
    .decode_rows = cu_decode_rows,
    .compact = cu_compact,
    .compact_batch = cu_compact_batch, /* stacks of canvases in the work context's device buffers */
    .head_plan = cu_head_plan,
    .head_topk = cu_head_topk,
    .sc_rows = cu_sc_rows,
    .head_topk_batch = cu_head_topk_batch, /* one launch over a batched pass's canvases */
    .sc_rows_batch = cu_sc_rows_batch,
    .head_raw = cu_head_raw,
    .sc_host = cu_sc_host,
    .info = dg_cuda_info,
    .profile = cu_profile,
    .profile_read = cu_profile_read,
    .api = &cuda_api,
};

const dg_backend *dg_backend_cuda(void) { return &cuda_backend; }
