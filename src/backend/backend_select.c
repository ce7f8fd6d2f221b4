/* backend_select.c: which backend a model runs on (dg_backend_for, dg_model_load),
 * and the entry points that hand a pass to the context's backend table
 * (backend.h): contexts, prefill / commit, dg_decode, the turbo passes, device
 * information and stage profiling. Nothing here tests which backend it is;
 * the tables say what they do (optional slots are NULL).
 *
 * A CPU-only build has no CUDA table: asking for DG_DEVICE_CUDA gives
 * DG_ERR_BACKEND saying so. A build with CUDA keeps its table in a shared
 * object, libdgemma_cuda.so (src/backend/device.c and src/cuda/, linked with
 * cudart and cuBLAS), opened with dlopen the first time a CUDA device is
 * asked for, as ggml loads its backends: a CPU run never maps the CUDA
 * libraries. The plugin's calls into the library (dg_seterr, ...) resolve
 * to the program's own symbols (linked with -rdynamic), so errors reach
 * dg_last_error as before. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DG_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#endif

#include "backend/backend.h"
#include "backend/switches.h"
#include "base/dg_error.h"
#include "model/context.h"
#include "model/model.h"

#ifdef DG_HAVE_CUDA
#ifndef DG_CUDA_PLUGIN_DIR
#define DG_CUDA_PLUGIN_DIR "." /* the Makefile passes the build folder */
#endif
#define DG_CUDA_PLUGIN "libdgemma_cuda.so"

static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static const dg_backend *g_cuda;  /* the plugin's table once loaded */
static char g_cuda_why[2048];     /* why it did not load */

/* dlopen one candidate path; 0 when its table was found. */
static int cuda_try(const char *path, size_t *used) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const char *why = NULL;
  if (h) {
    const dg_backend *(*get)(void) = (const dg_backend *(*)(void))dlsym(h, "dg_backend_cuda");
    if (get && (g_cuda = get())) return 0;
    why = "no dg_backend_cuda in it";
    dlclose(h);
  } else {
    why = dlerror();
  }
  if (*used < sizeof g_cuda_why)
    *used += (size_t)snprintf(g_cuda_why + *used, sizeof g_cuda_why - *used, "%s%s (%s)", *used ? "; " : "", path,
                              why ? why : "?");
  return 1;
}

/* The plugin: $DGEMMA_CUDA_LIB if set, else next to the program, else in the build folder. */
static void cuda_load(void) {
  size_t used = 0;
  const char *env = getenv("DGEMMA_CUDA_LIB");
  if (env && *env) {
    cuda_try(env, &used);
    return;
  }
  char exe[PATH_MAX], path[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(path, sizeof path, "%s/" DG_CUDA_PLUGIN, exe);
    if (!cuda_try(path, &used)) return;
  }
  cuda_try(DG_CUDA_PLUGIN_DIR "/" DG_CUDA_PLUGIN, &used);
}
#endif

dg_status dg_backend_for(dg_device dev, const dg_backend **out) {
  *out = NULL;
  if (dev == DG_DEVICE_CPU) {
    *out = dg_backend_cpu();
    return DG_OK;
  }
  if (dev == DG_DEVICE_CUDA) {
#ifdef DG_HAVE_CUDA
    pthread_once(&g_cuda_once, cuda_load);
    if (!g_cuda)
      return dg_seterr(DG_ERR_BACKEND, "cannot load the CUDA backend %s: %s (DGEMMA_CUDA_LIB=PATH names it)",
                       DG_CUDA_PLUGIN, g_cuda_why);
    *out = g_cuda;
    return DG_OK;
#else
    return dg_seterr(DG_ERR_BACKEND, "this dgemma was built without CUDA (no nvcc found at build time, or CUDA=0); "
                                     "rebuild with nvcc on the PATH for --device cuda");
#endif
  }
  return dg_seterr(DG_ERR_INVALID_ARG, "unknown device %d (DG_DEVICE_CPU or DG_DEVICE_CUDA)", (int)dev);
}

