/* forward.c: the DiffusionGemma forward pass on the CPU (spec section 4).
 *
 *   encoder  causal over clean tokens, appends K/V to the cache      (4.5)
 *   decoder  bidirectional over the canvas, reads the cache only     (4.5, 4.8)
 *   layer    attention + dense GeGLU + 128-expert MoE, layer scalar  (4.4, 4.6)
 *   head     final norm, tied LM head, softcap                       (4.7)
 *   self-conditioning soft embedding                                 (5, 4.9)
 *
 * Activations are fp32 throughout; weights are widened by the kernels. The
 * reference's dtype casts that change results (embedding scale, the
 * self-conditioning logits and probabilities) are reproduced explicitly via
 * dg_round_act (spec 4.9). Matrix products go through m->kern (the scalar
 * oracle or a SIMD implementation); everything else here is plain C.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/dg_error.h"
#include "model/context.h"
#include "model/model.h"
#include "model/softrow.h"

#define ENC_CHUNK DG_ENC_CHUNK

/* ------------------------------------------------------------------------ */
/* Primitives (spec 4.1)                                                     */
/* ------------------------------------------------------------------------ */

/* y = x * (mean(x^2) + eps)^-1/2 [* w]; fp32 like the reference (sum in double). */
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
  float ms = (float)(ss / n) + eps;
  float r = powf(ms, -0.5f);
  if (w)
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
  else
    for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

static void rmsnorm_rows(float *y, const float *x, const float *w, int rows, int n, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int r = 0; r < rows; r++) rmsnorm(y + (size_t)r * n, x + (size_t)r * n, w, n, eps);
}

/* tanh-approximated GELU (gelu_pytorch_tanh). */
static inline float gelu_tanh(float a) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

static void matmul(const dg_model *m, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T,
                   const dg_weight *w, int64_t row0, int64_t N) {
  m->kern->matmul(y, ldy, x, ldx, T, w, row0, N, m->n_threads);
}

/* out[n, H] = down(gelu_tanh(gate(a)) * up(a)) for a of [n, H] (the GeGLU MLP of
 * the dense branch, spec 4.5, and of self-conditioning, spec 4.8); ctx->w->h1 and
 * ctx->w->h2 ([n, I]) are its scratch. */
static void geglu_mlp(dg_context *ctx, float *out, const float *a, int64_t n, const dg_weight *gate,
                      const dg_weight *up, const dg_weight *down) {
  const dg_model *m = ctx->m;
  const int H = m->cfg.hidden_size, I = m->cfg.intermediate_size;
  matmul(m, ctx->w->h1, I, a, H, n, gate, 0, I);
  matmul(m, ctx->w->h2, I, a, H, n, up, 0, I);
  const int64_t nI = n * I;
#pragma omp parallel for num_threads(m->n_threads) schedule(static)
  for (int64_t i = 0; i < nI; i++) ctx->w->h1[i] = gelu_tanh(ctx->w->h1[i]) * ctx->w->h2[i];
  matmul(m, out, H, ctx->w->h1, I, n, down, 0, H);
}

/* ctx->w->xb[n, H] = the self-conditioning MLP of the soft rows [n, H] (spec 4.8):
 * geglu_mlp(pre_norm(soft)), ctx->w->xa the normalised input; soft may be ctx->w->xb. */
static void sc_mlp(dg_context *ctx, const float *soft, int64_t n) {
  const dg_model *m = ctx->m;
  rmsnorm_rows(ctx->w->xa, soft, m->sc_pre_norm, (int)n, m->cfg.hidden_size, m->cfg.rms_norm_eps, m->n_threads);
  geglu_mlp(ctx, ctx->w->xb, ctx->w->xa, n, &m->sc_gate, &m->sc_up, &m->sc_down);
}

/* Rotate-half rope on one head vector (spec 4.3): pair i with i + D/2. */
static inline void rope_apply(float *x, const float *cs, const float *sn, int D) {
  int h = D / 2;
  for (int i = 0; i < h; i++) {
    float a = x[i], b = x[i + h];
    x[i] = a * cs[i] - b * sn[i];
    x[i + h] = b * cs[i] + a * sn[i];
  }
}

/* cos/sin tables for positions pos0..pos0+T-1: [T, D/2] (fp32 angle = inv_freq * pos). */
static void rope_tables(float *cs, float *sn, const float *inv_freq, int D, int32_t pos0, int T) {
  int h = D / 2;
  for (int t = 0; t < T; t++) {
    float p = (float)(pos0 + t);
    for (int i = 0; i < h; i++) {
      float ang = inv_freq[i] * p;
      cs[t * h + i] = cosf(ang);
      sn[t * h + i] = sinf(ang);
    }
  }
}

/* The same tables at scattered absolute positions pos[T] (spec 7.4); the
 * angle is computed exactly as rope_tables does for the same position. */
