/* model.c: load a Hugging Face DiffusionGemma directory and bind every text
 * tensor to a typed view into the mmap'd safetensors (spec section 3.1).
 *
 * Tying as stored by Transformers: the decoder holds the shared weights under
 * model.decoder.*, the encoder holds only its own layer_scalar
 * (model.encoder.language_model.layers.{i}.layer_scalar), the LM head is the
 * embedding. The vision tower and embed_vision tensors are ignored. Big
 * matrices stay in the checkpoint dtype (f32/bf16/f16); small vectors (norms,
 * scales) are widened to fp32 copies owned by the model. */
#include "model/model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dg_mem.h"
#include "base/dg_error.h"
#include "io/quant.h"

void dg_free(void *p) { free(p); }

dg_model_params dg_model_default_params(void) {
  dg_model_params p;
  memset(&p, 0, sizeof p);
  return p;
}

static dg_status own(dg_model *m, float *p) {
  if (m->n_owned == m->cap_owned) {
    int nc = m->cap_owned ? m->cap_owned * 2 : 64;
    float **nb = realloc(m->owned, (size_t)nc * sizeof *nb);
    if (!nb) { free(p); return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); }
    m->owned = nb;
    m->cap_owned = nc;
  }
  m->owned[m->n_owned++] = p;
  return DG_OK;
}

static const char *shape_str(const dg_tensor *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
  return buf;
}

/* Find `name`, check dtype is a float type and the shape equals dims[nd]. */
static dg_status find_tensor(const dg_model *m, const char *name, int nd, const int64_t *dims,
                             const dg_tensor **out) {
  const dg_tensor *t = dg_st_find(m->st, name);
  if (!t)
    return dg_seterr(DG_ERR_TENSOR_MISSING, "%s: tensor %s is missing from the checkpoint", m->dir, name);
  if (t->dtype != DG_F32 && t->dtype != DG_BF16 && t->dtype != DG_F16)
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s has dtype %s (expected F32, BF16 or F16)", t->file, name,
                     dg_dtype_name(t->dtype));
  int ok = t->ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == dims[i];
  if (!ok) {
    char want[128], got[128];
    dg_tensor w;
    memset(&w, 0, sizeof w);
    w.ndim = nd;
    for (int i = 0; i < nd; i++) w.shape[i] = dims[i];
    return dg_seterr(DG_ERR_TENSOR_SHAPE, "%s: tensor %s has shape %s, expected %s from config.json", t->file, name,
                     shape_str(t, got, sizeof got), shape_str(&w, want, sizeof want));
  }
  *out = t;
  return DG_OK;
}

/* Module path of a weight tensor name: the name without a trailing ".weight"
 * (MLX keys scales, biases and config overrides by it, spec 3.2). */
static void module_of(const char *name, char *out, size_t n) {
  snprintf(out, n, "%s", name);
  size_t l = strlen(out);
  if (l > 7 && strcmp(out + l - 7, ".weight") == 0) out[l - 7] = 0;
}

static void dims_str(const int64_t *dims, int nd, char *buf, size_t n) {
  dg_tensor w;
  memset(&w, 0, sizeof w);
  w.ndim = nd;
  for (int i = 0; i < nd; i++) w.shape[i] = dims[i];
  shape_str(&w, buf, n);
}

/* An MLX affine-quantized matrix (spec 3.2, quant.h): `name` (U32 packed
 * codes [..., out, in*bits/32]) with <module>.scales and <module>.biases
 * [..., out, in/group_size]; bits and group size from config.json's
 * quantization block (the module's override, else the defaults). dims is the
 * logical shape from config.json. */
