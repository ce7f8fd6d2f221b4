/* dgemma_tools.h: the offline checkpoint writers of dgemma, apart from the
 * inference API (dgemma.h): MLX affine quantization of a checkpoint
 * (`dgemma quantize`, src/writers/quantize.c) and random-weight checkpoints
 * (`dgemma mkrandom`, src/writers/mkrandom.c). They are in libdgemma.a with the
 * engine, and share its status codes and error reporting (dg_status,
 * dg_last_error: dgemma.h). */
#ifndef DGEMMA_TOOLS_H
#define DGEMMA_TOOLS_H

#include "dgemma.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------- */
/* Quantization (MLX affine format, spec 3.2)                                */
/* ------------------------------------------------------------------------- */

/* Module classes a recipe assigns bits to (names as in a recipe string). */
typedef enum dg_quant_class {
  DG_QCLASS_EMBED = 0,   /* "embed":   model.decoder.embed_tokens (also the tied LM head) */
  DG_QCLASS_ATTN = 1,    /* "attn":    self_attn.{q,k,v,o}_proj */
  DG_QCLASS_MLP = 2,     /* "mlp":     dense mlp.{gate,up,down}_proj */
  DG_QCLASS_ROUTER = 3,  /* "router":  router.proj */
  DG_QCLASS_EXPERTS = 4, /* "experts": experts.gate_up_proj, experts.down_proj */
  DG_QCLASS_SC = 5,      /* "sc":      self_conditioning.{gate,up,down}_proj */
  DG_QCLASS_COUNT = 6
} dg_quant_class;

typedef struct dg_quant_class_spec {
  int bits;        /* 0 = keep in the checkpoint's float dtype */
  int group_size;
} dg_quant_class_spec;

typedef struct dg_quant_recipe {
  int bits, group_size;                      /* the defaults (config.json's top-level block) */
  dg_quant_class_spec cls[DG_QCLASS_COUNT];
} dg_quant_recipe;

/* Parse a recipe: comma-separated CLASS=SPEC items applied left to right on
 * top of the defaults (every class at bits/group_size). CLASS is embed, attn,
 * mlp, router, experts, sc or all; SPEC is BITS (2, 3, 4, 6, 8), BITS:GROUP
 * (group 32, 64 or 128) or bf16 (also f16, float, none, keep: not quantized).
 * The item "mlx" is mlx-vlm's choice for this model: embed, attn, mlp and
 * router at 8 bits, group 64. Example: "mlx,experts=3" or "experts=2:32,embed=bf16".
 * NULL or "" = uniform. Errors: DG_ERR_INVALID_ARG naming the item. */
dg_status dg_quant_recipe_parse(const char *recipe, int bits, int group_size, dg_quant_recipe *out);

/* Class of a checkpoint tensor name (DG_QCLASS_*), or -1 if it is never
 * quantized (norms, scalars, router scales, vision tower, ...). */
int dg_quant_class_of(const char *tensor_name);

typedef struct dg_quantize_params {
  int bits;                 /* default bits (4) */
  int group_size;           /* default group size (64) */
  const char *recipe;       /* see dg_quant_recipe_parse; NULL = uniform */
  int64_t max_shard_bytes;  /* output shard size limit; <= 0 = 5e9 */
  int n_threads;            /* OpenMP threads; <= 0 = 1 */
  /* Called before each tensor (and once at the end with done == total);
   * bytes are input bytes. Nonzero return aborts (DG_ERR_ABORTED). */
  int (*progress)(int64_t done, int64_t total, const char *tensor, void *user_data);
  void *user_data;
  /* Optional: called with the temporary directory's path just before it is created (again
   * with another path if that name is taken), and with NULL once it has been renamed to
   * out_dir or removed (or could not be made), so that a caller that must end at once (a
   * second Ctrl-C, tools/outfile.h) can remove it from the moment it exists. NULL = not called. */
  void (*on_tmp_dir)(const char *tmp_dir, void *user_data);
} dg_quantize_params;

typedef struct dg_quantize_result {
  int32_t n_quantized;      /* matrices written quantized */
  int32_t n_kept_float;     /* quantizable matrices the recipe kept in float */
  int32_t n_indivisible;    /* kept in float: input dim not a multiple of the group size (MLX's rule) */
  int32_t n_shards;
  int64_t bytes_in, bytes_out;
} dg_quantize_result;

dg_quantize_params dg_quantize_default_params(void);

