/* dgemma.h: public C API of dgemma, an inference engine for block-diffusion
 * language models (Google DiffusionGemma and models of the same architecture).
 *
 * The model math, tokenizer and sampler follow ../shared/spec/diffusiongemma.md
 * ("the spec"); section numbers below refer to it. Ground truth is Hugging Face
 * Transformers' DiffusionGemmaForBlockDiffusion.
 *
 * Conventions
 *  - Every fallible function returns a dg_status. DG_OK is 0. On failure a
 *    message naming the file, field or tensor and the offending value is
 *    available from dg_last_error() (thread-local; valid until the next failing
 *    call on the same thread). The library never prints and never exits.
 *  - Token ids are int32. Shapes are written [rows, cols], row-major.
 *  - Memory returned through a `**out` pointer is owned by the caller and freed
 *    with dg_free() unless a dedicated *_free function is named.
 *  - Handles are opaque. A dg_model is read-only after loading and may be shared
 *    by several dg_context objects (one per thread).
 */
#ifndef DGEMMA_H
#define DGEMMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DGEMMA_VERSION "0.1.0"

/* ------------------------------------------------------------------------- */
/* Status codes. New values are only ever appended.                          */
/* ------------------------------------------------------------------------- */
typedef enum dg_status {
  DG_OK = 0,
  DG_ERR_INVALID_ARG = 1,       /* bad argument or option value */
  DG_ERR_NOT_FOUND = 2,         /* a required file does not exist */
  DG_ERR_IO = 3,                /* open/read/mmap failed */
  DG_ERR_JSON = 4,              /* a JSON file does not parse */
  DG_ERR_CONFIG = 5,            /* a config field is missing or invalid */
  DG_ERR_UNSUPPORTED_MODEL = 6, /* unknown model_type / architecture */
  DG_ERR_SAFETENSORS = 7,       /* malformed safetensors container */
  DG_ERR_TENSOR_MISSING = 8,    /* a required tensor is absent */
  DG_ERR_TENSOR_DTYPE = 9,      /* a tensor has an unsupported or wrong dtype */
  DG_ERR_TENSOR_SHAPE = 10,     /* a tensor's shape disagrees with the config */
  DG_ERR_TOKENIZER = 11,        /* tokenizer.json malformed or unsupported */
  DG_ERR_VOCAB_MISMATCH = 12,   /* tokenizer and model vocabularies disagree */
  DG_ERR_OUT_OF_MEMORY = 13,
  DG_ERR_CONTEXT_FULL = 14,     /* request exceeds the context's capacity */
  DG_ERR_NUMERIC = 15,          /* NaN or Inf in logits, or in a weight that must be finite */
  DG_ERR_ABORTED = 16,          /* a callback asked to stop */
  DG_ERR_REPLAY = 17,           /* replay stream exhausted or malformed */
  DG_ERR_BACKEND = 18           /* backend (e.g. CUDA) failure */
} dg_status;

/* Short constant description of a status ("tensor missing"). Never NULL. */
const char *dg_status_str(dg_status st);
/* Detailed message of the last failure on this thread ("" if none). */
const char *dg_last_error(void);
/* Free memory returned by the library (token arrays, strings, results). */
void dg_free(void *p);

/* ------------------------------------------------------------------------- */
/* Model                                                                     */
/* ------------------------------------------------------------------------- */
typedef struct dg_model dg_model;

#define DG_MAX_THREADS 1024

/* Where the forward pass runs. */
typedef enum dg_device {
  DG_DEVICE_CPU = 0,  /* fp32 activations, the checkpoint's weights (the oracle) */
  DG_DEVICE_CUDA = 1  /* one NVIDIA GPU, compute capability >= 8.0: bf16 weights resident in device
                         memory, bf16 products with fp32 accumulation (src/cuda/backend.h) */
} dg_device;

typedef struct dg_model_params {
  int n_threads;        /* OpenMP threads for the CPU backend, 0..DG_MAX_THREADS; 0 = all cores */
  int reference_kernels;/* 1 = scalar fp32 oracle kernels only (slow, for tests) */
  const char *tokenizer_path; /* tokenizer.json to use instead of MODEL_DIR's; NULL = MODEL_DIR/tokenizer.json */
  int no_tokenizer;     /* 1 = do not load a tokenizer (ids-only use) */
  dg_device device;     /* DG_DEVICE_CPU (default) or DG_DEVICE_CUDA */
  int cuda_device;      /* CUDA device ordinal with DG_DEVICE_CUDA (default 0) */
} dg_model_params;

/* One line describing a device into buf (at most n bytes, NUL-terminated):
 * for DG_DEVICE_CPU the kernel set in use, for DG_DEVICE_CUDA the GPU `index`
 * (name, compute capability, memory). Errors: DG_ERR_BACKEND for CUDA when the
 * library was built without CUDA, no GPU is visible, or the GPU is too old
 * (the message says which); DG_ERR_INVALID_ARG for an unknown device. */
