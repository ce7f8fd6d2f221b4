/* model.h: internal definition of dg_model (weights bound to the mmap'd
 * checkpoint) and dg_context (KV cache + scratch), shared by model.c,
 * forward.c and generate.c. Not a public header.
 *
 * Dimension letters used in shape comments:
 *   V vocab, H hidden, L layers, NH query heads, NKV kv heads of a layer,
 *   D head_dim of a layer, I dense/self-conditioning MLP width,
 *   IE expert width, E experts, K top-k, C canvas length, T tokens in a pass,
 *   S KV-cache capacity (positions). */
#ifndef DG_MODEL_H
#define DG_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"
#include "dgemma.h"
#include "cpu/kernels.h"
#include "base/layer.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

struct dg_model {
  dg_config cfg;
  dg_gen_params gen_defaults;
  int has_gen_config;     /* generation_config.json was there (else gen_defaults are spec 1.3's) */
  char *dir;
  dg_safetensors *st;
  dg_tokenizer *tok;      /* NULL if loaded without a tokenizer */
  dg_weight embed;        /* [V, H] tied embedding / LM head */
  dg_dtype act_dtype;     /* embedding dtype: drives the reference's casts (spec 4.9) */
  float embed_scale;      /* sqrt(H) rounded to act_dtype (53.0 for bf16 H=2816) */
  float *final_norm;      /* [H] */
  float *sc_pre_norm;     /* [H] self-conditioning pre_norm */
  dg_weight sc_gate, sc_up; /* [I, H] */
  dg_weight sc_down;        /* [H, I] */
  dg_layer *layers;         /* [L] */
  /* rope inverse frequencies per layer kind: [D/2] each (0 for pass-through dims) */
  float *inv_freq_sliding, *inv_freq_full;
  int d_sliding, d_full;    /* head dims the tables were built for (0 if kind absent) */
  int n_threads;
  const dg_kernels *kern;
  float **owned;            /* fp32 copies of small tensors, freed with the model */
  int n_owned, cap_owned;
  int64_t n_params;
  dg_quant_config qcfg;     /* config.json's quantization block (present = 0 if none) */
  int n_quantized;          /* matrices stored MLX-quantized */
  int min_bits, max_bits;   /* their bit widths (0 if none) */
  const dg_backend *bk;     /* the backend every pass of this model runs on (backend.h; set by dg_model_load) */
  void *dev;                /* the backend's copy of the weights (CUDA: a dg_cuda_model), else NULL */
};

/* Per-layer KV cache: all positions are kept (sliding layers read only the
 * last window-1 positions before a chunk). K and V: [NKV, S, D] fp32. */
typedef struct dg_kv {
  float *k, *v;
} dg_kv;

/* The activations of one pass of up to tmax rows (everything a pass computes and
 * the next step does not read: issue 16), in one allocation laid out from a size
 * table (context.c). A context uses its own (allocated on its first pass) or,
 * inside a CPU batch, the batch's, shared by the batch's canvases: a canvas keeps
 * only its own state (KV cache, canvas K/V buffers, SC rows). */
typedef struct dg_work {
  int32_t tmax;         /* T: rows per pass */
  float *x, *xa, *xb;   /* [T, H] residual / normed / branch output */
  float *q;             /* [T, NH*Dmax] */
  float *k, *v;         /* [T, NKVmax*Dmax] */
  float *att;           /* [T, NH*Dmax] */
  float *h1, *h2;       /* [T, max(I, IE)] */
  float *router_logits; /* [T, E] */
  int32_t *topk_idx;    /* [T, K] */
  float *topk_w;        /* [T, K] */
  int32_t *exp_tokens;  /* [T*K] token lists grouped by expert */
  int32_t *exp_count;   /* [E] */
  int32_t *exp_start;   /* [E+1] */
  float *ebuf_in, *ebuf_out; /* [T*K, H] gathered expert rows */
  float *eh1, *eh2;     /* [T*K, IE] */
  float *rope_cos, *rope_sin; /* [T, Dmax/2] */
  int32_t rope_pos0, rope_T, rope_full; /* what the tables hold (rope_pos0 = -1: nothing) */
  int32_t rope_scatter_id;  /* serial number of the last scattered-position pass (rope table cache key) */
  float *probs;         /* [threads, V] one self-conditioning probability row per thread */
  int32_t *cmp_buf;     /* [4 T + 1] dg_cpu_compact_batch's token, position, SC-row lists and canvas offsets */
  void *arena;          /* the one allocation all of the above point into */
  size_t bytes;
} dg_work;

