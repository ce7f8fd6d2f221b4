/* context.h: allocation of a context's host buffers (context.c), below the
 * CPU forward pass (forward.c), which creates and frees contexts. */
#ifndef DG_CONTEXT_H
#define DG_CONTEXT_H

#include <stdint.h>
#include <stdlib.h>

#include "dgemma.h"

/* Encoder tokens per pass of the CPU backend; results do not depend on it. Fixed: DGEMMA_ENC_CHUNK sets a CUDA
 * context's chunk only (dg_cuda_enc_chunk, dgemma.h). */
#define DG_ENC_CHUNK 256
/* A CUDA context's encoder chunk unless DGEMMA_ENC_CHUNK says otherwise (dg_cuda_enc_chunk): 1,024 since session
 * 29 (helper mm12; 256 before). Its rows beyond the decoder's lie over the logits (src/cuda/context.cu ctx_layout),
 * so at the 26B it costs no device memory over 256, and the H100 prefilled 8,192 tokens in 243.9 ms against 348.5
 * at 256 (session 29, docs/cuda.md). */
#define DG_CUDA_ENC_CHUNK 1024
/* One thread's attention scratch of a context of cap positions and tmax rows: 16 score rows
 * (cap + tmax) and a [DG_ATTN_DMAX][16] query block (dg_kernels.attn_block runs 16 queries at
 * once, for head dimensions up to DG_ATTN_DMAX; the scalar loop uses the first row). */
#define DG_ATTN_DMAX 256
#define DG_SCORE_FLOATS(cap, tmax) (16 * ((size_t)(cap) + (size_t)(tmax) + DG_ATTN_DMAX))

/* One buffer of an arena's size table: where its pointer goes and its bytes. */
typedef struct dg_arena_item {
  void **ptr;
  size_t bytes;
} dg_arena_item;

/* The table entry of pointer p to n elements of *p. */
#define DG_ARENA_ITEM(p, n) {(void **)&(p), (size_t)(n) * sizeof *(p)}

/* One zeroed allocation holding the n buffers of the table it[], each at its
 * offset (a multiple of 64 bytes, a cache line, from the block's start; a
 * buffer of 0 bytes gets a valid place), its pointer set; *bytes (if not NULL) the total. Returns the
 * block (free it, and only it), or NULL when out of memory or the sizes
 * overflow (then no pointer is set). */
void *dg_arena_alloc(const dg_arena_item *it, size_t n, size_t *bytes);

/* Allocate the host state of ctx (ctx->m and ctx->cap set, the rest zero), in
 * one block: the KV cache [n_layers][n_kv_heads, cap, head_dim] (K and V), one
 * attention scratch (DG_SCORE_FLOATS of cap + max(C, DG_ENC_CHUNK)) per thread and the self-conditioning
 * rows [canvas_length, hidden]. The activations of a pass (dg_work) are not
 * allocated here: dg_context_work makes them on the first pass that needs them,
 * for max(canvas_length, DG_ENC_CHUNK, rows) rows. Errors: DG_ERR_OUT_OF_MEMORY
 * naming the positions; what was allocated stays in ctx for dg_context_free_host. */
dg_status dg_context_alloc_host(dg_context *ctx, int32_t rows);

/* Make sure ctx has pass activations (ctx->w): the batch's it shares, else its own
 * (allocated on the first call, in one block, and kept until the context is freed);
 * nothing for a device backend's context (no host activations: work_rows 0).
 * Errors: DG_ERR_OUT_OF_MEMORY. */
dg_status dg_context_work(dg_context *ctx);

/* ctx's passes use the activations of `from` (a batch's work context, which has
 * them: dg_context_work) until called again with from = NULL, which gives ctx its
 * own back (NULL until needed). The canvases of a batch run one after another
 * through the one dg_work, so a canvas holds only its own state (issue 16). */
void dg_context_share_work(dg_context *ctx, const dg_context *from);

/* Readies ctx for compacted passes (spec 7.4; idempotent): their canvas K/V, per layer C rows of
 * NKV x D floats for K and V, live in the KV cache's own canvas slots, positions [len, len + C) of
 * ctx->kv (as on CUDA: the cache is [NKV, cap, D], and a context sized prompt + canvases x C has
 * them), so nothing is allocated here. A canvas the cache has no slots for (len + C > cap: a
 * context sized to dg_generate_check's minimum, whose last canvas is never committed) gets the
 * separate rows [L] x [C, NKV, D] in one block, on its first pass (dg_context_canvas_kv).
 * Errors: none today (DG_OK). */
dg_status dg_context_compact_buffers(dg_context *ctx);

/* Where the canvas K/V of layer li of ctx's current canvas (at positions ctx->len..) live: K row j
 * (canvas position j in [0, C)) of KV head g at *k + g * *hs + j * *rs, V likewise from *v. In the
 * cache's slots (len + C <= cap): *k = kv[li].k + len * D, *hs = cap * D, *rs = D; else the separate
 * rows cbuf_k/v[li] ([C, NKV, D]: *hs = D, *rs = NKV * D), allocated here on first need. Both places
 * hold the same values for the same passes, so a pass's outputs do not depend on which is used.
 * Errors: DG_ERR_INVALID_ARG (dg_context_compact_buffers not called since the last
 * dg_context_release_buffers), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_context_canvas_kv(dg_context *ctx, int li, float **k, float **v, size_t *hs, size_t *rs);

/* The CPU backend's ctx_copy (backend.h): the K/V rows of positions 0..n-1 of every layer from src into
 * dst (same model; n <= both capacities, checked by dg_context_copy_prefix, which sets dst->len). */
dg_status dg_context_copy_host(dg_context *dst, const dg_context *src, int32_t n);

/* Free every host buffer of ctx (its state, canvas K/V buffers, own activations
 * and soft-embedding scratch), not ctx itself; NULL members are fine. */
void dg_context_free_host(dg_context *ctx);

#endif
