/* gemm_lab.cu: the dense bf16 products of a 26B-A4B decoder pass (issue 12: q/k/v, o-proj, dense MLP, LM head,
 * self-conditioning), each through the backend's call (cublasGemmEx, CUBLAS_GEMM_DEFAULT: src/cuda/passes.cu's
 * gemm) and through every algorithm cublasLt's heuristic offers for it (cublasLtMatmulAlgoGetHeuristic, up to
 * --algos, the backend's 32 MiB workspace), each checked against the backend call's output and timed with cudaEvents
 * (median and spread of --reps, L2 flushed before each rep by a 256 MiB write). The floor of a row is
 * max(bytes / read bandwidth, FLOPs / bf16 rate) with both ceilings measured in the same command (a streaming read of
 * 2 GiB and cublasGemmEx 8192^3, best of 5). Prints one table per shape and, for the fastest algorithm of each, its
 * configuration (the cublasLt attributes a backend table would pin: algo id, tile, stages, split-K, reduction scheme,
 * CTA swizzling, custom option, inner and cluster shapes).
 *
 * Shapes (T = 256 canvas rows): y[T, N] fp32 = x[T, K] bf16 W[N, K]^T (the backend's gemm: OP_T, OP_N, m = N, n = T),
 * and the self-conditioning soft embedding y[T, H] = P[T, V] E[V, H] (OP_N, OP_N, m = H, n = T, k = V).
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 dev/cuda/gemm_lab.cu -lcublasLt -lcublas -o build/gemm_lab
 *   build/gemm_lab [--reps 20] [--algos 24] [--shapes qkv_s,o_s,...] [--json FILE] */
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
  int tn;     /* 1: y = x W^T (OP_T, OP_N); 0: y = P E (OP_N, OP_N) */
  int m, n, k; /* cuBLAS's m, n, k (column-major C m x n) */
  int per_pass; /* products of this shape per decoder pass of the 26B (30 layers: 25 sliding, 5 full) */
};
static const shape SHAPES[] = {
    {"qkv_s", 1, 8192, 256, 2816, 25},   /* q 16 x 256, k and v 8 x 256 */
    {"qkv_f", 1, 9216, 256, 2816, 5},    /* q 16 x 512, k = v 2 x 512 */
    {"o_s", 1, 2816, 256, 4096, 25},
    {"o_f", 1, 2816, 256, 8192, 5},
    {"mlp_gu", 1, 4224, 256, 2816, 31},  /* dense MLP gate|up (30 layers + the SC MLP) */
    {"mlp_d", 1, 2816, 256, 2112, 31},
    {"lm_head", 1, 262144, 256, 2816, 1},
    {"sc_soft", 0, 2816, 256, 262144, 1},
};

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16(((float)(h & 0xffff) / 32768.0f - 1.0f));
  }
}
__global__ void flush_kernel(float4 *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_float4((float)i, 0.f, 0.f, 0.f);
}
__global__ void read_kernel(const float4 *p, size_t n, float *out) {
  float s = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = __ldcs(p + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 12345.678f) *out = s; /* keeps the loads */
}

static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }

static float4 *g_flush;
static size_t g_flush_n;
static void flush(cudaStream_t s) { flush_kernel<<<1056, 256, 0, s>>>(g_flush, g_flush_n); }

/* Median / min / max of R timed runs of op (ms), L2 flushed before each. */
template <class Op> static void timeit(int R, cudaStream_t s, Op op, float *med, float *lo, float *hi) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  float *t = (float *)malloc(sizeof(float) * R);
  op(); CK(cudaStreamSynchronize(s)); /* warm-up */
  for (int r = 0; r < R; r++) {
    flush(s);
    CK(cudaEventRecord(e0, s));
    op();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t[r], e0, e1));
  }
  qsort(t, R, sizeof(float), cmpf);
  *med = t[R / 2]; *lo = t[0]; *hi = t[R - 1];
  free(t);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
}

static int attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
  int v = -1; size_t w = 0;
  uint32_t u = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &u, sizeof u, &w) == CUBLAS_STATUS_SUCCESS) v = (int)u;
  return v;
}

