/* backend_cpu.c: the CPU backend's table (backend.h) over the CPU forward pass
 * (forward.c), the host buffers of a context (context.c), the sampler core's
 * per-position statistics (sampler.c) and the hierarchical top-K
 * (turbo_parts.c). Everything is on the host: the weights stay in the mmap'd
 * checkpoint, self-conditioning rows are ctx->soft, and the turbo head rows
 * come back as final-normed hidden states, which head_topk turns into raw
 * logits R rows at a time in the caller's scratch (turbo.c, "Memory"). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cpu/kernels.h"
#include "model/context.h"
#include "base/dg_error.h"
#include "model/model.h"
#include "model/rowstats.h"
#include "io/quant.h"
#include "io/safetensors.h"

/* fn over each of the model's matrices (the embedding, the self-conditioning MLP, 10 a layer), in order; stops at the
 * first status that is not DG_OK and returns it. */
static dg_status cpu_each_weight(dg_model *m, dg_status (*fn)(const dg_model *m, dg_weight *w)) {
  dg_weight *top[] = {&m->embed, &m->sc_gate, &m->sc_up, &m->sc_down};
  for (size_t j = 0; j < sizeof top / sizeof top[0]; j++) DG_TRY(fn(m, top[j]));
  for (int i = 0; m->layers && i < m->cfg.n_layers; i++) {
    dg_layer *l = &m->layers[i];
    dg_weight *lw[] = {&l->q, &l->k, &l->v, &l->o, &l->mlp_gate, &l->mlp_up, &l->mlp_down, &l->router,
                       &l->experts_gate_up, &l->experts_down};
    for (size_t j = 0; j < sizeof lw / sizeof lw[0]; j++) DG_TRY(fn(m, lw[j]));
  }
  return DG_OK;
}

/* The pack of one matrix where mode (a dg_cpu_pack_wanted value) takes it (cpu/pack.c: 2-, 4- and 8-bit), then its
 * MLX bytes leave the process's memory where they are the checkpoint's mapping (dg_st_drop_pages): with the pack, the
 * avx512lp kernels read nothing of them, and a later reader (the exact kernels' fallback when a product's scratch
 * cannot be allocated) faults them back in from the file. Expert stacks the loader concatenated from per-expert
 * tensors are its own memory and stay. */
static dg_status cpu_pack_one(const dg_model *m, dg_weight *w, int mode) {
  if (w == &m->embed || !w->data || !w->bits || !dg_cpu_pack_takes(w, mode)) return DG_OK; /* the embedding: below */
  if (dg_cpu_pack_set(w, mode)) /* the 4-row pack, or (mode IL) the interleaved one */
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "the avx512lp pack (DGEMMA_CPU_PACK): out of memory for a %lld x %lld matrix",
                     (long long)w->rows, (long long)w->cols);
  const size_t sb = (size_t)w->rows * (size_t)(w->cols / w->group_size) * dg_dtype_size(w->sb_dtype);
  (void)dg_st_drop_pages(m->st, w->data, (size_t)w->rows * (size_t)dg_quant_row_bytes(w->cols, w->bits));
  (void)dg_st_drop_pages(m->st, w->scales, sb);
  (void)dg_st_drop_pages(m->st, w->biases, sb);
  return DG_OK;
}
static dg_status cpu_pack_all(const dg_model *m, dg_weight *w) { return cpu_pack_one(m, w, DG_CPU_PACK_ALL); }
static dg_status cpu_pack_nat(const dg_model *m, dg_weight *w) { return cpu_pack_one(m, w, DG_CPU_PACK_NAT); }
static dg_status cpu_pack_il(const dg_model *m, dg_weight *w) { return cpu_pack_one(m, w, DG_CPU_PACK_IL); }
static dg_status cpu_unpack_one(const dg_model *m, dg_weight *w) {
  (void)m;
  free((void *)w->cpu_pack);
  w->cpu_pack = NULL;
  w->cpu_pack_il = 0;
  return DG_OK;
}

