/* mkrandom.c: dg_mkrandom, the library side of `dgemma mkrandom`: a
 * DiffusionGemma checkpoint with the shapes of a config (the 26B-A4B one of
 * spec 1.2 by default) and random weights, written tensor by tensor (never
 * the whole model in memory), optionally with MLX affine-quantized modules
 * (quant.h), so that the full-size engine can be benchmarked without the
 * real weights.
 *
 * Values follow Transformers' initialisation of the model
 * (huggingface/transformers, src/transformers/modeling_utils.py:
 * PreTrainedModel._init_weights; src/transformers/models/diffusion_gemma/
 * modeling_diffusion_gemma.py: DiffusionGemmaPreTrainedModel._init_weights):
 *  - every nn.Linear weight (q/k/v/o, dense MLP, router.proj, the
 *    self-conditioning MLP) and the expert stacks gate_up_proj / down_proj:
 *    normal(0, initializer_range);
 *  - the embedding (nn.Embedding with padding_idx = pad_token_id):
 *    normal(0, initializer_range), then row pad_token_id set to zero;
 *  - every RMSNorm weight ("RMSNorm" in the class name), router.scale,
 *    router.per_expert_scale and layer_scalar: ones.
 * initializer_range is text_config's (the reference reads
 * config.get_text_config()), else the top level's, else 0.02. The draws are
 * the project's counter-based generator (mkrandom.h), not torch's: the same
 * distribution, not the same numbers. Weights are stored in bf16 (the
 * checkpoint's dtype); a quantized module quantizes those bf16 values exactly
 * as `dgemma quantize` would (so quantizing a bf16 mkrandom checkpoint gives
 * the same bytes).
 *
 * Layout: the Hugging Face one of spec 3.1 (model.decoder.*, the encoder's
 * layer_scalar copies, no lm_head), shards of at most max_shard_bytes
 * (model-0000i-of-0000N.safetensors + model.safetensors.index.json, or
 * model.safetensors), config.json (+ the "quantization" block and its
 * "quantization_config" mirror when something is quantized, as
 * dg_quantize writes them), generation_config.json (spec 1.3), and the
 * tokenizer files of a source directory. Quantized expert stacks take MLX's
 * ".weight" names, as dg_quantize gives them. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "writers/ckpt_write.h"
#include "io/config.h"
#include "base/dg_error.h"
#include "base/dg_io.h"
#include "dgemma.h"
#include "dgemma_tools.h"
#include "base/dtype.h"
#include "writers/mkrandom.h"
#include "io/quant.h"
#include "base/rng.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

/* ---- the draws ------------------------------------------------------------ */

uint64_t dg_mkrandom_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis and prime */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* The four normals of Philox block k (mkrandom.h). */
static inline void normals4(const uint32_t key[2], uint64_t h, uint32_t k, float z[4]) {
  const uint32_t ctr[4] = {k, (uint32_t)h, (uint32_t)(h >> 32), DG_RNG_INIT};
  uint32_t r[4];
  dg_philox4x32_10(ctr, key, r);
  for (int j = 0; j < 4; j += 2) {
    float u1 = (float)(((double)r[j] + 0.5) * (1.0 / 4294967296.0)); /* in [2^-33, 1] */
    float a = (float)((double)r[j + 1] * (2.0 * M_PI / 4294967296.0));
    float rad = sqrtf(-2.0f * logf(u1)), sn, cs;
    sincosf(a, &sn, &cs);
    z[j] = rad * cs;
    z[j + 1] = rad * sn;
  }
}

void dg_mkrandom_normals(uint64_t seed, uint64_t h, uint64_t first, size_t n, float std, float *out) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  size_t i = 0;
  while (i < n) {
    uint64_t e = first + i;
    float z[4];
    normals4(key, h, (uint32_t)(e >> 2), z);
    for (unsigned j = (unsigned)(e & 3); j < 4 && i < n; j++, i++) out[i] = std * z[j];
  }
}

/* ---- built-in configurations ------------------------------------------------ */

/* The text_config lines both built-in configurations share (spec 1.2's
 * values): the special token ids, initializer_range, dtype, RoPE. */
#define TEXT_IDS_ROPE \
    "    \"pad_token_id\": 0,\n" \
    "    \"eos_token_id\": 1,\n" \
    "    \"bos_token_id\": 2,\n" \
    "    \"initializer_range\": 0.02,\n" \
    "    \"dtype\": \"bfloat16\",\n" \
    "    \"rope_parameters\": {\n" \
    "      \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},\n" \
    "      \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0}\n" \
    "    },\n"

/* google/diffusiongemma-26B-A4B-it as spec 1.1-1.2 give it (text_config
 * complete; vision_config with the fields the spec lists, for the record:
 * no vision weights are written). */
