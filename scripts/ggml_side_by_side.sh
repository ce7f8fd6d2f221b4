#!/usr/bin/env bash
# ggml_side_by_side.sh: ggml's CPU matrix products beside dgemma's, at the MoE
# shapes of DiffusionGemma 26B, in one command (issue 17, item 4).
#
#   scripts/ggml_side_by_side.sh [OUT_DIR]
#
# What it does, all in the git-ignored folder .ggml/ (nothing of ggml is ever
# committed or linked into dgemma):
#  1. unpacks ggml's public source from a git snapshot (GGML_GIT, default the
#     bare mirror /work/.mirror/ggml-org+ggml/repo that the session's `fetch`
#     of github:ggml-org/ggml writes; GGML_REV, default HEAD) into .ggml/src;
#  2. builds its CPU backend only (cmake, -DGGML_NATIVE=ON, Release, static,
#     no tests or examples) into .ggml/build;
#  3. writes .ggml/mm_bench.c, a small harness against ggml's public API
#     (ggml.h, ggml-backend.h, ggml-alloc.h, ggml-cpu.h): test-backend-ops'
#     perf mode has its own fixed shapes, so the harness times ggml_mul_mat at
#     ours: y[M, N] = x[M, K] W^T with W [1408, 2816] (one expert's gate/up)
#     and [2816, 704] (down), for M = ROWS (default 1,8,16,64,256) activation
#     rows, the weights in GGML_TYPES (default q4_K,q4_0; quantized with
#     ggml_quantize_chunk from random values; a type whose block does not
#     divide K is skipped: q4_K's 256 at the down product's K = 704), on two
#     paths with the same quantized bytes:
#       llama   as llama.cpp runs it on this CPU: the weights in the first of
#               the CPU device's extra buffer types (the registry's
#               ggml_backend_dev_get_extra_bufts: AMX where ggml was built
#               with it, then CPU_REPACK, whose set_tensor interleaves q4_K /
#               q4_0 into q4_K_8x8 / q4_0_8x8 for its AVX2/AVX-512 kernels)
#               whose supports_op takes the product, else the CPU buffer
#               type; computed by the CPU backend (ggml_backend_cpu_set_n_threads)
#               with one persistent ggml_threadpool;
#       generic the weights in a plain ggml context, ggml_graph_compute with
#               a thread pool per call (session 12's harness, its q4_K column
#               kept as "q4_K generic");
#     it prints the buffer type each path got and whether the weights carry
#     its traits (the repacked kernel runs; ggml's own "repack tensor ... with
#     q4_K_8x8" lines are counted into ggml_repack.txt), and checks both
#     products of expert 0 (8 rows) against the double product of ggml's
#     dequantized weights within a bound derived from the int8 rounding of
#     the activations (exit 3 if either is off: a broken harness reports no
#     number). Like `dgemma bench --protocol ceiling`, successive calls walk
#     through a stack of GGML_EXPERTS (default 128, the ceiling bench's CE_E)
#     distinct experts, so that both programs walk the same bytes from memory
#     (until session 30 the stack was 64 experts: 143 MB of gate/up and 71 MB
#     of down, which the ~100 MB of L3 a core pair of the session-30 Intel
#     Xeon VM reaches held in part or whole, against dgemma's 285 / 143 MB:
#     ggml's q4_0 down read from the L3 there, 26.8 against 49.0 us a call
#     at 128 experts; docs/measurements.md), max(2, 128 / M) calls per run (2 from M = 64), the
#     median of REPS (default 5) runs after one warm-up, per call; ggml's
#     time includes quantizing the activations to its dot type (q8_K /
#     q8_0), as dgemma's avx512lp/avx2lp time includes its int8 quantization;
#  4. runs `dgemma bench --protocol ceiling --formats 4 --rows ROWS
#     --moe-tokens MOE_TOKENS -t THREADS` once per DGEMMA_KERNELS=k for k in
#     KERNELS (comma-separated; default by the CPU's flags: avx512,avx512lp
#     (exact, bf16/VNNI) with AVX-512 F/BW/VL/DQ + BF16 + VNNI; avx512,avx2lp
#     with AVX-512 F/BW/VL/DQ alone; avx2,avx2lp (exact, int8 vpmaddubsw)
#     otherwise), DGEMMA (default build-cpu/dgemma, a CPU-only build, which this
#     script makes with `make BUILD=build-cpu CUDA=0 build-cpu/dgemma` when absent);
#  5. prints one table: per shape and M, GB/s of weights read and GFLOP/s of
#     each, the fastest q4_K path's time / dgemma's per kernel set, last set
#     first, and the last set vs the fastest 4.5-bit ggml path (q4_K or q4_0,
#     either path: q4_K, q4_0 and dgemma's 4-bit g64 with bf16 scales and
#     biases are all 4.5 bits per weight: the same bytes).
#  6. the gathered MoE of a MOE_TOKENS-token canvas (default 256; 4-bit g64, every
#     kernel set; dgemma only: ggml's MUL_MAT_ID is not timed here), per call.
#  7. GGML_BUILDS (default native): which builds of ggml run, space-separated, each
#     into its own folder and harness, all in the same command:
#       native  gcc, -DGGML_NATIVE=ON (.ggml/build, .ggml/mm_bench; the tables' plain
#               column names). With gcc 12 on an AMX CPU this build's AMX path
#               crashes at M >= 2: gcc 12's _tile_loadconfig declares an 8-byte
#               memory operand, so gcc drops the stores of ggml's stack tile
#               config (ggml_tile_config_init) and ldtilecfg faults (#GP, SIGSEGV)
#               on the zeroed / stale rows and columns (session 31;
#               docs/measurements.md);
#       clang   clang / clang++, -DGGML_NATIVE=ON, the same source, plus -D__AMX_INT8__
#               (.ggml/build-clang, .ggml/mm_bench-clang; columns TYPE@clang): clang's
#               ldtilecfg builtin reads the whole 64-byte config, so ggml's AMX path
#               runs at every M; the define because clang 14 names the feature
#               __AMXINT8__ where ggml tests gcc's __AMX_INT8__ (without it ggml
#               compiles its AMX code out and the llama path is CPU_REPACK);
#       noamx   gcc, ggml's own ISA options instead of -march=native:
#               -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
#               -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
#               (AVX, AVX2, FMA, F16C, BMI2 on by default; GGML_AMX_* off):
#               no AMX buffer type, so llama.cpp's path is CPU_REPACK (q4_K_8x8,
#               q4_0_8x8) (.ggml/build-noamx; columns TYPE@noamx).
#     A harness that exits non-zero (a crash) is logged in ggml_<policy>.err and
#     its cells print '-'; the other builds still run.
# THREADS (default 2) threads for both. Both run under each OpenMP wait policy
# in WAIT_POLICIES (default passive,active) and each cell takes the faster:
# spinning threads win small products on an idle machine (ggml q4_K at M = 1:
# 0.085 ms active vs 0.188 passive, session 15) and lose badly on a shared one
# (20 ms per call instead of 0.5 ms on the loaded 2-core AVX2 EPYC). Raw outputs go to
# OUT_DIR (default .ggml/out). Needs cmake, a C/C++ compiler with OpenMP, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GG=$ROOT/.ggml
OUT=${1:-$GG/out}
GGML_GIT=${GGML_GIT:-/work/.mirror/ggml-org+ggml/repo}
GGML_REV=${GGML_REV:-HEAD}
ROWS=${ROWS:-1,8,16,64,256}
GGML_TYPES=${GGML_TYPES:-q4_K,q4_0}
WAIT_POLICIES=${WAIT_POLICIES:-passive,active}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
GGML_EXPERTS=${GGML_EXPERTS:-128}
DGEMMA=${DGEMMA:-$ROOT/build-cpu/dgemma}
MOE_TOKENS=${MOE_TOKENS:-256}
GGML_BUILDS=${GGML_BUILDS:-native}
if [ -z "${KERNELS:-}" ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
  if has avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512_vnni; then KERNELS=avx512,avx512lp
  elif has avx512f avx512bw avx512vl avx512dq; then KERNELS=avx512,avx2lp
  else KERNELS=avx2,avx2lp; fi
fi
mkdir -p "$GG" "$OUT"
if [ ! -x "$DGEMMA" ] && [ "$DGEMMA" = "$ROOT/build-cpu/dgemma" ]; then
  echo "# building $DGEMMA (CPU-only)" >&2
  nice make -j"$(nproc)" BUILD=build-cpu CUDA=0 build-cpu/dgemma >"$OUT/dgemma_build.log" 2>&1 ||
    { echo "ggml_side_by_side.sh: building $DGEMMA failed; see $OUT/dgemma_build.log" >&2; exit 1; }
fi
[ -x "$DGEMMA" ] || { echo "ggml_side_by_side.sh: DGEMMA=$DGEMMA is not an executable" >&2; exit 2; }

rev=$(git --git-dir="$GGML_GIT" rev-parse "$GGML_REV")
if [ "$(cat "$GG/src.rev" 2>/dev/null)" != "$rev" ]; then
  rm -rf "$GG/src" "$GG"/build "$GG"/build-*
  mkdir -p "$GG/src"
  git --git-dir="$GGML_GIT" archive "$rev" | tar -x -C "$GG/src"
  echo "$rev" >"$GG/src.rev"
fi
# gbuild LABEL: the build folder and harness of one ggml build (see GGML_BUILDS above)
gdir() { [ "$1" = native ] && echo "$GG/build" || echo "$GG/build-$1"; }
gbin() { [ "$1" = native ] && echo "$GG/mm_bench" || echo "$GG/mm_bench-$1"; }
gcxx() { [ "$1" = clang ] && echo clang++ || echo g++; }
for gb in $GGML_BUILDS; do
  bd=$(gdir "$gb")
  case $gb in
    native) extra=(-DGGML_NATIVE=ON);;
    clang) extra=(-DGGML_NATIVE=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
                  -DCMAKE_C_FLAGS=-D__AMX_INT8__ -DCMAKE_CXX_FLAGS=-D__AMX_INT8__);;
    noamx) extra=(-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
                  -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF);;
    *) echo "ggml_side_by_side.sh: unknown GGML_BUILDS entry '$gb' (native, clang, noamx)" >&2; exit 2;;
  esac
  if [ ! -f "$bd/.built" ]; then
    cmake -S "$GG/src" -B "$bd" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" -DBUILD_SHARED_LIBS=OFF \
      -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
      -DGGML_OPENMP=ON >"$OUT/ggml_cmake_$gb.log"
    nice cmake --build "$bd" -j"$(nproc)" --target ggml ggml-base ggml-cpu >"$OUT/ggml_build_$gb.log"
    touch "$bd/.built"
  fi
