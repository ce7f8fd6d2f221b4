/* ceiling.c: `dgemma bench --protocol ceiling`, the ceiling sweep of the
 * evaluation issue (item 3) on the CPU: how fast this build's matrix kernels
 * read weights when M activation rows share each weight, at the real MoE
 * shapes of DiffusionGemma 26B (hidden 2816, expert intermediate 704, 128
 * experts, top-8 routing):
 *
 *   expert_gate_up  y[M, 1408] = x[M, 2816] W^T, one expert's gate and up rows
 *   expert_down     y[M, 2816] = x[M, 704] W^T, one expert's down projection
 *   moe_gathered    a canvas of T tokens routed top-8 of 128 (uniformly at
 *                   random, fixed seed), gathered by expert and run through
 *                   the grouped kernel as the forward pass does (gate, up,
 *                   down: src/model/forward.c); M = rows per expert hit (16 at T = 256)
 *
 * for bf16 and MLX affine weights (group 64, bf16 scales and biases). The
 * matrices are synthetic (random codes and values: the kernels' speed does
 * not depend on them) and live in a 128-expert stack; successive calls of
 * the one-expert shapes walk through the stack (max(2, 128 / M) experts per
 * timed run) so that the weights come from memory, not from a cache that
 * holds one expert (a bf16 gate/up expert is 7.9 MB, the L3 of the machine
 * this was written on 32 MB).
 *
 * Per row: median of `reps` timed runs after `warmup` (time per call), the
 * min-max spread, GB/s of weights read, GFLOP/s (2 per multiply-add), and
 * the roofline max(weight bytes / copy bandwidth, FLOPs / compute rate), the
 * compute rate being the fastest the CPU has for the format: bf16 weights
 * the larger of the fp32 FMA and the AVX-512 BF16 vdpbf16ps rates, quantized
 * weights the largest of the fp32 FMA, the int8 VNNI vpdpbusd and the AVX2 int8
 * vpmaddubsw rates (the lossy DGEMMA_KERNELS=avx512lp and avx2lp kernels use
 * those; the exact default kernels cannot reach them), with
 * the ceilings (bench.c) measured before and after the sweep in the same
 * command (the best of both: on a shared machine the load moves), and the
 * fraction of it reached (roofline time / measured time). AMX is detected and
 * reported (amx_state) but never in the roofline: no AMX rate is measured. */
#include <cjson/cJSON.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/dg_mem.h"
#include "backend/backend.h"
#include "bench.h"
#include "cuda/backend.h"
#include "cpu/kernels.h"

#define CE_H 2816   /* hidden size */
#define CE_IE 704   /* expert intermediate size */
#define CE_E 128    /* experts */
#define CE_TOPK 8   /* experts per token */
#define CE_G 64     /* group size of the quantized formats */

static double ce_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t ce_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

/* Random bf16 values of magnitude in [2^-7, 2^-6) with random signs (no
 * denormals, infinities or NaNs), 4 per generator draw. */
static void fill_bf16(uint16_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  for (size_t i = 0; i < n; i += 4) {
    uint64_t r = ce_next(&s);
    for (size_t j = 0; j < 4 && i + j < n; j++) p[i + j] = (uint16_t)(((r >> (16 * j)) & 0x807fu) | 0x3c00u);
  }
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { uint64_t r = ce_next(&s); memcpy(p + i, &r, 8); }
  for (; i < n; i++) p[i] = (uint8_t)ce_next(&s);
}

/* A stack of E matrices [rows_per, cols] in `bits` (16 = bf16). */
typedef struct ce_stack {
  dg_weight w;
  void *data, *scales, *biases;
  void *pack; /* w.cpu_pack where ce_pack_mode takes it (cpu/pack.c), else NULL */
} ce_stack;

/* As the CPU backend (backend_cpu.c): with the avx512lp kernels, the quantized stacks that DGEMMA_CPU_PACK's mode
 * takes (dg_cpu_pack_takes: 1 all, "nat" the natural-layout ones, as the 26B's gate/up and not its down; unset none)
 * get a pack that avx512lp's tiles read instead (cpu/pack.c: the same bits); returns the mode, DG_CPU_PACK_NONE for
 * other kernels. Another value of DGEMMA_CPU_PACK is refused before anything is measured (bench_ceiling), as the
 * backend refuses it. */
static int ce_pack_mode(void) {
  const int mode = dg_cpu_pack_wanted(NULL, 0);
  return mode > 0 && mode != DG_CPU_PACK_SEQ1 && !strcmp(dg_kernels_best()->name, "avx512lp") ? mode : DG_CPU_PACK_NONE;
}