static const char REAL_HEAD[] =
    "{\n"
    "  \"architectures\": [\"DiffusionGemmaForBlockDiffusion\"],\n"
    "  \"model_type\": \"diffusion_gemma\",\n"
    "  \"canvas_length\": 256,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"eos_token_id\": [1, 106],\n"
    "  \"boi_token_id\": 255999,\n"
    "  \"eoi_token_id\": 258882,\n"
    "  \"image_token_id\": 258880,\n"
    "  \"vision_soft_tokens_per_image\": 280,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"dtype\": \"bfloat16\",\n"
    "  \"vision_config\": {\"model_type\": \"gemma4_vision\", \"hidden_size\": 1152, \"num_hidden_layers\": 27,\n"
    "    \"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"head_dim\": 72, \"intermediate_size\": 4304,\n"
    "    \"patch_size\": 16, \"pooling_kernel_size\": 3, \"standardize\": true, \"rope_parameters\": {\"rope_theta\": 100.0}},\n"
    "  \"text_config\": {\n"
    "    \"model_type\": \"diffusion_gemma_text\",\n"
    "    \"vocab_size\": 262144,\n"
    "    \"hidden_size\": 2816,\n"
    "    \"num_hidden_layers\": 30,\n"
    "    \"num_attention_heads\": 16,\n"
    "    \"num_key_value_heads\": 8,\n"
    "    \"num_global_key_value_heads\": 2,\n"
    "    \"head_dim\": 256,\n"
    "    \"global_head_dim\": 512,\n"
    "    \"sliding_window\": 1024,\n"
    "    \"max_position_embeddings\": 262144,\n"
    "    \"intermediate_size\": 2112,\n"
    "    \"moe_intermediate_size\": 704,\n"
    "    \"num_experts\": 128,\n"
    "    \"top_k_experts\": 8,\n"
    "    \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
    "    \"rms_norm_eps\": 1e-06,\n"
    "    \"final_logit_softcapping\": 30.0,\n"
    "    \"attention_bias\": false,\n"
    "    \"attention_dropout\": 0.0,\n"
    "    \"tie_word_embeddings\": true,\n"
    "    \"use_bidirectional_attention\": \"vision\",\n"
    TEXT_IDS_ROPE
    "    \"layer_types\": [";

/* A small model of the same structure (every dimension a multiple of 64 so
 * that every module quantizes at group 64), for tests and quick runs. */
static const char SMALL_CONFIG[] =
    "{\n"
    "  \"architectures\": [\"DiffusionGemmaForBlockDiffusion\"],\n"
    "  \"model_type\": \"diffusion_gemma\",\n"
    "  \"canvas_length\": 32,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"eos_token_id\": [1, 106],\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"dtype\": \"bfloat16\",\n"
    "  \"text_config\": {\n"
    "    \"model_type\": \"diffusion_gemma_text\",\n"
    "    \"vocab_size\": 1024,\n"
    "    \"hidden_size\": 128,\n"
    "    \"num_hidden_layers\": 6,\n"
    "    \"num_attention_heads\": 4,\n"
    "    \"num_key_value_heads\": 2,\n"
    "    \"num_global_key_value_heads\": 1,\n"
    "    \"head_dim\": 32,\n"
    "    \"global_head_dim\": 64,\n"
    "    \"sliding_window\": 64,\n"
    "    \"max_position_embeddings\": 4096,\n"
    "    \"intermediate_size\": 256,\n"
    "    \"moe_intermediate_size\": 128,\n"
    "    \"num_experts\": 8,\n"
    "    \"top_k_experts\": 2,\n"
    "    \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
    "    \"rms_norm_eps\": 1e-06,\n"
    "    \"final_logit_softcapping\": 30.0,\n"
    "    \"attention_bias\": false,\n"
    "    \"tie_word_embeddings\": true,\n"
    TEXT_IDS_ROPE
    "    \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\",\n"
    "                    \"sliding_attention\", \"sliding_attention\", \"full_attention\"]\n"
    "  }\n"
    "}\n";

/* spec 1.3 */
static const char GENERATION_CONFIG[] =
    "{\n"
    "  \"bos_token_id\": 2,\n"
    "  \"pad_token_id\": 0,\n"
    "  \"eos_token_id\": [1, 106, 50],\n"
    "  \"max_new_tokens\": 256,\n"
    "  \"max_denoising_steps\": 48,\n"
    "  \"sampler_config\": {\"_cls_name\": \"EntropyBoundSamplerConfig\", \"entropy_bound\": 0.1},\n"
    "  \"t_min\": 0.4,\n"
    "  \"t_max\": 0.8,\n"
    "  \"stability_threshold\": 1,\n"
    "  \"confidence_threshold\": 0.005\n"
    "}\n";