static void rope_tables_at(float *cs, float *sn, const float *inv_freq, int D, const int32_t *pos, int T) {
  int h = D / 2;
  for (int t = 0; t < T; t++) {
    float p = (float)pos[t];
    for (int i = 0; i < h; i++) {
      float ang = inv_freq[i] * p;
      cs[t * h + i] = cosf(ang);
      sn[t * h + i] = sinf(ang);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Attention (spec 4.4 step 3, masks of 4.5)                                 */
/* ------------------------------------------------------------------------ */

/* The cache positions [*lo, *hi) that canvas or prompt row t (at pos0 + t) attends to in the KV cache: causal
 * (chunk = 0) up to itself, or, with the canvas's own keys beside the cache (chunk = 1), everything before pos0;
 * a sliding layer (full = 0) only the last win positions of the query's window (spec 4.3). */
static inline void cache_range(int full, int chunk, int32_t pos0, int t, int32_t win, int32_t *lo, int32_t *hi) {
  if (!chunk) {
    *hi = pos0 + t + 1;
    *lo = full ? 0 : (*hi - win > 0 ? *hi - win : 0);
  } else {
    *hi = pos0;
    *lo = full ? 0 : (pos0 - (win - 1) > 0 ? pos0 - (win - 1) : 0);
  }
}

/* For T queries q [T, NH, D] at positions pos0.., attend over
 *   cache positions [lo(t), hi(t)) of layer li, and
 *   if ck != NULL, the n_ck chunk keys and values of the decoder canvas: key j of KV head g at
 *   ck + g * chs + j * crs (the pass's own [T, NKV, D]: chs = D, crs = NKV * D; the cache's canvas
 *   slots [NKV, S, D]: chs = S * D, crs = D; dg_context_canvas_kv), values likewise from cv.
 * Encoder (ck == NULL): hi(t) = pos0 + t + 1 (causal; the chunk is already in
 * the cache), lo(t) = 0 (full) or hi(t) - window (sliding).
 * Decoder: hi = pos0 (= L), lo = 0 (full) or max(0, L - (window - 1)).
 * Scale 1.0, no softcap, softmax in fp32. out: [T, NH, D]. */
static void attention(dg_context *ctx, int li, const float *q, int T, int32_t pos0, const float *ck,
                      const float *cv, size_t chs, size_t crs, int n_ck, float *out) {
  const dg_model *m = ctx->m;
  const dg_layer *l = &m->layers[li];
  const int NH = m->cfg.n_heads, NKV = l->n_kv, D = l->head_dim, G = NH / NKV;
  const int32_t S = ctx->cap, win = m->cfg.sliding_window;
  const float *kc = ctx->kv[li].k, *vc = ctx->kv[li].v;
  const size_t stride = (size_t)ctx->score_stride; /* DG_SCORE_FLOATS(S, max(C, encoder chunk)): the keys of a query are at most the cache and one canvas */
  if (m->kern->attn_block && D % 16 == 0 && D <= DG_ATTN_DMAX) {
    /* blocks of 16 queries of one KV head: query i of head g is (t, h) = (i / G, g * G + i % G) */
    const int nblk = (T * G + 15) / 16, ntb = NKV * nblk;
#pragma omp parallel for num_threads(ctx->n_score_threads) schedule(static)
    for (int task = 0; task < ntb; task++) {
      const int g = task / nblk, i0 = (task % nblk) * 16, nq = T * G - i0 < 16 ? T * G - i0 : 16;
      const float *qv[16];
      float *ov[16];
      int32_t lo[16], n1[16];
      for (int i = 0; i < nq; i++) {
        const int t = (i0 + i) / G, h = g * G + (i0 + i) % G;
        int32_t a, hi; /* the scalar loop's cache range [a, hi) */
        cache_range(l->is_full, ck != NULL, pos0, t, win, &a, &hi);
        qv[i] = q + ((size_t)t * NH + h) * D;
        ov[i] = out + ((size_t)t * NH + h) * D;
        lo[i] = a;
        n1[i] = hi - a;
      }
      m->kern->attn_block(nq, qv, ov, lo, n1, kc + (size_t)g * S * D, vc + (size_t)g * S * D, ck ? ck + (size_t)g * chs : NULL,
                          cv ? cv + (size_t)g * chs : NULL, (int64_t)crs, ck ? n_ck : 0, D,
                          ctx->scores + (size_t)omp_get_thread_num() * stride);
    }
    return;
  }
  const int ntask = NH * T;
#pragma omp parallel for num_threads(ctx->n_score_threads) schedule(static)
  for (int task = 0; task < ntask; task++) {
    int t = task / NH, h = task % NH, g = h / G;
    float *sc = ctx->scores + (size_t)omp_get_thread_num() * stride;
    const float *qv = q + ((size_t)t * NH + h) * D;
    int32_t lo, hi;
    cache_range(l->is_full, ck != NULL, pos0, t, win, &lo, &hi);
    int n1 = hi - lo, n2 = ck ? n_ck : 0;
    float mx = -FLT_MAX;
    for (int j = 0; j < n1; j++) {
      const float *kv = kc + ((size_t)g * S + (size_t)(lo + j)) * D;
      float s = 0.0f;
      for (int d = 0; d < D; d++) s += qv[d] * kv[d];
      sc[j] = s;
      if (s > mx) mx = s;
    }
    for (int j = 0; j < n2; j++) {
      const float *kv = ck + (size_t)g * chs + (size_t)j * crs;
      float s = 0.0f;
      for (int d = 0; d < D; d++) s += qv[d] * kv[d];
      sc[n1 + j] = s;
      if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int j = 0; j < n1 + n2; j++) {
      sc[j] = expf(sc[j] - mx);
      sum += sc[j];
    }
    float inv = 1.0f / sum;
    float *o = out + ((size_t)t * NH + h) * D;
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (int j = 0; j < n1; j++) {
      const float *vv = vc + ((size_t)g * S + (size_t)(lo + j)) * D;
      float p = sc[j] * inv;
      for (int d = 0; d < D; d++) o[d] += p * vv[d];
    }
    for (int j = 0; j < n2; j++) {
      const float *vv = cv + (size_t)g * chs + (size_t)j * crs;
      float p = sc[n1 + j] * inv;
      for (int d = 0; d < D; d++) o[d] += p * vv[d];
    }
  }
}

/* ------------------------------------------------------------------------ */
/* One transformer layer (spec 4.4)                                          */
/* ------------------------------------------------------------------------ */

/* q/k/v projections, norms and rope for T tokens at positions pos0.. (or, if
 * pos != NULL, at the scattered absolute positions pos[T]) into
 * ctx->w->q [T,NH,D], ctx->w->k / ctx->w->v [T,NKV,D]. */
static void qkv(dg_context *ctx, int li, int T, int32_t pos0, const int32_t *pos) {
  const dg_model *m = ctx->m;
  const dg_layer *l = &m->layers[li];
  const int H = m->cfg.hidden_size, NH = m->cfg.n_heads, NKV = l->n_kv, D = l->head_dim;
  const float eps = m->cfg.rms_norm_eps;
  float *a = ctx->w->xa;
  rmsnorm_rows(a, ctx->w->x, l->input_norm, T, H, eps, m->n_threads);
  matmul(m, ctx->w->q, NH * D, a, H, T, &l->q, 0, NH * D);
  matmul(m, ctx->w->k, NKV * D, a, H, T, &l->k, 0, NKV * D);
  if (l->v.data) matmul(m, ctx->w->v, NKV * D, a, H, T, &l->v, 0, NKV * D);
  else memcpy(ctx->w->v, ctx->w->k, (size_t)T * NKV * D * sizeof(float)); /* K = V, before k_norm and rope */
  /* tables once per pass and layer kind; a scattered pass is keyed by -2 - its serial number */
  const int32_t key = pos ? -2 - ctx->w->rope_scatter_id : pos0;
  if (ctx->w->rope_pos0 != key || ctx->w->rope_T != T || ctx->w->rope_full != l->is_full) {
    const float *inv = l->is_full ? m->inv_freq_full : m->inv_freq_sliding;
    if (pos) rope_tables_at(ctx->w->rope_cos, ctx->w->rope_sin, inv, D, pos, T);
    else rope_tables(ctx->w->rope_cos, ctx->w->rope_sin, inv, D, pos0, T);
    ctx->w->rope_pos0 = key;
    ctx->w->rope_T = T;
    ctx->w->rope_full = l->is_full;
  }
#pragma omp parallel for num_threads(m->n_threads) schedule(static)
  for (int t = 0; t < T; t++) {
    const float *cs = ctx->w->rope_cos + (size_t)t * (D / 2), *sn = ctx->w->rope_sin + (size_t)t * (D / 2);
    for (int h = 0; h < NH; h++) {
      float *qv = ctx->w->q + ((size_t)t * NH + h) * D;
      rmsnorm(qv, qv, l->q_norm, D, eps);
      rope_apply(qv, cs, sn, D);
    }
    for (int h = 0; h < NKV; h++) {
      float *kv = ctx->w->k + ((size_t)t * NKV + h) * D;
      rmsnorm(kv, kv, l->k_norm, D, eps);
      rope_apply(kv, cs, sn, D);
      float *vv = ctx->w->v + ((size_t)t * NKV + h) * D;
      rmsnorm(vv, vv, NULL, D, eps);
    }
  }
}

/* Dense GeGLU branch + MoE branch + combination, on r = ctx->w->x [T, H] (the
 * residual after attention). Writes ctx->w->x = (r + post_ff(m + g)) * scalar. */
static void ffn(dg_context *ctx, int li, int T, float layer_scalar) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const dg_layer *l = &m->layers[li];
  const int H = c->hidden_size, IE = c->moe_intermediate_size;
  const int E = c->n_experts, K = c->top_k_experts, nt = m->n_threads;
  const float eps = c->rms_norm_eps;
  float *r = ctx->w->x, *a = ctx->w->xa, *dense = ctx->w->xb;

  /* dense branch: post_ff1(down(gelu(gate(a)) * up(a))), a = pre_ff(r) */
  rmsnorm_rows(a, r, l->pre_ff_norm, T, H, eps, nt);
  geglu_mlp(ctx, dense, a, T, &l->mlp_gate, &l->mlp_up, &l->mlp_down);
  rmsnorm_rows(dense, dense, l->post_ff1_norm, T, H, eps, nt);

  /* router on the un-normalised residual (spec 4.6) */
  const float root = (float)pow((double)H, -0.5);
  for (int t = 0; t < T; t++) {
    float *u = a + (size_t)t * H;
    rmsnorm(u, r + (size_t)t * H, NULL, H, eps);
    for (int i = 0; i < H; i++) u[i] = (u[i] * l->router_scale[i]) * root;
  }
  matmul(m, ctx->w->router_logits, E, a, H, T, &l->router, 0, E);
  memset(ctx->w->exp_count, 0, (size_t)E * sizeof(int32_t));
  for (int t = 0; t < T; t++) {
    float *s = ctx->w->router_logits + (size_t)t * E;
    float mx = -FLT_MAX, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = s[e] > mx ? s[e] : mx;
    for (int e = 0; e < E; e++) { s[e] = expf(s[e] - mx); sum += s[e]; }
    for (int e = 0; e < E; e++) s[e] /= sum;
    int32_t *idx = ctx->w->topk_idx + (size_t)t * K;
    float *w = ctx->w->topk_w + (size_t)t * K, wsum = 0.0f;
    for (int k = 0; k < K; k++) { /* top-k by probability, ties to the lower expert id */
      int best = -1;
      for (int e = 0; e < E; e++) {
        int used = 0;
        for (int j = 0; j < k; j++) used |= idx[j] == e;
        if (!used && (best < 0 || s[e] > s[best])) best = e;
      }
      idx[k] = best;
      w[k] = s[best];
      wsum += s[best];
    }
    for (int k = 0; k < K; k++) {
      w[k] /= wsum;
      w[k] *= l->per_expert_scale[idx[k]];
      ctx->w->exp_count[idx[k]]++;
    }
  }
  /* group (token, slot) pairs by expert, tokens ascending within an expert */
  ctx->w->exp_start[0] = 0;
  for (int e = 0; e < E; e++) ctx->w->exp_start[e + 1] = ctx->w->exp_start[e] + ctx->w->exp_count[e];
  memset(ctx->w->exp_count, 0, (size_t)E * sizeof(int32_t));
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      int e = ctx->w->topk_idx[(size_t)t * K + k];
      ctx->w->exp_tokens[ctx->w->exp_start[e] + ctx->w->exp_count[e]++] = t * K + k;
    }
  /* experts read x̂ = pre_ff2(r) */
  float *xe = ctx->w->xa;
  rmsnorm_rows(xe, r, l->pre_ff2_norm, T, H, eps, nt);
  const int total = ctx->w->exp_start[E];
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < total; i++)
    memcpy(ctx->w->ebuf_in + (size_t)i * H, xe + (size_t)(ctx->w->exp_tokens[i] / K) * H, (size_t)H * sizeof(float));
  /* gathered expert products: one kernel call per matrix for all experts */
  const dg_kernels *kn = m->kern;
  kn->matmul_grouped(ctx->w->eh1, IE, ctx->w->ebuf_in, H, ctx->w->exp_start, E, &l->experts_gate_up, 2 * IE, 0, IE, nt);
  kn->matmul_grouped(ctx->w->eh2, IE, ctx->w->ebuf_in, H, ctx->w->exp_start, E, &l->experts_gate_up, 2 * IE, IE, IE, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < total * IE; i++) ctx->w->eh1[i] = gelu_tanh(ctx->w->eh1[i]) * ctx->w->eh2[i];
  kn->matmul_grouped(ctx->w->ebuf_out, H, ctx->w->eh1, IE, ctx->w->exp_start, E, &l->experts_down, H, 0, H, nt);
  /* combine in expert order per token (as the reference's index_add_) */
  float *gsum = ctx->w->xa; /* x̂ no longer needed */
  memset(gsum, 0, (size_t)T * H * sizeof(float));
  for (int e = 0; e < E; e++)
    for (int i = ctx->w->exp_start[e]; i < ctx->w->exp_start[e + 1]; i++) {
      int tk = ctx->w->exp_tokens[i], t = tk / K;
      float w = ctx->w->topk_w[tk];
      const float *y = ctx->w->ebuf_out + (size_t)i * H;
      float *o = gsum + (size_t)t * H;
      for (int j = 0; j < H; j++) o[j] += y[j] * w;
    }
  rmsnorm_rows(gsum, gsum, l->post_ff2_norm, T, H, eps, nt);
  /* x = (r + post_ff(dense + moe)) * layer_scalar */
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < T; t++) {
    float *d = dense + (size_t)t * H;
    const float *gg = gsum + (size_t)t * H;
    for (int j = 0; j < H; j++) d[j] = d[j] + gg[j];
    rmsnorm(d, d, l->post_ff_norm, H, eps);
    float *x = r + (size_t)t * H;
    for (int j = 0; j < H; j++) x[j] = (x[j] + d[j]) * layer_scalar;
  }
}

