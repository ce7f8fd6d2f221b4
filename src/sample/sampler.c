/* sampler.c: the sampler core (sampler.h), shared by the reference sampler
 * (generate.c) and the turbo engine (turbo.c): the per-position math of
 * spec 6.1, the checks of a parameter set, the random draws (replay streams
 * or Philox), the stable-and-confident stop, emission and result filling.
 *
 * The fp32 arithmetic of the reference is mirrored where it decides tokens
 * (temperature, acceptance comparison); reductions use double. */
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dg_error.h"
#include "model/model.h"
#include "base/rng.h"

double dg_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- per-position math (spec 6.1) ------------------------------------------ */

float dg_temperature(const dg_gen_params *p, int32_t s) {
  /* LinearTemperatureScheduleLogitsProcessor with cur_step an int32 tensor:
   * (s / N) is a float32 true division; the Python floats are cast to fp32. */
  float frac = (float)s / (float)p->max_denoising_steps;
  float span = (float)((double)p->t_max - (double)p->t_min);
  return p->t_min + span * frac;
}

/* Entropy-bound acceptance (EB-sampler, arXiv 2505.24857; spec 6.1 step 5).
 * accept[i] = 1 for the positions, sorted by ascending entropy (ties by
 * position), whose preceding cumulative entropy is <= bound. The cumulative
 * sum is accumulated in double and rounded to fp32 like torch.cumsum on the
 * CPU; the comparison is in fp32. scratch: 8 n bytes (8-aligned). Returns the
 * count. The sort is dg_val_idx_sort's (in place, no allocation) over the
 * negated entropies: descending -h with ties to the lower position is
 * ascending h with ties to the lower position (negation is exact). */
/* dg_cuda_step_stats writes dg_pos_stats records (its dg_cuda_pos_stats has this layout) */
_Static_assert(sizeof(dg_pos_stats) == 16, "dg_pos_stats layout is shared with src/cuda/common.cuh");
int32_t dg_entropy_bound_accept(const float *ent, int32_t n, float bound, uint8_t *accept, void *scratch) {
  dg_val_idx *o = scratch;
  for (int32_t i = 0; i < n; i++) { o[i].v = -ent[i]; o[i].i = i; }
  dg_val_idx_sort(o, n);
  double cum = 0.0;
  int32_t cnt = 0;
  for (int32_t j = 0; j < n; j++) {
    const float h = -o[j].v;
    cum += (double)h;
    float c = (float)cum;
    int acc = (c - h) <= bound;
    accept[o[j].i] = (uint8_t)acc;
    cnt += acc;
  }
  return cnt;
}

/* ---- parameter checks ---------------------------------------------------- */

