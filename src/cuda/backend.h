/* backend.h: the C interface of dgemma's CUDA backend (kernels in src/cuda/, .cu files).
 *
 * The forward pass of spec section 4 (encoder and decoder), the exact
 * self-conditioning of section 5 and the per-position sampler math of 6.1 run
 * on one NVIDIA GPU with every weight resident in device memory as bf16
 * (norm weights, router and rope tables in fp32). Dense products go through
 * cuBLAS (bf16 in, fp32 accumulate and out); the MoE is a grouped product over
 * the experts the tokens chose (moe.cu, dg_cuda_experts). One stream per
 * context; the host synchronises once per denoising step, to read [C]
 * per-position statistics.
 *
 * This header is plain C and includes no CUDA header. The samplers reach the
 * backend only through its table (src/backend/backend.h, filled by src/backend/device.c);
 * tests and tools reach the entry points below that the table has no slot
 * for through dg_cuda_api (the table's `api`). The sources: upload.cu
 * (device checks, weight upload), context.cu (contexts, stage timing),
 * passes.cu (encoder, decoder, step statistics, soft embedding),
 * turbo_host.cu (the turbo passes), the kernels in the other .cu files. A CPU-only build compiles
 * none of this: it has no CUDA table, and asking for CUDA there gives
 * DG_ERR_BACKEND ("built without CUDA", src/backend/backend_select.c).
 *
 * Errors: every function returns a dg_status; a failing CUDA or cuBLAS call
 * gives DG_ERR_BACKEND with dg_last_error() naming the call, the file and
 * line, and the CUDA message. Nothing aborts. */
#ifndef DG_CUDA_BACKEND_H
#define DG_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h" /* dg_sc_source (src/backend/backend.h; "backend.h" here would be this file) */
#include "dgemma.h"
#include "base/layer.h" /* dg_layer, dg_weight, dg_dtype: the loader's weight description */

