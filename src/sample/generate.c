/* generate.c: the public generation entry points (dg_generate,
 * dg_generate_batch) and the reference block-diffusion sampler (spec 6.1)
 * they run by default, exactly as Transformers'
 * DiffusionGemmaGenerationMixin.generate with the EntropyBoundSampler, the
 * linear temperature schedule and the StableAndConfidentStoppingCriteria:
 *
 *   prefill the prompt; for each canvas:
 *     x = uniform random ids; soft = 0
 *     for s = N .. 1:
 *       logits = decoder(x, soft);  z = logits / T_s
 *       d ~ Categorical(softmax z);  a = argmax z;  H = entropy(softmax z)
 *       accept the lowest-entropy positions while the entropy accumulated
 *       before them is <= entropy_bound; renoise the others uniformly
 *       stop if a equals the previous argmax canvas and mean(H) < threshold
 *       soft = softmax(cast(z)) . E * scale (self-conditioning)
 *     block = a of the last step; pad after the first stop id; commit the
 *     block through the encoder before the next canvas.
 *
 * The per-position math, the draws, the stop rule and the result filling are
 * the sampler core's (sampler.c); with params->turbo.enabled the turbo engine
 * (turbo.c) runs instead. The passes, the per-position statistics and the
 * self-conditioning rows are the model's backend's (m->bk, backend.h).
 * Layers: generate.c -> turbo.c -> sampler.c, never back
 * (docs/architecture.md). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dg_error.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "sample/turbo.h"

/* The reference sampler's state for one request. */
typedef struct ref_state {
  dg_context *ctx;
  const dg_gen_params *p;
  int32_t C, V, n_canvases;
  /* z = logits / T, the backend's step_stats scratch (backend.h): [C, V] on
   * the CPU (one buffer per request, not two; issue 16); [1] on a device,
   * where the logits stay there and only [C] statistics come back per step. */
  float *logits;
  int32_t *canvas, *next, *amax, *noise; /* [C] current and next canvas, argmax canvas, renoise draw */
  float *ent, *uni;                      /* [C] entropies, proposal uniforms */
  uint8_t *acc;                          /* [C] accepted positions */
  void *scratch;                         /* 8 C bytes: the entropy-bound sort */
  dg_pos_stats *ps;                      /* [C] */
  dg_draws cs;                           /* random canvases and uniforms (bits [C]) */
  dg_stop_rule stop;                     /* history [max(SH, 1), C] */
  dg_gen_tally tally;                    /* out [n_canvases, C] */
} ref_state;

static void ref_free(ref_state *r) {
  free(r->logits); free(r->canvas); free(r->next); free(r->amax); free(r->noise); free(r->stop.hist);
  free(r->ent); free(r->uni); free(r->acc); free(r->scratch); free(r->ps); free(r->tally.out); free(r->cs.bits);
}

static dg_status ref_alloc(ref_state *r, dg_context *ctx, const dg_gen_params *p) {
  const dg_model *m = ctx->m;
  const int32_t C = m->cfg.canvas_length, V = m->cfg.vocab_size, SH = p->stability_threshold;
  memset(r, 0, sizeof *r);
  r->tally.t0 = dg_now_s();
  r->tally.why = DG_FINISH_LENGTH;
  r->ctx = ctx;
  r->p = p;
  r->C = C;
  r->V = V;
  r->n_canvases = (int32_t)((p->max_new_tokens + (int64_t)C - 1) / C);
  const size_t nz = m->bk->step_z_floats(m);
  r->logits = malloc((nz ? nz : 1) * sizeof(float));
  r->canvas = malloc((size_t)C * sizeof(int32_t));
  r->next = malloc((size_t)C * sizeof(int32_t));
  r->amax = malloc((size_t)C * sizeof(int32_t));
  r->noise = malloc((size_t)C * sizeof(int32_t));
  r->ent = malloc((size_t)C * sizeof(float));
  r->uni = calloc((size_t)C, sizeof(float));
  r->acc = malloc((size_t)C);
  r->scratch = malloc((size_t)C * 8);
  r->ps = malloc((size_t)C * sizeof *r->ps);
  r->tally.out = malloc((size_t)r->n_canvases * C * sizeof(int32_t));
  r->cs = (dg_draws){p, 0, 0, C, V, malloc((size_t)C * sizeof(uint32_t))};
  r->stop = (dg_stop_rule){malloc((size_t)(SH > 0 ? SH : 1) * C * sizeof(int32_t)), SH, C, p->confidence_threshold};
  if (!r->logits || !r->canvas || !r->next || !r->amax || !r->noise || !r->ent || !r->uni || !r->acc ||
      !r->scratch || !r->ps || !r->tally.out || !r->cs.bits || !r->stop.hist)
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the sampler state (canvas %d x vocab %d)", C, V);
  return DG_OK;
}

/* Decoder pass over the canvas and the per-position statistics r->ps of step
 * k of block b at temperature T (sc: the self-conditioning rows, none or the
 * ones the backend kept). DG_ERR_NUMERIC names block, step and position. */
static dg_status ref_stats(ref_state *r, int32_t b, int32_t k, float T, dg_sc_source sc) {
  dg_context *ctx = r->ctx;
  const dg_gen_params *p = r->p;
  int32_t bad = -1;
  DG_TRY(dg_draw_uniforms(&r->cs, b, k, r->uni)); /* the same numbers a device draws itself (Philox) */
  dg_status st = ctx->m->bk->step_stats(ctx, r->canvas, sc, T, p->proposal, p->seed, b, k, r->uni, r->logits, r->ps,
                                        &bad);
  if (st != DG_OK && (st != DG_ERR_NUMERIC || bad < 0)) return st;
  if (bad >= 0)
    return dg_seterr(DG_ERR_NUMERIC, "non-finite logits at block %d, denoising step %d, canvas position %d", b, k, bad);
  return DG_OK;
}

