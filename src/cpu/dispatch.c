/* dispatch.c: pick the CPU kernels at run time (cpuid via GCC builtins).
 * DGEMMA_KERNELS=ref|avx2|avx512 forces a choice (tests use it);
 * DGEMMA_KERNELS=avx512lp opts in to the bf16/VNNI products (never chosen by
 * default: they round the activations, see matmul_avx512lp.c). */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

const dg_kernels *dg_kernels_avx2_impl(void);
const dg_kernels *dg_kernels_avx512_impl(void);
const dg_kernels *dg_kernels_avx512lp_impl(void);

const dg_kernels *dg_kernels_avx2(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dg_kernels_avx2_impl();
  return NULL;
}

const dg_kernels *dg_kernels_avx512(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return dg_kernels_avx512_impl();
  return NULL;
}

const dg_kernels *dg_kernels_avx512lp(void) {
  if (!dg_kernels_avx512()) return NULL;
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni")) return dg_kernels_avx512lp_impl();
  return NULL;
}

const dg_kernels *dg_kernels_best(void) {
  const char *env = getenv("DGEMMA_KERNELS");
  if (env && !*env) env = NULL; /* set but empty: the default (it used to pick AVX2) */
  if (env && strcmp(env, "ref") == 0) return dg_kernels_ref();
  if (env && strcmp(env, "avx512lp") == 0 && dg_kernels_avx512lp()) return dg_kernels_avx512lp();
  if (env && strcmp(env, "avx2") == 0 && dg_kernels_avx2()) return dg_kernels_avx2();
  const dg_kernels *k = NULL;
  if (!env || strcmp(env, "avx512") == 0) k = dg_kernels_avx512();
  if (!k) k = dg_kernels_avx2();
  return k ? k : dg_kernels_ref();
}