/* Attention output projection and residual: x += post_attn_norm(o(att)). */
static void attn_out(dg_context *ctx, int li, int T) {
  const dg_model *m = ctx->m;
  const dg_layer *l = &m->layers[li];
  const int H = m->cfg.hidden_size, NH = m->cfg.n_heads, D = l->head_dim;
  matmul(m, ctx->w->xb, H, ctx->w->att, NH * D, T, &l->o, 0, H);
  rmsnorm_rows(ctx->w->xb, ctx->w->xb, l->post_attn_norm, T, H, m->cfg.rms_norm_eps, m->n_threads);
  for (size_t i = 0; i < (size_t)T * H; i++) ctx->w->x[i] += ctx->w->xb[i];
}

/* x[T,H] = E[ids] * embed_scale; a quantized embedding dequantizes the rows
 * it looks up (spec 3.2), in fp32. */
static dg_status embed(dg_context *ctx, const int32_t *ids, int T) {
  const dg_model *m = ctx->m;
  const int H = m->cfg.hidden_size;
  for (int t = 0; t < T; t++) {
    if (ids[t] < 0 || ids[t] >= m->cfg.vocab_size)
      return dg_seterr(DG_ERR_INVALID_ARG, "token id %d at position %d is outside the vocabulary [0, %d)", ids[t], t,
                       m->cfg.vocab_size);
    float *xr = ctx->w->x + (size_t)t * H;
    dg_weight_row_f32(&m->embed, ids[t], xr);
    for (int j = 0; j < H; j++) xr[j] *= m->embed_scale;
  }
  return DG_OK;
}