done

cat >"$GG/mm_bench.c" <<'HARNESS'
/* mm_bench.c (written by scripts/ggml_side_by_side.sh into .ggml/, never committed):
 * ggml_mul_mat timed at given shapes on two paths, and checked.
 * Usage: mm_bench TYPE THREADS REPS M,M,... N:K ...
 *  generic: the weights in a plain ggml context, ggml_graph_compute with a thread pool per call
 *           (the harness of session 12);
 *  llama:   as llama.cpp runs it on this CPU: the weights in the first of the CPU device's extra
 *           buffer types (ggml_backend_dev_get_extra_bufts: AMX, then CPU_REPACK) whose
 *           supports_op takes the product, else the plain CPU buffer type; computed by the CPU
 *           backend (ggml_backend_cpu_set_n_threads) with a persistent ggml_threadpool.
 * Lines: "path TYPE N K buft extra" (extra: the weight tensor carries the buffer type's
 * traits, i.e. its repacked kernel runs); "ggml TYPE PATH N K M calls median_s min_s max_s
 * weight_bytes flops"; "check TYPE N K M generic_ratio llama_ratio diff_rel": the largest
 * |y - y_ref| / bound of each path over the first 8 rows x all N outputs of expert 0 against
 * y_ref = the double product of ggml's own dequantized weights (to_float) and x, bound =
 * sum over the dot type's blocks of amax_b(x) (1/254 + 2^-10) sum_b |w| (the activations'
 * rounding to int8: half a step of amax/127, plus q8_0's fp16 scale) + (K/32 + 8) 2^-23
 * sum |x w| (fp32 sums); diff_rel = max |y_generic - y_llama| / sum |x w|. A ratio > 1
 * exits 3: a broken harness cannot report a number. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#ifndef NE
#define NE 128 /* the experts walked: -DNE=GGML_EXPERTS (scripts/ggml_side_by_side.sh) */
#endif
#define NCHECK 8
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void stats(double *t, int reps, double *med) {
  qsort(t, reps, sizeof t[0], cmp);
  *med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}
