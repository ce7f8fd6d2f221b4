/* turbo.c: the turbo engine (spec 7, after mlx-vlm PR #1384), opt-in through
 * dg_gen_params.turbo. Per canvas:
 *
 *   x = uniform random ids; committed = x; nothing frozen; SC rows = 0
 *   for step k = 0 .. N-1   (N = max_denoising_steps, capped by turbo_steps)
 *     active = positions not frozen (all when not monotone)
 *     raw logits of the active rows only (LM head on those rows, a few
 *       rows at a time: see "Memory" below)
 *     hierarchical exact top-K per row; softcap, /T, softmax, entropy on K
 *     accept: entropy-bound or confidence (two-stage); flush on the last
 *       allowed step; force the most confident position if none
 *     accepted -> canvas and committed, frozen (monotone); others renoised
 *     SC rows of the active positions from this step's distribution
 *     EOS tail-drop (monotone, on newly frozen positions)
 *   optional repair: one full-canvas forward, block = its argmax
 *   emit the committed tokens up to the first stop id; repeat guard
 *
 * Deviations from the reference (spec 7.5) are the write-up's: monotone
 * freezing, truncated entropy, the turbo temperature end point, emission of
 * committed tokens. One of ours: positions never committed when the steps run
 * out (no flush, no repair) emit the argmax of their last forward rather than
 * the noise left in the committed canvas.
 *
 * turbo_compact runs the compacted active-set decoder (spec 7.4,
 * dg_forward_compact): the forward set is the active positions plus those
 * frozen on the previous step; other frozen positions are served from the
 * per-layer canvas K/V with the K/V of their last forward (stale): on both
 * backends the KV cache's own canvas slots, positions [len, len + C) (the CPU
 * keeps separate rows only for a canvas past its cache's capacity, context.h
 * dg_context_canvas_kv).
 * turbo_bucket pads the forward set and the LM-head rows up to a shape bucket
 * with duplicates of the last real entry; all bookkeeping uses real counts.
 *
 * dg_turbo_generate_batch (dg_generate_batch, generate.c) denoises B
 * canvases of different prompts (one context each) in one decoder pass per step: each sequence keeps its own schedule,
 * random streams and KV cache, and its outputs do not depend on B.
 *
 * The passes, the top-K and (where the backend makes them) the
 * self-conditioning rows are the model's backend's (m->bk, backend.h). On
 * CUDA the decoder pass (plain or compacted, the canvas slots of the device
 * KV cache serving as the canvas K/V buffers), the hierarchical top-K and the
 * exact / topk self-conditioning run on the device: per step the forward set
 * goes up and only the [n, K] top-K values and ids come back; the K-way
 * distribution, acceptance, schedule and guards run here on the host. The
 * adaptive self-conditioning mode brings the active rows' raw logits back
 * (head_raw) and runs on the host (its rows are then uploaded with the next
 * pass, DG_SC_HOST). A batch runs stacked passes (compact_batch: the CPU's
 * stacks in its activations, CUDA's in a work context of stack_canvases
 * canvases' rows on the device); a backend without one runs a pass per canvas.
 *
 * Memory (issue 16). On the CPU the decoder pass leaves the LM-head rows'
 * final-normed hidden states [n, H]; the tied LM head runs on R of them at a
 * time into one [R, V] scratch (R = turbo_head_rows, or as many rows as fit
 * TURBO_HEAD_BYTES), each chunk's top-K and K-way distribution (and, for the
 * exact and adaptive self-conditioning, its SC rows, staged until the step's
 * acceptance says they are needed) computed before the next chunk overwrites
 * it. The last chunk's SC rows wait for the acceptance, as a whole canvas
 * did before, so with R >= the active rows nothing is computed ahead. A row's
 * logits do not depend on which rows share its product (kernels.h), so the
 * tokens do not depend on R. Per canvas the engine then holds [C, K] and
 * [C, H] arrays only; the vocabulary-sized scratch ([R, V] logits, per-thread
 * top-K / SC rows, and the [C, H] rows staged ahead of the acceptance) is
 * one turbo_scratch per run or batch, shared by its sequences (their sampler
 * steps run one after another). The activations of the passes are shared
 * too: a CPU batch (dg_turbo_generate_batch, dg_batch) has one work context
 * whose activations (a pass of max(C, encoder chunk) rows) every sequence's
 * context uses while it is in the batch (dg_context_share_work: prefill,
 * commits and the stacked pass, which goes through them a chunk of canvases
 * at a time), so a canvas holds its KV cache, canvas K/V buffers, SC rows and
 * this [C, K] / [C, H] state only. On CUDA the logits stay on the device,
 * except in the adaptive SC mode (a [C, V] host copy).
 *
 * The array-level parts (top-K, K-way distribution, acceptance, guards,
 * buckets, approximate self-conditioning rows) are in turbo_parts.c; the
 * draws, stop rule and result filling are the sampler core's (sampler.c). */
#include "sample/turbo.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/switches.h"
#include "model/context.h"
#include "base/dg_error.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "model/softrow.h"

/* ------------------------------------------------------------------------ */
/* The engine                                                                */
/* ------------------------------------------------------------------------ */

/* Bytes of raw logits the CPU engine holds at once when turbo_head_rows is 0
 * (auto): R = this / (4 V) rows, at least 1, at most the canvas; 16 rows at
 * V = 262,144, a whole 256-canvas for V <= 16,384. */
#define TURBO_HEAD_BYTES ((size_t)16 << 20)

/* The vocabulary-sized scratch of one run or batch (module comment, "Memory"). */
typedef struct turbo_scratch {
  int32_t R;           /* rows of raw held (CPU) */
  float *raw;          /* [R, V] CPU: raw logits of one chunk of LM-head rows */
  char *tk;            /* [nt] x tk_size top-K scratch (CPU) */
  size_t tk_size;
  float *zrow;         /* [nt, V] processed logits for exact SC (CPU) */
  char *sc_work;       /* [nt] x sc_size (adaptive SC) */
  size_t sc_size;
  float *colsum;       /* [H] (adaptive SC) */
  float *stage;        /* [C, H] CPU, exact/adaptive SC: one step's rows computed ahead of the acceptance, by
                          position (written and read within one sequence's seq_after_forward) */
} turbo_scratch;

static void scratch_free(turbo_scratch *w) {
  free(w->raw); free(w->tk); free(w->zrow); free(w->sc_work); free(w->colsum); free(w->stage);
  memset(w, 0, sizeof *w);
}

/* Grow w to what a sequence of parameters p needs: the backend's head
 * buffers hp (R rows of logits, top-K scratch for K and the repair's 2), the
 * SC mode's rows. */
