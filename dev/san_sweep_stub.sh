#!/usr/bin/env bash
# san_sweep_stub.sh: scripts/san_sweep_gpu.sh without a GPU, in a private /tmp (its paths /tmp/san, /tmp/dgL, ... are
# fixed; needs root and unshare(1)), with make, cc, nvcc, compute-sanitizer and the binaries stubbed. The stub tool
# gives a timeout (memcheck test_graphs), a failed test (memcheck test_replay@3), a skipped one that exits 0 (synccheck
# test_branch) and a report in a dgemma kernel (synccheck test_sampled@2); every other item passes clean. Checks that
# summary.txt lists exactly those four items, counts 67 of 67 per tool, that the control's verdicts follow its stub
# (both modes ok; then the graph mode reporting nothing: FAILED), that the step ran per tool, that 4 files come back
# (8 at most) and the logs' tarball holds one log per item and no partial one. Prints one line per case, exits 1 if any
# is wrong.
#   sudo dev/san_sweep_stub.sh
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
exec unshare -m --propagation private bash -s "$SRC" <<'EOS'
set -u
SRC=$1
mount -t tmpfs none /tmp || exit 1
H=/tmp/h; R=/tmp/repo; mkdir -p $H/bin $R/scripts $R/dev/cuda $R/tests $R/build/tests $R/.devdata/gemma3 $R/.cache
cp "$SRC"/scripts/sanitize_gpu.sh "$SRC"/scripts/san_sweep_gpu.sh "$SRC"/scripts/gpu_env.sh $R/scripts/
cp "$SRC"/dev/cfg_26b_2layers.json $R/dev/; cp "$SRC"/dev/cuda/initcheck_gemm.cu $R/dev/cuda/
cp "$SRC"/tests/test_cuda.c $R/tests/; echo "{}" | gzip > $R/.devdata/gemma3/tokenizer.json.gz
printf '#!/bin/bash\nexit 0\n' > $H/bin/make; cp $H/bin/make $H/bin/cc
printf '#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && touch "$2"; shift; done\n' > $H/bin/nvcc
cat > $H/bin/compute-sanitizer <<'EOF'
#!/bin/bash
tool=memcheck; ex=0
while [ $# -gt 0 ]; do case $1 in
  --tool) tool=$2; shift 2 ;; --kernel-name-exclude) ex=1; shift 2 ;; --print-limit|--error-exitcode) shift 2 ;; --*) shift ;;
  *) break ;; esac; done
echo "========= COMPUTE-SANITIZER"
case $1 in
*initcheck_gemm) # initcheck misses cuBLAS's stores: 5,120 reads reported with cuBLAS excluded, 5,760 without (session 19)
  if [ $ex = 1 ] && [ "${CTRL_BROKEN:-}" = "${2:-direct}" ]; then echo "========= ERROR SUMMARY: 0 errors"; exit 0; fi
  echo "========= Uninitialized __global__ memory read of size 4 bytes"; echo "=========     at sum_kernel(const float *, int, double *)+0xd0"
  [ $ex = 1 ] && n=5120 || n=5760
  echo "========= ERROR SUMMARY: $n errors"; echo "========= ERROR SUMMARY: $((n - 1)) errors were not printed."; exit 0 ;;
*dgemma) "$@" || exit 1; echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
esac
echo "[==========] Running 1 test(s)."; echo "[ RUN      ] $DG_TEST_FILTER"
case "$tool $DG_TEST_FILTER${DG_TEST_CASE:+@$DG_TEST_CASE}" in
"memcheck test_graphs") sleep 30 ;;
"memcheck test_replay@3") echo "[  FAILED  ] test_replay"; echo "========= ERROR SUMMARY: 0 errors"; exit 1 ;;
"synccheck test_branch") echo "# SKIP cuda: no device"; echo "[  SKIPPED ] test_branch"; echo "[  PASSED  ] 0 test(s)."
  echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
