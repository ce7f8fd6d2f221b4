/* gemm_inv.cu: batch invariance of the dense bf16 products of a 26B-A4B pass (issue 14, session 26). A stacked
 * batch pass may run a product once over all canvases' rows only if a row's outputs do not depend on how many
 * other rows the product has: C = A W^T's row r is then the same fp32 words at every row count M. On a GPU those
 * words depend only on the order of the fp32 accumulation over k of that row's outputs, which cuBLAS changes between
 * row counts when its heuristic picks another kernel, k blocking or split-K.
 *
 * For each product (q/k/v sliding and full, o-proj sliding and full, dense gate|up and down, LM head
 * [262144 x 2816], the self-conditioning product P . E [2816 x 262144] as dg_cuda_turbo_sc and soft_from run it)
 * and row counts M in {1, 2, 8, 16, 34, 64, 130, 163, 256, 566, 1024, 2048} (the inputs of M rows are the first M
 * rows of one 2048-row input, so row r is the same data at every M):
 *   (a) cuBLAS's default (cublasGemmEx, CUBLAS_GEMM_DEFAULT, as src/cuda/passes.cu's gemm calls it): the output rows
 *       at M compared word for word with the same rows of the M = 2048 product ("rows differing");
 *   (b) every configuration (algo id, tile, stages, split-K, reduction, CTA swizzling, custom option, inner and
 *       cluster shapes) that cublasLt's heuristic offers at M = 256 or at M = 2048 (the backend's 32 MiB workspace):
 *       the heuristic entry's algorithm run at every M (the backend's mechanism for DGEMMA_STACK_DENSE=inv,
 *       src/cuda/gemm_inv.cu: one algorithm taken from the list at a reference row count, used at every row count),
 *       "offered" = the heuristic at that M lists the same configuration too; its output at M compared word for word
 *       with its own output at the largest M it ran at (invariant when every row at every M is equal), its worst
 *       |diff| against the default at M = 2048 relative to max |default| (accuracy), and its time at each M (median
 *       of --reps, L2 flushed before each by a 256 MiB write) against the default's;
 *   (c) a verdict per product: the fastest configuration invariant over all M (least summed time over the M list),
 *       its cost against the default (summed over M and at M = 163 and 566, a B = 1 and a B = 4 stack of the batch
 *       bench) and, in the form of gemm_inv.cu's table, its line. "none" when no offered configuration is
 *       invariant.
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/cuda/gemm_inv.cu -lcublasLt -lcublas -o build/gemm_inv
 *   build/gemm_inv [--reps 7] [--algos 24] [--shapes qkv_s,lm_head,...] [--json FILE] */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); exit(1); } } while (0)

struct shape {
  const char *name;
  int tn;     /* 1: y[M, N] = x[M, K] W[N, K]^T (OP_T, OP_N, m = N, n = M); 0: y[M, H] = P[M, V] E[V, H] (OP_N, OP_N) */
  int m, k;   /* cuBLAS's m and k; n = M, the rows */
  int per_pass; /* products of this shape per decoder pass of the 26B (30 layers: 25 sliding, 5 full) */
};
static const shape SHAPES[] = {
    {"qkv_s", 1, 8192, 2816, 25},   /* q 16 x 256, k and v 8 x 256 */
    {"qkv_f", 1, 9216, 2816, 5},    /* q 16 x 512, k = v 2 x 512 */
    {"o_s", 1, 2816, 4096, 25},
    {"o_f", 1, 2816, 8192, 5},
    {"mlp_gu", 1, 4224, 2816, 31},  /* dense MLP gate|up (30 layers + the SC MLP) */
    {"mlp_d", 1, 2816, 2112, 31},
    {"lm_head", 1, 262144, 2816, 1},
    {"sc_soft", 0, 2816, 262144, 1},
};
static const int MS[] = {1, 2, 8, 16, 34, 64, 130, 163, 256, 566, 1024, 2048};
enum { NM = sizeof MS / sizeof MS[0], MMAX = 2048 };

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed ^ (unsigned)(i >> 32) * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16(((float)(h & 0xffff) / 32768.0f - 1.0f) * scale);
  }
}
__global__ void flush_kernel(float4 *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_float4((float)i, 0.f, 0.f, 0.f);
}
/* cnt[0] += words of a[0..n) whose bits differ from b's; cnt[1] = max |a - b| as float bits (both >= 0);
 * cnt[2] = max |b| bits. */
