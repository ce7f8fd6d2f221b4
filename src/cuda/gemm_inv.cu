/* gemm_inv.cu: batch-invariant dense products (issue 14, session 26; DGEMMA_STACK_DENSE=inv).
 *
 * A stacked batch pass (turbo_host.cu compact_stack: B canvases' forward sets as one T = sum n_b rows) can run each
 * dense product once over all its rows, reading each weight once instead of B times, only if a row's outputs do not
 * depend on the row count T: then every canvas still gets the bits of its own single pass. cuBLAS's default
 * (cublasGemmEx, CUBLAS_GEMM_DEFAULT) picks its kernel by shape, and another kernel (k blocking, split-K) for another
 * T rounds the fp32 sums over k differently, so by default the backend runs the dense products per canvas
 * (passes.cu layer_segs). Here every product instead goes through one cublasLt algorithm per product shape (cuBLAS
 * m, k and the operation; not T): the same kernel, the same k blocking and split-K at every T, so each output's
 * accumulation order over k is the same whatever the other rows are. dev/cuda/gemm_inv.cu measures which
 * configurations are invariant in fact (row r at M rows equal to row r at 2048 rows, word for word, for M from 1 to
 * 2048) and their cost, and prints the table line of the fastest.
 *
 * The algorithm of a shape (chosen the first time the context runs that shape, host work only):
 *   1. a line of INV_CFG (below: the lab's verdicts) for the shape: the entry of cublasLt's heuristic list at the
 *      line's reference row count (the context's cuBLAS workspace) whose configuration is the line's (algo id, tile,
 *      stages, split-K, reduction scheme, CTA swizzling, custom option, inner and cluster shape; -1 matches any);
 *   2. no line, or the list has no such entry (another GPU or cuBLAS version): the fallback rule, the first entry of
 *      the heuristic list at 256 rows with split-K 1 (each output one CTA's dot product over all of k), or where the
 *      list has none (the SC product's k = 262144 may be one) its first entry: a fixed split-K count and reduction,
 *      whose invariance the lab and test_gemm_inv check rather than assume;
 *   3. neither: an error (DG_ERR_BACKEND, the shape named) from the product, and so from the pass.
 * The heuristic list is a function of the shape, the device and the cuBLAS version, so every run of a build on a
 * GPU picks the same algorithm. The algorithm is then run at every row count (cublasLtMatmul with the row count's
 * layout); where cublasLt refuses it at a row count the product fails with an error naming the configuration and
 * the row count (no silent fallback to the default: that would break the bits the switch promises).
 * The CPU emulation (dev/cuda_emu) has no cublasLt: there the products stay cublasGemmEx's emulation, a plain dot
 * product per output (invariant), and the switch only stacks them (the plumbing test_turbo_batch checks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

/* DGEMMA_STACK_DENSE: unset or "0" 0 (the dense products of a stacked pass per canvas, cuBLAS's default),
 * "1" 1 (once over the stack's rows, cuBLAS's default: a canvas's bits may differ from its single run), "inv" 2
 * (once over the stack's rows, every product of every pass through the invariant algorithms above). Read once when
 * the library loads (backend/switches.c); dg_cuda_stack_dense_set overrides it (tests). */
static int stack_dense_from_env(void) { return (int)dg_sw_get(DG_SW_STACK_DENSE); }
static const int stack_dense_env = stack_dense_from_env();
static int stack_dense_override = -1;
void dg_cuda_stack_dense_set(int mode) { stack_dense_override = mode >= 0 && mode <= 2 ? mode : -1; }
int stack_dense_now(void) { return stack_dense_override >= 0 ? stack_dense_override : stack_dense_env; }

