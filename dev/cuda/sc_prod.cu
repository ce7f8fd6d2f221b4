/* sc_prod.cu (lab, issues 12 and 14, session 27 helper sk12): the self-conditioning product
 * out[M, H] fp32 = alpha P[M, V] E[V, H] (P the bf16 softmax rows, E the bf16 tied embedding, row-major as
 * src/cuda/passes.cu soft_from and turbo_host.cu dg_cuda_turbo_sc pass them to cuBLAS) at the 26B's V = 262144,
 * H = 2816, on dev/cuda/sc_prod.cuh's batch-invariant kernel beside cuBLAS, same run:
 *   0  cublasGemmEx, CUBLAS_GEMM_DEFAULT, OP_N OP_N as the backend calls it (not invariant over M at small M);
 *   1  sc_prod_run, the token tile by sc_prod_bm, all M rows through one workspace (mc = 2048);
 *   2  the same with the tile forced to 128 rows; 3 forced to 64; 4 forced to 16 (the tile's cost alone);
 *   5  version 1 in chunks of 256 rows (the backend's chunking while it ran sc_prod, session 27; --small: 48 rows);
 *   7  version 2 with a ring of 4 stages (128 KiB: one block an SM; version 2's ring of 3, 96 KiB, fits two);
 *   6  cublasLt's first split-K-1 entry of its heuristic list at 256 rows, else at 2048 rows (session 27's first H100
 *      call found split-K 1, algo 66 tile 20 from the 2048-row list, the only invariant configuration for this
 *      shape), run at every M (not on the emulation: it has no cublasLt).
 * For M in --ms (default 1, 2, 8, 16, 64, 163, 256, 566, 1024, 2048; the M-row input is the first M rows of one
 * MMAX-row P, so row r is the same data at every M):
 *   inv     the words of each version's rows at M against the same rows of its own output at MMAX ("rows differing":
 *           0 at every M is the invariance the issue needs), and versions 1-5, 7 against version 1 at MMAX (same S: the
 *           tile and the chunking must not change a word: sc_prod.cuh's claim);
 *   check   at MMAX, NS sampled outputs (the 4 corners first) against an fp64 CPU reference, |diff| / bound with
 *           bound = gamma_n sum_v |alpha p e| + |alpha| 2^-24 |ref|, n = V / 16 + 17 + S + 1, u = 2^-23: a chain of
 *           V / 16 mma steps per run (each a 16-product sum into the accumulator; the tensor core's products are exact
 *           and its additions may truncate, hence u = 2^-23 and the 17 of one step), the S - 1 additions of the
 *           runs and alpha's product, the classical gamma_n bound (Higham, Accuracy and Stability of Numerical
 *           Algorithms, 2nd ed., 3.1); versions 0 and 6 (cuBLAS) against the same bound with S = 1;
 *   time    median of --reps (L2 flushed by a 256 MiB write before each, one warm-up), [min - max], GB/s of the
 *           compulsory bytes (E + P's M rows + out's M rows), and % of the floor: those bytes at the read ceiling
 *           measured in the same run (a streaming read of E, best of 5; the E read alone is ~1.48 GB, ~0.48 ms at
 *           ~3.1 TB/s on an H100), and the time against version 0's at the same M.
 * --small: emulation-sized (V 4104 = 64 x 64 + 8, a zero-filled tail; H 256; MMAX 200; M 1, 2, 8, 16, 40, 64, 100,
 * 163, 200), checks only (its times mean nothing). GPU:
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc dev/cuda/sc_prod.cu -lcublasLt -lcublas \
 *        -o build/sc_prod_lab && build/sc_prod_lab [--reps 7] [--versions 0,1,...] [--ms 1,163,...]
 * CPU emulation (dev/cuda_emu), after make BUILD=build-emu EMU=1 CUDA=0 build-emu/dev/cuda_emu/emu.o:
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc \
 *       dev/cuda/sc_prod.cu -x none build-emu/dev/cuda_emu/emu.o -lm -o build-emu/sc_prod_lab
 *   build-emu/sc_prod_lab --small
 * Exit status 1 if any check of versions 1-5, 7 fails (a word differs where invariance is claimed, or a sample exceeds
 * its bound); versions 0 and 6 (cuBLAS) are reported only. */
#ifndef DG_CUDA_EMU
#include <cublasLt.h>
#endif
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "sc_prod.cuh" /* dev/cuda/: the kernel (src/cuda/ until session 28) */

#undef CK
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