/* ------------------------------------------------------------------------ */
/* Encoder and decoder passes                                                */
/* ------------------------------------------------------------------------ */

static dg_status encode_chunk(dg_context *ctx, const int32_t *ids, int T) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const int32_t pos0 = ctx->len;
  DG_TRY(embed(ctx, ids, T));
  for (int li = 0; li < c->n_layers; li++) {
    const dg_layer *l = &m->layers[li];
    const int NKV = l->n_kv, D = l->head_dim;
    qkv(ctx, li, T, pos0, NULL);
    /* append K/V to the cache: [NKV, S, D] */
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NKV; h++) {
        memcpy(ctx->kv[li].k + ((size_t)h * ctx->cap + pos0 + t) * D, ctx->w->k + ((size_t)t * NKV + h) * D,
               (size_t)D * sizeof(float));
        memcpy(ctx->kv[li].v + ((size_t)h * ctx->cap + pos0 + t) * D, ctx->w->v + ((size_t)t * NKV + h) * D,
               (size_t)D * sizeof(float));
      }
    /* The encoder's outputs are discarded: after the last layer's K/V nothing
     * is needed (spec 4.4, last paragraph). */
    if (li == c->n_layers - 1) break;
    attention(ctx, li, ctx->w->q, T, pos0, NULL, NULL, 0, 0, 0, ctx->w->att);
    attn_out(ctx, li, T);
    ffn(ctx, li, T, l->layer_scalar_enc);
  }
  ctx->len += T;
  return DG_OK;
}