/* The products of a 26B-A4B pass (dev/cuda/gemm_inv.cu's shapes): tn, cuBLAS m, k; test_gemm_inv's list. */
static const int INV_SHAPES[][3] = {
    {1, 8192, 2816},   /* q/k/v, sliding layers */
    {1, 9216, 2816},   /* q/k/v, full layers */
    {1, 2816, 4096},   /* o-proj, sliding */
    {1, 2816, 8192},   /* o-proj, full */
    {1, 4224, 2816},   /* dense MLP gate|up (and the SC MLP's) */
    {1, 2816, 2112},   /* dense MLP down */
    {1, 262144, 2816}, /* LM head (tied embedding) */
    {0, 2816, 262144}, /* self-conditioning soft embedding P . E */
};
int gemm_inv_shape(int i, int *tn, int *m, int *k) {
  if (i < 0 || i >= (int)(sizeof INV_SHAPES / sizeof INV_SHAPES[0])) return 0;
  *tn = INV_SHAPES[i][0]; *m = INV_SHAPES[i][1]; *k = INV_SHAPES[i][2];
  return 1;
}

#ifndef DG_CUDA_EMU
#include <cublasLt.h>

enum { NCFG = 9, INV_MAX = 16 };
/* One line of the lab's verdicts: the shape (tn, cuBLAS m, k), the row count whose heuristic list holds the
 * configuration, and the configuration (algo id, tile, stages, split-K, reduction, swizzle, custom, inner, cluster;
 * -1 matches any). Lines come from dev/cuda/gemm_inv.cu's "table line" output (verdict: invariant at every M of its
 * list, the fastest such): pasted from the lab's run on an H100 80GB HBM3 (cuBLAS 13.0, session 27,
 * docs/results/h100-s27/bi14/gemm_inv.txt). On another GPU or cuBLAS version a line whose configuration is not in
 * the list falls to the fallback rule. */
struct inv_cfg {
  int tn, m, k, mref;
  int v[NCFG];
};
static const inv_cfg INV_CFG[] = {
    {1, 8192, 2816, 256, {66, 20, 35, 1, 0, 0, 1, -1, -1}}, /* qkv_s */
    {1, 9216, 2816, 256, {66, 184, 35, 1, 0, 0, 2, -1, -1}}, /* qkv_f */
    {1, 2816, 4096, 256, {66, 135, 35, 1, 0, 0, 2, -1, -1}}, /* o_s */
    {1, 2816, 8192, 2048, {66, 20, 35, 1, 0, 0, 1, -1, -1}}, /* o_f */
    {1, 4224, 2816, 256, {66, 28, 35, 1, 0, 0, 2, -1, -1}}, /* mlp_gu */
    {1, 2816, 2112, 256, {66, 183, 35, 1, 0, 0, 2, -1, -1}}, /* mlp_d */
    {1, 262144, 2816, 2048, {66, 209, 35, 1, 0, 0, 4, -1, -1}}, /* lm_head */
    {0, 2816, 262144, 2048, {66, 20, 35, 1, 0, 0, 1, -1, -1}}, /* sc_soft */
    {-1, 0, 0, 0, {0}}, /* end */
};
static const cublasLtMatmulAlgoConfigAttributes_t CFG_ATTR[NCFG] = {
    CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};

/* One shape's descriptors and algorithm; lb and lc are re-dimensioned for each call's rows. */
struct inv_prod {
  int tn, m, k;
  int ok;       /* 1 algorithm found; -1 none (the error is repeated at every call) */
  int rule;     /* 0 a line of INV_CFG, 1 the fallback rule's split-K 1 entry, 2 its first entry */
  int v[NCFG];  /* its configuration */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
struct dg_gemm_inv {
  cublasLtHandle_t lt;
  size_t ws_bytes;
  int n;
  inv_prod p[INV_MAX];
};

static int cfg_get(const cublasLtMatmulAlgo_t *a, int i) {
  uint32_t v = 0;
  size_t w = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(a, CFG_ATTR[i], &v, sizeof v, &w) == CUBLAS_STATUS_SUCCESS ? (int)v : -1;
}

/* The heuristic list of p's shape at M rows (lb, lc dimensioned for M; the context's workspace): count, into hr. */
static int inv_list(dg_gemm_inv *g, inv_prod *p, int M, cublasLtMatmulHeuristicResult_t *hr, int nh) {
  uint64_t cols = (uint64_t)M;
  int64_t ldb = p->k, ldc = p->m;
  cublasLtMatmulPreference_t pref = NULL;
  int nr = 0;
  if (cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_LD, &ldb, sizeof ldb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_LD, &ldc, sizeof ldc) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes,
                                           sizeof g->ws_bytes) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, nh, hr, &nr) != CUBLAS_STATUS_SUCCESS)
    nr = 0;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return nr;
}

