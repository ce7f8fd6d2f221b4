/* quantize.c: dg_quantize, the library side of `dgemma quantize`: a float
 * (bf16/f16/f32) DiffusionGemma directory in, an MLX-layout affine-quantized
 * directory out (spec 3.2, quant.h):
 *  - every quantized module <m> becomes <m>.weight (U32 packed codes),
 *    <m>.scales and <m>.biases (in the checkpoint's float dtype);
 *  - expert stacks take MLX's names (experts.gate_up_proj -> .weight), as
 *    mlx-vlm's sanitize does; every other tensor is copied unchanged;
 *  - config.json gains "quantization" (and the "quantization_config" mirror):
 *    {"group_size", "bits", "mode": "affine"} plus one entry per module whose
 *    bits or group size differ from those defaults (mlx-lm's quantize_model);
 *  - modules whose input dimension the group size does not divide stay float
 *    (mlx-lm quantize_model's wrapped_predicate), as do modules the recipe
 *    keeps in float; neither gets an entry (MLX's loader then finds no
 *    <m>.scales and keeps them float);
 *  - shards of at most max_shard_bytes (model-0000i-of-0000N.safetensors, or
 *    model.safetensors when one is enough) + model.safetensors.index.json;
 *  - every other regular file of the input (tokenizer.json,
 *    generation_config.json, ...) is copied.
 * Quantization itself: quant.h (dg_quant_row), one row at a time, rows in
 * parallel (results do not depend on the thread count). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "writers/ckpt_write.h"
#include "base/dg_error.h"
#include "base/dg_io.h"
#include "dgemma.h"
#include "dgemma_tools.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "base/weight.h"

static const char *const CLASS_NAMES[DG_QCLASS_COUNT] = {"embed", "attn", "mlp", "router", "experts", "sc"};

dg_quantize_params dg_quantize_default_params(void) {
  dg_quantize_params p;
  memset(&p, 0, sizeof p);
  p.bits = 4;
  p.group_size = 64;
  p.max_shard_bytes = 5000000000LL;
  return p;
}

/* one SPEC of a recipe: "B", "B:G", or a float keyword */
static dg_status parse_spec(const char *recipe, const char *cls, const char *v, size_t n, int def_group,
                            dg_quant_class_spec *out) {
  char buf[32];
  if (n == 0 || n >= sizeof buf)
    return dg_seterr(DG_ERR_INVALID_ARG, "recipe \"%s\": %s has an empty or too long value", recipe, cls);
  memcpy(buf, v, n);
  buf[n] = 0;
  if (!strcmp(buf, "bf16") || !strcmp(buf, "f16") || !strcmp(buf, "float") || !strcmp(buf, "none") ||
      !strcmp(buf, "keep")) {
    out->bits = 0;
    out->group_size = 0;
    return DG_OK;
  }
  char *end;
  long b = strtol(buf, &end, 10), g = def_group;
  if (end == buf) goto bad;
  if (*end == ':') {
    char *e2;
    g = strtol(end + 1, &e2, 10);
    if (e2 == end + 1 || *e2) goto bad;
  } else if (*end) {
    goto bad;
  }
  if (!dg_quant_bits_ok((int)b))
    return dg_seterr(DG_ERR_INVALID_ARG, "recipe \"%s\": %s=%s: bits %ld is not supported (2, 3, 4, 6 or 8)", recipe,
                     cls, buf, b);
  if (!dg_quant_group_ok((int)g))
    return dg_seterr(DG_ERR_INVALID_ARG, "recipe \"%s\": %s=%s: group size %ld is not supported (32, 64 or 128)",
                     recipe, cls, buf, g);
  out->bits = (int)b;
  out->group_size = (int)g;
  return DG_OK;
bad:
  return dg_seterr(DG_ERR_INVALID_ARG,
                   "recipe \"%s\": %s=%s is not BITS, BITS:GROUP or bf16 (e.g. experts=3, attn=8:32, embed=bf16)",
                   recipe, cls, buf);
}

