/* synth.h: write a small random DiffusionGemma model directory (config.json,
 * generation_config.json, model.safetensors, optionally tokenizer.json) laid
 * out exactly as Transformers saves one (spec 3.1), for tests that need a
 * model without fixtures: bad-input tables, determinism, invariances. */
#ifndef DG_TEST_SYNTH_H
#define DG_TEST_SYNTH_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/kernels.h"
#include "io/safetensors.h"

typedef struct synth_cfg {
  int vocab, hidden, n_layers, heads, kv, head_dim, gkv, ghd, inter, moe_inter, experts, topk, window, canvas;
  const char *pattern; /* one char per layer: 'S' sliding, 'F' full */
  dg_dtype dt;         /* DG_F32, DG_BF16 or DG_F16 */
  int round_f16;       /* with DG_F32: store f16-representable values */
  unsigned seed;
  int with_tokenizer;
} synth_cfg;

static inline synth_cfg synth_default(void) {
  synth_cfg c = {384, 32, 3, 4, 2, 8, 1, 16, 24, 12, 5, 2, 6, 8, "SSF", DG_F32, 0, 1, 0};
  return c;
}

typedef struct synth_buf {
  dg_tensor *t;
  size_t n, cap;
  void **data;
  int round_f16; /* f32 tensors hold f16-representable values (to compare with an f16 twin) */
} synth_buf;

