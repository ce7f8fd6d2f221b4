/* test_sampler.c: the reference sampler's per-position math (spec 6.1),
 * Philox4x32-10 known answers (Random123 kat_vectors), the temperature
 * schedule, entropy-bound acceptance worked by hand, and --gen-kwargs parsing. */
#include <math.h>

#include "io/config.h"
#include "base/rng.h"
#include "sample/sampler.h"
#include "testutil.h"

static void test_philox_kat(void **state) {
  (void)state;
  static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                     {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                     {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
  static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                      {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                      {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    dg_philox4x32_10(ctr[i], key[i], out);
    for (int j = 0; j < 4; j++) assert_int_equal(out[j], want[i][j]);
  }
  /* the stream helper addresses lanes of consecutive counters */
  uint32_t a[9], b[4];
  dg_rng_u32(7, 1, 2, 3, 9, a);
  uint32_t c[4] = {2, 3, 2, 1}, k[2] = {7, 0};
  dg_philox4x32_10(c, k, b);
  assert_int_equal(a[8], b[0]);
  /* id mapping covers [0, V) */
  assert_int_equal(dg_rng_to_id(0u, 262144), 0);
  assert_int_equal(dg_rng_to_id(0xffffffffu, 262144), 262143);
  assert_true(dg_rng_to_unit(0xffffffffu) < 1.0f);
}

static void test_temperature(void **state) {
  (void)state;
  dg_gen_params p;
  dg_gen_params_reference_defaults(&p);
  assert_true(dg_temperature(&p, 48) == 0.8f);         /* first step: t_max */
  assert_float_equal(dg_temperature(&p, 24), 0.6f, 1e-7);
  /* last step: 0.4 + 0.4 * (1/48) = 0.408333 (spec 6.1) */
  assert_float_equal(dg_temperature(&p, 1), 0.4f + 0.4f * (1.0f / 48.0f), 1e-7);
}

static void test_position_stats(void **state) {
  (void)state;
  dg_pos_stats ps;
  /* uniform logits: entropy log V, argmax is the first index */
  float z[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(dg_position_stats(z, 8, 0.0f, DG_PROPOSAL_ARGMAX, &ps), DG_OK);
  assert_float_equal(ps.entropy, logf(8.0f), 1e-6);
  assert_int_equal(ps.argmax, 0);
  assert_int_equal(ps.proposal, 0);
  /* inverse CDF over p = (1/8 each): u = 0.5 -> cdf_v <= 0.5 for v = 0..3 -> index 4 */
  assert_int_equal(dg_position_stats(z, 8, 0.5f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.proposal, 4);
  assert_int_equal(dg_position_stats(z, 8, 0.0f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.proposal, 0);
  assert_int_equal(dg_position_stats(z, 8, 0.9999f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.proposal, 7);
  /* two-point distribution: z = (0, log 3) -> p = (1/4, 3/4); H = -(1/4 ln 1/4 + 3/4 ln 3/4) */
  float z2[2] = {0.0f, logf(3.0f)};
  assert_int_equal(dg_position_stats(z2, 2, 0.2f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.argmax, 1);
  assert_int_equal(ps.proposal, 0); /* 0.2 < 0.25 */
  assert_float_equal(ps.entropy, -(0.25 * log(0.25) + 0.75 * log(0.75)), 1e-6);
  assert_float_equal(ps.max_prob, 0.75f, 1e-6);
  assert_int_equal(dg_position_stats(z2, 2, 0.3f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.proposal, 1);
  /* a zero-probability entry is never drawn */
  float z3[3] = {-INFINITY, 0.0f, 0.0f};
  assert_int_equal(dg_position_stats(z3, 3, 0.0f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_ERR_NUMERIC);
  float z4[3] = {-200.0f, 0.0f, 0.0f}; /* exp underflows to exactly 0 in fp32 */
  assert_int_equal(dg_position_stats(z4, 3, 0.0f, DG_PROPOSAL_REPLAY_UNIFORM, &ps), DG_OK);
  assert_int_equal(ps.proposal, 1);
  float zn[2] = {NAN, 0.0f};
  assert_int_equal(dg_position_stats(zn, 2, 0.0f, DG_PROPOSAL_ARGMAX, &ps), DG_ERR_NUMERIC);
}

static void test_entropy_bound(void **state) {
  (void)state;
  uint8_t acc[6];
  char scratch[64];
  /* sorted: 0.00 (pos 3), 0.02 (pos 0), 0.05 (pos 5), 0.04? -> sort: 0.00,0.02,0.04,0.05,0.3,0.9
   * cumsum before each: 0, 0, 0.02, 0.06, 0.11, 0.41 -> accept the first four (<= 0.1) */
  float ent[6] = {0.02f, 0.9f, 0.04f, 0.0f, 0.3f, 0.05f};
  int n = dg_entropy_bound_accept(ent, 6, 0.1f, acc, scratch);
  assert_int_equal(n, 4);
  uint8_t want[6] = {1, 0, 1, 1, 0, 1};
  for (int i = 0; i < 6; i++) assert_int_equal(acc[i], want[i]);
  /* the lowest-entropy position is always accepted, even if it alone exceeds the bound */
  float big[3] = {5.0f, 3.0f, 4.0f};
  n = dg_entropy_bound_accept(big, 3, 0.1f, acc, scratch);
  assert_int_equal(n, 1);
  assert_int_equal(acc[1], 1);
  /* all zero entropies: everything accepted */
  float zero[4] = {0, 0, 0, 0};
  assert_int_equal(dg_entropy_bound_accept(zero, 4, 0.1f, acc, scratch), 4);
}

static void test_gen_kwargs(void **state) {
  (void)state;
  dg_gen_params p;
  dg_gen_params_reference_defaults(&p);
  assert_dg_ok(dg_gen_params_apply_json(&p, "{\"entropy_bound\": 0.25, \"max_denoising_steps\": 12, "
                                            "\"eos_token_id\": [1, 7], \"seed\": 42, \"proposal\": \"argmax\"}"));
  assert_float_equal(p.entropy_bound, 0.25f, 0);
  assert_int_equal(p.max_denoising_steps, 12);
  assert_int_equal(p.n_stop_ids, 2);
  assert_int_equal(p.stop_ids[1], 7);
  assert_int_equal(p.seed, 42);
  assert_int_equal(p.proposal, DG_PROPOSAL_ARGMAX);
  assert_dg_ok(dg_gen_params_apply_json(&p, "{\"sampler_config\": {\"_cls_name\": \"EntropyBoundSamplerConfig\", "
                                            "\"entropy_bound\": 0.5}, \"diffusion_stopping_config\": "
                                            "{\"stability_threshold\": 3, \"confidence_threshold\": 0.01}}"));
  assert_float_equal(p.entropy_bound, 0.5f, 0);
  assert_int_equal(p.stability_threshold, 3);
  dg_gen_params before = p;
  /* unknown key: rejected, message lists the valid keys, params unchanged */
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"entropy_bond\": 0.2}"), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "entropy_bond"));
  assert_non_null(strstr(dg_last_error(), "max_denoising_steps"));
  assert_memory_equal(&p, &before, sizeof p);
  /* wrong types and ranges */
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"max_denoising_steps\": \"many\"}"), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "max_denoising_steps"));
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"max_denoising_steps\": 0}"), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"max_denoising_steps\": 2.5}"), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"t_min\": 0.9}"), DG_ERR_INVALID_ARG); /* above t_max */
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"proposal\": \"beam\"}"), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"eos_token_id\": [1, -3]}"), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_gen_params_apply_json(&p, "[1, 2]"), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"seed\": 1"), DG_ERR_JSON);
  assert_memory_equal(&p, &before, sizeof p);
}