/* The real config as text (malloc'd): REAL_HEAD + 30 layer types + the end. */
static char *real_config_text(void) {
  size_t cap = sizeof REAL_HEAD + 30 * 24 + 64;
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t o = (size_t)snprintf(s, cap, "%s", REAL_HEAD);
  for (int i = 0; i < 30; i++) /* [S,S,S,S,S,F] x 5: full layers 5, 11, 17, 23, 29 */
    o += (size_t)snprintf(s + o, cap - o, "%s\"%s\"", i ? ", " : "", i % 6 == 5 ? "full_attention" : "sliding_attention");
  snprintf(s + o, cap - o, "]\n  }\n}\n");
  return s;
}

/* ---- the plan ------------------------------------------------------------- */

enum { MK_NORMAL = 0, MK_EMBED = 1, MK_ONES = 2 };

typedef struct mk_item {
  char hf_name[192];     /* the float tensor's Hugging Face name (the draw's address) */
  char module[192];      /* its module path (quantization block key) */
  int cls;               /* DG_QCLASS_* or -1 */
  int init;              /* MK_* */
  int ndim;
  int64_t shape[3];
  int bits, group_size;  /* 0 = bf16 */
  int shard;
  size_t idx[3];         /* index of weight (/scales/biases) in the shard's tensor list */
  int n_out;             /* 1 or 3 */
  char out_name[3][200];
  int64_t out_shape[3][3];
  dg_dtype out_dtype[3];
  uint64_t out_bytes[3];
} mk_item;

static const char *mk_module(const void *items, size_t i, int *bits, int *group_size) {
  const mk_item *it = (const mk_item *)items + i;
  *bits = it->bits;
  *group_size = it->group_size;
  return it->module;
}

typedef struct mk_plan {
  mk_item *it;
  size_t n, cap;
} mk_plan;

static dg_status plan_add(mk_plan *p, const char *name, int init, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  if (p->n == p->cap) {
    size_t nc = p->cap ? 2 * p->cap : 1024;
    mk_item *t = realloc(p->it, nc * sizeof *t);
    if (!t) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory planning the tensors");
    p->it = t;
    p->cap = nc;
  }
  mk_item *it = &p->it[p->n++];
  memset(it, 0, sizeof *it);
  snprintf(it->hf_name, sizeof it->hf_name, "%s", name);
  it->init = init;
  it->ndim = ndim;
  it->shape[0] = d0;
  it->shape[1] = d1;
  it->shape[2] = d2;
  it->cls = dg_quant_class_of(name);
  return DG_OK;
}

/* Every text tensor of spec 3.1 for config c, in the order Transformers
 * names them: embedding, per layer, final norm, self-conditioning, then the
 * encoder's layer_scalar copies. */