struct dg_context {
  const dg_model *m;
  int32_t cap;  /* S */
  int32_t len;  /* positions filled */
  int full_window; /* dg_context_params.full_window_cache (backends with ring caches honour it) */
  dg_kv *kv;    /* [L] */
  dg_work *w;           /* the pass activations in use: own_w, or a batch's (dg_context_share_work); NULL until needed */
  dg_work *own_w;       /* this context's own, allocated on its first pass alone (dg_context_work); NULL until then */
  int32_t work_rows;    /* rows of own_w: max(C, encoder chunk, the rows asked for) */
  float *scores;        /* [nthreads, score_stride] attention scratch (DG_SCORE_FLOATS, context.h) */
  int32_t n_score_threads;
  int32_t score_stride; /* DG_SCORE_FLOATS(S, max(C, encoder chunk)) floats per thread */
  float *soft;          /* [C, H] self-conditioning soft embedding */
  int canvas_kv_ready;  /* dg_context_compact_buffers was called (and no dg_context_release_buffers since): the
                           compacted passes may run. Their canvas K/V live in the KV cache's own canvas slots,
                           positions [len, len + C) of kv (as on CUDA), when len + C <= cap; else in cbuf_k/v */
  float **cbuf_k, **cbuf_v; /* [L] x [C, NKV, D] canvas K/V of the compacted decoder (spec 7.4) for a canvas the
                               cache has no slots for (len + C > cap); NULL until such a canvas (dg_context_canvas_kv) */
  float *soft_pb;       /* [soft_pb_rows, V] dg_soft_embedding's block probabilities (SOFT_ROWS rows per
                           thread), allocated on the first call and kept until dg_context_trim (the end of a request), so a step allocates
                           nothing; NULL until used */
  size_t soft_pb_rows;
  void *arena;          /* the one allocation of kv, its K/V rows, scores and soft (context.c's size table) */
  void *cbuf_arena;     /* the one allocation of cbuf_k, cbuf_v and their rows (NULL while every canvas fits the cache) */
  float *kvt;           /* [2, max over layers of C * NKV * D] a batch work context's scratch for the canvas K/V of one
                           layer of its kv_transient canvases (dg_compact_seq), made on first need, kept until
                           dg_context_release_buffers; NULL until then */
  void *dev;    /* the backend's context (CUDA: a dg_cuda_ctx with the device KV cache and buffers;
                   the CPU buffers above are then not allocated), else NULL */
};

/* backend_select.c: the passes on ctx's backend (m->bk, backend.h) ------------------ */

/* Encoder pass over ids[n] at positions ctx->len.., appending K/V (spec 4.5):
 * prefill and commit. Errors: DG_ERR_CONTEXT_FULL (capacity named), the backend's. */
dg_status dg_forward_encode(dg_context *ctx, const int32_t *ids, int32_t n);

/* Decoder pass like dg_forward_decode, but the LM head runs only for the
 * n_rows canvas positions rows[] (each in [0, C)) and writes RAW logits (no
 * softcap) raw [n_rows, V] (spec 7.3: the turbo chain ranks raw logits).
 * On a device backend the soft rows are uploaded and raw copied back. */
dg_status dg_forward_decode_rows(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                                 int32_t n_rows, float *raw);

/* The per-layer canvas K/V buffers of the compacted pass (once per context;
 * nothing on CUDA, whose device cache slots L..L+C-1 serve as the buffers). */
dg_status dg_compact_buffers(dg_context *ctx);

/* The compacted pass of one canvas (dg_cpu_compact_batch's semantics below;
 * soft NULL = zero signal, raw [nh, V]). Errors: DG_ERR_INVALID_ARG (no
 * buffers, bad sizes or positions), DG_ERR_CONTEXT_FULL. */
dg_status dg_forward_compact(dg_context *ctx, const int32_t *tok, const int32_t *pos, int32_t n, const float *soft,
                             const int32_t *head, int32_t nh, float *raw);

struct dg_compact_seq;
/* B canvases' compacted passes as stacks of rows in work's scratch (the
 * backend's compact_batch). Every canvas is checked (dg_compact_seq_check)
 * before any pass runs. */
dg_status dg_forward_compact_batch(dg_context *work, const struct dg_compact_seq *seqs, int32_t B);