__global__ void cmp_kernel(const float *a, const float *b, size_t n, unsigned long long *cnt, unsigned *mx) {
  unsigned long long d = 0;
  float md = 0.f, mb = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float x = a[i], y = b[i];
    d += __float_as_uint(x) != __float_as_uint(y);
    md = fmaxf(md, fabsf(x - y));
    mb = fmaxf(mb, fabsf(y));
  }
  if (d) atomicAdd(cnt, d);
  atomicMax(&mx[0], __float_as_uint(md));
  atomicMax(&mx[1], __float_as_uint(mb));
}

static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }

static float4 *g_flush;
static size_t g_flush_n;
static void flush(cudaStream_t s) { flush_kernel<<<1056, 256, 0, s>>>(g_flush, g_flush_n); }

/* Median of R timed runs of op (ms), L2 flushed before each, after one warm-up. */
template <class Op> static float timeit(int R, cudaStream_t s, Op op) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> t(R);
  op(); CK(cudaStreamSynchronize(s));
  for (int r = 0; r < R; r++) {
    flush(s);
    CK(cudaEventRecord(e0, s));
    op();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t[r], e0, e1));
  }
  qsort(t.data(), R, sizeof(float), cmpf);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  return t[R / 2];
}

/* Words of the first n floats of a that differ from b; *rel = max |a - b| / max |b| over them. */
static unsigned long long g_cnt_h;
static unsigned long long *g_cnt;
static unsigned *g_mx;
static unsigned long long compare(const float *a, const float *b, size_t n, cudaStream_t s, double *rel) {
  CK(cudaMemsetAsync(g_cnt, 0, 8, s));
  CK(cudaMemsetAsync(g_mx, 0, 8, s));
  cmp_kernel<<<1056, 256, 0, s>>>(a, b, n, g_cnt, g_mx);
  unsigned mx[2];
  CK(cudaMemcpyAsync(&g_cnt_h, g_cnt, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(mx, g_mx, 8, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  float md, mb;
  memcpy(&md, &mx[0], 4); memcpy(&mb, &mx[1], 4);
  if (rel) *rel = mb > 0 ? md / mb : md;
  return g_cnt_h;
}

static int attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
  uint32_t u = 0; size_t w = 0;
  return cublasLtMatmulAlgoConfigGetAttribute(a, at, &u, sizeof u, &w) == CUBLAS_STATUS_SUCCESS ? (int)u : -1;
}
enum { NCFG = 9 };
struct cfg {
  int v[NCFG]; /* id, tile, stages, splitK, reduction, swizzle, custom, inner, cluster */
  cublasLtMatmulAlgo_t algo;
  size_t ws;
  int from; /* the M whose heuristic list it was taken from */
};
static const cublasLtMatmulAlgoConfigAttributes_t CFG_ATTR[NCFG] = {
    CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
static void cfg_of(const cublasLtMatmulAlgo_t *a, int v[NCFG]) {
  for (int i = 0; i < NCFG; i++) v[i] = attr(a, CFG_ATTR[i]);
}

/* The layouts of one product at M rows. */
struct prod {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
};
static void prod_make(prod *p, const shape &sh, int M) {
  const cublasOperation_t ta = sh.tn ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  CB(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CB(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, sh.tn ? sh.k : sh.m, sh.tn ? sh.m : sh.k, sh.tn ? sh.k : sh.m));
  CB(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, sh.k, M, sh.k));
  CB(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, sh.m, M, sh.m));
}
static void prod_free(prod *p) {
  cublasLtMatrixLayoutDestroy(p->la); cublasLtMatrixLayoutDestroy(p->lb); cublasLtMatrixLayoutDestroy(p->lc);
  cublasLtMatmulDescDestroy(p->op);
}
static int heuristic(cublasLtHandle_t lt, const prod *p, size_t ws_bytes, int NA, cublasLtMatmulHeuristicResult_t *hr) {
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  int nr = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, NA, hr, &nr) != CUBLAS_STATUS_SUCCESS) nr = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  return nr;
}