static inline float synth_rand(unsigned *s) { /* LCG, uniform [-1, 1) */
  *s = *s * 1103515245u + 12345u;
  return (float)((*s >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* n token ids in [0, V) from an LCG seeded with seed (deterministic test inputs). */
static inline void synth_random_ids(int32_t *ids, int n, int V, unsigned seed) {
  for (int i = 0; i < n; i++) { seed = seed * 1103515245u + 12345u; ids[i] = (int32_t)((seed >> 8) % (unsigned)V); }
}

static inline void synth_add(synth_buf *b, const char *name, dg_dtype dt, int nd, const int64_t *shape, unsigned *seed,
                             float scale, float offset) {
  if (b->n == b->cap) {
    b->cap = b->cap ? b->cap * 2 : 64;
    b->t = realloc(b->t, b->cap * sizeof *b->t);
    b->data = realloc(b->data, b->cap * sizeof *b->data);
  }
  size_t numel = 1;
  for (int i = 0; i < nd; i++) numel *= (size_t)shape[i];
  size_t es = dg_dtype_size(dt);
  char *d = malloc(numel * es + 1);
  for (size_t i = 0; i < numel; i++) {
    float v = offset + scale * synth_rand(seed);
    if (dt == DG_BF16) { uint16_t h = dg_f32_to_bf16(v); memcpy(d + 2 * i, &h, 2); }
    else if (dt == DG_F16) { uint16_t h = dg_f32_to_f16(v); memcpy(d + 2 * i, &h, 2); }
    else if (dt == DG_F32 && b->round_f16) { float r = dg_f16_to_f32(dg_f32_to_f16(v)); memcpy(d + 4 * i, &r, 4); }
    else memcpy(d + 4 * i, &v, 4);
  }
  dg_tensor *t = &b->t[b->n];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  t->dtype = dt;
  t->ndim = nd;
  for (int i = 0; i < nd; i++) t->shape[i] = shape[i];
  t->data = d;
  t->nbytes = numel * es;
  b->data[b->n++] = d;
}

static inline void synth_write_text(const char *dir, const char *file, const char *text) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  FILE *f = fopen(p, "w");
  if (!f) { fprintf(stderr, "synth: cannot write %s\n", p); abort(); }
  fputs(text, f);
  fclose(f);
}

/* A tokenizer.json with the Gemma pipeline: ids 0..107 control/unused ("\n" =
 * 107), 108..363 byte tokens, then a few pieces. extra_id >= 0 adds a piece
 * with that id (to provoke a vocabulary mismatch). */
static inline void synth_tokenizer(const char *dir, int extra_id) {
  size_t cap = 1 << 16, o = 0;
  char *s = malloc(cap);
  o += (size_t)snprintf(s + o, cap - o,
                        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
                        "{\"id\":0,\"content\":\"<pad>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
                        "{\"id\":1,\"content\":\"<eos>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
                        "{\"id\":2,\"content\":\"<bos>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
                        "{\"id\":3,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
                        "{\"id\":107,\"content\":\"\\n\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false}],"
                        "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},"
                        "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false},"
                        "\"post_processor\":null,"
                        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
                        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"continuing_subword_prefix\":null,"
                        "\"end_of_word_suffix\":null,\"fuse_unk\":true,\"byte_fallback\":true,\"ignore_merges\":false,\"vocab\":{"
                        "\"<pad>\":0,\"<eos>\":1,\"<bos>\":2,\"<unk>\":3");
  for (int i = 4; i < 107; i++) o += (size_t)snprintf(s + o, cap - o, ",\"<unused%d>\":%d", i, i);
  o += (size_t)snprintf(s + o, cap - o, ",\"\\n\":107");
  for (int b = 0; b < 256; b++) o += (size_t)snprintf(s + o, cap - o, ",\"<0x%02X>\":%d", b, 108 + b);
  const char *pieces[] = {"\\u2581", "a", "b", "ab", "\\u2581ab"};
  for (int i = 0; i < 5; i++) o += (size_t)snprintf(s + o, cap - o, ",\"%s\":%d", pieces[i], 364 + i);
  if (extra_id >= 0) o += (size_t)snprintf(s + o, cap - o, ",\"zz\":%d", extra_id);
  o += (size_t)snprintf(s + o, cap - o, "},\"merges\":[[\"a\",\"b\"],[\"\\u2581\",\"ab\"]]}}");
  synth_write_text(dir, "tokenizer.json", s);
  free(s);
}

/* Write the model directory `dir` (created if needed). Returns 0 on success. */
static inline int synth_model_dir(const char *dir, const synth_cfg *c) {
  mkdir(dir, 0755);
  char cfg[8192];
  size_t o = 0;
  o += (size_t)snprintf(cfg + o, sizeof cfg - o,
                        "{\"architectures\":[\"DiffusionGemmaForBlockDiffusion\"],\"model_type\":\"diffusion_gemma\","
                        "\"canvas_length\":%d,\"tie_word_embeddings\":true,\"text_config\":{\"model_type\":\"diffusion_gemma_text\","
                        "\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
                        "\"num_key_value_heads\":%d,\"head_dim\":%d,\"num_global_key_value_heads\":%d,\"global_head_dim\":%d,"
                        "\"intermediate_size\":%d,\"moe_intermediate_size\":%d,\"num_experts\":%d,\"top_k_experts\":%d,"
                        "\"sliding_window\":%d,\"hidden_activation\":\"gelu_pytorch_tanh\",\"rms_norm_eps\":1e-6,"
                        "\"final_logit_softcapping\":30.0,\"max_position_embeddings\":4096,\"pad_token_id\":0,"
                        "\"bos_token_id\":2,\"eos_token_id\":1,\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\","
                        "\"rope_theta\":10000.0},\"full_attention\":{\"rope_type\":\"proportional\",\"partial_rotary_factor\":0.25,"
                        "\"rope_theta\":1000000.0}},\"layer_types\":[",
                        c->canvas, c->vocab, c->hidden, c->n_layers, c->heads, c->kv, c->head_dim, c->gkv, c->ghd, c->inter,
                        c->moe_inter, c->experts, c->topk, c->window);
  for (int i = 0; i < c->n_layers; i++)
    o += (size_t)snprintf(cfg + o, sizeof cfg - o, "%s\"%s\"", i ? "," : "",
                          c->pattern[i] == 'F' ? "full_attention" : "sliding_attention");
  snprintf(cfg + o, sizeof cfg - o, "]}}");
  synth_write_text(dir, "config.json", cfg);
  synth_write_text(dir, "generation_config.json",
                   "{\"max_new_tokens\":16,\"max_denoising_steps\":4,\"sampler_config\":{\"_cls_name\":"
                   "\"EntropyBoundSamplerConfig\",\"entropy_bound\":0.1},\"t_min\":0.4,\"t_max\":0.8,"
                   "\"stability_threshold\":1,\"confidence_threshold\":0.005,\"eos_token_id\":[1],\"pad_token_id\":0}");
  if (c->with_tokenizer) synth_tokenizer(dir, -1);

  synth_buf b = {0};
  b.round_f16 = c->round_f16;
  unsigned seed = c->seed;
  const int64_t H = c->hidden, V = c->vocab, I = c->inter, IE = c->moe_inter, E = c->experts;
  char n[256];
  synth_add(&b, "model.decoder.embed_tokens.weight", c->dt, 2, (int64_t[]){V, H}, &seed, 0.5f, 0.0f);
  synth_add(&b, "model.decoder.norm.weight", c->dt, 1, (int64_t[]){H}, &seed, 0.5f, 1.0f);
  synth_add(&b, "model.decoder.self_conditioning.pre_norm.weight", c->dt, 1, (int64_t[]){H}, &seed, 0.5f, 1.0f);
  synth_add(&b, "model.decoder.self_conditioning.gate_proj.weight", c->dt, 2, (int64_t[]){I, H}, &seed, 0.3f, 0.0f);
  synth_add(&b, "model.decoder.self_conditioning.up_proj.weight", c->dt, 2, (int64_t[]){I, H}, &seed, 0.3f, 0.0f);
  synth_add(&b, "model.decoder.self_conditioning.down_proj.weight", c->dt, 2, (int64_t[]){H, I}, &seed, 0.3f, 0.0f);
  for (int i = 0; i < c->n_layers; i++) {
    int full = c->pattern[i] == 'F';
    int64_t D = full ? c->ghd : c->head_dim, NKV = full ? c->gkv : c->kv, NH = c->heads;
#define L(s) (snprintf(n, sizeof n, "model.decoder.layers.%d." s, i), n)
    synth_add(&b, L("self_attn.q_proj.weight"), c->dt, 2, (int64_t[]){NH * D, H}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("self_attn.k_proj.weight"), c->dt, 2, (int64_t[]){NKV * D, H}, &seed, 0.3f, 0.0f);
    if (!full) synth_add(&b, L("self_attn.v_proj.weight"), c->dt, 2, (int64_t[]){NKV * D, H}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("self_attn.o_proj.weight"), c->dt, 2, (int64_t[]){H, NH * D}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("self_attn.q_norm.weight"), c->dt, 1, (int64_t[]){D}, &seed, 0.5f, 1.0f);
    synth_add(&b, L("self_attn.k_norm.weight"), c->dt, 1, (int64_t[]){D}, &seed, 0.5f, 1.0f);
    const char *norms[] = {"input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
                           "post_feedforward_layernorm_1.weight", "pre_feedforward_layernorm_2.weight",
                           "post_feedforward_layernorm_2.weight", "post_feedforward_layernorm.weight"};
    for (int k = 0; k < 7; k++) {
      snprintf(n, sizeof n, "model.decoder.layers.%d.%s", i, norms[k]);
      synth_add(&b, n, c->dt, 1, (int64_t[]){H}, &seed, 0.5f, 1.0f);
    }
    synth_add(&b, L("mlp.gate_proj.weight"), c->dt, 2, (int64_t[]){I, H}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("mlp.up_proj.weight"), c->dt, 2, (int64_t[]){I, H}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("mlp.down_proj.weight"), c->dt, 2, (int64_t[]){H, I}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("router.proj.weight"), c->dt, 2, (int64_t[]){E, H}, &seed, 0.5f, 0.0f);
    synth_add(&b, L("router.scale"), c->dt, 1, (int64_t[]){H}, &seed, 0.5f, 1.0f);
    synth_add(&b, L("router.per_expert_scale"), c->dt, 1, (int64_t[]){E}, &seed, 0.5f, 1.0f);
    synth_add(&b, L("experts.gate_up_proj"), c->dt, 3, (int64_t[]){E, 2 * IE, H}, &seed, 0.3f, 0.0f);
    synth_add(&b, L("experts.down_proj"), c->dt, 3, (int64_t[]){E, H, IE}, &seed, 0.3f, 0.0f);
    unsigned s2 = seed;
    synth_add(&b, L("layer_scalar"), c->dt, 1, (int64_t[]){1}, &seed, 0.3f, 1.0f);
    snprintf(n, sizeof n, "model.encoder.language_model.layers.%d.layer_scalar", i);
    synth_add(&b, n, c->dt, 1, (int64_t[]){1}, &s2, 0.3f, 1.0f); /* equal to the decoder's, as the converter clones it */
#undef L
  }
  char p[1024];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  dg_status st = dg_st_write(p, b.t, b.n, NULL, NULL, 0);
  for (size_t i = 0; i < b.n; i++) { free((void *)b.t[i].name); free(b.data[i]); }
  free(b.t);
  free(b.data);
  return st == DG_OK ? 0 : -1;
}

#endif
