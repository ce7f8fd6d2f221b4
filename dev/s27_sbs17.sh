#!/usr/bin/env bash
# s27_sbs17.sh OUT [ROUNDS]: issue 17's side by side (scripts/ggml_side_by_side.sh: ggml's q4_K / q4_0 in the
# same run as dgemma's avx512lp, -t 2, M = 1, 8, 16, 64, 256, the gathered MoE of 256 tokens) for each variant of
# VARIANTS, alternated ROUNDS times (default 5), then the summary (dev/s27_sbs17_summary.py) into OUT/summary.txt.
#   VARIANTS  space-separated NAME:BINARY[:ENV=V,ENV=V] (default: "seq1:build-cpu/dgemma
#             il:build-cpu/dgemma:DGEMMA_CPU_PACK=il": this tree's build, without and with the interleaved pack)
#   WAIT_POLICIES  passed on (default here active: the faster one on an idle machine; passive,active doubles the time)
#   ROWS      passed on (default 1,8,16,64,256; session 30 ran ROWS=1: on its AMX Intel VM ggml's AMX mul_mat
#             (the llama path's buffer type there) crashes mm_bench at M = 8, with 64 experts as with 128)
#   THREADS   passed on (default 2); GGML_BUILDS passed on (default native; session 31: "clang noamx", ggml's AMX
#             path built by clang and its CPU_REPACK path built without AMX: scripts/ggml_side_by_side.sh says why)
#   BENCH_LOCK_HELD=1  the caller holds /work/BENCH_LOCK already (dev/s31_win17.sh): do not take it again
# Takes the bench lock itself (unless BENCH_LOCK_HELD=1); writes uptime and the load before and after each run into OUT/log.txt.
# ~50 s a run with one wait policy: 2 variants x 5 rounds ~ 8.5 min.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: dev/s27_sbs17.sh OUT [ROUNDS]}
ROUNDS=${2:-5}
VARIANTS=${VARIANTS:-"seq1:build-cpu/dgemma il:build-cpu/dgemma:DGEMMA_CPU_PACK=il"}
export WAIT_POLICIES=${WAIT_POLICIES:-active}
mkdir -p "$OUT"
if [ "${BENCH_LOCK_HELD:-0}" != 1 ]; then exec 9>/work/BENCH_LOCK; flock 9; fi
LOG=$OUT/log.txt
echo "# $(date -u +%FT%TZ) lock taken; $(uptime); dgemma $(git rev-parse --short HEAD); variants $VARIANTS; policies $WAIT_POLICIES; threads ${THREADS:-2}; ggml builds ${GGML_BUILDS:-native}; rows ${ROWS:-1,8,16,64,256}" | tee -a "$LOG"
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    IFS=: read -r name bin envs <<<"$v"
    e=(); [ -n "$envs" ] && IFS=, read -ra e <<<"$envs"
    case $bin in /*) ;; *) bin=$PWD/$bin;; esac
    env "${e[@]}" DGEMMA="$bin" KERNELS=avx512lp THREADS=${THREADS:-2} GGML_BUILDS="${GGML_BUILDS:-native}" ROWS=${ROWS:-1,8,16,64,256} \
      scripts/ggml_side_by_side.sh "$OUT/raw_${name}_r$r" >"$OUT/${name}_r$r.md" 2>"$OUT/${name}_r$r.err"
    echo "# $(date -u +%T) $name r$r rc $? $(uptime | sed 's/.*load/load/')" | tee -a "$LOG"
  done
done
python3 dev/s27_sbs17_summary.py "$OUT" $(for v in $VARIANTS; do printf '%s ' "${v%%:*}"; done) | tee "$OUT/summary.txt"