/* llama.cpp's choice of weight buffer type: the first extra buffer type whose device takes
 * the product with the weight in it (a zero-size buffer of that type stands in), else CPU. */
static ggml_backend_buffer_type_t pick_buft(ggml_backend_dev_t dev, enum ggml_type ty, int64_t K, int64_t N) {
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
  ggml_backend_dev_get_extra_bufts_t get =
      (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
  if (get) {
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++) {
      struct ggml_context *c = ggml_init((struct ggml_init_params){16 * ggml_tensor_overhead(), NULL, true});
      struct ggml_tensor *w = ggml_new_tensor_2d(c, ty, K, N), *x = ggml_new_tensor_2d(c, GGML_TYPE_F32, K, 8);
      struct ggml_tensor *op = ggml_mul_mat(c, w, x);
      ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(*b, 0);
      w->buffer = buf;
      const int ok = buf && ggml_backend_dev_supports_op(dev, op);
      if (buf) ggml_backend_buffer_free(buf);
      ggml_free(c);
      if (ok) return *b;
    }
  }
  return ggml_backend_dev_buffer_type(dev);
}
int main(int argc, char **argv) {
  if (argc < 6) { fprintf(stderr, "usage: %s TYPE THREADS REPS M,M,.. N:K ...\n", argv[0]); return 2; }
  enum ggml_type ty = GGML_TYPE_COUNT;
  for (int t = 0; t < GGML_TYPE_COUNT; t++) {
    const char *n = ggml_type_name((enum ggml_type)t);
    if (n && !strcmp(n, argv[1])) ty = (enum ggml_type)t;
  }
  if (ty == GGML_TYPE_COUNT) { fprintf(stderr, "unknown type %s\n", argv[1]); return 2; }
  const int nt = atoi(argv[2]), reps = atoi(argv[3]);
  if (nt < 1 || reps < 1 || reps > 64) { fprintf(stderr, "bad THREADS or REPS (1..64)\n"); return 2; }
  int Ms[32], nM = 0;
  for (char *s = strtok(argv[4], ","); s && nM < 32; s = strtok(NULL, ",")) Ms[nM++] = atoi(s);
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  ggml_backend_t be = ggml_backend_cpu_init();
  struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nt);
  struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
  if (!dev || !be || !tp) { fprintf(stderr, "ggml CPU backend or thread pool failed\n"); return 1; }
  ggml_backend_cpu_set_n_threads(be, nt);
  ggml_backend_cpu_set_threadpool(be, tp);
  /* the dot type's block (q8_K 256, q8_0 32): the activations' rounding unit of the bound */
  const int64_t qb = ggml_blck_size(ty) >= 256 ? 256 : 32;
  srand(1);
  for (int a = 5; a < argc; a++) {
    int64_t N, K;
    if (sscanf(argv[a], "%ld:%ld", &N, &K) != 2) return 2;
    if (K % ggml_blck_size(ty)) { /* e.g. q4_K (256 per block) at K = 704: ggml's rows would not hold whole blocks */
      printf("ggml %s - %ld %ld skip: K is not a multiple of the %ld-weight block\n", argv[1], N, K, (long)ggml_blck_size(ty));
      continue;
    }
    int Mmax = 0;
    for (int i = 0; i < nM; i++) Mmax = Ms[i] > Mmax ? Ms[i] : Mmax;
    const size_t wb = ggml_row_size(ty, K) * N;
    /* the weights once, quantized by ggml from random values; both paths get the same bytes */
    void **qw = malloc(NE * sizeof *qw);
    float *tmp = malloc((size_t)N * K * sizeof(float));
    for (int e = 0; e < NE; e++) {
      qw[e] = malloc(wb);
      if (e >= 8) { memcpy(qw[e], qw[e % 8], wb); continue; } /* 8 distinct experts' bytes, each at its own address:
                                                                  the same traffic, a 16th of the quantizing time */
      for (int64_t i = 0; i < N * K; i++) tmp[i] = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.05f;
      ggml_quantize_chunk(ty, tmp, qw[e], 0, N, K, NULL);
    }
    ggml_get_type_traits(ty)->to_float(qw[0], tmp, N * K); /* expert 0 dequantized: the check's weights */
    /* generic: a plain context holding the weights */
    struct ggml_context *gw = ggml_init((struct ggml_init_params){NE * (wb + 1024) + (1u << 20), NULL, false});
    struct ggml_tensor *Wg[NE];
    for (int e = 0; e < NE; e++) { Wg[e] = ggml_new_tensor_2d(gw, ty, K, N); memcpy(Wg[e]->data, qw[e], wb); }
    /* llama: the weights in the chosen buffer type (its set_tensor repacks them) */
    ggml_backend_buffer_type_t buft = pick_buft(dev, ty, K, N);
    struct ggml_context *lw = ggml_init((struct ggml_init_params){(NE + 4) * ggml_tensor_overhead(), NULL, true});
    struct ggml_tensor *Wl[NE];
    for (int e = 0; e < NE; e++) Wl[e] = ggml_new_tensor_2d(lw, ty, K, N);
    ggml_backend_buffer_t lbuf = ggml_backend_alloc_ctx_tensors_from_buft(lw, buft);
    if (!lbuf) { fprintf(stderr, "weight buffer failed\n"); return 1; }
    ggml_backend_buffer_set_usage(lbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int e = 0; e < NE; e++) ggml_backend_tensor_set(Wl[e], qw[e], 0, wb);
    printf("path %s %ld %ld %s %s\n", argv[1], N, K, ggml_backend_buft_name(buft), Wl[0]->extra ? "extra" : "plain");
    for (int im = 0; im < nM; im++) {
      const int M = Ms[im];
      const int calls = M >= 64 ? 2 : 128 / M > 2 ? 128 / M : 2;
      float *xh = malloc((size_t)K * M * sizeof(float));
      for (int64_t i = 0; i < K * M; i++) xh[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
      const size_t gmem = (size_t)K * M * 4 + (size_t)NE * ((size_t)M * N * 4 + 4096) + NE * ggml_graph_overhead_custom(4, false) + (1u << 20);
      struct ggml_context *gc = ggml_init((struct ggml_init_params){gmem, NULL, false});
      struct ggml_context *lc = ggml_init((struct ggml_init_params){(NE + 4) * (ggml_tensor_overhead() + ggml_graph_overhead_custom(4, false)), NULL, true});
      struct ggml_tensor *xg = ggml_new_tensor_2d(gc, GGML_TYPE_F32, K, M), *xl = ggml_new_tensor_2d(lc, GGML_TYPE_F32, K, M);
      memcpy(xg->data, xh, (size_t)K * M * 4);
      struct ggml_cgraph *gg[NE], *gl[NE];
      struct ggml_tensor *yg0 = NULL, *yl0 = NULL;
      size_t ws = 0;
      for (int e = 0; e < NE; e++) {
        struct ggml_tensor *yg = ggml_mul_mat(gc, Wg[e], xg), *yl = ggml_mul_mat(lc, Wl[e], xl);
        if (!e) { yg0 = yg; yl0 = yl; }
        gg[e] = ggml_new_graph_custom(gc, 4, false);
        ggml_build_forward_expand(gg[e], yg);
        gl[e] = ggml_new_graph_custom(lc, 4, false);
        ggml_build_forward_expand(gl[e], yl);
        struct ggml_cplan p = ggml_graph_plan(gg[e], nt, NULL);
        ws = p.work_size > ws ? p.work_size : ws;
      }
      ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors(lc, be); /* x and the outputs, CPU buffer */
      if (!xbuf) { fprintf(stderr, "activation buffer failed\n"); return 1; }
      ggml_backend_tensor_set(xl, xh, 0, (size_t)K * M * 4);
      void *work = malloc(ws + 64);
      for (int path = 0; path < 2; path++) {
        double t[65], med;
        for (int r = 0; r < reps + 1; r++) {
          double t0 = now();
          for (int c = 0; c < calls; c++) {
            const int e = (r * calls + c) % NE;
            enum ggml_status st;
            if (path == 0) {
              struct ggml_cplan p = ggml_graph_plan(gg[e], nt, NULL);
              p.work_data = work;
              st = ggml_graph_compute(gg[e], &p);
            } else st = ggml_backend_graph_compute(be, gl[e]);
            if (st != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 1; }
          }
          if (r > 0) t[r - 1] = (now() - t0) / calls;
        }
        stats(t, reps, &med);
        printf("ggml %s %s %ld %ld %d %d %.9g %.9g %.9g %zu %.9g\n", argv[1], path ? "llama" : "generic", N, K, M, calls,
               med, t[0], t[reps - 1], wb, 2.0 * N * K * M);
        fflush(stdout);
      }
      /* the check, expert 0, first NCHECK rows */
      struct ggml_cplan p = ggml_graph_plan(gg[0], nt, NULL);
      p.work_data = work;
      if (ggml_graph_compute(gg[0], &p) != GGML_STATUS_SUCCESS || ggml_backend_graph_compute(be, gl[0]) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        return 1;
      }
      float *ylh = malloc((size_t)M * N * 4);
      ggml_backend_tensor_get(yl0, ylh, 0, (size_t)M * N * 4);
      double rg = 0, rl = 0, dr = 0;
      for (int m = 0; m < M && m < NCHECK; m++) {
        const float *xm = xh + (size_t)m * K;
        for (int64_t n = 0; n < N; n++) {
          const float *wn = tmp + (size_t)n * K;
          double ref = 0, sabs = 0, qpart = 0;
          for (int64_t b = 0; b < K; b += qb) {
            double amax = 0, swb = 0;
            for (int64_t k = b; k < b + qb && k < K; k++) {
              ref += (double)xm[k] * wn[k];
              sabs += fabs((double)xm[k] * wn[k]);
              amax = fmax(amax, fabs(xm[k]));
              swb += fabs(wn[k]);
            }
            qpart += amax * (1.0 / 254 + ldexp(1, -10)) * swb;
          }
          const double bound = qpart + (K / 32.0 + 8) * ldexp(1, -23) * sabs;
          const double yg = ((const float *)yg0->data)[(size_t)m * N + n], yl = ylh[(size_t)m * N + n];
          rg = fmax(rg, fabs(yg - ref) / bound);
          rl = fmax(rl, fabs(yl - ref) / bound);
          dr = fmax(dr, sabs > 0 ? fabs(yg - yl) / sabs : 0);
          if (!isfinite(yg) || !isfinite(yl)) rg = rl = INFINITY;
        }
      }
      printf("check %s %ld %ld %d %.4f %.4f %.3g\n", argv[1], N, K, M, rg, rl, dr);
      fflush(stdout);
      if (!(rg <= 1.0 && rl <= 1.0)) { fprintf(stderr, "check failed: a product is off its bound\n"); return 3; }
      free(ylh);
      free(work);
      ggml_backend_buffer_free(xbuf);
      ggml_free(lc);
      ggml_free(gc);
      free(xh);
    }
    ggml_backend_buffer_free(lbuf);
    ggml_free(lw);
    ggml_free(gw);
    for (int e = 0; e < NE; e++) free(qw[e]);
    free(qw);
    free(tmp);
  }
  ggml_threadpool_free(tp);
  ggml_backend_free(be);
  return 0;
}
HARNESS
for gb in $GGML_BUILDS; do
  libs=$(find "$(gdir "$gb")" -name 'libggml-cpu.a' -o -name 'libggml.a' -o -name 'libggml-base.a' | sort -r | tr '\n' ' ')
  "$(gcxx "$gb")" -O2 -DNE="$GGML_EXPERTS" -x c "$GG/mm_bench.c" -x none -I"$GG/src/include" -o "$(gbin "$gb")" \
    -Wl,--start-group $libs -Wl,--end-group -fopenmp -lm -lpthread