dg_status dg_device_info(dg_device dev, int index, char *buf, size_t n);

/* The CPU kernel set dg_model_load gives a model (without reference_kernels):
 * *name = "avx512", "avx2" or "ref" (the best exact set this CPU has), or the
 * set the environment variable DGEMMA_KERNELS=ref|avx2|avx512|avx512lp|avx2lp
 * names (avx512lp: the lossy AVX-512 BF16/VNNI products; avx2lp: the lossy AVX2
 * int8 products; only on request). *name (a
 * static string) is set in every case. Returns DG_OK, or DG_ERR_INVALID_ARG
 * when DGEMMA_KERNELS names a set this CPU lacks: the best exact set is used
 * instead and dg_last_error() says so in one line naming the variable, its
 * value and the set taken (the library prints nothing). A name of no kernel set
 * also gives DG_ERR_INVALID_ARG, with dg_switches_check's refusal line: such a
 * value never runs (dg_model_load and dg_context_new refuse it). */
dg_status dg_cpu_kernels(const char **name);

/* The encoder chunk of a CUDA context: prompt tokens per encoder pass, so a
 * prefill of P tokens runs as ceil(P / chunk) passes, each reading every
 * weight once; a context holds work buffers for max(canvas, chunk) rows, those
 * beyond max(canvas, 256) over its logits (which an encode of more rows than
 * that leaves unreadable until the next decode). *chunk = 1024 (since session
 * 29; the CPU backend's fixed chunk is 256, which no variable changes) unless
 * the environment variable DGEMMA_ENC_CHUNK=N asks for N, a multiple of 64 in
 * [64, 4096] written as a decimal integer (unset or empty: 1024). Read at each
 * call; a CUDA context reads it when it is made (dg_context_new) and keeps it.
 * *chunk is set in every case. Returns DG_OK, or DG_ERR_INVALID_ARG when
 * DGEMMA_ENC_CHUNK is set to anything else ("0", "abc", "-64", "100",
 * "8192"): *chunk = 1024 and dg_last_error() says so in one line naming the
 * variable and its value; dg_model_load and dg_context_new for a CUDA model
 * then fail with it (dg_switches_check). */
dg_status dg_cuda_enc_chunk(int32_t *chunk);

/* Checks every environment switch (DGEMMA_*) that the library reads for a model on dev: the host's (DGEMMA_THP,
 * DGEMMA_TURBO_BATCH) for any device, and with DG_DEVICE_CUDA the CUDA backend's too (DGEMMA_ATTN, DGEMMA_GRAPHS,
 * DGEMMA_ROUTE, ...: README.md's "Environment switches" lists each with its values). Unset or empty: the default.
 * Returns DG_OK, or DG_ERR_INVALID_ARG at the first switch set to a value it does not accept, with one line in
 * dg_last_error() naming the variable, the value and what is allowed, e.g.
 *   DGEMMA_GRAPHS="yes" is not 0 or 1 (passes captured and replayed as CUDA graphs; unset: 1)
 * dg_model_load and dg_context_new call it first and fail with it, so a bad value never runs (before session 30 it
 * ran silently as the default). Reads the environment at each call. DGEMMA_KERNELS is checked here too (a name of
 * no kernel set, for any device: one line, e.g. DGEMMA_KERNELS="avx3" is not one of ref, avx2, ...); a set this
 * CPU lacks is not refused (dg_cpu_kernels warns). DGEMMA_CPU_PACK and DGEMMA_CUDA_MEM_LIMIT are checked where they
 * are read (the CPU model; the CUDA model). */
dg_status dg_switches_check(dg_device dev);

dg_model_params dg_model_default_params(void);

/* Load a Hugging Face DiffusionGemma directory: config.json,
 * generation_config.json (optional: defaults of spec 1.3 when absent, with
 * config.json's eos_token_id as the stop ids; dg_model_info.has_generation_config says which),
 * model.safetensors or model.safetensors.index.json + shards (mmap'd), and
 * tokenizer.json. Every header offset, dtype and shape is validated.
 * MLX affine-quantized checkpoints (spec 3.2) load as they are: a matrix is
 * quantized when <module>.scales exists (U32 <module>.weight + scales +
 * biases), with bits and group size from config.json's "quantization" block
 * (per-module overrides first); expert stacks may be stored stacked or per
 * expert. A missing scales/biases tensor, unsupported bits or group size, or
 * shapes that disagree with the block fail with a message naming the tensor.
 * Errors: DG_ERR_NOT_FOUND (also model_dir naming a file, not a directory),
 * DG_ERR_IO, DG_ERR_JSON, DG_ERR_CONFIG, DG_ERR_UNSUPPORTED_MODEL, DG_ERR_SAFETENSORS, DG_ERR_TENSOR_*,
 * DG_ERR_TOKENIZER, DG_ERR_VOCAB_MISMATCH, DG_ERR_OUT_OF_MEMORY, DG_ERR_NUMERIC
 * (a layer scalar that is NaN or infinite, naming the tensor and the value).
 * With params->device = DG_DEVICE_CUDA every weight is also uploaded to the GPU
 * (bf16); a model that does not fit is refused with DG_ERR_OUT_OF_MEMORY
 * naming the bytes needed and free; no GPU, a too-old GPU or a build without
 * CUDA give DG_ERR_BACKEND. First of all, an environment switch set to a value it
 * does not accept gives DG_ERR_INVALID_ARG (dg_switches_check(params->device)). */