#ifdef __cplusplus
extern "C" {
#endif

/* The weights are handed over in the loader's own description (one for the
 * loader and both backends): dg_weight (src/base/weight.h) for a matrix and
 * dg_layer (src/base/layer.h) for a layer, host pointers into the mmap'd
 * checkpoint and the model's fp32 vectors. Float matrices (bits 0) of
 * dtype DG_F32, DG_BF16 or DG_F16 are converted to bf16 on upload;
 * MLX affine-quantized ones (bits 2, 3, 4, 6 or 8; src/io/quant.h: code k of a
 * row at bits [k*bits, (k+1)*bits) of the row's little-endian bit stream,
 * scales and biases [rows, cols / group_size] of sb_dtype DG_BF16, DG_F16 or
 * DG_F32, w[r, k] = (float)q * scale + bias in fp32) are uploaded as they
 * are and dequantized inside the kernels; a quantized router is dequantized
 * to fp32 on the host first (the device keeps every router in fp32). v of a
 * K=V full layer has data NULL. */

/* Everything the device needs from a loaded dg_model (built by src/backend/device.c). */
typedef struct dg_cuda_model_desc {
  int32_t vocab, hidden, n_layers, n_heads, inter, moe_inter, n_experts, top_k;
  int32_t window, canvas;
  float eps, softcap;           /* rms_norm_eps; final_logit_softcapping (0 = none) */
  float embed_scale;            /* sqrt(H) rounded to the activation dtype (spec 4.9) */
  dg_dtype act_dtype;           /* DG_BF16, DG_F16 or DG_F32: dtype the reference casts SC logits/probs to */
  dg_weight embed;              /* [V,H] tied embedding and LM head */
  const float *final_norm, *sc_pre_norm; /* [H] */
  dg_weight sc_gate, sc_up, sc_down;     /* [I,H], [I,H], [H,I] */
  const float *inv_freq_sliding, *inv_freq_full; /* [D/2] each, 0 = pass-through pair (spec 4.3) */
  const dg_layer *layers;       /* [n_layers]: the model's own (model.h) */
  int device;                   /* CUDA ordinal */
} dg_cuda_model_desc;

typedef struct dg_cuda_model dg_cuda_model;
typedef struct dg_cuda_ctx dg_cuda_ctx;

/* One line describing GPU `device` ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB
 * free of 139.8 GiB, driver 13.0, runtime 13.0") into buf. Errors:
 * DG_ERR_BACKEND when built without CUDA, when no GPU is visible, or when the
 * GPU is older than this build supports (message names the compute
 * capability and what the build was compiled for). */
dg_status dg_cuda_info(int device, char *buf, size_t n);

/* Upload a model's weights to device d->device (float matrices as bf16,
 * quantized ones packed as stored, vectors fp32); the host pointers in d are
 * not kept. Errors also: DG_ERR_UNSUPPORTED_MODEL for a quantized matrix with
 * bits, group size or scales dtype outside the list above. Refuses up front, with DG_ERR_OUT_OF_MEMORY naming the bytes needed and
 * available, a model that does not fit in device memory.
 * Errors: DG_ERR_BACKEND, DG_ERR_OUT_OF_MEMORY, DG_ERR_UNSUPPORTED_MODEL
 * (a head dim above 512 or odd). */
dg_status dg_cuda_model_new(const dg_cuda_model_desc *d, dg_cuda_model **out);
void dg_cuda_model_free(dg_cuda_model *m);
/* Bytes of device memory the weights occupy (quantized matrices count their
 * packed words, scales and biases). */
size_t dg_cuda_model_bytes(const dg_cuda_model *m);

/* A context: KV cache for `cap` positions (plus one canvas, bf16, [NKV, S, D]
 * per full layer; the sliding layers a ring of window - 1 + max(canvas, encoder
 * chunk) slots unless full_window), work buffers for max(canvas, encoder chunk, rows) tokens (rows: the
 * stacked passes of dg_cuda_compact_batch; 0 for a plain context), logits
 * [C, V], one stream and one cuBLAS handle. Errors: DG_ERR_OUT_OF_MEMORY
 * (bytes needed and free), DG_ERR_BACKEND. */
dg_status dg_cuda_ctx_new(dg_cuda_model *m, int32_t cap, int32_t rows, int full_window, dg_cuda_ctx **out);
/* Whether the cache can be rolled back to position len (dg_context_truncate): DG_OK, or DG_ERR_CONTEXT_FULL when
 * the sliding layers' ring (full_window 0) has overwritten a key of the window before len. */
dg_status dg_cuda_truncate_check(const dg_cuda_ctx *c, int32_t len);
/* The backend's ctx_copy (src/backend/backend.h; dg_context_copy_prefix, which checked both contexts' model, n <=
 * their lengths and capacities and that src still holds the window before n): the K/V of positions [0, n) of every
 * full layer from src into dst, and of the positions [lo, n) of every sliding layer, lo the first that src's ring
 * still holds, at least n - dst's ring (position p sits in slot p % S of each side's own slot count S), bit for bit,
 * by one kernel per layer on dst's stream after src's stream has drained; synchronised before return. dst's
 * sliding layers then hold positions lo.. only (dg_cuda_truncate_check refuses to roll back below lo + window - 1).
 * Errors: DG_ERR_BACKEND. */
dg_status dg_cuda_ctx_copy(dg_cuda_ctx *dst, const dg_cuda_ctx *src, int32_t n);
void dg_cuda_ctx_free(dg_cuda_ctx *c);

/* Encoder pass (spec 4.5) over ids[n] at positions pos0..pos0+n-1, in
 * chunks of 256 tokens: writes their K/V into the device cache (pos0 + n <=
 * cap). Ids must be valid (checked by the caller). Synchronises once at the
 * end, so kernel errors are reported here. */
dg_status dg_cuda_encode(dg_cuda_ctx *c, const int32_t *ids, int32_t n, int32_t pos0);

/* Decoder pass (spec 4.5, 4.8) over canvas[C] at positions pos0.. reading the
 * cache [0, pos0). Self-conditioning (spec 5):
 *   DG_SC_NONE: zero signal (first step of a block);
 *   DG_SC_KEPT: soft embedding already on the device (dg_cuda_soft_from_z);
 *   DG_SC_HOST: from host processed logits sc_logits [C, V] (uploaded).
 * Leaves softcapped fp32 logits [C, V] on the device; if logits_out != NULL
 * they are copied there (synchronous). */
dg_status dg_cuda_decode(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc,
                         const float *sc_logits, float *logits_out);

/* Per-position statistics on the device logits of the last decode (spec 6.1
 * steps 2-4): z = logits / T in place, argmax, entropy of softmax(z), max
 * probability, and the proposal:
 *   mode DG_PROPOSAL_ARGMAX: the argmax;
 *   DG_PROPOSAL_SAMPLE: inverse CDF with u from Philox4x32-10 (src/base/rng.h:
 *     seed, stream DG_RNG_PROPOSAL, block, step), the same numbers as the CPU;
 *   DG_PROPOSAL_REPLAY_UNIFORM: inverse CDF with host uniforms uni[C].
 * out: host array of C records laid out as dg_pos_stats (rowstats.h).
 * Returns DG_ERR_NUMERIC (no message) with *bad_pos set if a logit is not
 * finite. Synchronous: the one host sync of a denoising step. */
dg_status dg_cuda_step_stats(dg_cuda_ctx *c, float temperature, dg_proposal mode, uint64_t seed, int32_t block,
                             int32_t step, const float *uni, void *out, int32_t *bad_pos);

/* Self-conditioning soft embedding (spec 5, 4.9) from the processed logits z
 * left on the device by dg_cuda_step_stats: P = cast(softmax(cast(z))) in
 * bf16, soft = (P . E) * embed_scale [C, H] kept on the device for the next
 * dg_cuda_decode(..., DG_SC_KEPT, ...). */
dg_status dg_cuda_soft_from_z(dg_cuda_ctx *c);

/* ---- turbo engine (spec 7; the engine is src/sample/turbo.c) ----
 * Self-conditioning argument sc of the passes below: DG_SC_NONE zero signal;
 * DG_SC_KEPT the device's per-position rows c->soft [C, H] (left by an
 * earlier pass's upload or by dg_cuda_turbo_sc); DG_SC_HOST upload host rows
 * soft [C, H] (already scaled, by canvas position) first. Each pass leaves RAW logits (final norm
 * and tied LM head, no softcap: the turbo chain ranks raw logits, spec 7.3)
 * of its head rows on the device, [n, V] in head-row order, for
 * dg_cuda_topk / dg_cuda_turbo_sc / dg_cuda_raw_rows. */

/* Plain decoder pass over canvas[C] at positions pos0.. (as dg_cuda_decode),
 * LM head on the n canvas rows rows[] only. raw_out [n, V] (host) receives
 * the raw logits if not NULL (synchronous). Errors: DG_ERR_INVALID_ARG,
 * DG_ERR_CONTEXT_FULL, DG_ERR_BACKEND. */
dg_status dg_cuda_decode_rows(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc,
                              const float *soft, const int32_t *rows, int32_t n, float *raw_out);

/* Compacted active-set decoder pass (spec 7.4; CPU: dg_forward_compact). The
 * forward set is n canvas positions pos[n] holding tokens tok[n] (duplicates
 * allowed: identical values, idempotent scatter). Every layer computes their
 * K/V at absolute positions pos0 + pos[t] (rope at scattered positions),
 * writes them into the cache slots pos0 + pos[t] (the slots pos0..pos0+C-1
 * are the canvas K/V buffer; rows not forwarded keep the K/V of the last
 * pass that wrote them), and attends from the n queries over the prefix and
 * the whole canvas [pos0, pos0 + C) with no mask. The LM head runs on the nh
 * forward-set rows head[] (indices into pos). raw_out as above. */
dg_status dg_cuda_compact(dg_cuda_ctx *c, const int32_t *tok, const int32_t *pos, int32_t n, int32_t pos0,
                          dg_sc_source sc, const float *soft, const int32_t *head, int32_t nh, float *raw_out);

/* One canvas of a stacked compacted pass: dg_cuda_compact's arguments. */
typedef struct dg_cuda_cseq {
  dg_cuda_ctx *c;
  const int32_t *tok, *pos;
  int32_t n, pos0;
  dg_sc_source sc;
  const float *soft;
  const int32_t *head;
  int32_t nh;
  float *raw_out;
} dg_cuda_cseq;

/* The compacted passes of B canvases (each in its own context q[i].c, at least one row each) as stacks of rows
 * in the work buffers of `work` (its tmax rows): consecutive canvases whose forward sets together fit form
 * one stack, whose every product runs over all its rows at once (the expert weights are read once per stack,
 * not per canvas); the K/V scatter, the attention and the LM head stay per canvas, into each canvas's own
 * cache and logits (as dg_cuda_compact leaves them: dg_cuda_topk / dg_cuda_turbo_sc / dg_cuda_raw_rows on
 * q[i].c follow). The results of each canvas are those of its own dg_cuda_compact up to the rounding of the
 * products over more rows (cuBLAS may choose another algorithm for another row count). Synchronous: every
 * canvas's stream has finished before, the work stream after. Errors: those of dg_cuda_compact, and
 * DG_ERR_INVALID_ARG for a canvas of more rows than work holds. */
dg_status dg_cuda_compact_batch(dg_cuda_ctx *work, const dg_cuda_cseq *q, int32_t B);

/* Copy the first n raw logit rows of the last pass to raw_out [n, V]. */
dg_status dg_cuda_raw_rows(dg_cuda_ctx *c, int32_t n, float *raw_out);

/* Hierarchical exact top-K (spec 7.3; CPU: dg_topk_hier with finite_only) of
 * the first n raw rows of the last pass, on the device: chunk maxima over
 * chunks of 64, the K best chunks, the K best elements inside them, ranked
 * by value with ties to the lower id. Only val/idx [n, K] (host) come back.
 * A NaN or infinity gives DG_ERR_NUMERIC (no message) with *bad_row (first
 * such row) and *bad_col (its first such column). */
dg_status dg_cuda_topk(dg_cuda_ctx *c, int32_t n, int32_t K, float *val, int32_t *idx, int32_t *bad_row,
                       int32_t *bad_col);

/* Self-conditioning rows of the n active positions from the first n raw rows
 * of the last pass, written into the device rows c->soft[rows[r]] (the other
 * rows keep theirs) for the next pass with DG_SC_KEPT (spec 5, 7.3):
 *   DG_TURBO_SC_EXACT: z = softcap(raw)/T, P = cast(softmax(cast(z))) in
 *     bf16, soft = embed_scale * P . E  (as src/sample/turbo.c's exact mode);
 *   DG_TURBO_SC_TOPK: soft = embed_scale * sum_k p[r, k] E[idx_k], with p
 *     [n, K] (host) the K-way probabilities and idx the last dg_cuda_topk's
 *     ids. Any other mode: DG_ERR_INVALID_ARG. */
dg_status dg_cuda_turbo_sc(dg_cuda_ctx *c, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                           const float *p);

/* One canvas's dg_cuda_turbo_sc arguments (dg_cuda_turbo_sc_batch; dg_cuda_topk_batch's pre). */
typedef struct dg_cuda_screq {
  dg_turbo_sc mode;
  int32_t n;
  const int32_t *rows;
  float T;
  const float *p;
} dg_cuda_screq;
/* dg_cuda_topk of B canvases of one batched pass at once (issue 14): every canvas's rows in one launch
 * (k_topk_tab, up to DG_TB_TAB canvases a launch) on the work context's stream w, one synchronisation; n[b],
 * K[b], val[b], idx[b] canvas cs[b]'s arguments of dg_cuda_topk, its results the same; st[b] DG_OK, or
 * DG_ERR_NUMERIC (no message) with bad_row[b] and bad_col[b]. pre (NULL: none): canvas b's exact SC rows its step
 * may want (mode DG_TURBO_SC_EXACT, n <= n[b], T; cap the softcap), whose probabilities and product are made
 * ahead on the work stream while the host runs the steps; dg_cuda_turbo_sc_batch with the same n and T then only
 * scatters them (a pass in between forgets them). Profiling: the marks go to the first profiled canvas's record.
 * Returns DG_ERR_INVALID_ARG (any canvas's arguments, nothing run) or DG_ERR_BACKEND. */
dg_status dg_cuda_topk_batch(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, int32_t B, const int32_t *n, const int32_t *K,
                             float *const *val, int32_t *const *idx, int32_t *bad_row, int32_t *bad_col, dg_status *st,
                             const dg_cuda_screq *pre, float cap);
/* dg_cuda_turbo_sc of B canvases at once, on the work context's stream w (each canvas's stream then waits for
 * it): the exact mode's probabilities in one launch over the canvases (k_turbo_sc_probs_tab); the products
 * P . E per canvas (cuBLAS's choice at its rows: its own run's bits), or with DGEMMA_STACK_DENSE 1 / inv once
 * over all exact canvases' rows side by side in w's stacked P (inv: the batch-invariant algorithm, so each
 * canvas keeps the bits of its own run under the switch). Each canvas's rows are those of its own
 * dg_cuda_turbo_sc (under the same switch). Errors: as dg_cuda_turbo_sc's (nothing run for bad arguments). */
dg_status dg_cuda_turbo_sc_batch(dg_cuda_ctx *w, dg_cuda_ctx *const *cs, const dg_cuda_screq *q, int32_t B, float cap);
/* ---- stage timing (issue 12: `dgemma bench --profile`) -------------------- */
/* The stages of a pass, in the order they run. The interval between two
 * consecutive stage marks (cudaEvents on the context's stream) is charged to
 * the later mark's stage, so a stage's time includes the launch gaps inside
 * it; DG_CUDA_ST_HOST is the interval from the end of one call into the
 * backend to the start of the next (host work, transfers, launch latency). */
enum {
  DG_CUDA_ST_EMBED_NORM = 0, /* embedding, RMS norms, the residual kernel */
  DG_CUDA_ST_QKV,            /* q/k/v products, q/k norms, rope, K/V into the cache */
  DG_CUDA_ST_ATTN,           /* attention */
  DG_CUDA_ST_OPROJ,          /* o projection */
  DG_CUDA_ST_DENSE,          /* the dense GeGLU MLP */
  DG_CUDA_ST_ROUTER,         /* router logits (fp32), softmax, top-K */
  DG_CUDA_ST_GROUP,          /* grouping the (token, expert) pairs by expert */
  DG_CUDA_ST_EXPERTS,        /* the expert products */
  DG_CUDA_ST_COMBINE,        /* dense + experts combination, layer scalar */
  DG_CUDA_ST_HEAD,           /* final norm, LM head, softcap */
  DG_CUDA_ST_SC,             /* self-conditioning: probabilities, soft embedding, SC MLP */
  DG_CUDA_ST_STATS,          /* the sampler's per-position statistics and their copy back */
  DG_CUDA_ST_HOST,           /* between calls: host work and transfers */
  DG_CUDA_NSTAGES
};
/* Name of stage i ("?" out of range). */
const char *dg_cuda_stage_name(int i);
/* on = 1: start recording stage marks on c (resets the totals; allocates the
 * events); 0: stop and free them. Recording adds one cudaEventRecord per
 * stage (~12 per layer). Errors: DG_ERR_BACKEND, DG_ERR_OUT_OF_MEMORY. */
dg_status dg_cuda_profile(dg_cuda_ctx *c, int on);
/* The stacked passes (dg_cuda_compact_batch) that a profiled context led: it
 * was the first canvas of the stack whose profiling was on. Their stage marks
 * are recorded on the work context's stream, the interval before a stack's
 * first mark (from the previous stacked pass this context led) charged to
 * DG_CUDA_ST_HOST: between stacked passes, the canvases' own device work
 * (top-K, self-conditioning rows, repair forwards, commits) and the host's. */
#define DG_CUDA_EXPERT_BINS 1024
typedef struct dg_cuda_stack_prof {
  double ms[DG_CUDA_NSTAGES];
  int64_t marks;
  int64_t passes;   /* stacks run */
  int64_t canvases; /* canvases summed over them */
  int64_t rows;     /* forward-set rows summed over them */
  /* rows per expert in the stacks' MoE (the routing's moe.count, read back after every layer of every stack):
   * expert_rows[r] = (stack, layer, expert) triples with r rows (the last bin: r >= DG_CUDA_EXPERT_BINS - 1) */
  int64_t expert_rows[DG_CUDA_EXPERT_BINS];
  int64_t expert_rows_max;
} dg_cuda_stack_prof;
/* Synchronise, then ms[DG_CUDA_NSTAGES] = GPU milliseconds per stage since
 * profiling started (from cudaEventElapsedTime) of the passes on c's own
 * stream; *n_marks the marks taken; *stack (may be NULL) the stacked passes c
 * led (all zero if none). DG_ERR_INVALID_ARG if profiling is off. */
dg_status dg_cuda_profile_read(dg_cuda_ctx *c, double *ms, int64_t *n_marks, dg_cuda_stack_prof *stack);

/* ---- CUDA graphs (graph.cu; issue 12) -------------------------------------- */
/* What a context's graph cache did since the context was made. Unless
 * DGEMMA_GRAPHS=0 is in the environment when the context is made, the device work
 * of its decoder passes (dg_cuda_decode, dg_cuda_decode_rows, dg_cuda_compact)
 * is captured once per key (pass kind, self-conditioning source, rows
 * forwarded, LM-head rows) and replayed while the canvas position stays; at a
 * new position the graph is captured again and updated in place. The encoder,
 * the step statistics and the stacked batches always launch plainly. */
typedef struct dg_cuda_graph_stats {
  int on;                 /* graphs in use on the context now (0 also after a fallback, and under the emulation) */
  int asked;              /* graphs asked for: not DGEMMA_GRAPHS=0 when the context was made */
  int cap;                /* graphs kept at most (DGEMMA_GRAPHS_MAX, default 32) */
  int cached;             /* keys in the cache now */
  int64_t plain;          /* passes run with plain launches (graphs off, profiling, a key's first use) */
  int64_t captures;       /* passes captured (each then launched as a graph) */
  int64_t instantiations; /* of those, instantiated anew (a new key, or an update the driver refused) */
  int64_t updates;        /* of those, written into the key's graph in place (cudaGraphExecUpdate) */
  int64_t replays;        /* passes that launched a kept graph as it was */
  int64_t evictions;      /* graphs dropped for the cap (least recently used first) */
  int64_t fallbacks;      /* errors that ended graphs for the context (at most 1) */
  char why[256];          /* the fallback's reason ("" if none) */
} dg_cuda_graph_stats;

/* *out = the graph counters of c (all zero and on = 0 when graphs were not
 * asked for). Errors: DG_ERR_INVALID_ARG (NULL argument). */
dg_status dg_cuda_graph_stats_get(const dg_cuda_ctx *c, dg_cuda_graph_stats *out);

/* ---- the context's kernel choices (context.cu) ------------------------------ */
/* One line into buf (n bytes, truncated to fit) naming the choices c made once when it was made: the passes'
 * attention versions at head dims <= 256 and above and why (src/cuda/attention.cu k_attention_choose: 15, the
 * wgmma kernel, where the device runs this build's sm_90a code, else 6; DGEMMA_ATTN). `dgemma bench` prints it.
 * Errors: DG_ERR_INVALID_ARG (NULL argument, n 0). */
dg_status dg_cuda_ctx_choices(const dg_cuda_ctx *c, char *buf, size_t n);

/* ---- ceilings and benchmarks (ceil.cu, bench.cu; `dgemma bench`) ---------- */

/* What device `device` reaches in this process, measured now (ceil.cu).
 * Every figure is the best of `reps` repetitions timed with cudaEvents (the
 * median is given too); the buffers hold random non-zero data. */
typedef struct dg_cuda_ceilings {
  char name[256];           /* device name (cudaDeviceProp.name) */
  int sms;                  /* multiprocessors */
  int reps;                 /* repetitions of each measurement */
  size_t read_bytes;        /* bytes the read kernel streams per repetition */
  size_t copy_bytes;        /* bytes of one cudaMemcpyAsync device-to-device (read, and as many written) */
  int gemm_n;               /* the GEMM's M = N = K */
  double read_bps, read_med_bps;     /* streaming read: bytes read per second (best, median) */
  double copy_bps, copy_med_bps;     /* D2D copy: bytes read + written per second (best, median) */
  double bf16_flops, bf16_med_flops; /* cuBLAS bf16 GEMM, fp32 accumulate: FLOP/s (2 per multiply-add) */
  uint32_t read_sum;        /* the read kernel's reduction: sum mod 2^32 of the buffer's uint32 words,
                               word i = dg_cuda_ceil_word(i) (checked by the tests) */
} dg_cuda_ceilings;

/* Word i of the read buffer of dg_cuda_ceilings_measure: a 64-bit mix of i
 * (splitmix64 finaliser), low 32 bits, with bit 0 set (never zero). */
#if defined(__CUDACC__) || defined(DG_CUDA_EMU)
#define DG_CUDA_HD __host__ __device__
#else
#define DG_CUDA_HD
#endif
static inline DG_CUDA_HD uint32_t dg_cuda_ceil_word(uint64_t i) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(z ^ (z >> 31)) | 1u;
}

