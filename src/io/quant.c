/* quant.c: MLX affine quantization (see quant.h): group parameters, packing,
 * dequantization, and the `quantization` block of config.json.
 *
 * Written from the rules read in ml-explore/mlx (mlx/backend/cpu/quantized.cpp
 * `quantize`, `extract_bits`; mlx/backend/metal/kernels/quantized.h
 * `affine_quantize`, `affine_dequantize`) and ml-explore/mlx-lm
 * (mlx_lm/utils.py `quantize_model`, `load_model`); no code is copied. */
#include "io/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/dg_error.h"
#include "base/dg_io.h"
#include "base/dg_json.h"

void dg_quant_group_params(const float *w, int n, int bits, float *scale, float *bias) {
  const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
  float w_min = INFINITY, w_max = 0.0f; /* Metal affine_quantize seeds w_max with 0 */
  for (int i = 0; i < n; i++) {
    w_min = w[i] < w_min ? w[i] : w_min;
    w_max = w[i] > w_max ? w[i] : w_max;
  }
  float s = (w_max - w_min) / n_bins;
  if (!(s > eps)) s = eps;
  int side = fabsf(w_min) > fabsf(w_max);
  if (!side) s = -s;
  float edge = side ? w_min : w_max;
  float q0 = roundf(edge / s);
  float b = 0.0f;
  if (q0 != 0.0f) {
    s = edge / q0;
    b = edge;
  }
  *scale = s;
  *bias = b;
}

uint32_t dg_quant_code_of(float w, float scale, float bias, int bits) {
  const float n_bins = (float)((1 << bits) - 1);
  float q = roundf((w - bias) / scale);
  if (!(q > 0.0f)) q = 0.0f; /* also maps NaN to 0 */
  if (q > n_bins) q = n_bins;
  return (uint32_t)q;
}

static void store_sb(dg_dtype t, void *p, int64_t i, float v) {
  switch (t) {
  case DG_BF16: { uint16_t h = dg_f32_to_bf16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
  case DG_F16: { uint16_t h = dg_f32_to_f16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
  default: memcpy((char *)p + 4 * i, &v, 4); break;
  }
}

int64_t dg_quant_row(const float *w, int64_t cols, int bits, int group_size, dg_dtype sb_dtype, uint8_t *packed,
                     void *scales, void *biases) {
  int64_t bad = -1;
  memset(packed, 0, (size_t)dg_quant_row_bytes(cols, bits));
  for (int64_t g = 0; g < cols / group_size; g++) {
    const float *wg = w + g * group_size;
    for (int i = 0; i < group_size && bad < 0; i++)
      if (!isfinite(wg[i])) bad = g * group_size + i;
    float s, b;
    dg_quant_group_params(wg, group_size, bits, &s, &b);
    for (int i = 0; i < group_size; i++) dg_quant_put(packed, bits, g * group_size + i, dg_quant_code_of(wg[i], s, b, bits));
    store_sb(sb_dtype, scales, g, s);
    store_sb(sb_dtype, biases, g, b);
  }
  return bad;
}

/* Row r of the quantized matrix w, element by element (w_k = code_k * scale + bias of its group): out[k] = w_k,
 * or with accumulate out[k] += a * w_k. */
static inline void quant_row_apply(const dg_weight *w, int64_t r, float *out, int accumulate, float a) {
  const int bits = w->bits, G = w->group_size;
  const uint8_t *row;
  const char *sr, *br;
  dg_quant_row_ptrs(w, r, &row, &sr, &br);
  for (int64_t g = 0; g < w->cols / G; g++) {
    float s = dg_load_elem(w->sb_dtype, sr, g), b = dg_load_elem(w->sb_dtype, br, g);
    for (int64_t k = g * G; k < (g + 1) * G; k++) {
      float wk = (float)dg_quant_code(row, bits, k) * s + b;
      if (accumulate) out[k] += a * wk;
      else out[k] = wk;
    }
  }
}

void dg_quant_dequant_row(const dg_weight *w, int64_t r, float *out) { quant_row_apply(w, r, out, 0, 0.0f); }

void dg_weight_axpy_row(float *y, float a, const dg_weight *w, int64_t r) {
  if (!w->bits) {
    const char *row = (const char *)w->data + (size_t)(r * w->cols) * dg_dtype_size(w->dtype);
    for (int64_t k = 0; k < w->cols; k++) y[k] += a * dg_load_elem(w->dtype, row, k);
    return;
  }
  quant_row_apply(w, r, y, 1, a);
}

void dg_weight_row_f32(const dg_weight *w, int64_t r, float *out) {
  if (w->bits) { dg_quant_dequant_row(w, r, out); return; }
  const char *row = (const char *)w->data + (size_t)(r * w->cols) * dg_dtype_size(w->dtype);
  for (int64_t k = 0; k < w->cols; k++) out[k] = dg_load_elem(w->dtype, row, k);
}

/* ---- config block ------------------------------------------------------- */

/* bits / group_size of one object (the block itself or a per-module entry). */
static dg_status parse_bits_group(const char *path, const char *where, const cJSON *o, int def_bits, int def_group,
                                  int *bits, int *group) {
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "bits");
  const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "group_size");
  const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
  *bits = def_bits;
  *group = def_group;
  /* range first: converting a double outside int's range is undefined (fuzz/regress/quant) */
  if (b) {
    if (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble))
      return dg_seterr(DG_ERR_CONFIG, "%s: %s.bits is %s, expected an integer", path, where, dg_json_kind(b));
    if (!(fabs(b->valuedouble) <= 1024))
      return dg_seterr(DG_ERR_CONFIG, "%s: %s.bits = %g is not supported (2, 3, 4, 6 or 8)", path, where,
                       b->valuedouble);
    *bits = (int)b->valuedouble;
  }
  if (g) {
    if (!cJSON_IsNumber(g) || g->valuedouble != floor(g->valuedouble))
      return dg_seterr(DG_ERR_CONFIG, "%s: %s.group_size is %s, expected an integer", path, where, dg_json_kind(g));
    if (!(fabs(g->valuedouble) <= 1 << 20))
      return dg_seterr(DG_ERR_CONFIG, "%s: %s.group_size = %g is not supported (32, 64 or 128)", path, where,
                       g->valuedouble);
    *group = (int)g->valuedouble;
  }
  if (mode && (!cJSON_IsString(mode) || strcmp(mode->valuestring, "affine") != 0))
    return dg_seterr(DG_ERR_CONFIG, "%s: %s.mode = %s%s%s is not supported (only \"affine\")", path, where,
                     cJSON_IsString(mode) ? "\"" : "", cJSON_IsString(mode) ? mode->valuestring : dg_json_kind(mode),
                     cJSON_IsString(mode) ? "\"" : "");
  if (!dg_quant_bits_ok(*bits))
    return dg_seterr(DG_ERR_CONFIG, "%s: %s.bits = %d is not supported (2, 3, 4, 6 or 8)", path, where, *bits);
  if (!dg_quant_group_ok(*group))
    return dg_seterr(DG_ERR_CONFIG, "%s: %s.group_size = %d is not supported (32, 64 or 128)", path, where, *group);
  return DG_OK;
}