static dg_status bind_quantized(dg_model *m, const char *name, const dg_tensor *t, int nd, const int64_t *dims,
                                dg_weight *w) {
  char mod[256], sn[300], bn[300], got[128], want[128];
  module_of(name, mod, sizeof mod);
  snprintf(sn, sizeof sn, "%s.scales", mod);
  snprintf(bn, sizeof bn, "%s.biases", mod);
  const dg_tensor *ts = dg_st_find(m->st, sn), *tb = dg_st_find(m->st, bn);
  if (t->dtype != DG_U32)
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s has dtype %s but %s exists (a quantized weight is U32)",
                     t->file, name, dg_dtype_name(t->dtype), sn);
  if (!ts)
    return dg_seterr(DG_ERR_TENSOR_MISSING, "%s: tensor %s is missing (%s is U32, i.e. quantized)", m->dir, sn, name);
  if (!tb)
    return dg_seterr(DG_ERR_TENSOR_MISSING, "%s: tensor %s is missing (%s is U32, i.e. quantized)", m->dir, bn, name);
  if (!m->qcfg.present)
    return dg_seterr(DG_ERR_CONFIG, "%s/config.json: no quantization block, but tensor %s is quantized (U32 + %s)",
                     m->dir, name, sn);
  int bits, G;
  if (!dg_quant_config_lookup(&m->qcfg, mod, &bits, &G))
    return dg_seterr(DG_ERR_CONFIG, "%s/config.json: quantization[\"%s\"] is false, but tensor %s is quantized", m->dir,
                     mod, name);
  const int64_t in = dims[nd - 1];
  int64_t pdims[DG_MAX_DIMS], sdims[DG_MAX_DIMS];
  for (int i = 0; i < nd; i++) pdims[i] = sdims[i] = dims[i];
  pdims[nd - 1] = in * bits / 32;
  sdims[nd - 1] = in / G;
  int ok = t->ndim == nd && in % G == 0;
  for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == pdims[i];
  if (!ok) {
    shape_str(t, got, sizeof got);
    dims_str(pdims, nd, want, sizeof want);
    double implied = t->ndim == nd && in ? 32.0 * (double)t->shape[nd - 1] / (double)in : 0.0;
    if (in % G)
      return dg_seterr(DG_ERR_TENSOR_SHAPE,
                       "%s: tensor %s: input dimension %lld is not a multiple of group_size %d (config.json quantization)",
                       t->file, name, (long long)in, G);
    return dg_seterr(DG_ERR_TENSOR_SHAPE,
                     "%s: tensor %s has shape %s, expected %s for bits = %d (config.json quantization); its width "
                     "implies bits = %g for input dimension %lld",
                     t->file, name, got, want, bits, implied, (long long)in);
  }
  const dg_tensor *sb[2] = {ts, tb};
  for (int k = 0; k < 2; k++) {
    const dg_tensor *u = sb[k];
    if (u->dtype != DG_F32 && u->dtype != DG_BF16 && u->dtype != DG_F16)
      return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s has dtype %s (expected F32, BF16 or F16)", u->file, u->name,
                       dg_dtype_name(u->dtype));
    if (u->dtype != ts->dtype)
      return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s has dtype %s but %s has %s", u->file, u->name,
                       dg_dtype_name(u->dtype), sn, dg_dtype_name(ts->dtype));
    int sok = u->ndim == nd;
    for (int i = 0; sok && i < nd; i++) sok = u->shape[i] == sdims[i];
    if (!sok) {
      shape_str(u, got, sizeof got);
      dims_str(sdims, nd, want, sizeof want);
      return dg_seterr(DG_ERR_TENSOR_SHAPE,
                       "%s: tensor %s has shape %s, expected %s for group_size = %d (config.json quantization)", u->file,
                       u->name, got, want, G);
    }
  }
  w->dtype = DG_U32;
  w->data = t->data;
  w->cols = in;
  w->rows = 1;
  for (int i = 0; i < nd - 1; i++) w->rows *= dims[i];
  w->bits = bits;
  w->group_size = G;
  w->sb_dtype = ts->dtype;
  w->scales = ts->data;
  w->biases = tb->data;
  m->n_params += w->rows * w->cols;
  m->n_quantized++;
  if (!m->min_bits || bits < m->min_bits) m->min_bits = bits;
  if (bits > m->max_bits) m->max_bits = bits;
  return DG_OK;
}

/* Matrix [rows, cols] (or a 3-D stack [e, r, c] viewed as [e*r, c]): a float
 * tensor, or an MLX quantized one when <module>.scales exists or the tensor
 * is U32. */