/* Denoise canvas b (spec 6.1 steps 1-8); its tokens are r->amax of the last
 * step, *steps the forwards spent. */
static dg_status ref_block(ref_state *r, int32_t b, int32_t *steps) {
  dg_context *ctx = r->ctx;
  const dg_gen_params *p = r->p;
  const int32_t C = r->C;
  DG_TRY(dg_draw_canvas(&r->cs, b, 0, r->canvas));
  dg_stop_rule_reset(&r->stop);
  memcpy(r->amax, r->canvas, (size_t)C * sizeof(int32_t));
  dg_sc_source sc = DG_SC_NONE;
  *steps = 0;
  for (int32_t s = p->max_denoising_steps; s >= 1; s--) {
    int32_t k = p->max_denoising_steps - s; /* 0-based step index */
    (*steps)++;
    const float T = dg_temperature(p, s);
    DG_TRY(ref_stats(r, b, k, T, sc));
    double ent_sum = 0.0;
    for (int32_t i = 0; i < C; i++) { r->ent[i] = r->ps[i].entropy; ent_sum += r->ent[i]; r->amax[i] = r->ps[i].argmax; }
    int32_t n_acc = dg_entropy_bound_accept(r->ent, C, p->entropy_bound, r->acc, r->scratch);
    DG_TRY(dg_draw_canvas(&r->cs, b, k + 1, r->noise));
    for (int32_t i = 0; i < C; i++) r->next[i] = r->acc[i] ? r->ps[i].proposal : r->noise[i];
    const float mean_ent = (float)(ent_sum / C);
    const int stop = dg_stop_rule_update(&r->stop, r->amax, mean_ent);
    memcpy(r->canvas, r->next, (size_t)C * sizeof(int32_t));
    dg_step_info si = {b, k, s, T, n_acc, mean_ent, stop, r->amax, r->canvas, C, C, C, C, C};
    DG_TRY(dg_notify_step(p, &si));
    if (stop || s == 1) break;
    /* self-conditioning for the next step from z (spec 5), kept by the backend */
    DG_TRY(ctx->m->bk->sc_from_z(ctx, r->logits));
    sc = DG_SC_KEPT;
  }
  return DG_OK;
}

/* The reference sampler: dg_generate after validation, without turbo. */
static dg_status reference_generate(dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                                    dg_gen_result *res) {
  ref_state r;
  dg_status st = ref_alloc(&r, ctx, p);
  if (!st) st = dg_encode(ctx, prompt, n_prompt);
  const int32_t C = r.C;
  for (int32_t b = 0; !st && b < r.n_canvases; b++) {
    if (b > 0 && (st = dg_forward_encode(ctx, r.tally.out + (size_t)(b - 1) * C, C))) break; /* commit */
    int32_t steps = 0;
    if ((st = ref_block(&r, b, &steps))) break;
    int32_t *blk = r.tally.out + (size_t)b * C;
    memcpy(blk, r.amax, (size_t)C * sizeof(int32_t));
    const int32_t first_stop = dg_first_stop(p, blk, C);
    if (first_stop >= 0) r.tally.why = DG_FINISH_STOP;
    r.tally.n_forwarded += (int64_t)steps * C;
    st = dg_tally_block(&r.tally, ctx->m, p, res, b, C, first_stop >= 0 ? first_stop + 1 : C, steps);
    if (first_stop >= 0) break;
  }
  if (!st) dg_tally_result(&r.tally, p, res);
  ref_free(&r);
  dg_context_trim(ctx); /* the soft embedding's block scratch is not held between requests */
  return st;
}

dg_status dg_generate(dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                      dg_gen_result *res) {
  if (!ctx || !p || !res || (!prompt && n_prompt)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate: NULL argument");
  memset(res, 0, sizeof *res);
  DG_TRY(dg_generate_check(ctx, n_prompt, p));
  if (p->turbo.enabled) return dg_turbo_generate(ctx, prompt, n_prompt, p, res);
  return reference_generate(ctx, prompt, n_prompt, p, res);
}

dg_status dg_generate_batch(dg_context *const *ctxs, int32_t B, const int32_t *const *prompts, const size_t *n_prompts,
                            const dg_gen_params *params, dg_gen_result *results) {
  if (!ctxs || B < 1 || !prompts || !n_prompts || !params || !results)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate_batch: NULL argument or B = %d < 1", B);
  for (int32_t i = 0; i < B; i++) memset(&results[i], 0, sizeof results[i]);
  const dg_model *m = ctxs[0] ? ctxs[0]->m : NULL;
  for (int32_t i = 0; i < B; i++) {
    if (!ctxs[i] || ctxs[i]->m != m)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate_batch: context %d is NULL or belongs to another model", i);
    for (int32_t j = 0; j < i; j++)
      if (ctxs[j] == ctxs[i]) return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate_batch: contexts %d and %d are the same", j, i);
    if (!params[i].turbo.enabled)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate_batch: canvas %d does not enable diffusion_turbo (batching is a turbo technique)", i);
    if (!prompts[i] || n_prompts[i] == 0)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate_batch: prompt %d is empty", i);
    dg_status st = dg_generate_check(ctxs[i], n_prompts[i], &params[i]);
    if (st) return dg_prefixerr(st, "canvas %d", i);
  }
  return dg_turbo_generate_batch(ctxs, B, prompts, n_prompts, params, results);
}