/* E ~ U(-1, 1) scale, P ~ U(0, 2) / V (probability-sized, positive) as bf16, from a hash of the index. */
#ifndef DG_CUDA_EMU
int dg_cuda_pdl = 1; /* as the backend (src/cuda/kernels.cu, unless DGEMMA_PDL=0): every launch with the PDL attribute */
#endif
__global__ void fill_kernel(bf16 *p, size_t n, unsigned seed, float lo, float scale) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed ^ (unsigned)(i >> 32) * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16_rn((lo + (float)(h & 0xffff) / 32768.0f) * scale);
  }
}
__global__ void flush_kernel(float4 *p, size_t n) {
  DG_PDL_ENTRY();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    p[i].x = (float)i; p[i].y = p[i].z = p[i].w = 0.f;
  }
}
/* The read ceiling: every 16-byte word of a read once, xor-folded (one word a block written so nothing is dead). */
__global__ void read_kernel(const uint4 *a, size_t n, unsigned *out) {
  DG_PDL_ENTRY();
  unsigned x = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = a[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) out[blockIdx.x] = x;
}

static float4 *g_flush;
static size_t g_flush_n;
static int g_small;
static void flush(cudaStream_t s) { DG_LAUNCH(flush_kernel, 1056, 256, 0, s)(g_flush, g_flush_n); }

/* Median, min and max of R timed runs of op (ms), L2 flushed before each, after one warm-up. */
template <class Op> static void timeit(int R, cudaStream_t s, Op op, float t3[3]) {
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
  std::sort(t.begin(), t.end());
  t3[0] = t[R / 2]; t3[1] = t[0]; t3[2] = t[R - 1];
  cudaEventDestroy(e0); cudaEventDestroy(e1);
}

static std::vector<int> parse_list(const char *s) {
  std::vector<int> v;
  while (*s) { v.push_back(atoi(s)); while (*s && *s != ',') s++; if (*s) s++; }
  return v;
}
static float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

int main(int argc, char **argv) {
  int reps = 7, V = 262144, H = 2816, MMAX = 2048;
  std::vector<int> ms = {1, 2, 8, 16, 64, 163, 256, 566, 1024, 2048}, vers = {0, 1, 2, 3, 4, 5, 7, 6};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = parse_list(argv[++i]);
    else if (!strcmp(argv[i], "--versions") && i + 1 < argc) vers = parse_list(argv[++i]);
    else if (!strcmp(argv[i], "--small")) g_small = 1;
    else { fprintf(stderr, "usage: %s [--reps N] [--ms a,b,..] [--versions 0,1,..] [--small]\n", argv[0]); return 2; }
  }
  if (g_small) { V = 4104; H = 256; MMAX = 200; ms = {1, 2, 8, 16, 40, 64, 100, 163, 200}; reps = 1; }
#ifdef DG_CUDA_EMU
  vers.erase(std::remove(vers.begin(), vers.end(), 6), vers.end());
#endif
  for (int &m : ms) m = std::min(std::max(m, 1), MMAX);
  const int mc5 = g_small ? 48 : 256; /* version 5's chunk (--small: several chunks at its M) */
  const float alpha = 53.0660f; /* sqrt(2816), the 26B's embed_scale */
  const int S = sc_prod_splits(V);
  const size_t nE = (size_t)V * H, nP = (size_t)MMAX * V, nO = (size_t)MMAX * H;
  printf("# sc_prod lab: V %d H %d MMAX %d, S %d runs, reps %d%s\n", V, H, MMAX, S, reps, g_small ? " (--small)" : "");
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bf16 *E, *P;
  float *ws, *ws256;
  const int NV = 8;
  float *out[NV] = {}, *ref[NV] = {}; /* out: the current M; ref: at MMAX */
  CK(cudaMalloc((void **)&E, nE * 2)); CK(cudaMalloc((void **)&P, nP * 2));
  CK(cudaMalloc((void **)&ws, (size_t)S * MMAX * H * 4)); CK(cudaMalloc((void **)&ws256, (size_t)S * 256 * H * 4));
  for (int v : vers) {
    if (v < 0 || v >= NV) { fprintf(stderr, "version %d: 0-%d\n", v, NV - 1); return 2; }
    CK(cudaMalloc((void **)&out[v], nO * 4)); CK(cudaMalloc((void **)&ref[v], nO * 4));
  }
  g_flush_n = g_small ? 1024 : ((size_t)256 << 20) / 16;
  CK(cudaMalloc((void **)&g_flush, g_flush_n * 16));
  unsigned *rd;
  CK(cudaMalloc((void **)&rd, 4096 * 4));
  DG_LAUNCH(fill_kernel, 1024, 256, 0, st)(E, nE, 0x9e3779b9u, -1.0f, 0.05f);
  DG_LAUNCH(fill_kernel, 1024, 256, 0, st)(P, nP, 0x7f4a7c15u, 0.0f, 1.0f / V);
  CK(cudaStreamSynchronize(st));

  cublasHandle_t hb;
  CB(cublasCreate(&hb)); CB(cublasSetStream(hb, st));
