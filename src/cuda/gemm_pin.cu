/* gemm_pin.cu: cublasLt algorithms pinned for the dense products whose cuBLAS default is measurably slower than
 * another algorithm cuBLAS itself offers (issue 12). dev/cuda/gemm_lab.cu times every algorithm of
 * cublasLtMatmulAlgoGetHeuristic against cublasGemmEx's default for each dense product of a 26B-A4B decoder pass
 * on the H200 (docs/results/h200-s14/call2_gemm_lab.md): two shapes gain, the rest are within 3 %:
 *
 *   LM head       y[256, 262144] = x[256, 2816] E^T   0.590 -> 0.537 ms (82.5 -> 90.8 % of the floor)
 *   dense gate|up y[256, 4224]   = x[256, 2816] W^T   19.2 -> 17.5 us  (31 per pass: 30 layers and the SC MLP)
 *
 * A pin is a configuration (algorithm id, tile, stages, split-K 1, no reduction, CTA swizzling, custom option),
 * taken from cublasLt's own heuristic list for the shape (with the context's 32 MiB workspace) where an entry has
 * exactly that configuration, on a compute-capability 9.0 device (where they were measured). (Rebuilding it with
 * cublasLtMatmulAlgoInit and those attributes alone was refused on the H200, session 14: the Hopper kernels' cluster
 * and inner shapes are attributes too.) A fixed choice, so every run computes the same bits (an algorithm picked by timing
 * at start-up could differ between runs). Both pinned algorithms have split-K 1 (each output is one CTA's fp32 dot
 * product over k, as the default's) and gave the default's output bit for bit in the lab; test_gemm_pins checks them
 * against cublasGemmEx on the GPU. Off by default until measured in the backend: DGEMMA_GEMM_PIN=1 turns them on
 * (read when a context is made). The CPU
 * emulation (dev/cuda_emu) has no cublasLt: no pins there. */
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

#ifndef DG_CUDA_EMU
#include <cublasLt.h>

/* One pinned product: y[n, m] (fp32, ld m) = x[n, k] (bf16, ld k) W[m, k]^T (bf16 row-major), cuBLAS's
 * column-major (OP_T, OP_N, m, n, k); and the lab's configuration for it. */
struct gemm_pin_cfg {
  int m, n, k;
  int algo, tile, stages, splitk, red, swz, custom;
};
static const gemm_pin_cfg PIN_CFG[] = {
    {262144, 256, 2816, 66, 201, 35, 1, 0, 0, 2}, /* LM head of the 26B-A4B, canvas 256 */
    {4224, 256, 2816, 66, 17, 35, 1, 0, 0, 0},    /* dense MLP gate|up of the 26B-A4B, 256 rows */
};
#define N_PINS ((int)(sizeof PIN_CFG / sizeof PIN_CFG[0]))

struct dg_gemm_pin {
  int ok;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
struct dg_gemm_pins {
  cublasLtHandle_t lt;
  size_t ws_bytes; /* the context's cuBLAS workspace (c->blas_ws), shared: one stream uses both in order */
  dg_gemm_pin p[N_PINS];
  int n_ok;
};

/* Off unless DGEMMA_GEMM_PIN=1: the first H200 run of the pins (session 14) rebuilt them with
 * cublasLtMatmulAlgoInit, which cublasLt refused there; this form (the heuristic list's own entry) has not run on a
 * GPU yet. test_gemm_pins forces them on (gemm_pins_init's force) whatever the setting. */
static int pins_from_env(void) { return dg_sw_get(DG_SW_GEMM_PIN) == 1; } /* backend/switches.c */

/* The pins were measured on an H200: compute capability 9.0 only. */
int gemm_pins_device(void) {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 && minor == 0;
}

static void pin_free(dg_gemm_pin *p) {
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  memset(p, 0, sizeof *p);
}

static int cfg_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
  uint32_t v = 0;
  size_t w = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS ? (int)v : -1;
}

/* Pin i's descriptors and algorithm: the entry of cublasLt's own heuristic list for the shape (the context's
 * workspace) whose configuration is the pinned one, so that every attribute the pin does not name (the inner and
 * cluster shapes of Hopper's kernels) is cuBLAS's own; p->ok = 0 (and nothing held) when the list has no such entry
 * or cublasLt refuses it here. The list is a function of the shape, the device and the cuBLAS version: the same
 * algorithm every run. */