/* Measure the ceilings of GPU `device` into *out:
 *   read: a grid-stride kernel over read_bytes (16-byte loads, 4 in flight
 *     per thread, per-block sums written out so nothing is optimised away);
 *     bytes read / time;
 *   copy: cudaMemcpyAsync device-to-device of copy_bytes; 2 copy_bytes / time;
 *   bf16: cublasGemmEx C = A B with A, B bf16 [gemm_n, gemm_n] (random values
 *     in +-[0.5, 1)), C fp32, CUBLAS_COMPUTE_32F; 2 gemm_n^3 / time.
 * 0 picks the default of a size: read_bytes 4 GiB, copy_bytes 2 GiB, gemm_n
 * 8192, reps 10 (one untimed run of each first). read_bytes and copy_bytes
 * are rounded down to a multiple of 16 (at least 16); gemm_n to a multiple
 * of 16 (at least 16). Device memory: max(read_bytes, copy_bytes) +
 * copy_bytes, then 8 gemm_n^2 bytes. Errors: DG_ERR_BACKEND (no GPU, a failing CUDA or
 * cuBLAS call, named), DG_ERR_OUT_OF_MEMORY (a buffer does not fit),
 * DG_ERR_INVALID_ARG (out NULL or a negative size). */
/* Device memory in use on GPU `device` now (total - free of cudaMemGetInfo: the CUDA context, the weights and
 * every context's buffers of this process, and any other process's) and its total, in bytes. Errors:
 * DG_ERR_BACKEND. */