int main(int argc, char **argv) {
  int R = 7, NA = 24;
  const char *only = NULL, *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) R = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--algos") && i + 1 < argc) NA = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else { fprintf(stderr, "usage: gemm_inv [--reps R] [--algos N] [--shapes a,b] [--json FILE]\n"); return 2; }
  }
  if (R < 1 || NA < 1 || NA > 256) { fprintf(stderr, "gemm_inv: --reps >= 1, --algos 1..256\n"); return 2; }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  cublasLtHandle_t lt;
  CB(cublasCreate(&h)); CB(cublasSetStream(h, s)); CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  CB(cublasLtCreate(&lt));
  const size_t ws_bytes = (size_t)32 << 20; /* the backend's cuBLAS workspace (src/cuda/context.cu) */
  void *ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CB(cublasSetWorkspace(h, ws, ws_bytes));
  g_flush_n = ((size_t)256 << 20) / 16;
  CK(cudaMalloc(&g_flush, g_flush_n * 16));
  CK(cudaMalloc(&g_cnt, 8)); CK(cudaMalloc(&g_mx, 8));
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) { fprintf(stderr, "gemm_inv: cannot write %s\n", json); return 1; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int ver = 0;
  CB(cublasGetVersion(h, &ver));
  printf("# gemm_inv on %s (%d SMs), cuBLAS %d: medians of %d reps, L2 flushed before each; workspace 32 MiB; "
         "row counts M:", prop.name, prop.multiProcessorCount, ver, R);
  for (int j = 0; j < NM; j++) printf(" %d", MS[j]);
  printf("\n\n");

  double sum_def = 0, sum_inv = 0, sum_def4 = 0, sum_inv4 = 0, sum_def1 = 0, sum_inv1 = 0;
  int all_found = 1;
  for (const shape &sh : SHAPES) {
    if (only && !strstr(only, sh.name)) continue;
    const size_t na = (size_t)sh.m * sh.k, nb = (size_t)sh.k * MMAX, nc = (size_t)sh.m * MMAX;
    __nv_bfloat16 *A, *B;
    float *C, *Cref, *Cdef;
    CK(cudaMalloc(&A, na * 2)); CK(cudaMalloc(&B, nb * 2));
    CK(cudaMalloc(&C, nc * 4)); CK(cudaMalloc(&Cref, nc * 4)); CK(cudaMalloc(&Cdef, nc * 4));
    /* weights ~ U(-1, 1) / 16; rows U(-1, 1) (tn) or, for P . E, probabilities-like values U(0, 2) / V */
    fill_kernel<<<1056, 256, 0, s>>>(A, na, 11, 1.0f / 16);
    fill_kernel<<<1056, 256, 0, s>>>(B, nb, 12, sh.tn ? 1.0f : 1.0f / sh.k);
    const cublasOperation_t ta = sh.tn ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    const int lda = sh.tn ? sh.k : sh.m;
    const float one = 1.f, zero = 0.f;
    auto gemmex = [&](int M, float *out) {
      CB(cublasGemmEx(h, ta, tb, sh.m, M, sh.k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, sh.k, &zero, out,
                      CUDA_R_32F, sh.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    printf("## %s: cuBLAS m %d, k %d, n = M rows (%s), %d per pass\n\n", sh.name, sh.m, sh.k, sh.tn ? "x W^T" : "P E",
           sh.per_pass);
    /* (a) the default */
    gemmex(MMAX, Cdef);
    CK(cudaStreamSynchronize(s));
    float def_ms[NM];
    unsigned long long def_diff[NM];
    printf("(a) cublasGemmEx default: rows differing from the same rows at M = %d, and ms\n\n| M |", MMAX);
    for (int j = 0; j < NM; j++) printf(" %d |", MS[j]);
    printf("\n|---|");
    for (int j = 0; j < NM; j++) printf("---|");
    printf("\n");
    for (int j = 0; j < NM; j++) {
      const int M = MS[j];
      CK(cudaMemsetAsync(C, 0xff, (size_t)sh.m * M * 4, s));
      gemmex(M, C);
      def_diff[j] = compare(C, Cdef, (size_t)sh.m * M, s, NULL);
      def_ms[j] = timeit(R, s, [&] { gemmex(M, C); });
    }
    printf("| words differing |");
    for (int j = 0; j < NM; j++) printf(" %llu |", def_diff[j]);
    printf("\n| ms |");
    for (int j = 0; j < NM; j++) printf(" %.4f |", def_ms[j]);
    printf("\n\n");
    if (jf)
      for (int j = 0; j < NM; j++)
        fprintf(jf, "{\"kind\":\"default\",\"shape\":\"%s\",\"M\":%d,\"diff_words\":%llu,\"ms\":%.5f}\n", sh.name, MS[j],
                def_diff[j], def_ms[j]);

    /* (b) the candidate configurations: the heuristic lists at M = 256 and 2048 */
    std::vector<cfg> cands;
    std::vector<cublasLtMatmulHeuristicResult_t> hr(NA);
    static const int FROM[2] = {256, MMAX};
    for (int from : FROM) {
      prod p;
      prod_make(&p, sh, from);
      const int nr = heuristic(lt, &p, ws_bytes, NA, hr.data());
      for (int i = 0; i < nr; i++) {
        if (hr[i].state != CUBLAS_STATUS_SUCCESS || hr[i].workspaceSize > ws_bytes) continue;
        cfg c;
        cfg_of(&hr[i].algo, c.v);
        c.algo = hr[i].algo;
        c.ws = hr[i].workspaceSize;
        c.from = from;
        bool dup = false;
        for (const cfg &o : cands) dup = dup || !memcmp(o.v, c.v, sizeof c.v);
        if (!dup) cands.push_back(c);
      }
      prod_free(&p);
    }
    /* which configurations the heuristic offers at each M */
    std::vector<std::vector<int>> offered(cands.size(), std::vector<int>(NM, 0));
    for (int j = 0; j < NM; j++) {
      prod p;
      prod_make(&p, sh, MS[j]);
      const int nr = heuristic(lt, &p, ws_bytes, NA, hr.data());
      for (int i = 0; i < nr; i++) {
        int v[NCFG];
        cfg_of(&hr[i].algo, v);
        for (size_t q = 0; q < cands.size(); q++) offered[q][j] |= !memcmp(v, cands[q].v, sizeof v);
      }
      prod_free(&p);
    }
    printf("(b) configurations of the heuristic lists at M = 256 and %d, each algorithm run at every M: ms, or "
           "'-' where cublasLt refused it; * = not offered by the heuristic at that M; inv = every row of every M equals "
           "the same row at the largest M it ran at; rel = max |diff| / max |y| against the default at M = %d\n\n",
           MMAX, MMAX);
    printf("| # | from | algo | tile | stages | splitK | red | swz | custom | inner | cluster | inv | rel |");
    for (int j = 0; j < NM; j++) printf(" %d |", MS[j]);
    printf(" sum ms | sum / default |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (int j = 0; j < NM; j++) printf("---|");
    printf("---|---|\n");
    double sdef = 0;
    for (int j = 0; j < NM; j++) sdef += def_ms[j];
    int best = -1;
    double best_sum = 1e30;
    std::vector<std::vector<float>> cms(cands.size(), std::vector<float>(NM, -1.f));
    for (size_t q = 0; q < cands.size(); q++) {
      cfg &c = cands[q];
      int ran[NM], any = 0, jref = -1;
      for (int j = NM - 1; j >= 0; j--) { /* the largest M first: the reference */
        prod p;
        prod_make(&p, sh, MS[j]);
        cublasLtMatmulHeuristicResult_t chk;
        ran[j] = cublasLtMatmulAlgoCheck(lt, p.op, p.la, p.lb, p.lc, p.lc, &c.algo, &chk) == CUBLAS_STATUS_SUCCESS &&
                 chk.workspaceSize <= ws_bytes;
        float *out = jref < 0 ? Cref : C;
        if (ran[j]) {
          CK(cudaMemsetAsync(out, 0xff, (size_t)sh.m * MS[j] * 4, s));
          ran[j] = cublasLtMatmul(lt, p.op, &one, A, p.la, B, p.lb, &zero, out, p.lc, out, p.lc, &c.algo, ws, ws_bytes,
                                  s) == CUBLAS_STATUS_SUCCESS;
          CK(cudaStreamSynchronize(s));
        }
        if (ran[j]) {
          any = 1;
          if (jref < 0) jref = j;
          else if (compare(C, Cref, (size_t)sh.m * MS[j], s, NULL)) ran[j] = 2; /* ran, rows differ */
          cms[q][j] = timeit(R, s, [&] {
            CB(cublasLtMatmul(lt, p.op, &one, A, p.la, B, p.lb, &zero, C, p.lc, C, p.lc, &c.algo, ws, ws_bytes, s));
          });
        }
        prod_free(&p);
      }
      int inv = any, all = 1;
      for (int j = 0; j < NM; j++) { inv = inv && ran[j] != 2; all = all && ran[j] != 0; }
      double rel = -1;
      if (jref == NM - 1) compare(Cref, Cdef, nc, s, &rel);
      double sum = 0;
      for (int j = 0; j < NM; j++) sum += cms[q][j] > 0 ? cms[q][j] : 0;
      printf("| %zu | %d |", q, c.from);
      for (int i = 0; i < NCFG; i++) printf(" %d |", c.v[i]);
      printf(" %s | %.1e |", !any ? "-" : inv ? (all ? "yes" : "yes (partial M)") : "NO", rel);
      for (int j = 0; j < NM; j++) {
        if (!ran[j]) printf(" - |");
        else printf(" %.4f%s%s |", cms[q][j], offered[q][j] ? "" : "*", ran[j] == 2 ? " (diff)" : "");
      }
      printf(" %.4f | %.2f |\n", all ? sum : 0.0, all ? sum / sdef : 0.0);
      if (jf) {
        fprintf(jf, "{\"kind\":\"cfg\",\"shape\":\"%s\",\"from\":%d,\"cfg\":[", sh.name, c.from);
        for (int i = 0; i < NCFG; i++) fprintf(jf, "%s%d", i ? "," : "", c.v[i]);
        fprintf(jf, "],\"inv\":%d,\"all_m\":%d,\"rel\":%.3e,\"ms\":[", inv, all, rel);
        for (int j = 0; j < NM; j++) fprintf(jf, "%s%.5f", j ? "," : "", cms[q][j]);
        fprintf(jf, "],\"offered\":[");
        for (int j = 0; j < NM; j++) fprintf(jf, "%s%d", j ? "," : "", offered[q][j]);
        fprintf(jf, "]}\n");
      }
      if (inv && all && sum < best_sum) { best_sum = sum; best = (int)q; }
    }
    /* (c) the verdict */
    int inv_ms = 0; /* the default's invariant range: M whose rows equal M = 2048's */
    for (int j = 0; j < NM; j++) inv_ms += def_diff[j] == 0;
    printf("\n(c) %s: default invariant at %d of %d M (", sh.name, inv_ms, NM);
    for (int j = 0; j < NM; j++) printf("%s%s", j ? " " : "", def_diff[j] ? "x" : "=");
    printf(")");
    int j163 = 7, j566 = 9; /* MS[7] = 163, MS[9] = 566: a B = 1 and a B = 4 stack's rows (bench batch, session 26) */
    if (best < 0) {
      printf("; no offered configuration is invariant at every M: verdict none\n\n");
      all_found = 0;
    } else {
      const cfg &c = cands[best];
      printf("; fastest invariant configuration #%d (from M = %d): sum %.4f ms vs default %.4f (%.2fx), at M = 163 "
             "%.4f vs %.4f ms, at M = 566 %.4f vs %.4f ms\n", best, c.from, best_sum, sdef, best_sum / sdef,
             cms[best][j163], def_ms[j163], cms[best][j566], def_ms[j566]);
      printf("    table line (src/cuda/gemm_inv.cu INV_CFG): {%d, %d, %d, %d, {", sh.tn, sh.m, sh.k, c.from);
      for (int i = 0; i < NCFG; i++) printf("%s%d", i ? ", " : "", c.v[i]);
      printf("}}, /* %s */\n\n", sh.name);
      sum_def += sh.per_pass * (double)sdef;
      sum_inv += sh.per_pass * best_sum;
      sum_def1 += sh.per_pass * (double)def_ms[j163];
      sum_inv1 += sh.per_pass * (double)cms[best][j163];
      sum_def4 += sh.per_pass * (double)def_ms[j566];
      sum_inv4 += sh.per_pass * (double)cms[best][j566];
    }
    CK(cudaFree(A)); CK(cudaFree(B)); CK(cudaFree(C)); CK(cudaFree(Cref)); CK(cudaFree(Cdef));
  }
  printf("per decoder pass of the 26B (shapes x their count, products with a verdict%s): at M = 163 default %.3f ms, "
         "invariant %.3f ms; at M = 566 default %.3f, invariant %.3f; summed over the M list default %.3f, invariant "
         "%.3f\n", all_found ? "" : "; SOME HAVE NONE", sum_def1, sum_inv1, sum_def4, sum_inv4, sum_def, sum_inv);
  if (jf) {
    fprintf(jf, "{\"kind\":\"pass\",\"all_found\":%d,\"def163\":%.4f,\"inv163\":%.4f,\"def566\":%.4f,\"inv566\":%.4f}\n",
            all_found, sum_def1, sum_inv1, sum_def4, sum_inv4);
    fclose(jf);
  }
  return 0;
}