done

amx=absent; [[ " $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) " == *" amx_tile "* ]] && amx=present
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); AMX $amx; load: $(cat /proc/loadavg); dgemma $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); ggml $rev; threads $THREADS; ggml builds $GGML_BUILDS; ggml experts walked $GGML_EXPERTS; kernels $KERNELS; OMP_WAIT_POLICY $WAIT_POLICIES (both, the faster per row)" | tee "$OUT/header.txt"
rm -f "$OUT"/ggml_*.txt "$OUT"/ggml_*.err
for pol in ${WAIT_POLICIES//,/ }; do
  for gb in $GGML_BUILDS; do
    for ty in ${GGML_TYPES//,/ }; do
      sfx=; [ "$gb" = native ] || sfx=@$gb
      rc=0
      OMP_WAIT_POLICY=$pol "$(gbin "$gb")" "$ty" "$THREADS" "$REPS" "$ROWS" 1408:2816 2816:704 2>>"$OUT/ggml_$pol.err" \
        >"$OUT/ggml_cur.txt" || rc=$?
      sed -E "s/^(path|ggml|check) ([^ ]+)/\1 \2$sfx/" "$OUT/ggml_cur.txt" | tee -a "$OUT/ggml_$pol.txt"
      [ $rc = 0 ] || echo "# ggml build $gb type $ty ($pol): mm_bench exited $rc (a crash: its later rows are missing)" |
        tee -a "$OUT/ggml_$pol.err"
    done
  done
done
rm -f "$OUT/ggml_cur.txt"
# which repacked kernel ggml's set_tensor chose (its log line, one per weight tensor)
grep -ho 'repack tensor .*' "$OUT"/ggml_*.err | sort | uniq -c | tee "$OUT/ggml_repack.txt" || true
rm -f "$OUT"/dgemma_*.jsonl "$OUT"/dgemma_*.txt
for pol in ${WAIT_POLICIES//,/ }; do
  for k in ${KERNELS//,/ }; do
    OMP_WAIT_POLICY=$pol DGEMMA_KERNELS=$k "$DGEMMA" bench --protocol ceiling --formats 4 --rows "$ROWS" \
      --moe-tokens "$MOE_TOKENS" -t "$THREADS" --reps "$REPS" -o "$OUT/dgemma_${k}_$pol.jsonl" >"$OUT/dgemma_${k}_$pol.txt"
  done
done
echo "# load after: $(cat /proc/loadavg)" | tee -a "$OUT/header.txt"
python3 - "$OUT" "$GGML_TYPES" "$KERNELS" <<'PY'
import glob, json, sys
out, types, kernels = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
g, paths, checks = {}, {}, []
for fn in sorted(glob.glob(f"{out}/ggml_*.txt")):
    pol = fn.rsplit("_", 1)[1][:-4]
    for line in open(fn):
        f = line.split()
        if f[0] == "path": paths[(f[1], int(f[2]), int(f[3]))] = (f[4], f[5])
        if f[0] == "check": checks.append((float(f[5]), float(f[6]), float(f[7])))
        if f[0] != "ggml" or f[5] == "skip:": continue
        key, v = (f[1] + ("" if f[2] == "llama" else " " + f[2]), int(f[3]), int(f[4]), int(f[5])), (float(f[7]), float(f[10]), float(f[11]), pol)
        if key not in g or v[0] < g[key][0]: g[key] = v  # the faster wait policy
d, moe = {}, {}
for k in kernels:
    for fn in sorted(glob.glob(f"{out}/dgemma_{k}_*.jsonl")):
        pol = fn.rsplit("_", 1)[1][:-6]
        for line in open(fn):
            j = json.loads(line)
            if j.get("shape") in ("expert_gate_up", "expert_down"):
                key, v = (k, j["N"], j["K"], int(j["M"])), (j["median_s"], j["weight_bytes"], j["flops"], pol)
                if key not in d or v[0] < d[key][0]: d[key] = v  # the faster wait policy
            if j.get("shape") == "moe_gathered":
                j["policy"] = pol
                if k not in moe or j["median_s"] < moe[k]["median_s"]: moe[k] = j
seen = {k[0] for k in g}
gcols = list(dict.fromkeys([c for t in types for c in sorted(x for x in seen if x == t or x.startswith(t + "@"))] +
                           [c for c in sorted(seen) if c.startswith("q4_K") and c.endswith(" generic")]))  # once each
cols = [("dgemma " + k, (k,)) for k in kernels] + [("ggml " + t, t) for t in gcols]
print("ggml's paths (llama.cpp's choice: the first extra buffer type of the CPU device that takes the product, else CPU):")
for (t, N, K), (b, e) in sorted(paths.items()):
    print(f"  {t} [{N}, {K}]: buffer type {b}, {'repacked traits attached (its kernel runs)' if e == 'extra' else 'no extra traits (generic kernel)'}")
if checks:
    print(f"  checks vs the double product of ggml's dequantized weights: largest error / bound generic {max(c[0] for c in checks):.3f}, "
          f"llama {max(c[1] for c in checks):.3f}; largest |generic - llama| / sum|xw| {max(c[2] for c in checks):.2g}")
best = lambda tm, names: min(((tm[n][0], n) for n in names if tm.get(n)), default=None)
q4k = ["ggml " + c for c in gcols if c.startswith("q4_K")]
fourbit = ["ggml " + t for t in gcols if t.startswith("q4_")]
last = "dgemma " + kernels[-1]
print("\n| shape | M | " + " | ".join(f"{c} GB/s | {c} GFLOP/s" for c, _ in cols) + " | " +
      " | ".join(f"{k} / fastest q4_K" for k in reversed(kernels)) + f" | {kernels[-1]} / fastest 4.5-bit ggml |")
print("|---|---|" + "---|---|" * len(cols) + "---|" * (len(kernels) + 1))
ratios = []
for N, K, name in ((1408, 2816, "gate_up [1408, 2816]"), (2816, 704, "down [2816, 704]")):
    Ms = sorted({m for (_, n, kk, m) in g if (n, kk) == (N, K)} | {m for (_, n, kk, m) in d if (n, kk) == (N, K)})
    for M in Ms:
        cells, tm = [], {}
        for c, key in cols:
            v = d.get((key[0], N, K, M)) if isinstance(key, tuple) else g.get((key, N, K, M))
            tm[c] = v
            cells.append(f"{v[1] / v[0] / 1e9:.1f} | {v[2] / v[0] / 1e9:.1f}" if v else "- | -")
        r = []
        for k in reversed(kernels):
            b = best(tm, q4k)
            r.append(f"{b[0] / tm['dgemma ' + k][0]:.2f}x ({b[1][5:]})" if b and tm.get("dgemma " + k) else "-")
        b = best(tm, fourbit)
        r.append(f"{b[0] / tm[last][0]:.2f}x ({b[1][5:]})" if b and tm.get(last) else "-")
        print(f"| {name} | {M} | " + " | ".join(cells) + " | " + " | ".join(r) + " |")
        ratios.append(f"ratio {name.split()[0]} {M} " + " ".join(
            f"{c[5:].replace(' ', '_')}={tm[c][0] / tm[last][0]:.3f}" for c, _ in cols if c.startswith("ggml ") and tm.get(c) and tm.get(last)))
print(f"\n{kernels[-1]} against each ggml column (ggml time / dgemma time):")
for x in ratios: print(x)
for k, j in moe.items():
    print(f"\nmoe_gathered {j['tokens']} tokens ({j['experts']} experts hit, M = {j['M']:.1f}), {j['format']}, dgemma {k}: "
          f"{1e3 * j['median_s']:.1f} ms per call ({j['policy']}), {j['gflop_s']:.1f} GFLOP/s, {100 * j['fraction']:.0f}% of its roofline ({j['compute_rate']})")
print("\nwait policy of each cell (dgemma: kernel set; ggml: type and path):")
for name, src in (("dgemma", d), ("ggml", g)):
    pols = {}
    for key, v in src.items(): pols.setdefault(key[0], []).append(f"{key[1]}x{key[2]} M={key[3]} {v[3]}")
    for c, lst in pols.items(): print(f"  {name} {c}: " + ", ".join(lst))
print("\nggml q4_K, q4_0: the path llama.cpp takes (weights in the chosen buffer type, CPU backend, persistent thread pool);")
print("'generic': the plain context and a pool per call (session 12's harness). Each cell, dgemma's and ggml's, is the faster")
print("of the OpenMP wait policies run (WAIT_POLICIES). ratio = ggml time / dgemma time; 'fastest q4_K' = the faster q4_K path in that")
print("row, 'fastest 4.5-bit' = the fastest q4_K / q4_0 path (q4_K and q4_0 are 4.5 bits per weight, the same bytes as")
print("dgemma's 4-bit g64 with bf16 scales and biases); '-': not run (q4_K needs K a multiple of 256: the down product's")
print("K = 704 is not, llama.cpp stores such tensors in another type); GB/s = weight bytes / median; GFLOP/s = 2 N K M /")
print("median. Raw: " + out)
PY