/* Quantize the float (bf16/f16/f32) DiffusionGemma checkpoint in in_dir into
 * an MLX-layout directory out_dir (absent or empty): affine-quantized
 * <module>.weight/.scales/.biases with MLX's packing and rounding (quant.h),
 * other tensors copied, config.json with the "quantization" block (defaults +
 * per-module overrides) and its "quantization_config" mirror, sharded
 * safetensors + index, every other file of in_dir copied. Everything is
 * written into a temporary sibling ".<name>.tmp-XXXXXX" renamed to out_dir
 * when complete: on failure or DG_ERR_ABORTED (the progress callback, also
 * asked once more just before the rename) no out_dir appears (an empty one
 * stays as it was). *result (may be NULL) is filled even on failure. Errors: DG_ERR_INVALID_ARG (bad recipe,
 * non-empty output, already quantized input), DG_ERR_NOT_FOUND, DG_ERR_IO,
 * DG_ERR_JSON, DG_ERR_SAFETENSORS, DG_ERR_NUMERIC (a non-finite weight, named
 * with its row and column), DG_ERR_OUT_OF_MEMORY, DG_ERR_ABORTED. */
dg_status dg_quantize(const char *in_dir, const char *out_dir, const dg_quantize_params *params,
                      dg_quantize_result *result);

/* ------------------------------------------------------------------------- */
/* Random-weight checkpoints (dgemma mkrandom)                               */
/* ------------------------------------------------------------------------- */

typedef struct dg_mkrandom_params {
  const char *config;       /* "real" (google/diffusiongemma-26B-A4B-it, spec 1.1-1.2), "small" (a 6-layer
                             * model of the same structure, ~3 M parameters), or the path of a
                             * config.json; NULL = "real" */
  const char *source_dir;   /* tokenizer files (tokenizer*, special_tokens_map.json, chat_template*)
                             * are copied from here; NULL = none */
  int bits, group_size;     /* default bits (4) and group size (64) */
  const char *recipe;       /* NULL or "": the experts at bits/group_size, everything else bf16;
                             * otherwise as dg_quant_recipe_parse (every class at bits, then the
                             * recipe: "mlx" is the mlx-community layout, "all=bf16" no quantization) */
  uint64_t seed;            /* the values are a function of (seed, tensor name, element) only */
  int64_t max_shard_bytes;  /* <= 0 = 5e9 */
  int n_threads;            /* OpenMP threads; <= 0 = 1. The output does not depend on it */
  int dry_run;              /* 1 = validate and plan only (the result's counts and bytes), write nothing */
  /* Called before each chunk of rows (and once at the end with done == total);
   * bytes are output bytes. Nonzero return aborts (DG_ERR_ABORTED). */
  int (*progress)(int64_t done, int64_t total, const char *tensor, void *user_data);
  void *user_data;
  void (*on_tmp_dir)(const char *tmp_dir, void *user_data); /* as dg_quantize_params.on_tmp_dir */
} dg_mkrandom_params;

typedef struct dg_mkrandom_result {
  int32_t n_tensors;        /* tensors written (a quantized module counts 3) */
  int32_t n_quantized;      /* matrices written quantized */
  int32_t n_indivisible;    /* kept in bf16: input dim not a multiple of the group size (MLX's rule) */
  int32_t n_shards, n_copied;
  int64_t n_params;         /* weights of the float model */
  int64_t bytes_out;        /* tensor bytes written */
} dg_mkrandom_result;

dg_mkrandom_params dg_mkrandom_default_params(void);

/* Write a DiffusionGemma checkpoint with random weights into out_dir
 * (created; must be empty or absent): the Hugging Face layout of spec 3.1
 * with every text tensor at the shapes of the config, drawn as Transformers
 * initialises the model (linears, expert stacks and the embedding
 * normal(0, initializer_range), the embedding's pad_token_id row zero, norm
 * weights, router scales and layer scalars one; src/writers/mkrandom.c cites the
 * source), stored in bf16, the modules the recipe names MLX affine-quantized
 * (as dg_quantize would quantize those bf16 values), config.json (+ the
 * quantization block), generation_config.json (spec 1.3), sharded
 * safetensors + index, the source directory's tokenizer files. Streams row
 * chunks: memory is ~16 MB per chunk, never a whole tensor. Deterministic in
 * the seed (src/writers/mkrandom.h gives each value). Written into a temporary
 * sibling ".<name>.tmp-XXXXXX" renamed to out_dir when complete: on failure
 * or DG_ERR_ABORTED (the progress callback, also asked once more just before
 * the rename) nothing is left and out_dir stays as it was. *result (may be NULL) is filled even on failure.
 * Errors: DG_ERR_INVALID_ARG (non-empty output, bad recipe), DG_ERR_NOT_FOUND
 * (config file or source directory), DG_ERR_JSON, DG_ERR_CONFIG (naming the
 * file and field: a bad value, a quantization block, no experts),
 * DG_ERR_UNSUPPORTED_MODEL, DG_ERR_IO (including a full disk, detected when
 * a shard is created), DG_ERR_OUT_OF_MEMORY, DG_ERR_ABORTED. */
dg_status dg_mkrandom(const char *out_dir, const dg_mkrandom_params *params, dg_mkrandom_result *result);

#ifdef __cplusplus
}
#endif
#endif /* DGEMMA_TOOLS_H */