dg_status dg_model_load(const char *model_dir, const dg_model_params *params, dg_model **out);
void dg_model_free(dg_model *m);

typedef struct dg_model_info {
  int32_t vocab_size, hidden_size, n_layers, n_heads;
  int32_t n_kv_heads, head_dim;               /* sliding layers */
  int32_t n_global_kv_heads, global_head_dim; /* full layers */
  int32_t sliding_window, intermediate_size, moe_intermediate_size;
  int32_t n_experts, top_k_experts, canvas_length;
  int32_t n_full_layers;
  int64_t n_params;          /* text parameters (tied embedding counted once) */
  const char *weight_dtype;  /* "bf16", "f16" or "f32" (embedding's dtype, or its scales' when quantized) */
  int has_tokenizer;
  int has_generation_config; /* 1: MODEL_DIR/generation_config.json was read; 0: none, so the generation
                                defaults are spec 1.3's and the stop ids config.json's eos_token_id only
                                (the library says nothing: a caller may warn) */
  int32_t n_quantized;       /* matrices stored MLX affine-quantized (0 = none) */
  int32_t quant_bits_min, quant_bits_max; /* their bit widths (0 if none) */
  dg_device device;          /* where the forward pass runs */
  size_t device_bytes;       /* device memory held by the weights (CUDA), else 0 */
  int32_t max_position_embeddings; /* positions 0..max-1 (prompt + canvases must fit) */
  const char *cpu_kernels;   /* the CPU kernel set of its forward passes: "ref", "avx2", "avx512", "avx512lp" or "avx2lp"
                                (dg_cpu_kernels; "ref" with reference_kernels) */
} dg_model_info;

dg_status dg_model_get_info(const dg_model *m, dg_model_info *info);

/* ------------------------------------------------------------------------- */
/* Tokenizer and chat template (spec section 2)                              */
/* ------------------------------------------------------------------------- */

/* Encode UTF-8 text (no <bos> is added). parse_special = 1 matches special
 * (control) tokens written literally in the text, as the `tokenizers` library
 * does; 0 keeps such text as plain text (use it for user content).
 * Non-special added tokens (e.g. "\n" = 107) are always matched.
 * Errors: DG_ERR_INVALID_ARG (no tokenizer, invalid UTF-8). */
dg_status dg_tokenize(const dg_model *m, const char *text, size_t len, int parse_special,
                      int32_t **ids, size_t *n_ids);

/* Decode ids to UTF-8 (byte-fallback pieces fused; "▁" -> " "). Special tokens
 * are rendered by name when keep_special = 1 and dropped otherwise.
 * Errors: DG_ERR_INVALID_ARG for an id outside [0, vocab). */
dg_status dg_detokenize(const dg_model *m, const int32_t *ids, size_t n_ids, int keep_special,
                        char **text);

/* The vocabulary string (piece) of token id, as in tokenizer.json: "\u2581"
 * marks a space, byte-fallback tokens read "<0x0A>", special tokens their
 * name. Owned by the model (valid until dg_model_free). NULL if the model has
 * no tokenizer or id is outside [0, vocab) or unused. */
const char *dg_token_piece(const dg_model *m, int32_t id);

typedef struct dg_chat_message {
  const char *role;    /* "system", "developer", "user", "assistant" or "model" */
  const char *content; /* UTF-8, encoded as plain text (control tokens stay text) */
} dg_chat_message;

/* Render a conversation with the Gemma 4 chat template straight to ids:
 * <bos>, optional system turn (present if a system/developer message exists or
 * thinking is enabled), one <|turn>{role}\n{content}<turn|>\n per message, and
 * the generation prompt (thinking off: <|turn>model\n<|channel>thought\n<channel|>;
 * thinking on: <|turn>model\n). */
dg_status dg_chat_apply(const dg_model *m, const dg_chat_message *msgs, size_t n_msgs,
                        int enable_thinking, int32_t **ids, size_t *n_ids);

/* ------------------------------------------------------------------------- */
/* Generation parameters (generation_config.json, spec 1.3 and 6.1)          */
/* ------------------------------------------------------------------------- */
typedef enum dg_proposal {
  DG_PROPOSAL_SAMPLE = 0,        /* multinomial from softmax(z), the reference */
  DG_PROPOSAL_ARGMAX = 1,        /* greedy proposals (mlx-vlm temperature 0) */
  DG_PROPOSAL_REPLAY_UNIFORM = 2 /* inverse CDF with uniforms from replay_uniforms */
} dg_proposal;