dg_status dg_cuda_mem_used(int device, size_t *used, size_t *total);
dg_status dg_cuda_ceilings_measure(int device, int64_t read_bytes, int64_t copy_bytes, int gemm_n, int reps,
                                   dg_cuda_ceilings *out);

/* One timed configuration of the grouped expert product (bench.cu): a
 * stack of E experts as the forward pass holds them (gate_up [E*2*IE, H]:
 * per expert IE gate rows then IE up rows; down [E*H, IE]), bf16 (bits = 0)
 * or MLX affine (bits 2, 3, 4, 6 or 8, group 32, 64 or 128, bf16 scales and
 * biases), random weights generated on the device from `seed` (bf16: +-[2^-7,
 * 2^-6); quantized: random code words, scales +-[2^-10, 2^-9), biases
 * +-[2^-12, 2^-11)), random non-zero activations xe bf16 [T, H] in +-[0.5, 1),
 * and the routing idx [T, K] (host; expert ids in [0, E), K distinct ones per
 * token). The grouping (k_group) runs once; then `warmup` untimed and `reps`
 * timed calls of dg_cuda_experts (gate/up + GeGLU, down: the backend's real
 * expert path), each timed alone with cudaEvents, with flush_bytes (0: 256 MiB)
 * written to a scratch buffer before every call so that no weight is in
 * the L2 cache (H200: 60 MB). */