/* p's algorithm by the rules of the file comment; p->ok = 1, or -1 with nothing found. */
static void inv_choose(dg_gemm_inv *g, inv_prod *p) {
  enum { NH = 32 };
  cublasLtMatmulHeuristicResult_t hr[NH];
  p->ok = -1;
  for (const inv_cfg *e = INV_CFG; e->tn >= 0 && p->ok < 0; e++) {
    if (e->tn != p->tn || e->m != p->m || e->k != p->k) continue;
    const int nr = inv_list(g, p, e->mref, hr, NH);
    for (int i = 0; i < nr && p->ok < 0; i++) {
      if (hr[i].state != CUBLAS_STATUS_SUCCESS || hr[i].workspaceSize > g->ws_bytes) continue;
      int match = 1;
      for (int a = 0; a < NCFG; a++) match = match && (e->v[a] < 0 || cfg_get(&hr[i].algo, a) == e->v[a]);
      if (match) { p->algo = hr[i].algo; p->ok = 1; p->rule = 0; }
    }
  }
  if (p->ok < 0) { /* the fallback rule: the first split-K 1 entry at 256 rows, else its first entry */
    const int nr = inv_list(g, p, 256, hr, NH);
    for (int pass = 0; pass < 2 && p->ok < 0; pass++)
      for (int i = 0; i < nr && p->ok < 0; i++)
        if (hr[i].state == CUBLAS_STATUS_SUCCESS && hr[i].workspaceSize <= g->ws_bytes &&
            (pass || cfg_get(&hr[i].algo, 3) == 1)) {
          p->algo = hr[i].algo; p->ok = 1; p->rule = 1 + pass;
        }
  }
  for (int a = 0; a < NCFG; a++) p->v[a] = p->ok > 0 ? cfg_get(&p->algo, a) : -1;
}

static void inv_prod_free(inv_prod *p) {
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  memset(p, 0, sizeof *p);
}

/* The shape's entry of g, made (descriptors, algorithm) on first use; NULL when the table is full or cublasLt
 * failed to make descriptors (an error is set). */
static inv_prod *inv_get(dg_gemm_inv *g, int tn, int m, int k) {
  for (int i = 0; i < g->n; i++)
    if (g->p[i].tn == tn && g->p[i].m == m && g->p[i].k == k) return &g->p[i];
  if (g->n == INV_MAX) {
    dg_seterr(DG_ERR_BACKEND, "DGEMMA_STACK_DENSE=inv: more than %d product shapes in one context", INV_MAX);
    return NULL;
  }
  inv_prod *p = &g->p[g->n];
  memset(p, 0, sizeof *p);
  p->tn = tn; p->m = m; p->k = k;
  const cublasOperation_t ta = tn ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  const bool ok =
      cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, tn ? k : m, tn ? m : k, tn ? k : m) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, k, 256, k) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, m, 256, m) == CUBLAS_STATUS_SUCCESS;
  if (!ok) {
    inv_prod_free(p);
    dg_seterr(DG_ERR_BACKEND, "DGEMMA_STACK_DENSE=inv: cublasLt descriptors of the product m %d k %d failed", m, k);
    return NULL;
  }
  inv_choose(g, p);
  g->n++;
  return p;
}