dg_status dg_cpu_encode(dg_context *ctx, const int32_t *ids, int32_t n) {
  DG_TRY(dg_context_work(ctx));
  for (int32_t i = 0; i < n; i += ENC_CHUNK) {
    int T = n - i < ENC_CHUNK ? n - i : ENC_CHUNK;
    DG_TRY(encode_chunk(ctx, ids + i, T));
  }
  return DG_OK;
}

/* Embedding, self-conditioning and every decoder layer over canvas[C]; the
 * last hidden state is left in ctx->w->x [C, H]. */
static dg_status decode_layers(dg_context *ctx, const int32_t *canvas, const float *soft) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const int T = c->canvas_length, H = c->hidden_size, nt = m->n_threads;
  const int32_t pos0 = ctx->len;
  const float eps = c->rms_norm_eps;
  if ((int64_t)pos0 + T > c->max_position_embeddings)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "canvas positions %d..%d exceed max_position_embeddings %d", pos0,
                     pos0 + T - 1, c->max_position_embeddings);
  DG_TRY(embed(ctx, canvas, T));
  /* h0 = post_norm(e + down(gelu(gate(pre_norm(soft))) * up(pre_norm(soft)))) (spec 4.8, 5). A zero
   * signal contributes exactly zero (pre_norm(0) = 0, gelu(0) = 0), so the MLP is skipped. */
  if (soft) {
    sc_mlp(ctx, soft, T);
    for (size_t i = 0; i < (size_t)T * H; i++) ctx->w->x[i] += ctx->w->xb[i];
  }
  rmsnorm_rows(ctx->w->x, ctx->w->x, NULL, T, H, eps, nt);
  for (int li = 0; li < c->n_layers; li++) {
    qkv(ctx, li, T, pos0, NULL);
    const size_t D = (size_t)m->layers[li].head_dim;
    attention(ctx, li, ctx->w->q, T, pos0, ctx->w->k, ctx->w->v, D, (size_t)m->layers[li].n_kv * D, T, ctx->w->att);
    attn_out(ctx, li, T);
    ffn(ctx, li, T, m->layers[li].layer_scalar_dec);
  }
  return DG_OK;
}

dg_status dg_forward_decode(dg_context *ctx, const int32_t *canvas, const float *soft, float *logits) {
  const dg_model *m = ctx->m;
  const dg_config *c = &m->cfg;
  const int T = c->canvas_length, H = c->hidden_size, nt = m->n_threads;
  DG_TRY(dg_context_work(ctx));
  DG_TRY(decode_layers(ctx, canvas, soft));
  /* final norm, tied LM head, softcap (spec 4.7) */
  rmsnorm_rows(ctx->w->xa, ctx->w->x, m->final_norm, T, H, c->rms_norm_eps, nt);
  matmul(m, logits, c->vocab_size, ctx->w->xa, H, T, &m->embed, 0, c->vocab_size);
  const float cap = c->final_logit_softcapping;
  if (cap > 0.0f) {
    size_t n = (size_t)T * c->vocab_size;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) logits[i] = tanhf(logits[i] / cap) * cap;
  }
  return DG_OK;
}

/* The final norm of the n rows `rows` of the hidden state hid [*, H]: out [n, H]. */
static void head_rows_norm(const dg_model *m, const float *hid, const int32_t *rows, int32_t n, float *out) {
  const int H = m->cfg.hidden_size;
  for (int32_t r = 0; r < n; r++)
    rmsnorm(out + (size_t)r * H, hid + (size_t)rows[r] * H, m->final_norm, H, m->cfg.rms_norm_eps);
}

void dg_lm_head_rows(const dg_model *m, const float *hn, int32_t n, float *raw) {
  if (n > 0) matmul(m, raw, m->cfg.vocab_size, hn, m->cfg.hidden_size, n, &m->embed, 0, m->cfg.vocab_size);
}

/* LM head (final norm + tied embedding, no softcap) for the n rows `rows` of
 * the hidden state hid [*, H]: raw [n, V]; or, when raw is NULL, only the
 * final norm: hn [n, H] (dg_lm_head_rows turns them into raw rows later). */
static void head_rows_raw(dg_context *ctx, const float *hid, const int32_t *rows, int32_t n, float *raw, float *hn) {
  if (!raw) {
    head_rows_norm(ctx->m, hid, rows, n, hn);
    return;
  }
  head_rows_norm(ctx->m, hid, rows, n, ctx->w->xa);
  dg_lm_head_rows(ctx->m, ctx->w->xa, n, raw);
}

dg_status dg_cpu_decode_rows(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                             int32_t n_rows, float *raw, float *hn) {
  const int C = ctx->m->cfg.canvas_length;
  for (int32_t r = 0; r < n_rows; r++)
    if (rows[r] < 0 || rows[r] >= C)
      return dg_seterr(DG_ERR_INVALID_ARG, "decoder head row %d is outside the canvas [0, %d)", rows[r], C);
  DG_TRY(dg_context_work(ctx));
  DG_TRY(decode_layers(ctx, canvas, soft));
  if (n_rows > 0) head_rows_raw(ctx, ctx->w->x, rows, n_rows, raw, hn);
  return DG_OK;
}

