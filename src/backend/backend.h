/* backend.h: the backend seam. One table of functions per backend (the CPU's,
 * src/backend/backend_cpu.c over forward.c; the CUDA one, src/backend/device.c over
 * src/cuda/backend.h), holding the operations the samplers need. The
 * samplers (generate.c, turbo.c) call only this table, through the model's
 * m->bk; which backend a model runs on is decided once, in dg_model_load
 * (dg_backend_for). The models: calm's single forward pointer per backend and
 * ggml's backend interface (a documented slot per operation, optional slots
 * NULL).
 *
 * Shapes use model.h's letters (C canvas, V vocab, H hidden, K top-K). Every
 * operation returns a dg_status with dg_last_error() naming what failed;
 * nothing aborts. A device backend reports its own failures as
 * DG_ERR_BACKEND (the call, the file and line, the device's message). */
#ifndef DG_BACKEND_H
#define DG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

struct dg_pos_stats;   /* rowstats.h */
struct dg_compact_seq; /* model.h */

/* Where the self-conditioning rows of a decoder pass come from (spec 5). */
typedef enum dg_sc_source {
  DG_SC_NONE = 0, /* the zero signal (the first step of a canvas) */
  DG_SC_KEPT = 1, /* the rows the backend kept from its last sc_from_z / sc_rows */
  DG_SC_HOST = 2, /* host rows soft [C, H] by canvas position, already scaled, given with the pass */
} dg_sc_source;

/* The host buffers the turbo engine holds for a backend's head rows (head_plan), so that the
 * sampler sizes them from the backend's answer instead of asking which backend it runs on. */
typedef struct dg_head_plan {
  int32_t hn_rows;         /* canvas rows of final-normed hidden states hn [hn_rows, H] the turbo passes leave on the
                              host (decode_rows / compact), 0: the head rows stay in the backend */
  int32_t R;               /* rows of the raw [R, V] scratch head_topk fills a chunk at a time, 0: none */
  size_t tk_size;          /* bytes of one thread's dg_topk_hier scratch (64-aligned), 0: none */
  int raw_on_row;          /* 1: head_topk hands on_row each row's raw logits (the host makes the SC rows from them);
                              0: the raw rows stay in the backend (sc_rows, head_raw) */
} dg_head_plan;

/* The top-K of the LM-head rows of the last turbo pass (head_topk). */
typedef struct dg_head_args {
  int32_t n, K;            /* head rows of the last pass (in their order), K <= V */
  const float *hn;         /* [n, H] the rows the pass left in hn (dg_head_plan.hn_rows > 0) */
  int32_t R;               /* raw rows per chunk (1..n; dg_head_plan.R) */
  float *raw;              /* [R, V] scratch for one chunk's raw logits (dg_head_plan.R > 0) */
  char *tk;                /* nt * tk_size bytes, one dg_topk_hier scratch per thread (dg_head_plan.tk_size) */
  size_t tk_size;
  int nt;                  /* threads for the per-row work and on_row */
  float *val;              /* [n, K] out: the K largest raw logits of each row, descending, ties to the lower id */
  int32_t *idx;            /* [n, K] out: their vocabulary ids */
  /* Called once per finite row a (in parallel, `thread` < nt) once its val/idx are written: raw_row is
   * its raw logits [V] in the scratch (raw_on_row; the caller may overwrite them) or NULL; last is 1
   * for the rows of the last chunk, whose raw rows stay in `raw` after the call returns. May be NULL. */
  void (*on_row)(void *user, int32_t a, float *raw_row, int last, int thread);
  void *user;
  int32_t bad_row, bad_col;/* out, DG_ERR_NUMERIC: the first row with a NaN or infinity, and its first such id */
  int32_t last0;           /* out: first row of the last chunk (raw_on_row), else -1 */
} dg_head_args;

/* One canvas's sc_rows arguments (sc_rows_batch). */
typedef struct dg_sc_req {
  dg_turbo_sc mode;
  int32_t n;
  const int32_t *rows;
  float cap, T;
  const float *p;
} dg_sc_req;

