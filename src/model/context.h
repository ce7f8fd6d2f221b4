/* context.h: allocation of a context's host buffers (context.c), below the
 * CPU forward pass (forward.c), which creates and frees contexts. */
#ifndef DG_CONTEXT_H
#define DG_CONTEXT_H

#include <stdint.h>
#include <stdlib.h>

#include "dgemma.h"

#define DG_ENC_CHUNK 256 /* encoder tokens per pass; results do not depend on it */
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

/* The per-layer canvas K/V buffers of the compacted pass, [L] x [C, NKV, D] for K
 * and V, in one block (idempotent). Errors: DG_ERR_OUT_OF_MEMORY. */
dg_status dg_context_compact_buffers(dg_context *ctx);

/* The CPU backend's ctx_copy (backend.h): the K/V rows of positions 0..n-1 of every layer from src into
 * dst (same model; n <= both capacities, checked by dg_context_copy_prefix, which sets dst->len). */
dg_status dg_context_copy_host(dg_context *dst, const dg_context *src, int32_t n);

/* Free every host buffer of ctx (its state, canvas K/V buffers, own activations
 * and soft-embedding scratch), not ctx itself; NULL members are fine. */
void dg_context_free_host(dg_context *ctx);

#endif