#define DG_MAX_STOP_IDS 16

/* Per-step progress. Return nonzero from the callback to abort (DG_ERR_ABORTED). */
typedef struct dg_step_info {
  int32_t block;            /* 0-based canvas index */
  int32_t step;             /* 0-based denoising step within the block */
  int32_t steps_remaining;  /* s in spec 6.1 (N..1) */
  float temperature;        /* T_s */
  int32_t n_accepted;       /* positions accepted by the entropy bound */
  float mean_entropy;       /* mean per-position entropy of softmax(z), nats */
  int stop;                 /* 1 if the stable-and-confident stop fired */
  const int32_t *argmax;    /* [canvas_length] argmax canvas of this step */
  const int32_t *canvas;    /* [canvas_length] next (renoised) canvas */
  int32_t canvas_length;
  int32_t n_active;         /* turbo: positions sampled this step (not frozen); reference: canvas_length */
  int32_t n_forwarded;      /* turbo: positions run through the decoder this step; reference: canvas_length */
  int32_t forward_shape;    /* rows the decoder pass computed (n_forwarded rounded up to a bucket with turbo_bucket) */
  int32_t head_shape;       /* LM-head rows the decoder pass was given (n_active, or its bucket; the CPU's
                               vocabulary product then skips the padding) */
} dg_step_info;

typedef struct dg_block_info {
  int32_t block;
  const int32_t *tokens;    /* [n_tokens] block output (pads after EOS) */
  int32_t n_tokens;
  int32_t n_valid;          /* tokens up to and including the first stop id */
  int32_t n_steps;          /* decoder forwards spent on this block */
  int finished;             /* 1 if a stop id ended the sequence */
  int32_t n_visible;        /* of the n_valid tokens, those counted as generated text (dg_gen_result.n_visible:
                               not pad, not a special token; the stop id that ended generation counts) */
} dg_block_info;

/* The turbo engine (spec 7, after mlx-vlm PR #1384): opt-in, every technique
 * switched separately. Names in quotes are the --gen-kwargs keys; defaults in
 * parentheses are the write-up's (spec 7.2) except where marked "ours".
 * Recommended interactive setting: turbo_accept "confidence",
 * turbo_threshold [0.95, 0.80, 8], turbo_repair true, no turbo_steps flush. */
typedef enum dg_turbo_accept {
  DG_TURBO_ACCEPT_ENTROPY_BOUND = 0, /* "entropy-bound": spec 6.1 rule on the top-K entropies of active positions */
  DG_TURBO_ACCEPT_CONFIDENCE = 1     /* "confidence": top-1 probability of the K-way distribution >= threshold */
} dg_turbo_accept;

typedef enum dg_turbo_sc {
  DG_TURBO_SC_EXACT = 0,    /* "exact": softmax over the full vocabulary times E (spec 5), the reference signal */
  DG_TURBO_SC_TOPK = 1,     /* "topk": the write-up's shortcut, K-way renormalized probabilities times the K rows */
  DG_TURBO_SC_ADAPTIVE = 2  /* "adaptive" (ours): exact probabilities of the top K' tokens, K' doubled from K until
                               the tail mass m <= sc_tail_mass, the tail spread evenly over the other V-K' rows
                               through a precomputed column sum of E. |error| <= 2 m * scale * max|E| per component. */
} dg_turbo_sc;

typedef struct dg_turbo_params {
  int enabled;             /* "diffusion_turbo" (false): 0 = the reference sampler of spec 6.1, unchanged */
  int32_t topk;            /* "turbo_topk" (64): K of the top-K sampler chain (spec 7.3), 1..4096, <= vocab */
  int monotone;            /* "turbo_monotone" (true): accepted positions are committed and frozen */
  int eos_early_stop;      /* "turbo_eos_early_stop" (true): EOS tail-drop and early canvas end (spec 7.5; monotone only) */
  int32_t steps;           /* "turbo_steps" (null = 0): at most this many forwards per canvas, the last one a
                              flush that accepts every active position; 0 = max_denoising_steps, no flush */
  dg_turbo_accept accept;  /* "turbo_accept" ("entropy-bound") */
  float threshold_hi;      /* "turbo_threshold" (0.9): a number in (0, 1] (hi = lo), or [hi, lo, k0]: */
  float threshold_lo;      /*   tau = hi on denoising steps < k0, lo from step k0 on */
  int32_t threshold_k0;
  int repair;              /* "turbo_repair" (false): one more full-canvas forward, block = its argmax */
  int compact;             /* "turbo_compact" (false): forward only live + newly frozen positions (spec 7.4) */
  int32_t repeat_guard;    /* "turbo_repeat_guard" (16): end with DG_FINISH_REPETITION when one id is emitted
                              this many times in a row; 0 disables */
  dg_turbo_sc sc_mode;     /* "turbo_sc" (ours; "exact") */
  float sc_tail_mass;      /* "turbo_sc_tail_mass" (ours; 0.01): the bound m of DG_TURBO_SC_ADAPTIVE, (0, 1] */
  int bucket;              /* "turbo_bucket" (ours; false): round forward/active set sizes up to <= 10 buckets */
  int32_t head_rows;       /* "turbo_head_rows" (ours; 0 = auto): canvas rows whose [rows, vocab] logits the CPU
                              engine holds at once (LM head, top-K, SC a chunk at a time; same tokens for any
                              value); 0 = as many as fit 16 MiB (16 rows at vocab 262,144); >= 0 */
} dg_turbo_params;

