/* qr_lm_emu.cpp: lab versions 130-133 (dev/cuda/qr_lm_lab.cuh) against version 50's kernel (qr_launch_bits, the
 * backend's qr_kernel) on the CPU emulation of dev/cuda_emu, every output word compared (session 28, helper lm14).
 * The arithmetic needs no real stack for this: both kernels read the same lane records (random codes, bf16 pairs of
 * small finite scales and biases), the same activations and group sums (random, not consistent with each other: the
 * check is word equality, not accuracy) and the same routing, so equal words mean the same products, folds and
 * stores on every real row. Cases: per expert counts that cross every body of qr_lm_tiles (1-8 n-tiles), 64-row
 * pass boundaries (64, 65, 128, 129, 200 rows), an empty expert, version 50 at its own tile choice (qe_nt) and at
 * forced 3, 5 and 8 n-tiles (its words must not depend on it either), gate/up (GeGLU, h bf16) and down (y fp32),
 * stacks of 10 / 11 weight stages (the DIET loop's FAST and tested iterations, an odd count and a half last
 * activation stage). Mutation check: --mutate makes versions 132 and 130 skip the last pass of each expert (must
 * fail). --ver N: version N alone (133, 132's kernel with other launch bounds: one case). --occ: versions 134-137
 * (session 29, helper wp11: version 50's kernel with other launch bounds, and at 8 n-tiles a 2-stage activation ring)
 * against version 50 at the same forced tile count, 4, 5 and 8 (the emulation ignores launch bounds: what it checks
 * is the 2-stage ring and the launcher's instances), and 138 (the lean stage order, qr_lean_stage) against version 50
 * at 8 n-tiles; --ver 139: 138's source with other launch bounds. Built with -DQR_LEAN_MUTATE (the lean stage's runs in
 * the other order), --ver 138 must fail. --uni: the lab's uniform rows (12 experts of M = 16, 32, 64, 128 rows) for
 * 134, 135 and 138 at their own tile choice. --form (session 31): the backend's launch (qr_launch_bits) under
 * DGEMMA_QR_LAUNCH=lean and lean5 against version 50 at session 30's choices (v50: this file's qr_launch_form is v50
 * unless a case sets it), at 5 and 8 n-tiles; built with -DQR_LEAN_MUTATE its lean rows must differ.
 *
 * Build and run (no GPU; ~8-10 minutes on a loaded 2-core machine, 24 cases):
 *   g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude -Isrc \
 *       -Wno-unknown-pragmas dev/cuda/qr_lm_emu.cpp dev/cuda_emu/emu.cpp -o /tmp/qr_lm_emu && /tmp/qr_lm_emu */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "qr_lm_lab.cuh"

/* qr_launch_bits asks for the DQ body's threshold (qmoe.cu): never here. */
int qr_dq_from(void) { return 0; }
/* ... and for DGEMMA_QR_LAUNCH's form (qmoe.cu): version 50 here is session 30's qr_kernel at every tile count
 * (QR_FORM_V50), the reference; --form runs the backend's other forms against it. */