/* With the avx512lp kernels and DGEMMA_CPU_PACK=1 every 2-, 4- or 8-bit matrix but the embedding gets a pack
 * (cpu/pack.c) that all of avx512lp's tiles read instead of the MLX layout (the same bits; the matrix-vector products
 * read one stream per 4 rows instead of six), and its MLX pages are dropped, so the weights take about the memory
 * they take without the pack; "nat", only those dg_cpu_pack_nat takes (by format and row length: the transposed
 * layout at 8 dwords a group, e.g. the 26B's experts' gate/up but not their down); "il", the same matrices in the
 * interleaved layout of DG_CPU_IL_ROWS rows (cpu/pack.c: one forward stream a thread in the matrix-vector products);
 * 0, seq1 (the kernels' switch: cpu/kernels.h) or unset (DG_CPU_PACK_DEFAULT) none.
 * The embedding is not packed: its row lookups and the soft embedding's transposed product (exact kernels) read the
 * MLX layout, so a pack would double it. */
static dg_status cpu_model_init(dg_model *m, int device) {
  (void)device;
  char why[256];
  const int want = dg_cpu_pack_wanted(why, sizeof why);
  if (want < 0) return dg_seterr(DG_ERR_INVALID_ARG, "%s", why);
  if (want == DG_CPU_PACK_NONE || want == DG_CPU_PACK_SEQ1 || strcmp(m->kern->name, "avx512lp")) return DG_OK;
  return cpu_each_weight(m, want == DG_CPU_PACK_ALL   ? cpu_pack_all
                            : want == DG_CPU_PACK_NAT ? cpu_pack_nat
                                                      : cpu_pack_il);
}
static void cpu_model_free(dg_model *m) { (void)cpu_each_weight(m, cpu_unpack_one); }
static size_t cpu_model_bytes(const dg_model *m) { (void)m; return 0; }

static dg_status cpu_ctx_init(dg_context *ctx, int32_t rows) { return dg_context_alloc_host(ctx, rows); }
static void cpu_ctx_free(dg_context *ctx) { dg_context_free_host(ctx); }
static dg_status cpu_truncate_check(const dg_context *ctx, int32_t len) {
  (void)ctx; (void)len; /* every position has its own K/V row */
  return DG_OK;
}

/* The host rows of a self-conditioning source (DG_SC_KEPT: the context's rows). */
static const float *cpu_soft(dg_context *ctx, dg_sc_source sc, const float *soft) {
  return sc == DG_SC_NONE ? NULL : sc == DG_SC_KEPT ? ctx->soft : soft;
}

static dg_status cpu_step_stats(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, float T, dg_proposal prop,
                                uint64_t seed, int32_t block, int32_t step, const float *uni, float *z,
                                struct dg_pos_stats *ps, int32_t *bad_pos) {
  (void)seed; (void)block; (void)step; /* uni holds the draws */
  const dg_model *m = ctx->m;
  const int32_t C = m->cfg.canvas_length, V = m->cfg.vocab_size;
  DG_TRY(dg_forward_decode(ctx, canvas, cpu_soft(ctx, sc, NULL), z));
  int bad = -1;
#pragma omp parallel for num_threads(m->n_threads) schedule(static) reduction(max : bad)
  for (int32_t i = 0; i < C; i++) {
    float *zr = z + (size_t)i * V;
    for (int32_t v = 0; v < V; v++) zr[v] = zr[v] / T; /* in place: z = logits / T, row by row */
    if (dg_position_stats(zr, V, uni[i], (int)prop, &ps[i]) != DG_OK) bad = i;
  }
  *bad_pos = bad;
  return bad >= 0 ? DG_ERR_NUMERIC : DG_OK;
}

static size_t cpu_step_z_floats(const dg_model *m) { return (size_t)m->cfg.canvas_length * m->cfg.vocab_size; }

static dg_status cpu_sc_from_z(dg_context *ctx, const float *z) { return dg_soft_embedding(ctx, z, ctx->soft); }

static dg_status cpu_decode_rows(dg_context *ctx, const int32_t *canvas, dg_sc_source sc, const float *soft,
                                 const int32_t *rows, int32_t n, float *raw, float *hn) {
  return dg_cpu_decode_rows(ctx, canvas, cpu_soft(ctx, sc, soft), rows, n, raw, hn);
}

static dg_status cpu_compact(const dg_compact_seq *q, dg_sc_source sc) {
  dg_compact_seq one = *q;
  one.soft = cpu_soft(q->ctx, sc, q->soft);
  return dg_cpu_compact_batch(q->ctx, &one, 1);
}

/* The LM head R rows at a time into a->raw, each chunk's rows ranked before
 * the next chunk overwrites them (a row's logits do not depend on which rows
 * share its product: kernels.h). */