static void pin_init(cublasLtHandle_t lt, const gemm_pin_cfg *g, size_t ws_bytes, dg_gemm_pin *p) {
  memset(p, 0, sizeof *p);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulPreference_t pref = NULL;
  bool ok = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, g->k, g->m, g->k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, g->k, g->n, g->k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, g->m, g->n, g->m) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes) == CUBLAS_STATUS_SUCCESS;
  enum { NH = 32 };
  cublasLtMatmulHeuristicResult_t hr[NH];
  int nr = 0, found = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, NH, hr, &nr) == CUBLAS_STATUS_SUCCESS;
  for (int i = 0; ok && i < nr && !found; i++) {
    const cublasLtMatmulAlgo_t *a = &hr[i].algo;
    if (hr[i].state == CUBLAS_STATUS_SUCCESS && hr[i].workspaceSize <= ws_bytes &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_ID) == g->algo && cfg_attr(a, CUBLASLT_ALGO_CONFIG_TILE_ID) == g->tile &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID) == g->stages &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == g->splitk &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) == g->red &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) == g->swz &&
        cfg_attr(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) == g->custom) {
      p->algo = *a;
      found = 1;
    }
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  ok = ok && found;
  if (!ok) pin_free(p);
  p->ok = ok;
}

void gemm_pins_init(dg_cuda_ctx *c, size_t ws_bytes, int force) {
  c->pins = NULL;
  if (!(force || pins_from_env()) || !gemm_pins_device()) return;
  dg_gemm_pins *ps = (dg_gemm_pins *)calloc(1, sizeof *ps);
  if (!ps) return; /* no pins: the default products */
  if (cublasLtCreate(&ps->lt) != CUBLAS_STATUS_SUCCESS) { free(ps); return; }
  ps->ws_bytes = ws_bytes;
  for (int i = 0; i < N_PINS; i++) {
    pin_init(ps->lt, &PIN_CFG[i], ws_bytes, &ps->p[i]);
    ps->n_ok += ps->p[i].ok;
  }
  if (!ps->n_ok) { cublasLtDestroy(ps->lt); free(ps); return; }
  c->pins = ps;
}

void gemm_pins_free(dg_cuda_ctx *c) {
  dg_gemm_pins *ps = c->pins;
  if (!ps) return;
  for (int i = 0; i < N_PINS; i++) pin_free(&ps->p[i]);
  cublasLtDestroy(ps->lt);
  free(ps);
  c->pins = NULL;
}

int gemm_pin_shape(int i, int *m, int *n, int *k) {
  if (i < 0 || i >= N_PINS) return 0;
  *m = PIN_CFG[i].m; *n = PIN_CFG[i].n; *k = PIN_CFG[i].k;
  return 1;
}

int gemm_pinned(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const bf16 *W, int N, int K, float *y,
                           int ldy, dg_status *st) {
  dg_gemm_pins *ps = c->pins;
  if (!ps || ldx != K || ldy != N) return 0;
  for (int i = 0; i < N_PINS; i++) {
    const gemm_pin_cfg *g = &PIN_CFG[i];
    if (!ps->p[i].ok || g->m != N || g->n != T || g->k != K) continue;
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t s = cublasLtMatmul(ps->lt, ps->p[i].op, &one, W, ps->p[i].la, x, ps->p[i].lb, &zero, y,
                                            ps->p[i].lc, y, ps->p[i].lc, &ps->p[i].algo, c->blas_ws, ps->ws_bytes, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) { /* refused at run time: dropped, the caller's default product runs */
      pin_free(&ps->p[i]);
      ps->n_ok--;
      return 0;
    }
    *st = DG_OK;
    return 1;
  }
  return 0;
}
#else
void gemm_pins_init(dg_cuda_ctx *c, size_t, int) { c->pins = NULL; }
void gemm_pins_free(dg_cuda_ctx *c) { c->pins = NULL; }
int gemm_pin_shape(int, int *, int *, int *) { return 0; }
int gemm_pins_device(void) { return 0; }
int gemm_pinned(dg_cuda_ctx *, const bf16 *, int, int, const bf16 *, int, int, float *, int, dg_status *) {
  return 0;
}
#endif
