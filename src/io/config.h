/* config.h: DiffusionGemma hyperparameters read from config.json and the
 * generation defaults read from generation_config.json (spec sections 1.1-1.3).
 *
 * Only the text model is described here; the vision tower is ignored. */
#ifndef DG_CONFIG_H
#define DG_CONFIG_H

#include <stdint.h>

#include "dgemma.h"

#define DG_MAX_LAYERS 256

typedef enum dg_rope_type { DG_ROPE_DEFAULT = 0, DG_ROPE_PROPORTIONAL = 1 } dg_rope_type;

typedef struct dg_rope_params {
  dg_rope_type type;
  double theta;                 /* rope_theta */
  double partial_rotary_factor; /* fraction of head_dim rotated (proportional only) */
  double factor;                /* linear frequency divisor ("factor", default 1) */
} dg_rope_params;

typedef struct dg_config {
  int32_t vocab_size;
  int32_t hidden_size;          /* H */
  int32_t n_layers;
  int32_t n_heads;              /* query heads, every layer */
  int32_t intermediate_size;    /* dense GeGLU width and self-conditioning MLP width */
  int32_t moe_intermediate_size;
  int32_t n_experts, top_k_experts;
  int32_t sliding_window;       /* sliding layers see query_pos - key_pos < window */
  int32_t canvas_length;        /* C */
  int32_t max_position_embeddings;
  float rms_norm_eps;
  float final_logit_softcapping; /* 0 = none */
  int32_t pad_token_id, bos_token_id;
  /* per layer */
  uint8_t is_full[DG_MAX_LAYERS];     /* 1 = full_attention, 0 = sliding_attention */
  int32_t head_dim[DG_MAX_LAYERS];    /* d of the layer */
  int32_t n_kv_heads[DG_MAX_LAYERS];  /* KV heads of the layer */
  dg_rope_params rope_sliding, rope_full;
  int32_t n_eos; int32_t eos_ids[DG_MAX_STOP_IDS]; /* text_config eos (informative) */
} dg_config;

/* Parse MODEL_DIR/config.json. `path` is used in messages.
 * Accepts top-level DiffusionGemma configs (model_type "diffusion_gemma",
 * nested text_config) and bare text configs ("diffusion_gemma_text").
 * Per-layer head_dim / num_key_value_heads come from text_config.per_layer_config
 * when present, else from global_head_dim / num_global_key_value_heads for full
 * layers, else from head_dim / num_key_value_heads.
 * Errors: DG_ERR_NOT_FOUND, DG_ERR_IO, DG_ERR_JSON, DG_ERR_UNSUPPORTED_MODEL,
 * DG_ERR_CONFIG (naming the field and the value). */
dg_status dg_config_load(const char *path, dg_config *cfg);

/* The same from the text of a config.json (len bytes); `name` stands for the
 * file in messages. */
dg_status dg_config_parse(const char *name, const char *text, size_t len, dg_config *cfg);

/* Fill *p with the reference defaults (spec 1.3) and then the fields of
 * generation_config.json at `path` (flat layout, or the older nested
 * linear_temperature_schedule_config / diffusion_stopping_config layout).
 * A missing file is not an error (*found = 0). */
dg_status dg_gen_config_load(const char *path, dg_gen_params *p, int *found);

/* The same from the text of a generation_config.json (len bytes, need not be
 * NUL-terminated); `name` stands for the file in messages. *p is reset to the
 * reference defaults first. Errors: DG_ERR_JSON, DG_ERR_CONFIG. */
dg_status dg_gen_config_parse(const char *name, const char *text, size_t len, dg_gen_params *p);

/* Reference defaults of spec 1.3 (no file). */
void dg_gen_params_reference_defaults(dg_gen_params *p);

/* Turbo defaults of spec 7.2 (turbo disabled). */
void dg_turbo_default_params(dg_turbo_params *t);


#endif
