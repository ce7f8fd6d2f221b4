#!/usr/bin/env bash
# san_sweep_gpu.sh OUT: issue 16's whole compute-sanitizer pass in one GPU-machine call (carry .devdeb and .devdata;
# about 6-8 minutes on 16 cores), each part's summary in OUT:
#   1. the control of the kernel exclusions (control.txt, its verdict the summary's first line):
#      dev/cuda/initcheck_gemm.cu under initcheck with cuBLAS's kernels excluded must still report its own reader
#      kernel's reads of the cuBLAS product (initcheck does not see cuBLAS's stores, session 5: each of the 5,120
#      elements read is reported), once launched directly and once ("graph") captured with the product in one CUDA
#      graph and launched with programmatic dependent launch, as dgemma's decoder passes run: "ok" for both means the
#      exclusions leave kernels launched either way checked. It checks initcheck only: nothing here shows that
#      synccheck still checks dgemma's kernels under the exclusions (session 20: the step ran as fast under synccheck
#      and initcheck with them as without a tool, 0.08 s for its canvas, where memcheck takes 2 s; compare the steps'
#      times in the summary);
#   2. every test of tests/test_cuda.c, each looping test's cases apart (SAN_FILTER=cases, 67 items), one process per
#      (tool, item), all at once (scripts/sanitize_gpu.sh SAN_PAR=all): memcheck and racecheck with every kernel checked
#      (racecheck cannot exclude cuBLAS: its nvjet kernels then fault, session 20; its summaries name each report's
#      kernel), initcheck (DGEMMA_INITCHECK=1: each cuBLAS output cleared first) and synccheck with cuBLAS excluded;
#   3. one 26B decoder step (dev/cfg_26b_2layers.json: every kernel and shape of a 26B step, 2 of 30 layers) under the
#      four tools the same way.
# SWEEP_TOOLS (default "memcheck racecheck initcheck synccheck"), SWEEP_T (seconds per process, default 420), SWEEP_END
# (seconds after the start by which every sanitizer run has ended, default 560: sanitize_gpu.sh's SAN_DEADLINE, so that
# the summaries and tarballs are written inside a 600-second call; an item not started for it reads "rc none"). The four
# tools' 268 processes do not fit one 600-second call on 16 cores: two tools per call (session 20 swept racecheck and
# initcheck: `SWEEP_TOOLS="memcheck synccheck"` is what is left).
# Reports in cuBLAS's kernels are named as such in the summaries (kernels: ...). An item is clean when its line reads
# rc 0, "kernels: none" and no NOT-PASSED (a skipped test exits 0 too): summary.txt lists every other line, and counts
# the items each tool ran against the items asked. Without a GPU: `sudo dev/san_sweep_stub.sh` (every tool stubbed).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/san_sweep_gpu.sh OUT}
mkdir -p "$OUT"
. scripts/gpu_env.sh
export SAN_DEADLINE=$(( t0 + ${SWEEP_END:-560} ))
EX="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt"
TOOLS=${SWEEP_TOOLS:-memcheck racecheck initcheck synccheck}
gpu_build /tmp/sweep_build.txt || exit 1
echo "build $(el)"
nvcc -O2 -gencode=arch=compute_90,code=sm_90 dev/cuda/initcheck_gemm.cu -lcublas -o build/initcheck_gemm > /tmp/ig.txt 2>&1 \
  || { tail -5 /tmp/ig.txt; exit 1; }
{ for mode in direct graph; do
    echo "# control $mode: compute-sanitizer --tool initcheck $EX --print-limit 3 build/initcheck_gemm ${mode#direct}"
    timeout 120 compute-sanitizer --tool initcheck $EX --print-limit 3 build/initcheck_gemm ${mode#direct} 2>&1; echo "# rc $?"
  done
  echo "# the same without exclusions (5,760 reports in session 19)"
  timeout 120 compute-sanitizer --tool initcheck --print-limit 3 build/initcheck_gemm 2>&1 | tail -3
} > "$OUT/control.txt"
# the verdict: each mode's reports with cuBLAS excluded ("ERROR SUMMARY: N errors"; not the "N errors were not printed")
control=$(awk '/^# control / {m = $3; sub(/:$/, "", m)} /^# the same/ {m = ""}
  m != "" && /ERROR SUMMARY: [0-9]+ errors?$/ {n[m] = $4} m != "" && /^# rc / {rc[m] = $3}
  END {split("direct graph", M, " "); for (i = 1; i <= 2; i++) {m = M[i]; v = (m in n) ? n[m] : -1
         printf "%s %s (%s reports, rc %s); ", m, (v >= 5120 ? "ok" : v > 0 ? "PARTIAL" : "FAILED"), (v < 0 ? "no summary" : v), rc[m]}}' \
  "$OUT/control.txt")
control="$control(ok: all 5,120 reads of the cuBLAS product reported with cuBLAS excluded;"
control="$control rc 1: the product or the graph failed, control.txt says which)"; echo "control: $control"
rm -rf /tmp/san # this sweep's logs only (a warm machine keeps an earlier call's)
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
items=$(san_cases | wc -w)
{ echo "control: $control"
  for tool in $TOOLS; do
    s="$OUT/tests_$tool/summary_$tool.txt"
    if [ -f "$s" ]; then
      echo "== $tool: tests: $(wc -l < "$s") of $items items; $(awk '{print $3, $4}' "$s" | sort | uniq -c | tr -s ' ' | tr '\n' ';')" \
        "$(grep -c NOT-PASSED "$s") NOT-PASSED"
      grep -vE " rc 0 .*kernels: none$" "$s" | cut -c1-300
    else echo "== $tool: tests: no summary; tests_$tool.txt ends: $(tail -3 "$OUT/tests_$tool.txt" | tr '\n' ' ')"; fi
    r=$(grep -E "^run" "$OUT/step_$tool.txt")
    echo "   step: ${r:-no run; step_$tool.txt ends: $(tail -3 "$OUT/step_$tool.txt" | tr '\n' ' ')}" \
      "$(grep -ho "denoising steps, .* s, " "$OUT/step_$tool/${tool}_run.txt" 2>/dev/null | sed 's/denoising steps, .*forward, /canvas /; s/, $//')"
  done; } | tee "$OUT/summary.txt"
# few files come back from a call (8): everything else in two tarballs, the items' logs (the first 20 KB of each)
tar -czf /tmp/sweep_logs.tgz -C /tmp --exclude='*.full' san 2>/dev/null; rm -f "$OUT"/tests_*/san_logs.tgz
tar -czf /tmp/sweep.tgz -C "$OUT" --exclude=summary.txt --exclude=control.txt . && rm -rf "$OUT"/tests_* "$OUT"/step_* \
  && mv /tmp/sweep.tgz "$OUT/sweep.tgz"; [ -f /tmp/sweep_logs.tgz ] && mv /tmp/sweep_logs.tgz "$OUT/san_logs.tgz"; true