dg_status dg_gen_params_validate(const dg_model *m, const dg_gen_params *p) {
  const int32_t V = m->cfg.vocab_size;
  if (p->max_new_tokens <= 0) return dg_seterr(DG_ERR_INVALID_ARG, "max_new_tokens = %d must be positive", p->max_new_tokens);
  if (p->max_denoising_steps <= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "max_denoising_steps = %d must be positive", p->max_denoising_steps);
  if (!(p->entropy_bound > 0.0f) || !isfinite(p->entropy_bound))
    return dg_seterr(DG_ERR_INVALID_ARG, "entropy_bound = %g must be a positive number", p->entropy_bound);
  if (!(p->t_min >= 0.0f) || !(p->t_max > p->t_min) || !isfinite(p->t_max))
    return dg_seterr(DG_ERR_INVALID_ARG, "temperature schedule t_min = %g, t_max = %g: need 0 <= t_min < t_max",
                     p->t_min, p->t_max);
  if (p->t_min == 0.0f)
    return dg_seterr(DG_ERR_INVALID_ARG, "t_min = 0 would divide the last step's logits by zero");
  /* z = softcapped logits / T in fp32 (spec 6.1): |softcapped logit| <= final_logit_softcapping, so z stays finite
   * for every T >= t_min iff cap / t_min does (rounding is monotone). A smaller t_min (a denormal, --temp 1e-38) made
   * z +-inf: the reference sampler failed with "non-finite logits" and the turbo engine's K-way softmax turned NaN
   * and accepted a whole canvas of noise. Without softcapping the logits have no bound: 1 / t_min must be finite. */
  const float cap = m->cfg.final_logit_softcapping > 0.0f ? m->cfg.final_logit_softcapping : 1.0f;
  if (!isfinite(cap / p->t_min))
    return dg_seterr(DG_ERR_INVALID_ARG,
                     "t_min = %g is too small: %s %g divided by it overflows float32 (for argmax proposals use "
                     "temperature 0)", p->t_min, m->cfg.final_logit_softcapping > 0.0f ? "a logit softcapped at" : "a logit of",
                     cap);
  if (p->stability_threshold < 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "stability_threshold = %d must be >= 0", p->stability_threshold);
  if (p->n_stop_ids < 0 || p->n_stop_ids > DG_MAX_STOP_IDS)
    return dg_seterr(DG_ERR_INVALID_ARG, "n_stop_ids = %d is outside [0, %d]", p->n_stop_ids, DG_MAX_STOP_IDS);
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] < 0 || p->stop_ids[i] >= V)
      return dg_seterr(DG_ERR_INVALID_ARG, "stop id (eos_token_id) %d is outside the vocabulary [0, %d)",
                       p->stop_ids[i], V);
  if (p->pad_id < 0 || p->pad_id >= V)
    return dg_seterr(DG_ERR_INVALID_ARG, "pad_token_id %d is outside the vocabulary [0, %d)", p->pad_id, V);
  if (p->proposal != DG_PROPOSAL_SAMPLE && p->proposal != DG_PROPOSAL_ARGMAX &&
      p->proposal != DG_PROPOSAL_REPLAY_UNIFORM)
    return dg_seterr(DG_ERR_INVALID_ARG, "unknown proposal mode %d", (int)p->proposal);
  if (p->proposal == DG_PROPOSAL_REPLAY_UNIFORM && !p->replay_uniforms)
    return dg_seterr(DG_ERR_INVALID_ARG, "proposal = replay-uniform needs replay_uniforms");
  if (p->turbo.enabled) {
    const dg_turbo_params *t = &p->turbo;
    if (t->topk < 1 || t->topk > 4096 || t->topk > V)
      return dg_seterr(DG_ERR_INVALID_ARG, "turbo_topk = %d must be in [1, min(4096, vocab %d)]", t->topk, V);
    if (t->steps < 0) return dg_seterr(DG_ERR_INVALID_ARG, "turbo_steps = %d must be >= 1 (0 = none)", t->steps);
    if (t->accept != DG_TURBO_ACCEPT_ENTROPY_BOUND && t->accept != DG_TURBO_ACCEPT_CONFIDENCE)
      return dg_seterr(DG_ERR_INVALID_ARG, "unknown turbo_accept rule %d", (int)t->accept);
    if (!(t->threshold_hi > 0.0f && t->threshold_hi <= 1.0f) || !(t->threshold_lo > 0.0f && t->threshold_lo <= 1.0f) ||
        t->threshold_k0 < 0)
      return dg_seterr(DG_ERR_INVALID_ARG, "turbo_threshold [%g, %g, %d]: hi and lo must be in (0, 1], k0 >= 0",
                       t->threshold_hi, t->threshold_lo, t->threshold_k0);
    if (t->repeat_guard < 0)
      return dg_seterr(DG_ERR_INVALID_ARG, "turbo_repeat_guard = %d must be >= 0", t->repeat_guard);
    if (t->sc_mode != DG_TURBO_SC_EXACT && t->sc_mode != DG_TURBO_SC_TOPK && t->sc_mode != DG_TURBO_SC_ADAPTIVE)
      return dg_seterr(DG_ERR_INVALID_ARG, "unknown turbo_sc mode %d", (int)t->sc_mode);
    if (!(t->sc_tail_mass > 0.0f && t->sc_tail_mass <= 1.0f))
      return dg_seterr(DG_ERR_INVALID_ARG, "turbo_sc_tail_mass = %g must be in (0, 1]", t->sc_tail_mass);
    if (t->head_rows < 0) return dg_seterr(DG_ERR_INVALID_ARG, "turbo_head_rows = %d must be >= 0", t->head_rows);
  }
  return DG_OK;
}