#ifndef DG_CUDA_EMU
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  const size_t lt_ws_bytes = (size_t)32 << 20;
  void *lt_ws;
  CK(cudaMalloc((void **)&lt_ws, lt_ws_bytes));
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t lt_algo;
  int lt_ok = 0, lt_v[4] = {-1, -1, -1, -1};
  {
    const cublasOperation_t tnn = CUBLAS_OP_N;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tnn, sizeof tnn));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tnn, sizeof tnn));
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, H, V, H));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, V, 256, V));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, H, 256, H));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_ws_bytes,
                                            sizeof lt_ws_bytes));
    cublasLtMatmulHeuristicResult_t hr[32];
    for (int from : {256, 2048}) { /* the lists at 256 rows, then at 2048 (session 26's verdict came from there) */
      if (lt_ok) break;
      uint64_t cols = (uint64_t)from;
      CB(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
      CB(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
      int nr = 0;
      if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, hr, &nr) != CUBLAS_STATUS_SUCCESS) nr = 0;
      for (int i = 0; i < nr && !lt_ok; i++) {
        uint32_t u[4] = {0, 0, 0, 0};
        size_t w = 0;
        const cublasLtMatmulAlgoConfigAttributes_t at[4] = {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                            CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                            CUBLASLT_ALGO_CONFIG_SPLITK_NUM};
        for (int a = 0; a < 4; a++) cublasLtMatmulAlgoConfigGetAttribute(&hr[i].algo, at[a], &u[a], sizeof u[a], &w);
        if (hr[i].state == CUBLAS_STATUS_SUCCESS && hr[i].workspaceSize <= lt_ws_bytes && u[3] == 1) {
          lt_algo = hr[i].algo; lt_ok = from;
          for (int a = 0; a < 4; a++) lt_v[a] = (int)u[a];
        }
      }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    printf("# version 6: cublasLt's first split-K 1 entry: %s %d rows' list (algo %d tile %d stages %d split-K %d)\n",
           lt_ok ? "from the" : "none in the 256 and 2048", lt_ok ? lt_ok : 0, lt_v[0], lt_v[1], lt_v[2], lt_v[3]);
  }