dg_status dg_forward_decode_hidden(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                                   int32_t n_rows, float *hn) {
  if (!ctx->kv) return dg_seterr(DG_ERR_INVALID_ARG, "dg_forward_decode_hidden is CPU code: use a CPU context");
  return dg_cpu_decode_rows(ctx, canvas, soft, rows, n_rows, NULL, hn);
}

dg_status dg_cpu_compact_buffers(dg_context *ctx) { return dg_context_compact_buffers(ctx); }

/* Checks of the compacted pass's sizes and positions (dg_compact_seq_check). */
static dg_status compact_args(dg_context *ctx, const int32_t *pos, int32_t n, const int32_t *head, int32_t nh) {
  const int C = ctx->m->cfg.canvas_length;
  if (n < 1 || n > C || nh < 0 || nh > C)
    return dg_seterr(DG_ERR_INVALID_ARG, "compacted decoder pass: forward set %d / head rows %d outside [1, %d]", n, nh, C);
  for (int32_t t = 0; t < n; t++)
    if (pos[t] < 0 || pos[t] >= C)
      return dg_seterr(DG_ERR_INVALID_ARG, "compacted decoder pass: position %d outside the canvas [0, %d)", pos[t], C);
  for (int32_t r = 0; r < nh; r++)
    if (head[r] < 0 || head[r] >= n)
      return dg_seterr(DG_ERR_INVALID_ARG, "compacted decoder pass: head row %d outside the forward set [0, %d)", head[r], n);
  if ((int64_t)ctx->len + C > ctx->m->cfg.max_position_embeddings)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "canvas positions %d..%d exceed max_position_embeddings %d", ctx->len,
                     ctx->len + C - 1, ctx->m->cfg.max_position_embeddings);
  return DG_OK;
}

/* Decoder input of the forward set: E[tok]*scale + SC MLP(soft rows of pos), post_norm (spec 4.8). */
static dg_status compact_input(dg_context *ctx, const int32_t *tok, const int32_t *pos, int32_t n, const float *soft) {
  const dg_model *m = ctx->m;
  const int H = m->cfg.hidden_size, nt = m->n_threads;
  const float eps = m->cfg.rms_norm_eps;
  DG_TRY(embed(ctx, tok, n));
  if (soft) {
    for (int32_t t = 0; t < n; t++) memcpy(ctx->w->xb + (size_t)t * H, soft + (size_t)pos[t] * H, (size_t)H * sizeof(float));
    sc_mlp(ctx, ctx->w->xb, n);
    for (size_t i = 0; i < (size_t)n * H; i++) ctx->w->x[i] += ctx->w->xb[i];
  }
  rmsnorm_rows(ctx->w->x, ctx->w->x, NULL, n, H, eps, nt);
  return DG_OK;
}

/* The canvas K/V of layer li (dg_context_canvas_kv): K/V of canvas position j, KV head g at k/v + g * hs + j * rs. */
typedef struct canvas_kv {
  float *k, *v;
  size_t hs, rs;
} canvas_kv;

/* Fresh K/V of the n tokens in src_k / src_v ([n, NKV, D]) scattered into the layer's canvas rows pos[]. */
static void compact_scatter(const dg_layer *l, const canvas_kv *ck, const float *src_k, const float *src_v,
                            const int32_t *pos, int32_t n) {
  const size_t D = (size_t)l->head_dim, row = (size_t)l->n_kv * D;
  for (int32_t t = 0; t < n; t++) /* a duplicated position writes identical values (idempotent) */
    for (int g = 0; g < l->n_kv; g++) {
      const size_t at = (size_t)g * ck->hs + (size_t)pos[t] * ck->rs;
      memcpy(ck->k + at, src_k + (size_t)t * row + (size_t)g * D, D * sizeof(float));
      memcpy(ck->v + at, src_v + (size_t)t * row + (size_t)g * D, D * sizeof(float));
    }
}

dg_status dg_compact_seq_check(const dg_model *m, const dg_compact_seq *s, int32_t q, int host_hn) {
  const dg_config *c = &m->cfg;
  if (s->ctx->m != m) return dg_seterr(DG_ERR_INVALID_ARG, "compacted batch: canvas %d belongs to another model", q);
  DG_TRY(compact_args(s->ctx, s->pos, s->n, s->head, s->nh));
  if (s->nh > 0 && (host_hn ? !s->raw && !s->hn : !s->raw && s->hn))
    return dg_seterr(DG_ERR_INVALID_ARG, "compacted batch: canvas %d has head rows but no %s output", q,
                     host_hn ? "raw-logit or hidden-state" : "raw-logit (the hidden-state output is CPU only)");
  for (int32_t t = 0; t < s->n; t++)
    if (s->tok[t] < 0 || s->tok[t] >= c->vocab_size)
      return dg_seterr(DG_ERR_INVALID_ARG, "compacted batch: canvas %d token id %d outside the vocabulary [0, %d)", q,
                       s->tok[t], c->vocab_size);
  return DG_OK;
}

/* One chunk of a compacted batch: the B canvases seqs[] (their rows together at most work's
 * tmax, checked) as one stack of rows through every layer in work's activations. */
/* Floats of one of K and V in a batch work context's kvt: the largest layer's canvas K/V, C x NKV x D. */
static size_t kvt_floats(const dg_model *m) {
  size_t e = 0;
  for (int li = 0; li < m->cfg.n_layers; li++) {
    const size_t x = (size_t)m->cfg.canvas_length * m->cfg.n_kv_heads[li] * m->cfg.head_dim[li];
    if (x > e) e = x;
  }
  return e;
}