typedef int (*dg_step_callback)(const dg_step_info *info, void *user_data);
typedef int (*dg_block_callback)(const dg_block_info *info, void *user_data);

/* What one turbo step decided from (spec 7.3, 7.5), for tests that compare
 * backends (the CUDA-vs-CPU generations measure their near-ties from it).
 * Arrays are by canvas position and valid for the n_active positions
 * active[] during the callback only: kval/kidx [C, K] the raw top-K values
 * and ids, kp [C, K] the K-way probabilities, top1/ent/uni [C], prop [C] the
 * proposals, acc [C] the acceptance (0/1). The repair forward reports
 * step = -1, K = min(2, V), n_active = C, temperature 0, and only kval/kidx
 * (the others NULL). */
typedef struct dg_turbo_trace {
  int32_t block, step, n_active, K, C;
  float temperature;
  const int32_t *active;
  const float *kval, *kp, *top1, *ent, *uni;
  const int32_t *kidx, *prop;
  const uint8_t *acc;
} dg_turbo_trace;
typedef void (*dg_turbo_trace_callback)(const dg_turbo_trace *trace, void *user_data);

typedef struct dg_gen_params {
  int32_t max_new_tokens;        /* rounded up to whole canvases (spec 6.1) */
  int32_t max_denoising_steps;   /* N */
  float entropy_bound;           /* EB-sampler budget, nats */
  float t_min, t_max;            /* linear temperature schedule */
  int32_t stability_threshold;   /* argmax canvases compared for the stop rule; 0 = always stable */
  float confidence_threshold;    /* mean entropy threshold (nats); <= 0 disables the adaptive stop */
  int32_t stop_ids[DG_MAX_STOP_IDS];
  int32_t n_stop_ids;
  int32_t pad_id;
  uint64_t seed;                 /* counter-based RNG key (Philox4x32-10) */
  dg_proposal proposal;
  /* Replay (spec 6.1, design notes): every random canvas (each block's initial
   * canvas, then one renoise canvas per step, including the step on which
   * denoising stops) is read in order from replay_canvases (int32 ids,
   * canvas_length per canvas). With DG_PROPOSAL_REPLAY_UNIFORM, proposals use
   * one uniform per canvas position per step from replay_uniforms. NULL =
   * draw from the seeded generator. */
  const int32_t *replay_canvases;
  size_t replay_canvases_len;    /* in int32 values */
  const float *replay_uniforms;
  size_t replay_uniforms_len;    /* in floats */
  dg_step_callback on_step;
  dg_block_callback on_block;
  dg_turbo_trace_callback on_turbo_trace; /* turbo only, NULL = none: called after every step's sampler chain
                                             and acceptance and after a repair forward (tests, backend checks) */
  void *user_data;               /* passed to on_step, on_block and on_turbo_trace */
  dg_turbo_params turbo;         /* spec 7; turbo.enabled = 0 (the default) leaves everything above unchanged */
} dg_gen_params;

/* Defaults from the model's generation_config.json (spec 1.3), falling back to
 * the reference defaults for absent fields. */
dg_gen_params dg_gen_default_params(const dg_model *m);

/* Apply a JSON object of generation-config fields to *p (the --gen-kwargs of
 * the CLI): max_new_tokens, max_denoising_steps, entropy_bound (or
 * sampler_config.entropy_bound), t_min, t_max, stability_threshold,
 * confidence_threshold, eos_token_id (int or list), pad_token_id, seed,
 * proposal ("sample"|"argmax"), and the nested older layout
 * (linear_temperature_schedule_config, diffusion_stopping_config), plus the
 * turbo keys of dg_turbo_params (diffusion_turbo, turbo_topk, turbo_monotone,
 * turbo_eos_early_stop, turbo_steps, turbo_accept, turbo_threshold,
 * turbo_repair, turbo_compact, turbo_repeat_guard, turbo_sc,
 * turbo_sc_tail_mass, turbo_bucket, turbo_head_rows). Unknown keys,
 * at the top level and inside the nested objects, are rejected.
 * Errors: DG_ERR_JSON; DG_ERR_INVALID_ARG naming an unknown key or a value of the
 * wrong type or range. *p is unchanged on failure. */
dg_status dg_gen_params_apply_json(dg_gen_params *p, const char *json);