#endif
  /* version v at M rows into o; 0 where it cannot run */
  auto run = [&](int v, int M, float *o) -> int {
    const float zero = 0.0f;
    switch (v) {
    case 0:
      CB(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, H, M, V, &alpha, E, CUDA_R_16BF, H, P, CUDA_R_16BF, V, &zero, o,
                      CUDA_R_32F, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return 1;
    case 1: case 2: case 3: case 4: case 5: case 7: {
      const int bm = v == 2 ? 128 : v == 3 ? 64 : v == 4 ? 16 : v == 7 ? -128 : 0;
      CK(sc_prod_run(st, P, V, E, V, H, M, alpha, o, H, v == 5 ? ws256 : ws, v == 5 ? mc5 : MMAX, bm));
      return 1;
    }
#ifndef DG_CUDA_EMU
    case 6: {
      if (!lt_ok) return 0;
      uint64_t cols = (uint64_t)M;
      CB(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
      CB(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
      const cublasStatus_t s = cublasLtMatmul(lt, op, &alpha, E, la, P, lb, &zero, o, lc, o, lc, &lt_algo, lt_ws,
                                              lt_ws_bytes, st);
      return s == CUBLAS_STATUS_SUCCESS;
    }
#endif
    }
    return 0;
  };

  /* the read ceiling: E streamed, best of 5 */
  float ceil_gbs = 0.0f;
  {
    float t3[3], best = 1e30f;
    for (int r = 0; r < 5; r++) {
      timeit(1, st, [&] { DG_LAUNCH(read_kernel, 4096, 512, 0, st)((const uint4 *)E, nE * 2 / 16, rd); }, t3);
      best = std::min(best, t3[0]);
    }
    ceil_gbs = (float)(nE * 2 / (best * 1e6));
    printf("# read ceiling: E (%.3f GB) in %.4f ms = %.0f GB/s (best of 5)\n", nE * 2 / 1e9, best, ceil_gbs);
  }

  int fails = 0;
  std::vector<float> h_a(nO), h_b(nO);
  std::vector<uint16_t> hE(nE), hP;
  CK(cudaMemcpy(hE.data(), E, nE * 2, cudaMemcpyDeviceToHost));
  /* at MMAX: each version's reference output, the sampled check, the equality of 1-5 with 1 */
  {
    const int NS = g_small ? 400 : 256;
    hP.resize(nP);
    CK(cudaMemcpy(hP.data(), P, nP * 2, cudaMemcpyDeviceToHost));
    std::vector<int> st_t(NS), st_h(NS);
    uint32_t r = 12345;
    for (int s = 0; s < NS; s++) {
      r = r * 1664525u + 1013904223u; st_t[s] = s < 4 ? (s & 1 ? MMAX - 1 : 0) : (int)(r >> 8) % MMAX;
      r = r * 1664525u + 1013904223u; st_h[s] = s < 4 ? (s & 2 ? H - 1 : 0) : (int)(r >> 8) % H;
    }
    std::vector<double> rf(NS), ra(NS);
#pragma omp parallel for schedule(dynamic)
    for (int s = 0; s < NS; s++) {
      double a = 0.0, b = 0.0;
      for (int v = 0; v < V; v++) {
        const double x = (double)bf2f(hP[(size_t)st_t[s] * V + v]) * bf2f(hE[(size_t)v * H + st_h[s]]);
        a += x; b += fabs(x);
      }
      rf[s] = alpha * a; ra[s] = fabs(alpha) * b;
    }
    for (int v : vers) {
      if (!run(v, MMAX, ref[v])) { printf("version %d: cannot run at M %d\n", v, MMAX); continue; }
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(h_a.data(), ref[v], nO * 4, cudaMemcpyDeviceToHost));
      const int Sv = v != 0 && v != 6 ? S : 1;
      const double u = ldexp(1.0, -23), n = V / 16.0 + 17 + Sv + 1, gam = n * u / (1 - n * u);
      double worst = 0.0;
      for (int s = 0; s < NS; s++) {
        const double d = fabs((double)h_a[(size_t)st_t[s] * H + st_h[s]] - rf[s]),
                     bound = gam * ra[s] + ldexp(1.0, -24) * fabs(rf[s]);
        worst = std::max(worst, d / bound);
      }
      int eq1 = -1;
      if (v != 0 && v != 6 && v != 1 && out[1] && ref[1]) {
        CK(cudaMemcpy(h_b.data(), ref[1], nO * 4, cudaMemcpyDeviceToHost));
        eq1 = memcmp(h_a.data(), h_b.data(), nO * 4) == 0;
        if (!eq1) fails++;
      }
      if (worst > 1.0 && v != 0 && v != 6) fails++; /* cuBLAS's (S = 1 in the bound): reported only */
      printf("check version %d at M %d: %d samples vs fp64, worst |diff| / bound %.4f (gamma_n n %.0f)%s%s\n", v, MMAX,
             NS, worst, n, eq1 < 0 ? "" : eq1 ? ", all words equal to version 1's" : ", WORDS DIFFER from version 1's",
             worst > 1.0 && v != 0 && v != 6 ? "  FAIL" : (worst > 1.0 ? "  (beyond the model's bound)" : ""));
    }
  }
  const double bytesE = (double)nE * 2;
  printf("\n| version | M | ms median | [min - max] | GB/s | %% of floor | vs v0 | rows differing from M %d |\n", MMAX);
  printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<std::vector<float>> tmed(NV, std::vector<float>(ms.size(), 0.0f));
  for (size_t mi = 0; mi < ms.size(); mi++) {
    const int M = ms[mi];
    const double bytes = bytesE + (double)M * V * 2 + (double)M * H * 4, floor_ms = bytes / (ceil_gbs * 1e6);
    for (int v : vers) {
      CK(cudaMemset(out[v], 0xff, (size_t)M * H * 4));
      if (!run(v, M, out[v])) { printf("| %d | %d | refused | | | | | |\n", v, M); continue; }
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(h_a.data(), out[v], (size_t)M * H * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h_b.data(), ref[v], (size_t)M * H * 4, cudaMemcpyDeviceToHost));
      int rows = 0;
      for (int t = 0; t < M; t++) rows += memcmp(&h_a[(size_t)t * H], &h_b[(size_t)t * H], (size_t)H * 4) != 0;
      const bool ours = v != 0 && v != 6; /* cuBLAS's versions are reported, not claimed invariant here */
      if (rows && ours) fails++;
      float t3[3] = {0, 0, 0};
      if (!g_small) timeit(reps, st, [&] { run(v, M, out[v]); }, t3);
      tmed[v][mi] = t3[0];
      printf("| %d | %d | %.4f | %.4f - %.4f | %.0f | %.1f | %.3f | %d%s |\n", v, M, t3[0], t3[1], t3[2],
             t3[0] > 0 ? bytes / (t3[0] * 1e6) : 0.0, t3[0] > 0 ? 100.0 * floor_ms / t3[0] : 0.0,
             tmed[0][mi] > 0 ? t3[0] / tmed[0][mi] : 0.0, rows, rows && ours ? "  FAIL" : "");
    }
  }
  printf("\n%s: %d failed checks\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}