static dg_status cpu_head_topk(dg_context *ctx, dg_head_args *a) {
  const dg_model *m = ctx->m;
  const int32_t V = m->cfg.vocab_size, H = m->cfg.hidden_size, K = a->K, n = a->n;
  int32_t bad_row = -1, bad_col = -1;
  a->last0 = 0;
  for (int32_t c0 = 0; c0 < n; c0 += a->R) {
    const int32_t r = n - c0 < a->R ? n - c0 : a->R, last = c0 + r == n;
    dg_lm_head_rows(m, a->hn + (size_t)c0 * H, r, a->raw);
#pragma omp parallel for num_threads(a->nt) schedule(dynamic)
    for (int32_t i = c0; i < c0 + r; i++) {
      const int th = omp_get_thread_num();
      float *raw = a->raw + (size_t)(i - c0) * V;
      int32_t bad = -1;
      if (dg_topk_hier(raw, V, K, 1, a->val + (size_t)i * K, a->idx + (size_t)i * K, a->tk + (size_t)th * a->tk_size,
                       &bad) != DG_OK) {
#pragma omp critical(dg_cpu_head_bad)
        if (bad_row < 0 || i < bad_row) { bad_row = i; bad_col = bad; }
        continue;
      }
      if (a->on_row) a->on_row(a->user, i, raw, last, th);
    }
    if (bad_row >= 0) {
      a->bad_row = bad_row;
      a->bad_col = bad_col;
      return DG_ERR_NUMERIC;
    }
    a->last0 = c0;
  }
  return DG_OK;
}

/* The LM head runs here, R rows at a time in the caller's scratch: the passes leave the head rows'
 * hidden states [C, H], head_topk ranks each chunk's raw rows and hands them to on_row. */
static void cpu_head_plan(const dg_model *m, int32_t K, int32_t R, dg_head_plan *out) {
  out->hn_rows = m->cfg.canvas_length;
  out->R = R;
  out->tk_size = (dg_topk_scratch_size(m->cfg.vocab_size, K) + 63) & ~(size_t)63;
  out->raw_on_row = 1;
}

/* Self-conditioning rows are made on the host (turbo.c), in ctx->soft: none kept here. */
static dg_status cpu_sc_rows(dg_context *ctx, dg_turbo_sc mode, int32_t n, const int32_t *rows, float cap, float T,
                             const float *p, int *kept) {
  (void)ctx; (void)mode; (void)n; (void)rows; (void)cap; (void)T; (void)p;
  *kept = 0;
  return DG_OK;
}

/* head_topk hands the raw rows over while they are in the scratch: none are kept after it. */
static dg_status cpu_head_raw(dg_context *ctx, int32_t n, float *raw) {
  (void)ctx; (void)n; (void)raw;
  return dg_seterr(DG_ERR_INVALID_ARG, "the cpu backend keeps no raw logits for self-conditioning");
}

/* The host SC rows are the context's own (ctx->soft, what the passes read with DG_SC_KEPT too). */
static float *cpu_sc_host(dg_context *ctx) { return ctx->soft; }

static dg_status cpu_info(int index, char *buf, size_t n) {
  (void)index;
  snprintf(buf, n, "cpu, %s kernels", dg_kernels_best()->name);
  return DG_OK;
}

static const dg_backend cpu_backend = {
    .name = "cpu",
    .device = DG_DEVICE_CPU,
    .model_init = cpu_model_init,
    .model_free = cpu_model_free,
    .model_bytes = cpu_model_bytes,
    .ctx_init = cpu_ctx_init,
    .ctx_free = cpu_ctx_free,
    .truncate_check = cpu_truncate_check,
    .ctx_copy = dg_context_copy_host,
    .compact_prepare = dg_cpu_compact_buffers,
    .encode = dg_cpu_encode,
    .decode = dg_cpu_decode_logits,
    .step_stats = cpu_step_stats,
    .step_z_floats = cpu_step_z_floats,
    .sc_from_z = cpu_sc_from_z,
    .decode_rows = cpu_decode_rows,
    .compact = cpu_compact,
    .compact_batch = dg_cpu_compact_batch,
    .head_plan = cpu_head_plan,
    .head_topk = cpu_head_topk,
    .sc_rows = cpu_sc_rows,
    .head_raw = cpu_head_raw,
    .sc_host = cpu_sc_host,
    .info = cpu_info,
    .profile = NULL,
    .profile_read = NULL,
    .api = NULL,
};

const dg_backend *dg_backend_cpu(void) { return &cpu_backend; }
