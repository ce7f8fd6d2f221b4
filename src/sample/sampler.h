/* sampler.h: the sampler core (sampler.c), shared by the reference sampler
 * (generate.c, spec 6.1) and the turbo engine (turbo.c, spec 7): the
 * temperature and acceptance of the reference (its per-position math is
 * rowstats.h's, shared with the backends), the random draws, the
 * stable-and-confident stop, emission and result filling, and the checks of
 * a parameter set. Nothing here runs a forward pass or calls either sampler,
 * so both policies sit on top of it (docs/architecture.md). */
#ifndef DG_SAMPLER_H
#define DG_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"
#include "model/rowstats.h" /* dg_position_stats, the per-position math the backends share */

struct dg_model;
struct dg_context;

/* ---- per-position math (spec 6.1) --------------------------------------- */

/* Entropy-bound acceptance (EB-sampler, arXiv 2505.24857): sort positions by
 * ascending entropy (ties by index) and accept position j iff the fp32 sum of
 * the entropies before it is <= bound. ent [n], accept [n] (0/1), scratch at
 * least 8*n bytes. Returns the number accepted (always >= 1 when n >= 1). */
int32_t dg_entropy_bound_accept(const float *ent, int32_t n, float bound, uint8_t *accept, void *scratch);

/* T_s = t_min + (t_max - t_min) * (s / N) in fp32 (spec 6.1 step 2). */
float dg_temperature(const dg_gen_params *p, int32_t s);

/* ---- parameter checks ----------------------------------------------------- */

/* Check a parameter set against a model: DG_ERR_INVALID_ARG naming the field. */
dg_status dg_gen_params_validate(const struct dg_model *m, const dg_gen_params *p);

/* dg_gen_params_validate plus the context-capacity checks of dg_generate for
 * a prompt of n_prompt tokens. */
dg_status dg_generate_check(const struct dg_context *ctx, size_t n_prompt, const dg_gen_params *p);

/* ---- the random draws ------------------------------------------------------ */

/* The source of the random canvases and proposal uniforms of one generation:
 * the replay streams of the parameters when given, else Philox keyed by
 * (seed, stream, block, draw) (rng.h). Fill p, C, V and bits; the positions
 * start at 0. */
typedef struct dg_draws {
  const dg_gen_params *p;
  size_t replay_pos; /* int32 values of p->replay_canvases consumed */
  size_t uni_pos;    /* floats of p->replay_uniforms consumed */
  int32_t C, V;      /* canvas length, vocabulary */
  uint32_t *bits;    /* [C] scratch for the generator, owned by the caller */
} dg_draws;

/* Canvas out [C] of uniform random ids: draw = 0 for block's initial canvas,
 * k + 1 for the renoise canvas of denoising step k. Errors: DG_ERR_REPLAY
 * (stream exhausted, or an id outside [0, V)), naming block, draw and index. */
dg_status dg_draw_canvas(dg_draws *d, int32_t block, int32_t draw, int32_t *out);

/* Proposal uniforms u [C] in [0, 1) of step `step` of `block`: replayed for
 * DG_PROPOSAL_REPLAY_UNIFORM, drawn for DG_PROPOSAL_SAMPLE, untouched for
 * DG_PROPOSAL_ARGMAX. Errors: DG_ERR_REPLAY (exhausted, or a value outside
 * [0, 1)). */
dg_status dg_draw_uniforms(dg_draws *d, int32_t block, int32_t step, float *u);

/* ---- stop rules ------------------------------------------------------------ */

/* 1 if id is one of p's stop ids. */
int dg_is_stop(const dg_gen_params *p, int32_t id);
/* Index of the first stop id among tok [n], or -1. */
int32_t dg_first_stop(const dg_gen_params *p, const int32_t *tok, int32_t n);

/* The stable-and-confident stop of the reference (Transformers'
 * StableAndConfidentStoppingCriteria, spec 6.1 step 7): stop when the argmax
 * canvas equals each of the last SH argmax canvases and the mean entropy is
 * below the threshold (a threshold <= 0 never stops). hist [max(SH, 1), C]
 * is the caller's buffer. */
typedef struct dg_stop_rule {
  int32_t *hist;     /* [SH, C] the last SH argmax canvases, oldest first; -1 = none yet */
  int32_t SH, C;     /* stability_threshold, canvas length */
  float threshold;   /* confidence_threshold, nats */
} dg_stop_rule;
/* Forget the history (a new canvas). */
void dg_stop_rule_reset(dg_stop_rule *r);
/* Compare amax [C] with the history, push it, and return 1 if the rule fires
 * for this step's mean entropy mean_ent. */
int dg_stop_rule_update(dg_stop_rule *r, const int32_t *amax, float mean_ent);

/* ---- emission and results -------------------------------------------------- */

/* Of a block's n_valid emitted tokens, those counted as generated text
 * (dg_gen_result.n_visible): every token the detokenizer shows, i.e. not
 * pad_id and not a special token of the tokenizer (without a tokenizer: not
 * one of config.json's eos_token_id), plus the stop id that ended generation
 * (stopped = 1: tok[n_valid - 1] is it), as "up to and including the first
 * stop id" counts it. With no stop ids ({"eos_token_id": []}) the canvases of
 * <eos> a model writes after its answer are therefore not counted. */
int32_t dg_gen_visible_tokens(const struct dg_model *m, const dg_gen_params *p, const int32_t *tok, int32_t n_valid,
                              int stopped);

/* What one generation has produced so far; both samplers keep one and hand
 * it to the result at the end. */
typedef struct dg_gen_tally {
  int32_t *out;          /* [n_canvases, C] the emitted canvases (pads after the valid tokens); owned */
  int32_t n_out;         /* tokens in out (whole canvases) */
  int32_t n_blocks;      /* canvases finished */
  int32_t n_steps;       /* decoder forwards of the finished canvases (repair forwards included) */
  int64_t n_forwarded;   /* canvas rows those forwards ran through the decoder */
  dg_finish_reason why;  /* DG_FINISH_LENGTH until a stop id (or the turbo repeat guard) ends the generation */
  double t0;             /* dg_now_s() at the request's start */
} dg_gen_tally;

/* Close canvas b (tokens at t->out + b * C, n_valid of them valid; t->why
 * already says whether it ended the generation): pad the rest with pad_id,
 * count the canvas and its `steps` forwards, add n_valid / n_visible to res,
 * and call p->on_block. Errors: DG_ERR_ABORTED when the callback asks. */
dg_status dg_tally_block(dg_gen_tally *t, const struct dg_model *m, const dg_gen_params *p, dg_gen_result *res,
                         int32_t b, int32_t C, int32_t n_valid, int32_t steps);

/* Move the tally into res (tokens, counts, finish reason, tokens per
 * forward, seconds since t->t0); t->out becomes NULL. */
void dg_tally_result(dg_gen_tally *t, const dg_gen_params *p, dg_gen_result *res);

/* Call p->on_step (if any) with *si. Errors: DG_ERR_ABORTED naming block and step. */
dg_status dg_notify_step(const dg_gen_params *p, const dg_step_info *si);

/* Monotonic clock, seconds. */
double dg_now_s(void);

#endif
