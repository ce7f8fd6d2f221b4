/* bench_qmatmul.c: time y = x · Wᵀ for bf16 and MLX affine 2/3/4/6/8-bit
 * weights (group 64) with the best CPU kernels, at several activation counts
 * T; prints ms per call (fastest of 15 after a warm-up: this VM has scheduling hiccups of 4-8 ms) and weight GB/s.
 * A lab tool, not a test:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -fopenmp -Iinclude -Isrc dev/bench_qmatmul.c build/libdgemma.a -lcjson -lm -o /tmp/bq
 *   /tmp/bq [N K threads] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "io/quant.h"

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int N = argc > 1 ? atoi(argv[1]) : 4096, K = argc > 2 ? atoi(argv[2]) : 2816, nt = argc > 3 ? atoi(argv[3]) : 2;
  const int G = 64, Ts[4] = {1, 4, 16, 64};
  const dg_kernels *kn = dg_kernels_best();
  float *wf = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * 64 * K), *y = malloc(sizeof(float) * 64 * N);
  unsigned s = 1;
  for (long i = 0; i < (long)N * K; i++) { s = s * 1103515245u + 12345u; wf[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f; }
  for (long i = 0; i < 64L * K; i++) x[i] = (float)(i % 7) * 0.1f;
  uint16_t *wb = malloc(2 * (size_t)N * (size_t)K);
  for (long i = 0; i < (long)N * K; i++) wb[i] = dg_f32_to_bf16(wf[i]);
  printf("kernels %s, W [%d, %d], %d threads; ms per call (weight GB/s)\n", kn->name, N, K, nt);
  printf("%-6s", "format");
  for (int t = 0; t < 4; t++) printf(" | T=%-16d", Ts[t]);
  printf("\n");
  const int bitsv[6] = {16, 8, 6, 4, 3, 2};
  for (int b = 0; b < 6; b++) {
    dg_weight W = {.dtype = DG_BF16, .data = wb, .rows = N, .cols = K};
    uint8_t *pk = NULL;
    uint16_t *sc = NULL, *bi = NULL;
    double bytes = 2.0 * N * K;
    if (bitsv[b] < 16) {
      int bits = bitsv[b];
      pk = malloc((size_t)N * K * bits / 8);
      sc = malloc(2L * N * K / G);
      bi = malloc(2L * N * K / G);
      for (int r = 0; r < N; r++)
        dg_quant_row(wf + (long)r * K, K, bits, G, DG_BF16, pk + (long)r * K * bits / 8, sc + (long)r * K / G, bi + (long)r * K / G);
      W = (dg_weight){.dtype = DG_U32, .data = pk, .rows = N, .cols = K, .bits = bits, .group_size = G,
                      .sb_dtype = DG_BF16, .scales = sc, .biases = bi};
      bytes = (double)N * K * bits / 8 + 4.0 * N * K / G;
    }
    printf("%-6s", bitsv[b] == 16 ? "bf16" : (char[8]){(char)('0' + bitsv[b]), '-', 'b', 'i', 't', 0});
    for (int t = 0; t < 4; t++) {
      double ms[15];
      kn->matmul(y, N, x, K, Ts[t], &W, 0, N, nt);
      for (int r = 0; r < 15; r++) {
        double t0 = omp_get_wtime();
        kn->matmul(y, N, x, K, Ts[t], &W, 0, N, nt);
        ms[r] = (omp_get_wtime() - t0) * 1e3;
      }
      qsort(ms, 15, sizeof ms[0], cmpd);
      printf(" | %7.2f (%5.1f GB/s)", ms[0], bytes / (ms[0] * 1e-3) / 1e9);
    }
    printf("\n");
    free(pk); free(sc); free(bi);
  }
  free(wf); free(x); free(y); free(wb);
  return 0;
}