dg_status dg_cuda_api_get(const struct dg_cuda_api **out) {
  const dg_backend *bk = NULL;
  *out = NULL;
  DG_TRY(dg_backend_for(DG_DEVICE_CUDA, &bk));
  *out = bk->api;
  return DG_OK;
}

dg_status dg_model_load(const char *dir, const dg_model_params *params, dg_model **out) {
  const dg_model_params p = params ? *params : dg_model_default_params();
  if (out) *out = NULL;
  DG_TRY(dg_switches_check(p.device)); /* before the load: DGEMMA_THP shapes its allocations */
  DG_TRY(dg_model_load_host(dir, params, out));
  dg_model *m = *out;
  const dg_backend *bk = NULL;
  dg_status st = dg_backend_for(p.device, &bk);
  if (!st) {
    m->bk = bk;
    st = bk->model_init(m, p.cuda_device);
  }
  if (st) {
    if (p.device == DG_DEVICE_CUDA) dg_prefixerr(st, "%s: --device cuda", dir);
    dg_model_free(m);
    *out = NULL;
  }
  return st;
}

/* ---- contexts ------------------------------------------------------------- */

dg_status dg_context_new(const dg_model *m, const dg_context_params *p, dg_context **out) {
  return dg_context_new_rows(m, p, 0, out);
}

dg_status dg_context_new_rows(const dg_model *m, const dg_context_params *p, int32_t rows, dg_context **out) {
  if (!m || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_context_new: NULL argument");
  *out = NULL;
  DG_TRY(dg_switches_check(m->bk == dg_backend_cpu() ? DG_DEVICE_CPU : DG_DEVICE_CUDA));
  const dg_config *c = &m->cfg;
  int32_t cap = p && p->max_context > 0 ? p->max_context : 4096;
  if (cap > c->max_position_embeddings) cap = c->max_position_embeddings;
  dg_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  ctx->m = m;
  ctx->cap = cap;
  ctx->full_window = p ? p->full_window_cache != 0 : 0;
  dg_status st = m->bk->ctx_init(ctx, rows);
  if (st) { dg_context_free(ctx); return st; }
  *out = ctx;
  return DG_OK;
}

void dg_context_free(dg_context *ctx) {
  if (!ctx) return;
  ctx->m->bk->ctx_free(ctx);
  free(ctx);
}

/* ---- passes --------------------------------------------------------------- */

dg_status dg_forward_encode(dg_context *ctx, const int32_t *ids, int32_t n) {
  if (n < 0 || (int64_t)ctx->len + n > ctx->cap)
    return dg_seterr(DG_ERR_CONTEXT_FULL, "encoding %d tokens after %d would exceed the context capacity of %d", n,
                     ctx->len, ctx->cap);
  return ctx->m->bk->encode(ctx, ids, n);
}

dg_status dg_encode(dg_context *ctx, const int32_t *ids, size_t n) {
  if (!ctx || (!ids && n)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_encode: NULL argument");
  if (n > (size_t)INT32_MAX) return dg_seterr(DG_ERR_INVALID_ARG, "dg_encode: %zu tokens is too many", n);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= ctx->m->cfg.vocab_size)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_encode: token id %d at index %zu is outside the vocabulary [0, %d)",
                       ids[i], i, ctx->m->cfg.vocab_size);
  return dg_forward_encode(ctx, ids, (int32_t)n);
}

