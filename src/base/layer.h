/* layer.h: dg_layer, the weights of one layer as the loader (model.c) binds
 * them: typed matrix views (weight.h) into the mmap'd checkpoint and the
 * model's fp32 vectors. The one description of a layer's weights: the CPU
 * forward pass reads it, and the CUDA upload (src/cuda/backend.h,
 * dg_cuda_model_desc) takes the same structs as they are. Plain C, includes
 * only weight.h, so that C and C++ (nvcc) include it alike. Shape letters
 * as in model.h. */
#ifndef DG_LAYER_H
#define DG_LAYER_H

#include "base/weight.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_layer {
  int is_full;            /* full_attention layer (K=V when v is absent) */
  int n_kv, head_dim;     /* NKV, D */
  dg_weight q;            /* [NH*D, H] */
  dg_weight k;            /* [NKV*D, H] */
  dg_weight v;            /* [NKV*D, H]; data == NULL on K=V full layers */
  dg_weight o;            /* [H, NH*D] */
  float *q_norm, *k_norm; /* [D] */
  float *input_norm, *post_attn_norm;          /* [H] */
  float *pre_ff_norm, *post_ff1_norm;          /* [H] dense branch */
  float *pre_ff2_norm, *post_ff2_norm;         /* [H] MoE branch */
  float *post_ff_norm;                         /* [H] norm of (dense + MoE) */
  dg_weight mlp_gate, mlp_up;                  /* [I, H] */
  dg_weight mlp_down;                          /* [H, I] */
  dg_weight router;                            /* [E, H] */
  float *router_scale;                         /* [H] */
  float *per_expert_scale;                     /* [E] */
  dg_weight experts_gate_up;                   /* [E*2*IE, H]: expert e rows e*2IE.. (gate IE, then up IE) */
                                               /* every dg_weight may be MLX-quantized (quant.h) */
  dg_weight experts_down;                      /* [E*H, IE]: expert e rows e*H.. */
  float layer_scalar_dec, layer_scalar_enc;    /* decoder / encoder layer_scalar */
} dg_layer;

#ifdef __cplusplus
}
#endif

#endif
