/* step_kernels.cu (lab): the small kernels of a 26B-A4B decoder step (issue 12) side by side, the earlier
 * version and the backend's, in the manner of dev/cuda/attention.cu: each checked against a double-precision
 * CPU reference (the sampler statistics against dg_position_stats itself), each timed with cudaEvents over
 * repetitions with the L2 flushed before each (inputs from device memory; the row kernels' inputs are
 * 1-25 MB and would otherwise sit in the 60 MB L2), against the read bandwidth of this GPU measured in the
 * same invocation.
 *
 *   step stats  C = 256 positions x V = 262,144 logits, z = logits / T in place, argmax, entropy, max prob,
 *               proposal (argmax / Philox inverse cdf)
 *     v1  step_stats_kernel (copied here): one block of 512 threads per position, strided scalar loads, five
 *         passes over the row (the cdf scan over contiguous per-thread chunks: uncoalesced)
 *     v0  src/cuda/kernels.cu's k_step_stats: blocks of 8192 logits (float4 loads, registers), partials
 *         combined in a fixed order; 2 passes (argmax mode) or 3 (sampled), plus one chunk per position;
 *         "v0 gN": the chunk passes launched over groups of N positions (k_step_stats_g), so that the
 *         sampled mode's second pass reads the L2
 *   sc probs    P = bf16(softmax(bf16(z))) over the same C x V
 *     v1  sc_probs_kernel (copied here): one block per position, three strided passes
 *     v0  k_sc_probs: three passes of 8192-logit blocks (max, sum, write); "v0 gN" in groups of N
 *         positions (k_sc_probs_g): the second and third passes read the L2
 *   rows        T = 256 token rows of H = 2816 (dense I = 2112; q/k/v heads of 256 and 512)
 *     rmsnorm, attn_residual, ffn_combine (K = 8 of 128 experts), geglu, qkv_post: v1 the earlier kernels,
 *     v0 the backend's (one row in registers as float4s, one barrier per reduction; warp per head for
 *     qkv_post), v2 rmsnorm at 128 threads per row; "ffn_combine + next norm" (k_ffn_combine_norm_v, the backend's
 *     launch): v0 the default's, v2 the next norm's weight loaded at the start (DGEMMA_COMBINE=pre, session 22)
 *   router      rlog [T, E = 128] = u . W^T in fp32: v1 cublasSgemm, v0 k_router_logits (split over H)
 *   vocab chain  the whole chain after the LM head of a step with self-conditioning (C x V raw logits, softcap 30,
 *               T 0.7, bf16): v0 the chain (k_softcap in place, k_step_stats, k_sc_probs; the backend's default),
 *               v2 the fused chain (k_vocab_stats, k_vocab_sc: z recomputed in registers, never stored;
 *               DGEMMA_VOCAB=fused, not the default: slower than v0 on the H200, session 14), checked word for word against v0; v2's statistics and probabilities also apart;
 *               "v2 gN": v2 in launch groups of N positions (the second read of a group's logits from the L2);
 *               "v3 z stored": pass 1 also stores z in place, the passes after it read z as stored (DG_VZ_STORED: no
 *               softcap, no division) instead of recomputing it (DGEMMA_VOCAB=zstore, the backend's default since session 17);
 *               "v3 stats" / "v3 sc": its two halves as the backend runs them (the profile's sampler statistics; the
 *               probabilities' pass of its self-conditioning); each word for word against v0 (v4, k_vocab_one,
 *               DGEMMA_VOCAB=one: sessions 26-28, deleted after it lost on the H100, docs/cuda.md)
 *   router stage  k_router_route from u to the grouping (K = 8 of 128 experts, H = 2816): v0 the chain (6 launches),
 *               v1 route_kernel (DGEMMA_ROUTE=fused), v2 router_tile_kernel + route_tk_kernel (DGEMMA_ROUTE=tiles, the
 *               default in session 13), v3 router_tile_kernel + route_gr_kernel (DGEMMA_ROUTE=grid, the default since 14);
 *               v1 to v3 checked word for word against v0; one stage, 30 back to back, v2's and v3's launches apart;
 *               v4 router_tile_deep_kernel + route_gr_kernel<JP, 1> (DGEMMA_ROUTE=deep, session 22: a split's 11
 *               stages of 16 k in flight at once instead of 3; the gate/up copy's loads before its stores), checked
 *               word for word against v0 (the stage), v2 (the split sums alone, the stage with the copy)
 *               v5 router_one_kernel (DGEMMA_ROUTE=one, session 29: the whole stage, gate/up copy included, in one
 *               launch), checked word for word against v0 (the stage) and v2 (the stage with the copy)
 *               v6 v3 with route_gr_kernel<JP, 1, 1> (DGEMMA_ROUTE=gridp, session 29: the copy's loads first, the
 *               placement's table loads in flight at once, the last block's copy after its placement), the same checks
 *   input copies  k_group_sums_perm_v (the experts' gate/up input [T, H] and down input [T K, IE = H / 4], G 64):
 *               v0 a block of 64 threads per row, a thread per group (G / 8 load latencies in a row), v2 a thread
 *               per group over the whole input with its loads first (DGEMMA_GSP=flat, session 22); both word for
 *               word against the host's fp32 chains and permutation
 *
 * bytes = what the version moves (its passes); floor = the least bytes the operation needs (every input read
 * once, every output written once) / read bandwidth. Check: the lab's own bound per output (fp32: normwise
 * 1e-5; bf16: 2^-8 per element) and, for the statistics, the tests' (argmax and proposal identical to the
 * CPU, entropy within 1e-5 relative, max prob within 1e-6); "same" = bit-identical to v1.
 *
 * Build and run (GPU machine, after make CUDA=1; scripts/step_kernels_lab_gpu.sh does both):
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc dev/cuda/step_kernels.cu \
 *        build/libdgemma.a -lcublas -lcudart -o build/step_kernels_lab
 *   build/step_kernels_lab [--reps N] [--small] [--router | --vocab | --chain]   (--router: only the router rows;
 *   --vocab: only the vocabulary rows: step stats, sc probs, vocab chain; --chain: only the vocab chain rows)
 * --small: emulation-sized shapes (C = 3, V = 20,003 and 20,480, T = 5 and 3), for the CPU emulation of
 * dev/cuda_emu (checks only; its times mean nothing), after make BUILD=build-emu EMU=1 CUDA=0 build-emu/libdgemma.a:
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc  *       dev/cuda/step_kernels.cu -x none build-emu/libdgemma.a -lcjson -lm -lstdc++ -o build-emu/step_kernels_lab
 *   build-emu/step_kernels_lab --small */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "cuda/kernels.cuh"
extern "C" {
#include "base/rng.h"
#include "sample/sampler.h"
}

