/* attention.cu (lab): the layer attention's versions side by side on the
 * 26B-A4B shapes (issue 12), in the manner of llm.c's dev/cuda: each checked
 * against a double-precision CPU reference on sampled rows of seeded random
 * input, each timed with cudaEvents over repetitions (L2 flushed between
 * them: the KV cache is read from device memory, as in a pass) against the
 * roofline of this GPU measured in the same invocation.
 *
 *   version 1  attention_kernel (src/cuda/attention.cu): one warp per (query,
 *              head), sequential over the keys, fp32
 *   version 2  flash_kernel: tensor cores, online softmax over cp.async key
 *              tiles, key splits merged by flash_combine_kernel; 4 warps
 *              (64 rows), 64 keys per tile (32 at D = 512) (the backend's)
 *   version 3  the same, 32 keys per tile (16 at D = 512): 2 blocks per SM
 *   version 4  8 warps (128 rows), 32 keys per tile (16 at D = 512)
 *   version 5  version 2 with the earlier key-split rule (enough blocks for two waves; fa_splits)
 *   version 6  flash_pair_kernel: 8 warps on 64 rows, warps w and w ^ 4 splitting the head dim for Q K^T
 *              (partial scores added through shared memory) and P V (each half the output columns): no value
 *              slices at D = 512, two warps per sub-partition (D 64: as version 2); key splits on causal
 *              rows too, merged by fp_combine_kernel
 *   version 7  flash_pair_kernel with two m-tiles (32 rows) per warp, 128 rows per block, 32 keys per tile at
 *              D 128 and 256 (each K and V fragment loaded from shared memory once for 32 rows); D 512 as 6
 *   version 8  version 7 with a 3-deep K/V ring (tile it + 2 issued at step it) at D 128 and 256; D 512 as 6
 * (16-18: dev/cuda/attention_lab.cuh att_wqc_kernel, lab only.)
 * Versions 1-8 and 15 are the backend's (src/cuda/attention.cu, k_attention_any; 15, att_wq_kernel in
 * src/cuda/attention_wq.cuh, its default on Hopper since session 25, run here from the lab's own instance); 9-14 the
 * lab's own (attention_lab.cuh,
 * att_lab_version; 9-11: version 6's block from src/cuda/attention.cuh with the changes below, slower than 6 on every
 * row on an H100 in session 18, so not in the backend; 12-14: their own kernel, att_wq_kernel; on an H100 in
 * session 24 12 was 8-9 % faster than 6 at the decoder's sliding rows and even at the full ones, 13 no faster):
 *   version 9  version 6 with the key splits merged inside the kernel: the last split block of a row tile to arrive
 *              (an arrival counter per tile) merges its rows as fp_combine_kernel does, bit for bit, so no combine
 *              launch (fp_combine_kernel: 6.4 us of the sliding layer's 44, 9.2 of the full layer's 82 in session
 *              14's Nsight Compute run)
 *   version 10 version 9 with the pair's own barrier (bar.sync 1 + pair, 64 threads) for the score exchange: one
 *              block-wide barrier per key tile instead of two
 *   version 11 version 10 at D 128 and 256 with 32-key tiles in 112 KiB of shared memory under
 *              __launch_bounds__(256, 2) (at most 128 registers): 2 blocks per SM, 4 warps per scheduler from two
 *              blocks whose barriers are independent; the split rule then gives 4 splits at the sliding layer; D 512
 *              as 10
 *   version 12 (session 23) Q K^T on wgmma (sm_90a), whole rows per warp: two warpgroups per block; D 128 / 256:
 *              128 rows (64 per warpgroup) sharing each 64-key K/V tile, no score exchange, one barrier per tile,
 *              each softmax once; D 512: both warpgroups on the same 64 rows, each half of the output columns
 *              (Q K^T computed by both), 32-key tiles; P V on mma.sync; splits merged by fp_combine_kernel
 *              (attention.cuh), as version 6's are. Needs the sm_90a build below (elsewhere it traps)
 *   version 13 (session 23) version 12 with one warpgroup per block (64 rows), 32-key tiles at D 128 / 256: two
 *              blocks per SM; D 512 as 12
 *   version 14 (session 24) version 12 with its prologue's latency chain cut: the first K/V tile's copies issued
 *              before the Q tile, the Q tile's loads of a batch (8 chunks per thread) all in flight before their
 *              conversions (version 12's fa_load_q: one pair of loads per branch and store, 8 dependent round
 *              trips at D 512); output bit-identical to 12's
 *   version 15 (session 24) version 14 with P V on wgmma: P from registers as A, V read MN-major (transposed B)
 *              from the same swizzled panels, DV / 128 m64n128k16 per 16 keys and warpgroup
 *   version 16 (session 29) version 15's block launched in thread block clusters of its key splits: the partials
 *              staged in shared memory and merged through distributed shared memory with fp_combine_kernel's
 *              arithmetic, no partials in device memory, no combine launch (15's words where the splits agree)
 *   version 17 (session 29) version 16's kernel over B canvases in one launch (--batch), one split count for all
 *   version 18 (session 29) version 17 with each canvas's own split count (its single launch's words, any batch)
 * --prof (timing only): after the table, versions 12, 14 and 15 (if asked) once more per row with att_wq_kernel's
 * clock64 stamps per phase (prologue, wait + barrier, copies issued, Q K^T, softmax, P V, store: attention_lab.cuh),
 * the flash kernel and fp_combine_kernel timed apart by an event between them.
 * Every version is launched twice before its check, the second time into an output of NaN bytes, which is the one
 * checked (9-11: the arrival counters must be back at zero after a launch).
 *
 * Rows (spec 3.1: 16 query heads; sliding layers 8 KV heads of 256, window
 * 1024; full layers 2 KV heads of 512):
 *   decoder  a 256-token canvas after P cached positions (keys: the window or
 *            everything, plus the canvas), P = 1024, 2048, 4096
 *   encoder  a 256-token causal prefill chunk at position P
 * FLOPs = 4 x query rows x heads x keys x D (QK and PV; causal: the keys each
 * row sees); bytes = K and V of the keys read (each KV head once) + q (fp32)
 * + out (bf16). Roofline = max(bytes / read BW, FLOPs / bf16 rate).
 *
 * Build and run (GPU machine, after make CUDA=1):
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc dev/cuda/attention.cu \
 *        build/libdgemma.a -lcublas -lcudart -o build/attention_lab
 *   build/attention_lab [--reps N] [--versions 1,2] [--small] [--prof] [--batch B] [--decoder]
 * --batch B (1..8): after each row's versions, the same row for B canvases, each its own q, K/V cache and output: 15
 * and 16 as B launches, 17 and 18 as one (rows "... B4"); --decoder: the decoder rows at P 1024 and 2048 only (the
 * 26B decoder's 1,280 and 2,304 full-layer keys). 16-18 compare their words with 15's ("= v15 word for word").
 * (versions 1-8 are the library's, k_attention_any: built by make CUDA=1 with its CUDA_ARCH; 9-14 this file's, built
 * by the line above; dev/gpu/att12.sh builds both for sm_90a and runs 6, 12 and 13 side by side, dev/gpu/s25_at12.sh
 * 6, 12, 14 and 15, and 12, 14 and 15 with --prof.)
 * --small: emulation-sized rows (canvas 32 after P = 96 and 160, window 64; checks only, every row checked),
 * for the CPU emulation of dev/cuda_emu after make BUILD=build-emu EMU=1 CUDA=0 build-emu/libdgemma.a:
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc \
 *       dev/cuda/attention.cu -x none build-emu/libdgemma.a -lcjson -lm -lstdc++ -o build-emu/attention_lab
 *   build-emu/attention_lab --small --versions 2,6
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <cmath>
#include <vector>

#include "attention_lab.cuh" /* versions 9-14 (lab only) */
#include "cuda/common.cuh"

