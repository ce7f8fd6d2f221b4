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

/* calloc of n elements of sz bytes (at least one element); sets *fail on failure. */
static inline void *dg_xcalloc(size_t n, size_t sz, int *fail) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) *fail = 1;
  return p;
}

/* Allocate the host buffers of ctx (ctx->m and ctx->cap set, the rest zero):
 * the KV cache [n_layers][n_kv_heads, cap, head_dim] (K and V), the
 * activations of a pass of tmax = max(canvas_length, DG_ENC_CHUNK, rows) rows
 * (ctx->tmax is set), the self-conditioning rows [canvas_length, hidden], and
 * one attention scratch (DG_SCORE_FLOATS) and one probability row (vocab) per thread.
 * Errors: DG_ERR_OUT_OF_MEMORY naming the positions; what was allocated stays
 * in ctx for dg_context_free_host. */
dg_status dg_context_alloc_host(dg_context *ctx, int32_t rows);

/* Free every host buffer of ctx (the canvas K/V buffers of dg_compact_buffers
 * included), not ctx itself; NULL members are fine. */
void dg_context_free_host(dg_context *ctx);

#endif