static int stack_new(ce_stack *s, int64_t rows, int64_t cols, int bits, uint64_t seed) {
  memset(s, 0, sizeof *s);
  if (bits >= 16) {
    s->data = dg_big_alloc((size_t)(rows * cols) * 2, NULL);
    if (!s->data) return -1;
    fill_bf16(s->data, (size_t)(rows * cols), seed);
    s->w = (dg_weight){.dtype = DG_BF16, .data = s->data, .rows = rows, .cols = cols};
    return 0;
  }
  const size_t ng = (size_t)rows * (size_t)(cols / CE_G);
  s->data = dg_big_alloc((size_t)(rows * cols * bits / 8), NULL); /* base/dg_mem.h: THP with DGEMMA_THP=1 */
  s->scales = dg_big_alloc(ng * 2, NULL);
  s->biases = dg_big_alloc(ng * 2, NULL);
  if (!s->data || !s->scales || !s->biases) return -1;
  fill_bytes(s->data, (size_t)(rows * cols * bits / 8), seed);
  fill_bf16(s->scales, ng, seed + 1);
  fill_bf16(s->biases, ng, seed + 2);
  s->w = (dg_weight){.dtype = DG_U32, .data = s->data, .rows = rows, .cols = cols, .bits = bits,
                     .group_size = CE_G, .sb_dtype = DG_BF16, .scales = s->scales, .biases = s->biases};
  const int pk = dg_cpu_pack_set(&s->w, ce_pack_mode()); /* 1: not taken */
  if (pk < 0) return -1;
  s->pack = pk ? NULL : (void *)s->w.cpu_pack;
  return 0;
}

static void stack_free(ce_stack *s) {
  free(s->pack);
  free(s->data);
  free(s->scales);
  free(s->biases);
  memset(s, 0, sizeof *s);
}

typedef struct ce_row {
  const char *shape;
  int bits, experts, tokens, calls;
  int64_t N, K;
  double M;
  bench_cost cost; /* per call */
  double med, lo, hi;
} ce_row;

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Time per call of `fn` (median, min, max over reps after warm runs); one run = `calls` calls. */
typedef void (*ce_fn)(void *ud, int run, int call);
static void ce_time(ce_fn fn, void *ud, int calls, int warm, int reps, ce_row *r) {
  double t[1000];
  for (int i = 0; i < warm + reps; i++) {
    double t0 = ce_now();
    for (int c = 0; c < calls; c++) fn(ud, i, c);
    if (i >= warm) t[i - warm] = (ce_now() - t0) / calls;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_dbl);
  r->lo = t[0];
  r->hi = t[reps - 1];
  r->med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

typedef struct ce_one {
  const dg_kernels *kn;
  const dg_weight *w;
  float *y;
  const float *x;
  int64_t M, N, K;
  int calls, nt;
} ce_one;

static void one_call(void *ud, int run, int call) {
  ce_one *a = ud;
  const int e = (run * a->calls + call) % CE_E; /* a different expert every call */
  a->kn->matmul(a->y, a->N, a->x, a->K, a->M, a->w, (int64_t)e * a->N, a->N, a->nt);
}

typedef struct ce_moe {
  const dg_kernels *kn;
  const dg_weight *gu, *dn;
  const float *x;
  float *h1, *h2, *out;
  const int32_t *start;
  int nt;
} ce_moe;

static void moe_call(void *ud, int run, int call) {
  ce_moe *a = ud;
  (void)run;
  (void)call;
  /* as src/model/forward.c: gate rows [0, IE) and up rows [IE, 2 IE) of each expert's gate_up, then down */
  a->kn->matmul_grouped(a->h1, CE_IE, a->x, CE_H, a->start, CE_E, a->gu, 2 * CE_IE, 0, CE_IE, a->nt);
  a->kn->matmul_grouped(a->h2, CE_IE, a->x, CE_H, a->start, CE_E, a->gu, 2 * CE_IE, CE_IE, CE_IE, a->nt);
  a->kn->matmul_grouped(a->out, CE_H, a->h1, CE_IE, a->start, CE_E, a->dn, CE_H, 0, CE_H, a->nt);
}

static const char *fmt_name(int bits, char *buf, size_t n) {
  if (bits >= 16) snprintf(buf, n, "bf16");
  else snprintf(buf, n, "%d-bit g%d", bits, CE_G);
  return buf;
}

/* Whether the CPU has AMX (CPUID leaf 7: AMX-TILE, EDX bit 24; AMX-INT8 bit 25;
 * AMX-BF16 bit 22) and whether the OS enabled its tile state (XCR0 bits 17 XTILECFG and
 * 18 XTILEDATA, read by XGETBV when CPUID.1:ECX.OSXSAVE[27] is set; Intel SDM vol. 1,
 * 13.3): "absent", "present (...)", or "present (...) but not enabled by the OS". dgemma
 * has no AMX kernel and no AMX rate loop, so an AMX rate is never measured: when
 * present, the rooflines below exclude it (they use the vector rates) and say so. */
static const char *amx_state(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1u)) {
    static char buf[96];
    const int i8 = d >> 25 & 1u, bf = d >> 22 & 1u;
    int os = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c >> 27 & 1u)) {
      unsigned lo, hi;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0u));
      os = (lo >> 17 & 3u) == 3u;
    }
    snprintf(buf, sizeof buf, "present (AMX-TILE%s%s)%s", i8 ? ", INT8" : "", bf ? ", BF16" : "",
             os ? "" : " but not enabled by the OS (XCR0 tile state off)");
    return buf;
  }
