/* sampler.h: per-position math of the reference sampler (spec 6.1), exposed
 * for tests and for other sampler front-ends. */
#ifndef DG_SAMPLER_H
#define DG_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

typedef struct dg_pos_stats {
  int32_t argmax;   /* first index of the maximum of z */
  int32_t proposal; /* argmax, or the inverse-CDF draw for uniform u */
  float entropy;    /* -sum p log p of softmax(z), nats */
  float max_prob;   /* max_v softmax(z)_v */
} dg_pos_stats;

/* Statistics of one canvas position from its processed logits z [V]
 * (z = softcapped logits / T). mode: a dg_proposal; for SAMPLE and
 * REPLAY_UNIFORM the proposal is #{v : cdf_v <= u * cdf_{V-1}} (clamped to
 * V-1), cdf accumulated in double over the fp32 probabilities, which is the
 * definition tools/make_goldens.py patches into torch.multinomial.
 * Returns DG_ERR_NUMERIC (without a message) if z holds a NaN or Inf. */
dg_status dg_position_stats(const float *z, int32_t V, float u, int mode, dg_pos_stats *out);

/* Entropy-bound acceptance (EB-sampler, arXiv 2505.24857): sort positions by
 * ascending entropy (ties by index) and accept position j iff the fp32 sum of
 * the entropies before it is <= bound. ent [n], accept [n] (0/1), scratch at
 * least 8*n bytes. Returns the number accepted (always >= 1 when n >= 1). */
int32_t dg_entropy_bound_accept(const float *ent, int32_t n, float bound, uint8_t *accept, void *scratch);

/* T_s = t_min + (t_max - t_min) * (s / N) in fp32 (spec 6.1 step 2). */
float dg_temperature(const dg_gen_params *p, int32_t s);

/* Check a parameter set against a model: DG_ERR_INVALID_ARG naming the field. */
struct dg_model;
dg_status dg_gen_params_validate(const struct dg_model *m, const dg_gen_params *p);

/* dg_gen_params_validate plus the context-capacity checks of dg_generate for
 * a prompt of n_prompt tokens. */
struct dg_context;
dg_status dg_generate_check(const struct dg_context *ctx, size_t n_prompt, const dg_gen_params *p);

/* Of a block's n_valid emitted tokens, those counted as generated text
 * (dg_gen_result.n_visible): every token the detokenizer shows, i.e. not
 * pad_id and not a special token of the tokenizer (without a tokenizer: not
 * one of config.json's eos_token_id), plus the stop id that ended generation
 * (stopped = 1: tok[n_valid - 1] is it), as "up to and including the first
 * stop id" counts it. With no stop ids ({"eos_token_id": []}) the canvases of
 * <eos> a model writes after its answer are therefore not counted. */
int32_t dg_gen_visible_tokens(const dg_model *m, const dg_gen_params *p, const int32_t *tok, int32_t n_valid,
                              int stopped);

#endif