#define CKL(x)                                                                                                   \
  do {                                                                                                           \
    cudaError_t e_ = (x);                                                                                        \
    if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
  } while (0)

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545f4914f6cdd1dull; }
static float frand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float b2f(bf16 b) { return __bfloat162float(b); }
static float rbf(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

/* ---- the earlier kernels (src/cuda/kernels.cu before issue 12's rewrite), verbatim but for the names ---- */

/* block_sum and proposal_uniform: src/cuda/kernels.cuh, unchanged by the rewrite. */

#define SNT 512

__global__ void old_step_stats_kernel(float *logits, int V, float temperature, int mode, uint64_t seed, uint32_t block,
                                      uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad) {
  DG_PDL_ENTRY();
  __shared__ float shf[32];
  __shared__ int shi[32];
  __shared__ double shd[32];
  __shared__ double chunk[SNT];
  __shared__ int found;
  const int c = blockIdx.x, tid = threadIdx.x;
  float *z = logits + (size_t)c * V;
  float mx = -FLT_MAX;
  int amax = INT32_MAX, nonfinite = 0;
  for (int v = tid; v < V; v += blockDim.x) {
    float zv = z[v] / temperature;
    z[v] = zv;
    if (!isfinite(zv)) nonfinite = 1;
    if (zv > mx) { mx = zv; amax = v; }
  }
  float m = mx;
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((tid & 31) == 0) shf[tid >> 5] = m;
  __syncthreads();
  if (tid < 32) {
    float mm = tid < (int)(blockDim.x >> 5) ? shf[tid] : -FLT_MAX;
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (tid == 0) shf[0] = mm;
  }
  __syncthreads();
  const float gmax = shf[0];
  int cand = mx == gmax ? amax : INT32_MAX;
  for (int o = 16; o; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
  __syncthreads();
  if ((tid & 31) == 0) shi[tid >> 5] = cand;
  __syncthreads();
  if (tid < 32) {
    int cc = tid < (int)(blockDim.x >> 5) ? shi[tid] : INT32_MAX;
    for (int o = 16; o; o >>= 1) cc = min(cc, __shfl_xor_sync(0xffffffffu, cc, o));
    if (tid == 0) shi[0] = cc;
  }
  __syncthreads();
  const int gamax = shi[0];
  int anybad = block_sum(nonfinite, shi);
  if (anybad) {
    if (tid == 0) atomicMin(bad, c);
    return;
  }
  double sum = 0.0;
  for (int v = tid; v < V; v += blockDim.x) sum += exp((double)z[v] - (double)gmax);
  sum = block_sum(sum, shd);
  const double lse = (double)gmax + log(sum);
  double ent = 0.0;
  for (int v = tid; v < V; v += blockDim.x) {
    double lp = (double)z[v] - lse;
    ent -= exp(lp) * lp;
  }
  ent = block_sum(ent, shd);
  int prop = gamax;
  if (mode != DG_PROPOSAL_ARGMAX) {
    const float u = mode == DG_PROPOSAL_REPLAY_UNIFORM ? uni[c] : proposal_uniform(seed, block, step, (uint32_t)c);
    const float fs = (float)sum;
    const int per = (V + blockDim.x - 1) / blockDim.x;
    const int v0 = tid * per, v1 = min(V, v0 + per);
    double cs = 0.0;
    for (int v = v0; v < v1; v++) cs += (double)(expf(z[v] - gmax) / fs);
    chunk[tid] = cs;
    if (tid == 0) found = V - 1;
    __syncthreads();
    if (tid == 0) {
      double run = 0.0;
      for (int i = 0; i < (int)blockDim.x; i++) { double x = chunk[i]; chunk[i] = run; run += x; }
      shd[0] = run;
    }
    __syncthreads();
    const double target = (double)u * shd[0];
    const double pre = chunk[tid];
    if (v0 < v1 && pre <= target && pre + cs > target) {
      double run = 0.0;
      for (int v = v0; v < v1; v++) {
        run += (double)(expf(z[v] - gmax) / fs);
        if (pre + run > target) { found = v; break; }
      }
    }
    __syncthreads();
    prop = found;
  }
  if (tid == 0) {
    dg_cuda_pos_stats st;
    st.argmax = gamax;
    st.proposal = prop;
    st.entropy = (float)(ent > 0.0 ? ent : 0.0);
    st.max_prob = (float)exp((double)gmax - lse);
    out[c] = st;
  }
}

__device__ __forceinline__ float old_round_act(float x, int act) {
  if (act == DG_CUDA_BF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (act == DG_CUDA_F16) return __half2float(__float2half_rn(x));
  return x;
}

__global__ void old_sc_probs_kernel(const float *z, bf16 *P, int V, int act) {
  DG_PDL_ENTRY();
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int c = blockIdx.x;
  const float *zr = z + (size_t)c * V;
  float mx = -FLT_MAX;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, old_round_act(zr[v], act));
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) shf[threadIdx.x >> 5] = mx;
  __syncthreads();
  if (threadIdx.x < 32) {
    float mm = threadIdx.x < (blockDim.x >> 5) ? shf[threadIdx.x] : -FLT_MAX;
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (threadIdx.x == 0) shf[0] = mm;
  }
  __syncthreads();
  mx = shf[0];
  double sum = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += (double)expf(old_round_act(zr[v], act) - mx);
  sum = block_sum(sum, shd);
  const float inv = (float)(1.0 / sum);
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    P[(size_t)c * V + v] = __float2bfloat16_rn(old_round_act(expf(old_round_act(zr[v], act) - mx) * inv, act));
}

/* ---- measurement ---- */

__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
  DG_PDL_ENTRY();
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

static cudaEvent_t e0, e1;
static uint4 *flushbuf;
static size_t flushn;
static unsigned *sink;
static int reps = 20, nsm = 132, failed = 0, router_only = 0, vocab_only = 0, chain_only = 0;
static double bw = 1;

static float time_ms(cudaEvent_t a, cudaEvent_t b) { float ms; CKL(cudaEventElapsedTime(&ms, a, b)); return ms; }

/* Median and min ms of fn over reps runs, the L2 flushed (a 256 MB read) before each. */
static void timeit(const std::function<void()> &fn, double &med, double &mn) {
  std::vector<float> t;
  for (int r = 0; r < reps; r++) {
    DG_LAUNCH(read_kernel, nsm * 8, 512, 0, 0)(flushbuf, flushn, sink);
    CKL(cudaEventRecord(e0));
    fn();
    CKL(cudaEventRecord(e1));
    CKL(cudaEventSynchronize(e1));
    CKL(cudaGetLastError());
    t.push_back(time_ms(e0, e1));
  }
  std::sort(t.begin(), t.end());
  med = t[t.size() / 2];
  mn = t[0];
}

static void row(const char *name, const char *ver, double med, double mn, double bytes, double floor_bytes,
                const char *check, int ok) {
  const double floor_ms = floor_bytes / bw * 1e3;
  printf("| %s | %s | %.4f | %.4f | %.1f | %.0f | %.4f | %.0f %% | %s%s |\n", name, ver, med, mn, bytes / 1e6,
         bytes / (med * 1e-3) / 1e9, floor_ms, 100.0 * floor_ms / med, ok ? "" : "FAIL ", check);
  if (!ok) failed = 1;
  fflush(stdout);
}

template <typename T> static T *dnew(size_t n) { T *p; CKL(cudaMalloc((void **)&p, n * sizeof(T))); return p; }
template <typename T> static void up(T *d, const std::vector<T> &h) { CKL(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
template <typename T> static std::vector<T> down(const T *d, size_t n) {
  std::vector<T> h(n);
  CKL(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/* Normwise error of fp32 output g vs reference r: max |g - r| / max |r|. */
static double err_f(const std::vector<float> &g, const std::vector<double> &r) {
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < g.size(); i++) { md = fmax(md, fabs(g[i] - r[i])); mr = fmax(mr, fabs(r[i])); }
  return md / mr;
}
/* Largest |g - r| / (1.01 * 2^-8 |r| + 2^-8 * 1e-3 max|r|) of bf16 output g: <= 1 passes (a bf16 rounding is
 * at most 2^-8 relative, the bf16 unit roundoff; 1.01 leaves room for the fp32 arithmetic before it, the
 * floor term for values near zero after cancellation). */
static double err_b(const std::vector<bf16> &g, const std::vector<double> &r) {
  double mr = 0, w = 0;
  for (size_t i = 0; i < g.size(); i++) mr = fmax(mr, fabs(r[i]));
  for (size_t i = 0; i < g.size(); i++)
    w = fmax(w, fabs(b2f(g[i]) - r[i]) / (1.01 * ldexp(fabs(r[i]), -8) + ldexp(mr, -8) * 1e-3 + 1e-30));
  return w;
}
template <typename T> static size_t ndiff(const std::vector<T> &a, const std::vector<T> &b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}

/* ---- the cases ---- */

static int gsz[2] = {32, 16}; /* the launch groups (positions) the lab tries: k_step_stats_g, k_sc_probs_g */

static void stats_case(int C, int V) {
  const size_t n = (size_t)C * V;
  std::vector<float> lg(n);
  for (size_t i = 0; i < n; i++) lg[i] = 3.0f * frand();
  for (int c = 0; c < C; c++) {
    if (c % 4 == 1) lg[(size_t)c * V + rnd() % V] += 14.0f;     /* peaked rows: small entropy */
    if (c % 4 == 2) {                                            /* a tie for the maximum: the first index */
      const int a = (int)(rnd() % V), b = (int)(rnd() % V);
      lg[(size_t)c * V + a] = lg[(size_t)c * V + b] = 9.5f;
    }
  }
  float *d = dnew<float>(n), *duni = dnew<float>(C);
  dg_cuda_pos_stats *dst = dnew<dg_cuda_pos_stats>(C);
  int32_t *dbad = dnew<int32_t>(1);
  void *ws = dnew<char>(k_vocab_ws_bytes(C, V));
  const uint64_t seed = 0x0123456789abcdefull;
  const uint32_t block = 2, step = 5;
  std::vector<uint32_t> bits(C);
  dg_rng_u32(seed, DG_RNG_PROPOSAL, block, step, (uint32_t)C, bits.data());
  std::vector<float> uni(C);
  for (int c = 0; c < C; c++) uni[c] = (c + 0.5f) / C;
  up(duni, uni);
  const int modes[3] = {DG_PROPOSAL_ARGMAX, DG_PROPOSAL_SAMPLE, DG_PROPOSAL_REPLAY_UNIFORM};
  const char *mname[3] = {"argmax", "sampled", "replayed"};
  for (int ver : {1, 0, 3, 4}) {
    const int group = ver == 3 ? gsz[0] : ver == 4 ? gsz[1] : 0;
    char vn[16];
    if (group) snprintf(vn, sizeof vn, "v0 g%d", group);
    else snprintf(vn, sizeof vn, "v%d", ver);
    auto launch = [&](float *buf, float T, int mode) {
      if (ver == 1)
        DG_LAUNCH(old_step_stats_kernel, C, SNT, 0, 0)(buf, V, T, mode, seed, block, step, duni, dst, dbad);
      else
        CKL(k_step_stats_g(0, buf, C, V, T, mode, seed, block, step, duni, dst, dbad, ws, group));
    };
    for (int k = 0; k < 3; k++) {
      const float T = k == 0 ? 0.8f : k == 1 ? 0.55f : 0.41f;
      up(d, lg);
      const int32_t nobad = INT32_MAX;
      CKL(cudaMemcpy(dbad, &nobad, 4, cudaMemcpyHostToDevice));
      launch(d, T, modes[k]);
      CKL(cudaDeviceSynchronize());
      std::vector<dg_cuda_pos_stats> st = down(dst, C);
      std::vector<float> zg = down(d, n);
      int32_t bad;
      CKL(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
      std::vector<float> z(n);
      for (size_t i = 0; i < n; i++) z[i] = lg[i] / T;
      int mism = 0;
      double went = 0, wmp = 0;
      for (int c = 0; c < C; c++) {
        dg_pos_stats h;
        const float u = modes[k] == DG_PROPOSAL_SAMPLE ? dg_rng_to_unit(bits[c]) : uni[c];
        if (dg_position_stats(z.data() + (size_t)c * V, V, u, modes[k], &h) != DG_OK) { mism++; continue; }
        mism += st[c].argmax != h.argmax || st[c].proposal != h.proposal;
        went = fmax(went, fabs((double)st[c].entropy - h.entropy) / fmax(1e-3, h.entropy));
        wmp = fmax(wmp, fabs((double)st[c].max_prob - h.max_prob));
      }
      const int zok = !memcmp(zg.data(), z.data(), n * 4);
      char chk[200];
      snprintf(chk, sizeof chk, "%s: argmax/proposal differ at %d of %d; entropy rel %.1e, max prob %.1e; z %s; bad %s",
               mname[k], mism, C, went, wmp, zok ? "exact" : "DIFFERS", bad == INT32_MAX ? "none" : "SET");
      const int ok = mism == 0 && went <= 1e-5 && wmp <= 1e-6 && zok && bad == INT32_MAX;
      if (k == 2) { /* the replayed check prints with the sampled timing row below */
        printf("| step stats | %s | | | | | | | %s%s |\n", vn, ok ? "" : "FAIL ", chk);
        if (!ok) failed = 1;
        continue;
      }
      /* timing at T = 1 (z = logits / 1 = logits: in place, repeatable) */
      up(d, lg);
      double med, mn;
      timeit([&] { launch(d, 1.0f, modes[k]); }, med, mn);
      /* passes over the logits from device memory (a group's pass 2 reads the L2) */
      const double passes = ver == 1 ? (modes[k] == DG_PROPOSAL_ARGMAX ? 4 : 5.5)
                                     : (modes[k] == DG_PROPOSAL_ARGMAX || group ? 2 : 3);
      char nm[64];
      snprintf(nm, sizeof nm, "step stats %s", mname[k]);
      row(nm, vn, med, mn, passes * n * 4, 2.0 * n * 4, chk, ok);
    }
  }
  /* a non-finite logit: reported, the lowest position */
  {
    std::vector<float> l2 = lg;
    l2[(size_t)(C - 1) * V + V / 2] = NAN;
    if (C > 1) l2[(size_t)1 * V + V - 1] = INFINITY;
    up(d, l2);
    const int32_t nobad = INT32_MAX;
    CKL(cudaMemcpy(dbad, &nobad, 4, cudaMemcpyHostToDevice));
    CKL(k_step_stats(0, d, C, V, 1.0f, DG_PROPOSAL_SAMPLE, seed, block, step, duni, dst, dbad, ws));
    int32_t bad;
    CKL(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
    const int want = C > 1 ? 1 : C - 1, ok = bad == want;
    printf("| step stats non-finite | v0 | | | | | | | %sbad position %d (expected %d) |\n", ok ? "" : "FAIL ", bad, want);
    if (!ok) failed = 1;
  }
  cudaFree(d); cudaFree(duni); cudaFree(dst); cudaFree(dbad); cudaFree(ws);
}

static void sc_case(int C, int V, int act) {
  const size_t n = (size_t)C * V;
  std::vector<float> z(n);
  for (size_t i = 0; i < n; i++) z[i] = 4.0f * frand();
  for (int c = 0; c < C; c += 2) z[(size_t)c * V + rnd() % V] = 16.0f;
  float *dz = dnew<float>(n);
  bf16 *dp = dnew<bf16>(n);
  void *ws = dnew<char>(k_vocab_ws_bytes(C, V));
  up(dz, z);
  /* reference: softmax in double of cast(z), rounded as the kernel (cast of p) */
  std::vector<double> ref(n);
  for (int c = 0; c < C; c++) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, act == DG_CUDA_BF16 ? rbf(z[(size_t)c * V + v]) : z[(size_t)c * V + v]);
    for (int v = 0; v < V; v++) s += exp((act == DG_CUDA_BF16 ? rbf(z[(size_t)c * V + v]) : z[(size_t)c * V + v]) - mx);
    for (int v = 0; v < V; v++)
      ref[(size_t)c * V + v] = exp((act == DG_CUDA_BF16 ? rbf(z[(size_t)c * V + v]) : z[(size_t)c * V + v]) - mx) / s;
  }
  std::vector<bf16> p1;
  for (int ver : {1, 0, 3, 4}) {
    const int group = ver == 3 ? gsz[0] : ver == 4 ? gsz[1] : 0;
    char vn[16];
    if (group) snprintf(vn, sizeof vn, "v0 g%d", group);
    else snprintf(vn, sizeof vn, "v%d", ver);
    CKL(cudaMemset(dp, 0xff, n * 2));
    auto launch = [&] {
      if (ver == 1) DG_LAUNCH(old_sc_probs_kernel, C, SNT, 0, 0)(dz, dp, V, act);
      else CKL(k_sc_probs_g(0, dz, dp, C, V, act, ws, group));
    };
    launch();
    CKL(cudaDeviceSynchronize());
    std::vector<bf16> p = down(dp, n);
    if (ver == 1) p1 = p;
    /* bf16(act(bf16 p)): two roundings at most, 2 x 2^-9 */
    const double e = err_b(p, ref);
    char chk[160];
    snprintf(chk, sizeof chk, "act %s: err %.2f of 2^-8 (ok <= 1); %s", act == DG_CUDA_BF16 ? "bf16" : "f32", e,
             ver == 1 ? "reference version" : (ndiff(p, p1) ? "DIFFERS from v1" : "same as v1"));
    double med, mn;
    timeit(launch, med, mn);
    char nm[64];
    snprintf(nm, sizeof nm, "sc probs %s", act == DG_CUDA_BF16 ? "bf16" : "f32");
    row(nm, vn, med, mn, n * ((group ? 1 : 3) * 4.0 + 2), n * 6.0, chk, e <= 1.0);
  }
  cudaFree(dz); cudaFree(dp); cudaFree(ws);
}

/* The whole chain after the LM head of a sampler step with self-conditioning (issue 14): v0 the chain
 * (k_softcap in place, k_step_stats with z in place, k_sc_probs of that z; DGEMMA_VOCAB=chain) against v2 the fused
 * chain (k_vocab_stats and k_vocab_sc on the raw logits, z in registers; the backend's default), on the same raw
 * logits (cap 30, T 0.7, bf16 activations), every output word compared (statistics, bad position, P). Timed from
 * the LM head's output to P, the L2 flushed before each; the chain works in place, so its repetitions see logits
 * softcapped and divided again (bounded by the softcap: the same work). Bytes: v0 argmax 2 r+w passes (softcap,
 * pass 1) + 3 reads + P, sampled one read more; v2 3 reads + P in both modes; floor: one read + P. */
static void chain_case(int C, int V) {
  const size_t n = (size_t)C * V;
  const float cap = 30.0f, T = 0.7f;
  std::vector<float> lg(n);
  for (size_t i = 0; i < n; i++) lg[i] = 12.0f * frand();
  for (int c = 0; c < C; c++) {
    if (c % 4 == 1) lg[(size_t)c * V + rnd() % V] += 40.0f;  /* peaked rows */
    if (c % 4 == 2) {                                           /* past the softcap's saturation: a tie of 30s */
      lg[(size_t)c * V + rnd() % V] = 400.0f;
      lg[(size_t)c * V + rnd() % V] = 300.0f;
    }
  }
  float *d0 = dnew<float>(n), *d1 = dnew<float>(n), *d2 = dnew<float>(n), *duni = dnew<float>(C);
  bf16 *p0 = dnew<bf16>(n), *p1 = dnew<bf16>(n);
  dg_cuda_pos_stats *s0 = dnew<dg_cuda_pos_stats>(C), *s1 = dnew<dg_cuda_pos_stats>(C);
  int32_t *dbad = dnew<int32_t>(2);
  void *ws = dnew<char>(k_vocab_ws_bytes(C, V));
  const uint64_t seed = 0x0123456789abcdefull;
  const uint32_t block = 2, step = 5;
  std::vector<float> uni(C);
  for (int c = 0; c < C; c++) uni[c] = (c + 0.5f) / C;
  up(duni, uni);
  const int act = DG_CUDA_BF16;
  const int modes[2] = {DG_PROPOSAL_ARGMAX, DG_PROPOSAL_SAMPLE};
  const char *mname[2] = {"argmax", "sampled"};
  for (int k = 0; k < 2; k++) {
    const int mode = modes[k];
    auto chain = [&] {
      CKL(k_softcap(0, d0, n, cap));
      CKL(k_step_stats(0, d0, C, V, T, mode, seed, block, step, duni, s0, dbad, ws));
      CKL(k_sc_probs(0, d0, p0, C, V, act, ws));
    };
    auto fused = [&] {
      CKL(k_vocab_stats(0, d1, C, V, cap, T, act, mode, seed, block, step, duni, s1, dbad + 1, ws, 0));
      CKL(k_vocab_sc(0, d1, p1, C, V, cap, T, act, ws, mode == DG_PROPOSAL_ARGMAX ? 1 : 2));
    };
    up(d0, lg);
    up(d1, lg);
    const int32_t nobad[2] = {INT32_MAX, INT32_MAX};
    CKL(cudaMemcpy(dbad, nobad, 8, cudaMemcpyHostToDevice));
    CKL(cudaMemset(p0, 0x33, n * 2));
    CKL(cudaMemset(p1, 0x44, n * 2));
    chain();
    fused();
    CKL(cudaDeviceSynchronize());
    const std::vector<dg_cuda_pos_stats> a = down(s0, C), b = down(s1, C);
    const std::vector<bf16> pa = down(p0, n), pb = down(p1, n);
    const std::vector<float> lb = down(d1, n), za = down(d0, n); /* za: the chain's z, for v3's stored z */
    const std::vector<int32_t> bd = down(dbad, 2);
    const size_t ds = ndiff(a, b), dp = ndiff(pa, pb), dl = memcmp(lb.data(), lg.data(), n * 4) != 0;
    const int ok = ds == 0 && dp == 0 && dl == 0 && bd[0] == bd[1] && bd[0] == INT32_MAX;
    char chk[200];
    snprintf(chk, sizeof chk, "%s: v2 vs v0 records differing %zu of %d, P values %zu of %zu; logits %s; bad %s",
             mname[k], ds, C, dp, n, dl ? "CHANGED" : "untouched",
             bd[0] == bd[1] && bd[0] == INT32_MAX ? "none" : "SET");
    char nm[64];
    snprintf(nm, sizeof nm, "vocab chain %s", mname[k]);
    double med, mn;
    timeit(chain, med, mn);
    row(nm, "v0 chain", med, mn, n * ((mode == DG_PROPOSAL_ARGMAX ? 7.0 : 8.0) * 4 + 2), n * 6.0, chk, ok);
    timeit(fused, med, mn);
    row(nm, "v2 fused", med, mn, n * (3 * 4.0 + 2), n * 6.0, chk, ok);
    /* v2 in launch groups of g positions (k_vocab_stats_g / k_vocab_sc_g): pass 2 (sampled) or the sc sum
     * (argmax) and the write pass find the group's logits in the L2; v3: pass 1 stores z in place (one write more)
     * and the passes after it read z as stored (DG_VZ_STORED) instead of recomputing softcap and division */
    char chk3[240] = "";
    int ok3 = 0;
    for (int var = 0; var < 3; var++) {
      const int g = var < 2 ? gsz[var] : 0, store = var == 2;
      auto run = [&] {
        CKL(k_vocab_stats_g(0, d2, C, V, cap, T, act, mode, seed, block, step, duni, s1, dbad + 1, ws, g, store));
        CKL(k_vocab_sc_g(0, d2, p1, C, V, store ? DG_VZ_STORED : cap, store ? 1.0f : T, act, ws,
                         mode == DG_PROPOSAL_ARGMAX ? 1 : 2, g));
      };
      up(d2, lg);
      CKL(cudaMemcpy(dbad + 1, nobad, 4, cudaMemcpyHostToDevice));
      CKL(cudaMemset(p1, 0x44, n * 2));
      run();
      CKL(cudaDeviceSynchronize());
      const std::vector<dg_cuda_pos_stats> b2 = down(s1, C);
      const std::vector<bf16> pb2 = down(p1, n);
      const std::vector<int32_t> bd2 = down(dbad, 2);
      const size_t ds2 = ndiff(a, b2), dp2 = ndiff(pa, pb2), dz2 = store ? ndiff(za, down(d2, n)) : 0;
      const int ok2 = ds2 == 0 && dp2 == 0 && dz2 == 0 && bd2[1] == bd[0];
      char chk2[240], vn[24];
      char zs[48] = "";
      if (store) snprintf(zs, sizeof zs, ", stored z values %zu", dz2);
      snprintf(chk2, sizeof chk2, "%s: vs v0 records differing %zu of %d, P values %zu of %zu%s; bad %s", mname[k], ds2,
               C, dp2, n, zs, bd2[1] == bd[0] ? "same" : "DIFFERS");
      if (store) snprintf(vn, sizeof vn, "v3 z stored");
      else snprintf(vn, sizeof vn, "v2 g%d", g);
      if (store) { snprintf(chk3, sizeof chk3, "%s", chk2); ok3 = ok2; }
      timeit(run, med, mn);
      /* bytes from device memory: v3 pass 1 r+w, 2 reads; a group's second read of its logits in the L2 (sampled:
       * pass 2 after pass 1; argmax: the write pass after the sum) */
      const double rd = store ? 4 * 4.0 : 2 * 4.0;
      row(nm, vn, med, mn, n * (rd + 2), n * 6.0, chk2, ok2);
    }
    /* v3's two halves as the backend runs them (the profile's sampler statistics, and the probabilities' pass of its
     * self-conditioning): k_vocab_stats with store, then k_vocab_sc of the stored z */
    up(d2, lg);
    timeit([&] { CKL(k_vocab_stats(0, d2, C, V, cap, T, act, mode, seed, block, step, duni, s1, dbad + 1, ws, 1)); }, med,
           mn);
    row(nm, "v3 stats", med, mn, n * (mode == DG_PROPOSAL_ARGMAX ? 8.0 : 12.0), n * 4.0, chk3, ok3);
    timeit([&] { CKL(k_vocab_sc(0, d2, p1, C, V, DG_VZ_STORED, 1.0f, act, ws, mode == DG_PROPOSAL_ARGMAX ? 1 : 2)); },
           med, mn);
    row(nm, "v3 sc", med, mn, n * (mode == DG_PROPOSAL_ARGMAX ? 10.0 : 6.0), n * 6.0, chk3, ok3);
    /* the two halves of v2: the statistics (before the host sync) and the probabilities (after it) */
    timeit([&] { CKL(k_vocab_stats(0, d1, C, V, cap, T, act, mode, seed, block, step, duni, s1, dbad + 1, ws, 0)); },
           med, mn);
    row(nm, "v2 stats", med, mn, n * (mode == DG_PROPOSAL_ARGMAX ? 4.0 : 8.0), n * 4.0, chk, ok);
    timeit([&] { CKL(k_vocab_sc(0, d1, p1, C, V, cap, T, act, ws, mode == DG_PROPOSAL_ARGMAX ? 1 : 2)); }, med, mn);
    row(nm, "v2 sc", med, mn, n * (mode == DG_PROPOSAL_ARGMAX ? 10.0 : 6.0), n * 6.0, chk, ok);
  }
  cudaFree(d0); cudaFree(d1); cudaFree(d2); cudaFree(duni); cudaFree(p0); cudaFree(p1); cudaFree(s0); cudaFree(s1); cudaFree(dbad);
  cudaFree(ws);
}

static double rms_inv(const float *x, int H, double eps) {
  double s = 0;
  for (int j = 0; j < H; j++) s += (double)x[j] * x[j];
  return 1.0 / sqrt(s / H + eps);
}

static void rows_case(int T, int H, int I, int K, int E) {
  const float eps = 1e-6f;
  auto rv = [](size_t n, float a, float b) { std::vector<float> v(n); for (auto &x : v) x = a + b * frand(); return v; };
  const size_t TH = (size_t)T * H;
  /* rmsnorm: the layer's input norm (bf16 out, weight) */
  if (!router_only) {
    std::vector<float> x = rv(TH, 0, 2), w = rv(H, 1, 0.5f);
    float *dx = dnew<float>(TH), *dw = dnew<float>(H);
    bf16 *dy = dnew<bf16>(TH);
    up(dx, x); up(dw, w);
    std::vector<double> ref(TH);
    for (int t = 0; t < T; t++) {
      const double r = rms_inv(&x[(size_t)t * H], H, eps);
      for (int j = 0; j < H; j++) ref[(size_t)t * H + j] = x[(size_t)t * H + j] * r * w[j];
    }
    std::vector<bf16> y1;
    for (int ver : {1, 0, 2}) {
      auto launch = [&] { CKL(k_rmsnorm_v(0, ver, dx, dw, NULL, dy, T, H, eps)); };
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<bf16> y = down(dy, TH);
      if (ver == 1) y1 = y;
      const double e = err_b(y, ref);
      char chk[160], vn[8];
      snprintf(chk, sizeof chk, "y bf16 err %.2f of 2^-8; %zu of %zu differ from v1", e, ndiff(y, y1), TH);
      snprintf(vn, sizeof vn, "v%d", ver);
      double med, mn;
      timeit(launch, med, mn);
      row("rmsnorm (bf16 out)", vn, med, mn, TH * 6.0 + H * 4.0, TH * 6.0 + H * 4.0, chk, e <= 1.0);
    }
    cudaFree(dx); cudaFree(dw); cudaFree(dy);
  }
  /* attn_residual */
  if (!router_only) {
    std::vector<float> x = rv(TH, 0, 2), o = rv(TH, 0, 1), wp = rv(H, 1, 0.5f), wa = rv(H, 1, 0.5f), we = rv(H, 1, 0.5f),
                       wr = rv(H, 1, 0.5f);
    const float root = 1.0f / sqrtf((float)H);
    float *dx = dnew<float>(TH), *d_o = dnew<float>(TH), *dwp = dnew<float>(H), *dwa = dnew<float>(H),
          *dwe = dnew<float>(H), *dwr = dnew<float>(H), *du = dnew<float>(TH);
    bf16 *da = dnew<bf16>(TH), *dxe = dnew<bf16>(TH);
    up(d_o, o); up(dwp, wp); up(dwa, wa); up(dwe, we); up(dwr, wr);
    std::vector<double> rx(TH), ra(TH), re(TH), ru(TH);
    for (int t = 0; t < T; t++) {
      const double r0 = rms_inv(&o[(size_t)t * H], H, eps);
      std::vector<float> xf(H);
      for (int j = 0; j < H; j++) { rx[(size_t)t * H + j] = x[(size_t)t * H + j] + o[(size_t)t * H + j] * r0 * wp[j]; xf[j] = (float)rx[(size_t)t * H + j]; }
      const double r = rms_inv(xf.data(), H, eps);
      for (int j = 0; j < H; j++) {
        const double nn = rx[(size_t)t * H + j] * r;
        ra[(size_t)t * H + j] = nn * wa[j]; re[(size_t)t * H + j] = nn * we[j]; ru[(size_t)t * H + j] = nn * wr[j] * root;
      }
    }
    std::vector<float> x1;
    for (int ver : {1, 0}) {
      auto launch = [&] { CKL(k_attn_residual_v(0, ver, dx, d_o, dwp, dwa, dwe, dwr, root, da, dxe, du, T, H, eps)); };
      up(dx, x);
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<float> xg = down(dx, TH), ug = down(du, TH);
      std::vector<bf16> ag = down(da, TH), eg = down(dxe, TH);
      if (ver == 1) x1 = xg;
      const double ex = err_f(xg, rx), eu = err_f(ug, ru), ea = err_b(ag, ra), ee = err_b(eg, re);
      char chk[200], vn[8];
      snprintf(chk, sizeof chk, "x %.1e u %.1e (fp32, ok <= 1e-5), a %.2f xe %.2f of 2^-8; x: %zu differ from v1", ex, eu,
               ea, ee, ndiff(xg, x1));
      snprintf(vn, sizeof vn, "v%d", ver);
      double med, mn;
      up(dx, x);
      timeit(launch, med, mn); /* x drifts over the repetitions (x += ...): timing only */
      row("attn_residual", vn, med, mn, TH * 20.0 + H * 16.0, TH * 20.0 + H * 16.0, chk,
          ex <= 1e-5 && eu <= 1e-5 && ea <= 1 && ee <= 1);
    }
    cudaFree(dx); cudaFree(d_o); cudaFree(dwp); cudaFree(dwa); cudaFree(dwe); cudaFree(dwr); cudaFree(du);
    cudaFree(da); cudaFree(dxe);
  }
  /* ffn_combine: K of E experts per token, y rows in a random grouped order */
  if (!router_only) {
    const size_t TK = (size_t)T * K;
    std::vector<float> x = rv(TH, 0, 2), dense = rv(TH, 0, 1), y = rv(TK * H, 0, 1), w1 = rv(H, 1, 0.5f),
                       w2 = rv(H, 1, 0.5f), wf = rv(H, 1, 0.5f), tw(TK);
    std::vector<int32_t> idx(TK), srow(TK), perm(TK);
    for (size_t i = 0; i < TK; i++) perm[i] = (int32_t)i;
    for (size_t i = TK; i > 1; i--) std::swap(perm[i - 1], perm[rnd() % i]);
    for (int t = 0; t < T; t++) {
      for (int k = 0; k < K; k++) {
        int e;
        bool dup;
        do { e = (int)(rnd() % E); dup = false; for (int j = 0; j < k; j++) dup |= idx[(size_t)t * K + j] == e; } while (dup);
        idx[(size_t)t * K + k] = e;
        srow[(size_t)t * K + k] = perm[(size_t)t * K + k];
        tw[(size_t)t * K + k] = 0.05f + 0.2f * (frand() + 1);
      }
    }
    const float scalar = 0.75f;
    float *dx = dnew<float>(TH), *dd = dnew<float>(TH), *dy = dnew<float>(TK * H), *dw1 = dnew<float>(H),
          *dw2 = dnew<float>(H), *dwf = dnew<float>(H), *dtw = dnew<float>(TK);
    int32_t *didx = dnew<int32_t>(TK), *dsr = dnew<int32_t>(TK);
    up(dd, dense); up(dy, y); up(dw1, w1); up(dw2, w2); up(dwf, wf); up(dtw, tw); up(didx, idx); up(dsr, srow);
    std::vector<double> rx(TH);
    for (int t = 0; t < T; t++) {
      std::vector<float> g(H, 0.0f), s(H);
      std::vector<int> ord(K);
      for (int k = 0; k < K; k++) ord[k] = k;
      std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return idx[(size_t)t * K + a] < idx[(size_t)t * K + b]; });
      for (int j = 0; j < H; j++) {
        double a = 0;
        for (int k : ord) a += (double)y[(size_t)srow[(size_t)t * K + k] * H + j] * tw[(size_t)t * K + k];
        g[j] = (float)a;
      }
      const double rg = rms_inv(g.data(), H, eps), rd = rms_inv(&dense[(size_t)t * H], H, eps);
      for (int j = 0; j < H; j++) s[j] = (float)(dense[(size_t)t * H + j] * rd * w1[j] + g[j] * rg * w2[j]);
      const double r = rms_inv(s.data(), H, eps);
      for (int j = 0; j < H; j++) rx[(size_t)t * H + j] = (x[(size_t)t * H + j] + s[j] * r * wf[j]) * scalar;
    }
    std::vector<float> x1;
    for (int ver : {1, 0}) {
      auto launch = [&] { CKL(k_ffn_combine_v(0, ver, dx, dd, dy, dsr, didx, dtw, dw1, dw2, dwf, scalar, T, H, K, eps)); };
      up(dx, x);
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<float> xg = down(dx, TH);
      if (ver == 1) x1 = xg;
      const double ex = err_f(xg, rx);
      char chk[160], vn[8];
      snprintf(chk, sizeof chk, "x %.1e (fp32, ok <= 1e-5); %zu of %zu differ from v1", ex, ndiff(xg, x1), TH);
      snprintf(vn, sizeof vn, "v%d", ver);
      double med, mn;
      timeit(launch, med, mn);
      const double bytes = TK * H * 4.0 + TH * 12.0 + H * 12.0 + TK * 12.0;
      row("ffn_combine K=8", vn, med, mn, bytes, bytes, chk, ex <= 1e-5);
    }
    /* the combine with the next layer's input norm (k_ffn_combine_norm_v, the backend's launch since session 14): v0
     * the default's kernel, v2 the next norm's weight loaded with the other weights (DGEMMA_COMBINE=pre, session
     * 22); x and a_next word for word against v0's, x also against the reference */
    {
      std::vector<float> wn = rv(H, 1, 0.5f);
      float *dwn = dnew<float>(H);
      bf16 *dan = dnew<bf16>(TH);
      up(dwn, wn);
      std::vector<float> x0;
      std::vector<bf16> a0;
      for (int ver : {0, 2}) {
        int fused = 0;
        auto launch = [&] {
          CKL(k_ffn_combine_norm_v(0, ver, dx, dd, dy, dsr, didx, dtw, dw1, dw2, dwf, scalar, T, H, K, eps, dwn, dan, &fused));
        };
        up(dx, x);
        CKL(cudaMemset(dan, 0xff, TH * 2));
        launch();
        CKL(cudaDeviceSynchronize());
        std::vector<float> xg = down(dx, TH);
        std::vector<bf16> ag = down(dan, TH);
        if (ver == 0) { x0 = xg; a0 = ag; }
        const double ex = err_f(xg, rx);
        const size_t nd = ndiff(xg, x0) + ndiff(ag, a0);
        char chk[200], vn[8];
        snprintf(chk, sizeof chk, "fused %d; x %.1e (fp32, ok <= 1e-5); %zu of %zu words (x, a_next) differ from v0", fused, ex,
                 nd, 2 * TH);
        snprintf(vn, sizeof vn, "v%d", ver);
        double med, mn;
        up(dx, x);
        timeit(launch, med, mn); /* x drifts over the repetitions (x += ...): timing only */
        const double bytes = TK * H * 4.0 + TH * 14.0 + H * 16.0 + TK * 12.0;
        row("ffn_combine + next norm K=8", vn, med, mn, bytes, bytes, chk, ex <= 1e-5 && nd == 0 && fused);
      }
      cudaFree(dwn); cudaFree(dan);
    }
    cudaFree(dx); cudaFree(dd); cudaFree(dy); cudaFree(dw1); cudaFree(dw2); cudaFree(dwf); cudaFree(dtw);
    cudaFree(didx); cudaFree(dsr);
  }
  /* geglu: h = gelu_tanh(gate) * up, bit-identical across versions */
  if (!router_only) {
    const size_t TI = (size_t)T * I;
    std::vector<float> gu = rv(TI * 2, 0, 3);
    float *dgu = dnew<float>(TI * 2);
    bf16 *dh = dnew<bf16>(TI);
    up(dgu, gu);
    std::vector<double> ref(TI);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < I; j++) {
        const double a = gu[(size_t)t * 2 * I + j], u = gu[(size_t)t * 2 * I + I + j];
        ref[(size_t)t * I + j] = 0.5 * a * (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))) * u;
      }
    std::vector<bf16> h1;
    for (int ver : {1, 0}) {
      auto launch = [&] { CKL(k_geglu_v(0, ver, dgu, dh, T, I)); };
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<bf16> h = down(dh, TI);
      if (ver == 1) h1 = h;
      const double e = err_b(h, ref);
      const size_t nd = ndiff(h, h1);
      char chk[160], vn[8];
      snprintf(chk, sizeof chk, "h bf16 err %.2f of 2^-8; %s", e, nd ? "DIFFERS from v1" : "bit-identical to v1");
      snprintf(vn, sizeof vn, "v%d", ver);
      double med, mn;
      timeit(launch, med, mn);
      row("geglu I=2112", vn, med, mn, TI * 10.0, TI * 10.0, chk, e <= 1.0 && nd == 0);
    }
    cudaFree(dgu); cudaFree(dh);
  }
  /* router logits rlog [T, E] = u . W^T in fp32: v1 cublasSgemm (the backend's before), v0 k_router_logits */
  {
    std::vector<float> u = rv(TH, 0, 1), W = rv((size_t)E * H, 0, 0.05f);
    float *du = dnew<float>(TH), *dW = dnew<float>((size_t)E * H), *dr = dnew<float>((size_t)T * E),
          *dws = dnew<float>((size_t)DG_ROUTER_MAX_SPLITS * T * E);
    up(du, u); up(dW, W);
    std::vector<double> ref((size_t)T * E);
    for (int t = 0; t < T; t++)
      for (int e = 0; e < E; e++) {
        double a = 0;
        for (int j = 0; j < H; j++) a += (double)u[(size_t)t * H + j] * W[(size_t)e * H + j];
        ref[(size_t)t * E + e] = a;
      }
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); exit(1); }
    for (int ver : {1, 0}) {
      auto launch = [&] {
        if (ver == 1) {
          const float one = 1.0f, zero = 0.0f;
          if (cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, E, T, H, &one, dW, H, du, H, &zero, dr, E) != CUBLAS_STATUS_SUCCESS)
            { fprintf(stderr, "cublasSgemm failed\n"); exit(1); }
        } else {
          CKL(k_router_logits(0, du, dW, dr, T, E, H, dws));
        }
      };
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<float> g = down(dr, (size_t)T * E);
      const double e = err_f(g, ref);
      char chk[120], vn[8];
      snprintf(chk, sizeof chk, "rlog %.1e (fp32 normwise, ok <= 1e-5)", e);
      snprintf(vn, sizeof vn, "v%d", ver);
      double med, mn;
      timeit(launch, med, mn);
      const double bytes = (double)TH * 4 + (double)E * H * 4 + (double)T * E * 4;
      row("router logits fp32", vn, med, mn, bytes, bytes, chk, e <= 1e-5);
    }
    cublasDestroy(hb);
    cudaFree(du); cudaFree(dW); cudaFree(dr); cudaFree(dws);
  }
  /* the router stage (issue 12 item 3): from u to the probabilities, choices, weights and grouping by expert, as
   * k_router_route runs it per layer: v0 the chain (router_part + router_reduce + topk + group count / scan /
   * place: 6 launches), v1 route_kernel (DGEMMA_ROUTE=fused: product + 1), v2 the default since session 13
   * (router_tile_kernel + route_tk_kernel: 2 launches); every output word of v1 and v2 compared with v0's. Rows:
   * one stage after an L2 flush, then "x30": 30 stages back to back (a pass's layers; the L2 flushed before the
   * first only) per stage, then v2's two launches alone. floor: u and W read once, the outputs written once; the
   * product is 2 T E H flops of fp32 FMAs, 2.8 us at the H200's 67 TFLOP/s SIMT rate for the 26B's shape. */
  {
    const int TKn = T * K;
    std::vector<float> u = rv(TH, 0, 1), W = rv((size_t)E * H, 0, 0.05f), pes = rv(E, 1.0f, 0.5f);
    float *du = dnew<float>(TH), *dW = dnew<float>((size_t)E * H), *dpes = dnew<float>(E),
          *dr = dnew<float>((size_t)T * E), *dws = dnew<float>((size_t)DG_ROUTER_MAX_SPLITS * T * E);
    up(du, u); up(dW, W); up(dpes, pes);
    dg_cuda_moe_buf b;
    memset(&b, 0, sizeof b);
    b.topk_idx = dnew<int32_t>(TKn); b.topk_w = dnew<float>(TKn); b.count = dnew<int32_t>(E);
    b.start = dnew<int32_t>(E + 1); b.pairs = dnew<int32_t>(TKn); b.slot_row = dnew<int32_t>(TKn);
    b.tiles = dnew<int32_t>((size_t)(TKn + E) * 2); b.n_tiles = dnew<int32_t>(1); b.order = dnew<int32_t>(E);
    b.done = dnew<int32_t>(1);
    CKL(cudaMemset(b.done, 0, 4));
    b.gsc = dnew<int32_t>(DG_ROUTE_GSC_INTS);
    CKL(cudaMemset(b.gsc, 0, DG_ROUTE_GSC_INTS * 4));
    auto words = [&]() {
      std::vector<uint32_t> w;
      auto add = [&](const void *d, size_t n) {
        std::vector<uint32_t> h = down((const uint32_t *)d, n);
        w.insert(w.end(), h.begin(), h.end());
      };
      add(dr, (size_t)T * E); add(b.topk_idx, TKn); add(b.topk_w, TKn); add(b.count, E); add(b.start, E + 1);
      add(b.pairs, TKn); add(b.slot_row, TKn); add(b.order, E); add(b.n_tiles, 1);
      const int32_t nt = (int32_t)w.back();
      if (nt > 0 && nt <= TKn + E) add(b.tiles, (size_t)nt * 2);
      return w;
    };
    auto poison = [&]() { /* NaN / -1 everywhere: nothing of the run before passes for this one's */
      CKL(cudaMemset(dr, 0xff, (size_t)T * E * 4)); CKL(cudaMemset(dws, 0xff, (size_t)DG_ROUTER_MAX_SPLITS * T * E * 4));
      CKL(cudaMemset(b.topk_idx, 0xff, TKn * 4)); CKL(cudaMemset(b.topk_w, 0xff, TKn * 4));
      CKL(cudaMemset(b.count, 0xff, E * 4)); CKL(cudaMemset(b.start, 0xff, (E + 1) * 4));
      CKL(cudaMemset(b.pairs, 0xff, TKn * 4)); CKL(cudaMemset(b.slot_row, 0xff, TKn * 4));
      CKL(cudaMemset(b.tiles, 0xff, (size_t)(TKn + E) * 8)); CKL(cudaMemset(b.n_tiles, 0xff, 4));
      CKL(cudaMemset(b.order, 0xff, E * 4));
    };
    std::vector<uint32_t> ref;
    const double in_bytes = (double)TH * 4 + (double)E * H * 4 + E * 4.0,
                 out_bytes = (double)T * E * 4 + TKn * 16.0 + E * 16.0 + (TKn / 32.0 + E) * 8;
    const char *vnames[7] = {"v0 chain", "v1 fused", "v2 tiles", "v3 grid", "v4 deep", "v5 one", "v6 gridp"};
    if (!k_router_one_ok(T, E, H, K))
      printf("(v5: router_one_kernel does not cover T %d E %d H %d: its rows are v3's)\n", T, E, H);
    for (int ver : {0, 1, 2, 3, 4, 5, 6}) {
      auto launch = [&] { CKL(k_router_route(0, du, dW, dr, dpes, &b, T, E, H, K, dws, ver)); };
      poison();
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<uint32_t> got = words();
      size_t nd = 0;
      if (ver == 0) ref = got;
      else {
        nd = got.size() == ref.size() ? 0 : std::max(got.size(), ref.size());
        for (size_t i = 0; i < got.size() && i < ref.size(); i++) nd += got[i] != ref[i];
      }
      /* a second run on the same buffers (the block counter back at 0) */
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<uint32_t> again = words();
      const int same = again == got;
      char chk[200];
      if (ver == 0) snprintf(chk, sizeof chk, "reference version (%zu output words); rerun %s", got.size(), same ? "same" : "DIFFERS");
      else snprintf(chk, sizeof chk, "%zu of %zu output words differ from v0; rerun %s", nd, ref.size(), same ? "same" : "DIFFERS");
      const int ok = nd == 0 && same;
      double med, mn;
      timeit(launch, med, mn);
      row("router stage", vnames[ver], med, mn, in_bytes + out_bytes, in_bytes + out_bytes, chk, ok);
      timeit([&] { for (int r = 0; r < 30; r++) launch(); }, med, mn);
      row("router stage x30 (per stage)", vnames[ver], med / 30, mn / 30, in_bytes + out_bytes, in_bytes + out_bytes,
          "30 stages back to back", ok);
    }
    { /* v0's launches apart (where its stage time goes): the product and split reduction, the softmax / top-K, the
       * grouping's three launches (rlog holds probabilities after the first top-K: the same operations) */
      double med, mn;
      timeit([&] { CKL(k_router_logits(0, du, dW, dr, T, E, H, dws)); }, med, mn);
      row("router logits (chain: part + reduce)", "v0", med, mn, in_bytes + (double)T * E * 4 * 2 * DG_ROUTER_MAX_SPLITS,
          in_bytes, "2 launches", 1);
      timeit([&] { CKL(k_route_topk(0, dr, dpes, &b, T, E, K)); }, med, mn);
      row("router top-K (chain: topk_kernel)", "v0", med, mn, (double)T * E * 8 + TKn * 8.0, (double)T * E * 8 + TKn * 8.0,
          "1 launch", 1);
      timeit([&] { CKL(k_group(0, &b, T, E, K)); }, med, mn);
      row("router grouping (chain: count, scan, place)", "v0", med, mn, TKn * 4.0 * (2 * E + 2), TKn * 12.0,
          "3 launches", 1);
    }
    if (k_router_tiles_ok(T, E, H, K)) { /* v2's launches apart: the split sums, then the routing from them */
      int S = 0;
      double med, mn;
      timeit([&] { CKL(k_router_tiles_product(0, du, dW, dws, T, E, H, &S)); }, med, mn);
      char chk[160];
      snprintf(chk, sizeof chk, "%d splits; %.1f M FMA (%.2f us at 67 TFLOP/s)", S, (double)T * E * H / 1e6,
               2.0 * T * E * H / 67e12 * 1e6);
      row("router split sums (tiles)", "v2", med, mn, in_bytes + (double)S * T * E * 4, in_bytes, chk, 1);
      timeit([&] { CKL(k_route_tiles(0, dws, S, dr, dpes, &b, T, E, K)); }, med, mn);
      row("route from split sums (tiles)", "v2", med, mn, (double)S * T * E * 4 + out_bytes, (double)S * T * E * 4 + out_bytes,
          "softmax, top-K, weights, grouping", 1);
      if (k_router_grid_ok(T, E, H, K)) {
        timeit([&] { CKL(k_route_grid(0, dws, S, dr, dpes, &b, T, E, K)); }, med, mn);
        row("route from split sums (grid)", "v3", med, mn, (double)S * T * E * 4 + out_bytes,
            (double)S * T * E * 4 + out_bytes, "the grouping over every block", 1);
      }
      /* v4's product (router_tile_deep_kernel: every stage of a split in flight at once), its split sums word for
       * word against v2's (router_tile_kernel) */
      CKL(k_router_tiles_product(0, du, dW, dws, T, E, H, &S));
      CKL(cudaDeviceSynchronize());
      const std::vector<uint32_t> p2 = down((const uint32_t *)dws, (size_t)S * T * E);
      CKL(cudaMemset(dws, 0xff, (size_t)S * T * E * 4));
      int S4 = 0;
      CKL(k_router_tiles_product_v(0, 4, du, dW, dws, T, E, H, &S4));
      CKL(cudaDeviceSynchronize());
      const size_t nd4 = S4 == S ? ndiff(down((const uint32_t *)dws, (size_t)S * T * E), p2) : p2.size();
      timeit([&] { CKL(k_router_tiles_product_v(0, 4, du, dW, dws, T, E, H, &S4)); }, med, mn);
      snprintf(chk, sizeof chk, "%d splits; %zu of %zu split sums differ from v2", S4, nd4, p2.size());
      row("router split sums (deep)", "v4", med, mn, in_bytes + (double)S * T * E * 4, in_bytes, chk, nd4 == 0);
    }
    if (H % 64 == 0) { /* the stage up to the experts' gate/up input: v2 + k_group_sums_perm (the launch k_qe_gate_up
                        * makes for lane records) against v3 making the copy and sums inside route_gr_kernel */
      const int G = 64;
      std::vector<uint32_t> xb(TH / 2);
      for (size_t i = 0; i < TH / 2; i++) {
        uint32_t lo, hi;
        memcpy(&lo, &u[2 * i], 4);
        memcpy(&hi, &u[2 * i + 1], 4);
        xb[i] = (lo >> 16) | (hi & 0xffff0000u);
      }
      uint32_t *dxe = dnew<uint32_t>(TH / 2);
      up(dxe, xb);
      b.xs = dnew<float>(TH / G);
      b.xp = dnew<bf16>(TH);
      std::vector<uint32_t> r2;
      for (int ver : {2, 3, 4, 5, 6}) {
        auto launch = [&] {
          b.gu_x = (const bf16 *)dxe;
          b.gu_group = G;
          CKL(k_router_route(0, du, dW, dr, dpes, &b, T, E, H, K, dws, ver));
          if (b.gu_ready != b.gu_x) CKL(k_group_sums_perm(0, (const bf16 *)dxe, T, H, G, b.xs, b.xp));
          b.gu_ready = NULL;
        };
        CKL(cudaMemset(b.xs, 0xff, TH / G * 4)); CKL(cudaMemset(b.xp, 0xff, TH * 2));
        launch();
        CKL(cudaDeviceSynchronize());
        std::vector<uint32_t> w = words(), x1 = down((const uint32_t *)b.xs, TH / G), x2 = down((const uint32_t *)b.xp, TH / 2);
        w.insert(w.end(), x1.begin(), x1.end());
        w.insert(w.end(), x2.begin(), x2.end());
        size_t nd = 0;
        if (ver == 2) r2 = w;
        else {
          nd = w.size() == r2.size() ? 0 : std::max(w.size(), r2.size());
          for (size_t i = 0; i < w.size() && i < r2.size(); i++) nd += w[i] != r2[i];
        }
        char chk[200];
        snprintf(chk, sizeof chk,
                 ver == 2 ? "3 launches; %zu output words"
                 : ver == 5 ? "1 launch; %zu words differ from v2" : "2 launches; %zu words differ from v2",
                 ver == 2 ? w.size() : nd);
        double med, mn;
        timeit(launch, med, mn);
        const double xb2 = TH * 2.0 * 2 + TH / G * 4.0;
        row("router stage + gate/up input copy", vnames[ver], med, mn, in_bytes + out_bytes + xb2, in_bytes + out_bytes + xb2,
            chk, nd == 0);
        timeit([&] { for (int r = 0; r < 30; r++) launch(); }, med, mn);
        row("router stage + gate/up input copy x30 (per stage)", vnames[ver], med / 30, mn / 30, in_bytes + out_bytes + xb2,
            in_bytes + out_bytes + xb2, "30 stages back to back", nd == 0);
      }
      cudaFree(dxe); cudaFree(b.xs); cudaFree(b.xp);
    }
    cudaFree(du); cudaFree(dW); cudaFree(dpes); cudaFree(dr); cudaFree(dws);
    cudaFree(b.topk_idx); cudaFree(b.topk_w); cudaFree(b.count); cudaFree(b.start); cudaFree(b.pairs);
    cudaFree(b.slot_row); cudaFree(b.tiles); cudaFree(b.n_tiles); cudaFree(b.order); cudaFree(b.done); cudaFree(b.gsc);
  }
  /* the experts' input copies (k_group_sums_perm_v): the gate/up input [T, H] (26B: made inside route_gr_kernel
   * by default, by its own launch under DGEMMA_ROUTE=tiles) and the down input [T K, IE] (26B IE = 704: its own
   * launch unless DGEMMA_DN_FUSE=1); v0 a block of 64 threads per row, a thread per group, G / 8 load latencies in a
   * row (group_sum_perm's loop stores a run before loading the next); v2 a thread per group over the whole input,
   * the group's loads first (DGEMMA_GSP=flat). Both against the host's fp32 chains and permutation, word for word. */
  {
    const int G = H % 64 == 0 ? 64 : H % 32 == 0 ? 32 : 8, IE = std::max(G, H / 4 / G * G);
    const struct { const char *name; int rows, cols; } cs[2] = {{"gate/up input copy", T, H}, {"down input copy", T * K, IE}};
    for (const auto &c : cs) {
      const size_t n = (size_t)c.rows * c.cols, ns = n / G;
      std::vector<uint16_t> x(n), rp(n);
      std::vector<float> rsum(ns);
      for (size_t i = 0; i < n; i++) { /* bf16 bits of values over 2^-8 .. 2^8: most chains round */
        const float f = ldexpf(frand(), (int)((i * 7) % 17) - 8);
        uint32_t u32;
        memcpy(&u32, &f, 4);
        x[i] = (uint16_t)(u32 >> 16);
      }
      for (size_t g = 0; g < ns; g++) {
        float a = 0.0f;
        for (int k = 0; k < G; k++) {
          const uint32_t u32 = (uint32_t)x[g * G + k] << 16;
          float f;
          memcpy(&f, &u32, 4);
          a += f;
        }
        rsum[g] = a;
      }
      for (size_t r = 0; r < n / 8; r++)
        for (int m = 0; m < 4; m++) { rp[8 * r + 2 * m] = x[8 * r + m]; rp[8 * r + 2 * m + 1] = x[8 * r + m + 4]; }
      uint16_t *dx = dnew<uint16_t>(n), *dxp = dnew<uint16_t>(n);
      float *dxs = dnew<float>(ns);
      up(dx, x);
      for (int ver : {0, 2}) {
        auto launch = [&] { CKL(k_group_sums_perm_v(0, ver, (const bf16 *)dx, c.rows, c.cols, G, dxs, (bf16 *)dxp)); };
        CKL(cudaMemset(dxs, 0xff, ns * 4)); CKL(cudaMemset(dxp, 0xff, n * 2));
        launch();
        CKL(cudaDeviceSynchronize());
        const size_t nd = ndiff(down(dxs, ns), rsum) + ndiff(down(dxp, n), rp);
        char chk[200], vn[16], nm[80];
        const long nb = ver == 2 ? (long)((ns + 63) / 64) : c.rows;
        snprintf(chk, sizeof chk, "%ld blocks of 64; %zu of %zu words differ from the host's", nb, nd, ns + n);
        snprintf(vn, sizeof vn, ver == 2 ? "v2 flat" : "v0");
        snprintf(nm, sizeof nm, "%s %d x %d G %d", c.name, c.rows, c.cols, G);
        double med, mn;
        timeit(launch, med, mn);
        const double bytes = n * 4.0 + ns * 4.0;
        row(nm, vn, med, mn, bytes, bytes, chk, nd == 0);
      }
      cudaFree(dx); cudaFree(dxp); cudaFree(dxs);
    }
  }
  /* qkv_post: sliding (16 q, 8 kv heads of 256) and full (16 q, 2 kv heads of 512, K = V) layers */
  for (int full = 0; full < 2 && !router_only; full++) {
    const int NH = 16, NKV = full ? 2 : 8, D = full ? 512 : 256, has_v = !full, P = 1024, S = P + T;
    const int64_t ld = (int64_t)(NH + NKV * (has_v ? 2 : 1)) * D;
    std::vector<float> qkv = rv((size_t)T * ld, 0, 2), qn = rv(D, 1, 0.5f), kn = rv(D, 1, 0.5f), fr(D / 2);
    for (int i = 0; i < D / 2; i++) fr[i] = (float)pow(full ? 1e6 : 1e4, -2.0 * i / D);
    float *dqkv = dnew<float>((size_t)T * ld), *dq = dnew<float>((size_t)T * NH * D), *dqn = dnew<float>(D),
          *dkn = dnew<float>(D), *dfr = dnew<float>(D / 2);
    bf16 *dkc = dnew<bf16>((size_t)NKV * S * D), *dvc = dnew<bf16>((size_t)NKV * S * D);
    up(dqkv, qkv); up(dqn, qn); up(dkn, kn); up(dfr, fr);
    CKL(cudaMemset(dkc, 0, (size_t)NKV * S * D * 2));
    CKL(cudaMemset(dvc, 0, (size_t)NKV * S * D * 2));
    std::vector<double> rq((size_t)T * NH * D), rk((size_t)T * NKV * D), rvv((size_t)T * NKV * D);
    const int h = D / 2;
    for (int t = 0; t < T; t++) {
      const float *row0 = &qkv[(size_t)t * ld];
      for (int sl = 0; sl < NH + 2 * NKV; sl++) {
        const float *src;
        int kind = sl < NH ? 0 : sl < NH + NKV ? 1 : 2, g = kind == 0 ? sl : kind == 1 ? sl - NH : sl - NH - NKV;
        src = kind == 0 ? row0 + (size_t)sl * D : kind == 1 ? row0 + (size_t)NH * D + (size_t)g * D
                                                            : row0 + (size_t)NH * D + (size_t)(has_v ? NKV * D : 0) + (size_t)g * D;
        const double r = rms_inv(src, D, eps);
        for (int i = 0; i < h; i++) {
          if (kind == 2) {
            rvv[((size_t)t * NKV + g) * D + i] = src[i] * r;
            rvv[((size_t)t * NKV + g) * D + i + h] = src[i + h] * r;
            continue;
          }
          const float *w = kind == 0 ? qn.data() : kn.data();
          const double a = src[i] * r * w[i], b = src[i + h] * r * w[i + h];
          const double ang = (double)(fr[i] * (float)(P + t)), cs = cos(ang), sn = sin(ang);
          double *dst = kind == 0 ? &rq[((size_t)t * NH + sl) * D] : &rk[((size_t)t * NKV + g) * D];
          dst[i] = a * cs - b * sn;
          dst[i + h] = b * cs + a * sn;
        }
      }
    }
    std::vector<float> q1;
    for (int ver : {1, 0}) {
      auto launch = [&] {
        CKL(k_qkv_post_v(0, ver, dqkv, ld, dq, dkc, dvc, S, dqn, dkn, dfr, T, NH, NKV, D, has_v, P, NULL, eps));
      };
      launch();
      CKL(cudaDeviceSynchronize());
      std::vector<float> qg = down(dq, (size_t)T * NH * D);
      std::vector<bf16> kall = down(dkc, (size_t)NKV * S * D), vall = down(dvc, (size_t)NKV * S * D);
      std::vector<bf16> kg((size_t)T * NKV * D), vg((size_t)T * NKV * D);
      for (int t = 0; t < T; t++)
        for (int g = 0; g < NKV; g++)
          for (int i = 0; i < D; i++) {
            kg[((size_t)t * NKV + g) * D + i] = kall[((size_t)g * S + P + t) * D + i];
            vg[((size_t)t * NKV + g) * D + i] = vall[((size_t)g * S + P + t) * D + i];
          }
      if (ver == 1) q1 = qg;
      const double eq = err_f(qg, rq), ek = err_b(kg, rk), ev = err_b(vg, rvv);
      char chk[200], vn[8], nm[64];
      snprintf(chk, sizeof chk, "q %.1e (fp32, ok <= 1e-5), k %.2f v %.2f of 2^-8; q: %zu differ from v1", eq, ek, ev,
               ndiff(qg, q1));
      snprintf(vn, sizeof vn, "v%d", ver);
      snprintf(nm, sizeof nm, "qkv_post %s D=%d", full ? "full" : "sliding", D);
      double med, mn;
      timeit(launch, med, mn);
      const double bytes = (double)T * ld * 4 + (double)T * NH * D * 4 + 2.0 * T * NKV * D * 2 + D * 10.0;
      row(nm, vn, med, mn, bytes, bytes, chk, eq <= 1e-5 && ek <= 1 && ev <= 1);
    }
    cudaFree(dqkv); cudaFree(dq); cudaFree(dqn); cudaFree(dkn); cudaFree(dfr); cudaFree(dkc); cudaFree(dvc);
  }
}