static dg_status bind_matrix(dg_model *m, const char *name, int nd, const int64_t *dims, dg_weight *w) {
  memset(w, 0, sizeof *w);
  const dg_tensor *t = dg_st_find(m->st, name);
  if (t) {
    char mod[256], sn[300];
    module_of(name, mod, sizeof mod);
    snprintf(sn, sizeof sn, "%s.scales", mod);
    if (t->dtype == DG_U32 || dg_st_find(m->st, sn)) return bind_quantized(m, name, t, nd, dims, w);
  }
  DG_TRY(find_tensor(m, name, nd, dims, &t));
  w->dtype = t->dtype;
  w->cols = dims[nd - 1];
  w->rows = 1;
  for (int i = 0; i < nd - 1; i++) w->rows *= dims[i];
  w->data = t->data;
  size_t es = dg_dtype_size(t->dtype);
  if (((uintptr_t)t->data % es) != 0) { /* misaligned: keep an aligned copy */
    void *cp = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
    if (!cp) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "%s: cannot copy misaligned tensor %s", m->dir, name);
    memcpy(cp, t->data, t->nbytes);
    DG_TRY(own(m, (float *)cp));
    w->data = cp;
  }
  m->n_params += w->rows * w->cols;
  return DG_OK;
}

/* An expert stack [E, R, C] (spec 3.1/3.2): stored stacked under the HF name
 * ("experts.gate_up_proj") or the MLX name (".weight" added), or per expert
 * ("experts.{e}.gate_up_proj.weight", each [R, C], float or quantized). Per
 * expert tensors are concatenated into one owned stack so the kernels see a
 * single [E*R, C] matrix. */
static dg_status bind_experts(dg_model *m, int li, const char *what, int64_t E, int64_t R, int64_t C, dg_weight *w) {
  char hf[200], mlx[256], one[256];
  snprintf(hf, sizeof hf, "model.decoder.layers.%d.experts.%s", li, what);
  snprintf(mlx, sizeof mlx, "%s.weight", hf);
  snprintf(one, sizeof one, "model.decoder.layers.%d.experts.0.%s.weight", li, what);
  if (dg_st_find(m->st, hf) || dg_st_find(m->st, mlx) || !dg_st_find(m->st, one))
    return bind_matrix(m, dg_st_find(m->st, hf) ? hf : mlx, 3, (int64_t[]){E, R, C}, w);
  dg_weight *ew = calloc((size_t)E, sizeof *ew);
  if (!ew) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  dg_status st = DG_OK;
  for (int64_t e = 0; e < E && !st; e++) {
    snprintf(one, sizeof one, "model.decoder.layers.%d.experts.%lld.%s.weight", li, (long long)e, what);
    st = bind_matrix(m, one, 2, (int64_t[]){R, C}, &ew[e]);
    if (!st && (ew[e].bits != ew[0].bits || ew[e].group_size != ew[0].group_size || ew[e].dtype != ew[0].dtype ||
                ew[e].sb_dtype != ew[0].sb_dtype))
      st = dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s is stored as %s/%d bits, expert 0 as %s/%d bits (one stack needs one format)",
                     m->dir, one, dg_dtype_name(ew[e].dtype), ew[e].bits, dg_dtype_name(ew[0].dtype), ew[0].bits);
  }
  if (!st) {
    *w = ew[0];
    w->rows = E * R;
    int q = ew[0].bits != 0;
    size_t rb = q ? (size_t)dg_quant_row_bytes(C, ew[0].bits) : (size_t)C * dg_dtype_size(ew[0].dtype);
    size_t sbb = q ? (size_t)(C / ew[0].group_size) * dg_dtype_size(ew[0].sb_dtype) : 0;
    /* anonymous copies the matvecs stream: 2 MiB pages with DGEMMA_THP=1 (base/dg_mem.h) */
    char *d = dg_big_alloc((size_t)(E * R) * rb, NULL);
    char *sc = q ? dg_big_alloc((size_t)(E * R) * sbb, NULL) : NULL, *bi = q ? dg_big_alloc((size_t)(E * R) * sbb, NULL) : NULL;
    if (!d || (q && (!sc || !bi))) {
      free(d); free(sc); free(bi);
      st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory stacking the experts of layer %d", li);
    } else {
      for (int64_t e = 0; e < E; e++) {
        memcpy(d + (size_t)(e * R) * rb, ew[e].data, (size_t)R * rb);
        if (q) {
          memcpy(sc + (size_t)(e * R) * sbb, ew[e].scales, (size_t)R * sbb);
          memcpy(bi + (size_t)(e * R) * sbb, ew[e].biases, (size_t)R * sbb);
        }
      }
      w->data = d;
      w->scales = sc;
      w->biases = bi;
      if ((st = own(m, (float *)d)) == DG_OK && q && (st = own(m, (float *)sc)) == DG_OK) st = own(m, (float *)bi);
    }
  }
  free(ew);
  return st;
}

