#!/bin/bash
# session 20, call 1 (issue 16): the sanitizer runs that cuBLAS's kernels spoiled in session 19, with cuBLAS's nvjet
# kernels left unchecked (--kernel-name-exclude kns=nvjet), all at once after one build:
#   t: racecheck and synccheck of test_gemm_pins and test_synth_logits@2;
#   s: synccheck, racecheck and (DGEMMA_INITCHECK=1) initcheck of one 26B decoder step (2-layer cut);
#   i: DGEMMA_INITCHECK=1 initcheck over every test of test_cuda (the looping tests as TEST@K cases).
# In the background, niced: the 26B checkpoint /tmp/dg26b and the QR_PREWAIT builds for call 2 (issue 11).
OUT=$1; set -u; . scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
compute-sanitizer --version >> $OUT/gpu.txt 2>&1
compute-sanitizer --help 2>&1 | grep -A8 -E "^ +--kernel-name" > $OUT/san_help.txt
gpu_build /tmp/build.txt || exit 1; echo "build $(el)"
EX="--kernel-name-exclude kns=nvjet"
grep -q -- "--kernel-name-exclude" $OUT/san_help.txt || { echo "no --kernel-name-exclude"; exit 1; }
gpu_tokenizer
build/dgemma mkrandom /tmp/dgL --config dev/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1 || { tail -5 /tmp/mkL.log; exit 1; }
cp dev/cfg_26b_2layers.json /tmp/dgL/config.json.cfgL; echo "mkrandom 2-layer $(el)"
export OMP_NUM_THREADS=2
T=$(( 585 - $(date +%s) + t0 ))
mkdir -p $OUT/s
for tool in synccheck racecheck initcheck; do
  ( s0=$(date +%s); log=$OUT/s/${tool}_26b_2layers.txt
    { echo "# DGEMMA_INITCHECK=1 compute-sanitizer --tool $tool $EX --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1"
      DGEMMA_INITCHECK=1 timeout $T compute-sanitizer --tool $tool $EX --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1 2>&1 | cut -c1-400 | head -c 30000
      echo "# rc ${PIPESTATUS[0]}, $(( $(date +%s) - s0 )) s"; } > $log ) &
done
SAN_OPTS="$EX" SAN_PAR=all SAN_T=$T SAN_TOOLS="racecheck synccheck" SAN_FILTER="test_gemm_pins test_synth_logits@2" \
  scripts/sanitize_gpu.sh $OUT/t > $OUT/t_stdout.txt 2>&1 &
items=""
for t in $(grep -o "cmocka_unit_test([a-z_0-9]*)" tests/test_cuda.c | sed 's/cmocka_unit_test(//; s/)//'); do
  case $t in
    test_synth_logits) items="$items $(echo $t@{0..4})" ;; test_golden_logits) items="$items $(echo $t@{0..3})" ;;
    test_replay|test_sampled) items="$items $(echo $t@{0..5})" ;; test_turbo_generate) items="$items $(echo $t@{0..4})" ;;
    test_attention) items="$items $(echo $t@{1..8})" ;; test_quant_synth_logits) items="$items $(echo $t@{0..2})" ;;
    *) items="$items $t" ;;
  esac
done
echo "initcheck items: $(echo $items | wc -w)"
DGEMMA_INITCHECK=1 SAN_OPTS="$EX" SAN_PAR=all SAN_T=$T SAN_TOOLS=initcheck SAN_FILTER="$items" \
  scripts/sanitize_gpu.sh $OUT/i > $OUT/i_stdout.txt 2>&1 &
# call 2's inputs (issue 11), niced: the 26B checkpoint and the two QR_PREWAIT builds (qw_lab_gpu.sh's defs_build relinks)
( nice -n 19 build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 8 > /tmp/mkrandom.log 2>&1 ) &
k=0; for d in QR_PREWAIT=64 QR_PREWAIT=4; do k=$((k + 1))
  ( nice -n 19 make -j8 CUDA=1 WERROR= BUILD=build-def$k XCFLAGS="$XC -D$d" XLDFLAGS="$XL" build-def$k/dgemma build-def$k/tests/test_cuda > /tmp/defs_$k.txt 2>&1 ) &
done
wait
echo "all $(el)"
for f in $OUT/s/*.txt; do echo "== $f"; grep -E "SUMMARY|^# rc" $f; done
cat $OUT/t/summary_*.txt; sort $OUT/i/summary_initcheck.txt | awk '{print $3, $4}' | sort | uniq -c
grep -v "rc 0 " $OUT/i/summary_initcheck.txt; tail -1 /tmp/mkrandom.log; ls -la build-def1/dgemma build-def2/dgemma
