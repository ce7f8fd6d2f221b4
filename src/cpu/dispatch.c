/* dispatch.c: pick the CPU kernels at run time (cpuid via GCC builtins).
 * DGEMMA_KERNELS=ref|avx2|avx512 forces a choice (tests use it);
 * DGEMMA_KERNELS=avx512lp opts in to the bf16/VNNI products (never chosen by
 * default: they round the activations, see matmul_avx512lp.c), and
 * DGEMMA_KERNELS=avx2lp to the int8 vpmaddubsw products of AVX2 CPUs (likewise
 * lossy and never the default: matmul_avx2lp.c). A set this CPU lacks gives
 * the best exact set (dg_kernels_pick says why; dg_cpu_kernels reports it to
 * the caller as a warning); a value that names no set is refused by
 * dg_switches_check before any model loads (session 31; it ran the best set
 * with a warning before). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"

const dg_kernels *dg_kernels_avx2_impl(void);
const dg_kernels *dg_kernels_avx512_impl(void);
const dg_kernels *dg_kernels_avx512lp_impl(void);
const dg_kernels *dg_kernels_avx2lp_impl(void);

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

const dg_kernels *dg_kernels_avx2lp(void) { return dg_kernels_avx2() ? dg_kernels_avx2lp_impl() : NULL; }

/* The best exact set of this CPU: AVX-512, AVX2+FMA or the oracle. */
static const dg_kernels *best_exact(void) {
  const dg_kernels *k = dg_kernels_avx512();
  if (!k) k = dg_kernels_avx2();
  return k ? k : dg_kernels_ref();
}

static const struct {
  const char *name;
  const dg_kernels *(*get)(void);
  const char *lacks;
} sets[] = {
    {"ref", dg_kernels_ref, ""},
    {"avx2", dg_kernels_avx2, "AVX2 and FMA"},
    {"avx512", dg_kernels_avx512, "AVX-512 F/BW/VL/DQ"},
    {"avx512lp", dg_kernels_avx512lp, "AVX-512 BF16 and VNNI"},
    {"avx2lp", dg_kernels_avx2lp, "AVX2 and FMA"},
};

int dg_kernels_known(const char *env) {
  if (!env || !*env) return 1;
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    if (!strcmp(env, sets[i].name)) return 1;
  return 0;
}

void dg_kernels_refusal(const char *env, char *why, size_t n) {
  char v[64];
  const int cut = dg_env_quote(env ? env : "", v, sizeof v);
  snprintf(why, n,
           "DGEMMA_KERNELS=\"%s%s\" is not one of ref, avx2, avx512, avx512lp, avx2lp (the CPU kernel set; unset: the "
           "best exact set this CPU has)",
           v, cut ? "..." : "");
}

const dg_kernels *dg_kernels_pick(const char *env, char *why, size_t n) {
  if (why && n) why[0] = 0;
  if (!env || !*env) return best_exact(); /* unset or empty: the default */
  const dg_kernels *best = best_exact();
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    if (!strcmp(env, sets[i].name)) {
      const dg_kernels *k = sets[i].get();
      if (k) return k;
      if (why && n)
        snprintf(why, n, "DGEMMA_KERNELS=%s: this CPU lacks %s; using the %s kernels", env, sets[i].lacks, best->name);
      return best;
    }
  if (why && n) dg_kernels_refusal(env, why, n);
  return best;
}

const dg_kernels *dg_kernels_best(void) { return dg_kernels_pick(getenv("DGEMMA_KERNELS"), NULL, 0); }