#endif
  return "absent";
}

/* rates: [0] fp32 FMA, [1] bf16 dot product, [2] int8 VNNI dot product, [3] int8 AVX2
 * vpmaddubsw (0 = absent). A quantized row's compute rate is the fastest of FMA and
 * the int8 rates the CPU has (whatever kernel set runs), a bf16 row's of FMA and bf16. */
static void emit(const ce_row *r, const dg_kernels *kn, double bw, const double *rates, double mm, int nt, FILE *out,
                 const char *amx) {
  char f[32];
  int mb;
  const int alt = r->bits >= 16 ? 1 : rates[2] >= rates[3] ? 2 : 3;
  const double fma = rates[0], rate = rates[alt] > fma ? rates[alt] : fma;
  const char *rate_name = rates[alt] > fma ? (alt == 1 ? "bf16 vdpbf16ps" : alt == 2 ? "int8 vpdpbusd" : "int8 vpmaddubsw")
                                           : "fp32 FMA";
  const double roof = bench_floor_s(&r->cost, bw, rate, &mb);
  printf("| %s | %s | %g | %.2f | %.4f | %.3f | %.3f–%.3f | %.1f | %.1f | %.3f | %s | %.0f%% |\n", r->shape,
         fmt_name(r->bits, f, sizeof f), r->M, r->cost.weight_bytes / 1e6, r->cost.flops / 1e9, 1e3 * r->med,
         1e3 * r->lo, 1e3 * r->hi, r->cost.weight_bytes / r->med / 1e9, r->cost.flops / r->med / 1e9, 1e3 * roof,
         mb ? "memory" : "compute", 100 * roof / r->med);
  fflush(stdout);
  if (!out) return;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "protocol", "ceiling");
  cJSON_AddStringToObject(j, "device", "cpu");
  cJSON_AddStringToObject(j, "kernel", kn->name);
  cJSON_AddStringToObject(j, "shape", r->shape);
  cJSON_AddNumberToObject(j, "N", (double)r->N);
  cJSON_AddNumberToObject(j, "K", (double)r->K);
  cJSON_AddNumberToObject(j, "experts", r->experts);
  cJSON_AddNumberToObject(j, "tokens", r->tokens);
  cJSON_AddStringToObject(j, "format", r->bits >= 16 ? "bf16" : fmt_name(r->bits, f, sizeof f));
  cJSON_AddNumberToObject(j, "bits", r->bits);
  cJSON_AddNumberToObject(j, "group_size", r->bits >= 16 ? 0 : CE_G);
  cJSON_AddNumberToObject(j, "M", r->M);
  cJSON_AddNumberToObject(j, "calls_per_run", r->calls);
  cJSON_AddNumberToObject(j, "weight_bytes", r->cost.weight_bytes);
  cJSON_AddNumberToObject(j, "flops", r->cost.flops);
  cJSON_AddNumberToObject(j, "median_s", r->med);
  cJSON_AddNumberToObject(j, "min_s", r->lo);
  cJSON_AddNumberToObject(j, "max_s", r->hi);
  cJSON_AddNumberToObject(j, "gb_s", r->cost.weight_bytes / r->med / 1e9);
  cJSON_AddNumberToObject(j, "gflop_s", r->cost.flops / r->med / 1e9);
  cJSON_AddNumberToObject(j, "roofline_s", roof);
  cJSON_AddNumberToObject(j, "roofline_gb_s", r->cost.weight_bytes / roof / 1e9);
  cJSON_AddStringToObject(j, "bound", mb ? "memory" : "compute");
  cJSON_AddNumberToObject(j, "fraction", roof / r->med);
  cJSON_AddNumberToObject(j, "copy_gb_s", bw / 1e9);
  cJSON_AddNumberToObject(j, "fma_gflop_s", fma / 1e9);
  cJSON_AddNumberToObject(j, "compute_gflop_s", rate / 1e9);
  cJSON_AddStringToObject(j, "compute_rate", rate_name);
  cJSON_AddStringToObject(j, "amx", amx); /* never in the roofline: see amx_state */
  cJSON_AddNumberToObject(j, "matmul_gflop_s", mm / 1e9);
  cJSON_AddNumberToObject(j, "threads", nt);
  char *s = cJSON_PrintUnformatted(j);
  if (s) fprintf(out, "%s\n", s);
  free(s);
  cJSON_Delete(j);
  fflush(out);
}