dg_status dg_quant_recipe_parse(const char *recipe, int bits, int group_size, dg_quant_recipe *out) {
  if (!out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_quant_recipe_parse: NULL argument");
  if (!dg_quant_bits_ok(bits))
    return dg_seterr(DG_ERR_INVALID_ARG, "--bits %d is not supported (2, 3, 4, 6 or 8)", bits);
  if (!dg_quant_group_ok(group_size))
    return dg_seterr(DG_ERR_INVALID_ARG, "--group-size %d is not supported (32, 64 or 128)", group_size);
  for (int c = 0; c < DG_QCLASS_COUNT; c++) out->cls[c] = (dg_quant_class_spec){bits, group_size};
  out->bits = bits;
  out->group_size = group_size;
  if (!recipe || !*recipe) return DG_OK;
  const char *p = recipe;
  while (*p) {
    while (*p == ',' || isspace((unsigned char)*p)) p++;
    if (!*p) break;
    const char *tok = p;
    while (*p && *p != ',') p++;
    size_t n = (size_t)(p - tok);
    while (n && isspace((unsigned char)tok[n - 1])) n--;
    const char *eq = memchr(tok, '=', n);
    if (!eq) {
      /* mlx-vlm's choice for this model (Blaizzy/mlx-vlm, mlx_vlm/models/diffusion_gemma/
       * diffusion_gemma.py: quant_predicate): embed_tokens, mlp.{gate,up,down}_proj,
       * .self_attn.* and router at {group_size 64, bits 8}, the rest at the defaults */
      if (n == 3 && !strncmp(tok, "mlx", 3)) {
        for (int c = DG_QCLASS_EMBED; c <= DG_QCLASS_ROUTER; c++) out->cls[c] = (dg_quant_class_spec){8, 64};
        continue;
      }
      return dg_seterr(DG_ERR_INVALID_ARG, "recipe \"%s\": \"%.*s\" is neither CLASS=SPEC nor a preset (mlx)", recipe,
                       (int)n, tok);
    }
    size_t kn = (size_t)(eq - tok);
    int c = -1;
    for (int i = 0; i < DG_QCLASS_COUNT; i++)
      if (strlen(CLASS_NAMES[i]) == kn && !strncmp(CLASS_NAMES[i], tok, kn)) c = i;
    if (!strncmp(tok, "all", kn) && kn == 3) c = DG_QCLASS_COUNT;
    if (c < 0)
      return dg_seterr(DG_ERR_INVALID_ARG,
                       "recipe \"%s\": unknown class \"%.*s\" (embed, attn, mlp, router, experts, sc, all)", recipe,
                       (int)kn, tok);
    dg_quant_class_spec sp;
    char cname[16];
    snprintf(cname, sizeof cname, "%.*s", (int)kn, tok);
    DG_TRY(parse_spec(recipe, cname, eq + 1, n - kn - 1, group_size, &sp));
    if (c == DG_QCLASS_COUNT)
      for (int i = 0; i < DG_QCLASS_COUNT; i++) out->cls[i] = sp;
    else
      out->cls[c] = sp;
  }
  return DG_OK;
}

int dg_quant_class_of(const char *name) {
  static const char pre[] = "model.decoder.";
  if (strncmp(name, pre, sizeof pre - 1) != 0) return -1;
  const char *r = name + sizeof pre - 1;
  if (!strcmp(r, "embed_tokens.weight")) return DG_QCLASS_EMBED;
  if (!strncmp(r, "self_conditioning.", 18)) {
    r += 18;
    return !strcmp(r, "gate_proj.weight") || !strcmp(r, "up_proj.weight") || !strcmp(r, "down_proj.weight")
               ? DG_QCLASS_SC
               : -1;
  }
  if (strncmp(r, "layers.", 7) != 0) return -1;
  r += 7;
  while (isdigit((unsigned char)*r)) r++;
  if (*r++ != '.') return -1;
  static const struct { const char *suffix; int cls; } S[] = {
      {"self_attn.q_proj.weight", DG_QCLASS_ATTN},   {"self_attn.k_proj.weight", DG_QCLASS_ATTN},
      {"self_attn.v_proj.weight", DG_QCLASS_ATTN},   {"self_attn.o_proj.weight", DG_QCLASS_ATTN},
      {"mlp.gate_proj.weight", DG_QCLASS_MLP},       {"mlp.up_proj.weight", DG_QCLASS_MLP},
      {"mlp.down_proj.weight", DG_QCLASS_MLP},       {"router.proj.weight", DG_QCLASS_ROUTER},
      {"experts.gate_up_proj", DG_QCLASS_EXPERTS},   {"experts.down_proj", DG_QCLASS_EXPERTS},
      {"experts.gate_up_proj.weight", DG_QCLASS_EXPERTS}, {"experts.down_proj.weight", DG_QCLASS_EXPERTS}};
  for (size_t i = 0; i < sizeof S / sizeof S[0]; i++)
    if (!strcmp(r, S[i].suffix)) return S[i].cls;
  return -1;
}

/* ---- planning ------------------------------------------------------------ */

typedef struct out_tensor {
  char name[320];
  dg_dtype dtype;
  int ndim;
  int64_t shape[DG_MAX_DIMS];
  size_t nbytes;
  void *data;       /* filled when its shard is written */
} out_tensor;

typedef struct plan_item {
  const dg_tensor *in;
  int bits, group_size;  /* 0 = copied */
  int cls;
  char module[300];
  int shard;
  int n_out;             /* 1 (copy) or 3 (weight, scales, biases) */
  out_tensor out[3];
} plan_item;

static const char *plan_module(const void *items, size_t i, int *bits, int *group_size) {
  const plan_item *it = (const plan_item *)items + i;
  *bits = it->bits;
  *group_size = it->group_size;
  return it->module;
}

int dg_quant_config_block(cJSON *cfg, int bits, int group_size, const void *items, size_t n,
                          dg_quant_module_fn item) {
  cJSON *q = cJSON_CreateObject();
  if (!q || !cJSON_AddNumberToObject(q, "group_size", group_size) || !cJSON_AddNumberToObject(q, "bits", bits) ||
      !cJSON_AddStringToObject(q, "mode", "affine")) {
    cJSON_Delete(q);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    int b, g;
    const char *module = item(items, i, &b, &g);
    if (!b || (b == bits && g == group_size)) continue;
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddNumberToObject(o, "group_size", g) || !cJSON_AddNumberToObject(o, "bits", b)) {
      cJSON_Delete(o);
      cJSON_Delete(q);
      return -1;
    }
    cJSON_AddItemToObject(q, module, o);
  }
  cJSON *q2 = cJSON_Duplicate(q, 1);
  if (!q2) {
    cJSON_Delete(q);
    return -1;
  }
  cJSON_AddItemToObject(cfg, "quantization", q);
  cJSON_AddItemToObject(cfg, "quantization_config", q2);
  return 0;
}