/* Vector [n] widened to an owned fp32 copy. */
static dg_status bind_vector(dg_model *m, const char *name, int64_t n, float **out) {
  const dg_tensor *t;
  int64_t dims[1] = {n};
  DG_TRY(find_tensor(m, name, 1, dims, &t));
  float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!v) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory binding %s", name);
  for (int64_t i = 0; i < n; i++) v[i] = dg_load_elem(t->dtype, t->data, i);
  DG_TRY(own(m, v));
  *out = v;
  m->n_params += n;
  return DG_OK;
}

static dg_status bind_scalar(dg_model *m, const char *name, float *out) {
  const dg_tensor *t = dg_st_find(m->st, name);
  if (!t) return dg_seterr(DG_ERR_TENSOR_MISSING, "%s: tensor %s is missing from the checkpoint", m->dir, name);
  if (t->dtype != DG_F32 && t->dtype != DG_BF16 && t->dtype != DG_F16)
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor %s has dtype %s (expected F32, BF16 or F16)", t->file, name,
                     dg_dtype_name(t->dtype));
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
  if (numel != 1) {
    char got[128];
    return dg_seterr(DG_ERR_TENSOR_SHAPE, "%s: tensor %s has shape %s, expected [1]", t->file, name,
                     shape_str(t, got, sizeof got));
  }
  *out = dg_load_elem(t->dtype, t->data, 0);
  if (!isfinite(*out))
    return dg_seterr(DG_ERR_NUMERIC, "%s: tensor %s holds the non-finite value %g (%s; a layer scalar must be finite)",
                     t->file, name, (double)*out, dg_dtype_name(t->dtype));
  return DG_OK;
}

static dg_status bind_layer(dg_model *m, int i) {
  const dg_config *c = &m->cfg;
  dg_layer *l = &m->layers[i];
  const int64_t H = c->hidden_size, NH = c->n_heads, D = c->head_dim[i], NKV = c->n_kv_heads[i];
  const int64_t I = c->intermediate_size, IE = c->moe_intermediate_size, E = c->n_experts;
  l->is_full = c->is_full[i];
  l->n_kv = (int)NKV;
  l->head_dim = (int)D;
  char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "model.decoder.layers.%d." fmt, i), n)
  DG_TRY(bind_matrix(m, NAME("self_attn.q_proj.weight"), 2, (int64_t[]){NH * D, H}, &l->q));
  DG_TRY(bind_matrix(m, NAME("self_attn.k_proj.weight"), 2, (int64_t[]){NKV * D, H}, &l->k));
  if (dg_st_find(m->st, NAME("self_attn.v_proj.weight")))
    DG_TRY(bind_matrix(m, n, 2, (int64_t[]){NKV * D, H}, &l->v));
  else if (!l->is_full)
    return dg_seterr(DG_ERR_TENSOR_MISSING,
                     "%s: tensor %s is missing (only full-attention layers may omit v_proj: K=V)", m->dir, n);
  DG_TRY(bind_matrix(m, NAME("self_attn.o_proj.weight"), 2, (int64_t[]){H, NH * D}, &l->o));
  DG_TRY(bind_vector(m, NAME("self_attn.q_norm.weight"), D, &l->q_norm));
  DG_TRY(bind_vector(m, NAME("self_attn.k_norm.weight"), D, &l->k_norm));
  DG_TRY(bind_vector(m, NAME("input_layernorm.weight"), H, &l->input_norm));
  DG_TRY(bind_vector(m, NAME("post_attention_layernorm.weight"), H, &l->post_attn_norm));
  DG_TRY(bind_vector(m, NAME("pre_feedforward_layernorm.weight"), H, &l->pre_ff_norm));
  DG_TRY(bind_vector(m, NAME("post_feedforward_layernorm_1.weight"), H, &l->post_ff1_norm));
  DG_TRY(bind_vector(m, NAME("pre_feedforward_layernorm_2.weight"), H, &l->pre_ff2_norm));
  DG_TRY(bind_vector(m, NAME("post_feedforward_layernorm_2.weight"), H, &l->post_ff2_norm));
  DG_TRY(bind_vector(m, NAME("post_feedforward_layernorm.weight"), H, &l->post_ff_norm));
  DG_TRY(bind_matrix(m, NAME("mlp.gate_proj.weight"), 2, (int64_t[]){I, H}, &l->mlp_gate));
  DG_TRY(bind_matrix(m, NAME("mlp.up_proj.weight"), 2, (int64_t[]){I, H}, &l->mlp_up));
  DG_TRY(bind_matrix(m, NAME("mlp.down_proj.weight"), 2, (int64_t[]){H, I}, &l->mlp_down));
  DG_TRY(bind_matrix(m, NAME("router.proj.weight"), 2, (int64_t[]){E, H}, &l->router));
  DG_TRY(bind_vector(m, NAME("router.scale"), H, &l->router_scale));
  DG_TRY(bind_vector(m, NAME("router.per_expert_scale"), E, &l->per_expert_scale));
  DG_TRY(bind_experts(m, i, "gate_up_proj", E, 2 * IE, H, &l->experts_gate_up));
  DG_TRY(bind_experts(m, i, "down_proj", E, H, IE, &l->experts_down));
  DG_TRY(bind_scalar(m, NAME("layer_scalar"), &l->layer_scalar_dec));
  snprintf(n, sizeof n, "model.encoder.language_model.layers.%d.layer_scalar", i);
  DG_TRY(bind_scalar(m, n, &l->layer_scalar_enc));