static dg_status scratch_reserve(turbo_scratch *w, const dg_model *m, const dg_gen_params *p, int32_t K,
                                 const dg_head_plan *hp) {
  const int32_t V = m->cfg.vocab_size, R = hp->R;
  const size_t nt = m->n_threads > 0 ? (size_t)m->n_threads : 1;
  const dg_turbo_sc sc = p->turbo.sc_mode;
  int ok = 1;
  if (R > w->R) {
    free(w->raw);
    w->raw = malloc((size_t)R * V * sizeof(float));
    w->R = w->raw ? R : 0;
    ok = ok && w->raw;
  }
  if (hp->tk_size > w->tk_size) {
    free(w->tk);
    w->tk = malloc(nt * hp->tk_size);
    w->tk_size = w->tk ? hp->tk_size : 0;
    ok = ok && w->tk;
  }
  /* the SC rows made here from the raw rows head_topk hands over (sc_row): exact mode's z rows, and
   * the rows of the chunks before the last, staged until the acceptance wants them */
  if (hp->raw_on_row && sc == DG_TURBO_SC_EXACT && !w->zrow) ok = ok && (w->zrow = malloc(nt * V * sizeof(float)));
  if (hp->raw_on_row && sc != DG_TURBO_SC_TOPK && !w->stage)
    ok = ok && (w->stage = malloc((size_t)m->cfg.canvas_length * m->cfg.hidden_size * sizeof(float)));
  if (sc == DG_TURBO_SC_ADAPTIVE && !w->sc_work) {
    w->sc_size = (dg_turbo_sc_work_size(V, K) + 63) & ~(size_t)63;
    ok = ok && (w->sc_work = malloc(nt * w->sc_size));
  }
  if (sc == DG_TURBO_SC_ADAPTIVE && !w->colsum) {
    ok = ok && (w->colsum = malloc((size_t)m->cfg.hidden_size * sizeof(float)));
    if (w->colsum) dg_embed_colsum(m, w->colsum);
  }
  if (!ok)
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the turbo sampler scratch (%d rows x vocab %d)", R, V);
  return DG_OK;
}

typedef struct turbo_state {
  int32_t C, V, K, H, nt;
  int32_t R;           /* LM-head rows per chunk (CPU) */
  int32_t lazy0;       /* CPU: the last chunk's first active row: its raw rows are still in w->raw (-1: none) */
  turbo_scratch *w;    /* the run's shared vocabulary-sized scratch */
  float *hn;           /* [C, H] CPU: final-normed hidden states of the LM-head rows, packed by active row */
  float *raw;          /* [C, V] device backends, adaptive SC only: the active rows' raw logits, packed */
  float *kp;           /* [C, K] K-way probabilities by canvas position */
  int32_t *kidx;       /* [C, K] their ids */
  float *kval;         /* [C, K] raw values */
  float *ent, *top1;   /* [C] by canvas position */
  int32_t *prop, *amax;/* [C] proposal / argmax by canvas position */
  int32_t *canvas, *committed, *noise, *active, *hist, *step_amax;
  int32_t *fpos, *ftok, *head; /* [C] forward set (positions, tokens) and LM-head rows (indices into it) */
  uint8_t *frozen, *dropped, *acc, *newly;
  float *uni;          /* [C] */
  uint32_t *bits;      /* [C] */
  void *acc_scratch;   /* 16 C bytes */
  float *soft;         /* [C, H] per-position SC rows on the host (the backend's sc_host, else soft_own) */
  float *soft_own;     /* soft when allocated here (a backend without sc_host rows) */
  float *pk;           /* [C, K] packed by active row: top-K values, then (sc_rows, topk) probabilities */
  int32_t *pidx;       /* [C, K] packed ids */
  float *rval;         /* [C, 2] repair forward: top-2 values */
  int32_t *ridx;       /* [C, 2] and ids */
  void *arena;         /* the one allocation all of the above point into (turbo_alloc) */
} turbo_state;

static void turbo_free(turbo_state *s) {
  free(s->arena);
  s->arena = NULL;
}

/* The state of one sequence in one allocation (a size table, context.h's dg_arena_alloc); own_soft:
 * the [C, H] SC rows too (where the backend has no sc_host rows). */
static dg_status turbo_alloc(turbo_state *s, const dg_model *m, const dg_gen_params *p, turbo_scratch *w,
                             int own_soft) {
  const int32_t C = m->cfg.canvas_length, V = m->cfg.vocab_size;
  const int32_t SH = p->stability_threshold > 0 ? p->stability_threshold : 1;
  s->C = C; s->V = V; s->H = m->cfg.hidden_size; s->nt = m->n_threads > 0 ? m->n_threads : 1;
  s->K = p->turbo.topk < V ? p->turbo.topk : V;
  const int64_t R = p->turbo.head_rows > 0 ? p->turbo.head_rows
                                           : (int64_t)(TURBO_HEAD_BYTES / ((size_t)V * sizeof(float)));
  s->R = R < 1 ? 1 : R < C ? (int32_t)R : C;
  s->w = w;
  dg_head_plan hp;
  m->bk->head_plan(m, s->K > 2 ? s->K : 2, s->R, &hp);
  DG_TRY(scratch_reserve(w, m, p, s->K, &hp));
  const size_t Cz = (size_t)C, CK = Cz * s->K, CH = Cz * s->H;
  /* raw rows kept in the backend come here (head_raw) only for the adaptive SC mode; rows handed to
   * on_row live in w->raw a chunk at a time; head rows may come back as hidden states hn */
  const size_t n_raw = !hp.raw_on_row && p->turbo.sc_mode == DG_TURBO_SC_ADAPTIVE ? Cz * V : 0,
               n_hn = (size_t)hp.hn_rows * s->H;
  const dg_arena_item it[] = {
      DG_ARENA_ITEM(s->raw, n_raw),     DG_ARENA_ITEM(s->hn, n_hn),
      DG_ARENA_ITEM(s->kp, CK),         DG_ARENA_ITEM(s->kidx, CK),
      DG_ARENA_ITEM(s->kval, CK),       DG_ARENA_ITEM(s->ent, Cz),
      DG_ARENA_ITEM(s->top1, Cz),       DG_ARENA_ITEM(s->prop, Cz),
      DG_ARENA_ITEM(s->amax, Cz),       DG_ARENA_ITEM(s->canvas, Cz),
      DG_ARENA_ITEM(s->committed, Cz),  DG_ARENA_ITEM(s->noise, Cz),
      DG_ARENA_ITEM(s->active, Cz),     DG_ARENA_ITEM(s->hist, (size_t)SH * Cz),
      DG_ARENA_ITEM(s->step_amax, Cz),  DG_ARENA_ITEM(s->fpos, Cz),
      DG_ARENA_ITEM(s->ftok, Cz),       DG_ARENA_ITEM(s->head, Cz),
      DG_ARENA_ITEM(s->newly, Cz),      DG_ARENA_ITEM(s->frozen, Cz),
      DG_ARENA_ITEM(s->dropped, Cz),    DG_ARENA_ITEM(s->acc, Cz),
      DG_ARENA_ITEM(s->uni, Cz),        DG_ARENA_ITEM(s->bits, Cz),
      {&s->acc_scratch, (Cz + 1) * 16}, DG_ARENA_ITEM(s->rval, Cz * 2),
      DG_ARENA_ITEM(s->ridx, Cz * 2),   DG_ARENA_ITEM(s->pk, CK),
      DG_ARENA_ITEM(s->pidx, CK),       DG_ARENA_ITEM(s->soft_own, own_soft ? CH : 0),
  };
  if (!(s->arena = dg_arena_alloc(it, sizeof it / sizeof it[0], NULL)))
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the turbo sampler state (canvas %d, top-K %d, hidden %d)",
                     C, s->K, s->H);
  if (!own_soft) s->soft_own = NULL;
  return DG_OK;
}