"synccheck test_sampled@2") echo "========= Barrier error detected. Divergent thread(s) in block"
  echo "=========     at flash_pair_kernel<8>(float *)+0x1c0"; echo "[       OK ] test_sampled"; echo "[  PASSED  ] 1 test(s)."
  echo "========= ERROR SUMMARY: 1 error"; exit 9 ;;
esac
echo "[       OK ] $DG_TEST_FILTER"; echo "[  PASSED  ] 1 test(s)."; echo "========= ERROR SUMMARY: 0 errors"
EOF
cat > $R/build/dgemma <<'EOF'
#!/bin/bash
[ "$1" = run ] && { [ -f "$3/config.json" ] || { echo "dgemma: cannot load model $3" >&2; exit 1; }
  echo "dgemma: 256 tokens, 1 blocks, 1 denoising steps, 256.00 tokens/forward, 0.08 s, 3022.2 tok/s (generation)"; exit 0; }
[ "$1" = mkrandom ] || exit 0
out=$2; shift 2; cfg=""
while [ $# -gt 0 ]; do [ "$1" = --config ] && cfg=$2; shift; done
mkdir -p "$out"; cp "$cfg" "$out/config.json"
EOF
printf '#!/bin/bash\nexit 0\n' > $R/build/tests/test_cuda
chmod +x $H/bin/* $R/build/dgemma $R/build/tests/test_cuda
export PATH=$H/bin:$PATH
cd $R
bad=0
check() { # NAME COMMAND...: ok or FAIL
  if "${@:2}"; then echo "ok   $1"; else echo "FAIL $1"; bad=1; fi
}
rm -rf /tmp/OUT; SWEEP_TOOLS="memcheck synccheck" SWEEP_T=3 bash scripts/san_sweep_gpu.sh /tmp/OUT > /tmp/call.txt 2>&1
S=/tmp/OUT/summary.txt
listed=$(grep -E "^(memcheck|synccheck) " $S | awk '{print $1, $2}' | sort | tr '\n' ',')
check "the summary lists exactly the four bad items ($listed)" \
  [ "$listed" = "memcheck test_graphs,memcheck test_replay@3,synccheck test_branch,synccheck test_sampled@2," ]
check "memcheck test_graphs: rc 124" grep -q "^memcheck test_graphs rc 124 " $S
check "synccheck test_branch: NOT-PASSED though rc 0" grep -q "^synccheck test_branch rc 0 .*NOT-PASSED" $S
check "synccheck test_sampled@2: the report's kernel named" grep -q "^synccheck test_sampled@2 rc 9 .*kernels: 1 flash_pair_kernel$" $S
check "67 of 67 items per tool" [ "$(grep -c "tests: 67 of 67 items" $S)" = 2 ]
check "the control: both modes ok" grep -q "^control: direct ok (5120 reports, rc 0); graph ok (5120 reports, rc 0)" $S
check "the step ran per tool" [ "$(grep -c "step: run .*: # rc 0, .*canvas 0.08 s" $S)" = 2 ]
files=$(find /tmp/OUT -type f | sort | tr '\n' ' ')
check "4 files come back ($files)" \
  [ "$files" = "/tmp/OUT/control.txt /tmp/OUT/san_logs.tgz /tmp/OUT/summary.txt /tmp/OUT/sweep.tgz " ]
check "one log per item in san_logs.tgz, no partial one" \
  [ "$(tar -tzf /tmp/OUT/san_logs.tgz | grep -c "\.txt$")" = 134 -a "$(tar -tzf /tmp/OUT/san_logs.tgz | grep -c "\.full$")" = 0 ]
rm -rf /tmp/OUT; CTRL_BROKEN=graph SWEEP_TOOLS=synccheck SWEEP_T=3 bash scripts/san_sweep_gpu.sh /tmp/OUT > /tmp/call2.txt 2>&1
check "the control: the graph mode reporting nothing FAILED" grep -q "^control: direct ok .*; graph FAILED (0 reports" /tmp/OUT/summary.txt
exit $bad
EOS