#undef NAME
  return DG_OK;
}

/* Rope inverse frequencies for one layer kind, as Transformers computes them
 * in fp32 (modeling_rope_utils: default and proportional). Spec 4.3. */
static float *make_inv_freq(const dg_rope_params *rp, int D) {
  float *f = calloc((size_t)D / 2, sizeof(float));
  if (!f) return NULL;
  int rotated = D / 2; /* pairs that rotate */
  float denom = (float)D;
  if (rp->type == DG_ROPE_PROPORTIONAL) rotated = (int)(rp->partial_rotary_factor * D / 2.0);
  for (int i = 0; i < rotated && i < D / 2; i++) {
    float e = (float)(2 * i) / denom;
    f[i] = 1.0f / powf((float)rp->theta, e);
    /* only the proportional init divides by "factor"; the default one ignores it */
    if (rp->type == DG_ROPE_PROPORTIONAL && rp->factor != 0.0 && rp->factor != 1.0) f[i] /= (float)rp->factor;
  }
  return f;
}

dg_status dg_model_load_host(const char *dir, const dg_model_params *params, dg_model **out) {
  if (!dir || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_model_load: NULL argument");
  *out = NULL;
  dg_model_params p = params ? *params : dg_model_default_params();
  dg_model *m = calloc(1, sizeof *m);
  if (!m) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  dg_status st = DG_OK;
  char path[4096];
  m->dir = strdup(dir);
  if (!m->dir) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); goto fail; }

  struct stat sb; /* a file given as the model (-m FILE): say so, not "FILE/config.json: no such file" */
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
    st = dg_seterr(DG_ERR_NOT_FOUND, "%s is not a directory (a model directory holds config.json, the "
                   "safetensors files and tokenizer.json)", dir);
    goto fail;
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((st = dg_config_load(path, &m->cfg))) goto fail;
  int found = 0;
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  if ((st = dg_gen_config_load(path, &m->gen_defaults, &found))) goto fail;
  m->has_gen_config = found;
  if (!found && m->cfg.n_eos > 0) { /* no generation config: stop on the model config's eos ids */
    m->gen_defaults.n_stop_ids = m->cfg.n_eos;
    memcpy(m->gen_defaults.stop_ids, m->cfg.eos_ids, sizeof m->cfg.eos_ids);
  }

  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((st = dg_quant_config_load(path, &m->qcfg))) goto fail;
  if ((st = dg_st_open_dir(dir, &m->st))) goto fail;

  const dg_config *c = &m->cfg;
  const int64_t V = c->vocab_size, H = c->hidden_size, I = c->intermediate_size;
  if ((st = bind_matrix(m, "model.decoder.embed_tokens.weight", 2, (int64_t[]){V, H}, &m->embed))) goto fail;
  /* a quantized embedding's scales carry the model dtype (spec 3.2) */
  m->act_dtype = m->embed.bits ? m->embed.sb_dtype : m->embed.dtype;
  /* HF: embed_scale = tensor(sqrt(H)) (fp32), cast to the weight dtype (spec 4.9). */
  m->embed_scale = dg_round_act(m, (float)sqrt((double)H));
  if ((st = bind_vector(m, "model.decoder.norm.weight", H, &m->final_norm))) goto fail;
  if ((st = bind_vector(m, "model.decoder.self_conditioning.pre_norm.weight", H, &m->sc_pre_norm))) goto fail;
  if ((st = bind_matrix(m, "model.decoder.self_conditioning.gate_proj.weight", 2, (int64_t[]){I, H}, &m->sc_gate)))
    goto fail;
  if ((st = bind_matrix(m, "model.decoder.self_conditioning.up_proj.weight", 2, (int64_t[]){I, H}, &m->sc_up)))
    goto fail;
  if ((st = bind_matrix(m, "model.decoder.self_conditioning.down_proj.weight", 2, (int64_t[]){H, I}, &m->sc_down)))
    goto fail;
  m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
  if (!m->layers) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); goto fail; }
  for (int i = 0; i < c->n_layers; i++)
    if ((st = bind_layer(m, i))) goto fail;

  for (int i = 0; i < c->n_layers; i++) {
    int D = c->head_dim[i];
    if (c->is_full[i] && !m->inv_freq_full) { m->inv_freq_full = make_inv_freq(&c->rope_full, D); m->d_full = D; }
    if (!c->is_full[i] && !m->inv_freq_sliding) {
      m->inv_freq_sliding = make_inv_freq(&c->rope_sliding, D);
      m->d_sliding = D;
    }
    if ((c->is_full[i] && D != m->d_full) || (!c->is_full[i] && D != m->d_sliding)) {
      st = dg_seterr(DG_ERR_CONFIG, "%s/config.json: layers of one attention type must share head_dim (layer %d has %d)",
                     dir, i, D);
      goto fail;
    }
  }
  if ((m->d_full && !m->inv_freq_full) || (m->d_sliding && !m->inv_freq_sliding)) {
    st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
    goto fail;
  }

  if (p.n_threads < 0 || p.n_threads > DG_MAX_THREADS) {
    st = dg_seterr(DG_ERR_INVALID_ARG, "n_threads = %d is outside [0, %d] (0 = all cores)", p.n_threads, DG_MAX_THREADS);
    goto fail;
  }
  m->n_threads = p.n_threads > 0 ? p.n_threads : omp_get_max_threads();
  m->kern = p.reference_kernels ? dg_kernels_ref() : dg_kernels_best();

  if (!p.no_tokenizer) {
    const char *tp = p.tokenizer_path;
    if (!tp) { snprintf(path, sizeof path, "%s/tokenizer.json", dir); tp = path; }
    if ((st = dg_tokenizer_load(tp, c->vocab_size, &m->tok))) goto fail;
    if (c->pad_token_id >= dg_tokenizer_n_ids(m->tok) || c->bos_token_id >= dg_tokenizer_n_ids(m->tok)) {
      st = dg_seterr(DG_ERR_VOCAB_MISMATCH, "%s: tokenizer has %d ids but config.json uses pad %d / bos %d", tp,
                     dg_tokenizer_n_ids(m->tok), c->pad_token_id, c->bos_token_id);
      goto fail;
    }
  }
  for (int i = 0; i < c->n_eos; i++) /* config.json's own, also where generation_config.json overrides them */
    if (c->eos_ids[i] >= c->vocab_size) {
      st = dg_seterr(DG_ERR_CONFIG, "%s/config.json: eos_token_id %d is outside the vocabulary (%d)", dir,
                     c->eos_ids[i], c->vocab_size);
      goto fail;
    }
  for (int i = 0; found && i < m->gen_defaults.n_stop_ids; i++)
    if (m->gen_defaults.stop_ids[i] >= c->vocab_size) {
      st = dg_seterr(DG_ERR_CONFIG, "%s/generation_config.json: eos_token_id %d is outside the vocabulary (%d)", dir,
                     m->gen_defaults.stop_ids[i], c->vocab_size);
      goto fail;
    }
  *out = m;
  return DG_OK;