/* ---- the GPU sweep (--device cuda) ------------------------------------------------ */

typedef struct cu_row {
  const char *shape;
  int bits, experts, tokens;
  double M;
  bench_cost cost;
  dg_cuda_bench_result r;
} cu_row;

static void cu_emit(const cu_row *r, const dg_cuda_ceilings *g, double bw, double rate, int reps, int warm,
                    int64_t flush, FILE *out) {
  char f[32];
  int mb;
  const double roof = bench_floor_s(&r->cost, bw, rate, &mb), med = 1e-3 * r->r.med_ms;
  printf("| %s | %s | %d | %g | %.2f | %.3f | %.4f | %.4f–%.4f | %.1f | %.2f | %.4f | %s | %.1f%% |\n", r->shape,
         fmt_name(r->bits, f, sizeof f), r->tokens, r->M, r->cost.weight_bytes / 1e6, r->cost.flops / 1e9, r->r.med_ms,
         r->r.min_ms, r->r.max_ms, r->cost.weight_bytes / med / 1e9, r->cost.flops / med / 1e12, 1e3 * roof,
         mb ? "memory" : "compute", 100 * roof / med);
  fflush(stdout);
  if (!out) return;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "protocol", "ceiling");
  cJSON_AddStringToObject(j, "device", "cuda");
  cJSON_AddStringToObject(j, "impl", "dgemma");
  cJSON_AddStringToObject(j, "kernel", "dg_cuda_experts");
  cJSON_AddStringToObject(j, "shape", r->shape);
  cJSON_AddNumberToObject(j, "N", CE_IE);
  cJSON_AddNumberToObject(j, "K", CE_H);
  cJSON_AddNumberToObject(j, "experts", r->experts);
  cJSON_AddNumberToObject(j, "tokens", r->tokens);
  cJSON_AddStringToObject(j, "format", r->bits >= 16 ? "bf16" : fmt_name(r->bits, f, sizeof f));
  cJSON_AddNumberToObject(j, "bits", r->bits);
  cJSON_AddNumberToObject(j, "group_size", r->bits >= 16 ? 0 : CE_G);
  cJSON_AddNumberToObject(j, "M", r->M);
  cJSON_AddNumberToObject(j, "calls_per_run", 1);
  cJSON_AddNumberToObject(j, "reps", reps);
  cJSON_AddNumberToObject(j, "warmup", warm);
  cJSON_AddNumberToObject(j, "l2_flush_bytes", (double)flush);
  cJSON_AddNumberToObject(j, "weight_bytes", r->cost.weight_bytes);
  cJSON_AddNumberToObject(j, "device_weight_bytes", (double)r->r.weight_bytes);
  cJSON_AddNumberToObject(j, "flops", r->cost.flops);
  cJSON_AddNumberToObject(j, "median_s", med);
  cJSON_AddNumberToObject(j, "min_s", 1e-3 * r->r.min_ms);
  cJSON_AddNumberToObject(j, "max_s", 1e-3 * r->r.max_ms);
  cJSON_AddNumberToObject(j, "gb_s", r->cost.weight_bytes / med / 1e9);
  cJSON_AddNumberToObject(j, "gflop_s", r->cost.flops / med / 1e9);
  cJSON_AddNumberToObject(j, "tflop_s", r->cost.flops / med / 1e12);
  cJSON_AddNumberToObject(j, "roofline_s", roof);
  cJSON_AddNumberToObject(j, "roofline_gb_s", r->cost.weight_bytes / roof / 1e9);
  cJSON_AddStringToObject(j, "bound", mb ? "memory" : "compute");
  cJSON_AddNumberToObject(j, "fraction", roof / med);
  cJSON_AddNumberToObject(j, "out_sum", r->r.out_sum);
  bench_json_gpu(j, g); /* the ceilings of the command's start; the roofline used the best of start and end: */
  cJSON_AddNumberToObject(j, "roofline_read_gb_s", bw / 1e9);
  cJSON_AddNumberToObject(j, "roofline_bf16_tflop_s", rate / 1e12);
  char *s = cJSON_PrintUnformatted(j);
  if (s) fprintf(out, "%s\n", s);
  free(s);
  cJSON_Delete(j);
  fflush(out);
}

