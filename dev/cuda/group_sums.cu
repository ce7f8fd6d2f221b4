/* group_sums.cu (lab, issue 12): the expert products' input preparation, k_group_sums_perm (src/cuda/qmoe.cu):
 * each row's group sums in fp32 (column order) and its copy with each run of 8 permuted to qr_kernel's fragment
 * order. Version 0: group_sums_perm_kernel (a block of 64 threads per row, a thread per group, one 16-byte load per
 * dependent step); version 1: group_sums_perm_flat_kernel (the backend's since session 13: a flat grid of a thread
 * per (row, group), the group's loads all issued first). Checked bit for bit against version 0 (sums and copy), then
 * timed with cudaEvents (median of 50, after 5 warm-ups; the input is L2-resident as in a pass, where the previous
 * kernel just wrote it) at the 26B's shapes: gate/up (256 rows x 2816) and down (2048 x 704), and smaller checks.
 *   GPU:        nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc dev/cuda/group_sums.cu \
 *                 build/libdgemma.a -lcublas -lcudart -o build/group_sums_lab && build/group_sums_lab
 *   emulation:  g++ -x c++ -std=c++17 -O2 -fopenmp -Idev/cuda_emu/include -Idev/cuda_emu -include emu.h -Iinclude \
 *                 -Isrc dev/cuda/group_sums.cu -x none build-emu/libdgemma.a -lcjson -lm -lstdc++ -ldl -o \
 *                 build-emu/group_sums_lab && build-emu/group_sums_lab (checks only; times mean nothing there) */
#include "cuda/common.cuh"
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

__global__ void group_sums_perm_kernel(const bf16 *x, int cols, int G, float *out, bf16 *xp);

static float ms_of(cudaEvent_t a, cudaEvent_t b) { float m = 0; cudaEventElapsedTime(&m, a, b); return m; }

int main(void) {
  int bad = 0;
  const int shapes[][3] = {{256, 2816, 64}, {2048, 704, 64}, {37, 2816, 64}, {300, 704, 64}, {5, 256, 32}, {9, 512, 128}};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  printf("| rows | cols | G | version 0 us | version 1 us | check |\n|---|---|---|---|---|---|\n");
  for (auto &sh : shapes) {
    const int R = sh[0], C = sh[1], G = sh[2];
    std::vector<uint16_t> hx((size_t)R * C);
    unsigned st = 12345u + (unsigned)R;
    for (auto &v : hx) { st = st * 1664525u + 1013904223u; v = (uint16_t)((0x3c00 + (st >> 20) % 0x0800) | ((st >> 31) << 15)); }
    bf16 *x, *p0, *p1;
    float *o0, *o1;
    const size_t ns = (size_t)R * (C / G);
    if (cudaMalloc((void **)&x, hx.size() * 2) || cudaMalloc((void **)&p0, hx.size() * 2) ||
        cudaMalloc((void **)&p1, hx.size() * 2) || cudaMalloc((void **)&o0, ns * 4) || cudaMalloc((void **)&o1, ns * 4)) {
      printf("cudaMalloc failed\n");
      return 1;
    }
    cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(p1, 0xff, hx.size() * 2); /* poison: every element must be written */
    cudaMemset(o1, 0xff, ns * 4);
    auto v0 = [&]() { DG_LAUNCH(group_sums_perm_kernel, R, 64, 0, 0)(x, C, G, o0, p0); return cudaGetLastError(); };
    auto v1 = [&]() { return k_group_sums_perm(0, x, R, C, G, o1, p1); };
    if (v0() != cudaSuccess || v1() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    std::vector<uint16_t> a(hx.size()), b(hx.size());
    std::vector<float> sa(ns), sb(ns);
    cudaMemcpy(a.data(), p0, a.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), p1, b.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(sa.data(), o0, ns * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(sb.data(), o1, ns * 4, cudaMemcpyDeviceToHost);
    const int same = !memcmp(a.data(), b.data(), a.size() * 2) && !memcmp(sa.data(), sb.data(), ns * 4);
    bad += !same;
    double t[2];
    for (int v = 0; v < 2; v++) {
      std::vector<float> ts;
      for (int rep = 0; rep < 55; rep++) {
        cudaEventRecord(e0);
        if (v == 0) v0(); else v1();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        if (rep >= 5) ts.push_back(ms_of(e0, e1) * 1e3f);
      }
      std::sort(ts.begin(), ts.end());
      t[v] = ts[ts.size() / 2];
    }
    printf("| %d | %d | %d | %.1f | %.1f | %s |\n", R, C, G, t[0], t[1], same ? "identical" : "DIFFER");
    cudaFree(x); cudaFree(p0); cudaFree(p1); cudaFree(o0); cudaFree(o1);
  }
  printf("\n%d shapes differ\n", bad);
  return bad != 0;
}