fail:
  dg_model_free(m);
  return st;
}

void dg_model_free(dg_model *m) {
  if (!m) return;
  if (m->bk) m->bk->model_free(m); /* the backend's copy of the weights */
  for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
  free(m->owned);
  free(m->layers);
  free(m->inv_freq_full);
  free(m->inv_freq_sliding);
  if (m->tok) dg_tokenizer_free(m->tok);
  dg_quant_config_free(&m->qcfg);
  dg_st_close(m->st);
  free(m->dir);
  free(m);
}

float dg_round_act(const dg_model *m, float x) {
  switch (m->act_dtype) {
  case DG_BF16: return dg_bf16_to_f32(dg_f32_to_bf16(x));
  case DG_F16: return dg_f16_to_f32(dg_f32_to_f16(x));
  default: return x;
  }
}

dg_status dg_model_get_info(const dg_model *m, dg_model_info *info) {
  if (!m || !info) return dg_seterr(DG_ERR_INVALID_ARG, "dg_model_get_info: NULL argument");
  const dg_config *c = &m->cfg;
  memset(info, 0, sizeof *info);
  info->vocab_size = c->vocab_size;
  info->hidden_size = c->hidden_size;
  info->n_layers = c->n_layers;
  info->n_heads = c->n_heads;
  info->sliding_window = c->sliding_window;
  info->intermediate_size = c->intermediate_size;
  info->moe_intermediate_size = c->moe_intermediate_size;
  info->n_experts = c->n_experts;
  info->top_k_experts = c->top_k_experts;
  info->canvas_length = c->canvas_length;
  info->max_position_embeddings = c->max_position_embeddings;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->is_full[i]) { info->n_full_layers++; info->n_global_kv_heads = c->n_kv_heads[i]; info->global_head_dim = c->head_dim[i]; }
    else { info->n_kv_heads = c->n_kv_heads[i]; info->head_dim = c->head_dim[i]; }
  }
  info->n_params = m->n_params;
  info->weight_dtype = m->act_dtype == DG_BF16 ? "bf16" : m->act_dtype == DG_F16 ? "f16" : "f32";
  info->has_tokenizer = m->tok != NULL;
  info->has_generation_config = m->has_gen_config;
  info->n_quantized = m->n_quantized;
  info->quant_bits_min = m->min_bits;
  info->quant_bits_max = m->max_bits;
  info->device = m->bk ? m->bk->device : DG_DEVICE_CPU;
  info->device_bytes = m->bk ? m->bk->model_bytes(m) : 0;
  info->cpu_kernels = m->kern->name;
  return DG_OK;
}