/* dg_context_new whose own activations (allocated on its first pass) hold passes of at least
 * `rows` rows. */
dg_status dg_context_new_rows(const dg_model *m, const dg_context_params *p, int32_t rows, dg_context **out);

/* model.c: the host side of dg_model_load (config, weights, tokenizer) without
 * choosing a backend; m->bk is left NULL. Errors: those of dg_model_load. */
dg_status dg_model_load_host(const char *dir, const dg_model_params *p, dg_model **out);

/* forward.c: the CPU backend's passes (backend_cpu.c puts them in its table) - */

/* CPU encoder pass (dg_forward_encode after its capacity check). */
dg_status dg_cpu_encode(dg_context *ctx, const int32_t *ids, int32_t n);

/* CPU decoder pass with the LM head on rows[n_rows] (dg_forward_decode_rows):
 * raw [n_rows, V], or when raw is NULL the final-normed hidden states hn
 * [n_rows, H]. Errors: DG_ERR_INVALID_ARG (a row or id out of range),
 * DG_ERR_CONTEXT_FULL. */
dg_status dg_cpu_decode_rows(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                             int32_t n_rows, float *raw, float *hn);

/* dg_decode on the CPU: soft embedding of sc_logits [C, V] (NULL: none),
 * decoder pass, softcapped logits_out [C, V]. */
dg_status dg_cpu_decode_logits(dg_context *ctx, const int32_t *canvas, const float *sc_logits, float *logits_out);

/* dg_compact_buffers on the CPU (context.c, dg_context_compact_buffers): allocates nothing while the
 * canvas fits the cache's slots. */
dg_status dg_cpu_compact_buffers(dg_context *ctx);

/* Decoder pass over canvas[C] at positions ctx->len.. (spec 4.5, 4.8).
 * soft: [C, H] self-conditioning soft embedding (already scaled by the
 * embedding scale), or NULL for the zero signal. logits: [C, V] softcapped. */
dg_status dg_forward_decode(dg_context *ctx, const int32_t *canvas, const float *soft, float *logits);

/* dg_forward_decode_rows without the vocabulary product: the n_rows head
 * rows' final-normed hidden states hn [n_rows, H] (spec 4.7's final norm),
 * which dg_lm_head_rows turns into the same raw logits bit for bit, a few
 * rows at a time (the turbo engine holds [rows, V], not [C, V]; issue 16).
 * CPU contexts only (DG_ERR_INVALID_ARG on a device context); other errors
 * as dg_forward_decode_rows. */
dg_status dg_forward_decode_hidden(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                                   int32_t n_rows, float *hn);

/* The tied LM head on n final-normed hidden rows hn [n, H]: raw [n, V] =
 * hn E^T, no softcap (spec 4.7), on m's CPU kernels and threads. A row's
 * values do not depend on n or on the other rows (kernels.h: the summation
 * order depends only on K), so any split of the rows gives the same bits as
 * the LM head of dg_forward_decode_rows / dg_forward_compact. */
void dg_lm_head_rows(const dg_model *m, const float *hn, int32_t n, float *raw);

/* Compacted active-set decoder pass (spec 7.4). The forward set F is n
 * canvas positions pos[n] (in [0, C); duplicates allowed: they recompute
 * identical values and scatter idempotently) holding tokens tok[n]; soft:
 * [C, H] self-conditioning rows by canvas position (NULL = zero signal).
 * Each layer computes F's fresh K/V at absolute positions L + pos, scatters
 * them into the layer's canvas buffer rows, and attends from F's queries over
 * [cached prefix, the whole canvas buffer] with no mask; rows of the buffer
 * not in F keep the K/V of the last pass that wrote them (stale K/V). The LM
 * head runs on the nh forward-set rows head[] (indices into F): raw [nh, V],
 * no softcap. Errors: DG_ERR_INVALID_ARG (no buffers, bad sizes or
 * positions), DG_ERR_CONTEXT_FULL. */
/* One canvas of a batched compacted pass: its context (prefix KV cache,
 * canvas buffers, canvas positions L..L+C-1) and the arguments of
 * dg_forward_compact. */