dg_status dg_gen_params_check(const dg_model *m, const dg_gen_params *p) {
  if (!m || !p) return dg_seterr(DG_ERR_INVALID_ARG, "dg_gen_params_check: NULL argument");
  return dg_gen_params_validate(m, p);
}

dg_status dg_generate_check(const dg_context *ctx, size_t n_prompt, const dg_gen_params *p) {
  const dg_model *m = ctx->m;
  const int32_t C = m->cfg.canvas_length;
  DG_TRY(dg_gen_params_validate(m, p));
  if (n_prompt == 0) return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate: empty prompt");
  const int32_t n_canvases = (int32_t)((p->max_new_tokens + (int64_t)C - 1) / C);
  /* the last canvas is never committed: the cache holds prompt + (n-1) canvases */
  int64_t need = (int64_t)ctx->len + (int64_t)n_prompt + (int64_t)(n_canvases - 1) * C;
  if (need > ctx->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL,
                     "prompt (%zu tokens after %d cached) + %d canvases of %d need %lld cache positions; the context holds %d",
                     n_prompt, ctx->len, n_canvases, C, (long long)need, ctx->cap);
  if (need + C > m->cfg.max_position_embeddings)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "generation would reach position %lld, past max_position_embeddings %d",
                     (long long)(need + C), m->cfg.max_position_embeddings);
  return DG_OK;
}

/* ---- the random draws ----------------------------------------------------- */

dg_status dg_draw_canvas(dg_draws *cs, int32_t block, int32_t draw, int32_t *out) {
  const dg_gen_params *p = cs->p;
  if (p->replay_canvases) {
    if (cs->replay_pos + (size_t)cs->C > p->replay_canvases_len)
      return dg_seterr(DG_ERR_REPLAY, "replay canvases exhausted at block %d, draw %d (%zu ids given, %zu used)", block,
                       draw, p->replay_canvases_len, cs->replay_pos);
    for (int32_t i = 0; i < cs->C; i++) {
      int32_t id = p->replay_canvases[cs->replay_pos + (size_t)i];
      if (id < 0 || id >= cs->V)
        return dg_seterr(DG_ERR_REPLAY, "replay canvas id %d at index %zu is outside [0, %d)", id,
                         cs->replay_pos + (size_t)i, cs->V);
      out[i] = id;
    }
    cs->replay_pos += (size_t)cs->C;
    return DG_OK;
  }
  dg_rng_u32(p->seed, DG_RNG_CANVAS, (uint32_t)block, (uint32_t)draw, (uint32_t)cs->C, cs->bits);
  for (int32_t i = 0; i < cs->C; i++) out[i] = dg_rng_to_id(cs->bits[i], cs->V);
  return DG_OK;
}

dg_status dg_draw_uniforms(dg_draws *cs, int32_t block, int32_t step, float *u) {
  const dg_gen_params *p = cs->p;
  if (p->proposal == DG_PROPOSAL_REPLAY_UNIFORM) {
    if (!p->replay_uniforms || cs->uni_pos + (size_t)cs->C > p->replay_uniforms_len)
      return dg_seterr(DG_ERR_REPLAY, "replay uniforms exhausted at block %d, step %d (%zu given, %zu used)", block,
                       step, p->replay_uniforms_len, cs->uni_pos);
    for (int32_t i = 0; i < cs->C; i++) {
      float x = p->replay_uniforms[cs->uni_pos + (size_t)i];
      if (!(x >= 0.0f && x < 1.0f))
        return dg_seterr(DG_ERR_REPLAY, "replay uniform %g at index %zu is outside [0, 1)", x, cs->uni_pos + (size_t)i);
      u[i] = x;
    }
    cs->uni_pos += (size_t)cs->C;
    return DG_OK;
  }
  if (p->proposal == DG_PROPOSAL_SAMPLE) {
    dg_rng_u32(p->seed, DG_RNG_PROPOSAL, (uint32_t)block, (uint32_t)step, (uint32_t)cs->C, cs->bits);
    for (int32_t i = 0; i < cs->C; i++) u[i] = dg_rng_to_unit(cs->bits[i]);
  }
  return DG_OK;
}