dg_status dg_quant_config_load(const char *path, dg_quant_config *qc) {
  memset(qc, 0, sizeof *qc);
  char *text = NULL;
  size_t len = 0;
  DG_TRY(dg_read_file(path, 0, &text, &len));
  dg_status st = dg_quant_config_parse(path, text, len, qc);
  free(text);
  return st;
}

dg_status dg_quant_config_parse(const char *path, const char *text, size_t len, dg_quant_config *qc) {
  memset(qc, 0, sizeof *qc);
  cJSON *j = cJSON_ParseWithLength(text ? text : "", len);
  if (!j) return dg_seterr(DG_ERR_JSON, "%s: not valid JSON", path);
  dg_status st = DG_OK;
  const char *key = "quantization";
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization");
  if (!q) { q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config"); key = "quantization_config"; }
  if (!q) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
    if (cJSON_IsObject(tc)) { q = cJSON_GetObjectItemCaseSensitive(tc, "quantization"); key = "text_config.quantization"; }
  }
  if (!q || cJSON_IsNull(q)) goto done;
  if (!cJSON_IsObject(q)) {
    st = dg_seterr(DG_ERR_CONFIG, "%s: %s is %s, expected an object", path, key, dg_json_kind(q));
    goto done;
  }
  if (strcmp(key, "quantization_config") == 0 && !cJSON_GetObjectItemCaseSensitive(q, "bits")) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    st = dg_seterr(DG_ERR_CONFIG, "%s: quantization_config (quant_method %s) is not an MLX affine block", path,
                   cJSON_IsString(m) ? m->valuestring : "missing");
    goto done;
  }
  qc->present = 1;
  if ((st = parse_bits_group(path, key, q, 4, 64, &qc->bits, &qc->group_size))) goto done;
  {
    const char *parent = NULL;
    int oom = 0;
    const cJSON *d = dg_json_repeated_key(q, &parent, &oom);
    if (oom || d) { /* mlx-lm's json.load keeps the last of a repeated module, cJSON the first */
      st = oom ? dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory")
               : dg_seterr(DG_ERR_CONFIG, "%s: %s: key \"%s\" appears twice in \"%s\"", path, key, d->string,
                           parent ? parent : key);
      goto done;
    }
  }
  int n = 0;
  for (const cJSON *e = q->child; e; e = e->next) n += cJSON_IsObject(e) || cJSON_IsFalse(e);
  qc->ov = calloc((size_t)(n ? n : 1), sizeof *qc->ov);
  if (!qc->ov) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); goto done; }
  for (const cJSON *e = q->child; e; e = e->next) {
    if (!cJSON_IsObject(e) && !cJSON_IsFalse(e)) continue; /* bits, group_size, mode, ... */
    dg_quant_override *o = &qc->ov[qc->n_ov];
    o->path = strdup(e->string);
    if (!o->path) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); goto done; }
    qc->n_ov++;
    if (cJSON_IsFalse(e)) continue;
    o->quantized = 1;
    char where[512];
    snprintf(where, sizeof where, "%s[\"%s\"]", key, e->string);
    if ((st = parse_bits_group(path, where, e, qc->bits, qc->group_size, &o->bits, &o->group_size))) goto done;
  }
done:
  cJSON_Delete(j);
  if (st) dg_quant_config_free(qc);
  return st;
}

void dg_quant_config_free(dg_quant_config *qc) {
  if (!qc) return;
  for (int i = 0; i < qc->n_ov; i++) free(qc->ov[i].path);
  free(qc->ov);
  memset(qc, 0, sizeof *qc);
}

int dg_quant_config_lookup(const dg_quant_config *qc, const char *path, int *bits, int *group_size) {
  *bits = qc->bits;
  *group_size = qc->group_size;
  for (int i = 0; i < qc->n_ov; i++)
    if (strcmp(qc->ov[i].path, path) == 0) {
      if (!qc->ov[i].quantized) return 0;
      *bits = qc->ov[i].bits;
      *group_size = qc->ov[i].group_size;
      return 1;
    }
  return 1;
}