/* The self-conditioning row of canvas position i into dst [H] (spec 5, 7.5)
 * from its raw logits raw [V] (NULL in the topk mode, which needs only the
 * K-way distribution); thread th's scratch. The exact mode leaves raw
 * holding the probabilities (the row is consumed). */
static void sc_row(const turbo_state *s, const dg_model *m, const dg_gen_params *p, int32_t i, float *raw, float T,
                   int th, float *dst) {
  const int32_t V = s->V, K = s->K;
  const turbo_scratch *w = s->w;
  const dg_turbo_sc mode = p->turbo.sc_mode;
  if (mode == DG_TURBO_SC_EXACT) {
    /* z = softcap(raw) / T exactly as the reference path computes it, then spec 5 */
    const float cap = m->cfg.final_logit_softcapping;
    float *z = w->zrow + (size_t)th * V;
    for (int32_t v = 0; v < V; v++) z[v] = (cap > 0.0f ? tanhf(raw[v] / cap) * cap : raw[v]) / T;
    dg_soft_row(m, z, raw, dst);
  } else {
    dg_turbo_sc_row(m, mode, raw, T, s->kidx + (size_t)i * K, s->kp + (size_t)i * K, K, p->turbo.sc_tail_mass,
                    w->colsum, mode == DG_TURBO_SC_ADAPTIVE ? w->sc_work + (size_t)th * w->sc_size : NULL, dst, NULL,
                    NULL);
  }
}

/* K-way distribution, entropy and proposal of canvas position i from its top-K (kval, kidx). */
static void row_dist(turbo_state *s, const dg_model *m, const dg_gen_params *p, int32_t i, float T) {
  const int32_t K = s->K;
  dg_turbo_pos ps;
  dg_turbo_dist(s->kval + (size_t)i * K, s->kidx + (size_t)i * K, K, m->cfg.final_logit_softcapping, T, s->uni[i],
                p->proposal == DG_PROPOSAL_ARGMAX ? DG_PROPOSAL_ARGMAX : DG_PROPOSAL_SAMPLE, s->kp + (size_t)i * K,
                &ps);
  s->ent[i] = ps.entropy;
  s->top1[i] = ps.top1;
  s->prop[i] = ps.proposal;
  s->amax[i] = ps.argmax;
}

/* What head_topk's per-row callback needs (row_done). */
typedef struct turbo_row_ctx {
  turbo_state *s;
  const dg_model *m;
  const dg_gen_params *p;
  float T;
  int ahead; /* stage the exact / adaptive SC rows of every chunk but the last */
} turbo_row_ctx;

/* Head row a is ranked (s->pk / s->pidx): its top-K to canvas position
 * active[a], its distribution, and the SC row computed ahead while its raw
 * logits are in the scratch (head_plan raw_on_row). */
static void row_done(void *user, int32_t a, float *raw, int last, int th) {
  const turbo_row_ctx *rc = user;
  turbo_state *s = rc->s;
  const int32_t K = s->K, i = s->active[a];
  memcpy(s->kval + (size_t)i * K, s->pk + (size_t)a * K, (size_t)K * sizeof(float));
  memcpy(s->kidx + (size_t)i * K, s->pidx + (size_t)a * K, (size_t)K * sizeof(int32_t));
  row_dist(s, rc->m, rc->p, i, rc->T);
  if (rc->ahead && raw && !last) sc_row(s, rc->m, rc->p, i, raw, rc->T, th, s->w->stage + (size_t)i * s->H);
}

/* The turbo chain on the n active rows: top-K (the backend's head_topk),
 * distribution, proposal. On the CPU the LM head runs on s->R rows at a time
 * (module comment, "Memory"); when sc_ahead, the exact / adaptive SC rows of
 * every chunk but the last go to s->w->stage (turbo_sc takes them once the
 * acceptance wants them); the last chunk's raw rows stay in s->w->raw
 * (s->lazy0 = its first active row). Returns DG_ERR_NUMERIC naming block,
 * step and position on NaN/Inf (the first such position). */
static dg_head_args turbo_rows_args(turbo_state *s, turbo_row_ctx *rc, int32_t n) {
  const turbo_scratch *w = s->w;
  return (dg_head_args){n, s->K, s->hn, s->R, w->raw, w->tk, w->tk_size, s->nt, s->pk, s->pidx, row_done, rc, -1, -1, -1};
}

/* After head_topk (st its status, a its arguments): the last chunk's first row, the error naming block b, step k
 * and position on NaN/Inf. */
static dg_status turbo_rows_done(turbo_state *s, dg_status st, const dg_head_args *a, int32_t b, int32_t k, int32_t n) {
  s->lazy0 = a->last0;
  if (st == DG_ERR_NUMERIC)
    return dg_seterr(DG_ERR_NUMERIC, "non-finite logit (vocabulary id %d) at block %d, denoising step %d, canvas position %d",
                     a->bad_col, b, k, a->bad_row >= 0 && a->bad_row < n ? s->active[a->bad_row] : a->bad_row);
  return st;
}

static dg_status turbo_rows(turbo_state *s, const dg_model *m, dg_context *ctx, const dg_gen_params *p, int32_t b,
                            int32_t k, int32_t n, float T, int sc_ahead) {
  turbo_row_ctx rc = {s, m, p, T, sc_ahead && p->turbo.sc_mode != DG_TURBO_SC_TOPK}; /* topk SC needs no logits */
  dg_head_args a = turbo_rows_args(s, &rc, n);
  return turbo_rows_done(s, m->bk->head_topk(ctx, &a), &a, b, k, n);
}

/* Self-conditioning rows of the n active positions from this step (spec 5,
 * 7.5), after turbo_rows with sc_ahead set: made and kept by the backend
 * where it can (*src = DG_SC_KEPT), else here in s->soft (*src = DG_SC_HOST)
 * from the staged rows of the earlier chunks and the last chunk's raw rows
 * still in the scratch, or from the raw rows the backend hands back. */
/* The backend's sc_rows arguments of the n active positions (topk: the K-way probabilities packed by active row
 * into s->pk). */
