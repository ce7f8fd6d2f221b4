/* context.c: the host side of a context (context.h): its own state sized
 * from the model's config (the KV cache, the per-thread score rows, the
 * self-conditioning rows: one allocation; the canvas K/V of the compacted
 * pass live in the cache's canvas slots, or, for a canvas past the cache's
 * capacity, in one more allocation on first need), the activations of a pass (a
 * dg_work, one allocation, the context's own or a batch's shared one),
 * their release (dg_context_release_buffers: a prompt cache's entry keeps
 * its KV cache only), and the cache-length calls of dgemma.h. Every block is laid
 * out from a size table (llm.c's way). The CPU backend's table
 * (backend_cpu.c: ctx_init / ctx_free) calls these; a CUDA context keeps
 * everything on the device instead. */
#include "model/context.h"

#include <stdlib.h>
#include <string.h>

#include "base/dg_error.h"
#include "model/model.h"

dg_context_params dg_context_default_params(void) {
  dg_context_params p;
  memset(&p, 0, sizeof p);
  return p;
}

/* ---- one allocation from a size table (llm.c's way) ---------------------- */

#define ARENA_ALIGN 64 /* every buffer at a multiple of a cache line from the block's start (calloc of a large
                          block is page-aligned) */

void *dg_arena_alloc(const dg_arena_item *it, size_t n, size_t *bytes) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t b = (it[i].bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (b < it[i].bytes || total + b < total) return NULL;
    total += b;
  }
  char *base = calloc(total ? total : 1, 1);
  if (!base) return NULL;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    *it[i].ptr = base + off;
    off += (it[i].bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  }
  if (bytes) *bytes = total;
  return base;
}

/* The largest head dim and K/V row (NKV * D) over the layers. */
static void layer_max(const dg_config *c, int *dmax, int *kvmax) {
  *dmax = *kvmax = 0;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->head_dim[i] > *dmax) *dmax = c->head_dim[i];
    if (c->n_kv_heads[i] * c->head_dim[i] > *kvmax) *kvmax = c->n_kv_heads[i] * c->head_dim[i];
  }
}

/* Rows of a pass: max(C, encoder chunk) at least. */
static int32_t pass_rows(const dg_config *c, int32_t rows) {
  int32_t T = c->canvas_length > DG_ENC_CHUNK ? c->canvas_length : DG_ENC_CHUNK;
  return rows > T ? rows : T;
}

dg_status dg_context_alloc_host(dg_context *ctx, int32_t rows) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const int32_t cap = ctx->cap;
  const int L = c->n_layers;
  int dmax, kvmax;
  layer_max(c, &dmax, &kvmax);
  const int32_t T0 = pass_rows(c, 0);
  ctx->work_rows = pass_rows(c, rows);
  ctx->n_score_threads = m->n_threads;
  ctx->score_stride = DG_SCORE_FLOATS(cap, T0); /* a query attends over at most the cache and one canvas; the
                                                  attention block's 16 rows and query block (context.h) */
  /* the table: the KV cache index and rows [L][NKV, S, D] (K and V), the score rows, the SC rows */
  dg_arena_item *it = calloc((size_t)2 * L + 3, sizeof *it);
  if (!it) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory allocating a context of %d positions", cap);
  size_t n = 0;
  it[n++] = (dg_arena_item)DG_ARENA_ITEM(ctx->kv, L);
  /* the rows' pointers go into the index once it is placed */
  float **rowp = calloc((size_t)2 * (L ? L : 1), sizeof *rowp);
  if (!rowp) { free(it); return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory allocating a context of %d positions", cap); }
  for (int i = 0; i < L; i++) {
    const size_t e = (size_t)c->n_kv_heads[i] * (size_t)cap * (size_t)c->head_dim[i];
    it[n++] = (dg_arena_item){(void **)&rowp[2 * i], e * sizeof(float)};
    it[n++] = (dg_arena_item){(void **)&rowp[2 * i + 1], e * sizeof(float)};
  }
  it[n++] = (dg_arena_item)DG_ARENA_ITEM(ctx->scores, (size_t)m->n_threads * (size_t)ctx->score_stride);
  it[n++] = (dg_arena_item)DG_ARENA_ITEM(ctx->soft, (size_t)c->canvas_length * c->hidden_size);
  ctx->arena = dg_arena_alloc(it, n, NULL);
  free(it);
  if (ctx->arena) {
    for (int i = 0; i < L; i++) { ctx->kv[i].k = rowp[2 * i]; ctx->kv[i].v = rowp[2 * i + 1]; }
  } else {
    ctx->kv = NULL;
    ctx->scores = ctx->soft = NULL;
  }
  free(rowp);
  if (!ctx->arena) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory allocating a context of %d positions", cap);
  return DG_OK;
}