/* Every --gen-kwargs error quotes the offending key and value (review finding: "must be a number, got a
 * string", "malformed JSON near byte 0" said neither what was given nor where). */
static void test_gen_kwargs_messages(void **state) {
  (void)state;
  static const struct { const char *json; dg_status st; const char *want; } cases[] = {
      {"{\"entropy_bound\": \"x\"}", DG_ERR_INVALID_ARG, "field entropy_bound must be a number, got a string \"x\""},
      {"{\"max_denoising_steps\": 2.5}", DG_ERR_INVALID_ARG,
       "field max_denoising_steps must be an integer, got a number 2.5"},
      {"{\"max_denoising_steps\": \"many\"}", DG_ERR_INVALID_ARG, "got a string \"many\""},
      {"{\"eos_token_id\": [1, -3]}", DG_ERR_INVALID_ARG, "field eos_token_id[1] is not a token id (a number -3)"},
      {"{\"eos_token_id\": [1, \"a\"]}", DG_ERR_INVALID_ARG, "field eos_token_id[1] is not a token id (a string \"a\")"},
      {"{\"eos_token_id\": \"1\"}", DG_ERR_INVALID_ARG, "must be an id or a list of ids, got a string \"1\""},
      {"{\"seed\": -1}", DG_ERR_INVALID_ARG, "field seed must be a non-negative integer, got a number -1"},
      {"{\"proposal\": 3}", DG_ERR_INVALID_ARG, "field proposal must be \"sample\" or \"argmax\", got a number 3"},
      {"{\"sampler_config\": [1]}", DG_ERR_INVALID_ARG, "field sampler_config must be an object, got an array [1]"},
      {"{\"diffusion_turbo\": 1}", DG_ERR_INVALID_ARG, "turbo option diffusion_turbo must be true or false, got a number 1"},
      {"{\"turbo_threshold\": [0.9]}", DG_ERR_INVALID_ARG, "got an array [0.9];"},
      {"{\"entropy_bound\": \"0123456789012345678901234567890123456789xyz\"}", DG_ERR_INVALID_ARG,
       "got a string \"012345678901234567890123456789012345678..."},
      {"[1, 2]", DG_ERR_INVALID_ARG, "gen-kwargs: expected a JSON object, got an array [1,2]"},
      {"not json", DG_ERR_JSON, "gen-kwargs: malformed JSON near byte 0 (\"not json\")"},
      {"{\"seed\": 1}x", DG_ERR_JSON, "gen-kwargs: malformed JSON near byte 11 (\"x\")"},
      {"{\"a\": \xC3\xA9\"}", DG_ERR_JSON, "near byte 6 (\"\\xC3\\xA9\\\"}\")"}, /* bytes escaped */
      {"{\"seed\": 1", DG_ERR_JSON, "gen-kwargs: malformed JSON: it ends early, after byte 10"},
      {"", DG_ERR_JSON, "gen-kwargs: empty; expected a JSON object"},
      {" \n", DG_ERR_JSON, "gen-kwargs: empty; expected a JSON object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dg_gen_params p;
    dg_gen_params_reference_defaults(&p);
    dg_status st = dg_gen_params_apply_json(&p, cases[i].json);
    printf("# %s -> %s\n", cases[i].json, dg_last_error());
    if (st != cases[i].st || !strstr(dg_last_error(), cases[i].want))
      fail_msg("%s: status %d (want %d), message \"%s\" (want \"%s\")", cases[i].json, st, cases[i].st, dg_last_error(),
               cases[i].want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_kat),   cmocka_unit_test(test_temperature),
      cmocka_unit_test(test_position_stats), cmocka_unit_test(test_entropy_bound),
      cmocka_unit_test(test_gen_kwargs),
      cmocka_unit_test(test_gen_kwargs_messages),
  };
  return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