static dg_sc_req turbo_sc_req(turbo_state *s, const dg_model *m, const dg_gen_params *p, int32_t n, float T) {
  const int32_t K = s->K;
  const dg_turbo_sc mode = p->turbo.sc_mode;
  if (mode == DG_TURBO_SC_TOPK) /* the K-way probabilities, packed by active row */
    for (int32_t a = 0; a < n; a++)
      memcpy(s->pk + (size_t)a * K, s->kp + (size_t)s->active[a] * K, (size_t)K * sizeof(float));
  return (dg_sc_req){mode, n, s->active, m->cfg.final_logit_softcapping, T, mode == DG_TURBO_SC_TOPK ? s->pk : NULL};
}

/* The rows a backend did not keep, here in s->soft (DG_SC_HOST). */
static dg_status turbo_sc_host(turbo_state *s, const dg_model *m, dg_context *ctx, const dg_gen_params *p, int32_t n,
                               float T) {
  const int32_t V = s->V, H = s->H;
  const dg_turbo_sc mode = p->turbo.sc_mode;
  const float *raw0 = s->raw; /* rows handed back by the backend, by active row from 0 */
  int32_t a0 = 0;
  if (mode != DG_TURBO_SC_TOPK && s->lazy0 >= 0) { /* the head ran here: staged rows, then the last chunk's */
    a0 = s->lazy0;
    raw0 = s->w->raw;
    for (int32_t a = 0; a < a0; a++)
      memcpy(s->soft + (size_t)s->active[a] * H, s->w->stage + (size_t)s->active[a] * H, (size_t)H * sizeof(float));
  } else if (mode != DG_TURBO_SC_TOPK) {
    DG_TRY(m->bk->head_raw(ctx, n, s->raw)); /* raw rows kept in the backend: here, from the raw rows */
  }
#pragma omp parallel for num_threads(s->nt) schedule(dynamic)
  for (int32_t a = a0; a < n; a++) {
    const int32_t i = s->active[a];
    float *raw = mode == DG_TURBO_SC_TOPK ? NULL : (float *)raw0 + (size_t)(a - a0) * V;
    sc_row(s, m, p, i, raw, T, omp_get_thread_num(), s->soft + (size_t)i * H);
  }
  return DG_OK;
}

/* Self-conditioning rows of the n active positions from this step (spec 5,
 * 7.5), after turbo_rows with sc_ahead set: made and kept by the backend
 * where it can (*src = DG_SC_KEPT), else here in s->soft (*src = DG_SC_HOST)
 * from the staged rows of the earlier chunks and the last chunk's raw rows
 * still in the scratch, or from the raw rows the backend hands back. */
static dg_status turbo_sc(turbo_state *s, const dg_model *m, dg_context *ctx, const dg_gen_params *p, int32_t n,
                          float T, dg_sc_source *src) {
  const dg_sc_req r = turbo_sc_req(s, m, p, n, T);
  int kept = 0;
  DG_TRY(m->bk->sc_rows(ctx, r.mode, n, r.rows, r.cap, T, r.p, &kept));
  if (kept) { *src = DG_SC_KEPT; return DG_OK; }
  *src = DG_SC_HOST;
  return turbo_sc_host(s, m, ctx, p, n, T);
}

/* One sequence (prompt) of the engine: its context, parameters, result and
 * the state of its current canvas. Sequences advance independently; a step
 * of every live sequence shares one decoder pass when batched. */
typedef struct turbo_seq {
  dg_context *ctx;
  const dg_gen_params *p;
  dg_gen_result *res;
  turbo_state s;
  dg_gen_tally t;          /* out [n_canvases, C], counts, finish reason, start time */
  dg_draws draws;          /* random canvases and uniforms (bits = s.bits) */
  dg_stop_rule stop;       /* the non-monotone stable-and-confident stop (hist = s.hist) */
  int32_t n_canvases, N, flush_step;
  int32_t b, k, steps;     /* canvas, step within it, forwards spent on it */
  int32_t emit, sc_any, eos_stop, in_block, block_over, done;
  dg_sc_source sc_src;     /* where the SC rows of the next pass are (with sc_any) */
  int32_t n_act, n_f, n_h, shape_f, shape_h;
  int32_t rg_last, rg_run;
  /* a batched pass's steps in phases (seqs_after_forward): the step's temperature, its head_topk callback's
   * context, and whether its SC rows are still to make */
  float T;
  turbo_row_ctx rc;
  int32_t sc_due;
} turbo_seq;

static void seq_free(turbo_seq *q) {
  turbo_free(&q->s);
  free(q->t.out);
}

static dg_status seq_init(turbo_seq *q, dg_context *ctx, const int32_t *prompt, size_t n_prompt,
                          const dg_gen_params *p, dg_gen_result *res, int need_buffers, turbo_scratch *w) {
  const dg_model *m = ctx->m;
  const dg_turbo_params *tp = &p->turbo;
  const int32_t C = m->cfg.canvas_length;
  memset(q, 0, sizeof *q);
  q->ctx = ctx;
  q->p = p;
  q->res = res;
  q->t.t0 = dg_now_s();
  q->rg_last = -1;
  q->t.why = DG_FINISH_LENGTH;
  if (p->replay_canvases || p->proposal == DG_PROPOSAL_REPLAY_UNIFORM)
    return dg_seterr(DG_ERR_INVALID_ARG, "the turbo engine does not replay injected canvases or uniforms");
  q->n_canvases = (int32_t)((p->max_new_tokens + (int64_t)C - 1) / C);
  q->N = tp->steps > 0 && tp->steps < p->max_denoising_steps ? tp->steps : p->max_denoising_steps;
  q->flush_step = tp->steps > 0 ? q->N - 1 : -1;
  float *sc_host = m->bk->sc_host(ctx); /* the context's host SC rows, or NULL: the sequence's own */
  DG_TRY(turbo_alloc(&q->s, m, p, w, !sc_host));
  q->draws = (dg_draws){p, 0, 0, C, m->cfg.vocab_size, q->s.bits};
  q->stop = (dg_stop_rule){q->s.hist, p->stability_threshold, C, p->confidence_threshold};
  q->t.out = malloc((size_t)q->n_canvases * C * sizeof(int32_t));
  if (!q->t.out) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for %d canvases", q->n_canvases);
  q->s.soft = sc_host ? sc_host : q->s.soft_own;
  if (tp->compact || need_buffers) DG_TRY(dg_compact_buffers(ctx)); /* CUDA: the cache's canvas slots */
  return dg_encode(ctx, prompt, n_prompt);
}