/* The activations of a pass of T rows (model.h, dg_work) in one allocation; NULL when out of memory. */
static dg_work *work_new(const dg_model *m, int32_t T) {
  const dg_config *c = &m->cfg;
  int dmax, kvmax;
  layer_max(c, &dmax, &kvmax);
  dg_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  const size_t H = (size_t)c->hidden_size, W = (size_t)(c->intermediate_size > c->moe_intermediate_size
                                                            ? c->intermediate_size
                                                            : c->moe_intermediate_size);
  const size_t Tz = (size_t)T, TK = Tz * (size_t)c->top_k_experts, IE = (size_t)c->moe_intermediate_size;
  const size_t nt = m->n_threads > 0 ? (size_t)m->n_threads : 1;
  const dg_arena_item it[] = {
      DG_ARENA_ITEM(w->x, Tz * H),          DG_ARENA_ITEM(w->xa, Tz * H),
      DG_ARENA_ITEM(w->xb, Tz * H),         DG_ARENA_ITEM(w->q, Tz * c->n_heads * dmax),
      DG_ARENA_ITEM(w->k, Tz * kvmax),      DG_ARENA_ITEM(w->v, Tz * kvmax),
      DG_ARENA_ITEM(w->att, Tz * c->n_heads * dmax), DG_ARENA_ITEM(w->h1, Tz * W),
      DG_ARENA_ITEM(w->h2, Tz * W),         DG_ARENA_ITEM(w->router_logits, Tz * c->n_experts),
      DG_ARENA_ITEM(w->topk_idx, TK),       DG_ARENA_ITEM(w->topk_w, TK),
      DG_ARENA_ITEM(w->exp_tokens, TK),     DG_ARENA_ITEM(w->exp_count, c->n_experts),
      DG_ARENA_ITEM(w->exp_start, c->n_experts + 1), DG_ARENA_ITEM(w->ebuf_in, TK * H),
      DG_ARENA_ITEM(w->ebuf_out, TK * H),   DG_ARENA_ITEM(w->eh1, TK * IE),
      DG_ARENA_ITEM(w->eh2, TK * IE),       DG_ARENA_ITEM(w->rope_cos, Tz * dmax / 2),
      DG_ARENA_ITEM(w->rope_sin, Tz * dmax / 2),
      /* one probability row per thread, not [C, V]: a canvas row's probabilities are consumed by
       * its own soft-embedding sum (~268 MB less at C = 256, V = 262,144; issue 16) */
      DG_ARENA_ITEM(w->probs, nt * (size_t)c->vocab_size),
      DG_ARENA_ITEM(w->cmp_buf, 4 * Tz + 1),
  };
  w->arena = dg_arena_alloc(it, sizeof it / sizeof it[0], &w->bytes);
  if (!w->arena) { free(w); return NULL; }
  w->tmax = T;
  w->rope_pos0 = -1;
  return w;
}

static void work_free(dg_work *w) {
  if (!w) return;
  free(w->arena);
  free(w);
}

dg_status dg_context_work(dg_context *ctx) {
  if (ctx->w || ctx->work_rows == 0) return DG_OK; /* 0: a device context, its activations on the device */
  if (!ctx->own_w && !(ctx->own_w = work_new(ctx->m, ctx->work_rows)))
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the activations of a %d-row pass", ctx->work_rows);
  ctx->w = ctx->own_w;
  return DG_OK;
}

void dg_context_share_work(dg_context *ctx, const dg_context *from) {
  ctx->w = from && from->w ? from->w : ctx->own_w;
}

void dg_context_trim(dg_context *ctx) {
  if (!ctx) return;
  free(ctx->soft_pb);
  ctx->soft_pb = NULL;
  ctx->soft_pb_rows = 0;
}

dg_status dg_context_release_buffers(dg_context *ctx) {
  if (!ctx) return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_release_buffers: NULL context");
  if (ctx->w == ctx->own_w) ctx->w = NULL; /* a batch's shared activations are the batch's */
  work_free(ctx->own_w);
  ctx->own_w = NULL;
  free(ctx->cbuf_arena); /* the separate canvas K/V rows: made again on need, after dg_context_compact_buffers */
  ctx->cbuf_arena = NULL;
  free(ctx->kvt); /* a batch work context's one-layer canvas K/V scratch: made again on need */
  ctx->kvt = NULL;
  ctx->canvas_kv_ready = 0;
  ctx->cbuf_k = ctx->cbuf_v = NULL;
  dg_context_trim(ctx);
  return DG_OK;
}

void dg_context_free_host(dg_context *ctx) {
  free(ctx->arena);
  free(ctx->cbuf_arena);
  free(ctx->kvt);
  ctx->kvt = NULL;
  work_free(ctx->own_w);
  free(ctx->soft_pb);
  ctx->arena = ctx->cbuf_arena = NULL;
  ctx->own_w = ctx->w = NULL;
}

dg_status dg_context_compact_buffers(dg_context *ctx) {
  ctx->canvas_kv_ready = 1; /* the cache's canvas slots need nothing; the separate rows come on first need */
  return DG_OK;
}