static dg_status compact_chunk(dg_context *work, const dg_compact_seq *seqs, int32_t B) {
  const dg_model *m = work->m;
  const dg_config *c = &m->cfg;
  const int H = c->hidden_size, nt = m->n_threads, C = c->canvas_length;
  const float eps = c->rms_norm_eps;
  const size_t kvt_v = kvt_floats(m); /* where kvt's V half starts */
  /* the lists live in the activations (4 tmax + 1 entries: a chunk has at most tmax canvases) */
  int32_t *buf = work->w->cmp_buf;
  int32_t N = 0;
  for (int32_t q = 0; q < B; q++) N += seqs[q].n;
  int32_t *tok = buf, *ap = buf + N, *sc_rows = buf + 2 * N, *off = buf + 3 * N;
  dg_status st = DG_OK;
  off[0] = 0;
  for (int32_t q = 0; q < B; q++) {
    off[q + 1] = off[q] + seqs[q].n;
    for (int32_t t = 0; t < seqs[q].n; t++) {
      tok[off[q] + t] = seqs[q].tok[t];
      ap[off[q] + t] = seqs[q].ctx->len + seqs[q].pos[t];
    }
  }
  /* decoder input (spec 4.8): embedding, then the SC MLP on the rows that have a signal */
  st = embed(work, tok, N);
  int32_t n_sc = 0;
  for (int32_t q = 0; !st && q < B; q++)
    if (seqs[q].soft)
      for (int32_t t = 0; t < seqs[q].n; t++) {
        memcpy(work->w->xb + (size_t)n_sc * H, seqs[q].soft + (size_t)seqs[q].pos[t] * H, (size_t)H * sizeof(float));
        sc_rows[n_sc++] = off[q] + t;
      }
  if (!st && n_sc > 0) {
    sc_mlp(work, work->w->xb, n_sc);
    for (int32_t r = 0; r < n_sc; r++) {
      float *x = work->w->x + (size_t)sc_rows[r] * H;
      const float *d = work->w->xb + (size_t)r * H;
      for (int j = 0; j < H; j++) x[j] += d[j];
    }
  }
  if (!st) rmsnorm_rows(work->w->x, work->w->x, NULL, N, H, eps, nt);
  work->w->rope_scatter_id++;
  for (int li = 0; !st && li < c->n_layers; li++) {
    const dg_layer *l = &m->layers[li];
    const size_t qrow = (size_t)c->n_heads * l->head_dim, kvrow = (size_t)l->n_kv * l->head_dim;
    qkv(work, li, N, 0, ap);
    for (int32_t q = 0; q < B; q++) {
      dg_context *sq = seqs[q].ctx;
      canvas_kv ck;
      if (seqs[q].kv_transient) { /* every position forwarded: the layer's K/V live only in this pass (issue 16) */
        ck.k = work->kvt;
        ck.v = work->kvt + kvt_v;
        ck.hs = (size_t)C * l->head_dim;
        ck.rs = (size_t)l->head_dim;
      } else if ((st = dg_context_canvas_kv(sq, li, &ck.k, &ck.v, &ck.hs, &ck.rs)))
        break; /* (made by the batch's checks) */
      /* scatter into the canvas's K/V: the cache's canvas slots (or its separate rows) */
      compact_scatter(l, &ck, work->w->k + (size_t)off[q] * kvrow, work->w->v + (size_t)off[q] * kvrow, seqs[q].pos,
                      seqs[q].n);
      /* the canvas's queries over [its prefix K/V, its whole canvas K/V], no mask (spec 7.4) */
      attention(sq, li, work->w->q + (size_t)off[q] * qrow, seqs[q].n, sq->len, ck.k, ck.v, ck.hs, ck.rs, C,
                work->w->att + (size_t)off[q] * qrow);
    }
    if (st) break;
    attn_out(work, li, N);
    ffn(work, li, N, l->layer_scalar_dec);
  }
  for (int32_t q = 0; !st && q < B; q++)
    if (seqs[q].nh > 0)
      head_rows_raw(work, work->w->x + (size_t)off[q] * H, seqs[q].head, seqs[q].nh, seqs[q].raw, seqs[q].hn);
  return st;
}

dg_status dg_cpu_compact_batch(dg_context *work, const dg_compact_seq *seqs, int32_t B) {
  const dg_model *m = work->m;
  for (int32_t q = 0; q < B; q++) {
    DG_TRY(dg_compact_seq_check(m, &seqs[q], q, 1));
    if (seqs[q].kv_transient) {
      for (int32_t t = 0; t < m->cfg.canvas_length; t++) /* F = all in canvas order (seq_prepare) */
        if (t >= seqs[q].n || seqs[q].pos[t] != t)
          return dg_seterr(DG_ERR_INVALID_ARG, "batched pass: canvas %d has transient K/V but does not forward "
                           "canvas position %d as its row %d (%d rows)", q, t, t, seqs[q].n);
      if (!work->kvt && !(work->kvt = malloc(2 * kvt_floats(m) * sizeof(float))))
        return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory for the batch's canvas K/V scratch (%zu floats)",
                         2 * kvt_floats(m));
      continue; /* no slots or separate rows of its own */
    }
    canvas_kv ck; /* where its canvas K/V live (the separate rows, if needed, made now: before any pass) */
    DG_TRY(dg_context_canvas_kv(seqs[q].ctx, 0, &ck.k, &ck.v, &ck.hs, &ck.rs));
  }
  DG_TRY(dg_context_work(work));
  const int32_t T = work->w->tmax; /* >= C >= any canvas's forward set (dg_compact_seq_check) */
  /* consecutive canvases whose rows fit the activations go through the layers together: the
   * stack of a whole batch is never held at once (issue 16), and a canvas's results do not
   * depend on which canvases share its chunk (rows meet only in their own canvas's attention) */
  for (int32_t q0 = 0, q1; q0 < B; q0 = q1) {
    int32_t rows = 0;
    for (q1 = q0; q1 < B && rows + seqs[q1].n <= T; q1++) rows += seqs[q1].n;
    DG_TRY(compact_chunk(work, seqs + q0, q1 - q0));
  }
  return DG_OK;
}