/* Start canvas q->b: commit the previous one, draw the random canvas. */
static dg_status seq_begin_block(turbo_seq *q) {
  turbo_state *s = &q->s;
  const int32_t C = s->C;
  if (C <= 0) return dg_seterr(DG_ERR_INVALID_ARG, "canvas length %d", C);
  if (q->b > 0) DG_TRY(dg_forward_encode(q->ctx, q->t.out + (size_t)(q->b - 1) * C, C)); /* commit */
  DG_TRY(dg_draw_canvas(&q->draws, q->b, 0, s->canvas));
  memcpy(s->committed, s->canvas, (size_t)C * sizeof(int32_t));
  memset(s->frozen, 0, (size_t)C);
  memset(s->dropped, 0, (size_t)C);
  memset(s->newly, 0, (size_t)C);
  memcpy(s->step_amax, s->canvas, (size_t)C * sizeof(int32_t));
  dg_stop_rule_reset(&q->stop);
  memset(s->soft, 0, (size_t)C * s->H * sizeof(float));
  q->sc_any = q->eos_stop = 0;
  q->sc_src = DG_SC_NONE;
  q->emit = C;
  q->steps = q->k = 0;
  q->in_block = 1;
  q->block_over = 0;
  return DG_OK;
}

/* Build the forward set and LM-head rows of the next step; 0 if the canvas is over. */
static int seq_prepare(turbo_seq *q, int batched) {
  turbo_state *s = &q->s;
  const dg_turbo_params *tp = &q->p->turbo;
  const int32_t C = s->C;
  if (q->k >= q->N) return 0;
  const int compact = tp->compact || batched; /* a batch always runs the compacted pass (F = all when not compact) */
  int32_t n_act = 0, n_f = 0, n_h = 0;
  for (int32_t i = 0; i < C; i++) {
    int act = !tp->monotone || !s->frozen[i];
    if (act) s->active[n_act++] = i;
    if (!compact || !tp->compact || act || s->newly[i]) {
      if (act) s->head[n_h++] = compact ? n_f : i;
      if (compact) { s->fpos[n_f] = i; s->ftok[n_f] = s->canvas[i]; }
      n_f++;
    }
  }
  if (n_act == 0) return 0;
  int32_t shape_f = n_f, shape_h = n_h;
  if (tp->bucket) { /* pad with duplicates of the last real entry (idempotent) */
    shape_h = dg_turbo_bucket(n_h, C);
    for (int32_t r = n_h; r < shape_h; r++) s->head[r] = s->head[n_h - 1];
    if (compact) {
      shape_f = dg_turbo_bucket(n_f, C);
      for (int32_t r = n_f; r < shape_f; r++) { s->fpos[r] = s->fpos[n_f - 1]; s->ftok[r] = s->ftok[n_f - 1]; }
    }
  }
  q->n_act = n_act;
  q->n_f = n_f;
  q->n_h = n_h;
  q->shape_f = shape_f;
  q->shape_h = shape_h;
  return 1;
}

/* The step's start after its forward: the counts, its temperature q->T and uniforms. */
static dg_status seq_pre(turbo_seq *q) {
  turbo_state *s = &q->s;
  q->steps++;
  q->t.n_forwarded += q->n_f;
  q->T = dg_turbo_temperature(q->p, q->k, q->N);
  return dg_draw_uniforms(&q->draws, q->b, q->k, s->uni);
}

/* Whether the step's SC rows may be computed ahead of the acceptance (only if this step can need them). */
static int seq_sc_ahead(const turbo_seq *q) { return q->k + 1 < q->N || q->p->turbo.repair; }

/* After the top-K (seq_pre, turbo_rows): acceptance, update, EOS, the step's notification; the SC rows now
 * (defer 0) or, where due, left to the caller (defer 1: q->sc_due, then turbo_sc and q->sc_any = 1); ends the
 * canvas if due. */
static dg_status seq_post(turbo_seq *q, int defer) {
  turbo_state *s = &q->s;
  const dg_gen_params *p = q->p;
  const dg_turbo_params *tp = &p->turbo;
  const dg_model *m = q->ctx->m;
  const int32_t C = s->C, k = q->k, b = q->b, n_act = q->n_act;
  const float T = q->T;
  const int flush = k == q->flush_step;
  int32_t n_acc = dg_turbo_accept_step(tp, p->entropy_bound, k, flush, s->active, n_act, s->ent, s->top1, s->acc,
                                       s->acc_scratch);
  if (p->on_turbo_trace) {
    dg_turbo_trace tr = {b, k, n_act, s->K, C, T, s->active, s->kval, s->kp, s->top1, s->ent, s->uni, s->kidx, s->prop,
                         s->acc};
    p->on_turbo_trace(&tr, p->user_data);
  }
  DG_TRY(dg_draw_canvas(&q->draws, b, k + 1, s->noise));
  int newly = 0;
  memset(s->newly, 0, (size_t)C);
  double ent_sum = 0.0;
  for (int32_t a = 0; a < n_act; a++) {
    int32_t i = s->active[a];
    s->step_amax[i] = s->amax[i];
    ent_sum += s->ent[i];
    if (s->acc[i]) {
      s->canvas[i] = s->committed[i] = s->prop[i];
      if (tp->monotone) { s->frozen[i] = 1; s->newly[i] = 1; newly = 1; }
    } else {
      s->canvas[i] = s->noise[i];
    }
  }
  const float mean_ent = (float)(ent_sum / n_act);
  int stop = 0;
  if (!tp->monotone) { /* the reference's stable-and-confident stop on top-K statistics (spec 7.5) */
    stop = dg_stop_rule_update(&q->stop, s->step_amax, mean_ent);
  } else if (tp->eos_early_stop && (newly || flush)) {
    int32_t e = dg_turbo_eos_tail(p, C, s->committed, s->frozen, s->dropped);
    if (e > 0) { q->emit = e; q->eos_stop = 1; }
  }
  dg_step_info si = {b, k, q->N - k, T, n_acc, mean_ent, stop || q->eos_stop, s->step_amax, s->canvas, C, n_act,
                     q->n_f, q->shape_f, q->shape_h};
  DG_TRY(dg_notify_step(p, &si));
  q->k++;
  if (stop || q->eos_stop) { q->block_over = 1; return DG_OK; }
  int more = q->k < q->N;
  if (tp->monotone) {
    int any = 0;
    for (int32_t i = 0; i < C; i++) any |= !s->frozen[i];
    more = more && any;
  }
  if ((more || tp->repair) && defer) q->sc_due = 1; /* self-conditioning rows for the next forward: the caller's */
  else if (more || tp->repair) {
    DG_TRY(turbo_sc(s, m, q->ctx, p, n_act, T, &q->sc_src));
    q->sc_any = 1;
  }
  if (!more) q->block_over = 1;
  return DG_OK;
}

/* Everything after the step's forward: sampler chain, acceptance, update, SC, EOS; ends the canvas if due. */
static dg_status seq_after_forward(turbo_seq *q) {
  DG_TRY(seq_pre(q));
  DG_TRY(turbo_rows(&q->s, q->ctx->m, q->ctx, q->p, q->b, q->k, q->n_act, q->T, seq_sc_ahead(q)));
  return seq_post(q, 0);
}

