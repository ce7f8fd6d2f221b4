#!/usr/bin/env bash
# san_sweep_gpu.sh OUT: issue 16's whole compute-sanitizer pass in one GPU-machine call (carry .devdeb and .devdata;
# about 6-8 minutes on 16 cores), each part's summary in OUT:
#   1. the control of the kernel exclusions (control.txt): dev/cuda/initcheck_gemm.cu under initcheck with cuBLAS's
#      kernels excluded must still report its own reader kernel's reads of the cuBLAS product (initcheck does not see
#      cuBLAS's stores, session 5): reports there mean the exclusions leave dgemma's kernels checked;
#   2. every test of tests/test_cuda.c, each looping test's cases apart (SAN_FILTER=cases, 67 items), one process per
#      (tool, item), all at once (scripts/sanitize_gpu.sh SAN_PAR=all): memcheck and racecheck with every kernel checked
#      (racecheck cannot exclude cuBLAS: its nvjet kernels then fault, session 20; its summaries name each report's
#      kernel), initcheck (DGEMMA_INITCHECK=1: each cuBLAS output cleared first) and synccheck with cuBLAS excluded;
#   3. one 26B decoder step (dev/cfg_26b_2layers.json: every kernel and shape of a 26B step, 2 of 30 layers) under the
#      four tools the same way.
# SWEEP_TOOLS (default "memcheck racecheck initcheck synccheck"), SWEEP_T (seconds per process, default 420). The four
# tools' 268 processes do not fit one 600-second call on 16 cores: two tools per call (session 20 swept racecheck and
# initcheck: `SWEEP_TOOLS="memcheck synccheck"` is what is left).
# Reports in cuBLAS's kernels are named as such in the summaries (kernels: ...); 0 errors means no report in a
# dgemma kernel and no failed test.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/san_sweep_gpu.sh OUT}
mkdir -p "$OUT"
. scripts/gpu_env.sh
EX="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt"
TOOLS=${SWEEP_TOOLS:-memcheck racecheck initcheck synccheck}
gpu_build /tmp/sweep_build.txt || exit 1
echo "build $(el)"
nvcc -O2 -gencode=arch=compute_90,code=sm_90 dev/cuda/initcheck_gemm.cu -lcublas -o build/initcheck_gemm > /tmp/ig.txt 2>&1 \
  || { tail -5 /tmp/ig.txt; exit 1; }
{ echo "# compute-sanitizer --tool initcheck $EX --print-limit 3 build/initcheck_gemm"
  compute-sanitizer --tool initcheck $EX --print-limit 3 build/initcheck_gemm 2>&1; echo "# rc $?"
  echo "# the same without exclusions"; compute-sanitizer --tool initcheck --print-limit 3 build/initcheck_gemm 2>&1 | tail -3
} > "$OUT/control.txt"
echo "control: $(grep -E "ERROR SUMMARY" "$OUT/control.txt" | tr '\n' ' ')"
opts() { case $1 in initcheck|synccheck) echo "$EX" ;; *) echo "" ;; esac; }
nt=$(echo $TOOLS | wc -w)
for tool in $TOOLS; do # at most ~76 sanitizer processes on the GPU at once (74 ran in session 20's first call)
  DGEMMA_INITCHECK=1 SAN_OPTS="$(opts $tool)" SAN_JOBS=$(( 76 / nt )) SAN_PAR=all SAN_T=${SWEEP_T:-420} SAN_TOOLS=$tool SAN_FILTER=cases \
    scripts/sanitize_gpu.sh "$OUT/tests_$tool" > "$OUT/tests_$tool.txt" 2>&1 &
done
for tool in $TOOLS; do # the step: sanitize_gpu.sh writes /tmp/dgL once (a lock), then one tool per run
  DGEMMA_INITCHECK=1 SAN_OPTS="$(opts $tool)" SAN_RUN="run -m /tmp/dgL --device cuda -p hi -n 256 -s 1" SAN_LAYERS=2 \
    SAN_TOOLS=$tool SAN_T=${SWEEP_T:-420} scripts/sanitize_gpu.sh "$OUT/step_$tool" > "$OUT/step_$tool.txt" 2>&1 &
done
wait
echo "all $(el)"
for tool in $TOOLS; do
  echo "== $tool: tests $(awk '{print $3, $4}' "$OUT/tests_$tool/summary_$tool.txt" | sort | uniq -c | tr '\n' ' ')"
  grep -v " rc 0 .*kernels: none" "$OUT/tests_$tool/summary_$tool.txt" | cut -c1-300
  echo "   step: $(grep -E "^run" "$OUT/step_$tool.txt")"
done | tee "$OUT/summary.txt"
# few files come back from a call: everything else in one tarball (the tests' logs, the first 20 KB of each, are in
# every tests_TOOL/san_logs.tgz alike: one copy kept)
mv "$(ls -S "$OUT"/tests_*/san_logs.tgz 2>/dev/null | head -1)" /tmp/sweep_logs.tgz 2>/dev/null; rm -f "$OUT"/tests_*/san_logs.tgz
tar -czf /tmp/sweep.tgz -C "$OUT" --exclude=summary.txt --exclude=control.txt . && rm -rf "$OUT"/tests_* "$OUT"/step_* \
  && mv /tmp/sweep.tgz "$OUT/sweep.tgz"; [ -f /tmp/sweep_logs.tgz ] && mv /tmp/sweep_logs.tgz "$OUT/san_logs.tgz"; true