/* What the row loop of materialize reads and writes. */
typedef struct q_rows {
  const plan_item *it;
  dg_weight src;           /* the float tensor as [rows, cols] */
  size_t rb, sbb;          /* bytes per row of the codes, of the scales (= of the biases) */
  int64_t bad_row, bad_col; /* the first non-finite value, -1 if none */
} q_rows;

/* Quantize row r of the tensor (row: the thread's scratch). */
static void quantize_row(void *ctx, int64_t r, float *row) {
  q_rows *q = ctx;
  const plan_item *it = q->it;
  const int64_t cols = q->src.cols;
  dg_weight_row_f32(&q->src, r, row);
  int64_t b = dg_quant_row(row, cols, it->bits, it->group_size, q->src.dtype, (uint8_t *)it->out[0].data + r * q->rb,
                           (char *)it->out[1].data + r * q->sbb, (char *)it->out[2].data + r * q->sbb);
  if (b >= 0) {
#pragma omp critical(dg_quant_bad)
    if (q->bad_row < 0 || r < q->bad_row) { q->bad_row = r; q->bad_col = b; }
  }
}

/* The index of the first NaN or infinity of a floating-point tensor (F32, F16, BF16, F64: all-ones
 * exponent), -1 if none or if the tensor holds integers. */
static int64_t first_nonfinite(const dg_tensor *t) {
  const size_t es = dg_dtype_size(t->dtype);
  if (!es || t->nbytes % es) return -1;
  const int64_t n = (int64_t)(t->nbytes / es);
  const unsigned char *p = t->data;
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype == DG_BF16 || t->dtype == DG_F16) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      const uint16_t e = t->dtype == DG_BF16 ? 0x7F80 : 0x7C00;
      if ((h & e) == e) return i;
    } else if (t->dtype == DG_F32) {
      uint32_t w;
      memcpy(&w, p + 4 * i, 4);
      if ((w & 0x7F800000u) == 0x7F800000u) return i;
    } else if (t->dtype == DG_F64) {
      uint64_t w;
      memcpy(&w, p + 8 * i, 8);
      if ((w & 0x7FF0000000000000ull) == 0x7FF0000000000000ull) return i;
    } else {
      return -1; /* integers and booleans are always finite */
    }
  }
  return -1;
}