/* seq_after_forward of the n sequences qs[] of one batched pass (work: the batch's work context), st[i] each
 * one's status: where the backend has head_topk_batch and sc_rows_batch, in three phases: every sequence's
 * top-K in one backend call (with the SC rows each step may want, which the backend may start making while the
 * host runs the steps), every sequence's acceptance and update, every due SC row set in one call (issue 14:
 * one launch over the canvases instead of one per canvas); each sequence's results those of its own
 * seq_after_forward (its own logits, state and random stream; only the order of the sequences' host work across
 * the phases differs). Otherwise seq_after_forward one sequence after another. Returns DG_OK, or an error no
 * one sequence's (a backend call's), which is then every sequence's st too. */
static dg_status seqs_after_forward(dg_context *work, turbo_seq *const *qs, int32_t n, dg_status *st) {
  /* DGEMMA_TURBO_BATCH=0: one sequence after another as before session 27 (each canvas's top-K and SC rows on its
   * own stream; for comparison: the same tokens) */
  static int env = -1;
  if (env < 0) env = dg_sw_get(DG_SW_TURBO_BATCH) != 0;
  const dg_backend *bk = work ? work->m->bk : NULL;
  if (!env || !bk || !bk->head_topk_batch || !bk->sc_rows_batch || n < 2) {
    for (int32_t i = 0; i < n; i++) st[i] = seq_after_forward(qs[i]);
    return DG_OK;
  }
  dg_context **ctxs = malloc((size_t)n * sizeof *ctxs);
  dg_head_args *a = malloc((size_t)n * sizeof *a);
  dg_sc_req *r = malloc((size_t)n * sizeof *r), *pre = malloc((size_t)n * sizeof *pre);
  dg_status *sub = malloc((size_t)n * sizeof *sub);
  int32_t *ix = malloc((size_t)n * sizeof *ix), *kept = malloc((size_t)n * sizeof *kept);
  dg_status ret = ctxs && a && r && pre && sub && ix && kept ? DG_OK : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  int32_t m = 0;
  for (int32_t i = 0; i < n && !ret; i++) { /* phase 1: the top-K of every sequence's head rows */
    turbo_seq *q = qs[i];
    if ((st[i] = seq_pre(q))) continue;
    q->rc = (turbo_row_ctx){&q->s, q->ctx->m, q->p, q->T, seq_sc_ahead(q) && q->p->turbo.sc_mode != DG_TURBO_SC_TOPK};
    a[m] = turbo_rows_args(&q->s, &q->rc, q->n_act);
    /* the SC rows this step may want (seq_post makes them due only where seq_sc_ahead holds): a backend may start
     * on the exact ones while the host runs the steps */
    const int may = seq_sc_ahead(q) && q->p->turbo.sc_mode == DG_TURBO_SC_EXACT;
    pre[m] = (dg_sc_req){q->p->turbo.sc_mode, may ? q->n_act : 0, q->s.active, q->ctx->m->cfg.final_logit_softcapping,
                         q->T, NULL};
    ctxs[m] = q->ctx;
    ix[m++] = i;
  }
  if (!ret && m > 0) ret = bk->head_topk_batch(work, ctxs, a, pre, m, sub);
  int32_t ns = 0;
  for (int32_t j = 0; j < m && !ret; j++) { /* phase 2: acceptance and update, the SC rows left for phase 3 */
    turbo_seq *q = qs[ix[j]];
    st[ix[j]] = turbo_rows_done(&q->s, sub[j], &a[j], q->b, q->k, q->n_act);
    if (!st[ix[j]]) st[ix[j]] = seq_post(q, 1);
    if (!st[ix[j]] && q->sc_due) {
      r[ns] = turbo_sc_req(&q->s, q->ctx->m, q->p, q->n_act, q->T);
      ctxs[ns] = q->ctx;
      ix[ns++] = ix[j]; /* (ns <= j: an entry of ix not read again) */
    }
  }
  if (!ret && ns > 0) ret = bk->sc_rows_batch(work, ctxs, r, ns, kept);
  for (int32_t j = 0; j < ns && !ret; j++) { /* phase 3: where the backend did not keep them, the host's rows */
    turbo_seq *q = qs[ix[j]];
    q->sc_due = 0;
    q->sc_any = 1;
    q->sc_src = kept[j] ? DG_SC_KEPT : DG_SC_HOST;
    if (!kept[j]) st[ix[j]] = turbo_sc_host(&q->s, q->ctx->m, q->ctx, q->p, q->n_act, q->T);
  }
  if (ret)
    for (int32_t i = 0; i < n; i++) st[i] = ret;
  free(ctxs);
  free(a);
  free(r);
  free(pre);
  free(sub);
  free(ix);
  free(kept);
  return ret;
}

/* End of canvas: output tokens, optional repair forward, emission, repeat guard. */
static dg_status seq_end_block(turbo_seq *q) {
  turbo_state *s = &q->s;
  const dg_gen_params *p = q->p;
  const dg_turbo_params *tp = &p->turbo;
  const int32_t C = s->C, V = s->V, b = q->b;
  int32_t *blk = q->t.out + (size_t)b * C;
  if (!tp->monotone) memcpy(blk, s->step_amax, (size_t)C * sizeof(int32_t)); /* argmax of the last forward */
  else
    for (int32_t i = 0; i < C; i++) blk[i] = s->frozen[i] ? s->committed[i] : s->step_amax[i];
  if (tp->repair && !q->eos_stop) { /* one more full forward; block = its argmax (spec 7.5) */
    for (int32_t i = 0; i < C; i++) s->active[i] = i;
    q->steps++;
    q->t.n_forwarded += C;
    const int32_t K2 = V < 2 ? V : 2; /* the argmax and the runner-up (for the trace) */
    const dg_backend *bk = q->ctx->m->bk;
    DG_TRY(bk->decode_rows(q->ctx, blk, q->sc_any ? q->sc_src : DG_SC_NONE, s->soft, s->active, C, NULL, s->hn));
    const turbo_scratch *w = s->w; /* argmax = the top-1 of each row */
    dg_head_args a = {C, K2, s->hn, s->R, w->raw, w->tk, w->tk_size, s->nt, s->rval, s->ridx, NULL, NULL, -1, -1, -1};
    dg_status st = bk->head_topk(q->ctx, &a);
    if (st == DG_ERR_NUMERIC)
      return dg_seterr(DG_ERR_NUMERIC, "non-finite logit (vocabulary id %d) at block %d, repair forward (step %d), canvas position %d",
                       a.bad_col, b, q->steps - 1, a.bad_row);
    DG_TRY(st);
    for (int32_t i = 0; i < C; i++) blk[i] = s->ridx[(size_t)i * K2];
    if (p->on_turbo_trace) {
      dg_turbo_trace tr = {b, -1, C, K2, C, 0.0f, s->active, s->rval, NULL, NULL, NULL, NULL, s->ridx, NULL, NULL};
      p->on_turbo_trace(&tr, p->user_data);
    }
  }
  /* emission: up to and including the first stop id, then the repeat guard */
  const int32_t first_stop = dg_first_stop(p, blk, q->emit);
  int32_t n_valid = first_stop >= 0 ? first_stop + 1 : q->emit;
  if (first_stop >= 0) q->t.why = DG_FINISH_STOP;
  int32_t keep = dg_repeat_guard_feed(&q->rg_last, &q->rg_run, blk, n_valid, tp->repeat_guard);
  if (keep < n_valid) { n_valid = keep; q->t.why = DG_FINISH_REPETITION; }
  DG_TRY(dg_tally_block(&q->t, q->ctx->m, p, q->res, b, C, n_valid, q->steps));
  q->b++;
  if (q->t.why != DG_FINISH_LENGTH || q->b >= q->n_canvases) q->done = 1;
  return DG_OK;
}

