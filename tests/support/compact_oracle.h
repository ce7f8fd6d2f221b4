/* compact_oracle.h: the token-by-token oracle of the compacted pass
 * (spec 7.4, dg_forward_compact), for tests/test_turbo.c: the same semantics
 * computed one row at a time from the pass's own steps (model.h
 * dg_cpu_row_*): the decoder input of every token of the forward set, then
 * per layer all of their fresh K/V scattered into the canvas K/V first,
 * then each token's attention over [prefix, canvas K/V] and its FFN; the
 * LM head on the head rows. CPU contexts only. Header-only (one static
 * function) so that the test links it without a library of its own. */
#ifndef DG_COMPACT_ORACLE_H
#define DG_COMPACT_ORACLE_H

#include <stdlib.h>
#include <string.h>

#include "model/context.h"
#include "base/dg_error.h"
#include "model/model.h"

/* As dg_forward_compact(ctx, tok, pos, n, soft, head, nh, raw), token by token. */
static dg_status dg_compact_oracle(dg_context *ctx, const int32_t *tok, const int32_t *pos, int32_t n,
                                   const float *soft, const int32_t *head, int32_t nh, float *raw) {
  const dg_model *m = ctx->m;
  const int H = m->cfg.hidden_size;
  if (!ctx->kv) return dg_seterr(DG_ERR_INVALID_ARG, "the compacted-pass oracle is CPU code: use a CPU context");
  const dg_compact_seq q = {ctx, tok, pos, n, soft, head, nh, raw, NULL, DG_SC_NONE, 0};
  DG_TRY(dg_compact_seq_check(m, &q, 0, 0));
  float *ck, *cv;
  size_t chs, crs;
  DG_TRY(dg_context_canvas_kv(ctx, 0, &ck, &cv, &chs, &crs)); /* readied by dg_compact_buffers */
  DG_TRY(dg_context_work(ctx));
  float *X = malloc((size_t)n * H * sizeof(float)), *Y = malloc((size_t)n * H * sizeof(float));
  if (!X || !Y) { free(X); free(Y); return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); }
  dg_status st = DG_OK;
  for (int32_t t = 0; t < n && !st; t++) st = dg_cpu_row_input(ctx, tok[t], pos[t], soft, X + (size_t)t * H);
  for (int li = 0; li < m->cfg.n_layers && !st; li++) {
    for (int32_t t = 0; t < n && !st; t++) st = dg_cpu_row_kv(ctx, li, pos[t], X + (size_t)t * H); /* every K/V first ... */
    for (int32_t t = 0; t < n && !st; t++) st = dg_cpu_row_layer(ctx, li, pos[t], X + (size_t)t * H, Y + (size_t)t * H);
    float *tmp = X; X = Y; Y = tmp; /* ... then each token's attention and FFN */
  }
  if (!st && nh > 0) dg_cpu_rows_head(ctx, X, head, nh, raw);
  free(X);
  free(Y);
  return st;
}

#endif