/* Quantize (or copy) one planned tensor into freshly allocated out[] buffers. */
static dg_status materialize(plan_item *it, int n_threads) {
  const dg_tensor *t = it->in;
  if (!it->bits) {
    /* a tensor copied as it is (a norm weight, a layer scalar, a matrix the recipe keeps in float)
     * must be finite too: a NaN there would make the output a model that does not run */
    const int64_t bad = first_nonfinite(t);
    if (bad >= 0) {
      double v;
      if (t->dtype == DG_F64) memcpy(&v, (const char *)t->data + 8 * bad, 8);
      else v = (double)dg_load_elem(t->dtype, t->data, bad);
      char shape[160];
      size_t k = (size_t)snprintf(shape, sizeof shape, "[");
      for (int d = 0; d < t->ndim && k < sizeof shape; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
      if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
      return dg_seterr(DG_ERR_NUMERIC, "%s: tensor %s holds the non-finite value %s at element %lld (%s %s); cannot "
                       "quantize", t->file, t->name, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", (long long)bad,
                       dg_dtype_name(t->dtype), shape);
    }
    it->out[0].data = malloc(t->nbytes ? t->nbytes : 1);
    if (!it->out[0].data) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory copying %s", t->name);
    memcpy(it->out[0].data, t->data, t->nbytes);
    return DG_OK;
  }
  for (int k = 0; k < 3; k++) {
    it->out[k].data = calloc(it->out[k].nbytes ? it->out[k].nbytes : 1, 1);
    if (!it->out[k].data) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory quantizing %s", t->name);
  }
  const int64_t cols = t->shape[t->ndim - 1];
  int64_t rows = 1;
  for (int i = 0; i < t->ndim - 1; i++) rows *= t->shape[i];
  q_rows q = {.it = it,
              .src = {.dtype = t->dtype, .data = t->data, .rows = rows, .cols = cols},
              .rb = (size_t)dg_quant_row_bytes(cols, it->bits),
              .sbb = (size_t)(cols / it->group_size) * dg_dtype_size(t->dtype),
              .bad_row = -1,
              .bad_col = -1};
  if (dg_ckpt_rows_parallel(rows, cols, n_threads, quantize_row, &q))
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory quantizing %s", t->name);
  if (q.bad_row >= 0)
    return dg_seterr(DG_ERR_NUMERIC, "%s: tensor %s holds a non-finite value at row %lld, column %lld; cannot quantize",
                     t->file, t->name, (long long)q.bad_row, (long long)q.bad_col);
  return DG_OK;
}

static void free_outputs(plan_item *it) {
  for (int k = 0; k < it->n_out; k++) { free(it->out[k].data); it->out[k].data = NULL; }
}

static int cmp_dtype_desc(const void *a, const void *b) {
  const dg_tensor *x = a, *y = b;
  size_t sx = dg_dtype_size(x->dtype), sy = dg_dtype_size(y->dtype);
  if (sx != sy) return sx > sy ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Refuse to write into a non-empty directory (an absent one is fine). */
static dg_status check_out_dir(const char *out_dir) {
  int ne = dg_ckpt_dir_nonempty(out_dir);
  if (ne > 0) return dg_seterr(DG_ERR_INVALID_ARG, "%s: output directory is not empty", out_dir);
  if (ne < 0 && errno != ENOENT)
    return dg_seterr(DG_ERR_IO, "%s: cannot open directory: %s", out_dir, strerror(errno));
  return DG_OK;
}

/* in_dir/config.json (path: its name) as text and JSON; it must be an object
 * without a quantization block. */
static dg_status read_config(const char *path, char **text, cJSON **cfg) {
  size_t len;
  DG_TRY(dg_read_file(path, 0, text, &len));
  *cfg = cJSON_ParseWithLength(*text, len);
  if (!*cfg || !cJSON_IsObject(*cfg)) return dg_seterr(DG_ERR_JSON, "%s: not a JSON object", path);
  if (cJSON_GetObjectItemCaseSensitive(*cfg, "quantization"))
    return dg_seterr(DG_ERR_INVALID_ARG,
                     "%s: the input already has a quantization block (requantizing is not supported)", path);
  return DG_OK;
}

/* What input tensor t becomes under recipe rc: its bits (0 = copied), its
 * module, and the names, shapes and sizes of its one or three outputs;
 * counts it in res. */
static dg_status plan_tensor(plan_item *it, const dg_tensor *t, const dg_quant_recipe *rc, dg_quantize_result *res) {
  it->in = t;
  it->cls = dg_quant_class_of(t->name);
  res->bytes_in += (int64_t)t->nbytes;
  if (t->dtype == DG_U32 && it->cls >= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor %s is already U32 (quantized); requantizing is not supported",
                     t->file, t->name);
  int64_t in_dim = t->ndim >= 2 ? t->shape[t->ndim - 1] : 0;
  if (it->cls >= 0 && (t->dtype == DG_BF16 || t->dtype == DG_F16 || t->dtype == DG_F32) && t->ndim >= 2) {
    const dg_quant_class_spec *sp = &rc->cls[it->cls];
    if (!sp->bits) res->n_kept_float++;
    else if (in_dim % sp->group_size) res->n_indivisible++;
    else { it->bits = sp->bits; it->group_size = sp->group_size; }
  }
  dg_ckpt_module_name(it->module, sizeof it->module, t->name);
  if (it->bits) {
    it->n_out = 3;
    const char *sfx[3] = {"weight", "scales", "biases"};
    for (int k = 0; k < 3; k++) {
      out_tensor *o = &it->out[k];
      snprintf(o->name, sizeof o->name, "%s.%s", it->module, sfx[k]);
      o->ndim = t->ndim;
      memcpy(o->shape, t->shape, sizeof o->shape);
      o->shape[t->ndim - 1] = k == 0 ? in_dim * it->bits / 32 : in_dim / it->group_size;
      o->dtype = k == 0 ? DG_U32 : t->dtype;
      size_t ne = 1;
      for (int d = 0; d < o->ndim; d++) ne *= (size_t)o->shape[d];
      o->nbytes = ne * dg_dtype_size(o->dtype);
    }
    res->n_quantized++;
  } else {
    it->n_out = 1;
    out_tensor *o = &it->out[0];
    /* MLX names every expert stack "<...>.weight" (mlx-vlm sanitize) */
    if (it->cls == DG_QCLASS_EXPERTS && !dg_ckpt_has_suffix(t->name, ".weight"))
      snprintf(o->name, sizeof o->name, "%s.weight", t->name);
    else
      snprintf(o->name, sizeof o->name, "%s", t->name);
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    memcpy(o->shape, t->shape, sizeof o->shape);
    o->nbytes = t->nbytes;
  }
  return DG_OK;
}

/* Plan every tensor of in (items: n of them) and put them, in order, into
 * shards of at most max_shard_bytes (a bigger tensor gets one of its own). */
static dg_status plan_all(plan_item *items, size_t n, const dg_safetensors *in, const dg_quant_recipe *rc,
                          int64_t max_shard_bytes, dg_quantize_result *res) {
  int64_t shard_bytes = 0, total_out = 0;
  int n_shards = 1;
  for (size_t i = 0; i < n; i++) {
    plan_item *it = &items[i];
    DG_TRY(plan_tensor(it, dg_st_at(in, i), rc, res));
    int64_t b = 0;
    for (int k = 0; k < it->n_out; k++) b += (int64_t)it->out[k].nbytes;
    if (shard_bytes > 0 && shard_bytes + b > max_shard_bytes) { n_shards++; shard_bytes = 0; }
    it->shard = n_shards - 1;
    shard_bytes += b;
    total_out += b;
  }
  res->bytes_out = total_out;
  res->n_shards = n_shards;
  return DG_OK;
}

/* Write shard s (file shard_name in tmp): materialize its tensors one by one
 * (reporting progress; *done_bytes counts the input bytes done), list them
 * in wmap, write the file, free the outputs. */
static dg_status write_shard(plan_item *items, size_t n, int s, const char *shard_name, const char *tmp,
                             const dg_quantize_params *p, int nt, cJSON *wmap, int64_t *done_bytes,
                             int64_t bytes_in) {
  size_t cnt = 0;
  for (size_t i = 0; i < n; i++) cnt += items[i].shard == s ? (size_t)items[i].n_out : 0;
  dg_tensor *ts = calloc(cnt ? cnt : 1, sizeof *ts);
  if (!ts) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  dg_status st = DG_OK;
  size_t k = 0;
  for (size_t i = 0; i < n && !st; i++) {
    plan_item *it = &items[i];
    if (it->shard != s) continue;
    if (p->progress && p->progress(*done_bytes, bytes_in, it->in->name, p->user_data)) {
      st = dg_seterr(DG_ERR_ABORTED, "quantize: stopped by the progress callback at %s", it->in->name);
      break;
    }
    if ((st = materialize(it, nt))) break;
    *done_bytes += (int64_t)it->in->nbytes;
    for (int j = 0; j < it->n_out; j++) {
      out_tensor *o = &it->out[j];
      dg_tensor *d = &ts[k++];
      d->name = o->name;
      d->dtype = o->dtype;
      d->ndim = o->ndim;
      memcpy(d->shape, o->shape, sizeof d->shape);
      d->data = o->data;
      d->nbytes = o->nbytes;
      cJSON_AddStringToObject(wmap, o->name, shard_name);
    }
  }
  if (!st) {
    char path[4096];
    qsort(ts, k, sizeof *ts, cmp_dtype_desc); /* U32/F32 first keeps every tensor aligned */
    snprintf(path, sizeof path, "%s/%s", tmp, shard_name);
    const char *mk[1] = {"format"}, *mv[1] = {"mlx"};
    st = dg_st_write(path, ts, k, mk, mv, 1);
  }
  for (size_t i = 0; i < n; i++)
    if (items[i].shard == s) free_outputs(&items[i]);
  free(ts);
  return st;
}

/* Every shard, then model.safetensors.index.json, into tmp. */
static dg_status write_shards(plan_item *items, size_t n, const char *tmp, const dg_quantize_params *p, int nt,
                              const dg_quantize_result *res) {
  cJSON *wmap;
  cJSON *index = dg_ckpt_index_new(res->bytes_out, &wmap);
  int64_t done_bytes = 0;
  dg_status st = DG_OK;
  for (int s = 0; s < res->n_shards && !st; s++) {
    char shard_name[64];
    dg_ckpt_shard_name(shard_name, sizeof shard_name, s, res->n_shards);
    st = write_shard(items, n, s, shard_name, tmp, p, nt, wmap, &done_bytes, res->bytes_in);
  }
  if (!st) st = dg_ckpt_write_index(tmp, index, 1);
  cJSON_Delete(index);
  return st;
}

/* The input's files copied besides the shards: all but config.json (written
 * anew), the index and the dot files. */
static int is_other_file(const char *nm) {
  return !(nm[0] == '.' || !strcmp(nm, "config.json") || !strcmp(nm, "model.safetensors.index.json") ||
           dg_ckpt_has_suffix(nm, ".safetensors"));
}

dg_status dg_quantize(const char *in_dir, const char *out_dir, const dg_quantize_params *params,
                      dg_quantize_result *result) {
  if (!in_dir || !out_dir) return dg_seterr(DG_ERR_INVALID_ARG, "dg_quantize: NULL directory");
  dg_quantize_params p = params ? *params : dg_quantize_default_params();
  dg_quant_recipe rc;
  DG_TRY(dg_quant_recipe_parse(p.recipe, p.bits, p.group_size, &rc));
  if (p.max_shard_bytes <= 0) p.max_shard_bytes = 5000000000LL;
  int nt = p.n_threads > 0 ? p.n_threads : 1;
  dg_quantize_result res;
  memset(&res, 0, sizeof res);

  char path[4096];
  dg_status st = DG_OK;
  dg_safetensors *in = NULL;
  plan_item *items = NULL;
  cJSON *cfg = NULL;
  char *text = NULL;
  size_t n = 0;

  /* write into a temporary sibling, renamed to out_dir only when complete (dg_outdir_begin) */
  DG_TRY(check_out_dir(out_dir));
  char tmp[2048]; /* shorter than path[]: room for the file names */
  DG_TRY(dg_outdir_begin(out_dir, tmp, sizeof tmp, p.on_tmp_dir, p.user_data));

  snprintf(path, sizeof path, "%s/config.json", in_dir);
  if ((st = read_config(path, &text, &cfg))) goto done;
  if ((st = dg_st_open_dir(in_dir, &in))) goto done;
  n = dg_st_count(in);
  items = calloc(n ? n : 1, sizeof *items);
  if (!items) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory"); goto done; }
  if ((st = plan_all(items, n, in, &rc, p.max_shard_bytes, &res))) goto done;
  if ((st = write_shards(items, n, tmp, &p, nt, &res))) goto done;

  /* config.json with the quantization block (top level, as mlx-lm writes it) */
  snprintf(path, sizeof path, "%s/config.json", tmp);
  if (dg_quant_config_block(cfg, rc.bits, rc.group_size, items, n, plan_module))
    st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  else
    st = dg_ckpt_write_json(path, cfg, 1);
  /* every other file (tokenizer.json, generation_config.json, ...) */
  if (!st) st = dg_ckpt_copy_files(in_dir, tmp, is_other_file, NULL);
  /* the last chance to stop (an interrupt), then the complete directory appears at once */
  if (!st && p.progress && p.progress(res.bytes_in, res.bytes_in, "", p.user_data))
    st = dg_seterr(DG_ERR_ABORTED, "quantize: stopped by the progress callback before %s was complete", out_dir);
  if (!st) st = dg_outdir_commit(tmp, out_dir);
done:
  if (st) dg_outdir_discard(tmp);
  if (p.on_tmp_dir) p.on_tmp_dir(NULL, p.user_data); /* renamed or removed */
  if (items)
    for (size_t i = 0; i < n; i++) free_outputs(&items[i]);
  free(items);
  cJSON_Delete(cfg);
  free(text);
  dg_st_close(in);
  if (result) *result = res;
  return st;
}
