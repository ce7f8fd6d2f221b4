/* stats_fp32_words.c (session 26, helper vs12): would fp32 sums give the sampler statistics' words? One row of
 * V = 262,144 z = softcap(x) / 0.8 (x normal, 1 to 29 sigma by row: flat to peaked), S0 = sum exp(z - g) and
 * S1 = sum exp(z - g)(z - g) summed in the kernels' order (runs of 32, the runs in order) once in fp64 with exp (the
 * backend's vstats_part_body) and once in fp32 with expf; counts the rows whose fp32 entropy and max-prob words
 * differ. Build and run: gcc -O2 -o /tmp/sfw dev/stats_fp32_words.c -lm && /tmp/sfw
 * (docs/results/cpu-s26/vs12_fp32_words.txt). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
static uint64_t s = 88172645463325252ull;
static double nrm(void) { double u1, u2; s ^= s << 13; s ^= s >> 7; s ^= s << 17; u1 = ((s >> 11) + 0.5) / 9007199254740992.0;
  s ^= s << 13; s ^= s >> 7; s ^= s << 17; u2 = ((s >> 11) + 0.5) / 9007199254740992.0; return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2); }
int main(void) {
  enum { V = 262144, R = 256 };
  static float z[V];
  int de = 0, dm = 0;
  for (int r = 0; r < R; r++) {
    const double sc = 1.0 + 4.0 * (r % 8); /* flat to peaked rows */
    float g = -INFINITY;
    for (int i = 0; i < V; i++) { float x = (float)(nrm() * sc); z[i] = tanhf(x / 30.0f) * 30.0f / 0.8f; if (z[i] > g) g = z[i]; }
    double S0 = 0, S1 = 0; float F0 = 0, F1 = 0;
    for (int b = 0; b < V; b += 32) {
      double a0 = 0, a1 = 0; float f0 = 0, f1 = 0;
      for (int k = 0; k < 32; k++) {
        const double d = (double)z[b + k] - (double)g, e = exp(d); a0 += e; a1 += e * d;
        const float df = z[b + k] - g, ef = expf(df); f0 += ef; f1 += ef * df;
      }
      S0 += a0; S1 += a1; F0 += f0; F1 += f1;
    }
    const double lse = (double)g + log(S0), ent = log(S0) - S1 / S0;
    const float e64 = (float)(ent > 0 ? ent : 0), m64 = (float)exp((double)g - lse);
    const float entf = logf(F0) - F1 / F0, e32 = entf > 0 ? entf : 0, m32 = 1.0f / F0;
    de += e64 != e32; dm += m64 != m32;
  }
  printf("%d rows of %d: fp32 sums change the entropy word in %d rows, the max prob word in %d\n", R, V, de, dm);
  return 0;
}