typedef struct dg_compact_seq {
  dg_context *ctx;
  const int32_t *tok, *pos;
  int32_t n;
  const float *soft;
  const int32_t *head;
  int32_t nh;
  float *raw; /* [nh, V] raw logits of the head rows, or NULL: */
  float *hn;  /* [nh, H] their final-normed hidden states instead (CPU only; dg_lm_head_rows) */
  dg_sc_source sc; /* with soft NULL: DG_SC_KEPT for the rows a device backend kept (its last sc_rows), else
                    * DG_SC_NONE (no self-conditioning) */
  int kv_transient; /* 1: a canvas without turbo_compact in a batch: every position is forwarded in every pass (n >= C,
                     * all of 0..C-1 among pos), so no later pass reads this pass's canvas K/V and the CPU keeps them
                     * in the batch work context's one-layer scratch (kvt) instead of the cache's canvas slots of every
                     * layer (issue 16: host memory per canvas). 0: the slots (or separate rows). Device backends
                     * keep their own slots either way. */
} dg_compact_seq;

/* Multi-canvas batching: the B canvases' forward sets run through every
 * layer's matrix products as stacks of rows in the activations of `work`
 * (work->w): consecutive canvases whose rows together fit its tmax rows
 * (>= C) form one stack, so the activations never hold more than one pass of
 * tmax rows however many canvases the batch has (issue 16); attention, K/V
 * scatter and the LM head stay per canvas. Each canvas's results equal its
 * own dg_forward_compact (rows do not interact outside attention), whatever
 * the chunks. dg_forward_compact is this with B = 1 and work = ctx. Errors
 * as dg_forward_compact. Its row lists are in the activations: a step
 * allocates nothing. */
dg_status dg_cpu_compact_batch(dg_context *work, const dg_compact_seq *seqs, int32_t B);

/* The checks of canvas q of a compacted pass, for every backend: the model,
 * sizes, positions and head rows, the context length, the token ids, and an
 * output for the head rows (raw, or hn where host_hn: the backend's head runs
 * on the host). Errors: DG_ERR_INVALID_ARG, DG_ERR_CONTEXT_FULL. */
dg_status dg_compact_seq_check(const dg_model *m, const dg_compact_seq *s, int32_t q, int host_hn);

/* The compacted pass's steps for one token at a time, so that the token-by-token oracle of the
 * tests (tests/support/compact_oracle.h) is built from the pass's own steps. ctx: a CPU context
 * with its work buffers (dg_context_work), readied by dg_compact_buffers; pos: a canvas position.
 * dg_cpu_row_input: x [H] = the decoder input of token tok (E[tok] * scale + the SC MLP of
 * soft's row pos, soft [C, H] or NULL, post-normed; spec 4.8). dg_cpu_row_kv: the K/V of layer
 * li of the row x [H] written into the layer's canvas K/V row pos (dg_context_canvas_kv: the
 * cache's slot len + pos, or the separate rows). dg_cpu_row_layer: layer li on the row x [H]
 * (its attention over [prefix, the whole canvas K/V], no mask, then its FFN): y [H]. Both
 * fail as dg_context_canvas_kv. dg_cpu_rows_head: the LM head on the n rows rows[] of hid
 * [*, H]: raw [n, V]. */
dg_status dg_cpu_row_input(dg_context *ctx, int32_t tok, int32_t pos, const float *soft, float *x);
dg_status dg_cpu_row_kv(dg_context *ctx, int li, int32_t pos, const float *x);
dg_status dg_cpu_row_layer(dg_context *ctx, int li, int32_t pos, const float *x, float *y);
void dg_cpu_rows_head(dg_context *ctx, const float *hid, const int32_t *rows, int32_t n, float *raw);

/* Self-conditioning soft embedding from processed logits z [C, V] (spec 5 and
 * 4.9): z cast to the embedding dtype, softmax in fp32, probabilities cast to
 * the embedding dtype, times E, times embed_scale. Writes soft [C, H].
 * Its block scratch, [min(threads, ceil(C / 16)) * 16, V] floats in
 * ctx->soft_pb, is allocated on the first call and kept with the context
 * until dg_context_trim (or its free); without the memory it goes row by row in ctx->w->probs, with
 * the same sums. */
dg_status dg_soft_embedding(dg_context *ctx, const float *z, float *soft);

/* Free the context's scratch that is regrown on demand (dg_soft_embedding's block probabilities: up to
 * [threads * 16, V] floats, ~268 MB at a 262,144 vocabulary and 16 threads), so that a context kept between requests
 * (a server's) holds none of it; called at the end of a reference generation. Never fails. */
void dg_context_trim(dg_context *ctx);

/* Round a float to the model's activation dtype (identity for f32). */
float dg_round_act(const dg_model *m, float x);

#endif