typedef struct dg_cuda_bench_experts_args {
  int bits, group;          /* 0 = bf16; else bits and group size of both stacks */
  int H, IE, E, K, T;       /* hidden, expert intermediate, experts, top-k, tokens */
  const int32_t *idx;       /* host [T, K] */
  int warmup, reps;         /* reps in [1, 10000] */
  int64_t flush_bytes;      /* 0: 256 MiB */
  uint64_t seed;
} dg_cuda_bench_experts_args;

typedef struct dg_cuda_bench_result {
  double med_ms, min_ms, max_ms; /* per call of dg_cuda_experts */
  int reps;
  size_t weight_bytes;      /* device bytes of both stacks (codes + scales + biases, or bf16) */
  double out_sum;           /* sum of the last call's outputs y (finite unless the kernels misbehave) */
} dg_cuda_bench_result;

/* Run the configuration *a on GPU `device` into *out (all device memory is
 * freed before returning). Errors: DG_ERR_INVALID_ARG (shapes: H and IE
 * multiples of 64 and of the group, bits or group outside the list, reps out
 * of range, an expert id out of range or repeated within a token),
 * DG_ERR_OUT_OF_MEMORY, DG_ERR_BACKEND (a failing CUDA call, named). */
dg_status dg_cuda_bench_experts(int device, const dg_cuda_bench_experts_args *a, dg_cuda_bench_result *out);