int main(int argc, char **argv) {
  int R = 20, NA = 24;
  const char *only = NULL, *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) R = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--algos") && i + 1 < argc) NA = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else { fprintf(stderr, "usage: gemm_lab [--reps R] [--algos N] [--shapes a,b] [--json FILE]\n"); return 2; }
  }
  if (R < 1 || NA < 1 || NA > 256) { fprintf(stderr, "gemm_lab: --reps >= 1, --algos 1..256\n"); return 2; }
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
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) { fprintf(stderr, "gemm_lab: cannot write %s\n", json); return 1; }

  /* ceilings, same command */
  float bw_best = 0.f, rate_best = 0.f;
  {
    const size_t n = ((size_t)2 << 30) / 16;
    float4 *p; float *o;
    CK(cudaMalloc(&p, n * 16)); CK(cudaMalloc(&o, 4));
    CK(cudaMemset(p, 0, n * 16));
    float med, lo, hi;
    timeit(5, s, [&] { read_kernel<<<132 * 8, 512, 0, s>>>(p, n, o); }, &med, &lo, &hi);
    bw_best = (float)(n * 16) / (lo * 1e-3f) / 1e9f;
    CK(cudaFree(p)); CK(cudaFree(o));
    const int G = 8192;
    __nv_bfloat16 *a, *b; float *c;
    CK(cudaMalloc(&a, (size_t)G * G * 2)); CK(cudaMalloc(&b, (size_t)G * G * 2)); CK(cudaMalloc(&c, (size_t)G * G * 4));
    fill_kernel<<<1056, 256, 0, s>>>(a, (size_t)G * G, 1); fill_kernel<<<1056, 256, 0, s>>>(b, (size_t)G * G, 2);
    const float one = 1.f, zero = 0.f;
    timeit(5, s, [&] { CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, G, G, G, &one, a, CUDA_R_16BF, G, b, CUDA_R_16BF, G,
                                       &zero, c, CUDA_R_32F, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); }, &med, &lo, &hi);
    rate_best = 2.0f * G * (float)G * G / (lo * 1e-3f) / 1e12f;
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(c));
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# gemm_lab on %s (%d SMs): read %.0f GB/s (streaming read of 2 GiB, best of 5), bf16 %.0f TFLOP/s (cublasGemmEx "
         "8192^3, best of 5); medians of %d reps, L2 flushed before each; workspace 32 MiB\n\n",
         prop.name, prop.multiProcessorCount, bw_best, rate_best, R);
  if (jf) fprintf(jf, "{\"kind\":\"ceilings\",\"device\":\"%s\",\"read_gbs\":%.1f,\"bf16_tflops\":%.1f}\n", prop.name, bw_best, rate_best);

  double pass_default = 0, pass_best = 0, pass_floor = 0;
  for (const shape &sh : SHAPES) {
    if (only && !strstr(only, sh.name)) continue;
    const size_t na = (size_t)sh.m * sh.k, nb = (size_t)sh.k * sh.n, nc = (size_t)sh.m * sh.n;
    __nv_bfloat16 *A, *B;
    float *C, *C0;
    CK(cudaMalloc(&A, na * 2)); CK(cudaMalloc(&B, nb * 2)); CK(cudaMalloc(&C, nc * 4)); CK(cudaMalloc(&C0, nc * 4));
    fill_kernel<<<1056, 256, 0, s>>>(A, na, 11); fill_kernel<<<1056, 256, 0, s>>>(B, nb, 12);
    const cublasOperation_t ta = sh.tn ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    const int lda = sh.tn ? sh.k : sh.m, ldb = sh.k, ldc = sh.m;
    const float one = 1.f, zero = 0.f;
    const double flops = 2.0 * sh.m * sh.n * sh.k, bytes = 2.0 * (na + nb) + 4.0 * nc;
    const double floor_ms = fmax(bytes / (bw_best * 1e9), flops / (rate_best * 1e12)) * 1e3;
    auto gemmex = [&] { CB(cublasGemmEx(h, ta, tb, sh.m, sh.n, sh.k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &zero,
                                        C0, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); };
    float med, lo, hi;
    timeit(R, s, gemmex, &med, &lo, &hi);
    const float def_ms = med;
    printf("## %s: m %d n %d k %d (%s), %.2f GFLOP, %.1f MB, floor %.4f ms, %d per pass\n\n", sh.name, sh.m, sh.n, sh.k,
           sh.tn ? "x W^T" : "P E", flops / 1e9, bytes / 1e6, floor_ms, sh.per_pass);
    printf("| path | algo | tile | stages | splitK | red | swz | custom | inner | cluster | ms | spread | TFLOP/s | floor %% | max rel diff |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| cublasGemmEx default | | | | | | | | | | %.4f | %.4f-%.4f | %.0f | %.1f | 0 |\n", med, lo, hi,
           flops / (med * 1e9), 100.0 * floor_ms / med);
    if (jf) fprintf(jf, "{\"kind\":\"gemm\",\"shape\":\"%s\",\"path\":\"gemmex\",\"ms\":%.5f,\"lo\":%.5f,\"hi\":%.5f,\"floor_ms\":%.5f}\n",
                    sh.name, med, lo, hi, floor_ms);
    /* reference output for the checks */
    std::vector<float> ref(nc), got(nc);
    CK(cudaMemcpy(ref.data(), C0, nc * 4, cudaMemcpyDeviceToHost));
    double rmax = 0;
    for (size_t i = 0; i < nc; i++) rmax = fmax(rmax, fabs(ref[i]));

    cublasLtMatmulDesc_t op;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, lc;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.tn ? sh.k : sh.m, sh.tn ? sh.m : sh.k, lda));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.k, sh.n, ldb));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, sh.m, sh.n, ldc));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    std::vector<cublasLtMatmulHeuristicResult_t> hr(NA);
    int nr = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, NA, hr.data(), &nr));
    int best = -1;
    float best_ms = 1e30f;
    for (int i = 0; i < nr; i++) {
      if (hr[i].state != CUBLAS_STATUS_SUCCESS || hr[i].workspaceSize > ws_bytes) continue;
      const cublasLtMatmulAlgo_t *al = &hr[i].algo;
      auto run = [&] { CB(cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, C, lc, C, lc, al, ws, ws_bytes, s)); };
      CK(cudaMemset(C, 0, nc * 4));
      run();
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), C, nc * 4, cudaMemcpyDeviceToHost));
      double d = 0;
      for (size_t j = 0; j < nc; j++) d = fmax(d, fabs((double)got[j] - ref[j]));
      timeit(R, s, run, &med, &lo, &hi);
      const int id = attr(al, CUBLASLT_ALGO_CONFIG_ID), tile = attr(al, CUBLASLT_ALGO_CONFIG_TILE_ID),
                st = attr(al, CUBLASLT_ALGO_CONFIG_STAGES_ID), sk = attr(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                red = attr(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), swz = attr(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                cus = attr(al, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), inner = attr(al, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                cl = attr(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
      printf("| lt heuristic #%d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %.4f | %.4f-%.4f | %.0f | %.1f | %.2e |\n", i,
             id, tile, st, sk, red, swz, cus, inner, cl, med, lo, hi, flops / (med * 1e9), 100.0 * floor_ms / med,
             rmax > 0 ? d / rmax : d);
      if (jf) fprintf(jf, "{\"kind\":\"gemm\",\"shape\":\"%s\",\"path\":\"lt\",\"rank\":%d,\"algo\":%d,\"tile\":%d,\"stages\":%d,"
                      "\"splitk\":%d,\"red\":%d,\"swz\":%d,\"custom\":%d,\"inner\":%d,\"cluster\":%d,\"ms\":%.5f,\"lo\":%.5f,"
                      "\"hi\":%.5f,\"floor_ms\":%.5f,\"max_rel_diff\":%.3e}\n", sh.name, i, id, tile, st, sk, red, swz, cus,
                      inner, cl, med, lo, hi, floor_ms, rmax > 0 ? d / rmax : d);
      if (med < best_ms) { best_ms = med; best = i; }
    }
    printf("\n%s: default %.4f ms, best lt #%d %.4f ms (%.2fx), floor %.4f ms (default %.1f %%, best %.1f %%)\n\n", sh.name,
           def_ms, best, best_ms, def_ms / best_ms, floor_ms, 100.0 * floor_ms / def_ms, 100.0 * floor_ms / best_ms);
    pass_default += sh.per_pass * def_ms;
    pass_best += sh.per_pass * fmin(def_ms, best_ms);
    pass_floor += sh.per_pass * floor_ms;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    CK(cudaFree(A)); CK(cudaFree(B)); CK(cudaFree(C)); CK(cudaFree(C0));
  }
  printf("per decoder pass of the 26B (shapes x their count): default %.3f ms, best of each %.3f ms, floor %.3f ms\n",
         pass_default, pass_best, pass_floor);
  if (jf) { fprintf(jf, "{\"kind\":\"pass\",\"default_ms\":%.4f,\"best_ms\":%.4f,\"floor_ms\":%.4f}\n", pass_default, pass_best, pass_floor); fclose(jf); }
  return 0;
}