/* The checks dg_generate makes on p against model m before anything runs (stop
 * ids and pad_token_id inside the vocabulary, turbo_topk <= vocab, the
 * temperature schedule 0 < t_min < t_max with final_logit_softcapping / t_min
 * finite in fp32 (1 / t_min without softcapping: the processed logits z = logits / T
 * must not overflow), ...), so that a caller can refuse bad settings up
 * front. DG_ERR_INVALID_ARG with a message naming the field and its value. */
dg_status dg_gen_params_check(const dg_model *m, const dg_gen_params *p);

/* ------------------------------------------------------------------------- */
/* Context: KV cache + work buffers for one sequence                         */
/* ------------------------------------------------------------------------- */
typedef struct dg_context dg_context;

typedef struct dg_context_params {
  int32_t max_context;  /* prompt + generated tokens the KV cache holds; <= 0 means 4096 */
  int full_window_cache; /* 1: every layer's cache holds every position, so dg_context_truncate can roll back
                            any distance (a chat's undo). 0 (default): on CUDA the sliding-window layers keep
                            a ring of window - 1 + max(canvas, encoder chunk) positions (1,280 on the 26B:
                            262 MB instead of 1.7 GB at 8K), which a roll-back of more than about a canvas
                            cannot restore (dg_context_truncate says so). The CPU always keeps every position. */
} dg_context_params;

dg_context_params dg_context_default_params(void);
/* A context on the model's device. With DG_DEVICE_CUDA the KV cache and the
 * work buffers live in device memory (refused up front with
 * DG_ERR_OUT_OF_MEMORY naming the bytes needed and free if they do not fit).
 * An environment switch set to a value it does not accept gives
 * DG_ERR_INVALID_ARG first (dg_switches_check of the model's device). */
dg_status dg_context_new(const dg_model *m, const dg_context_params *p, dg_context **out);
void dg_context_free(dg_context *ctx);
/* Drop the KV cache (length back to 0). */
void dg_context_reset(dg_context *ctx);
/* Number of tokens in the KV cache. */
int32_t dg_context_length(const dg_context *ctx);
/* Keep the first len tokens of the KV cache and drop the rest (positions are
 * absolute, so the next dg_encode/dg_generate continues at position len); an
 * interrupted chat turn rolls back with it. The cache is position-indexed, so
 * nothing is recomputed. Errors: DG_ERR_INVALID_ARG (NULL, or len outside
 * [0, dg_context_length]); DG_ERR_CONTEXT_FULL when a ring cache (CUDA without
 * full_window_cache) has already overwritten keys that position len needs (the
 * window before it): the context is left as it was. */
dg_status dg_context_truncate(dg_context *ctx, int32_t len);
/* Make dst hold the first n positions of src's KV cache: their K/V are copied (bit for bit), what dst
 * held is dropped and its length becomes n, so a dg_encode / dg_generate / dg_batch_add on dst then
 * continues at position n exactly as src's context did after the same n tokens. On the CPU the encoder's
 * rows do not depend on how a prompt is split into passes, so that is also a fresh prefill of the whole
 * prompt; on CUDA it is a prefill split at n, as src's was (whether the device's rows depend on the
 * split, through the row counts of its products, has not been measured). src is not changed. A prompt
 * cache (`dgemma serve --cache-slots`) keeps finished contexts and starts a request whose prompt begins
 * with a cached context's tokens this way: only the rest is prefilled. dst may be smaller or larger than
 * src (its own max_context). On CUDA the sliding-window layers of a ring cache (full_window_cache 0) get
 * only the positions src's ring still holds (at least the window before n), so dst cannot later be rolled
 * back below them (dg_context_truncate says so); the copy runs on the device and is finished on return.
 * Errors: DG_ERR_INVALID_ARG (NULL, dst == src, contexts of two models, n outside [0,
 * dg_context_length(src)]); DG_ERR_CONTEXT_FULL (n above dst's capacity, or a ring cache of src, as in
 * dg_context_truncate, no longer holds keys position n needs); DG_ERR_BACKEND when the model's backend
 * cannot copy a cache, or the device failed. dst is unchanged on a refusal. */
dg_status dg_context_copy_prefix(dg_context *dst, const dg_context *src, int32_t n);
/* Free what ctx holds besides its KV cache and the small per-context rows sized with it: on the CPU the
 * activations of a pass (a few MB, more with the vocabulary's probability rows: one row [V] per thread),
 * the canvas K/V buffers of the compacted pass and the self-conditioning scratch; each is made again by
 * the next pass that needs it, so ctx stays fully usable. For a context kept only to be copied from (a
 * prompt cache's entry). A CUDA context keeps its device work buffers (one block with its KV cache): nothing
 * is freed there, for now. Not while a pass or a dg_batch uses ctx. Errors: DG_ERR_INVALID_ARG (NULL). */
dg_status dg_context_release_buffers(dg_context *ctx);

