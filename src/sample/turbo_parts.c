/* turbo_parts.c: the parts of the turbo engine (spec 7, turbo_parts.h) that work
 * on plain host arrays and know nothing of contexts, sequences or backends:
 * the K-way distribution of a row (spec 7.3; its exact top-K is rowstats.c's),
 * the turbo temperature, acceptance, EOS tail-drop, repeat guard and shape
 * buckets (spec 7.4, 7.5), and the approximate self-conditioning rows
 * (spec 5.5, 7.3), declared in turbo_parts.h. The engine that strings them
 * together is turbo.c; tests call them directly (tests/test_turbo.c). */
#include "sample/turbo_parts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "sample/sampler.h"

void dg_turbo_dist(const float *val, const int32_t *idx, int32_t K, float cap, float T, float u, int mode, float *p,
                   dg_turbo_pos *out) {
  /* z_k = softcap(v_k) / T: the reference's processed logits (spec 6.1), on K values */
  double z0 = 0.0, sum = 0.0;
  for (int32_t k = 0; k < K; k++) {
    float s = cap > 0.0f ? tanhf(val[k] / cap) * cap : val[k];
    float z = s / T;
    if (k == 0) z0 = z; /* softcap and 1/T are monotone: the first is the largest */
    p[k] = z;
  }
  for (int32_t k = 0; k < K; k++) sum += exp((double)p[k] - z0);
  double lse = z0 + log(sum), ent = 0.0;
  for (int32_t k = 0; k < K; k++) {
    double lp = (double)p[k] - lse, pk = exp(lp);
    ent -= pk * lp;
    p[k] = (float)pk;
  }
  out->argmax = idx[0];
  out->entropy = (float)(ent > 0.0 ? ent : 0.0);
  out->top1 = p[0];
  out->proposal = idx[0];
  if (mode != DG_PROPOSAL_ARGMAX) {
    double tot = 0.0, cdf = 0.0;
    for (int32_t k = 0; k < K; k++) tot += p[k];
    double target = (double)u * tot;
    out->proposal = idx[K - 1];
    for (int32_t k = 0; k < K; k++) {
      cdf += p[k];
      if (cdf > target) { out->proposal = idx[k]; break; }
    }
  }
}

float dg_turbo_temperature(const dg_gen_params *p, int32_t step, int32_t n_steps) {
  float frac = n_steps > 1 ? (float)step / (float)(n_steps - 1) : 0.0f;
  return p->t_min + (p->t_max - p->t_min) * (1.0f - frac);
}

/* ------------------------------------------------------------------------ */
/* Schedule and guards (spec 7.5)                                            */
/* ------------------------------------------------------------------------ */

int32_t dg_turbo_accept_step(const dg_turbo_params *t, float bound, int32_t step, int flush, const int32_t *active,
                        int32_t n_active, const float *ent, const float *top1, uint8_t *acc, void *scratch) {
  if (n_active <= 0) return 0;
  int32_t n = 0;
  if (flush) {
    for (int32_t a = 0; a < n_active; a++) acc[active[a]] = 1;
    return n_active;
  }
  if (t->accept == DG_TURBO_ACCEPT_ENTROPY_BOUND) {
    float *e = scratch;                           /* [n_active] */
    uint8_t *ac = (uint8_t *)(e + n_active);      /* [n_active] */
    void *sort = (char *)scratch + 5 * (size_t)n_active; /* 8 n_active bytes for the sort */
    sort = (void *)(((uintptr_t)sort + 7) & ~(uintptr_t)7);
    for (int32_t a = 0; a < n_active; a++) e[a] = ent[active[a]];
    n = dg_entropy_bound_accept(e, n_active, bound, ac, sort);
    for (int32_t a = 0; a < n_active; a++) acc[active[a]] = ac[a];
  } else {
    float tau = step < t->threshold_k0 ? t->threshold_hi : t->threshold_lo;
    for (int32_t a = 0; a < n_active; a++) {
      acc[active[a]] = top1[active[a]] >= tau;
      n += acc[active[a]];
    }
  }
  if (n == 0) { /* the single forced commit */
    int32_t best = active[0];
    for (int32_t a = 1; a < n_active; a++)
      if (top1[active[a]] > top1[best]) best = active[a];
    acc[best] = 1;
    n = 1;
  }
  return n;
}

int32_t dg_turbo_eos_tail(const dg_gen_params *p, int32_t C, const int32_t *committed, uint8_t *frozen,
                          uint8_t *dropped) {
  int32_t e = -1;
  for (int32_t i = 0; i < C; i++)
    if (frozen[i] && !dropped[i] && dg_is_stop(p, committed[i])) { e = i; break; }
  if (e < 0) return 0;
  int all = 1;
  for (int32_t i = 0; i <= e; i++) all &= frozen[i] != 0;
  if (all) return e + 1;
  for (int32_t i = e + 1; i < C; i++)
    if (!frozen[i]) { frozen[i] = 1; dropped[i] = 1; }
  return 0;
}