/* ---- stop rules ----------------------------------------------------------- */

int dg_is_stop(const dg_gen_params *p, int32_t id) {
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] == id) return 1;
  return 0;
}

int32_t dg_first_stop(const dg_gen_params *p, const int32_t *tok, int32_t n) {
  for (int32_t i = 0; i < n; i++)
    if (dg_is_stop(p, tok[i])) return i;
  return -1;
}

void dg_stop_rule_reset(dg_stop_rule *r) {
  for (int32_t i = 0; i < r->SH * r->C; i++) r->hist[i] = -1;
}

int dg_stop_rule_update(dg_stop_rule *r, const int32_t *amax, float mean_ent) {
  const int32_t SH = r->SH, C = r->C;
  int stable = 1;
  for (int32_t h = 0; h < SH && stable; h++)
    for (int32_t i = 0; i < C; i++)
      if (r->hist[(size_t)h * C + i] != amax[i]) { stable = 0; break; }
  if (SH > 0) {
    memmove(r->hist, r->hist + C, (size_t)(SH - 1) * C * sizeof(int32_t));
    memcpy(r->hist + (size_t)(SH - 1) * C, amax, (size_t)C * sizeof(int32_t));
  }
  return r->threshold > 0.0f && stable && mean_ent < r->threshold;
}

/* ---- emission and results ------------------------------------------------- */

int32_t dg_gen_visible_tokens(const dg_model *m, const dg_gen_params *p, const int32_t *tok, int32_t n_valid,
                              int stopped) {
  int32_t n = 0;
  for (int32_t i = 0; i < n_valid; i++) {
    const int32_t id = tok[i];
    int hidden = id == p->pad_id;
    if (!hidden && m->tok) hidden = dg_tokenizer_is_special(m->tok, id);
    else if (!hidden)
      for (int k = 0; k < m->cfg.n_eos; k++) hidden |= id == m->cfg.eos_ids[k];
    n += !hidden || (stopped && i == n_valid - 1);
  }
  return n;
}

void dg_gen_result_free(dg_gen_result *r) {
  if (!r) return;
  free(r->tokens);
  r->tokens = NULL;
  r->n_tokens = 0;
}

dg_status dg_tally_block(dg_gen_tally *t, const dg_model *m, const dg_gen_params *p, dg_gen_result *res,
                         int32_t b, int32_t C, int32_t n_valid, int32_t steps) {
  int32_t *blk = t->out + (size_t)b * C;
  for (int32_t i = n_valid; i < C; i++) blk[i] = p->pad_id;
  t->n_steps += steps;
  t->n_blocks++;
  t->n_out += C;
  res->n_valid += n_valid;
  const int32_t visible = dg_gen_visible_tokens(m, p, blk, n_valid, t->why == DG_FINISH_STOP);
  res->n_visible += visible;
  if (p->on_block) {
    dg_block_info bi = {b, blk, C, n_valid, steps, t->why != DG_FINISH_LENGTH, visible};
    if (p->on_block(&bi, p->user_data)) return dg_seterr(DG_ERR_ABORTED, "aborted by the block callback at block %d", b);
  }
  return DG_OK;
}

void dg_tally_result(dg_gen_tally *t, const dg_gen_params *p, dg_gen_result *res) {
  res->tokens = t->out;
  t->out = NULL;
  res->n_tokens = t->n_out;
  res->n_blocks = t->n_blocks;
  res->n_steps = t->n_steps;
  res->finished = t->why == DG_FINISH_STOP;
  res->finish_reason = t->why;
  res->n_forwarded = t->n_forwarded;
  int32_t non_pad = 0;
  for (int32_t i = 0; i < t->n_out; i++) non_pad += res->tokens[i] != p->pad_id;
  res->tokens_per_forward = t->n_steps ? (double)non_pad / t->n_steps : 0.0;
  res->seconds = dg_now_s() - t->t0;
}

dg_status dg_notify_step(const dg_gen_params *p, const dg_step_info *si) {
  if (p->on_step && p->on_step(si, p->user_data))
    return dg_seterr(DG_ERR_ABORTED, "aborted by the step callback at block %d, step %d", si->block, si->step);
  return DG_OK;
}