/* The entry points that tests and tools call directly, by pointer (the CUDA
 * table's `api`, src/backend/backend.h), so that they link in a CPU-only build. The
 * test-only entry points (one kernel on host data; a context's raw rows in
 * and self-conditioning rows out) are not here: they are in the test support
 * library (tests/support/cuda_entry.h). */
typedef struct dg_cuda_api {
  dg_status (*step_stats)(dg_cuda_ctx *c, float temperature, dg_proposal mode, uint64_t seed, int32_t block,
                          int32_t step, const float *uni, void *out, int32_t *bad_pos);
  dg_status (*compact)(dg_cuda_ctx *c, const int32_t *tok, const int32_t *pos, int32_t n, int32_t pos0,
                       dg_sc_source sc, const float *soft, const int32_t *head, int32_t nh, float *raw_out);
  dg_status (*topk)(dg_cuda_ctx *c, int32_t n, int32_t K, float *val, int32_t *idx, int32_t *bad_row,
                    int32_t *bad_col);
  dg_status (*turbo_sc)(dg_cuda_ctx *c, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                        const float *p);
  dg_status (*ceilings_measure)(int device, int64_t read_bytes, int64_t copy_bytes, int gemm_n, int reps,
                                dg_cuda_ceilings *out);
  dg_status (*bench_experts)(int device, const dg_cuda_bench_experts_args *a, dg_cuda_bench_result *out);
  dg_status (*mem_used)(int device, size_t *used, size_t *total);
  dg_status (*graph_stats)(const dg_cuda_ctx *c, dg_cuda_graph_stats *out);
  dg_status (*choices)(const dg_cuda_ctx *c, char *buf, size_t n);
} dg_cuda_api;

#ifdef __cplusplus
}
#endif
#endif