int32_t dg_repeat_guard_feed(int32_t *last, int32_t *run, const int32_t *tok, int32_t n, int32_t limit) {
  for (int32_t i = 0; i < n; i++) {
    if (tok[i] == *last) (*run)++;
    else { *last = tok[i]; *run = 1; }
    if (limit > 0 && *run >= limit) return i + 1;
  }
  return n;
}

int32_t dg_turbo_bucket(int32_t n, int32_t C) {
  static const int32_t b[] = {16, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++)
    if (b[i] >= n) return b[i] < C ? b[i] : C;
  return C;
}

/* ------------------------------------------------------------------------ */
/* Self-conditioning modes (spec 5.5, 7.3)                                   */
/* ------------------------------------------------------------------------ */

void dg_embed_colsum(const dg_model *m, float *colsum) {
  const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
  double *acc = calloc((size_t)H, sizeof(double));
  float *row = malloc((size_t)H * sizeof(float));
  if (!acc || !row) { free(acc); free(row); memset(colsum, 0, (size_t)H * sizeof(float)); return; }
  for (int v = 0; v < V; v++) {
    dg_weight_row_f32(&m->embed, v, row);
    for (int j = 0; j < H; j++) acc[j] += row[j];
  }
  for (int j = 0; j < H; j++) colsum[j] = (float)acc[j];
  free(acc);
  free(row);
}

size_t dg_turbo_sc_work_size(int32_t V, int32_t K) {
  (void)K;
  /* z [V] + val [V] + idx [V] + top-K scratch for K' up to V */
  return 3 * (size_t)V * 4 + dg_topk_scratch_size(V, V) + 64;
}

static void axpy_row(const dg_model *m, float *s, float a, int32_t v) {
  const int H = m->cfg.hidden_size;
  if (m->embed.dtype == DG_F32 && !m->embed.bits) {
    const float *er = (const float *)m->embed.data + (size_t)v * H;
    for (int j = 0; j < H; j++) s[j] += a * er[j];
  } else {
    dg_weight_axpy_row(s, a, &m->embed, v);
  }
}

void dg_turbo_sc_row(const dg_model *m, dg_turbo_sc mode, const float *raw, float T, const int32_t *idx,
                     const float *p, int32_t K, float tail_bound, const float *colsum, void *work, float *soft,
                     int32_t *k_used, float *tail) {
  const int H = m->cfg.hidden_size;
  const int32_t V = m->cfg.vocab_size;
  const float cap = m->cfg.final_logit_softcapping;
  for (int j = 0; j < H; j++) soft[j] = 0.0f;
  if (mode == DG_TURBO_SC_TOPK) {
    for (int32_t k = 0; k < K; k++) axpy_row(m, soft, p[k], idx[k]);
    for (int j = 0; j < H; j++) soft[j] *= m->embed_scale;
    if (k_used) *k_used = K;
    if (tail) *tail = 0.0f; /* renormalized: the tail is dropped, not measured here */
    return;
  }
  /* adaptive: exact probabilities of the kept tokens, tail spread evenly */
  float *z = work, *kval = z + V;
  int32_t *kidx = (int32_t *)(kval + V);
  void *tk = (void *)(((uintptr_t)(kidx + V) + 63) & ~(uintptr_t)63);
  float mx = -INFINITY;
  for (int32_t v = 0; v < V; v++) {
    float s = cap > 0.0f ? tanhf(raw[v] / cap) * cap : raw[v];
    z[v] = s / T;
    if (z[v] > mx) mx = z[v];
  }
  double sum = 0.0;
  for (int32_t v = 0; v < V; v++) sum += exp((double)z[v] - mx);
  const double lse = mx + log(sum);
  int32_t Kp = K < V ? K : V;
  double mass;
  for (;;) {
    int32_t bad;
    dg_topk_hier(raw, V, Kp, 0, kval, kidx, tk, &bad); /* raw is finite here: the sampler checked it */
    mass = 0.0;
    for (int32_t k = 0; k < Kp; k++) mass += exp((double)z[kidx[k]] - lse);
    if (1.0 - mass <= tail_bound || Kp == V) break;
    Kp = 2 * Kp < V ? 2 * Kp : V;
  }
  double m_tail = 1.0 - mass;
  if (m_tail < 0.0) m_tail = 0.0;
  const float c = Kp < V ? (float)(m_tail / (double)(V - Kp)) : 0.0f;
  for (int32_t k = 0; k < Kp; k++) {
    float q = (float)exp((double)z[kidx[k]] - lse);
    axpy_row(m, soft, q - c, kidx[k]);
  }
  if (c != 0.0f)
    for (int j = 0; j < H; j++) soft[j] += c * colsum[j];
  for (int j = 0; j < H; j++) soft[j] *= m->embed_scale;
  if (k_used) *k_used = Kp;
  if (tail) *tail = (float)m_tail;
}
