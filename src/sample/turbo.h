/* turbo.h: the turbo engine (spec 7, after mlx-vlm PR #1384; turbo.c):
 * dg_turbo_generate, reached through dg_generate with params->turbo.enabled,
 * and dg_turbo_generate_batch behind dg_generate_batch. It is built on its
 * array-level parts (turbo_parts.h, included here for the tests that use
 * them) and the sampler core (sampler.h), and calls nothing above it. */
#ifndef DG_TURBO_H
#define DG_TURBO_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"
#include "sample/turbo_parts.h" /* top-K, K-way distribution, acceptance, guards, buckets, approximate SC rows */

struct dg_context;

/* The per-step trace (dg_turbo_trace, dgemma.h) goes to the per-call
 * callback params->on_turbo_trace; there is no process-wide hook. */

/* The turbo engine (spec 7): called by dg_generate after validation when
 * params->turbo.enabled. Same contract as dg_generate. */
dg_status dg_turbo_generate(struct dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                            dg_gen_result *res);

/* The turbo engine over B sequences at once: called by dg_generate_batch
 * (generate.c) once it has checked the arguments (B >= 1 distinct contexts
 * of one model, every params[i] valid for its prompt with turbo.enabled).
 * Same contract as dg_generate_batch. */
dg_status dg_turbo_generate_batch(struct dg_context *const *ctxs, int32_t B, const int32_t *const *prompts,
                                  const size_t *n_prompts, const dg_gen_params *params, dg_gen_result *results);

#endif