static int emu_form = QR_FORM_V50;
int qr_launch_form(void) { return emu_form; }

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint32_t rnd() {
  rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
  return (uint32_t)(rs >> 16);
}
static float urand() { return (rnd() & 0xffffff) / 16777216.0f; }
static uint16_t bf16_of(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct prob {
  int E, T, K, H, IE;
  std::vector<int> cnt;
};

/* One product: lane records for E experts (N rows per expert, Kdim columns), routing from cnt; returns the words
 * that differ between version 50 (at tile count nt50; 0: qe_nt) and version ver (130-139; 1, 2: version 50, i.e.
 * qr_launch_bits, under the backend's form QR_FORM_LEAN / QR_FORM_LEAN5 at the same tile count). */
static long run_case(const prob &P, int gateup, int ver, int nt50, int mutate) {
  const int E = P.E, K = P.K, Kdim = gateup ? P.H : P.IE, N = gateup ? P.IE : P.H;
  const int slabs = gateup ? (N + 16 * QR_WARPS - 1) / (16 * QR_WARPS) : (N + 32 * QR_WARPS - 1) / (32 * QR_WARPS);
  const int nst = Kdim / 64, WST = qr_wstage(4, 64, 1);
  const size_t qbytes = (size_t)E * slabs * nst * QR_WARPS * WST;
  std::vector<uint8_t> q(qbytes);
  for (size_t st = 0; st < qbytes / WST; st++) { /* a warp stage: 32 lanes x 32 code bytes, then 8 x 16 pair bytes */
    uint8_t *w = q.data() + st * WST;
    for (int i = 0; i < 32 * 32; i++) w[i] = (uint8_t)rnd();
    for (int i = 0; i < 8 * 4; i++) {
      const uint16_t s = bf16_of(0.001f + 0.02f * urand()), b = bf16_of(0.2f * urand() - 0.1f);
      memcpy(w + 1024 + 4 * i, &s, 2);
      memcpy(w + 1024 + 4 * i + 2, &b, 2);
    }
  }
  int TK = 0;
  for (int c : P.cnt) TK += c;
  std::vector<int32_t> start(E + 1), pairs(TK), order(E);
  for (int e = 0; e < E; e++) start[e + 1] = start[e] + P.cnt[e];
  for (int i = 0; i < TK; i++) pairs[i] = (int32_t)(rnd() % (uint32_t)(P.T * K)); /* gate/up: token = pairs / K */
  for (int e = 0; e < E; e++) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return P.cnt[x] > P.cnt[y]; });
  const int xrows = gateup ? P.T : TK, ng = Kdim / 64;
  std::vector<uint16_t> X((size_t)xrows * Kdim);
  for (auto &v : X) v = bf16_of(2.0f * urand() - 1.0f);
  std::vector<float> xs((size_t)xrows * ng);
  for (auto &v : xs) v = 8.0f * urand() - 4.0f;

  void *dq, *dX, *dxs, *dc, *dst, *dp, *dord, *dout;
  const size_t obytes = gateup ? (size_t)TK * N * 2 : (size_t)TK * N * 4;
  cudaMalloc(&dq, qbytes); cudaMemcpy(dq, q.data(), qbytes, cudaMemcpyHostToDevice);
  cudaMalloc(&dX, X.size() * 2); cudaMemcpy(dX, X.data(), X.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&dxs, xs.size() * 4); cudaMemcpy(dxs, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dc, E * 4); cudaMemcpy(dc, P.cnt.data(), E * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dst, (E + 1) * 4); cudaMemcpy(dst, start.data(), (E + 1) * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dp, std::max(TK, 1) * 4); cudaMemcpy(dp, pairs.data(), TK * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dord, E * 4); cudaMemcpy(dord, order.data(), E * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dout, obytes);
  qe_args a;
  memset(&a, 0, sizeof a);
  a.q = (const uint32_t *)dq;
  a.group = 64; a.pb = 4; a.sb = DG_CUDA_BF16;
  a.X = (const bf16 *)dX; a.xs = (const float *)dxs;
  a.count = (const int32_t *)dc; a.start = (const int32_t *)dst; a.pairs = (const int32_t *)dp;
  a.order = (const int32_t *)dord;
  a.topk = K; a.Kdim = Kdim; a.N = N;
  if (gateup) a.h = (bf16 *)dout; else a.y = (float *)dout;
  std::vector<uint8_t> o50(obytes), ov(obytes);
  const dim3 grid(E, slabs);
  const int nt = nt50 ? nt50 : qe_nt(P.T, K, E);
  cudaMemset(dout, 0xff, obytes);
  cudaError_t err = gateup ? qr_launch_bits<4, 1>(0, grid, nt, a) : qr_launch_bits<4, 0>(0, grid, nt, a);
  if (err != cudaSuccess) { fprintf(stderr, "v50 launch: %d\n", (int)err); exit(2); }
  cudaDeviceSynchronize();
  cudaMemcpy(o50.data(), dout, obytes, cudaMemcpyDeviceToHost);
  cudaMemset(dout, 0xff, obytes);
  if (mutate) { /* the version without each expert's last pass: its rows stay poisoned */
    std::vector<int> c2(P.cnt);
    for (auto &c : c2) c = c > 64 ? (c - 1) / 64 * 64 : c;
    cudaMemcpy(dc, c2.data(), E * 4, cudaMemcpyHostToDevice);
  }
  qr_lm_pairs = TK;
  if (ver == QR_FORM_LEAN || ver == QR_FORM_LEAN5) { /* the backend's launch under DGEMMA_QR_LAUNCH=lean / lean5 */
    emu_form = ver;
    err = gateup ? qr_launch_bits<4, 1>(0, grid, nt, a) : qr_launch_bits<4, 0>(0, grid, nt, a);
    emu_form = QR_FORM_V50;
  } else if (ver >= 138) /* 138, 139: the lean stage order at 8 n-tiles (6 for experts of <= 48 rows) */
    err = gateup ? qr_lean_launch<4, 1>(ver, 0, grid, nt, a) : qr_lean_launch<4, 0>(ver, 0, grid, nt, a);
  else if (ver >= 134) /* 134-137: version 50's kernel at the same tile count with other launch bounds and ring depth */
    err = gateup ? qr_occ_launch<4, 1>(ver, 0, grid, nt, a) : qr_occ_launch<4, 0>(ver, 0, grid, nt, a);
  else
    err = gateup ? qr_lm_launch<4, 1>(ver, 0, grid, a) : qr_lm_launch<4, 0>(ver, 0, grid, a);
  if (err != cudaSuccess) { fprintf(stderr, "v%d launch: %d\n", ver, (int)err); exit(2); }
  cudaDeviceSynchronize();
  cudaMemcpy(ov.data(), dout, obytes, cudaMemcpyDeviceToHost);
  const size_t wb = gateup ? 2 : 4, words = obytes / wb;
  long nd = 0, poisoned = 0;
  for (size_t i = 0; i < words; i++) {
    nd += memcmp(&o50[i * wb], &ov[i * wb], wb) != 0;
    uint32_t v = 0;
    memcpy(&v, &o50[i * wb], wb);
    poisoned += wb == 2 ? v == 0xffffu : v == 0xffffffffu;
  }
  if (poisoned) { fprintf(stderr, "version 50 left %ld words unwritten\n", poisoned); exit(2); }
  cudaFree(dq); cudaFree(dX); cudaFree(dxs); cudaFree(dc); cudaFree(dst); cudaFree(dp); cudaFree(dord); cudaFree(dout);
  if (ver < 100)
    printf("  %-7s v50 under DGEMMA_QR_LAUNCH=%s vs v50 (v50) (nt %d): %zu words, %ld differ\n",
           gateup ? "gate_up" : "down", ver == QR_FORM_LEAN ? "lean" : "lean5", nt, words, nd);
  else
    printf("  %-7s v%d vs v50 (nt %d): %zu words, %ld differ\n", gateup ? "gate_up" : "down", ver, nt, words, nd);
  return nd;
}