#define CKL(x)                                                                                                   \
  do {                                                                                                           \
    cudaError_t e_ = (x);                                                                                        \
    if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
  } while (0)

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545f4914f6cdd1dull; }
static float frand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static uint16_t f2b(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
  DG_PDL_ENTRY();
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}
static float time_ms(cudaEvent_t a, cudaEvent_t b) { float ms; CKL(cudaEventElapsedTime(&ms, a, b)); return ms; }

int main(int argc, char **argv) {
  int reps = 20, vmask = 30, small = 0, prof = 0, batch = 1, decoder_only = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--versions") && i + 1 < argc) { /* a comma-separated list of 1..ATT_LAB_LAST */
      vmask = 0;
      for (char *p = argv[++i], *end; *p; p = *end ? end + 1 : end) {
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > ATT_LAB_LAST || (*end && *end != ',')) {
          fprintf(stderr, "attention_lab: --versions takes versions 1..%d separated by commas\n", ATT_LAB_LAST);
          return 2;
        }
        vmask |= 1 << v;
      }
    } else if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--prof")) prof = 1;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = atoi(argv[++i]);
      if (batch < 1 || batch > WQC_MAXB) { fprintf(stderr, "attention_lab: --batch takes 1..%d\n", WQC_MAXB); return 2; }
    } else if (!strcmp(argv[i], "--decoder")) decoder_only = 1;
    else {
      fprintf(stderr, "usage: attention_lab [--reps N] [--versions 1,2] [--small] [--prof] [--batch B] [--decoder]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CKL(cudaGetDeviceProperties(&prop, 0));
  cudaEvent_t e0, e1;
  CKL(cudaEventCreate(&e0));
  CKL(cudaEventCreate(&e1));
  /* ceilings: read bandwidth over 4 GiB, bf16 GEMM 8192^3 */
  const size_t RB = small ? (size_t)1 << 20 : (size_t)4 << 30;
  uint4 *big;
  unsigned *sink;
  CKL(cudaMalloc((void **)&big, RB));
  CKL(cudaMalloc((void **)&sink, 4));
  CKL(cudaMemset(big, 1, RB));
  std::vector<float> t;
  for (int r = 0; r < 5; r++) {
    CKL(cudaEventRecord(e0));
    DG_LAUNCH(read_kernel, prop.multiProcessorCount * 8, 512, 0, 0)(big, RB / 16, sink);
    CKL(cudaEventRecord(e1));
    CKL(cudaEventSynchronize(e1));
    t.push_back(time_ms(e0, e1));
  }
  std::sort(t.begin(), t.end());
  const double bw = RB / (t[t.size() / 2] * 1e-3);
  double rate = 1e12;
  if (!small) {
    const int N = 8192;
    cublasHandle_t h;
    cublasCreate(&h);
    void *A, *B, *Cm;
    CKL(cudaMalloc((void **)&A, (size_t)N * N * 2)); CKL(cudaMalloc((void **)&B, (size_t)N * N * 2)); CKL(cudaMalloc((void **)&Cm, (size_t)N * N * 4));
    CKL(cudaMemset(A, 0x3c, (size_t)N * N * 2)); CKL(cudaMemset(B, 0x3c, (size_t)N * N * 2));
    const float one = 1, zero = 0;
    std::vector<float> g;
    for (int r = 0; r < 4; r++) {
      CKL(cudaEventRecord(e0));
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, Cm, CUDA_R_32F, N,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      CKL(cudaEventRecord(e1));
      CKL(cudaEventSynchronize(e1));
      g.push_back(time_ms(e0, e1));
    }
    std::sort(g.begin(), g.end());
    rate = 2.0 * N * N * (double)N / (g[g.size() / 2] * 1e-3);
    cudaFree(A); cudaFree(B); cudaFree(Cm);
    cublasDestroy(h);
  }
  printf("# %s: ceilings read %.0f GB/s, bf16 %.0f TFLOP/s\n", prop.name, bw / 1e9, rate / 1e12);
  printf("| row | version | ms (median) | min-max | TFLOP/s | GB/s | roofline ms | %% of roofline | check |\n|---|---|---|---|---|---|---|---|---|\n");

  struct row { const char *name; int full, causal, P; };
  const row small_rows[] = {{"decoder sliding P160", 0, 0, 160}, {"decoder full P96", 1, 0, 96},
                            {"encoder sliding P96", 0, 1, 96}, {"encoder full P96", 1, 1, 96}};
  const row big_rows[] = {{"decoder sliding P1024", 0, 0, 1024}, {"decoder full P1024", 1, 0, 1024},
                      {"decoder sliding P2048", 0, 0, 2048}, {"decoder full P2048", 1, 0, 2048},
                      {"decoder sliding P4096", 0, 0, 4096}, {"decoder full P4096", 1, 0, 4096},
                      {"encoder sliding P1024", 0, 1, 1024}, {"encoder full P1024", 1, 1, 1024}};
  const int NH = 16, C = small ? 32 : 256, W = small ? 64 : 1024;
  int failed = 0;
  const int nrows = small ? 4 : 8;
  /* --prof: versions 12 and 14 once more per row with att_wq_kernel's phase stamps (attention_lab.cuh, PROF) */
  const int PMAXB = 4096, PSTR = WQ_PROF_BLOCK + 64;
  unsigned long long *dprof = NULL;
  std::vector<unsigned long long> hprof;
  std::vector<std::string> plines;
  cudaEvent_t emid;
  CKL(cudaEventCreate(&emid));
  if (prof) {
    CKL(cudaMalloc((void **)&dprof, (size_t)PMAXB * PSTR * 8));
    hprof.resize((size_t)PMAXB * PSTR);
  }
  /* the CPU reference's check of sampled (query, head) rows of one canvas against double precision: |diff| <= 2^-6
   * max|o| of the row (the test's derived per-element bound is in tests/test_cuda.c; here a coarse screen); the worst
   * ratio (NaN sticks) */
  auto check_rows = [&](const std::vector<float> &q, const std::vector<uint16_t> &kc, const std::vector<uint16_t> &vc,
                        const std::vector<uint16_t> &out, int nq, int NH, int NKV, int D, int S, int pos0, int kv_hi,
                        int causal, int full, int W) {
    const int G = NH / NKV;
    double worst = 0;
    const int nsmp = small ? nq * NH : 24;
    for (int smp = 0; smp < nsmp; smp++) {
      const int tq = small ? smp / NH : (int)(rnd() % nq), h = small ? smp % NH : (int)(rnd() % NH), g = h / G,
                pos = pos0 + tq;
      const int hi = causal ? pos + 1 : kv_hi;
      const int lo = full ? 0 : causal ? std::max(0, pos + 1 - W) : std::max(0, pos0 - (W - 1));
      std::vector<double> sc(hi - lo);
      double m = -INFINITY, den = 0;
      for (int j = lo; j < hi; j++) {
        double acc = 0;
        for (int d = 0; d < D; d++) acc += (double)q[((size_t)tq * NH + h) * D + d] * b2f(kc[((size_t)g * S + j) * D + d]);
        sc[j - lo] = acc;
        m = std::max(m, acc);
      }
      for (double &x : sc) { x = exp(x - m); den += x; }
      double omax = 0, dmax = 0;
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int j = lo; j < hi; j++) o += sc[j - lo] / den * b2f(vc[((size_t)g * S + j) * D + d]);
        omax = std::max(omax, fabs(o));
        const double e = fabs(o - b2f(out[((size_t)tq * NH + h) * D + d]));
        if (e > dmax || std::isnan(e)) dmax = e; /* a NaN sticks (std::max drops it) and fails the row */
      }
      const double r = dmax / (ldexp(1.0, -6) * omax);
      if (r > worst || std::isnan(r)) worst = r;
    }
    return worst;
  };
  for (int ri = 0; ri < nrows; ri++) {
    const row &rw = small ? small_rows[ri] : big_rows[ri];
    if (decoder_only && (rw.causal || rw.P > 2048)) continue; /* --decoder: the 26B decoder's 1,280 / 2,304 keys */
    const int NKV = rw.full ? 2 : 8, D = rw.full ? 512 : 256;
    const int S = rw.P + C, nq = C, pos0 = rw.P, kv_hi = rw.P + C;
    const size_t kvn = (size_t)NKV * S * D, qn = (size_t)nq * NH * D;
    std::vector<float> q(qn);
    std::vector<uint16_t> kc(kvn), vc(kvn), out(qn), ref15;
    for (auto &x : q) x = 0.25f * frand();
    for (auto &x : kc) x = f2b(1.7f * frand());
    for (auto &x : vc) x = f2b(frand() + 0.25f);
    float *dq; bf16 *dk, *dv, *dout;
    dg_att_ws ws = {}; /* ver, wq_why: the passes' choice, unused here (versions are named per call) */
    ws.n = 8 * (size_t)nq * NH * (D + 2);
    const int ncnt = 4096; /* versions 9-11's arrival counters (a 256-token canvas of the 26B: 64 (row tile, KV head)) */
    int *cnt;
    CKL(cudaMalloc((void **)&cnt, (size_t)ncnt * 4));
    CKL(cudaMemset(cnt, 0, (size_t)ncnt * 4)); /* zero between launches: each merging block re-zeroes its own */
    CKL(cudaMalloc((void **)&dq, qn * 4)); CKL(cudaMalloc((void **)&dk, kvn * 2)); CKL(cudaMalloc((void **)&dv, kvn * 2)); CKL(cudaMalloc((void **)&dout, qn * 2));
    CKL(cudaMalloc((void **)&ws.part, ws.n * 4));
    CKL(cudaMemcpy(dq, q.data(), qn * 4, cudaMemcpyHostToDevice));
    CKL(cudaMemcpy(dk, kc.data(), kvn * 2, cudaMemcpyHostToDevice));
    CKL(cudaMemcpy(dv, vc.data(), kvn * 2, cudaMemcpyHostToDevice));
    if (vmask >> 16 & 1 || vmask >> 17 & 1 || vmask >> 18 & 1) { /* version 15's words, for 16-18's comparison */
      ref15.resize(qn);
      CKL(k_attention_any(0, &ws, 15, dq, dk, dv, dout, S, nq, NH, NKV, D, pos0, kv_hi, rw.causal, rw.full, W));
      CKL(cudaDeviceSynchronize());
      CKL(cudaMemcpy(ref15.data(), dout, qn * 2, cudaMemcpyDeviceToHost));
    }
    /* keys per row and the cost model */
    double keys_tot = 0, kv_keys = 0;
    for (int tq = 0; tq < nq; tq++) {
      const int pos = pos0 + tq, hi = rw.causal ? pos + 1 : kv_hi;
      const int lo = rw.full ? 0 : rw.causal ? std::max(0, pos + 1 - W) : std::max(0, pos0 - (W - 1));
      keys_tot += hi - lo;
    }
    {
      const int hi = kv_hi, lo = rw.full ? 0 : std::max(0, pos0 + 1 - W);
      kv_keys = hi - lo;
    }
    const double flops = 4.0 * NH * keys_tot * D, bytes = kv_keys * NKV * D * 2 * 2 + qn * 4 + qn * 2;
    const double roof = std::max(bytes / bw, flops / rate) * 1e3;
    auto words_vs15 = [&](const std::vector<uint16_t> &o, const std::vector<uint16_t> &r) {
      size_t n = 0;
      for (size_t i = 0; i < o.size(); i++) n += o[i] != r[i];
      return n;
    };
    for (int v = 1; v <= ATT_LAB_LAST; v++) {
      if (!(vmask >> v & 1)) continue;
      auto launch = [&]() { /* the backend's versions, or the lab's own */
        return v < ATT_LAB_FIRST
                   ? k_attention_any(0, &ws, v, dq, dk, dv, dout, S, nq, NH, NKV, D, pos0, kv_hi, rw.causal, rw.full, W)
                   : att_lab_version(v, 0, &ws, cnt, ncnt, dq, dk, dv, dout, S, nq, NH, NKV, D, pos0, kv_hi, rw.causal,
                                     rw.full, W);
      };
      CKL(launch());
      CKL(cudaMemset(dout, 0xFF, qn * 2)); /* NaN: the second launch is the one checked */
      CKL(launch());
      CKL(cudaDeviceSynchronize());
      CKL(cudaMemcpy(out.data(), dout, qn * 2, cudaMemcpyDeviceToHost));
      const double worst = check_rows(q, kc, vc, out, nq, NH, NKV, D, S, pos0, kv_hi, rw.causal, rw.full, W);
      const bool ok = worst <= 1.0;
      failed += !ok;
      char cmp[64] = "";
      if (v >= 16 && v <= 18 && !ref15.empty()) { /* same splits as 15: its words exactly (docs/cuda.md) */
        const size_t nd = words_vs15(out, ref15);
        snprintf(cmp, sizeof cmp, nd ? ", %d splits, %zu words != v15" : ", %d splits, = v15 word for word", wqc_last_ns,
                 nd);
      }
      std::vector<float> ms;
      for (int r = 0; r < (small ? 1 : reps); r++) {
        DG_LAUNCH(read_kernel, prop.multiProcessorCount * 8, 512, 0, 0)(big, std::min(RB, (size_t)256 << 20) / 16, sink); /* flush the 60 MB L2 */
        CKL(cudaEventRecord(e0));
        CKL(launch());
        CKL(cudaEventRecord(e1));
        CKL(cudaEventSynchronize(e1));
        ms.push_back(time_ms(e0, e1));
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      printf("| %s | %d | %.4f | %.4f-%.4f | %.1f | %.0f | %.4f | %.1f%% | %s (worst %.3f)%s |\n", rw.name, v, med, ms[0],
             ms.back(), flops / (med * 1e-3) / 1e12, bytes / (med * 1e-3) / 1e9, roof, 100.0 * roof / med,
             ok ? "ok" : "FAILED", worst, cmp);
      fflush(stdout);
      if (prof && (v == 12 || v == 14 || v == 15) && D != 64) { /* one stamped launch after an L2 flush */
        int nb = PMAXB;
        const int NW = 8; /* att_wq_kernel at D 128-512: two warpgroups */
        CKL(cudaMemset(dprof, 0, (size_t)PMAXB * PSTR * 8));
        DG_LAUNCH(read_kernel, prop.multiProcessorCount * 8, 512, 0, 0)(big, std::min(RB, (size_t)256 << 20) / 16, sink);
        CKL(cudaEventRecord(e0));
        CKL(att_lab_profile(v, 0, &ws, dprof, &nb, emid, dq, dk, dv, dout, S, nq, NH, NKV, D, pos0, kv_hi, rw.causal,
                            rw.full, W));
        CKL(cudaEventRecord(e1));
        CKL(cudaEventSynchronize(e1));
        CKL(cudaMemcpy(hprof.data(), dprof, (size_t)nb * PSTR * 8, cudaMemcpyDeviceToHost));
        unsigned long long g0 = ~0ull, g1 = 0, smax = 0;
        double ck = 0, ns = 0, ph[WQ_NPH] = {0};
        std::vector<double> dur;
        std::vector<int> per_sm(1024, 0);
        for (int b = 0; b < nb; b++) {
          const unsigned long long *pb = &hprof[(size_t)b * PSTR];
          g0 = std::min(g0, pb[0]); g1 = std::max(g1, pb[1]); smax = std::max(smax, pb[0]);
          ck += (double)(pb[3] - pb[2]); ns += (double)(pb[1] - pb[0]);
          dur.push_back((pb[1] - pb[0]) * 1e-3);
          per_sm[pb[4] & 1023]++;
          for (int w = 0; w < NW; w++)
            for (int k = 0; k < WQ_NPH; k++) ph[k] += (double)pb[WQ_PROF_BLOCK + w * 8 + k];
        }
        std::sort(dur.begin(), dur.end());
        const double ghz = ns > 0 ? ck / ns : 1.0; /* cycles per ns */
        int sms = 0, maxb = 0;
        for (int c : per_sm) { sms += c > 0; maxb = std::max(maxb, c); }
        char buf[512];
        int n = snprintf(buf, sizeof buf, "| %s | %d | %.4f | %.4f | %d x %d | %d (<= %d each) | %.2f | %.2f | %.2f / %.2f |",
                         rw.name, v, time_ms(e0, emid), time_ms(emid, e1), nb, (int)hprof[5], sms, maxb, (g1 - g0) * 1e-3,
                         (smax - g0) * 1e-3, dur[dur.size() / 2], dur.back());
        double tot = 0;
        for (int k = 0; k < WQ_NPH; k++) {
          const double us = ph[k] / (nb * NW) / ghz * 1e-3;
          tot += us;
          n += snprintf(buf + n, sizeof buf - n, " %.2f |", us);
        }
        snprintf(buf + n, sizeof buf - n, " %.2f | %.3f |", tot, ghz);
        plines.push_back(buf);
      }
    }
    /* --batch B: B canvases, each its own q, K/V cache and output (canvas 0 the row's; --small: canvas i at position
     * pos0 - 24 i, so that per-canvas positions and, at the full rows, per-canvas split counts (2, 2, 1, 1) are
     * exercised): version 15 and 16 as B launches (the passes' way), 17 and 18 as one launch over the B canvases
     * (att_lab_batch; 18 with each canvas's own split count); every canvas checked and compared with 15's words, the
     * time of all B together */
    if (batch > 1 && (vmask >> 15 & 1 || vmask >> 16 & 1 || vmask >> 17 & 1 || vmask >> 18 & 1)) {
      const int nb = batch;
      std::vector<std::vector<float>> bq(nb);
      std::vector<std::vector<uint16_t>> bk(nb), bv(nb), bo(nb), b15(nb);
      std::vector<float *> pq(nb);
      std::vector<bf16 *> pk(nb), pv(nb), po(nb);
      std::vector<int32_t> bpos(nb);
      std::vector<int> bhi(nb);
      for (int i = 0; i < nb; i++) {
        bpos[i] = small ? pos0 - 24 * i : pos0;
        bhi[i] = bpos[i] + C;
        if (i == 0) { bq[0] = q; bk[0] = kc; bv[0] = vc; }
        else {
          bq[i].resize(qn); bk[i].resize(kvn); bv[i].resize(kvn);
          for (auto &x : bq[i]) x = 0.25f * frand();
          for (auto &x : bk[i]) x = f2b(1.7f * frand());
          for (auto &x : bv[i]) x = f2b(frand() + 0.25f);
        }
        bo[i].resize(qn);
        CKL(cudaMalloc((void **)&pq[i], qn * 4)); CKL(cudaMalloc((void **)&pk[i], kvn * 2));
        CKL(cudaMalloc((void **)&pv[i], kvn * 2)); CKL(cudaMalloc((void **)&po[i], qn * 2));
        CKL(cudaMemcpy(pq[i], bq[i].data(), qn * 4, cudaMemcpyHostToDevice));
        CKL(cudaMemcpy(pk[i], bk[i].data(), kvn * 2, cudaMemcpyHostToDevice));
        CKL(cudaMemcpy(pv[i], bv[i].data(), kvn * 2, cudaMemcpyHostToDevice));
      }
      for (int i = 0; i < nb; i++) { /* version 15's words per canvas */
        CKL(k_attention_any(0, &ws, 15, pq[i], pk[i], pv[i], po[i], S, nq, NH, NKV, D, bpos[i], bhi[i], rw.causal,
                            rw.full, W));
        CKL(cudaDeviceSynchronize());
        b15[i].resize(qn);
        CKL(cudaMemcpy(b15[i].data(), po[i], qn * 2, cudaMemcpyDeviceToHost));
      }
      for (int v = 15; v <= 18; v++) {
        if (!(vmask >> v & 1)) continue;
        int ns17 = 0;
        auto launch = [&]() -> cudaError_t {
          if (v >= 17)
            return att_lab_batch(0, nb, pq.data(), pk.data(), pv.data(), po.data(), bpos.data(), bhi.data(), S, nq, NH,
                                 NKV, D, rw.causal, rw.full, W, &ns17, v == 18);
          for (int i = 0; i < nb; i++) {
            const cudaError_t e =
                v == 15 ? k_attention_any(0, &ws, 15, pq[i], pk[i], pv[i], po[i], S, nq, NH, NKV, D, bpos[i], bhi[i],
                                          rw.causal, rw.full, W)
                        : att_lab_version(16, 0, &ws, cnt, ncnt, pq[i], pk[i], pv[i], po[i], S, nq, NH, NKV, D, bpos[i],
                                          bhi[i], rw.causal, rw.full, W);
            if (e != cudaSuccess) return e;
          }
          return cudaSuccess;
        };
        CKL(launch());
        for (int i = 0; i < nb; i++) CKL(cudaMemset(po[i], 0xFF, qn * 2));
        CKL(launch());
        CKL(cudaDeviceSynchronize());
        double worst = 0;
        size_t nd = 0;
        for (int i = 0; i < nb; i++) {
          CKL(cudaMemcpy(bo[i].data(), po[i], qn * 2, cudaMemcpyDeviceToHost));
          const double w = check_rows(bq[i], bk[i], bv[i], bo[i], nq, NH, NKV, D, S, bpos[i], bhi[i], rw.causal,
                                      rw.full, W);
          if (w > worst || std::isnan(w)) worst = w;
          nd += words_vs15(bo[i], b15[i]);
        }
        const bool ok = worst <= 1.0;
        failed += !ok;
        std::vector<float> ms;
        for (int r = 0; r < (small ? 1 : reps); r++) {
          DG_LAUNCH(read_kernel, prop.multiProcessorCount * 8, 512, 0, 0)(big, std::min(RB, (size_t)256 << 20) / 16, sink);
          CKL(cudaEventRecord(e0));
          CKL(launch());
          CKL(cudaEventRecord(e1));
          CKL(cudaEventSynchronize(e1));
          ms.push_back(time_ms(e0, e1));
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        char name[96], cmp[96];
        snprintf(name, sizeof name, "%s B%d", rw.name, nb);
        if (v >= 17)
          snprintf(cmp, sizeof cmp, ", one launch, %d split%s%s, %zu words != v15", ns17, ns17 > 1 ? "s" : "",
                   v == 18 ? " (cluster; each canvas its own)" : "", nd);
        else snprintf(cmp, sizeof cmp, ", %d launches, %zu words != v15", nb, nd);
        printf("| %s | %d | %.4f | %.4f-%.4f | %.1f | %.0f | %.4f | %.1f%% | %s (worst %.3f)%s |\n", name, v, med, ms[0],
               ms.back(), nb * flops / (med * 1e-3) / 1e12, nb * bytes / (med * 1e-3) / 1e9, nb * roof,
               100.0 * nb * roof / med, ok ? "ok" : "FAILED", worst, cmp);
        fflush(stdout);
      }
      for (int i = 0; i < nb; i++) { cudaFree(pq[i]); cudaFree(pk[i]); cudaFree(pv[i]); cudaFree(po[i]); }
    }
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(ws.part); cudaFree(cnt);
  }
  if (prof) {
    printf("\n--prof (timing only): one launch per row and version after an L2 flush, att_wq_kernel's stamps: flash /\n"
           "combine ms by events around each kernel; blocks x tiles (block 0's); SMs used; span = first block start to\n"
           "last block end, starts = last block start after the first; block us median / max; then per warp (mean over\n"
           "every warp of every block) the phases in us at the blocks' own clock (cycles per ns, last column): a stamp\n"
           "after an asynchronous instruction does not wait for it (attention_lab.cuh, version 14's comment)\n");
    printf("| row | version | flash ms | combine ms | blocks x tiles | SMs | span us | starts us | block us | prologue | "
           "wait+barrier | copies issued | Q K^T | softmax | P V | store | sum | GHz |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (auto &l : plines) printf("%s\n", l.c_str());
    cudaFree(dprof);
  }
  if (vmask >> 16 & 1 || vmask >> 17 & 1 || vmask >> 18 & 1) { /* versions 16-18: blocks resident per split count */
    const int *s256 = wqc_slots<256, 64, 1, 1>(), *s512 = wqc_slots<512, 32, 2, 1>();
    printf("# version 16 (NB 1) blocks resident at once per split count 1..%d (clusters of that many x the count):", WQC_MAXS);
    for (int ns = 1; ns <= WQC_MAXS; ns++) printf(" %d/%d", s256 ? s256[ns] : -1, s512 ? s512[ns] : -1);
    printf(" (D 256 / D 512)\n");
  }
  printf("# check: %d failing rows\n", failed);
  return failed ? 1 : 0;
}