static void seq_result(turbo_seq *q) { dg_tally_result(&q->t, q->p, q->res); }

/* Advance sequence q to its next pending forward (ending and starting
 * canvases as needed); sets q->done when it has finished. */
static dg_status seq_advance(turbo_seq *q, int batched) {
  while (!q->done) {
    if (!q->in_block) DG_TRY(seq_begin_block(q));
    if (!q->block_over && seq_prepare(q, batched)) return DG_OK;
    q->in_block = q->block_over = 0;
    DG_TRY(seq_end_block(q));
  }
  return DG_OK;
}

/* The arguments of q's next forward in a stacked (batched) or compacted CPU
 * pass: the LM-head rows' hidden states come back, not their logits. */
static dg_compact_seq seq_pass(turbo_seq *q) {
  turbo_state *s = &q->s;
  const dg_sc_source sc = q->sc_any ? q->sc_src : DG_SC_NONE; /* host rows in s->soft, or the backend's kept rows */
  return (dg_compact_seq){q->ctx, s->ftok, s->fpos, q->shape_f, sc == DG_SC_HOST ? s->soft : NULL, s->head,
                          q->shape_h, NULL, s->hn, sc, !q->p->turbo.compact /* F = all: seq_prepare */};
}

/* q's next forward on its own: the compacted or plain single-canvas pass
 * (the head rows stay in the backend, or come back as hidden states). */
static dg_status seq_forward(turbo_seq *q) {
  turbo_state *s = &q->s;
  const dg_backend *bk = q->ctx->m->bk;
  const dg_sc_source sc = q->sc_any ? q->sc_src : DG_SC_NONE;
  if (q->p->turbo.compact) {
    dg_compact_seq cs = seq_pass(q);
    return bk->compact(&cs, sc);
  }
  return bk->decode_rows(q->ctx, s->canvas, sc, s->soft, s->head, q->shape_h, NULL, s->hn);
}

/* The engine over B sequences; work = scratch context for the batched pass
 * (NULL when B == 1: the sequence's own context and the plain or compacted
 * single-canvas pass). */
static dg_status turbo_run(turbo_seq *qs, int32_t B, dg_context *work) {
  const int batched = work != NULL; /* one stacked pass per step, else the canvas's own pass */
  dg_compact_seq *cs = calloc((size_t)B, sizeof *cs);
  turbo_seq **live = calloc((size_t)B, sizeof *live);
  dg_status *sts = calloc((size_t)B, sizeof *sts);
  dg_status st = cs && live && sts ? DG_OK : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  for (; !st;) {
    int32_t n = 0;
    for (int32_t i = 0; i < B && !st; i++) {
      turbo_seq *q = &qs[i];
      if ((st = seq_advance(q, batched))) break;
      if (q->done) continue;
      live[n] = q;
      if (batched) cs[n++] = seq_pass(q);
      else { st = seq_forward(q); n++; }
    }
    if (st || n == 0) break;
    if (batched && (st = dg_forward_compact_batch(work, cs, n))) break;
    if ((st = seqs_after_forward(work, live, n, sts))) break;
    for (int32_t i = 0; i < n && !st; i++) st = sts[i];
  }
  free(cs);
  free(live);
  free(sts);
  return st;
}

dg_status dg_turbo_generate(dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                            dg_gen_result *res) {
  turbo_seq q;
  turbo_scratch w = {0};
  dg_status st = seq_init(&q, ctx, prompt, n_prompt, p, res, 0, &w);
  if (!st) st = turbo_run(&q, 1, NULL);
  if (!st) seq_result(&q);
  seq_free(&q);
  scratch_free(&w);
  return st;
}

/* The rows of a batch's work context for up to B canvases at once (dg_backend.stack_canvases; 0: the
 * backend's one-pass default). */
static int32_t stack_rows(const dg_model *m, int32_t B) {
  const int32_t k = m->bk->stack_canvases < B ? m->bk->stack_canvases : B;
  return k * m->cfg.canvas_length;
}

dg_status dg_turbo_generate_batch(dg_context *const *ctxs, int32_t B, const int32_t *const *prompts,
                                  const size_t *n_prompts, const dg_gen_params *params, dg_gen_result *results) {
  const dg_model *m = ctxs[0]->m;
  turbo_seq *qs = calloc((size_t)B, sizeof *qs);
  turbo_scratch w = {0}; /* one for the B sequences: their sampler steps run one after another */
  dg_context *work = NULL;
  if (!qs) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  dg_context_params wp = dg_context_default_params();
  wp.max_context = 1; /* activations only: no KV cache of its own */
  /* the one work context's activations serve every canvas's stacked passes (CPU: a pass of max(C, encoder
   * chunk) rows, prefill included, a chunk of canvases at a time, dg_cpu_compact_batch; CUDA: stack_rows of
   * rows on the device, dg_cuda_compact_batch) */
  dg_status st = B > 1 ? dg_context_new_rows(m, &wp, stack_rows(m, B), &work) : DG_OK;
  if (!st && work) st = dg_context_work(work);
  for (int32_t i = 0; i < B && !st && work; i++) dg_context_share_work(ctxs[i], work);
  int32_t inited = 0;
  for (int32_t i = 0; i < B && !st; i++) {
    st = seq_init(&qs[i], ctxs[i], prompts[i], n_prompts[i], &params[i], &results[i], B > 1, &w);
    inited = i + 1; /* a failed init may hold part of its state */
  }
  if (!st) st = turbo_run(qs, B, work);
  for (int32_t i = 0; i < B && !st; i++) seq_result(&qs[i]);
  if (st)
    for (int32_t i = 0; i < B; i++) dg_gen_result_free(&results[i]);
  for (int32_t i = 0; i < inited; i++) seq_free(&qs[i]);
  for (int32_t i = 0; i < B && work; i++) dg_context_share_work(ctxs[i], NULL);
  free(qs);
  scratch_free(&w);
  dg_context_free(work);
  return st;
}