int main(int argc, char **argv) {
  const int mutate = argc > 1 && !strcmp(argv[1], "--mutate");
  const int only = argc > 2 && !strcmp(argv[1], "--ver") ? atoi(argv[2]) : 0; /* --ver N: version N alone */
  /* 12 experts: every body of qr_lm_tiles (1..64 rows), pass boundaries 64/65, 128/129, 3 passes (200), empty */
  prob P{12, 160, 8, 640, 384, {0, 1, 9, 20, 27, 36, 45, 64, 65, 128, 129, 200}};
  prob Q{12, 160, 8, 704, 448, {0, 1, 9, 20, 27, 36, 45, 64, 65, 128, 129, 200}}; /* down: 11 weight stages (odd) */
  const int occ = argc > 1 && !strcmp(argv[1], "--occ"); /* --occ: versions 134-137 only */
  long bad = 0;
  const int uni = argc > 1 && !strcmp(argv[1], "--uni"); /* --uni: the uniform rows of 134, 135, 138 only */
  const int form = argc > 1 && !strcmp(argv[1], "--form"); /* --form: the backend's DGEMMA_QR_LAUNCH forms only */
  printf("qr_lm_emu: %s against version 50, word for word%s\n",
         form  ? "the backend's forms lean, lean5"
         : occ ? "versions 134-138"
         : only >= 134 || uni ? "versions 134-139"
                              : "versions 130-133",
         mutate ? " (MUTATION: must fail)" : "");
  /* --form (session 31): qr_launch_bits under DGEMMA_QR_LAUNCH=lean (the down product's 8-tile launch the lean kernel)
   * and lean5 (also MINB 3 at 5 n-tiles, both products) against version 50 (v50) at the same tile count: every pass
   * boundary and body of P / Q's experts. With -DQR_LEAN_MUTATE the lean rows must differ. */
  if (form) {
    bad += run_case(Q, 0, QR_FORM_LEAN, 8, 0);
    bad += run_case(P, 1, QR_FORM_LEAN5, 5, 0);
    bad += run_case(Q, 0, QR_FORM_LEAN5, 5, 0);
    bad += run_case(Q, 0, QR_FORM_LEAN5, 8, 0);
    printf("%s: %ld words differ\n", bad ? "FAIL" : "ok", bad);
    return bad ? 1 : 0;
  }
  for (int ver : {132, 130, 131, 133}) {
    if ((mutate && ver == 131) || (only && ver != only) || occ || uni) continue;
    for (int nt50 : {0, 3, 5, 8}) {
      if ((mutate || ver == 133) && nt50) continue; /* 133: 132's source (launch bounds aside): one case */
      bad += run_case(P, 1, ver, nt50, mutate);
      bad += run_case(Q, 0, ver, nt50, mutate);
    }
  }
  /* 134-138 (--occ, session 29): at 4, 5 and 8 n-tiles (their own instances; below 4 they are version 50's); 138
   * (the lean stage) against version 50 at 8 n-tiles; 139 (138's source, MINB 1) with --ver 139 */
  for (int ver : {138, 134, 135, 136, 137, 139}) {
    if (mutate || !(only == ver || occ)) continue;
    for (int nt50 : {4, 5, 8}) {
      if (ver >= 138 && nt50 != 8) continue; /* 138, 139: their own 8-tile choice (139: 138's source, one case) */
      if (ver == 139 && only != 139) continue;
      bad += run_case(P, 1, ver, nt50, 0);
      bad += run_case(Q, 0, ver, nt50, 0);
    }
  }
  /* --uni (session 29): the lab's uniform rows, every expert M rows (M 16, 32, 64, 128; T = E M / K tokens), each
   * version at its own tile choice (qe_nt, as the lab): 134 and 135 (ring 2 at 8 n-tiles) at every M, 138 at 64 and
   * 128 (below 8 n-tiles it runs version 50's kernels) */
  if (uni) {
    for (int M : {16, 32, 64, 128}) {
      prob U{12, 12 * M / 8, 8, 640, 384, std::vector<int>(12, M)};
      prob V{12, 12 * M / 8, 8, 704, 448, std::vector<int>(12, M)};
      for (int ver : {134, 135, 138}) {
        if (ver == 138 && M < 64) continue;
        bad += run_case(U, 1, ver, 0, 0);
        bad += run_case(V, 0, ver, 0, 0);
      }
    }
  }
  printf("%s: %ld words differ\n", bad ? "FAIL" : "ok", bad);
  return bad ? 1 : 0;
}