/* Stage timing of a CUDA context (`dgemma bench --profile`): GPU time per
 * stage of the passes run on ctx since dg_context_profile(ctx, 1), measured
 * with cudaEvents between consecutive stages on the context's stream (a
 * stage's time includes the launch gaps inside it; "host and launch gaps" is
 * the time between calls into the backend). Stages, in pass order: embedding
 * and norms, q/k/v + rope, attention, o-proj, dense MLP, router + top-k,
 * grouping, experts, combine, LM head, self-conditioning, sampler statistics,
 * host and launch gaps; the reference sampler's calls are split this way, the
 * turbo engine's too (its top-K under sampler statistics, its self-conditioning
 * rows under self-conditioning, its compacted and row passes' embedding, SC
 * MLP and LM head under theirs).
 * on = 0 stops and frees the events. Errors: DG_ERR_INVALID_ARG on a CPU
 * context, DG_ERR_BACKEND. */
#define DG_PROFILE_STAGES 13
#define DG_PROFILE_EXPERT_BINS 1024
typedef struct dg_profile {
  double ms[DG_PROFILE_STAGES]; /* milliseconds of GPU time per stage */
  const char *name[DG_PROFILE_STAGES];
  int64_t marks; /* stage boundaries recorded */
  /* The stacked passes of a batch (dg_generate_batch, dg_batch_step with B > 1 on CUDA) that ctx led: ctx was
   * the first canvas of the stack with profiling on. They run on the batch's work context, not on ctx, so ms[]
   * above leaves them out (its "host and launch gaps" hold them); here the same stages, the interval before a
   * stack's first mark (since the previous stack ctx led: the canvases' own device work and the host's) under
   * "host and launch gaps". Summed over the batch's contexts: every stacked pass once. All zero without one. */
  double stack_ms[DG_PROFILE_STAGES];
  int64_t stack_marks;
  int64_t stack_passes;   /* stacks (one per denoising step unless the forward sets overflow the work rows) */
  int64_t stack_canvases; /* canvases summed over those stacks */
  int64_t stack_rows;     /* forward-set rows summed over those stacks */
  /* Rows per expert in those stacks' MoE, read back after every layer's routing: stack_expert_rows[r] = the
   * (stack, layer, expert) triples with r rows (r = 0: not hit; the last bin: r >= DG_PROFILE_EXPERT_BINS - 1);
   * they sum to stacks x layers x experts, and r x count to stack_rows x layers x top_k. */
  int64_t stack_expert_rows[DG_PROFILE_EXPERT_BINS];
  int64_t stack_expert_rows_max;
} dg_profile;
dg_status dg_context_profile(dg_context *ctx, int on);
/* Synchronise and read the totals (profiling stays on). DG_ERR_INVALID_ARG if it is off. */
dg_status dg_context_profile_read(dg_context *ctx, dg_profile *out);

typedef enum dg_finish_reason {
  DG_FINISH_LENGTH = 0,     /* max_new_tokens reached */
  DG_FINISH_STOP = 1,       /* a stop id was produced */
  DG_FINISH_REPETITION = 2  /* turbo repeat guard: one id emitted turbo.repeat_guard times in a row */
} dg_finish_reason;

typedef struct dg_gen_result {
  int32_t *tokens;       /* [n_tokens] all generated canvases, pads after the first stop id */
  int32_t n_tokens;
  int32_t n_valid;       /* generated tokens up to and including the first stop id */
  int32_t n_blocks;
  int32_t n_steps;       /* decoder forwards in total */
  int32_t finished;      /* 1 if a stop id was produced */
  double seconds;        /* wall time, prefill included */
  double tokens_per_forward;
  dg_finish_reason finish_reason;
  int64_t n_forwarded;   /* canvas positions run through the decoder, summed over forwards (C per forward
                            unless turbo.compact) */
  int32_t n_visible;     /* of the n_valid tokens, the generated text: not pad, not a special token (the
                            stop id that ended generation counts); what tok/s counts. It differs from
                            n_valid when there are no stop ids ({"eos_token_id": []}): the <eos>
                            canvases a model writes after its answer are hidden, so not counted */
} dg_gen_result;

/* Block-diffusion generation (spec 6.1): prefill the prompt (appended to the
 * context's KV cache), then denoise canvases until a stop id or
 * max_new_tokens (rounded up to whole canvases). *result is zeroed on entry;
 * only a DG_OK return leaves memory in it, to be released with
 * dg_gen_result_free (so never pass a result that still holds tokens).
 * With params->turbo.enabled the turbo engine of spec 7 runs instead (src/sample/turbo.c);
 * replay streams are not supported there.
 * Errors: DG_ERR_INVALID_ARG, DG_ERR_CONTEXT_FULL, DG_ERR_NUMERIC (naming
 * block and step), DG_ERR_REPLAY, DG_ERR_ABORTED. */
dg_status dg_generate(dg_context *ctx, const int32_t *prompt, size_t n_prompt,
                      const dg_gen_params *params, dg_gen_result *result);
void dg_gen_result_free(dg_gen_result *r);

