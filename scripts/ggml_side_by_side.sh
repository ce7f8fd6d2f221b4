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
#     (ggml.h, ggml-cpu.h): test-backend-ops' perf mode has its own fixed
#     shapes, so the harness times ggml_mul_mat at ours: y[M, N] = x[M, K] W^T
#     with W [1408, 2816] (one expert's gate/up) and [2816, 704] (down), for
#     M = ROWS (default 1,8,16,64,256) activation rows, the weights in
#     GGML_TYPES (default q4_K,q4_0,q8_0; quantized with ggml_quantize_chunk
#     from random values; a type whose block does not divide K is skipped:
#     q4_K's 256 at the down product's K = 704); like `dgemma bench --protocol ceiling`, successive
#     calls walk through a stack of 64 distinct experts (> the L3) so that the
#     weights come from memory, max(2, 128 / M) calls per run (2 from M = 64),
#     the median of REPS (default 5) runs after one warm-up, per call;
#     ggml's time includes quantizing the activations to its dot type (q8_K /
#     q8_0), as dgemma's avx2lp time includes its int8 quantization;
#  4. runs `dgemma bench --protocol ceiling --formats 4 --rows ROWS
#     --moe-tokens MOE_TOKENS -t THREADS` once per DGEMMA_KERNELS=k for k in
#     KERNELS (comma-separated; default by the CPU's flags: avx512,avx512lp
#     (exact, bf16/VNNI) with AVX-512 F/BW/VL/DQ + BF16 + VNNI; avx512,avx2lp
#     with AVX-512 F/BW/VL/DQ alone; avx2,avx2lp (exact, int8 vpmaddubsw)
#     otherwise), DGEMMA (default build-cpu/dgemma);
#  5. prints one table: per shape and M, GB/s of weights read and GFLOP/s of
#     each, and ggml q4_K time / dgemma time per kernel set, last set first,
#     and the last set vs q4_0 (q4_K and dgemma's 4-bit g64 with bf16
#     scales and biases are both 4.5 bits per weight: the same bytes).
#  6. the gathered MoE of a MOE_TOKENS-token canvas (default 256; 4-bit g64, every
#     kernel set; dgemma only: ggml's MUL_MAT_ID is not timed here), per call.
# THREADS (default 2) threads for both. OMP_WAIT_POLICY defaults to passive for
# both (dgemma sets it for itself; ggml's OpenMP threads spinning on a shared
# 2-core machine took 20 ms per call instead of 0.5 ms). Raw outputs go to
# OUT_DIR (default .ggml/out). Needs cmake, a C/C++ compiler with OpenMP, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GG=$ROOT/.ggml
OUT=${1:-$GG/out}
GGML_GIT=${GGML_GIT:-/work/.mirror/ggml-org+ggml/repo}
GGML_REV=${GGML_REV:-HEAD}
ROWS=${ROWS:-1,8,16,64,256}
GGML_TYPES=${GGML_TYPES:-q4_K,q4_0,q8_0}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
DGEMMA=${DGEMMA:-$ROOT/build-cpu/dgemma}
MOE_TOKENS=${MOE_TOKENS:-256}
if [ -z "${KERNELS:-}" ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
  if has avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512_vnni; then KERNELS=avx512,avx512lp
  elif has avx512f avx512bw avx512vl avx512dq; then KERNELS=avx512,avx2lp
  else KERNELS=avx2,avx2lp; fi
fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$GG" "$OUT"

rev=$(git --git-dir="$GGML_GIT" rev-parse "$GGML_REV")
if [ "$(cat "$GG/src.rev" 2>/dev/null)" != "$rev" ]; then
  rm -rf "$GG/src" "$GG/build"
  mkdir -p "$GG/src"
  git --git-dir="$GGML_GIT" archive "$rev" | tar -x -C "$GG/src"
  echo "$rev" >"$GG/src.rev"
fi
if [ ! -f "$GG/build/.built" ]; then
  cmake -S "$GG/src" -B "$GG/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DGGML_OPENMP=ON >"$OUT/ggml_cmake.log"
  nice cmake --build "$GG/build" -j"$(nproc)" --target ggml ggml-base ggml-cpu >"$OUT/ggml_build.log"
  touch "$GG/build/.built"
fi

cat >"$GG/mm_bench.c" <<'HARNESS'
/* mm_bench.c (written by scripts/ggml_side_by_side.sh into .ggml/, never committed):
 * ggml_mul_mat timed at given shapes. Usage: mm_bench TYPE THREADS REPS M,M,... N:K ...
 * One line per (shape, M): ggml TYPE N K M calls median_s min_s max_s weight_bytes flops */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"
#define NE 64
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  if (argc < 6) { fprintf(stderr, "usage: %s TYPE THREADS REPS M,M,.. N:K ...\n", argv[0]); return 2; }
  enum ggml_type ty = GGML_TYPE_COUNT;
  for (int t = 0; t < GGML_TYPE_COUNT; t++) {
    const char *n = ggml_type_name((enum ggml_type)t);
    if (n && !strcmp(n, argv[1])) ty = (enum ggml_type)t;
  }
  if (ty == GGML_TYPE_COUNT) { fprintf(stderr, "unknown type %s\n", argv[1]); return 2; }
  const int nt = atoi(argv[2]), reps = atoi(argv[3]);
  int Ms[32], nM = 0;
  for (char *s = strtok(argv[4], ","); s && nM < 32; s = strtok(NULL, ",")) Ms[nM++] = atoi(s);
  srand(1);
  for (int a = 5; a < argc; a++) {
    int64_t N, K;
    if (sscanf(argv[a], "%ld:%ld", &N, &K) != 2) return 2;
    if (K % ggml_blck_size(ty)) { /* e.g. q4_K (256 per block) at K = 704: ggml's rows would not hold whole blocks */
      printf("ggml %s %ld %ld skip: K is not a multiple of the %ld-weight block\n", argv[1], N, K, (long)ggml_blck_size(ty));
      continue;
    }
    int Mmax = 0;
    for (int i = 0; i < nM; i++) Mmax = Ms[i] > Mmax ? Ms[i] : Mmax;
    const size_t wb = ggml_row_size(ty, K) * N;
    const size_t mem = NE * (wb + 1024) + (size_t)Mmax * K * 4 + 8 * (size_t)Mmax * N * 4 * NE + (64u << 20);
    struct ggml_context *ctx = ggml_init((struct ggml_init_params){mem, NULL, false});
    if (!ctx) { fprintf(stderr, "ggml_init failed\n"); return 1; }
    float *tmp = malloc((size_t)N * K * sizeof(float));
    struct ggml_tensor *W[NE];
    for (int e = 0; e < NE; e++) {
      for (int64_t i = 0; i < N * K; i++) tmp[i] = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.05f;
      W[e] = ggml_new_tensor_2d(ctx, ty, K, N);
      ggml_quantize_chunk(ty, tmp, W[e]->data, 0, N, K, NULL);
    }
    free(tmp);
    for (int im = 0; im < nM; im++) {
      const int M = Ms[im];
      struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
      for (int64_t i = 0; i < K * M; i++) ((float *)x->data)[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
      struct ggml_cgraph *gf[NE];
      size_t ws = 0;
      for (int e = 0; e < NE; e++) {
        gf[e] = ggml_new_graph_custom(ctx, 4, false);
        ggml_build_forward_expand(gf[e], ggml_mul_mat(ctx, W[e], x));
        struct ggml_cplan p = ggml_graph_plan(gf[e], nt, NULL);
        ws = p.work_size > ws ? p.work_size : ws;
      }
      void *work = malloc(ws + 64);
      const int calls = M >= 64 ? 2 : 128 / M > 2 ? 128 / M : 2;
      double t[64];
      for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        for (int c = 0; c < calls; c++) {
          struct ggml_cplan p = ggml_graph_plan(gf[(r * calls + c) % NE], nt, NULL);
          p.work_data = work;
          if (ggml_graph_compute(gf[(r * calls + c) % NE], &p) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 1; }
        }
        if (r > 0) t[r - 1] = (now() - t0) / calls;
      }
      qsort(t, reps, sizeof t[0], cmp);
      const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
      printf("ggml %s %ld %ld %d %d %.9g %.9g %.9g %zu %.9g\n", argv[1], N, K, M, calls, med, t[0], t[reps - 1], wb,
             2.0 * N * K * M);
      fflush(stdout);
      free(work);
    }
    ggml_free(ctx);
  }
  return 0;
}
HARNESS
libs=$(find "$GG/build" -name 'libggml-cpu.a' -o -name 'libggml.a' -o -name 'libggml-base.a' | sort -r | tr '\n' ' ')
g++ -O2 -x c "$GG/mm_bench.c" -x none -I"$GG/src/include" -o "$GG/mm_bench" \
  -Wl,--start-group $libs -Wl,--end-group -fopenmp -lm -lpthread

echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); load: $(cat /proc/loadavg); dgemma $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); ggml $rev; threads $THREADS; kernels $KERNELS; OMP_WAIT_POLICY=$OMP_WAIT_POLICY" | tee "$OUT/header.txt"
: >"$OUT/ggml.txt"
for ty in ${GGML_TYPES//,/ }; do
  "$GG/mm_bench" "$ty" "$THREADS" "$REPS" "$ROWS" 1408:2816 2816:704 | tee -a "$OUT/ggml.txt"
done
for k in ${KERNELS//,/ }; do
  DGEMMA_KERNELS=$k "$DGEMMA" bench --protocol ceiling --formats 4 --rows "$ROWS" --moe-tokens "$MOE_TOKENS" -t "$THREADS" \
    --reps "$REPS" -o "$OUT/dgemma_$k.jsonl" >"$OUT/dgemma_$k.txt"
done
echo "# load after: $(cat /proc/loadavg)" | tee -a "$OUT/header.txt"
python3 - "$OUT" "$GGML_TYPES" "$KERNELS" <<'PY'
import json, sys
out, types, kernels = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
g = {}
for line in open(f"{out}/ggml.txt"):
    f = line.split()
    if f[0] != "ggml" or f[4] == "skip:": continue
    g[(f[1], int(f[2]), int(f[3]), int(f[4]))] = (float(f[6]), float(f[9]), float(f[10]))
d = {}
for k in kernels:
    for line in open(f"{out}/dgemma_{k}.jsonl"):
        j = json.loads(line)
        if j.get("shape") in ("expert_gate_up", "expert_down"):
            d[(k, j["N"], j["K"], int(j["M"]))] = (j["median_s"], j["weight_bytes"], j["flops"])
cols = [("dgemma " + k, (k,)) for k in kernels] + [("ggml " + t, t) for t in types]
ratios = [("dgemma " + k, "ggml q4_K") for k in reversed(kernels)] + [("dgemma " + kernels[-1], "ggml q4_0")]
print("| shape | M | " + " | ".join(f"{c} GB/s | {c} GFLOP/s" for c, _ in cols) + " | " +
      " | ".join(f"{c[7:]} / {q[5:]}" for c, q in ratios) + " |")
print("|---|---|" + "---|---|" * len(cols) + "---|" * len(ratios))
for N, K, name in ((1408, 2816, "gate_up [1408, 2816]"), (2816, 704, "down [2816, 704]")):
    Ms = sorted({m for (_, n, kk, m) in g if (n, kk) == (N, K)} | {m for (_, n, kk, m) in d if (n, kk) == (N, K)})
    for M in Ms:
        cells, tm = [], {}
        for c, key in cols:
            v = d.get((key[0], N, K, M)) if isinstance(key, tuple) else g.get((key, N, K, M))
            tm[c] = v
            cells.append(f"{v[1] / v[0] / 1e9:.1f} | {v[2] / v[0] / 1e9:.1f}" if v else "- | -")
        r = lambda c, q: f"{tm[q][0] / tm[c][0]:.2f}x" if tm.get(q) and tm.get(c) else "-"
        print(f"| {name} | {M} | " + " | ".join(cells) + " | " + " | ".join(r(c, q) for c, q in ratios) + " |")
for k in kernels:
    for line in open(f"{out}/dgemma_{k}.jsonl"):
        j = json.loads(line)
        if j.get("shape") == "moe_gathered":
            print(f"\nmoe_gathered {j['tokens']} tokens ({j['experts']} experts hit, M = {j['M']:.1f}), {j['format']}, dgemma {k}: "
                  f"{1e3 * j['median_s']:.1f} ms per call, {j['gflop_s']:.1f} GFLOP/s, {100 * j['fraction']:.0f}% of its roofline ({j['compute_rate']})")
print("\nratio = ggml time / dgemma time (q4_K: 4.5 bits per weight, the same bytes as dgemma's 4-bit g64 with bf16 scales and")
print("biases; q4_0: 4.5 bits too); '-': not run (q4_K needs K a multiple of 256: the down product's K = 704 is not, llama.cpp")
print("stores such tensors in another type); GB/s = weight bytes / median per call;")
print("GFLOP/s = 2 N K M / median. Raw: " + out)
PY