static dg_status plan_tensors(const dg_config *c, mk_plan *p) {
  const int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, M = c->moe_intermediate_size,
                E = c->n_experts, NH = c->n_heads;
  char n[192];
#define ADD(init, nd, a, b, d, ...) \
  do { snprintf(n, sizeof n, __VA_ARGS__); DG_TRY(plan_add(p, n, init, nd, a, b, d)); } while (0)
  ADD(MK_EMBED, 2, V, H, 0, "model.decoder.embed_tokens.weight");
  for (int i = 0; i < c->n_layers; i++) {
    const int64_t d = c->head_dim[i], kv = c->n_kv_heads[i];
#define L "model.decoder.layers.%d."
    ADD(MK_NORMAL, 2, NH * d, H, 0, L "self_attn.q_proj.weight", i);
    ADD(MK_NORMAL, 2, kv * d, H, 0, L "self_attn.k_proj.weight", i);
    if (!c->is_full[i]) ADD(MK_NORMAL, 2, kv * d, H, 0, L "self_attn.v_proj.weight", i);
    ADD(MK_NORMAL, 2, H, NH * d, 0, L "self_attn.o_proj.weight", i);
    ADD(MK_ONES, 1, d, 0, 0, L "self_attn.q_norm.weight", i);
    ADD(MK_ONES, 1, d, 0, 0, L "self_attn.k_norm.weight", i);
    static const char *const norms[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                        "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                                        "post_feedforward_layernorm_2", "post_feedforward_layernorm"};
    for (int k = 0; k < 7; k++) ADD(MK_ONES, 1, H, 0, 0, L "%s.weight", i, norms[k]);
    ADD(MK_NORMAL, 2, I, H, 0, L "mlp.gate_proj.weight", i);
    ADD(MK_NORMAL, 2, I, H, 0, L "mlp.up_proj.weight", i);
    ADD(MK_NORMAL, 2, H, I, 0, L "mlp.down_proj.weight", i);
    ADD(MK_NORMAL, 2, E, H, 0, L "router.proj.weight", i);
    ADD(MK_ONES, 1, H, 0, 0, L "router.scale", i);
    ADD(MK_ONES, 1, E, 0, 0, L "router.per_expert_scale", i);
    ADD(MK_NORMAL, 3, E, 2 * M, H, L "experts.gate_up_proj", i);
    ADD(MK_NORMAL, 3, E, H, M, L "experts.down_proj", i);
    ADD(MK_ONES, 1, 1, 0, 0, L "layer_scalar", i);
#undef L
  }
  ADD(MK_ONES, 1, H, 0, 0, "model.decoder.norm.weight");
  ADD(MK_ONES, 1, H, 0, 0, "model.decoder.self_conditioning.pre_norm.weight");
  ADD(MK_NORMAL, 2, I, H, 0, "model.decoder.self_conditioning.gate_proj.weight");
  ADD(MK_NORMAL, 2, I, H, 0, "model.decoder.self_conditioning.up_proj.weight");
  ADD(MK_NORMAL, 2, H, I, 0, "model.decoder.self_conditioning.down_proj.weight");
  for (int i = 0; i < c->n_layers; i++)
    ADD(MK_ONES, 1, 1, 0, 0, "model.encoder.language_model.layers.%d.layer_scalar", i);
#undef ADD
  return DG_OK;
}

/* ---- writing -------------------------------------------------------------- */

dg_mkrandom_params dg_mkrandom_default_params(void) {
  dg_mkrandom_params p;
  memset(&p, 0, sizeof p);
  p.config = "real";
  p.bits = 4;
  p.group_size = 64;
  p.max_shard_bytes = 5000000000LL;
  return p;
}

/* Tokenizer files of a model directory: tokenizer*, special_tokens_map.json,
 * chat_template*. */
static int is_tokenizer_file(const char *nm) {
  return !strncmp(nm, "tokenizer", 9) || !strcmp(nm, "special_tokens_map.json") || !strncmp(nm, "chat_template", 13);
}

/* What the row loop of fill_item reads and writes: one chunk of rows
 * [r0, r0 + nr) of the tensor, into the chunk's buffers. */
typedef struct mk_rows {
  const mk_item *it;
  uint64_t seed, h;        /* the draw's key and the tensor's name hash */
  float std;
  int32_t pad_row;         /* the embedding's zero row */
  int64_t cols, r0;
  int q;                   /* quantized: codes, scales and biases; else bf16 */
  size_t rb, sbb;          /* bytes per row of main_buf, of sc (= of bi) */
  uint8_t *main_buf, *sc, *bi;
} mk_rows;

/* Row r of the chunk: its values (ones, the zero padding row, or the draws),
 * then bf16, or quantized from the bf16 values. */
static void fill_row(void *ctx, int64_t r, float *row) {
  const mk_rows *m = ctx;
  const mk_item *it = m->it;
  const int64_t cols = m->cols, gr = m->r0 + r;
  if (it->init == MK_ONES) {
    for (int64_t k = 0; k < cols; k++) row[k] = 1.0f;
  } else if (it->init == MK_EMBED && gr == m->pad_row) {
    memset(row, 0, (size_t)cols * sizeof(float)); /* nn.Embedding padding_idx row */
  } else {
    dg_mkrandom_normals(m->seed, m->h, (uint64_t)gr * (uint64_t)cols, (size_t)cols, m->std, row);
  }
  if (!m->q) {
    uint16_t *o = (uint16_t *)(m->main_buf + (size_t)r * m->rb);
    for (int64_t k = 0; k < cols; k++) o[k] = dg_f32_to_bf16(row[k]);
  } else {
    for (int64_t k = 0; k < cols; k++) row[k] = dg_bf16_to_f32(dg_f32_to_bf16(row[k]));
    dg_quant_row(row, cols, it->bits, it->group_size, DG_BF16, m->main_buf + (size_t)r * m->rb,
                 m->sc + (size_t)r * m->sbb, m->bi + (size_t)r * m->sbb);
  }
}

/* Fill the bytes of one planned tensor (all its outputs) through the shard's
 * writer, in chunks of rows computed in parallel. */
static dg_status fill_item(const mk_item *it, dg_st_out *w, uint64_t seed, float std, int32_t pad_row, int nt,
                           int (*progress)(int64_t, int64_t, const char *, void *), void *ud, int64_t *done,
                           int64_t total) {
  const int64_t cols = it->shape[it->ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d < it->ndim - 1; d++) rows *= it->shape[d];
  const int q = it->bits != 0;
  mk_rows m = {.it = it, .seed = seed, .h = dg_mkrandom_name_hash(it->hf_name), .std = std, .pad_row = pad_row,
               .cols = cols, .q = q,
               .rb = q ? (size_t)dg_quant_row_bytes(cols, it->bits) : (size_t)cols * 2,
               .sbb = q ? (size_t)(cols / it->group_size) * 2 : 0};
  const size_t rb = m.rb, sbb = m.sbb;
  int64_t chunk = (int64_t)(((size_t)1 << 23) / (size_t)cols); /* ~8M values (16 MB of bf16) per chunk */
  if (chunk < 1) chunk = 1;
  if (chunk > rows) chunk = rows;
  m.main_buf = malloc((size_t)chunk * rb);
  m.sc = q ? malloc((size_t)chunk * sbb) : NULL;
  m.bi = q ? malloc((size_t)chunk * sbb) : NULL;
  if (!m.main_buf || (q && (!m.sc || !m.bi))) {
    free(m.main_buf); free(m.sc); free(m.bi);
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory writing %s", it->hf_name);
  }
  dg_status st = DG_OK;
  for (int64_t r0 = 0; r0 < rows && !st; r0 += chunk) {
    const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
    if (progress && progress(*done, total, it->hf_name, ud)) {
      st = dg_seterr(DG_ERR_ABORTED, "mkrandom: stopped by the progress callback at %s", it->hf_name);
      break;
    }
    m.r0 = r0;
    if (dg_ckpt_rows_parallel(nr, cols, nt, fill_row, &m)) {
      st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory writing %s", it->hf_name);
      break;
    }
    st = dg_st_out_pwrite(w, it->idx[0], (uint64_t)r0 * rb, m.main_buf, (size_t)nr * rb);
    if (!st && q) st = dg_st_out_pwrite(w, it->idx[1], (uint64_t)r0 * sbb, m.sc, (size_t)nr * sbb);
    if (!st && q) st = dg_st_out_pwrite(w, it->idx[2], (uint64_t)r0 * sbb, m.bi, (size_t)nr * sbb);
    *done += (int64_t)((size_t)nr * (rb + 2 * sbb));
  }
  free(m.main_buf);
  free(m.sc);
  free(m.bi);
  return st;
}

/* initializer_range: text_config's, else the top level's, else 0.02 (the
 * reference's default); must be finite and > 0. */
static dg_status get_init_range(const char *path, const cJSON *j, float *out) {
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
  const cJSON *v = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "initializer_range") : NULL;
  const char *where = "text_config.initializer_range";
  if (!v) { v = cJSON_GetObjectItemCaseSensitive(j, "initializer_range"); where = "initializer_range"; }
  *out = 0.02f;
  if (!v) return DG_OK;
  if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble) || v->valuedouble > 1e3)
    return dg_seterr(DG_ERR_CONFIG, "%s: %s must be a positive number (at most 1000)%s%g", path, where,
                     cJSON_IsNumber(v) ? ", got " : "", cJSON_IsNumber(v) ? v->valuedouble : 0.0);
  *out = (float)v->valuedouble;
  return DG_OK;
}