/* One row: route (ids [T, K]), run on the GPU, fill *r. */
static int cu_run(const bench_opts *o, int bits, const int32_t *ids, int32_t T, int reps, int warm, int64_t flush,
                  cu_row *r) {
  dg_cuda_bench_experts_args a = {bits >= 16 ? 0 : bits, CE_G, CE_H, CE_IE, CE_E, CE_TOPK, T, ids, warm, reps, flush,
                                  o->seed + 7};
  const dg_cuda_api *cu = NULL;
  dg_status st = dg_cuda_api_get(&cu);
  if (!st) st = cu->bench_experts(o->cuda_device, &a, &r->r);
  if (st) {
    fprintf(stderr, "dgemma bench: ceiling on cuda:%d (%s, T %d): %s: %s\n", o->cuda_device, r->shape, T,
            dg_status_str(st), dg_last_error());
    return 1;
  }
  return 0;
}

static int bench_ceiling_cuda(const bench_opts *o, const int *Ms, int nM, const int *fm, int nF, const int *Ts, int nT,
                              FILE *out) {
  const int reps = o->reps > 0 ? o->reps : 50, warm = o->warmup >= 0 ? o->warmup : 5;
  const int64_t flush = (int64_t)256 << 20;
  dg_cuda_ceilings g0, g1;
  const dg_cuda_api *cu = NULL;
  dg_status st = dg_cuda_api_get(&cu);
  if (!st) st = cu->ceilings_measure(o->cuda_device, 0, 0, 0, 0, &g0);
  if (st) {
    fprintf(stderr, "dgemma bench: --protocol ceiling --device cuda: GPU ceilings on cuda:%d: %s: %s\n",
            o->cuda_device, dg_status_str(st), dg_last_error());
    return 1;
  }
  int Mmax = 0, Tmax = 0;
  for (int i = 0; i < nM; i++) Mmax = Ms[i] > Mmax ? Ms[i] : Mmax;
  for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
  const int64_t tmax = (int64_t)CE_E * Mmax / CE_TOPK > Tmax ? (int64_t)CE_E * Mmax / CE_TOPK : Tmax;
  int32_t *ids = malloc((size_t)tmax * CE_TOPK * sizeof *ids), *start = malloc((CE_E + 1) * sizeof *start);
  const size_t cap = (size_t)nF * (size_t)(nM + nT);
  cu_row *rs = calloc(cap, sizeof *rs);
  size_t nr = 0;
  int rc = 0;
  if (!ids || !start || !rs) { fprintf(stderr, "dgemma bench: out of memory\n"); rc = 1; }
  for (int f = 0; !rc && f < nF; f++) {
    for (int i = 0; !rc && i < nM; i++) { /* all 128 experts, exactly M rows each */
      cu_row *r = &rs[nr];
      const int32_t T = bench_route_even(Ms[i], CE_E, CE_TOPK, ids);
      *r = (cu_row){"experts_all", fm[f], CE_E, T, Ms[i], bench_experts_cost(fm[f], CE_G, CE_H, CE_IE, CE_E,
                                                                                (int64_t)T * CE_TOPK), {0, 0, 0, 0, 0, 0}};
      if (T <= 0) { fprintf(stderr, "dgemma bench: --rows %d: no even routing\n", Ms[i]); rc = 1; break; }
      rc = cu_run(o, fm[f], ids, T, reps, warm, flush, r);
      nr += !rc;
      if (o->tty) fprintf(stderr, "\rceiling (cuda): %zu/%zu rows", nr, cap);
    }
    for (int i = 0; !rc && i < nT; i++) { /* a canvas of T tokens routed top-8 of 128 at random */
      if (Ts[i] <= 0) continue;
      cu_row *r = &rs[nr];
      const int hit = bench_route(Ts[i], CE_E, CE_TOPK, 42, start, NULL);
      if (hit <= 0 || bench_route_ids(Ts[i], CE_E, CE_TOPK, 42, ids)) {
        fprintf(stderr, "dgemma bench: out of memory routing %d tokens\n", Ts[i]);
        rc = 1;
        break;
      }
      const int64_t R = (int64_t)Ts[i] * CE_TOPK;
      *r = (cu_row){"moe_gathered", fm[f], hit, Ts[i], (double)R / hit,
                    bench_experts_cost(fm[f], CE_G, CE_H, CE_IE, hit, R), {0, 0, 0, 0, 0, 0}};
      rc = cu_run(o, fm[f], ids, Ts[i], reps, warm, flush, r);
      nr += !rc;
      if (o->tty) fprintf(stderr, "\rceiling (cuda): %zu/%zu rows", nr, cap);
    }
  }
  if (o->tty) fprintf(stderr, "\r%40s\r", "");
  if (!rc && (st = cu->ceilings_measure(o->cuda_device, 0, 0, 0, 0, &g1))) {
    fprintf(stderr, "dgemma bench: GPU ceilings after the sweep: %s: %s\n", dg_status_str(st), dg_last_error());
    rc = 1;
  }
  if (!rc) {
    double bw, rate;
    bench_print_gpu(&g0, "before the sweep");
    bench_print_gpu(&g1, "after the sweep");
    bench_gpu_rates(&g0, &g1, &bw, &rate);
    printf("ceiling sweep on the GPU: dg_cuda_experts (gate/up + GeGLU + down, the backend's expert path), MoE shapes "
           "of the 26B model (hidden %d, expert intermediate %d, %d experts, top-%d), MLX affine g%d with bf16 scales "
           "and biases; per call: median of %d after %d warm-up, each timed alone (cudaEvents) after %lld MiB written "
           "to flush the L2; roofline = max(weight bytes / read %.1f GB/s, FLOPs / bf16 %.1f TFLOP/s) (the best of "
           "before and after)\n\n",
           CE_H, CE_IE, CE_E, CE_TOPK, CE_G, reps, warm, (long long)(flush >> 20), bw / 1e9, rate / 1e12);
    printf("| shape | format | tokens | M | weight MB | GFLOP | median ms | spread ms | GB/s | TFLOP/s | roofline ms | "
           "bound | of roofline |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < nr; i++) cu_emit(&rs[i], &g0, bw, rate, reps, warm, flush, out);
    printf("\nexperts_all: all %d experts in one grouped call, exactly M rows each (T = %d M / %d tokens); "
           "moe_gathered: T tokens routed top-%d of %d uniformly at random (seed 42), M = rows per expert hit; weight "
           "MB = the experts' weights read once (hit experts only); GB/s = weight bytes / median; of roofline = "
           "roofline / median. The routing is grouped on the device once (k_group), outside the timing.\n",
           CE_E, CE_E, CE_TOPK, CE_TOPK, CE_E);
  }
  free(ids);
  free(start);
  free(rs);
  return rc;
}

int bench_ceiling(const bench_opts *o, int nt, FILE *out) {
  char err[256];
  int Ms[BENCH_MAX_LIST], fm[BENCH_MAX_LIST], Ts[BENCH_MAX_LIST];
  const char *rows = o->rows ? o->rows : o->quick ? "1,16,256" : "1,2,4,8,16,32,64,128,256";
  const char *fmts = o->formats ? o->formats : o->quick ? "bf16,4" : "bf16,8,4,3,2";
  const char *toks = o->moe_tokens ? o->moe_tokens : o->device == DG_DEVICE_CUDA && !o->quick ? "256,512,1024" : "256";
  int nM = bench_parse_list(rows, "--rows", 1, 4096, Ms, BENCH_MAX_LIST, err, sizeof err), nF = -1, nT = -1;
  if (nM > 0) nF = bench_parse_formats(fmts, fm, BENCH_MAX_LIST, err, sizeof err);
  if (nF > 0) nT = bench_parse_list(toks, "--moe-tokens", 0, 4096, Ts, BENCH_MAX_LIST, err, sizeof err);
  if (nM < 0 || nF < 0 || nT < 0) { fprintf(stderr, "dgemma bench: %s\n", err); return 2; }
  if (o->device == DG_DEVICE_CUDA) return bench_ceiling_cuda(o, Ms, nM, fm, nF, Ts, nT, out);
  if (dg_cpu_pack_wanted(err, sizeof err) < 0) { fprintf(stderr, "dgemma bench: %s\n", err); return 2; }
  const int reps = o->reps > 0 ? o->reps : 3, warm = o->warmup >= 0 ? o->warmup : 1;
  const dg_kernels *kn = dg_kernels_best();
  const char *isa = "", *kname = "";
  double bw = bench_copy_bandwidth((size_t)256 << 20, nt, 5), rate = bench_fma_rate(nt, 5, &isa);
  double rbf = bench_dp_rate(nt, 2, 1), ri8 = bench_dp_rate(nt, 2, 2), rub = bench_dp_rate(nt, 2, 3);
  const double mm = bench_matmul_rate(nt, &kname);
  if (!(bw > 0) || !(rate > 0)) { fprintf(stderr, "dgemma bench: could not measure the ceilings\n"); return 1; }
  int Mmax = 0, Tmax = 0;
  for (int i = 0; i < nM; i++) Mmax = Ms[i] > Mmax ? Ms[i] : Mmax;
  for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
  const size_t xrows = (size_t)(Mmax > Tmax * CE_TOPK ? Mmax : Tmax * CE_TOPK);
  float *x = malloc(xrows * CE_H * sizeof(float)), *y = malloc(xrows * CE_H * sizeof(float));
  float *h1 = malloc(xrows * CE_IE * sizeof(float)), *h2 = malloc(xrows * CE_IE * sizeof(float));
  int32_t *start = malloc((CE_E + 1) * sizeof(int32_t));
  const size_t cap_rows = (size_t)nF * (size_t)(2 * nM + nT);
  ce_row *rs = calloc(cap_rows, sizeof *rs);
  size_t nr = 0;
  int rc = 0;
  if (!x || !y || !h1 || !h2 || !start || !rs) { fprintf(stderr, "dgemma bench: out of memory\n"); rc = 1; }
  uint64_t s = 12345;
  for (size_t i = 0; !rc && i < xrows * CE_H; i++) x[i] = (float)((double)(ce_next(&s) >> 11) * 0x1p-53 * 2.0 - 1.0);
  for (size_t i = 0; !rc && i < xrows * CE_IE; i++) h1[i] = x[i]; /* the down projection's input */
  for (int f = 0; !rc && f < nF; f++) {
    ce_stack gu, dn;
    if (stack_new(&gu, (int64_t)CE_E * 2 * CE_IE, CE_H, fm[f], 1000 + 10 * (uint64_t)f) ||
        stack_new(&dn, (int64_t)CE_E * CE_H, CE_IE, fm[f], 2000 + 10 * (uint64_t)f)) {
      fprintf(stderr, "dgemma bench: out of memory for the %d-expert weight stacks\n", CE_E);
      stack_free(&gu);
      stack_free(&dn);
      rc = 1;
      break;
    }
    for (int sh = 0; sh < 2; sh++)
      for (int i = 0; i < nM; i++) {
        const int64_t N = sh == 0 ? 2 * CE_IE : CE_H, K = sh == 0 ? CE_H : CE_IE;
        ce_row r = {sh == 0 ? "expert_gate_up" : "expert_down", fm[f], 1, 0, 0, N, K, Ms[i], {0, 0, 0, 0, 0}, 0, 0, 0};
        r.calls = Ms[i] >= 64 ? 2 : CE_E / Ms[i] > 2 ? CE_E / Ms[i] : 2;
        r.cost = bench_matmul_cost(N, K, fm[f], CE_G, Ms[i]);
        ce_one a = {kn, sh == 0 ? &gu.w : &dn.w, y, sh == 0 ? x : h1, Ms[i], N, K, r.calls, nt};
        ce_time(one_call, &a, r.calls, warm, reps, &r);
        rs[nr++] = r;
        if (o->tty) fprintf(stderr, "\rceiling: %zu/%zu rows", nr, cap_rows);
      }
    for (int i = 0; i < nT; i++) {
      if (Ts[i] <= 0) continue;
      const int hit = bench_route(Ts[i], CE_E, CE_TOPK, 42, start, NULL);
      if (hit <= 0) { fprintf(stderr, "dgemma bench: out of memory routing %d tokens\n", Ts[i]); rc = 1; break; }
      const int64_t R = (int64_t)Ts[i] * CE_TOPK;
      ce_row r = {"moe_gathered", fm[f], hit, Ts[i], 1, CE_IE, CE_H, (double)R / hit, {0, 0, 0, 0, 0}, 0, 0, 0};
      bench_cost a1 = bench_matmul_cost(2 * CE_IE, CE_H, fm[f], CE_G, 0), a2 = bench_matmul_cost(CE_H, CE_IE, fm[f], CE_G, 0);
      r.cost.weight_bytes = hit * (a1.weight_bytes + a2.weight_bytes);
      r.cost.flops = 2.0 * (double)R * (2.0 * CE_IE * CE_H + (double)CE_H * CE_IE);
      ce_moe a = {kn, &gu.w, &dn.w, x, h1, h2, y, start, nt};
      ce_time(moe_call, &a, 1, warm, reps, &r);
      rs[nr++] = r;
      if (o->tty) fprintf(stderr, "\rceiling: %zu/%zu rows", nr, cap_rows);
    }
    stack_free(&gu);
    stack_free(&dn);
  }
  if (o->tty) fprintf(stderr, "\r%40s\r", "");
  if (!rc) { /* the ceilings again: on a shared machine the load moves; the best of both is the ceiling */
    const double bw2 = bench_copy_bandwidth((size_t)256 << 20, nt, 5), rate2 = bench_fma_rate(nt, 5, &isa);
    const double rbf2 = bench_dp_rate(nt, 2, 1), ri82 = bench_dp_rate(nt, 2, 2), rub2 = bench_dp_rate(nt, 2, 3);
    printf("ceilings (%d threads, measured before and after the sweep, the best of both): copy %.1f / %.1f GB/s "
           "(bytes read + written, memcpy 256 MiB, best of 5); %s %.1f / %.1f GFLOP/s (best of 5); AVX-512 BF16 "
           "vdpbf16ps %.1f / %.1f GFLOP/s, VNNI vpdpbusd %.1f / %.1f int8 GOP/s, AVX2 vpmaddubsw %.1f / %.1f int8 "
           "GOP/s (best of 2; 0 = not on this CPU); this build's %s matmul 64x2048x2048 f32: %.1f GFLOP/s\n",
           nt, bw / 1e9, bw2 / 1e9, isa, rate / 1e9, rate2 / 1e9, rbf / 1e9, rbf2 / 1e9, ri8 / 1e9, ri82 / 1e9,
           rub / 1e9, rub2 / 1e9, kname, mm / 1e9);
    bw = fmax(bw, bw2);
    rate = fmax(rate, rate2);
    rbf = fmax(rbf, rbf2);
    ri8 = fmax(ri8, ri82);
    rub = fmax(rub, rub2);
    const char *amx = amx_state();
    if (!strcmp(amx, "absent"))
      printf("AMX: absent on this CPU (CPUID leaf 7): the rates above are its fastest\n");
    else
      printf("AMX: %s, but the rooflines below exclude it: dgemma has no AMX kernel and no loop that measures an AMX "
             "rate, so no measured rate exists to put in them (they understate this CPU's bf16/int8 ceiling)\n",
             amx);
    printf("ceiling sweep: %s kernels, MoE shapes of the 26B model (hidden %d, expert intermediate %d, %d experts, "
           "top-%d); per-call median of %d runs after %d warm-up; roofline = max(weight bytes / copy, FLOPs / the "
           "fastest compute rate for the format: bf16 max(FMA, vdpbf16ps), quantized max(FMA, vpdpbusd, vpmaddubsw))\n\n",
           kn->name, CE_H, CE_IE, CE_E, CE_TOPK, reps, warm);
    const int pm = ce_pack_mode();
    if (pm != DG_CPU_PACK_NONE)
      printf("avx512lp pack (DGEMMA_CPU_PACK %s): %s are also held in the pack (cpu/pack.c%s) that every avx512lp "
             "tile reads instead of the MLX layout; same bits\n\n",
             pm == DG_CPU_PACK_ALL ? "1" : pm == DG_CPU_PACK_NAT ? "nat" : "il",
             pm == DG_CPU_PACK_ALL ? "the quantized stacks"
                                   : "the quantized stacks dg_cpu_pack_nat takes (here gate/up, not down)",
             pm == DG_CPU_PACK_IL ? ", interleaved by " DG_CPU_IL_ROWS_STR " rows" : "");
    printf("| shape | format | M | weight MB | GFLOP | median ms | spread ms | GB/s | GFLOP/s | roofline ms | bound | "
           "of roofline |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const double rates[4] = {rate, rbf, ri8, rub};
    for (size_t i = 0; i < nr; i++) emit(&rs[i], kn, bw, rates, mm, nt, out, amx);
    printf("\nM = activation rows sharing each weight (moe_gathered: rows per expert hit, T tokens x top-%d / experts "
           "hit); weight MB and GFLOP per call; GB/s = weight bytes / median; of roofline = roofline / median. One-expert "
           "shapes walk through a %d-expert stack (max(2, %d / M) experts per run) so that weights come from memory.\n",
           CE_TOPK, CE_E, CE_E);
  }
  free(x); free(y); free(h1); free(h2); free(start); free(rs);
  return rc;
}
