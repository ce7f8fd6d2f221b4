/* device.c: device selection glue. Describes a loaded model's tensors to the
 * CUDA backend (src/cuda/backend.h, plain host pointers into the mmap'd
 * checkpoint and the model's fp32 vectors) so that the .cu files never
 * include the CPU-side headers, and answers dg_device_info. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/backend.h"
#include "dg_error.h"
#include "model.h"
#include "quant.h"

static int cuda_dtype(dg_dtype t) { return t == DG_BF16 ? DG_CUDA_BF16 : t == DG_F16 ? DG_CUDA_F16 : DG_CUDA_F32; }

/* The backend's view of a weight: float, or MLX affine-quantized as stored
 * (packed words, scales, biases; src/quant.h), which the CUDA kernels
 * dequantize themselves. */
static dg_cuda_mat mat(const dg_weight *w) {
  dg_cuda_mat m;
  memset(&m, 0, sizeof m);
  m.dtype = cuda_dtype(w->dtype);
  m.data = w->data;
  m.rows = w->rows;
  m.cols = w->cols;
  if (w->bits) {
    m.bits = w->bits;
    m.group_size = w->group_size;
    m.sb_dtype = cuda_dtype(w->sb_dtype);
    m.scales = w->scales;
    m.biases = w->biases;
  }
  return m;
}

dg_status dg_model_to_cuda(dg_model *m, int device) {
  const dg_config *c = &m->cfg;
  dg_cuda_layer_desc *ls = calloc((size_t)c->n_layers, sizeof *ls);
  /* A quantized router (`router.proj`, recipe class `router`) is dequantized
   * here to fp32, exactly as the CPU reads it: the device keeps every router
   * in fp32 for fp32 router logits (spec 4.6; cublasSgemm). The cost is small:
   * [E, H] fp32 is 1.4 MB per layer at E = 128, H = 2816, against 0.4 MB
   * packed at 8 bits. */
  float **routers = calloc((size_t)c->n_layers, sizeof *routers);
  dg_status st = DG_OK;
  if (!ls || !routers) {
    st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
    goto done;
  }
  for (int i = 0; i < c->n_layers; i++) {
    const dg_layer *l = &m->layers[i];
    dg_cuda_layer_desc *d = &ls[i];
    d->is_full = l->is_full;
    d->n_kv = l->n_kv;
    d->head_dim = l->head_dim;
    d->q = mat(&l->q);
    d->k = mat(&l->k);
    d->v = mat(&l->v); /* data NULL on K=V full layers */
    d->o = mat(&l->o);
    d->q_norm = l->q_norm;
    d->k_norm = l->k_norm;
    d->input_norm = l->input_norm;
    d->post_attn_norm = l->post_attn_norm;
    d->pre_ff_norm = l->pre_ff_norm;
    d->post_ff1_norm = l->post_ff1_norm;
    d->pre_ff2_norm = l->pre_ff2_norm;
    d->post_ff2_norm = l->post_ff2_norm;
    d->post_ff_norm = l->post_ff_norm;
    d->mlp_gate = mat(&l->mlp_gate);
    d->mlp_up = mat(&l->mlp_up);
    d->mlp_down = mat(&l->mlp_down);
    d->router = mat(&l->router);
    if (l->router.bits) {
      const int64_t E = l->router.rows, H = l->router.cols;
      if (!(routers[i] = malloc((size_t)(E * H) * sizeof(float)))) {
        st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
      }
      for (int64_t r = 0; r < E; r++) dg_weight_row_f32(&l->router, r, routers[i] + r * H);
      memset(&d->router, 0, sizeof d->router);
      d->router.dtype = DG_CUDA_F32;
      d->router.data = routers[i];
      d->router.rows = E;
      d->router.cols = H;
    }
    d->router_scale = l->router_scale;
    d->per_expert_scale = l->per_expert_scale;
    d->experts_gate_up = mat(&l->experts_gate_up);
    d->experts_down = mat(&l->experts_down);
    d->layer_scalar_dec = l->layer_scalar_dec;
    d->layer_scalar_enc = l->layer_scalar_enc;
  }
  dg_cuda_model_desc d;
  memset(&d, 0, sizeof d);
  d.vocab = c->vocab_size;
  d.hidden = c->hidden_size;
  d.n_layers = c->n_layers;
  d.n_heads = c->n_heads;
  d.inter = c->intermediate_size;
  d.moe_inter = c->moe_intermediate_size;
  d.n_experts = c->n_experts;
  d.top_k = c->top_k_experts;
  d.window = c->sliding_window;
  d.canvas = c->canvas_length;
  d.eps = c->rms_norm_eps;
  d.softcap = c->final_logit_softcapping;
  d.embed_scale = m->embed_scale;
  d.act_dtype = m->act_dtype == DG_BF16 ? DG_CUDA_BF16 : m->act_dtype == DG_F16 ? DG_CUDA_F16 : DG_CUDA_F32;
  d.embed = mat(&m->embed);
  d.final_norm = m->final_norm;
  d.sc_pre_norm = m->sc_pre_norm;
  d.sc_gate = mat(&m->sc_gate);
  d.sc_up = mat(&m->sc_up);
  d.sc_down = mat(&m->sc_down);
  d.inv_freq_sliding = m->inv_freq_sliding;
  d.inv_freq_full = m->inv_freq_full;
  d.layers = ls;
  d.device = device;
  st = dg_cuda_model_new(&d, &m->cuda);
done:
  if (routers)
    for (int i = 0; i < c->n_layers; i++) free(routers[i]);
  free(routers);
  free(ls);
  return st;
}

dg_status dg_device_info(dg_device dev, int index, char *buf, size_t n) {
  if (!buf || !n) return dg_seterr(DG_ERR_INVALID_ARG, "dg_device_info: no buffer");
  buf[0] = 0;
  if (dev == DG_DEVICE_CPU) {
    snprintf(buf, n, "cpu, %s kernels", dg_kernels_best()->name);
    return DG_OK;
  }
  if (dev == DG_DEVICE_CUDA) return dg_cuda_info(index, buf, n);
  return dg_seterr(DG_ERR_INVALID_ARG, "unknown device %d", (int)dev);
}

dg_status dg_cpu_kernels(const char **name) {
  char why[256];
  const dg_kernels *k = dg_kernels_pick(getenv("DGEMMA_KERNELS"), why, sizeof why);
  if (name) *name = k->name;
  return why[0] ? dg_seterr(DG_ERR_INVALID_ARG, "%s", why) : DG_OK;
}

dg_status dg_context_profile(dg_context *ctx, int on) {
  if (!ctx || !ctx->cuda)
    return dg_seterr(DG_ERR_INVALID_ARG, "stage profiling needs a CUDA context (--device cuda)");
  return dg_cuda_profile(ctx->cuda, on);
}

dg_status dg_context_profile_read(dg_context *ctx, dg_profile *out) {
  if (!ctx || !ctx->cuda || !out)
    return dg_seterr(DG_ERR_INVALID_ARG, "stage profiling needs a CUDA context (--device cuda)");
  _Static_assert(DG_PROFILE_STAGES == DG_CUDA_NSTAGES, "dgemma.h and backend.h count the same stages");
  memset(out, 0, sizeof *out);
  for (int i = 0; i < DG_PROFILE_STAGES; i++) out->name[i] = dg_cuda_stage_name(i);
  return dg_cuda_profile_read(ctx->cuda, out->ms, &out->marks);
}