static int cmp_size_t(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

/* The recipe: without one, experts at bits:group_size and everything else bf16. */
static dg_status mk_recipe(const dg_mkrandom_params *p, dg_quant_recipe *rc) {
  DG_TRY(dg_quant_recipe_parse(p->recipe, p->bits, p->group_size, rc));
  if (!p->recipe || !*p->recipe)
    for (int c = 0; c < DG_QCLASS_COUNT; c++)
      if (c != DG_QCLASS_EXPERTS) rc->cls[c].bits = rc->cls[c].group_size = 0;
  return DG_OK;
}

/* out_dir must be absent or empty; the tokenizer source, if any, a directory. */
static dg_status mk_check_dirs(const char *out_dir, const char *source_dir) {
  if (dg_ckpt_dir_nonempty(out_dir) > 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: output directory is not empty (mkrandom never overwrites)", out_dir);
  if (source_dir) {
    struct stat sb;
    if (stat(source_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
      return dg_seterr(DG_ERR_NOT_FOUND, "%s: tokenizer source directory does not exist", source_dir);
  }
  return DG_OK;
}

/* The configuration text (malloc'd): the built-in "real" or "small", or the
 * file named config; *name is what messages call it. */
static dg_status mk_config_text(const char *config, char **text, size_t *len, const char **name) {
  const int builtin_real = !strcmp(config, "real"), builtin_small = !strcmp(config, "small");
  *name = builtin_real ? "built-in config \"real\"" : builtin_small ? "built-in config \"small\"" : config;
  if (!builtin_real && !builtin_small) return dg_read_file(config, 0, text, len);
  *text = builtin_real ? real_config_text() : strdup(SMALL_CONFIG);
  if (!*text) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  *len = strlen(*text);
  return DG_OK;
}

/* The tokenizer.json of source_dir, if there is one, must fit the
 * vocabulary of config c (named cfg_name), or the output would not load. */
static dg_status mk_check_tokenizer(const char *source_dir, const char *cfg_name, const dg_config *c) {
  char tpath[4096];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", source_dir);
  struct stat tsb;
  if (stat(tpath, &tsb) != 0) return DG_OK;
  dg_tokenizer *tk = NULL;
  dg_status st = dg_tokenizer_load(tpath, (int32_t)c->vocab_size, &tk);
  if (st) {
    char why[1024]; /* dg_seterr writes the buffer dg_last_error reads */
    snprintf(why, sizeof why, "%s", dg_last_error());
    return dg_seterr(st, "--source %s: its tokenizer does not fit %s (vocab_size %lld): %s", source_dir, cfg_name,
                     (long long)c->vocab_size, why);
  }
  dg_tokenizer_free(tk);
  return DG_OK;
}

/* The configuration, validated before anything is written: parsed into c
 * (dg_config_parse names the field), with experts, a fitting tokenizer,
 * no quantization block; *cfg its JSON (the caller deletes it), *std its
 * initializer_range. */
static dg_status mk_check_config(const char *cfg_name, const char *text, size_t len, const char *source_dir,
                                 dg_config *c, cJSON **cfg, float *std) {
  DG_TRY(dg_config_parse(cfg_name, text, len, c));
  if (c->n_experts < 1 || c->moe_intermediate_size < 1)
    return dg_seterr(DG_ERR_CONFIG, "%s: num_experts = %d, moe_intermediate_size = %d: DiffusionGemma needs experts",
                     cfg_name, c->n_experts, c->moe_intermediate_size);
  if (source_dir) DG_TRY(mk_check_tokenizer(source_dir, cfg_name, c));
  *cfg = cJSON_ParseWithLength(text, len);
  if (!*cfg || !cJSON_IsObject(*cfg)) return dg_seterr(DG_ERR_JSON, "%s: not a JSON object", cfg_name);
  if (cJSON_GetObjectItemCaseSensitive(*cfg, "quantization") ||
      cJSON_GetObjectItemCaseSensitive(*cfg, "quantization_config"))
    return dg_seterr(DG_ERR_CONFIG,
                     "%s: has a quantization block; mkrandom writes its own from --bits/--group-size/--recipe "
                     "(give the float model's config)",
                     cfg_name);
  return get_init_range(cfg_name, *cfg, std);
}

/* What planned tensor it becomes under recipe rc: its bits (0 = bf16), its
 * module, and the names, dtypes, shapes and sizes of its one or three
 * outputs; counts it in res. */
static dg_status mk_plan_outputs(mk_item *it, const dg_quant_recipe *rc, const char *cfg_name,
                                 dg_mkrandom_result *res) {
  const int64_t cols = it->shape[it->ndim - 1];
  int64_t ne = 1;
  for (int d = 0; d < it->ndim; d++) ne *= it->shape[d];
  res->n_params += ne;
  if (ne > ((int64_t)1 << 34)) /* the draw's 32-bit block counter (mkrandom.h) */
    return dg_seterr(DG_ERR_CONFIG, "%s: tensor %s would have %lld elements; mkrandom draws at most 2^34 per tensor",
                     cfg_name, it->hf_name, (long long)ne);
  if (it->cls >= 0 && it->ndim >= 2) {
    const dg_quant_class_spec *sp = &rc->cls[it->cls];
    if (sp->bits && cols % sp->group_size) res->n_indivisible++; /* MLX leaves these in float */
    else if (sp->bits) { it->bits = sp->bits; it->group_size = sp->group_size; }
  }
  dg_ckpt_module_name(it->module, sizeof it->module, it->hf_name);
  it->n_out = it->bits ? 3 : 1;
  for (int k = 0; k < it->n_out; k++) {
    static const char *const sfx[3] = {"weight", "scales", "biases"};
    if (it->bits) snprintf(it->out_name[k], sizeof it->out_name[k], "%s.%s", it->module, sfx[k]);
    else memcpy(it->out_name[k], it->hf_name, sizeof it->hf_name); /* hf_name is shorter, NUL-terminated */
    memcpy(it->out_shape[k], it->shape, sizeof it->shape);
    if (it->bits) it->out_shape[k][it->ndim - 1] = k == 0 ? cols * it->bits / 32 : cols / it->group_size;
    it->out_dtype[k] = it->bits && k == 0 ? DG_U32 : DG_BF16;
    uint64_t nb = dg_dtype_size(it->out_dtype[k]);
    for (int d = 0; d < it->ndim; d++) nb *= (uint64_t)it->out_shape[k][d];
    it->out_bytes[k] = nb;
  }
  res->n_quantized += it->bits != 0;
  return DG_OK;
}

/* Plan the outputs of every tensor and put them, in order, into shards of at
 * most max_shard_bytes (a bigger tensor gets one of its own); fills res's
 * counts and sizes. */
static dg_status mk_plan_all(mk_plan *plan, const dg_quant_recipe *rc, const char *cfg_name, int64_t max_shard_bytes,
                             dg_mkrandom_result *res) {
  int n_shards = 1;
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < plan->n; i++) {
    mk_item *it = &plan->it[i];
    DG_TRY(mk_plan_outputs(it, rc, cfg_name, res));
    uint64_t b = it->out_bytes[0] + (it->bits ? it->out_bytes[1] + it->out_bytes[2] : 0);
    if (shard_bytes > 0 && shard_bytes + b > (uint64_t)max_shard_bytes) { n_shards++; shard_bytes = 0; }
    it->shard = n_shards - 1;
    shard_bytes += b;
    res->bytes_out += (int64_t)b;
  }
  res->n_tensors = 0;
  for (size_t i = 0; i < plan->n; i++) res->n_tensors += plan->it[i].n_out;
  res->n_shards = n_shards;
  return DG_OK;
}

/* The tensor list of shard s (*ts, malloc'd; *cnt of them): U32 tensors
 * first, then bf16, so every tensor is aligned to its element size; sets
 * each output's index in the list and lists it in wmap. */
static dg_status mk_shard_tensors(mk_plan *plan, int s, const char *shard_name, cJSON *wmap, dg_tensor **ts_out,
                                  size_t *cnt_out) {
  size_t cnt = 0;
  for (size_t i = 0; i < plan->n; i++) cnt += plan->it[i].shard == s ? (size_t)plan->it[i].n_out : 0;
  dg_tensor *ts = calloc(cnt ? cnt : 1, sizeof *ts);
  if (!ts) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  size_t k = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < plan->n; i++) {
      mk_item *it = &plan->it[i];
      if (it->shard != s) continue;
      for (int j = 0; j < it->n_out; j++) {
        if ((it->out_dtype[j] == DG_U32) != (pass == 0)) continue;
        dg_tensor *t = &ts[k];
        t->name = it->out_name[j];
        t->dtype = it->out_dtype[j];
        t->ndim = it->ndim;
        memcpy(t->shape, it->out_shape[j], sizeof it->out_shape[j]);
        t->nbytes = (size_t)it->out_bytes[j];
        it->idx[j] = k++;
        cJSON_AddStringToObject(wmap, it->out_name[j], shard_name);
      }
    }
  *ts_out = ts;
  *cnt_out = cnt;
  return DG_OK;
}

/* What every shard's fill needs besides its tensors. */
typedef struct mk_fill {
  const dg_mkrandom_params *p;
  float std;
  int32_t pad_row;
  int nt;
  int64_t done_bytes, total;
} mk_fill;

/* Fill shard s's tensors (cnt outputs) through w, in file order (sequential
 * writes). */
static dg_status mk_fill_shard(const mk_plan *plan, int s, size_t cnt, dg_st_out *w, mk_fill *f) {
  size_t *order = malloc((cnt ? cnt : 1) * sizeof *order), n_ord = 0;
  if (!order) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  for (size_t i = 0; i < plan->n; i++)
    if (plan->it[i].shard == s) order[n_ord++] = (plan->it[i].idx[0] << 20) | i; /* file position, then item */
  qsort(order, n_ord, sizeof *order, cmp_size_t);
  dg_status st = DG_OK;
  for (size_t o = 0; o < n_ord && !st; o++)
    st = fill_item(&plan->it[order[o] & ((1u << 20) - 1)], w, f->p->seed, f->std, f->pad_row, f->nt, f->p->progress,
                   f->p->user_data, &f->done_bytes, f->total);
  free(order);
  return st;
}

/* Shard s of n_shards into tmp: its header, then its tensors' bytes. */
static dg_status mk_write_shard(mk_plan *plan, int s, int n_shards, const char *tmp, int quantized, cJSON *wmap,
                                mk_fill *f) {
  char shard_name[64], path[4096];
  dg_ckpt_shard_name(shard_name, sizeof shard_name, s, n_shards);
  dg_tensor *ts = NULL;
  size_t cnt = 0;
  DG_TRY(mk_shard_tensors(plan, s, shard_name, wmap, &ts, &cnt));
  snprintf(path, sizeof path, "%s/%s", tmp, shard_name);
  /* "pt" as Transformers writes a float checkpoint, "mlx" as dg_quantize writes a quantized one */
  const char *mk[1] = {"format"}, *mv[1] = {quantized ? "mlx" : "pt"};
  dg_st_out *w = NULL;
  dg_status st = dg_st_create(path, ts, cnt, mk, mv, 1, &w);
  free(ts);
  if (st) return st;
  st = mk_fill_shard(plan, s, cnt, w, f);
  if (st) dg_st_out_abort(w);
  else st = dg_st_out_close(w);
  return st;
}

/* Every shard, then model.safetensors.index.json, into tmp. */
static dg_status mk_write_shards(mk_plan *plan, const char *tmp, const dg_mkrandom_result *res, mk_fill *f) {
  cJSON *wmap;
  cJSON *index = dg_ckpt_index_new(res->bytes_out, &wmap);
  dg_status st = DG_OK;
  for (int s = 0; s < res->n_shards && !st; s++)
    st = mk_write_shard(plan, s, res->n_shards, tmp, res->n_quantized != 0, wmap, f);
  if (!st) st = dg_ckpt_write_index(tmp, index, 0);
  cJSON_Delete(index);
  return st;
}

/* The small files after the shards: config.json again with the quantization
 * block (as dg_quantize writes it) when something is quantized,
 * generation_config.json, and the tokenizer files of source_dir. */
static dg_status mk_write_extras(const char *tmp, cJSON *cfg, const dg_quant_recipe *rc, const mk_plan *plan,
                                 const char *source_dir, dg_mkrandom_result *res) {
  char path[4096];
  if (res->n_quantized) {
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (dg_quant_config_block(cfg, rc->bits, rc->group_size, plan->it, plan->n, mk_module))
      return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
    DG_TRY(dg_ckpt_write_json(path, cfg, 0));
  }
  snprintf(path, sizeof path, "%s/generation_config.json", tmp);
  DG_TRY(dg_ckpt_write_text(path, GENERATION_CONFIG, 0));
  if (source_dir) DG_TRY(dg_ckpt_copy_files(source_dir, tmp, is_tokenizer_file, &res->n_copied));
  return DG_OK;
}

dg_status dg_mkrandom(const char *out_dir, const dg_mkrandom_params *params, dg_mkrandom_result *result) {
  if (!out_dir || !*out_dir) return dg_seterr(DG_ERR_INVALID_ARG, "dg_mkrandom: no output directory");
  dg_mkrandom_params p = params ? *params : dg_mkrandom_default_params();
  if (!p.config || !*p.config) p.config = "real";
  if (p.max_shard_bytes <= 0) p.max_shard_bytes = 5000000000LL;
  dg_mkrandom_result res;
  memset(&res, 0, sizeof res);
  if (result) *result = res;
  dg_quant_recipe rc;
  DG_TRY(mk_recipe(&p, &rc));
  DG_TRY(mk_check_dirs(out_dir, p.source_dir));

  char *text = NULL;
  size_t len = 0;
  const char *cfg_name;
  DG_TRY(mk_config_text(p.config, &text, &len, &cfg_name));
  dg_status st = DG_OK;
  cJSON *cfg = NULL;
  mk_plan plan = {0};
  char path[4096];
  dg_config c;
  mk_fill fill = {.p = &p, .std = 0.02f, .nt = p.n_threads > 0 ? p.n_threads : 1};
  char tmp[2048] = ""; /* the temporary sibling written into (dg_outdir_begin); removed on failure */
  if ((st = mk_check_config(cfg_name, text, len, p.source_dir, &c, &cfg, &fill.std))) goto done;
  if ((st = plan_tensors(&c, &plan))) goto done;
  if ((st = mk_plan_all(&plan, &rc, cfg_name, p.max_shard_bytes, &res))) goto done;
  if (p.dry_run) goto done;

  /* the output directory (a temporary sibling until complete) and config.json
   * (rewritten with the quantization block at the end) */
  if ((st = dg_outdir_begin(out_dir, tmp, sizeof tmp, p.on_tmp_dir, p.user_data))) { tmp[0] = 0; goto done; }
  snprintf(path, sizeof path, "%s/config.json", tmp);
  if ((st = dg_ckpt_write_text(path, text, 0))) goto done;
  fill.pad_row = c.pad_token_id;
  fill.total = res.bytes_out;
  if ((st = mk_write_shards(&plan, tmp, &res, &fill))) goto done;
  if ((st = mk_write_extras(tmp, cfg, &rc, &plan, p.source_dir, &res))) goto done;
  /* the last chance to stop (an interrupt), then the complete directory appears at once */
  if (p.progress && p.progress(res.bytes_out, res.bytes_out, "", p.user_data))
    st = dg_seterr(DG_ERR_ABORTED, "mkrandom: stopped by the progress callback before %s was complete", out_dir);
  if (!st) st = dg_outdir_commit(tmp, out_dir);
done:
  if (st && tmp[0]) dg_outdir_discard(tmp); /* nothing of a failed or interrupted run is left */
  if (tmp[0] && p.on_tmp_dir) p.on_tmp_dir(NULL, p.user_data); /* renamed or removed */
  free(plan.it);
  cJSON_Delete(cfg);
  free(text);
  if (result) *result = res;
  return st;
}