dg_status gemm_inv_init(dg_cuda_ctx *c, size_t ws_bytes) {
  c->inv = NULL;
  if (stack_dense_now() != 2) return DG_OK;
  dg_gemm_inv *g = (dg_gemm_inv *)calloc(1, sizeof *g);
  if (!g) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  const cublasStatus_t s = cublasLtCreate(&g->lt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    free(g);
    return dg_seterr(DG_ERR_BACKEND, "DGEMMA_STACK_DENSE=inv: cublasLtCreate failed: %s", cublasGetStatusString(s));
  }
  g->ws_bytes = ws_bytes;
  c->inv = g;
  return DG_OK;
}

void gemm_inv_free(dg_cuda_ctx *c) {
  dg_gemm_inv *g = c->inv;
  if (!g) return;
  for (int i = 0; i < g->n; i++) inv_prod_free(&g->p[i]);
  cublasLtDestroy(g->lt);
  free(g);
  c->inv = NULL;
}

int gemm_inv(dg_cuda_ctx *c, int tn, int m, int n, int k, float alpha, const bf16 *A, const bf16 *B, int ldb, float *C,
             int ldc, dg_status *st) {
  dg_gemm_inv *g = c->inv;
  if (!g) return 0;
  if (n <= 0) { /* no rows: nothing to compute (cublasLt may refuse an empty product) */
    *st = DG_OK;
    return 1;
  }
  inv_prod *p = inv_get(g, tn, m, k);
  if (!p) { *st = DG_ERR_BACKEND; return 1; }
  if (p->ok < 0) {
    *st = dg_seterr(DG_ERR_BACKEND,
                    "DGEMMA_STACK_DENSE=inv: cublasLt offers no invariant configuration for the product m %d k %d (%s): "
                    "no line of src/cuda/gemm_inv.cu's table matches its heuristic list, which is empty at 256 rows "
                    "(run dev/cuda/gemm_inv.cu on this GPU, or unset DGEMMA_STACK_DENSE)",
                    m, k, tn ? "x W^T" : "P E");
    return 1;
  }
  uint64_t cols = (uint64_t)n;
  int64_t lb = ldb, lc = ldc;
  const float zero = 0.0f;
  cublasStatus_t s = cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_LD, &lb, sizeof lb);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_LD, &lc, sizeof lc);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmul(g->lt, p->op, &alpha, A, p->la, B, p->lb, &zero, C, p->lc, C, p->lc, &p->algo, c->blas_ws,
                       g->ws_bytes, c->stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    *st = dg_seterr(DG_ERR_BACKEND,
                    "DGEMMA_STACK_DENSE=inv: cublasLt refused the configuration (algo %d tile %d stages %d split-K %d "
                    "red %d swz %d custom %d inner %d cluster %d, %s) of the product m %d k %d at %d rows (ldb %d, "
                    "ldc %d): %s",
                    p->v[0], p->v[1], p->v[2], p->v[3], p->v[4], p->v[5], p->v[6], p->v[7], p->v[8],
                    p->rule == 0 ? "table" : p->rule == 1 ? "fallback rule, split-K 1" : "fallback rule, first entry",
                    m, k, n, ldb, ldc, cublasGetStatusString(s));
    return 1;
  }
  *st = DG_OK;
  return 1;
}

int gemm_inv_config(dg_cuda_ctx *c, int tn, int m, int k, int v[9], int *rule) {
  dg_gemm_inv *g = c->inv;
  inv_prod *p = g ? inv_get(g, tn, m, k) : NULL;
  if (!p || p->ok < 0) return 0;
  memcpy(v, p->v, sizeof p->v);
  *rule = p->rule;
  return 1;
}
#else
dg_status gemm_inv_init(dg_cuda_ctx *c, size_t) { c->inv = NULL; return DG_OK; }
void gemm_inv_free(dg_cuda_ctx *c) { c->inv = NULL; }
int gemm_inv(dg_cuda_ctx *, int, int, int, int, float, const bf16 *, const bf16 *, int, float *, int, dg_status *) {
  return 0;
}
int gemm_inv_config(dg_cuda_ctx *, int, int, int, int *, int *) { return 0; }
#endif