dg_status dg_decode(dg_context *ctx, const int32_t *canvas, const float *sc_logits, float *logits_out) {
  if (!ctx || !canvas || !logits_out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_decode: NULL argument");
  for (int i = 0; i < ctx->m->cfg.canvas_length; i++)
    if (canvas[i] < 0 || canvas[i] >= ctx->m->cfg.vocab_size)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_decode: canvas id %d at position %d is outside the vocabulary [0, %d)",
                       canvas[i], i, ctx->m->cfg.vocab_size);
  /* processed logits are finite (softcap / T, t_min checked: dg_gen_params_check); a NaN or an infinity makes the
   * self-conditioning softmax NaN and every logit NaN, which had been returned as a success */
  if (sc_logits) {
    const size_t CV = (size_t)ctx->m->cfg.canvas_length * (size_t)ctx->m->cfg.vocab_size;
    for (size_t k = 0; k < CV; k++)
      if (!isfinite(sc_logits[k]))
        return dg_seterr(DG_ERR_INVALID_ARG, "dg_decode: sc_logits[%zu, %zu] = %g is not finite",
                         k / (size_t)ctx->m->cfg.vocab_size, k % (size_t)ctx->m->cfg.vocab_size, (double)sc_logits[k]);
  }
  return ctx->m->bk->decode(ctx, canvas, sc_logits, logits_out);
}

dg_status dg_forward_decode_rows(dg_context *ctx, const int32_t *canvas, const float *soft, const int32_t *rows,
                                 int32_t n_rows, float *raw) {
  return ctx->m->bk->decode_rows(ctx, canvas, soft ? DG_SC_HOST : DG_SC_NONE, soft, rows, n_rows, raw, NULL);
}

dg_status dg_compact_buffers(dg_context *ctx) { return ctx->m->bk->compact_prepare(ctx); }

dg_status dg_forward_compact_batch(dg_context *work, const dg_compact_seq *seqs, int32_t B) {
  return work->m->bk->compact_batch(work, seqs, B);
}

dg_status dg_forward_compact(dg_context *ctx, const int32_t *tok, const int32_t *pos, int32_t n, const float *soft,
                             const int32_t *head, int32_t nh, float *raw) {
  dg_compact_seq q = {ctx, tok, pos, n, soft, head, nh, raw, NULL, DG_SC_NONE, 0};
  return dg_forward_compact_batch(ctx, &q, 1);
}

/* ---- devices and profiling ------------------------------------------------- */

dg_status dg_device_info(dg_device dev, int index, char *buf, size_t n) {
  if (!buf || !n) return dg_seterr(DG_ERR_INVALID_ARG, "dg_device_info: no buffer");
  buf[0] = 0;
  const dg_backend *bk = NULL;
  DG_TRY(dg_backend_for(dev, &bk));
  return bk->info(index, buf, n);
}

dg_status dg_cpu_kernels(const char **name) {
  char why[256];
  const dg_kernels *k = dg_kernels_pick(getenv("DGEMMA_KERNELS"), why, sizeof why);
  if (name) *name = k->name;
  return why[0] ? dg_seterr(DG_ERR_INVALID_ARG, "%s", why) : DG_OK;
}

/* Here, beside the plugin's loader, because the CUDA plugin calls it (dg_cuda_ctx_new): a symbol of an object that
 * every program opening the plugin links. */
dg_status dg_cuda_enc_chunk(int32_t *chunk) {
  long v[2];
  const dg_status st = dg_sw_read(dg_sw_of(DG_SW_ENC_CHUNK), v); /* the table's DG_SW_ENC_CHUNK (switches.c) */
  if (chunk) *chunk = (int32_t)v[0];
  return st;
}

dg_status dg_context_profile(dg_context *ctx, int on) {
  if (!ctx || !ctx->m->bk->profile)
    return dg_seterr(DG_ERR_INVALID_ARG, "stage profiling needs a CUDA context (--device cuda)");
  return ctx->m->bk->profile(ctx, on);
}

dg_status dg_context_profile_read(dg_context *ctx, dg_profile *out) {
  if (!ctx || !ctx->m->bk->profile_read || !out)
    return dg_seterr(DG_ERR_INVALID_ARG, "stage profiling needs a CUDA context (--device cuda)");
  memset(out, 0, sizeof *out);
  return ctx->m->bk->profile_read(ctx, out);
}
