/* generate.c: the reference block-diffusion sampler (spec 6.1), exactly as
 * Transformers' DiffusionGemmaGenerationMixin.generate with the
 * EntropyBoundSampler, the linear temperature schedule and the
 * StableAndConfidentStoppingCriteria:
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
 * The fp32 arithmetic of the reference is mirrored where it decides tokens
 * (temperature, division, acceptance comparison); reductions use double. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/backend.h"
#include "dg_error.h"
#include "model.h"
#include "rng.h"
#include "sampler.h"
#include "turbo.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

float dg_temperature(const dg_gen_params *p, int32_t s) {
  /* LinearTemperatureScheduleLogitsProcessor with cur_step an int32 tensor:
   * (s / N) is a float32 true division; the Python floats are cast to fp32. */
  float frac = (float)s / (float)p->max_denoising_steps;
  float span = (float)((double)p->t_max - (double)p->t_min);
  return p->t_min + span * frac;
}

dg_status dg_position_stats(const float *z, int32_t V, float u, int mode, dg_pos_stats *out) {
  float mx = -FLT_MAX;
  int32_t amax = 0;
  for (int32_t v = 0; v < V; v++) {
    if (!isfinite(z[v])) return DG_ERR_NUMERIC;
    if (z[v] > mx) { mx = z[v]; amax = v; }
  }
  double sum = 0.0;
  for (int32_t v = 0; v < V; v++) sum += exp((double)z[v] - (double)mx);
  double lse = (double)mx + log(sum);
  /* entropy = -sum p (z - lse), p = exp(z - lse) */
  double ent = 0.0;
  for (int32_t v = 0; v < V; v++) {
    double lp = (double)z[v] - lse;
    ent -= exp(lp) * lp;
  }
  out->argmax = amax;
  out->entropy = (float)(ent > 0.0 ? ent : 0.0);
  out->max_prob = (float)exp((double)mx - lse);
  if (mode == DG_PROPOSAL_ARGMAX) {
    out->proposal = amax;
  } else {
    /* inverse CDF: index = #{v : cdf_v <= u * total}, cdf in double over fp32
     * probabilities p_v = softmax(z) (as torch.softmax computes them). */
    float fs = (float)sum;
    double cdf = 0.0, target;
    double total = 0.0;
    for (int32_t v = 0; v < V; v++) total += (double)(expf(z[v] - mx) / fs);
    target = (double)u * total;
    int32_t idx = V - 1;
    for (int32_t v = 0; v < V; v++) {
      cdf += (double)(expf(z[v] - mx) / fs);
      if (cdf > target) { idx = v; break; }
    }
    out->proposal = idx;
  }
  return DG_OK;
}

/* Entropy-bound acceptance (EB-sampler, arXiv 2505.24857; spec 6.1 step 5).
 * accept[i] = 1 for the positions, sorted by ascending entropy (ties by
 * position), whose preceding cumulative entropy is <= bound. The cumulative
 * sum is accumulated in double and rounded to fp32 like torch.cumsum on the
 * CPU; the comparison is in fp32. order: scratch [n]. Returns the count. */
typedef struct { float h; int32_t i; } ent_idx;
/* dg_cuda_step_stats writes dg_pos_stats records (its dg_cuda_pos_stats has this layout) */
_Static_assert(sizeof(dg_pos_stats) == 16, "dg_pos_stats layout is shared with src/cuda/common.cuh");
static int cmp_ent(const void *a, const void *b) {
  const ent_idx *x = a, *y = b;
  if (x->h < y->h) return -1;
  if (x->h > y->h) return 1;
  return (x->i > y->i) - (x->i < y->i);
}

int32_t dg_entropy_bound_accept(const float *ent, int32_t n, float bound, uint8_t *accept, void *scratch) {
  ent_idx *o = scratch;
  for (int32_t i = 0; i < n; i++) { o[i].h = ent[i]; o[i].i = i; }
  qsort(o, (size_t)n, sizeof *o, cmp_ent);
  double cum = 0.0;
  int32_t cnt = 0;
  for (int32_t j = 0; j < n; j++) {
    cum += (double)o[j].h;
    float c = (float)cum;
    int acc = (c - o[j].h) <= bound;
    accept[o[j].i] = (uint8_t)acc;
    cnt += acc;
  }
  return cnt;
}

void dg_gen_result_free(dg_gen_result *r) {
  if (!r) return;
  free(r->tokens);
  r->tokens = NULL;
  r->n_tokens = 0;
}

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

static int is_stop(const dg_gen_params *p, int32_t id) {
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] == id) return 1;
  return 0;
}

/* The random canvas source: replay stream or Philox. draw = 0 for a block's
 * initial canvas, k + 1 for the renoise canvas of step k. */
