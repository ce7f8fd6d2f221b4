/* gemm_pin.cu: cublasLt algorithms pinned for the dense products whose cuBLAS default is measurably slower than
 * another algorithm cuBLAS itself offers (issue 12). dev/cuda/gemm_lab.cu times every algorithm of
 * cublasLtMatmulAlgoGetHeuristic against cublasGemmEx's default for each dense product of a 26B-A4B decoder pass
 * on the H200 (docs/results/h200-s14/gemm_lab.md): two shapes gain, the rest are within 3 %:
 *
 *   LM head       y[256, 262144] = x[256, 2816] E^T   0.590 -> 0.537 ms (82.5 -> 90.8 % of the floor)
 *   dense gate|up y[256, 4224]   = x[256, 2816] W^T   19.2 -> 17.5 us  (31 per pass: 30 layers and the SC MLP)
 *
 * A pin is a configuration (algorithm id, tile, stages, split-K 1, no reduction, CTA swizzling, custom option),
 * rebuilt with cublasLtMatmulAlgoInit and accepted only if cublasLtMatmulAlgoCheck accepts it on this device with
 * the context's 32 MiB workspace, on a compute-capability 9.0 device (where they were measured): a fixed choice, so every run computes the same bits (an algorithm picked by timing
 * at start-up could differ between runs). Both pinned algorithms have split-K 1 (each output is one CTA's fp32 dot
 * product over k, as the default's) and gave the default's output bit for bit in the lab; test_gemm_pins checks them
 * against cublasGemmEx on the GPU. DGEMMA_GEMM_PIN=0 turns the pins off (read when a context is made). The CPU
 * emulation (dev/cuda_emu) has no cublasLt: no pins there. */
#include <stdlib.h>
#include <string.h>

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

static int pins_from_env(void) {
  const char *v = getenv("DGEMMA_GEMM_PIN");
  return !(v && !strcmp(v, "0"));
}

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

/* Pin i's descriptors and algorithm; p->ok = 0 (and nothing held) when cublasLt does not accept it here. */
static void pin_init(cublasLtHandle_t lt, const gemm_pin_cfg *g, size_t ws_bytes, dg_gemm_pin *p) {
  memset(p, 0, sizeof *p);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t sk = g->splitk, red = g->red, swz = g->swz, cus = g->custom, tile = g->tile, stages = g->stages;
  bool ok = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, g->k, g->m, g->k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, g->k, g->n, g->k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, g->m, g->n, g->m) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F,
                                   g->algo, &p->algo) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulAlgoConfigSetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cus, sizeof cus) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t r;
  ok = ok && cublasLtMatmulAlgoCheck(lt, p->op, p->la, p->lb, p->lc, p->lc, &p->algo, &r) == CUBLAS_STATUS_SUCCESS &&
       r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes;
  if (!ok) pin_free(p);
  p->ok = ok;
}

void gemm_pins_init(dg_cuda_ctx *c, size_t ws_bytes) {
  c->pins = NULL;
  if (!pins_from_env() || !gemm_pins_device()) return;
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

int gemm_pins_count(const dg_cuda_ctx *c) { return c->pins ? c->pins->n_ok : 0; }

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
    *st = s == CUBLAS_STATUS_SUCCESS ? DG_OK
                                     : dg_seterr(DG_ERR_BACKEND, "%s:%d: cublasLtMatmul (pinned %d x %d x %d) failed: %s",
                                                 __FILE__, __LINE__, N, T, K, cublasGetStatusString(s));
    return 1;
  }
  return 0;
}
#else
void gemm_pins_init(dg_cuda_ctx *c, size_t) { c->pins = NULL; }
void gemm_pins_free(dg_cuda_ctx *c) { c->pins = NULL; }
int gemm_pins_count(const dg_cuda_ctx *) { return 0; }
int gemm_pin_shape(int, int *, int *, int *) { return 0; }
int gemm_pins_device(void) { return 0; }
int gemm_pinned(dg_cuda_ctx *, const bf16 *, int, int, const bf16 *, int, int, float *, int, dg_status *) {
  return 0;
}
#endif