/* ---- continuous batching: sequences that join and leave between steps ---- */

struct dg_batch {
  const dg_model *m;
  int32_t cap;          /* slots */
  dg_context *work;     /* the activations of every slot's stacked passes (CPU: max(C, encoder chunk) rows; a
                         * device backend: stack_rows of them on the device) */
  turbo_seq *qs;        /* [cap] */
  uint8_t *used;        /* [cap] the slot holds a live sequence */
  dg_compact_seq *cs;   /* [cap] */
  int32_t *order;       /* [cap] slots of the current pass */
  turbo_seq **live;     /* [cap] their sequences */
  dg_status *sts;       /* [cap] their statuses after the pass (seqs_after_forward) */
  turbo_scratch w;      /* the vocabulary-sized scratch of every slot */
};

dg_status dg_batch_new(const dg_model *m, int32_t max_canvases, dg_batch **out) {
  if (!m || !out || max_canvases < 1 || max_canvases > 4096)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_new: NULL argument or max_canvases = %d outside [1, 4096]",
                     max_canvases);
  *out = NULL;
  dg_batch *b = calloc(1, sizeof *b);
  if (!b) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  b->m = m;
  b->cap = max_canvases;
  b->qs = calloc((size_t)max_canvases, sizeof *b->qs);
  b->used = calloc((size_t)max_canvases, 1);
  b->cs = calloc((size_t)max_canvases, sizeof *b->cs);
  b->order = calloc((size_t)max_canvases, sizeof *b->order);
  b->live = calloc((size_t)max_canvases, sizeof *b->live);
  b->sts = calloc((size_t)max_canvases, sizeof *b->sts);
  dg_status st = b->qs && b->used && b->cs && b->order && b->live && b->sts ? DG_OK : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  if (!st) {
    dg_context_params wp = dg_context_default_params();
    wp.max_context = 1; /* activations only: no KV cache of its own */
    st = dg_context_new_rows(m, &wp, stack_rows(m, max_canvases), &b->work);
    if (!st) st = dg_context_work(b->work);
  }
  if (st) { dg_batch_free(b); return st; }
  *out = b;
  return DG_OK;
}

void dg_batch_free(dg_batch *b) {
  if (!b) return;
  for (int32_t i = 0; b->used && i < b->cap; i++)
    if (b->used[i]) dg_batch_cancel(b, i);
  dg_context_free(b->work);
  scratch_free(&b->w);
  free(b->qs); free(b->used); free(b->cs); free(b->order); free(b->live); free(b->sts);
  free(b);
}

int32_t dg_batch_live(const dg_batch *b) {
  int32_t n = 0;
  for (int32_t i = 0; b && i < b->cap; i++) n += b->used[i];
  return n;
}

void dg_batch_cancel(dg_batch *b, int32_t slot) {
  if (!b || slot < 0 || slot >= b->cap || !b->used[slot]) return;
  dg_gen_result *res = b->qs[slot].res;
  if (b->qs[slot].ctx) dg_context_share_work(b->qs[slot].ctx, NULL);
  seq_free(&b->qs[slot]);
  memset(&b->qs[slot], 0, sizeof b->qs[slot]);
  if (res) memset(res, 0, sizeof *res);
  b->used[slot] = 0;
}

dg_status dg_batch_add(dg_batch *b, dg_context *ctx, const int32_t *prompt, size_t n_prompt, const dg_gen_params *p,
                       dg_gen_result *result, int32_t *slot) {
  if (!b || !ctx || !prompt || !p || !result || !slot) return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: NULL argument");
  memset(result, 0, sizeof *result);
  *slot = -1;
  if (ctx->m != b->m) return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: the context belongs to another model");
  if (!p->turbo.enabled)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: the parameters do not enable diffusion_turbo (batching is a turbo technique)");
  if (n_prompt == 0) return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: empty prompt");
  int32_t free_slot = -1;
  for (int32_t i = 0; i < b->cap; i++) {
    if (b->used[i] && b->qs[i].ctx == ctx)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: the context is already in use by slot %d", i);
    if (!b->used[i] && free_slot < 0) free_slot = i;
  }
  if (free_slot < 0) return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_add: all %d slots are in use", b->cap);
  DG_TRY(dg_generate_check(ctx, n_prompt, p));
  turbo_seq *q = &b->qs[free_slot];
  dg_context_share_work(ctx, b->work); /* its prefill and passes in the batch's activations */
  dg_status st = seq_init(q, ctx, prompt, n_prompt, p, result, 1, &b->w);
  if (!st) st = seq_advance(q, 1);
  if (st) {
    dg_context_share_work(ctx, NULL);
    seq_free(q);
    memset(q, 0, sizeof *q);
    memset(result, 0, sizeof *result);
    return st;
  }
  b->used[free_slot] = 1;
  *slot = free_slot;
  return DG_OK;
}

/* End slot i: a finished sequence hands its result over, a failed one frees it. */
static void batch_end(dg_batch *b, int32_t i, dg_status st, int32_t *done, dg_status *done_st, int32_t *n_done) {
  turbo_seq *q = &b->qs[i];
  if (!st) seq_result(q);
  else dg_gen_result_free(q->res);
  dg_context_share_work(q->ctx, NULL);
  seq_free(q);
  memset(q, 0, sizeof *q);
  b->used[i] = 0;
  done[*n_done] = i;
  if (done_st) done_st[*n_done] = st;
  (*n_done)++;
}

dg_status dg_batch_step(dg_batch *b, int32_t *done, dg_status *done_status, int32_t *n_done) {
  if (!b || !done || !n_done) return dg_seterr(DG_ERR_INVALID_ARG, "dg_batch_step: NULL argument");
  *n_done = 0;
  int32_t n = 0;
  dg_status pass = DG_OK;
  for (int32_t i = 0; i < b->cap; i++) {
    if (!b->used[i]) continue;
    turbo_seq *q = &b->qs[i];
    if (q->done) { batch_end(b, i, DG_OK, done, done_status, n_done); continue; }
    b->cs[n] = seq_pass(q);
    b->order[n++] = i;
  }
  if (n > 0) pass = dg_forward_compact_batch(b->work, b->cs, n);
  for (int32_t j = 0; j < n && !pass; j++) b->live[j] = &b->qs[b->order[j]];
  if (n > 0 && !pass) (void)seqs_after_forward(b->work, b->live, n, b->sts); /* its error is every slot's sts too */
  for (int32_t j = 0; j < n; j++) {
    const int32_t i = b->order[j];
    turbo_seq *q = &b->qs[i];
    dg_status st = pass ? pass : b->sts[j];
    if (!st) st = seq_advance(q, 1);
    if (st || q->done) batch_end(b, i, st, done, done_status, n_done);
  }
  return pass;
}