/* Multi-canvas batching (turbo engine, spec 7): generate for B prompts at
 * once, one context per prompt (ctxs[B], distinct, same model), each with
 * its own parameters params[B] (all with turbo.enabled; seeds, schedules and
 * callbacks are per canvas) and result results[B]. Every denoising step runs
 * the live canvases' forward sets (turbo_compact: live + just committed
 * positions; otherwise the whole canvas) through one decoder pass; commits
 * and repair forwards run per canvas. A canvas's tokens do not depend on B
 * or on the other prompts: they equal dg_generate with the same context
 * state and parameters (exactly with float weights; the quantized kernels'
 * row-count-dependent tiling may change the last bits). results[] are zeroed
 * on entry and hold memory only on DG_OK. Errors: those of dg_generate,
 * prefixed with the canvas index. */
dg_status dg_generate_batch(dg_context *const *ctxs, int32_t B, const int32_t *const *prompts, const size_t *n_prompts,
                            const dg_gen_params *params, dg_gen_result *results);

/* Continuous batching (turbo engine, spec 7; used by `dgemma serve`): a set
 * of up to max_canvases sequences that join and leave between denoising
 * steps. Each dg_batch_step runs one denoising step of every live sequence,
 * their forward sets stacked through one decoder pass (CPU; on CUDA one
 * device pass per canvas), then each sequence's own sampler step, canvas
 * end (repair, emission, on_block) and the commit of its next canvas. As in
 * dg_generate_batch, a sequence's tokens equal its own dg_generate with the
 * same context state and parameters, whatever joins or leaves around it.
 * Not thread-safe: one thread drives a batch. */
typedef struct dg_batch dg_batch;

/* A batch of at most max_canvases (1..4096) live sequences on model m; the
 * stacked pass's scratch (max_canvases x canvas_length rows) is allocated
 * here. Errors: DG_ERR_INVALID_ARG, DG_ERR_OUT_OF_MEMORY. */
dg_status dg_batch_new(const dg_model *m, int32_t max_canvases, dg_batch **out);
/* Free the batch; live sequences are cancelled (dg_batch_cancel). NULL is a no-op. */
void dg_batch_free(dg_batch *b);
/* Join: validate (as dg_generate; params->turbo.enabled is required), prefill
 * the prompt into ctx (the call's cost), prepare the first denoising step.
 * ctx, params and result must stay valid until the sequence leaves; result
 * is zeroed here and filled when the sequence finishes. *slot = its index in
 * [0, max_canvases). Errors: those of dg_generate; DG_ERR_INVALID_ARG also
 * when every slot is taken or ctx is already in the batch. */
dg_status dg_batch_add(dg_batch *b, dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *params,
                       dg_gen_result *result, int32_t *slot);
/* One denoising step of every live sequence (see above). The sequences that
 * left during it are written to done[*n_done] (slots; done has room for
 * max_canvases) with their status in done_status (may be NULL): DG_OK = it
 * finished, its result filled (a stop id, max_new_tokens or the repeat
 * guard); else it failed (DG_ERR_ABORTED from a callback, DG_ERR_NUMERIC, ...;
 * dg_last_error() holds the last failure's message) and its result is
 * empty. The return value is that of the shared decoder pass: on failure
 * every sequence of the pass has left with that status. */
dg_status dg_batch_step(dg_batch *b, int32_t *done, dg_status *done_status, int32_t *n_done);
/* End the sequence in slot (a client that went away): its state is freed,
 * its result stays empty, the slot is free again. A free slot is a no-op. */
void dg_batch_cancel(dg_batch *b, int32_t slot);
/* Number of live sequences. */
int32_t dg_batch_live(const dg_batch *b);

/* ------------------------------------------------------------------------- */
/* Low-level passes (parity and debugging)                                   */
/* ------------------------------------------------------------------------- */

/* Encoder pass (spec 4.5): run ids[n] causally at positions L..L+n-1 and append
 * their K/V to the cache. Errors: DG_ERR_CONTEXT_FULL, DG_ERR_INVALID_ARG (id
 * outside the vocabulary). */
dg_status dg_encode(dg_context *ctx, const int32_t *ids, size_t n);

/* Decoder pass (spec 4.5, 4.8, 5): canvas[C] at positions L..L+C-1 attending to
 * the cache, with self-conditioning from sc_logits [C, V] (the previous step's
 * processed logits z = softcapped logits / T; NULL = zero signal, the first
 * step of a block). Writes softcapped fp32 logits [C, V] to logits_out. The
 * cache is not modified. C must equal the model's canvas_length. Errors:
 * DG_ERR_INVALID_ARG (a canvas id outside the vocabulary, a NaN or infinite
 * sc_logits value, named by its [row, id]). */
dg_status dg_decode(dg_context *ctx, const int32_t *canvas, const float *sc_logits,
                    float *logits_out);

#ifdef __cplusplus
}
#endif
#endif /* DGEMMA_H */