dg_gen_params dg_gen_default_params(const dg_model *m) {
  dg_gen_params p;
  if (m) p = m->gen_defaults;
  else dg_gen_params_reference_defaults(&p);
  return p;
}

/* ---- tokenizer front-ends (public API) ---------------------------------- */

static dg_status need_tok(const dg_model *m) {
  if (!m) return dg_seterr(DG_ERR_INVALID_ARG, "NULL model");
  if (!m->tok) return dg_seterr(DG_ERR_INVALID_ARG, "%s: the model was loaded without a tokenizer", m->dir);
  return DG_OK;
}

dg_status dg_tokenize(const dg_model *m, const char *text, size_t len, int parse_special, int32_t **ids,
                      size_t *n_ids) {
  DG_TRY(need_tok(m));
  if (!text || !ids || !n_ids) return dg_seterr(DG_ERR_INVALID_ARG, "dg_tokenize: NULL argument");
  return dg_tokenizer_encode(m->tok, text, len, parse_special, ids, n_ids);
}

dg_status dg_detokenize(const dg_model *m, const int32_t *ids, size_t n_ids, int keep_special, char **text) {
  DG_TRY(need_tok(m));
  if ((!ids && n_ids) || !text) return dg_seterr(DG_ERR_INVALID_ARG, "dg_detokenize: NULL argument");
  return dg_tokenizer_decode(m->tok, ids, n_ids, keep_special, text);
}

const char *dg_token_piece(const dg_model *m, int32_t id) {
  return m && m->tok ? dg_tokenizer_piece(m->tok, id) : NULL;
}

dg_status dg_chat_apply(const dg_model *m, const dg_chat_message *msgs, size_t n_msgs, int enable_thinking,
                        int32_t **ids, size_t *n_ids) {
  DG_TRY(need_tok(m));
  if ((!msgs && n_msgs) || !ids || !n_ids) return dg_seterr(DG_ERR_INVALID_ARG, "dg_chat_apply: NULL argument");
  return dg_chat_render(m->tok, msgs, n_msgs, enable_thinking, ids, n_ids);
}