typedef struct canvas_src {
  const dg_gen_params *p;
  size_t replay_pos; /* int32 values consumed */
  size_t uni_pos;    /* uniforms consumed */
  int32_t C, V;
  uint32_t *bits;    /* [C] */
} canvas_src;

static dg_status draw_canvas(canvas_src *cs, int32_t block, int32_t draw, int32_t *out) {
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

static dg_status draw_uniforms(canvas_src *cs, int32_t block, int32_t step, float *u) {
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
  if (p->stability_threshold < 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "stability_threshold = %d must be >= 0", p->stability_threshold);
  if (p->n_stop_ids < 0 || p->n_stop_ids > DG_MAX_STOP_IDS)
    return dg_seterr(DG_ERR_INVALID_ARG, "n_stop_ids = %d is outside [0, %d]", p->n_stop_ids, DG_MAX_STOP_IDS);
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] < 0 || p->stop_ids[i] >= V)
      return dg_seterr(DG_ERR_INVALID_ARG, "stop id %d is outside the vocabulary [0, %d)", p->stop_ids[i], V);
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
  }
  return DG_OK;
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

dg_status dg_generate(dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                      dg_gen_result *res) {
  if (!ctx || !p || !res || (!prompt && n_prompt)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_generate: NULL argument");
  memset(res, 0, sizeof *res);
  const dg_model *m = ctx->m;
  const int32_t C = m->cfg.canvas_length, V = m->cfg.vocab_size;
  DG_TRY(dg_generate_check(ctx, n_prompt, p));
  const int32_t n_canvases = (int32_t)((p->max_new_tokens + (int64_t)C - 1) / C);
  if (p->turbo.enabled) return dg_turbo_generate(ctx, prompt, n_prompt, p, res);

  double t0 = now_s();
  dg_status st = DG_OK;
  const int32_t SH = p->stability_threshold;
  /* on CUDA the logits stay on the device: only [C] statistics come back per step */
  const size_t CV = ctx->cuda ? 1 : (size_t)C * V;
  /* z = logits / T in place: the raw logits are not needed once divided (one
   * [C, V] buffer per request, not two; issue 16) */
  float *logits = malloc(CV * sizeof(float));
  float *z = logits;
  int32_t *canvas = malloc((size_t)C * sizeof(int32_t));
  int32_t *next = malloc((size_t)C * sizeof(int32_t));
  int32_t *amax = malloc((size_t)C * sizeof(int32_t));
  int32_t *noise = malloc((size_t)C * sizeof(int32_t));
  int32_t *hist = malloc((size_t)(SH > 0 ? SH : 1) * C * sizeof(int32_t));
  float *ent = malloc((size_t)C * sizeof(float));
  float *uni = calloc((size_t)C, sizeof(float));
  uint8_t *acc = malloc((size_t)C);
  void *scratch = malloc((size_t)C * 8);
  dg_pos_stats *ps = malloc((size_t)C * sizeof *ps);
  int32_t *out = malloc((size_t)n_canvases * C * sizeof(int32_t));
  canvas_src cs = {p, 0, 0, C, V, malloc((size_t)C * sizeof(uint32_t))};
  if (!logits || !z || !canvas || !next || !amax || !noise || !hist || !ent || !uni || !acc || !scratch || !ps ||
      !out || !cs.bits) {
    st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the sampler state (canvas %d x vocab %d)", C, V);
    goto done;
  }
  if ((st = dg_encode(ctx, prompt, n_prompt))) goto done;

  int32_t n_steps_total = 0, n_blocks = 0, finished = 0, n_out = 0;
  for (int32_t b = 0; b < n_canvases; b++) {
    if (b > 0 && (st = dg_forward_encode(ctx, out + (size_t)(b - 1) * C, C))) goto done; /* commit */
    if ((st = draw_canvas(&cs, b, 0, canvas))) goto done;
    for (int32_t i = 0; i < SH * C; i++) hist[i] = -1;
    memcpy(amax, canvas, (size_t)C * sizeof(int32_t));
    const float *soft = NULL;
    int32_t steps = 0;
    for (int32_t s = p->max_denoising_steps; s >= 1; s--) {
      int32_t k = p->max_denoising_steps - s; /* 0-based step index */
      steps++;
      const float T = dg_temperature(p, s);
      int bad = -1;
      if (ctx->cuda) { /* decoder and per-position statistics on the device (uniforms drawn there too) */
        if ((st = dg_cuda_decode(ctx->cuda, canvas, ctx->len, soft ? 1 : 0, NULL, NULL))) goto done;
        if (p->proposal == DG_PROPOSAL_REPLAY_UNIFORM && (st = draw_uniforms(&cs, b, k, uni))) goto done;
        st = dg_cuda_step_stats(ctx->cuda, T, (int)p->proposal, p->seed, b, k, uni, ps, &bad);
        if (st != DG_OK && st != DG_ERR_NUMERIC) goto done;
        st = DG_OK;
      } else {
        if ((st = dg_forward_decode(ctx, canvas, soft, logits))) goto done;
        for (size_t i = 0; i < (size_t)C * V; i++) z[i] = logits[i] / T; /* in place (z == logits) */
        if ((st = draw_uniforms(&cs, b, k, uni))) goto done;
#pragma omp parallel for num_threads(m->n_threads) schedule(static) reduction(max : bad)
        for (int32_t i = 0; i < C; i++)
          if (dg_position_stats(z + (size_t)i * V, V, uni[i], (int)p->proposal, &ps[i]) != DG_OK) bad = i;
      }
      if (bad >= 0) {
        st = dg_seterr(DG_ERR_NUMERIC, "non-finite logits at block %d, denoising step %d, canvas position %d", b, k, bad);
        goto done;
      }
      double ent_sum = 0.0;
      for (int32_t i = 0; i < C; i++) { ent[i] = ps[i].entropy; ent_sum += ent[i]; amax[i] = ps[i].argmax; }
      int32_t n_acc = dg_entropy_bound_accept(ent, C, p->entropy_bound, acc, scratch);
      if ((st = draw_canvas(&cs, b, k + 1, noise))) goto done;
      for (int32_t i = 0; i < C; i++) next[i] = acc[i] ? ps[i].proposal : noise[i];
      /* stable-and-confident stop */
      int stable = 1;
      for (int32_t h = 0; h < SH && stable; h++)
        for (int32_t i = 0; i < C; i++)
          if (hist[(size_t)h * C + i] != amax[i]) { stable = 0; break; }
      if (SH > 0) {
        memmove(hist, hist + C, (size_t)(SH - 1) * C * sizeof(int32_t));
        memcpy(hist + (size_t)(SH - 1) * C, amax, (size_t)C * sizeof(int32_t));
      }
      float mean_ent = (float)(ent_sum / C);
      int stop = p->confidence_threshold > 0.0f && stable && mean_ent < p->confidence_threshold;
      memcpy(canvas, next, (size_t)C * sizeof(int32_t));
      if (p->on_step) {
        dg_step_info si = {b, k, s, T, n_acc, mean_ent, stop, amax, canvas, C, C, C, C, C};
        if (p->on_step(&si, p->user_data)) { st = dg_seterr(DG_ERR_ABORTED, "aborted by the step callback at block %d, step %d", b, k); goto done; }
      }
      if (stop || s == 1) break;
      /* self-conditioning for the next step from z (spec 5) */
      if (ctx->cuda) {
        if ((st = dg_cuda_soft_from_z(ctx->cuda))) goto done;
        soft = z; /* marks "soft embedding on the device" */
        continue;
      }
      if ((st = dg_soft_embedding(ctx, z, ctx->soft))) goto done;
      soft = ctx->soft;
    }
    n_steps_total += steps;
    n_blocks++;
    int32_t *blk = out + (size_t)b * C;
    memcpy(blk, amax, (size_t)C * sizeof(int32_t));
    n_out += C;
    int32_t first_stop = -1;
    for (int32_t i = 0; i < C; i++)
      if (is_stop(p, blk[i])) { first_stop = i; break; }
    int32_t n_valid_blk = C;
    if (first_stop >= 0) {
      finished = 1;
      for (int32_t i = first_stop + 1; i < C; i++) blk[i] = p->pad_id;
      n_valid_blk = first_stop + 1;
    }
    res->n_valid += n_valid_blk;
    res->n_visible += dg_gen_visible_tokens(ctx->m, p, blk, n_valid_blk, first_stop >= 0);
    if (p->on_block) {
      dg_block_info bi = {b, blk, C, n_valid_blk, steps, finished};
      if (p->on_block(&bi, p->user_data)) { st = dg_seterr(DG_ERR_ABORTED, "aborted by the block callback at block %d", b); goto done; }
    }
    if (finished) break;
  }
  res->tokens = out;
  out = NULL;
  res->n_tokens = n_out;
  res->n_blocks = n_blocks;
  res->n_steps = n_steps_total;
  res->finished = finished;
  res->finish_reason = finished ? DG_FINISH_STOP : DG_FINISH_LENGTH;
  res->n_forwarded = (int64_t)n_steps_total * C;
  int32_t non_pad = 0;
  for (int32_t i = 0; i < n_out; i++) non_pad += res->tokens[i] != p->pad_id;
  res->tokens_per_forward = n_steps_total ? (double)non_pad / n_steps_total : 0.0;
  res->seconds = now_s() - t0;
done:
  free(logits); free(canvas); free(next); free(amax); free(noise); free(hist); free(ent);
  free(uni); free(acc); free(scratch); free(ps); free(out); free(cs.bits);
  return st;
}