typedef struct dg_backend {
  const char *name; /* "cpu", "cuda" */
  dg_device device; /* the device kind it runs on (dg_model_info.device) */
  /* The canvases whose whole forward sets a batch's work context holds at once (compact_batch's stacks:
   * stack_canvases x canvas rows); 0: one pass of max(canvas, encoder chunk) rows (the CPU: its activations
   * bounded whatever the batch, issue 16). */
  int32_t stack_canvases;

  /* ---- model and context ---- */
  /* Make m usable on this backend's device `device` (CUDA: upload every weight; m->dev).
   * Errors: DG_ERR_BACKEND, DG_ERR_OUT_OF_MEMORY, DG_ERR_UNSUPPORTED_MODEL. */
  dg_status (*model_init)(dg_model *m, int device);
  void (*model_free)(dg_model *m);
  size_t (*model_bytes)(const dg_model *m); /* device bytes of the weights (0 on the CPU) */
  /* Buffers of ctx (ctx->m, ctx->cap set): the KV cache of cap positions and the work buffers of
   * passes of up to max(C, encoder chunk, rows) rows. Errors: DG_ERR_OUT_OF_MEMORY (bytes or
   * positions named), DG_ERR_BACKEND. ctx_free frees what ctx_init made (also after its failure). */
  dg_status (*ctx_init)(dg_context *ctx, int32_t rows);
  void (*ctx_free)(dg_context *ctx);
  /* Whether the cache of ctx can be rolled back to len positions (dg_context_truncate, before it sets the
   * length): DG_OK, or DG_ERR_CONTEXT_FULL naming what a ring cache has overwritten. */
  dg_status (*truncate_check)(const dg_context *ctx, int32_t len);
  /* dg_context_copy_prefix after its checks (same model, n <= src->len and dst->cap, src's positions
   * 0..n-1 intact): the K/V of positions 0..n-1 from src into dst, bit for bit; the caller sets dst->len.
   * Optional: NULL = the backend cannot (dg_context_copy_prefix answers DG_ERR_BACKEND). */
  dg_status (*ctx_copy)(dg_context *dst, const dg_context *src, int32_t n);
  /* The per-layer canvas K/V buffers of the compacted pass (spec 7.4); idempotent. */
  dg_status (*compact_prepare)(dg_context *ctx);

  /* ---- passes ---- */
  /* Prefill / commit: encoder pass (spec 4.5) over ids[n] (valid ids) at positions ctx->len..,
   * appending their K/V; ctx->len += n. The caller checked the capacity. */
  dg_status (*encode)(dg_context *ctx, const int32_t *ids, int32_t n);
  /* dg_decode: decoder pass over canvas[C] (valid ids) at positions ctx->len.., self-conditioning
   * from processed logits sc_logits [C, V] (NULL: none); softcapped logits_out [C, V]. */
  dg_status (*decode)(dg_context *ctx, const int32_t *canvas, const float *sc_logits, float *logits_out);
  /* One reference-sampler step (spec 6.1 steps 2-4): decoder pass over canvas[C] with the SC rows
   * `sc` (DG_SC_NONE or DG_SC_KEPT), z = logits / T, and per position the argmax, proposal
   * (prop; DG_PROPOSAL_SAMPLE draws Philox(seed, DG_RNG_PROPOSAL, block, step), the same numbers
   * as uni, which holds them; REPLAY_UNIFORM uses uni [C]), entropy and maximum probability into
   * ps [C]. z: [C, V] host scratch of step_z_floats(m) floats (NULL when 0), left holding z.
   * A non-finite logit: DG_ERR_NUMERIC without a message, *bad_pos its position. */
  dg_status (*step_stats)(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, float T, dg_proposal prop,
                          uint64_t seed, int32_t block, int32_t step, const float *uni, float *z,
                          struct dg_pos_stats *ps, int32_t *bad_pos);
  size_t (*step_z_floats)(const dg_model *m); /* C * V on the CPU (z comes back), 0 on a device */
  /* Self-conditioning rows (spec 5, 4.9) from the z of the last step_stats (z: that step's scratch),
   * kept for the next step_stats with DG_SC_KEPT. */
  dg_status (*sc_from_z)(dg_context *ctx, const float *z);
  /* Turbo plain pass (spec 7.3): decoder over canvas[C] with the SC rows `sc` (soft [C, H] for
   * DG_SC_HOST), LM head on the n canvas rows rows[]: raw [n, V] (no softcap) if raw != NULL; else
   * (head_plan hn_rows > 0) their final-normed hidden states hn [n, H], or the raw rows stay in
   * the backend for head_topk / sc_rows / head_raw. Errors: DG_ERR_INVALID_ARG (a row or id out
   * of range), DG_ERR_CONTEXT_FULL. */
  dg_status (*decode_rows)(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, const float *soft,
                           const int32_t *rows, int32_t n, float *raw, float *hn);
  /* Compacted active-set pass (spec 7.4; model.h dg_forward_compact) of one canvas q (q->soft with
   * DG_SC_HOST); head rows out as decode_rows (q->raw, q->hn). */
  dg_status (*compact)(const struct dg_compact_seq *q, dg_sc_source sc);
  /* B canvases' compacted passes as stacks of rows in the scratch of `work` (every canvas checked first, the
   * results of each equal its own compact; the SC rows: seqs[q].soft on the host, else seqs[q].sc). */
  dg_status (*compact_batch)(dg_context *work, const struct dg_compact_seq *seqs, int32_t B);

  /* ---- the turbo chain after a pass ---- */
  /* The host buffers head_topk and the passes' head rows need for top-K K with at most R raw rows
   * at a time (CPU: hn [C, H], raw [R, V], the top-K scratch, raw rows handed to on_row, so that
   * the LM head runs R rows at a time in the caller's scratch; a device: none, the head rows'
   * logits stay there and only [n, K] come back). */
  void (*head_plan)(const dg_model *m, int32_t K, int32_t R, dg_head_plan *out);
  /* Hierarchical exact top-K (spec 7.3; dg_topk_hier with finite_only) of the head rows of the
   * last pass: a->val, a->idx, a->on_row; DG_ERR_NUMERIC (no message) with a->bad_row/bad_col. */
  dg_status (*head_topk)(dg_context *ctx, dg_head_args *a);
  /* Self-conditioning rows of mode `mode` made and kept in the backend for the
   * next pass with DG_SC_KEPT: the n head rows of the last pass go to canvas rows rows[n]
   * (spec 5, 7.3; DG_TURBO_SC_EXACT from softcap(raw)/T, DG_TURBO_SC_TOPK from p [n, K], the
   * K-way probabilities of the last head_topk's ids). *kept = 0 (and nothing done) for a mode
   * it does not make (the CPU: every mode): the caller makes host rows (DG_SC_HOST). */
  dg_status (*sc_rows)(dg_context *ctx, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                       const float *p, int *kept);
  /* (optional, NULL: head_topk and sc_rows per canvas) head_topk and sc_rows of the B canvases of one batched
   * pass at once (issue 14: one launch for their rows, one synchronisation), work the batch's work context:
   * a[b] / r[b] canvas ctxs[b]'s arguments, each canvas's results those of its own call. head_topk_batch:
   * st[b] each canvas's status (DG_ERR_NUMERIC with a[b].bad_row / bad_col), the return an error that is no one
   * canvas's (st then undefined); on_row per canvas after every canvas's rows came back; pre (NULL: none) the
   * sc_rows arguments each canvas's step may want after it (n 0: none), which the backend may start on ahead
   * while the host runs the steps (sc_rows_batch then finishes them). sc_rows_batch: kept[b] as sc_rows's
   * *kept. */
  dg_status (*head_topk_batch)(dg_context *work, dg_context *const *ctxs, dg_head_args *a, const struct dg_sc_req *pre,
                                int32_t B, dg_status *st);
  dg_status (*sc_rows_batch)(dg_context *work, dg_context *const *ctxs, const struct dg_sc_req *r, int32_t B, int *kept);
  /* Copy the first n raw head rows of the last pass to raw [n, V] (where !raw_on_row; else
   * DG_ERR_INVALID_ARG: the rows went to on_row and are not kept). */
  dg_status (*head_raw)(dg_context *ctx, int32_t n, float *raw);
  /* The context's own host buffer [C, H] for the self-conditioning rows a sampler makes on the host
   * (DG_SC_HOST; the CPU: the rows its passes read), or NULL where the context keeps none on the host
   * (a device): the sampler then holds the buffer itself. */
  float *(*sc_host)(dg_context *ctx);

  /* ---- device and profiling ---- */
  /* One line describing device `index` into buf (dg_device_info). */
  dg_status (*info)(int index, char *buf, size_t n);
  /* (optional) dg_context_profile / dg_context_profile_read: stage timing of ctx's passes. */
  dg_status (*profile)(dg_context *ctx, int on);
  dg_status (*profile_read)(dg_context *ctx, dg_profile *out);
  /* The backend's own entry points for tests and benchmarks (CUDA: a dg_cuda_api,
   * src/cuda/backend.h), or NULL. */
  const void *api;
} dg_backend;

/* The CPU backend (always present). */
const dg_backend *dg_backend_cpu(void);

/* The backend of device kind dev. Errors: DG_ERR_BACKEND when this build has no such backend
 * (a CPU-only build asked for CUDA: the message says how to get one), DG_ERR_INVALID_ARG for an
 * unknown kind. */
dg_status dg_backend_for(dg_device dev, const dg_backend **out);

struct dg_cuda_api;
/* The CUDA backend's entry points for tests and tools (src/cuda/backend.h),
 * *out. Errors: those of dg_backend_for(DG_DEVICE_CUDA). */
dg_status dg_cuda_api_get(const struct dg_cuda_api **out);

#endif