/* ---- one row at a time: the steps of the compacted pass for one token (model.h) ---- */

dg_status dg_cpu_row_input(dg_context *ctx, int32_t tok, int32_t pos, const float *soft, float *x) {
  DG_TRY(compact_input(ctx, &tok, &pos, 1, soft));
  memcpy(x, ctx->w->x, (size_t)ctx->m->cfg.hidden_size * sizeof(float));
  return DG_OK;
}

/* The row x [H] of canvas position pos into the activations with its queries, keys and values of layer li. */
static void row_qkv(dg_context *ctx, int li, int32_t pos, const float *x) {
  int32_t ap = ctx->len + pos;
  memcpy(ctx->w->x, x, (size_t)ctx->m->cfg.hidden_size * sizeof(float));
  ctx->w->rope_scatter_id++;
  qkv(ctx, li, 1, ctx->len, &ap);
}

dg_status dg_cpu_row_kv(dg_context *ctx, int li, int32_t pos, const float *x) {
  canvas_kv ck;
  DG_TRY(dg_context_canvas_kv(ctx, li, &ck.k, &ck.v, &ck.hs, &ck.rs));
  row_qkv(ctx, li, pos, x);
  compact_scatter(&ctx->m->layers[li], &ck, ctx->w->k, ctx->w->v, &pos, 1);
  return DG_OK;
}

dg_status dg_cpu_row_layer(dg_context *ctx, int li, int32_t pos, const float *x, float *y) {
  canvas_kv ck;
  DG_TRY(dg_context_canvas_kv(ctx, li, &ck.k, &ck.v, &ck.hs, &ck.rs));
  row_qkv(ctx, li, pos, x);
  attention(ctx, li, ctx->w->q, 1, ctx->len, ck.k, ck.v, ck.hs, ck.rs, ctx->m->cfg.canvas_length, ctx->w->att);
  attn_out(ctx, li, 1);
  ffn(ctx, li, 1, ctx->m->layers[li].layer_scalar_dec);
  memcpy(y, ctx->w->x, (size_t)ctx->m->cfg.hidden_size * sizeof(float));
  return DG_OK;
}

void dg_cpu_rows_head(dg_context *ctx, const float *hid, const int32_t *rows, int32_t n, float *raw) {
  head_rows_raw(ctx, hid, rows, n, raw, NULL);
}

/* Canvas rows per block of the soft embedding: the block's probabilities
 * [SOFT_ROWS, V] go through one product with E, so each block of E's rows
 * is read from memory once per SOFT_ROWS canvas rows instead of once per row. */
#define SOFT_ROWS 16

dg_status dg_soft_embedding(dg_context *ctx, const float *z, float *soft) {
  const dg_model *m = ctx->m;
  const int C = m->cfg.canvas_length, H = m->cfg.hidden_size, V = m->cfg.vocab_size;
  const int nb = (C + SOFT_ROWS - 1) / SOFT_ROWS, nt = ctx->n_score_threads < nb ? ctx->n_score_threads : nb;
  const dg_kernels *k = dg_soft_kernels(m);
  DG_TRY(dg_context_work(ctx));
  /* the block probabilities live in the context: allocated on the first call, kept (and freed) with it */
  const size_t rows = (size_t)nt * SOFT_ROWS;
  if (ctx->soft_pb_rows < rows) {
    free(ctx->soft_pb);
    ctx->soft_pb = malloc(rows * (size_t)V * sizeof(float));
    ctx->soft_pb_rows = ctx->soft_pb ? rows : 0;
  }
  float *pb = ctx->soft_pb;
  if (!pb) { /* one row at a time in the context's [threads, V] rows: the same sums (they do not depend on T) */
#pragma omp parallel for num_threads(ctx->n_score_threads) schedule(static)
    for (int c = 0; c < C; c++)
      dg_soft_row(m, z + (size_t)c * V, ctx->w->probs + (size_t)omp_get_thread_num() * V, soft + (size_t)c * H);
    return DG_OK;
  }
  /* the rows of a block split over threads when there are fewer blocks than threads */
  const int inner = ctx->n_score_threads / nt > 1 ? ctx->n_score_threads / nt : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
  for (int b = 0; b < nb; b++) {
    const int c0 = b * SOFT_ROWS, n = C - c0 < SOFT_ROWS ? C - c0 : SOFT_ROWS;
    float *p = pb + (size_t)omp_get_thread_num() * SOFT_ROWS * V;
    for (int i = 0; i < n; i++) dg_soft_probs(m, z + (size_t)(c0 + i) * V, p + (size_t)i * V);
    k->matmul_rows(soft + (size_t)c0 * H, H, p, V, n, &m->embed, inner);
    for (size_t i = 0; i < (size_t)n * H; i++) soft[(size_t)c0 * H + i] *= m->embed_scale;
  }
  return DG_OK;
}

dg_status dg_cpu_decode_logits(dg_context *ctx, const int32_t *canvas, const float *sc_logits, float *logits_out) {
  const float *soft = NULL;
  if (sc_logits) {
    DG_TRY(dg_soft_embedding(ctx, sc_logits, ctx->soft));
    soft = ctx->soft;
  }
  return dg_forward_decode(ctx, canvas, soft, logits_out);
}
