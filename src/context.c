/* context.c: the host side of a context (context.h): its buffers sized
 * from the model's config (the KV cache, the activations of a pass of up to
 * tmax rows, the self-conditioning rows, the per-thread score and
 * probability rows), their release, and the cache-length calls of dgemma.h;
 * the CPU backend's table (backend_cpu.c: ctx_init / ctx_free) calls these;
 * a CUDA context keeps everything on the device instead. */
#include "context.h"

#include <stdlib.h>
#include <string.h>

#include "dg_error.h"
#include "model.h"

dg_context_params dg_context_default_params(void) {
  dg_context_params p;
  memset(&p, 0, sizeof p);
  return p;
}

dg_status dg_context_alloc_host(dg_context *ctx, int32_t rows) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const int32_t cap = ctx->cap;
  int fail = 0;
  int dmax = 0, kvmax = 0;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->head_dim[i] > dmax) dmax = c->head_dim[i];
    if (c->n_kv_heads[i] * c->head_dim[i] > kvmax) kvmax = c->n_kv_heads[i] * c->head_dim[i];
  }
  ctx->kv = dg_xcalloc((size_t)c->n_layers, sizeof *ctx->kv, &fail);
  for (int i = 0; !fail && i < c->n_layers; i++) {
    size_t n = (size_t)c->n_kv_heads[i] * (size_t)cap * (size_t)c->head_dim[i];
    ctx->kv[i].k = dg_xcalloc(n, sizeof(float), &fail);
    ctx->kv[i].v = dg_xcalloc(n, sizeof(float), &fail);
  }
  int32_t T = c->canvas_length > DG_ENC_CHUNK ? c->canvas_length : DG_ENC_CHUNK;
  if (rows > T) T = rows;
  ctx->tmax = T;
  size_t H = (size_t)c->hidden_size, W = (size_t)(c->intermediate_size > c->moe_intermediate_size
                                                      ? c->intermediate_size
                                                      : c->moe_intermediate_size);
  size_t TK = (size_t)T * (size_t)c->top_k_experts;
  ctx->x = dg_xcalloc((size_t)T * H, sizeof(float), &fail);
  ctx->xa = dg_xcalloc((size_t)T * H, sizeof(float), &fail);
  ctx->xb = dg_xcalloc((size_t)T * H, sizeof(float), &fail);
  ctx->q = dg_xcalloc((size_t)T * c->n_heads * dmax, sizeof(float), &fail);
  ctx->k = dg_xcalloc((size_t)T * kvmax, sizeof(float), &fail);
  ctx->v = dg_xcalloc((size_t)T * kvmax, sizeof(float), &fail);
  ctx->att = dg_xcalloc((size_t)T * c->n_heads * dmax, sizeof(float), &fail);
  ctx->h1 = dg_xcalloc((size_t)T * W, sizeof(float), &fail);
  ctx->h2 = dg_xcalloc((size_t)T * W, sizeof(float), &fail);
  ctx->router_logits = dg_xcalloc((size_t)T * c->n_experts, sizeof(float), &fail);
  ctx->topk_idx = dg_xcalloc(TK, sizeof(int32_t), &fail);
  ctx->topk_w = dg_xcalloc(TK, sizeof(float), &fail);
  ctx->exp_tokens = dg_xcalloc(TK, sizeof(int32_t), &fail);
  ctx->exp_count = dg_xcalloc((size_t)c->n_experts, sizeof(int32_t), &fail);
  ctx->exp_start = dg_xcalloc((size_t)c->n_experts + 1, sizeof(int32_t), &fail);
  ctx->ebuf_in = dg_xcalloc(TK * H, sizeof(float), &fail);
  ctx->ebuf_out = dg_xcalloc(TK * H, sizeof(float), &fail);
  ctx->eh1 = dg_xcalloc(TK * (size_t)c->moe_intermediate_size, sizeof(float), &fail);
  ctx->eh2 = dg_xcalloc(TK * (size_t)c->moe_intermediate_size, sizeof(float), &fail);
  ctx->rope_cos = dg_xcalloc((size_t)T * dmax / 2, sizeof(float), &fail);
  ctx->rope_sin = dg_xcalloc((size_t)T * dmax / 2, sizeof(float), &fail);
  ctx->n_score_threads = m->n_threads;
  ctx->scores = dg_xcalloc((size_t)m->n_threads * DG_SCORE_FLOATS(cap, T), sizeof(float), &fail);
  ctx->soft = dg_xcalloc((size_t)c->canvas_length * H, sizeof(float), &fail);
  /* one probability row per thread, not [C, V]: a canvas row's probabilities are
   * consumed by its own soft-embedding sum (~268 MB less per context at C = 256,
   * V = 262,144; issue 16) */
  ctx->probs = dg_xcalloc((size_t)m->n_threads * (size_t)c->vocab_size, sizeof(float), &fail);
  if (fail) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory allocating a context of %d positions", cap);
  return DG_OK;
}

void dg_context_trim(dg_context *ctx) {
  if (!ctx) return;
  free(ctx->soft_pb);
  ctx->soft_pb = NULL;
  ctx->soft_pb_rows = 0;
}

void dg_context_free_host(dg_context *ctx) {
  if (ctx->kv)
    for (int i = 0; i < ctx->m->cfg.n_layers; i++) { free(ctx->kv[i].k); free(ctx->kv[i].v); }
  free(ctx->kv);
  if (ctx->cbuf_k)
    for (int i = 0; i < ctx->m->cfg.n_layers; i++) { free(ctx->cbuf_k[i]); free(ctx->cbuf_v[i]); }
  free(ctx->cbuf_k);
  free(ctx->cbuf_v);
  float *bufs[] = {ctx->x, ctx->xa, ctx->xb, ctx->q, ctx->k, ctx->v, ctx->att, ctx->h1, ctx->h2,
                   ctx->router_logits, ctx->topk_w, ctx->ebuf_in, ctx->ebuf_out, ctx->eh1, ctx->eh2,
                   ctx->rope_cos, ctx->rope_sin, ctx->scores, ctx->soft, ctx->probs, ctx->soft_pb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(ctx->topk_idx);
  free(ctx->cmp_buf);
  free(ctx->cmp_off);
  free(ctx->exp_tokens);
  free(ctx->exp_count);
  free(ctx->exp_start);
}

void dg_context_reset(dg_context *ctx) {
  if (ctx) ctx->len = 0;
}

int32_t dg_context_length(const dg_context *ctx) { return ctx ? ctx->len : 0; }

dg_status dg_context_truncate(dg_context *ctx, int32_t len) {
  if (!ctx) return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_truncate: NULL context");
  if (len < 0 || len > ctx->len)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_truncate: length %d is outside [0, %d] (the cache's length)", len,
                     ctx->len);
  ctx->len = len; /* K/V rows are stored by absolute position (CPU and CUDA): the rest is overwritten later */
  return DG_OK;
}