int main(int argc, char **argv) {
  int small = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--router")) router_only = 1;
    else if (!strcmp(argv[i], "--vocab")) vocab_only = 1;
    else if (!strcmp(argv[i], "--chain")) vocab_only = chain_only = 1;
    else { fprintf(stderr, "usage: step_kernels_lab [--reps N] [--small] [--router | --vocab | --chain]\n"); return 2; }
  }
  if (small && reps > 2) reps = 2;
  cudaDeviceProp prop;
  CKL(cudaGetDeviceProperties(&prop, 0));
  nsm = small ? 1 : prop.multiProcessorCount;
  CKL(cudaEventCreate(&e0));
  CKL(cudaEventCreate(&e1));
  const size_t RB = small ? ((size_t)1 << 20) : ((size_t)4 << 30);
  uint4 *big;
  CKL(cudaMalloc((void **)&big, RB));
  CKL(cudaMalloc((void **)&sink, 4));
  CKL(cudaMemset(big, 1, RB));
  std::vector<float> t;
  for (int r = 0; r < 5; r++) {
    CKL(cudaEventRecord(e0));
    DG_LAUNCH(read_kernel, nsm * 8, 512, 0, 0)(big, RB / 16, sink);
    CKL(cudaEventRecord(e1));
    CKL(cudaEventSynchronize(e1));
    t.push_back(time_ms(e0, e1));
  }
  std::sort(t.begin(), t.end());
  bw = RB / (t[t.size() / 2] * 1e-3);
  flushbuf = big;
  flushn = (small ? RB : ((size_t)256 << 20)) / 16;
  printf("# %s: read bandwidth %.0f GB/s; %d repetitions, L2 flushed before each\n", prop.name, bw / 1e9, reps);
  printf("| kernel | version | ms (median) | min | MB moved | GB/s | floor ms | %% of floor | check |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  if (small) {
    gsz[0] = 2; gsz[1] = 1;
    if (!router_only) {
      if (!chain_only) {
        stats_case(3, 20003); /* tails: V % 8192 != 0 and V % 4 != 0 (scalar loads) */
        stats_case(3, 20480);
        sc_case(3, 20003, DG_CUDA_BF16);
        sc_case(3, 20480, DG_CUDA_F32);
      }
      chain_case(3, 20003);
      chain_case(3, 20480);
    }
    if (!vocab_only) {
      rows_case(5, 2816, 2112, 8, 128);
      rows_case(3, 96, 64, 3, 6);
    }
    if (router_only) rows_case(37, 200, 64, 3, 40); /* T of no block multiple, E of no warp multiple, 4 splits */
  } else {
    if (!router_only) {
      if (!chain_only) {
        stats_case(256, 262144);
        sc_case(256, 262144, DG_CUDA_BF16);
      }
      chain_case(256, 262144);
    }
    if (!vocab_only) rows_case(256, 2816, 2112, 8, 128);
  }
  printf("# %s\n", failed ? "FAILED: a check above is outside its bound" : "all checks within their bounds");
  return failed;
}