/* The separate canvas rows [L] x [C, NKV, D] for K and V in one block (a canvas the cache has no slots for). */
static dg_status canvas_rows_alloc(dg_context *ctx) {
  const dg_config *c = &ctx->m->cfg;
  const int L = c->n_layers;
  /* the table: the two indexes [L], then per layer its K and V rows [C, NKV, D] */
  dg_arena_item *it = calloc((size_t)2 * L + 2, sizeof *it);
  float **rowp = calloc((size_t)2 * (L ? L : 1), sizeof *rowp);
  if (it && rowp) {
    size_t n = 0;
    it[n++] = (dg_arena_item)DG_ARENA_ITEM(ctx->cbuf_k, L);
    it[n++] = (dg_arena_item)DG_ARENA_ITEM(ctx->cbuf_v, L);
    for (int i = 0; i < L; i++) {
      const size_t e = (size_t)c->canvas_length * c->n_kv_heads[i] * c->head_dim[i];
      it[n++] = (dg_arena_item){(void **)&rowp[2 * i], e * sizeof(float)};
      it[n++] = (dg_arena_item){(void **)&rowp[2 * i + 1], e * sizeof(float)};
    }
    ctx->cbuf_arena = dg_arena_alloc(it, n, NULL);
    if (ctx->cbuf_arena)
      for (int i = 0; i < L; i++) { ctx->cbuf_k[i] = rowp[2 * i]; ctx->cbuf_v[i] = rowp[2 * i + 1]; }
  }
  free(it);
  free(rowp);
  if (!ctx->cbuf_arena) {
    ctx->cbuf_k = ctx->cbuf_v = NULL;
    return dg_seterr(DG_ERR_OUT_OF_MEMORY,
                     "out of memory for the canvas K/V rows (%d layers x canvas %d; positions %d..%d are past the "
                     "cache's %d)", L, c->canvas_length, ctx->len, ctx->len + c->canvas_length - 1, ctx->cap);
  }
  return DG_OK;
}

dg_status dg_context_canvas_kv(dg_context *ctx, int li, float **k, float **v, size_t *hs, size_t *rs) {
  if (!ctx->canvas_kv_ready || !ctx->kv)
    return dg_seterr(DG_ERR_INVALID_ARG, "compacted decoder pass without canvas K/V buffers (dg_compact_buffers)");
  const dg_config *c = &ctx->m->cfg;
  const size_t D = (size_t)c->head_dim[li], NKV = (size_t)c->n_kv_heads[li];
  if ((int64_t)ctx->len + c->canvas_length <= ctx->cap) { /* the cache's canvas slots [len, len + C) */
    *k = ctx->kv[li].k + (size_t)ctx->len * D;
    *v = ctx->kv[li].v + (size_t)ctx->len * D;
    *hs = (size_t)ctx->cap * D;
    *rs = D;
    return DG_OK;
  }
  if (!ctx->cbuf_arena) DG_TRY(canvas_rows_alloc(ctx));
  *k = ctx->cbuf_k[li];
  *v = ctx->cbuf_v[li];
  *hs = D;
  *rs = NKV * D;
  return DG_OK;
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
  /* K/V rows are stored by position: the rest is overwritten later, unless a ring cache has already lost keys that
   * position len needs (the backend says) */
  DG_TRY(ctx->m->bk->truncate_check(ctx, len));
  ctx->len = len;
  return DG_OK;
}

dg_status dg_context_copy_prefix(dg_context *dst, const dg_context *src, int32_t n) {
  if (!dst || !src) return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_copy_prefix: NULL context");
  if (dst == src) return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_copy_prefix: the source is the destination");
  if (dst->m != src->m)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_copy_prefix: the two contexts belong to different models");
  if (n < 0 || n > src->len)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_copy_prefix: %d positions is outside [0, %d] (the source's length)",
                     n, src->len);
  if (n > dst->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "dg_context_copy_prefix: %d positions exceed the destination's capacity of %d",
                     n, dst->cap);
  if (!dst->m->bk->ctx_copy)
    return dg_seterr(DG_ERR_BACKEND, "dg_context_copy_prefix: the %s backend cannot copy a KV cache (yet)",
                     dst->m->bk->name);
  /* the source's positions before n must all still be there (a ring cache may have overwritten some) */
  DG_TRY(src->m->bk->truncate_check(src, n));
  DG_TRY(dst->m->bk->ctx_copy(dst, src, n));
  dst->len = n;
  return DG_OK;
}

dg_status dg_context_copy_host(dg_context *dst, const dg_context *src, int32_t n) {
  const dg_model *m = dst->m;
  for (int li = 0; li < m->cfg.n_layers; li++) {
    const size_t D = (size_t)m->layers[li].head_dim, row = (size_t)n * D * sizeof(float);
    for (int h = 0; h < m->layers[li].n_kv; h++) { /* [NKV, S, D]: positions 0..n-1 of head h are one run */
      memcpy(dst->kv[li].k + (size_t)h * dst->cap * D, src->kv[li].k + (size_t)h * src->cap * D, row);
      memcpy(dst->kv[li].v + (size_t)h * dst->cap * D, src->kv[li].v + (size_t)h * src->cap * D, row);
    }
  }
  return DG_OK;
}
