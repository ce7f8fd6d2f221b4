/* softrow.c: the exact self-conditioning row on the host (spec 5, 4.9):
 * the processed logits cast to the activation dtype, softmax in fp32, the
 * probabilities cast again, times E, times embed_scale. Used by the CPU
 * soft embedding (forward.c, in blocks of rows) and by the turbo engine
 * (turbo.c) for the rows a backend does not make itself (no sc_rows), so
 * that the sampler does not call into the CPU backend's pass. */
#include <float.h>
#include <math.h>

#include "model/model.h"
#include "model/softrow.h"

void dg_soft_probs(const dg_model *m, const float *zr, float *p) {
  const int V = m->cfg.vocab_size;
  float mx = -FLT_MAX;
  for (int v = 0; v < V; v++) {
    p[v] = dg_round_act(m, zr[v]);
    if (p[v] > mx) mx = p[v];
  }
  double sum = 0.0;
  for (int v = 0; v < V; v++) { p[v] = expf(p[v] - mx); sum += p[v]; }
  float inv = (float)(1.0 / sum);
  for (int v = 0; v < V; v++) p[v] = dg_round_act(m, p[v] * inv);
}

const dg_kernels *dg_soft_kernels(const dg_model *m) {
  return m->kern && m->kern->matmul_rows ? m->kern : dg_kernels_ref();
}

void dg_soft_row(const dg_model *m, const float *zr, float *p, float *s) {
  const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
  dg_soft_probs(m, zr, p);
  /* s = (sum_v P[v] E[v]) * embed_scale, summed in increasing v (kernels.h: matmul_rows) */
  dg_soft_kernels(m)->matmul_rows(s, H, p, V, 1, &m->embed, 1);
  for (int j = 0; j < H; j++) s[j] *= m->embed_scale;
}

